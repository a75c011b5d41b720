/* test_train.c - training end to end on a generated PNG folder: the loss falls; resume is exact
 * (2N steps == N steps, a stop with a checkpoint, N resumed steps: bit-identical weights, EMA
 * and AdamW state, with flip and dropout on); a stop request writes a checkpoint; checkpoints
 * keep the last K; sampling from a checkpoint is deterministic and batch-independent (to
 * float rounding).
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
#include "sample.h"
#include "test_util.h"
#include "train.h"

static char root[256];

/* 24 grey 16x16 images: a bright disc at a random place on a dark background */
static void make_folder(const char *dir)
{
    mkdir(dir, 0755);
    float img[16 * 16];
    char path[512], err[256];
    for (int i = 0; i < 24; i++) {
        float cx = 3 + 10 * philox_uniform_at(9, 1, 0, (uint32_t)i, 0, 0);
        float cy = 3 + 10 * philox_uniform_at(9, 1, 0, (uint32_t)i, 0, 1);
        for (int y = 0; y < 16; y++)
            for (int x = 0; x < 16; x++)
                img[y * 16 + x] = (x - cx) * (x - cx) + (y - cy) * (y - cy) < 12 ? 0.9f : -0.9f;
        snprintf(path, sizeof path, "%s/img%02d.png", dir, i);
        image_save_png(path, img, 1, 16, 16, err, sizeof err);
    }
}

static void tiny_spec(struct train_spec *s, const char *data, int steps)
{
    spec_defaults(s);
    unet_config_default(&s->model, UNET_DDPM);
    s->model.in_channels = s->model.out_channels = 1;
    s->model.image_size = 16;
    s->model.n_levels = 2;
    s->model.channels[0] = 16;
    s->model.channels[1] = 32;
    s->model.layers_per_block = 1;
    s->model.attn_res[0] = 8;
    s->model.groups = 8;
    s->model.dropout = 0.1f;
    snprintf(s->dataset, sizeof s->dataset, "%s", data);
    s->flip = 1;
    s->validation = 8;
    s->batch = 4;
    s->steps = steps;
    s->optim.lr = 1e-3f;
    s->optim.warmup = 2;
    s->optim.total_steps = steps;
    s->optim.ema_decay = 0.9f;
    s->checkpoint_every = 2;
    s->sample_every = 0;
    s->log_every = 1;
    s->keep_last = 2;
    s->samples = 4;
    s->threads = 2;
}

static int read_all(const char *path, unsigned char **buf, size_t *n)
{
    struct safetensors *st;
    char err[256];
    if (safetensors_open(&st, path, err, sizeof err)) return -1;
    size_t total = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        total += t->nbytes;
    }
    *buf = malloc(total + 1);
    size_t off = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        memcpy(*buf + off, t->data, t->nbytes);
        off += t->nbytes;
    }
    *n = total;
    safetensors_free(st);
    return 0;
}

static int count_checkpoints(const char *out)
{
    int n = 0;
    char p[512];
    for (int s = 0; s <= 64; s++) {
        snprintf(p, sizeof p, "%s/checkpoints/step-%08d.safetensors", out, s);
        n += access(p, F_OK) == 0;
    }
    return n;
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ddpmd-test-train-XXXXXX");
    if (!mkdtemp(root)) return 1;
    char data[300], a[300], b[300], err[512];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    make_folder(data);

    /* exact resume: 6 steps straight vs 3 steps, stop, resume 3 more */
    struct train_spec s;
    tiny_spec(&s, data, 6);
    struct train_opts o = {.out_dir = a, .quiet = 1};
    CHECK(train_run(&s, &o, err, sizeof err) == TRAIN_DONE, "straight run: %s", err);
    struct train_opts ob = {.out_dir = b, .quiet = 1, .stop_after = 3};
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_STOPPED, "stopped run: %s", err);
    char p3[400];
    snprintf(p3, sizeof p3, "%s/checkpoints/step-00000003.safetensors", b);
    CHECK(access(p3, F_OK) == 0, "a stop writes a checkpoint at the stop step");
    ob.stop_after = 0;
    ob.resume = 1;
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_DONE, "resumed run: %s", err);
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-00000006.safetensors", a);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000006.safetensors", b);
    unsigned char *ba = NULL, *bb = NULL;
    size_t na = 0, nb = 0;
    CHECK(read_all(pa, &ba, &na) == 0 && read_all(pb, &bb, &nb) == 0, "final checkpoints");
    CHECK(na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "resumed weights/EMA/AdamW differ from the uninterrupted run");
    free(ba);
    free(bb);
    CHECK(count_checkpoints(a) == 2, "keep_last 2 keeps %d checkpoints", count_checkpoints(a));
    char csv[400];
    snprintf(csv, sizeof csv, "%s/loss.csv", b);
    FILE *f = fopen(csv, "r");
    int rows = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f)) rows++;
    if (f) fclose(f);
    CHECK(rows == 7, "resumed loss.csv has %d rows (header + 6 steps)", rows);

    /* resuming with a different model is refused with a reason */
    struct train_spec other = s;
    other.model.channels[1] = 48;
    ob.resume = 1;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_FAILED && strstr(err, "different"),
          "a mismatched resume: '%s'", err);

    /* sampling from a checkpoint: deterministic, independent of the batch */
    struct safetensors *st = NULL;
    struct train_spec ss;
    CHECK(checkpoint_open(&st, pa, &ss, NULL, err, sizeof err) == 0, "open: %s", err);
    struct ddpm_schedule sch;
    ddpm_schedule_init(&sch, ss.timesteps, ss.beta_schedule, ss.beta_start, ss.beta_end);
    struct sampler_config sc;
    sampler_config_default(&sc);
    sc.steps = 10;
    float img1[4 * 256], img2[4 * 256];
    struct sample_job j1, j2;
    CHECK(sample_job_init(&j1, &ss.model, 4, 2, err, sizeof err) == 0 &&
              sample_job_load(&j1, st, 1, err, sizeof err) == 0 &&
              sample_job_run(&j1, &sch, &sc, 7, 4, img1, NULL, NULL) == 0,
          "sample batch 4: %s", err);
    CHECK(sample_job_init(&j2, &ss.model, 3, 2, err, sizeof err) == 0 &&
              sample_job_load(&j2, st, 1, err, sizeof err) == 0 &&
              sample_job_run(&j2, &sch, &sc, 7, 4, img2, NULL, NULL) == 0,
          "sample batch 3: %s", err);
    double d = 0;
    for (int i = 0; i < 4 * 256; i++) d = fmax(d, fabs(img1[i] - img2[i]));
    /* the same noise per image whatever the batch; only GEMM blocking (rounding) differs */
    CHECK(d < 1e-3, "samples depend on the batch: max diff %g", d);
    sample_job_free(&j1);
    sample_job_free(&j2);
    ddpm_schedule_free(&sch);
    safetensors_free(st);

    /* a short run whose loss falls: 60 steps, mean of the last 10 logged losses well below the
     * first 10 */
    char c[300];
    snprintf(c, sizeof c, "%s/c", root);
    tiny_spec(&s, data, 60);
    s.model.dropout = 0;
    s.checkpoint_every = 0;
    s.optim.lr = 2e-3f;
    s.optim.warmup = 5;
    struct train_opts oc = {.out_dir = c, .quiet = 1};
    CHECK(train_run(&s, &oc, err, sizeof err) == TRAIN_DONE, "loss run: %s", err);
    snprintf(csv, sizeof csv, "%s/loss.csv", c);
    f = fopen(csv, "r");
    float losses[128];
    int nl = 0;
    while (f && fgets(line, sizeof line, f) && nl < 128) {
        long long st_;
        float l;
        if (sscanf(line, "%lld,%f", &st_, &l) == 2) losses[nl++] = l;
    }
    if (f) fclose(f);
    double first = 0, last = 0;
    for (int i = 0; i < 10 && nl >= 20; i++) {
        first += losses[i] / 10;
        last += losses[nl - 10 + i] / 10;
    }
    printf("loss: first 10 steps %.4f, last 10 steps %.4f (%d logged)\n", first, last, nl);
    CHECK(nl == 60 && last < 0.6 * first, "the loss does not fall: %.4f -> %.4f", first, last);
    char png[400];
    snprintf(png, sizeof png, "%s/loss.png", c);
    CHECK(access(png, F_OK) == 0, "no loss curve");

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_train");
}
