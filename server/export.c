/* export.c - a checkpoint as a diffusers DDPMPipeline (see export.h): the folder
 * (`ddpmd export --diffusers`), or its files in a tar written with libarchive once per checkpoint
 * and kept beside it (GET /checkpoints/{id}?format=diffusers streams that file).
 */
#include "export.h"

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ddpm.h"
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

/* diffusers' DDPMScheduler scheduler_config.json for the job's diffusion: the betas (linear, or
 * cosine as squaredcos_cap_v2: ddpm.c's s = 0.008, capped at 0.999), the prediction type, and
 * the sampler defaults ddpmd shares with diffusers (sampler.c: x0 clipped to [-1, 1],
 * fixed_small variance, leading spacing, steps_offset 0) */
static char *scheduler_config(const struct train_spec *s)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "_class_name", "DDPMScheduler");
    cJSON_AddStringToObject(r, "_diffusers_version", "0.21.4");
    cJSON_AddNumberToObject(r, "beta_end", s->beta_end);
    cJSON_AddStringToObject(r, "beta_schedule",
                            s->beta_schedule == DDPM_BETA_COSINE ? "squaredcos_cap_v2" : "linear");
    cJSON_AddNumberToObject(r, "beta_start", s->beta_start);
    cJSON_AddBoolToObject(r, "clip_sample", 1);
    cJSON_AddNumberToObject(r, "clip_sample_range", 1.0);
    cJSON_AddNumberToObject(r, "num_train_timesteps", s->timesteps);
    cJSON_AddStringToObject(r, "prediction_type",
                            s->prediction == SPEC_PRED_V ? "v_prediction" : "epsilon");
    cJSON_AddNumberToObject(r, "steps_offset", 0);
    cJSON_AddBoolToObject(r, "thresholding", 0);
    cJSON_AddStringToObject(r, "timestep_spacing", "leading");
    cJSON_AddNullToObject(r, "trained_betas");
    cJSON_AddStringToObject(r, "variance_type", "fixed_small");
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

static char *model_index(void)
{
    cJSON *r = cJSON_CreateObject();
    const char *sched[] = {"diffusers", "DDPMScheduler"}, *unet[] = {"diffusers", "UNet2DModel"};
    cJSON_AddStringToObject(r, "_class_name", "DDPMPipeline");
    cJSON_AddStringToObject(r, "_diffusers_version", "0.21.4");
    cJSON_AddItemToObject(r, "scheduler", cJSON_CreateStringArray(sched, 2));
    cJSON_AddItemToObject(r, "unet", cJSON_CreateStringArray(unet, 2));
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}

/* dir/name := text + "\n", atomically */
static int write_json(const char *dir, const char *name, char *text, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX], e2[512];
    struct fsio_buf b[2] = {{text, text ? strlen(text) : 0}, {"\n", 1}};
    int rc = 0;
    if (!text) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    } else if (fsio_path(path, sizeof path, e2, sizeof e2, "%s/%s", dir, name) ||
               fsio_write_atomic(path, b, 2, e2, sizeof e2)) { /* temp, fsync, rename */
        snprintf(err, errlen, "%s", e2);
        rc = -1;
    }
    free(text);
    return rc;
}

static int mkdir_in(const char *dir, const char *sub, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX];
    if (snprintf(path, sizeof path, "%s%s%s", dir, *sub ? "/" : "", sub) >= (int)sizeof path) {
        snprintf(err, errlen, "path too long: %s/%s", dir, sub);
        return -1;
    }
    if (mkdir(path, 0777) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int export_diffusers(const char *ckpt, const char *dir, int raw, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX], e2[512];
    struct safetensors *st = NULL;
    struct train_spec spec;
    struct safetensors_writer *w = NULL;
    int rc = EXPORT_FAILED;
    if (checkpoint_open(&st, ckpt, &spec, NULL, e2, sizeof e2)) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    if (spec.model.preset != UNET_DDPM) {
        snprintf(err, errlen, "only the ddpm preset has a diffusers equivalent (UNet2DModel)");
        rc = EXPORT_UNSUPPORTED;
        goto out;
    }
    if (mkdir_in(dir, "", err, errlen) || mkdir_in(dir, "unet", err, errlen) ||
        mkdir_in(dir, "scheduler", err, errlen))
        goto out;
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
    /* the UNet first, the pipeline's index last: a folder with model_index.json is whole */
    if (write_json(dir, EXPORT_CONFIG, diffusers_config(&spec.model), err, errlen) ||
        write_json(dir, EXPORT_SCHEDULER, scheduler_config(&spec), err, errlen) ||
        write_json(dir, EXPORT_INDEX, model_index(), err, errlen))
        goto out;
    rc = 0;
out:
    safetensors_writer_free(w);
    safetensors_free(st);
    return rc;
}

/* appends the regular file dir/name to the archive as name */
static int tar_add(struct archive *a, const char *dir, const char *name, char *err, size_t errlen)
{
    char path[FSIO_PATH_MAX], buf[65536];
    if (fsio_path(path, sizeof path, err, errlen, "%s/%s", dir, name)) return -1;
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

int export_cache_path(const char *ckpt, char *out, size_t n)
{
    static const char ext[] = ".safetensors";
    size_t l = strlen(ckpt), e = sizeof ext - 1;
    if (l <= e || strcmp(ckpt + l - e, ext) != 0) return -1;
    return snprintf(out, n, "%.*s" EXPORT_CACHE_SUFFIX, (int)(l - e), ckpt) < (int)n ? 0 : -1;
}

void export_cache_remove(const char *ckpt)
{
    char p[FSIO_PATH_MAX];
    if (export_cache_path(ckpt, p, sizeof p) == 0) unlink(p);
}

/* the builds running: owner and cache path of each (bounded by EXPORT_BUILDS_MAX) */
static pthread_mutex_t builds_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char owner[128];
    char path[FSIO_PATH_MAX];
} builds[EXPORT_BUILDS_MAX];
static int n_builds;

/* the folders export_hold_dir holds (under builds_mu) */
static char holds[EXPORT_HOLDS_MAX][FSIO_PATH_MAX];
static int n_holds;

static int is_under(const char *path, const char *dir)
{
    return strncmp(path, dir, strlen(dir)) == 0;
}

int export_hold_dir(const char *dir)
{
    pthread_mutex_lock(&builds_mu);
    int busy = n_holds >= EXPORT_HOLDS_MAX || strlen(dir) >= FSIO_PATH_MAX;
    for (int i = 0; i < n_builds && !busy; i++) busy = is_under(builds[i].path, dir);
    if (!busy) snprintf(holds[n_holds++], FSIO_PATH_MAX, "%s", dir);
    pthread_mutex_unlock(&builds_mu);
    return busy ? EXPORT_BUSY : 0;
}

void export_release_dir(const char *dir)
{
    pthread_mutex_lock(&builds_mu);
    for (int i = 0; i < n_holds; i++)
        if (strcmp(holds[i], dir) == 0) {
            memcpy(holds[i], holds[--n_holds], FSIO_PATH_MAX);
            break;
        }
    pthread_mutex_unlock(&builds_mu);
}

static int build_begin(const char *owner, const char *path)
{
    int mine = 0, same = 0, held = 0;
    pthread_mutex_lock(&builds_mu);
    for (int i = 0; i < n_builds; i++) {
        mine += strcmp(builds[i].owner, owner) == 0;
        same |= strcmp(builds[i].path, path) == 0;
    }
    for (int i = 0; i < n_holds; i++) held |= is_under(path, holds[i]);
    int ok = !held && !same && mine < EXPORT_BUILDS_PER_OWNER && n_builds < EXPORT_BUILDS_MAX;
    if (ok) {
        snprintf(builds[n_builds].owner, sizeof builds[n_builds].owner, "%s", owner);
        snprintf(builds[n_builds].path, sizeof builds[n_builds].path, "%s", path);
        n_builds++;
    }
    pthread_mutex_unlock(&builds_mu);
    return ok ? 0 : -1;
}

static void build_end(const char *path)
{
    pthread_mutex_lock(&builds_mu);
    for (int i = 0; i < n_builds; i++)
        if (strcmp(builds[i].path, path) == 0) {
            builds[i] = builds[--n_builds];
            break;
        }
    pthread_mutex_unlock(&builds_mu);
}

/* the pipeline folder in a temporary beside the cache, then the tar to a temporary name,
 * fsynced and renamed over cache */
static int build_tar(const char *ckpt, const char *cache, char *err, size_t errlen)
{
    static const char *const files[] = {EXPORT_INDEX, EXPORT_SCHEDULER, EXPORT_CONFIG,
                                        EXPORT_WEIGHTS};
    /* room after the folder for its longest file name */
    char dir[FSIO_PATH_MAX - 64], tmp[FSIO_PATH_MAX + 16], p[FSIO_PATH_MAX];
    int rc = EXPORT_FAILED, fd = -1;
    struct archive *a = NULL;
    if (snprintf(dir, sizeof dir, "%s.build-XXXXXX", cache) >= (int)sizeof dir || !mkdtemp(dir)) {
        snprintf(err, errlen, "cannot make a temporary folder beside %s: %s", cache,
                 strerror(errno));
        return EXPORT_FAILED;
    }
    snprintf(tmp, sizeof tmp, "%s" FSIO_TMP_INFIX "XXXXXX", cache);
    int r = export_diffusers(ckpt, dir, 0, err, errlen);
    if (r) {
        rc = r;
        goto out;
    }
    fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        tmp[0] = 0;
        goto out;
    }
    a = archive_write_new();
    if (!a || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_open_fd(a, fd) != ARCHIVE_OK) {
        snprintf(err, errlen, "tar: %s", a ? archive_error_string(a) : "out of memory");
        goto out;
    }
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (tar_add(a, dir, files[i], err, errlen)) goto out;
    if (archive_write_close(a) != ARCHIVE_OK) {
        snprintf(err, errlen, "tar: %s", archive_error_string(a));
        goto out;
    }
    if (fsync(fd)) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, cache)) {
        snprintf(err, errlen, "cannot rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    tmp[0] = 0;
    rc = EXPORT_OK;
out:
    if (a) archive_write_free(a);
    if (fd >= 0) close(fd);
    if (tmp[0]) unlink(tmp);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (!fsio_path(p, sizeof p, NULL, 0, "%s/%s", dir, files[i])) unlink(p);
    if (!fsio_path(p, sizeof p, NULL, 0, "%s/unet", dir)) rmdir(p);
    if (!fsio_path(p, sizeof p, NULL, 0, "%s/scheduler", dir)) rmdir(p);
    rmdir(dir);
    return rc;
}

int export_cache_open(const char *ckpt, const char *owner, int *fd_out, long long *size,
                      char *err, size_t errlen)
{
    char cache[FSIO_PATH_MAX];
    struct stat sb;
    *fd_out = -1;
    if (export_cache_path(ckpt, cache, sizeof cache)) {
        snprintf(err, errlen, "not a checkpoint path: %s", ckpt);
        return EXPORT_FAILED;
    }
    int fd = open(cache, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (build_begin(owner, cache)) {
            snprintf(err, errlen, "exports are being built: try again in a moment");
            return EXPORT_BUSY;
        }
        int rc = build_tar(ckpt, cache, err, errlen);
        build_end(cache);
        if (rc) return rc;
        /* the checkpoint pruned while the tar was built: its pruning came before the rename */
        if (access(ckpt, F_OK) != 0) {
            unlink(cache);
            snprintf(err, errlen, "the checkpoint was removed");
            return EXPORT_FAILED;
        }
        fd = open(cache, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            snprintf(err, errlen, "cannot open %s: %s", cache, strerror(errno));
            return EXPORT_FAILED;
        }
    }
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(err, errlen, "%s is not a regular file", cache);
        return EXPORT_FAILED;
    }
    *fd_out = fd;
    *size = (long long)sb.st_size;
    return EXPORT_OK;
}
