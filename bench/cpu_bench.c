/* cpu_bench.c - CPU training-step benchmark of ddpmd (not a test): one config per process, so
 * that the peak RSS is that config's; or the machine's ceilings (a large SGEMM and a 3x3 conv
 * forward + backward through the CPU backend, i.e. oneDNN). A step is what `ddpmd train` does:
 * draw t and the noise, x_t = q_sample(x0, t, noise), forward, MSE against the noise, backward,
 * clip, AdamW, EMA. Prints `key value` lines that bench/cpu.sh gathers into a table; --profile
 * adds a per-op profile of the measured steps.
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "ddpm.h"
#include "cost.h"
#include "exec.h"
#include "half.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "planner.h"
#include "unet.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a shared machine a kernel's CPU time moves
 * less than its wall time */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_now_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static long rss_peak_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the configs of bench/cpu.sh: four ddpm presets at 32x32 and the seed preset at 64x64
 * (examples/seed-64.json); names as in bench/torch_step.py */
static int config_by_name(struct unet_config *c, const char *name)
{
    if (!strcmp(name, "seed-64")) {
        unet_config_default(c, UNET_SEED);
        return 0;
    }
    unet_config_default(c, UNET_DDPM);
    if (!strcmp(name, "ddpm-cifar10")) return 0;
    if (!strcmp(name, "fmnist-tiny")) {
        c->in_channels = c->out_channels = 1;
        c->n_levels = 3;
        c->channels[0] = 32;
        c->channels[1] = c->channels[2] = 64;
        c->layers_per_block = 1;
        c->attn_res[0] = 8;
        c->groups = 8;
        return 0;
    }
    if (!strcmp(name, "cifar-small")) {
        c->n_levels = 4;
        c->channels[0] = 64;
        c->channels[1] = c->channels[2] = c->channels[3] = 128;
        c->layers_per_block = 2;
        c->attn_res[0] = 16;
        return 0;
    }
    return -1;
}

static void fill_normal(float *x, size_t n, uint64_t seed, uint64_t s, uint32_t stream)
{
    for (size_t i = 0; i < n; i++) x[i] = philox_normal(seed, PHILOX_TAG_NOISE, s, stream, 0, (uint32_t)i);
}

/* --half-kernels MASK: the CPU backend with these enum bk_half bits for bf16, whatever
 * cpu_half_kernels would choose (to measure each kernel's 16-bit path against the other) */
static unsigned forced_mask;
static unsigned forced_half(int dtype) { return dtype == BK_DTYPE_BF16 ? forced_mask : 0; }

/* idx[0 .. m) by sec[idx[i]], slowest first (a profile's few hundred ops) */
static void sort_by_seconds(int *idx, int m, const double *sec)
{
    for (int i = 0; i < m; i++)
        for (int j = i + 1; j < m; j++)
            if (sec[idx[j]] > sec[idx[i]]) {
                int tmp = idx[i];
                idx[i] = idx[j];
                idx[j] = tmp;
            }
}

static int run_config(const char *name, int batch, int micro, int warmup, int steps, int threads,
                      int profile, int precision, int force_half)
{
    struct backend forced = *backend_cpu();
    forced.half_kernels = forced_half;
    const struct backend *bk = force_half ? &forced : backend_cpu();
    struct unet_config c;
    if (config_by_name(&c, name)) {
        fprintf(stderr, "cpu_bench: unknown config %s\n", name);
        return 2;
    }
    long rss0 = rss_now_kib();
    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e = NULL;
    graph_init(&g);
    int target;
    if (unet_build_training(&g, &c, micro, &io, &target, NULL) ||
        graph_set_precision(&g, precision))
        return fprintf(stderr, "cannot build the training graph: %s\n", g.err), 1;
    /* as a job plans it: the gradients in the arena unless micro-batches accumulate */
    struct plan_opts po = {.strategy = strategy_plain(micro), .one_pass = micro == batch};
    po.strategy.precision = precision;
    if (plan_make(&p, &g, bk, &po)) return fprintf(stderr, "plan_make failed\n"), 1;
    long rss_graph = rss_now_kib();
    struct exec_opts eo = {.threads = threads, .profile = profile};
    if (exec_init(&e, &g, &p, bk, &eo)) return fprintf(stderr, "exec_init failed\n"), 1;

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

    /* x0: a fixed batch; t, noise and x_t are drawn per step as server/train.c does */
    size_t per = g.tensors[io.x]->numel / (size_t)micro, nx = per * (size_t)batch;
    float *x0 = malloc(nx * sizeof *x0), *xt = malloc(nx * sizeof *xt), *eps = malloc(nx * sizeof *eps);
    float *t = malloc(batch * sizeof *t);
    int *ti = malloc(batch * sizeof *ti);
    fill_normal(x0, nx, 1, 0, 0);
    struct ddpm_schedule sch;
    if (ddpm_schedule_init(&sch, 1000, DDPM_BETA_LINEAR, 1e-4, 0.02))
        return fprintf(stderr, "ddpm_schedule_init failed\n"), 1;

    struct optim_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.0f, .clip = 1.0f, .ema_decay = 0.9999f};
    double *dt = calloc((size_t)steps, sizeof *dt), *dc = calloc((size_t)steps, sizeof *dc);
    float l = 0.0f, first_loss = 0.0f;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) exec_profile_reset(e);
        double t0 = now(), c0 = cpu_now();
        for (int i = 0; i < batch; i++) {
            ti[i] = (int)(philox_u32_at(7, PHILOX_TAG_TIMESTEP, (uint64_t)s, (uint32_t)i, 0, 0) % 1000u);
            t[i] = (float)ti[i];
        }
        fill_normal(eps, nx, 7, (uint64_t)s, 0);
        ddpm_q_sample(xt, x0, eps, ti, batch, per, &sch);
        /* the effective batch in micro-batches of `micro`, gradients accumulated (as
         * engine/train_step.c runs them); the loss is the micro-batches' weighted mean */
        int rc = 0;
        float lsum = 0.0f;
        for (int i0 = 0; !rc && i0 < batch; i0 += micro) {
            const float w = (float)micro / (float)batch;
            float lm = 0.0f;
            rc = exec_upload(e, io.x, xt + (size_t)i0 * per) || exec_upload(e, io.t, t + i0) ||
                 exec_upload(e, target, eps + (size_t)i0 * per);
            if (!rc) rc = exec_forward_backward(e, i0 == 0, w, 7, (uint64_t)s, i0, &lm);
            lsum += w * lm;
        }
        l = lsum;
        if (!rc) rc = exec_optimizer_step(e, &oc, s + 1, oc.lr, NULL);
        double t1 = now(), c1 = cpu_now();
        if (rc) return fprintf(stderr, "step %d failed: %d\n", s, rc), 1;
        if (s == 0) first_loss = l;
        if (s >= warmup) {
            dt[s - warmup] = t1 - t0;
            dc[s - warmup] = c1 - c0;
        }
    }
    double flops = 0.0;
    for (int k = 0; k < g.n_ops; k++) flops += cost_op_flops(&g.ops[k]);
    const double mult = (double)(batch / micro); /* the graph is one micro-batch's */
    flops *= mult;
    double *sorted = malloc((size_t)steps * sizeof *sorted);
    memcpy(sorted, dt, (size_t)steps * sizeof *sorted);
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp_double);
    double med = steps % 2 ? sorted[steps / 2] : 0.5 * (sorted[steps / 2 - 1] + sorted[steps / 2]);
    qsort(dc, (size_t)steps, sizeof *dc, cmp_double);
    double cmed = steps % 2 ? dc[steps / 2] : 0.5 * (dc[steps / 2 - 1] + dc[steps / 2]);

    /* a checksum of the weights after the run: equal bits at equal thread counts */
    uint64_t sum = 1469598103934665603ull;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            const unsigned char *b = (const unsigned char *)exec_tensor(e, i);
            for (size_t k = 0; k < g.tensors[i]->numel * 4; k++) sum = (sum ^ b[k]) * 1099511628211ull;
        }

    long peak = rss_peak_kib();
    printf("engine ddpmd\nconfig %s\nbatch %d\nmicro_batch %d\nthreads %d\nparams %zu\n", name,
           batch, micro, threads, g.param_numel);
    printf("mode %s\nprecision %s\nhalf_ops %d\nconversions %d\n", cpu_parity_now() ? "parity" : "fast", planner_precision_name(precision),
           p.n_half_ops, p.n_cvt);
    printf("steps %d\nwarmup %d\nstep_ms_median %.3f\nstep_ms_min %.3f\nstep_ms_max %.3f\n", steps,
           warmup, 1e3 * med, 1e3 * sorted[0], 1e3 * sorted[steps - 1]);
    printf("images_per_s %.3f\n", batch / med);
    /* CPU seconds of all threads per step: what the step costs when the machine is shared */
    printf("step_cpu_s_median %.3f\n", cmed);
    printf("gflop_per_step %.4f\ngflops %.3f\n", 1e-9 * flops, 1e-9 * flops / med);
    printf("plan_bytes %zu\nws_bytes %zu\narena_bytes %zu\n", p.total_bytes, p.ws_bytes, p.arena_bytes);
    printf("rss_start_kib %ld\nrss_graph_kib %ld\npeak_rss_kib %ld\n", rss0, rss_graph, peak);
    printf("overhead_kib %ld\n", peak - (long)(p.total_bytes / 1024));
    printf("loss_first %.9g\nloss_last %.9g\nweights_fnv %016llx\n", first_loss, l,
           (unsigned long long)sum);

    const struct exec_profile *pr = exec_get_profile(e);
    if (pr) {
        double per = 1.0 / steps, total = 0.0;
        for (int ty = 0; ty < OP_COUNT; ty++) total += pr->seconds[ty];
        total += pr->optim_seconds + pr->zero_seconds;
        printf("# profile: mean ms per step over %d steps (sum of ops %.1f ms, step median %.1f ms)\n",
               steps, 1e3 * total * per, 1e3 * med);
        /* op types by time */
        int order[OP_COUNT];
        for (int i = 0; i < OP_COUNT; i++) order[i] = i;
        for (int i = 0; i < OP_COUNT; i++)
            for (int j = i + 1; j < OP_COUNT; j++)
                if (pr->seconds[order[j]] > pr->seconds[order[i]]) {
                    int tmp = order[i];
                    order[i] = order[j];
                    order[j] = tmp;
                }
        double fl_type[OP_COUNT] = {0};
        for (int k = 0; k < g.n_ops; k++) fl_type[g.ops[k].type] += mult * cost_op_flops(&g.ops[k]);
        /* elements the executor converts per step around each op type (in and back out:
         * 16-bit operands of fp32 kernels, fp32 operands of 16-bit ones; plan.cvt) */
        double cvt_type[OP_COUNT] = {0};
        for (int k = 0; k < p.n_run_ops; k++)
            for (int i = p.cvt_start[k]; i < p.cvt_start[k + 1]; i++)
                cvt_type[plan_op(&p, &g, k)->type] +=
                    (double)plan_tensor(&p, &g, p.cvt[i].tensor)->numel *
                    (p.cvt[i].load + p.cvt[i].store);
        printf("# %-22s %9s %6s %6s %9s %9s\n", "op", "ms/step", "share", "calls", "Mcvt", "GFLOP/s");
        for (int i = 0; i < OP_COUNT; i++) {
            int ty = order[i];
            if (pr->calls[ty] == 0) continue;
            double sec = pr->seconds[ty] * per;
            printf("# %-22s %9.2f %5.1f%% %6ld %9.1f", op_name(ty), 1e3 * sec,
                   100.0 * pr->seconds[ty] / total, pr->calls[ty] / steps, 1e-6 * cvt_type[ty]);
            if (fl_type[ty] > 0) printf(" %9.1f", 1e-9 * fl_type[ty] / sec);
            printf("\n");
        }
        printf("# %-22s %9.2f %5.1f%% %6d\n", "optimizer (clip,adamw,ema)", 1e3 * pr->optim_seconds * per,
               100.0 * pr->optim_seconds / total, 1);
        printf("# %-22s %9.2f %5.1f%%\n", "zeroing the gradients", 1e3 * pr->zero_seconds * per,
               100.0 * pr->zero_seconds / total);
        /* the ten slowest convolution ops, with their shapes */
        printf("# slowest conv ops: ms/step GFLOP/s kind N Ci HxW -> Co HoxWo k stride\n");
        int *idx = malloc((size_t)g.n_ops * sizeof *idx), m = 0;
        for (int k = 0; k < g.n_ops; k++)
            if (g.ops[k].type <= OP_CONV2D_BWD_FILTER) idx[m++] = k;
        sort_by_seconds(idx, m, pr->op_seconds);
        for (int i = 0; i < m && i < 12; i++) {
            const struct op *o = &g.ops[idx[i]];
            const struct bk_conv2d *s = &o->a.conv;
            double sec = pr->op_seconds[idx[i]] * per;
            printf("#   %7.2f %7.1f %-18s %d %4d %2dx%-2d -> %4d %2dx%-2d %dx%d s%d\n", 1e3 * sec,
                   1e-9 * mult * cost_op_flops(o) / sec, op_name(o->type), s->n, s->ci, s->h, s->w, s->co, s->ho,
                   s->wo, s->kh, s->kw, s->stride);
        }
        /* the linears likewise (m rows, k inputs, n outputs) */
        printf("# slowest linear ops: ms/step GFLOP/s kind M K -> N\n");
        m = 0;
        for (int k = 0; k < g.n_ops; k++)
            if (g.ops[k].type == OP_LINEAR || g.ops[k].type == OP_LINEAR_BWD) idx[m++] = k;
        sort_by_seconds(idx, m, pr->op_seconds);
        for (int i = 0; i < m && i < 8; i++) {
            const struct op *o = &g.ops[idx[i]];
            double sec = pr->op_seconds[idx[i]] * per;
            printf("#   %7.2f %7.1f %-18s %5d %4d -> %4d\n", 1e3 * sec,
                   1e-9 * mult * cost_op_flops(o) / sec, op_name(o->type), o->a.lin.m,
                   o->a.lin.k, o->a.lin.n);
        }
        free(idx);
    }
    free(sorted);
    free(dt);
    free(dc);
    free(x0);
    free(xt);
    free(eps);
    free(t);
    free(ti);
    ddpm_schedule_free(&sch);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    return 0;
}

/* the cores' arithmetic peak: each thread runs 12 independent register chains of 512-bit fp32
 * FMAs, then of vdpbf16ps (where the CPU has AVX512-BF16), for `seconds` each; GFLOP per
 * second of wall time (all threads) and per CPU-second (one core's). What the GEMM and
 * convolution ceilings below are a share of: no kernel can beat these. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* 12 independent chains in named registers (an array stays in memory at -O2), one loop per
 * instruction */
#define PEAK_CHAINS(OP)                                                                        \
    for (long it = 0; it < iters; it++) {                                                      \
        a0 = OP(a0), a1 = OP(a1), a2 = OP(a2), a3 = OP(a3), a4 = OP(a4), a5 = OP(a5);          \
        a6 = OP(a6), a7 = OP(a7), a8 = OP(a8), a9 = OP(a9), a10 = OP(a10), a11 = OP(a11);      \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),     \
                         "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));        \
    }
__attribute__((target("avx512f,avx512bf16"))) static double peak_loop(int bf16, long iters)
{
    __m512 a0 = _mm512_set1_ps(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-7f);
    const __m512bh bx = (__m512bh)_mm512_set1_epi16(0x3f80), by = (__m512bh)_mm512_set1_epi16(0x3380);
#define PEAK_FMA(v) _mm512_fmadd_ps(v, x, y)
#define PEAK_DP(v) _mm512_dpbf16_ps(v, bx, by)
    if (bf16)
        PEAK_CHAINS(PEAK_DP)
    else
        PEAK_CHAINS(PEAK_FMA)
#undef PEAK_FMA
#undef PEAK_DP
    const __m512 s = _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                      _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
        _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}
#undef PEAK_CHAINS

static void run_peak(int threads, double seconds)
{
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (cpu_isa() < (bf16 ? CPU_ISA_AVX512_BF16 : CPU_ISA_AVX512)) continue;
        long iters = 1 << 20;
        double t0 = now(), c0 = cpu_now(), sink = 0.0;
        for (;;) { /* grow until one run takes `seconds` */
            t0 = now(), c0 = cpu_now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
            sink += peak_loop(bf16, iters);
            if (now() - t0 >= seconds || iters > (1L << 40)) break;
            iters *= 2;
        }
        const double fl = 2.0 * 12 * (bf16 ? 32 : 16) * (double)iters * threads;
        printf("peak_%s_gflops %.2f\npeak_%s_gflops_cpu %.2f\n", bf16 ? "vdpbf16ps" : "fp32_fma",
               1e-9 * fl / (now() - t0), bf16 ? "vdpbf16ps" : "fp32_fma",
               1e-9 * fl / (cpu_now() - c0) + 0.0 * sink);
    }
}
#else
static void run_peak(int threads, double seconds) { (void)threads, (void)seconds; }
#endif

/* the machine's ceilings: SGEMM through cpu_gemm (the engine's GEMM, a oneDNN matmul) and a 3x3
 * conv forward + backward (data, filter) through the backend's conv kernels */
static int run_ceilings(int threads, double seconds)
{
    bk_ctx *ctx = NULL;
    if (cpu_ctx_init(&ctx, threads)) return 1;
    run_peak(threads, seconds / 2);
    {
        const int n = 2048;
        const struct cpu_gemm_shape gs = {0, 0, n, n, n, n, n, n, BK_DTYPE_F32, BK_DTYPE_F32, 0, 0, 0, 0, 0, 0};
        const size_t wsb = cpu_gemm_ws_bytes(&gs);
        float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4), *c = malloc((size_t)n * n * 4);
        void *ws = malloc(wsb ? wsb : 64);
        fill_normal(a, (size_t)n * n, 2, 0, 0);
        fill_normal(b, (size_t)n * n, 2, 0, 1);
        if (cpu_gemm(&gs, c, a, b, NULL, ws, wsb, ctx))
            return fprintf(stderr, "cpu_gemm failed\n"), 1;
        double best = 1e30, t_end = now() + seconds;
        int reps = 0;
        while (reps < 3 || now() < t_end) {
            double t0 = now();
            cpu_gemm(&gs, c, a, b, NULL, ws, wsb, ctx);
            double d = now() - t0;
            if (d < best) best = d;
            reps++;
        }
        printf("ceiling_sgemm_shape %dx%dx%d\nceiling_sgemm_gflops %.2f\n", n, n, n,
               2.0 * n * n * (double)n / best * 1e-9);
        free(a);
        free(b);
        free(c);
        free(ws);
    }
    /* a linear forward + backward (dx, dw) in fp32 and with bf16 operands (the CPU's bf16
     * matmuls against its fp32 ones): 2048 x 256 -> 256, the seed's attention projections at
     * batch 8 and 16x16 */
    {
        const int m = 2048, k = 256, n = 256;
        float *x = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
        float *y = malloc((size_t)m * n * 4);
        float *dx = malloc((size_t)m * k * 4), *dw = calloc((size_t)n * k, 4);
        fill_normal(x, (size_t)m * k, 5, 0, 0);
        fill_normal(w, (size_t)n * k, 5, 0, 1);
        fill_normal(y, (size_t)m * n, 5, 0, 2);
        for (int di = 0; di < 2; di++) {
            const int dt = di ? BK_DTYPE_BF16 : BK_DTYPE_F32;
            if (dt == BK_DTYPE_BF16) { /* in place, as the convolution's below */
                for (size_t i = 0; i < (size_t)m * k; i++)
                    ((uint16_t *)x)[i] = half_f32_to_bf16(x[i]);
                for (size_t i = 0; i < (size_t)n * k; i++)
                    ((uint16_t *)w)[i] = half_f32_to_bf16(w[i]);
                for (size_t i = 0; i < (size_t)m * n; i++)
                    ((uint16_t *)y)[i] = half_f32_to_bf16(y[i]);
            }
            size_t wsb = cpu_linear_ws_bytes(m, k, n, dt);
            void *ws = malloc(wsb ? wsb : 64);
            cpu_ctx_set_workspace(ctx, ws, wsb);
            double best = 1e30, cbest = 1e30, t_end = now() + seconds;
            int bad = 0;
            for (int reps = 0; !bad && (reps < 4 || now() < t_end); reps++) {
                double t0 = now(), c0 = cpu_now();
                bad |= cpu_linear_fwd(y, x, w, NULL, m, k, n, dt, ctx) != BK_OK;
                bad |= cpu_linear_bwd(dx, dw, NULL, y, x, w, 0, m, k, n, dt, ctx) != BK_OK;
                double d = now() - t0, c = cpu_now() - c0;
                if (reps > 0 && d < best) best = d;
                if (reps > 0 && c < cbest) cbest = c;
            }
            const double fl = 6.0 * m * (double)k * n;
            printf("ceiling_linear_%s_gflops %.2f\nceiling_linear_%s_gflops_cpu %.2f\n",
                   di ? "bf16" : "f32", bad ? NAN : fl / best * 1e-9, di ? "bf16" : "f32",
                   bad ? NAN : fl / cbest * 1e-9);
            cpu_ctx_set_workspace(ctx, NULL, 0);
            free(ws);
        }
        free(x);
        free(w);
        free(y);
        free(dx);
        free(dw);
    }
    /* the same convolution in fp32 (ceiling_conv_*) and with bf16 operands (ceiling_conv_bf16_*:
     * what the CPU's bf16 kernels reach against its fp32 ones) */
    for (int di = 0; di < 2; di++) {
        const int dt = di ? BK_DTYPE_BF16 : BK_DTYPE_F32;
        /* the ddpm-cifar10 16x16 resnet conv at batch 8: 256 -> 256, 3x3, pad 1 */
        struct bk_conv2d s = {.n = 8, .ci = 256, .h = 16, .w = 16, .co = 256, .kh = 3, .kw = 3,
                              .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1,
                              .dtype = dt};
        const char *key = dt == BK_DTYPE_F32 ? "conv" : "conv_bf16";
        bk_conv2d_init(&s);
        size_t nx = (size_t)s.n * s.ci * s.h * s.w, ny = (size_t)s.n * s.co * s.ho * s.wo;
        size_t nw = (size_t)s.co * s.ci * s.kh * s.kw;
        size_t wsb = cpu_conv2d_ws_bytes(&s);
        float *x = malloc(nx * 4), *y = malloc(ny * 4), *w = malloc(nw * 4), *bias = calloc(s.co, 4);
        float *dx = malloc(nx * 4), *dw = calloc(nw, 4), *db = calloc(s.co, 4);
        void *ws = NULL;
        if (posix_memalign(&ws, 64, wsb ? wsb : 64)) return 1;
        fill_normal(x, nx, 3, 0, 0);
        fill_normal(w, nw, 3, 0, 1);
        if (dt == BK_DTYPE_BF16) { /* in place: element i's 16 bits before element i's float */
            for (size_t i = 0; i < nx; i++) ((uint16_t *)x)[i] = half_f32_to_bf16(x[i]);
            for (size_t i = 0; i < nw; i++) ((uint16_t *)w)[i] = half_f32_to_bf16(w[i]);
        }
        double fl = 2.0 * s.n * s.co * s.ho * s.wo * (double)s.ci * s.kh * s.kw;
        double best[3] = {1e30, 1e30, 1e30};
        double t_end = now() + seconds;
        int reps = 0;
        int refused = 0; /* bf16 where oneDNN has no bf16 kernels (an AVX2 cap): nan */
        while (!refused && (reps < 4 || now() < t_end)) {
            double t0 = now();
            refused |= cpu_conv2d_fwd(y, x, w, bias, ws, &s, ctx) != BK_OK;
            double t1 = now();
            refused |= cpu_conv2d_bwd_data(dx, y, w, 0, ws, &s, ctx) != BK_OK;
            double t2 = now();
            refused |= cpu_conv2d_bwd_filter(dw, db, y, x, ws, &s, ctx) != BK_OK;
            double t3 = now();
            if (reps > 0) { /* the first round creates the primitives */
                if (t1 - t0 < best[0]) best[0] = t1 - t0;
                if (t2 - t1 < best[1]) best[1] = t2 - t1;
                if (t3 - t2 < best[2]) best[2] = t3 - t2;
            }
            reps++;
        }
        if (refused) best[0] = best[1] = best[2] = NAN;
        if (dt == BK_DTYPE_F32)
            printf("ceiling_conv_shape N%d %d->%d %dx%d 3x3\n", s.n, s.ci, s.co, s.h, s.w);
        printf("ceiling_%s_fwd_gflops %.2f\nceiling_%s_bwd_data_gflops %.2f\n"
               "ceiling_%s_bwd_filter_gflops %.2f\n", key, fl / best[0] * 1e-9, key,
               fl / best[1] * 1e-9, key, fl / best[2] * 1e-9);
        printf("ceiling_%s_gflops %.2f\n", key, 3.0 * fl / (best[0] + best[1] + best[2]) * 1e-9);
        free(x);
        free(y);
        free(w);
        free(bias);
        free(dx);
        free(dw);
        free(db);
        free(ws);
    }
    cpu_ctx_free(ctx);
    return 0;
}

/* the attention at the seed-64 shapes (packed qkv, batch 8, heads 4) and the 32x32 presets' (L 256,
 * heads 1, D 128: cifar-small, D 256: ddpm-cifar10): the tiled form and, where its scores fit in
 * memory, the plain form (GEMMs on the whole L x L scores), fp32; with bf16 (--precision bf16)
 * the same on bf16 operands where the CPU backend has them (cpu_half_kernels), rounds
 * alternating. GFLOP/s of wall time and, in brackets, per CPU-second of all threads. */
static int run_attn(int threads, double seconds, int precision)
{
    bk_ctx *ctx = NULL;
    if (cpu_ctx_init(&ctx, threads)) return 1;
    const int b16 = precision == STRATEGY_PRECISION_BF16;
    static const int shapes[][4] = {{8, 4096, 4, 16}, {8, 1024, 4, 32}, {8, 1024, 4, 16},
                                    {8, 256, 1, 128}, {8, 256, 1, 256}};
    static const char *const names[4] = {"tiled", "plain", "bf16 tiled", "bf16 plain"};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int n = shapes[si][0], l = shapes[si][1], h = shapes[si][2], d = shapes[si][3];
        const int c = h * d;
        struct bk_attn s = {.n = n, .l = l, .heads = h, .d = d, .ld = 3 * c,
                            .scale = 1.0f / sqrtf((float)d)};
        struct bk_attn s16 = s;
        s16.dtype = BK_DTYPE_BF16;
        const size_t nq = (size_t)n * l * 3 * c, no = (size_t)n * l * c, nl = (size_t)n * h * l;
        const int plain = (double)nl * l * 4 <= 1.1e9; /* p (N,H,L,L) */
        /* which of the four forms run: fp32 tiled always, the others where they exist */
        size_t wsv[4] = {cpu_attn_ws_bytes(&s, 1), plain ? cpu_attn_ws_bytes(&s, 0) : 0,
                         b16 ? cpu_attn_ws_bytes(&s16, 1) : 0,
                         b16 && plain ? cpu_attn_ws_bytes(&s16, 0) : 0};
        if (b16 && !wsv[2]) {
            fprintf(stderr, "cpu_bench: no bf16 attention on this CPU (cpu_half_kernels)\n");
            cpu_ctx_free(ctx);
            return 1;
        }
        size_t wsb = 0;
        for (int f = 0; f < 4; f++) wsb = wsv[f] > wsb ? wsv[f] : wsb;
        float *qkv = malloc(nq * 4), *o = malloc(no * 4), *lse = malloc(nl * 4);
        float *dout = malloc(no * 4), *dqkv = malloc(nq * 4);
        float *p = plain ? malloc(nl * (size_t)l * 4) : NULL;
        uint16_t *h16 = b16 ? malloc((nq * 2 + no * 2) * 2) : NULL; /* qkv, dqkv, o, dout */
        void *ws = malloc(wsb);
        fill_normal(qkv, nq, 4, 0, 0);
        fill_normal(dout, no, 4, 0, 1);
        uint16_t *qkv16 = h16, *dqkv16 = h16 ? h16 + nq : NULL;
        uint16_t *o16 = h16 ? h16 + 2 * nq : NULL, *dout16 = h16 ? o16 + no : NULL;
        if (b16) {
            for (size_t i = 0; i < nq; i++) qkv16[i] = half_f32_to_bf16(qkv[i]);
            for (size_t i = 0; i < no; i++) dout16[i] = half_f32_to_bf16(dout[i]);
        }
        double fl = 4.0 * n * h * (double)l * l * d, best[8], cbest[8];
        for (int i = 0; i < 8; i++) best[i] = cbest[i] = 1e30;
        double t_end = now() + seconds;
        for (int reps = 0; reps < 2 || now() < t_end; reps++) {
            for (int i = 0; i < 8; i++) {
                const int f = i / 2, bwd = i % 2, tiled = !(f % 2);
                if (!wsv[f]) continue;
                const struct bk_attn *sf = f < 2 ? &s : &s16;
                void *oo = f < 2 ? (void *)o : o16, *dd = f < 2 ? (void *)dqkv : dqkv16;
                const void *qq = f < 2 ? (const void *)qkv : qkv16;
                const void *dy = f < 2 ? (const void *)dout : dout16;
                const size_t es = f < 2 ? 4 : 2, cb = (size_t)c * es;
                const char *qc = qq, *dc = dd;
                const double t0 = now(), c0 = cpu_now();
                if (!bwd && tiled) cpu_attn_fwd(oo, lse, qc, qc + cb, qc + 2 * cb, ws, sf, ctx);
                if (!bwd && !tiled)
                    cpu_attn_plain_fwd(oo, p, qc, qc + cb, qc + 2 * cb, ws, sf, ctx);
                if (bwd && tiled)
                    cpu_attn_bwd(dd, (char *)dc + cb, (char *)dc + 2 * cb, dy, qc, qc + cb,
                                 qc + 2 * cb, oo, lse, ws, sf, ctx);
                if (bwd && !tiled)
                    cpu_attn_plain_bwd(dd, (char *)dc + cb, (char *)dc + 2 * cb, dy, qc, qc + cb,
                                       qc + 2 * cb, p, ws, sf, ctx);
                const double t1 = now(), c1 = cpu_now();
                if (t1 - t0 < best[i]) best[i] = t1 - t0;
                if (c1 - c0 < cbest[i]) cbest[i] = c1 - c0;
            }
        }
        printf("attn N%d L%d H%d D%d:", n, l, h, d);
        for (int f = 0; f < 4; f++)
            if (wsv[f])
                printf("%s %s fwd %.1f ms %.1f (%.1f) GFLOP/s, bwd %.1f ms %.1f (%.1f), ws %zu B",
                       f ? ";" : "", names[f], 1e3 * best[2 * f], 1e-9 * fl / best[2 * f],
                       1e-9 * fl / cbest[2 * f], 1e3 * best[2 * f + 1],
                       2e-9 * fl / best[2 * f + 1], 2e-9 * fl / cbest[2 * f + 1], wsv[f]);
        printf("\n");
        free(qkv);
        free(o);
        free(lse);
        free(dout);
        free(dqkv);
        free(p);
        free(h16);
        free(ws);
    }
    cpu_ctx_free(ctx);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cpu_bench --config NAME [--batch N] [--steps N] [--warmup N] [--threads N] "
            "[--micro-batch M]\n"
            "                 [--profile | --profile-cpu] [--precision f32|bf16|f16] [--half-kernels MASK]\n"
            "                 [--deterministic]\n"
            "       cpu_bench --ceilings [--threads N] [--seconds S]\n"
            "       cpu_bench --attn [--threads N] [--seconds S] [--precision f32|bf16]\n"
            "configs: fmnist-tiny, cifar-small, ddpm-cifar10 (32x32), seed-64 (64x64)\n"
            "--profile-cpu: the profile in CPU seconds of the thread running the step (what a\n"
            "busy machine stretches least; --profile: wall time)\n"
            "--half-kernels MASK: bf16 on these kernels (1 convolutions, 2 linears, 3 both, 0\n"
            "none) instead of the CPU backend's choice (half_kernels)\n"
            "--deterministic: parity mode (memory.deterministic: direct convolutions; the\n"
            "default is ddpmd train's fast mode: Winograd F(4x4, 3x3) for the 3x3 ones)\n"
            "--micro-batch M: the batch in micro-batches of M (a divisor of N), gradients\n"
            "accumulated as a planned micro-batch runs (the graph and plan are M's)\n");
}

int main(int argc, char **argv)
{
    const char *config = NULL;
    int batch = 8, micro = 0, steps = 10, warmup = 2, profile = 0, ceilings = 0, attn = 0;
    int precision = STRATEGY_PRECISION_F32, force_half = 0, deterministic = 0;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double seconds = 3.0;
    cpu_omp_wait_policy(argv); /* the OpenMP wait policy ddpmd runs with (kernels/cpu/cpu.h) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) config = argv[++i];
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--micro-batch") && v) micro = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--seconds") && v) seconds = atof(argv[++i]);
        else if (!strcmp(a, "--deterministic")) deterministic = 1;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--profile-cpu")) profile = EXEC_PROFILE_CPU;
        else if (!strcmp(a, "--half-kernels") && v) {
            forced_mask = (unsigned)strtoul(argv[++i], NULL, 0);
            force_half = 1;
        } else if (!strcmp(a, "--precision") && v) {
            const char *name = argv[++i];
            precision = -1;
            for (int q = STRATEGY_PRECISION_F32; q <= STRATEGY_PRECISION_F16; q++)
                if (!strcmp(name, planner_precision_name(q))) precision = q;
            if (precision < 0) {
                usage();
                return 2;
            }
        }
        else if (!strcmp(a, "--ceilings")) ceilings = 1;
        else if (!strcmp(a, "--attn")) attn = 1;
        else {
            usage();
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    /* the mode `ddpmd train` runs in: fast (Winograd convolutions) unless --deterministic
     * (memory.deterministic: the direct kernels, bit-identical to a parity run) */
    cpu_set_parity(deterministic);
    if (ceilings) return run_ceilings(threads, seconds);
    if (attn) return run_attn(threads, seconds, precision);
    if (!micro) micro = batch;
    if (!config || batch < 1 || steps < 1 || warmup < 0 || micro < 1 || batch % micro) {
        usage();
        return 2;
    }
    return run_config(config, batch, micro, warmup, steps, threads, profile, precision, force_half);
}
