/* test_unet.c - the presets at full size: parameter counts and names of the published models,
 * shapes through the graph, and clear errors for configurations that cannot be built.
 */
#include <string.h>

#include "test_util.h"
#include "unet.h"

static size_t build(const struct unet_config *c, int batch, struct graph *g, struct unet_io *io)
{
    graph_init(g);
    unet_build(g, c, batch, io);
    return g->status ? 0 : g->param_numel;
}

int main(void)
{
    struct unet_config c;
    struct graph g;
    struct unet_io io;

    /* google/ddpm-cifar10-32 through diffusers' UNet2DModel: 35,746,307 parameters */
    unet_config_default(&c, UNET_DDPM);
    size_t n = build(&c, 2, &g, &io);
    CHECK(n == 35746307, "ddpm-cifar10 has %zu parameters", n);
    CHECK(g.n_params == 328, "ddpm-cifar10 has %d parameter tensors", g.n_params);
    const char *names[] = {"conv_in.weight", "time_embedding.linear_1.weight",
                           "down_blocks.0.resnets.0.conv1.weight",
                           "down_blocks.1.attentions.1.to_q.weight",
                           "down_blocks.0.downsamplers.0.conv.weight",
                           "mid_block.attentions.0.to_out.0.bias",
                           "up_blocks.2.attentions.2.group_norm.weight",
                           "up_blocks.3.resnets.2.conv_shortcut.weight", "conv_out.bias"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        CHECK(graph_find_param(&g, names[i]) >= 0, "ddpm: no parameter %s", names[i]);
    CHECK(graph_find_param(&g, "down_blocks.3.downsamplers.0.conv.weight") < 0,
          "ddpm: the last level has no downsampler");
    const struct tensor *out = g.tensors[io.out];
    CHECK(out->d[0] == 2 && out->d[1] == 3 && out->d[2] == 32 && out->d[3] == 32,
          "ddpm output (%d,%d,%d,%d)", out->d[0], out->d[1], out->d[2], out->d[3]);
    graph_free(&g);

    /* the user's model: Diffusion-Models-pytorch UNet at 64x64 RGB, about 23.3M parameters */
    unet_config_default(&c, UNET_SEED);
    n = build(&c, 8, &g, &io);
    CHECK(n == 23332739, "seed has %zu parameters", n);
    const char *seed_names[] = {"inc.double_conv.0.weight", "down1.maxpool_conv.1.double_conv.0.weight",
                                "down1.emb_layer.1.weight", "sa1.mha.in_proj_weight",
                                "sa6.ff_self.3.bias", "bot2.double_conv.4.weight",
                                "up3.conv.1.double_conv.3.weight", "outc.bias"};
    for (size_t i = 0; i < sizeof seed_names / sizeof *seed_names; i++)
        CHECK(graph_find_param(&g, seed_names[i]) >= 0, "seed: no parameter %s", seed_names[i]);
    int w = graph_find_param(&g, "sa1.mha.in_proj_weight");
    CHECK(w >= 0 && g.tensors[w]->d[0] == 384 && g.tensors[w]->d[1] == 128, "sa1 in_proj shape");
    CHECK(graph_find_param(&g, "inc.double_conv.0.bias") < 0, "seed convs have no bias");
    /* attention at 32, 16, 8, 16, 32 and 64 px: 4096 tokens in sa6 */
    int max_tokens = 0;
    for (int k = 0; k < g.n_ops; k++)
        if (g.ops[k].type == OP_ATTENTION && g.ops[k].a.at.s.l > max_tokens)
            max_tokens = g.ops[k].a.at.s.l;
    CHECK(max_tokens == 4096, "seed's largest attention has %d tokens", max_tokens);
    graph_free(&g);

    /* configurations that cannot be built say why */
    unet_config_default(&c, UNET_DDPM);
    c.channels[1] = 250; /* not divisible by 32 groups */
    CHECK(build(&c, 1, &g, &io) == 0 && strstr(g.err, "groups"), "bad groups: '%s'", g.err);
    graph_free(&g);
    unet_config_default(&c, UNET_DDPM);
    c.image_size = 36; /* 4 levels need a multiple of 8 */
    CHECK(build(&c, 1, &g, &io) == 0 && strstr(g.err, "divisible"), "bad size: '%s'", g.err);
    graph_free(&g);
    unet_config_default(&c, UNET_SEED);
    c.image_size = 60;
    CHECK(build(&c, 1, &g, &io) == 0 && strstr(g.err, "multiple of 8"), "bad size: '%s'", g.err);
    graph_free(&g);
    return tu_finish("test_unet");
}
