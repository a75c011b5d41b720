/* export.c - a checkpoint as diffusers' UNet2DModel (see export.h): config.json and
 * diffusion_pytorch_model.safetensors in a folder (`ddpmd export --diffusers`), or those two in a
 * tar file (GET /checkpoints/{id}?format=diffusers), written with libarchive.
 */
#include "export.h"

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fsio.h"
#include "safetensors.h"
#include "unet.h"

/* diffusers' UNet2DModel config.json for a ddpm-preset model */
static char *diffusers_config(const struct unet_config *c)
{
    cJSON *r = cJSON_CreateObject(), *down = cJSON_CreateArray(), *up = cJSON_CreateArray();
    cJSON_AddStringToObject(r, "_class_name", "UNet2DModel");
    cJSON_AddStringToObject(r, "_diffusers_version", "0.21.4");
    cJSON_AddStringToObject(r, "act_fn", "silu");
    cJSON_AddBoolToObject(r, "add_attention", 1);
    if (c->attn_head_dim)
        cJSON_AddNumberToObject(r, "attention_head_dim", c->attn_head_dim);
    else
        cJSON_AddNullToObject(r, "attention_head_dim");
    cJSON_AddItemToObject(r, "block_out_channels", cJSON_CreateIntArray(c->channels, c->n_levels));
    cJSON_AddBoolToObject(r, "center_input_sample", 0);
    cJSON_AddNullToObject(r, "class_embed_type");
    for (int i = 0; i < c->n_levels; i++) {
        int res = c->image_size >> i, attn = 0, res_up = c->image_size >> (c->n_levels - 1 - i);
        int attn_up = 0;
        for (int k = 0; k < c->n_attn; k++) {
            attn |= c->attn_res[k] == res;
            attn_up |= c->attn_res[k] == res_up;
        }
        cJSON_AddItemToArray(down, cJSON_CreateString(attn ? "AttnDownBlock2D" : "DownBlock2D"));
        cJSON_AddItemToArray(up, cJSON_CreateString(attn_up ? "AttnUpBlock2D" : "UpBlock2D"));
    }
    cJSON_AddItemToObject(r, "down_block_types", down);
    cJSON_AddNumberToObject(r, "downsample_padding", 0);
    cJSON_AddStringToObject(r, "downsample_type", "conv");
    cJSON_AddNumberToObject(r, "dropout", c->dropout);
    cJSON_AddBoolToObject(r, "flip_sin_to_cos", c->flip_sin_to_cos);
    cJSON_AddNumberToObject(r, "freq_shift", c->freq_shift);
    cJSON_AddNumberToObject(r, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(r, "layers_per_block", c->layers_per_block);
    cJSON_AddNumberToObject(r, "mid_block_scale_factor", 1);
    cJSON_AddNumberToObject(r, "norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(r, "norm_num_groups", c->groups);
    cJSON_AddNullToObject(r, "num_class_embeds");
    cJSON_AddNumberToObject(r, "out_channels", c->out_channels);
    cJSON_AddStringToObject(r, "resnet_time_scale_shift", "default");
    cJSON_AddNumberToObject(r, "sample_size", c->image_size);
    cJSON_AddStringToObject(r, "time_embedding_type", "positional");
    cJSON_AddItemToObject(r, "up_block_types", up);
    cJSON_AddStringToObject(r, "upsample_type", "conv");
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

int export_diffusers(const char *ckpt, const char *dir, int raw, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX], e2[512];
    struct safetensors *st = NULL;
    struct train_spec spec;
    struct safetensors_writer *w = NULL;
    char *cfg = NULL;
    int rc = -1;
    if (checkpoint_open(&st, ckpt, &spec, NULL, e2, sizeof e2)) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    if (spec.model.preset != UNET_DDPM) {
        snprintf(err, errlen, "only the ddpm preset has a diffusers equivalent (UNet2DModel)");
        goto out;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        goto out;
    }
    struct graph g;
    struct unet_io io;
    graph_init(&g);
    unet_build(&g, &spec.model, 1, &io);
    if (safetensors_writer_init(&w)) {
        snprintf(err, errlen, "out of memory");
        graph_free(&g);
        goto out;
    }
    for (int i = 0; i < g.n_tensors && !g.status; i++) {
        const struct tensor *t = g.tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        snprintf(path, sizeof path, "%s%s", raw ? "" : "ema.", t->name);
        const struct st_tensor *s;
        if (safetensors_find(st, path, &s)) {
            snprintf(err, errlen, "%s has no tensor %s", ckpt, path);
            graph_free(&g);
            goto out;
        }
        safetensors_writer_add(w, t->name, ST_F32, s->ndim, s->shape, s->data);
    }
    graph_free(&g);
    safetensors_writer_meta(w, "format", "pt");
    snprintf(path, sizeof path, "%s/" EXPORT_WEIGHTS, dir);
    if (safetensors_writer_save(w, path, e2, sizeof e2)) {
        snprintf(err, errlen, "%s", e2);
        goto out;
    }
    cfg = diffusers_config(&spec.model);
    snprintf(path, sizeof path, "%s/" EXPORT_CONFIG, dir);
    struct fsio_buf b[2] = {{cfg, cfg ? strlen(cfg) : 0}, {"\n", 1}};
    if (!cfg || fsio_write_atomic(path, b, 2, e2, sizeof e2)) { /* temp, fsync, rename */
        snprintf(err, errlen, "%s", cfg ? e2 : "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(cfg);
    safetensors_writer_free(w);
    safetensors_free(st);
    return rc;
}

/* appends the regular file dir/name to the archive as name */
static int tar_add(struct archive *a, const char *dir, const char *name, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX], buf[65536];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = fsio_open_regular(path, O_RDONLY, err, errlen), rc = -1;
    struct stat sb;
    if (fd < 0) return -1;
    struct archive_entry *e = archive_entry_new();
    if (!e || fstat(fd, &sb)) {
        snprintf(err, errlen, "cannot read %s", name);
        goto out;
    }
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, sb.st_size);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, sb.st_mtim.tv_sec, 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) goto aerr;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        if (archive_write_data(a, buf, (size_t)n) != n) goto aerr;
    if (n < 0) {
        snprintf(err, errlen, "cannot read %s: %s", name, strerror(errno));
        goto out;
    }
    rc = 0;
    goto out;
aerr:
    snprintf(err, errlen, "tar: %s", archive_error_string(a));
out:
    archive_entry_free(e);
    close(fd);
    return rc;
}

int export_diffusers_tar(const char *ckpt, const char *tmp_dir, int raw, int *fd_out,
                         char *err, size_t errlen)
{
    /* room after the folder for its longest file name */
    char dir[FSIO_PATH_MAX - 64], tar[FSIO_PATH_MAX], p[FSIO_PATH_MAX];
    int rc = -1;
    *fd_out = -1;
    if (snprintf(dir, sizeof dir, "%s/export-XXXXXX", tmp_dir) >= (int)sizeof dir ||
        !mkdtemp(dir)) {
        snprintf(err, errlen, "cannot make a temporary folder: %s", strerror(errno));
        return -1;
    }
    snprintf(tar, sizeof tar, "%s/unet.tar", dir);
    struct archive *a = NULL;
    if (export_diffusers(ckpt, dir, raw, err, errlen)) goto out;
    a = archive_write_new();
    if (!a || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_open_filename(a, tar) != ARCHIVE_OK) {
        snprintf(err, errlen, "tar: %s", a ? archive_error_string(a) : "out of memory");
        goto out;
    }
    if (tar_add(a, dir, EXPORT_CONFIG, err, errlen) || tar_add(a, dir, EXPORT_WEIGHTS, err, errlen))
        goto out;
    if (archive_write_close(a) != ARCHIVE_OK) {
        snprintf(err, errlen, "tar: %s", archive_error_string(a));
        goto out;
    }
    *fd_out = open(tar, O_RDONLY | O_CLOEXEC);
    if (*fd_out < 0) {
        snprintf(err, errlen, "cannot open the tar: %s", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (a) archive_write_free(a);
    /* the open descriptor keeps the tar's bytes; the names go at once */
    const char *names[] = {EXPORT_CONFIG, EXPORT_WEIGHTS, "unet.tar"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    return rc;
}
