/* sample.h - generating images: a forward-only UNet graph at a sampling batch, its own plan and
 * allocation (weights from a checkpoint) or a view of a training job's nested sub-plan (weights
 * read in place from the job's EMA, inside its one reservation), and the DDPM/DDIM loop.
 */
#ifndef DDPMD_SAMPLE_H
#define DDPMD_SAMPLE_H

#include <stdint.h>

#include "exec.h"
#include "graph.h"
#include "plan.h"
#include "safetensors.h"
#include "sampler.h"
#include "spec.h"
#include "unet.h"

struct sample_job {
    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e;
    int batch;
    struct unet_config model;
    int view;           /* sample_job_bind_nested: owns nothing, holds no weights of its own */
};

/* the forward-only graph of model at batch and its plan: what sample_job_init allocates and
 * what the server reserves for a sampling job (one function, so the two never differ). On
 * failure g and p still need graph_free / plan_free. */
int sample_plan(const struct unet_config *model, int batch, const struct backend *bk,
                struct graph *g, struct unet_io *io, struct plan *p, char *err, size_t errlen);
/* sample_plan's plan.total_bytes (the graph and plan freed) */
int sample_plan_bytes(const struct unet_config *model, int batch, const struct backend *bk,
                      int64_t *bytes, char *err, size_t errlen);

/* The sampling graph of model at batch planned inside a training job's reservation
 * (plan_make_nested): its weights are host's EMA block, read in place; its inputs, workspace
 * and arena lie over host's transient part. What train_plan reserves for a job's sample grids
 * (plan_reserve_nested(host, p) before host's exec_init). On failure g and p still need
 * graph_free / plan_free. */
int sample_job_plan_nested(const struct unet_config *model, int batch, const struct plan *host,
                           const struct graph *host_g, const struct backend *bk, struct graph *g,
                           struct unet_io *io, struct plan *p, char *err, size_t errlen);
/* A view for sample_job_run over a nested executor (exec_init_nested of sample_job_plan_nested's
 * g and p): it owns nothing (sample_job_free only clears it; the owner frees e, p and g) and
 * its weights are the host's EMA, so sample_job_copy_weights and sample_job_load refuse it (an
 * upload would overwrite the EMA). A run overwrites the host's inputs and arena. */
void sample_job_bind_nested(struct sample_job *view, const struct graph *g,
                            const struct unet_io *io, const struct plan *p, struct exec *e,
                            int batch, const struct unet_config *model);

/* bk: the backend it runs on (backend_load of the job's device); NULL: the CPU, as for
 * sample_plan */
int sample_job_init(struct sample_job *j, const struct unet_config *model, int batch,
                    int threads, const struct backend *bk, char *err, size_t errlen);
void sample_job_free(struct sample_job *j);
/* weights from a training job (its EMA weights when from_ema); -1 for a view */
int sample_job_copy_weights(struct sample_job *j, struct exec *train, const struct graph *tg,
                            int from_ema);
/* weights from a checkpoint (EMA weights when from_ema); -1 for a view */
int sample_job_load(struct sample_job *j, const struct safetensors *st, int from_ema, char *err,
                    size_t errlen);

enum sample_status { SAMPLE_OK = 0, SAMPLE_STOPPED = 1, SAMPLE_FAILED = -1 };

/* n images (n, C, S, S) in [-1, 1] into out; image i's noise depends only on (seed, i), so a
 * sample is the same whatever the batch. progress (may be NULL) is called after each denoising
 * step with done/total counted over all chunks of the batch. sc->stop is polled before every
 * step: when set, SAMPLE_STOPPED is returned at once (out incomplete). SAMPLE_FAILED when the
 * config gives no timesteps or a step fails. */
int sample_job_run(struct sample_job *j, const struct ddpm_schedule *sch,
                   const struct sampler_config *sc, uint64_t seed, int n, float *out,
                   void (*progress)(int done, int total, void *ctx), void *ctx);

#endif
