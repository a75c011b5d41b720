/* http.c - the HTTP layer under the routes (see http.h): replies that carry the request's id and
 * record its status, RFC 9457 problems and field errors made one way, files and descriptors as
 * bodies, the 500 an allocation failure still gets, bearer-token auth and the token file, the
 * loopback-only check, and the guard of connections that wait for a request head.
 */
#define _GNU_SOURCE
#include "http.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "fsio.h"
#include "log.h"
#include "parse.h"
#include "utf8.h"

/* ---- responses ---- */

void api_link(const struct api *a, char *buf, size_t n, const char *fmt, ...)
{
    size_t pl = strlen(a->prefix);
    snprintf(buf, n, "%s", a->prefix);
    if (pl >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + pl, n - pl, fmt, ap);
    va_end(ap);
}

/* an upload's body still in its temporary file when the answer goes out (a refusal: an accepted
 * one was renamed away) is removed first, so a client that reads the answer finds nothing left
 * (docs/limits.md); the request's completion closes its descriptor */
static void http_upload_discard(struct req *r)
{
    if (r->upload_path[0]) unlink(r->upload_path);
    r->upload_path[0] = 0;
}

/* every response goes out here: it carries the request's X-Request-Id, and its status is kept
 * for the access log and the metrics */
enum MHD_Result http_respond(struct ctx *c, unsigned status, struct MHD_Response *res)
{
    http_upload_discard(c->r);
    c->r->status = status;
    MHD_add_response_header(res, "X-Request-Id", c->r->rid);
    return MHD_queue_response(c->conn, status, res);
}

/* the answer to a request whose answer could not be made: a 500 problem (made now if it can
 * be, else the one made at start, which cannot carry the request's id) */
enum MHD_Result http_send_oom(struct ctx *c)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(strlen(HTTP_OOM_BODY), HTTP_OOM_BODY,
                                                               MHD_RESPMEM_PERSISTENT);
    if (!res) {
        http_upload_discard(c->r);
        c->r->status = 500;
        return MHD_queue_response(c->conn, 500, c->a->oom);
    }
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "application/problem+json");
    enum MHD_Result r = http_respond(c, 500, res);
    MHD_destroy_response(res);
    return r;
}

enum MHD_Result http_send_stopping(struct ctx *c)
{
    return http_send_problem(c, 503, "stopping", "the server is shutting down", NULL,
                             (const char *const[]){"Retry-After", "10", NULL});
}

enum MHD_Result http_send_malformed(struct ctx *c, size_t at)
{
    char detail[200];
    snprintf(detail, sizeof detail, "the body is not valid JSON (at byte %zu of %zu)", at,
             c->r->len);
    return http_send_problem(c, 400, "malformed-json", detail, NULL, NULL);
}

enum MHD_Result http_send_text(struct ctx *c, unsigned status, const char *type, const char *body,
                               const char *const *headers)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                               MHD_RESPMEM_MUST_COPY);
    if (!res) return http_send_oom(c);
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    for (int i = 0; headers && headers[i]; i += 2) MHD_add_response_header(res, headers[i], headers[i + 1]);
    enum MHD_Result r = http_respond(c, status, res);
    MHD_destroy_response(res);
    return r;
}

/* cJSON's allocations that failed, process-wide (http_json_hooks) */
static atomic_long json_failures;

static void *json_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p) atomic_fetch_add(&json_failures, 1);
    return p;
}

void http_json_hooks(void)
{
    cJSON_Hooks h = {json_malloc, free};
    cJSON_InitHooks(&h);
}

long http_json_failures(void) { return atomic_load(&json_failures); }

cJSON *http_json_put(cJSON *o, const char *key, cJSON *item)
{
    if (item && o && cJSON_AddItemToObject(o, key, item)) return item;
    cJSON_Delete(item);
    return NULL;
}

cJSON *http_json_put_array(cJSON *arr, cJSON *item)
{
    if (item && arr && cJSON_AddItemToArray(arr, item)) return item;
    cJSON_Delete(item);
    return NULL;
}

enum MHD_Result http_send_json(struct ctx *c, unsigned status, cJSON *o, const char *type,
                               const char *const *headers)
{
    /* a value that could not be made left a hole somewhere in o: no answer of it */
    if (http_json_failures() != c->json_failures) {
        cJSON_Delete(o);
        return http_send_oom(c);
    }
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return http_send_oom(c);
    enum MHD_Result r = http_send_text(c, status, type ? type : "application/json", s, headers);
    free(s);
    return r;
}

static const char *status_title(unsigned status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 507: return "Insufficient Storage";
    default: return "Error";
    }
}

/* s as valid UTF-8 (utf8_clean) in a new string (NULL when out of memory) */
static char *http_utf8(const char *s)
{
    size_t n = 3 * strlen(s) + 1;
    char *out = malloc(n);
    if (out) utf8_clean(out, n, s);
    return out;
}

/* RFC 9457: type (about:blank for plain HTTP statuses), title, status, detail, and extension
 * members in extra (errors[] with field paths, needed_bytes, ...), which is consumed */
enum MHD_Result http_send_problem(struct ctx *c, unsigned status, const char *slug,
                                  const char *detail, cJSON *extra, const char *const *headers)
{
    cJSON *o = extra ? extra : cJSON_CreateObject();
    char type[96];
    snprintf(type, sizeof type, "%s%s", slug ? PROBLEM_BASE : "about:blank", slug ? slug : "");
    /* details quote ids and paths from the URL, cut to fit: valid UTF-8 whatever they held */
    char *text = http_utf8(detail);
    int ok = o && text && cJSON_AddStringToObject(o, "type", type) &&
             cJSON_AddStringToObject(o, "title", status_title(status)) &&
             cJSON_AddNumberToObject(o, "status", status) &&
             cJSON_AddStringToObject(o, "detail", text);
    free(text);
    if (!ok) {
        cJSON_Delete(o);
        return http_send_oom(c);
    }
    return http_send_json(c, status, o, "application/problem+json", headers);
}

cJSON *http_errors_new(void)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddArrayToObject(o, "errors")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

void http_errors_add(cJSON *errs, const char *path, const char *msg)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(errs, "errors");
    if (cJSON_GetArraySize(arr) >= HTTP_ERRORS_MAX) return;
    char *p = http_utf8(path), *m = http_utf8(msg);
    cJSON *e = p && m ? cJSON_CreateObject() : NULL;
    if (!e || !cJSON_AddStringToObject(e, "path", p) || !cJSON_AddStringToObject(e, "message", m))
        cJSON_Delete(e);
    else
        http_json_put_array(arr, e);
    free(p);
    free(m);
}

int http_errors_count(const cJSON *errs)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(errs, "errors"));
}

enum MHD_Result http_send_errors(struct ctx *c, cJSON *errs, const char *what)
{
    if (!errs) return http_send_oom(c);
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(errs, "errors");
    int n = cJSON_GetArraySize(arr);
    const cJSON *e0 = cJSON_GetArrayItem(arr, 0);
    const cJSON *p0 = cJSON_GetObjectItemCaseSensitive(e0, "path");
    const cJSON *m0 = cJSON_GetObjectItemCaseSensitive(e0, "message");
    char detail[600];
    /* the list stops at HTTP_ERRORS_MAX: a body of 100,000 bad fields gets a small answer */
    snprintf(detail, sizeof detail, "the %s has %s%d error%s; the first: %.*s%s%.256s", what,
             n >= HTTP_ERRORS_MAX ? "at least " : "", n, n == 1 ? "" : "s",
             cJSON_IsString(p0) ? (int)utf8_cut(p0->valuestring, 128) : 0,
             cJSON_IsString(p0) ? p0->valuestring : "",
             cJSON_IsString(p0) && *p0->valuestring ? ": " : "",
             cJSON_IsString(m0) ? m0->valuestring : "");
    return http_send_problem(c, 422, "validation", detail, errs, NULL);
}

enum MHD_Result http_send_invalid(struct ctx *c, unsigned status, const char *path,
                                  const char *msg)
{
    char detail[400];
    snprintf(detail, sizeof detail, "%s%s%s", path, *path ? ": " : "", msg);
    cJSON *errs = http_errors_new();
    if (errs) http_errors_add(errs, path, msg);
    return errs ? http_send_problem(c, status, "validation", detail, errs, NULL) : http_send_oom(c);
}

void http_json_num_or_null(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

void http_json_str_or_null(cJSON *o, const char *k, const char *v)
{
    if (v && *v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

const char *http_arg(struct ctx *c, const char *k)
{
    return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, k);
}

int http_json_body(struct ctx *c)
{
    return api_parse_json_content_type(
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));
}

/* the open regular file fd (taken over) of size bytes as a 200 of type, with a
 * Content-Disposition when disp is not NULL */
enum MHD_Result http_send_fd(struct ctx *c, int fd, uint64_t size, const char *type,
                               const char *disp)
{
    struct MHD_Response *resp = MHD_create_response_from_fd64(size, fd);
    if (!resp) {
        close(fd);
        return http_send_oom(c);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (disp) MHD_add_response_header(resp, "Content-Disposition", disp);
    enum MHD_Result rr = http_respond(c, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* the regular file at path as a 200 of type; 404 with detail when path is NULL or names no
 * regular file (fsio_open_regular: no FIFO, link or directory is ever opened) */
enum MHD_Result http_send_file(struct ctx *c, const char *path, const char *type,
                                 const char *detail)
{
    char err[300];
    int fd = path ? fsio_open_regular(path, O_RDONLY, err, sizeof err) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        if (fd >= 0) close(fd);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    return http_send_fd(c, fd, (uint64_t)sb.st_size, type, NULL);
}

/* constant time in the secrets' contents: every token is compared, over its full length */
static int auth_check(struct ctx *c, int *present)
{
    const struct api *a = c->a;
    const char *h = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    *present = h != NULL;
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return -1;
    const char *got = h + 7;
    size_t glen = strlen(got);
    int found = -1;
    for (int t = 0; t < a->cfg.n_tokens; t++) {
        const char *want = a->cfg.tokens[t].secret;
        size_t wlen = strlen(want);
        volatile unsigned char diff = (unsigned char)(glen != wlen);
        for (size_t i = 0; i < wlen; i++) diff |= (unsigned char)(want[i] ^ (i < glen ? got[i] : 0));
        if (diff == 0 && found < 0) found = t;
    }
    if (found < 0) return -1;
    snprintf(c->owner, sizeof c->owner, "%s", a->cfg.tokens[found].name);
    c->admin = a->cfg.tokens[found].admin;
    return 0;
}

/* the client's X-Request-Id when it is 1..64 of [A-Za-z0-9._:-], else 16 random hex digits */
void http_request_id(struct MHD_Connection *conn, char *rid)
{
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = h ? strlen(h) : 0;
    if (n >= 1 && n <= REQUEST_ID_MAX &&
        strspn(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") == n) {
        memcpy(rid, h, n + 1);
        return;
    }
    unsigned char b[8] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* no entropy (never on Linux >= 3.17 after boot): time and a counter still differ */
        static atomic_uint_least64_t seq;
        uint64_t v = (uint64_t)(clock_now_s() * 1e6) ^ (atomic_fetch_add(&seq, 1) << 40);
        memcpy(b, &v, sizeof b);
    }
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 8; i++) rid[2 * i] = hex[b[i] >> 4], rid[2 * i + 1] = hex[b[i] & 15];
    rid[16] = 0;
}

/* whether s[0..n) is a loopback authority: localhost (any case), a dotted quad of 127.0.0.0/8
 * or [::1], then nothing or ':' and 1..5 digits */
static int loopback_authority(const char *s, size_t n)
{
    size_t h = 0;
    int ok = 0;
    if (n >= 5 && memcmp(s, "[::1]", 5) == 0) {
        h = 5;
        ok = 1;
    } else {
        while (h < n && s[h] != ':') h++;
        if (h == 9 && strncasecmp(s, "localhost", 9) == 0) {
            ok = 1;
        } else {
            unsigned part[4], k = 0, digits = 0, v = 0;
            for (size_t i = 0; i <= h && k < 4; i++) {
                if (i < h && s[i] >= '0' && s[i] <= '9' && digits < 3) {
                    v = v * 10 + (unsigned)(s[i] - '0');
                    digits++;
                } else if (digits && v <= 255 && (i == h || s[i] == '.')) {
                    part[k++] = v;
                    digits = v = 0;
                    if (i == h) ok = k == 4 && part[0] == 127;
                } else {
                    break;
                }
            }
        }
    }
    if (!ok || h == n) return ok;
    size_t d = n - h - 1;
    if (s[h] != ':' || d < 1 || d > 5) return 0;
    for (size_t i = h + 1; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

int http_loopback_only(struct ctx *c, enum MHD_Result *res)
{
    if (c->a->cfg.tokens) return 0;
    const char *host = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Origin");
    const char *why = NULL;
    if (host && !loopback_authority(host, strlen(host))) {
        why = "without tokens this server answers only loopback Host names (localhost, "
              "127.0.0.1, [::1], any port): the Host header names another (DNS rebinding?)";
    } else if (origin) {
        size_t skip = strncasecmp(origin, "http://", 7) == 0    ? 7
                      : strncasecmp(origin, "https://", 8) == 0 ? 8
                                                                : 0;
        if (!skip || !loopback_authority(origin + skip, strlen(origin + skip)))
            why = "without tokens this server answers only its own pages: the Origin header "
                  "names another site (a loopback origin, http://localhost:PORT, is needed)";
    }
    if (!why) return 0;
    *res = http_send_problem(c, 403, "not-loopback", why, NULL, NULL);
    return -1;
}

int http_authorize(struct ctx *c, int needed, enum MHD_Result *res)
{
    snprintf(c->owner, sizeof c->owner, "anonymous");
    c->admin = 1; /* without tokens everyone is the one local user */
    if (!c->a->cfg.tokens || !needed) return 0;
    int present;
    c->admin = 0;
    if (auth_check(c, &present) == 0) return 0;
    *res = http_send_problem(c, 401, NULL,
                   present ? "the bearer token is not valid"
                           : "this route needs Authorization: Bearer TOKEN",
                   NULL,
                   (const char *const[]){"WWW-Authenticate",
                                         present ? "Bearer realm=\"ddpmd\", "
                                                   "error=\"invalid_token\""
                                                 : "Bearer realm=\"ddpmd\"",
                                         NULL});
    return -1;
}

/* the token file's fields, split at blanks; -1 when a field is longer than its cap */
static int tokens_field(char **p, char *out, size_t cap)
{
    while (**p == ' ' || **p == '\t' || **p == '\r' || **p == '\n' || **p == '\v' || **p == '\f')
        (*p)++;
    size_t n = strcspn(*p, " \t\r\n\v\f");
    out[0] = 0;
    if (n >= cap) return -1;
    memcpy(out, *p, n);
    out[n] = 0;
    *p += n;
    return 0;
}

int api_tokens_load(const char *path, struct api_token **tokens, int *n, char *err,
                    size_t errlen)
{
    *tokens = NULL;
    *n = 0;
    FILE *f = fsio_fopen_read(path, err, errlen);
    if (!f) return -1;
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    int lineno = 0, cap = 0, rc = -1;
    /* like ssh with a private key: secrets in a file of ours that others may read are refused
     * (a file of another user, a container's mounted secret, is that user's to protect) */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & 077)) {
        snprintf(err, errlen, "%s is open to group or others (mode %04o): its secrets must be "
                 "private (chmod 600)", path, (unsigned)(sb.st_mode & 07777));
        goto out;
    }
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        if (memchr(line, 0, (size_t)len)) {
            snprintf(err, errlen, "%s:%d: a NUL byte in the line", path, lineno);
            goto out;
        }
        if (len > API_TOKEN_LINE_MAX) {
            snprintf(err, errlen, "%s:%d: the line is longer than %d bytes", path, lineno,
                     API_TOKEN_LINE_MAX);
            goto out;
        }
        char name[sizeof((*tokens)->name)], secret[sizeof((*tokens)->secret)], flag[8], extra[2];
        char *hash = strchr(line, '#'), *p = line;
        if (hash) *hash = 0;
        /* a field over its cap is refused, never cut: "eve <255 X>admin" cut after 255
         * characters read "admin" as the flag */
        if (tokens_field(&p, name, sizeof name)) {
            snprintf(err, errlen, "%s:%d: the name is longer than %zu characters", path, lineno,
                     sizeof name - 1);
            goto out;
        }
        if (!name[0]) continue;
        if (tokens_field(&p, secret, sizeof secret)) {
            snprintf(err, errlen, "%s:%d: the secret of %s is longer than %zu characters", path,
                     lineno, name, sizeof secret - 1);
            goto out;
        }
        int bad_flag = tokens_field(&p, flag, sizeof flag);
        tokens_field(&p, extra, sizeof extra); /* anything here is a fourth field */
        if (!secret[0] || bad_flag || (flag[0] && strcmp(flag, "admin") != 0) || *p != 0 ||
            extra[0]) {
            snprintf(err, errlen, "%s:%d: expected \"NAME SECRET\" or \"NAME SECRET admin\"", path,
                     lineno);
            goto out;
        }
        if (strlen(secret) < 16) {
            snprintf(err, errlen, "%s:%d: the secret of %s is shorter than 16 characters", path,
                     lineno, name);
            goto out;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            struct api_token *t = realloc(*tokens, (size_t)cap * sizeof *t);
            if (!t) {
                snprintf(err, errlen, "out of memory");
                goto out;
            }
            *tokens = t;
        }
        struct api_token *t = &(*tokens)[(*n)++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        snprintf(t->secret, sizeof t->secret, "%s", secret);
        t->admin = flag[0] != 0;
    }
    if (*n == 0) {
        snprintf(err, errlen, "%s has no tokens", path);
        goto out;
    }
    rc = 0;
out:
    free(line);
    fclose(f);
    if (rc) {
        free(*tokens);
        *tokens = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- the connection guard ---- */

/* a connection (libmicrohttpd's socket context): on the guard's list while it waits for a
 * request head, oldest first */
struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    int listed;
    double since;   /* its wait began: accepted, or its last request ended */
};

struct http_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct http_conn list;  /* sentinel: list.next the oldest */
    int n_waiting, waiting_max;
    double head_timeout;
    int stopping;
    pthread_t reaper;
    long dropped_slow, dropped_full, logged_slow, logged_full; /* totals; those logged */
    double logged_at;
};

static void conn_unlink(struct http_guard *g, struct http_conn *hc)
{
    if (!hc->listed) return;
    hc->prev->next = hc->next;
    hc->next->prev = hc->prev;
    hc->listed = 0;
    g->n_waiting--;
}

static void conn_append(struct http_guard *g, struct http_conn *hc)
{
    conn_unlink(g, hc);
    hc->since = clock_now_s();
    hc->prev = g->list.prev;
    hc->next = &g->list;
    g->list.prev->next = hc;
    g->list.prev = hc;
    hc->listed = 1;
    g->n_waiting++;
}

/* its socket shut (under g->mu, while libmicrohttpd has not yet been told it closed, so the
 * descriptor is still this connection's): libmicrohttpd reads its end and closes it */
static void conn_drop(struct http_guard *g, struct http_conn *hc)
{
    conn_unlink(g, hc);
    if (hc->fd >= 0) shutdown(hc->fd, SHUT_RDWR);
}

/* at most one line per 10 s: how many were dropped since the last one */
static void guard_log(struct http_guard *g, double now)
{
    if (now - g->logged_at < 10 ||
        (g->dropped_slow == g->logged_slow && g->dropped_full == g->logged_full))
        return;
    log_msg(LOG_WARN, "connections dropped before a request head: %ld past the %.3g s head "
                      "deadline, %ld oldest waiting ones for new connections (%d may wait)",
            g->dropped_slow - g->logged_slow, g->head_timeout, g->dropped_full - g->logged_full,
            g->waiting_max);
    g->logged_slow = g->dropped_slow;
    g->logged_full = g->dropped_full;
    g->logged_at = now;
}

/* whether the socket's unread bytes hold the end of a request head: the client sent it in time
 * and only the server's thread, busy with another request, has not read it yet (a peek, so
 * libmicrohttpd still reads every byte) */
static int conn_head_pending(int fd)
{
    char buf[8192];
    if (fd < 0) return 0;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return 0;
    for (ssize_t i = 1; i < n; i++)
        if (buf[i] == '\n' && (buf[i - 1] == '\n' || (i >= 2 && buf[i - 1] == '\r' &&
                                                     buf[i - 2] == '\n')))
            return 1; /* a blank line: the head is complete */
    return 0;
}

static void *guard_reaper(void *arg)
{
    struct http_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stopping) {
        double now = clock_now_s();
        while (g->list.next != &g->list && now - g->list.next->since >= g->head_timeout) {
            struct http_conn *hc = g->list.next;
            if (conn_head_pending(hc->fd)) {
                conn_unlink(g, hc); /* its head came in time: off the clock */
                continue;
            }
            conn_drop(g, hc);
            g->dropped_slow++;
        }
        guard_log(g, now);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000; /* a deadline is kept to 0.2 s */
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int http_guard_start(struct http_guard **out, int waiting_max, double head_timeout)
{
    struct http_guard *g = calloc(1, sizeof *g);
    *out = NULL;
    if (!g) return -1;
    g->list.next = g->list.prev = &g->list;
    g->waiting_max = waiting_max > 0 ? waiting_max : 1;
    g->head_timeout = head_timeout > 0 ? head_timeout : 10;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->reaper, NULL, guard_reaper, g)) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void http_guard_stop(struct http_guard *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->reaper, NULL);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe)
{
    struct http_guard *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct http_conn *hc = calloc(1, sizeof *hc);
        *socket_context = hc;
        if (!hc) return; /* unguarded: it still has libmicrohttpd's idle timeout */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&g->mu);
        while (g->n_waiting >= g->waiting_max) { /* the oldest waiter makes room */
            conn_drop(g, g->list.next);
            g->dropped_full++;
        }
        conn_append(g, hc);
        pthread_mutex_unlock(&g->mu);
        return;
    }
    struct http_conn *hc = *socket_context;
    if (!hc) return;
    pthread_mutex_lock(&g->mu);
    conn_unlink(g, hc);
    pthread_mutex_unlock(&g->mu);
    free(hc);
    *socket_context = NULL;
}

/* the connection's entry, NULL when it has none */
static struct http_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void http_guard_head(struct ctx *c, int needed)
{
    struct http_guard *g = c->a->guard;
    struct http_conn *hc = conn_of(c->conn);
    if (!g || !hc) return;
    int trusted = !c->a->cfg.tokens || !needed;
    if (!trusted) {
        int present;
        char owner[sizeof c->owner];
        int admin = c->admin;
        memcpy(owner, c->owner, sizeof owner);
        trusted = auth_check(c, &present) == 0;
        memcpy(c->owner, owner, sizeof owner); /* http_authorize decides the caller, later */
        c->admin = admin;
    }
    if (!trusted) return; /* still on the clock: its 401 is due within the head deadline */
    pthread_mutex_lock(&g->mu);
    conn_unlink(g, hc);
    pthread_mutex_unlock(&g->mu);
}

void http_guard_idle(struct http_guard *g, struct MHD_Connection *conn)
{
    struct http_conn *hc = g ? conn_of(conn) : NULL;
    if (!hc) return;
    pthread_mutex_lock(&g->mu);
    while (!hc->listed && g->n_waiting >= g->waiting_max) {
        conn_drop(g, g->list.next);
        g->dropped_full++;
    }
    conn_append(g, hc);
    pthread_mutex_unlock(&g->mu);
}
