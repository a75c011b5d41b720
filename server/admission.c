/* admission.c - a job planned on the pool's devices (see admission.h): the training job's
 * search or the sampling job's plan against what each device's budget leaves, its reservation
 * there, and the plan entry its row shows.
 */
#include "admission.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend_load.h"
#include "generate.h"
#include "train.h"
#include "upload.h"

static int is_cpu(const struct pool_device_config *dev) { return strcmp(dev->name, "cpu") == 0; }

/* the backend planning for device d runs with on this thread (a cuda device selected here:
 * the CUDA backend's workspace queries use the calling thread's device); NULL with err */
static const struct backend *dev_backend(const struct pool_device_config *dev, char *err,
                                         size_t errlen)
{
    if (is_cpu(dev)) return backend_cpu();
    const struct backend *bk = NULL;
    if (backend_load(dev->name, &bk, err, errlen)) return NULL;
    return bk;
}

static void add_bytes(cJSON *o, const char *k, int64_t v) { cJSON_AddNumberToObject(o, k, (double)v); }

/* the fields every plan entry has (f filled) */
static void fit_fields(cJSON *o, const struct pool_fit *f)
{
    cJSON_AddStringToObject(o, "device", f->device);
    cJSON_AddBoolToObject(o, "fits", f->fits);
    add_bytes(o, "budget_bytes", f->budget);
    add_bytes(o, "plan_bytes", f->plan_bytes);
    add_bytes(o, "host_bytes", f->host_bytes);
    add_bytes(o, "process_baseline_bytes", f->baseline);
    add_bytes(o, "host_data_bytes", f->host_data);
    /* what host_data_bytes is the peak of (the cpu device; zeros elsewhere) */
    cJSON *h = cJSON_AddObjectToObject(o, "host_parts");
    for (int k = 0; h && k < TRAIN_HOST_PART_COUNT; k++)
        add_bytes(h, train_plans_host_part_name((enum train_host_part)k), f->host.part[k]);
    add_bytes(o, "reserved_bytes", f->reserved);
    if (isfinite(f->step_seconds)) cJSON_AddNumberToObject(o, "predicted_step_seconds", f->step_seconds);
    else cJSON_AddNullToObject(o, "predicted_step_seconds");
}

/* the reservation of a plan of plan_bytes (+ host_bytes) on dev */
static void fit_reserve(const struct pool_device_config *dev, struct pool_fit *f)
{
    f->baseline = dev->baseline_bytes;
    f->budget = dev->budget_bytes;
    /* on the cpu the plan's host part is the same memory as its device part */
    f->reserved = f->plan_bytes + (is_cpu(dev) ? f->host_bytes : 0) + f->baseline + f->host_data;
    f->fits = f->fits && f->reserved <= f->budget;
}

int admission_fit_train(const struct pool_device_config *dev, const struct cost_model *m,
                        const struct train_spec *spec, int threads, struct pool_fit *f, cJSON **o,
                        char *err, size_t errlen)
{
    struct train_spec s = *spec;
    struct planner_result r;
    memset(&r, 0, sizeof r);
    memset(f, 0, sizeof *f);
    *o = NULL;
    snprintf(f->device, sizeof f->device, "%s", dev->name);
    f->step_seconds = INFINITY;
    char why[300];
    s.backend = dev_backend(dev, why, sizeof why);
    if (!s.backend) { /* the device went away since the start: it fits nothing */
        fit_reserve(dev, f);
        *o = cJSON_CreateObject();
        if (*o) fit_fields(*o, f), cJSON_AddStringToObject(*o, "why", why);
        return *o ? POOL_OK : POOL_ERR_INTERNAL;
    }
    if (is_cpu(dev)) {
        /* every host byte the job holds besides its plan (train_host_plan: the same parts the
         * child counts), at its peak over the job's phases */
        if (train_host_plan(&s, -1, -1, &f->host, err, errlen)) return POOL_ERR_PLAN;
        f->host_data = train_plans_host_peak(&f->host);
        /* offloading to the host gains nothing where the device is the host */
        if (s.strategy.offload < 0) s.strategy.offload = 0;
    }
    /* the one budget of the plan: what the device's budget leaves, or memory.vram_budget */
    f->vram_budget = dev->budget_bytes - dev->baseline_bytes - f->host_data;
    if (f->vram_budget < 1) f->vram_budget = 1; /* nothing fits: the search still names the smallest plan */
    if (s.vram_budget && s.vram_budget < f->vram_budget) f->vram_budget = s.vram_budget;
    s.vram_budget = f->vram_budget;
    int rc = train_search(&s, m, 0, &r, why, sizeof why);
    const struct planner_candidate *c = rc == 0            ? &r.cand[r.chosen]
                                        : r.smallest >= 0 ? &r.cand[r.smallest]
                                                          : NULL;
    if (!c) {
        snprintf(err, errlen, "%s", why);
        planner_result_free(&r);
        return POOL_ERR_PLAN;
    }
    f->fits = rc == 0;
    f->plan_bytes = (int64_t)c->device_bytes;
    f->host_bytes = (int64_t)c->host_bytes;
    /* the child runs exactly this strategy (its search has nothing left to choose but the grid's
     * chunk, which the same budget decides alike) */
    f->has_strategy = 1;
    f->strategy = c->strategy;
    if (!f->strategy.micro_batch) f->strategy.micro_batch = s.batch;
    f->strategy.offload = c->strategy.offload == 1;
    fit_reserve(dev, f);
    /* the candidate's prediction, scaled to this device by the probe, per thread on the cpu */
    f->step_seconds = c->predicted_s * dev->cost_scale / (is_cpu(dev) && threads > 0 ? threads : 1);
    cJSON *e = cJSON_CreateObject(), *st = cJSON_CreateObject();
    cJSON *search = train_search_json(&r, s.batch);
    if (!e || !st || !search) {
        cJSON_Delete(e);
        cJSON_Delete(st);
        cJSON_Delete(search);
        planner_result_free(&r);
        snprintf(err, errlen, "out of memory");
        return POOL_ERR_INTERNAL;
    }
    fit_fields(e, f);
    cJSON_AddStringToObject(st, "precision", planner_precision_name(f->strategy.precision));
    cJSON_AddNumberToObject(st, "micro_batch", f->strategy.micro_batch);
    cJSON_AddStringToObject(st, "recompute", planner_recompute_name(f->strategy.recompute));
    cJSON_AddStringToObject(st, "offload", f->strategy.offload ? "on" : "off");
    cJSON_AddItemToObject(e, "strategy", st);
    /* the child's memory.vram_budget: the bytes its search was given (its backend enforces
     * them: nothing beyond the plan is allocated) */
    add_bytes(e, "vram_budget", f->vram_budget);
    cJSON_AddItemToObject(e, "parts", train_parts_json(c->parts, c->device_bytes, c->host_bytes));
    /* the candidates the search planned (it stops at the first that fits, fastest predicted
     * first); the rest of the cross product is only counted */
    cJSON *cs = cJSON_GetObjectItemCaseSensitive(search, "candidates");
    int total = cJSON_GetArraySize(cs);
    for (cJSON *it = cs ? cs->child : NULL, *next; it; it = next) {
        next = it->next;
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "planned")))
            cJSON_Delete(cJSON_DetachItemViaPointer(cs, it));
    }
    cJSON_DeleteItemFromObjectCaseSensitive(search, "chosen"); /* an index into the full list */
    cJSON_AddNumberToObject(search, "candidates_total", total);
    if (!f->fits) cJSON_AddStringToObject(e, "why", r.why);
    cJSON_AddItemToObject(e, "search", search);
    planner_result_free(&r);
    *o = e;
    return POOL_OK;
}

int admission_decide(struct pool_admission *adm, cJSON **entries, const int *poisoned, char *err,
                     size_t errlen)
{
    adm->plans = cJSON_CreateArray();
    if (!adm->plans) {
        snprintf(err, errlen, "out of memory");
        return POOL_ERR_INTERNAL;
    }
    for (int d = 0; d < adm->n; d++) {
        cJSON_AddItemToArray(adm->plans, entries[d]);
        entries[d] = NULL; /* adm's now */
    }
    adm->first = -1;
    int healthy = -1, gap = -1;
    for (int d = 0; d < adm->n; d++) {
        const struct pool_fit *f = &adm->fit[d];
        if (f->fits && adm->first < 0) adm->first = d;
        if (f->fits && !poisoned[d] && healthy < 0) healthy = d;
        if (gap < 0 || f->reserved - f->budget < adm->fit[gap].reserved - adm->fit[gap].budget)
            gap = d;
    }
    if (healthy >= 0) {
        adm->first = healthy;
        return POOL_OK;
    }
    if (adm->first >= 0) {
        snprintf(err, errlen, "the job fits only %s, which a sticky CUDA error poisoned (see "
                 "GET /devices); restart the server to use it again", adm->fit[adm->first].device);
        return POOL_ERR_POISONED;
    }
    adm->first = gap;
    size_t n = (size_t)snprintf(err, errlen, "no plan fits any device:");
    for (int d = 0; d < adm->n && n < errlen; d++) {
        const struct pool_fit *f = &adm->fit[d];
        if (f->reserved <= f->budget && f->vram_budget && f->plan_bytes > f->vram_budget)
            n += (size_t)snprintf(err + n, errlen - n, "%s %s: the smallest plan's %" PRId64
                                  " bytes are more than memory.vram_budget's %" PRId64,
                                  d ? ";" : "", f->device, f->plan_bytes, f->vram_budget);
        else
            n += (size_t)snprintf(err + n, errlen - n, "%s %s needs %" PRId64 " bytes (plan %"
                                  PRId64 "%s + process %" PRId64 " + host data %" PRId64 "), its "
                                  "budget is %" PRId64, d ? ";" : "", f->device, f->reserved,
                                  f->plan_bytes,
                                  strcmp(f->device, "cpu") == 0 && f->host_bytes
                                      ? " + its host part"
                                      : "",
                                  f->baseline,
                                  f->host_data, f->budget);
    }
    return POOL_ERR_NEVER_FITS;
}

int admission_fit_sample(const struct pool_device_config *dev, const struct cost_model *m,
                         const struct pool_sample *s, struct pool_fit *f, cJSON **o, char *err,
                         size_t errlen)
{
    memset(f, 0, sizeof *f);
    *o = NULL;
    snprintf(f->device, sizeof f->device, "%s", dev->name);
    f->step_seconds = INFINITY;
    struct graph g;
    struct unet_io io;
    struct plan pl;
    memset(&pl, 0, sizeof pl);
    graph_init(&g);
    int batch = s->batch < s->n ? s->batch : s->n, rc = POOL_ERR_PLAN;
    char why[300];
    const struct backend *bk = dev_backend(dev, why, sizeof why);
    cJSON *e = cJSON_CreateObject();
    if (!e) {
        snprintf(err, errlen, "out of memory");
        rc = POOL_ERR_INTERNAL;
        goto out;
    }
    if (!bk) { /* the device went away since the start: it fits nothing */
        fit_reserve(dev, f);
        fit_fields(e, f);
        cJSON_AddStringToObject(e, "why", why);
        rc = POOL_OK;
        goto out;
    }
    if (generate_plan(&s->model, batch, bk, &g, &io, &pl, err, errlen)) goto out;
    if (is_cpu(dev)) {
        /* every host byte `ddpmd sample` holds besides its plan (train_sample_host_plan), at
         * its peak */
        struct stat st;
        train_sample_host_plan(&s->model, s->timesteps, s->n, batch, &g,
                               stat(s->checkpoint_path, &st) == 0 ? (int64_t)st.st_size : -1,
                               &f->host);
        f->host_data = train_plans_host_peak(&f->host);
    }
    f->fits = 1;
    f->plan_bytes = (int64_t)pl.total_bytes;
    f->host_bytes = (int64_t)pl.host_bytes;
    fit_reserve(dev, f);
    f->step_seconds = cost_predict_step_seconds(m, &pl, &g, batch) * dev->cost_scale;
    fit_fields(e, f);
    add_bytes(e, "arena_without_reuse_bytes", (int64_t)pl.no_reuse_arena_bytes);
    cJSON_AddItemToObject(e, "parts", train_parts_json(pl.parts, pl.total_bytes, pl.host_bytes));
    rc = POOL_OK;
out:
    if (rc == POOL_OK) *o = e;
    else cJSON_Delete(e);
    plan_free(&pl);
    graph_free(&g);
    return rc;
}

