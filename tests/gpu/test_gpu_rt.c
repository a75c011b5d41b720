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
 * checks every device byte range across the two streams. Without a device: "SKIPPED", exit 77.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend_load.h"
#include "emu/emu_stats.h"
#include "test_accum.h"
#include "test_unet_util.h"

#define GRANULE ((size_t)2 << 20) /* the emulator's (and the driver's) allocation granularity */

static const struct backend *G;
static ddpmd_emu_get_stats_fn emu_stats; /* NULL on a GPU */

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
    CHECK(!G->device_poisoned(0), "the device is poisoned");
    if (h) dlclose(h);
    return tu_finish("test_gpu_rt");
}
