/* test_metrics.c - server/metrics.c without a server: 4 threads observing requests and training
 * steps at once lose no count (exact totals, histogram buckets cumulative and consistent with
 * _count, _sum in seconds), each value lands in the bucket its bounds name, label values are
 * escaped, and the gauges render as given; an unmatched request is labelled with its method
 * (unknown ones "other"), an event stream's seconds go to their own histogram, not the latency,
 * and the process_* family and ddpmd_build_info are there.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "test_util.h"

#define THREADS 4
#define PER_THREAD 1000000

static const char *const methods[] = {"GET", "POST", "GET"};
static const char *const patterns[] = {"/jobs/{id}", "/a\"b\\c", "/jobs/{id}/events"};
static const int streams[] = {0, 0, 1};

static pthread_barrier_t start_together; /* the threads overlap, so a lost update would show */

static void *hammer(void *arg)
{
    int t = (int)(intptr_t)arg;
    pthread_barrier_wait(&start_together);
    for (int i = 0; i < PER_THREAD; i++) {
        /* route 0: 0.003 s each (bucket le=0.005); route 1: 2 s (le=2.5); and out of range */
        metrics_http_observe(i % 2, "GET", i % 3 ? 200 : 404, i % 2 ? 2.0 : 0.003);
        if (i % 1000 == 0) metrics_http_observe(99, "BREW", 418, 0.0);
        if (i % 1000 == 1) metrics_http_observe(-1, "DELETE", 404, 0.0);
        if (i % 100000 == 2) metrics_http_observe(2, "GET", 200, 600.0); /* a 10-minute stream */
        metrics_train_steps(1, 4, t % 2 ? 0.02 : 0.2);
    }
    return NULL;
}

/* the value of the line starting with prefix (exactly, up to the space before the value) */
static double value(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

int main(void)
{
    metrics_set_routes(methods, patterns, streams, 3);
    pthread_t th[THREADS];
    pthread_barrier_init(&start_together, NULL, THREADS);
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, hammer, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start_together);
    metrics_job_failed(METRICS_FAIL_EXIT);
    metrics_job_failed(METRICS_FAIL_EXIT);
    metrics_job_failed(METRICS_FAIL_SIGNAL);
    metrics_job_retried();

    const struct metrics_device devs[] = {{"cpu", 1000, 300, 2, 0}, {"cuda:1", 4000, 0, 0, 1}};
    struct metrics_gauges g = {.jobs_ok = 1, .devices = devs, .n_devices = 2};
    g.jobs[JOB_QUEUED] = 5;
    g.jobs[JOB_SUCCEEDED] = 7;
    size_t len = 0;
    char *m = metrics_render(&g, &len);
    CHECK(m && len == strlen(m), "render");
    if (!m) return tu_finish("test_metrics");

    const double n = (double)THREADS * PER_THREAD;
    CHECK(value(m, "ddpmd_train_steps_total") == n, "steps %g", value(m, "ddpmd_train_steps_total"));
    CHECK(value(m, "ddpmd_train_images_total") == 4 * n, "images");
    CHECK(value(m, "ddpmd_train_step_seconds_count") == n, "step count");
    CHECK(value(m, "ddpmd_train_step_seconds_bucket{le=\"0.025\"}") == n / 2, "steps <= 0.025 s");
    CHECK(value(m, "ddpmd_train_step_seconds_bucket{le=\"0.25\"}") == n, "steps <= 0.25 s");
    CHECK(value(m, "ddpmd_train_step_seconds_bucket{le=\"+Inf\"}") == n, "steps +Inf");
    double sum = value(m, "ddpmd_train_step_seconds_sum");
    CHECK(sum > n / 2 * 0.22 - 1e-3 && sum < n / 2 * 0.22 + 1e-3, "step sum %.9f", sum);

    /* route 0: i even, status 200 unless i % 3 == 0 */
    double r0 = 0, r0_404 = 0;
    for (int i = 0; i < PER_THREAD; i += 2) {
        r0++;
        r0_404 += i % 3 == 0;
    }
    CHECK(value(m, "ddpmd_http_requests_total{method=\"GET\",route=\"/jobs/{id}\",status=\"200\"}") ==
              THREADS * (r0 - r0_404), "GET /jobs/{id} 200");
    CHECK(value(m, "ddpmd_http_requests_total{method=\"GET\",route=\"/jobs/{id}\",status=\"404\"}") ==
              THREADS * r0_404, "GET /jobs/{id} 404");
    CHECK(value(m, "ddpmd_http_request_duration_seconds_bucket{method=\"GET\",route=\"/jobs/{id}\","
                   "le=\"0.0025\"}") == 0, "0.003 s is not <= 0.0025");
    CHECK(value(m, "ddpmd_http_request_duration_seconds_bucket{method=\"GET\",route=\"/jobs/{id}\","
                   "le=\"0.005\"}") == THREADS * r0, "0.003 s is <= 0.005");
    CHECK(value(m, "ddpmd_http_request_duration_seconds_count{method=\"GET\",route=\"/jobs/{id}\"}") ==
              THREADS * r0, "route 0 count");
    /* the route label escaped: /a"b\c */
    CHECK(value(m, "ddpmd_http_request_duration_seconds_bucket{method=\"POST\",route=\"/a\\\"b\\\\c\","
                   "le=\"1\"}") == 0, "2 s is not <= 1");
    CHECK(value(m, "ddpmd_http_request_duration_seconds_bucket{method=\"POST\",route=\"/a\\\"b\\\\c\","
                   "le=\"2.5\"}") == THREADS * (PER_THREAD / 2), "2 s is <= 2.5");
    CHECK(value(m, "ddpmd_http_requests_total{method=\"other\",route=\"unmatched\",status=\"other\"}") ==
              THREADS * (PER_THREAD / 1000), "an out-of-range route, method and status");
    CHECK(value(m, "ddpmd_http_requests_total{method=\"DELETE\",route=\"unmatched\",status=\"404\"}") ==
              THREADS * (PER_THREAD / 1000), "an unmatched DELETE");
    CHECK(!strstr(m, "method=\"\""), "a request without its method label");
    /* streams: counted as requests, timed apart from the latency */
    CHECK(value(m, "ddpmd_http_requests_total{method=\"GET\",route=\"/jobs/{id}/events\",status=\"200\"}") ==
              THREADS * (PER_THREAD / 100000), "streams counted");
    CHECK(value(m, "ddpmd_sse_stream_duration_seconds_bucket{le=\"300\"}") == 0 &&
              value(m, "ddpmd_sse_stream_duration_seconds_bucket{le=\"900\"}") ==
                  THREADS * (PER_THREAD / 100000) &&
              value(m, "ddpmd_sse_stream_duration_seconds_count") == THREADS * (PER_THREAD / 100000),
          "the streams' 600 s in their histogram");
    CHECK(!strstr(m, "ddpmd_http_request_duration_seconds_count{method=\"GET\",route=\"/jobs/{id}/events\"}"),
          "streams in the request latency");
    /* the process and the build */
    CHECK(value(m, "process_resident_memory_bytes") > 1e5, "resident bytes");
    CHECK(value(m, "process_cpu_seconds_total") > 0, "cpu seconds");
    CHECK(value(m, "process_open_fds") >= 3 && value(m, "process_max_fds") >= value(m, "process_open_fds"),
          "fds %g of %g", value(m, "process_open_fds"), value(m, "process_max_fds"));
    CHECK(value(m, "process_start_time_seconds") > 1.5e9, "start time");
    CHECK(strstr(m, "\nddpmd_build_info{version=\"") != NULL, "build info");
    CHECK(value(m, "ddpmd_job_failures_total{reason=\"exit_status\"}") == 2, "exit failures");
    CHECK(value(m, "ddpmd_job_failures_total{reason=\"signal\"}") == 1, "signal failures");
    CHECK(value(m, "ddpmd_job_failures_total{reason=\"start\"}") == 0, "start failures");
    CHECK(value(m, "ddpmd_job_retries_total") == 1, "retries");
    CHECK(value(m, "ddpmd_jobs{state=\"queued\"}") == 5 && value(m, "ddpmd_queue_length") == 5,
          "queued");
    CHECK(value(m, "ddpmd_jobs{state=\"succeeded\"}") == 7, "succeeded");
    CHECK(value(m, "ddpmd_device_free_bytes{device=\"cpu\"}") == 700, "free bytes");
    CHECK(value(m, "ddpmd_device_running_jobs{device=\"cpu\"}") == 2, "running jobs");
    CHECK(value(m, "ddpmd_device_poisoned{device=\"cpu\"}") == 0, "cpu not poisoned");
    CHECK(value(m, "ddpmd_device_poisoned{device=\"cuda:1\"}") == 1, "cuda:1 poisoned");
    CHECK(value(m, "ddpmd_device_budget_bytes{device=\"cuda:1\"}") == 4000, "cuda:1 budget");
    CHECK(value(m, "ddpmd_device_free_bytes{device=\"cuda:1\"}") == 4000, "cuda:1 free");
    free(m);

    /* a store that cannot be read: no ddpmd_jobs lines rather than made-up zeros */
    g.jobs_ok = 0;
    m = metrics_render(&g, NULL);
    CHECK(m && !strstr(m, "ddpmd_jobs{") && !strstr(m, "ddpmd_queue_length"), "no store gauges");
    free(m);
    return tu_finish("test_metrics");
}
