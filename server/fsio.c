/* fsio.c - opening regular files only, with the reason in the error (see fsio.h). */
#include "fsio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void fsio_err(char *err, size_t errlen, const char *fmt, ...)
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
