/* test_train_reserve.c - a training job's reservation is the whole truth: a run with sample grids
 * (and the grid owed on --resume) makes exactly one backend allocation, of exactly train_plan's
 * total_bytes, which covers the nested sampling plan; its grids are bit-identical (PNG bytes) to
 * sampling the same step's checkpoint EMA standalone with the same sampler, seed and batch;
 * sampling in between does not change training (the last grid and checkpoint equal a run without
 * intermediate grids); the plan print shows the sampling part; and a schedule of fewer than 50
 * timesteps still gets its grid (DDIM steps clamped).
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "image.h"
#include "philox.h"
#include "generate.h"
#include "test_util.h"
#include "test_train_util.h"
#include "train.h"

/* the CPU backend's mem_alloc (kernels/cpu/cpu.h): every device allocation goes through it */
int cpu_mem_alloc(void **out, size_t bytes, bk_ctx *ctx);

/* ---- device allocation recorder: calls of cpu_mem_alloc while armed ---- */
#define REC_MAX 64
static volatile int armed;
static long n_dev;              /* cpu_mem_alloc calls while armed */
static size_t dev_bytes[REC_MAX];

/* whether pc lies inside cpu_mem_alloc (a small leaf-like function: well under 256 bytes) */
static int in_cpu_mem_alloc(const void *pc)
{
    const char *lo = (const char *)(uintptr_t)cpu_mem_alloc;
    return (const char *)pc >= lo && (const char *)pc < lo + 256;
}

static void record_dev(size_t n)
{
    long k = __atomic_fetch_add(&n_dev, 1, __ATOMIC_RELAXED);
    if (k < REC_MAX) dev_bytes[k] = n;
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
#include <execinfo.h>
/* ASan owns malloc: its hooks see every allocation; the caller is found on the stack */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static __thread int in_hook;
static void asan_malloc_hook(const volatile void *p, size_t n)
{
    (void)p;
    if (!armed || in_hook) return;
    in_hook = 1;
    void *fr[12];
    int d = backtrace(fr, 12);
    for (int i = 0; i < d; i++)
        if (in_cpu_mem_alloc(fr[i])) {
            record_dev(n);
            break;
        }
    in_hook = 0;
}
static void asan_free_hook(const volatile void *p) { (void)p; }
static void recorder_install(void)
{
    __sanitizer_install_malloc_and_free_hooks(asan_malloc_hook, asan_free_hook);
}
#else
extern void *__libc_memalign(size_t, size_t);
/* cpu_mem_alloc allocates with posix_memalign: its return address says who asked */
int posix_memalign(void **out, size_t align, size_t n)
{
    if (armed && in_cpu_mem_alloc(__builtin_return_address(0))) record_dev(n);
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12;
}
static void recorder_install(void) {}
#endif

static void arm(void)
{
    n_dev = 0;
    armed = 1;
}

static char root[256];

static void tiny_spec(struct train_spec *s, const char *data, int steps)
{
    tt_tiny_spec(s, data, steps);
    s->model.dropout = 0.1f;
    s->flip = 1;
    s->optim.warmup = 1;
    s->sample_every = 2;
    s->keep_last = 10;
    s->samples = 5; /* a grid of 5 at batch 5: not a power of two, a partial last row */
    s->timesteps = 10; /* 10 DDIM steps a grid (clamped): a fast test */
}

static int same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = tu_slurp(a, &na), *y = tu_slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* the tensors of two checkpoints (weights, EMA, AdamW) byte for byte */
static int same_tensors(const char *a, const char *b)
{
    struct safetensors *sa = NULL, *sb = NULL;
    char err[256];
    int same = safetensors_open(&sa, a, err, sizeof err) == 0 &&
               safetensors_open(&sb, b, err, sizeof err) == 0 &&
               safetensors_count(sa) == safetensors_count(sb) && safetensors_count(sa) > 0;
    for (size_t i = 0; same && i < safetensors_count(sa); i++) {
        const struct st_tensor *ta, *tb;
        safetensors_get(sa, i, &ta);
        safetensors_get(sb, i, &tb);
        same = ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0;
    }
    safetensors_free(sa);
    safetensors_free(sb);
    return same;
}

/* what the old separate-plan path (and `ddpmd sample`) draws for the grid of out/step: the
 * checkpoint's EMA in a plan and allocation of its own, the job's sampler, seed and batch */
static int standalone_grid(const struct train_spec *s, const char *out, int step,
                           const char *png)
{
    char path[600], err[300];
    snprintf(path, sizeof path, "%s/checkpoints/step-%08d.safetensors", out, step);
    struct safetensors *st = NULL;
    struct train_spec saved;
    struct ddpm_schedule sch = {0};
    struct generator sj;
    memset(&sj, 0, sizeof sj);
    int n = s->samples, batch = n < 16 ? n : 16, rc = -1;
    float *img = malloc((size_t)n * 256 * sizeof *img);
    struct sampler_config sc;
    train_sampler_config(s, &sc);
    if (!img || checkpoint_open(&st, path, &saved, NULL, err, sizeof err) ||
        ddpm_schedule_init(&sch, saved.timesteps, saved.beta_schedule, saved.beta_start,
                           saved.beta_end) ||
        generate_init(&sj, &saved.model, batch, saved.threads, NULL, err, sizeof err) ||
        checkpoint_load_generator(&sj, st, 1, err, sizeof err) ||
        generate_run(&sj, &sch, &sc, saved.seed, n, img, NULL, NULL) != GENERATE_OK ||
        image_save_grid_png(png, img, n, 1, 16, 16, (int)ceil(sqrt((double)n)), 2, err,
                            sizeof err)) {
        fprintf(stderr, "standalone sampling of %s: %s\n", path, err);
        goto out;
    }
    rc = 0;
out:
    generate_free(&sj);
    ddpm_schedule_free(&sch);
    safetensors_free(st);
    free(img);
    return rc;
}

int main(void)
{
    recorder_install();
    snprintf(root, sizeof root, "/tmp/ddpmd_train_reserve_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char data[300], a[300], b[300], c[300], err[600];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    snprintf(c, sizeof c, "%s/c", root);
    tt_make_discs(data);

    /* the recorder sees a backend allocation (a control for the checks below) */
    void *ptr = NULL;
    arm();
    int arc = backend_cpu()->mem_alloc(&ptr, 4096, NULL);
    armed = 0;
    CHECK(arc == 0 && n_dev == 1 && dev_bytes[0] == 4096,
          "the recorder missed a mem_alloc (%ld calls)", n_dev);
    backend_cpu()->mem_free(ptr, NULL);

    /* the job's plan covers its grids: the reservation is the larger of step and sampling */
    struct train_spec s;
    tiny_spec(&s, data, 4);
    struct graph g, sg;
    struct unet_io io, sio;
    struct plan p, sp;
    int target;
    CHECK(train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == 0, "%s",
          err);
    size_t total = p.total_bytes;
    CHECK(sp.nested && sp.inference && p.nested_bytes == sp.total_bytes &&
              total >= p.nested_bytes && p.nested_bytes > p.inputs_off,
          "the nested grid plan: nested %zu, its end %zu, total %zu", p.nested_bytes,
          sp.total_bytes, total);
    plan_free(&sp);
    graph_free(&sg);
    plan_free(&p);
    graph_free(&g);
    CHECK(train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == 0 &&
              p.total_bytes == total,
          "train_plan_job again holds %zu bytes, the job %zu", p.total_bytes, total);
    plan_free(&sp);
    graph_free(&sg);
    /* the job's plan print (train_run's, before the first step) names the sampling part */
    char *txt = NULL;
    size_t tlen = 0;
    FILE *mf = open_memstream(&txt, &tlen);
    if (mf) {
        plan_print(&p, mf);
        fclose(mf);
    }
    CHECK(txt && strstr(txt, "nested sampling"), "the plan print shows no sampling part:\n%s",
          txt ? txt : "");
    free(txt);
    plan_free(&p);
    graph_free(&g);

    /* a run with grids at steps 2 and 4: one device allocation, of exactly total_bytes */
    struct train_opts oa = {.out_dir = a, .quiet = 1};
    arm();
    int rc = train_run(&s, &oa, err, sizeof err);
    armed = 0;
    CHECK(rc == TRAIN_DONE, "the run with grids: %s", err);
    CHECK(n_dev == 1 && dev_bytes[0] == total,
          "a run with 2 sample grids made %ld device allocations (first %zu, second %zu bytes); "
          "want 1 of the plan's %zu", n_dev, n_dev > 0 ? dev_bytes[0] : 0,
          n_dev > 1 ? dev_bytes[1] : 0, total);

    /* each grid is what the old separate plan draws from that step's checkpoint EMA */
    for (int step = 2; step <= 4; step += 2) {
        char grid[600], ref[600];
        snprintf(grid, sizeof grid, "%s/samples/step-%08d.png", a, step);
        snprintf(ref, sizeof ref, "%s/ref-%d.png", root, step);
        CHECK(standalone_grid(&s, a, step, ref) == 0 && same_file(grid, ref),
              "the grid of step %d differs from standalone sampling of its checkpoint", step);
    }

    /* the grid owed on --resume takes the same path: one allocation, the same PNG bytes */
    {
        char grid[600], kept[600];
        snprintf(grid, sizeof grid, "%s/samples/step-00000004.png", a);
        snprintf(kept, sizeof kept, "%s/kept-4.png", root);
        CHECK(rename(grid, kept) == 0, "cannot move %s aside", grid);
        struct train_opts orr = {.out_dir = a, .quiet = 1, .resume = TRAIN_RESUME_REQUIRED};
        arm();
        rc = train_run(&s, &orr, err, sizeof err);
        armed = 0;
        CHECK(rc == TRAIN_DONE && n_dev == 1 && dev_bytes[0] == total && same_file(grid, kept),
              "the grid owed on --resume: %s, %ld device allocations, %s", rc ? err : "done",
              n_dev, same_file(grid, kept) ? "same bytes" : "other bytes or missing");
    }

    /* sampling in between leaves training alone: no grid at step 2, the same step 4 */
    struct train_spec sb = s;
    sb.sample_every = 0;
    struct train_opts ob = {.out_dir = b, .quiet = 1};
    CHECK(train_run(&sb, &ob, err, sizeof err) == TRAIN_DONE, "the run without grids: %s", err);
    {
        char ga[600], gb[600], ca[600], cb[600];
        snprintf(ga, sizeof ga, "%s/samples/step-00000004.png", a);
        snprintf(gb, sizeof gb, "%s/samples/step-00000004.png", b);
        snprintf(ca, sizeof ca, "%s/checkpoints/step-00000004.safetensors", a);
        snprintf(cb, sizeof cb, "%s/checkpoints/step-00000004.safetensors", b);
        CHECK(same_file(ga, gb) && same_tensors(ca, cb),
              "a grid at step 2 changed the training that followed");
        snprintf(gb, sizeof gb, "%s/samples/step-00000002.png", b);
        CHECK(access(gb, F_OK) != 0, "sample_every 0 drew a grid at step 2");
    }

    /* diffusion.timesteps below the grid's 50 DDIM steps: the steps follow the schedule */
    struct train_spec st20;
    tiny_spec(&st20, data, 2);
    st20.timesteps = 20;
    st20.samples = 2;
    struct sampler_config sc;
    train_sampler_config(&st20, &sc);
    CHECK(sc.steps == 20, "a 20-step schedule samples with %d DDIM steps", sc.steps);
    struct train_opts oc = {.out_dir = c, .quiet = 1};
    CHECK(train_run(&st20, &oc, err, sizeof err) == TRAIN_DONE,
          "a valid spec with diffusion.timesteps 20: %s", err);
    {
        char gc[600];
        snprintf(gc, sizeof gc, "%s/samples/step-00000002.png", c);
        CHECK(access(gc, F_OK) == 0, "no grid at the end of a 20-timestep run");
    }

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_train_reserve");
}
