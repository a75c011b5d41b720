/* unet.h - the UNet builder and its two presets: `ddpm` (diffusers' UNet2DModel, its parameter
 * names and semantics) and `seed` (the UNet of the widely copied Diffusion-Models-pytorch
 * script, its state_dict names), appended to a graph at a fixed micro-batch size.
 */
#ifndef DDPMD_UNET_H
#define DDPMD_UNET_H

#include <stdint.h>

#include "graph.h"

enum unet_preset { UNET_DDPM = 0, UNET_SEED = 1 };

#define UNET_MAX_LEVELS 8
/* ddpm resnets per level (the spec allows 8): bounds the builder's skip list */
#define UNET_MAX_LAYERS 64
/* the largest width, image size and time dimension a config may name: keeps every int the
 * builders compute (4 * channels, fan-ins, H * W) far from overflow; whether such a model fits
 * anywhere is the graph's and the planner's question (shapes are bounded there) */
#define UNET_MAX_CHANNELS (1 << 20)
#define UNET_MAX_IMAGE_SIZE 16384

/* the most channels one group-norm group may span (the CPU kernels' channel block) */
#define UNET_MAX_GROUP_CHANNELS 1024

struct unet_config {
    enum unet_preset preset;
    int in_channels, out_channels, image_size;

    /* ddpm */
    int n_levels;
    int channels[UNET_MAX_LEVELS];   /* block_out_channels */
    int layers_per_block;
    int n_attn;
    int attn_res[UNET_MAX_LEVELS];   /* resolutions (pixels) with attention blocks */
    int groups;                      /* norm_num_groups */
    float norm_eps;
    int attn_head_dim;               /* 0: one head over all channels (diffusers' None) */
    float dropout;
    int flip_sin_to_cos;
    float freq_shift;

    /* seed */
    int base;                        /* width of the first block (64 in the script) */
    int time_dim;                    /* 256 in the script */
    int heads;                       /* 4 in the script */

    /* engine */
    int attn_tiled;                  /* 1: FlashAttention-style kernels, 0: plain,
                                      * -1 (default): plain where its L x L probabilities
                                      * are small (see unet.c attn_form) */
};

/* google/ddpm-cifar10-32 (ddpm) or the script's 64x64 RGB model (seed) */
void unet_config_default(struct unet_config *c, enum unet_preset preset);
/* 0 when the config can be built; otherwise a message in err. Every config it accepts builds
 * without overflow or division by zero (shapes too large for the graph are refused there). */
int unet_config_check(const struct unet_config *c, char *err, size_t errlen);

struct unet_io {
    int x;    /* input (N, in_channels, S, S) */
    int t;    /* timesteps (N), float */
    int out;  /* prediction (N, out_channels, S, S) */
};

/* appends the model's forward ops; returns g->status */
int unet_build(struct graph *g, const struct unet_config *c, int batch, struct unet_io *io);

/* the training graph of a job: the model, a "target" input shaped like x, the MSE between the
 * prediction and it, and the backward; target and loss (may be NULL) get their tensor ids.
 * Returns g->status. */
int unet_build_training(struct graph *g, const struct unet_config *c, int batch,
                        struct unet_io *io, int *target, int *loss);

#endif
