/* submit.c - what POST /train and POST /samples answer alike: the Idempotency-Key (the first
 * answer again, a reused key refused, a lost answer made again), the 202 Accepted, the problem
 * of a submit the pool refused; and their admission planning on the planning worker (seconds
 * of CPU and hundreds of MB for a heavy spec), its connection suspended meanwhile so no HTTP
 * thread waits for it, answered 503 at its deadline, the search stopped there too.
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
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jobs.h"
#include "parse.h"
#include "pool.h"
#include "testhold.h"
#include "worker.h"

/* the answer of a keyed request whose job was made but whose answer was not stored (its save
 * failed, or the server died first): 202 with the job as it is now, stored as the key's answer */
static enum MHD_Result idem_made(struct ctx *c, const char *id)
{
    struct job_row r;
    if (jobs_get(c->a->cfg.db, id, &r))
        return http_send_problem(c, 500, NULL, "the job this key made cannot be read", NULL, NULL);
    int sample = strcmp(r.kind, "sample") == 0;
    char loc[160];
    api_link(c->a, loc, sizeof loc, sample ? "/samples/%s" : "/jobs/%s", id);
    cJSON *o = sample ? api_sample_json(c->a, &r) : api_job_json(c->a, &r);
    job_row_free(&r);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return http_send_oom(c);
    snprintf(c->r->job, sizeof c->r->job, "%s", id);
    jobs_idem_finish(c->a->cfg.db, c->owner, c->idem_key, 202, loc, s);
    enum MHD_Result res = http_send_text(c, 202, "application/json", s,
                                    (const char *const[]){"Location", loc, "Idempotent-Replayed",
                                                          "true", NULL});
    free(s);
    return res;
}

/* Idempotency-Key on POST /train and POST /samples: 1 when the answer is already sent (the
 * first answer replayed, a key reused with another body: 422, a key whose first request is still
 * being answered: 409, a malformed key: 400); 0 to go on (the key, if any, reserved) */
int api_idem_begin(struct ctx *c, const char *route, enum MHD_Result *res)
{
    if (c->r->idem_open) { /* resumed after its planning: the key is this request's already */
        memcpy(c->idem_key, c->r->idem_key, sizeof c->idem_key);
        c->idem_open = 1;
        c->r->idem_open = 0;
        return 0;
    }
    const char *k = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Idempotency-Key");
    if (!k) return 0;
    if (api_parse_idem_key(k)) {
        *res = http_send_invalid(c, 400, "Idempotency-Key",
                       "expected 1 to 128 printable ASCII characters without spaces");
        return 1;
    }
    snprintf(c->idem_key, sizeof c->idem_key, "%s", k);
    size_t bl = c->r->len, rl = strlen(route);
    char *req = malloc(rl + 1 + bl + 1);
    if (!req) {
        *res = http_send_oom(c);
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
        *res = http_send_problem(c, 507, "insufficient-storage", detail, NULL, NULL);
        return 1;
    }
    if (rc) {
        *res = http_send_problem(c, 500, NULL, "the idempotency keys cannot be read", NULL, NULL);
        return 1;
    }
    if (outcome == JOBS_IDEM_NEW) {
        c->idem_open = 1;
        return 0;
    }
    if (outcome == JOBS_IDEM_DONE) {
        *res = http_send_text(c, (unsigned)status, "application/json", body,
                         (const char *const[]){"Location", loc, "Idempotent-Replayed", "true", NULL});
    } else if (outcome == JOBS_IDEM_MADE) {
        *res = idem_made(c, made);
    } else if (outcome == JOBS_IDEM_MISMATCH) {
        cJSON *errs = http_errors_new();
        if (errs) http_errors_add(errs, "Idempotency-Key", "already used with another request");
        *res = errs ? http_send_problem(c, 422, "idempotency-key-reused",
                                        "this Idempotency-Key was used with another request "
                                        "body or route", errs, NULL)
                    : http_send_oom(c);
    } else {
        *res = http_send_problem(c, 409, "idempotency-key-in-flight",
                       "the first request with this Idempotency-Key is still being answered",
                       NULL, (const char *const[]){"Retry-After", "1", NULL});
    }
    free(loc);
    free(body);
    return 1;
}

/* a 202 with Location; stored as the answer of the request's Idempotency-Key, if it has one */
enum MHD_Result api_accepted(struct ctx *c, cJSON *o, const char *loc)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return http_send_oom(c);
    const char *slash = strrchr(loc, '/');
    if (c->r && slash) snprintf(c->r->job, sizeof c->r->job, "%s", slash + 1);
    if (c->idem_open &&
        jobs_idem_finish(c->a->cfg.db, c->owner, c->idem_key, 202, loc, s) == JOBS_OK)
        c->idem_open = 0;
    enum MHD_Result r = http_send_text(c, 202, "application/json", s,
                                  (const char *const[]){"Location", loc, NULL});
    free(s);
    return r;
}

/* a submit refused by the pool -> its problem (shared by POST /train and POST /samples); frees
 * adm's plans */
enum MHD_Result api_submit_refused(struct ctx *c, int rc, struct pool_admission *adm,
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
        http_json_put(o, "plan", plan ? plan : cJSON_CreateObject());
        http_json_put(o, "plans", plans ? plans : cJSON_CreateArray());
        if (rc == POOL_ERR_POISONED)
            return http_send_problem(c, 503, "device-poisoned", err, o,
                           (const char *const[]){"Retry-After", "60", NULL});
        return http_send_problem(c, 422, "never-fits", err, o, NULL);
    }
    cJSON_Delete(plans);
    if (rc == POOL_ERR_QUEUE_FULL)
        return http_send_problem(c, 503, "queue-full", err, NULL,
                       (const char *const[]){"Retry-After", "30", NULL});
    if (rc == POOL_ERR_STOPPING)
        return http_send_problem(c, 503, "stopping", err, NULL,
                       (const char *const[]){"Retry-After", "10", NULL});
    /* the caller's own limit, not the server's state: 429 (503 is the whole queue) */
    if (rc == POOL_ERR_OWNER_LIMIT)
        return http_send_problem(c, 429, "owner-limit", err, NULL,
                       (const char *const[]){"Retry-After", "30", NULL});
    if (rc == POOL_ERR_PLAN) return http_send_invalid(c, 422, plan_path, err);
    /* the data directory's disk is full: nothing was stored; a retry may work once space is freed */
    if (rc == POOL_ERR_STORAGE) return http_send_problem(c, 507, "insufficient-storage", err, NULL, NULL);
    return http_send_problem(c, 500, NULL, err, NULL, NULL);
}

/* ---- POST /train's and POST /samples' planning on the worker ----
 * The request's connection is suspended while its job is planned (libmicrohttpd's
 * suspend/resume, as events.c parks its streams), so no HTTP thread waits for a plan: a
 * connection libmicrohttpd gave to that thread would wait with it. The worker resumes it when
 * the plan is made; the watcher resumes it at the deadline; whichever comes first (once). The
 * resumed request runs its handler again, which finds the plan's result here (c->r->plan). */

/* one request's planning: its own copies of the job (the request may give up and go), the
 * results; freed by the last of its owners (the request, the worker, the watcher's list) */
struct plan_task {
    pthread_mutex_t mu;
    int owners, done, suspended, resumed;
    struct MHD_Connection *conn;
    double deadline;            /* CLOCK_MONOTONIC seconds */
    struct plan_task *next;     /* the watcher's list */
    struct pool *pool;
    const struct worker *w;
    size_t max_bytes;           /* the search's memory cap (--plan-memory) */
    int sample;                 /* 1: a sampling job (smp); 0: a training job (spec, paths) */
    struct pool_sample smp;
    struct train_spec spec;
    char dataset_dir[FSIO_PATH_MAX], init_path[FSIO_PATH_MAX];
    int has_dataset, has_init;
    int rc;
    int guard_why;              /* enum pool_plan_why: the guard ended the search; 0 */
    size_t held_bytes;          /* the guard's count of what the search held at its peak */
    struct pool_admission adm;
    cJSON *entries[POOL_MAX_DEVICES];
    char err[1024];
};

/* the deadlines of the suspended requests: a thread that looks every PLAN_TICK_S */
struct plan_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    struct plan_task *list;
    int stopping;
};
#define PLAN_TICK_S 0.05

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void plan_task_release(struct plan_task *t)
{
    pthread_mutex_lock(&t->mu);
    int last = --t->owners == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last) return;
    for (int d = 0; d < POOL_MAX_DEVICES; d++) cJSON_Delete(t->entries[d]);
    cJSON_Delete(t->adm.plans);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* the request's connection resumed, once, whoever asks first (lock t->mu held); the caller
 * calls MHD_resume_connection outside the lock when this says to */
static int plan_take_resume(struct plan_task *t)
{
    if (!t->suspended || t->resumed) return 0;
    t->resumed = 1;
    return 1;
}

static int plan_stopping(const void *w) { return worker_stopping(w); }

/* the planner's guard: the server stops, or the request's deadline passed (its 503 is sent or
 * about to be: nobody waits for the rest of the search) */
static int plan_past(void *arg)
{
    const struct plan_task *t = arg;
    return worker_stopping(t->w) || mono_now() >= t->deadline;
}

static void plan_run(void *arg, int canceled)
{
    struct plan_task *t = arg;
    int rc = POOL_ERR_STOPPING;
    if (!canceled) {
        testhold_before_plan(plan_stopping, t->w);
        struct pool_train job = {.spec = &t->spec,
                                 .dataset_dir = t->has_dataset ? t->dataset_dir : NULL,
                                 .init_path = t->has_init ? t->init_path : NULL};
        if (worker_stopping(t->w)) {
            rc = POOL_ERR_STOPPING;
        } else if (plan_past(t)) { /* waited in the queue past its deadline */
            t->guard_why = POOL_PLAN_STOPPED;
            rc = POOL_ERR_INTERNAL;
        } else {
            /* the search stops at the deadline and at the memory cap (no plan then: the
             * pool's functions free what they made and answer an error) */
            struct pool_plan_guard g = {.stop = plan_past, .ctx = t, .max_bytes = t->max_bytes};
            rc = t->sample ? pool_plan_sample(t->pool, &t->smp, &t->adm, t->entries, &g, t->err,
                                              sizeof t->err)
                           : pool_plan_train(t->pool, &job, &t->adm, t->entries, &g, t->err,
                                             sizeof t->err);
            t->guard_why = g.why;
            t->held_bytes = g.peak_bytes;
            if (g.why == POOL_PLAN_STOPPED && worker_stopping(t->w)) rc = POOL_ERR_STOPPING;
        }
    }
    if (rc == POOL_ERR_STOPPING) snprintf(t->err, sizeof t->err, "the server is shutting down");
    pthread_mutex_lock(&t->mu);
    t->rc = rc;
    t->done = 1;
    int resume = plan_take_resume(t);
    pthread_mutex_unlock(&t->mu);
    if (resume) MHD_resume_connection(t->conn); /* suspended until now: still there */
    plan_task_release(t);
}

/* every PLAN_TICK_S: a suspended request past its deadline resumed (its handler answers 503),
 * the resumed ones dropped from the list */
static void *plan_watch_main(void *arg)
{
    struct plan_watch *pw = arg;
    pthread_mutex_lock(&pw->mu);
    for (;;) {
        double now = mono_now();
        for (struct plan_task **pp = &pw->list; *pp;) {
            struct plan_task *t = *pp;
            pthread_mutex_lock(&t->mu);
            int resume = 0, drop = t->resumed || !t->suspended || pw->stopping;
            if (t->suspended && !t->resumed && (now >= t->deadline || pw->stopping))
                resume = plan_take_resume(t), drop = 1;
            pthread_mutex_unlock(&t->mu);
            if (resume) MHD_resume_connection(t->conn);
            if (drop) {
                *pp = t->next;
                plan_task_release(t);
            } else {
                pp = &t->next;
            }
        }
        if (pw->stopping) break;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(PLAN_TICK_S * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&pw->cv, &pw->mu, &until);
    }
    pthread_mutex_unlock(&pw->mu);
    return NULL;
}

int api_plans_start(struct api *a)
{
    struct plan_watch *pw = calloc(1, sizeof *pw);
    if (!pw) return -1;
    pthread_mutex_init(&pw->mu, NULL);
    pthread_condattr_t ca; /* the ticks on the monotonic clock: a wall-clock step moves them not */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pw->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&pw->thread, NULL, plan_watch_main, pw)) {
        pthread_cond_destroy(&pw->cv);
        pthread_mutex_destroy(&pw->mu);
        free(pw);
        return -1;
    }
    a->plans = pw;
    return 0;
}

void api_plans_stop(struct api *a)
{
    struct plan_watch *pw = a->plans;
    if (!pw) return;
    pthread_mutex_lock(&pw->mu);
    int joined = pw->stopping;
    pw->stopping = 1;
    pthread_cond_signal(&pw->cv);
    pthread_mutex_unlock(&pw->mu);
    if (!joined) pthread_join(pw->thread, NULL);
}

void api_plans_free(struct api *a)
{
    struct plan_watch *pw = a->plans;
    if (!pw) return;
    api_plans_stop(a);
    /* a request added after the watcher's last look was resumed by the stopped planner */
    for (struct plan_task *t = pw->list, *next; t; t = next) {
        next = t->next;
        plan_task_release(t);
    }
    pthread_cond_destroy(&pw->cv);
    pthread_mutex_destroy(&pw->mu);
    free(pw);
    a->plans = NULL;
}

void api_plan_drop(struct req *r)
{
    if (r->plan) plan_task_release(r->plan);
    r->plan = NULL;
}

/* the one path of both: job (a training job) or smp (a sampling job) planned on the worker;
 * plan_path names the field a refusal is about */
static int plan_job(struct ctx *c, const struct pool_train *job, const struct pool_sample *smp,
                    const char *plan_path, struct pool_admission *adm, cJSON **entries,
                    char *err, size_t errlen, enum MHD_Result *res)
{
    for (int d = 0; d < POOL_MAX_DEVICES; d++) entries[d] = NULL;
    memset(adm, 0, sizeof *adm);
    struct plan_task *t = c->r->plan;
    if (t) { /* resumed: planned, or past the deadline */
        c->r->plan = NULL;
        pthread_mutex_lock(&t->mu);
        int done = t->done;
        pthread_mutex_unlock(&t->mu);
        if (done && t->guard_why == POOL_PLAN_MEMORY) {
            char detail[400];
            snprintf(detail, sizeof detail, "planning this job holds more memory than the "
                     "server allows one admission planning (--plan-memory, %zu bytes; it had "
                     "%zu when it stopped): a smaller train.batch, a forced memory.micro_batch, "
                     "or a smaller model plans in less", t->max_bytes, t->held_bytes);
            plan_task_release(t);
            *res = http_send_invalid(c, 422, plan_path, detail);
            return 1;
        }
        if (!done || (t->guard_why == POOL_PLAN_STOPPED && t->rc != POOL_ERR_STOPPING)) {
            /* the worker finishes it and frees what it made; the answer does not wait */
            plan_task_release(t);
            char detail[200];
            snprintf(detail, sizeof detail, "the job's admission planning took longer than %g s "
                     "(--plan-timeout); the planner is busy or the spec is very large",
                     c->a->cfg.plan_timeout_s);
            *res = http_send_problem(c, 503, "plan-timeout", detail, NULL,
                                     (const char *const[]){"Retry-After", "10", NULL});
            return 1;
        }
        int rc = t->rc;
        if (rc == POOL_OK) {
            *adm = t->adm;
            memset(&t->adm, 0, sizeof t->adm);
            for (int d = 0; d < POOL_MAX_DEVICES; d++)
                entries[d] = t->entries[d], t->entries[d] = NULL;
        } else {
            snprintf(err, errlen, "%s", t->err);
            *adm = t->adm; /* no plans on a refusal */
            adm->plans = NULL;
        }
        plan_task_release(t);
        if (rc == POOL_OK) return 0;
        *res = api_submit_refused(c, rc, adm, err, plan_path);
        return 1;
    }
    struct plan_watch *pw = c->a->plans;
    t = calloc(1, sizeof *t);
    if (!t) {
        *res = http_send_oom(c);
        return 1;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->owners = 3; /* the request, the worker, the watcher's list */
    t->conn = c->conn;
    t->deadline = mono_now() + c->a->cfg.plan_timeout_s;
    t->pool = c->a->cfg.pool;
    t->w = c->a->planner;
    t->max_bytes = (size_t)c->a->cfg.plan_memory;
    if (smp) {
        t->sample = 1;
        t->smp = *smp;
        t->smp.name = t->smp.labels = NULL; /* the request's: unused by the planning */
    } else {
        t->spec = *job->spec;
        if (job->dataset_dir)
            t->has_dataset = 1,
            snprintf(t->dataset_dir, sizeof t->dataset_dir, "%s", job->dataset_dir);
        if (job->init_path)
            t->has_init = 1, snprintf(t->init_path, sizeof t->init_path, "%s", job->init_path);
    }
    /* suspended under the task's lock, so the worker cannot resume it before */
    pthread_mutex_lock(&t->mu);
    int wrc = worker_submit(c->a->planner, plan_run, t);
    if (wrc == WORKER_OK) {
        MHD_suspend_connection(c->conn);
        t->suspended = 1;
    } else {
        t->owners = 1; /* the request's alone: never queued nor watched */
    }
    pthread_mutex_unlock(&t->mu);
    if (wrc == WORKER_OK) {
        /* watched from now on (already resumed, if the worker was that quick: dropped) */
        pthread_mutex_lock(&pw->mu);
        t->next = pw->list;
        pw->list = t;
        pthread_mutex_unlock(&pw->mu);
        c->r->plan = t;
        /* the Idempotency-Key stays reserved until the resumed request answers */
        c->r->idem_open = c->idem_open;
        memcpy(c->r->idem_key, c->idem_key, sizeof c->r->idem_key);
        memcpy(c->r->idem_owner, c->owner, sizeof c->r->idem_owner);
        c->idem_open = 0;
        *res = MHD_YES;
        return 1;
    }
    plan_task_release(t);
    if (wrc == WORKER_ERR_STOPPED)
        *res = http_send_stopping(c);
    else
        *res = http_send_problem(c, 503, "planner-busy",
                                 "every admission planning slot is taken (--plan-workers, "
                                 "--plan-queue): try again shortly",
                                 NULL, (const char *const[]){"Retry-After", "5", NULL});
    return 1;
}

int api_plan_train(struct ctx *c, const struct pool_train *job, struct pool_admission *adm,
                   cJSON **entries, char *err, size_t errlen, enum MHD_Result *res)
{
    return plan_job(c, job, NULL, "model", adm, entries, err, errlen, res);
}

int api_plan_sample(struct ctx *c, const struct pool_sample *s, struct pool_admission *adm,
                    cJSON **entries, char *err, size_t errlen, enum MHD_Result *res)
{
    return plan_job(c, NULL, s, "checkpoint", adm, entries, err, errlen, res);
}
