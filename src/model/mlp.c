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

void mlp_forward(const struct mt_ops_i *ops, float *out, int accumulate, float *g, float *u, float *act,
                 const float *h, const float *wg, const float *wu, const float *wd, int n, int D, int F)
{
    if (n <= 0) return;
    linear_forward(ops, g, h, wg, n, D, F, 0.0f);
    linear_forward(ops, u, h, wu, n, D, F, 0.0f);
    ops->swiglu_forward(act, g, u, (size_t)n * F);
    linear_forward(ops, out, act, wd, n, F, D, accumulate ? 1.0f : 0.0f);
}

void mlp_backward(const struct mt_ops_i *ops, float *dh, int accumulate, float *dwg, float *dwu, float *dwd,
                  float *act, float *dact, float *dg, float *du,
                  const float *dout, const float *h, const float *g, const float *u,
                  const float *wg, const float *wu, const float *wd, int n, int D, int F)
{
    if (n <= 0) return;
    ops->swiglu_forward(act, g, u, (size_t)n * F);
    linear_backward(ops, dact, 0.0f, dwd, dout, act, wd, n, F, D);
    ops->swiglu_backward(dg, du, dact, g, u, (size_t)n * F);
    linear_backward(ops, dh, accumulate ? 1.0f : 0.0f, dwg, dg, h, wg, n, D, F);
    linear_backward(ops, dh, 1.0f, dwu, du, h, wu, n, D, F);
}
