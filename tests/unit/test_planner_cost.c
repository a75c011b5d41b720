/* test_planner_cost.c - the cost model: the calibration file's text reads back to the same
 * constants, a bad line is refused naming its line, unknown keys are errors; an op's work is its
 * FLOPs (conv: 2 N Co Ho Wo Ci Kh Kw) or its bytes; a step's prediction is the sum of its ops'
 * predictions once per micro-batch (an uneven last one with its ops' fixed cost and its share
 * of their work) plus the optimizer, a recomputing graph is predicted by its plan's run order
 * before the plan is made, and a forward-only plan is one forward; attention is priced by its
 * form's constants (plain or tiled).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "memplan.h"
#include "test_util.h"
#include "unet.h"

const struct backend *backend_cpu(void);

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fabs(b); }

static void file_format(void)
{
    struct cost_model m, r;
    cost_model_default(&m);
    m.seconds_per_unit[COST_GEMM] = 3.25e-11;
    m.op_seconds[COST_NORM] = 7e-6;
    m.threads = 5;
    m.half_speed[COST_CONV_FWD] = 1.75;
    m.half_speed[COST_GEMM] = 0.625;
    m.half_cvt[COST_NORM] = 1;
    m.half_cvt[COST_ATTN_FWD] = 0;
    char *txt = cost_model_format(&m), err[200];
    memset(&r, 0, sizeof r);
    CHECK(txt && cost_model_parse(&r, txt, err, sizeof err) == 0, "parse of format: %s", err);
    int same = r.threads == m.threads;
    for (int k = 0; k < COST_CLASS_COUNT; k++)
        same &= close_rel(r.seconds_per_unit[k], m.seconds_per_unit[k], 1e-5) &&
                close_rel(r.op_seconds[k], m.op_seconds[k], 1e-5);
    same &= close_rel(r.optim_seconds_per_param, m.optim_seconds_per_param, 1e-5) &&
            close_rel(r.host_optim_seconds_per_param, m.host_optim_seconds_per_param, 1e-5) &&
            close_rel(r.transfer_seconds_per_byte, m.transfer_seconds_per_byte, 1e-5) &&
            close_rel(r.convert_seconds_per_byte, m.convert_seconds_per_byte, 1e-5);
    for (int k = 0; k < COST_CLASS_COUNT; k++)
        same &= close_rel(r.half_speed[k], m.half_speed[k], 1e-5) &&
                r.half_cvt[k] == m.half_cvt[k];
    CHECK(same, "the file does not read back to the constants written:\n%s", txt ? txt : "");
    free(txt);

    /* a partial file keeps the other constants */
    cost_model_default(&r);
    CHECK(cost_model_parse(&r, "# comment\n\ngemm 1e-9 2e-6  # trailing\nthreads 3\n", err,
                           sizeof err) == 0 && r.seconds_per_unit[COST_GEMM] == 1e-9 &&
              r.op_seconds[COST_GEMM] == 2e-6 && r.threads == 3 &&
              r.seconds_per_unit[COST_CONV_FWD] == m.seconds_per_unit[COST_CONV_FWD],
          "a partial file: %s", err);
    /* a 16-bit speed per class; a file of the single speed before them sets the typed ones */
    struct cost_model dflt;
    cost_model_default(&dflt);
    cost_model_default(&r);
    CHECK(cost_model_parse(&r, "half conv_bwd_filter 0.5\nhalf eltwise 1.25\n", err,
                           sizeof err) == 0 && r.half_speed[COST_CONV_BWD_FILTER] == 0.5 &&
              r.half_speed[COST_ELTWISE] == 1.25 &&
              r.half_speed[COST_CONV_FWD] == dflt.half_speed[COST_CONV_FWD],
          "half CLASS X: %s", err);
    CHECK(cost_model_parse(&r, "half_speedup 2\n", err, sizeof err) == 0 &&
              r.half_speed[COST_CONV_FWD] == 2 && r.half_speed[COST_ATTN_TILED_BWD] == 2 &&
              r.half_speed[COST_ELTWISE] == 1.25,
          "half_speedup X: %s", err);
    static const char *const bad[] = {
        "threads 2\nconv_fwd 1e-9\n",   /* one number where two are needed */
        "conv_fwd 1e-9 -1\n",           /* negative */
        "optim 1e-9 junk\n",            /* trailing junk */
        "\nnot_a_key 1\n",              /* unknown key */
        "threads 0\n",                  /* out of range */
        "half_speedup 0\n",
        "half conv_fwd 0\n",           /* a speed must be positive */
        "half nope 2\n",               /* no such class */
        "half conv_fwd\n",
        "transfer nan\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cost_model_default(&r);
        struct cost_model before = r;
        err[0] = 0;
        CHECK(cost_model_parse(&r, bad[i], err, sizeof err) == -1 && strstr(err, "line ") &&
                  !memcmp(&r, &before, sizeof r),
              "bad file %zu accepted or changed the model (%s)", i, err);
    }
    CHECK(strstr(err, "line 1"), "the message names the line: %s", err);
}

static int build(struct graph *g, enum unet_preset preset, int image, int batch, int train)
{
    struct unet_config c;
    unet_config_default(&c, preset);
    c.image_size = image;
    struct unet_io io;
    int target;
    graph_init(g);
    return train ? unet_build_training(g, &c, batch, &io, &target, NULL)
                 : unet_build(g, &c, batch, &io);
}

static void prediction(void)
{
    struct cost_model m;
    cost_model_default(&m);
    struct graph g4, g8, gi;
    struct plan p4, p8, pi;
    int ok = !build(&g4, UNET_SEED, 16, 4, 1) && !build(&g8, UNET_SEED, 16, 8, 1) &&
             !build(&gi, UNET_SEED, 16, 4, 0);
    struct plan_opts o4 = {.strategy = strategy_plain(4)}, o8 = {.strategy = strategy_plain(8)};
    ok = ok && !plan_make(&p4, &g4, backend_cpu(), &o4) && !plan_make(&p8, &g8, backend_cpu(), &o8) &&
         !plan_make(&pi, &gi, backend_cpu(), NULL);
    CHECK(ok, "graphs and plans");
    if (!ok) return;

    /* the work of a convolution is its FLOPs */
    for (int k = 0; k < g4.n_ops; k++)
        if (g4.ops[k].type == OP_CONV2D) {
            const struct bk_conv2d *s = &g4.ops[k].a.conv;
            double f = 2.0 * s->n * s->co * s->ho * s->wo * s->ci * s->kh * s->kw;
            CHECK(cost_op_work(&g4, k) == f, "conv op %d: work %g, FLOPs %g", k,
                  cost_op_work(&g4, k), f);
            break;
        }
    double pass4 = 0, fwd4 = 0, fixed4 = 0;
    for (int k = 0; k < g4.n_ops; k++) {
        pass4 += cost_op_seconds(&m, &g4, k);
        fixed4 += m.op_seconds[cost_op_class(&g4.ops[k])];
    }
    for (int k = 0; k < gi.n_ops; k++) fwd4 += cost_op_seconds(&m, &gi, k);
    double optim = (double)g4.param_numel * m.optim_seconds_per_param;

    /* batch 4 in one micro-batch; batch 8 in two micro-batches of 4; batch 10: two and a half
     * of them, the last one's ops at their full fixed cost and half their work */
    double s4 = cost_predict_step_seconds(&m, &p4, &g4, 4);
    CHECK(close_rel(s4, pass4 + optim, 1e-12), "b4 step %g, ops + optimizer %g", s4, pass4 + optim);
    p4.strategy.micro_batch = 4;
    double s8 = cost_predict_step_seconds(&m, &p4, &g4, 8);
    CHECK(close_rel(s8, 2 * pass4 + optim, 1e-12), "b8 as 2 x 4: %g, expected %g", s8,
          2 * pass4 + optim);
    double s10 = cost_predict_step_seconds(&m, &p4, &g4, 10);
    double want10 = 2 * pass4 + 0.5 * (pass4 - fixed4) + fixed4 + optim;
    CHECK(fixed4 > 0 && close_rel(s10, want10, 1e-12), "b10 as 4+4+2: %g, expected %g", s10,
          want10);
    /* the plain full batch of 8 does the same work as 2 x 4 with fewer ops: no slower */
    double f8 = cost_predict_step_seconds(&m, &p8, &g8, 8);
    CHECK(f8 <= s8 && f8 > s4, "b8 in one: %g; 2 x 4: %g; b4: %g", f8, s8, s4);
    /* forward only */
    double si = cost_predict_step_seconds(&m, &pi, &gi, 4);
    CHECK(close_rel(si, fwd4, 1e-12) && si < pass4, "inference %g, forward ops %g", si, fwd4);
    /* recomputation: the graph's prediction follows the run order the plan will have (its
     * recomputed forward ops counted again), before any plan is made */
    struct plan pr;
    struct plan_opts orr = {.strategy = strategy_plain(4)};
    orr.strategy.recompute = STRATEGY_RECOMPUTE_RESBLOCK;
    if (plan_make(&pr, &g4, backend_cpu(), &orr) == 0) {
        double sp = cost_predict_step_seconds(&m, &pr, &g4, 4);
        double sg = cost_predict_graph_seconds(&m, &g4, &orr.strategy, 4);
        CHECK(pr.n_recomputed > 0 && close_rel(sg, sp, 1e-12) && sg > s4,
              "recompute resblock: graph %g, plan %g, without %g", sg, sp, s4);
        plan_free(&pr);
    } else {
        CHECK(0, "the recomputing plan");
    }
    /* 16 bits: each class's work divided by its own speed. g4 under bf16 predicted with one
     * class (conv_fwd) twice as fast: the step falls by half that class's work seconds */
    struct strategy sb = strategy_plain(4);
    sb.precision = STRATEGY_PRECISION_BF16;
    if (graph_set_precision(&g4, STRATEGY_PRECISION_BF16) == 0) {
        struct cost_model m2 = m;
        for (int c = 0; c < COST_CLASS_COUNT; c++) m.half_speed[c] = m2.half_speed[c] = 1.0;
        m2.half_speed[COST_CONV_FWD] = 2.0;
        double cf = 0;
        for (int k = 0; k < g4.n_ops; k++)
            if (cost_op_class(&g4.ops[k]) == COST_CONV_FWD)
                cf += cost_op_work(&g4, k) * m.seconds_per_unit[COST_CONV_FWD];
        double h1 = cost_predict_graph_seconds(&m, &g4, &sb, 4);
        double h2 = cost_predict_graph_seconds(&m2, &g4, &sb, 4);
        CHECK(cf > 0 && close_rel(h1 - h2, 0.5 * cf, 1e-9),
              "bf16 with conv_fwd at 2x: %g -> %g, expected %g less", h1, h2, 0.5 * cf);
        /* half_cvt: a class whose kernels take 16-bit operands is charged no conversions; one
         * converted around is charged its 16-bit operands' fp32 bytes at convert's rate */
        struct cost_model m3 = m;
        for (int c = 0; c < COST_CLASS_COUNT; c++) m.half_cvt[c] = m3.half_cvt[c] = 0;
        m3.half_cvt[COST_CONV_FWD] = 1;
        double bytes = 0;
        for (int k = 0; k < g4.n_ops; k++) {
            const struct op *o = &g4.ops[k];
            if (cost_op_class(o) != COST_CONV_FWD) continue;
            for (int j = 0; j < o->n_in; j++)
                if (o->in[j] >= 0 && graph_input_dtype(&g4, o, j) != DTYPE_F32)
                    bytes += 4.0 * g4.tensors[o->in[j]]->numel;
            for (int j = 0; j < o->n_out; j++)
                if (o->out[j] >= 0 && g4.tensors[o->out[j]]->dtype != DTYPE_F32)
                    bytes += 4.0 * g4.tensors[o->out[j]]->numel;
        }
        double n0 = cost_predict_graph_seconds(&m, &g4, &sb, 4);
        double n1 = cost_predict_graph_seconds(&m3, &g4, &sb, 4);
        CHECK(bytes > 0 && close_rel(n1 - n0, bytes * m.convert_seconds_per_byte, 1e-9),
              "half_cvt conv_fwd: %g -> %g, expected %g more", n0, n1,
              bytes * m.convert_seconds_per_byte);
    } else {
        CHECK(0, "the bf16 graph");
    }
    plan_free(&p4);
    plan_free(&p8);
    plan_free(&pi);
    graph_free(&g4);
    graph_free(&g8);
    graph_free(&gi);
}

/* attention in its two forms: each op is priced by its own form's constants (the tiled kernels
 * run at another rate than the plain GEMMs), the tiled backward's work 1.25 x its FLOPs (it
 * recomputes the scores), the plain backward's its FLOPs */
static void attention_forms(void)
{
    struct cost_model m;
    cost_model_default(&m);
    const enum cost_class cls[4] = {COST_ATTN_FWD, COST_ATTN_BWD, COST_ATTN_TILED_FWD,
                                    COST_ATTN_TILED_BWD};
    for (int i = 0; i < 4; i++) {
        m.seconds_per_unit[cls[i]] = (i + 1) * 1e-11;
        m.op_seconds[cls[i]] = (i + 1) * 1e-6;
    }
    struct graph g;
    if (build(&g, UNET_SEED, 32, 2, 1)) {
        CHECK(0, "the seed graph at 32 px");
        graph_free(&g);
        return;
    }
    int n[4] = {0};
    for (int k = 0; k < g.n_ops; k++) {
        const struct op *o = &g.ops[k];
        enum cost_class base = cost_class_of(o->type);
        if (base != COST_ATTN_FWD && base != COST_ATTN_BWD) continue;
        int bwd = base == COST_ATTN_BWD, i = 2 * (o->a.at.tiled != 0) + bwd;
        double work = (o->a.at.tiled && bwd ? 1.25 : 1.0) * cost_op_flops(o);
        double want = work * m.seconds_per_unit[cls[i]] + m.op_seconds[cls[i]];
        CHECK(cost_op_class(o) == cls[i] && cost_op_work(&g, k) == work &&
                  close_rel(cost_op_seconds(&m, &g, k), want, 1e-12),
              "attention op %d (%s, tiled %d): class %s, work %g (want %g), %g s (want %g)", k,
              op_name(o->type), o->a.at.tiled, cost_class_name(cost_op_class(o)),
              cost_op_work(&g, k), work, cost_op_seconds(&m, &g, k), want);
        n[i]++;
    }
    CHECK(n[0] && n[1] && n[2] && n[3], "ops of each form: plain %d+%d, tiled %d+%d", n[0], n[1],
          n[2], n[3]);
    graph_free(&g);
}

int main(void)
{
    file_format();
    prediction();
    attention_forms();
    return tu_finish("test_planner_cost");
}
