/* webhook.c - job webhooks (see webhook.h). The store's observer only copies an event into a
 * bounded inbox (a mutex); one thread owns libcurl's multi interface: it files each event, with
 * its body rendered once, in the queue of its destination (scheme, host, port) and keeps up to
 * WEBHOOK_MAX_IN_FLIGHT POSTs going at once, one per destination, so a receiver that never
 * answers holds only its own queue. A destination that keeps failing opens its circuit breaker:
 * its queue waits, then one delivery tries it again. Every connection's address is checked by
 * the open-socket callback after DNS resolution, on the address it then connects to, so a
 * rebinding name cannot swap it. A job's subscription lives in its folder, so deliveries
 * continue after a restart.
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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "fsio.h"
#include "log.h"

static const char *const event_names[WEBHOOK_EVENT_COUNT] = {"start", "checkpoint", "sample",
                                                             "completed", "failed", "canceled"};

struct delivery {
    char job[JOBS_ID_LEN];
    int event;
    char *data;                 /* the job event's JSON */
    char *body;                 /* rendered when it is filed under its destination */
    char url[WEBHOOK_URL_MAX + 1];
    char id[40];                /* X-Ddpmd-Delivery */
    int attempt;                /* attempts made */
    double due;                 /* CLOCK_MONOTONIC seconds */
    struct delivery *next;
};

/* one receiver (scheme://host:port): its deliveries in order, at most one POST in flight */
struct dest {
    char key[WEBHOOK_URL_MAX + 16];
    struct delivery *head, *tail;
    int queued;
    int busy;                   /* a POST in flight */
    int fails;                  /* failed attempts in a row */
    double open_until;          /* the breaker: no attempt before this (CLOCK_MONOTONIC) */
    struct dest *next;
};

/* one entry of --webhook-allow: an address range, or a host name as URLs write it */
struct allow_rule {
    int family;                 /* AF_INET, AF_INET6, or 0 for a name */
    unsigned char addr[16];
    int prefix;
    char name[256];
};

struct webhook {
    struct webhook_config cfg;
    char data_dir[FSIO_PATH_MAX];
    char secret[256];
    struct allow_rule *allow;
    int n_allow;
    struct jobs *db;
    int curl_on;                /* curl_global_init done */
    pthread_mutex_t mu;         /* inbox, n_inbox, stopping, render */
    struct delivery *inbox, *inbox_tail;
    int n_inbox;
    int stopping;
    CURLM *multi;               /* curl_multi_wakeup is the one call made from other threads */
    pthread_mutex_t reg;        /* the registration section */
    pthread_t thread;
    int thread_on;
    char *(*render)(void *, const char *);
    void *render_ctx;
    uint64_t seq;
    /* the sender thread's own */
    struct dest *dests;
    struct xfer *xfers;
    int in_flight;
};

/* one POST in flight */
struct xfer {
    struct webhook *w;
    struct dest *dst;
    struct delivery *d;
    CURL *c;
    struct curl_slist *hl;
    char host[256];             /* the URL's host, as the allow list names hosts */
    int refused;                /* the open-socket callback refused an address */
    char refused_addr[INET6_ADDRSTRLEN];
    char err[CURL_ERROR_SIZE];
    struct xfer *next;          /* w->xfers */
};

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

/* ---- where a webhook may go ---- */

static int in_prefix(const unsigned char *a, const unsigned char *net, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, net, (size_t)whole)) return 0;
    return rest == 0 || ((a[whole] ^ net[whole]) & (0xff << (8 - rest)) & 0xff) == 0;
}

/* an IPv6 address that carries an IPv4 one (mapped, compatible, NAT64, 6to4) -> that one */
static int v4_inside(const unsigned char *a6, unsigned char *a4)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const unsigned char zero[12] = {0};
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b};
    if (!memcmp(a6, mapped, 12) || !memcmp(a6, nat64, 12) ||
        (!memcmp(a6, zero, 12) && (a6[12] | a6[13] | a6[14] | a6[15]) && !(a6[12] == 0 && a6[13] == 0 && a6[14] == 0 && a6[15] == 1))) {
        memcpy(a4, a6 + 12, 4);
        return 1;
    }
    if (a6[0] == 0x20 && a6[1] == 0x02) { /* 2002:V4ADDR::/48 */
        memcpy(a4, a6 + 2, 4);
        return 1;
    }
    return 0;
}

int webhook_addr_private(const struct sockaddr *sa)
{
    unsigned char a4[4];
    if (sa->sa_family == AF_INET6) {
        const unsigned char *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        if (v4_inside(a, a4)) goto v4;
        static const struct { unsigned char net[16]; int bits; } r6[] = {
            {{0}, 128},                                   /* :: unspecified */
            {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128}, /* ::1 loopback */
            {{0xfe, 0x80}, 10},                            /* link-local */
            {{0xfe, 0xc0}, 10},                            /* site-local (old) */
            {{0xfc}, 7},                                   /* unique local (fd00:ec2::254 too) */
            {{0xff}, 8},                                   /* multicast */
            {{0x01, 0x00}, 64},                            /* discard-only */
            {{0x20, 0x01, 0x0d, 0xb8}, 32},                /* documentation */
        };
        for (size_t i = 0; i < sizeof r6 / sizeof r6[0]; i++)
            if (in_prefix(a, r6[i].net, r6[i].bits)) return 1;
        return 0;
    }
    if (sa->sa_family != AF_INET) return 1; /* nothing else is a webhook's */
    memcpy(a4, &((const struct sockaddr_in *)sa)->sin_addr.s_addr, 4);
v4:;
    static const struct { unsigned char net[4]; int bits; } r4[] = {
        {{0}, 8},              /* "this network" */
        {{10}, 8},             /* private */
        {{100, 64}, 10},       /* carrier-grade NAT */
        {{127}, 8},            /* loopback */
        {{169, 254}, 16},      /* link-local, cloud metadata (169.254.169.254) */
        {{172, 16}, 12},       /* private */
        {{192, 0, 0}, 24},     /* IETF protocol assignments */
        {{192, 0, 2}, 24},     /* documentation */
        {{192, 88, 99}, 24},   /* 6to4 relay */
        {{192, 168}, 16},      /* private */
        {{198, 18}, 15},       /* benchmarking */
        {{198, 51, 100}, 24},  /* documentation */
        {{203, 0, 113}, 24},   /* documentation */
        {{224}, 4},            /* multicast */
        {{240}, 4},            /* reserved, broadcast */
    };
    for (size_t i = 0; i < sizeof r4 / sizeof r4[0]; i++)
        if (in_prefix(a4, r4[i].net, r4[i].bits)) return 1;
    return 0;
}

/* a URL host that is an address ("127.0.0.1", "[::1]" as curl gives it: "[::1]") -> ss */
static int literal_addr(const char *host, struct sockaddr_storage *ss)
{
    char h[INET6_ADDRSTRLEN + 2];
    size_t n = strlen(host);
    memset(ss, 0, sizeof *ss);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof h) {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = 0;
        char *pct = strchr(h, '%'); /* a zone id: fe80::1%eth0 */
        if (pct) *pct = 0;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        return inet_pton(AF_INET6, h, &s6->sin6_addr) == 1 ? 0 : -1;
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) return 0;
    /* libcurl also connects to the short and numeric forms inet_aton takes (127.1, 2130706433) */
    struct in_addr a;
    if (inet_aton(host, &a)) {
        s4->sin_addr = a;
        return 0;
    }
    return -1;
}

/* may a webhook connect to sa for a URL naming host? */
static int addr_allowed(const struct webhook *w, const char *host, const struct sockaddr *sa)
{
    if (!webhook_addr_private(sa)) return 1;
    unsigned char a[16], a4[4];
    int fam = sa->sa_family;
    if (fam == AF_INET6) {
        memcpy(a, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, 16);
        if (v4_inside(a, a4)) fam = AF_INET, memcpy(a, a4, 4);
    } else if (fam == AF_INET) {
        memcpy(a, &((const struct sockaddr_in *)sa)->sin_addr.s_addr, 4);
    } else {
        return 0;
    }
    for (int i = 0; i < w->n_allow; i++) {
        const struct allow_rule *r = &w->allow[i];
        if (r->family == 0 ? strcasecmp(r->name, host) == 0
                           : r->family == fam && in_prefix(a, r->addr, r->prefix))
            return 1;
    }
    return 0;
}

/* "10.0.0.0/8,127.0.0.1,::1,fd00::/8,hooks.internal" -> w->allow */
static int allow_parse(struct webhook *w, const char *list, char *err, size_t errlen)
{
    if (!list || !*list) return 0;
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    w->allow = calloc((size_t)n, sizeof *w->allow);
    if (!w->allow) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[300];
        if (len == 0 || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = 0;
        struct allow_rule *r = &w->allow[w->n_allow];
        char *slash = strchr(item, '/');
        int bits = -1;
        if (slash) {
            char *end;
            long b = strtol(slash + 1, &end, 10);
            if (*end || end == slash + 1 || b < 0 || b > 128) goto bad;
            bits = (int)b;
            *slash = 0;
        }
        if (inet_pton(AF_INET, item, r->addr) == 1) {
            r->family = AF_INET;
            r->prefix = bits < 0 ? 32 : bits;
            if (r->prefix > 32) goto bad;
        } else if (inet_pton(AF_INET6, item, r->addr) == 1) {
            r->family = AF_INET6;
            r->prefix = bits < 0 ? 128 : bits;
        } else if (!slash && strlen(item) < sizeof r->name &&
                   strspn(item, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == strlen(item)) {
            r->family = 0;
            memcpy(r->name, item, strlen(item) + 1); /* fits: checked above */
        } else {
            goto bad;
        }
        w->n_allow++;
        p += len + (e != NULL);
        continue;
    bad:
        snprintf(err, errlen, "--webhook-allow takes addresses, CIDR ranges (10.0.0.0/8, fd00::/8) "
                              "and host names separated by commas, not '%.200s'", list);
        return -1;
    }
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
    /* an address written in the URL is checked now; a name, after each resolution */
    struct sockaddr_storage ss;
    if (literal_addr(host, &ss) == 0 && !addr_allowed(w, host, (struct sockaddr *)&ss)) {
        snprintf(msg, mlen, "a loopback, link-local, private or metadata address: the server "
                            "sends webhooks there only when --webhook-allow names it");
        goto out;
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

static void delivery_free(struct delivery *d)
{
    if (!d) return;
    free(d->data);
    free(d->body);
    free(d);
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
    pthread_mutex_lock(&w->mu);
    int drop = w->stopping || w->n_inbox >= WEBHOOK_INBOX_MAX;
    if (!drop) {
        if (w->inbox_tail) w->inbox_tail->next = d;
        else w->inbox = d;
        w->inbox_tail = d;
        w->n_inbox++;
    }
    pthread_mutex_unlock(&w->mu);
    if (drop) {
        if (!w->stopping) log_job(LOG_WARN, job_id, "webhook %s dropped: %d events wait already",
                                  event_names[e], WEBHOOK_INBOX_MAX);
        delivery_free(d);
        return;
    }
    curl_multi_wakeup(w->multi);
}

/* a "webhook" event of the job: delivered, or failed, and nothing of what the receiver said */
static void record(struct webhook *w, const struct delivery *d, int ok, double retry_in)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", event_names[d->event]);
    cJSON_AddStringToObject(o, "delivery", d->id);
    cJSON_AddNumberToObject(o, "attempt", d->attempt);
    cJSON_AddNumberToObject(o, "max_attempts", w->cfg.max_attempts);
    cJSON_AddStringToObject(o, "result", ok ? "delivered" : "failed");
    cJSON_AddBoolToObject(o, "ok", ok);
    if (retry_in >= 0)
        cJSON_AddNumberToObject(o, "retry_in_s", retry_in);
    else
        cJSON_AddNullToObject(o, "retry_in_s");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) jobs_event_append(w->db, d->job, "webhook", s, NULL);
    free(s);
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

/* the destination of a URL: "scheme://host:port", the port filled in */
static int dest_key(const char *url, char *key, size_t n)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL;
    int rc = -1;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        for (char *p = host; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        rc = snprintf(key, n, "%s://%s:%s", scheme, host, port) < (int)n ? 0 : -1;
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return rc;
}

static struct dest *dest_get(struct webhook *w, const char *key)
{
    for (struct dest *x = w->dests; x; x = x->next)
        if (strcmp(x->key, key) == 0) return x;
    struct dest *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    snprintf(x->key, sizeof x->key, "%s", key);
    x->next = w->dests;
    w->dests = x;
    return x;
}

/* an event from the inbox: its subscription read, its body rendered, filed under its receiver */
static void file_delivery(struct webhook *w, struct delivery *d)
{
    /* after the job's registration section: its webhook.json is there if it has one */
    struct webhook_sub sub;
    pthread_mutex_lock(&w->reg);
    int has = sub_load(w, d->job, &sub) == 0;
    pthread_mutex_unlock(&w->reg);
    char key[WEBHOOK_URL_MAX + 16];
    if (!has || !(sub.events & (1u << d->event)) || dest_key(sub.url, key, sizeof key)) {
        delivery_free(d);
        return;
    }
    snprintf(d->url, sizeof d->url, "%s", sub.url);
    snprintf(d->id, sizeof d->id, "%s-%" PRIu64, d->job, ++w->seq);
    struct dest *x = render(w, d) == 0 ? dest_get(w, key) : NULL;
    if (!x) {
        delivery_free(d);
        return;
    }
    if (x->queued >= WEBHOOK_DEST_QUEUE_MAX) {
        log_job(LOG_WARN, d->job, "webhook %s (%s) dropped: %d deliveries wait for its receiver",
                d->id, event_names[d->event], WEBHOOK_DEST_QUEUE_MAX);
        record(w, d, 0, -1);
        delivery_free(d);
        return;
    }
    d->due = clock_now_s();
    d->next = NULL;
    if (x->tail) x->tail->next = d;
    else x->head = d;
    x->tail = d;
    x->queued++;
}

static size_t discard(char *p, size_t s, size_t n, void *u)
{
    (void)p, (void)u;
    return s * n;
}

/* every connection a webhook makes: its address is checked here, after resolution, and the
 * socket made here is the one connected to it (no second resolution to rebind) */
static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *a)
{
    struct xfer *x = clientp;
    if (purpose != CURLSOCKTYPE_IPCXN || !addr_allowed(x->w, x->host, &a->addr)) {
        x->refused = 1;
        const void *ip = a->family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&a->addr)->sin6_addr
                                               : (const void *)&((struct sockaddr_in *)&a->addr)->sin_addr;
        if (!inet_ntop(a->family, ip, x->refused_addr, sizeof x->refused_addr))
            snprintf(x->refused_addr, sizeof x->refused_addr, "?");
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* starts the POST of x->dst's first delivery */
static int xfer_start(struct webhook *w, struct dest *dst)
{
    struct delivery *d = dst->head;
    struct xfer *x = calloc(1, sizeof *x);
    if (!x) return -1;
    x->w = w;
    x->dst = dst;
    x->d = d;
    CURLU *u = curl_url();
    char *host = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, d->url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK)
        snprintf(x->host, sizeof x->host, "%s", host);
    curl_free(host);
    curl_url_cleanup(u);
    char ts[32], sig[80], h[4][160];
    snprintf(ts, sizeof ts, "%lld", (long long)time(NULL));
    webhook_sign(w->secret, ts, d->body, sig, sizeof sig);
    snprintf(h[0], sizeof h[0], "X-Ddpmd-Event: %s", event_names[d->event]);
    snprintf(h[1], sizeof h[1], "X-Ddpmd-Delivery: %s", d->id);
    snprintf(h[2], sizeof h[2], "X-Ddpmd-Timestamp: %s", ts);
    snprintf(h[3], sizeof h[3], "X-Ddpmd-Signature: %s", sig);
    x->hl = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < 4 && x->hl; i++) x->hl = curl_slist_append(x->hl, h[i]);
    x->c = curl_easy_init();
    if (!x->c || !x->hl) goto fail;
    CURL *c = x->c;
    curl_easy_setopt(c, CURLOPT_URL, d->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect is not followed (SSRF) */
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");       /* the address checked is the receiver's */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(w->cfg.timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(w->cfg.timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hl);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(d->body));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, x->err);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ddpmd-webhook/1");
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, x);
    curl_easy_setopt(c, CURLOPT_PRIVATE, x);
    if (curl_multi_add_handle(w->multi, c) != CURLM_OK) goto fail;
    dst->busy = 1;
    w->in_flight++;
    x->next = w->xfers;
    w->xfers = x;
    return 0;
fail:
    curl_easy_cleanup(x->c);
    curl_slist_free_all(x->hl);
    free(x);
    return -1;
}

/* a POST ended (rc: curl's result): the delivery done, or its next attempt scheduled */
static void xfer_done(struct webhook *w, struct xfer *x, CURLcode rc)
{
    struct dest *dst = x->dst;
    struct delivery *d = x->d;
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(w->multi, x->c);
    curl_easy_cleanup(x->c);
    curl_slist_free_all(x->hl);
    for (struct xfer **pp = &w->xfers; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    dst->busy = 0;
    w->in_flight--;
    d->attempt++;
    int ok = status >= 200 && status < 300;
    /* what the receiver or the network said goes to the operator's log, not the job's events */
    if (!ok) {
        if (x->refused)
            log_job(LOG_WARN, d->job, "webhook %s to %s: address %s refused (loopback, link-local, "
                    "private or metadata; see --webhook-allow)", d->id, dst->key, x->refused_addr);
        else if (status)
            log_job(LOG_WARN, d->job, "webhook %s to %s: HTTP %ld", d->id, dst->key, status);
        else
            log_job(LOG_WARN, d->job, "webhook %s to %s: %s", d->id, dst->key,
                    x->err[0] ? x->err : curl_easy_strerror(rc));
    }
    free(x);
    double now = clock_now_s();
    if (ok) {
        dst->fails = 0;
    } else if (++dst->fails >= WEBHOOK_BREAKER_FAILS) {
        dst->open_until = now + WEBHOOK_BREAKER_OPEN_S;
        if (dst->fails == WEBHOOK_BREAKER_FAILS)
            log_msg(LOG_WARN, "webhook receiver %s failed %d times in a row: its deliveries wait "
                    "%d s", dst->key, dst->fails, WEBHOOK_BREAKER_OPEN_S);
    }
    int again = !ok && d->attempt < w->cfg.max_attempts;
    double wait = again ? w->cfg.backoff_s * pow(2.0, d->attempt - 1) : -1;
    record(w, d, ok, wait);
    if (again) {
        d->due = now + wait;
        return;
    }
    if (!ok)
        log_job(LOG_WARN, d->job, "webhook %s (%s) not delivered after %d attempts", d->id,
                event_names[d->event], d->attempt);
    dst->head = d->next;
    if (!dst->head) dst->tail = NULL;
    dst->queued--;
    delivery_free(d);
}

/* starts what is due; the seconds until the next thing is due (capped) */
static double dispatch(struct webhook *w)
{
    double now = clock_now_s(), next = 1.0;
    for (struct dest **pp = &w->dests; *pp;) {
        struct dest *x = *pp;
        if (!x->head && !x->busy && x->open_until <= now) { /* an idle receiver is forgotten */
            *pp = x->next;
            free(x);
            continue;
        }
        pp = &x->next;
        if (x->busy || !x->head) continue;
        double at = fmax(x->head->due, x->open_until);
        if (at > now) {
            next = fmin(next, at - now);
            continue;
        }
        if (w->in_flight >= WEBHOOK_MAX_IN_FLIGHT) continue;
        if (xfer_start(w, x)) { /* out of memory: try again later */
            x->head->due = now + 1;
            continue;
        }
    }
    return next;
}

static void *sender(void *arg)
{
    struct webhook *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int stop = w->stopping;
        struct delivery *in = w->inbox;
        w->inbox = w->inbox_tail = NULL;
        w->n_inbox = 0;
        pthread_mutex_unlock(&w->mu);
        if (stop) {
            while (in) {
                struct delivery *n = in->next;
                delivery_free(in);
                in = n;
            }
            break;
        }
        while (in) {
            struct delivery *n = in->next;
            file_delivery(w, in);
            in = n;
        }
        double wait = dispatch(w);
        int running = 0;
        curl_multi_perform(w->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(w->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                struct xfer *x = NULL;
                CURLcode rc = m->data.result;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
                if (x) xfer_done(w, x, rc);
                wait = 0; /* its receiver's next delivery may be due */
            }
        if (wait > 0) curl_multi_poll(w->multi, NULL, 0, (int)(wait * 1000) + 1, NULL);
    }
    /* the transfers in flight and every queued delivery are dropped */
    int dropped = 0;
    while (w->xfers) {
        struct xfer *x = w->xfers;
        w->xfers = x->next;
        curl_multi_remove_handle(w->multi, x->c);
        curl_easy_cleanup(x->c);
        curl_slist_free_all(x->hl);
        free(x);
    }
    while (w->dests) {
        struct dest *x = w->dests;
        w->dests = x->next;
        while (x->head) {
            struct delivery *d = x->head;
            x->head = d->next;
            dropped++;
            delivery_free(d);
        }
        free(x);
    }
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
    if (w->cfg.max_attempts < 1) w->cfg.max_attempts = 1;
    if (!(w->cfg.timeout_s > 0)) w->cfg.timeout_s = 10;
    if (!(w->cfg.backoff_s >= 0)) w->cfg.backoff_s = 1;
    w->cfg.data_dir = w->data_dir;
    w->cfg.allow = NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->reg, NULL);
    if (allow_parse(w, cfg->allow, err, errlen)) {
        webhook_free(w);
        return -1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "libcurl did not initialise");
        webhook_free(w);
        return -1;
    }
    w->curl_on = 1;
    if (secret_load(w, err, errlen)) {
        webhook_free(w);
        return -1;
    }
    if (!(w->multi = curl_multi_init())) {
        snprintf(err, errlen, "out of memory");
        webhook_free(w);
        return -1;
    }
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
    pthread_mutex_unlock(&w->mu);
    if (w->multi) curl_multi_wakeup(w->multi);
    if (w->thread_on) pthread_join(w->thread, NULL);
    w->thread_on = 0;
}

void webhook_free(struct webhook *w)
{
    if (!w) return;
    webhook_stop(w);
    while (w->inbox) { /* a thread that never started */
        struct delivery *d = w->inbox;
        w->inbox = d->next;
        delivery_free(d);
    }
    if (w->multi) curl_multi_cleanup(w->multi);
    pthread_mutex_destroy(&w->reg);
    pthread_mutex_destroy(&w->mu);
    memset(w->secret, 0, sizeof w->secret);
    if (w->curl_on) curl_global_cleanup();
    free(w->allow);
    free(w);
}

void webhook_set_renderer(struct webhook *w, char *(*fn)(void *, const char *), void *ctx)
{
    pthread_mutex_lock(&w->mu);
    w->render = fn;
    w->render_ctx = ctx;
    pthread_mutex_unlock(&w->mu);
}
