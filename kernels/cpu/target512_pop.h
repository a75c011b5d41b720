/* target512_pop.h - ends what target512_push.h began (included, no guard) */
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
