/* spec.c - training spec JSON <-> struct train_spec through cJSON, with validation that names
 * each offending field by its path. Unknown fields are errors (a typo must not silently fall
 * back to a default); so are duplicate keys, trailing bytes, NUL characters and invalid UTF-8.
 * One table of value rules serves the parser and spec_validate (the CLI's options).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "spec.h"

#include <cjson/cJSON.h>
#include <sched.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fsio.h"
#include "dataset.h"
#include "train_step.h"
#include "upload.h"
#include "utf8.h"

/* how deep a spec may nest (it needs 3: root, section, list); bounds the audit's recursion */
#define SPEC_MAX_DEPTH 16
/* the most bytes of user text (a snippet, a key, an enum value) echoed in one message */
#define SPEC_ECHO_MAX 40

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

/* ---- echoing user text: valid UTF-8 kept, other bytes as \xNN, long text cut with "..." ---- */

/* n bytes of s as printable text in out: control bytes and invalid UTF-8 as \xNN, at most max
 * source bytes, then "..." */
static const char *echo(char *out, size_t outlen, const char *s, size_t n, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;
    out[0] = 0;
    while (i < n && i < max) {
        size_t k = p[i] >= 0x20 && p[i] != 0x7F ? utf8_len(p + i, n - i) : 0;
        if (k && o + k < outlen) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else if (!k && o + 4 < outlen) {
            snprintf(out + o, outlen - o, "\\x%02x", p[i]);
            o += 4;
            i++;
        } else {
            break;
        }
        out[o] = 0;
    }
    if (i < n && o + 3 < outlen) memcpy(out + o, "...", 4);
    return out;
}

static const char *join(char *buf, size_t n, const char *path, const char *key)
{
    char k[SPEC_ECHO_MAX * 4 + 4];
    echo(k, sizeof k, key, strlen(key), SPEC_ECHO_MAX);
    if (snprintf(buf, n, "%s%s%s", path, *path ? "." : "", k) >= (int)n && n > 4)
        memcpy(buf + n - 4, "...", 4);
    return buf;
}

/* the shortest "%g" text that reads back as x (as a double); integers below 2^53 in full */
static const char *fmt_num(char *buf, size_t n, double x)
{
    if (x == floor(x) && fabs(x) <= 9007199254740992.0) {
        snprintf(buf, n, "%.0f", x);
        return buf;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

/* the shortest "%g" text that reads back as f (as a float) */
static const char *fmt_float(char *buf, size_t n, float f)
{
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return buf;
}

/* a float as the double whose shortest text is the float's: canonical JSON writes 0.0002, not
 * 0.00019999999494757503, so the text also passes the range checks on the double */
static double json_float(float f)
{
    char buf[40];
    return strtod(fmt_float(buf, sizeof buf, f), NULL);
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

/* ---- the value rules: one table for the parser and spec_validate ---- */

enum rule_kind { RULE_INT, RULE_U64, RULE_FLOAT, RULE_DOUBLE };

#define RULE_DDPM 1 /* model fields: the presets a rule applies to (0: not a model field) */
#define RULE_SEED 2

struct rule {
    const char *path;
    enum rule_kind kind;
    size_t off; /* into struct train_spec */
    double min, max;
    int min_open; /* (min, max] instead of [min, max] */
    int presets;
};

#define R(path, kind, field, lo, hi, open, presets) \
    {path, kind, offsetof(struct train_spec, field), lo, hi, open, presets}
static const struct rule rules[] = {
    R("model.in_channels", RULE_INT, model.in_channels, 1, 4, 0, RULE_DDPM | RULE_SEED),
    R("model.out_channels", RULE_INT, model.out_channels, 1, 4, 0, RULE_DDPM | RULE_SEED),
    R("model.image_size", RULE_INT, model.image_size, 8, 1024, 0, RULE_DDPM | RULE_SEED),
    R("model.layers_per_block", RULE_INT, model.layers_per_block, 1, 8, 0, RULE_DDPM),
    R("model.norm_num_groups", RULE_INT, model.groups, 1, 1024, 0, RULE_DDPM),
    R("model.norm_eps", RULE_FLOAT, model.norm_eps, 0, 1, 1, RULE_DDPM),
    R("model.attention_head_dim", RULE_INT, model.attn_head_dim, 1, 4096, 0, RULE_DDPM),
    R("model.dropout", RULE_FLOAT, model.dropout, 0, 0.99, 0, RULE_DDPM),
    R("model.freq_shift", RULE_FLOAT, model.freq_shift, 0, 1, 0, RULE_DDPM),
    R("model.base", RULE_INT, model.base, 2, 1024, 0, RULE_SEED),
    R("model.time_dim", RULE_INT, model.time_dim, 2, 4096, 0, RULE_SEED),
    R("model.heads", RULE_INT, model.heads, 1, 64, 0, RULE_SEED),
    R("data.validation", RULE_INT, validation, 0, 100000, 0, 0),
    R("diffusion.timesteps", RULE_INT, timesteps, 2, 100000, 0, 0),
    R("diffusion.beta_start", RULE_DOUBLE, beta_start, 0, 1, 1, 0),
    R("diffusion.beta_end", RULE_DOUBLE, beta_end, 0, 1, 1, 0),
    R("train.batch", RULE_INT, batch, 1, SPEC_BATCH_MAX, 0, 0),
    R("train.steps", RULE_INT, steps, 1, 100000000, 0, 0),
    R("train.lr", RULE_FLOAT, optim.lr, 0, 1, 1, 0),
    R("train.warmup", RULE_INT, optim.warmup, 0, 100000000, 0, 0),
    R("train.beta1", RULE_FLOAT, optim.beta1, 0, 0.999999, 0, 0),
    /* 0.9999999 is 0.99999988 as a float; anything that rounds to 1.0f would zero Adam's bias
     * correction */
    R("train.beta2", RULE_FLOAT, optim.beta2, 0, 0.9999999, 0, 0),
    R("train.eps", RULE_FLOAT, optim.eps, 0, 1, 1, 0),
    R("train.weight_decay", RULE_FLOAT, optim.weight_decay, 0, 10, 0, 0),
    R("train.clip", RULE_FLOAT, optim.clip, 0, 1e6, 0, 0),
    R("train.ema_decay", RULE_FLOAT, optim.ema_decay, 0, 0.999999, 0, 0),
    R("train.seed", RULE_U64, seed, 0, (double)SPEC_SEED_MAX, 0, 0),
    /* 0: not named - the job's cores are decided when it first starts (spec.h) */
    R("train.threads", RULE_INT, threads, 0, SPEC_THREADS_MAX, 0, 0),
    R("output.checkpoint_every", RULE_INT, checkpoint_every, 0, 100000000, 0, 0),
    R("output.sample_every", RULE_INT, sample_every, 0, 100000000, 0, 0),
    R("output.log_every", RULE_INT, log_every, 1, 100000000, 0, 0),
    R("output.keep_last", RULE_INT, keep_last, 1, 1000, 0, 0),
    R("output.samples", RULE_INT, samples, 1, 1024, 0, 0),
    R("memory.micro_batch", RULE_INT, strategy.micro_batch, 0, SPEC_BATCH_MAX, 0, 0),
    R("memory.loss_scale.initial", RULE_FLOAT, strategy.loss_scale.initial, 1, 16777216, 0, 0),
    R("memory.loss_scale.growth", RULE_FLOAT, strategy.loss_scale.growth, 1, 1000, 1, 0),
    R("memory.loss_scale.backoff", RULE_FLOAT, strategy.loss_scale.backoff, 0, 0.99, 1, 0),
    R("memory.loss_scale.growth_interval", RULE_INT, strategy.loss_scale.growth_interval, 1,
      100000000, 0, 0),
};
#undef R

static const struct rule *rule_find(const char *path)
{
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (strcmp(rules[i].path, path) == 0) return &rules[i];
    return NULL;
}

/* whether v (the value as stored: a float rule's v is a float) satisfies r; a float's bounds are
 * themselves rounded to float, and an open lower bound of 0 means at least the smallest normal
 * float (a subnormal step size or epsilon is flushed to 0 by FTZ arithmetic) */
static int rule_ok(const struct rule *r, double v, int as_float)
{
    double lo = r->min, hi = r->max;
    if (!isfinite(v)) return 0;
    if (as_float) {
        lo = (float)lo;
        hi = (float)hi;
        if (r->min_open && lo == 0 && v < FLT_MIN) return 0;
    }
    return v >= lo && v <= hi && !(r->min_open && v <= lo);
}

static const char *rule_range(char *buf, size_t n, const struct rule *r)
{
    char lo[40], hi[40];
    snprintf(buf, n, "%s%s, %s]", r->min_open ? "(" : "[", fmt_num(lo, sizeof lo, r->min),
             fmt_num(hi, sizeof hi, r->max));
    return buf;
}

static void rule_fail(struct spec_errors *E, const struct rule *r, const char *path, double v,
                      const char *note)
{
    char range[100], got[40];
    err(E, path, "must be in %s, got %s%s", rule_range(range, sizeof range, r),
        fmt_num(got, sizeof got, v), note);
}

/* the value a rule's field holds in s, as a double */
static double rule_get(const struct rule *r, const struct train_spec *s)
{
    const char *p = (const char *)s + r->off;
    int i;
    uint64_t u;
    float f;
    double d;
    switch (r->kind) {
    case RULE_INT: memcpy(&i, p, sizeof i); return i;
    case RULE_U64: memcpy(&u, p, sizeof u); return (double)u;
    case RULE_FLOAT: memcpy(&f, p, sizeof f); return f;
    case RULE_DOUBLE: memcpy(&d, p, sizeof d); return d;
    }
    return NAN;
}

/* checks one stored value; a seed is checked as an integer (its double could round) */
static void rule_check(struct spec_errors *E, const struct rule *r, const struct train_spec *s)
{
    if (r->kind == RULE_U64) {
        uint64_t u;
        memcpy(&u, (const char *)s + r->off, sizeof u);
        if (u > SPEC_SEED_MAX)
            err(E, r->path, "must be in [0, %llu] (2^53 - 1: JSON numbers above it are not "
                            "exact), got %llu",
                (unsigned long long)SPEC_SEED_MAX, (unsigned long long)u);
        return;
    }
    double v = rule_get(r, s);
    if (!rule_ok(r, v, r->kind == RULE_FLOAT))
        rule_fail(E, r, r->path, v,
                  r->kind == RULE_FLOAT && v > 0 && v < FLT_MIN
                      ? " (below the smallest normal 32-bit float)"
                      : r->kind == RULE_FLOAT ? " (as a 32-bit float)" : "");
}

/* ---- reading a document ---- */

struct spec_issue {
    int index;     /* of the string token (keys and values, in document order) */
    size_t offset; /* byte of the problem */
    unsigned char byte;
    int kind;      /* ISSUE_* */
};
enum { ISSUE_NUL, ISSUE_CONTROL, ISSUE_UTF8 };

struct spec_ctx {
    struct spec_errors *E;
    struct spec_issue issues[SPEC_MAX_ERRORS];
    int n_issues, next_issue, n_strings;
    int failed_alloc;
};

/* What cJSON lets through inside strings: \u0000 (decoded to a NUL that cuts the C string, so
 * "a\u0000x" would read as "a"), raw control bytes (RFC 8259 forbids them) and invalid UTF-8.
 * The text has parsed as JSON, so its string tokens are exactly cJSON's strings, in order. */
static void scan_strings(struct spec_ctx *c, const char *text, size_t n)
{
    const unsigned char *p = (const unsigned char *)text;
    int in = 0, flagged = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in) {
            if (p[i] == '"') {
                in = 1;
                flagged = 0;
                c->n_strings++;
            }
            continue;
        }
        int kind = -1;
        if (p[i] == '"') {
            in = 0;
            continue;
        } else if (p[i] == '\\') {
            if (i + 5 < n && p[i + 1] == 'u' && !memcmp(p + i + 2, "0000", 4)) kind = ISSUE_NUL;
            i++; /* the escaped character ("\\\\u0000" is a backslash, then u0000) */
        } else if (p[i] < 0x20) {
            kind = ISSUE_CONTROL;
        } else if (p[i] >= 0x80) {
            size_t k = utf8_len(p + i, n - i);
            if (k)
                i += k - 1;
            else
                kind = ISSUE_UTF8;
        }
        if (kind >= 0 && !flagged && c->n_issues < SPEC_MAX_ERRORS) {
            c->issues[c->n_issues++] =
                (struct spec_issue){c->n_strings - 1, kind == ISSUE_NUL ? i - 1 : i, p[i], kind};
            flagged = 1;
        }
    }
}

/* the next string token: reports its issue under path */
static void audit_string(struct spec_ctx *c, const char *path, const char *what)
{
    int idx = c->n_strings++;
    if (c->next_issue >= c->n_issues || c->issues[c->next_issue].index != idx) return;
    const struct spec_issue *is = &c->issues[c->next_issue++];
    if (is->kind == ISSUE_NUL)
        err(c->E, path, "%s contains a \\u0000 escape at byte %zu (NUL characters are not "
                        "allowed)", what, is->offset);
    else if (is->kind == ISSUE_CONTROL)
        err(c->E, path, "%s contains the raw control byte \\x%02x at byte %zu (JSON requires it "
                        "escaped)", what, is->byte, is->offset);
    else
        err(c->E, path, "%s is not valid UTF-8 (byte \\x%02x at byte %zu)", what, is->byte,
            is->offset);
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* the string tokens (keys and string values) under node, node included (cJSON bounds the
 * depth of this recursion at CJSON_NESTING_LIMIT) */
static int count_strings(const cJSON *node)
{
    int n = cJSON_IsString(node) ? 1 : 0;
    const cJSON *x;
    if (cJSON_IsArray(node) || cJSON_IsObject(node))
        cJSON_ArrayForEach(x, node) n += (cJSON_IsObject(node) ? 1 : 0) + count_strings(x);
    return n;
}

/* walks the tree in document order: string issues by path, duplicate keys (cJSON keeps both
 * and item lookups see only the first, so the second would never be validated), depth */
static void audit(struct spec_ctx *c, const cJSON *node, const char *path, int depth)
{
    char sub[sizeof c->E->e[0].path];
    const cJSON *x;
    if (depth > SPEC_MAX_DEPTH) {
        err(c->E, path, "nested deeper than %d levels", SPEC_MAX_DEPTH);
        /* skip the subtree's strings so later issues keep their paths */
        c->n_strings += count_strings(node);
        while (c->next_issue < c->n_issues && c->issues[c->next_issue].index < c->n_strings)
            c->next_issue++;
        return;
    }
    if (cJSON_IsString(node)) {
        audit_string(c, path, "the string");
        return;
    }
    if (cJSON_IsArray(node)) {
        int i = 0;
        cJSON_ArrayForEach(x, node)
        {
            snprintf(sub, sizeof sub, "%s[%d]", path, i++);
            audit(c, x, sub, depth + 1);
        }
        return;
    }
    if (!cJSON_IsObject(node)) return;
    size_t n = 0, k = 0;
    cJSON_ArrayForEach(x, node) n++;
    cJSON_ArrayForEach(x, node)
    {
        join(sub, sizeof sub, path, x->string);
        audit_string(c, sub, "the field name");
        audit(c, x, sub, depth + 1);
    }
    if (n < 2) return;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) {
        c->failed_alloc = 1;
        err(c->E, path, "out of memory checking %zu keys", n);
        return;
    }
    cJSON_ArrayForEach(x, node) keys[k++] = x->string;
    qsort(keys, n, sizeof *keys, key_cmp);
    for (k = 1; k < n; k++)
        if (strcmp(keys[k - 1], keys[k]) == 0 && (k < 2 || strcmp(keys[k - 2], keys[k]) != 0))
            err(c->E, join(sub, sizeof sub, path, keys[k]), "duplicate key (given more than once)");
    free(keys);
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

/* an optional number under its rule (path.key); absent or invalid keeps the stored value, so
 * spec_validate never reports it a second time */
static void get_rule(struct spec_errors *E, const cJSON *obj, const char *path, const char *key,
                     struct train_spec *s)
{
    const cJSON *v = item(obj, key);
    char buf[128], got[40], fl[40], note[120];
    if (!v) return;
    join(buf, sizeof buf, path, key);
    const struct rule *r = rule_find(buf);
    if (!r) { /* a programmer error: every numeric key has a rule */
        err(E, buf, "internal error: no rule");
        return;
    }
    int integer = r->kind == RULE_INT || r->kind == RULE_U64;
    if (!cJSON_IsNumber(v)) {
        err(E, buf, "expected %s, got %s", integer ? "an integer" : "a number", type_name(v));
        return;
    }
    double x = v->valuedouble;
    if (integer && !(x == floor(x))) {
        err(E, buf, "expected an integer, got %s", fmt_num(got, sizeof got, x));
        return;
    }
    if (!rule_ok(r, x, 0)) {
        rule_fail(E, r, buf, x,
                  integer && fabs(x) >= 9007199254740992.0
                      ? " (integers above 2^53 are rounded in JSON)" : "");
        return;
    }
    char *p = (char *)s + r->off;
    if (r->kind == RULE_INT) {
        int i = (int)x;
        memcpy(p, &i, sizeof i);
    } else if (r->kind == RULE_U64) {
        uint64_t u = (uint64_t)x;
        memcpy(p, &u, sizeof u);
    } else if (r->kind == RULE_DOUBLE) {
        memcpy(p, &x, sizeof x);
    } else {
        float f = (float)x; /* the value training uses: check that, not the double */
        if (!rule_ok(r, f, 1)) {
            if (f != 0 && fabsf(f) < FLT_MIN)
                snprintf(note, sizeof note, ", below the smallest normal 32-bit float (%s)",
                         fmt_float(fl, sizeof fl, FLT_MIN));
            else
                snprintf(note, sizeof note, ", which is %s as a 32-bit float",
                         fmt_float(fl, sizeof fl, f));
            rule_fail(E, r, buf, x, note);
            return;
        }
        memcpy(p, &f, sizeof f);
    }
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
    char buf[128], list[200] = "", got[SPEC_ECHO_MAX * 4 + 8];
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
    if (cJSON_IsString(v))
        err(E, buf, "must be one of %s, got \"%s\"", list,
            echo(got, sizeof got, v->valuestring, strlen(v->valuestring), SPEC_ECHO_MAX));
    else
        err(E, buf, "must be one of %s, got %s", list, type_name(v));
}

static int get_int_list(struct spec_errors *E, const cJSON *obj, const char *path,
                        const char *key, int *dst, int max)
{
    const cJSON *v = item(obj, key), *x;
    char buf[128], ebuf[160], got[40];
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
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble)) {
            err(E, ebuf, "expected an integer, got %s",
                cJSON_IsNumber(x) ? fmt_num(got, sizeof got, x->valuedouble) : type_name(x));
            return -1;
        }
        if (x->valuedouble < 1 || x->valuedouble > SPEC_MAX_LIST_VALUE) {
            err(E, ebuf, "must be in [1, %d], got %s", SPEC_MAX_LIST_VALUE,
                fmt_num(got, sizeof got, x->valuedouble));
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

/* a string field into a fixed buffer */
static void get_string(struct spec_errors *E, const cJSON *v, const char *path, char *dst,
                       size_t cap)
{
    if (!cJSON_IsString(v) || !v->valuestring[0])
        err(E, path, "expected a non-empty string, got %s",
            cJSON_IsString(v) ? "\"\"" : type_name(v));
    else if (strlen(v->valuestring) >= cap)
        err(E, path, "longer than %zu bytes (%zu)", cap - 1, strlen(v->valuestring));
    else
        snprintf(dst, cap, "%s", v->valuestring);
}

static void parse_model(struct spec_errors *E, const cJSON *m, struct train_spec *s)
{
    static const char *presets[] = {"ddpm", "seed", NULL};
    struct unet_config *c = &s->model;
    int preset = -1;
    const cJSON *p = item(m, "preset");
    if (!p) {
        err(E, "model.preset", "required (\"ddpm\" or \"seed\")");
        return;
    }
    get_enum(E, m, "model", "preset", presets, &preset);
    if (preset < 0) return;
    unet_config_default(c, (enum unet_preset)preset);
    get_rule(E, m, "model", "in_channels", s);
    c->out_channels = c->in_channels;
    get_rule(E, m, "model", "out_channels", s);
    get_rule(E, m, "model", "image_size", s);
    if (preset == UNET_DDPM) {
        static const char *keys[] = {"preset", "in_channels", "out_channels", "image_size",
                                     "block_out_channels", "layers_per_block",
                                     "attention_resolutions", "norm_num_groups", "norm_eps",
                                     "attention_head_dim", "dropout", "flip_sin_to_cos",
                                     "freq_shift", NULL};
        check_keys(E, m, "model", keys);
        int n = get_int_list(E, m, "model", "block_out_channels", c->channels, UNET_MAX_LEVELS);
        if (n == 0) err(E, "model.block_out_channels", "needs at least one level");
        if (n > 0) c->n_levels = n;
        get_rule(E, m, "model", "layers_per_block", s);
        n = get_int_list(E, m, "model", "attention_resolutions", c->attn_res, UNET_MAX_LEVELS);
        if (n >= 0) c->n_attn = n;
        if (!item(m, "attention_resolutions")) {
            /* the default ([16]) where the model has such a level; a given list must match
             * (check_work), the default need not */
            int kept = 0;
            for (int i = 0; i < c->n_attn; i++) {
                int k = 0;
                while (k < c->n_levels && k < 31 && (c->image_size >> k) != c->attn_res[i]) k++;
                if (k < c->n_levels && k < 31) c->attn_res[kept++] = c->attn_res[i];
            }
            c->n_attn = kept;
        }
        get_rule(E, m, "model", "norm_num_groups", s);
        get_rule(E, m, "model", "norm_eps", s);
        const cJSON *hd = item(m, "attention_head_dim");
        if (hd && cJSON_IsNull(hd))
            c->attn_head_dim = 0;
        else
            get_rule(E, m, "model", "attention_head_dim", s);
        get_rule(E, m, "model", "dropout", s);
        get_bool(E, m, "model", "flip_sin_to_cos", &c->flip_sin_to_cos);
        get_rule(E, m, "model", "freq_shift", s);
    } else {
        static const char *keys[] = {"preset", "in_channels", "out_channels", "image_size",
                                     "base", "time_dim", "heads", NULL};
        check_keys(E, m, "model", keys);
        get_rule(E, m, "model", "base", s);
        get_rule(E, m, "model", "time_dim", s);
        get_rule(E, m, "model", "heads", s);
    }
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
    s->threads = 0;
    s->checkpoint_every = 1000;
    s->sample_every = 1000;
    s->log_every = 50;
    s->keep_last = 3;
    s->samples = 16;
    s->vram_budget = 0;
    s->strategy = strategy_auto();
}

int spec_parse_size(const char *s, int64_t *bytes)
{
    /* digits, an optional fraction, a unit: no sign, exponent, hex, "inf" or spaces, which
     * strtod would take */
    size_t d = strspn(s, "0123456789");
    size_t f = s[d] == '.' ? 1 + strspn(s + d + 1, "0123456789") : 0;
    if (d == 0 || f == 1 || d + f > 40) return -1;
    char num[48], *end;
    memcpy(num, s, d + f);
    num[d + f] = 0;
    double v = strtod(num, &end);
    if (*end) return -1;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},           {"B", 1},          {"KiB", 1024.0},     {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                 {"GB", 1e9},       {"TB", 1e12},      {"K", 1024.0},       {"M", 1048576.0},
                 {"G", 1073741824.0}};
    /* the unit in any case ("1gb" is 1GB): a size is never meant in bits */
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(s + d + f, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (!(b <= 9.0e18)) return -1;
            *bytes = (int64_t)b;
            return 0;
        }
    return -1;
}

/* memory.vram_budget: bytes as an integer, or a size string ("4GiB", "512MiB"); 0 or null: none */
static void get_budget(struct spec_errors *E, const cJSON *mem, struct train_spec *s)
{
    const cJSON *v = item(mem, "vram_budget");
    char got[SPEC_ECHO_MAX * 4 + 8];
    int64_t b = -1;
    if (!v || cJSON_IsNull(v)) return;
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (x >= 0 && x <= (double)SPEC_BUDGET_MAX && x == floor(x)) b = (int64_t)x;
        else err(E, "memory.vram_budget", "must be an integer in [0, %lld] bytes, got %s",
                 (long long)SPEC_BUDGET_MAX, fmt_num(got, sizeof got, x));
    } else if (cJSON_IsString(v)) {
        /* digits, an optional fraction, a unit (the schema's pattern; spec_parse_size takes
         * nothing else) */
        const char *t = v->valuestring;
        if (spec_parse_size(t, &b) || b < 0 || b > SPEC_BUDGET_MAX) {
            err(E, "memory.vram_budget", "expected a size such as \"4GiB\" or \"512MiB\" (at "
                "most 1 PiB), got \"%s\"",
                echo(got, sizeof got, v->valuestring, strlen(v->valuestring), SPEC_ECHO_MAX));
            b = -1;
        }
    } else {
        err(E, "memory.vram_budget", "expected bytes or a size string, got %s", type_name(v));
    }
    if (b >= 0) s->vram_budget = b;
}

static void parse_memory(struct spec_errors *E, const cJSON *mem, struct train_spec *s)
{
    static const char *keys[] = {"vram_budget", "precision", "allow_16bit", "micro_batch",
                                 "recompute", "offload", "loss_scale", "deterministic", NULL};
    static const char *prec[] = {"auto", "f32", "bf16", "f16", NULL};
    static const char *rec[] = {"auto", "none", "attention", "resblock", "level", NULL};
    static const char *off[] = {"auto", "off", "on", NULL};
    check_keys(E, mem, "memory", keys);
    get_budget(E, mem, s);
    get_bool(E, mem, "memory", "deterministic", &s->deterministic);
    /* the enums' indices are the strategy values + 1 (auto = -1) */
    int p = s->strategy.precision + 1, r = s->strategy.recompute + 1, o = s->strategy.offload + 1;
    get_enum(E, mem, "memory", "precision", prec, &p);
    get_enum(E, mem, "memory", "recompute", rec, &r);
    get_enum(E, mem, "memory", "offload", off, &o);
    s->strategy.precision = p - 1;
    get_bool(E, mem, "memory", "allow_16bit", &s->strategy.allow_half);
    s->strategy.recompute = r - 1;
    s->strategy.offload = o - 1;
    const cJSON *mb = item(mem, "micro_batch");
    if (mb && cJSON_IsString(mb) && strcmp(mb->valuestring, "auto") == 0)
        s->strategy.micro_batch = 0;
    else
        get_rule(E, mem, "memory", "micro_batch", s);
    const cJSON *ls = item(mem, "loss_scale");
    if (ls && !cJSON_IsObject(ls)) {
        err(E, "memory.loss_scale", "expected an object, got %s", type_name(ls));
    } else if (ls) {
        static const char *lk[] = {"initial", "growth", "backoff", "growth_interval", NULL};
        check_keys(E, ls, "memory.loss_scale", lk);
        for (const char *const *k = lk; *k; k++) get_rule(E, ls, "memory.loss_scale", *k, s);
    }
}

static void check_flag(struct spec_errors *E, const char *path, int v, int lo, int hi)
{
    if (v < lo || v > hi) err(E, path, "must be in [%d, %d], got %d", lo, hi, v);
}

static void check_text(struct spec_errors *E, const char *path, const char *s, size_t cap)
{
    if (!memchr(s, 0, cap)) err(E, path, "not terminated within %zu bytes", cap);
}

/* every value check; appends to E */
static const char *fmt_bytes(char *buf, size_t n, int64_t b)
{
    if (b >= (int64_t)1 << 30)
        snprintf(buf, n, "%" PRId64 " bytes (%.1f GiB)", b, (double)b / (double)((int64_t)1 << 30));
    else
        snprintf(buf, n, "%" PRId64 " bytes (%.1f MiB)", b, (double)b / (1 << 20));
    return buf;
}

/* parameters of a ddpm resnet from cin to cout channels (diffusers' ResnetBlock2D) */
static int64_t resnet_params(int64_t cin, int64_t cout, int64_t temb)
{
    return 9 * cin * cout + 9 * cout * cout + temb * cout + (cin != cout ? cin * cout : 0) +
           4 * (cin + cout) + 3 * cout;
}

/* SPEC_*_MAX above, on a model unet_config_check accepted (widths and sizes in range) */
static void check_work(const struct train_spec *s, struct spec_errors *E)
{
    const struct unet_config *c = &s->model;
    const int64_t S = c->image_size, C = c->in_channels;
    char path[64], b1[64], b2[64];
    /* the batch's host buffers */
    int64_t batch_bytes = 6 * (int64_t)s->batch * C * S * S * (int64_t)sizeof(float);
    if (batch_bytes > SPEC_BATCH_BYTES_MAX)
        err(E, "train.batch", "a batch of %d images of %dx%dx%d holds %s of host buffers, more "
            "than the limit of %s", s->batch, c->in_channels, c->image_size, c->image_size,
            fmt_bytes(b1, sizeof b1, batch_bytes), fmt_bytes(b2, sizeof b2, SPEC_BATCH_BYTES_MAX));
    int64_t attn_tokens[UNET_MAX_LEVELS + 1];
    int n_tok = 0;
    if (c->preset == UNET_DDPM) {
        const int L = c->n_levels;
        int64_t res[UNET_MAX_LEVELS] = {0}, params = 0, temb = 4 * (int64_t)c->channels[0];
        for (int k = 0; k < L; k++) res[k] = S >> k;
        /* every attention resolution names a level: another one would build no attention */
        for (int i = 0; i < c->n_attn; i++) {
            int k = 0;
            while (k < L && res[k] != c->attn_res[i]) k++;
            snprintf(path, sizeof path, "model.attention_resolutions[%d]", i);
            if (k == L) {
                char lv[128] = "";
                size_t at = 0;
                for (int j = 0; j < L && at < sizeof lv - 16; j++)
                    at += (size_t)snprintf(lv + at, sizeof lv - at, "%s%" PRId64, j ? ", " : "",
                                           res[j]);
                err(E, path, "%d matches no level: the levels are at %s pixels", c->attn_res[i],
                    lv);
            } else if (res[k] * res[k] > SPEC_ATTN_TOKENS_MAX) {
                err(E, path, "attention at %" PRId64 "x%" PRId64 " pixels attends over %" PRId64
                    " tokens, more than %d (its scores are their square): use a lower resolution",
                    res[k], res[k], res[k] * res[k], SPEC_ATTN_TOKENS_MAX);
            }
        }
        /* the middle block always attends, at the lowest resolution */
        attn_tokens[n_tok++] = res[L - 1] * res[L - 1];
        for (int k = 0; k < L; k++) {
            int64_t ch = c->channels[k], bytes = ch * res[k] * res[k] * (int64_t)sizeof(float);
            snprintf(path, sizeof path, "model.block_out_channels[%d]", k);
            if (bytes > SPEC_LEVEL_BYTES_MAX)
                err(E, path, "one image's activation at level %d (%" PRId64 " channels of %" PRId64
                    "x%" PRId64 ") is %s, more than the limit of %s", k, ch, res[k], res[k],
                    fmt_bytes(b1, sizeof b1, bytes), fmt_bytes(b2, sizeof b2, SPEC_LEVEL_BYTES_MAX));
            int64_t prev = k ? c->channels[k - 1] : c->channels[0];
            params += resnet_params(prev, ch, temb) +
                      (c->layers_per_block - 1) * resnet_params(ch, ch, temb);
            params += (c->layers_per_block + 1) * resnet_params(2 * ch, ch, temb);
            if (k < L - 1) params += 2 * 9 * ch * ch;
        }
        int64_t top = c->channels[L - 1];
        params += 2 * resnet_params(top, top, temb) + 4 * top * top;
        if (params > SPEC_PARAMS_MAX)
            err(E, "model.block_out_channels", "the model has about %" PRId64 " parameters, more "
                "than the limit of %" PRId64, params, SPEC_PARAMS_MAX);
    } else {
        /* the seed UNet attends at S/2, S/4 and S/8 */
        attn_tokens[n_tok++] = (S / 2) * (S / 2);
    }
    if (attn_tokens[0] > SPEC_ATTN_TOKENS_MAX)
        err(E, c->preset == UNET_DDPM ? "model.block_out_channels" : "model.image_size",
            "the %s attention works at %" PRId64 " tokens, more than %d (its scores are their "
            "square): %s", c->preset == UNET_DDPM ? "middle block's" : "first",
            attn_tokens[0], SPEC_ATTN_TOKENS_MAX,
            c->preset == UNET_DDPM ? "add levels, so the lowest resolution is at most 128 pixels"
                                   : "the seed preset takes images of at most 256 pixels");
}

static void validate(const struct train_spec *s, struct spec_errors *E)
{
    const struct unet_config *c = &s->model;
    int n0 = E->n, preset = c->preset == UNET_DDPM ? RULE_DDPM : RULE_SEED;
    char path[64];
    if (c->preset != UNET_DDPM && c->preset != UNET_SEED) {
        err(E, "model.preset", "must be ddpm (0) or seed (1), got %d", (int)c->preset);
        preset = 0;
    }
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const struct rule *r = &rules[i];
        if (r->presets && !(r->presets & preset)) continue;
        if (r->off == offsetof(struct train_spec, model.attn_head_dim) && c->attn_head_dim == 0)
            continue; /* 0: one head over all channels (JSON null) */
        rule_check(E, r, s);
    }
    if (preset == RULE_DDPM) {
        if (c->n_levels < 1 || c->n_levels > UNET_MAX_LEVELS)
            err(E, "model.block_out_channels", "must have 1 to %d levels, got %d",
                UNET_MAX_LEVELS, c->n_levels);
        else
            for (int k = 0; k < c->n_levels; k++)
                if (c->channels[k] < 1 || c->channels[k] > SPEC_MAX_LIST_VALUE) {
                    snprintf(path, sizeof path, "model.block_out_channels[%d]", k);
                    err(E, path, "must be in [1, %d], got %d", SPEC_MAX_LIST_VALUE,
                        c->channels[k]);
                }
        if (c->n_attn < 0 || c->n_attn > UNET_MAX_LEVELS)
            err(E, "model.attention_resolutions", "must have 0 to %d entries, got %d",
                UNET_MAX_LEVELS, c->n_attn);
        else
            for (int k = 0; k < c->n_attn; k++)
                if (c->attn_res[k] < 1 || c->attn_res[k] > SPEC_MAX_LIST_VALUE) {
                    snprintf(path, sizeof path, "model.attention_resolutions[%d]", k);
                    err(E, path, "must be in [1, %d], got %d", SPEC_MAX_LIST_VALUE,
                        c->attn_res[k]);
                }
        check_flag(E, "model.flip_sin_to_cos", c->flip_sin_to_cos, 0, 1);
    }
    check_flag(E, "model.attn_tiled", c->attn_tiled, -1, 1);
    check_flag(E, "data.flip", s->flip, 0, 1);
    check_flag(E, "data.fmnist_resize", s->fmnist_resize, 0, 1);
    check_flag(E, "diffusion.beta_schedule", (int)s->beta_schedule, 0, 1);
    check_flag(E, "diffusion.prediction", (int)s->prediction, 0, 1);
    check_flag(E, "train.lr_schedule", s->optim.cosine, 0, 1);
    check_text(E, "data.dataset", s->dataset, sizeof s->dataset);
    check_text(E, "init_from", s->init_from, sizeof s->init_from);
    check_flag(E, "memory.precision", s->strategy.precision, STRATEGY_PRECISION_AUTO,
               STRATEGY_PRECISION_F16);
    check_flag(E, "memory.recompute", s->strategy.recompute, STRATEGY_RECOMPUTE_AUTO,
               STRATEGY_RECOMPUTE_LEVEL);
    check_flag(E, "memory.offload", s->strategy.offload, -1, 1);
    check_flag(E, "memory.allow_16bit", s->strategy.allow_half, 0, 1);
    check_flag(E, "memory.deterministic", s->deterministic, 0, 1);
    if (s->vram_budget < 0 || s->vram_budget > SPEC_BUDGET_MAX)
        err(E, "memory.vram_budget", "must be in [0, %lld] bytes (0: no limit), got %lld",
            (long long)SPEC_BUDGET_MAX, (long long)s->vram_budget);

    /* cross-field rules, on values that passed their own checks (unet_config_check divides by
     * groups and heads) */
    if (E->n > n0) return;
    if (s->strategy.micro_batch > s->batch)
        err(E, "memory.micro_batch", "must be at most train.batch (%d), got %d", s->batch,
            s->strategy.micro_batch);
    if (s->beta_end < s->beta_start) {
        char b[40];
        err(E, "diffusion.beta_end", "must be >= beta_start (%s)",
            fmt_num(b, sizeof b, s->beta_start));
    }
    if (strcmp(s->dataset, "fashion-mnist") == 0) {
        if (c->in_channels != 1 && c->in_channels != 3)
            err(E, "model.in_channels", "fashion-mnist gives 1 channel (grey) or 3 (grey as RGB)");
        if (!s->fmnist_resize && c->image_size != 28 && c->image_size != 32)
            err(E, "model.image_size", "fashion-mnist is 28x28: use 28 or 32 (padded), or "
                                       "data.fmnist_resize \"resize\"");
    }
    if (E->n > n0) return;
    if (c->out_channels != c->in_channels)
        err(E, "model.out_channels", "must equal in_channels: the model predicts noise");
    char msg[200];
    if (E->n == n0 && unet_config_check(c, msg, sizeof msg)) err(E, "model", "%s", msg);
    if (E->n == n0) check_work(s, E);
}

int64_t spec_host_data_bytes(const struct train_spec *s, int64_t images)
{
    int c = s->model.in_channels, size = s->model.image_size;
    int64_t per = (int64_t)c * size * size;
    int fmnist = strcmp(s->dataset, "fashion-mnist") == 0;
    if (images < 0) {
        if (fmnist) images = SPEC_FMNIST_IMAGES;
        else images = upload_folder_images(s->dataset); /* -1: no upload, no readable folder */
    }
    if (images < 0) images = 0;
    return dataset_plan_bytes(fmnist, images, c, size,
                              fmnist ? -1 : upload_folder_max_pixels(s->dataset),
                              fmnist ? -1 : upload_folder_source_bytes(s->dataset)) +
           dataset_loader_plan_bytes(2, s->batch, per, images) +
           train_step_host_bytes(s->batch, (size_t)per);
}

/* physical memory, or the cgroup v2 limit when lower; 0 when unknown */
static int64_t host_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    int64_t mem = pages > 0 && size > 0 ? (int64_t)pages * size : 0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "re");
    char line[64];
    if (f && fgets(line, sizeof line, f)) {
        char *end;
        long long lim = strtoll(line, &end, 10);
        if (end != line && lim > 0 && (mem == 0 || lim < mem)) mem = lim;
    }
    if (f) fclose(f);
    return mem;
}

int spec_host_cores(void)
{
    /* the cores this process may run on (taskset, a cpuset), else those online */
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                          : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SPEC_THREADS_MAX ? SPEC_THREADS_MAX : (int)n;
}

int spec_host_check(const struct train_spec *s, char *why, size_t n)
{
    int64_t images = strcmp(s->dataset, "fashion-mnist") == 0 ? SPEC_FMNIST_IMAGES
                                                               : upload_folder_images(s->dataset);
    int64_t need = spec_host_data_bytes(s, images), have = host_memory();
    if (have <= 0 || need <= have) return 0;
    char b1[64], b2[64];
    if (images > 0)
        snprintf(why, n, "the dataset and batch buffers need %s (%" PRId64 " images of %dx%dx%d "
                 "%s, and batches of %d), more than this host's %s of memory",
                 fmt_bytes(b1, sizeof b1, need), images, s->model.in_channels,
                 s->model.image_size, s->model.image_size,
                 strcmp(s->dataset, "fashion-mnist") == 0 ? "held as 28x28 bytes"
                 : upload_folder_source_bytes(s->dataset) >= 0 ? "as their samples or float"
                                                               : "as float",
                 s->batch, fmt_bytes(b2, sizeof b2, have));
    else
        snprintf(why, n, "the batch buffers need %s, more than this host's %s of memory",
                 fmt_bytes(b1, sizeof b1, need), fmt_bytes(b2, sizeof b2, have));
    return -1;
}

int spec_validate(const struct train_spec *s, struct spec_errors *E)
{
    memset(E, 0, sizeof *E);
    validate(s, E);
    return E->n ? -1 : 0;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* "byte N (line L, column C)" of offset at in text */
static const char *where(char *buf, size_t n, const char *text, size_t at)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    snprintf(buf, n, "byte %zu (line %zu, column %zu)", at, line, col);
    return buf;
}

int spec_parse_object(const char *json, size_t len, cJSON **out, struct spec_errors *E)
{
    struct spec_ctx ctx;
    char pos[80], snip[SPEC_ECHO_MAX * 4 + 8];
    size_t i = 0;
    memset(E, 0, sizeof *E);
    memset(&ctx, 0, sizeof ctx);
    ctx.E = E;
    *out = NULL;
    /* the parse end through the out-parameter: cJSON_GetErrorPtr is one global for all threads */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        E->syntax = 1;
        E->syntax_at = at;
        while (i < len && is_ws(json[i])) i++;
        if (i == len)
            err(E, "", len ? "empty document (only whitespace)" : "empty document");
        else
            err(E, "", "not valid JSON at %s%s%s%s", where(pos, sizeof pos, json, at),
                at < len ? ", near '" : " (it ends early)",
                at < len ? echo(snip, sizeof snip, json + at, len - at, SPEC_ECHO_MAX) : "",
                at < len ? "'" : "");
        return -1;
    }
    for (i = (size_t)(end - json); i < len && is_ws(json[i]); i++) {
    }
    if (i < len) {
        err(E, "", "trailing bytes after the JSON value at %s: '%s'",
            where(pos, sizeof pos, json, i), echo(snip, sizeof snip, json + i, len - i, SPEC_ECHO_MAX));
    } else if (!cJSON_IsObject(root)) {
        err(E, "", "expected a JSON object, got %s", type_name(root));
    } else {
        scan_strings(&ctx, json, len);
        ctx.n_strings = 0;
        audit(&ctx, root, "", 0);
    }
    if (E->n) {
        cJSON_Delete(root);
        return -1;
    }
    *out = root;
    return 0;
}

/* parses n bytes; the top-level members named in extra (NULL-terminated, may be NULL) are
 * checked as strings are, then moved to *extras (when there are any) */
static int parse_text(const char *json, size_t len, const char *const *extra, cJSON **extras,
                      struct train_spec *s, struct spec_errors *E)
{
    cJSON *root = NULL;
    spec_defaults(s);
    if (extras) *extras = NULL;
    if (spec_parse_object(json, len, &root, E)) return -1;
    for (const char *const *x = extra; x && *x; x++) {
        cJSON *m = cJSON_DetachItemFromObjectCaseSensitive(root, *x);
        if (!m) continue;
        if (!*extras && !(*extras = cJSON_CreateObject())) {
            cJSON_Delete(m);
            err(E, "", "out of memory");
            goto done;
        }
        if (!cJSON_AddItemToObject(*extras, *x, m)) {
            cJSON_Delete(m);
            err(E, "", "out of memory");
            goto done;
        }
    }

    static const char *top[] = {"model", "data", "diffusion", "train", "output", "memory",
                                "init_from", NULL};
    check_keys(E, root, "", top);

    const cJSON *m = get_object(E, root, "model", 1);
    if (m) parse_model(E, m, s);

    const cJSON *d = get_object(E, root, "data", 1);
    if (d) {
        static const char *keys[] = {"dataset", "flip", "fmnist_resize", "validation", NULL};
        static const char *resize[] = {"pad", "resize", NULL};
        check_keys(E, d, "data", keys);
        const cJSON *ds = item(d, "dataset");
        if (!ds)
            err(E, "data.dataset", "required (\"fashion-mnist\" or a folder of PNG images)");
        else
            get_string(E, ds, "data.dataset", s->dataset, sizeof s->dataset);
        get_bool(E, d, "data", "flip", &s->flip);
        get_enum(E, d, "data", "fmnist_resize", resize, &s->fmnist_resize);
        get_rule(E, d, "data", "validation", s);
    }

    const cJSON *df = get_object(E, root, "diffusion", 0);
    if (df) {
        static const char *keys[] = {"timesteps", "beta_schedule", "beta_start", "beta_end",
                                     "prediction", NULL};
        static const char *sched[] = {"linear", "cosine", NULL};
        static const char *pred[] = {"epsilon", "v_prediction", NULL};
        check_keys(E, df, "diffusion", keys);
        get_rule(E, df, "diffusion", "timesteps", s);
        int k = (int)s->beta_schedule, p = (int)s->prediction;
        get_enum(E, df, "diffusion", "beta_schedule", sched, &k);
        get_enum(E, df, "diffusion", "prediction", pred, &p);
        s->beta_schedule = (enum ddpm_beta_schedule)k;
        s->prediction = (enum spec_prediction)p;
        get_rule(E, df, "diffusion", "beta_start", s);
        get_rule(E, df, "diffusion", "beta_end", s);
    }

    const cJSON *t = get_object(E, root, "train", 0);
    if (t) {
        static const char *keys[] = {"batch", "steps", "lr", "lr_schedule", "warmup", "beta1",
                                     "beta2", "eps", "weight_decay", "clip", "ema_decay", "seed",
                                     "threads", NULL};
        static const char *sched[] = {"constant", "cosine", NULL};
        static const char *nums[] = {"batch", "steps", "lr", "warmup", "beta1", "beta2", "eps",
                                     "weight_decay", "clip", "ema_decay", "seed", "threads",
                                     NULL};
        check_keys(E, t, "train", keys);
        for (const char *const *k = nums; *k; k++) get_rule(E, t, "train", *k, s);
        get_enum(E, t, "train", "lr_schedule", sched, &s->optim.cosine);
    }
    s->optim.total_steps = s->steps;

    const cJSON *o = get_object(E, root, "output", 0);
    if (o) {
        static const char *keys[] = {"checkpoint_every", "sample_every", "log_every",
                                     "keep_last", "samples", NULL};
        check_keys(E, o, "output", keys);
        for (const char *const *k = keys; *k; k++) get_rule(E, o, "output", *k, s);
    }

    const cJSON *mem = get_object(E, root, "memory", 0);
    if (mem) parse_memory(E, mem, s);

    const cJSON *init = item(root, "init_from");
    if (init && !cJSON_IsNull(init)) {
        if (!cJSON_IsString(init))
            err(E, "init_from", "expected a checkpoint path or null, got %s", type_name(init));
        else if (init->valuestring[0]) /* "" is the same as null: fresh weights */
            get_string(E, init, "init_from", s->init_from, sizeof s->init_from);
    }

    /* the same checks as spec_validate: what was stored passed its rule already, so this adds
     * the cross-field rules (only when everything else is clean) */
    if (E->n == 0) validate(s, E);
done:
    cJSON_Delete(root);
    return E->n ? -1 : 0;
}

int spec_parse(const char *json, struct train_spec *s, struct spec_errors *E)
{
    return parse_text(json, strlen(json), NULL, NULL, s, E);
}

int spec_parse_request(const char *body, size_t len, const char *const *extra, cJSON **extras,
                       struct train_spec *s, struct spec_errors *E)
{
    return parse_text(body, len, extra, extras, s, E);
}

int spec_load_file(const char *path, struct train_spec *s, struct spec_errors *E)
{
    char name[SPEC_ECHO_MAX * 4 + 8], *why = NULL, *buf = NULL;
    const char *reason;
    size_t n = 0, plen = strlen(path);
    int rc = -1;
    FILE *f = NULL;
    memset(E, 0, sizeof *E);
    spec_defaults(s);
    /* messages name the file by at most its last SPEC_ECHO_MAX bytes, escaped */
    echo(name, sizeof name, plen > SPEC_ECHO_MAX ? path + plen - SPEC_ECHO_MAX : path,
         plen > SPEC_ECHO_MAX ? SPEC_ECHO_MAX : plen, SPEC_ECHO_MAX);
    const char *dots = plen > SPEC_ECHO_MAX ? "..." : "";
    why = malloc(plen + 256);
    if (!why) {
        err(E, "", "out of memory");
        goto out;
    }
    f = fsio_fopen_read(path, why, plen + 256);
    if (!f) {
        /* fsio says "cannot open 'PATH': REASON"; keep the reason, name the file shortly */
        size_t pre = strlen("cannot open '") + plen;
        reason = strncmp(why, "cannot open '", 13) == 0 && strlen(why) > pre + 3 &&
                         strncmp(why + pre, "': ", 3) == 0
                     ? why + pre + 3
                     : why;
        err(E, "", "cannot open '%s%s': %s", dots, name, reason);
        goto out;
    }
    buf = malloc(SPEC_FILE_MAX + 1);
    if (!buf) {
        err(E, "", "out of memory for a %d-byte spec", SPEC_FILE_MAX);
        goto out;
    }
    n = fread(buf, 1, SPEC_FILE_MAX + 1, f);
    if (ferror(f)) {
        err(E, "", "cannot read '%s%s': %s", dots, name, strerror(errno));
        goto out;
    }
    if (n > SPEC_FILE_MAX) {
        err(E, "", "'%s%s' is larger than %d bytes (1 MiB)", dots, name, SPEC_FILE_MAX);
        goto out;
    }
    if (n == 0) {
        err(E, "", "'%s%s' is an empty file", dots, name);
        goto out;
    }
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        err(E, "", "'%s%s' contains a NUL byte at byte %zu (not a JSON text file)", dots, name,
            (size_t)(nul - buf));
        goto out;
    }
    buf[n] = 0;
    rc = parse_text(buf, n, NULL, NULL, s, E);
out:
    if (f) fclose(f);
    free(buf);
    free(why);
    return rc;
}

/* builders that remember a failed cJSON allocation in *bad (spec_to_json returns NULL then,
 * never a document with fields missing) */
static cJSON *js_obj(cJSON *parent, const char *key, int *bad)
{
    cJSON *o = parent ? cJSON_AddObjectToObject(parent, key) : NULL;
    if (!o) *bad = 1;
    return o;
}

static void js_num(cJSON *o, const char *key, double v, int *bad)
{
    if (!o || !cJSON_AddNumberToObject(o, key, v)) *bad = 1;
}

static void js_str(cJSON *o, const char *key, const char *v, int *bad)
{
    if (!o || !cJSON_AddStringToObject(o, key, v)) *bad = 1;
}

static void js_bool(cJSON *o, const char *key, int v, int *bad)
{
    if (!o || !cJSON_AddBoolToObject(o, key, v)) *bad = 1;
}

static void js_null(cJSON *o, const char *key, int *bad)
{
    if (!o || !cJSON_AddNullToObject(o, key)) *bad = 1;
}

static void js_ints(cJSON *o, const char *key, const int *v, int n, int *bad)
{
    cJSON *a = o ? cJSON_CreateIntArray(v, n) : NULL;
    /* cJSON_CreateIntArray returns a partial array when an element's allocation fails */
    if (!a || cJSON_GetArraySize(a) != n || !cJSON_AddItemToObject(o, key, a)) {
        cJSON_Delete(a);
        *bad = 1;
    }
}

char *spec_to_json(const struct train_spec *s)
{
    int bad = 0;
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    cJSON *m = js_obj(r, "model", &bad);
    const struct unet_config *c = &s->model;
    js_str(m, "preset", c->preset == UNET_DDPM ? "ddpm" : "seed", &bad);
    js_num(m, "in_channels", c->in_channels, &bad);
    js_num(m, "out_channels", c->out_channels, &bad);
    js_num(m, "image_size", c->image_size, &bad);
    if (c->preset == UNET_DDPM) {
        js_ints(m, "block_out_channels", c->channels, c->n_levels, &bad);
        js_num(m, "layers_per_block", c->layers_per_block, &bad);
        js_ints(m, "attention_resolutions", c->attn_res, c->n_attn, &bad);
        js_num(m, "norm_num_groups", c->groups, &bad);
        js_num(m, "norm_eps", json_float(c->norm_eps), &bad);
        if (c->attn_head_dim)
            js_num(m, "attention_head_dim", c->attn_head_dim, &bad);
        else
            js_null(m, "attention_head_dim", &bad);
        js_num(m, "dropout", json_float(c->dropout), &bad);
        js_bool(m, "flip_sin_to_cos", c->flip_sin_to_cos, &bad);
        js_num(m, "freq_shift", json_float(c->freq_shift), &bad);
    } else {
        js_num(m, "base", c->base, &bad);
        js_num(m, "time_dim", c->time_dim, &bad);
        js_num(m, "heads", c->heads, &bad);
    }
    cJSON *d = js_obj(r, "data", &bad);
    js_str(d, "dataset", s->dataset, &bad);
    js_bool(d, "flip", s->flip, &bad);
    js_str(d, "fmnist_resize", s->fmnist_resize ? "resize" : "pad", &bad);
    js_num(d, "validation", s->validation, &bad);
    cJSON *df = js_obj(r, "diffusion", &bad);
    js_num(df, "timesteps", s->timesteps, &bad);
    js_str(df, "beta_schedule", s->beta_schedule == DDPM_BETA_LINEAR ? "linear" : "cosine", &bad);
    js_num(df, "beta_start", s->beta_start, &bad);
    js_num(df, "beta_end", s->beta_end, &bad);
    js_str(df, "prediction", s->prediction == SPEC_PRED_EPSILON ? "epsilon" : "v_prediction",
           &bad);
    cJSON *t = js_obj(r, "train", &bad);
    js_num(t, "batch", s->batch, &bad);
    js_num(t, "steps", s->steps, &bad);
    js_num(t, "lr", json_float(s->optim.lr), &bad);
    js_str(t, "lr_schedule", s->optim.cosine ? "cosine" : "constant", &bad);
    js_num(t, "warmup", s->optim.warmup, &bad);
    js_num(t, "beta1", json_float(s->optim.beta1), &bad);
    js_num(t, "beta2", json_float(s->optim.beta2), &bad);
    js_num(t, "eps", json_float(s->optim.eps), &bad);
    js_num(t, "weight_decay", json_float(s->optim.weight_decay), &bad);
    js_num(t, "clip", json_float(s->optim.clip), &bad);
    js_num(t, "ema_decay", json_float(s->optim.ema_decay), &bad);
    js_num(t, "seed", (double)s->seed, &bad);
    js_num(t, "threads", s->threads, &bad);
    cJSON *o = js_obj(r, "output", &bad);
    js_num(o, "checkpoint_every", s->checkpoint_every, &bad);
    js_num(o, "sample_every", s->sample_every, &bad);
    js_num(o, "log_every", s->log_every, &bad);
    js_num(o, "keep_last", s->keep_last, &bad);
    js_num(o, "samples", s->samples, &bad);
    cJSON *mem = js_obj(r, "memory", &bad);
    static const char *prec[] = {"auto", "f32", "bf16", "f16"};
    static const char *rec[] = {"auto", "none", "attention", "resblock", "level"};
    static const char *off[] = {"auto", "off", "on"};
    js_num(mem, "vram_budget", (double)s->vram_budget, &bad);
    js_str(mem, "precision", prec[s->strategy.precision + 1], &bad);
    if (s->strategy.allow_half) /* written only when set: older checkpoints' specs match */
        js_bool(mem, "allow_16bit", 1, &bad);
    if (s->strategy.micro_batch)
        js_num(mem, "micro_batch", s->strategy.micro_batch, &bad);
    else
        js_str(mem, "micro_batch", "auto", &bad);
    js_str(mem, "recompute", rec[s->strategy.recompute + 1], &bad);
    js_str(mem, "offload", off[s->strategy.offload + 1], &bad);
    if (s->deterministic) /* as allow_16bit: older checkpoints' specs match */
        js_bool(mem, "deterministic", 1, &bad);
    cJSON *ls = js_obj(mem, "loss_scale", &bad);
    js_num(ls, "initial", json_float(s->strategy.loss_scale.initial), &bad);
    js_num(ls, "growth", json_float(s->strategy.loss_scale.growth), &bad);
    js_num(ls, "backoff", json_float(s->strategy.loss_scale.backoff), &bad);
    js_num(ls, "growth_interval", s->strategy.loss_scale.growth_interval, &bad);
    if (s->init_from[0])
        js_str(r, "init_from", s->init_from, &bad);
    else
        js_null(r, "init_from", &bad);
    char *out = bad ? NULL : cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

void spec_errors_print(const struct spec_errors *E, const char *prefix)
{
    for (int i = 0; i < E->n; i++)
        fprintf(stderr, "%s%s%s%s\n", prefix, E->e[i].path, E->e[i].path[0] ? ": " : "",
                E->e[i].msg);
}
