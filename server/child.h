/* child.h - a job's child process as the pool and the command it runs (`ddpmd train`, `ddpmd
 * sample`) both see it: its exit statuses, the progress protocol on its stdout (one event per
 * line, one JSON object: written by child_event_write, read by child_event_read, stored by
 * child_event_json; the fields of every event defined once, in child.c), and the start of the
 * process itself (fork, the death signal, exec).
 */
#ifndef DDPMD_CHILD_H
#define DDPMD_CHILD_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* the command stopped on SIGINT/SIGTERM with its state saved (a training job: the checkpoint of
 * its last finished step); 128 + SIGINT, as a shell reports a Ctrl-C */
#define CHILD_EXIT_STOPPED 130
/* a sticky CUDA error poisoned the command's device: the pool fails the job and marks the device,
 * which admits no job again in the server's life */
#define CHILD_EXIT_POISONED 3

/* the events, by their "event" name */
enum child_event_kind {
    CHILD_EVENT_STEP = 0,       /* "step": a training step's numbers */
    CHILD_EVENT_VALIDATION,     /* "validation": held-out batches done of total */
    CHILD_EVENT_SAMPLING,       /* "sampling": denoising steps done of total (a training job's
                                 * grid, with its step; a sampling job's images, without) */
    CHILD_EVENT_CHECKPOINT,     /* "checkpoint": the checkpoint of step is written */
    CHILD_EVENT_SAMPLE,         /* "sample": the sample grid of step is written */
    CHILD_EVENT_STOPPED,        /* "stopped": stopped at step, its state saved */
    CHILD_EVENT_DONE,           /* "done": every step done */
    CHILD_EVENT_COUNT
};

/* an event's fields, in the order they are written; each is a number (a null one: not finite) */
enum child_field {
    CHILD_STEP = 0,             /* the training step it happened at (1-based once a step ran) */
    CHILD_STEPS,                /* train.steps */
    CHILD_LOSS,                 /* the step's loss (null: inf/NaN, an f16 step skipped) */
    CHILD_LOSS_AVG,             /* its running mean */
    CHILD_LR,                   /* the learning rate it stepped with */
    CHILD_GRAD_NORM,            /* the gradient's norm before clipping (null: not finite) */
    CHILD_IMG_PER_S,            /* images per second since the run's start */
    CHILD_ETA_S,                /* seconds left at that pace */
    CHILD_LOSS_SCALE,           /* f16: the loss scale */
    CHILD_SKIPPED_STEPS,        /* f16: steps skipped for an inf/NaN gradient */
    CHILD_VAL_LOSS,             /* the validation loss, on a step that measured it */
    CHILD_STEP_S,               /* the mean seconds of the steps since the last step event */
    CHILD_DONE,                 /* validation / sampling: done of */
    CHILD_TOTAL,                /*   total */
    CHILD_FIELD_COUNT
};

struct child_event {
    enum child_event_kind kind;
    unsigned has;               /* bit (1 << enum child_field): the field is present */
    double v[CHILD_FIELD_COUNT];
};

static inline void child_event_set(struct child_event *e, enum child_field f, double v)
{
    e->has |= 1u << f;
    e->v[f] = v;
}
static inline int child_event_has(const struct child_event *e, enum child_field f)
{
    return (e->has >> f) & 1u;
}

/* "step", "validation", ... */
const char *child_event_name(enum child_event_kind k);
/* writes e as one line on f and flushes it (the child's side) */
void child_event_write(FILE *f, const struct child_event *e);
/* a line of the child's stdout -> e; 0 when it is an event, -1 when it is anything else (the
 * pool keeps such a line as a log line) */
int child_event_read(const char *line, struct child_event *e);
/* e as compact JSON, as the job's event log stores it (the fields as written, and "id" when
 * not NULL: a checkpoint's id); NULL when out of memory. Caller frees. */
char *child_event_json(const struct child_event *e, const char *id);

/* The rate limit of a job's progress (its step, validation and sampling events) as the server
 * stores it: per kind, at most one event per CHILD_PROGRESS_EVERY_S; one that comes sooner is
 * held back (a newer one of its kind replaces it) and stored when its window ends
 * (child_throttle_due) or before the next event of another kind, so the last of a phase is
 * always kept. A phase's end (done == total, step == steps) and a step that measured the
 * validation loss are never held. */
#define CHILD_PROGRESS_EVERY_S 0.5

/* The cap of a job start's log lines (its stderr and stdout lines that are no protocol event),
 * as the server stores them: the first CHILD_LOG_LINES_MAX are stored, the rest only counted,
 * and one log event at the end says how many were dropped (child_log_cap_note). */
#define CHILD_LOG_LINES_MAX 2000

struct child_log_cap {
    long long stored, dropped;
};
/* 1: store the next line; 0: it is dropped (counted) */
int child_log_cap_offer(struct child_log_cap *c);
/* the line of the one event that says how many were dropped: 1 with buf, 0 when none were */
int child_log_cap_note(const struct child_log_cap *c, char *buf, size_t n);

struct child_throttle {
    double last[CHILD_EVENT_COUNT];  /* when each kind last passed (0: never) */
    int held;                        /* pending holds an event */
    struct child_event pending;
};

/* e, arriving at now (seconds, any monotonic clock > 0): returns how many events to store now,
 * in order, in out[0..1] (0: e is held back; 2: a held event of another kind first, then e) */
int child_throttle_offer(struct child_throttle *t, const struct child_event *e, double now,
                         struct child_event out[2]);
/* the held event when its window has ended at now (or at once when force): 1 with *out (no
 * longer held), else 0 */
int child_throttle_due(struct child_throttle *t, double now, int force, struct child_event *out);

/* Starts argv[0] with argv and env: stdin /dev/null, stdout and stderr the write ends of two
 * pipes whose read ends (close-on-exec) are returned in *out_fd and *err_fd; the child dies with
 * the calling thread (PR_SET_PDEATHSIG: call it from the thread that outlives the children),
 * its signal mask cleared and SIGINT, SIGTERM and SIGPIPE at their defaults. 0 with *pid, or -1
 * with err. */
int child_spawn(char *const argv[], char *const env[], pid_t *pid, int *out_fd, int *err_fd,
                char *err, size_t errlen);

#endif
