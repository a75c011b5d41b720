/* cuda_runtime.h (emulator) - just enough of the CUDA runtime and device language for the CUDA
 * backend's own sources (the .cu files of kernels/cuda) to compile as host C++ and run on the
 * CPU: every CUDA thread of a block is a coroutine, __syncthreads / __syncwarp / shuffles are
 * barriers between them, a block's threads run to each barrier in turn and blocks run one after
 * another. Device memory is host memory, with the device's size accounted (EMU_DEVICE_MB).
 * A test tool, not a backend: it is slow, it proves nothing about the GPU's rounding or speed,
 * and it runs the kernels' logic - indexing, barriers, shuffles, the libraries' argument
 * conventions - where no GPU is. Only tests/gpu builds it (libddpmd_cuda_emu.so).
 */
#ifndef DDPMD_EMU_CUDA_RUNTIME_H
#define DDPMD_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <tuple>
#include <utility>

using std::isnan;

/* ---- the device language ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

extern uint3 emu_blockIdx;
extern dim3 emu_blockDim, emu_gridDim;
const uint3 &emu_threadIdx();
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define threadIdx (emu_threadIdx())

void __syncthreads();
void emu_syncwarp();
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)mask;
    emu_syncwarp();
}
/* a warp's exchange: each lane publishes 8 bytes, then reads lane src's */
uint64_t emu_exchange(uint64_t mine, int src_lane);
int emu_lane();

template <typename T> static inline T emu_shfl(T v, int src)
{
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = emu_exchange(b, src);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src)
{
    (void)mask;
    return emu_shfl(v, src & 31);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta)
{
    (void)mask;
    int src = emu_lane() + (int)delta;
    return emu_shfl(v, src > 31 ? emu_lane() : src);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m)
{
    (void)mask;
    return emu_shfl(v, (emu_lane() ^ m) & 31);
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

void *emu_dyn_smem();
#define CU_EXTERN_SHARED(type, name) type *name = (type *)emu_dyn_smem()

/* ---- the runtime ---- */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorECCUncorrectable = 214,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchTimeout = 702,
    cudaErrorContextIsDestroyed = 709,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorInvalidConfiguration = 9,
};
typedef enum cudaError cudaError_t;
typedef struct emu_stream *cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
#define cudaStreamNonBlocking 0x01
struct cudaDeviceProp {
    char name[256];
    int major, minor;
};

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaMallocHost(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes)
{
    return cudaMallocHost((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);

/* ---- launches ---- */
struct emu_kernel_call {
    void (*run)(void *);
    void *arg;
};
void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_kernel_call &k);

template <typename... P> struct emu_launch {
    void (*k)(P...);
    dim3 g, b;
    size_t smem;
    template <typename... A> void operator()(A &&...a) const
    {
        std::tuple<P...> args(std::forward<A>(a)...);
        struct pack {
            void (*k)(P...);
            std::tuple<P...> *args;
        } pk = {k, &args};
        emu_kernel_call call = {[](void *v) {
                                    pack *p = (pack *)v;
                                    std::apply(p->k, *p->args);
                                },
                                &pk};
        emu_run_grid(g, b, smem, call);
    }
};
template <typename... P>
static inline emu_launch<P...> emu_launcher(void (*k)(P...), dim3 g, dim3 b, size_t smem,
                                            cudaStream_t s)
{
    (void)s;
    emu_launch<P...> l;
    l.k = k;
    l.g = g;
    l.b = b;
    l.smem = smem;
    return l;
}
#define CU_LAUNCH(kernel, grid, block, smem, stream) emu_launcher(kernel, grid, block, smem, stream)

#endif
