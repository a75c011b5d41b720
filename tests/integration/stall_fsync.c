/* stall_fsync.c - an LD_PRELOAD shim for the restart tests: makes the window of a checkpoint
 * write observable without test-only code in ddpmd. The first fsync of a file whose name holds
 * STALL_FSYNC_MATCH (e.g. ".safetensors.tmp."), across every process given the same
 * STALL_FSYNC_MARK, creates that mark file (O_EXCL: one stall per mark) holding the file's path,
 * then waits STALL_FSYNC_SECONDS (signals do not shorten it) before the real fsync, or less when
 * the file STALL_FSYNC_RELEASE appears first (a test that releases the write by an event). Without
 * both of MATCH and MARK it is a plain fsync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double stall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int fsync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *match = getenv("STALL_FSYNC_MATCH"), *mark = getenv("STALL_FSYNC_MARK");
    if (match && *match && mark && *mark) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = 0;
            int m = strstr(path, match) ? open(mark, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644) : -1;
            if (m >= 0) {
                ssize_t w = write(m, path, (size_t)n);
                (void)w;
                close(m);
                const char *secs = getenv("STALL_FSYNC_SECONDS"), *rel = getenv("STALL_FSYNC_RELEASE");
                double until = stall_now() + (secs ? atof(secs) : 3600.0);
                while (stall_now() < until && !(rel && *rel && access(rel, F_OK) == 0)) {
                    struct timespec t = {0, 20 * 1000 * 1000};
                    nanosleep(&t, NULL);
                }
            }
        }
    }
    return real ? real(fd) : (errno = ENOSYS, -1);
}
