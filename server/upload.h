/* upload.h - uploaded datasets: a tar (plain or gzip) of PNG files checked and unpacked with
 * libarchive into DATA/datasets/<id>/ (images/, dataset.json, preview.png; samples.bin, its
 * decoded copy, once a job made it), listed, read and deleted. Everything an archive holds is
 * untrusted: paths, entry types, sizes and each PNG's header are checked entry by entry on the
 * request and a refused archive leaves nothing on disk (docs/limits.md); decoding its images
 * (seconds of CPU for a few large ones) is a second step the server runs on a worker
 * (upload_dataset_validate): the dataset is "validating" until it is "ready", or "failed" with
 * the reason.
 */
#ifndef DDPMD_UPLOAD_H
#define DDPMD_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#define UPLOAD_ID_LEN 18          /* "d" + 16 hex digits + NUL */
#define UPLOAD_NAME_MAX 255       /* one path component of an entry */
#define UPLOAD_PATH_MAX 1024      /* a whole entry path */
#define UPLOAD_PREVIEW_N 16       /* images in the preview grid (4 x 4) */
#define UPLOAD_PREVIEW_SIDE 48    /* pixels of one preview tile */

enum upload_status {
    UPLOAD_OK = 0,
    UPLOAD_ERR_CORRUPT,         /* not a tar / gzip, truncated, a damaged header: 422 */
    UPLOAD_ERR_UNSAFE,          /* absolute path, "..", a link, a device, FIFO, hidden or too deep: 422 */
    UPLOAD_ERR_NOT_PNG,         /* a file that is not a decodable PNG within the image limits: 422 */
    UPLOAD_ERR_EMPTY,           /* no image at all: 422 */
    UPLOAD_ERR_TOO_LARGE,       /* more unpacked bytes than the limit: 413 */
    UPLOAD_ERR_TOO_MANY,        /* more entries than the limit: 413 */
    UPLOAD_ERR_NOSPACE,         /* the data disk is full: 507 */
    UPLOAD_ERR_IO,              /* any other file error: 500 */
    UPLOAD_ERR_OVER_QUOTA,      /* the archive alone is over its owner's quota: 413 */
    UPLOAD_ERR_QUOTA,           /* with its owner's other datasets, over the quota: 429 */
};

/* a dataset's states (dataset.json "state"; one without it is ready) */
#define UPLOAD_STATE_VALIDATING "validating"
#define UPLOAD_STATE_READY "ready"
#define UPLOAD_STATE_FAILED "failed"

struct upload_limits {
    int64_t max_unpacked;       /* bytes of all files together */
    int64_t max_files;          /* entries (files and folders) */
    /* the owner's datasets together, this one included (0: no limit): bytes of their files
     * and pixels (width x height) of their images; failed ones do not count */
    int64_t quota_bytes, quota_pixels;
};

struct upload_result {
    int64_t images, bytes;      /* PNG files and their bytes */
    int64_t pixels;             /* width x height, summed over the images */
    int min_w, max_w, min_h, max_h;
    int channels;               /* the most channels any image has (1..4) */
    int64_t source_bytes;       /* decoded samples, dataset_source_bytes summed (upload_decode) */
    /* up to UPLOAD_PREVIEW_N tiles (C,S,S) of the first images, in [-1, 1]; preview_c channels */
    float *preview;
    int preview_n, preview_c;
};

void upload_result_free(struct upload_result *r);

/* Checks and unpacks the archive at path into dest (created; must not exist). Entries may be
 * folders and regular files at most one folder deep ("a.png", "cat/a.png"), each file a PNG
 * whose header image_png_probe accepts (res: counts, bytes, pixels, sizes and channels from
 * the headers; no preview). On any refusal dest is removed and err says which entry and why.
 * The images are not decoded here: upload_decode does that. */
int upload_unpack(const char *path, const char *dest, const struct upload_limits *lim,
                  struct upload_result *res, char *err, size_t errlen);
/* Decodes every PNG under dir (unpacked by upload_unpack) in name order: res gets the decoded
 * sizes and channels and the preview tiles of the first images. UPLOAD_ERR_NOT_PNG naming the
 * file and why for one that does not decode; UPLOAD_ERR_IO when stopping(arg) said to stop
 * between two images (stopping may be NULL). */
int upload_decode(const char *dir, struct upload_result *res, int (*stopping)(const void *),
                  const void *arg, char *err, size_t errlen);

/* removes path and everything under it (no link is followed); 0 when it is gone */
int upload_rmtree(const char *path);

/* whether s is a well-formed dataset id (so it can never name a path) */
int upload_id_valid(const char *s);

/* ---- the store: DATA/datasets/ ---- */

/* makes DATA/datasets and removes what an interrupted upload left (.part files, .tmp- folders);
 * a dataset a stopped server left "validating" stays so (upload_dataset_validating finds it for
 * the decoding the server queues again at start) */
int upload_store_init(const char *data_dir, char *err, size_t errlen);
/* a fresh temporary file for an upload's body (O_EXCL, 0600): its fd, its path in path */
int upload_part_open(const char *data_dir, char *path, size_t len, char *err, size_t errlen);

/* unpacks the uploaded archive at part (then removed) into a new dataset owned by owner, in
 * state "validating"; id gets its id. It appears (one rename) only once unpacked (dataset.json,
 * images/) and only when the owner's quota (lim) holds it with their other datasets: the check
 * and the rename are one step for all uploads. upload_dataset_validate makes it ready. */
int upload_dataset_create(const char *data_dir, const char *part, const char *owner,
                          const struct upload_limits *lim, int64_t archive_bytes, char *id,
                          char *err, size_t errlen);
/* decodes a "validating" dataset's images (upload_decode): "ready" with its preview.png, the
 * decoded channels and source_bytes, or "failed" with the reason in dataset.json "error" and
 * its images removed. A dataset deleted meanwhile stays deleted; when stopping(arg) stops it,
 * it stays validating (the next start decodes it again). 0 when ready. */
int upload_dataset_validate(const char *data_dir, const char *id, int (*stopping)(const void *),
                            const void *arg);
/* the ids of the datasets in state "validating" (a stopped server's), sorted (caller frees ids);
 * 0 ok */
int upload_dataset_validating(const char *data_dir, char (**ids)[UPLOAD_ID_LEN], int *n);
/* the bytes and pixels of owner's datasets that are not failed; 0 ok */
int upload_owner_usage(const char *data_dir, const char *owner, int64_t *bytes, int64_t *pixels);
/* DATA/datasets/<id>/<tail> ("dataset.json", "preview.png", "images"); 0 when it fits */
int upload_dataset_path(const char *data_dir, const char *id, const char *tail, char *path,
                        size_t len);
/* the dataset's dataset.json text (caller frees), NULL when there is none */
char *upload_dataset_meta(const char *data_dir, const char *id);
/* every dataset id in the store, sorted (caller frees ids); 0 ok */
int upload_dataset_ids(const char *data_dir, char (**ids)[UPLOAD_ID_LEN], int *n);
/* the images an uploaded dataset's images/ folder holds, from its dataset.json (-1: unknown).
 * This and the next two, for a folder without a dataset.json (named by path: the CLI), give its
 * PNG headers' figures (dataset_folder_probe: a bound on its samples), -1 when none is readable,
 * so such a folder is held and planned as an upload's is. */
int64_t upload_folder_images(const char *images_dir);
/* the bytes the same folder's images' decoded samples come to (its dataset.json's
 * source_bytes, written once they are decoded: dataset_open_folder holds them so when that is
 * smaller than floats), or -1 */
int64_t upload_folder_source_bytes(const char *images_dir);
/* where the jobs on the same folder keep its one decoded copy (DIR/samples.bin beside DIR/images:
 * dataset_save_samples, dataset_open_samples; removed with the dataset); 0 when images_dir is
 * an upload's images folder and the path fits */
int upload_folder_samples_path(const char *images_dir, char *path, size_t len);
/* the same folder's widest x tallest image (its dataset.json's sizes: a bound on any one image's
 * pixels), or -1 */
int64_t upload_folder_max_pixels(const char *images_dir);
/* removes a dataset (renamed away first, so it is gone at once); 0 ok */
int upload_dataset_delete(const char *data_dir, const char *id);

/* held by whoever checks a dataset is unused and deletes it, and by whoever submits a job that
 * names it, so a job is never queued on a dataset being deleted */
void upload_lock(void);
void upload_unlock(void);

#endif
