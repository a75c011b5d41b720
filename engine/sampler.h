/* sampler.h - the pure math of the DDPM (ancestral) and DDIM samplers: timestep lists and one
 * reverse step x_t -> x_prev from the model output the caller computed. Host side, per element,
 * float in/out, float64 inside. Follows diffusers' DDPMScheduler / DDIMScheduler (see sampler.c).
 */
#ifndef DDPMD_SAMPLER_H
#define DDPMD_SAMPLER_H

#include <signal.h>
#include <stddef.h>

#include "ddpm.h"

enum sampler_kind { SAMPLER_DDPM = 0, SAMPLER_DDIM = 1 };

enum sampler_variance {
    SAMPLER_VAR_FIXED_SMALL = 0, /* posterior beta~_t = beta_t (1-ab_{t-1}) / (1-ab_t) */
    SAMPLER_VAR_FIXED_LARGE = 1, /* beta_t (Ho et al.'s "fixedlarge", diffusers' "fixed_large") */
};

/* DDIM timestep spacing, diffusers' DDIMScheduler.set_timesteps with steps_offset = 0 */
enum sampler_spacing {
    SAMPLER_SPACING_LEADING = 0,  /* (arange(0, steps) * (T // steps)) reversed */
    SAMPLER_SPACING_TRAILING = 1, /* round(arange(T, 0, -T / steps)) - 1 */
    SAMPLER_SPACING_LINSPACE = 2, /* round(linspace(0, T - 1, steps)) reversed */
};

enum sampler_prediction { SAMPLER_PRED_EPSILON = 0, SAMPLER_PRED_V = 1 };

struct sampler_config {
    enum sampler_kind kind;
    int steps;                         /* DDIM only; DDPM visits every t */
    float eta;                         /* DDIM only: 0 = deterministic, 1 = DDPM-like noise */
    enum sampler_spacing spacing;      /* DDIM only */
    enum sampler_variance variance;    /* DDPM only */
    int clip_x0;                       /* clamp the predicted x0 to [-1, 1] */
    enum sampler_prediction prediction; /* what the model outputs: eps or v */
    /* a stop request (a signal handler's flag, may be NULL): the sampling loops poll it with
     * sampler_stop_requested before every denoising step and return "stopped" when it is set */
    volatile sig_atomic_t *stop;
};

/* whether c->stop is set (0 when c or c->stop is NULL) */
int sampler_stop_requested(const struct sampler_config *c);

/* DDIM, 50 steps, eta 0, leading, fixed-small, clip on, epsilon prediction, no stop flag */
void sampler_config_default(struct sampler_config *c);

/* The descending timesteps to visit, written to ts[0..count). DDPM: T-1 .. 0 (steps and spacing
 * ignored). DDIM: `steps` timesteps by c->spacing, 1 <= steps <= T. Returns count, or -1 when
 * the config is invalid or max < count. The step from ts[i] goes to ts[i+1] (-1 after the last). */
int sampler_timesteps(const struct sampler_config *c, const struct ddpm_schedule *s, int *ts,
                      int max);

/* Whether sampler_step(c, s, t, t_prev, ...) reads `noise`: DDPM when t > 0, DDIM when
 * eta > 0 and t_prev >= 0 (sigma is exactly 0 when stepping to the end). */
int sampler_needs_noise(const struct sampler_config *c, int t, int t_prev);

/* The ancestral variance added by a DDPM step t -> t_prev (diffusers' _get_variance): fixed-small
 * max(beta'(1-ab_prev)/(1-ab_t), 1e-20), fixed-large beta', where beta' = beta_t when
 * t_prev == t-1 and 1 - ab_t/ab_prev otherwise (respaced), ab_{-1} = 1. */
double sampler_ddpm_variance(const struct sampler_config *c, const struct ddpm_schedule *s, int t,
                             int t_prev);

/* One reverse step from timestep t to t_prev (-1 = to clean data) over n elements (n = all
 * images of the batch, which share t). model_out is eps or v per c->prediction; noise is
 * standard normal and read only when sampler_needs_noise() says so (it may be NULL otherwise).
 * 0 <= t < T, -1 <= t_prev < t. x_prev may alias x_t (each element is read before written). */
void sampler_step(const struct sampler_config *c, const struct ddpm_schedule *s, int t, int t_prev,
                  const float *x_t, const float *model_out, const float *noise, float *x_prev,
                  size_t n);

/* The predictions a step at t uses: x0_hat (clamped when c->clip_x0) and eps_hat (the model's
 * eps; for v prediction sqrt(ab) v + sqrt(1-ab) x_t; never re-derived from the clamped x0, as
 * diffusers' DDIM with use_clipped_model_output=False). Either output may be NULL. */
void sampler_predict(const struct sampler_config *c, const struct ddpm_schedule *s, int t,
                     const float *x_t, const float *model_out, float *x0_hat, float *eps_hat,
                     size_t n);

/* v-prediction training target v = sqrt(ab_t) eps - sqrt(1-ab_t) x0 (diffusers' get_velocity),
 * per sample i with timestep t[i]; v, x0, eps are (n, per_sample). */
void sampler_v_target(float *v, const float *x0, const float *eps, const int *t, int n,
                      size_t per_sample, const struct ddpm_schedule *s);

/* Names as in diffusers configs and the job spec: "ddpm"/"ddim", "leading"/"trailing"/"linspace",
 * "fixed_small"/"fixed_large", "epsilon"/"v_prediction". parse returns 0, or -1 (out untouched)
 * for an unknown or NULL name; name returns NULL for an out-of-range value. */
int sampler_kind_parse(const char *name, enum sampler_kind *out);
int sampler_spacing_parse(const char *name, enum sampler_spacing *out);
int sampler_variance_parse(const char *name, enum sampler_variance *out);
int sampler_prediction_parse(const char *name, enum sampler_prediction *out);
const char *sampler_kind_name(enum sampler_kind k);
const char *sampler_spacing_name(enum sampler_spacing sp);
const char *sampler_variance_name(enum sampler_variance v);
const char *sampler_prediction_name(enum sampler_prediction p);

#endif
