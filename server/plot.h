/* plot.h - the loss curve as a PNG chart drawn with cairo: training loss per logged step as a
 * blue line, validation loss as red points, a log-scale loss axis with its values, a step axis
 * with its values, axis labels and a legend. Text is set in DejaVu Sans through fontconfig.
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

/* val may hold NaN where there is no validation value; written atomically (fsio_write_atomic).
 * Nothing is written when no loss is positive and finite (n < 1 included). Returns 0, or -1
 * with the reason in err ("cannot write 'P.tmp.x1Yz2w': No space left on device", "out of
 * memory", cairo's status) */
int plot_loss_png(const char *path, const int64_t *step, const float *loss, const float *val,
                  int n, char *err, size_t errlen);

#endif
