/* fsio.h - file access shared by every reader and writer of job files: opening only regular files
 * (a FIFO or device named as a spec, checkpoint or image must not hang or be read), one atomic
 * write (temp, fsync, rename, fsync of the folder) for every file a job produces, with the reason
 * in every error.
 */
#ifndef DDPMD_FSIO_H
#define DDPMD_FSIO_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* the longest path fsio writes, temporary names included (PATH_MAX of Linux) */
#define FSIO_PATH_MAX 4096
/* the temporary of PATH is "PATH" FSIO_TMP_INFIX "XXXXXX" (mkstemp), in PATH's folder */
#define FSIO_TMP_INFIX ".tmp."
/* the longest final path fsio_write_atomic accepts: room for the temporary's suffix */
#define FSIO_FINAL_MAX (FSIO_PATH_MAX - 1 - (int)sizeof FSIO_TMP_INFIX - 6)

/* open(2) of a regular file without blocking on a FIFO: O_NONBLOCK while opening, then cleared;
 * anything but a regular file is refused ("is a directory", "is not a regular file"). Returns the
 * descriptor (O_CLOEXEC), or -1 with "cannot open 'PATH': REASON" in err. */
int fsio_open_regular(const char *path, int flags, char *err, size_t errlen);
/* the same as a stdio stream opened for reading ("rb") */
FILE *fsio_fopen_read(const char *path, char *err, size_t errlen);

/* every byte of buf to fd, retrying short writes and EINTR; 0 or -1 with errno set */
int fsio_write_full(int fd, const void *buf, size_t len);

/* one piece of a file's contents */
struct fsio_buf {
    const void *data;
    size_t len;
};

/* Replaces (or creates) path with the concatenation of bufs[0..n), all or nothing: a temporary
 * in the same folder (mode 0666 less the umask), every byte written (short writes and EINTR retried), fsync,
 * rename over path, fsync of the folder. On any failure before the rename the temporary is
 * removed and path is untouched; err says which step failed and strerror(errno) ("cannot write
 * 'P.tmp.ab12Cd': No space left on device"). A path longer than FSIO_FINAL_MAX is refused, never
 * truncated. After the rename only the folder's fsync can fail: path then holds the new file and
 * -1 is still returned (the rename may not survive a crash). Returns 0 or -1. */
int fsio_write_atomic(const char *path, const struct fsio_buf *bufs, int n, char *err,
                      size_t errlen);
/* Where a file's contents come from, piece by piece: fills *b with the next piece (valid until
 * the next call) and returns 1, returns 0 after the last, or -1 when it cannot make one. */
typedef int (*fsio_next_fn)(void *ctx, struct fsio_buf *b);
/* fsio_write_atomic over the pieces next gives, so a file need not be held whole in memory; a
 * -1 from next fails the write as a failed write(2) would (err: "cannot make the contents of
 * 'P'"), leaving path untouched. */
int fsio_write_atomic_stream(const char *path, fsio_next_fn next, void *ctx, char *err,
                             size_t errlen);
/* the same for one NUL-terminated text */
int fsio_write_atomic_text(const char *path, const char *text, char *err, size_t errlen);

/* A data directory only its owner can read, whatever the umask it was started with: sets the
 * process's umask to 077 (so every file made from now on, by this process and its children, is
 * 0600 and every folder 0700: SQLite's, the jobs', the uploads', webhook URLs), then creates dir
 * 0700 or makes an existing one 0700. 0, or -1 with the reason in err. */
int fsio_private_dir(const char *dir, char *err, size_t errlen);

/* a failure's message into err (vsnprintf; nothing when err is NULL or errlen 0): the one way
 * the readers and writers of job files fill their err */
void fsio_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* snprintf into buf that refuses to truncate: -1 with "path too long: N bytes (limit L): ..." in
 * err when the result does not fit (buf is then ""), 0 otherwise */
int fsio_path(char *buf, size_t len, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
