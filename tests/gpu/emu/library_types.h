/* library_types.h (emulator) - cudaDataType_t, the element types cuBLAS's *Ex calls name, with
 * CUDA's values. See cuda_runtime.h here. */
#ifndef DDPMD_EMU_LIBRARY_TYPES_H
#define DDPMD_EMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

#endif
