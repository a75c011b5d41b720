/* test_train.c - training end to end on a generated PNG folder: the loss falls; resume is exact
 * (2N steps == N steps, a stop with a checkpoint, N resumed steps: bit-identical weights, EMA
 * and AdamW state, with flip and dropout on) and provably a resume (it began at the checkpoint's
 * step and ran only the rest); --resume without a checkpoint is an error, and so is a fresh run
 * over an earlier run's checkpoints; a FIFO as checkpoint is refused at once; a stop request writes
 * a checkpoint; checkpoints keep the last K; what a kill -9 leaves (temporaries, a corrupt newest
 * checkpoint, a FIFO) does not break a resume; a changed thread count, learning rate or model is
 * refused; a bad metadata step is refused; a spec the metadata cannot hold fails before training;
 * long output paths are used whole; sampling from a checkpoint is deterministic,
 * batch-independent (to float rounding) and stops between denoising steps on request.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "image.h"
#include "philox.h"
#include "generate.h"
#include "test_util.h"
#include "test_train_util.h"
#include "train.h"

static char root[256];

/* the shared tiny spec with dropout, flips and a validation split on */
static void tiny_spec(struct train_spec *s, const char *data, int steps)
{
    tt_tiny_spec(s, data, steps);
    s->model.dropout = 0.1f;
    s->flip = 1;
    s->validation = 8;
}

static int exists(const char *dir, const char *name)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void put_file(const char *dir, const char *name, const char *text)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* a copy of checkpoint src at dst with __metadata__.step replaced */
static int copy_with_step(const char *src, const char *dst, const char *step)
{
    struct safetensors *st;
    struct safetensors_writer *w;
    char err[256];
    if (safetensors_open(&st, src, err, sizeof err)) return -1;
    safetensors_writer_init(&w);
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    const char *keys[] = {"format", "format_version", "spec", "threads"};
    for (int k = 0; k < 4; k++) safetensors_writer_meta(w, keys[k], safetensors_meta(st, keys[k]));
    safetensors_writer_meta(w, "step", step);
    int rc = safetensors_writer_save(w, dst, err, sizeof err) ? -1 : 0;
    safetensors_writer_free(w);
    safetensors_free(st);
    return rc;
}

struct stop_after_ctx {
    volatile sig_atomic_t *flag;
    int at, last;
};

/* a stop request during sampling, as a signal handler would set it */
static void stop_at(int done, int total, void *ctx)
{
    struct stop_after_ctx *c = ctx;
    (void)total;
    c->last = done;
    if (done == c->at) *c->flag = 1;
}

/* checkpoint_open of a FIFO in a child with a 20 s alarm: 0 when it failed at once naming the
 * file type, 1 when it returned otherwise, 2 when it hung in open() */
static int open_fifo_child(const char *fifo)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        struct safetensors *st = NULL;
        struct train_spec sp;
        char e[512] = "";
        int rc = checkpoint_open(&st, fifo, &sp, NULL, e, sizeof e);
        _exit(rc != 0 && strstr(e, "not a regular file") ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
    return WIFSIGNALED(status) ? 2 : WEXITSTATUS(status);
}

static int count_checkpoints(const char *out)
{
    int n = 0;
    char p[512];
    for (int s = 0; s <= 64; s++) {
        snprintf(p, sizeof p, "%s/checkpoints/step-%08d.safetensors", out, s);
        n += access(p, F_OK) == 0;
    }
    return n;
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ddpmd-test-train-XXXXXX");
    if (!mkdtemp(root)) return 1;
    char data[300], a[300], b[300], err[512];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    tt_make_discs(data);

    /* exact resume: 6 steps straight vs 3 steps, stop, resume 3 more */
    struct train_spec s;
    tiny_spec(&s, data, 6);
    struct train_opts o = {.out_dir = a, .quiet = 1};
    CHECK(train_run(&s, &o, err, sizeof err) == TRAIN_DONE, "straight run: %s", err);
    struct train_opts ob = {.out_dir = b, .quiet = 1, .stop_after = 3};
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_STOPPED, "stopped run: %s", err);
    char p3[400];
    snprintf(p3, sizeof p3, "%s/checkpoints/step-00000003.safetensors", b);
    CHECK(access(p3, F_OK) == 0, "a stop writes a checkpoint at the stop step");
    ob.stop_after = 0;
    ob.resume = TRAIN_RESUME_REQUIRED;
    struct train_stats stats;
    ob.stats = &stats;
    CHECK(train_run(&s, &ob, err, sizeof err) == TRAIN_DONE, "resumed run: %s", err);
    /* training is deterministic in (seed, step): only these tell a resume from a restart */
    CHECK(stats.resumed == 1 && stats.start_step == 3 && stats.steps_run == 3,
          "the resumed run began at step %lld and ran %lld steps (resumed %d), not 3 and 3",
          (long long)stats.start_step, (long long)stats.steps_run, stats.resumed);
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/checkpoints/step-00000006.safetensors", a);
    snprintf(pb, sizeof pb, "%s/checkpoints/step-00000006.safetensors", b);
    unsigned char *ba = NULL, *bb = NULL;
    size_t na = 0, nb = 0;
    CHECK((ba = tt_checkpoint_bytes(pa, &na)) && (bb = tt_checkpoint_bytes(pb, &nb)), "final checkpoints");
    CHECK(na == nb && na > 0 && memcmp(ba, bb, na) == 0,
          "resumed weights/EMA/AdamW differ from the uninterrupted run");
    free(ba);
    free(bb);
    CHECK(count_checkpoints(a) == 2, "keep_last 2 keeps %d checkpoints", count_checkpoints(a));
    char csv[400];
    snprintf(csv, sizeof csv, "%s/loss.csv", b);
    FILE *f = fopen(csv, "r");
    int rows = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f)) rows++;
    if (f) fclose(f);
    CHECK(rows == 7, "resumed loss.csv has %d rows (header + 6 steps)", rows);

    /* a fresh run into a folder with an earlier run's checkpoints would prune them: refused */
    CHECK(train_run(&s, &o, err, sizeof err) == TRAIN_FAILED && strstr(err, "already holds"),
          "a fresh run over checkpoints: '%s'", err);
    CHECK(count_checkpoints(a) == 2, "a refused fresh run changed the checkpoints");

    /* resuming with a different model is refused with a reason */
    struct train_spec other = s;
    other.model.channels[1] = 48;
    ob.resume = TRAIN_RESUME_REQUIRED;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_FAILED && strstr(err, "different") &&
              strstr(err, "model.block_out_channels"),
          "a mismatched resume: '%s'", err);
    /* so are a thread count (it changes every weight), a learning rate and a schedule */
    other = s;
    other.threads = 1;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_FAILED && strstr(err, "train.threads"),
          "a changed thread count is accepted: '%s'", err);
    /* and parity mode against a fast run's checkpoint (memory.deterministic: recorded there) */
    other = s;
    other.deterministic = !s.deterministic;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_FAILED &&
              strstr(err, "memory.deterministic"),
          "a changed math mode is accepted: '%s'", err);
    other = s;
    other.optim.lr = 2e-3f;
    other.beta_schedule = DDPM_BETA_COSINE;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_FAILED && strstr(err, "train.lr") &&
              strstr(err, "diffusion.beta_schedule"),
          "a changed learning rate / schedule is accepted: '%s'", err);
    /* output intervals may change (stated on stderr): a finished run resumes to done */
    other = s;
    other.log_every = 3;
    other.keep_last = 3;
    CHECK(train_run(&other, &ob, err, sizeof err) == TRAIN_DONE && stats.steps_run == 0,
          "changed output intervals: %s", err);

    /* --resume with nothing to resume is an error, not a silent fresh start */
    char fresh[300];
    snprintf(fresh, sizeof fresh, "%s/fresh", root);
    struct train_spec s2;
    tiny_spec(&s2, data, 2);
    struct train_opts of = {.out_dir = fresh, .quiet = 1, .resume = TRAIN_RESUME_REQUIRED,
                            .stats = &stats};
    CHECK(train_run(&s2, &of, err, sizeof err) == TRAIN_FAILED && strstr(err, "nothing to resume"),
          "--resume without a checkpoint: '%s'", err);
    of.resume = TRAIN_RESUME_IF_ANY;
    CHECK(train_run(&s2, &of, err, sizeof err) == TRAIN_DONE && stats.resumed == 0 &&
              stats.start_step == 0 && stats.steps_run == 2,
          "resume-or-start without a checkpoint: %s", err);

    /* what a kill -9 during a checkpoint write and other debris leave in checkpoints/: a
     * temporary, copies, other paddings, a FIFO and a corrupt newest checkpoint. The resume
     * takes the newest good one (6), removes the temporary, keeps the rest. */
    char dck[400];
    snprintf(dck, sizeof dck, "%s/checkpoints", b);
    put_file(dck, "step-00000009.safetensors.tmp.4242", "half a checkpoint");
    put_file(dck, "step-00000009.safetensors.tmp.Ab3dE9", "half a checkpoint");
    put_file(b, "loss.csv.tmp", "");
    put_file(b, "loss.csv.tmp.Qw3rTy", "step,loss");
    put_file(b, "notes.tmp.txt", "the user's");
    put_file(dck, "step-00000010.safetensors.bak", "x");
    put_file(dck, "step-00000011.safetensors.orig", "x");
    put_file(dck, "step-12.safetensors", "x");
    put_file(dck, "step-000000013.safetensors", "x");
    put_file(dck, "step-00000007.safetensors", "corrupt: a torn write on a filesystem without "
                                               "ordered rename");
    char fifo[500];
    snprintf(fifo, sizeof fifo, "%s/step-00000020.safetensors", dck);
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo: %s", strerror(errno));
    s2 = s;
    s2.steps = s2.optim.total_steps = 8; /* more steps: a change a resume may make */
    ob.resume = TRAIN_RESUME_REQUIRED;
    CHECK(train_run(&s2, &ob, err, sizeof err) == TRAIN_DONE, "resume over debris: %s", err);
    CHECK(stats.resumed && stats.start_step == 6 && stats.steps_run == 2,
          "resume over debris began at %lld, ran %lld", (long long)stats.start_step,
          (long long)stats.steps_run);
    CHECK(!exists(dck, "step-00000009.safetensors.tmp.4242") &&
              !exists(dck, "step-00000009.safetensors.tmp.Ab3dE9"),
          "stale temporaries left");
    CHECK(!exists(b, "loss.csv.tmp") && !exists(b, "loss.csv.tmp.Qw3rTy") &&
              exists(b, "notes.tmp.txt"),
          "stale loss.csv temporaries left, or a file not ours removed");
    CHECK(exists(dck, "step-00000007.safetensors.corrupt") &&
              exists(dck, "step-00000010.safetensors.bak") &&
              exists(dck, "step-00000011.safetensors.orig") && exists(dck, "step-12.safetensors") &&
              exists(dck, "step-000000013.safetensors") && access(fifo, F_OK) == 0,
          "files that are not this job's checkpoints were touched");
    unlink(fifo);
    char latest[600];
    CHECK(train_latest_checkpoint(b, latest, sizeof latest, &stats.start_step) == 0 &&
              stats.start_step == 8,
          "the newest checkpoint after resuming over debris is %lld", (long long)stats.start_step);

    /* a FIFO given as a checkpoint is refused at once instead of blocking open() */
    {
        char fp[400];
        snprintf(fp, sizeof fp, "%s/fifo.safetensors", root);
        CHECK(mkfifo(fp, 0644) == 0, "mkfifo: %s", strerror(errno));
        int r = open_fifo_child(fp);
        CHECK(r == 0, "checkpoint_open of a FIFO %s", r == 2 ? "hung" : "did not name the cause");
        unlink(fp);
    }

    /* a metadata step that is empty, not digits or beyond train.steps is refused */
    {
        char src[400], dst[400];
        snprintf(src, sizeof src, "%s/checkpoints/step-00000006.safetensors", a);
        snprintf(dst, sizeof dst, "%s/badstep.safetensors", root);
        const char *bad[] = {"", "-1", "1e3", "7 ", "99999999999999999999", "7"};
        for (int k = 0; k < 6; k++) {
            struct safetensors *bst = NULL;
            struct train_spec bs;
            int64_t bstep = -5;
            CHECK(copy_with_step(src, dst, bad[k]) == 0, "copy");
            CHECK(checkpoint_open(&bst, dst, &bs, &bstep, err, sizeof err) != 0 &&
                      strstr(err, "bad step"),
                  "metadata step '%s' accepted as %lld", bad[k], (long long)bstep);
            safetensors_free(bst);
        }
        unlink(dst);
    }

    /* a dataset path that is not UTF-8 cannot go into the metadata: the run fails before
     * training instead of ending "done" with checkpoints nobody can resume or sample */
    {
        char d8[300], o8[300];
        snprintf(d8, sizeof d8, "%s/data-\xff\xfe", root);
        snprintf(o8, sizeof o8, "%s/o8", root);
        tt_make_discs(d8);
        struct train_spec s8;
        tiny_spec(&s8, d8, 2);
        struct train_opts o8o = {.out_dir = o8, .quiet = 1};
        CHECK(train_run(&s8, &o8o, err, sizeof err) == TRAIN_FAILED && strstr(err, "UTF-8"),
              "a non-UTF-8 dataset path: '%s'", err);
        CHECK(checkpoint_check_spec(&s8, NULL, err, sizeof err) != 0 && strstr(err, "spec"),
              "checkpoint_check_spec: '%s'", err);
        CHECK(checkpoint_check_spec(&s, NULL, err, sizeof err) == 0, "a good spec: %s", err);
    }

    /* output paths: a long one is used whole (not cut at ~1 KiB), a too long one is an error */
    {
        char lp[2400];
        int n = snprintf(lp, sizeof lp, "%s", root);
        for (int k = 0; k < 9; k++) {
            n += snprintf(lp + n, sizeof lp - (size_t)n, "/");
            for (int c = 0; c < 200; c++) lp[n++] = (char)('a' + k);
            lp[n] = 0;
        }
        struct train_spec sl;
        tiny_spec(&sl, data, 1);
        sl.validation = 0;
        struct train_opts ol = {.out_dir = lp, .quiet = 1};
        CHECK(train_run(&sl, &ol, err, sizeof err) == TRAIN_DONE, "a %d-byte --out: %s", n, err);
        CHECK(exists(lp, "checkpoints/step-00000001.safetensors") && exists(lp, "loss.csv"),
              "nothing under the %d-byte --out", n);
        char *huge = malloc(5000);
        memset(huge, 'x', 4999);
        huge[0] = '/';
        huge[4999] = 0;
        ol.out_dir = huge;
        CHECK(train_run(&sl, &ol, err, sizeof err) == TRAIN_FAILED && strstr(err, "bytes"),
              "a 4999-byte --out: '%s'", err);
        free(huge);
    }

    /* sampling from a checkpoint: deterministic, independent of the batch */
    struct safetensors *st = NULL;
    struct train_spec ss;
    CHECK(checkpoint_open(&st, pa, &ss, NULL, err, sizeof err) == 0, "open: %s", err);
    struct ddpm_schedule sch;
    ddpm_schedule_init(&sch, ss.timesteps, ss.beta_schedule, ss.beta_start, ss.beta_end);
    struct sampler_config sc;
    sampler_config_default(&sc);
    sc.steps = 10;
    float img1[4 * 256], img2[4 * 256];
    struct generator j1, j2;
    CHECK(generate_init(&j1, &ss.model, 4, 2, NULL, err, sizeof err) == 0 &&
              checkpoint_load_generator(&j1, st, 1, err, sizeof err) == 0 &&
              generate_run(&j1, &sch, &sc, 7, 4, img1, NULL, NULL) == 0,
          "sample batch 4: %s", err);
    CHECK(generate_init(&j2, &ss.model, 3, 2, NULL, err, sizeof err) == 0 &&
              checkpoint_load_generator(&j2, st, 1, err, sizeof err) == 0 &&
              generate_run(&j2, &sch, &sc, 7, 4, img2, NULL, NULL) == 0,
          "sample batch 3: %s", err);
    double d = 0;
    for (int i = 0; i < 4 * 256; i++) d = fmax(d, fabs(img1[i] - img2[i]));
    /* the same noise per image whatever the batch; only GEMM blocking (rounding) differs */
    CHECK(d < 1e-3, "samples depend on the batch: max diff %g", d);
    /* a stop request ends sampling between two denoising steps */
    volatile sig_atomic_t flag = 0;
    struct stop_after_ctx sctx = {&flag, 3, 0};
    sc.stop = &flag;
    CHECK(generate_run(&j2, &sch, &sc, 7, 4, img2, stop_at, &sctx) == GENERATE_STOPPED &&
              sctx.last == 3,
          "a stop during sampling: %d of %d steps ran", sctx.last, 2 * sc.steps);
    generate_free(&j1);
    generate_free(&j2);
    ddpm_schedule_free(&sch);
    safetensors_free(st);

    /* a short run whose loss falls: 60 steps, mean of the last 10 logged losses well below the
     * first 10 */
    char c[300];
    snprintf(c, sizeof c, "%s/c", root);
    tiny_spec(&s, data, 60);
    s.model.dropout = 0;
    s.checkpoint_every = 0;
    s.optim.lr = 2e-3f;
    s.optim.warmup = 5;
    struct train_opts oc = {.out_dir = c, .quiet = 1};
    CHECK(train_run(&s, &oc, err, sizeof err) == TRAIN_DONE, "loss run: %s", err);
    snprintf(csv, sizeof csv, "%s/loss.csv", c);
    f = fopen(csv, "r");
    float losses[128];
    int nl = 0;
    while (f && fgets(line, sizeof line, f) && nl < 128) {
        long long st_;
        float l;
        if (sscanf(line, "%lld,%f", &st_, &l) == 2) losses[nl++] = l;
    }
    if (f) fclose(f);
    double first = 0, last = 0;
    for (int i = 0; i < 10 && nl >= 20; i++) {
        first += losses[i] / 10;
        last += losses[nl - 10 + i] / 10;
    }
    printf("loss: first 10 steps %.4f, last 10 steps %.4f (%d logged)\n", first, last, nl);
    CHECK(nl == 60 && last < 0.6 * first, "the loss does not fall: %.4f -> %.4f", first, last);
    char png[400];
    snprintf(png, sizeof png, "%s/loss.png", c);
    CHECK(access(png, F_OK) == 0, "no loss curve");

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_train");
}
