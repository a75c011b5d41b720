/* train_plans.h - what a training job's step runs in, planned before a byte is allocated: the
 * step's graph at the micro-batch, the uneven last micro-batch (when the micro-batch does not
 * divide the batch) and the sample grid, the last two nested in the first's one reservation; and
 * the planner's search over them (train_plans_search: planner.h's target), so that `ddpmd plan`,
 * the server's admission and the job itself agree to the byte.
 */
#ifndef DDPMD_TRAIN_PLANS_H
#define DDPMD_TRAIN_PLANS_H

#include <stddef.h>

#include "backend.h"
#include "cost.h"
#include "graph.h"
#include "memplan.h"
#include "planner.h"
#include "strategy.h"
#include "unet.h"

/* a job as its step is planned */
struct train_shape {
    struct unet_config model;
    int batch;                      /* the effective batch: what the optimizer steps on */
    int grid_images;                /* images of a sample grid (output.samples), made in chunks
                                     * of at most min(grid_images, 16); 0: the job draws none */
    const struct backend *backend;  /* what it is planned for and runs on; NULL: the CPU */
    int deterministic;              /* parity mode (backend.h's set_parity: no TF32, only
                                     * deterministic algorithms, bit-identical runs; the CPU's
                                     * direct convolutions); 0: fast mode (the CPU: Winograd) */
};

/* s's backend, with the calling thread's mode set from s->deterministic (the CUDA backend's
 * workspace sizes depend on it): every plan of s, wherever it is made (`ddpmd plan`, the
 * server's admission, the job), and the job's executor context are made in s's mode */
const struct backend *train_shape_backend(const struct train_shape *s);

/* A job's graphs and plans: the step at the micro-batch (g, p: p's reservation covers the two
 * nested plans), the uneven last micro-batch when micro does not divide the batch (rg, rp: the
 * same model at `rest` samples, sharing p's parameters, gradients, moments and EMA,
 * plan_make_shared) and the sample grid (sg, sp: plan_make_nested over p's EMA; none when
 * grid_images is 0). */
struct train_plans {
    int micro;                  /* samples per micro-batch (the batch without micro-batches) */
    int grid;                   /* images per forward of the sample grids (strategy.sample_batch,
                                 * or min(grid_images, 16)); 0: no grid */
    int rest;                   /* samples of the uneven last micro-batch; 0 when micro divides */
    struct graph g, rg, sg;
    struct unet_io io, rio, sio;
    int target, rtarget;
    struct plan p, rp, sp;
};

/* builds and plans them for s under st (NULL: the plain fp32 step of the whole batch); on
 * failure err says why. train_plans_free frees them (also after a failure). */
int train_plans_make(struct train_plans *tp, const struct train_shape *s,
                     const struct strategy *st, char *err, size_t errlen);
void train_plans_free(struct train_plans *tp);

/* The planner's search for s (planner.h): the strategy `want` (fields forced or AUTO) against
 * budget device bytes (0: none), each candidate built and planned as train_plans_make does, its
 * step time predicted by m. plan_all: every candidate planned (`ddpmd plan --all`). -1 with
 * r->why in err when nothing fits (the smallest budget that would) or a forced strategy cannot
 * run; r is filled either way and freed with planner_result_free. */
int train_plans_search(const struct train_shape *s, const struct strategy *want, size_t budget,
                       const struct cost_model *m, int plan_all, struct planner_result *r,
                       char *err, size_t errlen);

/* A job's host bytes beside its device plan, by part: what its process holds in host memory for
 * its data, its step's batch, its files and images (on the cpu device the same memory as the
 * plan: the pool reserves the peak below on top of it). The parts are counted by the modules
 * that allocate them (dataset.c, train_step.c, checkpoint.c, image.c, plot.c: the server's
 * train_host_plan and sample_host_plan fill them); the engine says when each is held. */
enum train_host_part {
    TRAIN_HOST_STEP = 0,    /* the step's effective batch (train_step) or the sampler's chunk
                             * (generate_run), held throughout */
    TRAIN_HOST_WEIGHTS_IN,  /* a checkpoint read: a training job's streamed (resume,
                             * init_from: its header and one tensor's staging), a sampling
                             * job's as its file's bytes (train_sample_host_plan says why);
                             * before the data loads */
    TRAIN_HOST_DATA,        /* the dataset as held (dataset_plan_bytes), from its load on */
    TRAIN_HOST_DATA_LOAD,   /* while the dataset loads: one image's decode, the file names,
                             * the split's lists */
    TRAIN_HOST_LOADER,      /* the prefetch ring of batches and the order's permutation */
    TRAIN_HOST_LOG,         /* the loss history (its capacity at the last step) */
    TRAIN_HOST_CHECKPOINT,  /* a checkpoint written: one tensor's staging and the header */
    TRAIN_HOST_GRID,        /* a sample grid: its images as float and the PNG's canvas */
    TRAIN_HOST_PLOT,        /* loss.csv's text and loss.png's canvas */
    TRAIN_HOST_PART_COUNT
};

struct train_host {
    int64_t part[TRAIN_HOST_PART_COUNT];
};

/* "step", "weights_in", "data", ... (snake_case of the part) */
const char *train_plans_host_part_name(enum train_host_part k);
/* The most the job holds at once, over its phases in order: the weights read (STEP +
 * WEIGHTS_IN), the data loaded (STEP + DATA + DATA_LOAD), then training (STEP + DATA + LOADER
 * + LOG + the largest of CHECKPOINT, GRID and PLOT, which never overlap). */
int64_t train_plans_host_peak(const struct train_host *h);

#endif
