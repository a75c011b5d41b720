/* fsio.h - file access shared by every reader and writer of job files: opening only regular files
 * (a FIFO or device named as a spec, checkpoint or image must not hang or be read), with the
 * reason in every error.
 */
#ifndef DDPMD_FSIO_H
#define DDPMD_FSIO_H

#include <stddef.h>
#include <stdio.h>

/* open(2) of a regular file without blocking on a FIFO: O_NONBLOCK while opening, then cleared;
 * anything but a regular file is refused ("is a directory", "is not a regular file"). Returns the
 * descriptor (O_CLOEXEC), or -1 with "cannot open 'PATH': REASON" in err. */
int fsio_open_regular(const char *path, int flags, char *err, size_t errlen);
/* the same as a stdio stream opened for reading ("rb") */
FILE *fsio_fopen_read(const char *path, char *err, size_t errlen);

#endif
