/* routes.h - the handlers of the route table (api.c), one file per resource: jobs.c (training
 * jobs), samples.c, datasets.c, checkpoints.c, events.c (SSE), status.c (health, devices,
 * metrics), page.c (the dashboard, openapi.yaml); and what they share: a job's JSON, a job
 * loaded for its caller, the submit's answers (submit.c). Each handler answers its request and
 * returns libmicrohttpd's result. Inside api/ only.
 */
#ifndef DDPMD_ROUTES_H
#define DDPMD_ROUTES_H

#include "http.h"
#include "pool.h"

/* ---- jobs.c ---- */
enum MHD_Result h_train(struct ctx *c);
enum MHD_Result h_jobs(struct ctx *c);
enum MHD_Result h_job(struct ctx *c);
enum MHD_Result h_cancel(struct ctx *c);
enum MHD_Result h_logs(struct ctx *c);
enum MHD_Result h_loss_csv(struct ctx *c);
enum MHD_Result h_loss_png(struct ctx *c);
enum MHD_Result h_job_grid(struct ctx *c);
/* GET /jobs/{id} of a training job (the stored spec and plans put in as they are) */
cJSON *api_job_json(const struct api *a, const struct job_row *r);
/* where a job runs and its plans, into o: device (null until it starts), reserved_bytes and plan
 * (on its device, or while queued on the first device it fits), plans (every device's) */
void api_job_placement(cJSON *o, const struct job_row *r);
/* a job's name and labels (POST /train and POST /samples, beside the request's fields): a name is
 * 1 to API_NAME_MAX of [A-Za-z0-9._-], not starting with [._-]; labels an object of at most
 * API_LABELS_MAX keys (1 to API_LABEL_KEY_MAX of [A-Za-z0-9._/-], not starting with [._/-])
 * to strings (0 to API_LABEL_VALUE_MAX of [A-Za-z0-9._:/@+=-]) */
#define API_NAME_MAX 64
#define API_LABELS_MAX 16
#define API_LABEL_KEY_MAX 63
#define API_LABEL_VALUE_MAX 128
#define API_LABELS_JSON_MAX 4096 /* the labels' compact JSON, whatever they hold */
int api_job_name_valid(const char *s);
int api_label_key_valid(const char *s);
int api_label_value_valid(const char *s);
/* "name" and "labels" of extras (either may be absent or null) into name (API_NAME_MAX + 1
 * bytes; "" none) and labels (API_LABELS_JSON_MAX bytes: their compact JSON; "" none); -1 with
 * their errors added to errs (http_errors_add) when either is bad */
int api_job_meta_parse(const cJSON *extras, char *name, char *labels, cJSON *errs);
/* "name" (null when none) and "labels" ({} when none) of the job into o */
void api_job_meta(cJSON *o, const struct job_row *r);
/* the steps of job id's checkpoints on disk (step-N.safetensors), the newest max of them,
 * oldest first; how many */
int api_checkpoint_steps(const struct api *a, const char *id, int64_t *steps, int max);
enum MHD_Result h_job_delete(struct ctx *c);
enum MHD_Result h_resume(struct ctx *c);
/* the job named id, visible to the caller: 0, or the answer sent (*res: 404, 403, 500) */
int api_job_load(struct ctx *c, const char *id, struct job_row *r, enum MHD_Result *res);
/* GET /jobs and GET /samples: paging by `after`, filters state, owner (and kind for /jobs); the
 * rows under key ("jobs", "samples") */
enum MHD_Result api_jobs_list(struct ctx *c, const char *kind, const char *key);

/* ---- samples.c ---- */
enum MHD_Result h_samples_post(struct ctx *c);
enum MHD_Result h_samples(struct ctx *c);
enum MHD_Result h_sample(struct ctx *c);
enum MHD_Result h_sample_grid(struct ctx *c);
enum MHD_Result h_sample_image(struct ctx *c);
/* GET /samples/{id} of a sampling job */
cJSON *api_sample_json(const struct api *a, const struct job_row *r);

/* ---- submit.c: POST /train and POST /samples ---- */
/* Idempotency-Key: 1 when the answer is already sent (the first answer replayed, a key reused
 * with another body: 422, a key whose first request is still being answered: 409, a malformed
 * key: 400); 0 to go on (the key, if any, reserved: c->idem_open) */
int api_idem_begin(struct ctx *c, const char *route, enum MHD_Result *res);
/* a 202 with Location, o the new job (consumed); stored as the answer of the request's key */
enum MHD_Result api_accepted(struct ctx *c, cJSON *o, const char *loc);
/* a submit the pool refused (rc) -> its problem; plan_path names the field a plan error is
 * about; takes adm's plans */
enum MHD_Result api_submit_refused(struct ctx *c, int rc, struct pool_admission *adm,
                                   const char *err, const char *plan_path);

/* POST /train's admission planning (pool_plan_train) on the planning worker, no lock held,
 * stopped at the deadline and refused past --plan-memory (422 on plan_path's field).
 * The first call queues it and suspends the connection: 1 with *res = MHD_YES (return it).
 * The request is resumed when its plan is made or at --plan-timeout and its handler runs
 * again; this call then gives 0 with adm's fits and entries[d] (for pool_submit_planned), or
 * 1 with the answer sent (*res: 503 plan-timeout, 503 stopping, or the plan's refusal as
 * api_submit_refused). A full queue is 503 planner-busy at once. */
int api_plan_train(struct ctx *c, const struct pool_train *job, struct pool_admission *adm,
                   cJSON **entries, char *err, size_t errlen, enum MHD_Result *res);
/* the same for POST /samples' sampling job (pool_plan_sample; then pool_submit_sample_planned) */
int api_plan_sample(struct ctx *c, const struct pool_sample *s, struct pool_admission *adm,
                    cJSON **entries, char *err, size_t errlen, enum MHD_Result *res);
/* the planning's deadline watcher: started with the api; stopped after the planner (it
 * resumes any request left suspended), freed after the daemon; NULL-safe */
int api_plans_start(struct api *a);
void api_plans_stop(struct api *a);
void api_plans_free(struct api *a);
/* a finished request's planning given up (on_completed) */
void api_plan_drop(struct req *r);

/* ---- datasets.c ---- */
enum MHD_Result h_datasets(struct ctx *c);
enum MHD_Result h_datasets_post(struct ctx *c);
enum MHD_Result h_dataset(struct ctx *c);
enum MHD_Result h_dataset_delete(struct ctx *c);
enum MHD_Result h_dataset_preview(struct ctx *c);
/* the server's data directory */
const char *api_data_dir(struct ctx *c);
/* an uploaded dataset's JSON (from its dataset.json); NULL when there is none */
cJSON *api_upload_json(struct ctx *c, const char *id);
/* queues the decoding of the uploads a stopped server left validating on a's upload worker
 * (one task for them all); 0, or -1 when it cannot (they stay validating) */
int api_datasets_resume(struct api *a, const char *data_dir);
/* POST /train on the upload o: 1 with the answer sent when it is not ready (*res: 409
 * dataset-not-ready while validating, 422 data.dataset with the reason when it failed) */
int api_upload_unusable(struct ctx *c, const cJSON *o, enum MHD_Result *res);
/* whether the caller may see the upload o */
int api_upload_visible(struct ctx *c, const cJSON *o);
/* POST /datasets, its first call: refused before a byte of the body is read (401, 415, 413, or
 * the store cannot take it), else its temporary file opened (the body streams there); 1 when an
 * answer was sent (*res) */
int api_upload_begin(struct ctx *c, long long declared, enum MHD_Result *res);
/* an upload's body to a temporary file: 0 when open, 1 with the 507/500 answer sent */
int api_upload_open(struct ctx *c, enum MHD_Result *res);

/* ---- checkpoints.c ---- */
enum MHD_Result h_checkpoints(struct ctx *c);
enum MHD_Result h_checkpoint(struct ctx *c);
enum MHD_Result h_checkpoint_import(struct ctx *c);
/* POST /checkpoints, its first call (as api_upload_begin): 401, 415, 413 before a byte of the
 * body is read, else its temporary file opened; 1 when an answer was sent (*res) */
int api_checkpoint_upload_begin(struct ctx *c, long long declared, enum MHD_Result *res);

/* ---- events.c ---- */
enum MHD_Result h_events(struct ctx *c);
/* resumes the suspended streams: all (a notify, the stop), or those quiet for the keep-alive
 * interval (lock a->mu held) */
void api_events_resume(struct api *a, int all);
/* the thread that resumes quiet streams for their keep-alives (arg: the api) until a->stopping */
void *api_events_ticker(void *arg);

/* ---- status.c ---- */
enum MHD_Result h_healthz(struct ctx *c);
enum MHD_Result h_readyz(struct ctx *c);
enum MHD_Result h_devices(struct ctx *c);
enum MHD_Result h_metrics(struct ctx *c);

/* ---- page.c ---- */
enum MHD_Result h_openapi(struct ctx *c);
enum MHD_Result h_ui_index(struct ctx *c);
enum MHD_Result h_ui_js(struct ctx *c);
enum MHD_Result h_ui_css(struct ctx *c);

#endif
