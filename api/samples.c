/* samples.c - the sampling jobs' routes: POST /samples (a checkpoint or a job's newest, the body
 * under POST /train's document rules, its fields checked one by one), GET /samples and
 * /samples/{id}, the grid and the images.
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

#include "checkpoint.h"
#include "jobs.h"
#include "parse.h"
#include "pool.h"
#include "safetensors.h"
#include "spec.h"
#include "train.h"
#include "utf8.h"

#define SAMPLE_N_MAX 1024

cJSON *api_sample_json(const struct api *a, const struct job_row *r)
{
    cJSON *o = cJSON_CreateObject();
    char buf[192];
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "kind", r->kind);
    cJSON_AddStringToObject(o, "owner", r->owner);
    cJSON_AddStringToObject(o, "state", job_state_name(r->state));
    api_job_meta(o, r);
    api_job_placement(o, r);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    http_json_str_or_null(o, "error", r->error);
    http_json_str_or_null(o, "created_at", r->created_at);
    http_json_str_or_null(o, "started_at", r->started_at);
    http_json_str_or_null(o, "ended_at", r->ended_at);
    cJSON *params = cJSON_Parse(r->spec);
    http_json_put(o, "params", params ? params : cJSON_CreateObject());
    /* the images exist once the job succeeded (cmd_sample writes them after the loop) */
    cJSON *imgs = cJSON_AddArrayToObject(o, "images");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(params, "n");
    if (r->state == JOB_SUCCEEDED && cJSON_IsNumber(n))
        for (int k = 0; k < n->valueint; k++) {
            api_link(a, buf, sizeof buf, "/samples/%s/images/%d.png", r->id, k);
            http_json_put_array(imgs, cJSON_CreateString(buf));
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
    if (api_job_load(c, id, r, res)) return -1;
    if (strcmp(r->kind, "sample") != 0) {
        char detail[160];
        snprintf(detail, sizeof detail, "no sample %s (%s is a %s job: GET /jobs/%s)", id, id,
                 r->kind, id);
        job_row_free(r);
        *res = http_send_problem(c, 404, NULL, detail, NULL, NULL);
        return -1;
    }
    return 0;
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
        http_errors_add(errs, k, msg);
        return -1;
    }
    *v = f->valuedouble;
    return 0;
}

/* POST /samples' request: its fields as checked (sample_fields), then the checkpoint and the
 * steps resolved against it (sample_checkpoint, sample_steps) */
struct sample_req {
    struct pool_sample s;
    const cJSON *ck, *jb;  /* the checkpoint or the job named (in the parsed body), or NULL */
    double n, steps, seed, batch;
    char name[API_NAME_MAX + 1], labels[API_LABELS_JSON_MAX];
};

/* The body as a JSON object under POST /train's document rules (spec_parse_object: duplicate
 * keys, strings, depth) and its cap on the errors listed (HTTP_ERRORS_MAX); NULL with the
 * answer queued in *res (400 malformed-json, or 422 with the document's errors). */
static cJSON *sample_body(struct ctx *c, enum MHD_Result *res)
{
    struct spec_errors es;
    cJSON *root = NULL;
    if (!spec_parse_object(c->r->body ? c->r->body : "", c->r->len, &root, &es)) return root;
    if (es.syntax) {
        *res = http_send_malformed(c, es.syntax_at);
        return NULL;
    }
    cJSON *errs = http_errors_new();
    for (int i = 0; errs && i < es.n; i++) http_errors_add(errs, es.e[i].path, es.e[i].msg);
    *res = http_send_errors(c, errs, "request");
    return NULL;
}

/* q's fields from root: unknown fields, exactly one of checkpoint and job, n, steps (-1: the
 * model's default, sample_steps), seed, batch, sampler, eta, ema, name and labels, each error
 * into errs */
static void sample_fields(const cJSON *root, struct sample_req *q, cJSON *errs)
{
    static const char *const known[] = {"checkpoint", "job", "n", "sampler", "steps", "eta",
                                        "seed", "ema", "batch", "name", "labels", NULL};
    struct pool_sample *s = &q->s;
    for (const cJSON *f = root->child; f && http_errors_count(errs) < HTTP_ERRORS_MAX;
         f = f->next) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= f->string && strcmp(f->string, known[i]) == 0;
        if (!ok) {
            char path[80];
            const char *k = f->string ? f->string : "";
            snprintf(path, sizeof path, "%.*s", (int)utf8_cut(k, 64), k);
            http_errors_add(errs, path, "unknown field");
        }
    }
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(root, "checkpoint");
    const cJSON *jb = cJSON_GetObjectItemCaseSensitive(root, "job");
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(root, "sampler");
    const cJSON *eta = cJSON_GetObjectItemCaseSensitive(root, "eta");
    const cJSON *ema = cJSON_GetObjectItemCaseSensitive(root, "ema");
    if (cJSON_IsNull(ck)) ck = NULL;
    if (cJSON_IsNull(jb)) jb = NULL;
    q->ck = ck;
    q->jb = jb;
    if (!ck == !jb)
        http_errors_add(errs, ck ? "job" : "checkpoint",
                "give exactly one of checkpoint (an id like j0123456789abcdef-300) or job (its "
                "newest checkpoint)");
    if (ck && !cJSON_IsString(ck)) http_errors_add(errs, "checkpoint", "expected a checkpoint id (a string)");
    if (jb && !cJSON_IsString(jb)) http_errors_add(errs, "job", "expected a job id (a string)");
    field_int(root, "n", 1, SAMPLE_N_MAX, 16, &q->n, errs);
    field_int(root, "steps", 1, 100000, -1, &q->steps, errs);
    field_int(root, "seed", 0, 9007199254740991.0, 1, &q->seed, errs);
    field_int(root, "batch", 1, SPEC_BATCH_MAX, 16, &q->batch, errs);
    snprintf(s->sampler, sizeof s->sampler, "ddim");
    if (sm && !cJSON_IsNull(sm)) {
        if (cJSON_IsString(sm) && (strcmp(sm->valuestring, "ddim") == 0 ||
                                   strcmp(sm->valuestring, "ddpm") == 0))
            snprintf(s->sampler, sizeof s->sampler, "%s", sm->valuestring);
        else
            http_errors_add(errs, "sampler", "expected \"ddim\" or \"ddpm\"");
    }
    s->eta = 0;
    if (eta && !cJSON_IsNull(eta)) {
        if (cJSON_IsNumber(eta) && eta->valuedouble >= 0 && eta->valuedouble <= 1)
            s->eta = eta->valuedouble;
        else
            http_errors_add(errs, "eta", "expected a number from 0 to 1");
    }
    s->ema = 1;
    if (ema && !cJSON_IsNull(ema)) {
        if (cJSON_IsBool(ema))
            s->ema = cJSON_IsTrue(ema);
        else
            http_errors_add(errs, "ema", "expected true (the EMA weights) or false (the raw weights)");
    }
    api_job_meta_parse(root, q->name, q->labels, errs);
    s->name = q->name;
    s->labels = q->labels[0] ? q->labels : NULL;
    s->n = (int)q->n;
    s->batch = (int)q->batch;
    s->seed = (uint64_t)q->seed;
}

/* The checkpoint q names, or its job's newest; visible to the caller, never a path: its path,
 * id, model and timesteps into q->s. 0, or -1 with the error in errs under the field given. */
static int sample_checkpoint(struct ctx *c, struct sample_req *q, cJSON *errs)
{
    struct pool_sample *s = &q->s;
    const cJSON *ck = q->ck, *jb = q->jb;
    char jid[JOBS_ID_LEN], path[FSIO_PATH_MAX];
    int64_t step = -1;
    const char *field = ck ? "checkpoint" : "job";
    struct job_row src;
    memset(&src, 0, sizeof src);
    if (ck) {
        if (pool_checkpoint_id_parse(ck->valuestring, jid, sizeof jid, &step)) {
            http_errors_add(errs, field, "expected a checkpoint id like j0123456789abcdef-300 (GET "
                                 "/jobs/{id}/checkpoints lists them)");
            return -1;
        }
    } else if (!pool_job_id_valid(jb->valuestring)) {
        http_errors_add(errs, field, "expected a job id like j0123456789abcdef");
        return -1;
    } else {
        snprintf(jid, sizeof jid, "%s", jb->valuestring);
    }
    int g = jobs_get(c->a->cfg.db, jid, &src);
    int visible = g == JOBS_OK && (c->admin || strcmp(src.owner, c->owner) == 0) &&
                  (strcmp(src.kind, "train") == 0 || strcmp(src.kind, "import") == 0);
    job_row_free(&src);
    if (!visible) {
        http_errors_add(errs, field, ck ? "no such checkpoint" : "no such training job");
        return -1;
    }
    if (!ck) {
        char out[FSIO_PATH_MAX];
        if (pool_job_file(c->a->cfg.pool, jid, "out", out, sizeof out) ||
            train_latest_checkpoint(out, path, sizeof path, &step)) {
            http_errors_add(errs, field, "the job has no checkpoint yet");
            return -1;
        }
    }
    struct stat sb;
    if (pool_checkpoint_path(c->a->cfg.pool, jid, step, path, sizeof path) || stat(path, &sb) ||
        !S_ISREG(sb.st_mode) || strlen(path) >= sizeof s->checkpoint_path) {
        http_errors_add(errs, field, "no such checkpoint");
        return -1;
    }
    snprintf(s->checkpoint_path, sizeof s->checkpoint_path, "%s", path);
    snprintf(s->checkpoint_id, sizeof s->checkpoint_id, "%s-%" PRId64, jid, step);
    struct safetensors *st = NULL;
    struct train_spec spec;
    char err[512];
    if (checkpoint_open(&st, path, &spec, NULL, err, sizeof err)) {
        http_errors_add(errs, field, "the checkpoint cannot be read");
        return -1;
    }
    safetensors_free(st);
    s->model = spec.model;
    s->timesteps = spec.timesteps;
    return 0;
}

/* q->s.steps: the steps asked, else the model's timesteps up to 50; ddim's at most the model's
 * timesteps. 0, or -1 with the error in errs. */
static int sample_steps(struct sample_req *q, cJSON *errs)
{
    struct pool_sample *s = &q->s;
    double steps = q->steps;
    if (steps < 0) steps = s->timesteps < 50 ? s->timesteps : 50;
    if (strcmp(s->sampler, "ddim") == 0 && steps > s->timesteps) {
        char msg[160];
        snprintf(msg, sizeof msg, "must be at most the model's diffusion.timesteps (%d) for ddim",
                 s->timesteps);
        http_errors_add(errs, "steps", msg);
        return -1;
    }
    s->steps = (int)steps;
    return 0;
}

/* s planned on the planning worker as POST /train's (submit.c: this handler runs again once
 * the plan is made, and goes on here), submitted, and answered 202 with the new job */
static enum MHD_Result sample_submit(struct ctx *c, struct pool_sample *s)
{
    struct pool_admission adm = {0};
    cJSON *entries[POOL_MAX_DEVICES];
    char id[JOBS_ID_LEN], err[1024];
    enum MHD_Result pres;
    if (api_plan_sample(c, s, &adm, entries, err, sizeof err, &pres)) return pres;
    int rc = pool_submit_sample_planned(c->a->cfg.pool, c->owner,
                                        c->idem_open ? c->idem_key : NULL, s, &adm, entries, id,
                                        err, sizeof err);
    if (rc) return api_submit_refused(c, rc, &adm, err, "checkpoint");
    cJSON_Delete(adm.plans);
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return http_send_problem(c, 500, NULL, "the new job cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/samples/%s", id);
    cJSON *o = api_sample_json(c->a, &r);
    job_row_free(&r);
    return api_accepted(c, o, loc);
}

/* POST /samples: {checkpoint | job, n, sampler, steps, eta, seed, ema, batch}; the checkpoint
 * (a job's newest when given a job) must be visible to the caller */
enum MHD_Result h_samples_post(struct ctx *c)
{
    if (!http_json_body(c))
        return http_send_problem(c, 415, NULL, "POST /samples takes a SampleRequest as application/json",
                       NULL, (const char *const[]){"Accept-Post", "application/json", NULL});
    if (!c->a->admitting)
        return http_send_stopping(c);
    enum MHD_Result res;
    if (api_idem_begin(c, "POST /samples", &res)) return res;
    cJSON *root = sample_body(c, &res);
    if (!root) return res;
    struct sample_req q;
    memset(&q, 0, sizeof q);
    cJSON *errs = http_errors_new();
    sample_fields(root, &q, errs);
    /* the checkpoint is looked for only when the fields are valid */
    int bad = !errs || http_errors_count(errs) > 0 || sample_checkpoint(c, &q, errs) ||
              sample_steps(&q, errs);
    cJSON_Delete(root);
    if (bad) return http_send_errors(c, errs, "request");
    cJSON_Delete(errs);
    return sample_submit(c, &q.s);
}
enum MHD_Result h_samples(struct ctx *c) { return api_jobs_list(c, "sample", "samples"); }

enum MHD_Result h_sample(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (load_sample(c, c->param, &r, &res)) return res;
    cJSON *o = api_sample_json(c->a, &r);
    job_row_free(&r);
    return http_send_json(c, 200, o, NULL, NULL);
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
        return http_send_problem(c, 409, "wrong-state", detail, o, NULL);
    }
    snprintf(detail, sizeof detail, "sample %s has no %s", c->param, what);
    int have = pool_job_file(c->a->cfg.pool, c->param, tail, path, sizeof path) == 0;
    return http_send_file(c, have ? path : NULL, "image/png", detail);
}

enum MHD_Result h_sample_grid(struct ctx *c) { return send_sample_file(c, "grid.png", "grid"); }

enum MHD_Result h_sample_image(struct ctx *c)
{
    long long k;
    char tail[64], what[64];
    /* k: a plain decimal index (no sign, no leading zeros), so it can never name another file */
    if (api_parse_image_index(c->param2, SAMPLE_N_MAX, &k)) {
        char detail[160];
        snprintf(detail, sizeof detail, "no image '%.*s' (images are numbered 0 to n-1)",
                 (int)utf8_cut(c->param2, 20), c->param2);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    snprintf(tail, sizeof tail, "images/%04lld.png", k);
    snprintf(what, sizeof what, "image %lld", k);
    return send_sample_file(c, tail, what);
}
