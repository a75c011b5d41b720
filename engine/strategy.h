/* strategy.h - how a training step is fitted into memory: precision, micro-batches with gradient
 * accumulation, activation recomputation and offload. A resolved strategy (no *_AUTO left) goes
 * into plan_opts and decides the plan; the planner's search resolves AUTO fields against a device
 * budget. The spec's `memory` object (server/spec.c, openapi.yaml TrainSpec) fills one.
 */
#ifndef DDPMD_STRATEGY_H
#define DDPMD_STRATEGY_H

#include <stdint.h>

enum strategy_precision {
    STRATEGY_PRECISION_AUTO = -1,
    STRATEGY_PRECISION_F32 = 0,   /* everything fp32 */
    STRATEGY_PRECISION_BF16 = 1,  /* 16-bit conv/GEMM inputs and saved activations, fp32 master */
    STRATEGY_PRECISION_F16 = 2,   /* as bf16, with dynamic loss scaling */
};

enum strategy_recompute {
    STRATEGY_RECOMPUTE_AUTO = -1,
    STRATEGY_RECOMPUTE_NONE = 0,
    STRATEGY_RECOMPUTE_ATTENTION = 1, /* attention blocks keep only their inputs */
    STRATEGY_RECOMPUTE_RESBLOCK = 2,  /* res blocks and attention blocks */
    STRATEGY_RECOMPUTE_LEVEL = 3,     /* a whole resolution level at a time */
};

/* dynamic loss scaling (f16): an inf/NaN gradient multiplies the scale by backoff and skips the
 * step; growth_interval finite steps in a row multiply it by growth */
struct strategy_loss_scale {
    float initial;       /* 65536 */
    float growth;        /* 2 */
    float backoff;       /* 0.5 */
    int growth_interval; /* 2000 */
};

struct strategy {
    int precision;       /* enum strategy_precision */
    int micro_batch;     /* samples per forward/backward; 0 = auto; the effective batch
                          * (train.batch) need not be a multiple: the last one is smaller */
    int recompute;       /* enum strategy_recompute */
    int offload;         /* -1 auto, 0 off, 1: AdamW moments, fp32 master weights and EMA in
                          * host memory, the optimizer on host threads */
    struct strategy_loss_scale loss_scale;
    int sample_batch;    /* images per forward of a training job's sample grids, which run in
                          * chunks of it (noise is drawn by image index: any chunking gives the
                          * same images); 0 = auto: the search takes the largest that fits, at
                          * most min(output.samples, 16) */
    int allow_half;      /* precision AUTO may pick a 16-bit precision for speed (the spec's
                          * memory.allow_16bit): the search then orders fp32 and 16-bit
                          * candidates together by predicted time; 0: fp32 first, 16 bits only
                          * when no fp32 plan fits */
};

/* every field AUTO (micro_batch 0), loss scaling at its defaults */
static inline struct strategy strategy_auto(void)
{
    struct strategy s = {STRATEGY_PRECISION_AUTO, 0, STRATEGY_RECOMPUTE_AUTO, -1,
                         {65536.0f, 2.0f, 0.5f, 2000}, 0, 0};
    return s;
}

/* the plain fp32 full-batch step of today */
static inline struct strategy strategy_plain(int batch)
{
    struct strategy s = {STRATEGY_PRECISION_F32, batch, STRATEGY_RECOMPUTE_NONE, 0,
                         {65536.0f, 2.0f, 0.5f, 2000}, 0, 0};
    return s;
}

#endif
