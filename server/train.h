/* train.h - a training job from a spec to checkpoints, sample grids, loss.csv and a loss curve:
 * data loading ahead on its own thread, Philox-drawn timesteps and noise (so a resumed run draws
 * exactly what an uninterrupted one would), validation loss at fixed timesteps, atomic
 * checkpoints keeping the last K, and a clean stop on request (SIGINT/SIGTERM in the CLI).
 */
#ifndef DDPMD_TRAIN_H
#define DDPMD_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "spec.h"

struct train_opts {
    const char *out_dir;            /* created if missing */
    int resume;                     /* continue from the newest checkpoint in out_dir */
    int progress;                   /* 1: a progress bar (terminal), 0: one JSON line per log */
    volatile sig_atomic_t *stop;    /* set asynchronously: checkpoint, then return */
    int64_t stop_after;             /* > 0: stop (with a checkpoint) once this step is done */
    int quiet;                      /* no per-step output (tests) */
};

enum train_result { TRAIN_DONE = 0, TRAIN_STOPPED = 1, TRAIN_FAILED = -1 };

/* runs to spec->steps (or a stop); err gets a message on TRAIN_FAILED */
int train_run(const struct train_spec *spec, const struct train_opts *o, char *err,
              size_t errlen);

/* path of the newest checkpoint in out_dir/checkpoints, or -1 when there is none */
int train_latest_checkpoint(const char *out_dir, char *path, size_t len, int64_t *step);

#endif
