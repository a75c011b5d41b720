/* test_safetensors.c - safetensors round trip, a hand-built file in the Python writer's layout,
 * rejection of every malformed-file class the reader validates, and atomic save behaviour.
 * All files live in a mkdtemp directory under /tmp that is removed at the end.
 */
#define _POSIX_C_SOURCE 200809L

#include "safetensors.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static const char *in_dir(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static int write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* u64 header length + header (space-padded to a multiple of pad, if pad > 0) + data.
 * data may be NULL: dlen bytes of a counting pattern then. */
static unsigned char *make_raw(const char *header, int pad, const void *data, size_t dlen,
                               size_t *n)
{
    size_t h = strlen(header), hp = h;
    unsigned char *b;
    *n = 0;
    if (pad > 0)
        while (hp % (size_t)pad) hp++;
    b = malloc(8 + hp + dlen + 1);
    if (!b) return NULL;
    put_u64le(b, hp);
    memcpy(b + 8, header, h);
    memset(b + 8 + h, ' ', hp - h);
    for (size_t i = 0; i < dlen; i++)
        b[8 + hp + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)i;
    *n = 8 + hp + dlen;
    return b;
}

static int count_tmp_files(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    int n = 0;
    if (!d) return -1;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void cleanup_dir(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    if (!d) return;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        const char *p = in_dir(de->d_name);
        if (unlink(p) != 0) rmdir(p); /* the tests only create empty subdirectories */
    }
    closedir(d);
    rmdir(g_dir);
}

/* open bytes as a file and expect rejection with status want and a message containing needle */
static void expect_reject(const char *label, const unsigned char *b, size_t n,
                          enum st_status want, const char *needle)
{
    const char *path = in_dir("reject.safetensors");
    struct safetensors *st = (struct safetensors *)&st; /* must be overwritten with NULL */
    char err[512] = "";
    enum st_status rc;

    CHECK(write_bytes(path, b, n), "%s: cannot write test file", label);
    rc = safetensors_open(&st, path, err, sizeof err);
    CHECK(rc == want, "%s: status %d (%s), want %d; err='%s'", label, rc,
          safetensors_status_name(rc), want, err);
    CHECK(st == NULL, "%s: handle not NULL on failure", label);
    CHECK(err[0] != '\0', "%s: empty error message", label);
    CHECK(!needle || strstr(err, needle), "%s: message '%s' lacks '%s'", label, err, needle);
    printf("  reject %-28s -> %s\n", label, err);
    if (rc == ST_OK) safetensors_free(st);
    unlink(path);
}

static void expect_reject_hdr(const char *label, const char *header, size_t dlen,
                              const char *needle)
{
    size_t n = 0;
    unsigned char *b = make_raw(header, 8, NULL, dlen, &n);
    CHECK(b != NULL, "%s: out of memory", label);
    if (b) expect_reject(label, b, n, ST_ERR_FORMAT, needle);
    free(b);
}

static void test_round_trip(void)
{
    float w[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
    int64_t steps[4] = {0, -1, INT64_MAX, INT64_MIN};
    uint8_t bytes[5] = {0, 1, 127, 128, 255};
    float scalar = 0.125f;
    int64_t s_w[2] = {2, 3}, s_steps[1] = {4}, s_bytes[1] = {5}, s_empty[2] = {0, 3};
    struct safetensors_writer *wr = NULL;
    struct safetensors *st = NULL;
    const struct st_tensor *t = NULL;
    const char *path = in_dir("round.safetensors");
    char err[256] = "";

    CHECK(safetensors_writer_init(&wr) == ST_OK, "writer_init");
    CHECK(safetensors_writer_add(wr, "conv.weight", ST_F32, 2, s_w, w) == ST_OK, "add F32");
    CHECK(safetensors_writer_add(wr, "steps", ST_I64, 1, s_steps, steps) == ST_OK, "add I64");
    CHECK(safetensors_writer_add(wr, "bytes", ST_U8, 1, s_bytes, bytes) == ST_OK, "add U8");
    CHECK(safetensors_writer_add(wr, "scale", ST_F32, 0, NULL, &scalar) == ST_OK, "add scalar");
    CHECK(safetensors_writer_add(wr, "empty", ST_F32, 2, s_empty, NULL) == ST_OK, "add empty");
    CHECK(safetensors_writer_meta(wr, "format", "pt") == ST_OK, "meta");
    CHECK(safetensors_writer_meta(wr, "note", "quote \" backslash \\ tab\t \xc3\xa9") == ST_OK,
          "meta with escapes");
    CHECK(safetensors_writer_meta(wr, "format", "ddpmd") == ST_OK, "meta replace");
    CHECK(safetensors_writer_save(wr, path, err, sizeof err) == ST_OK, "save: %s", err);
    safetensors_writer_free(wr);

    /* layout: header length a multiple of 8, padding is spaces */
    size_t n = 0;
    unsigned char *raw = tu_slurp(path, &n);
    CHECK(raw && n >= 8, "slurp");
    if (raw && n >= 8) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
        CHECK(hl % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hl);
        CHECK(raw[8] == '{', "header starts with '{'");
        CHECK(hl + 8 + 24 + 32 + 5 + 4 == n, "file size %zu", n);
        size_t last = 8 + (size_t)hl - 1;
        while (last > 8 && raw[last] == ' ') last--;
        CHECK(raw[last] == '}', "only spaces after the JSON");
    }
    free(raw);

    CHECK(safetensors_open(&st, path, err, sizeof err) == ST_OK, "open: %s", err);
    if (!st) return;
    CHECK(safetensors_count(st) == 5, "count %zu", safetensors_count(st));
    const char *order[5] = {"conv.weight", "steps", "bytes", "scale", "empty"};
    for (size_t i = 0; i < 5; i++) {
        CHECK(safetensors_get(st, i, &t) == ST_OK && !strcmp(t->name, order[i]),
              "order at %zu", i);
    }
    CHECK(safetensors_get(st, 5, &t) == ST_ERR_ARG && t == NULL, "get out of range");

    CHECK(safetensors_find(st, "conv.weight", &t) == ST_OK, "find conv.weight");
    CHECK(t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
              t->numel == 6 && t->nbytes == 24 && !memcmp(t->data, w, 24),
          "conv.weight contents");
    CHECK(safetensors_find(st, "steps", &t) == ST_OK && t->dtype == ST_I64 && t->numel == 4 &&
              t->nbytes == 32 && !memcmp(t->data, steps, 32),
          "steps contents");
    CHECK(safetensors_find(st, "bytes", &t) == ST_OK && t->dtype == ST_U8 && t->numel == 5 &&
              !memcmp(t->data, bytes, 5),
          "bytes contents");
    CHECK(safetensors_find(st, "scale", &t) == ST_OK && t->ndim == 0 && t->numel == 1 &&
              t->nbytes == 4 && !memcmp(t->data, &scalar, 4),
          "scalar contents");
    CHECK(safetensors_find(st, "empty", &t) == ST_OK && t->ndim == 2 && t->shape[0] == 0 &&
              t->shape[1] == 3 && t->numel == 0 && t->nbytes == 0,
          "empty tensor");
    CHECK(safetensors_find(st, "nope", &t) == ST_ERR_NOT_FOUND && t == NULL, "find absent");

    CHECK(safetensors_meta(st, "format") && !strcmp(safetensors_meta(st, "format"), "ddpmd"),
          "meta format (replaced)");
    CHECK(safetensors_meta(st, "note") &&
              !strcmp(safetensors_meta(st, "note"), "quote \" backslash \\ tab\t \xc3\xa9"),
          "meta with escapes round trips");
    CHECK(safetensors_meta(st, "missing") == NULL, "meta absent");

    float got[6];
    CHECK(safetensors_read_f32(st, "conv.weight", got, 6, err, sizeof err) == ST_OK &&
              !memcmp(got, w, sizeof got),
          "read_f32: %s", err);
    CHECK(safetensors_read_f32(st, "conv.weight", got, 5, err, sizeof err) == ST_ERR_FORMAT &&
              strstr(err, "expected 5"),
          "read_f32 count mismatch: %s", err);
    CHECK(safetensors_read_f32(st, "steps", got, 4, err, sizeof err) == ST_ERR_FORMAT &&
              strstr(err, "I64"),
          "read_f32 dtype mismatch: %s", err);
    CHECK(safetensors_read_f32(st, "nope", got, 1, err, sizeof err) == ST_ERR_NOT_FOUND &&
              strstr(err, "nope"),
          "read_f32 absent: %s", err);
    CHECK(safetensors_read_f32(st, "empty", NULL, 0, err, sizeof err) == ST_OK,
          "read_f32 of an empty tensor: %s", err);
    safetensors_free(st);
    unlink(path);

    /* an empty writer gives a valid empty file */
    CHECK(safetensors_writer_init(&wr) == ST_OK, "writer_init");
    CHECK(safetensors_writer_save(wr, path, err, sizeof err) == ST_OK, "save empty: %s", err);
    safetensors_writer_free(wr);
    CHECK(safetensors_open(&st, path, err, sizeof err) == ST_OK && safetensors_count(st) == 0 &&
              safetensors_meta(st, "format") == NULL,
          "open empty: %s", err);
    safetensors_free(st);
    unlink(path);
}

/* Bytes laid out as the Python/Rust writer does: compact JSON, __metadata__ first, tensors
 * listed in an order different from their offsets, header padded with spaces. */
static void test_python_layout(void)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
                      "\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                      "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[24,27]}}";
    const unsigned char data[27] = {
        0xe8, 0x03, 0, 0, 0, 0, 0, 0, /* step = 1000 */
        0x00, 0x00, 0x80, 0x3f,       /* 1.0 */
        0x00, 0x00, 0x20, 0xc0,       /* -2.5 */
        0x00, 0x00, 0x00, 0x3f,       /* 0.5 */
        0x00, 0x00, 0x40, 0x40,       /* 3.0 */
        1,    0,    1,                /* mask */
    };
    const char *path = in_dir("python.safetensors");
    char err[256] = "";
    size_t n = 0;

    /* padded (current writers) and unpadded (older writers: data starts unaligned) */
    for (int pad = 8; pad >= 0; pad -= 8) {
        unsigned char *b = make_raw(hdr, pad, data, sizeof data, &n);
        struct safetensors *st = NULL;
        const struct st_tensor *t = NULL;
        CHECK(b && write_bytes(path, b, n), "write python file");
        free(b);
        CHECK(safetensors_open(&st, path, err, sizeof err) == ST_OK, "open pad=%d: %s", pad, err);
        if (!st) continue;
        CHECK(safetensors_count(st) == 3, "count");
        CHECK(safetensors_get(st, 0, &t) == ST_OK && !strcmp(t->name, "embed.weight"),
              "header order kept");
        CHECK(safetensors_meta(st, "format") && !strcmp(safetensors_meta(st, "format"), "pt"),
              "meta format=pt");
        float f[4];
        CHECK(safetensors_read_f32(st, "embed.weight", f, 4, err, sizeof err) == ST_OK &&
                  f[0] == 1.0f && f[1] == -2.5f && f[2] == 0.5f && f[3] == 3.0f,
              "embed.weight values: %s", err);
        int64_t step = 0;
        CHECK(safetensors_find(st, "step", &t) == ST_OK && t->ndim == 0 && t->dtype == ST_I64,
              "step scalar");
        if (t) memcpy(&step, t->data, 8);
        CHECK(step == 1000, "step value %lld", (long long)step);
        CHECK(safetensors_find(st, "mask", &t) == ST_OK && t->dtype == ST_BOOL && t->nbytes == 3 &&
                  !memcmp(t->data, "\1\0\1", 3),
              "mask");
        safetensors_free(st);
    }
    unlink(path);
}

static void test_rejections(void)
{
    unsigned char b[128] = {0};
    size_t n;
    char err[256];
    struct safetensors *st = NULL;

    printf("rejections:\n");
    expect_reject("empty file", b, 0, ST_ERR_FORMAT, "empty");
    memset(b, 0, 5);
    expect_reject("shorter than 8 bytes", b, 5, ST_ERR_FORMAT, "too short");
    put_u64le(b, 4096);
    memset(b + 8, ' ', 100 - 8);
    expect_reject("header length > file", b, 100, ST_ERR_FORMAT, "truncated");
    put_u64le(b, (uint64_t)1 << 60);
    memcpy(b + 8, "{}      ", 8);
    expect_reject("header length 2^60", b, 16, ST_ERR_FORMAT, "limit");

    expect_reject_hdr("invalid JSON", "{\"a\": {\"dtype\": \"F32\",", 0, "JSON");
    expect_reject_hdr("JSON not an object", "[1, 2, 3]", 0, "object");
    expect_reject_hdr("leading whitespace", " {}", 0, "object");
    expect_reject_hdr("trailing garbage", "{} x", 0, "trailing");
    expect_reject_hdr("unknown dtype",
                      "{\"w\":{\"dtype\":\"Q4_0\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                      "unknown dtype 'Q4_0'");
    expect_reject_hdr("dtype not a string",
                      "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'");
    expect_reject_hdr("negative shape",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,0]}}", 0,
                      "shape[0] is -1");
    expect_reject_hdr("non-integer shape",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                      "shape[0] is 2.5");
    expect_reject_hdr("string in shape",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                      "shape[0] is a string");
    expect_reject_hdr("shape not an array",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
                      "\"shape\"");
    expect_reject_hdr("ndim > 8",
                      "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                      "\"data_offsets\":[0,1]}}",
                      1, "9 dimensions");
    expect_reject_hdr("numel overflow",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                      "\"data_offsets\":[0,0]}}",
                      0, "too large");
    expect_reject_hdr("offsets out of range",
                      "{\"conv.weight\":{\"dtype\":\"F32\",\"shape\":[25],"
                      "\"data_offsets\":[0,100]}}",
                      64, "'conv.weight': data_offsets [0, 100] exceed the 64-byte");
    expect_reject_hdr("offsets begin > end",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                      "begin > end");
    expect_reject_hdr("offsets not two integers",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                      "data_offsets");
    expect_reject_hdr("negative offset",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
                      "data_offsets[0] is -8");
    expect_reject_hdr("missing data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                      "data_offsets");
    expect_reject_hdr("size mismatch with shape",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
                      "needs 16 bytes");
    expect_reject_hdr("overlapping tensors",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, "overlap");
    expect_reject_hdr("same range twice",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      8, "overlap");
    expect_reject_hdr("hole in the data",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                      20, "hole");
    expect_reject_hdr("bytes after the last tensor",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
                      "belong to no tensor");
    expect_reject_hdr("duplicate names",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, "duplicate tensor name 'a'");
    expect_reject_hdr("duplicate field",
                      "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],"
                      "\"data_offsets\":[0,4]}}",
                      4, "twice");
    expect_reject_hdr("metadata value not a string", "{\"__metadata__\":{\"epoch\":1}}", 0,
                      "'epoch'");
    expect_reject_hdr("metadata not an object", "{\"__metadata__\":[\"x\"]}", 0, "__metadata__");
    expect_reject_hdr("entry not an object", "{\"w\":[1,2]}", 0, "'w'");
    expect_reject_hdr("control byte in header", "{\"a\x01\":1}", 0, "control byte");
    expect_reject_hdr("invalid UTF-8", "{\"\xc3\x28\":1}", 0, "UTF-8");
    expect_reject_hdr("\\u0000 in a name",
                      "{\"a\\u0000x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                      "u0000");

    /* truncated: a valid file (from the writer) with its last bytes cut */
    {
        float x[8] = {0};
        int64_t shp[1] = {8};
        struct safetensors_writer *w = NULL;
        const char *path = in_dir("full.safetensors");
        unsigned char *raw;
        CHECK(safetensors_writer_init(&w) == ST_OK, "writer_init");
        CHECK(safetensors_writer_add(w, "x", ST_F32, 1, shp, x) == ST_OK, "add");
        CHECK(safetensors_writer_save(w, path, err, sizeof err) == ST_OK, "save: %s", err);
        safetensors_writer_free(w);
        raw = tu_slurp(path, &n);
        CHECK(raw != NULL, "slurp");
        if (raw) {
            expect_reject("truncated data", raw, n - 3, ST_ERR_FORMAT, "exceed");
            expect_reject("truncated header", raw, 8 + 10, ST_ERR_FORMAT, "truncated");
        }
        free(raw);
        unlink(path);
    }

    /* not there at all: an I/O error, not a format error */
    err[0] = '\0';
    CHECK(safetensors_open(&st, in_dir("absent.safetensors"), err, sizeof err) == ST_ERR_IO &&
              st == NULL && strstr(err, "absent.safetensors"),
          "missing file: %s", err);
    printf("  reject %-28s -> %s\n", "missing file", err);
    CHECK(safetensors_open(&st, g_dir, err, sizeof err) == ST_ERR_IO && st == NULL,
          "directory: %s", err);
    /* a tiny errlen must not overflow, and NULL err is allowed */
    char tiny[4] = "xyz";
    CHECK(safetensors_open(&st, g_dir, tiny, 1) == ST_ERR_IO && tiny[0] == '\0',
          "errlen 1 truncates");
    CHECK(safetensors_open(&st, g_dir, NULL, 0) == ST_ERR_IO, "NULL err");
}

static void test_writer_args(void)
{
    struct safetensors_writer *w = NULL;
    float x[2] = {1, 2};
    int64_t s2[1] = {2}, neg[1] = {-2}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t huge[2] = {INT64_MAX, 2};

    CHECK(safetensors_writer_init(&w) == ST_OK, "writer_init");
    CHECK(safetensors_writer_add(w, "a", ST_F32, 1, s2, x) == ST_OK, "add a");
    CHECK(safetensors_writer_add(w, "a", ST_F32, 1, s2, x) == ST_ERR_ARG, "duplicate name");
    CHECK(safetensors_writer_add(w, "__metadata__", ST_F32, 1, s2, x) == ST_ERR_ARG,
          "reserved name");
    CHECK(safetensors_writer_add(w, NULL, ST_F32, 1, s2, x) == ST_ERR_ARG, "NULL name");
    CHECK(safetensors_writer_add(w, "b", ST_DTYPE_COUNT, 1, s2, x) == ST_ERR_ARG, "bad dtype");
    CHECK(safetensors_writer_add(w, "b", ST_F32, 9, nine, x) == ST_ERR_ARG, "ndim 9");
    CHECK(safetensors_writer_add(w, "b", ST_F32, -1, s2, x) == ST_ERR_ARG, "ndim -1");
    CHECK(safetensors_writer_add(w, "b", ST_F32, 1, neg, x) == ST_ERR_ARG, "negative dim");
    CHECK(safetensors_writer_add(w, "b", ST_F32, 2, huge, x) == ST_ERR_ARG, "numel overflow");
    CHECK(safetensors_writer_add(w, "b", ST_F32, 1, s2, NULL) == ST_ERR_ARG, "NULL data");
    CHECK(safetensors_writer_add(w, "\xff", ST_F32, 1, s2, x) == ST_ERR_ARG, "bad UTF-8 name");
    CHECK(safetensors_writer_meta(w, "k", "\xc3") == ST_ERR_ARG, "bad UTF-8 meta value");
    CHECK(safetensors_writer_meta(w, NULL, "v") == ST_ERR_ARG, "NULL meta key");
    safetensors_writer_free(w);
    safetensors_writer_free(NULL);
    safetensors_free(NULL);
    CHECK(safetensors_dtype_size(ST_BF16) == 2 && safetensors_dtype_size(ST_F64) == 8 &&
              safetensors_dtype_size(ST_BOOL) == 1 && safetensors_dtype_size(ST_DTYPE_COUNT) == 0,
          "dtype sizes");
    CHECK(!strcmp(safetensors_dtype_name(ST_BF16), "BF16") &&
              !strcmp(safetensors_dtype_name(ST_DTYPE_COUNT), "?"),
          "dtype names");
}

/* ---- limits on what a header may declare ---- */

/* a growable string for building large headers */
struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_add(struct sbuf *b, const char *s)
{
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) abort(); /* test harness only */
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

static void sb_rep(struct sbuf *b, const char *s, size_t times)
{
    for (size_t i = 0; i < times; i++) sb_add(b, s);
}

/* open header + 0 data bytes, expecting acceptance */
static int accepts_hdr(const char *label, const char *header)
{
    size_t n = 0;
    unsigned char *b = make_raw(header, 8, NULL, 0, &n);
    struct safetensors *st = NULL;
    char err[512] = "";
    enum st_status rc = ST_ERR_NOMEM;
    if (b && write_bytes(in_dir("limit.safetensors"), b, n))
        rc = safetensors_open(&st, in_dir("limit.safetensors"), err, sizeof err);
    CHECK(rc == ST_OK, "%s: refused: %s", label, err);
    safetensors_free(st);
    free(b);
    unlink(in_dir("limit.safetensors"));
    return rc == ST_OK;
}

/* n zero-size U8 tensors "t0".."t<n-1>" (plus metadata entries m0..m<nmeta-1>) */
static char *hdr_many(size_t n, size_t nmeta, size_t name_len, size_t key_len)
{
    struct sbuf b = {0};
    char tmp[64];
    sb_add(&b, "{\"__metadata__\":{");
    for (size_t i = 0; i < nmeta; i++) {
        snprintf(tmp, sizeof tmp, "%s\"m%zu", i ? "," : "", i);
        sb_add(&b, tmp);
        if (i == 0) sb_rep(&b, "k", key_len);
        sb_add(&b, "\":\"v\"");
    }
    sb_add(&b, "}");
    for (size_t i = 0; i < n; i++) {
        snprintf(tmp, sizeof tmp, ",\"t%zu", i);
        sb_add(&b, tmp);
        if (i == 0) sb_rep(&b, "n", name_len);
        sb_add(&b, "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}");
    }
    sb_add(&b, "}");
    return b.p;
}

/* Each limit of safetensors.h refuses the first value over it, with its name in the message, and
 * accepts the limit itself. Before the limits, all of these were accepted or parsed whole (a
 * header of 2^20 commas became 2^20 parser nodes; 65537 tensors or a 2000-byte name loaded). */
static void test_limits(void)
{
    struct sbuf b = {0};
    char *h;

    printf("limits:\n");
    /* depth: 9 levels; 2000 (past cJSON's own limit of 1000) */
    expect_reject_hdr("depth 9",
                      "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"x\":[[[[[[[0]]]]]]],"
                      "\"data_offsets\":[0,0]}}",
                      0, "ST_MAX_JSON_DEPTH");
    sb_add(&b, "{\"w\":");
    sb_rep(&b, "[", 2000);
    sb_rep(&b, "]", 2000);
    sb_add(&b, "}");
    expect_reject_hdr("depth 2000", b.p, 0, "ST_MAX_JSON_DEPTH");
    b.n = 0;
    /* brackets, braces, commas inside strings (and escaped quotes) do not count */
    CHECK(accepts_hdr("brackets in strings",
                      "{\"__metadata__\":{\"k\\\"[[[[[[[[[[\":\"[[[[[[[[[[{{{{{{{{{,,,,\\\"\"}}"),
          "brackets in strings");

    /* values: a shape of 2^20 + 1 zeros */
    sb_add(&b, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0");
    sb_rep(&b, ",0", (size_t)1 << 20);
    sb_add(&b, "],\"data_offsets\":[0,0]}}");
    expect_reject_hdr("2^20 values", b.p, 0, "ST_MAX_JSON_VALUES");
    b.n = 0;
    /* a metadata value of 2^21 commas is one value */
    sb_add(&b, "{\"__metadata__\":{\"k\":\"");
    sb_rep(&b, ",", (size_t)1 << 21);
    sb_add(&b, "\"}}");
    CHECK(accepts_hdr("2^21 commas in a string", b.p), "commas in a string counted as values");
    free(b.p);

    /* tensor count */
    h = hdr_many(ST_MAX_TENSORS, 0, 0, 0);
    CHECK(accepts_hdr("ST_MAX_TENSORS tensors", h), "at the tensor limit");
    free(h);
    h = hdr_many(ST_MAX_TENSORS + 1, 0, 0, 0);
    expect_reject_hdr("ST_MAX_TENSORS + 1", h, 0, "ST_MAX_TENSORS");
    free(h);
    /* name bytes: "t0" + padding to exactly the limit, then one more */
    h = hdr_many(1, 0, ST_MAX_NAME_BYTES - 2, 0);
    CHECK(accepts_hdr("name of ST_MAX_NAME_BYTES", h), "name at the limit");
    free(h);
    h = hdr_many(1, 0, ST_MAX_NAME_BYTES - 1, 0);
    expect_reject_hdr("name over ST_MAX_NAME_BYTES", h, 0, "ST_MAX_NAME_BYTES");
    free(h);
    h = hdr_many(1, 1, 0, ST_MAX_NAME_BYTES - 1);
    expect_reject_hdr("metadata key too long", h, 0, "ST_MAX_NAME_BYTES");
    free(h);
    /* metadata entries */
    h = hdr_many(1, ST_MAX_META_ENTRIES, 0, 0);
    CHECK(accepts_hdr("ST_MAX_META_ENTRIES entries", h), "metadata at the limit");
    free(h);
    h = hdr_many(1, ST_MAX_META_ENTRIES + 1, 0, 0);
    expect_reject_hdr("ST_MAX_META_ENTRIES + 1", h, 0, "ST_MAX_META_ENTRIES");
    free(h);

    /* the writer never makes a file the reader refuses */
    {
        struct safetensors_writer *w = NULL;
        char name[ST_MAX_NAME_BYTES + 2], key[32];
        int64_t zero[1] = {0};
        int ok = 1;
        CHECK(safetensors_writer_init(&w) == ST_OK, "writer_init");
        memset(name, 'n', sizeof name);
        name[ST_MAX_NAME_BYTES + 1] = '\0';
        CHECK(safetensors_writer_add(w, name, ST_U8, 1, zero, NULL) == ST_ERR_ARG,
              "writer took a name over ST_MAX_NAME_BYTES");
        CHECK(safetensors_writer_meta(w, name, "v") == ST_ERR_ARG,
              "writer took a metadata key over ST_MAX_NAME_BYTES");
        name[ST_MAX_NAME_BYTES] = '\0';
        CHECK(safetensors_writer_add(w, name, ST_U8, 1, zero, NULL) == ST_OK,
              "writer refused a name of ST_MAX_NAME_BYTES");
        for (int i = 0; i < ST_MAX_META_ENTRIES && ok; i++) {
            snprintf(key, sizeof key, "k%d", i);
            ok = safetensors_writer_meta(w, key, "v") == ST_OK;
        }
        CHECK(ok, "writer refused ST_MAX_META_ENTRIES metadata entries");
        CHECK(safetensors_writer_meta(w, "one-more", "v") == ST_ERR_ARG,
              "writer took metadata entry ST_MAX_META_ENTRIES + 1");
        CHECK(safetensors_writer_meta(w, "k0", "replaced") == ST_OK,
              "writer refused to replace a key at the limit");
        /* (the writer's tensor limit is not filled here: its duplicate-name check is linear per
         * add, so 65536 adds take seconds) */
        char err[512] = "";
        struct safetensors *st = NULL;
        CHECK(safetensors_writer_save(w, in_dir("full.safetensors"), err, sizeof err) == ST_OK,
              "save at the name and metadata limits: %s", err);
        CHECK(safetensors_open(&st, in_dir("full.safetensors"), err, sizeof err) == ST_OK &&
                  safetensors_count(st) == 1 && !strcmp(safetensors_meta(st, "k0"), "replaced"),
              "reading back a file at the name and metadata limits: %s", err);
        safetensors_free(st);
        safetensors_writer_free(w);
        unlink(in_dir("full.safetensors"));
    }
}

/* Every prefix of a valid file, every header byte flipped (two ways) and random data-length
 * changes: an error or a valid file, never a crash (the ASan build runs this); no prefix opens. */
static void test_hostile_bytes(void)
{
    float w[6] = {1, 2, 3, 4, 5, 6};
    int64_t s_w[2] = {2, 3}, s_b[1] = {3};
    uint8_t bytes[3] = {1, 2, 3};
    struct safetensors_writer *wr = NULL;
    struct safetensors *st = NULL;
    const char *path = in_dir("hostile.safetensors"), *src = in_dir("hostile_src.safetensors");
    char err[512];
    size_t n = 0;
    unsigned char *b, *c;
    int bad = 0, opened = 0, tries = 0;

    CHECK(safetensors_writer_init(&wr) == ST_OK, "writer_init");
    safetensors_writer_add(wr, "conv.weight", ST_F32, 2, s_w, w);
    safetensors_writer_add(wr, "b", ST_U8, 1, s_b, bytes);
    safetensors_writer_meta(wr, "spec", "{\"model\":{\"preset\":\"ddpm\"}}");
    CHECK(safetensors_writer_save(wr, src, err, sizeof err) == ST_OK, "save: %s", err);
    safetensors_writer_free(wr);
    b = tu_slurp(src, &n);
    CHECK(b && n > 16, "slurp");
    if (!b || n <= 16) {
        free(b);
        return;
    }
    c = malloc(n);
    for (size_t len = 0; len < n; len++) {
        enum st_status rc;
        write_bytes(path, b, len);
        rc = safetensors_open(&st, path, err, sizeof err);
        tries++;
        if (rc == ST_OK) opened++;
        else if (rc != ST_ERR_FORMAT || st) bad++;
        safetensors_free(st);
        st = NULL;
    }
    CHECK(opened == 0, "%d of %zu prefixes opened", opened, n);
    for (size_t at = 0; at < n - 6 * 4 - 3; at++) { /* the length and the header */
        for (int k = 0; k < 2; k++) {
            enum st_status rc;
            memcpy(c, b, n);
            c[at] ^= k ? 0x01 : 0x80;
            write_bytes(path, c, n);
            rc = safetensors_open(&st, path, err, sizeof err);
            tries++;
            if (rc != ST_OK && (rc != ST_ERR_FORMAT || st)) bad++;
            safetensors_free(st);
            st = NULL;
        }
    }
    CHECK(bad == 0, "prefixes and flips: %d of %d gave a status other than ok or format", bad,
          tries);
    free(b);
    free(c);
    unlink(path);
    unlink(src);
}

/* save twice to the same path, with failures in between: the file is replaced whole or not at
 * all, and no temp file survives */
static void test_atomic_save(void)
{
    const char *path = in_dir("ckpt.safetensors");
    struct safetensors_writer *w = NULL;
    struct safetensors *st = NULL;
    const struct st_tensor *t = NULL;
    float a[3] = {1, 2, 3}, b[5] = {5, 6, 7, 8, 9};
    int64_t sa[1] = {3}, sb[1] = {5};
    char err[512] = "", tmp[600];
    struct stat sbuf;
    size_t n1 = 0, n2 = 0;
    unsigned char *before, *after;

    CHECK(safetensors_writer_init(&w) == ST_OK, "writer_init");
    CHECK(safetensors_writer_add(w, "w", ST_F32, 1, sa, a) == ST_OK, "add");
    CHECK(safetensors_writer_save(w, path, err, sizeof err) == ST_OK, "first save: %s", err);
    safetensors_writer_free(w);

    CHECK(safetensors_writer_init(&w) == ST_OK, "writer_init");
    CHECK(safetensors_writer_add(w, "w", ST_F32, 1, sb, b) == ST_OK, "add");
    CHECK(safetensors_writer_meta(w, "step", "2") == ST_OK, "meta");
    CHECK(safetensors_writer_save(w, path, err, sizeof err) == ST_OK, "second save: %s", err);
    CHECK(count_tmp_files() == 0, "temp file left after save");
    CHECK(safetensors_open(&st, path, err, sizeof err) == ST_OK, "reopen: %s", err);
    if (st) {
        CHECK(safetensors_find(st, "w", &t) == ST_OK && t->numel == 5 &&
                  !memcmp(t->data, b, sizeof b),
              "second save replaced the first");
        CHECK(safetensors_meta(st, "step") && !strcmp(safetensors_meta(st, "step"), "2"),
              "new metadata");
        safetensors_free(st);
    }

    /* a foreign entry under an old-style temp name (PATH.tmp.PID): temporaries are unique
     * (mkstemp, fsio.h), so the save succeeds and leaves that entry alone */
    before = tu_slurp(path, &n1);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(mkdir(tmp, 0700) == 0, "mkdir temp name");
    err[0] = '\0';
    CHECK(safetensors_writer_save(w, in_dir("ckpt.safetensors"), err, sizeof err) == ST_OK,
          "save beside a foreign temp-like entry: %s", err);
    after = tu_slurp(path, &n2);
    CHECK(before && after && n1 == n2 && !memcmp(before, after, n1), "same contents rewritten");
    CHECK(stat(tmp, &sbuf) == 0 && S_ISDIR(sbuf.st_mode), "foreign temp-name entry not removed");
    rmdir(tmp);
    free(before);
    free(after);

    /* rename fails (target is a non-empty directory): the temp file must be removed */
    const char *dpath = in_dir("dir.safetensors");
    char inner[600];
    CHECK(mkdir(dpath, 0700) == 0, "mkdir target");
    snprintf(inner, sizeof inner, "%s/keep", dpath);
    CHECK(write_bytes(inner, "k", 1), "file in target dir");
    err[0] = '\0';
    CHECK(safetensors_writer_save(w, dpath, err, sizeof err) == ST_ERR_IO && strstr(err, "rename"),
          "save over a directory fails: %s", err);
    printf("  save over a directory  -> %s\n", err);
    CHECK(count_tmp_files() == 0, "temp file left after failed rename");
    unlink(inner);
    rmdir(dpath);

    /* non-existent directory */
    char nodir[300];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/ckpt.safetensors", g_dir);
    err[0] = '\0';
    CHECK(safetensors_writer_save(w, nodir, err, sizeof err) == ST_ERR_IO && err[0] &&
              strstr(err, "No such file"),
          "save to missing directory: %s", err);
    printf("  save to missing dir    -> %s\n", err);
    CHECK(safetensors_writer_save(w, "", err, sizeof err) == ST_ERR_ARG, "empty path");
    safetensors_writer_free(w);
    unlink(path);
    CHECK(count_tmp_files() == 0, "no temp files at the end");
}

/* a fill for test_fill_save: copies ctx's 4 floats, or fails when ctx is NULL */
static int fill_copy(void *ctx, void *dst)
{
    if (!ctx) return -1;
    memcpy(dst, ctx, 4 * sizeof(float));
    return 0;
}

/* tensors made as the file is written (checkpoints: one tensor held, not all): the same bytes
 * as tensors given whole; a failing fill fails the save and leaves the file there untouched */
static void test_fill_save(void)
{
    const char *a = in_dir("whole.safetensors"), *b = in_dir("filled.safetensors");
    float x[4] = {1, 2, 3, 4}, y[4] = {-1, 0.5f, 1e-20f, 7}, z[2] = {9, 8};
    int64_t s4[1] = {4}, s2[2] = {1, 2};
    struct safetensors_writer *w = NULL, *f = NULL;
    char err[512] = "";
    CHECK(safetensors_writer_init(&w) == ST_OK && safetensors_writer_init(&f) == ST_OK, "init");
    CHECK(safetensors_writer_add(w, "x", ST_F32, 1, s4, x) == ST_OK &&
              safetensors_writer_add(w, "z", ST_F32, 2, s2, z) == ST_OK &&
              safetensors_writer_add(w, "y", ST_F32, 1, s4, y) == ST_OK &&
              safetensors_writer_meta(w, "k", "v") == ST_OK,
          "add whole");
    CHECK(safetensors_writer_add_fill(f, "x", ST_F32, 1, s4, fill_copy, x) == ST_OK &&
              safetensors_writer_add(f, "z", ST_F32, 2, s2, z) == ST_OK &&
              safetensors_writer_add_fill(f, "y", ST_F32, 1, s4, fill_copy, y) == ST_OK &&
              safetensors_writer_meta(f, "k", "v") == ST_OK,
          "add filled");
    CHECK(safetensors_writer_staging_bytes(f) == 4 * sizeof(float) &&
              safetensors_writer_staging_bytes(w) == 0,
          "staging bytes %zu", safetensors_writer_staging_bytes(f));
    CHECK(safetensors_writer_add_fill(f, "n", ST_F32, 1, s4, NULL, x) == ST_ERR_ARG, "no fill");
    CHECK(safetensors_writer_save(w, a, err, sizeof err) == ST_OK, "save whole: %s", err);
    CHECK(safetensors_writer_save(f, b, err, sizeof err) == ST_OK, "save filled: %s", err);
    size_t na = 0, nb = 0;
    unsigned char *ra = tu_slurp(a, &na), *rb = tu_slurp(b, &nb);
    CHECK(ra && rb && na == nb && !memcmp(ra, rb, na), "filled file differs from the whole one");
    safetensors_writer_free(f);
    /* the second tensor's fill fails: the save fails naming it, the earlier file stays */
    CHECK(safetensors_writer_init(&f) == ST_OK, "init");
    CHECK(safetensors_writer_add_fill(f, "x", ST_F32, 1, s4, fill_copy, y) == ST_OK &&
              safetensors_writer_add_fill(f, "bad", ST_F32, 1, s4, fill_copy, NULL) == ST_OK,
          "add failing");
    err[0] = '\0';
    CHECK(safetensors_writer_save(f, b, err, sizeof err) == ST_ERR_IO && strstr(err, "'bad'"),
          "a failed fill: %s", err);
    free(rb);
    rb = tu_slurp(b, &nb);
    CHECK(rb && na == nb && !memcmp(ra, rb, na), "a failed save changed the file");
    CHECK(count_tmp_files() == 0, "temp file left after a failed fill");
    free(ra);
    free(rb);
    safetensors_writer_free(w);
    safetensors_writer_free(f);
    unlink(a);
    unlink(b);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/test_safetensors.XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    test_round_trip();
    test_python_layout();
    test_rejections();
    test_writer_args();
    test_limits();
    test_hostile_bytes();
    test_atomic_save();
    test_fill_save();
    cleanup_dir();
    return tu_finish("test_safetensors");
}
