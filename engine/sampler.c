/* sampler.c - DDPM ancestral and DDIM reverse steps, timestep spacing, v targets (host side).
 * Matches diffusers' DDPMScheduler.step / DDIMScheduler.step with their defaults (clip_sample
 * range 1, no thresholding, DDIM set_alpha_to_one=True, steps_offset=0,
 * use_clipped_model_output=False), computed in float64 instead of diffusers' float32.
 */
#include "sampler.h"

#include <assert.h>
#include <math.h>
#include <string.h>

void sampler_config_default(struct sampler_config *c)
{
    memset(c, 0, sizeof *c);
    c->kind = SAMPLER_DDIM;
    c->steps = 50;
    c->eta = 0.0f;
    c->spacing = SAMPLER_SPACING_LEADING;
    c->variance = SAMPLER_VAR_FIXED_SMALL;
    c->clip_x0 = 1;
    c->prediction = SAMPLER_PRED_EPSILON;
}

int sampler_stop_requested(const struct sampler_config *c)
{
    return c && c->stop && *c->stop;
}

int sampler_timesteps(const struct sampler_config *c, const struct ddpm_schedule *s, int *ts,
                      int max)
{
    if (!c || !s || !ts || s->T < 1) return -1;
    const int T = s->T;
    if (c->kind == SAMPLER_DDPM) {
        if (max < T) return -1;
        for (int i = 0; i < T; i++) ts[i] = T - 1 - i;
        return T;
    }
    if (c->kind != SAMPLER_DDIM) return -1;
    const int n = c->steps;
    /* diffusers raises for steps > T: the list would repeat timesteps */
    if (n < 1 || n > T || max < n) return -1;
    switch (c->spacing) {
    case SAMPLER_SPACING_LEADING: {
        const int ratio = T / n;
        for (int i = 0; i < n; i++) ts[i] = (n - 1 - i) * ratio;
        return n;
    }
    case SAMPLER_SPACING_TRAILING: {
        /* np.arange(T, 0, -T/n) fills start + i*delta with delta = (start + step) - start, so
         * the same rounding is reproduced here; nearbyint rounds half to even like np.round.
         * Where float error makes numpy's arange one element longer (e.g. T=100, n=29), that
         * extra element is round(~0) - 1 = -1, an invalid timestep; it is not emitted. */
        const double start = (double)T, step = -(double)T / (double)n;
        const double delta = (start + step) - start;
        for (int i = 0; i < n; i++) ts[i] = (int)nearbyint(start + (double)i * delta) - 1;
        return n;
    }
    case SAMPLER_SPACING_LINSPACE: {
        /* np.linspace(0, T-1, n): i * ((T-1)/(n-1)) + 0, the last point exactly T-1; n == 1
         * gives [0]. Reversed after rounding. */
        if (n == 1) {
            ts[0] = 0;
            return 1;
        }
        const double step = (double)(T - 1) / (double)(n - 1);
        for (int i = 0; i < n; i++) {
            double y = (i == n - 1) ? (double)(T - 1) : (double)i * step + 0.0;
            ts[n - 1 - i] = (int)nearbyint(y);
        }
        return n;
    }
    }
    return -1;
}

int sampler_needs_noise(const struct sampler_config *c, int t, int t_prev)
{
    if (c->kind == SAMPLER_DDPM) return t > 0; /* diffusers: `if t > 0` */
    return c->eta > 0.0f && t_prev >= 0;
}

/* beta' and alpha' = 1 - beta' of a DDPM step t -> t_prev. diffusers derives them from
 * alphas_cumprod (1 - ab_t/ab_prev) so that respaced steps work; for the ordinary t -> t-1 step
 * the stored beta is the same number without the cancellation (1e-12 relative at beta = 1e-4). */
static double sampler_step_beta(const struct ddpm_schedule *s, int t, int t_prev, double ab_t,
                                double ab_prev)
{
    if (t_prev == t - 1) return s->beta[t];
    return 1.0 - ab_t / ab_prev;
}

double sampler_ddpm_variance(const struct sampler_config *c, const struct ddpm_schedule *s, int t,
                             int t_prev)
{
    assert(t >= 0 && t < s->T && t_prev >= -1 && t_prev < t);
    const double ab_t = s->alpha_bar[t], ab_prev = t_prev >= 0 ? s->alpha_bar[t_prev] : 1.0;
    const double beta = sampler_step_beta(s, t, t_prev, ab_t, ab_prev);
    if (c->variance == SAMPLER_VAR_FIXED_LARGE) {
        /* diffusers' fixed_large is beta' at every t. Ho et al.'s code puts beta~ of index 1
         * at index 0 to keep the log-variance finite for the VLB; sampling adds no noise at
         * t == 0 under either reading, so samples are the same. */
        return beta;
    }
    double var = (1.0 - ab_prev) / (1.0 - ab_t) * beta;
    return var > 1e-20 ? var : 1e-20; /* diffusers' clamp, there for the log it may take */
}

/* Per-element inversion of the model output at (a, b) = (sqrt(ab_t), sqrt(1-ab_t)). */
static inline void sampler_predict1(enum sampler_prediction p, int clip, double a, double b,
                                    double x, double m, double *x0, double *eps)
{
    double xh, e;
    if (p == SAMPLER_PRED_V) {
        xh = a * x - b * m;
        e = a * m + b * x;
    } else {
        xh = (x - b * m) / a;
        e = m;
    }
    if (clip) xh = xh < -1.0 ? -1.0 : (xh > 1.0 ? 1.0 : xh);
    *x0 = xh;
    *eps = e;
}

void sampler_predict(const struct sampler_config *c, const struct ddpm_schedule *s, int t,
                     const float *x_t, const float *model_out, float *x0_hat, float *eps_hat,
                     size_t n)
{
    assert(t >= 0 && t < s->T);
    const double ab = s->alpha_bar[t], a = sqrt(ab), b = sqrt(1.0 - ab);
    for (size_t i = 0; i < n; i++) {
        double x0, e;
        sampler_predict1(c->prediction, c->clip_x0, a, b, x_t[i], model_out[i], &x0, &e);
        if (x0_hat) x0_hat[i] = (float)x0;
        if (eps_hat) eps_hat[i] = (float)e;
    }
}

/* DDPMScheduler.step: x0 from the model, clamped; posterior mean c1 x0 + c2 x_t; plus
 * sqrt(var) noise for t > 0. The model's eps is not used beyond x0. */
static void sampler_step_ddpm(const struct sampler_config *c, const struct ddpm_schedule *s,
                              int t, int t_prev, const float *x_t, const float *model_out,
                              const float *noise, float *x_prev, size_t n)
{
    const double ab_t = s->alpha_bar[t], ab_prev = t_prev >= 0 ? s->alpha_bar[t_prev] : 1.0;
    const double beta = sampler_step_beta(s, t, t_prev, ab_t, ab_prev), alpha = 1.0 - beta;
    const double a = sqrt(ab_t), b = sqrt(1.0 - ab_t);
    const double c1 = sqrt(ab_prev) * beta / (1.0 - ab_t);
    const double c2 = sqrt(alpha) * (1.0 - ab_prev) / (1.0 - ab_t);
    const int noisy = sampler_needs_noise(c, t, t_prev);
    const double sd = noisy ? sqrt(sampler_ddpm_variance(c, s, t, t_prev)) : 0.0;
    assert(!noisy || noise);
    for (size_t i = 0; i < n; i++) {
        double x = x_t[i], x0, e;
        sampler_predict1(c->prediction, c->clip_x0, a, b, x, model_out[i], &x0, &e);
        double y = c1 * x0 + c2 * x;
        if (noisy) y += sd * (double)noise[i];
        x_prev[i] = (float)y;
    }
}

/* DDIMScheduler.step: x_prev = sqrt(ab_prev) x0 + sqrt(1 - ab_prev - sigma^2) eps + sigma z with
 * sigma = eta sqrt((1-ab_prev)/(1-ab_t)) sqrt(1 - ab_t/ab_prev), ab_prev = 1 past the end
 * (set_alpha_to_one). eps stays the model's even when x0 was clamped (diffusers' default
 * use_clipped_model_output=False). t_prev is the caller's next timestep, not diffusers'
 * t - T//steps: the two agree for leading and trailing spacing with steps dividing T. */
static void sampler_step_ddim(const struct sampler_config *c, const struct ddpm_schedule *s,
                              int t, int t_prev, const float *x_t, const float *model_out,
                              const float *noise, float *x_prev, size_t n)
{
    const double ab_t = s->alpha_bar[t], ab_prev = t_prev >= 0 ? s->alpha_bar[t_prev] : 1.0;
    const double a = sqrt(ab_t), b = sqrt(1.0 - ab_t);
    const double var = (1.0 - ab_prev) / (1.0 - ab_t) * (1.0 - ab_t / ab_prev);
    const double sigma = (double)c->eta * sqrt(var > 0.0 ? var : 0.0);
    /* negative only for eta > 1 (outside the DDIM family) or by rounding; diffusers gives NaN */
    double dir2 = 1.0 - ab_prev - sigma * sigma;
    const double dir = sqrt(dir2 > 0.0 ? dir2 : 0.0), cx = sqrt(ab_prev);
    const int noisy = sampler_needs_noise(c, t, t_prev);
    assert(!noisy || noise);
    for (size_t i = 0; i < n; i++) {
        double x0, e;
        sampler_predict1(c->prediction, c->clip_x0, a, b, x_t[i], model_out[i], &x0, &e);
        double y = cx * x0 + dir * e;
        if (noisy) y += sigma * (double)noise[i];
        x_prev[i] = (float)y;
    }
}

void sampler_step(const struct sampler_config *c, const struct ddpm_schedule *s, int t, int t_prev,
                  const float *x_t, const float *model_out, const float *noise, float *x_prev,
                  size_t n)
{
    assert(c && s && t >= 0 && t < s->T && t_prev >= -1 && t_prev < t);
    if (c->kind == SAMPLER_DDPM)
        sampler_step_ddpm(c, s, t, t_prev, x_t, model_out, noise, x_prev, n);
    else
        sampler_step_ddim(c, s, t, t_prev, x_t, model_out, noise, x_prev, n);
}

void sampler_v_target(float *v, const float *x0, const float *eps, const int *t, int n,
                      size_t per_sample, const struct ddpm_schedule *s)
{
    for (int i = 0; i < n; i++) {
        assert(t[i] >= 0 && t[i] < s->T);
        const double ab = s->alpha_bar[t[i]], a = sqrt(ab), b = sqrt(1.0 - ab);
        const size_t o = (size_t)i * per_sample;
        for (size_t j = 0; j < per_sample; j++)
            v[o + j] = (float)(a * (double)eps[o + j] - b * (double)x0[o + j]);
    }
}

/* ---- names ---- */

static const char *const sampler_kind_names[] = {"ddpm", "ddim"};
static const char *const sampler_spacing_names[] = {"leading", "trailing", "linspace"};
static const char *const sampler_variance_names[] = {"fixed_small", "fixed_large"};
static const char *const sampler_prediction_names[] = {"epsilon", "v_prediction"};

static int sampler_name_find(const char *const *names, int count, const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < count; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

#define SAMPLER_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

int sampler_kind_parse(const char *name, enum sampler_kind *out)
{
    int i = sampler_name_find(sampler_kind_names, SAMPLER_COUNT(sampler_kind_names), name);
    if (i < 0) return -1;
    *out = (enum sampler_kind)i;
    return 0;
}

int sampler_spacing_parse(const char *name, enum sampler_spacing *out)
{
    int i = sampler_name_find(sampler_spacing_names, SAMPLER_COUNT(sampler_spacing_names), name);
    if (i < 0) return -1;
    *out = (enum sampler_spacing)i;
    return 0;
}

int sampler_variance_parse(const char *name, enum sampler_variance *out)
{
    int i =
        sampler_name_find(sampler_variance_names, SAMPLER_COUNT(sampler_variance_names), name);
    if (i < 0) return -1;
    *out = (enum sampler_variance)i;
    return 0;
}

int sampler_prediction_parse(const char *name, enum sampler_prediction *out)
{
    int i = sampler_name_find(sampler_prediction_names, SAMPLER_COUNT(sampler_prediction_names),
                              name);
    if (i < 0) return -1;
    *out = (enum sampler_prediction)i;
    return 0;
}

/* the enum values index the name tables (they are declared 0, 1, 2 in sampler.h) */
const char *sampler_kind_name(enum sampler_kind k)
{
    int i = (int)k;
    return i >= 0 && i < SAMPLER_COUNT(sampler_kind_names) ? sampler_kind_names[i] : NULL;
}

const char *sampler_spacing_name(enum sampler_spacing sp)
{
    int i = (int)sp;
    return i >= 0 && i < SAMPLER_COUNT(sampler_spacing_names) ? sampler_spacing_names[i] : NULL;
}

const char *sampler_variance_name(enum sampler_variance v)
{
    int i = (int)v;
    return i >= 0 && i < SAMPLER_COUNT(sampler_variance_names) ? sampler_variance_names[i] : NULL;
}

const char *sampler_prediction_name(enum sampler_prediction p)
{
    int i = (int)p;
    return i >= 0 && i < SAMPLER_COUNT(sampler_prediction_names) ? sampler_prediction_names[i]
                                                                  : NULL;
}
