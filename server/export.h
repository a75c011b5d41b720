/* export.h - a ddpm-preset checkpoint as diffusers' UNet2DModel: config.json and
 * diffusion_pytorch_model.safetensors (EMA weights, or the raw ones), under diffusers' names
 * (which are the preset's own). `ddpmd export --diffusers` and GET /checkpoints/{id}?format=
 * diffusers are this one code.
 */
#ifndef DDPMD_EXPORT_H
#define DDPMD_EXPORT_H

#include <stddef.h>

#define EXPORT_CONFIG "config.json"
#define EXPORT_WEIGHTS "diffusion_pytorch_model.safetensors"

/* writes dir/config.json and dir/diffusion_pytorch_model.safetensors (each atomic), creating
 * dir; 0, or -1 with the reason */
int export_diffusers(const char *ckpt, const char *dir, int raw, char *err, size_t errlen);
/* the same two files as a tar (pax): built in a temporary folder under tmp_dir, which is removed
 * again; *fd_out is the open tar (no name left on disk), to read from its start. 0 or -1 */
int export_diffusers_tar(const char *ckpt, const char *tmp_dir, int raw, int *fd_out,
                         char *err, size_t errlen);

#endif
