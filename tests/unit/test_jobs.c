/* test_jobs.c - the service's pieces below HTTP: the SQLite job store (insert, list with filters
 * and paging, state changes with their events, event log order, a placement, reopen, a newer
 * schema refused, a version 2 store migrated, a long job's progress thinned),
 * job and checkpoint ids that can never name a path, sizes and the token file.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "export.h"
#include "jobs.h"
#include "pool.h"
#include "spec.h"
#include "test_util.h"

static void row(struct job_row *r, const char *id, const char *owner)
{
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->owner, sizeof r->owner, "%s", owner);
    snprintf(r->kind, sizeof r->kind, "train");
    snprintf(r->device, sizeof r->device, "cpu");
    r->reserved_bytes = 1234;
    r->steps = 10;
    r->spec = "{\"x\":1}";
    r->plan = "{\"plan_bytes\":1000}";
}

static void test_store(const char *dir)
{
    struct jobs *db;
    char err[300];
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "open: %s", err);
    struct job_row r;
    row(&r, "j0000000000000001", "alice");
    CHECK(jobs_insert(db, &r) == 0, "insert 1");
    row(&r, "j0000000000000002", "bob");
    CHECK(jobs_insert(db, &r) == 0, "insert 2");
    row(&r, "j0000000000000003", "alice");
    CHECK(jobs_insert(db, &r) == 0, "insert 3");
    CHECK(jobs_insert(db, &r) != 0, "a duplicate id is refused");

    struct job_row g;
    CHECK(jobs_get(db, "j0000000000000002", &g) == 0 && g.state == JOB_QUEUED &&
              strcmp(g.owner, "bob") == 0 && g.reserved_bytes == 1234 && g.steps == 10 &&
              isnan(g.loss) && g.threads == 0 && g.created_at[0] && !g.started_at[0],
          "get");
    job_row_free(&g);
    CHECK(jobs_get(db, "j00000000000000ff", &g) == JOBS_ERR_NOT_FOUND, "unknown id");
    enum job_state js = JOB_FAILED;
    CHECK(jobs_state(db, "j0000000000000002", &js) == 0 && js == JOB_QUEUED, "state alone");
    CHECK(jobs_state(db, "j00000000000000ff", &js) == JOBS_ERR_NOT_FOUND, "state of an unknown id");

    struct job_row *rows;
    int n;
    CHECK(jobs_list(db, "alice", -1, NULL, 10, &rows, &n) == 0 && n == 2 &&
              strcmp(rows[0].id, "j0000000000000001") == 0 &&
              strcmp(rows[1].id, "j0000000000000003") == 0,
          "owner filter, creation order");
    job_rows_free(rows, n);
    CHECK(jobs_list(db, NULL, -1, NULL, 1, &rows, &n) == 0 && n == 1, "limit");
    job_rows_free(rows, n);
    CHECK(jobs_list(db, NULL, -1, "j0000000000000001", 10, &rows, &n) == 0 && n == 2 &&
              strcmp(rows[0].id, "j0000000000000002") == 0,
          "after");
    job_rows_free(rows, n);

    CHECK(jobs_set_state(db, "j0000000000000002", JOB_RUNNING, 3, NULL, "{\"state\":\"running\"}") == 0,
          "to running");
    CHECK(jobs_set_progress(db, "j0000000000000002", 4, 10, 0.5, 12.0) == 0, "progress");
    CHECK(jobs_event_append(db, "j0000000000000002", "progress", "{\"step\":4}", NULL) == 0, "event");
    CHECK(jobs_set_state(db, "j0000000000000002", JOB_FAILED, 0, "exit status 1",
                         "{\"state\":\"failed\"}") == 0,
          "to failed");
    CHECK(jobs_state(db, "j0000000000000002", &js) == 0 && js == JOB_FAILED, "state after the run");
    CHECK(jobs_get(db, "j0000000000000002", &g) == 0 && g.state == JOB_FAILED && g.threads == 3 &&
              g.step == 4 && g.loss == 0.5 && g.starts == 1 && g.error &&
              strcmp(g.error, "exit status 1") == 0 && g.started_at[0] && g.ended_at[0],
          "after the run");
    job_row_free(&g);
    CHECK(jobs_list(db, NULL, JOB_QUEUED, NULL, 10, &rows, &n) == 0 && n == 2, "state filter");
    job_rows_free(rows, n);
    int cnt;
    CHECK(jobs_count(db, JOB_FAILED, &cnt) == 0 && cnt == 1, "count");
    CHECK(jobs_set_state(db, "j00000000000000ff", JOB_FAILED, 0, NULL, "{}") == JOBS_ERR_NOT_FOUND,
          "state of an unknown job");

    struct job_event *ev;
    CHECK(jobs_events_after(db, "j0000000000000002", 0, 100, &ev, &n) == 0 && n == 4, "events");
    if (n == 4) {
        CHECK(ev[0].seq == 1 && ev[3].seq == 4, "seq 1..4");
        CHECK(strcmp(ev[0].type, "state") == 0 && strstr(ev[0].data, "queued"), "first: queued");
        CHECK(strcmp(ev[2].type, "progress") == 0, "third: progress");
        CHECK(strstr(ev[3].data, "failed") != NULL, "last: failed");
    }
    job_events_free(ev, n);
    CHECK(jobs_events_after(db, "j0000000000000002", 2, 100, &ev, &n) == 0 && n == 2 &&
              ev[0].seq == 3,
          "events after 2");
    job_events_free(ev, n);
    CHECK(jobs_events_after(db, "j0000000000000001", 0, 100, &ev, &n) == 0 && n == 1,
          "events are per job");
    job_events_free(ev, n);

    /* a placement: device, reservation and plan set, the plans kept when not given */
    row(&r, "j0000000000000004", "carol");
    r.device[0] = 0;
    r.plans = "[{\"device\":\"cpu\"},{\"device\":\"cuda:0\"}]";
    CHECK(jobs_insert(db, &r) == 0, "insert 4");
    CHECK(jobs_get(db, "j0000000000000004", &g) == 0 && g.device[0] == 0 && g.plans &&
              strcmp(g.plans, r.plans) == 0,
          "unplaced, with plans");
    job_row_free(&g);
    CHECK(jobs_set_plan(db, "j0000000000000004", "cuda:0", 99, "{\"device\":\"cuda:0\"}", NULL) ==
              0,
          "place");
    CHECK(jobs_get(db, "j0000000000000004", &g) == 0 && strcmp(g.device, "cuda:0") == 0 &&
              g.reserved_bytes == 99 && strcmp(g.plan, "{\"device\":\"cuda:0\"}") == 0 &&
              g.plans && strcmp(g.plans, r.plans) == 0,
          "placed");
    job_row_free(&g);
    CHECK(jobs_set_plan(db, "j00000000000000ff", "cpu", 1, "{}", NULL) == JOBS_ERR_NOT_FOUND,
          "placement of an unknown job");

    /* an Idempotency-Key whose job was made but whose answer was never stored (its save failed,
     * or the process died): the retry finds that job, even after a reopen, never a second one */
    int outcome, status;
    char *loc = NULL, *resp = NULL, made[JOBS_ID_LEN];
    CHECK(jobs_idem_begin(db, "carol", "k", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_NEW, "key reserved");
    row(&r, "j0000000000000005", "carol");
    r.idem_key = "k";
    CHECK(jobs_insert(db, &r) == 0, "insert 5, linked to the key");
    CHECK(jobs_idem_begin(db, "carol", "k", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_MADE &&
              strcmp(made, "j0000000000000005") == 0 && !loc && !resp,
          "a retry finds the job the key made: %d %s", outcome, made);
    CHECK(jobs_idem_abandon(db, "carol", "k") == 0, "abandon");
    CHECK(jobs_idem_begin(db, "carol", "k", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_MADE,
          "abandoning a key that made its job keeps it: %d", outcome);
    CHECK(jobs_idem_begin(db, "carol", "k", "POST /train\n{\"x\":2}", &outcome, &status, &loc,
                          &resp, made) == 0 && outcome == JOBS_IDEM_MISMATCH,
          "another body with the key: %d", outcome);
    CHECK(jobs_idem_begin(db, "carol", "k2", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_NEW, "a key that makes nothing");
    jobs_close(db);
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "reopen: %s", err);
    CHECK(jobs_idem_begin(db, "carol", "k", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_MADE &&
              strcmp(made, "j0000000000000005") == 0,
          "after a reopen the key still names its job: %d", outcome);
    CHECK(jobs_idem_begin(db, "carol", "k2", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_NEW,
          "the reservation without a job is gone after a reopen: %d", outcome);
    CHECK(jobs_idem_finish(db, "carol", "k", 202, "/jobs/j0000000000000005", "{}") == 0 &&
              jobs_idem_begin(db, "carol", "k", "POST /train\n{}", &outcome, &status, &loc, &resp,
                              made) == 0 && outcome == JOBS_IDEM_DONE && status == 202 && loc &&
              strcmp(loc, "/jobs/j0000000000000005") == 0,
          "the answer stored at last");
    free(loc);
    free(resp);
    jobs_close(db);

    /* reopened: everything is there */
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "reopen: %s", err);
    CHECK(jobs_count(db, -1, &cnt) == 0 && cnt == 5, "rows after reopen");
    jobs_close(db);

    /* a database from a newer ddpmd is refused, not rewritten */
    char path[1200];
    snprintf(path, sizeof path, "%s/ddpmd.db", dir);
    sqlite3 *s;
    sqlite3_open(path, &s);
    sqlite3_exec(s, "PRAGMA user_version = 99", NULL, NULL, NULL);
    sqlite3_close(s);
    CHECK(jobs_open(&db, dir, err, sizeof err) != 0 && strstr(err, "schema version 99"),
          "newer schema: %s", err);
}

/* a version 2 store (no jobs.plans, no idempotency.job_id) opens as version 3: its jobs read back
 * with no plans, its answered keys replay */
static void test_migrate(const char *dir)
{
    char path[1200], err[300];
    snprintf(path, sizeof path, "%s/ddpmd.db", dir);
    sqlite3 *s;
    CHECK(sqlite3_open(path, &s) == SQLITE_OK, "create a version 2 store");
    CHECK(sqlite3_exec(s,
                       "CREATE TABLE jobs(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL "
                       "UNIQUE, owner TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL, spec "
                       "TEXT NOT NULL, device TEXT NOT NULL, reserved_bytes INTEGER NOT NULL, plan "
                       "TEXT NOT NULL, threads INTEGER NOT NULL DEFAULT 0, step INTEGER NOT NULL "
                       "DEFAULT 0, steps INTEGER NOT NULL DEFAULT 0, loss REAL, img_per_s REAL, "
                       "error TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, starts INTEGER "
                       "NOT NULL DEFAULT 0, created_at TEXT NOT NULL, started_at TEXT, ended_at "
                       "TEXT);"
                       "INSERT INTO jobs(id, owner, kind, state, spec, device, reserved_bytes, "
                       "plan, created_at) VALUES('j00000000000000aa', 'x', 'train', 'queued', "
                       "'{}', 'cpu', 5, '{\"plan_bytes\":4}', 'now');"
                       "CREATE TABLE idempotency(owner TEXT NOT NULL, key TEXT NOT NULL, request "
                       "TEXT NOT NULL, status INTEGER NOT NULL DEFAULT 0, location TEXT, response "
                       "TEXT, created_at TEXT NOT NULL, PRIMARY KEY(owner, key)) WITHOUT ROWID;"
                       "INSERT INTO idempotency(owner, key, request, status, location, response, "
                       "created_at) VALUES('x', 'done', 'POST /train\n{}', 202, '/jobs/j1', "
                       "'{}', 'now'), ('x', 'pending', 'POST /train\n{}', 0, NULL, NULL, 'now');"
                       "PRAGMA user_version = 2;",
                       NULL, NULL, NULL) == SQLITE_OK,
          "version 2 rows: %s", sqlite3_errmsg(s));
    sqlite3_close(s);
    struct jobs *db;
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "open a version 2 store: %s", err);
    if (!db) return;
    struct job_row g;
    CHECK(jobs_get(db, "j00000000000000aa", &g) == 0 && g.plans == NULL &&
              strcmp(g.device, "cpu") == 0 && g.reserved_bytes == 5,
          "the old job, without plans");
    job_row_free(&g);
    struct job_row r;
    row(&r, "j00000000000000ab", "x");
    r.plans = "[]";
    snprintf(r.name, sizeof r.name, "named");
    r.labels = "{\"a\":\"b\"}";
    CHECK(jobs_insert(db, &r) == 0 && jobs_get(db, "j00000000000000ab", &g) == 0 && g.plans &&
              strcmp(g.plans, "[]") == 0 && strcmp(g.name, "named") == 0 && g.labels &&
              strcmp(g.labels, "{\"a\":\"b\"}") == 0,
          "a new job's plans, name and labels in the migrated store");
    job_row_free(&g);
    /* its answered key replays, the one a dead process was answering is gone */
    int outcome, status;
    char *loc = NULL, *resp = NULL, made[JOBS_ID_LEN];
    CHECK(jobs_idem_begin(db, "x", "done", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_DONE && status == 202,
          "an answer of version 2: %d", outcome);
    free(loc);
    free(resp);
    CHECK(jobs_idem_begin(db, "x", "pending", "POST /train\n{}", &outcome, &status, &loc, &resp,
                          made) == 0 && outcome == JOBS_IDEM_NEW,
          "a version 2 reservation: %d", outcome);
    jobs_close(db);
    CHECK(sqlite3_open(path, &s) == SQLITE_OK, "reopen");
    sqlite3_stmt *st;
    int version = -1;
    if (sqlite3_prepare_v2(s, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(s);
    CHECK(version == JOBS_SCHEMA_VERSION && version == 4, "version after the migration: %d", version);
}

/* schema 4: a job's name and labels, the filters on them, delete and resume */
static void test_meta(const char *dir)
{
    char err[256];
    struct jobs *db;
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "open: %s", err);
    if (!db) return;
    struct job_row r, g;
    row(&r, "j00000000000000m1", "ann");
    snprintf(r.name, sizeof r.name, "run-a");
    r.labels = "{\"team\":\"vision\",\"n\":\"1\"}";
    CHECK(jobs_insert(db, &r) == 0, "insert with labels");
    row(&r, "j00000000000000m2", "ann");
    r.spec = "{\"init_from\":\"j00000000000000m1-4\"}";
    CHECK(jobs_insert(db, &r) == 0, "insert a user of m1's checkpoint");
    CHECK(jobs_get(db, "j00000000000000m1", &g) == 0 && strcmp(g.name, "run-a") == 0 && g.labels &&
              strstr(g.labels, "vision"),
          "name and labels read back");
    job_row_free(&g);
    /* a job stored ended (an imported checkpoint's) started and ended when it was stored */
    row(&r, "j00000000000000m3", "ann");
    snprintf(r.kind, sizeof r.kind, "import");
    r.state = JOB_SUCCEEDED;
    CHECK(jobs_insert(db, &r) == 0 && jobs_get(db, "j00000000000000m3", &g) == 0 &&
              g.started_at[0] && strcmp(g.started_at, g.created_at) == 0 &&
              strcmp(g.ended_at, g.created_at) == 0,
          "an import's started_at '%s' and ended_at '%s' (created %s)", g.started_at, g.ended_at,
          g.created_at);
    job_row_free(&g);
    struct job_row *rows;
    int n;
    struct jobs_filter f = {.state = -1, .labels = "[[\"team\",\"vision\"]]"};
    CHECK(jobs_list_filter(db, &f, NULL, 10, &rows, &n) == 0 && n == 1 &&
              strcmp(rows[0].id, "j00000000000000m1") == 0, "label filter: %d", n);
    job_rows_free(rows, n);
    f.labels = "[[\"team\",\"vis\"]]";
    CHECK(jobs_list_filter(db, &f, NULL, 10, &rows, &n) == 0 && n == 0, "label value exact: %d", n);
    job_rows_free(rows, n);
    /* several: every one (AND) */
    f.labels = "[[\"team\",\"vision\"],[\"n\",\"1\"]]";
    CHECK(jobs_list_filter(db, &f, NULL, 10, &rows, &n) == 0 && n == 1, "two labels: %d", n);
    job_rows_free(rows, n);
    f.labels = "[[\"team\",\"vision\"],[\"n\",\"2\"]]";
    CHECK(jobs_list_filter(db, &f, NULL, 10, &rows, &n) == 0 && n == 0, "two labels, one off: %d",
          n);
    job_rows_free(rows, n);
    f = (struct jobs_filter){.state = -1, .name = "run-a"};
    CHECK(jobs_list_filter(db, &f, NULL, 10, &rows, &n) == 0 && n == 1, "name filter: %d", n);
    job_rows_free(rows, n);
    enum job_state st;
    char user[JOBS_ID_LEN];
    CHECK(jobs_delete(db, "j00000000000000m1", &st, user) == JOBS_ERR_STATE && st == JOB_QUEUED,
          "delete while queued");
    CHECK(jobs_resume(db, "j00000000000000m1", "{\"state\":\"queued\"}", &st) == JOBS_ERR_STATE,
          "resume while queued");
    CHECK(jobs_set_state(db, "j00000000000000m1", JOB_CANCELED, 0, NULL, "{\"state\":\"canceled\"}") ==
              0 && jobs_set_cancel_requested(db, "j00000000000000m1") == 0, "cancel");
    CHECK(jobs_delete(db, "j00000000000000m1", &st, user) == JOBS_ERR_STATE &&
              strcmp(user, "j00000000000000m2") == 0, "delete while a queued job reads it: '%s'", user);
    CHECK(jobs_resume(db, "j00000000000000m1", "{\"state\":\"queued\"}", &st) == 0 &&
              jobs_get(db, "j00000000000000m1", &g) == 0 && g.state == JOB_QUEUED &&
              !g.cancel_requested && g.ended_at[0] == 0, "resumed: queued, cancel cleared");
    job_row_free(&g);
    CHECK(jobs_set_state(db, "j00000000000000m2", JOB_FAILED, 0, "x", "{\"state\":\"failed\"}") == 0 &&
              jobs_set_state(db, "j00000000000000m1", JOB_FAILED, 0, "x", "{\"state\":\"failed\"}") == 0,
          "both ended");
    struct job_event *ev;
    CHECK(jobs_delete(db, "j00000000000000m1", &st, user) == 0 &&
              jobs_get(db, "j00000000000000m1", &g) == JOBS_ERR_NOT_FOUND &&
              jobs_events_after(db, "j00000000000000m1", 0, 10, &ev, &n) == 0 && n == 0,
          "deleted with its events");
    job_events_free(ev, n);
    CHECK(jobs_delete(db, "j00000000000000m1", &st, user) == JOBS_ERR_NOT_FOUND, "deleted twice");
    jobs_close(db);
}

/* the event log of a job that logs a progress event per step for 5,000 steps (checkpoints
 * every 500, a grid's denoising steps at 2,500): its progress is thinned to at most the cap,
 * every state change, checkpoint and sample stays, ids only go up, and a reader that resumes
 * after any id (one since deleted included) gets exactly the events after it */
static void test_compact(const char *dir)
{
    struct jobs *db;
    char err[300], ev[160];
    CHECK(jobs_open(&db, dir, err, sizeof err) == 0, "open: %s", err);
    jobs_set_progress_max(db, 64);
    struct job_row r;
    row(&r, "j00000000000000c1", "alice");
    CHECK(jobs_insert(db, &r) == 0, "insert");
    CHECK(jobs_set_state(db, r.id, JOB_RUNNING, 2, NULL, "{\"state\":\"running\"}") == 0, "run");
    int64_t seq = 0, prev = 0, mid = 0;
    int up = 1, kept_other = 3; /* queued, running, succeeded */
    for (int s = 1; s <= 5000; s++) {
        snprintf(ev, sizeof ev, "{\"event\":\"step\",\"step\":%d,\"steps\":5000,\"loss\":0.1%s}",
                 s, s % 500 == 0 ? ",\"val_loss\":0.2" : "");
        CHECK(jobs_event_append(db, r.id, "progress", ev, &seq) == 0, "append %d", s);
        up &= seq > prev;
        prev = seq;
        if (s == 2500)
            for (int d = 1; d <= 50; d++) {
                snprintf(ev, sizeof ev, "{\"event\":\"sampling\",\"step\":2500,\"done\":%d,"
                         "\"total\":50}", d);
                CHECK(jobs_event_append(db, r.id, "progress", ev, &seq) == 0, "sampling %d", d);
                up &= seq > prev;
                prev = seq;
            }
        if (s % 500 == 0) {
            snprintf(ev, sizeof ev, "{\"id\":\"%s-%d\",\"step\":%d}", r.id, s, s);
            CHECK(jobs_event_append(db, r.id, "checkpoint", ev, &seq) == 0, "checkpoint");
            up &= seq > prev;
            prev = seq;
            kept_other++;
        }
        if (s == 2500) {
            CHECK(jobs_event_append(db, r.id, "sample", "{\"event\":\"samples\",\"step\":2500}",
                                    &seq) == 0, "sample");
            prev = seq;
            kept_other++;
            mid = seq - 7; /* an id that may have been thinned away */
        }
    }
    CHECK(jobs_set_state(db, r.id, JOB_SUCCEEDED, 0, NULL, "{\"state\":\"succeeded\"}") == 0, "end");
    CHECK(up, "event ids went back");
    int np = 0, nc = 0, ns = 0, nst = 0;
    CHECK(jobs_event_count(db, r.id, "progress", &np) == 0 && np <= 64 + 1 && np >= 16,
          "%d progress events kept of 5,050 (cap 64)", np);
    jobs_event_count(db, r.id, "checkpoint", &nc);
    jobs_event_count(db, r.id, "sample", &ns);
    jobs_event_count(db, r.id, "state", &nst);
    CHECK(nc == 10 && ns == 1 && nst == 3, "checkpoints %d, samples %d, states %d kept of 10, 1, 3",
          nc, ns, nst);
    (void)kept_other;
    /* the whole log in order, read in batches of 5 as a stream does, and again from mid */
    struct job_event *e;
    int n, total = 0, last_step = 0, vals = 0, grid_end = 0;
    int64_t after = 0;
    for (;;) {
        CHECK(jobs_events_after(db, r.id, after, 5, &e, &n) == 0, "read after %lld", (long long)after);
        for (int i = 0; i < n; i++) {
            CHECK(e[i].seq > after, "id %lld after %lld", (long long)e[i].seq, (long long)after);
            after = e[i].seq;
            total++;
            if (strstr(e[i].data, "\"val_loss\"")) vals++;
            if (strstr(e[i].data, "\"done\":50,")) grid_end++;
            const char *st = strstr(e[i].data, "\"event\":\"step\",\"step\":");
            if (st) last_step = atoi(st + strlen("\"event\":\"step\",\"step\":"));
        }
        job_events_free(e, n);
        if (n < 5) break;
    }
    CHECK(total == np + nc + ns + nst, "read %d events, the log holds %d", total, np + nc + ns + nst);
    CHECK(last_step == 5000, "the last step kept is %d", last_step);
    CHECK(vals == 10 && grid_end == 1, "%d of 10 validation steps, %d of 1 grid end kept", vals,
          grid_end);
    CHECK(jobs_events_after(db, r.id, mid, 1000, &e, &n) == 0 && n > 0 && e[0].seq > mid,
          "resume after %lld", (long long)mid);
    int from_mid = n;
    job_events_free(e, n);
    int before_mid = 0;
    CHECK(jobs_events_after(db, r.id, 0, 100000, &e, &n) == 0, "read all");
    for (int i = 0; i < n; i++) before_mid += e[i].seq <= mid;
    job_events_free(e, n);
    CHECK(before_mid + from_mid == total, "resuming after %lld: %d + %d events of %d",
          (long long)mid, before_mid, from_mid, total);
    jobs_close(db);
}

static void test_ids(void)
{
    CHECK(pool_job_id_valid("j0123456789abcdef"), "valid id");
    const char *bad[] = {"", "j", "J0123456789abcdef", "j0123456789abcdeF", "j0123456789abcde",
                         "j0123456789abcdef0", "../ddpmd.db", "j0123456789abcd/f", "j..........."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(!pool_job_id_valid(bad[i]), "invalid id '%s' accepted", bad[i]);
    char jid[JOBS_ID_LEN];
    int64_t step = -1;
    CHECK(pool_checkpoint_id_parse("j0123456789abcdef-300", jid, sizeof jid, &step) == 0 &&
              step == 300 && strcmp(jid, "j0123456789abcdef") == 0,
          "checkpoint id");
    CHECK(pool_checkpoint_id_parse("j0123456789abcdef-0", jid, sizeof jid, &step) == 0 && step == 0,
          "step 0");
    const char *badc[] = {"j0123456789abcdef", "j0123456789abcdef-", "j0123456789abcdef-01",
                          "j0123456789abcdef--1", "j0123456789abcdef-1x", "/etc/passwd",
                          "j0123456789abcdef-1234567890123", "x0123456789abcdef-1"};
    for (size_t i = 0; i < sizeof badc / sizeof badc[0]; i++)
        CHECK(pool_checkpoint_id_parse(badc[i], jid, sizeof jid, &step) != 0,
              "invalid checkpoint id '%s' accepted", badc[i]);
}

static void test_sizes(void)
{
    int64_t b;
    CHECK(spec_parse_size("8GiB", &b) == 0 && b == 8ll << 30, "8GiB");
    CHECK(spec_parse_size("512MiB", &b) == 0 && b == 512ll << 20, "512MiB");
    CHECK(spec_parse_size("100MB", &b) == 0 && b == 100000000, "100MB");
    CHECK(spec_parse_size("4096", &b) == 0 && b == 4096, "bytes");
    CHECK(spec_parse_size("1.5GiB", &b) == 0 && b == 3ll << 29, "1.5GiB");
    CHECK(spec_parse_size("8 GiB", &b) != 0, "a space");
    CHECK(spec_parse_size("-1", &b) != 0, "negative");
    CHECK(spec_parse_size("GiB", &b) != 0, "no number");
    CHECK(spec_parse_size("8XB", &b) != 0, "unknown unit");
    CHECK(spec_parse_size("1e30", &b) != 0, "an exponent");
    CHECK(spec_parse_size("99999999999GiB", &b) != 0, "overflow");
    /* what strtod would take besides plain decimals */
    const char *bad[] = {"inf", "infGiB", "nan", "0x10", "0x1p4", " 8GiB", "\t8", "+8", "1.",
                         ".5GiB", "1e3", "8GiB ", "", "1,5GiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(spec_parse_size(bad[i], &b) != 0, "'%s' taken for a size", bad[i]);
    CHECK(spec_parse_size("0.5KiB", &b) == 0 && b == 512, "0.5KiB");
    /* units in any case, as help and error messages list them */
    CHECK(spec_parse_size("1gb", &b) == 0 && b == 1000000000, "1gb");
    CHECK(spec_parse_size("4gib", &b) == 0 && b == 4ll << 30, "4gib");
    CHECK(spec_parse_size("512Mib", &b) == 0 && b == 512ll << 20, "512Mib");
    CHECK(spec_parse_size("2g", &b) == 0 && b == 2ll << 30, "2g");
    CHECK(spec_parse_size("3b", &b) == 0 && b == 3, "3b");
    CHECK(spec_parse_size("1gbb", &b) != 0 && spec_parse_size("1xib", &b) != 0, "bad units");
}

static void test_tokens(const char *dir)
{
    char path[1200], err[300];
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "# comment\n\nalice aaaaaaaaaaaaaaaa\nroot bbbbbbbbbbbbbbbb admin  # the admin\n");
    fclose(f);
    chmod(path, 0600); /* a token file must be private (api_tokens_load) */
    struct api_token *t;
    int n;
    CHECK(api_tokens_load(path, &t, &n, err, sizeof err) == 0 && n == 2, "load: %s", err);
    if (n == 2)
        CHECK(strcmp(t[0].name, "alice") == 0 && !t[0].admin && strcmp(t[1].name, "root") == 0 &&
                  t[1].admin && strcmp(t[1].secret, "bbbbbbbbbbbbbbbb") == 0,
              "parsed");
    free(t);
    const char *bad[] = {"alice short\n", "alice aaaaaaaaaaaaaaaa superuser\n", "alice\n",
                         "# nothing\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        chmod(path, 0600); /* refused for its content, not its mode */
        CHECK(api_tokens_load(path, &t, &n, err, sizeof err) != 0 && t == NULL && n == 0,
              "bad token file accepted: %s", bad[i]);
    }
}

/* DELETE /jobs/{id} holds the job's folder (export_hold_dir): no diffusers export build starts
 * under it until released, so no tar writer races the removal */
static void test_export_hold(const char *dir)
{
    char job[256], ckpt[320], err[512];
    snprintf(job, sizeof job, "%s/jobs/j00000000000000e1/", dir);
    snprintf(ckpt, sizeof ckpt, "%sout/checkpoints/step-00000003.safetensors", job);
    int fd = -1;
    long long size = 0;
    CHECK(export_hold_dir(job) == 0, "hold an idle folder");
    CHECK(export_cache_open(ckpt, "ann", &fd, &size, err, sizeof err) == EXPORT_BUSY && fd < 0,
          "an export under a held folder started: %s", err);
    export_release_dir(job);
    /* released: its build starts (and fails here: there is no checkpoint) */
    CHECK(export_cache_open(ckpt, "ann", &fd, &size, err, sizeof err) == EXPORT_FAILED,
          "after the release: %s", err);
}

int main(void)
{
    char dir[] = "/tmp/ddpmd-test-jobs-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_store(dir);
    test_export_hold(dir);
    char cdir[] = "/tmp/ddpmd-test-jobs-log-XXXXXX";
    if (mkdtemp(cdir)) {
        test_compact(cdir);
        char rm[200];
        snprintf(rm, sizeof rm, "rm -rf %s", cdir);
        if (system(rm)) fprintf(stderr, "could not remove %s\n", cdir);
    }
    char old[] = "/tmp/ddpmd-test-jobs-v2-XXXXXX";
    if (mkdtemp(old)) {
        test_migrate(old);
        char rm[200];
        snprintf(rm, sizeof rm, "rm -rf %s", old);
        if (system(rm)) fprintf(stderr, "could not remove %s\n", old);
    }
    char meta[] = "/tmp/ddpmd-test-jobs-meta-XXXXXX";
    if (mkdtemp(meta)) {
        test_meta(meta);
        char rm[200];
        snprintf(rm, sizeof rm, "rm -rf %s", meta);
        if (system(rm)) fprintf(stderr, "could not remove %s\n", meta);
    }
    test_ids();
    test_sizes();
    test_tokens(dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish("test_jobs");
}
