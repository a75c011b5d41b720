/* cost.c - the cost model: work per op (FLOPs or bytes), seconds per unit and per op by class,
 * the step's prediction, and the calibration file's text form.
 */
#include "cost.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const class_names[COST_CLASS_COUNT] = {
    [COST_CONV_FWD] = "conv_fwd",         [COST_CONV_BWD_DATA] = "conv_bwd_data",
    [COST_CONV_BWD_FILTER] = "conv_bwd_filter", [COST_GEMM] = "gemm",
    [COST_ATTN_FWD] = "attn_fwd",         [COST_ATTN_BWD] = "attn_bwd",
    [COST_ATTN_TILED_FWD] = "attn_tiled_fwd", [COST_ATTN_TILED_BWD] = "attn_tiled_bwd",
    [COST_NORM] = "norm",                 [COST_ELTWISE] = "eltwise",
    [COST_DROPOUT] = "dropout",
};

const char *cost_class_name(enum cost_class c)
{
    return (unsigned)c < COST_CLASS_COUNT ? class_names[c] : "?";
}

void cost_model_default(struct cost_model *m)
{
    /* bench/calibrate on a 2-core Xeon with AVX-512 (the CPU seconds of the thread running the
     * steps, OMP_WAIT_POLICY=passive; at load ~2), rounded; a second run at
     * load ~2 gave every per-unit constant within 5% (tiled attention 1.57e-11 and 9.0e-12).
     * The GEMM and plain-attention rates re-measured after the GEMMs moved to oneDNN (82b67fb;
     * two runs within 5%). The fixed costs per op vary with the host's load on this shared VM
     * (6e-6 to 6e-5 s within one afternoon, the same build): they are the earlier quiet run's.
     * Dropout re-measured after its NHWC path drew each Philox block once (3 rounds, 4.8e-10 s
     * per byte and 1.0e-5 s per op, was 1.41e-9 and 1.39e-4). The tiled attention's after its
     * AVX-512 tiles: the earlier constants over the kernels' speed-up per CPU-second at the
     * seed's 4096 tokens (cpu_bench --attn: forward 1.63x, backward 1.44x; a calibration at
     * load ~17 gave 7.4e-12 and 6.1e-12) */
    static const double per_unit[COST_CLASS_COUNT] = {
        [COST_CONV_FWD] = 3.5e-12,  [COST_CONV_BWD_DATA] = 3.6e-12,
        [COST_CONV_BWD_FILTER] = 4.45e-12, [COST_GEMM] = 5.4e-12,
        [COST_ATTN_FWD] = 1.27e-11, [COST_ATTN_BWD] = 8.5e-12,
        [COST_ATTN_TILED_FWD] = 9.6e-12, [COST_ATTN_TILED_BWD] = 6.1e-12,
        [COST_NORM] = 9.8e-11,      [COST_ELTWISE] = 3.7e-11,
        [COST_DROPOUT] = 4.8e-10,
    };
    static const double per_op[COST_CLASS_COUNT] = {
        [COST_CONV_FWD] = 6.8e-6,  [COST_CONV_BWD_DATA] = 6.2e-6, [COST_CONV_BWD_FILTER] = 6.3e-6,
        [COST_GEMM] = 8.2e-6,      [COST_ATTN_FWD] = 1.53e-5,     [COST_ATTN_BWD] = 1.5e-5,
        [COST_ATTN_TILED_FWD] = 0, [COST_ATTN_TILED_BWD] = 0,
        [COST_NORM] = 1.0e-5,      [COST_ELTWISE] = 1.2e-7,       [COST_DROPOUT] = 1.0e-5,
    };
    memset(m, 0, sizeof *m);
    memcpy(m->seconds_per_unit, per_unit, sizeof per_unit);
    memcpy(m->op_seconds, per_op, sizeof per_op);
    m->optim_seconds_per_param = 1.06e-9;
    m->host_optim_seconds_per_param = 1.06e-9;
    m->transfer_seconds_per_byte = 8.9e-11;
    m->convert_seconds_per_byte = 7.1e-11;
    /* 16-bit over fp32 per class, conversions apart: bench/calibrate on the same 2-core EPYC
     * (AVX512-BF16 without AMX: oneDNN's bf16 convolutions and matmuls, the filter gradient in
     * fp32 on converted operands, the tiled attention on its own vdpbf16ps tiles, the plain one
     * an fp32 kernel on converted operands), at load ~17: whole steps ddpm-cifar10 b4 0.889 ->
     * 0.733 s, seed-64 b1 0.405 -> 0.403 s, fmnist-tiny b4 0.051 -> 0.058 s; the two tiled
     * attention classes measured again with the bf16 tiles (2026-12-05, load ~17, `calibrate
     * --rounds 2`): 0.93 -> 1.24 forward, 0.96 -> 1.45 backward, seed-64 b1 0.385 -> 0.349 s.
     * The norms, element-wise ops and dropout on the typed kernels (kernels/cpu/typed.c, no
     * conversions around them; they were 0.75, 0.41 and 0.90 with the conversions' cost beyond
     * the per-byte rate): calibrate --rounds 2 at load ~15, 0.79, 0.90, 0.92 (on the small,
     * cache-resident tensors of its models the conversions inside cost what half the bytes
     * save; a step gains by losing the passes around them). The filter gradient once it ran as
     * bf16 im2col + GEMM (kernels/cpu/conv.c, was fp32 on converted operands at 0.98):
     * calibrate --rounds 1 at load ~16 (2026-12-05), 1.75. The plain attention once it had
     * bf16 tiles of its own (kernels/cpu/attn_bf16.c; was 0.91 and 0.84 as an fp32 kernel with
     * conversions around it): its ops in profiled cifar-small and ddpm-cifar10 b8 steps, bf16
     * against fp32 at load ~6 (2026-12-06), 2.7-3.0 forward, 1.8-2.0 backward, not calibrate's
     * fit */
    static const double half[COST_CLASS_COUNT] = {
        [COST_CONV_FWD] = 1.64,     [COST_CONV_BWD_DATA] = 1.77,
        [COST_CONV_BWD_FILTER] = 1.75, [COST_GEMM] = 1.46,
        [COST_ATTN_FWD] = 2.7,      [COST_ATTN_BWD] = 1.8,
        [COST_ATTN_TILED_FWD] = 1.24, [COST_ATTN_TILED_BWD] = 1.45,
        [COST_NORM] = 0.79,         [COST_ELTWISE] = 0.90,
        [COST_DROPOUT] = 0.92,
    };
    memcpy(m->half_speed, half, sizeof half);
    m->threads = 2;
}

enum cost_class cost_class_of(enum op_type t)
{
    switch (t) {
    case OP_CONV2D: return COST_CONV_FWD;
    case OP_CONV2D_BWD_DATA: return COST_CONV_BWD_DATA;
    case OP_CONV2D_BWD_FILTER: return COST_CONV_BWD_FILTER;
    case OP_LINEAR:
    case OP_LINEAR_BWD: return COST_GEMM;
    case OP_ATTENTION: return COST_ATTN_FWD;
    case OP_ATTENTION_BWD: return COST_ATTN_BWD;
    case OP_GROUPNORM:
    case OP_GROUPNORM_BWD:
    case OP_LAYERNORM:
    case OP_LAYERNORM_BWD: return COST_NORM;
    case OP_DROPOUT:
    case OP_DROPOUT_BWD: return COST_DROPOUT;
    default: return COST_ELTWISE;
    }
}

enum cost_class cost_op_class(const struct op *o)
{
    enum cost_class c = cost_class_of(o->type);
    if (c == COST_ATTN_FWD && o->a.at.tiled) return COST_ATTN_TILED_FWD;
    if (c == COST_ATTN_BWD && o->a.at.tiled) return COST_ATTN_TILED_BWD;
    return c;
}

double cost_op_flops(const struct op *o)
{
    switch (o->type) {
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER: {
        const struct bk_conv2d *s = &o->a.conv;
        return 2.0 * s->n * s->co * s->ho * s->wo * (double)s->ci * s->kh * s->kw;
    }
    case OP_LINEAR:
        return 2.0 * o->a.lin.m * (double)o->a.lin.k * o->a.lin.n;
    case OP_LINEAR_BWD: /* dw always, dx when asked for */
        return (o->out[0] >= 0 ? 4.0 : 2.0) * o->a.lin.m * (double)o->a.lin.k * o->a.lin.n;
    case OP_ATTENTION:
    case OP_ATTENTION_BWD: {
        const struct bk_attn *s = &o->a.at.s;
        double f = 4.0 * s->n * s->heads * (double)s->l * s->l * s->d;
        return o->type == OP_ATTENTION ? f : 2.0 * f;
    }
    default: return 0.0;
    }
}

double cost_op_work(const struct graph *g, int k)
{
    const struct op *o = &g->ops[k];
    switch (cost_op_class(o)) {
    case COST_CONV_FWD:
    case COST_CONV_BWD_DATA:
    case COST_CONV_BWD_FILTER:
    case COST_GEMM:
    case COST_ATTN_FWD:
    case COST_ATTN_BWD:
    case COST_ATTN_TILED_FWD: return cost_op_flops(o);
    /* the tiled backward also recomputes QK^T: 2.5x the forward's work, not the model's 2x */
    case COST_ATTN_TILED_BWD: return 1.25 * cost_op_flops(o);
    default: {
        double b = 0;
        for (int j = 0; j < o->n_in; j++)
            if (o->in[j] >= 0) b += (double)tensor_bytes(g->tensors[o->in[j]]);
        for (int j = 0; j < o->n_out; j++)
            if (o->out[j] >= 0) b += (double)tensor_bytes(g->tensors[o->out[j]]);
        return b;
    }
    }
}

double cost_op_seconds(const struct cost_model *m, const struct graph *g, int k)
{
    enum cost_class c = cost_op_class(&g->ops[k]);
    return cost_op_work(g, k) * m->seconds_per_unit[c] + m->op_seconds[c];
}

/* fp32 bytes of op o's 16-bit operands (graph g's dtypes): each is converted once, into fp32
 * scratch before the op (an input) or back after it (an output) */
static double convert_bytes(const struct graph *g, const struct op *o, const struct op *og)
{
    double b = 0;
    for (int j = 0; j < o->n_in; j++)
        if (o->in[j] >= 0 && o->in[j] < g->n_tensors &&
            graph_input_dtype(g, og, j) != DTYPE_F32)
            b += (double)g->tensors[o->in[j]]->numel * sizeof(float);
    for (int j = 0; j < o->n_out; j++)
        if (o->out[j] >= 0 && o->out[j] < g->n_tensors &&
            g->tensors[o->out[j]]->dtype != DTYPE_F32)
            b += (double)g->tensors[o->out[j]]->numel * sizeof(float);
    return b;
}

/* ops [0, n_run) of g (run op i is graph op op_src[i]) once per micro-batch, the optimizer,
 * transfers and conversions. An op's fixed seconds do not shrink with the uneven last
 * micro-batch; its work does, by the samples' share. */
static double predict(const struct cost_model *m, const struct graph *g, int n_run,
                      const int *op_src, int inference, const struct strategy *st, int batch)
{
    int half = st->precision == STRATEGY_PRECISION_BF16 || st->precision == STRATEGY_PRECISION_F16;
    double work = 0, fixed = 0, work_copy = 0;
    /* the weights with a 16-bit working copy (memplan.c: those a class converted around reads) */
    unsigned char *copied = half ? calloc((size_t)g->n_tensors + 1, 1) : NULL;
    for (int i = 0; i < n_run; i++) {
        int k = op_src ? op_src[i] : i; /* a recomputing plan's run order repeats graph ops */
        if (k < 0 || k >= g->n_ops) continue;
        const struct op *o = &g->ops[k];
        enum cost_class c = cost_op_class(o);
        double w = cost_op_work(g, k) * m->seconds_per_unit[c];
        if (half && m->half_speed[c] > 0) w /= m->half_speed[c];
        if (half && m->half_cvt[c]) w += convert_bytes(g, o, o) * m->convert_seconds_per_byte;
        for (int j = 0; half && j < o->n_in; j++) {
            int t = o->in[j];
            if (t < 0 || t >= g->n_tensors || g->tensors[t]->kind != TENSOR_PARAM ||
                graph_input_dtype(g, o, j) == DTYPE_F32)
                continue;
            double b = (double)g->tensors[t]->numel * sizeof(float) * m->convert_seconds_per_byte;
            if (!m->half_cvt[c]) w += b; /* a 16-bit kernel converts it from the master per op */
            else if (copied && !copied[t]) work_copy += b, copied[t] = 1;
        }
        work += w;
        fixed += m->op_seconds[c];
    }
    free(copied);
    if (inference) return work + fixed;
    int micro = st->micro_batch > 0 && st->micro_batch < batch ? st->micro_batch : batch;
    if (micro <= 0) return work + fixed;
    int full = batch / micro, rest = batch % micro;
    double t = (work + fixed) * full + (rest ? work * rest / micro + fixed : 0.0);
    double params = (double)g->param_numel;
    if (st->offload == 1) /* gradients down, weights back up, the optimizer on host threads */
        t += 2.0 * params * sizeof(float) * m->transfer_seconds_per_byte +
             params * m->host_optim_seconds_per_param;
    else
        t += params * m->optim_seconds_per_param;
    /* the 16-bit working copy refreshed from the fp32 weights before each pass */
    t += (full + (rest > 0)) * work_copy;
    return t;
}

double cost_predict_step_seconds(const struct cost_model *m, const struct plan *p,
                                 const struct graph *g, int batch)
{
    return predict(m, g, p->n_run_ops, p->ops ? p->op_src : NULL, p->inference, &p->strategy,
                   batch);
}

double cost_predict_graph_seconds(const struct cost_model *m, const struct graph *g,
                                  const struct strategy *s, int batch)
{
    int *op_src = NULL, n = g->n_ops;
    if (s->recompute > 0) plan_run_order(g, s->recompute, &op_src, &n);
    double t = predict(m, g, op_src ? n : g->n_ops, op_src, 0, s, batch);
    free(op_src);
    return t;
}

/* ---- the calibration file ---- */

static int parse_num(const char *s, char **end, double *v)
{
    errno = 0;
    *v = strtod(s, end);
    return *end == s || errno == ERANGE || !isfinite(*v) || *v < 0 ? -1 : 0;
}

int cost_model_parse(struct cost_model *m, const char *text, char *err, size_t errlen)
{
    struct cost_model w = *m;
    int line = 0;
    const char *s = text;
    while (*s) {
        line++;
        const char *eol = strchr(s, '\n');
        size_t n = eol ? (size_t)(eol - s) : strlen(s);
        char buf[256], key[32];
        if (n >= sizeof buf) {
            snprintf(err, errlen, "line %d: longer than %zu bytes", line, sizeof buf - 1);
            return -1;
        }
        memcpy(buf, s, n);
        buf[n] = 0;
        s += n + (eol ? 1 : 0);
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        int used = 0;
        if (sscanf(buf, " %31s%n", key, &used) != 1) continue; /* blank or comment */
        char *p = buf + used, *end;
        double a, b;
        int c = -1, hc = -1;
        const int cvt = strcmp(key, "half_cvt") == 0;
        if (strcmp(key, "half") == 0 || cvt) { /* half CLASS X, half_cvt CLASS 0|1 */
            char cls[32];
            int u2 = 0;
            if (sscanf(p, " %31s%n", cls, &u2) == 1)
                for (int k = 0; k < COST_CLASS_COUNT; k++)
                    if (strcmp(cls, class_names[k]) == 0) hc = k;
            if (hc < 0) {
                snprintf(err, errlen, "line %d: '%s' needs a class name and a %s", line, key,
                         cvt ? "0 or 1" : "speed");
                return -1;
            }
            p += u2;
        }
        for (int k = 0; k < COST_CLASS_COUNT; k++)
            if (strcmp(key, class_names[k]) == 0) c = k;
        if (parse_num(p, &end, &a)) goto bad;
        p = end;
        if (c >= 0) {
            if (parse_num(p, &end, &b)) goto bad;
            w.seconds_per_unit[c] = a;
            w.op_seconds[c] = b;
            p = end;
        } else if (hc >= 0 && cvt && (a == 0 || a == 1)) {
            w.half_cvt[hc] = (unsigned char)a;
        } else if (hc >= 0 && !cvt && a > 0) {
            w.half_speed[hc] = a;
        } else if (strcmp(key, "threads") == 0 && a >= 1 && a <= 4096 && a == floor(a)) {
            w.threads = (int)a;
        } else if (strcmp(key, "optim") == 0) {
            w.optim_seconds_per_param = a;
        } else if (strcmp(key, "host_optim") == 0) {
            w.host_optim_seconds_per_param = a;
        } else if (strcmp(key, "transfer") == 0) {
            w.transfer_seconds_per_byte = a;
        } else if (strcmp(key, "convert") == 0) {
            w.convert_seconds_per_byte = a;
        } else if (strcmp(key, "half_speedup") == 0 && a > 0) {
            for (int k = 0; k <= COST_ATTN_TILED_BWD; k++) w.half_speed[k] = a;
        } else {
            snprintf(err, errlen, "line %d: unknown key or bad value '%.31s'", line, key);
            return -1;
        }
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (*p) goto bad;
        continue;
    bad:
        snprintf(err, errlen, "line %d: '%.31s' needs %s non-negative number%s", line, key,
                 c >= 0 ? "two" : "one", c >= 0 ? "s (seconds per unit, per op)" : "");
        return -1;
    }
    *m = w;
    return 0;
}

char *cost_model_format(const struct cost_model *m)
{
    size_t cap = 4096;
    char *s = malloc(cap);
    if (!s) return NULL;
    int o = snprintf(s, cap, "# ddpmd cost model (bench/calibrate): class seconds_per_unit "
                             "seconds_per_op; units are FLOPs (conv, gemm, attn) or bytes\n"
                             "threads %d\n", m->threads);
    for (int k = 0; k < COST_CLASS_COUNT; k++)
        o += snprintf(s + o, cap - (size_t)o, "%s %.6g %.6g\n", class_names[k],
                      m->seconds_per_unit[k], m->op_seconds[k]);
    for (int k = 0; k < COST_CLASS_COUNT; k++)
        o += snprintf(s + o, cap - (size_t)o, "half %s %.6g\nhalf_cvt %s %d\n", class_names[k],
                      m->half_speed[k], class_names[k], m->half_cvt[k]);
    snprintf(s + o, cap - (size_t)o, "optim %.6g\nhost_optim %.6g\ntransfer %.6g\nconvert %.6g\n",
             m->optim_seconds_per_param, m->host_optim_seconds_per_param,
             m->transfer_seconds_per_byte, m->convert_seconds_per_byte);
    return s;
}
