/* test_backend_ops.c - the op table (kernels/ops.def): backend_supports on the CPU's table and on
 * copies of it; a backend that lacks an entry a graph needs: exec_init refuses the plan with the
 * entry, its dtype and the op named (plan_make never calls the missing entry), where a NULL call
 * at run time would crash; and each op runs only the entries exec_op_needs names for it.
 */
#include <stdlib.h>
#include <string.h>

#include "classifier.h"
#include "exec.h"
#include "memplan.h"
#include "test_unet_util.h"
#include "test_util.h"
#include "unet.h"

/* the CPU's table with bf16 convolutions and linears claimed, or none */
static unsigned conv_linear_half(int dtype)
{
    return dtype == BK_DTYPE_BF16 ? BK_HALF_CONV | BK_HALF_LINEAR : 0;
}
static unsigned no_half(int dtype)
{
    (void)dtype;
    return 0;
}

static void supports(void)
{
    const struct backend *cpu = backend_cpu();
    CHECK(backend_supports(cpu, BK_OP_conv2d_fwd, BK_DTYPE_F32), "cpu: conv2d_fwd on f32");
    CHECK(backend_supports(cpu, BK_OP_mse_fwd, BK_DTYPE_F32), "cpu: mse_fwd on f32");
    CHECK(backend_supports(cpu, BK_OP_adamw_ema_step, BK_DTYPE_F32), "cpu: adamw_ema_step");
    CHECK(!backend_supports(cpu, BK_OP_device_count, BK_DTYPE_F32), "cpu: no device_count");
    CHECK(!backend_supports(cpu, BK_OP_step_set, BK_DTYPE_F32), "cpu: no step_set");
    CHECK(!backend_supports(cpu, BK_OP_graph_begin, BK_DTYPE_F32), "cpu: no graph_begin");
    CHECK(backend_supports(cpu, BK_OP_TYPED_silu_fwd, BK_DTYPE_F32) &&
              backend_supports(cpu, BK_OP_TYPED_groupnorm_fwd, BK_DTYPE_F32),
          "cpu: typed kernels");
    CHECK(backend_supports(cpu, BK_OP_TYPED_silu_fwd, BK_DTYPE_BF16) ==
                  ((cpu->half_kernels(BK_DTYPE_BF16) & BK_HALF_ELTWISE) != 0) &&
              backend_supports(cpu, BK_OP_TYPED_groupnorm_fwd, BK_DTYPE_BF16) ==
                  ((cpu->half_kernels(BK_DTYPE_BF16) & BK_HALF_NORM) != 0),
          "cpu: bf16 memory-bound kernels as half_kernels says");
    CHECK(backend_supports(cpu, BK_OP_convert, BK_DTYPE_BF16) &&
              backend_supports(cpu, BK_OP_convert, BK_DTYPE_F16),
          "cpu: convert on any dtype");
    CHECK(!backend_supports(cpu, BK_OP_mse_fwd, BK_DTYPE_BF16) &&
              !backend_supports(cpu, BK_OP_silu_fwd, BK_DTYPE_F16),
          "an fp32-only entry on a 16-bit dtype");
    CHECK(backend_supports(cpu, BK_OP_conv2d_fwd, BK_DTYPE_BF16) ==
              ((cpu->half_kernels(BK_DTYPE_BF16) & BK_HALF_CONV) != 0),
          "cpu: bf16 convolutions as half_kernels says");
    CHECK(!backend_supports(cpu, BK_OP_conv2d_fwd, 7), "a dtype out of range");
    CHECK(!backend_supports(NULL, BK_OP_conv2d_fwd, BK_DTYPE_F32) &&
              !backend_supports(cpu, BK_OP_COUNT, BK_DTYPE_F32) &&
              !backend_supports(cpu, (enum bk_op)-1, BK_DTYPE_F32),
          "no backend, an op out of range");

    struct backend t = *cpu;
    t.half_kernels = conv_linear_half;
    CHECK(backend_supports(&t, BK_OP_conv2d_bwd_filter, BK_DTYPE_BF16) &&
              backend_supports(&t, BK_OP_linear_bwd, BK_DTYPE_BF16) &&
              backend_supports(&t, BK_OP_conv2d_ws_bytes, BK_DTYPE_BF16) &&
              !backend_supports(&t, BK_OP_conv2d_fwd, BK_DTYPE_F16) &&
              !backend_supports(&t, BK_OP_attn_fwd, BK_DTYPE_BF16),
          "half_kernels' bits decide the 16-bit typed entries");
    t.half_kernels = NULL;
    CHECK(!backend_supports(&t, BK_OP_conv2d_fwd, BK_DTYPE_BF16) &&
              backend_supports(&t, BK_OP_conv2d_fwd, BK_DTYPE_F32),
          "without half_kernels: fp32 only");
    t.conv2d_fwd = NULL;
    CHECK(!backend_supports(&t, BK_OP_conv2d_fwd, BK_DTYPE_F32), "a NULL entry");

    CHECK(!strcmp(backend_op_name(BK_OP_conv2d_bwd_filter), "conv2d_bwd_filter") &&
              !strcmp(backend_op_name(BK_OP_TYPED_groupnorm_fwd), "typed.groupnorm_fwd") &&
              !strcmp(backend_op_name(BK_OP_COUNT), "?"),
          "the entries' names");
    for (int op = 0; op < BK_OP_COUNT; op++)
        CHECK(backend_op_name((enum bk_op)op)[0] != '?', "entry %d has no name", op);
}

struct job {
    struct graph g;
    struct plan p;
    int x, target;
};

/* conv (3 -> 4 channels, 3x3) then SiLU then MSE, with its backward, in precision prec */
static int job_build(struct job *j, const struct backend *bk, int prec)
{
    memset(j, 0, sizeof *j);
    graph_init(&j->g);
    int xd[4] = {2, 3, 8, 8}, wd[4] = {4, 3, 3, 3}, bd[1] = {4}, yd[4] = {2, 4, 8, 8};
    j->x = graph_input(&j->g, "x", 4, xd);
    int w = graph_param(&j->g, "conv.weight", 4, wd);
    int b = graph_param(&j->g, "conv.bias", 1, bd);
    j->target = graph_input(&j->g, "target", 4, yd);
    int y = graph_silu(&j->g, graph_conv2d(&j->g, j->x, w, b, 1, 1, 1, 1, 1));
    int loss = graph_mse(&j->g, y, j->target);
    if (loss < 0 || graph_backward(&j->g, loss) || graph_set_precision(&j->g, prec)) return -1;
    struct plan_opts po = {0};
    po.strategy.precision = prec;
    return plan_make(&j->p, &j->g, bk, &po);
}

/* exec_init of j's plan on bk and one training step: the status, the error in *err */
static int step(struct job *j, const struct backend *bk, struct exec_error *err)
{
    struct exec *e = NULL;
    struct exec_opts eo = {.threads = 1, .init_error = err};
    memset(err, 0, sizeof *err);
    int rc = exec_init(&e, &j->g, &j->p, bk, &eo);
    if (rc) {
        CHECK(e == NULL, "a failed exec_init left an executor");
        return rc;
    }
    float xs[2 * 3 * 8 * 8], ts[2 * 4 * 8 * 8], loss = 0;
    tu_seed(5);
    tu_fill(xs, sizeof xs / sizeof *xs, 1.0);
    tu_fill(ts, sizeof ts / sizeof *ts, 1.0);
    rc = exec_upload(e, j->x, xs);
    if (!rc) rc = exec_upload(e, j->target, ts);
    if (!rc) rc = exec_forward_backward(e, 1, 1.0f, 1, 0, 0, &loss);
    const struct optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                    .clip = 1.0f, .ema_decay = 0.99f};
    if (!rc) rc = exec_optimizer_step(e, &oc, 1, oc.lr, NULL);
    *err = *exec_last_error(e);
    exec_free(e);
    return rc;
}

/* the CPU's table lacking one entry: refused by exec_init, naming it, its dtype and the op */
static void lacks(const char *what, struct backend *bk, const char *entry, const char *op)
{
    struct job j;
    struct exec_error err;
    int rc = job_build(&j, bk, STRATEGY_PRECISION_F32);
    CHECK(rc == PLAN_OK, "%s: plan_make: %d", what, rc);
    if (rc) return;
    rc = step(&j, bk, &err);
    char want[96];
    snprintf(want, sizeof want, "has no %s on f32, which op", entry);
    CHECK(rc == EXEC_ERR_ARG && err.status == EXEC_ERR_ARG && strstr(err.msg, want) &&
              strstr(err.msg, op) && strstr(err.msg, "cpu"),
          "%s: rc %d, \"%s\"", what, rc, err.msg);
    printf("%s: %s\n", what, err.msg);
    plan_free(&j.p);
    graph_free(&j.g);
}

static void refusals(void)
{
    struct job j;
    struct exec_error err;
    /* the whole table runs the step */
    CHECK(job_build(&j, backend_cpu(), STRATEGY_PRECISION_F32) == PLAN_OK, "plan");
    int rc = step(&j, backend_cpu(), &err);
    CHECK(rc == EXEC_OK, "the CPU's table: %d (%s)", rc, err.msg);
    plan_free(&j.p);
    graph_free(&j.g);

    struct backend t = *backend_cpu();
    t.conv2d_bwd_filter = NULL;
    lacks("no conv2d_bwd_filter", &t, "conv2d_bwd_filter", "(conv2d_bwd_filter)");
    t = *backend_cpu();
    t.conv2d_ws_bytes = NULL; /* plan_make asks it: it must not call it */
    lacks("no conv2d_ws_bytes", &t, "conv2d_ws_bytes", "(conv2d)");
    t = *backend_cpu();
    t.typed = NULL; /* the fp32 entry, which a backend without typed kernels runs */
    t.silu_bwd = NULL;
    lacks("no silu_bwd", &t, "silu_bwd", "(silu_bwd)");

    /* an inference plan needs no backward: the same table runs its forward */
    t = *backend_cpu();
    t.conv2d_bwd_filter = NULL;
    t.adamw_step = NULL;
    CHECK(job_build(&j, &t, STRATEGY_PRECISION_F32) == PLAN_OK, "plan");
    struct plan ip;
    struct plan_opts io = {.mode = PLAN_MODE_INFER};
    CHECK(plan_make(&ip, &j.g, &t, &io) == PLAN_OK, "inference plan");
    struct exec *e = NULL;
    struct exec_opts eo = {.threads = 1, .init_error = &err};
    rc = exec_init(&e, &j.g, &ip, &t, &eo);
    CHECK(rc == EXEC_OK, "an inference plan without the backward's entries: %d (%s)", rc,
          err.msg);
    exec_free(e);
    plan_free(&ip);
    /* ... but training needs the optimizer */
    t.conv2d_bwd_filter = backend_cpu()->conv2d_bwd_filter;
    rc = step(&j, &t, &err);
    CHECK(rc == EXEC_ERR_ARG && strstr(err.msg, "has no adamw_step for training"),
          "no adamw_step: rc %d, \"%s\"", rc, err.msg);
    plan_free(&j.p);
    graph_free(&j.g);

    /* a bf16 plan whose convolutions run on bf16 (half_kernels), executed on a table that runs
     * none: the entry is named with its dtype */
    struct backend p16 = *backend_cpu(), r16 = *backend_cpu();
    p16.half_kernels = conv_linear_half;
    r16.half_kernels = no_half;
    CHECK(job_build(&j, &p16, STRATEGY_PRECISION_BF16) == PLAN_OK, "plan bf16");
    rc = step(&j, &r16, &err);
    CHECK(rc == EXEC_ERR_ARG && strstr(err.msg, "has no conv2d_ws_bytes on bf16, which op"),
          "bf16 convolutions on a table without them: rc %d, \"%s\"", rc, err.msg);
    printf("bf16: %s\n", err.msg);
    plan_free(&j.p);
    graph_free(&j.g);
}

/* ---- each op calls only what exec_op_needs says (exec_init's check is that list) ---- */

/* the entries called since the last reset: every kernel entry of a recording table */
static unsigned char called[BK_OP_COUNT];

#define REC_RET_int return 0;
#define REC_RET_size_t return 0;
#define REC_RET_unsigned return 0;
#define REC_RET_void
#define BK_OP(ret, fn, args, half)                                                                 \
    static ret rec_##fn args                                                                       \
    {                                                                                              \
        called[BK_OP_##fn] = 1;                                                                    \
        REC_RET_##ret                                                                              \
    }
#define BK_TYPED_OP(ret, fn, args, half)                                                           \
    static ret rec_t_##fn args                                                                     \
    {                                                                                              \
        called[BK_OP_TYPED_##fn] = 1;                                                              \
        REC_RET_##ret                                                                              \
    }
#include "ops.def"

/* every 16-bit class */
static unsigned all_half(int dtype)
{
    (void)dtype;
    return BK_HALF_CONV | BK_HALF_LINEAR | BK_HALF_ATTN | BK_HALF_ATTN_PLAIN | BK_HALF_NORM |
           BK_HALF_ELTWISE;
}

/* The CPU's table with every entry it has but the context's, memory's and conversions' (which
 * hold the arena) replaced by a recorder that does nothing: typed (a recording struct bk_typed
 * in *t, every 16-bit class claimed), and without the optional fused group norms when plain */
static void rec_table(struct backend *b, struct bk_typed *t, int typed, int plain, int nhwc)
{
    static const enum bk_op kept[] = {
        BK_OP_ctx_init,     BK_OP_ctx_free,         BK_OP_mem_alloc,      BK_OP_mem_free,
        BK_OP_mem_upload,   BK_OP_mem_download,     BK_OP_mem_set_f32,    BK_OP_sync,
        BK_OP_convert,      BK_OP_ctx_set_workspace, BK_OP_ctx_set_budget, BK_OP_mem_high_water,
        BK_OP_half_kernels,
    };
    *b = *backend_cpu();
    unsigned char keep[BK_OP_COUNT] = {0};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) keep[kept[i]] = 1;
#define BK_OP(ret, fn, args, half)                                                                 \
    if (b->fn && !keep[BK_OP_##fn]) b->fn = rec_##fn;
#define BK_TYPED_OP(ret, fn, args, half) t->fn = rec_t_##fn;
#include "ops.def"
    b->typed = typed ? t : NULL;
    b->half_kernels = typed ? all_half : NULL;
    b->nhwc = nhwc;
    if (plain) {
        b->groupnorm_silu_fwd = NULL;
        b->groupnorm_bwd_ws = NULL;
        b->groupnorm_bwd_ws_bytes = NULL;
    }
}

/* Runs each op of g's training plan on bk alone (exec_time_op) and checks that the entries it
 * called are among those exec_op_needs names; the op types seen into seen[] */
static void needs_cover(const char *what, struct graph *g, const struct backend *bk, int prec,
                        unsigned char *seen)
{
    struct plan p;
    struct plan_opts po = {0};
    po.strategy.precision = prec;
    int rc = graph_set_precision(g, prec);
    if (!rc) rc = plan_make(&p, g, bk, &po);
    CHECK(rc == PLAN_OK, "%s: plan_make %d", what, rc);
    if (rc) return;
    struct exec *e = NULL;
    struct exec_error err = {0};
    struct exec_opts eo = {.threads = 1, .init_error = &err};
    rc = exec_init(&e, g, &p, bk, &eo);
    CHECK(rc == EXEC_OK, "%s: exec_init %d (%s)", what, rc, err.msg);
    int bad = 0;
    for (int k = 0; !rc && k < p.n_run_ops && bad < 5; k++) {
        struct exec_need need[EXEC_NEEDS_MAX];
        const int n = exec_op_needs(e, k, need);
        const int type = plan_op(&p, g, k)->type;
        double sec;
        memset(called, 0, sizeof called);
        int krc = exec_time_op(e, k, 1, &sec);
        CHECK(krc == EXEC_OK, "%s: op %d (%s) ran: %d", what, k, op_name(type), krc);
        if (n) seen[type] = 1;
        for (int op = 0; op < BK_OP_COUNT; op++) {
            if (!called[op]) continue;
            int listed = 0;
            for (int i = 0; i < n; i++) listed |= need[i].op == (enum bk_op)op;
            CHECK(listed, "%s: op %d (%s) called %s, which exec_op_needs does not name", what, k,
                  op_name(type), backend_op_name((enum bk_op)op));
            bad += !listed;
        }
    }
    exec_free(e);
    plan_free(&p);
}

static void needs(void)
{
    struct backend b;
    struct bk_typed t;
    unsigned char seen[OP_COUNT] = {0};
    for (int v = 0; v < 4; v++) {
        /* fp32 entries (with, then without the fused group norms), typed 16-bit, typed NHWC */
        const int typed = v >= 2, plain = v == 1, nhwc = v == 3;
        const int prec = typed ? STRATEGY_PRECISION_BF16 : STRATEGY_PRECISION_F32;
        rec_table(&b, &t, typed, plain, nhwc);
        char what[64];
        for (int tiled = 0; tiled < 2; tiled++) { /* the ddpm UNet: attention of either form */
            struct unet_config c;
            tu_small_unet(&c, UNET_DDPM);
            c.dropout = 0.1f;
            c.attn_tiled = tiled;
            struct graph g;
            struct unet_io io;
            graph_init(&g);
            CHECK(unet_build_training(&g, &c, 2, &io, NULL, NULL) == 0, "ddpm: %s", g.err);
            snprintf(what, sizeof what, "table %d, ddpm unet, tiled %d", v, tiled);
            needs_cover(what, &g, &b, prec, seen);
            graph_free(&g);
        }
        struct unet_config c; /* the seed UNet */
        tu_small_unet(&c, UNET_SEED);
        struct graph g;
        struct unet_io io;
        graph_init(&g);
        CHECK(unet_build_training(&g, &c, 2, &io, NULL, NULL) == 0, "seed: %s", g.err);
        snprintf(what, sizeof what, "table %d, seed unet", v);
        needs_cover(what, &g, &b, prec, seen);
        graph_free(&g);
        struct classifier_config cc; /* the classifier and its cross-entropy */
        classifier_config_default(&cc);
        cc.image_size = 8;
        cc.widths[0] = cc.widths[1] = cc.widths[2] = 8;
        cc.hidden = 16;
        struct classifier_io ci;
        graph_init(&g);
        int td[2] = {2, cc.classes};
        CHECK(classifier_build(&g, &cc, 2, &ci) == 0, "classifier: %s", g.err);
        int loss = graph_xent(&g, ci.logits, graph_input(&g, "target", 2, td));
        CHECK(loss >= 0 && graph_backward(&g, loss) == 0, "classifier's loss: %s", g.err);
        snprintf(what, sizeof what, "table %d, classifier", v);
        needs_cover(what, &g, &b, prec, seen);
        graph_free(&g);
    }
    int n_seen = 0;
    for (int type = 0; type < OP_COUNT; type++) {
        n_seen += seen[type];
        if (!seen[type]) printf("needs: no graph here runs %s\n", op_name((enum op_type)type));
    }
    printf("needs: %d op types run, each calling only what exec_op_needs names\n", n_seen);
    CHECK(n_seen == OP_COUNT, "%d of %d op types run: a graph here lacks one", n_seen, OP_COUNT);
}

int main(void)
{
    supports();
    refusals();
    needs();
    return tu_finish("test_backend_ops");
}
