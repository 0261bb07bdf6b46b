/*
 * rmsnorm.c — RMSNorm forward/backward (also QK-norm: rows N*H, C = hd).
 *
 *   forward:  rstd = 1 / sqrt(mean_c(x^2) + eps),  out = x * rstd * w
 *   backward: xhat = x * rstd
 *     term 1  dw += sum_n dout * xhat                                   (+=)
 *     term 2  dx  = rstd * (dout*w - xhat * mean_c(dout * w * xhat))   (= or +=)
 *
 * Invariant (determinism): dx rows are owned by one thread; dw is split in
 * 16-column blocks, each summed over n = 0..N-1 in order by one thread.
 */
#include "cpu_impl.h"
#include "../../core/mt_core.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps)
{
    /* the one row loop (fused.c), so every forward entry computes the same bits */
    mt_cpu_rms_rows_forward(out, NULL, rstd, NULL, inp, weight, N, C, eps);
}

void mt_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C, int accumulate)
{
    mt_cpu_rmsnorm_backward_b(dinp, dweight, dout, NULL, inp, weight, rstd, N, C, accumulate);
}

/* dout_b: NULL, or dout as bf16 (mt_ops.h rmsnorm_backward_bf16): a row is widened
 * (exact) into the thread's row buffer before the fp32 row's loops, and the dw
 * blocks widen their 16 columns: the bits of dout = widen(dout_b) */
void mt_cpu_rmsnorm_backward_b(float *dinp, float *dweight, const float *dout, const uint16_t *dout_b,
                               const float *inp, const float *weight, const float *rstd, int N, int C,
                               int accumulate)
{
    enum { CB = 16 };
    int ncb = (C + CB - 1) / CB;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    float *rows = dout_b ? malloc((size_t)nt * (size_t)C * sizeof(float)) : NULL;   /* a row a thread */
    MT_ASSERT(!dout_b || rows);
    #pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *row = rows ? rows + (size_t)tid * (size_t)C : NULL;
        #pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            const float *x  = inp + (size_t)n * (size_t)C;
            const float *g  = dout_b ? row : dout + (size_t)n * (size_t)C;
            float       *dx = dinp + (size_t)n * (size_t)C;
            if (dout_b)
                for (int c = 0; c < C; c++) row[c] = mt_cpu_bf16_to_f32(dout_b[(size_t)n * (size_t)C + (size_t)c]);
            float r = rstd[n];
            float dot = 0.0f;
            #pragma omp simd reduction(+:dot)
            for (int c = 0; c < C; c++) dot += g[c] * weight[c] * x[c];
            float mean = dot * r / (float)C;   /* mean_c(dout*w*xhat) */
            if (accumulate) {
                for (int c = 0; c < C; c++) dx[c] += r * (g[c] * weight[c] - x[c] * r * mean);
            } else {
                for (int c = 0; c < C; c++) dx[c] = r * (g[c] * weight[c] - x[c] * r * mean);
            }
        }
        /* dweight NULL: a frozen gain (LoRA base) has no gradient buffer; dx alone */
        #pragma omp for schedule(static)
        for (int cb = 0; cb < (dweight ? ncb : 0); cb++) {
            int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
            float acc[CB] = {0};
            for (int n = 0; n < N; n++) {
                const size_t o = (size_t)n * (size_t)C;
                const float *x = inp + o;
                float r = rstd[n];
                if (dout_b)
                    for (int c = c0; c < c1; c++) acc[c - c0] += mt_cpu_bf16_to_f32(dout_b[o + (size_t)c]) * x[c] * r;
                else
                    for (int c = c0; c < c1; c++) acc[c - c0] += dout[o + (size_t)c] * x[c] * r;
            }
            for (int c = c0; c < c1; c++) dweight[c] += acc[c - c0];
        }
    }
    free(rows);
}
