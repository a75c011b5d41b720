/* test_faults.c - fault injection on the readers and writers of job files. Allocation failures:
 * the Nth malloc/calloc/realloc/strdup of our code (and every cJSON allocation) fails, swept over
 * N, on spec parsing, safetensors/checkpoint load and save, PNG load/save and both dataset loaders;
 * each N must end in a clean error (or the exact reference result), never a crash or a leak (leaks
 * are checked per N under ASan, scripts/sanitize.sh). I/O failures: write (ENOSPC mid-file, EIO,
 * short writes, EINTR), fsync and rename fail on the checkpoint, PNG and loss.csv writers; each
 * must say why, keep the previous file byte for byte and leave no temporary behind. Counted:
 * the bytes read (a streamed checkpoint, `ddpmd sample`'s, is not read whole) and a run's spec
 * prints (once).
 * Linked with -Wl,--wrap=malloc,... (CMakeLists.txt): the wrappers see calls from our static
 * libraries, not from libpng or zlib (their own allocations are not failed here).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend.h"
#include "checkpoint.h"
#include "cli.h"
#include "dataset.h"
#include "dataset_images.h"
#include "exec.h"
#include "fsio.h"
#include "graph.h"
#include "image.h"
#include "memplan.h"
#include "safetensors.h"
#include "spec.h"
#include "test_train_util.h"
#include "test_util.h"
#include "train.h"

/* ---- the allocation fault layer ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

static volatile int af_armed;  /* counting allocations */
static volatile long af_seen;  /* allocations seen while armed */
static volatile long af_fail;  /* fail allocation number af_fail (1-based); 0: none */
static volatile int af_failed; /* the planned failure happened */

/* the read layer: bytes read (read, pread) while rd_on, to tell a streamed file from one read
 * whole */
ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __real_pread(int fd, void *buf, size_t n, off_t at);
ssize_t __wrap_read(int fd, void *buf, size_t n);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t at);
static int rd_on;
static long long rd_bytes;
ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    ssize_t r = __real_read(fd, buf, n);
    if (rd_on && r > 0) rd_bytes += r;
    return r;
}
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t at)
{
    ssize_t r = __real_pread(fd, buf, n, at);
    if (rd_on && r > 0) rd_bytes += r;
    return r;
}

/* the spec printer: calls (spec_to_json) while sj_on, to show a run prints its spec once */
char *__real_spec_to_json(const struct train_spec *s);
char *__wrap_spec_to_json(const struct train_spec *s);
static int sj_on, sj_calls;
char *__wrap_spec_to_json(const struct train_spec *s)
{
    if (sj_on) sj_calls++;
    return __real_spec_to_json(s);
}

static int af_hit(void)
{
    if (!af_armed) return 0;
    long k = __atomic_add_fetch(&af_seen, 1, __ATOMIC_RELAXED);
    if (k == af_fail) {
        af_failed = 1;
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n) { return af_hit() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { return af_hit() ? NULL : __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { return af_hit() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s)
{
    if (af_hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}
static void *cjson_malloc(size_t n) { return __wrap_malloc(n); }

/* ASan's leak check on demand (a weak symbol: absent outside sanitizer builds) */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void af_arm(long fail_at)
{
    af_seen = 0;
    af_fail = fail_at;
    af_failed = 0;
    af_armed = 1;
}
static void af_disarm(void) { af_armed = 0; }
static int af_leaked; /* a leak has been reported */

/* One operation under test: returns 0 when it succeeded AND its result equals the reference
 * (checked inside), 1 when it failed cleanly (an error status and a message), -1 when it did
 * something wrong (succeeded with a different result, failed without a message). */
typedef int (*af_op)(void *ctx);

/* Runs op with allocation N failing, for N = 1, 2, ... until a run sees fewer than N allocations
 * (the operation completed without meeting the failure). Every N must give 0 or 1, and 1 only
 * when the failure did happen; after each N the leak checker (under ASan) must find nothing. */
static void af_sweep(const char *what, af_op op, void *ctx)
{
    long n, clean = 0, bad = 0;
    for (n = 1; n < 20000; n++) {
        af_arm(n);
        int r = op(ctx);
        af_disarm();
        if (!(r == 0 || (r == 1 && af_failed)) && !bad++) /* the first one of each sweep */
            CHECK(0, "%s: allocation %ld failing gave %s", what, n,
                  r < 0 ? "a result unlike the reference (a failure ignored?) or no message"
                        : "a failure without a failed allocation");
        /* a leak stays leaked: after the first, later checks cannot tell new ones apart, so
         * only the first is attributed (the exit-time check still reports them all) */
        if (!af_leaked && __lsan_do_recoverable_leak_check &&
            __lsan_do_recoverable_leak_check()) {
            af_leaked = 1;
            CHECK(0, "%s: allocation %ld failing leaks (report above)", what, n);
        }
        if (r == 1) clean++;
        if (!af_failed) break; /* fewer than n allocations: the whole path has been swept */
    }
    CHECK(n < 20000, "%s: no end after %ld allocations", what, n - 1);
    printf("  %-34s %4ld allocations swept, %4ld clean failures, %ld wrong\n", what, n - 1,
           clean, bad);
}

/* ---- the I/O fault layer: write, fsync and rename as called by fsio ---- */

ssize_t __real_write(int fd, const void *b, size_t n);
int __real_fsync(int fd);
int __real_rename(const char *a, const char *b);
ssize_t __wrap_write(int fd, const void *b, size_t n);
int __wrap_fsync(int fd);
int __wrap_rename(const char *a, const char *b);

enum io_fault {
    IO_NONE = 0,
    IO_ENOSPC,     /* the disk fills after io_budget bytes: a short write, then ENOSPC */
    IO_EIO,        /* every write fails with EIO */
    IO_SHORT,      /* at most 3 bytes per write (must succeed: writers loop) */
    IO_EINTR,      /* every other write is interrupted before writing anything (must succeed) */
    IO_FSYNC_FILE, /* fsync of the file fails with EIO */
    IO_FSYNC_DIR,  /* fsync of the folder fails with EIO (after the rename) */
    IO_RENAME,     /* rename fails with EIO */
};
static volatile enum io_fault io_mode;
static volatile long io_budget, io_calls;

static int is_dir_fd(int fd)
{
    struct stat sb;
    return fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode);
}

ssize_t __wrap_write(int fd, const void *b, size_t n)
{
    if (fd <= 2) return __real_write(fd, b, n); /* the test's own output */
    switch (io_mode) {
    case IO_ENOSPC:
        if (io_budget <= 0) {
            errno = ENOSPC;
            return -1;
        }
        if ((long)n > io_budget) n = (size_t)io_budget;
        io_budget -= (long)n;
        break;
    case IO_EIO: errno = EIO; return -1;
    case IO_SHORT:
        if (n > 3) n = 3;
        break;
    case IO_EINTR:
        if (io_calls++ % 2 == 0) {
            errno = EINTR;
            return -1;
        }
        break;
    default: break;
    }
    return __real_write(fd, b, n);
}

int __wrap_fsync(int fd)
{
    int dir = is_dir_fd(fd);
    if ((io_mode == IO_FSYNC_FILE && !dir) || (io_mode == IO_FSYNC_DIR && dir)) {
        errno = EIO;
        return -1;
    }
    return __real_fsync(fd);
}

int __wrap_rename(const char *a, const char *b)
{
    if (io_mode == IO_RENAME) {
        errno = EIO;
        return -1;
    }
    return __real_rename(a, b);
}

/* ---- files ---- */

static char g_dir[64];

static const char *in_dir(const char *name)
{
    static char buf[16][600];
    static int k;
    char *p = buf[k++ & 15];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    long sz;
    *n = 0;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        b = __real_malloc((size_t)sz + 1);
        if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
            free(b);
            b = NULL;
        }
        *n = (size_t)sz;
    }
    fclose(f);
    return b;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* names in dir other than "." and ".."; writes them space-separated into list */
static int dir_entries(const char *dir, char *list, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    list[0] = '\0';
    if (!d) return -1;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        n++;
        size_t l = strlen(list);
        snprintf(list + l, len - l, "%s%s", l ? " " : "", de->d_name);
    }
    closedir(d);
    return n;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[1200];
    if (!d) return;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* ---- a tiny model to checkpoint: y = x w^T + b, mse ---- */

struct tiny {
    struct graph g;
    struct plan p;
    struct exec *e;
    struct train_spec spec;
};

static int tiny_init(struct tiny *t)
{
    struct spec_errors E;
    memset(t, 0, sizeof *t);
    if (spec_load_file("examples/fmnist-tiny.json", &t->spec, &E)) return -1;
    t->spec.threads = 1;
    graph_init(&t->g);
    int xd[2] = {2, 4}, wd[2] = {3, 4}, bd[1] = {3}, yd[2] = {2, 3};
    int x = graph_input(&t->g, "x", 2, xd);
    int w = graph_param(&t->g, "fc.weight", 2, wd);
    int b = graph_param(&t->g, "fc.bias", 1, bd);
    int target = graph_input(&t->g, "target", 2, yd);
    int y = graph_linear(&t->g, x, w, b);
    int loss = graph_mse(&t->g, y, target);
    if (loss < 0 || graph_backward(&t->g, loss)) return -1;
    if (plan_make(&t->p, &t->g, backend_cpu(), NULL)) return -1;
    if (exec_init(&t->e, &t->g, &t->p, backend_cpu(), &(struct exec_opts){.threads = 1})) return -1;
    float wv[12], bv[3];
    for (int i = 0; i < 12; i++) wv[i] = 0.125f * (float)(i - 6);
    for (int i = 0; i < 3; i++) bv[i] = 0.5f * (float)i;
    if (exec_upload(t->e, w, wv) || exec_upload(t->e, b, bv)) return -1;
    return 0;
}

static void tiny_free(struct tiny *t)
{
    exec_free(t->e);
    plan_free(&t->p);
    graph_free(&t->g);
}

/* ---- allocation-failure operations ---- */

struct spec_ctx {
    char *json;
    char *ref; /* canonical JSON of the unfaulted parse */
};

static int op_spec(void *vc)
{
    struct spec_ctx *c = vc;
    struct train_spec s;
    struct spec_errors E;
    memset(&E, 0, sizeof E);
    if (spec_parse(c->json, &s, &E)) return E.n > 0 && E.e[0].msg[0] ? 1 : -1;
    af_disarm(); /* the comparison itself must not fail */
    char *js = spec_to_json(&s);
    int same = js && !strcmp(js, c->ref);
    free(js);
    return same ? 0 : -1;
}

/* spec_to_json under failure: NULL or the exact text */
static int op_spec_json(void *vc)
{
    struct spec_ctx *c = vc;
    struct train_spec s;
    struct spec_errors E;
    int armed = af_armed;
    af_disarm();
    if (spec_parse(c->ref, &s, &E)) return -1;
    af_armed = armed;
    char *js = spec_to_json(&s);
    af_disarm();
    if (!js) return 1;
    int same = !strcmp(js, c->ref);
    free(js);
    return same ? 0 : -1;
}

struct ckpt_ctx {
    struct tiny *t;
    const char *path;     /* the checkpoint to read, or the final name to save to */
    const char *ref_path; /* the reference checkpoint (unfaulted save) */
    const char *prev_path;/* for saves: a copy of what path held before */
    char ref_spec[16384];
    size_t ref_count;
    int stream;           /* op_ckpt_open: checkpoint_open_stream */
};

static int op_st_open(void *vc)
{
    struct ckpt_ctx *c = vc;
    struct safetensors *st = NULL;
    char err[512] = "";
    if (safetensors_open(&st, c->path, err, sizeof err) != ST_OK)
        return !st && err[0] ? 1 : -1;
    int ok = safetensors_count(st) == c->ref_count;
    safetensors_free(st);
    return ok ? 0 : -1;
}

static int op_ckpt_open(void *vc)
{
    struct ckpt_ctx *c = vc;
    struct safetensors *st = NULL;
    struct train_spec s;
    int64_t step = -1;
    char err[512] = "";
    if ((c->stream ? checkpoint_open_stream : checkpoint_open)(&st, c->path, &s, &step, err,
                                                               sizeof err))
        return !st && err[0] ? 1 : -1;
    af_disarm();
    char *js = spec_to_json(&s);
    int ok = js && !strcmp(js, c->ref_spec) && step == 7 && safetensors_count(st) == c->ref_count;
    free(js);
    safetensors_free(st);
    return ok ? 0 : -1;
}

/* A checkpoint opened streamed and applied reads its header and the tensors applied, never the
 * file whole (what a resume holds: checkpoint_stream_plan_bytes), counted by the read layer;
 * opened whole, all of it */
static void stream_reads(struct tiny *t, const char *path)
{
    struct stat sb;
    struct safetensors *st = NULL;
    char err[512] = "";
    long long weights = 0;
    for (int i = 0; i < t->g.n_tensors; i++)
        if (t->g.tensors[i]->kind == TENSOR_PARAM)
            weights += (long long)t->g.tensors[i]->numel * (long long)sizeof(float);
    CHECK(stat(path, &sb) == 0, "stat %s", path);
    rd_bytes = 0;
    rd_on = 1;
    int rc = checkpoint_open_stream(&st, path, NULL, NULL, err, sizeof err);
    const long long head = rd_bytes;
    /* the weights the tiny job holds already: applying them changes nothing after */
    if (!rc) rc = checkpoint_apply(st, t->e, &t->g, CHECKPOINT_WEIGHTS, 0, err, sizeof err);
    rd_on = 0;
    safetensors_free(st);
    CHECK(rc == 0, "streamed open and apply: %s", err);
    CHECK(head + 4 * weights == (long long)sb.st_size && rd_bytes == head + weights,
          "streamed: %lld bytes read to open %lld (4 x %lld of tensors), %lld after applying the "
          "weights", head, (long long)sb.st_size, weights, rd_bytes);
    rd_bytes = 0;
    rd_on = 1;
    rc = checkpoint_open(&st, path, NULL, NULL, err, sizeof err);
    rd_on = 0;
    safetensors_free(st);
    CHECK(rc == 0 && rd_bytes == (long long)sb.st_size, "whole: %lld of %lld bytes read",
          rd_bytes, (long long)sb.st_size);
    printf("  a checkpoint of %lld bytes: %lld read streamed with its weights, %lld whole\n",
           (long long)sb.st_size, head + weights, rd_bytes);
}

/* `ddpmd sample` streams its checkpoint: it reads the header and the one part it samples from
 * (the EMA weights, or the weights with --raw), a quarter of the tensors, never the file whole.
 * Its checkpoint: a UNet trained 2 steps with a checkpoint after each, which prints its spec
 * once (train_run: the metadata check and every checkpoint reuse the text) */
static void sample_reads(void)
{
    char dir[64], data[128], out[128], ckpt[256], png[128], err[512] = "";
    snprintf(dir, sizeof dir, "/tmp/ddpmd_faults_sample_XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-00000002.safetensors", out);
    snprintf(png, sizeof png, "%s/samples.png", dir);
    tt_make_discs(data);
    int rc;
    struct train_spec s;
    tt_tiny_spec(&s, data, 2);
    s.threads = 1;
    s.checkpoint_every = 1;
    struct train_opts o = {.out_dir = out, .quiet = 1};
    sj_calls = 0;
    sj_on = 1;
    rc = train_run(&s, &o, err, sizeof err);
    sj_on = 0;
    CHECK(rc == TRAIN_DONE, "2 steps: %s", err);
    CHECK(sj_calls == 1, "a run of 2 checkpoints printed its spec %d times (once: its metadata "
          "check and checkpoints reuse the text)", sj_calls);
    struct stat sb;
    struct safetensors *st = NULL;
    CHECK(stat(ckpt, &sb) == 0, "stat %s", ckpt);
    rd_bytes = 0;
    rd_on = 1;
    rc = checkpoint_open_stream(&st, ckpt, NULL, NULL, err, sizeof err);
    rd_on = 0;
    safetensors_free(st);
    const long long head = rd_bytes, part = ((long long)sb.st_size - head) / 4;
    CHECK(rc == 0 && head > 0 && part > 0, "streamed open: %s", err);
    for (int raw = 0; raw <= 1; raw++) {
        char *argv[] = {"ddpmd", "sample", ckpt, "--n", "2", "--sampler", "ddim", "--steps", "2",
                        "--threads", "1", "--out", png, raw ? "--raw" : NULL, NULL};
        rd_bytes = 0;
        rd_on = 1;
        rc = cli_main(raw ? 14 : 13, argv);
        rd_on = 0;
        CHECK(rc == 0 && rd_bytes == head + part,
              "ddpmd sample%s: exit %d, %lld bytes read of a %lld-byte checkpoint (its header %lld "
              "and one part %lld)", raw ? " --raw" : "", rc, rd_bytes, (long long)sb.st_size,
              head, part);
        printf("  ddpmd sample%s: %lld of the checkpoint's %lld bytes read\n", raw ? " --raw" : "",
               rd_bytes, (long long)sb.st_size);
    }
    rm_tree(dir);
}

/* a failed save leaves path as it was and no temporary; a successful one writes the reference */
static int check_saved(const char *path, const char *ref_path, const char *prev_path, int rc,
                       const char *err)
{
    char list[2048];
    int n = dir_entries(g_dir, list, sizeof list);
    /* g_dir holds exactly the files the test made: a leftover temporary would add one */
    if (n != 8) {
        fprintf(stderr, "  unexpected entries in %s: %s\n", g_dir, list);
        return -1;
    }
    if (rc == 0) return same_file(path, ref_path) ? 0 : -1;
    if (!err[0]) return -1;
    return same_file(path, prev_path) ? 1 : -1;
}

static int op_ckpt_save(void *vc)
{
    struct ckpt_ctx *c = vc;
    char err[512] = "";
    int rc = checkpoint_save(c->path, c->t->e, &c->t->g, &c->t->spec, NULL, 7, err, sizeof err);
    af_disarm();
    return check_saved(c->path, c->ref_path, c->prev_path, rc, err);
}

static float g_img[3 * 5 * 4];

static int op_png_save(void *vc)
{
    struct ckpt_ctx *c = vc;
    char err[512] = "";
    int rc = image_save_png(c->path, g_img, 3, 5, 4, err, sizeof err);
    af_disarm();
    return check_saved(c->path, c->ref_path, c->prev_path, rc, err);
}

static int op_text_save(void *vc)
{
    struct ckpt_ctx *c = vc;
    char err[512] = "";
    int rc = fsio_write_atomic_text(c->path, "step,loss\n1,0.5\n2,0.25\n", err, sizeof err);
    af_disarm();
    return check_saved(c->path, c->ref_path, c->prev_path, rc, err);
}

static int op_png_load(void *vc)
{
    struct ckpt_ctx *c = vc;
    struct image im;
    char err[512] = "";
    enum image_status r = image_load_png(c->path, &im, err, sizeof err);
    if (r != IMAGE_OK) return r == IMAGE_ERR_NOMEM && !im.data && err[0] ? 1 : -1;
    af_disarm();
    int ok = im.c == 3 && im.h == 5 && im.w == 4;
    image_free(&im);
    return ok ? 0 : -1;
}

struct ds_ctx {
    const char *dir;
    int fmnist;
    struct dataset *ref;
    int size;            /* a folder's */
    int64_t src, maxpix; /* as its upload counts them, or -1 */
};

static int same_dataset(const struct dataset *a, const struct dataset *b)
{
    int n = dataset_count(a);
    if (n != dataset_count(b) || dataset_channels(a) != dataset_channels(b) ||
        dataset_size(a) != dataset_size(b))
        return 0;
    size_t per = (size_t)dataset_channels(a) * dataset_size(a) * dataset_size(a);
    for (int i = 0; i < n; i++)
        if (memcmp(tu_image_at(a, i), tu_image_at(b, i), per * sizeof(float)) ||
            dataset_label(a, i) != dataset_label(b, i))
            return 0;
    return 1;
}

static int op_dataset(void *vc)
{
    struct ds_ctx *c = vc;
    struct dataset *ds = NULL;
    struct dataset_report rep;
    char err[512] = "";
    enum dataset_status r =
        c->fmnist ? dataset_open_fmnist(&ds, c->dir, DATASET_FMNIST_TRAIN, 1, 28, DATASET_FIT_PAD,
                                        err, sizeof err)
                  : dataset_open_folder(&ds, c->dir, 1, c->size, c->src, c->maxpix, &rep, NULL,
                                        NULL, err, sizeof err);
    if (r != DATASET_OK) return !ds && err[0] ? 1 : -1;
    af_disarm();
    int ok = same_dataset(ds, c->ref);
    dataset_free(ds);
    return ok ? 0 : -1;
}

static char *read_text(const char *path)
{
    size_t n;
    unsigned char *b = slurp(path, &n);
    if (b) b[n] = '\0';
    return (char *)b;
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void test_alloc_faults(struct tiny *t)
{
    char err[512];
    printf("allocation failures:\n");

    /* the spec */
    struct spec_ctx sc = {read_text("examples/fmnist-tiny.json"), NULL};
    struct train_spec s;
    struct spec_errors E;
    CHECK(sc.json && spec_parse(sc.json, &s, &E) == 0, "reference spec parses");
    sc.ref = spec_to_json(&s);
    CHECK(sc.ref != NULL, "reference canonical JSON");
    if (sc.json && sc.ref) {
        af_sweep("spec_parse (fmnist-tiny.json)", op_spec, &sc);
        af_sweep("spec_to_json", op_spec_json, &sc);
    }
    free(sc.json);

    /* checkpoints: reference save, then loads and saves under failure */
    struct ckpt_ctx cc;
    memset(&cc, 0, sizeof cc);
    cc.t = t;
    err[0] = '\0';
    CHECK(checkpoint_save(in_dir("ref.safetensors"), t->e, &t->g, &t->spec, NULL, 7, err,
                          sizeof err) == 0, "reference checkpoint: %s", err);
    CHECK(checkpoint_save(in_dir("prev.safetensors"), t->e, &t->g, &t->spec, NULL, 3, err,
                          sizeof err) == 0, "previous checkpoint: %s", err);
    {
        char *js = spec_to_json(&t->spec); /* what the checkpoints hold (threads = 1) */
        CHECK(js != NULL, "spec_to_json");
        if (js) snprintf(cc.ref_spec, sizeof cc.ref_spec, "%s", js);
        free(js);
    }
    {
        struct safetensors *st = NULL;
        CHECK(safetensors_open(&st, in_dir("ref.safetensors"), err, sizeof err) == ST_OK,
              "reference opens: %s", err);
        cc.ref_count = safetensors_count(st);
        CHECK(cc.ref_count == 8, "reference holds 2 params x 4 parts, got %zu", cc.ref_count);
        safetensors_free(st);
    }
    free(sc.ref);
    cc.path = in_dir("ref.safetensors");
    af_sweep("safetensors_open", op_st_open, &cc);
    af_sweep("checkpoint_open", op_ckpt_open, &cc);
    cc.stream = 1;
    af_sweep("checkpoint_open_stream", op_ckpt_open, &cc);
    cc.stream = 0;
    stream_reads(t, cc.path);

    /* a save over an existing checkpoint: before each N, path holds prev again */
    size_t n;
    unsigned char *prev = slurp(in_dir("prev.safetensors"), &n);
    CHECK(prev && write_file(in_dir("ckpt.safetensors"), prev, n) == 0, "copy of prev");
    cc.path = in_dir("ckpt.safetensors");
    cc.ref_path = in_dir("ref.safetensors");
    cc.prev_path = in_dir("prev.safetensors");
    /* entries: ref, prev, ckpt, ref.png, prev.png, img.png, ref.csv, prev.csv (check_saved) */
    for (int i = 0; i < 3 * 5 * 4; i++) g_img[i] = (float)(i % 7) / 3.0f - 1.0f;
    CHECK(image_save_png(in_dir("ref.png"), g_img, 3, 5, 4, err, sizeof err) == 0, "ref png");
    CHECK(image_save_png(in_dir("prev.png"), g_img, 1, 2, 2, err, sizeof err) == 0, "prev png");
    CHECK(fsio_write_atomic_text(in_dir("ref.csv"), "step,loss\n1,0.5\n2,0.25\n", err,
                                 sizeof err) == 0, "ref csv");
    CHECK(fsio_write_atomic_text(in_dir("prev.csv"), "step,loss\n1,0.5\n", err, sizeof err) == 0,
          "prev csv");
    CHECK(image_save_png(in_dir("img.png"), g_img, 1, 2, 2, err, sizeof err) == 0, "img png");
    /* every failed save must leave ckpt == prev, so one sweep covers all N */
    af_sweep("checkpoint_save over a checkpoint", op_ckpt_save, &cc);
    free(prev);

    cc.path = in_dir("img.png");
    cc.ref_path = in_dir("ref.png");
    cc.prev_path = in_dir("prev.png");
    af_sweep("image_save_png over a PNG", op_png_save, &cc);
    /* img.png now holds the new image; load it under failure */
    af_sweep("image_load_png", op_png_load, &cc);
    prev = slurp(in_dir("prev.png"), &n);
    CHECK(prev && write_file(in_dir("img.png"), prev, n) == 0, "restore img.png");
    free(prev);

    char csv[600];
    snprintf(csv, sizeof csv, "%s", in_dir("img.png")); /* reuse the slot: one final name */
    prev = slurp(in_dir("prev.csv"), &n);
    CHECK(prev && write_file(csv, prev, n) == 0, "csv final name");
    free(prev);
    cc.path = csv;
    cc.ref_path = in_dir("ref.csv");
    cc.prev_path = in_dir("prev.csv");
    af_sweep("fsio_write_atomic_text (loss.csv)", op_text_save, &cc);

    /* datasets: a folder of 3 PNGs (one in a subfolder) and an IDX pair of 3 images */
    char folder[600], sub[700], p[800];
    snprintf(folder, sizeof folder, "%s", in_dir("pngs"));
    snprintf(sub, sizeof sub, "%s/sub", folder);
    CHECK(mkdir(folder, 0700) == 0 && mkdir(sub, 0700) == 0, "png folders");
    float px[3 * 6 * 10];
    for (int i = 0; i < 3 * 6 * 10; i++) px[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    snprintf(p, sizeof p, "%s/a.png", folder);
    CHECK(image_save_png(p, px, 1, 6, 10, err, sizeof err) == 0, "a.png: %s", err);
    snprintf(p, sizeof p, "%s/b.png", folder);
    CHECK(image_save_png(p, px, 3, 6, 10, err, sizeof err) == 0, "b.png: %s", err);
    snprintf(p, sizeof p, "%s/c.png", sub);
    CHECK(image_save_png(p, px + 7, 1, 10, 5, err, sizeof err) == 0, "sub/c.png: %s", err);
    struct ds_ctx dc = {folder, 0, NULL, 8, -1, -1};
    CHECK(dataset_open_folder(&dc.ref, folder, 1, 8, -1, -1, NULL, NULL, NULL, err, sizeof err) ==
                  0 &&
              dataset_count(dc.ref) == 3,
          "reference folder dataset: %s", err);
    if (dc.ref) af_sweep("dataset_open_folder (3 PNGs)", op_dataset, &dc);
    dataset_free(dc.ref);
    /* held as their samples (their count known, as an upload's), drawn at 40 px against floats */
    struct ds_ctx db = {folder, 0, NULL, 40, 6 * 10 + 3 * 6 * 10 + 10 * 5, 6 * 10};
    CHECK(dataset_open_folder(&db.ref, folder, 1, 40, -1, -1, NULL, NULL, NULL, err, sizeof err) ==
                  0 &&
              dataset_count(db.ref) == 3,
          "reference folder dataset at 40 px: %s", err);
    if (db.ref) af_sweep("dataset_open_folder (3 PNGs held as bytes)", op_dataset, &db);
    struct dataset *held = NULL;
    CHECK(dataset_open_folder(&held, folder, 1, 40, db.src, db.maxpix, NULL, NULL, NULL, err,
                              sizeof err) == 0 &&
              dataset_bytes(held) < dataset_bytes(db.ref),
          "the folder is not held as bytes: %s", err);
    dataset_free(held);
    dataset_free(db.ref);

    char idx[600];
    snprintf(idx, sizeof idx, "%s", in_dir("idx"));
    CHECK(mkdir(idx, 0700) == 0, "idx folder");
    unsigned char ih[16 + 3 * 784], lh[8 + 3];
    put_be32(ih, 2051);
    put_be32(ih + 4, 3);
    put_be32(ih + 8, 28);
    put_be32(ih + 12, 28);
    for (int i = 0; i < 3 * 784; i++) ih[16 + i] = (unsigned char)(i * 13);
    put_be32(lh, 2049);
    put_be32(lh + 4, 3);
    lh[8] = 2, lh[9] = 0, lh[10] = 9;
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", idx);
    CHECK(write_file(p, ih, sizeof ih) == 0, "images file");
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", idx);
    CHECK(write_file(p, lh, sizeof lh) == 0, "labels file");
    struct ds_ctx dx = {idx, 1, NULL, 28, -1, -1};
    CHECK(dataset_open_fmnist(&dx.ref, idx, DATASET_FMNIST_TRAIN, 1, 28, DATASET_FIT_PAD, err,
                              sizeof err) == 0 && dataset_count(dx.ref) == 3,
          "reference IDX dataset: %s", err);
    if (dx.ref) af_sweep("dataset_open_fmnist (3 images)", op_dataset, &dx);
    dataset_free(dx.ref);
    rm_tree(folder);
    rm_tree(idx);
}

/* ---- I/O faults ---- */

struct writer {
    const char *name;
    const char *final;  /* the file being replaced */
    const char *ref;    /* what a successful write produces */
    const char *prev;   /* what final holds before */
    int (*save)(struct tiny *t, const char *path, char *err, size_t errlen);
};

static int save_ckpt(struct tiny *t, const char *path, char *err, size_t errlen)
{
    return checkpoint_save(path, t->e, &t->g, &t->spec, NULL, 7, err, errlen);
}
static int save_png(struct tiny *t, const char *path, char *err, size_t errlen)
{
    return image_save_png(path, g_img, 3, 5, 4, err, errlen) == IMAGE_OK ? 0 : -1;
}
static int save_csv(struct tiny *t, const char *path, char *err, size_t errlen)
{
    return fsio_write_atomic_text(path, "step,loss\n1,0.5\n2,0.25\n", err, errlen);
}

static void test_io_faults(struct tiny *t)
{
    static const struct {
        enum io_fault mode;
        const char *name;
        long budget; /* IO_ENOSPC: bytes that fit; -1: half of the file */
        int errnum; /* 0: the write must succeed */
    } faults[] = {
        {IO_ENOSPC, "ENOSPC at byte 0", 0, ENOSPC},
        {IO_ENOSPC, "ENOSPC at byte 5", 5, ENOSPC},
        {IO_ENOSPC, "ENOSPC half way", -1, ENOSPC},
        {IO_EIO, "EIO on write", 0, EIO},
        {IO_SHORT, "3-byte short writes", 0, 0},
        {IO_EINTR, "EINTR on every other write", 0, 0},
        {IO_FSYNC_FILE, "EIO on fsync of the file", 0, EIO},
        {IO_RENAME, "EIO on rename", 0, EIO},
        {IO_FSYNC_DIR, "EIO on fsync of the folder", 0, -EIO},
    };
    char err[512];
    printf("I/O failures:\n");
    /* fresh folder contents: the entries are the writer's three files and nothing else */
    rm_tree(g_dir);
    CHECK(mkdir(g_dir, 0700) == 0, "recreate %s", g_dir);
    struct writer ws[] = {
        {"checkpoint_save", in_dir("w.safetensors"), in_dir("w.ref"), in_dir("w.prev"), save_ckpt},
        {"image_save_png", in_dir("w.png"), in_dir("p.ref"), in_dir("p.prev"), save_png},
        {"loss.csv (fsio_write_atomic_text)", in_dir("w.csv"), in_dir("c.ref"), in_dir("c.prev"),
         save_csv},
    };
    for (size_t wi = 0; wi < sizeof ws / sizeof *ws; wi++) {
        struct writer *w = &ws[wi];
        CHECK(w->save(t, w->ref, err, sizeof err) == 0, "%s reference: %s", w->name, err);
        const char *old = "an older file with other bytes\n";
        CHECK(write_file(w->prev, old, strlen(old)) == 0, "prev");
        for (size_t fi = 0; fi < sizeof faults / sizeof *faults; fi++) {
            size_t n;
            unsigned char *b = slurp(w->prev, &n);
            CHECK(b && write_file(w->final, b, n) == 0, "reset final");
            free(b);
            err[0] = '\0';
            size_t ref_n;
            unsigned char *rb = slurp(w->ref, &ref_n);
            free(rb);
            io_budget = faults[fi].budget >= 0 ? faults[fi].budget : (long)ref_n / 2;
            io_calls = 0;
            io_mode = faults[fi].mode;
            int rc = w->save(t, w->final, err, sizeof err);
            io_mode = IO_NONE;
            char list[2048];
            int entries = dir_entries(g_dir, list, sizeof list);
            int e = faults[fi].errnum;
            if (e == 0) {
                CHECK(rc == 0, "%s, %s: must succeed: %s", w->name, faults[fi].name, err);
                CHECK(same_file(w->final, w->ref), "%s, %s: content differs", w->name,
                      faults[fi].name);
            } else {
                const char *why = strerror(e < 0 ? -e : e);
                CHECK(rc != 0, "%s, %s: reported success", w->name, faults[fi].name);
                CHECK(strstr(err, why) != NULL, "%s, %s: error '%s' does not say '%s'", w->name,
                      faults[fi].name, err, why);
                if (e > 0)
                    CHECK(same_file(w->final, w->prev), "%s, %s: previous file changed", w->name,
                          faults[fi].name);
                else /* after the rename: the new file is complete */
                    CHECK(same_file(w->final, w->ref), "%s, %s: renamed file incomplete",
                          w->name, faults[fi].name);
            }
            CHECK(entries == 3 * (int)(wi + 1), "%s, %s: leftover entries: %s", w->name,
                  faults[fi].name, list);
            printf("  %-34s %-28s %s\n", w->name, faults[fi].name, err[0] ? err : "(ok)");
        }
    }
}

int main(void)
{
    struct tiny t;
    snprintf(g_dir, sizeof g_dir, "/tmp/ddpmd_faults_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* cJSON's allocations go through the same fault layer */
    cJSON_InitHooks(&(cJSON_Hooks){cjson_malloc, free});
    if (tiny_init(&t)) {
        CHECK(0, "tiny model (needs examples/fmnist-tiny.json in the working directory)");
        rm_tree(g_dir);
        return tu_finish("test_faults");
    }
    test_alloc_faults(&t);
    test_io_faults(&t);
    sample_reads();
    tiny_free(&t);
    rm_tree(g_dir);
    return tu_finish("test_faults");
}
