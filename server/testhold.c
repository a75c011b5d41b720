/* testhold.c - the test-only step hold (see testhold.h): polls for the release file every 10 ms
 * and for the run's stop flag, so SIGINT/SIGTERM still stop a held run at once.
 */
#define _GNU_SOURCE
#include "testhold.h"

#include <stdlib.h>
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
