/* attn_bench.c - the CUDA backend's attention, forward and backward, per path on the shapes of
 * the benchmark's models (not a test: tests/gpu/test_gpu_ops checks every path's results).
 * Paths: "plain" (cuBLAS batched GEMMs, probabilities saved), "tiled" (attention.cu's kernels,
 * FlashAttention-2's schedule for the backward), in parity mode; and the tiled form in fast mode
 * (parity off): cuDNN's fused attention for 16-bit where cuDNN has an engine, "tiled-fast".
 * Each line: model, layer, shape, path, dtype, forward and backward ms (median of the timed
 * runs, synchronized), backward / forward, and achieved TFLOP/s (forward 4 N H L^2 D FLOPs, the
 * backward 2.5 times that, as FlashAttention-2 counts them; the tiled backward's recomputation
 * not counted). Ratios between paths, measured in the same run, are what to read.
 *   attn_bench [--device cuda:0] [--runs N] [--warmup N] [--dtype f32|bf16|f16|all]
 *              [--model ddpm|seed|all] [--batch N] [--quick]
 * --quick: two tiny shapes, one run (a smoke run, e.g. under the emulator).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_load.h"
#include "half.h"

static const struct backend *G;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* one attention layer of a model: its shape and the form the model plans for it */
struct layer {
    const char *model, *name;
    int n, l, heads, d, packed, plain;
};

enum path { P_PLAIN, P_TILED, P_TILED_FAST, P_COUNT };
static const char *path_name[P_COUNT] = {"plain", "tiled", "tiled-fast"};

struct run {
    bk_ctx *ctx;
    char *base;
    size_t bytes;
};

/* median seconds of fn over runs after warmup, each synchronized */
#define TIME_IT(out, warmup, runs, call)                                                       \
    do {                                                                                       \
        double t_[64];                                                                         \
        int rc_ = 0;                                                                           \
        for (int i_ = 0; i_ < (warmup) && !rc_; i_++) rc_ = (call) || G->sync(r->ctx);        \
        for (int i_ = 0; i_ < (runs) && !rc_; i_++) {                                          \
            const double t0_ = now();                                                          \
            rc_ = (call) || G->sync(r->ctx);                                                   \
            t_[i_] = now() - t0_;                                                              \
        }                                                                                      \
        if (rc_) return rc_;                                                                   \
        qsort(t_, (size_t)(runs), sizeof(double), cmp_double);                                 \
        (out) = t_[(runs) / 2];                                                                \
    } while (0)

/* random-ish inputs of dtype dt (n elements) at p */
static int fill(void *p, size_t n, int dt, unsigned seed, bk_ctx *ctx)
{
    const size_t es = bk_dtype_size(dt);
    void *h = malloc(n * es);
    if (!h) return BK_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float v = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
        if (dt == BK_DTYPE_F32)
            ((float *)h)[i] = v;
        else
            ((uint16_t *)h)[i] = dt == BK_DTYPE_BF16 ? half_f32_to_bf16(v) : half_f32_to_f16(v);
    }
    int rc = G->mem_upload(p, h, n * es, ctx);
    free(h);
    return rc;
}

static int bench_one(const struct layer *ly, int path, int dt, struct run *r, int warmup, int runs)
{
    const int cdim = ly->heads * ly->d, ld = ly->packed ? 3 * cdim : cdim;
    struct bk_attn s = {.n = ly->n, .l = ly->l, .heads = ly->heads, .d = ly->d, .ld = ld,
                        .scale = 1.0f / sqrtf((float)ly->d), .dtype = dt};
    const int tiled = path != P_PLAIN;
    const size_t es = bk_dtype_size(dt), rows = (size_t)ly->n * ly->l;
    const size_t nq = rows * ld * (ly->packed ? 1 : 3), no = rows * cdim;
    const size_t nsaved = tiled ? (size_t)ly->n * ly->heads * ly->l
                                : (size_t)ly->n * ly->heads * ly->l * ly->l;
    if (backend_supports(G, BK_OP_set_parity, BK_DTYPE_F32)) G->set_parity(path != P_TILED_FAST);
    const size_t ws = G->attn_ws_bytes(&s, tiled);
    if (backend_supports(G, BK_OP_set_parity, BK_DTYPE_F32)) G->set_parity(1);
    size_t off = 0, at[8];
    const size_t sizes[8] = {nq * es, nq * es, no * es, no * es, no * es, nsaved * 4, ws ? ws : 256,
                             0};
    for (int i = 0; i < 7; i++) {
        at[i] = off;
        off += (sizes[i] + 255) & ~(size_t)255;
    }
    if (off > r->bytes) {
        printf("%-6s %-4s n%-4d l%-5d h%d d%-4d %-10s %-4s skipped: %.1f GiB over the %.1f GiB "
               "reserved\n", ly->model, ly->name, ly->n, ly->l, ly->heads, ly->d,
               path_name[path], dt == BK_DTYPE_F32 ? "f32" : dt == BK_DTYPE_BF16 ? "bf16" : "f16",
               off / 1073741824.0, r->bytes / 1073741824.0);
        return 0;
    }
    char *qkv = r->base + at[0], *dqkv = r->base + at[1], *o = r->base + at[2];
    char *dout = r->base + at[3], *saved = r->base + at[5], *w = r->base + at[6];
    const size_t koff = (ly->packed ? (size_t)cdim : rows * ld) * es;
    int rc = fill(qkv, nq, dt, 1, r->ctx);
    if (!rc) rc = fill(dout, no, dt, 2, r->ctx);
    if (rc) return rc;
    if (backend_supports(G, BK_OP_ctx_set_workspace, BK_DTYPE_F32))
        G->ctx_set_workspace(r->ctx, w, ws);
    double tf = 0, tb = 0;
    if (tiled) {
        TIME_IT(tf, warmup, runs,
                G->attn_fwd(o, (float *)saved, qkv, qkv + koff, qkv + 2 * koff, w, &s, r->ctx));
        TIME_IT(tb, warmup, runs,
                G->attn_bwd(dqkv, dqkv + koff, dqkv + 2 * koff, dout, qkv, qkv + koff,
                            qkv + 2 * koff, o, (float *)saved, w, &s, r->ctx));
    } else {
        TIME_IT(tf, warmup, runs,
                G->attn_plain_fwd(o, (float *)saved, qkv, qkv + koff, qkv + 2 * koff, w, &s,
                                  r->ctx));
        TIME_IT(tb, warmup, runs,
                G->attn_plain_bwd(dqkv, dqkv + koff, dqkv + 2 * koff, dout, qkv, qkv + koff,
                                  qkv + 2 * koff, (float *)saved, w, &s, r->ctx));
    }
    if (backend_supports(G, BK_OP_ctx_set_workspace, BK_DTYPE_F32))
        G->ctx_set_workspace(r->ctx, NULL, 0);
    const double f = 4.0 * ly->n * ly->heads * (double)ly->l * ly->l * ly->d;
    printf("%-6s %-4s n%-4d l%-5d h%d d%-4d %-10s %-4s fwd %9.3f ms  bwd %9.3f ms  bwd/fwd %5.2f"
           "  fwd %7.2f TFLOP/s  bwd %7.2f TFLOP/s%s\n",
           ly->model, ly->name, ly->n, ly->l, ly->heads, ly->d, path_name[path],
           dt == BK_DTYPE_F32 ? "f32" : dt == BK_DTYPE_BF16 ? "bf16" : "f16", tf * 1e3, tb * 1e3,
           tb / tf, f / tf * 1e-12, 2.5 * f / tb * 1e-12, ly->plain == !tiled ? "  (model's form)" : "");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    const char *device = "cuda:0", *dtype = "all", *model = "all";
    int runs = 10, warmup = 3, batch = 0, quick = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) device = argv[++i];
        else if (!strcmp(a, "--runs") && v) runs = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--dtype") && v) dtype = argv[++i];
        else if (!strcmp(a, "--model") && v) model = argv[++i];
        else if (!strcmp(a, "--batch") && v) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: attn_bench [--device cuda:N] [--runs N] [--warmup N] "
                            "[--dtype f32|bf16|f16|all] [--model ddpm|seed|all] [--batch N] "
                            "[--quick]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64) runs = runs < 1 ? 1 : 64;
    if (quick) runs = 1, warmup = 0;
    char err[512] = "";
    if (backend_load("cuda", &G, err, sizeof err) != BK_OK) {
        printf("unavailable %s\n", err);
        return 3;
    }
    const int dev = strncmp(device, "cuda:", 5) ? 0 : atoi(device + 5);
    if (backend_supports(G, BK_OP_device_select, BK_DTYPE_F32) &&
        G->device_select(dev, err, sizeof err) != BK_OK) {
        printf("unavailable %s\n", err);
        return 3;
    }
    struct bk_device_mem dm = {0};
    if (backend_supports(G, BK_OP_device_mem, BK_DTYPE_F32)) G->device_mem(dev, &dm);
    printf("device %s (sm_%d%d), %zu MiB\n", dm.name, dm.cc_major, dm.cc_minor, dm.total >> 20);
    /* the models' attention layers (ddpm-cifar10: diffusers' one head of 256 at 16x16, q, k, v
     * apart; seed-64: four heads, packed qkv, at 32x32 down to 8x8 and up to 64x64) */
    const int b_ddpm = batch ? batch : 128;
    struct layer all[] = {
        {"ddpm", "mid", b_ddpm, 256, 1, 256, 0, 1},
        {"seed", "sa1", 8, 1024, 4, 32, 1, 0},
        {"seed", "sa2", 8, 256, 4, 64, 1, 1},
        {"seed", "sa3", 8, 64, 4, 64, 1, 1},
        {"seed", "sa4", 8, 256, 4, 32, 1, 0},
        {"seed", "sa5", 8, 1024, 4, 16, 1, 0},
        {"seed", "sa6", 8, 4096, 4, 16, 1, 0},
        {"seed", "sa1", 64, 1024, 4, 32, 1, 0},
        {"seed", "sa2", 64, 256, 4, 64, 1, 1},
        {"seed", "sa6", 64, 4096, 4, 16, 1, 0},
    };
    struct layer tiny[] = {
        {"quick", "a", 2, 40, 2, 32, 1, 1},
        {"quick", "b", 1, 70, 1, 64, 0, 0},
    };
    struct layer *ls = quick ? tiny : all;
    const int nl = quick ? 2 : (int)(sizeof all / sizeof all[0]);
    struct run r[2] = {{0}}; /* parity, fast */
    for (int m = 0; m < 2; m++) {
        if (backend_supports(G, BK_OP_set_parity, BK_DTYPE_F32)) G->set_parity(!m);
        if (G->ctx_init(&r[m].ctx, 2) != BK_OK) {
            printf("unavailable ctx_init\n");
            return 3;
        }
    }
    if (backend_supports(G, BK_OP_set_parity, BK_DTYPE_F32)) G->set_parity(1);
    size_t want = quick ? (size_t)64 << 20 : dm.free > ((size_t)6 << 30) ? dm.free - ((size_t)4 << 30)
                                                                      : dm.free / 2;
    if (G->mem_alloc((void **)&r[0].base, want, r[0].ctx) != BK_OK) {
        printf("unavailable cannot reserve %zu MiB\n", want >> 20);
        return 3;
    }
    r[0].bytes = r[1].bytes = want;
    r[1].base = r[0].base;
    for (int i = 0; i < nl; i++) {
        const struct layer *ly = &ls[i];
        if (strcmp(model, "all") && strcmp(model, ly->model) && !quick) continue;
        if (!quick && batch && strcmp(ly->model, "ddpm")) {
            struct layer *w = &ls[i];
            if (w->n != 8) continue; /* --batch N: the seed layers at N */
            w->n = batch;
        }
        for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) {
            const char *dn = dt == BK_DTYPE_F32 ? "f32" : dt == BK_DTYPE_BF16 ? "bf16" : "f16";
            if (strcmp(dtype, "all") ? strcmp(dtype, dn) : dt == BK_DTYPE_F16) continue;
            for (int p = 0; p < P_COUNT; p++) {
                if (p == P_TILED_FAST && dt == BK_DTYPE_F32 && !quick) continue;
                int rc = bench_one(ly, p, dt, &r[p == P_TILED_FAST], warmup, runs);
                if (rc) {
                    printf("%-6s %-4s %s %s: failed (%d)\n", ly->model, ly->name, path_name[p],
                           dn, rc);
                    return 1;
                }
            }
        }
    }
    G->mem_free(r[0].base, r[0].ctx);
    G->ctx_free(r[1].ctx);
    G->ctx_free(r[0].ctx);
    return 0;
}
