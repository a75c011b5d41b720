/* pool.c - the job queue over the devices (see pool.h): submits planned by admission.c and
 * queued, the scheduler placing them where their reservation fits, and the job children. One
 * thread owns the children: it starts them (child.c; PR_SET_PDEATHSIG follows the starting
 * thread, so that thread lives as long as any child), polls their pipes, stores their lines as
 * events and reaps them. Submits and cancels from the HTTP threads take the pool's lock and wake
 * the thread through a pipe.
 */
#define _GNU_SOURCE /* pipe2, environ */
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
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admission.h"
#include "backend_load.h"
#include "child.h"
#include "clock.h"
#include "fsio.h"
#include "log.h"
#include "metrics.h"
#include "planner.h"
#include "train.h"

extern char **environ;

#define POOL_MAX_CHILDREN 64
#define LINE_MAX_BYTES 4096
#define ERR_TAIL_BYTES 1536
#define STOP_GRACE_S 60.0 /* after SIGINT at shutdown, SIGKILL once this has passed */

struct child {
    char id[JOBS_ID_LEN];
    char kind[16];
    int dev;                     /* its device (index) */
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
    struct child_throttle throttle; /* its progress events' rate limit (the pool's thread's) */
    struct child_log_cap log_cap;   /* its log lines' cap (child.h) */
};

/* a device and what runs on it (under the pool's lock) */
struct dev {
    struct pool_device_state st;
    int is_cpu;
};

/* a queued job as the scheduler needs it: made from the structs at submit, or parsed once from
 * its row (a job queued before this server started) */
struct qjob {
    char id[JOBS_ID_LEN];
    int seen;                    /* listed by the current scheduling pass */
    int pinned;                  /* the device it ran on before (it resumes there), -1: any, -2:
                                  * one this server does not have */
    int want;                    /* the threads it asks for (a sampling job: 1; 0: train.threads
                                  * not named - the cores free when it first starts) */
    int batch;                   /* a training job's images per step (the metrics) */
    int fits[POOL_MAX_DEVICES];
    int64_t reserved[POOL_MAX_DEVICES];
    double step_s[POOL_MAX_DEVICES]; /* predicted, at `want` threads; INFINITY unknown */
    /* a training job's plan there, which its child runs: the strategy and memory.vram_budget
     * (has_strategy 0: none named, a job stored before plans did: the child searches) */
    struct strategy strategy[POOL_MAX_DEVICES];
    int64_t vram_budget[POOL_MAX_DEVICES];
    int has_strategy[POOL_MAX_DEVICES];
    char *entry[POOL_MAX_DEVICES]; /* the plan entry as the job's row shows it once it runs
                                    * there (owned; NULL: taken from the row's plans) */
};

struct pool {
    struct jobs *db;
    struct pool_config cfg;
    char exe[1024], data_dir[1024];
    struct dev devs[POOL_MAX_DEVICES];
    int n_devs;
    pthread_t thread;
    pthread_mutex_t mu;
    int wake[2];
    int stopping;
    double stop_at;
    struct child *kids[POOL_MAX_CHILDREN];
    int n_kids;
    int threads_used;            /* every running job's host threads (the cores they share) */
    struct qjob *q;              /* the scheduler's cache of queued jobs */
    int n_q, cap_q;
    int dirty;                   /* the queue or the devices changed since the last pass */
    double sched_at;             /* when the last pass ran */
    void (*notify)(void *);
    void *notify_ctx;
};

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

static int dev_find(const struct pool *p, const char *name)
{
    for (int i = 0; i < p->n_devs; i++)
        if (strcmp(p->devs[i].st.cfg.name, name) == 0) return i;
    return -1;
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

/* a job folder that could not be written, as its client sees it: the cause (e, the failed
 * call's errno) without the server's paths, the whole error (err on entry) in the server's
 * log; POOL_ERR_STORAGE when the disk is full, else POOL_ERR_INTERNAL */
static int folder_error(const char *id, int e, char *err, size_t errlen)
{
    int full = e == ENOSPC || e == EDQUOT || strstr(err, strerror(ENOSPC));
    log_msg(LOG_ERROR, "job %s: %s", id, err);
    if (full && e != EDQUOT) e = ENOSPC;
    snprintf(err, errlen, "the job's files cannot be written: %s",
             e ? strerror(e) : "an input/output error");
    return full ? POOL_ERR_STORAGE : POOL_ERR_INTERNAL;
}

static void qjob_clear(struct qjob *q)
{
    for (int d = 0; d < POOL_MAX_DEVICES; d++) free(q->entry[d]);
    memset(q->entry, 0, sizeof q->entry);
}

/* room for one more entry in the scheduler's cache (lock held); -1 out of memory */
static int qjob_grow(struct pool *p)
{
    int cap = p->cap_q ? 2 * p->cap_q : 64;
    struct qjob *q = realloc(p->q, (size_t)cap * sizeof *q);
    if (!q) return -1;
    p->q = q;
    p->cap_q = cap;
    return 0;
}

/* stores a planned job (lock taken here): its folder and child file first, then the row; r has
 * kind, steps, spec, plan and reserved_bytes set. On POOL_OK id gets the new id and q (the
 * job as the scheduler sees it; its entries taken over either way) joins the scheduler's
 * cache, so the scheduler reads nothing back. */
static int queue_job(struct pool *p, const char *owner, struct job_row *r, const char *child_file,
                     const char *child_json, struct qjob *q, char *id, char *err, size_t errlen)
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
    r->device[0] = 0; /* placed when it starts */
    /* the job's folder and its child file exist before the row, so a stored job always has them */
    if (job_dir(p, r->id, "", dir, sizeof dir) || job_dir(p, r->id, child_file, path, sizeof path)) {
        snprintf(err, errlen, "the data directory's path is too long");
        goto out;
    }
    if (mkdir_one(dir, err, errlen) || fsio_write_atomic_text(path, child_json, err, errlen)) {
        rc = folder_error(r->id, errno, err, errlen);
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
    snprintf(q->id, sizeof q->id, "%s", r->id);
    if (p->n_q < p->cap_q || qjob_grow(p) == 0) {
        p->q[p->n_q++] = *q;
        memset(q->entry, 0, sizeof q->entry); /* the cache's now */
    }
    p->dirty = 1;
    rc = POOL_OK;
out:
    qjob_clear(q);
    pthread_mutex_unlock(&p->mu);
    if (rc == POOL_OK) {
        notify(p);
        wake(p);
    }
    return rc;
}

/* Queues a job planned on every device (entries[d] its plan entry on device d, adm its fits):
 * admit() picks what is stored, then its row (kind, steps, spec: what its owner sees, owned
 * here), its child's file (child_json, owned here) and the scheduler's view of it (want threads,
 * batch, and every device's fit from adm). The entries become adm's plans. */
static int submit_planned(struct pool *p, const char *owner, const char *idem_key,
                          const char *kind, int64_t steps, char *spec, const char *child_file,
                          char *child_json, int want, int batch, const char *name,
                          const char *labels, struct pool_admission *adm, cJSON **entries,
                          char *id, char *err, size_t errlen)
{
    struct job_row r;
    struct qjob q;
    memset(&r, 0, sizeof r);
    memset(&q, 0, sizeof q);
    r.idem_key = idem_key;
    snprintf(r.name, sizeof r.name, "%s", name ? name : "");
    r.labels = (char *)labels; /* borrowed: jobs_insert only reads it */
    int poisoned[POOL_MAX_DEVICES];
    pthread_mutex_lock(&p->mu);
    for (int d = 0; d < adm->n; d++) poisoned[d] = p->devs[d].st.poisoned;
    pthread_mutex_unlock(&p->mu);
    int rc = admission_decide(adm, entries, poisoned, err, errlen);
    if (rc == POOL_OK) {
        q.pinned = -1;
        q.want = want;
        q.batch = batch;
        for (int d = 0; d < adm->n; d++) {
            const struct pool_fit *f = &adm->fit[d];
            q.fits[d] = f->fits;
            q.reserved[d] = f->reserved;
            q.step_s[d] = isfinite(f->step_seconds) && f->step_seconds > 0 ? f->step_seconds
                                                                            : INFINITY;
            q.has_strategy[d] = f->has_strategy;
            q.strategy[d] = f->strategy;
            q.vram_budget[d] = f->vram_budget;
            q.entry[d] = cJSON_PrintUnformatted(cJSON_GetArrayItem(adm->plans, d));
        }
        snprintf(r.kind, sizeof r.kind, "%s", kind);
        r.reserved_bytes = adm->fit[adm->first].reserved;
        r.steps = steps;
        r.spec = spec;
        r.plan = q.entry[adm->first] ? strdup(q.entry[adm->first]) : NULL;
        r.plans = cJSON_PrintUnformatted(adm->plans);
        if (!r.spec || !r.plan || !r.plans || !child_json) {
            snprintf(err, errlen, "out of memory");
            rc = POOL_ERR_INTERNAL;
        } else {
            rc = queue_job(p, owner, &r, child_file, child_json, &q, id, err, errlen);
        }
    }
    qjob_clear(&q);
    free(spec);
    free(r.plan);
    free(r.plans);
    free(child_json);
    for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(entries[d]);
    return rc;
}

/* the child's spec: the job's, its ids resolved to the files they name; NULL with err */
static struct train_spec *child_spec(const struct pool_train *job, char *err, size_t errlen)
{
    struct train_spec *child = malloc(sizeof *child);
    if (!child) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    *child = *job->spec;
    if ((job->dataset_dir && snprintf(child->dataset, sizeof child->dataset, "%s",
                                      job->dataset_dir) >= (int)sizeof child->dataset) ||
        (job->init_path && snprintf(child->init_from, sizeof child->init_from, "%s",
                                    job->init_path) >= (int)sizeof child->init_from)) {
        free(child);
        snprintf(err, errlen, "the data directory's path is too long");
        return NULL;
    }
    return child;
}

/* g's limits on this thread's searches until guard_end (g NULL: none) */
static void guard_begin(struct pool_plan_guard *g, struct planner_guard *pg)
{
    if (!g) return;
    *pg = (struct planner_guard){.stop = g->stop, .ctx = g->ctx, .max_bytes = g->max_bytes};
    g->why = 0;
    g->peak_bytes = 0;
    planner_guard_set(pg);
}

static void guard_end(struct pool_plan_guard *g, const struct planner_guard *pg)
{
    if (!g) return;
    planner_guard_set(NULL);
    g->why = pg->why == PLANNER_ERR_MEMORY ? POOL_PLAN_MEMORY
             : pg->why                      ? POOL_PLAN_STOPPED
                                            : 0;
    g->peak_bytes = pg->peak_bytes;
}

int pool_plan_train(struct pool *p, const struct pool_train *job, struct pool_admission *adm,
                    cJSON **entries, struct pool_plan_guard *g, char *err, size_t errlen)
{
    int rc = POOL_OK;
    memset(adm, 0, sizeof *adm);
    for (int d = 0; d < POOL_MAX_DEVICES; d++) entries[d] = NULL;
    adm->n = p->n_devs;
    struct train_spec *child = child_spec(job, err, errlen);
    if (!child) return POOL_ERR_INTERNAL;
    struct planner_guard pg;
    guard_begin(g, &pg);
    for (int d = 0; d < adm->n && rc == POOL_OK; d++)
        rc = admission_fit_train(&p->devs[d].st.cfg, &p->cfg.cost, child,
                                 child->threads > 0 ? child->threads : p->cfg.cores, &adm->fit[d],
                                 &entries[d], err, errlen);
    guard_end(g, &pg);
    free(child);
    if (rc)
        for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(entries[d]), entries[d] = NULL;
    return rc;
}

int pool_submit_planned(struct pool *p, const char *owner, const char *idem_key,
                        const struct pool_train *job, struct pool_admission *adm,
                        cJSON **entries, char *id, char *err, size_t errlen)
{
    const struct train_spec *spec = job->spec;
    struct train_spec *child = child_spec(job, err, errlen);
    if (!child) {
        for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(entries[d]), entries[d] = NULL;
        return POOL_ERR_INTERNAL;
    }
    /* the store's spec printed once; the child's is the same text unless an id was resolved to
     * the folder or file it names (the child's threads and batch come as arguments) */
    char *stored = spec_to_json(spec);
    char *child_json = job->dataset_dir || job->init_path ? spec_to_json(child)
                       : stored                           ? strdup(stored)
                                                          : NULL;
    free(child);
    return submit_planned(p, owner, idem_key, "train", spec->steps, stored, "/spec.json",
                          child_json, spec->threads, spec->batch, job->name, job->labels, adm,
                          entries, id, err, errlen);
}

int pool_import(struct pool *p, const char *owner, const char *spec_json, int64_t step,
                const char *name, const char *labels,
                int (*place)(const char *path, void *ctx, char *err, size_t errlen), void *ctx,
                char *id, char *err, size_t errlen)
{
    struct job_row r;
    memset(&r, 0, sizeof r);
    char dir[FSIO_PATH_MAX], out[FSIO_PATH_MAX], ck[FSIO_PATH_MAX], path[FSIO_PATH_MAX];
    if (make_id(r.id)) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return POOL_ERR_INTERNAL;
    }
    if (job_dir(p, r.id, "", dir, sizeof dir) || job_dir(p, r.id, "/out", out, sizeof out) ||
        job_dir(p, r.id, "/out/checkpoints", ck, sizeof ck) ||
        pool_checkpoint_path(p, r.id, step, path, sizeof path)) {
        snprintf(err, errlen, "the data directory's path is too long");
        return POOL_ERR_INTERNAL;
    }
    int rc = POOL_ERR_INTERNAL;
    if (mkdir_one(dir, err, errlen) || mkdir_one(out, err, errlen) || mkdir_one(ck, err, errlen)) {
        rc = folder_error(r.id, errno, err, errlen);
        goto fail;
    }
    if (place(path, ctx, err, errlen)) {
        if (errno == ENOSPC || errno == EDQUOT) rc = POOL_ERR_STORAGE;
        goto fail;
    }
    snprintf(r.owner, sizeof r.owner, "%s", owner);
    snprintf(r.kind, sizeof r.kind, "import");
    snprintf(r.name, sizeof r.name, "%s", name ? name : "");
    r.labels = (char *)labels; /* borrowed: jobs_insert only reads them */
    r.state = JOB_SUCCEEDED;
    r.steps = step;
    r.spec = (char *)spec_json;
    r.plan = "{}";
    int jrc = jobs_insert(p->db, &r);
    if (jrc) {
        snprintf(err, errlen, "the job store cannot be written: %s", jobs_errmsg());
        rc = jrc == JOBS_ERR_FULL ? POOL_ERR_STORAGE : POOL_ERR_INTERNAL;
        goto fail;
    }
    jobs_set_progress(p->db, r.id, step, step, NAN, NAN);
    snprintf(id, JOBS_ID_LEN, "%s", r.id);
    notify(p);
    return POOL_OK;
fail:
    unlink(path);
    rmdir(ck);
    rmdir(out);
    rmdir(dir);
    return rc;
}

int pool_submit(struct pool *p, const char *owner, const char *idem_key,
                const struct pool_train *job, struct pool_admission *adm, char *id, char *err,
                size_t errlen)
{
    cJSON *entries[POOL_MAX_DEVICES];
    int rc = pool_plan_train(p, job, adm, entries, NULL, err, errlen);
    if (rc) return rc;
    return pool_submit_planned(p, owner, idem_key, job, adm, entries, id, err, errlen);
}

int pool_job_file(const struct pool *p, const char *job_id, const char *tail, char *path,
                  size_t len)
{
    char e[8];
    return fsio_path(path, len, e, sizeof e, "%s/jobs/%s/%s", p->data_dir, job_id, tail);
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

int pool_plan_sample(struct pool *p, const struct pool_sample *s, struct pool_admission *adm,
                     cJSON **entries, struct pool_plan_guard *g, char *err, size_t errlen)
{
    int rc = POOL_OK;
    memset(adm, 0, sizeof *adm);
    for (int d = 0; d < POOL_MAX_DEVICES; d++) entries[d] = NULL;
    adm->n = p->n_devs;
    if (g) g->why = 0, g->peak_bytes = 0;
    /* one plan per device, no search: stopped between devices */
    for (int d = 0; d < adm->n && rc == POOL_OK; d++)
        if (g && g->stop && g->stop(g->ctx)) {
            g->why = POOL_PLAN_STOPPED;
            snprintf(err, errlen, "the planning was stopped");
            rc = POOL_ERR_INTERNAL;
        } else
            rc = admission_fit_sample(&p->devs[d].st.cfg, &p->cfg.cost, s, &adm->fit[d],
                                  &entries[d], err, errlen);
    if (rc)
        for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(entries[d]), entries[d] = NULL;
    return rc;
}

int pool_submit_sample_planned(struct pool *p, const char *owner, const char *idem_key,
                               const struct pool_sample *s, struct pool_admission *adm,
                               cJSON **entries, char *id, char *err, size_t errlen)
{
    int chunks = (s->n + s->batch - 1) / s->batch;
    int64_t steps = (int64_t)chunks * (strcmp(s->sampler, "ddpm") == 0 ? s->timesteps : s->steps);
    /* the child's file: the parameters and the checkpoint's path (never shown) */
    cJSON *c = sample_obj(s);
    if (c && !cJSON_AddStringToObject(c, "checkpoint_path", s->checkpoint_path)) {
        cJSON_Delete(c);
        c = NULL;
    }
    char *child_json = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    return submit_planned(p, owner, idem_key, "sample", steps, pool_sample_json(s),
                          "/sample.json", child_json, 1, 0, s->name, s->labels, adm, entries, id,
                          err, errlen);
}

int pool_submit_sample(struct pool *p, const char *owner, const char *idem_key,
                       const struct pool_sample *s, struct pool_admission *adm, char *id,
                       char *err, size_t errlen)
{
    cJSON *entries[POOL_MAX_DEVICES];
    int rc = pool_plan_sample(p, s, adm, entries, NULL, err, errlen);
    if (rc) return rc;
    return pool_submit_sample_planned(p, owner, idem_key, s, adm, entries, id, err, errlen);
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
    if (rc == POOL_OK) p->dirty = 1;
    pthread_mutex_unlock(&p->mu);
    job_row_free(&r);
    if (rc == POOL_OK) {
        notify(p);
        wake(p);
    }
    return rc;
}

int pool_devices(struct pool *p, struct pool_device_state *out, int max)
{
    pthread_mutex_lock(&p->mu);
    int n = p->n_devs < max ? p->n_devs : max;
    for (int i = 0; i < n; i++) out[i] = p->devs[i].st;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void pool_set_notify(struct pool *p, void (*fn)(void *), void *ctx)
{
    pthread_mutex_lock(&p->mu);
    p->notify = fn;
    p->notify_ctx = ctx;
    pthread_mutex_unlock(&p->mu);
}

/* ---- children ---- */

/* name -> its index among planner_<what>_name(0..n-1); -1 when none */
static int name_index(const char *name, const char *(*fn)(int), int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(fn(i), name) == 0) return i;
    return -1;
}

/* a plan entry's strategy and budget (fit_train's, as stored) into q's device d: the child runs
 * exactly the admitted plan. Nothing when the entry names none (a job stored before plans did:
 * the child searches as it always did). */
static void entry_strategy(const cJSON *plan, struct qjob *q, int d)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(plan, "strategy");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(st, "precision");
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(st, "micro_batch");
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(st, "recompute");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(st, "offload");
    const cJSON *vb = cJSON_GetObjectItemCaseSensitive(plan, "vram_budget");
    if (!cJSON_IsString(pr) || !cJSON_IsNumber(mb) || !cJSON_IsString(rc) || !cJSON_IsString(of) ||
        !cJSON_IsNumber(vb))
        return;
    int prec = name_index(pr->valuestring, planner_precision_name, 3);
    int rec = name_index(rc->valuestring, planner_recompute_name, 4);
    if (prec < 0 || rec < 0 || mb->valuedouble < 1 || mb->valuedouble > q->batch ||
        !(vb->valuedouble >= 0 && vb->valuedouble <= (double)SPEC_BUDGET_MAX))
        return;
    q->strategy[d] = strategy_auto();
    q->strategy[d].precision = prec;
    q->strategy[d].micro_batch = (int)mb->valuedouble;
    q->strategy[d].recompute = rec;
    q->strategy[d].offload = strcmp(of->valuestring, "on") == 0;
    q->vram_budget[d] = (int64_t)vb->valuedouble;
    q->has_strategy[d] = 1;
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
    char n[16], steps[16], batch[16], threads[16], seed[32], eta[40], sampler[8], device[32];
    char *argv[32];
};

static int sample_args_make(struct pool *p, const char *id, int threads, const char *device,
                            struct sample_args *a, char *err, size_t errlen)
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
    snprintf(a->device, sizeof a->device, "%s", device);
    snprintf(a->seed, sizeof a->seed, "%" PRIu64, (uint64_t)seed->valuedouble);
    snprintf(a->eta, sizeof a->eta, "%.17g", eta->valuedouble);
    char **v = a->argv;
    int i = 0;
    v[i++] = p->exe, v[i++] = "sample", v[i++] = a->ckpt;
    v[i++] = "--n", v[i++] = a->n, v[i++] = "--sampler", v[i++] = a->sampler;
    v[i++] = "--steps", v[i++] = a->steps, v[i++] = "--eta", v[i++] = a->eta;
    v[i++] = "--seed", v[i++] = a->seed, v[i++] = "--batch", v[i++] = a->batch;
    v[i++] = "--threads", v[i++] = a->threads, v[i++] = "--out", v[i++] = a->grid;
    v[i++] = "--each", v[i++] = a->each, v[i++] = "--device", v[i++] = a->device;
    v[i++] = "--progress-json";
    if (cJSON_IsFalse(ema)) v[i++] = "--raw";
    v[i] = NULL;
    rc = 0;
out:
    cJSON_Delete(o);
    free(text);
    return rc;
}

/* the entry of device name in a plans array (borrowed), NULL when none */
static const cJSON *plans_entry(const cJSON *plans, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, plans)
    {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "device");
        if (cJSON_IsString(d) && strcmp(d->valuestring, name) == 0) return e;
    }
    return NULL;
}

static double entry_step_seconds(const cJSON *e)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "predicted_step_seconds");
    return cJSON_IsNumber(f) && f->valuedouble > 0 ? f->valuedouble : INFINITY;
}

/* q from the queued row r of a job this server did not submit (queued before it started): where
 * it may run and what it takes there, read back from the store */
static void qjob_parse(const struct pool *p, const struct job_row *r, struct qjob *q)
{
    memset(q, 0, sizeof *q);
    snprintf(q->id, sizeof q->id, "%s", r->id);
    for (int d = 0; d < POOL_MAX_DEVICES; d++) q->step_s[d] = INFINITY;
    struct train_spec *s = malloc(sizeof *s);
    struct spec_errors *es = malloc(sizeof *es);
    int train = strcmp(r->kind, "train") == 0 && s && es && spec_parse(r->spec, s, es) == 0;
    q->want = train ? s->threads : 1;
    q->batch = train ? s->batch : 0;
    free(s);
    free(es);
    q->pinned = -1;
    if (r->device[0]) q->pinned = dev_find(p, r->device) >= 0 ? dev_find(p, r->device) : -2;
    if (!r->plans) { /* stored before schema 3: planned for the cpu device alone */
        int d = dev_find(p, "cpu");
        cJSON *o = cJSON_Parse(r->plan);
        if (d >= 0) {
            q->fits[d] = 1;
            q->reserved[d] = r->reserved_bytes;
            q->step_s[d] = entry_step_seconds(o);
            if (train) entry_strategy(o, q, d);
        }
        cJSON_Delete(o);
        return;
    }
    cJSON *arr = cJSON_Parse(r->plans);
    for (int d = 0; d < p->n_devs; d++) {
        const cJSON *e = plans_entry(arr, p->devs[d].st.cfg.name);
        const cJSON *rb = cJSON_GetObjectItemCaseSensitive(e, "reserved_bytes");
        if (!e || !cJSON_IsNumber(rb)) continue;
        q->fits[d] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "fits"));
        q->reserved[d] = (int64_t)rb->valuedouble;
        q->step_s[d] = entry_step_seconds(e);
        if (train) entry_strategy(e, q, d);
    }
    cJSON_Delete(arr);
}

/* whether q may run on device d at all (lock held): pinned there or anywhere, a plan that fits
 * the device's budget as it is now */
static int qjob_eligible(const struct pool *p, const struct qjob *q, int d)
{
    return (q->pinned == -1 || q->pinned == d) && q->fits[d] &&
           q->reserved[d] <= p->devs[d].st.cfg.budget_bytes;
}

/* the index of r's entry in the scheduler's cache, parsed when new (lock held); -1 out of
 * memory */
static int qjob_index(struct pool *p, const struct job_row *r)
{
    for (int i = 0; i < p->n_q; i++)
        if (strcmp(p->q[i].id, r->id) == 0) return p->q[i].seen = 1, i;
    if (p->n_q == p->cap_q && qjob_grow(p)) return -1;
    qjob_parse(p, r, &p->q[p->n_q]);
    p->q[p->n_q].seen = 1;
    return p->n_q++;
}

/* drops the cache entries of jobs the last pass did not list (started, canceled) */
static void qjob_sweep(struct pool *p)
{
    int k = 0;
    for (int i = 0; i < p->n_q; i++)
        if (p->q[i].seen) p->q[k++] = p->q[i];
        else qjob_clear(&p->q[i]);
    p->n_q = k;
}

/* q's predicted seconds per step on device d at this thread count (its plan's are at the
 * threads it asked for); INFINITY when unknown: then it is never taken for short */
static double qjob_step_seconds(const struct pool *p, const struct qjob *q, int d, int threads)
{
    double sec = q->step_s[d];
    /* admission predicts at the spec's threads, every core when it names none (what it gets
     * on an idle machine) */
    if (p->devs[d].is_cpu && threads > 0)
        sec = sec * (q->want > 0 ? q->want : p->cfg.cores) / threads;
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

/* a training job's command line: `ddpmd train SPEC --out DIR --progress-json --device D
 * [--resume-or-start] --threads N` and, when its plan on the device names one, the strategy
 * and budget it runs exactly (--vram-budget, --precision, --micro-batch, --recompute,
 * --offload): the job's spec file stays as it was written at submit */
struct train_args {
    char spec[FSIO_PATH_MAX], out[FSIO_PATH_MAX];
    char threads[16], budget[24], micro[16];
    char *argv[24];
};

static int train_args_make(struct pool *p, const char *id, const struct qjob *q, int d,
                           int threads, int resume, struct train_args *a, char *err,
                           size_t errlen)
{
    if (job_dir(p, id, "/spec.json", a->spec, sizeof a->spec) ||
        job_dir(p, id, "/out", a->out, sizeof a->out)) {
        snprintf(err, errlen, "path too long");
        return -1;
    }
    char **v = a->argv;
    int i = 0;
    v[i++] = p->exe, v[i++] = "train", v[i++] = a->spec, v[i++] = "--out", v[i++] = a->out;
    v[i++] = "--progress-json"; /* protocol events, files named without the server's paths */
    v[i++] = "--device", v[i++] = p->devs[d].st.cfg.name;
    if (resume) v[i++] = "--resume-or-start";
    snprintf(a->threads, sizeof a->threads, "%d", threads);
    v[i++] = "--threads", v[i++] = a->threads;
    if (q->has_strategy[d]) {
        const struct strategy *st = &q->strategy[d];
        snprintf(a->budget, sizeof a->budget, "%" PRId64, q->vram_budget[d]);
        snprintf(a->micro, sizeof a->micro, "%d", st->micro_batch);
        v[i++] = "--vram-budget", v[i++] = a->budget;
        v[i++] = "--precision", v[i++] = (char *)planner_precision_name(st->precision);
        v[i++] = "--micro-batch", v[i++] = a->micro;
        v[i++] = "--recompute", v[i++] = (char *)planner_recompute_name(st->recompute);
        v[i++] = "--offload", v[i++] = st->offload ? "on" : "off";
    }
    v[i] = NULL;
    return 0;
}

/* starts the queued job r (q: its cache entry) on device d (lock held): its plan there becomes
 * the job's; on failure the job is failed with the reason */
static int start_child(struct pool *p, const struct job_row *r, const struct qjob *q, int d,
                       int threads)
{
    char err[600], ckpt[FSIO_PATH_MAX], omp[32];
    char **env = NULL;
    struct child *k = NULL;
    struct sample_args *sa = NULL;
    struct train_args *ta = NULL;
    struct dev *dv = &p->devs[d];
    int64_t from = -1, reserved = q->reserved[d];
    int resume = r->starts > 0, is_sample = strcmp(r->kind, "sample") == 0;
    char **argv = NULL;
    /* the job's plan on d as its row shows it: made at submit, or (a job queued before this
     * server started) its entry in the stored plans (a job stored before them: its one plan) */
    char *entry_text = NULL;
    if (q->entry[d]) {
        entry_text = strdup(q->entry[d]);
    } else {
        cJSON *plans = r->plans ? cJSON_Parse(r->plans) : NULL;
        cJSON *own = r->plans ? NULL : cJSON_Parse(r->plan);
        const cJSON *entry = r->plans ? plans_entry(plans, dv->st.cfg.name) : own;
        entry_text = entry ? cJSON_PrintUnformatted(entry) : NULL;
        cJSON_Delete(plans);
        cJSON_Delete(own);
    }
    if (!entry_text) {
        snprintf(err, sizeof err, "the job's plan on %s cannot be read", dv->st.cfg.name);
        goto fail;
    }
    if (is_sample) {
        /* a sampling job has no checkpoints of its own: a restart samples again from the start
         * (the same seed gives the same images) */
        sa = calloc(1, sizeof *sa);
        if (!sa) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        if (sample_args_make(p, r->id, threads, dv->st.cfg.name, sa, err, sizeof err)) goto fail;
        argv = sa->argv;
        resume = 0;
    } else {
        ta = calloc(1, sizeof *ta);
        if (!ta) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        if (train_args_make(p, r->id, q, d, threads, resume, ta, err, sizeof err)) goto fail;
        argv = ta->argv;
        /* a job started before resumes from its newest usable checkpoint, or starts over when
         * it never wrote one (`ddpmd train --resume-or-start`) */
        if (train_latest_checkpoint(ta->out, ckpt, sizeof ckpt, &from)) from = -1;
    }
    k = calloc(1, sizeof *k);
    env = child_env(threads, omp, sizeof omp);
    if (!k || !env) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (child_spawn(argv, env, &k->pid, &k->out_fd, &k->err_fd, err, sizeof err)) goto fail;
    free(env);
    free(sa);
    free(ta);
    k->dev = d;
    snprintf(k->kind, sizeof k->kind, "%s", r->kind);
    snprintf(k->id, sizeof k->id, "%s", r->id);
    k->reserved = reserved;
    k->threads = threads;
    k->last_ckpt = from > 0 ? from : 0;
    k->last_step = k->last_ckpt; /* the child resumes from that checkpoint */
    k->batch = q->batch;
    k->cancel = r->cancel_requested;
    k->step = is_sample ? 0 : k->last_ckpt;
    k->steps = r->steps;
    k->pred_step_s = qjob_step_seconds(p, q, d, threads);
    p->kids[p->n_kids++] = k;
    dv->st.reserved += reserved;
    dv->st.running++;
    dv->st.threads_used += threads;
    p->threads_used += threads;
    char ev[256];
    if (resume && from > 0)
        snprintf(ev, sizeof ev, "{\"state\":\"running\",\"threads\":%d,\"device\":\"%s\","
                 "\"reserved_bytes\":%" PRId64 ",\"resumed_from_step\":%" PRId64 "}",
                 threads, dv->st.cfg.name, reserved, from);
    else
        snprintf(ev, sizeof ev, "{\"state\":\"running\",\"threads\":%d,\"device\":\"%s\","
                 "\"reserved_bytes\":%" PRId64 "}", threads, dv->st.cfg.name, reserved);
    jobs_set_plan(p->db, r->id, dv->st.cfg.name, reserved, entry_text, NULL);
    jobs_set_state(p->db, r->id, JOB_RUNNING, threads, NULL, ev);
    log_job(LOG_INFO, r->id, "running on %s (%s job, %d threads, %" PRId64 " bytes reserved%s)",
            dv->st.cfg.name, r->kind, threads, reserved, resume && from > 0 ? ", resumed" : "");
    free(entry_text);
    return 0;
fail:
    free(env);
    free(k);
    free(sa);
    free(ta);
    free(entry_text);
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
#define SCHEDULE_EVERY_S 1.0 /* a pass at least this often, changed or not */

/* how many threads a queued job gets if it starts now on device d */
static int job_threads(const struct pool *p, const struct job_row *r, const struct qjob *q, int d)
{
    if (r->threads > 0) return r->threads; /* a resumed job keeps its first count */
    if (!p->devs[d].is_cpu) return POOL_GPU_THREADS;
    int free_cores = p->cfg.cores - p->threads_used;
    int want = q->want > 0 ? q->want : p->cfg.cores; /* none named: every free core */
    int threads = want < free_cores ? want : free_cores;
    return threads < 1 ? 1 : threads; /* more jobs than cores: they share */
}

static int by_end(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* When device d's head can start (lock held). The jobs running there end, by their predicted
 * lengths, in order; the head's start (*shadow, seconds from now) is when enough of their bytes
 * come back, and *extra is what is free then beyond the head's reservation. INFINITY when a
 * length is unknown before enough is free. */
static void head_start(const struct pool *p, int d, int64_t need, double *shadow, int64_t *extra)
{
    double ends[POOL_MAX_CHILDREN][2];
    int n = 0;
    for (int i = 0; i < p->n_kids; i++) {
        if (p->kids[i]->dev != d) continue;
        ends[n][0] = kid_remaining(p->kids[i]);
        ends[n++][1] = (double)p->kids[i]->reserved;
    }
    qsort(ends, (size_t)n, sizeof ends[0], by_end);
    int64_t free_b = p->devs[d].st.cfg.budget_bytes - p->devs[d].st.reserved;
    *shadow = INFINITY;
    *extra = 0;
    for (int i = 0; i < n && isfinite(ends[i][0]); i++) {
        free_b += (int64_t)ends[i][1];
        if (free_b >= need) {
            *shadow = ends[i][0];
            *extra = free_b - need;
            return;
        }
    }
}

/* a cuda device's free memory as the driver reports it holds need (admission checks it beside
 * the budget: another process may hold some) */
static int dev_mem_ok(const struct dev *dv, int64_t need)
{
    struct bk_device_mem m;
    if (dv->is_cpu || !backend_supports(dv->st.cfg.bk, BK_OP_device_mem, BK_DTYPE_F32) ||
        dv->st.cfg.bk->device_mem(backend_device_index(dv->st.cfg.name), &m) != BK_OK)
        return 1;
    return (int64_t)m.free >= need;
}

/* One pass of the queue (lock held); 1 when it started a job. FIFO with backfill, per device:
 * a device's head (the first queued job that may run there) starts when its reservation fits
 * what the device has free. While it cannot, a later job that fits now starts there ahead of it
 * only if that cannot delay the head's start: it ends (its steps x its predicted step time)
 * before the jobs running there free the head's bytes, or it takes only bytes the head will not
 * need then (EASY backfilling). A job that may start on several devices takes the one its plan
 * predicts fastest (the first listed among equals). A poisoned device takes nothing. */
static int schedule_once(struct pool *p)
{
    struct job_row *rows = NULL;
    int n = 0, started = 0;
    if (jobs_list(p->db, NULL, JOB_QUEUED, NULL, SCHEDULE_WINDOW, &rows, &n)) return 0;
    for (int i = 0; i < p->n_q; i++) p->q[i].seen = 0;
    int qi[SCHEDULE_WINDOW], head[POOL_MAX_DEVICES];
    double shadow[POOL_MAX_DEVICES];
    int64_t extra[POOL_MAX_DEVICES];
    for (int d = 0; d < p->n_devs; d++)
        head[d] = -1, shadow[d] = INFINITY, extra[d] = 0, p->devs[d].st.waiting = 0;
    for (int i = 0; i < n; i++) {
        if ((qi[i] = qjob_index(p, &rows[i])) < 0) goto out;
        for (int d = 0; d < p->n_devs; d++) {
            if (!qjob_eligible(p, &p->q[qi[i]], d)) continue;
            p->devs[d].st.waiting++;
            if (head[d] < 0) head[d] = i;
        }
    }
    for (int d = 0; d < p->n_devs; d++)
        if (head[d] >= 0)
            head_start(p, d, p->q[qi[head[d]]].reserved[d], &shadow[d], &extra[d]);
    for (int i = 0; i < n; i++) {
        const struct qjob *q = &p->q[qi[i]];
        int best = -1, best_threads = 0;
        double best_s = INFINITY;
        for (int d = 0; d < p->n_devs; d++) {
            const struct dev *dv = &p->devs[d];
            if (dv->st.poisoned || !qjob_eligible(p, q, d) ||
                q->reserved[d] > dv->st.cfg.budget_bytes - dv->st.reserved)
                continue;
            int threads = job_threads(p, &rows[i], q, d);
            double step = qjob_step_seconds(p, q, d, threads);
            /* all its steps, also for a resumed job (it redoes those after its last
             * checkpoint): a longer guess only makes a backfill rarer */
            double len = (double)rows[i].steps * step;
            if (i != head[d] && !(isfinite(shadow[d]) && len <= shadow[d]) &&
                q->reserved[d] > extra[d])
                continue;
            if (!dev_mem_ok(dv, q->reserved[d])) continue;
            if (best < 0 || step < best_s) best = d, best_s = step, best_threads = threads;
        }
        if (best >= 0) {
            start_child(p, &rows[i], q, best, best_threads);
            started = 1;
            break;
        }
    }
out:
    qjob_sweep(p);
    job_rows_free(rows, n);
    return started;
}

static void schedule(struct pool *p)
{
    p->dirty = 0;
    p->sched_at = clock_now_s();
    while (!p->stopping && p->n_kids < POOL_MAX_CHILDREN && schedule_once(p)) notify(p);
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
    double t = clock_now_s();
    if (k->t0 == 0 || step < k->step0) {
        k->t0 = t;
        k->step0 = step;
    } else if (step > k->step0) {
        k->step_s = (t - k->t0) / (double)(step - k->step0);
    }
    k->step = step;
}

/* a protocol event (child.h) becomes an event of the job (step, validation and sampling are
 * "progress", a step also updating the job's row; a checkpoint is "checkpoint" with the id GET
 * /checkpoints/{id} takes; samples "sample"; the others by their name) */
static void store_event(struct pool *p, struct child *k, const struct child_event *ep)
{
    struct child_event e = *ep;
    const char *type = child_event_name(e.kind);
    const double *v = e.v;
    int has_step = child_event_has(&e, CHILD_STEP);
    char id[64], *ckpt = NULL;
    if (e.kind == CHILD_EVENT_STEP) {
        if (has_step) {
            kid_progress(k, (int64_t)v[CHILD_STEP]);
            jobs_set_progress(p->db, k->id, (int64_t)v[CHILD_STEP],
                              child_event_has(&e, CHILD_STEPS) ? (int64_t)v[CHILD_STEPS] : 0,
                              child_event_has(&e, CHILD_LOSS) ? v[CHILD_LOSS] : NAN,
                              child_event_has(&e, CHILD_IMG_PER_S) ? v[CHILD_IMG_PER_S] : NAN);
        }
        /* the steps since its last report, each taking step_s (the mean the child measured) */
        if (has_step && v[CHILD_STEP] > (double)k->last_step && v[CHILD_STEP] <= 9e15) {
            int64_t now = (int64_t)v[CHILD_STEP], d = now - k->last_step;
            metrics_train_steps(d, d * k->batch,
                                child_event_has(&e, CHILD_STEP_S) ? v[CHILD_STEP_S] : -1);
            k->last_step = now;
        }
        type = "progress";
    } else if (e.kind == CHILD_EVENT_VALIDATION || e.kind == CHILD_EVENT_SAMPLING) {
        /* a sampling job's progress is its denoising steps (`ddpmd sample --progress-json`) */
        if (strcmp(k->kind, "sample") == 0 && child_event_has(&e, CHILD_DONE) &&
            child_event_has(&e, CHILD_TOTAL)) {
            kid_progress(k, (int64_t)v[CHILD_DONE]);
            jobs_set_progress(p->db, k->id, (int64_t)v[CHILD_DONE], (int64_t)v[CHILD_TOTAL],
                              NAN, NAN);
        }
        type = "progress";
    } else if (e.kind == CHILD_EVENT_SAMPLE) {
        type = "sample";
    } else if (e.kind == CHILD_EVENT_CHECKPOINT && has_step) {
        int64_t st = (int64_t)v[CHILD_STEP];
        snprintf(id, sizeof id, "%s-%" PRId64, k->id, st);
        ckpt = id;
        if (st > k->last_ckpt) k->last_ckpt = st;
    }
    char *compact = child_event_json(&e, ckpt);
    jobs_event_append(p->db, k->id, type, compact ? compact : "{}", NULL);
    free(compact);
}

/* a line of the child's stdout: a protocol event, its progress rate-limited (child.h's
 * throttle: what is held back is stored by flush_progress); anything else a log line */
static void stdout_line(struct pool *p, struct child *k, const char *line)
{
    struct child_event e, out[2];
    if (child_event_read(line, &e)) {
        if (child_log_cap_offer(&k->log_cap)) event_line(p, k->id, "log", "stdout", line);
        return;
    }
    int n = child_throttle_offer(&k->throttle, &e, clock_now_s(), out);
    for (int i = 0; i < n; i++) store_event(p, k, &out[i]);
}

/* stores the child's held-back progress event when its window has ended, or now when force
 * (the child is gone); 1 when one was stored */
static int flush_progress(struct pool *p, struct child *k, int force)
{
    struct child_event e;
    if (!child_throttle_due(&k->throttle, clock_now_s(), force, &e)) return 0;
    store_event(p, k, &e);
    return 1;
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
                if (child_log_cap_offer(&k->log_cap)) event_line(p, k->id, "log", "stderr", line);
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
    flush_progress(p, k, 1);
    char note[200];
    if (child_log_cap_note(&k->log_cap, note, sizeof note)) event_line(p, k->id, "log", NULL, note);
    check_checkpoint(p, k);
    char err[ERR_TAIL_BYTES + 128], ev[ERR_TAIL_BYTES + 512];
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    /* a SIGINT that came before the child set up its handler (while it loads) kills it: it had
     * no step to save, which is a stop all the same */
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGINT && (k->cancel || p->stopping))
        code = CHILD_EXIT_STOPPED;
    if (code == 0) {
        jobs_set_state(p->db, k->id, JOB_SUCCEEDED, 0, NULL, "{\"state\":\"succeeded\"}");
        log_job(LOG_INFO, k->id, "succeeded");
    } else if (code == CHILD_EXIT_STOPPED && k->cancel) {
        jobs_set_state(p->db, k->id, JOB_CANCELED, 0, NULL,
                       "{\"state\":\"canceled\",\"reason\":\"canceled while running; stopped "
                       "with a checkpoint\"}");
        log_job(LOG_INFO, k->id, "canceled (stopped with a checkpoint)");
    } else if (code == CHILD_EXIT_STOPPED && p->stopping) {
        /* stays running in the store: the next start of the server resumes it */
        event_line(p, k->id, "log", NULL, "the server is stopping: the job stopped with a "
                                          "checkpoint and resumes when the server starts again");
    } else if (code == CHILD_EXIT_POISONED && !p->devs[k->dev].is_cpu) {
        /* a sticky CUDA error: the job fails with it, and the device takes no job again in this
         * server's life (its context in any new process may be fine, the hardware may not) */
        struct dev *dv = &p->devs[k->dev];
        const char *line = strstr(k->tail, "poisoned");
        while (line && line > k->tail && line[-1] != '\n') line--;
        snprintf(err, sizeof err, "exit status %d; %s is poisoned by a sticky CUDA error%s%s",
                 code, dv->st.cfg.name, k->tail_n ? "; last output:\n" : "", k->tail);
        dv->st.poisoned = 1;
        snprintf(dv->st.poison, sizeof dv->st.poison, "job %s: %.*s", k->id,
                 line ? (int)strcspn(line, "\n") : 120, line ? line : k->tail);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", "failed");
        cJSON_AddStringToObject(o, "error", err);
        cJSON_AddStringToObject(o, "device", dv->st.cfg.name);
        cJSON_AddBoolToObject(o, "device_poisoned", 1);
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        metrics_job_failed(METRICS_FAIL_EXIT);
        jobs_set_state(p->db, k->id, JOB_FAILED, 0, err, js ? js : "{\"state\":\"failed\"}");
        free(js);
        log_job(LOG_ERROR, k->id, "failed: %s is poisoned (%s); it admits no more jobs until the "
                "server restarts", dv->st.cfg.name, dv->st.poison);
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
    p->devs[k->dev].st.reserved -= k->reserved;
    p->devs[k->dev].st.running--;
    p->devs[k->dev].st.threads_used -= k->threads;
    p->threads_used -= k->threads;
    p->dirty = 1;
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
        /* a pass when the queue or a device changed, and every second for the backfill's
         * clock (the running jobs' lengths shrink) and the devices' free memory */
        if (p->dirty || clock_now_s() - p->sched_at >= SCHEDULE_EVERY_S) schedule(p);
        if (p->stopping && p->n_kids == 0) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->stopping && clock_now_s() > p->stop_at)
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
        for (int i = 0; i < p->n_kids; i++) events |= flush_progress(p, p->kids[i], 0);
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
    p->cfg.exe = p->exe;
    p->cfg.data_dir = p->data_dir;
    p->n_devs = cfg->n_devices;
    for (int d = 0; d < p->n_devs; d++) {
        p->devs[d].st.cfg = cfg->devices[d];
        p->devs[d].is_cpu = strcmp(cfg->devices[d].name, "cpu") == 0;
    }
    p->dirty = 1;
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
    /* a queued job planned for devices this server does not have (or budgets it had) waits:
     * said once here */
    char last[JOBS_ID_LEN];
    for (const char *after = NULL;;) {
        struct job_row *rows = NULL;
        int n = 0;
        if (jobs_list(db, NULL, JOB_QUEUED, after, 64, &rows, &n) || n == 0) {
            job_rows_free(rows, n);
            break;
        }
        for (int i = 0; i < n; i++) {
            struct qjob q;
            int any = 0;
            qjob_parse(p, &rows[i], &q);
            for (int d = 0; d < p->n_devs; d++) any |= qjob_eligible(p, &q, d);
            if (!any)
                log_job(LOG_WARN, rows[i].id, "queued, but its plans fit none of this server's "
                        "devices%s%s%s: it waits for a server that has one",
                        rows[i].device[0] ? " (it ran on " : "",
                        rows[i].device[0] ? rows[i].device : "", rows[i].device[0] ? ")" : "");
        }
        snprintf(last, sizeof last, "%s", rows[n - 1].id);
        after = last;
        job_rows_free(rows, n);
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
    p->stop_at = clock_now_s() + STOP_GRACE_S;
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
    for (int i = 0; i < p->n_q; i++) qjob_clear(&p->q[i]);
    free(p->q);
    free(p);
}
