/* test_sampler.c - the DDPM and DDIM samplers against float64 references written here from the
 * formulas, diffusers' timestep lists worked out by hand, determinism, perfect-model ("oracle")
 * sampling of known data distributions, and the v-prediction target identity.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddpm.h"
#include "philox.h"
#include "sampler.h"
#include "test_util.h"

#define T_TRAIN 1000
#define SEED 0x5A3D1E5ull

/* the linear schedule recomputed here (not read from ddpm.c): beta_i = 1e-4 + (0.02-1e-4) i/999 */
static double ref_beta[T_TRAIN], ref_ab[T_TRAIN];

static void ref_schedule_init(void)
{
    double ab = 1.0;
    for (int i = 0; i < T_TRAIN; i++) {
        ref_beta[i] = 1e-4 + (0.02 - 1e-4) * (double)i / (double)(T_TRAIN - 1);
        ab *= 1.0 - ref_beta[i];
        ref_ab[i] = ab;
    }
}

static void fill_normal(float *z, size_t n, uint64_t step)
{
    for (size_t e = 0; e < n; e++)
        z[e] = philox_normal(SEED, PHILOX_TAG_SAMPLER, step, 0, 0, (uint32_t)e);
}

static double ref_clip(double x) { return x < -1.0 ? -1.0 : (x > 1.0 ? 1.0 : x); }

/* x0_hat and eps_hat from the model output, eps kept from the model (diffusers' default) */
static void ref_predict(int pred_v, int clip, double ab, double x, double m, double *x0,
                        double *eps)
{
    double a = sqrt(ab), b = sqrt(1.0 - ab);
    *x0 = pred_v ? a * x - b * m : (x - b * m) / a;
    *eps = pred_v ? a * m + b * x : m;
    if (clip) *x0 = ref_clip(*x0);
}

static void test_names(void)
{
    enum sampler_kind k;
    enum sampler_spacing sp;
    enum sampler_variance v;
    enum sampler_prediction p;
    CHECK(sampler_kind_parse("ddpm", &k) == 0 && k == SAMPLER_DDPM, "parse ddpm");
    CHECK(sampler_kind_parse("ddim", &k) == 0 && k == SAMPLER_DDIM, "parse ddim");
    CHECK(sampler_spacing_parse("leading", &sp) == 0 && sp == SAMPLER_SPACING_LEADING, "leading");
    CHECK(sampler_spacing_parse("trailing", &sp) == 0 && sp == SAMPLER_SPACING_TRAILING,
          "trailing");
    CHECK(sampler_spacing_parse("linspace", &sp) == 0 && sp == SAMPLER_SPACING_LINSPACE,
          "linspace");
    CHECK(sampler_variance_parse("fixed_small", &v) == 0 && v == SAMPLER_VAR_FIXED_SMALL,
          "fixed_small");
    CHECK(sampler_variance_parse("fixed_large", &v) == 0 && v == SAMPLER_VAR_FIXED_LARGE,
          "fixed_large");
    CHECK(sampler_prediction_parse("epsilon", &p) == 0 && p == SAMPLER_PRED_EPSILON, "epsilon");
    CHECK(sampler_prediction_parse("v_prediction", &p) == 0 && p == SAMPLER_PRED_V,
          "v_prediction");
    k = SAMPLER_DDIM;
    CHECK(sampler_kind_parse("DDPM", &k) == -1 && k == SAMPLER_DDIM, "case-sensitive, untouched");
    CHECK(sampler_kind_parse(NULL, &k) == -1, "NULL name");
    CHECK(sampler_spacing_parse("", &sp) == -1, "empty name");
    CHECK(sampler_variance_parse("learned", &v) == -1, "unsupported variance");
    CHECK(sampler_prediction_parse("sample", &p) == -1, "unsupported prediction");
    /* names round-trip */
    for (int i = 0; i < 2; i++)
        CHECK(sampler_kind_parse(sampler_kind_name((enum sampler_kind)i), &k) == 0 && (int)k == i,
              "kind %d round-trip", i);
    for (int i = 0; i < 3; i++)
        CHECK(sampler_spacing_parse(sampler_spacing_name((enum sampler_spacing)i), &sp) == 0 &&
                  (int)sp == i,
              "spacing %d round-trip", i);
    for (int i = 0; i < 2; i++)
        CHECK(sampler_variance_parse(sampler_variance_name((enum sampler_variance)i), &v) == 0 &&
                  (int)v == i,
              "variance %d round-trip", i);
    for (int i = 0; i < 2; i++)
        CHECK(sampler_prediction_parse(sampler_prediction_name((enum sampler_prediction)i), &p) ==
                      0 &&
                  (int)p == i,
              "prediction %d round-trip", i);
    CHECK(sampler_kind_name((enum sampler_kind)7) == NULL, "out-of-range name");

    struct sampler_config c;
    sampler_config_default(&c);
    CHECK(c.kind == SAMPLER_DDIM && c.steps == 50 && c.eta == 0.0f &&
              c.spacing == SAMPLER_SPACING_LEADING && c.variance == SAMPLER_VAR_FIXED_SMALL &&
              c.clip_x0 == 1 && c.prediction == SAMPLER_PRED_EPSILON,
          "defaults");
}

/* one list against an expected array */
static void check_list(const struct ddpm_schedule *s, enum sampler_spacing sp, int steps,
                       const int *want, int nwant, const char *what)
{
    struct sampler_config c;
    sampler_config_default(&c);
    c.spacing = sp;
    c.steps = steps;
    int ts[T_TRAIN + 1];
    int n = sampler_timesteps(&c, s, ts, T_TRAIN + 1);
    CHECK(n == nwant, "%s: count %d, want %d", what, n, nwant);
    int bad = -1;
    for (int i = 0; i < n && i < nwant; i++)
        if (ts[i] != want[i]) {
            bad = i;
            break;
        }
    CHECK(bad < 0, "%s: ts[%d] = %d, want %d", what, bad, bad >= 0 ? ts[bad] : 0,
          bad >= 0 ? want[bad] : 0);
}

static void test_timesteps(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule");
    int want[T_TRAIN];

    /* leading: step_ratio = T // steps, arange(0, steps) * ratio, reversed.
     * 50: ratio 20 -> 980, 960, ..., 20, 0. 10: ratio 100 -> 900, ..., 100, 0.
     * 1000: ratio 1 -> 999, ..., 0. */
    for (int i = 0; i < 50; i++) want[i] = 980 - 20 * i;
    check_list(&s, SAMPLER_SPACING_LEADING, 50, want, 50, "leading 50");
    for (int i = 0; i < 10; i++) want[i] = 900 - 100 * i;
    check_list(&s, SAMPLER_SPACING_LEADING, 10, want, 10, "leading 10");
    for (int i = 0; i < 1000; i++) want[i] = 999 - i;
    check_list(&s, SAMPLER_SPACING_LEADING, 1000, want, 1000, "leading 1000");

    /* trailing: round(arange(T, 0, -T/steps)) - 1.
     * 50: 1000, 980, ..., 20 minus 1 -> 999, 979, ..., 19. 10: 999, 899, ..., 99.
     * 1000: 999, ..., 0. */
    for (int i = 0; i < 50; i++) want[i] = 999 - 20 * i;
    check_list(&s, SAMPLER_SPACING_TRAILING, 50, want, 50, "trailing 50");
    for (int i = 0; i < 10; i++) want[i] = 999 - 100 * i;
    check_list(&s, SAMPLER_SPACING_TRAILING, 10, want, 10, "trailing 10");
    for (int i = 0; i < 1000; i++) want[i] = 999 - i;
    check_list(&s, SAMPLER_SPACING_TRAILING, 1000, want, 1000, "trailing 1000");

    /* linspace: round(linspace(0, 999, steps)) reversed.
     * 10: step 999/9 = 111 exactly -> 999, 888, ..., 111, 0.
     * 50: step 999/49 = 20.387755...; i * step rounded, e.g. i=48: 978.61 -> 979, i=24: 489.31
     * -> 489, i=25: 509.69 -> 510, i=1: 20.39 -> 20 (no value falls on a .5).
     * 1000: step 1 -> 999, ..., 0. */
    for (int i = 0; i < 10; i++) want[i] = 999 - 111 * i;
    check_list(&s, SAMPLER_SPACING_LINSPACE, 10, want, 10, "linspace 10");
    static const int lin50[50] = {
        999, 979, 958, 938, 917, 897, 877, 856, 836, 816, 795, 775, 754, 734, 714, 693, 673,
        652, 632, 612, 591, 571, 550, 530, 510, 489, 469, 449, 428, 408, 387, 367, 347, 326,
        306, 285, 265, 245, 224, 204, 183, 163, 143, 122, 102, 82,  61,  41,  20,  0};
    check_list(&s, SAMPLER_SPACING_LINSPACE, 50, lin50, 50, "linspace 50");
    for (int i = 0; i < 1000; i++) want[i] = 999 - i;
    check_list(&s, SAMPLER_SPACING_LINSPACE, 1000, want, 1000, "linspace 1000");

    /* steps not dividing T, where the rounding rule shows.
     * leading 7: ratio 142 -> 852, 710, 568, 426, 284, 142, 0.
     * trailing 7: 1000 - 142.857 i = 1000, 857.14, 714.29, 571.43, 428.57, 285.71, 142.86
     *   -> rounded minus 1: 999, 856, 713, 570, 428, 285, 142.
     * linspace 7: step 166.5 -> 0, 166.5, 333, 499.5, 666, 832.5, 999; np.round is half-to-even:
     *   166.5 -> 166, 499.5 -> 500, 832.5 -> 832 -> 999, 832, 666, 500, 333, 166, 0.
     * 3: leading 666, 333, 0; trailing 1000, 666.67, 333.33 -> 999, 666, 332; linspace 999, 500
     *   (499.5 -> 500), 0. 1: leading [0], trailing [999], linspace [0]. */
    static const int lead7[7] = {852, 710, 568, 426, 284, 142, 0};
    static const int trail7[7] = {999, 856, 713, 570, 428, 285, 142};
    static const int lin7[7] = {999, 832, 666, 500, 333, 166, 0};
    static const int lead3[3] = {666, 333, 0}, trail3[3] = {999, 666, 332}, lin3[3] = {999, 500, 0};
    static const int zero1[1] = {0}, last1[1] = {999};
    check_list(&s, SAMPLER_SPACING_LEADING, 7, lead7, 7, "leading 7");
    check_list(&s, SAMPLER_SPACING_TRAILING, 7, trail7, 7, "trailing 7");
    check_list(&s, SAMPLER_SPACING_LINSPACE, 7, lin7, 7, "linspace 7");
    check_list(&s, SAMPLER_SPACING_LEADING, 3, lead3, 3, "leading 3");
    check_list(&s, SAMPLER_SPACING_TRAILING, 3, trail3, 3, "trailing 3");
    check_list(&s, SAMPLER_SPACING_LINSPACE, 3, lin3, 3, "linspace 3");
    check_list(&s, SAMPLER_SPACING_LEADING, 1, zero1, 1, "leading 1");
    check_list(&s, SAMPLER_SPACING_TRAILING, 1, last1, 1, "trailing 1");
    check_list(&s, SAMPLER_SPACING_LINSPACE, 1, zero1, 1, "linspace 1");

    /* every spacing and step count: in range, strictly descending, exactly `steps` long */
    int ts[T_TRAIN], bad = 0;
    struct sampler_config c;
    sampler_config_default(&c);
    for (int sp = 0; sp < 3; sp++)
        for (int steps = 1; steps <= T_TRAIN; steps++) {
            c.spacing = (enum sampler_spacing)sp;
            c.steps = steps;
            int n = sampler_timesteps(&c, &s, ts, T_TRAIN);
            int ok = n == steps && ts[0] <= T_TRAIN - 1 && ts[n - 1] >= 0;
            for (int i = 1; ok && i < n; i++) ok = ts[i] < ts[i - 1];
            if (!ok && bad++ < 5) CHECK(0, "spacing %d steps %d: bad list (n %d)", sp, steps, n);
        }
    CHECK(bad == 0, "%d spacing/steps combinations gave bad lists", bad);

    /* T=100, 29 trailing steps: numpy's float arange yields 30 values there, the last -1; we give
     * the 29 valid ones (100 - 28 * 3.448 = 3.45 -> 3 - 1 = 2 last) */
    struct ddpm_schedule s100;
    CHECK(ddpm_schedule_init(&s100, 100, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule 100");
    c.spacing = SAMPLER_SPACING_TRAILING;
    c.steps = 29;
    int n = sampler_timesteps(&c, &s100, ts, T_TRAIN);
    CHECK(n == 29 && ts[0] == 99 && ts[28] == 2, "trailing 29 of 100: n %d last %d", n,
          n > 0 ? ts[n - 1] : -9);
    ddpm_schedule_free(&s100);

    /* DDPM: every t from T-1 to 0; steps and spacing ignored */
    c.kind = SAMPLER_DDPM;
    c.steps = 7;
    n = sampler_timesteps(&c, &s, ts, T_TRAIN);
    int ok = n == T_TRAIN;
    for (int i = 0; ok && i < n; i++) ok = ts[i] == T_TRAIN - 1 - i;
    CHECK(ok, "ddpm list (n %d)", n);
    CHECK(sampler_timesteps(&c, &s, ts, T_TRAIN - 1) == -1, "ddpm: max too small");

    /* errors */
    c.kind = SAMPLER_DDIM;
    c.spacing = SAMPLER_SPACING_LEADING;
    c.steps = 0;
    CHECK(sampler_timesteps(&c, &s, ts, T_TRAIN) == -1, "steps 0");
    c.steps = T_TRAIN + 1;
    CHECK(sampler_timesteps(&c, &s, ts, T_TRAIN) == -1, "steps > T");
    c.steps = 50;
    CHECK(sampler_timesteps(&c, &s, ts, 49) == -1, "max < steps");
    c.spacing = (enum sampler_spacing)9;
    CHECK(sampler_timesteps(&c, &s, ts, T_TRAIN) == -1, "bad spacing");
    ddpm_schedule_free(&s);
}

static void test_needs_noise(void)
{
    struct sampler_config c;
    sampler_config_default(&c);
    c.kind = SAMPLER_DDPM;
    CHECK(sampler_needs_noise(&c, 5, 4) && !sampler_needs_noise(&c, 0, -1), "ddpm noise iff t > 0");
    c.kind = SAMPLER_DDIM;
    CHECK(!sampler_needs_noise(&c, 500, 480), "ddim eta 0: no noise");
    c.eta = 1.0f;
    CHECK(sampler_needs_noise(&c, 500, 480) && !sampler_needs_noise(&c, 20, -1),
          "ddim eta 1: noise except into the end");
}

#define NE 173 /* odd, so no vector-width luck */

static void test_ddpm_posterior(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule");
    double worst = 0;
    for (int i = 0; i < T_TRAIN; i++) {
        double e = fabs(s.alpha_bar[i] - ref_ab[i]) / ref_ab[i];
        if (e > worst) worst = e;
    }
    CHECK(worst < 1e-12, "schedule alpha_bar vs reference: %.3g", worst);

    float x[NE], m[NE], z[NE], zero[NE], out[NE];
    double ref[NE], ref_mu[NE];
    memset(zero, 0, sizeof zero);
    const int ts[] = {999, 700, 250, 1, 0};
    tu_seed(11);
    for (int ti = 0; ti < 5; ti++)
        for (int var = 0; var < 2; var++)
            for (int clip = 0; clip < 2; clip++)
                for (int pv = 0; pv < 2; pv++) {
                    int t = ts[ti];
                    tu_fill(x, NE, 1.5);
                    tu_fill(m, NE, 1.2);
                    fill_normal(z, NE, (uint64_t)(100 + ti));
                    struct sampler_config c;
                    sampler_config_default(&c);
                    c.kind = SAMPLER_DDPM;
                    c.variance = var ? SAMPLER_VAR_FIXED_LARGE : SAMPLER_VAR_FIXED_SMALL;
                    c.clip_x0 = clip;
                    c.prediction = pv ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;

                    /* reference: Ho et al. eq. 7 posterior with beta_t, alpha_t = 1 - beta_t */
                    double ab = ref_ab[t], abp = t > 0 ? ref_ab[t - 1] : 1.0, bt = ref_beta[t];
                    double c1 = sqrt(abp) * bt / (1.0 - ab);
                    double c2 = sqrt(1.0 - bt) * (1.0 - abp) / (1.0 - ab);
                    double v = var ? bt : fmax(bt * (1.0 - abp) / (1.0 - ab), 1e-20);
                    for (int i = 0; i < NE; i++) {
                        double x0, e;
                        ref_predict(pv, clip, ab, x[i], m[i], &x0, &e);
                        ref_mu[i] = c1 * x0 + c2 * x[i];
                        ref[i] = t > 0 ? ref_mu[i] + sqrt(v) * z[i] : ref_mu[i];
                    }
                    double vs = sampler_ddpm_variance(&c, &s, t, t - 1);
                    if (t > 0)
                        CHECK(fabs(vs - v) <= 1e-12 * v, "ddpm var t=%d var=%d: %.17g vs %.17g",
                              t, var, vs, v);

                    sampler_step(&c, &s, t, t - 1, x, m, zero, out, NE);
                    double em = tu_rel_err(out, ref_mu, NE);
                    CHECK(em <= 1e-6, "ddpm mean t=%d var=%d clip=%d v=%d: rel err %.3g", t, var,
                          clip, pv, em);
                    sampler_step(&c, &s, t, t - 1, x, m, t > 0 ? z : NULL, out, NE);
                    double ef = tu_rel_err(out, ref, NE);
                    CHECK(ef <= 1e-6, "ddpm step t=%d var=%d clip=%d v=%d: rel err %.3g", t, var,
                          clip, pv, ef);
                }

    /* at t == 0 the result is the clamped x0 (c1 = 1, c2 = 0): no noise, whatever the variance */
    struct sampler_config c;
    sampler_config_default(&c);
    c.kind = SAMPLER_DDPM;
    tu_fill(x, NE, 1.5);
    tu_fill(m, NE, 1.2);
    sampler_step(&c, &s, 0, -1, x, m, NULL, out, NE);
    for (int i = 0; i < NE; i++) {
        double x0, e;
        ref_predict(0, 1, ref_ab[0], x[i], m[i], &x0, &e);
        ref[i] = x0;
    }
    CHECK(tu_rel_err(out, ref, NE) <= 1e-6, "ddpm t=0 gives x0_hat");

    /* a respaced step (t -> t_prev < t-1) uses beta' = 1 - ab_t / ab_prev as diffusers does */
    for (int var = 0; var < 2; var++) {
        int t = 500, tp = 480;
        c.variance = var ? SAMPLER_VAR_FIXED_LARGE : SAMPLER_VAR_FIXED_SMALL;
        fill_normal(z, NE, 200);
        double ab = ref_ab[t], abp = ref_ab[tp], bt = 1.0 - ab / abp;
        double c1 = sqrt(abp) * bt / (1.0 - ab), c2 = sqrt(1.0 - bt) * (1.0 - abp) / (1.0 - ab);
        double v = var ? bt : bt * (1.0 - abp) / (1.0 - ab);
        for (int i = 0; i < NE; i++) {
            double x0, e;
            ref_predict(0, 1, ab, x[i], m[i], &x0, &e);
            ref[i] = c1 * x0 + c2 * x[i] + sqrt(v) * z[i];
        }
        sampler_step(&c, &s, t, tp, x, m, z, out, NE);
        double er = tu_rel_err(out, ref, NE);
        CHECK(er <= 1e-6, "ddpm respaced var=%d: rel err %.3g", var, er);
    }
    ddpm_schedule_free(&s);
}

static void test_ddim(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule");
    float x[NE], m[NE], z[NE], out[NE];
    double ref[NE];
    const int pairs[][2] = {{999, 979}, {980, 960}, {500, 480}, {500, 499}, {120, 20}, {20, 0},
                            {19, -1}, {0, -1}};
    const float etas[] = {0.0f, 0.5f, 1.0f};
    const int npairs = (int)(sizeof pairs / sizeof pairs[0]);
    tu_seed(23);
    for (int pi = 0; pi < npairs; pi++)
        for (int ei = 0; ei < 3; ei++)
            for (int clip = 0; clip < 2; clip++)
                for (int pv = 0; pv < 2; pv++) {
                    int t = pairs[pi][0], tp = pairs[pi][1];
                    float eta = etas[ei];
                    tu_fill(x, NE, 1.5);
                    tu_fill(m, NE, 1.2);
                    fill_normal(z, NE, (uint64_t)(300 + pi));
                    struct sampler_config c;
                    sampler_config_default(&c);
                    c.eta = eta;
                    c.clip_x0 = clip;
                    c.prediction = pv ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;

                    /* reference: DDIM eq. 12 with sigma of eq. 16, ab_{-1} = 1 */
                    double ab = ref_ab[t], abp = tp >= 0 ? ref_ab[tp] : 1.0;
                    double sig = (double)eta * sqrt((1.0 - abp) / (1.0 - ab)) * sqrt(1.0 - ab / abp);
                    for (int i = 0; i < NE; i++) {
                        double x0, e;
                        ref_predict(pv, clip, ab, x[i], m[i], &x0, &e);
                        ref[i] = sqrt(abp) * x0 + sqrt(1.0 - abp - sig * sig) * e + sig * z[i];
                    }
                    /* noise only where the step needs it: NULL otherwise */
                    const float *zz = (eta > 0.0f && tp >= 0) ? z : NULL;
                    sampler_step(&c, &s, t, tp, x, m, zz, out, NE);
                    double er = tu_rel_err(out, ref, NE);
                    CHECK(er <= 1e-6, "ddim %d->%d eta=%g clip=%d v=%d: rel err %.3g", t, tp,
                          (double)eta, clip, pv, er);
                }
    ddpm_schedule_free(&s);
}

static void test_determinism(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule");
    float x[NE], m[NE], z[NE], a[NE], b[NE], c_[NE], d[NE];
    tu_seed(5);
    tu_fill(x, NE, 1.5);
    tu_fill(m, NE, 1.2);
    fill_normal(z, NE, 7);
    struct sampler_config c;
    sampler_config_default(&c);
    sampler_step(&c, &s, 980, 960, x, m, NULL, a, NE);
    sampler_step(&c, &s, 980, 960, x, m, NULL, b, NE);
    sampler_step(&c, &s, 980, 960, x, m, z, c_, NE); /* eta 0: noise is not read */
    memcpy(d, x, sizeof d);
    sampler_step(&c, &s, 980, 960, d, m, NULL, d, NE); /* in place */
    CHECK(memcmp(a, b, sizeof a) == 0, "ddim eta 0: same inputs, same bits");
    CHECK(memcmp(a, c_, sizeof a) == 0, "ddim eta 0: noise ignored");
    CHECK(memcmp(a, d, sizeof a) == 0, "ddim in place == out of place");
    c.kind = SAMPLER_DDPM;
    sampler_step(&c, &s, 500, 499, x, m, z, a, NE);
    memcpy(d, x, sizeof d);
    sampler_step(&c, &s, 500, 499, d, m, z, d, NE);
    CHECK(memcmp(a, d, sizeof a) == 0, "ddpm in place == out of place");
    ddpm_schedule_free(&s);
}

/* ---- perfect-model sampling ---- */

/* data: every element i is the constant xs[i]; the exact model output at (x_t, t) is
 * eps = (x_t - sqrt(ab) xs) / sqrt(1-ab), or v = sqrt(ab) eps - sqrt(1-ab) xs */
#define NO 64

static double run_oracle_point(const struct sampler_config *c, const struct ddpm_schedule *s,
                               const float *xs)
{
    int ts[T_TRAIN];
    int n = sampler_timesteps(c, s, ts, T_TRAIN);
    if (n < 1) return INFINITY;
    float x[NO], m[NO], z[NO];
    fill_normal(x, NO, 0);
    for (int k = 0; k < n; k++) {
        int t = ts[k], tp = k + 1 < n ? ts[k + 1] : -1;
        double ab = s->alpha_bar[t], a = sqrt(ab), b = sqrt(1.0 - ab);
        for (int i = 0; i < NO; i++) {
            double eps = ((double)x[i] - a * xs[i]) / b;
            m[i] = (float)(c->prediction == SAMPLER_PRED_V ? a * eps - b * xs[i] : eps);
        }
        const float *zz = NULL;
        if (sampler_needs_noise(c, t, tp)) {
            fill_normal(z, NO, (uint64_t)(k + 1));
            zz = z;
        }
        sampler_step(c, s, t, tp, x, m, zz, x, NO);
    }
    double worst = 0;
    for (int i = 0; i < NO; i++) worst = fmax(worst, fabs((double)x[i] - xs[i]));
    return worst;
}

static void test_oracle_point(void)
{
    float xs[NO];
    tu_seed(99);
    tu_fill(xs, NO, 0.9);
    for (int sched = 0; sched < 2; sched++) {
        struct ddpm_schedule s;
        CHECK(ddpm_schedule_init(&s, T_TRAIN, sched ? DDPM_BETA_COSINE : DDPM_BETA_LINEAR, 1e-4,
                                 0.02) == 0,
              "schedule");
        struct {
            enum sampler_kind kind;
            enum sampler_variance var;
            enum sampler_prediction pred;
            enum sampler_spacing sp;
            float eta;
            const char *name;
        } runs[] = {
            {SAMPLER_DDPM, SAMPLER_VAR_FIXED_SMALL, SAMPLER_PRED_EPSILON, 0, 0, "ddpm small eps"},
            {SAMPLER_DDPM, SAMPLER_VAR_FIXED_LARGE, SAMPLER_PRED_EPSILON, 0, 0, "ddpm large eps"},
            {SAMPLER_DDPM, SAMPLER_VAR_FIXED_SMALL, SAMPLER_PRED_V, 0, 0, "ddpm small v"},
            {SAMPLER_DDIM, 0, SAMPLER_PRED_EPSILON, SAMPLER_SPACING_LEADING, 0, "ddim50 eps"},
            {SAMPLER_DDIM, 0, SAMPLER_PRED_V, SAMPLER_SPACING_LEADING, 0, "ddim50 v"},
            {SAMPLER_DDIM, 0, SAMPLER_PRED_EPSILON, SAMPLER_SPACING_TRAILING, 1, "ddim50 eta1 tr"},
            {SAMPLER_DDIM, 0, SAMPLER_PRED_V, SAMPLER_SPACING_LINSPACE, 0.5f, "ddim50 eta.5 lin"},
        };
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            struct sampler_config c;
            sampler_config_default(&c);
            c.kind = runs[r].kind;
            c.variance = runs[r].var;
            c.prediction = runs[r].pred;
            c.spacing = runs[r].sp;
            c.eta = runs[r].eta;
            double w = run_oracle_point(&c, &s, xs);
            CHECK(w <= 1e-3, "oracle point %s (%s): max |x0 - x*| = %.3g", runs[r].name,
                  sched ? "cosine" : "linear", w);
        }
        ddpm_schedule_free(&s);
    }
}

/* data: every element iid N(mu, sd^2). x_t ~ N(a mu, a^2 sd^2 + b^2) and the exact eps-model is
 * E[eps | x_t] = b (x_t - a mu) / (a^2 sd^2 + b^2). The sampler's output must have mean mu and
 * standard deviation sd, up to sampling error (1/sqrt(2*NG) = 0.8% on sd) and discretisation. */
#define NG 8192

static void run_oracle_gauss(const struct sampler_config *c, const struct ddpm_schedule *s,
                             double mu, double sd, double *mean, double *std)
{
    int ts[T_TRAIN];
    int n = sampler_timesteps(c, s, ts, T_TRAIN);
    float *x = malloc(NG * sizeof *x), *m = malloc(NG * sizeof *m), *z = malloc(NG * sizeof *z);
    fill_normal(x, NG, 0);
    for (int k = 0; k < n; k++) {
        int t = ts[k], tp = k + 1 < n ? ts[k + 1] : -1;
        double ab = s->alpha_bar[t], a = sqrt(ab), b = sqrt(1.0 - ab);
        double den = ab * sd * sd + b * b;
        for (int i = 0; i < NG; i++) m[i] = (float)(b * ((double)x[i] - a * mu) / den);
        const float *zz = NULL;
        if (sampler_needs_noise(c, t, tp)) {
            fill_normal(z, NG, (uint64_t)(k + 1));
            zz = z;
        }
        sampler_step(c, s, t, tp, x, m, zz, x, NG);
    }
    double s1 = 0, s2 = 0;
    for (int i = 0; i < NG; i++) s1 += x[i];
    *mean = s1 / NG;
    for (int i = 0; i < NG; i++) s2 += ((double)x[i] - *mean) * ((double)x[i] - *mean);
    *std = sqrt(s2 / (NG - 1));
    free(x);
    free(m);
    free(z);
}

static void test_oracle_gauss(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_LINEAR, 1e-4, 0.02) == 0, "schedule");
    const double mu = 0.3, sd = 0.2;
    struct {
        enum sampler_kind kind;
        enum sampler_variance var;
        int steps;
        float eta;
        const char *name;
    } runs[] = {
        {SAMPLER_DDPM, SAMPLER_VAR_FIXED_SMALL, 0, 0, "ddpm fixed_small"},
        {SAMPLER_DDPM, SAMPLER_VAR_FIXED_LARGE, 0, 0, "ddpm fixed_large"},
        {SAMPLER_DDIM, 0, 1000, 0, "ddim1000 eta0"},
        {SAMPLER_DDIM, 0, 1000, 1, "ddim1000 eta1"},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        struct sampler_config c;
        sampler_config_default(&c);
        c.kind = runs[r].kind;
        c.variance = runs[r].var;
        c.steps = runs[r].steps;
        c.eta = runs[r].eta;
        c.clip_x0 = 0; /* the data's tails pass 1 */
        double mean, std;
        run_oracle_gauss(&c, &s, mu, sd, &mean, &std);
        printf("  oracle N(%.1f, %.1f^2) %-16s mean %.4f sd %.4f\n", mu, sd, runs[r].name, mean,
               std);
        CHECK(fabs(mean - mu) <= 0.01 && fabs(std / sd - 1.0) <= 0.04,
              "oracle gauss %s: mean %.4f sd %.4f (want %.1f, %.1f)", runs[r].name, mean, std, mu,
              sd);
    }
    ddpm_schedule_free(&s);
}

/* v = sqrt(ab) eps - sqrt(1-ab) x0 handed back to the sampler as a v-prediction gives x0 and eps */
static void test_v_target(void)
{
    struct ddpm_schedule s;
    CHECK(ddpm_schedule_init(&s, T_TRAIN, DDPM_BETA_COSINE, 0, 0) == 0, "cosine schedule");
    enum { NS = 4, PS = 37 };
    const int t[NS] = {999, 500, 10, 0};
    float x0[NS * PS], eps[NS * PS], v[NS * PS], xt[NS * PS], x0h[PS], epsh[PS];
    double vref[NS * PS], r0[PS], re[PS];
    tu_seed(31);
    tu_fill(x0, NS * PS, 1.0);
    fill_normal(eps, NS * PS, 77);
    sampler_v_target(v, x0, eps, t, NS, PS, &s);
    for (int i = 0; i < NS; i++) {
        double ab = s.alpha_bar[t[i]], a = sqrt(ab), b = sqrt(1.0 - ab);
        for (int j = 0; j < PS; j++) {
            int k = i * PS + j;
            vref[k] = a * eps[k] - b * x0[k];
            xt[k] = (float)(a * x0[k] + b * eps[k]);
        }
    }
    double ev = tu_rel_err(v, vref, NS * PS);
    CHECK(ev <= 1e-6, "v target vs reference: rel err %.3g", ev);

    struct sampler_config c;
    sampler_config_default(&c);
    c.clip_x0 = 0;
    c.prediction = SAMPLER_PRED_V;
    for (int i = 0; i < NS; i++) {
        sampler_predict(&c, &s, t[i], xt + i * PS, v + i * PS, x0h, epsh, PS);
        for (int j = 0; j < PS; j++) {
            r0[j] = x0[i * PS + j];
            re[j] = eps[i * PS + j];
        }
        double e0 = tu_rel_err(x0h, r0, PS), ee = tu_rel_err(epsh, re, PS);
        CHECK(e0 <= 1e-6 && ee <= 1e-6, "v inversion t=%d: x0 rel err %.3g, eps rel err %.3g",
              t[i], e0, ee);
    }
    /* a DDIM step fed v (v-prediction) equals one fed the true eps (eps-prediction) at a t where
     * the eps inversion (x - b eps) / a is well conditioned */
    float out_v[PS], out_e[PS];
    c.clip_x0 = 1;
    sampler_step(&c, &s, t[1], 480, xt + PS, v + PS, NULL, out_v, PS);
    c.prediction = SAMPLER_PRED_EPSILON;
    sampler_step(&c, &s, t[1], 480, xt + PS, eps + PS, NULL, out_e, PS);
    double es = tu_rel_err_f(out_v, out_e, PS);
    CHECK(es <= 1e-6, "ddim step: v-prediction == eps-prediction, rel err %.3g", es);
    ddpm_schedule_free(&s);
}

int main(void)
{
    ref_schedule_init();
    test_names();
    test_timesteps();
    test_needs_noise();
    test_ddpm_posterior();
    test_ddim();
    test_determinism();
    test_oracle_point();
    test_oracle_gauss();
    test_v_target();
    return tu_finish("test_sampler");
}
