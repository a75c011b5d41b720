/* page.c - what a browser or a client reads first: the dashboard (web/, embedded at build time
 * by api/embed.cmake) and the contract, openapi.yaml.
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

enum MHD_Result h_openapi(struct ctx *c)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(
        c->a->openapi_len, (void *)c->a->openapi, MHD_RESPMEM_PERSISTENT);
    if (!res) return http_send_oom(c);
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "application/yaml");
    enum MHD_Result r = http_respond(c, 200, res);
    MHD_destroy_response(res);
    return r;
}

extern const char ddpmd_web_index_html[], ddpmd_web_app_js[], ddpmd_web_style_css[];
extern const size_t ddpmd_web_index_html_len, ddpmd_web_app_js_len, ddpmd_web_style_css_len;

/* the page holds no data and no secret (it asks for the token and keeps it in sessionStorage), so
 * it needs none to load; the policy allows nothing but this origin (and blob: images the page
 * makes from authenticated fetches) */
static enum MHD_Result send_asset(struct ctx *c, const char *body, size_t len, const char *type)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(len, (void *)body,
                                                               MHD_RESPMEM_PERSISTENT);
    if (!res) return http_send_oom(c);
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(res, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(res, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; "
                            "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    enum MHD_Result r = http_respond(c, 200, res);
    MHD_destroy_response(res);
    return r;
}

enum MHD_Result h_ui_index(struct ctx *c)
{
    /* the page's URLs are relative to it: at "/P" they would resolve outside the prefix */
    if (c->r->bare_prefix) {
        char loc[API_PARSE_PREFIX_MAX + 2];
        snprintf(loc, sizeof loc, "%s/", c->a->prefix);
        return http_send_text(c, 301, "text/plain; charset=utf-8", "the dashboard is at PREFIX/\n",
                         (const char *const[]){"Location", loc, NULL});
    }
    return send_asset(c, ddpmd_web_index_html, ddpmd_web_index_html_len, "text/html; charset=utf-8");
}

enum MHD_Result h_ui_js(struct ctx *c)
{
    return send_asset(c, ddpmd_web_app_js, ddpmd_web_app_js_len, "text/javascript; charset=utf-8");
}

enum MHD_Result h_ui_css(struct ctx *c)
{
    return send_asset(c, ddpmd_web_style_css, ddpmd_web_style_css_len, "text/css; charset=utf-8");
}
