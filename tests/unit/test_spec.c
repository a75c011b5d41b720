/* test_spec.c - training spec parsing: the examples load, every kind of bad input is rejected
 * with its field path, and the canonical JSON round-trips to the same spec.
 */
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "test_util.h"

static int has_error(const struct spec_errors *E, const char *path, const char *needle)
{
    for (int i = 0; i < E->n; i++)
        if (strcmp(E->e[i].path, path) == 0 && strstr(E->e[i].msg, needle)) return 1;
    return 0;
}

static void reject(const char *json, const char *path, const char *needle)
{
    struct train_spec s;
    struct spec_errors E;
    int rc = spec_parse(json, &s, &E);
    int found = has_error(&E, path, needle);
    CHECK(rc != 0 && found, "expected '%s: ...%s...' for %s", path, needle, json);
    if (!found) spec_errors_print(&E, "  got: ");
}

#define MODEL "\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,"          \
              "\"block_out_channels\":[32,64],\"layers_per_block\":1,"                       \
              "\"attention_resolutions\":[16],\"norm_num_groups\":8}"
#define DATA "\"data\":{\"dataset\":\"fashion-mnist\"}"

int main(void)
{
    const char *examples[] = {"examples/fmnist-tiny.json", "examples/ddpm-cifar10.json",
                              "examples/seed-64.json"};
    for (int i = 0; i < 3; i++) {
        struct train_spec s, s2;
        struct spec_errors E;
        int rc = spec_load_file(examples[i], &s, &E);
        CHECK(rc == 0, "%s does not load", examples[i]);
        if (rc) spec_errors_print(&E, "  ");
        char *json = spec_to_json(&s);
        rc = spec_parse(json, &s2, &E);
        CHECK(rc == 0, "%s: canonical JSON does not parse", examples[i]);
        char *json2 = spec_to_json(&s2);
        CHECK(strcmp(json, json2) == 0, "%s: canonical JSON does not round-trip", examples[i]);
        CHECK(memcmp(&s.model, &s2.model, sizeof s.model) == 0 && s.batch == s2.batch &&
                  s.optim.lr == s2.optim.lr && s.seed == s2.seed,
              "%s: round trip changes the spec", examples[i]);
        free(json);
        free(json2);
    }
    struct train_spec s;
    struct spec_errors E;
    CHECK(spec_load_file("examples/fmnist-tiny.json", &s, &E) == 0 && s.model.channels[2] == 64 &&
              s.batch == 32 && s.model.n_attn == 1 && s.model.attn_res[0] == 8,
          "fmnist-tiny fields");
    CHECK(spec_load_file("examples/seed-64.json", &s, &E) == 0 && s.model.preset == UNET_SEED &&
              s.batch == 8 && s.model.image_size == 64,
          "seed-64 fields");

    reject("{", "", "not valid JSON");
    reject("[1]", "", "object");
    reject("{" DATA "}", "model", "required");
    reject("{" MODEL "}", "data", "required");
    reject("{\"model\":{}," DATA "}", "model.preset", "required");
    reject("{\"model\":{\"preset\":\"vit\"}," DATA "}", "model.preset", "one of");
    reject("{" MODEL "," DATA ",\"trian\":{}}", "trian", "unknown field");
    reject("{" MODEL "," DATA ",\"train\":{\"bacth\":4}}", "train.bacth", "unknown field");
    reject("{" MODEL "," DATA ",\"train\":{\"batch\":\"8\"}}", "train.batch", "integer");
    reject("{" MODEL "," DATA ",\"train\":{\"batch\":2.5}}", "train.batch", "integer");
    reject("{" MODEL "," DATA ",\"train\":{\"batch\":0}}", "train.batch", "must be in");
    reject("{" MODEL "," DATA ",\"train\":{\"lr\":-1}}", "train.lr", "must be in");
    reject("{" MODEL "," DATA ",\"train\":{\"lr_schedule\":\"step\"}}", "train.lr_schedule",
           "one of");
    reject("{" MODEL "," DATA ",\"diffusion\":{\"beta_start\":0.1,\"beta_end\":0.01}}",
           "diffusion.beta_end", ">= beta_start");
    reject("{" MODEL ",\"data\":{\"dataset\":\"\"}}", "data.dataset", "non-empty");
    reject("{" MODEL ",\"data\":{\"dataset\":\"fashion-mnist\",\"flip\":1}}", "data.flip",
           "true or false");
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":3,\"block_out_channels\":[32,64],"
           "\"norm_num_groups\":8}," DATA "}",
           "model.in_channels", "1 channel");
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[30],"
           "\"norm_num_groups\":8}," DATA "}",
           "model", "groups");
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[\"a\"]},"
           DATA "}",
           "model.block_out_channels[0]", "integer");
    reject("{\"model\":{\"preset\":\"seed\",\"in_channels\":1,\"base\":64,\"layers_per_block\":2},"
           DATA "}",
           "model.layers_per_block", "unknown field");
    /* several errors are all reported */
    CHECK(spec_parse("{" MODEL "," DATA ",\"train\":{\"batch\":0,\"steps\":-1,\"x\":1}}", &s, &E) &&
              E.n == 3,
          "three errors reported, got %d", E.n);
    return tu_finish("test_spec");
}
