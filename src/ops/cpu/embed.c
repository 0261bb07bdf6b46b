/*
 * embed.c — token embedding lookup and its scatter-add backward.
 *
 * Invariant (determinism): the backward gives each thread a fixed set of
 * 16-column blocks of dwte and walks the tokens n = 0..N-1 in order for
 * them, so every dwte element is summed in token order with no races.
 */
#include "cpu_impl.h"

#include <string.h>

/* out (N,C) = wte (V,C) [idx[n]] */
void mt_cpu_embed_forward(float *out, const int32_t *idx, const float *wte, int N, int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * (size_t)C, wte + (size_t)idx[n] * (size_t)C, (size_t)C * sizeof(float));
}

/* dwte[idx[n], :] += dout[n, :]   (+=) */
void mt_cpu_embed_backward(float *dwte, const float *dout, const int32_t *idx, int N, int C, int V)
{
    enum { CB = 16 };
    int ncb = (C + CB - 1) / CB;
    (void)V;
    #pragma omp parallel for schedule(static)
    for (int cb = 0; cb < ncb; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int n = 0; n < N; n++) {
            float       *d = dwte + (size_t)idx[n] * (size_t)C;
            const float *g = dout + (size_t)n * (size_t)C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}
