/* fuzz_http.c - what the HTTP layer parses itself (libmicrohttpd parses the request line and
 * headers): checkpoint ids of GET /checkpoints/{id}, job ids ({id}, ?after=), the ?state= filter,
 * and the bearer-token file. Byte 0 picks which (mod 4); the rest is the string. Invariants: an
 * accepted checkpoint id is exactly "<valid job id>-<step>" with a canonical step >= 0; a valid
 * job id is 17 characters; a parsed state names itself; a token file loads 1.. tokens with
 * 16+ character secrets, or fails with a message and nothing allocated. (POST /train bodies are
 * training specs: fuzz_spec.) */
#include "api.h"
#include "fuzz.h"
#include "jobs.h"
#include "pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_http(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0] % 4;
    if (mode == 3) { /* the token file: bytes as they are, NULs included */
        const char *path = fuzz_bytes_path(0, data + 1, size - 1);
        struct api_token *tok = NULL;
        int n = -1;
        char err[512] = "";
        if (api_tokens_load(path, &tok, &n, err, sizeof err) == 0) {
            if (!tok || n < 1) fuzz_fail("http", "tokens loaded: %d at %p", n, (void *)tok);
            for (int i = 0; i < n; i++)
                if (!tok[i].name[0] || strlen(tok[i].secret) < 16 ||
                    !memchr(tok[i].name, 0, sizeof tok[i].name))
                    fuzz_fail("http", "token %d: name '%.64s', a %zu-character secret", i,
                              tok[i].name, strlen(tok[i].secret));
            free(tok);
        } else if (tok || n != 0 || !err[0]) {
            fuzz_fail("http", "failed token load left %d tokens at %p, message '%s'", n,
                      (void *)tok, err);
        }
        return 0;
    }
    char *s = malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    if (mode == 0) {
        char jid[JOBS_ID_LEN], again[64];
        int64_t step = -1;
        if (pool_checkpoint_id_parse(s, jid, sizeof jid, &step) == 0) {
            snprintf(again, sizeof again, "%s-%" PRId64, jid, step);
            if (!pool_job_id_valid(jid) || step < 0 || strcmp(again, s) != 0)
                fuzz_fail("http", "checkpoint id '%s' parsed as '%s' step %" PRId64, s, jid, step);
        }
    } else if (mode == 1) {
        if (pool_job_id_valid(s) && strlen(s) != 17)
            fuzz_fail("http", "job id '%s' of %zu characters accepted", s, strlen(s));
    } else {
        int k = job_state_parse(s);
        if (k >= 0 && strcmp(job_state_name((enum job_state)k), s) != 0)
            fuzz_fail("http", "state '%s' parsed as %d (%s)", s, k,
                      job_state_name((enum job_state)k));
    }
    free(s);
    return 0;
}
