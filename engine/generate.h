/* generate.h - images from a model: the forward-only UNet graph at a sampling batch with its own
 * plan and allocation, or a view of a training job's nested sub-plan (weights read in place from
 * the job's EMA, inside its one reservation), and the denoising loop that runs it, one step of
 * the DDPM/DDIM math (sampler.h) after each forward.
 */
#ifndef DDPMD_GENERATE_H
#define DDPMD_GENERATE_H

#include <stdint.h>

#include "exec.h"
#include "graph.h"
#include "memplan.h"
#include "sampler.h"
#include "unet.h"

struct generator {
    struct graph g;
    struct unet_io io;
    struct plan p;
    struct exec *e;
    int batch;
    struct unet_config model;
    int view;           /* generate_bind_nested: owns nothing, holds no weights of its own */
};

/* the forward-only graph of model at batch and its plan: what generate_init allocates and what
 * the server reserves for a sampling job (one function, so the two never differ), planned in
 * parity mode (the calling thread's set_parity(1): the same seed gives the same bytes). On
 * failure g and p still need graph_free / plan_free. */
int generate_plan(const struct unet_config *model, int batch, const struct backend *bk,
                  struct graph *g, struct unet_io *io, struct plan *p, char *err, size_t errlen);

/* The sampling graph of model at batch planned inside a training job's reservation
 * (plan_make_nested): its weights are host's EMA block, read in place; its inputs, workspace
 * and arena lie over host's transient part. What train_plans_make reserves for a job's sample
 * grids (plan_reserve_nested(host, p) before host's exec_init). On failure g and p still need
 * graph_free / plan_free. */
int generate_plan_nested(const struct unet_config *model, int batch, const struct plan *host,
                         const struct graph *host_g, const struct backend *bk, struct graph *g,
                         struct unet_io *io, struct plan *p, char *err, size_t errlen);
/* A view for generate_run over a nested executor (exec_init_nested of generate_plan_nested's g
 * and p): it owns nothing (generate_free only clears it; the owner frees e, p and g) and its
 * weights are the host's EMA, so generate_copy_weights and checkpoint_load_generator refuse it
 * (an upload would overwrite the EMA). A run overwrites the host's inputs and arena. */
void generate_bind_nested(struct generator *view, const struct graph *g, const struct unet_io *io,
                          const struct plan *p, struct exec *e, int batch,
                          const struct unet_config *model);

/* bk: the backend it runs on (backend_load of the job's device); NULL: the CPU, as for
 * generate_plan */
int generate_init(struct generator *j, const struct unet_config *model, int batch, int threads,
                  const struct backend *bk, char *err, size_t errlen);
void generate_free(struct generator *j);
/* weights from a training job (its EMA weights when from_ema); -1 for a view */
int generate_copy_weights(struct generator *j, struct exec *train, const struct graph *tg,
                          int from_ema);

enum generate_status { GENERATE_OK = 0, GENERATE_STOPPED = 1, GENERATE_FAILED = -1 };

/* the host bytes generate_run allocates for chunks of batch images of per floats under a
 * schedule of T timesteps (x, eps, noise, x_prev, t, the timestep list): a job's host plan */
int64_t generate_host_bytes(int batch, size_t per, int T);
/* n images (n, C, S, S) in [-1, 1] into out; image i's noise depends only on (seed, i), so a
 * sample is the same whatever the batch. progress (may be NULL) is called after each denoising
 * step with done/total counted over all chunks of the batch. sc->stop is polled before every
 * step: when set, GENERATE_STOPPED is returned at once (out incomplete). GENERATE_FAILED when
 * the config gives no timesteps or a step fails. */
int generate_run(struct generator *j, const struct ddpm_schedule *sch,
                 const struct sampler_config *sc, uint64_t seed, int n, float *out,
                 void (*progress)(int done, int total, void *ctx), void *ctx);

#endif
