/* plot.h - the loss curve as a PNG (libpng through image.h): training loss per logged step in
 * blue, validation loss in red, log-scale y axis with decade ticks.
 */
#ifndef DDPMD_PLOT_H
#define DDPMD_PLOT_H

#include <stdint.h>

#include <stddef.h>

/* val may hold NaN where there is no validation value; written atomically (image_save_png).
 * Returns 0, or -1 with the reason in err ("cannot write 'P.tmp.x1Yz2w': No space left on
 * device", "out of memory") */
int plot_loss_png(const char *path, const int64_t *step, const float *loss, const float *val,
                  int n, char *err, size_t errlen);

#endif
