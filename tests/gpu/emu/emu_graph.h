/* emu_graph.h - what the CUDA emulator's stream capture (tests/gpu/emu/graph.cpp) counted, for the
 * tests that load it: `ddpmd_emu_graph_stats` and `ddpmd_emu_capture_selfcheck` (the capture's;
 * cudnn_graph.cpp's ddpmd_emu_graph_selfcheck is the cuDNN graph API's) looked up with dlsym in
 * libddpmd_cuda_emu.so, and fast mode's library calls (`ddpmd_emu_fast_calls`). Plain C.
 */
#ifndef DDPMD_EMU_GRAPH_H
#define DDPMD_EMU_GRAPH_H

struct emu_graph_stats {
    long captures;       /* cudaStreamBeginCapture calls */
    long invalidated;    /* captures a refused call invalidated */
    long refused;        /* calls a capture refused */
    long instantiated;   /* cudaGraphInstantiate calls, and their nodes in all */
    long nodes;
    long launches;       /* cudaGraphLaunch calls, and the nodes they ran */
    long replayed;
    long eager_launches; /* kernel launches run at once (neither captured nor replayed) */
    long finds;          /* cuDNN's algorithm finders (cudnnFind*AlgorithmEx) */
};

typedef void (*ddpmd_emu_graph_stats_fn)(struct emu_graph_stats *out);
typedef int (*ddpmd_emu_capture_selfcheck_fn)(void);
/* fast mode's library calls (emu.cpp): what 0 cuDNN convolutions with TF32 operands, 1 cuBLAS
 * GEMMs with TF32 operands, 2 non-deterministic convolution algorithms, 3 FFT / Winograd ones */
typedef unsigned long (*ddpmd_emu_fast_calls_fn)(int what);
enum { EMU_FAST_TF32_CONV = 0, EMU_FAST_TF32_GEMM = 1, EMU_FAST_NONDET = 2, EMU_FAST_FFT = 3 };

#endif
