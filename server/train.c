/* train.c - the training loop of one job (see train.h for the contract): data, the engine's
 * step, validation, checkpoints, grids and progress. Its sample grids run inside the job's one
 * reservation: a nested inference plan over the EMA (train_plans.h). */
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
#include "child.h"
#include "clock.h"
#include "dataset.h"
#include "exec.h"
#include "export.h"
#include "fsio.h"
#include "generate.h"
#include "image.h"
#include "init.h"
#include "plot.h"
#include "testhold.h"
#include "train_step.h"
#include "upload.h"

/* batches the loader computes ahead */
#define TRAIN_LOADER_DEPTH 2

/* fixed timesteps of the validation loss, cycled over the held-out images */
static const int val_ts[] = {50, 250, 500, 750, 950};
#define VAL_SEED_SALT 0x5EEDull

struct job {
    const struct train_spec *spec;
    char *spec_json;            /* spec's canonical JSON, printed once: the metadata check, the
                                 * resume's comparison and every checkpoint reuse it */
    const struct train_opts *o;
    struct dataset *ds;
    struct dataset_loader *loader;
    struct train_step ts;       /* the step, its plans and its batch on the host */
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

/* a path as the run's messages show it (see train_opts.names_only) */
static const char *shown(const struct train_opts *o, const char *path)
{
    const char *base = strrchr(path, '/');
    return o->names_only && base && base[1] ? base + 1 : path;
}

/* Removes the temporaries an interrupted write (kill -9, power loss) left in one of the job's
 * folders: "FINAL.tmp.*" regular files whose FINAL is a name this job writes there (a
 * checkpoint or sample grid of exact name, loss.csv, loss.png; and loss.csv.tmp). Nothing else
 * is touched. */
static void remove_stale_temps(const struct train_opts *o, const char *dir, const char *ext)
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
        if (unlinkat(dirfd(d), de->d_name, 0) == 0 && !o->quiet)
            fprintf(stderr, "ddpmd: removed %s%s%s, left by an interrupted write\n",
                    o->names_only ? "" : dir, o->names_only ? "" : "/", de->d_name);
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
        /* held as its samples when its upload counted them (the host plan reads the same): from
         * the one decoded copy the jobs on it share when a job made it, else decoded (and the
         * copy made) */
        int64_t src = upload_folder_source_bytes(s->dataset);
        int64_t mp = upload_folder_max_pixels(s->dataset);
        char copy[FSIO_PATH_MAX], why[600];
        struct stat sb;
        int shared = src >= 0 && !upload_folder_samples_path(s->dataset, copy, sizeof copy);
        st = DATASET_ERR_IO;
        if (shared && stat(copy, &sb) == 0) {
            st = dataset_open_samples(&j->ds, copy, c, size, src, mp, why, sizeof why);
            if (!j->o->quiet && st == DATASET_OK)
                fprintf(stderr, "ddpmd: %d images mapped from the dataset's decoded copy\n",
                        dataset_count(j->ds));
            else if (!j->o->quiet && st != DATASET_ERR_ARG)
                fprintf(stderr, "ddpmd: the dataset's decoded copy is not used (%s): decoding "
                        "its images\n", j->o->names_only ? "unusable" : why);
        }
        if (st != DATASET_OK) {
            st = dataset_open_folder(&j->ds, s->dataset, c, size, src, mp, &rep, log_skipped,
                                     NULL, err, errlen);
            if (!st && rep.skipped && !j->o->quiet)
                fprintf(stderr,
                        "ddpmd: %d of %d images in %s could not be read and are skipped\n",
                        rep.skipped, rep.found, j->o->names_only ? "the dataset" : s->dataset);
            /* the copy for the next jobs (not for a folder held as float); a failure costs them
             * only a decode */
            if (!st && shared && !rep.skipped &&
                dataset_save_samples(j->ds, copy, why, sizeof why) == DATASET_OK &&
                !j->o->quiet)
                fprintf(stderr, "ddpmd: decoded %d images; the dataset's decoded copy written "
                        "for the next jobs\n", dataset_count(j->ds));
        }
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

int train_cost_model(struct cost_model *m, const char *path, char *err, size_t errlen)
{
    cost_model_default(m);
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

/* the loss history's capacity for rows logged (log_push: 1024, doubled as it fills) */
static int64_t log_capacity(int64_t rows)
{
    int64_t cap = 1024;
    while (cap < rows) cap *= 2;
    return cap;
}

/* the rows a run of s logs at most: every log_every steps, at each checkpoint, the last */
static int64_t log_rows(const struct train_spec *s)
{
    return s->steps / s->log_every + (s->checkpoint_every ? s->steps / s->checkpoint_every : 0) + 1;
}

#define LOG_ROW_BYTES ((int64_t)(sizeof(int64_t) + 2 * sizeof(float)))
/* loss.csv's text: a row is at most 117 bytes, written a chunk of rows at a time (csv_write) */
#define CSV_ROW_BYTES 128
#define CSV_CHUNK_BYTES (64 << 10)

/* loss.csv's rows made a chunk at a time as the file is written (fsio_write_atomic_stream), so
 * a long run's history is not held twice */
struct csv_pieces {
    const struct job *j;
    int next;                   /* the row to format next; -1: the header is still to come */
    char buf[CSV_CHUNK_BYTES];
};


/* the parts counted from the spec and the model alone (no data), as the child counts them */
static void host_plan_common(const struct train_spec *s, const struct graph *g,
                             struct train_host *h)
{
    size_t per = (size_t)s->model.in_channels * s->model.image_size * s->model.image_size;
    size_t out = (size_t)s->model.out_channels * s->model.image_size * s->model.image_size;
    h->part[TRAIN_HOST_STEP] = train_step_host_bytes(s->batch, per);
    /* a resume reads the job's own checkpoint, init_from another of the same model, both
     * streamed a tensor at a time (checkpoint_open_stream: the header and one tensor, never the
     * file); a fresh run stages one tensor of its initial weights */
    h->part[TRAIN_HOST_WEIGHTS_IN] = checkpoint_stream_plan_bytes(g);
    h->part[TRAIN_HOST_LOG] = log_capacity(log_rows(s)) * LOG_ROW_BYTES;
    h->part[TRAIN_HOST_CHECKPOINT] = checkpoint_save_plan_bytes(g);
    if (s->samples > 0) {
        int chunk = s->samples < 16 ? s->samples : 16, cols = (int)ceil(sqrt((double)s->samples));
        h->part[TRAIN_HOST_GRID] =
            (int64_t)s->samples * (int64_t)out * (int64_t)sizeof(float) +
            generate_host_bytes(chunk, out, s->timesteps) +
            image_grid_plan_bytes(s->samples, s->model.out_channels, s->model.image_size,
                                  s->model.image_size, cols, 2);
    }
    h->part[TRAIN_HOST_PLOT] = (int64_t)sizeof(struct csv_pieces) + plot_loss_plan_bytes();
}

int train_host_plan(const struct train_spec *s, int64_t images, int64_t max_pixels,
                    struct train_host *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    int fmnist = strcmp(s->dataset, "fashion-mnist") == 0;
    if (images < 0) images = fmnist ? SPEC_FMNIST_IMAGES : upload_folder_images(s->dataset);
    if (images < 0) images = 0;
    if (max_pixels < 0 && !fmnist) max_pixels = upload_folder_max_pixels(s->dataset);
    struct graph g;
    struct unet_io io;
    graph_init(&g);
    if (unet_build(&g, &s->model, 1, &io)) {
        snprintf(err, errlen, "%s", g.err[0] ? g.err : "cannot build the model");
        graph_free(&g);
        return -1;
    }
    host_plan_common(s, &g, h);
    graph_free(&g);
    int c = s->model.in_channels, size = s->model.image_size;
    int64_t per = (int64_t)c * size * size;
    int64_t train = images - (s->validation < images ? s->validation : 0);
    int64_t src = fmnist ? -1 : upload_folder_source_bytes(s->dataset);
    h->part[TRAIN_HOST_DATA] = dataset_plan_bytes(fmnist, images, c, size, max_pixels, src);
    h->part[TRAIN_HOST_DATA_LOAD] =
        dataset_plan_load_bytes(fmnist, images, c, size, max_pixels, src);
    h->part[TRAIN_HOST_LOADER] = dataset_loader_plan_bytes(TRAIN_LOADER_DEPTH, s->batch, per, train);
    return 0;
}

void train_sample_host_plan(const struct unet_config *model, int timesteps, int n, int batch,
                            const struct graph *g, int64_t ckpt_bytes, struct train_host *h)
{
    size_t out = (size_t)model->out_channels * model->image_size * model->image_size;
    int cols = (int)ceil(sqrt((double)n));
    memset(h, 0, sizeof *h);
    /* cmd_sample streams its checkpoint; the part keeps the file's bytes (train.h says why:
     * with the stream alone test_host_peak's sampling job peaks 1.3 MiB over) */
    h->part[TRAIN_HOST_WEIGHTS_IN] = checkpoint_read_plan_bytes(g, ckpt_bytes);
    h->part[TRAIN_HOST_STEP] = generate_host_bytes(batch < n ? batch : n, out, timesteps);
    h->part[TRAIN_HOST_GRID] = (int64_t)n * (int64_t)out * (int64_t)sizeof(float) +
                               image_grid_plan_bytes(n, model->out_channels, model->image_size,
                                                     model->image_size, cols, 2);
}

struct train_shape train_shape_of(const struct train_spec *s)
{
    return (struct train_shape){.model = s->model, .batch = s->batch, .grid_images = s->samples,
                                .backend = s->backend, .deterministic = s->deterministic};
}

int train_search(const struct train_spec *s, const struct cost_model *m, int plan_all,
                 struct planner_result *r, char *err, size_t errlen)
{
    struct train_shape sh = train_shape_of(s);
    return train_plans_search(&sh, &s->strategy, (size_t)s->vram_budget, m, plan_all, r, err,
                              errlen);
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

int train_plan_job(const struct train_spec *s, const struct cost_model *m, struct graph *g,
                   struct unet_io *io, int *target, struct plan *p, struct graph *sg,
                   struct unet_io *sio, struct plan *sp, char *err, size_t errlen)
{
    graph_init(g);
    graph_init(sg);
    memset(p, 0, sizeof *p);
    memset(sp, 0, sizeof *sp);
    struct planner_result r;
    struct train_plans tp;
    struct train_shape sh = train_shape_of(s);
    if (train_search(s, m, 0, &r, err, errlen)) {
        /* a model that cannot be built says so, rather than that nothing fits */
        if (!(r.n_cand > 0 && !r.cand[0].failed)) {
            char why[512];
            if (train_plans_make(&tp, &sh, NULL, why, sizeof why))
                snprintf(err, errlen, "%s", why);
            train_plans_free(&tp);
        }
        planner_result_free(&r);
        return -1;
    }
    struct strategy st = r.cand[r.chosen].strategy;
    planner_result_free(&r);
    graph_free(g);
    graph_free(sg);
    int rc = train_plans_make(&tp, &sh, &st, err, errlen);
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
    int rc = train_search(s, o->cost, 0, &r, err, errlen);
    if (!rc) *st = r.cand[r.chosen].strategy;
    planner_result_free(&r);
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
    struct train_step_config c = {
        .shape = train_shape_of(s), .threads = s->threads, .budget = (size_t)s->vram_budget,
        .timesteps = s->timesteps, .beta_schedule = s->beta_schedule,
        .beta_start = s->beta_start, .beta_end = s->beta_end,
        .prediction = s->prediction == SPEC_PRED_V ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON};
    return job_strategy(s, j->o, &st, err, errlen) ||
                   train_step_init(&j->ts, &c, &st, err, errlen)
               ? -1
               : 0;
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

/* whether the checkpoint's spec (saved) allows an exact resume under spec (spec_json: its
 * canonical JSON); err says why not */
static int resume_check(const struct train_spec *saved, const struct train_spec *spec,
                        const char *spec_json, int64_t step, const char *path, int quiet,
                        char *err, size_t errlen)
{
    char *a = spec_to_json(saved);
    cJSON *ja = a ? cJSON_Parse(a) : NULL, *jb = cJSON_Parse(spec_json);
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
        if (checkpoint_open_stream(st, path, saved, step, why, sizeof why) == 0) {
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
        fprintf(stderr, "ddpmd: cannot resume from %s (%s)%s%s; %s\n", shown(j->o, path), why,
                moved ? ", kept as " : "", moved ? shown(j->o, aside) : "",
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
            if (resume_check(&saved, s, j->spec_json, step, path, j->o->quiet, err, errlen)) {
                safetensors_free(st);
                return -1;
            }
            int rc = checkpoint_apply(st, j->ts.e, &j->ts.tp.g, CHECKPOINT_ALL, 0, err, errlen);
            safetensors_free(st);
            if (rc) return -1;
            *start = step;
            j->last_ckpt = step;
            if (j->o->stats) j->o->stats->resumed = 1;
            if (!j->o->quiet)
                fprintf(stderr, "ddpmd: resuming from %s (step %" PRId64 ")\n",
                        shown(j->o, path), step);
            return 0;
        }
        if (j->o->resume != TRAIN_RESUME_IF_ANY) {
            snprintf(err, errlen, "nothing to resume: no usable checkpoint in %s (to start fresh "
                     "when there is none, ask to resume if possible: --resume-or-start)",
                     j->dir_ckpt);
            return -1;
        }
        if (!j->o->quiet)
            fprintf(stderr, "ddpmd: no checkpoint in %s; starting at step 0\n",
                    shown(j->o, j->dir_ckpt));
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
        if (checkpoint_open_stream(&st, s->init_from, NULL, NULL, err, errlen)) return -1;
        int rc = checkpoint_apply(st, j->ts.e, &j->ts.tp.g, CHECKPOINT_WEIGHTS, 0, err, errlen);
        safetensors_free(st);
        if (rc) return -1;
    } else {
        size_t maxn = 0;
        for (int i = 0; i < j->ts.tp.g.n_tensors; i++)
            if (j->ts.tp.g.tensors[i]->kind == TENSOR_PARAM && j->ts.tp.g.tensors[i]->numel > maxn)
                maxn = j->ts.tp.g.tensors[i]->numel;
        float *w = malloc(maxn * sizeof *w);
        if (!w) return -1;
        for (int i = 0; i < j->ts.tp.g.n_tensors; i++)
            if (j->ts.tp.g.tensors[i]->kind == TENSOR_PARAM) {
                init_param(j->ts.tp.g.tensors[i], s->seed, w);
                exec_upload(j->ts.e, i, w);
            }
        free(w);
    }
    return exec_reset_state(j->ts.e) ? -1 : 0;
}

/* progress of a long phase (validation, sampling): a counter on a terminal, a protocol event
 * {"event":E,"step":N,"done":D,"total":T} otherwise (child.h) */
static void report_phase(const struct train_opts *o, enum child_event_kind kind, int64_t step,
                         int done, int total)
{
    if (o->quiet) return;
    if (o->progress) {
        printf("\r  %s %d/%d   ", child_event_name(kind), done, total);
        if (done == total) printf("\n");
        fflush(stdout);
        return;
    }
    struct child_event e = {.kind = kind};
    child_event_set(&e, CHILD_STEP, (double)step);
    child_event_set(&e, CHILD_DONE, done);
    child_event_set(&e, CHILD_TOTAL, total);
    child_event_write(stdout, &e);
}

/* a protocol event {"event":E,"step":N} (checkpoint, samples, stopped, done); nothing on a
 * terminal */
static void report_event(const struct train_opts *o, enum child_event_kind kind, int64_t step)
{
    if (o->quiet || o->progress) return;
    struct child_event e = {.kind = kind};
    child_event_set(&e, CHILD_STEP, (double)step);
    child_event_write(stdout, &e);
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
        if (dataset_val_batch(j->ds, b * s->batch, s->batch, j->ts.x0, NULL)) return NAN;
        for (int i = 0; i < s->batch; i++) t[i] = val_ts[(b * s->batch + i) % 5] * s->timesteps / 1000;
        float loss = 0;
        if (train_step_eval(&j->ts, s->seed ^ VAL_SEED_SALT, (int64_t)b, t, &loss)) return NAN;
        sum += loss;
        if (nb > 1) report_phase(j->o, CHILD_EVENT_VALIDATION, step, b + 1, nb);
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
    report_phase(c->o, CHILD_EVENT_SAMPLING, c->step, done, total);
}

/* the sample grid of step: GENERATE_OK, GENERATE_STOPPED (a stop request: nothing written) or
 * GENERATE_FAILED with err */
static int save_samples(struct job *j, int64_t step, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    struct generator sj;
    int n = s->samples, rc = GENERATE_FAILED;
    char path[FSIO_PATH_MAX];
    if (fsio_path(path, sizeof path, err, errlen, "%s/step-%08" PRId64 ".png", j->dir_samples,
                  step))
        return GENERATE_FAILED;
    float *img = malloc((size_t)n * j->ts.per * sizeof *img);
    if (!img) {
        snprintf(err, errlen, "out of memory for %d samples", n);
        return GENERATE_FAILED;
    }
    /* the nested executor reads the EMA in place (with offload: a copy uploaded from the host
     * block), and the next training step uploads its own inputs again (the grid overwrote
     * them) */
    generate_bind_nested(&sj, &j->ts.tp.sg, &j->ts.tp.sio, &j->ts.tp.sp, j->ts.se, j->ts.tp.grid,
                           &s->model);
    /* with offload the EMA is in host memory: the grid's weights are uploaded from it first */
    if (exec_nested_sync(j->ts.se)) {
        snprintf(err, errlen, "sampling at step %" PRId64 " failed: %s", step,
                 exec_last_error(j->ts.se)->msg);
        goto out;
    }
    struct sampler_config sc;
    train_sampler_config(s, &sc);
    sc.stop = j->o->stop;
    struct sample_progress_ctx pc = {j->o, step};
    int cols = (int)ceil(sqrt((double)n));
    rc = generate_run(&sj, &j->ts.sch, &sc, s->seed, n, img, sample_progress, &pc);
    if (rc == GENERATE_STOPPED) {
        if (!j->o->quiet && j->o->progress) printf("\n");
        goto out;
    }
    if (rc != GENERATE_OK) {
        const struct exec_error *ee = exec_last_error(j->ts.se);
        snprintf(err, errlen, "sampling at step %" PRId64 " failed: %s", step,
                 ee->status ? ee->msg : "no timesteps for the grid's sampler");
        goto out;
    }
    if (image_save_grid_png(path, img, n, s->model.out_channels, s->model.image_size,
                            s->model.image_size, cols, 2, err, errlen)) {
        rc = GENERATE_FAILED;
        goto out;
    }
    report_event(j->o, CHILD_EVENT_SAMPLE, step);
out:
    generate_free(&sj); /* a view: clears it, frees nothing of the job's */
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

static int csv_next(void *ctx, struct fsio_buf *b)
{
    struct csv_pieces *c = ctx;
    const struct job *j = c->j;
    size_t len = 0;
    if (c->next < 0) {
        len = (size_t)snprintf(c->buf, sizeof c->buf, "step,loss,val_loss\n");
        c->next = 0;
    }
    /* a row is at most 117 bytes (CSV_ROW_BYTES) */
    for (; c->next < j->n_log && sizeof c->buf - len > CSV_ROW_BYTES; c->next++) {
        int i = c->next;
        if (isnan(j->log_val[i]))
            len += (size_t)snprintf(c->buf + len, sizeof c->buf - len, "%" PRId64 ",%.6f,\n",
                                    j->log_step[i], j->log_loss[i]);
        else
            len += (size_t)snprintf(c->buf + len, sizeof c->buf - len, "%" PRId64 ",%.6f,%.6f\n",
                                    j->log_step[i], j->log_loss[i], j->log_val[i]);
    }
    *b = (struct fsio_buf){c->buf, len};
    return len > 0;
}

/* loss.csv and loss.png, each replaced atomically; a failed write fails (err says why) */
static int csv_write(struct job *j, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX];
    struct csv_pieces *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory writing loss.csv");
        return -1;
    }
    c->j = j;
    c->next = -1;
    int rc = fsio_path(path, sizeof path, err, errlen, "%s/loss.csv", j->o->out_dir) ||
             fsio_write_atomic_stream(path, csv_next, c, err, errlen);
    free(c);
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
        checkpoint_save(path, j->ts.e, &j->ts.tp.g, j->spec, j->spec_json, step, err, errlen))
        return -1;
    j->last_ckpt = step;
    prune_checkpoints(j->dir_ckpt, j->spec->keep_last);
    report_event(j->o, CHILD_EVENT_CHECKPOINT, step);
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

/* The optimizer steps run since the last call, step - n + 1 .. step (train_step_read: the host
 * waits for the device here, once per log line, not every step): each one checked for
 * divergence and folded into the loss average (first: the run's first step - 1), the last one's
 * loss and norm out. Nonzero with err on a divergence or a failure. */
static int absorb_steps(struct job *j, int64_t step, int64_t first, double *avg, float *loss,
                        float *norm, char *err, size_t errlen)
{
    struct exec_step_stats r[EXEC_STEP_LOG];
    int n = 0;
    if (train_step_read(&j->ts, r, EXEC_STEP_LOG, &n, err, errlen)) return -1;
    for (int k = 0; k < n; k++) {
        const int64_t s = step - n + 1 + k;
        const float l = r[k].loss;
        /* f16: a step with an inf/NaN gradient was skipped (exec_optimizer_step), not a
         * divergence, while the loss scale can still fall; an overflowing forward gives a
         * non-finite loss however small the scale gets */
        if (!isfinite(l) && !(!r[k].applied && r[k].loss_scale >= LOSS_SCALE_FLOOR)) {
            if (!r[k].applied)
                snprintf(err, errlen, "the loss is %g at step %" PRId64 " in f16 after %" PRId64
                         " skipped steps, the loss scale down to %g: the activations overflow "
                         "half range (train in bf16 or f32)", l, s,
                         exec_loss_scaler(j->ts.e)->skipped, (double)r[k].loss_scale);
            else
                snprintf(err, errlen, "the loss is %g at step %" PRId64
                         " (diverged; lower train.lr)", l, s);
            return -1;
        }
        if (isfinite(l)) *avg = s == first + 1 ? l : 0.98 * *avg + 0.02 * l;
    }
    if (n) {
        *loss = r[n - 1].loss;
        *norm = r[n - 1].grad_norm;
    }
    return 0;
}

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
        if (j->ts.tp.g.precision == STRATEGY_PRECISION_F16)
            snprintf(scaling, sizeof scaling, "  scale %g, %" PRId64 " skipped",
                     (double)exec_loss_scaler(j->ts.e)->scale, exec_loss_scaler(j->ts.e)->skipped);
        printf("\r[%s] %" PRId64 "/%d  loss %.4f (avg %.4f)%s  %.1f img/s  ETA %s   ", bar, step,
               s->steps, loss, avg, scaling, ips, e);
        if (!isnan(val)) printf("\n  validation loss %.4f at step %" PRId64 "\n", val, step);
        fflush(stdout);
    } else {
        /* a skipped f16 step may have an inf loss and norm: the protocol writes them null */
        struct child_event e = {.kind = CHILD_EVENT_STEP};
        child_event_set(&e, CHILD_STEP, (double)step);
        child_event_set(&e, CHILD_STEPS, s->steps);
        child_event_set(&e, CHILD_LOSS, loss);
        child_event_set(&e, CHILD_LOSS_AVG, avg);
        child_event_set(&e, CHILD_LR, lr);
        child_event_set(&e, CHILD_GRAD_NORM, norm);
        child_event_set(&e, CHILD_IMG_PER_S, ips);
        child_event_set(&e, CHILD_ETA_S, eta);
        if (j->ts.tp.g.precision == STRATEGY_PRECISION_F16) {
            child_event_set(&e, CHILD_LOSS_SCALE, (double)exec_loss_scaler(j->ts.e)->scale);
            child_event_set(&e, CHILD_SKIPPED_STEPS, (double)exec_loss_scaler(j->ts.e)->skipped);
        }
        if (!isnan(val)) child_event_set(&e, CHILD_VAL_LOSS, val);
        if (step_s >= 0) child_event_set(&e, CHILD_STEP_S, step_s);
        child_event_write(stdout, &e);
    }
}

/* what the run held by part (train_stats.host): its buffers as allocated, its transients by
 * the functions the plan uses, over its own graph and data */
static void host_used(const struct job *j, struct train_host *h)
{
    const struct train_spec *s = j->spec;
    memset(h, 0, sizeof *h);
    if (!j->ts.e) return;
    host_plan_common(s, &j->ts.tp.g, h);
    h->part[TRAIN_HOST_STEP] = train_step_host_bytes(j->ts.batch, j->ts.per);
    h->part[TRAIN_HOST_LOG] = (int64_t)j->cap_log * LOG_ROW_BYTES;
    if (j->ds) {
        int fmnist = strcmp(s->dataset, "fashion-mnist") == 0;
        h->part[TRAIN_HOST_DATA] = dataset_bytes(j->ds);
        h->part[TRAIN_HOST_DATA_LOAD] = dataset_plan_load_bytes(
            fmnist, dataset_count(j->ds), dataset_channels(j->ds), dataset_size(j->ds),
            fmnist ? -1 : upload_folder_max_pixels(s->dataset),
            fmnist ? -1 : upload_folder_source_bytes(s->dataset));
    }
    /* before the loader starts (the plan's print), what it will hold */
    h->part[TRAIN_HOST_LOADER] =
        j->loader ? dataset_loader_bytes(j->loader)
        : j->ds   ? dataset_loader_plan_bytes(TRAIN_LOADER_DEPTH, s->batch, (int64_t)j->ts.per,
                                              dataset_train_count(j->ds))
                  : 0;
}

static void job_free(struct job *j)
{
    free(j->spec_json);
    dataset_loader_free(j->loader);
    dataset_free(j->ds);
    train_step_free(&j->ts);
    free(j->log_step);
    free(j->log_loss);
    free(j->log_val);
}

/* the sample grid a resumed run owes for its start step: due there but missing (a stop or a
 * failed write during that sampling). GENERATE_OK when written or not owed. */
static int owed_samples(struct job *j, int64_t start, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    char path[FSIO_PATH_MAX];
    if (start <= 0 || j->last_ckpt != start || s->samples < 1 ||
        !(start == s->steps || (s->sample_every && start % s->sample_every == 0)))
        return GENERATE_OK;
    if (fsio_path(path, sizeof path, err, errlen, "%s/step-%08" PRId64 ".png", j->dir_samples,
                  start))
        return GENERATE_FAILED;
    struct stat st;
    if (stat(path, &st) == 0) return GENERATE_OK;
    if (!j->o->quiet)
        fprintf(stderr, "ddpmd: %s is missing; sampling it first\n", shown(j->o, path));
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
    j.spec_json = spec_to_json(spec);
    if (!j.spec_json) {
        snprintf(err, errlen, "out of memory");
        return TRAIN_FAILED;
    }
    if (checkpoint_check_spec(spec, j.spec_json, err, errlen)) goto out;
    snprintf(j.dir_ckpt, sizeof j.dir_ckpt, "%s/checkpoints", o->out_dir);
    snprintf(j.dir_samples, sizeof j.dir_samples, "%s/samples", o->out_dir);
    if (mkdir_p1(o->out_dir) || mkdir_p1(j.dir_ckpt) || mkdir_p1(j.dir_samples)) {
        snprintf(err, errlen, "cannot create %s: %s", o->out_dir, strerror(errno));
        goto out;
    }
    remove_stale_temps(o, j.dir_ckpt, ".safetensors");
    remove_stale_temps(o, j.dir_samples, ".png");
    remove_stale_temps(o, o->out_dir, NULL);
    /* the weights first: a checkpoint read whole is freed before the data loads (the host
     * plan's phases, train_plans_host_peak) */
    if (build(&j, err, errlen) || init_weights(&j, &start, err, errlen))
        goto out;
    testhold_phase(o->out_dir, "weights");
    if (open_data(&j, err, errlen)) goto out;
    testhold_phase(o->out_dir, "data");
    if (o->stats) o->stats->start_step = start;
    if (!o->quiet) {
        fprintf(stderr, "ddpmd: %s UNet, %zu parameters, %d training images%s, batch %d, %d "
                        "threads\nddpmd: memory plan (allocated once, before the first step):\n",
                spec->model.preset == UNET_DDPM ? "ddpm" : "seed", j.ts.tp.g.param_numel,
                dataset_train_count(j.ds),
                dataset_val_count(j.ds) ? " (+ held-out)" : "", spec->batch, spec->threads);
        if (j.ts.tp.micro < spec->batch)
            fprintf(stderr, "ddpmd: micro-batches of %d (the last of %d) accumulate the "
                            "gradient of each batch of %d\n",
                    j.ts.tp.micro, j.ts.tp.rest ? j.ts.tp.rest : j.ts.tp.micro, spec->batch);
        plan_print(&j.ts.tp.p, stderr);
        struct train_host h;
        host_used(&j, &h);
        fprintf(stderr, "ddpmd: host memory beside the plan: %.1f MiB at its peak (",
                (double)train_plans_host_peak(&h) / 1048576.0);
        for (int k = 0; k < TRAIN_HOST_PART_COUNT; k++)
            fprintf(stderr, "%s%s %.1f", k ? ", " : "",
                    train_plans_host_part_name((enum train_host_part)k),
                    (double)h.part[k] / 1048576.0);
        fprintf(stderr, " MiB)\n");
    }
    if (o->resume) csv_reload(&j, start);
    int owed = owed_samples(&j, start, err, errlen);
    if (owed == GENERATE_FAILED) goto out;
    if (owed == GENERATE_STOPPED) {
        report_event(o, CHILD_EVENT_STOPPED, start);
        rc = TRAIN_STOPPED;
        goto out;
    }
    if (dataset_loader_init(&j.loader, j.ds, spec->seed, spec->batch, spec->flip, start,
                            TRAIN_LOADER_DEPTH, err, errlen))
        goto out;
    double t0 = clock_now_s();
    double avg = 0;
    float loss = 0, norm = 0;     /* the last step absorb_steps read */
    int unread = 0;               /* steps run since absorb_steps */
    int64_t step = start, first = start;
    double step_sum = 0; /* seconds of the steps since the last report (step_s: their mean) */
    int step_n = 0;
    while (step < spec->steps) {
        int stopping = stop_requested(o);
        if (!stopping) {
            double ts = clock_now_s(), tc = clock_thread_cpu_s();
            if (dataset_loader_next(j.loader, step, j.ts.x0, NULL)) {
                snprintf(err, errlen, "data loading failed at step %" PRId64, step);
                goto out;
            }
            const float lr = optim_lr(&spec->optim, step);
            char why[512];
            /* neither the loss nor the norm is read here: the host does not wait for the
             * device inside a step (absorb_steps reads them when they are logged) */
            if (train_step_run(&j.ts, spec->seed, step, &spec->optim, NULL, why, sizeof why)) {
                snprintf(err, errlen, "training step %" PRId64 " failed: %.400s", step + 1, why);
                goto out;
            }
            step++;
            unread++;
            testhold_phase(o->out_dir, "step");
            double dt = clock_now_s() - ts, dc = clock_thread_cpu_s() - tc;
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
            stopping = stop_requested(o) || (o->stop_after > 0 && step >= o->stop_after);
            int last = step == spec->steps;
            int do_ckpt = last || stopping ||
                          (spec->checkpoint_every && step % spec->checkpoint_every == 0);
            int do_log = last || step % spec->log_every == 0 || do_ckpt;
            int do_sample = last || (spec->sample_every && step % spec->sample_every == 0);
            if (do_log || do_sample || unread == EXEC_STEP_LOG) {
                if (absorb_steps(&j, step, first, &avg, &loss, &norm, err, errlen)) goto out;
                unread = 0;
            }
            float val = NAN;
            if (do_log) {
                /* a stop during validation leaves val NaN; the checkpoint follows (do_ckpt) */
                if (do_ckpt && dataset_val_count(j.ds)) val = validation_loss(&j, step);
                double el = clock_now_s() - t0, ips = (double)(step - first) * spec->batch / el;
                double eta = (double)(spec->steps - step) * el / (double)(step - first);
                if (isfinite(loss)) log_push(&j, step, loss, val);
                report(&j, step, loss, (float)avg, val, lr, norm, ips, eta, step_sum / step_n);
                step_sum = 0;
                step_n = 0;
            }
            if (do_ckpt && checkpoint(&j, step, err, errlen)) goto out;
            if (do_ckpt) testhold_phase(o->out_dir, "checkpoint");
            /* a stop (Ctrl-C) only checkpoints: sampling would keep the user waiting; a stop
             * during sampling ends it between two denoising steps, and --resume samples again */
            if (do_sample && !stopping) {
                int sr = save_samples(&j, step, err, errlen);
                if (sr == GENERATE_FAILED) goto out;
                testhold_phase(o->out_dir, "grid");
                stopping = sr == GENERATE_STOPPED;
            }
            if (!stopping) testhold_after_step(step, o->stop);
            stopping = stopping || stop_requested(o);
        }
        if (stopping) {
            /* the state to resume from: the last finished step's checkpoint */
            if (step > start && j.last_ckpt != step && checkpoint(&j, step, err, errlen))
                goto out;
            if (o->progress && !o->quiet) printf("\n");
            report_event(o, CHILD_EVENT_STOPPED, step);
            rc = TRAIN_STOPPED;
            goto out;
        }
    }
    if (o->progress && !o->quiet) printf("\n");
    if (start >= spec->steps && csv_write(&j, err, errlen)) goto out;
    report_event(o, CHILD_EVENT_DONE, step);
    testhold_phase(o->out_dir, "end");
    rc = TRAIN_DONE;
out:
    if (o->stats) host_used(&j, &o->stats->host);
    job_free(&j);
    return rc;
}
