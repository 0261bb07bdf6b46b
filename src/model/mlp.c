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
 * precision=bf16 without ReDo or adapters (the fused path, mlp_backward_b):
 * term 1 splits around term 2, da = dy Wd; then a's bf16 twin, dg and du
 * from one read of g, u (swiglu_backward_act_bf16); then dWd += dy^T a.
 * Each output gets the same GEMM call as in the order above (same bits).
 *
 * Gradient rule: dWg, dWu, dWd +=; dh = (accumulate 0) or += (accumulate 1);
 * act, dact, dg, du are scratch (=).
 */
#include <string.h>
#include "model_impl.h"

/* What a dense MLP layer saves beyond the shared ffn norm (struct mt_layer):
 * its ly->state entry (mlp_carve fills it). */
struct mlp_state {
    float   *mg, *mu;    /* (N, F) gate / up pre-activations (NULL when stored bf16) */
    mt_bf16 *mgb, *mub;  /* (N, F) the same stored bf16 (mlp_gu_bf16), else NULL    */
};
_Static_assert(sizeof(struct mlp_state) <= PIECE_STATE_MAX, "raise PIECE_STATE_MAX");

/* The dense MLP's parameters beyond its input norm (its pc->pw in the layer). */
struct mlp_w {
    struct mt_param *wg, *wu, *wd; /* (F, D), (F, D), (D, F) */
};
_Static_assert(sizeof(struct mlp_w) <= PIECE_W_MAX, "raise PIECE_W_MAX");
static struct mlp_w *mw(const struct mt_piece_ctx *pc) { return pc->pw; }

/* The dense MLP's per-model struct (its pc->own): this rank's hidden units
 * (mlp_setup) and, precision=bf16 only, the bf16 twin of the SwiGLU output
 * that the down projection reads (WORKSPACE, NULL in fp32;
 * mlp_carve_scratch fills it). */
struct mlp_own {
    int      F;       /* LOCAL (/tp) dense hidden */
    mt_bf16 *act_b;   /* (N*F) bf16(s_act)        */
};
_Static_assert(sizeof(struct mlp_own) <= PIECE_OWN_MAX, "raise PIECE_OWN_MAX");
static struct mlp_own *mown(const struct mt_piece_ctx *pc) { return pc->own; }

/* The SwiGLU math on the ops table and the LoRA scratch t, dt (s_lora, s_dlora):
 * the dense MLP below, and the routed and shared experts of moe.c. */
/* SwiGLU act = silu(g) * u, and its bf16 twin act_b from the same kernel when given
 * (act NULL then: only the twin, swiglu_forward_bf16's contract) */
static void swiglu_act(const struct mt_ops_i *ops, float *act, mt_bf16 *act_b, const float *g, const float *u,
                       size_t n)
{
    if (act_b) ops->swiglu_forward_bf16(ops->be, act, act_b, g, u, n);
    else ops->swiglu_forward(ops->be, act, g, u, n);
}

/* act as the SwiGLU writes it: NULL (its fp32 form not stored) when nothing
 * reads it: the twin exists and the down projection's GEMMs read only the
 * twin (a bf16 shadow: wlinear_* take xb for x) and no adapter (LoRA reads
 * x in fp32) nor ReDo (it scores act) is there. At d 2048, F 5504, N 8192
 * that is 180 MB of stores per call, two calls per layer and step. */
static float *act_stored(float *act, const mt_bf16 *act_b, const struct mt_param *wd, const int64_t *redo)
{
    return act_b && wd->bf16 && !wd->lora_a && !redo ? NULL : act;
}

/* hb: h's bf16 twin, act_b: the scratch for act's (precision=bf16: the dense MLP, the
 * MoE's shared expert; else NULL) */
void mlp_forward_b(const struct mt_ops_i *ops, float *t, float *out, int accumulate, float *g, float *u, float *act,
                   mt_bf16 *act_b, const float *h, const mt_bf16 *hb, const struct mt_param *wg,
                   const struct mt_param *wu, const struct mt_param *wd, int n, int D, int F)
{
    if (n <= 0) return;
    proj_fwd_b(ops, t, g, h, hb, wg, n, D, F, 0.0f);
    proj_fwd_b(ops, t, u, h, hb, wu, n, D, F, 0.0f);
    act = act_stored(act, act_b, wd, NULL);
    swiglu_act(ops, act, act_b, g, u, (size_t)n * F);
    proj_fwd_b(ops, t, out, act, act_b, wd, n, F, D, accumulate ? 1.0f : 0.0f);
}

/* dg, du straight to bf16 (swiglu_backward_bf16) when their only readers are
 * the gate/up GEMMs on bf16 operands: both weights have shadows (precision=bf16)
 * and no adapter (lora_bwd_add reads the fp32 d), and the two buffers they go
 * to exist: act's twin act_b (dWd += dy^T act_b is its last reader) and the
 * dy scratch (down's rounded dy is read by then), n*F each. The GEMMs then see
 * the bits they saw after swiglu_backward + cast_bf16 (RNE either way; a
 * gemm_bf16 given fp32 rounds the same); the fp32 dg, du and their rounding
 * pass are gone (16 bytes of traffic a hidden unit: 8 written, 8 read back,
 * the 4 bf16 bytes now written by the SwiGLU instead of the cast). */
static int dgu_direct(const struct mt_ops_i *ops, const mt_bf16 *act_b, struct mt_dyb *dyb,
                      const struct mt_param *wg, const struct mt_param *wu, size_t nF)
{
    return ops->swiglu_backward_bf16 && act_b && dyb_room(dyb, nF) && wg->bf16 && wu->bf16 &&
           !wg->lora_a && !wu->lora_a;
}

/* The fused path: act only for its twin (act_stored gave NULL: no ReDo, no
 * adapter on Wd, Wd shadowed) and dg, du only for the bf16 gate/up GEMMs
 * (dgu_direct's conditions on Wg, Wu). The recompute of act and term 2 then
 * read g, u once (swiglu_backward_act_bf16) instead of twice: 8 bytes a
 * hidden unit, and one launch. dy's rounded copy (dyb->p) is still to be
 * read by dWd after that kernel, and act_b is its output, so bf16(dg),
 * bf16(du) go to the fp32 scratch dg, du (n*F floats each, carved in every
 * mode: the model's s_dg, s_du, which the bf16 paths left unused; bf16 fills
 * half of each): no memory added. */
static int act_fused(const struct mt_ops_i *ops, const float *act, const mt_bf16 *act_b, const float *dg,
                     const float *du, const struct mt_param *wg, const struct mt_param *wu)
{
    return ops->swiglu_backward_act_bf16 && !act && act_b && dg && du && wg->bf16 && wu->bf16 && !wg->lora_a &&
           !wu->lora_a;
}

/* term 3 on bf16 dg, du (no adapter: proj_bwd_b's GEMMs and nothing else) */
static void gate_up_bwd_b(const struct mt_ops_i *ops, float *dh, int accumulate, const mt_bf16 *dgb,
                          const mt_bf16 *dub, const float *h, const mt_bf16 *hb, struct mt_param *wg,
                          struct mt_param *wu, int n, int D, int F)
{
    wlinear_backward_db(ops, dh, accumulate ? 1.0f : 0.0f, wg->frozen ? NULL : wg->grad, NULL, dgb, h, hb, wg, n, D,
                        F);
    wlinear_backward_db(ops, dh, 1.0f, wu->frozen ? NULL : wu->grad, NULL, dub, h, hb, wu, n, D, F);
}

/* The fused path (act_fused's conditions hold): term 1 as proj_bwd_b runs it
 * (Wd has no adapter here), split: da = dy Wd on dy rounded once (when dWd
 * will read it too); then act's twin, bf16(dg), bf16(du) in one pass (dg, du
 * as bf16 scratch) from g, u in fp32 or, given gb, ub, stored bf16
 * (mlp_gu_bf16); then dWd += dy^T act on that rounded dy and the twin; then
 * term 3 on bf16 dg, du (given gb, ub and d act stored bf16: dg | du as one
 * operand, the gate and up projections' backward merged, proj_bwd_rows). */
static int mlp_bwd_fused(const struct mt_ops_i *ops, float *dh, int accumulate, mt_bf16 *act_b, float *dact,
                         float *dg, float *du, const float *dout, const float *h, const mt_bf16 *hb, const float *g,
                         const float *u, const mt_bf16 *gb, const mt_bf16 *ub, struct mt_param *wg,
                         struct mt_param *wu, struct mt_param *wd, int n, int D, int F, struct mt_dyb *dyb,
                         mt_bf16 *dh_b)
{
    float *dwd = wd->frozen ? NULL : wd->grad;
    const mt_bf16 *db = dwd ? dyb_round(ops, dyb, dout, (size_t)n * D) : NULL;
    mt_bf16 *dgb = (mt_bf16 *)dg, *dub = (mt_bf16 *)du;
    if (gb && ops->swiglu_backward_act_bf16_gud && ops->gemm_bf16_out) {
        /* d act stored bf16 too (autocast's rounding of the GEMM's output), in dact's
         * memory: its fp32 store and read-back, 8 bytes a hidden unit, become 4; and
         * bf16(dg), bf16(du) side by side, a row dg | du in dg's scratch (n F floats hold
         * n 2 F bf16), so the gate and up projections' backward is one dW GEMM and one
         * dX GEMM where their weights and gradients lie back to back (proj_bwd_rows):
         * dh written once, not written and then read and rewritten in fp32, h read once */
        mt_bf16 *dab = (mt_bf16 *)dact;
        wlinear_backward_dx_bf16_out(ops, dab, dout, db, wd, n, F, D);
        ops->swiglu_backward_act_bf16_gud(ops->be, act_b, dgb, dgb + F, dab, gb, ub, (size_t)n * F, (size_t)F,
                                          2 * (size_t)F);
        if (dwd) wlinear_backward_db(ops, NULL, 0.0f, dwd, dout, db, NULL, act_b, wd, n, F, D);
        struct mt_param *const w2[2] = {wg, wu};
        return proj_bwd_rows(ops, dh, accumulate ? 1.0f : 0.0f, w2, 2, dgb, MT_ELEM_BF16, 2 * F, h, hb, n, D, dh_b);
    }
    wlinear_backward_db(ops, dact, 0.0f, NULL, dout, db, NULL, act_b, wd, n, F, D);
    if (gb) ops->swiglu_backward_act_bf16_gu(ops->be, act_b, dgb, dub, dact, gb, ub, (size_t)n * F);
    else ops->swiglu_backward_act_bf16(ops->be, act_b, dgb, dub, dact, g, u, (size_t)n * F);
    if (dwd) wlinear_backward_db(ops, NULL, 0.0f, dwd, dout, db, NULL, act_b, wd, n, F, D);
    gate_up_bwd_b(ops, dh, accumulate, dgb, dub, h, hb, wg, wu, n, D, F);
    return 0;
}

void mlp_backward_b(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act,
                    mt_bf16 *act_b, float *dact, float *dg, float *du, const float *dout, const float *h,
                    const mt_bf16 *hb, const float *g, const float *u, struct mt_param *wg, struct mt_param *wu,
                    struct mt_param *wd, int n, int D, int F, struct mt_dyb *dyb, int64_t *redo)
{
    if (n <= 0) return;
    act = act_stored(act, act_b, wd, redo);
    if (act_fused(ops, act, act_b, dg, du, wg, wu)) {
        mlp_bwd_fused(ops, dh, accumulate, act_b, dact, dg, du, dout, h, hb, g, u, NULL, NULL, wg, wu, wd, n, D, F, dyb,
                      NULL);
        return;
    }
    swiglu_act(ops, act, act_b, g, u, (size_t)n * F);
    /* ReDo: the forward's activations again (same kernel, same g, u), once per microbatch */
    if (redo) ops->redo_score_acc(ops->be, redo, act, (size_t)n, F);
    proj_bwd_b(ops, t, dt, dact, 0.0f, wd, dout, act, act_b, n, F, D, dyb);
    if (dgu_direct(ops, act_b, dyb, wg, wu, (size_t)n * F)) {
        mt_bf16 *dgb = dyb->p, *dub = act_b;   /* both read by now (dgu_direct) */
        ops->swiglu_backward_bf16(ops->be, dgb, dub, dact, g, u, (size_t)n * F);
        gate_up_bwd_b(ops, dh, accumulate, dgb, dub, h, hb, wg, wu, n, D, F);
        return;
    }
    ops->swiglu_backward(ops->be, dg, du, dact, g, u, (size_t)n * F);
    proj_bwd_b(ops, t, dt, dh, accumulate ? 1.0f : 0.0f, wg, dg, h, hb, n, D, F, dyb);
    proj_bwd_b(ops, t, dt, dh, 1.0f, wu, du, h, hb, n, D, F, dyb);
}

/* ---- gate and up stored bf16 (the dense MLP in precision=bf16) ----
 * The gate/up GEMMs write bf16 (gemm_bf16_out: the fp32 accumulator rounded
 * once), the SwiGLU reads them widened (swiglu_*_bf16_gu): 12 bytes a hidden
 * unit less a step than fp32 g, u (4 written by the GEMMs, 4 read by the
 * forward SwiGLU, 4 by the backward's) and half their saved bytes. A
 * rounding point more than the fp32 storage, the one PyTorch's autocast has
 * (a bf16 Linear output); act, dg, du are computed in fp32 from the widened
 * values and rounded once, as before. Only where the fused backward runs
 * every time (no ReDo: it scores fp32 act; no adapter on gate, up or down:
 * LoRA reads and adds fp32), decided once from the config (mlp_gu_bf16). */
static int mlp_gu_bf16(const struct mt_piece_ctx *pc)
{
    if (!pc->bf16 || !pc->cfg || pc->cfg->redo_every > 0) return 0;
    return !lora_adapts(pc->cfg, MT_LORA_GATE | MT_LORA_UP | MT_LORA_DOWN) && mlp_gu_ops(pc->ops);
}

/* resid: NULL, or out = resid + the MLP (down's GEMM reads it: resid_in_gemm; accumulate ignored) */
void mlp_forward_gu(const struct mt_ops_i *ops, float *t, float *out, int accumulate, const float *resid,
                    mt_bf16 *gb, mt_bf16 *ub, mt_bf16 *act_b, const float *h, const mt_bf16 *hb,
                    const struct mt_param *wg, const struct mt_param *wu, const struct mt_param *wd, int n, int D,
                    int F)
{
    if (n <= 0) return;
    wlinear_forward_bf16_out(ops, gb, h, hb, wg, n, D, F);
    wlinear_forward_bf16_out(ops, ub, h, hb, wu, n, D, F);
    ops->swiglu_forward_bf16_gu(ops->be, act_b, gb, ub, (size_t)n * F);
    if (resid) proj_fwd_resid(ops, t, out, resid, NULL, act_b, wd, n, F, D);
    else proj_fwd_b(ops, t, out, NULL, act_b, wd, n, F, D, accumulate ? 1.0f : 0.0f);   /* no adapter: act_b alone */
}

/* mlp_backward_b's fused path (act_fused) on the bf16 g, u; dh_b: NULL, or room for dh
 * as bf16 (dh_bf16_room): returns 1 where dh went there (not written), else 0 */
int mlp_backward_gu(const struct mt_ops_i *ops, float *dh, int accumulate, mt_bf16 *act_b, float *dact, float *dg,
                    float *du, const float *dout, const float *h, const mt_bf16 *hb, const mt_bf16 *gb,
                    const mt_bf16 *ub, struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D,
                    int F, struct mt_dyb *dyb, mt_bf16 *dh_b)
{
    if (n <= 0) return 0;
    MT_ASSERT(act_b && dg && du && wg->bf16 && wu->bf16 && wd->bf16);
    return mlp_bwd_fused(ops, dh, accumulate, act_b, dact, dg, du, dout, h, hb, NULL, NULL, gb, ub, wg, wu, wd, n, D,
                         F, dyb, dh_b);
}

void mlp_forward(const struct mt_ops_i *ops, float *t, float *out, int accumulate, float *g, float *u, float *act,
                 const float *h, const struct mt_param *wg, const struct mt_param *wu, const struct mt_param *wd,
                 int n, int D, int F)
{
    mlp_forward_b(ops, t, out, accumulate, g, u, act, NULL, h, NULL, wg, wu, wd, n, D, F);
}

void mlp_backward(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act, float *dact,
                  float *dg, float *du, const float *dout, const float *h, const float *g, const float *u,
                  struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D, int F)
{
    mlp_backward_b(ops, t, dt, dh, accumulate, act, NULL, dact, dg, du, dout, h, NULL, g, u, wg, wu, wd, n, D, F, NULL,
                   NULL);
}

void mlp_backward_redo(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act,
                       float *dact, float *dg, float *du, const float *dout, const float *h, const float *g,
                       const float *u, struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D,
                       int F, int64_t *redo)
{
    mlp_backward_b(ops, t, dt, dh, accumulate, act, NULL, dact, dg, du, dout, h, NULL, g, u, wg, wu, wd, n, D, F, NULL,
                   redo);
}

/* ------------------------------------------------------------------ */
/* the dense MLP piece of the block-kind table (ffn of A; of M next)   */
/* ------------------------------------------------------------------ */

static void mlp_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const int64_t D = s->D, F = s->cfg->mlp_hidden;
    const struct mt_pspec p[] = {
        {"post_attention_layernorm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_NORM},
        {"mlp.gate_proj.weight", -1, 2, F, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mlp_w, wg)},
        {"mlp.up_proj.weight", -1, 2, F, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mlp_w, wu)},
        {"mlp.down_proj.weight", -1, 2, D, F, MT_SCALE_NORMAL_OUT, MT_ROLE_DENSE, MT_LAYOUT_TP_COLS, MT_BIND_OWN_DW(struct mlp_w, wd)},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fn(user, &p[i]);
}

/* this rank's hidden units (the model axis splits them) */
static void mlp_setup(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_config *cfg)
{
    (void)ctx;
    mown(pc)->F = cfg->mlp_hidden / (pc->tp.tp > 1 ? pc->tp.tp : 1);
}

/* the bf16 dy copy's width: gate and up's outputs (local) */
static void mlp_proj_scratch(const struct mt_piece_ctx *pc, size_t *rows, size_t *cols)
{
    (void)rows;
    if ((size_t)mown(pc)->F > *cols) *cols = (size_t)mown(pc)->F;
}

static enum mt_status mlp_check(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    if (mown(pc)->F < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: mlp_hidden=%d must be >= 1 (config not resolved?)", mown(pc)->F);
    return MT_OK;
}

static double mlp_mm(const struct mt_block_shape *s) { return 3.0 * (double)s->D * (double)s->cfg->mlp_hidden; }

/* The planner's work beyond the GEMMs: its norm, SwiGLU (forward reads
 * gate and up, writes h: 3 per hidden unit; backward 5), the residual. */
static void mlp_work(const struct mt_block_shape *s, int rc, struct mt_work *w)
{
    const double D = (double)s->D;
    const double hid = (double)s->cfg->mlp_hidden;
    if (!strcmp(s->cfg->precision, "bf16") && s->cfg->redo_every <= 0 && s->cfg->lora_rank <= 0) {
        /* precision=bf16 on cuda (mlp_gu_bf16: gate, up stored bf16), 4-byte
         * elements: norm forward reads x, writes h, x_out, h's twin (3.5 D;
         * 2.5 D where h is not stored: plan_norm_h_store), backward reads dh,
         * x, dx, writes dx (4 D; + dx's bf16 twin, 0.5 D: plan_norm_twin; dh
         * bf16, 0.5 D less: plan_dh_bf16);
         * swiglu_forward_bf16_gu reads bf16 g, u, writes bf16 act (1.5 per
         * hidden unit); down's dy rounded once (1.5 D; none where it reads the
         * previous piece's twin); swiglu_backward_act_bf16_gud reads bf16 dact
         * (down's backward GEMM writes it bf16), g, u, writes bf16 act, dg, du
         * (3). rc: the forward again. */
        const double hs = plan_norm_h_store(s), tw = plan_norm_twin(s), dhb = plan_dh_bf16(s);
        const double rg = plan_resid_gemm(s);   /* down's GEMM adds x_in: the norm writes no x_out */
        w->e[MT_WORK_NORM] += (6.5 + hs + 0.5 * tw - 0.5 * dhb - rg) * D + rc * (2.5 + hs - rg) * D;
        w->e[MT_WORK_ELEMENTWISE] += 4.5 * hid + 1.5 * (1.0 - tw) * D + rc * 1.5 * hid;
        return;
    }
    w->e[MT_WORK_NORM] += 5.0 * D + rc * 2.0 * D;
    w->e[MT_WORK_ELEMENTWISE] += 8.0 * hid + 6.0 * D + rc * (3.0 * hid + 3.0 * D);
}

/* saved: the norm, its TP-gathered copy under SP, the gate/up pre-activations */
static void mlp_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct mlp_state *st = pc->st;
    const size_t N = (size_t)pc->N, D = (size_t)pc->D;
    ffn_norm_carve_pc(pc, c, ly);
    pc->nm->h = pc->tp.sp ? carve_f(c, MT_BUCKET_ACTS, N * D) : pc->nm->h_n;
    /* precision=bf16: the norm's bf16 twin (gate/up's operand), not under SP (the gathered rows are fp32) */
    pc->nm->hb = NULL;
    if (pc->bf16 && !pc->tp.sp && (!pc->ops || pc->ops->rmsnorm_resid_forward_bf16))
        pc->nm->hb = carve(c, MT_BUCKET_ACTS, (size_t)pc->Nr * D * 2);
    st->mg = st->mu = NULL;
    st->mgb = st->mub = NULL;
    if (mlp_gu_bf16(pc)) {   /* gate and up stored bf16 (mlp_forward_gu) */
        st->mgb = carve(c, MT_BUCKET_ACTS, N * (size_t)mown(pc)->F * 2);
        st->mub = carve(c, MT_BUCKET_ACTS, N * (size_t)mown(pc)->F * 2);
    } else {
        st->mg = carve_f(c, MT_BUCKET_ACTS, N * (size_t)mown(pc)->F);
        st->mu = carve_f(c, MT_BUCKET_ACTS, N * (size_t)mown(pc)->F);
    }
}

/* the shared SwiGLU scratch (s_act, s_dact, s_dg, s_du) holds N x F/tp */
static size_t mlp_scratch(const struct mt_piece_ctx *pc) { return (size_t)pc->N * (size_t)mown(pc)->F; }

/* precision=bf16: the SwiGLU output's bf16 twin (down's operand), N x F/tp, WORKSPACE
 * (act is recomputed in backward, and so is its twin) */
static void mlp_carve_scratch(const struct mt_piece_ctx *pc, struct mt_carver *c)
{
    if (pc->bf16 && (!pc->ops || pc->ops->swiglu_forward_bf16))
        mown(pc)->act_b = carve(c, MT_BUCKET_WORKSPACE, (size_t)pc->N * (size_t)mown(pc)->F * 2);
}

/* gate and up stored bf16 (mgb): their GEMMs, forward and dW, read the norm's twin
 * alone (shadowed weights, no adapter, no ReDo), so h is neither stored nor passed */
static int mlp_h_unread(const struct mt_piece_ctx *pc, const struct mlp_state *st)
{
    return st->mgb && pc->nm->hb;
}

static enum mt_status mlp_piece_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    struct mlp_state *st = pc->st;
    const int n = a->B * a->T, D = pc->D;
    float *x_out = a->x_out;
    const int unread = mlp_h_unread(pc, st);
    const int fold = st->mgb && resid_in_gemm(pc, mw(pc)->wd);   /* down's GEMM adds x_in: no seed */
    ffn_norm_fwd(pc, fold ? NULL : x_out, n, unread);
    /* TP region: this rank's F/tp hidden units over all N rows (SP: gathered first) */
    if (pc->tp.tp > 1 && pc->tp.sp) MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->nm->h, pc->nm->h_n, n / pc->tp.tp, D));
    float *y = pc->tp.tp == 1 ? x_out : pc->s_red;
    const int acc = pc->tp.tp == 1;
    if (st->mgb)
        mlp_forward_gu(pc->ops, pc->s_lora, y, acc, fold ? pc->x_in : NULL, st->mgb, st->mub, mown(pc)->act_b,
                       unread ? NULL : pc->nm->h, pc->nm->hb, mw(pc)->wg, mw(pc)->wu, mw(pc)->wd, n, D, mown(pc)->F);
    else
        mlp_forward_b(pc->ops, pc->s_lora, y, acc, st->mg, st->mu, pc->s_act, mown(pc)->act_b, pc->nm->h, pc->nm->hb,
                      mw(pc)->wg, mw(pc)->wu, mw(pc)->wd, n, D, mown(pc)->F);
    if (pc->tp.tp == 1) return MT_OK;
    return tpa_exit_add(ctx, &pc->tp, x_out, pc->s_red, pc->s_full);
}

/* dx is d x_out = d x_in (identity) + d branch */
static enum mt_status mlp_piece_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct mlp_state *st = pc->st;
    const int N = pc->N, D = pc->D;
    const struct mlp_w *w = mw(pc);
    /* the TP exit's conjugate: SP gathers the rows of d x_out; without SP dx is already whole */
    const float *dy = pc->dx;
    if (pc->tp.sp) {
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->s_full, pc->dx, pc->Nr, D));
        dy = pc->s_full;
    }
    mt_bf16 *dh_b = NULL;   /* dh as bf16 in its own memory (dh_bf16_room), from the one dX GEMM */
    if (st->mgb) {
        mt_bf16 *room = dh_bf16_room(pc);
        dh_b = mlp_backward_gu(pc->ops, pc->dh, 0, mown(pc)->act_b, pc->s_dact, pc->s_dg, pc->s_du, dy,
                               mlp_h_unread(pc, st) ? NULL : pc->nm->h, pc->nm->hb, st->mgb, st->mub, w->wg, w->wu,
                               w->wd, N, D, mown(pc)->F, pc->dyb, room) ? room : NULL;
    } else
        mlp_backward_b(pc->ops, pc->s_lora, pc->s_dlora, pc->dh, 0, pc->s_act, mown(pc)->act_b, pc->s_dact, pc->s_dg,
                       pc->s_du, dy, pc->nm->h, pc->nm->hb, st->mg, st->mu, w->wg, w->wu, w->wd, N, D, mown(pc)->F,
                       pc->dyb, pc->redo);
    /* the TP entry's conjugate: SP reduce-scatters the rows; without SP all-reduce */
    const float *dhr = pc->dh;   /* d h_mlp_n (Nr, D) */
    if (pc->tp.sp) {
        MT_CHECK(tpa_reduce_scatter_rows(ctx, &pc->tp, pc->s_red, pc->dh, pc->Nr, D));
        dhr = pc->s_red;
    } else if (pc->tp.tp > 1) {
        MT_CHECK(tpa_allreduce(ctx, &pc->tp, pc->dh, (size_t)N * D));
    }
    MT_ASSERT(!dh_b || dhr == pc->dh);
    ffn_norm_bwd(pc, dhr, dh_b);
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
    /* .work_per_token        = */ mlp_work,
    /* .carve_scratch         = */ mlp_carve_scratch,
    /* .ffn_scratch           = */ mlp_scratch,
    /* .proj_scratch          = */ mlp_proj_scratch,
    /* .carve                 = */ mlp_carve,
    /* .forward               = */ mlp_piece_forward,
    /* .backward              = */ mlp_piece_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ NULL,
    /* .state_bytes           = */ sizeof(struct mlp_state),
    /* .own_bytes             = */ sizeof(struct mlp_own),
    /* .setup                 = */ mlp_setup,
};
