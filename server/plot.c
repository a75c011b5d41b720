/* plot.c - a minimal raster line plot: no fonts, so the axes carry decade ticks only and the
 * numbers live in loss.csv beside the picture. */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "image.h"

#define PW 640
#define PH 360
#define MARGIN 24

static void put(float *img, int x, int y, const float rgb[3])
{
    if (x < 0 || y < 0 || x >= PW || y >= PH) return;
    for (int c = 0; c < 3; c++) img[((size_t)c * PH + y) * PW + x] = rgb[c];
}

static void line(float *img, int x0, int y0, int x1, int y1, const float rgb[3])
{
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int e = dx + dy;
    for (;;) {
        put(img, x0, y0, rgb);
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * e;
        if (e2 >= dy) { e += dy; x0 += sx; }
        if (e2 <= dx) { e += dx; y0 += sy; }
    }
}

int plot_loss_png(const char *path, const int64_t *step, const float *loss, const float *val,
                  int n, char *err, size_t errlen)
{
    static const float black[3] = {-1, -1, -1}, grey[3] = {0.6f, 0.6f, 0.6f},
                       blue[3] = {-0.8f, -0.4f, 0.9f}, red[3] = {0.9f, -0.8f, -0.8f};
    if (n < 1) return 0;
    float *img = malloc(3 * (size_t)PW * PH * sizeof *img);
    if (!img) {
        snprintf(err, errlen, "out of memory drawing %s", path);
        return -1;
    }
    for (size_t i = 0; i < 3 * (size_t)PW * PH; i++) img[i] = 1.0f;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v[2] = {loss[i], val[i]};
        for (int k = 0; k < 2; k++)
            if (v[k] > 0 && isfinite(v[k])) {
                lo = fmin(lo, log10(v[k]));
                hi = fmax(hi, log10(v[k]));
            }
    }
    if (!isfinite(lo)) {
        free(img);
        return 0;
    }
    lo = floor(lo);
    hi = ceil(hi);
    if (hi <= lo) hi = lo + 1;
    double s0 = (double)step[0], s1 = (double)step[n - 1];
    if (s1 <= s0) s1 = s0 + 1;
    int x_l = MARGIN, x_r = PW - MARGIN, y_t = MARGIN, y_b = PH - MARGIN;
#define X(s) (x_l + (int)lround(((double)(s) - s0) / (s1 - s0) * (x_r - x_l)))
#define Y(v) (y_b - (int)lround((log10(v) - lo) / (hi - lo) * (y_b - y_t)))
    for (double d = lo; d <= hi + 1e-9; d += 1) { /* a grid line per decade */
        int y = y_b - (int)lround((d - lo) / (hi - lo) * (y_b - y_t));
        line(img, x_l, y, x_r, y, grey);
        line(img, x_l - 6, y, x_l, y, black);
    }
    line(img, x_l, y_t, x_l, y_b, black);
    line(img, x_l, y_b, x_r, y_b, black);
    for (int i = 1; i < n; i++)
        if (loss[i - 1] > 0 && loss[i] > 0)
            line(img, X(step[i - 1]), Y(loss[i - 1]), X(step[i]), Y(loss[i]), blue);
    for (int i = 0; i < n; i++)
        if (val[i] > 0 && isfinite(val[i])) {
            int x = X(step[i]), y = Y(val[i]);
            for (int d = -2; d <= 2; d++) {
                line(img, x - 2, y + d, x + 2, y + d, red);
            }
        }
    int rc = image_save_png(path, img, 3, PH, PW, err, errlen) ? -1 : 0;
    free(img);
    return rc;
}
