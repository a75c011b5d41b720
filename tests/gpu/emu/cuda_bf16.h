/* cuda_bf16.h (emulator) - __nv_bfloat16: defined with __half in cuda_fp16.h here. */
#ifndef DDPMD_EMU_CUDA_BF16_H
#define DDPMD_EMU_CUDA_BF16_H
#include "cuda_fp16.h"
#endif
