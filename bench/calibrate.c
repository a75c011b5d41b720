/* calibrate.c - measures the cost model's constants on this machine (bench/, not a test) and
 * writes them in cost_model_parse's format: per op class, seconds = work x per_unit + per_op,
 * fitted to the class's seconds per step over profiled training steps of several models and
 * batch sizes; the optimizer's seconds per parameter; host copies and 16-bit conversions per
 * byte; per class the 16-bit speed (half_speed: the same models' steps in bf16 against fp32, each
 * op's conversions taken out at the measured conversion rate) and whether its plans convert
 * around it (half_cvt). Times are the CPU seconds of
 * the thread that runs the steps (EXEC_PROFILE_CPU), under
 * ddpmd's own OpenMP wait policy (cpu_omp_wait_policy: passive after a short spin): a
 * neighbour's time is not counted, though neighbours sharing the caches and the memory bus
 * still stretch it (10-50% at load 7-9 on the 2-core machine: calibrate when it is quiet).
 *   calibrate [--threads N] [--rounds R] [--out FILE]
 * (default: 3 rounds over the models, each op's least time over all; the file on stdout, the
 * fit's residuals on stderr; CALIBRATE_OPS=all lists every op as "opdata MODEL|CLASS|WORK|
 * SECONDS|BYTES", a class number that class's ops with their rates)
 * run from the repository's root: the models are those of the example specs (examples/).
 * ddpmd reads the file from $DDPMD_COST_MODEL (server/train.c train_cost_model, called by app/).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cost.h"
#include "cpu/cpu.h"
#include "exec.h"
#include "init.h"
#include "memplan.h"
#include "spec.h"
#include "unet.h"

const struct backend *backend_cpu(void);

static double thread_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* one profiled model: per class its work and ops per step, and the least seconds a step spent
 * in the class */
struct sample {
    double x[COST_CLASS_COUNT], n[COST_CLASS_COUNT], y[COST_CLASS_COUNT];
    double cvt[COST_CLASS_COUNT]; /* bf16 runs: fp32 bytes converted around the class's ops */
    int precision;
    double optim_s, params, step_s;
    double *opmin; /* each graph op's least seconds in a step, over every round so far */
    int n_ops;
    struct unet_config cfg;
    int batch;
    const char *what;
};

#define MAX_SAMPLES 16
static struct sample samples[MAX_SAMPLES];
static int n_samples;
static int last_round; /* CALIBRATE_OPS lists the ops' least times of the last round */

/* the model of the example spec at path (examples/, read from the repository's root), at image
 * size `image` (0: the spec's) */
static int config_of(struct unet_config *c, const char *path, int image)
{
    struct train_spec s;
    struct spec_errors E;
    if (spec_load_file(path, &s, &E)) {
        spec_errors_print(&E, path);
        return -1;
    }
    *c = s.model;
    if (image) c->image_size = image;
    return 0;
}

/* steps of one model after a warm-up step; round 0 makes samples[idx], later rounds lower its
 * ops' least times */
static int profile_model(int idx, const char *what, const char *spec, int image, int batch,
                         int recompute, int precision, int threads, int steps)
{
    struct sample *sm = &samples[idx];
    int first = sm->opmin == NULL;
    struct graph g;
    struct unet_io io;
    int target, rc = -1;
    struct plan p;
    struct exec *e = NULL;
    float *h = NULL;
    if (first) {
        memset(sm, 0, sizeof *sm);
        if (config_of(&sm->cfg, spec, image)) return -1;
        sm->batch = batch;
        sm->what = what;
        sm->precision = precision;
    }
    graph_init(&g);
    memset(&p, 0, sizeof p);
    struct plan_opts po = {.strategy = strategy_plain(batch)};
    po.strategy.recompute = recompute;
    po.strategy.precision = precision;
    if (unet_build_training(&g, &sm->cfg, batch, &io, &target, NULL) ||
        graph_set_precision(&g, precision) || plan_make(&p, &g, backend_cpu(), &po))
        goto out;
    struct exec_opts eo = {.threads = threads, .profile = EXEC_PROFILE_CPU};
    if (exec_init(&e, &g, &p, backend_cpu(), &eo)) goto out;
    size_t maxn = 0;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->numel > maxn) maxn = g.tensors[i]->numel;
    if (!(h = malloc(maxn * sizeof *h))) goto out;
    for (int i = 0; i < g.n_tensors; i++) {
        const struct tensor *t = g.tensors[i];
        if (t->kind == TENSOR_PARAM) {
            init_param(t, 1, h);
            exec_upload(e, i, h);
        } else if (t->kind == TENSOR_INPUT) {
            for (size_t k = 0; k < t->numel; k++)
                h[k] = i == io.t ? (float)(k * 37 % 1000)
                                 : (float)((k * 2654435761u) % 1000) / 500.f - 1.f;
            exec_upload(e, i, h);
        }
    }
    exec_reset_state(e);
    struct optim_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .clip = 1.0f, .ema_decay = 0.999f, .total_steps = 100};
    for (int i = 0; first && i < p.n_run_ops; i++) { /* a recomputed forward op runs twice */
        int k = p.op_src ? p.op_src[i] : i;
        enum cost_class c = cost_op_class(&g.ops[k]);
        sm->x[c] += cost_op_work(&g, k);
        sm->n[c] += 1;
        for (int j = p.cvt_start[i]; j < p.cvt_start[i + 1]; j++)
            sm->cvt[c] += (double)plan_tensor(&p, &g, p.cvt[j].tensor)->numel * sizeof(float) *
                          (p.cvt[j].load + p.cvt[j].store);
    }
    /* step 0 warms caches and oneDNN's primitives; then each op's least seconds over the steps
     * (a busy machine only ever adds: an op whose peer thread was descheduled may have been
     * run by this one alone) */
    if (first) {
        if (!(sm->opmin = malloc((size_t)g.n_ops * sizeof *sm->opmin + 1))) goto out;
        sm->n_ops = g.n_ops;
    } else if (sm->n_ops != g.n_ops) {
        goto out;
    }
    double *opmin = sm->opmin;
    for (int s = 0; s <= steps; s++) {
        exec_profile_reset(e);
        float loss, norm;
        if (exec_forward_backward(e, 1, 1.0f, 1, (uint64_t)s, 0, &loss) ||
            exec_optimizer_step(e, &oc, s + 1, 1e-4f, &norm))
            goto out;
        if (s == 0) continue;
        const struct exec_profile *pr = exec_get_profile(e);
        for (int k = 0; k < g.n_ops; k++)
            if ((first && s == 1) || pr->op_seconds[k] < opmin[k]) opmin[k] = pr->op_seconds[k];
        if ((first && s == 1) || pr->optim_seconds < sm->optim_s) sm->optim_s = pr->optim_seconds;
    }
    memset(sm->y, 0, sizeof sm->y);
    sm->step_s = sm->optim_s;
    for (int k = 0; k < g.n_ops; k++) {
        sm->y[cost_op_class(&g.ops[k])] += opmin[k];
        sm->step_s += opmin[k];
        if (!last_round || !getenv("CALIBRATE_OPS")) continue;
        if (!strcmp(getenv("CALIBRATE_OPS"), "all"))
        {
            double b = 0; /* the bytes the op reads and writes */
            for (int j = 0; j < g.ops[k].n_in; j++)
                if (g.ops[k].in[j] >= 0) b += (double)tensor_bytes(g.tensors[g.ops[k].in[j]]);
            for (int j = 0; j < g.ops[k].n_out; j++)
                if (g.ops[k].out[j] >= 0) b += (double)tensor_bytes(g.tensors[g.ops[k].out[j]]);
            fprintf(stderr, "opdata %s|%s|%.6g|%.6g|%.6g\n", what,
                    cost_class_name(cost_op_class(&g.ops[k])), cost_op_work(&g, k), opmin[k], b);
        }
        else if ((int)cost_op_class(&g.ops[k]) == atoi(getenv("CALIBRATE_OPS")))
            fprintf(stderr, "  op %4d %-22s work %10.3g  %9.6f s  %6.2f G/s\n", k,
                    op_name(g.ops[k].type), cost_op_work(&g, k), opmin[k],
                    cost_op_work(&g, k) / opmin[k] * 1e-9);
    }
    sm->params = (double)g.param_numel;
    if (first) n_samples++;
    fprintf(stderr, "calibrate: %-24s %8.4f s/step (thread CPU, least so far)\n", what,
            sm->step_s);
    rc = 0;
out:
    free(h);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    return rc;
}

/* a, b >= 0 minimising sum_i ((a x_i + b n_i - y_i) / y_i)^2 over the samples of class c: every
 * model's class total in relative error, so small models count as much as large ones */
static void fit_class(int c, double *a, double *b)
{
    double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
    for (int i = 0; i < n_samples; i++) {
        const struct sample *s = &samples[i];
        if (s->precision || s->y[c] <= 0 || s->n[c] <= 0) continue;
        double u = s->x[c] / s->y[c], v = s->n[c] / s->y[c];
        uu += u * u;
        uv += u * v;
        vv += v * v;
        u1 += u;
        v1 += v;
    }
    double det = uu * vv - uv * uv;
    *a = *b = 0;
    if (det > 0) {
        *a = (u1 * vv - v1 * uv) / det;
        *b = (v1 * uu - u1 * uv) / det;
    }
    if (det > 0 && *a >= 0 && *b >= 0) return;
    /* one of the two at zero: whichever leaves the smaller residual */
    double a0 = uu > 0 ? u1 / uu : 0, b0 = vv > 0 ? v1 / vv : 0;
    int nf = 0;
    for (int i = 0; i < n_samples; i++) nf += !samples[i].precision;
    double ra = nf - a0 * u1, rb = nf - b0 * v1; /* sum (a u - 1)^2 at the optimum */
    if (uu > 0 && (ra <= rb || vv == 0)) {
        *a = a0;
        *b = 0;
    } else {
        *a = 0;
        *b = b0;
    }
}

/* seconds per byte of a copy between two separate allocations, and of one fp32 <-> bf16
 * conversion (per fp32 byte), on this thread's CPU clock */
static void copy_rates(double *copy, double *convert, int threads)
{
    const struct backend *bk = backend_cpu();
    size_t n = (size_t)32 << 20; /* floats: 128 MiB */
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint16_t *hb = malloc(n * sizeof *hb);
    bk_ctx *ctx = NULL;
    *copy = *convert = 0;
    if (!a || !b || !hb || bk->ctx_init(&ctx, threads)) goto out;
    for (size_t i = 0; i < n; i++) a[i] = (float)i;
    memcpy(b, a, n * sizeof *a);
    double best = INFINITY;
    for (int r = 0; r < 4; r++) {
        double t0 = thread_s();
        bk->mem_upload(b, a, n * sizeof *a, ctx);
        double t = thread_s() - t0;
        if (t < best) best = t;
    }
    *copy = best / (double)(n * sizeof *a);
    if (backend_supports(bk, BK_OP_convert, BK_DTYPE_BF16)) {
        best = INFINITY;
        for (int r = 0; r < 4; r++) {
            double t0 = thread_s();
            bk->convert(hb, BK_DTYPE_BF16, a, BK_DTYPE_F32, n, ctx);
            bk->convert(b, BK_DTYPE_F32, hb, BK_DTYPE_BF16, n, ctx);
            double t = thread_s() - t0;
            if (t < best) best = t;
        }
        *convert = best / (2.0 * (double)(n * sizeof *a));
    }
out:
    if (ctx) bk->ctx_free(ctx);
    free(a);
    free(b);
    free(hb);
}

int main(int argc, char **argv)
{
    int threads = 2, rounds = 3;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
        else rounds = 0;
        if (rounds < 1) {
            fprintf(stderr, "usage: calibrate [--threads N] [--rounds R>=1] [--out FILE]\n");
            return 2;
        }
    }
    cpu_omp_wait_policy(argv); /* ddpmd's OpenMP wait policy (kernels/cpu/cpu.h) */
    /* the examples' models at batch sizes their micro-batches take; the small steps run more
     * often: their ops' least times fix the per-op constants, and a few steps of 10-40 ms on a
     * busy machine left them 1x to 8x apart between runs */
    static const struct {
        const char *what, *spec;
        int image, batch, recompute, steps, precision;
    } runs[] = {
        {"fmnist-tiny b1", "examples/fmnist-tiny.json", 0, 1, 0, 30, 0},
        {"fmnist-tiny b4", "examples/fmnist-tiny.json", 0, 4, 0, 12, 0},
        {"fmnist-tiny b16 resblock", "examples/fmnist-tiny.json", 0, 16, 2, 3, 0},
        {"fmnist-tiny b32", "examples/fmnist-tiny.json", 0, 32, 0, 2, 0},
        {"seed 32px b2", "examples/seed-64.json", 32, 2, 0, 3, 0},
        {"seed-64 b1", "examples/seed-64.json", 0, 1, 0, 2, 0},
        {"seed-64 b4", "examples/seed-64.json", 0, 4, 0, 2, 0},
        {"ddpm-cifar10 b1", "examples/ddpm-cifar10.json", 0, 1, 0, 2, 0},
        {"ddpm-cifar10 b4", "examples/ddpm-cifar10.json", 0, 4, 0, 2, 0},
        /* the 16-bit speeds: some of the same models in bf16 (the fp32 run of the same name
         * is the reference) */
        {"fmnist-tiny b4", "examples/fmnist-tiny.json", 0, 4, 0, 12, STRATEGY_PRECISION_BF16},
        {"seed 32px b2", "examples/seed-64.json", 32, 2, 0, 3, STRATEGY_PRECISION_BF16},
        {"seed-64 b1", "examples/seed-64.json", 0, 1, 0, 2, STRATEGY_PRECISION_BF16},
        {"ddpm-cifar10 b4", "examples/ddpm-cifar10.json", 0, 4, 0, 2, STRATEGY_PRECISION_BF16},
    };
    /* in rounds over all the models: a slow spell of the shared host (seconds long: fmnist-tiny
     * b4's least step 0.029 s in one run, 0.050 s in the next) meets one round of a model, not
     * all of its steps */
    for (int r = 0; r < rounds; r++) {
        last_round = r == rounds - 1;
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
            if (profile_model((int)i, runs[i].what, runs[i].spec, runs[i].image, runs[i].batch,
                              runs[i].recompute, runs[i].precision, threads, runs[i].steps)) {
                fprintf(stderr, "calibrate: a profiled step of %s failed\n", runs[i].what);
                return 1;
            }
    }

    struct cost_model m;
    cost_model_default(&m);
    m.threads = threads;
    for (int c = 0; c < COST_CLASS_COUNT; c++) {
        double a, b;
        fit_class(c, &a, &b);
        if (a > 0 || b > 0) {
            m.seconds_per_unit[c] = a;
            m.op_seconds[c] = b;
        }
    }
    double os = 0, op = 0;
    for (int i = 0; i < n_samples; i++) {
        if (samples[i].precision) continue;
        os += samples[i].optim_s;
        op += samples[i].params;
    }
    m.optim_seconds_per_param = os / op;
    m.host_optim_seconds_per_param = m.optim_seconds_per_param; /* the same CPU kernels */
    double copy, convert;
    copy_rates(&copy, &convert, threads);
    if (copy > 0) m.transfer_seconds_per_byte = copy;
    if (convert > 0) m.convert_seconds_per_byte = convert;
    /* half_speed[c]: the class's seconds in the fp32 runs over its seconds in the same models'
     * bf16 runs less their conversions, summed over the models; a class with under 2 ms of
     * bf16 time in all keeps the default */
    for (int c = 0; c < COST_CLASS_COUNT; c++) {
        double f32 = 0, h = 0, cvt = 0;
        for (int i = 0; i < n_samples; i++) {
            const struct sample *b = &samples[i];
            if (!b->precision) continue;
            cvt += b->cvt[c];
            for (int j = 0; j < n_samples; j++)
                if (!samples[j].precision && !strcmp(samples[j].what, b->what)) {
                    double net = b->y[c] - b->cvt[c] * m.convert_seconds_per_byte;
                    if (net > 0) {
                        f32 += samples[j].y[c];
                        h += net;
                    }
                }
        }
        if (h > 2e-3 && f32 > 0) {
            m.half_speed[c] = f32 / h;
            m.half_cvt[c] = cvt > 0; /* the plans converted around the class's ops */
        }
        fprintf(stderr, "calibrate: %-16s bf16 speed %5.2fx (%.4f s fp32, %.4f s bf16 net; %.0f MB "
                "converted)\n", cost_class_name((enum cost_class)c), m.half_speed[c], f32, h,
                cvt * 1e-6);
    }
    /* the fit's residuals: each profiled step predicted by the constants just fitted */
    for (int i = 0; i < n_samples; i++) {
        const struct sample *s = &samples[i];
        if (s->precision) continue;
        double pred = s->params * m.optim_seconds_per_param;
        for (int c = 0; c < COST_CLASS_COUNT; c++)
            pred += s->x[c] * m.seconds_per_unit[c] + s->n[c] * m.op_seconds[c];
        fprintf(stderr, "calibrate: %-22s measured %8.4f s, fitted %8.4f s (%+.1f%%)\n", s->what,
                s->step_s, pred, 100.0 * (pred - s->step_s) / s->step_s);
        if (getenv("CALIBRATE_VERBOSE"))
            for (int c = 0; c < COST_CLASS_COUNT; c++)
                fprintf(stderr, "    %-16s %8.4f s fitted %8.4f s  ops %5.0f work %.3g\n",
                        cost_class_name((enum cost_class)c), s->y[c],
                        s->x[c] * m.seconds_per_unit[c] + s->n[c] * m.op_seconds[c], s->n[c],
                        s->x[c]);
    }
    char *txt = cost_model_format(&m);
    if (!txt) return 1;
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        perror(out);
        free(txt);
        return 1;
    }
    fputs(txt, f);
    if (out) fclose(f);
    free(txt);
    return 0;
}
