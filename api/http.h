/* http.h - the HTTP layer the routes stand on (inside api/): the request's context, replies that
 * carry its X-Request-Id and record its status (for the access log and the metrics), RFC 9457
 * problem+json with one way to make field errors, files as bodies, and bearer-token auth. Every
 * reply helper answers, whatever fails: an allocation that fails makes a 500 problem
 * (http_send_oom), never a dropped connection.
 */
#ifndef DDPMD_HTTP_H
#define DDPMD_HTTP_H

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "fsio.h"
#include "jobs.h"
#include "parse.h"
#include "spec.h"

#define PROBLEM_BASE "urn:ddpmd:problem:"
/* the body of the 500 an allocation failure gets */
#define HTTP_OOM_BODY "{\"type\":\"about:blank\",\"title\":\"Internal Server Error\"," \
                      "\"status\":500,\"detail\":\"out of memory\"}"

struct sse;
struct http_guard;
struct worker;
struct plan_watch;
struct plan_task;

#define REQUEST_ID_MAX 64

/* the running api (api_start); the streams, gen and flags under mu */
struct api {
    struct api_config cfg;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;     /* streams, gen */
    struct sse *streams;    /* every open stream */
    uint64_t gen;           /* bumped by every notify */
    int stopping;
    int admitting;
    pthread_t ticker;
    int ticker_on;
    char prefix[API_PARSE_PREFIX_MAX + 1]; /* "" or "/seg..." (api_parse_path_prefix) */
    char *openapi;          /* cfg.openapi with its servers entry set to the prefix */
    size_t openapi_len;
    struct MHD_Response *oom; /* the 500 of a request whose own answer could not be made */
    struct http_guard *guard; /* the connections waiting for a request head */
    struct worker *planner; /* POST /train's admission planning (submit.c) */
    struct plan_watch *plans; /* the deadlines of the requests waiting for a plan (submit.c) */
    struct worker *decoder; /* POST /datasets' image decoding (datasets.c) */
    int decoder_cap;        /* its threads + queue */
};

/* a request's own state, from its first byte to its access-log line (libmicrohttpd's con_cls) */
struct req {
    int route;              /* -1: no path matches; -2: a path matches, not the method */
    char param[96];         /* the path's first {..} segment */
    char param2[32];        /* its second (/samples/{id}/images/{k}.png) */
    char *body;
    size_t len, cap;
    int too_big;
    double t0;              /* the request's first byte (the access log's duration) */
    unsigned status;        /* the status answered; 0 while none */
    char rid[REQUEST_ID_MAX + 1]; /* X-Request-Id: the client's when sane, else made here */
    char method[12], path[256];
    char job[JOBS_ID_LEN];  /* the job the request made or named, for the log */
    int upload;             /* POST /datasets: the body streams to upload_fd, never to memory */
    int upload_fd, upload_errno;
    char upload_path[FSIO_PATH_MAX];
    int bare_prefix;        /* the url was the path prefix itself, without its final '/' */
    int no_memory;          /* its body could not be kept: answered 500 once it is read */
    struct plan_task *plan; /* POST /train: its planning, while suspended for it (submit.c) */
    void *parsed;           /* what its handler parsed before the suspension (POST /train's
                             * spec and extras), kept for the resumed run; freed with it */
    int idem_open;          /* its Idempotency-Key reserved across the suspension */
    char idem_key[129], idem_owner[64];
};

/* what a handler answers with: the request, its route's parameters and its caller */
struct ctx {
    struct api *a;
    struct MHD_Connection *conn;
    struct req *r;
    const char *param, *param2;
    char owner[64];
    int admin;
    long json_failures;     /* http_json_failures() when the handler began */
    char idem_key[129];     /* the request's Idempotency-Key */
    int idem_open;          /* the key is reserved for this request: answer or abandon it */
};

typedef enum MHD_Result (*handler_fn)(struct ctx *c);

/* every URL the server emits (Location, links, event data) is made here: the path prefix + the
 * formatted path, so a client behind a proxy can follow it as given */
void api_link(const struct api *a, char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* res queued as the answer (its X-Request-Id added, status recorded); the caller destroys res */
enum MHD_Result http_respond(struct ctx *c, unsigned status, struct MHD_Response *res);
/* a 500 problem: the answer when an allocation made for the real one failed */
enum MHD_Result http_send_oom(struct ctx *c);
/* the 503 `stopping` problem (Retry-After 10): the server is shutting down */
enum MHD_Result http_send_stopping(struct ctx *c);
/* 400 malformed-json: "the body is not valid JSON (at byte AT of LEN)", the request body's
 * LEN (POST /train's and POST /samples' answer to a syntax error at byte at) */
enum MHD_Result http_send_malformed(struct ctx *c, size_t at);
/* body (copied) of type; headers: NULL, or name, value, ..., NULL */
enum MHD_Result http_send_text(struct ctx *c, unsigned status, const char *type, const char *body,
                               const char *const *headers);
/* o printed and deleted (type NULL: application/json); a 500 problem instead when a cJSON
 * allocation failed since the handler began (o may then miss a member) */
enum MHD_Result http_send_json(struct ctx *c, unsigned status, cJSON *o, const char *type,
                               const char *const *headers);
/* the open regular file fd (taken over) of size bytes as a 200 of type, with a
 * Content-Disposition when disp is not NULL */
enum MHD_Result http_send_fd(struct ctx *c, int fd, uint64_t size, const char *type,
                             const char *disp);
/* the regular file at path as a 200 of type; 404 with detail when path is NULL or names no
 * regular file (fsio_open_regular: no FIFO, link or directory is ever opened) */
enum MHD_Result http_send_file(struct ctx *c, const char *path, const char *type,
                               const char *detail);

/* RFC 9457: type (PROBLEM_BASE + slug, or about:blank for a plain HTTP status), title, status,
 * detail, and extension members in extra (errors[], needed_bytes, ...), which is consumed. The
 * detail is sent as valid UTF-8 (utf8_clean: a character cut at its end dropped, invalid bytes
 * as U+FFFD); a detail that quotes user text cuts it with utf8_cut. */
enum MHD_Result http_send_problem(struct ctx *c, unsigned status, const char *slug,
                                  const char *detail, cJSON *extra, const char *const *headers);
/* the most field errors one answer lists: POST /train's cap (spec_parse) on every route */
#define HTTP_ERRORS_MAX SPEC_MAX_ERRORS
/* field errors: {"errors": [{"path", "message"}...]} built with http_errors_add (NULL when out of
 * memory: http_errors_add and http_send_errors take it); path and message are made valid UTF-8,
 * and errors past the first HTTP_ERRORS_MAX are not kept */
cJSON *http_errors_new(void);
void http_errors_add(cJSON *errs, const char *path, const char *msg);
int http_errors_count(const cJSON *errs);
/* a 422 validation problem of errs (consumed): "the WHAT has N errors; the first: PATH: MSG" */
enum MHD_Result http_send_errors(struct ctx *c, cJSON *errs, const char *what);
/* a validation problem of one field error: "PATH: MSG" */
enum MHD_Result http_send_invalid(struct ctx *c, unsigned status, const char *path,
                                  const char *msg);

/* cJSON's allocations counted: failures are seen by http_send_json (api_init_process installs
 * the hooks; process-wide, over malloc) */
void http_json_hooks(void);
long http_json_failures(void);
/* item added to object o under key (to array arr); deleted when it cannot be (o NULL, no
 * memory), so what a handler built is never leaked; item or NULL */
cJSON *http_json_put(cJSON *o, const char *key, cJSON *item);
cJSON *http_json_put_array(cJSON *arr, cJSON *item);
/* a number, or null when not finite; a string, or null when NULL or empty */
void http_json_num_or_null(cJSON *o, const char *k, double v);
void http_json_str_or_null(cJSON *o, const char *k, const char *v);

/* the query argument k, NULL when absent */
const char *http_arg(struct ctx *c, const char *k);
/* whether the request's Content-Type is JSON (application/json, +json) */
int http_json_body(struct ctx *c);

/* the caller: c->owner and c->admin (every caller is the one local admin without tokens, and
 * on a route that needs none); 0, or -1 with the 401 sent (*res) */
int http_authorize(struct ctx *c, int needed, enum MHD_Result *res);
/* without tokens (a loopback-only server, every caller its admin) a request must come from
 * the loopback, as a browser names it: its Host (when sent) localhost, 127.0.0.0/8 or [::1]
 * with any port, and its Origin (when sent) http(s):// one of those, so that a web page under
 * another name (DNS rebinding) cannot drive the server; 0, or -1 with a 403 problem sent
 * (*res). With tokens: 0 (the token decides) */
int http_loopback_only(struct ctx *c, enum MHD_Result *res);
/* the client's X-Request-Id when it is 1..64 of [A-Za-z0-9._:-], else 16 random hex digits */
void http_request_id(struct MHD_Connection *conn, char *rid);

/* The connection guard: a connection waits for a request head (from its accept, or from the end
 * of its last request) at most head_timeout seconds, and at most waiting_max connections wait at
 * once (a new one drops the one that waited longest); the rest of libmicrohttpd's connection
 * limit is kept for requests whose head came and that are authorized (event streams, uploads).
 * A dropped connection's socket is shut down; libmicrohttpd then closes it. 0, or -1 (no
 * memory or thread) */
int http_guard_start(struct http_guard **g, int waiting_max, double head_timeout);
void http_guard_stop(struct http_guard *g); /* after the daemon stopped; NULL: nothing */
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION (cls: the guard): a connection starts waiting
 * when it opens, leaves the list when it closes */
void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe);
/* the request's head came: its connection stops waiting when the request is authorized (no
 * tokens, a route that needs none (needed 0), or a valid token); an unauthorized one stays on
 * the clock until its answer */
void http_guard_head(struct ctx *c, int needed);
/* the connection's request ended: it waits for its next head, on the clock again */
void http_guard_idle(struct http_guard *g, struct MHD_Connection *conn);

#endif
