/* serve.c - `ddpmd serve` (see serve.h): parses the options, refuses a non-loopback address
 * without tokens, measures the per-process baseline with a probe child, opens the store, starts
 * the pool and the api, prints where it listens as one JSON line, and waits for SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "backend_load.h"
#include "cli.h"
#include "cost.h"
#include "exec.h"
#include "fsio.h"
#include "jobs.h"
#include "log.h"
#include "parse.h"
#include "pool.h"
#include "spec.h"
#include "train.h"
#include "train_step.h"
#include "upload.h"
#include "webhook.h"

extern const char ddpmd_openapi_yaml[];
extern const size_t ddpmd_openapi_yaml_len;

#define PROBE_TIMED_STEPS 3
#define SERVE_LIST_MAX 2048 /* a list option's joined value */

/* `ddpmd serve`'s options as text, as serve_options_read found them (a default, the config
 * file, the environment or the command line), before serve_options_check reads them */
struct serve_opts {
    const char *listen, *data, *device, *budget, *token_file, *path_prefix;
    const char *mq, *cores, *ht, *mb, *ka, *mpo, *mr, *lf, *umb, *umu, *umf, *whs, *wha, *whn;
    const char *whb, *wht, *mcs, *mcip, *rcs, *hto, *uqb, *uqp, *uw, *uq, *pw, *pq, *pto, *pmem;
    char dev_list[SERVE_LIST_MAX], budget_list[SERVE_LIST_MAX];
    int probe, routes;
};

static void serve_usage(FILE *f)
{
    fprintf(f,
            "usage: ddpmd serve [options]\n"
            "Each option is also read from the environment variable shown and from a config file;\n"
            "the command line wins over the environment, which wins over the file.\n"
            "  --config FILE          options as lines NAME = VALUE, NAME an option below without\n"
            "                         its dashes (e.g. 'vram-budget = cpu=8GiB'); blank lines and\n"
            "                         lines starting with # are skipped (DDPMD_CONFIG; default none)\n"
            "  --listen HOST:PORT     address to listen on (DDPMD_LISTEN; default 127.0.0.1:8080);\n"
            "                         port 0 picks a free port. Where it listens is printed on\n"
            "                         stdout as one JSON line {\"listening\":...,\"port\":N}\n"
            "  --data DIR             data directory: ddpmd.db (SQLite) and jobs/<id>/ (DDPMD_DATA;\n"
            "                         default ./ddpmd-data)\n"
            "  --device DEV           a device jobs run on: cpu, cuda or cuda:N; repeat it (or\n"
            "                         give a comma list) for several (DDPMD_DEVICE; default cpu).\n"
            "                         A job is planned on each at submit and runs on one whose\n"
            "                         free budget holds its reservation there; a cuda device\n"
            "                         needs the CUDA module (libddpmd_cuda.so, DDPMD_CUDA_MODULE)\n"
            "  --vram-budget DEV=SIZE a device's budget for the sum of its job reservations, e.g.\n"
            "                         cuda:0=4GiB; repeat it (or a comma list) for each device; a\n"
            "                         bare SIZE with one device (DDPMD_VRAM_BUDGET; default: the\n"
            "                         machine's memory for cpu, a cuda device's free memory at\n"
            "                         start). SIZE: digits, an optional fraction and a unit in\n"
            "                         any case (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB: 8GiB, 1gb)\n"
            "  --max-queue N          queued jobs before POST /train answers 503 (DDPMD_MAX_QUEUE;\n"
            "                         default 100)\n"
            "  --max-jobs-per-owner N one token's queued + running jobs before its POST /train and\n"
            "                         POST /samples answer 429 with Retry-After\n"
            "                         (DDPMD_MAX_JOBS_PER_OWNER; default 0 = no limit)\n"
            "  --max-retries N        a job whose process dies of a signal is started again from\n"
            "                         its last checkpoint up to N times, then failed with the\n"
            "                         reason (DDPMD_MAX_RETRIES; default 2)\n"
            "  --token-file FILE      bearer tokens, one \"NAME SECRET [admin]\" per line\n"
            "                         (DDPMD_TOKEN_FILE). Without it only a loopback address is\n"
            "                         accepted and every caller is the one local user\n"
            "  --cpu-cores N          CPU threads divided among running jobs, each job's count\n"
            "                         fixed at its start; a job on a cuda device takes 2\n"
            "                         (DDPMD_CPU_CORES; default: the CPUs this process may\n"
            "                         run on, as taskset or a cpuset allows)\n"
            "  --http-threads N       HTTP worker threads (DDPMD_HTTP_THREADS; default 4)\n"
            "  --max-conns N          open connections at most (DDPMD_MAX_CONNS; default 1024;\n"
            "                         lowered to what the open-file limit allows)\n"
            "  --max-conns-per-ip N   open connections from one address (DDPMD_MAX_CONNS_PER_IP;\n"
            "                         default 256; 0 = no limit; behind a proxy every client\n"
            "                         has the proxy's address)\n"
            "  --reserved-conns N     connections kept for authorized requests, event streams\n"
            "                         among them: at most max-conns - N wait for a request head\n"
            "                         and a new one drops the one that waited longest\n"
            "                         (DDPMD_RESERVED_CONNS; default 64)\n"
            "  --header-timeout S     a connection sends its whole request head (the request\n"
            "                         line and headers) within S seconds of its accept or of its\n"
            "                         last request's end, or is closed (DDPMD_HEADER_TIMEOUT;\n"
            "                         default 10)\n"
            "  --max-body BYTES       largest request body (DDPMD_MAX_BODY; default 1MiB)\n"
            "  --sse-keepalive S      a comment line on an event stream quiet for S seconds\n"
            "                         (DDPMD_SSE_KEEPALIVE; default 15)\n"
            "  --log-format text|json log lines on stderr: text, or one JSON object per line\n"
            "                         (time, level, msg; requests add request_id, method, route,\n"
            "                         path, status, duration_ms, job) (DDPMD_LOG_FORMAT; default\n"
            "                         text). Every response carries X-Request-Id: the request's\n"
            "                         own when it is 1-64 of [A-Za-z0-9._:-], else a new one\n"
            "  --path-prefix /P       the path a reverse proxy serves the API under, e.g. /ddpmd\n"
            "                         (DDPMD_PATH_PREFIX; default none): requests are routed both\n"
            "                         with it (/ddpmd/jobs) and without it (a proxy that strips\n"
            "                         it), and every Location and link the server sends carries it\n"
            "  --upload-max-bytes SIZE  POST /datasets: the largest archive as sent\n"
            "                         (DDPMD_UPLOAD_MAX_BYTES; default 1GiB)\n"
            "  --upload-max-unpacked SIZE  the most bytes its files may unpack to\n"
            "                         (DDPMD_UPLOAD_MAX_UNPACKED; default 4GiB)\n"
            "  --upload-max-files N   the most entries (files and folders) it may hold\n"
            "                         (DDPMD_UPLOAD_MAX_FILES; default 100000)\n"
            "  --upload-quota-bytes SIZE  one owner's uploaded datasets together: their files'\n"
            "                         bytes at most (DDPMD_UPLOAD_QUOTA_BYTES; default 16GiB)\n"
            "  --upload-quota-pixels N  and their images' pixels at most\n"
            "                         (DDPMD_UPLOAD_QUOTA_PIXELS; default 2147483648)\n"
            "  --upload-workers N     threads decoding uploaded images, off the HTTP threads\n"
            "                         (DDPMD_UPLOAD_WORKERS; default 1)\n"
            "  --upload-queue N       uploads waiting for them at most; one more is a 503\n"
            "                         (DDPMD_UPLOAD_QUEUE; default 8)\n"
            "  --plan-workers N       threads planning POST /train's and POST /samples'\n"
            "                         admission, off the HTTP threads (DDPMD_PLAN_WORKERS;\n"
            "                         default 1)\n"
            "  --plan-queue N         requests waiting for them at most, each suspended (no\n"
            "                         HTTP thread waits); one more is a 503 at once\n"
            "                         (DDPMD_PLAN_QUEUE; default 4)\n"
            "  --plan-timeout S       a POST /train or /samples waits at most S seconds for its\n"
            "                         plan, then answers 503; the search stops there too\n"
            "                         (DDPMD_PLAN_TIMEOUT; default 30)\n"
            "  --plan-memory SIZE     the most one planning's graphs and plans may hold; a\n"
            "                         search past it stops and the request is a 422\n"
            "                         (DDPMD_PLAN_MEMORY; default 1GiB)\n"
            "  --webhook-secret-file FILE  the HMAC-SHA256 key webhooks are signed with, its\n"
            "                         first line, >= 16 characters (DDPMD_WEBHOOK_SECRET_FILE;\n"
            "                         default DATA/webhook.secret, made with mode 0600 at the first\n"
            "                         start)\n"
            "  --webhook-allow LIST   addresses, CIDR ranges and host names webhooks may reach\n"
            "                         although loopback, link-local, private or metadata, e.g.\n"
            "                         127.0.0.1,10.0.0.0/8,hooks.internal (DDPMD_WEBHOOK_ALLOW;\n"
            "                         default none: public addresses only, checked after DNS)\n"
            "  --webhook-attempts N   deliveries tried at most N times (DDPMD_WEBHOOK_ATTEMPTS;\n"
            "                         default 5), waiting S, 2S, 4S... between them\n"
            "  --webhook-backoff S    (DDPMD_WEBHOOK_BACKOFF; default 1 second)\n"
            "  --webhook-timeout S    one attempt's limit (DDPMD_WEBHOOK_TIMEOUT; default 10)\n"
            "  --routes               print the HTTP routes (METHOD PATH) and exit\n"
            "SIGTERM or SIGINT: stop admitting, stop running jobs at their next step with a\n"
            "checkpoint, exit; the next start resumes them.\n");
}

static int parse_count(const char *name, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "ddpmd serve: %s must be an integer from %d to %d, not '%s'\n", name, lo,
                hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* descriptors besides the connections: the store, the listening socket, the jobs' pipes, files
 * being sent */
#define SERVE_FDS_SPARE 256

/* the open-file soft limit raised to the hard one; *max_conns lowered (with a warning) when
 * even that leaves too few descriptors for it, *reserved with it; -1 when none are left */
static int serve_fd_limit(int *max_conns, int *reserved)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return 0; /* unknown: libmicrohttpd's accept fails */
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)*max_conns + SERVE_FDS_SPARE)
        return 0;
    long room = (long)rl.rlim_cur - SERVE_FDS_SPARE;
    if (room < 16) {
        log_msg(LOG_ERROR, "the open-file limit (%ld) leaves too few descriptors for "
                           "connections; raise it (ulimit -n)", (long)rl.rlim_cur);
        return -1;
    }
    log_msg(LOG_WARN, "--max-conns %d lowered to %ld: the open-file limit is %ld (ulimit -n)",
            *max_conns, room, (long)rl.rlim_cur);
    *max_conns = (int)room;
    if (*reserved >= *max_conns) *reserved = *max_conns / 16;
    return 0;
}

/* a small ddpm UNet for the probe: image_size x image_size, one channel, these levels */
static void probe_spec(struct train_spec *s, int image_size, int levels, int width, int batch)
{
    spec_defaults(s);
    unet_config_default(&s->model, UNET_DDPM);
    s->model.in_channels = s->model.out_channels = 1;
    s->model.image_size = image_size;
    s->model.n_levels = levels;
    for (int i = 0; i < levels; i++) s->model.channels[i] = width << i;
    s->model.n_attn = 0;
    s->model.groups = 4;
    s->batch = batch;
}

/* runs 1 + timed training steps of spec (train_step_run: what the cost model predicts) on one
 * thread, in the strategy the search picks under m; *secs gets the timed steps' seconds: on the
 * cpu the CPU seconds of the thread running them (one thread: the work itself, however busy the
 * machine), elsewhere wall seconds. ts is the caller's to free (train_step_free), also on
 * failure. */
static int probe_steps(const struct train_spec *s, const struct cost_model *m, int timed,
                       double *secs, struct train_step *ts)
{
    char err[300];
    struct timespec t0 = {0}, t1 = {0};
    const clockid_t clock = backend_or_cpu(s->backend) == backend_or_cpu(NULL)
                                ? CLOCK_THREAD_CPUTIME_ID
                                : CLOCK_MONOTONIC;
    struct planner_result r;
    struct strategy st;
    memset(ts, 0, sizeof *ts);
    int rc = train_search(s, m, 0, &r, err, sizeof err);
    if (!rc) st = r.cand[r.chosen].strategy;
    planner_result_free(&r);
    struct train_step_config c = {.shape = train_shape_of(s), .threads = 1,
                                  .timesteps = s->timesteps, .beta_schedule = s->beta_schedule,
                                  .beta_start = s->beta_start, .beta_end = s->beta_end};
    if (rc || train_step_init(ts, &c, &st, err, sizeof err)) {
        fprintf(stderr, "ddpmd serve --probe: %s\n", err);
        return -1;
    }
    if (exec_reset_state(ts->e)) goto fail;
    for (int i = 0; i <= timed; i++) {
        struct train_step_result sr;
        if (i == 1) clock_gettime(clock, &t0);
        if (train_step_run(ts, 1, i, &s->optim, &sr, err, sizeof err)) goto fail;
    }
    clock_gettime(clock, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return 0;
fail:
    fprintf(stderr, "ddpmd serve --probe: the probe step failed\n");
    return -1;
}

/* The process baseline on device: what a job's process holds there besides its plan, once it
 * loaded the libraries and ran one training step of a tiny model. On the cpu its peak resident
 * bytes less that model's plan; on a cuda device what the backend measured after its warm-up
 * (context, handles, modules: bk_device_mem.process). Then the device's speed, for the
 * backfill's predicted job lengths: timed steps of a model big enough that its arithmetic, not
 * the per-op overhead, takes the time, over what the cost model predicts for them (one thread
 * on the cpu) */
static int probe_run(const char *device)
{
    struct train_spec s;
    struct train_step small, big;
    struct cost_model m;
    const struct backend *bk = NULL;
    int rc = 1;
    double secs = 0;
    long long base = -1;
    char err[512];
    memset(&small, 0, sizeof small);
    memset(&big, 0, sizeof big);
    if (backend_load(device, &bk, err, sizeof err)) {
        fprintf(stderr, "ddpmd serve --probe: --device %s: %s\n", device, err);
        return 1;
    }
    if (train_cost_model(&m, getenv("DDPMD_COST_MODEL"), err, sizeof err)) {
        fprintf(stderr, "ddpmd serve --probe: %s\n", err);
        return 1;
    }
    probe_spec(&s, 8, 1, 8, 1);
    s.backend = bk;
    if (probe_steps(&s, &m, 0, &secs, &small)) goto out;
    int index = backend_device_index(device);
    if (index >= 0) {
        struct bk_device_mem dm;
        if (!backend_supports(bk, BK_OP_device_mem, BK_DTYPE_F32) ||
            bk->device_mem(index, &dm) != BK_OK) {
            fprintf(stderr, "ddpmd serve --probe: %s: no memory figures\n", device);
            goto out;
        }
        base = (long long)dm.process;
    } else {
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long long hwm = -1;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %lld kB", &hwm) == 1) break;
        if (f) fclose(f);
        if (hwm < 0) {
            fprintf(stderr, "ddpmd serve --probe: no VmHWM in /proc/self/status\n");
            goto out;
        }
        base = hwm * 1024 - (long long)small.tp.p.total_bytes;
    }
    probe_spec(&s, 16, 2, 16, 4);
    s.backend = bk;
    if (probe_steps(&s, &m, PROBE_TIMED_STEPS, &secs, &big)) goto out;
    double scale = secs / PROBE_TIMED_STEPS /
                   cost_predict_step_seconds(&m, &big.tp.p, &big.tp.g, s.batch);
    printf("{\"baseline_bytes\":%lld,\"cost_scale\":%.6g}\n", base > 0 ? base : 0, scale);
    rc = 0;
out:
    train_step_free(&small);
    train_step_free(&big);
    return rc;
}

/* runs `ddpmd serve --probe --device D` (a child, so the server's own process holds nothing the
 * jobs' do not) */
static int probe_baseline(const char *exe, const char *device, int64_t *bytes, double *cost_scale)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        char *argv[] = {(char *)exe, "serve", "--probe", "--device", (char *)device, NULL};
        execv(exe, argv);
        _exit(127);
    }
    close(fds[1]);
    char buf[256];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    long long b;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        sscanf(buf, "{\"baseline_bytes\":%lld,\"cost_scale\":%lg}", &b, cost_scale) != 2 ||
        !(*cost_scale > 0))
        return -1;
    *bytes = b;
    return 0;
}

/* --device (names, comma-separated) and --vram-budget (DEV=SIZE items; a bare SIZE when there
 * is one device) into pc's devices, each budget or -1 (the default) in budget[]. Names: cpu,
 * cuda or cuda:N ("cuda" is cuda:0), no repeats. 0, or -1 with the reason logged */
static int devices_parse(const char *names, const char *budgets, struct pool_config *pc,
                         int64_t *budget)
{
    char list[SERVE_LIST_MAX];
    snprintf(list, sizeof list, "%s", names);
    pc->n_devices = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char name[32];
        int index = backend_device_index(t);
        if (strcmp(t, "cpu") == 0)
            snprintf(name, sizeof name, "cpu");
        else if (index >= 0)
            snprintf(name, sizeof name, "cuda:%d", index);
        else {
            log_msg(LOG_ERROR, "--device takes cpu, cuda or cuda:N, not '%.64s'", t);
            return -1;
        }
        for (int i = 0; i < pc->n_devices; i++)
            if (strcmp(pc->devices[i].name, name) == 0) {
                log_msg(LOG_ERROR, "--device %s is given twice", name);
                return -1;
            }
        if (pc->n_devices == POOL_MAX_DEVICES) {
            log_msg(LOG_ERROR, "--device: at most %d devices", POOL_MAX_DEVICES);
            return -1;
        }
        budget[pc->n_devices] = -1;
        snprintf(pc->devices[pc->n_devices++].name, sizeof pc->devices[0].name, "%s", name);
    }
    if (pc->n_devices == 0) {
        log_msg(LOG_ERROR, "--device names no device");
        return -1;
    }
    if (!budgets) return 0;
    snprintf(list, sizeof list, "%s", budgets);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        int d = -1;
        int64_t b;
        if (!eq && pc->n_devices == 1) {
            d = 0; /* a bare size: the one device's */
        } else if (eq) {
            *eq = 0;
            int index = backend_device_index(t);
            char name[32];
            if (index >= 0) snprintf(name, sizeof name, "cuda:%d", index);
            else snprintf(name, sizeof name, "%.20s", t);
            for (int i = 0; i < pc->n_devices; i++)
                if (strcmp(pc->devices[i].name, name) == 0) d = i;
            if (d < 0) {
                log_msg(LOG_ERROR, "--vram-budget %.32s=...: no such --device", t);
                return -1;
            }
        }
        const char *size = eq ? eq + 1 : t;
        if (d < 0 || spec_parse_size(size, &b) || b < 1) {
            log_msg(LOG_ERROR, "--vram-budget takes DEV=SIZE items (e.g. cuda:0=4GiB,cpu=8GiB; a "
                               "bare SIZE with one device), not '%.64s'", eq ? size : t);
            return -1;
        }
        if (budget[d] >= 0) {
            log_msg(LOG_ERROR, "--vram-budget: %s's budget is given twice", pc->devices[d].name);
            return -1;
        }
        budget[d] = b;
    }
    return 0;
}

/* each device ready for jobs: a cuda device loaded and warmed up in this process too (admission
 * plans with its backend) with its memory read; the budgets checked against the memory (default:
 * the machine's memory on the cpu, what is free after this process's warm-up on a cuda device);
 * the probe child run there. 0, or -1 logged */
static int devices_ready(const char *exe, struct pool_config *pc, const int64_t *budget)
{
    for (int i = 0; i < pc->n_devices; i++) {
        struct pool_device_config *d = &pc->devices[i];
        int64_t avail;
        if (strcmp(d->name, "cpu") == 0) {
            d->bk = NULL;
            d->total_bytes = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE);
            avail = d->total_bytes;
        } else {
            char err[512];
            struct bk_device_mem dm;
            if (backend_load(d->name, &d->bk, err, sizeof err)) {
                log_msg(LOG_ERROR, "--device %s: %s", d->name, err);
                return -1;
            }
            if (!backend_supports(d->bk, BK_OP_device_mem, BK_DTYPE_F32) ||
                d->bk->device_mem(backend_device_index(d->name), &dm) != BK_OK) {
                log_msg(LOG_ERROR, "--device %s: its memory cannot be read", d->name);
                return -1;
            }
            d->total_bytes = (int64_t)dm.total;
            avail = (int64_t)dm.free;
            if (budget[i] > d->total_bytes) {
                log_msg(LOG_ERROR, "--vram-budget %s=%" PRId64 " is more than the device's %"
                                   PRId64 " bytes", d->name, budget[i], d->total_bytes);
                return -1;
            }
        }
        d->budget_bytes = budget[i] >= 0 ? budget[i] : avail;
        if (probe_baseline(exe, d->name, &d->baseline_bytes, &d->cost_scale)) {
            log_msg(LOG_ERROR, "the probe child (ddpmd serve --probe --device %s) failed: cannot "
                               "measure the per-process baseline there", d->name);
            return -1;
        }
    }
    return 0;
}

/* HOST:PORT or [V6]:PORT -> a listening socket; *loopback says whether it is 127/8 or ::1 */
static int open_listener(const char *spec, int *loopback, char *host, size_t hostlen, int *port,
                         char *err, size_t errlen)
{
    char h[128];
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || strlen(colon + 1) == 0) {
        snprintf(err, errlen, "--listen takes HOST:PORT, not '%s'", spec);
        return -1;
    }
    size_t hl = (size_t)(colon - spec);
    if (spec[0] == '[' && colon[-1] == ']') {
        spec++;
        hl -= 2;
    }
    if (hl >= sizeof h) {
        snprintf(err, errlen, "--listen: host too long");
        return -1;
    }
    memcpy(h, spec, hl);
    h[hl] = 0;
    if (strcmp(h, "localhost") == 0) snprintf(h, sizeof h, "127.0.0.1");
    char *end;
    long pn = strtol(colon + 1, &end, 10);
    if (*end || pn < 0 || pn > 65535) {
        snprintf(err, errlen, "--listen: '%s' is no port", colon + 1);
        return -1;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    int fam;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, h, &s4->sin_addr) == 1) {
        fam = AF_INET;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)pn);
        sl = sizeof *s4;
        *loopback = (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
    } else if (inet_pton(AF_INET6, h, &s6->sin6_addr) == 1) {
        fam = AF_INET6;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)pn);
        sl = sizeof *s6;
        *loopback = IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr);
    } else {
        snprintf(err, errlen, "--listen: '%s' is no numeric IPv4/IPv6 address (or localhost)", h);
        return -1;
    }
    int fd = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 1024)) {
        snprintf(err, errlen, "cannot listen on %s: %s", spec, strerror(errno));
        close(fd);
        return -1;
    }
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port = ntohs(fam == AF_INET ? s4->sin_port : s6->sin6_port);
    snprintf(host, hostlen, "%s", h);
    return fd;
}

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

/* a `ddpmd serve` option: its flag, environment variable, value and default. A list option
 * (--device, --vram-budget) keeps every occurrence of the source that gives it, comma-joined in
 * its list buffer; a higher source replaces the whole list */
struct serve_optvar {
    const char *flag, *env;
    const char **val;
    const char *def;
    char *list;                 /* SERVE_LIST_MAX bytes for a list option, else NULL */
    int src;                    /* where the value came from: 0 default, 1 file, 2 env, 3 flag */
};

static struct serve_optvar *optvar_find(struct serve_optvar *v, int n, const char *flag)
{
    for (int i = 0; i < n; i++)
        if (strcmp(v[i].flag, flag) == 0) return &v[i];
    return NULL;
}

/* ov's value from source src (see serve_optvar); -1 when a list outgrows its buffer */
static int optvar_set(struct serve_optvar *ov, int src, const char *v)
{
    if (!ov->list) {
        *ov->val = v;
    } else {
        size_t have = ov->src == src ? strlen(ov->list) : 0;
        if (have + 1 + strlen(v) >= SERVE_LIST_MAX) {
            fprintf(stderr, "ddpmd serve: %s: the list is longer than %d bytes\n", ov->flag,
                    SERVE_LIST_MAX);
            return -1;
        }
        snprintf(ov->list + have, SERVE_LIST_MAX - have, "%s%s", have ? "," : "", v);
        *ov->val = ov->list;
    }
    ov->src = src;
    return 0;
}

#define CONFIG_MAX_BYTES (1 << 20)
#define CONFIG_MAX_LINE 4096

/* the config file's text, which the values it gives point into: kept for the process's life
 * (reachable, so no leak report on an early return) */
static char *serve_config_text;

/* --config FILE: lines "NAME = VALUE", NAME an option without its dashes (listen, vram-budget),
 * VALUE the rest of the line without surrounding blanks; blank lines and lines starting with '#'
 * are skipped. Sets the values it names; 0, or -1 with the file, line and reason on stderr */
static int config_load(const char *path, struct serve_optvar *vars, int n_vars)
{
    char err[600];
    FILE *f = fsio_fopen_read(path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "ddpmd serve: --config: %s\n", err);
        return -1;
    }
    char *text = serve_config_text = malloc(CONFIG_MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!text || bad || n > CONFIG_MAX_BYTES) {
        fprintf(stderr, "ddpmd serve: --config %s: %s\n", path,
                !text ? "out of memory" : bad ? "cannot be read" : "larger than 1 MiB");
        return -1;
    }
    text[n] = 0;
    if (strlen(text) != n) {
        fprintf(stderr, "ddpmd serve: --config %s: holds a NUL byte\n", path);
        return -1;
    }
    int line = 0;
    for (char *p = text, *next; p && *p; p = next) {
        line++;
        char *nl = strchr(p, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        if (strlen(p) > CONFIG_MAX_LINE) {
            fprintf(stderr, "ddpmd serve: %s:%d: line longer than %d bytes\n", path, line,
                    CONFIG_MAX_LINE);
            return -1;
        }
        while (*p == ' ' || *p == '\t') p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) *--end = 0;
        if (*p == 0 || *p == '#') continue;
        char *eq = strchr(p, '=');
        if (!eq) {
            fprintf(stderr, "ddpmd serve: %s:%d: expected NAME = VALUE, not '%.200s'\n", path,
                    line, p);
            return -1;
        }
        char *k = eq;
        while (k > p && (k[-1] == ' ' || k[-1] == '\t')) k--;
        *k = 0;
        char *v = eq + 1;
        while (*v == ' ' || *v == '\t') v++;
        char flag[96];
        snprintf(flag, sizeof flag, "--%.90s", p);
        struct serve_optvar *ov = strlen(p) < 90 ? optvar_find(vars, n_vars, flag) : NULL;
        if (!ov) {
            fprintf(stderr, "ddpmd serve: %s:%d: unknown option '%.100s' (the names are those of "
                            "ddpmd serve --help without their dashes)\n", path, line, p);
            return -1;
        }
        if (*v == 0) {
            fprintf(stderr, "ddpmd serve: %s:%d: %s has no value\n", path, line, p);
            return -1;
        }
        if (optvar_set(ov, 1, v)) return -1;
    }
    return 0;
}

/* Every option into o (see serve_optvar): the value is the command line's, else the
 * environment's, else the config file's (--config or DDPMD_CONFIG), else the default. -1 to go
 * on, or the exit status: 0 after --help, 2 for an unknown flag or a bad config file (said on
 * stderr). */
static int serve_options_read(int argc, char **argv, struct serve_opts *o)
{
    /* every option: its flag, its environment variable, where its value goes, its default */
    struct serve_optvar vars[] = {
        {"--listen", "DDPMD_LISTEN", &o->listen, "127.0.0.1:8080", NULL, 0},
        {"--data", "DDPMD_DATA", &o->data, "ddpmd-data", NULL, 0},
        {"--device", "DDPMD_DEVICE", &o->device, "cpu", o->dev_list, 0},
        {"--vram-budget", "DDPMD_VRAM_BUDGET", &o->budget, NULL, o->budget_list, 0},
        {"--token-file", "DDPMD_TOKEN_FILE", &o->token_file, NULL, NULL, 0},
        {"--path-prefix", "DDPMD_PATH_PREFIX", &o->path_prefix, "", NULL, 0},
        {"--max-queue", "DDPMD_MAX_QUEUE", &o->mq, "100", NULL, 0},
        {"--max-jobs-per-owner", "DDPMD_MAX_JOBS_PER_OWNER", &o->mpo, "0", NULL, 0},
        {"--max-retries", "DDPMD_MAX_RETRIES", &o->mr, "2", NULL, 0},
        {"--cpu-cores", "DDPMD_CPU_CORES", &o->cores, NULL, NULL, 0},
        {"--http-threads", "DDPMD_HTTP_THREADS", &o->ht, "4", NULL, 0},
        {"--max-conns", "DDPMD_MAX_CONNS", &o->mcs, "1024", NULL, 0},
        {"--max-conns-per-ip", "DDPMD_MAX_CONNS_PER_IP", &o->mcip, "256", NULL, 0},
        {"--reserved-conns", "DDPMD_RESERVED_CONNS", &o->rcs, "64", NULL, 0},
        {"--header-timeout", "DDPMD_HEADER_TIMEOUT", &o->hto, "10", NULL, 0},
        {"--max-body", "DDPMD_MAX_BODY", &o->mb, "1MiB", NULL, 0},
        {"--sse-keepalive", "DDPMD_SSE_KEEPALIVE", &o->ka, "15", NULL, 0},
        {"--log-format", "DDPMD_LOG_FORMAT", &o->lf, "text", NULL, 0},
        {"--upload-max-bytes", "DDPMD_UPLOAD_MAX_BYTES", &o->umb, "1GiB", NULL, 0},
        {"--upload-max-unpacked", "DDPMD_UPLOAD_MAX_UNPACKED", &o->umu, "4GiB", NULL, 0},
        {"--upload-max-files", "DDPMD_UPLOAD_MAX_FILES", &o->umf, "100000", NULL, 0},
        {"--upload-quota-bytes", "DDPMD_UPLOAD_QUOTA_BYTES", &o->uqb, "16GiB", NULL, 0},
        {"--upload-quota-pixels", "DDPMD_UPLOAD_QUOTA_PIXELS", &o->uqp, "2147483648", NULL, 0},
        {"--upload-workers", "DDPMD_UPLOAD_WORKERS", &o->uw, "1", NULL, 0},
        {"--upload-queue", "DDPMD_UPLOAD_QUEUE", &o->uq, "8", NULL, 0},
        {"--plan-workers", "DDPMD_PLAN_WORKERS", &o->pw, "1", NULL, 0},
        {"--plan-queue", "DDPMD_PLAN_QUEUE", &o->pq, "4", NULL, 0},
        {"--plan-timeout", "DDPMD_PLAN_TIMEOUT", &o->pto, "30", NULL, 0},
        {"--plan-memory", "DDPMD_PLAN_MEMORY", &o->pmem, "1GiB", NULL, 0},
        {"--webhook-secret-file", "DDPMD_WEBHOOK_SECRET_FILE", &o->whs, NULL, NULL, 0},
        {"--webhook-allow", "DDPMD_WEBHOOK_ALLOW", &o->wha, NULL, NULL, 0},
        {"--webhook-attempts", "DDPMD_WEBHOOK_ATTEMPTS", &o->whn, "5", NULL, 0},
        {"--webhook-backoff", "DDPMD_WEBHOOK_BACKOFF", &o->whb, "1", NULL, 0},
        {"--webhook-timeout", "DDPMD_WEBHOOK_TIMEOUT", &o->wht, "10", NULL, 0},
    };
    const int n_vars = (int)(sizeof vars / sizeof vars[0]);
    const char *config = env_or("DDPMD_CONFIG", NULL);
    for (int i = 0; i < n_vars; i++) *vars[i].val = vars[i].def;
    /* the command line first only for what it decides alone: --config, --help, unknown flags */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--probe") == 0) o->probe = 1;
        else if (strcmp(a, "--routes") == 0) o->routes = 1;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            serve_usage(stdout);
            return 0;
        } else if (strcmp(a, "--config") == 0 && v) {
            config = argv[++i];
        } else if (optvar_find(vars, n_vars, a) && v) {
            i++;
        } else {
            const char *known[64 + 5] = {"--probe", "--routes", "--help", "--config"};
            int nk = 4;
            for (int k = 0; k < n_vars && nk < 64 + 4; k++) known[nk++] = vars[k].flag;
            known[nk] = NULL;
            cli_option_error("serve", a, known);
            return 2;
        }
    }
    if (config && config_load(config, vars, n_vars)) return 2;
    for (int i = 0; i < n_vars; i++) {
        const char *e = getenv(vars[i].env);
        if (e && *e && optvar_set(&vars[i], 2, e)) return 2;
    }
    for (int i = 2; i < argc; i++) {
        struct serve_optvar *ov = optvar_find(vars, n_vars, argv[i]);
        if (ov && optvar_set(ov, 3, argv[++i])) return 2;
        else if (!ov && strcmp(argv[i], "--config") == 0) i++;
    }
    return -1;
}

/* the options in numbers (serve_options_check) */
struct serve_settings {
    int max_queue, ncores, http_threads, keepalive, max_per_owner, max_retries;
    int max_conns, conns_per_ip, conns_reserved;
    double head_timeout;
    int64_t budget[POOL_MAX_DEVICES], max_body;
    int64_t up_bytes, up_unpacked, quota_bytes, quota_pixels;
    int up_files, up_workers, up_queue, plan_workers, plan_queue;
    double plan_timeout;
    int64_t plan_memory;
    int wh_attempts;
    double wh_backoff, wh_timeout;
    struct pool_config pc; /* the devices and their budgets (devices_parse) */
};

/* o's values checked and read into s, each against its range; sets the log format and the
 * descriptor limit (serve_fd_limit) on the way. 0, or 2 with the option and its rule logged. */
static int serve_options_check(const struct serve_opts *o, struct serve_settings *s)
{
    /* the cores this process may run on (taskset, a container's cpuset), as `ddpmd train` counts
     * them: the online CPUs overcount there, and the jobs would share fewer cores than planned */
    char coredef[24];
    snprintf(coredef, sizeof coredef, "%d", spec_host_cores());
    if (parse_count("--max-queue", o->mq, 0, 1000000, &s->max_queue) ||
        parse_count("--max-jobs-per-owner", o->mpo, 0, 1000000, &s->max_per_owner) ||
        parse_count("--max-retries", o->mr, 0, 100, &s->max_retries) ||
        parse_count("--cpu-cores", o->cores ? o->cores : coredef, 1, 4096, &s->ncores) ||
        parse_count("--http-threads", o->ht, 1, 256, &s->http_threads) ||
        parse_count("--sse-keepalive", o->ka, 1, 3600, &s->keepalive) ||
        parse_count("--max-conns", o->mcs, 16, 1000000, &s->max_conns) ||
        parse_count("--max-conns-per-ip", o->mcip, 0, 1000000, &s->conns_per_ip) ||
        parse_count("--reserved-conns", o->rcs, 1, 1000000, &s->conns_reserved))
        return 2;
    char *hend;
    s->head_timeout = strtod(o->hto, &hend);
    if (*hend || hend == o->hto || !(s->head_timeout >= 0.1 && s->head_timeout <= 3600)) {
        log_msg(LOG_ERROR, "--header-timeout takes seconds in [0.1, 3600], not '%s'", o->hto);
        return 2;
    }
    if (s->conns_reserved >= s->max_conns) {
        log_msg(LOG_ERROR, "--reserved-conns (%d) must be below --max-conns (%d)",
                s->conns_reserved, s->max_conns);
        return 2;
    }
    enum log_format logf;
    if (log_format_parse(o->lf, &logf)) {
        fprintf(stderr, "ddpmd serve: --log-format takes text or json, not '%s'\n", o->lf);
        return 2;
    }
    log_set_format(logf);
    if (serve_fd_limit(&s->max_conns, &s->conns_reserved)) return 2;
    if (spec_parse_size(o->umb, &s->up_bytes) || s->up_bytes < 1024 ||
        spec_parse_size(o->umu, &s->up_unpacked) || s->up_unpacked < 1024) {
        log_msg(LOG_ERROR, "--upload-max-bytes and --upload-max-unpacked take sizes of at least "
                           "1024 bytes, not '%s' and '%s'", o->umb, o->umu);
        return 2;
    }
    if (parse_count("--upload-max-files", o->umf, 1, 100000000, &s->up_files)) return 2;
    char *qend, *pend;
    errno = 0;
    long long qp = strtoll(o->uqp, &qend, 10);
    if (spec_parse_size(o->uqb, &s->quota_bytes) || s->quota_bytes < 1024 || errno || *qend ||
        qend == o->uqp || qp < 1) {
        log_msg(LOG_ERROR, "--upload-quota-bytes takes a size of at least 1024 bytes and "
                           "--upload-quota-pixels a positive integer, not '%s' and '%s'", o->uqb,
                o->uqp);
        return 2;
    }
    s->quota_pixels = qp;
    s->plan_timeout = strtod(o->pto, &pend);
    if (parse_count("--upload-workers", o->uw, 1, 64, &s->up_workers) ||
        parse_count("--upload-queue", o->uq, 1, 10000, &s->up_queue) ||
        parse_count("--plan-workers", o->pw, 1, 64, &s->plan_workers) ||
        parse_count("--plan-queue", o->pq, 1, 10000, &s->plan_queue))
        return 2;
    if (*pend || pend == o->pto || !(s->plan_timeout >= 0.1 && s->plan_timeout <= 3600)) {
        log_msg(LOG_ERROR, "--plan-timeout takes seconds in [0.1, 3600], not '%s'", o->pto);
        return 2;
    }
    if (spec_parse_size(o->pmem, &s->plan_memory) || s->plan_memory < (1 << 20)) {
        log_msg(LOG_ERROR, "--plan-memory takes a size of at least 1MiB, not '%s'", o->pmem);
        return 2;
    }
    char *wend1, *wend2;
    s->wh_backoff = strtod(o->whb, &wend1);
    s->wh_timeout = strtod(o->wht, &wend2);
    if (parse_count("--webhook-attempts", o->whn, 1, 100, &s->wh_attempts)) return 2;
    if (*wend1 || wend1 == o->whb || !(s->wh_backoff >= 0 && s->wh_backoff <= 3600) || *wend2 ||
        wend2 == o->wht || !(s->wh_timeout > 0 && s->wh_timeout <= 600)) {
        log_msg(LOG_ERROR, "--webhook-backoff takes seconds in [0, 3600] and --webhook-timeout "
                           "in (0, 600], not '%s' and '%s'", o->whb, o->wht);
        return 2;
    }
    if (spec_parse_size(o->mb, &s->max_body) || s->max_body < 1024) {
        log_msg(LOG_ERROR, "--max-body must be a size of at least 1024 bytes, not '%s'", o->mb);
        return 2;
    }
    if (devices_parse(o->device, o->budget, &s->pc, s->budget)) return 2;
    return 0;
}

/* what a running server holds; serve_close releases whatever of it is set */
struct serve_state {
    struct api_token *tokens;
    int n_tokens;
    char prefix[API_PARSE_PREFIX_MAX + 1];
    int lfd, lockfd;            /* the listening socket (the api's once started), the lock */
    int loopback, port;
    char host[128];
    char exe[1024];             /* this binary, which the pool's children run */
    struct jobs *db;
    struct pool *pool;
    struct api *api;
    struct webhook *hooks;
};

/* Before any thread: the path prefix and the tokens read, the listening socket opened (a
 * non-loopback address refused without tokens), the data directory made private and locked
 * (one server per data directory: a second would run the same queued jobs), the devices'
 * baselines measured (devices_ready). 0, or the exit status (2 for a bad option, 1 otherwise)
 * with the reason logged. */
static int serve_open(struct serve_state *sv, const struct serve_opts *o,
                      struct serve_settings *s)
{
    char err[600];
    if (api_path_prefix_check(o->path_prefix, sv->prefix, sizeof sv->prefix, err, sizeof err)) {
        fprintf(stderr, "ddpmd serve: --path-prefix: %s\n", err);
        return 2;
    }
    if (o->token_file && api_tokens_load(o->token_file, &sv->tokens, &sv->n_tokens, err,
                                         sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 2;
    }
    sv->lfd = open_listener(o->listen, &sv->loopback, sv->host, sizeof sv->host, &sv->port, err,
                            sizeof err);
    if (sv->lfd < 0) {
        log_msg(LOG_ERROR, "%s", err);
        return 2;
    }
    if (!sv->tokens && !sv->loopback) {
        log_msg(LOG_ERROR, "refusing to listen on %s without --token-file: without "
                        "tokens only a loopback address (127.0.0.1, ::1) is accepted", o->listen);
        return 2;
    }
    if (fsio_private_dir(o->data, err, sizeof err)) { /* 0600 files, 0700 folders */
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    char lockpath[1200];
    snprintf(lockpath, sizeof lockpath, "%s/ddpmd.lock", o->data);
    sv->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (sv->lockfd < 0 || flock(sv->lockfd, LOCK_EX | LOCK_NB)) {
        log_msg(LOG_ERROR, "%s: %s", lockpath,
                sv->lockfd < 0 ? strerror(errno)
                : errno == EWOULDBLOCK ? "another ddpmd serve uses this data directory"
                                       : strerror(errno));
        return 1;
    }
    ssize_t el = readlink("/proc/self/exe", sv->exe, sizeof sv->exe - 1);
    if (el <= 0) {
        log_msg(LOG_ERROR, "readlink /proc/self/exe: %s", strerror(errno));
        return 1;
    }
    sv->exe[el] = 0;
    return devices_ready(sv->exe, &s->pc, s->budget) ? 1 : 0;
}

/* SIGTERM and SIGINT blocked in every thread (and so in every child before its exec, which
 * unblocks) for serve_run's sigwait on set; SIGPIPE ignored. Before the first thread. */
static void serve_block_signals(sigset_t *set)
{
    api_init_process();
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* The service started in order: the upload store, the job store, the cost model, the webhooks
 * (the store's observer before the pool's thread uses it), the pool, the HTTP layer (which takes
 * the listening socket), the pool's notices to it. 0, or 1 with the reason logged. */
static int serve_start(struct serve_state *sv, const struct serve_opts *o,
                       struct serve_settings *s)
{
    char err[600];
    struct pool_config *pc = &s->pc;
    if (upload_store_init(o->data, err, sizeof err) || jobs_open(&sv->db, o->data, err,
                                                                 sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    pc->exe = sv->exe;
    pc->data_dir = o->data;
    pc->cores = s->ncores;
    pc->max_queue = s->max_queue;
    pc->max_per_owner = s->max_per_owner;
    pc->max_retries = s->max_retries;
    if (train_cost_model(&pc->cost, getenv("DDPMD_COST_MODEL"), err, sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    struct webhook_config wc = {.data_dir = o->data, .secret_file = o->whs, .allow = o->wha,
                                .max_attempts = s->wh_attempts, .backoff_s = s->wh_backoff,
                                .timeout_s = s->wh_timeout};
    if (webhook_start(&sv->hooks, &wc, sv->db, err, sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    jobs_set_observer(sv->db, webhook_observe, sv->hooks);
    if (pool_start(&sv->pool, sv->db, pc, err, sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    struct api_config ac = {.listen_fd = sv->lfd, .threads = s->http_threads,
                            .max_body = (size_t)s->max_body, .keepalive_s = s->keepalive,
                            .db = sv->db, .pool = sv->pool, .tokens = sv->tokens,
                            .n_tokens = sv->n_tokens,
                            .openapi = ddpmd_openapi_yaml, .openapi_len = ddpmd_openapi_yaml_len,
                            .path_prefix = sv->prefix,
                            .upload_max_bytes = s->up_bytes, .upload_max_unpacked = s->up_unpacked,
                            .upload_max_files = s->up_files, .webhook = sv->hooks,
                            .max_conns = s->max_conns, .conns_per_ip = s->conns_per_ip,
                            .conns_reserved = s->conns_reserved,
                            .head_timeout_s = s->head_timeout,
                            .plan_workers = s->plan_workers, .plan_queue = s->plan_queue,
                            .plan_timeout_s = s->plan_timeout, .plan_memory = s->plan_memory,
                            .upload_workers = s->up_workers, .upload_queue = s->up_queue,
                            .upload_quota_bytes = s->quota_bytes,
                            .upload_quota_pixels = s->quota_pixels};
    if (api_start(&sv->api, &ac, err, sizeof err)) {
        log_msg(LOG_ERROR, "%s", err);
        return 1;
    }
    sv->lfd = -1; /* the daemon's now */
    pool_set_notify(sv->pool, api_notify, sv->api);
    api_notify(sv->api);
    return 0;
}

/* where it listens: a log line with the devices, and one JSON line on stdout */
static void serve_announce(const struct serve_state *sv, const struct serve_opts *o,
                           const struct serve_settings *s)
{
    const struct pool_config *pc = &s->pc;
    const char *host = sv->host;
    char devs[POOL_MAX_DEVICES * 120] = "";
    for (int i = 0, n = 0; i < pc->n_devices && n < (int)sizeof devs; i++)
        n += snprintf(devs + n, sizeof devs - (size_t)n, "%s%s (budget %" PRId64 " bytes, process "
                      "baseline %" PRId64 ")", i ? ", " : "", pc->devices[i].name,
                      pc->devices[i].budget_bytes, pc->devices[i].baseline_bytes);
    log_msg(LOG_INFO, "%s on %s:%d; devices %s; %d cores; data in %s",
            sv->tokens ? "bearer tokens required" : "no tokens: loopback only, one local user",
            host, sv->port, devs, s->ncores, o->data);
    printf("{\"listening\":\"http://%s%s%s:%d\",\"host\":\"%s\",\"port\":%d}\n",
           strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", sv->port, host,
           sv->port);
    fflush(stdout);
}

/* Releases what sv holds, in the order the parts depend on one another; rc: the exit status so
 * far (a failed start stops the pool here). */
static void serve_close(struct serve_state *sv, int rc)
{
    if (sv->pool && rc) pool_stop(sv->pool);
    webhook_stop(sv->hooks); /* before the api, whose job JSON its bodies use */
    api_stop(sv->api);
    if (sv->db) jobs_set_observer(sv->db, NULL, NULL); /* no thread is left to append events */
    webhook_free(sv->hooks);
    pool_free(sv->pool);
    jobs_close(sv->db);
    if (sv->lfd >= 0) close(sv->lfd);
    if (sv->lockfd >= 0) close(sv->lockfd);
    free(sv->tokens);
}

/* `ddpmd serve`: options, the checks and the resources that need no thread, the signals, the
 * service, then waiting for SIGTERM or SIGINT: no new jobs, the running ones stopped at their
 * next step with a checkpoint, everything released */
static int serve_run(int argc, char **argv)
{
    struct serve_opts o = {0};
    int rc = serve_options_read(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.probe) return probe_run(o.device);
    if (o.routes) {
        api_routes_print(stdout);
        return 0;
    }
    struct serve_settings s = {0};
    if ((rc = serve_options_check(&o, &s))) return rc;
    struct serve_state sv = {.lfd = -1, .lockfd = -1};
    if ((rc = serve_open(&sv, &o, &s))) {
        serve_close(&sv, rc);
        return rc;
    }
    sigset_t set;
    serve_block_signals(&set);
    if ((rc = serve_start(&sv, &o, &s))) {
        serve_close(&sv, rc);
        return rc;
    }
    serve_announce(&sv, &o, &s);
    int sig = 0;
    sigwait(&set, &sig);
    log_msg(LOG_INFO, "%s: no new jobs; running jobs stop at their next step with a checkpoint",
            strsignal(sig));
    api_stop_admitting(sv.api);
    pool_stop(sv.pool); /* waits for the children; their last events still reach the streams */
    serve_close(&sv, 0);
    log_msg(LOG_INFO, "stopped");
    return 0;
}

/* the config file's text holds the option values serve_run uses: freed once it has returned,
 * on every path (an early refusal included) */
int serve_main(int argc, char **argv)
{
    int rc = serve_run(argc, argv);
    free(serve_config_text);
    serve_config_text = NULL;
    return rc;
}
