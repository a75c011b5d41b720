/* test_faults_disk.c - a real full disk: a 256 KiB tmpfs is filled up, then the checkpoint, PNG
 * and loss.csv writers (checkpoint_save, image_save_png, fsio_write_atomic_text) must fail with
 * "No space left on device" naming the file, keep the previous file byte for byte, leave no
 * temporary behind, and succeed again once space is freed. Needs mount(2) (root, as in CI):
 * exits 77 (ctest skip) when the tmpfs cannot be mounted.
 */
#define _GNU_SOURCE /* umount2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "exec.h"
#include "fsio.h"
#include "graph.h"
#include "image.h"
#include "memplan.h"
#include "spec.h"
#include "test_util.h"

static char g_mnt[64];

static int count_entries(const char *dir, char *list, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    list[0] = '\0';
    if (!d) return -1;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        n++;
        size_t l = strlen(list);
        snprintf(list + l, len - l, "%s%s", l ? " " : "", de->d_name);
    }
    closedir(d);
    return n;
}

/* fills the file system holding path until write(2) says ENOSPC; returns the errno seen */
static int fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    static char block[4096];
    int e = 0;
    if (fd < 0) return errno;
    for (;;) {
        if (write(fd, block, sizeof block) < 0) {
            e = errno;
            break;
        }
    }
    /* the last page may still have room: fill it byte by byte */
    while (e == ENOSPC && write(fd, block, 1) == 1) {}
    close(fd);
    return e;
}

struct tiny {
    struct graph g;
    struct plan p;
    struct exec *e;
    struct train_spec spec;
};

static int tiny_init(struct tiny *t)
{
    struct spec_errors E;
    memset(t, 0, sizeof *t);
    if (spec_load_file("examples/fmnist-tiny.json", &t->spec, &E)) return -1;
    t->spec.threads = 1;
    graph_init(&t->g);
    int xd[2] = {2, 64}, wd[2] = {64, 64}, bd[1] = {64}, yd[2] = {2, 64};
    int x = graph_input(&t->g, "x", 2, xd);
    int w = graph_param(&t->g, "fc.weight", 2, wd);
    int b = graph_param(&t->g, "fc.bias", 1, bd);
    int target = graph_input(&t->g, "target", 2, yd);
    int loss = graph_mse(&t->g, graph_linear(&t->g, x, w, b), target);
    if (loss < 0 || graph_backward(&t->g, loss)) return -1;
    if (plan_make(&t->p, &t->g, backend_cpu(), NULL)) return -1;
    return exec_init(&t->e, &t->g, &t->p, backend_cpu(), &(struct exec_opts){.threads = 1});
}

static float g_img[3 * 64 * 64];

/* writer k (0 checkpoint, 1 PNG, 2 loss.csv) of version v (1 or 2) to path */
static int save(struct tiny *t, int k, int v, const char *path, char *err, size_t errlen)
{
    char text[256];
    switch (k) {
    case 0: return checkpoint_save(path, t->e, &t->g, &t->spec, NULL, v, err, errlen);
    case 1:
        for (size_t i = 0; i < sizeof g_img / sizeof *g_img; i++)
            g_img[i] = (float)((i * (7 + v)) % 255) / 127.5f - 1.0f;
        return image_save_png(path, g_img, 3, 64, 64, err, errlen) == IMAGE_OK ? 0 : -1;
    default:
        snprintf(text, sizeof text, "step,loss\n");
        for (int s = 1; s <= 4 * v; s++)
            snprintf(text + strlen(text), sizeof text - strlen(text), "%d,0.%d\n", s, s);
        return fsio_write_atomic_text(path, text, err, errlen);
    }
}

int main(void)
{
    static const char *names[] = {"step-00000001.safetensors", "sample.png", "loss.csv"};
    struct tiny t;
    char err[1024], list[2048], path[3][256], filler[256];
    snprintf(g_mnt, sizeof g_mnt, "/tmp/ddpmd_disk_XXXXXX");
    if (!mkdtemp(g_mnt)) {
        perror("mkdtemp");
        return 1;
    }
    if (mount("tmpfs", g_mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=256k,mode=0700") != 0) {
        printf("test_faults_disk: cannot mount a tmpfs on %s (%s): skipped\n", g_mnt,
               strerror(errno));
        rmdir(g_mnt);
        return 77;
    }
    if (tiny_init(&t)) {
        CHECK(0, "tiny model (needs examples/fmnist-tiny.json in the working directory)");
        goto out;
    }
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s", g_mnt, names[k]);
        CHECK(save(&t, k, 1, path[k], err, sizeof err) == 0, "%s: first save: %s", names[k], err);
    }
    snprintf(filler, sizeof filler, "%s/filler", g_mnt);
    CHECK(fill_disk(filler) == ENOSPC, "the tmpfs fills up");
    for (int k = 0; k < 3; k++) {
        size_t n1, n2;
        unsigned char *before = tu_slurp(path[k], &n1);
        err[0] = '\0';
        int rc = save(&t, k, 2, path[k], err, sizeof err);
        unsigned char *after = tu_slurp(path[k], &n2);
        printf("  %-26s on a full disk: %s\n", names[k], err);
        CHECK(rc != 0, "%s: a save on a full disk reported success", names[k]);
        CHECK(strstr(err, strerror(ENOSPC)) && strstr(err, names[k]),
              "%s: the error names neither the file nor ENOSPC: '%s'", names[k], err);
        CHECK(before && after && n1 == n2 && !memcmp(before, after, n1),
              "%s: the previous file changed", names[k]);
        free(before);
        free(after);
        CHECK(count_entries(g_mnt, list, sizeof list) == 4, "%s: leftovers: %s", names[k], list);
    }
    /* space again: every writer succeeds and replaces the file */
    CHECK(unlink(filler) == 0, "remove filler");
    for (int k = 0; k < 3; k++) {
        size_t n1;
        unsigned char *before = tu_slurp(path[k], &n1);
        CHECK(save(&t, k, 2, path[k], err, sizeof err) == 0, "%s: save after freeing: %s",
              names[k], err);
        size_t n2;
        unsigned char *after = tu_slurp(path[k], &n2);
        CHECK(after && (n1 != n2 || memcmp(before, after, n1)), "%s: not replaced", names[k]);
        free(before);
        free(after);
    }
    CHECK(count_entries(g_mnt, list, sizeof list) == 3, "final entries: %s", list);
    exec_free(t.e);
    plan_free(&t.p);
    graph_free(&t.g);
out:
    if (umount2(g_mnt, MNT_DETACH) != 0) perror("umount");
    rmdir(g_mnt);
    return tu_finish("test_faults_disk");
}
