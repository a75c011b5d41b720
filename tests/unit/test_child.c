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

/* the server's rate limit: 4,000 step lines a second (log_every 1, a tiny model) over 3 s,
 * with a validation and a sampling phase inside, become about two a second per kind; the last
 * of each phase, every step with a validation loss and every other event pass at once, in the
 * order of the lines */
static void test_throttle(void)
{
    struct child_throttle t = {0};
    struct child_event out[2], e;
    int stored[CHILD_EVENT_COUNT] = {0}, steps = 12000, last_step = 0, order_ok = 1, nval = 0;
    double now = 100.0, last_kind_t = 0;
    int last_kind = -1;
    for (int s = 1; s <= steps; s++) {
        now += 0.00025;
        struct child_event in[3];
        int nin = 0;
        in[nin] = (struct child_event){.kind = CHILD_EVENT_STEP};
        child_event_set(&in[nin], CHILD_STEP, s);
        child_event_set(&in[nin], CHILD_STEPS, steps);
        if (s % 4000 == 0) child_event_set(&in[nin], CHILD_VAL_LOSS, 0.1);
        nin++;
        if (s == 6000) { /* a grid: 100 denoising steps, then its event */
            for (int d = 1; d <= 100; d++) {
                struct child_event g = {.kind = CHILD_EVENT_SAMPLING};
                child_event_set(&g, CHILD_STEP, s);
                child_event_set(&g, CHILD_DONE, d);
                child_event_set(&g, CHILD_TOTAL, 100);
                int n = child_throttle_offer(&t, &g, now, out);
                for (int i = 0; i < n; i++) {
                    stored[out[i].kind]++;
                    if (out[i].kind == CHILD_EVENT_SAMPLING && out[i].v[CHILD_DONE] == 100)
                        nval++;
                }
                now += 0.0001;
            }
            in[nin] = (struct child_event){.kind = CHILD_EVENT_SAMPLE};
            child_event_set(&in[nin++], CHILD_STEP, s);
        }
        for (int j = 0; j < nin; j++) {
            int n = child_throttle_offer(&t, &in[j], now, out);
            for (int i = 0; i < n; i++) {
                stored[out[i].kind]++;
                if (out[i].kind == CHILD_EVENT_STEP) {
                    order_ok &= out[i].v[CHILD_STEP] > last_step;
                    last_step = (int)out[i].v[CHILD_STEP];
                    if (child_event_has(&out[i], CHILD_VAL_LOSS)) nval++;
                    /* two step events less than the window apart: only a kept one may be */
                    if (last_kind == CHILD_EVENT_STEP && now - last_kind_t < CHILD_PROGRESS_EVERY_S &&
                        !child_event_has(&out[i], CHILD_VAL_LOSS) && out[i].v[CHILD_STEP] != steps)
                        order_ok = 0;
                    last_kind = CHILD_EVENT_STEP;
                    last_kind_t = now;
                }
            }
            /* the server's poll loop, every few hundred lines */
            if (s % 500 == 0 && child_throttle_due(&t, now, 0, &e)) stored[e.kind]++;
        }
    }
    if (child_throttle_due(&t, now, 1, &e)) stored[e.kind]++;
    CHECK(stored[CHILD_EVENT_STEP] >= 6 && stored[CHILD_EVENT_STEP] <= 12,
          "%d step events of %d stored over 3 s", stored[CHILD_EVENT_STEP], steps);
    CHECK(last_step == steps, "the last step stored is %d, not %d", last_step, steps);
    CHECK(order_ok, "step events out of order or closer than the window");
    CHECK(stored[CHILD_EVENT_SAMPLE] == 1, "the sample event passes");
    CHECK(stored[CHILD_EVENT_SAMPLING] >= 1 && stored[CHILD_EVENT_SAMPLING] <= 3,
          "%d sampling events of 100", stored[CHILD_EVENT_SAMPLING]);
    CHECK(nval == 4, "%d of 3 validation steps and 1 grid end kept", nval);

    /* a held event of one kind goes before an event of another */
    struct child_throttle u = {0};
    struct child_event a = {.kind = CHILD_EVENT_STEP}, b = {.kind = CHILD_EVENT_CHECKPOINT};
    child_event_set(&a, CHILD_STEP, 1);
    CHECK(child_throttle_offer(&u, &a, 10.0, out) == 1, "the first step passes");
    child_event_set(&a, CHILD_STEP, 2);
    CHECK(child_throttle_offer(&u, &a, 10.1, out) == 0, "the second is held");
    CHECK(!child_throttle_due(&u, 10.2, 0, &e), "not due inside the window");
    child_event_set(&b, CHILD_STEP, 2);
    CHECK(child_throttle_offer(&u, &b, 10.2, out) == 2 && out[0].kind == CHILD_EVENT_STEP &&
              out[0].v[CHILD_STEP] == 2 && out[1].kind == CHILD_EVENT_CHECKPOINT,
          "the held step, then the checkpoint");
    child_event_set(&a, CHILD_STEP, 3);
    CHECK(child_throttle_offer(&u, &a, 10.3, out) == 0, "a step inside the window is held");
    CHECK(child_throttle_due(&u, 10.8, 0, &e) && e.v[CHILD_STEP] == 3, "and stored when due");
}

/* the log cap: the first CHILD_LOG_LINES_MAX lines stored, the rest counted into one note */
static void test_log_cap(void)
{
    struct child_log_cap c = {0};
    char note[200];
    int stored = 0;
    CHECK(!child_log_cap_note(&c, note, sizeof note), "a note before any line was dropped");
    for (int i = 0; i < CHILD_LOG_LINES_MAX; i++) stored += child_log_cap_offer(&c);
    CHECK(stored == CHILD_LOG_LINES_MAX && !child_log_cap_note(&c, note, sizeof note),
          "%d of the first %d lines stored", stored, CHILD_LOG_LINES_MAX);
    for (int i = 0; i < 5; i++) stored += child_log_cap_offer(&c);
    CHECK(stored == CHILD_LOG_LINES_MAX, "%d stored past the cap", stored - CHILD_LOG_LINES_MAX);
    CHECK(child_log_cap_note(&c, note, sizeof note) && strstr(note, "5 more log lines dropped"),
          "the note: %s", note);
}

int main(void)
{
    test_throttle();
    test_log_cap();
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
        {CHILD_EVENT_SAMPLE, "{\"event\":\"sample\",\"step\":300}"},
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
