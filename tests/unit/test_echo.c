/* test_echo.c - user text echoed safely (server/utf8.c: cut on characters, cleaned for error
 * bodies, escaped for log lines), table-driven.
 */
#define _GNU_SOURCE
#include "test_util.h"
#include "utf8.h"

#include <stdio.h>
#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void test_cut(void)
{
    static const struct {
        const char *s;
        size_t max, want;
    } t[] = {
        {"abc", 2, 2},
        {"abc", 10, 3},
        {"\xc3\xa9\xc3\xa9", 3, 2},          /* é é: never half of the second */
        {"\xe2\x82\xac\xe2\x82\xac", 5, 3},  /* € € */
        {"\xf0\x9f\x98\x80x", 3, 0},          /* an emoji does not fit in 3 */
        {"\xf0\x9f\x98\x80x", 4, 4},
        {"\xffx", 1, 1},                      /* an invalid byte counts as one */
        {"", 5, 0},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        size_t k = utf8_cut(t[i].s, t[i].max);
        CHECK(k == t[i].want, "utf8_cut(case %zu, %zu) = %zu, want %zu", i, t[i].max, k, t[i].want);
    }
}

static void test_clean(void)
{
    static const struct {
        const char *s, *want;
    } t[] = {
        {"plain", "plain"},
        {"\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9"},
        {"ab\xe2\x82", "ab"},                         /* a character cut at the end: dropped */
        {"a\xffz", "a\xef\xbf\xbdz"},                 /* an invalid byte: U+FFFD */
        {"a\xe2\x82'z", "a\xef\xbf\xbd\xef\xbf\xbd'z"}, /* cut inside: replaced, not dropped */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate is invalid */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},     /* an overlong '/' */
    };
    char out[64];
    for (size_t i = 0; i < N_OF(t); i++) {
        utf8_clean(out, sizeof out, t[i].s);
        CHECK(strcmp(out, t[i].want) == 0, "utf8_clean case %zu: '%s'", i, out);
    }
    /* a small out ends on a character */
    size_t o = utf8_clean(out, 4, "\xc3\xa9\xc3\xa9");
    CHECK(o == 2 && strcmp(out, "\xc3\xa9") == 0, "utf8_clean into 4: %zu '%s'", o, out);
}

static void test_escape(void)
{
    static const struct {
        const char *s;
        size_t len;
        const char *want;
    } t[] = {
        {"/jobs/a\nGET /fake 200", 21, "/jobs/a\\x0aGET /fake 200"},
        {"a\rb\x1b[31m", 8, "a\\x0db\\x1b[31m"},
        {"tab\there", 8, "tab\\x09here"},
        {"back\\slash", 10, "back\\\\slash"},
        {"\xc3\xa9\xc2\x85", 4, "\xc3\xa9\\xc2\\x85"}, /* é kept, C1 NEL escaped */
        {"\xff\x7f", 2, "\\xff\\x7f"},
        {"nul\0x", 5, "nul\\x00x"},
    };
    char out[128];
    for (size_t i = 0; i < N_OF(t); i++) {
        size_t used = utf8_escape(out, sizeof out, t[i].s, t[i].len);
        CHECK(used == t[i].len && strcmp(out, t[i].want) == 0, "utf8_escape case %zu: '%s'", i,
              out);
    }
    /* an escape that does not fit ends the copy whole */
    size_t used = utf8_escape(out, 6, "ab\ncd", 5);
    CHECK(used == 2 && strcmp(out, "ab") == 0, "utf8_escape into 6: used %zu, '%s'", used, out);
}

int main(void)
{
    test_cut();
    test_clean();
    test_escape();
    return tu_finish("test_echo");
}
