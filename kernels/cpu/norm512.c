/* norm512.c - the group norm's task bodies (norm_gn.h) compiled for AVX-512 by a target pragma:
 * the same operations lane for lane, so the same bits as norm.c's AVX2 copy. Called only where
 * cpu_isa() reports AVX-512 (the rest of the backend is built for x86-64-v3).
 */
#include <math.h>

#include "cpu.h"
#include "typed.h"
#include "vmath.h"

#include "target512_push.h"

#include "norm_gn.h"

int gn_fwd_task_avx512(int t, void *y, float *mean, float *rstd, void *xo, const void *x,
                       const void *xb, const void *yb, const void *yr, const float *gamma,
                       const float *beta, int c, int hw, int groups, float eps, int silu, int blk,
                       int nblk, int dt)
{
    return TY_DISPATCH(dt, gn_fwd_task, t, y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, c, hw,
                       groups, eps, silu, blk, nblk);
}

int gn_bwd_image_avx512(void *dx, double *sg, double *sb, void *db, const void *dy, const void *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int db_accum, int db_of_dx, int c, int hw,
                        int groups, int img, int c0, int nc, float *gzbuf, int dt)
{
    return TY_DISPATCH(dt, gn_bwd_image, dx, sg, sb, db, dy, x, gamma, beta, mean, rstd, accum,
                       db_accum, db_of_dx, c, hw, groups, img, c0, nc, gzbuf);
}

#include "target512_pop.h"
