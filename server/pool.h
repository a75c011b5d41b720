/* pool.h - the device pool: jobs planned at submit on every device (the strategy search against
 * each device's budget), placed on a device where their reservation fits when they start, and
 * the job children (the same binary running `ddpmd train` / `ddpmd sample --device`), watched by
 * one thread that turns their progress lines into events and their exit into a final state.
 */
#ifndef DDPMD_POOL_H
#define DDPMD_POOL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "cost.h"
#include "jobs.h"
#include "spec.h"
#include "strategy.h"
#include "train_plans.h"

struct backend;

#define POOL_MAX_DEVICES 8
#define POOL_GPU_THREADS 2      /* host threads of a job on a cuda device (fixed, recorded) */

/* one device of the pool, as serve measured it at start */
struct pool_device_config {
    char name[32];              /* "cpu", "cuda:N" */
    int64_t budget_bytes;       /* for the sum of its running jobs' reservations */
    int64_t baseline_bytes;     /* what a job's process holds there besides its plan (cpu: its
                                 * resident bytes; cuda: context, handles, modules), measured by
                                 * a probe child on the device; added to every reservation */
    int64_t total_bytes;        /* the device's memory (cpu: the machine's); 0 unknown */
    double cost_scale;          /* the probe's speed there over the cost model's (engine/cost.h):
                                 * a job's predicted step time is the candidate's prediction x
                                 * this (/ threads on the cpu) */
    const struct backend *bk;   /* the server's own handle on it (backend_load), for planning;
                                 * NULL for the cpu */
};

struct pool_config {
    const char *exe;            /* the ddpmd binary to run jobs with (/proc/self/exe) */
    const char *data_dir;       /* jobs live in data_dir/jobs/<id>/ */
    struct pool_device_config devices[POOL_MAX_DEVICES];
    int n_devices;              /* >= 1; the order is the preference among equally fast ones */
    int cores;                  /* CPU threads divided among the running jobs */
    int max_queue;              /* queued jobs beyond this: POOL_ERR_QUEUE_FULL */
    int max_retries;            /* a job whose process dies of a signal (not a stop) is started
                                 * again from its last checkpoint this many times, then failed */
    int max_per_owner;          /* one owner's queued + running jobs beyond this:
                                 * POOL_ERR_OWNER_LIMIT; 0 = no limit */
    struct cost_model cost;     /* the admission's step time predictions (the jobs' children
                                 * read the same $DDPMD_COST_MODEL) */
};

enum pool_status {
    POOL_OK = 0,
    POOL_ERR_NEVER_FITS,        /* no plan fits any device's budget */
    POOL_ERR_QUEUE_FULL,
    POOL_ERR_STOPPING,          /* the server is shutting down */
    POOL_ERR_NOT_FOUND,
    POOL_ERR_STATE,             /* cancel of an ended job */
    POOL_ERR_PLAN,              /* the spec cannot be built or planned (err says why) */
    POOL_ERR_INTERNAL,          /* store, files or processes (err says why) */
    POOL_ERR_OWNER_LIMIT,       /* the owner has max_per_owner jobs queued or running */
    POOL_ERR_STORAGE,           /* the data directory's disk is full (err says what failed) */
    POOL_ERR_POISONED           /* it fits only devices a sticky CUDA error poisoned */
};

/* a job's plan on one device */
struct pool_fit {
    char device[32];
    int fits;                   /* a plan fits the device's budget */
    int64_t plan_bytes;         /* the device bytes its process allocates (no fit: the smallest
                                 * plan's) */
    int64_t host_bytes;         /* the plan's host part (offload) */
    int64_t baseline;           /* the device's process baseline */
    int64_t host_data;          /* cpu device: the peak of its host plan (host) */
    struct train_host host;     /* cpu device: every host byte the job holds beside its plan,
                                 * by part (train_host_plan; the child counts the same) */
    int64_t reserved;           /* what it takes of the budget: plan (+ host part on the cpu) +
                                 * baseline + host data */
    int64_t budget;             /* the device's budget */
    int64_t vram_budget;        /* the device bytes the plan was given, its one budget: what the
                                 * device's budget leaves after the baseline and host data, or
                                 * memory.vram_budget when smaller; the child's
                                 * memory.vram_budget (0: a sampling job's plan has none) */
    struct strategy strategy;   /* a training job's plan's strategy, which its child runs */
    int has_strategy;           /* 0: a sampling job */
    double step_seconds;        /* predicted seconds of one step (a sampling job: one denoising
                                 * step of a batch) on the cpu at the threads it asked for, or
                                 * every core (--cpu-cores) when it names none */
};

/* a job's plans on every device of the pool (pool_submit fills it, also on NEVER_FITS) */
struct pool_admission {
    int n;
    struct pool_fit fit[POOL_MAX_DEVICES];
    cJSON *plans;               /* the plans' entries as GET /jobs/{id} shows them ("plans"); the
                                 * caller deletes it (cJSON_Delete) */
    int first;                  /* the fitting device (index) a job is shown with while queued,
                                 * or the one needing the fewest bytes beyond its budget */
};

struct pool;

/* re-queues the store's running jobs (they resume from their last checkpoint) and starts the
 * pool's thread */
int pool_start(struct pool **out, struct jobs *db, const struct pool_config *cfg, char *err,
               size_t errlen);
/* stops admitting, sends SIGINT to every child, waits for them (they checkpoint; their jobs stay
 * `running` in the store, to be resumed) and joins the thread; the pool still answers queries */
void pool_stop(struct pool *p);
/* frees a stopped pool (after the api that queries it is gone) */
void pool_free(struct pool *p);
/* called (from the pool's thread or a submitting thread) after every event appended */
void pool_set_notify(struct pool *p, void (*fn)(void *ctx), void *ctx);

/* a training job as the api hands it over */
struct pool_train {
    const struct train_spec *spec; /* as its owner wrote it: data and init_from by id, never a
                                    * server path (what GET /jobs/{id} shows) */
    const char *dataset_dir;    /* the images folder an uploaded data.dataset names; NULL: the
                                 * built-in dataset */
    const char *init_path;      /* the checkpoint file init_from names; NULL: none */
    const char *name, *labels;  /* its owner's name and labels (JSON object) for it; NULL none */
};

/* Plans the job on every device (the planner's search against what the device's budget leaves
 * after its process baseline and, on the cpu, the job's data; memory.vram_budget caps it) and
 * queues it: its spec stored (shown to its owner) and its child's spec file written once, both
 * canonical JSON, the child's with the server's paths. On POOL_OK id gets the new job's id; on
 * POOL_ERR_NEVER_FITS (and POOL_ERR_POISONED) adm says the bytes. Nothing is stored unless
 * POOL_OK. adm->plans is deleted by the caller either way. idem_key: the request's
 * Idempotency-Key (reserved by jobs_idem_begin) or NULL; the job's insert links it, so a retry
 * finds this job even when its answer could not be stored. */
int pool_submit(struct pool *p, const char *owner, const char *idem_key,
                const struct pool_train *job, struct pool_admission *adm, char *id, char *err,
                size_t errlen);
/* One admission planning's limits (the planning worker's; NULL: none): the search polls
 * stop(ctx) before each candidate and counts the bytes its graphs and plans hold against
 * max_bytes (0: no cap; planner_guard). Either ends it with an error and nothing planned; why
 * then says which (0: neither), peak_bytes the most it held. */
enum pool_plan_why { POOL_PLAN_STOPPED = 1, POOL_PLAN_MEMORY = 2 };
struct pool_plan_guard {
    int (*stop)(void *ctx);
    void *ctx;
    size_t max_bytes;
    int why;                    /* out: 0 or enum pool_plan_why */
    size_t peak_bytes;          /* out */
};
/* pool_submit in its two halves, so the planning runs where the caller chooses (POST /train:
 * a worker thread, no lock held; api/submit.c): pool_plan_train plans the job on every device
 * (adm's fits, entries[d] each device's plan entry; it takes none of the pool's locks and
 * stores nothing); pool_submit_planned decides and queues it as pool_submit does, taking the
 * entries (freed either way). */
int pool_plan_train(struct pool *p, const struct pool_train *job, struct pool_admission *adm,
                    cJSON **entries, struct pool_plan_guard *g, char *err, size_t errlen);
int pool_submit_planned(struct pool *p, const char *owner, const char *idem_key,
                        const struct pool_train *job, struct pool_admission *adm,
                        cJSON **entries, char *id, char *err, size_t errlen);
/* a sampling job (POST /samples), its fields validated by the caller */
struct pool_sample {
    char checkpoint_id[64];     /* "<job id>-<step>": shown to the owner */
    char checkpoint_path[4096]; /* the file the child reads (never shown) */
    struct unet_config model;   /* the checkpoint's model */
    int timesteps;              /* the checkpoint's diffusion.timesteps */
    int n, steps, batch, ema;
    char sampler[8];            /* "ddim" | "ddpm" */
    double eta;
    uint64_t seed;
    const char *name, *labels;  /* as pool_train's */
};

/* the sample's parameters as the job's spec (canonical JSON, no path); caller frees */
char *pool_sample_json(const struct pool_sample *s);
/* plans (generate_plan, the function `ddpmd sample` allocates with) and queues a sampling job
 * (kind "sample"), as pool_submit; in its two halves as pool_plan_train and
 * pool_submit_planned (POST /samples plans on the planning worker too) */
int pool_submit_sample(struct pool *p, const char *owner, const char *idem_key,
                       const struct pool_sample *s, struct pool_admission *adm, char *id,
                       char *err, size_t errlen);
int pool_plan_sample(struct pool *p, const struct pool_sample *s, struct pool_admission *adm,
                     cJSON **entries, struct pool_plan_guard *g, char *err, size_t errlen);
int pool_submit_sample_planned(struct pool *p, const char *owner, const char *idem_key,
                               const struct pool_sample *s, struct pool_admission *adm,
                               cJSON **entries, char *id, char *err, size_t errlen);
/* An uploaded checkpoint made a job of its own (kind "import", state succeeded, owner's): its
 * folder, then place(path, ctx) writes the checkpoint at the job's
 * out/checkpoints/step-<step>.safetensors (err on failure), then its row (spec: the model's
 * spec as shown; name and labels may be NULL). Nothing stays unless POOL_OK, with id set; the
 * owner's limit counts no import (it runs nothing) */
int pool_import(struct pool *p, const char *owner, const char *spec_json, int64_t step,
                const char *name, const char *labels,
                int (*place)(const char *path, void *ctx, char *err, size_t errlen), void *ctx,
                char *id, char *err, size_t errlen);
/* data_dir/jobs/<id>/<tail> ("grid.png", "images/0003.png"); 0 when it fits */
int pool_job_file(const struct pool *p, const char *job_id, const char *tail, char *path,
                  size_t len);

/* queued: canceled at once; running: SIGINT (the child checkpoints and the job ends canceled);
 * *now gets the state right after the call */
int pool_cancel(struct pool *p, const char *id, enum job_state *now);

/* a device's state now (/devices, /readyz, /metrics) */
struct pool_device_state {
    struct pool_device_config cfg;
    int64_t reserved;           /* the sum of its running jobs' reservations */
    int running;                /* its running jobs */
    int waiting;                /* queued jobs that may run there (seen by the last scheduling
                                 * pass, which looks at the first 64) */
    int threads_used;           /* host threads of its running jobs */
    int poisoned;               /* a sticky CUDA error poisoned it: it admits nothing more */
    char poison[512];           /* the job and the error that did, when poisoned */
};
/* fills out[0..n_devices) (at most max); returns how many */
int pool_devices(struct pool *p, struct pool_device_state *out, int max);
const struct pool_config *pool_config_of(const struct pool *p);

/* "<job id>-<step>": a checkpoint's id; 0 when id parses (job id checked by the caller) */
int pool_checkpoint_id_parse(const char *cid, char *job_id, size_t len, int64_t *step);
/* data_dir/jobs/<id>/out/checkpoints/step-NNNNNNNN.safetensors */
int pool_checkpoint_path(const struct pool *p, const char *job_id, int64_t step, char *path,
                         size_t len);
/* whether s is a well-formed job id (so it can never name a path) */
int pool_job_id_valid(const char *s);

#endif
