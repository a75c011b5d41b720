/* clock.h - the two clocks the server times things with: monotonic wall seconds (durations,
 * deadlines) and the calling thread's CPU seconds (a step's own work, however busy the machine).
 */
#ifndef DDPMD_CLOCK_H
#define DDPMD_CLOCK_H

#include <time.h>

static inline double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double clock_thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
