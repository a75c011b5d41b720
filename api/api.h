/* api.h - ddpmd's HTTP surface on libmicrohttpd (epoll, its own thread pool): the route table,
 * the handlers (JSON <-> the server's structs), bearer-token auth, RFC 9457 problem+json errors
 * and Server-Sent Events. It knows no tensors: jobs reach the engine through server/pool.
 */
#ifndef DDPMD_API_H
#define DDPMD_API_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "jobs.h"
#include "pool.h"
#include "webhook.h"

struct api_token {
    char name[64];
    char secret[256];
    int admin;
};

struct api_config {
    int listen_fd;                  /* bound and listening; the api owns it from api_start */
    int threads;                    /* libmicrohttpd's thread pool */
    size_t max_body;                /* request bodies beyond this: 413 */
    double keepalive_s;             /* an event stream quiet this long gets a comment line */
    struct jobs *db;
    struct pool *pool;
    const struct api_token *tokens; /* NULL: no auth (the server then listens on loopback only) */
    int n_tokens;
    const char *openapi;            /* served as GET /openapi.yaml (its servers entry set to
                                     * path_prefix) */
    size_t openapi_len;
    const char *path_prefix;        /* "" / NULL, or a normal form of api_parse_path_prefix:
                                     * requests are routed with it or without it (a proxy that
                                     * strips it), every Location and link carries it */
    int64_t upload_max_bytes;       /* POST /datasets: the archive as sent (413 beyond) */
    int64_t upload_max_unpacked;    /* its files unpacked (413 beyond) */
    int64_t upload_max_files;       /* its entries (413 beyond) */
    struct webhook *webhook;        /* a POST /train body's "webhook" is registered here */
    /* connections (http.h, the guard): at most max_conns open (0: API_MAX_CONNS), conns_per_ip
     * from one address (0: no limit), and of them at most max_conns - conns_reserved (0:
     * max_conns / 16 kept) waiting for a request head, each for at most head_timeout_s (0:
     * API_HEAD_TIMEOUT_S); the reserved ones are for authorized requests (event streams) */
    int max_conns, conns_per_ip, conns_reserved;
    double head_timeout_s;
    /* POST /train's and POST /samples' admission planning runs off the HTTP threads
     * (submit.c): plan_workers
     * threads (0: 1) and plan_queue more waiting (0: 4), each request suspended meanwhile
     * (it holds no HTTP thread) and answered 503 after plan_timeout_s (0: API_PLAN_TIMEOUT_S);
     * a full queue is a 503 at once */
    int plan_workers, plan_queue;
    double plan_timeout_s;
    int64_t plan_memory;            /* one planning's graphs and plans at most (0: no cap; a
                                     * search past it stops, 422) */
    /* POST /datasets decodes an archive's images off the HTTP threads (datasets.c):
     * upload_workers threads (0: 1), upload_queue uploads waiting (0: 8; one more is a 503);
     * one owner's uploads hold at most upload_quota_bytes of files and upload_quota_pixels
     * pixels together (0: no limit) */
    int upload_workers, upload_queue;
    int64_t upload_quota_bytes, upload_quota_pixels;
};

#define API_MAX_CONNS 1024
#define API_HEAD_TIMEOUT_S 10.0
#define API_PLAN_TIMEOUT_S 30.0

enum api_status { API_OK = 0, API_ERR_START = 1 };

struct api;

/* once per process, before any thread uses cJSON: its allocations counted, so that an answer
 * whose JSON lost a member to a failed allocation is a 500 instead */
void api_init_process(void);
int api_start(struct api **out, const struct api_config *cfg, char *err, size_t errlen);
/* POST /train answers 503 from now on */
void api_stop_admitting(struct api *a);
/* ends every event stream, stops the daemon, frees */
void api_stop(struct api *a);
/* the pool's notifier: new events, wake the waiting streams (ctx is the api) */
void api_notify(void *ctx);

/* a --path-prefix value -> its normal form in out (cap n > API_PARSE_PREFIX_MAX, see
 * api_parse_path_prefix), 0; -1 with err when it is none, or its first segment is a route's
 * (/jobs: a request could then mean either) */
int api_path_prefix_check(const char *p, char *out, size_t n, char *err, size_t errlen);

/* one "METHOD PATH" line per route, in table order (tests compare them with openapi.yaml) */
void api_routes_print(FILE *f);

/* the longest line of a token file, in bytes (its newline included) */
#define API_TOKEN_LINE_MAX 1024
/* parses "name secret [admin]" lines ('#' comments, blank lines); -1 with err naming the line
 * and the reason for a line over API_TOKEN_LINE_MAX, a name over 63 or a secret over 255
 * characters (refused, never cut), and for a file of this user's that group or others may
 * read or write (mode & 077: chmod 600) */
int api_tokens_load(const char *path, struct api_token **tokens, int *n, char *err,
                    size_t errlen);

#endif
