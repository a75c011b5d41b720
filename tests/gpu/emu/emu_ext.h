/* emu_ext.h - what the emulator's later library files (cublas_batched.cpp, cudnn_graph.cpp)
 * share: their call counters, exported as ddpmd_emu_lib_calls_ext (libs 3 and up, the numbering
 * continuing emu.cpp's ddpmd_emu_lib_calls: 0 cuDNN convolutions, 1 cuBLAS GEMMs, 2 warp MMAs).
 * Internal to tests/gpu/emu. */
#ifndef DDPMD_EMU_EXT_H
#define DDPMD_EMU_EXT_H

enum {
    EMU_LIB_BLAS_STRIDED = 3, /* cublasGemmStridedBatchedEx calls */
    EMU_LIB_BLAS_PTRS = 4,    /* cublasGemmBatchedEx calls */
    EMU_LIB_DNN_GRAPH = 5,    /* cudnnBackendExecute of a graph with a matmul (attention) */
    EMU_LIB_DNN_REFUSED = 6,  /* execution plans the graph API refused to finalize */
    EMU_LIB_N = 7,
};
/* one call of library `lib` whose inputs have element type et (backend.h's bk_dtype) */
void emu_ext_count(int lib, int et);

#endif
