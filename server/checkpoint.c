/* checkpoint.c - save and restore a job's persistent state through safetensors. */
#include "checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *part_prefix(enum exec_part p)
{
    switch (p) {
    case EXEC_PART_EMA: return "ema.";
    case EXEC_PART_ADAM_M: return "adam_m.";
    case EXEC_PART_ADAM_V: return "adam_v.";
    default: return "";
    }
}

int checkpoint_save(const char *path, struct exec *e, const struct graph *g,
                    const struct train_spec *spec, int64_t step, char *err, size_t errlen)
{
    int rc = -1;
    struct safetensors_writer *w = NULL;
    float *host = malloc(4 * g->param_numel * sizeof *host + 1);
    char **names = calloc((size_t)g->n_params * 4 + 1, sizeof *names);
    char *json = spec_to_json(spec);
    char buf[64];
    int n_names = 0;
    if (!host || !names || !json || safetensors_writer_init(&w)) {
        snprintf(err, errlen, "out of memory saving %s", path);
        goto out;
    }
    float *dst = host;
    for (int part = EXEC_PART_WEIGHT; part <= EXEC_PART_ADAM_V; part++) {
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tensor *t = g->tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            size_t len = strlen(t->name) + 16;
            char *name = malloc(len);
            if (!name) goto out;
            snprintf(name, len, "%s%s", part_prefix((enum exec_part)part), t->name);
            names[n_names++] = name;
            int64_t shape[4];
            for (int k = 0; k < t->rank; k++) shape[k] = t->d[k];
            if (exec_download_part(e, (enum exec_part)part, i, dst) ||
                safetensors_writer_add(w, name, ST_F32, t->rank, shape, dst)) {
                snprintf(err, errlen, "cannot collect %s for %s", name, path);
                goto out;
            }
            dst += t->numel;
        }
    }
    snprintf(buf, sizeof buf, "%" PRId64, step);
    safetensors_writer_meta(w, "format", CHECKPOINT_FORMAT);
    safetensors_writer_meta(w, "format_version", CHECKPOINT_VERSION);
    safetensors_writer_meta(w, "step", buf);
    /* all draws are Philox functions of (seed, step, ...): the step is the RNG position */
    safetensors_writer_meta(w, "rng_position", buf);
    snprintf(buf, sizeof buf, "%d", spec->threads);
    safetensors_writer_meta(w, "threads", buf);
    safetensors_writer_meta(w, "spec", json);
    if (safetensors_writer_save(w, path, err, errlen)) goto out;
    rc = 0;
out:
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(host);
    free(json);
    safetensors_writer_free(w);
    return rc;
}

int checkpoint_open(struct safetensors **out, const char *path, struct train_spec *spec,
                    int64_t *step, char *err, size_t errlen)
{
    struct safetensors *st = NULL;
    if (safetensors_open(&st, path, err, errlen)) return -1;
    const char *fmt = safetensors_meta(st, "format");
    if (spec) {
        const char *js = safetensors_meta(st, "spec");
        struct spec_errors E;
        if (!fmt || strcmp(fmt, CHECKPOINT_FORMAT) != 0 || !js) {
            snprintf(err, errlen, "%s is not a ddpmd checkpoint (no spec in its metadata)", path);
            goto fail;
        }
        if (spec_parse(js, spec, &E)) {
            snprintf(err, errlen, "%s: the spec in its metadata is invalid: %s: %s", path,
                     E.e[0].path, E.e[0].msg);
            goto fail;
        }
    }
    if (step) {
        const char *s = safetensors_meta(st, "step");
        char *end = NULL;
        *step = s ? strtoll(s, &end, 10) : 0;
        if (s && (*end || *step < 0)) {
            snprintf(err, errlen, "%s: bad step '%s' in its metadata", path, s);
            goto fail;
        }
    }
    *out = st;
    return 0;
fail:
    safetensors_free(st);
    return -1;
}

int checkpoint_apply(const struct safetensors *st, struct exec *e, const struct graph *g,
                     int parts, int from_ema, char *err, size_t errlen)
{
    size_t maxn = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i]->kind == TENSOR_PARAM && g->tensors[i]->numel > maxn)
            maxn = g->tensors[i]->numel;
    float *buf = malloc(maxn * sizeof *buf + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    char name[512];
    for (int part = EXEC_PART_WEIGHT; part <= EXEC_PART_ADAM_V; part++) {
        int want = part == EXEC_PART_WEIGHT ? CHECKPOINT_WEIGHTS
                   : part == EXEC_PART_EMA  ? CHECKPOINT_EMA
                                            : CHECKPOINT_OPTIM;
        if (!(parts & want)) continue;
        /* sampling from EMA weights: read "ema.NAME" into the weights */
        enum exec_part src = part == EXEC_PART_WEIGHT && from_ema ? EXEC_PART_EMA
                                                                  : (enum exec_part)part;
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tensor *t = g->tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            snprintf(name, sizeof name, "%s%s", part_prefix(src), t->name);
            const struct st_tensor *s;
            if (safetensors_find(st, name, &s)) {
                snprintf(err, errlen, "checkpoint has no tensor '%s'", name);
                goto out;
            }
            int same = s->dtype == ST_F32 && s->ndim == t->rank;
            for (int k = 0; same && k < t->rank; k++) same = s->shape[k] == t->d[k];
            if (!same) {
                char want_s[64] = "", got_s[64] = "";
                for (int k = 0; k < t->rank; k++)
                    snprintf(want_s + strlen(want_s), sizeof want_s - strlen(want_s), "%s%d",
                             k ? "," : "", t->d[k]);
                for (int k = 0; k < s->ndim; k++)
                    snprintf(got_s + strlen(got_s), sizeof got_s - strlen(got_s),
                             "%s%" PRId64, k ? "," : "", s->shape[k]);
                snprintf(err, errlen, "tensor '%s' is %s (%s), the model needs F32 (%s)", name,
                         safetensors_dtype_name(s->dtype), got_s, want_s);
                goto out;
            }
            memcpy(buf, s->data, t->numel * sizeof *buf); /* tensor data may be unaligned */
            if (exec_upload_part(e, (enum exec_part)part, i, buf)) {
                snprintf(err, errlen, "cannot upload '%s'", name);
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(buf);
    return rc;
}
