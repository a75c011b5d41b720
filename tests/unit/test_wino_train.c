/* test_wino_train.c - training in the CPU's fast mode (Winograd convolutions, kernels/cpu/wino.c)
 * against parity mode (memory.deterministic: the direct kernels) on the tiny spec widened to 32
 * channels, so that every 3x3 convolution but the first and the last is a Winograd one: the two
 * runs' checkpoints (weights, EMA, AdamW state) differ (fast mode did run) but stay close, and so
 * do their losses; two fast runs give the same bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "test_train_util.h"
#include "train.h"

static int run(const char *data, const char *out, int deterministic, unsigned char **bytes,
               size_t *n, double *loss)
{
    struct train_spec s;
    char err[512], path[600];
    tt_tiny_spec(&s, data, 6);
    s.model.channels[0] = s.model.channels[1] = 32;
    s.deterministic = deterministic;
    struct train_opts o = {.out_dir = out, .quiet = 1};
    if (train_run(&s, &o, err, sizeof err) != TRAIN_DONE) {
        fprintf(stderr, "train: %s\n", err);
        return -1;
    }
    snprintf(path, sizeof path, "%s/checkpoints/step-00000006.safetensors", out);
    *bytes = tt_checkpoint_bytes(path, n);
    snprintf(path, sizeof path, "%s/loss.csv", out);
    FILE *f = fopen(path, "r");
    char line[256];
    *loss = NAN;
    while (f && fgets(line, sizeof line, f)) {
        int step;
        double l;
        if (sscanf(line, "%d,%lf", &step, &l) == 2 && step == 6) *loss = l;
    }
    if (f) fclose(f);
    return *bytes ? 0 : -1;
}

int main(void)
{
    char root[] = "/tmp/ddpmd-test-wino-train-XXXXXX";
    if (!mkdtemp(root)) return 1;
    char data[300], a[300], b[300], c[300];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(a, sizeof a, "%s/fast", root);
    snprintf(b, sizeof b, "%s/parity", root);
    snprintf(c, sizeof c, "%s/fast2", root);
    tt_make_discs(data);

    unsigned char *fa = NULL, *pa = NULL, *f2 = NULL;
    size_t nf = 0, np = 0, n2 = 0;
    double lf, lp, l2;
    CHECK(run(data, a, 0, &fa, &nf, &lf) == 0, "fast run");
    CHECK(run(data, b, 1, &pa, &np, &lp) == 0, "parity run");
    CHECK(run(data, c, 0, &f2, &n2, &l2) == 0, "second fast run");
    if (fa && pa && f2 && nf == np && nf == n2 && nf % 4 == 0) {
        CHECK(!memcmp(fa, f2, nf), "two fast runs: the same bytes");
        CHECK(memcmp(fa, pa, nf) != 0, "fast and parity runs give the same bytes: no Winograd ran");
        /* every tensor is fp32: the largest difference against the largest value (measured 6e-5:
         * AdamW turns small gradient differences of near-zero gradients into lr-sized steps) */
        const float *x = (const float *)fa, *y = (const float *)pa;
        double d = 0, m = 0;
        for (size_t i = 0; i < nf / 4; i++) {
            d = fmax(d, fabs((double)x[i] - y[i]));
            m = fmax(m, fabs((double)y[i]));
        }
        printf("fast against parity after 6 steps: largest difference %.3g of the largest "
               "value; losses %.9g, %.9g\n", d / m, lf, lp);
        CHECK(d <= 1e-3 * m, "fast against parity after 6 steps: %.3g of the largest value", d / m);
        CHECK(fabs(lf - lp) <= 1e-4 * fabs(lp), "the step-6 losses: %.9g against %.9g", lf, lp);
    } else {
        CHECK(0, "checkpoints of %zu, %zu and %zu bytes", nf, np, n2);
    }
    free(fa), free(pa), free(f2);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return tu_finish("test_wino_train");
}
