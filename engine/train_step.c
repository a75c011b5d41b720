/* train_step.c - one training step (see train_step.h). */
#include "train_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_load.h"
#include "philox.h"

int train_step_init(struct train_step *ts, const struct train_step_config *c,
                    const struct strategy *st, char *err, size_t errlen)
{
    memset(ts, 0, sizeof *ts);
    ts->batch = c->shape.batch;
    ts->prediction = c->prediction;
    if (train_plans_make(&ts->tp, &c->shape, st, err, errlen)) return -1;
    /* the budget is enforced by the backend too: nothing beyond it is ever allocated */
    struct exec_error xe = {0};
    struct exec_opts eo = {.threads = c->threads, .budget = c->budget, .init_error = &xe};
    if (exec_init(&ts->e, &ts->tp.g, &ts->tp.p, train_shape_backend(&c->shape), &eo)) {
        snprintf(err, errlen, "cannot allocate the plan's %zu bytes: %s (%s)",
                 ts->tp.p.total_bytes, exec_status_name(xe.status), xe.msg);
        return -1;
    }
    /* allocate nothing: the last micro-batch and the grids run in the reservation just made */
    struct exec_error ee = {0};
    if (ts->tp.rest && exec_init_nested(&ts->re, &ts->tp.rg, &ts->tp.rp, ts->e,
                                        &(struct exec_opts){.init_error = &ee})) {
        snprintf(err, errlen, "cannot place the last micro-batch in the job's reservation: %s",
                 ee.msg);
        return -1;
    }
    if (ts->tp.grid && exec_init_nested(&ts->se, &ts->tp.sg, &ts->tp.sp, ts->e,
                                        &(struct exec_opts){.init_error = &ee})) {
        snprintf(err, errlen, "cannot place the sample grids in the job's reservation: %s",
                 ee.msg);
        return -1;
    }
    ts->per = ts->tp.g.tensors[ts->tp.io.x]->numel / (size_t)ts->tp.micro;
    size_t img = ts->per * (size_t)ts->batch;
    ts->x0 = calloc(img, sizeof(float));
    ts->eps = calloc(img, sizeof(float));
    ts->xt = calloc(img, sizeof(float));
    ts->tgt = calloc(img, sizeof(float));
    ts->tf = calloc((size_t)ts->batch, sizeof(float));
    ts->ti = calloc((size_t)ts->batch, sizeof(int));
    if (!ts->x0 || !ts->eps || !ts->xt || !ts->tgt || !ts->tf || !ts->ti ||
        ddpm_schedule_init(&ts->sch, c->timesteps, c->beta_schedule, c->beta_start,
                           c->beta_end)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

int64_t train_step_host_bytes(int batch, size_t per)
{
    return 4 * (int64_t)batch * (int64_t)per * (int64_t)sizeof(float) +
           (int64_t)batch * (int64_t)(sizeof(float) + sizeof(int));
}

void train_step_free(struct train_step *ts)
{
    exec_free(ts->se); /* borrow ts->e's allocation: first */
    exec_free(ts->re);
    exec_free(ts->e);
    train_plans_free(&ts->tp);
    ddpm_schedule_free(&ts->sch);
    free(ts->x0);
    free(ts->eps);
    free(ts->xt);
    free(ts->tgt);
    free(ts->tf);
    free(ts->ti);
    memset(ts, 0, sizeof *ts);
}

/* timesteps, noise and the model's input/target for the effective batch of step (x0 already
 * loaded): sample i's numbers are drawn by (seed, step, i, element), i its index in the
 * effective batch, so every micro-batch split (and the loader's flips, drawn by the run's sample
 * index step * batch + i) gives each sample the same numbers */
static void make_inputs(struct train_step *ts, int64_t step, uint64_t seed, const int *fixed_t)
{
    const int batch = ts->batch, T = ts->sch.T;
    for (int i = 0; i < batch; i++) {
        ts->ti[i] = fixed_t ? fixed_t[i]
                            : (int)(philox_u32_at(seed, PHILOX_TAG_TIMESTEP, (uint64_t)step,
                                                  (uint32_t)i, 0, 0) %
                                    (uint32_t)T);
        ts->tf[i] = (float)ts->ti[i];
        for (size_t e = 0; e < ts->per; e++)
            ts->eps[(size_t)i * ts->per + e] =
                philox_normal(seed, PHILOX_TAG_NOISE, (uint64_t)step, (uint32_t)i, 0, (uint32_t)e);
    }
    ddpm_q_sample(ts->xt, ts->x0, ts->eps, ts->ti, batch, ts->per, &ts->sch);
    if (ts->prediction == SAMPLER_PRED_V)
        sampler_v_target(ts->tgt, ts->x0, ts->eps, ts->ti, batch, ts->per, &ts->sch);
    else
        memcpy(ts->tgt, ts->eps, (size_t)batch * ts->per * sizeof(float));
}

/* The effective batch made by make_inputs through its micro-batches, in order: samples
 * [i0, i0 + n) go to the micro-batch executor (the last, uneven one to ts->re), forward and
 * backward when train (the gradients zeroed by the first, accumulated by the others; the loss
 * gradient scaled by n / batch, so the sum is the whole batch's mean-loss gradient; dropout
 * drawn by the sample's index in the effective batch, sample_base i0), forward only in
 * evaluation mode otherwise. *loss: the mean over the effective batch; NULL (training): not read
 * (the step's loss is in the executor's step log: the host does not wait for the device).
 * Nonzero on a failure, with the executor's reason in err. */
static int run_batch(struct train_step *ts, int train, uint64_t seed, int64_t step, float *loss,
                     char *err, size_t errlen)
{
    const int batch = ts->batch, micro = ts->tp.micro;
    double sum = 0;
    for (int i0 = 0; i0 < batch; i0 += micro) {
        int n = batch - i0 < micro ? batch - i0 : micro, last = n != micro;
        struct exec *e = last ? ts->re : ts->e;
        const struct unet_io *io = last ? &ts->tp.rio : &ts->tp.io;
        int target = last ? ts->tp.rtarget : ts->tp.target;
        size_t off = (size_t)i0 * ts->per;
        float l = 0, w = (float)n / (float)batch;
        if (exec_upload(e, io->x, ts->xt + off) || exec_upload(e, io->t, ts->tf + i0) ||
            exec_upload(e, target, ts->tgt + off) ||
            (train ? exec_forward_backward(e, i0 == 0, w, seed, (uint64_t)step, i0,
                                           loss ? &l : NULL)
                   : exec_forward(e, &l))) {
            if (err)
                snprintf(err, errlen, "samples %d..%d of the batch: %.256s", i0, i0 + n - 1,
                         exec_last_error(e)->msg);
            return -1;
        }
        sum += (double)w * l;
    }
    if (loss) *loss = (float)sum;
    return 0;
}

int train_step_run(struct train_step *ts, uint64_t seed, int64_t step,
                   const struct optim_config *oc, struct train_step_result *r, char *err,
                   size_t errlen)
{
    make_inputs(ts, step, seed, NULL);
    const float lr = optim_lr(oc, step);
    /* r NULL: neither the loss nor the norm read, the host does not wait for the device */
    int64_t skipped_before = 0;
    if (r) {
        memset(r, 0, sizeof *r);
        r->lr = lr;
        skipped_before = exec_loss_scaler(ts->e)->skipped;
    }
    if (run_batch(ts, 1, seed, step, r ? &r->loss : NULL, err, errlen)) return -1;
    if (exec_optimizer_step(ts->e, oc, step + 1, lr, r ? &r->grad_norm : NULL)) {
        snprintf(err, errlen, "%s", exec_last_error(ts->e)->msg);
        return -1;
    }
    /* f16: a step with an inf/NaN gradient was skipped by exec_optimizer_step */
    if (r) r->skipped = exec_loss_scaler(ts->e)->skipped != skipped_before;
    return 0;
}

int train_step_read(struct train_step *ts, struct exec_step_stats *out, int max, int *n,
                    char *err, size_t errlen)
{
    *n = 0;
    if (exec_step_log(ts->e, out, max, n)) {
        snprintf(err, errlen, "reading the training steps' results: %s",
                 exec_last_error(ts->e)->msg);
        return -1;
    }
    return 0;
}

int train_step_eval(struct train_step *ts, uint64_t seed, int64_t step, const int *t,
                    float *loss)
{
    make_inputs(ts, step, seed, t);
    return run_batch(ts, 0, 0, 0, loss, NULL, 0);
}
