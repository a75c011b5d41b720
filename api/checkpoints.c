/* checkpoints.c - a job's checkpoints: GET /jobs/{id}/checkpoints and GET /checkpoints/{id}
 * (ranges, ETag, or diffusers' layout in a tar).
 */
#define _GNU_SOURCE
#include "routes.h"

#include <dirent.h>

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

#include "export.h"
#include "fsio.h"
#include "parse.h"
#include "pool.h"
#include "utf8.h"

static int ckpt_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

enum MHD_Result h_checkpoints(struct ctx *c)
{
    struct job_row r;
    enum MHD_Result res;
    if (api_job_load(c, c->param, &r, &res)) return res;
    job_row_free(&r);
    char dir[FSIO_PATH_MAX], path[FSIO_PATH_MAX];
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "checkpoints");
    if (pool_checkpoint_path(c->a->cfg.pool, c->param, 0, dir, sizeof dir) == 0) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        DIR *d = opendir(dir);
        int64_t steps[1024];
        int n = 0;
        struct dirent *de;
        while (d && (de = readdir(d)) && n < 1024) {
            long long s;
            char tail[16];
            if (sscanf(de->d_name, "step-%lld.safe%15s", &s, tail) == 2 &&
                strcmp(tail, "tensors") == 0 && s >= 0)
                steps[n++] = s;
        }
        if (d) closedir(d);
        qsort(steps, (size_t)n, sizeof *steps, ckpt_cmp);
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
