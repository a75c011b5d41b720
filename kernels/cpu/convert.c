/* convert.c - fp32 <-> bf16 / f16 storage conversions on the CPU (backend.h `convert`).
 * The backend is built for x86-64-v3: f16 goes through F16C (vcvtps2ph with round to nearest
 * even, vcvtph2ps), bf16 through AVX2 integer rounding; the tails and NaN quieting follow
 * kernels/half.h bit for bit (test_convert checks every 16-bit pattern and the f32 ties).
 * cpu_accum16: the typed kernels' accumulating 16-bit output, round(y + round(r)) (backend.h).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu.h"
#include "half.h"

/* elements per parallel chunk: below one chunk, one thread */
#define CVT_CHUNK 16384

/* 8 fp32 bit patterns -> their bf16 roundings (to nearest even; a NaN quieted, half.h's) in
 * each 32-bit lane's low half, zero-extended */
static inline __m256i bf16_round8(__m256i u)
{
    const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                  abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                  quiet = _mm256_set1_epi32(0x00400000);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(
                                                              _mm256_srli_epi32(u, 16), lsb)));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan);
    return _mm256_srli_epi32(r, 16);
}

/* 8 bf16 (zero-extended 32-bit lanes) -> their fp32 values, a NaN quieted (half.h's) */
static inline __m256 bf16_widen8(__m256i h)
{
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                  quiet = _mm256_set1_epi32(0x00400000);
    __m256i u = _mm256_slli_epi32(h, 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
    return _mm256_castsi256_ps(_mm256_or_si256(u, _mm256_and_si256(nan, quiet)));
}

static inline __m256i bf16_load8(const uint16_t *x)
{
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x));
}

/* bf16_round8's 8 lanes stored as 8 bf16: packus within lanes, then the lanes in order */
static inline void bf16_store8(uint16_t *y, __m256i r)
{
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)y, _mm256_castsi256_si128(p));
}

static void f32_to_bf16(uint16_t *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        bf16_store8(y + i, bf16_round8(_mm256_loadu_si256((const __m256i *)(x + i))));
    for (; i < n; i++) y[i] = half_f32_to_bf16(x[i]);
}

static void bf16_to_f32(float *y, const uint16_t *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16_widen8(bf16_load8(x + i)));
    for (; i < n; i++) y[i] = half_bf16_to_f32(x[i]);
}

static void f32_to_f16(uint16_t *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = half_f32_to_f16(x[i]);
}

static void f16_to_f32(float *y, const uint16_t *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = half_f16_to_f32(x[i]);
}

/* elements [i, i + n) */
static void convert_chunk(void *dst, int dst_dtype, const void *src, int src_dtype, size_t i,
                          size_t n)
{
    if (src_dtype == BK_DTYPE_F32) {
        const float *x = (const float *)src + i;
        uint16_t *y = (uint16_t *)dst + i;
        if (dst_dtype == BK_DTYPE_BF16) f32_to_bf16(y, x, n);
        else f32_to_f16(y, x, n);
    } else {
        const uint16_t *x = (const uint16_t *)src + i;
        float *y = (float *)dst + i;
        if (src_dtype == BK_DTYPE_BF16) bf16_to_f32(y, x, n);
        else f16_to_f32(y, x, n);
    }
}

void cpu_convert_run(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count)
{
    convert_chunk(dst, dst_dtype, src, src_dtype, 0, count);
}

static int valid(int dt) { return dt == BK_DTYPE_F32 || dt == BK_DTYPE_F16 || dt == BK_DTYPE_BF16; }

int cpu_convert(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count,
                bk_ctx *ctx)
{
    if (!valid(dst_dtype) || !valid(src_dtype) ||
        (dst_dtype != BK_DTYPE_F32 && src_dtype != BK_DTYPE_F32 && dst_dtype != src_dtype))
        return BK_ERR_INVALID;
    if (dst_dtype == src_dtype) {
        memcpy(dst, src, count * bk_dtype_size(dst_dtype));
        return BK_OK;
    }
    long chunks = (long)((count + CVT_CHUNK - 1) / CVT_CHUNK);
    int threads = cpu_threads(ctx);
    if (chunks <= 1 || threads <= 1) { /* no parallel region: libgomp would allocate a team */
        convert_chunk(dst, dst_dtype, src, src_dtype, 0, count);
        return BK_OK;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long c = 0; c < chunks; c++) {
        size_t i = (size_t)c * CVT_CHUNK;
        convert_chunk(dst, dst_dtype, src, src_dtype, i,
                      count - i < CVT_CHUNK ? count - i : CVT_CHUNK);
    }
    return BK_OK;
}

/* y[i] = round(y[i] + round(r[i])) over [i, i + n) in one pass in registers: the steps, and so
 * the bits, of converting r to the type and back, y to fp32, adding in fp32 and converting the
 * sum (half.h's in the scalar tail), without the four passes through buffers that took ~0.6 ns
 * an element */
static void accum16_chunk(void *y, const float *r, int dtype, size_t i, size_t n)
{
    const float *rr = r + i;
    uint16_t *yy = (uint16_t *)y + i;
    size_t k = 0;
    if (dtype == BK_DTYPE_BF16) {
        for (; k + 8 <= n; k += 8) {
            __m256 rv = bf16_widen8(bf16_round8(_mm256_loadu_si256((const __m256i *)(rr + k))));
            __m256 s = _mm256_add_ps(bf16_widen8(bf16_load8(yy + k)), rv);
            bf16_store8(yy + k, bf16_round8(_mm256_castps_si256(s)));
        }
        for (; k < n; k++)
            yy[k] = half_f32_to_bf16(half_bf16_to_f32(yy[k]) +
                                     half_bf16_to_f32(half_f32_to_bf16(rr[k])));
    } else {
        for (; k + 8 <= n; k += 8) {
            __m256 rv = _mm256_cvtph_ps(
                _mm256_cvtps_ph(_mm256_loadu_ps(rr + k), _MM_FROUND_TO_NEAREST_INT));
            __m256 s =
                _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(yy + k))), rv);
            _mm_storeu_si128((__m128i *)(yy + k), _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT));
        }
        for (; k < n; k++)
            yy[k] = half_f32_to_f16(half_f16_to_f32(yy[k]) +
                                    half_f16_to_f32(half_f32_to_f16(rr[k])));
    }
}

void cpu_accum16(void *y, const float *r, int dtype, size_t count, bk_ctx *ctx)
{
    long chunks = (long)((count + CVT_CHUNK - 1) / CVT_CHUNK);
    int threads = cpu_threads(ctx);
    if (chunks <= 1 || threads <= 1) {
        accum16_chunk(y, r, dtype, 0, count);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long c = 0; c < chunks; c++) {
        size_t i = (size_t)c * CVT_CHUNK;
        accum16_chunk(y, r, dtype, i, count - i < CVT_CHUNK ? count - i : CVT_CHUNK);
    }
}
