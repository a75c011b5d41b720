/* safetensors.c - safetensors reader (whole file loaded and validated up front, so callers never
 * see a half-checked tensor) and writer (atomic: temp file, fsync, rename, fsync the directory).
 * Format: https://github.com/huggingface/safetensors - u64 LE header length, JSON header, data.
 */
#define _POSIX_C_SOURCE 200809L

#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsio.h"

/* Tensor bytes are copied between file and memory unchanged, which is only right on a
 * little-endian host (the format is little-endian). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* JSON numbers are doubles: above 2^53 an offset or dim could not be represented exactly. */
#define ST_JSON_INT_MAX 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};

struct safetensors {
    cJSON *root;          /* parsed header; tensor names and metadata values point into it */
    const cJSON *meta;    /* the __metadata__ object, or NULL */
    unsigned char *data;  /* the data section (malloc'd, so offset 0 is maximally aligned); NULL
                           * when streamed (safetensors_open_stream) */
    size_t data_len;
    int fd;               /* a streamed file's descriptor, -1 otherwise */
    uint64_t data_off;    /* where the data section starts in the file (8 + header length) */
    struct st_tensor *tensors; /* header order */
    size_t count;
};

struct st_wentry {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_NDIM];
    const void *data; /* borrowed from the caller until save */
    size_t nbytes;
    st_fill_fn fill;  /* or made by fill(fctx, dst) while it is written */
    void *fctx;
};

struct safetensors_writer {
    struct st_wentry *t;
    size_t n, cap;
    char **mkey, **mval;
    size_t nmeta, mcap;
};

/* ---- small helpers ---- */

size_t safetensors_dtype_size(enum st_dtype dtype)
{
    if ((unsigned)dtype >= ST_DTYPE_COUNT) return 0;
    return st_dtypes[dtype].size;
}

const char *safetensors_dtype_name(enum st_dtype dtype)
{
    if ((unsigned)dtype >= ST_DTYPE_COUNT) return "?";
    return st_dtypes[dtype].name;
}

const char *safetensors_status_name(enum st_status status)
{
    switch (status) {
    case ST_OK: return "ok";
    case ST_ERR_IO: return "I/O error";
    case ST_ERR_FORMAT: return "invalid safetensors file";
    case ST_ERR_NOMEM: return "out of memory";
    case ST_ERR_NOT_FOUND: return "not found";
    case ST_ERR_ARG: return "invalid argument";
    }
    return "unknown status";
}

/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF);
 * otherwise 0 with *bad = offset of the first bad sequence. */
static int utf8_valid(const unsigned char *s, size_t n, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], cp, min;
        size_t len, k;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            goto bad;
        }
        if (n - i < len) goto bad;
        for (k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
        i += len;
    }
    return 1;
bad:
    *bad = i;
    return 0;
}

/* A JSON number that is an exact integer in [0, 2^53] (the range a double holds exactly). */
static int json_uint(const cJSON *v, uint64_t *out)
{
    double d;
    uint64_t u;
    if (!cJSON_IsNumber(v)) return 0;
    d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_JSON_INT_MAX) return 0;
    u = (uint64_t)d;
    if ((double)u != d) return 0;
    *out = u;
    return 1;
}

/* What a rejected JSON value was, for messages: "-1", "2.5", "a string", ... */
static const char *json_describe(const cJSON *v, char *buf, size_t len)
{
    if (cJSON_IsNumber(v)) {
        snprintf(buf, len, "%.17g", v->valuedouble);
        return buf;
    }
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "missing";
}

static void fmt_shape(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t used = 0;
    int i;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "[");
    for (i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

/* numel = product of shape; 0 on int64 overflow (a zero dim seen before overflowing gives 0 too,
 * which is correct). */
static int shape_numel(const int64_t *shape, int ndim, int64_t *numel)
{
    int64_t n = 1;
    int i;
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 0;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return 0;
        n *= shape[i];
    }
    *numel = n;
    return 1;
}

/* numel * size as a byte count that fits both size_t and int64 */
static int byte_count(int64_t numel, size_t size, size_t *nbytes)
{
    uint64_t lim = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX : SIZE_MAX;
    if (size == 0 || (uint64_t)numel > lim / size) return 0;
    *nbytes = (size_t)numel * size;
    return 1;
}

/* read exactly n bytes (at offset `at`, or from the file position when at < 0); *eof = 1 if the
 * file ended first */
static int read_full_at(int fd, void *buf, size_t n, int64_t at, int *eof)
{
    unsigned char *p = buf;
    *eof = 0;
    while (n > 0) {
        size_t want = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = at < 0 ? read(fd, p, want) : pread(fd, p, want, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return 0;
        if (r == 0) {
            *eof = 1;
            return 0;
        }
        p += r;
        n -= (size_t)r;
        if (at >= 0) at += r;
    }
    return 1;
}

static int read_full(int fd, void *buf, size_t n, int *eof)
{
    return read_full_at(fd, buf, n, -1, eof);
}

/* ---- reading ---- */

struct st_span {
    uint64_t begin, end;
    size_t idx;
};

static int span_cmp(const void *a, const void *b)
{
    const struct st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validate one tensor entry of the header and fill *t (data left NULL) and *sp. */
static enum st_status parse_entry(const cJSON *e, struct st_tensor *t, struct st_span *sp,
                                  size_t data_len, char *err, size_t errlen)
{
    enum st_status rc = ST_ERR_FORMAT;
    const char *name = e->string;
    const cJSON *dtype, *shape, *offs, *f;
    char desc[40], shp[160];
    int nd = 0, ns = 0, no = 0, i;
    uint64_t v, b = 0, en = 0;
    size_t nbytes;

    if (!cJSON_IsObject(e)) {
        fsio_err(err, errlen, "tensor '%.200s': entry is %s, not an object", name,
                 json_describe(e, desc, sizeof desc));
        goto done;
    }
    /* serde (the reference reader) rejects a repeated field; cJSON would silently take the first */
    cJSON_ArrayForEach(f, e)
    {
        const char *k = f->string;
        int *cnt = !strcmp(k, "dtype") ? &nd : !strcmp(k, "shape") ? &ns
                 : !strcmp(k, "data_offsets") ? &no : NULL;
        if (cnt && ++*cnt > 1) {
            fsio_err(err, errlen, "tensor '%.200s': field '%s' appears twice", name, k);
            goto done;
        }
    }

    dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dtype)) {
        fsio_err(err, errlen, "tensor '%.200s': \"dtype\" is %s, expected a string like \"F32\"",
                 name, json_describe(dtype, desc, sizeof desc));
        goto done;
    }
    for (i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(dtype->valuestring, st_dtypes[i].name)) break;
    if (i == ST_DTYPE_COUNT) {
        fsio_err(err, errlen, "tensor '%.200s': unknown dtype '%.40s'", name, dtype->valuestring);
        goto done;
    }
    t->dtype = (enum st_dtype)i;

    shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(shape)) {
        fsio_err(err, errlen, "tensor '%.200s': \"shape\" is %s, expected an array of integers",
                 name, json_describe(shape, desc, sizeof desc));
        goto done;
    }
    if (cJSON_GetArraySize(shape) > ST_MAX_NDIM) {
        fsio_err(err, errlen, "tensor '%.200s': shape has %d dimensions, at most %d are supported",
                 name, cJSON_GetArraySize(shape), ST_MAX_NDIM);
        goto done;
    }
    t->ndim = 0;
    cJSON_ArrayForEach(f, shape)
    {
        if (!json_uint(f, &v)) {
            fsio_err(err, errlen, "tensor '%.200s': shape[%d] is %s, not a non-negative integer",
                     name, t->ndim, json_describe(f, desc, sizeof desc));
            goto done;
        }
        t->shape[t->ndim++] = (int64_t)v;
    }
    fmt_shape(shp, sizeof shp, t->shape, t->ndim);
    if (!shape_numel(t->shape, t->ndim, &t->numel) ||
        !byte_count(t->numel, st_dtypes[t->dtype].size, &nbytes)) {
        fsio_err(err, errlen, "tensor '%.200s': shape %s is too large", name, shp);
        goto done;
    }

    offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        fsio_err(err, errlen,
                 "tensor '%.200s': \"data_offsets\" must be an array of two integers [begin, end]",
                 name);
        goto done;
    }
    for (i = 0; i < 2; i++) {
        f = cJSON_GetArrayItem(offs, i);
        if (!json_uint(f, &v)) {
            fsio_err(err, errlen,
                     "tensor '%.200s': data_offsets[%d] is %s, not a non-negative integer", name,
                     i, json_describe(f, desc, sizeof desc));
            goto done;
        }
        if (i == 0) b = v;
        else en = v;
    }
    if (b > en) {
        fsio_err(err, errlen, "tensor '%.200s': data_offsets [%llu, %llu] have begin > end", name,
                 (unsigned long long)b, (unsigned long long)en);
        goto done;
    }
    if (en > data_len) {
        fsio_err(err, errlen,
                 "tensor '%.200s': data_offsets [%llu, %llu] exceed the %zu-byte data section",
                 name, (unsigned long long)b, (unsigned long long)en, data_len);
        goto done;
    }
    if (en - b != nbytes) {
        fsio_err(err, errlen,
                 "tensor '%.200s': shape %s of %s needs %zu bytes but data_offsets [%llu, %llu] "
                 "span %llu",
                 name, shp, st_dtypes[t->dtype].name, nbytes, (unsigned long long)b,
                 (unsigned long long)en, (unsigned long long)(en - b));
        goto done;
    }
    t->name = name;
    t->nbytes = nbytes;
    sp->begin = b;
    sp->end = en;
    rc = ST_OK;
done:
    return rc;
}

/* Reject what cJSON would let through: invalid UTF-8, raw control bytes (RFC 8259 forbids them;
 * a raw NUL would truncate a name), and \u0000 escapes (cJSON decodes them into a NUL that cuts
 * the C string short, so "a\u0000x" and "a" would both read as "a"). */
static enum st_status check_header_bytes(const unsigned char *h, size_t n, char *err,
                                         size_t errlen)
{
    enum st_status rc = ST_ERR_FORMAT;
    size_t i, bad;
    for (i = 0; i < n; i++) {
        if (h[i] < 0x20 && h[i] != '\t' && h[i] != '\n' && h[i] != '\r') {
            fsio_err(err, errlen, "header contains control byte 0x%02x at byte %zu", h[i], i);
            goto done;
        }
        if (h[i] == '\\' && i + 1 < n) {
            if (h[i + 1] == 'u' && n - i >= 6 && !memcmp(h + i + 2, "0000", 4)) {
                fsio_err(err, errlen, "header contains a \\u0000 escape at byte %zu", i);
                goto done;
            }
            i++; /* skip the escaped character so "\\\\u0000" is not misread */
        }
    }
    if (!utf8_valid(h, n, &bad)) {
        fsio_err(err, errlen, "header is not valid UTF-8 (bad byte 0x%02x at byte %zu)", h[bad],
                 bad);
        goto done;
    }
    rc = ST_OK;
done:
    return rc;
}

/* Bound the parse before it runs: one pass over the header outside string literals counting
 * nesting depth and values (every value but the first follows a ',' or opens a container... so
 * commas + opening brackets + 1 bounds the parser's nodes from above). cJSON's own nesting limit
 * is 1000 and it has no node limit: a 100 MiB header of "[0,0,..." would cost ~3 GiB of nodes. */
static enum st_status scan_header_json(const unsigned char *h, size_t n, char *err, size_t errlen)
{
    size_t i, values = 1;
    int depth = 0, in_str = 0;
    for (i = 0; i < n; i++) {
        unsigned char c = h[i];
        if (in_str) {
            if (c == '\\') i++; /* the escaped byte cannot end the string */
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > ST_MAX_JSON_DEPTH) {
                fsio_err(err, errlen,
                         "header nests deeper than %d levels at byte %zu (ST_MAX_JSON_DEPTH)",
                         ST_MAX_JSON_DEPTH, i);
                return ST_ERR_FORMAT;
            }
            values++;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',') {
            values++;
        }
        if (values > ST_MAX_JSON_VALUES) {
            fsio_err(err, errlen, "header holds more than %zu JSON values (ST_MAX_JSON_VALUES)",
                     ST_MAX_JSON_VALUES);
            return ST_ERR_FORMAT;
        }
    }
    return ST_OK;
}

/* Parse and validate the n-byte header h against the data section already in st. */
static enum st_status parse_header(struct safetensors *st, const char *h, size_t n, char *err,
                                   size_t errlen)
{
    enum st_status rc = ST_ERR_FORMAT;
    const char *end = NULL, *p;
    const cJSON *e, *m;
    size_t ntensors = 0, i, k;
    struct st_span *spans = NULL;
    const char **names = NULL;
    uint64_t cursor;
    char desc[40];
    int seen_meta = 0;

    if ((rc = check_header_bytes((const unsigned char *)h, n, err, errlen)) != ST_OK) goto done;
    if ((rc = scan_header_json((const unsigned char *)h, n, err, errlen)) != ST_OK) goto done;
    rc = ST_ERR_FORMAT;
    st->root = cJSON_ParseWithLengthOpts(h, n, &end, 0);
    if (!st->root) {
        size_t at = end && end >= h && end <= h + n ? (size_t)(end - h) : 0;
        fsio_err(err, errlen, "header is not valid JSON (parse error at byte %zu of %zu: '%.24s')",
                 at, n, h + at);
        goto done;
    }
    /* the spec pads the header with spaces; anything else after the JSON value is garbage */
    for (p = end; p < h + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            fsio_err(err, errlen, "header has trailing bytes after the JSON value at byte %zu",
                     (size_t)(p - h));
            goto done;
        }
    }
    /* the spec requires the header to start with '{' (no leading whitespace) */
    if (!cJSON_IsObject(st->root) || h[0] != '{') {
        fsio_err(err, errlen, "header is %s, not a JSON object starting with '{'",
                 cJSON_IsObject(st->root) ? "an object with leading whitespace"
                                         : json_describe(st->root, desc, sizeof desc));
        goto done;
    }

    cJSON_ArrayForEach(e, st->root)
    {
        if (strlen(e->string) > ST_MAX_NAME_BYTES) {
            fsio_err(err, errlen,
                     "tensor name '%.60s...' is %zu bytes, over %d (ST_MAX_NAME_BYTES)",
                     e->string, strlen(e->string), ST_MAX_NAME_BYTES);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") && ++ntensors > ST_MAX_TENSORS) {
            fsio_err(err, errlen, "header has more than %d tensors (ST_MAX_TENSORS)",
                     ST_MAX_TENSORS);
            goto done;
        }
    }
    /* +1: never ask calloc for 0 bytes (it may return NULL) */
    st->tensors = calloc(ntensors + 1, sizeof *st->tensors);
    spans = calloc(ntensors + 1, sizeof *spans);
    names = calloc(ntensors + 1, sizeof *names);
    if (!st->tensors || !spans || !names) {
        rc = ST_ERR_NOMEM;
        fsio_err(err, errlen, "out of memory for %zu tensor entries", ntensors);
        goto done;
    }

    cJSON_ArrayForEach(e, st->root)
    {
        if (!strcmp(e->string, "__metadata__")) {
            if (seen_meta++) {
                fsio_err(err, errlen, "header has a duplicate \"__metadata__\" key");
                goto done;
            }
            if (cJSON_IsNull(e)) continue; /* the reference reader treats null as absent */
            if (!cJSON_IsObject(e)) {
                fsio_err(err, errlen, "\"__metadata__\" is %s, expected an object of strings",
                         json_describe(e, desc, sizeof desc));
                goto done;
            }
            k = 0;
            cJSON_ArrayForEach(m, e)
            {
                if (++k > ST_MAX_META_ENTRIES) {
                    fsio_err(err, errlen,
                             "\"__metadata__\" has more than %d entries (ST_MAX_META_ENTRIES)",
                             ST_MAX_META_ENTRIES);
                    goto done;
                }
                if (strlen(m->string) > ST_MAX_NAME_BYTES) {
                    fsio_err(err, errlen,
                             "\"__metadata__\" key '%.60s...' is %zu bytes, over %d "
                             "(ST_MAX_NAME_BYTES)",
                             m->string, strlen(m->string), ST_MAX_NAME_BYTES);
                    goto done;
                }
                if (!cJSON_IsString(m)) {
                    fsio_err(err, errlen,
                             "\"__metadata__\" value for '%.200s' is %s, expected a string",
                             m->string, json_describe(m, desc, sizeof desc));
                    goto done;
                }
            }
            st->meta = e;
            continue;
        }
        if ((rc = parse_entry(e, &st->tensors[st->count], &spans[st->count], st->data_len, err,
                              errlen)) != ST_OK)
            goto done;
        rc = ST_ERR_FORMAT; /* a later entry's error (a second "__metadata__") is not ST_OK */
        spans[st->count].idx = st->count;
        names[st->count] = e->string;
        st->count++;
    }
    rc = ST_ERR_FORMAT;

    qsort(names, st->count, sizeof *names, str_ptr_cmp);
    for (i = 1; i < st->count; i++) {
        if (!strcmp(names[i - 1], names[i])) {
            fsio_err(err, errlen, "duplicate tensor name '%.200s'", names[i]);
            goto done;
        }
    }
    if (st->meta) {
        /* at most ST_MAX_META_ENTRIES keys: quadratic is fine and keeps names[] free */
        const cJSON *a, *b;
        cJSON_ArrayForEach(a, st->meta) for (b = a->next; b; b = b->next)
        {
            if (!strcmp(a->string, b->string)) {
                fsio_err(err, errlen, "duplicate \"__metadata__\" key '%.200s'", a->string);
                goto done;
            }
        }
    }

    /* The spec requires the tensors to tile the data section: sorted by offset, each must begin
     * exactly where the previous one ended, and the last must end at the end of the section. */
    qsort(spans, st->count, sizeof *spans, span_cmp);
    cursor = 0;
    for (i = 0; i < st->count; i++) {
        const struct st_tensor *t = &st->tensors[spans[i].idx];
        if (spans[i].begin < cursor) {
            const struct st_span *q = &spans[i - 1];
            fsio_err(err, errlen,
                     "tensors '%.200s' [%llu, %llu] and '%.200s' [%llu, %llu] overlap",
                     st->tensors[q->idx].name, (unsigned long long)q->begin,
                     (unsigned long long)q->end, t->name, (unsigned long long)spans[i].begin,
                     (unsigned long long)spans[i].end);
            goto done;
        }
        if (spans[i].begin > cursor) {
            fsio_err(err, errlen,
                     "hole in the data section: bytes [%llu, %llu) before tensor '%.200s' belong "
                     "to no tensor",
                     (unsigned long long)cursor, (unsigned long long)spans[i].begin, t->name);
            goto done;
        }
        cursor = spans[i].end;
    }
    if (cursor != st->data_len) {
        fsio_err(err, errlen,
                 "bytes [%llu, %zu) at the end of the data section belong to no tensor",
                 (unsigned long long)cursor, st->data_len);
        goto done;
    }
    for (k = 0; k < st->count; k++) {
        struct st_tensor *t = &st->tensors[spans[k].idx];
        t->offset = spans[k].begin;
        t->data = st->data ? st->data + spans[k].begin : NULL;
    }
    rc = ST_OK;
done:
    free(spans);
    free(names);
    return rc;
}

static void read_err(char *err, size_t errlen, const char *path, int eof)
{
    fsio_err(err, errlen, "cannot read '%s': %s", path,
             eof ? "file shrank while being read" : strerror(errno));
}

/* safetensors_open, or with stream the header only (the descriptor kept for the tensors) */
static enum st_status open_file(struct safetensors **out, const char *path, int stream, char *err,
                                size_t errlen)
{
    enum st_status rc = ST_ERR_IO;
    struct safetensors *st = NULL;
    char *hdr = NULL;
    unsigned char lenbuf[8];
    uint64_t fsize, hlen = 0, avail;
    struct stat sb;
    int fd = -1, eof, i;

    if (err && errlen) err[0] = '\0';
    if (out) *out = NULL;
    if (!out || !path) {
        rc = ST_ERR_ARG;
        fsio_err(err, errlen, "safetensors_open: NULL argument");
        goto done;
    }
    /* regular files only: a FIFO must not block open() (fsio.h) */
    fd = fsio_open_regular(path, O_RDONLY, err, errlen);
    if (fd < 0) goto done;
    if (fstat(fd, &sb) != 0) {
        fsio_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        fsio_err(err, errlen, "'%s' is not a regular file", path);
        goto done;
    }
    fsize = (uint64_t)sb.st_size;
    rc = ST_ERR_FORMAT;
    if (fsize < 8) {
        fsio_err(err, errlen,
                 "%s: %llu bytes, but a safetensors file starts with an 8-byte header length",
                 fsize ? "file too short" : "empty file", (unsigned long long)fsize);
        goto done;
    }
    rc = ST_ERR_IO;
    if (!read_full(fd, lenbuf, 8, &eof)) {
        read_err(err, errlen, path, eof);
        goto done;
    }
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    avail = fsize - 8;
    rc = ST_ERR_FORMAT;
    if (hlen > ST_MAX_HEADER_BYTES) {
        fsio_err(err, errlen,
                 "header length %llu exceeds the %llu MiB limit (corrupt or not a safetensors "
                 "file)",
                 (unsigned long long)hlen, (unsigned long long)(ST_MAX_HEADER_BYTES >> 20));
        goto done;
    }
    if (hlen > avail) {
        fsio_err(err, errlen, "truncated file: header says %llu bytes but only %llu follow",
                 (unsigned long long)hlen, (unsigned long long)avail);
        goto done;
    }
    if (avail - hlen > SIZE_MAX - 1) {
        rc = ST_ERR_NOMEM;
        fsio_err(err, errlen, "data section of %llu bytes does not fit in memory",
                 (unsigned long long)(avail - hlen));
        goto done;
    }

    rc = ST_ERR_NOMEM;
    st = calloc(1, sizeof *st);
    hdr = malloc((size_t)hlen + 1);
    if (st) {
        st->fd = -1;
        st->data_off = 8 + hlen;
        st->data_len = (size_t)(avail - hlen);
        if (!stream) st->data = malloc(st->data_len ? st->data_len : 1);
    }
    if (!st || !hdr || (!stream && !st->data)) {
        fsio_err(err, errlen, "out of memory loading '%s' (%llu bytes)", path,
                 (unsigned long long)fsize);
        goto done;
    }
    rc = ST_ERR_IO;
    if (!read_full(fd, hdr, (size_t)hlen, &eof) ||
        (!stream && !read_full(fd, st->data, st->data_len, &eof))) {
        read_err(err, errlen, path, eof);
        goto done;
    }
    hdr[hlen] = '\0';
    rc = parse_header(st, hdr, (size_t)hlen, err, errlen);
    if (rc == ST_OK && stream) {
        st->fd = fd; /* the tensors' bytes are read from it (safetensors_read) */
        fd = -1;
    }
done:
    if (fd >= 0) close(fd);
    free(hdr);
    if (rc != ST_OK) {
        safetensors_free(st);
        st = NULL;
    }
    if (out) *out = st;
    return rc;
}

enum st_status safetensors_open(struct safetensors **out, const char *path, char *err,
                                size_t errlen)
{
    return open_file(out, path, 0, err, errlen);
}

enum st_status safetensors_open_stream(struct safetensors **out, const char *path, char *err,
                                       size_t errlen)
{
    return open_file(out, path, 1, err, errlen);
}

enum st_status safetensors_read(const struct safetensors *st, const struct st_tensor *t,
                                void *dst, char *err, size_t errlen)
{
    if (!st || !t || (!dst && t->nbytes)) {
        fsio_err(err, errlen, "safetensors_read: NULL argument");
        return ST_ERR_ARG;
    }
    if (!t->nbytes) return ST_OK;
    if (st->data) {
        memcpy(dst, t->data, t->nbytes); /* memcpy: t->data may be unaligned */
        return ST_OK;
    }
    int eof;
    if (!read_full_at(st->fd, dst, t->nbytes, (int64_t)(st->data_off + t->offset), &eof)) {
        fsio_err(err, errlen, "cannot read tensor '%.200s': %s", t->name,
                 eof ? "the file shrank" : strerror(errno));
        return ST_ERR_IO;
    }
    return ST_OK;
}

size_t safetensors_count(const struct safetensors *st) { return st ? st->count : 0; }

enum st_status safetensors_get(const struct safetensors *st, size_t index,
                               const struct st_tensor **t)
{
    if (t) *t = NULL;
    if (!st || !t || index >= st->count) return ST_ERR_ARG;
    *t = &st->tensors[index];
    return ST_OK;
}

enum st_status safetensors_find(const struct safetensors *st, const char *name,
                                const struct st_tensor **t)
{
    size_t i;
    if (t) *t = NULL;
    if (!st || !name || !t) return ST_ERR_ARG;
    /* linear: a UNet has a few hundred tensors and lookups happen once per load */
    for (i = 0; i < st->count; i++) {
        if (!strcmp(st->tensors[i].name, name)) {
            *t = &st->tensors[i];
            return ST_OK;
        }
    }
    return ST_ERR_NOT_FOUND;
}

const char *safetensors_meta(const struct safetensors *st, const char *key)
{
    const cJSON *v;
    if (!st || !st->meta || !key) return NULL;
    v = cJSON_GetObjectItemCaseSensitive(st->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

enum st_status safetensors_read_f32(const struct safetensors *st, const char *name, float *dst,
                                    int64_t expect_numel, char *err, size_t errlen)
{
    enum st_status rc;
    const struct st_tensor *t = NULL;

    if (!st || !name || (!dst && expect_numel > 0)) {
        rc = ST_ERR_ARG;
        fsio_err(err, errlen, "safetensors_read_f32: NULL argument");
        goto done;
    }
    rc = safetensors_find(st, name, &t);
    if (rc != ST_OK) {
        fsio_err(err, errlen, "tensor '%.200s' not found", name);
        goto done;
    }
    rc = ST_ERR_FORMAT;
    if (t->dtype != ST_F32) {
        fsio_err(err, errlen, "tensor '%.200s' is %s, expected F32", name,
                 st_dtypes[t->dtype].name);
        goto done;
    }
    if (t->numel != expect_numel) {
        char shp[160];
        fmt_shape(shp, sizeof shp, t->shape, t->ndim);
        fsio_err(err, errlen,
                 "tensor '%.200s' has shape %s (%lld elements), expected %lld elements", name, shp,
                 (long long)t->numel, (long long)expect_numel);
        goto done;
    }
    rc = safetensors_read(st, t, dst, err, errlen);
done:
    return rc;
}

void safetensors_free(struct safetensors *st)
{
    if (!st) return;
    cJSON_Delete(st->root);
    free(st->tensors);
    free(st->data);
    if (st->fd >= 0) close(st->fd);
    free(st);
}

/* ---- writing ---- */

enum st_status safetensors_writer_init(struct safetensors_writer **out)
{
    if (!out) return ST_ERR_ARG;
    *out = calloc(1, sizeof **out);
    return *out ? ST_OK : ST_ERR_NOMEM;
}

static int str_utf8_ok(const char *s)
{
    size_t bad;
    return s && utf8_valid((const unsigned char *)s, strlen(s), &bad);
}

static enum st_status writer_add(struct safetensors_writer *w, const char *name,
                                 enum st_dtype dtype, int ndim, const int64_t *shape,
                                 const void *data, st_fill_fn fill, void *fctx)
{
    enum st_status rc = ST_ERR_ARG;
    struct st_wentry e;
    int64_t numel;
    size_t i;

    memset(&e, 0, sizeof e);
    if (!w || !str_utf8_ok(name) || !strcmp(name, "__metadata__")) goto done;
    /* never write what safetensors_open would refuse */
    if (strlen(name) > ST_MAX_NAME_BYTES || w->n >= ST_MAX_TENSORS) goto done;
    if ((unsigned)dtype >= ST_DTYPE_COUNT || ndim < 0 || ndim > ST_MAX_NDIM) goto done;
    if (ndim > 0 && !shape) goto done;
    for (i = 0; i < (size_t)ndim; i++) e.shape[i] = shape[i];
    if (!shape_numel(e.shape, ndim, &numel) ||
        !byte_count(numel, st_dtypes[dtype].size, &e.nbytes))
        goto done;
    if (e.nbytes && !data && !fill) goto done;
    for (i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) goto done;

    rc = ST_ERR_NOMEM;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        struct st_wentry *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) goto done;
        w->t = nt;
        w->cap = cap;
    }
    e.name = malloc(strlen(name) + 1);
    if (!e.name) goto done;
    strcpy(e.name, name);
    e.dtype = dtype;
    e.ndim = ndim;
    e.data = data;
    e.fill = fill;
    e.fctx = fctx;
    w->t[w->n++] = e;
    rc = ST_OK;
done:
    return rc;
}

enum st_status safetensors_writer_add(struct safetensors_writer *w, const char *name,
                                      enum st_dtype dtype, int ndim, const int64_t *shape,
                                      const void *data)
{
    return writer_add(w, name, dtype, ndim, shape, data, NULL, NULL);
}

enum st_status safetensors_writer_add_fill(struct safetensors_writer *w, const char *name,
                                           enum st_dtype dtype, int ndim, const int64_t *shape,
                                           st_fill_fn fill, void *ctx)
{
    if (!fill) return ST_ERR_ARG;
    return writer_add(w, name, dtype, ndim, shape, NULL, fill, ctx);
}

size_t safetensors_writer_staging_bytes(const struct safetensors_writer *w)
{
    size_t most = 0;
    for (size_t i = 0; w && i < w->n; i++)
        if (w->t[i].fill && w->t[i].nbytes > most) most = w->t[i].nbytes;
    return most;
}

enum st_status safetensors_writer_meta(struct safetensors_writer *w, const char *key,
                                       const char *value)
{
    enum st_status rc = ST_ERR_ARG;
    char *k = NULL, *v = NULL;
    size_t i;

    if (!w || !str_utf8_ok(key) || !str_utf8_ok(value) || strlen(key) > ST_MAX_NAME_BYTES)
        goto done;
    rc = ST_ERR_NOMEM;
    v = malloc(strlen(value) + 1);
    if (!v) goto done;
    strcpy(v, value);
    for (i = 0; i < w->nmeta; i++) {
        if (!strcmp(w->mkey[i], key)) {
            free(w->mval[i]);
            w->mval[i] = v;
            v = NULL;
            rc = ST_OK;
            goto done;
        }
    }
    if (w->nmeta >= ST_MAX_META_ENTRIES) { /* a new key past what readers accept */
        rc = ST_ERR_ARG;
        goto done;
    }
    if (w->nmeta == w->mcap) {
        size_t cap = w->mcap ? 2 * w->mcap : 8;
        char **nk = realloc(w->mkey, cap * sizeof *nk);
        if (!nk) goto done;
        w->mkey = nk;
        char **nv = realloc(w->mval, cap * sizeof *nv);
        if (!nv) goto done;
        w->mval = nv;
        w->mcap = cap;
    }
    k = malloc(strlen(key) + 1);
    if (!k) goto done;
    strcpy(k, key);
    w->mkey[w->nmeta] = k;
    w->mval[w->nmeta] = v;
    w->nmeta++;
    k = v = NULL;
    rc = ST_OK;
done:
    free(k);
    free(v);
    return rc;
}

void safetensors_writer_free(struct safetensors_writer *w)
{
    size_t i;
    if (!w) return;
    for (i = 0; i < w->n; i++) free(w->t[i].name);
    for (i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->t);
    free(w->mkey);
    free(w->mval);
    free(w);
}

/* growable byte buffer for the header; oom is sticky so callers check once at the end */
struct st_sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_put(struct st_sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *np;
        while (cap < b->len + n) cap *= 2;
        np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_str(struct st_sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(struct st_sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* a JSON string literal; input is valid UTF-8 (checked at add/meta time), so only quote,
 * backslash and control characters need escaping */
static void sb_json_str(struct st_sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* safetensors_writer_save's pieces: the length, the header, then each tensor's bytes */
struct writer_pieces {
    const struct safetensors_writer *w;
    const void *head[2];
    size_t head_len[2];
    size_t k;            /* pieces given so far */
    unsigned char *staging;
    int failed;          /* a fill failed (tensor k - 1 - 2) */
};

static int writer_next(void *ctx, struct fsio_buf *b)
{
    struct writer_pieces *p = ctx;
    if (p->k < 2) {
        *b = (struct fsio_buf){p->head[p->k], p->head_len[p->k]};
        p->k++;
        return 1;
    }
    if (p->k - 2 >= p->w->n) return 0;
    const struct st_wentry *e = &p->w->t[p->k - 2];
    p->k++;
    if (!e->fill) {
        *b = (struct fsio_buf){e->data, e->nbytes};
        return 1;
    }
    if (e->fill(e->fctx, p->staging)) {
        p->failed = 1;
        p->k--; /* names the tensor: k - 2 */
        return -1;
    }
    *b = (struct fsio_buf){p->staging, e->nbytes};
    return 1;
}

enum st_status safetensors_writer_save(const struct safetensors_writer *w, const char *path,
                                       char *err, size_t errlen)
{
    enum st_status rc = ST_ERR_ARG;
    struct st_sbuf hb = {0};
    struct writer_pieces wp;
    unsigned char lenbuf[8];
    uint64_t off = 0, hlen;
    int i;
    size_t k;

    memset(&wp, 0, sizeof wp);
    if (err && errlen) err[0] = '\0';
    if (!w || !path || !*path) {
        fsio_err(err, errlen, "safetensors_writer_save: NULL or empty argument");
        goto done;
    }

    /* header: metadata first (as the Python writer does), then tensors in insertion order */
    sb_str(&hb, "{");
    if (w->nmeta) {
        sb_str(&hb, "\"__metadata__\":{");
        for (k = 0; k < w->nmeta; k++) {
            if (k) sb_str(&hb, ",");
            sb_json_str(&hb, w->mkey[k]);
            sb_str(&hb, ":");
            sb_json_str(&hb, w->mval[k]);
        }
        sb_str(&hb, "}");
    }
    for (k = 0; k < w->n; k++) {
        const struct st_wentry *e = &w->t[k];
        if (k || w->nmeta) sb_str(&hb, ",");
        sb_json_str(&hb, e->name);
        sb_str(&hb, ":{\"dtype\":\"");
        sb_str(&hb, st_dtypes[e->dtype].name);
        sb_str(&hb, "\",\"shape\":[");
        for (i = 0; i < e->ndim; i++) {
            if (i) sb_str(&hb, ",");
            sb_u64(&hb, (uint64_t)e->shape[i]);
        }
        sb_str(&hb, "],\"data_offsets\":[");
        sb_u64(&hb, off);
        sb_str(&hb, ",");
        if (e->nbytes > UINT64_MAX - off) {
            fsio_err(err, errlen, "total tensor size overflows at tensor '%.200s'", e->name);
            goto done;
        }
        off += e->nbytes;
        sb_u64(&hb, off);
        sb_str(&hb, "]}");
    }
    sb_str(&hb, "}");
    /* spaces up to a multiple of 8 so the data section (and every 8-byte-aligned offset in it)
     * is 8-byte aligned in the file, as the Python writer does */
    while (!hb.oom && hb.len % 8) sb_str(&hb, " ");
    if (hb.oom) {
        rc = ST_ERR_NOMEM;
        fsio_err(err, errlen, "out of memory building the header");
        goto done;
    }
    if (hb.len > ST_MAX_HEADER_BYTES) {
        fsio_err(err, errlen, "header of %zu bytes exceeds the %llu-byte limit readers accept",
                 hb.len, (unsigned long long)ST_MAX_HEADER_BYTES);
        goto done;
    }

    /* length, header, tensors in order: one atomic write (fsio.h); a tensor with a fill is made
     * in the one staging buffer as its turn comes */
    rc = ST_ERR_NOMEM;
    size_t staging = safetensors_writer_staging_bytes(w);
    wp.w = w;
    wp.head[0] = lenbuf;
    wp.head[1] = hb.p;
    wp.head_len[0] = 8;
    wp.head_len[1] = hb.len;
    if (staging && !(wp.staging = malloc(staging))) {
        fsio_err(err, errlen, "out of memory");
        goto done;
    }
    hlen = hb.len;
    for (i = 0; i < 8; i++) lenbuf[i] = (unsigned char)(hlen >> (8 * i));
    rc = ST_ERR_IO;
    if (fsio_write_atomic_stream(path, writer_next, &wp, err, errlen)) {
        if (wp.failed) fsio_err(err, errlen, "cannot make tensor '%.200s' for '%.200s'",
                                w->t[wp.k - 2].name, path);
        goto done;
    }
    rc = ST_OK;
done:
    free(wp.staging);
    free(hb.p);
    return rc;
}
