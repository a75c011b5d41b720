/* datasets.c - the datasets' routes: the built-in fashion-mnist and uploads (server/upload.c),
 * listed, described, previewed, uploaded (the body streamed to a file, refused before a byte is
 * read when it cannot be taken; checked and unpacked on the request, at most one fewer at once
 * than the HTTP threads, its images decoded on the upload worker: 202 "validating", then "ready"
 * or "failed") and deleted when no job uses them.
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

#include "dataset.h"
#include "fsio.h"
#include "jobs.h"
#include "pool.h"
#include "upload.h"
#include "utf8.h"
#include "worker.h"

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

const char *api_data_dir(struct ctx *c) { return pool_config_of(c->a->cfg.pool)->data_dir; }

/* an uploaded dataset's JSON, from its dataset.json; NULL when there is none */
cJSON *api_upload_json(struct ctx *c, const char *id)
{
    char *m = upload_dataset_meta(api_data_dir(c), id);
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
    /* made before datasets had states: ready */
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
    if (!cJSON_IsString(st)) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "state");
        st = cJSON_AddStringToObject(o, "state", UPLOAD_STATE_READY);
    }
    if (!cJSON_GetObjectItemCaseSensitive(o, "error")) cJSON_AddNullToObject(o, "error");
    cJSON_AddBoolToObject(o, "available", st && strcmp(st->valuestring, UPLOAD_STATE_READY) == 0);
    char buf[160];
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    api_link(c->a, buf, sizeof buf, "/datasets/%s", id);
    cJSON_AddStringToObject(links, "self", buf);
    /* the preview is made with the decoding: linked once the dataset is ready */
    if (st && strcmp(st->valuestring, UPLOAD_STATE_READY) == 0) {
        api_link(c->a, buf, sizeof buf, "/datasets/%s/preview.png", id);
        cJSON_AddStringToObject(links, "preview", buf);
    }
    return o;
}

int api_upload_unusable(struct ctx *c, const cJSON *o, enum MHD_Result *res)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (!cJSON_IsString(st) || strcmp(st->valuestring, UPLOAD_STATE_READY) == 0) return 0;
    char detail[900];
    const char *name = cJSON_IsString(id) ? id->valuestring : "?";
    if (strcmp(st->valuestring, UPLOAD_STATE_FAILED) == 0) {
        snprintf(detail, sizeof detail, "dataset %s failed validation: %s", name,
                 cJSON_IsString(why) ? why->valuestring : "no reason recorded");
        *res = http_send_invalid(c, 422, "data.dataset", detail);
    } else {
        snprintf(detail, sizeof detail, "dataset %s is still %s (its images are being decoded): "
                 "submit again when GET /datasets/%s says ready", name, st->valuestring, name);
        *res = http_send_problem(c, 409, "dataset-not-ready", detail, NULL,
                                 (const char *const[]){"Retry-After", "5", NULL});
    }
    return 1;
}

int api_upload_visible(struct ctx *c, const cJSON *o)
{
    const cJSON *ow = cJSON_GetObjectItemCaseSensitive(o, "owner");
    return c->admin || (cJSON_IsString(ow) && strcmp(ow->valuestring, c->owner) == 0);
}

/* GET /datasets: the built-in one and the caller's uploads (an admin: every upload) */
enum MHD_Result h_datasets(struct ctx *c)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "datasets");
    http_json_put_array(arr, fmnist_json());
    char(*ids)[UPLOAD_ID_LEN] = NULL;
    int n = 0;
    if (upload_dataset_ids(api_data_dir(c), &ids, &n)) {
        cJSON_Delete(o);
        return http_send_problem(c, 500, NULL, "the dataset folder cannot be read", NULL, NULL);
    }
    for (int i = 0; i < n; i++) {
        cJSON *d = api_upload_json(c, ids[i]);
        if (d && api_upload_visible(c, d))
            http_json_put_array(arr, d);
        else
            cJSON_Delete(d);
    }
    free(ids);
    return http_send_json(c, 200, o, NULL, NULL);
}

/* the uploaded dataset named by the path, visible to the caller: its JSON, or the answer sent */
static cJSON *load_upload(struct ctx *c, enum MHD_Result *res)
{
    char detail[160];
    cJSON *o = upload_id_valid(c->param) ? api_upload_json(c, c->param) : NULL;
    if (!o) {
        snprintf(detail, sizeof detail, "no dataset '%.*s' (GET /datasets lists them)",
                 (int)utf8_cut(c->param, 40), c->param);
        *res = http_send_problem(c, 404, NULL, detail, NULL, NULL);
        return NULL;
    }
    if (!api_upload_visible(c, o)) {
        cJSON_Delete(o);
        snprintf(detail, sizeof detail, "dataset %s belongs to another token", c->param);
        *res = http_send_problem(c, 403, NULL, detail, NULL, NULL);
        return NULL;
    }
    return o;
}

enum MHD_Result h_dataset(struct ctx *c)
{
    if (strcmp(c->param, "fashion-mnist") == 0) return http_send_json(c, 200, fmnist_json(), NULL, NULL);
    enum MHD_Result res;
    cJSON *o = load_upload(c, &res);
    return o ? http_send_json(c, 200, o, NULL, NULL) : res;
}

enum MHD_Result h_dataset_preview(struct ctx *c)
{
    enum MHD_Result res;
    if (strcmp(c->param, "fashion-mnist") == 0)
        return http_send_problem(c, 404, NULL, "the built-in dataset has no preview (uploads do)", NULL,
                       NULL);
    cJSON *o = load_upload(c, &res);
    if (!o) return res;
    cJSON_Delete(o);
    char path[FSIO_PATH_MAX];
    int have = upload_dataset_path(api_data_dir(c), c->param, "preview.png", path, sizeof path) == 0;
    return http_send_file(c, have ? path : NULL, "image/png", "the dataset has no preview");
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
                    http_json_put_array(arr, cJSON_CreateString(rows[i].id));
                cJSON_Delete(sp);
            }
            if (n) snprintf(after, sizeof after, "%s", rows[n - 1].id);
            job_rows_free(rows, n);
            if (n < 200) break;
        }
    }
    return 0;
}

enum MHD_Result h_dataset_delete(struct ctx *c)
{
    if (strcmp(c->param, "fashion-mnist") == 0)
        return http_send_problem(c, 403, NULL, "the built-in dataset cannot be deleted", NULL, NULL);
    enum MHD_Result res;
    cJSON *o = load_upload(c, &res);
    if (!o) return res;
    cJSON_Delete(o);
    cJSON *x = cJSON_CreateObject(), *users = cJSON_AddArrayToObject(x, "jobs");
    upload_lock(); /* no job can be queued on it between the check and the delete */
    if (jobs_using(c, c->param, users)) {
        upload_unlock();
        cJSON_Delete(x);
        return http_send_problem(c, 500, NULL, "the job store cannot be read", NULL, NULL);
    }
    if (cJSON_GetArraySize(users) > 0) {
        upload_unlock();
        char detail[200];
        snprintf(detail, sizeof detail, "dataset %s is used by %d queued or running job%s", c->param,
                 cJSON_GetArraySize(users), cJSON_GetArraySize(users) == 1 ? "" : "s");
        return http_send_problem(c, 409, "dataset-in-use", detail, x, NULL);
    }
    cJSON_Delete(x);
    int rc = upload_dataset_delete(api_data_dir(c), c->param);
    upload_unlock();
    if (rc) return http_send_problem(c, 500, NULL, "the dataset could not be removed", NULL, NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return http_send_oom(c);
    enum MHD_Result rr = http_respond(c, 204, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* an upload's images decoded on the upload worker (upload_dataset_validate) */
struct decode_task {
    char data_dir[FSIO_PATH_MAX];
    char id[UPLOAD_ID_LEN];
    const struct worker *w;
};

static int decode_stopping(const void *w) { return worker_stopping(w); }

static void decode_run(void *arg, int canceled)
{
    struct decode_task *t = arg;
    /* a canceled one stays validating: the next start decodes it again (api_datasets_resume) */
    if (!canceled) upload_dataset_validate(t->data_dir, t->id, decode_stopping, t->w);
    free(t);
}

/* the uploads a stopped server left validating, decoded again in one task on the upload worker
 * (in id order, as listed at start: an upload made since has its own task), so a restart loses
 * none and takes one of its slots */
struct resume_task {
    char data_dir[FSIO_PATH_MAX];
    const struct worker *w;
    char (*ids)[UPLOAD_ID_LEN];
    int n;
};

static void resume_run(void *arg, int canceled)
{
    struct resume_task *t = arg;
    for (int i = 0; !canceled && i < t->n && !worker_stopping(t->w); i++)
        upload_dataset_validate(t->data_dir, t->ids[i], decode_stopping, t->w);
    free(t->ids);
    free(t);
}

int api_datasets_resume(struct api *a, const char *data_dir)
{
    struct resume_task *t = calloc(1, sizeof *t);
    if (!t) return -1;
    if (upload_dataset_validating(data_dir, &t->ids, &t->n) || t->n == 0) {
        free(t->ids);
        free(t);
        return 0;
    }
    snprintf(t->data_dir, sizeof t->data_dir, "%s", data_dir);
    t->w = a->decoder;
    if (worker_submit(a->decoder, resume_run, t)) {
        free(t->ids);
        free(t);
        return -1;
    }
    return 0;
}

static enum MHD_Result upload_busy(struct ctx *c)
{
    return http_send_problem(c, 503, "upload-busy",
                             "every upload decoding slot is taken (--upload-workers, "
                             "--upload-queue): try again shortly",
                             NULL, (const char *const[]){"Retry-After", "10", NULL});
}

/* The archives being unpacked: each on its request's HTTP thread (its 413/422/429 answers are
 * synchronous), so at most one fewer than the HTTP threads at once (one with a single thread):
 * a thread is always left for every other request (/healthz, a job's events). One more is 503
 * upload-busy before it is unpacked. Process-wide: a process runs one api. */
static int unpacking;

static int unpack_cap(const struct api *a)
{
    int threads = a->cfg.threads > 0 ? a->cfg.threads : 4; /* api_start's default */
    return threads > 1 ? threads - 1 : 1;
}

/* 0 with a slot taken (unpack_leave gives it back), -1 when all are taken */
static int unpack_enter(const struct api *a)
{
    int cap = unpack_cap(a), n = __atomic_load_n(&unpacking, __ATOMIC_RELAXED);
    do {
        if (n >= cap) return -1;
    } while (!__atomic_compare_exchange_n(&unpacking, &n, n + 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    return 0;
}

static void unpack_leave(void)
{
    __atomic_sub_fetch(&unpacking, 1, __ATOMIC_ACQ_REL);
}

static enum MHD_Result unpack_busy(struct ctx *c)
{
    char detail[200];
    snprintf(detail, sizeof detail, "%d uploads are being unpacked, the most at once with "
             "--http-threads %d (one fewer, so a thread stays free): try again shortly",
             unpack_cap(c->a), c->a->cfg.threads > 0 ? c->a->cfg.threads : 4);
    return http_send_problem(c, 503, "upload-busy", detail, NULL,
                             (const char *const[]){"Retry-After", "5", NULL});
}

/* POST /datasets: the body is already on disk (on_request streamed it to r->upload_path) */
enum MHD_Result h_datasets_post(struct ctx *c)
{
    struct req *r = c->r;
    if (r->upload_errno) {
        char detail[200];
        snprintf(detail, sizeof detail, "the upload cannot be stored: %s", strerror(r->upload_errno));
        return http_send_problem(c, r->upload_errno == ENOSPC ? 507 : 500,
                       r->upload_errno == ENOSPC ? "insufficient-storage" : NULL, detail, NULL, NULL);
    }
    if (close(r->upload_fd)) {
        int e = errno;
        r->upload_fd = -1;
        return http_send_problem(c, e == ENOSPC ? 507 : 500, e == ENOSPC ? "insufficient-storage" : NULL,
                       "the upload cannot be stored", NULL, NULL);
    }
    r->upload_fd = -1;
    struct upload_limits lim = {.max_unpacked = c->a->cfg.upload_max_unpacked,
                                .max_files = c->a->cfg.upload_max_files,
                                .quota_bytes = c->a->cfg.upload_quota_bytes,
                                .quota_pixels = c->a->cfg.upload_quota_pixels};
    char id[UPLOAD_ID_LEN], err[600];
    /* no room to decode it: refused before it is unpacked (a race may still fill the queue:
     * the submit below answers that) */
    if (worker_in_flight(c->a->decoder) >= c->a->decoder_cap)
        return upload_busy(c);
    if (unpack_enter(c->a)) return unpack_busy(c);
    int rc = upload_dataset_create(api_data_dir(c), r->upload_path, c->owner, &lim, (int64_t)r->len,
                                   id, err, sizeof err);
    unpack_leave();
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
                   {UPLOAD_ERR_OVER_QUOTA, 413, "upload-quota"},
                   {UPLOAD_ERR_QUOTA, 429, "upload-quota"},
                   {UPLOAD_ERR_NOSPACE, 507, "insufficient-storage"}};
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (map[i].rc == rc) return http_send_problem(c, map[i].status, map[i].slug, err, NULL, NULL);
        return http_send_problem(c, 500, NULL, err, NULL, NULL);
    }
    /* its answer is read before the worker may change it */
    cJSON *o = api_upload_json(c, id);
    struct decode_task *t = calloc(1, sizeof *t);
    if (t) {
        snprintf(t->data_dir, sizeof t->data_dir, "%s", api_data_dir(c));
        memcpy(t->id, id, sizeof t->id);
        t->w = c->a->decoder;
    }
    if (!t || worker_submit(c->a->decoder, decode_run, t)) {
        free(t);
        cJSON_Delete(o);
        upload_lock();
        upload_dataset_delete(api_data_dir(c), id);
        upload_unlock();
        return upload_busy(c);
    }
    if (!o) return http_send_problem(c, 500, NULL, "the new dataset cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/datasets/%s", id);
    return http_send_json(c, 202, o, NULL, (const char *const[]){"Location", loc, NULL});
}

/* an upload's body (POST /datasets, POST /checkpoints) to a temporary file in the data folder:
 * 0 when open (r->upload set), else 1 with the 507/500 answer sent */
int api_upload_open(struct ctx *c, enum MHD_Result *res)
{
    struct req *r = c->r;
    char err[300];
    r->upload_fd = upload_part_open(pool_config_of(c->a->cfg.pool)->data_dir, r->upload_path,
                                    sizeof r->upload_path, err, sizeof err);
    if (r->upload_fd < 0) {
        r->upload_path[0] = 0;
        *res = http_send_problem(c, errno == ENOSPC ? 507 : 500,
                                 errno == ENOSPC ? "insufficient-storage" : NULL, err, NULL, NULL);
        return 1;
    }
    r->upload = 1;
    return 0;
}

/* POST /datasets, first call: refused before a byte of the body is read (401, 415, 413, or the
 * store cannot take it), else its temporary file is opened; 1 when an answer was sent */
int api_upload_begin(struct ctx *c, long long declared, enum MHD_Result *res)
{
    struct api *a = c->a;
    if (http_authorize(c, 1, res)) return 1;
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    static const char *const types[] = {"application/x-tar", "application/tar", "application/gzip",
                                        "application/x-gzip", "application/x-gtar",
                                        "application/octet-stream", NULL};
    int ok = 0;
    for (int i = 0; ct && types[i]; i++) {
        size_t n = strlen(types[i]);
        ok |= strncasecmp(ct, types[i], n) == 0 && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
    }
    if (!ok) {
        *res = http_send_problem(c, 415, NULL,
                       "POST /datasets takes a tar archive of PNG files, plain (application/x-tar) "
                       "or gzip-compressed (application/gzip)",
                       NULL, (const char *const[]){"Accept-Post", "application/x-tar, application/gzip", NULL});
        return 1;
    }
    if (declared > a->cfg.upload_max_bytes) {
        char detail[160];
        snprintf(detail, sizeof detail, "the archive is %lld bytes; the limit is %lld", declared,
                 (long long)a->cfg.upload_max_bytes);
        *res = http_send_problem(c, 413, "archive-too-large", detail, NULL, NULL);
        return 1;
    }
    return api_upload_open(c, res);
}
