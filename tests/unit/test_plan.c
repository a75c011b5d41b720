/* test_plan.c - the planner's honesty: a step out of the planned arena (reuse, in-place, NaN
 * poisoning of dead tensors, canary gaps checked after every op) is bit-identical to a step with
 * no reuse at all; steps 2 and 3 allocate nothing of ddpmd's own: every heap allocation made
 * during them (malloc interposer, or ASan's allocator hooks under ASan) is attributed by its
 * call stack to the library that asked for it, and only two kinds are allowed, none above
 * 64 KiB: oneDNN's inside its primitive execution (argument maps, the closures of its parallel
 * loops, on machines without AVX-512 per-call GEMM packing buffers of a few KiB), and libgomp's
 * team of a parallel region that runs on one thread (an if() clause false or num_threads 1:
 * libgomp allocates and frees that team on every entry; the same number in steps 2 and 3); the
 * arena's high-water mark is the planned size; and the checks themselves catch a planted
 * lifetime or size bug.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "test_util.h"
#include "test_unet_util.h"
#include "unet.h"

/* ---- allocation recorder: while armed, every heap allocation's size and call stack ---- */

#define REC_MAX 16384 /* allocations recorded per armed step (a step makes ~1,200) */
#define REC_DEPTH 24
static volatile int alloc_armed;
static long alloc_count; /* all allocations while armed, recorded or not */
static size_t rec_size[REC_MAX];
static void *rec_stack[REC_MAX][REC_DEPTH];
static int rec_depth[REC_MAX];
static __thread int in_record; /* backtrace() may allocate: not counted, no recursion */

static void record(size_t n)
{
    if (!alloc_armed || in_record) return;
    in_record = 1;
    long k = __atomic_fetch_add(&alloc_count, 1, __ATOMIC_RELAXED);
    if (k < REC_MAX) {
        rec_size[k] = n;
        rec_depth[k] = backtrace(rec_stack[k], REC_DEPTH);
    }
    in_record = 0;
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_PLAN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_PLAN_ASAN 1
#endif
#endif

#ifdef TEST_PLAN_ASAN
/* ASan owns malloc: its allocator reports every allocation to these hooks (declared here:
 * gcc ships no sanitizer/allocator_interface.h) */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static void asan_malloc_hook(const volatile void *p, size_t n)
{
    (void)p;
    record(n);
}
static void asan_free_hook(const volatile void *p) { (void)p; }
static void recorder_install(void)
{
    __sanitizer_install_malloc_and_free_hooks(asan_malloc_hook, asan_free_hook);
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n)
{
    record(n);
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    record(a * b);
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    record(n);
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    record(n);
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12;
}
void *aligned_alloc(size_t align, size_t n)
{
    record(n);
    return __libc_memalign(align, n);
}
void *memalign(size_t align, size_t n)
{
    record(n);
    return __libc_memalign(align, n);
}
static void recorder_install(void) {}
#endif

struct alloc_report {
    long count, onednn, gomp, other;
    size_t largest;
    char other_site[256]; /* the stack of the first allocation of neither kind */
};

/* the code segments of the loaded objects: a pc is classified by range, not by dladdr (which
 * also searches the symbol table - too slow for ~200,000 frames) */
struct code_range {
    uintptr_t lo, hi;
    const char *name; /* "" for this executable */
};
static struct code_range ranges[128];
static int n_ranges;

static int collect_range(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    for (int i = 0; i < info->dlpi_phnum && n_ranges < 128; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        ranges[n_ranges].lo = info->dlpi_addr + ph->p_vaddr;
        ranges[n_ranges].hi = ranges[n_ranges].lo + ph->p_memsz;
        ranges[n_ranges].name = info->dlpi_name ? info->dlpi_name : "";
        n_ranges++;
    }
    return 0;
}

/* the object holding code address pc ("" for this executable), or NULL */
static const char *object_of(void *pc)
{
    for (int i = 0; i < n_ranges; i++)
        if ((uintptr_t)pc >= ranges[i].lo && (uintptr_t)pc < ranges[i].hi) return ranges[i].name;
    return NULL;
}

/* the allocator's own layers: this executable's recorder, ASan/UBSan's interceptors, libc,
 * libstdc++'s operator new and string/container helpers, the unwinder */
static int allocator_layer(const char *obj)
{
    static const char *libs[] = {"libasan", "libubsan", "libc.so", "libstdc++", "libgcc_s"};
    if (!obj[0]) return 1;
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++)
        if (strstr(obj, libs[i])) return 1;
    return 0;
}

/* attributes the allocations recorded in the last armed stretch to the first object on each
 * stack beyond the allocator's layers: libdnnl (oneDNN), libgomp, or anything else - ddpmd's
 * own code lives in this executable, so its allocations have no such object, and count as
 * other, as do OpenBLAS's or anyone's */
static struct alloc_report alloc_attribute(void)
{
    struct alloc_report r = {.count = alloc_count};
    n_ranges = 0;
    dl_iterate_phdr(collect_range, NULL);
    long n = alloc_count < REC_MAX ? alloc_count : REC_MAX;
    for (long k = 0; k < n; k++) {
        if (rec_size[k] > r.largest) r.largest = rec_size[k];
        const char *who = NULL;
        for (int f = 0; f < rec_depth[k] && !who; f++) {
            const char *obj = object_of(rec_stack[k][f]);
            if (obj && !allocator_layer(obj)) who = obj;
        }
        if (who && strstr(who, "libdnnl")) {
            r.onednn++;
        } else if (who && (strstr(who, "libgomp") || strstr(who, "libomp"))) { /* gcc, clang */
            r.gomp++;
        } else if (r.other++ == 0) {
            size_t len = 0;
            for (int f = 0; f < rec_depth[k] && len + 1 < sizeof r.other_site; f++) {
                Dl_info di;
                const char *sym = !dladdr(rec_stack[k][f], &di) ? "?"
                                  : di.dli_sname                ? di.dli_sname
                                  : di.dli_fname && strrchr(di.dli_fname, '/')
                                      ? strrchr(di.dli_fname, '/') + 1
                                      : "?";
                len += (size_t)snprintf(r.other_site + len, sizeof r.other_site - len, " %s", sym);
            }
        }
    }
    return r;
}

struct job {
    struct graph g;
    struct unet_io io;
    int target, loss;
    struct plan p;
    struct exec *e;
};

static void small_config(struct unet_config *c, enum unet_preset preset)
{
    tu_small_unet(c, preset);
    if (preset == UNET_DDPM) c->dropout = 0.1f; /* exercises dropout's recomputed masks */
}

static int job_init_prec(struct job *j, const struct unet_config *c, int batch,
                         const struct plan_opts *po, const struct exec_opts *eo, int precision)
{
    memset(j, 0, sizeof *j);
    graph_init(&j->g);
    if (unet_build_training(&j->g, c, batch, &j->io, &j->target, &j->loss)) return -1;
    if (graph_set_precision(&j->g, precision)) return -1;
    struct plan_opts o = {0};
    if (po) o = *po;
    o.strategy.precision = precision;
    if (plan_make(&j->p, &j->g, backend_cpu(), &o)) return -1;
    if (exec_init(&j->e, &j->g, &j->p, backend_cpu(), eo)) return -1;
    size_t maxn = 0;
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->numel > maxn) maxn = j->g.tensors[i]->numel;
    float *h = malloc(maxn * sizeof *h);
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(j->g.tensors[i], 42, h);
            /* norm scales and biases off their defaults so every path carries signal */
            if (j->g.tensors[i]->init == INIT_ONES || j->g.tensors[i]->init == INIT_ZEROS)
                for (size_t k = 0; k < j->g.tensors[i]->numel; k++)
                    h[k] += 0.1f * (philox_uniform_at(7, 1, (uint64_t)i, 0, 0, (uint32_t)k) - 0.5f);
            exec_upload(j->e, i, h);
        }
    free(h);
    exec_reset_state(j->e);
    return 0;
}

static int job_init(struct job *j, const struct unet_config *c, int batch,
                    const struct plan_opts *po, const struct exec_opts *eo)
{
    return job_init_prec(j, c, batch, po, eo, STRATEGY_PRECISION_F32);
}

static void job_free(struct job *j)
{
    exec_free(j->e);
    plan_free(&j->p);
    graph_free(&j->g);
}

/* a deterministic batch for step s */
static void feed(struct job *j, int s)
{
    size_t n = j->g.tensors[j->io.x]->numel;
    int b = j->g.tensors[j->io.x]->d[0];
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), t[64];
    for (size_t i = 0; i < n; i++) {
        x[i] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 0, 0, (uint32_t)i);
        y[i] = philox_normal(3, PHILOX_TAG_NOISE, (uint64_t)s, 1, 0, (uint32_t)i);
    }
    for (int i = 0; i < b; i++) t[i] = (float)((s * 131 + i * 377) % 1000);
    exec_upload(j->e, j->io.x, x);
    exec_upload(j->e, j->io.t, t);
    exec_upload(j->e, j->target, y);
    free(x);
    free(y);
}

static int step(struct job *j, int s, float *loss)
{
    struct optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.01f, .clip = 1.0f, .ema_decay = 0.99f};
    int rc = exec_forward_backward(j->e, 1, 1.0f, 11, (uint64_t)s, 0, loss);
    if (!rc) rc = exec_optimizer_step(j->e, &oc, s + 1, oc.lr, NULL);
    return rc;
}

static int params_equal(struct job *a, struct job *b)
{
    for (int i = 0; i < a->g.n_tensors; i++) {
        if (a->g.tensors[i]->kind != TENSOR_PARAM && a->g.tensors[i]->kind != TENSOR_GRAD) continue;
        size_t n = a->g.tensors[i]->numel;
        float *x = malloc(n * 4), *y = malloc(n * 4);
        exec_download(a->e, i, x);
        exec_download(b->e, i, y);
        int same = memcmp(x, y, n * 4) == 0;
        free(x);
        free(y);
        if (!same) {
            fprintf(stderr, "tensor %d (%s) differs\n", i,
                    a->g.tensors[i]->name ? a->g.tensors[i]->name : "grad");
            return 0;
        }
    }
    return 1;
}

static void honesty(enum unet_preset preset, int tiled, int precision)
{
    const char *name = preset == UNET_DDPM ? (precision ? "ddpm bf16" : "ddpm")
                                           : (precision ? "seed bf16" : "seed");
    struct unet_config c;
    small_config(&c, preset);
    c.attn_tiled = tiled;
    struct plan_opts reuse_guarded = {.guard_bytes = 256}, none = {.no_reuse = 1};
    struct exec_opts checked = {.threads = 2, .poison = 1, .check_guards = 1};
    struct exec_opts plain = {.threads = 2};
    struct job a, b, h;
    CHECK(job_init_prec(&a, &c, 3, &reuse_guarded, &checked, precision) == 0, "%s: job a", name);
    CHECK(job_init_prec(&b, &c, 3, &none, &plain, precision) == 0, "%s: job b", name);
    CHECK(job_init_prec(&h, &c, 3, NULL, &plain, precision) == 0, "%s: job h", name);
    CHECK(h.p.arena_bytes < h.p.no_reuse_arena_bytes, "%s: reuse saves nothing: %zu of %zu",
          name, h.p.arena_bytes, h.p.no_reuse_arena_bytes);
    printf("%s (%s attention): arena %zu bytes planned, %zu without reuse (%.1fx), %d storages\n",
           name, tiled ? "tiled" : "plain", h.p.arena_bytes, h.p.no_reuse_arena_bytes,
           (double)h.p.no_reuse_arena_bytes / (double)h.p.arena_bytes, h.p.n_storages);
    long gomp_step2 = -1;
    for (int s = 0; s < 3; s++) {
        float la = 0, lb = 0, lh = 0;
        feed(&a, s);
        feed(&b, s);
        feed(&h, s);
        CHECK(step(&a, s, &la) == 0, "%s: checked step %d", name, s);
        CHECK(step(&b, s, &lb) == 0, "%s: no-reuse step %d", name, s);
        if (s == 0) {
            CHECK(step(&h, s, &lh) == 0, "%s: step", name);
        } else {
            /* steps 2 and 3: no tensor, workspace or scratch of ddpmd's allocated anywhere in
             * the process. oneDNN's primitive execution builds small argument maps on the heap
             * (C++ inside the library), its parallel loops allocate their closures, and on
             * machines without AVX-512 the GEMM-based kernel it picks for some tiny convolutions
             * (2x2 images here) packs operands in per-call buffers of a few KiB; libgomp
             * allocates the team of every parallel region the CPU kernels run on one thread
             * (their if() clauses on small tensors). Those are the only allocations allowed,
             * none above 64 KiB, libgomp's the same number in both steps. */
            alloc_count = 0;
            alloc_armed = 1;
            int rc = step(&h, s, &lh);
            alloc_armed = 0;
            CHECK(rc == 0, "%s: step %d", name, s);
            struct alloc_report r = alloc_attribute();
            CHECK(r.count <= REC_MAX, "%s: %ld allocations during step %d, %d recorded", name,
                  r.count, s + 1, REC_MAX);
            CHECK(r.other == 0, "%s: %ld allocations during step %d neither oneDNN's nor "
                  "libgomp's, the first from:%s", name, r.other, s + 1, r.other_site);
            CHECK(r.largest <= 65536, "%s: an allocation of %zu bytes during step %d (%ld in all)",
                  name, r.largest, s + 1, r.count);
            if (s == 1) gomp_step2 = r.gomp;
            else
                CHECK(r.gomp == gomp_step2, "%s: libgomp allocated %ld times in step 2, %ld in "
                      "step 3", name, gomp_step2, r.gomp);
            printf("%s: step %d made %ld allocations: %ld in oneDNN, %ld libgomp teams of "
                   "one-thread regions, the largest %zu bytes\n", name, s + 1, r.count, r.onednn,
                   r.gomp, r.largest);
        }
        CHECK(isfinite(la) && memcmp(&la, &lb, 4) == 0 && memcmp(&la, &lh, 4) == 0,
              "%s step %d: losses %.9g (checked) %.9g (no reuse) %.9g", name, s, la, lb, lh);
    }
    CHECK(params_equal(&a, &b), "%s: weights after 3 steps differ (reuse+poison vs no reuse)",
          name);
    CHECK(params_equal(&h, &b), "%s: weights after 3 steps differ (plain vs no reuse)", name);
    size_t hw = exec_arena_high_water(h.e);
    CHECK(hw <= h.p.arena_bytes && h.p.arena_bytes - hw < PLAN_ALIGN,
          "%s: high-water %zu vs planned %zu", name, hw, h.p.arena_bytes);
    job_free(&a);
    job_free(&b);
    job_free(&h);
}

/* the checks catch planted bugs: a storage freed too early, a tensor written past its end */
static void checks_catch_bugs(void)
{
    struct unet_config c;
    small_config(&c, UNET_SEED);
    struct plan_opts po = {.guard_bytes = 64};
    struct exec_opts eo = {.threads = 2, .poison = 1, .check_guards = 1};
    struct job j;
    CHECK(job_init(&j, &c, 2, &po, &eo) == 0, "job");
    /* the first conv's output is read by the norm after it: end its life at birth */
    int victim = -1;
    for (int s = 0; s < j.p.n_storages && victim < 0; s++)
        if (j.p.st[s].last > j.p.st[s].first + 1 && j.p.st[s].bytes > 1024) victim = s;
    int saved_last = j.p.st[victim].last;
    exec_free(j.e);
    j.p.st[victim].last = j.p.st[victim].first;
    exec_init(&j.e, &j.g, &j.p, backend_cpu(), &eo);
    exec_reset_state(j.e);
    float loss = 0;
    feed(&j, 0);
    exec_forward_backward(j.e, 1, 1.0f, 0, 0, 0, &loss);
    float *gr = malloc(j.g.param_numel * 4);
    int nan = !isfinite(loss);
    for (int i = 0; i < j.g.n_tensors && !nan; i++)
        if (j.g.tensors[i]->kind == TENSOR_GRAD) {
            exec_download(j.e, i, gr);
            for (size_t k = 0; k < j.g.tensors[i]->numel; k++) nan |= !isfinite(gr[k]);
        }
    CHECK(nan, "poisoning did not expose a storage freed too early");
    free(gr);
    /* shrink a storage by 4 bytes: the op writing it runs into the canary */
    exec_free(j.e);
    j.p.st[victim].last = saved_last;
    j.p.st[victim].bytes -= 4;
    exec_init(&j.e, &j.g, &j.p, backend_cpu(), &eo);
    exec_reset_state(j.e);
    feed(&j, 0);
    int rc = exec_forward_backward(j.e, 1, 1.0f, 0, 0, 0, &loss);
    CHECK(rc == EXEC_ERR_GUARD, "canary check did not catch an overrun (rc %d)", rc);
    job_free(&j);
}

/* the recorder sees an allocation outside oneDNN, as the step check relies on */
static void recorder_catches(void)
{
    void *bt[4];
    backtrace(bt, 4); /* the first call loads the unwinder (allocating): before arming */
    alloc_count = 0;
    alloc_armed = 1;
    void *volatile p = malloc(100);
    alloc_armed = 0;
    free(p);
    struct alloc_report r = alloc_attribute();
    CHECK(r.count == 1 && r.other == 1 && r.largest == 100,
          "the recorder missed a malloc(100): %ld recorded, %ld outside oneDNN, largest %zu",
          r.count, r.other, r.largest);
}

int main(void)
{
    recorder_install();
    recorder_catches();
    honesty(UNET_DDPM, 1, STRATEGY_PRECISION_F32);
    honesty(UNET_SEED, 1, STRATEGY_PRECISION_F32);
    honesty(UNET_SEED, 0, STRATEGY_PRECISION_F32);
    /* 16-bit storage: conversion scratch and working weights planned, nothing allocated */
    honesty(UNET_DDPM, 1, STRATEGY_PRECISION_BF16);
    checks_catch_bugs();
    return tu_finish("test_plan");
}
