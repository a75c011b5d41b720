/* test_init.c - initialisation against PyTorch's: for both presets, every parameter of the
 * committed fixtures' freshly constructed models (param.NAME, torch's default init) against
 * init_param's: zeros and ones exactly where PyTorch has them, every other tensor uniform
 * within the same bound (max |w| <= bound, the largest |w| near it, std near bound / sqrt(3)).
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "safetensors.h"
#include "test_util.h"
#include "unet.h"

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static int jints(const cJSON *o, const char *k, int *dst, int max)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, k), *v;
    int n = 0;
    cJSON_ArrayForEach(v, a) if (n < max) dst[n++] = v->valueint;
    return n;
}

/* the fixture's model config (its "config" metadata, as test_parity reads it) */
static int load_config(const struct safetensors *st, struct unet_config *c)
{
    const char *meta = safetensors_meta(st, "config");
    cJSON *m = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *preset = m ? cJSON_GetObjectItemCaseSensitive(m, "preset") : NULL;
    if (!cJSON_IsString(preset)) {
        cJSON_Delete(m);
        return -1;
    }
    unet_config_default(c, strcmp(preset->valuestring, "seed") == 0 ? UNET_SEED : UNET_DDPM);
    c->in_channels = (int)jnum(m, "in_channels");
    c->out_channels = (int)jnum(m, "out_channels");
    c->image_size = (int)jnum(m, "image_size");
    if (c->preset == UNET_DDPM) {
        c->n_levels = jints(m, "block_out_channels", c->channels, UNET_MAX_LEVELS);
        c->layers_per_block = (int)jnum(m, "layers_per_block");
        c->n_attn = jints(m, "attention_resolutions", c->attn_res, UNET_MAX_LEVELS);
        c->groups = (int)jnum(m, "norm_num_groups");
        c->norm_eps = (float)jnum(m, "norm_eps");
        c->attn_head_dim = (int)jnum(m, "attention_head_dim");
        c->dropout = (float)jnum(m, "dropout");
        c->flip_sin_to_cos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "flip_sin_to_cos"));
        c->freq_shift = (float)jnum(m, "freq_shift");
    } else {
        c->base = (int)jnum(m, "base");
        c->time_dim = (int)jnum(m, "time_dim");
        c->heads = (int)jnum(m, "heads");
    }
    cJSON_Delete(m);
    return 0;
}

struct dist {
    int all_zero, all_one;
    double max_abs, mean, std;
};

static struct dist dist_of(const float *w, size_t n)
{
    struct dist d = {1, 1, 0, 0, 0};
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        d.all_zero &= w[i] == 0.0f;
        d.all_one &= w[i] == 1.0f;
        if (fabs(w[i]) > d.max_abs) d.max_abs = fabs(w[i]);
        s += w[i];
        s2 += (double)w[i] * w[i];
    }
    d.mean = s / (double)n;
    d.std = sqrt(fmax(s2 / (double)n - d.mean * d.mean, 0.0));
    return d;
}

/* the half-width of the uniform init_param draws t from (0 for constants) */
static double init_bound(const struct tensor *t)
{
    switch (t->init) {
    case INIT_FAN_IN_UNIFORM: return t->fan_in > 0 ? 1.0 / sqrt((double)t->fan_in) : 0.0;
    case INIT_XAVIER_UNIFORM: return sqrt(6.0 / (double)(t->fan_in + t->fan_out));
    default: return 0.0;
    }
}

/* w (n values, `who` drew them) looks like U(-bound, bound): nothing beyond the bound, the
 * largest |w| near it (a bound too large shows), mean ~0 and std ~bound/sqrt(3) where n makes
 * the estimate meaningful (the sample std of a uniform has a relative s.d. of 0.45/sqrt(n)) */
static void check_uniform(const char *path, const char *name, const char *who,
                          const struct dist *d, size_t n, double bound)
{
    double sd = bound / sqrt(3.0);
    CHECK(d->max_abs <= bound * (1 + 1e-6), "%s %s: %s max |w| %.6g beyond the bound %.6g",
          path, name, who, d->max_abs, bound);
    if (n >= 16)
        CHECK(d->max_abs >= bound * (1.0 - 8.0 / (double)n),
              "%s %s: %s max |w| %.6g, far inside the bound %.6g (n %zu)", path, name, who,
              d->max_abs, bound, n);
    if (n >= 256) {
        CHECK(fabs(d->std / sd - 1.0) <= 3.0 / sqrt((double)n),
              "%s %s: %s std %.6g, uniform's %.6g (n %zu)", path, name, who, d->std, sd, n);
        CHECK(fabs(d->mean) <= 5.0 * sd / sqrt((double)n), "%s %s: %s mean %.3g (n %zu)", path,
              name, who, d->mean, n);
    }
}

static void check_fixture(const char *path, int *n_zero, int *n_one, int *n_uniform)
{
    char err[256], name[300];
    struct safetensors *st = NULL;
    if (safetensors_open(&st, path, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        return;
    }
    struct unet_config cfg;
    struct graph g;
    struct unet_io io;
    graph_init(&g);
    CHECK(load_config(st, &cfg) == 0, "%s: no model config", path);
    CHECK(unet_build(&g, &cfg, 1, &io) == 0, "%s: graph: %s", path, g.err);
    float *ours = malloc((g.param_numel ? g.param_numel : 1) * sizeof *ours);
    int n_file = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        n_file += strncmp(t->name, "param.", 6) == 0;
    }
    CHECK(n_file == g.n_params, "%s: %d parameters in the fixture, %d in the graph", path,
          n_file, g.n_params);
    for (int i = 0; i < g.n_tensors && !g.status && ours; i++) {
        const struct tensor *t = g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        const struct st_tensor *ft;
        snprintf(name, sizeof name, "param.%s", t->name);
        if (safetensors_find(st, name, &ft) || ft->dtype != ST_F32 ||
            (size_t)ft->numel != t->numel) {
            CHECK(0, "%s: %s missing or of another size", path, name);
            continue;
        }
        init_param(t, 1, ours);
        struct dist pt = dist_of(ft->data, t->numel), me = dist_of(ours, t->numel);
        if (pt.all_zero) {
            (*n_zero)++;
            CHECK(t->init == INIT_ZEROS && me.all_zero, "%s %s: PyTorch starts it at zeros, "
                  "ddpmd at init kind %d (max |w| %.3g)", path, t->name, (int)t->init,
                  me.max_abs);
        } else if (pt.all_one) {
            (*n_one)++;
            CHECK(t->init == INIT_ONES && me.all_one, "%s %s: PyTorch starts it at ones, "
                  "ddpmd at init kind %d", path, t->name, (int)t->init);
        } else {
            (*n_uniform)++;
            CHECK(t->init == INIT_FAN_IN_UNIFORM || t->init == INIT_XAVIER_UNIFORM,
                  "%s %s: PyTorch draws it at random, ddpmd starts it at %s", path, t->name,
                  t->init == INIT_ONES ? "ones" : "zeros");
            double bound = init_bound(t);
            CHECK(bound > 0, "%s %s: no bound (fan_in %d)", path, t->name, t->fan_in);
            check_uniform(path, t->name, "PyTorch", &pt, t->numel, bound);
            check_uniform(path, t->name, "ddpmd", &me, t->numel, bound);
        }
    }
    free(ours);
    graph_free(&g);
    safetensors_free(st);
}

int main(void)
{
    const char *fixtures[] = {"tests/parity/fixtures/ddpm.safetensors",
                              "tests/parity/fixtures/seed.safetensors"};
    for (int f = 0; f < 2; f++) {
        int z = 0, o = 0, u = 0;
        check_fixture(fixtures[f], &z, &o, &u);
        printf("%s: %d parameters zero, %d one, %d uniform, each as PyTorch starts it\n",
               fixtures[f], z, o, u);
        CHECK(z > 0 && o > 0 && u > 0, "%s: a kind of initialisation is missing", fixtures[f]);
    }
    return tu_finish("test_init");
}
