/* test_spec.c - training spec parsing: the examples load, every kind of bad input is rejected
 * with its field path (a table: input -> path + message fragment), spec_validate applies the same
 * rules to a filled struct, files are read safely, and the canonical JSON round-trips.
 */
#define _DEFAULT_SOURCE /* mkfifo, mkdtemp */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
#define BASE MODEL "," DATA

/* each rejected input with the error it must produce */
static const struct {
    const char *json, *path, *needle;
} bad[] = {
    /* structure: what cJSON alone lets through */
    {"{" BASE ",\"train\":{\"batch\":4,\"batch\":0}}", "train.batch", "duplicate key"},
    {"{" BASE "," DATA "}", "data", "duplicate key"},
    {"{" MODEL ",\"data\":{\"dataset\":\"a\",\"dataset\":\"fashion-mnist\"}}", "data.dataset",
     "duplicate key"},
    {"{" BASE "} x", "", "trailing bytes"},
    {"{" BASE "}{}", "", "trailing bytes"},
    {"{" MODEL ",\"data\":{\"dataset\":\"fashion-mnist\\u0000/etc\"}}", "data.dataset", "\\u0000"},
    {"{" BASE ",\"train\":{\"batch\\u0000x\":4}}", "train.batch", "\\u0000"},
    {"{" MODEL ",\"data\":{\"dataset\":\"a\tb\"}}", "data.dataset", "control byte"},
    {"{" MODEL ",\"data\":{\"dataset\":\"caf\xe9\"}}", "data.dataset", "not valid UTF-8"},
    {"{" BASE ",\"train\":{\"\xff\xfe\":4}}", "train.\\xff\\xfe", "not valid UTF-8"},
    /* work out of bounds by the spec's numbers alone (check_work), before anything is planned */
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,\"block_out_channels\":[32,64],"
     "\"layers_per_block\":1,\"attention_resolutions\":[1000000],\"norm_num_groups\":8}," DATA "}",
     "model.attention_resolutions[0]", "1000000 matches no level: the levels are at 32, 16 pixels"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,\"block_out_channels\":[32,64],"
     "\"layers_per_block\":1,\"attention_resolutions\":[16,8],\"norm_num_groups\":8}," DATA "}",
     "model.attention_resolutions[1]", "8 matches no level"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":256,\"block_out_channels\":[32,64],"
     "\"layers_per_block\":1,\"attention_resolutions\":[256],\"norm_num_groups\":8},"
     "\"data\":{\"dataset\":\"fashion-mnist\",\"fmnist_resize\":\"resize\"}}",
     "model.attention_resolutions[0]", "65536 tokens, more than 16384"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":256,\"block_out_channels\":[32],"
     "\"layers_per_block\":1,\"attention_resolutions\":[],\"norm_num_groups\":8},"
     "\"data\":{\"dataset\":\"fashion-mnist\",\"fmnist_resize\":\"resize\"}}",
     "model.block_out_channels", "middle block's attention works at 65536 tokens"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,\"block_out_channels\":[8192,8192],"
     "\"layers_per_block\":8,\"attention_resolutions\":[],\"norm_num_groups\":8}," DATA "}",
     "model.block_out_channels", "parameters, more than the limit of 4294967296"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":1024,"
     "\"block_out_channels\":[2048,32,32,32,32,32,32,32],\"layers_per_block\":1,"
     "\"attention_resolutions\":[],\"norm_num_groups\":8},"
     "\"data\":{\"dataset\":\"fashion-mnist\",\"fmnist_resize\":\"resize\"},\"train\":{\"batch\":1}}",
     "model.block_out_channels[0]", "(2048 channels of 1024x1024) is 8589934592 bytes (8.0 GiB), more than"},
    {"{\"model\":{\"preset\":\"seed\",\"in_channels\":3,\"image_size\":512},\"data\":{\"dataset\":\"x\"}}",
     "model.image_size", "first attention works at 65536 tokens"},
    /* seeds: 2^53 + 1 reads as 2^53, so 2^53 - 1 is the largest exact one */
    {"{" BASE ",\"train\":{\"seed\":9007199254740993}}", "train.seed", "must be in [0, 9007199254740991]"},
    {"{" BASE ",\"train\":{\"seed\":9007199254740992}}", "train.seed", "must be in"},
    {"{" BASE ",\"train\":{\"seed\":18446744073709551617}}", "train.seed", "2^53"},
    {"{" BASE ",\"train\":{\"seed\":-1}}", "train.seed", "must be in"},
    /* the float training uses, not the double that was written */
    {"{" BASE ",\"train\":{\"lr\":1e-50}}", "train.lr", "0 as a 32-bit float"},
    {"{" BASE ",\"train\":{\"lr\":1e-40}}", "train.lr", "32-bit float"},
    {"{" BASE ",\"train\":{\"eps\":1e-50}}", "train.eps", "32-bit float"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[32],"
     "\"norm_num_groups\":8,\"norm_eps\":1e-50}," DATA "}", "model.norm_eps", "32-bit float"},
    {"{" BASE ",\"train\":{\"beta2\":0.99999999}}", "train.beta2", "must be in [0, 0.9999999]"},
    {"{" BASE ",\"train\":{\"beta1\":1}}", "train.beta1", "must be in"},
    {"{" BASE ",\"train\":{\"clip\":1e300}}", "train.clip", "must be in [0, 1000000]"},
    {"{" BASE ",\"train\":{\"clip\":1e999}}", "train.clip", "got inf"},
    {"{" BASE ",\"train\":{\"weight_decay\":-0.5}}", "train.weight_decay", "must be in"},
    {"{" BASE ",\"train\":{\"threads\":100000}}", "train.threads", "[0, 256]"},
    {"{" BASE ",\"train\":{\"batch\":3000000000}}", "train.batch", "[1, 65535]"},
    {"{" BASE ",\"train\":{\"batch\":1e300}}", "train.batch", "got 1e+300"},
    {"{" BASE ",\"diffusion\":{\"beta_end\":0}}", "diffusion.beta_end", "(0, 1]"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[32],"
     "\"norm_num_groups\":0}," DATA "}", "model.norm_num_groups", "must be in [1, 1024]"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[2000000000]},"
     DATA "}", "model.block_out_channels[0]", "must be in [1, 1000000]"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"layers_per_block\":40}," DATA "}",
     "model.layers_per_block", "[1, 8]"},
    {"{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"dropout\":0.995}," DATA "}",
     "model.dropout", "[0, 0.99]"},
    {"{\"model\":{\"preset\":\"seed\",\"in_channels\":1,\"heads\":0}," DATA "}",
     "model.heads", "[1, 64]"},
    /* messages: empty input, echoes escaped and cut short */
    {"", "", "empty document"},
    {" \n\t ", "", "empty document"},
    {"{\"model\":\xff}", "", "\\xff"},
    {"{\"model\":{\"preset\":\"vit\"}," DATA "}", "model.preset", "got \"vit\""},
    {"{\"model\":{\"preset\":\"v\xffit\"}," DATA "}", "model.preset", "not valid UTF-8"},
};

/* every error message is short and printable: no raw byte >= 0x80 that is not UTF-8, no
 * control byte, at most 200 bytes */
static int message_clean(const struct spec_errors *E)
{
    for (int i = 0; i < E->n; i++) {
        for (const char *f = E->e[i].path; f; f = f == E->e[i].path ? E->e[i].msg : NULL) {
            size_t n = strlen(f);
            if (n > 200) return 0;
            for (size_t k = 0; k < n; k++)
                if ((unsigned char)f[k] < 0x20 || (unsigned char)f[k] == 0xff ||
                    (unsigned char)f[k] == 0xfe || (unsigned char)f[k] == 0xe9)
                    return 0;
        }
    }
    return 1;
}

/* a spec that must parse, and whose canonical JSON parses to the same */
static void accept(const char *json, struct train_spec *s)
{
    struct train_spec s2;
    struct spec_errors E;
    int rc = spec_parse(json, s, &E);
    CHECK(rc == 0, "refused: %s", json);
    if (rc) {
        spec_errors_print(&E, "  got: ");
        return;
    }
    char *j1 = spec_to_json(s);
    rc = spec_parse(j1, &s2, &E);
    CHECK(rc == 0, "canonical JSON refused for %s", json);
    if (rc) spec_errors_print(&E, "  got: ");
    char *j2 = spec_to_json(&s2);
    CHECK(rc == 0 && strcmp(j1, j2) == 0, "canonical JSON is not a fixed point for %s", json);
    free(j1);
    free(j2);
}

/* spec_validate on a filled struct (what the CLI's options do) */
static void reject_struct(const struct train_spec *s, const char *path, const char *needle,
                          const char *what)
{
    struct spec_errors E;
    int rc = spec_validate(s, &E);
    int found = has_error(&E, path, needle);
    CHECK(rc != 0 && found, "spec_validate: expected '%s: ...%s...' for %s", path, needle, what);
    if (!found) spec_errors_print(&E, "  got: ");
}

static void reject_file(const char *path, const char *needle)
{
    struct train_spec s;
    struct spec_errors E;
    int rc = spec_load_file(path, &s, &E);
    int found = E.n > 0 && strstr(E.e[0].msg, needle) != NULL;
    CHECK(rc != 0 && found, "spec_load_file(%s): expected '...%s...'", path, needle);
    if (!found) spec_errors_print(&E, "  got: ");
}

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
    /* no train.threads: 0, decided when the job first starts (not a fixed 2), and kept so by
     * the canonical JSON; an explicit count stays */
    accept("{" BASE "}", &s);
    CHECK(s.threads == 0, "train.threads without one: %d", s.threads);
    accept("{" BASE ",\"train\":{\"threads\":5}}", &s);
    CHECK(s.threads == 5, "train.threads 5: %d", s.threads);
    /* the default attention_resolutions ([16]) is kept only where a level is at 16 pixels */
    accept("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,"
           "\"block_out_channels\":[32],\"norm_num_groups\":8}," DATA "}", &s);
    CHECK(s.model.n_attn == 0, "a default attention at no level kept: %d", s.model.n_attn);
    accept("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"image_size\":32,"
           "\"block_out_channels\":[32,32],\"norm_num_groups\":8}," DATA "}", &s);
    CHECK(s.model.n_attn == 1 && s.model.attn_res[0] == 16, "the default attention at 16 dropped");
    /* a batch just inside the bound; the host bytes of a spec's data */
    accept("{" BASE ",\"train\":{\"batch\":2730}}", &s);
    /* Fashion-MNIST held as its bytes (28x28, a label, an index each), the loader's two batches
     * (labels too) and the order's permutation, the step's four batch buffers and timesteps */
    int64_t batches = 2 * 2730 * (int64_t)(32 * 32 * 4 + 4) + 4 * 2730 * (int64_t)32 * 32 * 4 +
                      2730 * 8;
    CHECK(spec_host_data_bytes(&s, -1) == 60000 * (int64_t)(28 * 28 + 1 + 4 + 4) + batches,
          "fashion-mnist's host bytes: %lld", (long long)spec_host_data_bytes(&s, -1));
    CHECK(spec_host_data_bytes(&s, 10) == 10 * (28 * 28 + 1 + 4 + 4) + batches, "10 images");
    char why[400] = "";
    CHECK(spec_host_check(&s, why, sizeof why) == 0, "Fashion-MNIST does not fit the host: %s", why);
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
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":4,\"block_out_channels\":[32,64],"
           "\"norm_num_groups\":8}," DATA "}",
           "model.in_channels", "1 channel (grey) or 3 (grey as RGB)");
    /* Fashion-MNIST as RGB (the grey copied to each channel): what the shipped examples train on */
    accept("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":3,\"block_out_channels\":[32,64],"
           "\"norm_num_groups\":8}," DATA "}", &s);
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[30],"
           "\"norm_num_groups\":8}," DATA "}",
           "model", "groups");
    reject("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[\"a\"]},"
           DATA "}",
           "model.block_out_channels[0]", "integer");
    reject("{\"model\":{\"preset\":\"seed\",\"in_channels\":1,\"base\":64,\"layers_per_block\":2},"
           DATA "}",
           "model.layers_per_block", "unknown field");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        reject(bad[i].json, bad[i].path, bad[i].needle);
        spec_parse(bad[i].json, &s, &E);
        CHECK(message_clean(&E), "unclean message for %s", bad[i].json);
    }

    /* a 300-digit number and a 300-byte key are not echoed whole */
    {
        char json[1200], key[301];
        memset(key, 'k', 300);
        key[300] = 0;
        snprintf(json, sizeof json, "{" BASE ",\"train\":{\"batch\":1%0300d}}", 0);
        reject(json, "train.batch", "must be in");
        spec_parse(json, &s, &E);
        CHECK(E.n == 1 && strlen(E.e[0].msg) < 80, "300-digit number echoed: %s", E.e[0].msg);
        snprintf(json, sizeof json, "{" BASE ",\"train\":{\"%s\":1}}", key);
        spec_parse(json, &s, &E);
        CHECK(E.n == 1 && strlen(E.e[0].path) < 60 && strstr(E.e[0].path, "..."),
              "300-byte key echoed: %s", E.e[0].path);
        snprintf(json, sizeof json, "{\"model\":%s}", key);
        spec_parse(json, &s, &E);
        CHECK(E.n == 1 && strlen(E.e[0].msg) < 120 && strstr(E.e[0].msg, "..."),
              "300-byte snippet echoed: %s", E.e[0].msg);
    }

    /* nesting is bounded (the audit recurses) */
    {
        char json[400] = "{" BASE ",\"output\":{\"a\":", path[200] = "output.a";
        for (int i = 0; i < 20; i++) strcat(json, "[");
        strcat(json, "1");
        for (int i = 0; i < 20; i++) strcat(json, "]");
        strcat(json, "}}");
        for (int i = 0; i < 15; i++) strcat(path, "[0]");
        reject(json, path, "nested deeper than 16");
        /* a string issue after a too-deep subtree keeps its own path */
        char json2[600] = "{" BASE ",\"output\":{\"a\":";
        for (int i = 0; i < 20; i++) strcat(json2, "[");
        strcat(json2, "\"x\",{\"k\":\"v\"}");
        for (int i = 0; i < 20; i++) strcat(json2, "]");
        strcat(json2, "},\"init_from\":\"a\\u0000\"}");
        reject(json2, "init_from", "\\u0000");
    }

    /* the edges that are valid stay valid, and round-trip */
    accept("{" BASE ",\"train\":{\"seed\":9007199254740991}}", &s);
    CHECK(s.seed == 9007199254740991ull, "seed 2^53-1 read as %llu", (unsigned long long)s.seed);
    accept("{" BASE ",\"train\":{\"beta2\":0.9999999,\"beta1\":0.999999,\"ema_decay\":0.999999,"
           "\"lr\":1,\"eps\":1.1754943508222875e-38,\"clip\":1000000,\"weight_decay\":10}}", &s);
    CHECK(s.optim.beta2 < 1.0f && s.optim.eps == FLT_MIN, "float edges stored as given");
    accept("{\"model\":{\"preset\":\"ddpm\",\"in_channels\":1,\"block_out_channels\":[32],"
           "\"norm_num_groups\":8,\"dropout\":0.99,\"norm_eps\":1e-6,\"freq_shift\":1}," DATA "}",
           &s);
    accept("{" BASE ",\"train\":{\"lr\":0.1,\"seed\":0}}", &s);
    accept("{" BASE ",\"init_from\":\"\"}", &s); /* "" is null: fresh weights */
    CHECK(s.init_from[0] == 0, "init_from \"\" kept as a path");
    accept("\xef\xbb\xbf {" BASE "} \n", &s); /* a UTF-8 byte-order mark and whitespace */
    accept("{" MODEL ",\"data\":{\"dataset\":\"caf\xc3\xa9 \\\\u0000 \\\"x\\\"\"}}", &s);
    CHECK(strcmp(s.dataset, "caf\xc3\xa9 \\u0000 \"x\"") == 0, "escaped backslash kept: %s",
          s.dataset);

    /* spec_validate: the same rules on a filled struct */
    struct train_spec v;
    spec_defaults(&v);
    CHECK(spec_validate(&v, &E) == 0, "defaults are valid");
    v.threads = 100000;
    reject_struct(&v, "train.threads", "[0, 256]", "threads 100000");
    spec_defaults(&v);
    v.model.groups = 0; /* unet_config_check would divide by it */
    reject_struct(&v, "model.norm_num_groups", "[1, 1024]", "groups 0");
    spec_defaults(&v);
    v.model.channels[1] = 2000000000;
    reject_struct(&v, "model.block_out_channels[1]", "[1, 1000000]", "channels 2e9");
    spec_defaults(&v);
    v.model.layers_per_block = 40;
    reject_struct(&v, "model.layers_per_block", "[1, 8]", "layers 40");
    spec_defaults(&v);
    v.optim.lr = (float)1e-50;
    reject_struct(&v, "train.lr", "(0, 1]", "lr 0");
    spec_defaults(&v);
    v.optim.beta2 = (float)0.99999999;
    reject_struct(&v, "train.beta2", "32-bit float", "beta2 1.0f");
    spec_defaults(&v);
    v.seed = 1ull << 60;
    reject_struct(&v, "train.seed", "2^53", "seed 2^60");
    spec_defaults(&v);
    v.steps = 0;
    reject_struct(&v, "train.steps", "must be in", "steps 0");
    spec_defaults(&v);
    v.model.n_levels = 9;
    reject_struct(&v, "model.block_out_channels", "levels", "9 levels");
    spec_defaults(&v);
    v.model.groups = 7;
    reject_struct(&v, "model", "groups", "channels not divisible by groups");

    /* files: the reason for every failure, nothing blocks */
    char dir[] = "/tmp/ddpmd-test-spec-XXXXXX", path[600];
    if (mkdtemp(dir)) {
        reject_file(dir, "is a directory");
        snprintf(path, sizeof path, "%s/missing.json", dir);
        reject_file(path, "No such file or directory");
        snprintf(path, sizeof path, "%s/empty.json", dir);
        FILE *f = fopen(path, "w");
        if (f) fclose(f);
        reject_file(path, "empty file");
        unlink(path);
        snprintf(path, sizeof path, "%s/nul.json", dir);
        f = fopen(path, "w");
        if (f) {
            fwrite("{\"a\":1}\0{}", 1, 10, f);
            fclose(f);
        }
        reject_file(path, "NUL byte");
        unlink(path);
        snprintf(path, sizeof path, "%s/big.json", dir);
        f = fopen(path, "w");
        if (f) {
            for (int i = 0; i < (1 << 20) + 10; i++) fputc(' ', f);
            fclose(f);
        }
        reject_file(path, "larger than");
        unlink(path);
        snprintf(path, sizeof path, "%s/fifo.json", dir);
        if (mkfifo(path, 0600) == 0) { /* nobody writes it: an open that waits would hang */
            alarm(20); /* a hang fails the test (SIGALRM) instead of stalling CI */
            reject_file(path, "not a regular file");
            alarm(0);
            unlink(path);
        }
        rmdir(dir);
    }

    /* several errors are all reported */
    CHECK(spec_parse("{" MODEL "," DATA ",\"train\":{\"batch\":0,\"steps\":-1,\"x\":1}}", &s, &E) &&
              E.n == 3,
          "three errors reported, got %d", E.n);
    return tu_finish("test_spec");
}
