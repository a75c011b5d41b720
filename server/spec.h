/* spec.h - the training spec: one JSON document describing a job, parsed and validated into the
 * engine's structs. Every error names its field path ("train.batch: must be >= 1"). The JSON
 * Schema of the same document is components/schemas/TrainSpec in openapi.yaml.
 */
#ifndef DDPMD_SPEC_H
#define DDPMD_SPEC_H

#include <stdint.h>

#include "ddpm.h"
#include "exec.h"
#include "unet.h"

#define SPEC_MAX_ERRORS 16
#define SPEC_PATH_MAX 1024

struct spec_errors {
    int n;
    struct {
        char path[128];
        char msg[256];
    } e[SPEC_MAX_ERRORS];
};

enum spec_prediction { SPEC_PRED_EPSILON = 0, SPEC_PRED_V = 1 };

struct train_spec {
    struct unet_config model;

    /* data */
    char dataset[SPEC_PATH_MAX];  /* "fashion-mnist", or a folder of PNG images */
    int flip;                     /* random horizontal flip */
    int fmnist_resize;            /* 0: pad 28 -> 32 (or keep 28), 1: resize */
    int validation;               /* held-out images for the validation loss (0: none) */

    /* diffusion */
    int timesteps;
    enum ddpm_beta_schedule beta_schedule;
    double beta_start, beta_end;
    enum spec_prediction prediction;

    /* training */
    int batch;
    int steps;
    struct optim_config optim;    /* total_steps = steps */
    uint64_t seed;
    int threads;

    /* output */
    int checkpoint_every, sample_every, log_every, keep_last, samples;
    char init_from[SPEC_PATH_MAX]; /* checkpoint to start from ("" = fresh weights) */
};

/* defaults for everything but the model and dataset */
void spec_defaults(struct train_spec *s);
/* parses and validates; on failure returns -1 with every error found (up to 16) */
int spec_parse(const char *json, struct train_spec *s, struct spec_errors *errs);
int spec_load_file(const char *path, struct train_spec *s, struct spec_errors *errs);
/* the spec as canonical JSON (every field explicit); caller frees with free() */
char *spec_to_json(const struct train_spec *s);
/* prints "path: message" lines */
void spec_errors_print(const struct spec_errors *errs, const char *prefix);

#endif
