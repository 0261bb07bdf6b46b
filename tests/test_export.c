/*
 * test_export.c — safetensors writer/reader round trip (F32; BF16 and F16
 * files built by hand), malformed files, Qwen3 / Qwen3-MoE config.json,
 * and HF -> checkpoint -> HF bit-exact through mt_import_hf / mt_export_hf.
 * If python3 is present, its json module also parses the header.
 * Exits non-zero on failure.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mt_config.h"
#include "model/mt_model.h"
#include "tok/mt_tok.h"
#include "io/mt_ckpt.h"
#include "io/mt_export.h"
#include "mt_test.h"


static float rnd(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* write a raw safetensors file: header text (padded here) + data */
static void write_raw(const char *path, const char *hdr, const void *data, size_t n)
{
    size_t hl = (strlen(hdr) + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) { n_fail++; return; }
    unsigned char len[8];
    for (int b = 0; b < 8; b++) len[b] = (unsigned char)(((uint64_t)hl >> (8 * b)) & 0xff);
    fwrite(len, 1, 8, f);
    fputs(hdr, f);
    for (size_t i = strlen(hdr); i < hl; i++) fputc(' ', f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    s[n] = 0;
    fclose(f);
    return s;
}

static void test_safetensors(struct mt_ctx *ctxp, const char *root)
{
    struct mt_ctx ctx = *ctxp;
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", root);
    float w[6] = {1, -2, 3.5f, 1e-8f, -0.0f, 7}, g[3] = {0.25f, 0.5f, 2};
    struct mt_st_tensor t[2];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "z.weight");   /* given out of name order */
    t[0].ndim = 2; t[0].shape[0] = 2; t[0].shape[1] = 3; t[0].data = w;
    snprintf(t[1].name, sizeof t[1].name, "a.norm");
    t[1].ndim = 1; t[1].shape[0] = 3; t[1].data = g;
    EXPECT_ERR(mt_safetensors_write(&ctx, path, t, 2), MT_OK, NULL);

    /* the raw header: length multiple of 8, JSON, tensors in name order */
    FILE *f = fopen(path, "rb");
    unsigned char len[8] = {0};
    if (f) { if (fread(len, 1, 8, f) != 8) n_fail++; fclose(f); }
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--) hl = (hl << 8) | len[b];
    EXPECT(hl % 8 == 0 && hl > 0 && hl < 4096);
    char *all = slurp(path);
    if (all) {
        char *hdr = strndup(all + 8, hl);
        cJSON *h = cJSON_Parse(hdr);
        EXPECT(h != NULL);
        cJSON *md = cJSON_GetObjectItem(h, "__metadata__");
        EXPECT(md && cJSON_IsString(cJSON_GetObjectItem(md, "format")) &&
               !strcmp(cJSON_GetObjectItem(md, "format")->valuestring, "pt"));
        EXPECT(strstr(hdr, "\"a.norm\"") < strstr(hdr, "\"z.weight\""));
        cJSON *z = cJSON_GetObjectItem(h, "z.weight");
        cJSON *off = cJSON_GetObjectItem(z, "data_offsets");
        EXPECT(!strcmp(cJSON_GetObjectItem(z, "dtype")->valuestring, "F32"));
        EXPECT(cJSON_GetArrayItem(off, 0)->valueint == 12 && cJSON_GetArrayItem(off, 1)->valueint == 36);
        cJSON_Delete(h);
        free(hdr);
        free(all);
    }

    /* reader: same names, shapes, bits */
    struct mt_safetensors *st = NULL;
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_OK, NULL);
    if (st) {
        EXPECT(st->n == 2);
        const struct mt_st_tensor *a = mt_safetensors_find(st, "a.norm"), *z = mt_safetensors_find(st, "z.weight");
        EXPECT(a && z && a->ndim == 1 && a->shape[0] == 3 && z->ndim == 2 && z->shape[0] == 2 && z->shape[1] == 3);
        float buf[6];
        if (z) EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, z, buf), MT_OK, NULL);
        EXPECT(memcmp(buf, w, sizeof w) == 0);
        if (a) EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, a, buf), MT_OK, NULL);
        EXPECT(memcmp(buf, g, sizeof g) == 0);
        EXPECT(mt_safetensors_find(st, "nope") == NULL);
        mt_safetensors_close(&ctx, st);
    }

    /* python's json parses the header (optional) */
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "python3 -c \"import json,struct,sys; b=open('%s','rb').read(); n=struct.unpack('<Q',b[:8])[0]; "
                 "h=json.loads(b[8:8+n]); assert n%%8==0; assert h['z.weight']['shape']==[2,3]; "
                 "assert h['a.norm']['data_offsets']==[0,12]; assert len(b)==8+n+36\"", path);
        EXPECT(system(cmd) == 0);
    }

    /* BF16 and F16 converted to float */
    uint16_t bf[3] = {0x3f80, 0xc020, 0x3e20};      /* 1, -2.5, 0.15625 */
    uint16_t hf[4] = {0x3c00, 0xc100, 0x0001, 0x7c00}; /* 1, -2.5, 2^-24, inf */
    snprintf(path, sizeof path, "%s/b.safetensors", root);
    {
        char data[22];
        memcpy(data, bf, 6);
        memcpy(data + 6, hf, 8);
        memset(data + 14, 0, 8);
        write_raw(path, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                        "\"y\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[6,14]},"
                        "\"i\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[14,22]}}",
                  data, sizeof data);
    }
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_OK, NULL);
    if (st) {
        float buf[4];
        EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, mt_safetensors_find(st, "x"), buf), MT_OK, NULL);
        EXPECT(buf[0] == 1.0f && buf[1] == -2.5f && buf[2] == 0.15625f);
        EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, mt_safetensors_find(st, "y"), buf), MT_OK, NULL);
        EXPECT(buf[0] == 1.0f && buf[1] == -2.5f && buf[2] == ldexpf(1.0f, -24) && isinf(buf[3]));
        EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, mt_safetensors_find(st, "i"), buf), MT_ERR_FORMAT, "I64");
        mt_safetensors_close(&ctx, st);
    }

    /* malformed: offsets past the end, size mismatch, garbage, missing */
    snprintf(path, sizeof path, "%s/c.safetensors", root);
    write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", w, 8);
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_ERR_FORMAT, "x");
    write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", w, 16);
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_ERR_FORMAT, "x");
    write_raw(path, "[1,2", w, 16);
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_ERR_FORMAT, NULL);
    f = fopen(path, "wb");
    if (f) { fputs("\xff\xff\xff\xff\xff\xff\xff\x7f", f); fclose(f); }
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_ERR_FORMAT, NULL);
    snprintf(path, sizeof path, "%s/none.safetensors", root);
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_ERR_IO, NULL);
    EXPECT(st == NULL);
    *ctxp = ctx;
}

/* every tensor of the tiny model below, SPEC.md names */
static int model_names(const struct mt_config *c, char names[][160], int64_t shapes[][2])
{
    int n = 0;
    int64_t V = c->vocab_size, D = c->d_model, hd = c->head_dim;
#define ADD(r, cc, ...) do { snprintf(names[n], 160, __VA_ARGS__); shapes[n][0] = (r); shapes[n][1] = (cc); n++; } while (0)
    ADD(V, D, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layer; l++) {
        ADD(D, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(c->n_head * hd, D, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(c->n_kv_head * hd, D, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(c->n_kv_head * hd, D, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(D, c->n_head * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(hd, 0, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(hd, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        ADD(D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (c->pattern[l] == 'A') {
            ADD(c->mlp_hidden, D, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(c->mlp_hidden, D, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(D, c->mlp_hidden, "model.layers.%d.mlp.down_proj.weight", l);
        } else {
            ADD(c->n_experts, D, "model.layers.%d.mlp.gate.weight", l);
            for (int e = 0; e < c->n_experts; e++) {
                ADD(c->expert_hidden, D, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(c->expert_hidden, D, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(D, c->expert_hidden, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        }
    }
    ADD(D, 0, "model.norm.weight");
    ADD(V, D, "lm_head.weight");
#undef ADD
    return n;
}

static void test_roundtrip(struct mt_ctx *ctxp, const char *root)
{
    struct mt_ctx ctx = *ctxp;
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.vocab_size = 32; cfg.n_layer = 2; cfg.d_model = 16; cfg.n_head = 2; cfg.n_kv_head = 1;
    cfg.seq_len = 64; cfg.mlp_hidden = 32; cfg.n_experts = 3; cfg.top_k = 2; cfg.expert_hidden = 8;
    snprintf(cfg.pattern, sizeof cfg.pattern, "AE");
    EXPECT_ERR(mt_config_resolve(&ctx, &cfg, 10), MT_OK, NULL);

    /* config.json: Qwen3-MoE keys */
    char warn[1024] = "";
    char *cj = mt_export_hf_config(&cfg, 3);
    EXPECT(cj && mt_export_hf_lossy(&cfg, NULL, 0) == 0);
    cJSON *o = cJSON_Parse(cj);
    EXPECT(o && !strcmp(cJSON_GetObjectItem(o, "model_type")->valuestring, "qwen3_moe"));
    EXPECT(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "architectures"), 0)->valuestring, "Qwen3MoeForCausalLM"));
    cJSON *mo = cJSON_GetObjectItem(o, "mlp_only_layers");
    EXPECT(cJSON_GetArraySize(mo) == 1 && cJSON_GetArrayItem(mo, 0)->valueint == 0);
    EXPECT(cJSON_GetObjectItem(o, "head_dim")->valueint == 8 && cJSON_GetObjectItem(o, "num_experts")->valueint == 3);
    EXPECT(cJSON_GetObjectItem(o, "moe_intermediate_size")->valueint == 8);
    EXPECT(cJSON_GetObjectItem(o, "max_position_embeddings")->valueint == 64);
    EXPECT(cJSON_GetObjectItem(o, "bos_token_id")->valueint == 3 && cJSON_GetObjectItem(o, "eos_token_id")->valueint == 3);
    EXPECT(cJSON_IsTrue(cJSON_GetObjectItem(o, "norm_topk_prob")));
    /* shortest decimal: 0.01, not 0.0099999998 */
    char *rtext = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "router_aux_loss_coef"));
    EXPECT(rtext && !strcmp(rtext, "0.01"));
    free(rtext);
    EXPECT(cJSON_GetObjectItem(o, "meshtrain_z_loss_coef") && cJSON_GetObjectItem(o, "meshtrain_export"));
    EXPECT(cJSON_IsFalse(cJSON_GetObjectItem(o, "tie_word_embeddings")));
    EXPECT(cJSON_GetObjectItem(o, "rms_norm_eps")->valuedouble == 1e-6 || cfg.norm_eps != 1e-6f);
    cJSON_Delete(o);

    /* HF dir: config.json + model.safetensors of random tensors */
    char hf[512], ck[512], hf2[512], path[700];
    snprintf(hf, sizeof hf, "%s/hf", root);
    snprintf(ck, sizeof ck, "%s/ck", root);
    snprintf(hf2, sizeof hf2, "%s/hf2", root);
    mkdir(hf, 0755);
    snprintf(path, sizeof path, "%s/config.json", hf);
    FILE *f = fopen(path, "w");
    if (f) { fputs(cj, f); fclose(f); }
    free(cj);
    static char names[128][160];
    static int64_t shapes[128][2];
    int n = model_names(&cfg, names, shapes);
    struct mt_st_tensor *t = calloc((size_t)n, sizeof *t);
    float **data = calloc((size_t)n, sizeof *data);
    unsigned s = 5;
    for (int i = 0; i < n; i++) {
        memcpy(t[i].name, names[i], sizeof t[i].name);
        t[i].ndim = shapes[i][1] ? 2 : 1;
        t[i].shape[0] = shapes[i][0];
        t[i].shape[1] = shapes[i][1];
        size_t ne = mt_st_numel(&t[i]);
        data[i] = malloc(ne * sizeof(float));
        for (size_t k = 0; k < ne; k++) data[i][k] = rnd(&s);
        t[i].data = data[i];
    }
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    EXPECT_ERR(mt_safetensors_write(&ctx, path, t, n), MT_OK, NULL);   /* sorts t (pointers travel along) */

    /* import -> checkpoint (step 0, no optimizer state) */
    warn[0] = 0;
    EXPECT_ERR(mt_import_hf(&ctx, hf, ck, 0, 0, warn, sizeof warn), MT_OK, NULL);
    struct mt_config c2;
    struct mt_ckpt_meta meta;
    EXPECT_ERR(mt_ckpt_read_meta(&ctx, ck, &c2, &meta), MT_OK, NULL);
    EXPECT(meta.step == 0 && meta.optim_t == 0);
    EXPECT(!strcmp(c2.pattern, "AE") && c2.n_experts == 3 && c2.top_k == 2 && c2.expert_hidden == 8);
    EXPECT(c2.d_model == 16 && c2.n_kv_head == 1 && c2.head_dim == 8 && c2.seq_len == 64 && c2.vocab_size == 32);
    snprintf(path, sizeof path, "%s/optim.bin", ck);
    EXPECT(access(path, F_OK) != 0);

    /* export -> HF again: same tensors, same bits */
    warn[0] = 0;
    struct mt_export_opts eo = {.bos_token_id = -1};
    EXPECT_ERR(mt_export_hf(&ctx, ck, hf2, &eo, warn, sizeof warn), MT_OK, NULL);
    EXPECT(strstr(warn, "no tokenizer") != NULL);   /* the only warning: nothing to export it from */
    struct mt_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", hf2);
    EXPECT_ERR(mt_safetensors_open(&ctx, path, &st), MT_OK, NULL);
    if (st) {
        EXPECT(st->n == n);
        for (int i = 0; i < n; i++) {
            const struct mt_st_tensor *x = mt_safetensors_find(st, t[i].name);
            EXPECT(x != NULL);
            if (!x) continue;
            size_t ne = mt_st_numel(&t[i]);
            EXPECT(mt_st_numel(x) == ne && x->ndim == t[i].ndim);
            float *buf = malloc(ne * sizeof(float));
            EXPECT_ERR(mt_safetensors_read_f32(&ctx, st, x, buf), MT_OK, NULL);
            EXPECT(memcmp(buf, t[i].data, ne * sizeof(float)) == 0);
            free(buf);
        }
        mt_safetensors_close(&ctx, st);
    }
    /* exporting again over a previous export is fine; over a foreign dir is
     * refused; over (or around, or inside) the checkpoint always */
    EXPECT_ERR(mt_export_hf(&ctx, ck, hf2, &eo, warn, sizeof warn), MT_OK, NULL);
    char foreign[540];
    snprintf(foreign, sizeof foreign, "%s/foreign", root);
    mkdir(foreign, 0755);
    snprintf(path, sizeof path, "%s/notes.txt", foreign);
    f = fopen(path, "w");
    if (f) { fputs("keep\n", f); fclose(f); }
    EXPECT_ERR(mt_export_hf(&ctx, ck, foreign, &eo, warn, sizeof warn), MT_ERR_INVALID_ARG, "--force");
    eo.force = 1;
    EXPECT_ERR(mt_export_hf(&ctx, ck, root, &eo, warn, sizeof warn), MT_ERR_INVALID_ARG, "overlaps");
    EXPECT_ERR(mt_export_hf(&ctx, ck, ck, &eo, warn, sizeof warn), MT_ERR_INVALID_ARG, "overlaps");
    snprintf(path, sizeof path, "%s/sub", ck);
    EXPECT_ERR(mt_export_hf(&ctx, ck, path, &eo, warn, sizeof warn), MT_ERR_INVALID_ARG, "overlaps");
    EXPECT(access(path, F_OK) != 0);
    EXPECT_ERR(mt_export_hf(&ctx, ck, foreign, &eo, warn, sizeof warn), MT_OK, NULL);
    snprintf(path, sizeof path, "%s/notes.txt", foreign);
    EXPECT(access(path, F_OK) == 0);   /* --force writes only the export's files */
    eo.force = 0;
    EXPECT_ERR(mt_export_hf(&ctx, "/nonexistent/ck", hf2, &eo, warn, sizeof warn), MT_ERR_IO, NULL);
    EXPECT_ERR(mt_import_hf(&ctx, hf, foreign, 0, 0, warn, sizeof warn), MT_ERR_INVALID_ARG, "--force");
    EXPECT_ERR(mt_import_hf(&ctx, hf, hf, 0, 1, warn, sizeof warn), MT_ERR_INVALID_ARG, "overlaps");

    /* import checks tensor shapes against config.json */
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    t[0].shape[0] += 1;   /* first in name order: lm_head.weight [V+1, D] */
    float *big = calloc((size_t)(t[0].shape[0] * t[0].shape[1]), sizeof(float));
    const float *keep = t[0].data;
    t[0].data = big;
    EXPECT_ERR(mt_safetensors_write(&ctx, path, t, n), MT_OK, NULL);
    EXPECT_ERR(mt_import_hf(&ctx, hf, ck, 0, 0, warn, sizeof warn), MT_ERR_FORMAT, t[0].name);
    t[0].data = keep;
    free(big);

    /* shared expert and softcap: what HF cannot represent is named; the
     * meshtrain_* keys carry them through export -> import */
    cfg.shared_expert_hidden = 8;
    cfg.logit_softcap = 15.0f;
    cfg.z_loss_coef = 0.003f;
    warn[0] = 0;
    EXPECT(mt_export_hf_lossy(&cfg, warn, sizeof warn) == 2);
    EXPECT(strstr(warn, "shared expert") && strstr(warn, "softcap"));
    cj = mt_export_hf_config(&cfg, -1);
    EXPECT(cj && strstr(cj, "meshtrain_shared_expert_hidden") && !strstr(cj, "bos_token_id"));
    int tied = 0;
    struct mt_config c3;
    mt_config_defaults(&c3);
    EXPECT_ERR(mt_export_hf_config_parse(&ctx, cj, &c3, &tied, NULL, 0), MT_OK, NULL);
    EXPECT(c3.shared_expert_hidden == 8 && !strcmp(c3.pattern, "AE") && !tied);
    EXPECT(c3.logit_softcap == 15.0f && c3.z_loss_coef == 0.003f && c3.aux_loss_coef == cfg.aux_loss_coef);
    EXPECT_ERR(mt_config_resolve(&ctx, &c3, 10), MT_OK, NULL);
    char why[256];
    EXPECT(mt_config_same_model(&cfg, &c3, why, sizeof why));
    free(cj);
    /* a lossy model is refused by export (nothing written), unless allow_lossy */
    {
        char ck2[600], hf3[600];
        snprintf(ck2, sizeof ck2, "%s/ck_lossy", root);
        snprintf(hf3, sizeof hf3, "%s/hf_lossy", root);
        int np = mt_model_registry(&cfg, NULL, 0);
        struct mt_param *ps = calloc((size_t)np, sizeof *ps);
        mt_model_registry(&cfg, ps, np);
        for (int i = 0; i < np; i++) ps[i].data = calloc(ps[i].numel, sizeof(float));
        struct mt_ckpt_meta m0;
        memset(&m0, 0, sizeof m0);
        snprintf(m0.mesh, sizeof m0.mesh, "pp=1,dp=1,ep=1,tp=1");
        EXPECT_ERR(mt_ckpt_save(&ctx, NULL, ck2, &cfg, &m0, ps, np, NULL), MT_OK, NULL);
        for (int i = 0; i < np; i++) free(ps[i].data);
        free(ps);
        warn[0] = 0;
        EXPECT_ERR(mt_export_hf(&ctx, ck2, hf3, &eo, warn, sizeof warn), MT_ERR_INVALID_ARG, "allow-lossy");
        EXPECT(strstr(mt_ctx_last_error(&ctx), "softcap") && strstr(mt_ctx_last_error(&ctx), "shared expert"));
        EXPECT(!strchr(mt_ctx_last_error(&ctx), '\n') && access(hf3, F_OK) != 0);
        eo.allow_lossy = 1;
        EXPECT_ERR(mt_export_hf(&ctx, ck2, hf3, &eo, warn, sizeof warn), MT_OK, NULL);
        EXPECT(strstr(warn, "drops logit_softcap") && strstr(warn, "drops shared expert"));
        eo.allow_lossy = 0;
        /* and export -> import gives back the same model */
        char ck3[600];
        snprintf(ck3, sizeof ck3, "%s/ck_lossy_back", root);
        EXPECT_ERR(mt_import_hf(&ctx, hf3, ck3, 0, 0, warn, sizeof warn), MT_OK, NULL);
        mt_config_defaults(&c3);
        EXPECT_ERR(mt_ckpt_read_meta(&ctx, ck3, &c3, NULL), MT_OK, NULL);
        EXPECT(mt_config_same_model(&cfg, &c3, why, sizeof why));
    }

    /* import: transformers 5 spellings, and what cannot be represented */
    {
        const char *v5 = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":32,\"hidden_size\":16,\"num_hidden_layers\":2,"
                         "\"num_attention_heads\":2,\"intermediate_size\":32,\"num_local_experts\":3,"
                         "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"norm_topk_prob\":true,"
                         "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}";
        mt_config_defaults(&c3);
        EXPECT_ERR(mt_export_hf_config_parse(&ctx, v5, &c3, &tied, NULL, 0), MT_OK, NULL);
        EXPECT(c3.rope_theta == 1e6f && c3.n_experts == 3 && !strcmp(c3.pattern, "EE") && c3.head_dim == 0);
        static const struct { const char *from, *to, *err; } bad[] = {
            {"\"norm_topk_prob\":true", "\"norm_topk_prob\":false", "norm_topk_prob false"},
            {"\"norm_topk_prob\":true", "\"x\":1", "norm_topk_prob missing"},
            {"\"rope_type\":\"default\"", "\"rope_type\":\"yarn\"", "yarn"},
            {"\"num_local_experts\"", "\"n_routed\"", "num_experts"},
            {"\"norm_topk_prob\":true", "\"norm_topk_prob\":true,\"use_sliding_window\":true", "sliding"},
            {"\"norm_topk_prob\":true", "\"norm_topk_prob\":true,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}", "linear"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char buf[1024];
            const char *at = strstr(v5, bad[k].from);
            snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - v5), v5, bad[k].to, at + strlen(bad[k].from));
            mt_config_defaults(&c3);
            EXPECT_ERR(mt_export_hf_config_parse(&ctx, buf, &c3, &tied, NULL, 0), MT_ERR_FORMAT, bad[k].err);
        }
        /* qwen3 without head_dim: HF's default 128, not D/H */
        const char *q3 = "{\"model_type\":\"qwen3\",\"vocab_size\":32,\"hidden_size\":16,\"num_hidden_layers\":2,"
                         "\"num_attention_heads\":2,\"intermediate_size\":32}";
        mt_config_defaults(&c3);
        EXPECT_ERR(mt_export_hf_config_parse(&ctx, q3, &c3, &tied, NULL, 0), MT_OK, NULL);
        EXPECT(c3.head_dim == 128);
    }

    /* dense config: Qwen3 */
    snprintf(cfg.pattern, sizeof cfg.pattern, "AA");
    cfg.shared_expert_hidden = 0;
    cfg.logit_softcap = 0;
    cj = mt_export_hf_config(&cfg, -1);
    EXPECT(cj && strstr(cj, "\"Qwen3ForCausalLM\"") && !strstr(cj, "num_experts") && mt_export_hf_lossy(&cfg, NULL, 0) == 0);
    mt_config_defaults(&c3);
    EXPECT_ERR(mt_export_hf_config_parse(&ctx, cj, &c3, &tied, NULL, 0), MT_OK, NULL);
    EXPECT(!strcmp(c3.pattern, "AA") && c3.mlp_hidden == 32 && c3.n_head == 2);
    free(cj);
    EXPECT_ERR(mt_export_hf_config_parse(&ctx, "{\"model_type\":\"llama\"}", &c3, &tied, NULL, 0), MT_ERR_FORMAT,
               "llama");

    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(t);
    *ctxp = ctx;
}

/* tokenizer.json: every token's string, the merges, the special token; two
 * merges that spell the same bytes are refused (a HF vocab maps string -> id) */
static void test_tokenizer_json(struct mt_ctx *ctxp)
{
    struct mt_ctx ctx = *ctxp;
    const uint32_t ok_merges[] = {'a', 'b', 256, 'c', ' ', 0xff};
    struct mt_tok *tok = NULL;
    EXPECT_ERR(mt_tok_create(&ctx, ok_merges, 3, &tok), MT_OK, NULL);
    char *js = NULL;
    EXPECT_ERR(mt_tok_hf_json(&ctx, tok, &js), MT_OK, NULL);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    const cJSON *model = cJSON_GetObjectItem(o, "model");
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    EXPECT(cJSON_GetArraySize(vocab) == 260);
    EXPECT(cJSON_GetObjectItem(vocab, "abc") && cJSON_GetObjectItem(vocab, "abc")->valueint == 257);
    EXPECT(cJSON_GetObjectItem(vocab, "\xc4\xa0\xc3\xbf") && cJSON_GetObjectItem(vocab, "\xc4\xa0\xc3\xbf")->valueint == 258);
    EXPECT(cJSON_GetObjectItem(vocab, "\xc4\x80") && cJSON_GetObjectItem(vocab, "\xc4\x80")->valueint == 0); /* byte 0 -> U+0100 */
    const cJSON *m1 = cJSON_GetArrayItem(cJSON_GetObjectItem(model, "merges"), 1);
    EXPECT(m1 && !strcmp(cJSON_GetArrayItem(m1, 0)->valuestring, "ab") && !strcmp(cJSON_GetArrayItem(m1, 1)->valuestring, "c"));
    const cJSON *bos = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "added_tokens"), 0);
    EXPECT(bos && cJSON_GetObjectItem(bos, "id")->valueint == 259 && !strcmp(cJSON_GetObjectItem(bos, "content")->valuestring, "<|bos|>"));
    cJSON_Delete(o);
    free(js);
    mt_tok_destroy(&ctx, tok);
    /* "abc" twice: (a,b)+c and a+(b,c) */
    const uint32_t dup[] = {'a', 'b', 256, 'c', 'b', 'c', 'a', 258};
    EXPECT_ERR(mt_tok_create(&ctx, dup, 4, &tok), MT_OK, NULL);
    js = NULL;
    EXPECT_ERR(mt_tok_hf_json(&ctx, tok, &js), MT_ERR_FORMAT, "abc");
    EXPECT(js == NULL);
    mt_tok_destroy(&ctx, tok);
    *ctxp = ctx;
}

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char root[] = "/tmp/mt_test_export_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    test_safetensors(&ctx, root);
    test_roundtrip(&ctx, root);
    test_tokenizer_json(&ctx);
    EXPECT(ctx.bytes_live_total == 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    if (n_fail) {
        fprintf(stderr, "test_export: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_export: ok\n");
    return 0;
}
