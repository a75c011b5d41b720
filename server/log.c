/* log.c - log lines on stderr in text or JSON (see log.h). Each line is built in memory and
 * written with one write(2), so lines from the HTTP threads and the pool never interleave; every
 * field is escaped first (utf8_escape), so no field can start a line of its own. */
#define _GNU_SOURCE
#include "log.h"
#include "utf8.h"

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

/* the longest escaped field of an access-log line, in bytes */
#define LOG_FIELD_MAX 400

/* len bytes of s as one log field in out (cap n): control characters and invalid UTF-8 as \xNN,
 * cut on a character or escape boundary with "..." when it does not fit */
static const char *log_field(char *out, size_t n, const char *s, size_t len)
{
    if (utf8_escape(out, n - 3, s, len) < len) strcat(out, "...");
    return out;
}

/* one line: "ddpmd serve: [job ID: ]MSG" or a JSON object with a "job" field when job is set */
static void log_vline(enum log_level level, const char *job, const char *fmt, va_list ap)
{
    char raw[2048], msg[2048], jb[LOG_FIELD_MAX];
    int k = vsnprintf(raw, sizeof raw, fmt, ap);
    /* messages quote user text (file names, ids, a child's stderr): escaped like any field */
    log_field(msg, sizeof msg, raw, k < 0 ? 0 : k >= (int)sizeof raw ? sizeof raw - 1 : (size_t)k);
    if (job) log_field(jb, sizeof jb, job, strlen(job));
    if (log_get_format() == LOG_FORMAT_JSON) {
        cJSON *o = log_head(level, msg);
        if (!o) return;
        if (job) cJSON_AddStringToObject(o, "job", jb);
        log_json(o);
        return;
    }
    char line[2200];
    if (job) snprintf(line, sizeof line, "ddpmd serve: job %.40s: %s\n", jb, msg);
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
    /* every field escaped: the path is the client's, decoded (%0A is a newline) */
    char method[64], path[LOG_FIELD_MAX], rid[LOG_FIELD_MAX], job[LOG_FIELD_MAX], route[128];
#define LOG_ESC(buf, s) log_field(buf, sizeof buf, (s) ? (s) : "", (s) ? strlen(s) : 0)
    LOG_ESC(method, r->method);
    LOG_ESC(path, r->path);
    LOG_ESC(rid, r->request_id);
    LOG_ESC(job, r->job);
    LOG_ESC(route, r->route);
#undef LOG_ESC
    char msg[sizeof method + sizeof path + 2];
    snprintf(msg, sizeof msg, "%s %s", method, path);
    if (log_get_format() == LOG_FORMAT_JSON) {
        cJSON *o = log_head(r->status >= 500 || r->status == 0 ? LOG_WARN : LOG_INFO, msg);
        if (!o) return;
        cJSON_AddStringToObject(o, "request_id", rid);
        cJSON_AddStringToObject(o, "method", method);
        if (r->route)
            cJSON_AddStringToObject(o, "route", route);
        else
            cJSON_AddNullToObject(o, "route");
        cJSON_AddStringToObject(o, "path", path);
        cJSON_AddNumberToObject(o, "status", r->status);
        cJSON_AddNumberToObject(o, "duration_ms", (double)(long long)(r->duration_ms * 1000) / 1000);
        if (*job) cJSON_AddStringToObject(o, "job", job);
        log_json(o);
        return;
    }
    char t[40], line[sizeof msg + sizeof rid + sizeof job + 100];
    log_time(t, sizeof t);
    snprintf(line, sizeof line, "%s %s %u %.3fms request_id=%s%s%s\n", t, msg, r->status,
             r->duration_ms, r->request_id ? rid : "-", *job ? " job=" : "", job);
    log_write(line);
}
