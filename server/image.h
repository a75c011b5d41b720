/* image.h - PNG in and out for datasets and sample grids (libpng): decode any PNG into float
 * planes, convert channels, resize (area down, bilinear up) + centre-crop to a square in [-1, 1],
 * and write 8-bit grey/RGB PNGs and image grids atomically (temp file, fsync, rename).
 */
#ifndef DDPMD_IMAGE_H
#define DDPMD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Every fallible function returns one of these; 0 = ok. */
enum image_status {
    IMAGE_OK = 0,
    IMAGE_ERR_IO,     /* open/read/write/fsync/rename failed (errno text in err) */
    IMAGE_ERR_FORMAT, /* not a PNG, truncated, corrupt, or over a decoding limit below */
    IMAGE_ERR_NOMEM,  /* allocation failed */
    IMAGE_ERR_ARG,    /* invalid argument (NULL, channel count, size) */
};

/* Decoding limits (docs/limits.md): a corrupt or hostile header must not make us allocate
 * gigabytes. Checked on the header, before any pixel buffer exists; each refusal is
 * IMAGE_ERR_FORMAT with the limit's name in the message. The trainer resizes to at most 4096
 * (usually <= 1024), so these leave room for any camera photo (16384 x 16384 grey, or a
 * 20-megapixel RGB photo) while keeping one decode's peak under about 450 MiB. */
#define IMAGE_MAX_SIDE 16384 /* width and height each (libpng user limits) */
/* width * height * channels * sizeof(float) of the decoded planes (the raw rows libpng fills are
 * at most half of that again) */
#define IMAGE_MAX_DECODED_BYTES ((unsigned long long)256 << 20)
/* no single chunk may make libpng allocate more (text, ICC and other ancillary chunks) */
#define IMAGE_MAX_CHUNK_BYTES ((unsigned long)8 << 20)
/* ancillary chunks libpng keeps per file */
#define IMAGE_MAX_CHUNK_CACHE 64

/* A decoded image: c planes of h x w floats, data laid out (C,H,W). Decoded values are
 * v / (2^depth - 1) in [0, 1], computed as (float)v / 255.0f or (float)v / 65535.0f, where depth
 * is 8 for 1/2/4/8-bit files (sub-byte grey is bit-replicated to 8 bits: 2-bit 2 -> 170) and
 * palettes, and 16 for 16-bit files. No gamma or colour-profile correction is applied. */
struct image {
    int c; /* 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA */
    int h, w;
    float *data; /* (C,H,W), malloc'd; free with image_free */
};

/* A short constant description of a status ("ok", "I/O error", ...). */
const char *image_status_name(enum image_status status);

/* Decode the PNG at path into *out in the file's own channel layout: grey -> 1, grey+alpha -> 2,
 * RGB -> 3, RGBA -> 4; a palette becomes RGB (RGBA when it has a tRNS chunk); grey or RGB with a
 * tRNS colour key gains an alpha channel (0 where the key matches, else 1). Interlaced files are
 * de-interlaced. The file's first IMAGE_PNG_HEAD_BYTES pass image_png_probe first (so the
 * decoder refuses whatever the probe refuses, e.g. a chunk before IHDR). Any libpng error (bad
 * signature, CRC, truncation, zlib data) gives IMAGE_ERR_FORMAT and a message naming the file;
 * *out is then {0}. */
enum image_status image_load_png(const char *path, struct image *out, char *err, size_t errlen);

/* The bytes image_png_probe reads: the signature and the IHDR chunk (length, type, 13 bytes,
 * CRC) */
#define IMAGE_PNG_HEAD_BYTES 33

/* A PNG's size and channels from its first IMAGE_PNG_HEAD_BYTES bytes (head, n of them, of a
 * file of file_bytes), without decoding: the signature, an IHDR chunk first with a valid CRC,
 * a bit depth and colour type PNG allows, and the limits image_load_png applies to the header
 * (IMAGE_MAX_SIDE, IMAGE_MAX_DECODED_BYTES, a file too small for the pixels it declares).
 * *channels as image_load_png gives them without a tRNS chunk (grey 1, grey+alpha 2, RGB and
 * palette 3, RGBA 4). IMAGE_ERR_FORMAT with why in err; a file that passes may still fail to
 * decode (its image data), never by its header. */
enum image_status image_png_probe(const unsigned char *head, size_t n, unsigned long long file_bytes,
                                  int *w, int *h, int *channels, char *err, size_t errlen);

/* Convert img in place to channels (1 or 3). Alpha is composited on black (colour * alpha), so a
 * transparent pixel becomes the background value -1 after scaling to [-1, 1], the same value that
 * pads Fashion-MNIST; one channel is the Rec. 601 luminance 0.299 R + 0.587 G + 0.114 B; grey to
 * three channels replicates the grey. A no-op when img already has that many channels. */
enum image_status image_to_channels(struct image *img, int channels);

/* Scale img so its SHORTER side is size (the longer side becomes round(long * size / short)),
 * then centre-crop the longer side to size (offset floor((long' - size) / 2)), writing
 * dst (C, size, size) = 2 * value - 1, i.e. [0, 1] -> [-1, 1]. Each axis is resampled on its
 * own: an area (box) average when it shrinks (output pixel j averages input span
 * [j * in/out, (j+1) * in/out) with fractional edge weights), bilinear with align_corners=false
 * when it grows (source x = (j + 0.5) * in/out - 0.5, clamped to [0, in - 1], as PyTorch), a
 * copy when unchanged. size in 1..IMAGE_MAX_SIDE. */
enum image_status image_resize_square(float *dst, const struct image *img, int size);

void image_free(struct image *img);

/* The most image_load_png, image_to_channels and image_resize_square hold at once for an image
 * of pixels (width x height) resized to size: the rows as read (16-bit, 4 channels at most), its
 * float planes and their channel conversion, the resize's tables and rows, libpng's state. */
int64_t image_decode_plan_bytes(int64_t pixels, int size);
/* The most image_save_grid_png holds for n images c x h x w in cols columns with pad pixels
 * between: the grid's float canvas, a row of bytes, libpng's and zlib's deflate state. */
int64_t image_grid_plan_bytes(int n, int c, int h, int w, int cols, int pad);

/* Write chw (C,H,W) (c = 1 grey or 3 RGB) as an 8-bit PNG: each value is clamped to [-1, 1]
 * (NaN -> -1) and stored as floor((x + 1) * 127.5 + 0.5). The file is written to a unique
 * "<path>.tmp.XXXXXX" in path's directory, fsynced and renamed over path, then the directory is
 * fsynced; on failure before the rename the temp file is removed and path is untouched. */
enum image_status image_save_png(const char *path, const float *chw, int c, int h, int w,
                                 char *err, size_t errlen);

/* Tile n images nchw (N,C,H,W) row-major into a grid of min(cols, n) columns and
 * ceil(n / columns) rows, with pad pixels of value -1 BETWEEN neighbouring tiles (none around the
 * border): width = cols*w + (cols-1)*pad, height = rows*h + (rows-1)*pad. Cells past n are -1.
 * Saved with image_save_png. */
enum image_status image_save_grid_png(const char *path, const float *nchw, int n, int c, int h,
                                      int w, int cols, int pad, char *err, size_t errlen);

#endif
