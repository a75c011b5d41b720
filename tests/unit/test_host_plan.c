/* test_host_plan.c - the pool's admission and the job agree to the byte on every host byte a job
 * holds beside its device plan: admission_fit_train's host parts (train_host_plan) equal, part by
 * part, what the run counts of its own buffers and transients (train_stats.host), for Fashion-MNIST
 * padded and resized to RGB and for an uploaded PNG folder (as float, and as its bytes once its
 * upload counted them); and the reservation's host_data is their peak over the job's phases.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admission.h"
#include "dataset.h"
#include "test_train_util.h"
#include "test_util.h"
#include "train.h"

static char g_dir[64];

/* a small ddpm UNet of c channels at size px on data: validation, grids, checkpoints, logs */
static void small_spec(struct train_spec *s, const char *data, int c, int size, int resize)
{
    spec_defaults(s);
    unet_config_default(&s->model, UNET_DDPM);
    s->model.in_channels = s->model.out_channels = c;
    s->model.image_size = size;
    s->model.n_levels = 2;
    s->model.channels[0] = 16;
    s->model.channels[1] = 32;
    s->model.layers_per_block = 1;
    s->model.n_attn = 0;
    s->model.groups = 8;
    snprintf(s->dataset, sizeof s->dataset, "%s", data);
    s->fmnist_resize = resize;
    s->validation = 8;
    s->batch = 4;
    s->steps = 3;
    s->optim.total_steps = 3;
    s->checkpoint_every = 2;
    s->sample_every = 2;
    s->log_every = 1;
    s->keep_last = 1;
    s->samples = 4;
    s->threads = 1;
    s->timesteps = 50;
}

/* admission on a cpu device against the job run with its strategy: part by part */
static void agree(const char *what, const struct train_spec *spec)
{
    struct pool_device_config dev = {.name = "cpu", .budget_bytes = (int64_t)64 << 30,
                                      .cost_scale = 1};
    struct cost_model m;
    struct pool_fit f;
    cJSON *entry = NULL;
    char err[512] = "", out[256];
    cost_model_default(&m);
    int rc = admission_fit_train(&dev, &m, spec, spec->threads, &f, &entry, err, sizeof err);
    CHECK(rc == POOL_OK && f.fits, "%s: admission: %s", what, err);
    cJSON_Delete(entry);
    if (rc != POOL_OK) return;
    snprintf(out, sizeof out, "%s/%s", g_dir, what);
    struct train_stats stats;
    struct train_opts o = {.out_dir = out, .quiet = 1, .stats = &stats, .strategy = &f.strategy};
    struct train_spec s = *spec;
    s.vram_budget = f.vram_budget;
    rc = train_run(&s, &o, err, sizeof err);
    CHECK(rc == TRAIN_DONE, "%s: train_run: %s", what, err);
    int same = 1;
    for (int k = 0; k < TRAIN_HOST_PART_COUNT; k++) {
        const char *name = train_plans_host_part_name((enum train_host_part)k);
        printf("  %-10s %-10s admission %10lld  job %10lld\n", what, name,
               (long long)f.host.part[k], (long long)stats.host.part[k]);
        if (f.host.part[k] != stats.host.part[k]) same = 0;
        CHECK(f.host.part[k] == stats.host.part[k], "%s: %s: admission counts %lld bytes, the job "
              "%lld", what, name, (long long)f.host.part[k], (long long)stats.host.part[k]);
    }
    CHECK(!same || f.host_data == train_plans_host_peak(&stats.host),
          "%s: host_data %lld is not the parts' peak", what, (long long)f.host_data);
    /* every part the run has is counted: data, its loader, the step, a checkpoint, a grid */
    CHECK(stats.host.part[TRAIN_HOST_DATA] > 0 && stats.host.part[TRAIN_HOST_LOADER] > 0 &&
              stats.host.part[TRAIN_HOST_STEP] > 0 && stats.host.part[TRAIN_HOST_CHECKPOINT] > 0 &&
              stats.host.part[TRAIN_HOST_GRID] > 0 && stats.host.part[TRAIN_HOST_LOG] > 0,
          "%s: a part the run holds counted as none", what);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/test_host_plan.XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    struct train_spec s;
    struct stat st;
    char up[128], images[160], meta[200];
    /* an uploaded folder: its images/ and the dataset.json upload.c writes (count, sizes) */
    snprintf(up, sizeof up, "%s/ds", g_dir);
    snprintf(images, sizeof images, "%s/images", up);
    mkdir(up, 0755);
    tt_make_discs(images);
    snprintf(meta, sizeof meta, "%s/dataset.json", up);
    FILE *f = fopen(meta, "w");
    if (f) {
        fprintf(f, "{\"images\":24,\"sizes\":{\"min_width\":16,\"max_width\":16,"
                   "\"min_height\":16,\"max_height\":16}}");
        fclose(f);
    }
    small_spec(&s, images, 1, 16, 0);
    agree("folder", &s);
    /* the same folder as a finished upload records it (its samples counted, 24 x 16 x 16 bytes
     * of 8-bit grey): held as those bytes, fewer than its floats */
    snprintf(up, sizeof up, "%s/ds-bytes", g_dir);
    snprintf(images, sizeof images, "%s/images", up);
    mkdir(up, 0755);
    tt_make_discs(images);
    snprintf(meta, sizeof meta, "%s/dataset.json", up);
    if ((f = fopen(meta, "w"))) {
        fprintf(f, "{\"images\":24,\"sizes\":{\"min_width\":16,\"max_width\":16,"
                   "\"min_height\":16,\"max_height\":16},\"source_bytes\":6144}");
        fclose(f);
    }
    small_spec(&s, images, 1, 16, 0);
    agree("folder-bytes", &s);
    /* the job left the folder's decoded copy: the next maps it, counted the same */
    char copy[200];
    snprintf(copy, sizeof copy, "%s/samples.bin", up);
    CHECK(stat(copy, &st) == 0, "no decoded copy at %s", copy);
    agree("folder-mapped", &s);
    CHECK(dataset_plan_bytes(0, 24, 1, 16, 256, 6144) < dataset_plan_bytes(0, 24, 1, 16, 256, -1),
          "the upload's folder is not held as bytes");
    /* the same images in a folder named by path (no dataset.json, as `ddpmd train` takes one):
     * its PNG headers give the upload's figures, so it is held and planned as those bytes, and
     * nothing is written beside it (no decoded copy: it is no upload) */
    snprintf(up, sizeof up, "%s/by-path", g_dir);
    snprintf(images, sizeof images, "%s/images", up);
    mkdir(up, 0755);
    tt_make_discs(images);
    int64_t n = 0, src = 0, mp = 0;
    CHECK(dataset_folder_probe(images, &n, &src, &mp, meta, sizeof meta) == DATASET_OK &&
              n == 24 && src == 6144 && mp == 256,
          "the folder's probe: %lld images, %lld bytes, %lld pixels (%s)", (long long)n,
          (long long)src, (long long)mp, meta);
    small_spec(&s, images, 1, 16, 0);
    struct train_host by_path, by_upload;
    CHECK(train_host_plan(&s, -1, -1, &by_path, meta, sizeof meta) == 0, "plan: %s", meta);
    snprintf(s.dataset, sizeof s.dataset, "%s/ds-bytes/images", g_dir);
    CHECK(train_host_plan(&s, -1, -1, &by_upload, meta, sizeof meta) == 0, "plan: %s", meta);
    CHECK(by_path.part[TRAIN_HOST_DATA] == by_upload.part[TRAIN_HOST_DATA] &&
              by_path.part[TRAIN_HOST_DATA_LOAD] == by_upload.part[TRAIN_HOST_DATA_LOAD],
          "the path folder's data part %lld + %lld, the upload's %lld + %lld",
          (long long)by_path.part[TRAIN_HOST_DATA], (long long)by_path.part[TRAIN_HOST_DATA_LOAD],
          (long long)by_upload.part[TRAIN_HOST_DATA],
          (long long)by_upload.part[TRAIN_HOST_DATA_LOAD]);
    small_spec(&s, images, 1, 16, 0);
    agree("folder-path", &s);
    snprintf(copy, sizeof copy, "%s/samples.bin", up);
    CHECK(stat(copy, &st) != 0, "a decoded copy written beside a folder named by path");
    if (stat(DATASET_FMNIST_DIR "/train-images-idx3-ubyte.gz", &st) == 0) {
        small_spec(&s, "fashion-mnist", 1, 32, 0);
        agree("fmnist", &s);
        small_spec(&s, "fashion-mnist", 3, 24, 1);
        agree("fmnist-rgb", &s);
    } else {
        printf("  no Fashion-MNIST training set: only the folder checked\n");
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) printf("  could not remove %s\n", g_dir);
    return tu_finish("test_host_plan");
}
