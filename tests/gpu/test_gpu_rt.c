/* test_gpu_rt.c - the CUDA backend's runtime side: the job's budget (ctx_set_budget,
 * mem_high_water: a reservation beyond it fails with EXEC_ERR_BUDGET and leaves the device as it
 * was), offload on the device (the host block page-locked, each gradient copied out on the copy
 * stream as soon as the backward has made it final, the optimizer on the host, the weights back
 * before the next forward) against the plain step, with and without an uneven micro-batch, and
 * what the emulator (tests/gpu/emu) sees of a training run: one device allocation, the plan's,
 * the libraries' workspace inside the plan's, no pageable memory in an asynchronous copy, and no
 * stream-order hazard between the copy and compute streams (a hazard fails the step).
 * Under the emulator the offloaded run (f32, and bf16 with its 16-bit working copy) is
 * bit-identical to the plain one (both run the same float operations in the same order); on a
 * GPU within 1e-5 (relative, per state float, over 1e-6). The device's AdamW rounds each
 * operation as the host's (test_fma_rule.sh): with nvcc's FMAs an H200 gave 6.5e-3 (fp32) and 88
 * (bf16) here, the ulp after step one grown by Adam's second step; the emulator, whose kernels the
 * host's compiler builds without contraction, cannot see that (the same FMAs planted in its AdamW
 * and EMA give 500,205 of 882,565 floats different, worst 8.0e-3). Nothing in the copy and
 * compute streams' order was found wrong: the emulator already runs page-locked copies late and
 * checks every device byte range across the two streams.
 * CUDA graphs: steps whose forward/backward and optimizer step are captured once and replayed
 * (the executor's default) against the same steps run as they come (exec_opts.eager), in parity
 * mode: the state and every step's logged loss, norm, loss scale and skip bit-identical, in f32
 * with an uneven micro-batch, bf16, and f16 with skipped steps; the device's loss scaling and
 * clipping against the CPU backend's host-side ones; under the emulator the replayed steps
 * launch no kernel but the per-step scalars' (the whole step is graphs), and its capture's own
 * planted misuses (syncs, allocations, host reads refused). Without a device: "SKIPPED", exit 77.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend_load.h"
#include "emu/emu_graph.h"
#include "emu/emu_stats.h"
#include "test_accum.h"
#include "test_unet_util.h"

#define GRANULE ((size_t)2 << 20) /* the emulator's (and the driver's) allocation granularity */

static const struct backend *G;
static ddpmd_emu_get_stats_fn emu_stats; /* NULL on a GPU */
static ddpmd_emu_graph_stats_fn emu_gstats;

static const struct optim_config OC = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                                       .eps = 1e-8f, .weight_decay = 0.01f, .clip = 1.0f,
                                       .ema_decay = 0.99f};

static void config(struct unet_config *c)
{
    tu_small_unet(c, UNET_DDPM); /* convolutions (cuDNN), attention, linear layers (cuBLAS) */
    c->dropout = 0.1f;
}

static struct ddpmd_emu_stats stats(int reset)
{
    struct ddpmd_emu_stats s;
    memset(&s, 0, sizeof s);
    if (emu_stats) emu_stats(&s, reset);
    return s;
}

static size_t dev_free(void)
{
    struct bk_device_mem m;
    return G->device_mem(0, &m) == 0 ? m.free : 0;
}

/* `steps` steps of batch in micro-batches of micro, with or without offload: the final state
 * and loss; under the emulator what the run allocated and how it copied */
static float *run(const char *name, int batch, int micro, int steps, int offload,
                  int precision, size_t *n, float *loss)
{
    struct unet_config c;
    config(&c);
    struct accum j;
    struct plan_opts po = {0};
    po.strategy.offload = offload;
    po.strategy.precision = precision;
    float *st = NULL;
    int rc = accum_plan(&j, G, &c, batch, micro, &po);
    CHECK(rc == 0, "%s: planning", name);
    if (rc) goto done;
    struct ddpmd_emu_stats s0 = stats(1);
    rc = accum_start(&j, G, NULL);
    CHECK(rc == 0, "%s: exec_init: %s", name, j.e ? exec_last_error(j.e)->msg : "");
    if (rc) goto done;
    /* the executor's one allocation is the plan, and it holds nothing else on the device; the
     * backend ran the plan's library calls on scratch before it (freed again; the kernels they
     * loaded, emulated modules, stay with the process). Counts restart for the steps */
    struct ddpmd_emu_stats s1 = stats(1);
    CHECK(exec_device_high_water(j.e) == j.p.total_bytes,
          "%s: the backend measured %zu bytes held, the plan is %zu", name,
          exec_device_high_water(j.e), j.p.total_bytes);
    long pinned_fb = 0, pageable_fb = 0, pageable_opt = 0;
    for (int s = 0; s < steps && !rc; s++) {
        struct ddpmd_emu_stats a = stats(0);
        rc = accum_step(&j, loss);
        struct ddpmd_emu_stats b = stats(0);
        pinned_fb += b.async_pinned - a.async_pinned;
        pageable_fb += b.async_pageable - a.async_pageable;
        if (!rc) rc = exec_optimizer_step(j.e, &OC, s + 1, OC.lr, NULL);
        CHECK(rc == 0, "%s step %d: %s%s", name, s, exec_last_error(j.e)->msg,
              j.re ? exec_last_error(j.re)->msg : "");
        pageable_opt += stats(0).async_pageable - b.async_pageable;
    }
    struct ddpmd_emu_stats s2 = stats(0);
    if (emu_stats) {
        size_t want = (j.p.total_bytes + GRANULE - 1) / GRANULE * GRANULE;
        const size_t mods = (size_t)s1.modules * GRANULE;
        CHECK(s1.mallocs == s1.frees + 1 && s1.last_malloc == j.p.total_bytes &&
                  s1.used - s0.used == want + mods && s2.mallocs == 0 && s2.modules == 0 &&
                  s2.used == s1.used && s2.peak == s1.used,
              "%s: at init %ld device allocations (%ld freed, the last %zu bytes), %ld modules, "
              "+%zu bytes held; in the steps %ld allocations and %ld modules (peak +%zu); the "
              "plan is %zu bytes", name, s1.mallocs, s1.frees, s1.last_malloc, s1.modules,
              s1.used - s0.used, s2.mallocs, s2.modules, s2.peak - s0.used, j.p.total_bytes);
        CHECK(s1.host_mallocs == offload, "%s: %ld page-locked host blocks", name,
              s1.host_mallocs);
        /* cuBLAS (the linear layers) and cuDNN (the convolutions) work in the plan's workspace */
        const int p0 = j.g.n_tensors > 0 ? 0 : -1;
        int pid = p0;
        while (pid < j.g.n_tensors && j.g.tensors[pid]->kind != TENSOR_PARAM) pid++;
        uintptr_t base = (uintptr_t)exec_tensor(j.e, pid) - (uintptr_t)j.p.offset[pid];
        uintptr_t lo = base + j.p.ws_off, hi = lo + j.p.ws_bytes;
        if (j.rest) { /* the uneven micro-batch's plan has its own: between the two */
            uintptr_t rlo = base + j.rp.ws_off, rhi = rlo + j.rp.ws_bytes;
            lo = rlo < lo ? rlo : lo;
            hi = rhi > hi ? rhi : hi;
        }
        struct ddpmd_emu_stats ws = s2;
        CHECK(ws.blas_ws_uses > 0 && ws.ws_uses > ws.blas_ws_uses && ws.ws_lo >= lo &&
                  ws.ws_hi <= hi,
              "%s: the libraries' workspace [%+lld, %+lld) (%ld uses, %ld cuBLAS's) is not "
              "the plan's [0, %zu)", name, (long long)(ws.ws_lo - lo),
              (long long)(ws.ws_hi - lo), ws.ws_uses, ws.blas_ws_uses, (size_t)(hi - lo));
        /* the gradients' copies page-locked (asynchronous); the loss is the one pageable copy
         * of a micro-batch */
        const long mb = (batch + micro - 1) / micro;
        CHECK(pinned_fb == (offload ? steps * mb * (long)j.g.n_params : 0),
              "%s: %ld page-locked copies for %d parameters in %ld micro-batches", name,
              pinned_fb, j.g.n_params, steps * mb);
        CHECK(pageable_fb == 4 * steps * mb && pageable_opt == 0,
              "%s: %ld pageable async copies in the steps (want %ld: 3 inputs and the loss a "
              "micro-batch), %ld in the optimizer", name, pageable_fb, 4 * steps * mb,
              pageable_opt);
        printf("%s: plan %zu bytes, host %zu; 1 device allocation (+%zu MiB), %ld page-locked "
               "copies in the backward, workspace used [%zu, %zu) of %zu\n", name,
               j.p.total_bytes, j.p.host_bytes, want >> 20, pinned_fb, (size_t)(ws.ws_lo - lo),
               (size_t)(ws.ws_hi - lo), (size_t)(hi - lo));
    }
    st = accum_state(&j, n);
done:
    accum_free(&j);
    return st;
}

/* offload against the plain run: bit for bit under the emulator, 1e-5 on a GPU */
static void offload_equal(int batch, int micro, int steps, int precision)
{
    char a[64], b[64];
    const char *pn = precision == STRATEGY_PRECISION_BF16 ? " bf16" : "";
    snprintf(a, sizeof a, "plain b%d/%d%s", batch, micro, pn);
    snprintf(b, sizeof b, "offload b%d/%d%s", batch, micro, pn);
    size_t n1 = 0, n2 = 0;
    float l1 = 0, l2 = 0;
    float *s1 = run(a, batch, micro, steps, 0, precision, &n1, &l1);
    float *s2 = run(b, batch, micro, steps, 1, precision, &n2, &l2);
    if (s1 && s2 && n1 == n2) {
        size_t diff = 0;
        double worst = 0;
        for (size_t k = 0; k < n1; k++) {
            diff += memcmp(&s1[k], &s2[k], 4) != 0;
            double d = fabs((double)s1[k] - s2[k]) / (fabs((double)s1[k]) + 1e-6);
            if (d > worst) worst = d;
        }
        if (emu_stats)
            CHECK(diff == 0 && memcmp(&l1, &l2, 4) == 0,
                  "%s: %zu of %zu state floats differ from the plain run's (worst %.3g), loss "
                  "%.9g vs %.9g", b, diff, n1, worst, l2, l1);
        else
            CHECK(worst < 1e-5 && fabsf(l1 - l2) <= 1e-6f * fabsf(l1), "%s: worst %.3g", b,
                  worst);
        printf("%s: %zu of %zu state floats differ from the plain run's, loss %.9g vs %.9g\n", b,
               diff, n1, l2, l1);
    } else {
        CHECK(0, "%s: no state to compare", b);
    }
    free(s1);
    free(s2);
}

/* a job's budget: the reservation beyond it fails before anything is allocated, at it succeeds
 * and is the measured high-water mark; the backend's own refusal past it */
static void budget(void)
{
    struct unet_config c;
    config(&c);
    struct accum j;
    CHECK(accum_plan(&j, G, &c, 2, 2, NULL) == 0, "budget: planning");
    const size_t total = j.p.total_bytes, free0 = dev_free();
    struct exec_error err;
    struct exec_opts eo = {.threads = 1, .budget = total - 1, .init_error = &err};
    int rc = exec_init(&j.e, &j.g, &j.p, G, &eo);
    CHECK(rc == EXEC_ERR_BUDGET && err.bk_status == BK_ERR_NOMEM && !j.e &&
              strstr(err.msg, "cannot reserve the plan's"),
          "a budget one byte short: exec_init %d (%s)", rc, err.msg);
    CHECK(dev_free() == free0 && !G->device_poisoned(0),
          "the refused reservation changed the device");
    eo.budget = total;
    rc = exec_init(&j.e, &j.g, &j.p, G, &eo);
    CHECK(rc == 0 && exec_device_high_water(j.e) == total,
          "a budget of exactly the plan: exec_init %d, high-water %zu of %zu", rc,
          j.e ? exec_device_high_water(j.e) : 0, total);
    printf("budget: %zu bytes refused at %zu, reserved at %zu (high-water %zu)\n", total,
           total - 1, total, j.e ? exec_device_high_water(j.e) : 0);
    accum_free(&j);

    bk_ctx *ctx = NULL;
    void *a = NULL, *b = NULL;
    CHECK(G->ctx_init(&ctx, 1) == 0 && G->ctx_set_budget(ctx, 3 << 20) == 0, "a context");
    CHECK(G->mem_alloc(&a, 2 << 20, ctx) == 0, "2 MiB of 3");
    CHECK(G->mem_alloc(&b, (1 << 20) + 1, ctx) == BK_ERR_NOMEM && !b, "1 MiB + 1 more of 3");
    CHECK(G->mem_alloc(&b, 1 << 20, ctx) == 0, "1 MiB more of 3");
    G->mem_free(a, ctx);
    a = NULL;
    CHECK(G->mem_alloc(&a, 2 << 20, ctx) == 0, "2 MiB again after a free");
    CHECK(G->mem_high_water(ctx) == 3 << 20, "high-water %zu", G->mem_high_water(ctx));
    G->mem_free(a, ctx);
    G->mem_free(b, ctx);
    /* the copy stream takes page-locked memory only: a pageable copy would not overlap */
    float *d = NULL, h[16], *pin = NULL;
    CHECK(G->mem_alloc((void **)&d, sizeof h, ctx) == 0 &&
              G->host_alloc((void **)&pin, sizeof h, ctx) == 0,
          "device and page-locked buffers");
    CHECK(G->mem_download_async(h, d, sizeof h, ctx) == BK_ERR_INVALID &&
              G->mem_upload_async(d, h, sizeof h, ctx) == BK_ERR_INVALID,
          "an async copy with pageable host memory was taken");
    CHECK(G->mem_download_async(pin, d, sizeof h, ctx) == 0 && G->copy_sync(ctx) == 0,
          "an async copy into page-locked memory");
    CHECK(!G->device_poisoned(0), "the device is poisoned");
    G->host_free(pin, ctx);
    G->mem_free(d, ctx);
    G->ctx_free(ctx);
}

/* ---- CUDA graphs ---- */

static struct emu_graph_stats gstats(void)
{
    struct emu_graph_stats s;
    memset(&s, 0, sizeof s);
    if (emu_gstats) emu_gstats(&s);
    return s;
}

/* a warmup schedule: the learning rate changes every step (a captured optimizer step must read
 * the step's, not the capture's) */
static const struct optim_config OCW = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                                        .eps = 1e-8f, .weight_decay = 0.01f, .clip = 1.0f,
                                        .ema_decay = 0.99f, .warmup = 8};

/* step s of a's effective batch (inputs drawn by the step and the sample's index), the host
 * reading nothing: the training loop's way */
static int graph_step(struct accum *a, int s)
{
    const size_t per = a->g.tensors[a->io.x]->numel / (size_t)a->micro;
    float *x = malloc((size_t)a->micro * per * sizeof *x);
    float *y = malloc((size_t)a->micro * per * sizeof *y), t[64];
    int rc = 0;
    for (int i0 = 0; i0 < a->batch && !rc; i0 += a->micro) {
        const int n = a->batch - i0 < a->micro ? a->batch - i0 : a->micro, last = n != a->micro;
        struct exec *e = last ? a->re : a->e;
        for (int i = 0; i < n; i++) {
            for (size_t k = 0; k < per; k++) {
                x[i * per + k] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s,
                                               (uint32_t)(i0 + i), 0, (uint32_t)k);
                y[i * per + k] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s,
                                               (uint32_t)(i0 + i), 1, (uint32_t)k);
            }
            t[i] = (float)((s * 131 + (i0 + i) * 377) % 1000);
        }
        rc = exec_upload(e, last ? a->rio.x : a->io.x, x) ||
             exec_upload(e, last ? a->rio.t : a->io.t, t) ||
             exec_upload(e, last ? a->rtarget : a->target, y) ||
             exec_forward_backward(e, i0 == 0, (float)n / (float)a->batch, 11, (uint64_t)s, i0,
                                   NULL);
    }
    if (!rc) rc = exec_optimizer_step(a->e, &OCW, s + 1, optim_lr(&OCW, s), NULL);
    free(x);
    free(y);
    return rc;
}

struct graph_run {
    float *state;                         /* accum_state */
    size_t n;
    struct exec_step_stats log[8];
    int nlog;
    struct loss_scaler ls;
    long eager_last;                      /* kernel launches of the last step run at once */
    struct emu_graph_stats gs;            /* what the run's capture did */
};

/* `steps` steps on bk (eager: no graphs) of the small model at 8x8 in precision, batch in
 * micro-batches of micro; f16: loss scaling from `scale` (growth every 2 finite steps, backoff
 * 2^-16: far from overflow after a skip, where the CPU's and the GPU's 16-bit rounding could
 * decide it differently) */
static int graph_run(const struct backend *bk, int precision, int batch, int micro, int steps,
                     int eager, float scale, struct graph_run *r)
{
    struct unet_config c;
    config(&c);
    c.image_size = 8; /* the attention at 8x8 still: level 0 */
    struct accum a;
    struct plan_opts po = precision ? accum_half_opts(precision) : (struct plan_opts){0};
    if (precision == STRATEGY_PRECISION_F16) {
        po.strategy.loss_scale.initial = scale;
        po.strategy.loss_scale.growth_interval = 2;
        po.strategy.loss_scale.backoff = 1.0f / 65536;
    }
    memset(r, 0, sizeof *r);
    struct exec_opts eo = {.threads = 2, .eager = eager};
    int rc = accum_plan(&a, bk, &c, batch, micro, &po) || accum_start(&a, bk, &eo);
    struct emu_graph_stats g0 = gstats();
    for (int s = 0; s < steps && !rc; s++) {
        const long l0 = gstats().eager_launches;
        rc = graph_step(&a, s);
        r->eager_last = gstats().eager_launches - l0;
    }
    if (!rc) rc = exec_step_log(a.e, r->log, 8, &r->nlog);
    if (!rc) {
        r->ls = *exec_loss_scaler(a.e);
        r->state = accum_state(&a, &r->n);
        struct emu_graph_stats g1 = gstats();
        r->gs.captures = g1.captures - g0.captures;
        r->gs.instantiated = g1.instantiated - g0.instantiated;
        r->gs.launches = g1.launches - g0.launches;
        r->gs.invalidated = g1.invalidated - g0.invalidated;
    }
    if (rc) fprintf(stderr, "graph run: %s\n", a.e ? exec_last_error(a.e)->msg : "no executor");
    accum_free(&a);
    return rc;
}

/* graphs against eager steps, both on the device: bit for bit (parity mode); the log against the
 * CPU backend's host-side optimizer, loss scaling and clipping */
static void graphs_equal(const char *name, int precision, int batch, int micro, float scale)
{
    const int steps = 3; /* as it comes, captured, replayed */
    struct graph_run ge, gg, gc;
    int rc1 = graph_run(G, precision, batch, micro, steps, 1, scale, &ge);
    int rc2 = graph_run(G, precision, batch, micro, steps, 0, scale, &gg);
    int rc3 = graph_run(backend_cpu(), precision, batch, micro, steps, 0, scale, &gc);
    CHECK(rc1 == 0 && rc2 == 0 && rc3 == 0, "%s: the runs: eager %d, graphs %d, cpu %d", name,
          rc1, rc2, rc3);
    if (rc1 || rc2 || rc3) goto out;
    size_t diff = 0;
    for (size_t k = 0; k < ge.n && ge.n == gg.n; k++) diff += memcmp(&ge.state[k], &gg.state[k], 4) != 0;
    CHECK(ge.n == gg.n && diff == 0, "%s: %zu of %zu state floats differ between the captured "
          "steps and the eager ones", name, diff, ge.n);
    CHECK(ge.nlog == steps && gg.nlog == steps && gc.nlog == steps &&
              memcmp(ge.log, gg.log, sizeof ge.log) == 0 &&
              memcmp(&ge.ls, &gg.ls, sizeof ge.ls) == 0,
          "%s: the step logs differ (%d, %d steps), or the loss scales (%g/%lld, %g/%lld)", name,
          ge.nlog, gg.nlog, (double)ge.ls.scale, (long long)ge.ls.skipped, (double)gg.ls.scale,
          (long long)gg.ls.skipped);
    int skipped = 0;
    for (int s = 0; s < steps && gc.nlog == steps && gg.nlog == steps; s++) {
        const struct exec_step_stats *d = &gg.log[s], *h = &gc.log[s];
        skipped += !d->applied;
        printf("  %s step %d: loss %.7g (cpu %.7g), norm %.6g (cpu %.6g), scale %g (cpu %g)%s\n",
               name, s, d->loss, h->loss, d->grad_norm, h->grad_norm, (double)d->loss_scale,
               (double)h->loss_scale, d->applied ? "" : ", skipped");
        /* 16-bit steps differ from the CPU's by rounding flips; the decisions do not */
        const double tl = precision ? 2e-2 : 1e-4;
        CHECK(d->applied == h->applied && d->loss_scale == h->loss_scale,
              "%s step %d: applied %d, scale %g on the device; %d, %g on the CPU", name, s,
              d->applied, (double)d->loss_scale, h->applied, (double)h->loss_scale);
        CHECK(!d->applied || (fabs((double)d->loss - h->loss) <= tl * fabs((double)h->loss) &&
                              fabs((double)d->grad_norm - h->grad_norm) <=
                                  10 * tl * fabs((double)h->grad_norm)),
              "%s step %d: loss %.7g / norm %.6g against the CPU's %.7g / %.6g", name, s,
              d->loss, d->grad_norm, h->loss, h->grad_norm);
    }
    if (precision == STRATEGY_PRECISION_F16)
        CHECK(skipped > 0 && skipped < steps, "%s: %d of %d steps skipped (want some, not all)",
              name, skipped, steps);
    if (emu_gstats) {
        /* a kind of work per micro-batch executor and the optimizer; each captured once, the
         * last step launched from its graphs only: its eager kernels are the step_set ones,
         * one per micro-batch and one for the optimizer step */
        const long mb = (batch + micro - 1) / micro, kinds = (mb > 1 ? 2 : 1) + 1;
        CHECK(gg.gs.captures == kinds && gg.gs.instantiated == kinds && !gg.gs.invalidated &&
                  gg.gs.launches >= (steps - 1) * (mb + 1) - (kinds - 1),
              "%s: %ld captures, %ld graphs, %ld launches, %ld invalidated (%ld kinds of work)",
              name, gg.gs.captures, gg.gs.instantiated, gg.gs.launches, gg.gs.invalidated, kinds);
        CHECK(gg.eager_last == mb + 1 && ge.eager_last > 10 * (mb + 1) && ge.gs.captures == 0,
              "%s: the last step launched %ld kernels itself with graphs (want %ld: the step's "
              "scalars), %ld without, %ld captures without", name, gg.eager_last, mb + 1,
              ge.eager_last, ge.gs.captures);
        printf("%s: %ld captures replayed %ld times; the last step's own launches %ld (eager "
               "%ld)\n", name, gg.gs.captures, gg.gs.launches, gg.eager_last, ge.eager_last);
    }
out:
    free(ge.state);
    free(gg.state);
    free(gc.state);
}

/* A sampling step's model (an inference plan's exec_forward) captured and replayed: the same
 * outputs as run as it comes, three forwards with new inputs; under the emulator the last one
 * launches nothing itself */
static void forward_graphs(void)
{
    struct unet_config c;
    config(&c);
    c.image_size = 8;
    enum { B = 2, RUNS = 3 };
    float *out[2][RUNS] = {{0}};
    long last[2] = {0, 0}, caps[2] = {0, 0};
    size_t n = 0;
    for (int eager = 0; eager < 2; eager++) {
        struct graph g;
        struct unet_io io;
        struct plan p;
        struct exec *e = NULL;
        struct exec_opts eo = {.threads = 1, .eager = eager};
        graph_init(&g);
        int rc = unet_build(&g, &c, B, &io) || plan_make(&p, &g, G, NULL) ||
                 exec_init(&e, &g, &p, G, &eo);
        CHECK(rc == 0, "forward graphs: the inference plan (eager %d)", eager);
        if (rc) return;
        accum_weights(e, &g);
        n = g.tensors[io.x]->numel;
        float *x = malloc(n * sizeof *x), t[B];
        const long c0 = gstats().captures;
        for (int r = 0; r < RUNS && !rc; r++) {
            for (size_t k = 0; k < n; k++)
                x[k] = philox_normal(5, PHILOX_TAG_SAMPLER, (uint64_t)r, 0, 0, (uint32_t)k);
            for (int i = 0; i < B; i++) t[i] = (float)(999 - 333 * r - i);
            out[eager][r] = malloc(n * sizeof(float));
            const long l0 = gstats().eager_launches;
            rc = exec_upload(e, io.x, x) || exec_upload(e, io.t, t) || exec_forward(e, NULL) ||
                 exec_download(e, io.out, out[eager][r]);
            last[eager] = gstats().eager_launches - l0;
        }
        caps[eager] = gstats().captures - c0;
        CHECK(rc == 0, "forward graphs: the forwards (eager %d): %s", eager,
              exec_last_error(e)->msg);
        free(x);
        exec_free(e);
        plan_free(&p);
        graph_free(&g);
    }
    int same = 1;
    for (int r = 0; r < RUNS; r++)
        same &= out[0][r] && out[1][r] && memcmp(out[0][r], out[1][r], n * sizeof(float)) == 0;
    CHECK(same, "forward graphs: a replayed forward's output differs from the eager one's");
    if (emu_gstats)
        CHECK(caps[0] == 1 && caps[1] == 0 && last[0] == 0 && last[1] > 10,
              "forward graphs: %ld captures (eager: %ld); the last forward launched %ld kernels "
              "itself (eager: %ld)", caps[0], caps[1], last[0], last[1]);
    printf("forward graphs: %d forwards %s the eager ones; the last launched %ld kernels itself "
           "(eager %ld)\n", RUNS, same ? "bit-identical to" : "DIFFERENT from", last[0], last[1]);
    for (int r = 0; r < RUNS; r++) {
        free(out[0][r]);
        free(out[1][r]);
    }
}

static int have_nvidia_device(void)
{
    struct stat st;
    return stat("/dev/nvidia0", &st) == 0 || stat("/proc/driver/nvidia/gpus", &st) == 0;
}

int main(void)
{
    char err[512] = "";
    if (backend_load("cuda", &G, err, sizeof err) != BK_OK) {
        if (have_nvidia_device() && !strstr(err, "no CUDA device")) {
            fprintf(stderr, "test_gpu_rt: an NVIDIA device is present but: %s\n", err);
            return 1;
        }
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 77;
    }
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (h) emu_stats = (ddpmd_emu_get_stats_fn)(uintptr_t)dlsym(h, "ddpmd_emu_get_stats");
    if (h) emu_gstats = (ddpmd_emu_graph_stats_fn)(uintptr_t)dlsym(h, "ddpmd_emu_graph_stats");
    printf("device: %s\n", emu_stats ? "the CUDA emulator (bit-identical offload, its counts)"
                                     : "a GPU (offload within 1e-5)");
    budget();
    /* one micro-batch; two steps: the second forward reads the weights the first's optimizer
     * sent back on the copy stream */
    offload_equal(2, 2, 2, 0);
    /* 2 + 1: the second micro-batch accumulates into what the first's copies still read; the
     * uneven one's executor copies into the host's block */
    offload_equal(3, 2, 1, 0);
    /* bf16: the 16-bit working copy refreshed from the weights the copy stream sent back */
    offload_equal(2, 2, 2, STRATEGY_PRECISION_BF16);
    /* graphs: an uneven micro-batch (its own executor's capture), bf16, f16 whose first steps
     * overflow (skipped, the scale backed off on the device) */
    graphs_equal("graphs f32 b3/2", 0, 3, 2, 0);
    graphs_equal("graphs bf16 b2", STRATEGY_PRECISION_BF16, 2, 2, 0);
    graphs_equal("graphs f16 b2", STRATEGY_PRECISION_F16, 2, 2, 1073741824.0f);
    forward_graphs();
    /* no capture above was refused (each fell back to running as it comes, so only this tells):
     * every library call had run once before its capture - the emulator refuses a cuDNN engine
     * loaded inside one (seen failing with the first run captured and DDPMD_CUDA_WARM=0) */
    CHECK(!emu_gstats || gstats().invalidated == 0,
          "%ld captures of the steps above were refused (see above)", gstats().invalidated);
    if (h) {
        ddpmd_emu_capture_selfcheck_fn self =
            (ddpmd_emu_capture_selfcheck_fn)(uintptr_t)dlsym(h, "ddpmd_emu_capture_selfcheck");
        CHECK(self && self() == 0, "the emulator's capture missed planted misuses (see above)");
    }
    CHECK(!G->device_poisoned(0), "the device is poisoned");
    if (h) dlclose(h);
    return tu_finish("test_gpu_rt");
}
