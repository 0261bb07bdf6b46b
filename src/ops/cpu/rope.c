/*
 * rope.c — rotary position embedding, rotate-half form, in place allowed.
 *
 *   x viewed as (N, nh, hd), row n at position p = pos0 + n % T, i < hd/2:
 *   forward   out_i = x_i c - x_{i+h} s,   out_{i+h} = x_{i+h} c + x_i s
 *   backward  (R^T) dx_i = g_i c + g_{i+h} s,  dx_{i+h} = g_{i+h} c - g_i s   (=)
 *   with c = cos_tab[p, i], s = sin_tab[p, i], h = hd/2.
 *
 * Invariant: each pair (i, i+h) is read fully before it is written, so
 * out == inp is safe.
 */
#include "cpu_impl.h"

static void rope_apply(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                       int N, int T, int pos0, int nh, int hd, float sign)
{
    int half = hd / 2;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int p = pos0 + n % T;
        const float *cs = cos_tab + (size_t)p * (size_t)half;
        const float *sn = sin_tab + (size_t)p * (size_t)half;
        for (int h = 0; h < nh; h++) {
            size_t off = ((size_t)n * (size_t)nh + (size_t)h) * (size_t)hd;
            const float *x = inp + off;
            float       *o = out + off;
            for (int i = 0; i < half; i++) {
                float a = x[i], b = x[i + half];
                float c = cs[i], s = sign * sn[i];
                o[i]        = mt_cpu_rot_lo(a, b, c, s);
                o[i + half] = mt_cpu_rot_hi(a, b, c, s);
            }
        }
    }
}

void mt_cpu_rope_forward(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                         int N, int T, int pos0, int nh, int hd)
{
    rope_apply(out, inp, cos_tab, sin_tab, N, T, pos0, nh, hd, 1.0f);
}

void mt_cpu_rope_backward(float *dinp, const float *dout, const float *cos_tab, const float *sin_tab,
                          int N, int T, int pos0, int nh, int hd)
{
    rope_apply(dinp, dout, cos_tab, sin_tab, N, T, pos0, nh, hd, -1.0f);
}
