/* metrics.c - Prometheus counters and histograms (see metrics.h). Every figure is an
 * atomic_uint_least64_t; histogram sums are kept in integer nanoseconds so an observation is a
 * fetch_add, never a lock or a compare-and-swap loop.
 */
#define _GNU_SOURCE /* open_memstream */
#include "metrics.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ddpmd_version.h" /* made by server/version.cmake at build time */

typedef atomic_uint_least64_t counter;

/* the statuses the api answers with; anything else counts as "other" */
static const unsigned statuses[] = {200, 201, 202, 204, 206, 304, 400, 401, 403, 404, 405, 409,
                                    413, 415, 416, 422, 429, 500, 503, 507};
#define N_STATUS ((int)(sizeof statuses / sizeof statuses[0]))

static const double http_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                     0.25,  0.5,    1,     2.5,  5,     10,   30};
#define N_HTTP_B ((int)(sizeof http_bounds / sizeof http_bounds[0]))
static const double step_bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                     0.5,   1,     2.5,  5,     10,   30,  60};
#define N_STEP_B ((int)(sizeof step_bounds / sizeof step_bounds[0]))

/* an event stream lasts as long as its job (and its client): seconds to a day */
static const double sse_bounds[] = {1, 5, 15, 60, 300, 900, 3600, 14400, 86400};
#define N_SSE_B ((int)(sizeof sse_bounds / sizeof sse_bounds[0]))

/* an unmatched request's method label; a method outside these is "other" (a label set the
 * client cannot grow) */
static const char *const http_methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH",
                                           "OPTIONS", "other"};
#define N_METHOD ((int)(sizeof http_methods / sizeof http_methods[0]))

struct hist {
    counter bucket[16]; /* non-cumulative: bucket[i] counts bounds[i-1] < v <= bounds[i]; the last
                         * one past the bounds is +Inf */
    counter count;
    counter sum_ns;
};

/* routes [0, n_routes), then the "unmatched" slots, one per method, at n_routes + m */
static const char *const *route_methods, *const *route_patterns;
static int n_routes;
static int route_stream[METRICS_MAX_ROUTES];
static counter http_count[METRICS_MAX_ROUTES + N_METHOD][N_STATUS + 1];
static struct hist http_hist[METRICS_MAX_ROUTES + N_METHOD];
static struct hist sse_hist;

static counter steps_total, images_total, retries_total;
static counter failures[METRICS_FAIL_COUNT];
static struct hist step_hist;

static const char *const failure_names[METRICS_FAIL_COUNT] = {"signal", "exit_status", "start"};

void metrics_set_routes(const char *const *methods, const char *const *patterns,
                        const int *streams, int n)
{
    route_methods = methods;
    route_patterns = patterns;
    n_routes = n < METRICS_MAX_ROUTES ? n : METRICS_MAX_ROUTES;
    for (int i = 0; i < n_routes; i++) route_stream[i] = streams && streams[i];
}

void metrics_build(const char **version, const char **revision)
{
    if (version) *version = DDPMD_VERSION;
    if (revision) *revision = DDPMD_GIT;
}

static void hist_observe(struct hist *h, const double *bounds, int nb, double v, uint64_t times)
{
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    if (!(v >= 0)) v = 0;
    atomic_fetch_add_explicit(&h->bucket[i], times, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, times, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)(v * 1e9 + 0.5) * times, memory_order_relaxed);
}

void metrics_http_observe(int route, const char *method, unsigned status, double seconds)
{
    int r = route;
    if (route < 0 || route >= n_routes) {
        int m = 0;
        while (m < N_METHOD - 1 && !(method && strcmp(method, http_methods[m]) == 0)) m++;
        r = n_routes + m;
    }
    int s = 0;
    while (s < N_STATUS && statuses[s] != status) s++;
    atomic_fetch_add_explicit(&http_count[r][s], 1, memory_order_relaxed);
    if (r < n_routes && route_stream[r])
        hist_observe(&sse_hist, sse_bounds, N_SSE_B, seconds, 1);
    else
        hist_observe(&http_hist[r], http_bounds, N_HTTP_B, seconds, 1);
}

/* the process_* family a Prometheus client library exports, from /proc: CPU seconds, resident
 * and virtual bytes, open and maximum descriptors, start time; a value that cannot be read is
 * left out */
static void process_write(FILE *f)
{
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    unsigned long long ut = 0, st = 0, start = 0, vsize = 0;
    long long rss = -1;
    int have_stat = 0;
    FILE *sf = fopen("/proc/self/stat", "r");
    if (sf) {
        char line[1024];
        /* the fields after the command's ")" (it may hold spaces): 3 state ... 14 utime,
         * 15 stime ... 22 starttime, 23 vsize, 24 rss */
        if (fgets(line, sizeof line, sf)) {
            char *p = strrchr(line, ')');
            if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
                                   "%*d %*d %*d %*d %llu %llu %lld",
                            &ut, &st, &start, &vsize, &rss) == 5)
                have_stat = 1;
        }
        fclose(sf);
    }
    /* the boot time, to turn starttime (ticks since boot) into unix seconds */
    long long btime = -1;
    FILE *pf = fopen("/proc/stat", "r");
    if (pf) {
        char line[256];
        while (fgets(line, sizeof line, pf))
            if (sscanf(line, "btime %lld", &btime) == 1) break;
        fclose(pf);
    }
    if (have_stat && tick > 0) {
        fprintf(f, "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
                   "seconds.\n# TYPE process_cpu_seconds_total counter\n"
                   "process_cpu_seconds_total %.2f\n", (double)(ut + st) / (double)tick);
        fprintf(f, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                   "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
                vsize);
        fprintf(f, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                   "# TYPE process_resident_memory_bytes gauge\n"
                   "process_resident_memory_bytes %lld\n", rss * (long long)page);
        if (btime >= 0)
            fprintf(f, "# HELP process_start_time_seconds Start time of the process since unix "
                       "epoch in seconds.\n# TYPE process_start_time_seconds gauge\n"
                       "process_start_time_seconds %.2f\n",
                    (double)btime + (double)start / (double)tick);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long n = 0;
        struct dirent *de;
        while ((de = readdir(d)))
            if (de->d_name[0] != '.') n++;
        closedir(d);
        fprintf(f, "# HELP process_open_fds Number of open file descriptors.\n"
                   "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", n - 1 /* d's own */);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        fprintf(f, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                   "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                rl.rlim_cur == RLIM_INFINITY ? 18446744073709551615ull
                                             : (unsigned long long)rl.rlim_cur);
}

void metrics_train_steps(int64_t steps, int64_t images, double step_s)
{
    if (steps <= 0) return;
    atomic_fetch_add_explicit(&steps_total, (uint64_t)steps, memory_order_relaxed);
    if (images > 0) atomic_fetch_add_explicit(&images_total, (uint64_t)images, memory_order_relaxed);
    if (step_s >= 0) hist_observe(&step_hist, step_bounds, N_STEP_B, step_s, (uint64_t)steps);
}

void metrics_job_failed(enum metrics_failure why)
{
    if (why >= 0 && why < METRICS_FAIL_COUNT)
        atomic_fetch_add_explicit(&failures[why], 1, memory_order_relaxed);
}

void metrics_job_retried(void) { atomic_fetch_add_explicit(&retries_total, 1, memory_order_relaxed); }

static uint64_t ld(counter *c) { return atomic_load_explicit(c, memory_order_relaxed); }

/* one histogram's _bucket (cumulative), _sum and _count lines; labels: "" or `k="v",...` */
static void hist_write(FILE *f, const char *name, const char *labels, struct hist *h,
                       const double *bounds, int nb)
{
    uint64_t cum = 0, b[16];
    for (int i = 0; i <= nb; i++) b[i] = ld(&h->bucket[i]);
    /* _count is the +Inf bucket's sum, so the family stays consistent while observations land */
    const char *sep = *labels ? "," : "";
    for (int i = 0; i < nb; i++) {
        cum += b[i];
        fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i],
                (unsigned long long)cum);
    }
    cum += b[nb];
    fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    fprintf(f, "%s_sum%s%s%s %.9f\n", name, *labels ? "{" : "", labels, *labels ? "}" : "",
            (double)ld(&h->sum_ns) * 1e-9);
    fprintf(f, "%s_count%s%s%s %llu\n", name, *labels ? "{" : "", labels, *labels ? "}" : "",
            (unsigned long long)cum);
}

/* a label value with \, " and newline escaped as the format asks */
static void label_value(char *out, size_t n, const char *v)
{
    size_t o = 0;
    for (; *v && o + 3 < n; v++) {
        if (*v == '\\' || *v == '"') out[o++] = '\\', out[o++] = *v;
        else if (*v == '\n') out[o++] = '\\', out[o++] = 'n';
        else out[o++] = *v;
    }
    out[o] = 0;
}

char *metrics_render(const struct metrics_gauges *g, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    char dev[96], pat[256], labels[400];

    process_write(f);
    label_value(pat, sizeof pat, DDPMD_GIT);
    fprintf(f, "# HELP ddpmd_build_info The build: ddpmd's version and the git revision of its "
               "source (\"\" outside a checkout); always 1.\n# TYPE ddpmd_build_info gauge\n"
               "ddpmd_build_info{version=\"%s\",revision=\"%s\"} 1\n", DDPMD_VERSION, pat);

    if (g->jobs_ok) {
        fprintf(f, "# HELP ddpmd_jobs Jobs in the store by state.\n# TYPE ddpmd_jobs gauge\n");
        for (int s = 0; s < JOB_STATE_COUNT; s++)
            fprintf(f, "ddpmd_jobs{state=\"%s\"} %d\n", job_state_name((enum job_state)s), g->jobs[s]);
        fprintf(f, "# HELP ddpmd_queue_length Jobs waiting for a device.\n"
                   "# TYPE ddpmd_queue_length gauge\nddpmd_queue_length %d\n", g->jobs[JOB_QUEUED]);
    }
    /* each gauge's lines, one per device */
    static const struct {
        const char *name, *help;
    } dg[] = {{"ddpmd_device_budget_bytes", "The device's budget for job reservations."},
              {"ddpmd_device_reserved_bytes", "Bytes reserved by running jobs."},
              {"ddpmd_device_free_bytes", "Budget not reserved."},
              {"ddpmd_device_running_jobs", "Jobs running on the device."},
              {"ddpmd_device_poisoned", "1 when a sticky CUDA error poisoned the device (it "
                                        "admits no job until the server restarts)."}};
    for (size_t k = 0; k < sizeof dg / sizeof dg[0]; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", dg[k].name, dg[k].help, dg[k].name);
        for (int i = 0; i < g->n_devices; i++) {
            const struct metrics_device *d = &g->devices[i];
            long long v = k == 0   ? d->budget_bytes
                          : k == 1 ? d->reserved_bytes
                          : k == 2 ? d->budget_bytes - d->reserved_bytes
                          : k == 3 ? d->running_jobs
                                   : d->poisoned;
            label_value(dev, sizeof dev, d->name ? d->name : "");
            fprintf(f, "%s{device=\"%s\"} %lld\n", dg[k].name, dev, v);
        }
    }

    fprintf(f, "# HELP ddpmd_train_steps_total Training steps reported by jobs.\n"
               "# TYPE ddpmd_train_steps_total counter\nddpmd_train_steps_total %llu\n",
            (unsigned long long)ld(&steps_total));
    fprintf(f, "# HELP ddpmd_train_images_total Images trained on (steps x batch).\n"
               "# TYPE ddpmd_train_images_total counter\nddpmd_train_images_total %llu\n",
            (unsigned long long)ld(&images_total));
    fprintf(f, "# HELP ddpmd_train_step_seconds Seconds of one training step (its batch, forward, "
               "backward, optimizer), as the job measures it.\n# TYPE ddpmd_train_step_seconds histogram\n");
    hist_write(f, "ddpmd_train_step_seconds", "", &step_hist, step_bounds, N_STEP_B);
    fprintf(f, "# HELP ddpmd_job_failures_total Jobs that ended failed, by reason.\n"
               "# TYPE ddpmd_job_failures_total counter\n");
    for (int i = 0; i < METRICS_FAIL_COUNT; i++)
        fprintf(f, "ddpmd_job_failures_total{reason=\"%s\"} %llu\n", failure_names[i],
                (unsigned long long)ld(&failures[i]));
    fprintf(f, "# HELP ddpmd_job_retries_total Job processes started again after a crash.\n"
               "# TYPE ddpmd_job_retries_total counter\nddpmd_job_retries_total %llu\n",
            (unsigned long long)ld(&retries_total));

    fprintf(f, "# HELP ddpmd_http_requests_total HTTP requests answered, by route pattern and "
               "status.\n# TYPE ddpmd_http_requests_total counter\n");
    for (int r = 0; r < n_routes + N_METHOD; r++) {
        if (r < n_routes)
            label_value(pat, sizeof pat, route_patterns[r]);
        for (int s = 0; s <= N_STATUS; s++) {
            uint64_t v = ld(&http_count[r][s]);
            if (!v) continue;
            char st[8] = "other";
            if (s < N_STATUS) snprintf(st, sizeof st, "%u", statuses[s]);
            fprintf(f, "ddpmd_http_requests_total{method=\"%s\",route=\"%s\",status=\"%s\"} %llu\n",
                    r < n_routes ? route_methods[r] : http_methods[r - n_routes],
                    r < n_routes ? pat : "unmatched", st, (unsigned long long)v);
        }
    }
    fprintf(f, "# HELP ddpmd_http_request_duration_seconds Seconds from a request's first byte to "
               "its completion, by route pattern (event streams apart: "
               "ddpmd_sse_stream_duration_seconds).\n"
               "# TYPE ddpmd_http_request_duration_seconds histogram\n");
    for (int r = 0; r < n_routes + N_METHOD; r++) {
        if (!ld(&http_hist[r].count)) continue;
        if (r < n_routes) label_value(pat, sizeof pat, route_patterns[r]);
        snprintf(labels, sizeof labels, "method=\"%s\",route=\"%s\"",
                 r < n_routes ? route_methods[r] : http_methods[r - n_routes],
                 r < n_routes ? pat : "unmatched");
        hist_write(f, "ddpmd_http_request_duration_seconds", labels, &http_hist[r], http_bounds,
                   N_HTTP_B);
    }
    fprintf(f, "# HELP ddpmd_sse_stream_duration_seconds Seconds an event stream (GET "
               "/jobs/{id}/events) stayed open, from its request to its end.\n"
               "# TYPE ddpmd_sse_stream_duration_seconds histogram\n");
    hist_write(f, "ddpmd_sse_stream_duration_seconds", "", &sse_hist, sse_bounds, N_SSE_B);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    if (len) *len = n;
    return buf;
}
