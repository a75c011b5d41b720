/* dataset.h - training data in memory, handed out as float (N,C,S,S) in [-1, 1]: a folder of PNGs
 * (held as their decoded samples when those are smaller than floats and known beforehand, else as
 * float) or Fashion-MNIST (IDX + gzip, held as its 28x28 bytes), bytes made float per image as it
 * is drawn, a seeded held-out split, and batches in a Philox-seeded order that is a pure function
 * of (seed, step), with a background-thread prefetcher that returns the same bytes.
 */
#ifndef DDPMD_DATASET_H
#define DDPMD_DATASET_H

#include <stddef.h>
#include <stdint.h>

struct image;

/* Every fallible function returns one of these; 0 = ok. */
enum dataset_status {
    DATASET_OK = 0,
    DATASET_ERR_IO,     /* a directory or file could not be opened or read (errno text in err) */
    DATASET_ERR_FORMAT, /* an IDX file is malformed (magic, dimensions, counts, truncation), or
                         * an input is over a limit below (docs/limits.md) */
    DATASET_ERR_EMPTY,  /* no usable image (empty folder, every file unreadable) */
    DATASET_ERR_NOMEM,  /* allocation failed */
    DATASET_ERR_ARG,    /* invalid argument (NULL, channels, size, split larger than the set) */
    DATASET_ERR_THREAD, /* the prefetch thread could not be started */
};

enum dataset_fmnist_split {
    DATASET_FMNIST_TRAIN = 0, /* train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz, 60000 */
    DATASET_FMNIST_TEST,      /* t10k-images-idx3-ubyte.gz / t10k-labels-idx1-ubyte.gz, 10000 */
};

/* How a 28x28 Fashion-MNIST image becomes size x size. */
enum dataset_fit {
    DATASET_FIT_PAD = 0, /* centred on a background of -1 (offset (size-28)/2); size >= 28 */
    DATASET_FIT_RESIZE,  /* image_resize_square: bilinear up, area down */
};

/* Limits on untrusted input (docs/limits.md); each refusal is DATASET_ERR_FORMAT with the
 * limit's name in the message. Image memory is allocated as images load, never sized by a count
 * read from a header or a listing alone. */
/* .png files one folder (with its immediate subdirectories) may hold; the listing stops there */
#define DATASET_MAX_FILES 1000000u
/* items one IDX file may declare; the count must also fit the file's size (exactly, or at
 * deflate's 1032:1 for gzip) */
#define DATASET_IDX_MAX_COUNT 10000000u

/* Set the process-wide folder limit (0 restores DATASET_MAX_FILES; capped at INT32_MAX) and
 * return the previous one. For tests and tools; not thread-safe against dataset_open_folder. */
size_t dataset_set_folder_limit(size_t max_files);

/* Where the Debian package dataset-fashion-mnist puts the files. */
#define DATASET_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* What dataset_open_folder did with the .png files it found. */
#define DATASET_REPORT_NAMES 8
#define DATASET_REPORT_NAME_LEN 256
struct dataset_report {
    int found;   /* *.png files found (top level and one directory level down) */
    int loaded;  /* decoded into the dataset */
    int skipped; /* unreadable: found - loaded */
    /* the first min(skipped, DATASET_REPORT_NAMES) skipped files, relative to the folder */
    char skipped_names[DATASET_REPORT_NAMES][DATASET_REPORT_NAME_LEN];
    char first_reason[512]; /* why the first one was skipped (names the file) */
};

/* Called once per skipped file with a line "skipped '<path>': <reason>"; ctx is passed back. */
typedef void (*dataset_log_fn)(void *ctx, const char *line);

struct dataset;        /* images (N,C,S,S), optional labels, the train/validation split */
struct dataset_order;  /* a cursor over the training order of one (dataset, seed); one thread */
struct dataset_loader; /* a prefetching batch producer on its own thread */

/* ---- opening ---- */

/* Load every file named *.png (extension case-insensitive; names starting with '.' ignored) in
 * dir and in its immediate subdirectories, in strcmp order of the path relative to dir (so
 * "a/x.png" < "b.png" < "b/y.png"), each converted to channels (1 or 3, see image_to_channels),
 * resized and centre-cropped to size x size (image_resize_square). Files that cannot be decoded are
 * skipped, counted in *report (may be NULL) and passed to log_cb (may be NULL). No labels.
 * source_bytes and max_pixels: what the images' decoded samples come to (dataset_source_bytes
 * summed over the folder) and the largest width x height of one, as an upload records them (<= 0
 * or < 0: unknown). When both are known and the samples, a 16-byte record per image and what two
 * draws at once hold (dataset_bytes) are fewer bytes than the floats at channels x size, the
 * images are held as those samples (8 or 16 bit, each in its file's own channels and size) and
 * made float as they are drawn, bit for bit what converting them up front gives; a folder
 * whose samples then come to more than source_bytes or an image to more than max_pixels (it
 * changed since it was counted) is DATASET_ERR_FORMAT. Otherwise they are held as float.
 * Entries that are not regular files (FIFOs, sockets, devices) are passed over unopened, and
 * every file is opened through fsio (a name swapped for a FIFO after listing is refused, not
 * waited on). More than DATASET_MAX_FILES .png names is DATASET_ERR_FORMAT.
 * DATASET_ERR_EMPTY, with a message naming dir and the first failure, when nothing loads. */
enum dataset_status dataset_open_folder(struct dataset **out, const char *dir, int channels,
                                        int size, int64_t source_bytes, int64_t max_pixels,
                                        struct dataset_report *report, dataset_log_fn log_cb,
                                        void *log_ctx, char *err, size_t errlen);

/* A folder named by path (no upload's dataset.json: `ddpmd train` with data.dataset a folder):
 * what dataset_open_folder takes as source_bytes and max_pixels, and its image count, from the
 * PNG headers alone (image_png_probe; no pixel decoded), so it is held as an upload's folder is.
 * source_bytes is a bound: width x height x channels as image_load_png gives them (one more
 * for a grey, RGB or palette file with a tRNS chunk before its image data) x 2 bytes for a
 * 16-bit file, else 1, over the files the probe passes; images counts every listed .png (as
 * dataset_open_folder reserves and decides by them; one that does not decode is skipped there,
 * so a plan counts it once too often). The last folder measured is remembered (by its path) for
 * the process's later calls.
 * DATASET_ERR_EMPTY when no file passes, list_pngs' errors as dataset_open_folder's. */
enum dataset_status dataset_folder_probe(const char *dir, int64_t *images, int64_t *source_bytes,
                                         int64_t *max_pixels, char *err, size_t errlen);

/* The bytes one decoded image (image_load_png, before any conversion) is held in by
 * dataset_open_folder: its samples at 1 byte each when every value is k / 255, else 2. An
 * upload sums it over a folder (its source_bytes). */
int64_t dataset_source_bytes(const struct image *img);

/* One decoded copy of a folder shared by the jobs on it: the first job that holds the folder as
 * its samples writes them to a file (dataset_save_samples) and later jobs map that file
 * read-only instead of decoding the PNGs again, so the page cache holds one copy for them all.
 * A job's VmHWM counts the mapped pages it touches (every page: the checksum reads them), so
 * admission counts the copy in every job's data part, as a decoding job holds it
 * (dataset_bytes is the same either way): per job, conservatively - the promise holds for each
 * job's own peak, and a device's sum over-counts the shared copy once per further job on it. */

/* Write ds (a folder held as its samples) to path atomically (fsio_write_atomic): a header
 * (counts and the CRC-32 of the rest), the records, the samples. DATASET_ERR_ARG for a dataset
 * not held so, DATASET_ERR_IO (why in err) when the file cannot be written. */
enum dataset_status dataset_save_samples(const struct dataset *ds, const char *path, char *err,
                                         size_t errlen);
/* Open a folder from its samples file, mapped read-only, as dataset_open_folder holds it given
 * source_bytes and max_pixels (the same images, bit for bit the same batches, the same
 * dataset_bytes). Checked before it is used: the header and the file's size, the plan's bounds
 * (held as bytes at channels x size, at most source_bytes, no image over max_pixels), the CRC-32
 * of records and samples, and every record within the samples. DATASET_ERR_FORMAT with why for
 * a file that fails (decode the folder instead), DATASET_ERR_IO when it cannot be opened,
 * DATASET_ERR_ARG when at channels x size the folder is held as float (the copy is no use). */
enum dataset_status dataset_open_samples(struct dataset **out, const char *path, int channels,
                                         int size, int64_t source_bytes, int64_t max_pixels,
                                         char *err, size_t errlen);

/* Load a Fashion-MNIST split from dir (DATASET_FMNIST_DIR for the Debian package): the IDX files
 * "<prefix>-images-idx3-ubyte.gz" and "<prefix>-labels-idx1-ubyte.gz" (a file without ".gz" is
 * used when the .gz one is absent; zlib reads both). Checked: image magic 2051 with 3 dimensions
 * 28 x 28, label magic 2049 with 1 dimension, equal non-zero counts of at most
 * DATASET_IDX_MAX_COUNT that fit each file's size, every label 0..9, no missing and no extra
 * bytes; FIFOs and other non-regular files are refused without blocking. The images are held
 * as their bytes (28x28 each; as float where that is smaller, 8 px grey); when one is drawn (dataset_image, batches) its pixels v become
 * v/255 * 2 - 1, padded or resized to size x size by fit and replicated to channels (1 or 3), bit
 * for bit what decoding them all up front gave. Labels are kept. */
enum dataset_status dataset_open_fmnist(struct dataset **out, const char *dir,
                                        enum dataset_fmnist_split split, int channels, int size,
                                        enum dataset_fit fit, char *err, size_t errlen);

/* The most opening holds besides what the dataset keeps (a job's host plan: TRAIN_HOST_DATA_LOAD):
 * Fashion-MNIST's zlib readers, a folder's file names and one image's decode (max_pixels: its
 * largest image's width x height, <= 0 when unknown: the decoder's limit), a copy while the
 * images' block grows, and the split's lists. source_bytes as dataset_open_folder takes it. */
int64_t dataset_plan_load_bytes(int fmnist, int64_t images, int channels, int size,
                                int64_t max_pixels, int64_t source_bytes);

void dataset_free(struct dataset *ds);

int dataset_count(const struct dataset *ds);    /* N */
int dataset_channels(const struct dataset *ds); /* C */
int dataset_size(const struct dataset *ds);     /* S */
/* image i into x (C,S,S) in [-1, 1]; DATASET_ERR_ARG when i is out of range */
enum dataset_status dataset_image(const struct dataset *ds, int i, float *x);
/* The bytes ds holds: its images as stored, the labels and the train/validation index lists,
 * and for a folder held as bytes its records and what two draws at once hold (the loader's
 * thread and a validation batch: a decode's planes, conversion and resize, bounded by
 * image_decode_plan_bytes at the max_pixels it was opened with). */
int64_t dataset_bytes(const struct dataset *ds);
/* What dataset_bytes will be for images images (fmnist: Fashion-MNIST's bytes, 28x28 + a label
 * each, or its floats where fewer; else a folder as dataset_open_folder holds it given
 * source_bytes and max_pixels, its widest x tallest image), split or not: the job's host plan
 * counts this before a byte is read. */
int64_t dataset_plan_bytes(int fmnist, int64_t images, int channels, int size, int64_t max_pixels,
                           int64_t source_bytes);
/* label of image i, or -1 (no labels, or i out of range) */
int dataset_label(const struct dataset *ds, int i);

/* ---- train / validation split ---- */

/* Hold out val_count images (0 <= val_count < N, at least one image left to train on) for
 * validation: the first val_count entries of a Fisher-Yates permutation of 0..N-1 driven by
 * philox (seed, PHILOX_TAG_SHUFFLE, step 0, sample 0, op 1); both sets are then kept in ascending
 * image order. Without a split every image trains. Replaces any earlier split. Not thread-safe
 * against loaders or orders of ds: split before making them. */
enum dataset_status dataset_split(struct dataset *ds, int val_count, uint64_t seed, char *err,
                                  size_t errlen);
/* The same with val_count = round(fraction * N) (fraction in [0, 1)), capped at N - 1. */
enum dataset_status dataset_split_fraction(struct dataset *ds, double fraction, uint64_t seed,
                                           char *err, size_t errlen);
int dataset_train_count(const struct dataset *ds);
int dataset_val_count(const struct dataset *ds);
/* image index of training sample j / validation sample j (ascending); -1 when out of range */
int dataset_train_index(const struct dataset *ds, int j);
int dataset_val_index(const struct dataset *ds, int j);
/* Validation images first .. first+count-1 (in dataset_val_index order, never flipped) into
 * x (count,C,S,S) and labels (count) (may be NULL; -1 without labels). */
enum dataset_status dataset_val_batch(const struct dataset *ds, int first, int count, float *x,
                                      int *labels);

/* ---- training order ---- */

/* The order of epoch e: perm (T = dataset_train_count) = Fisher-Yates over 0..T-1, for i = T-1
 * down to 1 swapping perm[i] with perm[j], j = (u * (i + 1)) >> 32 where
 * u = philox_u32_at(seed, PHILOX_TAG_SHUFFLE, e, 0, 0, i) (bias below T / 2^32). perm holds
 * positions into the training set: the image is dataset_train_index(ds, perm[p]). */
enum dataset_status dataset_epoch_perm(int *perm, const struct dataset *ds, uint64_t seed,
                                       int64_t epoch);
/* Sample k of a run with seed is flipped iff philox_uniform_at(seed, PHILOX_TAG_FLIP, k, 0, 0, 0)
 * < 0.5 (k is taken modulo 2^40 by philox). */
int dataset_sample_flipped(uint64_t seed, int64_t k);

/* An order caches one epoch's permutation (T ints, allocated here, never again). */
enum dataset_status dataset_order_init(struct dataset_order **out, const struct dataset *ds,
                                       uint64_t seed);
void dataset_order_free(struct dataset_order *o);
/* The image index of run sample k >= 0: element k % T of the permutation of epoch k / T. */
int dataset_order_sample(struct dataset_order *o, int64_t k);
/* The synchronous batch of step >= 0: sample i (0 <= i < batch) is run sample k = step*batch + i;
 * x (batch,C,S,S) gets its image, mirrored left-right when flip and dataset_sample_flipped(seed,
 * k); labels (batch) (may be NULL) its label or -1. No allocation. */
enum dataset_status dataset_batch(struct dataset_order *o, int64_t step, int batch, int flip,
                                  float *x, int *labels);

/* ---- prefetching ---- */

/* Start a thread that computes the batches of steps start_step, start_step+1, ... ahead of use
 * into a ring of depth slots (depth <= 0 means 2; at most 8). All memory is allocated here. ds
 * must outlive the loader and not change (no dataset_split) while it runs. */
enum dataset_status dataset_loader_init(struct dataset_loader **out, const struct dataset *ds,
                                        uint64_t seed, int batch, int flip, int64_t start_step,
                                        int depth, char *err, size_t errlen);
/* Copy the batch of step into x (batch,C,S,S) and labels (batch) (may be NULL): exactly what
 * dataset_batch gives for that step. Steps are expected in sequence from start_step; any other
 * step (a resume, a retry) drops the prefetched batches and restarts the ring there, so it is
 * correct, only slower once. One consumer thread. */
enum dataset_status dataset_loader_next(struct dataset_loader *l, int64_t step, float *x,
                                        int *labels);
/* The bytes a loader of batch images of per floats holds over a training set of train_count
 * (its ring at depth, labels included, and its order's permutation), and what l holds. */
int64_t dataset_loader_plan_bytes(int depth, int batch, int64_t per, int64_t train_count);
int64_t dataset_loader_bytes(const struct dataset_loader *l);
/* Stop and join the thread, free everything. NULL-safe. */
void dataset_loader_free(struct dataset_loader *l);

#endif
