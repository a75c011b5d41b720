/* pool.h - the device pool: admission of training jobs by their planned bytes against a device's
 * budget, and the job children (the same binary running `ddpmd train`), watched by one thread that
 * turns their progress lines into events and their exit into a final state.
 */
#ifndef DDPMD_POOL_H
#define DDPMD_POOL_H

#include <stdint.h>

#include "jobs.h"
#include "spec.h"

struct pool_config {
    const char *exe;            /* the ddpmd binary to run jobs with (/proc/self/exe) */
    const char *data_dir;       /* jobs live in data_dir/jobs/<id>/ */
    const char *device;         /* "cpu" */
    int64_t budget_bytes;       /* the device's budget for the sum of reservations */
    int64_t baseline_bytes;     /* measured per-process overhead, added to every reservation */
    int cores;                  /* CPU threads divided among the running jobs */
    int max_queue;              /* queued jobs beyond this: POOL_ERR_QUEUE_FULL */
    int max_retries;            /* a job whose process dies of a signal (not a stop) is started
                                 * again from its last checkpoint this many times, then failed */
    int max_per_owner;          /* one owner's queued + running jobs beyond this:
                                 * POOL_ERR_OWNER_LIMIT; 0 = no limit */
    double cost_scale;          /* this machine's one thread over the cost model's defaults
                                 * (engine/cost.h), measured by the probe: a job's predicted
                                 * step time is cost_predict_step_seconds x this / threads */
};

enum pool_status {
    POOL_OK = 0,
    POOL_ERR_NEVER_FITS,        /* needs more than the whole budget */
    POOL_ERR_QUEUE_FULL,
    POOL_ERR_STOPPING,          /* the server is shutting down */
    POOL_ERR_NOT_FOUND,
    POOL_ERR_STATE,             /* cancel of an ended job */
    POOL_ERR_PLAN,              /* the spec cannot be built or planned (err says why) */
    POOL_ERR_INTERNAL,          /* store, files or processes (err says why) */
    POOL_ERR_OWNER_LIMIT,       /* the owner has max_per_owner jobs queued or running */
    POOL_ERR_STORAGE            /* the data directory's disk is full (err says what failed) */
};

/* what a job costs on the device, by part */
struct pool_estimate {
    int64_t params, grads, adam, ema, inputs, workspace, arena, arena_no_reuse;
    int64_t plan_total;         /* plan.total_bytes: what the child allocates */
    int64_t baseline;           /* the process itself */
    int64_t host_data;          /* cpu device: the decoded dataset and its batch buffers */
    int64_t reserved;           /* plan_total + baseline + host_data */
    double step_seconds;        /* predicted seconds of one step (a sampling job: one denoising
                                 * step of a batch); 0 when the pool has no cost_scale */
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

/* the job's bytes through the same train_plan the child runs */
int pool_estimate(const struct pool *p, const struct train_spec *spec, struct pool_estimate *e,
                  char *err, size_t errlen);
/* the estimate as a JSON object (the job's "plan"); caller frees */
char *pool_estimate_json(const struct pool_estimate *e);

/* plans and queues a job: stored spec (shown to its owner) and child spec (paths resolved) as
 * canonical JSON. On POOL_OK id gets the new job's id; on POOL_ERR_NEVER_FITS e says the bytes.
 * Nothing is stored unless POOL_OK. */
int pool_submit(struct pool *p, const char *owner, const struct train_spec *shown,
                const struct train_spec *child, struct pool_estimate *e, char *id, char *err,
                size_t errlen);
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
};

/* a sampling job's bytes through sample_plan, the function `ddpmd sample` allocates with */
int pool_estimate_sample(const struct pool *p, const struct pool_sample *s,
                         struct pool_estimate *e, char *err, size_t errlen);
/* the sample's parameters as the job's spec (canonical JSON, no path); caller frees */
char *pool_sample_json(const struct pool_sample *s);
/* plans and queues a sampling job (kind "sample"), as pool_submit */
int pool_submit_sample(struct pool *p, const char *owner, const struct pool_sample *s,
                       struct pool_estimate *e, char *id, char *err, size_t errlen);
/* data_dir/jobs/<id>/<tail> ("grid.png", "images/0003.png"); 0 when it fits */
int pool_job_file(const struct pool *p, const char *job_id, const char *tail, char *path,
                  size_t len);

/* queued: canceled at once; running: SIGINT (the child checkpoints and the job ends canceled);
 * *now gets the state right after the call */
int pool_cancel(struct pool *p, const char *id, enum job_state *now);

/* device figures for /readyz */
void pool_usage(struct pool *p, int64_t *reserved, int *running, int *threads_used);
const struct pool_config *pool_config_of(const struct pool *p);

/* "<job id>-<step>": a checkpoint's id; 0 when id parses (job id checked by the caller) */
int pool_checkpoint_id_parse(const char *cid, char *job_id, size_t len, int64_t *step);
/* data_dir/jobs/<id>/out/checkpoints/step-NNNNNNNN.safetensors */
int pool_checkpoint_path(const struct pool *p, const char *job_id, int64_t step, char *path,
                         size_t len);
/* whether s is a well-formed job id (so it can never name a path) */
int pool_job_id_valid(const char *s);

#endif
