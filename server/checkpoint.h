/* checkpoint.h - training checkpoints as safetensors: weights under their parameter names, EMA
 * weights under "ema.", AdamW moments under "adam_m." / "adam_v.", and in __metadata__ the spec,
 * the step, the thread count, the format version and the precision the run computes in (weights
 * are saved fp32 whatever it is; an f16 run also saves its loss scale state). Written atomically (temp, fsync, rename,
 * fsync of the folder); loading checks every tensor's presence, dtype and shape.
 */
#ifndef DDPMD_CHECKPOINT_H
#define DDPMD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "exec.h"
#include "generate.h"
#include "graph.h"
#include "safetensors.h"
#include "spec.h"

#define CHECKPOINT_FORMAT "ddpmd-checkpoint"
#define CHECKPOINT_VERSION "1"

/* the EMA/optimizer parts saved with the weights */
enum checkpoint_parts { CHECKPOINT_WEIGHTS = 1, CHECKPOINT_EMA = 2, CHECKPOINT_OPTIM = 4,
                        CHECKPOINT_ALL = 7 };

/* a bound on the metadata's bytes (the spec's canonical JSON with its paths, the plan, ...) */
#define CHECKPOINT_META_BYTES ((int64_t)64 << 10)

/* writes the weights, EMA, AdamW moments and metadata of step atomically (fsio.h), each tensor
 * downloaded as its turn in the file comes; fails (the previous file at path untouched) when any
 * part, metadata included, cannot be stored. spec_json: spec's canonical JSON (spec_to_json),
 * printed once by a run that saves many; NULL: printed here */
int checkpoint_save(const char *path, struct exec *e, const struct graph *g,
                    const struct train_spec *spec, const char *spec_json, int64_t step,
                    char *err, size_t errlen);
/* the host bytes checkpoint_save holds for the model g (a job's host plan: TRAIN_HOST_CHECKPOINT):
 * the largest tensor's staging, the names and the header */
int64_t checkpoint_save_plan_bytes(const struct graph *g);
/* the host bytes reading a checkpoint of g's model whole holds (checkpoint_open, then
 * checkpoint_apply or checkpoint_load_generator): the file whole (file_bytes; < 0: the size
 * checkpoint_save writes for g), its parsed header and one tensor's staging */
int64_t checkpoint_read_plan_bytes(const struct graph *g, int64_t file_bytes);
/* ... and streamed (checkpoint_open_stream, then checkpoint_apply: a resume, init_from, `ddpmd
 * sample`): its header read and parsed and one tensor's staging, the file's data left on disk */
int64_t checkpoint_stream_plan_bytes(const struct graph *g);
/* whether spec can be stored in a checkpoint's metadata (checked before a run trains);
 * spec_json as checkpoint_save's */
int checkpoint_check_spec(const struct train_spec *spec, const char *spec_json, char *err,
                          size_t errlen);

/* opens and validates a checkpoint; spec and step from its metadata (either may be NULL). The
 * step must be digits only and at most the metadata spec's train.steps (INT_MAX without spec);
 * a missing step is 0 only when no spec is asked for (an imported state_dict). */
int checkpoint_open(struct safetensors **out, const char *path, struct train_spec *spec,
                    int64_t *step, char *err, size_t errlen);
/* checkpoint_open with only the header read: checkpoint_apply reads each tensor from the file as
 * its turn comes (safetensors_open_stream), so a resume holds one tensor, not the file */
int checkpoint_open_stream(struct safetensors **out, const char *path, struct train_spec *spec,
                           int64_t *step, char *err, size_t errlen);

/* whether st holds model's weights (and, when it has any "ema." tensor, its EMA weights) by
 * name, dtype and shape, without running anything; -1 with err naming the first tensor missing
 * or misshapen (an uploaded checkpoint checked before it is kept) */
int checkpoint_check_model(const struct safetensors *st, const struct unet_config *model,
                           char *err, size_t errlen);

/* uploads the checkpoint's parts into e. Every graph parameter must be present with its shape;
 * `parts` selects weights / EMA / AdamW moments. Asking for the moments (a resume) also asks for
 * the run's state: its precision must be g's (a checkpoint without one is f32), and an f16 run's
 * loss scale state is restored into e (exec_loss_scaler). from_ema loads the EMA weights as the weights
 * (sampling). A checkpoint without EMA or moments (an imported state_dict) is an error only when
 * those parts are asked for. */
int checkpoint_apply(const struct safetensors *st, struct exec *e, const struct graph *g,
                     int parts, int from_ema, char *err, size_t errlen);

/* a checkpoint's weights (its EMA weights when from_ema) into a generator of its model; -1 for a
 * view of a training job (generate_bind_nested), whose weights are the job's EMA */
int checkpoint_load_generator(struct generator *g, const struct safetensors *st, int from_ema,
                              char *err, size_t errlen);

#endif
