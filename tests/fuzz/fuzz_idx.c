/* fuzz_idx.c - the Fashion-MNIST IDX reader (dataset_open_fmnist) on arbitrary bytes. Input
 * layout: byte 0 chooses the options (bit 0: resize to 8 x 8 RGB instead of padding to 28 x 28
 * grey; bit 1: the test split's names), bytes 1..4 the length L of the image file (little-endian,
 * clamped to what is there), then L bytes of the image file and the rest the label file. Files go
 * under their plain names; zlib reads gzip data there too, so compressed inputs are covered.
 * Invariants: an accepted set has 1.. images with labels 0..9 and pixels in [-1, 1]. */
#include "dataset.h"
#include "dataset_images.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_idx(const uint8_t *data, size_t size)
{
    if (size < 5) return 0;
    int resize = data[0] & 1, test = (data[0] >> 1) & 1;
    size_t len = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 |
                 (size_t)data[4] << 24;
    data += 5;
    size -= 5;
    if (len > size) len = size;
    const char *pfx = test ? "t10k" : "train";
    char img_name[64], lab_name[64];
    snprintf(img_name, sizeof img_name, "%s-images-idx3-ubyte", pfx);
    snprintf(lab_name, sizeof lab_name, "%s-labels-idx1-ubyte", pfx);
    if (fuzz_write_file(img_name, data, len) || fuzz_write_file(lab_name, data + len, size - len))
        fuzz_fail("idx", "cannot write the input files under %s", fuzz_dir());

    struct dataset *ds = NULL;
    char err[512];
    err[0] = '\0';
    int channels = resize ? 3 : 1, side = resize ? 8 : 28;
    enum dataset_status rc =
        dataset_open_fmnist(&ds, fuzz_dir(), test ? DATASET_FMNIST_TEST : DATASET_FMNIST_TRAIN,
                            channels, side, resize ? DATASET_FIT_RESIZE : DATASET_FIT_PAD, err,
                            sizeof err);
    if (rc != DATASET_OK) {
        if (ds) fuzz_fail("idx", "failed open (%d) left a dataset", (int)rc);
        if (!err[0]) fuzz_fail("idx", "failed open (%d) without a message", (int)rc);
    } else {
        int n = dataset_count(ds);
        if (n < 1 || dataset_channels(ds) != channels || dataset_size(ds) != side)
            fuzz_fail("idx", "accepted %d images of %dx%d", n, dataset_channels(ds),
                      dataset_size(ds));
        for (int i = 0; i < n; i++) {
            int lab = dataset_label(ds, i);
            const float *x = tu_image_at(ds, i);
            if (lab < 0 || lab > 9) fuzz_fail("idx", "image %d has label %d", i, lab);
            for (int k = 0; k < channels * side * side; k++)
                if (!(x[k] >= -1.0f && x[k] <= 1.0f))
                    fuzz_fail("idx", "image %d value %d is %g", i, k, (double)x[k]);
        }
        dataset_free(ds);
    }
    fuzz_remove_file(img_name);
    fuzz_remove_file(lab_name);
    return 0;
}
