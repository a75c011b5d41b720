/* api.c - the HTTP routes of ddpmd serve (see api.h): one table drives dispatch, 404/405 and
 * `ddpmd serve --routes`; every error is application/problem+json; event streams are responses
 * from a callback that suspend their connection while there is nothing to send, so a stream
 * costs no thread.
 */
#define _GNU_SOURCE
#include "api.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "export.h"
#include "dataset.h"
#include "fsio.h"
#include "log.h"
#include "metrics.h"
#include "parse.h"
#include "safetensors.h"
#include "spec.h"
#include "train.h"
#include "upload.h"

#define SSE_BATCH 64
#define LIST_LIMIT_MAX 200
#define LIST_LIMIT_DEFAULT 50
#define PROBLEM_BASE "urn:ddpmd:problem:"
#define REQUEST_ID_MAX 64

struct sse;

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
};

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
};

/* the request the calling HTTP thread is answering: handlers run inside on_request, so every
 * response queued on this thread belongs to it (respond() stamps its status and id) */
static _Thread_local struct req *tl_req;

struct ctx {
    struct api *a;
    struct MHD_Connection *conn;
    struct req *r;
    const char *param, *param2;
    char owner[64];
    int admin;
    char idem_key[129];     /* the request's Idempotency-Key */
    int idem_open;          /* the key is reserved for this request: answer or abandon it */
};

typedef enum MHD_Result (*handler_fn)(struct ctx *c);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- responses ---- */

/* the path prefix + the formatted path: every URL the server emits (Location, links, event data)
 * is made here, so a client behind the proxy can follow it as given */
static void api_link(const struct api *a, char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void api_link(const struct api *a, char *buf, size_t n, const char *fmt, ...)
{
    size_t pl = strlen(a->prefix);
    snprintf(buf, n, "%s", a->prefix);
    if (pl >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + pl, n - pl, fmt, ap);
    va_end(ap);
}

/* every response goes out here: it carries the request's X-Request-Id, and its status is kept
 * for the access log and the metrics */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
                               struct MHD_Response *res)
{
    if (tl_req) {
        tl_req->status = status;
        MHD_add_response_header(res, "X-Request-Id", tl_req->rid);
    }
    return MHD_queue_response(conn, status, res);
}

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *type,
                                 const char *body, const char *const *headers)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                               MHD_RESPMEM_MUST_COPY);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    for (int i = 0; headers && headers[i]; i += 2) MHD_add_response_header(res, headers[i], headers[i + 1]);
    enum MHD_Result r = respond(conn, status, res);
    MHD_destroy_response(res);
    return r;
}

/* sends o (and deletes it) */
static enum MHD_Result send_json(struct MHD_Connection *conn, unsigned status, cJSON *o,
                                 const char *type, const char *const *headers)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return MHD_NO;
    enum MHD_Result r = send_text(conn, status, type ? type : "application/json", s, headers);
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

/* RFC 9457: type (about:blank for plain HTTP statuses), title, status, detail, and extension
 * members in extra (errors[] with field paths, needed_bytes, ...), which is consumed */
static enum MHD_Result problem(struct MHD_Connection *conn, unsigned status, const char *slug,
                               const char *detail, cJSON *extra, const char *const *headers)
{
    cJSON *o = extra ? extra : cJSON_CreateObject();
    char type[96];
    snprintf(type, sizeof type, "%s%s", slug ? PROBLEM_BASE : "about:blank", slug ? slug : "");
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddStringToObject(o, "title", status_title(status));
    cJSON_AddNumberToObject(o, "status", status);
    cJSON_AddStringToObject(o, "detail", detail);
    return send_json(conn, status, o, "application/problem+json", headers);
}

static cJSON *errors_one(const char *path, const char *msg)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "errors");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddItemToArray(arr, e);
    return o;
}

static enum MHD_Result invalid(struct MHD_Connection *conn, unsigned status, const char *path,
                               const char *msg)
{
    char detail[400];
    snprintf(detail, sizeof detail, "%s%s%s", path, *path ? ": " : "", msg);
    return problem(conn, status, "validation", detail, errors_one(path, msg), NULL);
}

/* ---- jobs as JSON ---- */

static void add_num_or_null(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static void add_str_or_null(cJSON *o, const char *k, const char *v)
{
    if (v && *v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

/* where a job runs and its plans: device (null until it starts), reserved_bytes and plan (on its
 * device, or while queued on the first device it fits), plans (every device's). The stored plans
 * are the server's own JSON, put in as they are */
static void add_placement(cJSON *o, const struct job_row *r)
{
    add_str_or_null(o, "device", r->device);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)r->reserved_bytes);
    cJSON_AddItemToObject(o, "plan", cJSON_CreateRaw(r->plan && r->plan[0] ? r->plan : "{}"));
    cJSON_AddItemToObject(o, "plans", r->plans ? cJSON_CreateRaw(r->plans) : cJSON_CreateNull());
}

static cJSON *job_json(const struct api *a, const struct job_row *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "kind", r->kind);
    cJSON_AddStringToObject(o, "owner", r->owner);
    cJSON_AddStringToObject(o, "state", job_state_name(r->state));
    if (r->threads > 0)
        cJSON_AddNumberToObject(o, "threads", r->threads);
    else
        cJSON_AddNullToObject(o, "threads");
    add_placement(o, r);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    add_num_or_null(o, "loss", r->loss);
    add_num_or_null(o, "images_per_s", r->img_per_s);
    add_str_or_null(o, "error", r->error);
    cJSON_AddBoolToObject(o, "cancel_requested", r->cancel_requested);
    cJSON_AddNumberToObject(o, "starts", r->starts);
    add_str_or_null(o, "created_at", r->created_at);
    add_str_or_null(o, "started_at", r->started_at);
    add_str_or_null(o, "ended_at", r->ended_at);
    /* the stored spec is canonical JSON the server wrote (spec_to_json): put in as it is */
    cJSON_AddItemToObject(o, "spec", cJSON_CreateRaw(r->spec && r->spec[0] ? r->spec : "{}"));
    char buf[192];
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    api_link(a, buf, sizeof buf, "/jobs/%s", r->id);
    cJSON_AddStringToObject(links, "self", buf);
    api_link(a, buf, sizeof buf, "/jobs/%s/events", r->id);
    cJSON_AddStringToObject(links, "events", buf);
    api_link(a, buf, sizeof buf, "/jobs/%s/checkpoints", r->id);
    cJSON_AddStringToObject(links, "checkpoints", buf);
    return o;
}

/* the job named by the path, visible to the caller: 0, or the response was sent (*res) */
static int load_job(struct ctx *c, const char *id, struct job_row *r, enum MHD_Result *res)
{
    memset(r, 0, sizeof *r);
    char detail[160];
    if (!pool_job_id_valid(id)) {
        snprintf(detail, sizeof detail, "no job '%.40s' (job ids look like j0123456789abcdef)", id);
        *res = problem(c->conn, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    int rc = jobs_get(c->a->cfg.db, id, r);
    if (rc == JOBS_ERR_NOT_FOUND) {
        snprintf(detail, sizeof detail, "no job %s", id);
        *res = problem(c->conn, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    if (rc) {
        *res = problem(c->conn, 500, NULL, "the job store cannot be read", NULL, NULL);
        return -1;
    }
    if (!c->admin && strcmp(r->owner, c->owner) != 0) {
        snprintf(detail, sizeof detail, "job %s belongs to another token", id);
        job_row_free(r);
        *res = problem(c->conn, 403, NULL, detail, NULL, NULL);
        return -1;
    }
    return 0;
}

/* ---- handlers ---- */

static cJSON *sample_json(const struct api *a, const struct job_row *r);

/* the answer of a keyed request whose job was made but whose answer was not stored (its save
 * failed, or the server died first): 202 with the job as it is now, stored as the key's answer */
static enum MHD_Result idem_made(struct ctx *c, const char *id)
{
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return problem(c->conn, 500, NULL, "the job this key made cannot be read", NULL, NULL);
    int sample = strcmp(r.kind, "sample") == 0;
    char loc[160];
    api_link(c->a, loc, sizeof loc, sample ? "/samples/%s" : "/jobs/%s", id);
    cJSON *o = sample ? sample_json(c->a, &r) : job_json(c->a, &r);
    job_row_free(&r);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return MHD_NO;
    snprintf(c->r->job, sizeof c->r->job, "%s", id);
    jobs_idem_finish(c->a->cfg.db, c->owner, c->idem_key, 202, loc, s);
    enum MHD_Result res = send_text(c->conn, 202, "application/json", s,
                                    (const char *const[]){"Location", loc, "Idempotent-Replayed",
                                                          "true", NULL});
    free(s);
    return res;
}

/* Idempotency-Key on POST /train and POST /samples: 1 when the answer is already sent (the
 * first answer replayed, a key reused with another body: 422, a key whose first request is still
 * being answered: 409, a malformed key: 400); 0 to go on (the key, if any, reserved) */
static int idem_begin(struct ctx *c, const char *route, enum MHD_Result *res)
{
    const char *k = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (!k) return 0;
    if (api_parse_idem_key(k)) {
        *res = invalid(c->conn, 400, "Idempotency-Key",
                       "expected 1 to 128 printable ASCII characters without spaces");
        return 1;
    }
    snprintf(c->idem_key, sizeof c->idem_key, "%s", k);
    size_t bl = c->r->len, rl = strlen(route);
    char *req = malloc(rl + 1 + bl + 1);
    if (!req) {
        *res = MHD_NO;
        return 1;
    }
    memcpy(req, route, rl);
    req[rl] = '\n';
    if (bl) memcpy(req + rl + 1, c->r->body, bl);
    req[rl + 1 + bl] = 0;
    int outcome, status;
    char *loc = NULL, *body = NULL, made[JOBS_ID_LEN];
    int rc = jobs_idem_begin(c->a->cfg.db, c->owner, c->idem_key, req, &outcome, &status, &loc,
                             &body, made);
    free(req);
    if (rc == JOBS_ERR_FULL) { /* the reservation is a write: a full disk refuses it */
        char detail[400];
        snprintf(detail, sizeof detail, "the idempotency key cannot be stored: %s", jobs_errmsg());
        *res = problem(c->conn, 507, "insufficient-storage", detail, NULL, NULL);
        return 1;
    }
    if (rc) {
        *res = problem(c->conn, 500, NULL, "the idempotency keys cannot be read", NULL, NULL);
        return 1;
    }
    if (outcome == JOBS_IDEM_NEW) {
        c->idem_open = 1;
        return 0;
    }
    if (outcome == JOBS_IDEM_DONE) {
        *res = send_text(c->conn, (unsigned)status, "application/json", body,
                         (const char *const[]){"Location", loc, "Idempotent-Replayed", "true", NULL});
    } else if (outcome == JOBS_IDEM_MADE) {
        *res = idem_made(c, made);
    } else if (outcome == JOBS_IDEM_MISMATCH) {
        *res = problem(c->conn, 422, "idempotency-key-reused",
                       "this Idempotency-Key was used with another request body or route",
                       errors_one("Idempotency-Key", "already used with another request"), NULL);
    } else {
        *res = problem(c->conn, 409, "idempotency-key-in-flight",
                       "the first request with this Idempotency-Key is still being answered",
                       NULL, (const char *const[]){"Retry-After", "1", NULL});
    }
    free(loc);
    free(body);
    return 1;
}

/* a 202 with Location; stored as the answer of the request's Idempotency-Key, if it has one */
static enum MHD_Result accepted(struct ctx *c, cJSON *o, const char *loc)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return MHD_NO;
    const char *slash = strrchr(loc, '/');
    if (c->r && slash) snprintf(c->r->job, sizeof c->r->job, "%s", slash + 1);
    if (c->idem_open &&
        jobs_idem_finish(c->a->cfg.db, c->owner, c->idem_key, 202, loc, s) == JOBS_OK)
        c->idem_open = 0;
    enum MHD_Result r = send_text(c->conn, 202, "application/json", s,
                                  (const char *const[]){"Location", loc, NULL});
    free(s);
    return r;
}

static enum MHD_Result submit_refused(struct ctx *c, int rc, struct pool_admission *adm,
                                      const char *err, const char *plan_path);
static cJSON *upload_json(struct ctx *c, const char *id);
static int upload_visible(struct ctx *c, const cJSON *o);
static const char *data_dir(struct ctx *c);

static enum MHD_Result h_train(struct ctx *c)
{
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!api_parse_json_content_type(ct))
        return problem(c->conn, 415, NULL, "POST /train takes a TrainSpec as application/json",
                       NULL, (const char *const[]){"Accept-Post", "application/json", NULL});
    if (!c->a->admitting)
        return problem(c->conn, 503, "stopping", "the server is shutting down", NULL,
                       (const char *const[]){"Retry-After", "10", NULL});
    enum MHD_Result ires;
    if (idem_begin(c, "POST /train", &ires)) return ires;
    /* the body parsed once: the spec, and "webhook" beside it ({"url", "events"}) */
    static const char *const extra[] = {"webhook", NULL};
    struct train_spec spec;
    struct spec_errors es;
    cJSON *extras = NULL;
    int spec_bad = spec_parse_request(c->r->body ? c->r->body : "", c->r->len, extra, &extras,
                                      &spec, &es);
    if (es.syntax) {
        char detail[200];
        snprintf(detail, sizeof detail, "the body is not valid JSON (at byte %zu of %zu)",
                 es.syntax_at, c->r->len);
        cJSON_Delete(extras);
        return problem(c->conn, 400, "malformed-json", detail, NULL, NULL);
    }
    struct webhook_sub sub;
    const cJSON *wh = cJSON_GetObjectItemCaseSensitive(extras, "webhook");
    int hook = wh != NULL;
    if (wh) {
        char wpath[64], wmsg[200];
        int bad = !c->a->cfg.webhook ||
                  webhook_parse(c->a->cfg.webhook, wh, &sub, wpath, sizeof wpath, wmsg, sizeof wmsg);
        if (!c->a->cfg.webhook) snprintf(wpath, sizeof wpath, "webhook"),
                                snprintf(wmsg, sizeof wmsg, "this server sends no webhooks");
        if (bad) {
            cJSON_Delete(extras);
            return invalid(c->conn, 422, wpath, wmsg);
        }
    }
    cJSON_Delete(extras);
    if (spec_bad) {
        cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "errors");
        for (int i = 0; i < es.n; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "path", es.e[i].path);
            cJSON_AddStringToObject(e, "message", es.e[i].msg);
            cJSON_AddItemToArray(arr, e);
        }
        char detail[600];
        snprintf(detail, sizeof detail, "the spec has %d error%s; the first: %.128s%s%.256s", es.n,
                 es.n == 1 ? "" : "s", es.n ? es.e[0].path : "", es.n ? ": " : "",
                 es.n ? es.e[0].msg : "");
        return problem(c->conn, 422, "validation", detail, o, NULL);
    }
    /* over HTTP a job names data by id, never by a path on the server's disk: the built-in
     * fashion-mnist or an upload the caller can see, whose images/ folder the child reads */
    char data_path[FSIO_PATH_MAX], init_path[FSIO_PATH_MAX];
    struct pool_train job = {.spec = &spec};
    int uploaded = strcmp(spec.dataset, "fashion-mnist") != 0;
    if (uploaded) {
        cJSON *d = upload_id_valid(spec.dataset) ? upload_json(c, spec.dataset) : NULL;
        int visible = d && upload_visible(c, d);
        cJSON_Delete(d);
        if (!visible ||
            upload_dataset_path(data_dir(c), spec.dataset, "images", data_path,
                                sizeof data_path) ||
            strlen(data_path) >= SPEC_PATH_MAX)
            return invalid(c->conn, 422, "data.dataset",
                           "unknown dataset id: \"fashion-mnist\" or an uploaded dataset's id "
                           "(GET /datasets lists them; a server path is never accepted over HTTP)");
        job.dataset_dir = data_path;
    }
    /* the decoded dataset must fit this host: refused before any planning (an upload is
     * counted in its folder, the spec keeps its id) */
    struct train_spec at = spec;
    char host_why[400];
    if (uploaded) memcpy(at.dataset, data_path, strlen(data_path) + 1);
    if (spec_host_check(&at, host_why, sizeof host_why))
        return invalid(c->conn, 422, "data.dataset", host_why);
    if (spec.init_from[0]) {
        char jid[JOBS_ID_LEN];
        int64_t step;
        struct job_row src;
        struct stat sb;
        if (pool_checkpoint_id_parse(spec.init_from, jid, sizeof jid, &step))
            return invalid(c->conn, 422, "init_from",
                           "expected a checkpoint id like j0123456789abcdef-300 (GET "
                           "/jobs/{id}/checkpoints lists them), or null");
        int rc = jobs_get(c->a->cfg.db, jid, &src);
        int visible = rc == JOBS_OK && (c->admin || strcmp(src.owner, c->owner) == 0);
        job_row_free(&src);
        if (!visible ||
            pool_checkpoint_path(c->a->cfg.pool, jid, step, init_path, sizeof init_path) ||
            stat(init_path, &sb) || !S_ISREG(sb.st_mode))
            return invalid(c->conn, 422, "init_from", "no such checkpoint");
        if (strlen(init_path) >= SPEC_PATH_MAX)
            return invalid(c->conn, 422, "init_from", "the checkpoint's path is too long");
        job.init_path = init_path;
    }
    struct pool_admission adm = {0};
    char id[JOBS_ID_LEN], err[1024];
    /* an uploaded dataset cannot be deleted between the check above and the job's queueing */
    if (uploaded) upload_lock();
    /* the job's events are looked up for its webhook only once it is stored (webhook.h) */
    if (hook) webhook_lock(c->a->cfg.webhook);
    int still = !uploaded || access(data_path, F_OK) == 0;
    int rc = still ? pool_submit(c->a->cfg.pool, c->owner, c->idem_open ? c->idem_key : NULL, &job,
                                 &adm, id, err, sizeof err)
                   : 0;
    int wrc = hook && still && rc == 0 ? webhook_register(c->a->cfg.webhook, id, &sub, err, sizeof err) : 0;
    if (hook) webhook_unlock(c->a->cfg.webhook);
    if (uploaded) upload_unlock();
    if (!still) return invalid(c->conn, 422, "data.dataset", "the dataset was deleted");
    if (rc) return submit_refused(c, rc, &adm, err, "model");
    cJSON_Delete(adm.plans);
    if (wrc) { /* queued already: it runs, and says why it sends nothing */
        char line[700];
        snprintf(line, sizeof line, "{\"event\":\"register\",\"ok\":false,\"error\":\"the webhook "
                 "could not be stored\"}");
        jobs_event_append(c->a->cfg.db, id, "webhook", line, NULL);
    }
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return problem(c->conn, 500, NULL, "the new job cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/jobs/%s", id);
    cJSON *o = job_json(c->a, &r);
    job_row_free(&r);
    return accepted(c, o, loc);
}

static const char *arg(struct ctx *c, const char *k)
{
    return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, k);
}

/* ---- sampling jobs (kind "sample": the same store, pool, cancel and event stream) ---- */

#define SAMPLE_N_MAX 1024

static cJSON *sample_json(const struct api *a, const struct job_row *r)
{
    cJSON *o = cJSON_CreateObject();
    char buf[192];
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "kind", r->kind);
    cJSON_AddStringToObject(o, "owner", r->owner);
    cJSON_AddStringToObject(o, "state", job_state_name(r->state));
    add_placement(o, r);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    add_str_or_null(o, "error", r->error);
    add_str_or_null(o, "created_at", r->created_at);
    add_str_or_null(o, "started_at", r->started_at);
    add_str_or_null(o, "ended_at", r->ended_at);
    cJSON *params = cJSON_Parse(r->spec);
    cJSON_AddItemToObject(o, "params", params ? params : cJSON_CreateObject());
    /* the images exist once the job succeeded (cmd_sample writes them after the loop) */
    cJSON *imgs = cJSON_AddArrayToObject(o, "images");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(params, "n");
    if (r->state == JOB_SUCCEEDED && cJSON_IsNumber(n))
        for (int k = 0; k < n->valueint; k++) {
            api_link(a, buf, sizeof buf, "/samples/%s/images/%d.png", r->id, k);
            cJSON_AddItemToArray(imgs, cJSON_CreateString(buf));
        }
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    api_link(a, buf, sizeof buf, "/samples/%s", r->id);
    cJSON_AddStringToObject(links, "self", buf);
    api_link(a, buf, sizeof buf, "/samples/%s.png", r->id);
    if (r->state == JOB_SUCCEEDED)
        cJSON_AddStringToObject(links, "grid", buf);
    else
        cJSON_AddNullToObject(links, "grid");
    api_link(a, buf, sizeof buf, "/jobs/%s/events", r->id);
    cJSON_AddStringToObject(links, "events", buf);
    api_link(a, buf, sizeof buf, "/jobs/%s/cancel", r->id);
    cJSON_AddStringToObject(links, "cancel", buf);
    return o;
}

/* load_job, and the job is a sampling job (a training job's id is no sample: 404) */
static int load_sample(struct ctx *c, const char *id, struct job_row *r, enum MHD_Result *res)
{
    if (load_job(c, id, r, res)) return -1;
    if (strcmp(r->kind, "sample") != 0) {
        char detail[160];
        snprintf(detail, sizeof detail, "no sample %s (%s is a %s job: GET /jobs/%s)", id, id,
                 r->kind, id);
        job_row_free(r);
        *res = problem(c->conn, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    return 0;
}

static void err_add(cJSON *arr, const char *path, const char *msg)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddItemToArray(arr, e);
}

/* an integer field in [lo, hi] (absent: def); 0 when valid */
static int field_int(const cJSON *o, const char *k, double lo, double hi, double def, double *v,
                     cJSON *errs)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
    char msg[120];
    *v = def;
    if (!f || cJSON_IsNull(f)) return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || f->valuedouble < lo ||
        f->valuedouble > hi) {
        snprintf(msg, sizeof msg, "expected an integer from %.0f to %.0f", lo, hi);
        err_add(errs, k, msg);
        return -1;
    }
    *v = f->valuedouble;
    return 0;
}

static enum MHD_Result send_problem_errors(struct ctx *c, cJSON *o)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "errors");
    int n = cJSON_GetArraySize(arr);
    const cJSON *e0 = cJSON_GetArrayItem(arr, 0);
    const cJSON *p0 = cJSON_GetObjectItemCaseSensitive(e0, "path");
    const cJSON *m0 = cJSON_GetObjectItemCaseSensitive(e0, "message");
    char detail[600];
    snprintf(detail, sizeof detail, "the request has %d error%s; the first: %.128s%s%.256s", n,
             n == 1 ? "" : "s", cJSON_IsString(p0) ? p0->valuestring : "",
             cJSON_IsString(p0) && *p0->valuestring ? ": " : "",
             cJSON_IsString(m0) ? m0->valuestring : "");
    return problem(c->conn, 422, "validation", detail, o, NULL);
}

/* a submit refused by the pool -> its problem (shared by POST /train and POST /samples); frees
 * adm's plans */
static enum MHD_Result submit_refused(struct ctx *c, int rc, struct pool_admission *adm,
                                      const char *err, const char *plan_path)
{
    cJSON *plans = adm->plans;
    adm->plans = NULL;
    if (rc == POOL_ERR_NEVER_FITS || rc == POOL_ERR_POISONED) {
        /* the device closest to fitting (never-fits) or the poisoned one it fits: its bytes
         * and its plan, the smallest one its search found; every device's in plans */
        const struct pool_fit *f = &adm->fit[adm->first >= 0 ? adm->first : 0];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "needed_bytes", (double)f->reserved);
        cJSON_AddNumberToObject(o, "budget_bytes", (double)f->budget);
        cJSON_AddStringToObject(o, "device", f->device);
        cJSON *plan = cJSON_Duplicate(cJSON_GetArrayItem(plans, adm->first), 1);
        cJSON_AddItemToObject(o, "plan", plan ? plan : cJSON_CreateObject());
        cJSON_AddItemToObject(o, "plans", plans ? plans : cJSON_CreateArray());
        if (rc == POOL_ERR_POISONED)
            return problem(c->conn, 503, "device-poisoned", err, o,
                           (const char *const[]){"Retry-After", "60", NULL});
        return problem(c->conn, 422, "never-fits", err, o, NULL);
    }
    cJSON_Delete(plans);
    if (rc == POOL_ERR_QUEUE_FULL)
        return problem(c->conn, 503, "queue-full", err, NULL,
                       (const char *const[]){"Retry-After", "30", NULL});
    if (rc == POOL_ERR_STOPPING)
        return problem(c->conn, 503, "stopping", err, NULL,
                       (const char *const[]){"Retry-After", "10", NULL});
    /* the caller's own limit, not the server's state: 429 (503 is the whole queue) */
    if (rc == POOL_ERR_OWNER_LIMIT)
        return problem(c->conn, 429, "owner-limit", err, NULL,
                       (const char *const[]){"Retry-After", "30", NULL});
    if (rc == POOL_ERR_PLAN) return invalid(c->conn, 422, plan_path, err);
    /* the data directory's disk is full: nothing was stored; a retry may work once space is freed */
    if (rc == POOL_ERR_STORAGE) return problem(c->conn, 507, "insufficient-storage", err, NULL, NULL);
    return problem(c->conn, 500, NULL, err, NULL, NULL);
}

static int json_content_type(struct ctx *c)
{
    return api_parse_json_content_type(
        MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));
}

/* POST /samples: {checkpoint | job, n, sampler, steps, eta, seed, ema, batch}; the checkpoint
 * (a job's newest when given a job) must be visible to the caller */
static enum MHD_Result h_samples_post(struct ctx *c)
{
    if (!json_content_type(c))
        return problem(c->conn, 415, NULL, "POST /samples takes a SampleRequest as application/json",
                       NULL, (const char *const[]){"Accept-Post", "application/json", NULL});
    if (!c->a->admitting)
        return problem(c->conn, 503, "stopping", "the server is shutting down", NULL,
                       (const char *const[]){"Retry-After", "10", NULL});
    enum MHD_Result ires;
    if (idem_begin(c, "POST /samples", &ires)) return ires;
    const char *body = c->r->body ? c->r->body : "";
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, c->r->len, &at, 0);
    if (!root) {
        char detail[200];
        size_t off = at && at >= body ? (size_t)(at - body) : 0;
        snprintf(detail, sizeof detail, "the body is not valid JSON (at byte %zu of %zu)", off,
                 c->r->len);
        return problem(c->conn, 400, "malformed-json", detail, NULL, NULL);
    }
    static const char *const known[] = {"checkpoint", "job", "n", "sampler", "steps", "eta",
                                        "seed", "ema", "batch", NULL};
    struct pool_sample s;
    memset(&s, 0, sizeof s);
    cJSON *eo = cJSON_CreateObject(), *errs = cJSON_AddArrayToObject(eo, "errors");
    enum MHD_Result res;
    if (!cJSON_IsObject(root)) {
        err_add(errs, "", "expected a JSON object");
        goto invalid;
    }
    for (const cJSON *f = root->child; f; f = f->next) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= f->string && strcmp(f->string, known[i]) == 0;
        if (!ok) {
            char path[80];
            snprintf(path, sizeof path, "%.64s", f->string ? f->string : "");
            err_add(errs, path, "unknown field");
        }
    }
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(root, "checkpoint");
    const cJSON *jb = cJSON_GetObjectItemCaseSensitive(root, "job");
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(root, "sampler");
    const cJSON *eta = cJSON_GetObjectItemCaseSensitive(root, "eta");
    const cJSON *ema = cJSON_GetObjectItemCaseSensitive(root, "ema");
    if (cJSON_IsNull(ck)) ck = NULL;
    if (cJSON_IsNull(jb)) jb = NULL;
    if (!ck == !jb)
        err_add(errs, ck ? "job" : "checkpoint",
                "give exactly one of checkpoint (an id like j0123456789abcdef-300) or job (its "
                "newest checkpoint)");
    if (ck && !cJSON_IsString(ck)) err_add(errs, "checkpoint", "expected a checkpoint id (a string)");
    if (jb && !cJSON_IsString(jb)) err_add(errs, "job", "expected a job id (a string)");
    double n, steps, seed, batch;
    field_int(root, "n", 1, SAMPLE_N_MAX, 16, &n, errs);
    field_int(root, "steps", 1, 100000, -1, &steps, errs);
    field_int(root, "seed", 0, 9007199254740991.0, 1, &seed, errs);
    field_int(root, "batch", 1, SPEC_BATCH_MAX, 16, &batch, errs);
    snprintf(s.sampler, sizeof s.sampler, "ddim");
    if (sm && !cJSON_IsNull(sm)) {
        if (cJSON_IsString(sm) && (strcmp(sm->valuestring, "ddim") == 0 ||
                                   strcmp(sm->valuestring, "ddpm") == 0))
            snprintf(s.sampler, sizeof s.sampler, "%s", sm->valuestring);
        else
            err_add(errs, "sampler", "expected \"ddim\" or \"ddpm\"");
    }
    s.eta = 0;
    if (eta && !cJSON_IsNull(eta)) {
        if (cJSON_IsNumber(eta) && eta->valuedouble >= 0 && eta->valuedouble <= 1)
            s.eta = eta->valuedouble;
        else
            err_add(errs, "eta", "expected a number from 0 to 1");
    }
    s.ema = 1;
    if (ema && !cJSON_IsNull(ema)) {
        if (cJSON_IsBool(ema))
            s.ema = cJSON_IsTrue(ema);
        else
            err_add(errs, "ema", "expected true (the EMA weights) or false (the raw weights)");
    }
    if (cJSON_GetArraySize(errs) > 0) goto invalid;
    s.n = (int)n;
    s.batch = (int)batch;
    s.seed = (uint64_t)seed;
    /* the checkpoint: named, or the job's newest; visible to the caller, never a path */
    char jid[JOBS_ID_LEN], path[FSIO_PATH_MAX];
    int64_t step = -1;
    const char *field = ck ? "checkpoint" : "job";
    struct job_row src;
    memset(&src, 0, sizeof src);
    if (ck) {
        if (pool_checkpoint_id_parse(ck->valuestring, jid, sizeof jid, &step)) {
            err_add(errs, field, "expected a checkpoint id like j0123456789abcdef-300 (GET "
                                 "/jobs/{id}/checkpoints lists them)");
            goto invalid;
        }
    } else if (!pool_job_id_valid(jb->valuestring)) {
        err_add(errs, field, "expected a job id like j0123456789abcdef");
        goto invalid;
    } else {
        snprintf(jid, sizeof jid, "%s", jb->valuestring);
    }
    int g = jobs_get(c->a->cfg.db, jid, &src);
    int visible = g == JOBS_OK && (c->admin || strcmp(src.owner, c->owner) == 0) &&
                  strcmp(src.kind, "train") == 0;
    job_row_free(&src);
    if (!visible) {
        err_add(errs, field, ck ? "no such checkpoint" : "no such training job");
        goto invalid;
    }
    if (!ck) {
        char out[FSIO_PATH_MAX];
        if (pool_job_file(c->a->cfg.pool, jid, "out", out, sizeof out) ||
            train_latest_checkpoint(out, path, sizeof path, &step)) {
            err_add(errs, field, "the job has no checkpoint yet");
            goto invalid;
        }
    }
    struct stat sb;
    if (pool_checkpoint_path(c->a->cfg.pool, jid, step, path, sizeof path) || stat(path, &sb) ||
        !S_ISREG(sb.st_mode) || strlen(path) >= sizeof s.checkpoint_path) {
        err_add(errs, field, "no such checkpoint");
        goto invalid;
    }
    snprintf(s.checkpoint_path, sizeof s.checkpoint_path, "%s", path);
    snprintf(s.checkpoint_id, sizeof s.checkpoint_id, "%s-%" PRId64, jid, step);
    {
        struct safetensors *st = NULL;
        struct train_spec spec;
        char err[512];
        if (checkpoint_open(&st, path, &spec, NULL, err, sizeof err)) {
            err_add(errs, field, "the checkpoint cannot be read");
            goto invalid;
        }
        safetensors_free(st);
        s.model = spec.model;
        s.timesteps = spec.timesteps;
    }
    if (steps < 0) steps = s.timesteps < 50 ? s.timesteps : 50;
    if (strcmp(s.sampler, "ddim") == 0 && steps > s.timesteps) {
        char msg[160];
        snprintf(msg, sizeof msg, "must be at most the model's diffusion.timesteps (%d) for ddim",
                 s.timesteps);
        err_add(errs, "steps", msg);
        goto invalid;
    }
    s.steps = (int)steps;
    cJSON_Delete(eo);
    cJSON_Delete(root);
    struct pool_admission adm = {0};
    char id[JOBS_ID_LEN], err[1024];
    int rc = pool_submit_sample(c->a->cfg.pool, c->owner, c->idem_open ? c->idem_key : NULL, &s,
                                &adm, id, err, sizeof err);
    if (rc) return submit_refused(c, rc, &adm, err, "checkpoint");
    cJSON_Delete(adm.plans);
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return problem(c->conn, 500, NULL, "the new job cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/samples/%s", id);
    cJSON *o = sample_json(c->a, &r);
    job_row_free(&r);
    return accepted(c, o, loc);
invalid:
    cJSON_Delete(root);
    res = send_problem_errors(c, eo);
    return res;
}

/* GET /jobs and GET /samples: paging by `after`, filters state, owner (and kind for /jobs) */
static enum MHD_Result list_jobs(struct ctx *c, const char *kind, const char *key)
{
    const char *st = arg(c, "state"), *lim = arg(c, "limit"), *after = arg(c, "after");
    const char *owner = arg(c, "owner"), *k = kind ? NULL : arg(c, "kind");
    int state = -1;
    long long limit = LIST_LIMIT_DEFAULT;
    if (st && (state = job_state_parse(st)) < 0)
        return invalid(c->conn, 400, "state",
                       "expected one of queued, running, succeeded, failed, canceled");
    if (lim && api_parse_int(lim, 1, LIST_LIMIT_MAX, &limit))
        return invalid(c->conn, 400, "limit", "expected an integer from 1 to 200");
    if (after && !pool_job_id_valid(after))
        return invalid(c->conn, 400, "after", "expected a job id (the previous page's next)");
    if (k && strcmp(k, "train") != 0 && strcmp(k, "sample") != 0)
        return invalid(c->conn, 400, "kind", "expected train or sample");
    if (k) kind = k;
    if (owner && !c->admin && strcmp(owner, c->owner) != 0)
        return problem(c->conn, 403, NULL, "only an admin token lists another token's jobs", NULL,
                       NULL);
    if (!owner && !c->admin) owner = c->owner;
    struct job_row *rows;
    int n;
    if (jobs_list_kind(c->a->cfg.db, owner, kind, state, after, (int)limit, &rows, &n))
        return problem(c->conn, 500, NULL, "the job store cannot be read", NULL, NULL);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, strcmp(key, "samples") == 0 ? sample_json(c->a, &rows[i])
                                                                : job_json(c->a, &rows[i]));
    if (n == limit && n > 0)
        cJSON_AddStringToObject(o, "next", rows[n - 1].id);
    else
        cJSON_AddNullToObject(o, "next");
    job_rows_free(rows, n);
    return send_json(c->conn, 200, o, NULL, NULL);
}

static enum MHD_Result h_jobs(struct ctx *c) { return list_jobs(c, NULL, "jobs"); }
static enum MHD_Result h_samples(struct ctx *c) { return list_jobs(c, "sample", "samples"); }

static enum MHD_Result h_sample(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_sample(c, c->param, &r, &res)) return res;
    cJSON *o = sample_json(c->a, &r);
    job_row_free(&r);
    return send_json(c->conn, 200, o, NULL, NULL);
}

/* the open regular file fd (taken over) of size bytes as a 200 of type, with a
 * Content-Disposition when disp is not NULL */
static enum MHD_Result send_fd(struct ctx *c, int fd, uint64_t size, const char *type,
                               const char *disp)
{
    struct MHD_Response *resp = MHD_create_response_from_fd64(size, fd);
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (disp) MHD_add_response_header(resp, "Content-Disposition", disp);
    enum MHD_Result rr = respond(c->conn, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* the regular file at path as a 200 of type; 404 with detail when path is NULL or names no
 * regular file (fsio_open_regular: no FIFO, link or directory is ever opened) */
static enum MHD_Result send_path(struct ctx *c, const char *path, const char *type,
                                 const char *detail)
{
    char err[300];
    int fd = path ? fsio_open_regular(path, O_RDONLY, err, sizeof err) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        if (fd >= 0) close(fd);
        return problem(c->conn, 404, NULL, detail, NULL, NULL);
    }
    return send_fd(c, fd, (uint64_t)sb.st_size, type, NULL);
}

/* a file of a succeeded sampling job: tail under its folder */
static enum MHD_Result send_sample_file(struct ctx *c, const char *tail, const char *what)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_sample(c, c->param, &r, &res)) return res;
    enum job_state st = r.state;
    job_row_free(&r);
    char detail[200], path[FSIO_PATH_MAX];
    if (st != JOB_SUCCEEDED) {
        snprintf(detail, sizeof detail, "sample %s is %s: its images exist once it succeeded",
                 c->param, job_state_name(st));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(st));
        return problem(c->conn, 409, "wrong-state", detail, o, NULL);
    }
    snprintf(detail, sizeof detail, "sample %s has no %s", c->param, what);
    int have = pool_job_file(c->a->cfg.pool, c->param, tail, path, sizeof path) == 0;
    return send_path(c, have ? path : NULL, "image/png", detail);
}

static enum MHD_Result h_sample_grid(struct ctx *c) { return send_sample_file(c, "grid.png", "grid"); }

static enum MHD_Result h_sample_image(struct ctx *c)
{
    long long k;
    char tail[64], what[64];
    /* k: a plain decimal index (no sign, no leading zeros), so it can never name another file */
    if (api_parse_image_index(c->param2, SAMPLE_N_MAX, &k)) {
        char detail[160];
        snprintf(detail, sizeof detail, "no image '%.20s' (images are numbered 0 to n-1)", c->param2);
        return problem(c->conn, 404, NULL, detail, NULL, NULL);
    }
    snprintf(tail, sizeof tail, "images/%04lld.png", k);
    snprintf(what, sizeof what, "image %lld", k);
    return send_sample_file(c, tail, what);
}

static enum MHD_Result h_job(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    cJSON *o = job_json(c->a, &r);
    job_row_free(&r);
    return send_json(c->conn, 200, o, NULL, NULL);
}

static enum MHD_Result h_cancel(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    enum job_state now = JOB_QUEUED;
    int rc = pool_cancel(c->a->cfg.pool, c->param, &now);
    if (rc == POOL_ERR_STATE) {
        char detail[160];
        snprintf(detail, sizeof detail, "job %s has already ended (%s)", c->param,
                 job_state_name(now));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return problem(c->conn, 409, "wrong-state", detail, o, NULL);
    }
    if (rc) return problem(c->conn, 500, NULL, "the cancel could not be recorded", NULL, NULL);
    if (jobs_get(c->a->cfg.db, c->param, &r))
        return problem(c->conn, 500, NULL, "the job store cannot be read", NULL, NULL);
    cJSON *o = job_json(c->a, &r);
    job_row_free(&r);
    /* running: the child stops at its next step; 202 until then */
    return send_json(c->conn, now == JOB_CANCELED ? 200 : 202, o, NULL, NULL);
}

static int ckpt_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static enum MHD_Result h_checkpoints(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    char dir[FSIO_PATH_MAX], path[FSIO_PATH_MAX];
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "checkpoints");
    if (pool_checkpoint_path(c->a->cfg.pool, c->param, 0, dir, sizeof dir) == 0) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        DIR *d = opendir(dir);
        int64_t steps[1024];
        int n = 0;
        struct dirent *de;
        while (d && (de = readdir(d)) && n < 1024) {
            long long s;
            char tail[16];
            if (sscanf(de->d_name, "step-%lld.safe%15s", &s, tail) == 2 &&
                strcmp(tail, "tensors") == 0 && s >= 0)
                steps[n++] = s;
        }
        if (d) closedir(d);
        qsort(steps, (size_t)n, sizeof *steps, ckpt_cmp);
        for (int i = 0; i < n; i++) {
            struct stat sb;
            if (pool_checkpoint_path(c->a->cfg.pool, c->param, steps[i], path, sizeof path) ||
                stat(path, &sb))
                continue;
            char id[64], url[160];
            snprintf(id, sizeof id, "%s-%" PRId64, c->param, steps[i]);
            api_link(c->a, url, sizeof url, "/checkpoints/%s", id);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "id", id);
            cJSON_AddNumberToObject(e, "step", (double)steps[i]);
            cJSON_AddNumberToObject(e, "bytes", (double)sb.st_size);
            cJSON_AddStringToObject(e, "url", url);
            cJSON_AddItemToArray(arr, e);
        }
    }
    return send_json(c->conn, 200, o, NULL, NULL);
}

/* ?format=diffusers: the checkpoint's EMA weights as a diffusers DDPMPipeline folder in a tar
 * (export.h, the code of `ddpmd export --diffusers`), built once per checkpoint, cached beside
 * it and streamed from that file */
static enum MHD_Result checkpoint_diffusers(struct ctx *c, const char *ckpt)
{
    char err[800], disp[128];
    int fd = -1;
    long long size = 0;
    int rc = export_cache_open(ckpt, c->owner, &fd, &size, err, sizeof err);
    if (rc == EXPORT_BUSY)
        return problem(c->conn, 503, "busy", "an export of yours is being built: try again",
                       NULL, (const char *const[]){"Retry-After", "2", NULL});
    if (rc)
        return problem(c->conn, rc == EXPORT_UNSUPPORTED ? 422 : 500, NULL,
                       rc == EXPORT_UNSUPPORTED ? "only the ddpm preset has a diffusers "
                                                  "equivalent (UNet2DModel)"
                                                : "the diffusers export failed",
                       NULL, NULL);
    snprintf(disp, sizeof disp, "attachment; filename=\"%s-diffusers.tar\"", c->param);
    return send_fd(c, fd, (uint64_t)size, "application/x-tar", disp);
}

static enum MHD_Result h_checkpoint(struct ctx *c)
{
    char jid[JOBS_ID_LEN], path[FSIO_PATH_MAX], detail[160], err[300];
    int64_t step;
    if (pool_checkpoint_id_parse(c->param, jid, sizeof jid, &step)) {
        snprintf(detail, sizeof detail, "no checkpoint '%.40s' (ids look like j0123456789abcdef-300)",
                 c->param);
        return problem(c->conn, 404, NULL, detail, NULL, NULL);
    }
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, jid, &r, &res)) return res;
    job_row_free(&r);
    int fd = -1;
    if (pool_checkpoint_path(c->a->cfg.pool, jid, step, path, sizeof path) == 0)
        fd = fsio_open_regular(path, O_RDONLY, err, sizeof err);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        if (fd >= 0) close(fd);
        snprintf(detail, sizeof detail, "no checkpoint %s (only the newest ones are kept)", c->param);
        return problem(c->conn, 404, NULL, detail, NULL, NULL);
    }
    const char *fmt = MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, "format");
    if (fmt && strcmp(fmt, "safetensors") != 0) {
        close(fd);
        if (strcmp(fmt, "diffusers") != 0)
            return invalid(c->conn, 400, "format", "expected safetensors or diffusers");
        return checkpoint_diffusers(c, path);
    }
    /* a checkpoint never changes once renamed into place (fsio_write_atomic): inode, size and
     * mtime name its bytes */
    char etag[96];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%llx.%lx\"", (unsigned long long)sb.st_ino,
             (unsigned long long)sb.st_size, (unsigned long long)sb.st_mtim.tv_sec,
             (long)sb.st_mtim.tv_nsec);
    const char *inm = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "If-None-Match");
    if (inm && (strcmp(inm, "*") == 0 || strstr(inm, etag))) {
        close(fd);
        struct MHD_Response *nm = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!nm) return MHD_NO;
        MHD_add_response_header(nm, MHD_HTTP_HEADER_ETAG, etag);
        enum MHD_Result rr = respond(c->conn, 304, nm);
        MHD_destroy_response(nm);
        return rr;
    }
    uint64_t size = (uint64_t)sb.st_size, off = 0, len = size;
    unsigned status = 200;
    const char *range = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Range");
    const char *ifr = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "If-Range");
    if (range && (!ifr || strcmp(ifr, etag) == 0) && api_parse_range(range, size, &off, &len)) {
        close(fd);
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
        snprintf(detail, sizeof detail, "the range '%.40s' is outside the %llu bytes", range,
                 (unsigned long long)size);
        return problem(c->conn, 416, NULL, detail, NULL,
                       (const char *const[]){"Content-Range", cr, NULL});
    }
    if (len != size) status = 206;
    /* the open descriptor keeps the file even if the job prunes it meanwhile */
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, off);
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    char disp[128], cr[96];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s.safetensors\"", c->param);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(resp, "Content-Disposition", disp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    if (status == 206) {
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)size);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
    enum MHD_Result rr = respond(c->conn, status, resp);
    MHD_destroy_response(resp);
    return rr;
}

static enum MHD_Result h_healthz(struct ctx *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return send_json(c->conn, 200, o, NULL, NULL);
}

/* one device's figures (GET /devices, GET /readyz) */
static cJSON *device_json(const struct pool_device_state *d, int waiting_key)
{
    cJSON *o = cJSON_CreateObject();
    int cpu = strcmp(d->cfg.name, "cpu") == 0;
    cJSON_AddStringToObject(o, "name", d->cfg.name);
    cJSON_AddStringToObject(o, "kind", cpu ? "cpu" : "cuda");
    if (d->cfg.total_bytes > 0) cJSON_AddNumberToObject(o, "total_bytes", (double)d->cfg.total_bytes);
    else cJSON_AddNullToObject(o, "total_bytes");
    cJSON_AddNumberToObject(o, "budget_bytes", (double)d->cfg.budget_bytes);
    cJSON_AddNumberToObject(o, "overhead_bytes", (double)d->cfg.baseline_bytes);
    cJSON_AddNumberToObject(o, "process_baseline_bytes", (double)d->cfg.baseline_bytes);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)d->reserved);
    cJSON_AddNumberToObject(o, "free_bytes", (double)(d->cfg.budget_bytes - d->reserved));
    cJSON_AddNumberToObject(o, "running_jobs", d->running);
    if (waiting_key) cJSON_AddNumberToObject(o, "waiting_jobs", d->waiting);
    cJSON_AddNumberToObject(o, "threads_used", d->threads_used);
    cJSON_AddBoolToObject(o, "poisoned", d->poisoned);
    add_str_or_null(o, "poisoned_by", d->poisoned ? d->poison : NULL);
    return o;
}

static enum MHD_Result h_readyz(struct ctx *c)
{
    int n = 0;
    int store = jobs_count(c->a->cfg.db, -1, &n) == JOBS_OK;
    struct pool_device_state ds[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    const struct pool_config *pc = pool_config_of(c->a->cfg.pool);
    cJSON *o = cJSON_CreateObject(), *devs = cJSON_CreateArray(), *bad = cJSON_CreateArray();
    for (int i = 0; i < nd; i++) {
        cJSON *d = device_json(&ds[i], 0);
        if (strcmp(ds[i].cfg.name, "cpu") == 0) cJSON_AddNumberToObject(d, "cores", pc->cores);
        cJSON_AddItemToArray(devs, d);
        if (ds[i].poisoned) cJSON_AddItemToArray(bad, cJSON_CreateString(ds[i].cfg.name));
    }
    /* a poisoned device fails readiness: the server needs a restart to use it again */
    int ready = store && c->a->admitting && cJSON_GetArraySize(bad) == 0;
    cJSON_AddStringToObject(o, "status", ready ? "ready" : "not ready");
    cJSON_AddBoolToObject(o, "store", store);
    cJSON_AddBoolToObject(o, "admitting", c->a->admitting);
    cJSON_AddItemToObject(o, "poisoned", bad);
    cJSON_AddItemToObject(o, "devices", devs);
    return send_json(c->conn, ready ? 200 : 503, o, NULL, NULL);
}

static enum MHD_Result h_openapi(struct ctx *c)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(
        c->a->openapi_len, (void *)c->a->openapi, MHD_RESPMEM_PERSISTENT);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "application/yaml");
    enum MHD_Result r = respond(c->conn, 200, res);
    MHD_destroy_response(res);
    return r;
}

/* ---- Server-Sent Events ---- */

struct sse {
    struct api *a;
    struct MHD_Connection *conn;
    char job[JOBS_ID_LEN];
    int64_t last;
    char *buf;
    size_t len, off, cap;
    double last_write;
    int suspended, done;
    struct sse *next, *prev;
};

static int sse_put(struct sse *s, const char *text)
{
    size_t n = strlen(text);
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *b = realloc(s->buf, cap);
        if (!b) return -1;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, n + 1);
    s->len += n;
    return 0;
}

/* a checkpoint event's data ({"id", "step", ...}) with "url": its GET /checkpoints/{id}; NULL
 * (send it as stored) when it has no id */
static char *sse_checkpoint_data(const struct api *a, const char *data)
{
    cJSON *o = cJSON_Parse(data);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    char *out = NULL, url[192];
    if (cJSON_IsString(id) && !cJSON_GetObjectItemCaseSensitive(o, "url")) {
        api_link(a, url, sizeof url, "/checkpoints/%s", id->valuestring);
        cJSON_AddStringToObject(o, "url", url);
        out = cJSON_PrintUnformatted(o);
    }
    cJSON_Delete(o);
    return out;
}

/* refills s->buf from the event log; 1 when something was added */
static int sse_fill(struct sse *s, int *ended)
{
    enum job_state state;
    /* the state first: a job's last event is committed with its final state */
    *ended = jobs_state(s->a->cfg.db, s->job, &state) != JOBS_OK || job_state_ended(state);
    struct job_event *ev;
    int n;
    if (jobs_events_after(s->a->cfg.db, s->job, s->last, SSE_BATCH, &ev, &n)) return 0;
    for (int i = 0; i < n; i++) {
        char head[96];
        snprintf(head, sizeof head, "id: %" PRId64 "\nevent: %s\ndata: ", ev[i].seq, ev[i].type);
        /* event data is one-line JSON (compact), so it needs no splitting into data: lines; a
         * checkpoint's gets its download URL here, where the path prefix is known */
        char *data = strcmp(ev[i].type, "checkpoint") == 0 ? sse_checkpoint_data(s->a, ev[i].data)
                                                             : NULL;
        int bad = sse_put(s, head) || sse_put(s, data ? data : ev[i].data) || sse_put(s, "\n\n");
        free(data);
        if (bad) break;
        s->last = ev[i].seq;
    }
    job_events_free(ev, n);
    if (n > 0) *ended = 0; /* send these; the end is seen on the next fill */
    return n > 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct sse *s = cls;
    struct api *a = s->a;
    for (;;) {
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(out, s->buf + s->off, n);
            s->off += n;
            s->last_write = now_s();
            return (ssize_t)n;
        }
        s->len = s->off = 0;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&a->mu);
        uint64_t gen = a->gen;
        int stopping = a->stopping;
        pthread_mutex_unlock(&a->mu);
        if (stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        int ended;
        if (sse_fill(s, &ended)) continue;
        if (ended) {
            s->done = 1;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (now_s() - s->last_write >= a->cfg.keepalive_s) {
            sse_put(s, ": keep-alive\n\n");
            continue;
        }
        /* nothing to send: park the connection until a notify (or the ticker) resumes it; a
         * notify between the fill and here changed gen, so it cannot be missed */
        pthread_mutex_lock(&a->mu);
        if (a->gen != gen || a->stopping) {
            pthread_mutex_unlock(&a->mu);
            continue;
        }
        s->suspended = 1;
        MHD_suspend_connection(s->conn);
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
}

static void sse_free(void *cls)
{
    struct sse *s = cls;
    struct api *a = s->a;
    pthread_mutex_lock(&a->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        a->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&a->mu);
    free(s->buf);
    free(s);
}

/* resumes suspended streams: all of them, or those quiet for the keep-alive interval (lock held) */
static void sse_resume(struct api *a, int all)
{
    double t = now_s();
    for (struct sse *s = a->streams; s; s = s->next)
        if (s->suspended && (all || t - s->last_write >= a->cfg.keepalive_s)) {
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        }
}

void api_notify(void *ctx)
{
    struct api *a = ctx;
    pthread_mutex_lock(&a->mu);
    a->gen++;
    sse_resume(a, 1);
    pthread_mutex_unlock(&a->mu);
}

static void *ticker(void *arg)
{
    struct api *a = arg;
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&a->mu);
        int stop = a->stopping;
        sse_resume(a, stop);
        pthread_mutex_unlock(&a->mu);
        if (stop) return NULL;
    }
}

static enum MHD_Result h_events(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    const char *lei = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Last-Event-ID");
    if (!lei) lei = arg(c, "last_event_id");
    long long last;
    if (api_parse_last_event_id(lei, &last))
        return invalid(c->conn, 400, "Last-Event-ID", "expected an event id (a number >= 0)");
    struct sse *s = calloc(1, sizeof *s);
    if (!s) return MHD_NO;
    s->a = c->a;
    s->conn = c->conn;
    snprintf(s->job, sizeof s->job, "%s", c->param);
    s->last = last;
    s->last_write = now_s();
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s, sse_free);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    pthread_mutex_lock(&c->a->mu);
    s->next = c->a->streams;
    if (s->next) s->next->prev = s;
    c->a->streams = s;
    pthread_mutex_unlock(&c->a->mu);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result rr = respond(c->conn, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* ---- the remaining read routes ---- */

/* GET /jobs/{id}/logs: the job's log events (its stderr and the server's notes about it) as
 * text, one line each, already without server paths (pool.c redacts them when stored) */
static enum MHD_Result h_logs(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    size_t len = 0, cap = 4096;
    char *out = malloc(cap);
    int64_t after = 0;
    int ok = out != NULL;
    if (out) out[0] = 0;
    while (ok) {
        struct job_event *ev;
        int n;
        if (jobs_events_after(c->a->cfg.db, c->param, after, 256, &ev, &n)) {
            ok = 0;
            break;
        }
        for (int i = 0; i < n && ok; i++) {
            after = ev[i].seq;
            if (strcmp(ev[i].type, "log") != 0) continue;
            cJSON *o = cJSON_Parse(ev[i].data);
            const cJSON *line = cJSON_GetObjectItemCaseSensitive(o, "line");
            if (cJSON_IsString(line)) {
                size_t need = len + strlen(line->valuestring) + 2;
                if (need > cap) {
                    while (cap < need) cap *= 2;
                    char *b = realloc(out, cap);
                    if (!b) ok = 0; else out = b;
                }
                if (ok) len += (size_t)sprintf(out + len, "%s\n", line->valuestring);
            }
            cJSON_Delete(o);
        }
        job_events_free(ev, n);
        if (n < 256) break;
    }
    if (!ok) {
        free(out);
        return problem(c->conn, 500, NULL, "the job's log cannot be read", NULL, NULL);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, out, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(out);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result rr = respond(c->conn, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* a file of a training job's out/ folder */
static enum MHD_Result send_job_file(struct ctx *c, const char *tail, const char *type)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_job(c, c->param, &r, &res)) return res;
    int is_train = strcmp(r.kind, "train") == 0;
    job_row_free(&r);
    char path[FSIO_PATH_MAX], detail[200];
    snprintf(detail, sizeof detail, "job %s has no %s yet (a training job writes it as it logs)",
             c->param, strrchr(tail, '/') + 1);
    int have = is_train && pool_job_file(c->a->cfg.pool, c->param, tail, path, sizeof path) == 0;
    return send_path(c, have ? path : NULL, type, detail);
}

static enum MHD_Result h_loss_csv(struct ctx *c)
{
    return send_job_file(c, "out/loss.csv", "text/csv; charset=utf-8");
}

static enum MHD_Result h_loss_png(struct ctx *c) { return send_job_file(c, "out/loss.png", "image/png"); }

/* GET /jobs/{id}/grids/{step}.png: the sample grid a training job drew at that step (its
 * "sample" events name the steps); step is a plain decimal, so it names no other file */
static enum MHD_Result h_job_grid(struct ctx *c)
{
    long long step;
    char tail[64];
    if (api_parse_image_index(c->param2, 1000000000000LL, &step)) {
        char detail[160];
        snprintf(detail, sizeof detail, "no grid '%.20s' (grids are named by their step)", c->param2);
        return problem(c->conn, 404, NULL, detail, NULL, NULL);
    }
    snprintf(tail, sizeof tail, "out/samples/step-%08lld.png", step);
    return send_job_file(c, tail, "image/png");
}

/* ---- the dashboard: web/'s files, embedded at build time (api/embed.cmake) ---- */

extern const char ddpmd_web_index_html[], ddpmd_web_app_js[], ddpmd_web_style_css[];
extern const size_t ddpmd_web_index_html_len, ddpmd_web_app_js_len, ddpmd_web_style_css_len;

/* the page holds no data and no secret (it asks for the token and keeps it in sessionStorage), so
 * it needs none to load; the policy allows nothing but this origin (and blob: images the page
 * makes from authenticated fetches) */
static enum MHD_Result send_asset(struct ctx *c, const char *body, size_t len, const char *type)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(len, (void *)body,
                                                               MHD_RESPMEM_PERSISTENT);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(res, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(res, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; "
                            "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    enum MHD_Result r = respond(c->conn, 200, res);
    MHD_destroy_response(res);
    return r;
}

static enum MHD_Result h_ui_index(struct ctx *c)
{
    /* the page's URLs are relative to it: at "/P" they would resolve outside the prefix */
    if (c->r->bare_prefix) {
        char loc[API_PARSE_PREFIX_MAX + 2];
        snprintf(loc, sizeof loc, "%s/", c->a->prefix);
        return send_text(c->conn, 301, "text/plain; charset=utf-8", "the dashboard is at PREFIX/\n",
                         (const char *const[]){"Location", loc, NULL});
    }
    return send_asset(c, ddpmd_web_index_html, ddpmd_web_index_html_len, "text/html; charset=utf-8");
}

static enum MHD_Result h_ui_js(struct ctx *c)
{
    return send_asset(c, ddpmd_web_app_js, ddpmd_web_app_js_len, "text/javascript; charset=utf-8");
}

static enum MHD_Result h_ui_css(struct ctx *c)
{
    return send_asset(c, ddpmd_web_style_css, ddpmd_web_style_css_len, "text/css; charset=utf-8");
}

/* ---- datasets: the built-in fashion-mnist and uploads (server/upload.c) ---- */

static cJSON *fmnist_json(void)
{
    struct stat sb;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "id", "fashion-mnist");
    cJSON_AddStringToObject(d, "kind", "builtin");
    cJSON_AddNumberToObject(d, "images", 60000);
    cJSON_AddNumberToObject(d, "test_images", 10000);
    cJSON_AddNumberToObject(d, "size", 28);
    cJSON_AddNumberToObject(d, "channels", 1);
    cJSON_AddBoolToObject(d, "available", stat(DATASET_FMNIST_DIR, &sb) == 0 && S_ISDIR(sb.st_mode));
    return d;
}

static const char *data_dir(struct ctx *c) { return pool_config_of(c->a->cfg.pool)->data_dir; }

/* an uploaded dataset's JSON, from its dataset.json; NULL when there is none */
static cJSON *upload_json(struct ctx *c, const char *id)
{
    char *m = upload_dataset_meta(data_dir(c), id);
    cJSON *o = m ? cJSON_Parse(m) : NULL;
    free(m);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return NULL;
    }
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(o, "sizes");
    const cJSON *w0 = cJSON_GetObjectItemCaseSensitive(sz, "min_width");
    const cJSON *w1 = cJSON_GetObjectItemCaseSensitive(sz, "max_width");
    const cJSON *h0 = cJSON_GetObjectItemCaseSensitive(sz, "min_height");
    const cJSON *h1 = cJSON_GetObjectItemCaseSensitive(sz, "max_height");
    /* size: the side when every image is the same square */
    if (cJSON_IsNumber(w0) && cJSON_IsNumber(w1) && cJSON_IsNumber(h0) && cJSON_IsNumber(h1) &&
        w0->valuedouble == w1->valuedouble && h0->valuedouble == h1->valuedouble &&
        w0->valuedouble == h0->valuedouble)
        cJSON_AddNumberToObject(o, "size", w0->valuedouble);
    else
        cJSON_AddNullToObject(o, "size");
    cJSON_AddStringToObject(o, "kind", "uploaded");
    cJSON_AddBoolToObject(o, "available", 1);
    char buf[160];
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    api_link(c->a, buf, sizeof buf, "/datasets/%s", id);
    cJSON_AddStringToObject(links, "self", buf);
    api_link(c->a, buf, sizeof buf, "/datasets/%s/preview.png", id);
    cJSON_AddStringToObject(links, "preview", buf);
    return o;
}

static int upload_visible(struct ctx *c, const cJSON *o)
{
    const cJSON *ow = cJSON_GetObjectItemCaseSensitive(o, "owner");
    return c->admin || (cJSON_IsString(ow) && strcmp(ow->valuestring, c->owner) == 0);
}

/* GET /datasets: the built-in one and the caller's uploads (an admin: every upload) */
static enum MHD_Result h_datasets(struct ctx *c)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "datasets");
    cJSON_AddItemToArray(arr, fmnist_json());
    char(*ids)[UPLOAD_ID_LEN] = NULL;
    int n = 0;
    if (upload_dataset_ids(data_dir(c), &ids, &n)) {
        cJSON_Delete(o);
        return problem(c->conn, 500, NULL, "the dataset folder cannot be read", NULL, NULL);
    }
    for (int i = 0; i < n; i++) {
        cJSON *d = upload_json(c, ids[i]);
        if (d && upload_visible(c, d))
            cJSON_AddItemToArray(arr, d);
        else
            cJSON_Delete(d);
    }
    free(ids);
    return send_json(c->conn, 200, o, NULL, NULL);
}

/* the uploaded dataset named by the path, visible to the caller: its JSON, or the answer sent */
static cJSON *load_upload(struct ctx *c, enum MHD_Result *res)
{
    char detail[160];
    cJSON *o = upload_id_valid(c->param) ? upload_json(c, c->param) : NULL;
    if (!o) {
        snprintf(detail, sizeof detail, "no dataset '%.40s' (GET /datasets lists them)", c->param);
        *res = problem(c->conn, 404, NULL, detail, NULL, NULL);
        return NULL;
    }
    if (!upload_visible(c, o)) {
        cJSON_Delete(o);
        snprintf(detail, sizeof detail, "dataset %s belongs to another token", c->param);
        *res = problem(c->conn, 403, NULL, detail, NULL, NULL);
        return NULL;
    }
    return o;
}

static enum MHD_Result h_dataset(struct ctx *c)
{
    if (strcmp(c->param, "fashion-mnist") == 0) return send_json(c->conn, 200, fmnist_json(), NULL, NULL);
    enum MHD_Result res;
    cJSON *o = load_upload(c, &res);
    return o ? send_json(c->conn, 200, o, NULL, NULL) : res;
}

static enum MHD_Result h_dataset_preview(struct ctx *c)
{
    enum MHD_Result res;
    if (strcmp(c->param, "fashion-mnist") == 0)
        return problem(c->conn, 404, NULL, "the built-in dataset has no preview (uploads do)", NULL,
                       NULL);
    cJSON *o = load_upload(c, &res);
    if (!o) return res;
    cJSON_Delete(o);
    char path[FSIO_PATH_MAX];
    int have = upload_dataset_path(data_dir(c), c->param, "preview.png", path, sizeof path) == 0;
    return send_path(c, have ? path : NULL, "image/png", "the dataset has no preview");
}

/* the queued and running jobs whose spec names dataset id, into arr (ids); -1 when the store
 * cannot be read */
static int jobs_using(struct ctx *c, const char *id, cJSON *arr)
{
    static const enum job_state live[] = {JOB_QUEUED, JOB_RUNNING};
    for (int k = 0; k < 2; k++) {
        char after[JOBS_ID_LEN] = "";
        for (;;) {
            struct job_row *rows;
            int n;
            if (jobs_list(c->a->cfg.db, NULL, live[k], *after ? after : NULL, 200, &rows, &n))
                return -1;
            for (int i = 0; i < n; i++) {
                cJSON *sp = cJSON_Parse(rows[i].spec);
                const cJSON *d = cJSON_GetObjectItemCaseSensitive(
                    cJSON_GetObjectItemCaseSensitive(sp, "data"), "dataset");
                if (cJSON_IsString(d) && strcmp(d->valuestring, id) == 0)
                    cJSON_AddItemToArray(arr, cJSON_CreateString(rows[i].id));
                cJSON_Delete(sp);
            }
            if (n) snprintf(after, sizeof after, "%s", rows[n - 1].id);
            job_rows_free(rows, n);
            if (n < 200) break;
        }
    }
    return 0;
}

static enum MHD_Result h_dataset_delete(struct ctx *c)
{
    if (strcmp(c->param, "fashion-mnist") == 0)
        return problem(c->conn, 403, NULL, "the built-in dataset cannot be deleted", NULL, NULL);
    enum MHD_Result res;
    cJSON *o = load_upload(c, &res);
    if (!o) return res;
    cJSON_Delete(o);
    cJSON *x = cJSON_CreateObject(), *users = cJSON_AddArrayToObject(x, "jobs");
    upload_lock(); /* no job can be queued on it between the check and the delete */
    if (jobs_using(c, c->param, users)) {
        upload_unlock();
        cJSON_Delete(x);
        return problem(c->conn, 500, NULL, "the job store cannot be read", NULL, NULL);
    }
    if (cJSON_GetArraySize(users) > 0) {
        upload_unlock();
        char detail[200];
        snprintf(detail, sizeof detail, "dataset %s is used by %d queued or running job%s", c->param,
                 cJSON_GetArraySize(users), cJSON_GetArraySize(users) == 1 ? "" : "s");
        return problem(c->conn, 409, "dataset-in-use", detail, x, NULL);
    }
    cJSON_Delete(x);
    int rc = upload_dataset_delete(data_dir(c), c->param);
    upload_unlock();
    if (rc) return problem(c->conn, 500, NULL, "the dataset could not be removed", NULL, NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    enum MHD_Result rr = respond(c->conn, 204, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* POST /datasets: the body is already on disk (on_request streamed it to r->upload_path) */
static enum MHD_Result h_datasets_post(struct ctx *c)
{
    struct req *r = c->r;
    if (r->upload_errno) {
        char detail[200];
        snprintf(detail, sizeof detail, "the upload cannot be stored: %s", strerror(r->upload_errno));
        return problem(c->conn, r->upload_errno == ENOSPC ? 507 : 500,
                       r->upload_errno == ENOSPC ? "insufficient-storage" : NULL, detail, NULL, NULL);
    }
    if (close(r->upload_fd)) {
        int e = errno;
        r->upload_fd = -1;
        return problem(c->conn, e == ENOSPC ? 507 : 500, e == ENOSPC ? "insufficient-storage" : NULL,
                       "the upload cannot be stored", NULL, NULL);
    }
    r->upload_fd = -1;
    struct upload_limits lim = {.max_unpacked = c->a->cfg.upload_max_unpacked,
                                .max_files = c->a->cfg.upload_max_files};
    char id[UPLOAD_ID_LEN], err[600];
    int rc = upload_dataset_create(data_dir(c), r->upload_path, c->owner, &lim, (int64_t)r->len,
                                   id, err, sizeof err);
    r->upload_path[0] = 0; /* removed by upload_dataset_create */
    if (rc) {
        static const struct {
            int rc;
            unsigned status;
            const char *slug;
        } map[] = {{UPLOAD_ERR_CORRUPT, 422, "archive-corrupt"},
                   {UPLOAD_ERR_UNSAFE, 422, "archive-unsafe-entry"},
                   {UPLOAD_ERR_NOT_PNG, 422, "archive-not-png"},
                   {UPLOAD_ERR_EMPTY, 422, "archive-empty"},
                   {UPLOAD_ERR_TOO_LARGE, 413, "archive-too-large"},
                   {UPLOAD_ERR_TOO_MANY, 413, "archive-too-many-entries"},
                   {UPLOAD_ERR_NOSPACE, 507, "insufficient-storage"}};
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (map[i].rc == rc) return problem(c->conn, map[i].status, map[i].slug, err, NULL, NULL);
        return problem(c->conn, 500, NULL, err, NULL, NULL);
    }
    cJSON *o = upload_json(c, id);
    if (!o) return problem(c->conn, 500, NULL, "the new dataset cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/datasets/%s", id);
    return send_json(c->conn, 201, o, NULL, (const char *const[]){"Location", loc, NULL});
}

/* GET /devices: each device's budget and what is on it now */
static enum MHD_Result h_devices(struct ctx *c)
{
    struct pool_device_state ds[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    const struct pool_config *pc = pool_config_of(c->a->cfg.pool);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "devices");
    for (int i = 0; i < nd; i++) {
        cJSON *d = device_json(&ds[i], 1);
        if (strcmp(ds[i].cfg.name, "cpu") == 0) cJSON_AddNumberToObject(d, "cores", pc->cores);
        cJSON_AddItemToArray(arr, d);
    }
    return send_json(c->conn, 200, o, NULL, NULL);
}

/* GET /metrics: Prometheus text format 0.0.4 */
static enum MHD_Result h_metrics(struct ctx *c)
{
    struct pool_device_state ds[POOL_MAX_DEVICES];
    struct metrics_device md[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    for (int i = 0; i < nd; i++)
        md[i] = (struct metrics_device){ds[i].cfg.name, ds[i].cfg.budget_bytes, ds[i].reserved,
                                        ds[i].running, ds[i].poisoned};
    struct metrics_gauges g = {.devices = md, .n_devices = nd};
    g.jobs_ok = 1;
    for (int s = 0; s < JOB_STATE_COUNT && g.jobs_ok; s++)
        g.jobs_ok = jobs_count(c->a->cfg.db, s, &g.jobs[s]) == JOBS_OK;
    size_t len = 0;
    char *text = metrics_render(&g, &len);
    if (!text) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rr = respond(c->conn, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

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
    {"POST", "/jobs/{id}/cancel", h_cancel, 1},
    {"GET", "/jobs/{id}/events", h_events, 1},
    {"GET", "/jobs/{id}/checkpoints", h_checkpoints, 1},
    {"GET", "/jobs/{id}/logs", h_logs, 1},
    {"GET", "/jobs/{id}/loss.csv", h_loss_csv, 1},
    {"GET", "/jobs/{id}/loss.png", h_loss_png, 1},
    {"GET", "/jobs/{id}/grids/{step}.png", h_job_grid, 1},
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

static enum MHD_Result not_allowed(struct MHD_Connection *conn, const char *url)
{
    char allow[64] = "", p[96], p2[32];
    for (int i = 0; i < N_ROUTES; i++)
        if (api_parse_route(routes[i].pattern, url, p, sizeof p, p2, sizeof p2)) {
            if (*allow) strcat(allow, ", ");
            strcat(allow, routes[i].method);
            if (strcmp(routes[i].method, "GET") == 0) strcat(allow, ", HEAD");
        }
    char detail[240];
    snprintf(detail, sizeof detail, "%.100s allows %s", url, allow);
    return problem(conn, 405, NULL, detail, NULL, (const char *const[]){"Allow", allow, NULL});
}

/* constant time in the secrets' contents: every token is compared, over its full length */
static int auth_check(struct api *a, struct MHD_Connection *conn, struct ctx *c, int *present)
{
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
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
static void request_id(struct MHD_Connection *conn, char *rid)
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
        uint64_t v = (uint64_t)(now_s() * 1e6) ^ (atomic_fetch_add(&seq, 1) << 40);
        memcpy(b, &v, sizeof b);
    }
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 8; i++) rid[2 * i] = hex[b[i] >> 4], rid[2 * i + 1] = hex[b[i] & 15];
    rid[16] = 0;
}

/* the caller of route rt: c->owner and c->admin; 0, or -1 with the 401 sent (*res) */
static int authorize(struct api *a, struct MHD_Connection *conn, struct ctx *c,
                     const struct route *rt, enum MHD_Result *res)
{
    snprintf(c->owner, sizeof c->owner, "anonymous");
    c->admin = 1; /* without tokens everyone is the one local user */
    if (!a->cfg.tokens || !rt->auth) return 0;
    int present;
    c->admin = 0;
    if (auth_check(a, conn, c, &present) == 0) return 0;
    *res = problem(conn, 401, NULL,
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

/* POST /datasets, first call: refused before a byte of the body is read (401, 415, 413, or the
 * store cannot take it), else its temporary file is opened; 1 when an answer was sent */
static int upload_begin(struct api *a, struct MHD_Connection *conn, struct req *r,
                        long long declared, enum MHD_Result *res)
{
    struct ctx c = {.a = a, .conn = conn, .r = r, .param = r->param, .param2 = r->param2};
    if (authorize(a, conn, &c, &routes[r->route], res)) return 1;
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    static const char *const types[] = {"application/x-tar", "application/tar", "application/gzip",
                                        "application/x-gzip", "application/x-gtar",
                                        "application/octet-stream", NULL};
    int ok = 0;
    for (int i = 0; ct && types[i]; i++) {
        size_t n = strlen(types[i]);
        ok |= strncasecmp(ct, types[i], n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
    }
    if (!ok) {
        *res = problem(conn, 415, NULL,
                       "POST /datasets takes a tar archive of PNG files, plain (application/x-tar) "
                       "or gzip-compressed (application/gzip)",
                       NULL, (const char *const[]){"Accept-Post", "application/x-tar, application/gzip", NULL});
        return 1;
    }
    if (declared > a->cfg.upload_max_bytes) {
        char detail[160];
        snprintf(detail, sizeof detail, "the archive is %lld bytes; the limit is %lld", declared,
                 (long long)a->cfg.upload_max_bytes);
        *res = problem(conn, 413, "archive-too-large", detail, NULL, NULL);
        return 1;
    }
    char err[300];
    r->upload_fd = upload_part_open(pool_config_of(a->cfg.pool)->data_dir, r->upload_path,
                                    sizeof r->upload_path, err, sizeof err);
    if (r->upload_fd < 0) {
        r->upload_path[0] = 0;
        *res = problem(conn, errno == ENOSPC ? 507 : 500,
                       errno == ENOSPC ? "insufficient-storage" : NULL, err, NULL, NULL);
        return 1;
    }
    r->upload = 1;
    return 0;
}

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
        if (!r) return MHD_NO;
        *con_cls = r;
        r->bare_prefix = bare;
        r->t0 = now_s();
        request_id(conn, r->rid);
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        r->upload_fd = -1;
        route_find(method, url, r);
        tl_req = r;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        long long len = -1;
        if (cl && api_parse_int(cl, 0, INT64_MAX, &len)) len = -1;
        if (r->route >= 0 && routes[r->route].fn == h_datasets_post) {
            enum MHD_Result res;
            if (upload_begin(a, conn, r, len, &res)) {
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
            return problem(conn, 413, NULL, detail, NULL, NULL);
        }
        return MHD_YES;
    }
    tl_req = r;
    if (r->too_big == 2) return MHD_YES;
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
        if (r->too_big || r->len + n > a->cfg.max_body) {
            r->too_big = 1; /* keep reading (and dropping) so the 413 gets through */
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = (r->len + n + 1) * 2;
            if (cap > a->cfg.max_body + 1) cap = a->cfg.max_body + 1;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->route == -1) {
        char detail[160];
        snprintf(detail, sizeof detail, "no route %.100s (GET /openapi.yaml lists them)", url);
        return problem(conn, 404, NULL, detail, NULL, NULL);
    }
    if (r->route == -2) return not_allowed(conn, url);
    const struct route *rt = &routes[r->route];
    struct ctx c = {.a = a, .conn = conn, .r = r, .param = r->param, .param2 = r->param2};
    enum MHD_Result ares;
    if (authorize(a, conn, &c, rt, &ares)) return ares;
    if (r->too_big) {
        char detail[96];
        snprintf(detail, sizeof detail, "the body is larger than the limit of %lld bytes",
                 r->upload ? (long long)a->cfg.upload_max_bytes : (long long)a->cfg.max_body);
        return problem(conn, 413, r->upload ? "archive-too-large" : NULL, detail, NULL, NULL);
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
    if (!r) return;
    double sec = now_s() - r->t0;
    if (r->status) metrics_http_observe(r->route, r->status, sec);
    if (!r->job[0] && r->route >= 0 && pool_job_id_valid(r->param)) /* /jobs/{id}/... */
        memcpy(r->job, r->param, strlen(r->param) + 1); /* a valid id fits */
    struct log_request lr = {.request_id = r->rid, .method = r->method, .path = r->path,
                             .route = r->route >= 0 ? routes[r->route].pattern : NULL,
                             .job = r->job, .status = r->status, .duration_ms = sec * 1e3};
    log_request(&lr);
    if (r->upload_fd >= 0) close(r->upload_fd);
    if (r->upload_path[0]) unlink(r->upload_path); /* an upload refused or cut off */
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
    cJSON *o = strcmp(r.kind, "sample") == 0 ? sample_json(a, &r) : job_json(a, &r);
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
    for (int i = 0; i < N_ROUTES; i++) methods[i] = routes[i].method, patterns[i] = routes[i].pattern;
    metrics_set_routes(methods, patterns, N_ROUTES);
    if (cfg->webhook) webhook_set_renderer(cfg->webhook, webhook_job, a);
    if (api_prefix_set(a, cfg->path_prefix ? cfg->path_prefix : "", err, errlen)) {
        free(a);
        return API_ERR_START;
    }
    a->admitting = 1;
    pthread_mutex_init(&a->mu, NULL);
    if (pthread_create(&a->ticker, NULL, ticker, a)) {
        snprintf(err, errlen, "cannot start the event-stream ticker");
        goto fail;
    }
    a->ticker_on = 1;
    a->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, a, MHD_OPTION_LISTEN_SOCKET, cfg->listen_fd,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads > 0 ? cfg->threads : 4),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, a,
                            MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
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
    pthread_mutex_destroy(&a->mu);
    free(a->openapi);
    free(a);
    return API_ERR_START;
}

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
    sse_resume(a, 1);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->ticker, NULL);
    MHD_stop_daemon(a->d);
    pthread_mutex_destroy(&a->mu);
    free(a->openapi);
    free(a);
}

int api_tokens_load(const char *path, struct api_token **tokens, int *n, char *err,
                    size_t errlen)
{
    *tokens = NULL;
    *n = 0;
    FILE *f = fsio_fopen_read(path, err, errlen);
    if (!f) return -1;
    char line[1024];
    int lineno = 0, cap = 0, rc = -1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char name[64], secret[256], flag[16], extra[2];
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        int k = sscanf(line, "%63s %255s %15s %1s", name, secret, flag, extra);
        if (k <= 0) continue;
        if (k < 2 || k > 3 || (k == 3 && strcmp(flag, "admin") != 0)) {
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
        t->admin = k == 3;
    }
    if (*n == 0) {
        snprintf(err, errlen, "%s has no tokens", path);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    if (rc) {
        free(*tokens);
        *tokens = NULL;
        *n = 0;
    }
    return rc;
}
