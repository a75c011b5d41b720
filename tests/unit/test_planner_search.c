/* test_planner_search.c - the search through train_search, as `ddpmd plan`, `ddpmd train` and the
 * server's admission call it: with no budget and with a budget of exactly the plan's bytes the
 * chosen candidate is planned and its bytes are the job's reservation (train_plan) to the byte;
 * one byte less and nothing fits, the error naming the smallest budget that would fit and its
 * plan; every candidate is one the engine runs (planner_available), a forced strategy it cannot
 * run is refused by name, and the 16-bit precisions come after every fp32 candidate.
 */
#include <stdio.h>
#include <string.h>

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

int main(void)
{
    struct train_spec s;
    small_spec(&s);
    char err[512];
    struct graph g;
    struct unet_io io;
    int target;
    struct plan p;
    CHECK(train_plan(&s, &g, &io, &target, &p, err, sizeof err) == 0, "train_plan: %s", err);
    size_t total = p.total_bytes;
    plan_free(&p);
    graph_free(&g);

    struct planner_result r;
    CHECK(train_search(&s, 1, &r, err, sizeof err) == 0 && r.chosen >= 0, "no budget: %s", err);
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

    s.vram_budget = (int64_t)total;
    CHECK(train_search(&s, 0, &r, err, sizeof err) == 0 && r.chosen >= 0 &&
              r.cand[r.chosen].fits && r.cand[r.chosen].device_bytes <= total,
          "a budget of exactly the plan's bytes: %s", err);
    planner_result_free(&r);

    /* one byte short of the plain plan: another candidate (micro-batches, recomputation,
     * offload) fits, or, if none does, the search says so */
    s.vram_budget = (int64_t)total - 1;
    if (train_search(&s, 0, &r, err, sizeof err) == 0) {
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
    int nofit = train_search(&s, 0, &r, err, sizeof err);
    char want[64] = "";
    if (r.smallest >= 0) snprintf(want, sizeof want, "(%zu bytes)", r.cand[r.smallest].device_bytes);
    CHECK(nofit == -1 && r.chosen < 0 && r.smallest >= 0 && strstr(err, "no plan fits") &&
              strstr(err, want) && r.cand[r.smallest].device_bytes > (size_t)s.vram_budget,
          "1 MiB: '%s' should name %s", err, want);
    for (int i = 0; i < r.n_cand; i++) {
        CHECK(r.cand[i].planned || r.cand[i].failed,
              "nothing fits, yet candidate %d was not planned (the smallest is unknown)", i);
        CHECK(!r.cand[i].planned || r.cand[i].device_bytes >= r.cand[r.smallest].device_bytes,
              "candidate %d is smaller than the one named smallest", i);
    }
    planner_result_free(&r);

    /* a train_plan_job under that budget fails the same way (the job ends before allocating) */
    struct graph sg;
    struct unet_io sio;
    struct plan sp;
    err[0] = 0;
    CHECK(train_plan_job(&s, &g, &io, &target, &p, &sg, &sio, &sp, err, sizeof err) == -1 &&
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
        int rc = train_search(&s, 0, &r, err, sizeof err);
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
