/* classifier.c - the quality classifier's graph (three conv/GroupNorm/GELU/max-pool stages and a
 * two-layer head), its configuration string, and a forward-only runner for inference.
 */
#include "classifier.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void classifier_config_default(struct classifier_config *c)
{
    memset(c, 0, sizeof *c);
    c->channels = 1;
    c->image_size = 32;
    c->widths[0] = 32;
    c->widths[1] = 64;
    c->widths[2] = 64;
    c->groups = 8;
    c->hidden = 128;
    c->classes = 10;
    c->dropout = 0.25f;
}

int classifier_config_check(const struct classifier_config *c, char *err, size_t errlen)
{
#define FAIL(...)                                                                              \
    do {                                                                                       \
        if (err && errlen) snprintf(err, errlen, __VA_ARGS__);                                 \
        return CLASSIFIER_ERR_CONFIG;                                                          \
    } while (0)
    if (!c) FAIL("no configuration");
    if (c->channels < 1 || c->channels > 4) FAIL("channels must be 1..4, not %d", c->channels);
    if (c->image_size < 8 || c->image_size > 1024 || c->image_size % 8)
        FAIL("image_size must be a multiple of 8 in [8, 1024], not %d", c->image_size);
    if (c->groups < 1) FAIL("groups must be >= 1, not %d", c->groups);
    for (int s = 0; s < CLASSIFIER_STAGES; s++)
        if (c->widths[s] < 1 || c->widths[s] > 4096 || c->widths[s] % c->groups)
            FAIL("widths[%d] = %d must be in [1, 4096] and divisible by groups (%d)", s,
                 c->widths[s], c->groups);
    if (c->hidden < 1 || c->hidden > 65536) FAIL("hidden must be in [1, 65536], not %d", c->hidden);
    if (c->classes < 2 || c->classes > 65536)
        FAIL("classes must be in [2, 65536], not %d", c->classes);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        FAIL("dropout must be in [0, 1), not %g", (double)c->dropout);
    return CLASSIFIER_OK;
#undef FAIL
}

int classifier_config_format(const struct classifier_config *c, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "channels=%d image_size=%d widths=%d,%d,%d groups=%d hidden=%d classes=%d "
                     "dropout=%.9g",
                     c->channels, c->image_size, c->widths[0], c->widths[1], c->widths[2],
                     c->groups, c->hidden, c->classes, (double)c->dropout);
    return n < 0 || (size_t)n >= len ? CLASSIFIER_ERR_ARG : CLASSIFIER_OK;
}

/* a decimal int at *p, advancing *p past it */
static int parse_int(const char **p, int *out)
{
    char *end;
    long v = strtol(*p, &end, 10);
    if (end == *p || v < -1000000000L || v > 1000000000L) return -1;
    *out = (int)v;
    *p = end;
    return 0;
}

int classifier_config_parse(struct classifier_config *c, const char *s, char *err, size_t errlen)
{
#define FAIL(...)                                                                              \
    do {                                                                                       \
        if (err && errlen) snprintf(err, errlen, __VA_ARGS__);                                 \
        return CLASSIFIER_ERR_CONFIG;                                                          \
    } while (0)
    if (!c || !s) FAIL("no configuration string");
    struct classifier_config r;
    memset(&r, 0, sizeof r);
    enum { K_CH, K_SIZE, K_W, K_G, K_H, K_CLS, K_DROP, K_N };
    static const char *keys[K_N] = {"channels", "image_size", "widths", "groups",
                                    "hidden",   "classes",    "dropout"};
    int seen[K_N] = {0};
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        const char *eq = strchr(p, '=');
        if (!eq) FAIL("classifier config: expected key=value at '%.32s'", p);
        size_t kl = (size_t)(eq - p);
        int k = -1;
        for (int i = 0; i < K_N; i++)
            if (strlen(keys[i]) == kl && strncmp(p, keys[i], kl) == 0) k = i;
        if (k < 0) FAIL("classifier config: unknown key '%.*s'", (int)kl, p);
        if (seen[k]++) FAIL("classifier config: '%s' given twice", keys[k]);
        p = eq + 1;
        int bad = 0;
        switch (k) {
        case K_CH: bad = parse_int(&p, &r.channels); break;
        case K_SIZE: bad = parse_int(&p, &r.image_size); break;
        case K_G: bad = parse_int(&p, &r.groups); break;
        case K_H: bad = parse_int(&p, &r.hidden); break;
        case K_CLS: bad = parse_int(&p, &r.classes); break;
        case K_W:
            for (int i = 0; i < CLASSIFIER_STAGES && !bad; i++) {
                bad = parse_int(&p, &r.widths[i]);
                if (!bad && i + 1 < CLASSIFIER_STAGES) bad = *p++ != ',';
            }
            break;
        case K_DROP: {
            char *end;
            r.dropout = strtof(p, &end);
            bad = end == p;
            p = end;
            break;
        }
        }
        if (bad || (*p && *p != ' ' && *p != '\t' && *p != '\n'))
            FAIL("classifier config: bad value for '%s'", keys[k]);
    }
    for (int i = 0; i < K_N; i++)
        if (!seen[i]) FAIL("classifier config: '%s' missing", keys[i]);
    int rc = classifier_config_check(&r, err, errlen);
    if (rc) return rc;
    *c = r;
    return CLASSIFIER_OK;
#undef FAIL
}

int classifier_describe(const struct classifier_config *c, char *buf, size_t len)
{
    int s = c->image_size, in = c->channels, off = 0;
    for (int i = 0; i < CLASSIFIER_STAGES; i++) {
        int n = snprintf(buf + off, len - (size_t)off,
                         "conv3x3 %d->%d @%dpx + maxpool2 + GroupNorm(%d) + GELU | ", in,
                         c->widths[i], s, c->groups);
        if (n < 0 || (size_t)(off + n) >= len) return CLASSIFIER_ERR_ARG;
        off += n;
        in = c->widths[i];
        s /= 2;
    }
    int flat = in * s * s;
    int n = snprintf(buf + off, len - (size_t)off,
                     "flatten %d | linear %d->%d + GELU + dropout(%g) | linear %d->%d | softmax",
                     flat, flat, c->hidden, (double)c->dropout, c->hidden, c->classes);
    return n < 0 || (size_t)(off + n) >= len ? CLASSIFIER_ERR_ARG : CLASSIFIER_OK;
}

/* ---- the graph ---- */

static int param(struct graph *g, const char *name, int rank, const int *dims,
                 enum param_init init, int fan_in, int fan_out)
{
    int id = graph_param(g, name, rank, dims);
    if (id >= 0) {
        g->tensors[id]->init = init;
        g->tensors[id]->fan_in = fan_in;
        g->tensors[id]->fan_out = fan_out;
    }
    return id;
}

static int linear(struct graph *g, const char *name, int x, int out)
{
    if (x < 0) return -1;
    char n[64];
    int in = g->tensors[x]->d[g->tensors[x]->rank - 1];
    int wd[2] = {out, in}, bd[1] = {out};
    snprintf(n, sizeof n, "%s.weight", name);
    int w = param(g, n, 2, wd, INIT_FAN_IN_UNIFORM, in, out);
    snprintf(n, sizeof n, "%s.bias", name);
    int b = param(g, n, 1, bd, INIT_FAN_IN_UNIFORM, in, 0);
    return graph_linear(g, x, w, b);
}

/* conv3x3 (no bias: the norm's shift replaces it), 2x2 max-pool, GroupNorm, GELU: pooling
 * first runs the norm and the activation (scalar erf) on a quarter of the elements */
static int stage(struct graph *g, int s, int x, int co, int groups)
{
    if (x < 0) return -1;
    char n[64];
    int ci = g->tensors[x]->d[1];
    int wd[4] = {co, ci, 3, 3}, cd[1] = {co};
    snprintf(n, sizeof n, "conv%d.weight", s + 1);
    int w = param(g, n, 4, wd, INIT_FAN_IN_UNIFORM, ci * 9, co * 9);
    snprintf(n, sizeof n, "norm%d.weight", s + 1);
    int gamma = param(g, n, 1, cd, INIT_ONES, 0, 0);
    snprintf(n, sizeof n, "norm%d.bias", s + 1);
    int beta = param(g, n, 1, cd, INIT_ZEROS, 0, 0);
    int y = graph_conv2d(g, x, w, -1, 1, 1, 1, 1, 1);
    y = graph_maxpool(g, y);
    y = graph_groupnorm(g, y, gamma, beta, groups, 1e-5f);
    return graph_gelu(g, y);
}

int classifier_build(struct graph *g, const struct classifier_config *c, int batch,
                     struct classifier_io *io)
{
    if (!g || !c || !io || batch < 1) return CLASSIFIER_ERR_ARG;
    if (classifier_config_check(c, g->err, sizeof g->err)) return CLASSIFIER_ERR_CONFIG;
    int xd[4] = {batch, c->channels, c->image_size, c->image_size};
    io->x = graph_input(g, "x", 4, xd);
    int y = io->x;
    for (int s = 0; s < CLASSIFIER_STAGES; s++) y = stage(g, s, y, c->widths[s], c->groups);
    int side = c->image_size >> CLASSIFIER_STAGES;
    int fd[2] = {batch, c->widths[CLASSIFIER_STAGES - 1] * side * side};
    y = graph_reshape(g, y, 2, fd);
    y = graph_gelu(g, linear(g, "fc1", y, c->hidden));
    y = graph_dropout(g, y, c->dropout);
    io->logits = linear(g, "fc2", y, c->classes);
    if (g->status || io->logits < 0) return CLASSIFIER_ERR_GRAPH;
    return CLASSIFIER_OK;
}

/* ---- forward-only runner ---- */

int classifier_runner_init(struct classifier_runner *r, const struct classifier_config *c,
                           int batch, const struct backend *bk, int threads, char *err,
                           size_t errlen)
{
    memset(r, 0, sizeof *r);
    int rc = classifier_config_check(c, err, errlen);
    if (rc) return rc;
    if (batch < 1 || !bk) {
        if (err && errlen) snprintf(err, errlen, "classifier runner: bad batch or backend");
        return CLASSIFIER_ERR_ARG;
    }
    r->cfg = *c;
    r->batch = batch;
    if (graph_init(&r->g)) {
        if (err && errlen) snprintf(err, errlen, "classifier: out of memory");
        rc = CLASSIFIER_ERR_NOMEM;
        goto fail;
    }
    rc = classifier_build(&r->g, c, batch, &r->io);
    if (rc) {
        if (err && errlen) snprintf(err, errlen, "classifier graph: %s", r->g.err);
        goto fail;
    }
    if (plan_make(&r->p, &r->g, bk, NULL)) {
        if (err && errlen) snprintf(err, errlen, "classifier: cannot plan the graph");
        rc = CLASSIFIER_ERR_EXEC;
        goto fail;
    }
    struct exec_opts eo = {.threads = threads > 0 ? threads : 1};
    r->logits = malloc((size_t)batch * (size_t)c->classes * sizeof *r->logits);
    if (!r->logits || exec_init(&r->e, &r->g, &r->p, bk, &eo)) {
        if (err && errlen)
            snprintf(err, errlen, "classifier: cannot allocate %zu bytes", r->p.total_bytes);
        rc = CLASSIFIER_ERR_NOMEM;
        goto fail;
    }
    return CLASSIFIER_OK;
fail:
    classifier_runner_free(r);
    return rc;
}

void classifier_runner_free(struct classifier_runner *r)
{
    if (!r) return;
    exec_free(r->e);
    plan_free(&r->p);
    graph_free(&r->g);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

int classifier_runner_set_param(struct classifier_runner *r, const char *name,
                                const float *data, size_t numel, char *err, size_t errlen)
{
    int id = name ? graph_find_param(&r->g, name) : -1;
    if (id < 0 || r->g.tensors[id]->numel != numel) {
        if (err && errlen)
            snprintf(err, errlen, "classifier: %s '%s' (%zu values)",
                     id < 0 ? "no parameter" : "wrong size for", name ? name : "(null)", numel);
        return CLASSIFIER_ERR_ARG;
    }
    return exec_upload(r->e, id, data) ? CLASSIFIER_ERR_EXEC : CLASSIFIER_OK;
}

int classifier_runner_predict(struct classifier_runner *r, const float *x, int n, float *prob)
{
    if (!r || !r->e || (n > 0 && (!x || !prob)) || n < 0) return CLASSIFIER_ERR_ARG;
    const struct tensor *tx = r->g.tensors[r->io.x];
    size_t per = tx->numel / (size_t)r->batch;
    int k = r->cfg.classes;
    float *chunk = NULL;
    for (int first = 0; first < n; first += r->batch) {
        int m = n - first < r->batch ? n - first : r->batch;
        const float *src = x + (size_t)first * per;
        if (m < r->batch) { /* the partial last chunk: zero rows after the m real ones */
            chunk = calloc(tx->numel, sizeof *chunk);
            if (!chunk) return CLASSIFIER_ERR_NOMEM;
            memcpy(chunk, src, (size_t)m * per * sizeof *chunk);
            src = chunk;
        }
        if (exec_upload(r->e, r->io.x, src) || exec_forward(r->e, NULL) ||
            exec_download(r->e, r->io.logits, r->logits)) {
            free(chunk);
            return CLASSIFIER_ERR_EXEC;
        }
        for (int i = 0; i < m; i++) {
            const float *z = r->logits + (size_t)i * k;
            float *p = prob + (size_t)(first + i) * k;
            double mx = z[0], sum = 0.0;
            for (int j = 1; j < k; j++) mx = z[j] > mx ? z[j] : mx;
            for (int j = 0; j < k; j++) sum += exp((double)z[j] - mx);
            for (int j = 0; j < k; j++) p[j] = (float)(exp((double)z[j] - mx) / sum);
        }
    }
    free(chunk);
    return CLASSIFIER_OK;
}
