/* ddpm.c - the noise schedule and forward diffusion (host side). */
#include "ddpm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ddpm_schedule_free(struct ddpm_schedule *s)
{
    free(s->beta);
    free(s->alpha_bar);
    free(s->sqrt_ab);
    free(s->sqrt_1mab);
    memset(s, 0, sizeof *s);
}

int ddpm_schedule_init(struct ddpm_schedule *s, int T, enum ddpm_beta_schedule kind,
                       double beta_start, double beta_end)
{
    memset(s, 0, sizeof *s);
    if (T < 2) return -1;
    s->T = T;
    s->beta = malloc((size_t)T * sizeof *s->beta);
    s->alpha_bar = malloc((size_t)T * sizeof *s->alpha_bar);
    s->sqrt_ab = malloc((size_t)T * sizeof *s->sqrt_ab);
    s->sqrt_1mab = malloc((size_t)T * sizeof *s->sqrt_1mab);
    if (!s->beta || !s->alpha_bar || !s->sqrt_ab || !s->sqrt_1mab) {
        ddpm_schedule_free(s);
        return -1;
    }
    const double pi = 3.14159265358979323846, off = 0.008;
    for (int i = 0; i < T; i++) {
        if (kind == DDPM_BETA_LINEAR) {
            s->beta[i] = beta_start + (beta_end - beta_start) * (double)i / (double)(T - 1);
        } else {
            double f0 = cos((off / (1 + off)) * pi / 2);
            double a1 = cos(((double)i / T + off) / (1 + off) * pi / 2) / f0;
            double a2 = cos(((double)(i + 1) / T + off) / (1 + off) * pi / 2) / f0;
            double b = 1.0 - (a2 * a2) / (a1 * a1);
            s->beta[i] = b < 0.999 ? b : 0.999;
        }
    }
    double ab = 1.0;
    for (int i = 0; i < T; i++) {
        ab *= 1.0 - s->beta[i];
        s->alpha_bar[i] = ab;
        s->sqrt_ab[i] = (float)sqrt(ab);
        s->sqrt_1mab[i] = (float)sqrt(1.0 - ab);
    }
    return 0;
}

void ddpm_q_sample(float *xt, const float *x0, const float *eps, const int *t, int n,
                   size_t per_sample, const struct ddpm_schedule *s)
{
    for (int i = 0; i < n; i++) {
        float a = s->sqrt_ab[t[i]], b = s->sqrt_1mab[t[i]];
        const float *x = x0 + (size_t)i * per_sample, *e = eps + (size_t)i * per_sample;
        float *y = xt + (size_t)i * per_sample;
        for (size_t j = 0; j < per_sample; j++) y[j] = a * x[j] + b * e[j];
    }
}
