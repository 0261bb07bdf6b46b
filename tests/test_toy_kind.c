/*
 * test_toy_kind.c — what adding a block kind costs (issue 30): a toy kind
 * 'S' = a per-channel scale mixer + the dense MLP, added with one piece (in
 * this file) and one line of the kind table, and nothing else.
 *
 * The toy mixer: x_mid = x_in + rmsnorm(x_in) * g, g its one parameter (the
 * channel scale, declared as the input norm's gain "input_layernorm.weight").
 * Backward: dg += sum_rows (d x_mid * rmsnorm(x_in)), d x_in += d x_mid +
 * rmsnorm_backward(d x_mid): the norm's backward accumulates onto dx, which
 * already holds the identity path.
 *
 * The line: the table (src/model/mt_block_kinds.def) expands
 * MT_BLOCK_KINDS_EXTRA after its own lines; this file defines it and
 * compiles the two files that expand the table (blocks.c, block_traits.c)
 * with it, so the library's copies are not linked and every consumer —
 * config checks, the model, the registry, the planner's counts — sees 'S'.
 * Checks: the pattern "SA" resolves and builds; the registry names of the S
 * layer; a central-difference gradient check of every parameter (the
 * embedding below the toy's layer included) through the whole model
 * (loss = lm).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

extern const struct mt_piece mt_piece_toy_scale;
#define MT_BLOCK_KINDS_EXTRA MT_BLOCK_KIND('S', "scale+mlp", toy_scale, mlp, 0, 0)
#include "model/blocks.c"
#include "model/block_traits.c"

/* ---- the piece: its parameters, saved activations, forward, backward ---- */

static void scale_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct mt_pspec p = {"input_layernorm.weight", -1, 1, s->D, 1, MT_SCALE_ONES, MT_ROLE_GAIN,
                               MT_LAYOUT_RESIDUAL, MT_BIND(ln1)};
    fn(user, &p);
}

/* saved: the normed rows (the scaled branch) and their rstd, x_mid; all shared fields */
static void scale_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    const size_t D = (size_t)pc->D, Nr = (size_t)pc->Nr;
    ly->h_attn_n = carve_f(c, MT_BUCKET_ACTS, Nr * D);
    ly->h_attn = ly->h_attn_n;
    ly->rstd_attn = carve_f(c, MT_BUCKET_ACTS, Nr);
    ly->x_mid = carve_f(c, MT_BUCKET_ACTS, Nr * D);
}

/* row-local: this rank's residual rows only, no collective */
static enum mt_status scale_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    (void)ctx;
    const struct mt_ops_i *ops = pc->ops;
    struct mt_layer *ly = pc->ly;
    const int n = a->B * a->T, Nr = pc->tp.sp ? n / pc->tp.tp : n, D = pc->D;
    ops->rmsnorm_resid_forward(ops->be, ly->h_attn_n, ly->rstd_attn, ly->x_mid, ly->x_in, ly->w.ln1->data, Nr, D,
                               pc->norm_eps);
    ops->axpby(ops->be, ly->x_mid, ly->h_attn_n, 1.0f, 1.0f, (size_t)Nr * D);
    return MT_OK;
}

static enum mt_status scale_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    (void)ctx;
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_layer *ly = pc->ly;
    const int Nr = pc->Nr, D = pc->D;
    /* the norm's backward reads d x_mid while it accumulates into dx: a copy first */
    ops->copy(ops->be, pc->dh, pc->dx, (size_t)Nr * D * sizeof(float));
    ops->rmsnorm_backward(ops->be, pc->dx, ly->w.ln1->grad, pc->dh, ly->x_in, ly->w.ln1->data, ly->rstd_attn, Nr, D,
                          1);
    return MT_OK;
}

const struct mt_piece mt_piece_toy_scale = {
    /* .name                  = */ "toy_scale",
    /* .tp_regions            = */ 0,
    /* .sp_gathers            = */ 0,
    /* .params                = */ scale_params,
    /* .check                 = */ NULL,
    /* .mm_per_token          = */ NULL,
    /* .extra_flops_per_token = */ NULL,
    /* .inactive_params       = */ NULL,
    /* .carve_scratch         = */ NULL,
    /* .ffn_scratch           = */ NULL,
    /* .carve                 = */ scale_carve,
    /* .forward               = */ scale_forward,
    /* .backward              = */ scale_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ NULL,
    /* .state_bytes           = */ 0,
    /* .own_bytes             = */ 0,
    /* .setup                 = */ NULL,
};

/* ---- the checks ---- */

static double loss_of(struct mt_ctx *ctx, struct mt_model *m, const int32_t *idx, const int32_t *tgt,
                      const struct mt_loss_norm *norm)
{
    struct mt_loss_parts parts;
    MT_ASSERT(mt_model_forward(ctx, m, idx, tgt, norm, &parts) == MT_OK);
    return mt_loss_parts_total(parts.v, parts.n);
}

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    char letters[4 * MT_MAX_BLOCK_KINDS];
    EXPECT(mt_blocks_find('S') >= 0 && !strcmp(mt_blocks_kind(mt_blocks_find('S'))->name, "scale+mlp"),
           "the table has no S (%s)", mt_blocks_letters(letters, sizeof letters));

    struct mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.vocab_size = 29;
    cfg.n_layer = 2;
    cfg.d_model = 16;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.mlp_hidden = 24;
    cfg.seq_len = 5;
    cfg.batch_size = 2;
    cfg.microbatches = 1;
    snprintf(cfg.pattern, sizeof cfg.pattern, "SA");
    MT_ASSERT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK);
    const int B = 2, T = 5, N = B * T;
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, B, &m) == MT_OK);

    /* registry: layer 0 is the toy's gain, then the MLP; parameters drawn
     * with a spread so that no gradient is near zero */
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    const char *want[] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                          "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight"};
    for (int i = 0; i < 4; i++) EXPECT(!strcmp(ps[i].name, want[i]), "param %d is %s, want %s", i, ps[i].name, want[i]);
    for (int i = 0; i < np; i++) {
        float *h = malloc(ps[i].numel * sizeof(float));
        const uint64_t st = mt_rng_stream(ps[i].name);
        for (size_t e = 0; e < ps[i].numel; e++) {
            double z = mt_rng_normal(5, st, e);
            h[e] = ps[i].ndim == 1 ? (float)(1.0 + 0.3 * z) : (float)(0.25 * z);
        }
        ops->copy_from_host(ops->be, ps[i].data, h, ps[i].numel * sizeof(float));
        free(h);
    }
    int32_t idx[16], tgt[16];
    for (int i = 0; i < N; i++) {
        idx[i] = (int32_t)(mt_rng_splitmix64(11 + 2 * (uint64_t)i) % (uint64_t)cfg.vocab_size);
        tgt[i] = (int32_t)(mt_rng_splitmix64(12 + 2 * (uint64_t)i) % (uint64_t)cfg.vocab_size);
    }
    struct mt_loss_norm norm = {(double)N, (double)B, (double)N};

    mt_model_zero_grad(m);
    loss_of(&ctx, m, idx, tgt, &norm);
    MT_ASSERT(mt_model_backward(&ctx, m) == MT_OK);

    /* central differences, |ga - gfd| <= 2e-2 max(|ga|, |gfd|) + 5e-3 gscale + 1e-5
     * (test_model_grad.c's rule: fp32 loss noise ~1e-6 / eps) */
    const float eps = 2e-3f;
    int checked = 0;
    for (int i = 0; i < np; i++) {
        float *ga = malloc(ps[i].numel * sizeof(float)), *w = malloc(ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, ga, ps[i].grad, ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, w, ps[i].data, ps[i].numel * sizeof(float));
        double gscale = 0;
        for (size_t e = 0; e < ps[i].numel; e++) gscale = fmax(gscale, fabs(ga[e]));
        const size_t step = ps[i].numel > 6 ? ps[i].numel / 6 : 1;
        for (size_t e = 0; e < ps[i].numel; e += step) {
            const float w0 = w[e];
            w[e] = w0 + eps;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double lp = loss_of(&ctx, m, idx, tgt, &norm);
            w[e] = w0 - eps;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double lm = loss_of(&ctx, m, idx, tgt, &norm);
            w[e] = w0;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double gfd = (lp - lm) / (2.0 * eps), g = ga[e];
            EXPECT(fabs(g - gfd) <= 2e-2 * fmax(fabs(g), fabs(gfd)) + 5e-3 * gscale + 1e-5,
                   "%s[%zu]: analytic %.6g, central difference %.6g", ps[i].name, e, g, gfd);
            checked++;
        }
        free(ga);
        free(w);
    }
    EXPECT(checked > 20, "only %d elements checked", checked);
    mt_model_destroy(&ctx, m);
    if (n_fail) {
        fprintf(stderr, "test_toy_kind: FAILED (%d)\n", n_fail);
        return 1;
    }
    printf("test_toy_kind: ok (%d elements of every parameter, S = a per-channel scale + the dense MLP)\n", checked);
    return 0;
}
