/* target512_push.h - included (no guard) before the code a file compiles for AVX-512 by a target
 * pragma (attn512.c, eltwise512.c, norm512.c; with TARGET512_BF16 defined first, AVX512-BF16 too:
 * attn_bf16.c, wgrad_bf16.c); target512_pop.h after it. The rest of the backend is built for
 * x86-64-v3; callers pick these copies only where cpu_isa() reports AVX-512 (AVX512-BF16). The
 * ISA strings are spelled out: GCC does not expand macros in a target pragma.
 */
#if defined(__clang__) && defined(TARGET512_BF16) /* clang (the fuzz build): no GCC pragma */
#pragma clang attribute push(                                                                  \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,fma"))),              \
    apply_to = function)
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma"))), \
                             apply_to = function)
#elif defined(TARGET512_BF16)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,fma")
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma")
#endif
