/* bench_exec.h - what gpu_bench and kernel_bench share: a spec's training graph planned plainly
 * (the whole batch, no recomputation or offload) in one precision on a backend and bound to an
 * executor, with the benches' exit codes. Header-only: each bench is one file.
 */
#ifndef DDPMD_BENCH_EXEC_H
#define DDPMD_BENCH_EXEC_H

#include <stdio.h>

#include "exec.h"
#include "memplan.h"
#include "spec.h"
#include "unet.h"

/* g, io, *target (the loss target's tensor), p and *e made for spec at its batch (eager: no CUDA
 * graphs, exec_opts.eager): 0; 1 when the
 * graph cannot be built or the executor fails, 3 when the precision, the plan or the executor is
 * unavailable on the device (a line "unavailable ..." printed, which bench/gpu.sh reads) */
static int bench_exec_plain(const char *who, const struct train_spec *spec, int precision,
                            const char *prec, const struct backend *bk, const char *device,
                            int threads, int eager, struct graph *g, struct unet_io *io, int *target,
                            struct plan *p, struct exec **e)
{
    *e = NULL;
    graph_init(g);
    if (unet_build_training(g, &spec->model, spec->batch, io, target, NULL)) {
        fprintf(stderr, "%s: cannot build the graph: %s\n", who, g->err);
        return 1;
    }
    if (precision != STRATEGY_PRECISION_F32 && graph_set_precision(g, precision)) {
        printf("unavailable graph_set_precision(%s)\n", prec);
        return 3;
    }
    struct plan_opts po = {0};
    po.strategy = strategy_plain(spec->batch);
    po.strategy.precision = precision;
    if (plan_make(p, g, bk, &po)) {
        printf("unavailable plan_make(%s) on %s\n", prec, device);
        return 3;
    }
    struct exec_error ee;
    struct exec_opts eo = {.threads = threads, .init_error = &ee, .eager = eager};
    if (exec_init(e, g, p, bk, &eo)) {
        printf("unavailable %s on %s: %s\n", prec, device, ee.msg);
        return ee.status == EXEC_ERR_ARG ? 3 : 1;
    }
    return 0;
}

#endif
