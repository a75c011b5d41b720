/* test_unet.c - the presets at full size: parameter counts and names of the published models,
 * shapes through the graph, clear errors for configurations that cannot be built, and the
 * spec's extreme corners: each builds and plans, or is refused with an error, never crashes.
 */
#include <string.h>

#include "memplan.h"
#include "spec.h"
#include "test_util.h"
#include "unet.h"

enum outcome { BUILT = 1, REFUSED = 2, ANY = 3 };
static int n_built, n_refused;

/* the training graph and its plan (no allocation, no execution) of config c at batch; returns
 * BUILT or REFUSED, and checks that a refusal says why */
static int try_build(const char *what, const struct unet_config *c, int batch)
{
    struct graph g;
    struct unet_io io;
    struct plan p;
    int target = -1, loss = -1, r = REFUSED;
    graph_init(&g);
    if (unet_build_training(&g, c, batch, &io, &target, &loss) == 0) {
        CHECK(target >= 0 && loss >= 0 && g.n_ops > g.n_fwd_ops, "%s: no training graph", what);
        int rc = plan_make(&p, &g, backend_cpu(), NULL);
        if (rc == 0) {
            CHECK(p.total_bytes >= p.arena_bytes && p.arena_bytes > 0, "%s: plan of %zu bytes",
                  what, p.total_bytes);
            r = BUILT;
        }
        plan_free(&p);
    } else {
        CHECK(g.err[0] != 0, "%s: refused without a message", what);
    }
    graph_free(&g);
    return r;
}

/* a spec with this model object (no braces) and batch: refused by spec_parse, or built */
static void corner(const char *model, int batch, int expect)
{
    char json[1024], what[1100];
    snprintf(json, sizeof json,
             "{\"model\":{%s},\"data\":{\"dataset\":\"images\"},"
             "\"train\":{\"batch\":%d,\"steps\":1}}",
             model, batch);
    snprintf(what, sizeof what, "{%s} batch %d", model, batch);
    struct train_spec s;
    struct spec_errors E;
    int r;
    if (spec_parse(json, &s, &E)) {
        CHECK(E.n > 0 && E.e[0].msg[0], "%s: refused without a message", what);
        r = REFUSED;
    } else {
        r = try_build(what, &s.model, s.batch);
        if (r == BUILT && s.model.preset == UNET_SEED) {
            s.model.attn_tiled = 0; /* --plain-attention: L x L probabilities everywhere */
            try_build(what, &s.model, s.batch);
        }
    }
    CHECK(r & expect, "%s: %s", what, r == BUILT ? "built" : "refused");
    if (r == BUILT) n_built++;
    else n_refused++;
}

/* every corner of the spec's ranges (server/spec.c), alone and together */
static void spec_corners(void)
{
    static const struct { const char *model; int batch, expect; } ddpm[] = {
        /* minima */
        {"\"preset\":\"ddpm\",\"image_size\":8,\"in_channels\":1,\"block_out_channels\":[2],"
         "\"layers_per_block\":1,\"norm_num_groups\":1,\"attention_resolutions\":[],"
         "\"attention_head_dim\":1,\"norm_eps\":1e-30,\"freq_shift\":0", 1, BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[1],"
         "\"norm_num_groups\":1", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[2],"
         "\"norm_num_groups\":1,\"freq_shift\":1", 1, REFUSED}, /* an empty frequency table */
        {"\"preset\":\"ddpm\",\"norm_eps\":1e-50", 1, REFUSED}, /* 0 as a float */
        /* the crashes: 8 levels x 8 layers (72 skips), at 128 px with 8 groups */
        {"\"preset\":\"ddpm\",\"image_size\":128,\"block_out_channels\":[8,8,8,8,8,8,8,8],"
         "\"layers_per_block\":8,\"norm_num_groups\":8,\"attention_resolutions\":[16]", 1,
         BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":128,\"block_out_channels\":[8,8,8,8,8,8,8,8],"
         "\"layers_per_block\":8,\"norm_num_groups\":8,"
         "\"attention_resolutions\":[1,2,4,8,16,32,64,128],\"attention_head_dim\":1,"
         "\"dropout\":0.99,\"flip_sin_to_cos\":true", 2, BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"block_out_channels\":[8,8,8,8,8,8,8,8],"
         "\"layers_per_block\":8,\"norm_num_groups\":8,\"attention_resolutions\":[8]", 1,
         BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":64,\"block_out_channels\":[8,16],"
         "\"layers_per_block\":8,\"norm_num_groups\":8", 1, BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[8,8,8,8,8,8,8,8],"
         "\"norm_num_groups\":8", 1, REFUSED}, /* 8 px cannot halve 7 times */
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"block_out_channels\":[8,8,8,8,8,8,8,8,8],"
         "\"norm_num_groups\":8", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"layers_per_block\":9", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"layers_per_block\":0", 1, REFUSED},
        /* groups and widths */
        {"\"preset\":\"ddpm\",\"norm_num_groups\":0", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[1024],"
         "\"norm_num_groups\":1024", 1, BUILT},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[2048],"
         "\"norm_num_groups\":1", 1, REFUSED}, /* 2048 channels in one group */
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[999424],"
         "\"norm_num_groups\":1024", 1, ANY},
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"in_channels\":4,"
         "\"block_out_channels\":[999424,999424,999424,999424,999424,999424,999424,999424],"
         "\"layers_per_block\":8,\"norm_num_groups\":1024,"
         "\"attention_resolutions\":[8,16,32,64,128,256,512,1024],\"attention_head_dim\":1",
         65535, ANY},
        {"\"preset\":\"ddpm\",\"image_size\":8,\"block_out_channels\":[1000000],"
         "\"norm_num_groups\":1000", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"block_out_channels\":[1000001]", 1, REFUSED},
        /* heads */
        {"\"preset\":\"ddpm\",\"attention_head_dim\":4096", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"image_size\":16,\"block_out_channels\":[4096,4096],"
         "\"norm_num_groups\":4,\"attention_resolutions\":[16,8],\"attention_head_dim\":4096",
         1, ANY},
        {"\"preset\":\"ddpm\",\"attention_head_dim\":null,"
         "\"attention_resolutions\":[32,16,8,4]", 2, BUILT},
        /* images and batches */
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"in_channels\":4,"
         "\"attention_resolutions\":[1024,512,256,128]", 65535, ANY},
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"block_out_channels\":[2],"
         "\"norm_num_groups\":1,\"attention_resolutions\":[1024],\"freq_shift\":0", 65535, ANY},
        /* attention over 1024 x 1024 tokens: past the spec's work bound (SPEC_ATTN_TOKENS_MAX) */
        {"\"preset\":\"ddpm\",\"image_size\":1024,\"block_out_channels\":[2],"
         "\"norm_num_groups\":2,\"attention_resolutions\":[1024],\"freq_shift\":0", 1, REFUSED},
        {"\"preset\":\"ddpm\",\"image_size\":1025", 1, REFUSED},
        {"\"preset\":\"ddpm\"", 0, REFUSED},
        {"\"preset\":\"ddpm\"", 65536, REFUSED},
    };
    static const struct { const char *model; int batch, expect; } seed[] = {
        {"\"preset\":\"seed\",\"image_size\":8,\"in_channels\":1,\"base\":2,\"heads\":1,"
         "\"time_dim\":2", 1, BUILT},
        {"\"preset\":\"seed\",\"image_size\":8,\"base\":2,\"heads\":2,\"time_dim\":4096", 1,
         BUILT},
        /* its first attention at 512 px: past the spec's work bound (SPEC_ATTN_TOKENS_MAX) */
        {"\"preset\":\"seed\",\"image_size\":1024,\"base\":2,\"heads\":2", 1, REFUSED},
        {"\"preset\":\"seed\",\"image_size\":1016,\"base\":2,\"heads\":1", 2, REFUSED},
        {"\"preset\":\"seed\",\"image_size\":256,\"base\":2,\"heads\":2", 1, BUILT},
        {"\"preset\":\"seed\",\"image_size\":1024,\"in_channels\":4,\"base\":128,"
         "\"heads\":64,\"time_dim\":4096", 65535, ANY},
        {"\"preset\":\"seed\",\"image_size\":64,\"base\":128,\"heads\":64,\"time_dim\":4096",
         1, BUILT},
        {"\"preset\":\"seed\",\"image_size\":8,\"base\":130", 1, REFUSED},
        {"\"preset\":\"seed\",\"image_size\":8,\"base\":1024,\"heads\":64", 1, REFUSED},
        {"\"preset\":\"seed\",\"base\":2,\"heads\":64", 1, REFUSED},
        {"\"preset\":\"seed\",\"base\":3,\"heads\":1", 1, REFUSED},
        {"\"preset\":\"seed\",\"heads\":0", 1, REFUSED},
        {"\"preset\":\"seed\",\"time_dim\":3", 1, REFUSED},
        {"\"preset\":\"seed\",\"image_size\":12", 1, REFUSED},
        {"\"preset\":\"seed\",\"image_size\":1024", 65535, ANY},
        {"\"preset\":\"seed\",\"image_size\":8", 65535, ANY},
    };
    for (size_t i = 0; i < sizeof ddpm / sizeof *ddpm; i++)
        corner(ddpm[i].model, ddpm[i].batch, ddpm[i].expect);
    for (size_t i = 0; i < sizeof seed / sizeof *seed; i++)
        corner(seed[i].model, seed[i].batch, seed[i].expect);
}

/* configs the spec never produces but the CLI or a caller may: the engine's own check refuses
 * each (or the graph does), without a crash, a division by zero or an overflow */
static void config_corners(void)
{
    struct unet_config c;
    char what[64];
#define DDPM_CASE(expect, ...)                                                                 \
    do {                                                                                       \
        unet_config_default(&c, UNET_DDPM);                                                    \
        __VA_ARGS__;                                                                           \
        snprintf(what, sizeof what, "ddpm line %d", __LINE__);                                 \
        int r_ = try_build(what, &c, 1);                                                       \
        CHECK(r_ & (expect), "%s (%s): %s", what, #__VA_ARGS__, r_ == BUILT ? "built" : "refused"); \
    } while (0)
#define SEED_CASE(expect, ...)                                                                 \
    do {                                                                                       \
        unet_config_default(&c, UNET_SEED);                                                    \
        c.image_size = 16;                                                                     \
        c.base = 8;                                                                            \
        __VA_ARGS__;                                                                           \
        snprintf(what, sizeof what, "seed line %d", __LINE__);                                 \
        int r_ = try_build(what, &c, 1);                                                       \
        CHECK(r_ & (expect), "%s (%s): %s", what, #__VA_ARGS__, r_ == BUILT ? "built" : "refused"); \
    } while (0)
    /* ddpmd plan --mult 1,1,1,1,1,1,1,1 --layers 8 --groups 8 --image 128 (--ch 128) */
    DDPM_CASE(BUILT, c.n_levels = 8; for (int i = 0; i < 8; i++) c.channels[i] = 128;
              c.layers_per_block = 8; c.groups = 8; c.image_size = 128);
    /* --layers 40 with two levels, and the most layers the engine takes */
    DDPM_CASE(BUILT, c.n_levels = 2; c.channels[0] = 8; c.channels[1] = 8; c.groups = 8;
              c.layers_per_block = 40; c.image_size = 16);
    DDPM_CASE(BUILT, c.n_levels = 2; c.channels[0] = 8; c.channels[1] = 8; c.groups = 8;
              c.layers_per_block = UNET_MAX_LAYERS; c.image_size = 16; c.n_attn = 0);
    DDPM_CASE(REFUSED, c.layers_per_block = UNET_MAX_LAYERS + 1);
    DDPM_CASE(REFUSED, c.layers_per_block = 1 << 30);
    DDPM_CASE(REFUSED, c.layers_per_block = 0);
    DDPM_CASE(REFUSED, c.groups = 0); /* was SIGFPE */
    DDPM_CASE(REFUSED, c.groups = -32);
    DDPM_CASE(REFUSED, c.channels[0] = 2000000000); /* --ch 2000000000 */
    DDPM_CASE(REFUSED, c.channels[2] = -256);
    DDPM_CASE(REFUSED, c.n_levels = 0);
    DDPM_CASE(REFUSED, c.n_levels = 9);
    DDPM_CASE(REFUSED, c.n_levels = -1);
    DDPM_CASE(REFUSED, c.image_size = 0);
    DDPM_CASE(REFUSED, c.image_size = -32);
    DDPM_CASE(REFUSED, c.image_size = 1 << 30);
    DDPM_CASE(REFUSED, c.in_channels = 0);
    DDPM_CASE(REFUSED, c.out_channels = 1 << 30);
    DDPM_CASE(REFUSED, c.n_attn = 9);
    DDPM_CASE(REFUSED, c.n_attn = -1);
    DDPM_CASE(REFUSED, c.attn_head_dim = -1);
    DDPM_CASE(REFUSED, c.dropout = NAN);
    DDPM_CASE(REFUSED, c.dropout = 1.0f);
    DDPM_CASE(REFUSED, c.dropout = -0.5f);
    DDPM_CASE(REFUSED, c.norm_eps = 0.0f);
    DDPM_CASE(REFUSED, c.norm_eps = NAN);
    DDPM_CASE(REFUSED, c.freq_shift = NAN);
    DDPM_CASE(REFUSED, c.freq_shift = 64.0f); /* channels[0] 128: half 64 */
    DDPM_CASE(REFUSED, c.preset = (enum unet_preset)7);
    /* widths whose shapes pass every int bound but exceed the graph's 2^40 elements */
    DDPM_CASE(ANY, c.n_levels = 1; c.channels[0] = 1 << 20; c.groups = 1024; c.image_size = 8);
    SEED_CASE(BUILT);
    SEED_CASE(BUILT, c.attn_tiled = 0);
    SEED_CASE(REFUSED, c.heads = 0);
    SEED_CASE(REFUSED, c.heads = -4);
    SEED_CASE(REFUSED, c.base = 0);
    SEED_CASE(REFUSED, c.base = -8);
    SEED_CASE(REFUSED, c.base = 1 << 30);
    SEED_CASE(REFUSED, c.time_dim = 0);
    SEED_CASE(REFUSED, c.time_dim = 1 << 30);
    SEED_CASE(REFUSED, c.image_size = 0);
    SEED_CASE(REFUSED, c.image_size = -16);
    SEED_CASE(REFUSED, c.image_size = 1 << 30);
    SEED_CASE(REFUSED, c.in_channels = -3);
    SEED_CASE(ANY, c.image_size = UNET_MAX_IMAGE_SIZE; c.attn_tiled = 0);
#undef DDPM_CASE
#undef SEED_CASE
}

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

    spec_corners();
    config_corners();
    printf("extreme corners: %d specs built and planned, %d refused with an error\n", n_built,
           n_refused);
    return tu_finish("test_unet");
}
