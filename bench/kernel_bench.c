/* kernel_bench.c - the memory-bound kernels of a training step (norms with their fusions,
 * element-wise, layout, resampling, dropout: backend.h's typed kernels) timed one op at a time
 * on a device, at the shapes, dtypes, fusions and addresses of the real plan, with the bandwidth
 * each reaches from the bytes it must move (every operand read once, every output written once,
 * an accumulated one read too; a value a fused pair makes and reads itself is written once, one
 * it never makes not at all). Not a test: it
 * prints a table per config (distinct kernels, calls per step, microseconds a call, GB/s and the
 * share of --peak-gbs), and per op type and in all the memory-bound milliseconds of a step.
 *   kernel_bench [--device cuda:0] [--precision bf16|f16|f32] [--reps N] [--peak-gbs GB/S]
 *                [SPEC.json:BATCH ...]   (default examples/ddpm-cifar10.json:128
 *                                          examples/seed-64.json:8)
 * A call's time is the wall clock of --reps (20) calls back to back after one untimed call,
 * launches queued behind each other on the job's stream (exec_time_op), over the device's sync.
 * Ops that run no kernel (in place, a fused guest) are left out. Exit 3: the precision cannot
 * run on the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_load.h"
#include "bench_exec.h"
#include "exec.h"
#include "memplan.h"
#include "spec.h"
#include "unet.h"

#define MAX_KINDS 512

/* a distinct kernel of the step: an op (and its fused guest) on the same shapes */
struct kind {
    char key[256];
    int op;                /* a run op of it, the one timed */
    int calls;             /* run ops of this kind in a step */
    size_t bytes;          /* one call's */
    double seconds;        /* one call's */
};

static int usage(void)
{
    fprintf(stderr, "usage: kernel_bench [--device cuda:0] [--precision bf16|f16|f32] [--reps N] "
                    "[--peak-gbs GB/S] [SPEC.json:BATCH ...]\n");
    return 2;
}

/* whether run op o is one of the typed memory-bound kernels */
static int memory_bound(const struct op *o)
{
    return (graph_half_kernel(o) & (BK_HALF_NORM | BK_HALF_ELTWISE)) != 0;
}

/* the bytes run op k (with its fused guest) moves at least: each output written once (one
 * the pair never makes has no place: none; two sharing bytes, an in-place copy: once), an
 * accumulated one read too, each input read once unless the pair made it itself */
static size_t op_bytes(const struct plan *p, const struct graph *g, int k)
{
    const struct op *ops[2] = {plan_op(p, g, k), NULL};
    if (p->fuse_guest[k] >= 0) ops[1] = plan_op(p, g, p->fuse_guest[k]);
    int wrote[2 * OP_MAX_OUT], n_wrote = 0, read[2 * OP_MAX_IN], n_read = 0;
    size_t bytes = 0;
    for (int q = 0; q < 2 && ops[q]; q++) {
        const struct op *o = ops[q];
        for (int j = 0; j < o->n_out; j++) {
            const int t = o->out[j];
            if (t < 0 || p->offset[t] < 0) continue;
            const int sid = p->storage[t] >= 0 ? p->storage[t] : -2 - t;
            int dup = 0;
            for (int i = 0; i < n_wrote; i++) dup |= wrote[i] == sid;
            if (dup) continue;
            wrote[n_wrote++] = sid;
            bytes += tensor_bytes(plan_tensor(p, g, t)) * (o->accum[j] ? 2 : 1);
        }
    }
    for (int q = 0; q < 2 && ops[q]; q++) {
        const struct op *o = ops[q], *other = ops[1 - q];
        for (int j = 0; j < o->n_in; j++) {
            const int t = o->in[j];
            int skip = t < 0;
            for (int i = 0; other && i < other->n_out && !skip; i++) skip = other->out[i] == t;
            for (int i = 0; i < n_read && !skip; i++) skip = read[i] == t;
            if (skip) continue;
            read[n_read++] = t;
            bytes += tensor_bytes(plan_tensor(p, g, t));
        }
    }
    return bytes;
}

/* the kind's key: op type(s), the operands' shapes and dtypes, the flags that change the
 * kernel */
static void op_key(char *key, size_t n, const struct plan *p, const struct graph *g, int k)
{
    const struct op *o = plan_op(p, g, k);
    int len = snprintf(key, n, "%s", op_name(o->type));
    if (p->fuse_guest[k] >= 0)
        len += snprintf(key + len, n - (size_t)len, "+%s",
                        op_name(plan_op(p, g, p->fuse_guest[k])->type));
    if (o->type == OP_GROUPNORM || o->type == OP_GROUPNORM_BWD)
        len += snprintf(key + len, n - (size_t)len, "%s g%d", o->a.gn.silu ? "(silu)" : "",
                        o->a.gn.groups);
    for (int j = 0; j < o->n_in + o->n_out && len < (int)n - 24; j++) {
        const int t = j < o->n_in ? o->in[j] : o->out[j - o->n_in];
        if (t < 0) continue;
        const struct tensor *tt = plan_tensor(p, g, t);
        len += snprintf(key + len, n - (size_t)len, " %s", j == o->n_in ? "->" : "");
        for (int d = 0; d < tt->rank; d++)
            len += snprintf(key + len, n - (size_t)len, "%s%d", d ? "x" : "", tt->d[d]);
        if (tt->dtype != DTYPE_F32) len += snprintf(key + len, n - (size_t)len, "h");
        if (j >= o->n_in && o->accum[j - o->n_in])
            len += snprintf(key + len, n - (size_t)len, "+=");
    }
}

static int cmp_kind(const void *a, const void *b)
{
    const struct kind *x = a, *y = b;
    const double tx = x->seconds * x->calls, ty = y->seconds * y->calls;
    return tx < ty ? 1 : tx > ty ? -1 : 0;
}

static int bench_config(const char *arg, const struct backend *bk, const char *device,
                        int precision, const char *prec, int reps, double peak)
{
    char path[512];
    snprintf(path, sizeof path, "%s", arg);
    char *colon = strrchr(path, ':');
    int batch = 0;
    if (colon) {
        batch = atoi(colon + 1);
        *colon = 0;
    }
    struct train_spec spec;
    struct spec_errors se;
    if (spec_load_file(path, &spec, &se)) {
        for (int i = 0; i < se.n; i++) fprintf(stderr, "%s: %s\n", se.e[i].path, se.e[i].msg);
        return 2;
    }
    if (batch > 0) spec.batch = batch;
    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e;
    int target;
    int brc = bench_exec_plain("kernel_bench", &spec, precision, prec, bk, device, 2, 0, &g, &io,
                               &target, &p, &e);
    if (brc) return brc;
    struct kind *kinds = calloc(MAX_KINDS, sizeof *kinds);
    if (!kinds) return 1;
    int n_kinds = 0, rc = 0;
    for (int k = 0; k < p.n_run_ops; k++) {
        const struct op *o = plan_op(&p, &g, k);
        if (!memory_bound(o) || p.fuse_host[k] >= 0) continue;
        char key[256];
        op_key(key, sizeof key, &p, &g, k);
        int i = 0;
        while (i < n_kinds && strcmp(kinds[i].key, key)) i++;
        if (i == n_kinds) {
            if (n_kinds == MAX_KINDS) continue;
            snprintf(kinds[i].key, sizeof kinds[i].key, "%s", key);
            kinds[i].op = k;
            kinds[i].bytes = op_bytes(&p, &g, k);
            n_kinds++;
        }
        kinds[i].calls++;
    }
    for (int i = 0; i < n_kinds && !rc; i++) {
        double warm;
        rc = exec_time_op(e, kinds[i].op, 1, &warm);
        if (!rc) rc = exec_time_op(e, kinds[i].op, reps, &kinds[i].seconds);
    }
    if (rc) {
        fprintf(stderr, "kernel_bench: %s\n", exec_last_error(e)->msg);
        return 1;
    }
    qsort(kinds, (size_t)n_kinds, sizeof *kinds, cmp_kind);
    int n_mem = 0;
    for (int i = 0; i < n_kinds; i++) n_mem += kinds[i].calls;
    printf("\n## %s batch %d, %s: %d memory-bound kernels in a step (%d fused pairs), %d "
           "distinct\n\n", path, spec.batch, prec, n_mem, p.n_fused, n_kinds);
    printf("| kernel (op, operand shapes; h: 16-bit) | calls | us/call | GB/s | %% peak |\n");
    printf("|---|---|---|---|---|\n");
    double by_type_s[OP_COUNT] = {0}, total_s = 0;
    size_t by_type_b[OP_COUNT] = {0}, total_b = 0;
    int calls_total = 0;
    for (int i = 0; i < n_kinds; i++) {
        const struct kind *kd = &kinds[i];
        if (kd->seconds < 1e-6) continue; /* no kernel: in place */
        const double gbs = (double)kd->bytes / kd->seconds / 1e9;
        char share[16] = "n/a";
        if (peak > 0) snprintf(share, sizeof share, "%.0f%%", 100.0 * gbs / peak);
        printf("| %s | %d | %.1f | %.0f | %s |\n", kd->key, kd->calls, kd->seconds * 1e6, gbs,
               share);
        const int ty = plan_op(&p, &g, kd->op)->type;
        by_type_s[ty] += kd->seconds * kd->calls;
        by_type_b[ty] += kd->bytes * (size_t)kd->calls;
        total_s += kd->seconds * kd->calls;
        total_b += kd->bytes * (size_t)kd->calls;
        calls_total += kd->calls;
    }
    printf("\n| op type | ms/step | GB/s |\n|---|---|---|\n");
    for (int t = 0; t < OP_COUNT; t++)
        if (by_type_s[t] > 0)
            printf("| %s | %.3f | %.0f |\n", op_name((enum op_type)t), by_type_s[t] * 1e3,
                   (double)by_type_b[t] / by_type_s[t] / 1e9);
    printf("| all %d calls | %.3f | %.0f |\n", calls_total, total_s * 1e3,
           total_s > 0 ? (double)total_b / total_s / 1e9 : 0.0);
    free(kinds);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    return 0;
}

int main(int argc, char **argv)
{
    const char *device = "cuda:0", *prec = "bf16";
    const char *configs[16];
    int n_configs = 0, reps = 20;
    double peak = 0.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) device = argv[++i];
        else if (!strcmp(a, "--precision") && v) prec = argv[++i];
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--peak-gbs") && v) peak = atof(argv[++i]);
        else if (a[0] != '-' && n_configs < 16) configs[n_configs++] = a;
        else return usage();
    }
    const int precision = !strcmp(prec, "f32")    ? STRATEGY_PRECISION_F32
                          : !strcmp(prec, "bf16") ? STRATEGY_PRECISION_BF16
                          : !strcmp(prec, "f16")  ? STRATEGY_PRECISION_F16
                                                  : -2;
    if (precision == -2 || reps < 1) return usage();
    if (!n_configs) {
        configs[n_configs++] = "examples/ddpm-cifar10.json:128";
        configs[n_configs++] = "examples/seed-64.json:8";
    }
    char err[512];
    const struct backend *bk = NULL;
    if (backend_load(device, &bk, err, sizeof err)) {
        fprintf(stderr, "kernel_bench: --device %s: %s\n", device, err);
        return 1;
    }
    struct bk_device_mem m = {0};
    const int dev = backend_device_index(device);
    if (backend_supports(bk, BK_OP_device_mem, BK_DTYPE_F32) && dev >= 0) bk->device_mem(dev, &m);
    char pk[32] = "unknown (--peak-gbs)";
    if (peak > 0) snprintf(pk, sizeof pk, "%.0f", peak);
    printf("kernel_bench: %s (%s, sm_%d%d), %s, %d calls a kernel, peak %s GB/s\n", device,
           m.name[0] ? m.name : bk->name, m.cc_major, m.cc_minor, prec, reps, pk);
    int rc = 0;
    for (int i = 0; i < n_configs && rc != 1; i++) {
        int r = bench_config(configs[i], bk, device, precision, prec, reps, peak);
        if (r) rc = r;
    }
    return rc;
}
