/* test_train_util.h - what the training tests share: a folder of generated PNGs, the tiny ddpm
 * spec they train, and a checkpoint's tensor bytes for bit-for-bit comparisons. Header-only,
 * included by test_train, test_train_reserve, test_accum_train and test_prec_resume.
 */
#ifndef DDPMD_TEST_TRAIN_UTIL_H
#define DDPMD_TEST_TRAIN_UTIL_H

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image.h"
#include "philox.h"
#include "safetensors.h"
#include "spec.h"

/* 24 grey 16x16 images: a bright disc at a random place on a dark background */
static inline void tt_make_discs(const char *dir)
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

/* a 1-channel 16x16 ddpm UNet (2 levels of 16 and 32 channels, attention at 8 px) trained on
 * data for `steps` steps at batch 4, 2 threads, a checkpoint every 2 steps (the last 2 kept), no
 * sample grids; no dropout, flips or validation (the spec's and preset's defaults) */
static inline void tt_tiny_spec(struct train_spec *s, const char *data, int steps)
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
    snprintf(s->dataset, sizeof s->dataset, "%s", data);
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

/* every tensor's bytes of a checkpoint, concatenated (malloc'd; *n bytes); NULL if unreadable */
static inline unsigned char *tt_checkpoint_bytes(const char *path, size_t *n)
{
    struct safetensors *st;
    char err[256];
    *n = 0;
    if (safetensors_open(&st, path, err, sizeof err)) return NULL;
    size_t total = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        total += t->nbytes;
    }
    unsigned char *buf = malloc(total + 1);
    size_t off = 0;
    for (size_t i = 0; buf && i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        memcpy(buf + off, t->data, t->nbytes);
        off += t->nbytes;
    }
    *n = total;
    safetensors_free(st);
    return buf;
}

#endif
