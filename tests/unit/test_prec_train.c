/* test_prec_train: the precision proof. fmnist-tiny (examples/fmnist-tiny.json's model:
 * ddpm preset, 1 channel, 32x32, widths 32/64/64, one resnet per level, attention at 8 px) trained
 * by train_run on Fashion-MNIST for 200 steps in f32, bf16 and f16 (dynamic loss scaling at its
 * defaults) from the same initialisation, data order, timesteps and noise: the mean training loss
 * over steps 151-200 of bf16 and of f16 is within 3% of f32's. To fit CI the batch is 4 (the
 * example's is 32) on one thread (about 45 CPU-seconds in all). Skipped (77) without the
 * Fashion-MNIST training set. What it catches: a 16-bit path that computes wrongly (stale or
 * unconverted working weights: +968%); not the subtle ones (bf16 stores truncated instead of
 * rounded to nearest even: +1.2%; f16 without loss scaling: -0.2%), which the kernel tests
 * (test_ops_half, test_convert) and test_prec's step comparisons are for.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "spec.h"
#include "test_util.h"
#include "train.h"

#define STEPS 200
#define FROM 151 /* the mean is over steps FROM..STEPS */
#define BATCH 4
#define TOL 0.03

static void fmnist_tiny(struct train_spec *s, int precision)
{
    spec_defaults(s);
    unet_config_default(&s->model, UNET_DDPM);
    s->model.in_channels = s->model.out_channels = 1;
    s->model.image_size = 32;
    s->model.n_levels = 3;
    s->model.channels[0] = 32;
    s->model.channels[1] = s->model.channels[2] = 64;
    s->model.layers_per_block = 1;
    s->model.attn_res[0] = 8;
    s->model.groups = 8;
    snprintf(s->dataset, sizeof s->dataset, "fashion-mnist");
    s->batch = BATCH;
    s->steps = STEPS;
    s->optim.lr = 5e-4f;
    s->optim.warmup = 100;
    s->optim.total_steps = STEPS;
    s->optim.clip = 1.0f;
    s->optim.ema_decay = 0.98f;
    s->seed = 1;
    s->threads = 1;
    s->checkpoint_every = 0;
    s->sample_every = 0;
    s->log_every = 1;
    s->keep_last = 1;
    s->strategy.precision = precision;
}

/* the mean of loss.csv's losses of steps FROM..STEPS in dir; NAN unless all are there */
static double mean_loss(const char *dir)
{
    char path[700], line[256];
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    double sum = 0;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        long long step;
        double loss;
        if (sscanf(line, "%lld,%lf", &step, &loss) == 2 && step >= FROM && step <= STEPS) {
            sum += loss;
            n++;
        }
    }
    fclose(f);
    return n == STEPS - FROM + 1 ? sum / n : NAN;
}

int main(void)
{
    char probe[512];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", DATASET_FMNIST_DIR);
    if (access(probe, R_OK) != 0) {
        printf("test_prec_train: no Fashion-MNIST at %s: skipped\n", DATASET_FMNIST_DIR);
        return 77;
    }
    char root[] = "/tmp/test_prec_train_XXXXXX";
    if (!mkdtemp(root)) return 1;
    const int precs[3] = {STRATEGY_PRECISION_F32, STRATEGY_PRECISION_BF16,
                          STRATEGY_PRECISION_F16};
    const char *names[3] = {"f32", "bf16", "f16"};
    double mean[3];
    for (int i = 0; i < 3; i++) {
        struct train_spec s;
        fmnist_tiny(&s, precs[i]);
        struct strategy st = strategy_plain(BATCH);
        st.precision = precs[i];
        char out[600], err[512] = "";
        snprintf(out, sizeof out, "%s/%s", root, names[i]);
        /* stopping at the last step: its checkpoint writes loss.csv, and no sample grid is
         * drawn (minutes of denoising) */
        struct train_opts o = {.out_dir = out, .quiet = 1, .stop_after = STEPS, .strategy = &st};
        int rc = train_run(&s, &o, err, sizeof err);
        CHECK(rc == TRAIN_STOPPED || rc == TRAIN_DONE, "%s run: %s", names[i], err);
        mean[i] = mean_loss(out);
        CHECK(isfinite(mean[i]), "%s: no loss for each of steps %d-%d", names[i], FROM, STEPS);
    }
    for (int i = 1; i < 3; i++) {
        double rel = fabs(mean[i] - mean[0]) / mean[0];
        printf("fmnist-tiny b%d, mean loss over steps %d-%d: f32 %.5f, %s %.5f (%+.2f%%)\n",
               BATCH, FROM, STEPS, mean[0], names[i], mean[i], 100.0 * (mean[i] - mean[0]) /
               mean[0]);
        CHECK(rel <= TOL, "%s's mean loss %.5f is %.2f%% from f32's %.5f (at most %.0f%%)",
              names[i], mean[i], 100.0 * rel, mean[0], 100.0 * TOL);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_prec_train");
}
