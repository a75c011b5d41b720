/* test_offload.c - offload (strategy.offload = 1): two training steps with the AdamW moments, the
 * EMA and an fp32 master copy in host memory (the optimizer on the host, the weights copied
 * back) leave weights, EMA, moments and gradients bit-identical to the plain step's, on the
 * fmnist-tiny model (dropout on) and on the seed preset at 16x16, in fp32 and in bf16 and f16
 * against the same precision without offload; the plan's device bytes fall by
 * exactly the moments' and EMA's bytes, which the host column holds (with the master and the
 * gradients' copy), and the backend's one allocation is that much smaller (a counting backend);
 * a sample grid's nested plan over the host's EMA (exec_nested_sync) gives the same images'
 * model outputs as the plain nested plan reading the EMA in place.
 */
#include "test_accum.h"

static size_t last_alloc;
static int (*real_alloc)(void **, size_t, bk_ctx *);
static int counting_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    last_alloc = bytes;
    return real_alloc(out, bytes, ctx);
}

static struct optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.01f, .clip = 1.0f, .ema_decay = 0.9f};

/* the model's output on a fixed input through a nested EMA plan of a (synced first) */
static float *nested_out(struct accum *a, const struct unet_config *c, size_t *n)
{
    struct graph g;
    struct unet_io io;
    struct plan sp;
    struct exec *se = NULL;
    graph_init(&g);
    unet_build(&g, c, 1, &io);
    float *out = NULL;
    int ok = plan_make_nested(&sp, &g, backend_cpu(), NULL, &a->p, &a->g, PLAN_WEIGHTS_EMA) == 0;
    /* the reservation was made before: the sub-plan must fit it (it does: a batch of 1) */
    ok = ok && exec_init_nested(&se, &g, &sp, a->e, NULL) == 0 && exec_nested_sync(se) == 0;
    CHECK(ok && sp.weights_from_host == a->p.offload, "the nested EMA plan");
    if (ok) {
        size_t nx = g.tensors[io.x]->numel;
        float *x = malloc(nx * sizeof *x), t = 500.0f;
        for (size_t k = 0; k < nx; k++) x[k] = philox_normal(5, PHILOX_TAG_NOISE, 0, 0, 0, (uint32_t)k);
        out = malloc(g.tensors[io.out]->numel * sizeof *out);
        *n = g.tensors[io.out]->numel;
        ok = exec_upload(se, io.x, x) == 0 && exec_upload(se, io.t, &t) == 0 &&
             exec_forward(se, NULL) == 0 && exec_download(se, io.out, out) == 0;
        CHECK(ok, "the nested run");
        free(x);
    }
    exec_free(se);
    plan_free(&sp);
    graph_free(&g);
    return out;
}

static void equivalence(enum unet_preset preset, int batch, int precision)
{
    char name[40];
    snprintf(name, sizeof name, "%s%s", preset == UNET_DDPM ? "fmnist-tiny" : "seed-16",
             precision == STRATEGY_PRECISION_BF16  ? " bf16"
             : precision == STRATEGY_PRECISION_F16 ? " f16"
                                                   : "");
    struct unet_config c;
    accum_config(&c, preset);
    struct plan_opts plain = accum_half_opts(precision), off = plain;
    off.strategy.offload = 1;
    struct accum ref, a;
    int ok = accum_init(&ref, &c, batch, batch, &plain, NULL) == 0 &&
             accum_init(&a, &c, batch, batch, &off, NULL) == 0;
    CHECK(ok, "%s: building", name);
    if (!ok) return;
    float lr = 0, la = 0;
    for (int s = 0; s < 2; s++) {
        CHECK(accum_step(&ref, &lr) == 0 && accum_step(&a, &la) == 0, "%s: step %d", name, s);
        CHECK(exec_optimizer_step(ref.e, &oc, s + 1, oc.lr, NULL) == 0 &&
                  exec_optimizer_step(a.e, &oc, s + 1, oc.lr, NULL) == 0,
              "%s: optimizer step %d: %s", name, s, exec_last_error(a.e)->msg);
    }
    size_t nr, na;
    float *sr = accum_state(&ref, &nr), *sa = accum_state(&a, &na);
    size_t diff = 0;
    for (size_t k = 0; k < nr && k < na; k++) diff += memcmp(&sr[k], &sa[k], 4) != 0;
    const size_t P = ref.p.params_bytes;
    printf("%s batch %d offload: device %zu bytes (plain %zu, offloaded %zu), host %zu; %zu of "
           "%zu state floats differ, loss %.9g vs %.9g\n",
           name, batch, a.p.total_bytes, ref.p.total_bytes, ref.p.adam_bytes + ref.p.ema_bytes,
           a.p.host_bytes, diff, nr, la, lr);
    CHECK(na == nr && diff == 0, "%s offload: %zu state floats differ", name, diff);
    CHECK(memcmp(&la, &lr, sizeof la) == 0, "%s offload: loss %.9g vs %.9g", name, la, lr);
    CHECK(a.p.total_bytes + ref.p.adam_bytes + ref.p.ema_bytes == ref.p.total_bytes &&
              ref.p.adam_bytes == 2 * P && ref.p.ema_bytes == P,
          "%s offload: device %zu + offloaded %zu != plain %zu", name, a.p.total_bytes,
          ref.p.adam_bytes + ref.p.ema_bytes, ref.p.total_bytes);
    const struct plan_part_bytes *b = a.p.parts;
    CHECK(a.p.host_bytes == 5 * P && b[PLAN_PART_OPTIMIZER].host == 2 * P &&
              b[PLAN_PART_OPTIMIZER].device == 0 && b[PLAN_PART_EMA].host == P &&
              b[PLAN_PART_EMA].device == 0 && b[PLAN_PART_MASTER].host == P &&
              b[PLAN_PART_GRADS].host == P && b[PLAN_PART_GRADS].device == P,
          "%s offload: host %zu bytes, parts wrong", name, a.p.host_bytes);
    size_t sum = 0;
    for (int k = 0; k < PLAN_PART_COUNT; k++) sum += b[k].device;
    CHECK(sum == a.p.total_bytes, "%s offload: device parts sum to %zu of %zu", name, sum,
          a.p.total_bytes);

    /* the backend's one allocation: that much smaller */
    struct backend wb = *backend_cpu();
    real_alloc = wb.mem_alloc;
    wb.mem_alloc = counting_alloc;
    struct exec *e1 = NULL, *e2 = NULL;
    struct exec_opts eo = {.threads = 2};
    size_t plain_alloc = 0, off_alloc = 0;
    if (exec_init(&e1, &ref.g, &ref.p, &wb, &eo) == 0) plain_alloc = last_alloc;
    if (exec_init(&e2, &a.g, &a.p, &wb, &eo) == 0) off_alloc = last_alloc;
    CHECK(plain_alloc == ref.p.total_bytes && off_alloc == a.p.total_bytes &&
              plain_alloc - off_alloc == 3 * P,
          "%s: allocations %zu and %zu, not %zu apart", name, plain_alloc, off_alloc, 3 * P);
    exec_free(e2);
    exec_free(e1);

    /* the sample grid's plan over the host's EMA */
    size_t n1 = 0, n2 = 0;
    float *o1 = nested_out(&ref, &c, &n1), *o2 = nested_out(&a, &c, &n2);
    CHECK(o1 && o2 && n1 == n2 && memcmp(o1, o2, n1 * sizeof *o1) == 0,
          "%s: the nested EMA plan's outputs differ", name);
    free(o1);
    free(o2);
    free(sr);
    free(sa);
    accum_free(&a);
    accum_free(&ref);
}

int main(void)
{
    equivalence(UNET_DDPM, 2, STRATEGY_PRECISION_F32);
    equivalence(UNET_SEED, 3, STRATEGY_PRECISION_F32);
    /* 16-bit: the working copy refreshed from the weights the host optimizer sent back */
    equivalence(UNET_DDPM, 2, STRATEGY_PRECISION_BF16);
    equivalence(UNET_SEED, 3, STRATEGY_PRECISION_F16);
    return tu_finish("test_offload");
}
