/* fuzz_safetensors.c - safetensors_open (header length, JSON header, tensor table, data section)
 * on arbitrary bytes, then every accessor over what it accepted. Invariants: each tensor holds
 * numel * dtype size bytes and together they are exactly the data section after the header;
 * lookups by name find the same tensor; F32 tensors read back through safetensors_read_f32; the
 * streamed open (safetensors_open_stream) accepts what the whole open accepts, and its
 * tensors, read from the file, are the same bytes. */
#include "fuzz.h"
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int fuzz_safetensors(const uint8_t *data, size_t size)
{
    const char *path = fuzz_bytes_path(0, data, size);
    struct safetensors *st = NULL;
    char err[512];
    err[0] = '\0';
    enum st_status rc = safetensors_open(&st, path, err, sizeof err);
    if (rc != ST_OK) {
        if (st) fuzz_fail("safetensors", "failed open (%d) left *out set", (int)rc);
        if (!err[0]) fuzz_fail("safetensors", "failed open (%d) without a message", (int)rc);
        return 0;
    }
    size_t n = safetensors_count(st), total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = NULL, *f = NULL;
        if (safetensors_get(st, i, &t) != ST_OK || !t)
            fuzz_fail("safetensors", "tensor %zu of %zu missing", i, n);
        if (t->ndim < 0 || t->ndim > ST_MAX_NDIM)
            fuzz_fail("safetensors", "'%s' has ndim %d", t->name, t->ndim);
        if ((size_t)t->numel * safetensors_dtype_size(t->dtype) != t->nbytes)
            fuzz_fail("safetensors", "'%s': numel %lld x %zu != %zu bytes", t->name,
                      (long long)t->numel, safetensors_dtype_size(t->dtype), t->nbytes);
        total += t->nbytes;
        if (total > size) fuzz_fail("safetensors", "tensors hold more bytes than the file");
        (void)fuzz_touch(t->data, t->nbytes);
        (void)fuzz_touch(t->name, strlen(t->name) + 1);
        if (safetensors_find(st, t->name, &f) != ST_OK || f != t)
            fuzz_fail("safetensors", "find('%s') does not return tensor %zu", t->name, i);
        if (t->dtype == ST_F32) {
            float *buf = malloc(t->nbytes + 1);
            if (buf && safetensors_read_f32(st, t->name, buf, t->numel, err, sizeof err) != ST_OK)
                fuzz_fail("safetensors", "read_f32('%s'): %s", t->name, err);
            free(buf);
        }
    }
    /* accepted means: 8-byte length, header, and tensors covering the rest exactly */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    if (size < 8 || hlen > size - 8 || total != size - 8 - hlen)
        fuzz_fail("safetensors", "tensors hold %zu bytes, the data section is %llu", total,
                  size < 8 || hlen > size - 8 ? 0ull : (unsigned long long)(size - 8 - hlen));
    const char *keys[] = {"format", "spec", "step", "threads", ""};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const char *v = safetensors_meta(st, keys[k]);
        if (v) (void)fuzz_touch(v, strlen(v) + 1);
    }
    struct safetensors *ss = NULL;
    rc = safetensors_open_stream(&ss, path, err, sizeof err);
    if (rc != ST_OK) fuzz_fail("safetensors", "the streamed open refused what the whole one "
                               "took: %s", err);
    if (safetensors_count(ss) != n)
        fuzz_fail("safetensors", "streamed: %zu tensors, whole: %zu", safetensors_count(ss), n);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = NULL, *u = NULL;
        (void)safetensors_get(st, i, &t);
        if (safetensors_get(ss, i, &u) != ST_OK || !u || strcmp(u->name, t->name) ||
            u->nbytes != t->nbytes || u->data)
            fuzz_fail("safetensors", "streamed tensor %zu differs from the whole one's", i);
        unsigned char *b = malloc(u->nbytes + 1);
        if (!b) continue;
        if (safetensors_read(ss, u, b, err, sizeof err) != ST_OK)
            fuzz_fail("safetensors", "streamed read of '%s': %s", u->name, err);
        if (u->nbytes && memcmp(b, t->data, u->nbytes))
            fuzz_fail("safetensors", "streamed '%s' read other bytes", u->name);
        free(b);
    }
    safetensors_free(ss);
    safetensors_free(st);
    return 0;
}
