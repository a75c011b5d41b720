/* api.c - the HTTP surface of ddpmd serve (see api.h): the route table, which drives dispatch,
 * 404/405, the metrics' route labels and `ddpmd serve --routes`; the request's life on
 * libmicrohttpd (its body kept or streamed, auth, the handler, the access log); the path prefix
 * and the daemon's start and stop. The handlers are one file per resource (routes.h).
 */
#define _GNU_SOURCE
#include "api.h"
#include "routes.h"

#include <pthread.h>
#include <stdarg.h>

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
#include "jobs.h"
#include "log.h"
#include "metrics.h"
#include "parse.h"
#include "pool.h"
#include "webhook.h"
#include "worker.h"
#include "utf8.h"

/* ---- the route table ---- */

struct route {
    const char *method;
    const char *pattern;    /* "{id}" matches one path segment */
    handler_fn fn;
    int auth;
};

static const struct route routes[] = {
    {"POST", "/train", h_train, 1},
    {"GET", "/jobs", h_jobs, 1},
    {"GET", "/jobs/{id}", h_job, 1},
    {"DELETE", "/jobs/{id}", h_job_delete, 1},
    {"POST", "/jobs/{id}/cancel", h_cancel, 1},
    {"POST", "/jobs/{id}/resume", h_resume, 1},
    {"GET", "/jobs/{id}/events", h_events, 1},
    {"GET", "/jobs/{id}/checkpoints", h_checkpoints, 1},
    {"GET", "/jobs/{id}/logs", h_logs, 1},
    {"GET", "/jobs/{id}/loss.csv", h_loss_csv, 1},
    {"GET", "/jobs/{id}/loss.png", h_loss_png, 1},
    {"GET", "/jobs/{id}/grids/{step}.png", h_job_grid, 1},
    {"POST", "/checkpoints", h_checkpoint_import, 1},
    {"GET", "/checkpoints/{id}", h_checkpoint, 1},
    {"POST", "/samples", h_samples_post, 1},
    {"GET", "/samples", h_samples, 1},
    {"GET", "/samples/{id}", h_sample, 1},
    {"GET", "/samples/{id}.png", h_sample_grid, 1},
    {"GET", "/samples/{id}/images/{k}.png", h_sample_image, 1},
    {"GET", "/datasets", h_datasets, 1},
    {"POST", "/datasets", h_datasets_post, 1},
    {"GET", "/datasets/{id}", h_dataset, 1},
    {"DELETE", "/datasets/{id}", h_dataset_delete, 1},
    {"GET", "/datasets/{id}/preview.png", h_dataset_preview, 1},
    {"GET", "/devices", h_devices, 1},
    {"GET", "/metrics", h_metrics, 1},
    {"GET", "/healthz", h_healthz, 0},
    {"GET", "/readyz", h_readyz, 0},
    {"GET", "/openapi.yaml", h_openapi, 0},
    {"GET", "/", h_ui_index, 0},
    {"GET", "/ui/app.js", h_ui_js, 0},
    {"GET", "/ui/style.css", h_ui_css, 0},
};
#define N_ROUTES ((int)(sizeof routes / sizeof routes[0]))

void api_routes_print(FILE *f)
{
    for (int i = 0; i < N_ROUTES; i++) fprintf(f, "%s %s\n", routes[i].method, routes[i].pattern);
}

static void route_find(const char *method, const char *url, struct req *r)
{
    int path_seen = 0;
    if (strcmp(method, "HEAD") == 0) method = "GET";
    for (int i = 0; i < N_ROUTES; i++) {
        if (!api_parse_route(routes[i].pattern, url, r->param, sizeof r->param, r->param2,
                         sizeof r->param2))
            continue;
        path_seen = 1;
        if (strcmp(routes[i].method, method) == 0) {
            r->route = i;
            return;
        }
    }
    r->route = path_seen ? -2 : -1;
}

static enum MHD_Result not_allowed(struct ctx *c, const char *url)
{
    char allow[64] = "", p[96], p2[32];
    for (int i = 0; i < N_ROUTES; i++)
        if (api_parse_route(routes[i].pattern, url, p, sizeof p, p2, sizeof p2)) {
            if (*allow) strcat(allow, ", ");
            strcat(allow, routes[i].method);
            if (strcmp(routes[i].method, "GET") == 0) strcat(allow, ", HEAD");
        }
    char detail[240];
    snprintf(detail, sizeof detail, "%.*s allows %s", (int)utf8_cut(url, 100), url, allow);
    return http_send_problem(c, 405, NULL, detail, NULL,
                             (const char *const[]){"Allow", allow, NULL});
}

/* the request a failed allocation left without its own state: answered 500, its body dropped */
static struct req oom_req = {.route = -1, .too_big = 2, .upload_fd = -1};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    struct api *a = cls;
    struct req *r = *con_cls;
    int bare = a->prefix[0] && strcmp(url, a->prefix) == 0;
    url = api_parse_strip_prefix(a->prefix, url); /* the routes' path */
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) {
            *upload_size = 0;
            *con_cls = &oom_req;
            return MHD_queue_response(conn, 500, a->oom);
        }
        *con_cls = r;
        r->bare_prefix = bare;
        r->t0 = clock_now_s();
        http_request_id(conn, r->rid);
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        r->upload_fd = -1;
        route_find(method, url, r);
        struct ctx c = {.a = a, .conn = conn, .r = r, .param = r->param, .param2 = r->param2,
                        .json_failures = http_json_failures()};
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        long long len = -1;
        if (cl && api_parse_int(cl, 0, INT64_MAX, &len)) len = -1;
        http_guard_head(&c, r->route >= 0 ? routes[r->route].auth : 1);
        enum MHD_Result lres;
        if (http_loopback_only(&c, &lres)) {
            r->too_big = 2; /* answered before its body: the body is dropped */
            return lres;
        }
        if (r->route >= 0 && (routes[r->route].fn == h_datasets_post ||
                              routes[r->route].fn == h_checkpoint_import)) {
            enum MHD_Result res;
            if (routes[r->route].fn == h_datasets_post ? api_upload_begin(&c, len, &res)
                                                       : api_checkpoint_upload_begin(&c, len, &res)) {
                r->too_big = 2; /* answered: the body is dropped */
                return res;
            }
            return MHD_YES;
        }
        if (len >= 0 && (size_t)len > a->cfg.max_body) {
            /* refused before a byte of it is read; libmicrohttpd closes the connection after */
            char detail[160];
            snprintf(detail, sizeof detail, "the body is %lld bytes; the limit is %zu", len,
                     a->cfg.max_body);
            r->too_big = 2;
            return http_send_problem(&c, 413, NULL, detail, NULL, NULL);
        }
        return MHD_YES;
    }
    if (r->too_big == 2) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size && r->upload) {
        /* an archive: to its file as it comes, counted against the upload limit */
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_big || r->upload_errno) return MHD_YES;
        if ((int64_t)(r->len + n) > a->cfg.upload_max_bytes) {
            r->too_big = 1; /* the rest is dropped; what came is gone before the 413 */
            close(r->upload_fd);
            r->upload_fd = -1;
            unlink(r->upload_path);
            r->upload_path[0] = 0;
            return MHD_YES;
        }
        if (fsio_write_full(r->upload_fd, upload_data, n)) {
            r->upload_errno = errno ? errno : EIO; /* the rest is dropped; the 507/500 follows */
            close(r->upload_fd);
            r->upload_fd = -1;
            unlink(r->upload_path);
            r->upload_path[0] = 0;
            return MHD_YES;
        }
        r->len += n;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_big || r->no_memory || r->len + n > a->cfg.max_body) {
            if (!r->no_memory) r->too_big = 1; /* keep reading (and dropping): the 413 follows */
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = (r->len + n + 1) * 2;
            if (cap > a->cfg.max_body + 1) cap = a->cfg.max_body + 1;
            char *b = realloc(r->body, cap);
            if (!b) {
                r->no_memory = 1; /* keep reading (and dropping): the 500 follows */
                return MHD_YES;
            }
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    struct ctx c = {.a = a, .conn = conn, .r = r, .param = r->param, .param2 = r->param2,
                    .json_failures = http_json_failures()};
    if (r->no_memory) return http_send_oom(&c);
    if (r->route == -1) {
        char detail[160];
        snprintf(detail, sizeof detail, "no route %.*s (GET /openapi.yaml lists them)",
                 (int)utf8_cut(url, 100), url);
        return http_send_problem(&c, 404, NULL, detail, NULL, NULL);
    }
    if (r->route == -2) return not_allowed(&c, url);
    const struct route *rt = &routes[r->route];
    enum MHD_Result ares;
    if (http_authorize(&c, rt->auth, &ares)) return ares;
    if (r->too_big) {
        char detail[96];
        snprintf(detail, sizeof detail, "the body is larger than the limit of %lld bytes",
                 r->upload ? (long long)a->cfg.upload_max_bytes : (long long)a->cfg.max_body);
        return http_send_problem(&c, 413, r->upload ? "archive-too-large" : NULL, detail, NULL,
                                 NULL);
    }
    enum MHD_Result res = rt->fn(&c);
    /* a refused request leaves its key free for a retry */
    if (c.idem_open) jobs_idem_abandon(a->cfg.db, c.owner, c.idem_key);
    return res;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct req *r = *con_cls;
    http_guard_idle(((struct api *)cls)->guard, conn); /* waiting for its next head */
    if (!r || r == &oom_req) return;
    double sec = clock_now_s() - r->t0;
    if (r->status) metrics_http_observe(r->route, r->method, r->status, sec);
    if (!r->job[0] && r->route >= 0 && pool_job_id_valid(r->param)) /* /jobs/{id}/... */
        memcpy(r->job, r->param, strlen(r->param) + 1); /* a valid id fits */
    struct log_request lr = {.request_id = r->rid, .method = r->method, .path = r->path,
                             .route = r->route >= 0 ? routes[r->route].pattern : NULL,
                             .job = r->job, .status = r->status, .duration_ms = sec * 1e3};
    log_request(&lr);
    if (r->upload_fd >= 0) close(r->upload_fd);
    if (r->upload_path[0]) unlink(r->upload_path); /* an upload refused or cut off */
    api_plan_drop(r);
    if (r->idem_open) /* closed before its resumed handler answered: the key free again */
        jobs_idem_abandon(((struct api *)cls)->cfg.db, r->idem_owner, r->idem_key);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

/* libmicrohttpd's own messages (a request it refuses before any handler, a connection it drops)
 * through the server's logger: with --log-format json every stderr line stays one object */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r' || msg[n - 1] == ' ')) msg[--n] = 0;
    log_msg(LOG_WARN, "libmicrohttpd: %s", msg);
}

/* the line of openapi.yaml that names where the routes are; the served copy names the prefix */
#define OPENAPI_SERVERS_LINE "\nservers: [{url: /}]\n"

int api_path_prefix_check(const char *p, char *out, size_t n, char *err, size_t errlen)
{
    if (api_parse_path_prefix(p, out, n)) {
        snprintf(err, errlen, "the path prefix '%.80s' is not /SEGMENT[/SEGMENT...] (letters, "
                              "digits, '.', '_', '~', '-'; at most %d bytes)", p, API_PARSE_PREFIX_MAX);
        return -1;
    }
    size_t s1 = strcspn(out + (*out != 0), "/");
    for (int i = 0; *out && i < N_ROUTES; i++) {
        const char *seg = routes[i].pattern + 1;
        size_t s2 = strcspn(seg, "/");
        if (s1 == s2 && strncmp(out + 1, seg, s1) == 0) {
            snprintf(err, errlen, "the path prefix '%s' begins like the route %s %s: choose "
                                  "another first segment", out, routes[i].method, routes[i].pattern);
            out[0] = 0;
            return -1;
        }
    }
    return 0;
}

/* a->prefix from p (api_path_prefix_check) and a->openapi: the document with its servers entry
 * set to it */
static int api_prefix_set(struct api *a, const char *p, char *err, size_t errlen)
{
    if (api_path_prefix_check(p, a->prefix, sizeof a->prefix, err, errlen)) return -1;
    const char *doc = a->cfg.openapi ? a->cfg.openapi : "";
    size_t len = a->cfg.openapi ? a->cfg.openapi_len : 0;
    const char *at = memmem(doc, len, OPENAPI_SERVERS_LINE, strlen(OPENAPI_SERVERS_LINE));
    if (!at) {
        snprintf(err, errlen, "openapi.yaml has no line \"%s\" to name the path prefix in",
                 "servers: [{url: /}]");
        return -1;
    }
    size_t head = (size_t)(at - doc) + strlen("\nservers: [{url: ");
    const char *tail = at + strlen(OPENAPI_SERVERS_LINE) - strlen("}]\n");
    const char *url = *a->prefix ? a->prefix : "/";
    a->openapi_len = head + strlen(url) + (size_t)(doc + len - tail);
    a->openapi = malloc(a->openapi_len + 1);
    if (!a->openapi) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(a->openapi, doc, head);
    memcpy(a->openapi + head, url, strlen(url));
    memcpy(a->openapi + head + strlen(url), tail, (size_t)(doc + len - tail));
    a->openapi[a->openapi_len] = 0;
    return 0;
}

/* a webhook body's "job": what GET /jobs/{id} (or /samples/{id}) answers */
static char *webhook_job(void *ctx, const char *id)
{
    struct api *a = ctx;
    struct job_row r;
    if (jobs_get(a->cfg.db, id, &r)) return NULL;
    cJSON *o = strcmp(r.kind, "sample") == 0 ? api_sample_json(a, &r) : api_job_json(a, &r);
    job_row_free(&r);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int api_start(struct api **out, const struct api_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    struct api *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return API_ERR_START;
    }
    a->cfg = *cfg;
    if (!(a->cfg.keepalive_s > 0)) a->cfg.keepalive_s = 15;
    static const char *methods[N_ROUTES], *patterns[N_ROUTES];
    static int streams[N_ROUTES];
    for (int i = 0; i < N_ROUTES; i++)
        methods[i] = routes[i].method, patterns[i] = routes[i].pattern,
        streams[i] = routes[i].fn == h_events;
    metrics_set_routes(methods, patterns, streams, N_ROUTES);
    if (cfg->webhook) webhook_set_renderer(cfg->webhook, webhook_job, a);
    if (api_prefix_set(a, cfg->path_prefix ? cfg->path_prefix : "", err, errlen)) {
        free(a);
        return API_ERR_START;
    }
    a->admitting = 1;
    a->oom = MHD_create_response_from_buffer(strlen(HTTP_OOM_BODY), HTTP_OOM_BODY,
                                             MHD_RESPMEM_PERSISTENT);
    if (!a->oom ||
        MHD_add_response_header(a->oom, MHD_HTTP_HEADER_CONTENT_TYPE, "application/problem+json") !=
            MHD_YES) {
        snprintf(err, errlen, "out of memory");
        if (a->oom) MHD_destroy_response(a->oom);
        free(a->openapi);
        free(a);
        return API_ERR_START;
    }
    pthread_mutex_init(&a->mu, NULL);
    if (pthread_create(&a->ticker, NULL, api_events_ticker, a)) {
        snprintf(err, errlen, "cannot start the event-stream api_events_ticker");
        goto fail;
    }
    a->ticker_on = 1;
    int max_conns = cfg->max_conns > 0 ? cfg->max_conns : API_MAX_CONNS;
    int reserved = cfg->conns_reserved > 0 ? cfg->conns_reserved : max_conns / 16;
    if (reserved >= max_conns) reserved = max_conns - 1;
    if (http_guard_start(&a->guard, max_conns - reserved,
                         cfg->head_timeout_s > 0 ? cfg->head_timeout_s : API_HEAD_TIMEOUT_S)) {
        snprintf(err, errlen, "cannot start the connection guard");
        goto fail;
    }
    /* the planning's threads and queue (a request waiting for its plan is suspended: it holds
     * no HTTP thread) and the uploads' decoding */
    int threads = cfg->threads > 0 ? cfg->threads : 4;
    int pw = cfg->plan_workers > 0 ? cfg->plan_workers : 1;
    int pq = cfg->plan_queue > 0 ? cfg->plan_queue : 4;
    if (!(a->cfg.plan_timeout_s > 0)) a->cfg.plan_timeout_s = API_PLAN_TIMEOUT_S;
    int uw = cfg->upload_workers > 0 ? cfg->upload_workers : 1;
    int uq = cfg->upload_queue > 0 ? cfg->upload_queue : 8;
    a->decoder_cap = uw + uq;
    if (worker_start(&a->planner, pw, pq) || worker_start(&a->decoder, uw, uq) ||
        api_plans_start(a)) {
        snprintf(err, errlen, "cannot start the planning and upload threads");
        goto fail;
    }
    /* what a stopped server left validating, decoded again before any request comes */
    if (api_datasets_resume(a, pool_config_of(a->cfg.pool)->data_dir))
        log_msg(LOG_WARN, "the uploads left validating cannot be queued: they stay validating");
    a->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, a, MHD_OPTION_LISTEN_SOCKET, cfg->listen_fd,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, a,
                            MHD_OPTION_CONNECTION_TIMEOUT, 120u,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(cfg->conns_per_ip > 0 ? cfg->conns_per_ip : 0),
                            MHD_OPTION_NOTIFY_CONNECTION, http_guard_notify, a->guard,
                            MHD_OPTION_END);
    if (!a->d) {
        snprintf(err, errlen, "libmicrohttpd did not start on the listening socket");
        goto fail;
    }
    *out = a;
    return API_OK;
fail:
    if (a->ticker_on) {
        pthread_mutex_lock(&a->mu);
        a->stopping = 1;
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->ticker, NULL);
    }
    worker_free(a->planner);
    api_plans_free(a);
    worker_free(a->decoder);
    http_guard_stop(a->guard);
    pthread_mutex_destroy(&a->mu);
    MHD_destroy_response(a->oom);
    free(a->openapi);
    free(a);
    return API_ERR_START;
}

void api_init_process(void) { http_json_hooks(); }

void api_stop_admitting(struct api *a)
{
    pthread_mutex_lock(&a->mu);
    a->admitting = 0;
    pthread_mutex_unlock(&a->mu);
}

void api_stop(struct api *a)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stopping = 1;
    a->admitting = 0;
    api_events_resume(a, 1);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->ticker, NULL);
    /* the waiting plans dropped, the running ones finished (each resumes its request), the
     * deadline watcher stopped (it resumes any left): no connection stays suspended */
    worker_stop(a->planner);
    api_plans_stop(a);
    worker_stop(a->decoder);
    MHD_stop_daemon(a->d);
    /* freed only now: a handler may still have asked them (a 503 stopping) until the daemon
     * stopped */
    worker_free(a->planner);
    api_plans_free(a);
    worker_free(a->decoder);
    http_guard_stop(a->guard);
    pthread_mutex_destroy(&a->mu);
    MHD_destroy_response(a->oom);
    free(a->openapi);
    free(a);
}
