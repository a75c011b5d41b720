/* image.c - PNG decode/encode with libpng, channel conversion, square resize + centre crop.
 * libpng reports errors by longjmp; each setjmp lives in a small *_run function whose state is
 * all reached through a pointer to the caller's struct (see png_rd_run for why that is safe).
 */
#define _POSIX_C_SOURCE 200809L

#include "image.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fsio.h"

const char *image_status_name(enum image_status status)
{
    switch (status) {
    case IMAGE_OK: return "ok";
    case IMAGE_ERR_IO: return "I/O error";
    case IMAGE_ERR_FORMAT: return "bad image file";
    case IMAGE_ERR_NOMEM: return "out of memory";
    case IMAGE_ERR_ARG: return "invalid argument";
    }
    return "unknown status";
}

void image_free(struct image *img)
{
    if (!img) return;
    free(img->data);
    img->data = NULL;
    img->c = img->h = img->w = 0;
}

/* ---- libpng error plumbing ---- */

struct png_errctx {
    char msg[320];
    char warn[120]; /* the last warning: libpng says why an IHDR is invalid only in one */
    int nomem;      /* the error was our own allocation failure */
};

/* libpng requires that an error handler never returns: record the message, then longjmp. */
static void png_err_fn(png_structp png, png_const_charp msg)
{
    struct png_errctx *e = png_get_error_ptr(png);
    if (!msg) msg = "libpng error";
    if (e && !strcmp(msg, "Invalid IHDR data") && strstr(e->warn, "exceeds user limit"))
        snprintf(e->msg, sizeof e->msg,
                 "image width or height is over the %d-pixel limit (IMAGE_MAX_SIDE)",
                 IMAGE_MAX_SIDE);
    else if (e && !strcmp(msg, "Invalid IHDR data") && e->warn[0])
        snprintf(e->msg, sizeof e->msg, "%s (%s)", msg, e->warn);
    else if (e)
        snprintf(e->msg, sizeof e->msg, "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings (bad sRGB profiles, extra IDAT data, ...) do not make a file unusable; keep the last
 * one for the error message rather than print to stderr from a library. */
static void png_warn_fn(png_structp png, png_const_charp msg)
{
    struct png_errctx *e = png_get_error_ptr(png);
    if (e && msg) snprintf(e->warn, sizeof e->warn, "%s", msg);
}

/* ---- decoding ---- */

/* zlib's documented upper bound on deflate's expansion (one byte of stream -> 1032 bytes) */
#define IMAGE_DEFLATE_MAX_RATIO 1032u

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

enum image_status image_png_probe(const unsigned char *head, size_t n, unsigned long long file_bytes,
                                  int *w, int *h, int *channels, char *err, size_t errlen)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    *w = *h = *channels = 0;
    if (n < 8 || memcmp(head, sig, 8) != 0) {
        snprintf(err, errlen, "no PNG signature");
        return IMAGE_ERR_FORMAT;
    }
    if (n < IMAGE_PNG_HEAD_BYTES || be32(head + 8) != 13 || memcmp(head + 12, "IHDR", 4) != 0) {
        snprintf(err, errlen, "file is truncated or corrupt: no IHDR chunk after the signature");
        return IMAGE_ERR_FORMAT;
    }
    const unsigned char *d = head + 16;
    if ((uint32_t)crc32(0L, head + 12, 17) != be32(head + 29)) {
        snprintf(err, errlen, "IHDR: CRC error");
        return IMAGE_ERR_FORMAT;
    }
    uint32_t ww = be32(d), hh = be32(d + 4);
    int depth = d[8], ctype = d[9];
    /* the file's channels and the decoded ones (a palette index is one, its colour three) */
    int fc, oc, ok;
    switch (ctype) {
    case 0: fc = 1, oc = 1, ok = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; break;
    case 2: fc = 3, oc = 3, ok = depth == 8 || depth == 16; break;
    case 3: fc = 1, oc = 3, ok = depth == 1 || depth == 2 || depth == 4 || depth == 8; break;
    case 4: fc = 2, oc = 2, ok = depth == 8 || depth == 16; break;
    case 6: fc = 4, oc = 4, ok = depth == 8 || depth == 16; break;
    default: fc = oc = ok = 0;
    }
    if (!ok || d[10] != 0 || d[11] != 0 || d[12] > 1) {
        snprintf(err, errlen, "IHDR: bit depth %d, colour type %d, compression %d, filter %d, "
                 "interlace %d is no PNG", depth, ctype, d[10], d[11], d[12]);
        return IMAGE_ERR_FORMAT;
    }
    if (ww == 0 || hh == 0 || ww > IMAGE_MAX_SIDE || hh > IMAGE_MAX_SIDE) {
        snprintf(err, errlen, "%ux%u image: its width or height is 0 or over the %d-pixel limit "
                 "(IMAGE_MAX_SIDE)", (unsigned)ww, (unsigned)hh, IMAGE_MAX_SIDE);
        return IMAGE_ERR_FORMAT;
    }
    /* the limits png_rd_check_size applies when decoding, on the same numbers */
    uint64_t decoded = (uint64_t)ww * hh * (uint64_t)oc * sizeof(float);
    uint64_t packed = (uint64_t)ww * hh * (uint64_t)fc * (uint64_t)depth / 8;
    if (decoded > IMAGE_MAX_DECODED_BYTES) {
        snprintf(err, errlen, "%ux%u image with %d channels decodes to %llu MiB, over the %llu MiB "
                 "limit (IMAGE_MAX_DECODED_BYTES)", (unsigned)ww, (unsigned)hh, oc,
                 (unsigned long long)(decoded >> 20),
                 (unsigned long long)(IMAGE_MAX_DECODED_BYTES >> 20));
        return IMAGE_ERR_FORMAT;
    }
    if (packed / IMAGE_DEFLATE_MAX_RATIO > file_bytes) {
        snprintf(err, errlen, "file is truncated or corrupt: it declares %ux%u pixels (%llu bytes "
                 "of pixel data) but its %llu bytes cannot decompress to more than %llu",
                 (unsigned)ww, (unsigned)hh, (unsigned long long)packed, file_bytes,
                 file_bytes * IMAGE_DEFLATE_MAX_RATIO);
        return IMAGE_ERR_FORMAT;
    }
    *w = (int)ww;
    *h = (int)hh;
    *channels = oc;
    return IMAGE_OK;
}

struct png_rd {
    FILE *fp;
    uint64_t file_bytes; /* the file's size, which bounds what its IDAT can decompress to */
    png_structp png;
    png_infop info;
    unsigned char *raw; /* h * rowbytes decoded bytes */
    png_bytep *rows;    /* h pointers into raw */
    float *data;        /* (C,H,W) result */
    int c, h, w;
    struct png_errctx e;
};

/* libpng's own reader says only "Read Error"; this one says whether the file ended or why the
 * read failed. */
static void png_rd_data(png_structp png, png_bytep buf, size_t n)
{
    struct png_rd *st = png_get_io_ptr(png);
    if (fread(buf, 1, n, st->fp) == n) return;
    if (ferror(st->fp)) {
        char msg[160];
        snprintf(msg, sizeof msg, "read failed: %s", strerror(errno));
        png_error(png, msg);
    }
    png_error(png, "file is truncated");
}

/* Every limit on a PNG's header, applied before a pixel buffer is allocated. Decompressed image
 * data is at least (w * h * bits per pixel) / 8 bytes (filter bytes and row padding only add), and
 * deflate expands a byte to at most 1032 (zlib's documented maximum ratio), so a file smaller than
 * that / 1032 cannot hold the image it declares: refusing it before allocating keeps a 100-byte
 * "PNG bomb" from reserving hundreds of MiB only to fail at the first row. */
static void png_rd_check_size(struct png_rd *st, png_uint_32 w, png_uint_32 h, int depth,
                              int file_channels, int out_channels)
{
    uint64_t decoded = (uint64_t)w * h * (uint64_t)out_channels * sizeof(float);
    uint64_t packed = (uint64_t)w * h * (uint64_t)file_channels * (uint64_t)depth / 8;
    char msg[300];
    if (decoded > IMAGE_MAX_DECODED_BYTES) {
        snprintf(msg, sizeof msg,
                 "%ux%u image with %d channels decodes to %llu MiB, over the %llu MiB limit "
                 "(IMAGE_MAX_DECODED_BYTES)",
                 (unsigned)w, (unsigned)h, out_channels, (unsigned long long)(decoded >> 20),
                 (unsigned long long)(IMAGE_MAX_DECODED_BYTES >> 20));
        png_error(st->png, msg);
    }
    if (packed / IMAGE_DEFLATE_MAX_RATIO > st->file_bytes) {
        snprintf(msg, sizeof msg,
                 "file is truncated or corrupt: it declares %ux%u pixels (%llu bytes of pixel "
                 "data) but its %llu bytes cannot decompress to more than %llu",
                 (unsigned)w, (unsigned)h, (unsigned long long)packed,
                 (unsigned long long)st->file_bytes,
                 (unsigned long long)(st->file_bytes * IMAGE_DEFLATE_MAX_RATIO));
        png_error(st->png, msg);
    }
}

/* All state that changes after setjmp lives in *st, which is not a local of this function, so it
 * keeps its value across the longjmp (C11 7.13.2.1p3 only makes non-volatile LOCALS of the
 * function that called setjmp indeterminate); the caller frees what *st holds either way.
 * Returns 0 on success, -1 after a libpng error (message in st->e). */
static int png_rd_run(struct png_rd *st)
{
    static const png_byte keep_trns[] = {'t', 'R', 'N', 'S', '\0'};
    png_uint_32 w, h, y, x;
    int depth, ctype, interlace, fc, c, bd, ch;
    size_t rowbytes;

    if (setjmp(png_jmpbuf(st->png))) return -1;

    png_set_read_fn(st->png, st, png_rd_data);
    png_set_sig_bytes(st->png, 8);
    png_set_user_limits(st->png, IMAGE_MAX_SIDE, IMAGE_MAX_SIDE);
    /* no chunk may make libpng allocate more than this, and at most this many ancillary chunks
     * are kept (a text chunk declaring 2 GiB was malloc'd whole before these were set) */
    png_set_chunk_malloc_max(st->png, IMAGE_MAX_CHUNK_BYTES);
    png_set_chunk_cache_max(st->png, IMAGE_MAX_CHUNK_CACHE);
    /* ancillary chunks other than tRNS (text, ICC profiles, EXIF, palettes ...) change nothing
     * we decode: skip them unread instead of buffering them */
    png_set_keep_unknown_chunks(st->png, PNG_HANDLE_CHUNK_NEVER, NULL, -1);
    png_set_keep_unknown_chunks(st->png, PNG_HANDLE_CHUNK_AS_DEFAULT, keep_trns, 1);
    png_read_info(st->png, st->info);
    png_get_IHDR(st->png, st->info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    fc = png_get_channels(st->png, st->info); /* as stored: a palette index is one channel */

    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(st->png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(st->png);
    if (png_get_valid(st->png, st->info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(st->png);
    (void)png_set_interlace_handling(st->png);
    png_read_update_info(st->png, st->info);

    c = png_get_channels(st->png, st->info);
    bd = png_get_bit_depth(st->png, st->info);
    rowbytes = png_get_rowbytes(st->png, st->info);
    if (c < 1 || c > 4 || (bd != 8 && bd != 16) || rowbytes != (size_t)w * (size_t)c * (bd / 8))
        png_error(st->png, "unexpected pixel layout after expansion");
    png_rd_check_size(st, w, h, depth, fc, c);

    st->raw = malloc((size_t)h * rowbytes);
    st->rows = malloc((size_t)h * sizeof *st->rows);
    st->data = malloc((size_t)c * h * w * sizeof *st->data);
    if (!st->raw || !st->rows || !st->data) {
        st->e.nomem = 1;
        png_error(st->png, "out of memory");
    }
    for (y = 0; y < h; y++) st->rows[y] = st->raw + (size_t)y * rowbytes;
    png_read_image(st->png, st->rows);
    /* reads up to IEND: a file cut off after its image data is still reported as truncated */
    png_read_end(st->png, NULL);

    for (y = 0; y < h; y++) {
        const unsigned char *r = st->rows[y];
        for (x = 0; x < w; x++) {
            for (ch = 0; ch < c; ch++) {
                float v;
                if (bd == 8) {
                    v = (float)r[(size_t)x * c + ch] / 255.0f;
                } else {
                    const unsigned char *p = r + 2 * ((size_t)x * c + ch); /* big-endian */
                    v = (float)((unsigned)p[0] << 8 | p[1]) / 65535.0f;
                }
                st->data[((size_t)ch * h + y) * w + x] = v;
            }
        }
    }
    st->c = c;
    st->h = (int)h;
    st->w = (int)w;
    return 0;
}

enum image_status image_load_png(const char *path, struct image *out, char *err, size_t errlen)
{
    enum image_status rc = IMAGE_ERR_ARG;
    struct png_rd st;
    unsigned char sig[IMAGE_PNG_HEAD_BYTES];
    struct stat sb;
    size_t got;

    memset(&st, 0, sizeof st);
    if (err && errlen) err[0] = '\0';
    if (!out) {
        fsio_err(err, errlen, "image_load_png: NULL output");
        return IMAGE_ERR_ARG;
    }
    memset(out, 0, sizeof *out);
    if (!path) {
        fsio_err(err, errlen, "image_load_png: NULL path");
        goto done;
    }
    rc = IMAGE_ERR_IO;
    /* regular files only: a FIFO or device named *.png must not block or be read (fsio.h) */
    st.fp = fsio_fopen_read(path, err, errlen);
    if (!st.fp) goto done;
    if (fstat(fileno(st.fp), &sb) != 0) {
        fsio_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    st.file_bytes = (uint64_t)sb.st_size;
    rc = IMAGE_ERR_FORMAT;
    got = fread(sig, 1, sizeof sig, st.fp);
    if (got == 0 && ferror(st.fp)) {
        rc = IMAGE_ERR_IO;
        fsio_err(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        goto done;
    }
    if (got < 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fsio_err(err, errlen, "'%s' is not a PNG file (%s)", path,
                got == 0 ? "empty" : "bad signature");
        goto done;
    }
    /* the header check an upload runs (image_png_probe) is the decoder's first step too, so
     * nothing the probe refuses decodes: libpng alone skips an ancillary chunk placed before
     * IHDR, which the PNG specification forbids and the probe refuses */
    {
        int pw, ph, pc;
        char perr[300];
        if (image_png_probe(sig, got, st.file_bytes, &pw, &ph, &pc, perr, sizeof perr) != IMAGE_OK) {
            fsio_err(err, errlen, "cannot decode '%s': %s", path, perr);
            goto done;
        }
    }
    if (fseek(st.fp, 8, SEEK_SET) != 0) {
        rc = IMAGE_ERR_IO;
        fsio_err(err, errlen, "cannot seek in '%s': %s", path, strerror(errno));
        goto done;
    }
    rc = IMAGE_ERR_NOMEM;
    st.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &st.e, png_err_fn, png_warn_fn);
    if (st.png) st.info = png_create_info_struct(st.png);
    if (!st.png || !st.info) {
        fsio_err(err, errlen, "'%s': cannot create the libpng reader", path);
        goto done;
    }
    if (png_rd_run(&st) != 0) {
        rc = st.e.nomem ? IMAGE_ERR_NOMEM : IMAGE_ERR_FORMAT;
        fsio_err(err, errlen, "cannot decode '%s': %s", path, st.e.msg[0] ? st.e.msg : "corrupt");
        goto done;
    }
    out->c = st.c;
    out->h = st.h;
    out->w = st.w;
    out->data = st.data;
    st.data = NULL;
    rc = IMAGE_OK;
done:
    if (st.png) png_destroy_read_struct(&st.png, st.info ? &st.info : NULL, NULL);
    if (st.fp) fclose(st.fp);
    free(st.raw);
    free(st.rows);
    free(st.data);
    return rc;
}

/* ---- channels ---- */

enum image_status image_to_channels(struct image *img, int channels)
{
    size_t hw, i;
    float *d;
    int c;

    if (!img || !img->data || img->c < 1 || img->c > 4 || (channels != 1 && channels != 3))
        return IMAGE_ERR_ARG;
    c = img->c;
    if (c == channels) return IMAGE_OK;
    hw = (size_t)img->h * img->w;
    d = malloc((size_t)channels * hw * sizeof *d);
    if (!d) return IMAGE_ERR_NOMEM;
    for (i = 0; i < hw; i++) {
        const float *s = img->data;
        float a = (c == 2 || c == 4) ? s[(size_t)(c - 1) * hw + i] : 1.0f;
        float r, g, b;
        if (c <= 2) {
            r = g = b = s[i] * a;
        } else {
            r = s[i] * a;
            g = s[hw + i] * a;
            b = s[2 * hw + i] * a;
        }
        if (channels == 1) {
            d[i] = c <= 2 ? r : 0.299f * r + 0.587f * g + 0.114f * b;
        } else {
            d[i] = r;
            d[hw + i] = g;
            d[2 * hw + i] = b;
        }
    }
    free(img->data);
    img->data = d;
    img->c = channels;
    return IMAGE_OK;
}

/* ---- resampling ---- */

/* One axis of a resample: output j (of n_out, after the crop offset) reads taps input samples
 * starting at first[j] with weights w[j * maxtaps + t]. */
struct img_axis {
    int n_out, maxtaps;
    int *first, *taps;
    double *w;
};

static void img_axis_free(struct img_axis *a)
{
    free(a->first);
    free(a->taps);
    free(a->w);
    memset(a, 0, sizeof *a); /* img_axis_make frees on failure and the caller frees again */
}

/* Map the n_in samples onto a virtual axis of length n_res and keep outputs off .. off+n_out-1. */
static int img_axis_make(struct img_axis *a, int n_in, int n_res, int off, int n_out)
{
    int j, t;
    memset(a, 0, sizeof *a);
    /* a shrinking output pixel spans in/res <= n_in input pixels: ceil(span) + 1 taps at most */
    a->maxtaps = n_res < n_in ? (n_in + n_res - 1) / n_res + 1 : 2;
    a->n_out = n_out;
    a->first = malloc((size_t)n_out * sizeof *a->first);
    a->taps = malloc((size_t)n_out * sizeof *a->taps);
    a->w = calloc((size_t)n_out * a->maxtaps, sizeof *a->w);
    if (!a->first || !a->taps || !a->w) {
        img_axis_free(a);
        return -1;
    }
    for (j = 0; j < n_out; j++) {
        int64_t jj = (int64_t)j + off;
        double *w = a->w + (size_t)j * a->maxtaps;
        if (n_res == n_in) {
            a->first[j] = (int)jj;
            a->taps[j] = 1;
            w[0] = 1.0;
        } else if (n_res < n_in) {
            /* area: in units of 1/n_res input pixels, output jj covers [jj*n_in, (jj+1)*n_in)
             * and input i covers [i*n_res, (i+1)*n_res); integer overlaps, so exact */
            int64_t lo = jj * n_in, hi = (jj + 1) * n_in;
            int i0 = (int)(lo / n_res), i1 = (int)((hi - 1) / n_res);
            a->first[j] = i0;
            a->taps[j] = i1 - i0 + 1;
            for (t = 0; t <= i1 - i0; t++) {
                int64_t plo = (int64_t)(i0 + t) * n_res, phi = plo + n_res;
                int64_t ov = (phi < hi ? phi : hi) - (plo > lo ? plo : lo);
                w[t] = (double)ov / (double)n_in;
            }
        } else {
            double src = ((double)jj + 0.5) * (double)n_in / (double)n_res - 0.5;
            int i0;
            double l;
            if (src < 0) src = 0;
            i0 = (int)floor(src);
            if (i0 > n_in - 1) i0 = n_in - 1;
            l = src - i0;
            a->first[j] = i0;
            if (i0 + 1 < n_in) {
                a->taps[j] = 2;
                w[0] = 1.0 - l;
                w[1] = l;
            } else {
                a->taps[j] = 1;
                w[0] = 1.0;
            }
        }
    }
    return 0;
}

enum image_status image_resize_square(float *dst, const struct image *img, int size)
{
    enum image_status rc = IMAGE_ERR_ARG;
    struct img_axis ax, ay;
    double *tmp = NULL;
    int rh, rw, ox, oy, y0, y1, c, y, x, t;
    int64_t h, w;

    memset(&ax, 0, sizeof ax);
    memset(&ay, 0, sizeof ay);
    if (!dst || !img || !img->data || img->c < 1 || img->h < 1 || img->w < 1 || size < 1 ||
        size > IMAGE_MAX_SIDE)
        goto done;
    h = img->h;
    w = img->w;
    /* the shorter side becomes size; the longer one round(long * size / short), >= size */
    if (h <= w) {
        rh = size;
        rw = (int)((2 * w * size + h) / (2 * h));
    } else {
        rw = size;
        rh = (int)((2 * h * size + w) / (2 * w));
    }
    if (rw < size) rw = size;
    if (rh < size) rh = size;
    ox = (rw - size) / 2;
    oy = (rh - size) / 2;

    rc = IMAGE_ERR_NOMEM;
    if (img_axis_make(&ax, img->w, rw, ox, size) || img_axis_make(&ay, img->h, rh, oy, size))
        goto done;
    /* only the input rows some output row reads */
    y0 = ay.first[0];
    y1 = ay.first[size - 1] + ay.taps[size - 1] - 1;
    tmp = malloc((size_t)(y1 - y0 + 1) * size * sizeof *tmp);
    if (!tmp) goto done;

    for (c = 0; c < img->c; c++) {
        const float *src = img->data + (size_t)c * img->h * img->w;
        float *out = dst + (size_t)c * size * size;
        for (y = y0; y <= y1; y++) {
            const float *row = src + (size_t)y * img->w;
            double *trow = tmp + (size_t)(y - y0) * size;
            for (x = 0; x < size; x++) {
                const double *wt = ax.w + (size_t)x * ax.maxtaps;
                double s = 0;
                for (t = 0; t < ax.taps[x]; t++) s += wt[t] * row[ax.first[x] + t];
                trow[x] = s;
            }
        }
        for (y = 0; y < size; y++) {
            const double *wt = ay.w + (size_t)y * ay.maxtaps;
            for (x = 0; x < size; x++) {
                double s = 0;
                for (t = 0; t < ay.taps[y]; t++)
                    s += wt[t] * tmp[(size_t)(ay.first[y] + t - y0) * size + x];
                out[(size_t)y * size + x] = (float)(2.0 * s - 1.0);
            }
        }
    }
    rc = IMAGE_OK;
done:
    img_axis_free(&ax);
    img_axis_free(&ay);
    free(tmp);
    return rc;
}

/* ---- encoding ---- */

static unsigned char img_quantise(float v)
{
    if (!(v > -1.0f)) return 0; /* also NaN */
    if (v >= 1.0f) return 255;
    return (unsigned char)floorf((v + 1.0f) * 127.5f + 0.5f);
}

struct png_wr {
    png_structp png;
    png_infop info;
    unsigned char *row; /* w * c bytes */
    const float *chw;
    int c, h, w;
    struct png_errctx e;
    unsigned char *buf; /* the encoded file, grown by png_wr_data */
    size_t len, cap;
    int oom;
};

/* libpng's output into st->buf: the file is written in one piece by fsio_write_atomic, so a
 * failed write reports its errno there instead of libpng's bare "Write Error" */
static void png_wr_data(png_structp png, png_bytep data, size_t n)
{
    struct png_wr *st = png_get_io_ptr(png);
    if (n > st->cap - st->len) {
        size_t cap = st->cap ? st->cap : 4096;
        while (cap - st->len < n && cap < ((size_t)1 << 40)) cap *= 2;
        unsigned char *b = cap - st->len >= n ? realloc(st->buf, cap) : NULL;
        if (!b) {
            st->oom = 1;
            png_error(png, "out of memory encoding the PNG");
        }
        st->buf = b;
        st->cap = cap;
    }
    memcpy(st->buf + st->len, data, n);
    st->len += n;
}

static void png_wr_flush(png_structp png) { (void)png; }

/* Same setjmp discipline as png_rd_run: nothing local is read after the longjmp. */
static int png_wr_run(struct png_wr *st)
{
    size_t hw = (size_t)st->h * st->w;
    int y, x, ch;

    if (setjmp(png_jmpbuf(st->png))) return -1;
    png_set_write_fn(st->png, st, png_wr_data, png_wr_flush);
    png_set_IHDR(st->png, st->info, (png_uint_32)st->w, (png_uint_32)st->h, 8,
                 st->c == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(st->png, st->info);
    for (y = 0; y < st->h; y++) {
        for (x = 0; x < st->w; x++)
            for (ch = 0; ch < st->c; ch++)
                st->row[(size_t)x * st->c + ch] =
                    img_quantise(st->chw[(size_t)ch * hw + (size_t)y * st->w + x]);
        png_write_row(st->png, st->row);
    }
    png_write_end(st->png, NULL);
    return 0;
}

enum image_status image_save_png(const char *path, const float *chw, int c, int h, int w,
                                 char *err, size_t errlen)
{
    enum image_status rc = IMAGE_ERR_ARG;
    struct png_wr st;

    memset(&st, 0, sizeof st);
    if (err && errlen) err[0] = '\0';
    if (!path || !*path || !chw || (c != 1 && c != 3) || h < 1 || w < 1 ||
        h > IMAGE_MAX_SIDE * 4 || w > IMAGE_MAX_SIDE * 4) {
        fsio_err(err, errlen, "image_save_png: bad argument (path, data, c=%d, %dx%d)", c, h, w);
        goto done;
    }
    st.chw = chw;
    st.c = c;
    st.h = h;
    st.w = w;

    rc = IMAGE_ERR_NOMEM;
    st.row = malloc((size_t)w * c);
    if (!st.row) {
        fsio_err(err, errlen, "out of memory saving '%s'", path);
        goto done;
    }
    st.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &st.e, png_err_fn, png_warn_fn);
    if (st.png) st.info = png_create_info_struct(st.png);
    if (!st.png || !st.info) {
        fsio_err(err, errlen, "'%s': cannot create the libpng writer", path);
        goto done;
    }
    if (png_wr_run(&st) != 0) {
        rc = st.oom ? IMAGE_ERR_NOMEM : IMAGE_ERR_IO;
        fsio_err(err, errlen, "cannot encode '%s': %s", path,
                st.e.msg[0] ? st.e.msg : "libpng error");
        goto done;
    }
    /* temp in the same folder, every byte, fsync, rename, fsync of the folder (fsio.h) */
    rc = IMAGE_ERR_IO;
    struct fsio_buf b = {st.buf, st.len};
    if (fsio_write_atomic(path, &b, 1, err, errlen)) goto done;
    rc = IMAGE_OK;
done:
    if (st.png) png_destroy_write_struct(&st.png, st.info ? &st.info : NULL);
    free(st.row);
    free(st.buf);
    return rc;
}

/* libpng's read or write structs with zlib's inflate (32 KiB window) or deflate (~268 KiB at
 * the default level) state, rounded up */
#define IMAGE_PNG_READ_STATE_BYTES ((int64_t)96 << 10)
#define IMAGE_PNG_WRITE_STATE_BYTES ((int64_t)384 << 10)

int64_t image_decode_plan_bytes(int64_t pixels, int size)
{
    int64_t side = pixels < IMAGE_MAX_SIDE ? pixels : IMAGE_MAX_SIDE; /* the rows, at most */
    /* png_rd_run: rows of 4 x 16 bits and their pointers, then 4 float planes; freed only after
     * image_to_channels made its 3 planes beside them */
    int64_t decode = pixels * 8 + side * (int64_t)sizeof(void *) + pixels * 16;
    int64_t channels = pixels * 16 + pixels * 12;
    /* image_resize_square: a double row of size per input row read, and each axis's taps */
    int64_t resize = pixels * 16 + side * size * (int64_t)sizeof(double) +
                     2 * (int64_t)size * ((side / size + 2) * (int64_t)sizeof(double) + 8);
    int64_t most = decode > channels ? decode : channels;
    return (resize > most ? resize : most) + IMAGE_PNG_READ_STATE_BYTES;
}

int64_t image_grid_plan_bytes(int n, int c, int h, int w, int cols, int pad)
{
    if (n < 1) return 0;
    if (cols > n) cols = n;
    if (cols < 1) cols = 1;
    int64_t rows = (n + cols - 1) / cols;
    int64_t gw = (int64_t)cols * w + (int64_t)(cols - 1) * pad;
    int64_t gh = rows * h + (rows - 1) * pad;
    int64_t raw = c * gh * gw + gh; /* the PNG's filtered rows: what it compresses */
    /* the float canvas, one row of bytes, the encoded file in a buffer that doubles as it grows
     * and is copied as it does (deflate never outputs more than its input + 0.1% + 12 a block) */
    return c * gh * gw * (int64_t)sizeof(float) + gw * c + 3 * (raw + raw / 1000 + 4096) +
           IMAGE_PNG_WRITE_STATE_BYTES;
}

enum image_status image_save_grid_png(const char *path, const float *nchw, int n, int c, int h,
                                      int w, int cols, int pad, char *err, size_t errlen)
{
    enum image_status rc = IMAGE_ERR_ARG;
    float *g = NULL;
    int rows, gh, gw, i, ch, y;
    int64_t gh64, gw64;

    if (err && errlen) err[0] = '\0';
    if (!path || !nchw || n < 1 || (c != 1 && c != 3) || h < 1 || w < 1 || cols < 1 || pad < 0) {
        fsio_err(err, errlen, "image_save_grid_png: bad argument (n=%d c=%d %dx%d cols=%d pad=%d)",
                n, c, h, w, cols, pad);
        goto done;
    }
    if (cols > n) cols = n;
    rows = (n + cols - 1) / cols;
    gw64 = (int64_t)cols * w + (int64_t)(cols - 1) * pad;
    gh64 = (int64_t)rows * h + (int64_t)(rows - 1) * pad;
    if (gw64 > IMAGE_MAX_SIDE * 4 || gh64 > IMAGE_MAX_SIDE * 4) {
        fsio_err(err, errlen, "grid of %lldx%lld pixels for '%s' is too large", (long long)gh64,
                (long long)gw64, path);
        goto done;
    }
    gw = (int)gw64;
    gh = (int)gh64;
    rc = IMAGE_ERR_NOMEM;
    g = malloc((size_t)c * gh * gw * sizeof *g);
    if (!g) {
        fsio_err(err, errlen, "out of memory building the grid for '%s'", path);
        goto done;
    }
    for (size_t k = 0; k < (size_t)c * gh * gw; k++) g[k] = -1.0f;
    for (i = 0; i < n; i++) {
        int gy = (i / cols) * (h + pad), gx = (i % cols) * (w + pad);
        for (ch = 0; ch < c; ch++)
            for (y = 0; y < h; y++)
                memcpy(g + ((size_t)ch * gh + gy + y) * gw + gx,
                       nchw + (((size_t)i * c + ch) * h + y) * w, (size_t)w * sizeof *g);
    }
    rc = image_save_png(path, g, c, gh, gw, err, errlen);
done:
    free(g);
    return rc;
}
