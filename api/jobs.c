/* jobs.c - the training jobs' routes: POST /train (the spec parsed once, its ids resolved, the
 * pool's admission), GET /jobs and /jobs/{id}, the cancel, and a job's logs, loss and grids.
 */
#define _GNU_SOURCE
#include "routes.h"

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

#include "jobs.h"
#include "parse.h"
#include "pool.h"
#include "spec.h"
#include "upload.h"
#include "webhook.h"
#include "utf8.h"

#define LIST_LIMIT_MAX 200
#define LIST_LIMIT_DEFAULT 50

/* where a job runs and its plans: device (null until it starts), reserved_bytes and plan (on its
 * device, or while queued on the first device it fits), plans (every device's). The stored plans
 * are the server's own JSON, put in as they are */
void api_job_placement(cJSON *o, const struct job_row *r)
{
    http_json_str_or_null(o, "device", r->device);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)r->reserved_bytes);
    http_json_put(o, "plan", cJSON_CreateRaw(r->plan && r->plan[0] ? r->plan : "{}"));
    http_json_put(o, "plans", r->plans ? cJSON_CreateRaw(r->plans) : cJSON_CreateNull());
}

cJSON *api_job_json(const struct api *a, const struct job_row *r)
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
    api_job_placement(o, r);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    http_json_num_or_null(o, "loss", r->loss);
    http_json_num_or_null(o, "images_per_s", r->img_per_s);
    http_json_str_or_null(o, "error", r->error);
    cJSON_AddBoolToObject(o, "cancel_requested", r->cancel_requested);
    cJSON_AddNumberToObject(o, "starts", r->starts);
    http_json_str_or_null(o, "created_at", r->created_at);
    http_json_str_or_null(o, "started_at", r->started_at);
    http_json_str_or_null(o, "ended_at", r->ended_at);
    /* the stored spec is canonical JSON the server wrote (spec_to_json): put in as it is */
    http_json_put(o, "spec", cJSON_CreateRaw(r->spec && r->spec[0] ? r->spec : "{}"));
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
int api_job_load(struct ctx *c, const char *id, struct job_row *r, enum MHD_Result *res)
{
    memset(r, 0, sizeof *r);
    char detail[160];
    if (!pool_job_id_valid(id)) {
        snprintf(detail, sizeof detail, "no job '%.*s' (job ids look like j0123456789abcdef)",
                 (int)utf8_cut(id, 40), id);
        *res = http_send_problem(c, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    int rc = jobs_get(c->a->cfg.db, id, r);
    if (rc == JOBS_ERR_NOT_FOUND) {
        snprintf(detail, sizeof detail, "no job %s", id);
        *res = http_send_problem(c, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    if (rc) {
        *res = http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
        return -1;
    }
    if (!c->admin && strcmp(r->owner, c->owner) != 0) {
        snprintf(detail, sizeof detail, "job %s belongs to another token", id);
        job_row_free(r);
        *res = http_send_problem(c, 403, NULL, detail, NULL, NULL);
        return -1;
    }
    return 0;
}

enum MHD_Result h_train(struct ctx *c)
{
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!api_parse_json_content_type(ct))
        return http_send_problem(c, 415, NULL, "POST /train takes a TrainSpec as application/json",
                       NULL, (const char *const[]){"Accept-Post", "application/json", NULL});
    if (!c->a->admitting)
        return http_send_problem(c, 503, "stopping", "the server is shutting down", NULL,
                       (const char *const[]){"Retry-After", "10", NULL});
    enum MHD_Result ires;
    if (api_idem_begin(c, "POST /train", &ires)) return ires;
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
        return http_send_problem(c, 400, "malformed-json", detail, NULL, NULL);
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
            return http_send_invalid(c, 422, wpath, wmsg);
        }
    }
    cJSON_Delete(extras);
    if (spec_bad) {
        cJSON *errs = http_errors_new();
        for (int i = 0; errs && i < es.n; i++) http_errors_add(errs, es.e[i].path, es.e[i].msg);
        return http_send_errors(c, errs, "spec");
    }
    /* over HTTP a job names data by id, never by a path on the server's disk: the built-in
     * fashion-mnist or an upload the caller can see, whose images/ folder the child reads */
    char data_path[FSIO_PATH_MAX], init_path[FSIO_PATH_MAX];
    struct pool_train job = {.spec = &spec};
    int uploaded = strcmp(spec.dataset, "fashion-mnist") != 0;
    if (uploaded) {
        cJSON *d = upload_id_valid(spec.dataset) ? api_upload_json(c, spec.dataset) : NULL;
        int visible = d && api_upload_visible(c, d);
        enum MHD_Result ures;
        if (visible && api_upload_unusable(c, d, &ures)) { /* validating, or failed */
            cJSON_Delete(d);
            return ures;
        }
        cJSON_Delete(d);
        if (!visible ||
            upload_dataset_path(api_data_dir(c), spec.dataset, "images", data_path,
                                sizeof data_path) ||
            strlen(data_path) >= SPEC_PATH_MAX)
            return http_send_invalid(c, 422, "data.dataset",
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
        return http_send_invalid(c, 422, "data.dataset", host_why);
    if (spec.init_from[0]) {
        char jid[JOBS_ID_LEN];
        int64_t step;
        struct job_row src;
        struct stat sb;
        if (pool_checkpoint_id_parse(spec.init_from, jid, sizeof jid, &step))
            return http_send_invalid(c, 422, "init_from",
                           "expected a checkpoint id like j0123456789abcdef-300 (GET "
                           "/jobs/{id}/checkpoints lists them), or null");
        int rc = jobs_get(c->a->cfg.db, jid, &src);
        int visible = rc == JOBS_OK && (c->admin || strcmp(src.owner, c->owner) == 0);
        job_row_free(&src);
        if (!visible ||
            pool_checkpoint_path(c->a->cfg.pool, jid, step, init_path, sizeof init_path) ||
            stat(init_path, &sb) || !S_ISREG(sb.st_mode))
            return http_send_invalid(c, 422, "init_from", "no such checkpoint");
        if (strlen(init_path) >= SPEC_PATH_MAX)
            return http_send_invalid(c, 422, "init_from", "the checkpoint's path is too long");
        job.init_path = init_path;
    }
    struct pool_admission adm = {0};
    cJSON *entries[POOL_MAX_DEVICES];
    char id[JOBS_ID_LEN], err[1024];
    /* planned on the planning worker, no lock held meanwhile (submit.c) */
    enum MHD_Result pres;
    if (api_plan_train(c, &job, &adm, entries, err, sizeof err, &pres)) return pres;
    /* an uploaded dataset cannot be deleted between the check above and the job's queueing */
    if (uploaded) upload_lock();
    /* the job's events are looked up for its webhook only once it is stored (webhook.h) */
    if (hook) webhook_lock(c->a->cfg.webhook);
    int still = !uploaded || access(data_path, F_OK) == 0;
    int rc = still ? pool_submit_planned(c->a->cfg.pool, c->owner,
                                         c->idem_open ? c->idem_key : NULL, &job, &adm, entries,
                                         id, err, sizeof err)
                   : 0;
    if (!still)
        for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(entries[d]);
    int wrc = hook && still && rc == 0 ? webhook_register(c->a->cfg.webhook, id, &sub, err, sizeof err) : 0;
    if (hook) webhook_unlock(c->a->cfg.webhook);
    if (uploaded) upload_unlock();
    if (!still) return http_send_invalid(c, 422, "data.dataset", "the dataset was deleted");
    if (rc) return api_submit_refused(c, rc, &adm, err, "model");
    cJSON_Delete(adm.plans);
    if (wrc) { /* queued already: it runs, and says why it sends nothing */
        char line[700];
        snprintf(line, sizeof line, "{\"event\":\"register\",\"ok\":false,\"error\":\"the webhook "
                 "could not be stored\"}");
        jobs_event_append(c->a->cfg.db, id, "webhook", line, NULL);
    }
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return http_send_problem(c, 500, NULL, "the new job cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/jobs/%s", id);
    cJSON *o = api_job_json(c->a, &r);
    job_row_free(&r);
    return api_accepted(c, o, loc);
}

/* GET /jobs and GET /samples: paging by `after`, filters state, owner (and kind for /jobs) */
enum MHD_Result api_jobs_list(struct ctx *c, const char *kind, const char *key)
{
    const char *st = http_arg(c, "state"), *lim = http_arg(c, "limit"), *after = http_arg(c, "after");
    const char *owner = http_arg(c, "owner"), *k = kind ? NULL : http_arg(c, "kind");
    int state = -1;
    long long limit = LIST_LIMIT_DEFAULT;
    if (st && (state = job_state_parse(st)) < 0)
        return http_send_invalid(c, 400, "state",
                       "expected one of queued, running, succeeded, failed, canceled");
    if (lim && api_parse_int(lim, 1, LIST_LIMIT_MAX, &limit))
        return http_send_invalid(c, 400, "limit", "expected an integer from 1 to 200");
    if (after && !pool_job_id_valid(after))
        return http_send_invalid(c, 400, "after", "expected a job id (the previous page's next)");
    if (k && strcmp(k, "train") != 0 && strcmp(k, "sample") != 0)
        return http_send_invalid(c, 400, "kind", "expected train or sample");
    if (k) kind = k;
    if (owner && !c->admin && strcmp(owner, c->owner) != 0)
        return http_send_problem(c, 403, NULL, "only an admin token lists another token's jobs", NULL,
                       NULL);
    if (!owner && !c->admin) owner = c->owner;
    struct job_row *rows;
    int n;
    if (jobs_list_kind(c->a->cfg.db, owner, kind, state, after, (int)limit, &rows, &n))
        return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n; i++)
        http_json_put_array(arr, strcmp(key, "samples") == 0 ? api_sample_json(c->a, &rows[i])
                                                                : api_job_json(c->a, &rows[i]));
    if (n == limit && n > 0)
        cJSON_AddStringToObject(o, "next", rows[n - 1].id);
    else
        cJSON_AddNullToObject(o, "next");
    job_rows_free(rows, n);
    return http_send_json(c, 200, o, NULL, NULL);
}

enum MHD_Result h_jobs(struct ctx *c) { return api_jobs_list(c, NULL, "jobs"); }

enum MHD_Result h_job(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    cJSON *o = api_job_json(c->a, &r);
    job_row_free(&r);
    return http_send_json(c, 200, o, NULL, NULL);
}

enum MHD_Result h_cancel(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    enum job_state now = JOB_QUEUED;
    int rc = pool_cancel(c->a->cfg.pool, c->param, &now);
    if (rc == POOL_ERR_STATE) {
        char detail[160];
        snprintf(detail, sizeof detail, "job %s has already ended (%s)", c->param,
                 job_state_name(now));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return http_send_problem(c, 409, "wrong-state", detail, o, NULL);
    }
    if (rc) return http_send_problem(c, 500, NULL, "the cancel could not be recorded", NULL, NULL);
    if (jobs_get(c->a->cfg.db, c->param, &r))
        return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    cJSON *o = api_job_json(c->a, &r);
    job_row_free(&r);
    /* running: the child stops at its next step; 202 until then */
    return http_send_json(c, now == JOB_CANCELED ? 200 : 202, o, NULL, NULL);
}

/* GET /jobs/{id}/logs: the job's log events (its stderr and the server's notes about it) as
 * text, one line each, already without server paths (pool.c redacts them when stored) */
enum MHD_Result h_logs(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
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
        return http_send_problem(c, 500, NULL, "the job's log cannot be read", NULL, NULL);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, out, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(out);
        return http_send_oom(c);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result rr = http_respond(c, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* a file of a training job's out/ folder */
static enum MHD_Result send_job_file(struct ctx *c, const char *tail, const char *type)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    int is_train = strcmp(r.kind, "train") == 0;
    job_row_free(&r);
    char path[FSIO_PATH_MAX], detail[200];
    snprintf(detail, sizeof detail, "job %s has no %s yet (a training job writes it as it logs)",
             c->param, strrchr(tail, '/') + 1);
    int have = is_train && pool_job_file(c->a->cfg.pool, c->param, tail, path, sizeof path) == 0;
    return http_send_file(c, have ? path : NULL, type, detail);
}

enum MHD_Result h_loss_csv(struct ctx *c)
{
    return send_job_file(c, "out/loss.csv", "text/csv; charset=utf-8");
}

enum MHD_Result h_loss_png(struct ctx *c) { return send_job_file(c, "out/loss.png", "image/png"); }

/* GET /jobs/{id}/grids/{step}.png: the sample grid a training job drew at that step (its
 * "sample" events name the steps); step is a plain decimal, so it names no other file */
enum MHD_Result h_job_grid(struct ctx *c)
{
    long long step;
    char tail[64];
    if (api_parse_image_index(c->param2, 1000000000000LL, &step)) {
        char detail[160];
        snprintf(detail, sizeof detail, "no grid '%.*s' (grids are named by their step)",
                 (int)utf8_cut(c->param2, 20), c->param2);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    snprintf(tail, sizeof tail, "out/samples/step-%08lld.png", step);
    return send_job_file(c, tail, "image/png");
}
