/* plan.h - the memory plan: every byte a training step touches, decided before any is allocated.
 * One allocation per job: [params | grads | adam m | adam v | ema | inputs | workspace | arena].
 * Arena tensors are placed by best-fit over their lifetimes in execution order, with in-place
 * reuse where an op allows it. plan.total_bytes IS the job's reservation.
 */
#ifndef DDPMD_PLAN_H
#define DDPMD_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "graph.h"

#define PLAN_ALIGN 64

/* x rounded up to PLAN_ALIGN */
static inline size_t plan_align(size_t x) { return (x + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

struct plan_opts {
    int no_reuse;        /* every arena storage gets its own bytes (the honesty reference) */
    size_t guard_bytes;  /* canary gap after every arena storage (checked by the executor) */
};

/* a storage: one or more arena tensors sharing bytes through in-place ops */
struct plan_storage {
    int64_t offset;      /* in the job's allocation */
    size_t bytes;
    int first, last;     /* op indices of its lifetime, inclusive */
};

struct plan {
    int n_tensors;
    int64_t *offset;     /* per tensor: byte offset in the allocation; -1 if never touched */
    int *storage;        /* per arena tensor: storage index; -1 otherwise */
    int *first, *last;   /* per arena tensor: lifetime */
    struct plan_storage *st;
    int n_storages;

    /* the parts, as byte ranges of the allocation */
    size_t params_off, params_bytes;  /* parameters, each 64-byte aligned, padding zeroed */
    size_t grads_off;                 /* same layout as params */
    size_t adam_m_off, adam_v_off;    /* same layout as params */
    size_t ema_off;                   /* same layout as params */
    size_t inputs_off, inputs_bytes;
    size_t ws_off, ws_bytes;          /* library scratch: the largest any op needs */
    size_t arena_off, arena_bytes;    /* activations, statistics, activation gradients */
    size_t guards_bytes;              /* of arena_bytes, bytes that are canary gaps */
    size_t total_bytes;
    size_t no_reuse_arena_bytes;      /* the arena without any reuse, for comparison */
};

enum plan_status { PLAN_OK = 0, PLAN_ERR_NOMEM = 1, PLAN_ERR_GRAPH = 2 };

int plan_make(struct plan *p, const struct graph *g, const struct backend *bk,
              const struct plan_opts *opts);
void plan_free(struct plan *p);
/* a human-readable summary of the parts (one line each) */
void plan_print(const struct plan *p, FILE *f);

#endif
