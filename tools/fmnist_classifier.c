/* fmnist_classifier.c - sample quality without an Inception network: `train` fits the engine's
 * Fashion-MNIST classifier (engine/classifier.h) and saves it as safetensors; `quality` labels
 * samples of a diffusion checkpoint with it (class histogram, top-1 confidence vs real images).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "classifier.h"
#include "dataset.h"
#include "dataset_images.h"
#include "ddpm.h"
#include "exec.h"
#include "image.h"
#include "init.h"
#include "memplan.h"
#include "safetensors.h"
#include "generate.h"
#include "sampler.h"

#define FMC_FORMAT "ddpmd-fmnist-classifier"
#define FMC_VERSION "1"
#define FMC_EVAL_BATCH 250
/* the criteria */
#define FMC_CLASS_MIN 0.04
#define FMC_CLASS_MAX 0.20
#define FMC_RATIO_MIN 0.8

enum fmc_status { FMC_OK = 0, FMC_ERR = 1, FMC_USAGE = 2, FMC_QUALITY_FAIL = 3 };

static const char *fmc_class_names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress",
                                          "Coat",        "Sandal",  "Shirt",    "Sneaker",
                                          "Bag",         "Ankle boot"};

static double fmc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmc_usage(FILE *f)
{
    fprintf(f,
            "usage:\n"
            "  fmnist_classifier train OUT.safetensors [--epochs 3] [--batch 128] [--lr 0.002]\n"
            "        [--weight-decay 0.01] [--warmup 100] [--seed 1] [--threads 2]\n"
            "        [--data DIR] [--log-every 50]\n"
            "      trains on the 60,000 training images (AdamW, linear warmup then cosine to 0)\n"
            "      and reports test accuracy after each epoch\n"
            "  fmnist_classifier eval CLASSIFIER.safetensors [--threads 2] [--data DIR]\n"
            "      test-set accuracy and mean top-1 confidence\n"
            "  fmnist_classifier quality CLASSIFIER.safetensors DIFFUSION_CHECKPOINT [--n 1000]\n"
            "        [--steps 50] [--seed 1] [--batch 50] [--threads 2] [--data DIR] [--grid PNG]\n"
            "      real test images vs N samples (DDIM, EMA weights): class histogram and\n"
            "      mean top-1 confidence; PASS needs every class in [4%%, 20%%] of the labels\n"
            "      and confidence on samples >= 0.8x that on real images (exit 0 PASS, 3 FAIL)\n"
            "data: DIR defaults to %s (Debian package dataset-fashion-mnist)\n",
            DATASET_FMNIST_DIR);
}

/* ---- shared: statistics of class probabilities ---- */

struct fmc_stats {
    int n;
    int correct;          /* argmax == label (labels given) */
    double conf_sum;      /* sum of the top-1 probability */
    int hist[10];         /* argmax counts */
};

static void fmc_stats_add(struct fmc_stats *s, const float *prob, const int *labels, int n, int k)
{
    for (int i = 0; i < n; i++) {
        const float *p = prob + (size_t)i * k;
        int a = 0;
        for (int j = 1; j < k; j++)
            if (p[j] > p[a]) a = j;
        s->n++;
        s->conf_sum += p[a];
        if (a < 10) s->hist[a]++;
        if (labels && labels[i] == a) s->correct++;
    }
}

/* classifies every image of ds in runner-sized chunks */
static int fmc_eval_dataset(struct classifier_runner *r, const struct dataset *ds,
                            struct fmc_stats *st)
{
    memset(st, 0, sizeof *st);
    int n = dataset_count(ds), b = r->batch, k = r->cfg.classes;
    size_t per = (size_t)dataset_channels(ds) * dataset_size(ds) * dataset_size(ds);
    float *x = malloc((size_t)b * per * sizeof *x), *prob = malloc((size_t)b * k * sizeof *prob);
    int *labels = malloc((size_t)b * sizeof *labels), rc = FMC_ERR;
    if (!x || !prob || !labels) goto out;
    for (int first = 0; first < n; first += b) {
        int m = n - first < b ? n - first : b;
        for (int i = 0; i < m; i++) {
            memcpy(x + (size_t)i * per, tu_image_at(ds, first + i), per * sizeof *x);
            labels[i] = dataset_label(ds, first + i);
        }
        if (classifier_runner_predict(r, x, m, prob)) goto out;
        fmc_stats_add(st, prob, labels, m, k);
    }
    rc = FMC_OK;
out:
    free(x);
    free(prob);
    free(labels);
    return rc;
}

static int fmc_open_split(struct dataset **ds, const char *dir, enum dataset_fmnist_split split,
                          const struct classifier_config *c)
{
    char err[512];
    if (c->channels != 1 || c->image_size < 28) {
        fprintf(stderr, "fmnist_classifier: Fashion-MNIST needs channels 1 and size >= 28\n");
        return FMC_ERR;
    }
    if (dataset_open_fmnist(ds, dir, split, c->channels, c->image_size, DATASET_FIT_PAD, err,
                            sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        return FMC_ERR;
    }
    return FMC_OK;
}

/* ---- loading a saved classifier ---- */

static int fmc_load(struct classifier_runner *r, const char *path, int threads)
{
    char err[512];
    struct safetensors *st = NULL;
    struct classifier_config c;
    int rc = FMC_ERR;
    if (safetensors_open(&st, path, err, sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        return FMC_ERR;
    }
    const char *fmt = safetensors_meta(st, "format"), *cfg = safetensors_meta(st, "config");
    if (!fmt || strcmp(fmt, FMC_FORMAT) != 0 || !cfg) {
        fprintf(stderr, "fmnist_classifier: %s is not a classifier file (metadata format '%s')\n",
                path, fmt ? fmt : "(none)");
        goto out;
    }
    if (classifier_config_parse(&c, cfg, err, sizeof err) ||
        classifier_runner_init(r, &c, FMC_EVAL_BATCH, backend_cpu(), threads, err, sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s: %s\n", path, err);
        goto out;
    }
    for (int i = 0; i < r->g.n_tensors; i++) {
        const struct tensor *t = r->g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        float *buf = malloc(t->numel * sizeof *buf);
        if (!buf) snprintf(err, sizeof err, "out of memory");
        int bad = !buf || safetensors_read_f32(st, t->name, buf, (int64_t)t->numel, err,
                                               sizeof err) ||
                  classifier_runner_set_param(r, t->name, buf, t->numel, err, sizeof err);
        free(buf);
        if (bad) {
            fprintf(stderr, "fmnist_classifier: %s: %s\n", path, err);
            classifier_runner_free(r);
            goto out;
        }
    }
    const char *acc = safetensors_meta(st, "test_accuracy");
    fprintf(stderr, "fmnist_classifier: loaded %s (%s; recorded test accuracy %s)\n", path, cfg,
            acc ? acc : "?");
    rc = FMC_OK;
out:
    safetensors_free(st);
    return rc;
}

/* ---- train ---- */

struct fmc_train_opts {
    int epochs, batch, threads, warmup, log_every;
    float lr, weight_decay;
    uint64_t seed;
    const char *data, *out;
};

/* the runner gets the training graph's current weights */
static int fmc_copy_weights(struct classifier_runner *r, struct exec *e, const struct graph *g,
                            float *buf)
{
    char err[256];
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        if (exec_download(e, i, buf) ||
            classifier_runner_set_param(r, t->name, buf, t->numel, err, sizeof err)) {
            fprintf(stderr, "fmnist_classifier: %s\n", err);
            return FMC_ERR;
        }
    }
    return FMC_OK;
}

static int fmc_save(const struct fmc_train_opts *o, struct exec *e, const struct graph *g,
                    const struct classifier_config *c, const struct fmc_stats *test, int steps,
                    double seconds)
{
    char err[512], cfg[256], arch[1024], v[256];
    struct safetensors_writer *w = NULL;
    float *all = malloc(g->param_numel * sizeof *all);
    int rc = FMC_ERR;
    if (!all || safetensors_writer_init(&w)) {
        fprintf(stderr, "fmnist_classifier: out of memory\n");
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        const struct tensor *t = g->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        int64_t shape[4];
        for (int d = 0; d < t->rank; d++) shape[d] = t->d[d];
        if (exec_download(e, i, all + off) ||
            safetensors_writer_add(w, t->name, ST_F32, t->rank, shape, all + off)) {
            fprintf(stderr, "fmnist_classifier: cannot add %s\n", t->name);
            goto out;
        }
        off += t->numel;
    }
    classifier_config_format(c, cfg, sizeof cfg);
    classifier_describe(c, arch, sizeof arch);
    int bad = safetensors_writer_meta(w, "format", FMC_FORMAT) ||
              safetensors_writer_meta(w, "version", FMC_VERSION) ||
              safetensors_writer_meta(w, "config", cfg) ||
              safetensors_writer_meta(w, "architecture", arch) ||
              safetensors_writer_meta(w, "data",
                                      "Fashion-MNIST train split (60000), 28x28 padded to 32x32 "
                                      "on -1, pixels v/255*2-1, no augmentation");
    snprintf(v, sizeof v,
             "AdamW lr %g (warmup %d, cosine to 0) weight_decay %g clip 1, batch %d, %d epochs "
             "(%d steps), seed %" PRIu64 ", %d threads, made by tools/train_classifier.sh",
             (double)o->lr, o->warmup, (double)o->weight_decay, o->batch, o->epochs, steps,
             o->seed, o->threads);
    bad = bad || safetensors_writer_meta(w, "training", v);
    snprintf(v, sizeof v, "%.4f", (double)test->correct / test->n);
    bad = bad || safetensors_writer_meta(w, "test_accuracy", v);
    snprintf(v, sizeof v, "%.4f", test->conf_sum / test->n);
    bad = bad || safetensors_writer_meta(w, "test_mean_confidence", v);
    snprintf(v, sizeof v, "%.0f", seconds);
    bad = bad || safetensors_writer_meta(w, "train_seconds", v);
    if (bad) {
        fprintf(stderr, "fmnist_classifier: cannot set metadata\n");
        goto out;
    }
    if (safetensors_writer_save(w, o->out, err, sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        goto out;
    }
    rc = FMC_OK;
out:
    safetensors_writer_free(w);
    free(all);
    return rc;
}

static int fmc_train(const struct fmc_train_opts *o)
{
    struct classifier_config c;
    classifier_config_default(&c);
    struct dataset *train = NULL, *test = NULL;
    struct dataset_order *order = NULL;
    struct graph g;
    struct plan p;
    struct exec *e = NULL;
    struct classifier_runner r;
    struct classifier_io io;
    float *x = NULL, *onehot = NULL, *buf = NULL;
    int *labels = NULL, rc = FMC_ERR;
    char err[512];
    graph_init(&g);
    memset(&p, 0, sizeof p);
    memset(&r, 0, sizeof r);
    if (fmc_open_split(&train, o->data, DATASET_FMNIST_TRAIN, &c) ||
        fmc_open_split(&test, o->data, DATASET_FMNIST_TEST, &c))
        goto out;
    if (classifier_build(&g, &c, o->batch, &io)) {
        fprintf(stderr, "fmnist_classifier: %s\n", g.err);
        goto out;
    }
    int td[2] = {o->batch, c.classes};
    int target = graph_input(&g, "target", 2, td);
    int loss_id = graph_xent(&g, io.logits, target);
    if (loss_id < 0 || graph_backward(&g, loss_id)) {
        fprintf(stderr, "fmnist_classifier: %s\n", g.err);
        goto out;
    }
    if (plan_make(&p, &g, backend_cpu(), NULL) ||
        exec_init(&e, &g, &p, backend_cpu(), &(struct exec_opts){.threads = o->threads})) {
        fprintf(stderr, "fmnist_classifier: cannot plan or allocate the training job\n");
        goto out;
    }
    if (classifier_runner_init(&r, &c, FMC_EVAL_BATCH, backend_cpu(), o->threads, err,
                               sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        goto out;
    }
    size_t maxn = 0, per = (size_t)c.channels * c.image_size * c.image_size;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM && g.tensors[i]->numel > maxn)
            maxn = g.tensors[i]->numel;
    buf = malloc(maxn * sizeof *buf);
    x = malloc((size_t)o->batch * per * sizeof *x);
    onehot = malloc((size_t)o->batch * c.classes * sizeof *onehot);
    labels = malloc((size_t)o->batch * sizeof *labels);
    if (!buf || !x || !onehot || !labels) {
        fprintf(stderr, "fmnist_classifier: out of memory\n");
        goto out;
    }
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            init_param(g.tensors[i], o->seed, buf);
            exec_upload(e, i, buf);
        }
    exec_reset_state(e);
    if (dataset_order_init(&order, train, o->seed)) {
        fprintf(stderr, "fmnist_classifier: out of memory\n");
        goto out;
    }
    int n_train = dataset_train_count(train), per_epoch = n_train / o->batch;
    int steps = per_epoch * o->epochs;
    struct optim_config oc = {.lr = o->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = o->weight_decay, .clip = 1.0f, .ema_decay = 0.0f,
                              .warmup = o->warmup, .total_steps = steps, .cosine = 1};
    char arch[1024];
    classifier_describe(&c, arch, sizeof arch);
    printf("classifier: %s\n", arch);
    printf("parameters %zu; %d training images, batch %d, %d steps (%d epochs); plan %.1f MiB; "
           "%d threads\n",
           g.param_numel, n_train, o->batch, steps, o->epochs, p.total_bytes / 1048576.0,
           o->threads);
    fflush(stdout);
    /* train_s: seconds of training steps, the test evaluations left out */
    double tseg = fmc_now(), tlog = tseg, lsum = 0, train_s = 0;
    int lcount = 0, nlog = 0; /* steps in the loss average / since tlog */
    struct fmc_stats ts = {0};
    for (int s = 0; s < steps; s++) {
        if (dataset_batch(order, s, o->batch, 0, x, labels)) {
            fprintf(stderr, "fmnist_classifier: cannot make batch %d\n", s);
            goto out;
        }
        memset(onehot, 0, (size_t)o->batch * c.classes * sizeof *onehot);
        for (int i = 0; i < o->batch; i++) onehot[(size_t)i * c.classes + labels[i]] = 1.0f;
        float loss = 0, gn = 0;
        if (exec_upload(e, io.x, x) || exec_upload(e, target, onehot) ||
            exec_forward_backward(e, 1, 1.0f, o->seed, (uint64_t)s, 0, &loss) ||
            exec_optimizer_step(e, &oc, s + 1, optim_lr(&oc, s), &gn)) {
            fprintf(stderr, "fmnist_classifier: step %d failed\n", s);
            goto out;
        }
        if (!isfinite(loss)) {
            fprintf(stderr, "fmnist_classifier: loss is %g at step %d\n", (double)loss, s);
            goto out;
        }
        lsum += loss;
        lcount++;
        nlog++;
        if ((s + 1) % o->log_every == 0 || s + 1 == steps) {
            double now = fmc_now();
            printf("step %5d/%d  epoch %.2f  loss %.4f  lr %.2e  |g| %.3f  %.0f img/s  %.0f s\n",
                   s + 1, steps, (double)(s + 1) / per_epoch, lsum / lcount,
                   (double)optim_lr(&oc, s), (double)gn, nlog * o->batch / (now - tlog),
                   train_s + now - tseg);
            fflush(stdout);
            lsum = 0;
            lcount = nlog = 0;
            tlog = now;
        }
        if ((s + 1) % per_epoch == 0) {
            double te = fmc_now();
            train_s += te - tseg;
            if (fmc_copy_weights(&r, e, &g, buf) || fmc_eval_dataset(&r, test, &ts)) goto out;
            printf("epoch %d: test accuracy %.4f (%d/%d), mean top-1 confidence %.4f "
                   "(eval %.1f s)\n",
                   (s + 1) / per_epoch, (double)ts.correct / ts.n, ts.correct, ts.n,
                   ts.conf_sum / ts.n, fmc_now() - te);
            fflush(stdout);
            tseg = tlog = fmc_now();
            nlog = 0;
        }
    }
    if (fmc_save(o, e, &g, &c, &ts, steps, train_s)) goto out;
    printf("wrote %s: test accuracy %.4f, %.0f s of training\n", o->out,
           (double)ts.correct / ts.n, train_s);
    rc = FMC_OK;
out:
    classifier_runner_free(&r);
    exec_free(e);
    plan_free(&p);
    graph_free(&g);
    dataset_order_free(order);
    dataset_free(train);
    dataset_free(test);
    free(x);
    free(onehot);
    free(buf);
    free(labels);
    return rc;
}

/* ---- eval / quality ---- */

static void fmc_print_hist(const char *what, const struct fmc_stats *s)
{
    printf("%s, share of argmax labels per class (n = %d):\n", what, s->n);
    for (int j = 0; j < 10; j++)
        printf("  %d %-12s %6.2f%%  (%d)\n", j, fmc_class_names[j], 100.0 * s->hist[j] / s->n,
               s->hist[j]);
}

static int fmc_eval(const char *clf, const char *data, int threads)
{
    struct classifier_runner r;
    struct dataset *test = NULL;
    struct fmc_stats ts;
    if (fmc_load(&r, clf, threads)) return FMC_ERR;
    int rc = FMC_ERR;
    double t0 = fmc_now();
    if (fmc_open_split(&test, data, DATASET_FMNIST_TEST, &r.cfg) ||
        fmc_eval_dataset(&r, test, &ts))
        goto out;
    printf("real test images: accuracy %.4f (%d/%d), mean top-1 confidence %.4f (%.1f s)\n",
           (double)ts.correct / ts.n, ts.correct, ts.n, ts.conf_sum / ts.n, fmc_now() - t0);
    fmc_print_hist("real test images", &ts);
    rc = FMC_OK;
out:
    dataset_free(test);
    classifier_runner_free(&r);
    return rc;
}

struct fmc_progress {
    double t0;
    int last_pct;
};

static void fmc_sample_progress(int done, int total, void *ctx)
{
    struct fmc_progress *p = ctx;
    int pct = (int)(100.0 * done / total);
    if (pct / 10 > p->last_pct / 10 || done == total) {
        fprintf(stderr, "  sampling %3d%% (%.0f s)\n", pct, fmc_now() - p->t0);
        p->last_pct = pct;
    }
}

struct fmc_quality_opts {
    const char *clf, *ckpt, *data, *grid;
    int n, steps, batch, threads;
    uint64_t seed;
};

static int fmc_quality(const struct fmc_quality_opts *o)
{
    struct classifier_runner r;
    struct dataset *test = NULL;
    struct safetensors *st = NULL;
    struct train_spec spec;
    struct ddpm_schedule sch;
    struct generator sj;
    struct fmc_stats real, fake;
    float *img = NULL, *prob = NULL;
    int64_t step = 0;
    int rc = FMC_ERR, have_sch = 0;
    char err[512];
    memset(&sj, 0, sizeof sj);
    if (fmc_load(&r, o->clf, o->threads)) return FMC_ERR;
    /* the diffusion checkpoint first: a wrong file or option fails before any work */
    if (checkpoint_open(&st, o->ckpt, &spec, &step, err, sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        goto out;
    }
    if (spec.model.out_channels != r.cfg.channels || spec.model.image_size != r.cfg.image_size) {
        fprintf(stderr,
                "fmnist_classifier: %s makes %dx%dx%d images; the classifier takes %dx%dx%d\n",
                o->ckpt, spec.model.out_channels, spec.model.image_size, spec.model.image_size,
                r.cfg.channels, r.cfg.image_size, r.cfg.image_size);
        goto out;
    }
    if (spec.fmnist_resize)
        fprintf(stderr, "fmnist_classifier: warning: %s was trained on resized Fashion-MNIST; "
                        "the classifier saw 28x28 images padded to 32x32\n", o->ckpt);
    struct sampler_config sc;
    sampler_config_default(&sc);
    sc.steps = o->steps;
    sc.prediction = spec.prediction == SPEC_PRED_V ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;
    if (ddpm_schedule_init(&sch, spec.timesteps, spec.beta_schedule, spec.beta_start,
                           spec.beta_end)) {
        fprintf(stderr, "fmnist_classifier: cannot make the noise schedule\n");
        goto out;
    }
    have_sch = 1;
    if (o->steps < 1 || o->steps > spec.timesteps) {
        fprintf(stderr, "fmnist_classifier: --steps must be in [1, %d]\n", spec.timesteps);
        goto out;
    }
    /* 1. real test images */
    double t0 = fmc_now();
    if (fmc_open_split(&test, o->data, DATASET_FMNIST_TEST, &r.cfg) ||
        fmc_eval_dataset(&r, test, &real))
        goto out;
    double real_acc = (double)real.correct / real.n, real_conf = real.conf_sum / real.n;
    printf("real test images: accuracy %.4f (%d/%d), mean top-1 confidence %.4f (%.1f s)\n",
           real_acc, real.correct, real.n, real_conf, fmc_now() - t0);
    printf("real test images, share of argmax labels per class:");
    for (int j = 0; j < 10; j++) printf(" %.1f%%", 100.0 * real.hist[j] / real.n);
    printf("\n");
    fflush(stdout);
    /* 2. samples of the diffusion checkpoint, EMA weights */
    int batch = o->batch < o->n ? o->batch : o->n;
    size_t per = (size_t)r.cfg.channels * r.cfg.image_size * r.cfg.image_size;
    img = malloc((size_t)o->n * per * sizeof *img);
    prob = malloc((size_t)o->n * r.cfg.classes * sizeof *prob);
    if (!img || !prob) {
        fprintf(stderr, "fmnist_classifier: out of memory for %d samples\n", o->n);
        goto out;
    }
    if (generate_init(&sj, &spec.model, batch, o->threads, NULL, err, sizeof err) ||
        checkpoint_load_generator(&sj, st, 1, err, sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s: %s\n", o->ckpt, err);
        goto out;
    }
    fprintf(stderr,
            "fmnist_classifier: %d samples from %s (step %" PRId64 ", EMA weights), DDIM %d "
            "steps, seed %" PRIu64 ", batch %d\n",
            o->n, o->ckpt, step, o->steps, o->seed, batch);
    struct fmc_progress pg = {fmc_now(), 0};
    if (generate_run(&sj, &sch, &sc, o->seed, o->n, img, fmc_sample_progress, &pg)) {
        fprintf(stderr, "fmnist_classifier: sampling failed\n");
        goto out;
    }
    double sample_s = fmc_now() - pg.t0;
    if (o->grid && image_save_grid_png(o->grid, img, o->n, r.cfg.channels, r.cfg.image_size,
                                       r.cfg.image_size, (int)ceil(sqrt((double)o->n)), 2, err,
                                       sizeof err)) {
        fprintf(stderr, "fmnist_classifier: %s\n", err);
        goto out;
    }
    if (classifier_runner_predict(&r, img, o->n, prob)) {
        fprintf(stderr, "fmnist_classifier: classifying the samples failed\n");
        goto out;
    }
    memset(&fake, 0, sizeof fake);
    fmc_stats_add(&fake, prob, NULL, o->n, r.cfg.classes);
    /* 3. the report */
    printf("samples: %d from %s (step %" PRId64 ", EMA), DDIM %d steps, seed %" PRIu64
           " (%.0f s)\n",
           o->n, o->ckpt, step, o->steps, o->seed, sample_s);
    fmc_print_hist("samples", &fake);
    double lo = 1.0, hi = 0.0;
    for (int j = 0; j < 10; j++) {
        double f = (double)fake.hist[j] / fake.n;
        lo = f < lo ? f : lo;
        hi = f > hi ? f : hi;
    }
    double conf = fake.conf_sum / fake.n, ratio = conf / real_conf;
    int pass_hist = lo >= FMC_CLASS_MIN && hi <= FMC_CLASS_MAX;
    int pass_conf = ratio >= FMC_RATIO_MIN;
    printf("mean top-1 confidence: samples %.4f, real %.4f, ratio %.3f\n", conf, real_conf,
           ratio);
    printf("criterion 1, every class in [%.0f%%, %.0f%%] of the labels: min %.1f%%, max %.1f%% "
           "-> %s\n",
           100 * FMC_CLASS_MIN, 100 * FMC_CLASS_MAX, 100 * lo, 100 * hi,
           pass_hist ? "PASS" : "FAIL");
    printf("criterion 2, confidence ratio >= %.1f: %.3f -> %s\n", FMC_RATIO_MIN, ratio,
           pass_conf ? "PASS" : "FAIL");
    printf("quality: classifier test accuracy %.4f; %d samples; classes %.1f%%..%.1f%%; "
           "confidence %.4f vs %.4f real (ratio %.3f); %s\n",
           real_acc, o->n, 100 * lo, 100 * hi, conf, real_conf, ratio,
           pass_hist && pass_conf ? "PASS" : "FAIL");
    rc = pass_hist && pass_conf ? FMC_OK : FMC_QUALITY_FAIL;
out:
    generate_free(&sj);
    if (have_sch) ddpm_schedule_free(&sch);
    safetensors_free(st);
    dataset_free(test);
    classifier_runner_free(&r);
    free(img);
    free(prob);
    return rc;
}

/* ---- command line ---- */

static int fmc_int(const char *v, int lo, int hi, int *out, const char *name)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "fmnist_classifier: %s must be an integer in [%d, %d], not '%s'\n", name,
                lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int fmc_float(const char *v, float lo, float hi, float *out, const char *name)
{
    char *end;
    float x = strtof(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "fmnist_classifier: %s must be a number in [%g, %g], not '%s'\n", name,
                (double)lo, (double)hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fmc_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? FMC_USAGE : FMC_OK;
    }
    const char *cmd = argv[1], *pos[2] = {NULL, NULL};
    int npos = 0, seed_i = 1;
    struct fmc_train_opts t = {.epochs = 3, .batch = 128, .threads = 2, .warmup = 100,
                               .log_every = 50, .lr = 2e-3f, .weight_decay = 0.01f, .seed = 1,
                               .data = DATASET_FMNIST_DIR};
    struct fmc_quality_opts q = {.n = 1000, .steps = 50, .batch = 50, .threads = 2, .seed = 1,
                                 .data = DATASET_FMNIST_DIR};
    int is_train = strcmp(cmd, "train") == 0, is_quality = strcmp(cmd, "quality") == 0;
    if (!is_train && !is_quality && strcmp(cmd, "eval") != 0) {
        fprintf(stderr, "fmnist_classifier: unknown command '%s'\n", cmd);
        fmc_usage(stderr);
        return FMC_USAGE;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
#define OPT(name) (strcmp(a, name) == 0 && v && (i++, 1))
        if (OPT("--threads"))
            bad = fmc_int(v, 1, 256, is_train ? &t.threads : &q.threads, "--threads");
        else if (OPT("--data"))
            t.data = q.data = v;
        else if (OPT("--seed"))
            bad = fmc_int(v, 0, 1 << 30, &seed_i, "--seed");
        else if (is_train && OPT("--epochs"))
            bad = fmc_int(v, 1, 1000, &t.epochs, "--epochs");
        else if (is_train && OPT("--batch"))
            bad = fmc_int(v, 1, 60000, &t.batch, "--batch");
        else if (is_train && OPT("--lr"))
            bad = fmc_float(v, 0.0f, 1.0f, &t.lr, "--lr");
        else if (is_train && OPT("--weight-decay"))
            bad = fmc_float(v, 0.0f, 1.0f, &t.weight_decay, "--weight-decay");
        else if (is_train && OPT("--warmup"))
            bad = fmc_int(v, 0, 1000000, &t.warmup, "--warmup");
        else if (is_train && OPT("--log-every"))
            bad = fmc_int(v, 1, 1000000, &t.log_every, "--log-every");
        else if (is_quality && OPT("--n"))
            bad = fmc_int(v, 1, 1000000, &q.n, "--n");
        else if (is_quality && OPT("--steps"))
            bad = fmc_int(v, 1, 100000, &q.steps, "--steps");
        else if (is_quality && OPT("--batch"))
            bad = fmc_int(v, 1, 4096, &q.batch, "--batch");
        else if (is_quality && OPT("--grid"))
            q.grid = v;
        else if (a[0] != '-' && npos < 2)
            pos[npos++] = a;
        else {
            fprintf(stderr, "fmnist_classifier %s: bad option '%s'%s%s\n", cmd, a, v ? " " : "",
                    v ? v : "");
            return FMC_USAGE;
        }
#undef OPT
        if (bad) return FMC_USAGE;
    }
    t.seed = q.seed = (uint64_t)seed_i;
    if (is_train) {
        if (npos != 1) {
            fmc_usage(stderr);
            return FMC_USAGE;
        }
        t.out = pos[0];
        return fmc_train(&t);
    }
    if (!is_quality) {
        if (npos != 1) {
            fmc_usage(stderr);
            return FMC_USAGE;
        }
        return fmc_eval(pos[0], q.data, q.threads);
    }
    if (npos != 2) {
        fmc_usage(stderr);
        return FMC_USAGE;
    }
    q.clf = pos[0];
    q.ckpt = pos[1];
    return fmc_quality(&q);
}
