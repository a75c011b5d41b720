/* fuzz_png.c - PNG decoding (image_load_png through libpng, with its size limits) on arbitrary
 * bytes, then what the folder loader does next: channel conversion and resize to a small square;
 * and the header check an upload runs first (image_png_probe). Invariants: a decoded image has
 * 1..4 channels, sides and float planes within the documented limits (IMAGE_MAX_SIDE,
 * IMAGE_MAX_DECODED_BYTES), and every value is in [0, 1]; a failure leaves the image empty and
 * says why; the probe never refuses a file the decoder decodes, and gives its width and height
 * (its channels at most the decoded ones: a tRNS chunk adds alpha). */
#include "fuzz.h"
#include "image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Mutated chunks almost never keep a valid CRC, and libpng stops at the first bad one, so for
 * inputs of even length every complete chunk's CRC is recomputed first (reaching the decoder
 * proper); odd-length inputs are decoded as given (the CRC error paths). */
static const uint8_t *png_fix_crcs(const uint8_t *data, size_t size, uint8_t **copy)
{
    *copy = NULL;
    if (size % 2 || size < 8 || !(*copy = malloc(size))) return data;
    uint8_t *b = *copy;
    memcpy(b, data, size);
    for (size_t p = 8; p + 12 <= size;) {
        size_t len = (size_t)b[p] << 24 | (size_t)b[p + 1] << 16 | (size_t)b[p + 2] << 8 | b[p + 3];
        if (len > size - p - 12) break;
        uLong crc = crc32(0L, b + p + 4, (uInt)(len + 4));
        for (int k = 0; k < 4; k++) b[p + 8 + len + k] = (uint8_t)(crc >> (24 - 8 * k));
        p += 12 + len;
    }
    return b;
}

int fuzz_png(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    const uint8_t *bytes = png_fix_crcs(data, size, &copy);
    const char *path = fuzz_bytes_path(0, bytes, size);
    int pw, ph, pc;
    char perr[300];
    perr[0] = '\0';
    enum image_status prc = image_png_probe(bytes, size < IMAGE_PNG_HEAD_BYTES ? size : IMAGE_PNG_HEAD_BYTES,
                                            (unsigned long long)size, &pw, &ph, &pc, perr, sizeof perr);
    if (prc != IMAGE_OK && !perr[0]) fuzz_fail("png", "probe refusal without a message");
    free(copy);
    struct image img;
    char err[512];
    err[0] = '\0';
    enum image_status rc = image_load_png(path, &img, err, sizeof err);
    if (rc != IMAGE_OK) {
        if (img.data || img.c || img.h || img.w)
            fuzz_fail("png", "failed decode (%d) left an image", (int)rc);
        if (!err[0]) fuzz_fail("png", "failed decode (%d) without a message", (int)rc);
        return 0;
    }
    if (prc != IMAGE_OK)
        fuzz_fail("png", "the probe refused a PNG the decoder decodes: %s", perr);
    if (pw != img.w || ph != img.h || pc < 1 || pc > img.c)
        fuzz_fail("png", "the probe says %dx%dx%d, the decoder %dx%dx%d", pc, ph, pw, img.c, img.h,
                  img.w);
    if (img.c < 1 || img.c > 4 || img.h < 1 || img.w < 1 || img.h > IMAGE_MAX_SIDE ||
        img.w > IMAGE_MAX_SIDE || !img.data ||
        (unsigned long long)img.c * img.h * img.w * sizeof(float) > IMAGE_MAX_DECODED_BYTES)
        fuzz_fail("png", "decoded %dx%dx%d outside the limits", img.c, img.h, img.w);
    size_t n = (size_t)img.c * img.h * img.w;
    for (size_t i = 0; i < n; i++)
        if (!(img.data[i] >= 0.0f && img.data[i] <= 1.0f))
            fuzz_fail("png", "value %zu is %g, outside [0, 1]", i, (double)img.data[i]);
    /* the dataset path: grey or RGB (chosen by the image, not by extra input bytes), 8 x 8 */
    int channels = (img.h + img.w) % 2 ? 1 : 3;
    float dst[3 * 8 * 8];
    if (image_to_channels(&img, channels) != IMAGE_OK || img.c != channels)
        fuzz_fail("png", "image_to_channels(%d) failed", channels);
    if (image_resize_square(dst, &img, 8) == IMAGE_OK) {
        for (int i = 0; i < channels * 64; i++)
            if (!(dst[i] >= -1.0f && dst[i] <= 1.0f))
                fuzz_fail("png", "resized value %d is %g, outside [-1, 1]", i, (double)dst[i]);
    }
    image_free(&img);
    return 0;
}
