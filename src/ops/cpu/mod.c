/*
 * mod.c — Mixture-of-Depths routing on the cpu (mt_ops.h mod_route,
 * mod_backward; the model's side is src/model/mod.c).
 *
 * Selection, per sequence of T scores: row t is selected iff fewer than C
 * rows beat it, where t' beats t when r[t'] > r[t], or r[t'] == r[t] and
 * t' < t (ties to the lower position; NaN ranks as -inf). That is "the C
 * largest" with a total order, so it needs no sort and every backend
 * (this O(T^2) count, or the cuda kernel's parallel one) selects the same
 * rows. The aux loss is BCE(sigmoid(r), sel) = sel ? softplus(-r) :
 * softplus(r), summed in double in row order.
 */
#include <math.h>
#include "cpu_impl.h"

/* r with NaN mapped to -inf, so that the order is total */
static inline float mod_key(float r) { return r != r ? -INFINITY : r; }

/* softplus(x) = log(1 + e^x), stable for either sign */
static inline double mod_softplus(double x) { return (x > 0 ? x : 0.0) + log1p(exp(-fabs(x))); }

void mt_cpu_mod_route(int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss, const float *r, int B,
                      int T, int C, float coef)
{
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        const float *rb = r + (size_t)b * T;
        int j = 0;
        for (int t = 0; t < T; t++) {
            const float v = mod_key(rb[t]);
            int beat = 0;
            for (int u = 0; u < T && beat < C; u++) {
                const float w = mod_key(rb[u]);
                beat += w > v || (w == v && u < t);
            }
            const size_t n = (size_t)b * T + t;
            if (beat < C) {
                idx[(size_t)b * C + j] = (int32_t)n;
                tpos[(size_t)b * C + j] = t;
                slot[n] = b * C + j;
                j++;
            } else {
                slot[n] = -1;
            }
            s[n] = 1.0f / (1.0f + expf(-rb[t]));
        }
    }
    if (!loss) return;
    double sum = 0.0;
    for (size_t n = 0; n < (size_t)B * T; n++) sum += mod_softplus(slot[n] >= 0 ? -(double)r[n] : (double)r[n]);
    loss[0] = (double)coef * sum;
}

void mt_cpu_mod_backward(float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot, int N, int D,
                         float aux_scale)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float sn = s[n];
        const int sel = slot[n] >= 0;
        dr[n] = (sel ? dgate[n] * sn * (1.0f - sn) : 0.0f) + aux_scale * (sn - (float)sel);
        if (!sel) continue;
        float *d = dx + (size_t)n * D;
        const float k = 1.0f - sn;
        for (int i = 0; i < D; i++) d[i] *= k;
    }
}
