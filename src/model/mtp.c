/*
 * mtp.c — multi-token prediction modules (DeepSeek-V3 style; SPEC 1e,
 * docs/model.md "MTP"), after the head on the last stage.
 *
 * Module k = 1..Dm, on this rank's rows i (row r = b*T + t of the
 * microbatch; "i+k" is within the sequence: t+k < T):
 *     hn  = rmsnorm(h^{k-1}) * hnorm          h^0 = x_final (before the final norm)
 *     en  = rmsnorm(wte[tgt[i+k-1]]) * enorm  (token 0 where t+k-1 >= T or the target is -1)
 *     h'  = [hn ; en] eh_proj^T = hn Wh^T + en We^T    (eh_proj = [Wh | We], D x 2D)
 *     h^k = block(h')                          a block of kind mtp_block, causal over the
 *                                              whole row range: rows past T-1-k only see
 *                                              earlier rows and predict nothing
 *     on  = rmsnorm(h^k) * norm;  z = on Wlm^T;  CE_i = lse(z_i) - z_i[tgt[i+k]]
 *     L_k = sum of CE over rows with t+k < T (and tgt[i+k] != -1) / their global count
 * The loss part "mtp_k" is (lambda/Dm) L_k (its weight inside its value, as
 * every part), reduced per target k ahead: n_targets - k n_sequences (exact
 * when the ignored targets are at most a suffix of each sequence: none in
 * training, the last one in `meshtrain logits`).
 *
 * Backward, k = Dm..1 (carry = d h^k from module k+1):
 *     dz = dscale (softmax - onehot) (xent_backward, in place);  dWlm += dz^T on;
 *     d on = dz Wlm;  d h^k = rmsnorm_backward(d on) + carry
 *     d h' = block_backward(d h^k);  dWh += d h'^T hn, dWe += d h'^T en
 *     carry = rmsnorm_backward(d h' Wh) (d h^{k-1}); d e = rmsnorm_backward(d h' We)
 * then dx (the head's d x_final) += carry; the embedding rows' gradients d e
 * enter dwte where the embedding's own backward runs (the first stage,
 * mtp_embed_backward), so wte is read and written inside its ZeRO unit.
 *
 * On a pipeline the modules live on the last stage and wte on the first:
 * the first stage sends the depths' embedding rows in the tail of its output
 * ((1 + Dm) blocks of (Nr, D): mt_model_stage_rows), middle stages pass them
 * on, and their gradients travel back in the tail of the input gradient to
 * the first stage, which scatters them into dwte.
 *
 * The modules' parameters live in the head's ZeRO unit (layer -1): a ZeRO-3
 * gather of the head brings them. Under TP the block splits like a main
 * block; eh_proj and the gains are whole (replicated; under SP their
 * gradients are partial sums over the model group, like the final norm's).
 */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"

void mtp_module_params(const struct mt_model *m, int k, mt_pspec_fn fn, void *user)
{
    static const char *const gains[3] = {"enorm", "hnorm", "norm"};
    char name[3][48], eh[48];
    for (int g = 0; g < 3; g++) {
        snprintf(name[g], sizeof name[g], "model.mtp.%d.%s.weight", k - 1, gains[g]);
        const struct mt_pspec s = {name[g], -1, 1, m->D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, -1};
        fn(user, &s);
    }
    snprintf(eh, sizeof eh, "model.mtp.%d.eh_proj.weight", k - 1);
    const struct mt_pspec s = {eh, -1, 2, m->D, 2 * (int64_t)m->D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_RESIDUAL,
                               -1};
    fn(user, &s);
}

void mtp_loss_register(struct mt_model *m)
{
    static const char *const names[MT_MTP_MAX_DEPTH] = {"mtp_1", "mtp_2", "mtp_3", "mtp_4"};
    m->loss_mtp0 = m->n_loss;
    const double w = m->mtp_depth > 0 ? (double)m->cfg.mtp_loss_coef / m->mtp_depth : 0.0;
    for (int k = 1; k <= m->mtp_depth; k++)
        model_loss_add(m, &(struct mt_loss_part){names[k - 1], "mtp", w, MT_LOSS_PER_TARGET_AHEAD, w != 0, k});
}

void mtp_carve(struct mt_model *m, struct mt_carver *c, struct mt_slot *S)
{
    const size_t Nr = (size_t)m->Nr, D = (size_t)m->D, V = (size_t)m->V;
    const enum mt_bucket A = MT_BUCKET_ACTS;
    for (int k = 0; k < m->mtp_depth; k++) {
        struct mt_mtp_slot dummy;   /* the plan carves sizes only: no slot arrays */
        memset(&dummy, 0, sizeof dummy);
        struct mt_mtp_slot *t = S->mtp ? &S->mtp[k] : &dummy;
        t->emb_idx = carve_i(c, A, Nr);
        t->tgt = carve_i(c, A, Nr);
        if (!m->last) continue;   /* the first stage of a pipeline: the ids its embedding rows scatter by */
        t->e_raw = carve_f(c, A, Nr * D);
        t->de_raw = carve_f(c, A, Nr * D);
        t->hn = carve_f(c, A, Nr * D);
        t->hrstd = carve_f(c, A, Nr);
        t->en = carve_f(c, A, Nr * D);
        t->erstd = carve_f(c, A, Nr);
        t->ly.x_in = carve_f(c, A, Nr * D);
        model_carve_block(m, c, &t->ly, m->mtp_kind);
        t->ly.index = -1;
        t->out = carve_f(c, A, Nr * D);
        t->on = carve_f(c, A, Nr * D);
        t->orstd = carve_f(c, A, Nr);
        t->logits = carve_f(c, A, Nr * V);
        t->losses = carve_f(c, A, Nr);
        t->xlse = carve_f(c, A, Nr);
    }
}

/* The rows' ids from the host targets (this rank's rows r0..r0+Nr):
 * emb_idx = tgt[i+k-1] (0 where none), tgt_k = tgt[i+k] (-1 where none). */
static void mtp_ids(struct mt_model *m, const int32_t *targets)
{
    const struct mt_ops_i *ops = m->ops;
    const int Nr = m->Nr, T = m->T, r0 = m->sp ? m->row0 : 0;
    int32_t *emb = m->mtp_host, *tgt = m->mtp_host + Nr;
    for (int k = 1; k <= m->mtp_depth; k++) {
        for (int i = 0; i < Nr; i++) {
            const int r = r0 + i, t = r % T;
            const int32_t e = t + k - 1 < T ? targets[r + k - 1] : -1;
            emb[i] = e < 0 ? 0 : e;
            tgt[i] = t + k < T && e >= 0 ? targets[r + k] : -1;
        }
        struct mt_mtp_slot *s = &m->mtp[k - 1];
        ops->copy_from_host(ops->be, s->emb_idx, emb, (size_t)Nr * sizeof(int32_t));
        ops->copy_from_host(ops->be, s->tgt, tgt, (size_t)Nr * sizeof(int32_t));
    }
}

void mtp_embed_forward(struct mt_model *m, const int32_t *targets, float *tail)
{
    const struct mt_ops_i *ops = m->ops;
    const size_t nd = (size_t)m->Nr * (size_t)m->D;
    mtp_ids(m, targets);
    for (int k = 1; k <= m->mtp_depth; k++) {
        struct mt_mtp_slot *s = &m->mtp[k - 1];
        ops->embed_forward(ops->be, tail ? tail + (size_t)(k - 1) * nd : s->e_raw, s->emb_idx, m->wte->data, m->Nr,
                           m->D);
    }
}

void mtp_stage_rows_in(struct mt_model *m, const int32_t *targets, const float *tail)
{
    const struct mt_ops_i *ops = m->ops;
    const size_t nd = (size_t)m->Nr * (size_t)m->D;
    if (!m->last) {   /* a middle stage passes them on */
        ops->copy(ops->be, m->x_final + nd, tail, (size_t)m->mtp_depth * nd * sizeof(float));
        return;
    }
    mtp_ids(m, targets);
    for (int k = 1; k <= m->mtp_depth; k++)
        ops->copy(ops->be, m->mtp[k - 1].e_raw, tail + (size_t)(k - 1) * nd, nd * sizeof(float));
}

void mtp_stage_rows_back(struct mt_model *m, const float *dy_tail)
{
    const struct mt_ops_i *ops = m->ops;
    const size_t nd = (size_t)m->Nr * (size_t)m->D;
    if (!m->last) {
        ops->copy(ops->be, m->dx + nd, dy_tail, (size_t)m->mtp_depth * nd * sizeof(float));
        return;
    }
    for (int k = 1; k <= m->mtp_depth; k++)
        ops->copy(ops->be, m->dx + (size_t)k * nd, m->mtp[k - 1].de_raw, nd * sizeof(float));
}

/* d loss / d CE_i of module k: the part's weight over the count it is divided
 * by (the model's own rule: MT_LOSS_PER_TARGET_AHEAD, rows with a target k ahead). */
static float mtp_dscale(const struct mt_model *m, int k)
{
    const struct mt_loss_part *p = &m->loss[m->loss_mtp0 + k - 1];
    const double c = model_loss_count(&m->norm, p);
    return c > 0 ? (float)(p->weight / c) : 0.0f;
}

enum mt_status mtp_forward(struct mt_ctx *ctx, struct mt_model *m, double *sum)
{
    const struct mt_ops_i *ops = m->ops;
    const int n = m->Nr, D = m->D, V = m->V;
    const float eps = m->cfg.norm_eps;
    const int armed = m->redo_armed;
    m->redo_armed = 0;   /* ReDo scores the main model's SwiGLUs, not the modules' (docs/model.md) */
    for (int k = 1; k <= m->mtp_depth; k++) {
        struct mt_mtp_slot *s = &m->mtp[k - 1];
        const struct mt_mtp_params *p = &m->mtp_p[k - 1];
        const float *h_prev = k == 1 ? m->x_final : m->mtp[k - 2].out;
        ops->rmsnorm_forward(ops->be, s->hn, s->hrstd, h_prev, p->hnorm->data, n, D, eps);
        ops->rmsnorm_forward(ops->be, s->en, s->erstd, s->e_raw, p->enorm->data, n, D, eps);
        ops->gemm(ops->be, 0, 1, n, D, D, 1.0f, s->hn, D, p->eh->data, 2 * D, 0.0f, s->ly.x_in, D);
        ops->gemm(ops->be, 0, 1, n, D, D, 1.0f, s->en, D, p->eh->data + D, 2 * D, 1.0f, s->ly.x_in, D);
        struct mt_piece_fwd a = model_train_fwd(m, s->out, 1);
        enum mt_status rc = model_block_forward(ctx, m, &s->ly, &a);
        if (rc != MT_OK) {
            m->redo_armed = armed;
            return rc;
        }
        ops->rmsnorm_forward(ops->be, s->on, s->orstd, s->out, p->norm->data, n, D, eps);
        ops->gemm(ops->be, 0, 1, n, V, D, 1.0f, s->on, D, m->lm_head->data, D, 0.0f, s->logits, V);
        ops->xent_forward(ops->be, s->losses, s->xlse, s->logits, s->tgt, n, V, m->cfg.logit_softcap);
        ops->copy_to_host(ops->be, m->h_losses, s->losses, (size_t)n * sizeof(float));
        double ce = 0.0;
        for (int i = 0; i < n; i++) ce += (double)m->h_losses[i];
        /* TP without SP: every model rank computed the whole batch; count it once */
        if (m->tp > 1 && !m->sp && m->tp_rank != 0) ce = 0.0;
        sum[m->loss_mtp0 + k - 1] += m->loss[m->loss_mtp0 + k - 1].weight * ce;
    }
    m->redo_armed = armed;
    return MT_OK;
}

enum mt_status mtp_backward(struct mt_ctx *ctx, struct mt_model *m)
{
    const struct mt_ops_i *ops = m->ops;
    const int n = m->Nr, D = m->D, V = m->V;
    const size_t nD = (size_t)n * (size_t)D;
    const int armed = m->redo_armed;
    m->redo_armed = 0;
    ops->copy(ops->be, m->mtp_dsave, m->dx, nD * sizeof(float));   /* the head's d x_final */
    for (int k = m->mtp_depth; k >= 1; k--) {
        struct mt_mtp_slot *s = &m->mtp[k - 1];
        const struct mt_mtp_params *p = &m->mtp_p[k - 1];
        const float *h_prev = k == 1 ? m->x_final : m->mtp[k - 2].out;
        ops->xent_backward(ops->be, s->logits, s->logits, s->xlse, s->tgt, mtp_dscale(m, k), n, V,
                           m->cfg.logit_softcap);
        if (!m->lm_head->frozen)   /* LoRA: the frozen head computes d on only */
            ops->gemm(ops->be, 1, 0, V, D, n, 1.0f, s->logits, V, s->on, D, grad_beta(m->lm_head, m->lm_head->grad),
                      m->lm_head->grad, D);
        ops->gemm(ops->be, 0, 0, n, D, V, 1.0f, s->logits, V, m->lm_head->data, D, 0.0f, m->dh, D);
        ops->rmsnorm_backward(ops->be, m->dx, p->norm->grad, m->dh, s->out, p->norm->data, s->orstd, n, D, 0);
        if (k < m->mtp_depth) ops->axpby(ops->be, m->dx, m->mtp_carry, 1.0f, 1.0f, nD);   /* + module k+1's */
        dyb_twin_drop(&m->s_dyb);   /* dx was written above, outside a piece's final norm */
        enum mt_status rc = model_block_backward(ctx, m, &s->ly);                       /* dx = d h' */
        if (rc != MT_OK) {
            m->redo_armed = armed;
            return rc;
        }
        if (!p->eh->frozen) {   /* LoRA: a frozen eh_proj has no weight gradient */
            ops->gemm(ops->be, 1, 0, D, D, n, 1.0f, m->dx, D, s->hn, D, 1.0f, p->eh->grad, 2 * D);
            ops->gemm(ops->be, 1, 0, D, D, n, 1.0f, m->dx, D, s->en, D, 1.0f, p->eh->grad + D, 2 * D);
        }
        ops->gemm(ops->be, 0, 0, n, D, D, 1.0f, m->dx, D, p->eh->data, 2 * D, 0.0f, m->dh, D);      /* d hn */
        ops->gemm(ops->be, 0, 0, n, D, D, 1.0f, m->dx, D, p->eh->data + D, 2 * D, 0.0f, m->mtp_tmp, D); /* d en */
        ops->rmsnorm_backward(ops->be, m->mtp_carry, p->hnorm->grad, m->dh, h_prev, p->hnorm->data, s->hrstd, n, D, 0);
        ops->rmsnorm_backward(ops->be, s->de_raw, p->enorm->grad, m->mtp_tmp, s->e_raw, p->enorm->data, s->erstd, n, D,
                              0);
    }
    ops->copy(ops->be, m->dx, m->mtp_dsave, nD * sizeof(float));
    ops->axpby(ops->be, m->dx, m->mtp_carry, 1.0f, 1.0f, nD);   /* + d h^0 through module 1 */
    m->redo_armed = armed;
    return MT_OK;
}

void mtp_embed_backward(struct mt_model *m, const float *tail)
{
    const struct mt_ops_i *ops = m->ops;
    const size_t nd = (size_t)m->Nr * (size_t)m->D;
    for (int k = 1; k <= m->mtp_depth; k++)
        ops->embed_backward(ops->be, m->wte->grad, tail ? tail + (size_t)(k - 1) * nd : m->mtp[k - 1].de_raw,
                            m->mtp[k - 1].emb_idx, m->Nr, m->D, m->V);
}

/* Per token and module: eh_proj (2 D^2), the block's, the lm head's (V D)
 * matmuls, x6 (SPEC's convention), plus the block's extra FLOPs. */
double mtp_flops_per_token(const struct mt_config *cfg, const struct mt_block_shape *s)
{
    if (cfg->mtp_depth <= 0) return 0.0;
    const int kind = mt_blocks_find(cfg->mtp_block[0]);
    const double per = 6.0 * (2.0 * (double)s->D * (double)s->D + (double)cfg->vocab_size * (double)s->D) +
                       mt_blocks_kind_flops(s, kind);
    return cfg->mtp_depth * per;
}
