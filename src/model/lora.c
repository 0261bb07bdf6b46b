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

void proj_fwd(const struct mt_ops_i *ops, float *t, float *y, const float *x, const struct mt_param *w, int n, int in,
              int out, float beta)
{
    wlinear_forward(ops, y, x, NULL, w, n, in, out, beta);
    if (!w->lora_a || n <= 0) return;
    const struct mt_param *A = w->lora_a, *B = w->lora_b;
    const int r = (int)A->len[0];
    linear_forward(ops, t, x, A->data, n, in, r, 0.0f);                            /* t = x A^T      */
    ops->gemm(0, 1, n, out, r, w->lora_scale, t, r, B->data, r, 1.0f, y, out);     /* y += s t B^T   */
}

void proj_bwd(const struct mt_ops_i *ops, float *t, float *dt, float *dx, float beta_dx, struct mt_param *w,
              const float *dy, const float *x, int n, int in, int out)
{
    wlinear_backward(ops, dx, beta_dx, w->frozen ? NULL : w->grad, dy, x, NULL, w, n, in, out);
    if (!w->lora_a || n <= 0) return;
    struct mt_param *A = w->lora_a, *B = w->lora_b;
    const int r = (int)A->len[0];
    const float s = w->lora_scale;
    linear_forward(ops, t, x, A->data, n, in, r, 0.0f);                            /* t = x A^T      */
    ops->gemm(1, 0, out, r, n, s, dy, out, t, r, 1.0f, B->grad, r);                /* term 1         */
    ops->gemm(0, 0, n, r, out, s, dy, out, B->data, r, 0.0f, dt, r);               /* term 2: dt     */
    ops->gemm(1, 0, r, in, n, 1.0f, dt, r, x, in, 1.0f, A->grad, in);              /*         dA     */
    if (dx) ops->gemm(0, 0, n, in, r, 1.0f, dt, r, A->data, in, 1.0f, dx, in);     /* term 3         */
}
