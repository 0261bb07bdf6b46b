/*
 * test_model_grad.c — whole-model gradient check against central finite
 * differences, the accumulation rule, and microbatch-split equivalence.
 *
 * Configs: a tiny dense model (softcap 0 and 15) and a tiny MoE model
 * (pattern "AE", E=4, top_k=2, shared expert, aux and z losses, targets
 * containing -1), and a tiny hybrid (pattern "AMEM": Mamba-3 blocks, 2 groups,
 * scan chunk 4 not dividing T = 6). Parameters are re-drawn with a larger spread than the real
 * init (matrices ~N(0, 0.25^2), gains 1 + N(0, 0.2^2)) so every gradient is
 * far from zero and a wrong term shows.
 *
 * Tolerance. The loss is evaluated in fp32 (sums in double): each evaluation
 * carries an absolute rounding noise of ~1e-6, so a central difference with
 * step eps has noise ~1e-6/eps plus a truncation error O(eps^2 * f'''). A
 * purely relative tolerance would fail on tiny elements for noise reasons
 * only, so the test accepts
 *     |g_ana - g_fd| <= rtol * max(|g_ana|, |g_fd|) + atol * gscale + 1e-5,
 * with gscale the largest |analytic gradient| of that tensor: errors are
 * judged relative to the tensor's gradient magnitude. A wrong term (sign,
 * missing factor, missing branch) produces errors of the order of gscale.
 *
 * MoE: the top-k choice is piecewise constant in the parameters; when a
 * perturbation changes the routing of any token (checked by comparing the
 * chosen experts of every MoE layer to the unperturbed ones) the element is
 * skipped and counted; the test fails if more than a quarter are skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "model/model_impl.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

static int g_lora = 0;   /* 1: the configs carry LoRA adapters on every target (rank 2, alpha 4) */
static int g_null = 0;   /* > 0: the MoE configs get this many null experts (SPEC 1e), top_k 3 */
static int g_mtp = 0;    /* > 0: mtp_depth (SPEC 1e), modules of kind g_mtp_block, lambda 0.5 */
static const char *g_mtp_block = "A";
static unsigned g_mod = 0;   /* bit l: layer l routed by Mixture-of-Depths (SPEC 1e), capacity 0.5, aux 0.1 */

static void base_config(struct mt_config *cfg, struct mt_ctx *ctx, int moe, float softcap, int T)
{
    mt_config_defaults(cfg);
    cfg->vocab_size = 37;
    cfg->n_layer = 2;
    cfg->d_model = 16;
    cfg->n_head = 4;
    cfg->n_kv_head = 2;
    cfg->head_dim = 0;
    cfg->mlp_hidden = 32;
    cfg->seq_len = T;
    cfg->logit_softcap = softcap;
    cfg->batch_size = 2;
    cfg->microbatches = 1;
    if (moe == 2) {
        /* hybrid: Mamba-3 blocks next to attention and MoE; chunk 4 does not divide T = 6 */
        cfg->n_layer = 4;
        snprintf(cfg->pattern, sizeof cfg->pattern, "AMEM");
        cfg->mamba_expand = 2;
        cfg->mamba_headdim = 8;
        cfg->mamba_d_state = 4;
        cfg->mamba_ngroups = 2;
        cfg->mamba_chunk = 4;
    }
    if (moe) {
        if (moe != 2) snprintf(cfg->pattern, sizeof cfg->pattern, "AE");
        cfg->n_experts = 4;
        cfg->top_k = 2;
        cfg->expert_hidden = 8;
        cfg->shared_expert_hidden = 8;
        cfg->aux_loss_coef = 0.1f;
        cfg->z_loss_coef = 0.01f;
        if (g_null) {   /* null experts: about half of the slots choose one */
            cfg->n_null_experts = g_null;
            cfg->top_k = 3;
        }
    } else {
        cfg->pattern[0] = '\0';
    }
    if (g_mod) {   /* lowercase letters: the routed twins of A and E */
        if (!cfg->pattern[0]) snprintf(cfg->pattern, sizeof cfg->pattern, "%.*s", cfg->n_layer, "AAAA");
        for (int l = 0; l < cfg->n_layer; l++)
            if (g_mod >> l & 1u) cfg->pattern[l] = (char)tolower((unsigned char)cfg->pattern[l]);
        cfg->mod_capacity = 0.5f;
        cfg->mod_aux_coef = 0.1f;
    }
    if (g_mtp) {
        cfg->mtp_depth = g_mtp;
        cfg->mtp_loss_coef = 0.5f;
        snprintf(cfg->mtp_block, sizeof cfg->mtp_block, "%s", g_mtp_block);
    }
    if (g_lora) {
        cfg->lora_rank = 2;
        cfg->lora_alpha = 4.0f;
        /* hybrid: the M blocks' in / out projections (one A on the stacked Win)
         * next to a column- and a row-parallel attention and MLP target (the
         * experts' adapters are the moe check's; here they would only add
         * routing flips to this deeper model). Measured: with in_proj,out_proj
         * alone the point has a high curvature (C's norm, theta's angles):
         * 2 central differences at eps 2e-3 miss by O(eps^2) (off 5x less at
         * eps 1e-3, converging on the analytic value), not a wrong gradient */
        snprintf(cfg->lora_targets, sizeof cfg->lora_targets, "%s",
                 moe == 2 ? "q,o,down,in_proj,out_proj" : "q,k,v,o,gate,up,down,expert");
    }
    if (mt_config_resolve(ctx, cfg, 1) != MT_OK) {
        fprintf(stderr, "config resolve: %s\n", mt_ctx_last_error(ctx));
        exit(1);
    }
}

/* Larger-spread parameters (see the header comment), deterministic. */
static void spread_params(struct mt_model *m, uint64_t seed)
{
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    const struct mt_ops_i *ops = m->ops;
    for (int i = 0; i < np; i++) {
        struct mt_param *p = &ps[i];
        uint64_t st = mt_rng_stream(p->name);
        float *h = malloc(p->numel * sizeof(float));
        for (size_t e = 0; e < p->numel; e++) {
            double z = mt_rng_normal(seed, st, e);
            h[e] = p->ndim == 1 ? (float)(1.0 + 0.2 * z) : (float)(0.25 * z);
            /* Mamba-3 dt_bias: dt = softplus(-2 + ...) ~ 0.13, the init's range, not ~1.3 */
            if (strstr(p->name, "dt_bias")) h[e] = (float)(-2.0 + 0.3 * z);
        }
        ops->copy_from_host(ops->be, p->data, h, p->numel * sizeof(float));
        free(h);
    }
}

static void make_batch(int N, int V, uint64_t seed, int32_t *idx, int32_t *tgt, int with_ignore)
{
    for (int i = 0; i < N; i++) {
        idx[i] = (int32_t)(mt_rng_splitmix64(seed + 2 * (uint64_t)i) % (uint64_t)V);
        tgt[i] = (int32_t)(mt_rng_splitmix64(seed + 2 * (uint64_t)i + 1) % (uint64_t)V);
        if (with_ignore && (i % 5 == 2)) tgt[i] = -1;
    }
}

static struct mt_loss_norm batch_norm(const int32_t *tgt, int N, int B, int T)
{
    struct mt_loss_norm n = { 0, (double)B, (double)B * T };
    for (int i = 0; i < N; i++) n.n_targets += tgt[i] != -1;
    return n;
}

static double total_loss(struct mt_ctx *ctx, struct mt_model *m, const int32_t *idx, const int32_t *tgt,
                         const struct mt_loss_norm *norm)
{
    struct mt_loss_parts parts;
    if (mt_model_forward(ctx, m, idx, tgt, norm, &parts) != MT_OK) {
        fprintf(stderr, "forward: %s\n", mt_ctx_last_error(ctx));
        exit(1);
    }
    return mt_loss_parts_total(parts.v, parts.n);
}

/* Concatenated chosen experts of every MoE layer and the selections of
 * every routed (MoD) layer (host copy): a finite difference that changes
 * either is a step of a piecewise-constant choice, not a gradient. */
static void routing_snapshot(struct mt_model *m, int32_t *out)
{
    size_t o = 0;
    for (int l = 0; l < m->L; l++) {
        const int32_t *slot = mod_state_slot(&m->layers[l]);
        const size_t rows = slot ? (size_t)m->B * mod_rows(&m->cfg, m->T) : (size_t)m->N;
        if (slot) {
            m->ops->copy_to_host(m->ops->be, out + o, slot, (size_t)m->N * sizeof(int32_t));
            o += (size_t)m->N;
        }
        if (!m->layers[l].moe) continue;
        m->ops->copy_to_host(m->ops->be, out + o, moe_state_topk(m->layers[l].state[MT_PIECE_FFN]), rows * m->cfg.top_k * sizeof(int32_t));
        o += rows * m->cfg.top_k;
    }
}

static void gradcheck(const char *label, int moe, float softcap)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    const int B = 2, T = 6;
    base_config(&cfg, &ctx, moe, softcap, T);
    struct mt_model *m = NULL;
    if (mt_model_create(&ctx, ops, &cfg, B, &m) != MT_OK) {
        fprintf(stderr, "create: %s\n", mt_ctx_last_error(&ctx));
        exit(1);
    }
    spread_params(m, 7);
    const int N = B * T;
    int32_t idx[64], tgt[64];
    make_batch(N, cfg.vocab_size, 99, idx, tgt, 1);
    struct mt_loss_norm norm = batch_norm(tgt, N, B, T);

    mt_model_zero_grad(m);
    total_loss(&ctx, m, idx, tgt, &norm);
    EXPECT(mt_model_backward(&ctx, m) == MT_OK, "backward: %s", mt_ctx_last_error(&ctx));

    size_t nroute = (size_t)m->L * N * (m->cfg.top_k + 1) + 1;
    int32_t *r0 = calloc(nroute, sizeof(int32_t)), *r1 = calloc(nroute, sizeof(int32_t));
    total_loss(&ctx, m, idx, tgt, &norm);
    routing_snapshot(m, r0);
    if (g_null && moe) {   /* the point must route slots both to real and to null experts */
        int nnull = 0, nreal = 0;
        for (size_t i = 0; i + 1 < nroute && i < (size_t)N * m->cfg.top_k; i++) {
            if (r0[i] >= cfg.n_experts) nnull++;
            else nreal++;
        }
        printf("%s: %d slots to null experts, %d to real ones\n", label, nnull, nreal);
        EXPECT(nnull > 0 && nreal > 0, "%s: routing has %d null and %d real slots", label, nnull, nreal);
    }

    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    const float eps = 2e-3f;
    const double rtol = 2e-2, atol = 5e-3;
    int checked = 0, skipped = 0, bad = 0, adapters = 0;
    double worst = 0;
    for (int i = 0; i < np; i++) {
        struct mt_param *p = &ps[i];
        float *ga = malloc(p->numel * sizeof(float));
        ops->copy_to_host(ops->be, ga, p->grad, p->numel * sizeof(float));
        double gscale = 0;
        for (size_t e = 0; e < p->numel; e++) gscale = fmax(gscale, fabs(ga[e]));
        if (g_lora && p->frozen) {
            /* LoRA: no frozen matrix (targeted or not: embedding, router,
             * lm_head too) gets a weight gradient, its backward computes dx
             * only; the frozen gains' (1-D, cheap) and the mixer's (H, N)
             * B/C biases (role ssm) are computed and unused */
            EXPECT(p->ndim == 1 || p->role == MT_ROLE_SSM || gscale == 0, "%s: frozen %s has a weight gradient",
                   label, p->name);
            free(ga);
            continue;
        }
        EXPECT(!g_lora || strstr(p->name, ".lora_"), "%s: %s trains in a LoRA run", label, p->name);
        adapters++;
        EXPECT(gscale > 0 || strstr(p->name, "experts"), "%s: %s has an all-zero gradient", label, p->name);
        int ns = p->numel < 20 ? (int)p->numel : 20;
        for (int s = 0; s < ns; s++) {
            size_t e = p->numel <= 20 ? (size_t)s : (size_t)(mt_rng_splitmix64(1000 * (uint64_t)i + s) % p->numel);
            float orig, v;
            ops->copy_to_host(ops->be, &orig, p->data + e, sizeof(float));
            v = orig + eps;
            ops->copy_from_host(ops->be, p->data + e, &v, sizeof(float));
            double lp = total_loss(&ctx, m, idx, tgt, &norm);
            int flip = 0;
            if (moe || g_mod) { routing_snapshot(m, r1); flip |= memcmp(r0, r1, nroute * sizeof(int32_t)) != 0; }
            v = orig - eps;
            ops->copy_from_host(ops->be, p->data + e, &v, sizeof(float));
            double lm = total_loss(&ctx, m, idx, tgt, &norm);
            if (moe || g_mod) { routing_snapshot(m, r1); flip |= memcmp(r0, r1, nroute * sizeof(int32_t)) != 0; }
            ops->copy_from_host(ops->be, p->data + e, &orig, sizeof(float));
            if (flip) { skipped++; continue; }
            /* the actual step, as rounded in fp32 */
            double h = ((double)(orig + eps) - (double)(orig - eps));
            double fd = (lp - lm) / h;
            double a = ga[e];
            double err = fabs(a - fd);
            double tol = rtol * fmax(fabs(a), fabs(fd)) + atol * gscale + 1e-5;
            if (gscale > 0) worst = fmax(worst, err / gscale);
            checked++;
            if (err > tol) {
                bad++;
                if (bad <= 10)
                    fprintf(stderr, "  %s %s[%zu]: analytic %.6g fd %.6g (gscale %.3g)\n", label, p->name, e, a,
                            fd, gscale);
            }
        }
        free(ga);
    }
    printf("%s: %d params (%d trained), %d elements checked, %d skipped (routing flip), %d bad, worst err/gscale %.2e\n",
           label, np, adapters, checked, skipped, bad, worst);
    /* LoRA on every target: 2 layers x 7 dense targets (dense), or attention x 2
     * + mlp of layer 0 + 4 experts x 3 of layer 1 (moe), A and B each; hybrid
     * AMEM (q, o, down, in_proj, out_proj): A 2 x 3, each M 1 + 7 (in_proj: one
     * A, a B per block) + 2 (out_proj) + 2 (down), E 2 x 2 (q, o) */
    if (g_lora)
        EXPECT(adapters == (moe == 2 ? 6 + 2 * 12 + 4 : moe ? 2 * (4 * 2 + 3 + 12) : 2 * 14) + 14 * g_mtp,
               "%s: %d adapters (+ 14 per MTP module of kind A)", label, adapters);
    EXPECT(bad == 0, "%s: %d gradient elements out of tolerance", label, bad);
    EXPECT(skipped * 4 <= checked + skipped, "%s: too many routing flips (%d)", label, skipped);
    free(r0);
    free(r1);
    mt_model_destroy(&ctx, m);
    mt_ctx_free(&ctx);
}

/* grads after two forward+backward passes == 2x grads after one. */
static void accumulation(int moe)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    const int B = 2, T = 6, N = B * T;
    base_config(&cfg, &ctx, moe, 15.0f, T);
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, B, &m) == MT_OK);
    spread_params(m, 3);
    int32_t idx[64], tgt[64];
    make_batch(N, cfg.vocab_size, 5, idx, tgt, 1);
    struct mt_loss_norm norm = batch_norm(tgt, N, B, T);
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    mt_model_zero_grad(m);
    total_loss(&ctx, m, idx, tgt, &norm);
    MT_ASSERT(mt_model_backward(&ctx, m) == MT_OK);
    /* a second backward without a forward is refused (logits hold dlogits now) */
    EXPECT(mt_model_backward(&ctx, m) != MT_OK, "second backward without forward accepted");
    float **g1 = calloc((size_t)np, sizeof(float *));
    for (int i = 0; i < np; i++) {
        g1[i] = malloc(ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, g1[i], ps[i].grad, ps[i].numel * sizeof(float));
    }
    total_loss(&ctx, m, idx, tgt, &norm);
    MT_ASSERT(mt_model_backward(&ctx, m) == MT_OK);
    double worst = 0;
    for (int i = 0; i < np; i++) {
        float *g2 = malloc(ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, g2, ps[i].grad, ps[i].numel * sizeof(float));
        for (size_t e = 0; e < ps[i].numel; e++)
            worst = fmax(worst, fabs((double)g2[e] - 2.0 * g1[i][e]) / (1e-6 + fabs(2.0 * g1[i][e])));
        free(g2);
        free(g1[i]);
    }
    free(g1);
    printf("accumulation (%s): max rel |g2 - 2 g1| = %.2e\n", moe == 2 ? "hybrid" : moe ? "moe" : "dense", worst);
    EXPECT(worst < 1e-6, "backward twice does not double the grads (%.3g)", worst);
    /* zero_grad clears */
    mt_model_zero_grad(m);
    float g;
    ops->copy_to_host(ops->be, &g, ps[1].grad, sizeof g);
    EXPECT(g == 0.0f, "zero_grad left %g", (double)g);
    mt_model_destroy(&ctx, m);
    mt_ctx_free(&ctx);
}

/* One microbatch of B=2 == two microbatches of B=1 with the same global norm. */
static void microbatch_split(int moe)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    const int T = 6, N = 2 * T;
    base_config(&cfg, &ctx, moe, 0.0f, T);
    struct mt_model *m2 = NULL, *m1 = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 2, &m2) == MT_OK);
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 1, &m1) == MT_OK);
    spread_params(m2, 11);
    spread_params(m1, 11);
    int32_t idx[64], tgt[64];
    make_batch(N, cfg.vocab_size, 77, idx, tgt, 1);
    struct mt_loss_norm norm = batch_norm(tgt, N, 2, T);
    struct mt_loss_parts p2, pa, pb;
    mt_model_zero_grad(m2);
    MT_ASSERT(mt_model_forward(&ctx, m2, idx, tgt, &norm, &p2) == MT_OK);
    MT_ASSERT(mt_model_backward(&ctx, m2) == MT_OK);
    mt_model_zero_grad(m1);
    MT_ASSERT(mt_model_forward(&ctx, m1, idx, tgt, &norm, &pa) == MT_OK);
    MT_ASSERT(mt_model_backward(&ctx, m1) == MT_OK);
    MT_ASSERT(mt_model_forward(&ctx, m1, idx + T, tgt + T, &norm, &pb) == MT_OK);
    MT_ASSERT(mt_model_backward(&ctx, m1) == MT_OK);
    double l2 = mt_loss_parts_total(p2.v, p2.n), l1 = mt_loss_parts_total(pa.v, pa.n) + mt_loss_parts_total(pb.v, pb.n);
    EXPECT(fabs(l2 - l1) < 1e-6 * fmax(1, fabs(l2)), "split loss %.9g vs %.9g", l1, l2);
    if (moe)
        EXPECT(p2.v[MT_LOSS_AUX] > 0 && p2.v[MT_LOSS_Z] > 0, "moe losses missing (aux %g z %g)", p2.v[MT_LOSS_AUX],
               p2.v[MT_LOSS_Z]);
    int np;
    struct mt_param *a = mt_model_params(m2, &np);
    struct mt_param *b = mt_model_params(m1, &np);
    double worst = 0;
    for (int i = 0; i < np; i++) {
        float *ga = malloc(a[i].numel * sizeof(float)), *gb = malloc(a[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, ga, a[i].grad, a[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, gb, b[i].grad, b[i].numel * sizeof(float));
        double sc = 0;
        for (size_t e = 0; e < a[i].numel; e++) sc = fmax(sc, fabs(ga[e]));
        for (size_t e = 0; e < a[i].numel; e++) worst = fmax(worst, fabs((double)ga[e] - gb[e]) / (sc + 1e-12));
        free(ga);
        free(gb);
    }
    printf("microbatch split (%s): loss %.9g vs %.9g, max grad diff / tensor scale %.2e\n", moe == 2 ? "hybrid" : moe ? "moe" : "dense",
           l2, l1, worst);
    EXPECT(worst < 2e-5, "microbatch split grads differ (%.3g)", worst);
    mt_model_destroy(&ctx, m2);
    mt_model_destroy(&ctx, m1);
    mt_ctx_free(&ctx);
}

/* Null experts (SPEC 1e) against an independent reading of them: a model
 * with E = 4 real and Z = 2 null experts equals a model of 6 real experts
 * whose experts 4 and 5 have a zero down projection (they output 0, so
 * their gate gradient is 0 and nothing reaches their other weights) and the
 * same router, in every loss part and in the gradient of every parameter
 * both have. The second model runs the plain dispatch (every slot a row), so
 * a null slot that moved data or added a contribution shows here. */
static struct mt_param *param_named(struct mt_model *m, const char *name)
{
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    for (int i = 0; i < np; i++)
        if (!strcmp(ps[i].name, name)) return &ps[i];
    return NULL;
}

static void null_vs_zero_experts(int moe)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    const int B = 2, T = 6, N = B * T;
    struct mt_config ca, cb;
    g_null = 2;
    base_config(&ca, &ctx, moe, 0.0f, T);
    g_null = 0;
    base_config(&cb, &ctx, moe, 0.0f, T);
    cb.n_experts = ca.n_experts + ca.n_null_experts;
    cb.top_k = ca.top_k;
    struct mt_model *ma = NULL, *mb = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &ca, B, &ma) == MT_OK);
    MT_ASSERT(mt_model_create(&ctx, ops, &cb, B, &mb) == MT_OK);
    spread_params(ma, 13);
    spread_params(mb, 13);   /* by name and element: the shared names get the same values */
    int np;
    struct mt_param *pb = mt_model_params(mb, &np);
    for (int i = 0; i < np; i++) {
        int e = -1;
        if (sscanf(strstr(pb[i].name, "experts.") ? strstr(pb[i].name, "experts.") : "", "experts.%d.", &e) == 1 &&
            e >= ca.n_experts && strstr(pb[i].name, "down_proj"))
            ops->fill(ops->be, pb[i].data, 0.0f, pb[i].numel);
    }
    int32_t idx[64], tgt[64];
    make_batch(N, ca.vocab_size, 31, idx, tgt, 1);
    struct mt_loss_norm norm = batch_norm(tgt, N, B, T);
    struct mt_loss_parts la, lb;
    mt_model_zero_grad(ma);
    mt_model_zero_grad(mb);
    MT_ASSERT(mt_model_forward(&ctx, ma, idx, tgt, &norm, &la) == MT_OK);
    MT_ASSERT(mt_model_backward(&ctx, ma) == MT_OK);
    MT_ASSERT(mt_model_forward(&ctx, mb, idx, tgt, &norm, &lb) == MT_OK);
    MT_ASSERT(mt_model_backward(&ctx, mb) == MT_OK);
    double dl = 0;
    for (int k = 0; k < la.n; k++) dl = fmax(dl, fabs(la.v[k] - lb.v[k]) / fmax(1e-12, fabs(lb.v[k])));
    struct mt_param *pa = mt_model_params(ma, &np);
    double worst = 0;
    int matched = 0;
    for (int i = 0; i < np; i++) {
        struct mt_param *q = param_named(mb, pa[i].name);
        EXPECT(q && q->numel == pa[i].numel, "null vs zero experts: %s missing in the second model", pa[i].name);
        if (!q || q->numel != pa[i].numel) continue;
        float *ga = malloc(pa[i].numel * sizeof(float)), *gb = malloc(pa[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, ga, pa[i].grad, pa[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, gb, q->grad, q->numel * sizeof(float));
        double sc = 0;
        for (size_t e = 0; e < pa[i].numel; e++) sc = fmax(sc, fabs(gb[e]));
        for (size_t e = 0; e < pa[i].numel; e++) worst = fmax(worst, fabs((double)ga[e] - gb[e]) / (sc + 1e-12));
        matched++;
        free(ga);
        free(gb);
    }
    printf("null vs zero experts (%s): lm %.9g vs %.9g, aux %.9g vs %.9g, z %.9g vs %.9g; max rel loss diff %.2e, "
           "%d params, max grad diff / tensor scale %.2e\n", moe == 2 ? "hybrid" : "moe", la.v[MT_LOSS_LM],
           lb.v[MT_LOSS_LM], la.v[MT_LOSS_AUX], lb.v[MT_LOSS_AUX], la.v[MT_LOSS_Z], lb.v[MT_LOSS_Z], dl, matched, worst);
    EXPECT(la.n == lb.n && dl < 1e-6, "null vs zero experts: loss parts differ (%.3g)", dl);
    EXPECT(worst < 1e-6, "null vs zero experts: gradients differ (%.3g)", worst);
    mt_model_destroy(&ctx, ma);
    mt_model_destroy(&ctx, mb);
    mt_ctx_free(&ctx);
}

/* LoRA with its real init (B = 0): the loss equals the frozen base's bit
 * for bit (the adapter adds s * t * 0 = +0 to every output), and after one
 * backward the base matrices hold no gradient while B's is non-zero. */
static void lora_zero_start(int moe)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    const int B = 2, T = 6, N = B * T;
    double loss[2];
    for (int pass = 0; pass < 2; pass++) {
        g_lora = pass;
        struct mt_config cfg;
        base_config(&cfg, &ctx, moe, 0.0f, T);
        struct mt_model *m = NULL;
        if (mt_model_create(&ctx, ops, &cfg, B, &m) != MT_OK || mt_model_init_params(&ctx, m, 5) != MT_OK) {
            fprintf(stderr, "create: %s\n", mt_ctx_last_error(&ctx));
            exit(1);
        }
        int32_t idx[64], tgt[64];
        make_batch(N, cfg.vocab_size, 42, idx, tgt, 0);
        struct mt_loss_norm norm = batch_norm(tgt, N, B, T);
        mt_model_zero_grad(m);
        loss[pass] = total_loss(&ctx, m, idx, tgt, &norm);
        EXPECT(mt_model_backward(&ctx, m) == MT_OK, "backward: %s", mt_ctx_last_error(&ctx));
        if (pass) {
            int np, nb = 0;
            struct mt_param *ps = mt_model_params(m, &np);
            for (int i = 0; i < np; i++) {
                if (!strstr(ps[i].name, ".lora_B.")) continue;
                float *g = malloc(ps[i].numel * sizeof(float));
                ops->copy_to_host(ops->be, g, ps[i].grad, ps[i].numel * sizeof(float));
                double mx = 0;
                for (size_t e = 0; e < ps[i].numel; e++) mx = fmax(mx, fabs(g[e]));
                nb += mx > 0;
                free(g);
            }
            EXPECT(nb > 0, "lora zero start (moe=%d): every B gradient is zero", moe);
        }
        mt_model_destroy(&ctx, m);
    }
    g_lora = 0;
    printf("lora zero start (moe=%d): loss %.17g (base %.17g)\n", moe, loss[1], loss[0]);
    EXPECT(loss[0] == loss[1], "lora zero start (moe=%d): loss %.17g != base %.17g", moe, loss[1], loss[0]);
    mt_ctx_free(&ctx);
}

/* Every LoRA target of every block kind has a layout rule (blocks.c,
 * mt_blocks_lora_rule; a target without one is refused at config time). */
static void lora_rules(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const unsigned all = MT_LORA_Q | MT_LORA_K | MT_LORA_V | MT_LORA_O | MT_LORA_GATE | MT_LORA_UP | MT_LORA_DOWN |
                         MT_LORA_EXPERT | MT_LORA_IN_PROJ | MT_LORA_OUT_PROJ;
    for (int moe = 0; moe < 3; moe++) {
        struct mt_config cfg;
        base_config(&cfg, &ctx, moe, 0.0f, 6);
        const char *bad = mt_blocks_lora_rule(&cfg, all);
        EXPECT(bad == NULL, "lora rules (moe=%d): %s has no adapter layout rule", moe, bad ? bad : "");
    }
    mt_ctx_free(&ctx);
}

/* The loss-part list (mt_model.h): lm, aux, z always (a dense model's
 * router parts registered, 0, no gradient); the test hook test_loss_part=W
 * appends hidden_l2 = W sum |x_final|^2 / n_tokens, with a gradient only
 * when W > 0; a bad W refuses the model. */
static void loss_parts(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    const char *want[] = {"lm", "aux", "z", "hidden_l2"};
    for (int moe = 0; moe < 2; moe++)
        for (int hook = 0; hook < 3; hook++) {   /* none, W = 0.3, W = 0 */
            if (hook) setenv("MT_TEST_LOSS_PART", hook == 1 ? "0.3" : "0", 1);
            struct mt_config cfg;
            base_config(&cfg, &ctx, moe, 0.0f, 6);
            struct mt_model *m = NULL;
            EXPECT(mt_model_create(&ctx, ops, &cfg, 2, &m) == MT_OK, "create: %s", mt_ctx_last_error(&ctx));
            spread_params(m, 3);
            int n;
            const struct mt_loss_part *lp = mt_model_loss_parts(m, &n);
            EXPECT(n == (hook ? 4 : 3), "moe %d hook %d: %d loss parts", moe, hook, n);
            for (int k = 0; k < n && k < 4; k++) EXPECT(!strcmp(lp[k].name, want[k]), "part %d is %s", k, lp[k].name);
            EXPECT(lp[MT_LOSS_AUX].backward == moe && lp[MT_LOSS_Z].backward == moe, "router parts' backward");
            EXPECT(lp[MT_LOSS_AUX].weight == (double)cfg.aux_loss_coef && lp[MT_LOSS_Z].reduce == MT_LOSS_PER_TOKEN,
                   "router parts' weight / reduce");
            if (hook)
                EXPECT(lp[3].weight == (hook == 1 ? 0.3 : 0.0) && lp[3].backward == (hook == 1),
                       "hidden_l2 weight %g backward %d", lp[3].weight, lp[3].backward);
            /* a forward gives one value per part; the parts sum to the loss */
            int32_t idx[12], tgt[12];
            make_batch(12, cfg.vocab_size, 5, idx, tgt, 0);
            struct mt_loss_norm norm = batch_norm(tgt, 12, 2, 6);
            struct mt_loss_parts parts;
            EXPECT(mt_model_forward(&ctx, m, idx, tgt, &norm, &parts) == MT_OK, "forward");
            EXPECT(parts.n == n, "forward: %d values for %d parts", parts.n, n);
            if (hook) EXPECT(hook == 1 ? parts.v[3] > 0 : parts.v[3] == 0, "hidden_l2 = %g", parts.v[3]);
            mt_model_destroy(&ctx, m);
            unsetenv("MT_TEST_LOSS_PART");
        }
    setenv("MT_TEST_LOSS_PART", "-1", 1);
    struct mt_config cfg;
    base_config(&cfg, &ctx, 0, 0.0f, 6);
    struct mt_model *m = NULL;
    EXPECT(mt_model_create(&ctx, ops, &cfg, 2, &m) == MT_ERR_CONFIG && !m, "test_loss_part=-1 accepted");
    unsetenv("MT_TEST_LOSS_PART");
}

int main(void)
{
    loss_parts();
    lora_rules();
    gradcheck("dense softcap=0", 0, 0.0f);
    gradcheck("dense softcap=15", 0, 15.0f);
    gradcheck("moe", 1, 0.0f);
    gradcheck("hybrid AMEM", 2, 0.0f);
    g_lora = 1;
    gradcheck("dense lora", 0, 0.0f);
    gradcheck("moe lora", 1, 0.0f);
    gradcheck("hybrid AMEM lora", 2, 0.0f);
    g_lora = 0;
    /* the toy part's gradient (head.c term 4) through the whole model */
    setenv("MT_TEST_LOSS_PART", "0.3", 1);
    gradcheck("dense + hidden_l2", 0, 0.0f);
    gradcheck("moe + hidden_l2", 1, 0.0f);
    unsetenv("MT_TEST_LOSS_PART");
    /* MTP (SPEC 1e): every module parameter, the shared wte / lm_head / x_final paths */
    g_mtp = 2;
    gradcheck("dense mtp_depth=2", 0, 0.0f);
    gradcheck("dense softcap=15 mtp_depth=2", 0, 15.0f);
    gradcheck("moe mtp_depth=2", 1, 0.0f);
    g_mtp = 1;
    g_mtp_block = "M";
    gradcheck("hybrid AMEM mtp_depth=1 mtp_block=M", 2, 0.0f);
    g_mtp_block = "A";
    g_mtp = 0;
    /* Mixture-of-Depths (SPEC 1e): the routers, the selected rows' block at
     * their original RoPE positions, the combine and the BCE aux part */
    g_mod = 2;
    gradcheck("dense Aa mod", 0, 0.0f);
    g_mod = 1;
    gradcheck("dense aA mod", 0, 0.0f);
    g_mod = 3;
    gradcheck("moe ae mod", 1, 0.0f);
    g_mod = 1;   /* (AMeM: layer 2's experts see 6 rows, their gradients sit at the fp32 difference's noise) */
    gradcheck("hybrid aMEM mod", 2, 0.0f);
    g_mtp = 1;
    g_mod = 2;
    gradcheck("dense Aa mod mtp_depth=1", 0, 0.0f);
    g_mtp = 0;
    g_lora = 1;   /* LoRA with MTP: the modules frozen but their blocks' adapters */
    g_mtp = 1;
    gradcheck("dense mtp_depth=1 lora", 0, 0.0f);
    g_mtp = 0;
    /* LoRA: the routers frozen, the adapters inside the routed blocks see the selected rows */
    g_mod = 1;
    gradcheck("dense aA mod lora", 0, 0.0f);
    g_mod = 3;
    gradcheck("moe ae mod lora", 1, 0.0f);
    g_lora = 0;
    g_mod = 0;
    g_null = 2;   /* null experts (SPEC 1e): the router's E + Z rows, gates renormalised over both */
    gradcheck("moe null experts", 1, 0.0f);
    gradcheck("hybrid AMEM null experts", 2, 0.0f);
    microbatch_split(1);
    g_null = 0;
    null_vs_zero_experts(1);
    null_vs_zero_experts(2);
    lora_zero_start(0);
    lora_zero_start(1);
    lora_zero_start(2);
    accumulation(0);
    accumulation(1);
    accumulation(2);
    microbatch_split(0);
    microbatch_split(1);
    microbatch_split(2);
    if (n_fail) {
        fprintf(stderr, "test_model_grad: FAILED\n");
        return 1;
    }
    printf("test_model_grad: ok\n");
    return 0;
}
