/* test_interop.c - weights in and out: a PyTorch checkpoint of the seed script, converted by
 * tools/convert_seed_ckpt.py, reproduces PyTorch's output in ddpmd; a ddpm checkpoint exported by
 * `ddpmd export --diffusers` loads strictly into a UNet2DModel and reproduces ddpmd's output.
 * Needs Debian's python3-torch (installed by scripts/install-deps.sh).
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cli.h"
#include "image.h"
#include "generate.h"
#include "test_util.h"
#include "train.h"

static int run(const char *cmd)
{
    int rc = system(cmd);
    if (rc) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* forward of a loaded sample job on fixed x, t */
static int forward(struct generator *j, const float *x, const float *t, float *out)
{
    return exec_upload(j->e, j->io.x, x) || exec_upload(j->e, j->io.t, t) ||
           exec_forward(j->e, NULL) || exec_download(j->e, j->io.out, out);
}

static void seed_import(const char *dir)
{
    char cmd[1024], path[512], err[512];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/parity/make_seed_ckpt.py %s >/dev/null && /usr/bin/python3 "
             "tools/convert_seed_ckpt.py %s/ckpt.pt %s/seed.safetensors >/dev/null",
             dir, dir, dir);
    if (run(cmd)) {
        CHECK(0, "python3-torch is needed (scripts/install-deps.sh installs it)");
        return;
    }
    struct safetensors *ref = NULL, *st = NULL;
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    CHECK(safetensors_open(&ref, path, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/seed.safetensors", dir);
    /* a state_dict without a ddpmd spec: opened without one, weights applied by name */
    CHECK(checkpoint_open(&st, path, NULL, NULL, err, sizeof err) == 0, "%s", err);
    if (!ref || !st) goto out;
    struct unet_config c;
    unet_config_default(&c, UNET_SEED);
    c.in_channels = c.out_channels = 1;
    c.image_size = 16;
    c.base = 8;
    c.time_dim = 32;
    struct generator j;
    CHECK(generate_init(&j, &c, 2, 2, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(checkpoint_load_generator(&j, st, 0, err, sizeof err) == 0, "load: %s", err);
    float x[512], t[2], y[512], want[512];
    CHECK(safetensors_read_f32(ref, "x", x, 512, err, sizeof err) == 0 &&
              safetensors_read_f32(ref, "t", t, 2, err, sizeof err) == 0 &&
              safetensors_read_f32(ref, "out", want, 512, err, sizeof err) == 0,
          "ref: %s", err);
    CHECK(forward(&j, x, t, y) == 0, "forward");
    double rel = tu_rel_err_f(y, want, 512);
    printf("seed import: output rel err vs PyTorch %.3g\n", rel);
    CHECK(rel <= 1e-5, "imported seed model differs from PyTorch: %.3g", rel);
    /* asking for EMA weights that the file does not have is a clear error */
    CHECK(checkpoint_load_generator(&j, st, 1, err, sizeof err) != 0 && strstr(err, "ema."),
          "missing EMA: '%s'", err);
    generate_free(&j);
out:
    safetensors_free(ref);
    safetensors_free(st);
}

static void diffusers_export(const char *dir)
{
    char data[512], out[512], ckpt[600], exp[512], err[512];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(exp, sizeof exp, "%s/export", dir);
    /* a checkpoint of a small ddpm model after 2 steps on 8 generated images */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", data);
    run(cmd);
    float img[256];
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < 256; k++) img[k] = ((k * (i + 3)) % 17) / 8.5f - 1.0f;
        char p[600];
        snprintf(p, sizeof p, "%s/%d.png", data, i);
        image_save_png(p, img, 1, 16, 16, err, sizeof err);
    }
    struct train_spec s;
    spec_defaults(&s);
    s.model.in_channels = s.model.out_channels = 1;
    s.model.image_size = 16;
    s.model.n_levels = 2;
    s.model.channels[0] = 16;
    s.model.channels[1] = 32;
    s.model.layers_per_block = 1;
    s.model.attn_res[0] = 8;
    s.model.groups = 8;
    s.model.attn_head_dim = 16;
    snprintf(s.dataset, sizeof s.dataset, "%s", data);
    s.batch = 2;
    s.steps = 2;
    s.samples = 1;
    s.optim.warmup = 0;
    s.optim.ema_decay = 0.5f;
    struct train_opts o = {.out_dir = out, .quiet = 1};
    CHECK(train_run(&s, &o, err, sizeof err) == TRAIN_DONE, "train: %s", err);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-00000002.safetensors", out);
    char *argv[] = {"ddpmd", "export", "--diffusers", exp, ckpt, NULL};
    CHECK(cli_main(5, argv) == 0, "ddpmd export failed");
    /* ddpmd's own output of the EMA weights on a fixed input, for the Python side */
    struct safetensors *st = NULL;
    CHECK(checkpoint_open(&st, ckpt, NULL, NULL, err, sizeof err) == 0, "%s", err);
    struct generator j;
    CHECK(generate_init(&j, &s.model, 2, 2, NULL, err, sizeof err) == 0 &&
              checkpoint_load_generator(&j, st, 1, err, sizeof err) == 0,
          "%s", err);
    float x[512], t[2] = {3.0f, 777.0f}, y[512];
    for (int k = 0; k < 512; k++) x[k] = sinf(0.37f * k);
    CHECK(forward(&j, x, t, y) == 0, "forward");
    struct safetensors_writer *w;
    safetensors_writer_init(&w);
    int64_t xs[4] = {2, 1, 16, 16}, ts[1] = {2};
    safetensors_writer_add(w, "x", ST_F32, 4, xs, x);
    safetensors_writer_add(w, "t", ST_F32, 1, ts, t);
    safetensors_writer_add(w, "out", ST_F32, 4, xs, y);
    safetensors_writer_meta(w, "format", "pt");
    char p[600];
    snprintf(p, sizeof p, "%s/ref.safetensors", exp);
    CHECK(safetensors_writer_save(w, p, err, sizeof err) == 0, "%s", err);
    safetensors_writer_free(w);
    generate_free(&j);
    safetensors_free(st);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/parity/check_export.py %s", exp);
    CHECK(run(cmd) == 0, "the exported model does not load into UNet2DModel or differs");
}

int main(void)
{
    char dir[] = "/tmp/ddpmd-test-interop-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    seed_import(dir);
    diffusers_export(dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run(cmd);
    return tu_finish("test_interop");
}
