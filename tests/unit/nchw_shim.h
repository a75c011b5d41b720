/* nchw_shim.h - the CPU backend's image kernels seen through NCHW, for kernel tests written
 * against NCHW references (and for comparing with the CUDA backend, which is NCHW). Each
 * nchw_* function has the signature of its cpu_* kernel, converts its image operands to NHWC
 * (the CPU backend's layout), runs the kernel and converts its image results back; a result it
 * accumulates into is converted in first. nchw_cpu_backend() is the CPU backend's table with
 * these wrappers in place and `nhwc` cleared. Test code only: it allocates per call.
 */
#ifndef DDPMD_NCHW_SHIM_H
#define DDPMD_NCHW_SHIM_H

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"

/* dst (N,HW,C) from src (N,C,HW), elements of es bytes (the typed kernels' 16-bit ones too);
 * with (c, hw) swapped, NHWC back to NCHW */
static inline void shim_transpose_es(void *dst, const void *src, int n, int c, int hw, size_t es)
{
    for (int s = 0; s < n; s++)
        for (int ch = 0; ch < c; ch++)
            for (int p = 0; p < hw; p++)
                memcpy((char *)dst + (((size_t)s * hw + p) * c + ch) * es,
                       (const char *)src + (((size_t)s * c + ch) * hw + p) * es, es);
}

static inline void shim_transpose(float *dst, const float *src, int n, int c, int hw)
{
    shim_transpose_es(dst, src, n, c, hw, sizeof(float));
}

/* an NHWC copy of an NCHW image (NULL stays NULL) */
static inline void *shim_in_es(const void *x, int n, int c, int hw, size_t es)
{
    if (!x) return NULL;
    void *t = malloc((size_t)n * c * hw * es + 4);
    shim_transpose_es(t, x, n, c, hw, es);
    return t;
}

static inline float *shim_in(const float *x, int n, int c, int hw)
{
    return shim_in_es(x, n, c, hw, sizeof(float));
}

/* NHWC scratch for an NCHW result; its current contents converted when accumulating */
static inline void *shim_out_es(const void *x, int accum, int n, int c, int hw, size_t es)
{
    if (!x) return NULL;
    if (accum) return shim_in_es(x, n, c, hw, es);
    return malloc((size_t)n * c * hw * es + 4);
}

static inline float *shim_out(const float *x, int accum, int n, int c, int hw)
{
    return shim_out_es(x, accum, n, c, hw, sizeof(float));
}

/* the NHWC result t back into NCHW x; frees t */
static inline void shim_done_es(void *x, void *t, int n, int c, int hw, size_t es)
{
    if (!t) return;
    shim_transpose_es(x, t, n, hw, c, es);
    free(t);
}

static inline void shim_done(float *x, float *t, int n, int c, int hw)
{
    shim_done_es(x, t, n, c, hw, sizeof(float));
}

static inline int nchw_conv2d_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                           const struct bk_conv2d *s, bk_ctx *ctx)
{
    size_t es = bk_dtype_size(s->dtype);
    void *xt = shim_in_es(x, s->n, s->ci, s->h * s->w, es);
    void *yt = shim_out_es(y, 0, s->n, s->co, s->ho * s->wo, es);
    int rc = cpu_conv2d_fwd(yt, xt, w, b, ws, s, ctx);
    shim_done_es(y, yt, s->n, s->co, s->ho * s->wo, es);
    free(xt);
    return rc;
}

static inline int nchw_conv2d_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                                const struct bk_conv2d *s, bk_ctx *ctx)
{
    size_t es = bk_dtype_size(s->dtype);
    void *gt = shim_in_es(dy, s->n, s->co, s->ho * s->wo, es);
    void *xt = shim_out_es(dx, accum, s->n, s->ci, s->h * s->w, es);
    int rc = cpu_conv2d_bwd_data(xt, gt, w, accum, ws, s, ctx);
    shim_done_es(dx, xt, s->n, s->ci, s->h * s->w, es);
    free(gt);
    return rc;
}

static inline int nchw_conv2d_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                                  const struct bk_conv2d *s, bk_ctx *ctx)
{
    size_t es = bk_dtype_size(s->dtype);
    void *gt = shim_in_es(dy, s->n, s->co, s->ho * s->wo, es);
    void *xt = shim_in_es(x, s->n, s->ci, s->h * s->w, es);
    int rc = cpu_conv2d_bwd_filter(dw, db, gt, xt, ws, s, ctx);
    free(gt);
    free(xt);
    return rc;
}

static inline int nchw_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x,
                              const float *gamma, const float *beta, int n, int c, int hw,
                              int groups, float eps, bk_ctx *ctx)
{
    float *xt = shim_in(x, n, c, hw), *yt = shim_out(y, 0, n, c, hw);
    int rc = cpu_groupnorm_fwd(yt, mean, rstd, xt, gamma, beta, n, c, hw, groups, eps, ctx);
    shim_done(y, yt, n, c, hw);
    free(xt);
    return rc;
}

static inline int nchw_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy,
                              const float *x, const float *gamma, const float *mean,
                              const float *rstd, int accum, int n, int c, int hw, int groups,
                              bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c, hw), *xt = shim_in(x, n, c, hw), *dt = shim_out(dx, accum, n, c, hw);
    int rc = cpu_groupnorm_bwd(dt, dgamma, dbeta, gt, xt, gamma, mean, rstd, accum, n, c, hw,
                               groups, ctx);
    shim_done(dx, dt, n, c, hw);
    free(gt);
    free(xt);
    return rc;
}

static inline int nchw_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw,
                              bk_ctx *ctx)
{
    float *xt = shim_in(x, n, c, hw), *yt = shim_out(y, 0, n, c, hw);
    int rc = cpu_add_bcast_fwd(yt, xt, b, n, c, hw, ctx);
    shim_done(y, yt, n, c, hw);
    free(xt);
    return rc;
}

static inline int nchw_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw,
                              bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c, hw);
    int rc = cpu_add_bcast_bwd(db, gt, accum, n, c, hw, ctx);
    free(gt);
    return rc;
}

static inline int nchw_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2,
                           int hw, bk_ctx *ctx)
{
    float *at = shim_in(a, n, c1, hw), *bt = shim_in(b, n, c2, hw), *yt = shim_out(y, 0, n, c1 + c2, hw);
    int rc = cpu_concat_fwd(yt, at, bt, n, c1, c2, hw, ctx);
    shim_done(y, yt, n, c1 + c2, hw);
    free(at);
    free(bt);
    return rc;
}

static inline int nchw_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n,
                           int c1, int c2, int hw, bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c1 + c2, hw);
    float *at = shim_out(da, accum_a, n, c1, hw), *bt = shim_out(db, accum_b, n, c2, hw);
    int rc = cpu_concat_bwd(at, bt, gt, accum_a, accum_b, n, c1, c2, hw, ctx);
    shim_done(da, at, n, c1, hw);
    shim_done(db, bt, n, c2, hw);
    free(gt);
    return rc;
}

static inline int nchw_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w,
                                       bk_ctx *ctx)
{
    float *xt = shim_in(x, n, c, h * w), *yt = shim_out(y, 0, n, c, 4 * h * w);
    int rc = cpu_upsample_nearest2x_fwd(yt, xt, n, c, h, w, ctx);
    shim_done(y, yt, n, c, 4 * h * w);
    free(xt);
    return rc;
}

static inline int nchw_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h,
                                       int w, bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c, 4 * h * w), *xt = shim_out(dx, accum, n, c, h * w);
    int rc = cpu_upsample_nearest2x_bwd(xt, gt, accum, n, c, h, w, ctx);
    shim_done(dx, xt, n, c, h * w);
    free(gt);
    return rc;
}

static inline int nchw_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c,
                                        int h, int w, bk_ctx *ctx)
{
    float *xt = shim_in(x, n, c, h * w), *yt = shim_out(y, 0, n, c, 4 * h * w);
    int rc = cpu_upsample_bilinear2x_fwd(yt, xt, align_corners, n, c, h, w, ctx);
    shim_done(y, yt, n, c, 4 * h * w);
    free(xt);
    return rc;
}

static inline int nchw_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum,
                                        int n, int c, int h, int w, bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c, 4 * h * w), *xt = shim_out(dx, accum, n, c, h * w);
    int rc = cpu_upsample_bilinear2x_bwd(xt, gt, align_corners, accum, n, c, h, w, ctx);
    shim_done(dx, xt, n, c, h * w);
    free(gt);
    return rc;
}

static inline int nchw_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    float *xt = shim_in(x, n, c, h * w), *yt = shim_out(y, 0, n, c, (h / 2) * (w / 2));
    int rc = cpu_maxpool2x2_fwd(yt, xt, n, c, h, w, ctx);
    shim_done(y, yt, n, c, (h / 2) * (w / 2));
    free(xt);
    return rc;
}

static inline int nchw_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c,
                               int h, int w, bk_ctx *ctx)
{
    float *gt = shim_in(dy, n, c, (h / 2) * (w / 2)), *xt = shim_in(x, n, c, h * w);
    float *dt = shim_out(dx, accum, n, c, h * w);
    int rc = cpu_maxpool2x2_bwd(dt, gt, xt, accum, n, c, h, w, ctx);
    shim_done(dx, dt, n, c, h * w);
    free(gt);
    free(xt);
    return rc;
}

/* the CPU backend with NCHW image kernels */
static inline struct backend nchw_cpu_backend(void)
{
    struct backend b = *backend_cpu();
    b.conv2d_fwd = nchw_conv2d_fwd;
    b.conv2d_bwd_data = nchw_conv2d_bwd_data;
    b.conv2d_bwd_filter = nchw_conv2d_bwd_filter;
    b.groupnorm_fwd = nchw_groupnorm_fwd;
    b.groupnorm_bwd = nchw_groupnorm_bwd;
    b.add_bcast_fwd = nchw_add_bcast_fwd;
    b.add_bcast_bwd = nchw_add_bcast_bwd;
    b.concat_fwd = nchw_concat_fwd;
    b.concat_bwd = nchw_concat_bwd;
    b.upsample_nearest2x_fwd = nchw_upsample_nearest2x_fwd;
    b.upsample_nearest2x_bwd = nchw_upsample_nearest2x_bwd;
    b.upsample_bilinear2x_fwd = nchw_upsample_bilinear2x_fwd;
    b.upsample_bilinear2x_bwd = nchw_upsample_bilinear2x_bwd;
    b.maxpool2x2_fwd = nchw_maxpool2x2_fwd;
    b.maxpool2x2_bwd = nchw_maxpool2x2_bwd;
    b.nhwc = 0;
    return b;
}

#endif
