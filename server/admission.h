/* admission.h - a job planned on the pool's devices before it is queued: on each device the
 * training job's strategy search (train_search, what its child runs) or the sampling job's plan
 * (generate_plan, what `ddpmd sample` allocates) against what the device's budget leaves after
 * its process baseline and, on the cpu, the job's data; the reservation that makes there
 * (struct pool_fit) and the plan entry the job's row shows; then which device the job is shown
 * with, or why it never fits. The pool calls it (pool.c); it holds no state.
 */
#ifndef DDPMD_ADMISSION_H
#define DDPMD_ADMISSION_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "cost.h"
#include "pool.h"
#include "spec.h"

/* A training job on dev: the search against the bytes the budget leaves, capped by
 * memory.vram_budget (f->vram_budget, the child's), its strategy in f; steps predicted under m
 * and the device's probe scale, on the cpu at threads (the spec's train.threads, or the cores a
 * job naming none starts with). *entry gets the plan entry (strategy, bytes by part, the
 * candidates planned; the caller owns it). POOL_ERR_PLAN when the spec cannot be planned at all
 * (err says why). */
int admission_fit_train(const struct pool_device_config *dev, const struct cost_model *m,
                        const struct train_spec *spec, int threads, struct pool_fit *f,
                        cJSON **entry, char *err, size_t errlen);
/* a sampling job on dev: its inference plan and reservation, *entry as above */
int admission_fit_sample(const struct pool_device_config *dev, const struct cost_model *m,
                         const struct pool_sample *s, struct pool_fit *f, cJSON **entry,
                         char *err, size_t errlen);
/* The job's fits on every device (adm->fit, entries[d] each one's entry: taken into adm->plans)
 * decide where it is shown (adm->first): the first fitting device not poisoned (poisoned[d]).
 * POOL_ERR_NEVER_FITS when no device's budget holds any of its plans (err names each device's
 * bytes and smallest plan), POOL_ERR_POISONED when only poisoned ones would. */
int admission_decide(struct pool_admission *adm, cJSON **entries, const int *poisoned,
                     char *err, size_t errlen);

#endif
