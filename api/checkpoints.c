/* checkpoints.c - a job's checkpoints: GET /jobs/{id}/checkpoints, GET /checkpoints/{id}
 * (ranges, ETag, or diffusers' layout in a tar) and POST /checkpoints (an uploaded safetensors
 * file checked against its model and kept as a job of kind import).
 */
#define _GNU_SOURCE
#include "routes.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "export.h"
#include "safetensors.h"
#include "spec.h"
#include "upload.h"
#include "fsio.h"
#include "parse.h"
#include "pool.h"
#include "utf8.h"

enum MHD_Result h_checkpoints(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    char path[FSIO_PATH_MAX];
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "checkpoints");
    int64_t steps[1024]; /* 8 KiB of this request's stack: the newest 1,024 are listed */
    int n = api_checkpoint_steps(c->a, c->param, steps, (int)(sizeof steps / sizeof steps[0]));
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (pool_checkpoint_path(c->a->cfg.pool, c->param, steps[i], path, sizeof path) ||
            stat(path, &sb))
            continue;
        char id[64], url[160];
        snprintf(id, sizeof id, "%s-%" PRId64, c->param, steps[i]);
        api_link(c->a, url, sizeof url, "/checkpoints/%s", id);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "id", id);
        cJSON_AddNumberToObject(e, "step", (double)steps[i]);
        cJSON_AddNumberToObject(e, "bytes", (double)sb.st_size);
        cJSON_AddStringToObject(e, "url", url);
        http_json_put_array(arr, e);
    }
    return http_send_json(c, 200, o, NULL, NULL);
}

/* ?format=diffusers: the checkpoint's EMA weights as a diffusers DDPMPipeline folder in a tar
 * (export.h, the code of `ddpmd export --diffusers`), built once per checkpoint, cached beside
 * it and streamed from that file */
static enum MHD_Result checkpoint_diffusers(struct ctx *c, const char *ckpt)
{
    char err[800], disp[128];
    int fd = -1;
    long long size = 0;
    int rc = export_cache_open(ckpt, c->owner, &fd, &size, err, sizeof err);
    if (rc == EXPORT_BUSY)
        return http_send_problem(c, 503, "busy", "an export of yours is being built: try again",
                                 NULL, (const char *const[]){"Retry-After", "2", NULL});
    if (rc)
        return http_send_problem(c, rc == EXPORT_UNSUPPORTED ? 422 : 500, NULL,
                                 rc == EXPORT_UNSUPPORTED ? "only the ddpm preset has a diffusers "
                                                            "equivalent (UNet2DModel)"
                                                          : "the diffusers export failed",
                                 NULL, NULL);
    snprintf(disp, sizeof disp, "attachment; filename=\"%s-diffusers.tar\"", c->param);
    return http_send_fd(c, fd, (uint64_t)size, "application/x-tar", disp);
}

enum MHD_Result h_checkpoint(struct ctx *c)
{
    char jid[JOBS_ID_LEN], path[FSIO_PATH_MAX], detail[160], err[300];
    int64_t step;
    if (pool_checkpoint_id_parse(c->param, jid, sizeof jid, &step)) {
        snprintf(detail, sizeof detail,
                 "no checkpoint '%.*s' (ids look like j0123456789abcdef-300)",
                 (int)utf8_cut(c->param, 40), c->param);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, jid, &r, &res)) return res;
    job_row_free(&r);
    int fd = -1;
    if (pool_checkpoint_path(c->a->cfg.pool, jid, step, path, sizeof path) == 0)
        fd = fsio_open_regular(path, O_RDONLY, err, sizeof err);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        if (fd >= 0) close(fd);
        snprintf(detail, sizeof detail, "no checkpoint %s (only the newest ones are kept)", c->param);
        return http_send_problem(c, 404, NULL, detail, NULL, NULL);
    }
    const char *fmt = MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, "format");
    if (fmt && strcmp(fmt, "safetensors") != 0) {
        close(fd);
        if (strcmp(fmt, "diffusers") != 0)
            return http_send_invalid(c, 400, "format", "expected safetensors or diffusers");
        return checkpoint_diffusers(c, path);
    }
    /* a checkpoint never changes once renamed into place (fsio_write_atomic): inode, size and
     * mtime name its bytes */
    char etag[96];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%llx.%lx\"", (unsigned long long)sb.st_ino,
             (unsigned long long)sb.st_size, (unsigned long long)sb.st_mtim.tv_sec,
             (long)sb.st_mtim.tv_nsec);
    const char *inm = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "If-None-Match");
    if (inm && (strcmp(inm, "*") == 0 || strstr(inm, etag))) {
        close(fd);
        struct MHD_Response *nm = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!nm) return http_send_oom(c);
        MHD_add_response_header(nm, MHD_HTTP_HEADER_ETAG, etag);
        enum MHD_Result rr = http_respond(c, 304, nm);
        MHD_destroy_response(nm);
        return rr;
    }
    uint64_t size = (uint64_t)sb.st_size, off = 0, len = size;
    unsigned status = 200;
    const char *range = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "Range");
    const char *ifr = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, "If-Range");
    if (range && (!ifr || strcmp(ifr, etag) == 0) && api_parse_range(range, size, &off, &len)) {
        close(fd);
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
        snprintf(detail, sizeof detail, "the range '%.40s' is outside the %llu bytes", range,
                 (unsigned long long)size);
        return http_send_problem(c, 416, NULL, detail, NULL,
                       (const char *const[]){"Content-Range", cr, NULL});
    }
    if (len != size) status = 206;
    /* the open descriptor keeps the file even if the job prunes it meanwhile */
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, off);
    if (!resp) {
        close(fd);
        return http_send_oom(c);
    }
    char disp[128], cr[96];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s.safetensors\"", c->param);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(resp, "Content-Disposition", disp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    if (status == 206) {
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)size);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
    enum MHD_Result rr = http_respond(c, status, resp);
    MHD_destroy_response(resp);
    return rr;
}

/* ---- POST /checkpoints: importing a checkpoint ---- */

int api_checkpoint_upload_begin(struct ctx *c, long long declared, enum MHD_Result *res)
{
    struct api *a = c->a;
    if (http_authorize(c, 1, res)) return 1;
    const char *ct = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t n = strlen("application/octet-stream");
    if (!ct || strncasecmp(ct, "application/octet-stream", n) != 0 ||
        (ct[n] != 0 && ct[n] != ';' && ct[n] != ' ')) {
        *res = http_send_problem(c, 415, NULL,
                                 "POST /checkpoints takes a safetensors file as "
                                 "application/octet-stream",
                                 NULL, (const char *const[]){"Accept-Post",
                                                             "application/octet-stream", NULL});
        return 1;
    }
    if (declared > a->cfg.upload_max_bytes) {
        char detail[160];
        snprintf(detail, sizeof detail, "the file is %lld bytes; the limit is %lld "
                 "(--upload-max-bytes)", declared, (long long)a->cfg.upload_max_bytes);
        *res = http_send_problem(c, 413, "checkpoint-too-large", detail, NULL, NULL);
        return 1;
    }
    return api_upload_open(c, res);
}

/* how an uploaded file becomes the import's checkpoint */
struct import_place {
    const char *part;              /* the upload, a ddpmd checkpoint: renamed into place */
    const struct safetensors *st;  /* else its tensors written anew with the metadata below */
    const char *spec_json;
};

static int import_place(const char *path, void *ctx, char *err, size_t errlen)
{
    struct import_place *ip = ctx;
    if (!ip->st) {
        if (rename(ip->part, path) == 0) return 0;
        snprintf(err, errlen, "the checkpoint cannot be kept: %s", strerror(errno));
        return -1;
    }
    struct safetensors_writer *w = NULL;
    int rc = -1;
    if (safetensors_writer_init(&w)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < safetensors_count(ip->st); i++) {
        const struct st_tensor *t;
        safetensors_get(ip->st, i, &t);
        if (safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data)) {
            snprintf(err, errlen, "tensor '%.200s' cannot be kept", t->name);
            goto out;
        }
    }
    if (safetensors_writer_meta(w, "format", CHECKPOINT_FORMAT) ||
        safetensors_writer_meta(w, "version", CHECKPOINT_VERSION) ||
        safetensors_writer_meta(w, "spec", ip->spec_json) ||
        safetensors_writer_meta(w, "step", "0")) {
        snprintf(err, errlen, "the checkpoint's metadata cannot be made");
        goto out;
    }
    char e2[300];
    if (safetensors_writer_save(w, path, e2, sizeof e2)) {
        int e = errno;
        snprintf(err, errlen, "the checkpoint cannot be written%s", e == ENOSPC ? ": " : "");
        if (e == ENOSPC) snprintf(err + strlen(err), errlen - strlen(err), "%s", strerror(e));
        errno = e;
        goto out;
    }
    rc = 0;
out:
    safetensors_writer_free(w);
    return rc;
}

/* the spec of a file without one: ?preset=ddpm|seed [&image_size=N] [&in_channels=C], the
 * preset's other defaults; 0, or -1 with the answer sent */
static int import_spec_from_query(struct ctx *c, struct train_spec *spec, enum MHD_Result *res)
{
    const char *preset = http_arg(c, "preset"), *size = http_arg(c, "image_size");
    const char *ch = http_arg(c, "in_channels");
    long long sz = 0, chn = 3;
    if (!preset || (strcmp(preset, "ddpm") != 0 && strcmp(preset, "seed") != 0)) {
        *res = http_send_invalid(c, 422, "preset",
                                 "the file has no ddpmd spec in its metadata (a converted "
                                 "state_dict): name its model with ?preset=ddpm or ?preset=seed "
                                 "(and image_size, in_channels when not the preset's)");
        return -1;
    }
    if ((size && api_parse_int(size, 8, 1024, &sz)) || (ch && api_parse_int(ch, 1, 4, &chn))) {
        *res = http_send_invalid(c, 400, size && api_parse_int(size, 8, 1024, &sz) ? "image_size"
                                                                                   : "in_channels",
                                 "image_size: an integer in [8, 1024]; in_channels: in [1, 4]");
        return -1;
    }
    if (!size) sz = strcmp(preset, "seed") == 0 ? 64 : 32;
    char js[320];
    snprintf(js, sizeof js, "{\"model\":{\"preset\":\"%s\",\"in_channels\":%lld,\"image_size\":"
             "%lld},\"data\":{\"dataset\":\"fashion-mnist\",\"fmnist_resize\":\"resize\"}}",
             preset, chn, sz);
    struct spec_errors *es = malloc(sizeof *es);
    if (!es) {
        *res = http_send_oom(c);
        return -1;
    }
    if (spec_parse(js, spec, es)) {
        char msg[600];
        snprintf(msg, sizeof msg, "%.120s: %.400s", es->e[0].path, es->e[0].msg);
        free(es);
        *res = http_send_invalid(c, 422, "preset", msg);
        return -1;
    }
    free(es);
    return 0;
}

/* POST /checkpoints: a safetensors file (a ddpmd checkpoint, or a converted state_dict with
 * ?preset=) whose tensors match its model by name and shape, kept as a job of kind import
 * (owned by the caller; its checkpoint JOB-STEP samples, exports and initialises like any) */
enum MHD_Result h_checkpoint_import(struct ctx *c)
{
    struct req *r = c->r;
    if (r->upload_errno) {
        char detail[200];
        snprintf(detail, sizeof detail, "the upload cannot be stored: %s", strerror(r->upload_errno));
        return http_send_problem(c, r->upload_errno == ENOSPC ? 507 : 500,
                                 r->upload_errno == ENOSPC ? "insufficient-storage" : NULL, detail,
                                 NULL, NULL);
    }
    int cerr = close(r->upload_fd);
    r->upload_fd = -1;
    if (cerr)
        return http_send_problem(c, errno == ENOSPC ? 507 : 500,
                                 errno == ENOSPC ? "insufficient-storage" : NULL,
                                 "the upload cannot be stored", NULL, NULL);
    if (!c->a->admitting)
        return http_send_stopping(c);
    const char *name = http_arg(c, "name");
    if (name && !api_job_name_valid(name))
        return http_send_invalid(c, 400, "name",
                                 "expected a job name: 1 to 64 of A-Z a-z 0-9 . _ - (not first: . _ -)");
    struct safetensors *st = NULL;
    struct train_spec *spec = malloc(sizeof *spec);
    char err[600], msg[700];
    int64_t step = 0;
    enum MHD_Result res;
    if (!spec) return http_send_oom(c);
    if (safetensors_open(&st, r->upload_path, err, sizeof err)) {
        /* the message names the server's temporary file: the reason alone */
        const char *why = strstr(err, r->upload_path) ? err + strlen(r->upload_path) : err;
        while (*why == ':' || *why == ' ') why++;
        snprintf(msg, sizeof msg, "not a safetensors file: %s", why);
        free(spec);
        return http_send_problem(c, 422, "checkpoint-invalid", msg, NULL, NULL);
    }
    int own_spec = safetensors_meta(st, "spec") != NULL;
    if (own_spec) {
        safetensors_free(st);
        st = NULL;
        if (checkpoint_open(&st, r->upload_path, spec, &step, err, sizeof err)) {
            const char *why = strstr(err, r->upload_path) ? err + strlen(r->upload_path) : err;
            while (*why == ':' || *why == ' ') why++;
            snprintf(msg, sizeof msg, "not a valid ddpmd checkpoint: %s", why);
            free(spec);
            return http_send_problem(c, 422, "checkpoint-invalid", msg, NULL, NULL);
        }
    } else if (import_spec_from_query(c, spec, &res)) {
        safetensors_free(st);
        free(spec);
        return res;
    }
    if (checkpoint_check_model(st, &spec->model, err, sizeof err)) {
        snprintf(msg, sizeof msg, "the file does not match its model (%s, %d px, %d channels): %s",
                 spec->model.preset == UNET_SEED ? "seed" : "ddpm", spec->model.image_size,
                 spec->model.in_channels, err);
        safetensors_free(st);
        free(spec);
        return http_send_problem(c, 422, "checkpoint-mismatch", msg, NULL, NULL);
    }
    char *spec_json = spec_to_json(spec);
    free(spec);
    if (!spec_json) {
        safetensors_free(st);
        return http_send_oom(c);
    }
    struct import_place ip = {.part = r->upload_path, .st = own_spec ? NULL : st,
                              .spec_json = spec_json};
    char id[JOBS_ID_LEN];
    int rc = pool_import(c->a->cfg.pool, c->owner, spec_json, step, name, NULL, import_place, &ip,
                         id, err, sizeof err);
    safetensors_free(st);
    free(spec_json);
    if (rc == POOL_ERR_STORAGE)
        return http_send_problem(c, 507, "insufficient-storage", err, NULL, NULL);
    if (rc) return http_send_problem(c, 500, NULL, err, NULL, NULL);
    if (own_spec) r->upload_path[0] = 0; /* renamed into the job */
    struct job_row jr;
    if (jobs_get(c->a->cfg.db, id, &jr))
        return http_send_problem(c, 500, NULL, "the new job cannot be read back", NULL, NULL);
    char loc[160];
    api_link(c->a, loc, sizeof loc, "/checkpoints/%s-%" PRId64, id, step);
    cJSON *o = api_job_json(c->a, &jr);
    job_row_free(&jr);
    return http_send_json(c, 201, o, NULL, (const char *const[]){"Location", loc, NULL});
}
