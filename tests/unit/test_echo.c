/* test_echo.c - user text echoed safely (server/utf8.c: cut on characters, cleaned for error
 * bodies, escaped for log lines) and the token file refused rather than misread (api_tokens_load:
 * over-long fields and lines, a file others may read), table-driven.
 */
#define _GNU_SOURCE
#include "api.h"
#include "test_util.h"
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* text written to a new file of mode; api_tokens_load's status, and its message in err */
static int load(const char *text, mode_t mode, char *err, size_t n, struct api_token **tok, int *nt)
{
    char path[] = "/tmp/ddpmd-test-tokens-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -2;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text) || fchmod(fd, mode)) {
        close(fd);
        unlink(path);
        return -2;
    }
    close(fd);
    err[0] = 0;
    int rc = api_tokens_load(path, tok, nt, err, n);
    unlink(path);
    return rc;
}

static void test_tokens(void)
{
    char err[600], text[2400], x255[256], x256[257];
    struct api_token *tok = NULL;
    int n = 0;
    memset(x255, 'X', 255);
    x255[255] = 0;
    memset(x256, 'X', 256);
    x256[256] = 0;

    /* a good file still loads, with its comment, blank line and admin flag */
    snprintf(text, sizeof text, "# name secret [admin]\nalice 0123456789abcdef0123\n\n"
                                "root %s admin # comment\n", x255);
    int rc = load(text, 0600, err, sizeof err, &tok, &n);
    CHECK(rc == 0 && n == 2 && !tok[0].admin && tok[1].admin && strlen(tok[1].secret) == 255 &&
              strcmp(tok[1].name, "root") == 0,
          "good file: rc %d, n %d, err '%s'", rc, n, err);
    free(tok);
    tok = NULL;

    /* the trial's case: a 260-character secret whose tail reads "admin" */
    snprintf(text, sizeof text, "alice 0123456789abcdef0123\neve %sadmin\n", x255);
    rc = load(text, 0600, err, sizeof err, &tok, &n);
    CHECK(rc == -1 && !tok && n == 0 && strstr(err, ":2: ") &&
              strstr(err, "secret of eve is longer than 255"),
          "over-long secret: rc %d, n %d, err '%s'", rc, n, err);
    snprintf(text, sizeof text, "eve %s\n", x256);
    rc = load(text, 0600, err, sizeof err, &tok, &n);
    CHECK(rc == -1 && strstr(err, ":1: ") && strstr(err, "longer than 255"),
          "256-character secret: rc %d, err '%s'", rc, err);
    /* a name over 63 characters */
    snprintf(text, sizeof text, "%.64s 0123456789abcdef0123\n", x255);
    rc = load(text, 0600, err, sizeof err, &tok, &n);
    CHECK(rc == -1 && strstr(err, ":1: the name is longer than 63"), "long name: '%s'", err);
    /* a line over API_TOKEN_LINE_MAX (not read as two lines) */
    char *big = malloc(3000);
    memset(big, ' ', 2990);
    memcpy(big, "alice 0123456789abcdef0123", 26);
    snprintf(big + 2990, 10, "bob\n");
    rc = load(big, 0600, err, sizeof err, &tok, &n);
    free(big);
    CHECK(rc == -1 && strstr(err, ":1: the line is longer than 1024"), "long line: '%s'", err);
    /* a flag that is not "admin", a fourth field */
    rc = load("alice 0123456789abcdef0123 administrator\n", 0600, err, sizeof err, &tok, &n);
    CHECK(rc == -1 && strstr(err, ":1: expected"), "flag: '%s'", err);
    rc = load("alice 0123456789abcdef0123 admin x\n", 0600, err, sizeof err, &tok, &n);
    CHECK(rc == -1 && strstr(err, ":1: expected"), "fourth field: '%s'", err);

    /* a file of ours that group or others may read (or write) */
    static const mode_t open_modes[] = {0644, 0640, 0604, 0620, 0602};
    for (size_t i = 0; i < N_OF(open_modes); i++) {
        rc = load("alice 0123456789abcdef0123\n", open_modes[i], err, sizeof err, &tok, &n);
        CHECK(rc == -1 && !tok && strstr(err, "open to group or others") &&
                  strstr(err, "chmod 600"),
              "mode %04o: rc %d, err '%s'", (unsigned)open_modes[i], rc, err);
    }
    rc = load("alice 0123456789abcdef0123\n", 0400, err, sizeof err, &tok, &n);
    CHECK(rc == 0 && n == 1, "mode 0400: rc %d, err '%s'", rc, err);
    free(tok);
}

int main(void)
{
    test_cut();
    test_clean();
    test_escape();
    test_tokens();
    return tu_finish("test_echo");
}
