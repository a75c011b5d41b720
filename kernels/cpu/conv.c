/* conv.c - CPU 2-D convolution through oneDNN. The CPU backend keeps images NHWC, the layout
 * oneDNN's fast kernels read and write directly; weights stay OIHW (checkpoints, optimizer) and
 * are reordered per call into the blocked layout the primitive picked, inside the workspace
 * (`ws`, sized by cpu_conv2d_ws_bytes and planned like any other byte); the weight gradient is
 * reordered back and added. An accumulating data gradient (dx +=) goes through the workspace
 * and a summing reorder. Primitives are created once per shape, on first use, and cached in the
 * job's context; their scratchpad is part of `ws` too, so a step allocates no tensor memory.
 * bf16 (s->dtype): x, w, y, dy in bf16 with fp32 accumulation (w given in fp32 where s->w_f32,
 * rounded to nearest even in the weight reorder; oneDNN's conversion treats fp32 denormals as
 * zero, where kernels/half.h would keep a bf16 denormal); the bias, dw and db fp32; dx is
 * computed in fp32 into the workspace and rounded into bf16; accumulating, round(dx + round(r))
 * as backend.h says (cpu_accum16: rounded to bf16 first, then added in fp32 and rounded). The
 * bf16 filter gradient is not oneDNN's without AMX: im2col + a bf16 GEMM (conv_filter_gemm), or
 * at stride 1 wgrad_bf16.c's register tiles on pairs of pixels.
 * f16 has no CPU kernels (cpu_half_kernels): BK_ERR_INVALID.
 *
 * Results are a function of (shape, thread count): oneDNN partitions work by the thread count
 * fixed when the primitive was created, which is the job's (ctx->threads), capped at the
 * machine's cores (more would only oversubscribe them, and the plan's scratch is sized there).
 */
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "onednn.h"


static int conv_check(const struct bk_conv2d *s)
{
    if (!s || s->n < 1 || s->ci < 1 || s->h < 1 || s->w < 1 || s->co < 1) return BK_ERR_INVALID;
    if (s->pad_t < 0 || s->pad_l < 0 || s->pad_b < 0 || s->pad_r < 0) return BK_ERR_INVALID;
    if (s->dtype != BK_DTYPE_F32 && s->dtype != BK_DTYPE_BF16) return BK_ERR_INVALID;
    struct bk_conv2d t = *s;
    if (bk_conv2d_init(&t) != BK_OK || t.ho != s->ho || t.wo != s->wo) return BK_ERR_INVALID;
    if ((long long)s->n * s->ci * s->h * s->w > INT_MAX ||
        (long long)s->n * s->co * s->ho * s->wo > INT_MAX)
        return BK_ERR_INVALID;
    return BK_OK;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

/* ---- primitive descriptors: NHWC activations, weights in whatever layout oneDNN picks ---- */

struct conv_pds {
    dnnl_primitive_desc_t fwd, bwd_d, bwd_w;
    dnnl_primitive_desc_t fwd32; /* the fp32 forward the fp32 filter gradient is hinted by */
};

/* A 16-bit convolution's filter gradient as im2col + one bf16 GEMM with fp32 accumulation
 * where the CPU has AVX512-BF16 without AMX (kernels/cpu/gemm.c, oneDNN's brgemm on
 * vdpbf16ps): dw (Co, Kh*Kw*Ci) += dy^T (Co, P) cols (P, Kh*Kw*Ci) over the P = N*Ho*Wo output
 * pixels (NHWC: dy is (P, Co) as it lies; a row of cols is the pixel's Kh*Kw input rows of Ci,
 * tap by tap, zeros in the padding). The columns are built per chunk of pixels into the
 * workspace (the chunk rule: as many pixels as fit WGRAD_COLS_BYTES of columns, at least 16,
 * a multiple of 16), the GEMM adds each chunk into an fp32 (Co, Kh, Kw, Ci) sum there, which is
 * added into the OIHW dw at the end. A 1x1 kernel needs neither: its sum is OIHW already (the
 * GEMM adds into dw), and unstrided and unpadded x is its column matrix (one GEMM over all P).
 * db: dy summed here. Why not oneDNN's own: its bf16 backward-weights ran at 0.55x its fp32
 * without AMX (cpu_bench --ceilings, 256->256 3x3 at 16x16: 61 against 112 GFLOP/s). This, at
 * the presets' 20 commonest and costliest shapes (bench/filter_bench, N8, GFLOP per CPU-second
 * of both threads, bench/RESULTS.md): 3x3 105-187 where fp32 on converted operands (the route
 * before) made 73-105, 1.4-2.4x, stride 2 included; 1x1 134-169 against 55-95; the 3-channel
 * input and output convolutions at 32x32 34-40 against 7-18, seed-64's 3->64 at 64x64 at parity
 * (28-33 against 22-36 at load ~16); the 1-channel input 6.3 against 5.5 (a GEMM 9 columns
 * wide). So no shape is sent back to the fp32 route. 1 and 2 threads give the same bits at
 * every shape test_cpu_wgrad16 runs (it asserts so; the im2col only copies, and oneDNN's
 * matmul did not split the pixels). A case it does not cover (f16, AMX, no AVX512-BF16) keeps
 * conv_filter_f32 or oneDNN's own. WGRAD_COLS_BYTES, measured (filter_bench, 2 rounds, 3x3
 * N8 128->128 32x32, 256->256 16x16, 512->512 and 512->256 8x8): 1 MiB and 4 MiB within the
 * noise of each other, 256 KiB 5-60% slower (its GEMMs' K of 28-112 pixels too short); so 1
 * MiB, the smaller workspace. The fp32 sum is Co*Kh*Kw*Ci*4 bytes (2.4 MB at 256 -> 256 3x3),
 * less than the converted x and dy the fp32 route planned (8.4 MB each at N8 256 channels
 * 32x32). */
enum { WGRAD_COLS_BYTES = 1 << 20 };

/* The slices (conv_filter_slices): where dw's (Co, Kh*Kw*Ci) has fewer than WGRAD_SLICE_MN
 * elements, oneDNN's matmul (it splits M x N, not the pixels) has little to share between the
 * threads, and each chunk was an im2col pass on both threads, a barrier, then the GEMM reading
 * the columns back. There the pixels are cut into min(WGRAD_SLICES, chunks) slices of whole
 * chunks of WGRAD_SLICE_COLS bytes of columns (at least 16 pixels, a multiple of 16), a count
 * that depends on the shape only; a thread runs a slice alone, chunk by chunk: its im2col into
 * its own columns (cache-hot, a quarter of the core's 1 MiB L2) and a one-thread GEMM (its own
 * one-thread context, cached primitives) into the slice's fp32 partial dw, its dy summed into a
 * partial db; the partials are added in slice order. Co or Ci 1 (`direct`: a GEMM that is a
 * GEMV, or 9 columns wide) runs conv_filter_direct per slice of 16-pixel chunks instead.
 * Measured (filter_bench, bf16 per CPU-second, 2 rounds alternating with the route before,
 * load 3-4 on 2 cores, bench/RESULTS.md): fmnist-tiny's N32 32->32 104 -> 123-135, 64->32
 * 127 -> 141-147, 96->32 134 -> 150-152, 64->64 at 16x16 146 -> 170-173; N8 64->64 at 32x32
 * 143 -> 177, 3->128 37 -> 75, 128->3 35 -> 46; the thin 32->1 at N32 2.4 -> 1.2 ms CPU, 1->32
 * 1.9 -> 1.1 ms. 128->64 3x3 (64 x 1152) sliced was no faster (152-160 against 162), so the
 * threshold; 2, 4 and 8 slices within 3% of each other (8: balance up to 8 threads), 128 KiB
 * of columns 2-4% slower than 256 or 512 KiB. The workspace: the partials (slices x Co x
 * (Kh*Kw*Ci + 1) x 4 bytes, at most 8 x 73728 x 4 = 2.3 MB) and per planned thread the columns
 * and the GEMM's scratchpad. */
enum { WGRAD_SLICES = 8, WGRAD_SLICE_COLS = 256 << 10, WGRAD_SLICE_MN = 64 * 1152 };

/* A stride-1 filter gradient with Co a multiple of 16 and Wo of WGRAD_MIN_WO or more (an
 * unpadded 1x1 only where sliced) runs wgrad_bf16.c instead of im2col + GEMM, in blocks of at
 * most WGRAD_PIX output pixels (rows of one image, or whole images: the register tiles' sums run
 * over a block) whose pair copies of dy and x fit WGRAD_SLICE_COLS bytes. Sliced, per slice (the
 * slices then cut the N*Ho output rows, not chunks of pixels), in the slice's columns. Else
 * (`split`) the input channels are cut into an even number of groups of at most WGRAD_SPLIT_CI
 * (a count from the shape; 2 threads share them evenly), each a task over all rows into its own
 * elements of the one fp32 sum: no partials and no barrier, and a dw element's sum is the same
 * whichever thread runs its task; each thread's scratch a slice of the columns and GEMM
 * scratchpad planned (else not taken). Narrower rows (8 to 15 pixels) split, or sliced at
 * WGRAD_NARROW_PX pixels or more: measured (filter_bench, N8 unless said, GFLOP per CPU-second,
 * against im2col + GEMM) 64->64 8x8 N32 164 against 151-154, 128->64 8x8 N32 171-201 against
 * 152-162; but 64->64 8x8 at N8 114-117 against 139-140 (3 slices of 512 pixels), 4x4 shapes
 * 0.6-0.85x (and 0.9-1.0x again with the split's db and dw add below). Split at N8 8x8, 3
 * alternating rounds at load 3.4-3.6 on 2 cores: 128->64 160-185 against 117-148, 128->128 186-188
 * against 158-161, 256->128 171-183 against 150-152, 256->256 156-164 against 144-151, 512->256
 * 134-151 against 105-125, 512->512 117-123 against 108-116, 384->256 132-158 against 132-162
 * (even); earlier 256->256 and 512->512 had measured 0.9x and 0.65x of the GEMM, then when
 * Co over 128 was kept off it. */
enum { WGRAD_PIX = 256, WGRAD_SPLIT_CI = 64, WGRAD_MIN_WO = 16, WGRAD_NARROW_PX = 2048 };

struct conv_wgrad {
    struct cpu_gemm_shape g, last; /* a full chunk's GEMM, the last (shorter) chunk's */
    int px, chunk, kc;             /* output pixels, pixels per chunk, Kh*Kw*Ci */
    int cols_in_x;                 /* x is the column matrix (1x1, stride 1, unpadded) */
    int into_dw;                   /* the GEMM adds into dw (1x1: (Co, Ci) is OIHW) */
    int sliced, slices, chunks;    /* pixel slices (else one sum, GEMMs on all threads), chunks */
    int direct;                    /* Co or Ci is 1: a per-tap loop per slice, no GEMM */
    int rows;                      /* >0: wgrad_bf16.c, in blocks of this many rows */
    int groups, cg;                /* split (not sliced): channel groups, channels per group */
    int threads;                   /* slices, split: the threads planned (each its scratch) */
    size_t sum, cols, scr;         /* workspace: the fp32 sum(s), one chunk's columns, GEMM's */
};

/* whether wgrad_bf16.c (above) takes s, of px output pixels: where measured faster */
static int conv_filter_pairs(const struct bk_conv2d *s, int px)
{
    const int narrow = s->wo < WGRAD_MIN_WO;
    const int split = (size_t)s->co * s->kh * s->kw * s->ci >= WGRAD_SLICE_MN;
    return s->stride == 1 && s->co % 16 == 0 && s->wo >= 8 &&
           !(narrow && !split && px < WGRAD_NARROW_PX);
}

/* w->rows for wgrad_bf16.c (above) on nc input channels with `room` bytes of scratch, or 0 */
static void conv_filter_rows(struct conv_wgrad *w, const struct bk_conv2d *s, int nc, size_t room)
{
    if (!conv_filter_pairs(s, w->px)) return;
    for (int rb = WGRAD_PIX / s->wo > 1 ? WGRAD_PIX / s->wo : 1; rb > 0 && !w->rows; rb--) {
        const size_t b = cpu_wgrad_bf16_bytes(s, rb, nc);
        if (b <= WGRAD_SLICE_COLS && b <= room) w->rows = rb;
    }
}

/* whether s's filter gradient runs as im2col + bf16 GEMM (above); w (may be NULL) its plan */
static int conv_filter_gemm(const struct bk_conv2d *s, struct conv_wgrad *w)
{
    if (s->dtype != BK_DTYPE_BF16 || cpu_isa() < CPU_ISA_AVX512_BF16 || onednn_amx()) return 0;
    if (!w) return 1;
    memset(w, 0, sizeof *w);
    w->px = s->n * s->ho * s->wo;
    w->kc = s->kh * s->kw * s->ci;
    w->into_dw = s->kh * s->kw == 1;
    w->cols_in_x = w->into_dw && s->stride == 1 && !s->pad_t && !s->pad_l && !s->pad_b &&
                   !s->pad_r;
    /* sliced: a small dw, an unpadded 1x1 too where wgrad_bf16.c takes it (there the one GEMM
     * over all pixels on x as its column matrix was slower: filter_bench 1x1 N32 32->64 16x16
     * 56 against 136 GFLOP per CPU-second, 96->32 32x32 98 against 155, N8 384->128 32x32 166
     * against 176) */
    const int sliced = w->sliced = (size_t)s->co * w->kc < WGRAD_SLICE_MN &&
                                   (!w->cols_in_x || conv_filter_pairs(s, w->px));
    w->direct = sliced && (s->co == 1 || s->ci == 1);
    int chunk = w->px;
    if (!w->cols_in_x || sliced) {
        const size_t bytes = sliced ? WGRAD_SLICE_COLS : WGRAD_COLS_BYTES;
        const size_t fit = bytes / ((size_t)w->kc * 2) / 16 * 16;
        chunk = fit < 16 ? 16 : fit > (size_t)w->px ? w->px : (int)fit;
    }
    if (w->direct) chunk = w->px < 16 ? w->px : 16;
    w->chunk = chunk;
    w->chunks = (w->px + chunk - 1) / chunk;
    w->slices = sliced ? (w->chunks < WGRAD_SLICES ? w->chunks : WGRAD_SLICES) : 1;
    struct cpu_gemm_shape g = {.ta = 1, .m = s->co, .n = w->kc, .k = chunk, .lda = s->co,
                               .ldb = w->kc, .ldc = w->kc, .dtype = BK_DTYPE_BF16,
                               .c_dtype = BK_DTYPE_F32, .accum = 1};
    w->g = w->last = g;
    w->last.k = w->px - (w->px - 1) / chunk * chunk;
    const size_t one = ONEDNN_ALIGN64((size_t)s->co * w->kc * sizeof(float));
    if (sliced) { /* per slice its partial dw and db */
        w->threads = cpu_threads(NULL);
        w->sum = (size_t)w->slices * ONEDNN_ALIGN64((size_t)s->co * (w->kc + 1) * sizeof(float));
        w->cols = w->direct ? 0 : ONEDNN_ALIGN64((size_t)chunk * w->kc * 2);
        w->scr = w->direct ? 0 : ONEDNN_ALIGN64(max2(cpu_gemm_ws_bytes(&w->g),
                                                     cpu_gemm_ws_bytes(&w->last)));
        if (!w->direct) conv_filter_rows(w, s, s->ci, w->cols);
        return 1;
    }
    w->sum = w->into_dw ? 0 : one;
    w->cols = w->cols_in_x ? 0 : ONEDNN_ALIGN64((size_t)chunk * w->kc * 2);
    w->scr = max2(cpu_gemm_ws_bytes(&w->g), cpu_gemm_ws_bytes(&w->last));
    if (!w->into_dw) {
        w->groups = 2 * ((s->ci + 2 * WGRAD_SPLIT_CI - 1) / (2 * WGRAD_SPLIT_CI));
        w->cg = (s->ci + w->groups - 1) / w->groups;
        w->cg = (w->cg + 7) / 8 * 8; /* whole register tiles */
        w->groups = (s->ci + w->cg - 1) / w->cg;
        w->threads = cpu_threads(NULL);
        conv_filter_rows(w, s, w->cg, (w->cols + w->scr) / (size_t)w->threads / 64 * 64);
    }
    return 1;
}

/* conv_filter_gemm's workspace bytes */
static size_t conv_filter_ws(const struct conv_wgrad *w)
{
    return w->sum + (size_t)(w->sliced ? w->threads : 1) * (w->cols + w->scr);
}

/* A 16-bit convolution's filter gradient that conv_filter_gemm does not take, without AMX: in
 * fp32 on x and dy converted into the workspace (oneDNN's bf16 backward-weights: 0.55x, above;
 * the conversions cost a pass over x and dy). */
static int conv_filter_f32(const struct bk_conv2d *s)
{
    return s->dtype != BK_DTYPE_F32 && !onednn_amx() && !conv_filter_gemm(s, NULL);
}

static void conv_pds_free(struct conv_pds *p)
{
    if (p->fwd32) dnnl_primitive_desc_destroy(p->fwd32);
    if (p->fwd) dnnl_primitive_desc_destroy(p->fwd);
    if (p->bwd_d) dnnl_primitive_desc_destroy(p->bwd_d);
    if (p->bwd_w) dnnl_primitive_desc_destroy(p->bwd_w);
    memset(p, 0, sizeof *p);
}

/* oneDNN's type of the typed operands */
static dnnl_data_type_t conv_dt(const struct bk_conv2d *s)
{
    return s->dtype == BK_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
}

static int conv_pds_make(struct conv_pds *p, const struct bk_conv2d *s, int bias)
{
    memset(p, 0, sizeof *p);
    dnnl_engine_t eng = onednn_engine();
    if (!eng) return BK_ERR_DEVICE;
    dnnl_dims_t xd = {s->n, s->ci, s->h, s->w}, yd = {s->n, s->co, s->ho, s->wo};
    dnnl_dims_t wd = {s->co, s->ci, s->kh, s->kw}, bd = {s->co};
    dnnl_dims_t st = {s->stride, s->stride}, pl = {s->pad_t, s->pad_l}, pr = {s->pad_b, s->pad_r};
    dnnl_memory_desc_t x, y, w, b, dx, dw, x32, y32, w32;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_convolution_desc_t fd, dd, wdd, fd32;
    int rc = BK_ERR_INVALID;
    const dnnl_data_type_t t = conv_dt(s);
    /* dx and dw are computed in fp32 whatever the type (dx is rounded after, dw accumulates) */
    if (dnnl_memory_desc_init_by_tag(&x, 4, xd, t, dnnl_nhwc) ||
        dnnl_memory_desc_init_by_tag(&y, 4, yd, t, dnnl_nhwc) ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, t, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x) ||
        dnnl_memory_desc_init_by_tag(&dx, 4, xd, dnnl_f32, dnnl_nhwc) ||
        dnnl_memory_desc_init_by_tag(&dw, 4, wd, dnnl_f32, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&x32, 4, xd, dnnl_f32, dnnl_nhwc) ||
        dnnl_memory_desc_init_by_tag(&y32, 4, yd, dnnl_f32, dnnl_nhwc) ||
        dnnl_memory_desc_init_by_tag(&w32, 4, wd, dnnl_f32, dnnl_format_tag_any))
        return BK_ERR_INVALID;
    const int f32w = conv_filter_f32(s);
    if (onednn_make_attr(&attr, 0)) goto out;
    if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &x,
                                           &w, bias ? &b : NULL, &y, st, pl, pr) ||
        dnnl_primitive_desc_create(&p->fwd, &fd, attr, eng, NULL))
        goto out;
    if (dnnl_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &dx, &w, &y, st, pl,
                                                 pr) ||
        dnnl_primitive_desc_create(&p->bwd_d, &dd, attr, eng, p->fwd))
        goto out;
    if (f32w && (dnnl_convolution_forward_desc_init(&fd32, dnnl_forward_training,
                                                    dnnl_convolution_direct, &x32, &w32,
                                                    bias ? &b : NULL, &y32, st, pl, pr) ||
                 dnnl_primitive_desc_create(&p->fwd32, &fd32, attr, eng, NULL)))
        goto out;
    if (dnnl_convolution_backward_weights_desc_init(&wdd, dnnl_convolution_direct,
                                                    f32w ? &x32 : &x, &dw, bias ? &b : NULL,
                                                    f32w ? &y32 : &y, st, pl, pr) ||
        dnnl_primitive_desc_create(&p->bwd_w, &wdd, attr, eng, f32w ? p->fwd32 : p->fwd))
        goto out;
    rc = BK_OK;
out:
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (rc) conv_pds_free(p);
    return rc;
}

/* the type of the weights the engine hands over: s's, or fp32 (s->w_f32: the fp32 master, which
 * the weight reorders round to bf16 on their way into the primitive's layout, so no separate
 * conversion pass reads and writes every weight first) */
static dnnl_data_type_t conv_wdt(const struct bk_conv2d *s)
{
    return s->w_f32 ? dnnl_f32 : conv_dt(s);
}

/* the weights as the engine keeps them, OIHW, of type t (the working copy's, or fp32 for dw) */
static int oihw_md(dnnl_memory_desc_t *md, const struct bk_conv2d *s, dnnl_data_type_t t)
{
    dnnl_dims_t d = {s->co, s->ci, s->kh, s->kw};
    return dnnl_memory_desc_init_by_tag(md, 4, d, t, dnnl_oihw) == dnnl_success ? 0 : -1;
}

/* a reorder from -> to (adding into `to` when accum), its scratchpad user-provided: *scratch
 * gets its size. With out NULL it is only measured. */
static int make_reorder(dnnl_primitive_t *out, const dnnl_memory_desc_t *from,
                        const dnnl_memory_desc_t *to, int accum, size_t *scratch)
{
    dnnl_engine_t eng = onednn_engine();
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if (!eng || onednn_make_attr(&attr, accum) ||
        dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, attr))
        goto out;
    *scratch = onednn_md_bytes(pd, dnnl_query_scratchpad_md);
    rc = out ? onednn_make_prim(out, pd) : 0;
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc;
}

enum { R_WF, R_WD, R_DW_ACC, R_DX_ACC, R_DX, R_COUNT };

/* the reorders of a shape: weights into the forward's and the backward-data's layouts, the
 * weight gradient back (adding), the fp32 data gradient into dx adding (and, for a 16-bit
 * type, not adding: rounding only). With out NULL only their scratchpad sizes are measured;
 * an unused one (R_DX for fp32) measures 0. */
static int conv_reorders(dnnl_primitive_t out[R_COUNT], size_t scratch[R_COUNT],
                         const struct conv_pds *p, const struct bk_conv2d *s)
{
    const dnnl_memory_desc_t *xn = dnnl_primitive_desc_query_md(p->fwd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *dxn =
        dnnl_primitive_desc_query_md(p->bwd_d, dnnl_query_diff_src_md, 0);
    const dnnl_memory_desc_t *wf = dnnl_primitive_desc_query_md(p->fwd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *wd = dnnl_primitive_desc_query_md(p->bwd_d, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *dwb =
        dnnl_primitive_desc_query_md(p->bwd_w, dnnl_query_diff_weights_md, 0);
    dnnl_memory_desc_t uw, udw;
    if (oihw_md(&uw, s, conv_wdt(s)) || oihw_md(&udw, s, dnnl_f32)) return -1;
    scratch[R_DX] = 0;
    return make_reorder(out ? &out[R_WF] : NULL, &uw, wf, 0, &scratch[R_WF]) ||
           make_reorder(out ? &out[R_WD] : NULL, &uw, wd, 0, &scratch[R_WD]) ||
           make_reorder(out ? &out[R_DW_ACC] : NULL, dwb, &udw, 1, &scratch[R_DW_ACC]) ||
           make_reorder(out ? &out[R_DX_ACC] : NULL, dxn, xn, 1, &scratch[R_DX_ACC]) ||
           (s->dtype != BK_DTYPE_F32 &&
            make_reorder(out ? &out[R_DX] : NULL, dxn, xn, 0, &scratch[R_DX]));
}

/* the workspace of each kernel: blocked weights (and dx when accumulating), then the scratchpad
 * its convolution and its reorders share (they run one after the other) */
struct conv_ws {
    size_t x, w_fwd, w_bwd_d, dw, db, scr_fwd, scr_bwd_d, scr_bwd_w;
    size_t x32, dy32; /* conv_filter_f32: x and dy converted to fp32 (else 0) */
    size_t fwd, bwd_d, bwd_w; /* totals */
};

/* r: the scratchpad sizes of the shape's reorders (conv_reorders) */
static void conv_ws_layout(struct conv_ws *l, const struct conv_pds *p, const struct bk_conv2d *s,
                           const size_t r[R_COUNT])
{
    l->x = ONEDNN_ALIGN64((size_t)s->n * s->ci * s->h * s->w * sizeof(float));
    l->w_fwd = ONEDNN_ALIGN64(onednn_md_bytes(p->fwd, dnnl_query_weights_md));
    l->w_bwd_d = ONEDNN_ALIGN64(onednn_md_bytes(p->bwd_d, dnnl_query_weights_md));
    l->dw = ONEDNN_ALIGN64(onednn_md_bytes(p->bwd_w, dnnl_query_diff_weights_md));
    l->db = ONEDNN_ALIGN64((size_t)s->co * sizeof(float));
    l->scr_fwd = ONEDNN_ALIGN64(max2(onednn_md_bytes(p->fwd, dnnl_query_scratchpad_md), r[R_WF]));
    l->scr_bwd_d = ONEDNN_ALIGN64(max2(onednn_md_bytes(p->bwd_d, dnnl_query_scratchpad_md),
                                max2(r[R_WD], max2(r[R_DX_ACC], r[R_DX]))));
    l->scr_bwd_w = ONEDNN_ALIGN64(max2(onednn_md_bytes(p->bwd_w, dnnl_query_scratchpad_md), r[R_DW_ACC]));
    l->fwd = l->w_fwd + l->scr_fwd;
    l->bwd_d = l->x + l->w_bwd_d + l->scr_bwd_d;
    const int f32w = conv_filter_f32(s);
    l->x32 = f32w ? ONEDNN_ALIGN64((size_t)s->n * s->ci * s->h * s->w * sizeof(float)) : 0;
    l->dy32 = f32w ? ONEDNN_ALIGN64((size_t)s->n * s->co * s->ho * s->wo * sizeof(float)) : 0;
    l->bwd_w = l->dw + l->db + l->scr_bwd_w + l->x32 + l->dy32;
    struct conv_wgrad wg;
    if (conv_filter_gemm(s, &wg)) l->bwd_w = conv_filter_ws(&wg); /* oneDNN's unused */
}

/* Planned at the machine's core count, the most threads a job runs with: oneDNN's scratchpad
 * grows with the thread count it was created for. */
/* whether ctx runs s as wino.c's Winograd (fast mode; ws sized so in the planning thread's) */
static int conv_wino(const struct bk_conv2d *s, const bk_ctx *ctx)
{
    return ctx && ctx->fast && cpu_wino_applies(s);
}

size_t cpu_conv2d_ws_bytes(const struct bk_conv2d *s)
{
    if (conv_check(s) != BK_OK) return 0;
    if (!cpu_parity_now() && cpu_wino_applies(s)) return cpu_wino_ws_bytes(s);
    int saved = omp_get_max_threads();
    omp_set_num_threads(cpu_threads(NULL));
    size_t best = 0;
    for (int bias = 0; bias < 2; bias++) {
        struct conv_pds p;
        if (conv_pds_make(&p, s, bias) != BK_OK) continue;
        size_t r[R_COUNT];
        if (!conv_reorders(NULL, r, &p, s)) {
            struct conv_ws l;
            conv_ws_layout(&l, &p, s, r);
            best = max2(best, max2(l.fwd, max2(l.bwd_d, l.bwd_w)));
        }
        conv_pds_free(&p);
    }
    omp_set_num_threads(saved);
    return best;
}

/* ---- the per-job cache of primitives ---- */

enum { M_X, M_Y, M_DXT, M_WF, M_WD, M_DWB, M_B, M_DB, M_SF, M_SD, M_SW, M_X32, M_DY32, M_COUNT };

struct conv_entry {
    struct bk_conv2d s;
    int bias;
    struct conv_ws l;
    struct conv_wgrad wg; /* conv_filter_gemm's plan, when `gemm` */
    int gemm;
    bk_ctx **sub; /* wg.sliced: a one-thread context per planned thread (its GEMMs) */
    size_t planned; /* cpu_conv2d_ws_bytes: what the caller's ws holds */
    dnnl_primitive_t fwd, bwd_d, bwd_w;
    dnnl_primitive_t ro[R_COUNT]; /* conv_reorders' */
    dnnl_memory_t m[M_COUNT];
    dnnl_memory_t uw, udw; /* OIHW weights (s.dtype), OIHW weight gradient (fp32) */
};

static void entry_free(void *entry)
{
    struct conv_entry *e = entry;
    dnnl_primitive_t prims[3] = {e->fwd, e->bwd_d, e->bwd_w};
    for (int i = 0; i < 3; i++)
        if (prims[i]) dnnl_primitive_destroy(prims[i]);
    for (int i = 0; i < R_COUNT; i++)
        if (e->ro[i]) dnnl_primitive_destroy(e->ro[i]);
    for (int i = 0; i < M_COUNT; i++)
        if (e->m[i]) dnnl_memory_destroy(e->m[i]);
    if (e->uw) dnnl_memory_destroy(e->uw);
    if (e->udw) dnnl_memory_destroy(e->udw);
    if (e->sub)
        for (int i = 0; i < e->wg.threads; i++) cpu_ctx_free(e->sub[i]);
    free(e->sub);
}

void cpu_conv_cache_free(bk_ctx *ctx)
{
    onednn_cache_free(&ctx->conv, sizeof(struct conv_entry), entry_free);
}

static int entry_init(struct conv_entry *e, const struct bk_conv2d *s, int bias)
{
    memset(e, 0, sizeof *e);
    e->s = *s;
    e->bias = bias;
    struct conv_pds p;
    if (conv_pds_make(&p, s, bias) != BK_OK) return -1;
    int rc = -1;
    const dnnl_memory_desc_t *xn = dnnl_primitive_desc_query_md(p.fwd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *dxn =
        dnnl_primitive_desc_query_md(p.bwd_d, dnnl_query_diff_src_md, 0);
    const dnnl_memory_desc_t *yn = dnnl_primitive_desc_query_md(p.fwd, dnnl_query_dst_md, 0);
    const dnnl_memory_desc_t *wf = dnnl_primitive_desc_query_md(p.fwd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *wd = dnnl_primitive_desc_query_md(p.bwd_d, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *dwb =
        dnnl_primitive_desc_query_md(p.bwd_w, dnnl_query_diff_weights_md, 0);
    dnnl_dims_t bd = {s->co};
    dnnl_memory_desc_t uw, udw, b;
    size_t rs[R_COUNT];
    if (conv_reorders(e->ro, rs, &p, s)) goto out;
    conv_ws_layout(&e->l, &p, s, rs);
    e->gemm = conv_filter_gemm(s, &e->wg);
    if (e->gemm && e->wg.sliced && !e->wg.direct) {
        if (!(e->sub = calloc((size_t)e->wg.threads, sizeof *e->sub))) goto out;
        for (int i = 0; i < e->wg.threads; i++)
            if (cpu_ctx_init(&e->sub[i], 1)) goto out;
    }
    e->planned = cpu_conv2d_ws_bytes(s);
    if (oihw_md(&uw, s, conv_wdt(s)) || oihw_md(&udw, s, dnnl_f32) ||
        dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x))
        goto out;
    if (onednn_make_prim(&e->fwd, p.fwd) || onednn_make_prim(&e->bwd_d, p.bwd_d) || onednn_make_prim(&e->bwd_w, p.bwd_w))
        goto out;
    if (onednn_make_mem(&e->uw, &uw) || onednn_make_mem(&e->udw, &udw) || onednn_make_mem(&e->m[M_X], xn) ||
        onednn_make_mem(&e->m[M_DXT], dxn) ||
        onednn_make_mem(&e->m[M_Y], yn) || onednn_make_mem(&e->m[M_WF], wf) ||
        onednn_make_mem(&e->m[M_WD], wd) || onednn_make_mem(&e->m[M_DWB], dwb) || onednn_make_mem(&e->m[M_B], &b) ||
        onednn_make_mem(&e->m[M_DB], &b) ||
        onednn_make_scratch_mem(&e->m[M_SF], e->l.scr_fwd) ||
        onednn_make_scratch_mem(&e->m[M_SD], e->l.scr_bwd_d) ||
        onednn_make_scratch_mem(&e->m[M_SW], e->l.scr_bwd_w))
        goto out;
    if (conv_filter_f32(s) &&
        (onednn_make_mem(&e->m[M_X32],
                         dnnl_primitive_desc_query_md(p.bwd_w, dnnl_query_src_md, 0)) ||
         onednn_make_mem(&e->m[M_DY32],
                         dnnl_primitive_desc_query_md(p.bwd_w, dnnl_query_diff_dst_md, 0))))
        goto out;
    rc = 0;
out:
    conv_pds_free(&p);
    if (rc) entry_free(e);
    return rc;
}

/* the cached primitives of this shape (created on first use), or NULL */
static struct conv_entry *conv_get(const struct bk_conv2d *s, int bias, bk_ctx *ctx)
{
    struct onednn_cache *c = onednn_cache_get(&ctx->conv);
    if (!c) return NULL;
    struct conv_entry *es = c->e, *e;
    for (int i = 0; i < c->n; i++)
        if (es[i].bias == bias && !memcmp(&es[i].s, s, sizeof *s)) return &es[i];
    if (!(e = onednn_cache_slot(c, sizeof *e))) return NULL;
    if (entry_init(e, s, bias)) {
        fprintf(stderr, "ddpmd: oneDNN has no convolution for N%d %d->%d %dx%d k%dx%d s%d\n", s->n,
                s->ci, s->co, s->h, s->w, s->kh, s->kw, s->stride);
        return NULL;
    }
    c->n++;
    return e;
}

static int run(dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args, bk_ctx *ctx)
{
    return onednn_run(p, ctx->conv->stream, nargs, args);
}

static int reorder(dnnl_primitive_t p, dnnl_memory_t from, dnnl_memory_t to,
                   dnnl_memory_t scratch, bk_ctx *ctx)
{
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, scratch}};
    return run(p, 3, a, ctx);
}

/* the entry for this call, with the thread count and workspace checked */
static struct conv_entry *conv_begin(const struct bk_conv2d *s, int bias, void *ws, bk_ctx *ctx)
{
    if (conv_check(s) != BK_OK || !ctx || !ws) return NULL;
    omp_set_num_threads(cpu_threads(ctx));
    struct conv_entry *e = conv_get(s, bias, ctx);
    if (!e) return NULL;
    const struct conv_ws *l = &e->l;
    if (l->fwd > e->planned || l->bwd_d > e->planned || l->bwd_w > e->planned) {
        fprintf(stderr, "ddpmd: convolution scratch at %d threads exceeds the plan (made for %d)\n",
                ctx->threads, cpu_threads(NULL));
        return NULL;
    }
    return e;
}

/* y (N,Ho,Wo,Co) = conv(x (N,H,W,Ci), w (Co,Ci,Kh,Kw)) + b (Co) (b may be NULL) */
int cpu_conv2d_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                   const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!y || !x || !w) return BK_ERR_INVALID;
    if (conv_wino(s, ctx)) return cpu_wino_fwd(y, x, w, b, ws, s, ctx);
    struct conv_entry *e = conv_begin(s, b != NULL, ws, ctx);
    if (!e) return BK_ERR_INVALID;
    char *p = ws;
    const struct conv_ws *l = &e->l;
    onednn_set(e->m[M_X], x);
    onednn_set(e->m[M_Y], y);
    onednn_set(e->uw, w);
    onednn_set(e->m[M_WF], p);
    onednn_set(e->m[M_SF], p + l->w_fwd);
    if (b) onednn_set(e->m[M_B], b);
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, e->m[M_X]},
                            {DNNL_ARG_WEIGHTS, e->m[M_WF]},
                            {DNNL_ARG_DST, e->m[M_Y]},
                            {DNNL_ARG_SCRATCHPAD, e->m[M_SF]},
                            {DNNL_ARG_BIAS, e->m[M_B]}};
    if (reorder(e->ro[R_WF], e->uw, e->m[M_WF], e->m[M_SF], ctx) || run(e->fwd, b ? 5 : 4, a, ctx))
        return BK_ERR_DEVICE;
    return BK_OK;
}

/* dx (N,H,W,Ci) (=/+= per accum) = conv^T(dy (N,Ho,Wo,Co), w); fp32 dx straight into dx when
 * written (=), else into the workspace, then rounded (and added) into dx */
int cpu_conv2d_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                        const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!dx || !dy || !w) return BK_ERR_INVALID;
    if (conv_wino(s, ctx)) return cpu_wino_bwd_data(dx, dy, w, accum, ws, s, ctx);
    /* backward-data primitives do not depend on the bias: share the biased entry when the
     * forward created one */
    struct conv_entry *e = conv_begin(s, 1, ws, ctx);
    if (!e) return BK_ERR_INVALID;
    char *p = ws;
    const struct conv_ws *l = &e->l;
    onednn_set(e->m[M_Y], dy);
    onednn_set(e->m[M_X], dx);
    onednn_set(e->m[M_DXT], p);
    onednn_set(e->uw, w);
    onednn_set(e->m[M_WD], p + l->x);
    onednn_set(e->m[M_SD], p + l->x + l->w_bwd_d);
    const int direct = !accum && s->dtype == BK_DTYPE_F32;
    dnnl_exec_arg_t a[4] = {{DNNL_ARG_DIFF_DST, e->m[M_Y]},
                            {DNNL_ARG_WEIGHTS, e->m[M_WD]},
                            {DNNL_ARG_DIFF_SRC, direct ? e->m[M_X] : e->m[M_DXT]},
                            {DNNL_ARG_SCRATCHPAD, e->m[M_SD]}};
    if (reorder(e->ro[R_WD], e->uw, e->m[M_WD], e->m[M_SD], ctx) || run(e->bwd_d, 4, a, ctx))
        return BK_ERR_DEVICE;
    if (accum && s->dtype != BK_DTYPE_F32) {
        /* the fp32 dx (NHWC, dense like dx) rounded, then added: backend.h's 16-bit += */
        cpu_accum16(dx, (float *)p, s->dtype, (size_t)s->n * s->ci * s->h * s->w, ctx);
        return BK_OK;
    }
    if (!direct && reorder(e->ro[accum ? R_DX_ACC : R_DX], e->m[M_DXT], e->m[M_X], e->m[M_SD],
                           ctx))
        return BK_ERR_DEVICE;
    return BK_OK;
}

/* GCC's vectors for the filter gradient's copies and sums (AVX2 registers) */
typedef float wg_f8 __attribute__((vector_size(32)));
typedef unsigned char wg_b32 __attribute__((vector_size(32)));
typedef uint32_t wg_u8 __attribute__((vector_size(32)));
typedef uint16_t wg_h8 __attribute__((vector_size(16)));

/* conv_filter_gemm's columns of output pixels p0 .. p0 + np - 1 into cols (np, Kh*Kw*Ci): per
 * pixel its Kh*Kw input rows of Ci (bf16 x, NHWC), tap by tap, zeros where a tap reads padding */
static void conv_im2col(uint16_t *cols, const uint16_t *x, int p0, int np,
                        const struct bk_conv2d *s, int threads)
{
    const int kc = s->kh * s->kw * s->ci, hw = s->ho * s->wo;
    const size_t row = (size_t)s->ci * 2;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (threads > 1 && (size_t)np * kc >= 65536)
    for (int q = 0; q < np; q++) {
        const int p = p0 + q, n = p / hw, oy = p % hw / s->wo, ox = p % s->wo;
        uint16_t *d = cols + (size_t)q * kc;
        for (int ky = 0; ky < s->kh; ky++) {
            const int iy = oy * s->stride - s->pad_t + ky;
            for (int kx = 0; kx < s->kw; kx++, d += s->ci) {
                const int ix = ox * s->stride - s->pad_l + kx;
                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) {
                    memset(d, 0, row);
                } else {
                    const uint16_t *src = x + (((size_t)n * s->h + iy) * s->w + ix) * s->ci;
                    if (row % 32) {
                        memcpy(d, src, row);
                    } else { /* inline 32-byte moves: a call per short row costs more */
                        for (size_t b = 0; b < row; b += 32) {
                            wg_b32 v;
                            memcpy(&v, (const char *)src + b, 32);
                            memcpy((char *)d + b, &v, 32);
                        }
                    }
                }
            }
        }
    }
}

/* 8 bf16 values as fp32 */
static inline wg_f8 wg_load8(const uint16_t *p)
{
    wg_h8 h;
    memcpy(&h, p, sizeof h);
    return (wg_f8)(__builtin_convertvector(h, wg_u8) << 16);
}

/* the direct filter gradient of output pixels p0 .. p1 - 1 into acc (Kh*Kw, Ci, Co), fp32, for
 * the thin shapes (Co or Ci 1: a GEMM would be a GEMV or 9 columns wide): per tap and block of
 * 16 along the longer axis (Ci when Co is 1, else Co), row of output pixels by row, the products
 * (exact in fp32: bf16 values) summed in two sets of registers, the pixels alternating between
 * them in a row, the two added at the end: a fixed order for the pixel range */
static void conv_filter_direct(float *acc, const uint16_t *dy, const uint16_t *x, int p0, int p1,
                               const struct bk_conv2d *s)
{
    const int hw = s->ho * s->wo, ci = s->ci, co = s->co, len = co == 1 ? ci : co;
    const int st = s->stride;
    for (int t = 0; t < s->kh * s->kw; t++) {
        const int ky = t / s->kw, kx = t % s->kw;
        /* the output columns whose tap reads inside x: lo .. hi - 1 */
        const int lo = s->pad_l - kx > 0 ? (s->pad_l - kx + st - 1) / st : 0;
        const int hi = s->w - 1 + s->pad_l - kx < 0 ? 0 : (s->w - 1 + s->pad_l - kx) / st + 1;
        for (int v0 = 0; v0 < len; v0 += 16) {
            const int nv = len - v0 < 16 ? len - v0 : 16;
            wg_f8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
            float a[16] = {0};
            for (int p = p0; p < p1;) { /* a row of output pixels at a time */
                const int n = p / hw, oy = p % hw / s->wo, ox0 = p % s->wo;
                const int end = p + (s->wo - ox0) < p1 ? p + (s->wo - ox0) : p1;
                const int iy = oy * st - s->pad_t + ky, row = p - ox0;
                const int oxa = ox0 > lo ? ox0 : lo, oxb = end - row < hi ? end - row : hi;
                p = end;
                if (iy < 0 || iy >= s->h) continue;
                const uint16_t *xrow = x + ((size_t)n * s->h + iy) * s->w * ci;
                /* vector operand and scalar of output column ox */
#define WG_V(ox) (co == 1 ? xrow + (size_t)((ox) * st - s->pad_l + kx) * ci + v0 \
                          : dy + (size_t)(row + (ox)) * co + v0)
#define WG_G(ox) half_bits_f32((uint32_t)(co == 1 ? dy[row + (ox)]                        \
                                                 : xrow[(ox) * st - s->pad_l + kx]) << 16)
                if (nv < 16) {
                    for (int ox = oxa; ox < oxb; ox++) {
                        const uint16_t *v = WG_V(ox);
                        const float g = WG_G(ox);
                        for (int j = 0; j < nv; j++)
                            a[j] += g * half_bits_f32((uint32_t)v[j] << 16);
                    }
                    continue;
                }
                int ox = oxa;
                for (; ox + 1 < oxb; ox += 2) {
                    const uint16_t *v = WG_V(ox), *w = WG_V(ox + 1);
                    const float g = WG_G(ox), h = WG_G(ox + 1);
                    a0 += g * wg_load8(v);
                    a1 += g * wg_load8(v + 8);
                    b0 += h * wg_load8(w);
                    b1 += h * wg_load8(w + 8);
                }
                if (ox < oxb) {
                    const uint16_t *v = WG_V(ox);
                    const float g = WG_G(ox);
                    a0 += g * wg_load8(v);
                    a1 += g * wg_load8(v + 8);
                }
#undef WG_V
#undef WG_G
            }
            if (nv == 16) {
                a0 += b0;
                a1 += b1;
                memcpy(a, &a0, sizeof a0);
                memcpy(a + 8, &a1, sizeof a1);
            }
            memcpy(acc + (size_t)t * len + v0, a, (size_t)nv * sizeof(float));
        }
    }
}

/* the fp32 sums at sum (ns of them, `one` floats apart), (Co, Kh, Kw, Ci) or with tco (Kh, Kw,
 * Ci, Co: the direct loop's and wgrad_bf16.c's), added in order into the first (in place,
 * streaming: an element at a time across the sums read them scattered), then into the OIHW dw */
static void conv_filter_add(float *dw, float *sum, int ns, size_t one, int tco,
                            const struct bk_conv2d *s, bk_ctx *ctx)
{
    const int taps = s->kh * s->kw;
    const size_t kc = (size_t)taps * s->ci, nw = (size_t)s->co * kc;
    const size_t st = (size_t)s->ci * (tco ? (size_t)s->co : 1); /* a tap's stride in the sum */
    const int nb = (int)((nw + 4095) / 4096);
#pragma omp parallel for num_threads(cpu_threads(ctx)) schedule(static) if (nw * ns >= 65536)
    for (int b = 0; b < nb * (ns > 1); b++) {
        const size_t j0 = (size_t)b * 4096, j1 = j0 + 4096 < nw ? j0 + 4096 : nw;
        for (int i = 1; i < ns; i++) {
            const float *q = sum + (size_t)i * one;
#pragma omp simd
            for (size_t j = j0; j < j1; j++) sum[j] += q[j];
        }
    }
    if (tco) {
        /* in tiles of 16 outputs x 16 inputs: a line of the sum holds 16 outputs, and a whole
         * output's row of dw reads Ci * Kh * Kw of them (147 KiB at 256 -> 256 3x3, past L1:
         * 2.5% of that filter gradient) */
        const int nob = (s->co + 15) / 16;
#pragma omp parallel for num_threads(cpu_threads(ctx)) schedule(static) if (nw >= 65536)
        for (int ob = 0; ob < nob; ob++)
            for (int c0 = 0; c0 < s->ci; c0 += 16)
                for (int o = 16 * ob; o < s->co && o < 16 * ob + 16; o++) {
                    float *d = dw + (size_t)o * kc;
                    for (int c = c0; c < s->ci && c < c0 + 16; c++)
                        for (int t = 0; t < taps; t++)
                            d[c * taps + t] += sum[o + (size_t)c * s->co + t * st];
                }
        return;
    }
    /* an output's row of dw from its row of the sum (the tiles above cost 512 -> 256 4x4 a
     * quarter more here) */
#pragma omp parallel for num_threads(cpu_threads(ctx)) schedule(static) if (nw >= 65536)
    for (int o = 0; o < s->co; o++) {
        float *d = dw + (size_t)o * kc;
        for (int c = 0; c < s->ci; c++)
            for (int t = 0; t < taps; t++) d[c * taps + t] += sum[o * kc + c + t * st];
    }
}

/* cpu_wgrad_bf16_rows on the calling thread, its scratch shown to cpu_wgrad_bf16_scratch */
static void conv_wgrad_rows(float *acc, float *db, const uint16_t *dy, const uint16_t *x,
                            int row0, int row1, int c0, int c1, int rb,
                            const struct bk_conv2d *s, void *scratch)
{
    if (cpu_wgrad_bf16_scratch)
        cpu_wgrad_bf16_scratch(omp_get_thread_num(), scratch,
                               cpu_wgrad_bf16_bytes(s, rb, c1 - c0));
    cpu_wgrad_bf16_rows(acc, db, dy, x, row0, row1, c0, c1, rb, s, scratch);
}

/* The sliced filter gradient (conv_filter_gemm's plan wg, sliced): slice i of wg->slices, the
 * chunks i * chunks / slices .. (i + 1) * chunks / slices - 1, runs on one thread, chunk by
 * chunk: its columns (im2col on that thread, into the thread's own columns) then a one-thread
 * GEMM (the thread's sub context) added into slice i's own fp32 partial sum; or the direct loop.
 * The partials are added in slice order at the end: the slices depend on the shape only, so the
 * bits do not depend on the thread count. ws: the partials, then per thread columns + scratch. */
static int conv_filter_slices(float *dw, float *db, const uint16_t *dy, const uint16_t *x, char *ws,
                              const struct conv_wgrad *wg, bk_ctx **sub,
                              const struct bk_conv2d *s, bk_ctx *ctx)
{
    const int ns = wg->slices;
    const size_t one = wg->sum / (size_t)ns / sizeof(float);
    int err[WGRAD_SLICES] = {0};
#pragma omp parallel for num_threads(cpu_threads(ctx)) schedule(static)
    for (int i = 0; i < ns; i++) {
        const int t = omp_get_thread_num();
        float *part = (float *)ws + (size_t)i * one, *pdb = part + (size_t)s->co * wg->kc;
        memset(part, 0, (size_t)s->co * (wg->kc + 1) * sizeof(float));
        const int c0 = (int)((long long)i * wg->chunks / ns);
        const int c1 = (int)((long long)(i + 1) * wg->chunks / ns);
        const int nrow = s->n * s->ho;
        const int r0 = (int)((long long)i * nrow / ns), r1 = (int)((long long)(i + 1) * nrow / ns);
        /* the slice's output pixels q0 .. q1 - 1: whole rows for wgrad_bf16.c, else chunks */
        const int q0 = wg->rows ? r0 * s->wo : c0 * wg->chunk;
        const int q1 = wg->rows ? r1 * s->wo : c1 * wg->chunk < wg->px ? c1 * wg->chunk : wg->px;
        if (db && !wg->rows) /* the slice's dy summed, pixel by pixel (wgrad_bf16.c: too) */
            for (int p = q0; p < q1; p++) {
                const uint16_t *g = dy + (size_t)p * s->co;
#pragma omp simd
                for (int o = 0; o < s->co; o++) pdb[o] += half_bits_f32((uint32_t)g[o] << 16);
            }
        if (wg->direct) {
            conv_filter_direct(part, dy, x, q0, q1, s);
            continue;
        }
        uint16_t *cols = (uint16_t *)(ws + wg->sum + (size_t)t * (wg->cols + wg->scr));
        if (wg->rows) {
            conv_wgrad_rows(part, db ? pdb : NULL, dy, x, r0, r1, 0, s->ci, wg->rows, s, cols);
            continue;
        }
        char *scr = (char *)cols + wg->cols;
        for (int c = c0; c < c1 && !err[i]; c++) {
            const int p0 = c * wg->chunk, np = wg->px - p0 < wg->chunk ? wg->px - p0 : wg->chunk;
            conv_im2col(cols, x, p0, np, s, 1);
            err[i] = cpu_gemm(np == wg->chunk ? &wg->g : &wg->last, part,
                              dy + (size_t)p0 * s->co, cols, NULL, scr, wg->scr, sub[t]);
        }
    }
    for (int i = 0; i < ns; i++)
        if (err[i]) return err[i];
    conv_filter_add(dw, (float *)ws, ns, one, wg->direct || wg->rows, s, ctx);
    if (db)
        for (int o = 0; o < s->co; o++) {
            const float *q = (const float *)ws + (size_t)s->co * wg->kc + o;
            float r = q[0];
            for (int i = 1; i < ns; i++) r += q[(size_t)i * one];
            db[o] += r;
        }
    return BK_OK;
}

/* conv_filter_gemm's filter gradient (its plan wg, ws as conv_ws_layout lays it out) */
static int conv_filter_run(float *dw, float *db, const uint16_t *dy, const uint16_t *x, char *ws,
                           const struct conv_wgrad *wg, bk_ctx **sub, const struct bk_conv2d *s,
                           bk_ctx *ctx)
{
    if (wg->sliced) return conv_filter_slices(dw, db, dy, x, ws, wg, sub, s, ctx);
    float *sum = wg->into_dw ? dw : (float *)ws;
    uint16_t *cols = (uint16_t *)(ws + wg->sum);
    char *scr = ws + wg->sum + wg->cols;
    if (!wg->into_dw) memset(sum, 0, (size_t)s->co * wg->kc * sizeof(float));
    /* split: channel groups on the threads, each its slice of cols + scr; the first group's
     * task sums db too (fp32 in pixel order, while it copies dy: cpu_col_sums' pass over dy
     * cost 4% of a 256 -> 256 32x32 filter gradient) */
    if (wg->rows) {
        const size_t room = (wg->cols + wg->scr) / (size_t)wg->threads / 64 * 64;
#pragma omp parallel for num_threads(cpu_threads(ctx)) schedule(static)
        for (int i = 0; i < wg->groups; i++) {
            const int c0 = i * wg->cg, c1 = c0 + wg->cg < s->ci ? c0 + wg->cg : s->ci;
            conv_wgrad_rows(sum, i ? NULL : db, dy, x, 0, s->n * s->ho, c0, c1, wg->rows, s,
                            (char *)cols + (size_t)omp_get_thread_num() * room);
        }
    }
    for (int p0 = 0; p0 < wg->px && !wg->rows; p0 += wg->chunk) {
        const int np = wg->px - p0 < wg->chunk ? wg->px - p0 : wg->chunk;
        const struct cpu_gemm_shape *g = np == wg->chunk ? &wg->g : &wg->last;
        if (!wg->cols_in_x) conv_im2col(cols, x, p0, np, s, ctx->threads);
        int rc = cpu_gemm(g, sum, dy + (size_t)p0 * s->co, wg->cols_in_x ? x : cols, NULL, scr,
                          wg->scr, ctx);
        if (rc) return rc;
    }
    if (!wg->into_dw) conv_filter_add(dw, sum, 1, 0, wg->rows > 0, s, ctx);
    if (db && !wg->rows) cpu_col_sums(db, dy, BK_DTYPE_BF16, wg->px, s->co, ctx);
    return BK_OK;
}

/* dw (Co,Ci,Kh,Kw) += dy (*) x; db (Co) += sum of dy over N,Ho,Wo (db may be NULL) */
int cpu_conv2d_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                          const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!dw || !dy || !x) return BK_ERR_INVALID;
    if (conv_wino(s, ctx)) return cpu_wino_bwd_filter(dw, db, dy, x, ws, s, ctx);
    struct conv_entry *e = conv_begin(s, db != NULL, ws, ctx);
    if (!e) return BK_ERR_INVALID;
    char *p = ws;
    const struct conv_ws *l = &e->l;
    if (e->gemm) return conv_filter_run(dw, db, dy, x, p, &e->wg, e->sub, s, ctx);
    onednn_set(e->m[M_Y], dy);
    onednn_set(e->m[M_X], x);
    onednn_set(e->m[M_DWB], p);
    float *dbt = (float *)(p + l->dw);
    onednn_set(e->m[M_DB], dbt);
    onednn_set(e->m[M_SW], p + l->dw + l->db);
    onednn_set(e->udw, dw);
    const int f32w = conv_filter_f32(s);
    if (f32w) { /* x and dy in fp32 after the scratchpad */
        char *x32 = p + l->dw + l->db + l->scr_bwd_w, *dy32 = x32 + l->x32;
        if (cpu_convert(x32, BK_DTYPE_F32, x, s->dtype, (size_t)s->n * s->ci * s->h * s->w, ctx) ||
            cpu_convert(dy32, BK_DTYPE_F32, dy, s->dtype,
                        (size_t)s->n * s->co * s->ho * s->wo, ctx))
            return BK_ERR_DEVICE;
        onednn_set(e->m[M_X32], x32);
        onednn_set(e->m[M_DY32], dy32);
    }
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_DIFF_DST, e->m[f32w ? M_DY32 : M_Y]},
                            {DNNL_ARG_SRC, e->m[f32w ? M_X32 : M_X]},
                            {DNNL_ARG_DIFF_WEIGHTS, e->m[M_DWB]},
                            {DNNL_ARG_SCRATCHPAD, e->m[M_SW]},
                            {DNNL_ARG_DIFF_BIAS, e->m[M_DB]}};
    if (run(e->bwd_w, db ? 5 : 4, a, ctx) ||
        reorder(e->ro[R_DW_ACC], e->m[M_DWB], e->udw, e->m[M_SW], ctx))
        return BK_ERR_DEVICE;
    if (db)
        for (int o = 0; o < s->co; o++) db[o] += dbt[o];
    return BK_OK;
}
