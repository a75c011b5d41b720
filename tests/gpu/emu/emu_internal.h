/* emu_internal.h - between emu.cpp (the runtime and libraries, run at once) and graph.cpp (stream
 * capture): the calls graph.cpp wraps are defined in emu.cpp under emu_now_* names (emu.cpp
 * renames them with the macros below), and graph.cpp defines the public names, which record a
 * call on a capturing stream and run every other one now. Plus the few accessors graph.cpp needs
 * of emu.cpp's private state. Not for the backend's sources. See cuda_runtime.h here.
 */
#ifndef DDPMD_EMU_INTERNAL_H
#define DDPMD_EMU_INTERNAL_H

#include <functional>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "cudnn.h"

#ifdef EMU_RENAME_NOW
#define cudaMemcpyAsync emu_now_cudaMemcpyAsync
#define cudaMemsetAsync emu_now_cudaMemsetAsync
#define cudaStreamSynchronize emu_now_cudaStreamSynchronize
#define cudaDeviceSynchronize emu_now_cudaDeviceSynchronize
#define cudaEventRecord emu_now_cudaEventRecord
#define cudaStreamWaitEvent emu_now_cudaStreamWaitEvent
#define cudaEventSynchronize emu_now_cudaEventSynchronize
#define cublasSgemm emu_now_cublasSgemm
#define cublasGemmEx emu_now_cublasGemmEx
#define cudnnConvolutionForward emu_now_cudnnConvolutionForward
#define cudnnConvolutionBackwardData emu_now_cudnnConvolutionBackwardData
#define cudnnConvolutionBackwardFilter emu_now_cudnnConvolutionBackwardFilter
#define cudnnAddTensor emu_now_cudnnAddTensor
#define cudnnFindConvolutionForwardAlgorithmEx emu_now_cudnnFindConvolutionForwardAlgorithmEx
#define cudnnFindConvolutionBackwardDataAlgorithmEx emu_now_cudnnFindConvolutionBackwardDataAlgorithmEx
#define cudnnFindConvolutionBackwardFilterAlgorithmEx                                          \
    emu_now_cudnnFindConvolutionBackwardFilterAlgorithmEx
#endif

cudaError_t emu_now_cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                                    cudaStream_t s);
cudaError_t emu_now_cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s);
cudaError_t emu_now_cudaStreamSynchronize(cudaStream_t s);
cudaError_t emu_now_cudaDeviceSynchronize(void);
cudaError_t emu_now_cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t emu_now_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t emu_now_cudaEventSynchronize(cudaEvent_t e);
cublasStatus_t emu_now_cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const float *alpha, const float *a,
                                   int lda, const float *b, int ldb, const float *beta, float *c,
                                   int ldc);
cublasStatus_t emu_now_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                    int m, int n, int k, const void *alpha, const void *a,
                                    cudaDataType at, int lda, const void *b, cudaDataType bt,
                                    int ldb, const void *beta, void *c, cudaDataType ct, int ldc,
                                    cublasComputeType_t compute, cublasGemmAlgo_t algo);
cudnnStatus_t emu_now_cudnnConvolutionForward(
    cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
    cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t c,
    cudnnConvolutionFwdAlgo_t a, void *ws, size_t ws_bytes, const void *beta,
    cudnnTensorDescriptor_t yd, void *y);
cudnnStatus_t emu_now_cudnnConvolutionBackwardData(
    cudnnHandle_t h, const void *alpha, cudnnFilterDescriptor_t wd, const void *w,
    cudnnTensorDescriptor_t dyd, const void *dy, cudnnConvolutionDescriptor_t c,
    cudnnConvolutionBwdDataAlgo_t a, void *ws, size_t ws_bytes, const void *beta,
    cudnnTensorDescriptor_t dxd, void *dx);
cudnnStatus_t emu_now_cudnnConvolutionBackwardFilter(
    cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
    cudnnTensorDescriptor_t dyd, const void *dy, cudnnConvolutionDescriptor_t c,
    cudnnConvolutionBwdFilterAlgo_t a, void *ws, size_t ws_bytes, const void *beta,
    cudnnFilterDescriptor_t dwd, void *dw);
cudnnStatus_t emu_now_cudnnAddTensor(cudnnHandle_t h, const void *alpha,
                                     cudnnTensorDescriptor_t ad, const void *a, const void *beta,
                                     cudnnTensorDescriptor_t cd, void *c);
cudnnStatus_t emu_now_cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnFilterDescriptor_t wd,
    const void *w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t yd, void *y, int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *p, void *ws, size_t ws_bytes);
cudnnStatus_t emu_now_cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void *w, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dxd, void *dx,
    int req, int *got, cudnnConvolutionBwdDataAlgoPerf_t *p, void *ws, size_t ws_bytes);
cudnnStatus_t emu_now_cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dwd, void *dw,
    int req, int *got, cudnnConvolutionBwdFilterAlgoPerf_t *p, void *ws, size_t ws_bytes);

/* emu.cpp's state, for graph.cpp */
/* e recorded as this thread's last error (cudaGetLastError); returns e */
cudaError_t emu_error(cudaError_t e);
/* the bytes a launch's pointer argument touches (CU_TOUCHES): this thread's until its next
 * launch (emu.cpp), a captured launch's until each replay names them again (graph.cpp) */
#define EMU_TOUCHES 8
struct emu_touch {
    const void *p;
    size_t bytes;
};
/* the CU_TOUCHES named since the last launch, taken into t (EMU_TOUCHES); returns the count */
int emu_touches_take(struct emu_touch *t);
/* a handle's stream, math mode and workspace (what a captured call runs with) */
void emu_cublas_get(cublasHandle_t h, cudaStream_t *s, int *math, void **ws, size_t *bytes);
/* ... set again for a replayed call (no allocation, no checks: they held when captured) */
void emu_cublas_set(cublasHandle_t h, cudaStream_t s, int math, void *ws, size_t bytes);
cudaStream_t emu_cudnn_stream(cudnnHandle_t h);
/* copies of descriptors (free them with cuDNN's Destroy calls) */
cudnnTensorDescriptor_t emu_dup_tensor_desc(cudnnTensorDescriptor_t d);
cudnnFilterDescriptor_t emu_dup_filter_desc(cudnnFilterDescriptor_t d);
cudnnConvolutionDescriptor_t emu_dup_conv_desc(cudnnConvolutionDescriptor_t d);
/* whether p is page-locked host memory (cudaMallocHost's) */
int emu_is_pinned(const void *p);
/* whether a convolution on xd (its data) and c would load a cuDNN engine module (a 16-bit one's
 * first call of its type and stride: dnn_engine_module) */
int emu_dnn_engine_new(cudnnTensorDescriptor_t xd, cudnnConvolutionDescriptor_t c);

/* graph.cpp, for emu.cpp: nonzero when the calling thread captures (not relaxed) and so may not
 * call `what` (cudaMalloc, cudaFree...): the capture is invalidated, with a message */
int emu_capture_refuses(const char *what);

/* graph.cpp, for the library files beside emu.cpp (cublas_batched.cpp, cudnn_graph.cpp), whose
 * calls it does not wrap by name. A cuBLAS call on h's stream while that stream captures:
 * recorded (1, *rc its status: EXECUTION_FAILED on an invalidated capture) to run `call` at
 * each cudaGraphLaunch with h set to the launch's stream and to its math mode and workspace of
 * now; 0: not capturing, the caller runs it now. `call` owns copies of what it reads on the
 * host (alpha, beta); the device memory it names is read when it runs, as on a GPU. */
int emu_capture_blas(cublasHandle_t h, const char *what, std::function<cublasStatus_t()> call,
                     cublasStatus_t *rc);
/* a library call on stream s while s captures: recorded (1, *err its status) to run `run` on the
 * launch's stream; 0: not capturing */
int emu_capture_call(cudaStream_t s, const char *what,
                     std::function<cudaError_t(cudaStream_t)> run, cudaError_t *err);

#endif
