/* eltwise512.c - the element-wise blocks (eltwise_blocks.h: SiLU, exact GELU and their
 * gradients) compiled for AVX-512 by a target pragma: 16-float vectors, the same operations lane
 * for lane, so the same bits as the AVX2 copy in eltwise.c. Called only where cpu_isa() reports
 * AVX-512 (the rest of the backend is built for x86-64-v3).
 */
#include <math.h>
#include <stddef.h>

#include "cpu.h"
#include "vmath.h"

#include "target512_push.h"

#define ELT_SUFFIX _avx512
#include "eltwise_blocks.h"

#include "target512_pop.h"
