/* testhold.c - the test-only step hold (see testhold.h): polls for the release file every 10 ms
 * and for the run's stop flag, so SIGINT/SIGTERM still stop a held run at once; and the
 * test-only record of a job's peak resident bytes by phase.
 */
#define _GNU_SOURCE
#include "testhold.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void testhold_after_step(int64_t step, volatile sig_atomic_t *stop)
{
    const char *at = getenv("DDPMD_TEST_HOLD_STEP"), *file = getenv("DDPMD_TEST_HOLD_FILE");
    if (!at || !file || !*file) return;
    char *end;
    long long n = strtoll(at, &end, 10);
    if (*end || end == at || n != step) return;
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (access(file, F_OK) != 0 && !(stop && *stop)) nanosleep(&tick, NULL);
}

void testhold_phase(const char *job, const char *phase)
{
    const char *dir = getenv("DDPMD_TEST_PEAK_DIR");
    if (!dir || !*dir) return;
    char path[4096], line[256];
    long long hwm = -1, rss = -1;
    FILE *f = fopen("/proc/self/status", "re");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lld kB", &hwm) != 1) sscanf(line, "VmRSS: %lld kB", &rss);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/peak-%ld.txt", dir, (long)getpid());
    int first = access(path, F_OK) != 0;
    FILE *o = fopen(path, "ae");
    if (!o) return;
    if (first) fprintf(o, "job %s\n", job);
    fprintf(o, "%s %lld %lld\n", phase, hwm, rss);
    fclose(o);
}

void testhold_before_plan(int (*stopping)(const void *arg), const void *arg)
{
    const char *file = getenv("DDPMD_TEST_HOLD_PLAN_FILE");
    if (!file || !*file) return;
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (access(file, F_OK) != 0 && !stopping(arg)) nanosleep(&tick, NULL);
}

void testhold_before_unpack(void)
{
    const char *file = getenv("DDPMD_TEST_HOLD_UPLOAD_FILE");
    if (!file || !*file) return;
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 6000 && access(file, F_OK) != 0; i++) nanosleep(&tick, NULL);
}
