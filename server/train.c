/* train.c - the training loop of one job on the CPU backend (see train.h for the contract). */
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "dataset.h"
#include "ddpm.h"
#include "exec.h"
#include "image.h"
#include "init.h"
#include "philox.h"
#include "plan.h"
#include "plot.h"
#include "sample.h"
#include "sampler.h"
#include "unet.h"

/* fixed timesteps of the validation loss, cycled over the held-out images */
static const int val_ts[] = {50, 250, 500, 750, 950};
#define VAL_SEED_SALT 0x5EEDull

struct job {
    const struct train_spec *spec;
    const struct train_opts *o;
    struct dataset *ds;
    struct dataset_loader *loader;
    struct graph g;
    struct unet_io io;
    int target;
    struct plan p;
    struct exec *e;
    struct ddpm_schedule sch;
    size_t per;                 /* elements of one image */
    float *x0, *eps, *xt, *tgt, *tf;
    int *ti;
    /* logged history for loss.csv and the curve */
    int64_t *log_step;
    float *log_loss, *log_val;
    int n_log, cap_log;
    char dir_ckpt[1100], dir_samples[1100];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p */
static int mkdir_p1(const char *path)
{
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int train_latest_checkpoint(const char *out_dir, char *path, size_t len, int64_t *step)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", out_dir);
    DIR *d = opendir(dir);
    if (!d) return -1;
    int64_t best = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long s;
        char tail[8];
        if (sscanf(de->d_name, "step-%lld.safe%7s", &s, tail) == 2 && strcmp(tail, "tensors") == 0 &&
            s > best)
            best = s;
    }
    closedir(d);
    if (best < 0) return -1;
    snprintf(path, len, "%s/step-%08" PRId64 ".safetensors", dir, best);
    *step = best;
    return 0;
}

/* removes all but the newest keep checkpoints */
static void prune_checkpoints(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t steps[4096];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096) {
        long long s;
        char tail[8];
        if (sscanf(de->d_name, "step-%lld.safe%7s", &s, tail) == 2 && strcmp(tail, "tensors") == 0)
            steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int k = 0; k < n; k++) newer += steps[k] > steps[i];
        if (newer >= keep) {
            char p[1200];
            snprintf(p, sizeof p, "%s/step-%08" PRId64 ".safetensors", dir, steps[i]);
            unlink(p);
        }
    }
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

static int build(struct job *j, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    graph_init(&j->g);
    if (unet_build_training(&j->g, &s->model, s->batch, &j->io, &j->target, NULL)) {
        snprintf(err, errlen, "cannot build the model: %s", j->g.err);
        return -1;
    }
    if (plan_make(&j->p, &j->g, backend_cpu(), NULL)) {
        snprintf(err, errlen, "cannot plan the training step");
        return -1;
    }
    struct exec_opts eo = {.threads = s->threads};
    if (exec_init(&j->e, &j->g, &j->p, backend_cpu(), &eo)) {
        snprintf(err, errlen, "cannot allocate the plan's %zu bytes", j->p.total_bytes);
        return -1;
    }
    size_t img = j->g.tensors[j->io.x]->numel;
    j->per = img / (size_t)s->batch;
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

static int init_weights(struct job *j, int64_t *start, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    char path[1200];
    int64_t step = 0;
    *start = 0;
    if (j->o->resume && train_latest_checkpoint(j->o->out_dir, path, sizeof path, &step) == 0) {
        struct safetensors *st = NULL;
        struct train_spec saved;
        if (checkpoint_open(&st, path, &saved, &step, err, errlen)) return -1;
        if (memcmp(&saved.model, &s->model, sizeof saved.model) != 0 ||
            saved.batch != s->batch || saved.seed != s->seed) {
            snprintf(err, errlen, "%s was made by a different model, batch or seed than this spec",
                     path);
            safetensors_free(st);
            return -1;
        }
        int rc = checkpoint_apply(st, j->e, &j->g, CHECKPOINT_ALL, 0, err, errlen);
        safetensors_free(st);
        if (rc) return -1;
        *start = step;
        if (!j->o->quiet) fprintf(stderr, "ddpmd: resuming from %s (step %" PRId64 ")\n", path, step);
        return 0;
    }
    if (s->init_from[0]) {
        struct safetensors *st = NULL;
        if (checkpoint_open(&st, s->init_from, NULL, NULL, err, errlen)) return -1;
        int rc = checkpoint_apply(st, j->e, &j->g, CHECKPOINT_WEIGHTS, 0, err, errlen);
        safetensors_free(st);
        if (rc) return -1;
    } else {
        size_t maxn = 0;
        for (int i = 0; i < j->g.n_tensors; i++)
            if (j->g.tensors[i]->kind == TENSOR_PARAM && j->g.tensors[i]->numel > maxn)
                maxn = j->g.tensors[i]->numel;
        float *w = malloc(maxn * sizeof *w);
        if (!w) return -1;
        for (int i = 0; i < j->g.n_tensors; i++)
            if (j->g.tensors[i]->kind == TENSOR_PARAM) {
                init_param(j->g.tensors[i], s->seed, w);
                exec_upload(j->e, i, w);
            }
        free(w);
    }
    return exec_reset_state(j->e) ? -1 : 0;
}

/* timesteps, noise and the model's input/target for the batch of step s (x0 already loaded) */
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

static int upload_inputs(struct job *j)
{
    return exec_upload(j->e, j->io.x, j->xt) || exec_upload(j->e, j->io.t, j->tf) ||
           exec_upload(j->e, j->target, j->tgt);
}

/* mean loss over the held-out images (whole batches of them) at fixed timesteps and noise */
static float validation_loss(struct job *j)
{
    const struct train_spec *s = j->spec;
    int nv = dataset_val_count(j->ds), nb = nv / s->batch;
    if (nb == 0) return NAN;
    double sum = 0;
    int t[65536];
    for (int b = 0; b < nb; b++) {
        if (dataset_val_batch(j->ds, b * s->batch, s->batch, j->x0, NULL)) return NAN;
        for (int i = 0; i < s->batch; i++) t[i] = val_ts[(b * s->batch + i) % 5] * s->timesteps / 1000;
        make_inputs(j, (int64_t)b, s->seed ^ VAL_SEED_SALT, t);
        float loss = 0;
        if (upload_inputs(j) || exec_forward(j->e, &loss)) return NAN;
        sum += loss;
    }
    return (float)(sum / nb);
}

static int save_samples(struct job *j, int64_t step, char *err, size_t errlen)
{
    const struct train_spec *s = j->spec;
    struct sample_job sj;
    int n = s->samples, batch = n < 16 ? n : 16, rc = -1;
    float *img = malloc((size_t)n * j->per * sizeof *img);
    if (!img || sample_job_init(&sj, &s->model, batch, s->threads, err, errlen)) {
        free(img);
        return -1;
    }
    struct sampler_config sc;
    sampler_config_default(&sc);
    sc.prediction = s->prediction == SPEC_PRED_V ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;
    char path[1300];
    snprintf(path, sizeof path, "%s/step-%08" PRId64 ".png", j->dir_samples, step);
    int cols = (int)ceil(sqrt((double)n));
    if (!sample_job_copy_weights(&sj, j->e, &j->g, 1) &&
        !sample_job_run(&sj, &j->sch, &sc, s->seed, n, img, NULL, NULL) &&
        !image_save_grid_png(path, img, n, s->model.out_channels, s->model.image_size,
                             s->model.image_size, cols, 2, err, errlen))
        rc = 0;
    sample_job_free(&sj);
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
    char path[1200];
    snprintf(path, sizeof path, "%s/loss.csv", j->o->out_dir);
    FILE *f = fopen(path, "r");
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

static void csv_write(struct job *j)
{
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/loss.csv", j->o->out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "step,loss,val_loss\n");
    for (int i = 0; i < j->n_log; i++) {
        if (isnan(j->log_val[i]))
            fprintf(f, "%" PRId64 ",%.6f,\n", j->log_step[i], j->log_loss[i]);
        else
            fprintf(f, "%" PRId64 ",%.6f,%.6f\n", j->log_step[i], j->log_loss[i], j->log_val[i]);
    }
    if (fclose(f) == 0) rename(tmp, path);
    snprintf(path, sizeof path, "%s/loss.png", j->o->out_dir);
    plot_loss_png(path, j->log_step, j->log_loss, j->log_val, j->n_log);
}

static int checkpoint(struct job *j, int64_t step, char *err, size_t errlen)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/step-%08" PRId64 ".safetensors", j->dir_ckpt, step);
    if (checkpoint_save(path, j->e, &j->g, j->spec, step, err, errlen)) return -1;
    prune_checkpoints(j->dir_ckpt, j->spec->keep_last);
    csv_write(j);
    return 0;
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

static void report(struct job *j, int64_t step, float loss, float avg, float val, float lr,
                   float norm, double ips, double eta)
{
    const struct train_spec *s = j->spec;
    if (j->o->quiet) return;
    if (j->o->progress) {
        int width = 24, fill = (int)((double)width * (double)step / (double)s->steps);
        char bar[32], e[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fmt_eta(e, sizeof e, eta);
        printf("\r[%s] %" PRId64 "/%d  loss %.4f (avg %.4f)%s  %.1f img/s  ETA %s   ", bar, step,
               s->steps, loss, avg, "", ips, e);
        if (!isnan(val)) printf("\n  validation loss %.4f at step %" PRId64 "\n", val, step);
        fflush(stdout);
    } else {
        printf("{\"step\":%" PRId64 ",\"steps\":%d,\"loss\":%.6f,\"loss_avg\":%.6f,\"lr\":%.6g,"
               "\"grad_norm\":%.4f,\"img_per_s\":%.2f,\"eta_s\":%.0f",
               step, s->steps, loss, avg, lr, norm, ips, eta);
        if (!isnan(val)) printf(",\"val_loss\":%.6f", val);
        printf("}\n");
        fflush(stdout);
    }
}

static void job_free(struct job *j)
{
    dataset_loader_free(j->loader);
    dataset_free(j->ds);
    exec_free(j->e);
    plan_free(&j->p);
    graph_free(&j->g);
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

int train_run(const struct train_spec *spec, const struct train_opts *o, char *err,
              size_t errlen)
{
    struct job j;
    memset(&j, 0, sizeof j);
    j.spec = spec;
    j.o = o;
    int rc = TRAIN_FAILED;
    int64_t start = 0;
    snprintf(j.dir_ckpt, sizeof j.dir_ckpt, "%s/checkpoints", o->out_dir);
    snprintf(j.dir_samples, sizeof j.dir_samples, "%s/samples", o->out_dir);
    if (mkdir_p1(o->out_dir) || mkdir_p1(j.dir_ckpt) || mkdir_p1(j.dir_samples)) {
        snprintf(err, errlen, "cannot create %s: %s", o->out_dir, strerror(errno));
        return TRAIN_FAILED;
    }
    if (open_data(&j, err, errlen) || build(&j, err, errlen) || init_weights(&j, &start, err, errlen))
        goto out;
    if (!o->quiet) {
        fprintf(stderr, "ddpmd: %s UNet, %zu parameters, %d training images%s, batch %d, %d "
                        "threads\nddpmd: memory plan (allocated once, before the first step):\n",
                spec->model.preset == UNET_DDPM ? "ddpm" : "seed", j.g.param_numel,
                dataset_train_count(j.ds),
                dataset_val_count(j.ds) ? " (+ held-out)" : "", spec->batch, spec->threads);
        plan_print(&j.p, stderr);
    }
    if (o->resume) csv_reload(&j, start);
    if (dataset_loader_init(&j.loader, j.ds, spec->seed, spec->batch, spec->flip, start, 2, err,
                            errlen))
        goto out;
    double t0 = now_s();
    double avg = 0;
    int64_t step = start, first = start;
    while (step < spec->steps) {
        if (dataset_loader_next(j.loader, step, j.x0, NULL)) {
            snprintf(err, errlen, "data loading failed at step %" PRId64, step);
            goto out;
        }
        make_inputs(&j, step, spec->seed, NULL);
        float loss = 0, norm = 0, lr = optim_lr(&spec->optim, step);
        if (upload_inputs(&j) ||
            exec_forward_backward(j.e, 1, 1.0f, spec->seed, (uint64_t)step, 0, &loss) ||
            exec_optimizer_step(j.e, &spec->optim, step + 1, lr, &norm)) {
            snprintf(err, errlen, "training step %" PRId64 " failed", step + 1);
            goto out;
        }
        if (!isfinite(loss)) {
            snprintf(err, errlen, "the loss is %g at step %" PRId64 " (diverged; lower train.lr)",
                     loss, step + 1);
            goto out;
        }
        step++;
        avg = step == first + 1 ? loss : 0.98 * avg + 0.02 * loss;
        int stopping = (o->stop && *o->stop) || (o->stop_after > 0 && step >= o->stop_after);
        int last = step == spec->steps;
        int do_ckpt = last || stopping ||
                      (spec->checkpoint_every && step % spec->checkpoint_every == 0);
        int do_log = last || step % spec->log_every == 0 || do_ckpt;
        float val = NAN;
        if (do_log) {
            if (do_ckpt && dataset_val_count(j.ds)) val = validation_loss(&j);
            double el = now_s() - t0, ips = (double)(step - first) * spec->batch / el;
            double eta = (double)(spec->steps - step) * el / (double)(step - first);
            log_push(&j, step, loss, val);
            report(&j, step, loss, (float)avg, val, lr, norm, ips, eta);
        }
        if (do_ckpt && checkpoint(&j, step, err, errlen)) goto out;
        /* a stop (Ctrl-C) only checkpoints: sampling would keep the user waiting */
        if ((last || (spec->sample_every && step % spec->sample_every == 0)) && !stopping &&
            save_samples(&j, step, err, errlen))
            goto out;
        if (stopping) {
            if (o->progress && !o->quiet) printf("\n");
            rc = TRAIN_STOPPED;
            goto out;
        }
    }
    if (o->progress && !o->quiet) printf("\n");
    if (start >= spec->steps) csv_write(&j);
    rc = TRAIN_DONE;
out:
    job_free(&j);
    return rc;
}
