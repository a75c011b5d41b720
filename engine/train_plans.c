/* train_plans.c - a training job's plans and the search over them (see train_plans.h). */
#include "train_plans.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_load.h"
#include "generate.h"

const struct backend *train_shape_backend(const struct train_shape *s)
{
    const struct backend *bk = backend_or_cpu(s->backend);
    if (backend_supports(bk, BK_OP_set_parity, BK_DTYPE_F32)) bk->set_parity(s->deterministic);
    return bk;
}

/* the most images one forward of a job's sample grid takes: grid_images, at most 16 */
static int grid_cap(const struct train_shape *s) { return s->grid_images < 16 ? s->grid_images : 16; }

/* the chunk a job's sample grids run in under st: st's sample_batch (at most grid_cap), or
 * grid_cap when it leaves it open */
static int grid_batch(const struct train_shape *s, const struct strategy *st)
{
    int cap = grid_cap(s);
    return st->sample_batch > 0 && st->sample_batch < cap ? st->sample_batch : cap;
}

/* the samples of a strategy's micro-batch: its micro_batch, or the whole batch */
static int micro_of(const struct train_shape *s, const struct strategy *st)
{
    return st->micro_batch > 0 && st->micro_batch < s->batch ? st->micro_batch : s->batch;
}

/* the training graph at the strategy's micro-batch (or at `n` samples when n > 0: the uneven
 * last micro-batch) */
static int build_step_graph_n(const struct train_shape *s, const struct strategy *st, int n,
                              struct graph *g, struct unet_io *io, int *target)
{
    graph_init(g);
    if (unet_build_training(g, &s->model, n > 0 ? n : micro_of(s, st), io, target, NULL))
        return -1;
    return st->precision == STRATEGY_PRECISION_F32 ? 0 : graph_set_precision(g, st->precision);
}

static int build_step_graph(const struct train_shape *s, const struct strategy *st,
                            struct graph *g, struct unet_io *io, int *target)
{
    return build_step_graph_n(s, st, 0, g, io, target);
}

/* the step's plan options under st: its micro-batch resolved */
static struct plan_opts step_opts(const struct train_shape *s, const struct strategy *st,
                                  struct plan_ws_cache *ws, int bound_only)
{
    struct plan_opts po = {.strategy = *st, .ws_cache = ws, .bound_only = bound_only};
    po.strategy.micro_batch = micro_of(s, st);
    /* one forward/backward a step: the gradients may live in the arena */
    po.one_pass = po.strategy.micro_batch == s->batch;
    return po;
}

/* tp->g's plan under st, with the uneven last micro-batch when st's micro-batch does not divide
 * the batch (rg built here, rp sharing p's persistent part: plan_make_shared) and the sample
 * grids in chunks of tp->grid (sg, sp), both nested in p (reserved there) */
static int plan_step(const struct train_shape *s, const struct strategy *st,
                     struct train_plans *tp, char *err, size_t errlen)
{
    const struct backend *bk = train_shape_backend(s);
    struct plan_opts po = step_opts(s, st, NULL, 0);
    po.strategy.sample_batch = tp->grid;
    if (plan_make(&tp->p, &tp->g, bk, &po)) {
        snprintf(err, errlen, "cannot plan the training step");
        return -1;
    }
    if (tp->rest) {
        po.strategy.micro_batch = tp->rest;
        graph_free(&tp->rg);
        if (build_step_graph_n(s, st, tp->rest, &tp->rg, &tp->rio, &tp->rtarget)) {
            snprintf(err, errlen, "cannot build the model's last micro-batch: %s", tp->rg.err);
            return -1;
        }
        if (plan_make_shared(&tp->rp, &tp->rg, bk, &po, &tp->p, &tp->g)) {
            snprintf(err, errlen, "cannot plan the last micro-batch of %d", tp->rest);
            return -1;
        }
        plan_reserve_nested(&tp->p, &tp->rp);
    }
    if (!tp->grid) return 0;
    graph_free(&tp->sg); /* generate_plan_nested initialises it again */
    if (generate_plan_nested(&s->model, tp->grid, &tp->p, &tp->g, bk, &tp->sg, &tp->sio, &tp->sp,
                             err, errlen))
        return -1;
    plan_reserve_nested(&tp->p, &tp->sp);
    return 0;
}

void train_plans_free(struct train_plans *tp)
{
    plan_free(&tp->sp);
    plan_free(&tp->rp);
    plan_free(&tp->p);
    graph_free(&tp->sg);
    graph_free(&tp->rg);
    graph_free(&tp->g);
}

int train_plans_make(struct train_plans *tp, const struct train_shape *s,
                     const struct strategy *st, char *err, size_t errlen)
{
    struct strategy plain = strategy_plain(s->batch);
    if (!st) st = &plain;
    memset(tp, 0, sizeof *tp);
    graph_init(&tp->g);
    graph_init(&tp->rg);
    graph_init(&tp->sg);
    tp->micro = micro_of(s, st);
    tp->rest = s->batch % tp->micro;
    tp->grid = grid_batch(s, st);
    if (build_step_graph(s, st, &tp->g, &tp->io, &tp->target)) {
        snprintf(err, errlen, "cannot build the model: %s", tp->g.err);
        return -1;
    }
    return plan_step(s, st, tp, err, errlen);
}

/* The search's target (planner_target): a candidate is plan_step's plans, its bytes known
 * without making the nested ones again and again. A nested plan's bytes past where it starts in
 * its host (an uneven last micro-batch past the host's inputs, a sample grid past the host's
 * transient part and, over an offloading host, its own copy of the weights) are the same
 * whatever the host (plan_make_shared, plan_make_nested), so each is planned once per search;
 * test_planner_search holds every candidate's bytes to train_plans_make's. */
#define SEARCH_MAX_REST 64
struct search_ctx {
    const struct train_shape *s;
    struct plan_ws_cache *ws;
    size_t grid_own[17];                /* by chunk size; 0: not planned yet */
    struct search_rest {
        int precision, n, recompute;
        size_t own;
    } rest[SEARCH_MAX_REST];
    int n_rest;
};

/* the uneven last micro-batch's bytes past host's inputs */
static int rest_own(struct search_ctx *c, const struct strategy *st, int n,
                    const struct plan *host, const struct graph *host_g, size_t *own)
{
    for (int i = 0; i < c->n_rest; i++)
        if (c->rest[i].precision == st->precision && c->rest[i].n == n &&
            c->rest[i].recompute == st->recompute) {
            *own = c->rest[i].own;
            return 0;
        }
    struct graph rg;
    struct unet_io rio;
    struct plan rp;
    int rtarget, rc = -1;
    struct plan_opts po = step_opts(c->s, st, c->ws, 0);
    po.strategy.micro_batch = n;
    memset(&rp, 0, sizeof rp);
    if (!build_step_graph_n(c->s, st, n, &rg, &rio, &rtarget) &&
        !plan_make_shared(&rp, &rg, train_shape_backend(c->s), &po, host, host_g)) {
        *own = rp.total_bytes - host->inputs_off;
        if (c->n_rest < SEARCH_MAX_REST)
            c->rest[c->n_rest++] = (struct search_rest){st->precision, n, st->recompute, *own};
        rc = 0;
    }
    plan_free(&rp);
    graph_free(&rg);
    return rc;
}

/* a sample grid's bytes past host's transient part and its own weights, in chunks of b (0
 * bytes for a job without grids) */
static int grid_own(struct search_ctx *c, int b, const struct plan *host,
                    const struct graph *host_g, size_t *own)
{
    if (!b || c->grid_own[b]) {
        *own = b ? c->grid_own[b] : 0;
        return 0;
    }
    struct graph sg;
    struct unet_io sio;
    struct plan sp;
    char err[256];
    int rc = generate_plan_nested(&c->s->model, b, host, host_g, train_shape_backend(c->s),
                                  &sg, &sio, &sp, err, sizeof err);
    if (!rc) {
        *own = c->grid_own[b] = sp.total_bytes - host->transient_off -
                                (sp.weights_from_host ? sp.params_bytes : 0);
    }
    plan_free(&sp);
    graph_free(&sg);
    return rc ? -1 : 0;
}

/* where p's nested plans end: its uneven last micro-batch (left out of a bound: smaller than
 * the step, it seldom ends later, and a bound without it is still a lower bound) and a grid in
 * chunks of b */
static int search_end(struct search_ctx *c, const struct strategy *st, const struct graph *g,
                      const struct plan *p, int bound, int b, size_t *end)
{
    size_t own, e = 0;
    int micro = micro_of(c->s, st), rest = c->s->batch % micro;
    if (rest && !bound) {
        if (rest_own(c, st, rest, p, g, &own)) return -1;
        if (p->inputs_off + own > e) e = p->inputs_off + own;
    }
    if (!b) {
        *end = e;
        return 0;
    }
    if (grid_own(c, b, p, g, &own)) return -1;
    own += p->transient_off + (p->offload ? p->params_bytes : 0);
    *end = own > e ? own : e;
    return 0;
}

static int search_build(void *ctx, const struct strategy *st, struct graph *g)
{
    struct search_ctx *c = ctx;
    struct unet_io io;
    int target;
    return build_step_graph(c->s, st, g, &io, &target);
}

static int search_plan(void *ctx, const struct strategy *st, const struct graph *g,
                       size_t budget, struct plan *p)
{
    struct search_ctx *c = ctx;
    struct plan_opts po = step_opts(c->s, st, c->ws, 0);
    if (plan_make(p, g, train_shape_backend(c->s), &po)) return -1;
    /* the largest chunk that fits (halving), or the forced one */
    int b = grid_batch(c->s, st);
    size_t end;
    for (;;) {
        if (search_end(c, st, g, p, 0, b, &end)) return -1;
        if (st->sample_batch > 0 || !budget || (end <= budget && p->total_bytes <= budget) ||
            b <= 1)
            break;
        b = (b + 1) / 2;
    }
    p->strategy.sample_batch = b;
    plan_reserve(p, end);
    return 0;
}

static int search_bound(void *ctx, const struct strategy *st, const struct graph *g, int tight,
                        size_t *bytes)
{
    struct search_ctx *c = ctx;
    struct plan_opts po = step_opts(c->s, st, c->ws, 1);
    if (!tight) {
        *bytes = plan_persistent_bytes(g, train_shape_backend(c->s), &po);
        return 0;
    }
    struct plan p;
    size_t end = 0;
    int b = st->sample_batch > 0 ? grid_batch(c->s, st) : grid_cap(c->s) ? 1 : 0;
    int rc = plan_make(&p, g, train_shape_backend(c->s), &po) ||
             search_end(c, st, g, &p, 1, b, &end);
    *bytes = p.total_bytes > end ? p.total_bytes : end;
    plan_free(&p);
    return rc ? -1 : 0;
}

int train_plans_search(const struct train_shape *s, const struct strategy *want, size_t budget,
                       const struct cost_model *m, int plan_all, struct planner_result *r,
                       char *err, size_t errlen)
{
    struct cost_model defaults;
    memset(r, 0, sizeof *r);
    r->chosen = r->smallest = -1;
    if (!m) {
        cost_model_default(&defaults);
        m = &defaults;
    }
    struct search_ctx *c = calloc(1, sizeof *c);
    if (c) c->ws = plan_ws_cache_new();
    if (!c || !c->ws) {
        if (c) free(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->s = s;
    struct planner_target t = {c, search_build, search_plan, search_bound};
    int rc = planner_search(want, s->batch, budget, m, &t, plan_all, r);
    plan_ws_cache_free(c->ws);
    free(c);
    if (rc) {
        snprintf(err, errlen, "%s", r->why);
        return -1;
    }
    return 0;
}

const char *train_plans_host_part_name(enum train_host_part k)
{
    static const char *const names[TRAIN_HOST_PART_COUNT] = {
        "step", "weights_in", "data", "data_load", "loader", "log", "checkpoint", "grid",
        "plot"};
    return k >= 0 && k < TRAIN_HOST_PART_COUNT ? names[k] : "?";
}

int64_t train_plans_host_peak(const struct train_host *h)
{
    const int64_t *p = h->part;
    int64_t weights = p[TRAIN_HOST_STEP] + p[TRAIN_HOST_WEIGHTS_IN];
    int64_t load = p[TRAIN_HOST_STEP] + p[TRAIN_HOST_DATA] + p[TRAIN_HOST_DATA_LOAD];
    int64_t out = p[TRAIN_HOST_CHECKPOINT];
    if (p[TRAIN_HOST_GRID] > out) out = p[TRAIN_HOST_GRID];
    if (p[TRAIN_HOST_PLOT] > out) out = p[TRAIN_HOST_PLOT];
    int64_t run = p[TRAIN_HOST_STEP] + p[TRAIN_HOST_DATA] + p[TRAIN_HOST_LOADER] +
                  p[TRAIN_HOST_LOG] + out;
    int64_t peak = weights > load ? weights : load;
    return run > peak ? run : peak;
}
