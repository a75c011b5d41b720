/* dataset_images.h - tu_image_at: one image of a dataset (dataset_image) as a pointer, for the
 * tests, the fuzzers and tools/fmnist_classifier that read images one at a time.
 */
#ifndef DDPMD_DATASET_IMAGES_H
#define DDPMD_DATASET_IMAGES_H

#include <stdlib.h>

#include "dataset.h"

/* image i of ds (dataset_image) in one of four rotating buffers: valid until the fourth call
 * after; NULL when i is out of range or out of memory. The buffers live until the process
 * ends. */
static inline const float *tu_image_at(const struct dataset *ds, int i)
{
    static float *buf[4];
    static size_t cap[4];
    static int next;
    size_t n = (size_t)dataset_channels(ds) * dataset_size(ds) * dataset_size(ds);
    int k = next++ % 4;
    if (n > cap[k]) {
        float *b = realloc(buf[k], n * sizeof *b);
        if (!b) return NULL;
        buf[k] = b;
        cap[k] = n;
    }
    return dataset_image(ds, i, buf[k]) == DATASET_OK ? buf[k] : NULL;
}

#endif
