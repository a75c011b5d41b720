/* test_seed64.c - the user's case, examples/seed-64.json (the seed preset, 64x64 RGB, effective
 * batch 8) on a folder of PNGs this test writes: for each budget of 4 GiB, 1 GiB, 512 MiB and
 * 256 MiB the planner's search finds a plan that fits, and `ddpmd train`'s code (train_run)
 * runs 3 steps and the final sample grid of 16 images under that budget, which the CPU backend
 * enforces; the 4 GiB plan is the plain one (fp32, the whole batch, no recompute, no offload).
 * The grid's sampler takes min(50, diffusion.timesteps) steps: 2 timesteps keep it short (no
 * plan depends on the schedule's length). Slow: ~12 seed-64 b8 steps of 3.5-5 s each on two
 * idle cores (~1.5 minutes).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image.h"
#include "philox.h"
#include "spec.h"
#include "test_util.h"
#include "train.h"

static void make_folder(const char *dir)
{
    mkdir(dir, 0755);
    static float img[3 * 64 * 64];
    char path[700], err[256];
    for (int i = 0; i < 16; i++) {
        float cx = 8 + 48 * philox_uniform_at(11, 1, 0, (uint32_t)i, 0, 0);
        float cy = 8 + 48 * philox_uniform_at(11, 1, 0, (uint32_t)i, 0, 1);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 64; y++)
                for (int x = 0; x < 64; x++)
                    img[(c * 64 + y) * 64 + x] =
                        (x - cx) * (x - cx) + (y - cy) * (y - cy) < 100 ? 0.8f - 0.3f * c : -0.7f;
        snprintf(path, sizeof path, "%s/img%02d.png", dir, i);
        CHECK(image_save_png(path, img, 3, 64, 64, err, sizeof err) == 0, "png: %s", err);
    }
}

int main(void)
{
    char root[] = "/tmp/ddpmd-seed64-XXXXXX", data[600], out[600], err[512];
    if (!mkdtemp(root)) return 1;
    snprintf(data, sizeof data, "%s/images", root);
    make_folder(data);

    struct train_spec base;
    struct spec_errors E;
    CHECK(spec_load_file("examples/seed-64.json", &base, &E) == 0, "examples/seed-64.json: %s",
          E.n ? E.e[0].msg : "");
    CHECK(base.model.preset == UNET_SEED && base.model.image_size == 64 &&
              base.model.in_channels == 3 && base.batch == 8,
          "examples/seed-64.json is not the seed preset at 64x64 RGB, batch 8");
    snprintf(base.dataset, sizeof base.dataset, "%s", data);
    base.steps = 3;
    base.timesteps = 2;
    base.optim.total_steps = 3;
    base.checkpoint_every = 0;
    base.sample_every = 0;
    base.log_every = 1;

    static const struct {
        int64_t bytes;
        const char *name;
    } budgets[] = {{(int64_t)4 << 30, "4 GiB"}, {(int64_t)1 << 30, "1 GiB"},
                   {(int64_t)512 << 20, "512 MiB"}, {(int64_t)256 << 20, "256 MiB"}};
    for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
        struct train_spec s = base;
        s.vram_budget = budgets[k].bytes;
        struct planner_result r;
        int rc = train_search(&s, NULL, 0, &r, err, sizeof err);
        CHECK(rc == 0, "%s: no plan found: %s", budgets[k].name, err);
        if (rc) {
            planner_result_free(&r);
            continue;
        }
        const struct planner_candidate *c = &r.cand[r.chosen];
        char what[160];
        planner_strategy_text(&c->strategy, s.batch, what, sizeof what);
        printf("%s: %s, %zu device bytes, %zu host, predicted %.2f s/step\n", budgets[k].name,
               what, c->device_bytes, c->host_bytes, c->predicted_s);
        CHECK(c->device_bytes <= (size_t)budgets[k].bytes, "%s: the plan is over the budget",
              budgets[k].name);
        if (k == 0)
            CHECK(c->strategy.precision == STRATEGY_PRECISION_F32 &&
                      c->strategy.micro_batch == s.batch &&
                      c->strategy.recompute == STRATEGY_RECOMPUTE_NONE && c->strategy.offload == 0,
                  "4 GiB: not the plain plan: %s", what);
        planner_result_free(&r);
        snprintf(out, sizeof out, "%s/out%zu", root, k);
        struct train_stats st = {0};
        struct train_opts o = {.out_dir = out, .quiet = 1, .stats = &st};
        rc = train_run(&s, &o, err, sizeof err);
        CHECK(rc == TRAIN_DONE && st.steps_run == 3, "%s: train_run: %d (%s), %lld steps",
              budgets[k].name, rc, rc ? err : "", (long long)st.steps_run);
        snprintf(out + strlen(out), sizeof out - strlen(out), "/samples/step-00000003.png");
        struct stat sb;
        CHECK(stat(out, &sb) == 0 && sb.st_size > 0, "%s: no sample grid at %s", budgets[k].name,
              out);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_seed64");
}
