/* log.c - log lines on stderr in text or JSON (see log.h). Each line is built in memory and
 * written with one write(2), so lines from the HTTP threads and the pool never interleave. */
#define _GNU_SOURCE
#include "log.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_format_now = LOG_FORMAT_TEXT;

static const char *const level_names[] = {"info", "warn", "error"};

int log_format_parse(const char *name, enum log_format *out)
{
    if (strcmp(name, "text") == 0) *out = LOG_FORMAT_TEXT;
    else if (strcmp(name, "json") == 0) *out = LOG_FORMAT_JSON;
    else return -1;
    return 0;
}

void log_set_format(enum log_format f) { atomic_store(&log_format_now, (int)f); }
enum log_format log_get_format(void) { return (enum log_format)atomic_load(&log_format_now); }

/* RFC 3339 UTC with milliseconds */
static void log_time(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03dZ", (int)(ts.tv_nsec / 1000000 % 1000));
}

static void log_write(const char *s)
{
    size_t n = strlen(s), off = 0;
    while (off < n) {
        ssize_t w = write(2, s + off, n - off);
        if (w <= 0) return;
        off += (size_t)w;
    }
}

/* o gets time and level first; printed as one line and deleted */
static void log_json(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return;
    size_t n = strlen(s);
    char *line = malloc(n + 2);
    if (line) {
        memcpy(line, s, n);
        line[n] = '\n';
        line[n + 1] = 0;
        log_write(line);
    }
    free(line);
    free(s);
}

static cJSON *log_head(enum log_level level, const char *msg)
{
    char t[40];
    log_time(t, sizeof t);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "time", t);
    cJSON_AddStringToObject(o, "level", level_names[level]);
    cJSON_AddStringToObject(o, "msg", msg);
    return o;
}

/* one line: "ddpmd serve: [job ID: ]MSG" or a JSON object with a "job" field when job is set */
static void log_vline(enum log_level level, const char *job, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (log_get_format() == LOG_FORMAT_JSON) {
        cJSON *o = log_head(level, msg);
        if (!o) return;
        if (job) cJSON_AddStringToObject(o, "job", job);
        log_json(o);
        return;
    }
    char line[2200];
    if (job) snprintf(line, sizeof line, "ddpmd serve: job %.40s: %s\n", job, msg);
    else snprintf(line, sizeof line, "ddpmd serve: %s\n", msg);
    log_write(line);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vline(level, NULL, fmt, ap);
    va_end(ap);
}

void log_job(enum log_level level, const char *job, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vline(level, job, fmt, ap);
    va_end(ap);
}

void log_request(const struct log_request *r)
{
    char msg[400];
    snprintf(msg, sizeof msg, "%s %.300s", r->method ? r->method : "", r->path ? r->path : "");
    if (log_get_format() == LOG_FORMAT_JSON) {
        cJSON *o = log_head(r->status >= 500 || r->status == 0 ? LOG_WARN : LOG_INFO, msg);
        if (!o) return;
        cJSON_AddStringToObject(o, "request_id", r->request_id ? r->request_id : "");
        cJSON_AddStringToObject(o, "method", r->method ? r->method : "");
        if (r->route)
            cJSON_AddStringToObject(o, "route", r->route);
        else
            cJSON_AddNullToObject(o, "route");
        cJSON_AddStringToObject(o, "path", r->path ? r->path : "");
        cJSON_AddNumberToObject(o, "status", r->status);
        cJSON_AddNumberToObject(o, "duration_ms", (double)(long long)(r->duration_ms * 1000) / 1000);
        if (r->job && *r->job) cJSON_AddStringToObject(o, "job", r->job);
        log_json(o);
        return;
    }
    char t[40], line[700];
    log_time(t, sizeof t);
    snprintf(line, sizeof line, "%s %s %u %.3fms request_id=%s%s%s\n", t, msg, r->status,
             r->duration_ms, r->request_id ? r->request_id : "-", r->job && *r->job ? " job=" : "",
             r->job && *r->job ? r->job : "");
    log_write(line);
}
