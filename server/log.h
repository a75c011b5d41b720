/* log.h - the server's log lines on stderr: `--log-format text` (the readable default) or `json`
 * (one object per line: time, level, msg and the request's fields), safe from any thread (one
 * write(2) per line).
 */
#ifndef DDPMD_LOG_H
#define DDPMD_LOG_H

enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };
enum log_level { LOG_INFO = 0, LOG_WARN, LOG_ERROR };

/* "text" | "json" -> 0, else -1 */
int log_format_parse(const char *name, enum log_format *out);
void log_set_format(enum log_format f);
enum log_format log_get_format(void);

/* a message; in text it reads "ddpmd serve: MSG" as the server always printed */
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* a message about one job: JSON adds "job"; text reads "ddpmd serve: job ID: MSG" */
void log_job(enum log_level level, const char *job, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* one answered HTTP request (the access log); job may be NULL */
struct log_request {
    const char *request_id, *method, *route, *path, *job;
    unsigned status;            /* 0: the client went away before an answer */
    double duration_ms;
};
void log_request(const struct log_request *r);

#endif
