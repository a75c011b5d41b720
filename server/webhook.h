/* webhook.h - job webhooks: a job may name an http(s) URL and the events it wants (start,
 * checkpoint, sample, completed, failed, canceled); the server POSTs a JSON body for each from its
 * own thread with libcurl (never from the job's or a handler's thread), signed with HMAC-SHA256
 * over "TIMESTAMP.BODY" with a per-server secret, retried with exponential backoff a bounded
 * number of times; every attempt is recorded as a "webhook" event of the job that says only
 * "delivered" or "failed". Receivers are served concurrently (one POST in flight per receiver,
 * a bounded queue each, a circuit breaker), and by default never at a loopback, link-local,
 * private or metadata address, checked after DNS resolution on the address connected to.
 */
#ifndef DDPMD_WEBHOOK_H
#define DDPMD_WEBHOOK_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <sys/socket.h>

#include "jobs.h"

#define WEBHOOK_URL_MAX 2048
#define WEBHOOK_SECRET_MIN 16
#define WEBHOOK_MAX_IN_FLIGHT 32     /* POSTs at once, each to another receiver */
#define WEBHOOK_DEST_QUEUE_MAX 256   /* deliveries waiting for one receiver; more are failed */
#define WEBHOOK_INBOX_MAX 4096       /* events not yet filed; more are dropped (logged) */
#define WEBHOOK_BREAKER_FAILS 5      /* failed attempts in a row that open a receiver's breaker */
#define WEBHOOK_BREAKER_OPEN_S 30    /* ...for this long; then one delivery tries it again */

enum webhook_event {
    WEBHOOK_START = 0, WEBHOOK_CHECKPOINT, WEBHOOK_SAMPLE, WEBHOOK_COMPLETED, WEBHOOK_FAILED,
    WEBHOOK_CANCELED, WEBHOOK_EVENT_COUNT
};

struct webhook_config {
    const char *data_dir;       /* DATA/webhook.secret; DATA/jobs/<id>/webhook.json */
    const char *secret_file;    /* NULL: DATA/webhook.secret, made (0600) on first start */
    const char *allow;          /* --webhook-allow: "10.0.0.0/8,127.0.0.1,::1,hooks.internal":
                                 * the private addresses (and hosts, whatever they resolve to)
                                 * webhooks may reach; NULL: public addresses only */
    int max_attempts;           /* deliveries tried at most this often (>= 1) */
    double backoff_s;           /* the wait before attempt k+1 is backoff_s * 2^(k-1) */
    double timeout_s;           /* one attempt, connect included */
};

/* what a job asked for */
struct webhook_sub {
    char url[WEBHOOK_URL_MAX + 1];
    unsigned events;            /* bit (1 << enum webhook_event) */
};

struct webhook;

/* loads or makes the secret and starts the sender thread */
int webhook_start(struct webhook **out, const struct webhook_config *cfg, struct jobs *db,
                  char *err, size_t errlen);
/* stops the thread after the attempt in flight; undelivered events are dropped (and counted in
 * the log line), and so is every event observed from now on */
void webhook_stop(struct webhook *w);
/* frees a stopped webhook, once nothing can call webhook_observe (the store's observer cleared) */
void webhook_free(struct webhook *w);
/* the body's "job": render(ctx, id) gives the job's JSON text (malloc'd) or NULL */
void webhook_set_renderer(struct webhook *w, char *(*render)(void *ctx, const char *job_id),
                          void *ctx);

/* a request's {"url": ..., "events": [...]} -> sub; 0, or -1 with the field path and message */
int webhook_parse(const struct webhook *w, const cJSON *o, struct webhook_sub *sub, char *path,
                  size_t plen, char *msg, size_t mlen);
/* the registration section: a job's events are looked up only after its webhook is stored, so
 * hold it from before the job is queued until webhook_register returned */
void webhook_lock(struct webhook *w);
void webhook_unlock(struct webhook *w);
/* stores sub as DATA/jobs/<id>/webhook.json; 0 ok */
int webhook_register(struct webhook *w, const char *job_id, const struct webhook_sub *sub,
                     char *err, size_t errlen);

/* the store's observer (jobs_set_observer; ctx is the webhook): queues the events jobs want */
void webhook_observe(void *ctx, const char *job_id, const char *type, const char *json);

/* 1 when a webhook may not connect to sa unless --webhook-allow names it: loopback, link-local
 * (cloud metadata 169.254.169.254), private, carrier-grade NAT, unique-local, multicast,
 * reserved and documentation ranges, IPv4 inside IPv6 (mapped, NAT64, 6to4) by its IPv4 */
int webhook_addr_private(const struct sockaddr *sa);

/* "sha256=" + hex HMAC-SHA256(secret, ts "." body) into out (at least 72 bytes) */
void webhook_sign(const char *secret, const char *ts, const char *body, char *out, size_t n);

#endif
