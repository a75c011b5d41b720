/* fuzz_spec.c - the training spec parser (spec_parse) on arbitrary bytes. Invariants: a spec that
 * parses serialises (spec_to_json) to JSON that parses again to the same canonical JSON; errors
 * are counted within SPEC_MAX_ERRORS and their strings are terminated. The request form
 * (spec_parse_request, POST /train's body with "webhook" beside the spec) on all the bytes, NULs
 * included: a syntax error is within them, members taken out are an object, and a body without
 * them (and without NULs) parses as spec_parse parses it. */
#include "fuzz.h"
#include "spec.h"

#include <stdlib.h>
#include <string.h>

int fuzz_spec(const uint8_t *data, size_t size)
{
    /* spec_parse takes a C string: bytes after an embedded NUL are simply not seen */
    char *json = malloc(size + 1);
    struct train_spec s, s2;
    struct spec_errors E, E2;
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    memset(&E, 0, sizeof E);
    if (spec_parse(json, &s, &E) == 0) {
        char *canon = spec_to_json(&s);
        if (!canon) fuzz_fail("spec", "spec_to_json failed on a spec that parsed");
        memset(&E2, 0, sizeof E2);
        if (spec_parse(canon, &s2, &E2) != 0)
            fuzz_fail("spec", "canonical JSON of an accepted spec is refused: %s: %s\n%s",
                      E2.e[0].path, E2.e[0].msg, canon);
        char *canon2 = spec_to_json(&s2);
        if (!canon2 || strcmp(canon, canon2) != 0)
            fuzz_fail("spec", "canonical JSON is not a fixed point:\n%s\n---\n%s", canon,
                      canon2 ? canon2 : "(null)");
        free(canon2);
        free(canon);
    } else {
        if (E.n < 1 || E.n > SPEC_MAX_ERRORS)
            fuzz_fail("spec", "spec_parse failed with %d errors", E.n);
        for (int i = 0; i < E.n; i++) {
            if (!memchr(E.e[i].path, '\0', sizeof E.e[i].path) ||
                !memchr(E.e[i].msg, '\0', sizeof E.e[i].msg))
                fuzz_fail("spec", "error %d is not NUL-terminated", i);
        }
    }
    static const char *const extra[] = {"webhook", NULL};
    cJSON *extras = NULL;
    struct train_spec r;
    struct spec_errors ER;
    int rc = spec_parse_request((const char *)data, size, extra, &extras, &r, &ER);
    if (ER.syntax && (!rc || ER.n < 1 || ER.syntax_at > size))
        fuzz_fail("spec", "request: a syntax error at %zu of %zu, rc %d, %d errors", ER.syntax_at,
                  size, rc, ER.n);
    if (extras && !cJSON_IsObject(extras)) fuzz_fail("spec", "request: extras not an object");
    if (!extras && strlen(json) == size && (rc == 0) != (spec_parse(json, &s2, &E2) == 0))
        fuzz_fail("spec", "request and spec_parse disagree (%d) on a body without extras", rc);
    cJSON_Delete(extras);
    free(json);
    return 0;
}
