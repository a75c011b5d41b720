/* spec.h - the training spec: one JSON document describing a job, parsed and validated into the
 * engine's structs. Every error names its field path ("train.batch: must be >= 1"). The JSON
 * Schema of the same document is components/schemas/TrainSpec in openapi.yaml.
 */
#ifndef DDPMD_SPEC_H
#define DDPMD_SPEC_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "ddpm.h"
#include "exec.h"
#include "strategy.h"
#include "unet.h"

#define SPEC_MAX_ERRORS 16
#define SPEC_PATH_MAX 1024
/* limits shared with the CLI's options and openapi.yaml's TrainSpec */
#define SPEC_FILE_MAX (1 << 20)            /* bytes of a spec file */
#define SPEC_THREADS_MAX 256               /* train.threads (and every --threads) */
#define SPEC_BATCH_MAX 65535               /* train.batch */
#define SPEC_SEED_MAX 9007199254740991ull  /* train.seed: 2^53 - 1, exact in a JSON number */
#define SPEC_MAX_LIST_VALUE 1000000        /* block_out_channels and attention_resolutions entries */
#define SPEC_BUDGET_MAX ((int64_t)1 << 50) /* memory.vram_budget: 1 PiB */
/* bounds on the work a spec asks for, checked from its numbers alone before any graph is built
 * or planned (a 1024 px, 8-level spec at batch 65535 once held the planner 13 s and 3.2 GB):
 * the model's parameters (an estimate from the widths, within a few percent), one image's
 * activation at one level in f32, the tokens of one attention (its score matrix is their
 * square), and the host buffers of one batch (6 float copies of its images: train.c's loader
 * two batches ahead, x0, noise, x_t, target). The graph itself is small by construction: at most
 * 8 levels of at most 8 layers (a few thousand tensors). */
#define SPEC_PARAMS_MAX ((int64_t)1 << 32)
#define SPEC_LEVEL_BYTES_MAX ((int64_t)1 << 32)
#define SPEC_ATTN_TOKENS_MAX 16384         /* 128 x 128 pixels */
#define SPEC_BATCH_BYTES_MAX ((int64_t)64 << 30)
#define SPEC_FMNIST_IMAGES 60000           /* Fashion-MNIST's training split */

struct spec_errors {
    int syntax;                   /* the document is not JSON at all (or empty) */
    size_t syntax_at;             /* then: the byte where its parsing stopped */
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
    int threads;                  /* 0: none named - `ddpmd serve` gives the job the cores its
                                   * device has free when it first starts, `ddpmd train` the
                                   * machine's (spec_host_cores), or a resumed run its
                                   * checkpoint's count; a run records the count it used */

    /* output */
    int checkpoint_every, sample_every, log_every, keep_last, samples;
    char init_from[SPEC_PATH_MAX]; /* checkpoint to start from ("" = fresh weights) */

    /* memory: the device budget the job is fitted into and the strategy, each field forced or
     * AUTO (the planner's search resolves those: engine/planner.h) */
    int64_t vram_budget;          /* bytes; 0: no limit */
    struct strategy strategy;     /* micro_batch 0 = auto */
    int deterministic;            /* parity mode (a GPU: bit-identical runs, no TF32, only
                                   * deterministic algorithms; the CPU: direct convolutions, no
                                   * Winograd); 0: fast mode */

    /* not part of the spec (never parsed nor written): the backend the job is planned for and
     * runs on, from backend_load of its device (`--device`); NULL: the CPU */
    const struct backend *backend;
};

/* defaults for everything but the model and dataset */
void spec_defaults(struct train_spec *s);
/* parses and validates; on failure returns -1 with every error found (up to 16). Refused besides
 * bad values: unknown fields, duplicate keys, bytes after the object, \u0000 and raw control
 * characters in strings, invalid UTF-8, nesting deeper than 16. Messages echo at most 40 bytes
 * of the input, with bytes that are not printable UTF-8 as \xNN. */
int spec_parse(const char *json, struct train_spec *s, struct spec_errors *errs);
/* spec_parse of len bytes that may hold members beside the spec (a request body: POST /train's
 * "webhook"): the top-level members named in extra (NULL-terminated) are checked as every
 * string is, then taken out and handed back in *extras, an object of those present (NULL when
 * none; the caller deletes it, also on failure). errs->syntax says the body is not JSON at all. */
int spec_parse_request(const char *body, size_t len, const char *const *extra, cJSON **extras,
                       struct train_spec *s, struct spec_errors *errs);
/* the document rules every JSON body follows (spec_parse's, shared by POST /samples): len
 * bytes of one JSON object, nothing after it, no duplicate keys, no \u0000, raw control
 * characters or invalid UTF-8 in strings, nesting at most 16 deep. 0 with the tree in *root
 * (the caller deletes it), or -1 with errs filled (at most SPEC_MAX_ERRORS; errs->syntax when
 * the bytes are not JSON at all) and *root NULL. */
int spec_parse_object(const char *json, size_t len, cJSON **root, struct spec_errors *errs);
/* spec_parse of a regular file of at most SPEC_FILE_MAX bytes (a FIFO or directory is refused
 * without blocking); open and read errors carry strerror's reason */
int spec_load_file(const char *path, struct train_spec *s, struct spec_errors *errs);
/* The value checks spec_parse applies, on a filled struct (the CLI's options fill one): every
 * field's range by its path ("train.threads: must be in [1, 256], got 100000"), checked on the
 * value as stored (a float field as the 32-bit float training uses), enums, the model's shape
 * (unet_config_check, only once every field is in range) and the cross-field rules. data.dataset
 * may be empty (commands without data). Returns 0, or -1 with errs filled. */
int spec_validate(const struct train_spec *s, struct spec_errors *errs);
/* the host bytes a training run of s holds for its data: its dataset as held
 * (dataset_plan_bytes: Fashion-MNIST as its bytes, a folder as its samples or float), the
 * loader's ring and the step's batch buffers, the data-dependent parts of its host plan
 * (train_host_plan); images < 0: the dataset's count is looked up (fashion-mnist's, an upload's
 * dataset.json), and when it cannot be, only the batch buffers are counted */
int64_t spec_host_data_bytes(const struct train_spec *s, int64_t images);
/* whether that fits this host's memory (physical, or the cgroup's limit when lower): 0, or -1
 * with "the dataset and batch buffers need N bytes (...), more than this host's M bytes" in
 * why, the error of data.dataset. Checked before any planning by POST /train, `ddpmd train` and
 * `ddpmd plan`. */
int spec_host_check(const struct train_spec *s, char *why, size_t n);
/* this machine's cores (those this process may run on), in [1, SPEC_THREADS_MAX] */
int spec_host_cores(void);
/* the spec as canonical JSON (every field explicit; floats in their shortest form); caller frees
 * with free(). NULL when an allocation fails (never a document with a field missing). */
char *spec_to_json(const struct train_spec *s);
/* a size as the spec and the command lines write it: "8GiB", "512MiB", "1.5GiB", "100MB",
 * "4096" (digits, an optional fraction, a unit of B, KiB..TiB, KB..TB, K, M, G in any case:
 * "1gb", "512mib") -> bytes; -1 when s is none (signs, exponents, spaces and "inf" are refused) */
int spec_parse_size(const char *s, int64_t *bytes);
/* prints "path: message" lines */
void spec_errors_print(const struct spec_errors *errs, const char *prefix);

#endif
