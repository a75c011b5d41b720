/* test_api_faults.c - every request gets an answer: the HTTP api in this process (its store, a
 * pool with one cpu device and no job), requests over a real socket while the Nth allocation of
 * our code (every cJSON allocation included) fails, swept over N for each request. Each must be
 * answered with a status line - a 500 problem+json when the failure left no other answer -
 * never a connection closed without one (`return MHD_NO`). Leaks per N are checked under ASan
 * (scripts/sanitize.sh). Linked with -Wl,--wrap=malloc,calloc,realloc,strdup (CMakeLists.txt):
 * libmicrohttpd's and SQLite's own allocations are not failed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "api.h"
#include "jobs.h"
#include "pool.h"
#include "test_util.h"
#include "upload.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

static volatile int af_armed;
static volatile long af_seen, af_fail;
static volatile int af_failed;

static int af_hit(void)
{
    if (!af_armed) return 0;
    long k = __atomic_add_fetch(&af_seen, 1, __ATOMIC_RELAXED);
    if (k == af_fail) {
        af_failed = 1;
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n) { return af_hit() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { return af_hit() ? NULL : __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { return af_hit() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s)
{
    if (af_hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}

int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

/* one request on a new connection: the raw answer (NUL-terminated, malloc'd by the real
 * allocator), NULL when the connection closed before a byte came */
static char *exchange(int port, const char *req, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    for (size_t o = 0; o < len;) {
        ssize_t w = send(fd, req + o, len - o, MSG_NOSIGNAL);
        if (w <= 0) break;
        o += (size_t)w;
    }
    size_t cap = 1 << 16, n = 0;
    char *out = __real_malloc(cap + 1);
    for (ssize_t r; out && n < cap && (r = recv(fd, out + n, cap - n, 0)) > 0;) n += (size_t)r;
    close(fd);
    if (out) out[n] = 0;
    if (out && n == 0) {
        free(out);
        return NULL;
    }
    return out;
}

struct request {
    const char *what, *method, *path, *type, *body;
};

/* the request with allocation N failing, N = 1, 2, ... until it saw fewer than N: every answer
 * has a status line, and a 500 a problem+json body */
static void sweep(int port, const struct request *q)
{
    char req[2048];
    size_t blen = q->body ? strlen(q->body) : 0;
    int len = snprintf(req, sizeof req,
                       "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%s%s"
                       "Content-Length: %zu\r\n\r\n%s",
                       q->method, q->path, q->type ? "Content-Type: " : "", q->type ? q->type : "",
                       q->type ? "\r\n" : "", blen, q->body ? q->body : "");
    long n, dropped = 0, answered500 = 0;
    static int leaked;
    for (n = 1; n < 5000; n++) {
        af_seen = 0;
        af_failed = 0;
        af_fail = n;
        af_armed = 1;
        char *a = exchange(port, req, (size_t)len);
        af_armed = 0;
        int status = 0;
        if (!a || sscanf(a, "HTTP/1.1 %d", &status) != 1) {
            if (!dropped++)
                CHECK(0, "%s: allocation %ld failing: no answer (%s)", q->what, n,
                      a ? a : "the connection closed");
        } else if (status == 500) {
            answered500++;
            CHECK(strstr(a, "application/problem+json") != NULL,
                  "%s: allocation %ld failing: a 500 without a problem body:\n%s", q->what, n, a);
        }
        free(a);
        if (!leaked && __lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
            leaked = 1;
            CHECK(0, "%s: allocation %ld failing leaks (report above)", q->what, n);
        }
        if (!af_failed) break;
    }
    CHECK(n < 5000, "%s: no end after %ld allocations", q->what, n - 1);
    printf("  %-28s %4ld allocations swept, %3ld answered 500, %ld unanswered\n", q->what, n - 1,
           answered500, dropped);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    api_init_process(); /* cJSON through the api's counting hooks, over the wrapped malloc */
    char dir[] = "/tmp/ddpmd-api-faults-XXXXXX", err[600];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    struct jobs *db = NULL;
    struct pool *pool = NULL;
    struct api *api = NULL;
    CHECK(upload_store_init(dir, err, sizeof err) == 0, "upload store: %s", err);
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "jobs_open: %s", err);
    struct pool_config pc = {.exe = "/bin/false", .data_dir = dir, .n_devices = 1, .cores = 1,
                             .max_queue = 10, .max_retries = 0};
    snprintf(pc.devices[0].name, sizeof pc.devices[0].name, "cpu");
    pc.devices[0].budget_bytes = 1 << 30;
    pc.devices[0].cost_scale = 1;
    cost_model_default(&pc.cost);
    CHECK(db && pool_start(&pool, db, &pc, err, sizeof err) == 0, "pool_start: %s", err);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 64) == 0 &&
              getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0,
          "listen: %s", strerror(errno));
    static const char doc[] = "openapi: 3.1.0\nservers: [{url: /}]\npaths: {}\n";
    struct api_config ac = {.listen_fd = lfd, .threads = 2, .max_body = 1 << 16,
                            .keepalive_s = 15, .db = db, .pool = pool, .openapi = doc,
                            .openapi_len = sizeof doc - 1, .path_prefix = "",
                            .upload_max_bytes = 1 << 20, .upload_max_unpacked = 1 << 20,
                            .upload_max_files = 10};
    if (!pool || api_start(&api, &ac, err, sizeof err)) {
        CHECK(0, "api_start: %s", err);
        return tu_finish("test_api_faults");
    }
    int port = ntohs(sa.sin_port);
    static const struct request reqs[] = {
        {"GET /healthz", "GET", "/healthz", NULL, NULL},
        {"GET /readyz", "GET", "/readyz", NULL, NULL},
        {"GET /devices", "GET", "/devices", NULL, NULL},
        {"GET /metrics", "GET", "/metrics", NULL, NULL},
        {"GET /jobs", "GET", "/jobs?limit=5", NULL, NULL},
        {"GET /jobs/{id}: none", "GET", "/jobs/j0000000000000000", NULL, NULL},
        {"GET /nothing", "GET", "/nothing/at/all", NULL, NULL},
        {"DELETE /jobs", "DELETE", "/jobs", NULL, NULL},
        {"POST /train: not JSON", "POST", "/train", "application/json", "{\"model\": "},
        {"POST /train: invalid", "POST", "/train", "application/json",
         "{\"model\": {\"preset\": \"x\"}, \"train\": {\"batch\": 0}, \"extra\": 1}"},
        {"POST /train: bad webhook", "POST", "/train", "application/json",
         "{\"webhook\": {\"url\": \"ftp://x\"}, \"data\": {\"dataset\": \"fashion-mnist\"}}"},
        {"POST /samples: invalid", "POST", "/samples", "application/json",
         "{\"n\": 0, \"sampler\": \"x\", \"what\": 1}"},
        {"POST /samples: no job", "POST", "/samples", "application/json",
         "{\"job\": \"j0000000000000000\"}"},
        {"GET /datasets", "GET", "/datasets", NULL, NULL},
        {"GET /datasets/{id}", "GET", "/datasets/fashion-mnist", NULL, NULL},
        {"GET /checkpoints/{id}", "GET", "/checkpoints/j0000000000000000-1", NULL, NULL},
        {"GET /jobs/{id}/events", "GET", "/jobs/j0000000000000000/events", NULL, NULL},
        {"DELETE /jobs/{id}: none", "DELETE", "/jobs/j0000000000000000", NULL, NULL},
        {"POST /jobs/{id}/resume: none", "POST", "/jobs/j0000000000000000/resume", NULL, NULL},
        {"GET /jobs?label=", "GET", "/jobs?label=team:vision&name=a", NULL, NULL},
        {"POST /train: bad name, labels", "POST", "/train", "application/json",
         "{\"name\": \"-\", \"labels\": {\"a\": \"b\", \"\": 1}, \"data\": {}}"},
        {"POST /checkpoints: not safetensors", "POST", "/checkpoints", "application/octet-stream",
         "not a safetensors file at all"},
        {"GET /openapi.yaml", "GET", "/openapi.yaml", NULL, NULL},
        {"GET /", "GET", "/", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) sweep(port, &reqs[i]);
    api_stop(api);
    pool_stop(pool);
    pool_free(pool);
    jobs_close(db);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm");
    return tu_finish("test_api_faults");
}
