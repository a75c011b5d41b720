/* test_grads_arena.c - gradients in the arena (plan_opts.one_pass): three training steps with
 * each gradient an arena storage from its first writer to the step's end (zeroed by the
 * executor before that op, over activations the backward has freed) leave weights, EMA, moments
 * and gradients bit-identical to the persistent gradient block's, with the same losses and
 * gradient norms, on the fmnist-tiny model (dropout on) and on the seed preset at 16x16, in fp32
 * and bf16, under canary gaps and poisoned dead storages; the plan has no gradient block, and
 * is smaller; the exact lower bound (plan_persistent_bytes) counts no gradients; such a plan
 * refuses a second, accumulating forward/backward; offload and a backend with a fused device
 * optimizer step (BK_OP_optim_step) keep the block.
 */
#include "test_accum.h"

static struct optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.01f, .clip = 1.0f, .ema_decay = 0.9f};

static void equivalence(enum unet_preset preset, int batch, int precision)
{
    char name[40];
    snprintf(name, sizeof name, "%s%s", preset == UNET_DDPM ? "fmnist-tiny" : "seed-16",
             precision == STRATEGY_PRECISION_BF16 ? " bf16" : "");
    struct unet_config c;
    accum_config(&c, preset);
    struct plan_opts block = accum_half_opts(precision), arena;
    block.guard_bytes = 64;
    arena = block;
    arena.one_pass = 1;
    const struct exec_opts eo = {.threads = 2, .check_guards = 1, .poison = 1};
    struct accum ref, a;
    int ok = accum_init(&ref, &c, batch, batch, &block, &eo) == 0 &&
             accum_init(&a, &c, batch, batch, &arena, &eo) == 0;
    CHECK(ok, "%s: building", name);
    if (!ok) return;
    const size_t P = ref.p.params_bytes;
    CHECK(!ref.p.grads_in_arena && ref.p.grads_bytes == P && a.p.grads_in_arena &&
              a.p.grads_bytes == 0 && a.p.parts[PLAN_PART_GRADS].device == 0,
          "%s: the gradients' layout (block %d: %zu bytes, arena %d: %zu bytes)", name,
          ref.p.grads_in_arena, ref.p.grads_bytes, a.p.grads_in_arena, a.p.grads_bytes);
    size_t sum = 0;
    for (int k = 0; k < PLAN_PART_COUNT; k++) sum += a.p.parts[k].device;
    CHECK(sum == a.p.total_bytes, "%s: device parts sum to %zu of %zu", name, sum,
          a.p.total_bytes);
    CHECK(plan_persistent_bytes(&a.g, backend_cpu(), &arena) == a.p.inputs_off + a.p.inputs_bytes,
          "%s: the persistent bytes are not the one-pass plan's", name);
    /* every gradient an arena tensor, each in its own bytes for the rest of the step */
    int placed = 1;
    for (int t = 0; t < a.g.n_tensors; t++)
        if (a.g.tensors[t]->kind == TENSOR_GRAD)
            placed &= a.p.storage[t] >= 0 && a.p.st[a.p.storage[t]].last == a.p.n_run_ops - 1 &&
                      a.p.offset[t] >= (int64_t)a.p.arena_off;
    CHECK(placed, "%s: a gradient outside the arena or dying before the step's end", name);
    float lr = 0, la = 0, nr = 0, na = 0;
    for (int s = 0; s < 3 && ok; s++) {
        ok = accum_step(&ref, &lr) == 0 && accum_step(&a, &la) == 0;
        CHECK(ok, "%s: step %d: %s", name, s, exec_last_error(a.e)->msg);
        CHECK(memcmp(&la, &lr, sizeof la) == 0, "%s: step %d loss %.9g vs %.9g", name, s, la, lr);
        ok = ok && exec_optimizer_step(ref.e, &oc, s + 1, oc.lr, &nr) == 0 &&
             exec_optimizer_step(a.e, &oc, s + 1, oc.lr, &na) == 0;
        CHECK(ok, "%s: optimizer step %d: %s", name, s, exec_last_error(a.e)->msg);
        CHECK(memcmp(&na, &nr, sizeof na) == 0, "%s: step %d gradient norm %.9g vs %.9g", name,
              s, na, nr);
    }
    size_t n_ref, n_a;
    float *sr = accum_state(&ref, &n_ref), *sa = accum_state(&a, &n_a);
    size_t diff = 0;
    for (size_t k = 0; k < n_ref && k < n_a; k++) diff += memcmp(&sr[k], &sa[k], 4) != 0;
    printf("%s batch %d: device %zu bytes with the gradient block, %zu with the gradients in "
           "the arena (-%zu; gradients %zu); %zu of %zu state floats differ, loss %.9g, norm "
           "%.9g\n",
           name, batch, ref.p.total_bytes, a.p.total_bytes, ref.p.total_bytes - a.p.total_bytes,
           P, diff, n_ref, la, na);
    CHECK(n_a == n_ref && diff == 0, "%s: %zu state floats differ", name, diff);
    CHECK(a.p.total_bytes < ref.p.total_bytes, "%s: the one-pass plan is not smaller", name);
    free(sr);
    free(sa);
    CHECK(exec_forward_backward(a.e, 0, 1.0f, 11, 6, 0, NULL) == EXEC_ERR_ARG,
          "%s: a one-pass plan accumulated a second forward/backward", name);
    accum_free(&ref);
    accum_free(&a);
}

static int fake_optim_step(float *w, float *m, float *v, float *ema, const float *g, size_t count,
                           const struct bk_optim *o, bk_ctx *ctx)
{
    (void)w, (void)m, (void)v, (void)ema, (void)g, (void)count, (void)o, (void)ctx;
    return BK_ERR_INVALID;
}

/* the block where the arena cannot serve: offload's copies and a device's fused step read it */
static void keeps_block(void)
{
    struct unet_config c;
    accum_config(&c, UNET_DDPM);
    struct plan_opts po = accum_half_opts(0);
    po.one_pass = 1;
    po.strategy.offload = 1;
    struct accum a;
    int ok = accum_plan(&a, backend_cpu(), &c, 2, 2, &po) == 0;
    CHECK(ok && !a.p.grads_in_arena && a.p.grads_bytes == a.p.params_bytes,
          "offload: the gradients left the block");
    accum_free(&a);
    struct backend dev = *backend_cpu();
    dev.optim_step = fake_optim_step;
    po.strategy.offload = 0;
    ok = accum_plan(&a, &dev, &c, 2, 2, &po) == 0;
    CHECK(ok && !a.p.grads_in_arena && a.p.grads_bytes == a.p.params_bytes,
          "a fused device optimizer: the gradients left the block");
    CHECK(plan_persistent_bytes(&a.g, &dev, &po) == a.p.inputs_off + a.p.inputs_bytes,
          "a fused device optimizer: the persistent bytes are not the plan's");
    accum_free(&a);
}

int main(void)
{
    equivalence(UNET_DDPM, 4, 0);
    equivalence(UNET_DDPM, 4, STRATEGY_PRECISION_BF16);
    equivalence(UNET_SEED, 2, 0);
    equivalence(UNET_SEED, 2, STRATEGY_PRECISION_BF16);
    keeps_block();
    return tu_finish("test_grads_arena");
}
