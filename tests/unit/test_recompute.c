/* test_recompute.c - activation recomputation: at each granularity (attention blocks, res blocks
 * and attention blocks, whole resolution levels) the parameter gradients and the loss after one
 * batch are bit-identical to the plain step's, on the fmnist-tiny model (dropout on: a re-run
 * dropout draws its original mask) and on the seed preset at 16x16, with every dead storage
 * poisoned with NaN and canaries checked after every op (a recomputed tensor planned too short,
 * or an original that dies before its last reader, shows up); also with micro-batches of 3 and
 * an uneven last one, bit-identical to the same split without recomputation, in fp32 and in f16.
 * The plans re-run ops and their arenas are smaller than the plain plan's.
 */
#include "test_accum.h"

static const char *gran_name[] = {"none", "attention", "resblock", "level"};

static void equivalence(enum unet_preset preset, int batch, int micro, int precision)
{
    const char *name = preset == UNET_DDPM ? (precision ? "fmnist-tiny f16" : "fmnist-tiny")
                                           : "seed-16";
    struct unet_config c;
    accum_config(&c, preset);
    struct accum ref;
    float lref = 0;
    struct plan_opts plain = accum_half_opts(precision);
    plain.guard_bytes = 64;
    CHECK(accum_init(&ref, &c, batch, micro, &plain, NULL) == 0 && accum_step(&ref, &lref) == 0,
          "%s: the plain step", name);
    size_t nr;
    float *gr = accum_grads(&ref, &nr);
    for (int r = STRATEGY_RECOMPUTE_ATTENTION; r <= STRATEGY_RECOMPUTE_LEVEL; r++) {
        struct plan_opts po = plain;
        po.strategy.recompute = r;
        struct exec_opts eo = {.threads = 2, .poison = 1, .check_guards = 1};
        struct accum a;
        float la = 0;
        int ok = accum_init(&a, &c, batch, micro, &po, &eo) == 0 && accum_step(&a, &la) == 0;
        CHECK(ok, "%s recompute %s: the step ran", name, gran_name[r]);
        if (!ok) {
            accum_free(&a);
            continue;
        }
        size_t na;
        float *ga = accum_grads(&a, &na);
        int same = na == nr && memcmp(ga, gr, nr * sizeof *gr) == 0;
        size_t diff = 0;
        for (size_t k = 0; k < nr && k < na; k++) diff += memcmp(&ga[k], &gr[k], sizeof *ga) != 0;
        printf("%s batch %d micro %d recompute %-9s: %4d ops re-run, arena %9zu bytes (plain "
               "%9zu), %zu of %zu gradient elements differ, loss %.9g vs %.9g\n",
               name, batch, micro, gran_name[r], a.p.n_recomputed, a.p.arena_bytes,
               ref.p.arena_bytes, diff, nr, la, lref);
        CHECK(same, "%s recompute %s: %zu gradient elements differ from the plain step's", name,
              gran_name[r], diff);
        CHECK(memcmp(&la, &lref, sizeof la) == 0, "%s recompute %s: loss %.9g vs %.9g", name,
              gran_name[r], la, lref);
        CHECK(a.p.n_recomputed > 0 && a.p.n_run_ops == a.g.n_ops + a.p.n_recomputed,
              "%s recompute %s: %d ops re-run", name, gran_name[r], a.p.n_recomputed);
        CHECK(a.p.arena_bytes < ref.p.arena_bytes, "%s recompute %s: arena %zu not below %zu",
              name, gran_name[r], a.p.arena_bytes, ref.p.arena_bytes);
        free(ga);
        accum_free(&a);
    }
    free(gr);
    accum_free(&ref);
}

/* the run order: forward ops first and unchanged; each copy repeats a forward op of a segment
 * and runs after the forward; nothing the backward reads of a chosen segment is an original */
static void schedule_shape(void)
{
    struct unet_config c;
    accum_config(&c, UNET_DDPM);
    struct graph g;
    struct unet_io io;
    int target;
    graph_init(&g);
    CHECK(unet_build_training(&g, &c, 2, &io, &target, NULL) == 0, "build");
    int kinds[4] = {0};
    for (int s = 0; s < g.n_segs; s++) kinds[g.segs[s].kind]++;
    /* fmnist-tiny: 3 levels of one res block (attention at 8x8), the middle, 3 up levels of
     * two res blocks */
    CHECK(kinds[GRAPH_SEG_RESBLOCK] == 3 + 2 + 3 * 2 && kinds[GRAPH_SEG_ATTENTION] == 1 + 1 + 2 &&
              kinds[GRAPH_SEG_LEVEL] == 3 + 1 + 3,
          "segments: %d res blocks, %d attention blocks, %d levels", kinds[GRAPH_SEG_RESBLOCK],
          kinds[GRAPH_SEG_ATTENTION], kinds[GRAPH_SEG_LEVEL]);
    struct plan_opts po = {0};
    po.strategy.recompute = STRATEGY_RECOMPUTE_RESBLOCK;
    struct plan p;
    CHECK(plan_make(&p, &g, backend_cpu(), &po) == PLAN_OK, "plan");
    int ok = p.ops != NULL;
    for (int k = 0; ok && k < g.n_fwd_ops; k++) ok = p.op_src[k] == k;
    int copies = 0, orig_read = 0;
    for (int k = g.n_fwd_ops; ok && k < p.n_run_ops; k++) {
        int src = p.op_src[k];
        if (src < g.n_fwd_ops) {
            copies++;
            ok = p.ops[k].type == g.ops[src].type;
        } else {
            /* a backward op reading an original activation of a chosen segment: a bug */
            for (int j = 0; j < p.ops[k].n_in; j++) {
                int t = p.ops[k].in[j];
                for (int s = 0; t >= 0 && t < g.n_tensors && s < g.n_segs; s++)
                    if (g.segs[s].kind != GRAPH_SEG_LEVEL && g.tensors[t]->kind == TENSOR_ACT &&
                        p.first[t] >= g.segs[s].first && p.first[t] < g.segs[s].end &&
                        p.first[t] < g.n_fwd_ops) {
                        int made_here = 0;
                        for (int q = g.segs[s].first; q < g.segs[s].end; q++)
                            for (int o = 0; o < g.ops[q].n_out; o++) made_here |= g.ops[q].out[o] == t;
                        orig_read += made_here;
                    }
            }
        }
    }
    CHECK(ok && copies == p.n_recomputed && copies > 0, "the run order's shape (%d copies)",
          copies);
    CHECK(orig_read == 0, "%d backward reads of original segment activations", orig_read);
    plan_free(&p);
    graph_free(&g);
}

int main(void)
{
    schedule_shape();
    equivalence(UNET_DDPM, 2, 2, STRATEGY_PRECISION_F32);
    equivalence(UNET_SEED, 3, 3, STRATEGY_PRECISION_F32);
    equivalence(UNET_DDPM, 4, 3, STRATEGY_PRECISION_F32);
    /* f16 (loss scaling on) with an uneven micro-batch: a re-run op reads the same 16-bit
     * operands, so its outputs are the same bits */
    equivalence(UNET_DDPM, 4, 3, STRATEGY_PRECISION_F16);
    return tu_finish("test_recompute");
}
