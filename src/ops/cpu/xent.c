/*
 * xent.c — fused (optionally softcapped) softmax cross-entropy.
 *
 *   s = c tanh(z / c) if c = softcap > 0, else s = z
 *   forward:  lse_n = log sum_v exp(s_nv);  loss_n = lse_n - s_n[t_n]  (0 if t_n == -1)
 *   backward: dz_nv = dscale (exp(s_nv - lse_n) - [v == t_n]) ds/dz,
 *             ds/dz = 1 - tanh^2(z/c) with softcap, 1 without;  row = 0 if t_n == -1.  (=)
 *
 * Invariant: one thread per row; the backward reads z_v before writing
 * dz_v (and saves z_t first), so dlogits == logits (in place) is safe.
 * Row sums use a fixed 8-lane simd order: deterministic.
 */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

/* s_v = c tanh(z_v / c) (or z_v): one element, scalar tail form */
static inline float capf(float z, float c, float ic)
{
    return c > 0.0f ? c * mt_cpu_tanhf(z * ic) : z;
}

/* log sum_v exp(s_v): max pass, then sum of exp(s - max) in 8 lanes + tail
 * (fixed order: deterministic). */
static float row_lse(const float *z, int V, float c)
{
    float ic = c > 0.0f ? 1.0f / c : 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    int v = 0;
#ifdef MT_CPU_HAVE_EXP8
    __m256 vc = _mm256_set1_ps(c), vic = _mm256_set1_ps(ic);
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    if (c > 0.0f) {
        for (; v + 8 <= V; v += 8)
            vmx = _mm256_max_ps(vmx, _mm256_mul_ps(vc, mt_cpu_tanh8(_mm256_mul_ps(_mm256_loadu_ps(z + v), vic))));
    } else {
        for (; v + 8 <= V; v += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(z + v));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmx);
    for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
#endif
    for (int t = v; t < V; t++) {
        float s = capf(z[t], c, ic);
        mx = s > mx ? s : mx;
    }
    v = 0;
#ifdef MT_CPU_HAVE_EXP8
    __m256 vsum = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    if (c > 0.0f) {
        for (; v + 8 <= V; v += 8) {
            __m256 s = _mm256_mul_ps(vc, mt_cpu_tanh8(_mm256_mul_ps(_mm256_loadu_ps(z + v), vic)));
            vsum = _mm256_add_ps(vsum, mt_cpu_exp8(_mm256_sub_ps(s, vm)));
        }
    } else {
        for (; v + 8 <= V; v += 8)
            vsum = _mm256_add_ps(vsum, mt_cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v), vm)));
    }
    sum = mt_cpu_hsum8(vsum);
#endif
    for (; v < V; v++) sum += mt_cpu_expf(capf(z[v], c, ic) - mx);
    return mx + logf(sum);
}

void mt_cpu_xent_forward(float *losses, float *lse_out, const float *logits, const int32_t *targets,
                         int N, int V, float softcap)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * (size_t)V;
        float lse = row_lse(z, V, softcap);
        lse_out[n] = lse;
        int t = targets[n];
        if (t < 0) {
            losses[n] = 0.0f;
        } else {
            float st = softcap > 0.0f ? softcap * tanhf(z[t] / softcap) : z[t];
            losses[n] = lse - st;
        }
    }
}

void mt_cpu_xent_backward(float *dlogits, const float *logits, const float *lse,
                          const int32_t *targets, float dscale, int N, int V, float softcap)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z  = logits + (size_t)n * (size_t)V;
        float       *dz = dlogits + (size_t)n * (size_t)V;
        int t = targets[n];
        if (t < 0) {
            for (int v = 0; v < V; v++) dz[v] = 0.0f;
            continue;
        }
        float l = lse[n], zt = z[t];
        float ic = softcap > 0.0f ? 1.0f / softcap : 0.0f;
        int v = 0;
#ifdef MT_CPU_HAVE_EXP8
        __m256 vl = _mm256_set1_ps(l), vd = _mm256_set1_ps(dscale);
        if (softcap > 0.0f) {
            __m256 vc = _mm256_set1_ps(softcap), vic = _mm256_set1_ps(ic), one = _mm256_set1_ps(1.0f);
            for (; v + 8 <= V; v += 8) {
                __m256 th = mt_cpu_tanh8(_mm256_mul_ps(_mm256_loadu_ps(z + v), vic));
                __m256 p  = mt_cpu_exp8(_mm256_fmsub_ps(vc, th, vl));
                _mm256_storeu_ps(dz + v, _mm256_mul_ps(_mm256_mul_ps(vd, p), _mm256_fnmadd_ps(th, th, one)));
            }
        } else {
            for (; v + 8 <= V; v += 8)
                _mm256_storeu_ps(dz + v, _mm256_mul_ps(vd, mt_cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v), vl))));
        }
#endif
        for (; v < V; v++) {
            if (softcap > 0.0f) {
                float th = mt_cpu_tanhf(z[v] * ic);
                dz[v] = dscale * mt_cpu_expf(softcap * th - l) * (1.0f - th * th);
            } else {
                dz[v] = dscale * mt_cpu_expf(z[v] - l);
            }
        }
        /* target column: z_t was saved before the row was overwritten */
        if (softcap > 0.0f) {
            float th = tanhf(zt * ic);
            dz[t] = dscale * (expf(softcap * th - l) - 1.0f) * (1.0f - th * th);
        } else {
            dz[t] = dscale * (expf(zt - l) - 1.0f);
        }
    }
}

/*
 * One pass over the logits (the fused classifier): the loss and, in place,
 * the gradient, with one exp (and one tanh) per element instead of the
 * forward's and the backward's two. Per row, in a fixed order:
 *   pass 1: s_v = c tanh(z_v/c) (or z_v), kept in place of z (the row is
 *           consumed), and its max m (8 lanes, then the tail);
 *   pass 2: e_v = exp(s_v - m), sum += e_v (8 lanes + tail, the order of
 *           row_lse), and in place q_v = e_v (1 - (s_v/c)^2) with softcap
 *           (= e_v ds/dz, since ds/dz = 1 - tanh^2), q_v = e_v without;
 *   lse = m + log(sum), loss = lse - s_t (s_t saved after pass 1);
 *   pass 3: dz_v = (dscale / sum) q_v, then the target column
 *           dz_t = dscale (e_t/sum - 1) ds/dz_t.
 * The row stays in L1/L2 (V floats) across the three passes.
 * dlogits_bf16 (may be NULL): then the row's bf16 twin, bf16(dz_v) nearest
 * even, while the row is still in cache (xent_fused_bf16).
 */
static void fused_rows(float *losses, float *lse_out, float *logits, uint16_t *dlogits_bf16, const int32_t *targets,
                       float dscale, int N, int V, float softcap)
{
    const float c = softcap, ic = c > 0.0f ? 1.0f / c : 0.0f;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *z = logits + (size_t)n * (size_t)V;
        int t = targets[n];
        if (t < 0) {
            /* no loss; lse still reported (as the forward does) */
            lse_out[n] = row_lse(z, V, c);
            losses[n] = 0.0f;
            for (int v = 0; v < V; v++) z[v] = 0.0f;
            if (dlogits_bf16) memset(dlogits_bf16 + (size_t)n * (size_t)V, 0, (size_t)V * sizeof(uint16_t));
            continue;
        }
        float mx = -INFINITY;
        int v = 0;
#ifdef MT_CPU_HAVE_EXP8
        __m256 vmx = _mm256_set1_ps(-INFINITY);
        if (c > 0.0f) {
            __m256 vc = _mm256_set1_ps(c), vic = _mm256_set1_ps(ic);
            for (; v + 8 <= V; v += 8) {
                __m256 s = _mm256_mul_ps(vc, mt_cpu_tanh8(_mm256_mul_ps(_mm256_loadu_ps(z + v), vic)));
                _mm256_storeu_ps(z + v, s);
                vmx = _mm256_max_ps(vmx, s);
            }
        } else {
            for (; v + 8 <= V; v += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(z + v));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, vmx);
        for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
#endif
        for (; v < V; v++) {
            z[v] = capf(z[v], c, ic);
            mx = z[v] > mx ? z[v] : mx;
        }
        const float st = z[t];
        float sum = 0.0f;
        v = 0;
#ifdef MT_CPU_HAVE_EXP8
        __m256 vsum = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
        if (c > 0.0f) {
            __m256 vic = _mm256_set1_ps(ic), one = _mm256_set1_ps(1.0f);
            for (; v + 8 <= V; v += 8) {
                __m256 s = _mm256_loadu_ps(z + v), th = _mm256_mul_ps(s, vic);
                __m256 e = mt_cpu_exp8(_mm256_sub_ps(s, vm));
                vsum = _mm256_add_ps(vsum, e);
                _mm256_storeu_ps(z + v, _mm256_mul_ps(e, _mm256_fnmadd_ps(th, th, one)));
            }
        } else {
            for (; v + 8 <= V; v += 8) {
                __m256 e = mt_cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v), vm));
                vsum = _mm256_add_ps(vsum, e);
                _mm256_storeu_ps(z + v, e);
            }
        }
        sum = mt_cpu_hsum8(vsum);
#endif
        for (; v < V; v++) {
            float e = mt_cpu_expf(z[v] - mx);
            sum += e;
            float th = z[v] * ic;
            z[v] = c > 0.0f ? e * (1.0f - th * th) : e;
        }
        const float lse = mx + logf(sum);
        lse_out[n] = lse;
        losses[n] = lse - st;
        const float k = dscale / sum;
        v = 0;
#ifdef MT_CPU_HAVE_EXP8
        __m256 vk = _mm256_set1_ps(k);
        for (; v + 8 <= V; v += 8) _mm256_storeu_ps(z + v, _mm256_mul_ps(vk, _mm256_loadu_ps(z + v)));
#endif
        for (; v < V; v++) z[v] *= k;
        /* target column: p_t - 1 times ds/dz_t; p_t = exp(s_t - lse) as the backward has it */
        float tht = st * ic, dsdz = c > 0.0f ? 1.0f - tht * tht : 1.0f;
        z[t] = dscale * (expf(st - lse) - 1.0f) * dsdz;
        if (dlogits_bf16) {
            uint16_t *zb = dlogits_bf16 + (size_t)n * (size_t)V;
            for (v = 0; v < V; v++) zb[v] = mt_cpu_f32_to_bf16(z[v]);
        }
    }
}

void mt_cpu_xent_fused(float *losses, float *lse_out, float *logits, const int32_t *targets, float dscale,
                       int N, int V, float softcap)
{
    fused_rows(losses, lse_out, logits, NULL, targets, dscale, N, V, softcap);
}

void mt_cpu_xent_fused_bf16(float *losses, float *lse_out, float *logits, uint16_t *dlogits_bf16,
                            const int32_t *targets, float dscale, int N, int V, float softcap)
{
    fused_rows(losses, lse_out, logits, dlogits_bf16, targets, dscale, N, V, softcap);
}

/* xent_fused_bf16_logits (mt_ops.h): XENT_WIDEN_ROWS rows at a time widened
 * into fp32 scratch, then fused_rows on them with the twin written back over
 * those rows of logits_b (read by then): xent_fused_bf16's bits */
#define XENT_WIDEN_ROWS 64
void mt_cpu_xent_fused_bf16_logits(float *losses, float *lse_out, uint16_t *logits_b, const int32_t *targets,
                                   float dscale, int N, int V, float softcap)
{
    if (N <= 0) return;
    const int rows = N < XENT_WIDEN_ROWS ? N : XENT_WIDEN_ROWS;
    float *z = malloc((size_t)rows * (size_t)V * sizeof(float));
    if (!z) {   /* kernels return void (mt_ops.h): a NaN loss stops the run at the finite check */
        for (int n = 0; n < N; n++) losses[n] = lse_out[n] = NAN;
        return;
    }
    for (int r0 = 0; r0 < N; r0 += rows) {
        const int nr = N - r0 < rows ? N - r0 : rows;
        const uint16_t *src = logits_b + (size_t)r0 * (size_t)V;
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < nr; i++)
            for (int v = 0; v < V; v++) z[(size_t)i * V + v] = mt_cpu_bf16_to_f32(src[(size_t)i * V + v]);
        fused_rows(losses + r0, lse_out + r0, z, logits_b + (size_t)r0 * (size_t)V, targets + r0, dscale, nr, V,
                   softcap);
    }
    free(z);
}
