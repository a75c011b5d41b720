/* test_unet_util.h - the small UNets the plan, precision and GPU step tests build: both presets
 * at 16x16 (ddpm: 1 channel, 3 levels of 16/24/24 channels, attention at 8 px with head dim 8;
 * seed: base 8, time dim 32), fast to build, plan and run, with every op kind of the full model.
 */
#ifndef DDPMD_TEST_UNET_UTIL_H
#define DDPMD_TEST_UNET_UTIL_H

#include "unet.h"

static inline void tu_small_unet(struct unet_config *c, enum unet_preset preset)
{
    unet_config_default(c, preset);
    c->image_size = 16;
    if (preset == UNET_DDPM) {
        c->in_channels = c->out_channels = 1;
        c->n_levels = 3;
        c->channels[0] = 16;
        c->channels[1] = c->channels[2] = 24;
        c->layers_per_block = 1;
        c->attn_res[0] = 8;
        c->groups = 8;
        c->attn_head_dim = 8;
    } else {
        c->base = 8;
        c->time_dim = 32;
    }
}

#endif
