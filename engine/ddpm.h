/* ddpm.h - the DDPM noise schedule (computed in float64, stored as float32 tables) and the
 * forward-diffusion sample x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps.
 */
#ifndef DDPMD_DDPM_H
#define DDPMD_DDPM_H

#include <stddef.h>

enum ddpm_beta_schedule { DDPM_BETA_LINEAR = 0, DDPM_BETA_COSINE = 1 };

struct ddpm_schedule {
    int T;
    double *beta, *alpha_bar;  /* (T) float64, for the samplers */
    float *sqrt_ab, *sqrt_1mab; /* (T) float32, for training */
};

/* linear: beta = linspace(beta_start, beta_end, T); cosine: Nichol & Dhariwal 2021, s=0.008,
 * betas clipped at 0.999. Returns 0 or -1 (bad arguments / out of memory). */
int ddpm_schedule_init(struct ddpm_schedule *s, int T, enum ddpm_beta_schedule kind,
                       double beta_start, double beta_end);
void ddpm_schedule_free(struct ddpm_schedule *s);

/* x_t (N, per_sample) from x0, eps and integer timesteps t (N) */
void ddpm_q_sample(float *xt, const float *x0, const float *eps, const int *t, int n,
                   size_t per_sample, const struct ddpm_schedule *s);

#endif
