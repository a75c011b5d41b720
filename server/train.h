/* train.h - a training job from a spec to checkpoints, sample grids, loss.csv and a loss curve:
 * data loading ahead on its own thread, the engine's training step (train_step.h: Philox-drawn
 * timesteps and noise, so a resumed run draws exactly what an uninterrupted one would),
 * validation loss at fixed timesteps, atomic checkpoints keeping the last K, progress for a
 * terminal or the server (child.h), and a clean stop on request (SIGINT/SIGTERM in the CLI).
 */
#ifndef DDPMD_TRAIN_H
#define DDPMD_TRAIN_H

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdint.h>

#include "cost.h"
#include "graph.h"
#include "memplan.h"
#include "planner.h"
#include "sampler.h"
#include "spec.h"
#include "strategy.h"
#include "train_plans.h"
#include "unet.h"

/* what --resume asks for */
enum train_resume {
    TRAIN_RESUME_NO = 0,       /* a fresh run; an error when out_dir holds checkpoints */
    TRAIN_RESUME_REQUIRED = 1, /* continue from the newest usable checkpoint; none is an error */
    TRAIN_RESUME_IF_ANY = 2,   /* continue when there is one, else start fresh (and say so) */
};

/* what a run did, for callers that must tell a resume from a restart */
struct train_stats {
    int64_t start_step;        /* the step the run began at: 0 fresh, N resumed at step N */
    int64_t steps_run;         /* training steps executed by this call */
    int resumed;               /* 1 when weights and state came from a checkpoint */
    /* the training steps after this call's first (its warm-up: the libraries' first calls),
     * each from loading its batch to the end of its optimizer step: how many, their wall
     * seconds and the CPU seconds of the thread that ran them (serial code and its share of
     * every parallel region: with OMP_WAIT_POLICY=passive, the step time of an idle machine
     * however busy this one is), summed, and the least CPU seconds one took */
    int64_t steps_timed;
    double step_wall_s, step_cpu_s, step_cpu_min_s;
    /* the host bytes the run held by part (train_plans.h): its dataset, loader, step buffers and
     * loss history as allocated, its transients (a checkpoint read or written, a grid, the plot,
     * the data's decode) by the same functions as train_host_plan, from its own graph and data */
    struct train_host host;
};

struct train_opts {
    const char *out_dir;            /* created if missing; at most FSIO_FINAL_MAX - 64 bytes */
    int resume;                     /* enum train_resume */
    int progress;                   /* 1: a progress bar (terminal), 0: one JSON line per event */
    volatile sig_atomic_t *stop;    /* set asynchronously: checkpoint, then return */
    int64_t stop_after;             /* > 0: stop (with a checkpoint) once this step is done */
    int quiet;                      /* no per-step output (tests) */
    int names_only;                 /* messages name a file by its last part, not its path (a
                                     * server's job: its client names files by ids) */
    struct train_stats *stats;      /* filled when not NULL */
    /* how the step fits into memory (NULL: the search's choice for the spec, under cost).
     * Resolved: no AUTO field; micro_batch 0 or >= train.batch is the whole batch. train.batch
     * stays the effective batch: the loader delivers it, and its gradient (the loss normalised
     * over all of it) is what the optimizer steps on, whatever the micro-batch. */
    const struct strategy *strategy;
    const struct cost_model *cost;  /* the search's cost model (NULL: the compiled-in one) */
};

enum train_result { TRAIN_DONE = 0, TRAIN_STOPPED = 1, TRAIN_FAILED = -1 };

/* Runs to spec->steps (or a stop); err gets a message on TRAIN_FAILED.
 *
 * Durability: every file (checkpoints, sample grids, loss.csv, loss.png) is written atomically
 * (fsio_write_atomic) and every failed write fails the run with its reason; temporaries that an
 * interrupted earlier run left in out_dir are removed at the start. A stop request (o->stop) is
 * honoured between training steps, validation batches and sampling steps: the run writes a
 * checkpoint of the last finished step (unless it has one) and returns TRAIN_STOPPED, and a
 * resumed run first writes the sample grid due at its start step when that file is missing.
 *
 * Resume: the newest checkpoint named exactly step-%08lld.safetensors (a regular file) that opens
 * is used; an unreadable newer one is renamed to NAME.corrupt with a message on stderr. Every
 * field of the checkpoint's spec must equal this spec's, except train.steps (not below the
 * checkpoint's step), output.* and init_from, whose changes are stated on stderr.
 *
 * Progress (not quiet): on a terminal a bar and "sampling 12/50"; otherwise JSON lines on
 * stdout, each an object whose "event" says what it is ("step", "validation", "sampling",
 * "checkpoint", "samples", "stopped", "done"), see train.c report_*. */
int train_run(const struct train_spec *spec, const struct train_opts *o, char *err,
              size_t errlen);

/* path of the newest checkpoint in out_dir/checkpoints (an exact step-%08lld.safetensors name of
 * a regular file), or -1 when there is none */
int train_latest_checkpoint(const char *out_dir, char *path, size_t len, int64_t *step);

/* A job's host plan (train_plans.h's parts: every host byte it holds beside its device plan)
 * for s, whose dataset holds images (< 0: Fashion-MNIST's, or an upload's count from its
 * dataset.json) of at most max_pixels each before resizing (< 0: an upload's dataset.json, else
 * the decoder's limit). The pool's admission reserves train_plans_host_peak of it on the cpu
 * device; the child counts the same parts (train_stats.host). -1 with err when the model cannot
 * be built. */
int train_host_plan(const struct train_spec *s, int64_t images, int64_t max_pixels,
                    struct train_host *h, char *err, size_t errlen);

/* A sampling job's host plan (`ddpmd sample` of n images in chunks of batch from a checkpoint
 * of ckpt_bytes (< 0: the size checkpoint_save writes) of model, sampled by g's graph): the
 * checkpoint's bytes as if read whole (TRAIN_HOST_WEIGHTS_IN), generate_run's chunk
 * (TRAIN_HOST_STEP) and the images as float with the grid's PNG (TRAIN_HOST_GRID). The child
 * streams the checkpoint (its header and one tensor, checkpoint_stream_plan_bytes); the rest
 * of the part stands in for what no part counts yet: the backend's kernels for the model
 * (oneDNN's JIT code at the first forward, ~4.6 MiB for fmnist-tiny), of which the process
 * baseline holds only the probe model's. Reserving the stream alone needs those planned. */
void train_sample_host_plan(const struct unet_config *model, int timesteps, int n, int batch,
                            const struct graph *g, int64_t ckpt_bytes, struct train_host *h);

/* the spec's step as the engine plans it (its model, batch, sample grid and backend) */
struct train_shape train_shape_of(const struct train_spec *s);

/* The planner's search for s (train_plans_search): its memory strategy against
 * memory.vram_budget, under cost model m (NULL: the compiled-in one). plan_all: every candidate
 * planned (`ddpmd plan`). -1 with r->why in err when nothing fits (the smallest budget that
 * would) or a forced strategy cannot run; r is filled either way and freed with
 * planner_result_free. */
int train_search(const struct train_spec *s, const struct cost_model *m, int plan_all,
                 struct planner_result *r, char *err, size_t errlen);
/* the job's step plan and sampling plan, built exactly as train_run does (its strategy the
 * search's choice under m): p's reservation covers the nested grid sp (and the uneven last
 * micro-batch, whose plan is dropped here); the caller frees all four, also on failure */
int train_plan_job(const struct train_spec *s, const struct cost_model *m, struct graph *g,
                   struct unet_io *io, int *target, struct plan *p, struct graph *sg,
                   struct unet_io *sio, struct plan *sp, char *err, size_t errlen);
/* a plan's bytes by part as JSON: {"device": {part: bytes}, "host": {...}, "device_bytes",
 * "host_bytes"} (part names: plan_part_name); NULL when out of memory */
cJSON *train_parts_json(const struct plan_part_bytes *parts, size_t device, size_t host);
/* a search's candidates as JSON (`ddpmd plan --json`, the server): batch, vram_budget,
 * candidates [{precision, micro_batch, recompute, offload, sample_batch (planned ones: the
 * grid's chunk), predicted_step_seconds, planned, bound_bytes (unplanned ones a lower bound
 * ruled out), bytes, fits, failed, chosen}], chosen (index or null), why */
cJSON *train_search_json(const struct planner_result *r, int batch);
/* the cost model: bench/calibrate's file at path (the edge reads $DDPMD_COST_MODEL), else (NULL
 * or "") the compiled-in defaults; -1 with err naming DDPMD_COST_MODEL when the file is bad */
int train_cost_model(struct cost_model *m, const char *path, char *err, size_t errlen);
/* the grid's sampler: 50-step DDIM (leading spacing, eta 0) with the spec's prediction, its
 * steps clamped to the schedule's diffusion.timesteps (a valid spec may have fewer than 50) */
void train_sampler_config(const struct train_spec *s, struct sampler_config *sc);

#endif
