/* test_prec: 16-bit precision in graph, plan and executor. The policy (graph_set_precision):
 * which tensors are 16-bit and which stay fp32; the plan's bytes follow the dtypes exactly (every
 * part but the arena and the workspace unchanged, the working weights 2 bytes per GEMM weight
 * element, the arena without reuse smaller by 2 bytes per 16-bit activation element and larger by
 * the planned conversion scratch: one storage of the kernel's dtype for exactly each operand
 * stored in another dtype than its kernel takes, on a backend with bf16 convolutions and linears
 * (half_kernels) and on one without); a strategy that disagrees with the graph is refused. The
 * bf16 step with 16-bit kernels against the same step converting around fp32 kernels and against
 * fp32: loss and every gradient close. Dynamic loss scaling
 * in f16: an input that overflows half range makes the gradients inf/NaN, the step is skipped
 * (weights, EMA and AdamW moments bit-identical across it), the scale backs off, the next step
 * proceeds, and the scale grows after growth_interval finite steps. Checkpoints: the metadata
 * names the precision, weights are saved fp32, an f16 run's loss scale state comes back on
 * resume, and a resume in another precision is refused (its weights still load).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "exec.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "test_util.h"
#include "test_unet_util.h"
#include "unet.h"

static int build(struct graph *g, const struct unet_config *c, int batch, int precision,
                 struct unet_io *io, int *target)
{
    graph_init(g);
    if (unet_build_training(g, c, batch, io, target, NULL)) return -1;
    return graph_set_precision(g, precision);
}

static int weight_slot(const struct op *o, int j)
{
    return ((o->type == OP_CONV2D || o->type == OP_CONV2D_BWD_DATA || o->type == OP_LINEAR) &&
            j == 1) ||
           (o->type == OP_LINEAR_BWD && j == 2);
}

/* which tensors the policy made 16-bit */
static void policy(const struct graph *g, const char *name)
{
    long bad_kind = 0, conv_in32 = 0, kept32 = 0, stats16 = 0, n16 = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->dtype != DTYPE_F32) {
            n16++;
            CHECK(t->dtype == DTYPE_BF16, "%s: tensor %d is dtype %d", name, i, (int)t->dtype);
            bad_kind += t->kind != TENSOR_ACT;
        }
    }
    for (int k = 0; k < g->n_ops; k++) {
        const struct op *o = &g->ops[k];
        /* convolution and GEMM inputs: 16-bit unless they are data (x_t, an input) */
        if (o->type == OP_CONV2D || o->type == OP_LINEAR)
            conv_in32 += g->tensors[o->in[0]]->kind == TENSOR_ACT &&
                         g->tensors[o->in[0]]->dtype == DTYPE_F32;
        /* what the forward keeps for the backward: 16-bit, but statistics, softmax, loss */
        if (k < g->n_fwd_ops && o->type != OP_MSE && o->out[0] >= 0) {
            int read_later = 0;
            for (int b = g->n_fwd_ops; b < g->n_ops && !read_later; b++)
                for (int j = 0; j < g->ops[b].n_in; j++) read_later |= g->ops[b].in[j] == o->out[0];
            kept32 += read_later && g->tensors[o->out[0]]->dtype == DTYPE_F32;
        }
        if (o->type == OP_GROUPNORM || o->type == OP_LAYERNORM || o->type == OP_ATTENTION ||
            o->type == OP_MSE)
            for (int j = o->type == OP_MSE ? 0 : 1; j < o->n_out; j++)
                stats16 += o->out[j] >= 0 && g->tensors[o->out[j]]->dtype != DTYPE_F32;
    }
    CHECK(n16 > 0, "%s: nothing is 16-bit", name);
    CHECK(bad_kind == 0, "%s: %ld parameters, gradients or inputs are 16-bit", name, bad_kind);
    CHECK(conv_in32 == 0, "%s: %ld convolution/linear activation inputs stay fp32", name, conv_in32);
    CHECK(kept32 == 0, "%s: %ld activations kept for the backward stay fp32", name, kept32);
    CHECK(stats16 == 0, "%s: %ld statistics, softmax or loss tensors are 16-bit", name, stats16);
}

static size_t al(size_t x) { return plan_align(x); }

/* the dtype op o's kernel computes on where the backend runs the bf16 kernels of `half` (enum
 * bk_half bits): the convolutions and linears', every other op's fp32 */
static int kernel_dtype(const struct op *o, unsigned half)
{
    unsigned bit = o->type == OP_CONV2D || o->type == OP_CONV2D_BWD_DATA ||
                           o->type == OP_CONV2D_BWD_FILTER
                       ? BK_HALF_CONV
                   : o->type == OP_LINEAR || o->type == OP_LINEAR_BWD ? BK_HALF_LINEAR
                                                                      : 0;
    return half & bit ? DTYPE_BF16 : DTYPE_F32;
}

/* the CPU backend with bf16 convolutions and linears wherever it runs (oneDNN emulates them on
 * AVX-512 cores without AVX512-BF16), and without any 16-bit kernels */
static unsigned forced_half(int dtype)
{
    return dtype == DTYPE_BF16 ? BK_HALF_CONV | BK_HALF_LINEAR : 0;
}
/* bf16 convolutions, fp32 linears: the linears' weights keep a working copy, the
 * convolutions' are converted per op */
static unsigned forced_conv_half(int dtype) { return dtype == DTYPE_BF16 ? BK_HALF_CONV : 0; }
static struct backend native_bk, scratch_bk, mixed_bk;
static void tables(void)
{
    native_bk = scratch_bk = mixed_bk = *backend_cpu();
    native_bk.half_kernels = forced_half;
    scratch_bk.half_kernels = NULL;
    mixed_bk.half_kernels = forced_conv_half;
}

/* the plan's bytes against what the dtypes say, on bk */
static void bytes(enum unet_preset preset, int batch, const struct backend *bk)
{
    char name[64];
    const unsigned half = bk->half_kernels ? bk->half_kernels(DTYPE_BF16) : 0;
    snprintf(name, sizeof name, "%s (%s)", preset == UNET_DDPM ? "ddpm" : "seed",
             half == (BK_HALF_CONV | BK_HALF_LINEAR) ? "bf16 kernels"
             : half                                 ? "bf16 convolutions, fp32 linears"
                                                    : "fp32 kernels");
    struct unet_config c;
    tu_small_unet(&c, preset);
    struct graph g32, g16;
    struct unet_io io;
    int target;
    CHECK(build(&g32, &c, batch, STRATEGY_PRECISION_F32, &io, &target) == 0, "%s: f32", name);
    CHECK(build(&g16, &c, batch, STRATEGY_PRECISION_BF16, &io, &target) == 0, "%s: bf16", name);
    policy(&g16, name);
    /* unfused too: a fused group norm's add leaves out a tensor (plan_fusions) in the f32 plan
     * that the bf16 plan's converted operands keep */
    struct plan_opts nr32 = {.no_reuse = 1, .no_fuse = 1}, nr16 = nr32, r16 = {0};
    nr16.strategy.precision = r16.strategy.precision = STRATEGY_PRECISION_BF16;
    struct plan a, b, ra, rb;
    CHECK(plan_make(&a, &g32, bk, &nr32) == PLAN_OK, "%s: plan f32", name);
    CHECK(plan_make(&b, &g16, bk, &nr16) == PLAN_OK, "%s: plan bf16", name);
    CHECK(plan_make(&ra, &g32, bk, NULL) == PLAN_OK, "%s: plan f32 reuse", name);
    CHECK(plan_make(&rb, &g16, bk, &r16) == PLAN_OK, "%s: plan bf16 reuse", name);
    /* the parts the dtypes leave alone (the workspace too, without 16-bit kernels) */
    CHECK(a.params_bytes == b.params_bytes && a.grads_bytes == b.grads_bytes &&
          a.adam_bytes == b.adam_bytes && a.ema_bytes == b.ema_bytes &&
          a.inputs_bytes == b.inputs_bytes && (half || a.ws_bytes == b.ws_bytes),
          "%s: a part other than the arena and the working weights changed", name);
    CHECK(a.work_bytes == 0 && a.n_cvt == 0, "%s: an f32 plan has working weights or scratch",
          name);
    /* the working weights: 2 bytes per element of each weight an fp32 kernel reads (a 16-bit
     * kernel converts its weight from the fp32 master into scratch of its own) */
    size_t work = 0;
    char *seen = calloc((size_t)g16.n_tensors, 1);
    for (int k = 0; k < g16.n_ops; k++)
        for (int j = 0; j < g16.ops[k].n_in; j++) {
            int t = g16.ops[k].in[j];
            if (t >= 0 && weight_slot(&g16.ops[k], j) && !seen[t] &&
                kernel_dtype(&g16.ops[k], half) == DTYPE_F32) {
                seen[t] = 1;
                work += al(2 * g16.tensors[t]->numel);
            }
        }
    CHECK(b.work_bytes == work, "%s: working weights %zu bytes, the weights say %zu", name,
          b.work_bytes, work);
    /* without reuse every activation has its own bytes: 2 per element fewer for a 16-bit one,
     * plus a scratch of the kernel's dtype per operand stored in another, living for that op:
     * a convolution's or linear's x, w, y and their gradients are bf16 to a 16-bit kernel, its
     * bias and parameter gradients fp32, and everything of every other op fp32 */
    size_t saved = 0, scratch = 0;
    for (int i = 0; i < g16.n_tensors; i++) {
        const struct tensor *t = g16.tensors[i];
        if (t->kind == TENSOR_ACT && t->dtype != DTYPE_F32 && b.storage[i] >= 0)
            saved += al(4 * t->numel) - al(2 * t->numel);
    }
    long bad_cvt = 0, want_cvt = 0, half_ops = 0;
    for (int k = 0; k < b.n_run_ops; k++) {
        const struct op *o = &g16.ops[k];
        int kd = kernel_dtype(o, half);
        half_ops += kd != DTYPE_F32;
        bad_cvt += b.op_dtype[k] != kd;
        for (int j = 0; j < o->n_in + o->n_out; j++) {
            int in = j < o->n_in, t = in ? o->in[j] : o->out[j - o->n_in];
            if (t < 0) continue;
            const struct tensor *tt = g16.tensors[t];
            /* a weight: its working copy where it has one, else the fp32 master */
            int stored = in && tt->kind == TENSOR_PARAM && weight_slot(o, j) && seen[t]
                             ? DTYPE_BF16
                             : (int)tt->dtype;
            int bias_or_grad = tt->kind == TENSOR_GRAD || (tt->kind == TENSOR_PARAM &&
                                                           !weight_slot(o, j));
            int want = kd != DTYPE_F32 && !bias_or_grad ? kd : DTYPE_F32;
            /* a 16-bit convolution of a backend that rounds its weights itself (conv_w_f32)
             * reads the fp32 master as it is */
            if (in && tt->kind == TENSOR_PARAM && weight_slot(o, j) && bk->conv_w_f32 &&
                (o->type == OP_CONV2D || o->type == OP_CONV2D_BWD_DATA))
                want = DTYPE_F32;
            const struct plan_cvt *c = NULL;
            for (int i = b.cvt_start[k]; i < b.cvt_start[k + 1]; i++)
                if (b.cvt[i].tensor == t) c = &b.cvt[i];
            want_cvt += stored != want;
            if (stored == want) {
                bad_cvt += c != NULL;
                continue;
            }
            const struct plan_storage *s = c ? &b.st[c->storage] : NULL;
            bad_cvt += !c || c->dtype != stored || c->kdtype != want ||
                       s->bytes != bk_dtype_size(want) * tt->numel || s->first != k ||
                       s->last != k;
        }
    }
    free(seen);
    for (int i = 0; i < b.n_cvt; i++) scratch += al(b.st[b.cvt[i].storage].bytes);
    CHECK(bad_cvt == 0 && b.n_cvt == want_cvt && b.n_half_ops == half_ops,
          "%s: %ld conversions or kernel dtypes not as the operands' dtypes say (%d planned, %ld "
          "wanted; %d 16-bit ops, %ld wanted)", name, bad_cvt, b.n_cvt, want_cvt, b.n_half_ops,
          half_ops);
    CHECK(b.arena_bytes == a.arena_bytes - saved + scratch,
          "%s: arena without reuse %zu, the dtypes say %zu - %zu + %zu", name, b.arena_bytes,
          a.arena_bytes, saved, scratch);
    printf("%s b%d: f32 plan %zu bytes (arena %zu), bf16 %zu (arena %zu, working weights %zu, "
           "%d conversion scratch storages, %d ops on 16-bit kernels)\n", name, batch,
           ra.total_bytes, ra.arena_bytes, rb.total_bytes, rb.arena_bytes, rb.work_bytes, rb.n_cvt,
           rb.n_half_ops);
    /* a strategy that disagrees with the graph */
    struct plan x;
    CHECK(plan_make(&x, &g16, bk, NULL) == PLAN_ERR_ARG, "%s: a bf16 graph planned as f32", name);
    CHECK(plan_make(&x, &g32, bk, &r16) == PLAN_ERR_ARG, "%s: an f32 graph planned as bf16", name);
    CHECK(graph_set_precision(&g32, 7) == GRAPH_ERR_ARG, "%s: precision 7 accepted", name);
    plan_free(&a);
    plan_free(&b);
    plan_free(&ra);
    plan_free(&rb);
    graph_free(&g32);
    graph_free(&g16);
}

/* on a model as large as fmnist-tiny's, bf16 plans fewer bytes than f32 */
static void smaller(void)
{
    struct unet_config c;
    unet_config_default(&c, UNET_DDPM);
    c.in_channels = c.out_channels = 1;
    c.image_size = 32;
    c.n_levels = 3;
    c.channels[0] = 32;
    c.channels[1] = c.channels[2] = 64;
    c.layers_per_block = 1;
    c.attn_res[0] = 8;
    c.groups = 8;
    struct graph g32, g16;
    struct unet_io io;
    int target;
    CHECK(build(&g32, &c, 32, STRATEGY_PRECISION_F32, &io, &target) == 0, "fmnist-tiny f32");
    CHECK(build(&g16, &c, 32, STRATEGY_PRECISION_BF16, &io, &target) == 0, "fmnist-tiny bf16");
    struct plan_opts o16 = {0};
    o16.strategy.precision = STRATEGY_PRECISION_BF16;
    struct plan a, b;
    CHECK(plan_make(&a, &g32, backend_cpu(), NULL) == PLAN_OK, "plan f32");
    CHECK(plan_make(&b, &g16, backend_cpu(), &o16) == PLAN_OK, "plan bf16");
    printf("fmnist-tiny b32: f32 plan %.2f MiB (arena %.2f), bf16 %.2f MiB (arena %.2f, working "
           "weights %.2f)\n", a.total_bytes / 1048576.0, a.arena_bytes / 1048576.0,
           b.total_bytes / 1048576.0, b.arena_bytes / 1048576.0, b.work_bytes / 1048576.0);
    CHECK(b.arena_bytes < a.arena_bytes && b.total_bytes < a.total_bytes,
          "fmnist-tiny b32: bf16 plans %zu bytes (arena %zu), f32 %zu (arena %zu)", b.total_bytes,
          b.arena_bytes, a.total_bytes, a.arena_bytes);
    plan_free(&a);
    plan_free(&b);
    graph_free(&g32);
    graph_free(&g16);
}

/* ---- loss scaling ---- */

struct job {
    struct graph g;
    struct unet_io io;
    int target;
    struct plan p;
    struct exec *e;
};

static const struct strategy_loss_scale ls_cfg = {.initial = 1024.0f, .growth = 2.0f,
                                                   .backoff = 0.5f, .growth_interval = 2};

static int job_init_bk(struct job *j, int precision, const struct backend *bk)
{
    struct unet_config c;
    tu_small_unet(&c, UNET_DDPM);
    memset(j, 0, sizeof *j);
    if (build(&j->g, &c, 2, precision, &j->io, &j->target)) return -1;
    struct plan_opts po = {0};
    po.strategy.precision = precision;
    po.strategy.loss_scale = ls_cfg;
    struct exec_opts eo = {.threads = 2, .poison = 1, .check_guards = 1};
    if (plan_make(&j->p, &j->g, bk, &po)) return -1;
    if (exec_init(&j->e, &j->g, &j->p, bk, &eo)) return -1;
    float *h = malloc(j->g.param_numel * sizeof *h);
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(j->g.tensors[i], 42, h);
            exec_upload(j->e, i, h);
        }
    free(h);
    return exec_reset_state(j->e);
}

static int job_init(struct job *j, int precision)
{
    return job_init_bk(j, precision, backend_cpu());
}

static void job_free(struct job *j)
{
    exec_free(j->e);
    plan_free(&j->p);
    graph_free(&j->g);
}

/* a batch for step s; x_t multiplied by amp (1e6: the first convolution's output overflows half
 * range, 65504) */
static void feed(struct job *j, int s, float amp)
{
    size_t n = j->g.tensors[j->io.x]->numel;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), t[2] = {17.0f, 600.0f};
    for (size_t i = 0; i < n; i++) {
        x[i] = amp * philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 0, 0, (uint32_t)i);
        y[i] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 1, 0, (uint32_t)i);
    }
    exec_upload(j->e, j->io.x, x);
    exec_upload(j->e, j->io.t, t);
    exec_upload(j->e, j->target, y);
    free(x);
    free(y);
}

/* weights, EMA, AdamW moments of every parameter, in one host buffer */
static float *state(struct job *j)
{
    float *h = malloc(4 * j->g.param_numel * sizeof *h), *d = h;
    for (int part = EXEC_PART_WEIGHT; part <= EXEC_PART_ADAM_V; part++)
        for (int i = 0; i < j->g.n_tensors; i++)
            if (j->g.tensors[i]->kind == TENSOR_PARAM) {
                exec_download_part(j->e, (enum exec_part)part, i, d);
                d += j->g.tensors[i]->numel;
            }
    return h;
}

static const struct optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                       .weight_decay = 0.01f, .clip = 1.0f, .ema_decay = 0.99f};

/* one f16 step (the executor scales the loss); returns whether the optimizer applied it */
static int ls_step(struct job *j, int s, float *loss)
{
    float norm = 0;
    int64_t skipped = exec_loss_scaler(j->e)->skipped;
    int rc = exec_forward_backward(j->e, 1, 1.0f, 11, (uint64_t)s, 0, loss);
    if (!rc) rc = exec_optimizer_step(j->e, &oc, s + 1, oc.lr, &norm);
    CHECK(rc == EXEC_OK, "step %d: %s", s, exec_last_error(j->e)->msg);
    return exec_loss_scaler(j->e)->skipped == skipped;
}

static void loss_scaling(void)
{
    struct job j;
    CHECK(job_init(&j, STRATEGY_PRECISION_F16) == 0, "f16 job");
    const struct loss_scaler *ls = exec_loss_scaler(j.e);
    CHECK(ls->scale == 1024.0f && ls->skipped == 0, "the scale starts at the strategy's initial");
    float loss = 0;
    feed(&j, 0, 1.0f);
    CHECK(ls_step(&j, 0, &loss) == 1 && isfinite(loss), "a normal f16 step is applied (loss %g)",
          loss);
    CHECK(ls->scale == 1024.0f && ls->good_steps == 1 && ls->skipped == 0,
          "after one finite step: scale %g, %d good, %lld skipped", ls->scale, ls->good_steps,
          (long long)ls->skipped);
    float *before = state(&j);
    feed(&j, 1, 1e6f);
    CHECK(ls_step(&j, 1, &loss) == 0, "an input beyond half range: the step was not skipped");
    CHECK(ls->scale == 512.0f && ls->good_steps == 0 && ls->skipped == 1,
          "after the overflow: scale %g (want 512), %d good, %lld skipped", ls->scale,
          ls->good_steps, (long long)ls->skipped);
    float *after = state(&j);
    CHECK(memcmp(before, after, 4 * j.g.param_numel * sizeof(float)) == 0,
          "weights, EMA or AdamW moments changed across the skipped step");
    feed(&j, 2, 1.0f);
    CHECK(ls_step(&j, 2, &loss) == 1 && isfinite(loss), "the step after the skip is applied");
    float *next = state(&j);
    CHECK(memcmp(before, next, j.g.param_numel * sizeof(float)) != 0,
          "the step after the skip left the weights unchanged");
    feed(&j, 3, 1.0f);
    ls_step(&j, 3, &loss);
    CHECK(ls->scale == 1024.0f && ls->good_steps == 0 && ls->skipped == 1,
          "two finite steps with growth_interval 2: scale %g (want 1024), %d good", ls->scale,
          ls->good_steps);
    free(before);
    free(after);
    free(next);
    job_free(&j);
    /* an f16 plan needs loss scaling it can run with */
    struct graph g;
    struct unet_io io;
    int target;
    struct unet_config c;
    tu_small_unet(&c, UNET_DDPM);
    CHECK(build(&g, &c, 1, STRATEGY_PRECISION_F16, &io, &target) == 0, "f16 graph");
    struct plan_opts po = {0};
    po.strategy.precision = STRATEGY_PRECISION_F16;
    struct plan p;
    CHECK(plan_make(&p, &g, backend_cpu(), &po) == PLAN_ERR_ARG, "f16 without a loss scale");
    po.strategy.loss_scale = ls_cfg;
    po.strategy.loss_scale.backoff = 1.0f;
    CHECK(plan_make(&p, &g, backend_cpu(), &po) == PLAN_ERR_ARG, "f16 with backoff 1");
    graph_free(&g);
}

/* every parameter gradient of j's last backward, in one host buffer */
static float *grads(struct job *j)
{
    float *h = malloc(j->g.param_numel * sizeof *h), *d = h;
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->kind == TENSOR_GRAD) {
            exec_download(j->e, i, d);
            d += j->g.tensors[i]->numel;
        }
    return h;
}

/* the bf16 step on 16-bit kernels against the bf16 step on fp32 kernels (the same bf16 values
 * in, so the same to rounding and summation order) and against fp32 (bf16 storage's error) */
static void kernels_step(void)
{
    struct job f, n, s;
    CHECK(job_init(&f, STRATEGY_PRECISION_F32) == 0, "f32 job");
    CHECK(job_init_bk(&n, STRATEGY_PRECISION_BF16, &native_bk) == 0, "bf16 job, bf16 kernels");
    CHECK(job_init_bk(&s, STRATEGY_PRECISION_BF16, &scratch_bk) == 0, "bf16 job, fp32 kernels");
    CHECK(n.p.n_half_ops > 0 && s.p.n_half_ops == 0, "ops on 16-bit kernels: %d and %d",
          n.p.n_half_ops, s.p.n_half_ops);
    struct job *js[3] = {&f, &n, &s};
    float loss[3] = {0, 0, 0}, *g[3];
    for (int i = 0; i < 3; i++) {
        feed(js[i], 0, 1.0f);
        CHECK(exec_forward_backward(js[i]->e, 1, 1.0f, 11, 0, 0, &loss[i]) == EXEC_OK,
              "step %d: %s", i, exec_last_error(js[i]->e)->msg);
        g[i] = grads(js[i]);
    }
    size_t np = f.g.param_numel;
    double e_ns = tu_rel_err_f(g[1], g[2], np), e_nf = tu_rel_err_f(g[1], g[0], np),
           e_sf = tu_rel_err_f(g[2], g[0], np);
    /* the worst single parameter's gradient, 16-bit kernels against fp32 ones, relative to its
     * own norm with a floor of 1e-3 of the whole gradient's (some are 0 but for rounding: a key
     * bias does not change the softmax) */
    double worst = 0, all = 0;
    for (size_t i = 0; i < np; i++) all += (double)g[2][i] * g[2][i];
    const char *wname = "";
    size_t off = 0;
    for (int i = 0; i < f.g.n_tensors; i++) {
        const struct tensor *t = f.g.tensors[i];
        if (t->kind != TENSOR_GRAD) continue;
        double num = 0, den = 0;
        for (size_t k = off; k < off + t->numel; k++) {
            num += ((double)g[1][k] - g[2][k]) * ((double)g[1][k] - g[2][k]);
            den += (double)g[2][k] * g[2][k];
        }
        double e = sqrt(num) / (sqrt(den) + 1e-3 * sqrt(all));
        if (e > worst || isnan(e)) {
            worst = e;
            wname = t->name;
        }
        off += t->numel;
    }
    printf("bf16 step: loss f32 %.7f, bf16 kernels %.7f, fp32 kernels %.7f; gradients: bf16 vs "
           "fp32 kernels %.2e (worst tensor %.2e, %s), bf16 kernels vs f32 %.2e, fp32 kernels vs "
           "f32 %.2e\n", loss[0], loss[1], loss[2], e_ns, worst, wname, e_nf, e_sf);
    CHECK(fabsf(loss[1] - loss[2]) <= 2e-3f * fabsf(loss[2]) &&
              fabsf(loss[1] - loss[0]) <= 1e-2f * fabsf(loss[0]),
          "losses: f32 %.7f, bf16 kernels %.7f, fp32 kernels %.7f", loss[0], loss[1], loss[2]);
    CHECK(e_ns < 3e-2 && worst < 0.1, "bf16 kernels against fp32 kernels: gradients %.3e apart "
          "(worst tensor %.3e, %s)", e_ns, worst, wname);
    CHECK(e_nf < 3e-2 && e_nf < 2.0 * e_sf + 1e-3, "bf16 kernels against f32: gradients %.3e "
          "apart (fp32 kernels on bf16 storage: %.3e)", e_nf, e_sf);
    for (int i = 0; i < 3; i++) {
        free(g[i]);
        job_free(js[i]);
    }
}

static void checkpoints(void)
{
    struct job a, b, c;
    CHECK(job_init(&a, STRATEGY_PRECISION_F16) == 0, "f16 job");
    float loss;
    feed(&a, 0, 1.0f);
    ls_step(&a, 0, &loss);
    feed(&a, 1, 1e6f);
    ls_step(&a, 1, &loss); /* skipped: scale 512, 1 skipped */
    feed(&a, 2, 1.0f);
    ls_step(&a, 2, &loss); /* 1 good step */
    struct train_spec spec;
    spec_defaults(&spec);
    tu_small_unet(&spec.model, UNET_DDPM);
    snprintf(spec.dataset, sizeof spec.dataset, "fashion-mnist");
    char path[] = "/tmp/test_prec_XXXXXX", file[64], err[256] = "";
    CHECK(mkdtemp(path) != NULL, "mkdtemp");
    snprintf(file, sizeof file, "%s/c.safetensors", path);
    CHECK(checkpoint_save(file, a.e, &a.g, &spec, NULL, 3, err, sizeof err) == 0, "save: %s", err);
    struct safetensors *st = NULL;
    CHECK(checkpoint_open(&st, file, NULL, NULL, err, sizeof err) == 0, "open: %s", err);
    const char *prec = st ? safetensors_meta(st, "precision") : NULL;
    CHECK(prec && strcmp(prec, "f16") == 0, "metadata precision '%s'", prec ? prec : "(none)");
    const struct st_tensor *t = NULL;
    int w0 = -1;
    for (int i = 0; i < a.g.n_tensors && w0 < 0; i++)
        if (a.g.tensors[i]->kind == TENSOR_PARAM) w0 = i;
    CHECK(st && safetensors_find(st, a.g.tensors[w0]->name, &t) == 0 && t->dtype == ST_F32,
          "weights are not saved as F32");
    /* a resume: the same state, the loss scale included */
    CHECK(job_init(&b, STRATEGY_PRECISION_F16) == 0, "f16 job b");
    CHECK(checkpoint_apply(st, b.e, &b.g, CHECKPOINT_ALL, 0, err, sizeof err) == 0, "apply: %s",
          err);
    const struct loss_scaler *la = exec_loss_scaler(a.e), *lb = exec_loss_scaler(b.e);
    CHECK(la->scale == 512.0f && la->skipped == 1 && la->good_steps == 1,
          "the run's state before saving: scale %g, %lld skipped, %d good", la->scale,
          (long long)la->skipped, la->good_steps);
    CHECK(lb->scale == la->scale && lb->skipped == la->skipped && lb->good_steps == la->good_steps,
          "loss scale state after resume: scale %g, %lld skipped, %d good", lb->scale,
          (long long)lb->skipped, lb->good_steps);
    float *sa = state(&a), *sb = state(&b);
    CHECK(memcmp(sa, sb, 4 * a.g.param_numel * sizeof(float)) == 0, "state differs after resume");
    /* the next step of both is the same, bit for bit */
    float l1, l2;
    feed(&a, 3, 1.0f);
    feed(&b, 3, 1.0f);
    ls_step(&a, 3, &l1);
    ls_step(&b, 3, &l2);
    free(sa);
    free(sb);
    sa = state(&a);
    sb = state(&b);
    CHECK(memcmp(&l1, &l2, 4) == 0 && memcmp(sa, sb, 4 * a.g.param_numel * sizeof(float)) == 0,
          "the step after a resume differs");
    /* another precision: no resume, but the fp32 weights load */
    CHECK(job_init(&c, STRATEGY_PRECISION_BF16) == 0, "bf16 job");
    err[0] = 0;
    CHECK(checkpoint_apply(st, c.e, &c.g, CHECKPOINT_ALL, 0, err, sizeof err) != 0 &&
          strstr(err, "f16") && strstr(err, "bf16"), "a bf16 resume of an f16 run: '%s'", err);
    CHECK(checkpoint_apply(st, c.e, &c.g, CHECKPOINT_WEIGHTS, 0, err, sizeof err) == 0,
          "loading an f16 run's weights into bf16: %s", err);
    free(sa);
    free(sb);
    safetensors_free(st);
    remove(file);
    rmdir(path);
    job_free(&a);
    job_free(&b);
    job_free(&c);
}

int main(void)
{
    tables();
    bytes(UNET_DDPM, 3, &scratch_bk);
    bytes(UNET_SEED, 2, &scratch_bk);
    bytes(UNET_DDPM, 3, &native_bk);
    bytes(UNET_SEED, 2, &native_bk);
    bytes(UNET_DDPM, 3, &mixed_bk);
    bytes(UNET_SEED, 2, &mixed_bk);
    smaller();
    kernels_step();
    loss_scaling();
    checkpoints();
    return tu_finish("test_prec");
}
