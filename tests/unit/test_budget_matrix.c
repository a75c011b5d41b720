/* test_budget_matrix.c - the budget matrix: presets x batches x budgets (the plain plan's bytes
 * plus a MiB, exactly them, one byte less, 1 MiB), each through the planner's search
 * (train_search) and, where it says a plan fits, 3 real training steps under the budget the CPU
 * backend enforces: the step runs, the backend's measured high-water mark equals the plan's
 * device bytes, and no allocation beyond the budget is ever granted (a recording backend wraps
 * the CPU one). Where nothing fits, the search names a smallest budget above the one given, and
 * the plain plan forced over the budget fails in exec_init with EXEC_ERR_BUDGET before a byte is
 * allocated. A checkpoint of the first run records the plan (strategy, device bytes).
 */
#define _DEFAULT_SOURCE /* mkstemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "exec.h"
#include "init.h"
#include "philox.h"
#include "spec.h"
#include "test_util.h"
#include "train.h"

/* ---- a recording backend: the CPU one, with every mem_alloc request and grant seen ---- */
static struct backend rec_bk;
static size_t rec_max_granted, rec_max_refused;
static long rec_calls;

static int rec_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    int rc = backend_cpu()->mem_alloc(out, bytes, ctx);
    rec_calls++;
    if (rc == BK_OK && bytes > rec_max_granted) rec_max_granted = bytes;
    if (rc != BK_OK && bytes > rec_max_refused) rec_max_refused = bytes;
    return rc;
}

static void small_spec(struct train_spec *s, enum unet_preset preset, int batch)
{
    spec_defaults(s);
    unet_config_default(&s->model, preset);
    s->model.image_size = 16;
    if (preset == UNET_DDPM) {
        s->model.in_channels = s->model.out_channels = 1;
        s->model.n_levels = 2;
        s->model.channels[0] = 16;
        s->model.channels[1] = 32;
        s->model.layers_per_block = 1;
        s->model.n_attn = 1;
        s->model.attn_res[0] = 8;
        s->model.groups = 8;
        s->model.attn_head_dim = 8;
    } else {
        s->model.base = 8;
        s->model.time_dim = 32;
    }
    s->batch = batch;
    s->samples = 4;
}

/* a checkpoint of e records the plan it ran: strategy and device bytes in its metadata */
static void check_checkpoint_plan(struct exec *e, const struct graph *g,
                                  const struct train_spec *s, const struct plan *p)
{
    char path[] = "/tmp/ddpmd-budget-ckpt-XXXXXX", err[512], want[96];
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    struct safetensors *st = NULL;
    CHECK(checkpoint_save(path, e, g, s, NULL, 3, err, sizeof err) == 0 &&
              checkpoint_open(&st, path, NULL, NULL, err, sizeof err) == 0,
          "checkpoint: %s", err);
    const char *meta = st ? safetensors_meta(st, "plan") : NULL;
    snprintf(want, sizeof want, "\"device_bytes\":%zu,", p->total_bytes);
    CHECK(meta && strstr(meta, "\"precision\":\"f32\"") && strstr(meta, want),
          "the checkpoint's plan metadata: %s (want %s)", meta ? meta : "(none)", want);
    safetensors_free(st);
    unlink(path);
}

/* 3 steps of the job's plan under the budget; 0 when they ran */
static int run_steps(const struct train_spec *s, size_t budget, size_t *high_water,
                     int checkpoint)
{
    struct graph g, sg;
    struct unet_io io, sio;
    struct plan p, sp;
    int target, rc = -1;
    char err[512];
    struct exec *e = NULL;
    float *h = NULL;
    if (train_plan_job(s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err)) {
        fprintf(stderr, "train_plan_job: %s\n", err);
        goto out;
    }
    struct exec_error xe = {0};
    struct exec_opts eo = {.threads = 2, .budget = budget, .init_error = &xe};
    if (exec_init(&e, &g, &p, &rec_bk, &eo)) {
        fprintf(stderr, "exec_init: %s\n", xe.msg);
        goto out;
    }
    size_t maxn = 0;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->numel > maxn) maxn = g.tensors[i]->numel;
    if (!(h = malloc(maxn * sizeof *h))) goto out;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(g.tensors[i], 3, h);
            exec_upload(e, i, h);
        }
    exec_reset_state(e);
    struct optim_config oc = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .clip = 1.0f, .ema_decay = 0.99f, .total_steps = 3};
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < g.n_tensors; i++) {
            const struct tensor *t = g.tensors[i];
            if (t->kind != TENSOR_INPUT) continue;
            for (size_t k = 0; k < t->numel; k++)
                h[k] = i == io.t ? (float)(k * 97 % 1000)
                                 : philox_normal(5, 1, (uint64_t)step, (uint32_t)i, 0, (uint32_t)k);
            exec_upload(e, i, h);
        }
        float loss = 0, norm = 0;
        if (exec_forward_backward(e, 1, 1.0f, 5, (uint64_t)step, 0, &loss) ||
            exec_optimizer_step(e, &oc, step + 1, 1e-4f, &norm) || !(loss == loss)) {
            fprintf(stderr, "step %d: %s\n", step, exec_last_error(e)->msg);
            goto out;
        }
    }
    *high_water = exec_device_high_water(e);
    if (checkpoint) check_checkpoint_plan(e, &g, s, &p);
    rc = 0;
out:
    free(h);
    exec_free(e);
    plan_free(&sp);
    graph_free(&sg);
    plan_free(&p);
    graph_free(&g);
    return rc;
}

/* the plain plan exec_init'ed under a budget below it: EXEC_ERR_BUDGET, nothing granted */
static void forced_over(const struct train_spec *s0, size_t budget, const char *name)
{
    struct train_spec s = *s0;
    s.vram_budget = 0; /* plan it without the search's refusal */
    struct graph g, sg;
    struct unet_io io, sio;
    struct plan p, sp;
    int target;
    char err[512];
    struct exec *e = NULL;
    if (train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == 0) {
        struct exec_error xe = {0};
        struct exec_opts eo = {.threads = 2, .budget = budget, .init_error = &xe};
        size_t granted = rec_max_granted;
        rec_max_granted = 0;
        int rc = exec_init(&e, &g, &p, &rec_bk, &eo);
        CHECK(rc == EXEC_ERR_BUDGET && xe.status == EXEC_ERR_BUDGET &&
                  xe.bk_status == BK_ERR_NOMEM && strstr(xe.msg, "cannot reserve"),
              "%s: a plan of %zu bytes forced under a budget of %zu: status %d (%s)", name,
              p.total_bytes, budget, rc, xe.msg);
        CHECK(rec_max_granted == 0, "%s: %zu bytes granted over the budget", name,
              rec_max_granted);
        rec_max_granted = granted;
        exec_free(e);
    } else {
        CHECK(0, "%s: train_plan_job: %s", name, err);
    }
    plan_free(&sp);
    graph_free(&sg);
    plan_free(&p);
    graph_free(&g);
}

int main(void)
{
    rec_bk = *backend_cpu();
    rec_bk.mem_alloc = rec_alloc;
    static const enum unet_preset presets[] = {UNET_SEED, UNET_DDPM};
    static const int batches[] = {1, 3};
    int ran = 0, refused = 0;
    for (size_t ip = 0; ip < 2; ip++)
        for (size_t ib = 0; ib < 2; ib++) {
            struct train_spec s;
            small_spec(&s, presets[ip], batches[ib]);
            struct graph g, sg;
            struct unet_io io, sio;
            int target;
            struct plan p, sp;
            char err[512];
            int bad = train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err,
                                     sizeof err);
            size_t plain = p.total_bytes;
            plan_free(&sp);
            graph_free(&sg);
            plan_free(&p);
            graph_free(&g);
            if (bad) {
                CHECK(0, "train_plan_job: %s", err);
                continue;
            }
            const size_t budgets[] = {plain + (1 << 20), plain, plain - 1, 1 << 20};
            for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
                char name[96];
                snprintf(name, sizeof name, "%s b%d budget %zu", ip ? "ddpm" : "seed",
                         batches[ib], budgets[k]);
                s.vram_budget = (int64_t)budgets[k];
                struct planner_result r;
                int rc = train_search(&s, NULL, 0, &r, err, sizeof err);
                if (rc == 0) {
                    const struct planner_candidate *c = &r.cand[r.chosen];
                    CHECK(c->device_bytes <= budgets[k], "%s: chosen %zu bytes over the budget",
                          name, c->device_bytes);
                    size_t hw = 0;
                    rec_max_granted = 0;
                    CHECK(run_steps(&s, budgets[k], &hw, ran == 0) == 0, "%s: 3 steps did not run", name);
                    CHECK(hw == c->device_bytes, "%s: device high-water %zu, planned %zu", name,
                          hw, c->device_bytes);
                    CHECK(rec_max_granted <= budgets[k], "%s: %zu bytes granted", name,
                          rec_max_granted);
                    ran++;
                } else {
                    CHECK(r.smallest >= 0 && r.cand[r.smallest].device_bytes > budgets[k] &&
                              strstr(err, "no plan fits"),
                          "%s: refused without naming a larger smallest budget: %s", name, err);
                    forced_over(&s, budgets[k], name);
                    refused++;
                }
                planner_result_free(&r);
            }
        }
    /* the matrix must exercise both sides: plans that fit and budgets nothing fits */
    CHECK(ran >= 8 && refused >= 4, "%d runs, %d refusals", ran, refused);
    printf("budget matrix: %d cases ran 3 steps under their budget, %d refused\n", ran, refused);
    return tu_finish("test_budget_matrix");
}
