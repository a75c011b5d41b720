/* unet.c - builds the ddpm and seed UNets op by op, naming parameters exactly as diffusers'
 * UNet2DModel and the seed script's state_dict do, so checkpoints cross over unchanged.
 */
#include "unet.h"

#include <stdio.h>
#include <string.h>

void unet_config_default(struct unet_config *c, enum unet_preset preset)
{
    memset(c, 0, sizeof *c);
    c->preset = preset;
    c->attn_tiled = -1;
    if (preset == UNET_DDPM) {
        c->in_channels = c->out_channels = 3;
        c->image_size = 32;
        c->n_levels = 4;
        c->channels[0] = 128;
        c->channels[1] = c->channels[2] = c->channels[3] = 256;
        c->layers_per_block = 2;
        c->n_attn = 1;
        c->attn_res[0] = 16;
        c->groups = 32;
        c->norm_eps = 1e-6f;
        c->attn_head_dim = 0;
        c->dropout = 0.0f;
        c->flip_sin_to_cos = 0;
        c->freq_shift = 1.0f;
    } else {
        c->in_channels = c->out_channels = 3;
        c->image_size = 64;
        c->base = 64;
        c->time_dim = 256;
        c->heads = 4;
    }
}

int unet_config_check(const struct unet_config *c, char *err, size_t errlen)
{
#define FAIL(...) return snprintf(err, errlen, __VA_ARGS__), 1
    /* every bound is checked before the value is used in arithmetic (groups before a modulo,
     * n_levels before a shift), and float tests are written to fail on NaN */
    if (c->preset != UNET_DDPM && c->preset != UNET_SEED) FAIL("unknown preset %d", c->preset);
    if (c->in_channels < 1 || c->in_channels > UNET_MAX_CHANNELS || c->out_channels < 1 ||
        c->out_channels > UNET_MAX_CHANNELS)
        FAIL("in/out channels %d/%d: must be in [1, %d]", c->in_channels, c->out_channels,
             UNET_MAX_CHANNELS);
    if (c->image_size < 1 || c->image_size > UNET_MAX_IMAGE_SIZE)
        FAIL("image_size %d: must be in [1, %d]", c->image_size, UNET_MAX_IMAGE_SIZE);
    if (c->preset == UNET_DDPM) {
        if (c->n_levels < 1 || c->n_levels > UNET_MAX_LEVELS)
            FAIL("%d levels: must be in [1, %d]", c->n_levels, UNET_MAX_LEVELS);
        if (c->image_size % (1 << (c->n_levels - 1)))
            FAIL("image_size %d must be divisible by %d", c->image_size, 1 << (c->n_levels - 1));
        if (c->layers_per_block < 1 || c->layers_per_block > UNET_MAX_LAYERS)
            FAIL("layers_per_block %d: must be in [1, %d]", c->layers_per_block,
                 UNET_MAX_LAYERS);
        if (c->groups < 1) FAIL("norm_num_groups %d: must be >= 1", c->groups);
        if (c->attn_head_dim < 0) FAIL("attention_head_dim %d: must be >= 1", c->attn_head_dim);
        if (c->n_attn < 0 || c->n_attn > UNET_MAX_LEVELS)
            FAIL("%d attention resolutions: at most %d", c->n_attn, UNET_MAX_LEVELS);
        for (int i = 0; i < c->n_levels; i++) {
            if (c->channels[i] < 1 || c->channels[i] > UNET_MAX_CHANNELS)
                FAIL("channels %d: must be in [1, %d]", c->channels[i], UNET_MAX_CHANNELS);
            if (c->channels[i] % c->groups)
                FAIL("channels %d not divisible by %d groups", c->channels[i], c->groups);
            if (c->attn_head_dim && c->channels[i] % c->attn_head_dim)
                FAIL("channels %d not divisible by attention_head_dim %d", c->channels[i],
                     c->attn_head_dim);
            if (c->channels[i] / c->groups > UNET_MAX_GROUP_CHANNELS)
                FAIL("%d channels per norm group (at most %d)", c->channels[i] / c->groups,
                     UNET_MAX_GROUP_CHANNELS);
        }
        if (c->channels[0] % 2) FAIL("channels[0] must be even (time embedding)");
        if (!(c->freq_shift >= 0 && c->freq_shift < (float)(c->channels[0] / 2)))
            FAIL("freq_shift %g: must be in [0, %d) for %d channels", c->freq_shift,
                 c->channels[0] / 2, c->channels[0]);
        if (!(c->norm_eps > 0 && c->norm_eps <= 1)) FAIL("norm_eps %g: must be in (0, 1]",
                                                         c->norm_eps);
        if (!(c->dropout >= 0 && c->dropout < 1)) FAIL("dropout must be in [0, 1)");
    } else {
        if (c->image_size < 8 || c->image_size % 8) FAIL("image_size must be a multiple of 8");
        if (c->base < 2 || c->base % 2) FAIL("base must be even");
        /* the widest block (8 base) is normalised as one group */
        if (c->base > UNET_MAX_GROUP_CHANNELS / 8)
            FAIL("base %d: at most %d (its widest group norm spans 8 base channels)", c->base,
                 UNET_MAX_GROUP_CHANNELS / 8);
        if (c->heads < 1 || c->base % c->heads) FAIL("base must be divisible by heads");
        if (c->time_dim < 2 || c->time_dim % 2 || c->time_dim > UNET_MAX_CHANNELS)
            FAIL("time_dim %d: must be even, in [2, %d]", c->time_dim, UNET_MAX_CHANNELS);
    }
    return 0;
#undef FAIL
}

/* ---- parameter helpers ---- */

static int param(struct graph *g, const char *prefix, const char *suffix, int rank,
                 const int *dims, enum param_init init, int fan_in, int fan_out)
{
    char name[256];
    if (snprintf(name, sizeof name, "%s%s", prefix, suffix) >= (int)sizeof name)
        return graph_fail(g, GRAPH_ERR_SHAPE, "parameter name %s%s is too long", prefix, suffix);
    int id = graph_param(g, name, rank, dims);
    if (id >= 0) {
        g->tensors[id]->init = init;
        g->tensors[id]->fan_in = fan_in;
        g->tensors[id]->fan_out = fan_out;
    }
    return id;
}

static int conv(struct graph *g, const char *name, int x, int co, int k, int stride, int pt,
                int pl, int pb, int pr, int bias)
{
    if (x < 0) return -1;
    int ci = g->tensors[x]->d[1];
    int wd[4] = {co, ci, k, k}, bd[1] = {co};
    int w = param(g, name, ".weight", 4, wd, INIT_FAN_IN_UNIFORM, ci * k * k, co * k * k);
    int b = bias ? param(g, name, ".bias", 1, bd, INIT_FAN_IN_UNIFORM, ci * k * k, 0) : -1;
    return graph_conv2d(g, x, w, b, stride, pt, pl, pb, pr);
}

static int conv3(struct graph *g, const char *name, int x, int co, int bias)
{
    return conv(g, name, x, co, 3, 1, 1, 1, 1, 1, bias);
}

/* nn.Linear, its bias initialised as bias_init (PyTorch's default: fan-in uniform) */
static int linear_init(struct graph *g, const char *name, int x, int out,
                       enum param_init bias_init)
{
    if (x < 0) return -1;
    int in = g->tensors[x]->d[g->tensors[x]->rank - 1];
    int wd[2] = {out, in}, bd[1] = {out};
    int w = param(g, name, ".weight", 2, wd, INIT_FAN_IN_UNIFORM, in, out);
    int b = param(g, name, ".bias", 1, bd, bias_init, in, 0);
    return graph_linear(g, x, w, b);
}

static int linear(struct graph *g, const char *name, int x, int out)
{
    return linear_init(g, name, x, out, INIT_FAN_IN_UNIFORM);
}

static int norm_affine(struct graph *g, const char *name, int c, int *gamma, int *beta)
{
    int d[1] = {c};
    *gamma = param(g, name, ".weight", 1, d, INIT_ONES, 0, 0);
    *beta = param(g, name, ".bias", 1, d, INIT_ZEROS, 0, 0);
    return *gamma >= 0 && *beta >= 0;
}

/* group norm with its affine parameters, SiLU fused after when silu */
static int groupnorm(struct graph *g, const char *name, int x, int groups, float eps, int silu)
{
    if (x < 0) return -1;
    int ga, be;
    if (!norm_affine(g, name, g->tensors[x]->d[1], &ga, &be)) return -1;
    return silu ? graph_groupnorm_silu(g, x, ga, be, groups, eps)
                : graph_groupnorm(g, x, ga, be, groups, eps);
}

static int layernorm(struct graph *g, const char *name, int x, float eps)
{
    if (x < 0) return -1;
    int ga, be;
    if (!norm_affine(g, name, g->tensors[x]->d[g->tensors[x]->rank - 1], &ga, &be)) return -1;
    return graph_layernorm(g, x, ga, be, eps);
}

/* attention form: the config's choice, or (auto, -1) the plain form - GEMMs, probabilities
 * saved - while those probabilities (heads * L^2 per image) are at most 4x the block's input
 * (L * C per image), and the tiled, memory-efficient form beyond */
static int attn_form(const struct unet_config *c, int l, int heads, int ch)
{
    if (c->attn_tiled >= 0) return c->attn_tiled;
    return (double)heads * l * l > 4.0 * l * ch;
}

static const char *cat(char *buf, size_t n, const char *a, const char *b)
{
    snprintf(buf, n, "%s%s", a, b);
    return buf;
}

/* marks the ops since first as a segment of kind (recomputation's unit); returns h */
static int segment(struct graph *g, int first, int kind, int h)
{
    if (h >= 0) graph_mark_segment(g, first, kind);
    return h;
}

/* ---- ddpm (diffusers UNet2DModel) ---- */

/* ResnetBlock2D: norm1 silu conv1 (+ time_emb_proj(silu(temb))) norm2 silu dropout conv2,
 * plus conv_shortcut (1x1) when the width changes */
static int ddpm_resnet(struct graph *g, const struct unet_config *c, const char *name, int x,
                       int temb_act, int out)
{
    char b[256];
    if (x < 0) return -1;
    int in = g->tensors[x]->d[1], first = g->n_ops;
    int h = groupnorm(g, cat(b, sizeof b, name, "norm1"), x, c->groups, c->norm_eps, 1);
    h = conv3(g, cat(b, sizeof b, name, "conv1"), h, out, 1);
    int tp = linear(g, cat(b, sizeof b, name, "time_emb_proj"), temb_act, out);
    h = graph_add_bcast(g, h, tp);
    h = groupnorm(g, cat(b, sizeof b, name, "norm2"), h, c->groups, c->norm_eps, 1);
    h = graph_dropout(g, h, c->dropout);
    h = conv3(g, cat(b, sizeof b, name, "conv2"), h, out, 1);
    int sc = in != out ? conv(g, cat(b, sizeof b, name, "conv_shortcut"), x, out, 1, 1, 0, 0, 0,
                              0, 1)
                       : x;
    return segment(g, first, GRAPH_SEG_RESBLOCK, graph_add(g, sc, h));
}

/* Attention (diffusers, residual_connection=True): x + to_out(attn(to_qkv(group_norm(x)))) */
static int ddpm_attention(struct graph *g, const struct unet_config *c, const char *name, int x)
{
    char b[256];
    if (x < 0) return -1;
    int ch = g->tensors[x]->d[1], hh = g->tensors[x]->d[2], ww = g->tensors[x]->d[3];
    int heads = c->attn_head_dim ? ch / c->attn_head_dim : 1, first = g->n_ops;
    int h = groupnorm(g, cat(b, sizeof b, name, "group_norm"), x, c->groups, c->norm_eps, 0);
    h = graph_to_tokens(g, h);
    int q = linear(g, cat(b, sizeof b, name, "to_q"), h, ch);
    int k = linear(g, cat(b, sizeof b, name, "to_k"), h, ch);
    int v = linear(g, cat(b, sizeof b, name, "to_v"), h, ch);
    int o = graph_attention(g, q, k, v, heads, attn_form(c, hh * ww, heads, ch));
    o = linear(g, cat(b, sizeof b, name, "to_out.0"), o, ch);
    o = graph_to_image(g, o, hh, ww);
    return segment(g, first, GRAPH_SEG_ATTENTION, graph_add(g, o, x));
}

static int has_attn(const struct unet_config *c, int res)
{
    for (int i = 0; i < c->n_attn; i++)
        if (c->attn_res[i] == res) return 1;
    return 0;
}

static int build_ddpm(struct graph *g, const struct unet_config *c, int batch,
                      struct unet_io *io)
{
    char name[256];
    int xd[4] = {batch, c->in_channels, c->image_size, c->image_size}, td[1] = {batch};
    io->x = graph_input(g, "x", 4, xd);
    io->t = graph_input(g, "t", 1, td);
    int ch0 = c->channels[0], L = c->n_levels;

    int temb = graph_timestep_embed(g, io->t, ch0, c->flip_sin_to_cos, c->freq_shift, 10000.0f);
    temb = linear(g, "time_embedding.linear_1", temb, 4 * ch0);
    temb = graph_silu(g, temb);
    temb = linear(g, "time_embedding.linear_2", temb, 4 * ch0);
    /* every resnet applies silu to temb; computed once, shared */
    int temb_act = graph_silu(g, temb);

    int h = conv3(g, "conv_in", io->x, ch0, 1);
    /* conv_in, every down resnet (+attention), every downsampler: 1 + L * layers + (L - 1)
     * entries, which the bounds unet_config_check enforces keep within the list */
    int skips[UNET_MAX_LEVELS * (UNET_MAX_LAYERS + 1)], n_skips = 0;
    const int max_skips = (int)(sizeof skips / sizeof *skips);
    if (L * (c->layers_per_block + 1) > max_skips)
        return graph_fail(g, GRAPH_ERR_SHAPE, "%d levels of %d layers: at most %d skips", L,
                          c->layers_per_block, max_skips), g->status;
    skips[n_skips++] = h;
    int res = c->image_size;
    for (int i = 0; i < L; i++) {
        int level = g->n_ops;
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(name, sizeof name, "down_blocks.%d.resnets.%d.", i, j);
            h = ddpm_resnet(g, c, name, h, temb_act, c->channels[i]);
            if (has_attn(c, res)) {
                snprintf(name, sizeof name, "down_blocks.%d.attentions.%d.", i, j);
                h = ddpm_attention(g, c, name, h);
            }
            skips[n_skips++] = h;
        }
        if (i < L - 1) {
            /* downsample_padding 0: pad right and bottom by one, then the stride-2 conv */
            snprintf(name, sizeof name, "down_blocks.%d.downsamplers.0.conv", i);
            h = conv(g, name, h, c->channels[i], 3, 2, 0, 0, 1, 1, 1);
            skips[n_skips++] = h;
            res /= 2;
        }
        segment(g, level, GRAPH_SEG_LEVEL, h);
    }
    int top = c->channels[L - 1], mid = g->n_ops;
    h = ddpm_resnet(g, c, "mid_block.resnets.0.", h, temb_act, top);
    h = ddpm_attention(g, c, "mid_block.attentions.0.", h);
    h = ddpm_resnet(g, c, "mid_block.resnets.1.", h, temb_act, top);
    segment(g, mid, GRAPH_SEG_LEVEL, h);
    for (int u = 0; u < L; u++) {
        int out = c->channels[L - 1 - u], level = g->n_ops;
        for (int j = 0; j < c->layers_per_block + 1; j++) {
            int skip = skips[--n_skips];
            h = graph_concat(g, h, skip);
            snprintf(name, sizeof name, "up_blocks.%d.resnets.%d.", u, j);
            h = ddpm_resnet(g, c, name, h, temb_act, out);
            if (has_attn(c, res)) {
                snprintf(name, sizeof name, "up_blocks.%d.attentions.%d.", u, j);
                h = ddpm_attention(g, c, name, h);
            }
        }
        if (u < L - 1) {
            h = graph_upsample_nearest(g, h);
            snprintf(name, sizeof name, "up_blocks.%d.upsamplers.0.conv", u);
            h = conv3(g, name, h, out, 1);
            res *= 2;
        }
        segment(g, level, GRAPH_SEG_LEVEL, h);
    }
    h = groupnorm(g, "conv_norm_out", h, c->groups, c->norm_eps, 1);
    io->out = conv3(g, "conv_out", h, c->out_channels, 1);
    return g->status;
}

/* ---- seed (Diffusion-Models-pytorch modules.py) ---- */

/* DoubleConv: conv3x3 (no bias) GroupNorm(1) GELU conv3x3 (no bias) GroupNorm(1); the residual
 * variant returns gelu(x + f(x)) */
static int seed_double_conv(struct graph *g, const char *name, int x, int mid, int out,
                            int residual)
{
    char b[256];
    int first = g->n_ops;
    int h = conv3(g, cat(b, sizeof b, name, ".double_conv.0"), x, mid, 0);
    h = groupnorm(g, cat(b, sizeof b, name, ".double_conv.1"), h, 1, 1e-5f, 0);
    h = graph_gelu(g, h);
    h = conv3(g, cat(b, sizeof b, name, ".double_conv.3"), h, out, 0);
    h = groupnorm(g, cat(b, sizeof b, name, ".double_conv.4"), h, 1, 1e-5f, 0);
    return segment(g, first, GRAPH_SEG_RESBLOCK, residual ? graph_gelu(g, graph_add(g, x, h)) : h);
}

static int seed_time_term(struct graph *g, const char *name, int x, int t_act)
{
    char b[256];
    if (x < 0) return -1;
    int e = linear(g, cat(b, sizeof b, name, ".emb_layer.1"), t_act, g->tensors[x]->d[1]);
    return graph_add_bcast(g, x, e);
}

static int seed_down(struct graph *g, const char *name, int x, int out, int t_act)
{
    char b[256];
    if (x < 0) return -1;
    int in = g->tensors[x]->d[1];
    int h = graph_maxpool(g, x);
    h = seed_double_conv(g, cat(b, sizeof b, name, ".maxpool_conv.1"), h, in, in, 1);
    h = seed_double_conv(g, cat(b, sizeof b, name, ".maxpool_conv.2"), h, out, out, 0);
    return seed_time_term(g, name, h, t_act);
}

static int seed_up(struct graph *g, const char *name, int x, int skip, int out, int t_act)
{
    char b[256];
    int h = graph_upsample_bilinear(g, x, 1);
    h = graph_concat(g, skip, h);
    if (h < 0) return -1;
    int in = g->tensors[h]->d[1];
    h = seed_double_conv(g, cat(b, sizeof b, name, ".conv.0"), h, in, in, 1);
    h = seed_double_conv(g, cat(b, sizeof b, name, ".conv.1"), h, in / 2, out, 0);
    return seed_time_term(g, name, h, t_act);
}

/* SelfAttention: LayerNorm, nn.MultiheadAttention (packed in_proj), + x, then
 * LayerNorm Linear GELU Linear + residual */
static int seed_attention(struct graph *g, const struct unet_config *c, const char *name, int x,
                          int heads)
{
    char b[256];
    if (x < 0) return -1;
    int ch = g->tensors[x]->d[1], hh = g->tensors[x]->d[2], ww = g->tensors[x]->d[3];
    int first = g->n_ops;
    int tok = graph_to_tokens(g, x);
    int h = layernorm(g, cat(b, sizeof b, name, ".ln"), tok, 1e-5f);
    int wd[2] = {3 * ch, ch}, bd[1] = {3 * ch};
    int w = param(g, name, ".mha.in_proj_weight", 2, wd, INIT_XAVIER_UNIFORM, ch, 3 * ch);
    int bb = param(g, name, ".mha.in_proj_bias", 1, bd, INIT_ZEROS, 0, 0);
    int qkv = graph_linear(g, h, w, bb);
    int a = graph_attention(g, qkv, -1, -1, heads, attn_form(c, hh * ww, heads, ch));
    /* nn.MultiheadAttention._reset_parameters zeroes out_proj.bias (its weight keeps the
     * Linear default) */
    a = linear_init(g, cat(b, sizeof b, name, ".mha.out_proj"), a, ch, INIT_ZEROS);
    a = graph_add(g, a, tok);
    int f = layernorm(g, cat(b, sizeof b, name, ".ff_self.0"), a, 1e-5f);
    f = linear(g, cat(b, sizeof b, name, ".ff_self.1"), f, ch);
    f = graph_gelu(g, f);
    f = linear(g, cat(b, sizeof b, name, ".ff_self.3"), f, ch);
    a = graph_add(g, f, a);
    return segment(g, first, GRAPH_SEG_ATTENTION, graph_to_image(g, a, hh, ww));
}

static int build_seed(struct graph *g, const struct unet_config *c, int batch,
                      struct unet_io *io)
{
    int xd[4] = {batch, c->in_channels, c->image_size, c->image_size}, td[1] = {batch};
    io->x = graph_input(g, "x", 4, xd);
    io->t = graph_input(g, "t", 1, td);
    int b = c->base, hd = c->heads;
    /* pos_encoding: [sin(t f), cos(t f)], f_i = 10000^(-2i/dim): freq_shift 0, no flip */
    int temb = graph_timestep_embed(g, io->t, c->time_dim, 0, 0.0f, 10000.0f);
    int t_act = graph_silu(g, temb); /* each emb_layer starts with SiLU; computed once */
    /* levels (recomputation's largest segments): each resolution's blocks in a row */
    int lv = g->n_ops;
    int x1 = segment(g, lv, GRAPH_SEG_LEVEL, seed_double_conv(g, "inc", io->x, b, b, 0));
    lv = g->n_ops;
    int x2 = seed_attention(g, c, "sa1", seed_down(g, "down1", x1, 2 * b, t_act), hd);
    segment(g, lv, GRAPH_SEG_LEVEL, x2);
    lv = g->n_ops;
    int x3 = seed_attention(g, c, "sa2", seed_down(g, "down2", x2, 4 * b, t_act), hd);
    segment(g, lv, GRAPH_SEG_LEVEL, x3);
    lv = g->n_ops;
    int x4 = seed_attention(g, c, "sa3", seed_down(g, "down3", x3, 4 * b, t_act), hd);
    x4 = seed_double_conv(g, "bot1", x4, 8 * b, 8 * b, 0);
    x4 = seed_double_conv(g, "bot2", x4, 8 * b, 8 * b, 0);
    x4 = seed_double_conv(g, "bot3", x4, 4 * b, 4 * b, 0);
    segment(g, lv, GRAPH_SEG_LEVEL, x4);
    lv = g->n_ops;
    int h = seed_attention(g, c, "sa4", seed_up(g, "up1", x4, x3, 2 * b, t_act), hd);
    segment(g, lv, GRAPH_SEG_LEVEL, h);
    lv = g->n_ops;
    h = seed_attention(g, c, "sa5", seed_up(g, "up2", h, x2, b, t_act), hd);
    segment(g, lv, GRAPH_SEG_LEVEL, h);
    lv = g->n_ops;
    h = seed_attention(g, c, "sa6", seed_up(g, "up3", h, x1, b, t_act), hd);
    segment(g, lv, GRAPH_SEG_LEVEL, h);
    io->out = conv(g, "outc", h, c->out_channels, 1, 1, 0, 0, 0, 0, 1);
    return g->status;
}

int unet_build(struct graph *g, const struct unet_config *c, int batch, struct unet_io *io)
{
    char err[200];
    if (unet_config_check(c, err, sizeof err)) {
        g->status = GRAPH_ERR_SHAPE;
        snprintf(g->err, sizeof g->err, "%s", err);
        return g->status;
    }
    return c->preset == UNET_DDPM ? build_ddpm(g, c, batch, io) : build_seed(g, c, batch, io);
}

int unet_build_training(struct graph *g, const struct unet_config *c, int batch,
                        struct unet_io *io, int *target, int *loss)
{
    if (unet_build(g, c, batch, io)) return g->status;
    int t = graph_input(g, "target", 4, g->tensors[io->x]->d);
    int l = graph_mse(g, io->out, t);
    if (target) *target = t;
    if (loss) *loss = l;
    graph_backward(g, l);
    return g->status;
}
