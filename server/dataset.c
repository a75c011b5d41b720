/* dataset.c - PNG-folder and Fashion-MNIST datasets in memory (Fashion-MNIST as its bytes, made
 * float per batch), the seeded train/validation split, the Philox-driven per-epoch order and
 * batches, and the pthread prefetcher (a ring of ready batches, reset on a step jump).
 */
#define _POSIX_C_SOURCE 200809L

#include "dataset.h"

#include "fsio.h"
#include "image.h"
#include "philox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define DATASET_MAX_SIZE 4096
#define DATASET_MAX_LOADER_DEPTH 8
#define FMNIST_SIDE 28
/* zlib's documented upper bound on deflate's expansion (one byte of stream -> 1032 bytes) */
#define DATASET_DEFLATE_MAX_RATIO 1032u
/* image memory grows (doubling) as images load, starting at about this many bytes */
#define DATASET_GROW_FIRST_BYTES ((size_t)16 << 20)
/* what a gzFile reading holds: zlib's inflate state and 32 KiB window, gzio's buffers */
#define DATASET_ZLIB_BYTES ((int64_t)2 * (7 << 10) + 2 * (32 << 10) + 2 * (64 << 10))

/* Where one image held as bytes lies in px: its decoded samples (C,H,W) in the file's own
 * channels and size, 1 byte each (v / 255) or 2 (v / 65535, native order) */
struct dataset_src {
    int64_t off;
    uint16_t w, h;
    uint8_t c, bps;
};

struct dataset {
    int n, c, s;
    size_t cap;      /* images x or px has room for (>= n), or records src has room for */
    float *x;        /* images held as float (N,C,S,S) in [-1, 1]; NULL when held as bytes */
    /* images held as bytes, made float per image by dataset_fetch with the arithmetic their
     * decode used (v / 255.0f or v / 65535.0f, image_to_channels, then 2v - 1 or
     * image_resize_square), so every batch is bit for bit what holding the floats gave:
     * Fashion-MNIST's (N,28,28) (src NULL), or a folder's images back to back (src) */
    uint8_t *px;
    struct dataset_src *src; /* (cap) a folder held as bytes; NULL otherwise */
    size_t px_len, px_cap;   /* a folder's bytes in px, and its room */
    int64_t max_pixels;      /* a folder held as bytes: the bound on one image's w x h it was
                              * planned with (dataset_open_folder) */
    void *map;               /* a samples file mapped read-only (px and src point into it) */
    size_t map_len;
    enum dataset_fit fit;
    float lut[256];  /* each byte's value at its own size, (float)(2.0 * (k / 255.0f) - 1.0) */
    uint8_t *labels; /* (N) or NULL */
    int *train;      /* (ntrain) image indices, ascending */
    int ntrain;
    int *val; /* (nval) image indices, ascending; NULL before any dataset_split */
    int nval;
};

struct dataset_order {
    const struct dataset *ds;
    uint64_t seed;
    int64_t epoch; /* whose permutation perm holds; -1: none yet */
    int *perm;     /* (ntrain) */
};

struct dataset_loader {
    const struct dataset *ds;
    struct dataset_order *order; /* the worker's own */
    int batch, flip, depth;
    size_t xlen;  /* floats per batch: batch*C*S*S */
    float *xbuf;  /* (depth, batch, C, S, S) */
    int *lbuf;    /* (depth, batch) */
    int64_t slot_step[DATASET_MAX_LOADER_DEPTH];
    enum dataset_status slot_rc[DATASET_MAX_LOADER_DEPTH];
    /* guarded by mu: the ring holds count ready batches from head on; the worker fills slot
     * (head + count) % depth outside the lock and commits it only if gen is unchanged */
    pthread_mutex_t mu;
    pthread_cond_t ready, space;
    int head, count, stop;
    int64_t next_step; /* the step the worker fills next */
    int64_t expect;    /* the step the consumer should ask for next */
    uint64_t gen;      /* bumped by a reset: in-flight work of an older gen is dropped */
    pthread_t thread;
    int have_mu, have_ready, have_space, have_thread;
};

void dataset_free(struct dataset *ds)
{
    if (!ds) return;
    free(ds->x);
    if (ds->map) {
        munmap(ds->map, ds->map_len);
    } else {
        free(ds->px);
        free(ds->src);
    }
    free(ds->labels);
    free(ds->train);
    free(ds->val);
    free(ds);
}

/* An empty dataset of c x s x s images, with labels for up to max_n images when with_labels.
 * Image memory comes later from dataset_reserve, as images actually load: a header or a folder
 * listing that promises a million images must not size an allocation by itself. */
static struct dataset *dataset_alloc(int max_n, int c, int s, int with_labels)
{
    struct dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->c = c;
    ds->s = s;
    if (with_labels && !(ds->labels = malloc((size_t)max_n))) {
        dataset_free(ds);
        return NULL;
    }
    return ds;
}

/* Room for at least count images (capacity doubles, so loading N images costs O(log N)
 * reallocs, which glibc does by remapping pages rather than copying). 0 ok, -1 out of memory
 * (ds unchanged). */
/* bytes one image is held in */
static size_t stored_bytes(const struct dataset *ds)
{
    return ds->px ? (size_t)FMNIST_SIDE * FMNIST_SIDE : (size_t)ds->c * ds->s * ds->s * sizeof(float);
}

/* the images' block (px for Fashion-MNIST, else x) */
static void **image_block(struct dataset *ds) { return ds->px ? (void **)&ds->px : (void **)&ds->x; }

static int dataset_reserve(struct dataset *ds, size_t count)
{
    size_t per = stored_bytes(ds), cap = ds->cap;
    void *x, **blk = image_block(ds);
    if (count <= ds->cap) return 0;
    if (!cap) cap = DATASET_GROW_FIRST_BYTES / per;
    if (!cap) cap = 1;
    while (cap < count) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : 2 * cap;
    if (cap > SIZE_MAX / per) return -1;
    x = realloc(*blk, cap * per);
    if (!x) return -1;
    *blk = x;
    ds->cap = cap;
    return 0;
}

/* Room for count more bytes in a folder's px (doubling from DATASET_GROW_FIRST_BYTES, as
 * dataset_reserve). 0 ok, -1 out of memory (ds unchanged). */
static int dataset_reserve_bytes(struct dataset *ds, size_t count)
{
    size_t cap = ds->px_cap;
    uint8_t *p;
    if (count > SIZE_MAX - ds->px_len) return -1;
    if (ds->px_len + count <= cap) return 0;
    if (!cap) cap = DATASET_GROW_FIRST_BYTES;
    while (cap < ds->px_len + count) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    p = realloc(ds->px, cap);
    if (!p) return -1;
    ds->px = p;
    ds->px_cap = cap;
    return 0;
}

/* Give back capacity past n images; a failed shrink keeps the larger block, which is right. */
static void dataset_shrink(struct dataset *ds)
{
    void *x, **blk = image_block(ds);
    if (ds->src) {
        if (ds->n < 1) return;
        if (ds->px_len < ds->px_cap && (x = realloc(ds->px, ds->px_len ? ds->px_len : 1))) {
            ds->px = x;
            ds->px_cap = ds->px_len;
        }
        if ((size_t)ds->n < ds->cap && (x = realloc(ds->src, (size_t)ds->n * sizeof *ds->src))) {
            ds->src = x;
            ds->cap = (size_t)ds->n;
        }
        return;
    }
    if (ds->n < 1 || (size_t)ds->n >= ds->cap) return;
    x = realloc(*blk, (size_t)ds->n * stored_bytes(ds));
    if (!x) return;
    *blk = x;
    ds->cap = (size_t)ds->n;
}

/* Finish a loaded dataset: every image trains. 0 ok, -1 out of memory. */
static int dataset_train_all(struct dataset *ds)
{
    int i;
    free(ds->train);
    free(ds->val);
    ds->val = NULL;
    ds->nval = 0;
    ds->train = malloc((size_t)ds->n * sizeof *ds->train);
    if (!ds->train) {
        ds->ntrain = 0;
        return -1;
    }
    for (i = 0; i < ds->n; i++) ds->train[i] = i;
    ds->ntrain = ds->n;
    return 0;
}

int dataset_count(const struct dataset *ds) { return ds ? ds->n : 0; }
int dataset_channels(const struct dataset *ds) { return ds ? ds->c : 0; }
int dataset_size(const struct dataset *ds) { return ds ? ds->s : 0; }

/* the value table of held bytes: what decoding a byte k and resizing it to its own size give */
static void dataset_init_lut(struct dataset *ds)
{
    for (int k = 0; k < 256; k++) ds->lut[k] = (float)(2.0 * (double)((float)k / 255.0f) - 1.0);
}

/* One image held as bytes, p (c,h,w) of bps bytes a sample, into dst (C,S,S) by ds's fit and
 * channels, with the arithmetic a decode of the file gives (image_load_png's v / 255.0f or
 * v / 65535.0f, image_to_channels, image_resize_square): the one way held bytes become float.
 * Fashion-MNIST padded: centred on -1. At its own size with channels kept or grey replicated: the
 * table (what image_resize_square's copy gives). Otherwise through the image functions; grey to
 * RGB resizes the grey plane once and replicates it (image_to_channels' replication commutes
 * with the per-plane resize). */
static enum dataset_status dataset_draw(const struct dataset *ds, const uint8_t *p, int w, int h,
                                        int c, int bps, float *dst)
{
    size_t plane = (size_t)ds->s * ds->s, hw = (size_t)w * h;
    int planes = ds->c;
    if (ds->fit == DATASET_FIT_PAD) {
        int off = (ds->s - w) / 2;
        for (size_t k = 0; k < plane; k++) dst[k] = -1.0f;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                dst[(size_t)(y + off) * ds->s + x + off] = ds->lut[p[(size_t)y * w + x]];
        planes = 1;
    } else if (w == ds->s && h == ds->s && bps == 1 && (c == ds->c || c == 1)) {
        for (size_t k = 0; k < (size_t)c * plane; k++) dst[k] = ds->lut[p[k]];
        planes = c;
    } else {
        struct image im = {c, h, w, malloc((size_t)c * hw * sizeof(float))};
        enum image_status ir = IMAGE_ERR_NOMEM;
        if (im.data) {
            for (size_t k = 0; k < (size_t)c * hw; k++) {
                if (bps == 1) {
                    im.data[k] = (float)p[k] / 255.0f;
                } else {
                    uint16_t u;
                    memcpy(&u, p + 2 * k, sizeof u);
                    im.data[k] = (float)u / 65535.0f;
                }
            }
            ir = c == 1 ? IMAGE_OK : image_to_channels(&im, ds->c);
            if (ir == IMAGE_OK) ir = image_resize_square(dst, &im, ds->s);
        }
        image_free(&im);
        if (ir != IMAGE_OK) return ir == IMAGE_ERR_NOMEM ? DATASET_ERR_NOMEM : DATASET_ERR_ARG;
        planes = c == 1 ? 1 : ds->c;
    }
    for (int ch = planes; ch < ds->c; ch++) memcpy(dst + ch * plane, dst, plane * sizeof *dst);
    return DATASET_OK;
}

/* image idx (in range) into dst (C,S,S) */
static enum dataset_status dataset_fetch(const struct dataset *ds, int idx, float *dst)
{
    if (ds->x) {
        size_t per = (size_t)ds->c * ds->s * ds->s;
        memcpy(dst, ds->x + (size_t)idx * per, per * sizeof *dst);
        return DATASET_OK;
    }
    if (!ds->src)
        return dataset_draw(ds, ds->px + (size_t)idx * FMNIST_SIDE * FMNIST_SIDE, FMNIST_SIDE,
                            FMNIST_SIDE, 1, 1, dst);
    const struct dataset_src *r = &ds->src[idx];
    return dataset_draw(ds, ds->px + r->off, r->w, r->h, r->c, r->bps, dst);
}

enum dataset_status dataset_image(const struct dataset *ds, int i, float *x)
{
    if (!ds || !x || i < 0 || i >= ds->n) return DATASET_ERR_ARG;
    return dataset_fetch(ds, i, x);
}

/* what two draws at once hold (the loader's thread and a validation batch) for a folder held as
 * bytes whose images are at most max_pixels (w x h) each: dataset_draw's float planes (4
 * channels at most) beside their conversion (3), then the converted planes, image_resize_square's
 * double rows and each axis's taps. The resize keeps size of the round(size x long/short)
 * outputs across the longer side, so it reads at most the shorter side's rows (x 1.5 for that
 * rounding at size 1, +2 for the bilinear and area edges) and each output's taps span no more:
 * 1.5 sqrt(max_pixels) + 2 bounds both. */
static int64_t draw_plan_bytes(int64_t max_pixels, int size)
{
    int64_t side = 1;
    while (side * side < max_pixels) side++;
    side += side / 2 + 2;
    int64_t planes = max_pixels * (int64_t)(4 + 3) * (int64_t)sizeof(float);
    int64_t resize = max_pixels * 3 * (int64_t)sizeof(float) +
                     side * size * (int64_t)sizeof(double) +
                     2 * (int64_t)size * ((side / size + 2) * (int64_t)sizeof(double) + 8);
    return 2 * (planes > resize ? planes : resize);
}

int64_t dataset_bytes(const struct dataset *ds)
{
    if (!ds) return 0;
    int64_t idx = (int64_t)(ds->ntrain + ds->nval) * (int64_t)sizeof(int);
    if (ds->src)
        return (int64_t)ds->px_cap + (int64_t)(ds->cap * sizeof *ds->src) + idx +
               draw_plan_bytes(ds->max_pixels, ds->s);
    return (int64_t)(ds->cap * stored_bytes(ds)) + (ds->labels ? ds->n : 0) + idx;
}

/* whether Fashion-MNIST at channels x size is held as its bytes (else as float: smaller below
 * 28x28 bytes, 8 px grey or 4 px RGB) */
static int fmnist_as_bytes(int channels, int size)
{
    return (int64_t)channels * size * size * (int64_t)sizeof(float) >
           (int64_t)FMNIST_SIDE * FMNIST_SIDE;
}

/* a folder held as its decoded samples (source_bytes), their records and two draws at once */
static int64_t folder_bytes_held(int64_t images, int size, int64_t max_pixels,
                                 int64_t source_bytes)
{
    return source_bytes + images * (int64_t)(sizeof(struct dataset_src) + sizeof(int)) +
           draw_plan_bytes(max_pixels, size);
}

/* whether a folder of images whose decoded samples are source_bytes, none over max_pixels, is
 * held as them: when both are known and that is fewer bytes than the floats at channels x size */
static int folder_as_bytes(int64_t images, int channels, int size, int64_t max_pixels,
                           int64_t source_bytes)
{
    return source_bytes >= 0 && max_pixels > 0 && images > 0 &&
           folder_bytes_held(images, size, max_pixels, source_bytes) <
               images * (channels * (int64_t)size * size * (int64_t)sizeof(float) +
                         (int64_t)sizeof(int));
}

/* the bytes a sample of img (decoded by image_load_png) is held in exactly: 1 when every value
 * is k / 255.0f, else 2 (a 16-bit file's values are k / 65535.0f) */
static int source_bps(const struct image *img)
{
    size_t n = (size_t)img->c * img->w * img->h;
    for (size_t k = 0; k < n; k++) {
        double r = floor((double)img->data[k] * 255.0 + 0.5);
        if (!(r >= 0 && r <= 255) || (float)r / 255.0f != img->data[k]) return 2;
    }
    return 1;
}

/* img's samples (C,H,W) into dst at bps bytes each, as dataset_draw reads them back; -1 when a
 * value is not one a decode gives (dataset_draw would not give it back bit for bit) */
static int source_put(uint8_t *dst, const struct image *img, int bps)
{
    size_t n = (size_t)img->c * img->w * img->h;
    for (size_t k = 0; k < n; k++) {
        float v = img->data[k];
        if (bps == 1) {
            double r = floor((double)v * 255.0 + 0.5);
            if (!(r >= 0 && r <= 255) || (float)r / 255.0f != v) return -1;
            dst[k] = (uint8_t)r;
        } else {
            double r = floor((double)v * 65535.0 + 0.5);
            if (!(r >= 0 && r <= 65535) || (float)r / 65535.0f != v) return -1;
            uint16_t u = (uint16_t)r;
            memcpy(dst + 2 * k, &u, sizeof u);
        }
    }
    return 0;
}

int64_t dataset_source_bytes(const struct image *img)
{
    if (!img || !img->data || img->c < 1 || img->w < 1 || img->h < 1) return 0;
    return (int64_t)img->c * img->w * img->h * source_bps(img);
}

int64_t dataset_plan_bytes(int fmnist, int64_t images, int channels, int size, int64_t max_pixels,
                           int64_t source_bytes)
{
    if (!fmnist && folder_as_bytes(images, channels, size, max_pixels, source_bytes))
        return folder_bytes_held(images, size, max_pixels, source_bytes);
    int64_t per = fmnist && fmnist_as_bytes(channels, size)
                      ? FMNIST_SIDE * FMNIST_SIDE
                      : (int64_t)channels * size * size * (int64_t)sizeof(float);
    /* the images, a label byte each (Fashion-MNIST), an index each (train or validation) */
    return images * (per + (fmnist ? 1 : 0) + (int64_t)sizeof(int));
}

int dataset_label(const struct dataset *ds, int i)
{
    if (!ds || !ds->labels || i < 0 || i >= ds->n) return -1;
    return ds->labels[i];
}

int64_t dataset_plan_load_bytes(int fmnist, int64_t images, int channels, int size,
                                int64_t max_pixels, int64_t source_bytes)
{
    int64_t held = dataset_plan_bytes(fmnist, images, channels, size, max_pixels, source_bytes);
    /* the block starts at DATASET_GROW_FIRST_BYTES and doubles; a realloc that copies instead
     * of remapping (a block on the heap: glibc's mmap threshold rises up to 32 MiB as big
     * blocks are freed, a checkpoint read's for one) holds the old block beside the new */
    int64_t first = (int64_t)DATASET_GROW_FIRST_BYTES;
    int64_t grow = held <= first ? 0 : held < 2 * first ? held / 2 : first;
    /* dataset_split: the permutation and the flags, and the new lists beside the old */
    int64_t split = images * (int64_t)(2 * sizeof(int) + 1 + sizeof(int));
    int64_t open;
    if (fmnist) {
        open = DATASET_ZLIB_BYTES; /* two gz readers; the bytes go straight into the block */
    } else {
        if (max_pixels <= 0) max_pixels = (int64_t)(IMAGE_MAX_DECODED_BYTES / (4 * sizeof(float)));
        /* each relative name (at most a folder and a file name) and its pointer */
        open = images * (int64_t)(2 * DATASET_REPORT_NAME_LEN + sizeof(char *)) +
               image_decode_plan_bytes(max_pixels, size);
    }
    return grow + (split > open ? split : open);
}

/* ---- PNG folders ---- */

struct name_list {
    char **v;
    size_t n, cap;
};

static void name_list_free(struct name_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* process-wide cap on the .png files one folder may list (dataset_set_folder_limit) */
static size_t g_max_files = DATASET_MAX_FILES;

size_t dataset_set_folder_limit(size_t max_files)
{
    size_t old = g_max_files;
    g_max_files = !max_files ? DATASET_MAX_FILES : max_files > INT32_MAX ? INT32_MAX : max_files;
    return old;
}

static int name_list_push(struct name_list *l, const char *s)
{
    size_t len = strlen(s);
    char *d;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    d = malloc(len + 1);
    if (!d) return -1;
    memcpy(d, s, len + 1);
    l->v[l->n++] = d;
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_png_ext(const char *name)
{
    size_t n = strlen(name);
    const char *e;
    if (n < 5) return 0; /* at least one character before ".png" */
    e = name + n - 4;
    return e[0] == '.' && (e[1] == 'p' || e[1] == 'P') && (e[2] == 'n' || e[2] == 'N') &&
           (e[3] == 'g' || e[3] == 'G');
}

/* malloc'd "a/b" (or a copy of b when a is NULL) */
static char *path_join(const char *a, const char *b)
{
    size_t la = a ? strlen(a) : 0, lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    if (a) {
        memcpy(p, a, la);
        p[la] = '/';
        memcpy(p + la + 1, b, lb + 1);
    } else {
        memcpy(p, b, lb + 1);
    }
    return p;
}

/* Append the *.png paths (relative to root) under root/sub; recurse into subdirectories when
 * sub is NULL. An unreadable subdirectory is logged and passed over; an unreadable root fails. */
static enum dataset_status list_pngs(struct name_list *l, const char *root, const char *sub,
                                     dataset_log_fn log_cb, void *log_ctx, char *err, size_t errlen)
{
    enum dataset_status rc = DATASET_ERR_NOMEM;
    char *dirpath = sub ? path_join(root, sub) : path_join(NULL, root);
    char *rel = NULL, *full = NULL;
    DIR *d = NULL;
    struct dirent *de;

    if (!dirpath) goto oom;
    d = opendir(dirpath);
    if (!d) {
        char line[600];
        snprintf(line, sizeof line, "cannot open directory '%s': %s", dirpath, strerror(errno));
        if (!sub) {
            fsio_err(err, errlen, "%s", line);
            rc = DATASET_ERR_IO;
            goto done;
        }
        if (log_cb) log_cb(log_ctx, line);
        rc = DATASET_OK;
        goto done;
    }
    for (;;) {
        struct stat sb;
        int st;
        errno = 0;
        de = readdir(d);
        if (!de) {
            if (errno) {
                fsio_err(err, errlen, "cannot list directory '%s': %s", dirpath, strerror(errno));
                rc = DATASET_ERR_IO;
                goto done;
            }
            break;
        }
        if (de->d_name[0] == '.') continue;
        rel = sub ? path_join(sub, de->d_name) : path_join(NULL, de->d_name);
        full = path_join(root, rel ? rel : "");
        if (!rel || !full) goto oom;
        /* stat follows links; a broken link named *.png is listed and then skipped as
         * unreadable; a FIFO or device is never opened (reading one could block forever) */
        st = stat(full, &sb);
        if (st == 0 && S_ISDIR(sb.st_mode)) {
            enum dataset_status r = sub ? DATASET_OK
                                        : list_pngs(l, root, rel, log_cb, log_ctx, err, errlen);
            if (r != DATASET_OK) {
                rc = r;
                goto done;
            }
        } else if ((st != 0 || S_ISREG(sb.st_mode)) && has_png_ext(de->d_name)) {
            /* checked while listing, so a folder of millions of names is refused before its
             * listing grows past the limit */
            if (l->n >= g_max_files) {
                fsio_err(err, errlen,
                         "'%s' holds more than %zu .png files (DATASET_MAX_FILES); split it or "
                         "remove some",
                         root, g_max_files);
                rc = DATASET_ERR_FORMAT;
                goto done;
            }
            if (name_list_push(l, rel)) goto oom;
        }
        free(rel);
        free(full);
        rel = full = NULL;
    }
    rc = DATASET_OK;
    goto done;
oom:
    rc = DATASET_ERR_NOMEM;
    fsio_err(err, errlen, "out of memory listing '%s'", root);
done:
    if (d) closedir(d);
    free(dirpath);
    free(rel);
    free(full);
    return rc;
}

/* strncpy that always terminates (and keeps -Wformat-truncation quiet about intended cuts) */
static void copy_trunc(char *dst, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static int check_shape(int channels, int size)
{
    return (channels == 1 || channels == 3) && size >= 1 && size <= DATASET_MAX_SIZE;
}

/* 1 when the PNG open on fd (of file_bytes) has a tRNS chunk before its image data: its chunks
 * after IHDR walked by their lengths (each header read, no data), at most
 * DATASET_PROBE_MAX_CHUNKS of them; a walk that stops early (a short read, a length past the
 * file, too many chunks) says 1, the bound's safe side */
#define DATASET_PROBE_MAX_CHUNKS 256
static int png_has_trns(int fd, unsigned long long file_bytes)
{
    unsigned long long off = IMAGE_PNG_HEAD_BYTES;
    for (int k = 0; k < DATASET_PROBE_MAX_CHUNKS; k++) {
        unsigned char h[8];
        if (off + 8 > file_bytes || pread(fd, h, 8, (off_t)off) != 8) return 1;
        unsigned long long len = (unsigned long long)h[0] << 24 | (unsigned long long)h[1] << 16 |
                                 (unsigned long long)h[2] << 8 | h[3];
        if (memcmp(h + 4, "tRNS", 4) == 0) return 1;
        if (memcmp(h + 4, "IDAT", 4) == 0 || memcmp(h + 4, "IEND", 4) == 0) return 0;
        if (len > 0x7fffffffull) return 1;
        off += 12 + len;
    }
    return 1;
}

/* the one folder dataset_folder_probe measured last (the CLI asks for it more than once) */
static pthread_mutex_t probe_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *dir;
    int64_t images, source_bytes, max_pixels;
} probe_last;

enum dataset_status dataset_folder_probe(const char *dir, int64_t *images, int64_t *source_bytes,
                                         int64_t *max_pixels, char *err, size_t errlen)
{
    struct name_list names = {0};
    enum dataset_status rc;
    int64_t n = 0, bytes = 0, most = 0;
    *images = *source_bytes = *max_pixels = -1;
    if (err && errlen) err[0] = '\0';
    if (!dir || !*dir) return DATASET_ERR_ARG;
    pthread_mutex_lock(&probe_mu);
    if (probe_last.dir && strcmp(probe_last.dir, dir) == 0) {
        *images = probe_last.images;
        *source_bytes = probe_last.source_bytes;
        *max_pixels = probe_last.max_pixels;
        pthread_mutex_unlock(&probe_mu);
        return DATASET_OK;
    }
    pthread_mutex_unlock(&probe_mu);
    rc = list_pngs(&names, dir, NULL, NULL, NULL, err, errlen);
    for (size_t i = 0; rc == DATASET_OK && i < names.n; i++) {
        char *full = path_join(dir, names.v[i]), perr[300];
        unsigned char head[IMAGE_PNG_HEAD_BYTES];
        struct stat sb;
        int w, h, c, fd = full ? fsio_open_regular(full, O_RDONLY, perr, sizeof perr) : -1;
        free(full);
        if (fd < 0) continue; /* dataset_open_folder skips it too */
        if (fstat(fd, &sb) == 0 && pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
            image_png_probe(head, sizeof head, (unsigned long long)sb.st_size, &w, &h, &c, perr,
                            sizeof perr) == IMAGE_OK) {
            /* image_load_png's samples: 16-bit depth 2 bytes at most, any other 1; a tRNS
             * chunk adds alpha to grey, RGB and palette */
            int bps = head[24] == 16 ? 2 : 1;
            if ((c == 1 || c == 3) && png_has_trns(fd, (unsigned long long)sb.st_size)) c++;
            n++;
            bytes += (int64_t)w * h * c * bps;
            if ((int64_t)w * h > most) most = (int64_t)w * h;
        }
        close(fd);
    }
    size_t listed = names.n;
    name_list_free(&names);
    if (rc != DATASET_OK) return rc;
    if (n == 0) {
        fsio_err(err, errlen, "no readable .png files in '%s' (or its subdirectories)", dir);
        return DATASET_ERR_EMPTY;
    }
    *images = (int64_t)listed; /* a record each in dataset_open_folder, as it decides */
    *source_bytes = bytes;
    *max_pixels = most;
    pthread_mutex_lock(&probe_mu);
    char *copy = strdup(dir);
    if (copy) {
        free(probe_last.dir);
        probe_last.dir = copy;
        probe_last.images = (int64_t)listed;
        probe_last.source_bytes = bytes;
        probe_last.max_pixels = most;
    }
    pthread_mutex_unlock(&probe_mu);
    return DATASET_OK;
}

/* one dataset_open_folder's state, shared by its folder_* stages: each returns DATASET_OK or the
 * failure's status with its message in err; names, img and ds (until handed out) are freed by
 * the top function */
struct folder_open {
    const char *dir;
    int channels, size;
    int64_t source_bytes, max_pixels; /* as the plan counted them (dataset_folder_probe) */
    dataset_log_fn log_cb;
    void *log_ctx;
    char *err;
    size_t errlen;
    struct name_list names;
    struct dataset *ds;
    struct dataset_report rep;
    struct image img;         /* the image being loaded */
    char ierr[512];           /* why it was skipped */
    int loaded, as_bytes;     /* as_bytes: held as source samples (folder_as_bytes), not floats */
};

/* the folder's .png files listed (list_pngs) and sorted as bytes, independent of readdir order and
 * locale; rep.found counted. list_pngs' status, or DATASET_ERR_EMPTY when there are none */
static enum dataset_status folder_list(struct folder_open *f)
{
    enum dataset_status rc = list_pngs(&f->names, f->dir, NULL, f->log_cb, f->log_ctx, f->err,
                                       f->errlen);
    if (rc != DATASET_OK) return rc;
    f->rep.found = (int)f->names.n;
    if (f->names.n == 0) {
        fsio_err(f->err, f->errlen, "no .png files in '%s' (or its subdirectories)", f->dir);
        return DATASET_ERR_EMPTY;
    }
    qsort(f->names.v, f->names.n, sizeof *f->names.v, name_cmp);
    return DATASET_OK;
}

/* the dataset for every listed file, held as bytes when folder_as_bytes says so (a record per
 * listed file, the bytes as they load) or as floats (room made as images decode):
 * DATASET_ERR_NOMEM */
static enum dataset_status folder_alloc(struct folder_open *f)
{
    size_t n = f->names.n;
    struct dataset *ds = dataset_alloc((int)n, f->channels, f->size, 0);
    f->as_bytes = folder_as_bytes((int64_t)n, f->channels, f->size, f->max_pixels, f->source_bytes);
    if (ds && f->as_bytes) {
        ds->fit = DATASET_FIT_RESIZE;
        ds->max_pixels = f->max_pixels;
        dataset_init_lut(ds);
        if (!(ds->src = malloc(n * sizeof *ds->src))) {
            dataset_free(ds);
            ds = NULL;
        } else {
            ds->cap = n;
        }
    }
    if (!ds) {
        fsio_err(f->err, f->errlen, "out of memory for a dataset from '%s'", f->dir);
        return DATASET_ERR_NOMEM;
    }
    f->ds = ds;
    return DATASET_OK;
}

/* img (decoded from file i, full its path) appended as its source samples: DATASET_ERR_FORMAT
 * when it is over the source_bytes or max_pixels the plan counted (the folder changed since it
 * was checked: refused, not held), DATASET_ERR_NOMEM; *ir IMAGE_ERR_FORMAT with ierr when its
 * samples cannot be held */
static enum dataset_status folder_hold_bytes(struct folder_open *f, size_t i, const char *full,
                                             enum image_status *ir)
{
    struct dataset *ds = f->ds;
    const struct image *img = &f->img;
    int bps = source_bps(img);
    size_t nb = (size_t)img->c * img->w * img->h * (size_t)bps;
    if (ds->px_len + nb > (uint64_t)f->source_bytes || (int64_t)img->w * img->h > f->max_pixels) {
        fsio_err(f->err, f->errlen, "'%s' in '%s' is over the %lld bytes or %lld pixels "
                 "recorded for the folder: it changed after it was checked", f->names.v[i],
                 f->dir, (long long)f->source_bytes, (long long)f->max_pixels);
        return DATASET_ERR_FORMAT;
    }
    if (dataset_reserve_bytes(ds, nb)) {
        fsio_err(f->err, f->errlen, "out of memory for %d images (%zu bytes) from '%s'",
                 f->loaded + 1, ds->px_len + nb, f->dir);
        return DATASET_ERR_NOMEM;
    }
    if (source_put(ds->px + ds->px_len, img, bps)) {
        *ir = IMAGE_ERR_FORMAT;
        snprintf(f->ierr, sizeof f->ierr, "cannot hold '%s' as its samples", full);
    } else {
        ds->src[f->loaded] = (struct dataset_src){(int64_t)ds->px_len, (uint16_t)img->w,
                                                  (uint16_t)img->h, (uint8_t)img->c,
                                                  (uint8_t)bps};
        ds->px_len += nb;
    }
    return DATASET_OK;
}

/* img (decoded from full) converted to the dataset's channels and resized into its next float
 * image; room for it made only once it has decoded (DATASET_ERR_NOMEM); *ir the conversion's
 * status, with ierr when it failed */
static enum dataset_status folder_hold_floats(struct folder_open *f, const char *full,
                                              enum image_status *ir)
{
    struct dataset *ds = f->ds;
    size_t per = (size_t)f->channels * f->size * f->size;
    *ir = image_to_channels(&f->img, f->channels);
    if (*ir == IMAGE_OK && dataset_reserve(ds, (size_t)f->loaded + 1)) {
        fsio_err(f->err, f->errlen, "out of memory for %d images of %dx%dx%d from '%s'",
                 f->loaded + 1, f->channels, f->size, f->size, f->dir);
        return DATASET_ERR_NOMEM;
    }
    if (*ir == IMAGE_OK)
        *ir = image_resize_square(ds->x + (size_t)f->loaded * per, &f->img, f->size);
    if (*ir != IMAGE_OK)
        snprintf(f->ierr, sizeof f->ierr, "cannot convert '%s': %s", full, image_status_name(*ir));
    return DATASET_OK;
}

/* file i that could not be used: named in the report (the first DATASET_REPORT_NAMES of them),
 * the first one's reason kept, and a line to log_cb */
static void folder_skip(struct folder_open *f, size_t i)
{
    struct dataset_report *rep = &f->rep;
    if (rep->skipped < DATASET_REPORT_NAMES)
        copy_trunc(rep->skipped_names[rep->skipped], DATASET_REPORT_NAME_LEN, f->names.v[i]);
    if (rep->skipped == 0) copy_trunc(rep->first_reason, sizeof rep->first_reason, f->ierr);
    rep->skipped++;
    if (f->log_cb) {
        char line[600];
        snprintf(line, sizeof line, "skipped unreadable image: %s", f->ierr);
        f->log_cb(f->log_ctx, line);
    }
}

/* listed file i decoded (image_load_png) and held, or skipped when it does not decode or convert;
 * DATASET_ERR_NOMEM (a decode's or the dataset's memory), DATASET_ERR_FORMAT (folder_hold_bytes) */
static enum dataset_status folder_load(struct folder_open *f, size_t i)
{
    char *full = path_join(f->dir, f->names.v[i]);
    if (!full) {
        fsio_err(f->err, f->errlen, "out of memory loading '%s'", f->dir);
        return DATASET_ERR_NOMEM;
    }
    enum dataset_status rc = DATASET_OK;
    enum image_status ir = image_load_png(full, &f->img, f->ierr, sizeof f->ierr);
    if (ir == IMAGE_OK)
        rc = f->as_bytes ? folder_hold_bytes(f, i, full, &ir) : folder_hold_floats(f, full, &ir);
    free(full);
    image_free(&f->img);
    if (rc != DATASET_OK) return rc;
    if (ir == IMAGE_ERR_NOMEM) {
        fsio_err(f->err, f->errlen, "%s", f->ierr);
        return DATASET_ERR_NOMEM;
    }
    if (ir == IMAGE_OK)
        f->ds->n = ++f->loaded;
    else
        folder_skip(f, i);
    return DATASET_OK;
}

/* after the last file: at least one image loaded (DATASET_ERR_EMPTY naming the first reason),
 * the dataset shrunk to what loaded and every image in the training split (DATASET_ERR_NOMEM) */
static enum dataset_status folder_finish(struct folder_open *f)
{
    f->rep.loaded = f->loaded;
    if (f->loaded == 0) {
        fsio_err(f->err, f->errlen,
                 "no usable image in '%s': all %d .png files are unreadable (first: %s)", f->dir,
                 f->rep.found, f->rep.first_reason);
        return DATASET_ERR_EMPTY;
    }
    dataset_shrink(f->ds);
    if (dataset_train_all(f->ds)) {
        fsio_err(f->err, f->errlen, "out of memory");
        return DATASET_ERR_NOMEM;
    }
    return DATASET_OK;
}

enum dataset_status dataset_open_folder(struct dataset **out, const char *dir, int channels,
                                        int size, int64_t source_bytes, int64_t max_pixels,
                                        struct dataset_report *report,
                                        dataset_log_fn log_cb, void *log_ctx, char *err,
                                        size_t errlen)
{
    struct folder_open f = {.dir = dir, .channels = channels, .size = size,
                            .source_bytes = source_bytes, .max_pixels = max_pixels,
                            .log_cb = log_cb, .log_ctx = log_ctx, .err = err, .errlen = errlen};
    enum dataset_status rc = DATASET_ERR_ARG;
    if (err && errlen) err[0] = '\0';
    if (report) memset(report, 0, sizeof *report);
    if (!out) return DATASET_ERR_ARG;
    *out = NULL;
    if (!dir || !*dir || !check_shape(channels, size))
        fsio_err(err, errlen, "dataset_open_folder: bad argument (dir, channels=%d, size=%d)",
                 channels, size);
    else
        rc = folder_list(&f);
    if (rc == DATASET_OK) rc = folder_alloc(&f);
    for (size_t i = 0; rc == DATASET_OK && i < f.names.n; i++) rc = folder_load(&f, i);
    if (rc == DATASET_OK) rc = folder_finish(&f);
    if (rc == DATASET_OK) {
        *out = f.ds;
        f.ds = NULL;
    }
    if (report) *report = f.rep;
    image_free(&f.img);
    name_list_free(&f.names);
    dataset_free(f.ds);
    return rc;
}

/* ---- Fashion-MNIST (IDX in gzip) ---- */

struct idx_file {
    gzFile gz;
    uint64_t file_bytes; /* on disk (compressed or not) */
    char path[1024];
};

/* Open dir/base.gz, or dir/base when there is no .gz; zlib reads plain files transparently.
 * Regular files only: a FIFO must not block the open (fsio.h). */
static enum dataset_status idx_open(struct idx_file *f, const char *dir, const char *base,
                                    char *err, size_t errlen)
{
    struct stat sb;
    int fd;
    snprintf(f->path, sizeof f->path, "%s/%s.gz", dir, base);
    if (stat(f->path, &sb) != 0 && errno == ENOENT)
        snprintf(f->path, sizeof f->path, "%s/%s", dir, base);
    fd = fsio_open_regular(f->path, O_RDONLY, err, errlen);
    if (fd < 0) return DATASET_ERR_IO;
    if (fstat(fd, &sb) != 0) {
        fsio_err(err, errlen, "cannot stat '%s': %s", f->path, strerror(errno));
        close(fd);
        return DATASET_ERR_IO;
    }
    f->file_bytes = (uint64_t)sb.st_size;
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        fsio_err(err, errlen, "cannot open '%s': out of memory", f->path);
        close(fd);
        return DATASET_ERR_NOMEM;
    }
    return DATASET_OK;
}

/* Read exactly n bytes. 0 ok; else -1 with a message: truncated, corrupt gzip, or I/O. */
static int idx_read(struct idx_file *f, void *buf, size_t n, const char *what, char *err,
                    size_t errlen)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t want = n - done > (1u << 30) ? (1u << 30) : n - done;
        int got = gzread(f->gz, p + done, (unsigned)want);
        if (got <= 0) {
            int zerr = Z_OK;
            const char *zmsg = gzerror(f->gz, &zerr);
            if (got < 0 || (zerr != Z_OK && zerr != Z_BUF_ERROR))
                fsio_err(err, errlen, "cannot read %s of '%s': %s", what, f->path,
                         zerr == Z_ERRNO ? strerror(errno) : zmsg);
            else
                fsio_err(err, errlen, "'%s' is truncated: %s ends after %zu of %zu bytes",
                         f->path, what, done, n);
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Read the IDX header: magic, then ndims big-endian u32 dimensions into dims. The count dims[0]
 * is bounded by DATASET_IDX_MAX_COUNT and by the file itself before anything is sized by it: an
 * uncompressed file must hold exactly header + count * item bytes, and a gzip one cannot
 * decompress to more than DATASET_DEFLATE_MAX_RATIO times its size. */
static enum dataset_status idx_header(struct idx_file *f, uint32_t magic, int ndims,
                                      uint32_t *dims, char *err, size_t errlen)
{
    unsigned char h[16];
    uint64_t hbytes = 4 + 4 * (uint64_t)ndims, item = 1, total;
    uint32_t m;
    int i;
    if (idx_read(f, h, (size_t)hbytes, "the header", err, errlen)) return DATASET_ERR_FORMAT;
    m = be32(h);
    if (m != magic) {
        fsio_err(err, errlen, "'%s' has IDX magic %u, expected %u (%s)", f->path, m, magic,
                 magic == 2051 ? "unsigned bytes, 3 dimensions" : "unsigned bytes, 1 dimension");
        return DATASET_ERR_FORMAT;
    }
    for (i = 0; i < ndims; i++) dims[i] = be32(h + 4 + 4 * i);
    if (dims[0] == 0 || dims[0] > DATASET_IDX_MAX_COUNT) {
        fsio_err(err, errlen, "'%s' declares %u items (expected 1..%u, DATASET_IDX_MAX_COUNT)",
                 f->path, dims[0], DATASET_IDX_MAX_COUNT);
        return DATASET_ERR_FORMAT;
    }
    /* at most 2 u32 dimensions per item: the product fits u64, times a count < 2^24 does too */
    for (i = 1; i < ndims; i++) item *= dims[i];
    if (item > (UINT64_MAX - hbytes) / dims[0]) {
        fsio_err(err, errlen, "'%s' declares %u items of %llu bytes: too large", f->path, dims[0],
                 (unsigned long long)item);
        return DATASET_ERR_FORMAT;
    }
    total = hbytes + item * dims[0];
    if (gzdirect(f->gz) ? total != f->file_bytes
                        : (total - hbytes) / DATASET_DEFLATE_MAX_RATIO > f->file_bytes) {
        fsio_err(err, errlen,
                 "'%s' declares %u items (%llu bytes with the header) but %s %llu bytes%s",
                 f->path, dims[0], (unsigned long long)total,
                 gzdirect(f->gz) ? "the file holds" : "its compressed",
                 (unsigned long long)f->file_bytes,
                 gzdirect(f->gz) ? "" : " cannot hold that much (truncated or corrupt)");
        return DATASET_ERR_FORMAT;
    }
    return DATASET_OK;
}

/* The header's count must be all there is. */
static enum dataset_status idx_expect_end(struct idx_file *f, char *err, size_t errlen)
{
    unsigned char b;
    int got = gzread(f->gz, &b, 1);
    if (got > 0) {
        fsio_err(err, errlen, "'%s' has bytes past the items its header declares", f->path);
        return DATASET_ERR_FORMAT;
    }
    if (got < 0) {
        int zerr;
        fsio_err(err, errlen, "cannot read '%s': %s", f->path, gzerror(f->gz, &zerr));
        return DATASET_ERR_FORMAT;
    }
    /* every item arrived, but a gzip stream cut inside its trailer ends with Z_BUF_ERROR
     * ("unexpected end of file") rather than a failed read: its CRC was never checked */
    {
        int zerr = Z_OK;
        const char *zmsg = gzerror(f->gz, &zerr);
        if (zerr != Z_OK) {
            fsio_err(err, errlen, "'%s' is truncated or corrupt: %s", f->path, zmsg);
            return DATASET_ERR_FORMAT;
        }
    }
    return DATASET_OK;
}

/* one dataset_open_fmnist's state, shared by its fmnist_* stages: each returns DATASET_OK or the
 * failure's status with its message in err; the files are closed and ds (until handed out)
 * freed by the top function */
struct fmnist_open {
    int channels, size;
    enum dataset_fit fit;
    char *err;
    size_t errlen;
    struct idx_file fi, fl; /* the images' file, the labels' */
    struct dataset *ds;
    uint32_t n;             /* images, as both headers declare */
};

/* the split's images and labels files opened (dir/<prefix>-*-idx?-ubyte[.gz]) and their headers
 * read: 28x28 images (DATASET_ERR_FORMAT), as many labels as images (DATASET_ERR_FORMAT);
 * idx_open's and idx_header's statuses */
static enum dataset_status fmnist_headers(struct fmnist_open *f, const char *dir,
                                          enum dataset_fmnist_split split)
{
    const char *prefix = split == DATASET_FMNIST_TRAIN ? "train" : "t10k";
    char base[64];
    uint32_t idims[3], ldims[1];
    enum dataset_status rc;
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    if ((rc = idx_open(&f->fi, dir, base, f->err, f->errlen)) != DATASET_OK) return rc;
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
    if ((rc = idx_open(&f->fl, dir, base, f->err, f->errlen)) != DATASET_OK) return rc;
    if ((rc = idx_header(&f->fi, 2051, 3, idims, f->err, f->errlen)) != DATASET_OK) return rc;
    if ((rc = idx_header(&f->fl, 2049, 1, ldims, f->err, f->errlen)) != DATASET_OK) return rc;
    if (idims[1] != FMNIST_SIDE || idims[2] != FMNIST_SIDE) {
        fsio_err(f->err, f->errlen, "'%s' holds %ux%u images, expected 28x28", f->fi.path,
                 idims[1], idims[2]);
        return DATASET_ERR_FORMAT;
    }
    if (idims[0] != ldims[0]) {
        fsio_err(f->err, f->errlen, "'%s' holds %u images but '%s' %u labels", f->fi.path,
                 idims[0], f->fl.path, ldims[0]);
        return DATASET_ERR_FORMAT;
    }
    f->n = idims[0];
    return DATASET_OK;
}

/* the dataset for n labelled images; px, not x, holds its images (stored_bytes) unless floats
 * are smaller (fmnist_as_bytes): DATASET_ERR_NOMEM */
static enum dataset_status fmnist_alloc(struct fmnist_open *f)
{
    struct dataset *ds = dataset_alloc((int)f->n, f->channels, f->size, 1);
    if (ds && fmnist_as_bytes(f->channels, f->size) && !(ds->px = malloc(1))) {
        dataset_free(ds);
        ds = NULL;
    }
    if (!ds) {
        fsio_err(f->err, f->errlen, "out of memory for %u images of %dx%dx%d", f->n, f->channels,
                 f->size, f->size);
        return DATASET_ERR_NOMEM;
    }
    f->ds = ds;
    return DATASET_OK;
}

/* the n labels read, each a class 0..9, and nothing after them: DATASET_ERR_FORMAT */
static enum dataset_status fmnist_labels(struct fmnist_open *f)
{
    struct dataset *ds = f->ds;
    if (idx_read(&f->fl, ds->labels, f->n, "the labels", f->err, f->errlen))
        return DATASET_ERR_FORMAT;
    for (uint32_t i = 0; i < f->n; i++) {
        if (ds->labels[i] > 9) {
            fsio_err(f->err, f->errlen, "'%s': label %u of item %u is not a class 0..9",
                     f->fl.path, ds->labels[i], i);
            return DATASET_ERR_FORMAT;
        }
    }
    return idx_expect_end(&f->fl, f->err, f->errlen);
}

/* the n images read and held: their bytes as they are (dataset_fetch makes each float when a
 * batch is drawn), or drawn to floats now; the block grown as items arrive, so a gzip stream
 * shorter than its header claims costs only what it holds. A resize that cannot run is refused
 * here, not per batch; nothing may follow the last image. DATASET_ERR_FORMAT, DATASET_ERR_NOMEM,
 * or dataset_draw's / dataset_fetch's status */
static enum dataset_status fmnist_images(struct fmnist_open *f)
{
    struct dataset *ds = f->ds;
    const int channels = f->channels, size = f->size;
    unsigned char px[FMNIST_SIDE * FMNIST_SIDE];
    ds->fit = f->fit;
    dataset_init_lut(ds);
    for (uint32_t i = 0; i < f->n; i++) {
        if (idx_read(&f->fi, px, sizeof px, "the images", f->err, f->errlen))
            return DATASET_ERR_FORMAT;
        if (dataset_reserve(ds, (size_t)i + 1)) {
            fsio_err(f->err, f->errlen, "out of memory for %u images of %dx%dx%d", i + 1, channels,
                     size, size);
            return DATASET_ERR_NOMEM;
        }
        if (ds->px) {
            memcpy(ds->px + (size_t)i * sizeof px, px, sizeof px);
        } else {
            enum dataset_status fr =
                dataset_draw(ds, px, FMNIST_SIDE, FMNIST_SIDE, 1, 1,
                             ds->x + (size_t)i * channels * size * size);
            if (fr != DATASET_OK) {
                fsio_err(f->err, f->errlen, "cannot resize Fashion-MNIST image %u: %s", i,
                         fr == DATASET_ERR_NOMEM ? "out of memory" : "bad size");
                return fr;
            }
        }
        ds->n = (int)i + 1;
    }
    if (f->fit == DATASET_FIT_RESIZE && ds->px) {
        float *probe = malloc((size_t)channels * size * size * sizeof *probe);
        enum dataset_status fr = probe ? dataset_fetch(ds, 0, probe) : DATASET_ERR_NOMEM;
        free(probe);
        if (fr != DATASET_OK) {
            fsio_err(f->err, f->errlen, "cannot resize Fashion-MNIST images to %d: %s", size,
                     fr == DATASET_ERR_NOMEM ? "out of memory" : "bad size");
            return fr;
        }
    }
    return idx_expect_end(&f->fi, f->err, f->errlen);
}

enum dataset_status dataset_open_fmnist(struct dataset **out, const char *dir,
                                        enum dataset_fmnist_split split, int channels, int size,
                                        enum dataset_fit fit, char *err, size_t errlen)
{
    struct fmnist_open f = {.channels = channels, .size = size, .fit = fit, .err = err,
                            .errlen = errlen};
    enum dataset_status rc = DATASET_ERR_ARG;
    if (err && errlen) err[0] = '\0';
    if (!out) return DATASET_ERR_ARG;
    *out = NULL;
    if (!dir || !check_shape(channels, size) ||
        (split != DATASET_FMNIST_TRAIN && split != DATASET_FMNIST_TEST) ||
        (fit != DATASET_FIT_PAD && fit != DATASET_FIT_RESIZE) ||
        (fit == DATASET_FIT_PAD && size < FMNIST_SIDE))
        fsio_err(err, errlen,
                 "dataset_open_fmnist: bad argument (channels=%d, size=%d, fit=%d; padding needs "
                 "size >= 28)",
                 channels, size, (int)fit);
    else
        rc = fmnist_headers(&f, dir, split);
    if (rc == DATASET_OK) rc = fmnist_alloc(&f);
    if (rc == DATASET_OK) rc = fmnist_labels(&f);
    if (rc == DATASET_OK) rc = fmnist_images(&f);
    if (rc == DATASET_OK) {
        dataset_shrink(f.ds);
        if (dataset_train_all(f.ds)) {
            fsio_err(err, errlen, "out of memory");
            rc = DATASET_ERR_NOMEM;
        }
    }
    if (rc == DATASET_OK) {
        *out = f.ds;
        f.ds = NULL;
    }
    if (f.fi.gz) gzclose(f.fi.gz);
    if (f.fl.gz) gzclose(f.fl.gz);
    dataset_free(f.ds);
    return rc;
}

/* ---- a folder's samples file ---- */

/* The file: this header, the records (n x struct dataset_src, offsets into the samples, back to
 * back from 0), the samples (px_len bytes). crc is zlib's CRC-32 of records and samples; order
 * tells a file of another byte order (it never leaves its data directory). */
#define DATASET_SAMPLES_MAGIC "DDPMDSB1"
struct samples_head {
    char magic[8];
    uint64_t n, px_len;
    uint32_t crc, order;
    uint64_t reserved[4];
};

/* CRC-32 of len bytes at p (zlib's, in pieces its uInt can take) */
static uint32_t samples_crc(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len) {
        unsigned piece = len > (1u << 30) ? 1u << 30 : (unsigned)len;
        crc = (uint32_t)crc32(crc, p, piece);
        p += piece;
        len -= piece;
    }
    return crc;
}

enum dataset_status dataset_save_samples(const struct dataset *ds, const char *path, char *err,
                                         size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    if (!ds || !ds->src || !path) {
        fsio_err(err, errlen, "dataset_save_samples: not a folder held as its samples");
        return DATASET_ERR_ARG;
    }
    struct samples_head h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DATASET_SAMPLES_MAGIC, sizeof h.magic);
    h.n = (uint64_t)ds->n;
    h.px_len = ds->px_len;
    h.order = 0x01020304u;
    size_t rec = (size_t)ds->n * sizeof *ds->src;
    h.crc = samples_crc(samples_crc((uint32_t)crc32(0, NULL, 0), (const uint8_t *)ds->src, rec),
                        ds->px, ds->px_len);
    struct fsio_buf bufs[3] = {{&h, sizeof h}, {ds->src, rec}, {ds->px, ds->px_len}};
    return fsio_write_atomic(path, bufs, 3, err, errlen) ? DATASET_ERR_IO : DATASET_OK;
}

enum dataset_status dataset_open_samples(struct dataset **out, const char *path, int channels,
                                         int size, int64_t source_bytes, int64_t max_pixels,
                                         char *err, size_t errlen)
{
    enum dataset_status rc = DATASET_ERR_ARG;
    struct dataset *ds = NULL;
    struct stat sb;
    int fd = -1;

    if (err && errlen) err[0] = '\0';
    if (!out) return DATASET_ERR_ARG;
    *out = NULL;
    if (!path || !check_shape(channels, size)) {
        fsio_err(err, errlen, "dataset_open_samples: bad argument (channels=%d, size=%d)",
                 channels, size);
        return DATASET_ERR_ARG;
    }
    rc = DATASET_ERR_IO;
    fd = fsio_open_regular(path, O_RDONLY, err, errlen);
    if (fd < 0) goto done;
    if (fstat(fd, &sb) != 0) {
        fsio_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    rc = DATASET_ERR_FORMAT;
    if ((uint64_t)sb.st_size < sizeof(struct samples_head) || (uint64_t)sb.st_size > SIZE_MAX) {
        fsio_err(err, errlen, "'%s' is too short for its header", path);
        goto done;
    }
    rc = DATASET_ERR_NOMEM;
    if (!(ds = dataset_alloc(0, channels, size, 0))) goto done;
    ds->map_len = (size_t)sb.st_size;
    ds->map = mmap(NULL, ds->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (ds->map == MAP_FAILED) {
        ds->map = NULL;
        rc = DATASET_ERR_IO;
        fsio_err(err, errlen, "cannot map '%s': %s", path, strerror(errno));
        goto done;
    }
    rc = DATASET_ERR_FORMAT;
    struct samples_head h;
    memcpy(&h, ds->map, sizeof h);
    size_t left = ds->map_len - sizeof h;
    if (memcmp(h.magic, DATASET_SAMPLES_MAGIC, sizeof h.magic) || h.order != 0x01020304u ||
        h.n < 1 || h.n > g_max_files || h.n > left / sizeof(struct dataset_src) ||
        h.px_len != left - h.n * sizeof(struct dataset_src)) {
        fsio_err(err, errlen, "'%s' is not a samples file of its size (header)", path);
        goto done;
    }
    /* the plan's bounds: dataset_open_folder would hold these images as bytes, in as many */
    if (!folder_as_bytes((int64_t)h.n, channels, size, max_pixels, source_bytes)) {
        rc = DATASET_ERR_ARG;
        fsio_err(err, errlen, "at %dx%d the dataset is held as float", channels, size);
        goto done;
    }
    if (h.px_len > (uint64_t)source_bytes) {
        fsio_err(err, errlen, "'%s' holds %llu bytes of %llu images, over the %lld of the plan",
                 path, (unsigned long long)h.px_len, (unsigned long long)h.n,
                 (long long)source_bytes);
        goto done;
    }
    ds->src = (struct dataset_src *)((uint8_t *)ds->map + sizeof h);
    ds->px = (uint8_t *)ds->map + sizeof h + h.n * sizeof(struct dataset_src);
    uint32_t crc = samples_crc(samples_crc((uint32_t)crc32(0, NULL, 0), (const uint8_t *)ds->src,
                                           h.n * sizeof(struct dataset_src)),
                               ds->px, h.px_len);
    if (crc != h.crc) {
        fsio_err(err, errlen, "'%s' fails its checksum (%08x, recorded %08x)", path, crc, h.crc);
        goto done;
    }
    /* records back to back over the samples, each an image a decode gives */
    uint64_t off = 0;
    for (uint64_t i = 0; i < h.n; i++) {
        const struct dataset_src *r = &ds->src[i];
        uint64_t len = (uint64_t)r->c * r->w * r->h * r->bps;
        if (r->off < 0 || (uint64_t)r->off != off || r->c < 1 || r->c > 4 || r->bps < 1 ||
            r->bps > 2 || r->w < 1 || r->h < 1 || r->w > IMAGE_MAX_SIDE ||
            r->h > IMAGE_MAX_SIDE || (int64_t)r->w * r->h > max_pixels ||
            len > h.px_len - off) {
            fsio_err(err, errlen, "'%s': image %llu's record is out of bounds", path,
                     (unsigned long long)i);
            goto done;
        }
        off += len;
    }
    if (off != h.px_len) {
        fsio_err(err, errlen, "'%s': its records cover %llu of %llu bytes", path,
                 (unsigned long long)off, (unsigned long long)h.px_len);
        goto done;
    }
    ds->n = (int)h.n;
    ds->cap = (size_t)h.n;
    ds->px_len = ds->px_cap = (size_t)h.px_len;
    ds->max_pixels = max_pixels;
    ds->fit = DATASET_FIT_RESIZE;
    dataset_init_lut(ds);
    rc = DATASET_ERR_NOMEM;
    if (dataset_train_all(ds)) {
        fsio_err(err, errlen, "out of memory");
        goto done;
    }
    *out = ds;
    ds = NULL;
    rc = DATASET_OK;
done:
    if (fd >= 0) close(fd);
    dataset_free(ds);
    return rc;
}

/* ---- split and order ---- */

/* perm = Fisher-Yates permutation of 0..n-1 from philox (seed, SHUFFLE, step, 0, op, i). */
static void shuffle_perm(int *perm, int n, uint64_t seed, uint64_t step, uint32_t op)
{
    int i;
    for (i = 0; i < n; i++) perm[i] = i;
    for (i = n - 1; i > 0; i--) {
        uint32_t u = philox_u32_at(seed, PHILOX_TAG_SHUFFLE, step, 0, op, (uint32_t)i);
        int j = (int)(((uint64_t)u * (uint64_t)(i + 1)) >> 32);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

enum dataset_status dataset_split(struct dataset *ds, int val_count, uint64_t seed, char *err,
                                  size_t errlen)
{
    enum dataset_status rc = DATASET_ERR_ARG;
    int *perm = NULL, *train = NULL, *val = NULL;
    unsigned char *is_val = NULL;
    int i, nt = 0, nv = 0;

    if (err && errlen) err[0] = '\0';
    if (!ds || val_count < 0 || val_count >= ds->n) {
        fsio_err(err, errlen, "cannot hold out %d of %d images (at least one must train)",
                 val_count, ds ? ds->n : 0);
        goto done;
    }
    rc = DATASET_ERR_NOMEM;
    perm = malloc((size_t)ds->n * sizeof *perm);
    is_val = calloc((size_t)ds->n, 1);
    train = malloc((size_t)(ds->n - val_count) * sizeof *train);
    val = malloc((size_t)(val_count ? val_count : 1) * sizeof *val);
    if (!perm || !is_val || !train || !val) {
        fsio_err(err, errlen, "out of memory splitting %d images", ds->n);
        goto done;
    }
    shuffle_perm(perm, ds->n, seed, 0, 1);
    for (i = 0; i < val_count; i++) is_val[perm[i]] = 1;
    for (i = 0; i < ds->n; i++) {
        if (is_val[i]) val[nv++] = i;
        else train[nt++] = i;
    }
    free(ds->train);
    free(ds->val);
    ds->train = train;
    ds->ntrain = nt;
    ds->val = val;
    ds->nval = nv;
    train = val = NULL;
    rc = DATASET_OK;
done:
    free(perm);
    free(is_val);
    free(train);
    free(val);
    return rc;
}

enum dataset_status dataset_split_fraction(struct dataset *ds, double fraction, uint64_t seed,
                                           char *err, size_t errlen)
{
    double v;
    if (!ds || !(fraction >= 0.0 && fraction < 1.0)) {
        fsio_err(err, errlen, "validation fraction %g is not in [0, 1)", fraction);
        return DATASET_ERR_ARG;
    }
    v = fraction * ds->n + 0.5;
    if (v > ds->n - 1) v = ds->n - 1;
    return dataset_split(ds, (int)v, seed, err, errlen);
}

int dataset_train_count(const struct dataset *ds) { return ds ? ds->ntrain : 0; }
int dataset_val_count(const struct dataset *ds) { return ds ? ds->nval : 0; }

int dataset_train_index(const struct dataset *ds, int j)
{
    return ds && j >= 0 && j < ds->ntrain ? ds->train[j] : -1;
}

int dataset_val_index(const struct dataset *ds, int j)
{
    return ds && j >= 0 && j < ds->nval ? ds->val[j] : -1;
}

enum dataset_status dataset_val_batch(const struct dataset *ds, int first, int count, float *x,
                                      int *labels)
{
    size_t per;
    int i;
    if (!ds || !x || first < 0 || count < 0 || count > ds->nval - first) return DATASET_ERR_ARG;
    per = (size_t)ds->c * ds->s * ds->s;
    for (i = 0; i < count; i++) {
        int idx = ds->val[first + i];
        enum dataset_status rc = dataset_fetch(ds, idx, x + (size_t)i * per);
        if (rc != DATASET_OK) return rc;
        if (labels) labels[i] = ds->labels ? ds->labels[idx] : -1;
    }
    return DATASET_OK;
}

enum dataset_status dataset_epoch_perm(int *perm, const struct dataset *ds, uint64_t seed,
                                       int64_t epoch)
{
    if (!perm || !ds || epoch < 0) return DATASET_ERR_ARG;
    shuffle_perm(perm, ds->ntrain, seed, (uint64_t)epoch, 0);
    return DATASET_OK;
}

int dataset_sample_flipped(uint64_t seed, int64_t k)
{
    return philox_uniform_at(seed, PHILOX_TAG_FLIP, (uint64_t)k, 0, 0, 0) < 0.5f;
}

enum dataset_status dataset_order_init(struct dataset_order **out, const struct dataset *ds,
                                       uint64_t seed)
{
    struct dataset_order *o;
    if (!out) return DATASET_ERR_ARG;
    *out = NULL;
    if (!ds || ds->ntrain < 1) return DATASET_ERR_ARG;
    o = calloc(1, sizeof *o);
    if (!o) return DATASET_ERR_NOMEM;
    o->perm = malloc((size_t)ds->ntrain * sizeof *o->perm);
    if (!o->perm) {
        free(o);
        return DATASET_ERR_NOMEM;
    }
    o->ds = ds;
    o->seed = seed;
    o->epoch = -1;
    *out = o;
    return DATASET_OK;
}

void dataset_order_free(struct dataset_order *o)
{
    if (!o) return;
    free(o->perm);
    free(o);
}

int dataset_order_sample(struct dataset_order *o, int64_t k)
{
    int64_t t, e;
    if (!o || k < 0) return -1;
    t = o->ds->ntrain;
    e = k / t;
    if (e != o->epoch) {
        shuffle_perm(o->perm, (int)t, o->seed, (uint64_t)e, 0);
        o->epoch = e;
    }
    return o->ds->train[o->perm[k % t]];
}

enum dataset_status dataset_batch(struct dataset_order *o, int64_t step, int batch, int flip,
                                  float *x, int *labels)
{
    const struct dataset *ds;
    size_t per;
    int i, c, y, xx, s;

    if (!o || !x || batch < 1 || step < 0 || step > (INT64_MAX - batch) / batch)
        return DATASET_ERR_ARG;
    ds = o->ds;
    s = ds->s;
    per = (size_t)ds->c * s * s;
    for (i = 0; i < batch; i++) {
        int64_t k = step * batch + i;
        int idx = dataset_order_sample(o, k);
        float *dst = x + (size_t)i * per;
        enum dataset_status rc = dataset_fetch(ds, idx, dst);
        if (rc != DATASET_OK) return rc;
        if (flip && dataset_sample_flipped(o->seed, k)) /* each row mirrored in place */
            for (c = 0; c < ds->c; c++)
                for (y = 0; y < s; y++) {
                    float *dr = dst + ((size_t)c * s + y) * s;
                    for (xx = 0; xx < s / 2; xx++) {
                        float t = dr[xx];
                        dr[xx] = dr[s - 1 - xx];
                        dr[s - 1 - xx] = t;
                    }
                }
        if (labels) labels[i] = ds->labels ? ds->labels[idx] : -1;
    }
    return DATASET_OK;
}

/* ---- prefetching loader ---- */

static void *loader_main(void *arg)
{
    struct dataset_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int slot;
        int64_t s;
        uint64_t g;
        enum dataset_status rc;
        while (!l->stop && l->count == l->depth) pthread_cond_wait(&l->space, &l->mu);
        if (l->stop) break;
        slot = (l->head + l->count) % l->depth;
        s = l->next_step;
        g = l->gen;
        pthread_mutex_unlock(&l->mu);
        /* the consumer reads only slots head .. head+count-1, never this one, until committed */
        rc = dataset_batch(l->order, s, l->batch, l->flip, l->xbuf + (size_t)slot * l->xlen,
                           l->lbuf + (size_t)slot * l->batch);
        pthread_mutex_lock(&l->mu);
        if (g == l->gen) {
            l->slot_step[slot] = s;
            l->slot_rc[slot] = rc;
            l->count++;
            l->next_step++;
            pthread_cond_signal(&l->ready);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

enum dataset_status dataset_loader_init(struct dataset_loader **out, const struct dataset *ds,
                                        uint64_t seed, int batch, int flip, int64_t start_step,
                                        int depth, char *err, size_t errlen)
{
    enum dataset_status rc = DATASET_ERR_ARG;
    struct dataset_loader *l = NULL;
    size_t per;

    if (err && errlen) err[0] = '\0';
    if (!out) return DATASET_ERR_ARG;
    *out = NULL;
    if (depth <= 0) depth = 2;
    if (!ds || ds->ntrain < 1 || batch < 1 || start_step < 0 || depth > DATASET_MAX_LOADER_DEPTH) {
        fsio_err(err, errlen, "dataset_loader_init: bad argument (batch=%d, start=%lld, depth=%d)",
                 batch, (long long)start_step, depth);
        goto done;
    }
    per = (size_t)ds->c * ds->s * ds->s;
    rc = DATASET_ERR_NOMEM;
    l = calloc(1, sizeof *l);
    if (!l) goto oom;
    l->ds = ds;
    l->batch = batch;
    l->flip = flip;
    l->depth = depth;
    l->xlen = (size_t)batch * per;
    l->next_step = l->expect = start_step;
    if (l->xlen > SIZE_MAX / sizeof(float) / (size_t)depth) goto oom;
    l->xbuf = malloc((size_t)depth * l->xlen * sizeof *l->xbuf);
    l->lbuf = malloc((size_t)depth * batch * sizeof *l->lbuf);
    if (!l->xbuf || !l->lbuf) goto oom;
    if ((rc = dataset_order_init(&l->order, ds, seed)) != DATASET_OK) goto oom;

    rc = DATASET_ERR_THREAD;
    if (pthread_mutex_init(&l->mu, NULL)) goto thread_fail;
    l->have_mu = 1;
    if (pthread_cond_init(&l->ready, NULL)) goto thread_fail;
    l->have_ready = 1;
    if (pthread_cond_init(&l->space, NULL)) goto thread_fail;
    l->have_space = 1;
    if (pthread_create(&l->thread, NULL, loader_main, l)) goto thread_fail;
    l->have_thread = 1;
    *out = l;
    l = NULL;
    rc = DATASET_OK;
    goto done;
oom:
    rc = DATASET_ERR_NOMEM;
    fsio_err(err, errlen, "out of memory for a prefetch ring of %d batches of %d", depth, batch);
    goto done;
thread_fail:
    fsio_err(err, errlen, "cannot start the dataset prefetch thread");
done:
    dataset_loader_free(l);
    return rc;
}

enum dataset_status dataset_loader_next(struct dataset_loader *l, int64_t step, float *x,
                                        int *labels)
{
    enum dataset_status rc;
    int slot;

    if (!l || !x || step < 0) return DATASET_ERR_ARG;
    pthread_mutex_lock(&l->mu);
    if (step != l->expect) {
        /* a jump: forget the ring; an in-flight batch of the old gen is dropped at commit */
        l->gen++;
        l->head = 0;
        l->count = 0;
        l->next_step = l->expect = step;
        pthread_cond_signal(&l->space);
    }
    while (l->count == 0) pthread_cond_wait(&l->ready, &l->mu);
    slot = l->head;
    rc = l->slot_rc[slot];
    pthread_mutex_unlock(&l->mu);

    /* slot head is ours until we advance head: the worker fills only slots past the ready ones */
    if (rc == DATASET_OK) {
        memcpy(x, l->xbuf + (size_t)slot * l->xlen, l->xlen * sizeof *x);
        if (labels)
            memcpy(labels, l->lbuf + (size_t)slot * l->batch, (size_t)l->batch * sizeof *labels);
    }

    pthread_mutex_lock(&l->mu);
    l->head = (l->head + 1) % l->depth;
    l->count--;
    l->expect++;
    pthread_cond_signal(&l->space);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int64_t dataset_loader_plan_bytes(int depth, int batch, int64_t per, int64_t train_count)
{
    if (depth <= 0) depth = 2;
    return (int64_t)depth * batch * (per * (int64_t)sizeof(float) + (int64_t)sizeof(int)) +
           train_count * (int64_t)sizeof(int);
}

int64_t dataset_loader_bytes(const struct dataset_loader *l)
{
    if (!l) return 0;
    return (int64_t)l->depth * ((int64_t)l->xlen * (int64_t)sizeof(float) +
                                (int64_t)l->batch * (int64_t)sizeof(int)) +
           (int64_t)l->ds->ntrain * (int64_t)sizeof(int);
}

void dataset_loader_free(struct dataset_loader *l)
{
    if (!l) return;
    if (l->have_thread) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->space);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    if (l->have_space) pthread_cond_destroy(&l->space);
    if (l->have_ready) pthread_cond_destroy(&l->ready);
    if (l->have_mu) pthread_mutex_destroy(&l->mu);
    dataset_order_free(l->order);
    free(l->xbuf);
    free(l->lbuf);
    free(l);
}
