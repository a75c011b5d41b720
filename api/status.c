/* status.c - the service's own state: GET /healthz, /readyz, /devices and /metrics. */
#define _GNU_SOURCE
#include "routes.h"

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

#include "jobs.h"
#include "metrics.h"
#include "pool.h"

enum MHD_Result h_healthz(struct ctx *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    /* whether requests need a token (a token file is loaded): the page shows its box by it */
    cJSON_AddBoolToObject(o, "auth_required", c->a->cfg.tokens && c->a->cfg.n_tokens > 0);
    return http_send_json(c, 200, o, NULL, NULL);
}

/* one device's figures (GET /devices, GET /readyz) */
static cJSON *device_json(const struct pool_device_state *d, int waiting_key)
{
    cJSON *o = cJSON_CreateObject();
    int cpu = strcmp(d->cfg.name, "cpu") == 0;
    cJSON_AddStringToObject(o, "name", d->cfg.name);
    cJSON_AddStringToObject(o, "kind", cpu ? "cpu" : "cuda");
    if (d->cfg.total_bytes > 0) cJSON_AddNumberToObject(o, "total_bytes", (double)d->cfg.total_bytes);
    else cJSON_AddNullToObject(o, "total_bytes");
    cJSON_AddNumberToObject(o, "budget_bytes", (double)d->cfg.budget_bytes);
    cJSON_AddNumberToObject(o, "overhead_bytes", (double)d->cfg.baseline_bytes);
    cJSON_AddNumberToObject(o, "process_baseline_bytes", (double)d->cfg.baseline_bytes);
    cJSON_AddNumberToObject(o, "reserved_bytes", (double)d->reserved);
    cJSON_AddNumberToObject(o, "free_bytes", (double)(d->cfg.budget_bytes - d->reserved));
    cJSON_AddNumberToObject(o, "running_jobs", d->running);
    if (waiting_key) cJSON_AddNumberToObject(o, "waiting_jobs", d->waiting);
    cJSON_AddNumberToObject(o, "threads_used", d->threads_used);
    cJSON_AddBoolToObject(o, "poisoned", d->poisoned);
    http_json_str_or_null(o, "poisoned_by", d->poisoned ? d->poison : NULL);
    return o;
}

enum MHD_Result h_readyz(struct ctx *c)
{
    int n = 0;
    int store = jobs_count(c->a->cfg.db, -1, &n) == JOBS_OK;
    struct pool_device_state ds[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    const struct pool_config *pc = pool_config_of(c->a->cfg.pool);
    cJSON *o = cJSON_CreateObject(), *devs = cJSON_CreateArray(), *bad = cJSON_CreateArray();
    for (int i = 0; i < nd; i++) {
        cJSON *d = device_json(&ds[i], 0);
        if (strcmp(ds[i].cfg.name, "cpu") == 0) cJSON_AddNumberToObject(d, "cores", pc->cores);
        http_json_put_array(devs, d);
        if (ds[i].poisoned) http_json_put_array(bad, cJSON_CreateString(ds[i].cfg.name));
    }
    /* a poisoned device fails readiness: the server needs a restart to use it again */
    int ready = store && c->a->admitting && cJSON_GetArraySize(bad) == 0;
    cJSON_AddStringToObject(o, "status", ready ? "ready" : "not ready");
    cJSON_AddBoolToObject(o, "store", store);
    cJSON_AddBoolToObject(o, "admitting", c->a->admitting);
    http_json_put(o, "poisoned", bad);
    http_json_put(o, "devices", devs);
    return http_send_json(c, ready ? 200 : 503, o, NULL, NULL);
}

/* GET /devices: each device's budget and what is on it now */
enum MHD_Result h_devices(struct ctx *c)
{
    struct pool_device_state ds[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    const struct pool_config *pc = pool_config_of(c->a->cfg.pool);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "devices");
    for (int i = 0; i < nd; i++) {
        cJSON *d = device_json(&ds[i], 1);
        if (strcmp(ds[i].cfg.name, "cpu") == 0) cJSON_AddNumberToObject(d, "cores", pc->cores);
        http_json_put_array(arr, d);
    }
    return http_send_json(c, 200, o, NULL, NULL);
}

/* GET /metrics: Prometheus text format 0.0.4 */
enum MHD_Result h_metrics(struct ctx *c)
{
    struct pool_device_state ds[POOL_MAX_DEVICES];
    struct metrics_device md[POOL_MAX_DEVICES];
    int nd = pool_devices(c->a->cfg.pool, ds, POOL_MAX_DEVICES);
    for (int i = 0; i < nd; i++)
        md[i] = (struct metrics_device){ds[i].cfg.name, ds[i].cfg.budget_bytes, ds[i].reserved,
                                        ds[i].running, ds[i].poisoned};
    struct metrics_gauges g = {.devices = md, .n_devices = nd};
    g.jobs_ok = 1;
    for (int s = 0; s < JOB_STATE_COUNT && g.jobs_ok; s++)
        g.jobs_ok = jobs_count(c->a->cfg.db, s, &g.jobs[s]) == JOBS_OK;
    size_t len = 0;
    char *text = metrics_render(&g, &len);
    if (!text) return http_send_oom(c);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return http_send_oom(c);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rr = http_respond(c, 200, resp);
    MHD_destroy_response(resp);
    return rr;
}
