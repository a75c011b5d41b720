/* test_planner_search.c - the search through train_search, as `ddpmd plan`, `ddpmd train` and the
 * server's admission call it: with no budget and with a budget of exactly the plan's bytes the
 * chosen candidate is planned and its bytes are the job's reservation (train_plan) to the byte;
 * one byte less and nothing fits, the error naming the smallest budget that would fit and its
 * plan, every candidate planned or bounded above it; every candidate's bytes are its job's plan's
 * and every bound below them; a budget too small for the full sample grid takes a smaller chunk;
 * every candidate is one the engine runs (planner_available), a forced strategy it cannot run is
 * refused by name, and the 16-bit precisions come after every fp32 candidate, unless the spec
 * allows 16 bits for speed (memory.allow_16bit): then one order by prediction, and under a cost
 * model whose 16-bit kernels are faster a 16-bit plan is chosen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "cost.h"
#include "spec.h"
#include "test_util.h"
#include "train.h"

static void small_spec(struct train_spec *s)
{
    spec_defaults(s);
    unet_config_default(&s->model, UNET_SEED);
    s->model.image_size = 16;
    s->model.base = 8;
    s->model.time_dim = 32;
    s->batch = 4;
    s->samples = 4;
}

/* Every candidate's bytes in the search (plan_all) are the job's plan's (train_plans_make under
 * its strategy) to the byte, its sample grid chunk the job's; plan_persistent_bytes is that
 * plan's bytes up to its inputs' end; and every lower bound the search uses (a search under a
 * budget nothing fits bounds them all) is at most the exact bytes. */
static void exact_bytes(const struct train_spec *base)
{
    struct train_spec s = *base;
    struct planner_result all, tight;
    char err[512];
    s.vram_budget = 0;
    CHECK(train_search(&s, NULL, 1, &all, err, sizeof err) == 0, "plan_all: %s", err);
    s.vram_budget = 1 << 20;
    train_search(&s, NULL, 0, &tight, err, sizeof err);
    int checked = 0, bounded = 0;
    for (int i = 0; i < all.n_cand; i++) {
        const struct planner_candidate *c = &all.cand[i];
        if (!c->planned) continue;
        struct train_plans tp;
        struct train_shape sh = train_shape_of(&s);
        int rc = train_plans_make(&tp, &sh, &c->strategy, err, sizeof err);
        char what[200];
        planner_strategy_text(&c->strategy, s.batch, what, sizeof what);
        CHECK(rc == 0 && tp.p.total_bytes == c->device_bytes && tp.p.host_bytes == c->host_bytes &&
                  !memcmp(tp.p.parts, c->parts, sizeof c->parts) &&
                  tp.grid == c->strategy.sample_batch,
              "%s: the search says %zu device bytes (grid %d), the job's plan %zu (grid %d): %s",
              what, c->device_bytes, c->strategy.sample_batch, tp.p.total_bytes, tp.grid, err);
        struct plan_opts po = {.strategy = tp.p.strategy,
                               .one_pass = tp.p.strategy.micro_batch == s.batch};
        size_t pers = rc ? 0 : plan_persistent_bytes(&tp.g, train_shape_backend(&sh), &po);
        CHECK(rc || pers == tp.p.inputs_off + tp.p.inputs_bytes,
              "%s: persistent bytes %zu, the plan's inputs end at %zu", what, pers,
              tp.p.inputs_off + tp.p.inputs_bytes);
        for (int k = 0; k < tight.n_cand; k++) {
            const struct planner_candidate *b = &tight.cand[k];
            if (b->strategy.precision != c->strategy.precision ||
                b->strategy.micro_batch != c->strategy.micro_batch ||
                b->strategy.recompute != c->strategy.recompute ||
                b->strategy.offload != c->strategy.offload || !b->bound_bytes)
                continue;
            bounded++;
            CHECK(b->bound_bytes <= c->device_bytes, "%s: bound %zu over the exact %zu bytes",
                  what, b->bound_bytes, c->device_bytes);
        }
        checked++;
        train_plans_free(&tp);
    }
    CHECK(checked == all.n_cand && bounded > 0, "%d of %d candidates checked, %d bounds", checked,
          all.n_cand, bounded);
    planner_result_free(&all);
    planner_result_free(&tight);
}

/* A budget the step fits but not the grid at its full chunk: the search takes a smaller chunk
 * that fits, and the job runs its grids in it */
static void grid_chunks(const struct train_spec *base)
{
    struct train_spec s = *base;
    char err[512];
    s.samples = 16;
    s.batch = 1; /* a step smaller than a grid of 16 */
    s.strategy = strategy_plain(s.batch);
    s.strategy.offload = 1; /* the grid's own weights: the grid is the larger part */
    struct train_plans full, one;
    struct strategy st = s.strategy;
    st.sample_batch = 1;
    struct train_shape sh = train_shape_of(&s);
    CHECK(train_plans_make(&full, &sh, &s.strategy, err, sizeof err) == 0 &&
              train_plans_make(&one, &sh, &st, err, sizeof err) == 0,
          "plans: %s", err);
    CHECK(full.grid == 16 && one.grid == 1 && full.p.total_bytes > one.p.total_bytes,
          "grids of 16 and 1: %zu and %zu bytes", full.p.total_bytes, one.p.total_bytes);
    s.vram_budget = (int64_t)full.p.total_bytes - 1;
    struct planner_result r;
    CHECK(train_search(&s, NULL, 0, &r, err, sizeof err) == 0 && r.chosen >= 0, "search: %s", err);
    if (r.chosen >= 0) {
        const struct planner_candidate *c = &r.cand[r.chosen];
        CHECK(c->strategy.sample_batch >= 1 && c->strategy.sample_batch < 16 &&
                  c->device_bytes <= (size_t)s.vram_budget,
              "one byte under the grid of 16: chunk %d, %zu bytes", c->strategy.sample_batch,
              c->device_bytes);
    }
    planner_result_free(&r);
    train_plans_free(&full);
    train_plans_free(&one);
}

int main(void)
{
    struct train_spec s;
    small_spec(&s);
    char err[512];
    struct graph g, sg;
    struct unet_io io, sio;
    int target;
    struct plan p, sp;
    CHECK(train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == 0,
          "train_plan_job: %s", err);
    size_t total = p.total_bytes;
    plan_free(&sp);
    graph_free(&sg);
    plan_free(&p);
    graph_free(&g);

    struct planner_result r;
    CHECK(train_search(&s, NULL, 1, &r, err, sizeof err) == 0 && r.chosen >= 0, "no budget: %s", err);
    int half_seen = 0, order_ok = 1;
    for (int i = 0; i < r.n_cand; i++) {
        CHECK(planner_available(&r.cand[i].strategy, s.batch),
              "candidate %d is a strategy the engine cannot run", i);
        int half = r.cand[i].strategy.precision != STRATEGY_PRECISION_F32;
        if (!half && half_seen) order_ok = 0;
        half_seen |= half;
        size_t dev = 0;
        for (int k = 0; k < PLAN_PART_COUNT; k++) dev += r.cand[i].parts[k].device;
        CHECK(!r.cand[i].planned || dev == r.cand[i].device_bytes,
              "candidate %d: parts sum to %zu of %zu device bytes", i, dev,
              r.cand[i].device_bytes);
    }
    CHECK(order_ok, "a 16-bit candidate is ordered before an fp32 one");
    if (r.chosen >= 0) {
        const struct planner_candidate *c = &r.cand[r.chosen];
        CHECK(c->device_bytes == total, "the chosen plan holds %zu bytes, train_plan %zu",
              c->device_bytes, total);
        CHECK(c->strategy.precision == STRATEGY_PRECISION_F32 &&
                  c->strategy.recompute == STRATEGY_RECOMPUTE_NONE && c->strategy.offload == 0 &&
                  c->strategy.micro_batch == s.batch,
              "with no budget the plain step is chosen");
    }
    planner_result_free(&r);

    /* memory.allow_16bit: fp32 and 16-bit candidates in one order, by predicted time, so the
     * fastest predicted of either is chosen (with no budget, the first). Under a cost model
     * whose 16-bit kernels are 20x their fp32 rate that is a 16-bit plan; without
     * allow_16bit, still fp32. */
    char cm[] = "/tmp/ddpmd-test-costXXXXXX";
    int fd = mkstemp(cm);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL, "a temporary cost model file");
    if (f) {
        for (int c = 0; c < COST_CLASS_COUNT; c++)
            fprintf(f, "half %s 20\n", cost_class_name((enum cost_class)c));
        fprintf(f, "convert 1e-13\n");
        fclose(f);
        struct cost_model m;
        CHECK(train_cost_model(&m, cm, err, sizeof err) == 0, "the cost model: %s", err);
        for (int allow = 0; allow < 2; allow++) {
            s.strategy.allow_half = allow;
            CHECK(train_search(&s, &m, 1, &r, err, sizeof err) == 0 && r.chosen == 0,
                  "allow_16bit %d: %s", allow, err);
            int sorted = 1, precs = 0;
            for (int i = 0; i < r.n_cand; i++) {
                if (i && r.cand[i].predicted_s < r.cand[i - 1].predicted_s) sorted = 0;
                precs |= 1 << r.cand[i].strategy.precision;
            }
            CHECK(precs == 7 && (r.cand[0].strategy.precision != STRATEGY_PRECISION_F32) == allow,
                  "allow_16bit %d: chose precision %d", allow, r.cand[0].strategy.precision);
            CHECK(!allow || sorted, "allow_16bit: candidates not in one order by prediction");
            planner_result_free(&r);
        }
        unlink(cm);
        s.strategy.allow_half = 0;
    }

    s.vram_budget = (int64_t)total;
    CHECK(train_search(&s, NULL, 0, &r, err, sizeof err) == 0 && r.chosen >= 0 &&
              r.cand[r.chosen].fits && r.cand[r.chosen].device_bytes <= total,
          "a budget of exactly the plan's bytes: %s", err);
    planner_result_free(&r);

    /* one byte short of the plain plan: another candidate (micro-batches, recomputation,
     * offload) fits, or, if none does, the search says so */
    s.vram_budget = (int64_t)total - 1;
    if (train_search(&s, NULL, 0, &r, err, sizeof err) == 0) {
        const struct planner_candidate *c = &r.cand[r.chosen];
        CHECK(c->device_bytes < total && c->fits &&
                  !(c->strategy.micro_batch == s.batch &&
                    c->strategy.recompute == STRATEGY_RECOMPUTE_NONE && c->strategy.offload == 0),
              "one byte short: the plain plan (or a larger one) was chosen");
    } else {
        CHECK(strstr(err, "no plan fits") != NULL, "one byte short: %s", err);
    }
    planner_result_free(&r);

    /* 1 MiB: nothing fits; every candidate planned, the smallest named with its bytes */
    s.vram_budget = 1 << 20;
    int nofit = train_search(&s, NULL, 0, &r, err, sizeof err);
    char want[64] = "";
    if (r.smallest >= 0) snprintf(want, sizeof want, "(%zu bytes)", r.cand[r.smallest].device_bytes);
    CHECK(nofit == -1 && r.chosen < 0 && r.smallest >= 0 && strstr(err, "no plan fits") &&
              strstr(err, want) && r.cand[r.smallest].device_bytes > (size_t)s.vram_budget,
          "1 MiB: '%s' should name %s", err, want);
    for (int i = 0; i < r.n_cand && r.smallest >= 0; i++) {
        const struct planner_candidate *c = &r.cand[i];
        CHECK(c->planned || c->failed || c->bound_bytes >= r.cand[r.smallest].device_bytes,
              "nothing fits, yet candidate %d was neither planned nor bounded above the smallest "
              "(the smallest is unknown)", i);
        CHECK(!c->planned || c->device_bytes >= r.cand[r.smallest].device_bytes,
              "candidate %d is smaller than the one named smallest", i);
    }
    planner_result_free(&r);
    exact_bytes(&s);
    grid_chunks(&s);

    /* a train_plan_job under that budget fails the same way (the job ends before allocating) */
    err[0] = 0;
    CHECK(train_plan_job(&s, NULL, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == -1 &&
              strstr(err, want),
          "train_plan_job under a budget too small: '%s'", err);
    plan_free(&sp);
    graph_free(&sg);
    plan_free(&p);
    graph_free(&g);

    /* forced strategies: refused by name when the engine cannot run them, else honoured */
    s.vram_budget = 0;
    static const struct {
        int precision, recompute, offload, micro;
        const char *name;
    } forced[] = {
        {STRATEGY_PRECISION_BF16, STRATEGY_RECOMPUTE_AUTO, -1, 0, "precision bf16"},
        {STRATEGY_PRECISION_F16, STRATEGY_RECOMPUTE_AUTO, -1, 0, "precision f16"},
        {STRATEGY_PRECISION_AUTO, STRATEGY_RECOMPUTE_LEVEL, -1, 0, "recompute level"},
        {STRATEGY_PRECISION_AUTO, STRATEGY_RECOMPUTE_AUTO, 1, 0, "offload"},
        {STRATEGY_PRECISION_AUTO, STRATEGY_RECOMPUTE_AUTO, -1, 1, "micro-batches"},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
        s.strategy = strategy_auto();
        s.strategy.precision = forced[i].precision;
        s.strategy.recompute = forced[i].recompute;
        s.strategy.offload = forced[i].offload;
        s.strategy.micro_batch = forced[i].micro;
        struct strategy probe = strategy_plain(s.batch);
        if (forced[i].precision >= 0) probe.precision = forced[i].precision;
        if (forced[i].recompute >= 0) probe.recompute = forced[i].recompute;
        if (forced[i].offload >= 0) probe.offload = forced[i].offload;
        if (forced[i].micro) probe.micro_batch = forced[i].micro;
        int rc = train_search(&s, NULL, 0, &r, err, sizeof err);
        if (planner_available(&probe, s.batch)) {
            CHECK(rc == 0 && r.chosen >= 0 &&
                      (forced[i].precision < 0 ||
                       r.cand[r.chosen].strategy.precision == forced[i].precision) &&
                      (forced[i].micro == 0 ||
                       r.cand[r.chosen].strategy.micro_batch == forced[i].micro),
                  "forced %s (available) not honoured: %s", forced[i].name, err);
        } else {
            CHECK(rc == -1 && strstr(err, forced[i].name) && strstr(err, "cannot run"),
                  "forced %s (not available) was not refused by name: '%s'", forced[i].name,
                  err);
        }
        planner_result_free(&r);
    }
    return tu_finish("test_planner_search");
}
