/* train.c - the training loop of one job on the CPU backend (see train.h for the contract). Its
 * sample grids run inside the job's one reservation: a nested inference plan over the EMA. */
#include "train.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend_load.h"
#include "checkpoint.h"
#include "dataset.h"
#include "ddpm.h"
#include "exec.h"
#include "export.h"
#include "fsio.h"
#include "image.h"
#include "init.h"
#include "philox.h"
#include "plan.h"
#include "planner.h"
#include "plot.h"
#include "sample.h"
#include "sampler.h"
#include "testhold.h"
#include "unet.h"

/* fixed timesteps of the validation loss, cycled over the held-out images */
static const int val_ts[] = {50, 250, 500, 750, 950};
#define VAL_SEED_SALT 0x5EEDull

struct job {
    const struct train_spec *spec;
    const struct train_opts *o;
    struct dataset *ds;
    struct dataset_loader *loader;
    /* the step at the micro-batch (e), the uneven last micro-batch (re, nested in e's
     * reservation, sharing its parameters, gradients and optimizer state; NULL when none) and
     * the sample grids (se, nested too, weights read in place from e's EMA) */
    struct train_plans tp;
    struct exec *e, *re, *se;
    struct ddpm_schedule sch;
    size_t per;                 /* elements of one image */
    /* the effective batch (train.batch samples) on the host: sample i of it is drawn by i, its
     * index in the effective batch, whatever micro-batch uploads it */
    float *x0, *eps, *xt, *tgt, *tf;
    int *ti;
    /* logged history for loss.csv and the curve */
    int64_t *log_step;
    float *log_loss, *log_val;
    int n_log, cap_log;
    int64_t last_ckpt;          /* step of the newest checkpoint on disk, -1 for none */
    char dir_ckpt[FSIO_PATH_MAX], dir_samples[FSIO_PATH_MAX];
};

/* room a job's folder leaves for the names under it ("/checkpoints/step-%08lld.safetensors"
 * and its temporary) */
#define TRAIN_NAME_ROOM 64

static int stop_requested(const struct train_opts *o) { return o->stop && *o->stop; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the CPU seconds of the calling thread (it runs the steps: serial code and its share of every
 * parallel region) */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p; path fits FSIO_PATH_MAX (checked by the caller) */
static int mkdir_p1(const char *path)
{
    char buf[FSIO_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* The step of an exact checkpoint name "step-%08lld.safetensors" (as checkpoint() writes it), or
 * -1: temporaries ("....safetensors.tmp.x1Yz2w"), copies (".bak", ".orig") and names with other
 * padding ("step-3.safetensors", "step-000000003.safetensors") are not checkpoints. ext is
 * ".safetensors" or ".png" (sample grids). */
static int64_t step_of_name(const char *name, const char *ext)
{
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    int64_t v = 0;
    int nd = 0;
    for (; *p >= '0' && *p <= '9'; p++, nd++) {
        if (nd >= 18) return -1;
        v = v * 10 + (*p - '0');
    }
    if (nd < 8 || strcmp(p, ext) != 0) return -1;
    char want[64];
    snprintf(want, sizeof want, "step-%08" PRId64 "%s", v, ext);
    return strcmp(want, name) == 0 ? v : -1;
}

/* whether dir's entry name is a regular file (a FIFO or a folder under a checkpoint's name is
 * skipped: opening a FIFO would block) */
static int is_regular_at(int dfd, const char *name)
{
    struct stat st;
    return fstatat(dfd, name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* the steps of dir's checkpoints, newest first, into a malloc'd *steps; -1 when dir cannot be
 * read or out of memory */
static int scan_checkpoints(const char *dir, int64_t **steps, int *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = step_of_name(de->d_name, ".safetensors");
        if (s < 0 || !is_regular_at(dirfd(d), de->d_name)) continue;
        if (*n == cap) {
            int64_t *a = realloc(*steps, (size_t)(cap ? 2 * cap : 64) * sizeof *a);
            if (!a) {
                rc = -1;
                break;
            }
            *steps = a;
            cap = cap ? 2 * cap : 64;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return -1;
    }
    if (*n) qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
    return 0;
}

int train_latest_checkpoint(const char *out_dir, char *path, size_t len, int64_t *step)
{
    char dir[FSIO_PATH_MAX];
    int64_t *steps = NULL;
    int n = 0;
    if (fsio_path(dir, sizeof dir, NULL, 0, "%s/checkpoints", out_dir) ||
        scan_checkpoints(dir, &steps, &n) || n == 0) {
        free(steps);
        return -1;
    }
    *step = steps[0];
    free(steps);
    return fsio_path(path, len, NULL, 0, "%s/step-%08" PRId64 ".safetensors", dir, *step);
}

/* removes all but the newest keep checkpoints (exact names only) */
static void prune_checkpoints(const char *dir, int keep)
{
    int64_t *steps;
    int n;
    if (scan_checkpoints(dir, &steps, &n)) return;
    for (int i = keep; i < n; i++) {
        char p[FSIO_PATH_MAX];
        if (!fsio_path(p, sizeof p, NULL, 0, "%s/step-%08" PRId64 ".safetensors", dir, steps[i]))
            unlink(p), export_cache_remove(p); /* the checkpoint first (export.h) */
    }
    free(steps);
}

/* Removes the temporaries an interrupted write (kill -9, power loss) left in one of the job's
 * folders: "FINAL.tmp.*" regular files whose FINAL is a name this job writes there (a
 * checkpoint or sample grid of exact name, loss.csv, loss.png; and loss.csv.tmp). Nothing else
 * is touched. */
static void remove_stale_temps(const char *dir, const char *ext, int quiet)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *tmp = strstr(de->d_name, FSIO_TMP_INFIX);
        /* "loss.csv.tmp": the one fixed temporary name of earlier versions */
        int legacy = !ext && strcmp(de->d_name, "loss.csv.tmp") == 0;
        if (!legacy && (!tmp || !tmp[sizeof FSIO_TMP_INFIX - 1])) continue;
        char base[256] = "";
        if (tmp) snprintf(base, sizeof base, "%.*s", (int)(tmp - de->d_name), de->d_name);
        int ours = legacy || (ext ? step_of_name(base, ext) >= 0
                                  : strcmp(base, "loss.csv") == 0 || strcmp(base, "loss.png") == 0);
        if (!ours || !is_regular_at(dirfd(d), de->d_name)) continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0 && !quiet)
            fprintf(stderr, "ddpmd: removed %s/%s, left by an interrupted write\n", dir,
                    de->d_name);
    }
    closedir(d);
}

static void log_skipped(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "ddpmd: %s\n", line);
}

static int open_data(struct job *j, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    int c = s->model.in_channels, size = s->model.image_size;
    enum dataset_status st;
    if (strcmp(s->dataset, "fashion-mnist") == 0) {
        st = dataset_open_fmnist(&j->ds, DATASET_FMNIST_DIR, DATASET_FMNIST_TRAIN, c, size,
                                 s->fmnist_resize ? DATASET_FIT_RESIZE : DATASET_FIT_PAD, err,
                                 errlen);
    } else {
        struct dataset_report rep;
        st = dataset_open_folder(&j->ds, s->dataset, c, size, &rep, log_skipped, NULL, err,
                                 errlen);
        if (!st && rep.skipped && !j->o->quiet)
            fprintf(stderr, "ddpmd: %d of %d images in %s could not be read and are skipped\n",
                    rep.skipped, rep.found, s->dataset);
    }
    if (st) return -1;
    if (s->validation) {
        int v = s->validation;
        if (v >= dataset_count(j->ds)) {
            snprintf(err, errlen, "data.validation %d leaves no training images (%d in all)", v,
                     dataset_count(j->ds));
            return -1;
        }
        if (dataset_split(j->ds, v, s->seed, err, errlen)) return -1;
    }
    return 0;
}

/* the most images one forward of a job's sample grid takes: output.samples, at most 16 */
static int grid_cap(const struct train_spec *s) { return s->samples < 16 ? s->samples : 16; }

/* the chunk a job's sample grids run in under st: st's sample_batch (at most grid_cap), or
 * grid_cap when it leaves it open */
static int grid_batch(const struct train_spec *s, const struct strategy *st)
{
    int cap = grid_cap(s);
    return st->sample_batch > 0 && st->sample_batch < cap ? st->sample_batch : cap;
}

/* the samples of a strategy's micro-batch: its micro_batch, or the whole batch */
static int micro_of(const struct train_spec *s, const struct strategy *st)
{
    return st->micro_batch > 0 && st->micro_batch < s->batch ? st->micro_batch : s->batch;
}

/* the training graph at the strategy's micro-batch (or at `n` samples when n > 0: the uneven
 * last micro-batch) */
static int build_step_graph_n(const struct train_spec *s, const struct strategy *st, int n,
                              struct graph *g, struct unet_io *io, int *target)
{
    graph_init(g);
    if (unet_build_training(g, &s->model, n > 0 ? n : micro_of(s, st), io, target, NULL))
        return -1;
    return st->precision == STRATEGY_PRECISION_F32 ? 0 : graph_set_precision(g, st->precision);
}

static int build_step_graph(const struct train_spec *s, const struct strategy *st,
                            struct graph *g, struct unet_io *io, int *target)
{
    return build_step_graph_n(s, st, 0, g, io, target);
}

/* the step's plan options under st: its micro-batch resolved */
static struct plan_opts step_opts(const struct train_spec *s, const struct strategy *st,
                                  struct plan_ws_cache *ws, int bound_only)
{
    struct plan_opts po = {.strategy = *st, .ws_cache = ws, .bound_only = bound_only};
    po.strategy.micro_batch = micro_of(s, st);
    return po;
}

/* g's plan under st, with the uneven last micro-batch when st's micro-batch does not divide
 * train.batch (rg built here, rp sharing p's persistent part: plan_make_shared) and the sample
 * grids in chunks of grid_batch (sg, sp), both nested in p (reserved there) */
static int plan_step(const struct train_spec *s, const struct strategy *st, const struct graph *g,
                     struct plan *p, struct graph *rg, struct unet_io *rio, int *rtarget,
                     struct plan *rp, struct graph *sg, struct unet_io *sio, struct plan *sp,
                     char *err, size_t errlen)
{
    const struct backend *bk = backend_or_cpu(s->backend);
    struct plan_opts po = step_opts(s, st, NULL, 0);
    int rest = s->batch % po.strategy.micro_batch;
    po.strategy.sample_batch = grid_batch(s, st);
    if (plan_make(p, g, bk, &po)) {
        snprintf(err, errlen, "cannot plan the training step");
        return -1;
    }
    if (rest) {
        po.strategy.micro_batch = rest;
        graph_free(rg);
        if (build_step_graph_n(s, st, rest, rg, rio, rtarget)) {
            snprintf(err, errlen, "cannot build the model's last micro-batch: %s", rg->err);
            return -1;
        }
        if (plan_make_shared(rp, rg, bk, &po, p, g)) {
            snprintf(err, errlen, "cannot plan the last micro-batch of %d", rest);
            return -1;
        }
        plan_reserve_nested(p, rp);
    }
    graph_free(sg); /* sample_job_plan_nested initialises it again */
    if (sample_job_plan_nested(&s->model, grid_batch(s, st), p, g, bk, sg, sio, sp, err,
                               errlen))
        return -1;
    plan_reserve_nested(p, sp);
    return 0;
}

void train_plans_free(struct train_plans *tp)
{
    plan_free(&tp->sp);
    plan_free(&tp->rp);
    plan_free(&tp->p);
    graph_free(&tp->sg);
    graph_free(&tp->rg);
    graph_free(&tp->g);
}

int train_plans_make(struct train_plans *tp, const struct train_spec *s,
                     const struct strategy *st, char *err, size_t errlen)
{
    struct strategy plain = strategy_plain(s->batch);
    if (!st) st = &plain;
    memset(tp, 0, sizeof *tp);
    graph_init(&tp->g);
    graph_init(&tp->rg);
    graph_init(&tp->sg);
    tp->micro = micro_of(s, st);
    tp->rest = s->batch % tp->micro;
    tp->grid = grid_batch(s, st);
    if (build_step_graph(s, st, &tp->g, &tp->io, &tp->target)) {
        snprintf(err, errlen, "cannot build the model: %s", tp->g.err);
        return -1;
    }
    return plan_step(s, st, &tp->g, &tp->p, &tp->rg, &tp->rio, &tp->rtarget, &tp->rp, &tp->sg,
                     &tp->sio, &tp->sp, err, errlen);
}

/* The search's target (planner_target): a candidate is plan_step's plans, its bytes known
 * without making the nested ones again and again. A nested plan's bytes past where it starts in
 * its host (an uneven last micro-batch past the host's inputs, a sample grid past the host's
 * transient part and, over an offloading host, its own copy of the weights) are the same
 * whatever the host (plan_make_shared, plan_make_nested), so each is planned once per search;
 * test_planner_search holds every candidate's bytes to train_plans_make's. */
#define SEARCH_MAX_REST 64
struct search_ctx {
    const struct train_spec *s;
    struct plan_ws_cache *ws;
    size_t grid_own[17];                /* by chunk size; 0: not planned yet */
    struct search_rest {
        int precision, n, recompute;
        size_t own;
    } rest[SEARCH_MAX_REST];
    int n_rest;
};

/* the uneven last micro-batch's bytes past host's inputs */
static int rest_own(struct search_ctx *c, const struct strategy *st, int n,
                    const struct plan *host, const struct graph *host_g, size_t *own)
{
    for (int i = 0; i < c->n_rest; i++)
        if (c->rest[i].precision == st->precision && c->rest[i].n == n &&
            c->rest[i].recompute == st->recompute) {
            *own = c->rest[i].own;
            return 0;
        }
    struct graph rg;
    struct unet_io rio;
    struct plan rp;
    int rtarget, rc = -1;
    struct plan_opts po = step_opts(c->s, st, c->ws, 0);
    po.strategy.micro_batch = n;
    memset(&rp, 0, sizeof rp);
    if (!build_step_graph_n(c->s, st, n, &rg, &rio, &rtarget) &&
        !plan_make_shared(&rp, &rg, backend_or_cpu(c->s->backend), &po, host, host_g)) {
        *own = rp.total_bytes - host->inputs_off;
        if (c->n_rest < SEARCH_MAX_REST)
            c->rest[c->n_rest++] = (struct search_rest){st->precision, n, st->recompute, *own};
        rc = 0;
    }
    plan_free(&rp);
    graph_free(&rg);
    return rc;
}

/* a sample grid's bytes past host's transient part and its own weights, in chunks of b */
static int grid_own(struct search_ctx *c, int b, const struct plan *host,
                    const struct graph *host_g, size_t *own)
{
    if (c->grid_own[b]) {
        *own = c->grid_own[b];
        return 0;
    }
    struct graph sg;
    struct unet_io sio;
    struct plan sp;
    char err[256];
    int rc = sample_job_plan_nested(&c->s->model, b, host, host_g,
                                    backend_or_cpu(c->s->backend), &sg, &sio, &sp, err,
                                    sizeof err);
    if (!rc) {
        *own = c->grid_own[b] = sp.total_bytes - host->transient_off -
                                (sp.weights_from_host ? sp.params_bytes : 0);
    }
    plan_free(&sp);
    graph_free(&sg);
    return rc ? -1 : 0;
}

/* where p's nested plans end: its uneven last micro-batch (left out of a bound: smaller than
 * the step, it seldom ends later, and a bound without it is still a lower bound) and a grid in
 * chunks of b */
static int search_end(struct search_ctx *c, const struct strategy *st, const struct graph *g,
                      const struct plan *p, int bound, int b, size_t *end)
{
    size_t own, e = 0;
    int micro = micro_of(c->s, st), rest = c->s->batch % micro;
    if (rest && !bound) {
        if (rest_own(c, st, rest, p, g, &own)) return -1;
        if (p->inputs_off + own > e) e = p->inputs_off + own;
    }
    if (grid_own(c, b, p, g, &own)) return -1;
    own += p->transient_off + (p->offload ? p->params_bytes : 0);
    *end = own > e ? own : e;
    return 0;
}

static int search_build(void *ctx, const struct strategy *st, struct graph *g)
{
    struct search_ctx *c = ctx;
    struct unet_io io;
    int target;
    return build_step_graph(c->s, st, g, &io, &target);
}

static int search_plan(void *ctx, const struct strategy *st, const struct graph *g,
                       size_t budget, struct plan *p)
{
    struct search_ctx *c = ctx;
    struct plan_opts po = step_opts(c->s, st, c->ws, 0);
    if (plan_make(p, g, backend_or_cpu(c->s->backend), &po)) return -1;
    /* the largest chunk that fits (halving), or the forced one */
    int b = grid_batch(c->s, st);
    size_t end;
    for (;;) {
        if (search_end(c, st, g, p, 0, b, &end)) return -1;
        if (st->sample_batch > 0 || !budget || (end <= budget && p->total_bytes <= budget) ||
            b == 1)
            break;
        b = (b + 1) / 2;
    }
    p->strategy.sample_batch = b;
    plan_reserve(p, end);
    return 0;
}

static int search_bound(void *ctx, const struct strategy *st, const struct graph *g, int tight,
                        size_t *bytes)
{
    struct search_ctx *c = ctx;
    struct plan_opts po = step_opts(c->s, st, c->ws, 1);
    if (!tight) {
        *bytes = plan_persistent_bytes(g, &po);
        return 0;
    }
    struct plan p;
    size_t end = 0;
    int rc = plan_make(&p, g, backend_or_cpu(c->s->backend), &po) ||
             search_end(c, st, g, &p, 1, st->sample_batch > 0 ? grid_batch(c->s, st) : 1,
                        &end);
    *bytes = p.total_bytes > end ? p.total_bytes : end;
    plan_free(&p);
    return rc ? -1 : 0;
}

int train_cost_model(struct cost_model *m, char *err, size_t errlen)
{
    cost_model_default(m);
    const char *path = getenv("DDPMD_COST_MODEL");
    if (!path || !path[0]) return 0;
    char why[256], txt[1 << 14];
    FILE *f = fsio_fopen_read(path, why, sizeof why);
    if (!f) {
        snprintf(err, errlen, "DDPMD_COST_MODEL: %s", why);
        return -1;
    }
    size_t n = fread(txt, 1, sizeof txt - 1, f);
    int big = n == sizeof txt - 1 && fgetc(f) != EOF;
    fclose(f);
    txt[n] = 0;
    if (big || memchr(txt, 0, n)) {
        snprintf(err, errlen, "DDPMD_COST_MODEL: not a cost model file (text under %zu bytes)",
                 sizeof txt);
        return -1;
    }
    if (cost_model_parse(m, txt, why, sizeof why)) {
        snprintf(err, errlen, "DDPMD_COST_MODEL: %s", why);
        return -1;
    }
    return 0;
}

int train_search(const struct train_spec *s, int plan_all, struct planner_result *r, char *err,
                 size_t errlen)
{
    struct cost_model m;
    memset(r, 0, sizeof *r);
    r->chosen = r->smallest = -1;
    if (train_cost_model(&m, err, errlen)) return -1;
    struct search_ctx *c = calloc(1, sizeof *c);
    if (c) c->ws = plan_ws_cache_new();
    if (!c || !c->ws) {
        if (c) free(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->s = s;
    struct planner_target t = {c, search_build, search_plan, search_bound};
    int rc = planner_search(&s->strategy, s->batch, (size_t)s->vram_budget, &m, &t, plan_all, r);
    plan_ws_cache_free(c->ws);
    free(c);
    if (rc) {
        snprintf(err, errlen, "%s", r->why);
        return -1;
    }
    return 0;
}

cJSON *train_parts_json(const struct plan_part_bytes *parts, size_t device, size_t host)
{
    cJSON *o = cJSON_CreateObject(), *dv = cJSON_CreateObject(), *hs = cJSON_CreateObject();
    if (!o || !dv || !hs) {
        cJSON_Delete(o);
        cJSON_Delete(dv);
        cJSON_Delete(hs);
        return NULL;
    }
    for (int k = 0; k < PLAN_PART_COUNT; k++) {
        cJSON_AddNumberToObject(dv, plan_part_name((enum plan_part)k), (double)parts[k].device);
        cJSON_AddNumberToObject(hs, plan_part_name((enum plan_part)k), (double)parts[k].host);
    }
    cJSON_AddItemToObject(o, "device", dv);
    cJSON_AddItemToObject(o, "host", hs);
    cJSON_AddNumberToObject(o, "device_bytes", (double)device);
    cJSON_AddNumberToObject(o, "host_bytes", (double)host);
    return o;
}

cJSON *train_search_json(const struct planner_result *r, int batch)
{
    cJSON *o = cJSON_CreateObject(), *cs = cJSON_CreateArray();
    if (!o || !cs) {
        cJSON_Delete(o);
        cJSON_Delete(cs);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "batch", batch);
    cJSON_AddNumberToObject(o, "vram_budget", (double)r->budget);
    for (int i = 0; i < r->n_cand; i++) {
        const struct planner_candidate *c = &r->cand[i];
        cJSON *j = cJSON_CreateObject();
        if (!j) continue;
        cJSON_AddStringToObject(j, "precision", planner_precision_name(c->strategy.precision));
        cJSON_AddNumberToObject(j, "micro_batch",
                                c->strategy.micro_batch ? c->strategy.micro_batch : batch);
        cJSON_AddStringToObject(j, "recompute", planner_recompute_name(c->strategy.recompute));
        cJSON_AddStringToObject(j, "offload", c->strategy.offload == 1 ? "on" : "off");
        if (c->planned) cJSON_AddNumberToObject(j, "sample_batch", c->strategy.sample_batch);
        cJSON_AddNumberToObject(j, "predicted_step_seconds", c->predicted_s);
        cJSON_AddBoolToObject(j, "planned", c->planned);
        if (!c->planned && c->bound_bytes)
            cJSON_AddNumberToObject(j, "bound_bytes", (double)c->bound_bytes);
        if (c->planned) cJSON_AddItemToObject(j, "bytes",
                                              train_parts_json(c->parts, c->device_bytes,
                                                               c->host_bytes));
        cJSON_AddBoolToObject(j, "fits", c->fits);
        cJSON_AddBoolToObject(j, "failed", c->failed);
        cJSON_AddBoolToObject(j, "chosen", i == r->chosen);
        cJSON_AddItemToArray(cs, j);
    }
    cJSON_AddItemToObject(o, "candidates", cs);
    if (r->chosen >= 0) cJSON_AddNumberToObject(o, "chosen", r->chosen);
    else cJSON_AddNullToObject(o, "chosen");
    cJSON_AddStringToObject(o, "why", r->why);
    return o;
}

int train_plan_job(const struct train_spec *s, struct graph *g, struct unet_io *io, int *target,
                   struct plan *p, struct graph *sg, struct unet_io *sio, struct plan *sp,
                   char *err, size_t errlen)
{
    graph_init(g);
    graph_init(sg);
    memset(p, 0, sizeof *p);
    memset(sp, 0, sizeof *sp);
    struct planner_result r;
    if (train_search(s, 0, &r, err, errlen)) {
        int built = r.n_cand > 0 && !r.cand[0].failed;
        planner_result_free(&r);
        struct strategy whole = strategy_plain(s->batch);
        if (!built && build_step_graph(s, &whole, g, io, target))
            snprintf(err, errlen, "cannot build the model: %s", g->err);
        return -1;
    }
    struct strategy st = r.cand[r.chosen].strategy;
    planner_result_free(&r);
    graph_free(g);
    graph_free(sg);
    struct train_plans tp;
    int rc = train_plans_make(&tp, s, &st, err, errlen);
    /* p's reservation covers the last micro-batch; its graph and plan are the job's own */
    *g = tp.g;
    *io = tp.io;
    *target = tp.target;
    *p = tp.p;
    *sg = tp.sg;
    *sio = tp.sio;
    *sp = tp.sp;
    plan_free(&tp.rp);
    graph_free(&tp.rg);
    return rc;
}

/* the strategy a job runs: train_opts' when given, else the search's choice for the spec */
static int job_strategy(const struct train_spec *s, const struct train_opts *o,
                        struct strategy *st, char *err, size_t errlen)
{
    if (o->strategy) {
        *st = *o->strategy;
        return 0;
    }
    struct planner_result r;
    int rc = train_search(s, 0, &r, err, errlen);
    if (!rc) *st = r.cand[r.chosen].strategy;
    planner_result_free(&r);
    return rc;
}

int train_plan(const struct train_spec *s, struct graph *g, struct unet_io *io, int *target,
               struct plan *p, char *err, size_t errlen)
{
    struct graph sg;
    struct unet_io sio;
    struct plan sp;
    int rc = train_plan_job(s, g, io, target, p, &sg, &sio, &sp, err, errlen);
    plan_free(&sp);
    graph_free(&sg);
    return rc;
}

void train_sampler_config(const struct train_spec *s, struct sampler_config *sc)
{
    sampler_config_default(sc);
    sc->prediction = s->prediction == SPEC_PRED_V ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;
    /* DDIM cannot take more steps than the schedule has timesteps (diffusion.timesteps >= 2) */
    if (sc->steps > s->timesteps) sc->steps = s->timesteps;
}

static int build(struct job *j, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    struct strategy st;
    if (job_strategy(s, j->o, &st, err, errlen) ||
        train_plans_make(&j->tp, s, &st, err, errlen))
        return -1;
    /* the budget is enforced by the backend too: nothing beyond it is ever allocated */
    struct exec_error xe = {0};
    struct exec_opts eo = {.threads = s->threads, .budget = (size_t)s->vram_budget,
                           .init_error = &xe};
    if (exec_init(&j->e, &j->tp.g, &j->tp.p, backend_or_cpu(s->backend), &eo)) {
        snprintf(err, errlen, "cannot allocate the plan's %zu bytes: %s (%s)",
                 j->tp.p.total_bytes, exec_status_name(xe.status), xe.msg);
        return -1;
    }
    /* allocate nothing: the last micro-batch and the grids run in the reservation just made */
    struct exec_error ee = {0};
    if (j->tp.rest && exec_init_nested(&j->re, &j->tp.rg, &j->tp.rp, j->e,
                                       &(struct exec_opts){.init_error = &ee})) {
        snprintf(err, errlen, "cannot place the last micro-batch in the job's reservation: %s",
                 ee.msg);
        return -1;
    }
    if (exec_init_nested(&j->se, &j->tp.sg, &j->tp.sp, j->e,
                         &(struct exec_opts){.init_error = &ee})) {
        snprintf(err, errlen, "cannot place the sample grids in the job's reservation: %s",
                 ee.msg);
        return -1;
    }
    j->per = j->tp.g.tensors[j->tp.io.x]->numel / (size_t)j->tp.micro;
    size_t img = j->per * (size_t)s->batch;
    j->x0 = malloc(img * sizeof(float));
    j->eps = malloc(img * sizeof(float));
    j->xt = malloc(img * sizeof(float));
    j->tgt = malloc(img * sizeof(float));
    j->tf = malloc((size_t)s->batch * sizeof(float));
    j->ti = malloc((size_t)s->batch * sizeof(int));
    if (!j->x0 || !j->eps || !j->xt || !j->tgt || !j->tf || !j->ti ||
        ddpm_schedule_init(&j->sch, s->timesteps, s->beta_schedule, s->beta_start, s->beta_end)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Fields of a resumed run's spec that may differ from its checkpoint's: they change what is
 * written and when, not the numbers of any step (train.steps also sets the learning-rate
 * schedule's length: stated, since the run is then not the uninterrupted run of either spec). */
static int resume_may_change(const char *path)
{
    return strcmp(path, "train.steps") == 0 || strncmp(path, "output.", 7) == 0 ||
           strcmp(path, "init_from") == 0;
}

/* Compares the two canonical spec documents field by field. Every difference is stated: the
 * changeable ones on stderr (unless quiet), the others appended to refused ("; "-separated).
 * Returns the number of refused differences. */
static int spec_diff(const cJSON *was, const cJSON *now, const char *prefix, int quiet,
                     char *refused, size_t rlen)
{
    int bad = 0;
    const cJSON *w;
    cJSON_ArrayForEach(w, was)
    {
        char path[160];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", w->string);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(now, w->string);
        if (cJSON_IsObject(w) && cJSON_IsObject(n)) {
            bad += spec_diff(w, n, path, quiet, refused, rlen);
            continue;
        }
        if (n && cJSON_Compare(w, n, 1)) continue;
        char *ws = cJSON_PrintUnformatted(w), *ns = n ? cJSON_PrintUnformatted(n) : NULL;
        if (resume_may_change(path)) {
            if (!quiet)
                fprintf(stderr, "ddpmd: resuming with %s %.60s (the checkpoint's spec has %.60s)\n",
                        path, ns ? ns : "(none)", ws ? ws : "?");
        } else {
            size_t len = strlen(refused);
            snprintf(refused + len, rlen - len, "%s%s is %.60s there, %.60s here", len ? "; " : "",
                     path, ws ? ws : "?", ns ? ns : "(none)");
            bad++;
        }
        free(ws);
        free(ns);
    }
    cJSON_ArrayForEach(w, now) /* a field only the new spec has */
        if (!cJSON_GetObjectItemCaseSensitive(was, w->string)) {
            size_t len = strlen(refused);
            snprintf(refused + len, rlen - len, "%s%s%s%s is new", len ? "; " : "", prefix,
                     prefix[0] ? "." : "", w->string);
            bad++;
        }
    return bad;
}

/* whether the checkpoint's spec (saved) allows an exact resume under spec; err says why not */
static int resume_check(const struct train_spec *saved, const struct train_spec *spec,
                        int64_t step, const char *path, int quiet, char *err, size_t errlen)
{
    char *a = spec_to_json(saved), *b = spec_to_json(spec);
    cJSON *ja = a ? cJSON_Parse(a) : NULL, *jb = b ? cJSON_Parse(b) : NULL;
    char refused[1024] = "";
    int rc = -1;
    if (!ja || !jb) {
        snprintf(err, errlen, "out of memory comparing the specs");
    } else if (spec_diff(ja, jb, "", quiet, refused, sizeof refused)) {
        snprintf(err, errlen, "%s was made with a different spec, and resuming would not continue "
                 "that run exactly: %s (train elsewhere with --out, or restore those values)",
                 path, refused);
    } else if (step > spec->steps) {
        snprintf(err, errlen, "%s is at step %" PRId64 ", beyond this spec's train.steps %d", path,
                 step, spec->steps);
    } else {
        rc = 0;
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(a);
    free(b);
    return rc;
}

/* The newest usable checkpoint, newest first: one that does not open (truncated, corrupt,
 * metadata step not its name's) is renamed NAME.corrupt, said on stderr, and the previous one is
 * tried. Returns 1 with *st open when one was found, 0 when none, -1 on an error. */
static int open_newest(struct job *j, char *path, size_t plen, struct safetensors **st,
                       struct train_spec *saved, int64_t *step, char *err, size_t errlen)
{
    int64_t *steps = NULL;
    int n = 0, rc = 0;
    if (scan_checkpoints(j->dir_ckpt, &steps, &n)) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "cannot list %s: %s", j->dir_ckpt, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        char why[600];
        if (fsio_path(path, plen, err, errlen, "%s/step-%08" PRId64 ".safetensors", j->dir_ckpt,
                      steps[i])) {
            rc = -1;
            break;
        }
        if (checkpoint_open(st, path, saved, step, why, sizeof why) == 0) {
            if (*step == steps[i]) {
                rc = 1;
                break;
            }
            snprintf(why, sizeof why, "its metadata says step %" PRId64, *step);
            safetensors_free(*st);
            *st = NULL;
        }
        char aside[FSIO_PATH_MAX];
        int moved = !fsio_path(aside, sizeof aside, NULL, 0, "%s.corrupt", path) &&
                    rename(path, aside) == 0;
        fprintf(stderr, "ddpmd: cannot resume from %s (%s)%s%s; %s\n", path, why,
                moved ? ", kept as " : "", moved ? aside : "",
                i + 1 < n ? "trying the previous checkpoint" : "no older checkpoint");
    }
    free(steps);
    return rc;
}

static int init_weights(struct job *j, int64_t *start, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    char path[FSIO_PATH_MAX];
    int64_t step = 0;
    *start = 0;
    if (j->o->resume) {
        struct safetensors *st = NULL;
        struct train_spec saved;
        int found = open_newest(j, path, sizeof path, &st, &saved, &step, err, errlen);
        if (found < 0) return -1;
        if (found) {
            if (resume_check(&saved, s, step, path, j->o->quiet, err, errlen)) {
                safetensors_free(st);
                return -1;
            }
            int rc = checkpoint_apply(st, j->e, &j->tp.g, CHECKPOINT_ALL, 0, err, errlen);
            safetensors_free(st);
            if (rc) return -1;
            *start = step;
            j->last_ckpt = step;
            if (j->o->stats) j->o->stats->resumed = 1;
            if (!j->o->quiet)
                fprintf(stderr, "ddpmd: resuming from %s (step %" PRId64 ")\n", path, step);
            return 0;
        }
        if (j->o->resume != TRAIN_RESUME_IF_ANY) {
            snprintf(err, errlen, "nothing to resume: no usable checkpoint in %s (to start fresh "
                     "when there is none, ask to resume if possible: --resume-or-start)",
                     j->dir_ckpt);
            return -1;
        }
        if (!j->o->quiet)
            fprintf(stderr, "ddpmd: no checkpoint in %s; starting at step 0\n", j->dir_ckpt);
    } else {
        /* a fresh run would prune an earlier run's checkpoints as "newer" ones: refuse */
        int64_t *steps = NULL;
        int n = 0;
        if (scan_checkpoints(j->dir_ckpt, &steps, &n) == 0 && n > 0) {
            snprintf(err, errlen, "%s already holds checkpoints of an earlier run (up to step %"
                     PRId64 "): continue it with --resume, or train into another --out (nothing "
                     "was changed)", j->dir_ckpt, steps[0]);
            free(steps);
            return -1;
        }
        free(steps);
    }
    if (s->init_from[0]) {
        struct safetensors *st = NULL;
        if (checkpoint_open(&st, s->init_from, NULL, NULL, err, errlen)) return -1;
        int rc = checkpoint_apply(st, j->e, &j->tp.g, CHECKPOINT_WEIGHTS, 0, err, errlen);
        safetensors_free(st);
        if (rc) return -1;
    } else {
        size_t maxn = 0;
        for (int i = 0; i < j->tp.g.n_tensors; i++)
            if (j->tp.g.tensors[i]->kind == TENSOR_PARAM && j->tp.g.tensors[i]->numel > maxn)
                maxn = j->tp.g.tensors[i]->numel;
        float *w = malloc(maxn * sizeof *w);
        if (!w) return -1;
        for (int i = 0; i < j->tp.g.n_tensors; i++)
            if (j->tp.g.tensors[i]->kind == TENSOR_PARAM) {
                init_param(j->tp.g.tensors[i], s->seed, w);
                exec_upload(j->e, i, w);
            }
        free(w);
    }
    return exec_reset_state(j->e) ? -1 : 0;
}

/* timesteps, noise and the model's input/target for the effective batch of step s (x0 already
 * loaded): sample i's numbers are drawn by (seed, step, i, element), i its index in the effective
 * batch, so every micro-batch split (and the loader's flips, drawn by the run's sample index
 * step * batch + i) gives each sample the same numbers */
static void make_inputs(struct job *j, int64_t step, uint64_t seed, const int *fixed_t)
{
    const struct train_spec *s = j->spec;
    for (int i = 0; i < s->batch; i++) {
        j->ti[i] = fixed_t ? fixed_t[i]
                           : (int)(philox_u32_at(seed, PHILOX_TAG_TIMESTEP, (uint64_t)step,
                                                 (uint32_t)i, 0, 0) %
                                   (uint32_t)s->timesteps);
        j->tf[i] = (float)j->ti[i];
        for (size_t e = 0; e < j->per; e++)
            j->eps[(size_t)i * j->per + e] =
                philox_normal(seed, PHILOX_TAG_NOISE, (uint64_t)step, (uint32_t)i, 0, (uint32_t)e);
    }
    ddpm_q_sample(j->xt, j->x0, j->eps, j->ti, s->batch, j->per, &j->sch);
    if (s->prediction == SPEC_PRED_V)
        sampler_v_target(j->tgt, j->x0, j->eps, j->ti, s->batch, j->per, &j->sch);
    else
        memcpy(j->tgt, j->eps, (size_t)s->batch * j->per * sizeof(float));
}

/* The effective batch made by make_inputs through its micro-batches, in order: samples
 * [i0, i0 + n) go to the micro-batch executor (the last, uneven one to j->re), forward and
 * backward when train (the gradients zeroed by the first, accumulated by the others; the loss
 * gradient scaled by n / batch, so the sum is the whole batch's mean-loss gradient; dropout
 * drawn by the sample's index in the effective batch, sample_base i0), forward only in
 * evaluation mode otherwise. *loss: the mean over the effective batch. Nonzero on a failure,
 * with the executor's reason in err. */
static int run_batch(struct job *j, int train, uint64_t seed, int64_t step, float *loss,
                     char *err, size_t errlen)
{
    const int batch = j->spec->batch, micro = j->tp.micro;
    double sum = 0;
    for (int i0 = 0; i0 < batch; i0 += micro) {
        int n = batch - i0 < micro ? batch - i0 : micro, last = n != micro;
        struct exec *e = last ? j->re : j->e;
        const struct unet_io *io = last ? &j->tp.rio : &j->tp.io;
        int target = last ? j->tp.rtarget : j->tp.target;
        size_t off = (size_t)i0 * j->per;
        float l = 0, w = (float)n / (float)batch;
        if (exec_upload(e, io->x, j->xt + off) || exec_upload(e, io->t, j->tf + i0) ||
            exec_upload(e, target, j->tgt + off) ||
            (train ? exec_forward_backward(e, i0 == 0, w, seed, (uint64_t)step, i0, &l)
                   : exec_forward(e, &l))) {
            if (err)
                snprintf(err, errlen, "samples %d..%d of the batch: %.256s", i0, i0 + n - 1,
                         exec_last_error(e)->msg);
            return -1;
        }
        sum += (double)w * l;
    }
    *loss = (float)sum;
    return 0;
}

/* progress of a long phase ("validation", "sampling"): a counter on a terminal, a JSON line
 * {"event":E,"step":N,"done":D,"total":T} otherwise */
static void report_phase(const struct train_opts *o, const char *event, int64_t step, int done,
                         int total)
{
    if (o->quiet) return;
    if (o->progress) {
        printf("\r  %s %d/%d   ", event, done, total);
        if (done == total) printf("\n");
    } else {
        printf("{\"event\":\"%s\",\"step\":%" PRId64 ",\"done\":%d,\"total\":%d}\n", event, step,
               done, total);
    }
    fflush(stdout);
}

/* a JSON line {"event":E,"step":N} (checkpoint, samples, stopped, done); nothing on a terminal */
static void report_event(const struct train_opts *o, const char *event, int64_t step)
{
    if (o->quiet || o->progress) return;
    printf("{\"event\":\"%s\",\"step\":%" PRId64 "}\n", event, step);
    fflush(stdout);
}

/* mean loss over the held-out images (whole batches of them) at fixed timesteps and noise; NaN
 * when there are none or a stop was requested (polled between batches) */
static float validation_loss(struct job *j, int64_t step)
{
    const struct train_spec *s = j->spec;
    int nv = dataset_val_count(j->ds), nb = nv / s->batch;
    if (nb == 0) return NAN;
    double sum = 0;
    int t[65536];
    for (int b = 0; b < nb; b++) {
        if (stop_requested(j->o)) return NAN;
        if (dataset_val_batch(j->ds, b * s->batch, s->batch, j->x0, NULL)) return NAN;
        for (int i = 0; i < s->batch; i++) t[i] = val_ts[(b * s->batch + i) % 5] * s->timesteps / 1000;
        make_inputs(j, (int64_t)b, s->seed ^ VAL_SEED_SALT, t);
        float loss = 0;
        if (run_batch(j, 0, 0, 0, &loss, NULL, 0)) return NAN;
        sum += loss;
        if (nb > 1) report_phase(j->o, "validation", step, b + 1, nb);
    }
    return (float)(sum / nb);
}

struct sample_progress_ctx {
    const struct train_opts *o;
    int64_t step;
};

static void sample_progress(int done, int total, void *ctx)
{
    const struct sample_progress_ctx *c = ctx;
    report_phase(c->o, "sampling", c->step, done, total);
}

/* the sample grid of step: SAMPLE_OK, SAMPLE_STOPPED (a stop request: nothing written) or
 * SAMPLE_FAILED with err */
static int save_samples(struct job *j, int64_t step, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    struct sample_job sj;
    int n = s->samples, rc = SAMPLE_FAILED;
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, err, errlen, "%s/step-%08" PRId64 ".png", j->dir_samples,
                  step))
        return SAMPLE_FAILED;
    float *img = malloc((size_t)n * j->per * sizeof *img);
    if (!img) {
        snprintf(err, errlen, "out of memory for %d samples", n);
        return SAMPLE_FAILED;
    }
    /* the nested executor reads the EMA in place (with offload: a copy uploaded from the host
     * block), and the next training step uploads its own inputs again (the grid overwrote
     * them) */
    sample_job_bind_nested(&sj, &j->tp.sg, &j->tp.sio, &j->tp.sp, j->se, j->tp.grid,
                           &s->model);
    /* with offload the EMA is in host memory: the grid's weights are uploaded from it first */
    if (exec_nested_sync(j->se)) {
        snprintf(err, errlen, "sampling at step %" PRId64 " failed: %s", step,
                 exec_last_error(j->se)->msg);
        goto out;
    }
    struct sampler_config sc;
    train_sampler_config(s, &sc);
    sc.stop = j->o->stop;
    struct sample_progress_ctx pc = {j->o, step};
    int cols = (int)ceil(sqrt((double)n));
    rc = sample_job_run(&sj, &j->sch, &sc, s->seed, n, img, sample_progress, &pc);
    if (rc == SAMPLE_STOPPED) {
        if (!j->o->quiet && j->o->progress) printf("\n");
        goto out;
    }
    if (rc != SAMPLE_OK) {
        const struct exec_error *ee = exec_last_error(j->se);
        snprintf(err, errlen, "sampling at step %" PRId64 " failed: %s", step,
                 ee->status ? ee->msg : "no timesteps for the grid's sampler");
        goto out;
    }
    if (image_save_grid_png(path, img, n, s->model.out_channels, s->model.image_size,
                            s->model.image_size, cols, 2, err, errlen)) {
        rc = SAMPLE_FAILED;
        goto out;
    }
    report_event(j->o, "samples", step);
out:
    sample_job_free(&sj); /* a view: clears it, frees nothing of the job's */
    free(img);
    return rc;
}

static void log_push(struct job *j, int64_t step, float loss, float val)
{
    if (j->n_log == j->cap_log) {
        int cap = j->cap_log ? 2 * j->cap_log : 1024;
        int64_t *a = realloc(j->log_step, (size_t)cap * sizeof *a);
        if (a) j->log_step = a;
        float *b = realloc(j->log_loss, (size_t)cap * sizeof *b);
        if (b) j->log_loss = b;
        float *c = realloc(j->log_val, (size_t)cap * sizeof *c);
        if (c) j->log_val = c;
        if (!a || !b || !c) return;
        j->cap_log = cap;
    }
    j->log_step[j->n_log] = step;
    j->log_loss[j->n_log] = loss;
    j->log_val[j->n_log] = val;
    j->n_log++;
}

/* loss.csv: keeps rows of steps <= start (a resumed run rewrites what followed) */
static void csv_reload(struct job *j, int64_t start)
{
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, NULL, 0, "%s/loss.csv", j->o->out_dir)) return;
    FILE *f = fsio_fopen_read(path, NULL, 0);
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long long st;
        float l;
        if (sscanf(line, "%lld,%f", &st, &l) != 2 || st > start) continue;
        const char *v = strchr(line, ',');
        v = v ? strchr(v + 1, ',') : NULL;
        log_push(j, st, l, v && v[1] != '\n' && v[1] ? strtof(v + 1, NULL) : NAN);
    }
    fclose(f);
}

/* loss.csv and loss.png, each replaced atomically; a failed write fails (err says why) */
static int csv_write(struct job *j, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX];
    size_t cap = 32 + (size_t)j->n_log * 128, len = 0; /* a row is at most 117 bytes */
    char *text = malloc(cap);
    if (!text) {
        snprintf(err, errlen, "out of memory writing loss.csv");
        return -1;
    }
    len += (size_t)snprintf(text, cap, "step,loss,val_loss\n");
    for (int i = 0; i < j->n_log; i++) {
        if (isnan(j->log_val[i]))
            len += (size_t)snprintf(text + len, cap - len, "%" PRId64 ",%.6f,\n", j->log_step[i],
                                    j->log_loss[i]);
        else
            len += (size_t)snprintf(text + len, cap - len, "%" PRId64 ",%.6f,%.6f\n",
                                    j->log_step[i], j->log_loss[i], j->log_val[i]);
    }
    int rc = fsio_path(path, sizeof path, err, errlen, "%s/loss.csv", j->o->out_dir) ||
             fsio_write_atomic_text(path, text, err, errlen);
    free(text);
    if (rc) return -1;
    if (fsio_path(path, sizeof path, err, errlen, "%s/loss.png", j->o->out_dir) ||
        plot_loss_png(path, j->log_step, j->log_loss, j->log_val, j->n_log, err, errlen))
        return -1;
    return 0;
}

static int checkpoint(struct job *j, int64_t step, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, err, errlen, "%s/step-%08" PRId64 ".safetensors",
                  j->dir_ckpt, step) ||
        checkpoint_save(path, j->e, &j->tp.g, j->spec, step, err, errlen))
        return -1;
    j->last_ckpt = step;
    prune_checkpoints(j->dir_ckpt, j->spec->keep_last);
    report_event(j->o, "checkpoint", step);
    return csv_write(j, err, errlen);
}

static void fmt_eta(char *buf, size_t n, double s)
{
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)s;
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* below this an f16 run whose loss stays non-finite fails: the smallest half subnormal, 2^-24 */
#define LOSS_SCALE_FLOOR 5.9604645e-8f

static void report(struct job *j, int64_t step, float loss, float avg, float val, float lr,
                   float norm, double ips, double eta, double step_s)
{
    const struct train_spec *s = j->spec;
    if (j->o->quiet) return;
    if (j->o->progress) {
        int width = 24, fill = (int)((double)width * (double)step / (double)s->steps);
        char bar[32], e[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fmt_eta(e, sizeof e, eta);
        char scaling[64] = "";
        if (j->tp.g.precision == STRATEGY_PRECISION_F16)
            snprintf(scaling, sizeof scaling, "  scale %g, %" PRId64 " skipped",
                     (double)exec_loss_scaler(j->e)->scale, exec_loss_scaler(j->e)->skipped);
        printf("\r[%s] %" PRId64 "/%d  loss %.4f (avg %.4f)%s  %.1f img/s  ETA %s   ", bar, step,
               s->steps, loss, avg, scaling, ips, e);
        if (!isnan(val)) printf("\n  validation loss %.4f at step %" PRId64 "\n", val, step);
        fflush(stdout);
    } else {
        /* a skipped f16 step may have an inf loss and norm: JSON has no inf, they are null */
        printf("{\"event\":\"step\",\"step\":%" PRId64 ",\"steps\":%d", step, s->steps);
        if (isfinite(loss)) printf(",\"loss\":%.6f", loss);
        else printf(",\"loss\":null");
        printf(",\"loss_avg\":%.6f,\"lr\":%.6g", avg, lr);
        if (isfinite(norm)) printf(",\"grad_norm\":%.4f", norm);
        else printf(",\"grad_norm\":null");
        printf(",\"img_per_s\":%.2f,\"eta_s\":%.0f", ips, eta);
        if (j->tp.g.precision == STRATEGY_PRECISION_F16)
            printf(",\"loss_scale\":%.9g,\"skipped_steps\":%" PRId64,
                   (double)exec_loss_scaler(j->e)->scale, exec_loss_scaler(j->e)->skipped);
        if (!isnan(val)) printf(",\"val_loss\":%.6f", val);
        if (step_s >= 0) printf(",\"step_s\":%.6f", step_s);
        printf("}\n");
        fflush(stdout);
    }
}

static void job_free(struct job *j)
{
    dataset_loader_free(j->loader);
    dataset_free(j->ds);
    exec_free(j->se); /* borrow j->e's allocation: first */
    exec_free(j->re);
    exec_free(j->e);
    train_plans_free(&j->tp);
    ddpm_schedule_free(&j->sch);
    free(j->x0);
    free(j->eps);
    free(j->xt);
    free(j->tgt);
    free(j->tf);
    free(j->ti);
    free(j->log_step);
    free(j->log_loss);
    free(j->log_val);
}

/* the sample grid a resumed run owes for its start step: due there but missing (a stop or a
 * failed write during that sampling). SAMPLE_OK when written or not owed. */
static int owed_samples(struct job *j, int64_t start, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    char path[FSIO_PATH_MAX];
    if (start <= 0 || j->last_ckpt != start || s->samples < 1 ||
        !(start == s->steps || (s->sample_every && start % s->sample_every == 0)))
        return SAMPLE_OK;
    if (fsio_path(path, sizeof path, err, errlen, "%s/step-%08" PRId64 ".png", j->dir_samples,
                  start))
        return SAMPLE_FAILED;
    struct stat st;
    if (stat(path, &st) == 0) return SAMPLE_OK;
    if (!j->o->quiet)
        fprintf(stderr, "ddpmd: %s is missing; sampling it first\n", path);
    return save_samples(j, start, err, errlen);
}

int train_run(const struct train_spec *spec, const struct train_opts *o, char *err,
              size_t errlen)
{
    struct job j;
    memset(&j, 0, sizeof j);
    j.spec = spec;
    j.o = o;
    j.last_ckpt = -1;
    int rc = TRAIN_FAILED;
    int64_t start = 0;
    if (o->stats) memset(o->stats, 0, sizeof *o->stats);
    size_t olen = o->out_dir ? strlen(o->out_dir) : 0;
    if (!olen || olen > (size_t)FSIO_FINAL_MAX - TRAIN_NAME_ROOM) {
        snprintf(err, errlen, "the output folder's path is %zu bytes; it must be 1 to %d", olen,
                 FSIO_FINAL_MAX - TRAIN_NAME_ROOM);
        return TRAIN_FAILED;
    }
    /* a spec the checkpoints cannot hold would end in checkpoints that cannot be resumed */
    if (checkpoint_check_spec(spec, err, errlen)) return TRAIN_FAILED;
    snprintf(j.dir_ckpt, sizeof j.dir_ckpt, "%s/checkpoints", o->out_dir);
    snprintf(j.dir_samples, sizeof j.dir_samples, "%s/samples", o->out_dir);
    if (mkdir_p1(o->out_dir) || mkdir_p1(j.dir_ckpt) || mkdir_p1(j.dir_samples)) {
        snprintf(err, errlen, "cannot create %s: %s", o->out_dir, strerror(errno));
        return TRAIN_FAILED;
    }
    remove_stale_temps(j.dir_ckpt, ".safetensors", o->quiet);
    remove_stale_temps(j.dir_samples, ".png", o->quiet);
    remove_stale_temps(o->out_dir, NULL, o->quiet);
    if (open_data(&j, err, errlen) || build(&j, err, errlen) || init_weights(&j, &start, err, errlen))
        goto out;
    if (o->stats) o->stats->start_step = start;
    if (!o->quiet) {
        fprintf(stderr, "ddpmd: %s UNet, %zu parameters, %d training images%s, batch %d, %d "
                        "threads\nddpmd: memory plan (allocated once, before the first step):\n",
                spec->model.preset == UNET_DDPM ? "ddpm" : "seed", j.tp.g.param_numel,
                dataset_train_count(j.ds),
                dataset_val_count(j.ds) ? " (+ held-out)" : "", spec->batch, spec->threads);
        if (j.tp.micro < spec->batch)
            fprintf(stderr, "ddpmd: micro-batches of %d (the last of %d) accumulate the "
                            "gradient of each batch of %d\n",
                    j.tp.micro, j.tp.rest ? j.tp.rest : j.tp.micro, spec->batch);
        plan_print(&j.tp.p, stderr);
    }
    if (o->resume) csv_reload(&j, start);
    int owed = owed_samples(&j, start, err, errlen);
    if (owed == SAMPLE_FAILED) goto out;
    if (owed == SAMPLE_STOPPED) {
        report_event(o, "stopped", start);
        rc = TRAIN_STOPPED;
        goto out;
    }
    if (dataset_loader_init(&j.loader, j.ds, spec->seed, spec->batch, spec->flip, start, 2, err,
                            errlen))
        goto out;
    double t0 = now_s();
    double avg = 0;
    int64_t step = start, first = start;
    double step_sum = 0; /* seconds of the steps since the last report (step_s: their mean) */
    int step_n = 0;
    while (step < spec->steps) {
        int stopping = stop_requested(o);
        if (!stopping) {
            double ts = now_s(), tc = cpu_s();
            if (dataset_loader_next(j.loader, step, j.x0, NULL)) {
                snprintf(err, errlen, "data loading failed at step %" PRId64, step);
                goto out;
            }
            make_inputs(&j, step, spec->seed, NULL);
            float loss = 0, norm = 0, lr = optim_lr(&spec->optim, step);
            const struct loss_scaler *ls = exec_loss_scaler(j.e);
            int64_t skipped_before = ls->skipped;
            char why[512];
            if (run_batch(&j, 1, spec->seed, step, &loss, why, sizeof why)) {
                snprintf(err, errlen, "training step %" PRId64 " failed: %.400s", step + 1, why);
                goto out;
            }
            if (exec_optimizer_step(j.e, &spec->optim, step + 1, lr, &norm)) {
                snprintf(err, errlen, "training step %" PRId64 " failed: %s", step + 1,
                         exec_last_error(j.e)->msg);
                goto out;
            }
            /* f16: a step with an inf/NaN gradient was skipped (exec_optimizer_step), not a
             * divergence, while the loss scale can still fall; an overflowing forward gives a
             * non-finite loss however small the scale gets */
            int skipped = ls->skipped != skipped_before;
            if (!isfinite(loss) && !(skipped && ls->scale >= LOSS_SCALE_FLOOR)) {
                if (skipped)
                    snprintf(err, errlen, "the loss is %g at step %" PRId64 " in f16 after %" PRId64
                             " skipped steps, the loss scale down to %g: the activations overflow "
                             "half range (train in bf16 or f32)", loss, step + 1, ls->skipped,
                             (double)ls->scale);
                else
                    snprintf(err, errlen, "the loss is %g at step %" PRId64
                             " (diverged; lower train.lr)", loss, step + 1);
                goto out;
            }
            step++;
            double dt = now_s() - ts, dc = cpu_s() - tc;
            step_sum += dt;
            step_n++;
            if (o->stats) {
                struct train_stats *ss = o->stats;
                if (ss->steps_run++ > 0) {
                    ss->step_wall_s += dt;
                    ss->step_cpu_s += dc;
                    if (!ss->steps_timed++ || dc < ss->step_cpu_min_s) ss->step_cpu_min_s = dc;
                }
            }
            if (isfinite(loss)) avg = step == first + 1 ? loss : 0.98 * avg + 0.02 * loss;
            stopping = stop_requested(o) || (o->stop_after > 0 && step >= o->stop_after);
            int last = step == spec->steps;
            int do_ckpt = last || stopping ||
                          (spec->checkpoint_every && step % spec->checkpoint_every == 0);
            int do_log = last || step % spec->log_every == 0 || do_ckpt;
            float val = NAN;
            if (do_log) {
                /* a stop during validation leaves val NaN; the checkpoint follows (do_ckpt) */
                if (do_ckpt && dataset_val_count(j.ds)) val = validation_loss(&j, step);
                double el = now_s() - t0, ips = (double)(step - first) * spec->batch / el;
                double eta = (double)(spec->steps - step) * el / (double)(step - first);
                if (isfinite(loss)) log_push(&j, step, loss, val);
                report(&j, step, loss, (float)avg, val, lr, norm, ips, eta, step_sum / step_n);
                step_sum = 0;
                step_n = 0;
            }
            if (do_ckpt && checkpoint(&j, step, err, errlen)) goto out;
            /* a stop (Ctrl-C) only checkpoints: sampling would keep the user waiting; a stop
             * during sampling ends it between two denoising steps, and --resume samples again */
            if ((last || (spec->sample_every && step % spec->sample_every == 0)) && !stopping) {
                int sr = save_samples(&j, step, err, errlen);
                if (sr == SAMPLE_FAILED) goto out;
                stopping = sr == SAMPLE_STOPPED;
            }
            if (!stopping) testhold_after_step(step, o->stop);
            stopping = stopping || stop_requested(o);
        }
        if (stopping) {
            /* the state to resume from: the last finished step's checkpoint */
            if (step > start && j.last_ckpt != step && checkpoint(&j, step, err, errlen))
                goto out;
            if (o->progress && !o->quiet) printf("\n");
            report_event(o, "stopped", step);
            rc = TRAIN_STOPPED;
            goto out;
        }
    }
    if (o->progress && !o->quiet) printf("\n");
    if (start >= spec->steps && csv_write(&j, err, errlen)) goto out;
    report_event(o, "done", step);
    rc = TRAIN_DONE;
out:
    job_free(&j);
    return rc;
}
