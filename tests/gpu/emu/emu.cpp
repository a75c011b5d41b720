/* emu.cpp - the emulator behind tests/gpu/emu's headers: a coroutine per CUDA thread
 * (ucontext), blocks run one after another, barriers and warp exchanges between a block's
 * coroutines; the runtime's memory with the device's size accounted; a naive column-major SGEMM;
 * naive direct convolutions behind cuDNN's legacy API. Deadlocks (a barrier some threads of a
 * warp or block never reach) abort with a message: they would hang a GPU.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <map>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"
#include "cudnn.h"
#include "emu_stats.h"
/* the calls graph.cpp wraps for stream capture are defined here as emu_now_* */
#define EMU_RENAME_NOW
#include "emu_internal.h"

/* ---- the SIMT scheduler ---- */

#define EMU_STACK (256 * 1024)
#define EMU_MAX_THREADS 1024

enum { T_RUN = 0, T_WAIT = 1, T_DONE = 2 };
enum { W_BLOCK = 0, W_WARP = 1 };

/* a coroutine starts through makecontext/swapcontext and then switches with _setjmp/_longjmp,
 * which unlike swapcontext make no system call (the signal mask is left alone) */
struct emu_thread {
    ucontext_t ctx;
    jmp_buf jb;
    uint3 tid;
    int lin, state, wait, started;
    unsigned exchanges; /* this lane's count: picks the slot buffer */
};

uint3 emu_blockIdx;
dim3 emu_blockDim, emu_gridDim;

static emu_thread g_threads[EMU_MAX_THREADS];
static char *g_stacks[EMU_MAX_THREADS];
static ucontext_t g_sched;
static jmp_buf g_sched_jb;
static int g_cur = -1, g_nthreads;
static const emu_kernel_call *g_call;
static std::vector<unsigned char> g_smem;
static uint64_t g_slots[2][EMU_MAX_THREADS];
static pthread_mutex_t g_launch_lock = PTHREAD_MUTEX_INITIALIZER;

const uint3 &emu_threadIdx() { return g_threads[g_cur].tid; }
int emu_lane() { return g_threads[g_cur].lin & 31; }
void *emu_dyn_smem() { return g_smem.data(); }

static void emu_wait(int kind)
{
    emu_thread *t = &g_threads[g_cur];
    t->state = T_WAIT;
    t->wait = kind;
    if (!_setjmp(t->jb)) _longjmp(g_sched_jb, 1);
}

void __syncthreads() { emu_wait(W_BLOCK); }
void emu_syncwarp() { emu_wait(W_WARP); }

/* two slot buffers used in turn: a lane writes buffer b again only after the barrier of the
 * next exchange, which every lane reaches after reading buffer b - one barrier per exchange */
uint64_t emu_exchange(uint64_t mine, int src_lane)
{
    emu_thread *t = &g_threads[g_cur];
    const int lin = t->lin, base = lin & ~31;
    uint64_t *slots = g_slots[t->exchanges++ & 1];
    slots[lin] = mine;
    emu_wait(W_WARP);
    return base + src_lane < g_nthreads ? slots[base + src_lane] : mine;
}

/* a coroutine lives across blocks and launches: it runs the kernel, reports done, and waits
 * there to run it again for the next block (no context is made twice) */
static void emu_entry()
{
    for (;;) {
        g_call->run(g_call->arg);
        emu_thread *t = &g_threads[g_cur];
        t->state = T_DONE;
        if (!_setjmp(t->jb)) _longjmp(g_sched_jb, 1);
    }
}

/* thread i's coroutine, started by its first emu_resume */
__attribute__((noinline)) static void emu_make(int i)
{
    emu_thread *t = &g_threads[i];
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = g_stacks[i];
    t->ctx.uc_stack.ss_size = EMU_STACK;
    t->ctx.uc_link = &g_sched;
    makecontext(&t->ctx, emu_entry, 0);
}

/* run thread i until it waits or ends */
__attribute__((noinline)) static void emu_resume(int i)
{
    emu_thread *t = &g_threads[i];
    g_cur = i;
    if (_setjmp(g_sched_jb)) return;
    if (!t->started) {
        t->started = 1;
        swapcontext(&g_sched, &t->ctx);
        abort(); /* unreachable: threads come back through g_sched_jb */
    }
    _longjmp(t->jb, 1);
}

void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_kernel_call &k)
{
    pthread_mutex_lock(&g_launch_lock);
    const int nt = (int)(block.x * block.y * block.z);
    if (nt < 1 || nt > EMU_MAX_THREADS || grid.x < 1 || grid.y < 1 || grid.z < 1 ||
        grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "emu: bad launch configuration (%u,%u,%u) x (%u,%u,%u)\n", grid.x, grid.y,
                grid.z, block.x, block.y, block.z);
        abort();
    }
    if (smem > 48 * 1024) {
        fprintf(stderr, "emu: %zu bytes of dynamic shared memory (over 48 KiB without opt-in)\n",
                smem);
        abort();
    }
    g_call = &k;
    g_nthreads = nt;
    emu_blockDim = block;
    emu_gridDim = grid;
    g_smem.assign(smem ? smem : 16, 0xFF); /* garbage (NaN floats), as on a GPU */
    for (int i = 0; i < nt; i++)
        if (!g_stacks[i]) g_stacks[i] = (char *)malloc(EMU_STACK);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_blockIdx = uint3{bx, by, bz};
                for (int i = 0; i < nt; i++) {
                    emu_thread *t = &g_threads[i];
                    t->lin = i;
                    t->tid = uint3{(unsigned)i % block.x, ((unsigned)i / block.x) % block.y,
                                   (unsigned)i / (block.x * block.y)};
                    t->state = T_RUN;
                    t->exchanges = 0;
                    if (!t->started) emu_make(i);
                }
                for (;;) {
                    /* each warp runs on through its warp barriers until its lanes wait at
                     * the block barrier or are done */
                    for (int w = 0; w < nt; w += 32) {
                        const int we = w + 32 < nt ? w + 32 : nt;
                        for (;;) {
                            for (int i = w; i < we; i++)
                                if (g_threads[i].state == T_RUN) emu_resume(i);
                            int n = 0, at = 0;
                            for (int i = w; i < we; i++)
                                if (g_threads[i].state != T_DONE) {
                                    n++;
                                    at += g_threads[i].wait == W_WARP;
                                }
                            if (n && at == n) {
                                for (int i = w; i < we; i++)
                                    if (g_threads[i].state == T_WAIT) g_threads[i].state = T_RUN;
                                continue;
                            }
                            if (at) {
                                fprintf(stderr, "emu: deadlock in block (%u,%u,%u), warp %d: "
                                                "lanes wait at a warp barrier others never "
                                                "reach\n", bx, by, bz, w / 32);
                                abort();
                            }
                            break;
                        }
                    }
                    int live = 0;
                    for (int i = 0; i < nt; i++)
                        if (g_threads[i].state != T_DONE) {
                            live++;
                            g_threads[i].state = T_RUN; /* all wait at the block barrier */
                        }
                    if (!live) break;
                }
            }
    g_cur = -1;
    pthread_mutex_unlock(&g_launch_lock);
}

/* ---- the runtime ---- */

/* a byte range [start, end) of an allocation with the stream operations that last touched it:
 * the last write, and per stream the last read since that write */
struct emu_seg {
    uintptr_t end;
    int wstream;   /* the stream that wrote it last, -1: none yet */
    uint64_t wseq; /* that write's sequence number on its stream */
    std::vector<std::pair<int, uint64_t>> readers; /* (stream, sequence number) */
};
/* one device allocation (or a pinned host one: host memory, never a kernel's argument); its
 * ranges by start, made as operations touch them */
struct emu_alloc {
    size_t bytes, rounded;
    int pinned;
    std::map<uintptr_t, emu_seg> segs;
};
/* an async copy between the device and page-locked host memory, not done yet */
struct emu_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t seq; /* the operation it is on its stream */
};
/* a stream: id, operations enqueued so far, and per other stream the sequence number this one
 * is known to be ordered after (cudaStreamWaitEvent). Its copies with page-locked host memory
 * are done late, as a GPU's DMA may be: when the next operation on the stream runs, or when
 * the host or another stream synchronizes with it; a host that reads a download's destination,
 * or writes an upload's source, before that sees the other bytes (a test's results change). */
struct emu_stream {
    int id;
    uint64_t seq;
    std::vector<uint64_t> after;
    std::vector<emu_copy> pending;
};
struct emu_event {
    int stream;
    uint64_t seq;
};

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static std::map<uintptr_t, emu_alloc> g_allocs;
static size_t g_used;
static ddpmd_emu_stats g_stats;             /* ddpmd_emu_get_stats */
/* by id; 0 is the NULL stream. Streams are retired, never deleted, while the process runs;
 * they are freed with the table at exit (LeakSanitizer checks after static destructors) */
struct emu_stream_table : std::vector<emu_stream *> {
    ~emu_stream_table() { for (emu_stream *st : *this) delete st; }
};
static emu_stream_table g_streams;
static std::vector<uint64_t> g_done;        /* per stream: done as far as the host knows */
static cudaError_t g_sticky;                /* a fault poisoned the context */
static thread_local cudaError_t tl_last;    /* cudaGetLastError's, per host thread */

static size_t emu_total(void)
{
    const char *v = getenv("EMU_DEVICE_MB");
    size_t mb = v && *v ? strtoull(v, NULL, 10) : 16384;
    return mb << 20;
}

/* the emulated device's compute capability, major * 10 + minor: EMU_CC (e.g. 75, 80), sm_90 by
 * default. What it decides: the libraries' 16-bit support (bf16 from sm_80) and what the
 * backend reports it can run natively */
static int emu_cc(void)
{
    const char *v = getenv("EMU_CC");
    const long cc = v && *v ? strtol(v, NULL, 10) : 90;
    return cc >= 10 && cc <= 199 ? (int)cc : 90;
}

/* an error of a call: recorded for cudaGetLastError */
static cudaError_t emu_err(cudaError_t e)
{
    if (e != cudaSuccess) tl_last = e;
    return e;
}
cudaError_t emu_error(cudaError_t e) { return emu_err(e); }

/* a fault: the context is poisoned, every later call returns it */
static cudaError_t emu_fault(cudaError_t e)
{
    if (g_sticky == cudaSuccess) g_sticky = e;
    tl_last = e;
    return e;
}

static emu_stream *stream_of(cudaStream_t s)
{
    if (g_streams.empty()) {
        g_streams.push_back(new emu_stream{0, 0, {}, {}});
        g_done.push_back(0);
    }
    return s ? (emu_stream *)s : g_streams[0];
}

/* st's late copies up to its operation upto done (mem lock held) */
static void copies_done(emu_stream *st, uint64_t upto)
{
    size_t i = 0;
    for (; i < st->pending.size() && st->pending[i].seq <= upto; i++)
        memmove(st->pending[i].dst, st->pending[i].src, st->pending[i].bytes);
    st->pending.erase(st->pending.begin(), st->pending.begin() + i);
}
static void all_copies_done(void)
{
    for (emu_stream *st : g_streams) copies_done(st, UINT64_MAX);
}

/* the allocation holding p (mem lock held), NULL if none */
static emu_alloc *find_alloc(const void *p, uintptr_t *base)
{
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return NULL;
    --it;
    if (a >= it->first + (it->second.bytes ? it->second.bytes : 1)) return NULL;
    if (base) *base = it->first;
    return &it->second;
}

static int is_device(const void *p)
{
    emu_alloc *al = find_alloc(p, NULL);
    return al && !al->pinned;
}

int emu_is_pinned(const void *p)
{
    pthread_mutex_lock(&g_mem_lock);
    emu_alloc *al = find_alloc(p, NULL);
    const int pinned = al && al->pinned;
    pthread_mutex_unlock(&g_mem_lock);
    return pinned;
}

/* whether stream st is known to come after operation seq of stream w (mem lock held): the same
 * stream, the host synchronized w past it, or st waited on an event recorded after it */
static int ordered_after(const emu_stream *st, int w, uint64_t seq)
{
    if (w < 0 || w == st->id || g_done[w] >= seq) return 1;
    return (size_t)w < st->after.size() && st->after[w] >= seq;
}

/* the range starting at x made a segment boundary of al (a segment holding x split in two) */
static void seg_split(emu_alloc *al, uintptr_t x)
{
    auto it = al->segs.upper_bound(x);
    if (it == al->segs.begin()) return;
    --it;
    if (it->first == x || it->second.end <= x) return;
    emu_seg tail = it->second;
    it->second.end = x;
    al->segs.emplace(x, tail);
}

/* mem lock held; bytes 0: the object starting at p (a kernel's pointer argument: the bytes it
 * reaches are not known, CU_TOUCHES names them). cudaErrorIllegalAddress (the caller decides
 * whether that is a fault) or cudaErrorInvalidResourceHandle for a stream order violation:
 * read or write after another stream's write, or write after another stream's read, with no
 * host sync or event wait between them. */
static cudaError_t use_locked(emu_stream *st, const void *p, size_t bytes, int write,
                              const char *what)
{
    uintptr_t base = 0;
    emu_alloc *al = find_alloc(p, &base);
    if (!al || al->pinned) {
        fprintf(stderr, "emu: %s: %p is not device memory (a host pointer%s)\n", what, p,
                al ? ", pinned" : " or a wild one");
        return cudaErrorIllegalAddress;
    }
    if (bytes && (uintptr_t)p + bytes > base + al->bytes) {
        fprintf(stderr, "emu: %s: %zu bytes at offset %zu run past the allocation's %zu\n", what,
                bytes, (size_t)((uintptr_t)p - base), al->bytes);
        return cudaErrorIllegalAddress;
    }
    const uintptr_t a = (uintptr_t)p, b = a + (bytes ? bytes : 1);
    seg_split(al, a);
    seg_split(al, b);
    for (uintptr_t pos = a; pos < b;) { /* the gaps: segments nothing touched yet */
        auto it = al->segs.lower_bound(pos);
        if (it != al->segs.end() && it->first == pos) {
            pos = it->second.end;
            continue;
        }
        const uintptr_t end = it == al->segs.end() || it->first > b ? b : it->first;
        al->segs.emplace(pos, emu_seg{end, -1, 0, {}});
        pos = end;
    }
    const auto first = al->segs.lower_bound(a), last = al->segs.lower_bound(b);
    for (auto it = first; it != last; ++it) {
        const emu_seg &sg = it->second;
        const char *hazard = NULL; /* "write after read" and the like */
        int other = -1;
        uint64_t oseq = 0;
        if (!ordered_after(st, sg.wstream, sg.wseq)) {
            hazard = write ? "write after write" : "read after write";
            other = sg.wstream;
            oseq = sg.wseq;
        } else if (write) {
            for (const auto &r : sg.readers)
                if (!ordered_after(st, r.first, r.second)) {
                    hazard = "write after read";
                    other = r.first;
                    oseq = r.second;
                    break;
                }
        }
        if (hazard) {
            fprintf(stderr, "emu: stream order (%s): %s on stream %d touches bytes [%zu, %zu) "
                            "of the allocation at %p while stream %d's operation %llu there is "
                            "not known done (no sync or event wait after it)\n", hazard, what,
                    st->id, (size_t)(it->first - base), (size_t)(sg.end - base), (void *)base,
                    other, (unsigned long long)oseq);
            return cudaErrorInvalidResourceHandle;
        }
    }
    const uint64_t seq = st->seq + 1; /* the operation being enqueued */
    if (write) {
        al->segs.erase(first, last);
        al->segs.emplace(a, emu_seg{b, st->id, seq, {}});
        return cudaSuccess;
    }
    for (auto it = first; it != last; ++it) {
        auto &rd = it->second.readers;
        size_t i = 0;
        while (i < rd.size() && rd[i].first != st->id) i++;
        if (i == rd.size()) rd.emplace_back(st->id, seq);
        else rd[i].second = seq;
    }
    return cudaSuccess;
}

/* fault: a bad pointer is an illegal address in a kernel (the context poisoned); else the
 * runtime refuses the call (cudaErrorInvalidValue) before anything runs */
static cudaError_t use_ex(cudaStream_t s, const void *p, size_t bytes, int write,
                          const char *what, int fault)
{
    pthread_mutex_lock(&g_mem_lock);
    cudaError_t e = g_sticky;
    if (e == cudaSuccess) {
        emu_stream *st = stream_of(s);
        copies_done(st, UINT64_MAX); /* the stream's earlier work is done before this runs */
        e = use_locked(st, p, bytes, write, what);
        if (e == cudaErrorIllegalAddress && fault) e = emu_fault(e);
        else if (e == cudaErrorIllegalAddress) e = emu_err(cudaErrorInvalidValue);
        else e = emu_err(e);
    }
    pthread_mutex_unlock(&g_mem_lock);
    return e;
}
cudaError_t emu_use(cudaStream_t s, const void *p, size_t bytes, int write, const char *what)
{
    return use_ex(s, p, bytes, write, what, 1);
}

/* one operation enqueued on s (its writes were tagged with seq + 1) */
static void emu_enqueued(cudaStream_t s)
{
    pthread_mutex_lock(&g_mem_lock);
    stream_of(s)->seq++;
    pthread_mutex_unlock(&g_mem_lock);
}

/* EMU_FAULT_AT_LAUNCH=N: the Nth kernel launch of the process (from 1) faults as an illegal
 * address would (the context poisoned), so a test can make a whole program (ddpmd train) meet a
 * sticky error where a real GPU would; 0 or unset: never (mem lock held) */
static int g_warming; /* emu_warming: the backend's warm-up launches, not counted */
void emu_warming(int on)
{
    pthread_mutex_lock(&g_mem_lock);
    g_warming = on;
    pthread_mutex_unlock(&g_mem_lock);
}

static int planted_fault(void)
{
    static long at = -1, launches;
    if (g_warming) return 0;
    if (at < 0) {
        const char *v = getenv("EMU_FAULT_AT_LAUNCH");
        at = v && *v ? strtol(v, NULL, 10) : 0;
        if (at < 0) at = 0;
    }
    if (!at || ++launches != at) return 0;
    fprintf(stderr, "emu: kernel launch %ld faults (EMU_FAULT_AT_LAUNCH)\n", launches);
    return 1;
}

/* CU_TOUCHES: the bytes the next launch's pointer arguments touch, where the caller named them
 * (plain thread-local data: LeakSanitizer's tracer fails on a dlopen'ed module's thread_local
 * objects with destructors) */
static thread_local emu_touch tl_touch[EMU_TOUCHES];
static thread_local int tl_ntouch;
void emu_touches(const void *p, size_t bytes)
{
    if (tl_ntouch == EMU_TOUCHES) {
        fprintf(stderr, "emu: more than %d CU_TOUCHES before a launch\n", EMU_TOUCHES);
        abort();
    }
    tl_touch[tl_ntouch].p = p;
    tl_touch[tl_ntouch++].bytes = bytes;
}

int emu_touches_take(struct emu_touch *t)
{
    const int n = tl_ntouch;
    memcpy(t, tl_touch, (size_t)n * sizeof *t);
    tl_ntouch = 0;
    return n;
}

cudaError_t emu_launch_check(cudaStream_t s, const emu_ptr_arg *a, int n)
{
    const int ntouch = tl_ntouch;
    tl_ntouch = 0;
    pthread_mutex_lock(&g_mem_lock);
    cudaError_t e = g_sticky;
    emu_stream *st = stream_of(s);
    copies_done(st, UINT64_MAX);
    if (e == cudaSuccess && planted_fault()) e = emu_fault(cudaErrorIllegalAddress);
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if (!a[i].p) continue;
        char what[64];
        snprintf(what, sizeof what, "kernel argument (pointer %d)", i);
        size_t bytes = 0;
        for (int t = 0; t < ntouch; t++)
            if (tl_touch[t].p == a[i].p) bytes = tl_touch[t].bytes;
        e = use_locked(st, a[i].p, bytes, a[i].write, what);
        if (e == cudaErrorIllegalAddress) e = emu_fault(e);
    }
    if (e != cudaSuccess) {
        emu_err(e);
    }
    pthread_mutex_unlock(&g_mem_lock);
    return e;
}

void emu_launch_done(cudaStream_t s, const emu_ptr_arg *, int) { emu_enqueued(s); }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaErrorEmulated";
    }
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return cudaGetErrorName(e);
    }
}
/* the last error of this thread, cleared; a sticky one stays */
cudaError_t cudaGetLastError(void)
{
    pthread_mutex_lock(&g_mem_lock);
    cudaError_t e = g_sticky != cudaSuccess ? g_sticky : tl_last;
    tl_last = cudaSuccess;
    pthread_mutex_unlock(&g_mem_lock);
    return e;
}
cudaError_t cudaPeekAtLastError(void)
{
    pthread_mutex_lock(&g_mem_lock);
    cudaError_t e = g_sticky != cudaSuccess ? g_sticky : tl_last;
    pthread_mutex_unlock(&g_mem_lock);
    return e;
}
/* every call starts with this: a poisoned context fails them all */
#define EMU_STICKY()                                                                           \
    do {                                                                                       \
        if (g_sticky != cudaSuccess) return emu_err(g_sticky);                                 \
    } while (0)

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
    EMU_STICKY();
    return emu_err(d == 0 ? cudaSuccess : cudaErrorInvalidValue);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "ddpmd SIMT emulator (host)");
    const int cc = emu_cc();
    p->major = cc / 10;
    p->minor = cc % 10;
    p->totalGlobalMem = emu_total();
    return emu_err(d == 0 ? cudaSuccess : cudaErrorInvalidValue);
}

/* EMU_ALLOC_LOG=FILE: a line per allocation and free, "malloc|free|host|freehost BYTES USED"
 * (USED: the device bytes held after it), so a test can see every byte a whole program
 * (ddpmd train) held on the device and when (mem lock held) */
static void alloc_log(const char *what, size_t bytes)
{
    static FILE *f;
    static int tried;
    if (!tried) {
        tried = 1;
        const char *path = getenv("EMU_ALLOC_LOG");
        if (path && *path) f = fopen(path, "a");
        if (f) setvbuf(f, NULL, _IOLBF, 0);
    }
    if (f) fprintf(f, "%s %zu %zu\n", what, bytes, g_used);
}

/* the device's memory (the driver's 2 MiB granularity) or pinned host memory; pinned 2: a
 * library's module (counted in modules, not mallocs; logged as a malloc) */
static cudaError_t emu_malloc(void **p, size_t bytes, int pinned)
{
    const size_t g = (size_t)2 << 20;
    const int module = pinned == 2;
    if (module) pinned = 0;
    size_t rounded = pinned ? 0 : (bytes + g - 1) & ~(g - 1);
    *p = NULL;
    if (emu_capture_refuses(pinned ? "cudaMallocHost" : "cudaMalloc"))
        return emu_err(cudaErrorStreamCaptureUnsupported);
    pthread_mutex_lock(&g_mem_lock);
    if (g_sticky != cudaSuccess) {
        cudaError_t e = emu_err(g_sticky);
        pthread_mutex_unlock(&g_mem_lock);
        return e;
    }
    if (g_used + rounded > emu_total()) {
        pthread_mutex_unlock(&g_mem_lock);
        return emu_err(cudaErrorMemoryAllocation);
    }
    void *q = aligned_alloc(256, (bytes + 255) & ~(size_t)255 ? (bytes + 255) & ~(size_t)255 : 256);
    if (!q) {
        pthread_mutex_unlock(&g_mem_lock);
        return emu_err(cudaErrorMemoryAllocation);
    }
    memset(q, 0xFF, bytes); /* not zeroed, as on a GPU */
    g_allocs[(uintptr_t)q] = emu_alloc{bytes, rounded, pinned, {}};
    g_used += rounded;
    if (g_used > g_stats.peak) g_stats.peak = g_used;
    if (pinned) {
        g_stats.host_mallocs++;
    } else if (module) {
        g_stats.modules++;
    } else {
        g_stats.mallocs++;
        g_stats.last_malloc = bytes;
    }
    alloc_log(pinned ? "host" : "malloc", bytes);
    pthread_mutex_unlock(&g_mem_lock);
    *p = q;
    return cudaSuccess;
}
static cudaError_t emu_free(void *p, int pinned)
{
    if (!p) return cudaSuccess;
    if (emu_capture_refuses(pinned ? "cudaFreeHost" : "cudaFree"))
        return emu_err(cudaErrorStreamCaptureUnsupported);
    pthread_mutex_lock(&g_mem_lock);
    all_copies_done();
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.pinned != pinned) {
        pthread_mutex_unlock(&g_mem_lock);
        fprintf(stderr, "emu: %s of %p, not a %s allocation\n", pinned ? "cudaFreeHost" : "cudaFree",
                p, pinned ? "pinned host" : "device");
        return emu_err(cudaErrorInvalidValue);
    }
    g_used -= it->second.rounded;
    alloc_log(pinned ? "freehost" : "free", it->second.bytes);
    g_allocs.erase(it);
    g_stats.frees++;
    cudaError_t e = g_sticky; /* the memory goes, the error stays */
    pthread_mutex_unlock(&g_mem_lock);
    free(p);
    return emu_err(e);
}
cudaError_t cudaMalloc(void **p, size_t bytes) { return emu_malloc(p, bytes, 0); }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return emu_malloc(p, bytes, 1); }
cudaError_t cudaFree(void *p)
{
    if (!p) {
        EMU_STICKY();
        return cudaSuccess;
    }
    return emu_free(p, 0);
}
cudaError_t cudaFreeHost(void *p) { return emu_free(p, 1); }

/* the copy kind must match the pointers (cudaMemcpyDefault infers it) */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s)
{
    EMU_STICKY();
    if (!bytes) return cudaSuccess;
    if (!dst || !src) return emu_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mem_lock);
    const int dd = is_device(dst), sd = is_device(src);
    pthread_mutex_unlock(&g_mem_lock);
    if (k == cudaMemcpyDefault)
        k = (cudaMemcpyKind)(sd ? (dd ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                : (dd ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost));
    const int want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const int want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k < cudaMemcpyHostToHost || k > cudaMemcpyDeviceToDevice)
        return emu_err(cudaErrorInvalidMemcpyDirection);
    if (dd != want_dd || sd != want_sd) {
        fprintf(stderr, "emu: cudaMemcpyAsync kind %d: the destination %p is %s memory and the "
                        "source %p %s memory\n", (int)k, dst, dd ? "device" : "host", src,
                sd ? "device" : "host");
        return emu_err(cudaErrorInvalidValue);
    }
    cudaError_t e;
    if (sd && (e = use_ex(s, src, bytes, 0, "cudaMemcpyAsync source", 0))) return e;
    if (dd && (e = use_ex(s, dst, bytes, 1, "cudaMemcpyAsync destination", 0))) return e;
    pthread_mutex_lock(&g_mem_lock);
    emu_alloc *h = sd != dd ? find_alloc(dd ? src : dst, NULL) : NULL;
    const int pinned = h && h->pinned;
    emu_stream *cs = stream_of(s);
    if (pinned) /* done late (emu_stream) */
        cs->pending.push_back(emu_copy{dst, src, bytes, cs->seq + 1});
    else
        memmove(dst, src, bytes);
    pthread_mutex_unlock(&g_mem_lock);
    emu_enqueued(s);
    if (sd != dd) {
        /* the host side: page-locked, or pageable, which a GPU copies through a staging buffer:
         * not asynchronous, and a download returns only when it is done (its stream synced) */
        pthread_mutex_lock(&g_mem_lock);
        if (pinned) {
            g_stats.async_pinned++;
        } else {
            g_stats.async_pageable++;
            if (sd) {
                emu_stream *st = stream_of(s);
                g_done[st->id] = st->seq;
            }
        }
        pthread_mutex_unlock(&g_mem_lock);
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s)
{
    EMU_STICKY();
    if (!bytes) return cudaSuccess;
    cudaError_t e = use_ex(s, dst, bytes, 1, "cudaMemsetAsync", 0);
    if (e) return e;
    memset(dst, v, bytes);
    emu_enqueued(s);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    EMU_STICKY();
    if (!a) return emu_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mem_lock);
    emu_alloc *al = find_alloc(p, NULL);
    a->type = !al ? cudaMemoryTypeUnregistered : al->pinned ? cudaMemoryTypeHost
                                                             : cudaMemoryTypeDevice;
    a->device = 0;
    a->devicePointer = al ? (void *)p : NULL;
    a->hostPointer = al && al->pinned ? (void *)p : NULL;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    EMU_STICKY();
    pthread_mutex_lock(&g_mem_lock);
    *total_b = emu_total();
    *free_b = *total_b - g_used;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    EMU_STICKY();
    pthread_mutex_lock(&g_mem_lock);
    stream_of(NULL);
    emu_stream *st = new emu_stream{(int)g_streams.size(), 0, {}, {}};
    g_streams.push_back(st);
    g_done.push_back(0);
    pthread_mutex_unlock(&g_mem_lock);
    *s = (cudaStream_t)st;
    return cudaSuccess;
}
/* streams are never deleted (allocations may name them as their last writer): retired */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    EMU_STICKY();
    return s ? cudaSuccess : emu_err(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    EMU_STICKY();
    pthread_mutex_lock(&g_mem_lock);
    emu_stream *st = stream_of(s);
    copies_done(st, UINT64_MAX);
    g_done[st->id] = st->seq;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    EMU_STICKY();
    pthread_mutex_lock(&g_mem_lock);
    stream_of(NULL);
    all_copies_done();
    for (size_t i = 0; i < g_streams.size(); i++) g_done[i] = g_streams[i]->seq;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    EMU_STICKY();
    *e = new emu_event{-1, 0};
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    EMU_STICKY();
    if (!e) return emu_err(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mem_lock);
    emu_stream *st = stream_of(s);
    e->stream = st->id;
    e->seq = st->seq;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    EMU_STICKY();
    if (!e) return emu_err(cudaErrorInvalidResourceHandle);
    if (e->stream < 0) return cudaSuccess; /* never recorded: nothing to wait for */
    pthread_mutex_lock(&g_mem_lock);
    emu_stream *st = stream_of(s);
    copies_done(g_streams[e->stream], e->seq);
    if (st->after.size() <= (size_t)e->stream) st->after.resize(e->stream + 1, 0);
    if (st->after[e->stream] < e->seq) st->after[e->stream] = e->seq;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    EMU_STICKY();
    if (!e) return emu_err(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mem_lock);
    if (e->stream >= 0) copies_done(g_streams[e->stream], e->seq);
    if (e->stream >= 0 && g_done[e->stream] < e->seq) g_done[e->stream] = e->seq;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

/* a library call used [ws, ws + bytes) as its workspace */
static void emu_ws_used(const void *ws, size_t bytes, int blas)
{
    if (!ws || !bytes) return;
    pthread_mutex_lock(&g_mem_lock);
    g_stats.blas_ws_uses += blas;
    const uintptr_t lo = (uintptr_t)ws, hi = lo + bytes;
    if (!g_stats.ws_uses || lo < g_stats.ws_lo) g_stats.ws_lo = lo;
    if (!g_stats.ws_uses || hi > g_stats.ws_hi) g_stats.ws_hi = hi;
    g_stats.ws_uses++;
    pthread_mutex_unlock(&g_mem_lock);
}

extern "C" __attribute__((visibility("default"))) void
ddpmd_emu_get_stats(struct ddpmd_emu_stats *out, int reset)
{
    pthread_mutex_lock(&g_mem_lock);
    g_stats.used = g_used;
    if (out) *out = g_stats;
    if (reset) {
        memset(&g_stats, 0, sizeof g_stats);
        g_stats.used = g_stats.peak = g_used;
    }
    pthread_mutex_unlock(&g_mem_lock);
}

/* ---- cuBLAS ---- */

#define EMU_LIB_STATE_BYTES ((size_t)64 << 10)    /* a handle's own device memory */
#define EMU_CUBLAS_DEFAULT_WS ((size_t)4 << 20)   /* cuBLAS's workspace when none was set */
#define EMU_CUBLAS_GEMM_WS ((size_t)1 << 20)      /* what one GEMM uses of a workspace at most */

struct emu_cublas {
    int math;
    cudaStream_t stream;
    void *state;     /* device memory of the handle's own */
    int ws_set;      /* cublasSetWorkspace called */
    void *ws;        /* the user's workspace, or the default one */
    size_t ws_bytes;
    void *own_ws;    /* the default workspace, allocated by the first GEMM without ws_set */
};
cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    emu_cublas *c = new emu_cublas();
    if (cudaMalloc(&c->state, EMU_LIB_STATE_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        delete c;
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    (void)cudaFree(h->own_ws);
    (void)cudaFree(h->state);
    (void)cudaGetLastError();
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
/* the workspace must be device memory, 256-byte aligned, within its allocation */
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (ws && ((uintptr_t)ws & 255)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!ws && bytes) return CUBLAS_STATUS_INVALID_VALUE;
    if (ws && bytes) {
        pthread_mutex_lock(&g_mem_lock);
        uintptr_t base = 0;
        emu_alloc *al = find_alloc(ws, &base);
        int ok = al && !al->pinned && (uintptr_t)ws + bytes <= base + al->bytes;
        pthread_mutex_unlock(&g_mem_lock);
        if (!ok) {
            fprintf(stderr, "emu cublas: cublasSetWorkspace(%p, %zu): not within a device "
                            "allocation\n", ws, bytes);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    (void)cudaFree(h->own_ws);
    h->own_ws = NULL;
    h->ws_set = 1;
    h->ws = bytes ? ws : NULL;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
void emu_cublas_get(cublasHandle_t h, cudaStream_t *s, int *math, void **ws, size_t *bytes)
{
    *s = h->stream;
    *math = h->math;
    *ws = h->ws;
    *bytes = h->ws_bytes;
}
void emu_cublas_set(cublasHandle_t h, cudaStream_t s, int math, void *ws, size_t bytes)
{
    h->stream = s;
    h->math = math;
    h->ws = ws;
    h->ws_bytes = bytes;
}
const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated error)";
}
/* a library's device argument: tags and stream order, as a kernel's */
static int lib_use(cudaStream_t s, const void *p, size_t bytes, int write, const char *what)
{
    return emu_use(s, p, bytes, write, what) != cudaSuccess;
}

/* the libraries' element types (backend.h's bk_dtype numbering): loads exact, stores rounded
 * to nearest even as CUDA's __float2half / __float2bfloat16 */
enum { ET_BAD = -1, ET_F32 = 0, ET_F16 = 1, ET_BF16 = 2, ET_N = 3 };
static size_t et_size(int et) { return et == ET_F32 ? 4 : 2; }
static const char *et_name(int et)
{
    return et == ET_F32 ? "fp32" : et == ET_F16 ? "half" : et == ET_BF16 ? "bfloat16" : "?";
}
static float et_load(const void *p, size_t i, int et)
{
    if (et == ET_F32) return ((const float *)p)[i];
    if (et == ET_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
static void et_store(void *p, size_t i, int et, float v)
{
    if (et == ET_F32)
        ((float *)p)[i] = v;
    else if (et == ET_F16)
        ((__half *)p)[i] = __float2half(v);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
}
static int et_of_cuda(cudaDataType t)
{
    return t == CUDA_R_32F ? ET_F32 : t == CUDA_R_16F ? ET_F16 : t == CUDA_R_16BF ? ET_BF16 : ET_BAD;
}

/* the epilogue of a library's output element: r (alpha times the sum, fp32), plus beta times the
 * old value where beta is not 0. A 16-bit output is what the tensor-core epilogues of cuBLAS and
 * cuDNN store on a GPU (an H200, CUDA 13.0, cuDNN 9.14): r rounded to the type first, then
 * blended in fp32 and rounded again, round(beta y + round(r)); an fp32 one round(beta y + r).
 * EMU_BLEND_FP32=1 blends 16-bit outputs in fp32 instead (a test sees that it notices). */
static void et_blend(void *p, size_t i, int et, float r, float beta)
{
    static int fp32_blend = -1;
    if (fp32_blend < 0) {
        const char *v = getenv("EMU_BLEND_FP32");
        fp32_blend = v && *v == '1';
    }
    if (beta == 0.0f) {
        et_store(p, i, et, r);
        return;
    }
    const float old = et_load(p, i, et);
    if (et != ET_F32 && !fp32_blend) {
        et_store(p, i, et, r);
        r = et_load(p, i, et); /* round(r) */
    }
    et_store(p, i, et, r + beta * old);
}

/* ---- fast mode: TF32, non-deterministic and FFT / Winograd algorithms ----
 * cuDNN on fp32 data with any math type but CUDNN_FMA_MATH, and cuBLAS on fp32 operands under
 * CUBLAS_TF32_TENSOR_OP_MATH or with CUBLAS_COMPUTE_32F_FAST_TF32, round their operands to TF32
 * (10-bit mantissas, to nearest even) and sum the products in fp32, so that a test can tell
 * fast mode from parity by its numbers. A non-deterministic cuDNN algorithm (atomics: backward
 * data ALGO_0, backward filter ALGO_0 and ALGO_3) sums in fp32 in an order that changes from
 * call to call, as atomics may; FFT and Winograd sum in fp32. Each such call is counted
 * (ddpmd_emu_fast_calls); with EMU_PARITY=1 in the environment they are refused (BAD_PARAM,
 * NOT_SUPPORTED), as everything but parity mode's was before fast mode existed. */
enum { FAST_TF32_CONV = 0, FAST_TF32_GEMM = 1, FAST_NONDET = 2, FAST_FFT_WINOGRAD = 3, FAST_N = 4 };
static unsigned long g_fast_calls[FAST_N];
static unsigned g_nondet_order;   /* the next non-deterministic call's order */
static thread_local int tl_tf32;  /* the running call's operands are TF32 */
static thread_local int tl_fp32;  /* ... its fp32 data summed in fp32, not double */
static thread_local int tl_rot;   /* ... its reduction starts this far in (non-deterministic) */

static int emu_strict_parity(void)
{
    const char *v = getenv("EMU_PARITY");
    return v && v[0] == '1';
}
/* x rounded to TF32: 10 mantissa bits, nearest even (inf and NaN kept) */
static float tf32_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}
/* an operand of the running library call */
static float op_load(const void *p, size_t i, int et)
{
    const float v = et_load(p, i, et);
    return tl_tf32 ? tf32_round(v) : v;
}
static void fast_count(int what) { __atomic_fetch_add(&g_fast_calls[what], 1, __ATOMIC_RELAXED); }

/* library calls per element type of their inputs (ddpmd_emu_lib_calls): [0] cuDNN's
 * convolutions (not the finders), [1] cuBLAS's GEMMs, [2] warp matrix multiply-accumulates
 * (mma.h's mma_sync, once per warp) */
static unsigned long g_lib_calls[3][ET_N];
void emu_wmma_count(int half)
{
    __atomic_fetch_add(&g_lib_calls[2][half ? ET_F16 : ET_BF16], 1, __ATOMIC_RELAXED);
}

/* C (m,n) = alpha op(A) op(B) + beta C, column-major. fp32 inputs: summed in double (as
 * cublasSgemm always did here), or as TF32 in fp32 (tl_tf32); 16-bit inputs: in fp32, k in
 * order */
static cublasStatus_t emu_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                               int n, int k, float alpha, const void *a, int at, int lda,
                               const void *b, int bt, int ldb, float beta, void *c, int ct,
                               int ldc, const char *what)
{
    if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n) return CUBLAS_STATUS_SUCCESS;
    char w[96];
    const size_t ab = (size_t)lda * (ta == CUBLAS_OP_N ? k : m) * et_size(at);
    const size_t bb = (size_t)ldb * (tb == CUBLAS_OP_N ? n : k) * et_size(bt);
    const size_t cb = (size_t)ldc * n * et_size(ct);
    snprintf(w, sizeof w, "%s A", what);
    if (k && lib_use(h->stream, a, ab, 0, w)) return CUBLAS_STATUS_EXECUTION_FAILED;
    snprintf(w, sizeof w, "%s B", what);
    if (k && lib_use(h->stream, b, bb, 0, w)) return CUBLAS_STATUS_EXECUTION_FAILED;
    snprintf(w, sizeof w, "%s C", what);
    if (lib_use(h->stream, c, cb, 1, w)) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!h->ws_set && !h->own_ws) {
        if (cudaMalloc(&h->own_ws, EMU_CUBLAS_DEFAULT_WS) != cudaSuccess) {
            (void)cudaGetLastError();
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
        h->ws = h->own_ws;
        h->ws_bytes = EMU_CUBLAS_DEFAULT_WS;
    }
    if (h->ws_bytes) {
        const size_t use = h->ws_bytes < EMU_CUBLAS_GEMM_WS ? h->ws_bytes : EMU_CUBLAS_GEMM_WS;
        snprintf(w, sizeof w, "%s workspace", what);
        if (lib_use(h->stream, h->ws, use, 1, w)) return CUBLAS_STATUS_EXECUTION_FAILED;
        memset(h->ws, 0x5A, use); /* a workspace holds garbage after use */
        emu_ws_used(h->ws, use, 1);
    }
    __atomic_fetch_add(&g_lib_calls[1][at], 1, __ATOMIC_RELAXED);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double sd = 0.0;
            float sf = 0.0f;
            for (int l = 0; l < k; l++) {
                const float av = op_load(a, ta == CUBLAS_OP_N ? i + (size_t)l * lda
                                                              : l + (size_t)i * lda, at);
                const float bv = op_load(b, tb == CUBLAS_OP_N ? l + (size_t)j * ldb
                                                              : j + (size_t)l * ldb, bt);
                if (at == ET_F32 && !tl_tf32)
                    sd += (double)av * bv;
                else
                    sf += av * bv;
            }
            const size_t ci = i + (size_t)j * ldc;
            const float r = at == ET_F32 && !tl_tf32 ? (float)(alpha * sd) : alpha * sf;
            et_blend(c, ci, ct, r, beta);
        }
    emu_enqueued(h->stream);
    return CUBLAS_STATUS_SUCCESS;
}

/* a GEMM's math (tf32: TF32 operands): counted, refused under EMU_PARITY=1 (nonzero), else set
 * for emu_gemm; gemm_done resets it */
static int gemm_math(int tf32, const char *what)
{
    if (tf32 && emu_strict_parity()) {
        fprintf(stderr, "emu cublas: %s with TF32 (EMU_PARITY=1: parity mode only)\n", what);
        return 1;
    }
    if (tf32) fast_count(FAST_TF32_GEMM);
    tl_tf32 = tf32;
    return 0;
}
static cublasStatus_t gemm_done(cublasStatus_t st)
{
    tl_tf32 = 0;
    return st;
}

/* alpha and beta: host memory (CUBLAS_POINTER_MODE_HOST) */
static int scalars_on_device(const void *alpha, const void *beta)
{
    pthread_mutex_lock(&g_mem_lock);
    const int on = is_device(alpha) || is_device(beta);
    pthread_mutex_unlock(&g_mem_lock);
    if (on) fprintf(stderr, "emu cublas: alpha/beta are device pointers in host pointer mode\n");
    return on;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc)
{
    if (m > 0 && n > 0 && scalars_on_device(alpha, beta)) return CUBLAS_STATUS_INVALID_VALUE;
    if (gemm_math(h->math == CUBLAS_TF32_TENSOR_OP_MATH, "cublasSgemm"))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_done(emu_gemm(h, ta, tb, m, n, k, m > 0 && n > 0 ? *alpha : 0.0f, a, ET_F32, lda,
                              b, ET_F32, ldb, m > 0 && n > 0 ? *beta : 0.0f, c, ET_F32, ldc,
                              "cublasSgemm"));
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType at,
                            int lda, const void *b, cudaDataType bt, int ldb, const void *beta,
                            void *c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    const int ea = et_of_cuda(at), eb = et_of_cuda(bt), ec = et_of_cuda(ct);
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
        !(compute == CUBLAS_COMPUTE_32F_FAST_TF32 && ea == ET_F32)) {
        fprintf(stderr, "emu cublas: cublasGemmEx compute type %d: only fp32 accumulation "
                        "(CUBLAS_COMPUTE_32F, or _FAST_TF32 of fp32) is emulated\n", (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (ea == ET_BAD || ea != eb || ec == ET_BAD || (ec != ea && ec != ET_F32)) {
        fprintf(stderr, "emu cublas: cublasGemmEx types A %d, B %d, C %d: not a supported "
                        "combination\n", (int)at, (int)bt, (int)ct);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (ea == ET_BF16 && emu_cc() < 80) {
        fprintf(stderr, "emu cublas: cublasGemmEx in bfloat16 on an sm_%d device\n", emu_cc());
        return CUBLAS_STATUS_ARCH_MISMATCH;
    }
    (void)algo;
    if (m > 0 && n > 0 && scalars_on_device(alpha, beta)) return CUBLAS_STATUS_INVALID_VALUE;
    const int tf32 = ea == ET_F32 && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                      (compute == CUBLAS_COMPUTE_32F &&
                                       h->math == CUBLAS_TF32_TENSOR_OP_MATH));
    if (gemm_math(tf32, "cublasGemmEx")) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_done(emu_gemm(h, ta, tb, m, n, k, m > 0 && n > 0 ? *(const float *)alpha : 0.0f,
                              a, ea, lda, b, eb, ldb,
                              m > 0 && n > 0 ? *(const float *)beta : 0.0f, c, ec, ldc,
                              "cublasGemmEx"));
}

/* ---- test hooks: libddpmd_cuda_emu.so only (tests/gpu look them up with dlsym) ---- */

/* the context made usable again after a planted fault (a real one never is): the sticky error
 * and this thread's last error cleared */
extern "C" __attribute__((visibility("default"))) void ddpmd_emu_clear_fault(void)
{
    pthread_mutex_lock(&g_mem_lock);
    g_sticky = cudaSuccess;
    tl_last = cudaSuccess;
    pthread_mutex_unlock(&g_mem_lock);
}

/* library calls so far whose inputs had element type dtype (backend.h's bk_dtype: 0 fp32, 1 half,
 * 2 bfloat16): lib 0 cuDNN's convolutions (the finders not counted), 1 cuBLAS's GEMMs, 2 warp
 * matrix multiply-accumulates (tensor cores in a kernel). Tests see through it that a 16-bit op
 * reached the library or the tensor cores in 16 bits */
extern "C" __attribute__((visibility("default"))) unsigned long ddpmd_emu_lib_calls(int lib,
                                                                                   int dtype)
{
    if (lib < 0 || lib > 2 || dtype < 0 || dtype >= ET_N) return 0;
    return __atomic_load_n(&g_lib_calls[lib][dtype], __ATOMIC_RELAXED);
}

/* fast mode's library calls so far (see tl_tf32): what 0 cuDNN convolutions with TF32, 1 cuBLAS
 * GEMMs with TF32, 2 non-deterministic convolution algorithms, 3 FFT / Winograd ones. A parity
 * run makes none */
extern "C" __attribute__((visibility("default"))) unsigned long ddpmd_emu_fast_calls(int what)
{
    if (what < 0 || what >= FAST_N) return 0;
    return __atomic_load_n(&g_fast_calls[what], __ATOMIC_RELAXED);
}

/* ---- cuDNN ---- */

/* cuDNN's 16-bit convolution engines are compiled at run time (NVRTC) per configuration and
 * loaded as a module the first time one runs, in a finder or a call; the module's device memory
 * (2 MiB, the driver's page) stays with the process. What an H200 showed (issue 22): a bf16 ddpm
 * step (stride-2 convolutions, which the warm-up's 3x3 stride-1 ones do not cover) took 2 MiB
 * outside its plan and kept it; the fp32 steps and an f16 seed step (stride 1 only) did not.
 * Modelled per (type, stride): one module for the three directions. */
static std::vector<int> g_engines_loaded; /* (type, stride) keys; under g_launch_lock */
static int dnn_engine_key(int et, int stride) { return et * 64 + (stride < 63 ? stride : 63); }
static void dnn_engine_module(int et, int dir, int stride)
{
    (void)dir; /* one module serves the three directions: 2 MiB, as the H200 lost */
    if (et == ET_F32) return;
    const int key = dnn_engine_key(et, stride);
    pthread_mutex_lock(&g_launch_lock);
    int seen = 0;
    for (int k : g_engines_loaded) seen |= k == key;
    if (!seen) g_engines_loaded.push_back(key);
    pthread_mutex_unlock(&g_launch_lock);
    /* Kept reachable (as the driver keeps a loaded module): never freed, never a leak. A plain
     * array, not a std::vector, whose destructor would drop the pointers before LeakSanitizer's
     * check at exit. */
    static void *modules[ET_N * 64];
    void *m = NULL;
    if (!seen && emu_malloc(&m, (size_t)1 << 20, 2) != cudaSuccess) (void)cudaGetLastError();
    if (m) __atomic_store_n(&modules[key], m, __ATOMIC_RELAXED);
}

struct emu_cudnn {
    cudaStream_t stream;
    void *state; /* device memory of the handle's own */
};
struct emu_tensor_desc {
    int n, c, h, w;
    int et;
    int nhwc; /* CUDNN_TENSOR_NHWC: channels last */
};
struct emu_filter_desc {
    int k, c, h, w;
    int et;
    int nhwc; /* CUDNN_TENSOR_NHWC: KRSC */
};
struct emu_conv_desc {
    int ph, pw, u, v, dh, dw, math;
    int compute; /* the accumulation type (cudnnDataType_t) */
};

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    emu_cudnn *d = new emu_cudnn();
    if (cudaMalloc(&d->state, EMU_LIB_STATE_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        delete d;
        return CUDNN_STATUS_ALLOC_FAILED;
    }
    *h = d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    (void)cudaFree(h->state);
    (void)cudaGetLastError();
    delete h;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}
/* the graph API (cudnn_graph.cpp) runs on the handle's stream */
cudnnStatus_t cudnnGetStream(cudnnHandle_t h, cudaStream_t *s)
{
    if (!h || !s) return CUDNN_STATUS_BAD_PARAM;
    *s = h->stream;
    return CUDNN_STATUS_SUCCESS;
}
cudaStream_t emu_cudnn_stream(cudnnHandle_t h) { return h->stream; }
cudnnTensorDescriptor_t emu_dup_tensor_desc(cudnnTensorDescriptor_t d)
{
    return new emu_tensor_desc(*d);
}
cudnnFilterDescriptor_t emu_dup_filter_desc(cudnnFilterDescriptor_t d)
{
    return new emu_filter_desc(*d);
}
cudnnConvolutionDescriptor_t emu_dup_conv_desc(cudnnConvolutionDescriptor_t d)
{
    return new emu_conv_desc(*d);
}
static size_t tcount(const emu_tensor_desc *d) { return (size_t)d->n * d->c * d->h * d->w; }
static size_t fcount(const emu_filter_desc *d) { return (size_t)d->k * d->c * d->h * d->w; }
static size_t tbytes(const emu_tensor_desc *d) { return tcount(d) * et_size(d->et); }
static size_t fbytes(const emu_filter_desc *d) { return fcount(d) * et_size(d->et); }
static int et_of_dnn(cudnnDataType_t t)
{
    return t == CUDNN_DATA_FLOAT ? ET_F32 : t == CUDNN_DATA_HALF ? ET_F16
           : t == CUDNN_DATA_BFLOAT16 ? ET_BF16 : ET_BAD;
}
/* a cuDNN call's device arguments (tags, stream order); ws: the workspace it uses */
static int dnn_use(cudnnHandle_t h, const void *in1, size_t b1, const void *in2, size_t b2,
                   void *out, size_t bo, int out_read, void *ws, size_t wsb, const char *what)
{
    char w[96];
    snprintf(w, sizeof w, "%s input", what);
    if (lib_use(h->stream, in1, b1, 0, w)) return 1;
    if (in2 && lib_use(h->stream, in2, b2, 0, w)) return 1;
    snprintf(w, sizeof w, "%s output", what);
    if (lib_use(h->stream, out, bo, 1, w)) return 1;
    (void)out_read;
    snprintf(w, sizeof w, "%s workspace", what);
    if (wsb && lib_use(h->stream, ws, wsb, 1, w)) return 1;
    return 0;
}
cudnnStatus_t cudnnGraphVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCnnVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
const char *cudnnGetErrorString(cudnnStatus_t s)
{
    return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_(emulated error)";
}
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d)
{
    *d = new emu_tensor_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d)
{
    *d = new emu_filter_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    *d = new emu_conv_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w)
{
    if (n < 1 || c < 1 || h < 1 || w < 1 || et_of_dnn(t) == ET_BAD ||
        (f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC))
        return CUDNN_STATUS_BAD_PARAM;
    *d = emu_tensor_desc{n, c, h, w, et_of_dnn(t), f == CUDNN_TENSOR_NHWC};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w)
{
    if (k < 1 || c < 1 || h < 1 || w < 1 || et_of_dnn(t) == ET_BAD ||
        (f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC))
        return CUDNN_STATUS_BAD_PARAM;
    *d = emu_filter_desc{k, c, h, w, et_of_dnn(t), f == CUDNN_TENSOR_NHWC};
    return CUDNN_STATUS_SUCCESS;
}
/* the element index of (n, c, h, w) in a tensor, and of (k, c, r, s) in a filter, by format */
static size_t tidx(const emu_tensor_desc *d, int n, int c, int h, int w)
{
    return d->nhwc ? (((size_t)n * d->h + h) * d->w + w) * d->c + c
                   : (((size_t)n * d->c + c) * d->h + h) * d->w + w;
}
static size_t fidx(const emu_filter_desc *d, int k, int c, int r, int s)
{
    return d->nhwc ? (((size_t)k * d->h + r) * d->w + s) * d->c + c
                   : (((size_t)k * d->c + c) * d->h + r) * d->w + s;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw,
                                              int u, int v, int dh, int dw,
                                              cudnnConvolutionMode_t m, cudnnDataType_t t)
{
    if (ph < 0 || pw < 0 || u < 1 || v < 1 || dh < 1 || dw < 1 || m != CUDNN_CROSS_CORRELATION ||
        et_of_dnn(t) == ET_BAD)
        return CUDNN_STATUS_BAD_PARAM;
    *d = emu_conv_desc{ph, pw, u, v, dh, dw, 0, (int)t};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}
static int out_dim(int in, int pad, int k, int stride, int dil)
{
    return (in + 2 * pad - ((k - 1) * dil + 1)) / stride + 1;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t c,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *ch,
                                                    int *h, int *wd)
{
    if (x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
    *n = x->n;
    *ch = w->k;
    *h = out_dim(x->h, c->ph, w->h, c->u, c->dh);
    *wd = out_dim(x->w, c->pw, w->w, c->v, c->dw);
    return CUDNN_STATUS_SUCCESS;
}

/* every convolution call: the output descriptor is the convolution's, and the types form one of
 * cuDNN's configurations the backend may use: x, w and y of one type, accumulated in fp32 */
static cudnnStatus_t check_conv(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y)
{
    int n = 0, ch = 0, h = 0, wd = 0;
    /* channels that disagree: BAD_PARAM, not a comparison with unset sizes (-O3 saw it) */
    cudnnStatus_t st = cudnnGetConvolution2dForwardOutputDim(c, x, w, &n, &ch, &h, &wd);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (y->n != n || y->c != ch || y->h != h || y->w != wd) {
        fprintf(stderr, "emu cudnn: output descriptor %dx%dx%dx%d, the conv gives %dx%dx%dx%d\n",
                y->n, y->c, y->h, y->w, n, ch, h, wd);
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (x->et != w->et || x->et != y->et) {
        fprintf(stderr, "emu cudnn: data types x %s, w %s, y %s: not one configuration\n",
                et_name(x->et), et_name(w->et), et_name(y->et));
        return CUDNN_STATUS_BAD_PARAM;
    }
    /* one layout for all three (the backend's NHWC tensors take KRSC filters) */
    if (x->nhwc != y->nhwc || x->nhwc != w->nhwc) {
        fprintf(stderr, "emu cudnn: formats x %s, w %s, y %s: not one layout\n",
                x->nhwc ? "NHWC" : "NCHW", w->nhwc ? "NHWC" : "NCHW", y->nhwc ? "NHWC" : "NCHW");
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (c->compute != CUDNN_DATA_FLOAT) {
        fprintf(stderr, "emu cudnn: compute type %d: the backend accumulates in fp32 "
                        "(CUDNN_DATA_FLOAT)\n", c->compute);
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (x->et == ET_BF16 && emu_cc() < 80) {
        fprintf(stderr, "emu cudnn: bfloat16 convolution on an sm_%d device\n", emu_cc());
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* the algorithms offered, each with its workspace: the first ones must be refused in parity
 * mode (FFT, Winograd), non-deterministic ones always, one needs more workspace than the backend
 * allows (DDPMD_CUDA_CONV_WS_MAX_MB, 256 MiB by default) */
struct offer {
    int algo;
    size_t memory;
    cudnnDeterminism_t det;
    float time;
};
static const offer FWD[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, 4096, CUDNN_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, 8192, CUDNN_DETERMINISTIC, 0.2f},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, (size_t)1 << 40, CUDNN_DETERMINISTIC, 0.25f},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 65536, CUDNN_DETERMINISTIC, 0.3f},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 0, CUDNN_DETERMINISTIC, 0.4f},
};
static const offer BWD_DATA[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 0, CUDNN_NON_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, 1024, CUDNN_DETERMINISTIC, 0.15f},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 32768, CUDNN_DETERMINISTIC, 0.2f},
};
static const offer BWD_FILTER[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, 0, CUDNN_NON_DETERMINISTIC, 0.05f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0, CUDNN_NON_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, 2048, CUDNN_DETERMINISTIC, 0.15f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 16384, CUDNN_DETERMINISTIC, 0.2f},
};

static const offer *find_offer(const offer *o, int n, int algo)
{
    for (int i = 0; i < n; i++)
        if (o[i].algo == algo) return &o[i];
    return NULL;
}

/* heuristics: ranked as listed; finders: fastest first, and those needing more than ws_bytes
 * fail with ALLOC_FAILED. 16-bit data, and fp32 data under a math type that allows TF32: the
 * algorithms run on tensor cores (TENSOR_OP_MATH rows); fp32 under CUDNN_FMA_MATH: FMA rows */
template <typename P>
static void fill_perf(P *p, int req, int *got, const offer *o, int n, int find, size_t ws_bytes,
                      int et, const emu_conv_desc *c)
{
    int k = 0;
    for (int i = 0; i < n && k < req; i++, k++) {
        memset(&p[k], 0, sizeof p[k]);
        p[k].algo = (decltype(p[k].algo))o[i].algo;
        p[k].memory = o[i].memory;
        p[k].determinism = o[i].det;
        p[k].mathType = et == ET_F32 && c->math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH
                                                                  : CUDNN_TENSOR_OP_MATH;
        p[k].time = o[i].time;
        p[k].status = find && o[i].memory > ws_bytes ? CUDNN_STATUS_ALLOC_FAILED
                                                     : CUDNN_STATUS_SUCCESS;
    }
    *got = k;
}

/* an algorithm uses all the workspace it claims: scribble over it */
static cudnnStatus_t use_workspace(const offer *o, void *ws, size_t ws_bytes)
{
    if (!o) return CUDNN_STATUS_BAD_PARAM;
    if (o->memory > ws_bytes || (o->memory && !ws)) {
        fprintf(stderr, "emu cudnn: algorithm %d needs %zu workspace bytes, given %zu\n", o->algo,
                o->memory, ws_bytes);
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (o->memory) memset(ws, 0x5A, o->memory);
    emu_ws_used(ws, o->memory, 0);
    return CUDNN_STATUS_SUCCESS;
}

/* the epilogue of every output element: alpha * the sum, plus beta * the old value (not read when
 * beta is 0). fp32 data: the double sum rounded once (as before 16-bit existed); 16-bit data: in
 * fp32, one rounding to nearest even on the store */
template <typename A>
static void conv_store(void *y, size_t i, int et, float alpha, A sum, float beta)
{
    const float r = et == ET_F32 ? (float)(alpha * (double)sum) : alpha * (float)sum;
    et_blend(y, i, et, r, beta);
}

/* A: the accumulator, double for fp32 data and float (fp32 accumulation) for 16-bit and in fast
 * mode (TF32, FFT / Winograd, non-deterministic: see tl_tf32); the backward reductions start
 * tl_rot in (a non-deterministic algorithm's changing order) */
template <typename A>
static void conv_fwd(float alpha, const emu_tensor_desc *xd, const void *x,
                     const emu_filter_desc *wd, const void *w, const emu_conv_desc *c,
                     float beta, const emu_tensor_desc *yd, void *y)
{
    const int et = xd->et;
    for (int n = 0; n < yd->n; n++)
        for (int o = 0; o < yd->c; o++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    A s = 0;
                    for (int ci = 0; ci < xd->c; ci++)
                        for (int kh = 0; kh < wd->h; kh++) {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int kw = 0; kw < wd->w; kw++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                s += (A)op_load(x, tidx(xd, n, ci, ih, iw), et) *
                                     (A)op_load(w, fidx(wd, o, ci, kh, kw), et);
                            }
                        }
                    conv_store(y, tidx(yd, n, o, oh, ow), et, alpha, s, beta);
                }
}

template <typename A>
static void conv_bwd_data(float alpha, const emu_filter_desc *wd, const void *w,
                          const emu_tensor_desc *yd, const void *dy, const emu_conv_desc *c,
                          float beta, const emu_tensor_desc *xd, void *dx)
{
    const int et = xd->et;
    size_t nx = tcount(xd);
    std::vector<A> acc(nx, 0);
    for (int n = 0; n < yd->n; n++)
        for (int oo = 0; oo < yd->c; oo++) {
            const int o = (int)(((unsigned)oo + (unsigned)tl_rot) % (unsigned)yd->c);
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    A g = op_load(dy, tidx(yd, n, o, oh, ow), et);
                    for (int ci = 0; ci < xd->c; ci++)
                        for (int kh = 0; kh < wd->h; kh++) {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int kw = 0; kw < wd->w; kw++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                acc[tidx(xd, n, ci, ih, iw)] +=
                                    g * (A)op_load(w, fidx(wd, o, ci, kh, kw), et);
                            }
                        }
                }
        }
    for (size_t i = 0; i < nx; i++) conv_store(dx, i, et, alpha, acc[i], beta);
}

template <typename A>
static void conv_bwd_filter(float alpha, const emu_tensor_desc *xd, const void *x,
                            const emu_tensor_desc *yd, const void *dy, const emu_conv_desc *c,
                            float beta, const emu_filter_desc *wd, void *dw)
{
    const int et = xd->et;
    for (int o = 0; o < wd->k; o++)
        for (int ci = 0; ci < wd->c; ci++)
            for (int kh = 0; kh < wd->h; kh++)
                for (int kw = 0; kw < wd->w; kw++) {
                    A s = 0;
                    const unsigned rows = (unsigned)yd->n * (unsigned)yd->h;
                    for (unsigned q = 0; q < rows; q++) {
                        const unsigned qq = (q + (unsigned)tl_rot) % rows;
                        const int n = (int)(qq / (unsigned)yd->h), oh = (int)(qq % (unsigned)yd->h);
                        {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int ow = 0; ow < yd->w; ow++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                s += (A)op_load(dy, tidx(yd, n, o, oh, ow), et) *
                                     (A)op_load(x, tidx(xd, n, ci, ih, iw), et);
                            }
                        }
                    }
                    conv_store(dw, fidx(wd, o, ci, kh, kw), et, alpha, s, beta);
                }
}

/* graph.cpp: whether a convolution on these descriptors would load an engine module now (its
 * first call of that type and stride) - what a capture must not do (emu_internal.h) */
int emu_dnn_engine_new(cudnnTensorDescriptor_t xd, cudnnConvolutionDescriptor_t c)
{
    if (!xd || !c || xd->et == ET_F32) return 0;
    const int key = dnn_engine_key(xd->et, c->u);
    pthread_mutex_lock(&g_launch_lock);
    int seen = 0;
    for (int k : g_engines_loaded) seen |= k == key;
    pthread_mutex_unlock(&g_launch_lock);
    return !seen;
}

#define N_OF(a) ((int)(sizeof a / sizeof *a))

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t c,
                                                     cudnnTensorDescriptor_t y, int req, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *p)
{
    cudnnStatus_t s = check_conv(x, w, c, y);
    if (s) return s;
    fill_perf(p, req, got, FWD, N_OF(FWD), 0, 0, x->et, c);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, int req, int *got,
    cudnnConvolutionBwdDataAlgoPerf_t *p)
{
    cudnnStatus_t s = check_conv(dx, w, c, dy);
    if (s) return s;
    fill_perf(p, req, got, BWD_DATA, N_OF(BWD_DATA), 0, 0, dx->et, c);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, int req, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *p)
{
    cudnnStatus_t s = check_conv(x, dw, c, dy);
    if (s) return s;
    fill_perf(p, req, got, BWD_FILTER, N_OF(BWD_FILTER), 0, 0, x->et, c);
    return CUDNN_STATUS_SUCCESS;
}

/* the finders run the conv and leave garbage in the output, as cuDNN's may */
static void scribble(void *p, size_t n, int et)
{
    for (size_t i = 0; i < n; i++) et_store(p, i, et, 1234.5f);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnFilterDescriptor_t wd,
    const void *w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t yd, void *y, int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_conv(xd, wd, c, yd);
    if (s) return s;
    dnn_engine_module(xd->et, 0, c->u);
    if (dnn_use(h, x, tbytes(xd), w, fbytes(wd), y, tbytes(yd), 0, ws, ws_bytes,
                "cudnnFindConvolutionForwardAlgorithmEx"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    emu_ws_used(ws, ws_bytes, 0);
    scribble(y, tcount(yd), yd->et);
    fill_perf(p, req, got, FWD, N_OF(FWD), 1, ws_bytes, xd->et, c);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void *w, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dxd, void *dx, int req,
    int *got, cudnnConvolutionBwdDataAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_conv(dxd, wd, c, dyd);
    if (s) return s;
    dnn_engine_module(dxd->et, 1, c->u);
    if (dnn_use(h, w, fbytes(wd), dy, tbytes(dyd), dx, tbytes(dxd), 0, ws, ws_bytes,
                "cudnnFindConvolutionBackwardDataAlgorithmEx"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    emu_ws_used(ws, ws_bytes, 0);
    scribble(dx, tcount(dxd), dxd->et);
    fill_perf(p, req, got, BWD_DATA, N_OF(BWD_DATA), 1, ws_bytes, dxd->et, c);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dwd, void *dw, int req,
    int *got, cudnnConvolutionBwdFilterAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_conv(xd, dwd, c, dyd);
    if (s) return s;
    dnn_engine_module(xd->et, 2, c->u);
    if (dnn_use(h, x, tbytes(xd), dy, tbytes(dyd), dw, fbytes(dwd), 0, ws, ws_bytes,
                "cudnnFindConvolutionBackwardFilterAlgorithmEx"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    emu_ws_used(ws, ws_bytes, 0);
    scribble(dw, fcount(dwd), dwd->et);
    fill_perf(p, req, got, BWD_FILTER, N_OF(BWD_FILTER), 1, ws_bytes, xd->et, c);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t,
                                                      cudnnFilterDescriptor_t,
                                                      cudnnConvolutionDescriptor_t,
                                                      cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *b)
{
    const offer *o = find_offer(FWD, N_OF(FWD), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t,
    cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t, cudnnConvolutionBwdDataAlgo_t a,
    size_t *b)
{
    const offer *o = find_offer(BWD_DATA, N_OF(BWD_DATA), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, cudnnTensorDescriptor_t, cudnnTensorDescriptor_t,
    cudnnConvolutionDescriptor_t, cudnnFilterDescriptor_t, cudnnConvolutionBwdFilterAlgo_t a,
    size_t *b)
{
    const offer *o = find_offer(BWD_FILTER, N_OF(BWD_FILTER), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}

/* how a convolution runs (CONV_RUN sets tl_tf32, tl_fp32 and tl_rot from it) */
struct conv_how {
    int tf32, fp32, rot;
};
/* A convolution's mode before it runs: 16-bit data never down-converted
 * (TENSOR_OP_MATH_ALLOW_CONVERSION); fp32 data under any math but FMA is TF32; kind FAST_NONDET
 * or FAST_FFT_WINOGRAD names such an algorithm (-1: a plain one). Fast mode's calls are counted,
 * or refused under EMU_PARITY=1: nonzero, with a message. */
static int conv_mode(const emu_conv_desc *c, int et, int kind, conv_how *how)
{
    const int tf32 = et == ET_F32 && c->math != CUDNN_FMA_MATH;
    if (et != ET_F32 && c->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
        fprintf(stderr, "emu cudnn: %s data with down-conversion math\n", et_name(et));
        return 1;
    }
    if ((tf32 || kind >= 0) && emu_strict_parity()) {
        fprintf(stderr, "emu cudnn: a refused algorithm or math type ran (math %d, %s data, %s; "
                        "EMU_PARITY=1: parity mode only)\n", c->math, et_name(et),
                kind == FAST_NONDET ? "non-deterministic" : kind >= 0 ? "FFT/Winograd" : "TF32");
        return 1;
    }
    if (tf32) fast_count(FAST_TF32_CONV);
    if (kind >= 0) fast_count(kind);
    how->tf32 = tf32;
    how->fp32 = tf32 || kind >= 0;
    how->rot = kind == FAST_NONDET
                   ? (int)(__atomic_add_fetch(&g_nondet_order, 7, __ATOMIC_RELAXED) & 0xffff)
                   : 0;
    return 0;
}

/* runs a convolution direction on the element type of its data, as how says */
#define CONV_RUN(fn, et, how, ...)                                                             \
    do {                                                                                       \
        __atomic_fetch_add(&g_lib_calls[0][et], 1, __ATOMIC_RELAXED);                          \
        tl_tf32 = (how).tf32;                                                                  \
        tl_fp32 = (how).fp32;                                                                  \
        tl_rot = (how).rot;                                                                    \
        if ((et) == ET_F32 && !tl_fp32)                                                        \
            fn<double>(__VA_ARGS__);                                                           \
        else                                                                                   \
            fn<float>(__VA_ARGS__);                                                            \
        tl_tf32 = tl_fp32 = tl_rot = 0;                                                        \
    } while (0)

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t c, cudnnConvolutionFwdAlgo_t a,
                                      void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y)
{
    cudnnStatus_t s = check_conv(xd, wd, c, yd);
    if (s) return s;
    dnn_engine_module(xd->et, 0, c->u);
    conv_how how;
    if (conv_mode(c, xd->et, a >= CUDNN_CONVOLUTION_FWD_ALGO_FFT ? FAST_FFT_WINOGRAD : -1, &how))
        return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(FWD, N_OF(FWD), a), ws, ws_bytes))) return s;
    if (dnn_use(h, x, tbytes(xd), w, fbytes(wd), y, tbytes(yd), *(const float *)beta != 0.0f, ws,
                find_offer(FWD, N_OF(FWD), a)->memory, "cudnnConvolutionForward"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    CONV_RUN(conv_fwd, xd->et, how, *(const float *)alpha, xd, x, wd, w, c, *(const float *)beta, yd,
             y);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx)
{
    cudnnStatus_t s = check_conv(dxd, wd, c, dyd);
    if (s) return s;
    dnn_engine_module(dxd->et, 1, c->u);
    conv_how how;
    if (conv_mode(c, dxd->et, a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1   ? -1
                              : a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ? FAST_NONDET
                                                                       : FAST_FFT_WINOGRAD,
                  &how))
        return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(BWD_DATA, N_OF(BWD_DATA), a), ws, ws_bytes))) return s;
    if (dnn_use(h, w, fbytes(wd), dy, tbytes(dyd), dx, tbytes(dxd), *(const float *)beta != 0.0f,
                ws, find_offer(BWD_DATA, N_OF(BWD_DATA), a)->memory,
                "cudnnConvolutionBackwardData"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    CONV_RUN(conv_bwd_data, dxd->et, how, *(const float *)alpha, wd, w, dyd, dy, c,
             *(const float *)beta, dxd, dx);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw)
{
    cudnnStatus_t s = check_conv(xd, dwd, c, dyd);
    if (s) return s;
    dnn_engine_module(xd->et, 2, c->u);
    conv_how how;
    if (conv_mode(c, xd->et,
                  a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ? -1
                  : a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                          a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3
                      ? FAST_NONDET
                      : FAST_FFT_WINOGRAD,
                  &how))
        return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(BWD_FILTER, N_OF(BWD_FILTER), a), ws, ws_bytes))) return s;
    if (dnn_use(h, x, tbytes(xd), dy, tbytes(dyd), dw, fbytes(dwd), *(const float *)beta != 0.0f,
                ws, find_offer(BWD_FILTER, N_OF(BWD_FILTER), a)->memory,
                "cudnnConvolutionBackwardFilter"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    CONV_RUN(conv_bwd_filter, xd->et, how, *(const float *)alpha, xd, x, dyd, dy, c,
             *(const float *)beta, dwd, dw);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *a, const void *beta, cudnnTensorDescriptor_t cd, void *c)
{
    if (ad->n != cd->n || ad->c != cd->c || ad->h != cd->h || ad->w != cd->w || ad->et != cd->et ||
        ad->nhwc != cd->nhwc)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (dnn_use(h, a, tbytes(ad), NULL, 0, c, tbytes(cd), 1, NULL, 0, "cudnnAddTensor"))
        return CUDNN_STATUS_EXECUTION_FAILED;
    emu_enqueued(h->stream);
    size_t n = tcount(cd);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (size_t i = 0; i < n; i++) {
        float r = al * et_load(a, i, ad->et);
        et_store(c, i, cd->et, be == 0.0f ? r : r + be * et_load(c, i, cd->et));
    }
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the emulator's own checks, each a planted misuse it must catch ---- */

__global__ void emu_k_fill(float *y, const float *x, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x ? x[i] + 1.0f : 1.0f;
}

#define SELF(cond, ...)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            missed++;                                                                          \
            fprintf(stderr, "emu self-check: not caught: " __VA_ARGS__);                       \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

/* the libraries' 16-bit calls: fp32 accumulation in order and one rounding on the store, the
 * configurations the backend may use and the ones it must not. x . (1, 1, 1, 1) with bf16 x =
 * [1, 2^-8, 2^-24, 2^-24]: in fp32 each 2^-24 is a tie that stays at 1 + 2^-8, itself a bf16 tie
 * that goes to even (1.0); the exact sum 1 + 2^-8 + 2^-23 is an fp32 and rounds up to bf16
 * 1.0078125. Half x = [2048, 1, 2^-13, 2^-13] alike: 2048 in fp32, 2050 exactly. dev: 1024
 * floats of device memory on stream s. Returns the misses. */
static int selfcheck_typed(cublasHandle_t bl, cudnnHandle_t dn, cudaStream_t s, float *dev)
{
    int missed = 0;
    const float one = 1.0f, zero = 0.0f;
    const float xsb[4] = {1.0f, 1.0f / 256, 1.0f / 16777216, 1.0f / 16777216};
    const float xsh[4] = {2048.0f, 1.0f, 1.0f / 8192, 1.0f / 8192};
    __nv_bfloat16 *xb = (__nv_bfloat16 *)dev, *wb = xb + 8, *yb = xb + 16;
    __half *xh = (__half *)(dev + 32), *wh = xh + 8, *yh = xh + 16;
    float *yf = dev + 64;
    /* on an sm_90 whatever EMU_CC says; on an sm_75 below */
    const char *cc = getenv("EMU_CC");
    char keep[16] = "";
    if (cc) snprintf(keep, sizeof keep, "%s", cc);
    setenv("EMU_CC", "90", 1);
    for (int i = 0; i < 4; i++) {
        xb[i] = __float2bfloat16(xsb[i]);
        wb[i] = __float2bfloat16(1.0f);
        xh[i] = __float2half(xsh[i]);
        wh[i] = __float2half(1.0f);
    }
    cublasSetStream(bl, s);
    cudnnSetStream(dn, s);
    /* GEMM (1,1) = x (1,4) w (4,1): bf16 -> bf16 and -> fp32, f16 -> f16 */
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xb, CUDA_R_16BF, 1, wb,
                      CUDA_R_16BF, 4, &zero, yb, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS &&
             yb[0].x == 0x3f80,
         "cublasGemmEx bf16: 0x%04x, want 0x3f80 (fp32 sum, a tie to even)", yb[0].x);
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xb, CUDA_R_16BF, 1, wb,
                      CUDA_R_16BF, 4, &zero, yf, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS &&
             yf[0] == 1.0f + 1.0f / 256,
         "cublasGemmEx bf16 -> fp32: %.9g, want 1.00390625", yf[0]);
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xh, CUDA_R_16F, 1, wh,
                      CUDA_R_16F, 4, &zero, yh, CUDA_R_16F, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS &&
             __half2float(yh[0]) == 2048.0f,
         "cublasGemmEx f16: %.9g, want 2048", __half2float(yh[0]));
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xh, CUDA_R_16F, 1, wh,
                      CUDA_R_16F, 4, &zero, yh, CUDA_R_16F, 1, CUBLAS_COMPUTE_16F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
         "cublasGemmEx with 16-bit accumulation");
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xh, CUDA_R_16F, 1, wb,
                      CUDA_R_16BF, 4, &zero, yf, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
         "cublasGemmEx with A half and B bfloat16");
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xb, CUDA_R_16BF, 1, wb,
                      CUDA_R_16BF, 4, &zero, yh, CUDA_R_16F, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
         "cublasGemmEx bf16 inputs into a half C");
    /* the same sums through cuDNN: a 1x1 convolution over 4 channels */
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    cudnnFilterDescriptor_t wd = NULL;
    cudnnConvolutionDescriptor_t cd = NULL;
    cudnnCreateTensorDescriptor(&xd);
    cudnnCreateTensorDescriptor(&yd);
    cudnnCreateFilterDescriptor(&wd);
    cudnnCreateConvolutionDescriptor(&cd);
    cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                    CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH);
    const cudnnConvolutionFwdAlgo_t ig = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    for (int t = 0; t < 2; t++) {
        const cudnnDataType_t dt = t ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
        cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, dt, 1, 4, 1, 1);
        cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, dt, 1, 1, 1, 1);
        cudnnSetFilter4dDescriptor(wd, dt, CUDNN_TENSOR_NCHW, 1, 4, 1, 1);
        const int ok = cudnnConvolutionForward(dn, &one, xd, t ? (void *)xh : (void *)xb, wd,
                                               t ? (void *)wh : (void *)wb, cd, ig, NULL, 0,
                                               &zero, yd, t ? (void *)yh : (void *)yb) ==
                       CUDNN_STATUS_SUCCESS;
        SELF(ok && (t ? __half2float(yh[0]) == 2048.0f : yb[0].x == 0x3f80),
             "cudnnConvolutionForward in %s: 0x%04x", t ? "half" : "bfloat16",
             t ? yh[0].x : yb[0].x);
    }
    /* a 16-bit output accumulated (beta 1) is round(y + round(r)): r = 2^-8 + 2^-17 rounds to
     * 2^-8 in bf16, and 1 + 2^-8 is a tie that goes to even (1.0); round(1 + r) would be
     * 1.0078125 */
    {
        const float beta1 = 1.0f;
        xb[0] = __float2bfloat16(1.0f / 256);
        xb[1] = __float2bfloat16(1.0f / 131072);
        wb[0] = wb[1] = __float2bfloat16(1.0f);
        yb[0] = __float2bfloat16(1.0f);
        SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, xb, CUDA_R_16BF, 1, wb,
                          CUDA_R_16BF, 2, &beta1, yb, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS &&
                 yb[0].x == 0x3f80,
             "cublasGemmEx bf16 with beta 1: 0x%04x, want 0x3f80 (round(y + round(r)))",
             yb[0].x);
        /* the same through cuDNN's backward data: dx (1,1,1,1) += conv^T(dy (1,2,1,1), w) */
        cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, 1, 1, 1);
        cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, 2, 1, 1);
        cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW, 2, 1, 1, 1);
        yb[0] = __float2bfloat16(1.0f);
        void *ws = NULL;
        const size_t wsb = find_offer(BWD_DATA, N_OF(BWD_DATA),
                                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)->memory;
        SELF(cudaMalloc(&ws, wsb) == cudaSuccess &&
                 cudnnConvolutionBackwardData(dn, &one, wd, wb, yd, xb, cd,
                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, ws, wsb, &beta1,
                                              xd, yb) == CUDNN_STATUS_SUCCESS &&
                 yb[0].x == 0x3f80,
             "cudnnConvolutionBackwardData bf16 with beta 1: 0x%04x, want 0x3f80", yb[0].x);
        (void)cudaDeviceSynchronize();
        cudaFree(ws);
        /* the descriptors as the loop above left them (half) */
        cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 4, 1, 1);
        cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 1, 1);
        cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, 1, 4, 1, 1);
    }
    /* y in bf16 with x and w in half; compute type HALF; fp32 data on tensor cores (TF32) */
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, 1, 1, 1);
    SELF(cudnnConvolutionForward(dn, &one, xd, xh, wd, wh, cd, ig, NULL, 0, &zero, yd, yb) ==
             CUDNN_STATUS_BAD_PARAM,
         "cudnnConvolutionForward with x half and y bfloat16");
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 1, 1);
    cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                    CUDNN_DATA_HALF);
    SELF(cudnnConvolutionForward(dn, &one, xd, xh, wd, wh, cd, ig, NULL, 0, &zero, yd, yh) ==
             CUDNN_STATUS_NOT_SUPPORTED,
         "cudnnConvolutionForward accumulating in half");
    cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                    CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH);
    cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 4, 1, 1);
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, 1);
    cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 4, 1, 1);
    /* ... TF32: x = (1 + 2^-11, 1 + 2^-11, 0, 0) . (1, 1, 1, 1) is 2 + 2^-10 in fp32 and 2 with
     * operands rounded to 10-bit mantissas (each a tie to even); refused with EMU_PARITY=1 */
    for (int i = 0; i < 4; i++) {
        dev[128 + i] = i < 2 ? 1.0f + 1.0f / 2048 : 0.0f;
        dev[136 + i] = 1.0f;
    }
    const char *strict = getenv("EMU_PARITY");
    char keep_strict[8] = "";
    if (strict) snprintf(keep_strict, sizeof keep_strict, "%s", strict);
    setenv("EMU_PARITY", "1", 1);
    SELF(cudnnConvolutionForward(dn, &one, xd, dev + 128, wd, dev + 136, cd, ig, NULL, 0, &zero,
                                 yd, dev + 144) == CUDNN_STATUS_BAD_PARAM,
         "an fp32 convolution with tensor-op math (TF32) under EMU_PARITY=1");
    cublasSetMathMode(bl, CUBLAS_TF32_TENSOR_OP_MATH);
    SELF(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, dev + 128, 1, dev + 136, 4,
                     &zero, dev + 144, 1) == CUBLAS_STATUS_NOT_SUPPORTED,
         "an SGEMM with TF32 math under EMU_PARITY=1");
    unsetenv("EMU_PARITY");
    SELF(cudnnConvolutionForward(dn, &one, xd, dev + 128, wd, dev + 136, cd, ig, NULL, 0, &zero,
                                 yd, dev + 144) == CUDNN_STATUS_SUCCESS &&
             dev[144] == 2.0f,
         "an fp32 convolution with tensor-op math: %.9g, want 2 (TF32 operands)", dev[144]);
    SELF(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, dev + 128, 1, dev + 136, 4,
                     &zero, dev + 144, 1) == CUBLAS_STATUS_SUCCESS &&
             dev[144] == 2.0f,
         "an SGEMM with TF32 math: %.9g, want 2 (TF32 operands)", dev[144]);
    cublasSetMathMode(bl, CUBLAS_PEDANTIC_MATH);
    cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH);
    SELF(cudnnConvolutionForward(dn, &one, xd, dev + 128, wd, dev + 136, cd, ig, NULL, 0, &zero,
                                 yd, dev + 144) == CUDNN_STATUS_SUCCESS &&
             dev[144] == 2.0f + 1.0f / 1024 &&
             cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, dev + 128, 1, dev + 136, 4,
                         &zero, dev + 152, 1) == CUBLAS_STATUS_SUCCESS &&
             dev[152] == 2.0f + 1.0f / 1024,
         "fp32 convolution / SGEMM with FMA / pedantic math: %.9g, %.9g, want 2.0009765625",
         dev[144], dev[152]);
    if (strict) setenv("EMU_PARITY", keep_strict, 1);
    cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH);
    /* bfloat16 on a device without it */
    setenv("EMU_CC", "75", 1);
    cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, 4, 1, 1);
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, 1, 1, 1, 1);
    cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW, 1, 4, 1, 1);
    SELF(cudnnConvolutionForward(dn, &one, xd, xb, wd, wb, cd, ig, NULL, 0, &zero, yd, yb) ==
             CUDNN_STATUS_NOT_SUPPORTED,
         "a bfloat16 convolution on sm_75");
    SELF(cublasGemmEx(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 4, &one, xb, CUDA_R_16BF, 1, wb,
                      CUDA_R_16BF, 4, &zero, yb, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_ARCH_MISMATCH,
         "a bfloat16 GEMM on sm_75");
    if (cc)
        setenv("EMU_CC", keep, 1);
    else
        unsetenv("EMU_CC");
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    return missed;
}

extern "C" int ddpmd_emu_graph_selfcheck(void);

/* runs every planted misuse against the emulator's runtime and libraries; returns how many went
 * unnoticed (0: all caught). Leaves the context usable (ddpmd_emu_clear_fault) and frees what
 * it made. Messages of the caught ones go to stderr as usual. */
extern "C" __attribute__((visibility("default"))) int ddpmd_emu_selfcheck(void)
{
    int missed = 0;
    size_t f0 = 0, f1 = 0, total = 0;
    float host[64] = {0};
    float *dev = NULL, *dev2 = NULL;
    cudaStream_t a = NULL, b = NULL;
    cudaEvent_t ev = NULL;
    (void)cudaGetLastError();
    if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) ||
        cudaMalloc(&dev, 64 * sizeof(float)) || cudaMalloc(&dev2, 1024 * sizeof(float))) {
        fprintf(stderr, "emu self-check: setup failed\n");
        return 1000;
    }

    /* copies: the kind must match the pointers, errors are not sticky, GetLastError clears */
    SELF(cudaMemcpyAsync(host, host + 32, 16, cudaMemcpyHostToDevice, a) != cudaSuccess,
         "cudaMemcpyAsync H2D to a host pointer");
    SELF(cudaGetLastError() != cudaSuccess && cudaGetLastError() == cudaSuccess,
         "cudaGetLastError reports a failed copy once");
    SELF(cudaMemcpyAsync(host, host + 32, 16, cudaMemcpyDeviceToHost, a) != cudaSuccess,
         "cudaMemcpyAsync D2H from a host pointer");
    SELF(cudaMemcpyAsync(dev, host, 16, cudaMemcpyDeviceToDevice, a) != cudaSuccess,
         "cudaMemcpyAsync D2D from a host pointer");
    SELF(cudaMemcpyAsync(dev, host, 64 * sizeof(float) + 4, cudaMemcpyHostToDevice, a) !=
             cudaSuccess,
         "cudaMemcpyAsync past the end of its allocation");
    SELF(cudaMemsetAsync(host, 0, 16, a) != cudaSuccess, "cudaMemsetAsync of host memory");
    (void)cudaGetLastError();
    SELF(cudaMemcpyAsync(dev, host, 16, cudaMemcpyHostToDevice, a) == cudaSuccess &&
             cudaStreamSynchronize(a) == cudaSuccess,
         "(a good H2D copy after the failed ones fails: an error stuck)");

    /* the device's size */
    SELF(cudaMemGetInfo(&f0, &total) == cudaSuccess && total == emu_total(), "cudaMemGetInfo");
    void *big = NULL;
    SELF(cudaMalloc(&big, total + 1) == cudaErrorMemoryAllocation && !big,
         "cudaMalloc beyond the device's memory (EMU_DEVICE_MB)");
    (void)cudaGetLastError();
    SELF(cudaMemGetInfo(&f1, &total) == cudaSuccess && f1 == f0,
         "a refused cudaMalloc kept memory (%zu -> %zu free, last %s)", f0, f1,
         cudaGetErrorName(cudaPeekAtLastError()));

    /* libraries: their own memory counted, cuBLAS's default workspace unless one is set */
    cublasHandle_t bl = NULL;
    cudnnHandle_t dn = NULL;
    (void)cudaMemGetInfo(&f0, &total);
    SELF(cublasCreate(&bl) == CUBLAS_STATUS_SUCCESS && cudnnCreate(&dn) == CUDNN_STATUS_SUCCESS,
         "(handles)");
    (void)cudaMemGetInfo(&f1, &total);
    /* each handle's own memory is one allocation (the driver's 2 MiB granularity) */
    SELF(f0 - f1 >= 2 * ((size_t)2 << 20), "handles' own device memory invisible");
    if (bl && dn) {
        const float one = 1.0f, zero = 0.0f;
        cublasSetStream(bl, a);
        cudnnSetStream(dn, a);
        (void)cudaMemGetInfo(&f0, &total);
        SELF(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, 4, dev, 4, &zero,
                         dev2, 4) == CUBLAS_STATUS_SUCCESS,
             "(a GEMM)");
        (void)cudaMemGetInfo(&f1, &total);
        SELF(f0 - f1 >= EMU_CUBLAS_DEFAULT_WS,
             "cuBLAS's default workspace (no cublasSetWorkspace) invisible");
        SELF(cublasSetWorkspace(bl, dev2, 8192) ==
                 CUBLAS_STATUS_INVALID_VALUE,
             "cublasSetWorkspace past its allocation's end");
        SELF(cublasSetWorkspace(bl, (void *)(((uintptr_t)host + 255) & ~(uintptr_t)255), 64) ==
                 CUBLAS_STATUS_INVALID_VALUE,
             "cublasSetWorkspace with host memory");
        (void)cudaMemGetInfo(&f0, &total);
        SELF(cublasSetWorkspace(bl, dev2 + 256, 128) == CUBLAS_STATUS_SUCCESS, "(workspace)");
        (void)cudaMemGetInfo(&f1, &total);
        SELF(f1 - f0 >= EMU_CUBLAS_DEFAULT_WS, "a set workspace did not release the default one");
        SELF(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, 4, dev, 4, &zero,
                         dev2, 4) == CUBLAS_STATUS_SUCCESS &&
                 ((unsigned char *)(dev2 + 256))[127] == 0x5A,
             "a GEMM left the workspace it was given untouched");
        SELF(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, host, 4, dev, 4, &zero,
                         dev2, 4) != CUBLAS_STATUS_SUCCESS &&
                 cudaGetLastError() == cudaErrorIllegalAddress,
             "cublasSgemm with a host matrix");
        ddpmd_emu_clear_fault();
        cudnnTensorDescriptor_t td = NULL;
        cudnnCreateTensorDescriptor(&td);
        cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4);
        SELF(cudnnAddTensor(dn, &one, td, host, &zero, td, dev2) != CUDNN_STATUS_SUCCESS &&
                 cudaPeekAtLastError() == cudaErrorIllegalAddress,
             "cudnnAddTensor with a host tensor");
        ddpmd_emu_clear_fault();
        (void)cudaDeviceSynchronize();
        missed += selfcheck_typed(bl, dn, a, dev2);
        cudnnDestroyTensorDescriptor(td);
        cublasDestroy(bl);
        cudnnDestroy(dn);
    }
    (void)cudaDeviceSynchronize();

    /* a kernel given a host pointer: an illegal address that poisons the context */
    CU_LAUNCH(emu_k_fill, 1, 32, 0, a)(host, (const float *)NULL, 64);
    SELF(host[0] == 0.0f, "a kernel ran with a host pointer");
    SELF(cudaPeekAtLastError() == cudaErrorIllegalAddress &&
             cudaGetLastError() == cudaErrorIllegalAddress &&
             cudaGetLastError() == cudaErrorIllegalAddress,
         "a kernel fault is not reported (sticky) by cudaGetLastError/cudaPeekAtLastError");
    void *after = NULL;
    SELF(cudaMalloc(&after, 16) == cudaErrorIllegalAddress &&
             cudaStreamSynchronize(a) == cudaErrorIllegalAddress &&
             cudaMemcpyAsync(dev, host, 16, cudaMemcpyHostToDevice, b) == cudaErrorIllegalAddress,
         "calls after a fault succeed (the context is not poisoned)");
    if (after) cudaFree(after);
    ddpmd_emu_clear_fault();

    /* stream order: B reads what A writes before A's work is known done */
    (void)cudaDeviceSynchronize();
    SELF(cudaMemsetAsync(dev, 0, 64 * sizeof(float), a) == cudaSuccess, "(memset)");
    CU_LAUNCH(emu_k_fill, 1, 32, 0, b)(dev2, (const float *)dev, 64);
    SELF(cudaGetLastError() == cudaErrorInvalidResourceHandle,
         "stream B read a buffer stream A was still writing (no event wait, no sync)");
    SELF(cudaMemcpyAsync(host, dev, 16, cudaMemcpyDeviceToHost, b) != cudaSuccess,
         "stream B copied out a buffer stream A was still writing");
    (void)cudaGetLastError();
    SELF(cudaEventRecord(ev, a) == cudaSuccess && cudaStreamWaitEvent(b, ev, 0) == cudaSuccess,
         "(event)");
    CU_LAUNCH(emu_k_fill, 1, 32, 0, b)(dev2, (const float *)dev, 64);
    SELF(cudaGetLastError() == cudaSuccess, "(a read after an event wait was refused)");
    SELF(cudaMemsetAsync(dev, 0, 64 * sizeof(float), a) != cudaSuccess,
         "stream A overwrote a buffer stream B was still reading");
    (void)cudaGetLastError();
    SELF(cudaStreamSynchronize(b) == cudaSuccess &&
             cudaMemsetAsync(dev, 0, 64 * sizeof(float), a) == cudaSuccess,
         "(memset)");
    SELF(cudaMemsetAsync(dev, 1, 64 * sizeof(float), b) != cudaSuccess,
         "stream B wrote a buffer stream A was still writing");
    (void)cudaGetLastError();
    SELF(cudaStreamSynchronize(a) == cudaSuccess &&
             cudaMemsetAsync(dev, 1, 64 * sizeof(float), b) == cudaSuccess,
         "(a write after the host synchronized the writer was refused)");
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();

    /* stream order by byte range within one allocation (a copy stream beside a compute one) */
    {
        float *pin = NULL;
        ddpmd_emu_stats st0, st1;
        SELF(cudaMallocHost(&pin, 1024 * sizeof(float)) == cudaSuccess, "(cudaMallocHost)");
        cudaPointerAttributes pa;
        SELF(cudaPointerGetAttributes(&pa, pin + 5) == cudaSuccess &&
                 pa.type == cudaMemoryTypeHost,
             "cudaPointerGetAttributes of page-locked memory");
        SELF(cudaPointerGetAttributes(&pa, host) == cudaSuccess &&
                 pa.type == cudaMemoryTypeUnregistered,
             "cudaPointerGetAttributes of pageable memory");
        SELF(cudaPointerGetAttributes(&pa, dev2 + 9) == cudaSuccess &&
                 pa.type == cudaMemoryTypeDevice,
             "cudaPointerGetAttributes of device memory");
        /* A writes the first half, B copies out the second: disjoint, no hazard */
        SELF(cudaMemsetAsync(dev2, 0, 512 * sizeof(float), a) == cudaSuccess, "(memset)");
        SELF(cudaMemcpyAsync(pin, dev2 + 512, 512 * sizeof(float), cudaMemcpyDeviceToHost, b) ==
                 cudaSuccess,
             "a copy of bytes disjoint from another stream's pending write was refused");
        (void)cudaGetLastError();
        /* ... the first half overlaps it: read after write */
        SELF(cudaMemcpyAsync(pin, dev2 + 500, 16 * sizeof(float), cudaMemcpyDeviceToHost, b) !=
                 cudaSuccess,
             "stream B copied out bytes of stream A's pending write (a range overlapping it)");
        (void)cudaGetLastError();
        (void)cudaDeviceSynchronize();
        /* write after read: B copies out [256, 512); A overwrites a byte of it */
        SELF(cudaMemcpyAsync(pin, dev2 + 256, 256 * sizeof(float), cudaMemcpyDeviceToHost, b) ==
                 cudaSuccess,
             "(copy out)");
        SELF(cudaMemsetAsync(dev2 + 511, 0, 4, a) != cudaSuccess,
             "stream A overwrote bytes stream B was still copying out (write after read)");
        (void)cudaGetLastError();
        SELF(cudaMemsetAsync(dev2 + 512, 0, 4, a) == cudaSuccess,
             "a write just past another stream's pending read was refused");
        /* a kernel's pointer argument: the object starting there */
        CU_LAUNCH(emu_k_fill, 1, 32, 0, a)(dev2 + 256, (const float *)NULL, 8);
        SELF(cudaGetLastError() == cudaErrorInvalidResourceHandle,
             "a kernel on stream A wrote the object stream B was still copying out");
        CU_LAUNCH(emu_k_fill, 1, 32, 0, a)(dev2 + 128, (const float *)NULL, 8);
        SELF(cudaGetLastError() == cudaSuccess,
             "a kernel writing an object before another stream's pending read was refused");
        /* ... and with CU_TOUCHES the bytes it names */
        CU_TOUCHES(dev2 + 200, 100 * sizeof(float));
        CU_LAUNCH(emu_k_fill, 1, 32, 0, a)(dev2 + 200, (const float *)NULL, 100);
        SELF(cudaGetLastError() == cudaErrorInvalidResourceHandle,
             "a kernel on stream A wrote bytes (CU_TOUCHES) stream B was still copying out");
        /* the event wait orders them */
        SELF(cudaEventRecord(ev, b) == cudaSuccess && cudaStreamWaitEvent(a, ev, 0) == cudaSuccess,
             "(event)");
        CU_TOUCHES(dev2 + 200, 100 * sizeof(float));
        CU_LAUNCH(emu_k_fill, 1, 32, 0, a)(dev2 + 200, (const float *)NULL, 100);
        SELF(cudaGetLastError() == cudaSuccess, "(a write after an event wait was refused)");
        (void)cudaDeviceSynchronize();
        /* a copy with page-locked memory is done late: the host sees a download after a sync,
         * and an upload reads its source as late */
        SELF(cudaMemsetAsync(dev2, 0, 64, a) == cudaSuccess && cudaStreamSynchronize(a) == 0,
             "(memset)");
        pin[0] = 7.0f;
        SELF(cudaMemcpyAsync(pin, dev2, 4, cudaMemcpyDeviceToHost, b) == cudaSuccess &&
                 pin[0] == 7.0f,
             "a download into page-locked memory was done before any sync");
        SELF(cudaStreamSynchronize(b) == cudaSuccess && pin[0] == 0.0f,
             "a download into page-locked memory was not done by the stream's sync");
        pin[1] = 3.0f;
        SELF(cudaMemcpyAsync(dev2 + 8, pin + 1, 4, cudaMemcpyHostToDevice, b) == cudaSuccess,
             "(upload)");
        pin[1] = 5.0f; /* the misuse: the source changed before the sync */
        SELF(cudaEventRecord(ev, b) == cudaSuccess && cudaEventSynchronize(ev) == cudaSuccess &&
                 cudaMemcpyAsync(host, dev2 + 8, 4, cudaMemcpyDeviceToHost, a) == cudaSuccess &&
                 host[0] == 5.0f,
             "an upload from page-locked memory read its source at once (%g)", host[0]);
        (void)cudaDeviceSynchronize();
        /* page-locked and pageable host memory of async copies, counted */
        ddpmd_emu_get_stats(&st0, 1);
        SELF(cudaMemcpyAsync(pin, dev2, 64, cudaMemcpyDeviceToHost, b) == cudaSuccess &&
                 cudaMemcpyAsync(dev2, pin, 64, cudaMemcpyHostToDevice, b) == cudaSuccess &&
                 cudaMemcpyAsync(host, dev2, 64, cudaMemcpyDeviceToHost, b) == cudaSuccess,
             "(copies)");
        ddpmd_emu_get_stats(&st1, 0);
        SELF(st1.async_pinned == 2 && st1.async_pageable == 1,
             "async copies: %ld page-locked, %ld pageable (want 2, 1)", st1.async_pinned,
             st1.async_pageable);
        (void)cudaDeviceSynchronize();
        cudaFreeHost(pin);
    }

    /* 16-bit types: CUDA's conversions (nearest even, overflow, subnormals, NaN) */
    {
        const struct {
            float f;
            uint16_t h, b;
        } cv[] = {
            {1.0f, 0x3c00, 0x3f80},          {-2.0f, 0xc000, 0xc000},
            {65504.0f, 0x7bff, 0x4780},      {65520.0f, 0x7c00, 0x4780},
            {1.0f + 1.0f / 2048, 0x3c00, 0x3f80}, /* a tie: even */
            {1.0f + 3.0f / 2048, 0x3c02, 0x3f80}, /* a tie: up to even */
            {5.9604645e-8f, 0x0001, 0x3380}, /* the smallest half subnormal */
            {1.0f + 1.0f / 256, 0x3c04, 0x3f80}, /* bf16 tie: even */
            {1.0f + 3.0f / 256, 0x3c0c, 0x3f82}, /* bf16 tie: up to even */
        };
        for (size_t i = 0; i < sizeof cv / sizeof *cv; i++) {
            SELF(__float2half(cv[i].f).x == cv[i].h, "__float2half(%.9g) = 0x%04x, want 0x%04x",
                 cv[i].f, __float2half(cv[i].f).x, cv[i].h);
            SELF(__float2bfloat16(cv[i].f).x == cv[i].b,
                 "__float2bfloat16(%.9g) = 0x%04x, want 0x%04x", cv[i].f,
                 __float2bfloat16(cv[i].f).x, cv[i].b);
            if (cv[i].h != 0x7c00) {
                const float back = __half2float(__half{cv[i].h});
                SELF(__float2half(back).x == cv[i].h, "__half2float(0x%04x) = %.9g", cv[i].h,
                     back);
            }
            const float bb = __bfloat162float(__nv_bfloat16{cv[i].b});
            SELF(__float2bfloat16(bb).x == cv[i].b, "__bfloat162float(0x%04x) = %.9g", cv[i].b,
                 bb);
        }
        SELF(__half2float(__float2half(NAN)) != __half2float(__float2half(NAN)) &&
                 __bfloat162float(__float2bfloat16(NAN)) != __bfloat162float(__float2bfloat16(NAN)),
             "NaN through half / bfloat16");
    }

    cudaFree(dev);
    cudaFree(dev2);
    cudaEventDestroy(ev);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    ddpmd_emu_clear_fault();
    /* stream capture's own (graph.cpp) */
    missed += ddpmd_emu_graph_selfcheck();
    return missed;
}
