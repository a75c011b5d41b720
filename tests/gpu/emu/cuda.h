/* cuda.h (emulator) - the names of CUDA's driver API and of the runtime's CUDA graphs that
 * NVIDIA's cuDNN frontend (third_party/cudnn_frontend) mentions in code the backend never calls
 * (populating CUDA graphs from cuDNN graphs): declared with CUDA's own spellings so that the
 * frontend compiles against the emulator, defined nowhere (a call would not link: the module
 * would fail to load); and cudaGetDevice, which it calls. cudaGraph_t is the emulator's own
 * (cuda_runtime.h's stream capture), and CUgraph the same type, as in CUDA. */
#ifndef DDPMD_EMU_CUDA_H
#define DDPMD_EMU_CUDA_H

#include <stddef.h>

#include "cuda_runtime.h"

/* ---- driver API ---- */
typedef enum cudaError_enum { CUDA_SUCCESS = 0 } CUresult;
typedef cudaGraph_t CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
CUresult cuGetErrorString(CUresult error, const char **str);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);

/* ---- the runtime's CUDA graphs, as far as the frontend names them ---- */
typedef struct CUgraphNode_st *cudaGraphNode_t;
struct cudaGraphEdgeData_st {
    unsigned char from_port, to_port, type, reserved[5];
};
typedef struct cudaGraphEdgeData_st cudaGraphEdgeData;
struct cudaMemsetParams {
    void *dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
};
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                       const cudaGraphNode_t *deps, size_t ndeps,
                                       cudaGraph_t child);
cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *node, cudaGraph_t graph,
                                     const cudaGraphNode_t *deps, size_t ndeps, void *dst,
                                     const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                   const cudaGraphNode_t *deps, size_t ndeps,
                                   const cudaMemsetParams *params);
cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *graph);
cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node, cudaGraphNode_t *deps,
                                           size_t *count);
cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node, cudaGraphNode_t *deps,
                                           cudaGraphEdgeData *edges, size_t *count);
cudaError_t cudaGraphMemcpyNodeSetParams1D(cudaGraphNode_t node, void *dst, const void *src,
                                           size_t count, cudaMemcpyKind kind);
cudaError_t cudaGraphMemsetNodeSetParams(cudaGraphNode_t node, const cudaMemsetParams *params);
cudaError_t cudaEventCreate(cudaEvent_t *event);
/* and one the frontend calls: device 0, always (cudnn_graph.cpp) */
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

#endif
