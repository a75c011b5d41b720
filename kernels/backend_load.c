/* backend_load.c - "cpu" -> the built-in CPU backend; "cuda[:N]" -> dlopen libddpmd_cuda.so (from
 * $DDPMD_CUDA_MODULE, next to the executable, or the library search path), look up its one
 * export, check that a GPU is there and select device N. Every failure is one line in err.
 */
#include "backend_load.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static void *cuda_module;                  /* never closed: CUDA libraries dislike dlclose */
static const struct backend *cuda_backend;

static void set_err(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err && errlen) snprintf(err, errlen, fmt, a, b);
}

const struct backend *backend_or_cpu(const struct backend *bk) { return bk ? bk : backend_cpu(); }

int backend_device_index(const char *device)
{
    if (!device || strncmp(device, "cuda", 4) != 0) return -1;
    const char *p = device + 4;
    if (*p == '\0') return 0;
    if (*p != ':' || p[1] < '0' || p[1] > '9') return -1;
    char *end;
    long n = strtol(p + 1, &end, 10);
    if (*end || n < 0 || n > 4095) return -1;
    return (int)n;
}

/* dlopen of the module: the first place that has it; err keeps the most telling failure */
static void *open_module(char *err, size_t errlen)
{
    char path[PATH_MAX + 64];
    const char *env = getenv("DDPMD_CUDA_MODULE");
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) set_err(err, errlen, "cannot load the CUDA backend module %s: %s", env, dlerror());
        return h;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char first_err[512] = "";
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/%s", exe, BACKEND_CUDA_MODULE);
            if (access(path, F_OK) == 0) {
                void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                if (h) return h;
                /* it is there but does not load: a library it needs is missing */
                snprintf(first_err, sizeof first_err, "%s", dlerror());
            }
        }
    }
    void *h = dlopen(BACKEND_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    if (first_err[0])
        set_err(err, errlen, "cannot load the CUDA backend module: %s%s", first_err,
                " (are the CUDA 13 runtime, cuBLAS and cuDNN 9 libraries installed?)");
    else
        set_err(err, errlen, "cannot load the CUDA backend module: %s%s", dlerror(),
                " (this build has no CUDA backend, or it is not next to the executable)");
    return NULL;
}

int backend_load(const char *device, const struct backend **out, char *err, size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    if (!device || !out) {
        set_err(err, errlen, "%s%s", "no device given", "");
        return BK_ERR_INVALID;
    }
    if (strcmp(device, "cpu") == 0) {
        *out = backend_cpu();
        return BK_OK;
    }
    int index = backend_device_index(device);
    if (index < 0) {
        set_err(err, errlen, "unknown device '%s'%s", device,
                " (expected cpu, cuda or cuda:N)");
        return BK_ERR_INVALID;
    }
    pthread_mutex_lock(&load_lock);
    if (!cuda_backend) {
        if (!cuda_module) cuda_module = open_module(err, errlen);
        if (cuda_module) {
            typedef const struct backend *(*entry_fn)(void);
            entry_fn fn;
            void *sym = dlsym(cuda_module, BACKEND_CUDA_SYMBOL);
            memcpy(&fn, &sym, sizeof fn); /* ISO C has no object-to-function pointer cast */
            if (!sym)
                set_err(err, errlen, "the CUDA backend module has no %s: %s", BACKEND_CUDA_SYMBOL,
                        dlerror());
            else
                cuda_backend = fn();
        }
    }
    const struct backend *bk = cuda_backend;
    pthread_mutex_unlock(&load_lock);
    if (!bk) return BK_ERR_DEVICE;
    if (!backend_supports(bk, BK_OP_device_count, BK_DTYPE_F32) ||
        !backend_supports(bk, BK_OP_device_select, BK_DTYPE_F32)) {
        set_err(err, errlen, "%s%s", "the CUDA backend module is too old (no device_count)", "");
        return BK_ERR_DEVICE;
    }
    char why[256] = "";
    int count = bk->device_count(why, sizeof why);
    if (count <= 0) {
        set_err(err, errlen, "%s: %s", device, why[0] ? why : "no CUDA device");
        return BK_ERR_DEVICE;
    }
    if (index >= count) {
        char have[32];
        snprintf(have, sizeof have, "%d", count);
        set_err(err, errlen, "no such CUDA device: %s (this machine has %s)", device, have);
        return BK_ERR_INVALID;
    }
    int rc = bk->device_select(index, why, sizeof why);
    if (rc) {
        set_err(err, errlen, "%s: %s", device, why);
        return rc;
    }
    *out = bk;
    return BK_OK;
}
