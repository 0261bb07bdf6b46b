/*
 * attention.c — the attention half of a block, forward and backward.
 *
 * Math (per token row, N = B*T rows; QD = H*hd, KD = K*hd):
 *     h   = rmsnorm(x_in) * g_attn
 *     q'  = h Wq^T (N,QD);  k' = h Wk^T, v = h Wv^T (N,KD)
 *     q   = rope(rmsnorm_hd(q') * g_q);  k = rope(rmsnorm_hd(k') * g_k)
 *           (QK-norm over each head's hd values, one [hd] gain shared by heads)
 *     att = causal_softmax(q k^T / sqrt(hd)) v      query head j reads kv head j/(H/K)
 *     x_out = x_in + att Wo^T          (a step that writes the stream itself: MT_RESID_NONE)
 * Backward (chain rule, in reverse):
 *     term 1: dWo += dx^T att;  datt = dx Wo
 *     term 2: dq, dk, dv from the flash-style kernel (recomputes P from lse);
 *             precision=bf16: the bf16 kernel (bf16 operands, fp32 statistics)
 *     term 3: RoPE is a rotation: dq_n = R^T dq; QK-norm backward -> dq', dk'
 *     term 4: dWq += dq'^T h, dWk += dk'^T h, dWv += dv^T h;  dh = dq' Wq + dk' Wk + dv Wv
 *     term 5: dx += rmsnorm_backward(dh)  (residual: the identity path is already in dx)
 *
 * Gradient rule: parameter grads +=; dx (residual) +=; every other buffer (datt,
 * dq, dk, dk2, dv, dh) is scratch and OVERWRITTEN.
 *
 * Under TP (src/parallel/tp_axis.c) this rank runs H/tp query and K/tp kv heads over all N rows:
 * forward enters with an all-gather of the normed rows (SP) and leaves with a
 * reduce-scatter (SP) or all-reduce (no SP) of the o_proj partial sums; the
 * backward runs the conjugates. The residual rows are Nr (N/tp under SP).
 */
#include <string.h>
#include "model_impl.h"

/* What an attention layer saves for its backward beyond the shared input
 * norm (struct mt_layer): its ly->state entry (attn_carve fills it). */
struct attn_state {
    float   *q_raw;    /* (N, QD) h Wq^T, before QK-norm                            */
    float   *k_raw;    /* (N, KD) h Wk^T, before QK-norm                            */
    float   *rstd_q;   /* (N*H)   QK-norm rstd per (token, head)                    */
    float   *rstd_k;   /* (N*K)                                                     */
    float   *q;        /* (N, QD) after QK-norm and RoPE                            */
    float   *k;        /* (N, KD) after QK-norm and RoPE                            */
    float   *v;        /* (N, KD)                                                   */
    float   *att;      /* (N, QD) attention output, before o_proj                   */
    mt_bf16 *att_b;    /* (N, QD) precision=bf16: bf16(att), Wo's operand; else NULL */
    mt_bf16 *qkv_b;    /* (N, QD + 2 KD) precision=bf16 attention: bf16(q), bf16(k),
                          bf16(v) as the forward's kernel rounded them, read again by
                          the backward's (mt_ops.h attention_*_bf16); else NULL     */
    float   *lse;      /* (B, H, T) attention logsumexp (no T x T matrix is kept)   */
};
_Static_assert(sizeof(struct attn_state) <= PIECE_STATE_MAX, "raise PIECE_STATE_MAX");

/* Attention's parameters beyond the input norm (its pc->pw in the layer). */
struct attn_w {
    struct mt_param *wq, *wk, *wv; /* (QD, D), (KD, D), (KD, D)                   */
    struct mt_param *wo;           /* (D, QD)                                     */
    struct mt_param *qn, *kn;      /* q_norm, k_norm (hd), shared by heads        */
};
_Static_assert(sizeof(struct attn_w) <= PIECE_W_MAX, "raise PIECE_W_MAX");
static struct attn_w *aw(const struct mt_piece_ctx *pc) { return pc->pw; }

/* Attention's per-model struct (its pc->own): this rank's dims (attn_setup)
 * and the backward scratch (WORKSPACE) every attention layer shares;
 * attn_carve_scratch fills it. */
struct attn_own {
    int    H, K, hd, QD, KD;     /* LOCAL (/tp) q / kv heads, head dim, H*hd, K*hd    */
    float *datt;                 /* (N, QD) d att; then d q_raw                      */
    float *dq;                   /* (N, QD)                                          */
    float *dk, *dk2, *dv;        /* (N, KD)                                          */
};
_Static_assert(sizeof(struct attn_own) <= PIECE_OWN_MAX, "raise PIECE_OWN_MAX");
static struct attn_own *aown(const struct mt_piece_ctx *pc) { return pc->own; }

/* precision=bf16 runs the attention core on the backend's bf16 entries
 * (mt_ops.h attention_*_bf16: bf16 operands, fp32 accumulation and
 * statistics) when it has them; fp32 mode keeps the fp32 kernels (bits unchanged). */
static int attn_bf16(const struct mt_piece_ctx *pc)
{
    return pc->bf16 && pc->ops->attention_forward_bf16 && pc->ops->attention_backward_bf16;
}

/* precision=bf16: d q_raw, d k_raw only as bf16 (qk_norm_rope_backward_bf16) when
 * their only readers are the q, k projections' bf16 GEMMs: both weights have
 * shadows and no adapter (LoRA's terms read the fp32 dy) */
static int qk_bf16_dy(const struct mt_piece_ctx *pc)
{
    const struct mt_param *wq = aw(pc)->wq, *wk = aw(pc)->wk;
    return pc->bf16 && pc->ops->qk_norm_rope_backward_bf16 && wq->bf16 && wk->bf16 && !wq->lora_a && !wk->lora_a;
}

/* precision=bf16: the input norm's fp32 output h has no reader when the q, k and
 * v GEMMs all read its twin hb (the twin exists: not under SP; every weight
 * shadowed, so forward and dW read hb; no adapter: LoRA's terms read h in
 * fp32). The norm then stores the twin alone (4 bytes a row element not
 * written), and h is passed as NULL, so a reader missed here faults. */
static int attn_h_unread(const struct mt_piece_ctx *pc)
{
    const struct mt_param *w[] = {aw(pc)->wq, aw(pc)->wk, aw(pc)->wv};
    if (!pc->nm->hb) return 0;
    for (int i = 0; i < 3; i++)
        if (!w[i]->bf16 || w[i]->lora_a) return 0;
    return 1;
}

/* precision=bf16 training: q, k and v go straight into the saved qkv_b as bf16,
 * rounded by their producers (qk_norm_rope_forward_bf16; v's GEMM with a bf16
 * output), and the attention entries read them there (q, k, v given as NULL):
 * the fp32 q, k, v are not written. Not with an adapter on v (LoRA adds its
 * fp32 term to v). The same values as rounding the fp32 ones (v: on cpu the
 * same bits; cuBLASLt's bf16-output matmul may sum in another order). */
static int qkv_prefill(const struct mt_piece_ctx *pc, const struct attn_state *st)
{
    const struct mt_param *wv = aw(pc)->wv;
    return attn_bf16(pc) && st->qkv_b && pc->ops->qk_norm_rope_forward_bf16 && pc->ops->gemm_bf16_out && wv->bf16 &&
           !wv->lora_a;
}

/* ... and dv (attention_backward_bf16's dv_b) when v's GEMMs read it alone (a
 * shadow, no adapter) and the model's dy scratch holds n elements and is free
 * until then: q and k take their twins (qk_b), not that scratch */
static int v_bf16_dy(const struct mt_piece_ctx *pc, int qk_b, size_t n)
{
    const struct mt_param *wv = aw(pc)->wv;
    return qk_b && wv->bf16 && !wv->lora_a && dyb_room(pc->dyb, n);
}

/* precision=bf16 training: q', k' (the q, k projections' outputs, before QK-norm)
 * stored as bf16 by their GEMMs (gemm_bf16_out, autocast's rounding of a Linear
 * output), in q_raw's and k_raw's memory, and read widened by both bf16 QK-norm
 * entries (q_raw_b, k_raw_b): 4 bytes an element of q', k' not moved forward,
 * 2 backward. Where q, k go straight into qkv_b (qkv_prefill) and d q', d k'
 * leave as bf16 (qk_bf16_dy): both directions take the bf16 entries */
static int qk_raw_bf16(const struct mt_piece_ctx *pc, const struct attn_state *st)
{
    return qkv_prefill(pc, st) && qk_bf16_dy(pc);
}

/* precision=bf16 training: the attention's output stored only as bf16 (att_b: Wo's
 * GEMMs read it, and the backward's D, mt_ops.h) and d att only as bf16 (o_proj's
 * backward GEMM writes it with a bf16 output for the attention backward, its one
 * reader): no fp32 att store, no fp32 d att store, no staging cast of d att, D read
 * from bf16 (16 bytes an element of att not moved). Not with an adapter on o
 * (LoRA's terms read the fp32 att and d att) nor without Wo's shadow */
static int att_bf16_only(const struct mt_piece_ctx *pc, const struct attn_state *st)
{
    const struct mt_param *wo = aw(pc)->wo;
    return attn_bf16(pc) && st->att_b && pc->ops->gemm_bf16_out && wo->bf16 && !wo->lora_a;
}

/* precision=bf16 training: dq, dk leave the attention backward as bf16 only
 * (dq_b, dk_b) for the QK-norm backward, their one reader (its bf16 entry reads
 * them widened; autocast's rounding point, as PyTorch's bf16 attention returns
 * them): 4 bytes an element of q and k not moved. Where d att is bf16 only
 * (ab) and q', k' leave as bf16 (qk_b): dq_b lives in the second half of datt,
 * whose first half holds d att for the same call and takes d q' after it; dk_b
 * in the second half of dk2, whose first half takes d k'. */
static int dqk_bf16(int ab, int qk_b) { return ab && qk_b; }

/* precision=bf16: d q', d k' and dv side by side in one (N, QD + 2 KD) bf16 operand, a
 * row q' | k' | v (the model's dy scratch; their producers write at row stride
 * QD + 2 KD: qk_norm_rope_backward_bf16's ld_dq_raw, ld_dk_raw, attention_backward_bf16's
 * ldv_b), so the three projections' backward is one dW GEMM and one dX GEMM where their
 * weights and gradients lie back to back (proj_bwd_rows): dh written once, not
 * written and then read and rewritten twice in fp32, and h read once for the three dW
 * (GPT-2 124M's widths: ~0.15 GB a layer and microbatch of 16k tokens). Where d q', d k'
 * and dv are all bf16 only (qk_b, v_bf16_dy) and the scratch holds them; else NULL */
static mt_bf16 *qkv_dy_rows(const struct mt_piece_ctx *pc, int qk_b, int N, int QD, int KD)
{
    const size_t n = (size_t)N * (size_t)(QD + 2 * KD);
    return attn_bf16(pc) && v_bf16_dy(pc, qk_b, n) ? pc->dyb->p : NULL;   /* (v_bf16_dy took the room) */
}

/* o_proj's backward with d att as bf16 only (att_bf16_only): dWo += dy^T att_b,
 * datt_b = bf16(dy Wo); dy rounded once for the two GEMMs (dyb_round) */
static void o_proj_bwd_b(const struct mt_piece_ctx *pc, mt_bf16 *datt_b, const float *dy, const mt_bf16 *att_b, int N,
                         int QD, int D)
{
    const struct mt_ops_i *ops = pc->ops;
    struct mt_param *wo = aw(pc)->wo;
    const mt_bf16 *dyb = dyb_round(ops, pc->dyb, dy, (size_t)N * (size_t)D);
    wlinear_backward_db(ops, NULL, 0.0f, wo->frozen ? NULL : wo->grad, dy, dyb, NULL, att_b, wo, N, QD, D);
    wlinear_backward_dx_bf16_out(ops, datt_b, dy, dyb, wo, N, QD, D);
}

/* x_out = x_in + attn(rmsnorm(x_in)) Wo^T for N = B*T rows (a->B, a->T)
 * (x_in, x_out: the step's streams; in the table's kinds x_in -> x_mid).
 * Training: a->state == NULL, positions 0..T-1 per sequence. Inference
 * (B == 1): a->state is this layer's K rows then its V rows, (t_max, K, hd)
 * each (attn_decode_floats); k, v of the T new tokens are appended at row
 * pos0 and the queries attend over rows [0, pos0+T). */
static enum mt_status attn_piece_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    const struct mt_ops_i *ops = pc->ops;
    struct attn_state *st = pc->st;
    const struct mt_tp_axis *tp = &pc->tp;
    const int B = a->B, T = a->T, pos0 = a->pos0;
    const struct attn_own *o = aown(pc);
    const int N = B * T, D = pc->D, H = o->H, K = o->K, hd = o->hd, QD = o->QD, KD = o->KD;
    const int Nr = tp->sp ? N / tp->tp : N;     /* residual rows on this rank */
    const float eps = pc->norm_eps;
    float *t = pc->s_lora;

    /* the input norm and the residual's seed (x_out = x_in, Wo's GEMM adds onto it) in one
     * pass; no seed where Wo's GEMM reads x_in itself (resid_in_gemm) */
    const int unread = attn_h_unread(pc), fold = resid_in_gemm(pc, aw(pc)->wo);
    const float *h = unread ? NULL : pc->nm->h;
    if (pc->nm->hb)   /* precision=bf16: + the bf16 twin, the q/k/v GEMMs' operand (alone where h is unread) */
        ops->rmsnorm_resid_forward_bf16(ops->be, unread ? NULL : pc->nm->h_n, pc->nm->hb, pc->nm->rstd,
                                        fold ? NULL : a->x_out, pc->x_in, pc->g->data, Nr, D, eps);
    else
        ops->rmsnorm_resid_forward(ops->be, pc->nm->h_n, pc->nm->rstd, a->x_out, pc->x_in, pc->g->data, Nr, D, eps);
    if (tp->sp) MT_CHECK(tpa_gather_rows(ctx, tp, pc->nm->h, pc->nm->h_n, Nr, D));   /* SP entry */
    /* this rank's heads (H, K are local under TP) over all N rows */
    const int pre = !a->state && qkv_prefill(pc, st), xb = !a->state && qk_raw_bf16(pc, st);
    mt_bf16 *qrb = xb ? (mt_bf16 *)st->q_raw : NULL, *krb = xb ? (mt_bf16 *)st->k_raw : NULL;
    if (xb) {
        wlinear_forward_bf16_out(ops, qrb, h, pc->nm->hb, aw(pc)->wq, N, D, QD);
        wlinear_forward_bf16_out(ops, krb, h, pc->nm->hb, aw(pc)->wk, N, D, KD);
    } else {
        proj_fwd_b(ops, t, st->q_raw, h, pc->nm->hb, aw(pc)->wq, N, D, QD, 0.0f);
        proj_fwd_b(ops, t, st->k_raw, h, pc->nm->hb, aw(pc)->wk, N, D, KD, 0.0f);
    }
    mt_bf16 *qb = pre ? st->qkv_b : NULL, *kb = pre ? qb + (size_t)N * QD : NULL, *vb = pre ? kb + (size_t)N * KD : NULL;
    if (pre)
        wlinear_forward_bf16_out(ops, vb, h, pc->nm->hb, aw(pc)->wv, N, D, KD);
    else
        proj_fwd_b(ops, t, st->v, h, pc->nm->hb, aw(pc)->wv, N, D, KD, 0.0f);
    if (pre)
        ops->qk_norm_rope_forward_bf16(ops->be, qb, kb, st->rstd_q, st->rstd_k, xb ? NULL : st->q_raw,
                                       xb ? NULL : st->k_raw, aw(pc)->qn->data, aw(pc)->kn->data, a->cos_tab,
                                       a->sin_tab, N, a->rope_T ? a->rope_T : T, pos0, H, K, hd, eps, qrb, krb);
    else
        ops->qk_norm_rope_forward(ops->be, st->q, st->k, st->rstd_q, st->rstd_k, st->q_raw, st->k_raw,
                                  aw(pc)->qn->data, aw(pc)->kn->data, a->cos_tab, a->sin_tab, N,
                                  a->rope_T ? a->rope_T : T, pos0, H, K, hd, eps);
    if (a->state) {
        /* inference, B == 1, one rank: append the new K/V rows, attend over the whole cache */
        MT_ASSERT(B == 1 && tp->tp == 1);
        float *kc = a->state, *vc = a->state + (size_t)a->t_max * KD;
        ops->copy(ops->be, kc + (size_t)pos0 * KD, st->k, (size_t)T * KD * sizeof(float));
        ops->copy(ops->be, vc + (size_t)pos0 * KD, st->v, (size_t)T * KD * sizeof(float));
        ops->attention_forward(ops->be, st->att, st->lse, st->q, kc, vc, 1, T, pos0 + T, pos0, H, K, hd);
    } else if (attn_bf16(pc)) {
        /* precision=bf16: bf16 operands on tensor cores; the kernel also writes
         * att's bf16 twin, Wo's operand in the forward and dWo GEMMs */
        ops->attention_forward_bf16(ops->be, att_bf16_only(pc, st) ? NULL : st->att, st->att_b, st->lse,
                                    pre ? NULL : st->q, pre ? NULL : st->k, pre ? NULL : st->v, B, T, H, K, hd,
                                    st->qkv_b);
    } else {
        ops->attention_forward(ops->be, st->att, st->lse, st->q, st->k, st->v, B, T, T, 0, H, K, hd);
    }
    /* precision=bf16 without the bf16 attention entry (or decoding): Wo's operand, rounded once here */
    if (st->att_b && (a->state || !attn_bf16(pc))) ops->cast_bf16(ops->be, st->att_b, st->att, (size_t)N * (size_t)QD);
    if (fold) {
        proj_fwd_resid(ops, t, a->x_out, pc->x_in, st->att, st->att_b, aw(pc)->wo, N, QD, D);
        return MT_OK;
    }
    if (tp->tp == 1) {
        proj_fwd_b(ops, t, a->x_out, st->att, st->att_b, aw(pc)->wo, N, QD, D, 1.0f);
        return MT_OK;
    }
    /* Wo holds this rank's columns: a partial sum over the model group (TP exit) */
    proj_fwd_b(ops, t, pc->s_red, st->att, st->att_b, aw(pc)->wo, N, QD, D, 0.0f);
    return tpa_exit_add(ctx, tp, a->x_out, pc->s_red, pc->s_full);
}

/* the q, k, v projections' backward, dh = the three dX terms: from one operand (rows,
 * ld: qkv_dy_rows), or from d q', d k' as bf16 in datt's and dk2's memory (qk_b) or fp32
 * there, and dv as bf16 (dvb) or fp32. Returns dh as bf16 (in its own memory, from the
 * one dX GEMM: dh_bf16_room), or NULL: dh written fp32 */
static const mt_bf16 *qkv_proj_bwd(const struct mt_piece_ctx *pc, const mt_bf16 *rows, int ld, int qk_b,
                                   const mt_bf16 *dvb, const float *h)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct attn_own *o = aown(pc);
    const int N = pc->N, D = pc->D, QD = o->QD, KD = o->KD;
    float *t = pc->s_lora, *dt = pc->s_dlora;
    if (rows) {
        struct mt_param *const w3[3] = {aw(pc)->wq, aw(pc)->wk, aw(pc)->wv};
        mt_bf16 *dhb = dh_bf16_room(pc);
        return proj_bwd_rows(ops, pc->dh, 0.0f, w3, 3, rows, MT_ELEM_BF16, ld, h, pc->nm->hb, N, D, dhb) ? dhb : NULL;
    }
    if (qk_b) {
        proj_bwd_dyb(ops, pc->dh, 0.0f, aw(pc)->wq, (const mt_bf16 *)o->datt, h, pc->nm->hb, N, D, QD);
        proj_bwd_dyb(ops, pc->dh, 1.0f, aw(pc)->wk, (const mt_bf16 *)o->dk2, h, pc->nm->hb, N, D, KD);
    } else {
        proj_bwd_b(ops, t, dt, pc->dh, 0.0f, aw(pc)->wq, o->datt, h, pc->nm->hb, N, D, QD, pc->dyb);
        proj_bwd_b(ops, t, dt, pc->dh, 1.0f, aw(pc)->wk, o->dk2, h, pc->nm->hb, N, D, KD, pc->dyb);
    }
    if (dvb)
        proj_bwd_dyb(ops, pc->dh, 1.0f, aw(pc)->wv, dvb, h, pc->nm->hb, N, D, KD);
    else
        proj_bwd_b(ops, t, dt, pc->dh, 1.0f, aw(pc)->wv, o->dv, h, pc->nm->hb, N, D, KD, pc->dyb);
    return NULL;
}

/* Reads dx (Nr, D) = d x_out; ACCUMULATES d x_in into dx; param grads +=. */
static enum mt_status attn_piece_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct attn_state *st = pc->st;
    const struct mt_tp_axis *tp = &pc->tp;
    const struct attn_own *o = aown(pc);
    const int B = pc->B, T = pc->T, N = pc->N, Nr = pc->Nr, D = pc->D, H = o->H, K = o->K, hd = o->hd;
    const int QD = o->QD, KD = o->KD;
    float *t = pc->s_lora, *dt = pc->s_dlora;
    const float *h = attn_h_unread(pc) ? NULL : pc->nm->h;   /* NULL: the GEMMs read hb alone */

    /* the TP exit's conjugate: SP gathers the rows of d x_out; without SP dx is already whole */
    const float *dy = pc->dx;
    if (tp->sp) {
        MT_CHECK(tpa_gather_rows(ctx, tp, pc->s_full, pc->dx, Nr, D));
        dy = pc->s_full;
    }
    /* term 1: o_proj; d att as bf16 only where the attention backward is its one reader */
    const int ab = att_bf16_only(pc, st);
    mt_bf16 *datt_b = ab ? (mt_bf16 *)aown(pc)->datt : NULL;   /* in datt's memory */
    if (ab) o_proj_bwd_b(pc, datt_b, dy, st->att_b, N, QD, D);
    else proj_bwd_b(ops, t, dt, aown(pc)->datt, 0.0f, aw(pc)->wo, dy, st->att, st->att_b, N, QD, D, pc->dyb);
    /* term 2: attention core (dq, dk, dv overwritten); dv as bf16 only (into the dy
     * scratch, free until v's GEMMs read it) where those GEMMs are its only readers */
    const int qk_b = qk_bf16_dy(pc);
    mt_bf16 *rows = qkv_dy_rows(pc, qk_b, N, QD, KD);   /* NULL: three buffers */
    const int ld = rows ? QD + 2 * KD : 0;
    mt_bf16 *dvb = rows ? rows + QD + KD
                 : attn_bf16(pc) && v_bf16_dy(pc, qk_b, (size_t)N * (size_t)KD) ? pc->dyb->p : NULL;
    const int pre = qkv_prefill(pc, st);   /* the forward left q, k, v in qkv_b only */
    const int dqk = dqk_bf16(ab, qk_b);
    mt_bf16 *dq_b = dqk ? (mt_bf16 *)aown(pc)->datt + (size_t)N * (size_t)QD : NULL;
    mt_bf16 *dk_b = dqk ? (mt_bf16 *)aown(pc)->dk2 + (size_t)N * (size_t)KD : NULL;
    if (attn_bf16(pc))
        ops->attention_backward_bf16(ops->be, aown(pc)->dq, aown(pc)->dk, aown(pc)->dv, ab ? NULL : aown(pc)->datt,
                                     pre ? NULL : st->q, pre ? NULL : st->k, pre ? NULL : st->v, ab ? NULL : st->att,
                                     st->lse, B, T, H, K, hd, st->qkv_b, dvb, datt_b, ab ? st->att_b : NULL, dq_b, dk_b,
                                     ld);
    else
        ops->attention_backward(ops->be, aown(pc)->dq, aown(pc)->dk, aown(pc)->dv, aown(pc)->datt, st->q, st->k, st->v,
                                st->att, st->lse, B, T, H, K, hd);
    /* term 3: RoPE, then QK-norm, one fused pass; datt is free now and takes dq'. When
     * dq', dk' are read by bf16 GEMMs alone (no adapters on q, k) they are stored as
     * bf16 only, in datt's and dk2's memory (the bits of the fp32 pass then the rounding) */
    if (qk_b) {
        const int xb = qk_raw_bf16(pc, st);   /* the forward stored q', k' as bf16 */
        mt_bf16 *dqr = rows ? rows : (mt_bf16 *)aown(pc)->datt, *dkr = rows ? rows + QD : (mt_bf16 *)aown(pc)->dk2;
        ops->qk_norm_rope_backward_bf16(ops->be, dqr, dkr, aw(pc)->qn->grad,
                                        aw(pc)->kn->grad, aown(pc)->dq, aown(pc)->dk, xb ? NULL : st->q_raw,
                                        xb ? NULL : st->k_raw, aw(pc)->qn->data, aw(pc)->kn->data, st->rstd_q,
                                        st->rstd_k, pc->rope_cos, pc->rope_sin, N, pc->rope_T ? pc->rope_T : T, H, K,
                                        hd, xb ? (const mt_bf16 *)st->q_raw : NULL,
                                        xb ? (const mt_bf16 *)st->k_raw : NULL, dq_b, dk_b, ld, ld);
    } else {
        ops->qk_norm_rope_backward(ops->be, aown(pc)->datt, aown(pc)->dk2, aw(pc)->qn->grad, aw(pc)->kn->grad,
                                   aown(pc)->dq, aown(pc)->dk, st->q_raw, st->k_raw, aw(pc)->qn->data, aw(pc)->kn->data,
                                   st->rstd_q, st->rstd_k, pc->rope_cos, pc->rope_sin, N, pc->rope_T ? pc->rope_T : T,
                                   H, K, hd);
    }
    /* term 4: projections (under TP dh is this rank's partial sum over its heads) */
    const mt_bf16 *dh_b = qkv_proj_bwd(pc, rows, ld, qk_b, dvb, h);
    /* the TP entry's conjugate: SP reduce-scatters the rows; without SP all-reduce */
    const float *dhr = pc->dh;
    if (tp->sp) {
        MT_CHECK(tpa_reduce_scatter_rows(ctx, tp, pc->s_red, pc->dh, Nr, D));
        dhr = pc->s_red;
    } else if (tp->tp > 1) {
        MT_CHECK(tpa_allreduce(ctx, tp, pc->dh, (size_t)N * D));
    }
    /* term 5: input rmsnorm, accumulated into the residual gradient (+ its bf16 twin) */
    MT_ASSERT(Nr == pc->Nr && (!dh_b || dhr == pc->dh));
    norm_bwd_twin(pc, dhr, dh_b);
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* the attention piece of the block-kind table                         */
/* ------------------------------------------------------------------ */

/* Attention's global dims from its config keys: q / kv heads, head dim. */
struct attn_dims { int64_t H, K, hd; };
static struct attn_dims attn_dims_of(const struct mt_config *cfg)
{
    return (struct attn_dims){cfg->n_head, cfg->n_kv_head, model_head_dim(cfg)};
}

static void attn_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct attn_dims a = attn_dims_of(s->cfg);
    const int64_t D = s->D, QD = a.H * a.hd, KD = a.K * a.hd;
    const struct mt_pspec p[] = {
        {"input_layernorm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_NORM},
        {"self_attn.q_proj.weight", -1, 2, QD, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct attn_w, wq)},
        {"self_attn.k_proj.weight", -1, 2, KD, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct attn_w, wk)},
        {"self_attn.v_proj.weight", -1, 2, KD, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct attn_w, wv)},
        {"self_attn.o_proj.weight", -1, 2, D, QD, MT_SCALE_NORMAL_OUT, MT_ROLE_DENSE, MT_LAYOUT_TP_COLS, MT_BIND_OWN_DW(struct attn_w, wo)},
        /* one hd gain shared by every head: with heads split, each rank's grad is partial */
        {"self_attn.q_norm.weight", -1, 1, a.hd, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN(struct attn_w, qn)},
        {"self_attn.k_norm.weight", -1, 1, a.hd, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN(struct attn_w, kn)},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fn(user, &p[i]);
}

/* Wq, Wk, Wv, Wo: D (2 QD + 2 KD) multiply-adds per token */
static double attn_mm(const struct mt_block_shape *s)
{
    const struct attn_dims a = attn_dims_of(s->cfg);
    return (double)s->D * (2.0 * (double)(a.H * a.hd) + 2.0 * (double)(a.K * a.hd));
}

/* scores and values, forward and backward: 12 T H hd per token (PaLM/nanochat convention) */
static double attn_extra(const struct mt_block_shape *s)
{
    const struct attn_dims a = attn_dims_of(s->cfg);
    return 12.0 * (double)s->T * (double)a.H * (double)a.hd;
}

/* The planner's work beyond the GEMMs. Attention, causal, as cuda_calib
 * counts it: forward 2 T H hd per token (QK^T + PV, half the square),
 * backward 2.5 x that. RMSNorm over w (the input norm, QK-norm): forward
 * reads x, writes y (2w), backward reads x, dy, writes dx (3w); RoPE and
 * the residual elementwise. rc: recompute repeats the forward. */
static void attn_work(const struct mt_block_shape *s, int rc, struct mt_work *w)
{
    const struct attn_dims ad = attn_dims_of(s->cfg);
    const double D = (double)s->D, qk = (double)(ad.H + ad.K) * (double)ad.hd;
    const double a = 2.0 * (double)s->T * (double)ad.H * (double)ad.hd;
    w->f[MT_WORK_ATTENTION_FWD] += a * (1.0 + rc);
    w->f[MT_WORK_ATTENTION_BWD] += 2.5 * a;
    if (!strcmp(s->cfg->precision, "bf16")) {
        /* precision=bf16 on cuda, in 4-byte elements (bf16 = 0.5): forward
         * rmsnorm_resid_forward_bf16 reads x, writes h, x_out (the residual's
         * seed) and h's twin: 3.5 D (2.5 D where h is not stored:
         * plan_norm_h_store); qk_norm_rope_forward_bf16 reads q', k',
         * writes bf16 q, k: 1 qk (q', k' stored bf16 by their GEMMs; v: its
         * GEMM writes bf16). Backward qk_norm_rope_backward_bf16 reads dq, dk,
         * bf16 q', k', writes bf16 dq', dk': 2 qk (1.5 qk with dq, dk bf16
         * from the attention backward: dqk_bf16, no LoRA); rmsnorm_backward
         * (accumulating) reads dh, x, dx, writes dx: 4 D (+ dx's bf16 twin,
         * 0.5 D: plan_norm_twin; dh bf16, 0.5 D less: plan_dh_bf16); o_proj's dy rounded once (cast_bf16,
         * elementwise): 1.5 D, none where it reads the twin. */
        const double hs = plan_norm_h_store(s), tw = plan_norm_twin(s);
        const double dqk = s->cfg->lora_rank <= 0 ? 0.5 : 0.0;   /* dq, dk read as bf16 (dqk_bf16) */
        const double dhb = plan_dh_bf16(s);   /* the norm backward reads d h as bf16 */
        const double rg = plan_resid_gemm(s);   /* Wo's GEMM adds x_in: the norm writes no x_out */
        w->e[MT_WORK_NORM] += (6.5 + hs + 0.5 * tw - 0.5 * dhb - rg) * D + (3.0 - dqk) * qk +
                              rc * ((2.5 + hs - rg) * D + 1.0 * qk);
        w->e[MT_WORK_ELEMENTWISE] += 1.5 * (1.0 - tw) * D;
        return;
    }
    w->e[MT_WORK_NORM] += 5.0 * (D + qk) + rc * 2.0 * (D + qk);
    w->e[MT_WORK_ELEMENTWISE] += 4.0 * qk + 6.0 * D + rc * (2.0 * qk + 3.0 * D);   /* RoPE, residual */
}

/* Saved for backward: the input norm (and its TP-gathered copy under SP),
 * q/k before and after QK-norm + RoPE, v, the output and its logsumexp
 * (the stream after the step, x_mid for the ffn, is the block's: carve_block). */
static void attn_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct attn_state *st = pc->st;
    const struct attn_own *o = aown(pc);
    const size_t N = (size_t)pc->N, D = (size_t)pc->D, QD = (size_t)o->QD, KD = (size_t)o->KD, Nr = (size_t)pc->Nr;
    const enum mt_bucket A = MT_BUCKET_ACTS;
    pc->nm->h_n = carve_f(c, A, Nr * D);
    pc->nm->h = pc->tp.sp ? carve_f(c, A, N * D) : pc->nm->h_n;   /* SP: the gathered copy is saved */
    pc->nm->rstd = carve_f(c, A, Nr);
    st->q_raw = carve_f(c, A, N * QD);
    st->k_raw = carve_f(c, A, N * KD);
    st->rstd_q = carve_f(c, A, N * (size_t)o->H);
    st->rstd_k = carve_f(c, A, N * (size_t)o->K);
    st->q = carve_f(c, A, N * QD);
    st->k = carve_f(c, A, N * KD);
    st->v = carve_f(c, A, N * KD);
    st->att = carve_f(c, A, N * QD);
    /* precision=bf16: the GEMM operands' bf16 twins (the norm's: not under SP, whose gathered rows are fp32) */
    pc->nm->hb = st->att_b = NULL;
    if (pc->bf16 && !pc->tp.sp && (!pc->ops || pc->ops->rmsnorm_resid_forward_bf16))
        pc->nm->hb = carve(c, A, Nr * D * 2);
    if (pc->bf16) st->att_b = carve(c, A, N * QD * 2);
    /* the attention core's rounded q, k, v, saved for its backward (2 bytes an
     * element here against 6 of re-rounding the fp32 q, k, v there) */
    st->qkv_b = pc->bf16 && (!pc->ops || pc->ops->attention_forward_bf16) ? carve(c, A, N * (QD + 2 * KD) * 2) : NULL;
    st->lse = carve_f(c, A, N * (size_t)o->H);
}

/* backward scratch of the mixer (WORKSPACE), shared by every attention layer */
static void attn_carve_scratch(const struct mt_piece_ctx *pc, struct mt_carver *c)
{
    struct attn_own *s = aown(pc);
    const size_t N = (size_t)pc->N, QD = (size_t)s->QD, KD = (size_t)s->KD;
    const enum mt_bucket W = MT_BUCKET_WORKSPACE;
    s->datt = carve_f(c, W, N * QD);
    s->dq = carve_f(c, W, N * QD);
    s->dk = carve_f(c, W, N * KD);
    s->dk2 = carve_f(c, W, N * KD);
    s->dv = carve_f(c, W, N * KD);
}

/* the K and V rows of t_max positions */
static size_t attn_decode_floats(const struct mt_piece_ctx *pc, int t_max) { return 2 * (size_t)t_max * (size_t)aown(pc)->KD; }

/* the bf16 dy copy's width: the q, k and v projections' outputs side by side (local;
 * qkv_dy_rows, which also covers d q', d k' and dv one at a time) */
static void attn_proj_scratch(const struct mt_piece_ctx *pc, size_t *rows, size_t *cols)
{
    (void)rows;
    const size_t w = (size_t)aown(pc)->QD + 2 * (size_t)aown(pc)->KD;
    if (w > *cols) *cols = w;
}

/* this rank's heads (the model axis splits them; the contract guarantees
 * divisibility) */
static void attn_setup(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_config *cfg)
{
    (void)ctx;
    const struct attn_dims a = attn_dims_of(cfg);
    const int tp = pc->tp.tp > 1 ? pc->tp.tp : 1;
    struct attn_own *o = aown(pc);
    o->H = (int)a.H / tp;
    o->K = (int)a.K / tp;
    o->hd = (int)a.hd;
    o->QD = o->H * o->hd;
    o->KD = o->K * o->hd;
}

static enum mt_status attn_check(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct attn_own *o = aown(pc);
    if (pc->D < 1 || o->H < 1 || o->K < 1 || pc->T < 1 || o->hd < 2)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: need D, H, K, T >= 1 and head_dim >= 2 (D=%d H=%d K=%d T=%d hd=%d)",
                            pc->D, o->H, o->K, pc->T, o->hd);
    if (o->H % o->K != 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: n_head %% n_kv_head != 0 (H=%d K=%d)", o->H, o->K);
    if (o->hd % 2 != 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: head_dim=%d must be even (RoPE)", o->hd);
    return MT_OK;
}

const struct mt_piece mt_piece_attention = {
    /* .name                  = */ "attention",
    /* .tp_regions            = */ 1,
    /* .sp_gathers            = */ 0,
    /* .params                = */ attn_params,
    /* .check                 = */ attn_check,
    /* .mm_per_token          = */ attn_mm,
    /* .extra_flops_per_token = */ attn_extra,
    /* .inactive_params       = */ NULL,
    /* .work_per_token        = */ attn_work,
    /* .carve_scratch         = */ attn_carve_scratch,
    /* .ffn_scratch           = */ NULL,
    /* .proj_scratch          = */ attn_proj_scratch,
    /* .carve                 = */ attn_carve,
    /* .forward               = */ attn_piece_forward,
    /* .backward              = */ attn_piece_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ attn_decode_floats,
    /* .state_bytes           = */ sizeof(struct attn_state),
    /* .own_bytes             = */ sizeof(struct attn_own),
    /* .setup                 = */ attn_setup,
};
