/* sample.h - generating images: a forward-only UNet graph at a sampling batch, its own plan and
 * allocation, weights taken from a checkpoint or a training job, and the DDPM/DDIM loop.
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
};

int sample_job_init(struct sample_job *j, const struct unet_config *model, int batch,
                    int threads, char *err, size_t errlen);
void sample_job_free(struct sample_job *j);
/* weights from a training job (its EMA weights when from_ema) */
int sample_job_copy_weights(struct sample_job *j, struct exec *train, const struct graph *tg,
                            int from_ema);
/* weights from a checkpoint (EMA weights when from_ema) */
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
