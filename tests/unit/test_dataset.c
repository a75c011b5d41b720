/* test_dataset.c - PNG decoding of every colour type and depth against known values, corrupt files,
 * resize/crop/channel arithmetic, PNG and grid saving, IDX+gzip loading (synthetic and the real
 * Fashion-MNIST test split when installed), the seeded split and order, flips, and the prefetcher.
 */
#define _POSIX_C_SOURCE 200809L

#include "dataset.h"
#include "dataset_images.h"
#include "image.h"
#include "philox.h"
#include "test_util.h"

#include <dirent.h>
#include <png.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[64];

static const char *in_dir(const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static int write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* remove dir and everything up to two levels under it */
static void rm_rf(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[1024];
    struct stat sb;
    if (!d) return;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode) && depth < 3) rm_rf(p, depth + 1);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int count_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d) return -1;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* ---- writing test PNGs with libpng ---- */

struct png_spec {
    int w, h, depth, ctype, interlace;
    const unsigned *samples; /* (H,W,channels) raw sample values (palette: indices) */
    const png_color *pal;
    int npal;
    const png_byte *trns; /* palette alpha */
    int ntrns;
    const png_color_16 *key; /* grey/RGB tRNS colour key */
};

static int png_channels_of(int ctype)
{
    switch (ctype) {
    case PNG_COLOR_TYPE_GRAY: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA: return 4;
    default: return 1; /* palette index */
    }
}

static void quiet_warn(png_structp p, png_const_charp m) { (void)p; (void)m; }

/* Everything changed after setjmp lives behind the pointer (see image.c). */
struct tw {
    FILE *f;
    png_structp png;
    png_infop info;
    unsigned char *buf;
    png_bytep *rows;
};

/* rows of one sample per byte (two, big-endian, at depth 16) from s->samples */
static void tw_fill(struct tw *t, const struct png_spec *s)
{
    int ch = png_channels_of(s->ctype), bps = s->depth == 16 ? 2 : 1;
    for (int y = 0; y < s->h; y++) {
        t->rows[y] = t->buf + (size_t)y * s->w * ch * bps;
        for (int i = 0; i < s->w * ch; i++) {
            unsigned v = s->samples[(size_t)y * s->w * ch + i];
            if (bps == 2) {
                t->rows[y][2 * i] = (unsigned char)(v >> 8);
                t->rows[y][2 * i + 1] = (unsigned char)v;
            } else {
                t->rows[y][i] = (unsigned char)v;
            }
        }
    }
}

static int tw_run(struct tw *t, const struct png_spec *s)
{
    if (setjmp(png_jmpbuf(t->png))) return 0;
    png_init_io(t->png, t->f);
    png_set_IHDR(t->png, t->info, (png_uint_32)s->w, (png_uint_32)s->h, s->depth, s->ctype,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->pal) png_set_PLTE(t->png, t->info, s->pal, s->npal);
    if (s->trns || s->key)
        png_set_tRNS(t->png, t->info, s->trns, s->ntrns, (png_color_16p)s->key);
    png_write_info(t->png, t->info);
    if (s->depth < 8) png_set_packing(t->png); /* rows hold one sample per byte */
    png_write_image(t->png, t->rows); /* runs the Adam7 passes itself when interlaced */
    png_write_end(t->png, NULL);
    return 1;
}

static int write_png(const char *path, const struct png_spec *s)
{
    struct tw t = {0};
    int ok = 0, ch = png_channels_of(s->ctype);
    t.f = fopen(path, "wb");
    t.buf = malloc((size_t)s->h * s->w * ch * 2);
    t.rows = malloc((size_t)s->h * sizeof *t.rows);
    t.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, quiet_warn);
    if (t.png) t.info = png_create_info_struct(t.png);
    if (t.f && t.buf && t.rows && t.png && t.info) {
        tw_fill(&t, s);
        ok = tw_run(&t, s);
    }
    if (t.png) png_destroy_write_struct(&t.png, t.info ? &t.info : NULL);
    if (t.f && fclose(t.f) != 0) ok = 0;
    free(t.buf);
    free(t.rows);
    return ok;
}

/* a deterministic sample in 0..maxv for (x, y, channel) */
static unsigned pat(int x, int y, int c, unsigned maxv)
{
    uint64_t v = (uint64_t)x * 2654435761u + (uint64_t)y * 40503u + (uint64_t)c * 977u + 11u;
    v ^= v >> 7;
    return (unsigned)(v % ((uint64_t)maxv + 1));
}

/* Write a grey/GA/RGB/RGBA image of the given depth, decode it, compare every value exactly. */
static void check_plain(const char *name, int ctype, int depth, int w, int h, int interlace)
{
    int ch = png_channels_of(ctype);
    unsigned maxv = (1u << depth) - 1;
    unsigned *smp = malloc((size_t)w * h * ch * sizeof *smp);
    struct png_spec s = {w, h, depth, ctype, interlace, smp, NULL, 0, NULL, 0, NULL};
    struct image img = {0};
    char err[512];
    int bad = 0, first_bad = -1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) smp[((size_t)y * w + x) * ch + c] = pat(x, y, c, maxv);
    /* make sure the extremes appear */
    smp[0] = 0;
    smp[(size_t)w * h * ch - 1] = maxv;
    CHECK(write_png(in_dir(name), &s), "%s: test PNG not written", name);
    enum image_status rc = image_load_png(in_dir(name), &img, err, sizeof err);
    CHECK(rc == IMAGE_OK, "%s: load failed: %s", name, err);
    if (rc == IMAGE_OK) {
        CHECK(img.c == ch && img.w == w && img.h == h, "%s: got %dx%dx%d", name, img.c, img.h,
              img.w);
        for (int y = 0; y < h && img.c == ch; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < ch; c++) {
                    unsigned v = smp[((size_t)y * w + x) * ch + c];
                    float want;
                    if (depth == 16) want = (float)v / 65535.0f;
                    else want = (float)(v * (255u / maxv)) / 255.0f; /* bit replication */
                    float got = img.data[((size_t)c * h + y) * w + x];
                    if (got != want) {
                        bad++;
                        if (first_bad < 0) first_bad = (y * w + x) * ch + c;
                    }
                }
        CHECK(bad == 0, "%s: %d values differ (first at sample %d)", name, bad, first_bad);
    }
    image_free(&img);
    free(smp);
}

static void test_decode_all_types(void)
{
    check_plain("g1.png", PNG_COLOR_TYPE_GRAY, 1, 11, 3, 0);
    check_plain("g2.png", PNG_COLOR_TYPE_GRAY, 2, 7, 3, 0);
    check_plain("g4.png", PNG_COLOR_TYPE_GRAY, 4, 5, 4, 0);
    check_plain("g8.png", PNG_COLOR_TYPE_GRAY, 8, 6, 5, 0);
    check_plain("g16.png", PNG_COLOR_TYPE_GRAY, 16, 6, 5, 0);
    check_plain("ga8.png", PNG_COLOR_TYPE_GRAY_ALPHA, 8, 5, 3, 0);
    check_plain("ga16.png", PNG_COLOR_TYPE_GRAY_ALPHA, 16, 5, 3, 0);
    check_plain("rgb8.png", PNG_COLOR_TYPE_RGB, 8, 5, 4, 0);
    check_plain("rgb16.png", PNG_COLOR_TYPE_RGB, 16, 5, 4, 0);
    check_plain("rgba8.png", PNG_COLOR_TYPE_RGB_ALPHA, 8, 4, 3, 0);
    check_plain("rgba16.png", PNG_COLOR_TYPE_RGB_ALPHA, 16, 4, 3, 0);
    /* Adam7 needs more than 8x8 to use all seven passes */
    check_plain("rgb8_i.png", PNG_COLOR_TYPE_RGB, 8, 13, 11, 1);
    check_plain("g1_i.png", PNG_COLOR_TYPE_GRAY, 1, 17, 9, 1);
    check_plain("rgba16_i.png", PNG_COLOR_TYPE_RGB_ALPHA, 16, 10, 10, 1);

    /* palettes: 8-bit indices without tRNS, 4-bit indices with a partial tRNS */
    static const png_color pal[5] = {{255, 0, 0}, {0, 128, 255}, {10, 20, 30}, {0, 0, 0},
                                     {255, 255, 255}};
    static const png_byte trns[3] = {0, 100, 255}; /* entries 3, 4: opaque */
    for (int with_trns = 0; with_trns < 2; with_trns++) {
        const char *name = with_trns ? "pal4_trns.png" : "pal8.png";
        int w = 7, h = 3;
        unsigned idx[21];
        struct image img = {0};
        char err[512];
        int bad = 0;
        for (int i = 0; i < w * h; i++) idx[i] = pat(i, 1, 0, 4);
        idx[0] = 0;
        idx[1] = 4;
        struct png_spec s = {w, h, with_trns ? 4 : 8, PNG_COLOR_TYPE_PALETTE, 0, idx, pal, 5,
                             with_trns ? trns : NULL, with_trns ? 3 : 0, NULL};
        CHECK(write_png(in_dir(name), &s), "%s not written", name);
        CHECK(image_load_png(in_dir(name), &img, err, sizeof err) == IMAGE_OK, "%s: %s", name,
              err);
        CHECK(img.c == (with_trns ? 4 : 3) && img.w == w && img.h == h, "%s: shape %dx%dx%d",
              name, img.c, img.h, img.w);
        if (img.c == (with_trns ? 4 : 3)) {
            for (int i = 0; i < w * h; i++) {
                const png_color *p = &pal[idx[i]];
                float want[4] = {p->red / 255.0f, p->green / 255.0f, p->blue / 255.0f,
                                 (idx[i] < 3 ? trns[idx[i]] : 255) / 255.0f};
                for (int c = 0; c < img.c; c++)
                    if (img.data[(size_t)c * w * h + i] != want[c]) bad++;
            }
            CHECK(bad == 0, "%s: %d values differ", name, bad);
        }
        image_free(&img);
    }

    /* a grey colour key becomes an alpha channel: 0 where the key matches */
    {
        unsigned g[6] = {0, 7, 200, 7, 255, 1};
        png_color_16 key = {0, 0, 0, 0, 7};
        struct png_spec s = {3, 2, 8, PNG_COLOR_TYPE_GRAY, 0, g, NULL, 0, NULL, 0, &key};
        struct image img = {0};
        char err[512];
        CHECK(write_png(in_dir("gkey.png"), &s), "gkey not written");
        CHECK(image_load_png(in_dir("gkey.png"), &img, err, sizeof err) == IMAGE_OK, "%s", err);
        CHECK(img.c == 2, "grey + tRNS key: %d channels, want 2", img.c);
        if (img.c == 2) {
            CHECK(img.data[6 + 1] == 0.0f && img.data[6 + 3] == 0.0f && img.data[6 + 0] == 1.0f,
                  "key alpha wrong");
            CHECK(img.data[2] == 200 / 255.0f, "key grey value wrong");
        }
        image_free(&img);
    }
}

/* every prefix, every header byte flipped, and random corruptions of the PNG s: an error or an
 * image, never a crash (the ASan build runs this too). Returns the file's bytes (malloc'd). */
static unsigned char *corrupt_loop(const char *tag, const struct png_spec *s, size_t *np)
{
    struct image img = {0};
    char err[512];
    size_t n = 0;
    unsigned char *b, *c;
    int failures = 0, ok_prefix = 0, bad = 0;

    *np = 0;
    CHECK(write_png(in_dir("whole.png"), s), "%s: whole.png not written", tag);
    b = tu_slurp(in_dir("whole.png"), &n);
    CHECK(b && n > 60, "%s: cannot read back whole.png", tag);
    if (!b || n <= 60) {
        free(b);
        return NULL;
    }
    for (size_t len = 0; len < n; len++) {
        write_bytes(in_dir("prefix.png"), b, len);
        enum image_status rc = image_load_png(in_dir("prefix.png"), &img, err, sizeof err);
        if (rc == IMAGE_OK) ok_prefix++;
        else if (rc == IMAGE_ERR_FORMAT && strstr(err, "prefix.png") && img.data == NULL)
            failures++;
        image_free(&img);
    }
    CHECK(ok_prefix == 0 && failures == (int)n,
          "%s prefixes: %d decoded, %d failed cleanly of %zu", tag, ok_prefix, failures, n);
    c = malloc(n);
    /* every byte of signature + IHDR + the next chunk's header, each xor 0xff and 0x01 */
    for (size_t at = 0; at < 64 && at < n; at++) {
        for (int k = 0; k < 2; k++) {
            memcpy(c, b, n);
            c[at] ^= k ? 0x01 : 0xff;
            write_bytes(in_dir("flip.png"), c, n);
            enum image_status rc = image_load_png(in_dir("flip.png"), &img, err, sizeof err);
            if (!(rc == IMAGE_OK || rc == IMAGE_ERR_FORMAT)) bad++;
            image_free(&img);
        }
    }
    CHECK(bad == 0, "%s: %d header flips gave a status other than ok or format", tag, bad);
    /* single-byte corruptions past the signature: CRCs catch most; none may crash */
    tu_seed(42);
    for (int t = 0; t < 300; t++) {
        memcpy(c, b, n);
        size_t at = 8 + (size_t)((tu_rand() + 1.0) * 0.5 * (double)(n - 8));
        if (at >= n) at = n - 1;
        c[at] ^= (unsigned char)(1u + (unsigned)((tu_rand() + 1.0) * 127.0));
        write_bytes(in_dir("flip.png"), c, n);
        enum image_status rc = image_load_png(in_dir("flip.png"), &img, err, sizeof err);
        CHECK(rc == IMAGE_OK || rc == IMAGE_ERR_FORMAT, "%s: corruption at %zu: status %d", tag,
              at, rc);
        image_free(&img);
    }
    free(c);
    *np = n;
    return b;
}

static void test_corrupt_pngs(void)
{
    unsigned smp[16 * 12 * 4];
    static const png_color pal[4] = {{255, 0, 0}, {0, 128, 255}, {10, 20, 30}, {9, 9, 9}};
    static const png_byte trns[2] = {0, 100};
    struct png_spec s = {16, 12, 8, PNG_COLOR_TYPE_RGB, 1, smp, NULL, 0, NULL, 0, NULL};
    struct png_spec sp = {16, 12, 4, PNG_COLOR_TYPE_PALETTE, 1, smp, pal, 4, trns, 2, NULL};
    struct png_spec sg = {16, 12, 16, PNG_COLOR_TYPE_GRAY_ALPHA, 0, smp, NULL, 0, NULL, 0, NULL};
    struct image img = {0};
    char err[512];
    size_t n = 0;
    unsigned char *b;

    for (int i = 0; i < 16 * 12 * 4; i++) smp[i] = pat(i, 3, 1, 3);
    free(corrupt_loop("palette+tRNS interlaced", &sp, &n));
    for (int i = 0; i < 16 * 12 * 4; i++) smp[i] = pat(i, 3, 1, 65535);
    free(corrupt_loop("grey+alpha 16-bit", &sg, &n));
    for (int i = 0; i < 16 * 12 * 3; i++) smp[i] = pat(i, 3, 1, 255);
    b = corrupt_loop("RGB interlaced", &s, &n);
    if (!b) return;
    /* empty file, garbage, missing file */
    write_bytes(in_dir("empty.png"), "", 0);
    CHECK(image_load_png(in_dir("empty.png"), &img, err, sizeof err) == IMAGE_ERR_FORMAT &&
              strstr(err, "empty.png") && strstr(err, "not a PNG"),
          "empty file: %s", err);
    write_bytes(in_dir("garbage.png"), "this is certainly not a PNG image at all", 40);
    CHECK(image_load_png(in_dir("garbage.png"), &img, err, sizeof err) == IMAGE_ERR_FORMAT,
          "garbage: %s", err);
    CHECK(image_load_png(in_dir("missing.png"), &img, err, sizeof err) == IMAGE_ERR_IO &&
              strstr(err, "missing.png"),
          "missing: %s", err);
    /* a valid signature then garbage */
    {
        unsigned char g[64];
        memcpy(g, b, 8);
        for (int i = 8; i < 64; i++) g[i] = (unsigned char)(i * 37);
        write_bytes(in_dir("sig_garbage.png"), g, sizeof g);
        CHECK(image_load_png(in_dir("sig_garbage.png"), &img, err, sizeof err) ==
                  IMAGE_ERR_FORMAT,
              "signature + garbage: %s", err);
    }
    free(b);
}

/* ---- hostile PNGs: every limit is applied before a pixel buffer exists ---- */

static void put_be32(unsigned char *p, uint32_t v);

/* one chunk: declared length (normally n), type, n data bytes, CRC over type + data */
static size_t png_chunk(unsigned char *o, const char *type, const void *data, uint32_t n,
                        uint32_t declared)
{
    put_be32(o, declared);
    memcpy(o + 4, type, 4);
    if (n) memcpy(o + 8, data, n);
    put_be32(o + 8 + n, (uint32_t)crc32(0, o + 4, 4 + n));
    return 12 + (size_t)n;
}

/* signature + IHDR; returns the length written into o (33 bytes) */
static size_t png_head(unsigned char *o, uint32_t w, uint32_t h, int depth, int ctype)
{
    unsigned char ih[13];
    memcpy(o, "\x89PNG\r\n\x1a\n", 8);
    put_be32(ih, w);
    put_be32(ih + 4, h);
    ih[8] = (unsigned char)depth;
    ih[9] = (unsigned char)ctype;
    ih[10] = ih[11] = ih[12] = 0;
    return 8 + png_chunk(o + 8, "IHDR", ih, 13, 13);
}

/* A whole PNG: header, one IDAT of raw (already filtered rows) compressed at level 9, IEND.
 * malloc'd; *len its size. */
static unsigned char *png_craft(size_t *len, uint32_t w, uint32_t h, int depth, int ctype,
                                const unsigned char *raw, size_t raw_n)
{
    uLongf zn = compressBound((uLong)raw_n);
    unsigned char *z = malloc(zn), *o = malloc(zn + 64);
    size_t n;
    if (!z || !o || compress2(z, &zn, raw, (uLong)raw_n, 9) != Z_OK) {
        free(z);
        free(o);
        return NULL;
    }
    n = png_head(o, w, h, depth, ctype);
    n += png_chunk(o + n, "IDAT", z, (uint32_t)zn, (uint32_t)zn);
    n += png_chunk(o + n, "IEND", NULL, 0, 0);
    free(z);
    *len = n;
    return o;
}

/* peak virtual memory growth of this process since the baseline, in KiB (-1: no /proc) */
static long vm_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) v = atol(line + kl);
    fclose(f);
    return v;
}

/* The child side of png_probe: decode path in this fresh process and report the status, how far
 * the peak address space grew (VmPeak - VmSize before), and the error. */
static int png_probe_main(const char *path)
{
    struct image img = {0};
    char err[512] = "";
    long before = vm_kib("VmSize:");
    enum image_status rc = image_load_png(path, &img, err, sizeof err);
    long after = vm_kib("VmPeak:");
    image_free(&img);
    printf("%d %ld %s\n", (int)rc, before < 0 || after < 0 ? -1L : after - before, err);
    return 0;
}

/* Decode path in a freshly exec'd copy of this test (so VmPeak starts near the baseline, unlike a
 * fork that inherits the parent's peak): its status, peak growth in KiB (-1 when unknown) and
 * error. A child that hangs is killed after 20 s. 0 ok, -1 the probe itself failed. */
static int png_probe(const char *path, int *rc, long *grow_kib, char *err, size_t errlen)
{
    int fd[2], status;
    pid_t pid;
    char buf[1024];
    ssize_t got, n = 0;
    if (pipe(fd) != 0) return -1;
    pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        char *argv[] = {"test_dataset", "--probe-png", (char *)path, NULL};
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        alarm(20);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fd[1]);
    while (n < (ssize_t)sizeof buf - 1 && (got = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += got;
    close(fd[0]);
    buf[n] = '\0';
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    char *sp = strchr(buf, ' '), *sp2 = sp ? strchr(sp + 1, ' ') : NULL;
    if (!sp || !sp2) return -1;
    *rc = atoi(buf);
    *grow_kib = atol(sp + 1);
    snprintf(err, errlen, "%s", sp2 + 1);
    if (n && err[strlen(err) - 1] == '\n') err[strlen(err) - 1] = '\0';
    return 0;
}

/* Crafted files each refused with the limit named in the message, without the process's address
 * space growing by more than a few MiB (before libpng limits were set, the 44-byte file reserved
 * 2 GiB, the 4096x4096 one 320 MiB). */
static void test_hostile_pngs(void)
{
    unsigned char b[256], row[64];
    size_t n, len;
    char err[600];
    int rc, cases = 0;
    long grow;
    static const long grow_max_kib = 32 * 1024;
    struct {
        const char *name;
        unsigned char *bytes;
        size_t len;
        const char *want; /* in the error */
    } t[8];

    memset(row, 0, sizeof row);
    /* 44 bytes: signature, IHDR 1x1 grey, a tEXt chunk declaring 2^31 - 1 bytes, 3 of them */
    n = png_head(b, 1, 1, 8, PNG_COLOR_TYPE_GRAY);
    put_be32(b + n, 0x7fffffffu);
    memcpy(b + n + 4, "tEXtabc", 7);
    n += 11;
    CHECK(n == 44, "the chunk file is %zu bytes", n);
    t[cases].name = "chunk2g.png";
    t[cases].bytes = malloc(n);
    memcpy(t[cases].bytes, b, n);
    t[cases].len = n;
    t[cases++].want = "truncated";
    /* the same with the 2 GiB chunk an IDAT and one a zTXt */
    memcpy(b + 37, "IDAT", 4);
    t[cases].name = "idat2g.png";
    t[cases].bytes = malloc(n);
    memcpy(t[cases].bytes, b, n);
    t[cases].len = n;
    t[cases++].want = "truncated";
    memcpy(b + 37, "zTXt", 4);
    t[cases].name = "ztxt2g.png";
    t[cases].bytes = malloc(n);
    memcpy(t[cases].bytes, b, n);
    t[cases].len = n;
    t[cases++].want = "truncated";
    /* PNG bombs: a valid 1-row IDAT under headers declaring far more */
    t[cases].name = "side.png";
    t[cases].bytes = png_craft(&t[cases].len, 60000, 60000, 8, PNG_COLOR_TYPE_GRAY, row, 1 + 60);
    t[cases++].want = "IMAGE_MAX_SIDE";
    t[cases].name = "decoded.png";
    t[cases].bytes = png_craft(&t[cases].len, 5000, 5000, 16, PNG_COLOR_TYPE_RGB_ALPHA, row, 33);
    t[cases++].want = "IMAGE_MAX_DECODED_BYTES";
    t[cases].name = "bomb.png";
    t[cases].bytes = png_craft(&t[cases].len, 4096, 4096, 8, PNG_COLOR_TYPE_RGB_ALPHA, row, 33);
    t[cases++].want = "cannot decompress";
    /* a valid 64x64 RGB image cut inside its IDAT, and one with a wrong IHDR CRC */
    {
        unsigned char raw[64 * (1 + 64 * 3)];
        for (size_t i = 0; i < sizeof raw; i++) raw[i] = i % 193 ? (unsigned char)(i * 7919 >> 3) : 0;
        for (int y = 0; y < 64; y++) raw[(size_t)y * (1 + 64 * 3)] = 0; /* filter: none */
        unsigned char *whole = png_craft(&len, 64, 64, 8, PNG_COLOR_TYPE_RGB, raw, sizeof raw);
        t[cases].name = "cut.png";
        t[cases].bytes = whole;
        t[cases].len = len > 40 ? len - 30 : len;
        t[cases++].want = "truncated";
        t[cases].name = "crc.png";
        t[cases].bytes = malloc(len);
        memcpy(t[cases].bytes, whole, len);
        t[cases].bytes[32] ^= 0x5a; /* last byte of the IHDR CRC */
        t[cases].len = len;
        t[cases++].want = "CRC";
    }
    for (int i = 0; i < cases; i++) {
        CHECK(t[i].bytes && write_bytes(in_dir(t[i].name), t[i].bytes, t[i].len), "%s written",
              t[i].name);
        if (png_probe(in_dir(t[i].name), &rc, &grow, err, sizeof err) != 0) {
            CHECK(0, "%s: the probe child failed (crash or hang)", t[i].name);
            continue;
        }
        CHECK(rc == IMAGE_ERR_FORMAT && strstr(err, t[i].name) && strstr(err, t[i].want),
              "%s: status %d, error '%s' (expected one naming the file and '%s')", t[i].name, rc,
              err, t[i].want);
        CHECK((grow >= 0 && grow <= grow_max_kib) || grow == -1,
              "%s: the address space grew by %ld KiB while refusing it (limit %ld)", t[i].name,
              grow, grow_max_kib);
        free(t[i].bytes);
    }

    /* the deflate-ratio bound never refuses a real file: 2048x2048 zeros at zlib's best ratio */
    {
        size_t rn = (size_t)2048 * (1 + 2048);
        unsigned char *raw = calloc(rn, 1);
        unsigned char *z = raw ? png_craft(&len, 2048, 2048, 8, PNG_COLOR_TYPE_GRAY, raw, rn) : NULL;
        struct image img = {0};
        CHECK(z && write_bytes(in_dir("zeros.png"), z, len), "zeros.png written");
        rc = image_load_png(in_dir("zeros.png"), &img, err, sizeof err);
        CHECK(rc == IMAGE_OK && img.w == 2048 && img.h == 2048 && img.c == 1 && img.data[12345] == 0.0f,
              "a %zu-byte all-zero 2048x2048 PNG (ratio %.0f:1): %s", len, (double)rn / (double)len,
              err);
        image_free(&img);
        free(raw);
        free(z);
    }

    /* a valid file with a 9 MiB tEXt chunk (over IMAGE_MAX_CHUNK_BYTES) decodes: ancillary
     * chunks are skipped unread, not buffered */
    {
        size_t tn = (size_t)9 << 20, rn = 4 * (1 + 4);
        unsigned char raw[20] = {0}, *f = malloc(tn + 512), *z = malloc(256);
        uLongf zn = 256;
        struct image img = {0};
        memcpy(raw + 5, "\0\x10\x20\x30\x40", 5);
        CHECK(f && z && compress2(z, &zn, raw, (uLong)rn, 9) == Z_OK, "compress");
        if (f && z) {
            unsigned char *text = calloc(tn, 1);
            memcpy(text, "Comment", 7);
            len = png_head(f, 4, 4, 8, PNG_COLOR_TYPE_GRAY);
            len += png_chunk(f + len, "tEXt", text, (uint32_t)tn, (uint32_t)tn);
            len += png_chunk(f + len, "IDAT", z, (uint32_t)zn, (uint32_t)zn);
            len += png_chunk(f + len, "IEND", NULL, 0, 0);
            free(text);
            CHECK(write_bytes(in_dir("bigtext.png"), f, len), "bigtext.png written");
            rc = image_load_png(in_dir("bigtext.png"), &img, err, sizeof err);
            CHECK(rc == IMAGE_OK && img.w == 4 && img.data[4] == 16 / 255.0f,
                  "a PNG with a 9 MiB text chunk: %s", err);
            image_free(&img);
            unlink(in_dir("bigtext.png"));
        }
        free(f);
        free(z);
    }

    /* a FIFO named *.png is refused at once, never opened for a blocking read */
    {
        pid_t pid;
        int status;
        CHECK(mkfifo(in_dir("pipe.png"), 0600) == 0, "mkfifo");
        pid = fork();
        if (pid == 0) {
            struct image img = {0};
            alarm(10);
            rc = image_load_png(in_dir("pipe.png"), &img, err, sizeof err);
            _exit(rc == IMAGE_ERR_IO && strstr(err, "not a regular file") ? 0 : 1);
        }
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0,
              "a FIFO: the loader %s", pid > 0 && WIFSIGNALED(status) ? "hung" : "did not refuse it");
        unlink(in_dir("pipe.png"));
    }
}

/* ---- resampling and channels ---- */

static int near(float a, double b, double tol) { return fabs((double)a - b) <= tol; }

static void test_resize(void)
{
    float src[64], out[128];
    struct image img = {1, 4, 4, src};
    int bad = 0;

    /* 4x4 -> 2x2: area means of the 2x2 blocks, then to [-1, 1] */
    for (int i = 0; i < 16; i++) src[i] = (float)i / 16.0f;
    CHECK(image_resize_square(out, &img, 2) == IMAGE_OK, "4->2 failed");
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 2; x++) {
            double m = 0;
            for (int dy = 0; dy < 2; dy++)
                for (int dx = 0; dx < 2; dx++) m += src[(2 * y + dy) * 4 + 2 * x + dx];
            if (!near(out[y * 2 + x], 2 * (m / 4) - 1, 1e-6)) bad++;
        }
    CHECK(bad == 0, "4x4 -> 2x2 area average wrong");

    /* 3x3 -> 2x2: output 0 spans [0, 1.5): weights 2/3, 1/3 on each axis */
    {
        float s3[9] = {0.1f, 0.5f, 0.9f, 0.2f, 0.4f, 0.6f, 0.3f, 0.7f, 0.8f};
        struct image i3 = {1, 3, 3, s3};
        double w[2][3] = {{2.0 / 3, 1.0 / 3, 0}, {0, 1.0 / 3, 2.0 / 3}};
        bad = 0;
        CHECK(image_resize_square(out, &i3, 2) == IMAGE_OK, "3->2 failed");
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 2; x++) {
                double m = 0;
                for (int a = 0; a < 3; a++)
                    for (int b = 0; b < 3; b++) m += w[y][a] * w[x][b] * s3[a * 3 + b];
                if (!near(out[y * 2 + x], 2 * m - 1, 1e-6)) bad++;
            }
        CHECK(bad == 0, "3x3 -> 2x2 fractional area wrong");
    }

    /* 2x2 -> 4x4 bilinear, align_corners=false: weights of PyTorch's F.interpolate */
    {
        float s2[4] = {0.0f, 1.0f, 0.5f, 0.25f};
        struct image i2 = {1, 2, 2, s2};
        double w[4][2] = {{1, 0}, {0.75, 0.25}, {0.25, 0.75}, {0, 1}};
        bad = 0;
        CHECK(image_resize_square(out, &i2, 4) == IMAGE_OK, "2->4 failed");
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 4; x++) {
                double m = 0;
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) m += w[y][a] * w[x][b] * s2[a * 2 + b];
                if (!near(out[y * 4 + x], 2 * m - 1, 1e-6)) bad++;
            }
        CHECK(bad == 0, "2x2 -> 4x4 bilinear wrong");
    }

    /* wide 2x6 -> 2: no scaling, centre columns 2 and 3 */
    {
        float s[12];
        struct image iw = {1, 2, 6, s};
        for (int i = 0; i < 12; i++) s[i] = (float)i / 11.0f;
        CHECK(image_resize_square(out, &iw, 2) == IMAGE_OK, "crop failed");
        CHECK(near(out[0], 2 * s[2] - 1, 1e-6) && near(out[1], 2 * s[3] - 1, 1e-6) &&
                  near(out[2], 2 * s[8] - 1, 1e-6) && near(out[3], 2 * s[9] - 1, 1e-6),
              "2x6 centre crop wrong: %g %g %g %g", out[0], out[1], out[2], out[3]);
    }
    /* tall 6x2 -> 2: rows 2 and 3 */
    {
        float s[12];
        struct image it = {1, 6, 2, s};
        for (int i = 0; i < 12; i++) s[i] = (float)i / 11.0f;
        CHECK(image_resize_square(out, &it, 2) == IMAGE_OK, "tall crop failed");
        CHECK(near(out[0], 2 * s[4] - 1, 1e-6) && near(out[3], 2 * s[7] - 1, 1e-6),
              "6x2 centre crop wrong");
    }
    /* 4x8 -> 2: halve both axes (4x8 -> 2x4), then keep resized columns 1, 2 */
    {
        float s[32];
        struct image i48 = {1, 4, 8, s};
        for (int i = 0; i < 32; i++) s[i] = (float)((i * 7) % 32) / 31.0f;
        bad = 0;
        CHECK(image_resize_square(out, &i48, 2) == IMAGE_OK, "4x8 failed");
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 2; x++) {
                int cx = 2 * (x + 1); /* input columns of resized column x + 1 */
                double m = (s[(2 * y) * 8 + cx] + s[(2 * y) * 8 + cx + 1] +
                            s[(2 * y + 1) * 8 + cx] + s[(2 * y + 1) * 8 + cx + 1]) / 4;
                if (!near(out[y * 2 + x], 2 * m - 1, 1e-6)) bad++;
            }
        CHECK(bad == 0, "4x8 -> 2x2 shrink + crop wrong");
    }
    /* identity keeps the values (as [-1, 1]); a constant stays constant at any size */
    {
        float s[15];
        struct image ic = {1, 3, 5, s};
        for (int i = 0; i < 15; i++) s[i] = 0.3f;
        int sizes[4] = {1, 2, 7, 9};
        bad = 0;
        for (int k = 0; k < 4; k++) {
            CHECK(image_resize_square(out, &ic, sizes[k]) == IMAGE_OK, "const resize failed");
            for (int i = 0; i < sizes[k] * sizes[k]; i++)
                if (!near(out[i], 2 * 0.3 - 1, 1e-6)) bad++;
        }
        CHECK(bad == 0, "constant image changed by resizing");
    }
    CHECK(image_resize_square(out, &img, 0) == IMAGE_ERR_ARG, "size 0 accepted");
}

static void test_channels(void)
{
    float rgba[8] = {0.8f, 0.2f, 0.4f, 0.6f, 0.1f, 1.0f, 0.5f, 0.25f}; /* 2 pixels, (C,H,W) */
    struct image img;
    float *d = malloc(sizeof rgba);
    memcpy(d, rgba, sizeof rgba);
    img = (struct image){4, 1, 2, d};
    CHECK(image_to_channels(&img, 1) == IMAGE_OK && img.c == 1, "RGBA -> 1 failed");
    for (int p = 0; p < 2; p++) {
        double r = rgba[p], g = rgba[2 + p], b = rgba[4 + p], a = rgba[6 + p];
        CHECK(near(img.data[p], (0.299 * r + 0.587 * g + 0.114 * b) * a, 1e-6),
              "luminance of pixel %d: %g", p, img.data[p]);
    }
    image_free(&img);

    d = malloc(sizeof rgba);
    memcpy(d, rgba, sizeof rgba);
    img = (struct image){4, 1, 2, d};
    CHECK(image_to_channels(&img, 3) == IMAGE_OK && img.c == 3, "RGBA -> 3 failed");
    /* planes R {0.8, 0.2}, G {0.4, 0.6}, B {0.1, 1.0}, A {0.5, 0.25} */
    CHECK(near(img.data[0], 0.8 * 0.5, 1e-7) && near(img.data[1], 0.2 * 0.25, 1e-7) &&
              near(img.data[3], 0.6 * 0.25, 1e-7) && near(img.data[5], 1.0 * 0.25, 1e-7),
          "RGBA -> RGB not composited on black");
    image_free(&img);

    float ga[4] = {0.5f, 1.0f, 0.5f, 0.0f}; /* grey 0.5,1.0; alpha 0.5,0 */
    d = malloc(sizeof ga);
    memcpy(d, ga, sizeof ga);
    img = (struct image){2, 1, 2, d};
    CHECK(image_to_channels(&img, 3) == IMAGE_OK && img.c == 3, "GA -> 3 failed");
    CHECK(img.data[0] == 0.25f && img.data[2] == 0.25f && img.data[4] == 0.25f &&
              img.data[1] == 0.0f && img.data[5] == 0.0f,
          "GA -> RGB wrong");
    image_free(&img);

    float g1[2] = {0.3f, 0.9f};
    d = malloc(sizeof g1);
    memcpy(d, g1, sizeof g1);
    img = (struct image){1, 1, 2, d};
    CHECK(image_to_channels(&img, 3) == IMAGE_OK && img.c == 3 && img.data[1] == 0.9f &&
              img.data[3] == 0.9f && img.data[4] == 0.3f,
          "grey -> RGB not replicated");
    CHECK(image_to_channels(&img, 2) == IMAGE_ERR_ARG, "2 channels accepted as a target");
    image_free(&img);
}

/* ---- saving ---- */

static unsigned char quant(float v)
{
    if (!(v > -1.0f)) return 0;
    if (v >= 1.0f) return 255;
    return (unsigned char)floor(((double)v + 1.0) * 127.5 + 0.5);
}

static void test_save(void)
{
    enum { C = 3, H = 5, W = 7 };
    float x[C * H * W];
    struct image img = {0};
    char err[512];
    int bad = 0;

    tu_seed(7);
    tu_fill(x, C * H * W, 1.2); /* some values outside [-1, 1] */
    x[0] = NAN;
    x[1] = -1.0f;
    x[2] = 1.0f;
    x[3] = 0.0f; /* 127.5 -> 128 */
    CHECK(image_save_png(in_dir("save.png"), x, C, H, W, err, sizeof err) == IMAGE_OK, "%s", err);
    CHECK(count_tmp_files(g_dir) == 0, "temp file left after save");
    CHECK(image_load_png(in_dir("save.png"), &img, err, sizeof err) == IMAGE_OK && img.c == C &&
              img.h == H && img.w == W,
          "reload: %s", err);
    if (img.data && img.c == C)
        for (int i = 0; i < C * H * W; i++)
            if (img.data[i] != (float)quant(x[i]) / 255.0f) bad++;
    CHECK(bad == 0, "saved RGB values differ from the quantisation rule (%d)", bad);
    CHECK(img.data && img.data[3] == 128 / 255.0f && img.data[0] == 0.0f, "rounding of 0 / NaN");
    image_free(&img);

    /* grey; and the values a [-1, 1] image was built from survive exactly */
    float gx[H * W];
    for (int i = 0; i < H * W; i++) gx[i] = (float)(i * 9 % 256) / 127.5f - 1.0f;
    CHECK(image_save_png(in_dir("grey.png"), gx, 1, H, W, err, sizeof err) == IMAGE_OK, "%s",
          err);
    CHECK(image_load_png(in_dir("grey.png"), &img, err, sizeof err) == IMAGE_OK && img.c == 1,
          "reload grey: %s", err);
    bad = 0;
    for (int i = 0; i < H * W && img.data; i++)
        if (!near(img.data[i] * 2.0f - 1.0f, gx[i], 1e-6)) bad++;
    CHECK(bad == 0, "grey round trip differs (%d)", bad);
    image_free(&img);

    CHECK(image_save_png(in_dir("bad.png"), gx, 2, H, W, err, sizeof err) == IMAGE_ERR_ARG,
          "2 channels accepted");
    CHECK(image_save_png("/nonexistent-dir-ddpmd/x.png", gx, 1, H, W, err, sizeof err) ==
                  IMAGE_ERR_IO &&
              strstr(err, "x.png"),
          "unwritable path: %s", err);
}

static void test_grid(void)
{
    enum { N = 5, C = 3, H = 4, W = 3, COLS = 3, PAD = 2 };
    float x[N * C * H * W];
    struct image img = {0};
    char err[512];
    for (int i = 0; i < N * C * H * W; i++) x[i] = 1.0f; /* tiles white, so -1 stands out */
    x[((4 * C + 1) * H + 2) * W + 1] = 0.0f;              /* image 4, G, y 2, x 1 -> 128 */
    CHECK(image_save_grid_png(in_dir("grid.png"), x, N, C, H, W, COLS, PAD, err, sizeof err) ==
              IMAGE_OK,
          "%s", err);
    CHECK(image_load_png(in_dir("grid.png"), &img, err, sizeof err) == IMAGE_OK, "%s", err);
    int gw = COLS * W + (COLS - 1) * PAD, gh = 2 * H + PAD;
    CHECK(img.w == gw && img.h == gh && img.c == C, "grid %dx%d, want %dx%d", img.h, img.w, gh,
          gw);
    if (img.w == gw && img.h == gh && img.c == C) {
        const float *g = img.data + (size_t)1 * gh * gw; /* green plane */
        CHECK(g[0] == 1.0f && g[W - 1] == 1.0f, "tile 0 not at the origin");
        CHECK(g[W] == 0.0f && g[W + PAD - 1] == 0.0f && g[W + PAD] == 1.0f,
              "padding between columns wrong");
        CHECK(g[H * gw] == 0.0f && g[(H + PAD) * gw] == 1.0f, "padding between rows wrong");
        /* image 4 = row 1, column 1 */
        CHECK(g[(H + PAD + 2) * gw + (W + PAD) + 1] == 128 / 255.0f, "tile 4 misplaced");
        /* cell 5 (row 1, column 2) is empty */
        CHECK(g[(H + PAD) * gw + 2 * (W + PAD)] == 0.0f && g[gh * gw - 1] == 0.0f,
              "empty cell not background");
    }
    image_free(&img);
    CHECK(image_save_grid_png(in_dir("grid1.png"), x, 2, C, H, W, 8, PAD, err, sizeof err) ==
                  IMAGE_OK &&
              image_load_png(in_dir("grid1.png"), &img, err, sizeof err) == IMAGE_OK &&
              img.w == 2 * W + PAD && img.h == H,
          "cols > n not clamped to n");
    image_free(&img);
}

/* ---- PNG folders ---- */

static int g_logged;
static void count_log(void *ctx, const char *line)
{
    (void)line;
    (*(int *)ctx)++;
}

static void test_folder(void)
{
    struct dataset *ds = NULL;
    struct dataset_report rep;
    char err[1024], dir[600], sub[700], p[800];
    size_t n;
    unsigned char *whole;

    snprintf(dir, sizeof dir, "%s/folder", g_dir);
    mkdir(dir, 0755);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0755);

    /* "B.PNG": grey 8 constant 51; "a.png": RGB 4x4 constant (255, 0, 0); "sub/c.png": 8x4 GA */
    unsigned g[16], rgb[48], ga[64];
    for (int i = 0; i < 16; i++) g[i] = 51;
    for (int i = 0; i < 48; i++) rgb[i] = i % 3 == 0 ? 255 : 0;
    for (int i = 0; i < 64; i++) ga[i] = i % 2 ? 255 : 102;
    struct png_spec sg = {4, 4, 8, PNG_COLOR_TYPE_GRAY, 0, g, NULL, 0, NULL, 0, NULL};
    struct png_spec sr = {4, 4, 8, PNG_COLOR_TYPE_RGB, 0, rgb, NULL, 0, NULL, 0, NULL};
    struct png_spec sa = {8, 4, 8, PNG_COLOR_TYPE_GRAY_ALPHA, 0, ga, NULL, 0, NULL, 0, NULL};
    snprintf(p, sizeof p, "%s/B.PNG", dir);
    CHECK(write_png(p, &sg), "B.PNG");
    snprintf(p, sizeof p, "%s/a.png", dir);
    CHECK(write_png(p, &sr), "a.png");
    snprintf(p, sizeof p, "%s/c.png", sub);
    CHECK(write_png(p, &sa), "sub/c.png");
    whole = tu_slurp(p, &n);
    snprintf(p, sizeof p, "%s/z_trunc.png", dir);
    write_bytes(p, whole, n / 2);
    free(whole);
    snprintf(p, sizeof p, "%s/garbage.png", dir);
    write_bytes(p, "GIF89a nope", 11);
    snprintf(p, sizeof p, "%s/empty.png", dir);
    write_bytes(p, "", 0);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    write_bytes(p, "x", 1);
    snprintf(p, sizeof p, "%s/.hidden.png", dir);
    write_bytes(p, "x", 1);
    snprintf(p, sizeof p, "%s/fifo.png", dir); /* never opened: reading it would block */
    CHECK(mkfifo(p, 0600) == 0, "mkfifo");

    g_logged = 0;
    enum dataset_status rc =
        dataset_open_folder(&ds, dir, 1, 2, -1, -1, &rep, count_log, &g_logged, err, sizeof err);
    CHECK(rc == DATASET_OK, "folder: %s", err);
    CHECK(rep.found == 6 && rep.loaded == 3 && rep.skipped == 3 && g_logged == 3,
          "report found %d loaded %d skipped %d logged %d", rep.found, rep.loaded, rep.skipped,
          g_logged);
    CHECK(!strcmp(rep.skipped_names[0], "empty.png") &&
              !strcmp(rep.skipped_names[1], "garbage.png") &&
              !strcmp(rep.skipped_names[2], "z_trunc.png"),
          "skipped names: %s, %s, %s", rep.skipped_names[0], rep.skipped_names[1],
          rep.skipped_names[2]);
    CHECK(strstr(rep.first_reason, "empty.png") != NULL, "first reason: %s", rep.first_reason);
    if (rc == DATASET_OK) {
        CHECK(dataset_count(ds) == 3 && dataset_channels(ds) == 1 && dataset_size(ds) == 2 &&
                  dataset_train_count(ds) == 3 && dataset_val_count(ds) == 0 &&
                  dataset_label(ds, 0) == -1,
              "folder dataset shape");
        /* strcmp order: B.PNG, a.png, sub/c.png */
        const float *i0 = tu_image_at(ds, 0), *i1 = tu_image_at(ds, 1),
                    *i2 = tu_image_at(ds, 2);
        CHECK(near(i0[3], 2 * (51 / 255.0) - 1, 1e-6), "B.PNG first: %g", i0[3]);
        CHECK(near(i1[0], 2 * (0.299 * 1.0) - 1, 1e-6), "a.png second (red luminance): %g",
              i1[0]);
        CHECK(near(i2[1], 2 * (102 / 255.0) - 1, 1e-6), "sub/c.png third: %g", i2[1]);
    }
    dataset_free(ds);
    ds = NULL;

    /* three channels from the same folder */
    rc = dataset_open_folder(&ds, dir, 3, 3, -1, -1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_OK && dataset_count(ds) == 3 && dataset_channels(ds) == 3,
          "3-channel folder: %s", err);
    if (rc == DATASET_OK) {
        const float *i1 = tu_image_at(ds, 1);
        CHECK(i1[0] == 1.0f && i1[9] == -1.0f && i1[18] == -1.0f, "a.png as RGB: %g %g %g",
              i1[0], i1[9], i1[18]);
        CHECK(dataset_bytes(ds) == dataset_plan_bytes(0, 3, 3, 3, -1, -1),
              "a folder holds %lld bytes, planned %lld", (long long)dataset_bytes(ds),
              (long long)dataset_plan_bytes(0, 3, 3, 3, -1, -1));
    }
    dataset_free(ds);
    ds = NULL;

    /* all bad: a clear error naming the folder */
    snprintf(dir, sizeof dir, "%s/allbad", g_dir);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/x.png", dir);
    write_bytes(p, "", 0);
    snprintf(p, sizeof p, "%s/y.PnG", dir);
    write_bytes(p, "\x89PNG\r\n\x1a\n garbage", 17);
    rc = dataset_open_folder(&ds, dir, 1, 8, -1, -1, &rep, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_EMPTY && ds == NULL && rep.skipped == 2 && rep.loaded == 0 &&
              strstr(err, "allbad") && strstr(err, "no usable image"),
          "all bad: rc %d: %s", rc, err);

    snprintf(dir, sizeof dir, "%s/nopng", g_dir);
    mkdir(dir, 0755);
    rc = dataset_open_folder(&ds, dir, 1, 8, -1, -1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_EMPTY && strstr(err, "nopng"), "empty folder: %d %s", rc, err);
    rc = dataset_open_folder(&ds, in_dir("does-not-exist"), 1, 8, -1, -1, NULL, NULL, NULL, err,
                             sizeof err);
    CHECK(rc == DATASET_ERR_IO && strstr(err, "does-not-exist"), "missing folder: %d %s", rc,
          err);
    rc = dataset_open_folder(&ds, g_dir, 2, 8, -1, -1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_ARG, "2 channels accepted");
}

/* One folder opened as float (the old way) and as its samples (src, maxpix as an upload counts
 * them): held as bytes iff want (its bytes the plan's), and every image, the loader's flipped
 * batches over two epochs and the validation batches bit for bit the same. */
static void check_held(const char *dir, int64_t src, int64_t maxpix, int n, int C, int S,
                       int want)
{
    char err[1024];
    struct dataset *df = NULL, *db = NULL;
    CHECK(dataset_open_folder(&df, dir, C, S, -1, -1, NULL, NULL, NULL, err, sizeof err) ==
              DATASET_OK, "as float: %s", err);
    CHECK(dataset_open_folder(&db, dir, C, S, src, maxpix, NULL, NULL, NULL, err, sizeof err) ==
              DATASET_OK, "as bytes: %s", err);
    if (!df || !db) goto done;
    int64_t planned = dataset_plan_bytes(0, n, C, S, maxpix, src);
    int64_t floats = dataset_plan_bytes(0, n, C, S, maxpix, -1);
    CHECK(dataset_bytes(db) == planned && dataset_bytes(df) == floats,
          "%s %dx%d: holds %lld and %lld bytes, planned %lld and %lld", dir, C, S,
          (long long)dataset_bytes(db), (long long)dataset_bytes(df), (long long)planned,
          (long long)floats);
    CHECK(want == (planned < floats) && (want || planned == floats),
          "%s %dx%d: held as %s (%lld bytes against %lld as float)", dir, C, S,
          planned < floats ? "bytes" : "float", (long long)planned, (long long)floats);
    int same = 1;
    for (int i = 0; i < n; i++) {
        const float *a = tu_image_at(df, i), *b = tu_image_at(db, i);
        same &= a && b && !memcmp(a, b, (size_t)C * S * S * sizeof *a);
    }
    CHECK(same, "%s %dx%d: an image differs from its float decode", dir, C, S);
    CHECK(dataset_split(df, 3, 5, err, sizeof err) == DATASET_OK &&
              dataset_split(db, 3, 5, err, sizeof err) == DATASET_OK, "split: %s", err);
    size_t per = (size_t)C * S * S;
    float *xa = malloc(4 * per * sizeof *xa), *xb = malloc(4 * per * sizeof *xb);
    struct dataset_loader *la = NULL, *lb = NULL;
    CHECK(xa && xb && dataset_loader_init(&la, df, 7, 4, 1, 0, 2, err, sizeof err) == DATASET_OK &&
              dataset_loader_init(&lb, db, 7, 4, 1, 0, 2, err, sizeof err) == DATASET_OK,
          "loaders: %s", err);
    int steps = 2 * (n - 3) / 4 + 1;
    for (int step = 0; la && lb && step < steps; step++) {
        CHECK(dataset_loader_next(la, step, xa, NULL) == DATASET_OK &&
                  dataset_loader_next(lb, step, xb, NULL) == DATASET_OK &&
                  !memcmp(xa, xb, 4 * per * sizeof *xa),
              "%s %dx%d: batch %d differs", dir, C, S, step);
    }
    CHECK(xa && xb && dataset_val_batch(df, 0, 3, xa, NULL) == DATASET_OK &&
              dataset_val_batch(db, 0, 3, xb, NULL) == DATASET_OK &&
              !memcmp(xa, xb, 3 * per * sizeof *xa),
          "%s %dx%d: validation batch differs", dir, C, S);
    dataset_loader_free(la);
    dataset_loader_free(lb);
    free(xa);
    free(xb);
done:
    dataset_free(df);
    dataset_free(db);
}

/* A folder of copies of the given kinds of PNG (w, h, depth, colour type), their samples counted
 * as an upload does (dataset_source_bytes, the largest w x h): the image count. */
struct held_kind {
    int w, h, depth, ctype;
};
static int make_held(const char *dir, const struct held_kind *kinds, int nk, int copies,
                     int64_t *src, int64_t *maxpix)
{
    static const png_color pal[4] = {{0, 0, 0}, {255, 0, 0}, {10, 200, 30}, {255, 255, 255}};
    static unsigned buf[32 * 32 * 4];
    char p[800], err[512];
    int n = 0;
    mkdir(dir, 0755);
    *src = *maxpix = 0;
    for (int k = 0; k < nk; k++)
        for (int copy = 0; copy < copies; copy++) {
            const struct held_kind *q = &kinds[k];
            int ch = png_channels_of(q->ctype);
            unsigned maxv = q->ctype == PNG_COLOR_TYPE_PALETTE ? 3 : (1u << q->depth) - 1;
            for (int y = 0; y < q->h; y++)
                for (int x = 0; x < q->w; x++)
                    for (int c = 0; c < ch; c++)
                        buf[((size_t)y * q->w + x) * ch + c] = pat(x + 5 * copy, y + k, c, maxv);
            struct png_spec sp = {q->w, q->h, q->depth, q->ctype, copy % 2, buf,
                                  q->ctype == PNG_COLOR_TYPE_PALETTE ? pal : NULL, 4, NULL, 0,
                                  NULL};
            snprintf(p, sizeof p, "%s/k%d-%02d.png", dir, k, copy);
            CHECK(write_png(p, &sp), "%s", p);
            struct image im;
            CHECK(image_load_png(p, &im, err, sizeof err) == IMAGE_OK, "%s", err);
            *src += dataset_source_bytes(&im);
            if ((int64_t)im.w * im.h > *maxpix) *maxpix = (int64_t)im.w * im.h;
            image_free(&im);
            n++;
        }
    return n;
}

/* The one decoded copy of a folder (held as bytes at 1 x 16): written, mapped back with the
 * same images and bytes; a flipped sample byte (checksum), a cut file (size), a record out of
 * bounds under a recomputed checksum, a plan that holds it as float, no file: each refused. */
static void check_samples(const char *dir, int64_t src, int64_t maxpix, int n)
{
    char err[1024], path[700];
    struct dataset *db = NULL, *dm = NULL;
    snprintf(path, sizeof path, "%s.bin", dir);
    CHECK(dataset_open_folder(&db, dir, 1, 16, src, maxpix, NULL, NULL, NULL, err, sizeof err) ==
              DATASET_OK && dataset_save_samples(db, path, err, sizeof err) == DATASET_OK,
          "samples written: %s", err);
    CHECK(dataset_open_samples(&dm, path, 1, 16, src, maxpix, err, sizeof err) == DATASET_OK &&
              dataset_count(dm) == n && dataset_bytes(dm) == dataset_bytes(db),
          "samples mapped: %s", err);
    int same = db && dm;
    for (int i = 0; same && i < n; i++) {
        const float *a = tu_image_at(db, i), *b = tu_image_at(dm, i);
        same = a && b && !memcmp(a, b, 16 * 16 * sizeof *a);
    }
    CHECK(same, "a mapped image differs from the decoded one");
    dataset_free(dm);
    dm = NULL;
    size_t len;
    unsigned char *whole = tu_slurp(path, &len), *bad = whole ? malloc(len) : NULL;
    CHECK(whole && bad && len == 64 + (size_t)n * 16 + (size_t)src, "samples file of %zu bytes",
          len);
    if (!bad) goto done;
    memcpy(bad, whole, len);
    bad[len - 1] ^= 1;
    write_bytes(path, bad, len);
    enum dataset_status rc = dataset_open_samples(&dm, path, 1, 16, src, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !dm && strstr(err, "checksum"), "a flipped byte: %d %s", rc,
          err);
    write_bytes(path, whole, len - 1);
    rc = dataset_open_samples(&dm, path, 1, 16, src, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !dm, "a cut file: %d %s", rc, err);
    /* the last image's record starts 64 bytes later (the checksum made right): past the end */
    memcpy(bad, whole, len);
    bad[64 + (size_t)(n - 1) * 16] += 64;
    uint32_t crc = (uint32_t)crc32(0, bad + 64, (uInt)(len - 64));
    memcpy(bad + 24, &crc, sizeof crc);
    write_bytes(path, bad, len);
    rc = dataset_open_samples(&dm, path, 1, 16, src, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !dm && strstr(err, "record"), "a bad record: %d %s", rc,
          err);
    write_bytes(path, whole, len);
    rc = dataset_open_samples(&dm, path, 1, 4, src, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_ARG && !dm, "held as float at 4 px: %d %s", rc, err);
    rc = dataset_open_samples(&dm, path, 1, 16, src - 1, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !dm, "over its plan: %d %s", rc, err);
    unlink(path);
    rc = dataset_open_samples(&dm, path, 1, 16, src, maxpix, err, sizeof err);
    CHECK(rc == DATASET_ERR_IO && !dm, "no file: %d %s", rc, err);
done:
    free(whole);
    free(bad);
    dataset_free(dm);
    dataset_free(db);
}

/* Folders held as their decoded samples against the same folders held as float (check_held),
 * for grey and RGB at the files' own size (the byte table) and resized up and down, over every
 * kind of file (grey, grey+alpha, RGB, RGBA, palette, 16-bit, 2-bit, non-square, interlaced),
 * floats kept where they are fewer bytes; a folder whose samples grew past the count it was
 * planned by is refused. */
/* dataset_folder_probe: a folder named by path measured from its PNG headers alone - the
 * count of files the probe passes, a bound on their decoded samples that is exact for 8-bit,
 * 16-bit, a palette with tRNS and a grey colour key (each as image_load_png holds it), the
 * largest width x height - and the folder opened with those figures holds them as bytes */
static void test_folder_probe(void)
{
    char dir[300], path[400], err[512];
    snprintf(dir, sizeof dir, "%s/probe", g_dir);
    mkdir(dir, 0755);
    unsigned g16[30], rgb[60], idx[21], key[6] = {0, 7, 200, 7, 255, 1};
    for (int i = 0; i < 30; i++) g16[i] = pat(i, 3, 0, 65535) | 1; /* odd: 2 bytes a sample */
    for (int i = 0; i < 60; i++) rgb[i] = pat(i, 5, 1, 255);
    for (int i = 0; i < 21; i++) idx[i] = pat(i, 1, 0, 4);
    static const png_color pal[5] = {{255, 0, 0}, {0, 128, 255}, {10, 20, 30}, {0, 0, 0},
                                     {255, 255, 255}};
    static const png_byte trns[3] = {0, 100, 255};
    png_color_16 k = {0, 0, 0, 0, 7};
    const struct {
        const char *name;
        struct png_spec s;
    } files[] = {
        {"g16.png", {6, 5, 16, PNG_COLOR_TYPE_GRAY, 0, g16, NULL, 0, NULL, 0, NULL}},
        {"rgb8.png", {5, 4, 8, PNG_COLOR_TYPE_RGB, 0, rgb, NULL, 0, NULL, 0, NULL}},
        {"pal_trns.png", {7, 3, 4, PNG_COLOR_TYPE_PALETTE, 0, idx, pal, 5, trns, 3, NULL}},
        {"gkey.png", {3, 2, 8, PNG_COLOR_TYPE_GRAY, 0, key, NULL, 0, NULL, 0, &k}},
    };
    int64_t exact = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct image img = {0};
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        CHECK(write_png(path, &files[i].s), "%s not written", files[i].name);
        CHECK(image_load_png(path, &img, err, sizeof err) == IMAGE_OK, "%s", err);
        exact += dataset_source_bytes(&img);
        image_free(&img);
    }
    snprintf(path, sizeof path, "%s/bad.png", dir); /* refused by the probe: not counted */
    FILE *f = fopen(path, "wb");
    if (f) fputs("not a png at all, just text", f), fclose(f);
    int64_t n = 0, src = 0, mp = 0;
    CHECK(dataset_folder_probe(dir, &n, &src, &mp, err, sizeof err) == DATASET_OK, "probe: %s",
          err);
    CHECK(n == 5 && src == exact && exact == 60 + 60 + 84 + 12 && mp == 30,
          "probe: %lld images, %lld bytes (decoded: %lld), %lld pixels", (long long)n,
          (long long)src, (long long)exact, (long long)mp);
    struct dataset *ds = NULL;
    struct dataset_report rep;
    CHECK(dataset_open_folder(&ds, dir, 3, 32, src, mp, &rep, NULL, NULL, err, sizeof err) ==
                  DATASET_OK &&
              dataset_count(ds) == 4 && rep.skipped == 1,
          "the folder at the probe's figures: %s", err);
    /* planned for the 5 listed (bad.png's record and index too), held for the 4 decoded */
    CHECK(ds && dataset_bytes(ds) + 16 + 4 == dataset_plan_bytes(0, 5, 3, 32, mp, src) &&
              dataset_bytes(ds) < dataset_plan_bytes(0, 4, 3, 32, mp, -1),
          "not held as its bytes, or not as planned: %lld held, %lld planned",
          (long long)dataset_bytes(ds), (long long)dataset_plan_bytes(0, 5, 3, 32, mp, src));
    dataset_free(ds);
    /* hostile chunk walks after a valid IHDR: a length past 2^31, one past the file's end,
     * more chunks than the walk reads: each stops, counting an alpha (the bound's safe side);
     * the 5x4 RGB file's bound is then 5 x 4 x 4 bytes */
    snprintf(path, sizeof path, "%s/rgb8.png", dir);
    size_t len = 0;
    unsigned char *whole = tu_slurp(path, &len);
    CHECK(whole && len > IMAGE_PNG_HEAD_BYTES, "rgb8.png not read back");
    for (int kind = 0; whole && kind < 3; kind++) {
        static const unsigned char big[12] = {0xff, 0xff, 0xff, 0xf0, 't', 'E', 'X', 't'};
        static const unsigned char past[12] = {0x00, 0x10, 0x00, 0x00, 't', 'E', 'X', 't'};
        static const unsigned char empty[12] = {0, 0, 0, 0, 't', 'E', 'X', 't', 0, 0, 0, 0};
        size_t extra = kind == 2 ? 300 * sizeof empty : 8;
        unsigned char *b = malloc(len + extra);
        if (!b) break;
        memcpy(b, whole, IMAGE_PNG_HEAD_BYTES);
        if (kind == 2)
            for (int i = 0; i < 300; i++) memcpy(b + IMAGE_PNG_HEAD_BYTES + 12 * i, empty, 12);
        else
            memcpy(b + IMAGE_PNG_HEAD_BYTES, kind ? past : big, 8);
        memcpy(b + IMAGE_PNG_HEAD_BYTES + extra, whole + IMAGE_PNG_HEAD_BYTES,
               len - IMAGE_PNG_HEAD_BYTES);
        char sub[320];
        snprintf(sub, sizeof sub, "%s/probe-hostile-%d", g_dir, kind);
        mkdir(sub, 0755);
        snprintf(path, sizeof path, "%s/x.png", sub);
        CHECK(write_bytes(path, b, len + extra), "%s not written", path);
        free(b);
        CHECK(dataset_folder_probe(sub, &n, &src, &mp, err, sizeof err) == DATASET_OK && n == 1 &&
                  src == 5 * 4 * 4 && mp == 20,
              "hostile walk %d: %lld images, %lld bytes, %lld pixels (%s)", kind, (long long)n,
              (long long)src, (long long)mp, err);
    }
    free(whole);
    snprintf(path, sizeof path, "%s/nothing", g_dir);
    mkdir(path, 0755);
    CHECK(dataset_folder_probe(path, &n, &src, &mp, err, sizeof err) == DATASET_ERR_EMPTY &&
              n == -1 && src == -1 && mp == -1,
          "an empty folder probed");
}

static void test_folder_bytes(void)
{
    char dir[600], err[1024];
    int64_t src, maxpix;
    /* grey files at 16 px, 8 and 16 bit: 1 and 2 bytes a sample */
    const struct held_kind grey[] = {{16, 16, 8, PNG_COLOR_TYPE_GRAY},
                                     {16, 16, 16, PNG_COLOR_TYPE_GRAY}};
    snprintf(dir, sizeof dir, "%s/held-grey", g_dir);
    int n = make_held(dir, grey, 2, 12, &src, &maxpix);
    CHECK(src == 12 * 256 * (1 + 2) && maxpix == 256, "grey source bytes %lld", (long long)src);
    check_held(dir, src, maxpix, n, 1, 16, 1); /* own size: the table */
    check_held(dir, src, maxpix, n, 3, 16, 1); /* grey replicated */
    check_held(dir, src, maxpix, n, 1, 23, 1); /* up */
    check_held(dir, src, maxpix, n, 1, 4, 0);  /* floats are fewer bytes */
    check_samples(dir, src, maxpix, n);
    /* every kind */
    const struct held_kind all[] = {
        {16, 16, 8, PNG_COLOR_TYPE_GRAY},       {16, 16, 8, PNG_COLOR_TYPE_RGB},
        {16, 16, 8, PNG_COLOR_TYPE_GRAY_ALPHA}, {16, 16, 8, PNG_COLOR_TYPE_RGB_ALPHA},
        {16, 16, 16, PNG_COLOR_TYPE_RGB},       {32, 16, 8, PNG_COLOR_TYPE_RGB},
        {16, 28, 2, PNG_COLOR_TYPE_GRAY},       {16, 16, 8, PNG_COLOR_TYPE_PALETTE},
    };
    snprintf(dir, sizeof dir, "%s/held-all", g_dir);
    n = make_held(dir, all, 8, 4, &src, &maxpix);
    CHECK(src == 4 * (256 * (1 + 3 + 2 + 4 + 6 + 3) + 32 * 16 * 3 + 16 * 28) && maxpix == 512,
          "source bytes %lld, %lld pixels", (long long)src, (long long)maxpix);
    check_held(dir, src, maxpix, n, 3, 16, 1); /* own size: the table or a conversion */
    check_held(dir, src, maxpix, n, 3, 24, 1); /* up */
    check_held(dir, src, maxpix, n, 1, 24, 1); /* to grey, up */
    check_held(dir, src, maxpix, n, 3, 6, 0);  /* floats are fewer bytes */
    /* grown since counted, or an image larger: refused, nothing held */
    struct dataset *ds = NULL;
    enum dataset_status rc =
        dataset_open_folder(&ds, dir, 3, 16, src - 1, maxpix, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !ds && strstr(err, "changed"), "grown folder: %d %s", rc,
          err);
    rc = dataset_open_folder(&ds, dir, 3, 16, src, 256, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && !ds && strstr(err, "changed"), "larger image: %d %s", rc,
          err);
    dataset_free(ds);
}

/* ---- IDX ---- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Write IDX bytes to path, gzip-compressed when gz. */
static int write_idx(const char *path, int gz, const unsigned char *b, size_t n)
{
    if (!gz) return write_bytes(path, b, n);
    gzFile f = gzopen(path, "wb");
    if (!f) return 0;
    int ok = gzwrite(f, b, (unsigned)n) == (int)n;
    return gzclose(f) == Z_OK && ok;
}

/* pixel (x, y) of synthetic image i: asymmetric in x so flips show */
static unsigned char idx_px(int i, int x, int y)
{
    return (unsigned char)((i * 7 + x * 3 + y) % 256);
}

/* A Fashion-MNIST-shaped pair of files in g_dir/<name>: n images, labels i % 10.
 * Tweaks: magic (0 = right), label_n (0 = n), cut (bytes dropped from the image file's end). */
static void make_fmnist(const char *name, int n, uint32_t magic, int label_n, size_t cut, int gz,
                        int bad_label)
{
    char dir[600], p[700];
    size_t isz = 16 + (size_t)n * 784, lsz;
    unsigned char *im = malloc(isz), *lb;
    if (!label_n) label_n = n;
    lsz = 8 + (size_t)label_n;
    lb = malloc(lsz);
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    mkdir(dir, 0755);
    put_be32(im, magic ? magic : 2051);
    put_be32(im + 4, (uint32_t)n);
    put_be32(im + 8, 28);
    put_be32(im + 12, 28);
    for (int i = 0; i < n; i++)
        for (int y = 0; y < 28; y++)
            for (int x = 0; x < 28; x++) im[16 + (size_t)i * 784 + y * 28 + x] = idx_px(i, x, y);
    put_be32(lb, 2049);
    put_be32(lb + 4, (uint32_t)label_n);
    for (int i = 0; i < label_n; i++) lb[8 + i] = (unsigned char)(i % 10);
    if (bad_label) lb[8 + label_n - 1] = 10;
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte%s", dir, gz ? ".gz" : "");
    write_idx(p, gz, im, isz - cut);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte%s", dir, gz ? ".gz" : "");
    write_idx(p, gz, lb, lsz);
    free(im);
    free(lb);
}

static void test_idx(void)
{
    struct dataset *ds = NULL;
    char err[1024];
    enum dataset_status rc;
    int bad = 0;

    make_fmnist("idx_ok", 5, 0, 0, 0, 1, 0);
    rc = dataset_open_fmnist(&ds, in_dir("idx_ok"), DATASET_FMNIST_TEST, 1, 32, DATASET_FIT_PAD,
                             err, sizeof err);
    CHECK(rc == DATASET_OK, "idx ok: %s", err);
    if (rc == DATASET_OK) {
        CHECK(dataset_count(ds) == 5 && dataset_size(ds) == 32 && dataset_label(ds, 4) == 4,
              "idx shape/labels");
        for (int i = 0; i < 5; i++) {
            const float *x = tu_image_at(ds, i);
            for (int y = 0; y < 32; y++)
                for (int xx = 0; xx < 32; xx++) {
                    float v = x[y * 32 + xx];
                    int in = y >= 2 && y < 30 && xx >= 2 && xx < 30;
                    float g = in ? (float)idx_px(i, xx - 2, y - 2) / 255.0f : 0.0f;
                    float want = in ? (float)(2.0 * g - 1.0) : -1.0f;
                    if (v != want) bad++;
                }
        }
        CHECK(bad == 0, "padded IDX pixels wrong (%d)", bad);
    }
    dataset_free(ds);
    ds = NULL;

    /* resize 28 -> 32 with three channels: bilinear, so values stay in range; channels equal */
    rc = dataset_open_fmnist(&ds, in_dir("idx_ok"), DATASET_FMNIST_TEST, 3, 32,
                             DATASET_FIT_RESIZE, err, sizeof err);
    CHECK(rc == DATASET_OK && dataset_channels(ds) == 3, "idx resize: %s", err);
    if (rc == DATASET_OK) {
        const float *x = tu_image_at(ds, 2);
        float lo = 1, hi = -1;
        bad = 0;
        for (int k = 0; k < 32 * 32; k++) {
            if (x[k] != x[1024 + k] || x[k] != x[2048 + k]) bad++;
            lo = x[k] < lo ? x[k] : lo;
            hi = x[k] > hi ? x[k] : hi;
        }
        CHECK(bad == 0 && lo >= -1.0f && hi <= 1.0f, "resized IDX channels/range");
        /* corner pixel of a bilinear upscale is the corner source pixel */
        CHECK(near(x[0], 2 * (idx_px(2, 0, 0) / 255.0) - 1, 1e-6), "resized corner %g", x[0]);
        /* held as bytes, resized as drawn: bit for bit the decode of the bytes up front */
        float grey[28 * 28], want[32 * 32];
        for (int y = 0; y < 28; y++)
            for (int xx = 0; xx < 28; xx++) grey[y * 28 + xx] = (float)idx_px(2, xx, y) / 255.0f;
        struct image im = {1, 28, 28, grey};
        CHECK(image_resize_square(want, &im, 32) == IMAGE_OK &&
                  memcmp(want, x, sizeof want) == 0,
              "a resized IDX image is not image_resize_square's of its bytes");
        /* its bytes: 28x28 and a label per image, an index per image, whatever the size */
        CHECK(dataset_bytes(ds) == dataset_plan_bytes(1, 5, 3, 32, -1, -1) &&
                  dataset_plan_bytes(1, 5, 3, 32, -1, -1) == 5 * (28 * 28 + 1 + 4),
              "Fashion-MNIST holds %lld bytes, planned %lld", (long long)dataset_bytes(ds),
              (long long)dataset_plan_bytes(1, 5, 3, 32, -1, -1));
        CHECK(dataset_split(ds, 2, 1, err, sizeof err) == DATASET_OK &&
                  dataset_bytes(ds) == dataset_plan_bytes(1, 5, 3, 32, -1, -1),
              "split Fashion-MNIST holds %lld bytes", (long long)dataset_bytes(ds));
    }
    dataset_free(ds);
    ds = NULL;

    /* at 8 px grey the floats (256 bytes) are fewer than the bytes (784): held as float */
    rc = dataset_open_fmnist(&ds, in_dir("idx_ok"), DATASET_FMNIST_TEST, 1, 8,
                             DATASET_FIT_RESIZE, err, sizeof err);
    CHECK(rc == DATASET_OK, "idx resize to 8: %s", err);
    if (rc == DATASET_OK) {
        const float *x = tu_image_at(ds, 3);
        float grey[28 * 28], want[8 * 8];
        for (int y = 0; y < 28; y++)
            for (int xx = 0; xx < 28; xx++) grey[y * 28 + xx] = (float)idx_px(3, xx, y) / 255.0f;
        struct image im = {1, 28, 28, grey};
        CHECK(x && image_resize_square(want, &im, 8) == IMAGE_OK &&
                  memcmp(want, x, sizeof want) == 0,
              "an 8 px IDX image is not image_resize_square's of its bytes");
        CHECK(dataset_bytes(ds) == 5 * (8 * 8 * 4 + 1 + 4) &&
                  dataset_plan_bytes(1, 5, 1, 8, -1, -1) == dataset_bytes(ds),
              "8 px Fashion-MNIST holds %lld bytes, planned %lld", (long long)dataset_bytes(ds),
              (long long)dataset_plan_bytes(1, 5, 1, 8, -1, -1));
    }
    dataset_free(ds);
    ds = NULL;

    /* uncompressed files are read too */
    make_fmnist("idx_plain", 2, 0, 0, 0, 0, 0);
    rc = dataset_open_fmnist(&ds, in_dir("idx_plain"), DATASET_FMNIST_TEST, 1, 28,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_OK && dataset_count(ds) == 2, "plain IDX: %s", err);
    dataset_free(ds);
    ds = NULL;

    make_fmnist("idx_magic", 2, 2050, 0, 0, 1, 0);
    rc = dataset_open_fmnist(&ds, in_dir("idx_magic"), DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && ds == NULL && strstr(err, "magic 2050") &&
              strstr(err, "t10k-images"),
          "bad magic: %d %s", rc, err);

    make_fmnist("idx_trunc", 3, 0, 0, 500, 1, 0);
    rc = dataset_open_fmnist(&ds, in_dir("idx_trunc"), DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && strstr(err, "truncated"), "truncated IDX: %d %s", rc, err);

    make_fmnist("idx_count", 3, 0, 2, 0, 1, 0);
    rc = dataset_open_fmnist(&ds, in_dir("idx_count"), DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && strstr(err, "labels"), "count mismatch: %d %s", rc, err);

    make_fmnist("idx_label", 3, 0, 0, 0, 1, 1);
    rc = dataset_open_fmnist(&ds, in_dir("idx_label"), DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_FORMAT && strstr(err, "label 10"), "label 10: %d %s", rc, err);

    /* a gzip stream cut short in the middle of the compressed data */
    {
        size_t n;
        char p[700];
        make_fmnist("idx_gzcut", 4, 0, 0, 0, 1, 0);
        snprintf(p, sizeof p, "%s/idx_gzcut/t10k-images-idx3-ubyte.gz", g_dir);
        unsigned char *b = tu_slurp(p, &n);
        if (b) write_bytes(p, b, n * 2 / 3);
        free(b);
        rc = dataset_open_fmnist(&ds, in_dir("idx_gzcut"), DATASET_FMNIST_TEST, 1, 32,
                                 DATASET_FIT_PAD, err, sizeof err);
        CHECK(rc == DATASET_ERR_FORMAT && strstr(err, "t10k-images"), "cut gzip: %d %s", rc, err);
    }

    rc = dataset_open_fmnist(&ds, in_dir("idx_none"), DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_IO && strstr(err, "idx_none"), "missing IDX: %d %s", rc, err);
    rc = dataset_open_fmnist(&ds, in_dir("idx_ok"), DATASET_FMNIST_TEST, 1, 24,
                             DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_ERR_ARG, "pad to 24 accepted");
}

/* Every prefix and byte flips of valid IDX files (plain and gzip): an error, never a crash or a
 * hang; a prefix never loads. */
static void test_idx_hostile(void)
{
    static const char *const files[] = {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    struct dataset *ds = NULL;
    char err[1024], p[700], q[720];
    int bad = 0, loaded = 0, tries = 0;
    make_fmnist("idx_hp", 2, 0, 0, 0, 0, 0);
    make_fmnist("idx_hz", 2, 0, 0, 0, 1, 0);
    for (int gz = 0; gz < 2; gz++) {
        for (int f = 0; f < 2; f++) {
            size_t n = 0;
            snprintf(p, sizeof p, "%s/%s/%s%s", g_dir, gz ? "idx_hz" : "idx_hp", files[f],
                     gz ? ".gz" : "");
            snprintf(q, sizeof q, "%s.orig", p);
            unsigned char *b = tu_slurp(p, &n), *c = b ? malloc(n + 1) : NULL;
            CHECK(b && c && rename(p, q) == 0, "%s: cannot set up", p);
            if (!b || !c) {
                free(b);
                free(c);
                continue;
            }
            /* every prefix of the image files (ends of items are where it matters); all of the
             * small label files */
            for (size_t len = 0; len < n; len += f == 0 && len > 40 ? 97 : 1) {
                write_bytes(p, b, len);
                enum dataset_status rc = dataset_open_fmnist(
                    &ds, in_dir(gz ? "idx_hz" : "idx_hp"), DATASET_FMNIST_TEST, 1, 28,
                    DATASET_FIT_PAD, err, sizeof err);
                tries++;
                if (rc == DATASET_OK) loaded++;
                else if (rc != DATASET_ERR_FORMAT || ds) bad++;
                dataset_free(ds);
                ds = NULL;
            }
            /* each header byte, and 100 random bytes, flipped */
            tu_seed(7 + (uint64_t)gz * 2 + (uint64_t)f);
            for (int t = 0; t < 120; t++) {
                size_t at = t < 20 ? (size_t)t : (size_t)((tu_rand() + 1.0) * 0.5 * (double)n);
                if (at >= n) at = n - 1;
                memcpy(c, b, n);
                c[at] ^= (unsigned char)(1u + (unsigned)((tu_rand() + 1.0) * 127.0));
                write_bytes(p, c, n);
                enum dataset_status rc = dataset_open_fmnist(
                    &ds, in_dir(gz ? "idx_hz" : "idx_hp"), DATASET_FMNIST_TEST, 1, 28,
                    DATASET_FIT_PAD, err, sizeof err);
                tries++;
                if (rc != DATASET_OK && (rc != DATASET_ERR_FORMAT || ds)) bad++;
                dataset_free(ds);
                ds = NULL;
            }
            rename(q, p);
            free(b);
            free(c);
        }
    }
    CHECK(bad == 0 && loaded == 0, "IDX prefixes/flips: %d of %d bad statuses, %d prefixes loaded",
          bad, tries, loaded);
}

/* An IDX pair in g_dir/<name>: the image file declares icount items and holds ihold of them, the
 * label file declares lcount and holds lhold (each gzip-compressed when gz). */
static void make_idx_pair(const char *name, uint32_t icount, uint32_t ihold, uint32_t lcount,
                          uint32_t lhold, int gz)
{
    char dir[600], p[700];
    size_t isz = 16 + (size_t)ihold * 784, lsz = 8 + (size_t)lhold;
    unsigned char *im = calloc(isz, 1), *lb = calloc(lsz, 1);
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    mkdir(dir, 0755);
    put_be32(im, 2051);
    put_be32(im + 4, icount);
    put_be32(im + 8, 28);
    put_be32(im + 12, 28);
    for (size_t k = 16; k < isz; k++) im[k] = (unsigned char)(k * 2654435761u >> 13);
    put_be32(lb, 2049);
    put_be32(lb + 4, lcount);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte%s", dir, gz ? ".gz" : "");
    CHECK(write_idx(p, gz, im, isz), "%s written", p);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte%s", dir, gz ? ".gz" : "");
    CHECK(write_idx(p, gz, lb, lsz), "%s written", p);
    free(im);
    free(lb);
}

/* Every count read from a file or a listing is bounded before it sizes an allocation. Each case
 * opens at 3 x 4096 x 4096, 201 MB per image, so sizing by the declared count would fail with
 * DATASET_ERR_NOMEM (or take terabytes) instead of giving the format error. */
static void test_bounds(void)
{
    struct dataset *ds = NULL;
    char err[1024], dir[600], p[700];
    enum dataset_status rc;
    static const struct {
        const char *name;
        uint32_t icount, ihold, lcount, lhold;
        int gz;
        const char *want;
    } idx[] = {
        /* plain files must hold exactly what the header declares */
        {"b_plain_10m", 10000000, 1, 10000000, 1, 0, "declares 10000000 items"},
        {"b_plain_short", 3, 2, 3, 3, 0, "the file holds"},
        /* gzip: 10 million items cannot come out of a few KiB */
        {"b_gz_10m", 10000000, 2, 10000000, 2, 1, "cannot hold that much"},
        /* gzip: plausible by size, but the stream ends after 3 of 5000 items */
        {"b_gz_short", 5000, 3, 5000, 5000, 1, "truncated"},
        {"b_count_max", 10000001, 1, 10000001, 1, 1, "DATASET_IDX_MAX_COUNT"},
        {"b_count_zero", 0, 0, 0, 0, 1, "declares 0 items"},
        {"b_labels_10m", 2, 2, 10000000, 2, 0, "labels-idx1-ubyte' declares 10000000"},
    };
    for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
        make_idx_pair(idx[k].name, idx[k].icount, idx[k].ihold, idx[k].lcount, idx[k].lhold,
                      idx[k].gz);
        err[0] = '\0';
        rc = dataset_open_fmnist(&ds, in_dir(idx[k].name), DATASET_FMNIST_TEST, 3, 4096,
                                 DATASET_FIT_RESIZE, err, sizeof err);
        CHECK(rc == DATASET_ERR_FORMAT && ds == NULL && strstr(err, idx[k].want),
              "%s: status %d (%s), expected a format error with '%s'", idx[k].name, rc, err,
              idx[k].want);
        dataset_free(ds);
        ds = NULL;
    }

    /* a FIFO as the label file is refused at once */
    {
        pid_t pid;
        int status = 0;
        make_idx_pair("b_fifo", 2, 2, 2, 2, 0);
        snprintf(p, sizeof p, "%s/b_fifo/t10k-labels-idx1-ubyte", g_dir);
        unlink(p);
        CHECK(mkfifo(p, 0600) == 0, "mkfifo");
        pid = fork();
        if (pid == 0) {
            alarm(10);
            rc = dataset_open_fmnist(&ds, in_dir("b_fifo"), DATASET_FMNIST_TEST, 1, 28,
                                     DATASET_FIT_PAD, err, sizeof err);
            _exit(rc == DATASET_ERR_IO && strstr(err, "not a regular file") ? 0 : 1);
        }
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0,
              "IDX labels as a FIFO: the loader %s",
              WIFSIGNALED(status) ? "hung" : "did not refuse it");
    }

    /* a folder of 1000 empty .png files at 3 x 4096 x 4096: nothing loads, nothing was sized by
     * the listing (it asked for 201 GB up front) */
    snprintf(dir, sizeof dir, "%s/b_many", g_dir);
    mkdir(dir, 0755);
    for (int i = 0; i < 1000; i++) {
        snprintf(p, sizeof p, "%s/x%04d.png", dir, i);
        write_bytes(p, "", 0);
    }
    rc = dataset_open_folder(&ds, dir, 3, 4096, -1, -1, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DATASET_ERR_EMPTY && ds == NULL && strstr(err, "all 1000"),
          "1000 empty files at 4096: status %d (%s)", rc, err);

    /* the listing limit, lowered for the test; a socket and a FIFO are passed over unopened */
    {
        size_t old = dataset_set_folder_limit(5);
        rc = dataset_open_folder(&ds, dir, 1, 8, -1, -1, NULL, NULL, NULL, err, sizeof err);
        CHECK(rc == DATASET_ERR_FORMAT && ds == NULL && strstr(err, "more than 5") &&
                  strstr(err, "DATASET_MAX_FILES"),
              "over the folder limit: status %d (%s)", rc, err);
        dataset_set_folder_limit(old);
    }
    {
        unsigned g[16];
        struct png_spec sg = {4, 4, 8, PNG_COLOR_TYPE_GRAY, 0, g, NULL, 0, NULL, 0, NULL};
        struct sockaddr_un sa;
        struct dataset_report rep;
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        for (int i = 0; i < 16; i++) g[i] = 7;
        snprintf(dir, sizeof dir, "%s/b_special", g_dir);
        mkdir(dir, 0755);
        snprintf(p, sizeof p, "%s/ok.png", dir);
        CHECK(write_png(p, &sg), "ok.png");
        snprintf(p, sizeof p, "%s/fifo.png", dir);
        CHECK(mkfifo(p, 0600) == 0, "mkfifo");
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        snprintf(p, sizeof p, "%s/sock.png", dir);
        CHECK(strlen(p) < sizeof sa.sun_path, "socket path too long");
        memcpy(sa.sun_path, p, strlen(p) < sizeof sa.sun_path ? strlen(p) : 0);
        CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind sock.png");
        rc = dataset_open_folder(&ds, dir, 1, 4, -1, -1, &rep, NULL, NULL, err, sizeof err);
        CHECK(rc == DATASET_OK && dataset_count(ds) == 1 && rep.found == 1,
              "FIFO + socket + one PNG: status %d, found %d (%s)", rc, rep.found, err);
        dataset_free(ds);
        ds = NULL;
        if (fd >= 0) close(fd);
    }
}

static void test_real_fmnist(void)
{
    struct dataset *ds = NULL;
    char err[1024];
    struct stat sb;
    if (stat(DATASET_FMNIST_DIR, &sb) != 0) {
        printf("test_dataset: %s not installed, real-data check skipped\n", DATASET_FMNIST_DIR);
        return;
    }
    enum dataset_status rc = dataset_open_fmnist(&ds, DATASET_FMNIST_DIR, DATASET_FMNIST_TEST, 1,
                                                 32, DATASET_FIT_PAD, err, sizeof err);
    CHECK(rc == DATASET_OK, "real Fashion-MNIST test split: %s", err);
    if (rc == DATASET_OK) {
        int per_class[10] = {0}, badlabel = 0;
        float lo = 2, hi = -2;
        CHECK(dataset_count(ds) == 10000 && dataset_size(ds) == 32, "count %d",
              dataset_count(ds));
        for (int i = 0; i < dataset_count(ds); i++) {
            int l = dataset_label(ds, i);
            if (l < 0 || l > 9) badlabel++;
            else per_class[l]++;
            const float *x = tu_image_at(ds, i);
            for (int k = 0; k < 32 * 32; k++) {
                lo = x[k] < lo ? x[k] : lo;
                hi = x[k] > hi ? x[k] : hi;
            }
            /* the 2-pixel border is padding */
            if (x[0] != -1.0f || x[31 * 32 + 31] != -1.0f || x[1 * 32 + 16] != -1.0f) badlabel++;
        }
        CHECK(badlabel == 0, "labels out of range or border not padded");
        for (int c = 0; c < 10; c++)
            CHECK(per_class[c] == 1000, "class %d has %d test images", c, per_class[c]);
        CHECK(lo == -1.0f && hi == 1.0f, "value range [%g, %g]", lo, hi);
        printf("test_dataset: %s test split: %d images, 10 classes of %d, values [%g, %g]\n",
               DATASET_FMNIST_DIR, dataset_count(ds), per_class[0], lo, hi);
    }
    dataset_free(ds);
    ds = NULL;
    rc = dataset_open_fmnist(&ds, DATASET_FMNIST_DIR, DATASET_FMNIST_TEST, 1, 32,
                             DATASET_FIT_RESIZE, err, sizeof err);
    CHECK(rc == DATASET_OK && dataset_count(ds) == 10000, "resized real split: %s", err);
    dataset_free(ds);
}

/* ---- split, order, batches, loader ---- */

static int is_perm(const int *p, int n)
{
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]) ok = 0;
        else seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

/* is x (C,S,S) image idx of ds, mirrored when flipped */
static int same_image(const struct dataset *ds, const float *x, int idx, int flipped)
{
    int s = dataset_size(ds), c = dataset_channels(ds);
    const float *src = tu_image_at(ds, idx);
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < s; y++)
            for (int xx = 0; xx < s; xx++) {
                size_t o = ((size_t)ch * s + y) * s;
                if (x[o + xx] != src[o + (flipped ? s - 1 - xx : xx)]) return 0;
            }
    return 1;
}

static void test_order_and_loader(void)
{
    struct dataset *ds = NULL;
    struct dataset_order *o = NULL;
    char err[1024];
    enum { N = 37, B = 8, VAL = 7 };
    int p0[N], p0b[N], p1[N], pseed[N];

    make_fmnist("idx_order", N, 0, 0, 0, 1, 0);
    CHECK(dataset_open_fmnist(&ds, in_dir("idx_order"), DATASET_FMNIST_TEST, 1, 28,
                              DATASET_FIT_PAD, err, sizeof err) == DATASET_OK,
          "order dataset: %s", err);
    if (!ds) return;

    /* split */
    CHECK(dataset_split(ds, VAL, 1234, err, sizeof err) == DATASET_OK, "split: %s", err);
    int T = dataset_train_count(ds);
    CHECK(T == N - VAL && dataset_val_count(ds) == VAL, "split sizes %d + %d", T,
          dataset_val_count(ds));
    {
        int seen[N] = {0}, asc = 1, val1[VAL];
        for (int j = 0; j < T; j++) {
            seen[dataset_train_index(ds, j)]++;
            if (j && dataset_train_index(ds, j) <= dataset_train_index(ds, j - 1)) asc = 0;
        }
        for (int j = 0; j < VAL; j++) {
            seen[dataset_val_index(ds, j)]++;
            val1[j] = dataset_val_index(ds, j);
            if (j && val1[j] <= val1[j - 1]) asc = 0;
        }
        int once = 1;
        for (int i = 0; i < N; i++) once &= seen[i] == 1;
        CHECK(once && asc, "split is not a partition in ascending order");
        CHECK(dataset_split(ds, VAL, 1234, err, sizeof err) == DATASET_OK &&
                  memcmp(val1, (int[VAL]){dataset_val_index(ds, 0), dataset_val_index(ds, 1),
                                          dataset_val_index(ds, 2), dataset_val_index(ds, 3),
                                          dataset_val_index(ds, 4), dataset_val_index(ds, 5),
                                          dataset_val_index(ds, 6)},
                         sizeof val1) == 0,
              "same seed, different split");
        CHECK(dataset_split(ds, VAL, 999, err, sizeof err) == DATASET_OK, "split 2");
        int same = 1;
        for (int j = 0; j < VAL; j++) same &= dataset_val_index(ds, j) == val1[j];
        CHECK(!same, "seed does not change the split");
        CHECK(dataset_split_fraction(ds, 0.2, 1234, err, sizeof err) == DATASET_OK &&
                  dataset_val_count(ds) == 7 && dataset_val_index(ds, 0) == val1[0],
              "split_fraction(0.2) of 37 is not the same 7");
        CHECK(dataset_split(ds, N, 1, err, sizeof err) == DATASET_ERR_ARG, "split of all");
        float vx[2 * 784];
        int vl[2];
        CHECK(dataset_val_batch(ds, 5, 2, vx, vl) == DATASET_OK &&
                  same_image(ds, vx + 784, val1[6], 0) && vl[1] == val1[6] % 10,
              "validation batch");
        CHECK(dataset_val_batch(ds, 6, 2, vx, vl) == DATASET_ERR_ARG, "val batch past the end");
    }

    /* epoch permutations */
    CHECK(dataset_epoch_perm(p0, ds, 5, 0) == DATASET_OK && dataset_epoch_perm(p0b, ds, 5, 0) ==
              DATASET_OK && dataset_epoch_perm(p1, ds, 5, 1) == DATASET_OK &&
              dataset_epoch_perm(pseed, ds, 6, 0) == DATASET_OK,
          "epoch perms");
    CHECK(is_perm(p0, T) && is_perm(p1, T) && is_perm(pseed, T), "an epoch is not a permutation");
    CHECK(!memcmp(p0, p0b, T * sizeof *p0), "same seed+epoch, different order");
    CHECK(memcmp(p0, p1, T * sizeof *p0) != 0, "epochs 0 and 1 have the same order");
    CHECK(memcmp(p0, pseed, T * sizeof *p0) != 0, "seeds 5 and 6 have the same order");
    {
        /* spec check of the definition: an independent Fisher-Yates from philox */
        int ref[N];
        for (int i = 0; i < T; i++) ref[i] = i;
        for (int i = T - 1; i > 0; i--) {
            uint32_t u = philox_u32_at(5, PHILOX_TAG_SHUFFLE, 1, 0, 0, (uint32_t)i);
            int j = (int)(((uint64_t)u * (uint64_t)(i + 1)) >> 32), t = ref[i];
            ref[i] = ref[j];
            ref[j] = t;
        }
        CHECK(!memcmp(ref, p1, T * sizeof *p1), "epoch 1 order differs from its definition");
    }

    /* the synchronous batch: sample k = step*B + i is element k % T of epoch k / T's order */
    CHECK(dataset_order_init(&o, ds, 5) == DATASET_OK, "order init");
    {
        float x[B * 784];
        int lab[B], bad = 0, flips = 0;
        for (int64_t step = 0; step < 12; step++) { /* 96 samples: 3+ epochs, crossing inside */
            CHECK(dataset_batch(o, step, B, 1, x, lab) == DATASET_OK, "batch %d", (int)step);
            for (int i = 0; i < B; i++) {
                int64_t k = step * B + i;
                int perm[N];
                dataset_epoch_perm(perm, ds, 5, k / T);
                int idx = dataset_train_index(ds, perm[k % T]);
                int fl = philox_uniform_at(5, PHILOX_TAG_FLIP, (uint64_t)k, 0, 0, 0) < 0.5f;
                flips += fl;
                if (!same_image(ds, x + (size_t)i * 784, idx, fl) || lab[i] != idx % 10) bad++;
                if (dataset_order_sample(o, k) != idx) bad++;
            }
        }
        CHECK(bad == 0, "batches do not follow the defined order/flip (%d)", bad);
        CHECK(flips > 20 && flips < 76, "flip count %d of 96", flips);
        CHECK(dataset_batch(o, 3, B, 0, x, NULL) == DATASET_OK &&
                  same_image(ds, x, dataset_order_sample(o, 24), 0),
              "flip off still flips");
        /* sample 0 of epoch 1 comes right after the last of epoch 0 (k = T) */
        int perm1[N];
        dataset_epoch_perm(perm1, ds, 5, 1);
        CHECK(dataset_order_sample(o, T) == dataset_train_index(ds, perm1[0]), "epoch boundary");
        int n = 0, flipped = 0;
        for (int64_t k = 0; k < 20000; k++, n++) flipped += dataset_sample_flipped(77, k);
        CHECK(flipped > 9700 && flipped < 10300, "flip rate %d / %d", flipped, n);
    }

    /* the loader: the same bytes as dataset_batch for every step, from any start */
    {
        struct dataset_loader *l = NULL;
        float x[B * 784], y[B * 784];
        int la[B], lb[B], bad = 0;
        CHECK(dataset_loader_init(&l, ds, 5, B, 1, 10, 3, err, sizeof err) == DATASET_OK,
              "loader init: %s", err);
        if (l) {
            for (int64_t s = 10; s < 60; s++) {
                if (dataset_loader_next(l, s, x, la) != DATASET_OK) bad++;
                dataset_batch(o, s, B, 1, y, lb);
                if (memcmp(x, y, sizeof x) || memcmp(la, lb, sizeof la)) bad++;
            }
            CHECK(bad == 0, "loader differs from dataset_batch in sequence (%d)", bad);
            /* jumps: forward (resume), back (retry), and repeat the same step */
            int64_t jumps[7] = {1000, 1001, 1002, 3, 4, 4, 0};
            bad = 0;
            for (int j = 0; j < 7; j++) {
                if (dataset_loader_next(l, jumps[j], x, NULL) != DATASET_OK) bad++;
                dataset_batch(o, jumps[j], B, 1, y, NULL);
                if (memcmp(x, y, sizeof x)) bad++;
            }
            CHECK(bad == 0, "loader differs after a jump (%d)", bad);
            /* a random walk: mostly the next step, sometimes a jump anywhere */
            tu_seed(3);
            int64_t s = 0;
            bad = 0;
            for (int t = 0; t < 300; t++) {
                double r = tu_rand();
                s = r < 0.6 ? s + 1 : (int64_t)((r + 1.0) * 200.0);
                if (dataset_loader_next(l, s, x, la) != DATASET_OK) bad++;
                dataset_batch(o, s, B, 1, y, lb);
                if (memcmp(x, y, sizeof x) || memcmp(la, lb, sizeof la)) bad++;
            }
            CHECK(bad == 0, "loader differs on a random walk of steps (%d)", bad);
            CHECK(dataset_loader_next(l, -1, x, NULL) == DATASET_ERR_ARG, "negative step");
        }
        dataset_loader_free(l);
        l = NULL;

        /* depth 1, batch larger than the training set, no flip; freed while the ring is full */
        enum { BB = 50 };
        float *bx = malloc(sizeof(float) * BB * 784), *by = malloc(sizeof(float) * BB * 784);
        CHECK(dataset_loader_init(&l, ds, 9, BB, 0, 0, 1, err, sizeof err) == DATASET_OK,
              "loader 2: %s", err);
        struct dataset_order *o9 = NULL;
        dataset_order_init(&o9, ds, 9);
        bad = 0;
        for (int64_t s = 0; s < 6 && l; s++) {
            dataset_loader_next(l, s, bx, NULL);
            dataset_batch(o9, s, BB, 0, by, NULL);
            if (memcmp(bx, by, sizeof(float) * BB * 784)) bad++;
        }
        CHECK(bad == 0, "big-batch loader differs (%d)", bad);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        dataset_loader_free(l);
        dataset_order_free(o9);
        free(bx);
        free(by);
        CHECK(dataset_loader_init(&l, ds, 9, 0, 0, 0, 2, err, sizeof err) == DATASET_ERR_ARG &&
                  l == NULL,
              "batch 0 accepted");
    }
    dataset_order_free(o);
    dataset_free(ds);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--probe-png")) return png_probe_main(argv[2]);
    snprintf(g_dir, sizeof g_dir, "/tmp/ddpmd_dataset_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_decode_all_types();
    test_corrupt_pngs();
    test_hostile_pngs();
    test_resize();
    test_channels();
    test_save();
    test_grid();
    test_folder();
    test_folder_bytes();
    test_folder_probe();
    test_idx();
    test_bounds();
    test_idx_hostile();
    test_real_fmnist();
    test_order_and_loader();
    rm_rf(g_dir, 0);
    return tu_finish("test_dataset");
}
