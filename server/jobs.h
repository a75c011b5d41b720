/* jobs.h - the job store: one SQLite database (WAL) in the data directory holding every job and
 * its event log, so a restart loses nothing. Thread-safe: every change takes the store's lock, and
 * a state change and the event that announces it are one transaction; a read sees the last
 * committed state (each thread reads through a connection of its own, closed by jobs_close).
 */
#ifndef DDPMD_JOBS_H
#define DDPMD_JOBS_H

#include <stddef.h>
#include <stdint.h>

#define JOBS_SCHEMA_VERSION 4
#define JOBS_ID_LEN 24
#define JOBS_NAME_MAX 64         /* bytes of a job's name (the api checks its characters) */

/* JOBS_ERR_FULL: SQLite said SQLITE_FULL (the disk is full): nothing of the call was stored;
 * JOBS_ERR_STATE: the job is not in a state the call accepts (jobs_delete, jobs_resume) */
enum jobs_status { JOBS_OK = 0, JOBS_ERR_DB = 1, JOBS_ERR_NOT_FOUND = 2, JOBS_ERR_NOMEM = 3,
                   JOBS_ERR_FULL = 4, JOBS_ERR_STATE = 5 };

enum job_state { JOB_QUEUED = 0, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELED, JOB_STATE_COUNT };

struct job_row {
    int64_t seq;                 /* creation order */
    char id[JOBS_ID_LEN];
    char owner[64];
    char kind[16];               /* "train", "sample" or "import" (an uploaded checkpoint) */
    char name[JOBS_NAME_MAX + 1]; /* its owner's name for it; "" none (schema 4) */
    char *labels;                /* its owner's labels: a JSON object of strings, owned; NULL
                                  * none (schema 4) */
    enum job_state state;
    char device[32];             /* where it runs; "" until its first start places it */
    int64_t reserved_bytes;      /* plan + process baseline (+ host data on the cpu device) */
    int threads;                 /* fixed at start; 0 while never started */
    int64_t step, steps;
    double loss, img_per_s;      /* NaN until the first progress line */
    int cancel_requested;
    int starts;                  /* how many times a child was started for it */
    char created_at[32], started_at[32], ended_at[32]; /* RFC 3339 UTC; "" when not yet */
    char *spec;                  /* the spec as submitted (canonical JSON), owned */
    char *plan;                  /* its plan on its device (JSON object; while unplaced the plan
                                  * on the first device it fits), owned */
    char *plans;                 /* its plan on each device (JSON array), owned; NULL for a job
                                  * stored before schema 3 */
    const char *idem_key;        /* jobs_insert only: the Idempotency-Key (of owner) the request
                                  * that makes it reserved, linked to it in its insert; NULL none */
    char *error;                 /* NULL unless failed */
};

struct job_event {
    int64_t seq;
    char type[24];
    char *data;                  /* JSON, owned */
};

struct jobs;

const char *job_state_name(enum job_state s);
/* -1 when name is no state */
int job_state_parse(const char *name);
static inline int job_state_ended(enum job_state s) { return s >= JOB_SUCCEEDED; }

/* opens (creating or migrating) DIR/ddpmd.db; err names the cause */
int jobs_open(struct jobs **out, const char *dir, char *err, size_t errlen);
void jobs_close(struct jobs *db);
/* why this thread's last store call that returned JOBS_ERR_DB or JOBS_ERR_FULL failed: SQLite's
 * message with its code, e.g. "database or disk is full (SQLITE_FULL, code 13)" */
const char *jobs_errmsg(void);

/* inserts r (id, owner, kind, name, labels, device, reserved_bytes, steps, spec, plan, plans,
 * state: queued, or an ended state for a job made complete, an imported checkpoint) and its
 * first event, "state" {"state":"STATE"}; JOBS_ERR_FULL also when the reserve (see
 * jobs_set_state) was used and the disk has no room to make it again */
int jobs_insert(struct jobs *db, const struct job_row *r);
int jobs_get(struct jobs *db, const char *id, struct job_row *out);
/* the job's state alone (an event stream's check, per event and stream) */
int jobs_state(struct jobs *db, const char *id, enum job_state *state);
void job_row_free(struct job_row *r);
void job_rows_free(struct job_row *rows, int n);

/* jobs in creation order after the job `after` (NULL: from the first); owner NULL = all,
 * state < 0 = any; at most limit rows */
int jobs_list(struct jobs *db, const char *owner, int state, const char *after, int limit,
              struct job_row **rows, int *n);
/* the same, only jobs of kind (NULL: any) */
int jobs_list_kind(struct jobs *db, const char *owner, const char *kind, int state,
                   const char *after, int limit, struct job_row **rows, int *n);
/* what GET /jobs filters by: NULL / -1 fields match any job */
struct jobs_filter {
    const char *owner, *kind;
    int state;
    const char *name;            /* the job's name, exactly */
    const char *labels;          /* JSON [["KEY", "VALUE"], ...]: labels the job has, each with
                                  * exactly its value (all of them: AND); NULL none */
};
int jobs_list_filter(struct jobs *db, const struct jobs_filter *f, const char *after, int limit,
                     struct job_row **rows, int *n);
/* Deletes an ended job's row, its events and the Idempotency-Keys that made it, in one
 * transaction: JOBS_ERR_STATE (*state says which) while it is queued or running;
 * JOBS_ERR_STATE with *user set to the id of a queued or running job whose spec names one of
 * its checkpoints ("ID-", init_from or a sample's checkpoint) */
int jobs_delete(struct jobs *db, const char *id, enum job_state *state, char *user);
/* A canceled or failed job queued again (cancel_requested, error and ended_at cleared; started
 * before, it resumes from its last checkpoint), with the event "state" event_json, in one
 * transaction; JOBS_ERR_STATE (*state says which) in any other state */
int jobs_resume(struct jobs *db, const char *id, const char *event_json, enum job_state *state);
int jobs_count(struct jobs *db, int state, int *n);
/* how many events of type the job's log holds */
int jobs_event_count(struct jobs *db, const char *id, const char *type, int *n);
/* the owner's jobs that are queued or running */
int jobs_count_owner(struct jobs *db, const char *owner, int *n);

/* sets the state (and started_at/ended_at, threads when > 0, error when non-NULL) and appends
 * the event type "state" with data (a JSON object) in one transaction. A change to an ended
 * state that meets a full disk is tried again with the store's reserve file deleted */
int jobs_set_state(struct jobs *db, const char *id, enum job_state st, int threads,
                   const char *error, const char *event_json);
int jobs_set_cancel_requested(struct jobs *db, const char *id);
/* the job's placement: device (NULL: unchanged), reserved_bytes, plan, plans (NULL: unchanged) */
int jobs_set_plan(struct jobs *db, const char *id, const char *device, int64_t reserved,
                  const char *plan, const char *plans);
int jobs_set_progress(struct jobs *db, const char *id, int64_t step, int64_t steps, double loss,
                      double img_per_s);
/* appends one event; *seq (may be NULL) gets its position in the job's log (1, 2, ...). A job's
 * "progress" events past JOBS_PROGRESS_MAX are thinned in the same transaction (every second
 * one goes; the newest of each kind, a phase's end, a step with "val_loss" and every other type
 * stay), so ids have gaps but never go back: resuming after any id is exact */
int jobs_event_append(struct jobs *db, const char *id, const char *type, const char *json,
                      int64_t *seq);
#define JOBS_PROGRESS_MAX 512
/* another JOBS_PROGRESS_MAX (at least 2): the tests' */
void jobs_set_progress_max(struct jobs *db, int n);
/* events with seq > after, in order, at most limit */
int jobs_events_after(struct jobs *db, const char *id, int64_t after, int limit,
                      struct job_event **ev, int *n);
void job_events_free(struct job_event *ev, int n);

/* Idempotency-Key: what a (owner, key) pair has answered */
enum jobs_idem { JOBS_IDEM_NEW = 0, JOBS_IDEM_DONE, JOBS_IDEM_PENDING, JOBS_IDEM_MISMATCH,
                 JOBS_IDEM_MADE };
/* looks (owner, key) up in one transaction: unseen -> reserved for this request (NEW); seen with
 * another request text -> MISMATCH; seen, answer stored -> DONE with *status, *location and
 * *response (owned); seen, its job made (jobs_insert linked it) but no answer stored -> MADE
 * with job_id (JOBS_ID_LEN bytes); seen, first request still being answered -> PENDING.
 * Reservations of a process that died are dropped when the store opens, unless they made a job. */
int jobs_idem_begin(struct jobs *db, const char *owner, const char *key, const char *request,
                    int *outcome, int *status, char **location, char **response, char *job_id);
/* stores the answer of a reserved key */
int jobs_idem_finish(struct jobs *db, const char *owner, const char *key, int status,
                     const char *location, const char *response);
/* drops a reservation whose request was refused (a refusal is not remembered: a retry with the
 * same key is a new attempt); one whose job was made stays */
int jobs_idem_abandon(struct jobs *db, const char *owner, const char *key);

/* called after every committed event (type, its JSON data), on the committing thread and
 * outside the store's lock: it must be quick and must not call the store back. Set once, before
 * other threads use the store (the webhook sender's queue) */
typedef void (*jobs_observer_fn)(void *ctx, const char *job_id, const char *type, const char *json);
void jobs_set_observer(struct jobs *db, jobs_observer_fn fn, void *ctx);

/* the RFC 3339 time of now, UTC */
void jobs_now(char *buf, size_t n);

#endif
