/* memplan.c - lifetimes, in-place merging and best-fit placement of the arena; the persistent
 * parts laid out around it. Runs in milliseconds and touches no device memory.
 */
#include "memplan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ops whose output may take over the bytes of an input that dies at that op: the kernels are
 * element-wise in these positions (out[i] depends only on in[i] of the same index). With NHWC
 * images, the image <-> tokens changes around attention are copies too, and a reshape that
 * flattens an image is a transpose. */
static int inplace_input(const struct tensor *const *tv, const struct op *o, int out_idx,
                         int *in_idx, const struct backend *bk)
{
    if (out_idx != 0 || o->accum[0]) return 0;
    switch (o->type) {
    case OP_TO_TOKENS:
    case OP_TO_IMAGE:
        *in_idx = 0;
        return bk->nhwc;
    case OP_RESHAPE:
    case OP_RESHAPE_BWD:
        *in_idx = 0;
        return !bk->nhwc || tv[o->in[0]]->image == tv[o->out[0]]->image;
    case OP_ADD:
    case OP_ADD_BCAST:
    case OP_SILU_BWD:
    case OP_GELU_BWD:
    case OP_ADD_BWD:
    case OP_ADD_BCAST_BWD:
    case OP_DROPOUT:
    case OP_DROPOUT_BWD:
        *in_idx = 0;
        return 1;
    default:
        return 0;
    }
}

static size_t conv_ws_bytes(const struct bk_conv2d *s, const struct backend *bk,
                            struct plan_ws_cache *c);

static size_t op_ws_bytes(const struct op *o, const struct backend *bk, int dtype,
                          struct plan_ws_cache *c)
{
    switch (o->type) {
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER: {
        struct bk_conv2d s = o->a.conv;
        s.dtype = dtype;
        s.w_f32 = backend_conv_w_f32(bk, dtype);
        return conv_ws_bytes(&s, bk, c);
    }
    case OP_ATTENTION:
    case OP_ATTENTION_BWD: {
        struct bk_attn s = o->a.at.s;
        s.dtype = dtype;
        /* a backend without the entry: exec_init refuses the plan */
        return backend_supports(bk, BK_OP_attn_ws_bytes, BK_DTYPE_F32)
                   ? bk->attn_ws_bytes(&s, o->a.at.tiled)
                   : 0;
    }
    case OP_LINEAR:
    case OP_LINEAR_BWD:
        return backend_supports(bk, BK_OP_linear_ws_bytes, BK_DTYPE_F32)
                   ? bk->linear_ws_bytes(o->a.lin.m, o->a.lin.k, o->a.lin.n, dtype)
                   : 0;
    case OP_GROUPNORM: /* the typed kernels' (a fused host may run it: plan_fusions) */
        if (backend_supports(bk, BK_OP_TYPED_groupnorm_ws_bytes, BK_DTYPE_F32)) {
            struct bk_groupnorm s = {o->a.gn.n, o->a.gn.c, o->a.gn.hw, o->a.gn.groups,
                                     o->a.gn.eps, o->a.gn.silu, dtype};
            return bk->typed->groupnorm_ws_bytes(&s, 0);
        }
        return 0;
    case OP_GROUPNORM_BWD: /* the typed kernels', the backend's, or for silu: the normalised x
                            * and statistics (the layout exec.c's groupnorm_bwd uses) */
        if (backend_supports(bk, BK_OP_TYPED_groupnorm_ws_bytes, BK_DTYPE_F32)) {
            struct bk_groupnorm s = {o->a.gn.n, o->a.gn.c, o->a.gn.hw, o->a.gn.groups,
                                     o->a.gn.eps, o->a.gn.silu, dtype};
            return bk->typed->groupnorm_ws_bytes(&s, 1);
        }
        if (backend_supports(bk, BK_OP_groupnorm_bwd_ws_bytes, BK_DTYPE_F32))
            return bk->groupnorm_bwd_ws_bytes(o->a.gn.n, o->a.gn.c, o->a.gn.hw, o->a.gn.groups,
                                              o->a.gn.silu);
        if (!o->a.gn.silu) return 0;
        return plan_align((size_t)o->a.gn.n * o->a.gn.c * o->a.gn.hw * sizeof(float)) +
               2 * (size_t)o->a.gn.n * o->a.gn.groups * sizeof(float);
    default:
        return 0;
    }
}

/* convolution shapes and their workspace bytes, by open addressing on a hash of the shape */
#define WS_CACHE_SLOTS 4096
struct plan_ws_cache {
    const struct backend *bk; /* the backend the bytes are its answers of */
    int n;
    struct ws_entry {
        int used;
        struct bk_conv2d shape;
        size_t bytes;
    } slot[WS_CACHE_SLOTS];
};

struct plan_ws_cache *plan_ws_cache_new(void) { return calloc(1, sizeof(struct plan_ws_cache)); }

void plan_ws_cache_free(struct plan_ws_cache *c) { free(c); }

/* the backend's workspace bytes for convolution shape s, asked once per cache (the shape's
 * oneDNN primitive descriptors are most of a plan's time) */
static size_t conv_ws_bytes(const struct bk_conv2d *s, const struct backend *bk,
                            struct plan_ws_cache *c)
{
    if (!backend_supports(bk, BK_OP_conv2d_ws_bytes, BK_DTYPE_F32)) return 0; /* exec_init says */
    if (!c || (c->bk && c->bk != bk)) return bk->conv2d_ws_bytes(s);
    uint32_t h = 2166136261u; /* FNV-1a over the shape's ints */
    const unsigned char *b = (const unsigned char *)s;
    for (size_t i = 0; i < sizeof *s; i++) h = (h ^ b[i]) * 16777619u;
    for (uint32_t i = 0; i < WS_CACHE_SLOTS; i++) {
        struct ws_entry *e = &c->slot[(h + i) % WS_CACHE_SLOTS];
        if (e->used && !memcmp(&e->shape, s, sizeof *s)) return e->bytes;
        if (e->used) continue;
        size_t bytes = bk->conv2d_ws_bytes(s);
        if (c->n < WS_CACHE_SLOTS / 2) { /* full enough: answer without keeping it */
            c->bk = bk;
            e->used = 1;
            e->shape = *s;
            e->bytes = bytes;
            c->n++;
        }
        return bytes;
    }
    return bk->conv2d_ws_bytes(s);
}

void plan_free(struct plan *p)
{
    free(p->offset);
    free(p->storage);
    free(p->first);
    free(p->last);
    free(p->st);
    free(p->work_offset);
    free(p->cvt);
    free(p->cvt_start);
    free(p->op_dtype);
    free(p->fuse_host);
    free(p->fuse_guest);
    free(p->ops);
    free(p->op_src);
    free(p->copy_of);
    memset(p, 0, sizeof *p);
}

/* whether segment kind is recomputed at granularity r (enum strategy_recompute) */
static int seg_chosen(int kind, int r)
{
    switch (r) {
    case STRATEGY_RECOMPUTE_ATTENTION: return kind == GRAPH_SEG_ATTENTION;
    case STRATEGY_RECOMPUTE_RESBLOCK: return kind == GRAPH_SEG_ATTENTION || kind == GRAPH_SEG_RESBLOCK;
    case STRATEGY_RECOMPUTE_LEVEL: return kind == GRAPH_SEG_LEVEL;
    default: return 0;
    }
}

/* The run order of a training step recomputing the segments granularity r chooses (see
 * memplan.h): p->ops, op_src, n_run_ops, copy_of, n_copies. No chosen segment whose activations a
 * backward op reads leaves p->ops NULL. */
static int recompute_schedule(struct plan *p, const struct graph *g, int r)
{
    const int n = g->n_tensors, nf = g->n_fwd_ops, nops = g->n_ops;
    int rc = PLAN_ERR_NOMEM;
    int *seg_of = malloc(((size_t)n + 1) * sizeof *seg_of); /* tensor: producing segment */
    int *copy = malloc(((size_t)n + 1) * sizeof *copy);     /* tensor: its copy, -1 */
    int *at = malloc(((size_t)g->n_segs + 1) * sizeof *at); /* segment: where it re-runs */
    unsigned char *need = calloc((size_t)n + 1, 1), *op_need = calloc((size_t)nf + 1, 1);
    if (!seg_of || !copy || !at || !need || !op_need) goto out;
    for (int t = 0; t < n; t++) seg_of[t] = copy[t] = -1;
    for (int s = 0; s < g->n_segs; s++) {
        const struct graph_segment *sg = &g->segs[s];
        at[s] = -1;
        if (!seg_chosen(sg->kind, r)) continue;
        for (int k = sg->first; k < sg->end; k++)
            for (int j = 0; j < g->ops[k].n_out; j++) {
                int t = g->ops[k].out[j];
                if (t >= 0 && g->tensors[t]->kind == TENSOR_ACT && seg_of[t] < 0) seg_of[t] = s;
            }
    }
    /* the activations backward ops read, and where each segment must be back */
    for (int k = nf; k < nops; k++)
        for (int j = 0; j < g->ops[k].n_in; j++) {
            int t = g->ops[k].in[j];
            if (t < 0 || seg_of[t] < 0) continue;
            need[t] = 1;
            if (at[seg_of[t]] < 0) at[seg_of[t]] = k;
        }
    /* the segment's ops those depend on (inside the segment), from its end back */
    int extra = 0;
    for (int s = 0; s < g->n_segs; s++) {
        if (at[s] < 0) continue;
        for (int k = g->segs[s].end - 1; k >= g->segs[s].first; k--) {
            const struct op *o = &g->ops[k];
            for (int j = 0; j < o->n_out && !op_need[k]; j++)
                op_need[k] = o->out[j] >= 0 && need[o->out[j]];
            if (!op_need[k]) continue;
            extra++;
            for (int j = 0; j < o->n_in; j++)
                if (o->in[j] >= 0 && seg_of[o->in[j]] == s) need[o->in[j]] = 1;
        }
    }
    if (!extra) {
        rc = PLAN_OK;
        goto out;
    }
    int cap_copies = 0;
    for (int k = 0; k < nf; k++)
        if (op_need[k]) cap_copies += g->ops[k].n_out;
    p->ops = malloc(((size_t)nops + (size_t)extra) * sizeof *p->ops);
    p->op_src = malloc(((size_t)nops + (size_t)extra) * sizeof *p->op_src);
    p->copy_of = malloc(((size_t)cap_copies + 1) * sizeof *p->copy_of);
    if (!p->ops || !p->op_src || !p->copy_of) goto out;
    int m = 0;
    for (int k = 0; k < nf; k++) {
        p->ops[m] = g->ops[k];
        p->op_src[m++] = k;
    }
    for (int k = nf; k < nops; k++) {
        for (int s = 0; s < g->n_segs; s++) {
            if (at[s] != k) continue;
            for (int q = g->segs[s].first; q < g->segs[s].end; q++) {
                if (!op_need[q]) continue;
                struct op o = g->ops[q];
                for (int j = 0; j < o.n_in; j++)
                    if (o.in[j] >= 0 && seg_of[o.in[j]] == s && copy[o.in[j]] >= 0)
                        o.in[j] = copy[o.in[j]];
                for (int j = 0; j < o.n_out; j++) {
                    int t = o.out[j];
                    if (t < 0) continue;
                    copy[t] = n + p->n_copies;
                    p->copy_of[p->n_copies++] = t;
                    o.out[j] = copy[t];
                }
                p->ops[m] = o;
                p->op_src[m++] = q;
                p->n_recomputed++;
            }
        }
        struct op o = g->ops[k];
        for (int j = 0; j < o.n_in; j++)
            if (o.in[j] >= 0 && copy[o.in[j]] >= 0) o.in[j] = copy[o.in[j]];
        p->ops[m] = o;
        p->op_src[m++] = k;
    }
    p->n_run_ops = m;
    rc = PLAN_OK;
out:
    free(seg_of);
    free(copy);
    free(at);
    free(need);
    free(op_need);
    return rc;
}

int plan_run_order(const struct graph *g, int recompute, int **op_src, int *n)
{
    struct plan p;
    memset(&p, 0, sizeof p);
    p.n_run_ops = g->n_ops;
    int rc = recompute > 0 && g->n_fwd_ops ? recompute_schedule(&p, g, recompute) : PLAN_OK;
    *op_src = rc ? NULL : p.op_src;
    *n = p.n_run_ops;
    p.op_src = NULL;
    plan_free(&p);
    return rc;
}

/* placement order: largest first, then earliest, then index (a total order: any sort agrees) */
static int storage_before(const struct plan_storage *st, int a, int b)
{
    const struct plan_storage *x = &st[a], *y = &st[b];
    if (x->bytes != y->bytes) return x->bytes > y->bytes;
    if (x->first != y->first) return x->first < y->first;
    return a < b;
}

/* merge sort of idx[0..n) by storage_before, tmp of n ints */
static void sort_storages(int *idx, int *tmp, int n, const struct plan_storage *st)
{
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = storage_before(st, idx[j], idx[i]) ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

/* a placed storage as the best-fit scan reads it: its lifetime and its bytes (the guard gap
 * included), kept contiguous in offset order so that the scan, the planner's hot loop, reads
 * memory in order */
struct placed {
    int first, last;
    int64_t off, end;
};

/* Best fit: the smallest gap between the storages already placed that overlap s in time.
 * pl[0..n_placed) holds the placed storages in ascending offset order, so one pass over it
 * sees the busy ranges in address order; the result does not depend on how storages with equal
 * offsets are ordered among themselves. */
static int64_t place_best_fit(const struct placed *pl, int n_placed, const struct plan_storage *s,
                              size_t guard)
{
    int64_t need = (int64_t)plan_align(s->bytes + guard), best = -1, best_gap = INT64_MAX;
    int64_t cursor = 0;
    for (int i = 0; i < n_placed; i++) {
        const struct placed *o = &pl[i];
        if (o->first > s->last || s->first > o->last) continue;
        int64_t gap = o->off - cursor;
        if (gap >= need && gap < best_gap) {
            best = cursor;
            best_gap = gap;
        }
        if (o->end > cursor) cursor = o->end;
    }
    return best >= 0 ? best : cursor;
}

/* v (just placed) inserted into pl[0..n) by offset, after those with an equal one */
static void insert_placed(struct placed *pl, int n, struct placed v)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (pl[mid].off <= v.off) lo = mid + 1;
        else hi = mid;
    }
    memmove(pl + lo + 1, pl + lo, (size_t)(n - lo) * sizeof *pl);
    pl[lo] = v;
}

/* loss scaling an f16 step can run with: a positive finite initial scale, growth >= 1,
 * backoff in (0, 1), a growth interval of at least one step */
static int loss_scale_valid(const struct strategy_loss_scale *l)
{
    return l->initial > 0.0f && isfinite(l->initial) && l->growth >= 1.0f && isfinite(l->growth) &&
           l->backoff > 0.0f && l->backoff < 1.0f && l->growth_interval >= 1;
}

/* what plan_build can lay out today: fp32, bf16 or f16 (with valid loss scaling) steps at any
 * micro-batch, with recomputation */
static int plan_strategy_supported(const struct strategy *s)
{
    return (s->precision == STRATEGY_PRECISION_F32 || s->precision == STRATEGY_PRECISION_BF16 ||
            (s->precision == STRATEGY_PRECISION_F16 && loss_scale_valid(&s->loss_scale))) &&
           s->micro_batch >= 0 && s->recompute >= STRATEGY_RECOMPUTE_NONE &&
           s->recompute <= STRATEGY_RECOMPUTE_LEVEL && (s->offload == 0 || s->offload == 1);
}

/* p->parts and p->host_bytes from the part fields (after any change to them) */
static void plan_count_parts(struct plan *p)
{
    memset(p->parts, 0, sizeof p->parts);
    struct plan_part_bytes *b = p->parts;
    if (!p->nested) { /* a nested plan's persistent part is its host's */
        b[PLAN_PART_WEIGHTS].device = p->params_bytes;
        b[PLAN_PART_GRADS].device = p->grads_bytes;
        b[PLAN_PART_OPTIMIZER].device = p->adam_bytes;
        b[PLAN_PART_EMA].device = p->ema_bytes;
    }
    b[PLAN_PART_WORKING].device = p->work_bytes;
    if (p->offload) {
        b[PLAN_PART_GRADS].host = p->params_bytes; /* the optimizer's copy */
        b[PLAN_PART_OPTIMIZER].host = 2 * p->params_bytes;
        b[PLAN_PART_MASTER].host = p->params_bytes;
        b[PLAN_PART_EMA].host = p->params_bytes;
    }
    b[PLAN_PART_INPUTS].device = p->inputs_bytes;
    b[PLAN_PART_WORKSPACE].device = p->ws_bytes + 2 * p->ws_guard_bytes;
    b[PLAN_PART_ARENA].device = p->arena_bytes;
    size_t end = p->arena_off + p->arena_bytes;
    b[PLAN_PART_NESTED].device = p->nested_bytes > end ? p->nested_bytes - end : 0;
    p->host_bytes = 0;
    for (int k = 0; k < PLAN_PART_COUNT; k++) p->host_bytes += b[k].host;
}

/* the shapes of two parameters agree */
static int same_shape(const struct tensor *a, const struct tensor *b)
{
    if (a->rank != b->rank || a->numel != b->numel) return 0;
    for (int k = 0; k < a->rank; k++)
        if (a->d[k] != b->d[k]) return 0;
    return 1;
}

/* the dtype o's kernel of dtype kd takes operand j (in, then out) in on bk: kd where the graph
 * types it (graph_typed_operand), but fp32 for a convolution's weight where the backend rounds
 * weights itself (backend_conv_w_f32), else fp32 */
static int operand_dtype(const struct backend *bk, const struct op *o, int j, int kd)
{
    if (!graph_typed_operand(o, j)) return DTYPE_F32;
    if (j == 1 && (o->type == OP_CONV2D || o->type == OP_CONV2D_BWD_DATA) &&
        backend_conv_w_f32(bk, kd))
        return DTYPE_F32;
    return kd;
}

/* whether run op k's operands all have the dtypes its kernel takes (no conversion scratch) */
static int plan_no_cvt(const struct plan *p, const struct graph *g, const struct op *ops, int k,
                       const struct tensor *const *tv, const struct backend *bk)
{
    const struct op *o = &ops[k], *og = &g->ops[p->op_src ? p->op_src[k] : k];
    for (int j = 0; j < o->n_in + o->n_out; j++) {
        int in = j < o->n_in, t = in ? o->in[j] : o->out[j - o->n_in];
        if (t < 0) continue;
        int dt = in ? (int)graph_input_dtype(g, og, j) : (int)tv[t]->dtype;
        if (dt != operand_dtype(bk, o, j, p->op_dtype[k])) return 0;
    }
    return 1;
}

/* whether tensor t is an input (in) or an output (!in) of o */
static int op_names(const struct op *o, int t, int in)
{
    const int n = in ? o->n_in : o->n_out;
    const int *v = in ? o->in : o->out;
    for (int j = 0; j < n; j++)
        if (v[j] == t) return 1;
    return 0;
}

/* the run ops strictly between a and b read nothing run op gi writes and write nothing it
 * touches: gi may move to a or b */
static int plan_free_between(const struct op *ops, int a, int b, int gi)
{
    const struct op *gu = &ops[gi];
    for (int k = a + 1; k < b; k++) {
        const struct op *o = &ops[k];
        for (int j = 0; j < o->n_in; j++)
            if (o->in[j] >= 0 && op_names(gu, o->in[j], 0)) return 0;
        for (int j = 0; j < o->n_out; j++)
            if (o->out[j] >= 0 && (op_names(gu, o->out[j], 0) || op_names(gu, o->out[j], 1)))
                return 0;
    }
    return 1;
}

/* how far apart (run ops) a fused pair may be: seed's time term has its linear in between */
#define FUSE_REACH 4

/* The fusions a backend with typed kernels runs (see memplan.h fuse_host): a broadcast add (the
 * time term) or a residual add and a group norm next to it become one group-norm kernel:
 *   ADD_BCAST (guest) then GROUPNORM of its output (host): x' = x + b inside the norm's pass;
 *   GROUPNORM_BWD (host) then ADD_BCAST_BWD of its dx (guest): db = sum of dx inside it;
 *   GROUPNORM (guest) whose only reader is an ADD_BCAST (host) shortly after: y = gn + b;
 *   ADD_BCAST_BWD (host) then shortly after GROUPNORM_BWD of its dx (guest): db = sum of dy;
 *   GROUPNORM (guest) whose only reader is an ADD (host) shortly after: y = gn + r.
 * In the last two forward ones the norm's own output is never made (virt: it gets no bytes).
 * Both ops on the same kernel dtype without conversion scratch, nothing in between touching
 * what the guest reads or writes; each op in one fusion at most. readers: per tensor. */
static void plan_fusions(struct plan *p, const struct op *ops, int n_run, const struct graph *g,
                         const struct tensor *const *tv, const struct backend *bk,
                         const int *readers, int no_fuse, unsigned char *virt)
{
    for (int k = 0; k < n_run; k++) p->fuse_host[k] = p->fuse_guest[k] = -1;
    if (!backend_supports(bk, BK_OP_TYPED_groupnorm_fwd, BK_DTYPE_F32) || no_fuse) return;
    for (int k = 0; k < n_run; k++) {
        const struct op *o = &ops[k];
        if (p->fuse_host[k] >= 0 || p->fuse_guest[k] >= 0 || o->out[0] < 0) continue;
        int host = -1, guest = -1;
        if (o->type == OP_ADD_BCAST && k + 1 < n_run && ops[k + 1].type == OP_GROUPNORM &&
            ops[k + 1].in[0] == o->out[0]) {
            guest = k;
            host = k + 1;
        } else if (o->type == OP_GROUPNORM_BWD && k + 1 < n_run &&
                   ops[k + 1].type == OP_ADD_BCAST_BWD && ops[k + 1].in[0] == o->out[0] &&
                   ops[k + 1].out[1] >= 0) {
            host = k;
            guest = k + 1;
        } else if (o->type == OP_GROUPNORM && readers[o->out[0]] == 1) {
            for (int j = k + 1; j < n_run && j <= k + FUSE_REACH && host < 0; j++)
                if ((ops[j].type == OP_ADD_BCAST && ops[j].in[0] == o->out[0]) ||
                    (ops[j].type == OP_ADD && ops[j].in[0] != ops[j].in[1] &&
                     (ops[j].in[0] == o->out[0] || ops[j].in[1] == o->out[0]))) {
                    guest = k;
                    host = j;
                }
        } else if (o->type == OP_ADD_BCAST_BWD && o->out[1] >= 0 && !o->accum[0]) {
            for (int j = k + 1; j < n_run && j <= k + FUSE_REACH && guest < 0; j++)
                if (ops[j].type == OP_GROUPNORM_BWD && ops[j].in[0] == o->out[0]) {
                    host = k;
                    guest = j;
                }
        }
        if (host < 0 || p->fuse_host[host] >= 0 || p->fuse_guest[host] >= 0 ||
            p->fuse_guest[guest] >= 0 || p->op_dtype[host] != p->op_dtype[guest] ||
            !plan_no_cvt(p, g, ops, host, tv, bk) || !plan_no_cvt(p, g, ops, guest, tv, bk) ||
            !plan_free_between(ops, guest < host ? guest : host, guest < host ? host : guest,
                               guest))
            continue;
        p->fuse_host[guest] = host;
        p->fuse_guest[host] = guest;
        p->n_fused++;
        if (ops[guest].type == OP_GROUPNORM && ops[host].type != OP_GROUPNORM)
            virt[ops[guest].out[0]] = 1;
    }
}

/* plan_build's state between its stages: what it was asked, the run order, and per-tensor and
 * per-op scratch that does not outlive the build (build_begin allocates it, build_end frees
 * it). Each stage below reads what the ones before it wrote, in the order plan_build runs them. */
struct build {
    struct plan *p;
    const struct graph *g;
    const struct backend *bk;
    const struct plan_opts *opts;
    int infer;                 /* the forward ops only, no training state */
    const struct plan *host;   /* the plan a nested or shared one lives in, or NULL */
    const struct graph *host_g;
    enum plan_weights weights; /* a nested plan's weights: the host's parameters or its EMA */
    const struct op *ops;      /* (n_run) the run order: p->ops, or the graph's */
    int n, nt, n_run;          /* the graph's tensors; with the recomputed copies; run ops */
    const struct tensor **tv;  /* (nt) each tensor, the copies included (plan_tensor) */
    int *readers;              /* (nt) the run ops reading each tensor */
    int *seq;                  /* (n_run) the ops in the order they run (by position, then
                                * index) */
    unsigned char *secondary;  /* (nt) bit 1: not an op's first output; bit 2: a recomputed
                                * original */
    unsigned char *virt;       /* (nt) a value a fused kernel never makes: no bytes */
    size_t off;                /* the persistent parts' end so far (the next part's offset) */
    int grads_arena;           /* the gradients are arena storages (grads_in_arena) */
};

/* whether a plan under opts keeps its gradients in the arena (plan.grads_in_arena): one
 * forward/backward a step, a training plan of its own, no offload (whose copies read the
 * block), and the optimizer in exec's host-side loop (a device's fused step, BK_OP_optim_step,
 * takes the block) */
static int grads_arena_applies(const struct plan_opts *opts, const struct backend *bk, int infer,
                               int hosted)
{
    return opts && opts->one_pass && !infer && !hosted && opts->strategy.offload != 1 &&
           !(bk && backend_supports(bk, BK_OP_optim_step, BK_DTYPE_F32));
}

/* the position run op k runs at: a fused guest at its host's */
static int run_pos(const struct plan *p, int k)
{
    return p->fuse_host[k] >= 0 ? p->fuse_host[k] : k;
}

/* Allocates the plan's per-tensor and per-op arrays (after recompute_schedule: its copies and
 * run order are known) and the build's scratch, each marked unset. PLAN_OK or PLAN_ERR_NOMEM
 * (build_end frees what was made either way). */
static int build_begin(struct build *b)
{
    struct plan *p = b->p;
    b->n_run = p->n_run_ops;
    b->ops = p->ops ? p->ops : b->g->ops;
    b->n = b->g->n_tensors;
    const int n = b->n, nt = b->nt = n + p->n_copies, n_run = b->n_run;
    p->offset = malloc((size_t)nt * sizeof *p->offset + 1);
    p->storage = malloc((size_t)nt * sizeof *p->storage + 1);
    p->first = malloc((size_t)nt * sizeof *p->first + 1);
    p->last = malloc((size_t)nt * sizeof *p->last + 1);
    /* a storage per arena tensor, and at most one conversion scratch per operand of an op */
    size_t max_cvt = (size_t)n_run * (OP_MAX_IN + OP_MAX_OUT);
    p->st = malloc(((size_t)nt + max_cvt + 1) * sizeof *p->st);
    p->work_offset = malloc((size_t)n * sizeof *p->work_offset + 1);
    p->cvt = malloc((max_cvt + 1) * sizeof *p->cvt);
    p->cvt_start = calloc((size_t)n_run + 1, sizeof *p->cvt_start);
    p->op_dtype = calloc((size_t)n_run + 1, 1);
    p->fuse_host = malloc(((size_t)n_run + 1) * sizeof *p->fuse_host);
    p->fuse_guest = malloc(((size_t)n_run + 1) * sizeof *p->fuse_guest);
    b->seq = malloc(((size_t)n_run + 1) * sizeof *b->seq);
    b->readers = calloc((size_t)nt + 1, sizeof *b->readers);
    b->secondary = calloc((size_t)nt + 1, 1);
    b->virt = calloc((size_t)nt + 1, 1);
    b->tv = malloc(((size_t)nt + 1) * sizeof *b->tv);
    if (!p->offset || !p->storage || !p->first || !p->last || !p->st || !p->work_offset ||
        !p->cvt || !p->cvt_start || !p->op_dtype || !p->fuse_host || !p->fuse_guest || !b->seq ||
        !b->readers || !b->secondary || !b->virt || !b->tv)
        return PLAN_ERR_NOMEM;
    for (int i = 0; i < nt; i++) b->tv[i] = plan_tensor(p, b->g, i);
    for (int i = 0; i < n; i++) p->work_offset[i] = -1;
    for (int i = 0; i < nt; i++) {
        p->offset[i] = -1;
        p->storage[i] = -1;
        p->first[i] = -1;
        p->last[i] = -1;
    }
    return PLAN_OK;
}

/* frees the build's scratch (not the plan) */
static void build_end(struct build *b)
{
    free(b->seq);
    free(b->virt);
    free(b->readers);
    free(b->secondary);
    free(b->tv);
}

/* the kinds of typed kernel (enum bk_half bits) bk runs on 16-bit type lo (backend_supports:
 * half_kernels; the memory-bound ones only where it has backend.typed); 0 for fp32 */
static unsigned half_bits(const struct backend *bk, int lo)
{
    static const struct {
        unsigned bit;
        enum bk_op op;
    } half_of[] = {
        {BK_HALF_CONV, BK_OP_conv2d_fwd},       {BK_HALF_LINEAR, BK_OP_linear_fwd},
        {BK_HALF_ATTN, BK_OP_attn_fwd},         {BK_HALF_ATTN_PLAIN, BK_OP_attn_plain_fwd},
        {BK_HALF_NORM, BK_OP_TYPED_groupnorm_fwd}, {BK_HALF_ELTWISE, BK_OP_TYPED_silu_fwd},
    };
    unsigned half = 0;
    for (size_t i = 0; bk && lo != DTYPE_F32 && i < sizeof half_of / sizeof *half_of; i++)
        if (backend_supports(bk, half_of[i].op, lo)) half |= half_of[i].bit;
    return half;
}

/* p->op_dtype and n_half_ops: the kernels' dtypes, the 16-bit type for a kind of typed kernel
 * the backend runs on it (half_bits), else fp32 */
static void build_kernel_dtypes(struct build *b)
{
    struct plan *p = b->p;
    const int lo = graph_low_dtype(b->g);
    const unsigned half = half_bits(b->bk, lo);
    for (int k = 0; k < b->n_run; k++) {
        const int kd = half & graph_half_kernel(&b->ops[k]) ? lo : DTYPE_F32;
        p->op_dtype[k] = (unsigned char)kd;
        p->n_half_ops += kd != DTYPE_F32;
    }
}

/* the readers of each tensor, the fusions (plan_fusions: fuse_host, fuse_guest, virt) and
 * b->seq, the ops in the order they run: a guest at its host's position */
static void build_run_order(struct build *b)
{
    struct plan *p = b->p;
    for (int k = 0; k < b->n_run; k++) {
        const struct op *o = &b->ops[k];
        for (int j = 0; j < o->n_in; j++)
            if (o->in[j] >= 0) b->readers[o->in[j]]++;
    }
    plan_fusions(p, b->ops, b->n_run, b->g, b->tv, b->bk, b->readers, b->opts->no_fuse, b->virt);
    for (int k = 0, m = 0; k < b->n_run; k++) {
        if (p->fuse_host[k] >= 0) continue;
        const int gu = p->fuse_guest[k];
        if (gu >= 0 && gu < k) b->seq[m++] = gu;
        b->seq[m++] = k;
        if (gu > k) b->seq[m++] = gu;
    }
}

/* p->first and p->last of every tensor the run ops touch, in positions (run_pos) */
static void build_lifetimes(struct build *b)
{
    struct plan *p = b->p;
    const int n_run = b->n_run;
    for (int i = 0; i < n_run; i++) {
        const int k = b->seq[i], pos = run_pos(p, k);
        const struct op *o = &b->ops[k];
        for (int j = 0; j < o->n_out; j++) {
            int t = o->out[j];
            if (t < 0) continue;
            if (p->first[t] < 0) {
                p->first[t] = pos;
                b->secondary[t] = j > 0; /* bit 1; bit 2: a recomputed original */
            }
            p->last[t] = pos;
        }
        for (int j = 0; j < o->n_in; j++) {
            int t = o->in[j];
            if (t < 0) continue;
            if (p->first[t] < 0) p->first[t] = pos;
            p->last[t] = pos;
        }
    }
    /* An arena tensor nobody reads (the loss, a forward-only graph's output) stays until the
     * step ends: the host reads it. In inference, an op's secondary output nobody reads (the
     * statistics group norm and attention save for a backward that never runs) dies at once;
     * so does a recomputed copy nobody reads (another output of an op re-run for one), and an
     * original whose only readers were backward ops that now read its copy. */
    for (int i = 0; i < p->n_copies; i++) b->secondary[p->copy_of[i]] |= 2;
    for (int t = 0; t < b->n; t++)
        if (b->g->tensors[t]->kind == TENSOR_ACT && p->first[t] >= 0 && !b->readers[t] &&
            !(b->infer && (b->secondary[t] & 1)) && !(b->secondary[t] & 2))
            p->last[t] = n_run - 1;
}

/* the arena's storages (p->st, p->storage): one per arena tensor, merged through in-place ops
 * (inplace_input) unless opts.no_reuse; a value no kernel makes (virt) gets none */
static void build_storages(struct build *b)
{
    struct plan *p = b->p;
    const struct tensor *const *tv = b->tv;
    const int n_run = b->n_run;
    for (int i = 0; i < n_run; i++) {
        const int k = b->seq[i], pos = run_pos(p, k);
        const struct op *o = &b->ops[k];
        for (int j = 0; j < o->n_out; j++) {
            int t = o->out[j];
            if (t < 0 || tv[t]->kind != TENSOR_ACT || p->storage[t] >= 0 || b->virt[t]) continue;
            int keep = !b->readers[t] && p->last[t] == n_run - 1;
            int in_idx, src;
            if (!b->opts->no_reuse && p->first[t] == pos &&
                inplace_input(tv, o, j, &in_idx, b->bk) && (src = o->in[in_idx]) >= 0 &&
                tv[src]->kind == TENSOR_ACT && p->storage[src] >= 0 &&
                p->st[p->storage[src]].last == pos &&
                tensor_bytes(tv[src]) == tensor_bytes(tv[t])) {
                p->storage[t] = p->storage[src];
                p->st[p->storage[t]].last = p->last[t];
                p->st[p->storage[t]].keep |= keep;
                continue;
            }
            struct plan_storage *s = &p->st[p->n_storages];
            s->bytes = tensor_bytes(tv[t]);
            s->first = p->first[t];
            s->last = p->last[t];
            s->keep = keep;
            s->offset = -1;
            p->storage[t] = p->n_storages++;
        }
    }
    if (!b->grads_arena) return;
    /* each gradient from its first writer (the position the executor zeroes it at; a
     * gradient no op writes, at the last op) to the end: the optimizer reads it after */
    for (int t = 0; t < b->n; t++) {
        if (tv[t]->kind != TENSOR_GRAD) continue;
        struct plan_storage *s = &p->st[p->n_storages];
        s->bytes = tensor_bytes(tv[t]);
        s->first = p->first[t] >= 0 ? p->first[t] : n_run - 1;
        s->last = n_run - 1;
        s->keep = 1;
        s->offset = -1;
        p->storage[t] = p->n_storages++;
    }
}

/* Which weights have a 16-bit working copy: marks[t] = 1 for a weight that ops [0, n_run) of g
 * read in 16 bits (graph_input_dtype) with at least one of them on an fp32 kernel (bit not in
 * half: half_bits), which then reads the rounded weight converted back into fp32 scratch. A
 * weight only 16-bit kernels read has none: each such op converts it from the fp32 master into
 * scratch of its own (the same bits as the copy, twice a step in training, the forward's read
 * and the backward's), so the arena holds one weight's 16 bits at a time rather than every
 * weight's for the whole step. NULL when out of memory. */
static unsigned char *working_copy_marks(const struct graph *g, int n_run, unsigned half)
{
    unsigned char *m = calloc((size_t)g->n_tensors + 1, 1);
    for (int k = 0; m && k < n_run; k++) {
        const struct op *o = &g->ops[k];
        if (half & graph_half_kernel(o)) continue;
        for (int j = 0; j < o->n_in; j++) {
            int t = o->in[j];
            if (t >= 0 && g->tensors[t]->kind == TENSOR_PARAM &&
                graph_input_dtype(g, o, j) != DTYPE_F32)
                m[t] = 1;
        }
    }
    return m;
}

/* Conversion scratch (p->cvt, cvt_start): an operand stored in another dtype than its kernel
 * takes it in gets a storage of the kernel's dtype for that op alone (fused ops have none); a
 * weight working_copy_marks gives a working copy is marked (work_offset -2, placed by
 * build_working_copy), the others are read from the fp32 master. PLAN_ERR_GRAPH where one
 * operand would need two scratches, PLAN_ERR_NOMEM. */
static int build_conversions(struct build *b)
{
    struct plan *p = b->p;
    const struct graph *g = b->g;
    const struct tensor *const *tv = b->tv;
    /* the graph's ops stand for their recomputed copies (same kernels, same operands' dtypes) */
    const int n_graph = b->infer && g->n_fwd_ops ? g->n_fwd_ops : g->n_ops;
    unsigned char *work = working_copy_marks(g, n_graph, half_bits(b->bk, graph_low_dtype(g)));
    if (!work) return PLAN_ERR_NOMEM;
    for (int k = 0; k < b->n_run; k++) {
        const struct op *o = &b->ops[k];
        /* a recomputed copy's operands have its original's dtypes */
        const struct op *og = &g->ops[p->op_src ? p->op_src[k] : k];
        const int kd = p->op_dtype[k];
        p->cvt_start[k] = p->n_cvt;
        for (int j = 0; j < o->n_in + o->n_out; j++) {
            int in = j < o->n_in, t = in ? o->in[j] : o->out[j - o->n_in];
            if (t < 0) continue;
            int dt = in ? (int)graph_input_dtype(g, og, j) : (int)tv[t]->dtype;
            if (in && tv[t]->kind == TENSOR_PARAM && dt != DTYPE_F32) {
                if (work[t])
                    p->work_offset[t] = -2; /* placed by build_working_copy */
                else
                    dt = DTYPE_F32; /* the master */
            }
            int want = operand_dtype(b->bk, o, j, kd);
            if (dt == want) continue;
            int dup = -1;
            for (int i = p->cvt_start[k]; i < p->n_cvt; i++)
                if (p->cvt[i].tensor == t) dup = i;
            if (dup >= 0) { /* an input read twice (add(x, x)) */
                /* one scratch per operand (exec.c's opnd) */
                if (p->cvt[dup].kdtype != want) return free(work), PLAN_ERR_GRAPH;
                p->cvt[dup].load |= in;
                continue;
            }
            struct plan_storage *s = &p->st[p->n_storages];
            s->bytes = tv[t]->numel * bk_dtype_size(want);
            s->first = s->last = k;
            s->keep = 0;
            s->offset = -1;
            struct plan_cvt *c = &p->cvt[p->n_cvt++];
            c->tensor = t;
            c->storage = p->n_storages++;
            c->dtype = dt;
            c->kdtype = want;
            c->load = in || o->accum[j - o->n_in];
            c->store = !in;
        }
    }
    p->cvt_start[b->n_run] = p->n_cvt;
    free(work);
    return PLAN_OK;
}

/* The parameters, from offset 0: each its own 64-byte aligned bytes; b->off past them.
 * The layout of the persistent and transient parts:
 * [params | adam m | adam v | ema | working copy | grads | inputs | workspace | arena] */
static void build_params_own(struct build *b)
{
    struct plan *p = b->p;
    for (int t = 0; t < b->n; t++)
        if (b->g->tensors[t]->kind == TENSOR_PARAM) {
            p->offset[t] = (int64_t)b->off;
            b->off += plan_align(tensor_bytes(b->g->tensors[t]));
        }
    p->params_off = 0;
    p->params_bytes = b->off;
}

/* A nested or shared plan's parameters are its host's (its EMA for PLAN_WEIGHTS_EMA), matched
 * by name and shape (PLAN_ERR_GRAPH where one is missing or differs). A nested inference plan (a
 * sample grid) starts where the host's transient part does, its gradients included; a shared
 * training one (the uneven last micro-batch) after the host's inputs, since it accumulates into
 * the host's gradients: b->off there. */
static int build_params_host(struct build *b)
{
    struct plan *p = b->p;
    const struct plan *host = b->host;
    const struct graph *g = b->g, *host_g = b->host_g;
    const int infer = b->infer;
    size_t base = infer && b->weights == PLAN_WEIGHTS_EMA ? host->ema_off : host->params_off;
    size_t start = infer ? host->transient_off : host->inputs_off;
    /* an offloading host's EMA is in host memory: the sub-plan's weights get device bytes of
     * their own at the start of the host's transient part */
    p->weights_from_host = infer && b->weights == PLAN_WEIGHTS_EMA && host->offload;
    if (p->weights_from_host) base = start;
    for (int t = 0, w = 0; t < b->n; t++) {
        const struct tensor *tt = g->tensors[t];
        if (tt->kind != TENSOR_PARAM) continue;
        /* the same builder names the parameters in the same order: try the one after the last
         * match before searching by name */
        while (w < host_g->n_tensors && host_g->tensors[w]->kind != TENSOR_PARAM) w++;
        if (w >= host_g->n_tensors || strcmp(host_g->tensors[w]->name, tt->name) != 0)
            w = graph_find_param(host_g, tt->name);
        if (w < 0 || w >= host->n_tensors || host->offset[w] < 0 ||
            !same_shape(tt, host_g->tensors[w]))
            return PLAN_ERR_GRAPH;
        p->offset[t] = (int64_t)(base + ((size_t)host->offset[w] - host->params_off));
        w++;
    }
    p->params_off = base;
    p->params_bytes = host->params_bytes;
    b->off = start + (p->weights_from_host ? p->params_bytes : 0);
    return PLAN_OK;
}

/* The training state that outlives a step: a plan of its own (training, no host) places the
 * AdamW moments and the EMA after the parameters, or (offload) lays them out in the host block
 * with the fp32 master and the gradients' copy; a shared training plan takes its host's
 * (gradients included); an inference plan has none. */
static void build_training_state(struct build *b)
{
    struct plan *p = b->p;
    const struct plan *host = b->host;
    const size_t pb = p->params_bytes;
    if (!b->infer && !host && b->opts->strategy.offload == 1) {
        /* on the device only the gradients; the host block: master, gradients' copy, m, v,
         * EMA */
        p->offload = 1;
        p->adam_m_off = p->adam_v_off = p->ema_off = b->off; /* no bytes */
        p->host_master_off = 0;
        p->host_grads_off = pb;
        p->host_adam_m_off = 2 * pb;
        p->host_adam_v_off = 3 * pb;
        p->host_ema_off = 4 * pb;
    } else if (!b->infer && !host) {
        p->adam_m_off = b->off;
        p->adam_v_off = b->off + pb;
        p->adam_bytes = 2 * pb;
        p->ema_off = b->off + 2 * pb;
        p->ema_bytes = pb;
        b->off += 3 * pb;
    } else if (!b->infer) {
        p->grads_off = host->grads_off;
        p->grads_bytes = host->grads_bytes;
        p->adam_m_off = host->adam_m_off;
        p->adam_v_off = host->adam_v_off;
        p->adam_bytes = host->adam_bytes;
        p->ema_off = host->ema_off;
        p->ema_bytes = host->ema_bytes;
    }
}

/* The start of what holds nothing between two steps (transient_off: the working copy is
 * refreshed before every forward, the gradients zeroed by a step's first micro-batch), and in
 * it the 16-bit working copy of each weight build_conversions marked */
static void build_working_copy(struct build *b)
{
    struct plan *p = b->p;
    p->work_off = p->transient_off = b->off;
    for (int t = 0; t < b->n; t++)
        if (p->work_offset[t] == -2) {
            p->work_offset[t] = (int64_t)b->off;
            b->off += plan_align(b->g->tensors[t]->numel * bk_dtype_size(graph_low_dtype(b->g)));
        }
    p->work_bytes = b->off - p->work_off;
}

/* A training plan's gradients: its own block in the parameters' layout (a plan of its own) or
 * its host's; each gradient sits where its parameter does in the parameter block (the first
 * parameter naming it, if several did). PLAN_ERR_GRAPH for a gradient of no placed parameter,
 * PLAN_ERR_NOMEM. */
static int build_grads(struct build *b)
{
    struct plan *p = b->p;
    const struct graph *g = b->g;
    const int n = b->n;
    if (!b->infer && !b->host) {
        p->grads_off = b->off;
        p->grads_bytes = b->grads_arena ? 0 : p->params_bytes;
        b->off += p->grads_bytes;
    }
    if (b->infer || b->grads_arena) return PLAN_OK; /* arena gradients: placed with the arena */
    int *param_of = malloc((size_t)n * sizeof *param_of + 1);
    if (!param_of) return PLAN_ERR_NOMEM;
    graph_grad_owners(g, param_of);
    int rc = PLAN_OK;
    for (int t = 0; t < n && !rc; t++) {
        if (g->tensors[t]->kind != TENSOR_GRAD) continue;
        if (param_of[t] < 0 || p->offset[param_of[t]] < 0) rc = PLAN_ERR_GRAPH;
        else
            p->offset[t] =
                (int64_t)(p->grads_off + ((size_t)p->offset[param_of[t]] - p->params_off));
    }
    free(param_of);
    return rc;
}

/* the step's inputs, each its own aligned bytes */
static void build_inputs(struct build *b)
{
    struct plan *p = b->p;
    p->inputs_off = b->off;
    for (int t = 0; t < b->n; t++)
        if (b->g->tensors[t]->kind == TENSOR_INPUT) {
            p->offset[t] = (int64_t)b->off;
            b->off += plan_align(tensor_bytes(b->g->tensors[t]));
        }
    p->inputs_bytes = b->off - p->inputs_off;
}

/* The workspace, the largest scratch any run op needs (none for a bound), with canary gaps on
 * both sides as the arena storages have after them; p->arena_off after it. Each convolution
 * shape is asked once (building oneDNN's primitive descriptors is most of a plan's time; a
 * conv's three ops share one shape and a UNet repeats its shapes), or once per opts->ws_cache.
 * PLAN_ERR_NOMEM. */
static int build_workspace(struct build *b)
{
    struct plan *p = b->p;
    const struct plan_opts *opts = b->opts;
    const struct op *ops = b->ops;
    p->guard_bytes = opts->guard_bytes;
    p->ws_guard_bytes = opts->guard_bytes ? plan_align(opts->guard_bytes) : 0;
    p->ws_off = b->off + p->ws_guard_bytes;
    int *convs = malloc((size_t)b->n_run * sizeof *convs + 1);
    if (!convs) return PLAN_ERR_NOMEM;
    for (int k = 0, n_convs = 0; k < b->n_run; k++) {
        const struct op *o = &ops[k];
        if (o->type == OP_CONV2D || o->type == OP_CONV2D_BWD_DATA ||
            o->type == OP_CONV2D_BWD_FILTER) {
            int seen = 0;
            for (int i = 0; i < n_convs && !seen; i++)
                seen = p->op_dtype[convs[i]] == p->op_dtype[k] &&
                       !memcmp(&ops[convs[i]].a.conv, &o->a.conv, sizeof o->a.conv);
            if (seen) continue;
            convs[n_convs++] = k;
        }
        /* a bound counts none: the backend's answers are the costly part of a bound */
        size_t w = opts->bound_only ? 0 : op_ws_bytes(o, b->bk, p->op_dtype[k], opts->ws_cache);
        if (w > p->ws_bytes) p->ws_bytes = w;
    }
    free(convs);
    p->ws_bytes = plan_align(p->ws_bytes);
    p->arena_off = p->ws_off + p->ws_bytes + p->ws_guard_bytes;
    return PLAN_OK;
}

/* opts.bound_only: the arena's bytes are the most live at once (no placement does better), its
 * storages unplaced (offset -1). PLAN_ERR_NOMEM. */
static int build_arena_bound(struct build *b)
{
    struct plan *p = b->p;
    const size_t guard = b->opts->guard_bytes;
    size_t top = 0;
    int64_t *delta = calloc((size_t)b->n_run + 2, sizeof *delta);
    if (!delta) return PLAN_ERR_NOMEM;
    for (int i = 0; i < p->n_storages; i++) {
        int64_t bytes = (int64_t)plan_align(p->st[i].bytes + guard);
        delta[p->st[i].first] += bytes;
        delta[p->st[i].last + 1] -= bytes;
    }
    int64_t live = 0;
    for (int k = 0; k < b->n_run; k++) {
        live += delta[k];
        if ((size_t)live > top) top = (size_t)live;
    }
    free(delta);
    for (int i = 0; i < p->n_storages; i++) p->st[i].offset = -1;
    p->bound_only = 1;
    p->arena_bytes = top;
    p->guards_bytes = guard * (size_t)p->n_storages;
    return PLAN_OK;
}

/* The arena: every storage placed by best fit, largest first (opts.no_reuse: one after the
 * other), each followed by its guard gap; then each arena tensor's offset is its storage's.
 * p->no_reuse_arena_bytes for comparison. PLAN_ERR_NOMEM. */
static int build_arena_place(struct build *b)
{
    struct plan *p = b->p;
    const size_t guard = b->opts->guard_bytes;
    size_t top = 0;
    int *order = malloc((size_t)(p->n_storages + 1) * sizeof *order);
    int *tmp = malloc((size_t)(p->n_storages + 1) * sizeof *tmp);
    struct placed *pl = malloc((size_t)(p->n_storages + 1) * sizeof *pl);
    if (!order || !tmp || !pl) {
        free(order);
        free(tmp);
        free(pl);
        return PLAN_ERR_NOMEM;
    }
    for (int i = 0; i < p->n_storages; i++) {
        order[i] = i;
        p->no_reuse_arena_bytes += plan_align(p->st[i].bytes);
    }
    if (b->opts->no_reuse) {
        for (int i = 0; i < p->n_storages; i++) {
            p->st[i].offset = (int64_t)top;
            top += plan_align(p->st[i].bytes + guard);
        }
    } else {
        sort_storages(order, tmp, p->n_storages, p->st);
        for (int i = 0; i < p->n_storages; i++) {
            struct plan_storage *s = &p->st[order[i]];
            s->offset = place_best_fit(pl, i, s, guard);
            size_t end = (size_t)s->offset + plan_align(s->bytes + guard);
            insert_placed(pl, i, (struct placed){s->first, s->last, s->offset, (int64_t)end});
            if (end > top) top = end;
        }
    }
    free(order);
    free(tmp);
    free(pl);
    p->arena_bytes = top;
    p->guards_bytes = guard * (size_t)p->n_storages;
    for (int i = 0; i < p->n_storages; i++) p->st[i].offset += (int64_t)p->arena_off;
    for (int t = 0; t < b->nt; t++)
        if (p->storage[t] >= 0) p->offset[t] = p->st[p->storage[t]].offset;
    return PLAN_OK;
}

/* plan_make and plan_make_nested: infer plans the forward ops only and no training state; host
 * (may be NULL) is the plan whose allocation a nested plan lives in. The stages in order: the
 * run order (recomputation, kernel dtypes, fusions), the arena's lifetimes and storages, the
 * conversion scratch, the persistent parts, the transient ones, the workspace, the arena's
 * placement, the summary by part. */
static int plan_build(struct plan *p, const struct graph *g, const struct backend *bk,
                      const struct plan_opts *opts, int infer, const struct plan *host,
                      const struct graph *host_g, enum plan_weights weights)
{
    struct plan_opts def = {0};
    if (!opts) opts = &def;
    memset(p, 0, sizeof *p);
    if (g->status) return PLAN_ERR_GRAPH;
    if (!plan_strategy_supported(&opts->strategy) || opts->strategy.precision != g->precision)
        return PLAN_ERR_ARG;
    p->strategy = opts->strategy;
    p->inference = infer;
    p->nested = host != NULL;
    /* a backward, when there is one, starts at n_fwd_ops: an inference step never runs it */
    p->n_run_ops = infer && g->n_fwd_ops ? g->n_fwd_ops : g->n_ops;
    p->n_tensors = g->n_tensors;
    struct build b = {.p = p, .g = g, .bk = bk, .opts = opts, .infer = infer, .host = host,
                      .host_g = host_g, .weights = weights,
                      .grads_arena = grads_arena_applies(opts, bk, infer, host != NULL)};
    p->grads_in_arena = b.grads_arena;
    int rc = PLAN_OK;
    if (!infer && opts->strategy.recompute > 0)
        rc = recompute_schedule(p, g, opts->strategy.recompute);
    if (!rc) rc = build_begin(&b);
    if (!rc) {
        build_kernel_dtypes(&b);
        build_run_order(&b);
        build_lifetimes(&b);
        build_storages(&b);
        rc = build_conversions(&b);
    }
    if (!rc) {
        if (host) rc = build_params_host(&b);
        else build_params_own(&b);
    }
    if (!rc) {
        build_training_state(&b);
        build_working_copy(&b);
        rc = build_grads(&b);
    }
    if (!rc) {
        build_inputs(&b);
        rc = build_workspace(&b);
    }
    if (!rc) rc = opts->bound_only ? build_arena_bound(&b) : build_arena_place(&b);
    if (!rc) {
        p->total_bytes = p->arena_off + p->arena_bytes;
        plan_count_parts(p);
    }
    build_end(&b);
    if (rc) plan_free(p);
    return rc;
}

size_t plan_persistent_bytes(const struct graph *g, const struct backend *bk,
                             const struct plan_opts *opts)
{
    enum plan_mode mode = opts ? opts->mode : PLAN_MODE_AUTO;
    int infer = mode == PLAN_MODE_INFER || (mode == PLAN_MODE_AUTO && g->n_fwd_ops == 0);
    int n_run = infer && g->n_fwd_ops ? g->n_fwd_ops : g->n_ops;
    size_t pb = 0, work = 0, inputs = 0, low = bk_dtype_size(graph_low_dtype(g));
    /* the weights with a working copy, as build_conversions marks them; with no backend or out
     * of memory for the marks, none: still a lower bound */
    unsigned char *half = low < sizeof(float) && bk
                              ? working_copy_marks(g, n_run, half_bits(bk, graph_low_dtype(g)))
                              : NULL;
    for (int t = 0; t < g->n_tensors; t++) {
        const struct tensor *tt = g->tensors[t];
        if (tt->kind == TENSOR_PARAM) pb += plan_align(tensor_bytes(tt));
        else if (tt->kind == TENSOR_INPUT) inputs += plan_align(tensor_bytes(tt));
        if (half && half[t]) work += plan_align(tt->numel * low);
    }
    free(half);
    size_t grads = grads_arena_applies(opts, bk, infer, 0) ? 0 : pb; /* else in the arena */
    size_t state = infer ? 0 : grads + (opts && opts->strategy.offload == 1 ? 0 : 3 * pb);
    return pb + state + work + inputs;
}

int plan_make(struct plan *p, const struct graph *g, const struct backend *bk,
              const struct plan_opts *opts)
{
    enum plan_mode mode = opts ? opts->mode : PLAN_MODE_AUTO;
    int infer = mode == PLAN_MODE_INFER || (mode == PLAN_MODE_AUTO && g->n_fwd_ops == 0);
    return plan_build(p, g, bk, opts, infer, NULL, NULL, PLAN_WEIGHTS_PARAMS);
}

int plan_make_nested(struct plan *sub, const struct graph *g, const struct backend *bk,
                     const struct plan_opts *opts, const struct plan *host,
                     const struct graph *host_g, enum plan_weights weights)
{
    memset(sub, 0, sizeof *sub);
    if (!host || !host_g || host->nested || host->n_tensors != host_g->n_tensors ||
        (weights == PLAN_WEIGHTS_EMA && !host->ema_bytes && !host->offload))
        return PLAN_ERR_ARG;
    return plan_build(sub, g, bk, opts, 1, host, host_g, weights);
}

int plan_make_shared(struct plan *sub, const struct graph *g, const struct backend *bk,
                     const struct plan_opts *opts, const struct plan *host,
                     const struct graph *host_g)
{
    memset(sub, 0, sizeof *sub);
    if (!host || !host_g || host->nested || host->inference ||
        host->n_tensors != host_g->n_tensors)
        return PLAN_ERR_ARG;
    return plan_build(sub, g, bk, opts, 0, host, host_g, PLAN_WEIGHTS_PARAMS);
}

void plan_reserve_nested(struct plan *host, const struct plan *sub)
{
    plan_reserve(host, sub->total_bytes);
}

void plan_reserve(struct plan *host, size_t end)
{
    if (end > host->nested_bytes) host->nested_bytes = end;
    if (host->nested_bytes > host->total_bytes) host->total_bytes = host->nested_bytes;
    plan_count_parts(host);
}

const char *plan_part_name(enum plan_part k)
{
    static const char *const names[PLAN_PART_COUNT] = {
        [PLAN_PART_WEIGHTS] = "weights",     [PLAN_PART_WORKING] = "working_copy",
        [PLAN_PART_GRADS] = "gradients",     [PLAN_PART_OPTIMIZER] = "optimizer",
        [PLAN_PART_MASTER] = "master",       [PLAN_PART_EMA] = "ema",
        [PLAN_PART_INPUTS] = "inputs",       [PLAN_PART_WORKSPACE] = "workspace",
        [PLAN_PART_ARENA] = "arena",         [PLAN_PART_NESTED] = "nested_sampling",
    };
    return (unsigned)k < PLAN_PART_COUNT ? names[k] : "?";
}

static void pr(FILE *f, const char *what, size_t dev, size_t host)
{
    fprintf(f, "  %-24s %14zu bytes %10.2f MiB", what, dev, dev / 1048576.0);
    if (host) fprintf(f, "   host %14zu bytes %10.2f MiB", host, host / 1048576.0);
    fputc('\n', f);
}

void plan_print(const struct plan *p, FILE *f)
{
    static const char *const label[PLAN_PART_COUNT] = {
        [PLAN_PART_WEIGHTS] = "weights (fp32)",     [PLAN_PART_WORKING] = "working copy (16-bit)",
        [PLAN_PART_GRADS] = "gradients",            [PLAN_PART_OPTIMIZER] = "adamw state (m, v)",
        [PLAN_PART_MASTER] = "master weights",      [PLAN_PART_EMA] = "ema",
        [PLAN_PART_INPUTS] = "inputs",              [PLAN_PART_WORKSPACE] = "workspace",
        [PLAN_PART_ARENA] = "activation arena",     [PLAN_PART_NESTED] = "nested sampling (beyond)",
    };
    if (p->nested) pr(f, "weights (host's)", p->params_bytes, 0);
    if (p->inference) fprintf(f, "  (inference: no gradients, optimizer state or EMA)\n");
    if (p->strategy.precision != STRATEGY_PRECISION_F32)
        fprintf(f, "  (precision %s: 16-bit activations and working weights; fp32 weights, "
                "optimizer, statistics and loss; %d of %d ops on 16-bit kernels)\n",
                p->strategy.precision == STRATEGY_PRECISION_BF16 ? "bf16" : "f16", p->n_half_ops,
                p->n_run_ops);
    for (int k = 0; k < PLAN_PART_COUNT; k++) {
        const struct plan_part_bytes *b = &p->parts[k];
        int always = k == PLAN_PART_INPUTS || k == PLAN_PART_WORKSPACE || k == PLAN_PART_ARENA ||
                     (k == PLAN_PART_WEIGHTS && !p->nested) ||
                     (!p->inference && (k == PLAN_PART_GRADS || k == PLAN_PART_OPTIMIZER ||
                                        k == PLAN_PART_EMA));
        if (k == PLAN_PART_GRADS && p->grads_in_arena && !b->host)
            fprintf(f, "  gradients                      in the activation arena (from the op "
                       "that first writes each)\n");
        else if (always || b->device || b->host)
            pr(f, label[k], b->device, b->host);
        if (k == PLAN_PART_WORKSPACE && p->ws_guard_bytes)
            pr(f, "  (canaries around it)", 2 * p->ws_guard_bytes, 0);
        if (k == PLAN_PART_ARENA) pr(f, "  (without reuse)", p->no_reuse_arena_bytes, 0);
    }
    if (p->nested_bytes) pr(f, "  (nested sampling end)", p->nested_bytes, 0);
    pr(f, "device total", p->total_bytes, 0);
    if (p->host_bytes) pr(f, "host total", p->host_bytes, 0);
}
