/*
 * mlp.c — SwiGLU feed-forward, used for the dense MLP, each routed expert
 * (on its contiguous row range of the expert-sorted buffer) and the shared expert.
 *
 * Math, n rows of width D, hidden F:
 *     g = h Wg^T, u = h Wu^T (n,F);  a = silu(g) * u;  y = a Wd^T (n,D)
 * Backward:
 *     term 1: dWd += dy^T a;  da = dy Wd
 *     term 2: dg = da * u * silu'(g);  du = da * silu(g)
 *     term 3: dWg += dg^T h, dWu += du^T h;  dh = dg Wg + du Wu
 * `a` is not saved: it is recomputed from the saved g, u (one cheap elementwise op).
 *
 * Gradient rule: dWg, dWu, dWd +=; dh = (accumulate 0) or += (accumulate 1);
 * act, dact, dg, du are scratch (=).
 */
#include "model_impl.h"

void mlp_forward(struct mt_model *m, float *out, int accumulate, float *g, float *u, float *act,
                 const float *h, const struct mt_param *wg, const struct mt_param *wu, const struct mt_param *wd,
                 int n, int D, int F)
{
    if (n <= 0) return;
    proj_forward(m, g, h, wg, n, D, F, 0.0f);
    proj_forward(m, u, h, wu, n, D, F, 0.0f);
    m->ops->swiglu_forward(act, g, u, (size_t)n * F);
    proj_forward(m, out, act, wd, n, F, D, accumulate ? 1.0f : 0.0f);
}

void mlp_backward(struct mt_model *m, float *dh, int accumulate, float *act, float *dact, float *dg, float *du,
                  const float *dout, const float *h, const float *g, const float *u,
                  struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D, int F)
{
    if (n <= 0) return;
    const struct mt_ops_i *ops = m->ops;
    ops->swiglu_forward(act, g, u, (size_t)n * F);
    proj_backward(m, dact, 0.0f, wd, dout, act, n, F, D);
    ops->swiglu_backward(dg, du, dact, g, u, (size_t)n * F);
    proj_backward(m, dh, accumulate ? 1.0f : 0.0f, wg, dg, h, n, D, F);
    proj_backward(m, dh, 1.0f, wu, du, h, n, D, F);
}

/* ------------------------------------------------------------------ */
/* the dense MLP piece of the block-kind table (ffn of A; of M next)   */
/* ------------------------------------------------------------------ */

static void mlp_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const int64_t D = s->D, F = s->F;
    const struct mt_pspec p[] = {
        {"post_attention_layernorm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND(ln2)},
        {"mlp.gate_proj.weight", -1, 2, F, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND(wg)},
        {"mlp.up_proj.weight", -1, 2, F, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND(wu)},
        {"mlp.down_proj.weight", -1, 2, D, F, MT_SCALE_NORMAL_OUT, MT_ROLE_DENSE, MT_LAYOUT_TP_COLS, MT_BIND(wd)},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fn(user, &p[i]);
}

static enum mt_status mlp_check(struct mt_ctx *ctx, const struct mt_model *m)
{
    if (m->F < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: mlp_hidden=%d must be >= 1 (config not resolved?)", m->F);
    return MT_OK;
}

static double mlp_mm(const struct mt_block_shape *s) { return 3.0 * (double)s->D * (double)s->F; }

/* saved: the norm, its TP-gathered copy under SP, the gate/up pre-activations */
static void mlp_carve(struct mt_model *m, struct mt_carver *c, struct mt_layer *ly)
{
    const size_t N = (size_t)m->N, D = (size_t)m->D;
    ffn_norm_carve(m, c, ly);
    ly->h_mlp = m->sp ? carve_f(c, MT_BUCKET_ACTS, N * D) : ly->h_mlp_n;
    ly->mg = carve_f(c, MT_BUCKET_ACTS, N * (size_t)m->F);
    ly->mu = carve_f(c, MT_BUCKET_ACTS, N * (size_t)m->F);
}

/* the shared SwiGLU scratch (s_act, s_dact, s_dg, s_du) holds N x F/tp */
static size_t mlp_scratch(const struct mt_model *m) { return (size_t)m->N * (size_t)m->F; }

static enum mt_status mlp_piece_forward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly,
                                        struct mt_piece_fwd *a)
{
    const int n = a->B * a->T, D = m->D;
    float *x_out = a->x_out;
    ffn_norm_forward(m, ly, x_out, n);
    if (m->tp == 1) {
        mlp_forward(m, x_out, 1, ly->mg, ly->mu, m->s_act, ly->h_mlp, ly->w.wg, ly->w.wu, ly->w.wd, n, D, m->F);
        return MT_OK;
    }
    /* TP region: this rank's F/tp hidden units over all N rows */
    if (m->sp) MT_CHECK(tp_gather_rows(ctx, m, ly->h_mlp, ly->h_mlp_n, m->sp ? n / m->tp : n, D));
    mlp_forward(m, m->s_red, 0, ly->mg, ly->mu, m->s_act, ly->h_mlp, ly->w.wg, ly->w.wu, ly->w.wd, n, D, m->F);
    return tp_exit_add(ctx, m, x_out, m->s_red, m->s_full);
}

/* dx is d x_out = d x_mid (identity) + d branch */
static enum mt_status mlp_piece_backward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly)
{
    const int N = m->N, D = m->D;
    const struct mt_layer_w *w = &ly->w;
    const float *dhr = m->dh;   /* d h_mlp_n (Nr, D) */
    if (m->tp == 1) {
        mlp_backward(m, m->dh, 0, m->s_act, m->s_dact, m->s_dg, m->s_du,
                     m->dx, ly->h_mlp, ly->mg, ly->mu, w->wg, w->wu, w->wd, N, D, m->F);
        ffn_norm_backward(m, ly, dhr);
        return MT_OK;
    }
    /* TP region: conjugate of the exit (SP: gather d rows), then of the entry */
    const float *dy = m->dx;
    if (m->sp) {
        MT_CHECK(tp_gather_rows(ctx, m, m->s_full, m->dx, m->Nr, D));
        dy = m->s_full;
    }
    mlp_backward(m, m->dh, 0, m->s_act, m->s_dact, m->s_dg, m->s_du, dy,
                 ly->h_mlp, ly->mg, ly->mu, w->wg, w->wu, w->wd, N, D, m->F);
    if (m->sp) {
        MT_CHECK(tp_reduce_scatter_rows(ctx, m, m->s_red, m->dh, m->Nr, D));
        dhr = m->s_red;
    } else {
        MT_CHECK(tp_allreduce(ctx, m, m->dh, (size_t)N * D));
    }
    ffn_norm_backward(m, ly, dhr);
    return MT_OK;
}

const struct mt_piece mt_piece_mlp = {
    /* .name                  = */ "mlp",
    /* .tp_regions            = */ 1,
    /* .sp_gathers            = */ 0,
    /* .params                = */ mlp_params,
    /* .check                 = */ mlp_check,
    /* .mm_per_token          = */ mlp_mm,
    /* .extra_flops_per_token = */ NULL,
    /* .inactive_params       = */ NULL,
    /* .carve                 = */ mlp_carve,
    /* .carve_scratch         = */ NULL,
    /* .ffn_scratch           = */ mlp_scratch,
    /* .forward               = */ mlp_piece_forward,
    /* .backward              = */ mlp_piece_backward,
    /* .undo_recompute        = */ NULL,
};
