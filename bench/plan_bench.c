/* plan_bench.c - the planner against measured steps (bench/plan.sh; not a test): for a spec at
 * an effective batch and each device budget, the search's candidates, the auto pick, and real
 * training steps (train_run, the budget enforced) of every candidate that fits some budget in
 * the precision the pick policy chooses from there (fp32 when one fits), measured once each
 * (a short step over more steps, ~2 s); a pick that seems more than 10% slower than the fastest
 * is measured again twice, in turn with the fastest (the machine's load comes in bursts).
 *   plan_bench SPEC.json [--batch B] [--steps N] [--threads T] [--pick-only]
 *              [--force micro=M,offload=0|1,recompute=0..3,precision=0..2,grid=G]
 *              (--budgets 4GiB,1GiB,... | --fractions 1,0.7,...: of the plain plan's bytes)
 * Each step is timed from loading its batch to the end of its optimizer step; the first step
 * of a run is its warm-up and not counted. "cpu" is the least CPU seconds one step took on the
 * thread that runs it (train_stats, under ddpmd's OpenMP wait policy, cpu_omp_wait_policy: a
 * neighbour's time is not counted, but neighbours sharing the caches and the memory bus still
 * stretch it: 10-50% at load 7-9 on the 2-core machine), "wall" the mean wall seconds. --pick-only
 * measures the auto picks alone; --force fixes strategy fields (the others stay auto). Lines
 * (one record each, key=value, for plan.sh):
 *   cand  spec= batch= strategy="..." device= host= pred= cpu= wall= err=
 *   cell  spec= batch= budget= pick="..." device= host= pred= cpu= err= fastest="..."
 *         fastest_cpu= within10=0|1 (- with --pick-only) fitting= remeasured= search_ms=
 * err = (pred - cpu) / cpu.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cpu/cpu.h"
#include "image.h"
#include "philox.h"
#include "planner.h"
#include "spec.h"
#include "train.h"

#define MAX_BUDGETS 16
#define MAX_MEASURED 512

struct measured {
    struct strategy s;
    double cpu, wall; /* seconds per step; < 0: the run failed */
};

static struct measured meas[MAX_MEASURED];
static int n_meas;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* n images of discs in the spec's channels and size */
static int make_folder(const char *dir, const struct train_spec *s, int n)
{
    int c = s->model.in_channels, S = s->model.image_size;
    float *img = malloc((size_t)c * S * S * sizeof *img);
    char path[700], err[256];
    if (!img || mkdir(dir, 0755)) {
        free(img);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        float cx = S * (0.1f + 0.8f * philox_uniform_at(11, 1, 0, (uint32_t)i, 0, 0));
        float cy = S * (0.1f + 0.8f * philox_uniform_at(11, 1, 0, (uint32_t)i, 0, 1));
        for (int k = 0; k < c; k++)
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++)
                    img[((size_t)k * S + y) * S + x] =
                        (x - cx) * (x - cx) + (y - cy) * (y - cy) < S * S / 16.0f
                            ? 0.8f - 0.3f * (float)k
                            : -0.7f;
        snprintf(path, sizeof path, "%s/img%03d.png", dir, i);
        if (image_save_png(path, img, c, S, S, err, sizeof err)) {
            fprintf(stderr, "plan_bench: %s\n", err);
            free(img);
            return -1;
        }
    }
    free(img);
    return 0;
}

static int same_strategy(const struct strategy *a, const struct strategy *b)
{
    return a->precision == b->precision && a->micro_batch == b->micro_batch &&
           a->recompute == b->recompute && a->offload == b->offload &&
           a->sample_batch == b->sample_batch;
}

/* one run of m's strategy under spec: its least CPU seconds per step joins m's */
static void run_once(struct measured *m, const struct train_spec *spec, const char *root,
                     int steps)
{
    char out[700], err[512], cmd[800];
    snprintf(out, sizeof out, "%s/run%d", root, (int)(m - meas));
    struct train_spec t = *spec;
    t.steps = steps;
    t.optim.total_steps = steps;
    struct train_stats st = {0};
    struct train_opts o = {.out_dir = out, .quiet = 1, .stats = &st, .strategy = &m->s};
    int rc = train_run(&t, &o, err, sizeof err);
    if (rc == TRAIN_DONE && st.steps_timed > 0) {
        if (m->cpu < 0 || st.step_cpu_min_s < m->cpu) m->cpu = st.step_cpu_min_s;
        if (m->wall < 0) m->wall = st.step_wall_s / (double)st.steps_timed;
    } else {
        fprintf(stderr, "plan_bench: train_run failed: %s\n", err);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd)) fprintf(stderr, "plan_bench: could not remove %s\n", out);
}

/* the measured seconds of s under spec (a budget it fits), run once: steps, and more for a
 * short step (predicted pred seconds) so that its least time is taken over about 2 s */
/* the searches' cost model: $DDPMD_COST_MODEL's (bench/plan.sh sets it), else the defaults */
static struct cost_model bench_cost;

static struct measured *measure(const struct train_spec *spec, const struct strategy *s,
                                const char *root, int steps, double pred)
{
    for (int i = 0; i < n_meas; i++)
        if (same_strategy(&meas[i].s, s)) return &meas[i];
    if (n_meas == MAX_MEASURED) return NULL;
    struct measured *m = &meas[n_meas++];
    m->s = *s;
    m->cpu = m->wall = -1;
    int more = pred > 0 ? 1 + (int)(2.0 / pred) : steps;
    run_once(m, spec, root, more > steps ? (more < 16 ? more : 16) : steps);
    return m;
}

static int parse_list(const char *v, double *out, int frac)
{
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *tok = strtok(buf, ","); tok && n < MAX_BUDGETS; tok = strtok(NULL, ",")) {
        int64_t b;
        if (frac) out[n++] = atof(tok);
        else if (spec_parse_size(tok, &b) == 0) out[n++] = (double)b;
        else return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *spec_path = NULL, *budgets = NULL, *fractions = NULL;
    int batch = 0, steps = 3, threads = 2, pick_only = 0;
    const char *force = NULL;
    cpu_omp_wait_policy(argv); /* the OpenMP wait policy ddpmd runs with (kernels/cpu/cpu.h) */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--pick-only") == 0) pick_only = 1;
        else if (strcmp(argv[i], "--force") == 0 && i + 1 < argc) force = argv[++i];
        else if (strcmp(argv[i], "--budgets") == 0 && i + 1 < argc) budgets = argv[++i];
        else if (strcmp(argv[i], "--fractions") == 0 && i + 1 < argc) fractions = argv[++i];
        else if (argv[i][0] != '-' && !spec_path) spec_path = argv[i];
        else spec_path = NULL, i = argc;
    }
    if (!spec_path || (!budgets == !fractions) || steps < 2) {
        fprintf(stderr, "usage: plan_bench SPEC.json [--batch B] [--steps N>=2] [--threads T] "
                        "[--pick-only] [--force FIELD=V,...] (--budgets 4GiB,... | --fractions 1,0.5,...)\n");
        return 2;
    }
    struct train_spec spec;
    struct spec_errors E;
    char why[512];
    if (spec_load_file(spec_path, &spec, &E)) {
        spec_errors_print(&E, spec_path);
        return 1;
    }
    if (train_cost_model(&bench_cost, getenv("DDPMD_COST_MODEL"), why, sizeof why)) {
        fprintf(stderr, "plan_bench: %s\n", why);
        return 1;
    }
    if (batch > 0) spec.batch = batch;
    spec.threads = threads;
    spec.validation = 0;
    spec.checkpoint_every = 0;
    spec.sample_every = 0;
    spec.log_every = 1;
    /* the run's last step samples its grid: 2 denoising steps keep that short (the schedule's
     * length changes no plan and no step's time) */
    spec.timesteps = 2;
    spec.strategy = strategy_auto();
    /* forced fields: "micro=4,offload=1,recompute=2,precision=0,grid=8" */
    for (const char *f = force; f && *f;) {
        char key[16];
        int v, used = 0;
        if (sscanf(f, "%15[a-z]=%d%n", key, &v, &used) != 2) {
            fprintf(stderr, "plan_bench: --force: bad field at '%s'\n", f);
            return 2;
        }
        if (!strcmp(key, "micro")) spec.strategy.micro_batch = v;
        else if (!strcmp(key, "offload")) spec.strategy.offload = v;
        else if (!strcmp(key, "recompute")) spec.strategy.recompute = v;
        else if (!strcmp(key, "precision")) spec.strategy.precision = v;
        else if (!strcmp(key, "grid")) spec.strategy.sample_batch = v;
        else {
            fprintf(stderr, "plan_bench: --force: unknown field %s\n", key);
            return 2;
        }
        f += used;
        if (*f == ',') f++;
    }
    char root[] = "/tmp/ddpmd-plan-bench-XXXXXX", data[600], err[512];
    if (!mkdtemp(root)) return 1;
    snprintf(data, sizeof data, "%s/images", root);
    if (make_folder(data, &spec, spec.batch > 16 ? 2 * spec.batch : 32)) return 1;
    snprintf(spec.dataset, sizeof spec.dataset, "%s", data);
    const char *name = strrchr(spec_path, '/') ? strrchr(spec_path, '/') + 1 : spec_path;

    double list[MAX_BUDGETS];
    int nb = parse_list(budgets ? budgets : fractions, list, fractions != NULL);
    if (nb < 1) {
        fprintf(stderr, "plan_bench: bad budget list\n");
        return 2;
    }
    if (fractions) { /* of the plain plan's device bytes */
        struct train_spec s = spec;
        struct planner_result r;
        s.strategy = strategy_plain(s.batch);
        s.vram_budget = 0;
        if (train_search(&s, &bench_cost, 0, &r, err, sizeof err)) {
            fprintf(stderr, "plan_bench: the plain plan: %s\n", err);
            return 1;
        }
        double plain = (double)r.cand[r.chosen].device_bytes;
        planner_result_free(&r);
        for (int k = 0; k < nb; k++) list[k] = floor(list[k] * plain);
    }
    for (int k = 0; k < nb; k++) {
        struct train_spec s = spec;
        s.vram_budget = (int64_t)list[k];
        struct planner_result r;
        double t0 = now_ms();
        int rc = train_search(&s, &bench_cost, 0, &r, err, sizeof err);
        double search_ms = now_ms() - t0;
        planner_result_free(&r);
        if (rc) {
            printf("cell spec=%s batch=%d budget=%.0f pick=none why=\"%s\" search_ms=%.1f\n", name,
                   s.batch, list[k], err, search_ms);
            fflush(stdout);
            continue;
        }
        if (train_search(&s, &bench_cost, 1, &r, err, sizeof err)) continue;
        const struct planner_candidate *pick = &r.cand[r.chosen];
        int half = pick->strategy.precision != STRATEGY_PRECISION_F32, fitting = 0;
        const struct planner_candidate *fast = NULL;
        struct measured *fast_m = NULL, *pick_m = NULL;
        char what[200];
        for (int i = 0; i < r.n_cand; i++) {
            const struct planner_candidate *c = &r.cand[i];
            if (!c->planned || !c->fits ||
                (c->strategy.precision != STRATEGY_PRECISION_F32) != half ||
                (pick_only && c != pick))
                continue;
            fitting++;
            struct measured *m = measure(&s, &c->strategy, root, steps, c->predicted_s);
            if (!m || m->cpu < 0) continue;
            if (m->wall >= 0 && c == pick) pick_m = m;
            if (!fast_m || m->cpu < fast_m->cpu) {
                fast_m = m;
                fast = c;
            }
            if (m == &meas[n_meas - 1] && m->cpu == m->cpu) { /* first measured here */
                planner_strategy_text(&c->strategy, s.batch, what, sizeof what);
                printf("cand spec=%s batch=%d strategy=\"%s\" device=%zu host=%zu pred=%.4f "
                       "cpu=%.4f wall=%.4f err=%+.3f\n",
                       name, s.batch, what, c->device_bytes, c->host_bytes, c->predicted_s,
                       m->cpu, m->wall, (c->predicted_s - m->cpu) / m->cpu);
                fflush(stdout);
            }
        }
        /* a pick seemingly more than 10% slower than the fastest: the two measured again, in
         * turn, so that a burst of load on one run (or a lucky one) does not decide it */
        int again = 0;
        for (; pick_m && fast_m && pick_m != fast_m && pick_m->cpu > 1.10 * fast_m->cpu &&
               again < 2;
             again++) {
            run_once(pick_m, &s, root, steps);
            run_once(fast_m, &s, root, steps);
        }
        if (pick_m && fast_m && pick_m->cpu <= fast_m->cpu) {
            fast_m = pick_m;
            fast = pick;
        }
        planner_strategy_text(&pick->strategy, s.batch, what, sizeof what);
        char fw[200] = "none";
        if (fast) planner_strategy_text(&fast->strategy, s.batch, fw, sizeof fw);
        if (pick_m && fast_m)
            printf("cell spec=%s batch=%d budget=%.0f pick=\"%s\" device=%zu host=%zu pred=%.4f "
                   "cpu=%.4f err=%+.3f fastest=\"%s\" fastest_cpu=%.4f within10=%s fitting=%d "
                   "remeasured=%d search_ms=%.1f\n",
                   name, s.batch, list[k], what, pick->device_bytes, pick->host_bytes,
                   pick->predicted_s, pick_m->cpu, (pick->predicted_s - pick_m->cpu) / pick_m->cpu,
                   fw, fast_m->cpu, pick_only ? "-" : pick_m->cpu <= 1.10 * fast_m->cpu ? "1" : "0",
                   fitting, again, search_ms);
        else
            printf("cell spec=%s batch=%d budget=%.0f pick=\"%s\" measured=failed\n", name,
                   s.batch, list[k], what);
        fflush(stdout);
        planner_result_free(&r);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "plan_bench: could not remove %s\n", root);
    return 0;
}
