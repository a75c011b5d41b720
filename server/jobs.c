/* jobs.c - the SQLite job store (see jobs.h): tables jobs and events, schema version in
 * PRAGMA user_version and in table meta, WAL journal. Every change goes through one writer
 * connection behind one mutex (each call atomic); reads go through the calling thread's own
 * connection and take no lock (many GET /jobs/{id} at once). Statements are prepared once.
 */
#define _DEFAULT_SOURCE
#include "jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* bytes kept in DIR/ddpmd.db-reserve so that a job's end can be recorded on a full disk: when a
 * change to an ended state gets SQLITE_FULL the reserve is deleted and the change tried again;
 * the next jobs_insert makes it again, or refuses the job while it cannot */
#define JOBS_RESERVE_BYTES (256 * 1024)

#define ROW_COLS                                                                                  \
    "seq, id, owner, kind, state, spec, device, reserved_bytes, plan, threads, step, steps, "    \
    "loss, img_per_s, error, cancel_requested, starts, created_at, started_at, ended_at, plans, " \
    "name, labels"

/* every statement of the store, prepared once (stmt) and kept: a GET /jobs/{id} is one bound
 * step of a ready statement, not a parse of its SQL */
enum jobs_stmt {
    STMT_EVENT_APPEND,
    STMT_INSERT,
    STMT_GET,
    STMT_STATE,
    STMT_LIST,
    STMT_COUNT,
    STMT_EVENT_COUNT,
    STMT_COUNT_OWNER,
    STMT_SET_STATE,
    STMT_CANCEL,
    STMT_PROGRESS,
    STMT_SET_PLAN,
    STMT_EVENTS_AFTER,
    STMT_IDEM_GET,
    STMT_IDEM_PUT,
    STMT_IDEM_FINISH,
    STMT_IDEM_ABANDON,
    STMT_IDEM_LINK,
    STMT_PROGRESS_THIN,
    STMT_DELETE_USER,
    STMT_DELETE_EVENTS,
    STMT_DELETE_IDEM,
    STMT_DELETE_JOB,
    STMT_RESUME,
    STMT_COUNT_
};

static const char *const stmt_sql[STMT_COUNT_] = {
    [STMT_EVENT_APPEND] = "INSERT INTO events(job_id, seq, type, data, at) VALUES(?1, "
        "(SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?1), "
        "?2, ?3, ?4) RETURNING seq",
    /* a job stored already ended (an imported checkpoint's) started and ended when stored */
    [STMT_INSERT] = "INSERT INTO jobs(id, owner, kind, state, spec, device, reserved_bytes, "
        "plan, steps, created_at, plans, name, labels, started_at, ended_at) VALUES(?1, ?2, ?3, "
        "?13, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
        "CASE WHEN ?13 IN ('succeeded', 'failed', 'canceled') THEN ?9 END, "
        "CASE WHEN ?13 IN ('succeeded', 'failed', 'canceled') THEN ?9 END)",
    [STMT_GET] = "SELECT " ROW_COLS " FROM jobs WHERE id = ?",
    [STMT_STATE] = "SELECT state FROM jobs WHERE id = ?1",
    [STMT_LIST] = "SELECT " ROW_COLS " FROM jobs WHERE (?1 IS NULL OR owner = ?1) AND "
        "(?2 IS NULL OR state = ?2) AND "
        "(?3 IS NULL OR seq > (SELECT seq FROM jobs WHERE id = ?3)) AND "
        "(?5 IS NULL OR kind = ?5) AND "
        "(?6 IS NULL OR name = ?6) AND "
        "(?7 IS NULL OR NOT EXISTS(SELECT 1 FROM json_each(?7) AS w WHERE NOT EXISTS("
        "SELECT 1 FROM json_each(jobs.labels) AS l WHERE "
        "l.key = json_extract(w.value, '$[0]') AND l.type = 'text' AND "
        "l.value = json_extract(w.value, '$[1]')))) "
        "ORDER BY seq LIMIT ?4",
    [STMT_COUNT] = "SELECT COUNT(*) FROM jobs WHERE ?1 IS NULL OR state = ?1",
    [STMT_EVENT_COUNT] = "SELECT COUNT(*) FROM events WHERE job_id = ?1 AND type = ?2",
    [STMT_COUNT_OWNER] = "SELECT COUNT(*) FROM jobs WHERE owner = ?1 AND "
        "state IN ('queued', 'running')",
    [STMT_SET_STATE] = "UPDATE jobs SET state = ?2,"
        " threads = CASE WHEN ?3 > 0 THEN ?3 ELSE threads END,"
        " error = CASE WHEN ?4 IS NOT NULL THEN ?4 WHEN ?2 = 'running' THEN "
        "NULL ELSE error END,"
        " started_at = CASE WHEN ?2 = 'running' THEN ?5 ELSE started_at END,"
        " starts = starts + (?2 = 'running'),"
        " ended_at = CASE WHEN ?2 IN ('succeeded', 'failed', 'canceled') THEN "
        "?5 ELSE NULL END"
        " WHERE id = ?1",
    [STMT_CANCEL] = "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1",
    [STMT_PROGRESS] = "UPDATE jobs SET step = ?2, steps = ?3, loss = ?4, img_per_s = ?5 WHERE id = ?1",
    [STMT_SET_PLAN] = "UPDATE jobs SET device = COALESCE(?2, device), reserved_bytes "
        "= ?3, plan = ?4, plans = COALESCE(?5, plans) WHERE id = ?1",
    [STMT_EVENTS_AFTER] = "SELECT seq, type, data FROM events WHERE job_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ?",
    [STMT_IDEM_GET] = "SELECT request, status, location, response, job_id FROM idempotency "
        "WHERE owner = ?1 AND key = ?2",
    [STMT_IDEM_PUT] = "INSERT INTO idempotency(owner, key, request, created_at) "
        "VALUES(?1, ?2, ?3, ?4)",
    [STMT_IDEM_FINISH] = "UPDATE idempotency SET status = ?3, location = ?4, "
        "response = ?5 WHERE owner = ?1 AND key = ?2",
    [STMT_IDEM_ABANDON] = "DELETE FROM idempotency WHERE owner = ?1 AND key = ?2 AND "
        "status = 0 AND job_id IS NULL",
    [STMT_IDEM_LINK] = "UPDATE idempotency SET job_id = ?3 WHERE owner = ?1 AND key = ?2",
    /* every second progress event of the job goes, except those kept: the newest event of the
     * job (seq = MAX(seq) + 1 stays monotonic), the newest of each kind, a phase's end (done =
     * total) and a step with a validation loss */
    [STMT_PROGRESS_THIN] = "DELETE FROM events WHERE job_id = ?1 AND seq IN ("
        "SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS rn FROM events "
        "WHERE job_id = ?1 AND type = 'progress' "
        "AND json_extract(data, '$.val_loss') IS NULL "
        "AND coalesce(json_extract(data, '$.done') = json_extract(data, '$.total'), 0) = 0 "
        "AND seq NOT IN (SELECT MAX(seq) FROM events WHERE job_id = ?1 AND type = 'progress' "
        "GROUP BY json_extract(data, '$.event'))) "
        "WHERE rn % 2 = 0 AND seq < (SELECT MAX(seq) FROM events WHERE job_id = ?1))",
    /* a live job whose spec names one of ?1's checkpoints: "?1-STEP" in init_from or a sample's
     * checkpoint (job ids are fixed-length hex, so "?1-" is no other id's prefix) */
    [STMT_DELETE_USER] = "SELECT id FROM jobs WHERE state IN ('queued', 'running') AND "
        "instr(spec, '\"' || ?1 || '-') > 0 LIMIT 1",
    [STMT_DELETE_EVENTS] = "DELETE FROM events WHERE job_id = ?1",
    [STMT_DELETE_IDEM] = "DELETE FROM idempotency WHERE job_id = ?1",
    [STMT_DELETE_JOB] = "DELETE FROM jobs WHERE id = ?1",
    [STMT_RESUME] = "UPDATE jobs SET state = 'queued', cancel_requested = 0, error = NULL, "
        "ended_at = NULL WHERE id = ?1 AND state IN ('canceled', 'failed')",
};

/* a connection and its prepared statements */
struct conn {
    sqlite3 *db;
    sqlite3_stmt *st[STMT_COUNT_];
    struct conn *next;           /* the store's read connections, a list */
};

struct jobs {
    struct conn w;               /* the one writer (every change), under mu */
    pthread_mutex_t mu;
    char path[1200];             /* DIR/ddpmd.db */
    pthread_key_t reader;        /* the calling thread's read connection (rd) */
    pthread_mutex_t rmu;         /* readers */
    struct conn *readers;
    char reserve[1200];          /* DIR/ddpmd.db-reserve */
    int have_reserve;            /* under mu */
    int progress_max;            /* a job's progress events before they are thinned */
    jobs_observer_fn observer;   /* set before any other thread uses the store */
    void *observer_ctx;
};

void jobs_set_observer(struct jobs *db, jobs_observer_fn fn, void *ctx)
{
    db->observer = fn;
    db->observer_ctx = ctx;
}

/* an event is committed: tell the observer (outside the store's lock) */
static int observed(struct jobs *db, int rc, const char *id, const char *type, const char *json)
{
    if (rc == JOBS_OK && db->observer) db->observer(db->observer_ctx, id, type, json);
    return rc;
}

/* the message of this thread's last failed store call: thread-local, so a caller reads its own
 * call's cause even while other threads use the store */
static _Thread_local char last_err[256];

const char *jobs_errmsg(void)
{
    return last_err[0] ? last_err : "no store error";
}

/* records SQLite's current error for jobs_errmsg (kept as it was when SQLite reports none, e.g.
 * after the failed statement was finalized) and maps it to a status: SQLITE_FULL (the disk is
 * full) is JOBS_ERR_FULL, every other failure JOBS_ERR_DB */
static int db_fail(const struct conn *c)
{
    int code = sqlite3_extended_errcode(c->db), prim = code & 0xff;
    if (prim != SQLITE_OK && prim != SQLITE_ROW && prim != SQLITE_DONE)
        snprintf(last_err, sizeof last_err, "%s (%s, code %d)", sqlite3_errmsg(c->db),
                 prim == SQLITE_FULL    ? "SQLITE_FULL"
                 : prim == SQLITE_IOERR ? "SQLITE_IOERR"
                                        : "SQLite",
                 code);
    return prim == SQLITE_FULL ? JOBS_ERR_FULL : JOBS_ERR_DB;
}

/* makes the reserve file (lock held or not yet shared); -1 with errno when the disk has no room */
static int reserve_make(struct jobs *j)
{
    int fd = open(j->reserve, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int e = posix_fallocate(fd, 0, JOBS_RESERVE_BYTES);
    close(fd);
    if (e) {
        unlink(j->reserve);
        errno = e;
        return -1;
    }
    j->have_reserve = 1;
    return 0;
}

/* statement k of connection c, prepared on first use (c's lock held, or c the caller's
 * reader); NULL with SQLite's error for db_fail */
static sqlite3_stmt *stmt(struct conn *c, enum jobs_stmt k)
{
    if (!c->st[k] && sqlite3_prepare_v3(c->db, stmt_sql[k], -1, SQLITE_PREPARE_PERSISTENT,
                                        &c->st[k], NULL) != SQLITE_OK)
        return NULL;
    return c->st[k];
}

static void conn_close(struct conn *c)
{
    for (int k = 0; k < STMT_COUNT_; k++) sqlite3_finalize(c->st[k]);
    sqlite3_close(c->db);
}

/* The calling thread's read connection, opened on its first read: reads take no lock, so the
 * HTTP threads never wait for each other nor for the writer (WAL: a reader sees the last
 * committed state, a writer never waits for readers). NULL with jobs_errmsg's reason. */
static struct conn *rd(struct jobs *db)
{
    struct conn *c = pthread_getspecific(db->reader);
    if (c) return c;
    c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(last_err, sizeof last_err, "out of memory for a read connection");
        return NULL;
    }
    int rc = sqlite3_open_v2(db->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(last_err, sizeof last_err, "cannot open a read connection: %s",
                 c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
        sqlite3_close(c->db);
        free(c);
        return NULL;
    }
    sqlite3_busy_timeout(c->db, 5000);
    pthread_setspecific(db->reader, c);
    pthread_mutex_lock(&db->rmu);
    c->next = db->readers;
    db->readers = c;
    pthread_mutex_unlock(&db->rmu);
    return c;
}

/* a used statement back to its unbound start (lock held) */
static void stmt_done(sqlite3_stmt *st)
{
    if (!st) return;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

static const char *state_names[JOB_STATE_COUNT] = {"queued", "running", "succeeded", "failed",
                                                   "canceled"};

const char *job_state_name(enum job_state s)
{
    return s >= 0 && s < JOB_STATE_COUNT ? state_names[s] : "unknown";
}

int job_state_parse(const char *name)
{
    for (int i = 0; i < JOB_STATE_COUNT; i++)
        if (strcmp(name, state_names[i]) == 0) return i;
    return -1;
}

void jobs_now(char *buf, size_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[24];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    /* milliseconds in [0, 999]: the int cast tells the compiler so (-O3 format-truncation) */
    snprintf(buf, n, "%s.%03dZ", base, (int)(ts.tv_nsec / 1000000) % 1000);
}

static const char *schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS jobs("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " id TEXT NOT NULL UNIQUE,"
    " owner TEXT NOT NULL,"
    " kind TEXT NOT NULL,"
    " state TEXT NOT NULL,"
    " spec TEXT NOT NULL,"
    " device TEXT NOT NULL,"
    " reserved_bytes INTEGER NOT NULL,"
    " plan TEXT NOT NULL,"
    " plans TEXT,"
    " threads INTEGER NOT NULL DEFAULT 0,"
    " step INTEGER NOT NULL DEFAULT 0,"
    " steps INTEGER NOT NULL DEFAULT 0,"
    " loss REAL,"
    " img_per_s REAL,"
    " error TEXT,"
    " cancel_requested INTEGER NOT NULL DEFAULT 0,"
    " starts INTEGER NOT NULL DEFAULT 0,"
    " created_at TEXT NOT NULL,"
    " started_at TEXT,"
    " ended_at TEXT,"
    /* version 4: the owner's name and labels (a JSON object of strings) */
    " name TEXT,"
    " labels TEXT);"
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);"
    "CREATE TABLE IF NOT EXISTS events("
    " job_id TEXT NOT NULL,"
    " seq INTEGER NOT NULL,"
    " type TEXT NOT NULL,"
    " data TEXT NOT NULL,"
    " at TEXT NOT NULL,"
    " PRIMARY KEY(job_id, seq)) WITHOUT ROWID;"
    /* version 2: Idempotency-Key answers; status 0 = the first request is still being answered */
    "CREATE TABLE IF NOT EXISTS idempotency("
    " owner TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " request TEXT NOT NULL,"
    " status INTEGER NOT NULL DEFAULT 0,"
    " location TEXT,"
    " response TEXT,"
    " created_at TEXT NOT NULL,"
    /* version 3: the job the request made, set in the job's own insert (jobs_insert) */
    " job_id TEXT,"
    " PRIMARY KEY(owner, key)) WITHOUT ROWID;"
    /* no request survives the process that was answering it, unless it made its job: a retry
     * gets that job (JOBS_IDEM_MADE), never a second one */
    "DELETE FROM idempotency WHERE status = 0 AND job_id IS NULL;";

int jobs_open(struct jobs **out, const char *dir, char *err, size_t errlen)
{
    *out = NULL;
    struct jobs *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return JOBS_ERR_NOMEM;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_mutex_init(&j->rmu, NULL);
    j->progress_max = JOBS_PROGRESS_MAX;
    if (pthread_key_create(&j->reader, NULL)) {
        snprintf(err, errlen, "no thread key for the store's read connections");
        pthread_mutex_destroy(&j->mu);
        pthread_mutex_destroy(&j->rmu);
        free(j);
        return JOBS_ERR_DB;
    }
    char *path = j->path;
    snprintf(j->path, sizeof j->path, "%s/ddpmd.db", dir);
    int rc = sqlite3_open_v2(path, &j->w.db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                             NULL);
    char *msg = NULL;
    int version = -1;
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", path,
                 j->w.db ? sqlite3_errmsg(j->w.db) : sqlite3_errstr(rc));
        goto fail;
    }
    sqlite3_busy_timeout(j->w.db, 5000);
    /* WAL: readers never block the writer; NORMAL sync is durable across a process crash */
    if (sqlite3_exec(j->w.db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
                     &msg) != SQLITE_OK)
        goto sqlfail;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(j->w.db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        goto sqlfail;
    if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (version > JOBS_SCHEMA_VERSION) {
        snprintf(err, errlen, "%s has schema version %d; this ddpmd knows versions up to %d", path,
                 version, JOBS_SCHEMA_VERSION);
        goto fail;
    }
    /* version 0 = a new file; 1 -> 2 only adds the idempotency table (CREATE IF NOT EXISTS);
     * 2 -> 3 adds jobs.plans (NULL for the jobs stored before) and idempotency.job_id, before
     * the schema's statements that read them; 3 -> 4 adds jobs.name and jobs.labels (NULL) */
    if (sqlite3_exec(j->w.db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK ||
        (version > 0 && version < 3 &&
         sqlite3_exec(j->w.db, "ALTER TABLE jobs ADD COLUMN plans TEXT", NULL, NULL, &msg) !=
             SQLITE_OK) ||
        (version == 2 &&
         sqlite3_exec(j->w.db, "ALTER TABLE idempotency ADD COLUMN job_id TEXT", NULL, NULL,
                      &msg) != SQLITE_OK) ||
        (version > 0 && version < 4 &&
         sqlite3_exec(j->w.db, "ALTER TABLE jobs ADD COLUMN name TEXT;"
                               "ALTER TABLE jobs ADD COLUMN labels TEXT", NULL, NULL, &msg) !=
             SQLITE_OK) ||
        sqlite3_exec(j->w.db, schema, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(j->w.db,
                     "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '4');"
                     "PRAGMA user_version = 4; COMMIT;",
                     NULL, NULL, &msg) != SQLITE_OK)
        goto sqlfail;
    snprintf(j->reserve, sizeof j->reserve, "%s/ddpmd.db-reserve", dir);
    reserve_make(j); /* without room now the next jobs_insert tries again */
    *out = j;
    return JOBS_OK;
sqlfail:
    snprintf(err, errlen, "%s: %s", path, msg ? msg : sqlite3_errmsg(j->w.db));
    sqlite3_free(msg);
fail:
    sqlite3_close(j->w.db);
    pthread_key_delete(j->reader);
    pthread_mutex_destroy(&j->mu);
    pthread_mutex_destroy(&j->rmu);
    free(j);
    return JOBS_ERR_DB;
}

void jobs_close(struct jobs *db)
{
    if (!db) return;
    for (struct conn *c = db->readers, *next; c; c = next) {
        next = c->next;
        conn_close(c);
        free(c);
    }
    conn_close(&db->w);
    pthread_key_delete(db->reader);
    pthread_mutex_destroy(&db->mu);
    pthread_mutex_destroy(&db->rmu);
    free(db);
}

static char *dup_col(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static void copy_col(char *dst, size_t n, sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}

static int read_row(sqlite3_stmt *st, struct job_row *r)
{
    memset(r, 0, sizeof *r);
    r->seq = sqlite3_column_int64(st, 0);
    copy_col(r->id, sizeof r->id, st, 1);
    copy_col(r->owner, sizeof r->owner, st, 2);
    copy_col(r->kind, sizeof r->kind, st, 3);
    const unsigned char *s = sqlite3_column_text(st, 4);
    int k = s ? job_state_parse((const char *)s) : -1;
    r->state = k < 0 ? JOB_FAILED : (enum job_state)k;
    r->spec = dup_col(st, 5);
    copy_col(r->device, sizeof r->device, st, 6);
    r->reserved_bytes = sqlite3_column_int64(st, 7);
    r->plan = dup_col(st, 8);
    r->threads = sqlite3_column_int(st, 9);
    r->step = sqlite3_column_int64(st, 10);
    r->steps = sqlite3_column_int64(st, 11);
    r->loss = sqlite3_column_type(st, 12) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 12);
    r->img_per_s = sqlite3_column_type(st, 13) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 13);
    r->error = dup_col(st, 14);
    r->cancel_requested = sqlite3_column_int(st, 15);
    r->starts = sqlite3_column_int(st, 16);
    copy_col(r->created_at, sizeof r->created_at, st, 17);
    copy_col(r->started_at, sizeof r->started_at, st, 18);
    copy_col(r->ended_at, sizeof r->ended_at, st, 19);
    r->plans = dup_col(st, 20);
    copy_col(r->name, sizeof r->name, st, 21);
    r->labels = dup_col(st, 22);
    if (!r->spec || !r->plan || (!r->plans && sqlite3_column_type(st, 20) != SQLITE_NULL) ||
        (!r->labels && sqlite3_column_type(st, 22) != SQLITE_NULL)) {
        job_row_free(r);
        return JOBS_ERR_NOMEM;
    }
    return JOBS_OK;
}

void job_row_free(struct job_row *r)
{
    if (!r) return;
    free(r->spec);
    free(r->plan);
    free(r->error);
    free(r->plans);
    free(r->labels);
    r->spec = r->plan = r->error = r->plans = r->labels = NULL;
}

void job_rows_free(struct job_row *rows, int n)
{
    for (int i = 0; i < n; i++) job_row_free(&rows[i]);
    free(rows);
}

/* appends an event inside the caller's transaction (lock held) */
static int event_append_locked(struct jobs *db, const char *id, const char *type,
                               const char *json, int64_t *seq)
{
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    char now[32];
    jobs_now(now, sizeof now);
    if (!(st = stmt(&db->w, STMT_EVENT_APPEND)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, now, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) goto out;
    if (seq) *seq = sqlite3_column_int64(st, 0);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    rc = JOBS_OK;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    return rc;
}

static int begin(struct jobs *db)
{
    pthread_mutex_lock(&db->mu);
    if (sqlite3_exec(db->w.db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        int rc = db_fail(&db->w);
        pthread_mutex_unlock(&db->mu);
        return rc;
    }
    return JOBS_OK;
}

static int end(struct jobs *db, int rc)
{
    if (rc == JOBS_OK && sqlite3_exec(db->w.db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        rc = db_fail(&db->w);
    if (rc != JOBS_OK) sqlite3_exec(db->w.db, "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int jobs_insert(struct jobs *db, const struct job_row *r)
{
    int brc = begin(db);
    if (brc) return brc;
    /* no new job while the reserve for recording job ends cannot be kept */
    if (!db->have_reserve && reserve_make(db)) {
        snprintf(last_err, sizeof last_err, "the disk is full: the job store cannot keep its %d "
                 "bytes for recording job ends (%s)", JOBS_RESERVE_BYTES, strerror(errno));
        return end(db, JOBS_ERR_FULL);
    }
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    char now[32], first[48] = "";
    jobs_now(now, sizeof now);
    if (!(st = stmt(&db->w, STMT_INSERT)))
        goto out;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->spec, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->device, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, r->reserved_bytes);
    sqlite3_bind_text(st, 7, r->plan, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, r->steps);
    sqlite3_bind_text(st, 9, now, -1, SQLITE_TRANSIENT);
    if (r->plans) sqlite3_bind_text(st, 10, r->plans, -1, SQLITE_STATIC);
    if (r->name[0]) sqlite3_bind_text(st, 11, r->name, -1, SQLITE_STATIC);
    if (r->labels) sqlite3_bind_text(st, 12, r->labels, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 13, job_state_name(r->state), -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    if (r->idem_key && r->idem_key[0]) {
        /* the request's key names its job in the same transaction: once the job exists a
         * retry finds it, whether or not the answer could be stored (jobs_idem_finish) */
        stmt_done(st);
        if (!(st = stmt(&db->w, STMT_IDEM_LINK))) goto out;
        sqlite3_bind_text(st, 1, r->owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, r->idem_key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, r->id, -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE) goto out;
    }
    snprintf(first, sizeof first, "{\"state\":\"%s\"}", job_state_name(r->state));
    rc = event_append_locked(db, r->id, "state", first, NULL);
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    return observed(db, end(db, rc), r->id, "state", first);
}

int jobs_get(struct jobs *db, const char *id, struct job_row *out)
{
    memset(out, 0, sizeof *out);
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(c, STMT_GET)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW)
        rc = read_row(st, out);
    else if (s == SQLITE_DONE)
        rc = JOBS_ERR_NOT_FOUND;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    return rc;
}

int jobs_state(struct jobs *db, const char *id, enum job_state *state)
{
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = stmt(c, STMT_STATE);
    int rc = JOBS_ERR_DB;
    if (!st) goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        int k = t ? job_state_parse((const char *)t) : -1;
        *state = k < 0 ? JOB_FAILED : (enum job_state)k; /* as read_row reads it */
        rc = JOBS_OK;
    } else if (s == SQLITE_DONE) {
        rc = JOBS_ERR_NOT_FOUND;
    }
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    return rc;
}

int jobs_list(struct jobs *db, const char *owner, int state, const char *after, int limit,
              struct job_row **rows, int *n)
{
    return jobs_list_kind(db, owner, NULL, state, after, limit, rows, n);
}

int jobs_list_kind(struct jobs *db, const char *owner, const char *kind, int state,
                   const char *after, int limit, struct job_row **rows, int *n)
{
    struct jobs_filter f = {.owner = owner, .kind = kind, .state = state};
    return jobs_list_filter(db, &f, after, limit, rows, n);
}

int jobs_list_filter(struct jobs *db, const struct jobs_filter *f, const char *after, int limit,
                     struct job_row **rows, int *n)
{
    const char *owner = f->owner, *kind = f->kind;
    int state = f->state;
    *rows = NULL;
    *n = 0;
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB, cap = 0;
    if (!(st = stmt(c, STMT_LIST)))
        goto out;
    if (owner) sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    if (state >= 0) sqlite3_bind_text(st, 2, job_state_name((enum job_state)state), -1, SQLITE_STATIC);
    if (after) sqlite3_bind_text(st, 3, after, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, limit);
    if (kind) sqlite3_bind_text(st, 5, kind, -1, SQLITE_STATIC);
    if (f->name) sqlite3_bind_text(st, 6, f->name, -1, SQLITE_STATIC);
    if (f->labels) sqlite3_bind_text(st, 7, f->labels, -1, SQLITE_STATIC);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            struct job_row *r = realloc(*rows, (size_t)cap * sizeof *r);
            if (!r) {
                rc = JOBS_ERR_NOMEM;
                goto out;
            }
            *rows = r;
        }
        if ((rc = read_row(st, &(*rows)[*n])) != JOBS_OK) goto out;
        (*n)++;
    }
    rc = s == SQLITE_DONE ? JOBS_OK : JOBS_ERR_DB;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    if (rc != JOBS_OK) {
        job_rows_free(*rows, *n);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

int jobs_count(struct jobs *db, int state, int *n)
{
    *n = 0;
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(c, STMT_COUNT)))
        goto out;
    if (state >= 0) sqlite3_bind_text(st, 1, job_state_name((enum job_state)state), -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *n = sqlite3_column_int(st, 0);
        rc = JOBS_OK;
    }
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    return rc;
}

int jobs_event_count(struct jobs *db, const char *id, const char *type, int *n)
{
    *n = 0;
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(c, STMT_EVENT_COUNT)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, type, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *n = sqlite3_column_int(st, 0);
        rc = JOBS_OK;
    }
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    return rc;
}

int jobs_count_owner(struct jobs *db, const char *owner, int *n)
{
    *n = 0;
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(c, STMT_COUNT_OWNER)))
        goto out;
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *n = sqlite3_column_int(st, 0);
        rc = JOBS_OK;
    }
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    return rc;
}

static int set_state_once(struct jobs *db, const char *id, enum job_state state, int threads,
                          const char *error, const char *event_json)
{
    int brc = begin(db);
    if (brc) return brc;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    char now[32];
    jobs_now(now, sizeof now);
    /* running: a new start (started_at, starts + 1, a fresh error); ended: ended_at */
    if (!(st = stmt(&db->w, STMT_SET_STATE)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job_state_name(state), -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, threads);
    if (error) sqlite3_bind_text(st, 4, error, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, now, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    if (sqlite3_changes(db->w.db) != 1) {
        rc = JOBS_ERR_NOT_FOUND;
        goto out;
    }
    rc = event_append_locked(db, id, "state", event_json, NULL);
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    return observed(db, end(db, rc), id, "state", event_json);
}

int jobs_set_state(struct jobs *db, const char *id, enum job_state state, int threads,
                   const char *error, const char *event_json)
{
    int rc = set_state_once(db, id, state, threads, error, event_json);
    if (rc != JOBS_ERR_FULL || !job_state_ended(state)) return rc;
    /* a job's end is recorded even on a full disk: the reserve's bytes are given to SQLite */
    pthread_mutex_lock(&db->mu);
    int had = db->have_reserve;
    if (had) unlink(db->reserve);
    db->have_reserve = 0;
    pthread_mutex_unlock(&db->mu);
    return had ? set_state_once(db, id, state, threads, error, event_json) : rc;
}

static int exec_one(struct jobs *db, enum jobs_stmt k, const char *id, int64_t a, int64_t b,
                    double c, double d)
{
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(&db->w, k))) goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int np = sqlite3_bind_parameter_count(st);
    if (np >= 2) sqlite3_bind_int64(st, 2, a);
    if (np >= 3) sqlite3_bind_int64(st, 3, b);
    if (np >= 4) isnan(c) ? sqlite3_bind_null(st, 4) : sqlite3_bind_double(st, 4, c);
    if (np >= 5) isnan(d) ? sqlite3_bind_null(st, 5) : sqlite3_bind_double(st, 5, d);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    rc = sqlite3_changes(db->w.db) == 1 ? JOBS_OK : JOBS_ERR_NOT_FOUND;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int jobs_set_cancel_requested(struct jobs *db, const char *id)
{
    return exec_one(db, STMT_CANCEL, id, 0, 0, 0, 0);
}

int jobs_set_plan(struct jobs *db, const char *id, const char *device, int64_t reserved,
                  const char *plan, const char *plans)
{
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(&db->w, STMT_SET_PLAN)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (device) sqlite3_bind_text(st, 2, device, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, reserved);
    sqlite3_bind_text(st, 4, plan, -1, SQLITE_STATIC);
    if (plans) sqlite3_bind_text(st, 5, plans, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    rc = sqlite3_changes(db->w.db) == 1 ? JOBS_OK : JOBS_ERR_NOT_FOUND;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int jobs_set_progress(struct jobs *db, const char *id, int64_t step, int64_t steps, double loss,
                      double img_per_s)
{
    return exec_one(db, STMT_PROGRESS, id, step, steps, loss, img_per_s);
}

/* a job's progress events past JOBS_PROGRESS_MAX are thinned: every second one goes (see
 * STMT_PROGRESS_THIN), so a long job keeps a few hundred spread over its life (lock held) */
static int progress_compact_locked(struct jobs *db, const char *id)
{
    sqlite3_stmt *st = stmt(&db->w, STMT_EVENT_COUNT);
    int rc = JOBS_ERR_DB, n = 0;
    if (!st) goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, "progress", -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_ROW) goto out;
    n = sqlite3_column_int(st, 0);
    stmt_done(st);
    st = NULL;
    if (n <= db->progress_max) return JOBS_OK;
    if (!(st = stmt(&db->w, STMT_PROGRESS_THIN))) goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    rc = JOBS_OK;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    return rc;
}

int jobs_event_append(struct jobs *db, const char *id, const char *type, const char *json,
                      int64_t *seq)
{
    int brc = begin(db);
    if (brc) return brc;
    int rc = event_append_locked(db, id, type, json, seq);
    if (rc == JOBS_OK && strcmp(type, "progress") == 0) rc = progress_compact_locked(db, id);
    return observed(db, end(db, rc), id, type, json);
}

void jobs_set_progress_max(struct jobs *db, int n)
{
    db->progress_max = n > 2 ? n : 2;
}

int jobs_events_after(struct jobs *db, const char *id, int64_t after, int limit,
                      struct job_event **ev, int *n)
{
    *ev = NULL;
    *n = 0;
    struct conn *c = rd(db);
    if (!c) return JOBS_ERR_DB;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB, cap = 0;
    if (!(st = stmt(c, STMT_EVENTS_AFTER)))
        goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int(st, 3, limit);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            struct job_event *e = realloc(*ev, (size_t)cap * sizeof *e);
            if (!e) {
                rc = JOBS_ERR_NOMEM;
                goto out;
            }
            *ev = e;
        }
        struct job_event *e = &(*ev)[*n];
        e->seq = sqlite3_column_int64(st, 0);
        copy_col(e->type, sizeof e->type, st, 1);
        e->data = dup_col(st, 2);
        if (!e->data) {
            rc = JOBS_ERR_NOMEM;
            goto out;
        }
        (*n)++;
    }
    rc = s == SQLITE_DONE ? JOBS_OK : JOBS_ERR_DB;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(c);
    stmt_done(st);
    if (rc != JOBS_OK) {
        job_events_free(*ev, *n);
        *ev = NULL;
        *n = 0;
    }
    return rc;
}

void job_events_free(struct job_event *ev, int n)
{
    for (int i = 0; i < n; i++) free(ev[i].data);
    free(ev);
}

int jobs_idem_begin(struct jobs *db, const char *owner, const char *key, const char *request,
                    int *outcome, int *status, char **location, char **response, char *job_id)
{
    *outcome = JOBS_IDEM_NEW;
    *status = 0;
    *location = *response = NULL;
    job_id[0] = 0;
    int brc = begin(db);
    if (brc) return brc;
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(&db->w, STMT_IDEM_GET)))
        goto out;
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        const char *req = (const char *)sqlite3_column_text(st, 0);
        *status = sqlite3_column_int(st, 1);
        if (!req || strcmp(req, request) != 0) {
            *outcome = JOBS_IDEM_MISMATCH;
        } else if (*status == 0 && sqlite3_column_type(st, 4) != SQLITE_NULL) {
            copy_col(job_id, JOBS_ID_LEN, st, 4);
            *outcome = JOBS_IDEM_MADE;
        } else if (*status == 0) {
            *outcome = JOBS_IDEM_PENDING;
        } else {
            const char *l = (const char *)sqlite3_column_text(st, 2);
            const char *r = (const char *)sqlite3_column_text(st, 3);
            *location = strdup(l ? l : "");
            *response = strdup(r ? r : "");
            if (!*location || !*response) {
                rc = JOBS_ERR_NOMEM;
                goto out;
            }
            *outcome = JOBS_IDEM_DONE;
        }
        rc = JOBS_OK;
        goto out;
    }
    if (s != SQLITE_DONE) goto out;
    stmt_done(st);
    st = NULL;
    char now[32];
    jobs_now(now, sizeof now);
    if (!(st = stmt(&db->w, STMT_IDEM_PUT)))
        goto out;
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, request, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, now, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_DONE) rc = JOBS_OK;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    if (rc != JOBS_OK) {
        free(*location);
        free(*response);
        *location = *response = NULL;
    }
    return end(db, rc);
}

int jobs_idem_finish(struct jobs *db, const char *owner, const char *key, int status,
                     const char *location, const char *response)
{
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(&db->w, STMT_IDEM_FINISH)))
        goto out;
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, status);
    sqlite3_bind_text(st, 4, location, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, response, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_DONE) rc = JOBS_OK;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int jobs_idem_abandon(struct jobs *db, const char *owner, const char *key)
{
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *st = NULL;
    int rc = JOBS_ERR_DB;
    if (!(st = stmt(&db->w, STMT_IDEM_ABANDON)))
        goto out;
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_DONE) rc = JOBS_OK;
out:
    if (rc == JOBS_ERR_DB) rc = db_fail(&db->w);
    stmt_done(st);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

/* the job's state inside the writer's transaction (lock held): JOBS_OK, NOT_FOUND or DB */
static int state_locked(struct jobs *db, const char *id, enum job_state *state)
{
    sqlite3_stmt *st = stmt(&db->w, STMT_STATE);
    int rc = JOBS_ERR_DB;
    if (!st) return db_fail(&db->w);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        int k = t ? job_state_parse((const char *)t) : -1;
        *state = k < 0 ? JOB_FAILED : (enum job_state)k;
        rc = JOBS_OK;
    } else if (s == SQLITE_DONE) {
        rc = JOBS_ERR_NOT_FOUND;
    } else {
        rc = db_fail(&db->w);
    }
    stmt_done(st);
    return rc;
}

/* runs statement k bound to id alone to its end (lock held) */
static int exec_id_locked(struct jobs *db, enum jobs_stmt k, const char *id)
{
    sqlite3_stmt *st = stmt(&db->w, k);
    if (!st) return db_fail(&db->w);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? JOBS_OK : db_fail(&db->w);
    stmt_done(st);
    return rc;
}

int jobs_delete(struct jobs *db, const char *id, enum job_state *state, char *user)
{
    user[0] = 0;
    int rc = begin(db);
    if (rc) return rc;
    rc = state_locked(db, id, state);
    if (rc == JOBS_OK && !job_state_ended(*state)) rc = JOBS_ERR_STATE;
    if (rc == JOBS_OK) {
        sqlite3_stmt *st = stmt(&db->w, STMT_DELETE_USER);
        if (!st) {
            rc = db_fail(&db->w);
        } else {
            sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
            int s = sqlite3_step(st);
            if (s == SQLITE_ROW) {
                copy_col(user, JOBS_ID_LEN, st, 0);
                rc = JOBS_ERR_STATE;
            } else if (s != SQLITE_DONE) {
                rc = db_fail(&db->w);
            }
            stmt_done(st);
        }
    }
    if (rc == JOBS_OK) rc = exec_id_locked(db, STMT_DELETE_EVENTS, id);
    if (rc == JOBS_OK) rc = exec_id_locked(db, STMT_DELETE_IDEM, id);
    if (rc == JOBS_OK) rc = exec_id_locked(db, STMT_DELETE_JOB, id);
    return end(db, rc);
}

int jobs_resume(struct jobs *db, const char *id, const char *event_json, enum job_state *state)
{
    int rc = begin(db);
    if (rc) return rc;
    rc = state_locked(db, id, state);
    if (rc == JOBS_OK && *state != JOB_CANCELED && *state != JOB_FAILED) rc = JOBS_ERR_STATE;
    if (rc == JOBS_OK) rc = exec_id_locked(db, STMT_RESUME, id);
    if (rc == JOBS_OK) rc = event_append_locked(db, id, "state", event_json, NULL);
    return observed(db, end(db, rc), id, "state", event_json);
}
