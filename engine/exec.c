/* exec.c - runs a planned graph through a backend out of one allocation.
 * Debug aids for the planner's honesty tests: NaN poisoning of dead storages, canary gaps
 * (arena storages, workspace) checked after every op, and the arena high-water mark.
 * The step on the device and graphs (exec.h): run_graphed runs a kind of work as it comes, then
 * captures it once and replays the capture; the per-step values reach the captured kernels as
 * the backend's device scalars (step_set), never as arguments frozen in the capture.
 */
#include "exec.h"

#include "half.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FILL_BITS 0x7FA5A5A5u   /* a NaN: reading never-written arena memory shows up */
#define POISON_BITS 0x7FC0DEADu /* a NaN: reading a dead tensor shows up */

/* the kinds of work an executor captures, one graph each */
enum {
    EG_FB_FIRST = 0, /* a forward and backward that zeroes the gradients first */
    EG_FB_ACCUM,     /* ... that accumulates into them (a later micro-batch) */
    EG_OPTIM,        /* the optimizer step */
    EG_FORWARD,      /* an evaluation forward (sampling, validation) */
    EG_N
};

struct exec_graph {
    bk_graph *g;     /* the capture, once made */
    int runs;        /* runs so far: the first runs as it comes */
    int off;         /* the capture was refused: runs as it comes from now on */
};

struct exec {
    const struct graph *g;
    const struct plan *p;
    const struct backend *bk;
    bk_ctx *ctx;
    struct exec_opts opts;
    unsigned char *base;        /* the job's one allocation */
    size_t alloc_bytes;         /* its size: the reservation */
    int borrowed;               /* nested: base and ctx are the host's, not freed here */
    struct exec_error err;      /* the last failure */
    int *ends_start, *ends;     /* per op: storages whose lifetime ends there (CSR) */
    int *gz_start, *gz;         /* plan.grads_in_arena: per op, the gradients zeroed before it
                                 * (their storage's first op; CSR of tensor ids) */
    struct bk_seg *segs;        /* a training plan's gradients in tensor order (each one's
                                 * bytes, its parameter's word in the parameter block): the norm
                                 * is summed over them (either layout, the same bits), and the
                                 * optimizer steps them when they are in the arena */
    int n_segs;
    double *seg_ss;             /* their sums of squares */
    uint32_t *guard_host;       /* host copy buffer for canary checks */
    size_t guard_host_words;
    int loss_tensor;
    int eval;                   /* dropout is the identity (exec_forward) */
    int cur_op;                 /* the op running: its 16-bit operands are read from scratch */
    int scaling;                /* f16: dynamic loss scaling with ls */
    struct loss_scaler ls;      /* scale 1 unless scaling */
    struct loss_scaler *lsp;    /* the one in use: ls, or a nested executor's host's (an uneven
                                 * last micro-batch scales its loss like the others) */
    struct exec_profile prof;   /* when opts.profile */
    double *op_seconds;         /* (g->n_ops) when opts.profile */
    float *stage;               /* host staging of one image (NCHW <-> NHWC) where bk->nhwc,
                                 * grown to the largest image uploaded or downloaded so far */
    size_t stage_n;
    /* offload (plan.offload): the host block (master, gradients' copy, m, v, EMA), from the
     * backend's host_alloc (page-locked) where it has one, and the host backend the optimizer
     * runs on there (the CPU's; e->ctx when it is e->bk) */
    unsigned char *hbase;
    int hbase_locked;           /* hbase is host_alloc's */
    const struct backend *hbk;
    bk_ctx *hctx;
    int master_stale;           /* the device weights were written: copy them to the master */
    struct exec *host;          /* nested: the host executor */
    /* a training plan whose gradients the offloading owner (e, or the host of a shared plan)
     * takes to the host block: per run op k, the parameter gradients final after it (written
     * by no later op), gout[gout_start[k] .. gout_start[k + 1]); NULL otherwise */
    int *gout_start, *gout;
    /* the step on the device (the backend's step_* entries): a training plan without offload
     * (whose optimizer runs on the host) and without a cross-entropy loss */
    int dev;
    int ls_host;                /* dev, f16: ls holds the loss scale's state (exec_loss_scaler
                                 * gave it out): to the device before the next step */
    struct exec_graph gr[EG_N];
    struct bk_optim gr_optim;   /* the constants the optimizer's capture was made with */
    /* the host's way (not dev): the step's loss so far, and the optimizer steps' log */
    double step_loss;
    struct exec_step_stats hlog[EXEC_STEP_LOG];
    unsigned long long hlog_n, hlog_read;
};

/* the executor whose host block a training run of e fills: e, or the host of a shared plan */
static struct exec *offload_owner(struct exec *e)
{
    struct exec *o = e->host ? e->host : e;
    return o->p->offload && !e->p->inference ? o : NULL;
}

/* the profile's clock: wall time, or the calling thread's CPU time (EXEC_PROFILE_CPU) */
static double prof_seconds(const struct exec *e)
{
    struct timespec ts;
    clock_gettime(e->opts.profile == EXEC_PROFILE_CPU ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC,
                  &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float *exec_tensor(struct exec *e, int id)
{
    if (id < 0 || e->p->offset[id] < 0) return NULL;
    return (float *)(e->base + e->p->offset[id]);
}

void exec_free(struct exec *e)
{
    if (!e) return;
    for (int k = 0; k < EG_N; k++)
        if (e->gr[k].g) e->bk->graph_free(e->gr[k].g, e->ctx);
    if (e->hbase_locked) {
        /* the copy stream may still read or write it */
        if (backend_supports(e->bk, BK_OP_copy_sync, BK_DTYPE_F32))
            (void)e->bk->copy_sync(e->ctx);
        e->bk->host_free(e->hbase, e->ctx);
    } else {
        free(e->hbase);
    }
    if (!e->borrowed) {
        if (e->base) e->bk->mem_free(e->base, e->ctx);
        if (e->hctx && e->hctx != e->ctx) e->hbk->ctx_free(e->hctx);
        if (e->ctx) e->bk->ctx_free(e->ctx);
    }
    free(e->gout_start);
    free(e->gout);
    free(e->ends_start);
    free(e->ends);
    free(e->gz_start);
    free(e->gz);
    free(e->segs);
    free(e->seg_ss);
    free(e->guard_host);
    free(e->op_seconds);
    free(e->stage);
    free(e);
}

/* e->stage holding at least n floats */
static int stage_reserve(struct exec *e, size_t n)
{
    if (n <= e->stage_n) return EXEC_OK;
    float *p = realloc(e->stage, n * sizeof(float));
    if (!p) return EXEC_ERR_NOMEM;
    e->stage = p;
    e->stage_n = n;
    return EXEC_OK;
}

/* records a failure in e->err and returns status */
__attribute__((format(printf, 5, 6))) static int exec_fail(struct exec *e, int status,
                                                           int bk_status, int op,
                                                           const char *fmt, ...)
{
    e->err.status = status;
    e->err.bk_status = bk_status;
    e->err.op = op;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err.msg, sizeof e->err.msg, fmt, ap);
    va_end(ap);
    return status;
}

static const char *bk_status_name(int rc)
{
    switch (rc) {
    case BK_ERR_INVALID: return "invalid call";
    case BK_ERR_DEVICE: return "device error";
    case BK_ERR_NOMEM: return "out of memory";
    default: return "unknown status";
    }
}

/* a backend call's status rc (nonzero) as the executor's: the backend refusing memory is out of
 * budget, anything else a backend error; the backend's own code is kept in e->err */
static int bk_fail(struct exec *e, int rc, int op, const char *what)
{
    int status = rc == BK_ERR_NOMEM ? EXEC_ERR_BUDGET : EXEC_ERR_BACKEND;
    if (op >= 0)
        return exec_fail(e, status, rc, op, "op %d (%s): %s failed on %s: %s (backend status %d)",
                         op, op_name(plan_op(e->p, e->g, op)->type), what, e->bk->name,
                         bk_status_name(rc),
                         rc);
    return exec_fail(e, status, rc, -1, "%s failed on %s: %s (backend status %d)", what,
                     e->bk->name, bk_status_name(rc), rc);
}

/* rc of a backend call: EXEC_OK, or the failure recorded */
static int bk_check(struct exec *e, int rc, const char *what)
{
    return rc ? bk_fail(e, rc, -1, what) : EXEC_OK;
}

const struct exec_error *exec_last_error(const struct exec *e) { return &e->err; }

const char *exec_status_name(int status)
{
    switch (status) {
    case EXEC_OK: return "ok";
    case EXEC_ERR_NOMEM: return "out of host memory";
    case EXEC_ERR_BACKEND: return "backend error";
    case EXEC_ERR_GUARD: return "write outside a tensor (canary)";
    case EXEC_ERR_ARG: return "invalid argument";
    case EXEC_ERR_BUDGET: return "out of budget";
    default: return "unknown status";
    }
}

/* the canary gaps before and after the workspace: the fill pattern */
static int fill_ws_guards(struct exec *e)
{
    const struct plan *p = e->p;
    size_t words = p->ws_guard_bytes / 4;
    if (!words) return EXEC_OK;
    float fill = bits_to_float(FILL_BITS);
    int rc = e->bk->mem_set_f32((float *)(e->base + p->ws_off - p->ws_guard_bytes), fill, words,
                                e->ctx);
    if (!rc)
        rc = e->bk->mem_set_f32((float *)(e->base + p->ws_off + p->ws_bytes), fill, words, e->ctx);
    return bk_check(e, rc, "filling the workspace canaries");
}

/* A per-op list (CSR): *start (n_ops + 2 entries) and *items hold, for each op k, val[i] (i
 * itself when val is NULL) of every i < n with key[i] == k, in the order of i; key[i] < 0:
 * listed nowhere. 0, or -1 out of memory (what was made stays for exec_free). */
static int csr_by_op(const int *key, const int *val, int n, int n_ops, int **start, int **items)
{
    *start = calloc((size_t)n_ops + 2, sizeof **start);
    *items = malloc(((size_t)n + 1) * sizeof **items);
    int *fill = calloc((size_t)n_ops + 1, sizeof *fill);
    if (!*start || !*items || !fill) {
        free(fill);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (key[i] >= 0) (*start)[key[i] + 1]++;
    for (int k = 0; k < n_ops; k++) (*start)[k + 1] += (*start)[k];
    for (int i = 0; i < n; i++)
        if (key[i] >= 0) (*items)[(*start)[key[i]] + fill[key[i]]++] = val ? val[i] : i;
    free(fill);
    return 0;
}

/* e->gout: each parameter gradient listed at the last run op that writes it */
static int setup_grads_out(struct exec *e)
{
    const struct graph *g = e->g;
    const struct plan *p = e->p;
    const int n_run = p->n_run_ops;
    int *last = malloc(((size_t)g->n_tensors + 1) * sizeof *last);
    int *key = malloc(((size_t)g->n_tensors + 1) * sizeof *key);
    int *grad = malloc(((size_t)g->n_tensors + 1) * sizeof *grad);
    int rc = -1;
    if (last && key && grad) {
        for (int t = 0; t < g->n_tensors; t++) last[t] = -1;
        for (int k = 0; k < n_run; k++) {
            const struct op *o = plan_op(p, g, k);
            for (int i = 0; i < o->n_out; i++)
                if (o->out[i] >= 0 && o->out[i] < g->n_tensors) last[o->out[i]] = k;
        }
        for (int t = 0; t < g->n_tensors; t++) {
            grad[t] = g->tensors[t]->grad;
            key[t] = g->tensors[t]->kind == TENSOR_PARAM && grad[t] >= 0 ? last[grad[t]] : -1;
        }
        rc = csr_by_op(key, grad, g->n_tensors, n_run, &e->gout_start, &e->gout);
    }
    free(last);
    free(key);
    free(grad);
    return rc;
}

/* e->gz_start, e->gz: each gradient of a grads_in_arena plan, at the op its storage starts at
 * (its first writer, whose kernel accumulates into it) */
static int gz_lists(struct exec *e)
{
    const struct plan *p = e->p;
    int *key = malloc(((size_t)p->n_tensors + 1) * sizeof *key);
    int rc = !key;
    for (int t = 0; key && t < p->n_tensors; t++)
        key[t] = e->g->tensors[t]->kind == TENSOR_GRAD ? p->st[p->storage[t]].first : -1;
    if (!rc) rc = csr_by_op(key, NULL, p->n_tensors, p->n_run_ops, &e->gz_start, &e->gz);
    free(key);
    return rc ? exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for the gradient lists")
              : EXEC_OK;
}

/* e->segs: each gradient once (its owner: the first parameter naming it), in tensor order */
static int grad_segments(struct exec *e)
{
    const struct plan *p = e->p;
    const struct graph *g = e->g;
    e->segs = malloc(((size_t)g->n_tensors + 1) * sizeof *e->segs);
    e->seg_ss = malloc(((size_t)g->n_tensors + 1) * sizeof *e->seg_ss);
    int *param_of = malloc(((size_t)g->n_tensors + 1) * sizeof *param_of);
    if (!e->segs || !e->seg_ss || !param_of) {
        free(param_of);
        return exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for the gradient list");
    }
    graph_grad_owners(g, param_of);
    e->n_segs = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t]->kind == TENSOR_GRAD && param_of[t] >= 0 && p->offset[t] >= 0)
            e->segs[e->n_segs++] = (struct bk_seg){
                exec_tensor(e, t), ((size_t)p->offset[param_of[t]] - p->params_off) / 4,
                g->tensors[t]->numel};
    free(param_of);
    return EXEC_OK;
}

/* everything after base and ctx: the bytes from `from` on start as zero below the arena and as
 * the fill pattern from the arena on (the persistent parts must start at zero: padding between
 * parameters stays zero for the flat optimizer passes), then the host-side tables */
static int exec_setup(struct exec *e, size_t from)
{
    const struct graph *g = e->g;
    const struct plan *p = e->p;
    const struct backend *bk = e->bk;
    int rc;
    if (p->arena_off > from &&
        (rc = bk->mem_set_f32((float *)(e->base + from), 0.0f, (p->arena_off - from) / 4, e->ctx)))
        return bk_fail(e, rc, -1, "zeroing the persistent part");
    /* a job's own arena to the end of its reservation (a nested plan's bytes included) */
    size_t end = e->borrowed ? p->total_bytes : e->alloc_bytes;
    if ((rc = bk->mem_set_f32((float *)(e->base + p->arena_off), bits_to_float(FILL_BITS),
                              (end - p->arena_off) / 4, e->ctx)))
        return bk_fail(e, rc, -1, "filling the arena");
    if ((rc = fill_ws_guards(e))) return rc;
    {
        int *last = malloc(((size_t)p->n_storages + 1) * sizeof *last);
        for (int s = 0; last && s < p->n_storages; s++) last[s] = p->st[s].last;
        int bad = !last || csr_by_op(last, NULL, p->n_storages, p->n_run_ops, &e->ends_start,
                                     &e->ends);
        free(last);
        if (bad) goto nomem;
    }
    if (p->grads_in_arena && (rc = gz_lists(e))) return rc;
    if (!p->inference && (rc = grad_segments(e))) return rc;
    if (e->opts.check_guards) {
        /* a storage's gap is at most guard + PLAN_ALIGN - 1 bytes, a workspace gap guard
         * rounded up to PLAN_ALIGN */
        size_t most = p->guard_bytes + PLAN_ALIGN;
        if (p->ws_guard_bytes > most) most = p->ws_guard_bytes;
        e->guard_host_words = most / 4;
        e->guard_host = malloc(e->guard_host_words * 4);
        if (!e->guard_host) goto nomem;
    }
    if (bk->nhwc) {
        /* the inputs are uploaded every step: stage them from the start */
        size_t most = 0;
        for (int i = 0; i < g->n_tensors; i++)
            if (g->tensors[i]->image && g->tensors[i]->kind == TENSOR_INPUT &&
                g->tensors[i]->numel > most)
                most = g->tensors[i]->numel;
        if (stage_reserve(e, most)) goto nomem;
    }
    if (e->opts.profile) {
        e->op_seconds = calloc((size_t)g->n_ops + 1, sizeof *e->op_seconds);
        if (!e->op_seconds) goto nomem;
        e->prof.op_seconds = e->op_seconds;
    }
    if (offload_owner(e) && setup_grads_out(e)) goto nomem;
    return EXEC_OK;
nomem:
    return exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for the executor's tables");
}

static struct exec *exec_new(const struct graph *g, const struct plan *p,
                             const struct backend *bk, const struct exec_opts *opts)
{
    struct exec *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->g = g;
    e->p = p;
    e->bk = bk;
    if (opts) e->opts = *opts;
    e->err.op = -1;
    e->loss_tensor = -1;
    e->scaling = p->strategy.precision == STRATEGY_PRECISION_F16 && !p->inference;
    if (e->scaling) loss_scaler_init(&e->ls, &p->strategy.loss_scale);
    else e->ls.scale = 1.0f;
    e->lsp = &e->ls;
    for (int k = 0; k < g->n_ops; k++) /* never recomputed: the same id in the run order */
        if (g->ops[k].type == OP_MSE || g->ops[k].type == OP_XENT)
            e->loss_tensor = g->ops[k].out[0];
    return e;
}

/* a failed init: the reason to opts->init_error, everything freed */
static int exec_init_failed(struct exec *e, const struct exec_opts *opts, int rc)
{
    if (opts && opts->init_error) *opts->init_error = e->err;
    exec_free(e);
    return rc;
}

static void init_error_nomem(const struct exec_opts *opts)
{
    if (!opts || !opts->init_error) return;
    memset(opts->init_error, 0, sizeof *opts->init_error);
    opts->init_error->status = EXEC_ERR_NOMEM;
    opts->init_error->op = -1;
    snprintf(opts->init_error->msg, sizeof opts->init_error->msg,
             "out of host memory for the executor");
}

/* EXEC_OK, or EXEC_ERR_ARG naming the first entry of e's backend that e's plan needs and the
 * backend lacks (NULL, or not on that dtype: backend_supports), and the op needing it */
static int exec_check_backend(struct exec *e)
{
    const struct backend *bk = e->bk;
    static const enum bk_op every[] = {BK_OP_ctx_init, BK_OP_ctx_free,     BK_OP_mem_alloc,
                                       BK_OP_mem_free, BK_OP_mem_upload,   BK_OP_mem_download,
                                       BK_OP_mem_set_f32, BK_OP_sync,      BK_OP_scale_fwd};
    static const enum bk_op training[] = {BK_OP_sumsq, BK_OP_adamw_step, BK_OP_ema_update};
    static const char *const dname[] = {"f32", "f16", "bf16"};
    for (size_t i = 0; i < sizeof every / sizeof *every; i++)
        if (!backend_supports(bk, every[i], BK_DTYPE_F32))
            return exec_fail(e, EXEC_ERR_ARG, 0, -1, "the %s backend has no %s", bk->name,
                             backend_op_name(every[i]));
    for (size_t i = 0; !e->p->inference && !e->p->nested && i < sizeof training / sizeof *training;
         i++)
        if (!backend_supports(bk, training[i], BK_DTYPE_F32))
            return exec_fail(e, EXEC_ERR_ARG, 0, -1, "the %s backend has no %s for training",
                             bk->name, backend_op_name(training[i]));
    struct exec_need need[EXEC_NEEDS_MAX];
    for (int k = 0; k < e->p->n_run_ops; k++) {
        const int n = exec_op_needs(e, k, need);
        for (int i = 0; i < n; i++)
            if (!backend_supports(bk, need[i].op, need[i].dtype))
                return exec_fail(e, EXEC_ERR_ARG, 0, k, "the %s backend has no %s on %s, which "
                                 "op %d (%s) needs", bk->name, backend_op_name(need[i].op),
                                 dname[need[i].dtype], k, op_name(plan_op(e->p, e->g, k)->type));
    }
    return EXEC_OK;
}

/* whether e takes the step on the device: the backend has it, e trains without offload (its own
 * or its host's: the optimizer then runs on the host) and its loss is an fp32 MSE (the device's
 * loss scale reaches mse_step_bwd only) */
static int dev_capable(const struct exec *e)
{
    static const enum bk_op step_ops[] = {
        BK_OP_step_set,      BK_OP_dropout_step_fwd, BK_OP_dropout_step_bwd, BK_OP_mse_step_bwd,
        BK_OP_loss_step_add, BK_OP_optim_step,       BK_OP_scaler_set,       BK_OP_step_read,
    };
    for (size_t i = 0; i < sizeof step_ops / sizeof *step_ops; i++)
        if (!backend_supports(e->bk, step_ops[i], BK_DTYPE_F32)) return 0;
    if (e->p->inference || e->p->offload || (e->host && e->host->p->offload)) return 0;
    for (int k = 0; k < e->g->n_ops; k++)
        if (e->g->ops[k].type == OP_XENT) return 0;
    return e->loss_tensor < 0 || e->g->tensors[e->loss_tensor]->dtype == DTYPE_F32;
}

/* the host's loss scale state to the device (in stream order) */
static int scaler_upload(struct exec *e)
{
    const struct bk_scaler sc = {e->ls.scale, e->ls.good_steps, e->ls.skipped};
    int rc = e->bk->scaler_set(&sc, e->ctx);
    if (rc) return bk_fail(e, rc, -1, "setting the device's loss scale");
    e->ls_host = 0;
    return EXEC_OK;
}

/* a job executor's device scalars at the start: its loss scale, an empty step log */
static int dev_start(struct exec *e)
{
    int rc = scaler_upload(e);
    if (rc) return rc;
    const struct bk_step st = {.reset = 1};
    rc = e->bk->step_set(&st, e->ctx);
    return rc ? bk_fail(e, rc, -1, "resetting the device's step scalars") : EXEC_OK;
}

int exec_init(struct exec **out, const struct graph *g, const struct plan *p,
              const struct backend *bk, const struct exec_opts *opts)
{
    int rc;
    struct exec *e = exec_new(g, p, bk, opts);
    if (!e) {
        init_error_nomem(opts);
        return EXEC_ERR_NOMEM;
    }
    if (p->nested) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "a nested plan runs through exec_init_nested");
        return exec_init_failed(e, opts, rc);
    }
    if (p->bound_only) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "a bound-only plan places no arena");
        return exec_init_failed(e, opts, rc);
    }
    if ((rc = exec_check_backend(e))) return exec_init_failed(e, opts, rc);
    if ((p->n_cvt || p->work_bytes) && !backend_supports(bk, BK_OP_convert, BK_DTYPE_F32)) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "the %s backend has no 16-bit conversions: plan "
                       "it in f32", bk->name);
        return exec_init_failed(e, opts, rc);
    }
    if ((rc = bk->ctx_init(&e->ctx, e->opts.threads))) {
        rc = bk_fail(e, rc, -1, "creating the backend context");
        return exec_init_failed(e, opts, rc);
    }
    if (e->opts.budget && (!backend_supports(bk, BK_OP_ctx_set_budget, BK_DTYPE_F32) ||
                           bk->ctx_set_budget(e->ctx, e->opts.budget))) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "the %s backend cannot enforce a budget",
                       bk->name);
        return exec_init_failed(e, opts, rc);
    }
    if ((rc = bk->mem_alloc((void **)&e->base, p->total_bytes, e->ctx))) {
        e->base = NULL;
        rc = bk_fail(e, rc, -1, "the reservation");
        snprintf(e->err.msg, sizeof e->err.msg,
                 "cannot reserve the plan's %zu bytes (%.1f MiB) on %s: %s (backend status %d)",
                 p->total_bytes, (double)p->total_bytes / 1048576.0, bk->name,
                 bk_status_name(e->err.bk_status), e->err.bk_status);
        return exec_init_failed(e, opts, rc);
    }
    e->alloc_bytes = p->total_bytes;
    if ((rc = exec_setup(e, 0))) return exec_init_failed(e, opts, rc);
    e->dev = dev_capable(e);
    if (e->dev && (rc = dev_start(e))) return exec_init_failed(e, opts, rc);
    if (p->offload) {
        /* the host block, page-locked where the backend can (its copies then overlap the
         * backward): zeroed like the persistent part (parameter padding stays zero) */
        if (backend_supports(bk, BK_OP_host_alloc, BK_DTYPE_F32)) {
            if ((rc = bk->host_alloc((void **)&e->hbase, p->host_bytes + 1, e->ctx))) {
                e->hbase = NULL;
                rc = bk_fail(e, rc, -1, "locking the offloaded state's host memory");
                return exec_init_failed(e, opts, rc);
            }
            e->hbase_locked = 1;
            memset(e->hbase, 0, p->host_bytes + 1);
        } else {
            e->hbase = calloc(1, p->host_bytes + 1);
        }
        if (!e->hbase) {
            rc = exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for the offloaded "
                           "state (%zu bytes)", p->host_bytes);
            return exec_init_failed(e, opts, rc);
        }
        e->hbk = backend_cpu();
        if (e->hbk == bk) {
            e->hctx = e->ctx;
        } else if ((rc = e->hbk->ctx_init(&e->hctx, e->opts.threads))) {
            e->hctx = NULL;
            rc = bk_fail(e, rc, -1, "creating the host optimizer's context");
            return exec_init_failed(e, opts, rc);
        }
        e->master_stale = 1;
    }
    *out = e;
    return EXEC_OK;
}

int exec_init_nested(struct exec **out, const struct graph *g, const struct plan *sub,
                     struct exec *host, const struct exec_opts *opts)
{
    int rc;
    struct exec *e = exec_new(g, sub, host->bk, opts);
    if (!e) {
        init_error_nomem(opts);
        return EXEC_ERR_NOMEM;
    }
    e->borrowed = 1;
    e->lsp = host->lsp;
    e->base = host->base;
    e->ctx = host->ctx;
    e->host = host;
    e->alloc_bytes = host->alloc_bytes;
    if (!sub->nested || host->borrowed || sub->bound_only) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "not a nested plan over a job's own executor");
        return exec_init_failed(e, opts, rc);
    }
    if ((rc = exec_check_backend(e))) return exec_init_failed(e, opts, rc);
    if ((sub->n_cvt || sub->work_bytes) &&
        !backend_supports(host->bk, BK_OP_convert, BK_DTYPE_F32)) {
        rc = exec_fail(e, EXEC_ERR_ARG, 0, -1, "the %s backend has no 16-bit conversions",
                       host->bk->name);
        return exec_init_failed(e, opts, rc);
    }
    if (sub->total_bytes > host->alloc_bytes) {
        rc = exec_fail(e, EXEC_ERR_BUDGET, 0, -1,
                       "the nested plan needs %zu bytes of the reservation, which holds %zu "
                       "(plan_reserve_nested before the host's exec_init)",
                       sub->total_bytes, host->alloc_bytes);
        return exec_init_failed(e, opts, rc);
    }
    /* only the nested plan's own bytes start fresh: its parameters are the host's */
    if ((rc = exec_setup(e, sub->inputs_off))) return exec_init_failed(e, opts, rc);
    e->dev = host->dev && dev_capable(e);
    *out = e;
    return EXEC_OK;
}

/* an image the backend stores NHWC: host data and flattened views are NCHW */
static int nhwc_image(const struct exec *e, const struct tensor *t)
{
    return e->bk->nhwc && t->image;
}

/* y (N, b, a) = x (N, a, b) per image, on the host: NCHW <-> NHWC with (a, b) = (C, HW) or
 * (HW, C) */
static void host_transpose(float *y, const float *x, int n, int a, int b)
{
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * a * b;
        float *ys = y + (size_t)s * a * b;
        for (int i = 0; i < a; i++)
            for (int j = 0; j < b; j++) ys[(size_t)j * a + i] = xs[(size_t)i * b + j];
    }
}

/* n host floats to 16-bit dtype (y) and back (x): kernels/half.h, as every backend rounds */
static void host_to16(uint16_t *y, const float *x, size_t n, int dtype)
{
    for (size_t i = 0; i < n; i++)
        y[i] = dtype == DTYPE_BF16 ? half_f32_to_bf16(x[i]) : half_f32_to_f16(x[i]);
}

static void host_from16(float *y, const uint16_t *x, size_t n, int dtype)
{
    for (size_t i = 0; i < n; i++)
        y[i] = dtype == DTYPE_BF16 ? half_bf16_to_f32(x[i]) : half_f16_to_f32(x[i]);
}

/* host data is NCHW fp32; an image of an NHWC backend is transposed, and a 16-bit tensor
 * converted, through e->stage (numel floats, then numel 16-bit values) */
int exec_upload(struct exec *e, int id, const float *host)
{
    float *d = exec_tensor(e, id);
    if (!d) return exec_fail(e, EXEC_ERR_ARG, 0, -1, "tensor %d has no place in the plan", id);
    const struct tensor *t = e->g->tensors[id];
    int conv = nhwc_image(e, t), low = t->dtype != DTYPE_F32;
    if ((conv || low) && stage_reserve(e, t->numel + (low ? t->numel / 2 + 1 : 0)))
        return exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for staging");
    const void *src = host;
    if (conv) {
        host_transpose(e->stage, host, t->d[0], t->d[1], t->d[2] * t->d[3]);
        src = host = e->stage;
    }
    if (low) {
        uint16_t *h16 = (uint16_t *)(e->stage + t->numel);
        host_to16(h16, host, t->numel, t->dtype);
        src = h16;
    }
    if (t->kind == TENSOR_PARAM) e->master_stale = 1;
    return bk_check(e, e->bk->mem_upload(d, src, tensor_bytes(t), e->ctx), "an upload");
}

int exec_download(struct exec *e, int id, float *host)
{
    float *d = exec_tensor(e, id);
    if (!d) return exec_fail(e, EXEC_ERR_ARG, 0, -1, "tensor %d has no place in the plan", id);
    const struct tensor *t = e->g->tensors[id];
    int conv = nhwc_image(e, t), low = t->dtype != DTYPE_F32;
    if ((conv || low) && stage_reserve(e, t->numel + (low ? t->numel / 2 + 1 : 0)))
        return exec_fail(e, EXEC_ERR_NOMEM, 0, -1, "out of host memory for staging");
    uint16_t *h16 = low ? (uint16_t *)(e->stage + t->numel) : NULL;
    float *dst = conv ? e->stage : host;
    int rc = e->bk->mem_download(low ? (void *)h16 : (void *)dst, d, tensor_bytes(t), e->ctx);
    if (rc) return bk_fail(e, rc, -1, "a download");
    if (low) host_from16(dst, h16, t->numel, t->dtype);
    if (conv) host_transpose(host, e->stage, t->d[0], t->d[2] * t->d[3], t->d[1]);
    return EXEC_OK;
}

/* where part of parameter id is: on the device, or (*in_host set) in the offloaded host block */
static unsigned char *part_ptr(struct exec *e, enum exec_part part, int id, int *in_host)
{
    const struct plan *p = e->p;
    *in_host = 0;
    if (id < 0 || id >= e->g->n_tensors || e->g->tensors[id]->kind != TENSOR_PARAM) return NULL;
    if (p->inference && part != EXEC_PART_WEIGHT) return NULL; /* no EMA, no moments */
    size_t rel = (size_t)p->offset[id] - p->params_off;
    if (p->offload && part != EXEC_PART_WEIGHT) {
        *in_host = 1;
        return e->hbase + rel +
               (part == EXEC_PART_EMA      ? p->host_ema_off
                : part == EXEC_PART_ADAM_M ? p->host_adam_m_off
                                           : p->host_adam_v_off);
    }
    size_t base = part == EXEC_PART_EMA      ? p->ema_off
                  : part == EXEC_PART_ADAM_M ? p->adam_m_off
                  : part == EXEC_PART_ADAM_V ? p->adam_v_off
                                             : p->params_off;
    return e->base + base + rel;
}

int exec_nested_sync(struct exec *sub)
{
    const struct plan *p = sub->p;
    if (!p->weights_from_host) return EXEC_OK;
    const struct exec *h = sub->host;
    const struct plan *hp = h->p;
    for (int t = 0; t < sub->g->n_tensors; t++) {
        const struct tensor *tt = sub->g->tensors[t];
        if (tt->kind != TENSOR_PARAM) continue;
        int w = graph_find_param(h->g, tt->name); /* plan_make_nested checked it exists */
        const unsigned char *src =
            h->hbase + hp->host_ema_off + ((size_t)hp->offset[w] - hp->params_off);
        int rc = sub->bk->mem_upload(sub->base + p->offset[t], src, tensor_bytes(tt), sub->ctx);
        if (rc) return bk_fail(sub, rc, -1, "uploading the host's EMA weights");
    }
    return EXEC_OK;
}

int exec_download_part(struct exec *e, enum exec_part part, int id, float *host)
{
    int in_host;
    unsigned char *d = part_ptr(e, part, id, &in_host);
    if (!d) return exec_fail(e, EXEC_ERR_ARG, 0, -1, "no part %d of tensor %d", (int)part, id);
    size_t bytes = tensor_bytes(e->g->tensors[id]);
    if (in_host) {
        memcpy(host, d, bytes);
        return EXEC_OK;
    }
    return bk_check(e, e->bk->mem_download(host, d, bytes, e->ctx), "a download");
}

int exec_upload_part(struct exec *e, enum exec_part part, int id, const float *host)
{
    int in_host;
    unsigned char *d = part_ptr(e, part, id, &in_host);
    if (!d) return exec_fail(e, EXEC_ERR_ARG, 0, -1, "no part %d of tensor %d", (int)part, id);
    size_t bytes = tensor_bytes(e->g->tensors[id]);
    if (in_host) {
        memcpy(d, host, bytes);
        return EXEC_OK;
    }
    e->master_stale = 1;
    return bk_check(e, e->bk->mem_upload(d, host, bytes, e->ctx), "an upload");
}

int exec_reset_state(struct exec *e)
{
    const struct plan *p = e->p;
    if (p->inference)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "an inference plan has no EMA or AdamW state");
    size_t words = p->params_bytes / 4;
    int rc;
    if (p->offload) {
        /* the master and the EMA <- the device weights; the moments zero */
        if ((rc = e->bk->mem_download(e->hbase + p->host_master_off, e->base + p->params_off,
                                      p->params_bytes, e->ctx)))
            return bk_fail(e, rc, -1, "copying the weights to the host");
        e->master_stale = 0;
        memset(e->hbase + p->host_adam_m_off, 0, 2 * p->params_bytes);
        memcpy(e->hbase + p->host_ema_off, e->hbase + p->host_master_off, p->params_bytes);
        return EXEC_OK;
    }
    rc = e->bk->mem_set_f32((float *)(e->base + p->adam_m_off), 0.0f, 2 * words, e->ctx);
    if (rc) return bk_fail(e, rc, -1, "zeroing the AdamW state");
    /* ema <- params: scale by 1 is a copy through the backend */
    rc = e->bk->scale_fwd((float *)(e->base + p->ema_off), (float *)(e->base + p->params_off),
                          1.0f, words, e->ctx);
    return bk_check(e, rc, "copying the weights to the EMA");
}

/* canary gap of storage s: from the end of its bytes to the end of its placed block. Storages
 * with disjoint lifetimes may share bytes, gaps included, so a gap is filled when its storage
 * comes to life and checked only while it lives. */
static void guard_range(const struct exec *e, int s, size_t *start, size_t *words)
{
    const struct plan *p = e->p;
    size_t guard = p->guard_bytes;
    *start = (size_t)p->st[s].offset + p->st[s].bytes;
    size_t end = (size_t)p->st[s].offset + plan_align(p->st[s].bytes + guard);
    *words = (end - *start) / 4;
    if (*words > e->guard_host_words) *words = e->guard_host_words;
}

static int fill_guards(struct exec *e, int k)
{
    for (int s = 0; s < e->p->n_storages; s++) {
        if (e->p->st[s].first != k) continue;
        size_t start, words;
        guard_range(e, s, &start, &words);
        int rc = e->bk->mem_set_f32((float *)(e->base + start), bits_to_float(FILL_BITS),
                                    words, e->ctx);
        if (rc) return bk_fail(e, rc, k, "filling a canary");
    }
    return EXEC_OK;
}

/* words of the fill pattern at start, else EXEC_ERR_GUARD naming what op k overwrote */
static int check_gap(struct exec *e, int k, size_t start, size_t words, const char *what)
{
    int rc = e->bk->mem_download(e->guard_host, e->base + start, words * 4, e->ctx);
    if (rc) return bk_fail(e, rc, k, "reading a canary");
    for (size_t i = 0; i < words; i++)
        if (e->guard_host[i] != FILL_BITS) {
            exec_fail(e, EXEC_ERR_GUARD, 0, k, "op %d (%s) wrote %s (+%zu bytes into the gap)",
                      k, op_name(plan_op(e->p, e->g, k)->type), what, 4 * i);
            fprintf(stderr, "exec: %s\n", e->err.msg);
            return EXEC_ERR_GUARD;
        }
    return EXEC_OK;
}

static int check_guards(struct exec *e, int k)
{
    const struct plan *p = e->p;
    int rc;
    if (p->ws_guard_bytes) {
        size_t words = p->ws_guard_bytes / 4;
        if ((rc = check_gap(e, k, p->ws_off - p->ws_guard_bytes, words,
                            "before the workspace")) ||
            (rc = check_gap(e, k, p->ws_off + p->ws_bytes, words,
                            "past the end of the workspace")))
            return rc;
    }
    for (int s = 0; s < p->n_storages; s++) {
        if (p->st[s].first > k || p->st[s].last < k) continue;
        size_t start, words;
        guard_range(e, s, &start, &words);
        char what[48];
        snprintf(what, sizeof what, "past storage %d", s);
        if ((rc = check_gap(e, k, start, words, what))) return rc;
    }
    return EXEC_OK;
}

/* the address the running op's kernel reads or writes tensor t at: its scratch when the plan
 * converts it for this op, a weight's 16-bit working copy when a 16-bit kernel reads it as it is
 * (only convolution and linear weights have one, and only those ops read them), else its own
 * bytes */
static void *opnd(struct exec *e, int t)
{
    const struct plan *p = e->p;
    if (t < 0) return NULL;
    for (int i = p->cvt_start[e->cur_op]; i < p->cvt_start[e->cur_op + 1]; i++)
        if (p->cvt[i].tensor == t) return e->base + p->st[p->cvt[i].storage].offset;
    if (t < p->n_tensors && p->work_offset[t] >= 0) return e->base + p->work_offset[t];
    return exec_tensor(e, t);
}

/* the bytes behind a conversion: a weight's working copy where it has one, else the tensor's
 * own (a weight's fp32 master) */
static void *cvt_src(struct exec *e, const struct plan_cvt *c)
{
    if (c->tensor < e->p->n_tensors && e->p->work_offset[c->tensor] >= 0)
        return e->base + e->p->work_offset[c->tensor];
    return exec_tensor(e, c->tensor);
}

/* op k's converted operands into their scratch (before) or its outputs back (after) */
static int convert_operands(struct exec *e, int k, int after)
{
    const struct plan *p = e->p;
    for (int i = p->cvt_start[k]; i < p->cvt_start[k + 1]; i++) {
        const struct plan_cvt *c = &p->cvt[i];
        if (after ? !c->store : !c->load) continue;
        void *s = e->base + p->st[c->storage].offset;
        size_t n = plan_tensor(e->p, e->g, c->tensor)->numel;
        int rc = after ? e->bk->convert(cvt_src(e, c), c->dtype, s, c->kdtype, n, e->ctx)
                       : e->bk->convert(s, c->kdtype, cvt_src(e, c), c->dtype, n, e->ctx);
        if (rc) return rc;
    }
    return BK_OK;
}

/* the 16-bit working copy of the weights from the fp32 master weights */
static int refresh_work(struct exec *e)
{
    const struct plan *p = e->p;
    if (!p->work_bytes) return EXEC_OK;
    int lo = graph_low_dtype(e->g);
    for (int t = 0; t < e->g->n_tensors; t++) {
        if (p->work_offset[t] < 0) continue;
        int rc = e->bk->convert(e->base + p->work_offset[t], lo, exec_tensor(e, t), DTYPE_F32,
                                e->g->tensors[t]->numel, e->ctx);
        if (rc) return bk_fail(e, rc, -1, "the 16-bit working weights");
    }
    return EXEC_OK;
}

#define P(i) opnd(e, o->in[i])
#define Q(i) opnd(e, o->out[i])
/* the operands of the guest op a fused host runs (plan.fuse_guest) */
#define PG(i) opnd(e, go->in[i])
#define QG(i) opnd(e, go->out[i])

/* a group norm op's shape on kernel dtype kd */
static struct bk_groupnorm gn_shape(const struct op *o, int kd)
{
    struct bk_groupnorm s = {o->a.gn.n, o->a.gn.c,   o->a.gn.hw, o->a.gn.groups,
                             o->a.gn.eps, o->a.gn.silu, kd};
    return s;
}

/* The op table: for each op type the function that runs it (run_*) and, beside it, the one that
 * names the backend entries it calls on which dtypes (needs_*: exec_op_needs), so that what a
 * plan is checked for (exec_check_backend) and what a step calls are written in one place.
 * test_backend_ops runs each op with every other entry recording a call. */

/* what a run function gets besides the op and its operands (P, Q) */
struct run_ctx {
    int kd;                  /* the typed kernels' dtype (plan.op_dtype) */
    int src;                 /* the graph op this is: a recomputed copy draws its original's
                              * dropout mask */
    void *ws;                /* the plan's workspace */
    const struct tensor *t0; /* the first input, or NULL */
    float dloss_scale;
    uint64_t seed, step;
    int sample_base;
};

/* need[n] = (op, dt); n + 1 */
static int need_put(struct exec_need *need, int n, enum bk_op op, int dt)
{
    need[n].op = op;
    need[n].dtype = dt;
    return n + 1;
}

/* a memory-bound kernel's entry: the typed one on kd where the backend has typed ones, else the
 * fp32 one (the plan then converts 16-bit operands around it); n + 1 */
static int need_mem(const struct exec *e, struct exec_need *need, int n, enum bk_op typed,
                    enum bk_op plain, int kd)
{
    return e->bk->typed ? need_put(need, n, typed, kd) : need_put(need, n, plain, BK_DTYPE_F32);
}

/* needs_NAME for an op whose run calls the memory-bound entry FN alone */
#define NEEDS_MEM(name, fn)                                                                       \
    static int needs_##name(const struct exec *e, const struct op *o, int kd,                     \
                            struct exec_need *need)                                               \
    {                                                                                             \
        return need_mem(e, need, 0, BK_OP_TYPED_##fn, BK_OP_##fn, kd);                            \
    }

/* The group norm ops and their broadcast adds on the typed kernels, fused where the plan says
 * (memplan.c's plan_fusions: o is run op k, go its guest or NULL); every group norm op where the
 * backend has typed kernels, and every fused host. The fused kernels keep the unfused ops'
 * rounding points, so a fused step gives the unfused step's bits. */
static int groupnorm_typed(struct exec *e, const struct op *o, const struct op *go, int kd,
                           void *ws)
{
    const struct bk_typed *tk = e->bk->typed;
    bk_ctx *c = e->ctx;
    struct bk_groupnorm s;
    switch (o->type) {
    case OP_GROUPNORM: /* guest: the broadcast add before, x' = x + b stored to its output */
        s = gn_shape(o, kd);
        if (go)
            return tk->groupnorm_fwd(Q(0), Q(1), Q(2), QG(0), PG(0), PG(1), NULL, NULL, P(1),
                                     P(2), ws, &s, c);
        return tk->groupnorm_fwd(Q(0), Q(1), Q(2), NULL, P(0), NULL, NULL, NULL, P(1), P(2), ws,
                                 &s, c);
    case OP_ADD_BCAST: /* the host of the group norm before: y = gn(x) + b */
        s = gn_shape(go, kd);
        return tk->groupnorm_fwd(Q(0), QG(1), QG(2), NULL, PG(0), NULL, P(1), NULL, PG(1), PG(2),
                                 ws, &s, c);
    case OP_ADD: /* the host of the group norm before: y = gn(x) + r, r the other input */
        s = gn_shape(go, kd);
        return tk->groupnorm_fwd(Q(0), QG(1), QG(2), NULL, PG(0), NULL, NULL,
                                 o->in[0] == go->out[0] ? P(1) : P(0), PG(1), PG(2), ws, &s, c);
    case OP_GROUPNORM_BWD: {
        s = gn_shape(o, kd);
        const float *beta = o->a.gn.silu ? P(5) : NULL;
        if (!go)
            return tk->groupnorm_bwd(Q(0), Q(1), Q(2), NULL, P(0), P(1), P(2), beta, P(3), P(4),
                                     o->accum[0], 0, 0, ws, &s, c);
        /* guest: the broadcast add's backward after, db = the sum of dx; its dx a copy of ours
         * (nothing to do in place) */
        int rc = tk->groupnorm_bwd(Q(0), Q(1), Q(2), QG(1), P(0), P(1), P(2), beta, P(3), P(4),
                                   o->accum[0], go->accum[1], 1, ws, &s, c);
        if (!rc && go->out[0] >= 0 && QG(0) != PG(0))
            rc = tk->copy_grad(QG(0), PG(0), go->accum[0],
                               plan_tensor(e->p, e->g, go->in[0])->numel, kd, c);
        return rc;
    }
    case OP_ADD_BCAST_BWD: { /* the host of the group norm's backward after: db = the sum of dy */
        int rc = 0;
        if (Q(0) != P(0))
            rc = tk->copy_grad(Q(0), P(0), o->accum[0], plan_tensor(e->p, e->g, o->in[0])->numel,
                               kd, c);
        s = gn_shape(go, kd);
        if (!rc)
            rc = tk->groupnorm_bwd(QG(0), QG(1), QG(2), Q(1), PG(0), PG(1), PG(2),
                                   go->a.gn.silu ? PG(5) : NULL, PG(3), PG(4), go->accum[0],
                                   o->accum[1], 0, ws, &s, c);
        return rc;
    }
    default:
        return BK_ERR_INVALID;
    }
}
static int needs_groupnorm_typed(const struct exec *e, const struct op *o, int kd,
                                 struct exec_need *need)
{
    int n = need_put(need, 0, BK_OP_TYPED_groupnorm_ws_bytes, kd);
    if (o->type == OP_GROUPNORM_BWD || o->type == OP_ADD_BCAST_BWD) {
        n = need_put(need, n, BK_OP_TYPED_groupnorm_bwd, kd);
        return need_put(need, n, BK_OP_TYPED_copy_grad, kd);
    }
    return need_put(need, n, BK_OP_TYPED_groupnorm_fwd, kd);
}

/* whether run op k (o) runs on groupnorm_typed: a fused host, or a group norm op where the
 * backend has typed kernels; *guest its guest or -1 */
static int groupnorm_typed_runs(const struct exec *e, int k, const struct op *o, int *guest)
{
    *guest = e->p->fuse_guest ? e->p->fuse_guest[k] : -1;
    return *guest >= 0 ||
           (e->bk->typed && (o->type == OP_GROUPNORM || o->type == OP_GROUPNORM_BWD));
}

/* dx (=/+=) dy, count elements of kernel dtype kd: the typed kernel where the backend has one */
static int copy_grad(struct exec *e, void *dx, const void *dy, int accum, size_t count, int kd)
{
    if (e->bk->typed) return e->bk->typed->copy_grad(dx, dy, accum, count, kd, e->ctx);
    return e->bk->copy_grad(dx, dy, accum, count, e->ctx);
}

/* y (N,HW,C) (=/+=) the transpose of x (N,C,HW) of kernel dtype kd */
static int transpose(struct exec *e, void *y, const void *x, int accum, int n, int ch, int hw,
                     int kd)
{
    if (e->bk->typed) return e->bk->typed->transpose_fwd(y, x, accum, n, ch, hw, kd, e->ctx);
    return e->bk->transpose_fwd(y, x, accum, n, ch, hw, e->ctx);
}

static int run_conv2d(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    struct bk_conv2d cs = o->a.conv;
    cs.dtype = r->kd;
    cs.w_f32 = backend_conv_w_f32(e->bk, r->kd);
    return e->bk->conv2d_fwd(Q(0), P(0), P(1), P(2), r->ws, &cs, e->ctx);
}
static int needs_conv2d(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    return need_put(need, need_put(need, 0, BK_OP_conv2d_ws_bytes, kd), BK_OP_conv2d_fwd, kd);
}

static int run_conv2d_bwd_data(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    struct bk_conv2d cs = o->a.conv;
    cs.dtype = r->kd;
    cs.w_f32 = backend_conv_w_f32(e->bk, r->kd);
    return e->bk->conv2d_bwd_data(Q(0), P(0), P(1), o->accum[0], r->ws, &cs, e->ctx);
}
static int needs_conv2d_bwd_data(const struct exec *e, const struct op *o, int kd,
                                 struct exec_need *need)
{
    return need_put(need, need_put(need, 0, BK_OP_conv2d_ws_bytes, kd), BK_OP_conv2d_bwd_data,
                    kd);
}

static int run_conv2d_bwd_filter(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    struct bk_conv2d cs = o->a.conv;
    cs.dtype = r->kd;
    cs.w_f32 = backend_conv_w_f32(e->bk, r->kd);
    return e->bk->conv2d_bwd_filter(Q(0), Q(1), P(0), P(1), r->ws, &cs, e->ctx);
}
static int needs_conv2d_bwd_filter(const struct exec *e, const struct op *o, int kd,
                                   struct exec_need *need)
{
    return need_put(need, need_put(need, 0, BK_OP_conv2d_ws_bytes, kd), BK_OP_conv2d_bwd_filter,
                    kd);
}

static int run_linear(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->linear_fwd(Q(0), P(0), P(1), P(2), o->a.lin.m, o->a.lin.k, o->a.lin.n, r->kd,
                             e->ctx);
}
static int needs_linear(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    return need_put(need, 0, BK_OP_linear_fwd, kd);
}

static int run_linear_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->linear_bwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), o->accum[0], o->a.lin.m,
                             o->a.lin.k, o->a.lin.n, r->kd, e->ctx);
}
static int needs_linear_bwd(const struct exec *e, const struct op *o, int kd,
                            struct exec_need *need)
{
    return need_put(need, 0, BK_OP_linear_bwd, kd);
}

/* group norm (fp32 entries; silu(group norm): the backend's fused kernel, or group norm then
 * SiLU) */
static int run_groupnorm(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct backend *bk = e->bk;
    if (o->a.gn.silu && backend_supports(bk, BK_OP_groupnorm_silu_fwd, BK_DTYPE_F32))
        return bk->groupnorm_silu_fwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), o->a.gn.n, o->a.gn.c,
                                      o->a.gn.hw, o->a.gn.groups, o->a.gn.eps, e->ctx);
    int rc = bk->groupnorm_fwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), o->a.gn.n, o->a.gn.c,
                               o->a.gn.hw, o->a.gn.groups, o->a.gn.eps, e->ctx);
    size_t count = (size_t)o->a.gn.n * o->a.gn.c * o->a.gn.hw;
    return rc || !o->a.gn.silu ? rc : bk->silu_fwd(Q(0), Q(0), count, e->ctx);
}
static int needs_groupnorm(const struct exec *e, const struct op *o, int kd,
                           struct exec_need *need)
{
    const int f32 = BK_DTYPE_F32;
    if (o->a.gn.silu && backend_supports(e->bk, BK_OP_groupnorm_silu_fwd, f32))
        return need_put(need, 0, BK_OP_groupnorm_silu_fwd, f32);
    int n = need_put(need, 0, BK_OP_groupnorm_fwd, f32);
    return o->a.gn.silu ? need_put(need, n, BK_OP_silu_fwd, f32) : n;
}

/* The group-norm backward (fp32 entries): the backend's with a workspace, or its plain one. For
 * silu without the former, the executor recomputes z = group norm(x) (and its statistics, equal
 * bits to the saved ones) in the workspace (memplan.c sizes it), turns dy into dz = dy silu'(z)
 * there, and runs the group norm backward on dz. */
static int run_groupnorm_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct backend *bk = e->bk;
    const int n = o->a.gn.n, ch = o->a.gn.c, hw = o->a.gn.hw, gr = o->a.gn.groups;
    const int silu = o->a.gn.silu;
    if (backend_supports(bk, BK_OP_groupnorm_bwd_ws, BK_DTYPE_F32))
        return bk->groupnorm_bwd_ws(Q(0), Q(1), Q(2), P(0), P(1), P(2), silu ? P(5) : NULL, P(3),
                                    P(4), o->accum[0], n, ch, hw, gr, silu, r->ws, e->ctx);
    if (!silu)
        return bk->groupnorm_bwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), P(3), P(4), o->accum[0], n,
                                 ch, hw, gr, e->ctx);
    const size_t count = (size_t)n * ch * hw;
    float *z = r->ws, *st = (float *)((char *)r->ws + plan_align(count * sizeof(float)));
    const struct op *f = &e->g->ops[o->fwd];
    int rc = bk->groupnorm_fwd(z, st, st + (size_t)n * gr, P(1), P(2), P(5), n, ch, hw, gr,
                               f->a.gn.eps, e->ctx);
    if (!rc) rc = bk->silu_bwd(z, P(0), z, 0, count, e->ctx);
    if (!rc)
        rc = bk->groupnorm_bwd(Q(0), Q(1), Q(2), z, P(1), P(2), P(3), P(4), o->accum[0], n, ch,
                               hw, gr, e->ctx);
    return rc;
}
static int needs_groupnorm_bwd(const struct exec *e, const struct op *o, int kd,
                               struct exec_need *need)
{
    const int f32 = BK_DTYPE_F32;
    if (backend_supports(e->bk, BK_OP_groupnorm_bwd_ws, f32))
        return need_put(need, need_put(need, 0, BK_OP_groupnorm_bwd_ws, f32),
                        BK_OP_groupnorm_bwd_ws_bytes, f32);
    int n = need_put(need, 0, BK_OP_groupnorm_bwd, f32);
    if (o->a.gn.silu) {
        n = need_put(need, n, BK_OP_groupnorm_fwd, f32);
        n = need_put(need, n, BK_OP_silu_bwd, f32);
    }
    return n;
}

static int run_layernorm(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->layernorm_fwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), o->a.ln.m, o->a.ln.d,
                                  o->a.ln.eps, r->kd, e->ctx)
              : e->bk->layernorm_fwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), o->a.ln.m, o->a.ln.d,
                                     o->a.ln.eps, e->ctx);
}
NEEDS_MEM(layernorm, layernorm_fwd)

static int run_layernorm_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->layernorm_bwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), P(3), P(4), o->accum[0],
                                  o->a.ln.m, o->a.ln.d, r->kd, e->ctx)
              : e->bk->layernorm_bwd(Q(0), Q(1), Q(2), P(0), P(1), P(2), P(3), P(4), o->accum[0],
                                     o->a.ln.m, o->a.ln.d, e->ctx);
}
NEEDS_MEM(layernorm_bwd, layernorm_bwd)

static int run_silu(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->silu_fwd(Q(0), P(0), r->t0->numel, r->kd, e->ctx)
              : e->bk->silu_fwd(Q(0), P(0), r->t0->numel, e->ctx);
}
NEEDS_MEM(silu, silu_fwd)

static int run_silu_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->silu_bwd(Q(0), P(0), P(1), o->accum[0], r->t0->numel, r->kd, e->ctx)
              : e->bk->silu_bwd(Q(0), P(0), P(1), o->accum[0], r->t0->numel, e->ctx);
}
NEEDS_MEM(silu_bwd, silu_bwd)

static int run_gelu(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->gelu_fwd(Q(0), P(0), r->t0->numel, r->kd, e->ctx)
              : e->bk->gelu_fwd(Q(0), P(0), r->t0->numel, e->ctx);
}
NEEDS_MEM(gelu, gelu_fwd)

static int run_gelu_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->gelu_bwd(Q(0), P(0), P(1), o->accum[0], r->t0->numel, r->kd, e->ctx)
              : e->bk->gelu_bwd(Q(0), P(0), P(1), o->accum[0], r->t0->numel, e->ctx);
}
NEEDS_MEM(gelu_bwd, gelu_bwd)

static int run_add(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->add_fwd(Q(0), P(0), P(1), r->t0->numel, r->kd, e->ctx)
              : e->bk->add_fwd(Q(0), P(0), P(1), r->t0->numel, e->ctx);
}
NEEDS_MEM(add, add_fwd)

static int run_add_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    int rc = 0;
    /* out[0] may share dy's bytes (in place): then it already holds dy */
    if (o->out[0] >= 0 && Q(0) != P(0))
        rc = copy_grad(e, Q(0), P(0), o->accum[0], r->t0->numel, r->kd);
    if (!rc && o->out[1] >= 0) rc = copy_grad(e, Q(1), P(0), o->accum[1], r->t0->numel, r->kd);
    return rc;
}
NEEDS_MEM(add_bwd, copy_grad)

static int run_add_bcast(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->add_bcast_fwd(Q(0), P(0), P(1), o->a.bc.n, o->a.bc.c, o->a.bc.hw, r->kd,
                                  e->ctx)
              : e->bk->add_bcast_fwd(Q(0), P(0), P(1), o->a.bc.n, o->a.bc.c, o->a.bc.hw, e->ctx);
}
NEEDS_MEM(add_bcast, add_bcast_fwd)

static int run_add_bcast_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    int rc = 0;
    if (o->out[1] >= 0)
        rc = tk ? tk->add_bcast_bwd(Q(1), P(0), o->accum[1], o->a.bc.n, o->a.bc.c, o->a.bc.hw,
                                    r->kd, e->ctx)
                : e->bk->add_bcast_bwd(Q(1), P(0), o->accum[1], o->a.bc.n, o->a.bc.c,
                                       o->a.bc.hw, e->ctx);
    if (!rc && o->out[0] >= 0 && Q(0) != P(0))
        rc = copy_grad(e, Q(0), P(0), o->accum[0], r->t0->numel, r->kd);
    return rc;
}
static int needs_add_bcast_bwd(const struct exec *e, const struct op *o, int kd,
                               struct exec_need *need)
{
    int n = need_mem(e, need, 0, BK_OP_TYPED_add_bcast_bwd, BK_OP_add_bcast_bwd, kd);
    return need_mem(e, need, n, BK_OP_TYPED_copy_grad, BK_OP_copy_grad, kd);
}

static int run_concat(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->concat_fwd(Q(0), P(0), P(1), o->a.cat.n, o->a.cat.c1, o->a.cat.c2,
                               o->a.cat.hw, r->kd, e->ctx)
              : e->bk->concat_fwd(Q(0), P(0), P(1), o->a.cat.n, o->a.cat.c1, o->a.cat.c2,
                                  o->a.cat.hw, e->ctx);
}
NEEDS_MEM(concat, concat_fwd)

static int run_concat_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->concat_bwd(Q(0), Q(1), P(0), o->accum[0], o->accum[1], o->a.cat.n,
                               o->a.cat.c1, o->a.cat.c2, o->a.cat.hw, r->kd, e->ctx)
              : e->bk->concat_bwd(Q(0), Q(1), P(0), o->accum[0], o->accum[1], o->a.cat.n,
                                  o->a.cat.c1, o->a.cat.c2, o->a.cat.hw, e->ctx);
}
NEEDS_MEM(concat_bwd, concat_bwd)

/* OP_TO_TOKENS (N,C,HW) -> (N,HW,C) and OP_TO_IMAGE (N,HW,C) -> (N,C,HW); for NHWC images both
 * are copies (or in place) */
static int run_to_tokens_image(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    if (e->bk->nhwc)
        return Q(0) == P(0) ? BK_OK
                            : copy_grad(e, Q(0), P(0), o->accum[0], r->t0->numel, r->kd);
    return o->type == OP_TO_TOKENS
               ? transpose(e, Q(0), P(0), o->accum[0], o->a.bc.n, o->a.bc.c, o->a.bc.hw, r->kd)
               : transpose(e, Q(0), P(0), o->accum[0], o->a.bc.n, o->a.bc.hw, o->a.bc.c, r->kd);
}
static int needs_to_tokens_image(const struct exec *e, const struct op *o, int kd,
                                 struct exec_need *need)
{
    if (e->bk->nhwc) return need_mem(e, need, 0, BK_OP_TYPED_copy_grad, BK_OP_copy_grad, kd);
    return need_mem(e, need, 0, BK_OP_TYPED_transpose_fwd, BK_OP_transpose_fwd, kd);
}

static int run_upsample_nearest(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->upsample_nearest2x_fwd(Q(0), P(0), o->a.rs.n, o->a.rs.c, o->a.rs.h,
                                           o->a.rs.w, r->kd, e->ctx)
              : e->bk->upsample_nearest2x_fwd(Q(0), P(0), o->a.rs.n, o->a.rs.c, o->a.rs.h,
                                              o->a.rs.w, e->ctx);
}
NEEDS_MEM(upsample_nearest, upsample_nearest2x_fwd)

static int run_upsample_nearest_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->upsample_nearest2x_bwd(Q(0), P(0), o->accum[0], o->a.rs.n, o->a.rs.c,
                                           o->a.rs.h, o->a.rs.w, r->kd, e->ctx)
              : e->bk->upsample_nearest2x_bwd(Q(0), P(0), o->accum[0], o->a.rs.n, o->a.rs.c,
                                              o->a.rs.h, o->a.rs.w, e->ctx);
}
NEEDS_MEM(upsample_nearest_bwd, upsample_nearest2x_bwd)

static int run_upsample_bilinear(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->upsample_bilinear2x_fwd(Q(0), P(0), o->a.rs.align_corners, o->a.rs.n,
                                            o->a.rs.c, o->a.rs.h, o->a.rs.w, r->kd, e->ctx)
              : e->bk->upsample_bilinear2x_fwd(Q(0), P(0), o->a.rs.align_corners, o->a.rs.n,
                                               o->a.rs.c, o->a.rs.h, o->a.rs.w, e->ctx);
}
NEEDS_MEM(upsample_bilinear, upsample_bilinear2x_fwd)

static int run_upsample_bilinear_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->upsample_bilinear2x_bwd(Q(0), P(0), o->a.rs.align_corners, o->accum[0],
                                            o->a.rs.n, o->a.rs.c, o->a.rs.h, o->a.rs.w, r->kd,
                                            e->ctx)
              : e->bk->upsample_bilinear2x_bwd(Q(0), P(0), o->a.rs.align_corners, o->accum[0],
                                               o->a.rs.n, o->a.rs.c, o->a.rs.h, o->a.rs.w,
                                               e->ctx);
}
NEEDS_MEM(upsample_bilinear_bwd, upsample_bilinear2x_bwd)

static int run_maxpool(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->maxpool2x2_fwd(Q(0), P(0), o->a.rs.n, o->a.rs.c, o->a.rs.h, o->a.rs.w, r->kd,
                                   e->ctx)
              : e->bk->maxpool2x2_fwd(Q(0), P(0), o->a.rs.n, o->a.rs.c, o->a.rs.h, o->a.rs.w,
                                      e->ctx);
}
NEEDS_MEM(maxpool, maxpool2x2_fwd)

static int run_maxpool_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    return tk ? tk->maxpool2x2_bwd(Q(0), P(0), P(1), o->accum[0], o->a.rs.n, o->a.rs.c,
                                   o->a.rs.h, o->a.rs.w, r->kd, e->ctx)
              : e->bk->maxpool2x2_bwd(Q(0), P(0), P(1), o->accum[0], o->a.rs.n, o->a.rs.c,
                                      o->a.rs.h, o->a.rs.w, e->ctx);
}
NEEDS_MEM(maxpool_bwd, maxpool2x2_bwd)

static int run_timestep_embed(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->timestep_embed_fwd(Q(0), P(0), o->a.te.n, o->a.te.dim, o->a.te.flip,
                                     o->a.te.shift, o->a.te.max_period, e->ctx);
}
static int needs_timestep_embed(const struct exec *e, const struct op *o, int kd,
                                struct exec_need *need)
{
    return need_put(need, 0, BK_OP_timestep_embed_fwd, BK_DTYPE_F32);
}

/* attention, tiled (memory-efficient) or plain (the score matrix kept); q, k and v apart or
 * packed in one tensor (q at 0, k at C, v at 2C of each token's 3C) */
static int run_attention(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    struct bk_attn as = o->a.at.s;
    as.dtype = r->kd;
    const struct bk_attn *s = &as;
    const char *q = P(0), *kk, *v;
    size_t cdim = (size_t)s->heads * s->d * bk_dtype_size(r->kd); /* bytes */
    if (o->a.at.packed) {
        kk = q + cdim;
        v = q + 2 * cdim;
    } else {
        kk = P(1);
        v = P(2);
    }
    return o->a.at.tiled ? e->bk->attn_fwd(Q(0), Q(1), q, kk, v, r->ws, s, e->ctx)
                         : e->bk->attn_plain_fwd(Q(0), Q(1), q, kk, v, r->ws, s, e->ctx);
}
static int needs_attention(const struct exec *e, const struct op *o, int kd,
                           struct exec_need *need)
{
    return need_put(need, need_put(need, 0, BK_OP_attn_ws_bytes, kd),
                    o->a.at.tiled ? BK_OP_attn_fwd : BK_OP_attn_plain_fwd, kd);
}

static int run_attention_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    struct bk_attn as = o->a.at.s;
    as.dtype = r->kd;
    const struct bk_attn *s = &as;
    const char *q = P(1), *kk, *v;
    char *dq = Q(0), *dk, *dv;
    size_t cdim = (size_t)s->heads * s->d * bk_dtype_size(r->kd); /* bytes */
    if (o->a.at.packed) {
        kk = q + cdim;
        v = q + 2 * cdim;
        dk = dq + cdim;
        dv = dq + 2 * cdim;
    } else {
        kk = P(2);
        v = P(3);
        dk = Q(1);
        dv = Q(2);
    }
    return o->a.at.tiled
               ? e->bk->attn_bwd(dq, dk, dv, P(0), q, kk, v, P(4), P(5), r->ws, s, e->ctx)
               : e->bk->attn_plain_bwd(dq, dk, dv, P(0), q, kk, v, P(5), r->ws, s, e->ctx);
}
static int needs_attention_bwd(const struct exec *e, const struct op *o, int kd,
                               struct exec_need *need)
{
    return need_put(need, need_put(need, 0, BK_OP_attn_ws_bytes, kd),
                    o->a.at.tiled ? BK_OP_attn_bwd : BK_OP_attn_plain_bwd, kd);
}

static int run_mse(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->mse_fwd(Q(0), P(0), P(1), r->t0->numel, e->ctx);
}
static int needs_mse(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    return need_put(need, 0, BK_OP_mse_fwd, BK_DTYPE_F32);
}

/* the step on the device (e->dev) reads its loss scale on the device: mse_step_bwd, asked for
 * where the step is chosen (dev_capable) */
static int run_mse_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    if (e->dev) return e->bk->mse_step_bwd(Q(0), P(0), P(1), o->accum[0], r->t0->numel, e->ctx);
    return e->bk->mse_bwd(Q(0), P(0), P(1), r->dloss_scale, o->accum[0], r->t0->numel, e->ctx);
}
static int needs_mse_bwd(const struct exec *e, const struct op *o, int kd,
                         struct exec_need *need)
{
    return need_put(need, 0, BK_OP_mse_bwd, BK_DTYPE_F32);
}

static int run_xent(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->xent_fwd(Q(0), Q(1), P(0), P(1), o->a.lin.m, o->a.lin.n, e->ctx);
}
static int needs_xent(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    return need_put(need, 0, BK_OP_xent_fwd, BK_DTYPE_F32);
}

static int run_xent_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    return e->bk->xent_bwd(Q(0), P(0), P(1), r->dloss_scale, o->accum[0], o->a.lin.m,
                           o->a.lin.n, e->ctx);
}
static int needs_xent_bwd(const struct exec *e, const struct op *o, int kd,
                          struct exec_need *need)
{
    return need_put(need, 0, BK_OP_xent_bwd, BK_DTYPE_F32);
}

/* OP_RESHAPE and OP_RESHAPE_BWD: in place (same bytes) when the planner merged the two, else a
 * copy; flattening an NHWC image (or its gradient back) changes the element order */
static int run_reshape(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct tensor *t0 = r->t0, *to = plan_tensor(e->p, e->g, o->out[0]);
    const int kd = r->kd;
    if (nhwc_image(e, t0) != nhwc_image(e, to)) {
        const struct tensor *im = t0->image ? t0 : to;
        int n = im->d[0], ch = im->d[1], hw = im->d[2] * im->d[3];
        return t0->image ? transpose(e, Q(0), P(0), o->accum[0], n, hw, ch, kd)
                         : transpose(e, Q(0), P(0), o->accum[0], n, ch, hw, kd);
    }
    if (o->type == OP_RESHAPE)
        return Q(0) == P(0) ? BK_OK : copy_grad(e, Q(0), P(0), 0, t0->numel, kd);
    return Q(0) == P(0) && !o->accum[0] ? BK_OK
                                        : copy_grad(e, Q(0), P(0), o->accum[0], t0->numel, kd);
}
static int needs_reshape(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    int n = need_mem(e, need, 0, BK_OP_TYPED_copy_grad, BK_OP_copy_grad, kd);
    if (e->bk->nhwc) n = need_mem(e, need, n, BK_OP_TYPED_transpose_fwd, BK_OP_transpose_fwd, kd);
    return n;
}

/* dropout: the identity (a copy) in evaluation; the step on the device draws with step_set's
 * seed, step and sample base (graph replays: dropout_step_*, asked where it is chosen) */
static int run_dropout(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    const struct tensor *t0 = r->t0;
    if (e->eval) return copy_grad(e, Q(0), P(0), 0, t0->numel, r->kd);
    const int chans = nhwc_image(e, t0) ? t0->d[1] : 0;
    if (e->dev)
        return e->bk->dropout_step_fwd(Q(0), P(0), o->a.dr.p, (uint32_t)r->src, o->a.dr.n,
                                       o->a.dr.per_sample, chans, r->kd, e->ctx);
    return tk ? tk->dropout_fwd(Q(0), P(0), o->a.dr.p, r->seed, r->step, (uint32_t)r->src,
                                r->sample_base, o->a.dr.n, o->a.dr.per_sample, chans, r->kd,
                                e->ctx)
              : e->bk->dropout_fwd(Q(0), P(0), o->a.dr.p, r->seed, r->step, (uint32_t)r->src,
                                   r->sample_base, o->a.dr.n, o->a.dr.per_sample, chans, e->ctx);
}
static int needs_dropout(const struct exec *e, const struct op *o, int kd, struct exec_need *need)
{
    int n = need_mem(e, need, 0, BK_OP_TYPED_dropout_fwd, BK_OP_dropout_fwd, kd);
    return need_mem(e, need, n, BK_OP_TYPED_copy_grad, BK_OP_copy_grad, kd); /* evaluation */
}

static int run_dropout_bwd(struct exec *e, const struct op *o, const struct run_ctx *r)
{
    const struct bk_typed *tk = e->bk->typed;
    const struct tensor *t0 = r->t0;
    const int chans = nhwc_image(e, t0) ? t0->d[1] : 0;
    if (e->dev)
        return e->bk->dropout_step_bwd(Q(0), P(0), o->a.dr.p, (uint32_t)o->fwd, o->accum[0],
                                       o->a.dr.n, o->a.dr.per_sample, chans, r->kd, e->ctx);
    return tk ? tk->dropout_bwd(Q(0), P(0), o->a.dr.p, r->seed, r->step, (uint32_t)o->fwd,
                                r->sample_base, o->accum[0], o->a.dr.n, o->a.dr.per_sample,
                                chans, r->kd, e->ctx)
              : e->bk->dropout_bwd(Q(0), P(0), o->a.dr.p, r->seed, r->step, (uint32_t)o->fwd,
                                   r->sample_base, o->accum[0], o->a.dr.n, o->a.dr.per_sample,
                                   chans, e->ctx);
}
NEEDS_MEM(dropout_bwd, dropout_bwd)

#undef NEEDS_MEM

/* each op type's run and needs (a type with no entry: BK_ERR_INVALID, no needs) */
static const struct {
    int (*run)(struct exec *e, const struct op *o, const struct run_ctx *r);
    /* the entries run calls, on their dtypes (kd: the op's kernel dtype), into need; their
     * count (at most EXEC_NEEDS_MAX) */
    int (*needs)(const struct exec *e, const struct op *o, int kd, struct exec_need *need);
} op_kernels[OP_COUNT] = {
    [OP_CONV2D] = {run_conv2d, needs_conv2d},
    [OP_CONV2D_BWD_DATA] = {run_conv2d_bwd_data, needs_conv2d_bwd_data},
    [OP_CONV2D_BWD_FILTER] = {run_conv2d_bwd_filter, needs_conv2d_bwd_filter},
    [OP_LINEAR] = {run_linear, needs_linear},
    [OP_LINEAR_BWD] = {run_linear_bwd, needs_linear_bwd},
    [OP_GROUPNORM] = {run_groupnorm, needs_groupnorm},
    [OP_GROUPNORM_BWD] = {run_groupnorm_bwd, needs_groupnorm_bwd},
    [OP_LAYERNORM] = {run_layernorm, needs_layernorm},
    [OP_LAYERNORM_BWD] = {run_layernorm_bwd, needs_layernorm_bwd},
    [OP_SILU] = {run_silu, needs_silu},
    [OP_SILU_BWD] = {run_silu_bwd, needs_silu_bwd},
    [OP_GELU] = {run_gelu, needs_gelu},
    [OP_GELU_BWD] = {run_gelu_bwd, needs_gelu_bwd},
    [OP_ADD] = {run_add, needs_add},
    [OP_ADD_BWD] = {run_add_bwd, needs_add_bwd},
    [OP_ADD_BCAST] = {run_add_bcast, needs_add_bcast},
    [OP_ADD_BCAST_BWD] = {run_add_bcast_bwd, needs_add_bcast_bwd},
    [OP_CONCAT] = {run_concat, needs_concat},
    [OP_CONCAT_BWD] = {run_concat_bwd, needs_concat_bwd},
    [OP_TO_TOKENS] = {run_to_tokens_image, needs_to_tokens_image},
    [OP_TO_IMAGE] = {run_to_tokens_image, needs_to_tokens_image},
    [OP_UPSAMPLE_NEAREST] = {run_upsample_nearest, needs_upsample_nearest},
    [OP_UPSAMPLE_NEAREST_BWD] = {run_upsample_nearest_bwd, needs_upsample_nearest_bwd},
    [OP_UPSAMPLE_BILINEAR] = {run_upsample_bilinear, needs_upsample_bilinear},
    [OP_UPSAMPLE_BILINEAR_BWD] = {run_upsample_bilinear_bwd, needs_upsample_bilinear_bwd},
    [OP_MAXPOOL] = {run_maxpool, needs_maxpool},
    [OP_MAXPOOL_BWD] = {run_maxpool_bwd, needs_maxpool_bwd},
    [OP_TIMESTEP_EMBED] = {run_timestep_embed, needs_timestep_embed},
    [OP_ATTENTION] = {run_attention, needs_attention},
    [OP_ATTENTION_BWD] = {run_attention_bwd, needs_attention_bwd},
    [OP_MSE] = {run_mse, needs_mse},
    [OP_MSE_BWD] = {run_mse_bwd, needs_mse_bwd},
    [OP_DROPOUT] = {run_dropout, needs_dropout},
    [OP_DROPOUT_BWD] = {run_dropout_bwd, needs_dropout_bwd},
    [OP_XENT] = {run_xent, needs_xent},
    [OP_XENT_BWD] = {run_xent_bwd, needs_xent_bwd},
    [OP_RESHAPE] = {run_reshape, needs_reshape},
    [OP_RESHAPE_BWD] = {run_reshape, needs_reshape},
};

/* run op k through the table (a fused host or a typed group norm: groupnorm_typed) */
static int run_op(struct exec *e, int k, float dloss_scale, uint64_t seed, uint64_t step,
                  int sample_base)
{
    const struct op *o = plan_op(e->p, e->g, k);
    const int kd = e->p->op_dtype[k];
    void *ws = e->base + e->p->ws_off;
    int gu;
    if (groupnorm_typed_runs(e, k, o, &gu))
        return groupnorm_typed(e, o, gu >= 0 ? plan_op(e->p, e->g, gu) : NULL, kd, ws);
    if ((unsigned)o->type >= OP_COUNT || !op_kernels[o->type].run) return BK_ERR_INVALID;
    const struct run_ctx r = {
        .kd = kd,
        .src = e->p->op_src ? e->p->op_src[k] : k,
        .ws = ws,
        .t0 = o->in[0] >= 0 ? plan_tensor(e->p, e->g, o->in[0]) : NULL,
        .dloss_scale = dloss_scale,
        .seed = seed,
        .step = step,
        .sample_base = sample_base,
    };
    return op_kernels[o->type].run(e, o, &r);
}

/* (exec.h) run_op's dispatch, read from the same table */
int exec_op_needs(const struct exec *e, int k, struct exec_need *need)
{
    const struct op *o = plan_op(e->p, e->g, k);
    const int kd = e->p->op_dtype[k];
    int gu;
    if (e->p->fuse_host && e->p->fuse_host[k] >= 0) return 0; /* a guest: its host runs it */
    if (groupnorm_typed_runs(e, k, o, &gu)) return needs_groupnorm_typed(e, o, kd, need);
    if ((unsigned)o->type >= OP_COUNT || !op_kernels[o->type].needs) return 0;
    return op_kernels[o->type].needs(e, o, kd, need);
}

/* op k with its 16-bit operands converted around it */
static int run_op_typed(struct exec *e, int k, float dloss_scale, uint64_t seed, uint64_t step,
                        int sample_base)
{
    if (e->p->fuse_host && e->p->fuse_host[k] >= 0) return BK_OK; /* a guest: its host runs it */
    e->cur_op = k;
    int rc = convert_operands(e, k, 0);
    if (!rc) rc = run_op(e, k, dloss_scale, seed, step, sample_base);
    if (!rc) rc = convert_operands(e, k, 1);
    return rc;
}

/* the libraries that keep a workspace per handle (cuBLAS) get this plan's workspace: the job's
 * context is shared with its nested plans (sample grids), whose workspace lies elsewhere, so
 * every run binds its own. Without it they would run with none (or allocate their own). */
static int bind_workspace(struct exec *e)
{
    if (!backend_supports(e->bk, BK_OP_ctx_set_workspace, BK_DTYPE_F32)) return EXEC_OK;
    const struct plan *p = e->p;
    int rc = e->bk->ctx_set_workspace(e->ctx, p->ws_bytes ? e->base + p->ws_off : NULL,
                                      p->ws_bytes);
    return rc ? bk_fail(e, rc, -1, "handing the plan's workspace to the backend's libraries")
              : EXEC_OK;
}

/* the gradients final after run op k to the owner's host block: on the backend's copy stream
 * while the backward goes on (synchronous copies where it has none) */
static int grads_out(struct exec *e, int k)
{
    struct exec *o = e->host ? e->host : e;
    const struct plan *op = o->p;
    for (int i = e->gout_start[k]; i < e->gout_start[k + 1]; i++) {
        const int t = e->gout[i];
        const size_t rel = (size_t)e->p->offset[t] - op->grads_off;
        unsigned char *dst = o->hbase + op->host_grads_off + rel;
        const void *src = e->base + e->p->offset[t];
        const size_t bytes = tensor_bytes(e->g->tensors[t]);
        int rc = o->hbase_locked &&
                         backend_supports(e->bk, BK_OP_mem_download_async, BK_DTYPE_F32)
                     ? e->bk->mem_download_async(dst, src, bytes, e->ctx)
                     : e->bk->mem_download(dst, src, bytes, e->ctx);
        if (rc) return bk_fail(e, rc, k, "copying a gradient to the host");
    }
    return EXEC_OK;
}

/* the copies enqueued so far (gradients out, weights in) ordered before the compute work that
 * follows, on the device (a backend without a copy stream has nothing to order) */
static int copies_fence(struct exec *e)
{
    if (!backend_supports(e->bk, BK_OP_copy_fence, BK_DTYPE_F32)) return EXEC_OK;
    return bk_check(e, e->bk->copy_fence(e->ctx), "ordering the offload copies");
}

/* ops [from, to) (the caller bound the workspace: bind_workspace) */
static int run_range(struct exec *e, int from, int to, float dloss_scale, uint64_t seed,
                     uint64_t step, int sample_base)
{
    for (int k = from; k < to; k++) {
        int rc;
        if (e->opts.check_guards && (rc = fill_guards(e, k))) return rc;
        const double z0 = e->opts.profile && e->gz_start ? prof_seconds(e) : 0.0;
        for (int i = e->gz_start ? e->gz_start[k] : 0, end = e->gz_start ? e->gz_start[k + 1] : 0;
             i < end; i++)
            if ((rc = e->bk->mem_set_f32(exec_tensor(e, e->gz[i]), 0.0f,
                                         e->g->tensors[e->gz[i]]->numel, e->ctx)))
                return bk_fail(e, rc, k, "zeroing a gradient");
        if (e->opts.profile && e->gz_start) e->prof.zero_seconds += prof_seconds(e) - z0;
        if (e->opts.profile) {
            double t0 = prof_seconds(e);
            rc = run_op_typed(e, k, dloss_scale, seed, step, sample_base);
            double dt = prof_seconds(e) - t0;
            /* a recomputed copy's time is its forward op's */
            enum op_type ty = plan_op(e->p, e->g, k)->type;
            e->op_seconds[e->p->op_src ? e->p->op_src[k] : k] += dt;
            e->prof.seconds[ty] += dt;
            e->prof.calls[ty]++;
        } else {
            rc = run_op_typed(e, k, dloss_scale, seed, step, sample_base);
        }
        if (rc) {
            rc = bk_fail(e, rc, k, "the kernel");
            fprintf(stderr, "exec: %s\n", e->err.msg);
            return rc;
        }
        if (e->opts.check_guards && (rc = check_guards(e, k))) return rc;
        if (e->gout_start && e->gout_start[k] < e->gout_start[k + 1] && (rc = grads_out(e, k)))
            return rc;
        if (e->opts.poison) {
            for (int i = e->ends_start[k]; i < e->ends_start[k + 1]; i++) {
                const struct plan_storage *s = &e->p->st[e->ends[i]];
                int t = e->loss_tensor;
                if (s->keep || (t >= 0 && e->p->storage[t] == e->ends[i]))
                    continue; /* read by the host */
                rc = e->bk->mem_set_f32((float *)(e->base + s->offset),
                                        bits_to_float(POISON_BITS), s->bytes / 4, e->ctx);
                if (rc) return bk_fail(e, rc, k, "poisoning a dead storage");
            }
        }
    }
    return EXEC_OK;
}

/* Runs body(e, arg) - one kind of work, `kind` - as it comes the first time, captures it the
 * second time and launches the capture, and from then on launches the capture only. The body
 * must enqueue the same work with the same arguments every time (per-step values go through the
 * backend's device scalars). Graphs are off without the backend's graph_*, with exec_opts.eager,
 * check_guards (the host reads canaries after every op) and profile (per-op host timing); a
 * capture the backend refuses (something in the body made the host wait or allocated) runs the
 * body as it comes, then and from then on. */
typedef int (*exec_body)(struct exec *e, void *arg);
static int run_graphed(struct exec *e, int kind, exec_body body, void *arg)
{
    const struct backend *bk = e->bk;
    struct exec_graph *gr = &e->gr[kind];
    if (!backend_supports(bk, BK_OP_graph_begin, BK_DTYPE_F32) || e->opts.eager ||
        e->opts.check_guards || e->opts.profile || gr->off)
        return body(e, arg);
    int rc;
    if (!gr->g) {
        if (gr->runs++ == 0) return body(e, arg); /* algorithms measured, libraries warmed */
        if ((rc = bk->graph_begin(e->ctx))) {
            gr->off = 1;
            return body(e, arg);
        }
        int brc = body(e, arg);
        rc = bk->graph_end(&gr->g, e->ctx);
        if (rc) {
            /* nothing ran: all of it now, as it comes */
            fprintf(stderr, "exec: the backend refused to capture a step (%s); running it "
                            "without a graph\n", bk_status_name(rc));
            gr->g = NULL;
            gr->off = 1;
            return body(e, arg);
        }
        if (brc) {
            bk->graph_free(gr->g, e->ctx);
            gr->g = NULL;
            return brc;
        }
    }
    rc = bk->graph_launch(gr->g, e->ctx);
    return rc ? bk_fail(e, rc, -1, "launching a captured step") : EXEC_OK;
}

/* a capture made with other arguments than the next run's: made again */
static void graph_drop(struct exec *e, int kind)
{
    struct exec_graph *gr = &e->gr[kind];
    if (gr->g) e->bk->graph_free(gr->g, e->ctx);
    gr->g = NULL;
    gr->runs = 0;
}

struct fb_args {
    int zero_grads;
    float dloss_scale;
    uint64_t seed, step;
    int sample_base;
};

static int fb_body(struct exec *e, void *arg)
{
    const struct fb_args *a = arg;
    const struct plan *p = e->p;
    int rc;
    /* arena gradients: zeroed op by op as the backward reaches them (run_range) */
    if (a->zero_grads && !p->grads_in_arena) {
        const double t0 = e->opts.profile ? prof_seconds(e) : 0.0;
        if ((rc = e->bk->mem_set_f32((float *)(e->base + p->grads_off), 0.0f,
                                     p->params_bytes / 4, e->ctx)))
            return bk_fail(e, rc, -1, "zeroing the gradients");
        if (e->opts.profile) e->prof.zero_seconds += prof_seconds(e) - t0;
    }
    /* a nested plan's run may have overwritten the workspace canaries */
    if (e->opts.check_guards && (rc = fill_ws_guards(e))) return rc;
    if ((rc = refresh_work(e))) return rc;
    rc = run_range(e, 0, p->n_run_ops, a->dloss_scale, a->seed, a->step, a->sample_base);
    if (rc) return rc;
    if (e->dev && e->loss_tensor >= 0 &&
        (rc = e->bk->loss_step_add(exec_tensor(e, e->loss_tensor), e->ctx)))
        return bk_fail(e, rc, -1, "adding the loss to the step's");
    return EXEC_OK;
}

int exec_forward_backward(struct exec *e, int zero_grads, float dloss_scale, uint64_t seed,
                          uint64_t step, int sample_base, float *loss)
{
    const struct plan *p = e->p;
    struct exec *o = e->host ? e->host : e;
    int rc;
    if (p->inference)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "an inference plan has no backward");
    if (p->grads_in_arena && !zero_grads)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1,
                         "a one-pass plan (gradients in the arena) cannot accumulate a second "
                         "forward/backward into its gradients");
    /* the last micro-batch's gradient copies still read what this one writes */
    if (offload_owner(e) && (rc = copies_fence(e))) return rc;
    if ((rc = bind_workspace(e))) return rc;
    struct fb_args a = {zero_grads, dloss_scale * e->lsp->scale, seed, step, sample_base};
    if (e->dev) {
        /* the loss scale is the device's: mse_step_bwd multiplies by it there */
        if (o->ls_host && (rc = scaler_upload(o))) return rc;
        const struct bk_step st = {.seed = seed, .step = step, .sample_base = sample_base,
                                   .first = zero_grads, .dloss_scale = dloss_scale};
        if ((rc = e->bk->step_set(&st, e->ctx)))
            return bk_fail(e, rc, -1, "setting the step's device scalars");
        a.dloss_scale = dloss_scale;
        rc = run_graphed(e, zero_grads ? EG_FB_FIRST : EG_FB_ACCUM, fb_body, &a);
    } else {
        rc = fb_body(e, &a);
    }
    if (rc) return rc;
    if (e->loss_tensor < 0) return EXEC_OK;
    if (!e->dev) {
        /* the host's way: the step's loss summed here */
        float l = 0.0f;
        if ((rc = exec_download(e, e->loss_tensor, &l))) return rc;
        o->step_loss = (zero_grads ? 0.0 : o->step_loss) + (double)dloss_scale * (double)l;
        if (loss) *loss = l;
        return EXEC_OK;
    }
    return loss ? exec_download(e, e->loss_tensor, loss) : EXEC_OK;
}

static int fwd_body(struct exec *e, void *arg)
{
    const int n = *(const int *)arg;
    int rc;
    if (e->opts.check_guards && (rc = fill_ws_guards(e))) return rc;
    if ((rc = refresh_work(e))) return rc;
    e->eval = 1;
    rc = run_range(e, 0, n, 1.0f, 0, 0, 0);
    e->eval = 0;
    return rc;
}

int exec_forward(struct exec *e, float *loss)
{
    int n = e->g->n_fwd_ops ? e->g->n_fwd_ops : e->g->n_ops, rc;
    if ((rc = bind_workspace(e))) return rc;
    /* an offloading host's steps copy on the copy stream: its forward runs as it comes */
    rc = offload_owner(e) ? fwd_body(e, &n) : run_graphed(e, EG_FORWARD, fwd_body, &n);
    if (!rc && loss && e->loss_tensor >= 0) rc = exec_download(e, e->loss_tensor, loss);
    return rc;
}

float optim_lr(const struct optim_config *c, int64_t s)
{
    double lr = c->lr;
    if (s < c->warmup) return (float)(lr * (double)(s + 1) / (double)c->warmup);
    if (c->cosine && c->total_steps > c->warmup) {
        double x = (double)(s - c->warmup) / (double)(c->total_steps - c->warmup);
        if (x > 1.0) x = 1.0;
        return (float)(lr * 0.5 * (1.0 + cos(3.14159265358979323846 * x)));
    }
    return (float)lr;
}

static int optimizer_step(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                          float loss_scale, int skip_nonfinite, float *grad_norm, int *applied);

static int optimizer_timed(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                           float loss_scale, int skip_nonfinite, float *grad_norm, int *applied)
{
    double t0 = e->opts.profile ? prof_seconds(e) : 0.0;
    int rc = optimizer_step(e, c, t, lr, loss_scale, skip_nonfinite, grad_norm, applied);
    if (e->opts.profile) {
        e->prof.optim_seconds += prof_seconds(e) - t0;
        e->prof.optim_calls++;
    }
    return rc;
}

static int optim_body(struct exec *e, void *arg)
{
    const struct plan *p = e->p;
    float *ema = (float *)(e->base + p->ema_off);
    int rc = e->bk->optim_step((float *)(e->base + p->params_off),
                               (float *)(e->base + p->adam_m_off),
                               (float *)(e->base + p->adam_v_off), ema,
                               (const float *)(e->base + p->grads_off), p->params_bytes / 4,
                               (const struct bk_optim *)arg, e->ctx);
    return rc ? bk_fail(e, rc, -1, "the optimizer step") : EXEC_OK;
}

/* the step on the device: lr and t as device scalars, the rest the capture's constants */
static int optimizer_dev(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                         float *grad_norm)
{
    const struct strategy_loss_scale *lc = &e->p->strategy.loss_scale;
    int rc;
    if (e->ls_host && (rc = scaler_upload(e))) return rc;
    const struct bk_step st = {.lr = lr, .t = t};
    if ((rc = e->bk->step_set(&st, e->ctx)))
        return bk_fail(e, rc, -1, "setting the step's device scalars");
    struct bk_optim o = {.beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
                         .weight_decay = c->weight_decay, .clip = c->clip,
                         .ema_decay = c->ema_decay, .scaling = e->scaling};
    if (e->scaling) {
        o.growth = lc->growth;
        o.backoff = lc->backoff;
        o.growth_interval = lc->growth_interval;
    }
    if (e->gr[EG_OPTIM].runs && memcmp(&o, &e->gr_optim, sizeof o)) graph_drop(e, EG_OPTIM);
    e->gr_optim = o;
    if ((rc = run_graphed(e, EG_OPTIM, optim_body, &o))) return rc;
    if (grad_norm) {
        struct bk_step_rec last;
        if ((rc = e->bk->step_read(&last, NULL, NULL, 0, NULL, e->ctx)))
            return bk_fail(e, rc, -1, "reading the gradient norm");
        *grad_norm = last.grad_norm;
    }
    return EXEC_OK;
}

int exec_optimizer_step(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                        float *grad_norm)
{
    if (e->p->inference)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "an inference plan has no optimizer state");
    if (e->dev) {
        double t0 = e->opts.profile ? prof_seconds(e) : 0.0;
        int rc = optimizer_dev(e, c, t, lr, grad_norm);
        if (e->opts.profile) {
            e->prof.optim_seconds += prof_seconds(e) - t0;
            e->prof.optim_calls++;
        }
        return rc;
    }
    float norm = 0.0f;
    int applied = 1, rc;
    if (!e->scaling) {
        rc = optimizer_timed(e, c, t, lr, 1.0f, 0, &norm, NULL);
    } else {
        /* f16: the gradients are the loss scale's multiple; AdamW counts applied steps only */
        applied = 0;
        rc = optimizer_timed(e, c, t - e->lsp->skipped, lr, e->lsp->scale, 1, &norm, &applied);
        if (!rc) loss_scaler_update(e->lsp, &e->p->strategy.loss_scale, applied);
    }
    if (rc) return rc;
    if (grad_norm) *grad_norm = norm;
    const struct exec_step_stats r = {(float)e->step_loss, norm, e->lsp->scale, applied};
    e->hlog[e->hlog_n++ % EXEC_STEP_LOG] = r;
    return EXEC_OK;
}

struct loss_scaler *exec_loss_scaler(struct exec *e)
{
    struct exec *o = e->host ? e->host : e;
    if (o->dev && o->scaling && !o->ls_host) {
        /* the device's state, which this copy now is until the next step takes it back */
        struct bk_scaler sc;
        int rc = o->bk->step_read(NULL, &sc, NULL, 0, NULL, o->ctx);
        if (!rc) {
            o->ls.scale = sc.scale;
            o->ls.good_steps = sc.good_steps;
            o->ls.skipped = sc.skipped;
            o->ls_host = 1;
        } else {
            bk_fail(o, rc, -1, "reading the device's loss scale");
        }
    }
    return e->lsp;
}

int exec_step_log(struct exec *e, struct exec_step_stats *out, int max, int *n)
{
    struct exec *o = e->host ? e->host : e;
    *n = 0;
    if (o->p->inference)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "an inference plan has no optimizer steps");
    if (max > EXEC_STEP_LOG) max = EXEC_STEP_LOG;
    if (o->dev) {
        struct bk_step_rec r[EXEC_STEP_LOG];
        int got = 0, rc = o->bk->step_read(NULL, NULL, r, max, &got, o->ctx);
        if (rc) return bk_fail(o, rc, -1, "reading the step log");
        for (int i = 0; i < got; i++)
            out[i] = (struct exec_step_stats){r[i].loss, r[i].grad_norm, r[i].scale, r[i].applied};
        *n = got;
        return EXEC_OK;
    }
    unsigned long long from = o->hlog_read;
    if (o->hlog_n > EXEC_STEP_LOG && from < o->hlog_n - EXEC_STEP_LOG)
        from = o->hlog_n - EXEC_STEP_LOG;
    int k = 0;
    for (; from < o->hlog_n && k < max; from++) out[k++] = o->hlog[from % EXEC_STEP_LOG];
    o->hlog_read = from;
    *n = k;
    return EXEC_OK;
}

void loss_scaler_init(struct loss_scaler *s, const struct strategy_loss_scale *c)
{
    s->scale = c->initial;
    s->good_steps = 0;
    s->skipped = 0;
}

void loss_scaler_update(struct loss_scaler *s, const struct strategy_loss_scale *c, int finite)
{
    if (!finite) {
        s->scale *= c->backoff;
        s->good_steps = 0;
        s->skipped++;
        return;
    }
    if (++s->good_steps >= c->growth_interval) {
        float grown = s->scale * c->growth;
        if (isfinite(grown)) s->scale = grown; /* an infinite scale would make every step inf */
        s->good_steps = 0;
    }
}

/* AdamW, then the EMA when decay > 0, over n words of the parameters' layout (g: their gradient) */
struct adamw_args {
    const struct backend *bk;
    bk_ctx *ctx;
    const struct bk_adamw *h;
    float gscale, ema_decay;
};
static int adamw_span(struct exec *e, const struct adamw_args *a, float *w, float *m, float *v,
                      float *ema, const float *g, size_t n)
{
    const struct backend *bk = a->bk;
    int rc;
    if (a->ema_decay > 0.0f && backend_supports(bk, BK_OP_adamw_ema_step, BK_DTYPE_F32)) {
        if ((rc = bk->adamw_ema_step(w, m, v, ema, g, a->gscale, a->h, a->ema_decay, n, a->ctx)))
            return bk_fail(e, rc, -1, "the AdamW + EMA step");
        return EXEC_OK;
    }
    if ((rc = bk->adamw_step(w, m, v, g, a->gscale, a->h, n, a->ctx)))
        return bk_fail(e, rc, -1, "the AdamW step");
    if (a->ema_decay > 0.0f && (rc = bk->ema_update(ema, w, a->ema_decay, n, a->ctx)))
        return bk_fail(e, rc, -1, "the EMA update");
    return EXEC_OK;
}

static int optimizer_step(struct exec *e, const struct optim_config *c, int64_t t, float lr,
                          float loss_scale, int skip_nonfinite, float *grad_norm, int *applied)
{
    const struct plan *p = e->p;
    if (p->inference)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "an inference plan has no optimizer state");
    size_t words = p->params_bytes / 4;
    float *w = (float *)(e->base + p->params_off), *g = (float *)(e->base + p->grads_off);
    float *m = (float *)(e->base + p->adam_m_off), *v = (float *)(e->base + p->adam_v_off);
    float *ema = (float *)(e->base + p->ema_off);
    const struct backend *bk = e->bk;
    bk_ctx *ctx = e->ctx;
    double ss = 0;
    int rc = BK_OK;
    if (applied) *applied = 0;
    /* the norm on the device, where the gradients are: the plain step's sum, so clipping and
     * the skip test are the same bits with and without offload, and with the gradients in a
     * block or in the arena (a sum per gradient, added in tensor order) */
    if (backend_supports(bk, BK_OP_sumsq_segs, BK_DTYPE_F32))
        rc = bk->sumsq_segs(e->seg_ss, e->segs, e->n_segs, ctx);
    else
        for (int i = 0; i < e->n_segs && !rc; i++)
            rc = bk->sumsq(&e->seg_ss[i], e->segs[i].g, e->segs[i].count, ctx);
    if (rc) return bk_fail(e, rc, -1, "the gradient norm");
    for (int i = 0; i < e->n_segs; i++) ss += e->seg_ss[i];
    if (p->offload) {
        /* the step on the host, on the master, moments and EMA (the host backend's kernels),
         * from the gradients' copy the backward's copies made (grads_out); the master back to
         * the device weights below */
        unsigned char *h = e->hbase;
        if (backend_supports(bk, BK_OP_copy_sync, BK_DTYPE_F32) && (rc = bk->copy_sync(ctx)))
            return bk_fail(e, rc, -1, "waiting for the gradients' copies");
        if (e->master_stale &&
            (rc = bk->mem_download(h + p->host_master_off, w, p->params_bytes, ctx)))
            return bk_fail(e, rc, -1, "copying the weights to the host");
        e->master_stale = 0;
        w = (float *)(h + p->host_master_off);
        g = (float *)(h + p->host_grads_off);
        m = (float *)(h + p->host_adam_m_off);
        v = (float *)(h + p->host_adam_v_off);
        ema = (float *)(h + p->host_ema_off);
        bk = e->hbk;
        ctx = e->hctx;
    }
    /* the norm of the unscaled gradients: a loss scaled by s has gradients s times larger */
    float norm = (float)(sqrt(ss) / (double)loss_scale), gscale = 1.0f;
    if (grad_norm) *grad_norm = norm;
    /* an inf or NaN anywhere makes the sum of squares (in double) inf or NaN: the step is
     * skipped, weights, moments and EMA untouched */
    if (skip_nonfinite && !isfinite(ss)) return EXEC_OK;
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
    if (c->clip > 0.0f) {
        float coef = c->clip / (norm + 1e-6f);
        gscale = coef < 1.0f ? coef : 1.0f;
    }
    if (loss_scale != 1.0f) gscale = (float)((double)gscale / (double)loss_scale);
    if (applied) *applied = 1;
    struct bk_adamw h = {
        .lr = lr,
        .beta1 = c->beta1,
        .beta2 = c->beta2,
        .eps = c->eps,
        .weight_decay = c->weight_decay,
        .bias_c1 = (float)(1.0 - pow((double)c->beta1, (double)t)),
        .bias_c2_sqrt = (float)sqrt(1.0 - pow((double)c->beta2, (double)t)),
    };
    /* one call over the blocks, or (arena gradients) one over the segments or one per
     * gradient: the same bits, each element's update its own */
    const struct adamw_args aa = {bk, ctx, &h, gscale, c->ema_decay};
    if (!p->grads_in_arena) {
        rc = adamw_span(e, &aa, w, m, v, ema, g, words);
    } else if (backend_supports(bk, BK_OP_adamw_segs, BK_DTYPE_F32)) {
        if ((rc = bk->adamw_segs(w, m, v, ema, e->segs, e->n_segs, gscale, &h, c->ema_decay,
                                 ctx)))
            return bk_fail(e, rc, -1, "the AdamW + EMA step");
    } else {
        for (int i = 0; i < e->n_segs && !rc; i++) {
            const size_t r = e->segs[i].rel;
            rc = adamw_span(e, &aa, w + r, m + r, v + r, ema + r, e->segs[i].g, e->segs[i].count);
        }
    }
    if (rc) return rc;
    if (p->offload) {
        /* on the copy stream; the next step's compute waits for it on the device */
        void *dw = e->base + p->params_off;
        rc = e->hbase_locked && backend_supports(e->bk, BK_OP_mem_upload_async, BK_DTYPE_F32)
                 ? e->bk->mem_upload_async(dw, w, p->params_bytes, e->ctx)
                 : e->bk->mem_upload(dw, w, p->params_bytes, e->ctx);
        if (rc) return bk_fail(e, rc, -1, "copying the weights back to the device");
        if ((rc = copies_fence(e))) return rc;
    }
    return EXEC_OK;
}

const struct plan *exec_plan(const struct exec *e) { return e->p; }

size_t exec_device_high_water(const struct exec *e)
{
    return backend_supports(e->bk, BK_OP_mem_high_water, BK_DTYPE_F32) && e->ctx
               ? e->bk->mem_high_water(e->ctx)
               : 0;
}

const struct exec_profile *exec_get_profile(struct exec *e)
{
    return e->opts.profile ? &e->prof : NULL;
}

void exec_profile_reset(struct exec *e)
{
    if (!e->opts.profile) return;
    memset(e->prof.seconds, 0, sizeof e->prof.seconds);
    memset(e->prof.calls, 0, sizeof e->prof.calls);
    memset(e->op_seconds, 0, (size_t)e->g->n_ops * sizeof *e->op_seconds);
    e->prof.optim_seconds = 0.0;
    e->prof.optim_calls = 0;
    e->prof.zero_seconds = 0.0;
}

int exec_time_op(struct exec *e, int k, int reps, double *seconds)
{
    const struct plan *p = e->p;
    *seconds = 0.0;
    if (k < 0 || k >= p->n_run_ops || reps < 1)
        return exec_fail(e, EXEC_ERR_ARG, 0, -1, "no run op %d (or reps %d)", k, reps);
    int rc = bind_workspace(e);
    if (rc) return rc;
    if (p->fuse_host && p->fuse_host[k] >= 0) return EXEC_OK;
    if ((rc = bk_check(e, e->bk->sync(e->ctx), "a sync"))) return rc;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < reps; r++)
        if ((rc = run_op_typed(e, k, 1.0f, 1, 1, 0))) return bk_fail(e, rc, k, "the kernel");
    if ((rc = bk_check(e, e->bk->sync(e->ctx), "a sync"))) return rc;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / reps;
    return EXEC_OK;
}

size_t exec_arena_high_water(struct exec *e)
{
    const struct plan *p = e->p;
    size_t words = p->arena_bytes / 4;
    uint32_t *h = malloc(words * 4 + 4);
    if (!h) return 0;
    size_t hw = 0;
    if (!e->bk->mem_download(h, e->base + p->arena_off, words * 4, e->ctx)) {
        for (size_t i = words; i > 0; i--)
            if (h[i - 1] != FILL_BITS) {
                hw = i * 4;
                break;
            }
    }
    free(h);
    return hw;
}
