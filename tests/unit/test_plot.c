/* test_plot.c - loss.png (server/plot.c) decoded and read back pixel by pixel: its size, the train
 * curve where a log-scale axis puts it (an exponential decay is a straight line), the validation
 * points where their values are, tick labels beside both axes, the legend, nothing written
 * without data and the reason when the file cannot be written; a series of a million points is
 * drawn from at most PLOT_MAX_POINTS of them with its extremes kept. TEST_PLOT_KEEP=DIR keeps
 * the PNGs.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image.h"
#include "plot.h"
#include "test_util.h"

static float px(const struct image *im, int c, int x, int y)
{
    return im->data[((size_t)c * im->h + y) * im->w + x];
}

/* the colours plot.c draws with: the train line blue, the validation points red, text dark */
static int is_blue(const struct image *im, int x, int y)
{
    return px(im, 2, x, y) > 0.6f && px(im, 0, x, y) < 0.45f && px(im, 1, x, y) < 0.65f;
}
static int is_red(const struct image *im, int x, int y)
{
    return px(im, 0, x, y) > 0.6f && px(im, 1, x, y) < 0.45f && px(im, 2, x, y) < 0.45f;
}
static int is_dark(const struct image *im, int x, int y)
{
    return px(im, 0, x, y) + px(im, 1, x, y) + px(im, 2, x, y) < 1.2f;
}

static int count(const struct image *im, int x0, int y0, int x1, int y1,
                 int (*f)(const struct image *, int, int))
{
    int n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) n += f(im, x, y);
    return n;
}

static int load(const char *path, struct image *im)
{
    char err[300];
    int rc = image_load_png(path, im, err, sizeof err);
    CHECK(rc == 0, "decode %s: %s", path, err);
    if (rc) return -1;
    CHECK(im->c == 3 && im->w == PLOT_W && im->h == PLOT_H, "%s is %dx%d with %d channels", path,
          im->w, im->h, im->c);
    return im->c == 3 && im->w == PLOT_W && im->h == PLOT_H ? 0 : -1;
}

/* loss 10^(-2 s / 200) from 1 to 0.01 over steps 0..200 (the axis spans exactly decades -2..0),
 * validation 2 x loss every 50 steps */
static void test_decay(const char *dir)
{
    enum { N = 201 };
    int64_t step[N];
    float loss[N], val[N];
    for (int i = 0; i < N; i++) {
        step[i] = i;
        loss[i] = powf(10.0f, -2.0f * (float)i / 200.0f);
        val[i] = i % 50 == 0 && i > 0 ? 2 * loss[i] : NAN;
    }
    char path[512], err[300];
    snprintf(path, sizeof path, "%s/decay.png", dir);
    CHECK(plot_loss_png(path, step, loss, val, N, err, sizeof err) == 0, "plot: %s", err);
    struct image im;
    if (load(path, &im)) return;
    const double L = PLOT_AREA_L, R = PLOT_AREA_R, T = PLOT_AREA_T, B = PLOT_AREA_B;
    /* the train curve: in each column of the plot area the blue pixels' mean row is where a log
     * axis from 0.01 (B) to 1 (T) puts the loss of that column's step */
    int cols = 0, near = 0;
    double worst = 0;
    for (int x = (int)L + 4; x <= (int)R - 4; x++) {
        double sum = 0;
        int k = 0;
        for (int y = (int)T - 3; y <= (int)B + 3; y++)
            if (is_blue(&im, x, y)) sum += y, k++;
        if (!k) continue;
        cols++;
        double s = (x - L) / (R - L) * 200, want = B - (-2 * s / 200 + 2) / 2 * (B - T);
        double d = fabs(sum / k - want);
        near += d <= 3;
        if (d > worst) worst = d;
    }
    int span = (int)(R - L) - 7;
    CHECK(cols >= span * 95 / 100, "the train curve is drawn in %d of %d columns", cols, span);
    CHECK(near >= cols * 97 / 100, "%d of %d columns put the curve within 3 px of the log-scale "
                                   "position (worst %.1f px)", near, cols, worst);
    /* the validation points: red discs at (X(step), Y(2 loss)) */
    for (int s = 50; s <= 200; s += 50) {
        int x = (int)lround(L + s / 200.0 * (R - L));
        double v = 2 * pow(10, -2.0 * s / 200);
        int y = (int)lround(B - (log10(v) + 2) / 2 * (B - T));
        int red = count(&im, x - 4, y - 4, x + 5, y + 5, is_red);
        CHECK(red >= 12, "validation point of step %d: %d red pixels at (%d, %d)", s, red, x, y);
    }
    int stray = count(&im, (int)L, (int)T, (int)L + 30, (int)B, is_red);
    CHECK(stray == 0, "%d red pixels where there is no validation loss", stray);
    /* the loss axis' values and label left of the plot area, the steps' below it */
    int left = count(&im, 0, (int)T, (int)L - 6, (int)B, is_dark);
    int below = count(&im, (int)L, (int)B + 8, (int)R, PLOT_H, is_dark);
    CHECK(left > 150, "the loss axis has %d dark pixels of tick values and label", left);
    CHECK(below > 150, "the step axis has %d dark pixels of tick values and label", below);
    /* a tick value at each decade: text in the rows of 0.01, 0.1 and 1 beside the axis */
    for (int d = 0; d <= 2; d++) {
        int y = (int)lround(B - d / 2.0 * (B - T));
        int t = count(&im, (int)L - 50, y - 6, (int)L - 6, y + 7, is_dark);
        CHECK(t > 4, "no tick value beside the loss axis at 10^%d (row %d: %d dark pixels)", d - 2,
              y, t);
    }
    /* the legend above the plot area: a blue line, a red point and their text */
    const int y0 = PLOT_LEGEND_Y - 8, y1 = PLOT_LEGEND_Y + 9;
    int lb = count(&im, PLOT_LEGEND_X1, y0, PLOT_LEGEND_X1 + 23, y1, is_blue);
    int lt1 = count(&im, PLOT_LEGEND_X1 + 26, y0, PLOT_LEGEND_X2 - 4, y1, is_dark);
    int lr = count(&im, PLOT_LEGEND_X2, y0, PLOT_LEGEND_X2 + 23, y1, is_red);
    int lt2 = count(&im, PLOT_LEGEND_X2 + 20, y0, PLOT_W, y1, is_dark);
    CHECK(lb >= 20 && lt1 > 40, "legend, train: %d blue pixels, %d of text", lb, lt1);
    CHECK(lr >= 12 && lt2 > 60, "legend, validation: %d red pixels, %d of text", lr, lt2);
    image_free(&im);
}

/* a loss inside one decade (0.05 to 0.02) still gets its decade as the axis and a curve */
static void test_narrow(const char *dir)
{
    int64_t step[3] = {10, 20, 30};
    float loss[3] = {0.05f, 0.03f, 0.02f}, val[3] = {NAN, NAN, NAN};
    char path[512], err[300];
    snprintf(path, sizeof path, "%s/narrow.png", dir);
    CHECK(plot_loss_png(path, step, loss, val, 3, err, sizeof err) == 0, "plot: %s", err);
    struct image im;
    if (load(path, &im)) return;
    /* axis 0.01 .. 0.1: 0.05 at log position 0.699 of the height, 0.02 at 0.301 */
    const double T = PLOT_AREA_T, B = PLOT_AREA_B;
    int y0 = (int)lround(B - 0.69897 * (B - T)), y1 = (int)lround(B - 0.30103 * (B - T));
    int b0 = count(&im, PLOT_AREA_L, y0 - 3, PLOT_AREA_L + 6, y0 + 4, is_blue);
    int b1 = count(&im, PLOT_AREA_R - 6, y1 - 3, PLOT_AREA_R + 1, y1 + 4, is_blue);
    CHECK(b0 > 0 && b1 > 0, "the curve's ends: %d blue pixels at row %d, %d at row %d", b0, y0, b1,
          y1);
    CHECK(count(&im, 0, PLOT_AREA_T - 4, PLOT_W, PLOT_H, is_red) == 0,
          "red pixels in the plot area without a validation loss");
    image_free(&im);
}

/* a million logged steps (a cancel at 207k once took 86 s): every point read once, a bounded
 * number drawn, and the reduction keeps each column's extremes (one low spike, one high, a
 * validation minimum) */
static void test_long(const char *dir)
{
    enum { N = 1000000 };
    int64_t *step = malloc(N * sizeof *step), *rs = malloc(PLOT_MAX_POINTS * sizeof *rs);
    float *loss = malloc(N * sizeof *loss), *val = malloc(N * sizeof *val);
    float *rl = malloc(PLOT_MAX_POINTS * sizeof *rl), *rv = malloc(PLOT_MAX_POINTS * sizeof *rv);
    if (!step || !rs || !loss || !val || !rl || !rv) {
        CHECK(0, "out of memory");
        goto out;
    }
    for (int i = 0; i < N; i++) {
        step[i] = i + 1;
        loss[i] = 0.1f * (1.0f + 0.2f * (float)(((int64_t)i * 7919) % 13) / 13.0f);
        val[i] = i % 1000 == 999 ? 0.15f : NAN;
    }
    loss[123457] = 0.002f;  /* one low spike */
    loss[654321] = 5.0f;    /* one high */
    loss[700000] = NAN;     /* one gap */
    val[899999] = 0.003f;   /* one low validation point */
    int kept = plot_reduce(step, loss, val, N, rs, rl, rv);
    CHECK(kept > PLOT_COLUMNS && kept <= PLOT_MAX_POINTS, "reduced to %d points (bound %d)", kept,
          PLOT_MAX_POINTS);
    int lo = 0, hi = 0, gap = 0, vlo = 0, ordered = 1;
    for (int i = 0; i < kept; i++) {
        lo += rs[i] == 123458 && rl[i] == 0.002f;
        hi += rs[i] == 654322 && rl[i] == 5.0f;
        gap += rs[i] == 700001 && isnan(rl[i]);
        vlo += rs[i] == 900000 && rv[i] == 0.003f;
        if (i && rs[i] <= rs[i - 1]) ordered = 0;
    }
    CHECK(lo == 1 && hi == 1 && gap == 1 && vlo == 1,
          "extremes kept: low spike %d, high %d, gap %d, validation minimum %d", lo, hi, gap, vlo);
    CHECK(ordered, "the reduced steps are not ascending");
    CHECK(rs[0] == 1 && rs[kept - 1] == N, "the ends %lld..%lld", (long long)rs[0],
          (long long)rs[kept - 1]);
    char path[512], err[300];
    snprintf(path, sizeof path, "%s/long.png", dir);
    struct plot_stats st = {-1, -1};
    CHECK(plot_loss_png_stats(path, step, loss, val, N, &st, err, sizeof err) == 0, "plot: %s", err);
    CHECK(st.read == N, "%d points read of %d", st.read, N);
    CHECK(st.drawn > PLOT_COLUMNS && st.drawn <= 2 * PLOT_MAX_POINTS,
          "%d points drawn for %d (bound %d)", st.drawn, N, 2 * PLOT_MAX_POINTS);
    /* the low spike is in the picture: blue at the bottom of the axis (0.001 .. 10) */
    struct image im;
    if (load(path, &im) == 0) {
        const double L = PLOT_AREA_L, R = PLOT_AREA_R, T = PLOT_AREA_T, B = PLOT_AREA_B;
        int x = (int)lround(L + 123457.0 / (N - 1) * (R - L));
        int y = (int)lround(B - (log10(0.002) + 3) / 4 * (B - T));
        int blue = count(&im, x - 3, y - 3, x + 4, y + 4, is_blue);
        CHECK(blue > 0, "the low spike is not drawn near (%d, %d)", x, y);
        image_free(&im);
    }
    unlink(path);
out:
    free(step), free(rs), free(loss), free(val), free(rl), free(rv);
}

static void test_nothing(const char *dir)
{
    char path[512], err[300] = "";
    struct stat sb;
    int64_t step[2] = {1, 2};
    float bad[2] = {NAN, -1.0f}, val[2] = {NAN, NAN};
    snprintf(path, sizeof path, "%s/none.png", dir);
    CHECK(plot_loss_png(path, step, bad, val, 0, err, sizeof err) == 0, "n = 0");
    CHECK(plot_loss_png(path, step, bad, val, 2, err, sizeof err) == 0, "no positive loss");
    CHECK(stat(path, &sb) != 0, "a picture was written without data");
    float loss[2] = {1, 0.5f};
    snprintf(path, sizeof path, "%s/no-such-folder/loss.png", dir);
    CHECK(plot_loss_png(path, step, loss, val, 2, err, sizeof err) == -1, "unwritable path accepted");
    CHECK(strstr(err, "no-such-folder") != NULL, "the error does not name the file: %s", err);
}

int main(void)
{
    const char *keep = getenv("TEST_PLOT_KEEP");
    char dir[] = "/tmp/test_plot_XXXXXX";
    if (keep) {
        mkdir(keep, 0755);
    } else if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *d = keep ? keep : dir;
    test_decay(d);
    test_narrow(d);
    test_nothing(d);
    test_long(d);
    if (!keep) {
        char p[600];
        const char *names[] = {"decay.png", "narrow.png"};
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/%s", d, names[i]);
            unlink(p);
        }
        rmdir(d);
    }
    return tu_finish("test_plot");
}
