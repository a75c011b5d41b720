/* emu_stats.h - what the CUDA emulator (tests/gpu/emu) counted, for the tests that load it:
 * `ddpmd_emu_get_stats` looked up with dlsym in libddpmd_cuda_emu.so. Plain C. */
#ifndef DDPMD_EMU_STATS_H
#define DDPMD_EMU_STATS_H

#include <stddef.h>
#include <stdint.h>

struct ddpmd_emu_stats {
    long mallocs, host_mallocs, frees; /* cudaMalloc, cudaMallocHost, cudaFree(Host) that worked */
    size_t last_malloc;                /* the bytes the last cudaMalloc asked for */
    size_t used, peak;                 /* device bytes held now and at most (2 MiB granularity) */
    long async_pinned, async_pageable; /* cudaMemcpyAsync between the device and page-locked /
                                        * pageable host memory (pageable: not asynchronous) */
    uintptr_t ws_lo, ws_hi;            /* the device bytes cuBLAS and cuDNN used as workspace */
    long ws_uses;                      /* library calls that used a workspace */
    long blas_ws_uses;                 /* of them cuBLAS's (the one ctx_set_workspace binds) */
    long modules;                      /* library kernels loaded (emu.cpp: dnn_engine_module), each
                                        * 2 MiB of the device the process keeps; not in mallocs */
};

/* the counts since the last reset; reset (nonzero) starts them again, with peak = used */
typedef void (*ddpmd_emu_get_stats_fn)(struct ddpmd_emu_stats *out, int reset);

#endif
