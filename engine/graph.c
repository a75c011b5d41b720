/* graph.c - graph construction (shape inference per builder) and reverse-mode autodiff.
 * Builders validate shapes and record the first error in g->status; later builders given -1
 * return -1, so a model builder checks the status once at the end.
 */
#include "graph.h"
#include "strategy.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *op_names[OP_COUNT] = {
    [OP_CONV2D] = "conv2d",
    [OP_CONV2D_BWD_DATA] = "conv2d_bwd_data",
    [OP_CONV2D_BWD_FILTER] = "conv2d_bwd_filter",
    [OP_LINEAR] = "linear",
    [OP_LINEAR_BWD] = "linear_bwd",
    [OP_GROUPNORM] = "groupnorm",
    [OP_GROUPNORM_BWD] = "groupnorm_bwd",
    [OP_LAYERNORM] = "layernorm",
    [OP_LAYERNORM_BWD] = "layernorm_bwd",
    [OP_SILU] = "silu",
    [OP_SILU_BWD] = "silu_bwd",
    [OP_GELU] = "gelu",
    [OP_GELU_BWD] = "gelu_bwd",
    [OP_ADD] = "add",
    [OP_ADD_BWD] = "add_bwd",
    [OP_ADD_BCAST] = "add_bcast",
    [OP_ADD_BCAST_BWD] = "add_bcast_bwd",
    [OP_CONCAT] = "concat",
    [OP_CONCAT_BWD] = "concat_bwd",
    [OP_TO_TOKENS] = "to_tokens",
    [OP_TO_IMAGE] = "to_image",
    [OP_UPSAMPLE_NEAREST] = "upsample_nearest",
    [OP_UPSAMPLE_NEAREST_BWD] = "upsample_nearest_bwd",
    [OP_UPSAMPLE_BILINEAR] = "upsample_bilinear",
    [OP_UPSAMPLE_BILINEAR_BWD] = "upsample_bilinear_bwd",
    [OP_MAXPOOL] = "maxpool",
    [OP_MAXPOOL_BWD] = "maxpool_bwd",
    [OP_TIMESTEP_EMBED] = "timestep_embed",
    [OP_ATTENTION] = "attention",
    [OP_ATTENTION_BWD] = "attention_bwd",
    [OP_MSE] = "mse",
    [OP_MSE_BWD] = "mse_bwd",
    [OP_DROPOUT] = "dropout",
    [OP_DROPOUT_BWD] = "dropout_bwd",
    [OP_XENT] = "xent",
    [OP_XENT_BWD] = "xent_bwd",
    [OP_RESHAPE] = "reshape",
    [OP_RESHAPE_BWD] = "reshape_bwd",
};

const char *op_name(enum op_type t) { return t < OP_COUNT ? op_names[t] : "?"; }

int graph_init(struct graph *g)
{
    memset(g, 0, sizeof *g);
    return GRAPH_OK;
}

void graph_free(struct graph *g)
{
    for (int i = 0; i < g->n_tensors; i++) {
        free(g->tensors[i]->name);
        free(g->tensors[i]);
    }
    free(g->tensors);
    free(g->ops);
    free(g->segs);
    free(g->param_slot);
    memset(g, 0, sizeof *g);
}

/* the slot of name in g->param_slot: the one holding it, or the empty one it would take */
static int param_slot_of(const struct graph *g, const char *name)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 16777619u;
    int mask = g->param_cap - 1, i = (int)(h & (uint32_t)mask);
    while (g->param_slot[i] >= 0 && strcmp(g->tensors[g->param_slot[i]]->name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* room in g->param_slot for one more parameter */
static int param_table_reserve(struct graph *g)
{
    if (2 * (g->n_params + 1) <= g->param_cap) return 0;
    int cap = g->param_cap ? 2 * g->param_cap : 256;
    int *slot = malloc((size_t)cap * sizeof *slot), *old = g->param_slot;
    if (!slot) return -1;
    for (int i = 0; i < cap; i++) slot[i] = -1;
    g->param_slot = slot;
    g->param_cap = cap;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t]->kind == TENSOR_PARAM && g->tensors[t]->name)
            g->param_slot[param_slot_of(g, g->tensors[t]->name)] = t;
    free(old);
    return 0;
}

int graph_mark_segment(struct graph *g, int first, int kind)
{
    if (g->status || first < 0 || first >= g->n_ops || g->n_fwd_ops) return g->status;
    if (g->n_segs == g->cap_segs) {
        int cap = g->cap_segs ? 2 * g->cap_segs : 64;
        struct graph_segment *s = realloc(g->segs, (size_t)cap * sizeof *s);
        if (!s) return graph_fail(g, GRAPH_ERR_NOMEM, "out of memory for segments"), g->status;
        g->segs = s;
        g->cap_segs = cap;
    }
    g->segs[g->n_segs++] = (struct graph_segment){first, g->n_ops, kind};
    return GRAPH_OK;
}

int graph_fail(struct graph *g, int status, const char *fmt, ...)
{
    if (g->status == GRAPH_OK) {
        g->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->err, sizeof g->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

size_t tensor_bytes(const struct tensor *t)
{
    size_t es = t->dtype == DTYPE_F32 ? 4 : 2;
    return t->numel * es;
}

int graph_tensor(struct graph *g, enum tensor_kind kind, const char *name, int rank,
                 const int *dims)
{
    if (g->status) return -1;
    if (rank < 1 || rank > 4) return graph_fail(g, GRAPH_ERR_SHAPE, "rank %d", rank);
    /* the shape is checked before anything is appended: a refused tensor never joins the
     * graph half-made (a parameter without its name, say) */
    int d[4];
    size_t numel = 1;
    for (int i = 0; i < 4; i++) {
        d[i] = i < rank ? dims[i] : 1;
        if (d[i] < 1) return graph_fail(g, GRAPH_ERR_SHAPE, "%s: dim %d is %d",
                                        name ? name : "tensor", i, d[i]);
        if (numel > GRAPH_MAX_NUMEL / (size_t)d[i])
            return graph_fail(g, GRAPH_ERR_SHAPE, "%s: more than 2^40 elements",
                              name ? name : "tensor");
        numel *= (size_t)d[i];
    }
    if (g->n_tensors == g->cap_tensors) {
        int cap = g->cap_tensors ? 2 * g->cap_tensors : 256;
        struct tensor **ts = realloc(g->tensors, (size_t)cap * sizeof *ts);
        if (!ts) return graph_fail(g, GRAPH_ERR_NOMEM, "out of memory");
        g->tensors = ts;
        g->cap_tensors = cap;
    }
    if (kind == TENSOR_PARAM && name && param_table_reserve(g))
        return graph_fail(g, GRAPH_ERR_NOMEM, "out of memory");
    struct tensor *t = calloc(1, sizeof *t);
    char *nm = name ? strdup(name) : NULL;
    if (!t || (name && !nm)) {
        free(t);
        free(nm);
        return graph_fail(g, GRAPH_ERR_NOMEM, "out of memory");
    }
    int id = g->n_tensors++;
    g->tensors[id] = t;
    t->kind = kind;
    t->dtype = DTYPE_F32;
    t->rank = rank;
    memcpy(t->d, d, sizeof t->d);
    t->numel = numel;
    t->name = nm;
    t->grad = -1;
    t->param_index = -1;
    t->image = rank == 4 && (kind == TENSOR_ACT || kind == TENSOR_INPUT);
    if (kind == TENSOR_PARAM) {
        t->requires_grad = 1;
        t->param_index = g->n_params++;
        g->param_numel += t->numel;
        int sl = nm ? param_slot_of(g, nm) : -1;
        if (sl >= 0 && g->param_slot[sl] < 0) g->param_slot[sl] = id; /* the first of a name */
    }
    return id;
}

int graph_param(struct graph *g, const char *name, int rank, const int *dims)
{
    if (g->status) return -1;
    if (!name) return graph_fail(g, GRAPH_ERR_SHAPE, "a parameter needs a name");
    if (graph_find_param(g, name) >= 0)
        return graph_fail(g, GRAPH_ERR_SHAPE, "duplicate parameter name %s", name);
    return graph_tensor(g, TENSOR_PARAM, name, rank, dims);
}

int graph_input(struct graph *g, const char *name, int rank, const int *dims)
{
    return graph_tensor(g, TENSOR_INPUT, name, rank, dims);
}

void graph_grad_owners(const struct graph *g, int *owner)
{
    for (int t = 0; t < g->n_tensors; t++) owner[t] = -1;
    for (int t = g->n_tensors - 1; t >= 0; t--) {
        int gt = g->tensors[t]->grad;
        if (gt >= 0 && gt < g->n_tensors) owner[gt] = t;
    }
}

int graph_find_param(const struct graph *g, const char *name)
{
    if (!g->param_cap || !name) return -1;
    return g->param_slot[param_slot_of(g, name)];
}

/* a new activation shaped like dims, requiring grad when any of the inputs does */
static int act(struct graph *g, int rank, const int *dims, int rg)
{
    int t = graph_tensor(g, TENSOR_ACT, NULL, rank, dims);
    if (t >= 0) g->tensors[t]->requires_grad = rg;
    return t;
}

static struct op *op_new(struct graph *g, enum op_type type)
{
    if (g->n_ops == g->cap_ops) {
        int cap = g->cap_ops ? 2 * g->cap_ops : 256;
        struct op *o = realloc(g->ops, (size_t)cap * sizeof *o);
        if (!o) {
            graph_fail(g, GRAPH_ERR_NOMEM, "out of memory");
            return NULL;
        }
        g->ops = o;
        g->cap_ops = cap;
    }
    struct op *o = &g->ops[g->n_ops++];
    memset(o, 0, sizeof *o);
    o->type = type;
    o->fwd = -1;
    for (int i = 0; i < OP_MAX_IN; i++) o->in[i] = -1;
    for (int i = 0; i < OP_MAX_OUT; i++) o->out[i] = -1;
    return o;
}

static const struct tensor *T(const struct graph *g, int id) { return g->tensors[id]; }
static int rg(const struct graph *g, int id) { return id >= 0 && g->tensors[id]->requires_grad; }

#define BAD(...) return graph_fail(g, GRAPH_ERR_SHAPE, __VA_ARGS__)
#define NEED(id) if ((id) < 0 || g->status) return -1

/* a * b for an op's int size field (the kernels take ints), or -1 with the graph's error when
 * it does not fit; a and b are dims (>= 1) or sizes derived from them */
static int isize(struct graph *g, const char *what, int64_t a, int64_t b)
{
    int64_t p = a * b;
    if (a < 0 || b < 0 || (a && p / a != b) || p > INT_MAX)
        return graph_fail(g, GRAPH_ERR_SHAPE, "%s: %lld x %lld does not fit an int", what,
                          (long long)a, (long long)b);
    return (int)p;
}

int graph_conv2d(struct graph *g, int x, int w, int b, int stride, int pad_t, int pad_l,
                 int pad_b, int pad_r)
{
    NEED(x); NEED(w);
    const struct tensor *tx = T(g, x), *tw = T(g, w);
    if (tx->rank != 4 || tw->rank != 4 || tw->d[1] != tx->d[1])
        BAD("conv2d %s: input channels %d, weight expects %d", tw->name, tx->d[1], tw->d[1]);
    if (b >= 0 && T(g, b)->numel != (size_t)tw->d[0]) BAD("conv2d %s: bias size", tw->name);
    if (stride < 1 || pad_t < 0 || pad_l < 0 || pad_b < 0 || pad_r < 0 ||
        (int64_t)tx->d[2] + pad_t + pad_b > INT_MAX || (int64_t)tx->d[3] + pad_l + pad_r > INT_MAX)
        BAD("conv2d %s: stride %d, padding %d,%d,%d,%d", tw->name, stride, pad_t, pad_l, pad_b,
            pad_r);
    struct bk_conv2d s = {.n = tx->d[0], .ci = tx->d[1], .h = tx->d[2], .w = tx->d[3],
                          .co = tw->d[0], .kh = tw->d[2], .kw = tw->d[3], .stride = stride,
                          .pad_t = pad_t, .pad_l = pad_l, .pad_b = pad_b, .pad_r = pad_r};
    if (bk_conv2d_init(&s)) BAD("conv2d %s: empty output", tw->name);
    int dims[4] = {s.n, s.co, s.ho, s.wo};
    int y = act(g, 4, dims, rg(g, x) || rg(g, w) || rg(g, b));
    struct op *o = op_new(g, OP_CONV2D);
    if (!o || y < 0) return -1;
    o->n_in = 3; o->in[0] = x; o->in[1] = w; o->in[2] = b;
    o->n_out = 1; o->out[0] = y;
    o->a.conv = s;
    return y;
}

int graph_linear(struct graph *g, int x, int w, int b)
{
    NEED(x); NEED(w);
    const struct tensor *tx = T(g, x), *tw = T(g, w);
    int k = tx->d[tx->rank - 1];
    if (tw->rank != 2 || tw->d[1] != k) BAD("linear %s: input features %d", tw->name, k);
    if (b >= 0 && T(g, b)->numel != (size_t)tw->d[0]) BAD("linear %s: bias size", tw->name);
    int m = isize(g, "linear rows", (int64_t)(tx->numel / (size_t)k), 1);
    if (m < 0) return -1;
    int dims[4];
    memcpy(dims, tx->d, sizeof dims);
    dims[tx->rank - 1] = tw->d[0];
    int y = act(g, tx->rank, dims, rg(g, x) || rg(g, w) || rg(g, b));
    struct op *o = op_new(g, OP_LINEAR);
    if (!o || y < 0) return -1;
    o->n_in = 3; o->in[0] = x; o->in[1] = w; o->in[2] = b;
    o->n_out = 1; o->out[0] = y;
    o->a.lin.m = m;
    o->a.lin.k = k;
    o->a.lin.n = tw->d[0];
    return y;
}

static int stats(struct graph *g, int n)
{
    int dims[1] = {n};
    return act(g, 1, dims, 0);
}

static int groupnorm_op(struct graph *g, int x, int gamma, int beta, int groups, float eps,
                        int silu)
{
    NEED(x); NEED(gamma); NEED(beta);
    const struct tensor *tx = T(g, x);
    int c = tx->d[1];
    if (tx->rank != 4 || groups < 1 || c % groups)
        BAD("groupnorm %s: %d channels in %d groups", T(g, gamma)->name, c, groups);
    if (T(g, gamma)->numel != (size_t)c || T(g, beta)->numel != (size_t)c)
        BAD("groupnorm %s: affine size", T(g, gamma)->name);
    int ng = isize(g, "groupnorm statistics", tx->d[0], groups);
    int hw = isize(g, "groupnorm pixels", tx->d[2], tx->d[3]);
    if (ng < 0 || hw < 0) return -1;
    int y = act(g, 4, tx->d, 1);
    int mean = stats(g, ng), rstd = stats(g, ng);
    struct op *o = op_new(g, OP_GROUPNORM);
    if (!o || y < 0 || mean < 0 || rstd < 0) return -1;
    o->n_in = 3; o->in[0] = x; o->in[1] = gamma; o->in[2] = beta;
    o->n_out = 3; o->out[0] = y; o->out[1] = mean; o->out[2] = rstd;
    o->a.gn.n = tx->d[0];
    o->a.gn.c = c;
    o->a.gn.hw = hw;
    o->a.gn.groups = groups;
    o->a.gn.eps = eps;
    o->a.gn.silu = silu;
    return y;
}

int graph_groupnorm(struct graph *g, int x, int gamma, int beta, int groups, float eps)
{
    return groupnorm_op(g, x, gamma, beta, groups, eps, 0);
}

int graph_groupnorm_silu(struct graph *g, int x, int gamma, int beta, int groups, float eps)
{
    return groupnorm_op(g, x, gamma, beta, groups, eps, 1);
}

int graph_layernorm(struct graph *g, int x, int gamma, int beta, float eps)
{
    NEED(x); NEED(gamma); NEED(beta);
    const struct tensor *tx = T(g, x);
    int d = tx->d[tx->rank - 1];
    if (T(g, gamma)->numel != (size_t)d || T(g, beta)->numel != (size_t)d)
        BAD("layernorm %s: affine size", T(g, gamma)->name);
    int m = isize(g, "layernorm rows", (int64_t)(tx->numel / (size_t)d), 1);
    if (m < 0) return -1;
    int y = act(g, tx->rank, tx->d, 1);
    int mean = stats(g, m), rstd = stats(g, m);
    struct op *o = op_new(g, OP_LAYERNORM);
    if (!o || y < 0 || mean < 0 || rstd < 0) return -1;
    o->n_in = 3; o->in[0] = x; o->in[1] = gamma; o->in[2] = beta;
    o->n_out = 3; o->out[0] = y; o->out[1] = mean; o->out[2] = rstd;
    o->a.ln.m = m;
    o->a.ln.d = d;
    o->a.ln.eps = eps;
    return y;
}

static int unary(struct graph *g, enum op_type type, int x)
{
    NEED(x);
    const struct tensor *tx = T(g, x);
    int y = act(g, tx->rank, tx->d, rg(g, x));
    struct op *o = op_new(g, type);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = x;
    o->n_out = 1; o->out[0] = y;
    return y;
}

int graph_silu(struct graph *g, int x) { return unary(g, OP_SILU, x); }
int graph_gelu(struct graph *g, int x) { return unary(g, OP_GELU, x); }

int graph_dropout(struct graph *g, int x, float p)
{
    if (p == 0.0f) return x; /* identity: no op, no memory */
    if (!(p > 0.0f && p < 1.0f)) return graph_fail(g, GRAPH_ERR_SHAPE, "dropout p %g", p);
    int y = unary(g, OP_DROPOUT, x);
    if (y < 0) return -1;
    struct op *o = &g->ops[g->n_ops - 1];
    o->a.dr.n = T(g, x)->d[0];
    o->a.dr.per_sample = T(g, x)->numel / (size_t)T(g, x)->d[0];
    o->a.dr.p = p;
    return y;
}

int graph_add(struct graph *g, int a, int b)
{
    NEED(a); NEED(b);
    if (T(g, a)->numel != T(g, b)->numel) BAD("add: %zu vs %zu elements", T(g, a)->numel,
                                              T(g, b)->numel);
    int y = act(g, T(g, a)->rank, T(g, a)->d, rg(g, a) || rg(g, b));
    struct op *o = op_new(g, OP_ADD);
    if (!o || y < 0) return -1;
    o->n_in = 2; o->in[0] = a; o->in[1] = b;
    o->n_out = 1; o->out[0] = y;
    return y;
}

int graph_add_bcast(struct graph *g, int x, int b)
{
    NEED(x); NEED(b);
    const struct tensor *tx = T(g, x);
    if (tx->rank != 4 || T(g, b)->numel != (size_t)tx->d[0] * tx->d[1])
        BAD("add_bcast: term of %zu elements for (%d,%d)", T(g, b)->numel, tx->d[0], tx->d[1]);
    int hw = isize(g, "add_bcast pixels", tx->d[2], tx->d[3]);
    if (hw < 0) return -1;
    int y = act(g, 4, tx->d, rg(g, x) || rg(g, b));
    struct op *o = op_new(g, OP_ADD_BCAST);
    if (!o || y < 0) return -1;
    o->n_in = 2; o->in[0] = x; o->in[1] = b;
    o->n_out = 1; o->out[0] = y;
    o->a.bc.n = tx->d[0];
    o->a.bc.c = tx->d[1];
    o->a.bc.hw = hw;
    return y;
}

int graph_concat(struct graph *g, int a, int b)
{
    NEED(a); NEED(b);
    const struct tensor *ta = T(g, a), *tb = T(g, b);
    if (ta->rank != 4 || tb->rank != 4 || ta->d[0] != tb->d[0] || ta->d[2] != tb->d[2] ||
        ta->d[3] != tb->d[3])
        BAD("concat: (%d,%d,%d,%d) with (%d,%d,%d,%d)", ta->d[0], ta->d[1], ta->d[2], ta->d[3],
            tb->d[0], tb->d[1], tb->d[2], tb->d[3]);
    int c = isize(g, "concat channels", (int64_t)ta->d[1] + tb->d[1], 1);
    int hw = isize(g, "concat pixels", ta->d[2], ta->d[3]);
    if (c < 0 || hw < 0) return -1;
    int dims[4] = {ta->d[0], c, ta->d[2], ta->d[3]};
    int y = act(g, 4, dims, rg(g, a) || rg(g, b));
    struct op *o = op_new(g, OP_CONCAT);
    if (!o || y < 0) return -1;
    o->n_in = 2; o->in[0] = a; o->in[1] = b;
    o->n_out = 1; o->out[0] = y;
    o->a.cat.n = ta->d[0];
    o->a.cat.c1 = ta->d[1];
    o->a.cat.c2 = tb->d[1];
    o->a.cat.hw = hw;
    return y;
}

int graph_to_tokens(struct graph *g, int x)
{
    NEED(x);
    const struct tensor *tx = T(g, x);
    if (tx->rank != 4) BAD("to_tokens: rank %d", tx->rank);
    int hw = isize(g, "to_tokens pixels", tx->d[2], tx->d[3]);
    if (hw < 0) return -1;
    int dims[3] = {tx->d[0], hw, tx->d[1]};
    int y = act(g, 3, dims, rg(g, x));
    struct op *o = op_new(g, OP_TO_TOKENS);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = x;
    o->n_out = 1; o->out[0] = y;
    o->a.bc.n = tx->d[0];
    o->a.bc.c = tx->d[1];
    o->a.bc.hw = hw;
    return y;
}

int graph_to_image(struct graph *g, int x, int h, int w)
{
    NEED(x);
    const struct tensor *tx = T(g, x);
    if (tx->rank != 3 || h < 1 || w < 1 || (int64_t)h * w != tx->d[1])
        BAD("to_image: %d tokens for %dx%d", tx->rank == 3 ? tx->d[1] : 0, h, w);
    int dims[4] = {tx->d[0], tx->d[2], h, w};
    int y = act(g, 4, dims, rg(g, x));
    struct op *o = op_new(g, OP_TO_IMAGE);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = x;
    o->n_out = 1; o->out[0] = y;
    o->a.bc.n = tx->d[0];
    o->a.bc.c = tx->d[2];
    o->a.bc.hw = h * w;
    return y;
}

static int resample(struct graph *g, enum op_type type, int x, int up, int align)
{
    NEED(x);
    const struct tensor *tx = T(g, x);
    if (tx->rank != 4) BAD("%s: rank %d", op_name(type), tx->rank);
    if (!up && (tx->d[2] < 2 || tx->d[3] < 2)) BAD("maxpool: %dx%d input", tx->d[2], tx->d[3]);
    if (up && (isize(g, op_name(type), tx->d[2], 2) < 0 || isize(g, op_name(type), tx->d[3], 2) < 0))
        return -1;
    int dims[4] = {tx->d[0], tx->d[1], up ? 2 * tx->d[2] : tx->d[2] / 2,
                   up ? 2 * tx->d[3] : tx->d[3] / 2};
    int y = act(g, 4, dims, rg(g, x));
    struct op *o = op_new(g, type);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = x;
    o->n_out = 1; o->out[0] = y;
    o->a.rs.n = tx->d[0];
    o->a.rs.c = tx->d[1];
    o->a.rs.h = tx->d[2];
    o->a.rs.w = tx->d[3];
    o->a.rs.align_corners = align;
    return y;
}

int graph_upsample_nearest(struct graph *g, int x)
{
    return resample(g, OP_UPSAMPLE_NEAREST, x, 1, 0);
}
int graph_upsample_bilinear(struct graph *g, int x, int align_corners)
{
    return resample(g, OP_UPSAMPLE_BILINEAR, x, 1, align_corners);
}
int graph_maxpool(struct graph *g, int x) { return resample(g, OP_MAXPOOL, x, 0, 0); }

int graph_timestep_embed(struct graph *g, int t, int dim, int flip_sin_to_cos, float freq_shift,
                         float max_period)
{
    NEED(t);
    int n = (int)T(g, t)->numel;
    if (dim < 2 || !((float)(dim / 2) - freq_shift > 0.0f)) BAD("timestep_embed: dim %d", dim);
    int dims[2] = {n, dim};
    int y = act(g, 2, dims, 0);
    struct op *o = op_new(g, OP_TIMESTEP_EMBED);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = t;
    o->n_out = 1; o->out[0] = y;
    o->a.te.n = n;
    o->a.te.dim = dim;
    o->a.te.flip = flip_sin_to_cos;
    o->a.te.shift = freq_shift;
    o->a.te.max_period = max_period;
    return y;
}

int graph_attention(struct graph *g, int q, int k, int v, int heads, int tiled)
{
    NEED(q);
    const struct tensor *tq = T(g, q);
    int packed = k < 0;
    if (tq->rank != 3) BAD("attention: rank %d", tq->rank);
    int c = packed ? tq->d[2] / 3 : tq->d[2];
    if ((packed && tq->d[2] != 3 * c) || heads < 1 || c % heads)
        BAD("attention: %d features in %d heads", c, heads);
    if (!packed && (v < 0 || T(g, k)->numel != tq->numel || T(g, v)->numel != tq->numel))
        BAD("attention: q, k, v differ");
    struct bk_attn s = {.n = tq->d[0], .l = tq->d[1], .heads = heads, .d = c / heads,
                        .ld = tq->d[2], .scale = (float)(1.0 / sqrt((double)(c / heads)))};
    int dims[3] = {s.n, s.l, c};
    int any = rg(g, q) || rg(g, k) || rg(g, v);
    int o_id = act(g, 3, dims, any);
    int saved;
    if (tiled) {
        int sd[3] = {s.n, s.heads, s.l};
        saved = act(g, 3, sd, 0);
    } else {
        int sd[4] = {s.n, s.heads, s.l, s.l};
        saved = act(g, 4, sd, 0);
        if (saved >= 0) g->tensors[saved]->image = 0; /* probabilities (N,H,L,L) */
    }
    struct op *o = op_new(g, OP_ATTENTION);
    if (!o || o_id < 0 || saved < 0) return -1;
    o->n_in = 3; o->in[0] = q; o->in[1] = k; o->in[2] = v;
    o->n_out = 2; o->out[0] = o_id; o->out[1] = saved;
    o->a.at.s = s;
    o->a.at.packed = packed;
    o->a.at.tiled = tiled;
    return o_id;
}

int graph_mse(struct graph *g, int pred, int target)
{
    NEED(pred); NEED(target);
    if (T(g, pred)->numel != T(g, target)->numel) BAD("mse: sizes differ");
    int dims[1] = {1};
    int y = act(g, 1, dims, rg(g, pred));
    struct op *o = op_new(g, OP_MSE);
    if (!o || y < 0) return -1;
    o->n_in = 2; o->in[0] = pred; o->in[1] = target;
    o->n_out = 1; o->out[0] = y;
    return y;
}

int graph_xent(struct graph *g, int logits, int target)
{
    NEED(logits); NEED(target);
    const struct tensor *tl = T(g, logits);
    if (tl->rank != 2 || T(g, target)->numel != tl->numel) BAD("xent: logits must be (N,K)");
    int dims[1] = {1};
    int y = act(g, 1, dims, rg(g, logits));
    int prob = act(g, 2, tl->d, 0);
    struct op *o = op_new(g, OP_XENT);
    if (!o || y < 0 || prob < 0) return -1;
    o->n_in = 2; o->in[0] = logits; o->in[1] = target;
    o->n_out = 2; o->out[0] = y; o->out[1] = prob;
    o->a.lin.m = tl->d[0];
    o->a.lin.n = tl->d[1];
    return y;
}

int graph_reshape(struct graph *g, int x, int rank, const int *dims)
{
    NEED(x);
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)(dims[i] > 0 ? dims[i] : 0);
    if (rank < 1 || rank > 4 || n != T(g, x)->numel) BAD("reshape: %zu elements into %zu", T(g, x)->numel, n);
    int y = act(g, rank, dims, rg(g, x));
    struct op *o = op_new(g, OP_RESHAPE);
    if (!o || y < 0) return -1;
    o->n_in = 1; o->in[0] = x;
    o->n_out = 1; o->out[0] = y;
    return y;
}

/* ---- autodiff ---- */

/* The gradient tensor of x, created on first use. Parameter gradients are persistent and
 * always accumulate; an activation's first writer (in backward order) writes, later ones add. */
static int grad_of(struct graph *g, int x, int *accum)
{
    if (x < 0 || !g->tensors[x]->requires_grad) return -1;
    struct tensor *t = g->tensors[x];
    if (t->grad >= 0) {
        *accum = 1;
        return t->grad;
    }
    int kind = t->kind == TENSOR_PARAM ? TENSOR_GRAD : TENSOR_ACT;
    char *name = NULL;
    if (t->name) {
        size_t len = strlen(t->name) + 6;
        name = malloc(len);
        if (!name) return graph_fail(g, GRAPH_ERR_NOMEM, "out of memory");
        snprintf(name, len, "grad.%s", t->name);
    }
    int gid = graph_tensor(g, kind, name, t->rank, t->d);
    free(name);
    if (gid < 0) return -1;
    t->grad = gid;
    *accum = t->kind == TENSOR_PARAM;
    return gid;
}

static struct op *bwd_op(struct graph *g, enum op_type type, int fwd)
{
    struct op *o = op_new(g, type);
    if (o) o->fwd = fwd;
    return o;
}

/* sets out[i] of o to the gradient of forward tensor x (or -1) */
static void bwd_out(struct graph *g, struct op *o, int i, int x)
{
    int acc = 0;
    o->out[i] = grad_of(g, x, &acc);
    o->accum[i] = acc;
    if (o->n_out < i + 1) o->n_out = i + 1;
}

int graph_backward(struct graph *g, int loss)
{
    if (g->status) return g->status;
    g->n_fwd_ops = g->n_ops;
    int mse = -1;
    for (int i = 0; i < g->n_ops; i++)
        if ((g->ops[i].type == OP_MSE || g->ops[i].type == OP_XENT) && g->ops[i].out[0] == loss)
            mse = i;
    if (mse < 0)
        return graph_fail(g, GRAPH_ERR_SHAPE, "backward: loss is not an mse or xent output"),
               g->status;
    for (int i = g->n_fwd_ops - 1; i >= 0 && !g->status; i--) {
        struct op f = g->ops[i]; /* copy: op_new may move the array */
        if (f.type == OP_MSE) {
            if (i != mse || !rg(g, f.in[0])) continue;
            struct op *o = bwd_op(g, OP_MSE_BWD, i);
            if (!o) break;
            o->n_in = 2; o->in[0] = f.in[0]; o->in[1] = f.in[1];
            bwd_out(g, o, 0, f.in[0]);
            continue;
        }
        if (f.type == OP_XENT) {
            if (i != mse || !rg(g, f.in[0])) continue;
            struct op *o = bwd_op(g, OP_XENT_BWD, i);
            if (!o) break;
            o->n_in = 2; o->in[0] = f.out[1]; o->in[1] = f.in[1];
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            continue;
        }
        int dy = g->tensors[f.out[0]]->grad;
        if (dy < 0) continue; /* output does not reach the loss */
        int any_in = 0;
        for (int j = 0; j < f.n_in; j++) any_in |= rg(g, f.in[j]);
        if (!any_in) continue;
        struct op *o;
        switch (f.type) {
        case OP_CONV2D:
            if (rg(g, f.in[0])) {
                o = bwd_op(g, OP_CONV2D_BWD_DATA, i);
                if (!o) break;
                o->n_in = 2; o->in[0] = dy; o->in[1] = f.in[1];
                o->a.conv = f.a.conv;
                bwd_out(g, o, 0, f.in[0]);
            }
            o = bwd_op(g, OP_CONV2D_BWD_FILTER, i);
            if (!o) break;
            o->n_in = 2; o->in[0] = dy; o->in[1] = f.in[0];
            o->a.conv = f.a.conv;
            bwd_out(g, o, 0, f.in[1]);
            bwd_out(g, o, 1, f.in[2]);
            break;
        case OP_LINEAR:
            o = bwd_op(g, OP_LINEAR_BWD, i);
            if (!o) break;
            o->n_in = 3; o->in[0] = dy; o->in[1] = f.in[0]; o->in[2] = f.in[1];
            o->a.lin = f.a.lin;
            bwd_out(g, o, 0, f.in[0]);
            bwd_out(g, o, 1, f.in[1]);
            bwd_out(g, o, 2, f.in[2]);
            break;
        case OP_GROUPNORM:
        case OP_LAYERNORM:
            o = bwd_op(g, f.type == OP_GROUPNORM ? OP_GROUPNORM_BWD : OP_LAYERNORM_BWD, i);
            if (!o) break;
            o->n_in = 5; o->in[0] = dy; o->in[1] = f.in[0]; o->in[2] = f.in[1];
            o->in[3] = f.out[1]; o->in[4] = f.out[2];
            if (f.type == OP_GROUPNORM && f.a.gn.silu) {
                o->n_in = 6;
                o->in[5] = f.in[2]; /* beta: the backward recomputes silu's input */
            }
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            bwd_out(g, o, 1, f.in[1]);
            bwd_out(g, o, 2, f.in[2]);
            break;
        case OP_SILU:
        case OP_GELU:
        case OP_MAXPOOL:
            o = bwd_op(g, f.type == OP_SILU ? OP_SILU_BWD : f.type == OP_GELU ? OP_GELU_BWD
                                                                              : OP_MAXPOOL_BWD, i);
            if (!o) break;
            o->n_in = 2; o->in[0] = dy; o->in[1] = f.in[0];
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            break;
        case OP_ADD:
        case OP_ADD_BCAST:
        case OP_CONCAT:
            o = bwd_op(g, f.type == OP_ADD ? OP_ADD_BWD : f.type == OP_ADD_BCAST ? OP_ADD_BCAST_BWD
                                                                                : OP_CONCAT_BWD, i);
            if (!o) break;
            o->n_in = 1; o->in[0] = dy;
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            bwd_out(g, o, 1, f.in[1]);
            break;
        case OP_TO_TOKENS:
        case OP_TO_IMAGE:
            /* the inverse layout change, accumulating */
            o = bwd_op(g, f.type == OP_TO_TOKENS ? OP_TO_IMAGE : OP_TO_TOKENS, i);
            if (!o) break;
            o->n_in = 1; o->in[0] = dy;
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            break;
        case OP_UPSAMPLE_NEAREST:
        case OP_UPSAMPLE_BILINEAR:
            o = bwd_op(g, f.type == OP_UPSAMPLE_NEAREST ? OP_UPSAMPLE_NEAREST_BWD
                                                         : OP_UPSAMPLE_BILINEAR_BWD, i);
            if (!o) break;
            o->n_in = 1; o->in[0] = dy;
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            break;
        case OP_RESHAPE:
            o = bwd_op(g, OP_RESHAPE_BWD, i);
            if (!o) break;
            o->n_in = 1; o->in[0] = dy;
            bwd_out(g, o, 0, f.in[0]);
            break;
        case OP_DROPOUT:
            o = bwd_op(g, OP_DROPOUT_BWD, i);
            if (!o) break;
            o->n_in = 1; o->in[0] = dy;
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            break;
        case OP_ATTENTION:
            o = bwd_op(g, OP_ATTENTION_BWD, i);
            if (!o) break;
            o->n_in = 6; o->in[0] = dy; o->in[1] = f.in[0]; o->in[2] = f.in[1];
            o->in[3] = f.in[2]; o->in[4] = f.out[0]; o->in[5] = f.out[1];
            o->a = f.a;
            bwd_out(g, o, 0, f.in[0]);
            if (!f.a.at.packed) {
                bwd_out(g, o, 1, f.in[1]);
                bwd_out(g, o, 2, f.in[2]);
            }
            /* the attention kernels write dq, dk, dv (=): an earlier contribution to the same
             * gradient would be lost, so accumulation is not supported here */
            for (int j = 0; j < o->n_out; j++)
                if (o->out[j] >= 0 && o->accum[j])
                    return graph_fail(g, GRAPH_ERR_SHAPE, "attention input with other uses"),
                           g->status;
            break;
        case OP_TIMESTEP_EMBED:
            break; /* t is data */
        default:
            return graph_fail(g, GRAPH_ERR_SHAPE, "no backward for %s", op_name(f.type)),
                   g->status;
        }
    }
    return g->status;
}

/* ---- precision policy ---- */

enum tensor_dtype graph_low_dtype(const struct graph *g)
{
    return g->precision == STRATEGY_PRECISION_BF16 ? DTYPE_BF16
           : g->precision == STRATEGY_PRECISION_F16 ? DTYPE_F16
                                                     : DTYPE_F32;
}

/* the weight operand of a GEMM-like op (convolution, linear), forward and backward */
static int weight_slot(enum op_type t, int slot)
{
    switch (t) {
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_LINEAR:
        return slot == 1;
    case OP_LINEAR_BWD:
        return slot == 2;
    default:
        return 0;
    }
}

enum tensor_dtype graph_input_dtype(const struct graph *g, const struct op *o, int slot)
{
    int t = o->in[slot];
    if (t < 0) return DTYPE_F32;
    if (g->tensors[t]->kind == TENSOR_PARAM && weight_slot(o->type, slot)) return graph_low_dtype(g);
    return g->tensors[t]->dtype;
}

/* the memory-bound ops of backend.h's typed element-wise, layout, resampling and dropout
 * kernels, every operand of which has the kernel's dtype */
static int graph_eltwise_op(enum op_type t)
{
    switch (t) {
    case OP_SILU:
    case OP_SILU_BWD:
    case OP_GELU:
    case OP_GELU_BWD:
    case OP_ADD:
    case OP_ADD_BWD:
    case OP_ADD_BCAST:
    case OP_ADD_BCAST_BWD:
    case OP_CONCAT:
    case OP_CONCAT_BWD:
    case OP_TO_TOKENS:
    case OP_TO_IMAGE:
    case OP_UPSAMPLE_NEAREST:
    case OP_UPSAMPLE_NEAREST_BWD:
    case OP_UPSAMPLE_BILINEAR:
    case OP_UPSAMPLE_BILINEAR_BWD:
    case OP_MAXPOOL:
    case OP_MAXPOOL_BWD:
    case OP_DROPOUT:
    case OP_DROPOUT_BWD:
    case OP_RESHAPE:
    case OP_RESHAPE_BWD:
        return 1;
    default:
        return 0;
    }
}

unsigned graph_half_kernel(const struct op *o)
{
    switch (o->type) {
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER:
        return BK_HALF_CONV;
    case OP_LINEAR:
    case OP_LINEAR_BWD:
        return BK_HALF_LINEAR;
    case OP_ATTENTION:
    case OP_ATTENTION_BWD:
        return o->a.at.tiled ? BK_HALF_ATTN : BK_HALF_ATTN_PLAIN;
    case OP_GROUPNORM:
    case OP_GROUPNORM_BWD:
    case OP_LAYERNORM:
    case OP_LAYERNORM_BWD:
        return BK_HALF_NORM;
    default:
        return graph_eltwise_op(o->type) ? BK_HALF_ELTWISE : 0;
    }
}

int graph_typed_operand(const struct op *o, int j)
{
    int out = j - o->n_in; /* >= 0: out[out] */
    switch (o->type) {
    case OP_CONV2D:            /* x, w -> y (bias fp32) */
    case OP_CONV2D_BWD_DATA:   /* dy, w -> dx */
    case OP_LINEAR:            /* x, w -> y (bias fp32) */
        return j == 0 || j == 1 || out == 0;
    case OP_CONV2D_BWD_FILTER: /* dy, x -> dw, db (fp32) */
        return j == 0 || j == 1;
    case OP_LINEAR_BWD:        /* dy, x, w -> dx, dw, db (fp32) */
        return (j >= 0 && j <= 2) || out == 0;
    case OP_ATTENTION:         /* q, k, v -> o, lse (or p: fp32) */
        return (j >= 0 && j <= 2) || out == 0;
    case OP_ATTENTION_BWD:     /* dout, q, k, v, o, lse (or p: fp32) -> dq, dk, dv */
        return (j >= 0 && j <= 4) || out >= 0;
    case OP_GROUPNORM:         /* x -> y (gamma, beta, mean, rstd fp32) */
    case OP_LAYERNORM:
        return j == 0 || out == 0;
    case OP_GROUPNORM_BWD:     /* dy, x -> dx (gamma, mean, rstd, beta, dgamma, dbeta fp32) */
    case OP_LAYERNORM_BWD:
        return j == 0 || j == 1 || out == 0;
    default:
        return graph_eltwise_op(o->type);
    }
}

int graph_set_precision(struct graph *g, int precision)
{
    if (g->status) return g->status;
    if (precision != STRATEGY_PRECISION_F32 && precision != STRATEGY_PRECISION_BF16 &&
        precision != STRATEGY_PRECISION_F16)
        return graph_fail(g, GRAPH_ERR_ARG, "precision %d is not f32, bf16 or f16", precision),
               g->status;
    for (int i = 0; i < g->n_tensors; i++) g->tensors[i]->dtype = DTYPE_F32;
    g->precision = precision;
    enum tensor_dtype lo = graph_low_dtype(g);
    if (lo == DTYPE_F32) return GRAPH_OK;
    int n_fwd = g->n_fwd_ops ? g->n_fwd_ops : g->n_ops;
    for (int k = 0; k < n_fwd; k++) {
        const struct op *o = &g->ops[k];
        if (o->type == OP_MSE || o->type == OP_XENT) continue; /* the loss */
        int t = o->out[0];
        if (t >= 0 && g->tensors[t]->kind == TENSOR_ACT) g->tensors[t]->dtype = lo;
    }
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind == TENSOR_ACT && t->dtype == lo && t->grad >= 0 &&
            g->tensors[t->grad]->kind == TENSOR_ACT)
            g->tensors[t->grad]->dtype = lo;
    }
    return GRAPH_OK;
}
