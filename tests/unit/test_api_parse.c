/* test_api_parse.c - api/parse.c, table-driven: route patterns with their captures, Range
 * headers, integers, image indexes, Idempotency-Key, Content-Type, Last-Event-ID and the path
 * prefix (its normal form, and which URLs it is stripped from), each on
 * valid, edge and hostile inputs (overflow, empty, huge, embedded NUL, "..", "//", '%').
 */
#include "parse.h"
#include "test_util.h"

#include <limits.h>
#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void test_route(void)
{
    static const struct {
        const char *pattern, *url;
        int match;
        const char *p1, *p2; /* the captures on a match (NULL: not checked) */
    } t[] = {
        {"/jobs", "/jobs", 1, NULL, NULL},
        {"/jobs", "/jobs/", 0, NULL, NULL},          /* trailing '/' is another path */
        {"/jobs", "/job", 0, NULL, NULL},
        {"/jobs", "", 0, NULL, NULL},
        {"/jobs", "//jobs", 0, NULL, NULL},
        {"/jobs/{id}", "/jobs/j0123456789abcdef", 1, "j0123456789abcdef", NULL},
        {"/jobs/{id}", "/jobs/", 0, NULL, NULL},     /* an empty segment is no id */
        {"/jobs/{id}", "/jobs//", 0, NULL, NULL},
        {"/jobs/{id}", "/jobs/a/", 0, NULL, NULL},
        {"/jobs/{id}", "/jobs/..", 0, NULL, NULL},   /* '.' ends a capture: ".." is empty */
        {"/jobs/{id}", "/jobs/a..b", 0, NULL, NULL},
        {"/jobs/{id}", "/jobs/%2e%2e", 1, "%2e%2e", NULL}, /* captured raw: the id check refuses it */
        {"/jobs/{id}", "/jobs/a%2Fb", 1, "a%2Fb", NULL},
        {"/jobs/{id}/events", "/jobs/abc/events", 1, "abc", NULL},
        {"/jobs/{id}/events", "/jobs/abc/events/", 0, NULL, NULL},
        {"/jobs/{id}/events", "/jobs/abc//events", 0, NULL, NULL},
        {"/jobs/{id}/events", "/jobs/../events", 0, NULL, NULL},
        {"/jobs/{id}/loss.csv", "/jobs/x/loss.csv", 1, "x", NULL},
        {"/samples/{id}.png", "/samples/j1.png", 1, "j1", NULL},
        {"/samples/{id}.png", "/samples/j1.png.png", 0, NULL, NULL},
        {"/samples/{id}", "/samples/j1.png", 0, NULL, NULL},
        {"/samples/{id}/images/{k}.png", "/samples/s1/images/7.png", 1, "s1", "7"},
        {"/samples/{id}/images/{k}.png", "/samples/s1/images/.png", 0, NULL, NULL},
        {"/samples/{id}/images/{k}.png", "/samples/s1/images/7", 0, NULL, NULL},
        {"/samples/{id}/images/{k}.png", "/samples/s1/images/../7.png", 0, NULL, NULL},
        {"/checkpoints/{id}", "/checkpoints/j0123456789abcdef-300", 1, "j0123456789abcdef-300",
         NULL},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        char p1[96] = "", p2[32] = "";
        int m = api_parse_route(t[i].pattern, t[i].url, p1, sizeof p1, p2, sizeof p2);
        CHECK(m == t[i].match, "route '%s' url '%s': %d, expected %d", t[i].pattern, t[i].url, m,
              t[i].match);
        if (m && t[i].p1) CHECK(strcmp(p1, t[i].p1) == 0, "url '%s': param '%s'", t[i].url, p1);
        if (m && t[i].p2) CHECK(strcmp(p2, t[i].p2) == 0, "url '%s': param2 '%s'", t[i].url, p2);
    }
    /* capture length: cap - 1 bytes fit, cap do not (an id at max length + 1) */
    char url[200], p1[18], p2[4];
    memset(url, 0, sizeof url);
    strcpy(url, "/jobs/");
    memset(url + 6, 'a', 17);
    CHECK(api_parse_route("/jobs/{id}", url, p1, 18, p2, sizeof p2) == 1, "17 bytes in 18");
    CHECK(strlen(p1) == 17, "capture of %zu bytes", strlen(p1));
    url[6 + 17] = 'a';
    CHECK(api_parse_route("/jobs/{id}", url, p1, 18, p2, sizeof p2) == 0, "18 bytes in 18");
    CHECK(api_parse_route("/s/{id}/i/{k}.png", "/s/a/i/123.png", p1, 18, p2, 4) == 1, "3 in 4");
    CHECK(api_parse_route("/s/{id}/i/{k}.png", "/s/a/i/1234.png", p1, 18, p2, 4) == 0, "4 in 4");
    /* a huge url is refused, not copied */
    static char huge[1 << 16];
    memset(huge, 'x', sizeof huge - 1);
    memcpy(huge, "/jobs/", 6);
    CHECK(api_parse_route("/jobs/{id}", huge, p1, 18, p2, 4) == 0, "huge url");
    /* embedded NUL: the C string ends there */
    CHECK(api_parse_route("/jobs", "/jobs\0/x", p1, 18, p2, 4) == 1, "NUL ends the url");
    /* a third capture is no match */
    CHECK(api_parse_route("/{a}/{b}/{c}", "/x/y/z", p1, 18, p2, 4) == 0, "three captures");
}

static void test_int(void)
{
    static const struct {
        const char *s;
        long long lo, hi;
        int rc;
        long long v;
    } t[] = {
        {"0", 0, 10, 0, 0},
        {"10", 0, 10, 0, 10},
        {"11", 0, 10, -1, 0},
        {"-1", 0, 10, -1, 0},
        {"-1", -5, 10, 0, -1},
        {"", 0, 10, -1, 0},
        {"5x", 0, 10, -1, 0},
        {"5 ", 0, 10, -1, 0},
        {" 5", 0, 10, 0, 5},          /* strtoll skips leading whitespace */
        {"+5", 0, 10, 0, 5},
        {"0x10", 0, 100, -1, 0},
        {"007", 0, 10, 0, 7},
        {"9223372036854775807", 0, LLONG_MAX, 0, LLONG_MAX},
        {"9223372036854775808", 0, LLONG_MAX, -1, 0}, /* overflow */
        {"-9223372036854775808", LLONG_MIN, 0, 0, LLONG_MIN},
        {"-9223372036854775809", LLONG_MIN, 0, -1, 0},
        {"99999999999999999999999999999", 0, LLONG_MAX, -1, 0},
        {"1\0002", 0, 100, 0, 1},      /* embedded NUL: the string is "1" */
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        long long v = -42;
        int rc = api_parse_int(t[i].s, t[i].lo, t[i].hi, &v);
        CHECK(rc == t[i].rc, "int '%s' in [%lld, %lld]: %d", t[i].s, t[i].lo, t[i].hi, rc);
        if (rc == 0) CHECK(v == t[i].v, "int '%s' -> %lld, expected %lld", t[i].s, v, t[i].v);
        else CHECK(v == -42, "int '%s' failed but wrote %lld", t[i].s, v);
    }
    long long v = -42;
    CHECK(api_parse_int(NULL, 0, 1, &v) == -1 && v == -42, "NULL");
}

static void test_image_index(void)
{
    static const struct {
        const char *s;
        int rc;
        long long k;
    } t[] = {
        {"0", 0, 0},   {"7", 0, 7},    {"1023", 0, 1023}, {"1024", -1, 0}, {"00", -1, 0},
        {"07", -1, 0}, {"+7", -1, 0},  {"-0", -1, 0},     {" 7", -1, 0},   {"\t7", -1, 0},
        {"", -1, 0},   {"7a", -1, 0},  {"99999999999999999999", -1, 0},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        long long k = -42;
        int rc = api_parse_image_index(t[i].s, 1024, &k);
        CHECK(rc == t[i].rc, "image index '%s': %d, expected %d", t[i].s, rc, t[i].rc);
        if (rc == 0) CHECK(k == t[i].k, "image index '%s' -> %lld", t[i].s, k);
    }
}

static void test_range(void)
{
    const uint64_t U = UINT64_MAX; /* "untouched": the whole file is served */
    static const struct {
        const char *h;
        uint64_t size;
        int rc;
        uint64_t off, len;
    } t[] = {
        {"bytes=0-99", 1000, 0, 0, 100},
        {"bytes=0-0", 1000, 0, 0, 1},
        {"bytes=5-", 1000, 0, 5, 995},
        {"bytes=999-", 1000, 0, 999, 1},
        {"bytes=1000-", 1000, -1, 0, 0},     /* starts past the end: 416 */
        {"bytes=0-", 0, -1, 0, 0},           /* an empty file has no byte 0 */
        {"bytes=10-5000", 1000, 0, 10, 990}, /* the end is clamped */
        {"bytes=-100", 1000, 0, 900, 100},
        {"bytes=-5000", 1000, 0, 0, 1000},
        {"bytes=-0", 1000, -1, 0, 0},
        {"bytes=-1", 0, -1, 0, 0},
        {"bytes=5-3", 1000, 0, U, U},        /* B < A: ignored */
        {"bytes=5", 1000, 0, U, U},          /* no '-' (read h[-1] before the fix) */
        {"bytes=", 1000, 0, U, U},
        {"bytes=-", 1000, 0, U, U},
        {"bytes=--5", 1000, 0, U, U},
        {"bytes=-+5", 1000, 0, U, U},
        {"bytes=- 5", 1000, 0, U, U},
        {"bytes=5--", 1000, 0, U, U},
        {"bytes=5-+7", 1000, 0, U, U},
        {"bytes=5- 7", 1000, 0, U, U},
        {"bytes=5-7x", 1000, 0, U, U},
        {"bytes=5x-7", 1000, 0, U, U},
        {"bytes= 5-7", 1000, 0, U, U},
        {"bytes=0-1,5-6", 1000, 0, U, U},    /* several ranges: ignored */
        {"bytes=0-1, 5-6", 1000, 0, U, U},
        {"Bytes=0-1", 1000, 0, U, U},
        {"items=0-1", 1000, 0, U, U},
        {"", 1000, 0, U, U},
        {"bytes=99999999999999999999999-", 1000, -1, 0, 0}, /* overflow saturates: past the end */
        {"bytes=0-99999999999999999999999", 1000, 0, 0, 1000},
        {"bytes=18446744073709551615-", 1000, -1, 0, 0},
        {"bytes=0-18446744073709551615", UINT64_MAX, 0, 0, UINT64_MAX},
        {"bytes=-18446744073709551615", 10, 0, 0, 10},
        {"bytes=5-7\0junk", 1000, 0, 5, 3}, /* embedded NUL: the header is "bytes=5-7" */
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        uint64_t off = U, len = U;
        int rc = api_parse_range(t[i].h, t[i].size, &off, &len);
        CHECK(rc == t[i].rc, "range '%s' of %llu: %d, expected %d", t[i].h,
              (unsigned long long)t[i].size, rc, t[i].rc);
        if (rc == 0)
            CHECK(off == t[i].off && len == t[i].len, "range '%s' of %llu -> off %llu len %llu",
                  t[i].h, (unsigned long long)t[i].size, (unsigned long long)off,
                  (unsigned long long)len);
    }
    /* a huge header */
    static char huge[1 << 16];
    memset(huge, '9', sizeof huge - 1);
    memcpy(huge, "bytes=", 6);
    uint64_t off = U, len = U;
    CHECK(api_parse_range(huge, 1000, &off, &len) == 0 && off == U, "huge range");
}

static void test_idem_key(void)
{
    char k128[129], k129[130];
    memset(k128, 'k', 128);
    k128[128] = 0;
    memset(k129, 'k', 129);
    k129[129] = 0;
    static const struct {
        const char *k;
        int rc;
    } t[] = {
        {"a", 0},     {"abc-123_XYZ", 0}, {"!~", 0}, {"", -1},     {"a b", -1}, {" a", -1},
        {"a\t", -1},  {"a\x7f", -1},     {"\xc3\xa9", -1},        {"a\nb", -1},
    };
    for (size_t i = 0; i < N_OF(t); i++)
        CHECK(api_parse_idem_key(t[i].k) == t[i].rc, "key '%s'", t[i].k);
    CHECK(api_parse_idem_key(k128) == 0, "128 bytes");
    CHECK(api_parse_idem_key(k129) == -1, "129 bytes");
}

static void test_content_type(void)
{
    static const struct {
        const char *ct;
        int ok;
    } t[] = {
        {"application/json", 1},
        {"Application/JSON", 1},
        {"application/json; charset=utf-8", 1},
        {"application/json;charset=utf-8", 1},
        {"application/json ", 1},
        {"application/jsonx", 0},
        {"application/json-patch+json", 0},
        {"application/jso", 0},
        {"text/json", 0},
        {"", 0},
        {" application/json", 0},
    };
    for (size_t i = 0; i < N_OF(t); i++)
        CHECK(api_parse_json_content_type(t[i].ct) == t[i].ok, "content type '%s'", t[i].ct);
    CHECK(api_parse_json_content_type(NULL) == 0, "no content type");
}

static void test_last_event_id(void)
{
    long long v = -42;
    CHECK(api_parse_last_event_id(NULL, &v) == 0 && v == 0, "none: 0");
    CHECK(api_parse_last_event_id("17", &v) == 0 && v == 17, "17");
    CHECK(api_parse_last_event_id("0", &v) == 0 && v == 0, "0");
    CHECK(api_parse_last_event_id("9223372036854775807", &v) == 0 && v == INT64_MAX, "max");
    CHECK(api_parse_last_event_id("9223372036854775808", &v) == -1, "max + 1");
    CHECK(api_parse_last_event_id("-1", &v) == -1, "-1");
    CHECK(api_parse_last_event_id("", &v) == -1, "empty");
    CHECK(api_parse_last_event_id("abc", &v) == -1, "abc");
}

static void test_path_prefix(void)
{
    static const struct {
        const char *in, *out; /* out NULL: refused */
    } t[] = {
        {"", ""}, {"/", ""}, {"/ddpmd", "/ddpmd"}, {"/ddpmd/", "/ddpmd"}, {"/a/b-c_d.e~f", "/a/b-c_d.e~f"},
        {"/a/b/", "/a/b"}, {"/..x", "/..x"}, {"/x.", "/x."},
        {"ddpmd", NULL}, {"//", NULL}, {"/a//b", NULL}, {"/a/./b", NULL}, {"/a/..", NULL},
        {"/.", NULL}, {"/a b", NULL}, {"/a%2f", NULL}, {"/a?b", NULL}, {"/a#b", NULL},
        {"/a\\b", NULL}, {"/caf\xc3\xa9", NULL}, {"/ddpmd//", NULL},
        /* 64 bytes are taken, 65 are not */
        {"/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
        {"/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL},
    };
    char out[API_PARSE_PREFIX_MAX + 1];
    for (size_t i = 0; i < N_OF(t); i++) {
        int rc = api_parse_path_prefix(t[i].in, out, sizeof out);
        if (t[i].out)
            CHECK(rc == 0 && strcmp(out, t[i].out) == 0, "prefix '%s' -> '%s' (got %d '%s')", t[i].in,
                  t[i].out, rc, out);
        else
            CHECK(rc == -1 && out[0] == 0, "prefix '%s' refused (got %d '%s')", t[i].in, rc, out);
    }
    CHECK(api_parse_path_prefix(NULL, out, sizeof out) == -1, "NULL refused");
    CHECK(api_parse_path_prefix("/a", out, API_PARSE_PREFIX_MAX) == -1, "a short buffer refused");
    static const struct {
        const char *prefix, *url, *path;
    } s[] = {
        {"", "/jobs", "/jobs"},           {"/ddpmd", "/ddpmd/jobs", "/jobs"},
        {"/ddpmd", "/jobs", "/jobs"},     {"/ddpmd", "/ddpmd", "/"},
        {"/ddpmd", "/ddpmd/", "/"},       {"/ddpmd", "/ddpmdx/jobs", "/ddpmdx/jobs"},
        {"/ddpmd", "/ddpm", "/ddpm"},     {"/a/b", "/a/b/jobs/j1", "/jobs/j1"},
        {"/a/b", "/a/jobs", "/a/jobs"},   {"/ddpmd", "/ddpmd/ddpmd/jobs", "/ddpmd/jobs"},
    };
    for (size_t i = 0; i < N_OF(s); i++) {
        const char *got = api_parse_strip_prefix(s[i].prefix, s[i].url);
        CHECK(strcmp(got, s[i].path) == 0, "'%s' under '%s' routes as '%s' (got '%s')", s[i].url,
              s[i].prefix, s[i].path, got);
    }
}

int main(void)
{
    test_path_prefix();
    test_route();
    test_int();
    test_image_index();
    test_range();
    test_idem_key();
    test_content_type();
    test_last_event_id();
    return tu_finish("test_api_parse");
}
