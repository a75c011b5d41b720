/* target512_push.h - included (no guard) before the code a file compiles for AVX-512 by a target
 * pragma (attn512.c, eltwise512.c, norm512.c); target512_pop.h after it. The rest of the backend
 * is built for x86-64-v3; callers pick these copies only where cpu_isa() reports AVX-512.
 */
#if defined(__clang__) /* clang (the fuzz build) has no GCC target pragma */
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma")
#endif
