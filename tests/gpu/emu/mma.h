/* mma.h (emulator) - CUDA's warp matrix functions (nvcuda::wmma) for the 16x16x16 shapes the
 * backend uses: half or bfloat16 matrix_a / matrix_b fragments and fp32 accumulators. The
 * mapping of a fragment's elements to lanes is unspecified in CUDA, so here every lane holds the
 * whole tile (num_elements 256): code that is correct for any mapping (element-wise work over
 * x[0, num_elements) alike in every element) runs the same. Every call is warp-collective, as on
 * the GPU: a barrier all 32 lanes must reach (a divergent call deadlocks and aborts), and a
 * pointer must be 256-bit aligned with ldm a multiple of 16 bytes, else the emulator aborts (a
 * GPU faults). mma_sync sums the products in fp32, k in order. See cuda_runtime.h here. */
#ifndef DDPMD_EMU_MMA_H
#define DDPMD_EMU_MMA_H

#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

/* mma_sync calls per input type (emu.cpp, ddpmd_emu_lib_calls lib 2): a warp's call counts once */
void emu_wmma_count(int half);

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has the 16x16x16 shape only");
    enum { num_elements = 256 };
    T x[256];
};

static inline float emu_wmma_f(float v) { return v; }
static inline float emu_wmma_f(__half v) { return __half2float(v); }
static inline float emu_wmma_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* the collective call: every lane here, the operand aligned as CUDA requires */
static inline void emu_wmma_enter(const void *p, unsigned ldm, size_t es, const char *what)
{
    __syncwarp();
    if (((uintptr_t)p & 31) || (ldm * es) % 16) {
        fprintf(stderr, "emu wmma: %s at %p with ldm %u: a pointer must be 256-bit aligned and "
                        "ldm a multiple of 16 bytes\n", what, p, ldm);
        abort();
    }
}

template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
    emu_wmma_enter(p, ldm, sizeof(T), "load_matrix_sync");
    const bool row = std::is_same<L, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = row ? p[r * ldm + c] : p[c * ldm + r];
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t l)
{
    emu_wmma_enter(p, ldm, sizeof(float), "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t l)
{
    emu_wmma_enter(p, ldm, sizeof(float), "store_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

static inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

/* d = a b + c; a (16x16, row r col k at x[r*16+k]), b (k, c at x[k*16+c]) */
template <typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    __syncwarp();
    if (emu_lane() == 0) emu_wmma_count(std::is_same<T, __half>::value);
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i * 16 + j];
            for (int k = 0; k < 16; k++) s += emu_wmma_f(a.x[i * 16 + k]) * emu_wmma_f(b.x[k * 16 + j]);
            out[i * 16 + j] = s;
        }
    for (int i = 0; i < 256; i++) d.x[i] = out[i];
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif
