/* events.c - a job's events as Server-Sent Events (GET /jobs/{id}/events): a response from a
 * callback that suspends its connection while there is nothing to send, so a stream costs no
 * thread; the pool's notify and a ticker (keep-alives) resume them.
 */
#define _GNU_SOURCE
#include "routes.h"

#include <pthread.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "jobs.h"
#include "parse.h"

#define SSE_BATCH 64

struct sse {
    struct api *a;
    struct MHD_Connection *conn;
    char job[JOBS_ID_LEN];
    int64_t last;
    char *buf;
    size_t len, off, cap;
    double last_write;
    int suspended, done;
    struct sse *next, *prev;
};

static int sse_put(struct sse *s, const char *text)
{
    size_t n = strlen(text);
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *b = realloc(s->buf, cap);
        if (!b) return -1;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, n + 1);
    s->len += n;
    return 0;
}

/* what a stream sends for a stored event, where the path prefix is known: a checkpoint's data
 * ({"id", "step"}) with "url", its GET /checkpoints/{id}; a sample's ({"event":"sample",
 * "step"}) with "url", its grid's GET /jobs/{job}/grids/{step}.png (a store of an older
 * ddpmd named it "samples": sent as "sample"); NULL: send it as stored */
static char *sse_event_data(const struct api *a, const char *job, const char *type,
                            const char *data)
{
    int ckpt = strcmp(type, "checkpoint") == 0, sample = strcmp(type, "sample") == 0;
    if (!ckpt && !sample) return NULL;
    cJSON *o = cJSON_Parse(data);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    char *out = NULL, url[192];
    if (!o || cJSON_GetObjectItemCaseSensitive(o, "url")) goto done;
    if (ckpt && cJSON_IsString(id)) {
        api_link(a, url, sizeof url, "/checkpoints/%s", id->valuestring);
    } else if (sample && cJSON_IsNumber(step) && step->valuedouble >= 0 &&
               step->valuedouble <= 9e15) {
        api_link(a, url, sizeof url, "/jobs/%s/grids/%.0f.png", job, step->valuedouble);
        cJSON *name = cJSON_CreateString("sample");
        if (!name || !cJSON_ReplaceItemInObjectCaseSensitive(o, "event", name)) {
            cJSON_Delete(name);
            goto done;
        }
    } else {
        goto done;
    }
    cJSON_AddStringToObject(o, "url", url);
    out = cJSON_PrintUnformatted(o);
done:
    cJSON_Delete(o);
    return out;
}

/* refills s->buf from the event log; 1 when something was added */
static int sse_fill(struct sse *s, int *ended)
{
    enum job_state state;
    /* the state first: a job's last event is committed with its final state */
    *ended = jobs_state(s->a->cfg.db, s->job, &state) != JOBS_OK || job_state_ended(state);
    struct job_event *ev;
    int n;
    if (jobs_events_after(s->a->cfg.db, s->job, s->last, SSE_BATCH, &ev, &n)) return 0;
    for (int i = 0; i < n; i++) {
        char head[96];
        snprintf(head, sizeof head, "id: %" PRId64 "\nevent: %s\ndata: ", ev[i].seq, ev[i].type);
        /* event data is one-line JSON (compact), so it needs no splitting into data: lines; a
         * checkpoint's and a grid's get their download URL here */
        char *data = sse_event_data(s->a, s->job, ev[i].type, ev[i].data);
        int bad = sse_put(s, head) || sse_put(s, data ? data : ev[i].data) || sse_put(s, "\n\n");
        free(data);
        if (bad) break;
        s->last = ev[i].seq;
    }
    job_events_free(ev, n);
    if (n > 0) *ended = 0; /* send these; the end is seen on the next fill */
    return n > 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct sse *s = cls;
    struct api *a = s->a;
    for (;;) {
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(out, s->buf + s->off, n);
            s->off += n;
            s->last_write = clock_now_s();
            return (ssize_t)n;
        }
        s->len = s->off = 0;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&a->mu);
        uint64_t gen = a->gen;
        int stopping = a->stopping;
        pthread_mutex_unlock(&a->mu);
        if (stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        int ended;
        if (sse_fill(s, &ended)) continue;
        if (ended) {
            s->done = 1;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (clock_now_s() - s->last_write >= a->cfg.keepalive_s) {
            sse_put(s, ": keep-alive\n\n");
            continue;
        }
        /* nothing to send: park the connection until a notify (or the api_events_ticker) resumes it; a
         * notify between the fill and here changed gen, so it cannot be missed */
        pthread_mutex_lock(&a->mu);
        if (a->gen != gen || a->stopping) {
            pthread_mutex_unlock(&a->mu);
            continue;
        }
        s->suspended = 1;
        MHD_suspend_connection(s->conn);
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
}

static void sse_free(void *cls)
{
    struct sse *s = cls;
    struct api *a = s->a;
    pthread_mutex_lock(&a->mu);
    if (s->prev)
        s->prev->next = s->next;
    else
        a->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&a->mu);
    free(s->buf);
    free(s);
}

/* resumes suspended streams: all of them, or those quiet for the keep-alive interval (lock held) */
void api_events_resume(struct api *a, int all)
{
    double t = clock_now_s();
    for (struct sse *s = a->streams; s; s = s->next)
        if (s->suspended && (all || t - s->last_write >= a->cfg.keepalive_s)) {
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        }
}

void api_notify(void *ctx)
{
    struct api *a = ctx;
    pthread_mutex_lock(&a->mu);
    a->gen++;
    api_events_resume(a, 1);
    pthread_mutex_unlock(&a->mu);
}

void *api_events_ticker(void *arg)
{
    struct api *a = arg;
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&a->mu);
        int stop = a->stopping;
        api_events_resume(a, stop);
        pthread_mutex_unlock(&a->mu);
        if (stop) return NULL;
    }
}

enum MHD_Result h_events(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    /* both are checked; the header wins over the query (a browser's EventSource sends the
     * header when it reconnects to the URL it first opened with last_event_id) */
    const char *lei = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Last-Event-ID");
    const char *qei = http_arg(c, "last_event_id");
    long long last, qlast;
    if (api_parse_last_event_id(lei, &last))
        return http_send_invalid(c, 400, "Last-Event-ID", "expected an event id (a number >= 0)");
    if (api_parse_last_event_id(qei, &qlast))
        return http_send_invalid(c, 400, "last_event_id", "expected an event id (a number >= 0)");
    if (!lei) last = qlast;
    struct sse *s = calloc(1, sizeof *s);
    if (!s) return http_send_oom(c);
    s->a = c->a;
    s->conn = c->conn;
    snprintf(s->job, sizeof s->job, "%s", c->param);
    s->last = last;
    s->last_write = clock_now_s();
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s, sse_free);
    if (!resp) {
        free(s);
        return http_send_oom(c);
    }
    pthread_mutex_lock(&c->a->mu);
    s->next = c->a->streams;
    if (s->next) s->next->prev = s;
    c->a->streams = s;
    pthread_mutex_unlock(&c->a->mu);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result rr = http_respond(c, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}
