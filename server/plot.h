/* plot.h - the loss curve as a PNG chart drawn with cairo: training loss per logged step as a
 * blue line, validation loss as red points, a log-scale loss axis with its values, a step axis
 * with its values, axis labels and a legend. Text is set in DejaVu Sans through fontconfig.
 * A long series is drawn from a bounded reduction of it (plot_reduce), so the cost of a picture
 * is one pass over the points plus a fixed amount of drawing, however long the job ran.
 */
#ifndef DDPMD_PLOT_H
#define DDPMD_PLOT_H

#include <stdint.h>

#include <stddef.h>

/* the picture's size and its plot area (pixels from the left / top edge): the data's steps span
 * [PLOT_AREA_L, PLOT_AREA_R], its loss decades [PLOT_AREA_B (the lowest), PLOT_AREA_T] */
#define PLOT_W 800
#define PLOT_H 450
#define PLOT_AREA_L 78
#define PLOT_AREA_R 780
#define PLOT_AREA_T 44
#define PLOT_AREA_B 394
/* the legend's row (its centre line) and where its two entries start: a 22-pixel line or point
 * swatch, then the entry's text from 28 pixels on */
#define PLOT_LEGEND_Y 22
#define PLOT_LEGEND_X1 (PLOT_AREA_R - 250)
#define PLOT_LEGEND_X2 (PLOT_AREA_R - 140)

/* the most points plot_reduce keeps: per pixel column of the plot area the first and the last
 * point, the lowest and highest loss, the lowest and highest validation loss, and the first gap
 * (a loss that is not positive and finite) */
#define PLOT_COLUMNS (PLOT_AREA_R - PLOT_AREA_L + 1)
#define PLOT_MAX_POINTS (7 * PLOT_COLUMNS)
/* cairo's, fontconfig's (its configuration and font caches) and FreeType's (one face) memory
 * the first chart leaves behind: ~5 MiB measured (a job's VmHWM across its first loss.png),
 * rounded up */
#define PLOT_LIB_BYTES ((int64_t)8 << 20)

/* what one picture cost: points read from the series, points drawn (the train line's vertices
 * and the validation discs) */
struct plot_stats {
    int read, drawn;
};

/* the points of (step, loss, val)[0..n) that plot_loss_png draws, in order, at most
 * PLOT_MAX_POINTS of them, into the o* arrays (room for PLOT_MAX_POINTS each); steps ascending.
 * Every kept point is one of the input's, so each column's extremes are exact. Returns the
 * number kept. */
int plot_reduce(const int64_t *step, const float *loss, const float *val, int n, int64_t *ostep,
                float *oloss, float *oval);

/* val may hold NaN where there is no validation value; written atomically (fsio_write_atomic).
 * Nothing is written when no loss is positive and finite (n < 1 included). Returns 0, or -1
 * with the reason in err ("cannot write 'P.tmp.x1Yz2w': No space left on device", "out of
 * memory", cairo's status) */
int plot_loss_png(const char *path, const int64_t *step, const float *loss, const float *val,
                  int n, char *err, size_t errlen);
/* the host bytes plot_loss_png holds, whatever n (the series is reduced to PLOT_MAX_POINTS
 * first): the reduced series, cairo's RGB24 surface, the PNG in memory, and what cairo,
 * fontconfig and FreeType keep once text is drawn (PLOT_LIB_BYTES) */
int64_t plot_loss_plan_bytes(void);
/* the same, and what it cost in *stats (may be NULL) */
int plot_loss_png_stats(const char *path, const int64_t *step, const float *loss, const float *val,
                        int n, struct plot_stats *stats, char *err, size_t errlen);

#endif
