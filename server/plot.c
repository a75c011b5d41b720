/* plot.c - loss.png: a chart of the training and validation loss drawn with cairo (lines, text
 * through fontconfig) and encoded in memory, then written with fsio_write_atomic. The loss axis
 * is logarithmic from the decade below the smallest value to the decade above the largest. A
 * series longer than the picture has columns is reduced first (plot_reduce): a cancel at 207k
 * points once spent 86 s stroking every vertex with round joins. */
#define _GNU_SOURCE /* M_PI */
#include "plot.h"

#include <cairo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsio.h"

#define FONT "DejaVu Sans"

struct png_mem {
    unsigned char *data;
    size_t len, cap;
    int oom;
};

static cairo_status_t png_mem_write(void *closure, const unsigned char *data, unsigned int len)
{
    struct png_mem *m = closure;
    if (m->len + len > m->cap) {
        size_t cap = (m->len + len) * 2;
        unsigned char *b = realloc(m->data, cap);
        if (!b) {
            m->oom = 1;
            return CAIRO_STATUS_NO_MEMORY;
        }
        m->data = b;
        m->cap = cap;
    }
    memcpy(m->data + m->len, data, len);
    m->len += len;
    return CAIRO_STATUS_SUCCESS;
}

/* text with its anchor: ax, ay in [0, 1] of its extent (0.5, 0.5 centres it) */
static void text_at(cairo_t *cr, double x, double y, double ax, double ay, const char *s)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - e.x_bearing - ax * e.width, y - e.y_bearing - ay * e.height);
    cairo_show_text(cr, s);
}

/* a step between x ticks: 1, 2 or 5 x 10^k, about 6 of them over span */
static double nice_step(double span)
{
    double raw = span / 6, p = pow(10, floor(log10(raw))), f = raw / p;
    double m = f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10;
    double s = m * p;
    return s < 1 ? 1 : s; /* steps are whole numbers */
}

static int good(float v) { return v > 0 && isfinite(v); }

int plot_reduce(const int64_t *step, const float *loss, const float *val, int n, int64_t *ostep,
                float *oloss, float *oval)
{
    if (n < 1) return 0;
    double s0 = (double)step[0], s1 = (double)step[n - 1];
    if (s1 <= s0) s1 = s0 + 1;
    int kept = 0;
    for (int i = 0; i < n;) {
        /* one pixel column: [i, j) */
        int col = (int)((double)(step[i] - step[0]) / (s1 - s0) * (PLOT_COLUMNS - 1));
        int j = i + 1;
        while (j < n && (int)((double)(step[j] - step[0]) / (s1 - s0) * (PLOT_COLUMNS - 1)) <= col)
            j++;
        int pick[7] = {i, j - 1, -1, -1, -1, -1, -1};
        for (int k = i; k < j; k++) {
            if (good(loss[k])) {
                if (pick[2] < 0 || loss[k] < loss[pick[2]]) pick[2] = k;
                if (pick[3] < 0 || loss[k] > loss[pick[3]]) pick[3] = k;
            } else if (pick[6] < 0) {
                pick[6] = k;
            }
            if (good(val[k])) {
                if (pick[4] < 0 || val[k] < val[pick[4]]) pick[4] = k;
                if (pick[5] < 0 || val[k] > val[pick[5]]) pick[5] = k;
            }
        }
        /* in input order, each once */
        for (int a = 1; a < 7; a++)
            for (int b = a; b > 0 && pick[b] < pick[b - 1]; b--) {
                int t = pick[b];
                pick[b] = pick[b - 1];
                pick[b - 1] = t;
            }
        for (int a = 0; a < 7; a++)
            if (pick[a] >= 0 && (a == 0 || pick[a] != pick[a - 1]) && kept < PLOT_MAX_POINTS) {
                ostep[kept] = step[pick[a]];
                oloss[kept] = loss[pick[a]];
                oval[kept] = val[pick[a]];
                kept++;
            }
        i = j;
    }
    return kept;
}

static int draw(cairo_t *cr, const int64_t *step, const float *loss, const float *val, int n,
                double lo, double hi, double s0, double s1, int has_val)
{
    const double L = PLOT_AREA_L, R = PLOT_AREA_R, T = PLOT_AREA_T, B = PLOT_AREA_B;
#define X(s) (L + ((double)(s) - s0) / (s1 - s0) * (R - L))
#define Y(v) (B - (log10(v) - lo) / (hi - lo) * (B - T))
    char buf[64];
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, FONT, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_line_width(cr, 1);
    /* loss grid and ticks: every decade labelled; 2 and 5 as minor lines (labelled too when
     * the axis spans at most two decades) */
    cairo_set_font_size(cr, 12);
    for (int d = (int)lo; d <= (int)hi; d++) {
        static const int mult[] = {1, 2, 5};
        for (int k = 0; k < 3; k++) {
            double v = mult[k] * pow(10, d), y;
            if (log10(v) > hi + 1e-9) break;
            y = round(Y(v)) + 0.5;
            cairo_set_source_rgb(cr, k ? 0.93 : 0.85, k ? 0.93 : 0.85, k ? 0.93 : 0.85);
            cairo_move_to(cr, L, y);
            cairo_line_to(cr, R, y);
            cairo_stroke(cr);
            if (k == 0 || hi - lo <= 2) {
                cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
                cairo_move_to(cr, L - 5, y);
                cairo_line_to(cr, L, y);
                cairo_stroke(cr);
                snprintf(buf, sizeof buf, "%g", v);
                text_at(cr, L - 8, y, 1, 0.5, buf);
            }
        }
    }
    /* step ticks */
    double st = nice_step(s1 - s0);
    for (double s = ceil(s0 / st) * st; s <= s1 + 1e-9; s += st) {
        double x = round(X(s)) + 0.5;
        cairo_set_source_rgb(cr, 0.93, 0.93, 0.93);
        cairo_move_to(cr, x, T);
        cairo_line_to(cr, x, B);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        cairo_move_to(cr, x, B);
        cairo_line_to(cr, x, B + 5);
        cairo_stroke(cr);
        snprintf(buf, sizeof buf, "%.0f", s);
        text_at(cr, x, B + 9, 0.5, 0, buf);
    }
    /* axes and their labels */
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    cairo_move_to(cr, L + 0.5, T);
    cairo_line_to(cr, L + 0.5, B + 0.5);
    cairo_line_to(cr, R, B + 0.5);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 13);
    text_at(cr, (L + R) / 2, PLOT_H - 8, 0.5, 1, "step");
    cairo_save(cr);
    cairo_translate(cr, 16, (T + B) / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, 0.5, 0.5, "loss (log scale)");
    cairo_restore(cr);
    cairo_set_font_size(cr, 14);
    text_at(cr, L, 14, 0, 0, "ddpmd loss");
    /* the curves, clipped to the plot area */
    cairo_save(cr);
    cairo_rectangle(cr, L, T - 4, R - L + 4, B - T + 8);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, 0.12, 0.39, 0.85);
    cairo_set_line_width(cr, 1.6);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    int pen = 0, drawn = 0;
    for (int i = 0; i < n; i++) {
        if (!(loss[i] > 0) || !isfinite(loss[i])) {
            pen = 0;
            continue;
        }
        if (pen)
            cairo_line_to(cr, X(step[i]), Y(loss[i]));
        else
            cairo_move_to(cr, X(step[i]), Y(loss[i]));
        pen = 1;
        drawn++;
    }
    if (drawn == 1) cairo_rel_line_to(cr, 0.01, 0); /* one point: a dot (round caps) */
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.85, 0.15, 0.15);
    for (int i = 0; i < n; i++)
        if (val[i] > 0 && isfinite(val[i])) {
            cairo_arc(cr, X(step[i]), Y(val[i]), 3.5, 0, 2 * M_PI);
            cairo_fill(cr);
            drawn++;
        }
    cairo_restore(cr);
    /* the legend, top right above the plot area */
    cairo_set_font_size(cr, 12);
    double lx = PLOT_LEGEND_X1, ly = PLOT_LEGEND_Y;
    cairo_set_source_rgb(cr, 0.12, 0.39, 0.85);
    cairo_set_line_width(cr, 2);
    cairo_move_to(cr, lx, ly);
    cairo_line_to(cr, lx + 22, ly);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, lx + 28, ly, 0, 0.5, "train loss");
    lx = PLOT_LEGEND_X2;
    cairo_set_source_rgb(cr, 0.85, 0.15, 0.15);
    cairo_arc(cr, lx + 11, ly, 3.5, 0, 2 * M_PI);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, lx + 22, ly, 0, 0.5, has_val ? "validation loss" : "validation loss (none)");
#undef X
#undef Y
    return drawn;
}

int64_t plot_loss_plan_bytes(void)
{
    int64_t surface = (int64_t)PLOT_W * PLOT_H * 4, raw = (int64_t)PLOT_W * PLOT_H * 3 + PLOT_H;
    /* png_mem_write doubles its buffer past what it holds, and copies as it does */
    return (int64_t)PLOT_MAX_POINTS * (int64_t)(sizeof(int64_t) + 2 * sizeof(float)) + surface +
           3 * (raw + raw / 1000 + 4096) + PLOT_LIB_BYTES;
}

int plot_loss_png(const char *path, const int64_t *step, const float *loss, const float *val,
                  int n, char *err, size_t errlen)
{
    return plot_loss_png_stats(path, step, loss, val, n, NULL, err, errlen);
}

int plot_loss_png_stats(const char *path, const int64_t *step, const float *loss, const float *val,
                        int n, struct plot_stats *stats, char *err, size_t errlen)
{
    if (stats) stats->read = n > 0 ? n : 0, stats->drawn = 0;
    double lo = INFINITY, hi = -INFINITY;
    int has_val = 0;
    for (int i = 0; i < n; i++) {
        float v[2] = {loss[i], val[i]};
        for (int k = 0; k < 2; k++)
            if (v[k] > 0 && isfinite(v[k])) {
                lo = fmin(lo, log10(v[k]));
                hi = fmax(hi, log10(v[k]));
                has_val |= k;
            }
    }
    if (n < 1 || !isfinite(lo)) return 0;
    /* a float 0.01 is log10 -2.0000000x: it belongs to the decade [0.01, 0.1], not the one below */
    lo = floor(lo + 1e-6);
    hi = ceil(hi - 1e-6);
    if (hi <= lo) hi = lo + 1;
    double s0 = (double)step[0], s1 = (double)step[n - 1];
    if (s1 <= s0) s1 = s0 + 1;
    int64_t *rs = malloc(PLOT_MAX_POINTS * sizeof *rs);
    float *rl = malloc(PLOT_MAX_POINTS * sizeof *rl), *rv = malloc(PLOT_MAX_POINTS * sizeof *rv);
    if (!rs || !rl || !rv) {
        free(rs), free(rl), free(rv);
        snprintf(err, errlen, "cannot draw %s: out of memory", path);
        return -1;
    }
    int rn = plot_reduce(step, loss, val, n, rs, rl, rv);
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, PLOT_W, PLOT_H);
    cairo_t *cr = cairo_create(sf);
    struct png_mem m = {0};
    int rc = -1;
    cairo_status_t st = cairo_status(cr);
    if (st == CAIRO_STATUS_SUCCESS) {
        int drawn = draw(cr, rs, rl, rv, rn, lo, hi, s0, s1, has_val);
        if (stats) stats->drawn = drawn;
        st = cairo_status(cr);
    }
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png_stream(sf, png_mem_write, &m);
    if (st != CAIRO_STATUS_SUCCESS) {
        snprintf(err, errlen, "cannot draw %s: %s", path,
                 m.oom ? "out of memory" : cairo_status_to_string(st));
        goto out;
    }
    struct fsio_buf b = {m.data, m.len};
    rc = fsio_write_atomic(path, &b, 1, err, errlen) ? -1 : 0;
out:
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    free(m.data);
    free(rs), free(rl), free(rv);
    return rc;
}
