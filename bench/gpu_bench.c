/* gpu_bench.c - the ddpmd side of the GPU training-step benchmark (bench/gpu.sh, tests/gpu/check.sh;
 * not a test): the model of a spec file (one of examples/) at a batch and precision on a device,
 * timed over whole steps (inputs uploaded once; forward, backward, clipping, AdamW, EMA), with the
 * plan's bytes and what the device itself says the run took (device_mem before and after the
 * reservation: cudaMemGetInfo). Prints `key value` lines as bench/torch_gpu_step.py does.
 *   gpu_bench SPEC.json [--device cuda:0] [--batch N] [--precision f32|bf16|f16]
 *             [--steps N] [--warmup N] [--threads N] [--deterministic] [--eager]
 * --deterministic: parity mode (no TF32, deterministic algorithms; default fast mode);
 * --eager: no CUDA graphs (every kernel launched by the host; default: each step captured once
 * and replayed). The timed steps read neither loss nor norm (no host wait inside a step).
 * Exit 3 with "unavailable REASON" when the precision cannot run on the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_load.h"
#include "bench_exec.h"
#include "ddpm.h"
#include "exec.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "spec.h"
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

static int usage(void)
{
    fprintf(stderr, "usage: gpu_bench SPEC.json [--device cuda:0] [--batch N] "
                    "[--precision f32|bf16|f16] [--steps N] [--warmup N] [--threads N] "
                    "[--deterministic] [--eager]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *spec_path = NULL, *device = "cuda:0", *prec = "f32";
    int batch = 0, steps = 10, warmup = 3, threads = 4, deterministic = 0, eager = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) device = argv[++i];
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--precision") && v) prec = argv[++i];
        else if (!strcmp(a, "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--deterministic")) deterministic = 1;
        else if (!strcmp(a, "--eager")) eager = 1;
        else if (a[0] != '-' && !spec_path) spec_path = a;
        else return usage();
    }
    int precision = !strcmp(prec, "f32")    ? STRATEGY_PRECISION_F32
                    : !strcmp(prec, "bf16") ? STRATEGY_PRECISION_BF16
                    : !strcmp(prec, "f16")  ? STRATEGY_PRECISION_F16
                                            : -2;
    if (!spec_path || steps < 1 || warmup < 0 || batch < 0 || threads < 1 || precision == -2)
        return usage();

    struct train_spec spec;
    struct spec_errors se;
    if (spec_load_file(spec_path, &spec, &se)) {
        for (int i = 0; i < se.n; i++) fprintf(stderr, "%s: %s\n", se.e[i].path, se.e[i].msg);
        return 2;
    }
    if (batch) spec.batch = batch;
    char err[512];
    const struct backend *bk = NULL;
    if (backend_load(device, &bk, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: --device %s: %s\n", device, err);
        return 1;
    }
    int dev = backend_device_index(device);
    if (backend_supports(bk, BK_OP_set_parity, BK_DTYPE_F32))
        bk->set_parity(deterministic); /* before planning: workspace sizes */
    struct bk_device_mem m0 = {0}, m1 = {0};
    const int have_mem = backend_supports(bk, BK_OP_device_mem, BK_DTYPE_F32) && dev >= 0 &&
                         bk->device_mem(dev, &m0) == 0;

    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e;
    int target;
    int brc = bench_exec_plain("gpu_bench", &spec, precision, prec, bk, device, threads, eager, &g,
                               &io, &target, &p, &e);
    if (brc) return brc;
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

    /* one batch x_t, t, noise, uploaded once: the timed steps are the device's work */
    size_t nx = g.tensors[io.x]->numel, per = nx / (size_t)spec.batch;
    float *x0 = malloc(nx * sizeof *x0), *xt = malloc(nx * sizeof *xt), *eps = malloc(nx * sizeof *eps);
    float *t = malloc((size_t)spec.batch * sizeof *t);
    int *ti = malloc((size_t)spec.batch * sizeof *ti);
    struct ddpm_schedule sch;
    for (size_t i = 0; i < nx; i++) {
        x0[i] = philox_normal(1, PHILOX_TAG_NOISE, 0, 0, 0, (uint32_t)i);
        eps[i] = philox_normal(7, PHILOX_TAG_NOISE, 0, 1, 0, (uint32_t)i);
    }
    for (int i = 0; i < spec.batch; i++) {
        ti[i] = (int)(philox_u32_at(7, PHILOX_TAG_TIMESTEP, 0, (uint32_t)i, 0, 0) % 1000u);
        t[i] = (float)ti[i];
    }
    if (ddpm_schedule_init(&sch, 1000, DDPM_BETA_LINEAR, 1e-4, 0.02)) return 1;
    ddpm_q_sample(xt, x0, eps, ti, spec.batch, per, &sch);
    if (exec_upload(e, io.x, xt) || exec_upload(e, io.t, t) || exec_upload(e, target, eps)) {
        fprintf(stderr, "gpu_bench: upload: %s\n", exec_last_error(e)->msg);
        return 1;
    }
    double *dt = calloc((size_t)steps, sizeof *dt), t_all = 0;
    float l = 0, first = 0, norm = 0;
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = now();
        if (s == warmup) t_all = t0;
        int rc = exec_forward_backward(e, 1, 1.0f, 7, (uint64_t)s, 0, s == 0 ? &first : NULL);
        if (!rc) rc = exec_optimizer_step(e, &spec.optim, s + 1, spec.optim.lr, NULL);
        if (rc) {
            fprintf(stderr, "gpu_bench: step %d: %s\n", s, exec_last_error(e)->msg);
            return 1;
        }
        if (s >= warmup) dt[s - warmup] = now() - t0;
    }
    /* the steps' losses and norms, read once at the end (the device's step log) */
    struct exec_step_stats rec[EXEC_STEP_LOG];
    int nrec = 0;
    if (exec_step_log(e, rec, EXEC_STEP_LOG, &nrec) == 0 && nrec > 0) {
        l = rec[nrec - 1].loss;
        norm = rec[nrec - 1].grad_norm;
    }
    /* the last AdamW done: a download waits for the stream */
    float w0 = 0;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            exec_download(e, i, h = malloc(g.tensors[i]->numel * sizeof *h));
            w0 = h[0];
            free(h);
            break;
        }
    t_all = now() - t_all;
    const int have_mem1 = have_mem && bk->device_mem(dev, &m1) == 0;
    qsort(dt, (size_t)steps, sizeof *dt, cmp_double);
    double med = steps % 2 ? dt[steps / 2] : 0.5 * (dt[steps / 2 - 1] + dt[steps / 2]);
    printf("engine ddpmd\nspec %s\ndevice %s\nprecision %s\nbatch %d\nparams %zu\n", spec_path,
           device, prec, spec.batch, g.param_numel);
    printf("mode %s\ngraphs %s\n", deterministic ? "parity" : "fast", eager ? "off" : "on");
    if (have_mem) printf("device_name %s\n", m0.name);
    /* which kernels took the 16-bit operands natively (0: fp32 kernels on converted scratch) */
    const int hdt = precision == STRATEGY_PRECISION_BF16 ? BK_DTYPE_BF16 : BK_DTYPE_F16;
    printf("half_kernels %u\n",
           precision != STRATEGY_PRECISION_F32 &&
                   backend_supports(bk, BK_OP_half_kernels, BK_DTYPE_F32)
               ? bk->half_kernels(hdt)
               : 0u);
    /* the host waits only after the last step: step_ms_mean is the device's pace; host_ms_* the
     * host's time to hand over one step (where the device runs behind, the host waits in the
     * launches once the device's queue is full) */
    printf("steps %d\nwarmup %d\nstep_ms_mean %.3f\nhost_ms_median %.3f\nhost_ms_min %.3f\n",
           steps, warmup, 1e3 * t_all / steps, 1e3 * med, 1e3 * dt[0]);
    printf("images_per_s %.3f\n", spec.batch * steps / t_all);
    printf("plan_bytes %zu\nworkspace_bytes %zu\narena_bytes %zu\n", p.total_bytes, p.ws_bytes,
           p.arena_bytes);
    if (have_mem1) {
        /* what the device lost to the run: the reservation (rounded by the driver) and anything
         * a library took beside it; what the process holds besides its reservation before and
         * after (context, handles, the kernels it loaded: the backend measures it live) */
        printf("device_used_bytes %zu\nprocess_bytes_start %zu\nprocess_bytes %zu\n",
               m0.free - m1.free, m0.process, m1.process);
    }
    printf("loss_first %.9g\nloss_last %.9g\ngrad_norm_last %.6g\nweight0 %.9g\n", first, l, norm,
           w0);
    free(dt);
    free(x0);
    free(xt);
    free(eps);
    free(t);
    free(ti);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    return 0;
}
