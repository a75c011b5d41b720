/* fuzz_http.c - what the HTTP layer parses itself (libmicrohttpd parses the request line and
 * headers): checkpoint ids of GET /checkpoints/{id}, job ids ({id}, ?after=), the ?state= filter,
 * the bearer-token file, and api/parse.c: route patterns, Range headers, integer parameters,
 * image indexes, Idempotency-Key and Content-Type (and with it server/utf8.c, the cutter and
 * escaper of the text echoed into error bodies and log lines). Byte 0 picks which (mod 10); the rest is the
 * input. Invariants: an accepted checkpoint id is exactly "<valid job id>-<step>" with a
 * canonical step >= 0; a valid job id is 17 characters; a parsed state names itself; a token file
 * loads 1.. tokens with 16+ character secrets, or fails with a message and nothing allocated; a
 * matched route's captures are non-empty, hold no '/' or '.', and put back into the pattern give
 * the url; a parsed range lies within the file and equals a reference parser's; a parsed integer
 * is in range and round-trips through its decimal form; the key and content-type checks agree
 * with reference predicates; a cut ends on a character, a cleaned copy is valid UTF-8, an
 * escaped one holds no control byte. (POST /train bodies are training specs: fuzz_spec.) */
#include "api.h"
#include "fuzz.h"
#include "jobs.h"
#include "parse.h"
#include "pool.h"
#include "utf8.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the route patterns of api.c's table (a {..} is one capture) */
static const char *const patterns[] = {
    "/train", "/jobs", "/jobs/{id}", "/jobs/{id}/cancel", "/jobs/{id}/events",
    "/jobs/{id}/checkpoints", "/jobs/{id}/logs", "/jobs/{id}/loss.csv", "/jobs/{id}/loss.png",
    "/checkpoints/{id}", "/samples", "/samples/{id}", "/samples/{id}.png",
    "/samples/{id}/images/{k}.png", "/datasets", "/devices", "/healthz", "/readyz",
    "/openapi.yaml",
};
#define N_PATTERNS (sizeof patterns / sizeof patterns[0])

static void check_capture(const char *url, const char *cap, size_t n)
{
    size_t len = strnlen(cap, n);
    if (len == 0 || len >= n || strpbrk(cap, "/."))
        fuzz_fail("http", "url '%.200s': capture '%.100s' (%zu bytes, cap %zu)", url, cap, len, n);
    /* a capture that passes the id check is a plain job id: no way out of the job folders */
    if (pool_job_id_valid(cap) && strlen(cap) != 17)
        fuzz_fail("http", "url '%.200s': capture '%.100s' passes as a job id", url, cap);
}

/* the url against every pattern: on a match the captures are well formed and, put back into the
 * pattern, give the url again */
static void fuzz_route(const char *url)
{
    for (size_t i = 0; i < N_PATTERNS; i++) {
        char p1[96], p2[32], again[4096 + 256];
        memset(p1, 0x55, sizeof p1);
        memset(p2, 0x55, sizeof p2);
        if (!api_parse_route(patterns[i], url, p1, sizeof p1, p2, sizeof p2)) continue;
        const char *p = patterns[i];
        size_t o = 0;
        int k = 0;
        while (*p) {
            if (*p == '{') {
                const char *cap = k == 0 ? p1 : p2;
                check_capture(url, cap, k == 0 ? sizeof p1 : sizeof p2);
                o += (size_t)snprintf(again + o, sizeof again - o, "%s", cap);
                k++;
                p = strchr(p, '}') + 1;
            } else {
                again[o++] = *p++;
            }
        }
        again[o] = 0;
        if (strcmp(again, url) != 0)
            fuzz_fail("http", "url '%.200s' matched '%s' but rebuilds as '%.200s'", url,
                      patterns[i], again);
    }
}

/* the digits at *p as an unsigned number, saturating like strtoull; NULL when there is none */
static const char *ref_digits(const char *p, unsigned long long *v)
{
    if (*p < '0' || *p > '9') return NULL;
    unsigned long long x = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        x = x > (ULLONG_MAX - d) / 10 ? ULLONG_MAX : x * 10 + d;
    }
    *v = x;
    return p;
}

/* RFC 9110's single byte range, written independently of api_parse_range: 1 a range, 0 ignore,
 * -1 unsatisfiable */
static int ref_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len)
{
    unsigned long long a, b;
    if (strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return 0;
    const char *p = h + 6;
    if (*p == '-') {
        const char *e = ref_digits(p + 1, &b);
        if (!e || *e) return 0;
        if (b == 0 || size == 0) return -1;
        *len = b > size ? size : b;
        *off = size - *len;
        return 1;
    }
    const char *e = ref_digits(p, &a);
    if (!e || *e != '-') return 0;
    e++;
    if (*e) {
        const char *f = ref_digits(e, &b);
        if (!f || *f || b < a) return 0;
    } else {
        b = ULLONG_MAX;
    }
    if (a >= size) return -1;
    if (b >= size) b = size - 1;
    *off = a;
    *len = b - a + 1;
    return 1;
}

/* bytes 0..7: the file size (byte 0's top bit set: a small size, byte 0 & 0x7f); the rest the
 * Range header */
static void fuzz_range(const uint8_t *d, size_t n)
{
    if (n < 8) return;
    uint64_t size = 0;
    if (d[0] & 0x80) {
        size = d[0] & 0x7f;
    } else {
        for (int i = 0; i < 8; i++) size = size << 8 | d[i];
    }
    char *h = malloc(n - 8 + 1);
    if (!h) return;
    memcpy(h, d + 8, n - 8);
    h[n - 8] = 0;
    const uint64_t U = 0x5555555555555555ull;
    uint64_t off = U, len = U, roff = 0, rlen = 0;
    int rc = api_parse_range(h, size, &off, &len);
    int ref = ref_range(h, size, &roff, &rlen);
    int moved = off != U || len != U;
    if (rc != 0 && rc != -1) fuzz_fail("http", "range '%.200s': rc %d", h, rc);
    if ((rc == -1) != (ref == -1) || (rc == -1 && moved) || (rc == 0 && !moved && ref == 1) ||
        (rc == 0 && moved && (ref != 1 || off != roff || len != rlen)))
        fuzz_fail("http", "range '%.200s' of %" PRIu64 ": rc %d off %" PRIu64 " len %" PRIu64
                  "; the reference %d off %" PRIu64 " len %" PRIu64, h, size, rc, off, len, ref,
                  roff, rlen);
    if (rc == 0 && moved && (len == 0 || off >= size || len > size - off))
        fuzz_fail("http", "range '%.200s' of %" PRIu64 " -> off %" PRIu64 " len %" PRIu64
                  " outside the file", h, size, off, len);
    free(h);
}

/* api_parse_int over several [lo, hi] (byte 1 of the string picks; image: the image index):
 * an accepted string is [space][sign]digits whose value is in range and prints back as the
 * digits without leading zeros; a refused one of that shape is out of range */
static void fuzz_int(const char *s, int image)
{
    static const long long bounds[][2] = {
        {1, 200}, {0, INT64_MAX}, {LLONG_MIN, LLONG_MAX}, {-5, 5}, {0, 0},
    };
    long long lo = 0, hi = 1023, v = 0x5555;
    int rc;
    if (image) {
        rc = api_parse_image_index(s, 1024, &v);
    } else {
        size_t b = s[0] ? (unsigned char)s[0] % (sizeof bounds / sizeof bounds[0]) : 0;
        lo = bounds[b][0];
        hi = bounds[b][1];
        if (s[0]) s++;
        rc = api_parse_int(s, lo, hi, &v);
    }
    /* the reference: shape, sign, magnitude (saturating) */
    const char *p = s;
    if (!image)
        while (isspace((unsigned char)*p)) p++;
    int neg = 0;
    if (!image && (*p == '+' || *p == '-')) neg = *p++ == '-';
    const char *digits = p;
    unsigned long long mag = 0;
    const char *e = ref_digits(p, &mag);
    int shape = e && !*e;
    if (image && shape && digits[0] == '0' && digits[1]) shape = 0;
    int in = 0;
    long long x = 0;
    if (shape) {
        if (!neg && mag <= (unsigned long long)LLONG_MAX) {
            x = (long long)mag;
            in = 1;
        } else if (neg && mag <= (unsigned long long)LLONG_MAX + 1) {
            x = mag == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)mag;
            in = 1;
        }
        in = in && x >= lo && x <= hi;
    }
    if ((rc == 0) != in || (rc == 0 && v != x) || (rc != 0 && v != 0x5555))
        fuzz_fail("http", "integer '%.100s' in [%lld, %lld]: rc %d value %lld; the reference %d "
                  "value %lld", s, lo, hi, rc, v, in, x);
    if (rc == 0) {
        char again[32];
        snprintf(again, sizeof again, "%lld", v);
        long long w = 0x5555;
        if (api_parse_int(again, lo, hi, &w) || w != v)
            fuzz_fail("http", "integer %lld does not round-trip ('%s' -> %lld)", v, again, w);
    }
}

/* whether the n bytes at p are valid UTF-8 (by utf8_len) */
static int valid_utf8(const char *p, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_len((const unsigned char *)p + i, n - i))) return 0;
    return 1;
}

/* server/utf8.c on any bytes: s is them up to the first NUL */
static void fuzz_utf8(const uint8_t *data, size_t size, const char *s)
{
    size_t len = strlen(s);
    for (size_t max = 0; max <= len + 1; max += 1 + max / 3) {
        size_t k = utf8_cut(s, max);
        if (k > max || k > len || (k < len && k + 4 <= max))
            fuzz_fail("http", "utf8_cut of %zu bytes at %zu: %zu", len, max, k);
        if (valid_utf8(s, len) && !valid_utf8(s, k))
            fuzz_fail("http", "utf8_cut split a character at %zu of '%.200s'", k, s);
    }
    char out[256];
    for (size_t cap = 1; cap <= sizeof out; cap *= 4) {
        size_t o = utf8_clean(out, cap, s);
        if (o >= cap || out[o] || strlen(out) != o || !valid_utf8(out, o))
            fuzz_fail("http", "utf8_clean into %zu: %zu bytes, not valid UTF-8", cap, o);
        if (cap == sizeof out && len < 64 && valid_utf8(s, len) && strcmp(out, s) != 0)
            fuzz_fail("http", "utf8_clean changed valid text '%s'", s);
        size_t used = utf8_escape(out, cap, (const char *)data, size);
        o = strlen(out);
        if (used > size || o >= cap || !valid_utf8(out, o))
            fuzz_fail("http", "utf8_escape into %zu: used %zu of %zu, %zu bytes out", cap, used,
                      size, o);
        for (size_t i = 0; i < o; i++)
            if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f ||
                ((unsigned char)out[i] == 0xC2 && (unsigned char)out[i + 1] < 0xA0))
                fuzz_fail("http", "utf8_escape left control byte \\x%02x at %zu", out[i], i);
    }
}

int fuzz_http(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0] % 10;
    if (mode == 3) { /* the token file: bytes as they are, NULs included */
        const char *path = fuzz_bytes_path(0, data + 1, size - 1);
        /* private, as api_tokens_load demands of a file of ours (the memfd is made 0777) */
        if (chmod(path, 0600)) fuzz_fail("http", "chmod %s failed", path);
        struct api_token *tok = NULL;
        int n = -1;
        char err[512] = "";
        if (api_tokens_load(path, &tok, &n, err, sizeof err) == 0) {
            if (!tok || n < 1) fuzz_fail("http", "tokens loaded: %d at %p", n, (void *)tok);
            for (int i = 0; i < n; i++)
                if (!tok[i].name[0] || strlen(tok[i].secret) < 16 ||
                    !memchr(tok[i].name, 0, sizeof tok[i].name))
                    fuzz_fail("http", "token %d: name '%.64s', a %zu-character secret", i,
                              tok[i].name, strlen(tok[i].secret));
            free(tok);
        } else if (tok || n != 0 || !err[0]) {
            fuzz_fail("http", "failed token load left %d tokens at %p, message '%s'", n,
                      (void *)tok, err);
        }
        return 0;
    }
    char *s = malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    if (mode == 0) {
        char jid[JOBS_ID_LEN], again[64];
        int64_t step = -1;
        if (pool_checkpoint_id_parse(s, jid, sizeof jid, &step) == 0) {
            snprintf(again, sizeof again, "%s-%" PRId64, jid, step);
            if (!pool_job_id_valid(jid) || step < 0 || strcmp(again, s) != 0)
                fuzz_fail("http", "checkpoint id '%s' parsed as '%s' step %" PRId64, s, jid, step);
        }
    } else if (mode == 1) {
        if (pool_job_id_valid(s) && strlen(s) != 17)
            fuzz_fail("http", "job id '%s' of %zu characters accepted", s, strlen(s));
    } else if (mode == 2) {
        int k = job_state_parse(s);
        if (k >= 0 && strcmp(job_state_name((enum job_state)k), s) != 0)
            fuzz_fail("http", "state '%s' parsed as %d (%s)", s, k,
                      job_state_name((enum job_state)k));
    } else if (mode == 4) {
        fuzz_route(s);
    } else if (mode == 5) {
        fuzz_range(data + 1, size - 1);
    } else if (mode == 6 || mode == 7) {
        fuzz_int(s, mode == 7);
    } else if (mode == 8) {
        int ok = 1;
        size_t kl = strlen(s);
        for (size_t i = 0; i < kl; i++) ok = ok && s[i] >= 0x21 && s[i] <= 0x7e;
        ok = ok && kl >= 1 && kl <= API_PARSE_IDEM_KEY_MAX;
        if ((api_parse_idem_key(s) == 0) != ok)
            fuzz_fail("http", "Idempotency-Key '%.200s': parsed %d, expected valid %d", s,
                      api_parse_idem_key(s), ok);
    } else {
        fuzz_utf8(data + 1, size - 1, s);
        static const char want[] = "application/json";
        int ok = strlen(s) >= 16;
        for (size_t i = 0; ok && i < 16; i++) ok = tolower((unsigned char)s[i]) == want[i];
        ok = ok && (s[16] == 0 || s[16] == ';' || s[16] == ' ');
        if (api_parse_json_content_type(s) != ok)
            fuzz_fail("http", "Content-Type '%.200s': %d, expected %d", s,
                      api_parse_json_content_type(s), ok);
    }
    free(s);
    return 0;
}
