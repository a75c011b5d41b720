/* fuzz_util.c - helpers shared by the fuzz harnesses: input bytes as a file path (memfd), a
 * private scratch directory, invariant failures. */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void fuzz_fail(const char *target, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz: %s: ", target);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort(); /* test code: the crash is how libFuzzer and the replay test see the finding */
}

unsigned fuzz_touch(const void *p, size_t n)
{
    const volatile unsigned char *b = p;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s = s * 31u + b[i];
    return s;
}

static int fuzz_fds[4] = {-1, -1, -1, -1};
static char fuzz_paths[4][64];

const char *fuzz_bytes_path(int slot, const uint8_t *data, size_t size)
{
    if (slot < 0 || slot > 3) fuzz_fail("util", "bad memfd slot %d", slot);
    if (fuzz_fds[slot] < 0) {
        fuzz_fds[slot] = memfd_create("ddpmd-fuzz", MFD_CLOEXEC);
        if (fuzz_fds[slot] < 0) fuzz_fail("util", "memfd_create: %s", strerror(errno));
        snprintf(fuzz_paths[slot], sizeof fuzz_paths[slot], "/proc/self/fd/%d", fuzz_fds[slot]);
    }
    int fd = fuzz_fds[slot];
    if (ftruncate(fd, 0) != 0) fuzz_fail("util", "ftruncate: %s", strerror(errno));
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) fuzz_fail("util", "pwrite: %s", strerror(errno));
        done += (size_t)w;
    }
    return fuzz_paths[slot];
}

static char fuzz_dir_path[128];

static void fuzz_dir_cleanup(void)
{
    char cmd[192];
    if (!fuzz_dir_path[0]) return;
    /* the directory holds only the few flat files fuzz_write_file put there */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_path);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir_path);
}

const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/ddpmd-fuzz-XXXXXX", base);
    if (!mkdtemp(fuzz_dir_path)) fuzz_fail("util", "mkdtemp %s: %s", fuzz_dir_path, strerror(errno));
    atexit(fuzz_dir_cleanup);
    return fuzz_dir_path;
}

int fuzz_write_file(const char *name, const uint8_t *data, size_t size)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok ? 0 : -1;
}

void fuzz_remove_file(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    (void)unlink(path);
}
