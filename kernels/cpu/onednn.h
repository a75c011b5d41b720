/* onednn.h - what the CPU backend's oneDNN users (conv.c, linear.c) share: the process's engine,
 * primitive and memory creation, user scratchpads (every primitive here takes its scratchpad
 * from the plan's workspace) and execution on a job's stream.
 */
#ifndef DDPMD_CPU_ONEDNN_H
#define DDPMD_CPU_ONEDNN_H

#include <oneapi/dnnl/dnnl.h>

#include "cpu.h"

/* whether oneDNN runs AMX tiles on this CPU (bf16 on tiles; DNNL_MAX_CPU_ISA caps it) */
int onednn_amx(void);
/* the process's CPU engine (created once), or NULL */
dnnl_engine_t onednn_engine(void);
/* bytes of a primitive descriptor's memory `what` (0 when it has none) */
size_t onednn_md_bytes(const_dnnl_primitive_desc_t pd, dnnl_query_t what);
/* 0 or -1 */
int onednn_make_prim(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd);
/* a memory of md with no data handle yet (onednn_set binds one per call) */
int onednn_make_mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md);
/* a scratchpad memory of `bytes` (at least 1) */
int onednn_make_scratch_mem(dnnl_memory_t *m, size_t bytes);
/* an attribute with the user scratchpad mode and, when sum, a sum post-op (dst += result) */
int onednn_make_attr(dnnl_primitive_attr_t *out, int sum);
static inline void onednn_set(dnnl_memory_t m, const void *p)
{
    dnnl_memory_set_data_handle(m, (void *)p);
}
/* p on stream: 0 or -1 */
int onednn_run(dnnl_primitive_t p, dnnl_stream_t stream, int nargs, const dnnl_exec_arg_t *args);

/* a job's cache of primitives (conv.c's entries by shape, linear.c's): n entries of one type in
 * e, and the stream they run on */
struct onednn_cache {
    dnnl_stream_t stream;
    void *e;
    int n, cap;
};
/* *pc, created with its stream on first use; NULL when that fails */
struct onednn_cache *onednn_cache_get(struct onednn_cache **pc);
/* room for one more entry of elem bytes at e + n * elem (the caller fills it, then counts it
 * in n); NULL when out of memory */
void *onednn_cache_slot(struct onednn_cache *c, size_t elem);
/* every entry through entry_free, then the cache; *pc NULL after */
void onednn_cache_free(struct onednn_cache **pc, size_t elem, void (*entry_free)(void *entry));

#define ONEDNN_ALIGN64(b) (((b) + 63) & ~(size_t)63)

#endif
