/* metrics.h - the server's Prometheus counters and histograms (GET /metrics). Process-wide and
 * lock-free (C11 atomics): the HTTP threads and the pool's thread update them without a lock.
 * metrics_render writes them in the text exposition format 0.0.4, with the gauges (jobs by state,
 * the device's bytes) the caller reads at scrape time, the process's own (process_*: CPU,
 * memory, descriptors, start time, from /proc) and ddpmd_build_info.
 */
#ifndef DDPMD_METRICS_H
#define DDPMD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "jobs.h"

#define METRICS_MAX_ROUTES 64

/* why a job ended failed (ddpmd_job_failures_total{reason}) */
enum metrics_failure {
    METRICS_FAIL_SIGNAL = 0,    /* its process was killed by a signal (after its retries) */
    METRICS_FAIL_EXIT,          /* its process exited with an error status */
    METRICS_FAIL_START,         /* its process could not be started */
    METRICS_FAIL_COUNT
};

/* the route labels: "METHOD PATTERN" pairs in the api's table order (kept, not copied); a route
 * index outside [0, n) counts as route "unmatched" with its request's method (GET, HEAD, POST,
 * PUT, DELETE, PATCH, OPTIONS, else "other"). streams[i] (may be NULL): route i answers an event
 * stream, whose seconds go to ddpmd_sse_stream_duration_seconds, not to the request latency */
void metrics_set_routes(const char *const *methods, const char *const *patterns,
                        const int *streams, int n);
/* one answered request: its route index, method (for an unmatched one), status and seconds
 * from first byte to completion */
void metrics_http_observe(int route, const char *method, unsigned status, double seconds);
/* the build: its version and `git describe` of the source ("" when it was no checkout) */
void metrics_build(const char **version, const char **revision);

/* a job reported steps it trained (images = steps x batch), each taking step_s seconds on
 * average (step_s < 0: unknown, the histogram is not fed) */
void metrics_train_steps(int64_t steps, int64_t images, double step_s);
void metrics_job_failed(enum metrics_failure why);
void metrics_job_retried(void);

/* read at scrape time */
struct metrics_device {
    const char *name;
    int64_t budget_bytes, reserved_bytes;
    int running_jobs;
    int poisoned;               /* a sticky CUDA error poisoned it */
};
struct metrics_gauges {
    int jobs[JOB_STATE_COUNT];  /* jobs in the store by state */
    int jobs_ok;                /* 0: the store could not be read (no ddpmd_jobs lines) */
    const struct metrics_device *devices;
    int n_devices;
};

/* the exposition text (caller frees); NULL when out of memory */
char *metrics_render(const struct metrics_gauges *g, size_t *len);

#endif
