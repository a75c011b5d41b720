/* test_gpu_step.c - one training step of each preset (small sizes) on the CUDA backend against the
 * CPU backend, through the same graph, planner and executor: the loss and every parameter
 * gradient within 1e-4 (norm-wise relative), and the weights, AdamW moments and EMA after the
 * optimizer step too. The memory promise on the device: the job's device memory is its plan
 * (one reservation, nothing more during steps 1 and 2: the kernels its library calls need are
 * loaded before the reservation, and counted as the process's), the arena's high-water mark is the
 * planned arena, canaries hold; a request over the device's memory fails cleanly and poisons
 * nothing. Then two steps in bf16 (ddpm, head dim 16: the attention forward on tensor cores) and
 * f16 (seed, loss scaling) against the CPU's 16-bit steps, measured against the 16-bit steps' own
 * distance from fp32 (TOL16_RATIO). Both backends run NHWC images (the image <-> token changes
 * around attention in place); a 16-bit plan converts no operand of a memory-bound op (the typed
 * kernels take them as they are); a step with the group-norm fusions gives the unfused step's
 * bits.
 * Fast mode (set_parity(0)): an fp32 step within TF32's tolerance of the CPU's and not parity's
 * bits, the convolution algorithms measured once per shape and mode (a second job of the same
 * shapes measures nothing), and under the emulator the library calls that only fast mode makes
 * (TF32 convolutions and GEMMs, non-deterministic and Winograd/FFT algorithms) seen in fast mode
 * and never in parity mode. Without a GPU: "SKIPPED: no CUDA device", exit 77 (ctest: skipped).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <dlfcn.h>

#include "backend_load.h"
#include "emu/emu_graph.h"
#include "exec.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "test_util.h"
#include "test_unet_util.h"
#include "unet.h"

/* step 1: loss and gradients within 1e-4. Step 2 starts from weights that differ where AdamW
 * turned rounding noise into whole steps (check_after_adamw): 1e-3 there */
#define TOL 1e-4
#define TOL_STEP2 1e-3
/* 16-bit steps: the two backends' 16-bit steps differ by rounding flips (a value one ulp apart
 * where the fp32 results straddle a rounding boundary) that the network amplifies, as a 16-bit
 * step differs from the fp32 one. Gradients: the root sum of squares of the per-tensor errors
 * (grad_err) of the GPU's against the CPU's, at most TOL16_RATIO x the CPU 16-bit step's against
 * the CPU fp32 step's (measured 0.79 to 1.29 with the GPU's 16-bit kernels, whose biased outputs
 * are rounded twice; 0.49 to 0.91 on fp32 kernels over converted scratch) */
#define TOL16_RATIO 1.5
#define GRANULE ((size_t)2 << 20) /* cudaMalloc rounds large requests up to 2 MiB */

static const struct backend *G;

struct job {
    const struct backend *bk;
    struct graph g;
    struct unet_io io;
    int target, loss;
    struct plan p;
    struct exec *e;
};

static void small_config(struct unet_config *c, enum unet_preset preset, int tiled)
{
    tu_small_unet(c, preset);
    c->attn_tiled = tiled;
    if (preset == UNET_DDPM) c->dropout = 0.1f; /* the same Philox masks on both backends */
}

static int job_init(struct job *j, const struct backend *bk, const struct unet_config *c,
                    int batch, const struct plan_opts *po, const struct exec_opts *eo)
{
    memset(j, 0, sizeof *j);
    j->bk = bk;
    graph_init(&j->g);
    if (unet_build_training(&j->g, c, batch, &j->io, &j->target, &j->loss)) return -1;
    if (po && po->strategy.precision && graph_set_precision(&j->g, po->strategy.precision))
        return -1;
    if (plan_make(&j->p, &j->g, bk, po)) return -2;
    if (eo == NULL) return 0; /* planned only */
    int rc = exec_init(&j->e, &j->g, &j->p, bk, eo);
    if (rc) return 100 + rc;
    size_t maxn = 0;
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->numel > maxn) maxn = j->g.tensors[i]->numel;
    float *h = malloc(maxn * sizeof *h);
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(j->g.tensors[i], 42, h);
            if (j->g.tensors[i]->init == INIT_ONES || j->g.tensors[i]->init == INIT_ZEROS)
                for (size_t k = 0; k < j->g.tensors[i]->numel; k++)
                    h[k] += 0.1f * (philox_uniform_at(7, 1, (uint64_t)i, 0, 0, (uint32_t)k) - 0.5f);
            exec_upload(j->e, i, h);
        }
    free(h);
    exec_reset_state(j->e);
    return 0;
}

static void job_free(struct job *j)
{
    exec_free(j->e);
    plan_free(&j->p);
    graph_free(&j->g);
}

static void feed(struct job *j, int s)
{
    size_t n = j->g.tensors[j->io.x]->numel;
    int b = j->g.tensors[j->io.x]->d[0];
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), t[64];
    for (size_t i = 0; i < n; i++) {
        x[i] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 0, 0, (uint32_t)i);
        y[i] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 1, 0, (uint32_t)i);
    }
    for (int i = 0; i < b; i++) t[i] = (float)((s * 131 + i * 377) % 1000);
    exec_upload(j->e, j->io.x, x);
    exec_upload(j->e, j->io.t, t);
    exec_upload(j->e, j->target, y);
    free(x);
    free(y);
}

static const struct optim_config OC = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                                       .eps = 1e-8f, .weight_decay = 0.01f, .clip = 1.0f,
                                       .ema_decay = 0.99f};
/* 16-bit steps: without clipping, whose factor follows the global norm and so differs between
 * the backends by more than the 1% check_after_adamw bounds the moments by */
static const struct optim_config OC16 = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                                         .eps = 1e-8f, .weight_decay = 0.01f, .clip = 0.0f,
                                         .ema_decay = 0.99f};

static void dl(struct job *j, int id, int part, float *h)
{
    if (part < 0)
        exec_download(j->e, id, h);
    else
        exec_download_part(j->e, (enum exec_part)part, id, h);
}

/* the CPU's global gradient norm */
static double grad_norm(struct job *c, float *y)
{
    double ss = 0;
    for (int i = 0; i < c->g.n_tensors; i++)
        if (c->g.tensors[i]->kind == TENSOR_GRAD) {
            dl(c, i, -1, y);
            for (size_t k = 0; k < c->g.tensors[i]->numel; k++) ss += (double)y[k] * y[k];
        }
    return sqrt(ss);
}

/* gradient id of job a times sa against b's: norm-wise relative, the norm never below 1e-3
 * of the global gradient norm: some gradients are zero in exact arithmetic (the attention key
 * bias: softmax ignores a shift of a whole row of scores) and both backends leave ~1e-10 of
 * rounding there, which no relative measure can compare */
static double grad_err_scaled(struct job *a, double sa, struct job *b, int id, double gnorm,
                              float *x, float *y)
{
    size_t n = a->g.tensors[id]->numel;
    dl(a, id, -1, x);
    dl(b, id, -1, y);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return INFINITY;
        const double xv = sa * x[i];
        num += (xv - y[i]) * (xv - y[i]);
        den += (double)y[i] * y[i];
    }
    den = sqrt(den);
    if (den < 1e-3 * gnorm) den = 1e-3 * gnorm;
    return den > 0 ? sqrt(num) / den : sqrt(num);
}

/* the GPU job's gradient id against the CPU's */
static double grad_err(struct job *a, struct job *b, int id, double gnorm, float *x, float *y)
{
    return grad_err_scaled(a, 1.0, b, id, gnorm, x, y);
}

/* after AdamW: weights, EMA and moments norm-wise within tol over the elements whose gradient the
 * backends agree on to 1%; AdamW divides by sqrt(v), so where a gradient is rounding noise (see
 * grad_err) the step's sign is noise too: those weights must stay within one step (lr).
 * 16-bit (sixteen): gradients disagree beyond 1% in many elements and AdamW turns that into whole
 * steps from the first one on, so after step 0 the weights and EMA are within TOL (same sign,
 * same step) and m, v within what the 1% filter bounds (1%, 2.01%; no clipping: OC16); after
 * step s every weight is within 2.01 (s + 1) lr of the CPU's (one AdamW step moves a weight by
 * at most 1.0014 lr in the first two steps, plus weight decay: Cauchy-Schwarz on m-hat /
 * sqrt(v-hat)). */
static void check_after_adamw(const char *name, int s, struct job *a, struct job *b, float lr,
                              double tol, int sixteen)
{
    size_t maxn = 0;
    for (int i = 0; i < a->g.n_tensors; i++)
        if (a->g.tensors[i]->numel > maxn) maxn = a->g.tensors[i]->numel;
    float *ga = malloc(maxn * 4), *gb = malloc(maxn * 4), *x = malloc(maxn * 4),
          *y = malloc(maxn * 4);
    double worst[4] = {0, 0, 0, 0}, far = 0, far_all = 0;
    size_t noisy = 0;
    for (int i = 0; i < a->g.n_tensors; i++) {
        const struct tensor *t = a->g.tensors[i];
        if (t->kind != TENSOR_PARAM || t->grad < 0) continue;
        dl(a, t->grad, -1, ga);
        dl(b, t->grad, -1, gb);
        for (int part = 0; part < 4; part++) {
            dl(a, i, part, x);
            dl(b, i, part, y);
            double num = 0, den = 0;
            for (size_t k = 0; k < t->numel; k++) {
                if (part == 0 && !(fabs((double)x[k] - y[k]) <= far_all))
                    far_all = fabs((double)x[k] - y[k]);
                if (fabsf(ga[k] - gb[k]) > 1e-2f * fabsf(gb[k])) {
                    if (part == 0) {
                        noisy++;
                        double d = fabs((double)x[k] - y[k]);
                        if (d > far) far = d;
                    }
                    continue;
                }
                num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
                den += (double)y[k] * y[k];
            }
            /* a tensor whose values are all below 1e-9 (to_k.bias's moments: its gradient is
             * zero in exact arithmetic, softmax ignores a per-key constant) holds rounding noise
             * only; its absolute error is compared */
            double e = den > 1e-18 ? sqrt(num / den) : sqrt(num);
            if (!(e <= worst[part])) worst[part] = e;
        }
    }
    if (!sixteen) {
        CHECK(worst[0] < tol && worst[1] < tol && worst[2] < tol && worst[3] < tol,
              "%s step %d: after AdamW: weights %.3g, ema %.3g, m %.3g, v %.3g", name, s,
              worst[0], worst[1], worst[2], worst[3]);
        CHECK(far <= 2.01 * lr, "%s step %d: a weight with a noise gradient moved %.3g (lr %.3g)",
              name, s, far, lr);
    } else {
        CHECK(s > 0 || (worst[0] < TOL && worst[1] < TOL && worst[2] < 0.0101 &&
                        worst[3] < 0.0202),
              "%s step %d: after AdamW: weights %.3g, ema %.3g, m %.3g, v %.3g", name, s,
              worst[0], worst[1], worst[2], worst[3]);
        CHECK(far_all <= 2.01 * (s + 1) * lr, "%s step %d: a weight %.3g away from the CPU's "
              "(lr %.3g)", name, s, far_all, lr);
    }
    printf("  after AdamW: weights %.2g, ema %.2g, m %.2g, v %.2g; %zu weights with noise "
           "gradients within %.2g%s\n", worst[0], worst[1], worst[2], worst[3], noisy,
           sixteen ? far_all : far, sixteen ? " (all weights)" : "");
    free(ga), free(gb), free(x), free(y);
}

/* tests/gpu/emu: library calls so far with inputs of dtype (ddpmd_emu_lib_calls: lib 0 cuDNN,
 * 1 cuBLAS, 2 warp MMAs); -1 elsewhere */
static long lib_calls(int lib, int dtype)
{
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    unsigned long (*f)(int, int) =
        h ? (unsigned long (*)(int, int))dlsym(h, "ddpmd_emu_lib_calls") : NULL;
    long r = f ? (long)f(lib, dtype) : -1;
    if (h) dlclose(h);
    return r;
}

static size_t dev_free(void)
{
    struct bk_device_mem m;
    return G->device_mem(0, &m) == 0 ? m.free : 0;
}

/* what the process holds on the device besides job reservations (kernels loaded so far) */
static size_t dev_process(void)
{
    struct bk_device_mem m;
    return G->device_mem(0, &m) == 0 ? m.process : 0;
}

/* the CUDA plan of an NHWC backend: every image <-> tokens change whose input dies there in
 * place (no copy), and no conversion scratch around a memory-bound op (16-bit: the typed
 * kernels read and write 16-bit operands) */
static void check_layout(const char *name, const struct job *j)
{
    const struct plan *p = &j->p;
    int tok = 0, tok_in_place = 0, cvt_mem = 0;
    CHECK(G->nhwc, "%s: the CUDA backend's images are not NHWC", name);
    for (int k = 0; k < p->n_run_ops; k++) {
        const struct op *o = plan_op(p, &j->g, k);
        if ((o->type == OP_TO_TOKENS || o->type == OP_TO_IMAGE) && !o->accum[0] &&
            p->last[o->in[0]] == k) {
            tok++;
            tok_in_place += p->storage[o->in[0]] == p->storage[o->out[0]];
        }
        if (graph_half_kernel(o) & (BK_HALF_NORM | BK_HALF_ELTWISE))
            cvt_mem += p->cvt_start[k + 1] - p->cvt_start[k];
    }
    CHECK(tok > 0 && tok_in_place == tok, "%s: %d of %d image <-> token changes in place", name,
          tok_in_place, tok);
    CHECK(cvt_mem == 0, "%s: %d conversions around memory-bound ops", name, cvt_mem);
    printf("  %d image <-> token changes in place, %d conversions in all (none around the %s), "
           "%d fused pairs\n", tok, p->n_cvt, "memory-bound ops", p->n_fused);
}

/* tests/gpu/emu: fast mode's library calls so far (ddpmd_emu_fast_calls: emu_graph.h's
 * EMU_FAST_*), and cuDNN's finder calls (ddpmd_emu_graph_stats); -1 elsewhere */
static long emu_fast(int what)
{
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    ddpmd_emu_fast_calls_fn f = h ? (ddpmd_emu_fast_calls_fn)dlsym(h, "ddpmd_emu_fast_calls") : NULL;
    long r = f ? (long)f(what) : -1;
    if (h) dlclose(h);
    return r;
}

static long emu_finds(void)
{
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    ddpmd_emu_graph_stats_fn f =
        h ? (ddpmd_emu_graph_stats_fn)dlsym(h, "ddpmd_emu_graph_stats") : NULL;
    struct emu_graph_stats st;
    long r = -1;
    if (f) {
        f(&st);
        r = st.finds;
    }
    if (h) dlclose(h);
    return r;
}

static void step_vs_cpu(enum unet_preset preset, int tiled, int guards, int precision)
{
    char name[32];
    snprintf(name, sizeof name, "%s%s", preset == UNET_DDPM ? "ddpm" : "seed",
             precision == STRATEGY_PRECISION_BF16   ? " bf16"
             : precision == STRATEGY_PRECISION_F16 ? " f16"
                                                    : "");
    struct unet_config c;
    small_config(&c, preset, tiled);
    /* head dim 16: the tiled forward on tensor cores (checked below) */
    const int tc = precision == STRATEGY_PRECISION_BF16 && preset == UNET_DDPM && tiled;
    if (tc) {
        c.channels[1] = c.channels[2] = 32;
        c.attn_head_dim = 16;
    }
    struct plan_opts po = {.guard_bytes = guards ? 256 : 0};
    struct plan_opts pc = {0};
    if (precision) {
        po.strategy = strategy_plain(0);
        po.strategy.precision = precision;
        po.strategy.loss_scale.initial = 1024.0f;
        pc.strategy = po.strategy;
    }
    /* 16-bit: the loss within the type's unit roundoff */
    const double u = precision == STRATEGY_PRECISION_BF16 ? 1.0 / 256 : 1.0 / 2048;
    const double tol1 = precision ? u : TOL, tol2 = precision ? u : TOL_STEP2;
    struct exec_opts eg = {.threads = 1, .poison = 1, .check_guards = guards};
    struct exec_opts ec = {.threads = 4};
    struct job gj, cj, rj; /* rj: 16-bit runs' fp32 reference on the CPU */
    size_t free0 = dev_free(), proc0 = dev_process();
    int rc = job_init(&gj, G, &c, 3, &po, &eg);
    CHECK(rc == 0, "%s: GPU job (%d)", name, rc);
    CHECK(job_init(&cj, backend_cpu(), &c, 3, precision ? &pc : NULL, &ec) == 0, "%s: CPU job",
          name);
    CHECK(!precision || job_init(&rj, backend_cpu(), &c, 3, NULL, &ec) == 0,
          "%s: CPU fp32 job", name);
    if (rc) return;
    printf("%s (%s attention%s): GPU plan %zu bytes (workspace %zu, arena %zu), CPU plan %zu\n",
           name, tiled ? "tiled" : "plain", guards ? ", canaries" : "", gj.p.total_bytes,
           gj.p.ws_bytes, gj.p.arena_bytes, cj.p.total_bytes);
    check_layout(name, &gj);
    /* exec_init: the reservation, and the kernels the plan's library calls load (run before
     * it, the process's own: device_mem's process). The rest of the device is untouched */
    size_t free1 = dev_free(), proc1 = dev_process();
    size_t want = (gj.p.total_bytes + GRANULE - 1) / GRANULE * GRANULE;
    const size_t took = free0 - free1, loaded = proc1 > proc0 ? proc1 - proc0 : 0;
    CHECK(took - loaded <= want && took - loaded >= gj.p.total_bytes,
          "%s: exec_init took %zu bytes of the device, %zu of them kernels the process loaded; "
          "the plan is %zu", name, took, loaded, gj.p.total_bytes);
    printf("  exec_init: the plan's %zu bytes, and %zu KiB of kernels loaded before it\n",
           gj.p.total_bytes, loaded >> 10);

    float *x = malloc(gj.g.param_numel * 4 + 64), *y = malloc(gj.g.param_numel * 4 + 64);
    for (int s = 0; s < 2; s++) {
        float lg = 0, lc = 0;
        feed(&gj, s);
        feed(&cj, s);
        const int lo = graph_low_dtype(&gj.g);
        const long conv0 = lib_calls(0, lo), gemm0 = lib_calls(1, lo), mma0 = lib_calls(2, lo);
        int rg = exec_forward_backward(gj.e, 1, 1.0f, 11, (uint64_t)s, 0, &lg);
        /* a 16-bit step's convolutions and linears in 16 bits where the device has them */
        if (precision && conv0 >= 0) {
            const unsigned hk = G->half_kernels ? G->half_kernels(lo) : 0;
            const long conv = lib_calls(0, lo) - conv0, gemm = lib_calls(1, lo) - gemm0;
            CHECK((conv > 0) == !!(hk & BK_HALF_CONV) && (gemm > 0) == !!(hk & BK_HALF_LINEAR),
                  "%s step %d: %ld cuDNN convolutions and %ld GEMMs in 16 bits, half_kernels "
                  "0x%x", name, s, conv, gemm, hk);
            CHECK(!tc || lib_calls(2, lo) > mma0, "%s step %d: no warp MMA in the attention",
                  name, s);
        }
        int rcpu = exec_forward_backward(cj.e, 1, 1.0f, 11, (uint64_t)s, 0, &lc);
        float lr32 = 0;
        double ss_g = 0, ss_r = 0, worst_ratio = 0;
        if (precision) {
            feed(&rj, s);
            rcpu |= exec_forward_backward(rj.e, 1, 1.0f, 11, (uint64_t)s, 0, &lr32);
        }
        CHECK(rg == 0 && rcpu == 0, "%s step %d: forward/backward GPU %d CPU %d", name, s, rg,
              rcpu);
        double el = fabs((double)lg - lc) / fabs((double)lc);
        const double tol = s ? tol2 : tol1;
        CHECK(el < tol, "%s step %d: loss %.9g (GPU) vs %.9g (CPU): %.3g", name, s, lg, lc, el);
        double worst = 0, gnorm = grad_norm(&cj, y), rnorm = precision ? grad_norm(&rj, y) : 0;
        int worst_id = -1, ngrads = 0;
        for (int i = 0; i < gj.g.n_tensors; i++) {
            if (gj.g.tensors[i]->kind != TENSOR_GRAD) continue;
            double e = grad_err(&gj, &cj, i, gnorm, x, y);
            ngrads++;
            if (precision) {
                const double sc = exec_loss_scaler(cj.e)->scale;
                const double er = grad_err_scaled(&cj, 1.0 / sc, &rj, i, rnorm, x, y);
                ss_g += e * e;
                ss_r += er * er;
                if (e / er > worst_ratio) worst_ratio = e / er;
            }
            if (!(e <= worst)) worst = e, worst_id = i;
            if (precision ? !isfinite(e) : !(e < tol)) {
                const char *pn = "?";
                for (int k = 0; k < gj.g.n_tensors; k++)
                    if (gj.g.tensors[k]->grad == i && gj.g.tensors[k]->name)
                        pn = gj.g.tensors[k]->name;
                CHECK(0, "%s step %d: gradient of %s: rel err %.3g", name, s, pn, e);
            }
        }
        CHECK(ngrads > 0, "%s: no gradients", name);
        if (precision) {
            CHECK(sqrt(ss_g) <= TOL16_RATIO * sqrt(ss_r),
                  "%s step %d: the gradients differ from the CPU's 16-bit step by %.3g, more than "
                  "%.1f x the 16-bit step's own difference from fp32 (%.3g)", name, s,
                  sqrt(ss_g), TOL16_RATIO, sqrt(ss_r));
            printf("  16-bit: loss vs fp32 %.2g; gradients: GPU vs CPU %.3g, CPU vs its fp32 "
                   "step %.3g (worst tensor ratio %.3g)\n", fabs((double)lc - lr32) /
                   fabs((double)lr32), sqrt(ss_g), sqrt(ss_r), worst_ratio);
            const float sg = exec_loss_scaler(gj.e)->scale, sc = exec_loss_scaler(cj.e)->scale;
            CHECK(sg == sc, "%s step %d: loss scale %g on the GPU, %g on the CPU", name, s, sg, sc);
        }
        printf("  step %d: loss %.7g vs %.7g (%.2g), %d gradients (norm %.3g), worst %.3g "
               "(tensor %d)\n", s, lg, lc, el, ngrads, gnorm, worst, worst_id);
        const struct optim_config *oc = precision ? &OC16 : &OC;
        rg = exec_optimizer_step(gj.e, oc, s + 1, oc->lr, NULL);
        rcpu = exec_optimizer_step(cj.e, oc, s + 1, oc->lr, NULL);
        if (precision) rcpu |= exec_optimizer_step(rj.e, oc, s + 1, oc->lr, NULL);
        CHECK(rg == 0 && rcpu == 0, "%s step %d: optimizer GPU %d CPU %d", name, s, rg, rcpu);
        check_after_adamw(name, s, &gj, &cj, OC.lr, tol, precision != 0);
        /* nothing allocated on the device during a step */
        size_t free2 = dev_free();
        CHECK(free2 == free1, "%s step %d: the device lost %lld bytes during the step", name, s,
              (long long)free1 - (long long)free2);
    }
    if (!guards) {
        size_t hw = exec_arena_high_water(gj.e);
        CHECK(hw <= gj.p.arena_bytes && gj.p.arena_bytes - hw < PLAN_ALIGN,
              "%s: arena high-water %zu vs planned %zu", name, hw, gj.p.arena_bytes);
    }
    CHECK(!G->device_poisoned(0), "%s: device poisoned", name);
    free(x);
    free(y);
    job_free(&gj);
    job_free(&cj);
    if (precision) job_free(&rj);
    CHECK(dev_free() + (dev_process() - proc0) == free0,
          "%s: the device did not get its memory back (%zu bytes missing, the process's own "
          "grew %zu)", name, free0 - dev_free(), dev_process() - proc0);
}

/* the group-norm fusions (plan.fuse_host: the time term's broadcast add inside the norm's
 * kernels, forward and backward, a residual add after it) against the same step planned
 * without them, on the GPU: the
 * fused kernels keep the unfused ops' rounding points, so the forward (the loss) is the same
 * bits; the backward's db (the time term's gradient) is summed in another order inside the
 * norm's kernel, so the gradients agree to fp32 summation (FUSED_TOL, norm-wise as grad_err);
 * the fused plan's arena no larger */
#define FUSED_TOL 1e-6
static void fused_vs_unfused(enum unet_preset preset, int precision)
{
    char name[32];
    snprintf(name, sizeof name, "%s%s fused", preset == UNET_DDPM ? "ddpm" : "seed",
             precision == STRATEGY_PRECISION_BF16 ? " bf16" : "");
    struct unet_config c;
    small_config(&c, preset, 1);
    struct plan_opts pf = {.guard_bytes = 256}, pu = {.guard_bytes = 256, .no_fuse = 1};
    if (precision) {
        pf.strategy = strategy_plain(0);
        pf.strategy.precision = precision;
        pu.strategy = pf.strategy;
    }
    struct exec_opts eo = {.threads = 1, .poison = 1, .check_guards = 1};
    struct job fj, uj;
    int rf = job_init(&fj, G, &c, 3, &pf, &eo), ru = job_init(&uj, G, &c, 3, &pu, &eo);
    CHECK(rf == 0 && ru == 0, "%s: jobs (%d, %d)", name, rf, ru);
    if (rf || ru) return;
    check_layout(name, &fj);
    /* every time term next to a group norm: ddpm's before it (forward and backward), seed's
     * after it; and (forward) every residual add of a group norm's output (seed's DoubleConv) */
    int bcast = 0, resid = 0;
    for (int k = 0; k < fj.g.n_fwd_ops; k++) {
        const struct op *o = &fj.g.ops[k];
        bcast += o->type == OP_ADD_BCAST;
        for (int i = 0; i < k && o->type == OP_ADD; i++)
            resid += fj.g.ops[i].type == OP_GROUPNORM &&
                     (fj.g.ops[i].out[0] == o->in[0] || fj.g.ops[i].out[0] == o->in[1]);
    }
    CHECK(fj.p.n_fused == 2 * bcast + resid && uj.p.n_fused == 0,
          "%s: %d fused pairs (unfused plan %d), %d broadcast adds, %d residual adds", name,
          fj.p.n_fused, uj.p.n_fused, bcast, resid);
    float lf = 0, lu = 0;
    feed(&fj, 0);
    feed(&uj, 0);
    int a = exec_forward_backward(fj.e, 1, 1.0f, 11, 0, 0, &lf);
    int b = exec_forward_backward(uj.e, 1, 1.0f, 11, 0, 0, &lu);
    CHECK(a == 0 && b == 0, "%s: steps %d %d", name, a, b);
    float *x = malloc(fj.g.param_numel * 4 + 64), *y = malloc(fj.g.param_numel * 4 + 64);
    int differ = 0, grads = 0;
    double worst = 0, gnorm = grad_norm(&uj, y);
    for (int i = 0; i < fj.g.n_tensors; i++) {
        if (fj.g.tensors[i]->kind != TENSOR_GRAD) continue;
        dl(&fj, i, -1, x);
        dl(&uj, i, -1, y);
        grads++;
        differ += memcmp(x, y, fj.g.tensors[i]->numel * 4) != 0;
        const double err = grad_err(&fj, &uj, i, gnorm, x, y);
        if (!(err <= worst)) worst = err;
    }
    CHECK(memcmp(&lf, &lu, sizeof lf) == 0 && worst <= FUSED_TOL,
          "%s: loss %.9g vs %.9g unfused, gradients within %.3g (%d of %d differ at all)", name,
          lf, lu, worst, differ, grads);
    CHECK(fj.p.arena_bytes <= uj.p.arena_bytes, "%s: arena %zu fused, %zu unfused", name,
          fj.p.arena_bytes, uj.p.arena_bytes);
    printf("%s: %d pairs, loss bit-identical to the unfused step, gradients within %.2g (%d of "
           "%d bit-identical); arena %zu (unfused %zu)\n", name, fj.p.n_fused, worst,
           grads - differ, grads, fj.p.arena_bytes, uj.p.arena_bytes);
    free(x);
    free(y);
    job_free(&fj);
    job_free(&uj);
}

/* One step (and its optimizer step) of job j planned and run in parity (1) or fast (0) mode;
 * what it made of fast mode's library calls (f[EMU_FAST_*]) and of cuDNN's finders. */
static int mode_step(struct job *j, const struct unet_config *c, int parity, long f[4],
                     long *finds)
{
    G->set_parity(parity); /* before planning: workspace sizes, the context's mode */
    long f0[4], n0 = emu_finds();
    for (int k = 0; k < 4; k++) f0[k] = emu_fast(k);
    struct exec_opts eo = {.threads = 1, .poison = 1};
    int rc = job_init(j, G, c, 3, NULL, &eo);
    G->set_parity(1);
    if (rc) return rc;
    feed(j, 0);
    float l = 0;
    rc = exec_forward_backward(j->e, 1, 1.0f, 11, 0, 0, &l) ||
         exec_optimizer_step(j->e, &OC, 1, OC.lr, NULL);
    for (int k = 0; k < 4; k++) f[k] = emu_fast(k) - f0[k];
    *finds = emu_finds() - n0;
    return rc;
}

/* Fast mode against parity mode and the CPU. A model at 12x12, whose convolution shapes no other
 * test plans: the algorithm cache starts cold for both modes. */
static void fast_mode(void)
{
    if (!G->set_parity) return;
    struct unet_config c;
    small_config(&c, UNET_DDPM, 1);
    c.image_size = 12;
    struct exec_opts ec = {.threads = 4};
    struct job cj, pj, fj, f2;
    long fp[4], ff[4], f2f[4], np = 0, nf = 0, n2 = 0;
    CHECK(job_init(&cj, backend_cpu(), &c, 3, NULL, &ec) == 0, "fast mode: the CPU job");
    feed(&cj, 0);
    float lc = 0;
    CHECK(exec_forward_backward(cj.e, 1, 1.0f, 11, 0, 0, &lc) == 0, "fast mode: the CPU step");
    int rp = mode_step(&pj, &c, 1, fp, &np);
    int rf = mode_step(&fj, &c, 0, ff, &nf);
    int r2 = mode_step(&f2, &c, 0, f2f, &n2);
    CHECK(rp == 0 && rf == 0 && r2 == 0, "fast mode: the steps: parity %d, fast %d, fast again %d",
          rp, rf, r2);
    if (rp || rf || r2) return;
    /* the gradients: parity within TOL of the CPU's, fast within TF32's tolerance and off
     * parity's bits (TF32 operands have 11 significant bits: 2^-11 relative rounding) */
    float *x = malloc(cj.g.param_numel * 4 + 64), *y = malloc(cj.g.param_numel * 4 + 64);
    const double gnorm = grad_norm(&cj, y);
    double wp = 0, wf = 0, wpf = 0;
    for (int i = 0; i < cj.g.n_tensors; i++) {
        if (cj.g.tensors[i]->kind != TENSOR_GRAD) continue;
        const double ep = grad_err(&pj, &cj, i, gnorm, x, y), ef = grad_err(&fj, &cj, i, gnorm, x, y);
        const double epf = grad_err(&fj, &pj, i, gnorm, x, y);
        if (!(ep <= wp)) wp = ep;
        if (!(ef <= wf)) wf = ef;
        if (!(epf <= wpf)) wpf = epf;
    }
    printf("fast mode: gradients against the CPU's: parity %.3g, fast %.3g; fast against parity "
           "%.3g\n", wp, wf, wpf);
    CHECK(wp < TOL, "fast mode: parity's gradients %.3g from the CPU's", wp);
    CHECK(wf < 2e-2, "fast mode: fast gradients %.3g from the CPU's (TF32)", wf);
    if (fp[0] >= 0) {
        /* the emulator rounds TF32 operands: fast mode's numbers are not parity's */
        CHECK(wpf > 1e-5, "fast mode: fast gradients within %.3g of parity's: no TF32 seen", wpf);
        printf("fast mode: parity made %ld/%ld/%ld/%ld fast library calls (TF32 conv, TF32 GEMM, "
               "non-deterministic, FFT/Winograd), fast %ld/%ld/%ld/%ld; finders: parity %ld, "
               "fast %ld, fast again %ld\n", fp[0], fp[1], fp[2], fp[3], ff[0], ff[1], ff[2],
               ff[3], np, nf, n2);
        CHECK(fp[0] == 0 && fp[1] == 0 && fp[2] == 0 && fp[3] == 0,
              "fast mode: parity mode made fast library calls: %ld TF32 convolutions, %ld TF32 "
              "GEMMs, %ld non-deterministic, %ld FFT/Winograd", fp[0], fp[1], fp[2], fp[3]);
        CHECK(ff[0] > 0 && ff[1] > 0 && ff[2] > 0 && ff[3] > 0,
              "fast mode: %ld TF32 convolutions, %ld TF32 GEMMs, %ld non-deterministic and %ld "
              "FFT/Winograd algorithms (each measured fastest by the emulator's finders)",
              ff[0], ff[1], ff[2], ff[3]);
        /* measured once per (device, shape, mode): both modes' first jobs, not the second */
        CHECK(np > 0 && nf > 0 && n2 == 0,
              "fast mode: cuDNN's finders ran %ld times for parity, %ld for fast, %ld for the "
              "second fast job of the same shapes", np, nf, n2);
    }
    free(x);
    free(y);
    job_free(&cj);
    job_free(&pj);
    job_free(&fj);
    job_free(&f2);
}

/* a plan larger than the device: exec_init fails with EXEC_ERR_BUDGET and nothing breaks */
static void over_budget(void)
{
    struct bk_device_mem m;
    CHECK(G->device_mem(0, &m) == 0, "device_mem");
    struct unet_config c;
    unet_config_default(&c, UNET_SEED);
    struct job j;
    int batch = 64, rc = 0;
    for (;;) {
        rc = job_init(&j, G, &c, batch, NULL, NULL);
        if (rc || j.p.total_bytes > m.total + ((size_t)1 << 30) || batch >= 65536) break;
        plan_free(&j.p);
        graph_free(&j.g);
        batch *= 2;
    }
    CHECK(rc == 0 && j.p.total_bytes > m.total, "a plan over %zu bytes (batch %d): rc %d", m.total,
          batch, rc);
    if (rc) return;
    size_t free0 = dev_free();
    struct exec_opts eo = {.threads = 1};
    struct exec *e = NULL;
    int er = exec_init(&e, &j.g, &j.p, G, &eo);
    printf("over budget: seed 64px batch %d plans %.1f GiB on a %.1f GiB device: exec_init %d\n",
           batch, (double)j.p.total_bytes / 1073741824.0, (double)m.total / 1073741824.0, er);
    CHECK(er == EXEC_ERR_BUDGET && e == NULL, "over-budget exec_init: %d", er);
    CHECK(!G->device_poisoned(0), "the device is poisoned after an over-budget request");
    CHECK(dev_free() == free0, "a failed reservation kept device memory");
    plan_free(&j.p);
    graph_free(&j.g);
}

static int have_nvidia_device(void)
{
    struct stat st;
    return stat("/dev/nvidia0", &st) == 0 || stat("/proc/driver/nvidia/gpus", &st) == 0;
}

int main(void)
{
    setenv("DDPMD_CUDA_SYNC", "1", 0);
    char err[512] = "";
    if (backend_load("cuda", &G, err, sizeof err) != BK_OK) {
        if (have_nvidia_device() && !strstr(err, "no CUDA device")) {
            fprintf(stderr, "test_gpu_step: an NVIDIA device is present but: %s\n", err);
            return 1;
        }
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 77;
    }
    step_vs_cpu(UNET_DDPM, 1, 1, 0); /* canaries after every op */
    step_vs_cpu(UNET_SEED, 1, 0, 0); /* the arena's high-water mark */
    step_vs_cpu(UNET_SEED, 0, 0, 0);
    step_vs_cpu(UNET_DDPM, 1, 1, STRATEGY_PRECISION_BF16);
    step_vs_cpu(UNET_SEED, 0, 0, STRATEGY_PRECISION_F16);
    fused_vs_unfused(UNET_DDPM, STRATEGY_PRECISION_BF16);
    fused_vs_unfused(UNET_SEED, 0);
    fast_mode();
    over_budget();
    return tu_finish("test_gpu_step");
}
