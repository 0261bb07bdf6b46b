/*
 * test_kvcache.c — logits from the KV cache (prefill of 3 tokens, then one
 * token at a time) equal the full forward's logits at every position, for a
 * dense model (with softcap), an MoE model (shared expert) and hybrids with
 * an M (Mamba-3) block, whose recurrent state replaces the cache. Parameters are
 * drawn with a large spread so logits are O(1) and a wrong RoPE offset or
 * cache row shows far above the 1e-5 tolerance.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

static const char *g_lora = NULL;   /* LoRA targets (rank 2, every parameter random: B != 0), or NULL */

/* kv_T: seq_len of the model used for decoding. kv_T < T makes prefills longer
 * than the model's activation buffers (chunked) and a cache longer than the
 * model's own RoPE tables. n0: prefill length. */
static void run(const char *label, const char *pattern, float softcap, int kv_T, int n0)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.vocab_size = 41;
    cfg.n_layer = 2;
    cfg.d_model = 32;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.mlp_hidden = 48;
    cfg.seq_len = 9;
    cfg.n_experts = 4;
    cfg.top_k = 2;
    cfg.expert_hidden = 16;
    cfg.shared_expert_hidden = 8;
    cfg.logit_softcap = softcap;
    cfg.batch_size = 1;
    cfg.microbatches = 1;
    snprintf(cfg.pattern, sizeof cfg.pattern, "%s", pattern);
    /* M blocks: E 64 = 4 heads of 16, 2 groups, state 8, chunk 4 (does not divide T = 9) */
    cfg.mamba_expand = 2;
    cfg.mamba_headdim = 16;
    cfg.mamba_ngroups = 2;
    cfg.mamba_d_state = 8;
    cfg.mamba_chunk = 4;
    if (g_lora) {
        cfg.lora_rank = 2;
        cfg.lora_alpha = 4.0f;
        snprintf(cfg.lora_targets, sizeof cfg.lora_targets, "%s", g_lora);
    }
    if (mt_config_resolve(&ctx, &cfg, 1) != MT_OK) {
        fprintf(stderr, "config: %s\n", mt_ctx_last_error(&ctx));
        exit(1);
    }
    const int T = cfg.seq_len, V = cfg.vocab_size;
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 1, &m) == MT_OK);
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    for (int i = 0; i < np; i++) {
        float *h = malloc(ps[i].numel * sizeof(float));
        uint64_t st = mt_rng_stream(ps[i].name);
        for (size_t e = 0; e < ps[i].numel; e++)
            h[e] = ps[i].ndim == 1 ? (float)(1 + 0.2 * mt_rng_normal(3, st, e)) : (float)(0.3 * mt_rng_normal(3, st, e));
        ops->copy_from_host(ops->be, ps[i].data, h, ps[i].numel * sizeof(float));
        free(h);
    }
    int32_t tok[64];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(mt_rng_splitmix64(17 + (uint64_t)t) % (uint64_t)V);

    MT_ASSERT(mt_model_forward(&ctx, m, tok, NULL, NULL, NULL) == MT_OK);
    float *ref = malloc((size_t)T * V * sizeof(float));
    ops->copy_to_host(ops->be, ref, mt_model_logits(m), (size_t)T * V * sizeof(float));
    double scale = 0;
    for (int i = 0; i < T * V; i++) {
        if (softcap > 0) ref[i] = (float)(softcap * tanh((double)ref[i] / softcap));
        scale = fmax(scale, fabs(ref[i]));
    }

    struct mt_model *mk = m;
    if (kv_T != T) {
        struct mt_config kcfg = cfg;
        kcfg.seq_len = kv_T;
        MT_ASSERT(mt_model_create(&ctx, ops, &kcfg, 1, &mk) == MT_OK);
        struct mt_param *kp = mt_model_params(mk, &np);
        for (int i = 0; i < np; i++) ops->copy(ops->be, kp[i].data, ps[i].data, ps[i].numel * sizeof(float));
    }
    struct mt_kv_cache *c = NULL;
    MT_ASSERT(mt_model_kv_create(&ctx, mk, T, &c) == MT_OK);
    float *lg = malloc((size_t)V * sizeof(float));
    double worst = 0;
    MT_ASSERT(mt_model_kv_step(&ctx, mk, c, tok, n0, lg) == MT_OK);
    for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - ref[(n0 - 1) * V + v]));
    for (int t = n0; t < T; t++) {
        MT_ASSERT(mt_model_kv_step(&ctx, mk, c, tok + t, 1, lg) == MT_OK);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - ref[t * V + v]));
    }
    int okl = mt_model_kv_len(c) == T;
    /* overflow is an error, not a write past the cache */
    enum mt_status st = mt_model_kv_step(&ctx, mk, c, tok, 1, lg);
    printf("%s: max |kv - full| = %.3e (logit scale %.3g), len %d, overflow -> %s\n", label, worst, scale,
           mt_model_kv_len(c), mt_status_str(st));
    EXPECT(worst <= 1e-5 * fmax(1.0, scale) && okl && st != MT_OK, "%s", label);
    EXPECT(scale >= 0.5, "%s: logits too small (%g) for the test to mean anything", label, scale);
    free(lg);
    free(ref);
    mt_model_kv_destroy(&ctx, mk, c);
    if (mk != m) mt_model_destroy(&ctx, mk);
    mt_model_destroy(&ctx, m);
    mt_ctx_free(&ctx);
}

int main(void)
{
    run("dense softcap=15", "AA", 15.0f, 9, 3);
    run("dense", "AA", 0.0f, 9, 3);
    run("moe", "AE", 0.0f, 9, 3);
    run("dense chunked prefill (7 tokens, N=3)", "AA", 0.0f, 3, 7);
    run("moe chunked prefill (7 tokens, N=3)", "EA", 0.0f, 3, 7);
    run("hybrid (recurrent state)", "MA", 0.0f, 9, 3);
    run("hybrid chunked prefill (7 tokens, N=3)", "AM", 15.0f, 3, 7);
    /* LoRA on the M projections (and q): decoding runs the adapters like the forward */
    g_lora = "q,in_proj,out_proj";
    run("hybrid lora (recurrent state)", "MA", 0.0f, 9, 3);
    run("hybrid lora chunked prefill (7 tokens, N=3)", "AM", 0.0f, 3, 7);
    g_lora = NULL;
    if (n_fail) {
        fprintf(stderr, "test_kvcache: FAILED\n");
        return 1;
    }
    printf("test_kvcache: ok\n");
    return 0;
}
