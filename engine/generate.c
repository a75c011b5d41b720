/* generate.c - images from a model (see generate.h): the forward-only graph, its plan and the
 * denoising loop. Noise is Philox(seed, SAMPLER, step, image, element), so the same seed gives
 * the same images at any batch size. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_load.h"
#include "philox.h"

int generate_plan(const struct unet_config *model, int batch, const struct backend *bk,
                struct graph *g, struct unet_io *io, struct plan *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    graph_init(g);
    if (unet_build(g, model, batch, io)) {
        snprintf(err, errlen, "cannot build the model: %s", g->err);
        return -1;
    }
    /* sampling in parity mode (the same seed gives the same bytes), its context made in it by
     * generate_init on this thread; a training job's grids run in the job's mode */
    if (backend_supports(backend_or_cpu(bk), BK_OP_set_parity, BK_DTYPE_F32))
        backend_or_cpu(bk)->set_parity(1);
    if (plan_make(p, g, backend_or_cpu(bk), NULL)) {
        snprintf(err, errlen, "cannot plan the sampling graph");
        return -1;
    }
    return 0;
}

int generate_plan_nested(const struct unet_config *model, int batch, const struct plan *host,
                           const struct graph *host_g, const struct backend *bk, struct graph *g,
                           struct unet_io *io, struct plan *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    graph_init(g);
    if (unet_build(g, model, batch, io)) {
        snprintf(err, errlen, "cannot build the sampling model: %s", g->err);
        return -1;
    }
    int rc = plan_make_nested(p, g, bk, NULL, host, host_g, PLAN_WEIGHTS_EMA);
    if (rc) {
        snprintf(err, errlen, "cannot plan the sample grid inside the training job's reservation "
                 "(plan_make_nested status %d)", rc);
        return -1;
    }
    return 0;
}

void generate_bind_nested(struct generator *view, const struct graph *g,
                            const struct unet_io *io, const struct plan *p, struct exec *e,
                            int batch, const struct unet_config *model)
{
    memset(view, 0, sizeof *view);
    /* shallow copies: generate_run reads them; the owner frees the originals */
    view->g = *g;
    view->io = *io;
    view->p = *p;
    view->e = e;
    view->batch = batch;
    view->model = *model;
    view->view = 1;
}

int generate_init(struct generator *j, const struct unet_config *model, int batch,
                    int threads, const struct backend *bk, char *err, size_t errlen)
{
    memset(j, 0, sizeof *j);
    j->batch = batch;
    j->model = *model;
    if (generate_plan(model, batch, bk, &j->g, &j->io, &j->p, err, errlen)) goto fail;
    struct exec_error ie = {0};
    struct exec_opts eo = {.threads = threads, .init_error = &ie};
    if (exec_init(&j->e, &j->g, &j->p, backend_or_cpu(bk), &eo)) {
        snprintf(err, errlen, "cannot start sampling: %s",
                 ie.msg[0] ? ie.msg : "the executor failed");
        goto fail;
    }
    return 0;
fail:
    generate_free(j);
    return -1;
}

void generate_free(struct generator *j)
{
    if (j->view) {
        memset(j, 0, sizeof *j);
        return;
    }
    exec_free(j->e);
    plan_free(&j->p);
    graph_free(&j->g);
    memset(j, 0, sizeof *j);
}

int generate_copy_weights(struct generator *j, struct exec *train, const struct graph *tg,
                            int from_ema)
{
    if (j->view) return -1;
    size_t maxn = 0;
    for (int i = 0; i < j->g.n_tensors; i++)
        if (j->g.tensors[i]->kind == TENSOR_PARAM && j->g.tensors[i]->numel > maxn)
            maxn = j->g.tensors[i]->numel;
    float *buf = malloc(maxn * sizeof *buf + 1);
    int rc = buf ? 0 : -1;
    for (int i = 0; i < j->g.n_tensors && !rc; i++) {
        const struct tensor *t = j->g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        int k = graph_find_param(tg, t->name);
        rc = k < 0 ||
             exec_download_part(train, from_ema ? EXEC_PART_EMA : EXEC_PART_WEIGHT, k, buf) ||
             exec_upload(j->e, i, buf);
    }
    free(buf);
    return rc ? -1 : 0;
}

int64_t generate_host_bytes(int batch, size_t per, int T)
{
    return 4 * (int64_t)batch * (int64_t)per * (int64_t)sizeof(float) +
           (int64_t)batch * (int64_t)sizeof(float) + (int64_t)T * (int64_t)sizeof(int);
}

int generate_run(struct generator *j, const struct ddpm_schedule *sch,
                   const struct sampler_config *sc, uint64_t seed, int n, float *out,
                   void (*progress)(int done, int total, void *ctx), void *ctx)
{
    int T = sch->T, rc = GENERATE_FAILED;
    int *ts = malloc((size_t)T * sizeof *ts);
    size_t per = j->g.tensors[j->io.x]->numel / (size_t)j->batch;
    size_t bytes = (size_t)j->batch * per * sizeof(float);
    float *x = malloc(bytes), *eps = malloc(bytes), *noise = malloc(bytes), *xp = malloc(bytes);
    float *tf = malloc((size_t)j->batch * sizeof *tf);
    int nts = ts ? sampler_timesteps(sc, sch, ts, T) : -1;
    if (!x || !eps || !noise || !xp || !tf || nts < 1) goto out;
    int chunks = (n + j->batch - 1) / j->batch, done = 0, total = chunks * nts;
    for (int c = 0; c < chunks; c++) {
        int first = c * j->batch, m = n - first < j->batch ? n - first : j->batch;
        /* x_T ~ N(0, I); rows past m (a partial last chunk) are computed and dropped */
        for (int i = 0; i < j->batch; i++)
            for (size_t e = 0; e < per; e++)
                x[(size_t)i * per + e] = philox_normal(seed, PHILOX_TAG_SAMPLER, 0,
                                                       (uint32_t)(first + i), 0, (uint32_t)e);
        for (int k = 0; k < nts; k++) {
            int t = ts[k], t_prev = k + 1 < nts ? ts[k + 1] : -1;
            /* a stop lands between two denoising steps: one forward is the longest wait */
            if (sampler_stop_requested(sc)) {
                rc = GENERATE_STOPPED;
                goto out;
            }
            for (int i = 0; i < j->batch; i++) tf[i] = (float)t;
            if (exec_upload(j->e, j->io.x, x) || exec_upload(j->e, j->io.t, tf) ||
                exec_forward(j->e, NULL) || exec_download(j->e, j->io.out, eps))
                goto out;
            int need_noise = sampler_needs_noise(sc, t, t_prev);
            if (need_noise)
                for (int i = 0; i < j->batch; i++)
                    for (size_t e = 0; e < per; e++)
                        noise[(size_t)i * per + e] =
                            philox_normal(seed, PHILOX_TAG_SAMPLER, (uint64_t)k + 1,
                                          (uint32_t)(first + i), 0, (uint32_t)e);
            sampler_step(sc, sch, t, t_prev, x, eps, need_noise ? noise : NULL, xp,
                         (size_t)j->batch * per);
            memcpy(x, xp, bytes);
            if (progress) progress(++done, total, ctx);
        }
        for (size_t e = 0; e < (size_t)m * per; e++) {
            float v = x[e];
            out[(size_t)first * per + e] = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
        }
    }
    rc = GENERATE_OK;
out:
    free(ts);
    free(x);
    free(eps);
    free(noise);
    free(xp);
    free(tf);
    return rc;
}
