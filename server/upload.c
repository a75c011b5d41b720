/* upload.c - uploaded datasets (see upload.h). An archive is read once with libarchive (tar
 * formats only, gzip or no filter); every entry is judged before a byte of it is written: its path
 * (relative, no "..", no hidden component, at most one folder deep), its type (folders and regular
 * files only: no symlink, hardlink, device, FIFO), the entry count and the running byte total. A
 * file must start with a PNG header image_png_probe accepts (its size limits); decoding it with
 * image_load_png is upload_decode's, later, on a worker. Files are created with O_EXCL |
 * O_NOFOLLOW under a folder this process made, so no entry can write outside it, and the whole
 * folder is removed on any refusal.
 */
#define _GNU_SOURCE /* nftw, syncfs */
#include "upload.h"

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dataset.h"
#include "fsio.h"
#include "image.h"
#include "jobs.h"
#include "testhold.h"

#define UPLOAD_CHUNK 65536

static pthread_mutex_t upload_mu = PTHREAD_MUTEX_INITIALIZER;
/* an owner's quota checked and the dataset named in one step (upload_dataset_create) */
static pthread_mutex_t quota_mu = PTHREAD_MUTEX_INITIALIZER;

void upload_lock(void) { pthread_mutex_lock(&upload_mu); }
void upload_unlock(void) { pthread_mutex_unlock(&upload_mu); }

void upload_result_free(struct upload_result *r)
{
    free(r->preview);
    memset(r, 0, sizeof *r);
}

int upload_id_valid(const char *s)
{
    if (s[0] != 'd') return 0;
    for (int i = 1; i <= 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[17] == 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path) && errno != ENOENT ? -1 : 0;
}

int upload_rmtree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb)) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* an entry's path -> its normalized relative form in out ("./a/b.png" -> "a/b.png", a folder's
 * trailing '/' dropped) and its depth (components); -1 with why when it may not be unpacked */
static int entry_path(const char *in, char *out, size_t n, int *depth, const char **why)
{
    size_t o = 0;
    *depth = 0;
    if (!in || !*in) return *why = "an entry without a name", -1;
    if (in[0] == '/') return *why = "an absolute path", -1;
    if (strlen(in) >= UPLOAD_PATH_MAX) return *why = "a path longer than 1023 bytes", -1;
    const char *p = in;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.')) {
            /* "a//b" and "./a": empty and "." components mean nothing */
        } else if (len == 2 && p[0] == '.' && p[1] == '.') {
            return *why = "a path with \"..\"", -1;
        } else if (p[0] == '.') {
            return *why = "a hidden name (starting with '.')", -1;
        } else if (len > UPLOAD_NAME_MAX) {
            return *why = "a name longer than 255 bytes", -1;
        } else {
            for (size_t i = 0; i < len; i++)
                if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
                    return *why = "a name with a control character", -1;
            if (o && o + 1 < n) out[o++] = '/';
            if (o + len >= n) return *why = "a path too long", -1;
            memcpy(out + o, p, len);
            o += len;
            (*depth)++;
        }
        p += len;
        if (*p == '/') p++;
    }
    out[o] = 0;
    if (*depth == 0) return *why = "an entry without a name", -1;
    return 0;
}

/* "name" with a printable, bounded echo of an entry's name for messages */
static void echo(char *out, size_t n, const char *s)
{
    size_t o = 0;
    for (; s && *s && o + 5 < n && o < 80; s++)
        out[o++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    if (s && *s && o + 4 < n) out[o++] = '.', out[o++] = '.', out[o++] = '.';
    out[o] = 0;
}

static int has_png_suffix(const char *s)
{
    size_t n = strlen(s);
    return n > 4 && strcasecmp(s + n - 4, ".png") == 0;
}

/* an image's size and channels into res (before res->images counts it) */
static void note_size(struct upload_result *res, int w, int h, int c)
{
    if (res->images == 0 || w < res->min_w) res->min_w = w;
    if (res->images == 0 || h < res->min_h) res->min_h = h;
    if (w > res->max_w) res->max_w = w;
    if (h > res->max_h) res->max_h = h;
    if (c > res->channels) res->channels = c;
    res->pixels += (int64_t)w * h;
}

/* the decoded image's size and channels into res, and its tile into the preview */
static int note_image(struct upload_result *res, struct image *img)
{
    note_size(res, img->w, img->h, img->c);
    res->source_bytes += dataset_source_bytes(img); /* before any conversion */
    if (res->preview_n >= UPLOAD_PREVIEW_N) return 0;
    if (res->preview_n == 0) {
        res->preview_c = img->c >= 3 ? 3 : 1;
        size_t tile = (size_t)res->preview_c * UPLOAD_PREVIEW_SIDE * UPLOAD_PREVIEW_SIDE;
        res->preview = malloc(UPLOAD_PREVIEW_N * tile * sizeof(float));
        if (!res->preview) return -1;
    }
    size_t tile = (size_t)res->preview_c * UPLOAD_PREVIEW_SIDE * UPLOAD_PREVIEW_SIDE;
    if (image_to_channels(img, res->preview_c) ||
        image_resize_square(res->preview + (size_t)res->preview_n * tile, img, UPLOAD_PREVIEW_SIDE))
        return -1;
    res->preview_n++;
    return 0;
}

/* one upload_unpack's state, shared by its unpack_* stages: each stage returns UPLOAD_OK or the
 * refusal's status with its message in err; fd (the file being written) and dfd (the dataset
 * folder) are closed, the archive freed and, on a refusal, dest removed by unpack_close */
struct unpack {
    const struct upload_limits *lim;
    struct upload_result *res;
    char *err;
    size_t errlen;
    struct archive *a;
    char *buf;               /* UPLOAD_CHUNK bytes: one read of an entry's data */
    int dfd, fd, made;       /* made: dest was created by this call (removed on a refusal) */
    int64_t entries;         /* headers read so far, the current one counted */
    int depth;               /* the current entry's components (entry_path) */
    char rel[UPLOAD_PATH_MAX], shown[96]; /* its normalized path, its echo for messages */
    unsigned char head[IMAGE_PNG_HEAD_BYTES]; /* the current file's first bytes, hn of them */
    size_t hn;
    int64_t got;             /* the current file's bytes */
};

/* the buffers, dest created (0755) and opened, and path opened as a plain or gzipped tar:
 * UPLOAD_ERR_IO (out of memory, the folder), UPLOAD_ERR_CORRUPT (not such an archive) */
static int unpack_open(struct unpack *u, const char *path, const char *dest)
{
    u->a = archive_read_new();
    if (!u->a || !(u->buf = malloc(UPLOAD_CHUNK))) {
        snprintf(u->err, u->errlen, "out of memory");
        return UPLOAD_ERR_IO;
    }
    if (mkdir(dest, 0755)) {
        snprintf(u->err, u->errlen, "cannot create the dataset folder: %s", strerror(errno));
        return UPLOAD_ERR_IO;
    }
    u->made = 1;
    u->dfd = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (u->dfd < 0) {
        snprintf(u->err, u->errlen, "cannot open the dataset folder: %s", strerror(errno));
        return UPLOAD_ERR_IO;
    }
    archive_read_support_filter_gzip(u->a);
    archive_read_support_format_tar(u->a);
    if (archive_read_open_filename(u->a, path, UPLOAD_CHUNK) != ARCHIVE_OK) {
        snprintf(u->err, u->errlen, "not a tar archive (plain or gzip): %s",
                 archive_error_string(u->a));
        return UPLOAD_ERR_CORRUPT;
    }
    return UPLOAD_OK;
}

/* the next entry's header into *e (NULL at the archive's end), counted against lim->max_files,
 * its path normalized into rel and depth (entry_path) and echoed into shown; a hard link refused.
 * UPLOAD_ERR_CORRUPT, UPLOAD_ERR_TOO_MANY or UPLOAD_ERR_UNSAFE */
static int unpack_next(struct unpack *u, struct archive_entry **e)
{
    int r = archive_read_next_header(u->a, e);
    if (r == ARCHIVE_EOF) {
        *e = NULL;
        return UPLOAD_OK;
    }
    if (r != ARCHIVE_OK) {
        const char *what = archive_error_string(u->a);
        snprintf(u->err, u->errlen, "%s after %lld entries: %s",
                 u->entries ? "the archive is truncated or corrupt"
                            : "not a tar archive (plain or gzip)",
                 (long long)u->entries, what ? what : "?");
        return UPLOAD_ERR_CORRUPT;
    }
    const char *name = archive_entry_pathname(*e), *why = NULL;
    echo(u->shown, sizeof u->shown, name);
    if (++u->entries > u->lim->max_files) {
        snprintf(u->err, u->errlen, "the archive holds more than %lld entries (the limit)",
                 (long long)u->lim->max_files);
        return UPLOAD_ERR_TOO_MANY;
    }
    if (entry_path(name, u->rel, sizeof u->rel, &u->depth, &why)) {
        snprintf(u->err, u->errlen, "entry '%s': %s is not allowed", u->shown, why);
        return UPLOAD_ERR_UNSAFE;
    }
    if (archive_entry_hardlink(*e)) {
        snprintf(u->err, u->errlen, "entry '%s': a hard link is not allowed", u->shown);
        return UPLOAD_ERR_UNSAFE;
    }
    return UPLOAD_OK;
}

/* a folder entry: at most one level deep, made under dfd; one listed twice (or made already for
 * a file inside it) is the same folder. UPLOAD_ERR_UNSAFE (too deep, a file of that name),
 * UPLOAD_ERR_NOSPACE, UPLOAD_ERR_IO */
static int unpack_folder(struct unpack *u)
{
    if (u->depth > 1) {
        snprintf(u->err, u->errlen, "entry '%s': folders may be one level deep", u->shown);
        return UPLOAD_ERR_UNSAFE;
    }
    if (mkdirat(u->dfd, u->rel, 0755) == 0) return UPLOAD_OK;
    int e0 = errno;
    struct stat ds;
    if (e0 == EEXIST && fstatat(u->dfd, u->rel, &ds, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(ds.st_mode))
        return UPLOAD_OK;
    snprintf(u->err, u->errlen, "entry '%s': %s", u->shown,
             e0 == EEXIST ? "the archive holds this name twice (as a file or a folder)"
                          : strerror(e0));
    return e0 == EEXIST ? UPLOAD_ERR_UNSAFE : e0 == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
}

/* a non-folder entry judged before a byte is written: a regular file (UPLOAD_ERR_UNSAFE naming
 * the type otherwise), at most one folder deep (UPLOAD_ERR_UNSAFE), named *.png
 * (UPLOAD_ERR_NOT_PNG), its declared size within what is left of lim->max_unpacked
 * (UPLOAD_ERR_TOO_LARGE) */
static int unpack_check_file(struct unpack *u, struct archive_entry *e)
{
    mode_t type = archive_entry_filetype(e);
    if (type != AE_IFREG) {
        snprintf(u->err, u->errlen, "entry '%s': a %s is not allowed (only folders and PNG files)",
                 u->shown, type == AE_IFLNK ? "symbolic link"
                 : type == AE_IFCHR ? "character device" : type == AE_IFBLK ? "block device"
                 : type == AE_IFIFO ? "FIFO" : type == AE_IFSOCK ? "socket" : "special file");
        return UPLOAD_ERR_UNSAFE;
    }
    if (u->depth > 2) {
        snprintf(u->err, u->errlen, "entry '%s': files may be at most one folder deep", u->shown);
        return UPLOAD_ERR_UNSAFE;
    }
    if (!has_png_suffix(u->rel)) {
        snprintf(u->err, u->errlen, "entry '%s': only .png files are allowed", u->shown);
        return UPLOAD_ERR_NOT_PNG;
    }
    int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    if (declared < 0 || declared > u->lim->max_unpacked - u->res->bytes) {
        snprintf(u->err, u->errlen, "entry '%s': the files unpack to more than %lld bytes (the "
                 "limit)", u->shown, (long long)u->lim->max_unpacked);
        return UPLOAD_ERR_TOO_LARGE;
    }
    return UPLOAD_OK;
}

/* the file created under dfd with O_EXCL | O_NOFOLLOW (its folder made first when the archive did
 * not list it): UPLOAD_ERR_UNSAFE when the name is there already (a file or a folder),
 * UPLOAD_ERR_NOSPACE, UPLOAD_ERR_IO; the descriptor into fd */
static int unpack_create(struct unpack *u)
{
    if (u->depth == 2) { /* its folder, when the archive did not list it first */
        char *slash = strchr(u->rel, '/');
        *slash = 0;
        int mr = mkdirat(u->dfd, u->rel, 0755);
        *slash = '/';
        if (mr && errno != EEXIST) {
            int rc = errno == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
            snprintf(u->err, u->errlen, "entry '%s': %s", u->shown, strerror(errno));
            return rc;
        }
    }
    u->fd = openat(u->dfd, u->rel, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (u->fd < 0) {
        /* a name given twice, or a file where a folder of the same name is (or the reverse) */
        int clash = errno == EEXIST || errno == ENOTDIR || errno == EISDIR || errno == ELOOP;
        int rc = clash ? UPLOAD_ERR_UNSAFE : errno == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
        snprintf(u->err, u->errlen, "entry '%s': %s", u->shown,
                 clash ? "the archive holds this name twice (as a file or a folder)"
                       : strerror(errno));
        return rc;
    }
    return UPLOAD_OK;
}

/* the entry's data copied into fd chunk by chunk and fd closed: the first chunk must start with
 * the PNG signature (UPLOAD_ERR_NOT_PNG), the running total stay within what is left of
 * lim->max_unpacked (UPLOAD_ERR_TOO_LARGE) and the file not be empty (UPLOAD_ERR_NOT_PNG);
 * UPLOAD_ERR_CORRUPT on a read error, UPLOAD_ERR_NOSPACE / UPLOAD_ERR_IO on a write error. Its
 * size into got, its first bytes into head (hn of them) */
static int unpack_copy(struct unpack *u)
{
    u->got = 0;
    u->hn = 0;
    for (;;) {
        la_ssize_t k = archive_read_data(u->a, u->buf, UPLOAD_CHUNK);
        if (k == 0) break;
        if (k < 0) {
            snprintf(u->err, u->errlen, "entry '%s': the archive is truncated or corrupt: %s",
                     u->shown, archive_error_string(u->a) ? archive_error_string(u->a) : "?");
            return UPLOAD_ERR_CORRUPT;
        }
        if (u->got == 0 && (k < 8 || memcmp(u->buf, "\x89PNG\r\n\x1a\n", 8) != 0)) {
            snprintf(u->err, u->errlen, "entry '%s': not a PNG file (no PNG signature)", u->shown);
            return UPLOAD_ERR_NOT_PNG;
        }
        if (u->hn < sizeof u->head) {
            size_t take = sizeof u->head - u->hn < (size_t)k ? sizeof u->head - u->hn : (size_t)k;
            memcpy(u->head + u->hn, u->buf, take);
            u->hn += take;
        }
        u->got += k;
        if (u->got > u->lim->max_unpacked - u->res->bytes) {
            snprintf(u->err, u->errlen, "entry '%s': the files unpack to more than %lld bytes (the "
                     "limit)", u->shown, (long long)u->lim->max_unpacked);
            return UPLOAD_ERR_TOO_LARGE;
        }
        if (fsio_write_full(u->fd, u->buf, (size_t)k)) {
            int rc = errno == ENOSPC || errno == EDQUOT ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
            snprintf(u->err, u->errlen, "entry '%s': %s", u->shown, strerror(errno));
            return rc;
        }
    }
    int cr = close(u->fd);
    u->fd = -1;
    if (cr) {
        int rc = errno == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
        snprintf(u->err, u->errlen, "entry '%s': %s", u->shown, strerror(errno));
        return rc;
    }
    if (u->got == 0) {
        snprintf(u->err, u->errlen, "entry '%s': an empty file is no PNG", u->shown);
        return UPLOAD_ERR_NOT_PNG;
    }
    return UPLOAD_OK;
}

/* the written file counted into res: its bytes, its header probed (image_png_probe: a usable PNG
 * within the image limits, else UPLOAD_ERR_NOT_PNG), its size and channels noted; then the owner's
 * quota of bytes and pixels for this archive alone (UPLOAD_ERR_OVER_QUOTA) */
static int unpack_note_file(struct unpack *u)
{
    struct upload_result *res = u->res;
    const struct upload_limits *lim = u->lim;
    res->bytes += u->got;
    int w, h, ch;
    char ierr[300];
    if (image_png_probe(u->head, u->hn, (unsigned long long)u->got, &w, &h, &ch, ierr,
                        sizeof ierr)) {
        snprintf(u->err, u->errlen, "entry '%s': not a usable PNG: %s", u->shown, ierr);
        return UPLOAD_ERR_NOT_PNG;
    }
    note_size(res, w, h, ch);
    res->images++;
    if (lim->quota_bytes > 0 && res->bytes > lim->quota_bytes) {
        snprintf(u->err, u->errlen, "entry '%s': the files hold more than %lld bytes, the owner's "
                 "quota (--upload-quota-bytes)", u->shown, (long long)lim->quota_bytes);
        return UPLOAD_ERR_OVER_QUOTA;
    }
    if (lim->quota_pixels > 0 && res->pixels > lim->quota_pixels) {
        snprintf(u->err, u->errlen, "entry '%s': the images hold more than %lld pixels, the "
                 "owner's quota (--upload-quota-pixels)", u->shown, (long long)lim->quota_pixels);
        return UPLOAD_ERR_OVER_QUOTA;
    }
    return UPLOAD_OK;
}

/* one entry whose header unpack_next accepted: a folder made, or a file judged, written and
 * counted */
static int unpack_entry(struct unpack *u, struct archive_entry *e)
{
    if (archive_entry_filetype(e) == AE_IFDIR) return unpack_folder(u);
    int rc = unpack_check_file(u, e);
    if (!rc) rc = unpack_create(u);
    if (!rc) rc = unpack_copy(u);
    if (!rc) rc = unpack_note_file(u);
    return rc;
}

/* after the last entry: at least one image (UPLOAD_ERR_EMPTY), and every file of the dataset on
 * disk before it is named - one syncfs, not an fsync per file (UPLOAD_ERR_NOSPACE,
 * UPLOAD_ERR_IO) */
static int unpack_finish(struct unpack *u)
{
    if (u->res->images == 0) {
        snprintf(u->err, u->errlen, "the archive holds no PNG file");
        return UPLOAD_ERR_EMPTY;
    }
    if (syncfs(u->dfd)) {
        int rc = errno == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
        snprintf(u->err, u->errlen, "cannot sync the dataset: %s", strerror(errno));
        return rc;
    }
    return UPLOAD_OK;
}

/* what unpack_open and unpack_create opened, closed and freed; on a refusal (rc) the folder
 * removed when this call made it, and res freed */
static void unpack_close(struct unpack *u, const char *dest, int rc)
{
    if (u->fd >= 0) close(u->fd);
    if (u->dfd >= 0) close(u->dfd);
    if (u->a) archive_read_free(u->a);
    free(u->buf);
    if (rc) {
        if (u->made) upload_rmtree(dest);
        upload_result_free(u->res);
    }
}

int upload_unpack(const char *path, const char *dest, const struct upload_limits *lim,
                  struct upload_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    struct unpack u = {.lim = lim, .res = res, .err = err, .errlen = errlen, .dfd = -1, .fd = -1};
    int rc = unpack_open(&u, path, dest);
    while (!rc) {
        struct archive_entry *e;
        rc = unpack_next(&u, &e);
        if (rc || !e) break;
        rc = unpack_entry(&u, e);
    }
    if (!rc) rc = unpack_finish(&u);
    unpack_close(&u, dest, rc);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* names[*n] = "a" or "a/b" (grown as needed); -1 out of memory */
static int push_name(char ***names, size_t *n, size_t *cap, const char *a, const char *b)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        char **g = realloc(*names, c * sizeof *g);
        if (!g) return -1;
        *names = g;
        *cap = c;
    }
    size_t len = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
    char *nm = malloc(len);
    if (!nm) return -1;
    snprintf(nm, len, b ? "%s/%s" : "%s", a, b);
    (*names)[(*n)++] = nm;
    return 0;
}

/* the files under dir and in its folders (one deep, as upload_unpack left them): "a.png",
 * "cls/b.png", sorted; -1 when it cannot be read */
static int list_pngs(const char *dir, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    size_t cap = 0;
    char sub[FSIO_PATH_MAX], e[8];
    DIR *top = opendir(dir);
    if (!top) return -1;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(top))) {
        if (de->d_name[0] == '.') continue;
        struct stat sb;
        if (fsio_path(sub, sizeof sub, e, sizeof e, "%s/%s", dir, de->d_name) || lstat(sub, &sb)) {
            rc = -1;
        } else if (S_ISDIR(sb.st_mode)) {
            DIR *in = opendir(sub);
            struct dirent *ie;
            if (!in) rc = -1;
            while (rc == 0 && in && (ie = readdir(in)))
                if (ie->d_name[0] != '.') rc = push_name(names, n, &cap, de->d_name, ie->d_name);
            if (in) closedir(in);
        } else {
            rc = push_name(names, n, &cap, de->d_name, NULL);
        }
    }
    closedir(top);
    if (rc) {
        for (size_t i = 0; i < *n; i++) free((*names)[i]);
        free(*names);
        *names = NULL;
        *n = 0;
        return -1;
    }
    if (*n) qsort(*names, *n, sizeof **names, name_cmp);
    return 0;
}

int upload_decode(const char *dir, struct upload_result *res, int (*stopping)(const void *),
                  const void *arg, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    char **names;
    size_t n;
    if (list_pngs(dir, &names, &n)) {
        snprintf(err, errlen, "the dataset's images cannot be listed: %s", strerror(errno));
        return UPLOAD_ERR_IO;
    }
    int rc = UPLOAD_OK;
    char full[FSIO_PATH_MAX], shown[96], ierr[300];
    for (size_t i = 0; i < n && rc == UPLOAD_OK; i++) {
        if (stopping && stopping(arg)) {
            rc = UPLOAD_ERR_IO;
            snprintf(err, errlen, "stopped before every image was decoded");
            break;
        }
        echo(shown, sizeof shown, names[i]);
        struct image img;
        if (fsio_path(full, sizeof full, ierr, sizeof ierr, "%s/%s", dir, names[i]) ||
            image_load_png(full, &img, ierr, sizeof ierr)) {
            rc = UPLOAD_ERR_NOT_PNG;
            /* the reader names the file by its path here: keep only the reason */
            const char *reason = strstr(ierr, "': ");
            snprintf(err, errlen, "entry '%s': not a usable PNG: %s", shown,
                     reason ? reason + 3 : ierr);
            break;
        }
        int nr = note_image(res, &img);
        image_free(&img);
        if (nr) {
            rc = UPLOAD_ERR_IO;
            snprintf(err, errlen, "out of memory");
            break;
        }
        res->images++;
    }
    if (rc == UPLOAD_OK && res->images == 0) {
        rc = UPLOAD_ERR_EMPTY;
        snprintf(err, errlen, "the archive holds no PNG file");
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) upload_result_free(res);
    return rc;
}

/* ---- the store ---- */

static int store_dir(const char *data_dir, char *path, size_t len)
{
    char e[8];
    return fsio_path(path, len, e, sizeof e, "%s/datasets", data_dir);
}

/* a dataset's dataset.json parsed; NULL when there is none */
static cJSON *meta_load(const char *data_dir, const char *id)
{
    char *m = upload_dataset_meta(data_dir, id);
    cJSON *o = m ? cJSON_Parse(m) : NULL;
    free(m);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* o written as the dataset's dataset.json (atomically); 0 ok */
static int meta_save(const char *data_dir, const char *id, const cJSON *o)
{
    char path[FSIO_PATH_MAX], err[300];
    char *s = cJSON_PrintUnformatted(o);
    int rc = -1;
    if (s && upload_dataset_path(data_dir, id, "dataset.json", path, sizeof path) == 0)
        rc = fsio_write_atomic_text(path, s, err, sizeof err);
    free(s);
    return rc;
}

/* o's member k set to it, in its place (the file's order kept), or added at the end */
static void meta_set(cJSON *o, const char *k, cJSON *it)
{
    if (!it) return;
    if (cJSON_GetObjectItemCaseSensitive(o, k)) cJSON_ReplaceItemInObjectCaseSensitive(o, k, it);
    else cJSON_AddItemToObject(o, k, it);
}

static void meta_set_str(cJSON *o, const char *k, const char *v)
{
    meta_set(o, k, v ? cJSON_CreateString(v) : cJSON_CreateNull());
}

/* the dataset failed with why: its images removed (their bytes given back), the reason kept */
static void meta_fail(const char *data_dir, const char *id, cJSON *o, const char *why)
{
    char images[FSIO_PATH_MAX];
    if (upload_dataset_path(data_dir, id, "images", images, sizeof images) == 0)
        upload_rmtree(images);
    meta_set_str(o, "state", UPLOAD_STATE_FAILED);
    meta_set_str(o, "error", why);
    meta_save(data_dir, id, o);
}

int upload_store_init(const char *data_dir, char *err, size_t errlen)
{
    char dir[FSIO_PATH_MAX], p[FSIO_PATH_MAX];
    if (store_dir(data_dir, dir, sizeof dir) || (mkdir(dir, 0755) && errno != EEXIST)) {
        snprintf(err, errlen, "cannot create %s/datasets: %s", data_dir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if ((strncmp(de->d_name, ".upload-", 8) == 0 || strncmp(de->d_name, ".tmp-", 5) == 0 ||
             strncmp(de->d_name, ".del-", 5) == 0) &&
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name) < (int)sizeof p)
            upload_rmtree(p);
        /* a dataset left validating stays so: the server decodes it again at start
         * (upload_dataset_validating) */
    }
    closedir(d);
    return 0;
}

static int rand_hex(char *out, int bytes)
{
    unsigned char r[16];
    if (bytes > 16 || getrandom(r, (size_t)bytes, 0) != bytes) return -1;
    for (int i = 0; i < bytes; i++) sprintf(out + 2 * i, "%02x", r[i]);
    return 0;
}

int upload_part_open(const char *data_dir, char *path, size_t len, char *err, size_t errlen)
{
    char hex[33];
    if (rand_hex(hex, 8) ||
        fsio_path(path, len, err, errlen, "%s/datasets/.upload-%s.part", data_dir, hex)) {
        snprintf(err, errlen, "no name for the upload: %s", strerror(errno));
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) snprintf(err, errlen, "cannot store the upload: %s", strerror(errno));
    return fd;
}

int upload_dataset_path(const char *data_dir, const char *id, const char *tail, char *path,
                        size_t len)
{
    char e[8];
    if (!upload_id_valid(id)) return -1;
    return fsio_path(path, len, e, sizeof e, "%s/datasets/%s%s%s", data_dir, id, *tail ? "/" : "",
                     tail);
}

static int write_meta(const char *dir, const char *id, const char *owner, int64_t archive_bytes,
                      const struct upload_result *r, char *err, size_t errlen)
{
    /* channels and sizes from the headers until the images are decoded */
    char path[FSIO_PATH_MAX], now[32];
    jobs_now(now, sizeof now);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "owner", owner);
    cJSON_AddNumberToObject(o, "images", (double)r->images);
    cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
    cJSON_AddNumberToObject(o, "pixels", (double)r->pixels);
    cJSON_AddNumberToObject(o, "archive_bytes", (double)archive_bytes);
    cJSON_AddNumberToObject(o, "channels", r->channels);
    cJSON *sz = cJSON_AddObjectToObject(o, "sizes");
    cJSON_AddNumberToObject(sz, "min_width", r->min_w);
    cJSON_AddNumberToObject(sz, "max_width", r->max_w);
    cJSON_AddNumberToObject(sz, "min_height", r->min_h);
    cJSON_AddNumberToObject(sz, "max_height", r->max_h);
    cJSON_AddStringToObject(o, "created_at", now);
    cJSON_AddStringToObject(o, "state", UPLOAD_STATE_VALIDATING);
    cJSON_AddNullToObject(o, "error");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    int rc = -1;
    if (s && snprintf(path, sizeof path, "%s/dataset.json", dir) < (int)sizeof path)
        rc = fsio_write_atomic_text(path, s, err, errlen);
    else
        snprintf(err, errlen, "out of memory");
    free(s);
    return rc;
}

int upload_dataset_create(const char *data_dir, const char *part, const char *owner,
                          const struct upload_limits *lim, int64_t archive_bytes, char *id,
                          char *err, size_t errlen)
{
    char hex[33], tmp[FSIO_PATH_MAX], images[FSIO_PATH_MAX], final[FSIO_PATH_MAX], perr[300];
    struct upload_result res;
    memset(&res, 0, sizeof res);
    int rc = UPLOAD_ERR_IO, made = 0;
    if (rand_hex(hex, 8)) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        goto out;
    }
    id[0] = 'd';
    memcpy(id + 1, hex, 17); /* 16 hex digits and their NUL */
    if (fsio_path(tmp, sizeof tmp, err, errlen, "%s/datasets/.tmp-%s", data_dir, hex) ||
        fsio_path(images, sizeof images, err, errlen, "%s/images", tmp) ||
        upload_dataset_path(data_dir, id, "", final, sizeof final))
        goto out;
    if (mkdir(tmp, 0755)) {
        rc = errno == ENOSPC ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
        snprintf(err, errlen, "cannot create the dataset folder: %s", strerror(errno));
        goto out;
    }
    made = 1;
    testhold_before_unpack();
    rc = upload_unpack(part, images, lim, &res, err, errlen);
    if (rc) goto out;
    rc = UPLOAD_ERR_IO;
    if (write_meta(tmp, id, owner, archive_bytes, &res, perr, sizeof perr)) {
        rc = strstr(perr, "No space") ? UPLOAD_ERR_NOSPACE : UPLOAD_ERR_IO;
        snprintf(err, errlen, "cannot write dataset.json: %s", perr);
        goto out;
    }
    /* the owner's other datasets and this one within the quota, and named, in one step */
    pthread_mutex_lock(&quota_mu);
    int64_t used_bytes = 0, used_pixels = 0;
    if ((lim->quota_bytes > 0 || lim->quota_pixels > 0) &&
        upload_owner_usage(data_dir, owner, &used_bytes, &used_pixels)) {
        pthread_mutex_unlock(&quota_mu);
        snprintf(err, errlen, "the dataset folder cannot be read");
        goto out;
    }
    if ((lim->quota_bytes > 0 && used_bytes + res.bytes > lim->quota_bytes) ||
        (lim->quota_pixels > 0 && used_pixels + res.pixels > lim->quota_pixels)) {
        pthread_mutex_unlock(&quota_mu);
        rc = UPLOAD_ERR_QUOTA;
        if (lim->quota_bytes > 0 && used_bytes + res.bytes > lim->quota_bytes)
            snprintf(err, errlen, "%s's datasets hold %lld bytes; with this one's %lld that is "
                     "over the quota of %lld (--upload-quota-bytes): delete one first", owner,
                     (long long)used_bytes, (long long)res.bytes, (long long)lim->quota_bytes);
        else
            snprintf(err, errlen, "%s's datasets hold %lld pixels; with this one's %lld that is "
                     "over the quota of %lld (--upload-quota-pixels): delete one first", owner,
                     (long long)used_pixels, (long long)res.pixels, (long long)lim->quota_pixels);
        goto out;
    }
    int rn = rename(tmp, final);
    pthread_mutex_unlock(&quota_mu);
    if (rn) {
        snprintf(err, errlen, "cannot name the dataset: %s", strerror(errno));
        goto out;
    }
    char dir[FSIO_PATH_MAX];
    if (store_dir(data_dir, dir, sizeof dir) == 0) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) fsync(dfd), close(dfd);
    }
    rc = UPLOAD_OK;
out:
    upload_result_free(&res);
    unlink(part);
    if (rc && made) upload_rmtree(tmp);
    return rc;
}

char *upload_dataset_meta(const char *data_dir, const char *id)
{
    char path[FSIO_PATH_MAX], err[300];
    if (upload_dataset_path(data_dir, id, "dataset.json", path, sizeof path)) return NULL;
    FILE *f = fsio_fopen_read(path, err, sizeof err);
    if (!f) return NULL;
    char *s = malloc(65536);
    size_t n = s ? fread(s, 1, 65535, f) : 0;
    fclose(f);
    if (s) s[n] = 0;
    return s;
}

static int id_cmp(const void *a, const void *b) { return strcmp(a, b); }

int upload_dataset_ids(const char *data_dir, char (**ids)[UPLOAD_ID_LEN], int *n)
{
    char dir[FSIO_PATH_MAX];
    *ids = NULL;
    *n = 0;
    if (store_dir(data_dir, dir, sizeof dir)) return -1;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    int cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!upload_id_valid(de->d_name)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char(*g)[UPLOAD_ID_LEN] = realloc(*ids, (size_t)cap * sizeof **ids);
            if (!g) {
                closedir(d);
                free(*ids);
                *ids = NULL;
                *n = 0;
                return -1;
            }
            *ids = g;
        }
        memcpy((*ids)[(*n)++], de->d_name, UPLOAD_ID_LEN);
    }
    closedir(d);
    if (*n) qsort(*ids, (size_t)*n, sizeof **ids, id_cmp);
    return 0;
}

/* the dataset.json beside an upload's images folder (DIR/images), parsed; NULL when there is
 * none or it cannot be read */
static cJSON *folder_meta(const char *images_dir)
{
    char path[FSIO_PATH_MAX], err[300];
    const char *slash = strrchr(images_dir, '/');
    if (!slash || strcmp(slash, "/images") != 0 ||
        snprintf(path, sizeof path, "%.*s/dataset.json", (int)(slash - images_dir), images_dir) >=
            (int)sizeof path)
        return NULL;
    FILE *f = fsio_fopen_read(path, err, sizeof err);
    if (!f) return NULL;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

/* A folder without an upload's dataset.json (named by path: `ddpmd train` with data.dataset a
 * folder): its count, samples and largest image from its PNG headers (dataset_folder_probe),
 * so it is held and planned as an upload's folder is; -1 each when it cannot be listed */
static void folder_probe(const char *dir, int64_t *images, int64_t *src, int64_t *max_pixels)
{
    char err[300];
    if (dataset_folder_probe(dir, images, src, max_pixels, err, sizeof err))
        *images = *src = *max_pixels = -1;
}

int64_t upload_folder_images(const char *images_dir)
{
    cJSON *o = folder_meta(images_dir);
    int64_t n, src, mp;
    if (!o) {
        folder_probe(images_dir, &n, &src, &mp);
        return n;
    }
    const cJSON *im = cJSON_GetObjectItemCaseSensitive(o, "images");
    int64_t v = cJSON_IsNumber(im) && im->valuedouble >= 0 ? (int64_t)im->valuedouble : -1;
    cJSON_Delete(o);
    return v;
}

int upload_folder_samples_path(const char *images_dir, char *path, size_t len)
{
    char e[8];
    const char *slash = images_dir ? strrchr(images_dir, '/') : NULL;
    if (!slash || strcmp(slash, "/images") != 0) return -1;
    /* an upload's only: nothing is written beside a folder named by path */
    cJSON *o = folder_meta(images_dir);
    if (!o) return -1;
    cJSON_Delete(o);
    return fsio_path(path, len, e, sizeof e, "%.*s/samples.bin", (int)(slash - images_dir),
                     images_dir);
}

int64_t upload_folder_source_bytes(const char *images_dir)
{
    cJSON *o = folder_meta(images_dir);
    int64_t n, src, mp;
    if (!o) {
        folder_probe(images_dir, &n, &src, &mp);
        return src;
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "source_bytes");
    /* a bound that fits the plan's arithmetic; anything else is unknown */
    int64_t v = cJSON_IsNumber(b) && b->valuedouble >= 0 && b->valuedouble <= 0x1p53
                    ? (int64_t)b->valuedouble
                    : -1;
    cJSON_Delete(o);
    return v;
}

int64_t upload_folder_max_pixels(const char *images_dir)
{
    cJSON *o = folder_meta(images_dir);
    int64_t n, src, mp;
    if (!o) {
        folder_probe(images_dir, &n, &src, &mp);
        return mp;
    }
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(o, "sizes");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(sz, "max_width");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(sz, "max_height");
    int64_t v = cJSON_IsNumber(w) && cJSON_IsNumber(h) && w->valuedouble >= 1 &&
                        h->valuedouble >= 1 && w->valuedouble <= 1e6 && h->valuedouble <= 1e6
                    ? (int64_t)w->valuedouble * (int64_t)h->valuedouble
                    : -1;
    cJSON_Delete(o);
    return v;
}

int upload_dataset_delete(const char *data_dir, const char *id)
{
    char path[FSIO_PATH_MAX], away[FSIO_PATH_MAX], e[8];
    if (upload_dataset_path(data_dir, id, "", path, sizeof path) ||
        fsio_path(away, sizeof away, e, sizeof e, "%s/datasets/.del-%s", data_dir, id + 1))
        return -1;
    if (rename(path, away)) return -1;
    return upload_rmtree(away);
}

int upload_dataset_validating(const char *data_dir, char (**ids)[UPLOAD_ID_LEN], int *n)
{
    if (upload_dataset_ids(data_dir, ids, n)) return -1;
    int k = 0;
    for (int i = 0; i < *n; i++) {
        cJSON *m = meta_load(data_dir, (*ids)[i]);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "state");
        if (cJSON_IsString(st) && strcmp(st->valuestring, UPLOAD_STATE_VALIDATING) == 0)
            memmove((*ids)[k++], (*ids)[i], UPLOAD_ID_LEN);
        cJSON_Delete(m);
    }
    *n = k;
    return 0;
}

int upload_owner_usage(const char *data_dir, const char *owner, int64_t *bytes, int64_t *pixels)
{
    *bytes = *pixels = 0;
    char(*ids)[UPLOAD_ID_LEN];
    int n;
    if (upload_dataset_ids(data_dir, &ids, &n)) return -1;
    for (int i = 0; i < n; i++) {
        cJSON *m = meta_load(data_dir, ids[i]);
        const cJSON *ow = cJSON_GetObjectItemCaseSensitive(m, "owner");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "state");
        if (cJSON_IsString(ow) && strcmp(ow->valuestring, owner) == 0 &&
            !(cJSON_IsString(st) && strcmp(st->valuestring, UPLOAD_STATE_FAILED) == 0)) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(m, "bytes");
            const cJSON *px = cJSON_GetObjectItemCaseSensitive(m, "pixels");
            if (cJSON_IsNumber(b) && b->valuedouble > 0) *bytes += (int64_t)b->valuedouble;
            if (cJSON_IsNumber(px) && px->valuedouble > 0) {
                *pixels += (int64_t)px->valuedouble;
            } else { /* made before pixels were counted: its largest size for every image */
                const cJSON *im = cJSON_GetObjectItemCaseSensitive(m, "images");
                const cJSON *sz = cJSON_GetObjectItemCaseSensitive(m, "sizes");
                const cJSON *w = cJSON_GetObjectItemCaseSensitive(sz, "max_width");
                const cJSON *h = cJSON_GetObjectItemCaseSensitive(sz, "max_height");
                if (cJSON_IsNumber(im) && cJSON_IsNumber(w) && cJSON_IsNumber(h))
                    *pixels += (int64_t)im->valuedouble * (int64_t)w->valuedouble *
                               (int64_t)h->valuedouble;
            }
        }
        cJSON_Delete(m);
    }
    free(ids);
    return 0;
}

int upload_dataset_validate(const char *data_dir, const char *id, int (*stopping)(const void *),
                            const void *arg)
{
    char dir[FSIO_PATH_MAX], images[FSIO_PATH_MAX], path[FSIO_PATH_MAX], err[600], perr[300];
    if (upload_dataset_path(data_dir, id, "", dir, sizeof dir) ||
        upload_dataset_path(data_dir, id, "images", images, sizeof images) ||
        upload_dataset_path(data_dir, id, "preview.png", path, sizeof path))
        return -1;
    struct upload_result res;
    int rc = upload_decode(images, &res, stopping, arg, err, sizeof err);
    if (rc == UPLOAD_OK &&
        image_save_grid_png(path, res.preview, res.preview_n, res.preview_c, UPLOAD_PREVIEW_SIDE,
                            UPLOAD_PREVIEW_SIDE, 4, 2, perr, sizeof perr)) {
        rc = UPLOAD_ERR_IO;
        snprintf(err, sizeof err, "cannot write the preview: %s", perr);
    }
    if (stopping && stopping(arg)) { /* left validating: decoded again at the next start */
        upload_result_free(&res);
        return -1;
    }
    /* deleted meanwhile (DELETE renames it away first): nothing to record */
    upload_lock();
    cJSON *m = meta_load(data_dir, id);
    if (m && rc == UPLOAD_OK) {
        meta_set(m, "channels", cJSON_CreateNumber(res.channels));
        meta_set(m, "source_bytes", cJSON_CreateNumber((double)res.source_bytes));
        meta_set_str(m, "state", UPLOAD_STATE_READY);
        meta_set_str(m, "error", NULL);
        if (meta_save(data_dir, id, m)) rc = UPLOAD_ERR_IO;
    } else if (m) {
        meta_fail(data_dir, id, m, err);
    }
    upload_unlock();
    int ready = m && rc == UPLOAD_OK;
    cJSON_Delete(m);
    upload_result_free(&res);
    return ready ? 0 : -1;
}
