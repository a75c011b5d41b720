/* libfuzzer_main.c - the libFuzzer entry point of one target, chosen at compile time with
 * -DFUZZ_TARGET_FN=fuzz_<name> (CMakeLists.txt, DDPMD_FUZZ=ON). */
#include "fuzz.h"

#ifndef FUZZ_TARGET_FN
#error "define FUZZ_TARGET_FN to the harness function"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return FUZZ_TARGET_FN(data, size);
}
