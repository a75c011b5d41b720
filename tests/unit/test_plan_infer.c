/* test_plan_infer.c - inference plans hold only what sampling needs (weights, inputs, the
 * activations with their real lifetimes, workspace; no gradients, AdamW moments or EMA) and sample
 * bit-identically to the old training-shaped plan; a nested sampling plan runs inside a training
 * job's one reservation (weights read in place from its EMA block) without touching a byte past it;
 * a grid sampled in chunks of any size gives the same images within rounding.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddpm.h"
#include "exec.h"
#include "init.h"
#include "memplan.h"
#include "generate.h"
#include "sampler.h"
#include "spec.h"
#include "test_util.h"
#include "unet.h"

/* ---- a CPU backend whose one allocation has a sentinel tail: a write past the reservation
 * shows up there; it also counts allocations ---- */

#define TAIL 4096
static struct backend counting;
static int n_allocs;
static size_t alloc_bytes;
static unsigned char *alloc_base;

static int counting_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    int rc = backend_cpu()->mem_alloc(out, bytes + TAIL, ctx);
    if (rc) return rc;
    memset((unsigned char *)*out + bytes, 0xA5, TAIL);
    n_allocs++;
    alloc_bytes = bytes;
    alloc_base = *out;
    return BK_OK;
}

static int tail_intact(void)
{
    for (size_t i = 0; i < TAIL; i++)
        if (alloc_base[alloc_bytes + i] != 0xA5) return 0;
    return 1;
}

static const struct backend *counting_backend(void)
{
    counting = *backend_cpu();
    counting.mem_alloc = counting_alloc;
    return &counting;
}

static struct unet_config tiny_model(void)
{
    struct train_spec s;
    struct spec_errors E;
    if (spec_load_file("examples/fmnist-tiny.json", &s, &E)) {
        fprintf(stderr, "test_plan_infer: needs examples/fmnist-tiny.json in the working dir\n");
        exit(1);
    }
    return s.model;
}

/* every parameter of g from init_param(seed) */
static int upload_params(struct exec *e, const struct graph *g, uint64_t seed,
                         enum exec_part part)
{
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        float *w = malloc(t->numel * sizeof *w);
        if (!w) return -1;
        init_param(t, seed + (uint64_t)t->param_index, w);
        int rc = exec_upload_part(e, part, i, w);
        free(w);
        if (rc) return rc;
    }
    return 0;
}

static int sample_through(struct generator *j, const struct ddpm_schedule *sch, int n,
                          float *out)
{
    struct sampler_config sc;
    sampler_config_default(&sc);
    sc.steps = 2;
    sc.eta = 0.5f; /* the noise path too */
    return generate_run(j, sch, &sc, 7, n, out, NULL, NULL);
}

/* 1. bytes by part, statistics' lifetimes, bit-identical sampling */
static void inference_plan(const struct unet_config *m, const struct ddpm_schedule *sch)
{
    const int batch = 4, n = 6; /* two chunks, the last one partial */
    struct graph g;
    struct unet_io io;
    struct plan old, inf;
    graph_init(&g);
    CHECK(unet_build(&g, m, batch, &io) == 0, "build");
    struct plan_opts po_old = {.mode = PLAN_MODE_TRAIN};
    struct plan_opts po_inf = {.guard_bytes = 64}; /* AUTO: the graph has no backward */
    CHECK(plan_make(&old, &g, backend_cpu(), &po_old) == 0, "old-style plan");
    CHECK(plan_make(&inf, &g, backend_cpu(), &po_inf) == 0, "inference plan");
    printf("old (training-shaped) plan of the sampling graph:\n");
    plan_print(&old, stdout);
    printf("inference plan:\n");
    plan_print(&inf, stdout);

    CHECK(!old.inference && inf.inference, "modes: old %d, new %d", old.inference, inf.inference);
    CHECK(inf.grads_bytes == 0 && inf.adam_bytes == 0 && inf.ema_bytes == 0,
          "inference plan holds grads %zu, adam %zu, ema %zu bytes", inf.grads_bytes,
          inf.adam_bytes, inf.ema_bytes);
    CHECK(inf.params_bytes == old.params_bytes && inf.params_bytes > 0, "parameters %zu vs %zu",
          inf.params_bytes, old.params_bytes);
    size_t parts = inf.params_bytes + inf.inputs_bytes + inf.ws_bytes + 2 * inf.ws_guard_bytes +
                   inf.arena_bytes;
    CHECK(inf.total_bytes == parts, "total %zu is not the sum of its parts %zu", inf.total_bytes,
          parts);
    CHECK(inf.inputs_off == inf.params_bytes, "inputs right after the weights (%zu, %zu)",
          inf.inputs_off, inf.params_bytes);
    CHECK(old.total_bytes >= inf.total_bytes + 4 * old.params_bytes,
          "inference plan %zu bytes, old %zu: not 4 x %zu smaller", inf.total_bytes,
          old.total_bytes, old.params_bytes);
    /* statistics nobody reads die where they are written: the arena shrinks (guards aside) */
    CHECK(inf.arena_bytes - inf.guards_bytes < old.arena_bytes,
          "inference arena %zu (of it guards %zu) not smaller than %zu", inf.arena_bytes,
          inf.guards_bytes, old.arena_bytes);
    int stats = 0, stats_ok = 0;
    for (int k = 0; k < g.n_ops; k++) {
        const struct op *o = &g.ops[k];
        if (o->type != OP_GROUPNORM && o->type != OP_ATTENTION) continue;
        for (int j = 1; j < o->n_out; j++) {
            int t = o->out[j];
            if (t < 0) continue;
            stats++;
            stats_ok += inf.first[t] == k && inf.last[t] == k && old.last[t] == g.n_ops - 1;
        }
    }
    CHECK(stats > 0 && stats_ok == stats, "%d of %d saved statistics live only at their op",
          stats_ok, stats);
    CHECK(inf.last[io.out] == g.n_ops - 1, "the model output lives to the end (%d of %d)",
          inf.last[io.out], g.n_ops);

    /* the same weights through both plans; the new one with poison and canaries */
    struct generator jo = {.g = g, .io = io, .p = old, .batch = batch, .model = *m};
    struct generator ji = jo;
    ji.p = inf;
    struct exec_opts eo = {.threads = 1};
    struct exec_opts ei = {.threads = 1, .poison = 1, .check_guards = 1};
    CHECK(exec_init(&jo.e, &g, &old, backend_cpu(), &eo) == 0, "exec old");
    CHECK(exec_init(&ji.e, &g, &inf, backend_cpu(), &ei) == 0, "exec inference");
    if (!jo.e || !ji.e) goto out;
    CHECK(upload_params(jo.e, &g, 11, EXEC_PART_WEIGHT) == 0 &&
              upload_params(ji.e, &g, 11, EXEC_PART_WEIGHT) == 0,
          "weights");
    int p0 = -1;
    for (int i = 0; i < g.n_tensors && p0 < 0; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) p0 = i;
    float *w0 = malloc(g.tensors[p0]->numel * sizeof *w0);
    CHECK(w0 && exec_download_part(ji.e, EXEC_PART_EMA, p0, w0) == EXEC_ERR_ARG &&
              exec_download_part(ji.e, EXEC_PART_WEIGHT, p0, w0) == EXEC_OK,
          "an inference exec has weights and no EMA part");
    free(w0);
    CHECK(exec_forward_backward(ji.e, 1, 1.0f, 0, 0, 0, NULL) == EXEC_ERR_ARG,
          "an inference exec refuses a backward");

    size_t per = g.tensors[io.x]->numel / (size_t)batch;
    float *a = calloc((size_t)n * per, sizeof *a), *b = calloc((size_t)n * per, sizeof *b);
    float *fa = calloc((size_t)batch * per, sizeof *fa), *fb = calloc((size_t)batch * per, 4);
    float *x = malloc((size_t)batch * per * sizeof *x), tf[4] = {999, 500, 17, 0};
    if (!a || !b || !fa || !fb || !x) goto free_bufs;
    /* one raw forward: the model output bit for bit */
    tu_seed(5);
    tu_fill(x, (size_t)batch * per, 1.0);
    CHECK(exec_upload(jo.e, io.x, x) == 0 && exec_upload(jo.e, io.t, tf) == 0 &&
              exec_forward(jo.e, NULL) == 0 && exec_download(jo.e, io.out, fa) == 0,
          "old forward");
    CHECK(exec_upload(ji.e, io.x, x) == 0 && exec_upload(ji.e, io.t, tf) == 0 &&
              exec_forward(ji.e, NULL) == 0 && exec_download(ji.e, io.out, fb) == 0,
          "inference forward");
    CHECK(memcmp(fa, fb, (size_t)batch * per * sizeof *fa) == 0,
          "forward output differs between the plans");
    CHECK(sample_through(&jo, sch, n, a) == GENERATE_OK, "old sampling");
    CHECK(sample_through(&ji, sch, n, b) == GENERATE_OK, "inference sampling");
    CHECK(memcmp(a, b, (size_t)n * per * sizeof *a) == 0, "samples differ between the plans");
    double sum = 0;
    for (size_t i = 0; i < (size_t)n * per; i++) sum += a[i] < 0 ? -a[i] : a[i];
    CHECK(sum > 0 && sum == sum, "samples are not trivial (|sum| %g)", sum);
free_bufs:
    free(a);
    free(b);
    free(fa);
    free(fb);
    free(x);
out:
    exec_free(jo.e);
    exec_free(ji.e);
    plan_free(&old);
    plan_free(&inf);
    graph_free(&g);
}

/* 4. a training job's sample grid inside its one reservation */
static void nested_sampling(const struct unet_config *m, const struct ddpm_schedule *sch)
{
    const int tbatch = 1, sbatch = 8, n = 8;
    struct graph tg, sg;
    struct unet_io tio, sio;
    int target, loss_id;
    struct plan tp, sp, ref;
    graph_init(&tg);
    graph_init(&sg);
    CHECK(unet_build_training(&tg, m, tbatch, &tio, &target, &loss_id) == 0, "training graph");
    CHECK(unet_build(&sg, m, sbatch, &sio) == 0, "sampling graph");
    struct plan_opts po = {.guard_bytes = 64};
    CHECK(plan_make(&tp, &tg, backend_cpu(), &po) == 0 && !tp.inference, "training plan");
    CHECK(plan_make_nested(&sp, &sg, backend_cpu(), &po, &tp, &tg, PLAN_WEIGHTS_EMA) == 0,
          "nested plan");
    CHECK(plan_make(&ref, &sg, backend_cpu(), NULL) == 0, "standalone sampling plan");
    size_t train_only = tp.total_bytes;
    /* the case that matters: sampling needs more than the step's transient part */
    CHECK(sp.total_bytes > train_only, "nested plan ends at %zu, the training plan at %zu",
          sp.total_bytes, train_only);
    /* the grid's own bytes start where the host's transient part does: its gradients (f32: no
     * working copy), dead between two steps */
    CHECK(sp.nested && sp.inference && sp.params_off == tp.ema_off &&
              sp.inputs_off == tp.transient_off && tp.transient_off == tp.grads_off &&
              tp.grads_off + tp.grads_bytes == tp.inputs_off,
          "nested layout: params at %zu (ema %zu), inputs at %zu (transient part %zu, grads "
          "%zu)", sp.params_off, tp.ema_off, sp.inputs_off, tp.transient_off, tp.grads_off);
    /* one reservation, unreserved: the nested exec refuses rather than reach past it */
    const struct backend *cb = counting_backend();
    struct exec *host = NULL, *sub = NULL, *solo = NULL;
    struct exec_opts eo = {.threads = 1, .check_guards = 1};
    n_allocs = 0;
    CHECK(exec_init(&host, &tg, &tp, cb, &eo) == 0, "host exec (unreserved)");
    if (host) {
        struct exec_error ie = {0};
        struct exec_opts so = {.threads = 1, .init_error = &ie};
        int rc = exec_init_nested(&sub, &sg, &sp, host, &so);
        CHECK(rc == EXEC_ERR_BUDGET && sub == NULL && strstr(ie.msg, "reservation"),
              "a nested plan beyond the reservation: rc %d (%s)", rc, ie.msg);
        exec_free(host);
        host = NULL;
    }
    plan_reserve_nested(&tp, &sp);
    CHECK(tp.total_bytes == sp.total_bytes && tp.nested_bytes == sp.total_bytes,
          "reservation %zu, nested end %zu", tp.total_bytes, sp.total_bytes);
    printf("training plan with its nested sampling (batch %d inside batch %d):\n", sbatch, tbatch);
    plan_print(&tp, stdout);

    n_allocs = 0;
    CHECK(exec_init(&host, &tg, &tp, cb, &eo) == 0, "host exec");
    if (!host) goto out;
    CHECK(n_allocs == 1 && alloc_bytes == tp.total_bytes, "%d allocations, %zu bytes (plan %zu)",
          n_allocs, alloc_bytes, tp.total_bytes);
    /* weights from seed 1, EMA from seed 2: the sample must read the EMA */
    CHECK(upload_params(host, &tg, 1, EXEC_PART_WEIGHT) == 0 &&
              upload_params(host, &tg, 2, EXEC_PART_EMA) == 0,
          "host weights");
    size_t img = tg.tensors[tio.x]->numel;
    float *x = malloc(img * sizeof *x), *tgt = malloc(img * sizeof *tgt), tf[1] = {321};
    size_t gbytes = tp.grads_bytes;
    float *g1 = malloc(gbytes), *g2 = malloc(gbytes), l1 = 0, l2 = 0;
    size_t per = sg.tensors[sio.x]->numel / (size_t)sbatch;
    float *a = calloc((size_t)n * per, sizeof *a), *b = calloc((size_t)n * per, sizeof *b);
    if (!x || !tgt || !g1 || !g2 || !a || !b) goto free_bufs;
    tu_seed(9);
    tu_fill(x, img, 1.0);
    tu_fill(tgt, img, 1.0);
    /* a step, sampling in between, the same step again: the same loss and gradients */
    CHECK(exec_upload(host, tio.x, x) == 0 && exec_upload(host, tio.t, tf) == 0 &&
              exec_upload(host, target, tgt) == 0 &&
              exec_forward_backward(host, 1, 1.0f, 3, 0, 0, &l1) == 0,
          "first step");
    memcpy(g1, (unsigned char *)alloc_base + tp.grads_off, gbytes);

    struct exec_opts so = {.poison = 1, .check_guards = 1};
    n_allocs = 0;
    CHECK(exec_init_nested(&sub, &sg, &sp, host, &so) == 0 && n_allocs == 0,
          "nested exec (%d allocations)", n_allocs);
    if (!sub) goto free_bufs;
    struct generator jn = {.g = sg, .io = sio, .p = sp, .e = sub, .batch = sbatch, .model = *m};
    CHECK(sample_through(&jn, sch, n, a) == GENERATE_OK, "nested sampling");
    CHECK(tail_intact(), "a byte past the reservation was written");

    /* the reference: a standalone sampling job given the EMA weights from their seed (not read
     * back from the host, whose EMA block a misplaced nested plan could have changed) */
    struct generator js = {.g = sg, .io = sio, .p = ref, .batch = sbatch, .model = *m};
    CHECK(exec_init(&solo, &sg, &ref, backend_cpu(), &(struct exec_opts){.threads = 1}) == 0,
          "standalone exec");
    if (!solo) goto free_bufs;
    js.e = solo;
    CHECK(upload_params(solo, &sg, 2, EXEC_PART_WEIGHT) == 0, "the EMA weights (seed 2)");
    CHECK(sample_through(&js, sch, n, b) == GENERATE_OK, "standalone sampling");
    CHECK(memcmp(a, b, (size_t)n * per * sizeof *a) == 0,
          "nested samples differ from a standalone job's with the EMA weights");

    CHECK(exec_upload(host, tio.x, x) == 0 && exec_upload(host, tio.t, tf) == 0 &&
              exec_upload(host, target, tgt) == 0 &&
              exec_forward_backward(host, 1, 1.0f, 3, 0, 0, &l2) == 0,
          "the step after sampling (canaries checked)");
    memcpy(g2, (unsigned char *)alloc_base + tp.grads_off, gbytes);
    CHECK(memcmp(&l1, &l2, sizeof l1) == 0 && memcmp(g1, g2, gbytes) == 0,
          "the step after a nested sampling differs: loss %.9g vs %.9g", l1, l2);
    CHECK(tail_intact(), "a byte past the reservation was written");
free_bufs:
    free(x);
    free(tgt);
    free(g1);
    free(g2);
    free(a);
    free(b);
out:
    exec_free(sub);
    exec_free(solo);
    exec_free(host);
    plan_free(&tp);
    plan_free(&sp);
    plan_free(&ref);
    graph_free(&tg);
    graph_free(&sg);
}

/* 5. a grid in chunks (a training job's strategy.sample_batch): image i's noise is drawn by i, so
 * chunks of 6 (one), 4 (4 + 2) and 1 give image i the same numbers; the model's per-image result
 * depends on the batch only by rounding (the CPU's small GEMMs sum in another order at another
 * row count: ~1e-7 after one forward), so the images agree within 1e-4 after the sampler's steps,
 * where drawing by the chunk's row instead of i differs by O(1) */
static void grid_chunks(const struct unet_config *m, const struct ddpm_schedule *sch)
{
    enum { N = 6 };
    static const int chunk[] = {6, 4, 1};
    float *img[3] = {NULL, NULL, NULL};
    double most = 0;
    for (int k = 0; k < 3; k++) {
        struct generator j;
        char err[256];
        if (generate_init(&j, m, chunk[k], 1, NULL, err, sizeof err)) {
            CHECK(0, "chunk %d: %s", chunk[k], err);
            continue;
        }
        size_t per = j.g.tensors[j.io.x]->numel / (size_t)chunk[k];
        img[k] = malloc(N * per * sizeof *img[k]);
        CHECK(img[k] && upload_params(j.e, &j.g, 3, EXEC_PART_WEIGHT) == 0 &&
                  sample_through(&j, sch, N, img[k]) == GENERATE_OK,
              "sampling in chunks of %d", chunk[k]);
        for (size_t e = 0; k > 0 && img[0] && img[k] && e < N * per; e++) {
            double d = fabs((double)img[k][e] - img[0][e]);
            if (d > most) most = d;
        }
        generate_free(&j);
    }
    printf("a grid of %d images in chunks of 6, 4 and 1: the largest difference %.3g\n", N,
           most);
    CHECK(most <= 1e-4, "the grid in chunks differs from the grid in one by %.3g", most);
    for (int k = 0; k < 3; k++) free(img[k]);
}

int main(void)
{
    struct unet_config m = tiny_model();
    struct ddpm_schedule sch;
    if (ddpm_schedule_init(&sch, 1000, DDPM_BETA_LINEAR, 1e-4, 0.02)) return 1;
    inference_plan(&m, &sch);
    nested_sampling(&m, &sch);
    grid_chunks(&m, &sch);
    ddpm_schedule_free(&sch);
    return tu_finish("test_plan_infer");
}
