/* test_prec_resume: f16 training end to end (train_run) with dynamic loss scaling. The loss scale
 * starts at 2^24, where the loss gradient itself overflows half range: the first steps are
 * skipped and back the scale off, later ones grow it again (growth_interval 3). The JSON progress
 * lines report the loss scale and the skipped steps (and a skipped step's inf norm as null, never
 * as invalid JSON); checkpoints record precision f16 and the loss scale state; a run stopped
 * after 5 steps and resumed equals the uninterrupted 12-step run bit for bit (weights, EMA,
 * AdamW moments, loss scale state).
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint.h"
#include "image.h"
#include "philox.h"
#include "test_util.h"
#include "test_train_util.h"
#include "train.h"

static char root[256];

static void f16_spec(struct train_spec *s, const char *data, int steps)
{
    tt_tiny_spec(s, data, steps);
    s->checkpoint_every = 4;
    s->keep_last = 3;
    s->strategy.precision = STRATEGY_PRECISION_F16;
    s->strategy.loss_scale.initial = 16777216.0f;
    s->strategy.loss_scale.growth = 2.0f;
    s->strategy.loss_scale.backoff = 0.5f;
    s->strategy.loss_scale.growth_interval = 3;
}

/* train_run with stdout (the JSON progress lines) into path */
static int run_captured(const struct train_spec *s, const struct train_opts *o, const char *path,
                        char *err, size_t errlen)
{
    fflush(stdout);
    int saved = dup(1);
    FILE *f = fopen(path, "w");
    dup2(fileno(f), 1);
    int rc = train_run(s, o, err, errlen);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    return rc;
}

/* the step lines of a captured run: every one valid JSON; the last skipped_steps and loss_scale */
static int step_lines(const char *path, long *skipped, double *scale, int *nulls)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0, bad = 0;
    *nulls = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"event\":\"step\"")) continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "skipped_steps");
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "loss_scale");
        const cJSON *gn = cJSON_GetObjectItemCaseSensitive(o, "grad_norm");
        if (!o || !cJSON_IsNumber(k) || !cJSON_IsNumber(ls)) {
            bad++;
        } else {
            *skipped = (long)k->valuedouble;
            *scale = ls->valuedouble;
            *nulls += cJSON_IsNull(gn);
            n++;
        }
        cJSON_Delete(o);
    }
    if (f) fclose(f);
    return bad ? -1 : n;
}

static void meta(const char *path, char out[4][32])
{
    struct safetensors *st;
    char err[256];
    const char *keys[4] = {"precision", "loss_scale", "loss_scale_good_steps",
                           "loss_scale_skipped"};
    for (int k = 0; k < 4; k++) snprintf(out[k], 32, "(none)");
    if (safetensors_open(&st, path, err, sizeof err)) return;
    for (int k = 0; k < 4; k++) {
        const char *v = safetensors_meta(st, keys[k]);
        if (v) snprintf(out[k], 32, "%s", v);
    }
    safetensors_free(st);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/test_prec_resume_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char data[300], a[300], b[300], la[300], lb[300], err[512] = "";
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    snprintf(la, sizeof la, "%s/a.log", root);
    snprintf(lb, sizeof lb, "%s/b.log", root);
    tt_make_discs(data);
    struct train_spec s;
    f16_spec(&s, data, 12);
    struct train_opts o = {.out_dir = a};
    CHECK(run_captured(&s, &o, la, err, sizeof err) == TRAIN_DONE, "straight run: %s", err);
    long skipped = -1;
    double scale = 0;
    int nulls = 0, lines = step_lines(la, &skipped, &scale, &nulls);
    printf("f16, loss scale from 2^24: %ld of 12 steps skipped, scale %g at the end, %d lines "
           "with a null grad_norm\n", skipped, scale, nulls);
    CHECK(lines == 12, "%d valid step lines with loss_scale and skipped_steps, want 12", lines);
    CHECK(skipped >= 1 && skipped < 12, "%ld steps skipped: the 2^24 scale must overflow at first "
          "and settle", skipped);
    CHECK(nulls == skipped, "%d step lines with a null grad_norm, %ld skipped", nulls, skipped);
    CHECK(scale > 0 && scale < 16777216.0, "loss scale %g at the end", scale);
    struct train_opts ob = {.out_dir = b, .stop_after = 5};
    CHECK(run_captured(&s, &ob, lb, err, sizeof err) == TRAIN_STOPPED, "stopped run: %s", err);
    ob.stop_after = 0;
    ob.resume = TRAIN_RESUME_REQUIRED;
    CHECK(run_captured(&s, &ob, lb, err, sizeof err) == TRAIN_DONE, "resumed run: %s", err);
    char pa[400], pb[400], ma[4][32], mb[4][32];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-00000012.safetensors", a);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000012.safetensors", b);
    meta(pa, ma);
    meta(pb, mb);
    CHECK(strcmp(ma[0], "f16") == 0, "checkpoint precision '%s'", ma[0]);
    CHECK(atol(ma[3]) == skipped && atof(ma[1]) == scale,
          "checkpoint loss scale %s, %s skipped; the progress said %g, %ld", ma[1], ma[3], scale,
          skipped);
    for (int k = 0; k < 4; k++)
        CHECK(strcmp(ma[k], mb[k]) == 0, "resumed run's metadata %d: '%s' vs '%s'", k, mb[k],
              ma[k]);
    unsigned char *ba = NULL, *bb = NULL;
    size_t na = 0, nb = 0;
    CHECK((ba = tt_checkpoint_bytes(pa, &na)) && (bb = tt_checkpoint_bytes(pb, &nb)), "final checkpoints");
    CHECK(na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "the resumed f16 run's weights/EMA/AdamW differ from the uninterrupted run");
    free(ba);
    free(bb);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_prec_resume");
}
