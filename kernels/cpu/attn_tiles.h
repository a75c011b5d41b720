/* attn_tiles.h - the tile kernels of the CPU attention (attention.c), one table per instruction
 * set: AVX2 + FMA (attention.c) and AVX-512 (attn512.c), picked once by cpu_isa(), and the bf16
 * form's entry points (attn_bf16.c). Each entry
 * runs on one thread over data in the caller's cache-sized tiles; the tables of one machine give
 * one set of bits (the dispatch is fixed per process), and every product sums its terms in the
 * same order in both tables (S, O, dQ, dK, dV agree bit for bit; the softmax's row sums do not).
 */
#ifndef DDPMD_CPU_ATTN_TILES_H
#define DDPMD_CPU_ATTN_TILES_H

#include <stddef.h>

#include "backend.h"

/* query rows and key columns of one tile: S (BR x BC) and, in the backward, dS next to it stay
 * in the core's L2 (2 x 64 KiB) with the key block's k, v rows */
#define ATTN_BR 128
#define ATTN_BC 128

struct attn_tiles {
    /* S (nr, ncp) = alpha A BT: A (nr, d) given packed transposed, AT (d, apl) (attn_pack_t),
     * BT (d, ncp) the key block packed transposed, rows of stride ldb (zero columns after the
     * keys; ncp a multiple of 16) */
    void (*abt)(float *S, size_t lds, const float *at, size_t apl, const float *bt, size_t ldb,
                int ncp, int nr, int d, float alpha);
    /* Y (ny, d) (+= when acc_y) W X, W_jt = W[j sw + t st], X rows of stride ldx, t < nt */
    void (*wx)(float *Y, size_t ldy, const float *W, size_t sw, size_t st, const float *X,
               size_t ldx, int ny, int nt, int d, int acc_y);
    /* the forward's online softmax over one key block: rows r < nr of S (stride lds, nc
     * columns) become exp(S - m_r) with m_r the running row max (m, l: running max and sum,
     * `first`: the pair's first key block), and the rows of O (stride ldo, d columns)
     * accumulated so far are rescaled to the new max */
    void (*softmax)(float *S, size_t lds, float *m, float *l, float *O, size_t ldo, int nr,
                    int nc, int d, int first);
    /* the backward's per-tile step: P = exp(P - lse_r), dS = scale P (dS - di_r) */
    void (*dsoftmax)(float *P, float *dS, size_t ld, const float *lse, const float *di, int nr,
                     int nc, float scale);
};

extern const struct attn_tiles attn_tiles_avx2;
extern const struct attn_tiles attn_tiles_avx512;

/* attn_bf16.c: the tiled form on bf16 operands (s->dtype BK_DTYPE_BF16), only where cpu_isa()
 * reports AVX512-BF16; attention.c checks the arguments. ws_bytes: the workspace of procs
 * threads and a pair's keys split in `chunks` (attention.c's attn_chunks); fwd, bwd on nt
 * threads (at most procs), bwd with each pair's keys in nch chunks. */
size_t attn_bf16_ws_bytes(const struct bk_attn *s, int procs, int chunks);
void attn_bf16_fwd(void *o, float *lse, const void *q, const void *k, const void *v, void *ws,
                   const struct bk_attn *s, int nt);
void attn_bf16_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                   const void *v, const void *o, const float *lse, void *ws,
                   const struct bk_attn *s, int nt, int nch);
/* attn_bf16.c: the plain form (attention.c's cpu_attn_plain_*) on bf16 operands, p fp32; one
 * (n, h) pair per task on min(pairs, nt) threads, so the bits do not depend on the thread count;
 * ws_bytes: procs threads' slots */
size_t attn_bf16_plain_ws_bytes(const struct bk_attn *s, int procs);
void attn_bf16_plain_fwd(void *o, float *p, const void *q, const void *k, const void *v,
                         void *ws, const struct bk_attn *s, int nt);
void attn_bf16_plain_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q,
                         const void *k, const void *v, const float *p, void *ws,
                         const struct bk_attn *s, int nt);

#endif
