/* child.c - a job's child process (see child.h): the progress protocol's one definition (the
 * event names and the fields' names and formats below), its writer, reader and stored form,
 * and the process start.
 */
#define _GNU_SOURCE /* pipe2, close_range through syscall */
#include "child.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const event_names[CHILD_EVENT_COUNT] = {
    "step", "validation", "sampling", "checkpoint", "sample", "stopped", "done",
};

/* every field: its name, how it is written, and whether a value that is not finite is written
 * as null (otherwise the writer never gets one) */
static const struct {
    const char *name, *fmt;
    int nullable;
} fields[CHILD_FIELD_COUNT] = {
    [CHILD_STEP] = {"step", "%.0f", 0},
    [CHILD_STEPS] = {"steps", "%.0f", 0},
    [CHILD_LOSS] = {"loss", "%.6f", 1},
    [CHILD_LOSS_AVG] = {"loss_avg", "%.6f", 0},
    [CHILD_LR] = {"lr", "%.6g", 0},
    [CHILD_GRAD_NORM] = {"grad_norm", "%.4f", 1},
    [CHILD_IMG_PER_S] = {"img_per_s", "%.2f", 0},
    [CHILD_ETA_S] = {"eta_s", "%.0f", 0},
    [CHILD_LOSS_SCALE] = {"loss_scale", "%.9g", 0},
    [CHILD_SKIPPED_STEPS] = {"skipped_steps", "%.0f", 0},
    [CHILD_VAL_LOSS] = {"val_loss", "%.6f", 0},
    [CHILD_STEP_S] = {"step_s", "%.6f", 0},
    [CHILD_DONE] = {"done", "%.0f", 0},
    [CHILD_TOTAL] = {"total", "%.0f", 0},
};

const char *child_event_name(enum child_event_kind k)
{
    return k >= 0 && k < CHILD_EVENT_COUNT ? event_names[k] : "?";
}

void child_event_write(FILE *f, const struct child_event *e)
{
    fprintf(f, "{\"event\":\"%s\"", child_event_name(e->kind));
    for (int i = 0; i < CHILD_FIELD_COUNT; i++) {
        if (!child_event_has(e, i)) continue;
        fprintf(f, ",\"%s\":", fields[i].name);
        if (fields[i].nullable && !isfinite(e->v[i]))
            fputs("null", f);
        else
            fprintf(f, fields[i].fmt, e->v[i]);
    }
    fputs("}\n", f);
    fflush(f);
}

int child_event_read(const char *line, struct child_event *e)
{
    memset(e, 0, sizeof *e);
    cJSON *o = cJSON_Parse(line);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
    int rc = -1;
    if (!cJSON_IsObject(o) || !cJSON_IsString(ev)) goto out;
    for (int k = 0; k < CHILD_EVENT_COUNT; k++)
        if (strcmp(ev->valuestring, event_names[k]) == 0) {
            e->kind = (enum child_event_kind)k;
            rc = 0;
        }
    for (int i = 0; rc == 0 && i < CHILD_FIELD_COUNT; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, fields[i].name);
        if (cJSON_IsNumber(v)) child_event_set(e, i, v->valuedouble);
        else if (cJSON_IsNull(v) && fields[i].nullable) child_event_set(e, i, NAN);
    }
out:
    cJSON_Delete(o);
    return rc;
}

char *child_event_json(const struct child_event *e, const char *id)
{
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "event", child_event_name(e->kind));
    for (int i = 0; ok && i < CHILD_FIELD_COUNT; i++) {
        if (!child_event_has(e, i)) continue;
        ok = fields[i].nullable && !isfinite(e->v[i])
                 ? cJSON_AddNullToObject(o, fields[i].name) != NULL
                 : cJSON_AddNumberToObject(o, fields[i].name, e->v[i]) != NULL;
    }
    if (ok && id) ok = cJSON_AddStringToObject(o, "id", id) != NULL;
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

static int is_progress(enum child_event_kind k)
{
    return k == CHILD_EVENT_STEP || k == CHILD_EVENT_VALIDATION || k == CHILD_EVENT_SAMPLING;
}

/* the last of its phase, or a step with a validation loss: never held back */
static int always_kept(const struct child_event *e)
{
    const double *v = e->v;
    if (e->kind == CHILD_EVENT_STEP)
        return child_event_has(e, CHILD_VAL_LOSS) ||
               (child_event_has(e, CHILD_STEP) && child_event_has(e, CHILD_STEPS) &&
                v[CHILD_STEP] >= v[CHILD_STEPS]);
    return child_event_has(e, CHILD_DONE) && child_event_has(e, CHILD_TOTAL) &&
           v[CHILD_DONE] >= v[CHILD_TOTAL];
}

int child_throttle_offer(struct child_throttle *t, const struct child_event *e, double now,
                         struct child_event out[2])
{
    int n = 0;
    int same = t->held && t->pending.kind == e->kind;
    /* a held event of another kind goes first: the order of the log is the order of the lines */
    if (t->held && !same) {
        out[n++] = t->pending;
        t->last[t->pending.kind] = now;
        t->held = 0;
    }
    if (!is_progress(e->kind) || always_kept(e) || now - t->last[e->kind] >= CHILD_PROGRESS_EVERY_S) {
        t->held = 0; /* one of its kind held back is older: e supersedes it */
        if (is_progress(e->kind)) t->last[e->kind] = now;
        out[n++] = *e;
        return n;
    }
    t->pending = *e;
    t->held = 1;
    return n;
}

int child_log_cap_offer(struct child_log_cap *c)
{
    if (c->stored < CHILD_LOG_LINES_MAX) {
        c->stored++;
        return 1;
    }
    c->dropped++;
    return 0;
}

int child_log_cap_note(const struct child_log_cap *c, char *buf, size_t n)
{
    if (!c->dropped) return 0;
    snprintf(buf, n, "%lld more log line%s dropped: a job start stores at most %d (its last "
             "stderr lines are in its error when it fails)", c->dropped,
             c->dropped == 1 ? "" : "s", CHILD_LOG_LINES_MAX);
    return 1;
}

int child_throttle_due(struct child_throttle *t, double now, int force, struct child_event *out)
{
    if (!t->held || (!force && now - t->last[t->pending.kind] < CHILD_PROGRESS_EVERY_S)) return 0;
    *out = t->pending;
    t->last[t->pending.kind] = now;
    t->held = 0;
    return 1;
}

int child_spawn(char *const argv[], char *const env[], pid_t *pid, int *out_fd, int *err_fd,
                char *err, size_t errlen)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    pid_t parent = getpid();
    pid_t p = fork();
    if (p < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        goto fail;
    }
    if (p == 0) {
        /* only async-signal-safe calls from here to execve */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the server died before the prctl */
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        syscall(SYS_close_range, 3u, ~0u, 0u);
        execve(argv[0], argv, env);
        static const char msg[] = "ddpmd serve: cannot exec the job's ddpmd binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    *pid = p;
    *out_fd = po[0];
    *err_fd = pe[0];
    return 0;
fail:
    if (po[0] >= 0) close(po[0]), close(po[1]);
    if (pe[0] >= 0) close(pe[0]), close(pe[1]);
    return -1;
}
