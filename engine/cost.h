/* cost.h - the cost model: a training step's predicted seconds from its graph and plan, before it
 * runs. Each op falls in a class; its work is FLOPs (convolutions, GEMMs, attention) or bytes
 * moved (everything else); its seconds are work x seconds_per_unit[class] + op_seconds[class].
 * The optimizer costs seconds per parameter; host transfers and the host optimizer (offload)
 * seconds per byte. The constants are measured on the machine by bench/calibrate (a small text
 * file, cost_model_parse) or are the compiled-in defaults (cost_model_default).
 */
#ifndef DDPMD_COST_H
#define DDPMD_COST_H

#include <stddef.h>

#include "graph.h"
#include "memplan.h"

enum cost_class {
    COST_CONV_FWD = 0,
    COST_CONV_BWD_DATA,
    COST_CONV_BWD_FILTER,
    COST_GEMM,            /* linear forward and backward (FLOPs) */
    COST_ATTN_FWD,        /* FLOPs of the scores and the weighted sum: the plain form (its L x L
                           * probabilities kept) */
    COST_ATTN_BWD,
    COST_ATTN_TILED_FWD,  /* the same for the tiled, memory-efficient form, whose rate differs */
    COST_ATTN_TILED_BWD,
    COST_NORM,            /* group and layer norm, forward and backward (bytes) */
    COST_ELTWISE,         /* every other op (bytes read and written) */
    COST_DROPOUT,         /* dropout forward and backward: a Philox draw per element (bytes) */
    COST_CLASS_COUNT
};

struct cost_model {
    double seconds_per_unit[COST_CLASS_COUNT]; /* per FLOP or per byte, at `threads` */
    double op_seconds[COST_CLASS_COUNT];       /* fixed cost of one op */
    double optim_seconds_per_param;            /* clip + AdamW + EMA on the device */
    double host_optim_seconds_per_param;       /* the same on host threads (offload) */
    double transfer_seconds_per_byte;          /* device <-> host copy (offload) */
    double convert_seconds_per_byte;           /* fp32 <-> 16-bit conversion of weights */
    double half_speed[COST_CLASS_COUNT];       /* per class, its ops' throughput under a 16-bit
                                                * precision over fp32, the conversions around
                                                * them not counted (those are convert's): above
                                                * 1 where the backend's 16-bit kernels are the
                                                * faster, 1 where it runs the class in fp32 */
    unsigned char half_cvt[COST_CLASS_COUNT];  /* per class, 1: under 16 bits its ops run on
                                                * operands converted around them (each 16-bit
                                                * operand's fp32 bytes at convert's rate); 0:
                                                * the backend's kernels read and write them as
                                                * stored (backend.h's typed kernels) */
    int threads;                               /* the thread count it was measured at */
};

/* the compiled-in constants (bench/calibrate on a 2-thread AVX-512 CPU) */
void cost_model_default(struct cost_model *m);

/* Lines of "key value..." ('#' starts a comment): `threads N`, `<class> SECONDS_PER_UNIT
 * OP_SECONDS` for each class name (cost_class_name), `half <class> X` (its half_speed),
 * `half_cvt <class> 0|1`,
 * `optim S`, `host_optim S`, `transfer S`, `convert S`; `half_speedup X` (files before the
 * per-class speeds) sets X for the convolutions, GEMMs and attention. Keys not given keep m's
 * values (start from cost_model_default).
 * 0, or -1 with a message naming the line. */
int cost_model_parse(struct cost_model *m, const char *text, char *err, size_t errlen);
/* the file's text for m (cost_model_parse reads it back); the caller frees it */
char *cost_model_format(const struct cost_model *m);

const char *cost_class_name(enum cost_class c);
/* the class of an op type (attention: the plain form's) */
enum cost_class cost_class_of(enum op_type t);
/* the class of op o: its type's, the tiled attention's for a tiled one */
enum cost_class cost_op_class(const struct op *o);
/* model FLOPs of an op (multiply-add = 2): convolutions, linears and the attention matmuls;
 * backward ops their own GEMM work (attention's: twice the forward's, not counting a tiled
 * kernel's recomputation of the scores); 0 for every other op */
double cost_op_flops(const struct op *o);
/* work units (FLOPs or bytes, by class) of op k of g */
double cost_op_work(const struct graph *g, int k);
/* predicted seconds of op k alone (fp32) */
double cost_op_seconds(const struct cost_model *m, const struct graph *g, int k);

/* The predicted seconds of one training step of effective batch `batch` under plan p, whose
 * graph g is built for micro-batch b = g's batch (p->strategy.micro_batch, or the batch when 0):
 * ceil(batch / b) forward+backward passes (the last, smaller one scaled by its samples), each
 * running the plan's ops (recomputation included), each class by its half_speed under 16 bits, the
 * optimizer (on host threads with offload, plus the gradient and weight transfers).
 * An inference plan: one forward. */
double cost_predict_step_seconds(const struct cost_model *m, const struct plan *p,
                                 const struct graph *g, int batch);
/* the same for a training graph not yet planned, under strategy s (its run order:
 * plan_run_order) */
double cost_predict_graph_seconds(const struct cost_model *m, const struct graph *g,
                                  const struct strategy *s, int batch);

#endif
