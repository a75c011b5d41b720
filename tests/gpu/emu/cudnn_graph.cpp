/* cudnn_graph.cpp - the emulator's cuDNN graph API (cudnn_graph.h): backend descriptors as bags
 * of attributes, finalized into tensors, operations (pointwise, matmul, reduction), operation
 * graphs, heuristics, engines, engine configurations, execution plans and variant packs; and
 * cudnnBackendExecute as a generic evaluator of the graph's operations in topological order:
 * fp32 arithmetic (matmul sums in k order, reductions in element order), broadcasting of
 * dimensions of size 1, every tensor read and written through its dimensions and strides, each
 * store rounded once to its tensor's type (to nearest even for half and bfloat16, virtual
 * tensors included, as cuDNN's fused kernels convert P to 16 bits for P V). Descriptors given
 * as attributes are copied when set, as cuDNN does (the frontend destroys its tensors early).
 *
 * The one emulated engine takes any graph of the operations above, except that a graph with a
 * matmul - an attention, for the backend - is refused where cuDNN has no engine for it: below
 * sm_80, with fp32 matmul operands, or with a head dimension (the unit-stride dimension of a
 * matmul's device tensor) over 128 or not a multiple of 8. The refusal comes from heuristics
 * (no results) and from finalizing an engine or plan for the graph (NOT_SUPPORTED), counted in
 * ddpmd_emu_lib_calls_ext lib 6; executions of graphs with a matmul count in lib 5. The engine
 * claims a workspace (scribbled over on each run) so a caller that keeps data there fails.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"
#include "cudnn.h"
#include "emu_ext.h"
#include "emu_internal.h"

#define DESC_MAGIC 0x45443944u
#define GRAPH_WS_BASE 1024 /* the engine's workspace: this + 4 bytes per device element */

namespace {

/* a tensor, by value */
struct tens {
    int64_t uid = 0;
    int dt = -1; /* cudnnDataType_t */
    int nd = 0;
    int64_t dim[CUDNN_DIM_MAX] = {0}, str[CUDNN_DIM_MAX] = {0};
    bool virt = false, by_value = false;
    int64_t numel() const
    {
        int64_t n = 1;
        for (int i = 0; i < nd; i++) n *= dim[i];
        return n;
    }
    int64_t extent() const /* elements from the first to the last one addressed, plus one */
    {
        int64_t e = 1;
        for (int i = 0; i < nd; i++) e += (dim[i] - 1) * str[i];
        return e;
    }
};

enum { K_PW, K_MATMUL, K_RED, K_RESHAPE };
struct op {
    int kind = K_PW;
    int mode = 0;     /* pointwise mode or reduction operator */
    int64_t axis = 0; /* GEN_INDEX */
    int nin = 0;
    tens in[3], out; /* pointwise x, b, t; matmul a, b; reduction x */
};

struct graph {
    std::vector<op> ops; /* in an order that runs (topological) */
    std::map<int64_t, tens> tensors;
    cudnnHandle_t handle = nullptr;
    bool ok = false, has_matmul = false;
    std::string why; /* why the engine refuses it */
    int64_t ws = 0;
    int et = 0; /* the element type the call counts under */
};

struct attr {
    int type = 0;
    std::vector<unsigned char> data;
    int64_t count = 0;
};

struct desc {
    uint32_t magic = DESC_MAGIC;
    cudnnBackendDescriptorType_t type;
    bool final = false;
    std::map<int, attr> attrs;
    std::map<int, std::vector<std::shared_ptr<desc>>> subs; /* descriptor attributes, copied */
    /* finalized */
    tens t;
    int mode = 0;
    int64_t axis = 0;
    op o;
    std::shared_ptr<graph> g;
    int64_t index = 0;
    int nresults = 0;
    cudnnHandle_t handle = nullptr;
    std::vector<int64_t> uids;
    std::vector<void *> ptrs;
    void *ws = nullptr;
};

thread_local char tl_err[256];

cudnnStatus_t fail(cudnnStatus_t s, const char *fmt, const char *a = "", long long b = 0)
{
    snprintf(tl_err, sizeof tl_err, fmt, a, b);
    if (getenv("EMU_CUDNN_VERBOSE")) fprintf(stderr, "emu cudnn graph: %s\n", tl_err);
    return s;
}

size_t type_size(int type)
{
    switch (type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return 8;
    case CUDNN_TYPE_BOOLEAN:
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_FRACTION: return 16;
    default: return 4; /* enums, FLOAT, INT32 */
    }
}

desc *as_desc(void *p)
{
    desc *d = (desc *)p;
    return d && d->magic == DESC_MAGIC ? d : nullptr;
}

/* an attribute's elements, or NULL: n elements of type at most */
const void *get(const desc *d, int name, int type, int64_t *n = nullptr)
{
    auto it = d->attrs.find(name);
    if (it == d->attrs.end() || it->second.type != type) return nullptr;
    if (n) *n = it->second.count;
    return it->second.data.data();
}
template <typename T> bool get1(const desc *d, int name, int type, T *out)
{
    const void *p = get(d, name, type);
    if (!p) return false;
    memcpy(out, p, sizeof(T));
    return true;
}
const desc *sub(const desc *d, int name, int i = 0)
{
    auto it = d->subs.find(name);
    return it == d->subs.end() || (int)it->second.size() <= i ? nullptr : it->second[i].get();
}

/* ---- elements ---- */

size_t dt_size(int dt)
{
    switch (dt) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_DOUBLE:
    case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_BOOLEAN:
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_UINT8: return 1;
    default: return 0;
    }
}
bool dt_ok(int dt) { return dt_size(dt) != 0; }
int dt_et(int dt) { return dt == CUDNN_DATA_HALF ? 1 : dt == CUDNN_DATA_BFLOAT16 ? 2 : 0; }

/* v as a value of type dt holds it: the one rounding of a store */
float round_to(int dt, float v)
{
    switch (dt) {
    case CUDNN_DATA_HALF: return __half2float(__float2half(v));
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(__float2bfloat16(v));
    case CUDNN_DATA_INT32:
    case CUDNN_DATA_INT64:
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_UINT8: return (float)(long long)v;
    case CUDNN_DATA_BOOLEAN: return v != 0.0f ? 1.0f : 0.0f;
    default: return v;
    }
}
float load_dt(const void *p, int dt)
{
    switch (dt) {
    case CUDNN_DATA_FLOAT: return *(const float *)p;
    case CUDNN_DATA_HALF: return __half2float(*(const __half *)p);
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(*(const __nv_bfloat16 *)p);
    case CUDNN_DATA_DOUBLE: return (float)*(const double *)p;
    case CUDNN_DATA_INT32: return (float)*(const int32_t *)p;
    case CUDNN_DATA_INT64: return (float)*(const int64_t *)p;
    case CUDNN_DATA_INT8: return (float)*(const int8_t *)p;
    default: return (float)*(const uint8_t *)p; /* UINT8, BOOLEAN */
    }
}
void store_dt(void *p, int dt, float v)
{
    switch (dt) {
    case CUDNN_DATA_FLOAT: *(float *)p = v; break;
    case CUDNN_DATA_HALF: *(__half *)p = __float2half(v); break;
    case CUDNN_DATA_BFLOAT16: *(__nv_bfloat16 *)p = __float2bfloat16(v); break;
    case CUDNN_DATA_DOUBLE: *(double *)p = v; break;
    case CUDNN_DATA_INT32: *(int32_t *)p = (int32_t)v; break;
    case CUDNN_DATA_INT64: *(int64_t *)p = (int64_t)v; break;
    case CUDNN_DATA_INT8: *(int8_t *)p = (int8_t)v; break;
    default: *(uint8_t *)p = (uint8_t)(v != 0.0f); break;
    }
}

/* ---- finalizing ---- */

cudnnStatus_t fin_tensor(desc *d)
{
    tens &t = d->t;
    int64_t n = 0, ns = 0;
    const int64_t *dims = (const int64_t *)get(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, &n);
    const int64_t *strs = (const int64_t *)get(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, &ns);
    if (!dims || !strs || n != ns || n < 1 || n > CUDNN_DIM_MAX)
        return fail(CUDNN_STATUS_BAD_PARAM, "tensor: dimensions and strides%s (%lld)", "", n);
    if (!get1(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &t.uid))
        return fail(CUDNN_STATUS_BAD_PARAM, "tensor: no unique id%s");
    int dt = -1;
    if (!get1(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt) || !dt_ok(dt))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor %s: data type %lld", "", dt);
    t.dt = dt;
    t.nd = (int)n;
    for (int i = 0; i < t.nd; i++) {
        t.dim[i] = dims[i];
        t.str[i] = strs[i];
        if (dims[i] < 1 || strs[i] < 0)
            return fail(CUDNN_STATUS_BAD_PARAM, "tensor%s: dimension or stride %lld", "", i);
    }
    bool b = false;
    if (get1(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &b)) t.virt = b;
    b = false;
    if (get1(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &b)) t.by_value = b;
    int64_t vc = 1;
    if (get1(d, CUDNN_ATTR_TENSOR_VECTOR_COUNT, CUDNN_TYPE_INT64, &vc) && vc != 1)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor%s: vectorized (%lld)", "", vc);
    int reo = CUDNN_TENSOR_REORDERING_NONE;
    if (get1(d, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, &reo) &&
        reo != CUDNN_TENSOR_REORDERING_NONE)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor%s: reordering %lld", "", reo);
    if (sub(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor%s: ragged offsets");
    return CUDNN_STATUS_SUCCESS;
}

bool pw_mode_ok(int m)
{
    switch (m) {
    case CUDNN_POINTWISE_ADD:
    case CUDNN_POINTWISE_SUB:
    case CUDNN_POINTWISE_MUL:
    case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_MAX:
    case CUDNN_POINTWISE_MIN:
    case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_LOG:
    case CUDNN_POINTWISE_NEG:
    case CUDNN_POINTWISE_ABS:
    case CUDNN_POINTWISE_SQRT:
    case CUDNN_POINTWISE_RSQRT:
    case CUDNN_POINTWISE_RECIPROCAL:
    case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_CMP_EQ:
    case CUDNN_POINTWISE_CMP_NEQ:
    case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE:
    case CUDNN_POINTWISE_CMP_LT:
    case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND:
    case CUDNN_POINTWISE_LOGICAL_OR:
    case CUDNN_POINTWISE_LOGICAL_NOT:
    case CUDNN_POINTWISE_GEN_INDEX:
    case CUDNN_POINTWISE_BINARY_SELECT: return true;
    default: return false;
    }
}
int pw_arity(int m)
{
    switch (m) {
    case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_LOG:
    case CUDNN_POINTWISE_NEG:
    case CUDNN_POINTWISE_ABS:
    case CUDNN_POINTWISE_SQRT:
    case CUDNN_POINTWISE_RSQRT:
    case CUDNN_POINTWISE_RECIPROCAL:
    case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_LOGICAL_NOT:
    case CUDNN_POINTWISE_GEN_INDEX: return 1;
    case CUDNN_POINTWISE_BINARY_SELECT: return 3;
    default: return 2;
    }
}

/* a descriptor attribute's copy, finalized, of the type wanted */
const desc *need(const desc *d, int name, cudnnBackendDescriptorType_t type)
{
    const desc *s = sub(d, name);
    return s && s->final && s->type == type ? s : nullptr;
}

/* dims of b broadcast to those of a (each 1 or equal), ranks right-aligned */
bool broadcasts(const tens &from, const tens &to)
{
    if (from.nd > to.nd) return false;
    for (int i = 0; i < from.nd; i++) {
        const int64_t f = from.dim[from.nd - 1 - i], t = to.dim[to.nd - 1 - i];
        if (f != 1 && f != t) return false;
    }
    return true;
}

cudnnStatus_t fin_op(desc *d)
{
    op &o = d->o;
    const cudnnBackendDescriptorType_t T = CUDNN_BACKEND_TENSOR_DESCRIPTOR;
    if (d->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
        const desc *pw = need(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                              CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        const desc *x = need(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, T),
                   *b = need(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, T),
                   *t = need(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, T),
                   *y = need(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, T);
        if (!pw || !x || !y) return fail(CUDNN_STATUS_BAD_PARAM, "pointwise%s: descriptors");
        if (sub(d, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC))
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "pointwise%s: backward forms");
        for (int a : {CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2}) {
            float f = 1.0f;
            double g = 1.0;
            if ((get1(d, a, CUDNN_TYPE_FLOAT, &f) && f != 1.0f) ||
                (get1(d, a, CUDNN_TYPE_DOUBLE, &g) && g != 1.0))
                return fail(CUDNN_STATUS_NOT_SUPPORTED, "pointwise%s: alpha other than 1");
        }
        o.kind = K_PW;
        o.mode = pw->mode;
        o.axis = pw->axis;
        const int ar = pw_arity(o.mode);
        if ((ar >= 2 && !b) || (ar == 3 && !t) || (ar < 2 && b) || (ar < 3 && t))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise%s: mode %lld, operands", "", o.mode);
        o.nin = ar;
        o.in[0] = x->t;
        if (b) o.in[1] = b->t;
        if (t) o.in[2] = t->t;
        o.out = y->t;
        for (int i = 0; i < o.nin; i++)
            if (!broadcasts(o.in[i], o.out))
                return fail(CUDNN_STATUS_BAD_PARAM, "pointwise%s: operand %lld's dimensions", "",
                            i);
    } else if (d->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
        const desc *mm = need(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        const desc *a = need(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, T),
                   *b = need(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, T),
                   *c = need(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, T);
        if (!mm || !a || !b || !c) return fail(CUDNN_STATUS_BAD_PARAM, "matmul%s: descriptors");
        for (int n : {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
                      CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                      CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC})
            if (sub(d, n)) return fail(CUDNN_STATUS_NOT_SUPPORTED, "matmul%s: overrides");
        o.kind = K_MATMUL;
        o.nin = 2;
        o.in[0] = a->t;
        o.in[1] = b->t;
        o.out = c->t;
        const int nd = o.out.nd;
        if (nd < 2 || a->t.nd != nd || b->t.nd != nd || a->t.dim[nd - 2] != c->t.dim[nd - 2] ||
            b->t.dim[nd - 1] != c->t.dim[nd - 1] || a->t.dim[nd - 1] != b->t.dim[nd - 2])
            return fail(CUDNN_STATUS_BAD_PARAM, "matmul%s: shapes (rank %lld)", "", nd);
        for (int i = 0; i < nd - 2; i++)
            if ((a->t.dim[i] != 1 && a->t.dim[i] != c->t.dim[i]) ||
                (b->t.dim[i] != 1 && b->t.dim[i] != c->t.dim[i]))
                return fail(CUDNN_STATUS_BAD_PARAM, "matmul%s: batch dimension %lld", "", i);
    } else if (d->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR) {
        /* y views x's storage with its own dimensions and strides (the frontend's transposes) */
        const desc *x = need(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, T),
                   *y = need(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, T);
        if (!x || !y) return fail(CUDNN_STATUS_BAD_PARAM, "reshape%s: descriptors");
        if (x->t.numel() != y->t.numel() || x->t.extent() != y->t.extent())
            return fail(CUDNN_STATUS_BAD_PARAM, "reshape%s: %lld elements differ", "",
                        x->t.numel());
        o.kind = K_RESHAPE;
        o.nin = 1;
        o.in[0] = x->t;
        o.out = y->t;
    } else if (d->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
        const desc *rd = need(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                              CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        const desc *x = need(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, T),
                   *y = need(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, T);
        if (!rd || !x || !y) return fail(CUDNN_STATUS_BAD_PARAM, "reduction%s: descriptors");
        o.kind = K_RED;
        o.mode = rd->mode;
        o.nin = 1;
        o.in[0] = x->t;
        o.out = y->t;
        if (x->t.nd != y->t.nd) return fail(CUDNN_STATUS_BAD_PARAM, "reduction%s: ranks");
        for (int i = 0; i < x->t.nd; i++)
            if (y->t.dim[i] != 1 && y->t.dim[i] != x->t.dim[i])
                return fail(CUDNN_STATUS_BAD_PARAM, "reduction%s: dimension %lld", "", i);
    } else {
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "operation%s of descriptor type %lld", "",
                    d->type);
    }
    return CUDNN_STATUS_SUCCESS;
}

/* whether the emulated engine runs g (else g->why): see the top of this file */
void graph_support(graph *g)
{
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    (void)cudaGetDeviceProperties(&prop, 0);
    const int cc = prop.major * 10 + prop.minor;
    g->ok = true;
    for (const op &o : g->ops) /* counted under its matmuls' input type */
        for (int i = 0; o.kind == K_MATMUL && i < 2; i++)
            if (!o.in[i].virt) g->et = dt_et(o.in[i].dt);
    for (const op &o : g->ops) {
        if (o.kind != K_MATMUL) continue;
        g->has_matmul = true;
        if (cc < 80) {
            g->ok = false;
            g->why = "fused attention needs sm_80 or later (sm_" + std::to_string(cc) + ")";
            return;
        }
        const tens *ts[3] = {&o.in[0], &o.in[1], &o.out};
        for (int i = 0; i < 3; i++) {
            const tens &t = *ts[i];
            if (t.virt) continue;
            if (i < 2 && t.dt != CUDNN_DATA_HALF && t.dt != CUDNN_DATA_BFLOAT16) {
                g->ok = false;
                g->why = "fused attention takes 16-bit operands (tensor " +
                         std::to_string(t.uid) + ")";
                return;
            }
            for (int k = 0; k < t.nd; k++)
                if (t.str[k] == 1 && t.dim[k] > 1 && (t.dim[k] % 8 || t.dim[k] > 128)) {
                    g->ok = false;
                    g->why = "fused attention: head dimension " + std::to_string(t.dim[k]) +
                             " (tensor " + std::to_string(t.uid) +
                             "), not a multiple of 8 up to 128";
                    return;
                }
        }
    }
}

cudnnStatus_t fin_graph(desc *d)
{
    auto g = std::make_shared<graph>();
    if (!get1(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &g->handle) || !g->handle)
        return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: no handle");
    bool dyn = false;
    if (get1(d, CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED, CUDNN_TYPE_BOOLEAN, &dyn) &&
        dyn)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "operation graph%s: dynamic shapes");
    auto it = d->subs.find(CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (it == d->subs.end() || it->second.empty())
        return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: no operations");
    std::vector<op> todo;
    for (auto &s : it->second) {
        if (!s->final) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: an operation");
        todo.push_back(s->o);
    }
    /* the tensors (one description per uid) and who writes each */
    std::map<int64_t, int> writer;
    for (size_t i = 0; i < todo.size(); i++) {
        op &o = todo[i];
        for (int k = 0; k <= o.nin; k++) {
            const tens &t = k < o.nin ? o.in[k] : o.out;
            auto f = g->tensors.find(t.uid);
            if (f != g->tensors.end() &&
                (f->second.nd != t.nd || f->second.dt != t.dt || f->second.virt != t.virt ||
                 memcmp(f->second.dim, t.dim, sizeof t.dim) ||
                 (!t.virt && memcmp(f->second.str, t.str, sizeof t.str))))
                return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: tensor %lld described "
                            "twice, differently", "", t.uid);
            g->tensors[t.uid] = t;
        }
        if (writer.count(o.out.uid) || o.out.by_value)
            return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: tensor %lld written twice",
                        "", o.out.uid);
        writer[o.out.uid] = (int)i;
    }
    for (auto &kv : g->tensors)
        if (kv.second.virt && !writer.count(kv.first))
            return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: virtual tensor %lld never "
                        "written", "", kv.first);
    /* topological order */
    std::vector<bool> done(todo.size(), false);
    std::map<int64_t, bool> ready;
    for (auto &kv : g->tensors) ready[kv.first] = !writer.count(kv.first);
    for (size_t round = 0; round < todo.size(); round++) {
        bool moved = false;
        for (size_t i = 0; i < todo.size(); i++) {
            if (done[i]) continue;
            bool go = true;
            for (int k = 0; k < todo[i].nin; k++) go = go && ready[todo[i].in[k].uid];
            if (!go) continue;
            g->ops.push_back(todo[i]);
            ready[todo[i].out.uid] = true;
            done[i] = moved = true;
        }
        if (!moved) break;
    }
    if (g->ops.size() != todo.size())
        return fail(CUDNN_STATUS_BAD_PARAM, "operation graph%s: a cycle");
    int64_t most = 0;
    for (auto &kv : g->tensors)
        if (!kv.second.virt) most = std::max(most, kv.second.numel());
    g->ws = GRAPH_WS_BASE + 4 * most;
    graph_support(g.get());
    d->g = g;
    return CUDNN_STATUS_SUCCESS;
}

/* an engine configuration's content: the graph's one engine */
void fill_cfg(desc *c, const std::shared_ptr<graph> &g)
{
    c->type = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
    c->g = g;
    c->index = 0;
    c->final = true;
}

void count_refused(const graph *g)
{
    emu_ext_count(EMU_LIB_DNN_REFUSED, g->et);
    snprintf(tl_err, sizeof tl_err, "no engine: %s", g->why.c_str());
    if (getenv("EMU_CUDNN_VERBOSE")) fprintf(stderr, "emu cudnn graph: %s\n", tl_err);
}

cudnnStatus_t finalize(desc *d)
{
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return fin_tensor(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
        int mode = -1;
        if (!get1(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise%s: no mode");
        if (!pw_mode_ok(mode))
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "pointwise%s: mode %lld", "", mode);
        d->mode = mode;
        int64_t axis = 0;
        if (get1(d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis)) d->axis = axis;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: {
        int ct = -1;
        if (!get1(d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &ct))
            return fail(CUDNN_STATUS_BAD_PARAM, "matmul%s: no compute type");
        if (ct != CUDNN_DATA_FLOAT)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "matmul%s: compute type %lld", "", ct);
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
        int m = -1;
        if (!get1(d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &m))
            return fail(CUDNN_STATUS_BAD_PARAM, "reduction%s: no operator");
        if (m != CUDNN_REDUCE_TENSOR_ADD && m != CUDNN_REDUCE_TENSOR_MAX &&
            m != CUDNN_REDUCE_TENSOR_MIN && m != CUDNN_REDUCE_TENSOR_MUL &&
            m != CUDNN_REDUCE_TENSOR_AMAX && m != CUDNN_REDUCE_TENSOR_AVG &&
            m != CUDNN_REDUCE_TENSOR_NORM1 && m != CUDNN_REDUCE_TENSOR_NORM2)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "reduction%s: operator %lld", "", m);
        d->mode = m;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return fin_op(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return fin_graph(d);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        const desc *og = need(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        int mode = -1;
        if (!og || !get1(d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode))
            return fail(CUDNN_STATUS_BAD_PARAM, "heuristics%s: graph and mode");
        d->g = og->g;
        d->nresults = og->g->ok ? 1 : 0;
        if (!og->g->ok) count_refused(og->g.get());
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
        const desc *og = need(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        int64_t index = -1;
        if (!og || !get1(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &index))
            return fail(CUDNN_STATUS_BAD_PARAM, "engine%s: graph and index");
        if (index != 0) return fail(CUDNN_STATUS_BAD_PARAM, "engine%s: index %lld", "", index);
        if (!og->g->ok) {
            count_refused(og->g.get());
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
        d->g = og->g;
        d->index = index;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: {
        const desc *e = need(d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        if (!e) return fail(CUDNN_STATUS_BAD_PARAM, "engine config%s: no engine");
        auto k = d->subs.find(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES);
        if (k != d->subs.end() && !k->second.empty())
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "engine config%s: the engine has no knobs");
        fill_cfg(d, e->g);
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        const desc *c = need(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                             CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (!c || !get1(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &d->handle) ||
            !d->handle)
            return fail(CUDNN_STATUS_BAD_PARAM, "execution plan%s: configuration and handle");
        if (!c->g->ok) {
            count_refused(c->g.get());
            return CUDNN_STATUS_NOT_SUPPORTED;
        }
        d->g = c->g;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        int64_t nu = 0, np = 0;
        const int64_t *u = (const int64_t *)get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                CUDNN_TYPE_INT64, &nu);
        void *const *p = (void *const *)get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                            CUDNN_TYPE_VOID_PTR, &np);
        if (nu != np) return fail(CUDNN_STATUS_BAD_PARAM, "variant pack%s: %lld ids", "", nu);
        d->uids.assign(u, u + nu);
        d->ptrs.assign(p, p + np);
        d->ws = nullptr;
        get1(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &d->ws);
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return CUDNN_STATUS_SUCCESS;
    default:
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "descriptor type %s%lld", "", d->type);
    }
}

/* ---- running a graph ---- */

struct slot {
    const tens *t = nullptr;
    char *dev = nullptr;  /* device tensors */
    std::vector<float> v; /* virtual ones, dense by their dimensions */
    float scalar = 0.0f;  /* by value */
};

int64_t offset_of(const tens &t, const int64_t *idx, int nd_out)
{
    /* idx has nd_out dimensions; t's are its last t.nd, broadcast where t's are 1 */
    int64_t off = 0, dense = 0;
    for (int i = 0; i < t.nd; i++) {
        const int64_t x = t.dim[i] == 1 ? 0 : idx[nd_out - t.nd + i];
        off += x * t.str[i];
        dense = dense * t.dim[i] + x;
    }
    return t.virt ? dense : off;
}

float rd(const slot &s, const int64_t *idx, int nd)
{
    if (s.t->by_value) return s.scalar;
    const int64_t o = offset_of(*s.t, idx, nd);
    if (s.t->virt) return s.v[o];
    return load_dt(s.dev + o * dt_size(s.t->dt), s.t->dt);
}
void wr(slot &s, const int64_t *idx, float v)
{
    const int64_t o = offset_of(*s.t, idx, s.t->nd);
    if (s.t->virt)
        s.v[o] = round_to(s.t->dt, v);
    else
        store_dt(s.dev + o * dt_size(s.t->dt), s.t->dt, v);
}

/* the next multi-index of dims (nd), false after the last */
bool next(int64_t *idx, const int64_t *dim, int nd)
{
    for (int i = nd - 1; i >= 0; i--) {
        if (++idx[i] < dim[i]) return true;
        idx[i] = 0;
    }
    return false;
}

float pw(int m, float x, float b, float t, int64_t index)
{
    switch (m) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_MAX: return fmaxf(x, b);
    case CUDNN_POINTWISE_MIN: return fminf(x, b);
    case CUDNN_POINTWISE_EXP: return expf(x);
    case CUDNN_POINTWISE_LOG: return logf(x);
    case CUDNN_POINTWISE_NEG: return -x;
    case CUDNN_POINTWISE_ABS: return fabsf(x);
    case CUDNN_POINTWISE_SQRT: return sqrtf(x);
    case CUDNN_POINTWISE_RSQRT: return 1.0f / sqrtf(x);
    case CUDNN_POINTWISE_RECIPROCAL: return 1.0f / x;
    case CUDNN_POINTWISE_IDENTITY: return x;
    case CUDNN_POINTWISE_CMP_EQ: return x == b;
    case CUDNN_POINTWISE_CMP_NEQ: return x != b;
    case CUDNN_POINTWISE_CMP_GT: return x > b;
    case CUDNN_POINTWISE_CMP_GE: return x >= b;
    case CUDNN_POINTWISE_CMP_LT: return x < b;
    case CUDNN_POINTWISE_CMP_LE: return x <= b;
    case CUDNN_POINTWISE_LOGICAL_AND: return x != 0.0f && b != 0.0f;
    case CUDNN_POINTWISE_LOGICAL_OR: return x != 0.0f || b != 0.0f;
    case CUDNN_POINTWISE_LOGICAL_NOT: return x == 0.0f;
    case CUDNN_POINTWISE_GEN_INDEX: return (float)index;
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0.0f ? x : b;
    default: return NAN;
    }
}

void run_op(const op &o, std::map<int64_t, slot> &s)
{
    slot &y = s[o.out.uid];
    const int nd = o.out.nd;
    int64_t idx[CUDNN_DIM_MAX] = {0};
    if (o.kind == K_PW) {
        const slot *in[3] = {&s[o.in[0].uid], o.nin > 1 ? &s[o.in[1].uid] : nullptr,
                             o.nin > 2 ? &s[o.in[2].uid] : nullptr};
        do {
            const float x = rd(*in[0], idx, nd), b = in[1] ? rd(*in[1], idx, nd) : 0.0f,
                        t = in[2] ? rd(*in[2], idx, nd) : 0.0f;
            wr(y, idx, pw(o.mode, x, b, t, o.axis >= 0 && o.axis < nd ? idx[o.axis] : 0));
        } while (next(idx, o.out.dim, nd));
    } else if (o.kind == K_MATMUL) {
        const slot &a = s[o.in[0].uid], &b = s[o.in[1].uid];
        const int64_t K = o.in[0].dim[nd - 1];
        int64_t ia[CUDNN_DIM_MAX], ib[CUDNN_DIM_MAX];
        do {
            memcpy(ia, idx, sizeof idx);
            memcpy(ib, idx, sizeof idx);
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                ia[nd - 1] = k;
                ib[nd - 2] = k;
                sum += rd(a, ia, nd) * rd(b, ib, nd);
            }
            wr(y, idx, sum);
        } while (next(idx, o.out.dim, nd));
    } else if (o.kind == K_RESHAPE) {
        /* x's values by their place in storage (its declared strides, virtual or not), read
         * back at y's places */
        const slot &x = s[o.in[0].uid];
        std::vector<float> at((size_t)o.in[0].extent(), NAN);
        const int nx = o.in[0].nd;
        do {
            int64_t off = 0;
            for (int i = 0; i < nx; i++) off += idx[i] * o.in[0].str[i];
            at[(size_t)off] = rd(x, idx, nx);
        } while (next(idx, o.in[0].dim, nx));
        memset(idx, 0, sizeof idx);
        do {
            int64_t off = 0;
            for (int i = 0; i < nd; i++) off += idx[i] * o.out.str[i];
            wr(y, idx, off < (int64_t)at.size() ? at[(size_t)off] : NAN);
        } while (next(idx, o.out.dim, nd));
    } else {
        const slot &x = s[o.in[0].uid];
        const int64_t n = y.t->numel();
        std::vector<float> acc((size_t)n, 0.0f);
        std::vector<int64_t> cnt((size_t)n, 0);
        const int m = o.mode;
        if (m == CUDNN_REDUCE_TENSOR_MAX) std::fill(acc.begin(), acc.end(), -INFINITY);
        if (m == CUDNN_REDUCE_TENSOR_MIN) std::fill(acc.begin(), acc.end(), INFINITY);
        if (m == CUDNN_REDUCE_TENSOR_MUL) std::fill(acc.begin(), acc.end(), 1.0f);
        do {
            int64_t j = 0;
            for (int i = 0; i < nd; i++) j = j * y.t->dim[i] + (y.t->dim[i] == 1 ? 0 : idx[i]);
            const float v = rd(x, idx, nd);
            float &a = acc[(size_t)j];
            cnt[(size_t)j]++;
            switch (m) {
            case CUDNN_REDUCE_TENSOR_ADD:
            case CUDNN_REDUCE_TENSOR_AVG: a += v; break;
            case CUDNN_REDUCE_TENSOR_MAX: a = fmaxf(a, v); break;
            case CUDNN_REDUCE_TENSOR_MIN: a = fminf(a, v); break;
            case CUDNN_REDUCE_TENSOR_MUL: a *= v; break;
            case CUDNN_REDUCE_TENSOR_AMAX: a = fmaxf(a, fabsf(v)); break;
            case CUDNN_REDUCE_TENSOR_NORM1: a += fabsf(v); break;
            default: a += v * v; break; /* NORM2 */
            }
        } while (next(idx, o.in[0].dim, nd));
        memset(idx, 0, sizeof idx);
        int64_t j = 0;
        do {
            float v = acc[(size_t)j];
            if (m == CUDNN_REDUCE_TENSOR_AVG) v /= (float)cnt[(size_t)j];
            if (m == CUDNN_REDUCE_TENSOR_NORM2) v = sqrtf(v);
            wr(y, idx, v);
            j++;
        } while (next(idx, y.t->dim, nd));
    }
}

} /* namespace */

/* ---- the API ---- */

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (message && max_size) snprintf(message, max_size, "%s", tl_err);
    tl_err[0] = '\0';
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t *out)
{
    if (!out) return CUDNN_STATUS_BAD_PARAM;
    desc *d = new desc();
    d->type = type;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t p)
{
    desc *d = as_desc(p);
    if (!d) return CUDNN_STATUS_BAD_PARAM;
    d->magic = 0;
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t p)
{
    return as_desc(p) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t p,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void *elements)
{
    desc *d = as_desc(p);
    if (!d || count < 0 || (count && !elements)) return CUDNN_STATUS_BAD_PARAM;
    if (d->final) return fail(CUDNN_STATUS_BAD_PARAM, "set%s: the descriptor is finalized");
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        std::vector<std::shared_ptr<desc>> v;
        for (int64_t i = 0; i < count; i++) {
            const desc *s = as_desc(((void *const *)elements)[i]);
            if (!s || !s->final)
                return fail(CUDNN_STATUS_BAD_PARAM,
                            "set%s: descriptor attribute %lld not finalized", "", name);
            v.push_back(std::make_shared<desc>(*s));
        }
        d->subs[name] = v;
    }
    attr &a = d->attrs[name];
    a.type = type;
    a.count = count;
    a.data.assign((const unsigned char *)elements,
                  (const unsigned char *)elements + count * type_size(type));
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t p)
{
    desc *d = as_desc(p);
    if (!d) return CUDNN_STATUS_BAD_PARAM;
    if (d->final) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t s = finalize(d);
    if (s == CUDNN_STATUS_SUCCESS) d->final = true;
    return s;
}

namespace {
template <typename T>
cudnnStatus_t give(const T *v, int64_t n, int64_t want, int64_t *count, void *out)
{
    if (count) *count = out ? std::min(n, want) : n;
    if (out) memcpy(out, v, sizeof(T) * (size_t)std::min(n, want));
    return CUDNN_STATUS_SUCCESS;
}
} /* namespace */

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const p,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t want,
                                       int64_t *count, void *out)
{
    desc *d = as_desc(p);
    if (!d || want < 0) return CUDNN_STATUS_BAD_PARAM;
    const int64_t one = 1, zero = 0;
    switch (name) {
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        if (!d->final || type != CUDNN_TYPE_INT64) break;
        return give(&one, 1, want, count, out);
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
        if (!d->final || type != CUDNN_TYPE_BACKEND_DESCRIPTOR) break;
        const int64_t n = std::min<int64_t>(d->nresults, want);
        for (int64_t i = 0; out && i < n; i++) {
            desc *c = as_desc(((void **)out)[i]);
            if (!c || c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
            fill_cfg(c, d->g);
        }
        if (count) *count = out ? n : d->nresults;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINECFG_ENGINE: {
        if (!d->final || type != CUDNN_TYPE_BACKEND_DESCRIPTOR) break;
        if (out && want >= 1) {
            desc *e = as_desc(((void **)out)[0]);
            if (!e || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
            e->g = d->g;
            e->index = d->index;
            e->final = true;
        }
        if (count) *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
    case CUDNN_ATTR_ENGINE_KNOB_INFO:
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE:
        if (!d->final) break;
        if (count) *count = 0; /* no knobs, no notes */
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
        if (!d->final || type != CUDNN_TYPE_INT64) break;
        return give(&d->index, 1, want, count, out);
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
        if (!d->final || type != CUDNN_TYPE_INT64 || !d->g) break;
        return give(&d->g->ws, 1, want, count, out);
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED:
        if (!d->final || type != CUDNN_TYPE_INT64) break;
        return give(&zero, 1, want, count, out);
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: {
        if (!d->final || type != CUDNN_TYPE_CHAR) break;
        static const char js[] = "{\"engine\": \"ddpmd emulator\", \"index\": 0}";
        return give(js, (int64_t)sizeof js, want, count, out);
    }
    default: {
        /* an attribute as it was set */
        auto it = d->attrs.find(name);
        if (it == d->attrs.end() || it->second.type != type ||
            type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
            break;
        const int64_t n = std::min(it->second.count, want);
        if (count) *count = out ? n : it->second.count;
        if (out) memcpy(out, it->second.data.data(), (size_t)n * type_size(type));
        return CUDNN_STATUS_SUCCESS;
    }
    }
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "get%s: attribute %lld (not emulated here)", "",
                name);
}

namespace {

/* one execution of g on stream st: ptr the device tensors' addresses (every non-virtual tensor
 * but the by-value ones has one: checked by the caller), scalar the by-value tensors' values,
 * ws the workspace */
cudnnStatus_t execute_on(cudaStream_t st, const graph *g, const std::map<int64_t, void *> &ptr,
                         const std::map<int64_t, float> &scalar, void *ws)
{
    std::map<int64_t, bool> written;
    for (const op &o : g->ops) written[o.out.uid] = true;
    std::map<int64_t, slot> s;
    for (auto &kv : g->tensors) {
        const tens &t = kv.second;
        slot &sl = s[kv.first];
        sl.t = &t;
        if (t.virt) {
            sl.v.assign((size_t)t.numel(), 0.0f);
            continue;
        }
        if (t.by_value) {
            sl.scalar = scalar.at(kv.first);
            continue;
        }
        void *p = ptr.at(kv.first);
        char what[96];
        snprintf(what, sizeof what, "cudnnBackendExecute tensor %lld", (long long)kv.first);
        if (emu_use(st, p, (size_t)t.extent() * dt_size(t.dt), written.count(kv.first), what) !=
            cudaSuccess)
            return CUDNN_STATUS_EXECUTION_FAILED;
        sl.dev = (char *)p;
    }
    if (g->ws) {
        if (emu_use(st, ws, (size_t)g->ws, 1, "cudnnBackendExecute workspace") != cudaSuccess)
            return CUDNN_STATUS_EXECUTION_FAILED;
        memset(ws, 0x5A, (size_t)g->ws); /* a workspace holds garbage after use */
    }
    for (const op &o : g->ops) run_op(o, s);
    emu_launch_done(st, nullptr, 0);
    if (g->has_matmul) emu_ext_count(EMU_LIB_DNN_GRAPH, g->et);
    return CUDNN_STATUS_SUCCESS;
}

} /* namespace */

/* The variant pack is read at the call: its pointers, the by-value scalars' values (host
 * pointers) and the workspace. On a capturing stream the execution is recorded with them (and
 * the plan's graph, kept alive), to run at each cudaGraphLaunch (graph.cpp), as cuDNN's kernels
 * captured with their arguments would. */
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack)
{
    desc *pl = as_desc(plan), *vp = as_desc(pack);
    if (!h || !pl || !vp || pl->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
        vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pl->final || !vp->final)
        return fail(CUDNN_STATUS_BAD_PARAM, "execute%s: a finalized plan and variant pack");
    std::shared_ptr<const graph> g = pl->g;
    cudaStream_t st = nullptr;
    if (cudnnGetStream(h, &st) != CUDNN_STATUS_SUCCESS) return CUDNN_STATUS_BAD_PARAM;
    std::map<int64_t, void *> given, ptr;
    std::map<int64_t, float> scalar;
    for (size_t i = 0; i < vp->uids.size(); i++) given[vp->uids[i]] = vp->ptrs[i];
    for (auto &kv : g->tensors) {
        const tens &t = kv.second;
        if (t.virt) continue;
        auto it = given.find(kv.first);
        if (it == given.end() || !it->second)
            return fail(CUDNN_STATUS_BAD_PARAM, "execute%s: no pointer for tensor %lld", "",
                        kv.first);
        if (t.by_value) /* a host pointer to the value */
            scalar[kv.first] = load_dt(it->second, t.dt);
        else
            ptr[kv.first] = it->second;
    }
    if (g->ws && !vp->ws) return fail(CUDNN_STATUS_BAD_PARAM, "execute%s: no workspace");
    void *ws = vp->ws;
    cudaError_t err = cudaSuccess;
    if (emu_capture_call(st, "cudnnBackendExecute",
                         [g, ptr, scalar, ws](cudaStream_t s) {
                             return execute_on(s, g.get(), ptr, scalar, ws) ==
                                            CUDNN_STATUS_SUCCESS
                                        ? cudaSuccess
                                        : cudaErrorLaunchFailure;
                         },
                         &err))
        return err == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
    return execute_on(st, g.get(), ptr, scalar, ws);
}

cudnnStatus_t cudnnBackendPopulateCudaGraph(cudnnHandle_t, cudnnBackendDescriptor_t,
                                            cudnnBackendDescriptor_t, cudaGraph_t)
{
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "CUDA graphs%s are not emulated");
}
cudnnStatus_t cudnnBackendUpdateCudaGraph(cudnnHandle_t, cudnnBackendDescriptor_t,
                                          cudnnBackendDescriptor_t, cudaGraph_t)
{
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "CUDA graphs%s are not emulated");
}
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t, cudnnDataType_t,
                                         cudnnTensorFormat_t, int, const int *)
{
    return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnReorderFilterAndBias(cudnnHandle_t, const cudnnFilterDescriptor_t,
                                        cudnnReorderType_t, const void *, void *, int,
                                        const void *, void *)
{
    return CUDNN_STATUS_NOT_SUPPORTED;
}

/* the runtime calls the frontend makes that emu.cpp does not have (weak: emu.cpp's win) */
__attribute__((weak)) cudaError_t cudaGetDevice(int *device)
{
    if (!device) return cudaErrorInvalidValue;
    *device = 0;
    return cudaSuccess;
}
__attribute__((weak)) cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}
__attribute__((weak)) cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
    if (ms) *ms = 0.0f; /* the emulator keeps no time */
    return cudaSuccess;
}

/* ---- the graph API's own checks, each a planted misuse or refusal it must catch ---- */

namespace {

/* a finalized tensor descriptor (dims and strides of rank 4) */
cudnnBackendDescriptor_t st_tensor(int64_t uid, int dt, const int64_t *dim, const int64_t *str,
                                   bool virt)
{
    cudnnBackendDescriptor_t d = nullptr;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &d);
    const int64_t align = 16;
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    cudnnBackendFinalize(d);
    return d;
}

/* an operation graph of one op on handle h */
cudnnBackendDescriptor_t st_graph(cudnnHandle_t h, cudnnBackendDescriptor_t *ops, int n)
{
    cudnnBackendDescriptor_t g = nullptr;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g);
    cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                             ops);
    cudnnBackendFinalize(g);
    return g;
}

/* A (1,1,16,k) B (1,1,k,16) of type dt -> C fp32: how many engine configurations heuristics
 * offer; with plan, the plan of the first (NULL when none or refused) */
int64_t st_matmul(cudnnHandle_t h, int dt, int64_t k, cudnnBackendDescriptor_t *plan)
{
    const int64_t da[4] = {1, 1, 16, k}, sa[4] = {16 * k, 16 * k, k, 1};
    const int64_t db[4] = {1, 1, k, 16}, sb[4] = {16 * k, 16 * k, 1, k}; /* unit stride: k */
    const int64_t dc[4] = {1, 1, 16, 16}, sc[4] = {256, 256, 16, 1};
    cudnnBackendDescriptor_t a = st_tensor(1, dt, da, sa, false), b = st_tensor(2, dt, db, sb, false),
                             c = st_tensor(3, CUDNN_DATA_FLOAT, dc, sc, false), mm = nullptr,
                             op = nullptr, heur = nullptr, cfg = nullptr;
    const int ct = CUDNN_DATA_FLOAT;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm);
    cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct);
    cudnnBackendFinalize(mm);
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op);
    cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &a);
    cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &b);
    cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &c);
    cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                             &mm);
    cudnnBackendFinalize(op);
    cudnnBackendDescriptor_t g = st_graph(h, &op, 1);
    const int mode = CUDNN_HEUR_MODE_A;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    cudnnBackendFinalize(heur);
    int64_t n = -1;
    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                             &n, nullptr);
    if (plan) *plan = nullptr;
    if (plan && n > 0) {
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg);
        int64_t got = 0;
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &cfg);
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan);
        cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        cudnnBackendSetAttribute(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
        if (cudnnBackendFinalize(*plan) != CUDNN_STATUS_SUCCESS) {
            cudnnBackendDestroyDescriptor(*plan);
            *plan = nullptr;
        }
    }
    /* an engine for the graph, directly: refused as heuristics refuse it */
    cudnnBackendDescriptor_t eng = nullptr;
    const int64_t zero = 0;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng);
    cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             1, &g);
    cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &zero);
    const bool eng_ok = cudnnBackendFinalize(eng) == CUDNN_STATUS_SUCCESS;
    if (eng_ok != (n > 0)) n = -2; /* heuristics and the engine disagree */
    for (cudnnBackendDescriptor_t x : {a, b, c, mm, op, g, heur, cfg, eng})
        if (x) cudnnBackendDestroyDescriptor(x);
    return n;
}

} /* namespace */

#define GSELF(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            missed++;                                                                          \
            fprintf(stderr, "emu graph self-check: not caught: " __VA_ARGS__);                 \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

/* the graph API's refusals and its arithmetic, on the emulated device as EMU_CC makes it:
 * returns the checks it missed (tests/gpu/test_gpu_ops looks it up with dlsym) */
extern "C" __attribute__((visibility("default"))) int ddpmd_emu_graph_selfcheck(void)
{
    int missed = 0;
    cudnnHandle_t h = nullptr;
    cudaStream_t st = nullptr;
    if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS ||
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        return 1000;
    cudnnSetStream(h, st);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const bool sm80 = prop.major >= 8;
    /* the engine's refusals: fp32 operands, head dims over 128 or off multiples of 8, sm_75 */
    GSELF(st_matmul(h, CUDNN_DATA_FLOAT, 64, nullptr) == 0, "an fp32 attention matmul");
    GSELF(st_matmul(h, CUDNN_DATA_BFLOAT16, 136, nullptr) == 0, "head dim 136");
    GSELF(st_matmul(h, CUDNN_DATA_HALF, 60, nullptr) == 0, "head dim 60");
    GSELF(st_matmul(h, CUDNN_DATA_HALF, 64, nullptr) == (sm80 ? 1 : 0),
          "a half matmul of head dim 64 on sm_%d%d", prop.major, prop.minor);
    /* a run: C = A B in fp32 sums of bf16 operands, the workspace scribbled, a missing pointer
     * refused */
    cudnnBackendDescriptor_t plan = nullptr;
    if (sm80 && st_matmul(h, CUDNN_DATA_BFLOAT16, 64, &plan) == 1 && plan) {
        const int k = 64;
        __nv_bfloat16 ha[16 * 64], hb[64 * 16];
        float hc[256];
        for (int i = 0; i < 16 * k; i++) {
            ha[i] = __float2bfloat16((float)((i * 7) % 13) / 8.0f - 0.75f);
            hb[i] = __float2bfloat16((float)((i * 5) % 11) / 4.0f - 1.25f);
        }
        int64_t ws = 0;
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, nullptr, &ws);
        char *dev = nullptr;
        const size_t off_b = 4096, off_c = 8192, off_w = 12288;
        if (cudaMalloc((void **)&dev, off_w + (size_t)ws) == cudaSuccess) {
            cudaMemcpyAsync(dev, ha, sizeof ha, cudaMemcpyHostToDevice, st);
            cudaMemcpyAsync(dev + off_b, hb, sizeof hb, cudaMemcpyHostToDevice, st);
            cudaMemsetAsync(dev + off_w, 0, (size_t)ws, st);
            const int64_t uids[3] = {1, 2, 3};
            void *ptrs[3] = {dev, dev + off_b, dev + off_c}, *wsp = dev + off_w;
            for (int n = 2; n <= 3; n++) {
                cudnnBackendDescriptor_t vp = nullptr;
                cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
                cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                         n, uids);
                cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                         CUDNN_TYPE_VOID_PTR, n, ptrs);
                cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                         CUDNN_TYPE_VOID_PTR, 1, &wsp);
                cudnnBackendFinalize(vp);
                const cudnnStatus_t rs = cudnnBackendExecute(h, plan, vp);
                GSELF(n == 3 ? rs == CUDNN_STATUS_SUCCESS : rs == CUDNN_STATUS_BAD_PARAM,
                      "a variant pack of %d of the 3 tensors (%d)", n, (int)rs);
                cudnnBackendDestroyDescriptor(vp);
            }
            unsigned char w0 = 0;
            cudaMemcpyAsync(hc, dev + off_c, sizeof hc, cudaMemcpyDeviceToHost, st);
            cudaMemcpyAsync(&w0, dev + off_w, 1, cudaMemcpyDeviceToHost, st);
            cudaStreamSynchronize(st);
            int bad = 0;
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) {
                    float sum = 0.0f;
                    for (int l = 0; l < k; l++)
                        sum += __bfloat162float(ha[i * k + l]) * __bfloat162float(hb[j * k + l]);
                    bad += hc[i * 16 + j] != sum;
                }
            GSELF(!bad, "%d of 256 matmul results off", bad);
            GSELF(ws > 0 && w0 == 0x5A, "the workspace left untouched");
            cudaFree(dev);
        }
        cudnnBackendDestroyDescriptor(plan);
    } else if (sm80) {
        GSELF(false, "(no plan for a bf16 matmul)");
    }
    /* a descriptor given before it is finalized, and set after it is */
    cudnnBackendDescriptor_t t = nullptr, op = nullptr;
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
    cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op);
    GSELF(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t) != CUDNN_STATUS_SUCCESS,
          "an unfinalized descriptor as an attribute");
    cudnnBackendDestroyDescriptor(t);
    cudnnBackendDestroyDescriptor(op);
    cudnnDestroy(h);
    cudaStreamDestroy(st);
    return missed;
}
