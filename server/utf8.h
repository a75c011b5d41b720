/* utf8.h - user text made safe to echo: the length of a valid UTF-8 character (RFC 3629), a cut
 * that never splits one, a copy that is valid UTF-8 (error bodies) and an escaped copy with no
 * control character in it (log lines). Pure functions over bytes: fuzzed (tests/fuzz/fuzz_http.c).
 */
#ifndef DDPMD_UTF8_H
#define DDPMD_UTF8_H

#include <stddef.h>

/* the length (1..4) of the valid UTF-8 character at p (n >= 1 bytes left), or 0 when the bytes
 * there are none (no overlongs, no surrogates, nothing above U+10FFFF; a character cut short by
 * n is 0) */
size_t utf8_len(const unsigned char *p, size_t n);

/* the length of the longest prefix of the string s of at most max bytes that does not end
 * inside a valid multi-byte character: `printf("%.*s", (int)utf8_cut(s, 40), s)` quotes s
 * without splitting a character (invalid bytes count as one byte each) */
size_t utf8_cut(const char *s, size_t max);

/* s as valid UTF-8 in out (cap n >= 1, always NUL-terminated): each byte that starts no valid
 * character becomes U+FFFD, except a character cut short at the end of s (a truncated buffer),
 * which is dropped; when out is too small the copy ends on a character boundary. Returns the
 * bytes written; 3 * strlen(s) + 1 always suffices. */
size_t utf8_clean(char *out, size_t n, const char *s);

/* the first len bytes of s escaped for a log line in out (cap n >= 1, always NUL-terminated):
 * valid UTF-8 kept, except control characters (C0, DEL, C1) which become \xNN per byte, as do
 * invalid bytes; a backslash becomes "\\", so the escaped text reads back unambiguously. An
 * escape or character that does not fit ends the copy (never half of one). Returns how many
 * bytes of s were escaped (len when all fit). */
size_t utf8_escape(char *out, size_t n, const char *s, size_t len);

#endif
