/*
 * head.c — the head piece (mt_head, model_impl.h): final rmsnorm, lm_head,
 * optional softcap and cross-entropy, as one unit that declares its
 * parameters (model.norm.weight, lm_head.weight), its FLOPs (6 V D per
 * token) and its loss parts.
 *
 * Math, N rows:
 *     hf = rmsnorm(x_final) * g_final;  z = hf Wlm^T (N,V)
 *     s  = c tanh(z/c) if softcap c > 0 else z
 *     loss_n = lse(s_n) - s_n[target_n]   (0 where target == -1)
 *     lm = sum_n loss_n / n_targets(global)     (the model divides; sum kept in double)
 * Backward (dscale = 1/n_targets):
 *     term 1: dz = dscale (softmax(s) - onehot) ds/dz   (kernel, in place over z; with the
 *             backend's xent_fused the forward already wrote it: one pass over z)
 *     term 2: dWlm += dz^T hf;  dhf = dz Wlm   (precision=bf16: dz read as its bf16 twin,
 *             written by xent_fused_bf16 in the forward's pass: no per-call rounding;
 *             where the backend has xent_fused_bf16_logits, z itself is bf16: the
 *             GEMM's output rounded once, as autocast's, and the twin written over it)
 *     term 3: dx = rmsnorm_backward(dhf)
 *
 * Gradient rule: dWlm, dg_final +=; dlogits (in place) and dx OVERWRITTEN
 * (dx starts the residual-stream gradient of the backward pass).
 *
 * Loss parts (mt_model.h): the head registers "lm" (weight 1, per target)
 * and, with the test hook test_loss_part=W, the toy part "hidden_l2":
 *     hidden_l2 = W sum_n |x_final_n|^2 / n_tokens,   d/dx_final = 2 W x_final / n_tokens
 * (term 4, added to dx after term 3; not run when W = 0, so a zero-weight
 * part changes no bit of training). It shows what an extra part costs: its
 * registration, its forward sum, its backward term.
 */
#include <math.h>
#include <stdlib.h>

#include "model_impl.h"
#include "../core/mt_knobs.h"

int model_loss_add(struct mt_model *m, const struct mt_loss_part *p)
{
    MT_ASSERT(m->n_loss < MT_LOSS_MAX_PARTS);
    m->loss[m->n_loss] = *p;
    return m->n_loss++;
}

static enum mt_status head_loss_register(struct mt_ctx *ctx, struct mt_model *m, int extras)
{
    m->head_bf16_logits = !ctx || mt_knob_int(ctx, MT_KNOB_HEAD_BF16_LOGITS) != 0;
    if (!extras) {
        const int k = model_loss_add(m, &(struct mt_loss_part){"lm", "head", 1.0, MT_LOSS_PER_TARGET, 1, 0});
        MT_ASSERT(k == MT_LOSS_LM);
        m->loss_hidden_l2 = -1;
        return MT_OK;
    }
    /* test hook (knob test_loss_part, env MT_TEST_LOSS_PART): W adds hidden_l2 with weight W */
    const char *v = mt_knob_str(ctx, MT_KNOB_TEST_LOSS_PART);
    if (!v[0]) return MT_OK;
    char *end;
    const double w = strtod(v, &end);
    if (end == v || *end || !isfinite(w) || w < 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "test_loss_part=%s: want a finite weight >= 0, or empty", v);
    m->loss_hidden_l2 = model_loss_add(m, &(struct mt_loss_part){"hidden_l2", "head", w, MT_LOSS_PER_TOKEN, w != 0, 0});
    return MT_OK;
}

int head_chunked(const struct mt_model *m, int with_loss)
{
    return with_loss && !m->keep_logits && mt_ops_supports(m->ops, xent_fused) && m->dlogits_bf16 && m->lm_head->bf16;
}

static void head_forward(struct mt_model *m, int n, int with_loss, double *sum)
{
    const struct mt_ops_i *ops = m->ops;
    /* precision=bf16: the norm kernel writes the lm head's bf16 operand too */
    if (m->h_final_bf16)
        ops->rmsnorm_forward_bf16(ops->be, m->h_final, m->h_final_bf16, m->rstd_final, m->x_final, m->norm_f->data, n, m->D,
                                  m->cfg.norm_eps);
    else
        ops->rmsnorm_forward(ops->be, m->h_final, m->rstd_final, m->x_final, m->norm_f->data, n, m->D, m->cfg.norm_eps);
    const int32_t *tg = m->targets + (m->sp ? m->row0 : 0);
    const float dscale = m->norm.n_targets > 0 ? (float)(1.0 / m->norm.n_targets) : 0.0f;
    /* one pass over the logits when the backend can: loss and dlogits together
     * (dscale as head_backward has it), the backward then starts at term 2 */
    m->dlogits_ready = with_loss && mt_ops_supports(ops, xent_fused) && !m->keep_logits;
    /* precision=bf16: the same pass writes dlogits' bf16 twin, the backward GEMMs' operand;
     * then the fp32 logits are scratch, in chunks of logits_rows rows (head_chunk_rows) */
    m->dlogits_twin = head_chunked(m, with_loss);
    if (m->dlogits_twin && m->head_bf16_logits && ops->xent_fused_bf16_logits && ops->gemm_bf16_out) {
        /* ... and with bf16 logits (autocast's Linear output): the GEMM writes
         * them into the twin's rows, the cross-entropy turns them into the twin
         * in place. No fp32 logits: 6 bytes an element of logits' traffic
         * instead of 10 (8.2 GB -> 4.9 GB a step at GPT-2's B16 x T1024) */
        wlinear_forward_bf16_out(ops, m->dlogits_bf16, m->h_final, m->h_final_bf16, m->lm_head, n, m->D, m->V);
        ops->xent_fused_bf16_logits(ops->be, m->losses, m->xlse, m->dlogits_bf16, tg, dscale, n, m->V,
                                    m->cfg.logit_softcap);
    } else if (m->dlogits_twin) {
        for (int r0 = 0; r0 < n; r0 += m->logits_rows) {
            const int rows = n - r0 < m->logits_rows ? n - r0 : m->logits_rows;
            const size_t hoff = (size_t)r0 * (size_t)m->D;
            wlinear_forward(ops, m->logits, m->h_final + hoff, m->h_final_bf16 ? m->h_final_bf16 + hoff : NULL,
                            m->lm_head, rows, m->D, m->V, 0.0f);
            ops->xent_fused_bf16(ops->be, m->losses + r0, m->xlse + r0, m->logits,
                                 m->dlogits_bf16 + (size_t)r0 * (size_t)m->V, tg + r0, dscale, rows, m->V,
                                 m->cfg.logit_softcap);
        }
    } else {
        wlinear_forward(ops, m->logits, m->h_final, m->h_final_bf16, m->lm_head, n, m->D, m->V, 0.0f);
        if (!with_loss) return;
        if (m->dlogits_ready)
            ops->xent_fused(ops->be, m->losses, m->xlse, m->logits, tg, dscale, n, m->V, m->cfg.logit_softcap);
        else
            ops->xent_forward(ops->be, m->losses, m->xlse, m->logits, tg, n, m->V, m->cfg.logit_softcap);
    }
    ops->copy_to_host(ops->be, m->h_losses, m->losses, (size_t)n * sizeof(float));
    double lm = 0.0, l2 = 0.0;
    for (int i = 0; i < n; i++) lm += (double)m->h_losses[i];
    if (m->loss_hidden_l2 >= 0)
        l2 = m->loss[m->loss_hidden_l2].weight * ops->sumsq(ops->be, m->x_final, (size_t)n * (size_t)m->D);
    /* TP without SP: every model rank computed the same whole-batch parts; count them once */
    if (m->tp > 1 && !m->sp && m->tp_rank != 0) lm = l2 = 0.0;
    sum[MT_LOSS_LM] += lm;
    if (m->loss_hidden_l2 >= 0) sum[m->loss_hidden_l2] += l2;
}

static void head_backward(struct mt_model *m)
{
    const struct mt_ops_i *ops = m->ops;
    const int N = m->Nr, D = m->D, V = m->V;   /* this rank's rows (all N without SP) */
    const float dscale = m->norm.n_targets > 0 ? (float)(1.0 / m->norm.n_targets) : 0.0f;
    if (!m->dlogits_ready)
        ops->xent_backward(ops->be, m->logits, m->logits, m->xlse, m->targets + (m->sp ? m->row0 : 0), dscale, N, V,
                           m->cfg.logit_softcap);
    /* LoRA: a frozen lm_head computes dx only; with the twin the GEMMs read
     * bf16(dlogits) as stored (logits' contents are unspecified then) */
    wlinear_backward_db(ops, m->dh, 0.0f, m->lm_head->frozen ? NULL : m->lm_head->grad, m->logits,
                        m->dlogits_twin ? m->dlogits_bf16 : NULL, m->h_final, m->h_final_bf16, m->lm_head, N, D, V);
    ops->rmsnorm_backward(ops->be, m->dx, m->norm_f->grad, m->dh, m->x_final, m->norm_f->data, m->rstd_final, N, D, 0);
    /* term 4: hidden_l2's gradient, dx += 2 W / n_tokens x_final */
    const int l2 = m->loss_hidden_l2;
    if (l2 >= 0 && m->loss[l2].backward && m->norm.n_tokens > 0)
        ops->axpby(ops->be, m->dx, m->x_final, (float)(2.0 * m->loss[l2].weight / m->norm.n_tokens), 1.0f,
                   (size_t)N * (size_t)D);
}

/* the final norm's gain, then the untied lm head (registry order) */
static void head_params(int64_t V, int64_t D, mt_pspec_fn fn, void *user)
{
    struct mt_pspec s = {"model.norm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, -1};
    fn(user, &s);
    s = (struct mt_pspec){"lm_head.weight", -1, 2, V, D, MT_SCALE_NORMAL, MT_ROLE_HEAD, MT_LAYOUT_RESIDUAL,
                          MT_BIND_DW_GEMM};
    fn(user, &s);
}

/* lm_head: V D matmul parameters per token (the norm's gain is not a matmul) */
static double head_mm_per_token(int64_t V, int64_t D) { return (double)V * (double)D; }

const struct mt_head_piece mt_head = {
    /* .name          = */ "head",
    /* .params        = */ head_params,
    /* .mm_per_token  = */ head_mm_per_token,
    /* .loss_register = */ head_loss_register,
    /* .forward       = */ head_forward,
    /* .backward      = */ head_backward,
};
