/* test_child.c - the child progress protocol (server/child.h): each event as the writer puts it
 * on a line, byte for byte (what `ddpmd train` and `ddpmd sample --progress-json` print), read
 * back by the pool's reader field for field, and stored as the job's event exactly as the line's
 * own JSON re-printed (what the event log held before the protocol had one definition); lines
 * that are no event are refused, so the pool keeps them as log lines.
 */
#define _GNU_SOURCE /* open_memstream */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"
#include "test_util.h"

/* the line child_event_write puts out for e */
static char *written(const struct child_event *e)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    child_event_write(f, e);
    fclose(f);
    return buf;
}

/* e written, read back and stored: the line is want (without its newline), the reader gives e
 * again, and the stored JSON is the line's own JSON re-printed (+ id) */
static void round_trip(const char *what, const struct child_event *e, const char *want,
                       const char *id)
{
    char *line = written(e);
    size_t n = line ? strlen(line) : 0;
    CHECK(line && n > 0 && line[n - 1] == '\n', "%s: no line", what);
    if (!line || !n) return;
    line[n - 1] = 0;
    CHECK(strcmp(line, want) == 0, "%s: wrote\n  %s\nnot\n  %s", what, line, want);
    struct child_event r;
    CHECK(child_event_read(line, &r) == 0, "%s: not read back", what);
    CHECK(r.kind == e->kind && r.has == e->has, "%s: read kind %d has %x, wrote %d %x", what,
          r.kind, r.has, e->kind, e->has);
    cJSON *o = cJSON_Parse(line);
    if (id) cJSON_AddStringToObject(o, "id", id);
    char *old = cJSON_PrintUnformatted(o), *stored = child_event_json(&r, id);
    CHECK(old && stored && strcmp(old, stored) == 0, "%s: stored\n  %s\nnot the line's\n  %s",
          what, stored ? stored : "(null)", old ? old : "(null)");
    free(old);
    free(stored);
    cJSON_Delete(o);
    free(line);
}

int main(void)
{
    struct child_event e = {.kind = CHILD_EVENT_STEP};
    child_event_set(&e, CHILD_STEP, 12);
    child_event_set(&e, CHILD_STEPS, 300);
    child_event_set(&e, CHILD_LOSS, (float)0.0312345);
    child_event_set(&e, CHILD_LOSS_AVG, (float)0.05);
    child_event_set(&e, CHILD_LR, (float)2e-4);
    child_event_set(&e, CHILD_GRAD_NORM, (float)1.23456);
    child_event_set(&e, CHILD_IMG_PER_S, 3.0);
    child_event_set(&e, CHILD_ETA_S, 287.6);
    child_event_set(&e, CHILD_STEP_S, 0.25);
    round_trip("a step", &e,
               "{\"event\":\"step\",\"step\":12,\"steps\":300,\"loss\":0.031235,"
               "\"loss_avg\":0.050000,\"lr\":0.0002,\"grad_norm\":1.2346,\"img_per_s\":3.00,"
               "\"eta_s\":288,\"step_s\":0.250000}",
               NULL);

    /* f16: a skipped step's inf loss and norm are null; loss scale, skips and validation */
    child_event_set(&e, CHILD_LOSS, INFINITY);
    child_event_set(&e, CHILD_GRAD_NORM, NAN);
    child_event_set(&e, CHILD_LOSS_SCALE, 32768);
    child_event_set(&e, CHILD_SKIPPED_STEPS, 2);
    child_event_set(&e, CHILD_VAL_LOSS, (float)0.04);
    round_trip("an f16 step", &e,
               "{\"event\":\"step\",\"step\":12,\"steps\":300,\"loss\":null,"
               "\"loss_avg\":0.050000,\"lr\":0.0002,\"grad_norm\":null,\"img_per_s\":3.00,"
               "\"eta_s\":288,\"loss_scale\":32768,\"skipped_steps\":2,\"val_loss\":0.040000,"
               "\"step_s\":0.250000}",
               NULL);

    struct child_event v = {.kind = CHILD_EVENT_VALIDATION};
    child_event_set(&v, CHILD_STEP, 40);
    child_event_set(&v, CHILD_DONE, 2);
    child_event_set(&v, CHILD_TOTAL, 5);
    round_trip("validation", &v, "{\"event\":\"validation\",\"step\":40,\"done\":2,\"total\":5}",
               NULL);
    struct child_event g = {.kind = CHILD_EVENT_SAMPLING};
    child_event_set(&g, CHILD_DONE, 7);
    child_event_set(&g, CHILD_TOTAL, 100);
    round_trip("a sampling job's step", &g, "{\"event\":\"sampling\",\"done\":7,\"total\":100}",
               NULL);
    static const struct {
        enum child_event_kind kind;
        const char *line;
    } plain[] = {
        {CHILD_EVENT_CHECKPOINT, "{\"event\":\"checkpoint\",\"step\":300}"},
        {CHILD_EVENT_SAMPLES, "{\"event\":\"samples\",\"step\":300}"},
        {CHILD_EVENT_STOPPED, "{\"event\":\"stopped\",\"step\":17}"},
        {CHILD_EVENT_DONE, "{\"event\":\"done\",\"step\":300}"},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        struct child_event p = {.kind = plain[i].kind};
        int step = plain[i].kind == CHILD_EVENT_STOPPED ? 17 : 300;
        child_event_set(&p, CHILD_STEP, step);
        round_trip(child_event_name(p.kind), &p, plain[i].line,
                   p.kind == CHILD_EVENT_CHECKPOINT ? "j0123456789abcdef-300" : NULL);
    }

    /* anything else is no event: the pool keeps it as a log line */
    static const char *const others[] = {
        "ddpmd: resuming from out/checkpoints/step-00000003.safetensors (step 3)",
        "{\"event\":\"stepped\",\"step\":1}", "{\"step\":1}", "[1,2]", "{\"event\":7}", "",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        struct child_event r;
        CHECK(child_event_read(others[i], &r) != 0, "'%s' read as an event", others[i]);
    }
    return tu_finish("test_child");
}
