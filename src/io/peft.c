/*
 * peft.c — a Hugging Face PEFT LoRA adapter onto a meshtrain base
 * (`train --init-from BASE --lora-from ADAPTER`, docs/lora.md "Import").
 *
 * PEFT names an adapter tensor "base_model.model." + the module's name +
 * ".lora_A.weight" / ".lora_B.weight", with A (r, in) and B (out, r): the
 * module names are meshtrain's tensor names (mt_export.h), and the math is
 * meshtrain's y = x W^T + (alpha / r) (x A^T) B^T when PEFT's options are
 * the plain ones (no dropout, bias, DoRA, rsLoRA, per-module ranks). So the
 * import is a copy by name, after refusing every option that would make
 * meshtrain's training differ from what the adapter was made for.
 */
#define _GNU_SOURCE
#include "mt_export.h"
#include "mt_ckpt.h"
#include "../model/mt_model.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mt_fileio.h"

#define PEFT_PREFIX "base_model.model."
#define PEFT_TEXT_MAX (16u << 20)

/* meshtrain's LoRA targets, in lora_targets order; leaf k < 7 is the module
 * name of target k on attention / the dense MLP, "expert" adapts the routed
 * experts' gate, up and down together */
static const char *const tgt_name[] = {"q", "k", "v", "o", "gate", "up", "down", "expert"};
static const char *const tgt_leaf[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

static int leaf_index(const char *leaf, size_t n)
{
    for (int k = 0; k < 7; k++)
        if (strlen(tgt_leaf[k]) == n && !strncmp(tgt_leaf[k], leaf, n)) return k;
    return -1;
}

/* The target of one adapter tensor name: *t = 0..6 (q..down) or 7 (expert,
 * *eleaf = the expert projection 4..6). -1: not an adapter tensor meshtrain
 * has (why in *why). */
static int classify(const char *name, int *t, int *eleaf, const char **why)
{
    size_t L = strlen(name), P = strlen(PEFT_PREFIX);
    *why = "not a LoRA A/B tensor of a module (DoRA magnitudes, biases, embeddings, modules_to_save and "
           "transformers-5 fused experts are not supported)";
    if (L < P + 15 || strncmp(name, PEFT_PREFIX, P)) return -1;
    const char *end = name + L - 14;   /* ".lora_A.weight" */
    if (strcmp(end, ".lora_A.weight") && strcmp(end, ".lora_B.weight")) return -1;
    char mod[256];
    if ((size_t)(end - name - P) >= sizeof mod) return -1;
    memcpy(mod, name + P, (size_t)(end - name - P));
    mod[end - name - P] = 0;
    int layer = -1, e = -1, n = 0;
    char leaf[32];
    *why = "a module meshtrain has no LoRA target for (q,k,v,o_proj of self_attn, gate,up,down_proj of the dense "
           "MLP and of the routed experts)";
    n = 0;
    if (sscanf(mod, "model.layers.%d.mlp.experts%n", &layer, &n) == 1 &&
        (!strcmp(mod + n, "") || !strcmp(mod + n, ".base_layer"))) {
        /* transformers 5's fused experts: down_proj ("experts"), gate_up_proj ("experts.base_layer") */
        *t = 7;
        *eleaf = mod[n] ? 5 : 6;
        return 0;
    }
    n = 0;
    if (sscanf(mod, "model.layers.%d.mlp.experts.%d.%31[a-z_]%n", &layer, &e, leaf, &n) == 3 && !mod[n]) {
        *eleaf = leaf_index(leaf, strlen(leaf));
        *t = 7;
        return *eleaf >= 4 ? 0 : -1;
    }
    n = 0;
    if ((sscanf(mod, "model.layers.%d.self_attn.%31[a-z_]%n", &layer, leaf, &n) == 2 && !mod[n] &&
         (*t = leaf_index(leaf, strlen(leaf))) >= 0 && *t < 4))
        return 0;
    n = 0;
    if ((sscanf(mod, "model.layers.%d.mlp.%31[a-z_]%n", &layer, leaf, &n) == 2 && !mod[n] &&
         (*t = leaf_index(leaf, strlen(leaf))) >= 4))
        return 0;
    return -1;
}

/* An option meshtrain cannot honour, or NULL. */
static const char *unsupported_option(const cJSON *j, char *buf, size_t n)
{
    static const char *const falsy[] = {"use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "use_qalora", NULL};
    static const char *const empty[] = {"layers_to_transform", "layers_pattern", "modules_to_save",
                                        "trainable_token_indices", "megatron_config", NULL};
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout");
    if (x && (!cJSON_IsNumber(x) || x->valuedouble != 0.0)) {
        snprintf(buf, n, "lora_dropout %g (meshtrain's adapters have no dropout: training would differ)",
                 cJSON_IsNumber(x) ? x->valuedouble : NAN);
        return buf;
    }
    x = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (x && !cJSON_IsNull(x) && (!cJSON_IsString(x) || strcmp(x->valuestring, "none"))) {
        snprintf(buf, n, "bias \"%s\" (meshtrain trains no biases)", cJSON_IsString(x) ? x->valuestring : "?");
        return buf;
    }
    for (int i = 0; falsy[i]; i++) {
        x = cJSON_GetObjectItemCaseSensitive(j, falsy[i]);
        if (x && !cJSON_IsFalse(x) && !cJSON_IsNull(x)) {
            snprintf(buf, n, "%s true (meshtrain's LoRA is plain: y = x W^T + (alpha/r) x A^T B^T)", falsy[i]);
            return buf;
        }
    }
    for (int i = 0; empty[i]; i++) {
        x = cJSON_GetObjectItemCaseSensitive(j, empty[i]);
        if (x && !cJSON_IsNull(x) && !((cJSON_IsObject(x) || cJSON_IsArray(x)) && !x->child) &&
            !(cJSON_IsString(x) && !x->valuestring[0])) {
            snprintf(buf, n, "%s set (meshtrain has one rank and alpha for every adapted module of every layer)",
                     empty[i]);
            return buf;
        }
    }
    /* the transformers-5 layout (peft 0.21's conversion, or export --hf-layout 5): the fused
     * experts' gate_up_proj at rank 2r and alpha 2 alpha (the same scale), the experts and the
     * dense MLP by parameter; nothing else */
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"), *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const double rv = cJSON_IsNumber(r) ? r->valuedouble : 0, av = cJSON_IsNumber(al) ? al->valuedouble : 0;
    static const char *const pats[] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; i < 2; i++) {
        const cJSON *it;
        x = cJSON_GetObjectItemCaseSensitive(j, pats[i]);
        cJSON_ArrayForEach(it, x) {
            const size_t L = it->string ? strlen(it->string) : 0;
            if (!cJSON_IsNumber(it) || L < 12 || strcmp(it->string + L - 12, "gate_up_proj") ||
                it->valuedouble != 2 * (i == 0 ? rv : av)) {
                snprintf(buf, n, "%s entry \"%s\" (meshtrain has one rank and alpha for every adapted module; only "
                         "the fused gate_up_proj's 2r / 2 alpha of transformers 5 is the same adapter)", pats[i],
                         it->string ? it->string : "?");
                return buf;
            }
        }
    }
    const cJSON *it;
    x = cJSON_GetObjectItemCaseSensitive(j, "target_parameters");
    cJSON_ArrayForEach(it, x) {
        const char *v = cJSON_IsString(it) ? it->valuestring : "";
        const char *dot = strrchr(v, '.'), *leaf = dot ? dot + 1 : v;
        char mod[160];
        int dense = 0;
        if (dot && !strcmp(leaf, "weight") && (size_t)(dot - v) < sizeof mod) {
            /* "....mlp.gate_proj.weight": a dense MLP matrix */
            memcpy(mod, v, (size_t)(dot - v));
            mod[dot - v] = 0;
            const char *d2 = strrchr(mod, '.'), *pp = d2 ? d2 + 1 : mod;
            dense = leaf_index(pp, strlen(pp)) >= 4;
        }
        if (!dense && strcmp(leaf, "gate_up_proj") && strcmp(leaf, "down_proj")) {
            snprintf(buf, n, "target_parameters entry \"%s\" (meshtrain adapts parameters only as the dense MLP's "
                     "and the fused experts' gate_up_proj / down_proj)", v);
            return buf;
        }
    }
    return NULL;
}

/* Long (~90 lines): the config's checks, then the tensors' targets. */
enum mt_status mt_peft_config(struct mt_ctx *ctx, const char *adapter_dir, struct mt_config *cfg)
{
    char path[PATH_MAX + 32], why[256];
    char *text = NULL;
    if (snprintf(path, sizeof path, "%s/adapter_config.json", adapter_dir) >= (int)sizeof path)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", adapter_dir);
    if (!mt_file_exists_in(adapter_dir, "adapter_config.json") ||
        !mt_file_exists_in(adapter_dir, "adapter_model.safetensors"))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: not a PEFT adapter folder (adapter_config.json "
                            "+ adapter_model.safetensors)", adapter_dir);
    MT_CHECK(mt_file_read_text(ctx, path, PEFT_TEXT_MAX, &text));
    cJSON *j = cJSON_Parse(text);
    mt_free(ctx, text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    enum mt_status rc = MT_OK;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    const char *bad;
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA"))
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: peft_type %s: only LORA adapters import", path,
                          cJSON_IsString(pt) ? pt->valuestring : "missing");
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble != floor(r->valuedouble) ||
             r->valuedouble > 1e6)
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: r must be an integer >= 1", path);
    else if (!cJSON_IsNumber(al) || !(al->valuedouble > 0) || !isfinite(al->valuedouble))
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: lora_alpha must be a number > 0", path);
    else if ((bad = unsupported_option(j, why, sizeof why)) != NULL)
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: %s: cannot continue this adapter", path, bad);
    else if (cJSON_IsArray(tm)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, tm) {
            const char *s = cJSON_IsString(it) ? it->valuestring : "?", *dot = strrchr(s, '.');
            const char *leaf = dot ? dot + 1 : s;
            if (leaf_index(leaf, strlen(leaf)) < 0) {
                rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: target module \"%s\": meshtrain has no LoRA target "
                                  "for it (q,k,v,o,gate,up,down_proj)", path, s);
                break;
            }
        }
    }
    const int rank = cJSON_IsNumber(r) ? (int)r->valuedouble : 0;
    const double alpha = cJSON_IsNumber(al) ? al->valuedouble : 0;
    cJSON_Delete(j);
    if (rc != MT_OK) return rc;

    /* the targets: what the tensors adapt (a regex target_modules says the same, less readably) */
    struct mt_safetensors *sf = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    MT_CHECK(mt_safetensors_open(ctx, path, &sf));
    unsigned found = 0, eleaves = 0;
    for (int i = 0; i < sf->n && rc == MT_OK; i++) {
        int t = -1, el = -1;
        const char *w;
        if (classify(sf->t[i].name, &t, &el, &w) != 0)
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: tensor %s: %s", path, sf->t[i].name, w);
        else {
            found |= 1u << t;
            if (t == 7) eleaves |= el == 5 ? 0x30u : 1u << el;   /* fused gate_up: gate and up */
        }
    }
    mt_safetensors_close(ctx, sf);
    if (rc != MT_OK) return rc;
    if (!found) return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s holds no LoRA tensors", path);
    if ((found & 0x80u) && eleaves != 0x70u)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: the routed experts have adapters on some of gate/up/down_proj "
                            "only: meshtrain's `expert` target adapts all three", path);
    char targets[64] = "", kv[96];
    for (int k = 0; k < 8; k++)
        if (found & (1u << k)) snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s%s",
                                        targets[0] ? "," : "", tgt_name[k]);
    snprintf(kv, sizeof kv, "lora_rank=%d", rank);
    MT_CHECK(mt_config_set(ctx, cfg, kv));
    snprintf(kv, sizeof kv, "lora_alpha=%.9g", alpha);
    MT_CHECK(mt_config_set(ctx, cfg, kv));
    snprintf(kv, sizeof kv, "lora_targets=%s", targets);
    return mt_config_set(ctx, cfg, kv);
}

/* One expert's adapter out of transformers 5's fused experts (the inverse
 * of export.c's fuse_experts; peft's ParamWrapper reads A as (E, R, in) and
 * B as (out, R, E)): p = 0 gate, 1 up (in gate_up_proj, rank R = 2r: gate
 * on rows 0..I-1 and rank slots 0..r-1, up on the rest), 2 down (R = r).
 * Off-diagonal blocks of gate_up's B (gate rows on up's slots or back) are
 * not a per-projection adapter: refused. `f` is the fused tensor (A or B). */
static enum mt_status unfuse(struct mt_ctx *ctx, const char *path, const char *fname, const float *f, int isb, int p,
                             int64_t e, const struct mt_config *c, float *dst)
{
    const int64_t E = c->n_experts, r = c->lora_rank, D = c->d_model, I = c->expert_hidden;
    const int64_t R = p < 2 ? 2 * r : r, j0 = p == 1 ? r : 0, o0 = p == 1 ? I : 0;
    const int64_t in = p < 2 ? D : I, out = p < 2 ? I : D;
    if (!isb) {
        for (int64_t j = 0; j < r; j++) memcpy(&dst[j * in], &f[(e * R + j0 + j) * in], (size_t)in * sizeof(float));
        return MT_OK;
    }
    for (int64_t o = 0; o < out; o++)
        for (int64_t j = 0; j < r; j++) dst[o * r + j] = f[(o0 + o) * (R * E) + (j0 + j) * E + e];
    if (p == 0)
        for (int64_t o = 0; o < 2 * I; o++)
            for (int64_t j = 0; j < 2 * r; j++)
                if ((o < I) != (j < r) && f[o * (R * E) + j * E + e] != 0.0f)
                    return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: %s (expert %lld) mixes gate and up (B is not "
                                        "block-diagonal): a rank-2r adapter of the fused gate_up_proj, which "
                                        "meshtrain's per-projection adapters cannot hold", path, fname, (long long)e);
    return MT_OK;
}

/* The per-expert adapter `name` (meshtrain's) from the fused tensors of sf
 * into dst; *used marks the fused tensor consumed. 1: not a fused layout
 * name / not in sf (nothing done). A one-tensor cache keeps a layer's fused
 * tensor across its E experts. */
struct fused_cache {
    char   name[200];
    float *data;
};

/* An adapter tensor's entry as the registry declares it: (r0, r1), whole on this rank. */
static void adapter_param(struct mt_param *p, const char *name, int64_t r0, int64_t r1)
{
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = 2;
    p->shape[0] = p->len[0] = r0;
    p->shape[1] = p->len[1] = r1;
    p->numel = (size_t)(r0 * r1);
    p->layer = -1;
    p->expert = -1;
}

static int from_fused(struct mt_ctx *ctx, const char *path, const struct mt_safetensors *sf, const char *name,
                      const struct mt_config *c, struct fused_cache *fc, char *used, float *dst, enum mt_status *rc)
{
    int l, e, n = 0;
    char pj[32], ab;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%31[a-z_].lora_%c.weight%n", &l, &e, pj, &ab, &n) != 4 || name[n])
        return 1;
    const int p = !strcmp(pj, "gate_proj") ? 0 : !strcmp(pj, "up_proj") ? 1 : 2;
    char fname[200];
    snprintf(fname, sizeof fname, PEFT_PREFIX "model.layers.%d.mlp.experts%s.lora_%c.weight", l,
             p < 2 ? ".base_layer" : "", ab);
    const struct mt_st_tensor *t = mt_safetensors_find(sf, fname);
    if (!t) return 1;
    const int64_t E = c->n_experts, r = c->lora_rank, D = c->d_model, I = c->expert_hidden, R = p < 2 ? 2 * r : r;
    const int64_t want0 = ab == 'A' ? E * R : (p < 2 ? 2 * I : D), want1 = ab == 'A' ? (p < 2 ? D : I) : R * E;
    if (t->ndim != 2 || t->shape[0] != want0 || t->shape[1] != want1) {
        *rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: tensor %s has shape [%lld,%lld], the base (--init-from) "
                           "needs [%lld,%lld]: the adapter was made for another base shape", path, fname,
                           (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)want0,
                           (long long)want1);
        return 0;
    }
    if (strcmp(fc->name, fname)) {
        mt_free(ctx, fc->data);
        fc->name[0] = 0;
        fc->data = mt_alloc(ctx, mt_st_numel(t) * sizeof(float), MT_BUCKET_OTHER);
        if (!fc->data) { *rc = MT_ERR_OOM; return 0; }
        if ((*rc = mt_safetensors_read_f32(ctx, sf, t, fc->data)) != MT_OK) return 0;
        snprintf(fc->name, sizeof fc->name, "%s", fname);
    }
    used[t - sf->t] = 1;
    *rc = unfuse(ctx, path, fname, fc->data, ab == 'B', p, e, c, dst);
    return 0;
}

/* Long (~90 lines): every registry adapter found (by name, or in the fused
 * experts), shaped and finite, then the checkpoint, with one cleanup path. */
enum mt_status mt_peft_import(struct mt_ctx *ctx, const char *adapter_dir, const struct mt_config *cfg,
                              const char *out_dir)
{
    char path[PATH_MAX + 32];
    struct mt_config c = *cfg;
    MT_CHECK(mt_config_resolve(ctx, &c, c.total_steps > 0 ? c.total_steps : 1));
    int nr = mt_model_registry(&c, NULL, 0);
    struct mt_param *reg = mt_alloc(ctx, (size_t)(nr > 0 ? nr : 1) * sizeof *reg, MT_BUCKET_OTHER);
    if (!reg) return MT_ERR_OOM;
    mt_model_registry(&c, reg, nr);
    struct mt_safetensors *sf = NULL;
    struct mt_param *ps = NULL;
    struct fused_cache fc = {"", NULL};
    char *used = NULL;
    int n = 0;
    enum mt_status rc;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    MT_CHECK_GOTO(mt_safetensors_open(ctx, path, &sf), rc, done);
    ps = mt_alloc(ctx, (size_t)(nr > 0 ? nr : 1) * sizeof *ps, MT_BUCKET_OTHER);
    used = mt_alloc(ctx, (size_t)sf->n + 1, MT_BUCKET_OTHER);
    if (!ps || !used) { rc = MT_ERR_OOM; goto done; }
    memset(used, 0, (size_t)sf->n + 1);
    memset(ps, 0, (size_t)(nr > 0 ? nr : 1) * sizeof *ps);
    for (int i = 0; i < nr; i++) {
        if (!strstr(reg[i].name, ".lora_")) continue;
        char nm[sizeof reg[i].name + 32];
        snprintf(nm, sizeof nm, PEFT_PREFIX "%s", reg[i].name);
        const struct mt_st_tensor *t = mt_safetensors_find(sf, nm);
        const int64_t r0 = reg[i].shape[0], r1 = reg[i].ndim > 1 ? reg[i].shape[1] : 1;
        if (!t) {
            struct mt_param *p = &ps[n];
            p->data = mt_alloc(ctx, (size_t)(r0 * r1) * sizeof(float), MT_BUCKET_PARAMS);
            if (!p->data) { rc = MT_ERR_OOM; goto done; }
            rc = MT_OK;
            if (from_fused(ctx, path, sf, reg[i].name, &c, &fc, used, p->data, &rc)) {
                rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s has no tensor %s: meshtrain's targets adapt every layer "
                                  "(and every expert) of the base", path, nm);
                n++;   /* freed below */
                goto done;
            }
            n++;
            if (rc != MT_OK) goto done;
            adapter_param(p, reg[i].name, r0, r1);
            continue;
        }
        used[t - sf->t] = 1;
        if (t->ndim != 2 || t->shape[0] != r0 || t->shape[1] != r1) {
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: tensor %s has shape [%lld,%lld], the base (--init-from) "
                              "needs [%lld,%lld]: the adapter was made for another base shape", path, nm,
                              (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)r0,
                              (long long)r1);
            goto done;
        }
        struct mt_param *p = &ps[n++];
        adapter_param(p, reg[i].name, r0, r1);
        p->data = mt_alloc(ctx, p->numel * sizeof(float), MT_BUCKET_PARAMS);
        if (!p->data) { rc = MT_ERR_OOM; goto done; }
        MT_CHECK_GOTO(mt_safetensors_read_f32(ctx, sf, t, p->data), rc, done);
        for (size_t k = 0; k < p->numel; k++)
            if (!isfinite(p->data[k])) {
                rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: tensor %s holds a non-finite value (%g at element "
                                  "%zu)", path, nm, (double)p->data[k], k);
                goto done;
            }
    }
    {
        /* a tensor of a module the base does not have (a layer or expert past its count) */
        for (int i = 0; i < sf->n; i++) {
            if (!used[i]) {
                rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: tensor %s has no module in the base (--init-from): "
                                  "the adapter was made for another base shape", path, sf->t[i].name);
                goto done;
            }
        }
    }
    struct mt_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.seed = c.seed;
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    rc = mt_ckpt_save(ctx, NULL, out_dir, &c, &meta, ps, n, NULL);
done:
    mt_free(ctx, fc.data);
    mt_free(ctx, used);
    if (ps)
        for (int i = 0; i < n; i++) mt_free(ctx, ps[i].data);
    mt_free(ctx, ps);
    mt_free(ctx, reg);
    mt_safetensors_close(ctx, sf);
    return rc;
}
