/* convert.cu - fp32 <-> bf16 / f16 storage conversions on the device (backend.h `convert`): one
 * thread per element with kernels/half.h's integer rounding (round to nearest even, overflow to
 * inf, subnormals kept, NaN quiet), so the bits equal the CPU backend's and the host's.
 */
#include <string.h>

#include "cuda_backend.h"
#include "half.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void k_f32_to_bf16(uint16_t *y, const float *x, size_t count)
{
    GRID_LOOP(i, count) y[i] = half_f32_to_bf16(x[i]);
}

__global__ void k_f32_to_f16(uint16_t *y, const float *x, size_t count)
{
    GRID_LOOP(i, count) y[i] = half_f32_to_f16(x[i]);
}

__global__ void k_bf16_to_f32(float *y, const uint16_t *x, size_t count)
{
    GRID_LOOP(i, count) y[i] = half_bf16_to_f32(x[i]);
}

__global__ void k_f16_to_f32(float *y, const uint16_t *x, size_t count)
{
    GRID_LOOP(i, count) y[i] = half_f16_to_f32(x[i]);
}

static int valid_dtype(int dt)
{
    return dt == BK_DTYPE_F32 || dt == BK_DTYPE_F16 || dt == BK_DTYPE_BF16;
}

int cu_convert(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count,
               bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!valid_dtype(dst_dtype) || !valid_dtype(src_dtype) ||
        (dst_dtype != BK_DTYPE_F32 && src_dtype != BK_DTYPE_F32 && dst_dtype != src_dtype))
        return BK_ERR_INVALID;
    if (count == 0) return BK_OK;
    if (dst_dtype == src_dtype) {
        CU_CHECK(cudaMemcpyAsync(dst, src, count * bk_dtype_size(dst_dtype),
                                 cudaMemcpyDeviceToDevice, ctx->stream));
        return BK_OK;
    }
    const unsigned blocks = cu_blocks(count, CU_THREADS);
    if (src_dtype == BK_DTYPE_F32 && dst_dtype == BK_DTYPE_BF16)
        CU_LAUNCH(k_f32_to_bf16, blocks, CU_THREADS, 0, ctx->stream)(
            (uint16_t *)dst, (const float *)src, count);
    else if (src_dtype == BK_DTYPE_F32)
        CU_LAUNCH(k_f32_to_f16, blocks, CU_THREADS, 0, ctx->stream)(
            (uint16_t *)dst, (const float *)src, count);
    else if (src_dtype == BK_DTYPE_BF16)
        CU_LAUNCH(k_bf16_to_f32, blocks, CU_THREADS, 0, ctx->stream)(
            (float *)dst, (const uint16_t *)src, count);
    else
        CU_LAUNCH(k_f16_to_f32, blocks, CU_THREADS, 0, ctx->stream)(
            (float *)dst, (const uint16_t *)src, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}
