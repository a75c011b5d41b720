/* calibrate.c - measures the cost model's constants on this machine (bench/, not a test) and
 * writes them in cost_model_parse's format: per op class, seconds = work x per_unit + per_op
 * from the per-op seconds of profiled training steps over several model sizes; the optimizer's seconds per parameter; host copies and 16-bit conversions per byte.
 *   calibrate [--threads N] [--out FILE]     (default: stdout)
 * ddpmd reads the file from --cost-model FILE or $DDPMD_COST_MODEL (server/costfile.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost.h"
#include "exec.h"
#include "init.h"
#include "plan.h"
#include "unet.h"

const struct backend *backend_cpu(void);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* sums for a least-squares line per class */
struct fit {
    double n, sx, sy, ymin;
};

static int profile_model(const struct unet_config *c, int batch, int threads, int steps,
                         struct fit *fit, double *optim_s, double *optim_params)
{
    struct graph g;
    struct unet_io io;
    int target, rc = -1;
    struct plan p;
    struct exec *e = NULL;
    float *h = NULL;
    graph_init(&g);
    memset(&p, 0, sizeof p);
    if (unet_build_training(&g, c, batch, &io, &target, NULL) ||
        plan_make(&p, &g, backend_cpu(), NULL))
        goto out;
    struct exec_opts eo = {.threads = threads, .profile = 1};
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
            for (size_t k = 0; k < t->numel; k++) h[k] = (float)((k * 2654435761u) % 1000) / 1000.f;
            exec_upload(e, i, h);
        }
    }
    exec_reset_state(e);
    struct optim_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .clip = 1.0f, .ema_decay = 0.999f, .total_steps = 100};
    for (int s = 0; s <= steps; s++) {
        if (s == 1) exec_profile_reset(e); /* step 0 warms caches and oneDNN primitives */
        float loss, norm;
        if (exec_forward_backward(e, 1, 1.0f, 1, (uint64_t)s, 0, &loss) ||
            exec_optimizer_step(e, &oc, s + 1, 1e-4f, &norm))
            goto out;
    }
    const struct exec_profile *pr = exec_get_profile(e);
    for (int k = 0; k < g.n_ops; k++) {
        struct fit *f = &fit[cost_class_of(g.ops[k].type)];
        double x = cost_op_work(&g, k), y = pr->op_seconds[k] / steps;
        if (f->n == 0 || y < f->ymin) f->ymin = y;
        f->n += 1;
        f->sx += x;
        f->sy += y;
    }
    *optim_s += pr->optim_seconds / steps;
    *optim_params += (double)g.param_numel;
    rc = 0;
out:
    free(h);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    return rc;
}

/* seconds per byte of a copy between two separate allocations, and of fp32 -> bf16 -> fp32 */
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
    double t0 = now_s();
    for (int r = 0; r < 4; r++) bk->mem_upload(b, a, n * sizeof *a, ctx);
    *copy = (now_s() - t0) / (4.0 * n * sizeof *a);
    if (bk->convert) {
        t0 = now_s();
        for (int r = 0; r < 4; r++) {
            bk->convert(hb, BK_DTYPE_BF16, a, BK_DTYPE_F32, n, ctx);
            bk->convert(b, BK_DTYPE_F32, hb, BK_DTYPE_BF16, n, ctx);
        }
        *convert = (now_s() - t0) / (4.0 * n * sizeof *a);
    }
out:
    if (ctx) bk->ctx_free(ctx);
    free(a);
    free(b);
    free(hb);
}

int main(int argc, char **argv)
{
    int threads = 2;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
        else {
            fprintf(stderr, "usage: calibrate [--threads N] [--out FILE]\n");
            return 2;
        }
    }
    struct fit fit[COST_CLASS_COUNT];
    memset(fit, 0, sizeof fit);
    double optim_s = 0, optim_params = 0;
    /* sizes spanning small and large ops: the seed preset at 32 and 64 px, a small ddpm */
    struct unet_config c;
    unet_config_default(&c, UNET_SEED);
    c.image_size = 32;
    if (profile_model(&c, 4, threads, 2, fit, &optim_s, &optim_params)) goto fail;
    c.image_size = 64;
    if (profile_model(&c, 2, threads, 1, fit, &optim_s, &optim_params)) goto fail;
    unet_config_default(&c, UNET_DDPM);
    c.image_size = 16;
    if (profile_model(&c, 4, threads, 2, fit, &optim_s, &optim_params)) goto fail;

    struct cost_model m;
    cost_model_default(&m);
    m.threads = threads;
    for (int k = 0; k < COST_CLASS_COUNT; k++) {
        struct fit *f = &fit[k];
        if (f->n < 1 || f->sx <= 0) continue;
        /* the fastest op of the class is its fixed cost; the rest of the class's measured
         * seconds spread over its work, so the profiled steps' class totals are reproduced
         * exactly (a free least-squares line is dragged by a busy machine's outliers) */
        double b = f->ymin, a = (f->sy - f->n * b) / f->sx;
        if (a <= 0) {
            a = f->sy / f->sx;
            b = 0;
        }
        m.seconds_per_unit[k] = a;
        m.op_seconds[k] = b;
    }
    m.optim_seconds_per_param = optim_s / optim_params;
    m.host_optim_seconds_per_param = m.optim_seconds_per_param; /* the same CPU cores */
    double copy, convert;
    copy_rates(&copy, &convert, threads);
    if (copy > 0) m.transfer_seconds_per_byte = copy;
    if (convert > 0) m.convert_seconds_per_byte = convert;
    char *txt = cost_model_format(&m);
    if (!txt) goto fail;
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
fail:
    fprintf(stderr, "calibrate: a profiled step failed\n");
    return 1;
}
