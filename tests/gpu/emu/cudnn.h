/* cudnn.h (emulator) - the cuDNN 9 legacy convolution API the CUDA backend uses, over naive
 * direct convolutions that honour the descriptors (symmetric padding, stride, alpha, beta, data
 * types, the NCHW and NHWC formats of tensors and filters). fp32 tensors: summed in double. 16-bit tensors (HALF, BFLOAT16; x, w and y of one
 * type, the convolution's compute type FLOAT, as cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configs):
 * products summed in fp32, alpha and beta applied in fp32, one rounding to nearest even on the
 * store; BFLOAT16 on a device below sm_80 (EMU_CC) is NOT_SUPPORTED. fp32 data must run with
 * CUDNN_FMA_MATH (the backend's parity mode: no TF32); 16-bit data with tensor-op math or FMA.
 * The heuristics and finders offer algorithms the backend must refuse (Winograd, FFT,
 * non-deterministic, too much workspace) ahead of the ones it may take; every algorithm
 * scribbles over the workspace it claims, and the finders over their outputs, as cuDNN may.
 * See cuda_runtime.h here. */
#ifndef DDPMD_EMU_CUDNN_H
#define DDPMD_EMU_CUDNN_H

#include "cuda_runtime.h"

typedef enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_INVALID_VALUE = 2001, /* cuDNN 9: deprecated, still named by its frontend */
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
    CUDNN_STATUS_ALLOC_FAILED = 4000,
    CUDNN_STATUS_EXECUTION_FAILED = 5000,
} cudnnStatus_t;
typedef enum { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 } cudnnDeterminism_t;
typedef enum {
    CUDNN_DEFAULT_MATH = 0,
    CUDNN_TENSOR_OP_MATH = 1,
    CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
    CUDNN_FMA_MATH = 3,
} cudnnMathType_t;
/* NHWC: a tensor's (N,C,H,W) stored channels last; a filter's (K,C,R,S) stored KRSC */
typedef enum { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 } cudnnTensorFormat_t;
typedef enum {
    CUDNN_DATA_FLOAT = 0,
    CUDNN_DATA_DOUBLE = 1,
    CUDNN_DATA_HALF = 2,
    CUDNN_DATA_BFLOAT16 = 9,
} cudnnDataType_t;
typedef enum { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
typedef enum {
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
    CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2,
    CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3,
    CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
    CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
    CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
} cudnnConvolutionFwdAlgo_t;
typedef enum {
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7,
} cudnnConvolutionBwdFilterAlgo_t;
typedef enum {
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6,
} cudnnConvolutionBwdDataAlgo_t;

#define EMU_PERF_FIELDS(A)                                                                     \
    A algo;                                                                                    \
    cudnnStatus_t status;                                                                      \
    float time;                                                                                \
    size_t memory;                                                                             \
    cudnnDeterminism_t determinism;                                                            \
    cudnnMathType_t mathType;                                                                  \
    int reserved[3];
typedef struct { EMU_PERF_FIELDS(cudnnConvolutionFwdAlgo_t) } cudnnConvolutionFwdAlgoPerf_t;
typedef struct { EMU_PERF_FIELDS(cudnnConvolutionBwdDataAlgo_t) } cudnnConvolutionBwdDataAlgoPerf_t;
typedef struct {
    EMU_PERF_FIELDS(cudnnConvolutionBwdFilterAlgo_t)
} cudnnConvolutionBwdFilterAlgoPerf_t;

typedef struct emu_cudnn *cudnnHandle_t;
typedef struct emu_tensor_desc *cudnnTensorDescriptor_t;
typedef struct emu_filter_desc *cudnnFilterDescriptor_t;
typedef struct emu_conv_desc *cudnnConvolutionDescriptor_t;

/* a handle holds device memory of its own (counted against the device) */
cudnnStatus_t cudnnCreate(cudnnHandle_t *h);
cudnnStatus_t cudnnDestroy(cudnnHandle_t h);
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s);
cudnnStatus_t cudnnGraphVersionCheck(void);
cudnnStatus_t cudnnOpsVersionCheck(void);
cudnnStatus_t cudnnCnnVersionCheck(void);
const char *cudnnGetErrorString(cudnnStatus_t s);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw,
                                              int u, int v, int dh, int dw,
                                              cudnnConvolutionMode_t m, cudnnDataType_t t);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t c,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *ch,
                                                    int *h, int *wd);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t c,
                                                     cudnnTensorDescriptor_t y, int req, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *p);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, int req, int *got,
    cudnnConvolutionBwdDataAlgoPerf_t *p);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, int req, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *p);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnFilterDescriptor_t wd,
    const void *w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t yd, void *y, int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *p, void *ws, size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void *w, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dxd, void *dx,
    int req, int *got, cudnnConvolutionBwdDataAlgoPerf_t *p, void *ws, size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dwd, void *dw,
    int req, int *got, cudnnConvolutionBwdFilterAlgoPerf_t *p, void *ws, size_t ws_bytes);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t c,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *b);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, cudnnConvolutionBwdDataAlgo_t a,
    size_t *b);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t a, size_t *b);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t c, cudnnConvolutionFwdAlgo_t a,
                                      void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *a, const void *beta, cudnnTensorDescriptor_t cd,
                             void *c);

#include "cudnn_graph.h" /* the graph API (cudnn_graph.cpp) */

#endif
