/* attention_cudnn.cu - the tiled attention's 16-bit forward and backward on cuDNN's fused flash
 * attention (scaled dot-product attention), through cuDNN's graph API as NVIDIA's cuDNN frontend
 * builds it (third_party/cudnn_frontend, header-only). Outside parity mode only: cuDNN rounds P
 * and dS to 16 bits before their GEMMs and its backward sums dQ by atomics, so its result is
 * neither as exact nor as deterministic as parity mode promises; attention.cu's kernels run there.
 *
 * The graphs (forward and backward of one shape) are built once per device, shape and type, at
 * planning time (attn_ws_bytes, through the device's query handle, under the query lock), and
 * cached: their workspace is the plan's, and a job's step only looks them up and runs them on
 * its own handle and stream. Our layout maps onto cuDNN's (b, h, s, d): q, k, v, dq, dk, dv (N, L,
 * ld) have strides (L ld, D, ld, 1); o and dout (N, L, H D) have (L H D, D, H D, 1); lse (N, H, L)
 * is cuDNN's softmax Stats (b, h, s, 1), the natural-log log-sum-exp of each scaled score row.
 * A shape cuDNN refuses (head dimension, architecture, version) is remembered as refused, said
 * once with DDPMD_CUDA_VERBOSE, and runs on attention.cu's kernels; so does one whose execution
 * fails (not a sticky CUDA error), from then on.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#define NV_CUDNN_DISABLE_EXCEPTION /* the frontend returns errors; nothing throws here */
#include "cuda_backend.h"

/* the frontend's switches over cuDNN's enums name members an emulated cudnn.h lacks */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wswitch"
#include <cudnn_frontend.h>
#pragma GCC diagnostic pop

namespace fe = cudnn_frontend;

namespace {

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct sdpa_key {
    int device, n, l, heads, d, ld, dtype;
    uint32_t scale; /* the float's bits */
    bool operator==(const sdpa_key &o) const { return !memcmp(this, &o, sizeof o); }
};
struct sdpa_hash {
    size_t operator()(const sdpa_key &k) const
    {
        size_t h = 1469598103934665603ull;
        const unsigned char *p = (const unsigned char *)&k;
        for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
        return h;
    }
};
struct sdpa_entry {
    std::atomic<bool> ok{false}; /* built, and no execution failed */
    std::shared_ptr<fe::graph::Graph> fwd, bwd;
    int64_t ws = 0; /* the larger of the two graphs' workspaces */
};

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* the cache */
std::unordered_map<sdpa_key, std::shared_ptr<sdpa_entry>, sdpa_hash> g_cache;

sdpa_key key_of(const struct bk_attn *s, int device)
{
    sdpa_key k;
    memset(&k, 0, sizeof k);
    k.device = device;
    k.n = s->n;
    k.l = s->l;
    k.heads = s->heads;
    k.d = s->d;
    k.ld = s->ld;
    k.dtype = s->dtype;
    memcpy(&k.scale, &s->scale, sizeof k.scale);
    return k;
}

bool verbose() { return getenv("DDPMD_CUDA_VERBOSE") != nullptr; }

/* DDPMD_CUDA_ATTN_CUDNN=0: never (attention.cu's kernels everywhere) */
bool enabled()
{
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("DDPMD_CUDA_ATTN_CUDNN");
        off = e && e[0] == '0';
    }
    return !off;
}

/* q-like (N, L, ld) and o-like (N, L, H*D) tensors as cuDNN's (b, h, s, d) */
std::vector<int64_t> dims_of(const struct bk_attn *s) { return {s->n, s->heads, s->l, s->d}; }
std::vector<int64_t> qstride(const struct bk_attn *s)
{
    return {(int64_t)s->l * s->ld, s->d, s->ld, 1};
}
std::vector<int64_t> ostride(const struct bk_attn *s)
{
    const int64_t hd = (int64_t)s->heads * s->d;
    return {(int64_t)s->l * hd, s->d, hd, 1};
}

std::shared_ptr<fe::graph::Graph> new_graph(const struct bk_attn *s)
{
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(s->dtype == BK_DTYPE_BF16 ? fe::DataType_t::BFLOAT16
                                                  : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name,
                                                    int64_t uid, const struct bk_attn *s,
                                                    bool dense)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(dims_of(s))
                        .set_stride(dense ? ostride(s) : qstride(s)));
}

/* builds g on handle h: its plan and workspace, or the reason it cannot */
bool build(fe::graph::Graph &g, cudnnHandle_t h, int64_t *ws, std::string *why)
{
    fe::error_t e = g.build(h, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (!e.is_good()) {
        *why = e.get_message();
        return false;
    }
    fe::error_t w = g.get_workspace_size(*ws);
    if (!w.is_good()) *why = w.get_message();
    return w.is_good();
}

/* the forward and backward graphs of s on handle h */
std::shared_ptr<sdpa_entry> make_entry(const struct bk_attn *s, cudnnHandle_t h, std::string *why)
{
    auto en = std::make_shared<sdpa_entry>();
    int64_t wf = 0, wb = 0;
    en->fwd = new_graph(s);
    {
        fe::graph::Graph &g = *en->fwd;
        auto q = input(g, "Q", UID_Q, s, false), k = input(g, "K", UID_K, s, false),
             v = input(g, "V", UID_V, s, false);
        auto a = fe::graph::SDPA_attributes().set_name("sdpa").set_is_inference(false).set_attn_scale(
            s->scale);
        auto out = g.sdpa(q, k, v, a);
        out[0]->set_output(true).set_uid(UID_O).set_dim(dims_of(s)).set_stride(ostride(s));
        out[1]->set_output(true).set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT);
        if (!build(g, h, &wf, why)) return en;
    }
    en->bwd = new_graph(s);
    {
        fe::graph::Graph &g = *en->bwd;
        auto q = input(g, "Q", UID_Q, s, false), k = input(g, "K", UID_K, s, false),
             v = input(g, "V", UID_V, s, false), o = input(g, "O", UID_O, s, true),
             dout = input(g, "dO", UID_DO, s, true);
        auto stats = g.tensor(fe::graph::Tensor_attributes()
                                  .set_name("Stats")
                                  .set_uid(UID_STATS)
                                  .set_dim({s->n, s->heads, s->l, 1})
                                  .set_stride({(int64_t)s->heads * s->l, s->l, 1, 1})
                                  .set_data_type(fe::DataType_t::FLOAT));
        auto a = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(
            s->scale);
        auto out = g.sdpa_backward(q, k, v, o, dout, stats, a);
        const int64_t uids[3] = {UID_DQ, UID_DK, UID_DV};
        for (int i = 0; i < 3; i++)
            out[i]->set_output(true).set_uid(uids[i]).set_dim(dims_of(s)).set_stride(qstride(s));
        if (!build(g, h, &wb, why)) return en;
    }
    en->ws = wf > wb ? wf : wb;
    en->ok = true;
    return en;
}

const char *dt_name(int dtype) { return dtype == BK_DTYPE_BF16 ? "bf16" : "f16"; }

/* the cached entry of s on device, built on a miss when `make` (the planning query) */
std::shared_ptr<sdpa_entry> entry_of(const struct bk_attn *s, int device, bool make)
{
    const sdpa_key k = key_of(s, device);
    pthread_mutex_lock(&g_lock);
    auto it = g_cache.find(k);
    std::shared_ptr<sdpa_entry> en = it == g_cache.end() ? nullptr : it->second;
    pthread_mutex_unlock(&g_lock);
    if (en || !make) return en;
    std::string why;
    cu_query_lock();
    try {
        en = make_entry(s, cu_query_cudnn(device), &why);
    } catch (const std::exception &ex) {
        en = std::make_shared<sdpa_entry>();
        why = ex.what();
    }
    cu_query_unlock();
    if (!en->ok) {
        en->fwd.reset();
        en->bwd.reset();
        if (verbose())
            fprintf(stderr, "ddpmd cuda: attention n%d l%d h%d d%d %s: cuDNN's fused attention "
                            "refused (%s), our kernels run it\n", s->n, s->l, s->heads, s->d,
                    dt_name(s->dtype), why.c_str());
    }
    pthread_mutex_lock(&g_lock);
    auto ins = g_cache.emplace(k, en);
    en = ins.first->second; /* another thread's, if it got there first */
    pthread_mutex_unlock(&g_lock);
    return en;
}

/* s may go to cuDNN on this device in this mode at all */
bool applies(const struct bk_attn *s, int parity)
{
    return !parity && enabled() && s->dtype != BK_DTYPE_F32;
}

/* after a failed execution: attention.cu's kernels from now on (a sticky error poisoned the
 * device already; the caller's fallback then fails too, as it must) */
int failed(const struct bk_attn *s, bk_ctx *ctx, const std::shared_ptr<sdpa_entry> &en,
           fe::error_t &e, const char *what)
{
    (void)cudaGetLastError();
    en->ok = false;
    fprintf(stderr, "ddpmd cuda: attention n%d l%d h%d d%d %s: cuDNN's fused %s failed (%s); "
                    "our kernels run it from now on\n", s->n, s->l, s->heads, s->d,
            dt_name(s->dtype), what, e.get_message().c_str());
    return -1;
}

} /* namespace */

int cu_sdpa_ws_bytes(const struct bk_attn *s, int device, int parity, size_t *ws)
{
    if (!applies(s, parity)) return 0;
    std::shared_ptr<sdpa_entry> en = entry_of(s, device, true);
    if (!en->ok) return 0;
    *ws = (size_t)en->ws;
    return 1;
}

int cu_sdpa_fwd(void *o, float *lse, const void *q, const void *k, const void *v, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    if (!applies(s, ctx->parity)) return -1;
    std::shared_ptr<sdpa_entry> en = entry_of(s, ctx->device, false);
    if (!en || !en->ok) return -1;
    std::unordered_map<int64_t, void *> ptrs = {{UID_Q, (void *)q}, {UID_K, (void *)k},
                                                {UID_V, (void *)v}, {UID_O, o},
                                                {UID_STATS, lse}};
    fe::error_t e = en->fwd->execute(ctx->cudnn, ptrs, ws);
    if (!e.is_good()) return failed(s, ctx, en, e, "forward");
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_sdpa_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                const void *v, const void *o, const float *lse, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    if (!applies(s, ctx->parity)) return -1;
    std::shared_ptr<sdpa_entry> en = entry_of(s, ctx->device, false);
    if (!en || !en->ok) return -1;
    std::unordered_map<int64_t, void *> ptrs = {
        {UID_Q, (void *)q},       {UID_K, (void *)k},       {UID_V, (void *)v},
        {UID_O, (void *)o},       {UID_DO, (void *)dout},   {UID_STATS, (void *)lse},
        {UID_DQ, dq},             {UID_DK, dk},             {UID_DV, dv}};
    fe::error_t e = en->bwd->execute(ctx->cudnn, ptrs, ws);
    if (!e.is_good()) return failed(s, ctx, en, e, "backward");
    CU_LAUNCHED(ctx);
    return BK_OK;
}
