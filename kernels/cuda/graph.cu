/* graph.cu - CUDA graphs of a job's context (backend.h's graph_* entries): its stream captured
 * (cudaStreamBeginCapture, thread-local mode: this thread may not allocate nor make the host wait
 * meanwhile), the record instantiated once and launched as one unit on the same stream. While a
 * context captures, cu_launched skips DDPMD_CUDA_SYNC's synchronizations and conv.cu its finders.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"

struct bk_graph {
    cudaGraphExec_t exec;
};

int cu_graph_begin(bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (ctx->capturing) return BK_ERR_INVALID;
    CU_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    ctx->capturing = 1;
    return BK_OK;
}

int cu_graph_end(bk_graph **out, bk_ctx *ctx)
{
    if (!out || !ctx) return BK_ERR_INVALID;
    *out = NULL;
    if (!ctx->capturing) return BK_ERR_INVALID;
    CU_ENTER(ctx);
    ctx->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(ctx->stream, &g);
    if (e != cudaSuccess) {
        /* a call the capture refused (a synchronization, an allocation): not sticky, nothing
         * ran; the caller runs the work without a graph */
        fprintf(stderr, "ddpmd cuda: the stream capture failed: %s (%s)\n", cudaGetErrorName(e),
                cudaGetErrorString(e));
        (void)cudaGetLastError();
        if (g) (void)cudaGraphDestroy(g);
        return BK_ERR_INVALID;
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) return cu_fail_cuda(e, "cudaGraphInstantiate", __FILE__, __LINE__);
    bk_graph *b = (bk_graph *)malloc(sizeof *b);
    if (!b) {
        (void)cudaGraphExecDestroy(x);
        return BK_ERR_NOMEM;
    }
    b->exec = x;
    *out = b;
    return BK_OK;
}

int cu_graph_launch(bk_graph *g, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!g || ctx->capturing) return BK_ERR_INVALID;
    CU_CHECK(cudaGraphLaunch(g->exec, ctx->stream));
    CU_LAUNCHED(ctx);
    return BK_OK;
}

void cu_graph_free(bk_graph *g, bk_ctx *ctx)
{
    if (!g) return;
    if (ctx) (void)cu_enter(ctx);
    (void)cudaGraphExecDestroy(g->exec);
    free(g);
}
