/* init.h - parameter initialisation with PyTorch's default distributions for each layer kind,
 * drawn from Philox so that a (seed, parameter index) pair always gives the same weights.
 */
#ifndef DDPMD_INIT_H
#define DDPMD_INIT_H

#include <stdint.h>

#include "graph.h"

/* fills dst (t->numel floats) with the initial values of parameter t */
void init_param(const struct tensor *t, uint64_t seed, float *dst);

#endif
