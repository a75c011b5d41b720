/* utf8.c - user text made safe to echo (see utf8.h): one UTF-8 decoder for the spec's messages,
 * the problem bodies and the log lines.
 */
#include "utf8.h"

#include <stdio.h>
#include <string.h>

/* how many bytes at p (n left) follow the pattern of a character led by p[0], and in *need the
 * length that lead asks for (0: p[0] leads no character) */
static size_t utf8_match(const unsigned char *p, size_t n, size_t *need)
{
    unsigned c = p[0], lo = 0x80, hi = 0xBF;
    size_t k;
    if (c < 0x80) k = 1;
    else if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) k = 3;
    else if (c >= 0xF0 && c <= 0xF4) k = 4;
    else k = 0;
    *need = k;
    if (k <= 1) return k;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F; /* no surrogates */
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    size_t i = 1;
    if (i < n && p[1] >= lo && p[1] <= hi)
        for (i = 2; i < k && i < n && p[i] >= 0x80 && p[i] <= 0xBF; i++) {
        }
    return i;
}

size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t need, got = utf8_match(p, n, &need);
    return need && got == need ? need : 0;
}

size_t utf8_cut(const char *s, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, max + 4), i = 0;
    while (i < n) {
        size_t k = utf8_len(p + i, n - i);
        if (k == 0) k = 1; /* an invalid byte is one byte: cutting after it splits nothing */
        if (i + k > max) break;
        i += k;
    }
    return i;
}

size_t utf8_clean(char *out, size_t n, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s), i = 0, o = 0;
    while (i < len) {
        size_t need, got = utf8_match(p + i, len - i, &need);
        const char *src = (const char *)p + i;
        size_t k = need && got == need ? need : 0;
        if (!k && need > 1 && i + got == len) break; /* a character cut at the end: dropped */
        if (!k) src = "\xEF\xBF\xBD";                /* U+FFFD for the one byte */
        size_t w = k ? k : 3;
        if (o + w >= n) break;
        memcpy(out + o, src, w);
        o += w;
        i += k ? k : 1;
    }
    out[o] = 0;
    return o;
}

size_t utf8_escape(char *out, size_t n, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        size_t k = utf8_len(p + i, len - i);
        int control = k == 1   ? p[i] < 0x20 || p[i] == 0x7F
                      : k == 2 ? p[i] == 0xC2 && p[i + 1] < 0xA0 /* C1: U+0080..U+009F */
                               : 0;
        if (k && !control) {
            size_t w = p[i] == '\\' ? 2 : k;
            if (o + w >= n) break;
            memcpy(out + o, p[i] == '\\' ? "\\\\" : (const char *)p + i, w);
            o += w;
            i += k;
            continue;
        }
        size_t m = k ? k : 1; /* a control character: each of its bytes; an invalid byte */
        if (o + 4 * m >= n) break;
        for (size_t j = 0; j < m; j++, o += 4) snprintf(out + o, 5, "\\x%02x", p[i + j]);
        i += m;
    }
    out[o] = 0;
    return i;
}
