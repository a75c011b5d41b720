/* memplan.h - the memory plan: every byte a step touches, decided before any is allocated.
 * One allocation per job: [params | adam m | adam v | ema | work | grads | inputs | workspace |
 * arena] for training (the gradients in the arena instead under plan_opts.one_pass),
 * [params | work | inputs | workspace | arena] for inference (sampling); work
 * (the 16-bit weights) is empty under f32; from work on nothing outlives a step
 * (plan.transient_off). Tensors take the bytes their dtype says
 * (graph_set_precision); an operand whose dtype is not the one its kernel takes (a 16-bit
 * operand of an fp32 kernel, the fp32 data input of a 16-bit convolution) is converted into
 * scratch of the kernel's dtype, planned as an arena storage living for that op (plan.cvt).
 * Arena tensors are
 * placed by best-fit over their lifetimes in execution order, with in-place reuse where an op
 * allows it. plan.total_bytes IS the job's reservation; a nested inference plan (a training
 * job's sample grid) runs inside it (plan_make_nested).
 */
#ifndef DDPMD_MEMPLAN_H
#define DDPMD_MEMPLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "graph.h"
#include "strategy.h"

#define PLAN_ALIGN 64

/* x rounded up to PLAN_ALIGN */
static inline size_t plan_align(size_t x) { return (x + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

enum plan_mode {
    PLAN_MODE_AUTO = 0,  /* training when graph_backward ran on the graph (n_fwd_ops > 0),
                          * inference otherwise */
    PLAN_MODE_TRAIN,     /* gradients, AdamW moments and EMA whatever the graph */
    PLAN_MODE_INFER,     /* the forward ops only ([0, n_fwd_ops), all ops of a forward-only
                          * graph): weights, inputs, workspace and the arena, nothing else */
};

struct plan_opts {
    int no_reuse;        /* every arena storage gets its own bytes (the honesty reference) */
    size_t guard_bytes;  /* canary gap after every arena storage and on both sides of the
                          * workspace (checked by the executor) */
    enum plan_mode mode;
    /* a resolved strategy (no AUTO field); zero: the plain fp32 step (micro_batch 0: the
     * graph's batch). The graph is built for the micro-batch; an uneven last micro-batch is a
     * second graph planned with plan_make_shared. A strategy the engine cannot run yet is
     * PLAN_ERR_ARG, and so is a precision other than the graph's (graph_set_precision; 0 = f32
     * for both). */
    struct strategy strategy;
    /* Search aids (engine/planner.c): bound_only lays out everything but the workspace (0
     * bytes) and the arena, whose bytes are then the most that are live at once, so that
     * total_bytes is a lower bound of the exact plan's, made without the backend's workspace
     * queries and the placement (the costly parts); such a plan's arena tensors have no
     * offsets and exec_init refuses it. ws_cache (may be NULL, plan_ws_cache_new):
     * convolution workspace bytes remembered across the plans of one search. */
    int bound_only;
    struct plan_ws_cache *ws_cache;
    /* no fusions (plan.fuse_host): the unfused step a fused one must give the bits of (tests) */
    int no_fuse;
    /* one forward/backward per optimizer step (no micro-batch accumulates into the gradients):
     * a training plan of its own without offload, on a backend whose optimizer runs on the
     * host's side of exec (no BK_OP_optim_step), then keeps each gradient in the arena from the
     * op that first writes it to the step's end (plan.grads_in_arena), over the activations the
     * backward has already freed, as PyTorch allocates .grad; 0: the persistent block */
    int one_pass;
};

struct plan_ws_cache;
struct plan_ws_cache *plan_ws_cache_new(void);
void plan_ws_cache_free(struct plan_ws_cache *c);

/* an operand of an op stored in another dtype than its kernel takes, converted into scratch of
 * the kernel's dtype (an arena storage of that op alone) */
struct plan_cvt {
    int tensor;          /* the operand (an activation, or a weight read from its working copy
                          * or, without one, from the fp32 master: dtype DTYPE_F32) */
    int storage;         /* its scratch: p->st[storage], bk_dtype_size(kdtype) bytes an element */
    int dtype;           /* the type it is stored in (enum tensor_dtype) */
    int kdtype;          /* the type the kernel takes it in: the scratch's */
    int load;            /* converted into the scratch before the op (inputs, accumulated outputs) */
    int store;           /* converted back after it (outputs) */
};

/* the parts a job's bytes are reported by; each has device bytes and host bytes */
enum plan_part {
    PLAN_PART_WEIGHTS = 0,  /* the fp32 weights on the device (the master copy too, unless
                             * PLAN_PART_MASTER holds one apart) */
    PLAN_PART_WORKING,      /* a 16-bit working copy of the weights fp32 kernels read */
    PLAN_PART_GRADS,        /* parameter gradients */
    PLAN_PART_OPTIMIZER,    /* AdamW m and v */
    PLAN_PART_MASTER,       /* fp32 master weights kept apart from PLAN_PART_WEIGHTS */
    PLAN_PART_EMA,
    PLAN_PART_INPUTS,       /* the step's inputs (images, timesteps, targets) */
    PLAN_PART_WORKSPACE,    /* library scratch, its canary gaps included */
    PLAN_PART_ARENA,        /* activations, statistics, activation gradients, conversions */
    PLAN_PART_NESTED,       /* a nested plan's bytes beyond the step's own end (the sample grid
                             * of a training job: plan_reserve_nested) */
    PLAN_PART_COUNT
};

struct plan_part_bytes {
    size_t device, host;
};

/* a storage: one or more arena tensors sharing bytes through in-place ops */
struct plan_storage {
    int64_t offset;      /* in the job's allocation */
    size_t bytes;
    int first, last;     /* op indices of its lifetime, inclusive */
    int keep;            /* a result nothing reads (the loss, a forward-only graph's output):
                          * lives to the end of the step, for the host to read */
};

struct plan {
    int inference;       /* no gradients, AdamW moments or EMA (their *_off are unused) */
    int bound_only;      /* plan_opts.bound_only: no arena placed, total_bytes a lower bound */
    int nested;          /* a sub-plan inside another plan's allocation (plan_make_nested, or a
                          * training one, plan_make_shared) */
    int n_run_ops;       /* the ops a step runs: all, or the forward ones of an inference plan,
                          * or (recomputation) the graph's with recomputed copies inserted */
    /* Recomputation (strategy.recompute): the run order is the graph's forward ops, then its
     * backward ops with, just before the first backward op that reads an activation of a
     * chosen segment (graph.segs), a copy of each of the segment's forward ops that activation
     * depends on. A copy writes copies of its outputs (tensor ids n_tensors + i, shaped as
     * graph tensor copy_of[i]) and reads the copies made before it in the same segment (the
     * originals of everything else: the segment's inputs); the backward ops from there on read
     * the copies. So the originals die within the forward and the copies live from their
     * re-run to their backward. NULL ops: the run order is the graph's (op_src the identity). */
    struct op *ops;      /* (n_run_ops) the ops a step runs, or NULL */
    int *op_src;         /* (n_run_ops) the graph op each one is (a copy: the op it repeats) */
    int n_recomputed;    /* run ops that are recomputed copies */
    int n_copies;        /* tensors added by recomputation */
    int *copy_of;        /* (n_copies) the graph tensor each repeats */
    int n_tensors;       /* the graph's; the arrays below hold n_tensors + n_copies entries */
    int64_t *offset;     /* per tensor: byte offset in the allocation; -1 if never touched */
    int *storage;        /* per arena tensor: storage index; -1 otherwise */
    int *first, *last;   /* per arena tensor: lifetime (indices of the run order) */
    struct plan_storage *st;
    int n_storages;

    /* the parts, as byte ranges of the allocation */
    size_t params_off, params_bytes;  /* parameters, each 64-byte aligned, padding zeroed */
    size_t grads_off, grads_bytes;    /* same layout as params; 0 bytes for inference; dead
                                       * between two steps (see transient_off) */
    int grads_in_arena;               /* opts.one_pass took: no grads block (0 bytes); each
                                       * gradient is an arena storage (keep) living from its
                                       * first writer to the step's end, zeroed by the executor
                                       * before that op (exec_forward_backward must zero) */
    size_t adam_m_off, adam_v_off;    /* same layout as params */
    size_t adam_bytes;                /* m and v together; 0 for inference */
    size_t ema_off, ema_bytes;        /* same layout as params; 0 for inference (and offload) */
    /* Offload (strategy.offload = 1, a training plan): the AdamW moments, the EMA and the fp32
     * master weights live in the job's host block (host_bytes, allocated by the executor apart
     * from the reservation), each in the params layout at these offsets into it, with a host
     * copy of the gradients (the optimizer's input, copied from the device each step); on the
     * device adam_bytes and ema_bytes are 0, so the reservation is smaller by exactly their
     * bytes. The device keeps the fp32 weights (the kernels read them; under f32 they ARE the
     * working weights) and the gradients; the host optimizer steps the master and writes it
     * back to them. */
    int offload;
    size_t host_master_off, host_grads_off, host_adam_m_off, host_adam_v_off, host_ema_off;
    /* a nested plan over an offloading host's EMA (plan_make_nested, PLAN_WEIGHTS_EMA): its
     * weights get their own device bytes at params_off (over the host's transient part), filled
     * from the host's EMA by exec_nested_sync before a run */
    int weights_from_host;
    size_t work_off, work_bytes;      /* the 16-bit working copy of the convolution and linear
                                       * weights an fp32 kernel reads under 16-bit precision (0
                                       * bytes under f32, and where only 16-bit kernels read
                                       * them: they convert from the fp32 master per op),
                                       * refreshed from the fp32 weights before every forward */
    size_t transient_off;             /* = work_off: from here to the end (working copy,
                                       * gradients, inputs, workspace, arena) the bytes hold
                                       * nothing between two steps: the gradients are zeroed by a
                                       * step's first micro-batch. A nested inference plan (a
                                       * sample grid) lies here. */
    int64_t *work_offset;             /* per tensor: its working copy's offset; -1 if none */
    struct plan_cvt *cvt;             /* conversion scratch, grouped by op: op k's are */
    int *cvt_start;                   /* cvt[cvt_start[k] .. cvt_start[k + 1]) (n_run_ops + 1) */
    int n_cvt;
    unsigned char *op_dtype;          /* (n_run_ops) the dtype op k's kernel computes on: the
                                       * 16-bit type for a typed kernel the backend has
                                       * (half_kernels), else DTYPE_F32 */
    int n_half_ops;                   /* run ops whose kernel takes 16-bit operands natively */
    /* Fusions (a backend with typed kernels, backend.typed: memplan.c's plan_fusions): a guest op
     * runs inside the kernel of its host, at the host's position in the run order, and is
     * skipped at its own (a group norm and the broadcast add next to it, forward and backward,
     * or the residual add after it). Lifetimes and storages follow the positions ops run at, and
     * a value the fused kernel never makes (the norm's output before the add after it) has no
     * bytes (offset -1), so the arena is the fused step's. */
    int *fuse_host;                   /* (n_run_ops) a guest's host; -1 for the other ops */
    int *fuse_guest;                  /* (n_run_ops) a host's guest; -1 for the other ops */
    int n_fused;                      /* fused pairs */
    size_t inputs_off, inputs_bytes;
    size_t ws_off, ws_bytes;          /* library scratch: the largest any op needs */
    size_t ws_guard_bytes;            /* the canary gap before ws_off and the one after the
                                       * workspace, each (0 without guard_bytes) */
    size_t arena_off, arena_bytes;    /* activations, statistics, activation gradients */
    size_t guard_bytes;               /* plan_opts.guard_bytes: the gap after each storage */
    size_t guards_bytes;              /* of arena_bytes, bytes that are canary gaps */
    size_t nested_bytes;              /* the end of the largest nested sub-plan this reservation
                                       * also holds (plan_reserve_nested); 0 when none */
    size_t total_bytes;               /* the device reservation */
    size_t no_reuse_arena_bytes;      /* the arena without any reuse, for comparison */

    /* the strategy the plan was made for (plan_opts.strategy) and its bytes by part and place:
     * the device column sums to total_bytes, the host column to host_bytes (bytes the job
     * allocates in host memory apart from the reservation: offloaded state) */
    struct strategy strategy;
    struct plan_part_bytes parts[PLAN_PART_COUNT];
    size_t host_bytes;
};

enum plan_status { PLAN_OK = 0, PLAN_ERR_NOMEM = 1, PLAN_ERR_GRAPH = 2, PLAN_ERR_ARG = 3 };

int plan_make(struct plan *p, const struct graph *g, const struct backend *bk,
              const struct plan_opts *opts);
/* the ops a training step of g recomputing at granularity `recompute` runs: *n of them, run op i
 * being graph op (*op_src)[i] (malloc'd; NULL when the order is the graph's own): plan.op_src
 * without the plan. 0 or PLAN_ERR_NOMEM. */
int plan_run_order(const struct graph *g, int recompute, int **op_src, int *n);
/* plan_make's bytes on bk up to its inputs' end (weights, AdamW state and EMA unless offloaded,
 * working copy, gradients, inputs) from g alone: the cheapest lower bound of its total_bytes */
size_t plan_persistent_bytes(const struct graph *g, const struct backend *bk,
                             const struct plan_opts *opts);

/* which of the host's blocks a nested plan's parameters are */
enum plan_weights { PLAN_WEIGHTS_PARAMS = 0, PLAN_WEIGHTS_EMA = 1 };

/* An inference plan of g (forward ops, as PLAN_MODE_INFER; opts->mode is ignored) that runs
 * inside host's allocation between two of host's steps: a training job's sample grid inside its
 * one reservation. g's parameters are not copied: each is bound to the same-named parameter of
 * host_g in host's weight or EMA block (every one must exist there with the same shape:
 * PLAN_ERR_GRAPH otherwise; a host without EMA and PLAN_WEIGHTS_EMA: PLAN_ERR_ARG). g's inputs,
 * workspace and arena are laid out from host->transient_off on, over host's transient part (its
 * working copy, gradients, inputs, workspace and arena), which holds nothing between two steps.
 * sub->total_bytes is the end of the bytes sub touches; call plan_reserve_nested(host, sub)
 * before host's exec_init so that the reservation covers it (the larger of the two). Contract
 * for the caller: a nested run leaves host's gradients, inputs and arena overwritten, so it runs
 * between steps only (never between the micro-batches of one), and host's inputs are uploaded
 * again before its next step (a training step uploads them anyway). */
int plan_make_nested(struct plan *sub, const struct graph *g, const struct backend *bk,
                     const struct plan_opts *opts, const struct plan *host,
                     const struct graph *host_g, enum plan_weights weights);
/* A training plan of g inside host's allocation whose persistent part IS host's: g has host_g's
 * parameters (every one of g's exists in host_g by name with the same shape: PLAN_ERR_GRAPH
 * otherwise), the same model built at another batch size (the uneven last micro-batch of an
 * effective batch). Its parameter gradients are host's gradient block (a step of sub accumulates
 * into what host's steps accumulated), its AdamW moments and EMA are host's; its inputs,
 * workspace and arena lie over host's inputs, workspace and arena (the same contract:
 * plan_reserve_nested(host, sub) before host's exec_init, exec_init_nested to run it, and
 * host's inputs are uploaded again before its next step). host must be a training plan
 * (PLAN_ERR_ARG otherwise). */
int plan_make_shared(struct plan *sub, const struct graph *g, const struct backend *bk,
                     const struct plan_opts *opts, const struct plan *host,
                     const struct graph *host_g);
/* host's reservation grown to hold sub too: total_bytes = max(host, sub). Before exec_init. */
void plan_reserve_nested(struct plan *host, const struct plan *sub);
/* the same for a nested plan ending at `end` bytes */
void plan_reserve(struct plan *host, size_t end);

void plan_free(struct plan *p);
/* run op k of p (its op list, or the graph's) and the tensor behind id (a recomputed copy's
 * graph tensor for ids >= n_tensors) */
static inline const struct op *plan_op(const struct plan *p, const struct graph *g, int k)
{
    return p->ops ? &p->ops[k] : &g->ops[k];
}
static inline const struct tensor *plan_tensor(const struct plan *p, const struct graph *g,
                                               int id)
{
    return g->tensors[id < p->n_tensors ? id : p->copy_of[id - p->n_tensors]];
}
/* the part's name in reports and JSON keys: "weights", "working_copy", "gradients",
 * "optimizer", "master", "ema", "inputs", "workspace", "arena", "nested_sampling" */
const char *plan_part_name(enum plan_part k);
/* a human-readable summary of the parts (one line each, device and host bytes) */
void plan_print(const struct plan *p, FILE *f);

#endif
