/* train_step.h - one training step, the one every loop runs (`ddpmd train` and the server's jobs,
 * `ddpmd demo`, the server's probe): the effective batch's timesteps and noise drawn by (seed,
 * step, sample, element), its micro-batches forward and backward (gradients accumulated, the
 * loss gradient scaled by n / batch and, in f16, by the loss scale; recomputation and offload as
 * the plan says), then one optimizer step (clipping, AdamW, EMA). Its memory is the job's plans'
 * one reservation (train_plans.h) and the host buffers of one effective batch.
 */
#ifndef DDPMD_TRAIN_STEP_H
#define DDPMD_TRAIN_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "ddpm.h"
#include "exec.h"
#include "sampler.h"
#include "strategy.h"
#include "train_plans.h"

/* what a job's step needs to know */
struct train_step_config {
    struct train_shape shape;
    int threads;                    /* the job's thread count (its numbers are a function of it) */
    size_t budget;                  /* device bytes the backend enforces (exec_opts.budget); 0:
                                     * none. Nothing beyond it is ever allocated. */
    /* the diffusion the model learns */
    int timesteps;
    enum ddpm_beta_schedule beta_schedule;
    double beta_start, beta_end;
    enum sampler_prediction prediction;  /* the model's target: the noise, or v */
};

struct train_step {
    struct train_plans tp;
    /* the step at the micro-batch (e), the uneven last micro-batch (re, nested in e's
     * reservation, sharing its parameters, gradients and optimizer state; NULL when none) and
     * the sample grids (se, nested too, weights read in place from e's EMA; NULL when none) */
    struct exec *e, *re, *se;
    struct ddpm_schedule sch;
    enum sampler_prediction prediction;
    int batch;
    size_t per;                 /* elements of one image */
    /* the effective batch on the host, (batch, C, H, W) each but t (batch): sample i of it is
     * drawn by i, its index in the effective batch, whatever micro-batch uploads it. x0 is the
     * caller's to fill before each step (the data loader writes it). */
    float *x0, *eps, *xt, *tgt, *tf;
    int *ti;
};

/* plans (train_plans_make under st, NULL: the plain step), allocates the one reservation and the
 * host buffers; on failure err says why (train_step_free frees what was made) */
int train_step_init(struct train_step *ts, const struct train_step_config *c,
                    const struct strategy *st, char *err, size_t errlen);
void train_step_free(struct train_step *ts);
/* the host bytes of the effective batch train_step_init allocates (x0, eps, xt, tgt of batch
 * images of per floats, tf, ti): a job's host plan, TRAIN_HOST_STEP */
int64_t train_step_host_bytes(int batch, size_t per);

/* what one step did */
struct train_step_result {
    float loss;                 /* the mean over the effective batch (inf/NaN when it overflowed) */
    float grad_norm;            /* before clipping */
    float lr;                   /* optim_lr at the step */
    int skipped;                /* f16: the step had an inf/NaN gradient and changed nothing */
};

/* Step `step` (0-based) on ts->x0: timesteps and noise drawn by (seed, step), xt and the target
 * made, the micro-batches forward and backward (dropout drawn by the sample's index in the
 * effective batch), then the optimizer at step + 1. r NULL: the step's results are not read, so
 * that the host does not wait for the device inside a step (a loop reads them later, when it
 * logs: train_step_read); otherwise *r, waiting for the device. Nonzero on a failure, with the
 * executor's reason in err ("samples 0..3 of the batch: ..." for a micro-batch). */
int train_step_run(struct train_step *ts, uint64_t seed, int64_t step,
                   const struct optim_config *oc, struct train_step_result *r, char *err,
                   size_t errlen);

/* The results of the steps run since the last call, oldest first (exec_step_log: waits for the
 * device): *n of them, at most max (EXEC_STEP_LOG: call it at least that often, older ones are
 * lost). Nonzero with err on a failure. */
int train_step_read(struct train_step *ts, struct exec_step_stats *out, int max, int *n,
                    char *err, size_t errlen);

/* The loss of the model on ts->x0 in evaluation mode (no dropout, no gradient): timesteps t
 * (batch) and noise drawn by (seed, step); nonzero on a failure. Validation runs it on held-out
 * images at fixed timesteps and noise. */
int train_step_eval(struct train_step *ts, uint64_t seed, int64_t step, const int *t,
                    float *loss);

#endif
