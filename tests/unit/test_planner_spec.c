/* test_planner_spec.c - the spec's memory object: every field parsed into the strategy and the
 * budget (a size string or bytes), each bad value refused with its field path, absent fields
 * auto, the canonical JSON reading back to the same spec, and micro_batch bounded by the batch.
 */
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "test_util.h"

static int has_error(const struct spec_errors *E, const char *path)
{
    for (int i = 0; i < E->n; i++)
        if (strcmp(E->e[i].path, path) == 0) return 1;
    return 0;
}

#define HEAD "{\"model\":{\"preset\":\"seed\",\"image_size\":16},\"data\":{\"dataset\":\"x\"}," \
             "\"train\":{\"batch\":4}"

int main(void)
{
    struct train_spec s, r;
    struct spec_errors E;

    CHECK(spec_parse(HEAD "}", &s, &E) == 0, "a spec without memory");
    CHECK(s.vram_budget == 0 && s.strategy.precision == STRATEGY_PRECISION_AUTO &&
              s.strategy.micro_batch == 0 && s.strategy.recompute == STRATEGY_RECOMPUTE_AUTO &&
              s.strategy.offload == -1 && s.strategy.loss_scale.initial == 65536.0f &&
              !s.deterministic,
          "no memory object: no budget, every strategy auto, fast mode");

    int ok = spec_parse(HEAD ",\"memory\":{\"vram_budget\":\"1.5GiB\",\"precision\":\"bf16\","
                             "\"micro_batch\":3,\"recompute\":\"resblock\",\"offload\":\"on\","
                             "\"deterministic\":true,"
                             "\"loss_scale\":{\"initial\":1024,\"growth\":4,\"backoff\":0.25,"
                             "\"growth_interval\":100}}}", &s, &E) == 0;
    CHECK(ok, "a full memory object: %s", E.n ? E.e[0].msg : "");
    CHECK(s.vram_budget == 1610612736 && s.strategy.precision == STRATEGY_PRECISION_BF16 &&
              s.strategy.micro_batch == 3 && s.strategy.recompute == STRATEGY_RECOMPUTE_RESBLOCK &&
              s.strategy.offload == 1 && s.strategy.loss_scale.initial == 1024.0f &&
              s.strategy.loss_scale.growth == 4.0f && s.strategy.loss_scale.backoff == 0.25f &&
              s.strategy.loss_scale.growth_interval == 100 && s.deterministic == 1,
          "the memory object's values");
    /* canonical JSON reads back to the same spec */
    char *js = spec_to_json(&s);
    CHECK(js && spec_parse(js, &r, &E) == 0 && r.vram_budget == s.vram_budget &&
              !memcmp(&r.strategy, &s.strategy, sizeof s.strategy) && r.deterministic == 1,
          "canonical JSON round trip:\n%s", js ? js : "");
    free(js);
    CHECK(spec_parse(HEAD ",\"memory\":{\"vram_budget\":268435456,\"precision\":\"f32\","
                          "\"micro_batch\":\"auto\",\"offload\":\"off\",\"recompute\":\"none\"}}",
                     &s, &E) == 0 && s.vram_budget == 268435456 && s.strategy.micro_batch == 0 &&
              s.strategy.offload == 0 && s.strategy.recompute == 0 && s.strategy.precision == 0,
          "bytes, auto micro-batch, off, none, f32");
    js = spec_to_json(&s);
    CHECK(js && spec_parse(js, &r, &E) == 0 && !memcmp(&r.strategy, &s.strategy, sizeof s.strategy),
          "canonical JSON of an auto micro-batch");
    free(js);

    static const struct {
        const char *memory, *path;
    } bad[] = {
        {"{\"vram_budget\":\"1e9\"}", "memory.vram_budget"},
        {"{\"vram_budget\":\" 5\"}", "memory.vram_budget"},
        {"{\"vram_budget\":\"4 GiB\"}", "memory.vram_budget"},
        {"{\"vram_budget\":-1}", "memory.vram_budget"},
        {"{\"vram_budget\":1.5}", "memory.vram_budget"},
        {"{\"vram_budget\":true}", "memory.vram_budget"},
        {"{\"vram_budget\":\"2PiB\"}", "memory.vram_budget"},
        {"{\"precision\":\"f64\"}", "memory.precision"},
        {"{\"precision\":16}", "memory.precision"},
        {"{\"recompute\":\"all\"}", "memory.recompute"},
        {"{\"offload\":true}", "memory.offload"},
        {"{\"deterministic\":1}", "memory.deterministic"},
        {"{\"deterministic\":\"yes\"}", "memory.deterministic"},
        {"{\"micro_batch\":5}", "memory.micro_batch"},   /* larger than train.batch 4 */
        {"{\"micro_batch\":-1}", "memory.micro_batch"},
        {"{\"micro_batch\":\"half\"}", "memory.micro_batch"},
        {"{\"loss_scale\":{\"initial\":0.5}}", "memory.loss_scale.initial"},
        {"{\"loss_scale\":{\"growth\":1}}", "memory.loss_scale.growth"},
        {"{\"loss_scale\":{\"backoff\":1}}", "memory.loss_scale.backoff"},
        {"{\"loss_scale\":{\"growth_interval\":0}}", "memory.loss_scale.growth_interval"},
        {"{\"loss_scale\":{\"bogus\":1}}", "memory.loss_scale.bogus"},
        {"{\"loss_scale\":3}", "memory.loss_scale"},
        {"{\"budget\":1}", "memory.budget"},
        {"[]", "memory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char doc[512];
        snprintf(doc, sizeof doc, HEAD ",\"memory\":%s}", bad[i].memory);
        int rc = spec_parse(doc, &s, &E);
        CHECK(rc == -1 && has_error(&E, bad[i].path), "%s: not refused at %s (%d errors%s%s)",
              bad[i].memory, bad[i].path, E.n, E.n ? ", first " : "", E.n ? E.e[0].path : "");
    }
    /* spec_validate (the CLI's options) applies the same rules */
    spec_defaults(&s);
    unet_config_default(&s.model, UNET_SEED);
    s.batch = 4;
    s.strategy.micro_batch = 8;
    CHECK(spec_validate(&s, &E) == -1 && has_error(&E, "memory.micro_batch"),
          "spec_validate: micro_batch above the batch");
    s.strategy.micro_batch = 2;
    s.strategy.precision = 7;
    CHECK(spec_validate(&s, &E) == -1 && has_error(&E, "memory.precision"),
          "spec_validate: an unknown precision");
    return tu_finish("test_planner_spec");
}
