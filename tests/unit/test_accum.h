/* test_accum.h - the harness of the strategy equivalence tests (test_accum.c, test_recompute.c):
 * a model's parameter gradients after one effective batch, run as the plain full-batch step or
 * through a strategy (micro-batches with an uneven last one, recomputation), from the same
 * weights and the same samples (each drawn by its index in the effective batch).
 */
#ifndef DDPMD_TEST_ACCUM_H
#define DDPMD_TEST_ACCUM_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "init.h"
#include "philox.h"
#include "memplan.h"
#include "test_util.h"
#include "unet.h"

/* a 16-bit strategy's plan options: f16 with a loss scale of 1024 (large enough to keep small
 * gradients in range, small enough that no activation gradient overflows) */
static inline struct plan_opts accum_half_opts(int precision)
{
    struct plan_opts po = {0};
    po.strategy = strategy_plain(0);
    po.strategy.precision = precision;
    po.strategy.loss_scale.initial = 1024.0f;
    return po;
}

/* one effective batch of `batch` samples in micro-batches of `micro` (the last one `rest`) */
struct accum {
    int batch, micro, rest;
    struct graph g, rg;        /* the model at micro and at rest samples */
    struct unet_io io, rio;
    int target, rtarget;
    struct plan p, rp;
    struct exec *e, *re;       /* re: nested in e's reservation (plan_make_shared) */
};

/* the fmnist-tiny example's model (examples/fmnist-tiny.json) with dropout on, or the seed
 * preset at 16x16 with a narrow base */
static inline void accum_config(struct unet_config *c, enum unet_preset preset)
{
    unet_config_default(c, preset);
    if (preset == UNET_DDPM) {
        c->in_channels = c->out_channels = 1;
        c->image_size = 32;
        c->n_levels = 3;
        c->channels[0] = 32;
        c->channels[1] = c->channels[2] = 64;
        c->layers_per_block = 1;
        c->attn_res[0] = 8;
        c->groups = 8;
        c->dropout = 0.1f; /* masks drawn by the sample's index in the effective batch */
    } else {
        c->image_size = 16;
        c->base = 8;
        c->time_dim = 32;
    }
}

/* weights from seed 42, norm parameters moved off their defaults so every path carries signal */
static inline void accum_weights(struct exec *e, const struct graph *g)
{
    size_t maxn = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i]->numel > maxn) maxn = g->tensors[i]->numel;
    float *h = malloc(maxn * sizeof *h);
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        init_param(t, 42, h);
        if (t->init == INIT_ONES || t->init == INIT_ZEROS)
            for (size_t k = 0; k < t->numel; k++)
                h[k] += 0.1f * (philox_uniform_at(7, 1, 0, 0, (uint32_t)t->param_index,
                                                  (uint32_t)k) - 0.5f);
        exec_upload(e, i, h);
    }
    free(h);
    exec_reset_state(e);
}

/* Builds and plans the model at micro (and at the rest when micro does not divide batch, nested
 * in the first's reservation) for bk, in po's precision. po: the strategy's plan options (NULL:
 * plain). 0 on success. */
static inline int accum_plan(struct accum *a, const struct backend *bk,
                             const struct unet_config *c, int batch, int micro,
                             const struct plan_opts *po)
{
    memset(a, 0, sizeof *a);
    graph_init(&a->g);
    graph_init(&a->rg);
    a->batch = batch;
    a->micro = micro;
    a->rest = batch % micro;
    const int prec = po ? po->strategy.precision : 0;
    int loss;
    if (unet_build_training(&a->g, c, micro, &a->io, &a->target, &loss)) return -1;
    if (prec && graph_set_precision(&a->g, prec)) return -1;
    if (plan_make(&a->p, &a->g, bk, po)) return -1;
    if (a->rest) {
        if (unet_build_training(&a->rg, c, a->rest, &a->rio, &a->rtarget, &loss)) return -1;
        if (prec && graph_set_precision(&a->rg, prec)) return -1;
        if (plan_make_shared(&a->rp, &a->rg, bk, po, &a->p, &a->g)) return -1;
        plan_reserve_nested(&a->p, &a->rp);
    }
    return 0;
}

/* a's executors on bk (after accum_plan), the weights loaded. eo: the executor's options (NULL:
 * 2 threads). 0 on success. */
static inline int accum_start(struct accum *a, const struct backend *bk,
                              const struct exec_opts *eo_in)
{
    struct exec_opts eo = {.threads = 2};
    if (eo_in) eo = *eo_in;
    if (exec_init(&a->e, &a->g, &a->p, bk, &eo)) return -1;
    if (a->rest && exec_init_nested(&a->re, &a->rg, &a->rp, a->e, &eo)) return -1;
    accum_weights(a->e, &a->g);
    return 0;
}

/* accum_plan and accum_start on the CPU backend */
static inline int accum_init(struct accum *a, const struct unet_config *c, int batch, int micro,
                             const struct plan_opts *po, const struct exec_opts *eo)
{
    if (accum_plan(a, backend_cpu(), c, batch, micro, po)) return -1;
    return accum_start(a, backend_cpu(), eo);
}

static inline void accum_free(struct accum *a)
{
    exec_free(a->re);
    exec_free(a->e);
    plan_free(&a->rp);
    plan_free(&a->p);
    graph_free(&a->rg);
    graph_free(&a->g);
}

/* every part of every parameter of a, concatenated (weights, EMA, m, v, gradient), *n floats */
static inline float *accum_state(struct accum *a, size_t *n)
{
    float *out = malloc(5 * a->g.param_numel * sizeof *out), *o = out;
    for (int part = 0; part < 5; part++)
        for (int i = 0; i < a->g.n_tensors; i++) {
            const struct tensor *t = a->g.tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            if (part < 4)
                exec_download_part(a->e, (enum exec_part)part, i, o);
            else
                exec_download(a->e, t->grad, o);
            o += t->numel;
        }
    *n = (size_t)(o - out);
    return out;
}

/* sample i of the effective batch: its input, target and timestep, drawn by i */
static inline void accum_sample(int i, size_t per, float *x, float *y, float *t)
{
    for (size_t k = 0; k < per; k++) {
        x[k] = philox_normal(3, PHILOX_TAG_NOISE, 0, (uint32_t)i, 0, (uint32_t)k);
        y[k] = philox_normal(3, PHILOX_TAG_NOISE, 0, (uint32_t)i, 1, (uint32_t)k);
    }
    *t = (float)((i * 377 + 11) % 1000);
}

/* One effective batch through the micro-batches as server/train.c runs it (zero the gradients
 * first, then accumulate; the loss gradient scaled by n / batch; dropout drawn by the sample's
 * index in the effective batch). *loss: the batch's mean loss. 0 on success. */
static inline int accum_step(struct accum *a, float *loss)
{
    size_t per = a->g.tensors[a->io.x]->numel / (size_t)a->micro;
    float *x = malloc((size_t)a->micro * per * sizeof *x);
    float *y = malloc((size_t)a->micro * per * sizeof *y), t[256];
    double sum = 0;
    int rc = 0;
    for (int i0 = 0; i0 < a->batch && !rc; i0 += a->micro) {
        int n = a->batch - i0 < a->micro ? a->batch - i0 : a->micro, last = n != a->micro;
        struct exec *e = last ? a->re : a->e;
        const struct unet_io *io = last ? &a->rio : &a->io;
        for (int i = 0; i < n; i++) accum_sample(i0 + i, per, x + i * per, y + i * per, t + i);
        float l = 0, w = (float)n / (float)a->batch;
        rc = exec_upload(e, io->x, x) || exec_upload(e, io->t, t) ||
             exec_upload(e, last ? a->rtarget : a->target, y) ||
             exec_forward_backward(e, i0 == 0, w, 11, 5, i0, &l);
        sum += (double)w * l;
    }
    *loss = (float)sum;
    free(x);
    free(y);
    return rc;
}

/* every parameter's gradient, in a's parameter order, into one malloc'd array (*n floats) */
static inline float *accum_grads(struct accum *a, size_t *n)
{
    float *out = malloc(a->g.param_numel * sizeof *out);
    size_t off = 0;
    for (int i = 0; i < a->g.n_tensors; i++) {
        const struct tensor *t = a->g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        exec_download(a->e, t->grad, out + off);
        off += t->numel;
    }
    *n = off;
    return out;
}

/* The largest relative difference of one parameter's gradient between a and the reference ref
 * (same model), with the parameter's name in *worst: the norm of the difference over the larger
 * of the reference gradient's norm and 1e-3 of the whole gradient's (an attention key bias has a
 * zero gradient in exact arithmetic - softmax ignores it - and its computed one is rounding
 * noise, which no split reproduces). */
static inline double accum_compare(struct accum *a, const float *ga, struct accum *ref,
                                   const float *gref, const char **worst)
{
    double most = 0, all = 0;
    size_t off = 0;
    *worst = "";
    for (size_t k = 0; k < ref->g.param_numel; k++) all += (double)gref[k] * gref[k];
    double floor = 1e-3 * sqrt(all);
    for (int i = 0; i < a->g.n_tensors; i++) {
        const struct tensor *t = a->g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        int r = graph_find_param(&ref->g, t->name);
        size_t roff = 0;
        for (int k = 0; k < r; k++)
            if (ref->g.tensors[k]->kind == TENSOR_PARAM) roff += ref->g.tensors[k]->numel;
        double d = 0, r2 = 0;
        for (size_t k = 0; k < t->numel; k++) {
            double x = (double)ga[off + k] - gref[roff + k];
            d += x * x;
            r2 += (double)gref[roff + k] * gref[roff + k];
        }
        double rel = sqrt(d) / (sqrt(r2) > floor ? sqrt(r2) : floor);
        if (rel > most) {
            most = rel;
            *worst = t->name;
        }
        off += t->numel;
    }
    return most;
}

#endif
