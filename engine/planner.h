/* planner.h - the strategy search: given a job's effective batch, a strategy whose fields are
 * forced or AUTO, and a device budget, the fastest predicted plan that fits. Candidates are the
 * cross product of the strategies the engine can run today (planner_available), ordered by the
 * cost model's prediction; they are planned exactly in that order until one fits, a candidate
 * whose cheap lower bound is already over the budget skipped unplanned. The caller
 * supplies how one candidate is built and planned (engine/train_plans.c: the job's graph at the
 * micro-batch and its plan with the nested sample grid), so the search, `ddpmd plan`, `ddpmd
 * train` and the server's admission agree to the byte.
 */
#ifndef DDPMD_PLANNER_H
#define DDPMD_PLANNER_H

#include <stddef.h>

#include "cost.h"
#include "graph.h"
#include "memplan.h"
#include "strategy.h"

/* how the caller builds and plans one candidate (a resolved strategy) */
struct planner_target {
    void *ctx;
    /* the training graph at micro-batch s->micro_batch with s's precision; 0 or -1 */
    int (*build)(void *ctx, const struct strategy *s, struct graph *g);
    /* g's exact plan under s (the job's reservation: its nested parts included); 0 or -1.
     * s->sample_batch 0 leaves the sample grid's chunk to the target: the largest whose plan
     * fits budget (0: none), else the smallest; p->strategy.sample_batch says which. */
    int (*plan)(void *ctx, const struct strategy *s, const struct graph *g, size_t budget,
                struct plan *p);
    /* A lower bound of plan's device bytes under s (the smallest sample grid chunk when s
     * leaves it open), in a fraction of plan's time: tight 0 the cheapest (what persists),
     * 1 a tighter one; 0 or -1. NULL: every candidate up to the chosen one is planned. */
    int (*bound)(void *ctx, const struct strategy *s, const struct graph *g, int tight,
                 size_t *bytes);
};

struct planner_candidate {
    struct strategy strategy;      /* resolved: no AUTO field */
    double predicted_s;            /* one effective-batch step (cost_predict_step_seconds) */
    int planned;                   /* the exact plan was made (bytes below are known) */
    size_t bound_bytes;            /* a lower bound of device_bytes (planner_target.bound); 0:
                                    * not bounded. A candidate bounded over the budget is not
                                    * planned: it cannot fit. */
    int failed;                    /* building or planning it failed */
    struct plan_part_bytes parts[PLAN_PART_COUNT];
    size_t device_bytes, host_bytes;
    int fits;                      /* planned and device_bytes <= budget */
};

struct planner_result {
    struct planner_candidate *cand; /* the fp32 ones, then (only when none fits, or with
                                     * plan_all) the 16-bit ones, each group ordered by
                                     * predicted_s */
    int n_cand;
    int chosen;                    /* index into cand; -1 when nothing fits */
    int smallest;                  /* the candidate with the fewest device bytes (when nothing
                                    * fits, each one whose bound is below it was planned); -1
                                    * when none planned */
    size_t budget;                 /* 0: none */
    char why[320];                 /* the reason for the choice, or for the failure */
};

enum planner_status {
    PLANNER_OK = 0,
    PLANNER_ERR_NOFIT = 1,         /* no candidate fits: why names the smallest budget and plan */
    PLANNER_ERR_ARG = 2,           /* a forced strategy the engine cannot run, a bad batch */
    PLANNER_ERR_BUILD = 3,         /* every candidate failed to build or plan */
    PLANNER_ERR_NOMEM = 4,
    PLANNER_ERR_STOPPED = 5,       /* the thread's guard said stop (planner_guard) */
    PLANNER_ERR_MEMORY = 6,        /* the graphs and plans held passed the guard's max_bytes */
};

/* A search's guard, set on the calling thread around the searches it makes (the server's
 * planning worker: a deadline and a memory cap per admission planning). planner_search polls
 * stop before each candidate's graph, bound and plan, and counts the bytes it holds (its
 * graphs' structures, and the plan being made's per-tensor arrays) against max_bytes; either
 * ends the search at once: PLANNER_ERR_STOPPED or PLANNER_ERR_MEMORY, no candidate chosen nor
 * smallest, why the reason; the guard's why says which (0: neither) and peak_bytes the most the
 * search held. NULL clears it; without one a search is unguarded. */
struct planner_guard {
    int (*stop)(void *ctx);        /* nonzero: give up; NULL: never */
    void *ctx;
    size_t max_bytes;              /* 0: no cap */
    int why;                       /* out: 0, PLANNER_ERR_STOPPED or PLANNER_ERR_MEMORY */
    size_t peak_bytes;             /* out: the largest count of the guarded searches */
};
void planner_guard_set(struct planner_guard *g);

/* Search. want: forced fields and AUTO ones (micro_batch 0 = auto; sample_batch 0 = auto;
 * precision AUTO prefers fp32: a 16-bit precision changes the numbers a job computes, so it is
 * picked only when no fp32 candidate fits; unless want->allow_half, which lets it pick 16 bits
 * wherever the cost model predicts them faster). budget 0: no limit. plan_all: plan every candidate
 * exactly (`ddpmd plan --all`); otherwise in order until the first that fits, those bounded over
 * the budget skipped, and when nothing fits, by bound, until the smallest is known. r is filled
 * in every case and freed with planner_result_free. */
int planner_search(const struct strategy *want, int batch, size_t budget,
                   const struct cost_model *m, const struct planner_target *t, int plan_all,
                   struct planner_result *r);
void planner_result_free(struct planner_result *r);

/* whether the engine and the training loop can run s (fields resolved) at effective batch */
int planner_available(const struct strategy *s, int batch);

/* "f32", "bf16", "f16" / "none", "attention", "resblock", "level" */
const char *planner_precision_name(int precision);
const char *planner_recompute_name(int recompute);
/* "f32, micro-batch 8 (the whole batch), recompute none, offload off" (and ", grid chunks of
 * 4" when s->sample_batch is set) */
void planner_strategy_text(const struct strategy *s, int batch, char *buf, size_t n);

#endif
