/* step_time.c - a quick timing of one training step (forward, backward, AdamW, EMA) per preset at
 * its default size: the CUDA backend against this build's CPU backend, same graph and executor.
 * The first GPU step (cuDNN's algorithm search) is a warm-up, then the median of a few; the CPU
 * gets one warm-up and one timed step. Prints a table (tests/gpu/check.sh). Not a test.
 *   step_time [--batch-ddpm N] [--batch-seed N] [--gpu-steps N] [--threads N] [--no-cpu]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend_load.h"
#include "exec.h"
#include "init.h"
#include "philox.h"
#include "plan.h"
#include "unet.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct result {
    double step_s;      /* median of the timed steps */
    double first_s;     /* the first step */
    float loss;
    size_t plan_bytes;
    size_t params;
};

/* warmup + steps training steps of the preset on bk; 0 on success */
static int run(const struct backend *bk, enum unet_preset preset, int batch, int warmup, int steps,
               int threads, struct result *r)
{
    struct unet_config c;
    unet_config_default(&c, preset);
    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e = NULL;
    int rc = 1;
    graph_init(&g);
    int target, loss;
    if (unet_build_training(&g, &c, batch, &io, &target, &loss) || plan_make(&p, &g, bk, NULL))
        goto out_graph;
    struct exec_opts eo = {.threads = threads};
    if (exec_init(&e, &g, &p, bk, &eo)) {
        fprintf(stderr, "step_time: %s: cannot reserve %zu bytes\n", bk->name, p.total_bytes);
        goto out_plan;
    }
    size_t maxn = 0;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->numel > maxn) maxn = g.tensors[i]->numel;
    float *h = malloc(maxn * sizeof *h);
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(g.tensors[i], 42, h);
            exec_upload(e, i, h);
        }
    free(h);
    exec_reset_state(e);
    size_t nx = g.tensors[io.x]->numel;
    float *x = malloc(nx * sizeof *x), *y = malloc(nx * sizeof *y), *t = malloc(batch * sizeof *t);
    for (size_t i = 0; i < nx; i++) {
        x[i] = philox_normal(1, PHILOX_TAG_NOISE, 0, 0, 0, (uint32_t)i);
        y[i] = philox_normal(1, PHILOX_TAG_NOISE, 0, 1, 0, (uint32_t)i);
    }
    for (int i = 0; i < batch; i++) t[i] = (float)((i * 377 + 11) % 1000);
    exec_upload(e, io.x, x);
    exec_upload(e, io.t, t);
    exec_upload(e, target, y);
    free(x);
    free(y);
    free(t);
    struct optim_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .clip = 1.0f, .ema_decay = 0.9999f};
    double dt[64];
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = now();
        float l = 0.0f, probe;
        int sr = exec_forward_backward(e, 1, 1.0f, 7, (uint64_t)s, 0, &l);
        if (!sr) sr = exec_optimizer_step(e, &oc, s + 1, oc.lr, NULL);
        /* one stream: a download after the step waits for all of it (AdamW and EMA too) */
        if (!sr) sr = exec_download(e, loss, &probe);
        if (s == 0) r->loss = l;
        double t1 = now();
        if (sr) {
            fprintf(stderr, "step_time: %s step %d failed (%d)\n", bk->name, s, sr);
            goto out_exec;
        }
        if (s == 0) r->first_s = t1 - t0;
        if (s >= warmup) dt[s - warmup] = t1 - t0;
    }
    qsort(dt, (size_t)steps, sizeof *dt, cmp_double);
    r->step_s = dt[steps / 2];
    r->plan_bytes = p.total_bytes;
    r->params = g.param_numel;
    rc = 0;
out_exec:
    exec_free(e);
out_plan:
    plan_free(&p);
out_graph:
    graph_free(&g);
    return rc;
}

int main(int argc, char **argv)
{
    int batch[2] = {32, 8}, gpu_steps = 5, threads = (int)sysconf(_SC_NPROCESSORS_ONLN), cpu = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch-ddpm") && i + 1 < argc) batch[0] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch-seed") && i + 1 < argc) batch[1] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gpu-steps") && i + 1 < argc) gpu_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-cpu")) cpu = 0;
        else {
            fprintf(stderr, "usage: step_time [--batch-ddpm N] [--batch-seed N] [--gpu-steps N] "
                            "[--threads N] [--no-cpu]\n");
            return 2;
        }
    }
    if (gpu_steps < 1 || gpu_steps > 60) gpu_steps = 5;
    if (threads < 1) threads = 1;
    const struct backend *gpu = NULL;
    char err[512];
    if (backend_load("cuda", &gpu, err, sizeof err)) {
        fprintf(stderr, "step_time: %s\n", err);
        return 77;
    }
    struct bk_device_mem dm;
    if (gpu->device_mem && gpu->device_mem(0, &dm) == 0)
        printf("GPU: %s (sm_%d%d), %.1f GiB; the process holds %.0f MiB after the warm-up\n",
               dm.name, dm.cc_major, dm.cc_minor, (double)dm.total / 1073741824.0,
               (double)dm.process / 1048576.0);
    printf("CPU: %d threads\n\n", threads);
    printf("%-6s %5s %6s %10s %9s %10s %10s %10s %8s %12s\n", "preset", "image", "batch", "params",
           "plan MiB", "GPU s/step", "GPU first", "CPU s/step", "speedup", "step-1 loss GPU/CPU");
    int fails = 0;
    for (int k = 0; k < 2; k++) {
        enum unet_preset pr = k ? UNET_SEED : UNET_DDPM;
        struct unet_config c;
        unet_config_default(&c, pr);
        struct result rg = {0}, rcpu = {0};
        int eg = run(gpu, pr, batch[k], 1, gpu_steps, 1, &rg);
        int ec = cpu ? run(backend_cpu(), pr, batch[k], 1, 1, threads, &rcpu) : 1;
        fails += eg != 0;
        printf("%-6s %5d %6d %10zu %9.0f ", k ? "seed" : "ddpm", c.image_size, batch[k],
               eg ? rcpu.params : rg.params, (double)rg.plan_bytes / 1048576.0);
        if (eg) printf("%10s %10s ", "failed", "-");
        else printf("%10.4f %10.3f ", rg.step_s, rg.first_s);
        if (ec) printf("%10s %8s ", "-", "-");
        else printf("%10.3f %7.1fx ", rcpu.step_s, eg ? 0.0 : rcpu.step_s / rg.step_s);
        if (!eg && !ec) printf("%.5g/%.5g", rg.loss, rcpu.loss);
        printf("\n");
        fflush(stdout);
    }
    return fails ? 1 : 0;
}
