/* webhook.c - job webhooks (see webhook.h). The store's observer only copies an event into a
 * queue (a mutex and a condition variable); one thread owns libcurl, takes the earliest due
 * delivery, renders its body once, POSTs it and either records success or schedules the next
 * attempt. A job's subscription lives in its folder, so deliveries continue after a restart.
 */
#define _GNU_SOURCE
#include "webhook.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsio.h"
#include "log.h"

static const char *const event_names[WEBHOOK_EVENT_COUNT] = {"start", "checkpoint", "sample",
                                                             "completed", "failed", "canceled"};

struct delivery {
    char job[JOBS_ID_LEN];
    int event;
    char *data;                 /* the job event's JSON */
    char *body;                 /* rendered at the first attempt */
    char url[WEBHOOK_URL_MAX + 1];
    char id[40];                /* X-Ddpmd-Delivery */
    int attempt;                /* attempts made */
    double due;                 /* CLOCK_MONOTONIC seconds */
    struct delivery *next;
};

struct webhook {
    struct webhook_config cfg;
    char data_dir[FSIO_PATH_MAX];
    char allow[1024];
    char secret[256];
    struct jobs *db;
    pthread_mutex_t mu;         /* queue, stopping */
    pthread_cond_t cv;
    struct delivery *queue;
    int stopping;
    pthread_mutex_t reg;        /* the registration section */
    pthread_t thread;
    int thread_on;
    char *(*render)(void *, const char *);
    void *render_ctx;
    uint64_t seq;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void webhook_sign(const char *secret, const char *ts, const char *body, char *out, size_t n)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    size_t tl = strlen(ts), bl = strlen(body);
    unsigned char *msg = malloc(tl + 1 + bl);
    out[0] = 0;
    if (!msg) return;
    memcpy(msg, ts, tl);
    msg[tl] = '.';
    memcpy(msg + tl + 1, body, bl);
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, tl + 1 + bl, mac, &len) && n >= 8 + 2 * len) {
        memcpy(out, "sha256=", 8);
        for (unsigned i = 0; i < len; i++) snprintf(out + 7 + 2 * i, 3, "%02x", mac[i]);
    }
    free(msg);
}

/* the secret: the file's first line (trailing whitespace dropped), at least 16 characters */
static int secret_read(const char *path, char *out, size_t n, char *err, size_t errlen)
{
    FILE *f = fsio_fopen_read(path, err, errlen);
    if (!f) return -1;
    if (!fgets(out, (int)n, f)) out[0] = 0;
    fclose(f);
    size_t l = strlen(out);
    while (l && (out[l - 1] == '\n' || out[l - 1] == '\r' || out[l - 1] == ' ' || out[l - 1] == '\t'))
        out[--l] = 0;
    if (l < WEBHOOK_SECRET_MIN) {
        snprintf(err, errlen, "the webhook secret in %s is shorter than %d characters", path,
                 WEBHOOK_SECRET_MIN);
        return -1;
    }
    return 0;
}

/* DATA/webhook.secret: read, or made with 32 random bytes (hex) readable by this user only */
static int secret_load(struct webhook *w, char *err, size_t errlen)
{
    if (w->cfg.secret_file) return secret_read(w->cfg.secret_file, w->secret, sizeof w->secret, err, errlen);
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, err, errlen, "%s/webhook.secret", w->data_dir)) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) return secret_read(path, w->secret, sizeof w->secret, err, errlen);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char r[32];
    char hex[66];
    int ok = getrandom(r, sizeof r, 0) == (ssize_t)sizeof r;
    for (int i = 0; ok && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", r[i]);
    if (ok) hex[64] = '\n', hex[65] = 0;
    ok = ok && fsio_write_full(fd, hex, 65) == 0 && fsync(fd) == 0;
    if (close(fd)) ok = 0;
    if (!ok) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(path);
        return -1;
    }
    hex[64] = 0;
    snprintf(w->secret, sizeof w->secret, "%s", hex);
    return 0;
}

/* ---- subscriptions ---- */

/* the URL's scheme (http/https) and host, by libcurl's own parser (the one that connects) */
static int url_check(const struct webhook *w, const char *url, char *msg, size_t mlen)
{
    if (strlen(url) > WEBHOOK_URL_MAX) {
        snprintf(msg, mlen, "longer than %d bytes", WEBHOOK_URL_MAX);
        return -1;
    }
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL;
    int rc = -1;
    if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        snprintf(msg, mlen, "not an absolute http or https URL");
        goto out;
    }
    if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0) {
        snprintf(msg, mlen, "only http and https URLs are allowed");
        goto out;
    }
    if (w->allow[0]) {
        int ok = 0;
        const char *p = w->allow;
        while (*p && !ok) {
            const char *e = strchr(p, ',');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            ok = n == strlen(host) && strncasecmp(p, host, n) == 0;
            p += n + (e != NULL);
        }
        if (!ok) {
            snprintf(msg, mlen, "the host is not in the server's --webhook-allow list");
            goto out;
        }
    }
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return rc;
}

int webhook_parse(const struct webhook *w, const cJSON *o, struct webhook_sub *sub, char *path,
                  size_t plen, char *msg, size_t mlen)
{
    memset(sub, 0, sizeof *sub);
    if (!cJSON_IsObject(o)) {
        snprintf(path, plen, "webhook");
        snprintf(msg, mlen, "expected an object {\"url\": ..., \"events\": [...]}");
        return -1;
    }
    for (const cJSON *f = o->child; f; f = f->next)
        if (!f->string || (strcmp(f->string, "url") != 0 && strcmp(f->string, "events") != 0)) {
            snprintf(path, plen, "webhook.%.40s", f->string ? f->string : "");
            snprintf(msg, mlen, "unknown field");
            return -1;
        }
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(o, "url");
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "events");
    snprintf(path, plen, "webhook.url");
    if (!cJSON_IsString(url)) {
        snprintf(msg, mlen, "expected a URL (a string)");
        return -1;
    }
    if (url_check(w, url->valuestring, msg, mlen)) return -1;
    snprintf(sub->url, sizeof sub->url, "%s", url->valuestring);
    snprintf(path, plen, "webhook.events");
    if (!ev || cJSON_IsNull(ev)) {
        sub->events = (1u << WEBHOOK_EVENT_COUNT) - 1;
        return 0;
    }
    if (!cJSON_IsArray(ev) || cJSON_GetArraySize(ev) < 1) {
        snprintf(msg, mlen, "expected a non-empty array of start, checkpoint, sample, completed, "
                            "failed, canceled");
        return -1;
    }
    for (const cJSON *e = ev->child; e; e = e->next) {
        int k = 0;
        while (k < WEBHOOK_EVENT_COUNT && !(cJSON_IsString(e) && strcmp(e->valuestring, event_names[k]) == 0))
            k++;
        if (k == WEBHOOK_EVENT_COUNT) {
            snprintf(msg, mlen, "each event is one of start, checkpoint, sample, completed, failed, "
                                "canceled");
            return -1;
        }
        sub->events |= 1u << k;
    }
    return 0;
}

void webhook_lock(struct webhook *w) { pthread_mutex_lock(&w->reg); }
void webhook_unlock(struct webhook *w) { pthread_mutex_unlock(&w->reg); }

int webhook_register(struct webhook *w, const char *job_id, const struct webhook_sub *sub,
                     char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, err, errlen, "%s/jobs/%s/webhook.json", w->data_dir, job_id))
        return -1;
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "events");
    cJSON_AddStringToObject(o, "url", sub->url);
    for (int k = 0; k < WEBHOOK_EVENT_COUNT; k++)
        if (sub->events & (1u << k)) cJSON_AddItemToArray(arr, cJSON_CreateString(event_names[k]));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    int rc = s ? fsio_write_atomic_text(path, s, err, errlen) : -1;
    free(s);
    return rc;
}

/* the job's subscription from its folder; 0 when it has one */
static int sub_load(struct webhook *w, const char *job_id, struct webhook_sub *sub)
{
    char path[FSIO_PATH_MAX], err[300], buf[WEBHOOK_URL_MAX + 512], p[64], m[200];
    if (fsio_path(path, sizeof path, err, sizeof err, "%s/jobs/%s/webhook.json", w->data_dir, job_id))
        return -1;
    if (access(path, F_OK)) return -1;
    FILE *f = fsio_fopen_read(path, err, sizeof err);
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    int rc = webhook_parse(w, o, sub, p, sizeof p, m, sizeof m);
    cJSON_Delete(o);
    return rc;
}

/* ---- the queue ---- */

/* a job event -> the webhook event it is (-1: none) */
static int event_of(const char *type, const char *json)
{
    if (strcmp(type, "checkpoint") == 0) return WEBHOOK_CHECKPOINT;
    if (strcmp(type, "sample") == 0) return WEBHOOK_SAMPLE;
    if (strcmp(type, "state") != 0) return -1;
    cJSON *o = cJSON_Parse(json);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
    int e = -1;
    if (cJSON_IsString(st)) {
        if (strcmp(st->valuestring, "running") == 0) e = WEBHOOK_START;
        else if (strcmp(st->valuestring, "succeeded") == 0) e = WEBHOOK_COMPLETED;
        else if (strcmp(st->valuestring, "failed") == 0) e = WEBHOOK_FAILED;
        else if (strcmp(st->valuestring, "canceled") == 0) e = WEBHOOK_CANCELED;
    }
    cJSON_Delete(o);
    return e;
}

static void delivery_free(struct delivery *d);

static void enqueue(struct webhook *w, struct delivery *d)
{
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        delivery_free(d);
        return;
    }
    struct delivery **pp = &w->queue;
    while (*pp && (*pp)->due <= d->due) pp = &(*pp)->next; /* by due time, FIFO among equals */
    d->next = *pp;
    *pp = d;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void webhook_observe(void *ctx, const char *job_id, const char *type, const char *json)
{
    struct webhook *w = ctx;
    int e = event_of(type, json);
    if (e < 0) return;
    struct delivery *d = calloc(1, sizeof *d);
    if (!d || !(d->data = strdup(json ? json : "{}"))) {
        free(d);
        return;
    }
    snprintf(d->job, sizeof d->job, "%s", job_id);
    d->event = e;
    d->due = mono_s();
    enqueue(w, d);
}

static void delivery_free(struct delivery *d)
{
    if (!d) return;
    free(d->data);
    free(d->body);
    free(d);
}

static size_t discard(char *p, size_t s, size_t n, void *u)
{
    (void)p, (void)u;
    return s * n;
}

/* one POST; the HTTP status (0 when none came) and curl's error in err */
static long post(struct webhook *w, const struct delivery *d, char *err, size_t errlen)
{
    char ts[32], sig[80], h[4][160];
    snprintf(ts, sizeof ts, "%lld", (long long)time(NULL));
    webhook_sign(w->secret, ts, d->body, sig, sizeof sig);
    snprintf(h[0], sizeof h[0], "X-Ddpmd-Event: %s", event_names[d->event]);
    snprintf(h[1], sizeof h[1], "X-Ddpmd-Delivery: %s", d->id);
    snprintf(h[2], sizeof h[2], "X-Ddpmd-Timestamp: %s", ts);
    snprintf(h[3], sizeof h[3], "X-Ddpmd-Signature: %s", sig);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < 4; i++) hl = curl_slist_append(hl, h[i]);
    CURL *c = curl_easy_init();
    long status = 0;
    err[0] = 0;
    if (!c || !hl) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, d->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect is not followed (SSRF) */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(w->cfg.timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(w->cfg.timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(d->body));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ddpmd-webhook/1");
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(err, errlen, "%s", cerr[0] ? cerr : curl_easy_strerror(rc));
out:
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    return status;
}

/* the body, once: {"event", "delivery", "job": the job's JSON, "data": the job event's data} */
static int render(struct webhook *w, struct delivery *d)
{
    pthread_mutex_lock(&w->mu);
    char *(*fn)(void *, const char *) = w->render;
    void *ctx = w->render_ctx;
    pthread_mutex_unlock(&w->mu);
    char *job = fn ? fn(ctx, d->job) : NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", event_names[d->event]);
    cJSON_AddStringToObject(o, "delivery", d->id);
    cJSON *jo = job ? cJSON_Parse(job) : NULL;
    free(job);
    if (jo)
        cJSON_AddItemToObject(o, "job", jo);
    else
        cJSON_AddStringToObject(o, "job", d->job);
    cJSON *data = cJSON_Parse(d->data);
    cJSON_AddItemToObject(o, "data", data ? data : cJSON_CreateObject());
    d->body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return d->body ? 0 : -1;
}

static void attempt(struct webhook *w, struct delivery *d)
{
    char err[CURL_ERROR_SIZE + 64];
    long status = post(w, d, err, sizeof err);
    d->attempt++;
    int ok = status >= 200 && status < 300;
    int again = !ok && d->attempt < w->cfg.max_attempts;
    double wait = again ? w->cfg.backoff_s * pow(2.0, d->attempt - 1) : 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", event_names[d->event]);
    cJSON_AddStringToObject(o, "delivery", d->id);
    cJSON_AddNumberToObject(o, "attempt", d->attempt);
    cJSON_AddNumberToObject(o, "max_attempts", w->cfg.max_attempts);
    if (status)
        cJSON_AddNumberToObject(o, "status", (double)status);
    else
        cJSON_AddNullToObject(o, "status");
    cJSON_AddBoolToObject(o, "ok", ok);
    if (err[0]) cJSON_AddStringToObject(o, "error", err);
    if (again)
        cJSON_AddNumberToObject(o, "retry_in_s", wait);
    else
        cJSON_AddNullToObject(o, "retry_in_s");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) jobs_event_append(w->db, d->job, "webhook", s, NULL);
    free(s);
    if (again) {
        d->due = mono_s() + wait;
        enqueue(w, d);
    } else {
        if (!ok)
            log_job(LOG_WARN, d->job, "webhook %s (%s) not delivered after %d attempts", d->id,
                    event_names[d->event], d->attempt);
        delivery_free(d);
    }
}

static void *sender(void *arg)
{
    struct webhook *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (w->stopping) break;
        double now = mono_s();
        if (!w->queue || w->queue->due > now) {
            if (!w->queue) {
                pthread_cond_wait(&w->cv, &w->mu);
            } else {
                double t = w->queue->due - now, whole = floor(t);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += (time_t)whole;
                ts.tv_nsec += (long)((t - whole) * 1e9);
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&w->cv, &w->mu, &ts);
            }
            continue;
        }
        struct delivery *d = w->queue;
        w->queue = d->next;
        pthread_mutex_unlock(&w->mu);
        if (d->attempt == 0) {
            /* after the job's registration section: its webhook.json is there if it has one */
            struct webhook_sub sub;
            pthread_mutex_lock(&w->reg);
            int has = sub_load(w, d->job, &sub) == 0;
            pthread_mutex_unlock(&w->reg);
            if (!has || !(sub.events & (1u << d->event))) {
                delivery_free(d);
                pthread_mutex_lock(&w->mu);
                continue;
            }
            snprintf(d->url, sizeof d->url, "%s", sub.url);
            snprintf(d->id, sizeof d->id, "%s-%" PRIu64, d->job, ++w->seq);
            if (render(w, d)) {
                delivery_free(d);
                pthread_mutex_lock(&w->mu);
                continue;
            }
        }
        attempt(w, d);
        pthread_mutex_lock(&w->mu);
    }
    int dropped = 0;
    while (w->queue) {
        struct delivery *d = w->queue;
        w->queue = d->next;
        delivery_free(d);
        dropped++;
    }
    pthread_mutex_unlock(&w->mu);
    if (dropped) log_msg(LOG_WARN, "%d webhook deliveries dropped at shutdown", dropped);
    return NULL;
}

int webhook_start(struct webhook **out, const struct webhook_config *cfg, struct jobs *db,
                  char *err, size_t errlen)
{
    *out = NULL;
    struct webhook *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    w->cfg = *cfg;
    w->db = db;
    snprintf(w->data_dir, sizeof w->data_dir, "%s", cfg->data_dir);
    if (cfg->allow_hosts && strlen(cfg->allow_hosts) >= sizeof w->allow) {
        snprintf(err, errlen, "--webhook-allow is longer than %zu bytes", sizeof w->allow - 1);
        free(w);
        return -1;
    }
    snprintf(w->allow, sizeof w->allow, "%s", cfg->allow_hosts ? cfg->allow_hosts : "");
    if (w->cfg.max_attempts < 1) w->cfg.max_attempts = 1;
    if (!(w->cfg.timeout_s > 0)) w->cfg.timeout_s = 10;
    if (!(w->cfg.backoff_s >= 0)) w->cfg.backoff_s = 1;
    w->cfg.data_dir = w->data_dir;
    w->cfg.allow_hosts = w->allow;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "libcurl did not initialise");
        free(w);
        return -1;
    }
    if (secret_load(w, err, errlen)) {
        curl_global_cleanup();
        free(w);
        return -1;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->reg, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, sender, w)) {
        snprintf(err, errlen, "cannot start the webhook thread");
        webhook_free(w);
        return -1;
    }
    w->thread_on = 1;
    *out = w;
    return 0;
}

void webhook_stop(struct webhook *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->thread_on) pthread_join(w->thread, NULL);
    w->thread_on = 0;
}

void webhook_free(struct webhook *w)
{
    if (!w) return;
    webhook_stop(w);
    while (w->queue) { /* a thread that never started */
        struct delivery *d = w->queue;
        w->queue = d->next;
        delivery_free(d);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->reg);
    pthread_mutex_destroy(&w->mu);
    memset(w->secret, 0, sizeof w->secret);
    curl_global_cleanup();
    free(w);
}

void webhook_set_renderer(struct webhook *w, char *(*fn)(void *, const char *), void *ctx)
{
    pthread_mutex_lock(&w->mu);
    w->render = fn;
    w->render_ctx = ctx;
    pthread_mutex_unlock(&w->mu);
}
