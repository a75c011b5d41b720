/* fsio.c - opening regular files only, and the one atomic write of job files (temp, fsync,
 * rename, fsync of the folder), with the reason in every error (see fsio.h). */
#include "fsio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void fsio_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int fsio_open_regular(const char *path, int flags, char *err, size_t errlen)
{
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        fsio_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fsio_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        fsio_err(err, errlen, "cannot open '%s': is a directory", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        fsio_err(err, errlen, "cannot open '%s': is not a regular file", path);
        goto fail;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        fsio_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return -1;
}

FILE *fsio_fopen_read(const char *path, char *err, size_t errlen)
{
    int fd = fsio_open_regular(path, O_RDONLY, err, errlen);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        fsio_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int fsio_write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) {
            errno = EIO; /* a regular file that accepts nothing: not progress */
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* the process's umask without changing it (umask(2) would, for a moment, for every thread) */
static mode_t current_umask(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned m = 022;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &m) == 1) break;
    if (f) fclose(f);
    return (mode_t)(m & 0777);
}

int fsio_private_dir(const char *dir, char *err, size_t errlen)
{
    umask(077);
    if (mkdir(dir, 0700) && errno != EEXIST) {
        fsio_err(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    if (chmod(dir, 0700)) {
        fsio_err(err, errlen, "cannot make %s private (chmod 0700): %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* fsio_write_atomic's pieces: bufs[0..n) in order */
struct fsio_array {
    const struct fsio_buf *bufs;
    int n, i;
};

static int fsio_array_next(void *ctx, struct fsio_buf *b)
{
    struct fsio_array *a = ctx;
    if (a->i >= a->n) return 0;
    *b = a->bufs[a->i++];
    return 1;
}

int fsio_write_atomic(const char *path, const struct fsio_buf *bufs, int n, char *err,
                      size_t errlen)
{
    if (n < 0 || (n > 0 && !bufs)) {
        fsio_err(err, errlen, "fsio_write_atomic: NULL or empty argument");
        return -1;
    }
    struct fsio_array a = {bufs, n, 0};
    return fsio_write_atomic_stream(path, fsio_array_next, &a, err, errlen);
}

int fsio_write_atomic_stream(const char *path, fsio_next_fn next, void *ctx, char *err,
                             size_t errlen)
{
    char tmp[FSIO_PATH_MAX], dir[FSIO_PATH_MAX];
    int fd = -1, dfd = -1, created = 0, rc = -1;
    size_t plen = path ? strlen(path) : 0;
    if (err && errlen) err[0] = '\0';
    if (!path || !*path || !next) {
        fsio_err(err, errlen, "fsio_write_atomic: NULL or empty argument");
        return -1;
    }
    if (plen > (size_t)FSIO_FINAL_MAX) {
        fsio_err(err, errlen, "cannot write '%.200s...': the path is %zu bytes (limit %d)", path,
                 plen, FSIO_FINAL_MAX);
        return -1;
    }
    /* the folder, for the post-rename fsync ("." for a bare name, "/" for "/name") */
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    /* same folder as path, so the rename is atomic; mkstemp makes the name unique per call, so
     * concurrent writers of one path never share a temporary */
    snprintf(tmp, sizeof tmp, "%s" FSIO_TMP_INFIX "XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        fsio_err(err, errlen, "cannot create a temporary for '%s': %s", path, strerror(errno));
        goto out;
    }
    created = 1;
    /* mkstemp makes it 0600: give it the mode open(2) would, 0666 less the umask */
    if (fchmod(fd, 0666 & ~current_umask()) != 0) {
        fsio_err(err, errlen, "cannot chmod '%s': %s", tmp, strerror(errno));
        goto out;
    }
    for (;;) {
        struct fsio_buf b = {NULL, 0};
        int more = next(ctx, &b);
        if (more < 0) {
            fsio_err(err, errlen, "cannot make the contents of '%s'", path);
            goto out;
        }
        if (!more) break;
        if (b.len && fsio_write_full(fd, b.data, b.len) != 0) {
            fsio_err(err, errlen, "cannot write '%s': %s", tmp, strerror(errno));
            goto out;
        }
    }
    if (fsync(fd) != 0) {
        fsio_err(err, errlen, "cannot fsync '%s': %s", tmp, strerror(errno));
        goto out;
    }
    int closed = close(fd);
    fd = -1;
    if (closed != 0) {
        fsio_err(err, errlen, "cannot close '%s': %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        fsio_err(err, errlen, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto out;
    }
    created = 0; /* the temporary's name is gone: path holds the new file */
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        fsio_err(err, errlen, "saved '%s' but cannot open its folder to fsync: %s", path,
                 strerror(errno));
        goto out;
    }
    /* EINVAL: the filesystem cannot sync folders; nothing more can be done there */
    if (fsync(dfd) != 0 && errno != EINVAL) {
        fsio_err(err, errlen, "saved '%s' but cannot fsync its folder: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0) close(fd);
    if (created) unlink(tmp);
    if (dfd >= 0) close(dfd);
    return rc;
}

int fsio_write_atomic_text(const char *path, const char *text, char *err, size_t errlen)
{
    struct fsio_buf b = {text, text ? strlen(text) : 0};
    return fsio_write_atomic(path, &b, 1, err, errlen);
}

int fsio_path(char *buf, size_t len, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < len) return 0;
    fsio_err(err, errlen, "path too long: %d bytes (limit %zu): '%.200s...'", k, len ? len - 1 : 0,
             buf);
    if (len) buf[0] = '\0';
    return -1;
}
