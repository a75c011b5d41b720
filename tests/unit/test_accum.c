/* test_accum.c - micro-batches with gradient accumulation: the parameter gradients (and the mean
 * loss) after one effective batch run as micro-batches of 1 and as an uneven split (micro-batches
 * of 3 and a last one of 1 or 2, a second graph sharing the first's persistent part,
 * plan_make_shared) equal the plain full-batch step's within 1e-5 relative, on the fmnist-tiny
 * model (dropout on: masks drawn by the sample's index in the effective batch) and on the seed
 * preset at 16x16; in f16 (loss scaling on) the same splits against the f16 full batch within
 * F16_TOL. The last micro-batch's plan lies inside the first's reservation and shares
 * its parameters, gradients, moments and EMA byte for byte.
 */
#include "test_accum.h"

/* f16's relative gradient difference between a split and the full batch: 4x the largest seen
 * (2.5e-3, fmnist-tiny's down_blocks.1.resnets.0.norm1.bias; seed-16's 4e-7) */
#define F16_TOL 1e-2

/* batch in micro-batches of micro against the full batch, both in precision (f32 or f16),
 * within tol relative */
static void equivalence(enum unet_preset preset, int batch, int micro, int precision, double tol)
{
    const char *name = preset == UNET_DDPM ? (precision ? "fmnist-tiny f16" : "fmnist-tiny")
                                           : (precision ? "seed-16 f16" : "seed-16");
    struct unet_config c;
    accum_config(&c, preset);
    struct accum ref, a;
    struct plan_opts po = accum_half_opts(precision);
    int ok = accum_init(&ref, &c, batch, batch, &po, NULL) == 0;
    ok = ok && accum_init(&a, &c, batch, micro, &po, NULL) == 0;
    CHECK(ok, "%s: building batch %d / micro-batch %d", name, batch, micro);
    if (!ok) return;
    float lref = 0, la = 0;
    CHECK(accum_step(&ref, &lref) == 0 && accum_step(&a, &la) == 0, "%s: the steps ran", name);
    size_t nr, na;
    float *gr = accum_grads(&ref, &nr), *ga = accum_grads(&a, &na);
    CHECK(nr == na && nr == ref.g.param_numel, "%s: %zu and %zu gradient elements", name, nr, na);
    const char *worst;
    double rel = accum_compare(&a, ga, &ref, gr, &worst);
    printf("%s batch %d in micro-batches of %d (last %d): loss %.7f vs %.7f, worst gradient "
           "%.3g relative (%s)\n",
           name, batch, micro, a.rest ? a.rest : micro, la, lref, rel, worst);
    CHECK(rel <= tol, "%s micro-batch %d: gradient of %s differs by %.3g relative", name, micro,
          worst, rel);
    CHECK(fabsf(la - lref) <= tol * fabsf(lref), "%s micro-batch %d: loss %.9g vs %.9g", name,
          micro, la, lref);
    if (a.rest) {
        /* the last micro-batch: inside the reservation, on the host's persistent part, its own
         * bytes (a 16-bit working copy, then its inputs) after the host's inputs */
        CHECK(a.rp.nested && !a.rp.inference && a.rp.total_bytes <= a.p.total_bytes &&
                  a.rp.grads_off == a.p.grads_off && a.rp.adam_m_off == a.p.adam_m_off &&
                  a.rp.ema_off == a.p.ema_off && a.rp.work_off == a.p.inputs_off &&
                  a.rp.inputs_off == a.rp.work_off + a.rp.work_bytes,
              "%s: the last micro-batch's plan is not on the host's persistent part", name);
        int same = 1;
        for (int i = 0; i < a.rg.n_tensors; i++) {
            const struct tensor *t = a.rg.tensors[i];
            if (t->kind != TENSOR_PARAM) continue;
            int h = graph_find_param(&a.g, t->name);
            same &= h >= 0 && a.rp.offset[i] == a.p.offset[h] &&
                    a.rp.offset[t->grad] == a.p.offset[a.g.tensors[h]->grad];
        }
        CHECK(same, "%s: the last micro-batch's parameters or gradients are not the host's",
              name);
    }
    free(gr);
    free(ga);
    accum_free(&a);
    accum_free(&ref);
}

/* plan_make_shared refuses what it cannot share */
static void shared_refusals(void)
{
    struct unet_config c;
    accum_config(&c, UNET_SEED);
    struct graph g, fg, other;
    struct unet_io io;
    struct plan p, ip, sub;
    int target;
    graph_init(&g);
    graph_init(&fg);
    graph_init(&other);
    unet_build_training(&g, &c, 2, &io, &target, NULL);
    unet_build(&fg, &c, 1, &io);
    struct unet_config c2 = c;
    c2.base = 16; /* the same names, other shapes */
    unet_build_training(&other, &c2, 1, &io, &target, NULL);
    CHECK(plan_make(&p, &g, backend_cpu(), NULL) == PLAN_OK, "plan");
    struct plan_opts inf = {.mode = PLAN_MODE_INFER};
    CHECK(plan_make(&ip, &g, backend_cpu(), &inf) == PLAN_OK, "inference plan");
    CHECK(plan_make_shared(&sub, &g, backend_cpu(), NULL, &ip, &g) == PLAN_ERR_ARG,
          "a shared training plan over an inference plan");
    CHECK(plan_make_shared(&sub, &other, backend_cpu(), NULL, &p, &g) == PLAN_ERR_GRAPH,
          "a shared plan of other shapes");
    plan_free(&sub);
    plan_free(&ip);
    plan_free(&p);
    graph_free(&other);
    graph_free(&fg);
    graph_free(&g);
}

int main(void)
{
    equivalence(UNET_DDPM, 4, 1, STRATEGY_PRECISION_F32, 1e-5);
    equivalence(UNET_DDPM, 4, 3, STRATEGY_PRECISION_F32, 1e-5);
    equivalence(UNET_SEED, 5, 1, STRATEGY_PRECISION_F32, 1e-5);
    equivalence(UNET_SEED, 5, 3, STRATEGY_PRECISION_F32, 1e-5);
    /* f16: activations and their gradients are rounded to 16 bits, the loss gradient scaled by
     * the micro-batch's share (and the loss scale) before they are, so a split rounds
     * differently from the full batch: within F16_TOL, not 1e-5 */
    equivalence(UNET_DDPM, 4, 1, STRATEGY_PRECISION_F16, F16_TOL);
    equivalence(UNET_DDPM, 4, 3, STRATEGY_PRECISION_F16, F16_TOL);
    equivalence(UNET_SEED, 5, 3, STRATEGY_PRECISION_F16, F16_TOL);
    shared_refusals();
    return tu_finish("test_accum");
}
