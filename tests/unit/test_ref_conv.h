/* test_ref_conv.h - the float64 reference convolution the CPU kernel tests share (test_ops_dense
 * for fp32, test_ops_half for bf16): NCHW x, OIHW w, square stride, padding per side.
 */
#ifndef DDPMD_TEST_REF_CONV_H
#define DDPMD_TEST_REF_CONV_H

#include <math.h>
#include <stddef.h>

#include "backend.h"

/* y (N,Co,Ho,Wo) = conv(x, w) (+ b, may be NULL); with abs, the sum of the terms' absolute values
 * (the scale a rounding error bound is relative to) */
static inline void tu_ref_conv(double *y, const double *x, const double *w, const double *b,
                               const struct bk_conv2d *s, int abs)
{
    for (int n = 0; n < s->n; n++)
        for (int o = 0; o < s->co; o++)
            for (int oh = 0; oh < s->ho; oh++)
                for (int ow = 0; ow < s->wo; ow++) {
                    double acc = b ? (abs ? fabs(b[o]) : b[o]) : 0.0;
                    for (int c = 0; c < s->ci; c++)
                        for (int ki = 0; ki < s->kh; ki++)
                            for (int kj = 0; kj < s->kw; kj++) {
                                int ih = oh * s->stride - s->pad_t + ki;
                                int iw = ow * s->stride - s->pad_l + kj;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                double xv = x[(((size_t)n * s->ci + c) * s->h + ih) * s->w + iw];
                                double wv = w[(((size_t)o * s->ci + c) * s->kh + ki) * s->kw + kj];
                                acc += abs ? fabs(xv * wv) : xv * wv;
                            }
                    y[(((size_t)n * s->co + o) * s->ho + oh) * s->wo + ow] = acc;
                }
}

#endif
