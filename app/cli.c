/* cli.c - ddpmd's commands: `train` (a spec to checkpoints), `sample` (images from a
 * checkpoint), `export` (diffusers' layout), `plan` (the bytes a job needs, before a byte is
 * allocated), `demo` (a short run on generated images) and `serve` (serve.c).
 */
#define _DEFAULT_SOURCE /* sigaction's SA_RESETHAND is not in plain POSIX.1-2008 C11 headers */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend_load.h"
#include "checkpoint.h"
#include "child.h"
#include "clock.h"
#include "ddpm.h"
#include "image.h"
#include "generate.h"
#include "sampler.h"
#include "serve.h"
#include "spec.h"
#include "testhold.h"
#include "train.h"
#include "train_step.h"
#include "exec.h"
#include "export.h"
#include "fsio.h"
#include "init.h"
#include "metrics.h"
#include "philox.h"
#include "memplan.h"
#include "unet.h"

/* the most images one `ddpmd sample` makes */
#define CLI_SAMPLE_MAX 65536

struct cli_model {
    struct unet_config cfg;
    int batch;
    int threads;
    int steps;
    uint64_t seed;
    int ch, n_mult, mult[UNET_MAX_LEVELS]; /* --ch / --mult, applied after parsing */
    const char *device;                    /* --device (default cpu) */
    int deterministic;                     /* --deterministic: parity mode (default fast) */
};

/* --device NAME: its backend from the loader (the CUDA module only when asked for); the
 * reason on stderr and the exit status (2: not a device name, 1: no such device or module)
 * on failure */
static int cli_device(const char *name, const struct backend **bk)
{
    char err[512];
    int rc = backend_load(name, bk, err, sizeof err);
    if (rc == BK_OK) return 0;
    fprintf(stderr, "ddpmd: --device %s: %s\n", name, err);
    return rc == BK_ERR_INVALID ? 2 : 1;
}

/* after a failure: the device's state when a sticky error poisoned it; the exit status to use
 * (CHILD_EXIT_POISONED, else fail_rc) */
static int cli_device_failed(const char *name, const struct backend *bk, int fail_rc)
{
    int index = backend_device_index(name);
    if (!bk || index < 0 || !backend_supports(bk, BK_OP_device_poisoned, BK_DTYPE_F32) ||
        !bk->device_poisoned(index)) return fail_rc;
    fprintf(stderr, "ddpmd: device %s is poisoned: a sticky CUDA error (named above) made its "
                    "context unusable; a new process is needed\n", name);
    return CHILD_EXIT_POISONED;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddpmd COMMAND [options]      ddpmd --version: the build's version and git revision\n"
            "\n"
            "commands:\n"
            "  train SPEC.json [--out DIR] [--resume | --resume-or-start] [--vram-budget SIZE]\n"
            "         [--device cpu|cuda:N] [--threads N] [--precision P] [--micro-batch N]\n"
            "         [--recompute R] [--offload O] [--deterministic]\n"
            "         train the model a spec describes; checkpoints, sample grids, loss.csv and\n"
            "         loss.png go to DIR (default out/NAME); Ctrl-C saves a checkpoint first.\n"
            "         --resume continues from DIR's newest usable checkpoint (an error when there\n"
            "         is none); --resume-or-start does the same but starts at step 0 when DIR has\n"
            "         no checkpoint (a job that may or may not have run before); --vram-budget\n"
            "         fits the job into SIZE device bytes (memory.vram_budget); --threads N,\n"
            "         --precision auto|f32|bf16|f16, --micro-batch auto|N, --recompute\n"
            "         auto|none|attention|resblock|level and --offload auto|off|on set\n"
            "         train.threads and memory.* the same way (a server's job runs its plan so);\n"
            "         --deterministic (memory.deterministic) trains in parity mode: on a GPU\n"
            "         bit-identical runs, no TF32, deterministic algorithms only; on the CPU\n"
            "         direct convolutions instead of Winograd; at a cost in speed (the default\n"
            "         is fast mode)\n"
            "  sample CHECKPOINT [--n 64] [--steps 50] [--sampler ddim|ddpm] [--eta 0]\n"
            "         [--spacing leading|trailing|linspace] [--variance fixed_small|fixed_large]\n"
            "         [--no-clip] [--raw] [--seed 1] [--batch 16] [--out grid.png] [--each DIR]\n"
            "         [--spec SPEC.json] [--threads N] [--progress-json] [--device cpu|cuda:N]\n"
            "         generate images (EMA weights unless --raw) into a grid PNG; --spec gives\n"
            "         the model of an imported state_dict (tools/convert_seed_ckpt.py);\n"
            "         --progress-json: a JSON line per denoising step on stdout (ddpmd serve)\n"
            "  export --diffusers DIR CHECKPOINT [--raw]\n"
            "         write a diffusers DDPMPipeline folder (EMA weights in unet/, the job's\n"
            "         DDPMScheduler in scheduler/; ddpm preset)\n"
            "  plan   SPEC.json [--vram-budget SIZE] [--all] [--json] [--device cpu|cuda:N]\n"
            "         the planner's search for a spec: its candidates (precision, micro-batch,\n"
            "         recompute, offload: the ones the engine runs; the sample grid's chunk),\n"
            "         predicted step time, bytes by part of those planned, a lower bound of\n"
            "         those a bound ruled out, whether each fits the budget (default: the\n"
            "         spec's memory.vram_budget), the chosen one marked; --all plans every\n"
            "         candidate; exit 1 when none fits (the smallest budget named)\n"
            "  plan   [model options]  the memory plan of one plain training step\n"
            "  demo   train a small model for a few steps on generated images, print the loss\n"
            "  serve  [--listen HOST:PORT] [--data DIR] [--vram-budget cpu=SIZE] ... the REST\n"
            "         service: jobs over HTTP (ddpmd serve --help lists every option)\n"
            "\n"
            "model options (both commands):\n"
            "  --preset ddpm|seed     UNet preset (default ddpm: google/ddpm-cifar10-32)\n"
            "  --image N              image size in pixels\n"
            "  --channels N           image channels (in and out)\n"
            "  --ch N --mult a,b,..   ddpm widths: base channels and multipliers\n"
            "  --layers N             ddpm resnets per level\n"
            "  --attn r,r,..          ddpm attention resolutions (pixels)\n"
            "  --groups N             ddpm group-norm groups\n"
            "  --base N               seed width (64 in the original script)\n"
            "  --batch N              micro-batch size (default 8)\n"
            "  --plain-attention      keep every L x L attention matrix for the backward\n"
            "  --tiled-attention      tile every attention (FlashAttention-style); default: plain\n"
            "                         where the matrices are at most 4x the block's input\n"
            "  --threads N            CPU threads (default: this machine's cores)\n"
            "  --deterministic        parity mode, as train --deterministic (default: fast\n"
            "                         mode, the one a training job plans and runs in)\n"
            "  --device cpu|cuda:N    the device (also for train, sample and plan SPEC.json;\n"
            "                         default cpu); cuda loads libddpmd_cuda.so\n"
            "demo options:\n"
            "  --steps N              training steps (default 30)\n"
            "  --seed N               random seed (default 1)\n");
}

/* the edit distance of a and b (insertions, deletions, substitutions, and a swap of two
 * neighbours as one), or 99 when either is longer than 63 bytes */
static int cli_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* a path as a command's messages show it: whole, or its last part for ddpmd serve's job
 * (--progress-json), whose client names files by ids, not by the server's paths */
static const char *cli_shown(int server_job, const char *path)
{
    const char *base = strrchr(path, '/');
    return server_job && base && base[1] ? base + 1 : path;
}

/* a command-line value for messages: at most 40 bytes, anything unprintable as \xNN */
static const char *cli_echo(char *buf, size_t n, const char *v)
{
    size_t o = 0, i = 0;
    buf[0] = 0;
    for (; v[i] && i < 40 && o + 5 < n; i++) {
        unsigned char c = (unsigned char)v[i];
        o += (size_t)snprintf(buf + o, n - o, c < 0x20 || c >= 0x7f ? "\\x%02x" : "%c", c);
    }
    if (v[i] && o + 4 < n) memcpy(buf + o, "...", 4);
    return buf;
}

void cli_option_error(const char *cmd, const char *arg, const char *const *known)
{
    char e[200], name[64], who[48];
    snprintf(who, sizeof who, "ddpmd%s%s", cmd ? " " : "", cmd ? cmd : "");
    /* "--threads=4" is judged by its name */
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
    const char *best = NULL;
    int best_d = 99;
    for (int i = 0; known && known[i]; i++) {
        if (strcmp(arg, known[i]) == 0 && arg[0] == '-') {
            fprintf(stderr, "%s: %s needs a value (%s --help lists the options)\n", who, known[i],
                    who);
            return;
        }
        int d = cli_distance(name, known[i]);
        if (d < best_d) best_d = d, best = known[i];
    }
    cli_echo(e, sizeof e, arg);
    /* near enough to be a typo: two edits, or a third of a longer name */
    int len = (int)strlen(name), near = best && best_d <= (len / 3 > 2 ? len / 3 : 2);
    const char *what = !cmd ? "command" : arg[0] == '-' ? "option" : "argument";
    if (arg[0] != '-' && cmd && !near)
        fprintf(stderr, "%s: unexpected argument '%s' (%s --help lists the options)\n", who, e, who);
    else
        fprintf(stderr, "%s: unknown %s '%s'%s%s%s (%s --help lists them)\n", who, what, e,
                near ? "; did you mean " : "", near ? best : "", near ? "?" : "", who);
}

/* the whole of v as a decimal int (no sign for unsigned use, no spaces, no trailing junk) */
static int cli_int(const char *flag, const char *v, int *out)
{
    char *end, e[200];
    errno = 0;
    long long x = v[0] == '-' || (v[0] >= '0' && v[0] <= '9') ? strtoll(v, &end, 10) : 0;
    if (!(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) || *end || errno == ERANGE ||
        x < INT_MIN || x > INT_MAX) {
        fprintf(stderr, "ddpmd: %s: '%s' is not an integer\n", flag, cli_echo(e, sizeof e, v));
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* an int in [lo, hi] */
static int cli_int_in(const char *flag, const char *v, int *out, int lo, int hi)
{
    if (cli_int(flag, v, out)) return -1;
    if (*out < lo || *out > hi) {
        fprintf(stderr, "ddpmd: %s: must be in [%d, %d], got %d\n", flag, lo, hi, *out);
        return -1;
    }
    return 0;
}

static int cli_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end, e[200];
    errno = 0;
    unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (!(v[0] >= '0' && v[0] <= '9') || *end || errno == ERANGE) {
        fprintf(stderr, "ddpmd: %s: '%s' is not a non-negative integer (below 2^64)\n", flag,
                cli_echo(e, sizeof e, v));
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

/* a finite number in [lo, hi], the whole of v */
static int cli_float_in(const char *flag, const char *v, float *out, double lo, double hi)
{
    char *end, e[200];
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || v[0] == ' ' || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "ddpmd: %s: must be a number in [%g, %g], got '%s'\n", flag, lo, hi,
                cli_echo(e, sizeof e, v));
        return -1;
    }
    *out = (float)x;
    return 0;
}

/* "a,b,c": up to max ints, each whole; an empty text is an empty list */
static int parse_list(const char *flag, const char *s, int *dst, int max)
{
    int n = 0;
    char e[200];
    while (*s) {
        char *end;
        errno = 0;
        long v = *s == '-' || (*s >= '0' && *s <= '9') ? strtol(s, &end, 10) : 0;
        if (!(*s == '-' || (*s >= '0' && *s <= '9')) || (*end && *end != ',') ||
            errno == ERANGE || v < INT_MIN || v > INT_MAX || (*end == ',' && !end[1])) {
            fprintf(stderr, "ddpmd: %s: '%s' is not a list of integers like 1,2,2\n", flag,
                    cli_echo(e, sizeof e, s));
            return -1;
        }
        if (n >= max) {
            fprintf(stderr, "ddpmd: %s: at most %d entries\n", flag, max);
            return -1;
        }
        dst[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* the option that sets a spec field, for messages */
static const char *cli_flag_of(const char *path)
{
    static const struct {
        const char *field, *flag;
    } map[] = {
        {"model.image_size", "--image"},          {"model.in_channels", "--channels"},
        {"model.out_channels", "--channels"},     {"model.block_out_channels", "--ch/--mult"},
        {"model.layers_per_block", "--layers"},   {"model.attention_resolutions", "--attn"},
        {"model.norm_num_groups", "--groups"},    {"model.base", "--base"},
        {"model.attn_tiled", "--plain-attention/--tiled-attention"},
        {"train.batch", "--batch"},               {"train.threads", "--threads"},
        {"train.steps", "--steps"},               {"train.seed", "--seed"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t k = strlen(map[i].field);
        if (strncmp(path, map[i].field, k) == 0 && (path[k] == 0 || path[k] == '['))
            return map[i].flag;
    }
    return NULL; /* "model": the shape as a whole (unet_config_check) */
}

static int parse_model(int argc, char **argv, struct cli_model *m)
{
    memset(m, 0, sizeof *m);
    unet_config_default(&m->cfg, UNET_DDPM);
    m->batch = 8;
    m->threads = spec_host_cores();
    m->steps = 30;
    m->seed = 1;
    m->device = "cpu";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
        if (ARG("--device")) {
            m->device = v;
        } else if (ARG("--preset")) {
            if (strcmp(v, "ddpm") && strcmp(v, "seed")) {
                char e[200];
                fprintf(stderr, "ddpmd: --preset must be ddpm or seed, not '%s'\n",
                        cli_echo(e, sizeof e, v));
                return -1;
            }
            unet_config_default(&m->cfg, strcmp(v, "seed") == 0 ? UNET_SEED : UNET_DDPM);
        } else if (ARG("--image")) {
            if (cli_int(a, v, &m->cfg.image_size)) return -1;
        } else if (ARG("--channels")) {
            if (cli_int(a, v, &m->cfg.in_channels)) return -1;
            m->cfg.out_channels = m->cfg.in_channels;
        } else if (ARG("--ch")) {
            if (cli_int(a, v, &m->ch)) return -1;
            if (m->ch < 1) {
                fprintf(stderr, "ddpmd: --ch: must be >= 1, got %d\n", m->ch);
                return -1;
            }
        } else if (ARG("--mult")) {
            m->n_mult = parse_list(a, v, m->mult, UNET_MAX_LEVELS);
            if (m->n_mult < 0) return -1;
            if (m->n_mult == 0) {
                fprintf(stderr, "ddpmd: --mult takes a list like 1,2,2\n");
                return -1;
            }
        } else if (ARG("--layers")) {
            if (cli_int(a, v, &m->cfg.layers_per_block)) return -1;
        } else if (ARG("--attn")) {
            m->cfg.n_attn = parse_list(a, v, m->cfg.attn_res, UNET_MAX_LEVELS);
            if (m->cfg.n_attn < 0) return -1;
        } else if (ARG("--groups")) {
            if (cli_int(a, v, &m->cfg.groups)) return -1;
        } else if (ARG("--base")) {
            if (cli_int(a, v, &m->cfg.base)) return -1;
        } else if (ARG("--batch")) {
            if (cli_int(a, v, &m->batch)) return -1;
        } else if (ARG("--threads")) {
            if (cli_int(a, v, &m->threads)) return -1;
        } else if (ARG("--steps")) {
            if (cli_int(a, v, &m->steps)) return -1;
        } else if (ARG("--seed")) {
            if (cli_u64(a, v, &m->seed)) return -1;
        } else if (strcmp(a, "--plain-attention") == 0) {
            m->cfg.attn_tiled = 0;
        } else if (strcmp(a, "--tiled-attention") == 0) {
            m->cfg.attn_tiled = 1;
        } else if (strcmp(a, "--deterministic") == 0) {
            m->deterministic = 1;
        } else {
            static const char *const known[] = {
                "--device", "--preset", "--image", "--channels", "--ch", "--mult", "--layers",
                "--attn", "--groups", "--base", "--batch", "--threads", "--steps", "--seed",
                "--plain-attention", "--tiled-attention", "--deterministic", NULL};
            cli_option_error(argv[1], a, known);
            return -1;
        }
#undef ARG
    }
    if (m->cfg.preset == UNET_DDPM && (m->ch || m->n_mult)) {
        /* widths in 64 bits: --ch 2000000000 x 2 must be refused, not wrap */
        long long ch = m->ch ? m->ch : m->cfg.channels[0];
        if (m->n_mult) m->cfg.n_levels = m->n_mult;
        int c0 = m->cfg.channels[0];
        for (int k = 0; k < m->cfg.n_levels; k++) {
            long long w = ch * (m->n_mult ? m->mult[k] : m->cfg.channels[k] / c0);
            if (w < INT_MIN || w > INT_MAX) {
                fprintf(stderr, "ddpmd: --ch/--mult: model.block_out_channels[%d] would be %lld "
                                "(at most %d)\n", k, w, SPEC_MAX_LIST_VALUE);
                return -1;
            }
            m->cfg.channels[k] = (int)w;
        }
    }
    /* the spec's own checks (spec_validate), so the CLI and a JSON spec accept the same models */
    struct train_spec s;
    struct spec_errors E;
    spec_defaults(&s);
    s.model = m->cfg;
    s.batch = m->batch;
    s.threads = m->threads;
    s.steps = m->steps;
    s.optim.total_steps = m->steps;
    s.seed = m->seed;
    if (spec_validate(&s, &E)) {
        for (int i = 0; i < E.n; i++) {
            const char *flag = cli_flag_of(E.e[i].path);
            if (flag)
                fprintf(stderr, "ddpmd: %s: %s: %s\n", flag, E.e[i].path, E.e[i].msg);
            else
                fprintf(stderr, "ddpmd: bad model: %s\n", E.e[i].msg);
        }
        return -1;
    }
    return 0;
}

/* graph = model + mse against a target input + backward */
static int build_training_graph(const struct cli_model *m, struct graph *g, struct unet_io *io,
                                int *target)
{
    graph_init(g);
    if (unet_build_training(g, &m->cfg, m->batch, io, target, NULL)) {
        fprintf(stderr, "ddpmd: cannot build the model: %s\n", g->err);
        return -1;
    }
    return 0;
}

/* --vram-budget SIZE into the spec's memory.vram_budget, checked as the spec checks it */
static int cli_budget(const char *v, struct train_spec *spec)
{
    int64_t b;
    char e[200];
    if (spec_parse_size(v, &b) || b < 0 || b > SPEC_BUDGET_MAX) {
        fprintf(stderr, "ddpmd: --vram-budget: '%s' is not a size such as 4GiB or 512MiB\n",
                cli_echo(e, sizeof e, v));
        return -1;
    }
    spec->vram_budget = b;
    return 0;
}

/* the cost model the searches predict with: $DDPMD_COST_MODEL's file (bench/calibrate), else the
 * compiled-in one; 0, or -1 with what (may be "") and the reason on stderr */
static int cli_cost_model(struct cost_model *m, const char *what)
{
    char err[512];
    if (train_cost_model(m, getenv("DDPMD_COST_MODEL"), err, sizeof err) == 0) return 0;
    fprintf(stderr, "ddpmd: %s%s\n", what, err);
    return -1;
}

static void mib(char *buf, size_t n, size_t b) { snprintf(buf, n, "%.1f", b / 1048576.0); }

/* `ddpmd plan SPEC.json`'s options and what it found out about the device */
struct plan_spec_opts {
    const char *path, *budget, *device;
    int json, all;
    int have_mem; /* dm holds the device's memory (backends that report it) */
    struct bk_device_mem dm;
};

/* the command line into o: 0, or 2 with the unknown option named on stderr */
static int plan_spec_args(int argc, char **argv, struct plan_spec_opts *o)
{
    *o = (struct plan_spec_opts){.device = "cpu"};
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) {
            o->all = 1;
            continue;
        }
        if (strcmp(argv[i], "--vram-budget") == 0 && i + 1 < argc)
            o->budget = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            o->device = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            o->json = 1;
        else if (argv[i][0] != '-' && !o->path)
            o->path = argv[i];
        else {
            static const char *const known[] = {"--vram-budget", "--all", "--json", "--device",
                                                NULL};
            cli_option_error("plan", argv[i], known);
            return 2;
        }
    }
    return 0;
}

/* the spec file loaded and checked for this host, --vram-budget and the thread count as
 * `ddpmd train` would run it, the device's backend and memory: 0, or the exit status with the
 * reason on stderr */
static int plan_spec_load(struct plan_spec_opts *o, struct train_spec *spec)
{
    struct spec_errors errs;
    char why[400];
    if (spec_load_file(o->path, spec, &errs)) {
        fprintf(stderr, "ddpmd: %s is not a valid spec:\n", o->path);
        spec_errors_print(&errs, "  ");
        return 2;
    }
    if (spec_host_check(spec, why, sizeof why)) {
        fprintf(stderr, "ddpmd: %s cannot run here:\n  data.dataset: %s\n", o->path, why);
        return 2;
    }
    if (o->budget && cli_budget(o->budget, spec)) return 2;
    if (!spec->threads) spec->threads = spec_host_cores(); /* as `ddpmd train` would run it */
    int drc = cli_device(o->device, &spec->backend);
    if (drc) return drc;
    o->have_mem = backend_supports(spec->backend, BK_OP_device_mem, BK_DTYPE_F32) &&
                  spec->backend->device_mem(backend_device_index(o->device), &o->dm) == BK_OK;
    return 0;
}

/* --json: train_search_json's object with the device (and its memory) added, on stdout */
static void plan_spec_print_json(const struct plan_spec_opts *o, const struct planner_result *r,
                                 int batch)
{
    cJSON *obj = train_search_json(r, batch);
    cJSON *dv = obj ? cJSON_AddObjectToObject(obj, "device") : NULL;
    if (dv) {
        cJSON_AddStringToObject(dv, "name", o->device);
        if (o->have_mem) {
            cJSON_AddStringToObject(dv, "model", o->dm.name);
            cJSON_AddNumberToObject(dv, "total_bytes", (double)o->dm.total);
            cJSON_AddNumberToObject(dv, "free_bytes", (double)o->dm.free);
            cJSON_AddNumberToObject(dv, "process_bytes", (double)o->dm.process);
        }
    }
    char *txt = obj ? cJSON_Print(obj) : NULL;
    if (txt) printf("%s\n", txt);
    free(txt);
    cJSON_Delete(obj);
}

/* candidate i's row of the table (* when chosen), and its planned parts' MiB under it */
static void plan_spec_print_candidate(const struct planner_result *r, int i,
                                      const struct train_spec *spec)
{
    const struct planner_candidate *c = &r->cand[i];
    char d[32] = "-", h[32] = "-", grid[16] = "-";
    if (c->planned) {
        mib(d, sizeof d, c->device_bytes);
        mib(h, sizeof h, c->host_bytes);
        snprintf(grid, sizeof grid, "%d", c->strategy.sample_batch);
    } else if (c->bound_bytes) { /* a lower bound ruled it out */
        d[0] = '>';
        mib(d + 1, sizeof d - 1, c->bound_bytes);
    }
    printf("  %s  %-9s %6d %-10s %-7s %4s %11s %9s %10.3f  %s\n",
           i == r->chosen ? "*" : " ", planner_precision_name(c->strategy.precision),
           c->strategy.micro_batch ? c->strategy.micro_batch : spec->batch,
           planner_recompute_name(c->strategy.recompute),
           c->strategy.offload == 1 ? "on" : "off", grid, d, h, c->predicted_s,
           c->failed                                    ? "failed"
           : c->planned                                 ? (c->fits ? "yes" : "no")
           : c->bound_bytes > (size_t)spec->vram_budget ? "no"
                                                        : "-");
    if (!c->planned) return;
    printf("       device MiB:");
    for (int k = 0; k < PLAN_PART_COUNT; k++)
        if (c->parts[k].device)
            printf(" %s %.1f", plan_part_name((enum plan_part)k), c->parts[k].device / 1048576.0);
    int any = 0;
    for (int k = 0; k < PLAN_PART_COUNT; k++)
        if (c->parts[k].host) {
            printf("%s %s %.1f", any++ ? "" : "; host MiB:", plan_part_name((enum plan_part)k),
                   c->parts[k].host / 1048576.0);
        }
    printf("\n");
}

/* the text report: the spec and device in a line or two, the candidates' table (searched in ms),
 * the chosen one's reason */
static void plan_spec_print_text(const struct plan_spec_opts *o, const struct planner_result *r,
                                 const struct train_spec *spec, double ms)
{
    const struct bk_device_mem *dm = &o->dm;
    char b[32] = "none";
    if (spec->vram_budget) snprintf(b, sizeof b, "%.2f GiB", spec->vram_budget / 1073741824.0);
    printf("%s: %s UNet, %d px, %d channels; effective batch %d; device budget %s\n", o->path,
           spec->model.preset == UNET_DDPM ? "ddpm" : "seed", spec->model.image_size,
           spec->model.in_channels, spec->batch, b);
    if (o->have_mem)
        printf("device %s (%s, sm_%d%d): %.1f MiB, %.1f MiB free; the process itself holds "
               "%.1f MiB there (context, library handles, modules: measured after the "
               "warm-up)\n", o->device, dm->name, dm->cc_major, dm->cc_minor,
               dm->total / 1048576.0, dm->free / 1048576.0, dm->process / 1048576.0);
    int planned = 0;
    for (int i = 0; i < r->n_cand; i++) planned += r->cand[i].planned;
    printf("%d candidate%s, %d planned (searched in %.0f ms), fastest predicted first%s:\n",
           r->n_cand, r->n_cand == 1 ? "" : "s", planned, ms,
           o->all || r->chosen < 0 ? "" : "; those after the chosen one are not planned");
    printf("     %-9s %6s %-10s %-7s %4s %11s %9s %10s  %s\n", "precision", "micro",
           "recompute", "offload", "grid", "device MiB", "host MiB", "step s", "fits");
    for (int i = 0; i < r->n_cand; i++) plan_spec_print_candidate(r, i, spec);
    if (r->chosen >= 0) printf("chosen (*): %s\n", r->why);
}

/* `ddpmd plan SPEC.json [--vram-budget SIZE] [--all] [--json]`: the search and its candidates */
static int cmd_plan_spec(int argc, char **argv)
{
    struct plan_spec_opts o;
    struct train_spec spec;
    int erc = plan_spec_args(argc, argv, &o);
    if (!erc) erc = plan_spec_load(&o, &spec);
    if (erc) return erc;
    struct planner_result r;
    struct cost_model cost;
    char err[512];
    if (cli_cost_model(&cost, "")) return 1;
    double t0 = clock_now_s();
    int rc = train_search(&spec, &cost, o.all, &r, err, sizeof err);
    double ms = 1e3 * (clock_now_s() - t0);
    if (o.json)
        plan_spec_print_json(&o, &r, spec.batch);
    else
        plan_spec_print_text(&o, &r, &spec, ms);
    if (rc) fprintf(stderr, "ddpmd: %s\n", err);
    planner_result_free(&r);
    return rc ? 1 : 0;
}

static int cmd_plan(int argc, char **argv)
{
    if (argc > 2 && argv[2][0] != '-') return cmd_plan_spec(argc, argv);
    struct cli_model m;
    if (parse_model(argc, argv, &m)) return 2;
    struct graph g;
    struct unet_io io;
    int target;
    const struct backend *bk;
    int drc = cli_device(m.device, &bk);
    if (drc) return drc;
    if (build_training_graph(&m, &g, &io, &target)) return 1;
    /* in the mode a training job plans in (fast unless --deterministic): the workspaces differ */
    if (backend_supports(bk, BK_OP_set_parity, BK_DTYPE_F32)) bk->set_parity(m.deterministic);
    struct plan p;
    /* a job's plan: one forward/backward a step (the gradients may live in the arena) */
    struct plan_opts po = {.one_pass = 1};
    double t0 = clock_now_s();
    if (plan_make(&p, &g, bk, &po)) {
        fprintf(stderr, "ddpmd: planning failed\n");
        graph_free(&g);
        return 1;
    }
    double ms = 1e3 * (clock_now_s() - t0);
    printf("model: %s, %d px, %d channels, %zu parameters; micro-batch %d, %s attention\n",
           m.cfg.preset == UNET_DDPM ? "ddpm" : "seed", m.cfg.image_size, m.cfg.in_channels,
           g.param_numel, m.batch, m.cfg.attn_tiled < 0 ? "auto" : m.cfg.attn_tiled ? "tiled" : "plain");
    printf("graph: %d ops (%d forward), %d tensors; planned in %.1f ms\n", g.n_ops, g.n_fwd_ops,
           g.n_tensors, ms);
    plan_print(&p, stdout);
    plan_free(&p);
    graph_free(&g);
    return 0;
}

/* generated training images: soft random blobs, a smooth distribution a UNet learns fast */
static void demo_images(float *x, int n, int c, int s, uint64_t seed, uint64_t step)
{
    for (int i = 0; i < n; i++) {
        float cx = philox_uniform_at(seed, PHILOX_TAG_SHUFFLE, step, (uint32_t)i, 0, 0) * s;
        float cy = philox_uniform_at(seed, PHILOX_TAG_SHUFFLE, step, (uint32_t)i, 0, 1) * s;
        float r = (0.15f + 0.25f * philox_uniform_at(seed, PHILOX_TAG_SHUFFLE, step,
                                                     (uint32_t)i, 0, 2)) * s;
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < s; y++)
                for (int xx = 0; xx < s; xx++) {
                    float d2 = ((xx - cx) * (xx - cx) + (y - cy) * (y - cy)) / (r * r);
                    x[(((size_t)i * c + ch) * s + y) * s + xx] = 2.0f * expf(-d2) - 1.0f;
                }
    }
}

static int cmd_demo(int argc, char **argv)
{
    struct cli_model m;
    if (parse_model(argc, argv, &m)) return 2;
    const struct backend *bk;
    int drc = cli_device(m.device, &bk);
    if (drc) return drc;
    /* the plain step of the whole batch, no sample grid, on generated images */
    struct train_step_config c = {
        .shape = {.model = m.cfg, .batch = m.batch, .grid_images = 0, .backend = bk,
                  .deterministic = m.deterministic},
        .threads = m.threads, .timesteps = 1000, .beta_schedule = DDPM_BETA_LINEAR,
        .beta_start = 1e-4, .beta_end = 0.02, .prediction = SAMPLER_PRED_EPSILON};
    struct train_step ts;
    struct graph *g = &ts.tp.g;
    char err[512];
    float *w = NULL;
    int rc = 1;
    if (train_step_init(&ts, &c, NULL, err, sizeof err)) {
        fprintf(stderr, "ddpmd: %s\n", err);
        goto out;
    }
    printf("ddpmd demo: %s UNet, %zu parameters, %d px, batch %d, %d threads\n",
           m.cfg.preset == UNET_DDPM ? "ddpm" : "seed", g->param_numel, m.cfg.image_size, m.batch,
           m.threads);
    printf("memory plan (allocated once, before the first step):\n");
    plan_print(&ts.tp.p, stdout);
    size_t maxn = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i]->kind == TENSOR_PARAM && g->tensors[i]->numel > maxn)
            maxn = g->tensors[i]->numel;
    w = malloc(maxn * sizeof *w);
    if (!w) goto out;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i]->kind == TENSOR_PARAM) {
            init_param(g->tensors[i], m.seed, w);
            exec_upload(ts.e, i, w);
        }
    exec_reset_state(ts.e);
    struct optim_config oc = {.lr = 2e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.0f, .clip = 1.0f, .ema_decay = 0.999f,
                              .warmup = 5, .total_steps = m.steps};
    double t0 = clock_now_s(), ema_loss = 0;
    for (int s = 0; s < m.steps; s++) {
        struct train_step_result r;
        demo_images(ts.x0, m.batch, m.cfg.in_channels, m.cfg.image_size, m.seed, (uint64_t)s);
        if (train_step_run(&ts, m.seed, s, &oc, &r, err, sizeof err)) {
            fprintf(stderr, "ddpmd: step %d failed\n", s + 1);
            goto out;
        }
        ema_loss = s == 0 ? r.loss : 0.9 * ema_loss + 0.1 * r.loss;
        double el = clock_now_s() - t0;
        printf("step %4d/%d  loss %.4f  (avg %.4f)  grad-norm %.3f  %.1f img/s\n", s + 1,
               m.steps, r.loss, ema_loss, r.grad_norm, (s + 1) * m.batch / el);
        fflush(stdout);
    }
    rc = 0;
out:
    free(w);
    train_step_free(&ts);
    return rc;
}

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* v as one of name(lo..hi) ("auto", "f32", ...: planner_precision_name and the like) */
static int cli_name(const char *flag, const char *v, const char *(*name)(int), int lo, int hi,
                    int *out)
{
    for (int i = lo; i <= hi; i++)
        if (strcmp(v, name(i)) == 0) {
            *out = i;
            return 0;
        }
    char e[200], list[200];
    size_t n = 0;
    for (int i = lo; i <= hi && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i > lo ? ", " : "", name(i));
    fprintf(stderr, "ddpmd: %s: '%s' is not one of %s\n", flag, cli_echo(e, sizeof e, v), list);
    return -1;
}

static const char *offload_name(int v) { return v < 0 ? "auto" : v ? "on" : "off"; }

/* the options of `ddpmd train` that set spec fields (a server's job runs its admitted plan
 * through them: its threads, budget and strategy), applied in order, then checked as the spec
 * checks them */
struct train_overrides {
    const char *budget, *threads, *precision, *micro_batch, *recompute, *offload;
    int deterministic; /* --deterministic: memory.deterministic on */
};

static int cli_train_overrides(const struct train_overrides *o, struct train_spec *spec)
{
    struct strategy *st = &spec->strategy;
    if (o->budget && cli_budget(o->budget, spec)) return -1;
    if (o->threads && cli_int_in("--threads", o->threads, &spec->threads, 1, SPEC_THREADS_MAX))
        return -1;
    if (o->precision && cli_name("--precision", o->precision, planner_precision_name,
                                 STRATEGY_PRECISION_AUTO, STRATEGY_PRECISION_F16, &st->precision))
        return -1;
    if (o->micro_batch && strcmp(o->micro_batch, "auto") == 0)
        st->micro_batch = 0;
    else if (o->micro_batch &&
             cli_int_in("--micro-batch", o->micro_batch, &st->micro_batch, 1, SPEC_BATCH_MAX))
        return -1;
    if (o->recompute && cli_name("--recompute", o->recompute, planner_recompute_name,
                                 STRATEGY_RECOMPUTE_AUTO, STRATEGY_RECOMPUTE_LEVEL, &st->recompute))
        return -1;
    if (o->offload && cli_name("--offload", o->offload, offload_name, -1, 1, &st->offload))
        return -1;
    if (o->deterministic) spec->deterministic = 1;
    struct spec_errors E;
    if (spec_validate(spec, &E) == 0) return 0;
    for (int i = 0; i < E.n; i++) fprintf(stderr, "ddpmd: %s: %s\n", E.e[i].path, E.e[i].msg);
    return -1;
}

/* train.threads when the spec names none (0): a resumed run's checkpoint's count (its results
 * are those of the count it started with), else this machine's cores; said on stderr */
static void cli_auto_threads(struct train_spec *spec, const char *out, int resume)
{
    if (spec->threads > 0) return;
    const char *why = "this machine's cores";
    char path[FSIO_PATH_MAX], err[256];
    int64_t step;
    struct safetensors *st = NULL;
    struct train_spec *saved = resume && out ? malloc(sizeof *saved) : NULL;
    if (saved && train_latest_checkpoint(out, path, sizeof path, &step) == 0 &&
        checkpoint_open_stream(&st, path, saved, NULL, err, sizeof err) == 0 &&
        saved->threads > 0) {
        spec->threads = saved->threads;
        why = "the count its checkpoint was trained with";
    }
    safetensors_free(st);
    free(saved);
    if (!spec->threads) spec->threads = spec_host_cores();
    fprintf(stderr, "ddpmd: train.threads not given: %d thread%s (%s)\n", spec->threads,
            spec->threads == 1 ? "" : "s", why);
}

static int cmd_train(int argc, char **argv)
{
    const char *spec_path = NULL, *out = NULL, *device = "cpu";
    struct train_overrides ov = {0};
    int resume = 0, had_root = 1; /* had_root: out/ was there before (the default --out) */
    int server_job = 0;           /* --progress-json: run by ddpmd serve */
    char def_out[1100];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name, dst) (strcmp(a, name) == 0 && v && (dst = v, i++, 1))
        if (OPT("--vram-budget", ov.budget) || OPT("--threads", ov.threads) ||
            OPT("--precision", ov.precision) || OPT("--micro-batch", ov.micro_batch) ||
            OPT("--recompute", ov.recompute) || OPT("--offload", ov.offload))
            continue;
#undef OPT
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--resume") == 0)
            resume = TRAIN_RESUME_REQUIRED;
        else if (strcmp(argv[i], "--resume-or-start") == 0)
            resume = TRAIN_RESUME_IF_ANY;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--deterministic") == 0)
            ov.deterministic = 1;
        else if (strcmp(argv[i], "--progress-json") == 0)
            server_job = 1;
        else if (argv[i][0] != '-' && !spec_path)
            spec_path = argv[i];
        else {
            static const char *const known[] = {
                "--out", "--resume", "--resume-or-start", "--vram-budget", "--device",
                "--threads", "--precision", "--micro-batch", "--recompute", "--offload",
                "--deterministic", "--progress-json", NULL};
            cli_option_error("train", argv[i], known);
            return 2;
        }
    }
    if (!spec_path) {
        fprintf(stderr, "usage: ddpmd train SPEC.json [--out DIR] [--resume | --resume-or-start] "
                        "[--vram-budget SIZE] [--device cpu|cuda:N] [--threads N] [--precision P] "
                        "[--micro-batch N] [--recompute R] [--offload O] [--deterministic]\n");
        return 2;
    }
    struct train_spec spec;
    struct spec_errors errs;
    char why[400];
    if (spec_load_file(spec_path, &spec, &errs)) {
        fprintf(stderr, "ddpmd: %s is not a valid spec:\n", spec_path);
        spec_errors_print(&errs, "  ");
        return 2;
    }
    if (spec_host_check(&spec, why, sizeof why)) {
        fprintf(stderr, "ddpmd: %s cannot run here:\n  data.dataset: %s\n", spec_path, why);
        return 2;
    }
    if (cli_train_overrides(&ov, &spec)) return 2;
    int drc = cli_device(device, &spec.backend);
    if (drc) return drc;
    if (!out) {
        const char *base = strrchr(spec_path, '/');
        base = base ? base + 1 : spec_path;
        snprintf(def_out, sizeof def_out, "out/%.*s", (int)strcspn(base, "."), base);
        had_root = access("out", F_OK) == 0;
        mkdir("out", 0755);
        out = def_out;
    }
    cli_auto_threads(&spec, out, resume);
    const int had_out = access(out, F_OK) == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct cost_model cost;
    if (cli_cost_model(&cost, "training failed: ")) return 1;
    struct train_opts o = {.out_dir = out, .resume = resume, .progress = !server_job && isatty(1),
                           .names_only = server_job, .stop = &stop_flag, .cost = &cost};
    char err[512];
    int rc = train_run(&spec, &o, err, sizeof err);
    if (rc == TRAIN_FAILED) {
        fprintf(stderr, "ddpmd: training failed: %s\n", err);
        /* a run that failed leaves no empty folders it made (rmdir takes only empty ones) */
        char sub[1200];
        for (int i = 0; !had_out && i < 2; i++) {
            snprintf(sub, sizeof sub, "%s/%s", out, i ? "samples" : "checkpoints");
            rmdir(sub);
        }
        if (!had_out) rmdir(out);
        if (!had_root) rmdir("out");
        return cli_device_failed(device, spec.backend, 1);
    }
    if (server_job)
        fprintf(stderr, "ddpmd: %s\n", rc == TRAIN_STOPPED ? "stopped with a checkpoint" : "done");
    else
        fprintf(stderr, "ddpmd: %s; checkpoints in %s/checkpoints, samples in %s/samples, loss in "
                        "%s/loss.csv and loss.png\n",
                rc == TRAIN_STOPPED ? "stopped (resume with --resume)" : "done", out, out, out);
    return rc == TRAIN_STOPPED ? CHILD_EXIT_STOPPED : 0;
}

/* ctx non-NULL (--progress-json, for ddpmd serve): a protocol event (child.h) per denoising
 * step on stdout, {"event":"sampling","done":D,"total":T} */
static void sample_progress(int done, int total, void *ctx)
{
    if (ctx) {
        struct child_event e = {.kind = CHILD_EVENT_SAMPLING};
        child_event_set(&e, CHILD_DONE, done);
        child_event_set(&e, CHILD_TOTAL, total);
        child_event_write(stdout, &e);
    }
    if (isatty(2)) {
        fprintf(stderr, "\rsampling %d/%d", done, total);
        if (done == total) fprintf(stderr, "\n");
    }
}

/* ddpmd export --diffusers DIR CHECKPOINT: the DDPMPipeline folder of the EMA weights under
 * diffusers' names (export.h) */
static int cmd_export(int argc, char **argv)
{
    const char *dir = NULL, *ckpt = NULL;
    int raw = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--diffusers") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--raw") == 0)
            raw = 1;
        else if (argv[i][0] != '-' && !ckpt)
            ckpt = argv[i];
        else {
            static const char *const known[] = {"--diffusers", "--raw", NULL};
            cli_option_error("export", argv[i], known);
            return 2;
        }
    }
    if (!dir || !ckpt) {
        fprintf(stderr, "usage: ddpmd export --diffusers DIR CHECKPOINT [--raw]\n");
        return 2;
    }
    char err[800];
    if (export_diffusers(ckpt, dir, raw, err, sizeof err) != EXPORT_OK) {
        fprintf(stderr, "ddpmd: %s\n", err);
        return 1;
    }
    fprintf(stderr, "ddpmd: wrote the DDPMPipeline %s (%s weights in unet/, the job's "
                    "DDPMScheduler in scheduler/); load with DDPMPipeline.from_pretrained(\"%s\")\n",
            dir, raw ? "raw" : "EMA", dir);
    return 0;
}

/* `ddpmd sample`'s options */
struct sample_opts {
    const char *ckpt, *out, *each, *spec_path, *device;
    int n, batch, raw, threads, progress_json;
    uint64_t seed;
    struct sampler_config sc;
};

/* what a sampling run holds, stage by stage: the checkpoint's header (streamed: its tensors are
 * read one at a time as the generator takes them, the file is never held whole), its spec and
 * step, the generator with the weights, the schedule, then the images */
struct sample_run {
    const struct backend *bk;
    struct safetensors *st;
    struct train_spec spec;
    int64_t step;
    struct ddpm_schedule sch;
    struct generator gen;
    float *img;
    size_t per; /* floats per image */
    double t0;  /* when sampling began */
};

/* the command line into o: 0, or the exit status (2) with the reason on stderr */
static int sample_options(int argc, char **argv, struct sample_opts *o)
{
    *o = (struct sample_opts){.out = "samples.png", .device = "cpu", .n = 64, .batch = 16,
                              .threads = spec_host_cores(), .seed = 1};
    struct sampler_config *sc = &o->sc;
    sampler_config_default(sc);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(a, name) == 0 && v && (i++, 1))
        if (OPT("--n")) {
            if (cli_int_in(a, v, &o->n, 1, CLI_SAMPLE_MAX)) return 2;
        } else if (OPT("--steps")) {
            /* at most the model's timesteps: checked again once the checkpoint is read */
            if (cli_int_in(a, v, &sc->steps, 1, 100000)) return 2;
        } else if (OPT("--sampler")) {
            if (sampler_kind_parse(v, &sc->kind)) goto bad;
        } else if (OPT("--eta")) {
            if (cli_float_in(a, v, &sc->eta, 0, 1)) return 2;
        } else if (OPT("--spacing")) {
            if (sampler_spacing_parse(v, &sc->spacing)) goto bad;
        } else if (OPT("--variance")) {
            if (sampler_variance_parse(v, &sc->variance)) goto bad;
        } else if (strcmp(a, "--no-clip") == 0)
            sc->clip_x0 = 0;
        else if (strcmp(a, "--raw") == 0)
            o->raw = 1;
        else if (strcmp(a, "--progress-json") == 0)
            o->progress_json = 1;
        else if (OPT("--seed")) {
            if (cli_u64(a, v, &o->seed)) return 2;
        } else if (OPT("--batch")) {
            if (cli_int_in(a, v, &o->batch, 1, SPEC_BATCH_MAX)) return 2;
        } else if (OPT("--threads")) {
            if (cli_int_in(a, v, &o->threads, 1, SPEC_THREADS_MAX)) return 2;
        } else if (OPT("--out"))
            o->out = v;
        else if (OPT("--each"))
            o->each = v;
        else if (OPT("--spec"))
            o->spec_path = v;
        else if (OPT("--device"))
            o->device = v;
        else if (a[0] != '-' && !o->ckpt)
            o->ckpt = a;
        else {
            static const char *const known[] = {
                "--n", "--steps", "--sampler", "--eta", "--spacing", "--variance", "--no-clip",
                "--raw", "--seed", "--batch", "--out", "--each", "--spec", "--threads",
                "--progress-json", "--device", NULL};
            cli_option_error("sample", a, known);
            return 2;
        bad:;
            char e1[200], e2[200];
            fprintf(stderr, "ddpmd sample: %s: '%s' is not a value it takes (ddpmd sample --help "
                            "lists them)\n", cli_echo(e1, sizeof e1, a), cli_echo(e2, sizeof e2, v));
            return 2;
        }
#undef OPT
    }
    if (!o->ckpt || o->n < 1 || o->batch < 1 || o->threads < 1) {
        fprintf(stderr, "usage: ddpmd sample CHECKPOINT [--n 64] [--steps 50] ...\n");
        return 2;
    }
    if (o->batch > o->n) o->batch = o->n;
    return 0;
}

/* the device, then the checkpoint's header streamed (checkpoint_open_stream): its spec (or
 * --spec's for an imported state_dict) and step; no EMA weights turn o->raw on. 0, or the exit
 * status with the reason on stderr */
static int sample_open(struct sample_opts *o, struct sample_run *r)
{
    int drc = cli_device(o->device, &r->bk);
    if (drc) return drc;
    char err[512];
    if (o->spec_path) {
        /* an imported state_dict (tools/convert_seed_ckpt.py) has no spec: take the model from
         * the given one */
        struct spec_errors errs;
        if (spec_load_file(o->spec_path, &r->spec, &errs)) {
            fprintf(stderr, "ddpmd: %s is not a valid spec:\n", o->spec_path);
            spec_errors_print(&errs, "  ");
            return 2;
        }
        if (checkpoint_open_stream(&r->st, o->ckpt, NULL, &r->step, err, sizeof err)) {
            fprintf(stderr, "ddpmd: %s\n", err);
            return 1;
        }
    } else if (checkpoint_open_stream(&r->st, o->ckpt, &r->spec, &r->step, err, sizeof err)) {
        fprintf(stderr, "ddpmd: %s%s\n", err,
                strstr(err, "no spec") ? " (for an imported state_dict, add --spec SPEC.json)" : "");
        return 1;
    }
    const struct st_tensor *first, *probe;
    if (!o->raw && safetensors_get(r->st, 0, &first) == ST_OK) {
        char name[600];
        snprintf(name, sizeof name, "ema.%s", first->name);
        if (strncmp(first->name, "ema.", 4) != 0 && safetensors_find(r->st, name, &probe)) {
            fprintf(stderr, "ddpmd: %s has no EMA weights; sampling from its weights\n",
                    cli_shown(o->progress_json, o->ckpt));
            o->raw = 1;
        }
    }
    if (o->sc.kind == SAMPLER_DDIM && o->sc.steps > r->spec.timesteps) {
        fprintf(stderr, "ddpmd: --steps: must be at most the model's diffusion.timesteps (%d), "
                        "got %d\n", r->spec.timesteps, o->sc.steps);
        return 2;
    }
    o->sc.prediction = r->spec.prediction == SPEC_PRED_V ? SAMPLER_PRED_V : SAMPLER_PRED_EPSILON;
    return 0;
}

/* the schedule, the generator planned for o->batch (generate_init) and the weights (EMA unless
 * o->raw) read into it a tensor at a time; the checkpoint is closed after, so sampling holds
 * none of it (the host plan's phases: train_sample_host_plan). 0 or 1 */
static int sample_plan(const struct sample_opts *o, struct sample_run *r)
{
    char err[512];
    const struct train_spec *s = &r->spec;
    if (ddpm_schedule_init(&r->sch, s->timesteps, s->beta_schedule, s->beta_start, s->beta_end)) {
        fprintf(stderr, "ddpmd: out of memory\n");
        return 1;
    }
    int rc = generate_init(&r->gen, &s->model, o->batch, o->threads, r->bk, err, sizeof err) ||
             checkpoint_load_generator(&r->gen, r->st, !o->raw, err, sizeof err);
    safetensors_free(r->st);
    r->st = NULL;
    if (rc) {
        fprintf(stderr, "ddpmd: %s\n", err);
        return 1;
    }
    testhold_phase(o->out, "weights");
    return 0;
}

/* o->n images into r->img (generate_run); 0 or 1 */
static int sample_images(const struct sample_opts *o, struct sample_run *r)
{
    const struct train_spec *s = &r->spec;
    r->per = (size_t)s->model.out_channels * s->model.image_size * s->model.image_size;
    r->img = malloc((size_t)o->n * r->per * sizeof *r->img);
    if (!r->img) {
        fprintf(stderr, "ddpmd: out of memory\n");
        return 1;
    }
    int nts = o->sc.kind == SAMPLER_DDPM ? s->timesteps : o->sc.steps;
    fprintf(stderr, "ddpmd: %d images from %s (step %" PRId64 ", %s weights), %s %d steps\n",
            o->n, cli_shown(o->progress_json, o->ckpt), r->step, o->raw ? "raw" : "EMA",
            sampler_kind_name(o->sc.kind), nts);
    int progress_json = o->progress_json;
    r->t0 = clock_now_s();
    if (generate_run(&r->gen, &r->sch, &o->sc, o->seed, o->n, r->img, sample_progress,
                     progress_json ? &progress_json : NULL)) {
        fprintf(stderr, "ddpmd: sampling failed\n");
        return cli_device_failed(o->device, r->bk, 1);
    }
    testhold_phase(o->out, "sampled");
    return 0;
}

/* the grid PNG at o->out and, with --each, one PNG per image; 0 or 1 */
static int sample_write(const struct sample_opts *o, const struct sample_run *r)
{
    char err[512];
    const struct unet_config *m = &r->spec.model;
    int cols = (int)ceil(sqrt((double)o->n));
    if (image_save_grid_png(o->out, r->img, o->n, m->out_channels, m->image_size, m->image_size,
                            cols, 2, err, sizeof err)) {
        fprintf(stderr, "ddpmd: %s\n", err);
        return 1;
    }
    if (o->each) {
        mkdir(o->each, 0755);
        for (int i = 0; i < o->n; i++) {
            char p[1200];
            snprintf(p, sizeof p, "%s/%04d.png", o->each, i);
            if (image_save_png(p, r->img + (size_t)i * r->per, m->out_channels, m->image_size,
                               m->image_size, err, sizeof err)) {
                fprintf(stderr, "ddpmd: %s\n", err);
                return 1;
            }
        }
    }
    return 0;
}

/* ddpmd sample CHECKPOINT [options]: options, open, plan (and the weights), sample, write */
static int cmd_sample(int argc, char **argv)
{
    struct sample_opts o;
    struct sample_run r;
    memset(&r, 0, sizeof r);
    int rc = sample_options(argc, argv, &o);
    if (rc) return rc;
    if ((rc = sample_open(&o, &r)) || (rc = sample_plan(&o, &r)) ||
        (rc = sample_images(&o, &r)) || (rc = sample_write(&o, &r)))
        goto out;
    fprintf(stderr, "ddpmd: wrote %s%s%s in %.1f s\n", cli_shown(o.progress_json, o.out),
            o.each ? " and " : "", o.each ? cli_shown(o.progress_json, o.each) : "",
            clock_now_s() - r.t0);
    testhold_phase(o.out, "end");
out:
    generate_free(&r.gen);
    ddpm_schedule_free(&r.sch);
    safetensors_free(r.st);
    free(r.img);
    return rc;
}

int cli_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        const char *version, *revision;
        metrics_build(&version, &revision);
        printf("ddpmd %s%s%s%s\n", version, *revision ? " (" : "", revision, *revision ? ")" : "");
        return 0;
    }
    /* `ddpmd COMMAND --help`: the commands' usage (serve has its own) */
    for (int i = 2; i < argc && strcmp(argv[1], "serve") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    if (strcmp(argv[1], "train") == 0) return cmd_train(argc, argv);
    if (strcmp(argv[1], "sample") == 0) return cmd_sample(argc, argv);
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc, argv);
    if (strcmp(argv[1], "plan") == 0) return cmd_plan(argc, argv);
    if (strcmp(argv[1], "demo") == 0) return cmd_demo(argc, argv);
    if (strcmp(argv[1], "serve") == 0) return serve_main(argc, argv);
    static const char *const commands[] = {"train", "sample", "export", "plan", "demo", "serve",
                                           "--help", "--version", NULL};
    cli_option_error(NULL, argv[1], commands);
    return 2;
}
