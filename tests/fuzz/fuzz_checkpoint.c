/* fuzz_checkpoint.c - checkpoint_open on arbitrary bytes: the safetensors container plus the spec
 * and step in its metadata. Invariants: a failure leaves *out NULL and says why; an accepted
 * checkpoint has a step >= 0 and a spec that serialises. */
#include "checkpoint.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

int fuzz_checkpoint(const uint8_t *data, size_t size)
{
    const char *path = fuzz_bytes_path(0, data, size);
    struct safetensors *st = NULL;
    struct train_spec spec;
    int64_t step = -1;
    char err[512];
    err[0] = '\0';
    if (checkpoint_open(&st, path, &spec, &step, err, sizeof err) != 0) {
        if (st) fuzz_fail("checkpoint", "failed open left *out set");
        if (!err[0]) fuzz_fail("checkpoint", "failed open without a message");
        return 0;
    }
    if (!st || step < 0) fuzz_fail("checkpoint", "accepted with st=%p step=%lld", (void *)st,
                                   (long long)step);
    char *js = spec_to_json(&spec);
    if (!js) fuzz_fail("checkpoint", "spec_to_json failed on an accepted checkpoint's spec");
    free(js);
    safetensors_free(st);
    return 0;
}
