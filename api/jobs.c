/* jobs.c - the training jobs' routes: POST /train (the spec parsed once, its ids resolved, the
 * pool's admission; a name and labels beside it), GET /jobs (filtered) and /jobs/{id}, the
 * cancel, the resume, the delete, and a job's logs, loss and grids.
 */
#define _GNU_SOURCE
#include "routes.h"

#include <cjson/cJSON.h>
#include <dirent.h>
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

#include "export.h"
#include "jobs.h"
#include "log.h"
#include "parse.h"
#include "pool.h"
#include "spec.h"
#include "upload.h"
#include "webhook.h"
#include "utf8.h"

#define LIST_LIMIT_MAX 200
#define LIST_LIMIT_DEFAULT 50

/* the fields of each device's plan that "plans" keeps: the whole plan (its parts and search) is
 * shown once, as "plan" */
static const char *const plan_brief_keys[] = {"device", "fits", "budget_bytes", "plan_bytes",
                                              "reserved_bytes", "predicted_step_seconds", NULL};

/* where a job runs and its plans: device (null until it starts), reserved_bytes and plan (on its
 * device, or while queued on the first device it fits: the stored JSON put in as it is), plans
 * (every device's, brief: plan_brief_keys) */
void api_job_placement(cJSON *o, const struct job_row *r)
{
    http_json_str_or_null(o, "device", r->device);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)r->reserved_bytes);
    http_json_put(o, "plan", cJSON_CreateRaw(r->plan && r->plan[0] ? r->plan : "{}"));
    if (!r->plans) {
        cJSON_AddNullToObject(o, "plans");
        return;
    }
    cJSON *all = cJSON_Parse(r->plans), *arr = cJSON_CreateArray(), *e;
    cJSON_ArrayForEach(e, all)
    {
        cJSON *b = cJSON_CreateObject();
        for (int k = 0; plan_brief_keys[k]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, plan_brief_keys[k]);
            if (v) http_json_put(b, plan_brief_keys[k], cJSON_Duplicate(v, 1));
        }
        http_json_put_array(arr, b);
    }
    cJSON_Delete(all);
    http_json_put(o, "plans", arr);
}

/* a stored spec (canonical JSON the server wrote, indented) without its whitespace: put in as
 * it is, compact */
static cJSON *spec_compact(const char *spec)
{
    char *t = strdup(spec && spec[0] ? spec : "{}");
    if (!t) return NULL;
    cJSON_Minify(t);
    cJSON *o = cJSON_CreateRaw(t);
    free(t);
    return o;
}

/* the job's name (null when none) and labels (an object, {} when none) into o */
void api_job_meta(cJSON *o, const struct job_row *r)
{
    http_json_str_or_null(o, "name", r->name);
    http_json_put(o, "labels", cJSON_CreateRaw(r->labels ? r->labels : "{}"));
}

static int ascii_in(const char *s, const char *set)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              strchr(set, *s)))
            return 0;
    return 1;
}

int api_job_name_valid(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= API_NAME_MAX && s[0] != '.' && s[0] != '-' && s[0] != '_' &&
           ascii_in(s, "._-");
}

int api_label_key_valid(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= API_LABEL_KEY_MAX && s[0] != '.' && s[0] != '-' && s[0] != '_' &&
           s[0] != '/' && ascii_in(s, "._/-");
}

int api_label_value_valid(const char *s)
{
    return strlen(s) <= API_LABEL_VALUE_MAX && ascii_in(s, "._:/@+=-");
}

int api_job_meta_parse(const cJSON *extras, char *name, char *labels, cJSON *errs)
{
    name[0] = 0;
    labels[0] = 0;
    int bad = 0;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(extras, "name");
    if (n && !cJSON_IsNull(n)) {
        if (!cJSON_IsString(n) || !api_job_name_valid(n->valuestring)) {
            http_errors_add(errs, "name", "expected 1 to 64 of A-Z a-z 0-9 . _ - (not first: . _ -),"
                                          " or null");
            bad = 1;
        } else {
            memcpy(name, n->valuestring, strlen(n->valuestring) + 1);
        }
    }
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(extras, "labels");
    if (!l || cJSON_IsNull(l)) return bad ? -1 : 0;
    if (!cJSON_IsObject(l)) {
        http_errors_add(errs, "labels", "expected an object of strings ({\"team\": \"vision\"}), "
                                        "or null");
        return -1;
    }
    int count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, l)
    {
        char path[96];
        snprintf(path, sizeof path, "labels.%.*s", (int)utf8_cut(e->string, 80), e->string);
        if (++count > API_LABELS_MAX) {
            http_errors_add(errs, "labels", "at most 16 labels");
            bad = 1;
            break;
        }
        if (!api_label_key_valid(e->string)) {
            http_errors_add(errs, path, "a label's key is 1 to 63 of A-Z a-z 0-9 . _ / - (not "
                                        "first: . _ / -)");
            bad = 1;
        } else if (!cJSON_IsString(e) || !api_label_value_valid(e->valuestring)) {
            http_errors_add(errs, path, "a label's value is a string of 0 to 128 of A-Z a-z 0-9 "
                                        ". _ : / @ + = -");
            bad = 1;
        }
    }
    if (bad) return -1;
    /* 16 labels of checked characters (none JSON escapes) fit API_LABELS_JSON_MAX */
    if (!cJSON_PrintPreallocated((cJSON *)l, labels, API_LABELS_JSON_MAX, 0)) {
        http_errors_add(errs, "labels", "the labels cannot be stored");
        return -1;
    }
    return 0;
}

int api_checkpoint_steps(const struct api *a, const char *id, int64_t *steps, int max)
{
    char dir[FSIO_PATH_MAX];
    if (pool_checkpoint_path(a->cfg.pool, id, 0, dir, sizeof dir)) return 0;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && max > 0) {
        long long st;
        char tail[16];
        if (sscanf(de->d_name, "step-%lld.safe%15s", &st, tail) != 2 ||
            strcmp(tail, "tensors") != 0 || st < 0)
            continue;
        if (n < max) {
            steps[n++] = st;
            continue;
        }
        int lo = 0; /* full: the newest max are kept, whatever readdir's order */
        for (int i = 1; i < n; i++)
            if (steps[i] < steps[lo]) lo = i;
        if (st > steps[lo]) steps[lo] = st;
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++) /* oldest first */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

cJSON *api_job_json(const struct api *a, const struct job_row *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "kind", r->kind);
    cJSON_AddStringToObject(o, "owner", r->owner);
    cJSON_AddStringToObject(o, "state", job_state_name(r->state));
    api_job_meta(o, r);
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
    /* the stored spec is canonical JSON the server wrote (spec_to_json) */
    http_json_put(o, "spec", spec_compact(r->spec));
    char buf[192];
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    static const char *const tails[][2] = {
        {"self", ""}, {"events", "/events"}, {"logs", "/logs"}, {"loss_png", "/loss.png"},
        {"loss_csv", "/loss.csv"}, {"grids", "/grids/{step}.png"}, {"checkpoints", "/checkpoints"}};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        api_link(a, buf, sizeof buf, "/jobs/%s%s", r->id, tails[i][1]);
        cJSON_AddStringToObject(links, tails[i][0], buf);
    }
    /* the newest checkpoint, as it is and as a diffusers pipeline */
    int64_t steps[64];
    int n = api_checkpoint_steps(a, r->id, steps, 64);
    if (n > 0) {
        api_link(a, buf, sizeof buf, "/checkpoints/%s-%" PRId64, r->id, steps[n - 1]);
        cJSON_AddStringToObject(links, "checkpoint", buf);
        api_link(a, buf, sizeof buf, "/checkpoints/%s-%" PRId64 "?format=diffusers", r->id,
                 steps[n - 1]);
        cJSON_AddStringToObject(links, "export", buf);
    } else {
        cJSON_AddNullToObject(links, "checkpoint");
        cJSON_AddNullToObject(links, "export");
    }
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

/* POST /train's request as parsed: the spec, the webhook, name and labels beside it, and the
 * server paths its data and init_from name; parsed once, before the planning suspends the
 * request, and taken up again by the resumed handler (c->r->parsed) */
struct train_req {
    struct train_spec spec;
    struct webhook_sub sub;
    int hook, uploaded;
    char name[API_NAME_MAX + 1], labels[API_LABELS_JSON_MAX];
    char data_path[FSIO_PATH_MAX], init_path[FSIO_PATH_MAX];
};

/* the body parsed and checked into q: 0, or 1 with the refusal queued in *res */
static int train_req_parse(struct ctx *c, struct train_req *q, enum MHD_Result *res)
{
    /* the spec, and beside it "webhook" ({"url", "events"}), "name" and "labels" */
    static const char *const extra[] = {"webhook", "name", "labels", NULL};
    struct spec_errors es;
    cJSON *extras = NULL;
    int spec_bad = spec_parse_request(c->r->body ? c->r->body : "", c->r->len, extra, &extras,
                                      &q->spec, &es);
    if (es.syntax) {
        cJSON_Delete(extras);
        return *res = http_send_malformed(c, es.syntax_at), 1;
    }
    const cJSON *wh = cJSON_GetObjectItemCaseSensitive(extras, "webhook");
    q->hook = wh != NULL;
    if (wh) {
        char wpath[64], wmsg[200];
        int bad = !c->a->cfg.webhook ||
                  webhook_parse(c->a->cfg.webhook, wh, &q->sub, wpath, sizeof wpath, wmsg, sizeof wmsg);
        if (!c->a->cfg.webhook) snprintf(wpath, sizeof wpath, "webhook"),
                                snprintf(wmsg, sizeof wmsg, "this server sends no webhooks");
        if (bad) {
            cJSON_Delete(extras);
            return *res = http_send_invalid(c, 422, wpath, wmsg), 1;
        }
    }
    /* the spec's errors and the name's and labels', one list under one cap */
    cJSON *errs = http_errors_new();
    int meta_bad = api_job_meta_parse(extras, q->name, q->labels, errs);
    cJSON_Delete(extras);
    if (spec_bad || meta_bad) {
        for (int i = 0; errs && i < es.n; i++) http_errors_add(errs, es.e[i].path, es.e[i].msg);
        return *res = http_send_errors(c, errs, "spec"), 1;
    }
    cJSON_Delete(errs);
    /* over HTTP a job names data by id, never by a path on the server's disk: the built-in
     * fashion-mnist or an upload the caller can see, whose images/ folder the child reads */
    q->uploaded = strcmp(q->spec.dataset, "fashion-mnist") != 0;
    if (q->uploaded) {
        cJSON *d = upload_id_valid(q->spec.dataset) ? api_upload_json(c, q->spec.dataset) : NULL;
        int visible = d && api_upload_visible(c, d);
        enum MHD_Result ures;
        if (visible && api_upload_unusable(c, d, &ures)) { /* validating, or failed */
            cJSON_Delete(d);
            return *res = ures, 1;
        }
        cJSON_Delete(d);
        if (!visible ||
            upload_dataset_path(api_data_dir(c), q->spec.dataset, "images", q->data_path,
                                sizeof q->data_path) ||
            strlen(q->data_path) >= SPEC_PATH_MAX)
            return *res = http_send_invalid(c, 422, "data.dataset",
                           "unknown dataset id: \"fashion-mnist\" or an uploaded dataset's id "
                           "(GET /datasets lists them; a server path is never accepted over HTTP)"), 1;
    }
    /* the decoded dataset must fit this host: refused before any planning (an upload is
     * counted in its folder, the spec keeps its id) */
    struct train_spec at = q->spec;
    char host_why[400];
    if (q->uploaded) memcpy(at.dataset, q->data_path, strlen(q->data_path) + 1);
    if (spec_host_check(&at, host_why, sizeof host_why))
        return *res = http_send_invalid(c, 422, "data.dataset", host_why), 1;
    if (q->spec.init_from[0]) {
        char jid[JOBS_ID_LEN];
        int64_t step;
        struct job_row src;
        struct stat sb;
        if (pool_checkpoint_id_parse(q->spec.init_from, jid, sizeof jid, &step))
            return *res = http_send_invalid(c, 422, "init_from",
                           "expected a checkpoint id like j0123456789abcdef-300 (GET "
                           "/jobs/{id}/checkpoints lists them), or null"), 1;
        int rc = jobs_get(c->a->cfg.db, jid, &src);
        int visible = rc == JOBS_OK && (c->admin || strcmp(src.owner, c->owner) == 0);
        job_row_free(&src);
        if (!visible ||
            pool_checkpoint_path(c->a->cfg.pool, jid, step, q->init_path, sizeof q->init_path) ||
            stat(q->init_path, &sb) || !S_ISREG(sb.st_mode))
            return *res = http_send_invalid(c, 422, "init_from", "no such checkpoint"), 1;
        if (strlen(q->init_path) >= SPEC_PATH_MAX)
            return *res = http_send_invalid(c, 422, "init_from", "the checkpoint's path is too long"), 1;
    }
    return 0;
}

enum MHD_Result h_train(struct ctx *c)
{
    if (!http_json_body(c))
        return http_send_problem(c, 415, NULL, "POST /train takes a TrainSpec as application/json",
                       NULL, (const char *const[]){"Accept-Post", "application/json", NULL});
    if (!c->a->admitting)
        return http_send_stopping(c);
    enum MHD_Result ires;
    if (api_idem_begin(c, "POST /train", &ires)) return ires;
    /* the body parsed once: the resumed run (after its planning) takes up the first run's */
    struct train_req *q = c->r->parsed;
    if (!q) {
        if (!(q = calloc(1, sizeof *q))) return http_send_oom(c);
        enum MHD_Result pres;
        if (train_req_parse(c, q, &pres)) {
            free(q);
            return pres;
        }
        c->r->parsed = q;
    }
    struct train_spec spec = q->spec; /* the planning and the queueing take a copy */
    struct webhook_sub sub = q->sub;
    const int hook = q->hook, uploaded = q->uploaded;
    const char *data_path = q->data_path;
    struct pool_train job = {.spec = &spec, .name = q->name,
                             .labels = q->labels[0] ? q->labels : NULL,
                             .dataset_dir = uploaded ? q->data_path : NULL,
                             .init_path = spec.init_from[0] ? q->init_path : NULL};
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

/* the request's label=KEY:VALUE arguments as [["KEY", "VALUE"], ...] (jobs_filter.labels) */
struct label_args {
    cJSON *pairs;
    int n;
    int bad;                    /* 1 a malformed one, 2 too many, 3 out of memory */
};

static enum MHD_Result label_arg(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    struct label_args *la = cls;
    (void)kind;
    if (strcmp(k, "label") != 0) return MHD_YES;
    if (++la->n > API_LABELS_MAX) {
        la->bad = 2;
        return MHD_NO;
    }
    char key[API_LABEL_KEY_MAX + 1];
    const char *colon = v ? strchr(v, ':') : NULL;
    size_t kl = colon ? (size_t)(colon - v) : 0;
    if (!colon || kl >= sizeof key) {
        la->bad = 1;
        return MHD_NO;
    }
    memcpy(key, v, kl);
    key[kl] = 0;
    if (!api_label_key_valid(key) || !api_label_value_valid(colon + 1)) {
        la->bad = 1;
        return MHD_NO;
    }
    cJSON *pair = cJSON_CreateArray();
    if (!pair || !cJSON_AddItemToArray(la->pairs, pair) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateString(key)) ||
        !cJSON_AddItemToArray(pair, cJSON_CreateString(colon + 1))) {
        la->bad = 3;
        return MHD_NO;
    }
    return MHD_YES;
}

static enum MHD_Result jobs_list_labeled(struct ctx *c, const char *kind, const char *key,
                                         const char *st, const char *lim, const char *after,
                                         const char *owner, const char *k, const char *name,
                                         const char *labels);

/* GET /jobs and GET /samples: paging by `after`, filters state, owner, name, labels (every
 * label=KEY:VALUE given: AND) (and kind for /jobs) */
enum MHD_Result api_jobs_list(struct ctx *c, const char *kind, const char *key)
{
    const char *st = http_arg(c, "state"), *lim = http_arg(c, "limit"), *after = http_arg(c, "after");
    const char *owner = http_arg(c, "owner"), *k = kind ? NULL : http_arg(c, "kind");
    const char *name = http_arg(c, "name");
    if (name && !api_job_name_valid(name))
        return http_send_invalid(c, 400, "name",
                                 "expected a job name: 1 to 64 of A-Z a-z 0-9 . _ - (not first: . _ -)");
    struct label_args la = {.pairs = cJSON_CreateArray()};
    if (!la.pairs) return http_send_oom(c);
    MHD_get_connection_values(c->conn, MHD_GET_ARGUMENT_KIND, label_arg, &la);
    char *labels = la.n && !la.bad ? cJSON_PrintUnformatted(la.pairs) : NULL;
    cJSON_Delete(la.pairs);
    if (la.bad == 3 || (la.n && !la.bad && !labels)) return http_send_oom(c);
    if (la.bad == 2) {
        char msg[96];
        snprintf(msg, sizeof msg, "at most %d label filters (a job has at most %d labels)",
                 API_LABELS_MAX, API_LABELS_MAX);
        return http_send_invalid(c, 400, "label", msg);
    }
    if (la.bad)
        return http_send_invalid(c, 400, "label",
                                 "expected KEY:VALUE, a label's key and value (e.g. team:vision)");
    enum MHD_Result res = jobs_list_labeled(c, kind, key, st, lim, after, owner, k, name, labels);
    free(labels);
    return res;
}

/* api_jobs_list once its labels are read (labels: the filter's JSON, or NULL) */
static enum MHD_Result jobs_list_labeled(struct ctx *c, const char *kind, const char *key,
                                         const char *st, const char *lim, const char *after,
                                         const char *owner, const char *k, const char *name,
                                         const char *labels)
{
    int state = -1;
    long long limit = LIST_LIMIT_DEFAULT;
    if (st && (state = job_state_parse(st)) < 0)
        return http_send_invalid(c, 400, "state",
                       "expected one of queued, running, succeeded, failed, canceled");
    if (lim && api_parse_int(lim, 1, LIST_LIMIT_MAX, &limit))
        return http_send_invalid(c, 400, "limit", "expected an integer from 1 to 200");
    if (after && !pool_job_id_valid(after))
        return http_send_invalid(c, 400, "after", "expected a job id (the previous page's next)");
    if (after) {
        /* the cursor is the job's place in the list: one deleted since has none (the page
         * after it would be empty, as if the list had ended) */
        struct job_row ar;
        int g = jobs_get(c->a->cfg.db, after, &ar);
        if (g == JOBS_OK) job_row_free(&ar);
        if (g == JOBS_ERR_NOT_FOUND)
            return http_send_invalid(c, 400, "after", "no such job: it was deleted since this "
                                                      "page was listed; list again from the start");
        if (g) return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    }
    if (k && strcmp(k, "train") != 0 && strcmp(k, "sample") != 0 && strcmp(k, "import") != 0)
        return http_send_invalid(c, 400, "kind", "expected train, sample or import");
    if (k) kind = k;
    if (owner && !c->admin && strcmp(owner, c->owner) != 0)
        return http_send_problem(c, 403, NULL, "only an admin token lists another token's jobs", NULL,
                       NULL);
    if (!owner && !c->admin) owner = c->owner;
    struct job_row *rows;
    int n;
    struct jobs_filter f = {.owner = owner, .kind = kind, .state = state, .name = name,
                            .labels = labels};
    if (jobs_list_filter(c->a->cfg.db, &f, after, (int)limit, &rows, &n))
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

static enum MHD_Result job_delete_held(struct ctx *c, const char *dir, enum job_state now,
                                       char *user, char *detail, size_t dlen);

/* DELETE /jobs/{id}: an ended job, its row, events and files (checkpoints and their exports,
 * grids, samples, loss, logs): 409 while it is queued or running (cancel it first), while a
 * queued or running job reads one of its checkpoints, or while a diffusers export of one is
 * being built (its tar writer works in the folder: export_hold_dir) */
enum MHD_Result h_job_delete(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    enum job_state now = JOB_QUEUED;
    char user[JOBS_ID_LEN], detail[200], dir[FSIO_PATH_MAX];
    if (pool_job_file(c->a->cfg.pool, c->param, "", dir, sizeof dir))
        return http_send_problem(c, 500, NULL, "the job's folder cannot be named", NULL, NULL);
    /* no tar writer in its folder while it goes (export.h) */
    if (export_hold_dir(dir)) {
        snprintf(detail, sizeof detail, "a diffusers export of one of job %s's checkpoints is "
                 "being built: try again in a moment", c->param);
        return http_send_problem(c, 409, "export-in-progress", detail, NULL,
                                 (const char *const[]){"Retry-After", "5", NULL});
    }
    enum MHD_Result res2 = job_delete_held(c, dir, now, user, detail, sizeof detail);
    export_release_dir(dir);
    return res2;
}

/* h_job_delete with the job's folder held (dir) */
static enum MHD_Result job_delete_held(struct ctx *c, const char *dir, enum job_state now,
                                       char *user, char *detail, size_t dlen)
{
    int rc = jobs_delete(c->a->cfg.db, c->param, &now, user);
    if (rc == JOBS_ERR_STATE) {
        if (user[0])
            snprintf(detail, dlen, "job %s, queued or running, reads a checkpoint of "
                     "job %s: cancel it or let it end first", user, c->param);
        else
            snprintf(detail, dlen, "job %s is %s: cancel it first (POST /jobs/%s/cancel)",
                     c->param, job_state_name(now), c->param);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return http_send_problem(c, 409, "wrong-state", detail, o, NULL);
    }
    if (rc == JOBS_ERR_NOT_FOUND) {
        snprintf(detail, dlen, "no job %s", c->param);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    if (rc) return http_send_problem(c, 500, NULL, "the job store cannot be written", NULL, NULL);
    /* the row is gone, so nothing starts the job again or serves its files: they go now */
    if (upload_rmtree(dir) && errno != ENOENT)
        log_job(LOG_WARN, c->param, "deleted, but its files were not all removed: %s",
                strerror(errno));
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!resp) return http_send_oom(c);
    enum MHD_Result rr = http_respond(c, 204, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* POST /jobs/{id}/resume: a canceled or failed training job queued again; it resumes from its
 * newest checkpoint as a restarted job does (the same spec file, device and threads: bit for
 * bit the run it would have been). 409 in any other state or without a checkpoint */
enum MHD_Result h_resume(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    char detail[200];
    int train = strcmp(r.kind, "train") == 0;
    enum job_state now = r.state;
    job_row_free(&r);
    if (!c->a->admitting)
        return http_send_stopping(c);
    if (!train || (now != JOB_CANCELED && now != JOB_FAILED)) {
        snprintf(detail, sizeof detail, "job %s is %s%s: only a canceled or failed training job "
                 "resumes", c->param, train ? "" : "not a training job, ", job_state_name(now));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return http_send_problem(c, 409, "wrong-state", detail, o, NULL);
    }
    int64_t steps[64];
    int n = api_checkpoint_steps(c->a, c->param, steps, 64);
    if (n == 0) {
        snprintf(detail, sizeof detail, "job %s has no checkpoint to resume from (submit its "
                 "spec again instead)", c->param);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return http_send_problem(c, 409, "no-checkpoint", detail, o, NULL);
    }
    /* the pool's limits hold for a resumed job as for a new one */
    const struct pool_config *pc = pool_config_of(c->a->cfg.pool);
    int mine = 0, queued = 0;
    if (jobs_count(c->a->cfg.db, JOB_QUEUED, &queued) ||
        (pc->max_per_owner > 0 && jobs_count_owner(c->a->cfg.db, c->owner, &mine)))
        return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    if (queued >= pc->max_queue)
        return http_send_problem(c, 503, "queue-full", "the queue is full (--max-queue)", NULL,
                                 (const char *const[]){"Retry-After", "30", NULL});
    if (pc->max_per_owner > 0 && mine >= pc->max_per_owner) {
        snprintf(detail, sizeof detail, "%s has %d jobs queued or running (the limit, "
                 "--max-jobs-per-owner)", c->owner, mine);
        return http_send_problem(c, 429, "owner-limit", detail, NULL,
                                 (const char *const[]){"Retry-After", "30", NULL});
    }
    snprintf(detail, sizeof detail, "{\"state\":\"queued\",\"reason\":\"resumed from its "
             "checkpoint at step %" PRId64 "\",\"resume_step\":%" PRId64 "}", steps[n - 1],
             steps[n - 1]);
    int rc = jobs_resume(c->a->cfg.db, c->param, detail, &now);
    if (rc == JOBS_ERR_STATE) { /* it changed since it was read */
        snprintf(detail, sizeof detail, "job %s is %s", c->param, job_state_name(now));
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", job_state_name(now));
        return http_send_problem(c, 409, "wrong-state", detail, o, NULL);
    }
    if (rc) return http_send_problem(c, 500, NULL, "the job store cannot be written", NULL, NULL);
    log_job(LOG_INFO, c->param, "resumed by its owner from step %" PRId64, steps[n - 1]);
    if (jobs_get(c->a->cfg.db, c->param, &r))
        return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/jobs/%s", c->param);
    cJSON *o = api_job_json(c->a, &r);
    job_row_free(&r);
    return http_send_json(c, 202, o, NULL, (const char *const[]){"Location", loc, NULL});
}
