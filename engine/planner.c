/* planner.c - the strategy search: candidates from what the engine runs today, ordered by the
 * cost model, planned exactly until one fits the budget.
 */
#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the engine and the training loop run today. A strategy joins these lists in the change
 * that makes exec.c and server/train.c run it (never before: the search must not choose a plan
 * nothing can execute). */
static const int avail_precision[] = {STRATEGY_PRECISION_F32, STRATEGY_PRECISION_BF16,
                                      STRATEGY_PRECISION_F16};
static const int avail_recompute[] = {STRATEGY_RECOMPUTE_NONE, STRATEGY_RECOMPUTE_ATTENTION,
                                      STRATEGY_RECOMPUTE_RESBLOCK, STRATEGY_RECOMPUTE_LEVEL};
static const int avail_offload[] = {0, 1};
static const int avail_micro_batching = 1; /* train.c accumulates over micro-batches */

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int in_list(const int *l, int n, int v)
{
    for (int i = 0; i < n; i++)
        if (l[i] == v) return 1;
    return 0;
}

int planner_available(const struct strategy *s, int batch)
{
    return in_list(avail_precision, N_OF(avail_precision), s->precision) &&
           in_list(avail_recompute, N_OF(avail_recompute), s->recompute) &&
           in_list(avail_offload, N_OF(avail_offload), s->offload) && s->micro_batch >= 0 &&
           s->micro_batch <= batch &&
           (avail_micro_batching || s->micro_batch == 0 || s->micro_batch == batch);
}

const char *planner_precision_name(int precision)
{
    switch (precision) {
    case STRATEGY_PRECISION_AUTO: return "auto";
    case STRATEGY_PRECISION_F32: return "f32";
    case STRATEGY_PRECISION_BF16: return "bf16";
    case STRATEGY_PRECISION_F16: return "f16";
    default: return "?";
    }
}

const char *planner_recompute_name(int recompute)
{
    switch (recompute) {
    case STRATEGY_RECOMPUTE_AUTO: return "auto";
    case STRATEGY_RECOMPUTE_NONE: return "none";
    case STRATEGY_RECOMPUTE_ATTENTION: return "attention";
    case STRATEGY_RECOMPUTE_RESBLOCK: return "resblock";
    case STRATEGY_RECOMPUTE_LEVEL: return "level";
    default: return "?";
    }
}

void planner_strategy_text(const struct strategy *s, int batch, char *buf, size_t n)
{
    int m = s->micro_batch > 0 ? s->micro_batch : batch;
    char grid[48] = "";
    if (s->sample_batch > 0) snprintf(grid, sizeof grid, ", grid chunks of %d", s->sample_batch);
    snprintf(buf, n, "%s, micro-batch %d%s, recompute %s, offload %s%s",
             planner_precision_name(s->precision), m,
             m < batch ? (batch % m ? " (uneven last)" : "") : " (the whole batch)",
             planner_recompute_name(s->recompute),
             s->offload < 0 ? "auto" : s->offload ? "on" : "off", grid);
}

static void fmt_bytes(char *buf, size_t n, size_t b)
{
    if (b >= ((size_t)1 << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else snprintf(buf, n, "%.1f MiB", b / 1048576.0);
}

/* the values a field takes: the forced one (if the engine runs it), or every available one */
static int field_values(int want, int auto_v, const int *avail, int n_avail, int *out)
{
    if (want != auto_v) {
        if (!in_list(avail, n_avail, want)) return -1;
        out[0] = want;
        return 1;
    }
    memcpy(out, avail, (size_t)n_avail * sizeof *out);
    return n_avail;
}

/* micro-batch sizes: the forced one, or the smallest size for each number of passes
 * (ceil(batch / k), k = 1..batch: 8 -> 8, 4, 3, 2, 1) */
static int micro_values(int want, int batch, int *out)
{
    if (want > 0) {
        if (want > batch || (want < batch && !avail_micro_batching)) return -1;
        out[0] = want;
        return 1;
    }
    if (!avail_micro_batching) {
        out[0] = batch;
        return 1;
    }
    int n = 0;
    for (int k = 1; k <= batch; k++) {
        int m = (batch + k - 1) / k;
        if (n == 0 || out[n - 1] != m) out[n++] = m;
    }
    return n;
}

/* the search's guard on this thread (planner_guard_set), NULL: none */
static _Thread_local struct planner_guard *guard;

void planner_guard_set(struct planner_guard *g) { guard = g; }

/* the bytes g's structures take (each allocation's header counted as 16 bytes): what the
 * search holds per graph, all of them until it ends */
static size_t graph_held_bytes(const struct graph *g)
{
    size_t b = (size_t)g->cap_tensors * sizeof *g->tensors + (size_t)g->cap_ops * sizeof *g->ops +
               (size_t)g->param_cap * sizeof *g->param_slot +
               (size_t)g->cap_segs * sizeof *g->segs + 64;
    for (int i = 0; i < g->n_tensors; i++)
        b += sizeof(struct tensor) + 16 +
             (g->tensors[i]->name ? strlen(g->tensors[i]->name) + 1 + 16 : 0);
    return b;
}

/* the bytes p's per-tensor and per-op arrays take while it is made */
static size_t plan_held_bytes(const struct plan *p)
{
    size_t nt = (size_t)p->n_tensors + (size_t)p->n_copies, no = (size_t)p->n_run_ops;
    return nt * (3 * sizeof(int64_t) + 4 * sizeof(int)) +
           no * (sizeof(struct op) + 2 * sizeof(int) + 1);
}

/* 0: go on; else the guard says stop (its why, r->why set): held bytes are past its cap, or
 * its stop says so */
static int guard_check(size_t held, struct planner_result *r)
{
    struct planner_guard *g = guard;
    if (!g) return 0;
    if (held > g->peak_bytes) g->peak_bytes = held;
    if (g->max_bytes && held > g->max_bytes) {
        g->why = PLANNER_ERR_MEMORY;
        snprintf(r->why, sizeof r->why, "the search's graphs and plans took more than %zu "
                 "bytes (%zu)", g->max_bytes, held);
    } else if (g->stop && g->stop(g->ctx)) {
        g->why = PLANNER_ERR_STOPPED;
        snprintf(r->why, sizeof r->why, "the search was stopped");
    }
    return g->why;
}

static int plan_candidate(const struct planner_target *t, struct planner_candidate *c,
                          const struct graph *g, size_t budget, const struct cost_model *m,
                          int batch, size_t *held)
{
    struct plan p;
    memset(&p, 0, sizeof p);
    *held = 0;
    if (t->plan(t->ctx, &c->strategy, g, budget, &p)) {
        plan_free(&p);
        c->failed = 1;
        return -1;
    }
    *held = plan_held_bytes(&p);
    c->planned = 1;
    c->strategy.sample_batch = p.strategy.sample_batch;
    memcpy(c->parts, p.parts, sizeof c->parts);
    c->device_bytes = p.total_bytes;
    c->host_bytes = p.host_bytes;
    c->fits = !budget || p.total_bytes <= budget;
    c->predicted_s = cost_predict_step_seconds(m, &p, g, batch);
    plan_free(&p);
    return 0;
}

/* c's lower bound one level tighter (*level: 0 none yet, 1 cheap, 2 as tight as the target
 * bounds); without t->bound the level goes to 2 with no bound */
static void bound_candidate(const struct planner_target *t, struct planner_candidate *c,
                            const struct graph *g, int *level)
{
    size_t b = 0;
    if (!t->bound) {
        *level = 2;
        return;
    }
    if (t->bound(t->ctx, &c->strategy, g, *level >= 1, &b)) {
        c->failed = 1;
        return;
    }
    if (b > c->bound_bytes) c->bound_bytes = b;
    (*level)++;
}

/* planner_search's state between its stages (each reads what the ones before it wrote) */
struct search {
    const struct strategy *want;
    int batch;
    size_t budget;
    const struct cost_model *m;
    const struct planner_target *t;
    int plan_all;
    struct planner_result *r;
    int prec[8], rec[8], off[4], *micro; /* each field's values (search_fields) */
    int np, nr, no, nm;
    struct graph *graphs;                /* (np * nm) one per (precision, micro-batch) */
    int *graph_of, *level;               /* per candidate: its graph; its bound's level
                                          * (bound_candidate) */
    int built;                           /* graphs built */
    size_t held, plan_bytes;             /* the guard's count: the graphs built, the last plan */
};

/* the values each field takes (field_values, micro_values); PLANNER_ERR_ARG with r->why naming
 * the forced value the engine cannot run */
static int search_fields(struct search *s)
{
    const struct strategy *want = s->want;
    struct planner_result *r = s->r;
    s->np = field_values(want->precision, STRATEGY_PRECISION_AUTO, avail_precision,
                         N_OF(avail_precision), s->prec);
    s->nr = field_values(want->recompute, STRATEGY_RECOMPUTE_AUTO, avail_recompute,
                         N_OF(avail_recompute), s->rec);
    s->no = field_values(want->offload, -1, avail_offload, N_OF(avail_offload), s->off);
    s->nm = micro_values(want->micro_batch, s->batch, s->micro);
    if (s->np >= 0 && s->nr >= 0 && s->no >= 0 && s->nm >= 0) return PLANNER_OK;
    if (s->np < 0)
        snprintf(r->why, sizeof r->why, "the engine cannot run precision %s yet",
                 planner_precision_name(want->precision));
    else if (s->nr < 0)
        snprintf(r->why, sizeof r->why, "the engine cannot run recompute %s yet",
                 planner_recompute_name(want->recompute));
    else if (s->no < 0)
        snprintf(r->why, sizeof r->why, "the engine cannot run offload yet");
    else if (want->micro_batch > s->batch)
        snprintf(r->why, sizeof r->why, "micro-batch %d is larger than the batch %d",
                 want->micro_batch, s->batch);
    else
        snprintf(r->why, sizeof r->why,
                 "the engine cannot run micro-batches (gradient accumulation) yet");
    return PLANNER_ERR_ARG;
}

/* Appends one group's candidates to r->cand: the fp32 precisions (half 0) or the 16-bit ones
 * (half 1), every precision when one_group. One graph per (precision, micro-batch), built here;
 * its recomputation and offload choices share it. Each candidate predicted from its graph (a
 * graph that failed to build: a failed candidate). 0, or the guard's stop (guard_check). */
static int search_enumerate(struct search *s, int half, int one_group)
{
    struct planner_result *r = s->r;
    for (int ip = 0; ip < s->np; ip++) {
        if (!one_group && (s->prec[ip] != STRATEGY_PRECISION_F32) != half) continue;
        for (int im = 0; im < s->nm; im++) {
            int gi = ip * s->nm + im;
            struct strategy st = *s->want;
            st.precision = s->prec[ip];
            st.micro_batch = s->micro[im];
            st.recompute = s->rec[0];
            st.offload = s->off[0];
            if (guard_check(s->held, r)) return guard->why;
            int ok = s->t->build(s->t->ctx, &st, &s->graphs[gi]) == 0;
            s->built += ok;
            s->held += graph_held_bytes(&s->graphs[gi]);
            if (guard_check(s->held, r)) return guard->why;
            for (int ir = 0; ir < s->nr; ir++)
                for (int io = 0; io < s->no; io++) {
                    struct planner_candidate *c = &r->cand[r->n_cand];
                    c->strategy = st;
                    c->strategy.recompute = s->rec[ir];
                    c->strategy.offload = s->off[io];
                    c->failed = !ok;
                    c->predicted_s = ok ? cost_predict_graph_seconds(s->m, &s->graphs[gi],
                                                                     &c->strategy, s->batch)
                                        : 0;
                    s->graph_of[r->n_cand++] = gi;
                }
        }
    }
    return PLANNER_OK;
}

/* r->cand[first..n_cand) ordered by prediction: an insertion sort (stable: enumeration order
 * on ties), graph_of alongside */
static void search_sort(struct planner_result *r, int *graph_of, int first)
{
    for (int i = first + 1; i < r->n_cand; i++) {
        struct planner_candidate v = r->cand[i];
        int vg = graph_of[i], j = i - 1;
        while (j >= first && v.predicted_s < r->cand[j].predicted_s) {
            r->cand[j + 1] = r->cand[j];
            graph_of[j + 1] = graph_of[j];
            j--;
        }
        r->cand[j + 1] = v;
        graph_of[j + 1] = vg;
    }
}

/* r->cand[first..) planned exactly, in order, until one fits (all of them with plan_all); one
 * whose lower bound is over the budget cannot fit and is not planned. r->chosen: the first
 * that fits. 0, or the guard's stop. */
static int search_plan_group(struct search *s, int first)
{
    struct planner_result *r = s->r;
    const size_t budget = s->budget;
    for (int i = first; i < r->n_cand && (r->chosen < 0 || s->plan_all); i++) {
        struct planner_candidate *c = &r->cand[i];
        const struct graph *g = &s->graphs[s->graph_of[i]];
        while (!s->plan_all && budget && !c->failed && s->level[i] < 2 &&
               (!c->bound_bytes || c->bound_bytes <= budget)) {
            if (guard_check(s->held, r)) return guard->why;
            bound_candidate(s->t, c, g, &s->level[i]);
        }
        if (c->failed || (!s->plan_all && budget && c->bound_bytes > budget)) continue;
        if (guard_check(s->held, r)) return guard->why;
        plan_candidate(s->t, c, g, budget, s->m, s->batch, &s->plan_bytes);
        if (guard_check(s->held + s->plan_bytes, r)) return guard->why;
        if (c->planned && c->fits && r->chosen < 0) r->chosen = i;
    }
    return PLANNER_OK;
}

/* The fp32 group, then (only when none of it fits, or with plan_all) the 16-bit one; where the
 * spec allows 16 bits for speed (allow_half under AUTO), all in one group, by predicted time.
 * Each group enumerated, sorted and planned. 0, or the guard's stop. */
static int search_groups(struct search *s)
{
    struct planner_result *r = s->r;
    const int one_group = s->want->allow_half && s->want->precision == STRATEGY_PRECISION_AUTO;
    for (int half = 0; half <= (one_group ? 0 : 1) && (r->chosen < 0 || s->plan_all); half++) {
        int first = r->n_cand, rc = search_enumerate(s, half, one_group);
        if (rc) return rc;
        search_sort(r, s->graph_of, first);
        if ((rc = search_plan_group(s, first))) return rc;
    }
    return PLANNER_OK;
}

/* r->smallest, the planned candidate of the fewest device bytes. When nothing fits, the
 * candidate of the least bound is bounded tighter, or planned when its bound is as tight as it
 * gets, until no bound is below the smallest plan made. 0, or the guard's stop. */
static int search_smallest(struct search *s)
{
    struct planner_result *r = s->r;
    for (;;) {
        r->smallest = -1;
        for (int i = 0; i < r->n_cand; i++)
            if (r->cand[i].planned &&
                (r->smallest < 0 || r->cand[i].device_bytes < r->cand[r->smallest].device_bytes))
                r->smallest = i;
        if (r->chosen >= 0 || s->plan_all) return PLANNER_OK;
        int next = -1;
        for (int i = 0; i < r->n_cand; i++) {
            const struct planner_candidate *c = &r->cand[i];
            if (c->planned || c->failed ||
                (r->smallest >= 0 && c->bound_bytes >= r->cand[r->smallest].device_bytes))
                continue;
            if (next < 0 || c->bound_bytes < r->cand[next].bound_bytes) next = i;
        }
        if (next < 0) return PLANNER_OK;
        if (guard_check(s->held, r)) return guard->why;
        if (s->t->bound && s->level[next] < 2)
            bound_candidate(s->t, &r->cand[next], &s->graphs[s->graph_of[next]], &s->level[next]);
        else
            plan_candidate(s->t, &r->cand[next], &s->graphs[s->graph_of[next]], s->budget, s->m,
                           s->batch, &s->plan_bytes);
        if (guard_check(s->held + s->plan_bytes, r)) return guard->why;
    }
}

/* r->why for the search's outcome, and its status: PLANNER_OK (chosen), PLANNER_ERR_NOFIT (the
 * smallest named), PLANNER_ERR_BUILD (nothing planned) */
static int search_explain(const struct search *s)
{
    struct planner_result *r = s->r;
    const size_t budget = s->budget;
    char b1[32], b2[32], text[160];
    if (r->chosen >= 0) {
        const struct planner_candidate *c = &r->cand[r->chosen];
        fmt_bytes(b1, sizeof b1, c->device_bytes);
        if (!budget)
            snprintf(r->why, sizeof r->why, "no budget: the fastest predicted plan (%.3g s/step)",
                     c->predicted_s);
        else if (r->chosen == 0)
            snprintf(r->why, sizeof r->why, "the fastest predicted plan (%.3g s/step) fits: %s",
                     c->predicted_s, b1);
        else {
            fmt_bytes(b2, sizeof b2, budget);
            snprintf(r->why, sizeof r->why,
                     "the fastest predicted plan that fits %s (%s, %.3g s/step); %d faster "
                     "candidate%s do%s not fit", b2, b1, c->predicted_s, r->chosen,
                     r->chosen == 1 ? "" : "s", r->chosen == 1 ? "es" : "");
        }
        return PLANNER_OK;
    }
    if (r->smallest >= 0) {
        const struct planner_candidate *c = &r->cand[r->smallest];
        fmt_bytes(b1, sizeof b1, budget);
        fmt_bytes(b2, sizeof b2, c->device_bytes);
        planner_strategy_text(&c->strategy, s->batch, text, sizeof text);
        snprintf(r->why, sizeof r->why,
                 "no plan fits %s: the smallest needs %s (%zu bytes): %.120s", b1, b2,
                 c->device_bytes, text);
        return PLANNER_ERR_NOFIT;
    }
    snprintf(r->why, sizeof r->why, "no candidate could be planned");
    return PLANNER_ERR_BUILD;
}

int planner_search(const struct strategy *want, int batch, size_t budget,
                   const struct cost_model *m, const struct planner_target *t, int plan_all,
                   struct planner_result *r)
{
    memset(r, 0, sizeof *r);
    r->chosen = r->smallest = -1;
    r->budget = budget;
    if (batch < 1) {
        snprintf(r->why, sizeof r->why, "batch %d: must be at least 1", batch);
        return PLANNER_ERR_ARG;
    }
    struct search s = {.want = want, .batch = batch, .budget = budget, .m = m, .t = t,
                       .plan_all = plan_all, .r = r};
    s.micro = malloc((size_t)batch * sizeof *s.micro + sizeof *s.micro);
    if (guard) guard->why = 0;
    if (!s.micro) return PLANNER_ERR_NOMEM;
    int rc = search_fields(&s);
    if (!rc) {
        int ng = s.np * s.nm, nc = ng * s.nr * s.no;
        s.graphs = calloc((size_t)ng, sizeof *s.graphs);
        r->cand = calloc((size_t)nc + 1, sizeof *r->cand);
        s.graph_of = calloc((size_t)nc + 1, sizeof *s.graph_of);
        s.level = calloc((size_t)nc + 1, sizeof *s.level);
        if (!s.graphs || !r->cand || !s.graph_of || !s.level) rc = PLANNER_ERR_NOMEM;
        for (int i = 0; !rc && i < ng; i++) graph_init(&s.graphs[i]);
    }
    if (!rc) rc = search_groups(&s);
    if (!rc && !s.built) {
        snprintf(r->why, sizeof r->why, "no candidate's graph could be built");
        rc = PLANNER_ERR_BUILD;
    }
    if (!rc) rc = search_smallest(&s);
    if (!rc) rc = search_explain(&s);
    else if (rc == PLANNER_ERR_STOPPED || rc == PLANNER_ERR_MEMORY)
        r->chosen = r->smallest = -1; /* nothing chosen: the search did not end */
    if (s.graphs)
        for (int i = 0; i < s.np * s.nm; i++) graph_free(&s.graphs[i]);
    free(s.graphs);
    free(s.graph_of);
    free(s.level);
    free(s.micro);
    if (rc == PLANNER_ERR_NOMEM) snprintf(r->why, sizeof r->why, "out of memory");
    return rc;
}

void planner_result_free(struct planner_result *r)
{
    free(r->cand);
    memset(r, 0, sizeof *r);
}
