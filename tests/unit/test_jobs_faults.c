/* test_jobs_faults.c - the job store on a full disk (issue 9): on a tiny tmpfs filled to the last
 * byte every store write (insert, event, state, progress, idempotency) fails with SQLite's cause
 * (SQLITE_FULL) and stores nothing of itself, except a job's end (the store's reserve); once
 * space is freed the store works and is whole.
 * Needs mount(2) (root in a namespace that allows tmpfs): exit 77 (ctest skip) where it is denied.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "jobs.h"
#include "test_util.h"

static char mnt[64], fill[128];

static void row(struct job_row *r, const char *id, char *spec)
{
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->owner, sizeof r->owner, "alice");
    snprintf(r->kind, sizeof r->kind, "train");
    snprintf(r->device, sizeof r->device, "cpu");
    r->reserved_bytes = 1234;
    r->steps = 10;
    r->spec = spec;
    r->plan = "{\"plan_bytes\":1000}";
}

/* writes into mnt/fill until the file system refuses a single byte; 0 when it did */
static int fill_disk(void)
{
    int fd = open(fill, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    static char buf[65536];
    size_t chunk = sizeof buf;
    for (;;) {
        ssize_t w = write(fd, buf, chunk);
        if (w > 0) continue;
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != ENOSPC) break;
        if (chunk == 1) {
            close(fd);
            return 0;
        }
        chunk = chunk > 4096 ? 4096 : 1; /* the last page's bytes too */
    }
    close(fd);
    return -1;
}

/* a JSON string value of about n bytes: more than any slack left in the database's files */
static char *big_json(size_t n)
{
    char *s = malloc(n + 16);
    if (!s) return NULL;
    memcpy(s, "{\"x\":\"", 6);
    for (size_t i = 6; i < n; i++) s[i] = (char)('a' + i % 26);
    memcpy(s + n, "\"}", 3);
    return s;
}

static int is_full(int rc, const char *what)
{
    const char *m = jobs_errmsg();
    CHECK(rc == JOBS_ERR_FULL, "%s on a full disk: status %d (want JOBS_ERR_FULL), %s", what, rc, m);
    CHECK(strstr(m, "SQLITE_FULL") && strstr(m, "full"), "%s: the cause names SQLITE_FULL: %s",
          what, m);
    return rc == JOBS_ERR_FULL;
}

static void integrity(const char *dir)
{
    char path[200];
    snprintf(path, sizeof path, "%s/ddpmd.db", dir);
    sqlite3 *s = NULL;
    sqlite3_stmt *st = NULL;
    int ok = sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
             sqlite3_prepare_v2(s, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
             sqlite3_step(st) == SQLITE_ROW &&
             strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    CHECK(ok, "PRAGMA integrity_check is ok: %s", s ? sqlite3_errmsg(s) : "no db");
    sqlite3_finalize(st);
    sqlite3_close(s);
}

static void test_full(const char *dir)
{
    struct jobs *db = NULL;
    char err[300];
    char small[] = "{\"x\":1}";
    char *big = big_json(96 * 1024);
    if (!big || jobs_open(&db, dir, err, sizeof err)) {
        CHECK(0, "open on the tmpfs: %s", big ? err : "out of memory");
        free(big);
        return;
    }
    struct job_row r;
    row(&r, "j00000000000000a1", small);
    CHECK(jobs_insert(db, &r) == JOBS_OK, "insert before the disk is full: %s", jobs_errmsg());
    int outcome, status;
    char *loc = NULL, *resp = NULL, made[JOBS_ID_LEN];
    CHECK(jobs_idem_begin(db, "alice", "k1", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == JOBS_OK && outcome == JOBS_IDEM_NEW,
          "idempotency key reserved before the disk is full");

    CHECK(fill_disk() == 0, "filled %s: %s", mnt, strerror(errno));

    row(&r, "j00000000000000b2", big);
    is_full(jobs_insert(db, &r), "jobs_insert");
    is_full(jobs_event_append(db, "j00000000000000a1", "progress", big, NULL), "jobs_event_append");
    is_full(jobs_set_state(db, "j00000000000000a1", JOB_RUNNING, 2, NULL, big), "jobs_set_state");
    int prc = jobs_set_progress(db, "j00000000000000a1", 5, 10, 0.5, 1.0);
    CHECK(prc == JOBS_ERR_FULL, "jobs_set_progress on a full disk: %d, %s", prc, jobs_errmsg());
    is_full(jobs_idem_begin(db, "alice", "k2", big, &outcome, &status, &loc, &resp, made),
            "jobs_idem_begin");
    CHECK(!loc && !resp, "a failed jobs_idem_begin returns no answer");
    is_full(jobs_idem_finish(db, "alice", "k1", 202, "/jobs/j00000000000000a1", big),
            "jobs_idem_finish");

    /* reads still answer, and show nothing of the failed writes */
    struct job_row g;
    int n = -1;
    CHECK(jobs_count(db, -1, &n) == JOBS_OK && n == 1, "one job while full: %d", n);
    CHECK(jobs_get(db, "j00000000000000b2", &g) == JOBS_ERR_NOT_FOUND, "the refused job is absent");
    job_row_free(&g);

    /* a job's end is still recorded: the store's reserve gives SQLite the room */
    char reserve[200];
    snprintf(reserve, sizeof reserve, "%s/ddpmd.db-reserve", dir);
    CHECK(access(reserve, F_OK) == 0, "the reserve exists before it is needed");
    CHECK(jobs_set_state(db, "j00000000000000a1", JOB_FAILED, 0, "cannot write: No space left",
                         "{\"state\":\"failed\"}") == JOBS_OK,
          "an end is recorded on a full disk: %s", jobs_errmsg());
    CHECK(access(reserve, F_OK) != 0, "the reserve was spent");
    fill_disk(); /* what the reserve freed is taken again */
    struct job_row r3;
    row(&r3, "j00000000000000c3", small);
    CHECK(jobs_insert(db, &r3) == JOBS_ERR_FULL, "no new job while the reserve cannot be made: %s",
          jobs_errmsg());

    CHECK(unlink(fill) == 0, "free the space: %s", strerror(errno));

    CHECK(jobs_count(db, -1, &n) == JOBS_OK && n == 1, "one job after freeing: %d", n);
    if (jobs_get(db, "j00000000000000a1", &g) == JOBS_OK) {
        CHECK(g.state == JOB_FAILED && g.step == 0 && g.error && strstr(g.error, "No space") &&
                  g.starts == 0,
              "the job holds its end and none of the failed updates: %s step %lld", job_state_name(g.state),
              (long long)g.step);
        job_row_free(&g);
    } else {
        CHECK(0, "the first job reads back");
    }
    struct job_event *ev = NULL;
    CHECK(jobs_events_after(db, "j00000000000000a1", 0, 100, &ev, &n) == JOBS_OK && n == 2 &&
              strcmp(ev[0].type, "state") == 0 && strstr(ev[1].data, "failed"),
          "the queued and the failed event only: %d events", n);
    job_events_free(ev, n);
    CHECK(jobs_events_after(db, "j00000000000000b2", 0, 100, &ev, &n) == JOBS_OK && n == 0,
          "no event of the refused job: %d", n);
    job_events_free(ev, n);
    /* the pending key is still pending, the refused one never reserved */
    CHECK(jobs_idem_begin(db, "alice", "k1", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) ==
              JOBS_OK && outcome == JOBS_IDEM_PENDING, "k1 still pending: %d", outcome);
    free(loc), free(resp), loc = resp = NULL;

    /* and every write works again */
    CHECK(jobs_insert(db, &r) == JOBS_OK, "insert after freeing: %s", jobs_errmsg());
    CHECK(access(reserve, F_OK) == 0, "the insert made the reserve again");
    CHECK(jobs_set_state(db, "j00000000000000a1", JOB_RUNNING, 2, NULL, "{\"state\":\"running\"}") ==
              JOBS_OK, "set_state after freeing: %s", jobs_errmsg());
    CHECK(jobs_set_progress(db, "j00000000000000a1", 5, 10, 0.5, 1.0) == JOBS_OK,
          "progress after freeing: %s", jobs_errmsg());
    int64_t seq = 0;
    CHECK(jobs_event_append(db, "j00000000000000a1", "progress", "{}", &seq) == JOBS_OK && seq == 4,
          "event after freeing: seq %lld (want 4: no hole and no leftover)", (long long)seq);
    CHECK(jobs_idem_finish(db, "alice", "k1", 202, "/jobs/j00000000000000a1", "{}") == JOBS_OK,
          "idem_finish after freeing: %s", jobs_errmsg());
    CHECK(jobs_idem_begin(db, "alice", "k2", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) ==
              JOBS_OK && outcome == JOBS_IDEM_NEW, "k2 is new after freeing: %d", outcome);
    free(loc), free(resp);
    jobs_close(db);

    /* reopened: the same two jobs, a whole database */
    CHECK(jobs_open(&db, dir, err, sizeof err) == JOBS_OK, "reopen: %s", err);
    if (db) {
        CHECK(jobs_count(db, -1, &n) == JOBS_OK && n == 2, "two jobs after reopening: %d", n);
        jobs_close(db);
    }
    integrity(dir);
    free(big);
}

int main(void)
{
    char tmpl[] = "/tmp/ddpmd_jobs_faults_XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(mnt, sizeof mnt, "%s", tmpl);
    snprintf(fill, sizeof fill, "%s/fill", mnt);
    /* 2 MiB: the database, its WAL and the reserve fit; 96 KiB values never fit in what is left after filling */
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=2m,mode=0755") != 0) {
        fprintf(stderr, "test_jobs_faults: cannot mount a tmpfs on %s (%s): skipped\n", mnt,
                strerror(errno));
        rmdir(mnt);
        return 77;
    }
    test_full(mnt);
    if (umount(mnt) != 0) umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    return tu_finish("test_jobs_faults");
}
