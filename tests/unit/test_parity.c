/* test_parity.c - the whole model against PyTorch (llm.c's test_gpt2 manner): both presets
 * built from the committed fixtures' configs, weights loaded, one step's output and every
 * gradient compared, then 10 AdamW steps (warmup, cosine, clipping, EMA) loss by loss. Every
 * field the comparison needs must be in the fixture (a missing one fails, checked below on
 * copies of a fixture each lacking one), and the achieved errors are printed next to the
 * tolerances, which sit a few times above what is achieved.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddpm.h"
#include "exec.h"
#include "memplan.h"
#include "safetensors.h"
#include "test_util.h"
#include "unet.h"

/* tolerances: relative errors (norm-wise unless said); achieved on x86-64 CPUs, 2 threads, in
 * the comments (the printed lines give this run's) */
#define TOL_XT 1e-7      /* x_t of step 0: ~6e-8 (float32 rounding of the same formula) */
#define TOL_FORWARD 5e-6 /* step-0 output, norm-wise and max|d|/max|ref|: ~8.5e-7 */
#define TOL_LOSS 5e-6    /* each step's loss: ~9e-7 */
#define TOL_GRAD 3e-5    /* each step-0 parameter gradient: ~5e-6 */
#define TOL_NORM 3e-5    /* each step's gradient norm: ~7e-6 (the trajectories part by then) */
#define TOL_LR 2.5e-7    /* each step's learning rate, float32 of a float64 formula: 2 ulp */
#define TOL_FINAL 1e-4   /* weights and EMA after 10 AdamW steps: ~6e-5 (AdamW's m / sqrt(v)
                          * turns rounding noise in small gradients into whole steps) */

static int missing_keys; /* fixture metadata keys absent or of the wrong type */

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) {
        fprintf(stderr, "fixture metadata lacks the number %s\n", k);
        missing_keys++;
        return 0.0;
    }
    return v->valuedouble;
}

static int jints(const cJSON *o, const char *k, int *dst, int max)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, k), *v;
    int n = 0;
    cJSON_ArrayForEach(v, a) if (n < max) dst[n++] = v->valueint;
    return n;
}

static int load_config(const struct safetensors *st, struct unet_config *c,
                       struct optim_config *oc, int *batch, int *steps, int *T)
{
    const char *mj = safetensors_meta(st, "config"), *tj = safetensors_meta(st, "train");
    cJSON *m = mj ? cJSON_Parse(mj) : NULL, *tr = tj ? cJSON_Parse(tj) : NULL;
    const cJSON *preset = m ? cJSON_GetObjectItemCaseSensitive(m, "preset") : NULL;
    if (!m || !tr || !cJSON_IsString(preset)) {
        cJSON_Delete(m);
        cJSON_Delete(tr);
        return -1;
    }
    missing_keys = 0;
    unet_config_default(c, strcmp(preset->valuestring, "seed") == 0 ? UNET_SEED : UNET_DDPM);
    c->in_channels = (int)jnum(m, "in_channels");
    c->out_channels = (int)jnum(m, "out_channels");
    c->image_size = (int)jnum(m, "image_size");
    if (c->preset == UNET_DDPM) {
        c->n_levels = jints(m, "block_out_channels", c->channels, UNET_MAX_LEVELS);
        c->layers_per_block = (int)jnum(m, "layers_per_block");
        c->n_attn = jints(m, "attention_resolutions", c->attn_res, UNET_MAX_LEVELS);
        c->groups = (int)jnum(m, "norm_num_groups");
        c->norm_eps = (float)jnum(m, "norm_eps");
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(m, "attention_head_dim");
        c->attn_head_dim = cJSON_IsNull(hd) ? 0 : (int)jnum(m, "attention_head_dim");
        c->dropout = (float)jnum(m, "dropout");
        c->flip_sin_to_cos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "flip_sin_to_cos"));
        c->freq_shift = (float)jnum(m, "freq_shift");
    } else {
        c->base = (int)jnum(m, "base");
        c->time_dim = (int)jnum(m, "time_dim");
        c->heads = (int)jnum(m, "heads");
    }
    memset(oc, 0, sizeof *oc);
    oc->lr = (float)jnum(tr, "lr");
    oc->beta1 = (float)jnum(tr, "beta1");
    oc->beta2 = (float)jnum(tr, "beta2");
    oc->eps = (float)jnum(tr, "eps");
    oc->weight_decay = (float)jnum(tr, "weight_decay");
    oc->clip = (float)jnum(tr, "clip");
    oc->ema_decay = (float)jnum(tr, "ema_decay");
    oc->warmup = (int)jnum(tr, "warmup");
    *steps = (int)jnum(tr, "steps");
    oc->total_steps = *steps;
    oc->cosine = 1;
    *batch = (int)jnum(tr, "batch");
    *T = (int)jnum(tr, "T");
    cJSON_Delete(m);
    cJSON_Delete(tr);
    return missing_keys || *batch < 1 || *steps < 1 || *T < 2 ? -1 : 0;
}

/* a fixture tensor the comparison needs: absent or misshapen is a failure */
static const float *tensor(const struct safetensors *st, const char *name, size_t numel)
{
    const struct st_tensor *t;
    if (safetensors_find(st, name, &t) || t->dtype != ST_F32 || (size_t)t->numel != numel) {
        CHECK(0, "fixture tensor %s missing or of the wrong size", name);
        return NULL;
    }
    return t->data;
}

/* norm-wise relative error, and max|d| / max|ref| */
static void errs(const float *a, const float *ref, size_t n, double *rel, double *maxrel)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d > md) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    *rel = tu_rel_err_f(a, ref, n);
    *maxrel = md / (mr > 0 ? mr : 1);
}

/* Key biases have an identically zero gradient (adding q.b_k to every score of a row does not
 * change its softmax), so both frameworks produce rounding noise there, and AdamW turns noise
 * into +-lr steps. Those elements are compared only for being ~0 at step 0, and left out of
 * the relative comparisons. Returns the [lo, hi) element range of such a slice, or 0. */
static int key_bias_slice(const char *name, size_t n, size_t *lo, size_t *hi)
{
    size_t len = strlen(name);
    if (len >= 9 && strcmp(name + len - 9, "to_k.bias") == 0) {
        *lo = 0;
        *hi = n;
        return 1;
    }
    if (len >= 16 && strcmp(name + len - 16, "mha.in_proj_bias") == 0) {
        *lo = n / 3;
        *hi = 2 * n / 3;
        return 1;
    }
    return 0;
}

/* errs over the elements outside the key-bias slice of parameter `pname` (zeroed in both) */
static void errs_param(const char *pname, float *a, float *ref_copy, const float *ref, size_t n,
                       double *rel, double *maxrel)
{
    size_t lo, hi;
    memcpy(ref_copy, ref, n * sizeof *ref);
    if (key_bias_slice(pname, n, &lo, &hi))
        for (size_t i = lo; i < hi; i++) a[i] = ref_copy[i] = 0.0f;
    errs(a, ref_copy, n, rel, maxrel);
}

static void run_fixture(const char *path, int tiled)
{
    char err[256];
    struct safetensors *st = NULL;
    if (safetensors_open(&st, path, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        return;
    }
    struct unet_config cfg;
    struct optim_config oc;
    int batch = 0, steps = 0, T = 0;
    if (load_config(st, &cfg, &oc, &batch, &steps, &T)) {
        CHECK(0, "%s: the config or train metadata is missing or incomplete", path);
        safetensors_free(st);
        return;
    }
    cfg.attn_tiled = tiled;

    struct graph g;
    struct unet_io io;
    graph_init(&g);
    int target = -1;
    unet_build_training(&g, &cfg, batch, &io, &target, NULL);
    CHECK(g.status == 0, "graph: %s", g.err);
    if (g.status) goto out_graph;

    /* the parameter lists agree, name by name and size by size */
    int n_file_params = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        if (strncmp(t->name, "param.", 6) == 0) {
            n_file_params++;
            int id = graph_find_param(&g, t->name + 6);
            CHECK(id >= 0 && g.tensors[id]->numel == (size_t)t->numel, "param %s: %s", t->name,
                  id < 0 ? "not in the graph" : "size differs");
        }
    }
    CHECK(n_file_params == g.n_params, "%d params in file, %d in graph", n_file_params,
          g.n_params);

    /* everything compared below is in the file, before anything runs */
    size_t img = g.tensors[io.x]->numel, per = img / (size_t)batch;
    const float *x0s = tensor(st, "x0", (size_t)steps * img);
    const float *noises = tensor(st, "noise", (size_t)steps * img);
    const float *ts = tensor(st, "t", (size_t)steps * batch);
    const float *ref_loss = tensor(st, "loss", (size_t)steps);
    const float *ref_norm = tensor(st, "grad_norm", (size_t)steps);
    const float *ref_lr = tensor(st, "lr", (size_t)steps);
    const float *ref_xt0 = tensor(st, "xt0", img), *ref_out0 = tensor(st, "out0", img);
    int complete = x0s && noises && ts && ref_loss && ref_norm && ref_lr && ref_xt0 && ref_out0;
    char name[300];
    static const char *per_param[] = {"param.", "grad.", "final.", "ema."};
    for (int i = 0; i < g.n_tensors; i++)
        for (int k = 0; k < 4 && g.tensors[i]->kind == TENSOR_PARAM; k++) {
            snprintf(name, sizeof name, "%s%s", per_param[k], g.tensors[i]->name);
            complete &= tensor(st, name, g.tensors[i]->numel) != NULL;
        }
    if (!complete) {
        CHECK(0, "%s: the fixture lacks tensors the comparison needs", path);
        goto out_graph;
    }

    struct plan p;
    CHECK(plan_make(&p, &g, backend_cpu(), NULL) == 0, "plan");
    struct exec *e = NULL;
    struct exec_opts eo = {.threads = 2};
    CHECK(exec_init(&e, &g, &p, backend_cpu(), &eo) == 0, "exec_init");
    if (!e) goto out_plan;
    for (int i = 0; i < g.n_tensors; i++)
        if (g.tensors[i]->kind == TENSOR_PARAM) {
            snprintf(name, sizeof name, "param.%s", g.tensors[i]->name);
            exec_upload(e, i, tensor(st, name, g.tensors[i]->numel));
        }
    exec_reset_state(e);

    struct ddpm_schedule sch;
    ddpm_schedule_init(&sch, T, DDPM_BETA_LINEAR, 1e-4, 0.02);
    float *xt = malloc(img * sizeof *xt), *out = malloc(img * sizeof *out);
    float *tf = malloc((size_t)batch * sizeof *tf);
    int *ti = malloc((size_t)batch * sizeof *ti);
    float *host = malloc(g.param_numel * sizeof *host > img * sizeof *host
                             ? g.param_numel * sizeof *host : img * sizeof *host);
    float *refc = malloc(g.param_numel * sizeof *refc);

    double worst_loss = 0, worst_grad = 0, worst_norm = 0, worst_lr = 0, xt_rel = 0;
    double fwd_rel = 0, fwd_max = 0;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < batch; i++) {
            ti[i] = (int)ts[(size_t)s * batch + i];
            tf[i] = (float)ti[i];
        }
        const float *x0 = x0s + (size_t)s * img, *eps = noises + (size_t)s * img;
        ddpm_q_sample(xt, x0, eps, ti, batch, per, &sch);
        exec_upload(e, io.x, xt);
        exec_upload(e, io.t, tf);
        exec_upload(e, target, eps);
        if (s == 0) {
            double mx;
            errs(xt, ref_xt0, img, &xt_rel, &mx);
            CHECK(xt_rel <= TOL_XT, "%s x_t differs: %.3g", path, xt_rel);
            CHECK(exec_forward(e, NULL) == 0, "forward");
            exec_download(e, io.out, out);
            errs(out, ref_out0, img, &fwd_rel, &fwd_max);
            CHECK(fwd_rel <= TOL_FORWARD && fwd_max <= TOL_FORWARD,
                  "%s forward: rel %.3g max %.3g", path, fwd_rel, fwd_max);
        }
        float loss = 0, norm = 0;
        CHECK(exec_forward_backward(e, 1, 1.0f, 0, (uint64_t)s, 0, &loss) == 0, "step");
        double lrel = fabs((double)loss - ref_loss[s]) / fabs((double)ref_loss[s]);
        if (lrel > worst_loss) worst_loss = lrel;
        CHECK(lrel <= TOL_LOSS, "%s step %d loss %.8g vs %.8g (rel %.3g)", path, s, loss,
              ref_loss[s], lrel);
        if (s == 0) {
            for (int i = 0; i < g.n_tensors; i++) {
                if (g.tensors[i]->kind != TENSOR_PARAM) continue;
                snprintf(name, sizeof name, "grad.%s", g.tensors[i]->name);
                size_t n = g.tensors[i]->numel;
                exec_download(e, g.tensors[i]->grad, host);
                const float *ref = tensor(st, name, n);
                size_t lo, hi;
                if (key_bias_slice(name, n, &lo, &hi)) {
                    double a = 0, b = 0;
                    for (size_t j = lo; j < hi; j++) {
                        a += (double)host[j] * host[j];
                        b += (double)ref[j] * ref[j];
                    }
                    CHECK(sqrt(a) <= 1e-5 * ref_norm[0] && sqrt(b) <= 1e-5 * ref_norm[0],
                          "%s %s: key-bias gradient %.3g (torch %.3g) is not ~0", path, name,
                          sqrt(a), sqrt(b));
                }
                double rel, mx;
                errs_param(name, host, refc, ref, n, &rel, &mx);
                if (rel > worst_grad) worst_grad = rel;
                CHECK(rel <= TOL_GRAD, "%s %s: rel %.3g", path, name, rel);
            }
        }
        float lr = optim_lr(&oc, s);
        double lr_rel = fabs((double)lr - ref_lr[s]) / ref_lr[s];
        if (lr_rel > worst_lr) worst_lr = lr_rel;
        CHECK(lr_rel <= TOL_LR, "lr %g vs %g", lr, ref_lr[s]);
        CHECK(exec_optimizer_step(e, &oc, s + 1, lr, &norm) == 0, "optimizer");
        double nrel = fabs((double)norm - ref_norm[s]) / ref_norm[s];
        if (nrel > worst_norm) worst_norm = nrel;
        CHECK(nrel <= TOL_NORM, "%s step %d grad norm %g vs %g (rel %.3g)", path, s, norm,
              ref_norm[s], nrel);
    }
    /* the run is a real optimisation, not a numerically idle one */
    CHECK(fabs(ref_loss[steps - 1] - ref_loss[0]) >= 0.05 * ref_loss[0],
          "%s: the fixture's loss moves by less than 5%%", path);
    printf("%s (%s attention): x_t rel %.3g (tol %.0e); forward rel %.3g, max|d|/max|ref| %.3g "
           "(tol %.0e); worst loss rel %.3g (tol %.0e), step-0 gradient rel %.3g (tol %.0e), "
           "grad norm rel %.3g (tol %.0e), lr rel %.3g (tol %.0e)\n",
           path, tiled ? "tiled" : "plain", xt_rel, TOL_XT, fwd_rel, fwd_max, TOL_FORWARD,
           worst_loss, TOL_LOSS, worst_grad, TOL_GRAD, worst_norm, TOL_NORM, worst_lr, TOL_LR);

    double worst_final = 0, worst_ema = 0;
    for (int i = 0; i < g.n_tensors; i++) {
        if (g.tensors[i]->kind != TENSOR_PARAM) continue;
        size_t n = g.tensors[i]->numel;
        double rel, mx;
        snprintf(name, sizeof name, "final.%s", g.tensors[i]->name);
        exec_download(e, i, host);
        errs_param(name, host, refc, tensor(st, name, n), n, &rel, &mx);
        if (rel > worst_final) worst_final = rel;
        CHECK(rel <= TOL_FINAL, "%s %s: rel %.3g", path, name, rel);
        snprintf(name, sizeof name, "ema.%s", g.tensors[i]->name);
        exec_download_ema(e, i, host);
        errs_param(name, host, refc, tensor(st, name, n), n, &rel, &mx);
        if (rel > worst_ema) worst_ema = rel;
        CHECK(rel <= TOL_FINAL, "%s %s: rel %.3g", path, name, rel);
    }
    printf("%s (%s attention): after %d steps worst weight rel %.3g, worst EMA rel %.3g "
           "(tol %.0e)\n", path, tiled ? "tiled" : "plain", steps, worst_final, worst_ema,
           TOL_FINAL);

    free(xt);
    free(out);
    free(tf);
    free(ti);
    free(host);
    free(refc);
    ddpm_schedule_free(&sch);
    exec_free(e);
out_plan:
    plan_free(&p);
out_graph:
    graph_free(&g);
    safetensors_free(st);
}

/* a copy of fixture src at dst without tensor drop (or without key drop_train of its train
 * metadata); 0 on success */
static int fixture_without(const char *src, const char *drop, const char *drop_train,
                           const char *dst)
{
    char err[256];
    struct safetensors *st = NULL;
    struct safetensors_writer *w = NULL;
    cJSON *tr = NULL;
    char *trs = NULL;
    int rc = -1;
    if (safetensors_open(&st, src, err, sizeof err) || safetensors_writer_init(&w)) goto out;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct st_tensor *t;
        safetensors_get(st, i, &t);
        if (drop && strcmp(t->name, drop) == 0) continue;
        if (safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data)) goto out;
    }
    const char *train = safetensors_meta(st, "train");
    tr = train ? cJSON_Parse(train) : NULL;
    if (!tr) goto out;
    if (drop_train) cJSON_DeleteItemFromObjectCaseSensitive(tr, drop_train);
    trs = cJSON_PrintUnformatted(tr);
    if (!trs || safetensors_writer_meta(w, "train", trs) ||
        safetensors_writer_meta(w, "config", safetensors_meta(st, "config")) ||
        safetensors_writer_save(w, dst, err, sizeof err))
        goto out;
    rc = 0;
out:
    if (rc) fprintf(stderr, "cannot write %s: %s\n", dst, err);
    free(trs);
    cJSON_Delete(tr);
    safetensors_writer_free(w);
    safetensors_free(st);
    return rc;
}

/* the comparison fails, instead of passing unchecked, on a fixture lacking any field it reads */
static void missing_fields_fail(void)
{
    static const struct { const char *tensor, *train_key; } cases[] = {
        {"x0", NULL}, {"noise", NULL}, {"t", NULL}, {"loss", NULL}, {"grad_norm", NULL},
        {"lr", NULL}, {"xt0", NULL}, {"out0", NULL}, {"grad.conv_in.weight", NULL},
        {"final.conv_out.bias", NULL}, {"ema.mid_block.attentions.0.to_q.weight", NULL},
        {NULL, "steps"}, {NULL, "batch"}, {NULL, "lr"},
    };
    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/test_parity.%ld.safetensors", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *what = cases[i].tensor ? cases[i].tensor : cases[i].train_key;
        if (fixture_without("tests/parity/fixtures/ddpm.safetensors", cases[i].tensor,
                            cases[i].train_key, path)) {
            CHECK(0, "cannot make a fixture without %s", what);
            continue;
        }
        /* run it with its failures counted apart (and their messages out of the log) */
        int passed = tu_passed, failed = tu_failed;
        fflush(stderr);
        int saved = dup(2);
        FILE *nul = fopen("/dev/null", "w");
        if (nul && saved >= 0) dup2(fileno(nul), 2);
        run_fixture(path, 1);
        fflush(stderr);
        if (nul && saved >= 0) dup2(saved, 2);
        if (saved >= 0) close(saved);
        if (nul) fclose(nul);
        int caught = tu_failed - failed;
        tu_passed = passed;
        tu_failed = failed;
        CHECK(caught > 0, "a fixture without %s passes the comparison", what);
    }
    unlink(path);
}

int main(void)
{
    missing_fields_fail();
    run_fixture("tests/parity/fixtures/ddpm.safetensors", 1);
    run_fixture("tests/parity/fixtures/seed.safetensors", 1);
    run_fixture("tests/parity/fixtures/ddpm.safetensors", 0);
    run_fixture("tests/parity/fixtures/seed.safetensors", 0);
    return tu_finish("test_parity");
}
