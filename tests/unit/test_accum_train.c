/* test_accum_train.c - training with micro-batches and offload (train_opts.strategy): a batch of
 * 5 in micro-batches of 2 (2 + 2 + an uneven 1) resumes bit-identically (4 steps straight == 2
 * steps, a stop, 2 resumed: the same weights, EMA and AdamW bytes, with flips and dropout on),
 * and its first step's loss (drawn before any update) equals the plain full-batch run's within
 * 1e-5; the validation loss, run through the same micro-batches, too. With offload as well (the
 * moments, EMA and master in host memory) the stopped and resumed run's checkpoint holds the
 * same bytes as the straight run without offload, and so does an f16 run (loss scaling) with
 * the micro-batches and offload against the straight f16 run; a run's sample grid (its nested
 * plan reading the EMA uploaded from the host) is the same PNG as without offload.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "image.h"
#include "philox.h"
#include "test_util.h"
#include "test_train_util.h"
#include "train.h"

/* the shared tiny spec with dropout, flips and a validation split on, at an effective batch of 5 */
static void tiny_spec(struct train_spec *s, const char *data, int steps)
{
    tt_tiny_spec(s, data, steps);
    s->model.dropout = 0.1f;
    s->flip = 1;
    s->validation = 8;
    s->batch = 5;
}

/* loss and validation loss of `step` in out/loss.csv (NaN when absent) */
static void csv_row(const char *out, int step, float *loss, float *val)
{
    char p[512], line[256];
    *loss = *val = NAN;
    snprintf(p, sizeof p, "%s/loss.csv", out);
    FILE *f = fopen(p, "r");
    while (f && fgets(line, sizeof line, f)) {
        int s;
        float l, v;
        int k = sscanf(line, "%d,%f,%f", &s, &l, &v);
        if (k >= 2 && s == step) {
            *loss = l;
            *val = k == 3 ? v : NAN;
        }
    }
    if (f) fclose(f);
}

int main(void)
{
    char root[256], data[300], a[300], b[300], c[300], err[512];
    snprintf(root, sizeof root, "/tmp/ddpmd-test-accum-XXXXXX");
    if (!mkdtemp(root)) return 1;
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    snprintf(c, sizeof c, "%s/c", root);
    tt_make_discs(data);

    struct train_spec s;
    tiny_spec(&s, data, 4);
    struct strategy st = strategy_plain(2);
    struct train_opts o = {.out_dir = a, .quiet = 1, .strategy = &st};
    CHECK(train_run(&s, &o, err, sizeof err) == TRAIN_DONE, "straight run: %s", err);
    struct train_opts ob = {.out_dir = b, .quiet = 1, .stop_after = 2, .strategy = &st};
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_STOPPED, "stopped run: %s", err);
    ob.stop_after = 0;
    ob.resume = TRAIN_RESUME_REQUIRED;
    struct train_stats stats;
    ob.stats = &stats;
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_DONE, "resumed run: %s", err);
    CHECK(stats.resumed == 1 && stats.start_step == 2 && stats.steps_run == 2,
          "the resumed run began at step %lld and ran %lld", (long long)stats.start_step,
          (long long)stats.steps_run);
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-00000004.safetensors", a);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000004.safetensors", b);
    size_t na, nb;
    unsigned char *ba = tt_checkpoint_bytes(pa, &na), *bb = tt_checkpoint_bytes(pb, &nb);
    CHECK(ba && bb && na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "micro-batches: the resumed weights/EMA/AdamW differ from the uninterrupted run");
    free(ba);
    free(bb);

    /* offload too: stopped at 2, resumed, against the straight run without offload */
    struct strategy so = st;
    so.offload = 1;
    char e[300];
    snprintf(e, sizeof e, "%s/e", root);
    struct train_opts oe = {.out_dir = e, .quiet = 1, .stop_after = 2, .strategy = &so};
    CHECK(train_run(&s, &oe, err, sizeof err) == TRAIN_STOPPED, "offload stopped run: %s", err);
    oe.stop_after = 0;
    oe.resume = TRAIN_RESUME_REQUIRED;
    CHECK(train_run(&s, &oe, err, sizeof err) == TRAIN_DONE, "offload resumed run: %s", err);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000004.safetensors", e);
    ba = tt_checkpoint_bytes(pa, &na);
    bb = tt_checkpoint_bytes(pb, &nb);
    CHECK(ba && bb && na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "offload: the resumed weights/EMA/AdamW differ from the run without offload");
    free(ba);
    free(bb);

    /* f16 with the uneven micro-batches and offload, stopped at 2 and resumed (the loss scaler's
     * state restored from the checkpoint), against the straight f16 run without offload; from a
     * scale of 2^24 the first steps overflow and are skipped, the scale backs off, and grows
     * again every 2 finite steps: every micro-batch (the uneven one too) must scale alike */
    struct strategy sh = st, sho;
    sh.precision = STRATEGY_PRECISION_F16;
    sh.loss_scale.initial = 16777216.0f;
    sh.loss_scale.growth_interval = 2;
    sho = sh;
    sho.offload = 1;
    char h1[300], h2[300];
    snprintf(h1, sizeof h1, "%s/h1", root);
    snprintf(h2, sizeof h2, "%s/h2", root);
    struct train_opts oh = {.out_dir = h1, .quiet = 1, .strategy = &sh};
    CHECK(train_run(&s, &oh, err, sizeof err) == TRAIN_DONE, "f16 straight run: %s", err);
    struct train_opts oho = {.out_dir = h2, .quiet = 1, .stop_after = 2, .strategy = &sho};
    CHECK(train_run(&s, &oho, err, sizeof err) == TRAIN_STOPPED, "f16 offload stopped: %s", err);
    oho.stop_after = 0;
    oho.resume = TRAIN_RESUME_REQUIRED;
    CHECK(train_run(&s, &oho, err, sizeof err) == TRAIN_DONE, "f16 offload resumed: %s", err);
    snprintf(pa, sizeof pa, "%s/checkpoints/step-00000004.safetensors", h1);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000004.safetensors", h2);
    ba = tt_checkpoint_bytes(pa, &na);
    bb = tt_checkpoint_bytes(pb, &nb);
    CHECK(ba && bb && na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "f16, micro-batches and offload: the resumed weights/EMA/AdamW differ from the straight "
          "f16 run without offload");
    free(ba);
    free(bb);
    struct safetensors *sk = NULL;
    const char *skipped = NULL, *scale = NULL;
    if (checkpoint_open(&sk, pb, NULL, NULL, err, sizeof err) == 0) {
        skipped = safetensors_meta(sk, "loss_scale_skipped");
        scale = safetensors_meta(sk, "loss_scale");
    }
    printf("f16 with micro-batches of 2 and offload, resumed: loss scale %s, %s skipped\n",
           scale ? scale : "?", skipped ? skipped : "?");
    CHECK(skipped && atoi(skipped) > 0 && scale && atof(scale) < 16777216.0,
          "the f16 run skipped no step (loss_scale_skipped %s): the scaler was not exercised",
          skipped ? skipped : "missing");
    safetensors_free(sk);

    /* the plain full-batch run: the same first loss and first validation loss */
    struct train_spec s1;
    tiny_spec(&s1, data, 2);
    struct train_spec m1 = s1;
    m1.sample_every = 2; /* a grid at step 2, with and without offload */
    struct train_opts oc = {.out_dir = c, .quiet = 1};
    CHECK(train_run(&s1, &oc, err, sizeof err) == TRAIN_DONE, "plain run: %s", err);
    char d[300];
    snprintf(d, sizeof d, "%s/d", root);
    struct train_opts od = {.out_dir = d, .quiet = 1, .strategy = &st};
    CHECK(train_run(&m1, &od, err, sizeof err) == TRAIN_DONE, "micro-batch run: %s", err);
    char f[300];
    snprintf(f, sizeof f, "%s/f", root);
    struct train_opts of = {.out_dir = f, .quiet = 1, .strategy = &so};
    CHECK(train_run(&m1, &of, err, sizeof err) == TRAIN_DONE, "offload run: %s", err);
    char ga[400], gb[400];
    snprintf(ga, sizeof ga, "%s/samples/step-00000002.png", d);
    snprintf(gb, sizeof gb, "%s/samples/step-00000002.png", f);
    size_t gna = 0, gnb = 0;
    unsigned char *pga = tu_slurp(ga, &gna), *pgb = tu_slurp(gb, &gnb);
    CHECK(pga && pgb && gna == gnb && memcmp(pga, pgb, gna) == 0,
          "offload: the sample grid differs (%zu and %zu bytes)", gna, gnb);
    free(pga);
    free(pgb);
    float lp, vp, lm, vm, lp3, vp3, lm3, vm3;
    csv_row(c, 1, &lp, &vp);
    csv_row(d, 1, &lm, &vm);
    csv_row(c, 2, &lp3, &vp3);
    csv_row(d, 2, &lm3, &vm3);
    printf("step 1 loss: plain %.7f, micro-batches of 2 %.7f; step 2 validation loss %.7f, "
           "%.7f\n", lp, lm, vp3, vm3);
    CHECK(isfinite(lp) && fabsf(lp - lm) <= 1e-5f * fabsf(lp), "step 1 loss %.9g vs %.9g", lm,
          lp);
    CHECK(isfinite(vp3) && fabsf(vp3 - vm3) <= 1e-3f * fabsf(vp3),
          "step 2 validation loss %.9g vs %.9g", vm3, vp3);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_accum_train");
}
