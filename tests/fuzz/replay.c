/* replay.c - runs committed fuzz inputs through the harnesses in any build (ctest fuzz_replay):
 * every file under <root>/corpus/<target>/ and <root>/regressions/<target>/, so a fixed crash
 * stays fixed without libFuzzer. `fuzz_replay --list` prints "name max_len" per target (for
 * scripts/fuzz.sh); `fuzz_replay --run <target> FILE...` replays chosen files. */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const struct fuzz_target fuzz_targets[] = {
    {"spec", fuzz_spec, 16384},
    {"safetensors", fuzz_safetensors, 16384},
    {"checkpoint", fuzz_checkpoint, 16384},
    {"png", fuzz_png, 65536},
    {"idx", fuzz_idx, 16384},
    {"http", fuzz_http, 4096},
    {"archive", fuzz_archive, 65536},
    {NULL, NULL, 0},
};

static const struct fuzz_target *find_target(const char *name)
{
    for (const struct fuzz_target *t = fuzz_targets; t->name; t++)
        if (strcmp(t->name, name) == 0) return t;
    return NULL;
}

/* 0 ok (the harness returned), -1 the file could not be read */
static int replay_file(const struct fuzz_target *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long sz;
    int rc = -1;
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)sz + 1)) && fread(buf, 1, (size_t)sz, f) == (size_t)sz) {
        /* a harness only sees buf[0..sz): the copy keeps ASan's bounds exact */
        unsigned char *exact = malloc(sz ? (size_t)sz : 1);
        if (exact) {
            memcpy(exact, buf, (size_t)sz);
            t->fn(exact, (size_t)sz);
            free(exact);
            rc = 0;
        }
    } else {
        fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
    }
    free(buf);
    fclose(f);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* replays every regular file of dir in name order; *count += files; a missing dir is 0 files */
static int replay_dir(const struct fuzz_target *t, const char *dir, int *count)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    if (!d) return errno == ENOENT ? 0 : -1;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = -1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    if (names) qsort(names, (size_t)n, sizeof *names, name_cmp);
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (rc == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (replay_file(t, names[i])) rc = -1;
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (const struct fuzz_target *t = fuzz_targets; t->name; t++)
            printf("%s %zu\n", t->name, t->max_len);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "--run") == 0) {
        const struct fuzz_target *t = find_target(argv[2]);
        if (!t) {
            fprintf(stderr, "fuzz_replay: no target '%s'\n", argv[2]);
            return 2;
        }
        for (int i = 3; i < argc; i++)
            if (replay_file(t, argv[i])) return 1;
        printf("fuzz_replay: %d inputs of %s ran\n", argc - 3, t->name);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_replay ROOT | --list | --run TARGET FILE...\n"
                        "  ROOT: the tests/fuzz folder (corpus/<target>/, regressions/<target>/)\n");
        return 2;
    }
    int failed = 0;
    for (const struct fuzz_target *t = fuzz_targets; t->name; t++) {
        char dir[4096];
        int corpus = 0, regress = 0;
        snprintf(dir, sizeof dir, "%s/corpus/%s", argv[1], t->name);
        if (replay_dir(t, dir, &corpus)) failed = 1;
        snprintf(dir, sizeof dir, "%s/regressions/%s", argv[1], t->name);
        if (replay_dir(t, dir, &regress)) failed = 1;
        printf("fuzz_replay: %-12s %4d corpus + %3d regression inputs\n", t->name, corpus,
               regress);
        /* a target without a seed corpus is a setup error, not a pass */
        if (corpus == 0) {
            fprintf(stderr, "fuzz_replay: no corpus for %s under %s/corpus\n", t->name, argv[1]);
            failed = 1;
        }
    }
    return failed;
}
