/* checkpoint.c - save and restore a job's persistent state through safetensors. */
#include "checkpoint.h"
#include "planner.h"
#include "unet.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <limits.h>
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

/* the metadata of a checkpoint at step into w; a refused value (not UTF-8: a dataset path in
 * another encoding) fails with the key named, since a checkpoint without its spec can be neither
 * sampled nor resumed. precision: the graph's; ls: f16's loss scale state, or NULL */
static int checkpoint_meta(struct safetensors_writer *w, const struct train_spec *spec,
                           int64_t step, const char *json, const char *plan, int precision,
                           const struct loss_scaler *ls, char *err, size_t errlen)
{
    char sbuf[32], tbuf[32], lbuf[32], gbuf[32], kbuf[32];
    snprintf(sbuf, sizeof sbuf, "%" PRId64, step);
    snprintf(tbuf, sizeof tbuf, "%d", spec->threads);
    if (ls) {
        snprintf(lbuf, sizeof lbuf, "%.9g", (double)ls->scale); /* round-trips a float */
        snprintf(gbuf, sizeof gbuf, "%d", ls->good_steps);
        snprintf(kbuf, sizeof kbuf, "%" PRId64, ls->skipped);
    }
    const char *kv[][2] = {
        {"format", CHECKPOINT_FORMAT}, {"format_version", CHECKPOINT_VERSION}, {"step", sbuf},
        /* all draws are Philox functions of (seed, step, ...): the step is the RNG position */
        {"rng_position", sbuf}, {"threads", tbuf}, {"spec", json},
        /* the plan the planner chose for the run (its strategy and bytes) */
        {"plan", plan},
        /* the weights are fp32 whatever the precision the run computes in */
        {"precision", planner_precision_name(precision)},
        {"loss_scale", ls ? lbuf : NULL}, {"loss_scale_good_steps", ls ? gbuf : NULL},
        {"loss_scale_skipped", ls ? kbuf : NULL},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        if (!kv[i][1]) continue;
        enum st_status st = safetensors_writer_meta(w, kv[i][0], kv[i][1]);
        if (st != ST_OK) {
            snprintf(err, errlen, "cannot store metadata '%s' in the checkpoint: %s%s", kv[i][0],
                     safetensors_status_name(st),
                     st == ST_ERR_ARG ? " (the value is not valid UTF-8: a path in the spec, such "
                                        "as data.dataset, in another encoding?)"
                                      : "");
            return -1;
        }
    }
    return 0;
}

int checkpoint_check_spec(const struct train_spec *spec, const char *spec_json, char *err,
                          size_t errlen)
{
    struct safetensors_writer *w = NULL;
    char *own = spec_json ? NULL : spec_to_json(spec);
    const char *json = spec_json ? spec_json : own;
    int rc = -1;
    if (!json || safetensors_writer_init(&w))
        snprintf(err, errlen, "out of memory");
    else
        rc = checkpoint_meta(w, spec, 0, json, NULL, STRATEGY_PRECISION_F32, NULL, err, errlen);
    safetensors_writer_free(w);
    free(own);
    return rc;
}

/* one tensor of a checkpoint, downloaded from the executor as the file is written */
struct ckpt_tensor {
    struct exec *e;
    enum exec_part part;
    int index;
};

static int ckpt_fill(void *ctx, void *dst)
{
    const struct ckpt_tensor *t = ctx;
    return exec_download_part(t->e, t->part, t->index, dst) ? -1 : 0;
}

int64_t checkpoint_save_plan_bytes(const struct graph *g)
{
    size_t most = 0, names = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        if (t->numel > most) most = t->numel;
        names += strlen(t->name) + 16;
    }
    int64_t n = 4 * (int64_t)g->n_params;
    /* the staging of the largest tensor; each entry's name, its writer entry, its fill's
     * context; the header (names and ~100 bytes of shape and offsets each, then the spec's
     * metadata, at most CHECKPOINT_META_BYTES) */
    return (int64_t)(most * sizeof(float)) + 2 * 4 * (int64_t)names +
           n * (int64_t)(sizeof(char *) + 128 + sizeof(struct ckpt_tensor) + 100) +
           CHECKPOINT_META_BYTES;
}

/* the host bytes reading a checkpoint of g's model holds beside the bytes read from its file:
 * the parsed header (cJSON: ~12 values of ~64 bytes per tensor, the metadata's), the tensor
 * table and one tensor's staging; *file: the file's bytes as checkpoint_save writes them, and
 * *head its length field and header */
static int64_t read_rest_bytes(const struct graph *g, int64_t *file, int64_t *head)
{
    size_t most = 0, numel = 0, names = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        if (t->numel > most) most = t->numel;
        numel += t->numel;
        names += strlen(t->name) + 16;
    }
    int64_t n = 4 * (int64_t)g->n_params;
    /* the header: a name, a dtype, a shape and offsets (~100 bytes) per tensor, the metadata */
    int64_t header = 4 * (int64_t)names + n * 100 + CHECKPOINT_META_BYTES;
    *head = 8 + header;
    *file = *head + 4 * (int64_t)(numel * sizeof(float));
    return header + n * (12 * 64 + 128) + 2 * CHECKPOINT_META_BYTES +
           (int64_t)(most * sizeof(float));
}

int64_t checkpoint_read_plan_bytes(const struct graph *g, int64_t file_bytes)
{
    int64_t file, head, rest = read_rest_bytes(g, &file, &head);
    /* safetensors_open: the file whole */
    return (file_bytes < 0 ? file : file_bytes) + rest;
}

int64_t checkpoint_stream_plan_bytes(const struct graph *g)
{
    int64_t file, head, rest = read_rest_bytes(g, &file, &head);
    /* safetensors_open_stream: the header only */
    return head + rest;
}

int checkpoint_save(const char *path, struct exec *e, const struct graph *g,
                    const struct train_spec *spec, const char *spec_json, int64_t step,
                    char *err, size_t errlen)
{
    int rc = -1;
    struct safetensors_writer *w = NULL;
    char **names = calloc((size_t)g->n_params * 4 + 1, sizeof *names);
    struct ckpt_tensor *ts = calloc((size_t)g->n_params * 4 + 1, sizeof *ts);
    char *own = spec_json ? NULL : spec_to_json(spec);
    const char *json = spec_json ? spec_json : own;
    int n_names = 0;
    if (!ts || !names || !json || safetensors_writer_init(&w)) {
        snprintf(err, errlen, "out of memory saving %s", path);
        goto out;
    }
    /* each tensor is downloaded into the writer's one staging buffer as its turn comes: the
     * host holds the largest tensor, not the four copies of the model */
    for (int part = EXEC_PART_WEIGHT; part <= EXEC_PART_ADAM_V; part++) {
        for (int i = 0; i < g->n_tensors; i++) {
            const struct tensor *t = g->tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            size_t len = strlen(t->name) + 16;
            char *name = malloc(len);
            if (!name) { snprintf(err, errlen, "out of memory saving %s", path); goto out; }
            snprintf(name, len, "%s%s", part_prefix((enum exec_part)part), t->name);
            ts[n_names] = (struct ckpt_tensor){e, (enum exec_part)part, i};
            names[n_names] = name;
            int64_t shape[4];
            for (int k = 0; k < t->rank; k++) shape[k] = t->d[k];
            if (safetensors_writer_add_fill(w, name, ST_F32, t->rank, shape, ckpt_fill,
                                            &ts[n_names++])) {
                snprintf(err, errlen, "cannot collect %s for %s", name, path);
                goto out;
            }
        }
    }
    const struct plan *pl = exec_plan(e);
    char plan[256];
    snprintf(plan, sizeof plan,
             "{\"precision\":\"%s\",\"micro_batch\":%d,\"recompute\":\"%s\",\"offload\":\"%s\","
             "\"device_bytes\":%zu,\"host_bytes\":%zu}",
             planner_precision_name(pl->strategy.precision),
             pl->strategy.micro_batch > 0 ? pl->strategy.micro_batch : spec->batch,
             planner_recompute_name(pl->strategy.recompute), pl->strategy.offload == 1 ? "on" : "off",
             pl->total_bytes, pl->host_bytes);
    if (checkpoint_meta(w, spec, step, json, plan, g->precision,
                        g->precision == STRATEGY_PRECISION_F16 ? exec_loss_scaler(e) : NULL, err,
                        errlen))
        goto out;
    if (safetensors_writer_save(w, path, err, errlen)) goto out;
    rc = 0;
out:
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(ts);
    free(own);
    safetensors_writer_free(w);
    return rc;
}

static int open_ckpt(struct safetensors **out, const char *path, int stream,
                     struct train_spec *spec, int64_t *step, char *err, size_t errlen)
{
    struct safetensors *st = NULL;
    if ((stream ? safetensors_open_stream : safetensors_open)(&st, path, err, errlen)) return -1;
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
        /* digits only, within the run's length: "", "-1", "1e3", "7 " or a huge value would
         * otherwise become a wrong start step */
        const char *s = safetensors_meta(st, "step");
        int64_t max = spec ? spec->steps : INT_MAX, v = 0;
        if (!s && !spec) {
            *step = 0; /* an imported state_dict has no step */
        } else {
            int ok = s && *s && strlen(s) <= 19;
            for (const char *p = s; ok && *p; p++) {
                ok = *p >= '0' && *p <= '9' && v <= (INT64_MAX - (*p - '0')) / 10;
                if (ok) v = v * 10 + (*p - '0');
            }
            ok = ok && v <= max;
            if (!ok) {
                snprintf(err, errlen, "%s: bad step '%.40s' in its metadata (digits, at most %" PRId64
                         "%s)", path, s ? s : "(missing)", max, spec ? ", the spec's train.steps" : "");
                goto fail;
            }
            *step = v;
        }
    }
    *out = st;
    return 0;
fail:
    safetensors_free(st);
    return -1;
}

int checkpoint_open(struct safetensors **out, const char *path, struct train_spec *spec,
                    int64_t *step, char *err, size_t errlen)
{
    return open_ckpt(out, path, 0, spec, step, err, errlen);
}

int checkpoint_open_stream(struct safetensors **out, const char *path, struct train_spec *spec,
                           int64_t *step, char *err, size_t errlen)
{
    return open_ckpt(out, path, 1, spec, step, err, errlen);
}

/* an integer metadata value in [0, max]: digits only */
static int meta_int(const struct safetensors *st, const char *key, int64_t max, int64_t *v)
{
    const char *s = safetensors_meta(st, key);
    if (!s || !*s || strlen(s) > 19) return -1;
    int64_t x = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || x > (INT64_MAX - (*p - '0')) / 10) return -1;
        x = x * 10 + (*p - '0');
    }
    if (x > max) return -1;
    *v = x;
    return 0;
}

/* a resume keeps the run's precision, and in f16 continues with the saved loss scale state */
static int apply_run_state(const struct safetensors *st, struct exec *e, const struct graph *g,
                           char *err, size_t errlen)
{
    const char *prec = safetensors_meta(st, "precision");
    if (!prec) prec = "f32"; /* checkpoints from before 16-bit precision */
    const char *want = planner_precision_name(g->precision);
    if (strcmp(prec, want) != 0) {
        snprintf(err, errlen, "the checkpoint's run trained in %.8s, this one in %s: a resume "
                 "keeps its precision", prec, want);
        return -1;
    }
    if (g->precision != STRATEGY_PRECISION_F16) return 0;
    const char *s = safetensors_meta(st, "loss_scale");
    char *end = NULL;
    errno = 0;
    float scale = s ? strtof(s, &end) : 0.0f;
    int64_t good = 0, skipped = 0;
    if (!s || !*s || *end || errno || !(scale > 0.0f) || isinf(scale) ||
        meta_int(st, "loss_scale_good_steps", INT_MAX, &good) ||
        meta_int(st, "loss_scale_skipped", INT64_MAX, &skipped)) {
        snprintf(err, errlen, "an f16 checkpoint without a valid loss scale state (loss_scale "
                 "'%.24s', loss_scale_good_steps, loss_scale_skipped)", s ? s : "(missing)");
        return -1;
    }
    struct loss_scaler *ls = exec_loss_scaler(e);
    ls->scale = scale;
    ls->good_steps = (int)good;
    ls->skipped = skipped;
    return 0;
}

/* 0 when the file's tensor s is the F32 tensor of t's shape; else -1 and why in err */
static int tensor_check(const struct st_tensor *s, const struct tensor *t, const char *name,
                        char *err, size_t errlen)
{
    int same = s->dtype == ST_F32 && s->ndim == t->rank;
    for (int k = 0; same && k < t->rank; k++) same = s->shape[k] == t->d[k];
    if (same) return 0;
    char want_s[64] = "", got_s[64] = "";
    for (int k = 0; k < t->rank; k++)
        snprintf(want_s + strlen(want_s), sizeof want_s - strlen(want_s), "%s%d", k ? "," : "",
                 t->d[k]);
    for (int k = 0; k < s->ndim; k++)
        snprintf(got_s + strlen(got_s), sizeof got_s - strlen(got_s), "%s%" PRId64, k ? "," : "",
                 s->shape[k]);
    snprintf(err, errlen, "tensor '%s' is %s (%s), the model needs F32 (%s)", name,
             safetensors_dtype_name(s->dtype), got_s, want_s);
    return -1;
}

int checkpoint_apply(const struct safetensors *st, struct exec *e, const struct graph *g,
                     int parts, int from_ema, char *err, size_t errlen)
{
    if ((parts & CHECKPOINT_OPTIM) && apply_run_state(st, e, g, err, errlen)) return -1;
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
            if (tensor_check(s, t, name, err, errlen)) goto out;
            if (safetensors_read(st, s, buf, err, errlen)) goto out; /* a copy or a read */
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

int checkpoint_load_generator(struct generator *g, const struct safetensors *st, int from_ema,
                              char *err, size_t errlen)
{
    if (g->view) {
        snprintf(err, errlen, "a training job's sampling view reads its EMA: nothing to load");
        return -1;
    }
    return checkpoint_apply(st, g->e, &g->g, CHECKPOINT_WEIGHTS, from_ema, err, errlen);
}

int checkpoint_check_model(const struct safetensors *st, const struct unet_config *model,
                           char *err, size_t errlen)
{
    struct graph g;
    struct unet_io io;
    if (graph_init(&g)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    if (unet_build(&g, model, 1, &io)) {
        snprintf(err, errlen, "the model cannot be built: %s", g.err[0] ? g.err : "invalid config");
        goto out;
    }
    const struct st_tensor *any;
    int has_ema = 0;
    for (size_t i = 0; !has_ema && safetensors_get(st, i, &any) == ST_OK; i++)
        has_ema = strncmp(any->name, "ema.", 4) == 0;
    for (int pass = 0; pass <= has_ema; pass++)
        for (int i = 0; i < g.n_tensors; i++) {
            const struct tensor *t = g.tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            char name[512];
            const struct st_tensor *s;
            snprintf(name, sizeof name, "%s%s", pass ? "ema." : "", t->name);
            if (safetensors_find(st, name, &s)) {
                snprintf(err, errlen, "the model needs a tensor '%s' the file does not have", name);
                goto out;
            }
            if (tensor_check(s, t, name, err, errlen)) goto out;
        }
    rc = 0;
out:
    graph_free(&g);
    return rc;
}
