/* export.h - a ddpm-preset checkpoint as a diffusers DDPMPipeline folder: model_index.json,
 * scheduler/scheduler_config.json (DDPMScheduler: the job's betas, timesteps, prediction type,
 * x0 clipping) and unet/ with UNet2DModel's config.json and diffusion_pytorch_model.safetensors
 * (EMA weights, or the raw ones) under diffusers' names (which are the preset's own), so
 * DDPMPipeline.from_pretrained(DIR) loads it. `ddpmd export --diffusers` writes the folder;
 * GET /checkpoints/{id}?format=diffusers sends the same files as a tar built once per
 * checkpoint and cached beside it (export_cache_open).
 */
#ifndef DDPMD_EXPORT_H
#define DDPMD_EXPORT_H

#include <stddef.h>

#define EXPORT_INDEX "model_index.json"
#define EXPORT_SCHEDULER "scheduler/scheduler_config.json"
#define EXPORT_CONFIG "unet/config.json"
#define EXPORT_WEIGHTS "unet/diffusion_pytorch_model.safetensors"
/* the cache of CKPT ("DIR/step-N.safetensors") is "DIR/step-N" EXPORT_CACHE_SUFFIX */
#define EXPORT_CACHE_SUFFIX ".diffusers.tar"
/* tar builds at once: per owner, and in all (each holds a checkpoint in memory while it runs) */
#define EXPORT_BUILDS_PER_OWNER 1
#define EXPORT_BUILDS_MAX 2

enum export_status {
    EXPORT_OK = 0,
    EXPORT_FAILED = -1,      /* err says why */
    EXPORT_UNSUPPORTED = -2, /* not the ddpm preset: no diffusers equivalent */
    EXPORT_BUSY = -3,        /* the owner's (or the server's) builds are all running: retry */
};

/* writes the pipeline folder dir (made, with its subfolders; each file atomic); 0, or
 * EXPORT_UNSUPPORTED / EXPORT_FAILED with the reason */
int export_diffusers(const char *ckpt, const char *dir, int raw, char *err, size_t errlen);

/* An open descriptor of the tar of ckpt's export (EMA weights), *size its bytes: the cached
 * file when there is one, else built now (in a temporary folder beside ckpt, written to a
 * temporary name, fsynced and renamed: readers never see a partial tar) - at most
 * EXPORT_BUILDS_PER_OWNER builds of owner's at once and EXPORT_BUILDS_MAX in all, else
 * EXPORT_BUSY. A cache whose checkpoint was removed meanwhile is removed again. The reader owns
 * the descriptor; the file it reads is shared and never rewritten. */
int export_cache_open(const char *ckpt, const char *owner, int *fd_out, long long *size,
                      char *err, size_t errlen);
/* removes ckpt's cached tar (with the checkpoint: train.c's pruning); call after unlinking ckpt */
void export_cache_remove(const char *ckpt);
/* A job's folder about to be removed (DELETE /jobs/{id}), so no tar writer works in it
 * meanwhile: 0 when no export of a checkpoint under dir (a folder, "/"-terminated) is being
 * built, and none starts until export_release_dir(dir) (export_cache_open: EXPORT_BUSY);
 * EXPORT_BUSY while one is built, or when EXPORT_HOLDS_MAX folders are held already */
#define EXPORT_HOLDS_MAX 16
int export_hold_dir(const char *dir);
void export_release_dir(const char *dir);
/* ckpt's cache path into out; -1 when ckpt does not end in ".safetensors" or out is too short */
int export_cache_path(const char *ckpt, char *out, size_t n);

#endif
