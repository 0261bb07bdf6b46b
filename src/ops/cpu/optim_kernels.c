/*
 * optim_kernels.c — elementwise optimizer updates (AdamW, Muon momentum).
 *
 *   AdamW (PyTorch): m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;   (g: gs * grad, one
 *                    fp32 multiply, gs = 1 exact: the clip's scale, mt_ops.h adamw_multi)
 *                    p *= 1 - lr wd;  p -= lr (m/bc1) / (sqrt(v/bc2) + eps)
 *                    pb (may be NULL) = bf16(p) of the updated p, nearest even
 *                    (mt_cpu_f32_to_bf16: cast_bf16's bits; adamw_multi's shadows)
 *   Muon:            m = mu m + g;  d = g + mu m  (Nesterov), d may alias g.
 *
 * Invariant: elementwise over fixed chunks, each index touched by one thread.
 */
#include "cpu_impl.h"

#include <math.h>

#define CHUNK 4096  /* elements per parallel chunk */

static void adamw_range(float *p, uint16_t *pb, const float *g, float gs, float *m, float *v, size_t lo, size_t hi,
                        float lr, float b1, float b2, float eps, float decay, float bc1, float bc2)
{
    size_t i = lo;
#ifdef MT_CPU_HAVE_EXP8
    const __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
    const __m256 vb1c = _mm256_set1_ps(1.0f - b1), vb2c = _mm256_set1_ps(1.0f - b2);
    const __m256 vbc1 = _mm256_set1_ps(bc1), vbc2 = _mm256_set1_ps(bc2);
    const __m256 vlr = _mm256_set1_ps(lr), veps = _mm256_set1_ps(eps), vdec = _mm256_set1_ps(decay);
    const __m256 vgs = _mm256_set1_ps(gs);
    for (; i + 8 <= hi; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), vgs);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(vb1c, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(vb2c, gi), gi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, vbc2)), veps);
        __m256 upd = _mm256_div_ps(_mm256_mul_ps(vlr, _mm256_div_ps(mi, vbc1)), den);
        _mm256_storeu_ps(p + i, _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), vdec), upd));
    }
#endif
    for (; i < hi; i++) {
        float gi = g[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
    /* the chunk's shadow while its p is still in cache (16 KB) */
    if (pb)
        for (i = lo; i < hi; i++) pb[i] = mt_cpu_f32_to_bf16(p[i]);
}

void mt_cpu_adamw_update_gs(float *p, uint16_t *pb, const float *g, float gs, float *m, float *v, size_t n,
                            float lr, float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    float decay = 1.0f - lr * wd;
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++)
        adamw_range(p, pb, g, gs, m, v, c * CHUNK, (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n,
                    lr, b1, b2, eps, decay, bc1, bc2);
}

void mt_cpu_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                         float lr, float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    mt_cpu_adamw_update_gs(p, NULL, g, 1.0f, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
}

void mt_cpu_muon_momentum(float *d, float *m, const float *g, float mu, size_t n, float gscale)
{
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t i = 0; i < n; i++) {
        /* the clip's product rounded once, then explicit FMAs: the bits do not depend on the
         * compiler's contraction (-ffp-contract), so scale-then-call equals the scale inside */
        const float gi = gscale == 1.0f ? g[i] : gscale * g[i];
        const float mi = fmaf(mu, m[i], gi);
        m[i] = mi;
        d[i] = fmaf(mu, mi, gi);
    }
}
