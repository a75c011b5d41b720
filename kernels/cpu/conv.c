/* conv.c - CPU 2-D convolution (NCHW, OIHW): im2col + OpenBLAS sgemm per image, col2im for the
 * data gradient. The im2col buffer of one image lives in `ws`; 1x1 stride-1 unpadded convs use
 * the activations directly and need no workspace.
 */
#include <limits.h>
#include <string.h>

#include "cpu.h"

/* 1x1, stride 1, no padding: the input image (Ci, H*W) already is the column matrix */
static int conv_is_pointwise(const struct bk_conv2d *s)
{
    return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad_t == 0 && s->pad_l == 0 &&
           s->pad_b == 0 && s->pad_r == 0;
}

static int conv_check(const struct bk_conv2d *s)
{
    if (!s || s->n < 1 || s->ci < 1 || s->h < 1 || s->w < 1 || s->co < 1) return BK_ERR_INVALID;
    if (s->pad_t < 0 || s->pad_l < 0 || s->pad_b < 0 || s->pad_r < 0) return BK_ERR_INVALID;
    struct bk_conv2d t = *s;
    if (bk_conv2d_init(&t) != BK_OK || t.ho != s->ho || t.wo != s->wo) return BK_ERR_INVALID;
    /* BLAS dimensions are int */
    if ((long long)s->ci * s->kh * s->kw > INT_MAX || (long long)s->ho * s->wo > INT_MAX ||
        (long long)s->h * s->w > INT_MAX)
        return BK_ERR_INVALID;
    return BK_OK;
}

size_t cpu_conv2d_ws_bytes(const struct bk_conv2d *s)
{
    if (conv_check(s) != BK_OK || conv_is_pointwise(s)) return 0;
    /* one image's column matrix (Ci*Kh*Kw, Ho*Wo), shared by all three kernels */
    return (size_t)s->ci * s->kh * s->kw * (size_t)s->ho * s->wo * sizeof(float);
}

/* col (Ci*Kh*Kw, Ho*Wo) from one image x (Ci,H,W); zero where the window hits padding */
static void conv_im2col(float *col, const float *x, const struct bk_conv2d *s, bk_ctx *ctx)
{
    const int rows = s->ci * s->kh * s->kw, hw_o = s->ho * s->wo;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int r = 0; r < rows; r++) {
        int kj = r % s->kw, ki = (r / s->kw) % s->kh, c = r / (s->kw * s->kh);
        const float *xc = x + (size_t)c * s->h * s->w;
        float *dst = col + (size_t)r * hw_o;
        for (int oh = 0; oh < s->ho; oh++) {
            int ih = oh * s->stride - s->pad_t + ki;
            float *d = dst + (size_t)oh * s->wo;
            if (ih < 0 || ih >= s->h) {
                memset(d, 0, (size_t)s->wo * sizeof(float));
                continue;
            }
            const float *xr = xc + (size_t)ih * s->w;
            for (int ow = 0; ow < s->wo; ow++) {
                int iw = ow * s->stride - s->pad_l + kj;
                d[ow] = (iw >= 0 && iw < s->w) ? xr[iw] : 0.0f;
            }
        }
    }
}

/* dx (Ci,H,W) (=/+= per accum) from col (Ci*Kh*Kw, Ho*Wo). One thread owns one channel and
 * adds its Kh*Kw rows in a fixed order, so the result does not depend on the thread count. */
static void conv_col2im(float *dx, const float *col, int accum, const struct bk_conv2d *s,
                        bk_ctx *ctx)
{
    const int hw_o = s->ho * s->wo, kk = s->kh * s->kw;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int c = 0; c < s->ci; c++) {
        float *xc = dx + (size_t)c * s->h * s->w;
        if (!accum) memset(xc, 0, (size_t)s->h * s->w * sizeof(float));
        for (int k = 0; k < kk; k++) {
            int ki = k / s->kw, kj = k % s->kw;
            const float *src = col + ((size_t)c * kk + k) * hw_o;
            for (int oh = 0; oh < s->ho; oh++) {
                int ih = oh * s->stride - s->pad_t + ki;
                if (ih < 0 || ih >= s->h) continue;
                float *xr = xc + (size_t)ih * s->w;
                const float *sr = src + (size_t)oh * s->wo;
                for (int ow = 0; ow < s->wo; ow++) {
                    int iw = ow * s->stride - s->pad_l + kj;
                    if (iw >= 0 && iw < s->w) xr[iw] += sr[ow];
                }
            }
        }
    }
}

/* y (N,Co,Ho,Wo) = conv(x (N,Ci,H,W), w (Co,Ci,Kh,Kw)) + b (Co) (b may be NULL) */
int cpu_conv2d_fwd(float *y, const float *x, const float *w, const float *b, void *ws,
                   const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (conv_check(s) != BK_OK || !y || !x || !w || !ctx) return BK_ERR_INVALID;
    const int pw = conv_is_pointwise(s);
    if (!pw && !ws) return BK_ERR_INVALID;
    const int kdim = s->ci * s->kh * s->kw, hw_o = s->ho * s->wo;
    const size_t x_img = (size_t)s->ci * s->h * s->w, y_img = (size_t)s->co * hw_o;
    float *col = ws;
    for (int n = 0; n < s->n; n++) {
        const float *xn = x + (size_t)n * x_img;
        float *yn = y + (size_t)n * y_img;
        if (!pw) conv_im2col(col, xn, s, ctx);
        if (b) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
            for (int o = 0; o < s->co; o++)
                for (int p = 0; p < hw_o; p++) yn[(size_t)o * hw_o + p] = b[o];
        }
        cpu_gemm(0, 0, s->co, hw_o, kdim, 1.0f, w, kdim,
                    pw ? xn : col, hw_o, b ? 1.0f : 0.0f, yn, hw_o, ctx);
    }
    return BK_OK;
}

/* dx (N,Ci,H,W) (=/+= per accum) = conv^T(dy (N,Co,Ho,Wo), w) */
int cpu_conv2d_bwd_data(float *dx, const float *dy, const float *w, int accum, void *ws,
                        const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (conv_check(s) != BK_OK || !dx || !dy || !w || !ctx) return BK_ERR_INVALID;
    const int pw = conv_is_pointwise(s);
    if (!pw && !ws) return BK_ERR_INVALID;
    const int kdim = s->ci * s->kh * s->kw, hw_o = s->ho * s->wo;
    const size_t x_img = (size_t)s->ci * s->h * s->w, y_img = (size_t)s->co * hw_o;
    float *col = ws;
    for (int n = 0; n < s->n; n++) {
        const float *dyn = dy + (size_t)n * y_img;
        float *dxn = dx + (size_t)n * x_img;
        /* col (Ci*Kh*Kw, Ho*Wo) = w^T (Ci*Kh*Kw, Co) @ dy_n (Co, Ho*Wo) */
        cpu_gemm(1, 0, kdim, hw_o, s->co, 1.0f, w, kdim,
                    dyn, hw_o, pw && accum ? 1.0f : 0.0f, pw ? dxn : col, hw_o, ctx);
        if (!pw) conv_col2im(dxn, col, accum, s, ctx);
    }
    return BK_OK;
}

/* dw (Co,Ci,Kh,Kw) += dy (*) x; db (Co) += sum of dy over N,Ho,Wo (db may be NULL) */
int cpu_conv2d_bwd_filter(float *dw, float *db, const float *dy, const float *x, void *ws,
                          const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (conv_check(s) != BK_OK || !dw || !dy || !x || !ctx) return BK_ERR_INVALID;
    const int pw = conv_is_pointwise(s);
    if (!pw && !ws) return BK_ERR_INVALID;
    const int kdim = s->ci * s->kh * s->kw, hw_o = s->ho * s->wo;
    const size_t x_img = (size_t)s->ci * s->h * s->w, y_img = (size_t)s->co * hw_o;
    float *col = ws;
    /* images are added one after another into dw: a fixed order */
    for (int n = 0; n < s->n; n++) {
        const float *xn = x + (size_t)n * x_img;
        const float *dyn = dy + (size_t)n * y_img;
        if (!pw) conv_im2col(col, xn, s, ctx);
        /* dw (Co, Ci*Kh*Kw) += dy_n (Co, Ho*Wo) @ col^T (Ho*Wo, Ci*Kh*Kw) */
        cpu_gemm(0, 1, s->co, kdim, hw_o, 1.0f, dyn, hw_o,
                    pw ? xn : col, hw_o, 1.0f, dw, kdim, ctx);
    }
    if (db) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int o = 0; o < s->co; o++) {
            double acc = 0.0;
            for (int n = 0; n < s->n; n++) {
                const float *r = dy + (size_t)n * y_img + (size_t)o * hw_o;
                for (int p = 0; p < hw_o; p++) acc += r[p];
            }
            db[o] += (float)acc;
        }
    }
    return BK_OK;
}
