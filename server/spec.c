/* spec.c - training spec JSON <-> struct train_spec through cJSON, with validation that names
 * each offending field by its path. Unknown fields are errors (a typo must not silently fall
 * back to a default).
 */
#include "spec.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void err(struct spec_errors *E, const char *path, const char *fmt, ...)
{
    if (E->n >= SPEC_MAX_ERRORS) return;
    snprintf(E->e[E->n].path, sizeof E->e[E->n].path, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(E->e[E->n].msg, sizeof E->e[E->n].msg, fmt, ap);
    va_end(ap);
    E->n++;
}

static const char *join(char *buf, size_t n, const char *path, const char *key)
{
    snprintf(buf, n, "%s%s%s", path, *path ? "." : "", key);
    return buf;
}

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "invalid";
}

static void check_keys(struct spec_errors *E, const cJSON *obj, const char *path,
                       const char *const *allowed)
{
    const cJSON *c;
    char buf[128];
    cJSON_ArrayForEach(c, obj)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(c->string, *a) == 0;
        if (!ok) err(E, join(buf, sizeof buf, path, c->string), "unknown field");
    }
}

static const cJSON *item(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* an optional integer in [min, max]; absent keeps *dst */
static void get_int(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                    int *dst, long min, long max)
{
    const cJSON *v = item(obj, key);
    char buf[128];
    if (!v) return;
    join(buf, sizeof buf, path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        err(E, buf, "expected an integer, got %s", cJSON_IsNumber(v) ? "a fraction" : type_name(v));
        return;
    }
    if (v->valuedouble < (double)min || v->valuedouble > (double)max) {
        err(E, buf, "must be in [%ld, %ld], got %.0f", min, max, v->valuedouble);
        return;
    }
    *dst = (int)v->valuedouble;
}

static void get_u64(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                    uint64_t *dst)
{
    const cJSON *v = item(obj, key);
    char buf[128];
    if (!v) return;
    join(buf, sizeof buf, path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 9007199254740992.0) {
        err(E, buf, "expected a non-negative integer below 2^53");
        return;
    }
    *dst = (uint64_t)v->valuedouble;
}

/* an optional number in [min, max] (or (min, max] when min_open) */
static void get_num(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                    double *dst, double min, double max, int min_open)
{
    const cJSON *v = item(obj, key);
    char buf[128];
    if (!v) return;
    join(buf, sizeof buf, path, key);
    if (!cJSON_IsNumber(v)) {
        err(E, buf, "expected a number, got %s", type_name(v));
        return;
    }
    double x = v->valuedouble;
    if (x > max || x < min || (min_open && x == min)) {
        err(E, buf, "must be in %s%g, %g], got %g", min_open ? "(" : "[", min, max, x);
        return;
    }
    *dst = x;
}

static void get_float(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                      float *dst, double min, double max, int min_open)
{
    double d = *dst;
    get_num(E, obj, path, key, &d, min, max, min_open);
    *dst = (float)d;
}

static void get_bool(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                     int *dst)
{
    const cJSON *v = item(obj, key);
    char buf[128];
    if (!v) return;
    if (!cJSON_IsBool(v)) {
        err(E, join(buf, sizeof buf, path, key), "expected true or false, got %s", type_name(v));
        return;
    }
    *dst = cJSON_IsTrue(v);
}

/* a string that must be one of choices; *dst gets its index */
static void get_enum(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                     const char *const *choices, int *dst)
{
    const cJSON *v = item(obj, key);
    char buf[128], list[200] = "";
    if (!v) return;
    join(buf, sizeof buf, path, key);
    for (int i = 0; choices[i]; i++) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, choices[i]) == 0) {
            *dst = i;
            return;
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                 choices[i]);
    }
    err(E, buf, "must be one of %s", list);
}

static int get_int_list(struct spec_errors *E, const cJSON *obj, const char *path,
                        const char *key, int *dst, int max, int min_value)
{
    const cJSON *v = item(obj, key), *x;
    char buf[128], ebuf[160];
    if (!v) return -1;
    join(buf, sizeof buf, path, key);
    if (!cJSON_IsArray(v)) {
        err(E, buf, "expected an array of integers, got %s", type_name(v));
        return -1;
    }
    int n = 0;
    cJSON_ArrayForEach(x, v)
    {
        snprintf(ebuf, sizeof ebuf, "%s[%d]", buf, n);
        if (n >= max) {
            err(E, buf, "at most %d entries", max);
            return -1;
        }
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
            x->valuedouble < min_value || x->valuedouble > 1e6) {
            err(E, ebuf, "expected an integer >= %d", min_value);
            return -1;
        }
        dst[n++] = (int)x->valuedouble;
    }
    return n;
}

static const cJSON *get_object(struct spec_errors *E, const cJSON *root, const char *key,
                               int required)
{
    const cJSON *v = item(root, key);
    if (!v) {
        if (required) err(E, key, "required");
        return NULL;
    }
    if (!cJSON_IsObject(v)) {
        err(E, key, "expected an object, got %s", type_name(v));
        return NULL;
    }
    return v;
}

static void parse_model(struct spec_errors *E, const cJSON *m, struct unet_config *c)
{
    static const char *presets[] = {"ddpm", "seed", NULL};
    int preset = -1;
    const cJSON *p = item(m, "preset");
    if (!p) {
        err(E, "model.preset", "required (\"ddpm\" or \"seed\")");
        return;
    }
    get_enum(E, m, "model", "preset", presets, &preset);
    if (preset < 0) return;
    unet_config_default(c, (enum unet_preset)preset);
    get_int(E, m, "model", "in_channels", &c->in_channels, 1, 4);
    c->out_channels = c->in_channels;
    get_int(E, m, "model", "out_channels", &c->out_channels, 1, 4);
    get_int(E, m, "model", "image_size", &c->image_size, 8, 1024);
    if (preset == UNET_DDPM) {
        static const char *keys[] = {"preset", "in_channels", "out_channels", "image_size",
                                     "block_out_channels", "layers_per_block",
                                     "attention_resolutions", "norm_num_groups", "norm_eps",
                                     "attention_head_dim", "dropout", "flip_sin_to_cos",
                                     "freq_shift", NULL};
        check_keys(E, m, "model", keys);
        int n = get_int_list(E, m, "model", "block_out_channels", c->channels, UNET_MAX_LEVELS, 1);
        if (n == 0) err(E, "model.block_out_channels", "needs at least one level");
        if (n > 0) c->n_levels = n;
        get_int(E, m, "model", "layers_per_block", &c->layers_per_block, 1, 8);
        n = get_int_list(E, m, "model", "attention_resolutions", c->attn_res, UNET_MAX_LEVELS, 1);
        if (n >= 0) c->n_attn = n;
        get_int(E, m, "model", "norm_num_groups", &c->groups, 1, 1024);
        get_float(E, m, "model", "norm_eps", &c->norm_eps, 0, 1, 1);
        const cJSON *hd = item(m, "attention_head_dim");
        if (hd && cJSON_IsNull(hd))
            c->attn_head_dim = 0;
        else
            get_int(E, m, "model", "attention_head_dim", &c->attn_head_dim, 1, 4096);
        get_float(E, m, "model", "dropout", &c->dropout, 0, 0.99, 0);
        get_bool(E, m, "model", "flip_sin_to_cos", &c->flip_sin_to_cos);
        get_float(E, m, "model", "freq_shift", &c->freq_shift, 0, 1, 0);
    } else {
        static const char *keys[] = {"preset", "in_channels", "out_channels", "image_size",
                                     "base", "time_dim", "heads", NULL};
        check_keys(E, m, "model", keys);
        get_int(E, m, "model", "base", &c->base, 2, 1024);
        get_int(E, m, "model", "time_dim", &c->time_dim, 2, 4096);
        get_int(E, m, "model", "heads", &c->heads, 1, 64);
    }
    char msg[200];
    if (E->n == 0 && unet_config_check(c, msg, sizeof msg)) err(E, "model", "%s", msg);
}

void spec_defaults(struct train_spec *s)
{
    memset(s, 0, sizeof *s);
    unet_config_default(&s->model, UNET_DDPM);
    s->flip = 0;
    s->validation = 0;
    s->timesteps = 1000;
    s->beta_schedule = DDPM_BETA_LINEAR;
    s->beta_start = 1e-4;
    s->beta_end = 0.02;
    s->prediction = SPEC_PRED_EPSILON;
    s->batch = 32;
    s->steps = 10000;
    s->optim.lr = 2e-4f;
    s->optim.beta1 = 0.9f;
    s->optim.beta2 = 0.999f;
    s->optim.eps = 1e-8f;
    s->optim.weight_decay = 0.0f;
    s->optim.clip = 1.0f;
    s->optim.ema_decay = 0.999f;
    s->optim.warmup = 500;
    s->optim.cosine = 0;
    s->seed = 1;
    s->threads = 2;
    s->checkpoint_every = 1000;
    s->sample_every = 1000;
    s->log_every = 50;
    s->keep_last = 3;
    s->samples = 16;
}

int spec_parse(const char *json, struct train_spec *s, struct spec_errors *E)
{
    memset(E, 0, sizeof *E);
    spec_defaults(s);
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        err(E, "", "not valid JSON%s%.20s", at ? " near: " : "", at ? at : "");
        return -1;
    }
    if (!cJSON_IsObject(root)) {
        err(E, "", "expected a JSON object");
        cJSON_Delete(root);
        return -1;
    }
    static const char *top[] = {"model", "data", "diffusion", "train", "output", "init_from",
                                NULL};
    check_keys(E, root, "", top);

    const cJSON *m = get_object(E, root, "model", 1);
    if (m) parse_model(E, m, &s->model);

    const cJSON *d = get_object(E, root, "data", 1);
    if (d) {
        static const char *keys[] = {"dataset", "flip", "fmnist_resize", "validation", NULL};
        static const char *resize[] = {"pad", "resize", NULL};
        check_keys(E, d, "data", keys);
        const cJSON *ds = item(d, "dataset");
        if (!ds)
            err(E, "data.dataset", "required (\"fashion-mnist\" or a folder of PNG images)");
        else if (!cJSON_IsString(ds) || !ds->valuestring[0])
            err(E, "data.dataset", "expected a non-empty string");
        else if (strlen(ds->valuestring) >= sizeof s->dataset)
            err(E, "data.dataset", "longer than %zu bytes", sizeof s->dataset - 1);
        else
            snprintf(s->dataset, sizeof s->dataset, "%s", ds->valuestring);
        get_bool(E, d, "data", "flip", &s->flip);
        get_enum(E, d, "data", "fmnist_resize", resize, &s->fmnist_resize);
        get_int(E, d, "data", "validation", &s->validation, 0, 100000);
    }

    const cJSON *df = get_object(E, root, "diffusion", 0);
    if (df) {
        static const char *keys[] = {"timesteps", "beta_schedule", "beta_start", "beta_end",
                                     "prediction", NULL};
        static const char *sched[] = {"linear", "cosine", NULL};
        static const char *pred[] = {"epsilon", "v_prediction", NULL};
        check_keys(E, df, "diffusion", keys);
        get_int(E, df, "diffusion", "timesteps", &s->timesteps, 2, 100000);
        int k = (int)s->beta_schedule, p = (int)s->prediction;
        get_enum(E, df, "diffusion", "beta_schedule", sched, &k);
        get_enum(E, df, "diffusion", "prediction", pred, &p);
        s->beta_schedule = (enum ddpm_beta_schedule)k;
        s->prediction = (enum spec_prediction)p;
        get_num(E, df, "diffusion", "beta_start", &s->beta_start, 0, 1, 1);
        get_num(E, df, "diffusion", "beta_end", &s->beta_end, 0, 1, 1);
        if (s->beta_end < s->beta_start)
            err(E, "diffusion.beta_end", "must be >= beta_start (%g)", s->beta_start);
    }

    const cJSON *t = get_object(E, root, "train", 0);
    if (t) {
        static const char *keys[] = {"batch", "steps", "lr", "lr_schedule", "warmup", "beta1",
                                     "beta2", "eps", "weight_decay", "clip", "ema_decay", "seed",
                                     "threads", NULL};
        static const char *sched[] = {"constant", "cosine", NULL};
        check_keys(E, t, "train", keys);
        get_int(E, t, "train", "batch", &s->batch, 1, 65535);
        get_int(E, t, "train", "steps", &s->steps, 1, 100000000);
        get_float(E, t, "train", "lr", &s->optim.lr, 0, 1, 1);
        get_enum(E, t, "train", "lr_schedule", sched, &s->optim.cosine);
        get_int(E, t, "train", "warmup", &s->optim.warmup, 0, 100000000);
        get_float(E, t, "train", "beta1", &s->optim.beta1, 0, 0.999999, 0);
        get_float(E, t, "train", "beta2", &s->optim.beta2, 0, 0.99999999, 0);
        get_float(E, t, "train", "eps", &s->optim.eps, 0, 1, 1);
        get_float(E, t, "train", "weight_decay", &s->optim.weight_decay, 0, 10, 0);
        get_float(E, t, "train", "clip", &s->optim.clip, 0, 1e6, 0);
        get_float(E, t, "train", "ema_decay", &s->optim.ema_decay, 0, 0.999999, 0);
        get_u64(E, t, "train", "seed", &s->seed);
        get_int(E, t, "train", "threads", &s->threads, 1, 256);
    }
    s->optim.total_steps = s->steps;

    const cJSON *o = get_object(E, root, "output", 0);
    if (o) {
        static const char *keys[] = {"checkpoint_every", "sample_every", "log_every",
                                     "keep_last", "samples", NULL};
        check_keys(E, o, "output", keys);
        get_int(E, o, "output", "checkpoint_every", &s->checkpoint_every, 0, 100000000);
        get_int(E, o, "output", "sample_every", &s->sample_every, 0, 100000000);
        get_int(E, o, "output", "log_every", &s->log_every, 1, 100000000);
        get_int(E, o, "output", "keep_last", &s->keep_last, 1, 1000);
        get_int(E, o, "output", "samples", &s->samples, 1, 1024);
    }

    const cJSON *init = item(root, "init_from");
    if (init && !cJSON_IsNull(init)) {
        if (!cJSON_IsString(init) || strlen(init->valuestring) >= sizeof s->init_from)
            err(E, "init_from", "expected a checkpoint path or null");
        else
            snprintf(s->init_from, sizeof s->init_from, "%s", init->valuestring);
    }

    /* cross-field rules */
    if (E->n == 0 && strcmp(s->dataset, "fashion-mnist") == 0) {
        if (s->model.in_channels != 1) err(E, "model.in_channels", "fashion-mnist images have 1 channel");
        if (!s->fmnist_resize && s->model.image_size != 28 && s->model.image_size != 32)
            err(E, "model.image_size", "fashion-mnist is 28x28: use 28 or 32 (padded), or "
                                       "data.fmnist_resize \"resize\"");
    }
    if (E->n == 0 && s->model.out_channels != s->model.in_channels)
        err(E, "model.out_channels", "must equal in_channels: the model predicts noise");
    cJSON_Delete(root);
    return E->n ? -1 : 0;
}

int spec_load_file(const char *path, struct train_spec *s, struct spec_errors *E)
{
    memset(E, 0, sizeof *E);
    FILE *f = fopen(path, "rb");
    if (!f) {
        err(E, "", "cannot open %s", path);
        return -1;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (1 << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        fclose(f);
        int rc = spec_parse(buf, s, E);
        free(buf);
        return rc;
    }
    fclose(f);
    free(buf);
    err(E, "", n >= (1 << 20) ? "%s is larger than 1 MiB" : "cannot read %s", path);
    return -1;
}

char *spec_to_json(const struct train_spec *s)
{
    cJSON *r = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(r, "model");
    const struct unet_config *c = &s->model;
    cJSON_AddStringToObject(m, "preset", c->preset == UNET_DDPM ? "ddpm" : "seed");
    cJSON_AddNumberToObject(m, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(m, "out_channels", c->out_channels);
    cJSON_AddNumberToObject(m, "image_size", c->image_size);
    if (c->preset == UNET_DDPM) {
        cJSON_AddItemToObject(m, "block_out_channels", cJSON_CreateIntArray(c->channels, c->n_levels));
        cJSON_AddNumberToObject(m, "layers_per_block", c->layers_per_block);
        cJSON_AddItemToObject(m, "attention_resolutions", cJSON_CreateIntArray(c->attn_res, c->n_attn));
        cJSON_AddNumberToObject(m, "norm_num_groups", c->groups);
        cJSON_AddNumberToObject(m, "norm_eps", c->norm_eps);
        if (c->attn_head_dim)
            cJSON_AddNumberToObject(m, "attention_head_dim", c->attn_head_dim);
        else
            cJSON_AddNullToObject(m, "attention_head_dim");
        cJSON_AddNumberToObject(m, "dropout", c->dropout);
        cJSON_AddBoolToObject(m, "flip_sin_to_cos", c->flip_sin_to_cos);
        cJSON_AddNumberToObject(m, "freq_shift", c->freq_shift);
    } else {
        cJSON_AddNumberToObject(m, "base", c->base);
        cJSON_AddNumberToObject(m, "time_dim", c->time_dim);
        cJSON_AddNumberToObject(m, "heads", c->heads);
    }
    cJSON *d = cJSON_AddObjectToObject(r, "data");
    cJSON_AddStringToObject(d, "dataset", s->dataset);
    cJSON_AddBoolToObject(d, "flip", s->flip);
    cJSON_AddStringToObject(d, "fmnist_resize", s->fmnist_resize ? "resize" : "pad");
    cJSON_AddNumberToObject(d, "validation", s->validation);
    cJSON *df = cJSON_AddObjectToObject(r, "diffusion");
    cJSON_AddNumberToObject(df, "timesteps", s->timesteps);
    cJSON_AddStringToObject(df, "beta_schedule",
                            s->beta_schedule == DDPM_BETA_LINEAR ? "linear" : "cosine");
    cJSON_AddNumberToObject(df, "beta_start", s->beta_start);
    cJSON_AddNumberToObject(df, "beta_end", s->beta_end);
    cJSON_AddStringToObject(df, "prediction",
                            s->prediction == SPEC_PRED_EPSILON ? "epsilon" : "v_prediction");
    cJSON *t = cJSON_AddObjectToObject(r, "train");
    cJSON_AddNumberToObject(t, "batch", s->batch);
    cJSON_AddNumberToObject(t, "steps", s->steps);
    cJSON_AddNumberToObject(t, "lr", s->optim.lr);
    cJSON_AddStringToObject(t, "lr_schedule", s->optim.cosine ? "cosine" : "constant");
    cJSON_AddNumberToObject(t, "warmup", s->optim.warmup);
    cJSON_AddNumberToObject(t, "beta1", s->optim.beta1);
    cJSON_AddNumberToObject(t, "beta2", s->optim.beta2);
    cJSON_AddNumberToObject(t, "eps", s->optim.eps);
    cJSON_AddNumberToObject(t, "weight_decay", s->optim.weight_decay);
    cJSON_AddNumberToObject(t, "clip", s->optim.clip);
    cJSON_AddNumberToObject(t, "ema_decay", s->optim.ema_decay);
    cJSON_AddNumberToObject(t, "seed", (double)s->seed);
    cJSON_AddNumberToObject(t, "threads", s->threads);
    cJSON *o = cJSON_AddObjectToObject(r, "output");
    cJSON_AddNumberToObject(o, "checkpoint_every", s->checkpoint_every);
    cJSON_AddNumberToObject(o, "sample_every", s->sample_every);
    cJSON_AddNumberToObject(o, "log_every", s->log_every);
    cJSON_AddNumberToObject(o, "keep_last", s->keep_last);
    cJSON_AddNumberToObject(o, "samples", s->samples);
    if (s->init_from[0])
        cJSON_AddStringToObject(r, "init_from", s->init_from);
    else
        cJSON_AddNullToObject(r, "init_from");
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

void spec_errors_print(const struct spec_errors *E, const char *prefix)
{
    for (int i = 0; i < E->n; i++)
        fprintf(stderr, "%s%s%s%s\n", prefix, E->e[i].path, E->e[i].path[0] ? ": " : "",
                E->e[i].msg);
}
