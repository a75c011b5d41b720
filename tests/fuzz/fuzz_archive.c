/* fuzz_archive.c - the upload check (upload_unpack: libarchive's tar and gzip readers, then the
 * entry rules and each PNG's header) and the decoding after it (upload_decode) on arbitrary
 * bytes, into a private folder. Invariants: a refusal says why and leaves no folder; an
 * acceptance leaves only folders and regular .png files at most one folder deep (never a link or
 * anything outside), as many PNGs as it reports, and no more bytes than the limit; the decoding
 * either says why it fails or decodes them all with the sizes the headers said and a preview;
 * removing it leaves nothing. */
#define _GNU_SOURCE /* nftw */
#include "fuzz.h"
#include "upload.h"

#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int64_t seen_files, seen_bytes;
static size_t dest_len;
static const char *bad;

static int visit(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    if (ftw->level == 0) return 0; /* the folder itself */
    const char *rel = path + dest_len + 1;
    if (ftw->level > 2) bad = "an entry deeper than one folder";
    if (flag == FTW_SL || flag == FTW_SLN || S_ISLNK(sb->st_mode)) bad = "a symbolic link";
    if (S_ISDIR(sb->st_mode)) {
        if (ftw->level > 1) bad = "a folder inside a folder";
        return 0;
    }
    if (!S_ISREG(sb->st_mode)) bad = "something that is neither folder nor file";
    size_t n = strlen(rel);
    if (n < 5 || strcasecmp(rel + n - 4, ".png") != 0) bad = "a file not named .png";
    if (sb->st_nlink != 1) bad = "a file with another link";
    seen_files++;
    seen_bytes += sb->st_size;
    return 0;
}

int fuzz_archive(const uint8_t *data, size_t size)
{
    const char *path = fuzz_bytes_path(0, data, size);
    char dest[4200];
    snprintf(dest, sizeof dest, "%s/ds", fuzz_dir());
    upload_rmtree(dest);
    struct upload_limits lim = {.max_unpacked = 1 << 20, .max_files = 64};
    struct upload_result res;
    char err[600] = "";
    int rc = upload_unpack(path, dest, &lim, &res, err, sizeof err);
    struct stat sb;
    if (rc != UPLOAD_OK) {
        if (!err[0]) fuzz_fail("archive", "refusal %d without a message", rc);
        if (lstat(dest, &sb) == 0) fuzz_fail("archive", "refusal %d (%s) left the folder", rc, err);
        if (res.preview || res.images) fuzz_fail("archive", "refusal %d left a result", rc);
        return 0;
    }
    seen_files = seen_bytes = 0;
    bad = NULL;
    dest_len = strlen(dest);
    if (nftw(dest, visit, 16, FTW_PHYS)) fuzz_fail("archive", "cannot walk the unpacked folder");
    if (bad) fuzz_fail("archive", "accepted, but it unpacked %s", bad);
    if (res.images < 1 || seen_files != res.images || seen_bytes != res.bytes ||
        res.bytes > lim.max_unpacked)
        fuzz_fail("archive", "reports %lld images of %lld bytes; the folder holds %lld of %lld",
                  (long long)res.images, (long long)res.bytes, (long long)seen_files,
                  (long long)seen_bytes);
    if (res.preview || res.pixels < res.images)
        fuzz_fail("archive", "the header pass made a preview, or %lld pixels for %lld images",
                  (long long)res.pixels, (long long)res.images);
    struct upload_result dec;
    err[0] = 0;
    rc = upload_decode(dest, &dec, NULL, NULL, err, sizeof err);
    if (rc != UPLOAD_OK) {
        if (!err[0] || dec.preview || dec.images) fuzz_fail("archive", "decode refusal %d: '%s'", rc, err);
    } else {
        if (dec.images != res.images || dec.pixels != res.pixels || dec.min_w != res.min_w ||
            dec.max_w != res.max_w || dec.min_h != res.min_h || dec.max_h != res.max_h)
            fuzz_fail("archive", "decoded %lld images of %lld pixels; the headers said %lld of %lld",
                      (long long)dec.images, (long long)dec.pixels, (long long)res.images,
                      (long long)res.pixels);
        if (dec.preview_n < 1 || dec.preview_n > UPLOAD_PREVIEW_N || !dec.preview ||
            (dec.preview_c != 1 && dec.preview_c != 3))
            fuzz_fail("archive", "preview of %d tiles, %d channels", dec.preview_n, dec.preview_c);
        fuzz_touch(dec.preview, (size_t)dec.preview_n * (size_t)dec.preview_c *
                                    UPLOAD_PREVIEW_SIDE * UPLOAD_PREVIEW_SIDE * sizeof(float));
        upload_result_free(&dec);
    }
    upload_result_free(&res);
    if (upload_rmtree(dest) || lstat(dest, &sb) == 0) fuzz_fail("archive", "the folder stays");
    return 0;
}
