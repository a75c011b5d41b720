/* test_backend_load.c - picking a backend by device name: "cpu" is the built-in one; "cuda" and
 * "cuda:N" either give a working CUDA backend (a machine with a GPU and the module) or fail with a
 * one-line reason - no crash, no hang (an alarm fails the test after 120 s); bad names fail.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_load.h"
#include "test_util.h"

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_backend_load: hung (no answer in 120 s)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(120);
    char err[512];
    const struct backend *bk = NULL;

    CHECK(backend_load("cpu", &bk, err, sizeof err) == BK_OK && bk == backend_cpu(),
          "cpu: %s", err);
    CHECK(bk && strcmp(bk->name, "cpu") == 0, "cpu backend is named %s", bk ? bk->name : "-");
    /* the CPU table has none of the optional device entries (ctx_set_workspace it has: its
     * bf16 linears' scratch; set_parity too: its fast mode's Winograd convolutions) */
    CHECK(bk && !bk->device_count && !bk->device_select && !bk->device_mem &&
              !bk->device_poisoned && bk->set_parity && !bk->philox_normal_fill &&
              !bk->philox_u32_fill,
          "the CPU table sets optional device entries");

    CHECK(backend_device_index("cuda") == 0, "cuda -> 0");
    CHECK(backend_device_index("cuda:3") == 3, "cuda:3 -> 3");
    CHECK(backend_device_index("cuda:") == -1, "cuda: -> -1");
    CHECK(backend_device_index("cuda:x") == -1, "cuda:x -> -1");
    CHECK(backend_device_index("cuda:1x") == -1, "cuda:1x -> -1");
    CHECK(backend_device_index("cudax") == -1, "cudax -> -1");
    CHECK(backend_device_index("cpu") == -1, "cpu -> -1");

    const char *bad[] = {"", "gpu", "tpu:0", "cuda:", "cuda:-1", "cuda:abc", "CPU"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bk = NULL;
        err[0] = '\0';
        int rc = backend_load(bad[i], &bk, err, sizeof err);
        CHECK(rc == BK_ERR_INVALID && !bk && err[0], "'%s': rc %d, err '%s'", bad[i], rc, err);
    }
    CHECK(backend_load(NULL, &bk, err, sizeof err) == BK_ERR_INVALID, "NULL device");

    /* a module path that does not exist: a clear message naming it */
    setenv("DDPMD_CUDA_MODULE", "/nonexistent/libddpmd_cuda.so", 1);
    bk = NULL;
    err[0] = '\0';
    int rc = backend_load("cuda", &bk, err, sizeof err);
    CHECK(rc == BK_ERR_DEVICE && !bk && strstr(err, "/nonexistent/libddpmd_cuda.so"),
          "missing module: rc %d, err '%s'", rc, err);
    printf("missing module: %s\n", err);
    unsetenv("DDPMD_CUDA_MODULE");

    /* cuda: works or says why (the module next to this test when the build has it) */
    bk = NULL;
    err[0] = '\0';
    rc = backend_load("cuda", &bk, err, sizeof err);
    if (rc == BK_OK) {
        CHECK(bk && strcmp(bk->name, "cuda") == 0 && bk->device_count, "cuda backend table");
        printf("cuda: loaded, %d device(s)\n", bk->device_count(NULL, 0));
    } else {
        CHECK(!bk && err[0] && strchr(err, '\n') == NULL, "cuda: rc %d, err '%s'", rc, err);
        printf("cuda: unavailable, as expected without a GPU: %s\n", err);
        char err2[512] = "";
        int rc2 = backend_load("cuda:0", &bk, err2, sizeof err2);
        CHECK(rc2 != BK_OK && !bk && err2[0], "cuda:0 after a failed cuda: rc %d '%s'", rc2, err2);
    }
    /* a device number far beyond any machine's */
    bk = NULL;
    err[0] = '\0';
    rc = backend_load("cuda:4000", &bk, err, sizeof err);
    CHECK(rc != BK_OK && !bk && err[0], "cuda:4000: rc %d, err '%s'", rc, err);
    printf("cuda:4000: %s\n", err);
    return tu_finish("test_backend_load");
}
