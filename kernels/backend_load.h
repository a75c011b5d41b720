/* backend_load.h - picks a backend by device name: "cpu" is built in; "cuda" and "cuda:N" load
 * the CUDA backend module (libddpmd_cuda.so) with dlopen, only when asked, so one ddpmd binary
 * runs on hosts with no CUDA libraries at all.
 */
#ifndef DDPMD_BACKEND_LOAD_H
#define DDPMD_BACKEND_LOAD_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the module's file name and its one exported function */
#define BACKEND_CUDA_MODULE "libddpmd_cuda.so"
#define BACKEND_CUDA_SYMBOL "ddpmd_backend_cuda"

/* device: "cpu", "cuda" (device 0) or "cuda:N". On success *out is the backend, and for CUDA
 * device N is selected (warmed up and measured; later ctx_init calls run there). On failure a
 * BK_ERR_* status and one line in err saying why: an unknown name, the module or a library it
 * needs missing, no driver, no GPU, no device N.
 * The module is looked for in $DDPMD_CUDA_MODULE (a path) if set, else next to the executable,
 * else on the default library search path. It stays loaded once loaded. */
int backend_load(const char *device, const struct backend **out, char *err, size_t errlen);

/* bk, or the CPU backend when bk is NULL (a job that named no device runs on the CPU) */
const struct backend *backend_or_cpu(const struct backend *bk);

/* the device index of a "cuda" / "cuda:N" name (0 for "cuda"), -1 for anything else */
int backend_device_index(const char *device);

#ifdef __cplusplus
}
#endif
#endif
