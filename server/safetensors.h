/* safetensors.h - read and write the safetensors format (huggingface/safetensors): an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
 * then the raw little-endian row-major tensor bytes. Used for checkpoints and for loading weights.
 */
#ifndef DDPMD_SAFETENSORS_H
#define DDPMD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Every fallible function returns one of these; 0 = ok. */
enum st_status {
    ST_OK = 0,
    ST_ERR_IO,        /* open/read/write/fsync/rename failed (errno text in err) */
    ST_ERR_FORMAT,    /* the file is not a valid safetensors file */
    ST_ERR_NOMEM,     /* allocation failed */
    ST_ERR_NOT_FOUND, /* no tensor with that name */
    ST_ERR_ARG,       /* caller passed an invalid argument (NULL, bad dtype, index out of range) */
};

/* Element types, spelled in the file as the names in safetensors_dtype_name(). */
enum st_dtype {
    ST_F32 = 0,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_DTYPE_COUNT, /* not a dtype: the number of them */
};

#define ST_MAX_NDIM 8
/* Limits on what a file may declare (docs/limits.md), each checked before it sizes an
 * allocation; a file over one is ST_ERR_FORMAT with the limit's name in the message. The writer
 * refuses to produce a file the reader would refuse.
 * Header lengths above this are rejected before allocating (a corrupt length must not OOM us);
 * the same bound as the reference implementation. */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 * 1024 * 1024)
/* JSON nesting in the header: the format needs 3 (file, tensor entry, shape) */
#define ST_MAX_JSON_DEPTH 8
/* JSON values (objects, arrays, strings, numbers, ...) in the header, counted by a scan before
 * it is parsed: each becomes a parser node of ~64 bytes, so this caps the parse at ~64 MiB */
#define ST_MAX_JSON_VALUES ((size_t)1 << 20)
/* tensor entries in one file (a large diffusion UNet has ~700) */
#define ST_MAX_TENSORS 65536
/* bytes in a tensor name or a __metadata__ key (diffusers' longest are ~80) */
#define ST_MAX_NAME_BYTES 1024
/* __metadata__ entries (a checkpoint writes 6); values are bounded only by the header size */
#define ST_MAX_META_ENTRIES 1024

/* One tensor of an open file. Borrowed from the struct safetensors: valid until safetensors_free.
 * data points at nbytes bytes of raw little-endian values (nbytes == numel * dtype size; NULL-safe
 * only when nbytes == 0). data is not guaranteed to be aligned for the dtype (it is whatever the
 * file's offsets give, relative to a malloc'd base): memcpy out of it, or use safetensors_read_f32. */
struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;                     /* 0 = scalar (numel 1) */
    int64_t shape[ST_MAX_NDIM];   /* shape[i] for i < ndim; zeros after */
    int64_t numel;                /* product of shape (1 for a scalar, 0 if any dim is 0) */
    const void *data;             /* NULL when the file is streamed (safetensors_open_stream) */
    size_t nbytes;
    uint64_t offset;              /* where its bytes start in the data section */
};

struct safetensors;        /* an open, fully validated file: in memory, or its header (streamed) */
struct safetensors_writer; /* tensors and metadata collected for one save */

/* Bytes per element (BOOL is 1), or 0 for a value that is not a dtype. */
size_t safetensors_dtype_size(enum st_dtype dtype);
/* "F32", "BF16", ... as written in the header; "?" for a value that is not a dtype. */
const char *safetensors_dtype_name(enum st_dtype dtype);
/* A short constant description of a status ("ok", "I/O error", ...). */
const char *safetensors_status_name(enum st_status status);

/* ---- reading ---- */

/* Load the whole file at path and validate all of it before returning: header length within the
 * file and <= ST_MAX_HEADER_BYTES; header is UTF-8 JSON, an object, within the limits above
 * (depth, values, tensors, name bytes, metadata entries); every entry but __metadata__ has
 * a known dtype, a shape of <= 8 non-negative integers and data_offsets [begin, end] with
 * end - begin == numel * dtype size; the tensors cover the data section exactly (no overlap, no
 * hole, nothing after the last); names unique; __metadata__ maps strings to strings.
 * On success *out owns everything (free with safetensors_free). On failure *out is NULL and err
 * (if err && errlen) holds a message naming the tensor and the problem. Tensor index order is the
 * order of the entries in the header. Numbers written as 2.0 or 2e0 are accepted as integers (the
 * JSON parser does not keep the literal); non-integral values are rejected. */
enum st_status safetensors_open(struct safetensors **out, const char *path, char *err,
                                size_t errlen);

/* safetensors_open's checks, but only the header is read: the tensors' bytes stay in the file,
 * each read when asked (safetensors_read), so the caller holds one tensor at a time instead of
 * the file. Their data pointers are NULL; the file stays open until safetensors_free. A file
 * changed after the open reads what it holds then (a shorter one: ST_ERR_IO). */
enum st_status safetensors_open_stream(struct safetensors **out, const char *path, char *err,
                                       size_t errlen);
/* t's nbytes bytes (a tensor of st) into dst: copied, or read from a streamed file */
enum st_status safetensors_read(const struct safetensors *st, const struct st_tensor *t,
                                void *dst, char *err, size_t errlen);
size_t safetensors_count(const struct safetensors *st);
/* *t = tensor number index (header order); ST_ERR_ARG if index >= count. */
enum st_status safetensors_get(const struct safetensors *st, size_t index,
                               const struct st_tensor **t);
/* *t = the tensor called name; ST_ERR_NOT_FOUND (and *t = NULL) if there is none. */
enum st_status safetensors_find(const struct safetensors *st, const char *name,
                                const struct st_tensor **t);
/* Value of __metadata__[key], borrowed until safetensors_free; NULL if absent. */
const char *safetensors_meta(const struct safetensors *st, const char *key);
/* Copy tensor name into dst (expect_numel floats). Fails with a message unless the tensor
 * exists (ST_ERR_NOT_FOUND), is F32 and has exactly expect_numel elements (ST_ERR_FORMAT). */
enum st_status safetensors_read_f32(const struct safetensors *st, const char *name, float *dst,
                                    int64_t expect_numel, char *err, size_t errlen);
void safetensors_free(struct safetensors *st);

/* ---- writing ---- */

enum st_status safetensors_writer_init(struct safetensors_writer **out);
/* Queue a tensor. name and shape are copied; data (numel * dtype size bytes, may be NULL when that
 * is 0) is referenced, not copied, and must stay valid and unchanged until save returns.
 * ST_ERR_ARG for: NULL/invalid-UTF-8 name, the reserved name "__metadata__", a name already added,
 * a bad dtype, ndim outside 0..8, a negative dim, an element count overflowing int64/size_t, a
 * name over ST_MAX_NAME_BYTES, more than ST_MAX_TENSORS tensors. */
enum st_status safetensors_writer_add(struct safetensors_writer *w, const char *name,
                                      enum st_dtype dtype, int ndim, const int64_t *shape,
                                      const void *data);
/* Queue a tensor whose bytes are made while the file is written: fill(ctx, dst) writes its
 * numel * dtype size bytes into dst (the writer's staging buffer, safetensors_writer_staging_bytes
 * long) and returns 0, or nonzero to fail the save (ST_ERR_IO, the file untouched). A checkpoint
 * so holds one tensor in memory, not all of them. Checked as safetensors_writer_add. */
typedef int (*st_fill_fn)(void *ctx, void *dst);
enum st_status safetensors_writer_add_fill(struct safetensors_writer *w, const char *name,
                                           enum st_dtype dtype, int ndim, const int64_t *shape,
                                           st_fill_fn fill, void *ctx);
/* the staging buffer a save allocates: the largest tensor queued with a fill (0: none) */
size_t safetensors_writer_staging_bytes(const struct safetensors_writer *w);
/* Set __metadata__[key] = value (both copied, both valid UTF-8); setting a key again replaces it.
 * ST_ERR_ARG for a key over ST_MAX_NAME_BYTES or a key past ST_MAX_META_ENTRIES. */
enum st_status safetensors_writer_meta(struct safetensors_writer *w, const char *key,
                                       const char *value);
/* Write everything to path atomically (fsio_write_atomic): header (metadata first, then tensors in
 * insertion order with contiguous offsets, padded with spaces so the data starts at a multiple of
 * 8) and data go to a unique "<path>.tmp.XXXXXX", which is fsynced and renamed over path; then
 * path's directory is fsynced. On any failure before the rename the temp file is removed and an
 * existing path is untouched; err names the step and strerror ("No space left on device"). The
 * writer may be saved again or freed afterwards. */
enum st_status safetensors_writer_save(const struct safetensors_writer *w, const char *path,
                                       char *err, size_t errlen);
void safetensors_writer_free(struct safetensors_writer *w);

#endif
