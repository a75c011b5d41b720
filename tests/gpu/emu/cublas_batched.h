/* cublas_batched.h (emulator) - cuBLAS's batched GEMMs, strided and with arrays of pointers,
 * over cublas_v2.h's cublasGemmEx: every batch entry is one GemmEx (its types, compute types,
 * argument and stream-order checks, workspace scribbling and arithmetic), and the call is
 * counted once as a batched GEMM (ddpmd_emu_lib_calls_ext, lib 3: strided, 4: pointer arrays).
 * CUBLAS_COMPUTE_32F_FAST_TF32 (fp32 inputs only) rounds the operands to TF32, as a single
 * cublasGemmEx does (emu.cpp's fast mode). The pointer arrays must be device memory (cuBLAS
 * reads them on the device: a graph-capturable call builds them there), each entry device
 * memory too; a stream capture records the batch, its arrays read at each launch.
 * Included by cublas_v2.h here; implemented in cublas_batched.cpp. */
#ifndef DDPMD_EMU_CUBLAS_BATCHED_H
#define DDPMD_EMU_CUBLAS_BATCHED_H

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType at,
                                          int lda, long long stride_a, const void *b,
                                          cudaDataType bt, int ldb, long long stride_b,
                                          const void *beta, void *c, cudaDataType ct, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha,
                                   const void *const a[], cudaDataType at, int lda,
                                   const void *const b[], cudaDataType bt, int ldb,
                                   const void *beta, void *const c[], cudaDataType ct, int ldc,
                                   int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo);

#endif
