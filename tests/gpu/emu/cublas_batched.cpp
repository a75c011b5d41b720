/* cublas_batched.cpp - the emulator's batched cuBLAS GEMMs (cublas_batched.h): each batch entry
 * one cublasGemmEx of emu.cpp, so the entries get every check a single GEMM gets; and the
 * counters of the library files after emu.cpp (emu_ext.h, ddpmd_emu_lib_calls_ext).
 */
#include <stdio.h>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "emu_ext.h"

static unsigned long g_ext_calls[EMU_LIB_N][3];

void emu_ext_count(int lib, int et)
{
    if (lib >= 0 && lib < EMU_LIB_N && et >= 0 && et < 3)
        __atomic_fetch_add(&g_ext_calls[lib][et], 1, __ATOMIC_RELAXED);
}

/* calls so far of lib (emu_ext.h's numbering, 3 and up) with inputs of dtype (0 fp32, 1 half,
 * 2 bfloat16); tests look it up with dlsym beside ddpmd_emu_lib_calls */
extern "C" __attribute__((visibility("default"))) unsigned long
ddpmd_emu_lib_calls_ext(int lib, int dtype)
{
    if (lib < EMU_LIB_BLAS_STRIDED || lib >= EMU_LIB_N || dtype < 0 || dtype > 2) return 0;
    return __atomic_load_n(&g_ext_calls[lib][dtype], __ATOMIC_RELAXED);
}

static size_t blas_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
static int blas_et(cudaDataType t) { return t == CUDA_R_32F ? 0 : t == CUDA_R_16F ? 1 : 2; }

/* FAST_TF32 is fp32 here (the emulator does not model TF32's rounding); it takes fp32 only */
static cublasStatus_t batched_compute(cudaDataType at, cublasComputeType_t *compute)
{
    if (*compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
        if (at != CUDA_R_32F) {
            fprintf(stderr, "emu cublas: CUBLAS_COMPUTE_32F_FAST_TF32 with 16-bit inputs\n");
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        *compute = CUBLAS_COMPUTE_32F;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType at,
                                          int lda, long long stride_a, const void *b,
                                          cudaDataType bt, int ldb, long long stride_b,
                                          const void *beta, void *c, cudaDataType ct, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = batched_compute(at, &compute);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    /* overlapping outputs would race on a GPU: C's stride covers one C */
    if (batch > 1 && stride_c < (long long)ldc * n) {
        fprintf(stderr, "emu cublas: strided batch: C's stride %lld under one C (%d x %d)\n",
                stride_c, ldc, n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    emu_ext_count(EMU_LIB_BLAS_STRIDED, blas_et(at));
    for (int i = 0; i < batch; i++) {
        st = cublasGemmEx(h, ta, tb, m, n, k, alpha, (const char *)a + i * stride_a * blas_size(at),
                          at, lda, (const char *)b + i * stride_b * blas_size(bt), bt, ldb, beta,
                          (char *)c + i * stride_c * blas_size(ct), ct, ldc, compute, algo);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* an array of batch pointers cuBLAS reads on the device: device memory */
static int ptr_array_ok(const void *arr, const char *what)
{
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, arr) != cudaSuccess || pa.type != cudaMemoryTypeDevice) {
        (void)cudaGetLastError();
        fprintf(stderr, "emu cublas: cublasGemmBatchedEx: the %s array at %p is not device "
                        "memory\n", what, arr);
        return 0;
    }
    return 1;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha,
                                   const void *const a[], cudaDataType at, int lda,
                                   const void *const b[], cudaDataType bt, int ldb,
                                   const void *beta, void *const c[], cudaDataType ct, int ldc,
                                   int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = batched_compute(at, &compute);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (batch && (!ptr_array_ok(a, "A") || !ptr_array_ok(b, "B") || !ptr_array_ok(c, "C")))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* two entries writing one C would race on a GPU */
    for (int i = 0; i < batch; i++)
        for (int j = 0; j < i; j++)
            if (c[i] == c[j]) {
                fprintf(stderr, "emu cublas: cublasGemmBatchedEx: C %d and %d are one matrix\n",
                        j, i);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
    emu_ext_count(EMU_LIB_BLAS_PTRS, blas_et(at));
    for (int i = 0; i < batch; i++) {
        st = cublasGemmEx(h, ta, tb, m, n, k, alpha, a[i], at, lda, b[i], bt, ldb, beta, c[i], ct,
                          ldc, compute, algo);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}
