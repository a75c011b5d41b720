/* classifier.h - a small CNN image classifier on the engine's static graph (Fashion-MNIST at
 * 1x32x32 by default), used to measure sample quality without an Inception network; and a
 * forward-only runner that turns images into class probabilities.
 */
#ifndef DDPMD_CLASSIFIER_H
#define DDPMD_CLASSIFIER_H

#include <stddef.h>

#include "backend.h"
#include "exec.h"
#include "graph.h"
#include "memplan.h"

enum classifier_status {
    CLASSIFIER_OK = 0,
    CLASSIFIER_ERR_CONFIG = 1, /* an invalid or unparsable configuration (message in err) */
    CLASSIFIER_ERR_GRAPH = 2,  /* the graph builder failed (g->err) */
    CLASSIFIER_ERR_NOMEM = 3,
    CLASSIFIER_ERR_EXEC = 4,   /* planning or a kernel failed */
    CLASSIFIER_ERR_ARG = 5,    /* NULL, unknown parameter name or wrong size */
};

#define CLASSIFIER_STAGES 3

/* Stage s (0..2): conv3x3 (pad 1, no bias) widths[s-1] -> widths[s], 2x2 max-pool,
 * GroupNorm(groups), GELU; then flatten, linear -> hidden, GELU, dropout, linear -> classes.
 * Parameter names: conv{1,2,3}.weight, norm{1,2,3}.{weight,bias}, fc1.{weight,bias},
 * fc2.{weight,bias}. */
struct classifier_config {
    int channels;                  /* input channels (1) */
    int image_size;                /* input side, a multiple of 8 (32) */
    int widths[CLASSIFIER_STAGES]; /* conv output channels (32, 64, 64) */
    int groups;                    /* GroupNorm groups, dividing every width (8) */
    int hidden;                    /* fc1 outputs (128) */
    int classes;                   /* fc2 outputs (10) */
    float dropout;                 /* before fc2, training only (0.25) */
};

struct classifier_io {
    int x;      /* input (N, channels, S, S), values in [-1, 1] */
    int logits; /* (N, classes) */
};

void classifier_config_default(struct classifier_config *c);
int classifier_config_check(const struct classifier_config *c, char *err, size_t errlen);
/* "channels=1 image_size=32 widths=32,64,64 groups=8 hidden=128 classes=10 dropout=0.25":
 * what classifier_config_parse reads back (stored in the weights file's metadata) */
int classifier_config_format(const struct classifier_config *c, char *buf, size_t len);
/* parses the format above; every key is required, unknown keys are errors */
int classifier_config_parse(struct classifier_config *c, const char *s, char *err,
                            size_t errlen);
/* a one-line human description of the layers */
int classifier_describe(const struct classifier_config *c, char *buf, size_t len);

/* Appends the classifier for a batch to g, with parameter init kinds and fan-ins set (for
 * init_param). The caller adds the loss (graph_xent against a (N, classes) target input). */
int classifier_build(struct graph *g, const struct classifier_config *c, int batch,
                     struct classifier_io *io);

/* ---- forward-only inference ---- */

struct classifier_runner {
    struct classifier_config cfg;
    int batch;
    struct graph g;
    struct classifier_io io;
    struct plan p;
    struct exec *e;
    float *logits; /* (batch, classes) host scratch */
};

int classifier_runner_init(struct classifier_runner *r, const struct classifier_config *c,
                           int batch, const struct backend *bk, int threads, char *err,
                           size_t errlen);
void classifier_runner_free(struct classifier_runner *r);
/* the weights of parameter `name` (numel floats, checked against the graph) */
int classifier_runner_set_param(struct classifier_runner *r, const char *name,
                                const float *data, size_t numel, char *err, size_t errlen);
/* class probabilities prob (n, classes) of images x (n, channels, S, S), in chunks of the
 * runner's batch (a partial last chunk is padded with zeros and dropped); the softmax of the
 * logits is taken on the host in double */
int classifier_runner_predict(struct classifier_runner *r, const float *x, int n, float *prob);

#endif
