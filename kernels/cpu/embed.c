/* embed.c - the CPU backend's sinusoidal timestep embedding (diffusers' get_timestep_embedding).
 * The rounding points are fixed so that every backend produces the same floats: the frequency in
 * double rounded to float, the argument t*freq in float, sin/cos in double rounded to float.
 */
#include <math.h>

#include "cpu.h"

/* y (N,dim) from t (N): half = dim/2, freq_i = exp(-ln(max_period) * i / (half - freq_shift)),
 * y[:, :half] = sin(t*freq), y[:, half:2*half] = cos(t*freq) (swapped when flip_sin_to_cos);
 * an odd dim's last column is 0 (diffusers pads). BK_ERR_INVALID when half - freq_shift is 0
 * (every frequency would be NaN or infinite). */
int cpu_timestep_embed_fwd(float *y, const float *t, int n, int dim, int flip_sin_to_cos,
                           float freq_shift, float max_period, bk_ctx *ctx)
{
    int half = dim / 2;
    double denom = (double)half - (double)freq_shift;
    if (n < 0 || dim < 0 || (half > 0 && denom == 0.0)) return BK_ERR_INVALID;
    double lnp = log((double)max_period);
    int first_cos = flip_sin_to_cos != 0;
#pragma omp parallel for num_threads(ctx->threads) if ((long)n * dim >= 16384) schedule(static)
    for (int s = 0; s < n; s++) {
        float ts = t[s];
        float *yr = y + (size_t)s * dim;
        for (int i = 0; i < half; i++) {
            float freq = (float)exp(-lnp * (double)i / denom);
            float arg = ts * freq;
            float sv = (float)sin((double)arg), cv = (float)cos((double)arg);
            yr[i] = first_cos ? cv : sv;
            yr[half + i] = first_cos ? sv : cv;
        }
        if (dim & 1) yr[dim - 1] = 0.0f;
    }
    return BK_OK;
}
