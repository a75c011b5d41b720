/* test_pool_logcap.c - the log cap (child.h's CHILD_LOG_LINES_MAX) on the pool's real path: a pool
 * with one cpu device whose "ddpmd" is a stand-in shell script printing a chosen number of log
 * lines (stdout and stderr, plus one protocol event that is no log line) per start, read by
 * pool.c's pipe reader. Each job start has its own allowance: the script dies of SIGKILL twice
 * (the pool retries it, --max-retries 2) and succeeds on its third start, printing 2010, 2000 and
 * 2001 lines, so the job stores 2000 + 2000 + 2000 log lines and a note of 10 and of 1 dropped,
 * each note after its start's lines. Nothing waits on time: the test waits for the job's state.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "child.h"
#include "jobs.h"
#include "pool.h"
#include "spec.h"
#include "test_util.h"

/* the lines each start prints (the last one succeeds) */
static const int LINES[3] = {CHILD_LOG_LINES_MAX + 10, CHILD_LOG_LINES_MAX, CHILD_LOG_LINES_MAX + 1};

static const char TINY[] =
    "{\"model\": {\"preset\": \"ddpm\", \"in_channels\": 1, \"image_size\": 32,"
    " \"block_out_channels\": [32, 64, 64], \"layers_per_block\": 1,"
    " \"attention_resolutions\": [8], \"norm_num_groups\": 8},"
    " \"data\": {\"dataset\": \"fashion-mnist\"},"
    " \"train\": {\"batch\": 2, \"steps\": 3, \"threads\": 1}}";

/* the stand-in: counts its starts in OUT/starts (OUT from --out), prints one protocol event on
 * stdout, then its lines (every fourth on stdout, the rest on stderr); SIGKILL before the last */
static int write_script(const char *path, const char *event)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "#!/bin/sh\n"
            "out=\n"
            "while [ $# -gt 0 ]; do [ \"$1\" = --out ] && out=$2; shift; done\n"
            "mkdir -p \"$out\" || exit 3\n"
            "n=$(cat \"$out/starts\" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > \"$out/starts\"\n"
            "case $n in 1) lines=%d;; 2) lines=%d;; *) lines=%d;; esac\n"
            "printf '%%s\\n' '%s'\n"
            "i=0\n"
            "while [ $i -lt $lines ]; do\n"
            "  if [ $((i %% 4)) -eq 0 ]; then echo \"start $n out $i\"; else echo \"start $n err $i\" >&2; fi\n"
            "  i=$((i + 1))\n"
            "done\n"
            "[ $n -lt 3 ] && kill -9 $$\n"
            "exit 0\n",
            LINES[0], LINES[1], LINES[2], event);
    int bad = ferror(f);
    if (fclose(f) || bad) return -1;
    return chmod(path, 0755);
}

/* the job's state once it has ended (bounded only as a hang guard, never as a speed) */
static enum job_state wait_ended(struct jobs *db, const char *id)
{
    const struct timespec tick = {0, 20 * 1000 * 1000};
    enum job_state st = JOB_QUEUED;
    for (int i = 0; i < 30000; i++) {
        if (jobs_state(db, id, &st) == JOBS_OK && job_state_ended(st)) return st;
        nanosleep(&tick, NULL);
    }
    return st;
}

int main(void)
{
    char dir[] = "/tmp/ddpmd-logcap-XXXXXX", err[600], exe[256], event[128];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    /* a protocol event as a child writes it: a progress event, not a log line */
    struct child_event e = {.kind = CHILD_EVENT_STEP};
    child_event_set(&e, CHILD_STEP, 1);
    child_event_set(&e, CHILD_STEPS, 3);
    FILE *m = fmemopen(event, sizeof event, "w");
    CHECK(m != NULL, "fmemopen");
    child_event_write(m, &e);
    fclose(m);
    event[strcspn(event, "\n")] = 0;
    snprintf(exe, sizeof exe, "%s/ddpmd-stand-in.sh", dir);
    CHECK(write_script(exe, event) == 0, "write %s", exe);

    struct jobs *db = NULL;
    struct pool *pool = NULL;
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "jobs_open: %s", err);
    struct pool_config pc = {.exe = exe, .data_dir = dir, .n_devices = 1, .cores = 1,
                             .max_queue = 10, .max_retries = 2};
    snprintf(pc.devices[0].name, sizeof pc.devices[0].name, "cpu");
    pc.devices[0].budget_bytes = (int64_t)8 << 30;
    pc.devices[0].cost_scale = 1;
    cost_model_default(&pc.cost);
    CHECK(db && pool_start(&pool, db, &pc, err, sizeof err) == 0, "pool_start: %s", err);
    if (!pool) return tu_finish("test_pool_logcap");

    struct train_spec spec;
    struct spec_errors E;
    memset(&E, 0, sizeof E);
    CHECK(spec_parse(TINY, &spec, &E) == 0, "the spec parses");
    struct pool_train job = {.spec = &spec};
    struct pool_admission adm;
    char id[JOBS_ID_LEN] = "";
    int rc = pool_submit(pool, "alice", NULL, &job, &adm, id, err, sizeof err);
    cJSON_Delete(adm.plans);
    CHECK(rc == POOL_OK, "submit: %d %s", rc, err);
    enum job_state st = rc == POOL_OK ? wait_ended(db, id) : JOB_FAILED;
    CHECK(st == JOB_SUCCEEDED, "the job ended %s, not succeeded", job_state_name(st));
    pool_stop(pool); /* every child reaped, every line stored */

    /* the log events in order: per start, its stored lines, then its note when it dropped any */
    long long logs[3] = {0, 0, 0}, notes[3] = {0, 0, 0}, dropped[3] = {0, 0, 0};
    int start = 0, retries = 0, progress = 0, running = 0, order_ok = 1, foreign = 0;
    for (int64_t after = 0;;) {
        struct job_event *ev = NULL;
        int n = 0;
        if (jobs_events_after(db, id, after, 1000, &ev, &n) || n == 0) {
            job_events_free(ev, n);
            break;
        }
        for (int i = 0; i < n; i++) {
            after = ev[i].seq;
            cJSON *o = cJSON_Parse(ev[i].data);
            const cJSON *line = cJSON_GetObjectItemCaseSensitive(o, "line");
            const char *t = ev[i].type;
            if (strcmp(t, "state") == 0 && strstr(ev[i].data, "\"running\"")) {
                start = running++;
            } else if (strcmp(t, "retry") == 0) {
                retries++;
            } else if (strcmp(t, "progress") == 0) {
                progress++;
            } else if (strcmp(t, "log") == 0 && cJSON_IsString(line) && start < 3) {
                int s = -1, k = -1;
                long long d = 0;
                if (sscanf(line->valuestring, "start %d %*s %d", &s, &k) == 2) {
                    order_ok &= s == start + 1 && notes[start] == 0;
                    logs[start]++;
                } else if (sscanf(line->valuestring, "%lld more log line", &d) == 1) {
                    notes[start]++;
                    dropped[start] = d;
                } else {
                    foreign++;
                }
            }
            cJSON_Delete(o);
        }
        job_events_free(ev, n);
    }
    CHECK(running == 3 && retries == 2, "%d starts and %d retries, expected 3 and 2", running,
          retries);
    CHECK(progress == 3, "%d progress events, expected the one protocol line of each start",
          progress);
    CHECK(order_ok, "a log line stored under another start, or after its start's note");
    CHECK(foreign == 0, "%d log events neither a line nor a note", foreign);
    for (int s = 0; s < 3; s++) {
        int want_dropped = LINES[s] - CHILD_LOG_LINES_MAX; /* lines past the cap */
        CHECK(logs[s] == CHILD_LOG_LINES_MAX, "start %d: %lld log lines stored of %d, expected %d",
              s + 1, logs[s], LINES[s], CHILD_LOG_LINES_MAX);
        CHECK(notes[s] == (want_dropped > 0) && dropped[s] == want_dropped,
              "start %d: %lld notes saying %lld dropped, expected %d saying %d", s + 1, notes[s],
              dropped[s], want_dropped > 0, want_dropped);
    }
    printf("per start: %lld/%lld/%lld log lines stored, %lld/%lld/%lld noted dropped\n", logs[0],
           logs[1], logs[2], dropped[0], dropped[1], dropped[2]);
    pool_free(pool);
    jobs_close(db);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm");
    return tu_finish("test_pool_logcap");
}
