/* init.c - PyTorch-style default initialisation from counter-based draws. */
#include "init.h"

#include <math.h>

#include "philox.h"

void init_param(const struct tensor *t, uint64_t seed, float *dst)
{
    double bound = 0.0;
    switch (t->init) {
    case INIT_ONES:
    case INIT_ZEROS:
        for (size_t i = 0; i < t->numel; i++) dst[i] = t->init == INIT_ONES ? 1.0f : 0.0f;
        return;
    case INIT_FAN_IN_UNIFORM: /* kaiming_uniform(a=sqrt(5)) and the bias rule: 1/sqrt(fan_in) */
        bound = t->fan_in > 0 ? 1.0 / sqrt((double)t->fan_in) : 0.0;
        break;
    case INIT_XAVIER_UNIFORM:
        bound = sqrt(6.0 / (double)(t->fan_in + t->fan_out));
        break;
    }
    for (size_t i = 0; i < t->numel; i++) {
        float u = philox_uniform_at(seed, PHILOX_TAG_INIT, (uint64_t)t->param_index, 0, 0,
                                    (uint32_t)i);
        dst[i] = (float)((2.0 * u - 1.0) * bound);
    }
}
