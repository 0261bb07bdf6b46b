/*
 * lora.c — a projection with its low-rank adapter, the one place the LoRA
 * math lives (docs/lora.md). Every targeted projection of every piece goes
 * through proj_fwd / proj_bwd; a projection without adapters is
 * exactly linear_forward / linear_backward (same GEMMs, same bits).
 *
 * Math, rows x (n, in), W (out, in), A (r, in), B (out, r), s = alpha / r:
 *     t = x A^T (n, r);   y = x W^T + s t B^T
 * Backward (t recomputed: n x in x r multiply-adds, cheaper than saving it):
 *     term 1: dB += s dy^T t
 *     term 2: dt  = s dy B (n, r);  dA += dt^T x
 *     term 3: dx  = dy W + dt A    (dW += dy^T x only when W is not frozen)
 *
 * Under TP the local boxes make the same formulas right (mt_blocks.c gives
 * the layout classes): column-parallel W (rows split) has A whole and B's
 * rows split, so t is whole and y's local columns come out; dA is partial
 * over the model group (reduced there). Row-parallel W (columns split) has
 * A's columns split, so t is partial, and s t B^T joins the partial o/down
 * output the TP exit already reduces; dB (s dy^T t) is partial over the
 * model group, dA's columns complete.
 *
 * Gradient rule: dA, dB += (parameter grads); dx as linear_backward
 * (= or += by beta_dx, then += the adapter path); s_lora, s_dlora scratch.
 */
#include "model_impl.h"

/*
 * One A shared by nb base matrices W_b (rows_b, in) stacked into one
 * projection (the Mamba-3 in-projection's seven row blocks, docs/lora.md):
 * B_b (rows_b, r) are the row blocks of the stacked B. y_b are column slices
 * of y (n, ldy), in block order. With nb = 1 this is the plain adapter.
 *     t = x A^T (once);  y_b += s t B_b^T
 * Backward (t recomputed):
 *     dB_b += s dy_b^T t;  dt = s sum_b dy_b B_b;  dA += dt^T x;  dx += dt A
 */
void lora_fwd_add(const struct mt_ops_i *ops, float *t, float *y, int ldy, const float *x,
                  const struct mt_param *const *w, const int *rows, int nb, int n, int in)
{
    if (n <= 0 || !w[0]->lora_a) return;
    const struct mt_param *A = w[0]->lora_a;
    const int r = (int)A->len[0];
    linear_forward(ops, t, x, A->data, n, in, r, 0.0f);                                  /* t = x A^T      */
    for (int b = 0, off = 0; b < nb; off += rows[b], b++)
        if (rows[b] > 0)
            ops->gemm(ops->be, 0, 1, n, rows[b], r, w[b]->lora_scale, t, r, w[b]->lora_b->data, r, 1.0f, y + off, ldy);
}

void lora_bwd_add(const struct mt_ops_i *ops, float *t, float *dt, float *dx, const float *dy, int ldy, const float *x,
                  struct mt_param *const *w, const int *rows, int nb, int n, int in)
{
    if (n <= 0 || !w[0]->lora_a) return;
    struct mt_param *A = w[0]->lora_a;
    const int r = (int)A->len[0];
    linear_forward(ops, t, x, A->data, n, in, r, 0.0f);                                  /* t = x A^T      */
    for (int b = 0, off = 0, first = 1; b < nb; off += rows[b], b++) {
        if (rows[b] <= 0) continue;
        struct mt_param *B = w[b]->lora_b;
        const float s = w[b]->lora_scale;
        ops->gemm(ops->be, 1, 0, rows[b], r, n, s, dy + off, ldy, t, r, 1.0f, B->grad, r);         /* term 1         */
        ops->gemm(ops->be, 0, 0, n, r, rows[b], s, dy + off, ldy, B->data, r, first ? 0.0f : 1.0f, dt, r);   /* dt */
        first = 0;
    }
    ops->gemm(ops->be, 1, 0, r, in, n, 1.0f, dt, r, x, in, 1.0f, A->grad, in);                    /* term 2: dA     */
    if (dx) ops->gemm(ops->be, 0, 0, n, in, r, 1.0f, dt, r, A->data, in, 1.0f, dx, in);           /* term 3         */
}

void proj_fwd_b(const struct mt_ops_i *ops, float *t, float *y, const float *x, const mt_bf16 *xb,
                const struct mt_param *w, int n, int in, int out, float beta)
{
    wlinear_forward(ops, y, x, xb, w, n, in, out, beta);
    lora_fwd_add(ops, t, y, out, x, &w, &out, 1, n, in);   /* the adapters stay fp32: x */
}

void proj_fwd_resid(const struct mt_ops_i *ops, float *t, float *y, const float *r, const float *x, const mt_bf16 *xb,
                    const struct mt_param *w, int n, int in, int out)
{
    wlinear_forward_resid(ops, y, r, x, xb, w, n, in, out);
    lora_fwd_add(ops, t, y, out, x, &w, &out, 1, n, in);   /* the adapters stay fp32: x */
}

void proj_bwd_b(const struct mt_ops_i *ops, float *t, float *dt, float *dx, float beta_dx, struct mt_param *w,
                const float *dy, const float *x, const mt_bf16 *xb, int n, int in, int out, struct mt_dyb *dyb)
{
    float *dw = w->frozen ? NULL : w->grad;
    /* two GEMMs read dy: round it once (struct mt_dyb) */
    const mt_bf16 *db = w->bf16 && dw && dx && n > 0 ? dyb_round(ops, dyb, dy, (size_t)n * (size_t)out) : NULL;
    wlinear_backward_db(ops, dx, beta_dx, dw, dy, db, x, xb, w, n, in, out);
    lora_bwd_add(ops, t, dt, dx, dy, out, x, &w, &out, 1, n, in);
}

void proj_fwd(const struct mt_ops_i *ops, float *t, float *y, const float *x, const struct mt_param *w, int n, int in,
              int out, float beta)
{
    proj_fwd_b(ops, t, y, x, NULL, w, n, in, out, beta);
}

void proj_bwd(const struct mt_ops_i *ops, float *t, float *dt, float *dx, float beta_dx, struct mt_param *w,
              const float *dy, const float *x, int n, int in, int out)
{
    proj_bwd_b(ops, t, dt, dx, beta_dx, w, dy, x, NULL, n, in, out, NULL);
}
