/* cublas_batched.cpp - the emulator's batched cuBLAS GEMMs (cublas_batched.h): each batch entry
 * one cublasGemmEx of emu.cpp, so the entries get every check a single GEMM gets (a stream
 * capture records the whole batch as one call: graph.cpp); and the counters of the library
 * files after emu.cpp (emu_ext.h, ddpmd_emu_lib_calls_ext).
 */
#include <stdio.h>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "emu_ext.h"
#include "emu_internal.h"

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

/* FAST_TF32 takes fp32 only; each entry's cublasGemmEx rounds its operands to TF32 (emu.cpp's
 * fast mode, counted as TF32 GEMMs) */
static cublasStatus_t batched_compute(cudaDataType at, cublasComputeType_t *compute)
{
    if (*compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at != CUDA_R_32F) {
        fprintf(stderr, "emu cublas: CUBLAS_COMPUTE_32F_FAST_TF32 with 16-bit inputs\n");
        return CUBLAS_STATUS_NOT_SUPPORTED;
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
    /* alpha and beta are read at the call (host pointer mode, fp32 compute): a capture keeps
     * their values, and runs the whole batch at each launch */
    const float al = alpha ? *(const float *)alpha : 0.0f, be = beta ? *(const float *)beta : 0.0f;
    auto run = [=]() {
        emu_ext_count(EMU_LIB_BLAS_STRIDED, blas_et(at));
        for (int i = 0; i < batch; i++) {
            const cublasStatus_t r =
                cublasGemmEx(h, ta, tb, m, n, k, &al, (const char *)a + i * stride_a * blas_size(at),
                             at, lda, (const char *)b + i * stride_b * blas_size(bt), bt, ldb, &be,
                             (char *)c + i * stride_c * blas_size(ct), ct, ldc, compute, algo);
            if (r != CUBLAS_STATUS_SUCCESS) return r;
        }
        return CUBLAS_STATUS_SUCCESS;
    };
    if (batch && emu_capture_blas(h, "cublasGemmStridedBatchedEx", run, &st)) return st;
    return run();
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
    /* the arrays are read when the call runs (a capture: at each launch, as on a GPU, so a kernel
     * captured before it may fill them); alpha and beta at the call */
    const float al = alpha ? *(const float *)alpha : 0.0f, be = beta ? *(const float *)beta : 0.0f;
    auto run = [=]() {
        /* two entries writing one C would race on a GPU */
        for (int i = 0; i < batch; i++)
            for (int j = 0; j < i; j++)
                if (c[i] == c[j]) {
                    fprintf(stderr,
                            "emu cublas: cublasGemmBatchedEx: C %d and %d are one matrix\n", j,
                            i);
                    return CUBLAS_STATUS_INVALID_VALUE;
                }
        emu_ext_count(EMU_LIB_BLAS_PTRS, blas_et(at));
        for (int i = 0; i < batch; i++) {
            const cublasStatus_t r = cublasGemmEx(h, ta, tb, m, n, k, &al, a[i], at, lda, b[i], bt,
                                                  ldb, &be, c[i], ct, ldc, compute, algo);
            if (r != CUBLAS_STATUS_SUCCESS) return r;
        }
        return CUBLAS_STATUS_SUCCESS;
    };
    if (batch && emu_capture_blas(h, "cublasGemmBatchedEx", run, &st)) return st;
    return run();
}
