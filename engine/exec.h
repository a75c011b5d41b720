/* exec.h - the executor: takes a job's one allocation (plan.total_bytes), binds every tensor to
 * its planned address and runs forward, backward, clipping, AdamW and EMA through a backend.
 * Nothing is allocated after exec_init; a nested executor (exec_init_nested) allocates nothing.
 * On a backend with the step on the device (backend.h's step_* entries: CUDA) a training step
 * never makes the host wait: dropout's coordinates, the loss scale and clipping's norm are device
 * scalars, the loss and norm are read when logged (exec_step_log). Where the backend has graphs,
 * each kind of run (a micro-batch's forward and backward, the optimizer step, an evaluation
 * forward) runs as it comes the first time (convolution algorithms are measured then), is
 * captured the second time and replayed from then on, with the same results.
 */
#ifndef DDPMD_EXEC_H
#define DDPMD_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "graph.h"
#include "memplan.h"
#include "strategy.h"

enum exec_status {
    EXEC_OK = 0,
    EXEC_ERR_NOMEM = 1,   /* host memory (the executor's own bookkeeping) */
    EXEC_ERR_BACKEND = 2, /* the backend failed: a device error or an invalid call */
    EXEC_ERR_GUARD = 3,   /* a kernel wrote outside its tensor or the workspace (canary check) */
    EXEC_ERR_ARG = 4,
    EXEC_ERR_BUDGET = 5,  /* out of budget: the backend refused memory (BK_ERR_NOMEM): the
                           * reservation itself, or a library's request beyond it during a step;
                           * or a nested plan larger than its host's reservation */
};

/* why a call failed: the status it returned, and the backend's own status and op */
struct exec_error {
    int status;           /* enum exec_status; EXEC_OK when nothing failed */
    int bk_status;        /* enum bk_status of the failing backend call; 0 if not the backend's */
    int op;               /* graph op that failed; -1 outside an op */
    char msg[256];        /* names the cause: the call, the op, the bytes */
};

enum exec_profile_clock { EXEC_PROFILE_WALL = 1, EXEC_PROFILE_CPU = 2 };

struct exec_opts {
    int threads;
    int poison;           /* fill every arena storage with NaN after its last use */
    int check_guards;     /* verify the canary gaps (plan_opts.guard_bytes) after every op */
    int profile;          /* accumulate time per op (exec_profile): EXEC_PROFILE_WALL, or
                           * EXEC_PROFILE_CPU (the calling thread's CPU seconds: serial code and
                           * its share of each parallel region, robust to a busy machine under
                           * OMP_WAIT_POLICY=passive); 0 off: one branch per op */
    struct exec_error *init_error; /* may be NULL: where a failing exec_init says why */
    size_t budget;        /* the device budget the backend enforces (0: none): the reservation
                           * and any later request beyond it fail with EXEC_ERR_BUDGET */
    int eager;            /* never capture a graph (the backend's graph_*): every run as it
                           * comes. Graphs are also off with check_guards and profile, and for
                           * an offloading plan's steps (the optimizer runs on the host) */
};

/* seconds (exec_opts.profile's clock) accumulated since exec_init or the last
 * exec_profile_reset: per op type, per op of the graph, the optimizer step and the gradients'
 * zeroing */
struct exec_profile {
    double seconds[OP_COUNT];
    long calls[OP_COUNT];
    const double *op_seconds;   /* (g->n_ops) per op of the graph (a recomputed forward op:
                                 * both its runs) */
    double optim_seconds;
    long optim_calls;
    double zero_seconds;        /* zeroing the gradients before the backward writes them */
};

struct optim_config {
    float lr, beta1, beta2, eps, weight_decay;
    float clip;           /* max global gradient norm; 0 disables clipping */
    float ema_decay;      /* 0 disables EMA */
    int warmup;           /* linear warmup steps */
    int total_steps;      /* for the cosine schedule */
    int cosine;           /* 0: constant after warmup, 1: cosine decay to 0 at total_steps */
};

struct exec;

int exec_init(struct exec **out, const struct graph *g, const struct plan *p,
              const struct backend *bk, const struct exec_opts *opts);
void exec_free(struct exec *e);

/* An executor of a nested plan (plan_make_nested against host's plan) over host's allocation and
 * backend context: it allocates nothing. EXEC_ERR_BUDGET when sub does not fit host's
 * reservation (plan_reserve_nested was not called before host's exec_init), EXEC_ERR_ARG when sub
 * is not nested. Its parameters ARE host's weights or EMA (uploading one writes host's); a run
 * overwrites host's inputs and arena (upload host's inputs again before host's next step). host
 * outlives it; the two never run at once. opts->threads is ignored (host's context is used). */
int exec_init_nested(struct exec **out, const struct graph *g, const struct plan *sub,
                     struct exec *host, const struct exec_opts *opts);

/* A nested executor whose plan reads an offloading host's EMA (plan.weights_from_host): the
 * host's EMA (in host memory) uploaded into the sub-plan's own weight bytes; call it before
 * each run that follows a host step (a sample grid). Nothing to do (EXEC_OK) otherwise. */
int exec_nested_sync(struct exec *sub);

/* the plan e runs */
const struct plan *exec_plan(const struct exec *e);
/* the last failure of a call on e (status EXEC_OK when none has failed) */
const struct exec_error *exec_last_error(const struct exec *e);
/* "ok", "out of host memory", "backend error", "out of budget", ... */
const char *exec_status_name(int status);

/* device pointer of tensor id (valid for inputs, params, grads; arena tensors only while live) */
float *exec_tensor(struct exec *e, int id);
int exec_upload(struct exec *e, int id, const float *host);
int exec_download(struct exec *e, int id, float *host);
/* the persistent state of parameter id: its weights, EMA weights or AdamW moments */
enum exec_part { EXEC_PART_WEIGHT = 0, EXEC_PART_EMA, EXEC_PART_ADAM_M, EXEC_PART_ADAM_V };
int exec_download_part(struct exec *e, enum exec_part part, int id, float *host);
int exec_upload_part(struct exec *e, enum exec_part part, int id, const float *host);
static inline int exec_download_ema(struct exec *e, int id, float *host)
{
    return exec_download_part(e, EXEC_PART_EMA, id, host);
}
/* copies the current parameters into the EMA block and zeroes the AdamW state (EXEC_ERR_ARG for
 * an inference plan, which has neither; EMA and AdamW parts likewise) */
int exec_reset_state(struct exec *e);

/* one forward + backward over the whole graph (the plan's run order: with recomputation, a
 * segment's forward ops run again before its backward, each drawing its original's dropout
 * mask); parameter gradients are zeroed first when zero_grads (a micro-batch after the first
 * accumulates). dloss_scale multiplies the loss gradient (n / batch for a micro-batch of n of
 * an effective batch); in f16 the executor's loss scale multiplies it too. seed/step/sample_base feed dropout: sample_base is the
 * index of the micro-batch's first sample in the effective batch, so masks are drawn by the
 * sample's index there. loss (host) may be NULL. An inference plan has no backward:
 * EXEC_ERR_ARG. */
int exec_forward_backward(struct exec *e, int zero_grads, float dloss_scale, uint64_t seed,
                          uint64_t step, int sample_base, float *loss);
/* (loss non-NULL waits for the device to read it; NULL does not: the step's loss is in
 * exec_step_log's record of the optimizer step that follows) */
/* forward only (ops [0, n_fwd_ops)) in evaluation mode (dropout is the identity): for
 * sampling and validation. loss (host, may be NULL) gets the MSE output when the graph has one. */
int exec_forward(struct exec *e, float *loss);

/* One optimizer step's results, as exec_step_log gives them. */
struct exec_step_stats {
    float loss;       /* the step's loss: its micro-batches' losses times their dloss_scale
                       * (exec_forward_backward's), summed in double */
    float grad_norm;  /* the global gradient norm before clipping, unscaled */
    float loss_scale; /* f16: the loss scale after the step's update; 1 otherwise */
    int applied;      /* 0: f16 skipped the step (inf/NaN gradients) */
};
#define EXEC_STEP_LOG 256 /* the optimizer steps exec_step_log can give at once */

/* The optimizer steps of the training executor e (or its nested ones' host) since the last call,
 * oldest first: *n of them, at most max. Older ones than EXEC_STEP_LOG are lost (*n counts only
 * those given): call it at least every EXEC_STEP_LOG steps. Waits for the device: the one place
 * a training loop needs to, when it logs. */
int exec_step_log(struct exec *e, struct exec_step_stats *out, int max, int *n);

/* learning rate of 0-based step s */
float optim_lr(const struct optim_config *c, int64_t s);
/* clip (global norm), AdamW with bias correction at 1-based step t, EMA. grad_norm: the norm
 * before clipping (host, may be NULL: on a backend with the step on the device, asking for it
 * waits for the device; exec_step_log gives it later). In f16 training: loss-scaled, see struct
 * loss_scaler. */
int exec_optimizer_step(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                        float *grad_norm);

/* Dynamic loss scaling, on by itself in an f16 training plan (plan.strategy.loss_scale): the
 * executor multiplies the loss gradient by scale (exec_forward_backward), and exec_optimizer_step
 * divides the gradients by it (the norm it reports and clips is the unscaled one). A step whose
 * gradients hold an inf or NaN changes nothing - no AdamW, no EMA - and the scale is multiplied
 * by backoff; growth_interval finite steps in a row multiply it by growth (never to inf). Step
 * semantics: a skipped step still consumes its step number (data, noise, learning rate and RNG
 * position follow the caller's global step), but AdamW's bias-correction step counts applied
 * steps only: exec_optimizer_step(t) uses t - skipped. The state is a run's: checkpoints store it
 * and a resume restores it (exec_loss_scaler). */
struct loss_scaler {
    float scale;
    int good_steps;      /* finite steps in a row since the scale last changed */
    int64_t skipped;     /* steps skipped over the run */
};
void loss_scaler_init(struct loss_scaler *s, const struct strategy_loss_scale *c);
/* after a step: its gradients were all finite or not */
void loss_scaler_update(struct loss_scaler *s, const struct strategy_loss_scale *c, int finite);
/* the executor's loss scale state (scale 1 and never skipping outside f16 training). Where the
 * device keeps it, this waits for the device and copies it here; what the caller writes into it
 * before the next step is the state that step starts from (a resume's). */
struct loss_scaler *exec_loss_scaler(struct exec *e);

/* NULL unless exec_opts.profile was set */
const struct exec_profile *exec_get_profile(struct exec *e);
void exec_profile_reset(struct exec *e);

/* the highest byte of the arena written since exec_init (a scan for the fill pattern) */
size_t exec_arena_high_water(struct exec *e);

/* Benchmarks (bench/kernel_bench.c): runs run op k of the plan `reps` times back to back (its
 * conversions, and a fused guest inside its host; a guest alone is no kernel: 0 seconds), then
 * waits for the device; *seconds per run, wall clock. Reads and writes whatever the arena holds:
 * for timing kernels, not for results (a step afterwards starts from fresh inputs). */
int exec_time_op(struct exec *e, int k, int reps, double *seconds);
/* an entry of the backend's table and the dtype (enum bk_dtype) an op takes it on */
struct exec_need {
    enum bk_op op;
    int dtype;
};
#define EXEC_NEEDS_MAX 4
/* The entries run op k of e's plan calls (run_op's dispatch: exec_time_op and every step run it
 * with no other; both read exec.c's op table, each op type's needs written beside its run) and
 * its workspace queries (memplan.c), on their dtypes, into need (at most EXEC_NEEDS_MAX); their
 * count, 0 for a fused guest. exec_init refuses a plan needing an entry
 * the backend lacks; the step on the device (step_*) is asked where it is chosen.
 * test_backend_ops runs each op alone with every other kernel entry recording a call. */
int exec_op_needs(const struct exec *e, int k, struct exec_need *need);
/* the most bytes the backend held at once on the job's context since exec_init (its measured
 * device high-water mark; 0 where the backend does not measure it) */
size_t exec_device_high_water(const struct exec *e);

#endif
