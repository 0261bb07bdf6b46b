/*
 * test_config.c — the config table: defaults, --set parsing, JSON apply and
 * round trip, resolve rules, same_model, help; the config's "knobs" object
 * (stored with source config, precedence over env but never over the command
 * line whatever the order, all or nothing with the config keys, not part of
 * the config's JSON). Exits non-zero on failure.
 */
#include <math.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mt_config.h"
#include "core/mt_knobs.h"
#include "mt_test.h"


static void test_defaults(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c;
    mt_config_defaults(&c);
    EXPECT(c.vocab_size == 0 && c.n_layer == 4 && c.d_model == 256 && c.n_head == 4 && c.n_kv_head == 2);
    EXPECT(c.head_dim == 0 && c.mlp_hidden == 0 && c.seq_len == 256 && c.pattern[0] == '\0');
    EXPECT(c.n_experts == 8 && c.top_k == 2 && c.expert_hidden == 0 && c.shared_expert_hidden == 0);
    EXPECT(c.aux_loss_coef == 0.01f && c.z_loss_coef == 0.001f && c.rope_theta == 10000.f);
    EXPECT(c.mod_capacity == 0.125f && c.mod_aux_coef == 0.01f);
    EXPECT(c.norm_eps == 1e-6f && c.logit_softcap == 0.f);
    EXPECT(c.batch_size == 8 && c.microbatches == 1 && !strcmp(c.optimizer, "muon"));
    EXPECT(c.lr == 3e-3f && c.muon_lr == 0.02f && c.muon_momentum == 0.95f);
    EXPECT(c.adam_beta1 == 0.9f && c.adam_beta2 == 0.95f && c.adam_eps == 1e-8f);
    EXPECT(c.weight_decay == 0.f && c.grad_clip == 1.0f && c.warmup_steps == 0 && c.total_steps == 0);
    EXPECT(c.min_lr_frac == 0.f && !strcmp(c.lr_schedule, "cosine") && c.seed == 1337);
    EXPECT(c.eval_every == 0 && c.eval_batches == 4 && c.save_every == 0 && c.save_final == 1);
    EXPECT(!strcmp(c.backend, "cpu") && !strcmp(c.recompute, "none"));
    EXPECT(c.sequence_parallel == 1 && c.reshard_after_forward == 1 && c.threads == 0);

    /* defaults do not resolve without a vocab */
    struct mt_config r = c;
    EXPECT_ERR(mt_config_resolve(&ctx, &r, 10), MT_ERR_CONFIG, "vocab_size is not set");

    c.vocab_size = 512;
    EXPECT(mt_config_resolve(&ctx, &c, 10) == MT_OK);
    EXPECT(c.head_dim == 64);
    EXPECT(c.mlp_hidden == 704);           /* ceil(8*256/3) = 683 -> 704 */
    EXPECT(c.expert_hidden == 176);
    EXPECT(!strcmp(c.pattern, "AAAA"));
    EXPECT(c.total_steps == 10);
    /* resolve is idempotent */
    struct mt_config c2 = c;
    EXPECT(mt_config_resolve(&ctx, &c2, 99) == MT_OK);
    EXPECT(!memcmp(&c, &c2, sizeof c));
    mt_ctx_free(&ctx);
}

static void test_set(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c;
    mt_config_defaults(&c);

    EXPECT(mt_config_set(&ctx, &c, "n_layer=12") == MT_OK && c.n_layer == 12);
    EXPECT(mt_config_set(&ctx, &c, "lr=1e-4") == MT_OK && c.lr == 1e-4f);
    EXPECT(mt_config_set(&ctx, &c, "pattern=AEAE") == MT_OK && !strcmp(c.pattern, "AEAE"));
    EXPECT(mt_config_set(&ctx, &c, "pattern=") == MT_OK && c.pattern[0] == '\0');
    EXPECT(mt_config_set(&ctx, &c, "optimizer=adamw") == MT_OK && !strcmp(c.optimizer, "adamw"));
    EXPECT(mt_config_set(&ctx, &c, "sequence_parallel=false") == MT_OK && c.sequence_parallel == 0);
    EXPECT(mt_config_set(&ctx, &c, "sequence_parallel=1") == MT_OK && c.sequence_parallel == 1);
    EXPECT(mt_config_set(&ctx, &c, "reshard_after_forward=0") == MT_OK && c.reshard_after_forward == 0);
    EXPECT(mt_config_set(&ctx, &c, "reshard_after_forward=true") == MT_OK && c.reshard_after_forward == 1);
    EXPECT(mt_config_set(&ctx, &c, "seed=18446744073709551615") == MT_OK && c.seed == UINT64_MAX);

    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer=12x"), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT(c.n_layer == 12); /* unchanged on error */
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer="), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer=1.5"), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer=0"), MT_ERR_INVALID_ARG, "n_layer");
    /* MoD keys (SPEC 1e): c in (0, 1] (0 is the resolve rule's), coef >= 0 */
    EXPECT_ERR(mt_config_set(&ctx, &c, "mod_capacity=1.5"), MT_ERR_INVALID_ARG, "mod_capacity");
    EXPECT_ERR(mt_config_set(&ctx, &c, "mod_capacity=-0.1"), MT_ERR_INVALID_ARG, "mod_capacity");
    EXPECT_ERR(mt_config_set(&ctx, &c, "mod_aux_coef=-1"), MT_ERR_INVALID_ARG, "mod_aux_coef");
    EXPECT(mt_config_set(&ctx, &c, "mod_capacity=1") == MT_OK && c.mod_capacity == 1.0f);
    EXPECT(mt_config_set(&ctx, &c, "mod_capacity=0.125") == MT_OK);
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer=99999999999999"), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT_ERR(mt_config_set(&ctx, &c, "vocab_size=70000"), MT_ERR_INVALID_ARG, "vocab_size");
    EXPECT_ERR(mt_config_set(&ctx, &c, "lr=abc"), MT_ERR_INVALID_ARG, "'lr'");
    EXPECT_ERR(mt_config_set(&ctx, &c, "lr=nan"), MT_ERR_INVALID_ARG, "'lr'");
    EXPECT_ERR(mt_config_set(&ctx, &c, "lr=-1"), MT_ERR_INVALID_ARG, "'lr'");
    EXPECT_ERR(mt_config_set(&ctx, &c, "sequence_parallel=yes"), MT_ERR_INVALID_ARG, "sequence_parallel");
    EXPECT_ERR(mt_config_set(&ctx, &c, "seed=-1"), MT_ERR_INVALID_ARG, "seed");
    EXPECT_ERR(mt_config_set(&ctx, &c, "optimizer=sgd"), MT_ERR_INVALID_ARG, "muon|adamw");
    EXPECT_ERR(mt_config_set(&ctx, &c, "lr_schedule=step"), MT_ERR_INVALID_ARG, "cosine|linear|constant");
    EXPECT_ERR(mt_config_set(&ctx, &c, "backend=tpu"), MT_ERR_INVALID_ARG, "cpu|cuda");
    EXPECT_ERR(mt_config_set(&ctx, &c, "recompute=all"), MT_ERR_INVALID_ARG, "none|block");
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layers=4"), MT_ERR_INVALID_ARG, "did you mean 'n_layer'");
    EXPECT_ERR(mt_config_set(&ctx, &c, "zzzzzzzz=4"), MT_ERR_INVALID_ARG, "unknown config key 'zzzzzzzz'");
    EXPECT(!strstr(mt_ctx_last_error(&ctx), "did you mean"));
    EXPECT_ERR(mt_config_set(&ctx, &c, "n_layer"), MT_ERR_INVALID_ARG, "key=value");
    char longpat[MT_MAX_LAYERS + 20] = "pattern=";
    memset(longpat + 8, 'A', MT_MAX_LAYERS + 1);
    longpat[8 + MT_MAX_LAYERS + 1] = '\0';
    EXPECT_ERR(mt_config_set(&ctx, &c, longpat), MT_ERR_INVALID_ARG, "pattern");
    mt_ctx_free(&ctx);
}

static void test_json(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c;
    mt_config_defaults(&c);

    EXPECT(mt_config_apply_json(&ctx, &c,
                                "{\"n_layer\": 6, \"pattern\": \"AEAEAE\", \"lr\": 0.001, \"seed\": 7,"
                                " \"sequence_parallel\": false, \"lr_schedule\": \"linear\"}") == MT_OK);
    EXPECT(c.n_layer == 6 && !strcmp(c.pattern, "AEAEAE") && c.lr == 0.001f && c.seed == 7);
    EXPECT(c.sequence_parallel == 0 && !strcmp(c.lr_schedule, "linear"));

    struct mt_config before = c;
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 8, \"n_layers\": 4}"), MT_ERR_INVALID_ARG,
               "n_layers");
    EXPECT(!memcmp(&c, &before, sizeof c)); /* all or nothing */
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": \"4\"}"), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 4.5}"), MT_ERR_INVALID_ARG, "n_layer");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"d_model\": -3}"), MT_ERR_INVALID_ARG, "d_model");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"lr\": \"fast\"}"), MT_ERR_INVALID_ARG, "'lr'");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"pattern\": 3}"), MT_ERR_INVALID_ARG, "pattern");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"sequence_parallel\": \"yes\"}"), MT_ERR_INVALID_ARG,
               "sequence_parallel");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"optimizer\": \"sgd\"}"), MT_ERR_INVALID_ARG, "optimizer");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"seed\": -1}"), MT_ERR_INVALID_ARG, "seed");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "[1, 2]"), MT_ERR_INVALID_ARG, "object");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": "), MT_ERR_INVALID_ARG, "JSON");
    EXPECT(!memcmp(&c, &before, sizeof c));

    /* round trip: every key, with awkward values */
    mt_config_set(&ctx, &c, "seed=18446744073709551557");
    mt_config_set(&ctx, &c, "norm_eps=1.2345678e-7");
    mt_config_set(&ctx, &c, "muon_momentum=0.3333333");
    mt_config_set(&ctx, &c, "optimizer=adamw");
    mt_config_set(&ctx, &c, "reshard_after_forward=false");
    char *js = mt_config_to_json(&c);
    EXPECT(js != NULL);
    struct mt_config d;
    mt_config_defaults(&d);
    EXPECT(mt_config_apply_json(&ctx, &d, js) == MT_OK);
    EXPECT(!memcmp(&c, &d, sizeof c));
    EXPECT(js && strstr(js, "\"aux_loss_coef\":\t0.01")); /* shortest float form */
    free(js);

    /* load_file: missing file is IO, bad content names file and key */
    char dir[] = "/tmp/mt_test_config_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/c.json", dir);
    EXPECT_ERR(mt_config_load_file(&ctx, &c, path), MT_ERR_IO, "c.json");
    FILE *f = fopen(path, "w");
    fputs("{\"n_head\": 8, \"top_kk\": 1}", f);
    fclose(f);
    EXPECT_ERR(mt_config_load_file(&ctx, &c, path), MT_ERR_INVALID_ARG, "did you mean 'top_k'");
    EXPECT(strstr(mt_ctx_last_error(&ctx), "c.json") != NULL);
    f = fopen(path, "w");
    fputs("{\"n_head\": 8, \"n_kv_head\": 4}", f);
    fclose(f);
    EXPECT(mt_config_load_file(&ctx, &c, path) == MT_OK && c.n_head == 8 && c.n_kv_head == 4);
    unlink(path);
    rmdir(dir);
    mt_ctx_free(&ctx);
}

/* resolve one override list on top of a valid base; expect CONFIG + needle */
static void expect_rule(int line, const char *const *sets, int n, const char *needle)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c;
    mt_config_defaults(&c);
    c.vocab_size = 256;
    for (int i = 0; i < n; i++)
        if (mt_config_set(&ctx, &c, sets[i]) != MT_OK) {
            fprintf(stderr, "%s:%d: FAILED: set %s: %s\n", __FILE__, line, sets[i], mt_ctx_last_error(&ctx));
            n_fail++;
            return;
        }
    mt_test_expect_err(__FILE__, line, &ctx, mt_config_resolve(&ctx, &c, 5), MT_ERR_CONFIG, needle);
}
#define RULE1(a, needle)       do { const char *s_[] = {a}; expect_rule(__LINE__, s_, 1, needle); } while (0)
#define RULE2(a, b, needle)    do { const char *s_[] = {a, b}; expect_rule(__LINE__, s_, 2, needle); } while (0)

static void test_resolve_rules(void)
{
    RULE2("n_head=6", "n_kv_head=4", "n_head % n_kv_head != 0 (n_head=6, n_kv_head=4)");
    RULE2("n_head=6", "n_kv_head=3", "d_model % n_head");     /* 256 % 6 */
    RULE2("n_head=4", "head_dim=7", "head_dim");
    RULE1("vocab_size=1", "vocab_size");
    RULE1("pattern=AAE", "pattern length");
    RULE1("pattern=AAXA", "pattern");
    RULE1("mod_capacity=0", "mod_capacity must be in (0, 1]");
    RULE1("pattern=AAmA", "pattern[2]='m': Mamba-3 blocks cannot be routed");
    /* routed kinds are the table's (a, e): an MTP module's block must not be one */
    do {
        const char *s_[] = {"pattern=AaAA", "mtp_depth=1", "mtp_block=a"};
        expect_rule(__LINE__, s_, 3, "mtp_block=a is a routed (Mixture-of-Depths) block");
    } while (0);
    RULE2("pattern=AEAE", "top_k=9", "top_k");
    RULE2("pattern=AEAE", "n_experts=1", "top_k");
    RULE2("batch_size=6", "microbatches=4", "batch_size % microbatches");
    RULE1("norm_eps=0", "norm_eps");
    RULE1("adam_eps=0", "adam_eps");
    RULE1("adam_beta1=1", "adam_beta1");
    RULE1("adam_beta2=1", "adam_beta2");
    RULE1("rope_theta=0", "rope_theta");

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c;
    /* direct struct edits are checked too */
    mt_config_defaults(&c);
    c.vocab_size = 256;
    c.seq_len = 1;
    EXPECT_ERR(mt_config_resolve(&ctx, &c, 1), MT_ERR_CONFIG, "seq_len");
    mt_config_defaults(&c);
    c.vocab_size = 256;
    c.d_model = 0;
    EXPECT_ERR(mt_config_resolve(&ctx, &c, 1), MT_ERR_CONFIG, "d_model");
    mt_config_defaults(&c);
    c.vocab_size = 256;
    strcpy(c.optimizer, "sgd");
    EXPECT_ERR(mt_config_resolve(&ctx, &c, 1), MT_ERR_CONFIG, "optimizer");

    /* fine cases: top_k > n_experts is fine with no E block; head_dim given when D % H != 0;
     * warmup longer than total is allowed */
    mt_config_defaults(&c);
    c.vocab_size = 65536;
    mt_config_set(&ctx, &c, "top_k=20");
    mt_config_set(&ctx, &c, "n_head=6");
    mt_config_set(&ctx, &c, "n_kv_head=3");
    mt_config_set(&ctx, &c, "head_dim=40");
    mt_config_set(&ctx, &c, "warmup_steps=100");
    mt_config_set(&ctx, &c, "total_steps=7");
    mt_config_set(&ctx, &c, "d_model=96");
    EXPECT(mt_config_resolve(&ctx, &c, 1000) == MT_OK);
    EXPECT(c.head_dim == 40 && c.total_steps == 7 && c.mlp_hidden == 256 && c.expert_hidden == 64);

    mt_config_defaults(&c);
    c.vocab_size = 300;
    mt_config_set(&ctx, &c, "pattern=AEEA");
    mt_config_set(&ctx, &c, "mlp_hidden=100");
    EXPECT(mt_config_resolve(&ctx, &c, 3) == MT_OK);
    EXPECT(c.mlp_hidden == 100 && c.expert_hidden == 25 && mt_config_is_moe_layer(&c, 1) &&
           !mt_config_is_moe_layer(&c, 0));
    mt_ctx_free(&ctx);
}

static void test_same_model_and_help(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config a, b;
    mt_config_defaults(&a);
    a.vocab_size = 512;
    b = a;
    char why[256];
    EXPECT(mt_config_same_model(&a, &b, why, sizeof why) == 1);
    b.lr = 0.5f;                       /* training key: still the same model */
    b.batch_size = 64;
    EXPECT(mt_config_same_model(&a, &b, why, sizeof why) == 1);
    b.d_model = 128;
    b.n_head = 8;
    EXPECT(mt_config_same_model(&a, &b, why, sizeof why) == 0);
    EXPECT(strstr(why, "d_model") && strstr(why, "256") && strstr(why, "128"));
    b = a;
    strcpy(b.pattern, "AEAA");
    EXPECT(mt_config_same_model(&a, &b, why, sizeof why) == 0 && strstr(why, "pattern") && strstr(why, "AEAA"));

    /* help: every key on its own line, with type and default */
    FILE *f = tmpfile();
    mt_config_print_help(f);
    long len = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)len + 1);
    EXPECT(fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    EXPECT(strstr(buf, "n_layer") && strstr(buf, "reshard_after_forward") && strstr(buf, "muon|adamw"));
    EXPECT(strstr(buf, "1e-06") && strstr(buf, "1337"));
    int lines = 0;
    for (char *p = buf; *p; p++) lines += *p == '\n';
    /* header + one line per key; the key count is the config's JSON size */
    char *js = mt_config_to_json(&a);
    cJSON *jo = js ? cJSON_Parse(js) : NULL;
    EXPECT(jo && lines == 1 + cJSON_GetArraySize(jo));
    cJSON_Delete(jo);
    free(js);
    free(buf);
    mt_ctx_free(&ctx);
}

/* write `len` bytes of `text` to path */
static void write_bytes(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) { n_fail++; return; }
    fwrite(text, 1, len, f);
    fclose(f);
}

/* Issue 13 item 8 (messages): every config refusal is one line, names the
 * file and the place, and a message may quote the previous one. */
static void test_messages(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config c, before;
    mt_config_defaults(&c);
    before = c;

    /* an error message built from the previous one (ckpt.c's "bad config: %s")
     * must not overlap its own buffer: valgrind's "bad config: teger" */
    mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "config key 'n_layer': 'x' is not an integer");
    mt_ctx_error(&ctx, MT_ERR_FORMAT, "d/manifest.json: bad config: %s", mt_ctx_last_error(&ctx));
    EXPECT(!strcmp(mt_ctx_last_error(&ctx), "d/manifest.json: bad config: config key 'n_layer': 'x' is not an integer"));
    mt_ctx_error(&ctx, MT_ERR_FORMAT, "%s", mt_ctx_last_error(&ctx));
    EXPECT(!strcmp(mt_ctx_last_error(&ctx), "d/manifest.json: bad config: config key 'n_layer': 'x' is not an integer"));

    /* refused: duplicate keys, trailing text, a syntax error (one line, with the place) */
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 2, \"n_layer\": 3}"), MT_ERR_INVALID_ARG,
               "duplicate config key 'n_layer'");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 2}\n  garbage"), MT_ERR_INVALID_ARG,
               "trailing text after the JSON object at line 2, column 3");
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 2} {}"), MT_ERR_INVALID_ARG, "trailing text");
    EXPECT(mt_config_apply_json(&ctx, &c, "{\"n_layer\": 2}\n \t\r\n") == MT_OK); /* trailing white space is fine */
    c = before;
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\n  \"n_layer\": 2,\n  \"n_head\" 4,\n  \"d_model\": 64\n}\n"),
               MT_ERR_INVALID_ARG, "invalid JSON at line 3, column");
    EXPECT(strchr(mt_ctx_last_error(&ctx), '\n') == NULL);
    EXPECT(!memcmp(&c, &before, sizeof c));

    char dir[] = "/tmp/mt_test_config_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/m.json", dir);
    static const char syntax[] = "{\n  \"n_layer\": 2,\n  \"n_head\": ,\n  \"d_model\": 64\n}\n";
    write_bytes(path, syntax, sizeof syntax - 1);
    EXPECT_ERR(mt_config_load_file(&ctx, &c, path), MT_ERR_INVALID_ARG, "m.json: config: invalid JSON at line 3, column");
    EXPECT(strchr(mt_ctx_last_error(&ctx), '\n') == NULL);
    /* text after a NUL byte: the parser would stop at the NUL and ignore it */
    static const char nul[] = "{\"n_layer\": 2}\0{\"n_layer\": 3}";
    write_bytes(path, nul, sizeof nul - 1);
    EXPECT_ERR(mt_config_load_file(&ctx, &c, path), MT_ERR_INVALID_ARG, "NUL byte at offset 14");
    EXPECT(strstr(mt_ctx_last_error(&ctx), "m.json") != NULL);
    static const char dup[] = "{\"seed\": 1,\n \"lr\": 0.1,\n \"seed\": 2}";
    write_bytes(path, dup, sizeof dup - 1);
    EXPECT_ERR(mt_config_load_file(&ctx, &c, path), MT_ERR_INVALID_ARG, "duplicate config key 'seed'");
    EXPECT(!memcmp(&c, &before, sizeof c));
    unlink(path);
    rmdir(dir);
    mt_ctx_free(&ctx);
}

static void test_knobs_object(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    unsetenv("MT_ZERO_OVERLAP");
    setenv("MT_NCCL_TIMEOUT_S", "99", 1);
    struct mt_config c;
    mt_config_defaults(&c);
    struct mt_knobs k;
    mt_knobs_init(&k);
    EXPECT(k.source[MT_KNOB_NCCL_TIMEOUT] == MT_KNOB_ENV && !strcmp(k.value[MT_KNOB_NCCL_TIMEOUT], "99"));
    EXPECT(mt_knobs_set(&ctx, &k, "zero_overlap=0") == MT_OK);
    /* the config comes after --knob here: the command line still wins; the config beats env */
    EXPECT(mt_config_apply_json_knobs(&ctx, &c, &k, "{\"seed\": 7, \"knobs\": {\"zero_overlap\": true, "
                                                    "\"nccl_timeout_s\": 2.5}}") == MT_OK);
    EXPECT(c.seed == 7);
    EXPECT(!strcmp(k.value[MT_KNOB_ZERO_OVERLAP], "0") && k.source[MT_KNOB_ZERO_OVERLAP] == MT_KNOB_CLI);
    EXPECT(!strcmp(k.value[MT_KNOB_NCCL_TIMEOUT], "2.5") && k.source[MT_KNOB_NCCL_TIMEOUT] == MT_KNOB_CONFIG);
    /* all or nothing: a bad knob leaves config and knobs as they were */
    EXPECT_ERR(mt_config_apply_json_knobs(&ctx, &c, &k, "{\"seed\": 8, \"knobs\": {\"test_fault\": \"0:1:nan\", "
                                                        "\"nope\": 1}}"), MT_ERR_INVALID_ARG, "config knobs: 'nope': unknown knob");
    EXPECT(c.seed == 7 && k.source[MT_KNOB_TEST_FAULT] == MT_KNOB_DEFAULT);
    EXPECT_ERR(mt_config_apply_json_knobs(&ctx, &c, &k, "{\"knobs\": 3}"), MT_ERR_INVALID_ARG, "config knobs");
    /* without a knob set the object is still checked */
    EXPECT_ERR(mt_config_apply_json(&ctx, &c, "{\"knobs\": {\"zero_overlap\": 2}}"), MT_ERR_INVALID_ARG,
               "config knobs.zero_overlap: expected 0 or 1");
    EXPECT(mt_config_apply_json(&ctx, &c, "{\"knobs\": {\"zero_overlap\": 0}}") == MT_OK);
    char *j = mt_config_to_json(&c);
    EXPECT(j && !strstr(j, "knobs"));
    free(j);
    unsetenv("MT_NCCL_TIMEOUT_S");
    mt_ctx_free(&ctx);
}

int main(void)
{
    test_defaults();
    test_set();
    test_json();
    test_messages();
    test_resolve_rules();
    test_same_model_and_help();
    test_knobs_object();
    if (n_fail) {
        fprintf(stderr, "test_config: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_config: ok\n");
    return 0;
}
