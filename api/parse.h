/* parse.h - the pure request parsing of the HTTP layer (api.c): route patterns, Range headers,
 * integer query parameters, image indexes, Idempotency-Key and Content-Type checks. No I/O and no
 * libmicrohttpd here, so the unit tests and tests/fuzz/fuzz_http.c drive exactly this code.
 */
#ifndef DDPMD_API_PARSE_H
#define DDPMD_API_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* the longest Idempotency-Key accepted, in bytes */
#define API_PARSE_IDEM_KEY_MAX 128

/* 1 when url matches pattern, else 0. A "{name}" in pattern matches one non-empty run of url up
 * to the next '/' or '.' (ids never hold either); the first capture goes to param (cap n), the
 * second to param2 (cap n2), each NUL-terminated; a capture that does not fit (len >= cap), or a
 * third one, is no match. On no match param/param2 may hold a partial capture. */
int api_parse_route(const char *pattern, const char *url, char *param, size_t n, char *param2,
                    size_t n2);

/* s as a base-10 integer in [lo, hi] -> *v, 0; -1 (*v untouched) when s is NULL, empty, not a
 * whole number (trailing bytes), out of range or overflows. Like strtoll it takes leading
 * whitespace and a sign. */
int api_parse_int(const char *s, long long lo, long long hi, long long *v);

/* an image index {k} of /samples/{id}/images/{k}.png: a plain decimal in [0, max) without sign
 * or leading zeros (so it never names another file) -> *k, 0; else -1 */
int api_parse_image_index(const char *s, long long max, long long *k);

/* one "bytes=A-B", "bytes=A-" or "bytes=-N" Range of a size-byte file. Returns 0 with
 * [*off, *off + *len) set inside the file when it parses and is satisfiable; 0 with *off and *len
 * untouched when it is to be ignored (several ranges, other units, bad syntax, B < A: RFC 9110
 * allows serving the whole file); -1 when it is unsatisfiable (416: A >= size, "bytes=-0", an
 * empty file). */
int api_parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len);

/* 0 when k is a valid Idempotency-Key: 1 to API_PARSE_IDEM_KEY_MAX bytes, each printable ASCII
 * other than space (0x21..0x7e); else -1 */
int api_parse_idem_key(const char *k);

/* 1 when the Content-Type value ct (may be NULL) is application/json, any case, optionally
 * followed by ';' parameters or a space; else 0 */
int api_parse_json_content_type(const char *ct);

/* a Last-Event-ID (header or ?last_event_id=) -> *last, 0: an integer >= 0; -1 otherwise. NULL
 * means none was given: *last = 0, 0. */
int api_parse_last_event_id(const char *s, long long *last);

/* the longest path prefix (--path-prefix), in bytes */
#define API_PARSE_PREFIX_MAX 64

/* a --path-prefix value -> its normal form in out (cap n > API_PARSE_PREFIX_MAX), 0: "" for none
 * ("" or "/"), else "/seg[/seg...]" without the trailing slash, each segment one or more of
 * [A-Za-z0-9._~-] and neither "." nor ".."; -1 (out = "") for anything else (an empty segment,
 * a '%', '?', a space, too long) */
int api_parse_path_prefix(const char *in, char *out, size_t n);

/* the path the routes see for url under prefix (a normal form, may be ""): the rest of url when
 * it starts with prefix followed by '/' (prefix itself: "/"), else url unchanged, so a server
 * behind a proxy that strips the prefix and one reached with it route the same */
const char *api_parse_strip_prefix(const char *prefix, const char *url);

#endif
