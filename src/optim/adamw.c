/*
 * adamw.c — AdamW (SPEC.md 1b), the fallback class: it accepts every
 * parameter, so every parameter no other class takes is AdamW.
 *
 * Per element, t = the update's number from 1, lr = cfg->lr x schedule:
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p *= 1 - lr wd;  p -= lr (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps)
 * States: exp_avg (m), exp_avg_sq (v), PyTorch's names.
 */
#include "mt_optim.h"

#include <math.h>

static enum mt_status adamw_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                  const struct mt_param *p)
{
    (void)cfg, (void)p;
    /* the update needs this kernel; report, never fall back */
    if (!ops->adamw_update)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks an AdamW kernel (axpby/sumsq/adamw_update)",
                            ops->name);
    return MT_OK;
}

/* The list goes to adamw_multi in one call (one launch on cuda; n <=
 * MT_OPS_LIST_MAX); the updates are independent of each other and of other
 * classes', so the order in which they run changes no bit.
 *
 * precision=bf16: the same pass writes each matrix's bf16 shadow (pa->bf16)
 * = bf16(p after the update), the bits the model's refresh (cast_bf16 of
 * the fp32 weight at the next forward) would write, and sets pa->bf16_ok:
 * the refresh's second read of p (4 bytes a parameter) and its launches are
 * gone for them. Every parameter this step updates is its WHOLE tensor on
 * this rank (ZeRO owns parameters whole, a TP box is the tensor the shadow
 * mirrors), so its shadow is complete; mt_zero_set_bf16_mark_fresh hands the
 * flag to the model (docs/cuda.md "bf16 mixed precision", Shadows). Without
 * adamw_multi: no shadow, the refresh writes it. */
static enum mt_status adamw_step(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *const *slots,
                                 int n)
{
    (void)ctx;
    const struct mt_ops_i *ops = run->ops;
    const struct mt_config *cfg = run->cfg;
    const float lr = (float)(cfg->lr * run->lr_factor);
    const double b1 = cfg->adam_beta1, b2 = cfg->adam_beta2;
    const float bc1 = (float)(1.0 - pow(b1, (double)run->t));
    const float bc2 = (float)(1.0 - pow(b2, (double)run->t));
    float       *p[MT_OPS_LIST_MAX], *m[MT_OPS_LIST_MAX], *v[MT_OPS_LIST_MAX];
    mt_bf16     *pb[MT_OPS_LIST_MAX];
    const float *g[MT_OPS_LIST_MAX];
    size_t       nel[MT_OPS_LIST_MAX];
    float        wd[MT_OPS_LIST_MAX];
    for (int i = 0; i < n; i++) {
        const struct mt_param *pa = slots[i]->p;
        wd[i] = pa->decay ? cfg->weight_decay : 0.0f;
        if (!ops->adamw_multi) {   /* the clip's scale in place first (what optim.c does for other classes) */
            if (run->gscale != 1.0f) ops->axpby(ops->be, pa->grad, NULL, 0.0f, run->gscale, pa->numel);
            ops->adamw_update(ops->be, pa->data, pa->grad, slots[i]->s[0], slots[i]->s[1], pa->numel, lr,
                              cfg->adam_beta1, cfg->adam_beta2, cfg->adam_eps, wd[i], bc1, bc2);
            continue;
        }
        p[i] = pa->data;
        pb[i] = pa->bf16;
        g[i] = pa->grad;
        m[i] = slots[i]->s[0];
        v[i] = slots[i]->s[1];
        nel[i] = pa->numel;
    }
    if (ops->adamw_multi && n > 0) {
        ops->adamw_multi(ops->be, p, pb, g, m, v, nel, wd, n, lr, cfg->adam_beta1, cfg->adam_beta2, cfg->adam_eps, bc1,
                         bc2, run->gscale);
        for (int i = 0; i < n; i++) slots[i]->p->bf16_ok = pb[i] != NULL;
    }
    return MT_OK;
}

const struct mt_optim_i mt_optim_adamw = {
    .name = "adamw",
    .n_states = 2,
    .state_names = {"exp_avg", "exp_avg_sq"},
    .roles = ~0u,
    .matrices_only = 0,
    .whole_matrix = 0,
    .pass_bytes = 28.0,   /* reads p, g, m, v; writes p, m, v: 7 floats */
    .shadow_bytes = 2.0,  /* adamw_multi writes the bf16 shadow in its pass */
    .takes_gscale = 1,    /* the clip's scale inside adamw_multi (adamw_step) */
    .flops = NULL,
    .ws_sizes = NULL,
    .check = adamw_check,
    .init = NULL,
    .step = adamw_step,
};
