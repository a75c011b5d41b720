/* cuda_runtime.h (emulator) - just enough of the CUDA runtime and device language for the CUDA
 * backend's own sources (the .cu files of kernels/cuda) to compile as host C++ and run on the
 * CPU: every CUDA thread of a block is a coroutine, __syncthreads / __syncwarp / shuffles are
 * barriers between them, a block's threads run to each barrier in turn and blocks run one after
 * another. Device memory is host memory, with the device's size accounted (EMU_DEVICE_MB).
 * EMU_FAULT_AT_LAUNCH=N plants a sticky fault (an illegal address) at the Nth kernel launch;
 * EMU_ALLOC_LOG=FILE logs every allocation and free with the device bytes held after it.
 * EMU_CC=75 (80, 90...) is the compute capability the device reports (default 90, sm_90).
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
#include <functional>
#include <tuple>
#include <type_traits>
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

/* single-rounding arithmetic that a compiler must not contract into an FMA: the host's
 * compiler could (-mfma with GNU C++'s default -ffp-contract=fast), so each result passes an
 * empty asm that it cannot see through */
static inline float emu_rounded(float v)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(v));
#else
    volatile float t = v;
    v = t;
#endif
    return v;
}
static inline float __fmul_rn(float a, float b) { return emu_rounded(a * b); }
static inline float __fadd_rn(float a, float b) { return emu_rounded(a + b); }
static inline float __fsub_rn(float a, float b) { return emu_rounded(a - b); }
static inline float __fdiv_rn(float a, float b) { return emu_rounded(a / b); }
static inline float __fsqrt_rn(float a) { return emu_rounded(sqrtf(a)); }
static inline double emu_rounded_d(double v)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(v));
#else
    volatile double t = v;
    v = t;
#endif
    return v;
}
static inline double __dmul_rn(double a, double b) { return emu_rounded_d(a * b); }
static inline double __dadd_rn(double a, double b) { return emu_rounded_d(a + b); }
static inline double __dsub_rn(double a, double b) { return emu_rounded_d(a - b); }
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
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorCapturedEvent = 907,
    cudaErrorStreamCaptureWrongThread = 908,
};
typedef enum cudaError cudaError_t;
typedef struct emu_stream *cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
typedef struct emu_event *cudaEvent_t;
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
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
/* pageable host memory: cudaMemoryTypeUnregistered (CUDA 11 on), as the runtime reports it */
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaFreeHost(void *p);

/* ---- the emulator's checks (emu.cpp) ----
 * Device memory is tagged: every cudaMalloc is an allocation the emulator knows (base, size,
 * last writer). A kernel argument that is a non-null pointer outside every device allocation
 * (a host pointer, pinned or not, or a wild one) is an illegal address: the launch does not run
 * and the context is poisoned (sticky cudaErrorIllegalAddress: every later call fails), as a
 * GPU would after the fault. Copies check their kind against the pointers (and the device side
 * against its allocation's end); libraries check their device arguments the same way.
 * Stream order, by byte range: each range of an allocation remembers the stream and sequence
 * number of the last operation that wrote it (non-const kernel pointers, copy and memset
 * destinations, library outputs and workspaces) and, per stream, the last that read it since;
 * an operation on another stream that reads or writes it before that write is known to be done
 * - the host synchronized that stream (or the device), or the stream waited on an event
 * recorded after it - or writes it before such a read is known done, fails
 * (cudaErrorInvalidResourceHandle, with a message): read-after-write, write-after-write and
 * write-after-read. Copies, memsets and library calls name their bytes; a kernel's pointer
 * argument is the object starting there (one byte) unless CU_TOUCHES named its bytes. Host
 * reads of a D2H destination before the sync are not checked.
 * Host memory of async copies: cudaMemcpyAsync between the device and pageable host memory
 * is counted (ddpmd_emu_get_stats: a GPU stages it, so it does not overlap anything) and a
 * pageable download syncs its stream, as the runtime's does; one with page-locked memory is
 * done late - when the stream's next operation runs or something synchronizes with it - so a
 * host that reads a download's destination (or writes an upload's source) before the sync
 * gets other bytes, as it may on a GPU. */
/* the stream order check for [p, p+bytes) (bytes 0: the pointer only) used by stream s */
cudaError_t emu_use(cudaStream_t s, const void *p, size_t bytes, int write, const char *what);
struct emu_ptr_arg {
    const void *p;
    int write;
};
/* a launch's pointer arguments: checked (tags, stream order) before it runs */
cudaError_t emu_launch_check(cudaStream_t s, const emu_ptr_arg *a, int n);
void emu_launch_done(cudaStream_t s, const emu_ptr_arg *a, int n);
/* CU_TOUCHES(p, bytes) before a launch: its pointer argument p touches [p, p + bytes) */
void emu_touches(const void *p, size_t bytes);
#define CU_TOUCHES(p, bytes) emu_touches((p), (bytes))
/* CU_WARMING: launches between CU_WARMING(1) and CU_WARMING(0) are not counted by
 * EMU_FAULT_AT_LAUNCH (nor faulted) */
void emu_warming(int on);
#define CU_WARMING(on) emu_warming(on)

/* ---- launches ---- */
struct emu_kernel_call {
    void (*run)(void *);
    void *arg;
};
void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_kernel_call &k);

template <typename T> static inline void emu_note_arg(const T &v, emu_ptr_arg *a, int *n)
{
    if constexpr (std::is_pointer<T>::value) {
        a[*n].p = (const void *)v;
        a[*n].write = !std::is_const<typename std::remove_pointer<T>::type>::value;
        ++*n;
    }
}

/* stream capture (graph.cpp): a launch on a capturing stream is recorded instead of run (1), to
 * run with `run` on the stream a cudaGraphLaunch names; 0: not capturing, run it now */
int emu_capture_launch(cudaStream_t s, std::function<cudaError_t(cudaStream_t)> run);

template <typename... P> struct emu_launch {
    void (*k)(P...);
    dim3 g, b;
    size_t smem;
    cudaStream_t s;
    template <typename... A> void operator()(A &&...a) const
    {
        std::tuple<P...> args(std::forward<A>(a)...);
        const emu_launch self = *this;
        if (emu_capture_launch(s, [self, args](cudaStream_t st) { return self.run(st, args); }))
            return;
        (void)run(s, args);
    }
    /* the launch on stream st: its pointer arguments checked, the grid run */
    cudaError_t run(cudaStream_t st, const std::tuple<P...> &args0) const
    {
        std::tuple<P...> args(args0);
        emu_ptr_arg ptrs[sizeof...(P) + 1];
        int np = 0;
        std::apply([&](const auto &...x) { (emu_note_arg(x, ptrs, &np), ...); }, args);
        cudaError_t e = emu_launch_check(st, ptrs, np);
        if (e != cudaSuccess) return e;
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
        emu_launch_done(st, ptrs, np);
        return cudaSuccess;
    }
};
template <typename... P>
static inline emu_launch<P...> emu_launcher(void (*k)(P...), dim3 g, dim3 b, size_t smem,
                                            cudaStream_t s)
{
    emu_launch<P...> l;
    l.s = s;
    l.k = k;
    l.g = g;
    l.b = b;
    l.smem = smem;
    return l;
}
#define CU_LAUNCH(kernel, grid, block, smem, stream) emu_launcher(kernel, grid, block, smem, stream)

/* ---- stream capture and graphs (graph.cpp) ----
 * Between cudaStreamBeginCapture and cudaStreamEndCapture a stream records what it is given -
 * kernel launches, copies and memsets with device or page-locked memory, cuBLAS's and cuDNN's
 * calls (with the descriptors, scalars, math mode and workspace they had) - and runs none of
 * it; cudaGraphLaunch runs the record in order on its stream through the same checks as a
 * direct call (pointer tags, stream order, faults). What a capture refuses, as CUDA's does, is
 * refused and invalidates it (cudaStreamEndCapture then fails with
 * cudaErrorStreamCaptureInvalidated): a synchronization of the capturing stream, of the device
 * or of an event recorded in the capture, cudaMalloc / cudaFree (and their host forms) on the
 * capturing thread, a copy with pageable host memory (it would be synchronous: a host read of
 * device memory), cuDNN's finders, waits on events recorded outside the capture. One stream per
 * capture: another stream joining it (a wait on a captured event) is not emulated and refused. */
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph_exec *cudaGraphExec_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

#endif
