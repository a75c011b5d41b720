/* parse.c - the pure request parsing of the HTTP layer (see parse.h): moved out of api.c
 * unchanged in behaviour so it can be unit-tested and fuzzed without a server.
 */
#include "parse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int api_parse_route(const char *pattern, const char *url, char *param, size_t n, char *param2,
                    size_t n2)
{
    const char *p = pattern, *u = url;
    int k = 0;
    while (*p && *u) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            size_t len = strcspn(u, "/.");
            char *dst = k == 0 ? param : param2;
            size_t cap = k == 0 ? n : n2;
            if (!close || k > 1 || len == 0 || len >= cap) return 0;
            memcpy(dst, u, len);
            dst[len] = 0;
            k++;
            p = close + 1;
            u += len;
        } else if (*p++ != *u++) {
            return 0;
        }
    }
    return *p == 0 && *u == 0;
}

int api_parse_int(const char *s, long long lo, long long hi, long long *v)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

int api_parse_image_index(const char *s, long long max, long long *k)
{
    long long x;
    if (!s || api_parse_int(s, 0, max - 1, &x) || (s[0] == '0' && s[1]) || s[0] == '+' ||
        s[0] == '-')
        return -1;
    /* strtoll also skips leading whitespace: "images/ 7.png" is not image 7 */
    if (s[0] < '0' || s[0] > '9') return -1;
    *k = x;
    return 0;
}

int api_parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len)
{
    unsigned long long a = 0, b = 0;
    int n = 0;
    if (strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return 0;
    h += 6;
    if (h[0] == '-') {
        if (h[1] < '0' || h[1] > '9' || sscanf(h + 1, "%llu%n", &b, &n) != 1 || h[1 + n]) return 0;
        if (b == 0 || size == 0) return -1;
        if (b > size) b = size;
        *off = size - b;
        *len = b;
        return 0;
    }
    /* %n is stored only when the literal '-' matched: n == 0 ("bytes=5") is bad syntax, and
     * h[n - 1] would read before h */
    if (h[0] < '0' || h[0] > '9' || sscanf(h, "%llu-%n", &a, &n) != 1 || n < 2 || h[n - 1] != '-')
        return 0;
    if (h[n] == 0) {
        b = size ? size - 1 : 0;
    } else {
        int m = 0;
        if (h[n] < '0' || h[n] > '9' || sscanf(h + n, "%llu%n", &b, &m) != 1 || h[n + m] || b < a)
            return 0;
    }
    if (a >= size) return -1;
    if (b >= size) b = size - 1;
    *off = a;
    *len = b - a + 1;
    return 0;
}

int api_parse_idem_key(const char *k)
{
    size_t kl = strlen(k);
    if (kl < 1 || kl > API_PARSE_IDEM_KEY_MAX) return -1;
    for (size_t i = 0; i < kl; i++)
        if (k[i] <= 0x20 || k[i] >= 0x7f) return -1;
    return 0;
}

int api_parse_json_content_type(const char *ct)
{
    return ct && strncasecmp(ct, "application/json", 16) == 0 &&
           (!ct[16] || ct[16] == ';' || ct[16] == ' ');
}

int api_parse_last_event_id(const char *s, long long *last)
{
    if (!s) {
        *last = 0;
        return 0;
    }
    return api_parse_int(s, 0, INT64_MAX, last);
}

int api_parse_path_prefix(const char *in, char *out, size_t n)
{
    size_t len = in ? strlen(in) : 0;
    if (n <= API_PARSE_PREFIX_MAX) return -1;
    out[0] = 0;
    if (!in) return -1;
    if (len == 0 || strcmp(in, "/") == 0) return 0;
    if (in[len - 1] == '/') len--; /* "/ddpmd/" is "/ddpmd" */
    if (in[0] != '/' || len > API_PARSE_PREFIX_MAX) return -1;
    static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-";
    for (size_t i = 0; i < len;) {
        size_t seg = 0; /* in[i] is a '/' */
        while (i + 1 + seg < len && in[i + 1 + seg] != '/') {
            if (!strchr(ok, in[i + 1 + seg])) return -1;
            seg++;
        }
        if (seg == 0 || (seg == 1 && in[i + 1] == '.') ||
            (seg == 2 && in[i + 1] == '.' && in[i + 2] == '.'))
            return -1;
        i += 1 + seg;
    }
    memcpy(out, in, len);
    out[len] = 0;
    return 0;
}

const char *api_parse_strip_prefix(const char *prefix, const char *url)
{
    size_t n = strlen(prefix);
    if (n == 0 || strncmp(url, prefix, n) != 0) return url;
    if (url[n] == 0) return "/";
    return url[n] == '/' ? url + n : url;
}
