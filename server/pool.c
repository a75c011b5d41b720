/* pool.c - admission by planned bytes and the job children (see pool.h). One thread owns the
 * children: it forks them (PR_SET_PDEATHSIG follows the forking thread, so that thread lives as
 * long as any child), polls their pipes, stores their lines as events and reaps them. Submits and
 * cancels from the HTTP threads take the pool's lock and wake the thread through a pipe.
 */
#define _GNU_SOURCE /* pipe2, prctl, environ */
#include "pool.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cost.h"
#include "fsio.h"
#include "log.h"
#include "metrics.h"
#include "sample.h"
#include "train.h"
#include "upload.h"

extern char **environ;

#define POOL_MAX_CHILDREN 64
#define LINE_MAX_BYTES 4096
#define ERR_TAIL_BYTES 1536
#define STOP_GRACE_S 60.0 /* after SIGINT at shutdown, SIGKILL once this has passed */
#define FMNIST_TRAIN_IMAGES 60000 /* Fashion-MNIST's training split */
#define TRAIN_EXIT_STOPPED 130    /* `ddpmd train` after a SIGINT: checkpoint written */

struct child {
    char id[JOBS_ID_LEN];
    char kind[16];
    pid_t pid;
    int out_fd, err_fd;          /* -1 after EOF */
    char out[LINE_MAX_BYTES], errl[LINE_MAX_BYTES];
    size_t out_n, errl_n;
    char tail[ERR_TAIL_BYTES];   /* the last stderr lines, for the job's error */
    size_t tail_n;
    int64_t reserved;
    int threads;
    int cancel;
    int64_t last_ckpt;
    int64_t last_step;           /* the step its last report (or its resume point) named */
    int batch;                   /* a training job's images per step (the metrics) */
    /* its length for the backfill: steps done of steps, the measured seconds per step (0 until
     * two step lines came) and the predicted one from its plan */
    int64_t step, steps, step0;
    double t0, step_s, pred_step_s;
};

struct pool {
    struct jobs *db;
    struct pool_config cfg;
    char exe[1024], data_dir[1024], device[32];
    pthread_t thread;
    pthread_mutex_t mu;
    int wake[2];
    int stopping;
    double stop_at;
    struct child *kids[POOL_MAX_CHILDREN];
    int n_kids;
    int64_t reserved;
    int threads_used;
    void (*notify)(void *);
    void *notify_ctx;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void notify(struct pool *p)
{
    if (p->notify) p->notify(p->notify_ctx);
}

static void wake(struct pool *p)
{
    char c = 1;
    ssize_t r = write(p->wake[1], &c, 1); /* full pipe: a wake-up is already pending */
    (void)r;
}

int pool_job_id_valid(const char *s)
{
    if (s[0] != 'j') return 0;
    for (int i = 1; i <= 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[17] == 0;
}

int pool_checkpoint_id_parse(const char *cid, char *job_id, size_t len, int64_t *step)
{
    const char *dash = strchr(cid, '-');
    if (!dash || dash - cid != 17 || len < 18) return -1;
    memcpy(job_id, cid, 17);
    job_id[17] = 0;
    if (!pool_job_id_valid(job_id)) return -1;
    const char *d = dash + 1;
    size_t nd = strlen(d);
    if (nd < 1 || nd > 12 || (d[0] == '0' && nd > 1)) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < nd; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        v = v * 10 + (d[i] - '0');
    }
    *step = v;
    return 0;
}

static int job_dir(const struct pool *p, const char *id, const char *tail, char *buf, size_t n)
{
    char e[8];
    return fsio_path(buf, n, e, sizeof e, "%s/jobs/%s%s", p->data_dir, id, tail);
}

int pool_checkpoint_path(const struct pool *p, const char *job_id, int64_t step, char *path,
                         size_t len)
{
    char e[8];
    return fsio_path(path, len, e, sizeof e, "%s/jobs/%s/out/checkpoints/step-%08" PRId64
                     ".safetensors", p->data_dir, job_id, step);
}

const struct pool_config *pool_config_of(const struct pool *p) { return &p->cfg; }

/* e's predicted step time: the cost model's defaults for the plan, scaled to this machine's
 * one thread (the probe's measurement), over the job's threads */
static void predict_step(const struct pool *p, const struct plan *pl, const struct graph *g,
                         int batch, int threads, struct pool_estimate *e)
{
    struct cost_model m;
    cost_model_default(&m);
    e->step_seconds = cost_predict_step_seconds(&m, pl, g, batch) * p->cfg.cost_scale /
                      (threads > 0 ? threads : 1);
}

int pool_estimate(const struct pool *p, const struct train_spec *spec, struct pool_estimate *e,
                  char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    struct graph g;
    struct unet_io io;
    struct plan pl;
    int target, rc = POOL_ERR_PLAN;
    if (train_plan(spec, &g, &io, &target, &pl, err, errlen)) goto out;
    e->params = e->grads = e->ema = (int64_t)pl.params_bytes;
    e->adam = 2 * (int64_t)pl.params_bytes;
    e->inputs = (int64_t)pl.inputs_bytes;
    e->workspace = (int64_t)pl.ws_bytes;
    e->arena = (int64_t)pl.arena_bytes;
    e->arena_no_reuse = (int64_t)pl.no_reuse_arena_bytes;
    e->plan_total = (int64_t)pl.total_bytes;
    e->baseline = p->cfg.baseline_bytes;
    if (strcmp(p->device, "cpu") == 0) {
        /* the job's process holds the decoded images (float) and its batch buffers in the same
         * memory the cpu budget covers (train.c: the loader's 2 batches ahead, x0/eps/xt/target) */
        int64_t per = (int64_t)spec->model.in_channels * spec->model.image_size *
                      spec->model.image_size * (int64_t)sizeof(float);
        int64_t images = FMNIST_TRAIN_IMAGES;
        if (strcmp(spec->dataset, "fashion-mnist") != 0) { /* an uploaded folder's count */
            int64_t n = upload_folder_images(spec->dataset);
            if (n >= 0) images = n;
        }
        e->host_data = images * per + 6 * (int64_t)spec->batch * per;
    }
    e->reserved = e->plan_total + e->baseline + e->host_data;
    predict_step(p, &pl, &g, spec->batch, spec->threads, e);
    rc = POOL_OK;
out:
    plan_free(&pl);
    graph_free(&g);
    return rc;
}

char *pool_estimate_json(const struct pool_estimate *e)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "params_bytes", (double)e->params);
    cJSON_AddNumberToObject(o, "grads_bytes", (double)e->grads);
    cJSON_AddNumberToObject(o, "adam_bytes", (double)e->adam);
    cJSON_AddNumberToObject(o, "ema_bytes", (double)e->ema);
    cJSON_AddNumberToObject(o, "inputs_bytes", (double)e->inputs);
    cJSON_AddNumberToObject(o, "workspace_bytes", (double)e->workspace);
    cJSON_AddNumberToObject(o, "arena_bytes", (double)e->arena);
    cJSON_AddNumberToObject(o, "arena_without_reuse_bytes", (double)e->arena_no_reuse);
    cJSON_AddNumberToObject(o, "plan_bytes", (double)e->plan_total);
    cJSON_AddNumberToObject(o, "process_baseline_bytes", (double)e->baseline);
    cJSON_AddNumberToObject(o, "host_data_bytes", (double)e->host_data);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)e->reserved);
    cJSON_AddNumberToObject(o, "predicted_step_seconds", e->step_seconds);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int make_id(char *id)
{
    unsigned char r[8];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
    id[0] = 'j';
    for (int i = 0; i < 8; i++) sprintf(id + 1 + 2 * i, "%02x", r[i]);
    return 0;
}

static int mkdir_one(const char *path, char *err, size_t errlen)
{
    if (mkdir(path, 0755) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* stores a planned job (lock taken here): its folder and child file first, then the row; r has
 * kind, steps, spec, plan and reserved_bytes set. On POOL_OK id gets the new id. */
static int queue_job(struct pool *p, const char *owner, struct job_row *r, const char *child_file,
                     const char *child_json, char *id, char *err, size_t errlen)
{
    char dir[FSIO_PATH_MAX], path[FSIO_PATH_MAX];
    pthread_mutex_lock(&p->mu);
    int queued = 0, rc = POOL_ERR_INTERNAL;
    if (p->stopping) {
        rc = POOL_ERR_STOPPING;
        snprintf(err, errlen, "the server is shutting down");
        goto out;
    }
    if (jobs_count(p->db, JOB_QUEUED, &queued)) {
        snprintf(err, errlen, "the job store cannot be read");
        goto out;
    }
    if (queued >= p->cfg.max_queue) {
        rc = POOL_ERR_QUEUE_FULL;
        snprintf(err, errlen, "%d jobs are queued (the limit, --max-queue)", queued);
        goto out;
    }
    int mine = 0;
    if (p->cfg.max_per_owner > 0) {
        if (jobs_count_owner(p->db, owner, &mine)) {
            snprintf(err, errlen, "the job store cannot be read");
            goto out;
        }
        if (mine >= p->cfg.max_per_owner) {
            rc = POOL_ERR_OWNER_LIMIT;
            snprintf(err, errlen, "%s has %d jobs queued or running (the limit, "
                     "--max-jobs-per-owner)", owner, mine);
            goto out;
        }
    }
    if (make_id(r->id)) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        goto out;
    }
    snprintf(r->owner, sizeof r->owner, "%s", owner);
    snprintf(r->device, sizeof r->device, "%s", p->device);
    /* the job's folder and its child file exist before the row, so a stored job always has them */
    if (job_dir(p, r->id, "", dir, sizeof dir) || job_dir(p, r->id, child_file, path, sizeof path)) {
        snprintf(err, errlen, "the data directory's path is too long");
        goto out;
    }
    if (mkdir_one(dir, err, errlen) || fsio_write_atomic_text(path, child_json, err, errlen)) {
        int e = errno == EDQUOT ? EDQUOT : ENOSPC;
        if (errno == ENOSPC || errno == EDQUOT || strstr(err, strerror(ENOSPC))) {
            rc = POOL_ERR_STORAGE; /* the cause, without the server's paths (clients see ids) */
            snprintf(err, errlen, "the job's files cannot be written: %s", strerror(e));
        }
        unlink(path); /* nothing of a refused job stays (the writer leaves no temporary) */
        rmdir(dir);
        goto out;
    }
    int jrc = jobs_insert(p->db, r);
    if (jrc) {
        snprintf(err, errlen, "the job store cannot be written: %s", jobs_errmsg());
        if (jrc == JOBS_ERR_FULL) rc = POOL_ERR_STORAGE;
        unlink(path);
        rmdir(dir);
        goto out;
    }
    snprintf(id, JOBS_ID_LEN, "%s", r->id);
    rc = POOL_OK;
out:
    pthread_mutex_unlock(&p->mu);
    if (rc == POOL_OK) {
        notify(p);
        wake(p);
    }
    return rc;
}

static int never_fits(const struct pool *p, const struct pool_estimate *e, char *err, size_t errlen)
{
    if (e->reserved <= p->cfg.budget_bytes) return 0;
    snprintf(err, errlen, "the job needs %" PRId64 " bytes on %s (plan %" PRId64
             " + process %" PRId64 " + host data %" PRId64 "); the budget is %" PRId64,
             e->reserved, p->device, e->plan_total, e->baseline, e->host_data,
             p->cfg.budget_bytes);
    return 1;
}

int pool_submit(struct pool *p, const char *owner, const struct train_spec *shown,
                const struct train_spec *child, struct pool_estimate *e, char *id, char *err,
                size_t errlen)
{
    struct job_row r;
    memset(&r, 0, sizeof r);
    char *child_json = NULL;
    int rc = pool_estimate(p, child, e, err, errlen);
    if (rc) return rc;
    if (never_fits(p, e, err, errlen)) return POOL_ERR_NEVER_FITS;
    snprintf(r.kind, sizeof r.kind, "train");
    r.reserved_bytes = e->reserved;
    r.steps = shown->steps;
    r.spec = spec_to_json(shown);
    r.plan = pool_estimate_json(e);
    child_json = spec_to_json(child);
    if (!r.spec || !r.plan || !child_json) {
        snprintf(err, errlen, "out of memory");
        rc = POOL_ERR_INTERNAL;
    } else {
        rc = queue_job(p, owner, &r, "/spec.json", child_json, id, err, errlen);
    }
    free(child_json);
    job_row_free(&r);
    return rc;
}

int pool_job_file(const struct pool *p, const char *job_id, const char *tail, char *path,
                  size_t len)
{
    char e[8];
    return fsio_path(path, len, e, sizeof e, "%s/jobs/%s/%s", p->data_dir, job_id, tail);
}

int pool_estimate_sample(const struct pool *p, const struct pool_sample *s,
                         struct pool_estimate *e, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    struct graph g;
    struct unet_io io;
    struct plan pl;
    int batch = s->batch < s->n ? s->batch : s->n, rc = POOL_ERR_PLAN;
    if (sample_plan(&s->model, batch, NULL, &g, &io, &pl, err, errlen)) goto out;
    e->params = (int64_t)pl.params_bytes;
    e->inputs = (int64_t)pl.inputs_bytes;
    e->workspace = (int64_t)pl.ws_bytes;
    e->arena = (int64_t)pl.arena_bytes;
    e->arena_no_reuse = (int64_t)pl.no_reuse_arena_bytes;
    e->plan_total = (int64_t)pl.total_bytes;
    e->baseline = p->cfg.baseline_bytes;
    if (strcmp(p->device, "cpu") == 0) {
        /* cmd_sample's host buffers: every image as float, the grid and one image as bytes, and
         * sample_job_run's x, eps, noise, x_prev at the batch */
        int64_t per = (int64_t)s->model.out_channels * s->model.image_size * s->model.image_size;
        int cols = 1;
        while ((int64_t)cols * cols < s->n) cols++;
        int64_t rows = (s->n + cols - 1) / cols, side = s->model.image_size + 2;
        e->host_data = (int64_t)s->n * per * (int64_t)sizeof(float) +
                       rows * cols * side * side * s->model.out_channels + per +
                       4 * (int64_t)batch * per * (int64_t)sizeof(float);
    }
    e->reserved = e->plan_total + e->baseline + e->host_data;
    predict_step(p, &pl, &g, batch, 1, e);
    rc = POOL_OK;
out:
    plan_free(&pl);
    graph_free(&g);
    return rc;
}

static cJSON *sample_obj(const struct pool_sample *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = cJSON_AddStringToObject(o, "checkpoint", s->checkpoint_id) &&
             cJSON_AddNumberToObject(o, "n", s->n) &&
             cJSON_AddStringToObject(o, "sampler", s->sampler) &&
             cJSON_AddNumberToObject(o, "steps", s->steps) &&
             cJSON_AddNumberToObject(o, "eta", s->eta) &&
             cJSON_AddNumberToObject(o, "seed", (double)s->seed) &&
             cJSON_AddBoolToObject(o, "ema", s->ema) &&
             cJSON_AddNumberToObject(o, "batch", s->batch);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

char *pool_sample_json(const struct pool_sample *s)
{
    cJSON *o = sample_obj(s);
    char *r = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return r;
}

int pool_submit_sample(struct pool *p, const char *owner, const struct pool_sample *s,
                       struct pool_estimate *e, char *id, char *err, size_t errlen)
{
    struct job_row r;
    memset(&r, 0, sizeof r);
    char *child_json = NULL;
    int rc = pool_estimate_sample(p, s, e, err, errlen);
    if (rc) return rc;
    if (never_fits(p, e, err, errlen)) return POOL_ERR_NEVER_FITS;
    snprintf(r.kind, sizeof r.kind, "sample");
    r.reserved_bytes = e->reserved;
    int chunks = (s->n + s->batch - 1) / s->batch;
    r.steps = (int64_t)chunks * (strcmp(s->sampler, "ddpm") == 0 ? s->timesteps : s->steps);
    r.spec = pool_sample_json(s);
    r.plan = pool_estimate_json(e);
    cJSON *c = sample_obj(s);
    if (c && !cJSON_AddStringToObject(c, "checkpoint_path", s->checkpoint_path)) {
        cJSON_Delete(c);
        c = NULL;
    }
    child_json = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (!r.spec || !r.plan || !child_json) {
        snprintf(err, errlen, "out of memory");
        rc = POOL_ERR_INTERNAL;
    } else {
        rc = queue_job(p, owner, &r, "/sample.json", child_json, id, err, errlen);
    }
    free(child_json);
    job_row_free(&r);
    return rc;
}

static struct child *find_kid(struct pool *p, const char *id)
{
    for (int i = 0; i < p->n_kids; i++)
        if (strcmp(p->kids[i]->id, id) == 0) return p->kids[i];
    return NULL;
}

int pool_cancel(struct pool *p, const char *id, enum job_state *now)
{
    pthread_mutex_lock(&p->mu);
    int rc = POOL_ERR_INTERNAL;
    struct child *k = find_kid(p, id);
    struct job_row r;
    memset(&r, 0, sizeof r);
    if (k) {
        if (!k->cancel) {
            k->cancel = 1;
            jobs_set_cancel_requested(p->db, id);
            kill(k->pid, SIGINT); /* the child checkpoints at the next step and exits */
        }
        *now = JOB_RUNNING;
        rc = POOL_OK;
        goto out;
    }
    int g = jobs_get(p->db, id, &r);
    if (g == JOBS_ERR_NOT_FOUND) {
        rc = POOL_ERR_NOT_FOUND;
    } else if (g == JOBS_OK && r.state == JOB_QUEUED) {
        if (jobs_set_state(p->db, id, JOB_CANCELED, 0, NULL,
                           "{\"state\":\"canceled\",\"reason\":\"canceled while queued\"}") == 0) {
            *now = JOB_CANCELED;
            rc = POOL_OK;
        }
    } else if (g == JOBS_OK && r.state == JOB_RUNNING) {
        /* no child: the server is stopping and the job waits in the store to be resumed; the
         * next start ends it canceled instead */
        if (jobs_set_cancel_requested(p->db, id) == 0) {
            *now = JOB_RUNNING;
            rc = POOL_OK;
        }
    } else if (g == JOBS_OK) {
        *now = r.state;
        rc = POOL_ERR_STATE;
    }
out:
    pthread_mutex_unlock(&p->mu);
    job_row_free(&r);
    if (rc == POOL_OK) {
        notify(p);
        wake(p);
    }
    return rc;
}

void pool_usage(struct pool *p, int64_t *reserved, int *running, int *threads_used)
{
    pthread_mutex_lock(&p->mu);
    *reserved = p->reserved;
    *running = p->n_kids;
    *threads_used = p->threads_used;
    pthread_mutex_unlock(&p->mu);
}

void pool_set_notify(struct pool *p, void (*fn)(void *), void *ctx)
{
    pthread_mutex_lock(&p->mu);
    p->notify = fn;
    p->notify_ctx = ctx;
    pthread_mutex_unlock(&p->mu);
}

/* ---- children ---- */

/* the child's spec.json with the thread count fixed for this start */
static int write_child_spec(struct pool *p, const char *id, int threads, char *path, size_t len,
                            char *err, size_t errlen)
{
    struct train_spec s;
    struct spec_errors es;
    if (job_dir(p, id, "/spec.json", path, len)) {
        snprintf(err, errlen, "path too long");
        return -1;
    }
    if (spec_load_file(path, &s, &es)) {
        snprintf(err, errlen, "%.200s: %.100s%s%.200s", path, es.n ? es.e[0].path : "", es.n ? ": " : "",
                 es.n ? es.e[0].msg : "unreadable");
        return -1;
    }
    s.threads = threads;
    char *json = spec_to_json(&s);
    int rc = json ? fsio_write_atomic_text(path, json, err, errlen) : -1;
    if (!json) snprintf(err, errlen, "out of memory");
    free(json);
    return rc;
}

/* builds an environment with OMP_NUM_THREADS=threads (before fork: nothing is allocated in
 * the child) */
static char **child_env(int threads, char *omp, size_t omplen)
{
    int n = 0;
    while (environ[n]) n++;
    char **env = malloc((size_t)(n + 2) * sizeof *env);
    if (!env) return NULL;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strncmp(environ[i], "OMP_NUM_THREADS=", 16) != 0) env[k++] = environ[i];
    snprintf(omp, omplen, "OMP_NUM_THREADS=%d", threads);
    env[k++] = omp;
    env[k] = NULL;
    return env;
}

/* a sampling job's command line: `ddpmd sample CKPT ... --out grid.png --each images
 * --progress-json` from its sample.json (every field checked when it was submitted) */
struct sample_args {
    char ckpt[FSIO_PATH_MAX], grid[FSIO_PATH_MAX], each[FSIO_PATH_MAX], file[FSIO_PATH_MAX];
    char n[16], steps[16], batch[16], threads[16], seed[32], eta[40], sampler[8];
    char *argv[32];
};

static int sample_args_make(struct pool *p, const char *id, int threads, struct sample_args *a,
                            char *err, size_t errlen)
{
    char *text = NULL;
    cJSON *o = NULL;
    int rc = -1;
    if (job_dir(p, id, "/sample.json", a->file, sizeof a->file) ||
        job_dir(p, id, "/grid.png", a->grid, sizeof a->grid) ||
        job_dir(p, id, "/images", a->each, sizeof a->each)) {
        snprintf(err, errlen, "path too long");
        goto out;
    }
    FILE *f = fsio_fopen_read(a->file, err, errlen);
    if (!f) goto out;
    text = calloc(1, 65536);
    size_t len = text ? fread(text, 1, 65535, f) : 0;
    fclose(f);
    if (!text || len == 0) {
        snprintf(err, errlen, "the job's sample.json cannot be read");
        goto out;
    }
    o = cJSON_Parse(text);
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(o, "checkpoint_path");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "n");
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(o, "sampler");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "steps");
    const cJSON *eta = cJSON_GetObjectItemCaseSensitive(o, "eta");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(o, "seed");
    const cJSON *ema = cJSON_GetObjectItemCaseSensitive(o, "ema");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "batch");
    if (!cJSON_IsString(ck) || !cJSON_IsNumber(n) || !cJSON_IsString(sm) ||
        strlen(sm->valuestring) >= sizeof a->sampler || !cJSON_IsNumber(st) ||
        !cJSON_IsNumber(eta) || !cJSON_IsNumber(seed) || !cJSON_IsBool(ema) ||
        !cJSON_IsNumber(b) || strlen(ck->valuestring) >= sizeof a->ckpt) {
        snprintf(err, errlen, "the job's sample.json is damaged");
        goto out;
    }
    snprintf(a->ckpt, sizeof a->ckpt, "%s", ck->valuestring);
    snprintf(a->sampler, sizeof a->sampler, "%s", sm->valuestring);
    snprintf(a->n, sizeof a->n, "%d", n->valueint);
    snprintf(a->steps, sizeof a->steps, "%d", st->valueint);
    snprintf(a->batch, sizeof a->batch, "%d", b->valueint);
    snprintf(a->threads, sizeof a->threads, "%d", threads);
    snprintf(a->seed, sizeof a->seed, "%" PRIu64, (uint64_t)seed->valuedouble);
    snprintf(a->eta, sizeof a->eta, "%.17g", eta->valuedouble);
    char **v = a->argv;
    int i = 0;
    v[i++] = p->exe, v[i++] = "sample", v[i++] = a->ckpt;
    v[i++] = "--n", v[i++] = a->n, v[i++] = "--sampler", v[i++] = a->sampler;
    v[i++] = "--steps", v[i++] = a->steps, v[i++] = "--eta", v[i++] = a->eta;
    v[i++] = "--seed", v[i++] = a->seed, v[i++] = "--batch", v[i++] = a->batch;
    v[i++] = "--threads", v[i++] = a->threads, v[i++] = "--out", v[i++] = a->grid;
    v[i++] = "--each", v[i++] = a->each, v[i++] = "--progress-json";
    if (cJSON_IsFalse(ema)) v[i++] = "--raw";
    v[i] = NULL;
    rc = 0;
out:
    cJSON_Delete(o);
    free(text);
    return rc;
}

/* a job's predicted seconds per step at this thread count: its plan's (stored at submit, for
 * the threads its spec asked for); INFINITY when unknown (a job stored before plans had it):
 * then it is never taken for short */
static double row_step_seconds(const struct pool *p, const struct job_row *r, int threads)
{
    cJSON *o = r->plan ? cJSON_Parse(r->plan) : NULL;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "predicted_step_seconds");
    struct train_spec s;
    struct spec_errors es;
    int want = strcmp(r->kind, "train") == 0 && spec_parse(r->spec, &s, &es) == 0 ? s.threads : 1;
    double sec = cJSON_IsNumber(f) && f->valuedouble > 0
                     ? f->valuedouble * want / (threads > 0 ? threads : 1)
                     : INFINITY;
    cJSON_Delete(o);
    (void)p;
    return sec;
}

/* seconds until the running job k ends: steps left x its measured step time (predicted until
 * it has one) */
static double kid_remaining(const struct child *k)
{
    double per = k->step_s > 0 ? k->step_s : k->pred_step_s;
    int64_t left = k->steps > k->step ? k->steps - k->step : 0;
    return left == 0 ? 0 : (double)left * per;
}

/* starts the queued job r (lock held); on failure the job is failed with the reason */
static int start_child(struct pool *p, const struct job_row *r, int threads)
{
    char spec[FSIO_PATH_MAX], out[FSIO_PATH_MAX], err[600], ckpt[FSIO_PATH_MAX], omp[32];
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    char **env = NULL;
    struct child *k = NULL;
    struct sample_args *sa = NULL;
    int64_t from = -1;
    int resume = r->starts > 0, is_sample = strcmp(r->kind, "sample") == 0;
    char *targv[] = {p->exe, "train", spec, "--out", out, resume ? "--resume-or-start" : NULL, NULL};
    char **argv = targv;
    if (is_sample) {
        /* a sampling job has no checkpoints of its own: a restart samples again from the start
         * (the same seed gives the same images) */
        sa = calloc(1, sizeof *sa);
        if (!sa) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        if (sample_args_make(p, r->id, threads, sa, err, sizeof err)) goto fail;
        argv = sa->argv;
        resume = 0;
    } else {
        if (write_child_spec(p, r->id, threads, spec, sizeof spec, err, sizeof err)) goto fail;
        if (job_dir(p, r->id, "/out", out, sizeof out)) {
            snprintf(err, sizeof err, "path too long");
            goto fail;
        }
        /* a job started before resumes from its newest usable checkpoint, or starts over when
         * it never wrote one (`ddpmd train --resume-or-start`) */
        if (train_latest_checkpoint(out, ckpt, sizeof ckpt, &from)) from = -1;
    }
    k = calloc(1, sizeof *k);
    env = child_env(threads, omp, sizeof omp);
    if (!k || !env) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        snprintf(err, sizeof err, "pipe: %s", strerror(errno));
        goto fail;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, sizeof err, "fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        /* only async-signal-safe calls from here to execve */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the server died before the prctl */
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        syscall(SYS_close_range, 3u, ~0u, 0u);
        execve(p->exe, argv, env);
        static const char msg[] = "ddpmd serve: cannot exec the job's ddpmd binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    free(env);
    free(sa);
    snprintf(k->kind, sizeof k->kind, "%s", r->kind);
    snprintf(k->id, sizeof k->id, "%s", r->id);
    k->pid = pid;
    k->out_fd = po[0];
    k->err_fd = pe[0];
    k->reserved = r->reserved_bytes;
    k->threads = threads;
    k->last_ckpt = from > 0 ? from : 0;
    k->last_step = k->last_ckpt; /* the child resumes from that checkpoint */
    if (!is_sample) {
        struct train_spec ts;
        struct spec_errors es;
        k->batch = spec_parse(r->spec, &ts, &es) == 0 ? ts.batch : 0;
    }
    k->cancel = r->cancel_requested;
    k->step = is_sample ? 0 : k->last_ckpt;
    k->steps = r->steps;
    k->pred_step_s = row_step_seconds(p, r, threads);
    p->kids[p->n_kids++] = k;
    p->reserved += k->reserved;
    p->threads_used += threads;
    char ev[256];
    if (resume && from > 0)
        snprintf(ev, sizeof ev, "{\"state\":\"running\",\"threads\":%d,\"device\":\"%s\","
                 "\"reserved_bytes\":%" PRId64 ",\"resumed_from_step\":%" PRId64 "}",
                 threads, p->device, r->reserved_bytes, from);
    else
        snprintf(ev, sizeof ev, "{\"state\":\"running\",\"threads\":%d,\"device\":\"%s\","
                 "\"reserved_bytes\":%" PRId64 "}", threads, p->device, r->reserved_bytes);
    jobs_set_state(p->db, r->id, JOB_RUNNING, threads, NULL, ev);
    log_job(LOG_INFO, r->id, "running (%s job, %d threads, %" PRId64 " bytes reserved%s)", r->kind,
            threads, r->reserved_bytes, resume && from > 0 ? ", resumed" : "");
    return 0;
fail:
    if (po[0] >= 0) close(po[0]), close(po[1]);
    if (pe[0] >= 0) close(pe[0]), close(pe[1]);
    free(env);
    free(k);
    free(sa);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", "failed");
    cJSON_AddStringToObject(o, "error", err);
    char *fev = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    metrics_job_failed(METRICS_FAIL_START); /* counted before a client can see the state */
    jobs_set_state(p->db, r->id, JOB_FAILED, 0, err, fev ? fev : "{\"state\":\"failed\"}");
    free(fev);
    log_job(LOG_ERROR, r->id, "failed to start: %s", err);
    return -1;
}

#define SCHEDULE_WINDOW 64 /* queued jobs looked at for a backfill, from the head on */

/* how many threads a queued job gets if it starts now */
static int job_threads(const struct pool *p, const struct job_row *r)
{
    if (r->threads > 0) return r->threads; /* a resumed job keeps its first count */
    struct train_spec s;
    struct spec_errors es;
    int want = strcmp(r->kind, "train") == 0 && spec_parse(r->spec, &s, &es) == 0 ? s.threads : 1;
    int free_cores = p->cfg.cores - p->threads_used;
    int threads = want < free_cores ? want : free_cores;
    return threads < 1 ? 1 : threads; /* more jobs than cores: they share */
}

static int by_end(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* When the head can start (lock held). The running jobs end, by their predicted lengths, in
 * order; the head's start (*shadow, seconds from now) is when enough of their bytes come back,
 * and *extra is what is free then beyond the head's reservation. INFINITY when a length is
 * unknown before enough is free. */
static void head_start(const struct pool *p, int64_t need, double *shadow, int64_t *extra)
{
    double ends[POOL_MAX_CHILDREN][2];
    for (int i = 0; i < p->n_kids; i++) {
        ends[i][0] = kid_remaining(p->kids[i]);
        ends[i][1] = (double)p->kids[i]->reserved;
    }
    qsort(ends, (size_t)p->n_kids, sizeof ends[0], by_end);
    int64_t free_b = p->cfg.budget_bytes - p->reserved;
    *shadow = INFINITY;
    *extra = 0;
    for (int i = 0; i < p->n_kids && isfinite(ends[i][0]); i++) {
        free_b += (int64_t)ends[i][1];
        if (free_b >= need) {
            *shadow = ends[i][0];
            *extra = free_b - need;
            return;
        }
    }
}

/* FIFO with backfill (lock held): the head of the queue starts when its reservation fits. While
 * it cannot, a later job that fits now starts ahead of it only if that cannot delay the head's
 * start: it ends (its steps x its predicted step time) before the running jobs free the head's
 * bytes, or it takes only bytes the head will not need then (EASY backfilling). */
static void schedule(struct pool *p)
{
    while (!p->stopping && p->n_kids < POOL_MAX_CHILDREN) {
        struct job_row *rows = NULL;
        int n = 0;
        if (jobs_list(p->db, NULL, JOB_QUEUED, NULL, SCHEDULE_WINDOW, &rows, &n) || n == 0) {
            job_rows_free(rows, n);
            return;
        }
        int64_t free_b = p->cfg.budget_bytes - p->reserved;
        int pick = -1;
        if (rows[0].reserved_bytes <= free_b) {
            pick = 0;
        } else {
            double shadow;
            int64_t extra;
            head_start(p, rows[0].reserved_bytes, &shadow, &extra);
            for (int i = 1; i < n && pick < 0; i++) {
                const struct job_row *c = &rows[i];
                if (c->reserved_bytes > free_b) continue;
                /* all its steps, also for a resumed job (it redoes those after its last
                 * checkpoint): a longer guess only makes a backfill rarer */
                double len = (double)c->steps * row_step_seconds(p, c, job_threads(p, c));
                if ((isfinite(shadow) && len <= shadow) || c->reserved_bytes <= extra) pick = i;
            }
        }
        if (pick >= 0) {
            start_child(p, &rows[pick], job_threads(p, &rows[pick]));
            notify(p);
        }
        job_rows_free(rows, n);
        if (pick < 0) return;
    }
}

static void tail_add(struct child *k, const char *line)
{
    size_t n = strlen(line) + 1;
    if (n > sizeof k->tail - 1) {
        line += n - (sizeof k->tail - 1);
        n = sizeof k->tail - 1;
    }
    if (k->tail_n + n > sizeof k->tail - 1) {
        size_t drop = k->tail_n + n - (sizeof k->tail - 1);
        char *nl = memchr(k->tail + drop, '\n', k->tail_n - drop);
        drop = nl ? (size_t)(nl - k->tail) + 1 : k->tail_n;
        memmove(k->tail, k->tail + drop, k->tail_n - drop);
        k->tail_n -= drop;
    }
    memcpy(k->tail + k->tail_n, line, n - 1);
    k->tail_n += n - 1;
    k->tail[k->tail_n++] = '\n';
    k->tail[k->tail_n] = 0;
}

static void event_line(struct pool *p, const char *id, const char *type, const char *stream,
                       const char *line)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    if (stream) cJSON_AddStringToObject(o, "stream", stream);
    cJSON_AddStringToObject(o, "line", line);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) jobs_event_append(p->db, id, type, s, NULL);
    free(s);
}

/* a line of the job's output without the server's paths: clients name files by ids, so
 * "<data>/jobs/<id>/out/checkpoints" reads "out/checkpoints" and any other "<data>" "DATA" */
static void redact(const struct pool *p, const char *id, const char *in, char *out, size_t n)
{
    char job[FSIO_PATH_MAX];
    snprintf(job, sizeof job, "%s/jobs/%s/", p->data_dir, id);
    size_t lj = strlen(job), ld = strlen(p->data_dir), o = 0;
    while (*in && o + 1 < n) {
        if (strncmp(in, job, lj) == 0) {
            in += lj;
        } else if (ld && strncmp(in, p->data_dir, ld) == 0) {
            for (const char *r = "DATA"; *r && o + 1 < n; r++) out[o++] = *r;
            in += ld;
        } else {
            out[o++] = *in++;
        }
    }
    out[o] = 0;
}

static void check_checkpoint(struct pool *p, struct child *k)
{
    char out[FSIO_PATH_MAX], path[FSIO_PATH_MAX];
    int64_t step;
    if (job_dir(p, k->id, "/out", out, sizeof out) ||
        train_latest_checkpoint(out, path, sizeof path, &step) || step <= k->last_ckpt)
        return;
    k->last_ckpt = step;
    char ev[128];
    snprintf(ev, sizeof ev, "{\"id\":\"%s-%" PRId64 "\",\"step\":%" PRId64 "}", k->id, step, step);
    jobs_event_append(p->db, k->id, "checkpoint", ev, NULL);
}

/* a progress line at step: the measured seconds per step, over the steps since its first line */
static void kid_progress(struct child *k, int64_t step)
{
    double t = now_s();
    if (k->t0 == 0 || step < k->step0) {
        k->t0 = t;
        k->step0 = step;
    } else if (step > k->step0) {
        k->step_s = (t - k->t0) / (double)(step - k->step0);
    }
    k->step = step;
}

/* a JSON line of `ddpmd train` (train.h: {"event": "step" | "validation" | "sampling" |
 * "checkpoint" | "samples" | "stopped" | "done", "step": N, ...}) -> an event of the job:
 * step/validation/sampling are "progress" (a step also updates the job's row), a checkpoint is
 * "checkpoint" with the id GET /checkpoints/{id} takes, samples "sample", others by their name */
static void stdout_line(struct pool *p, struct child *k, const char *line)
{
    cJSON *o = cJSON_Parse(line);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (!cJSON_IsObject(o) || !cJSON_IsString(ev) || strlen(ev->valuestring) > 20 ||
        strspn(ev->valuestring, "abcdefghijklmnopqrstuvwxyz_") != strlen(ev->valuestring)) {
        event_line(p, k->id, "log", "stdout", line);
        cJSON_Delete(o);
        return;
    }
    const char *name = ev->valuestring, *type = name;
    if (strcmp(name, "step") == 0) {
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(o, "steps");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const cJSON *ips = cJSON_GetObjectItemCaseSensitive(o, "img_per_s");
        const cJSON *sts = cJSON_GetObjectItemCaseSensitive(o, "step_s");
        if (cJSON_IsNumber(step)) kid_progress(k, (int64_t)step->valuedouble);
        if (cJSON_IsNumber(step))
            jobs_set_progress(p->db, k->id, (int64_t)step->valuedouble,
                              cJSON_IsNumber(steps) ? (int64_t)steps->valuedouble : 0,
                              cJSON_IsNumber(loss) ? loss->valuedouble : NAN,
                              cJSON_IsNumber(ips) ? ips->valuedouble : NAN);
        /* the steps since its last report, each taking step_s (the mean the child measured) */
        if (cJSON_IsNumber(step) && step->valuedouble > (double)k->last_step &&
            step->valuedouble <= 9e15) {
            int64_t now = (int64_t)step->valuedouble, d = now - k->last_step;
            metrics_train_steps(d, d * k->batch, cJSON_IsNumber(sts) ? sts->valuedouble : -1);
            k->last_step = now;
        }
        type = "progress";
    } else if (strcmp(name, "validation") == 0 || strcmp(name, "sampling") == 0) {
        const cJSON *done = cJSON_GetObjectItemCaseSensitive(o, "done");
        const cJSON *total = cJSON_GetObjectItemCaseSensitive(o, "total");
        /* a sampling job's progress is its denoising steps (`ddpmd sample --progress-json`) */
        if (strcmp(k->kind, "sample") == 0 && cJSON_IsNumber(done) && cJSON_IsNumber(total))
            kid_progress(k, (int64_t)done->valuedouble);
        if (strcmp(k->kind, "sample") == 0 && cJSON_IsNumber(done) && cJSON_IsNumber(total))
            jobs_set_progress(p->db, k->id, (int64_t)done->valuedouble,
                              (int64_t)total->valuedouble, NAN, NAN);
        type = "progress";
    } else if (strcmp(name, "samples") == 0) {
        type = "sample";
    } else if (strcmp(name, "checkpoint") == 0 && cJSON_IsNumber(step)) {
        char id[64];
        int64_t st = (int64_t)step->valuedouble;
        snprintf(id, sizeof id, "%s-%" PRId64, k->id, st);
        cJSON_AddStringToObject(o, "id", id);
        if (st > k->last_ckpt) k->last_ckpt = st;
    }
    char *compact = cJSON_PrintUnformatted(o);
    jobs_event_append(p->db, k->id, type, compact ? compact : "{}", NULL);
    free(compact);
    cJSON_Delete(o);
}

/* reads what is there; returns 1 at EOF */
static int drain(struct pool *p, struct child *k, int is_err)
{
    int fd = is_err ? k->err_fd : k->out_fd;
    char *buf = is_err ? k->errl : k->out;
    size_t *n = is_err ? &k->errl_n : &k->out_n;
    char chunk[4096];
    ssize_t r = read(fd, chunk, sizeof chunk);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
    int eof = r <= 0;
    for (ssize_t i = 0; i < (eof ? 1 : r); i++) {
        int end = eof || chunk[i] == '\n';
        if (!end && *n < LINE_MAX_BYTES - 1) buf[(*n)++] = chunk[i];
        if (end && *n > 0) {
            buf[*n] = 0;
            char line[LINE_MAX_BYTES];
            redact(p, k->id, buf, line, sizeof line);
            if (is_err) {
                tail_add(k, line);
                event_line(p, k->id, "log", "stderr", line);
            } else {
                stdout_line(p, k, line);
            }
            *n = 0;
        }
    }
    if (eof) {
        close(fd);
        if (is_err)
            k->err_fd = -1;
        else
            k->out_fd = -1;
    }
    return eof;
}

/* the child is gone: its job's final state, its reservation released (lock held) */
static void finish(struct pool *p, struct child *k, int status)
{
    check_checkpoint(p, k);
    char err[ERR_TAIL_BYTES + 128], ev[ERR_TAIL_BYTES + 512];
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    /* a SIGINT that came before the child set up its handler (while it loads) kills it: it had
     * no step to save, which is a stop all the same */
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGINT && (k->cancel || p->stopping))
        code = TRAIN_EXIT_STOPPED;
    if (code == 0) {
        jobs_set_state(p->db, k->id, JOB_SUCCEEDED, 0, NULL, "{\"state\":\"succeeded\"}");
        log_job(LOG_INFO, k->id, "succeeded");
    } else if (code == TRAIN_EXIT_STOPPED && k->cancel) {
        jobs_set_state(p->db, k->id, JOB_CANCELED, 0, NULL,
                       "{\"state\":\"canceled\",\"reason\":\"canceled while running; stopped "
                       "with a checkpoint\"}");
        log_job(LOG_INFO, k->id, "canceled (stopped with a checkpoint)");
    } else if (code == TRAIN_EXIT_STOPPED && p->stopping) {
        /* stays running in the store: the next start of the server resumes it */
        event_line(p, k->id, "log", NULL, "the server is stopping: the job stopped with a "
                                          "checkpoint and resumes when the server starts again");
    } else {
        /* a crash (a signal, not a clean failure) is retried from the last checkpoint a bounded
         * number of times; the count is the job's "retry" events, so it survives restarts */
        int retries = 0;
        if (WIFSIGNALED(status) && !k->cancel && !p->stopping &&
            jobs_event_count(p->db, k->id, "retry", &retries) == JOBS_OK &&
            retries < p->cfg.max_retries) {
            snprintf(ev, sizeof ev, "{\"attempt\":%d,\"max_retries\":%d,\"signal\":%d,"
                     "\"from_step\":%" PRId64 "}", retries + 1, p->cfg.max_retries,
                     WTERMSIG(status), k->last_ckpt);
            jobs_event_append(p->db, k->id, "retry", ev, NULL);
            metrics_job_retried();
            snprintf(ev, sizeof ev, "{\"state\":\"queued\",\"reason\":\"killed by signal %d "
                     "(%s); retry %d of %d from its last checkpoint\"}", WTERMSIG(status),
                     strsignal(WTERMSIG(status)), retries + 1, p->cfg.max_retries);
            jobs_set_state(p->db, k->id, JOB_QUEUED, 0, NULL, ev);
            log_job(LOG_WARN, k->id, "killed by signal %d; queued again (retry %d of %d)",
                    WTERMSIG(status), retries + 1, p->cfg.max_retries);
            goto release;
        }
        if (WIFSIGNALED(status))
            snprintf(err, sizeof err, "killed by signal %d (%s)%s%s%s", WTERMSIG(status),
                     strsignal(WTERMSIG(status)),
                     retries > 0 ? " after its retries (--max-retries)" : "",
                     k->tail_n ? "; last output:\n" : "", k->tail);
        else
            snprintf(err, sizeof err, "exit status %d%s%s", code,
                     k->tail_n ? "; last output:\n" : "", k->tail);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", "failed");
        cJSON_AddStringToObject(o, "error", err);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        snprintf(ev, sizeof ev, "%s", s ? s : "{\"state\":\"failed\"}");
        free(s);
        metrics_job_failed(WIFSIGNALED(status) ? METRICS_FAIL_SIGNAL : METRICS_FAIL_EXIT);
        jobs_set_state(p->db, k->id, JOB_FAILED, 0, err, ev);
        log_job(LOG_ERROR, k->id, "failed: %.*s (GET /jobs/%s has the rest)",
                (int)strcspn(err, "\n"), err, k->id);
    }
release:
    p->reserved -= k->reserved;
    p->threads_used -= k->threads;
    for (int i = 0; i < p->n_kids; i++)
        if (p->kids[i] == k) p->kids[i] = p->kids[--p->n_kids];
    free(k);
}

static void *pool_thread(void *arg)
{
    struct pool *p = arg;
    for (;;) {
        struct pollfd fds[1 + 2 * POOL_MAX_CHILDREN];
        struct child *who[1 + 2 * POOL_MAX_CHILDREN];
        int nf = 0;
        pthread_mutex_lock(&p->mu);
        schedule(p);
        if (p->stopping && p->n_kids == 0) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->stopping && now_s() > p->stop_at)
            for (int i = 0; i < p->n_kids; i++) kill(p->kids[i]->pid, SIGKILL);
        fds[nf++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        for (int i = 0; i < p->n_kids; i++) {
            struct child *k = p->kids[i];
            if (k->out_fd >= 0) who[nf] = k, fds[nf++] = (struct pollfd){.fd = k->out_fd, .events = POLLIN};
            if (k->err_fd >= 0) who[nf] = k, fds[nf++] = (struct pollfd){.fd = k->err_fd, .events = POLLIN};
        }
        pthread_mutex_unlock(&p->mu);
        int r = poll(fds, (nfds_t)nf, 250);
        if (r < 0 && errno != EINTR) break;
        if (fds[0].revents) {
            char buf[64];
            while (read(p->wake[0], buf, sizeof buf) > 0) {
            }
        }
        int events = 0;
        for (int i = 1; i < nf; i++) {
            if (!fds[i].revents) continue;
            drain(p, who[i], fds[i].fd == who[i]->err_fd);
            events = 1;
        }
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n_kids; i++) {
            struct child *k = p->kids[i];
            if (k->out_fd >= 0 || k->err_fd >= 0) continue;
            int status;
            if (waitpid(k->pid, &status, WNOHANG) == k->pid) {
                finish(p, k, status);
                events = 1;
                i = -1; /* the list changed */
            }
        }
        pthread_mutex_unlock(&p->mu);
        if (events) notify(p);
    }
    return NULL;
}

int pool_start(struct pool **out, struct jobs *db, const struct pool_config *cfg, char *err,
               size_t errlen)
{
    *out = NULL;
    struct pool *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return POOL_ERR_INTERNAL;
    }
    p->db = db;
    p->cfg = *cfg;
    snprintf(p->exe, sizeof p->exe, "%s", cfg->exe);
    snprintf(p->data_dir, sizeof p->data_dir, "%s", cfg->data_dir);
    snprintf(p->device, sizeof p->device, "%s", cfg->device);
    p->cfg.exe = p->exe;
    p->cfg.data_dir = p->data_dir;
    p->cfg.device = p->device;
    p->wake[0] = p->wake[1] = -1;
    pthread_mutex_init(&p->mu, NULL);
    char dir[FSIO_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/jobs", p->data_dir);
    if (mkdir_one(dir, err, errlen)) goto fail;
    if (pipe2(p->wake, O_CLOEXEC | O_NONBLOCK)) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    /* jobs that were running when the server stopped resume from their last checkpoint; one
     * whose cancel was asked for ends canceled */
    for (;;) {
        struct job_row *rows = NULL;
        int n = 0;
        if (jobs_list(db, NULL, JOB_RUNNING, NULL, 64, &rows, &n)) {
            snprintf(err, errlen, "the job store cannot be read");
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (rows[i].cancel_requested)
                jobs_set_state(db, rows[i].id, JOB_CANCELED, 0, NULL,
                               "{\"state\":\"canceled\",\"reason\":\"canceled before the server "
                               "stopped\"}");
            else
                jobs_set_state(db, rows[i].id, JOB_QUEUED, 0, NULL,
                               "{\"state\":\"queued\",\"reason\":\"server restart: resumes "
                               "from its last checkpoint\"}");
        job_rows_free(rows, n);
        if (n == 0) break;
    }
    if (pthread_create(&p->thread, NULL, pool_thread, p)) {
        snprintf(err, errlen, "cannot start the pool's thread");
        goto fail;
    }
    *out = p;
    return POOL_OK;
fail:
    if (p->wake[0] >= 0) close(p->wake[0]), close(p->wake[1]);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return POOL_ERR_INTERNAL;
}

void pool_stop(struct pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    p->stop_at = now_s() + STOP_GRACE_S;
    for (int i = 0; i < p->n_kids; i++) kill(p->kids[i]->pid, SIGINT);
    pthread_mutex_unlock(&p->mu);
    wake(p);
    pthread_join(p->thread, NULL);
}

void pool_free(struct pool *p)
{
    if (!p) return;
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
