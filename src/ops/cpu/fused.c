/*
 * fused.c — fused elementwise chains of the block (issue 18 item 3): each is
 * one pass over its rows in ONE OpenMP parallel region, instead of one region
 * (fork/join, barrier spin) and one memory pass per op.
 *
 *   rmsnorm_resid_forward  out = rmsnorm(x) * w, rstd;  resid = x
 *       The residual stream's seed and the norm of the same rows in one read
 *       of x: resid is the buffer the branch's output GEMM then adds onto
 *       (beta 1), so the residual add of the NEXT sum happens inside the GEMM
 *       and its input norm shares this pass. Backward of the pair:
 *       d x = d resid + rmsnorm_backward(d out): rmsnorm_backward with
 *       accumulate 1 onto the residual gradient (one region already).
 *   qk_norm_rope_forward   q = rope(rmsnorm_hd(q_raw) * wq), k likewise
 *       Per row n: its H query heads and K key heads are normed and rotated
 *       while the head (hd floats) is in registers/L1.
 *   qk_norm_rope_backward  per row: g = R^T dq, dq_raw = rmsnorm_backward_hd(g)
 *       (=); and in the same region (no barrier: both read only inputs)
 *       dwq += sum_rows g * xhat with g recomputed (k likewise).
 *
 * Numerics: every value is computed by the same float operations in the same
 * order as the unfused ops (rmsnorm.c's loops are written the same way; the
 * rotation is cpu_impl.h's mt_cpu_rot_lo/hi, shared with rope.c), so fused ==
 * unfused bit for bit under any contraction setting (test_ops checks it on
 * the cpu backend). In particular dw keeps rmsnorm_backward's 16-column blocks, each
 * summed over rows 0..N-1 in order by one thread (thread-count independent).
 */
#include "cpu_impl.h"

#include <math.h>

void mt_cpu_rmsnorm_resid_forward(float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                  int N, int C, float eps)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * (size_t)C;
        float       *o = out + (size_t)n * (size_t)C;
        float       *s = resid + (size_t)n * (size_t)C;
        float ss = 0.0f;
        #pragma omp simd reduction(+:ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) {
            float v = x[c];      /* read before the writes: resid may alias inp */
            o[c] = v * r * weight[c];
            s[c] = v;
        }
    }
}

/* One head (hd values at x) normed into o, then rotated in place; the
 * rotation reads each pair (i, i+half) of o before writing it. */
static inline void head_norm_rope(float *o, float *rstd, const float *x, const float *w, const float *cs,
                                  const float *sn, int hd, float eps)
{
    int half = hd / 2;
    float ss = 0.0f;
    #pragma omp simd reduction(+:ss)
    for (int c = 0; c < hd; c++) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    *rstd = r;
    for (int c = 0; c < hd; c++) o[c] = x[c] * r * w[c];
    for (int i = 0; i < half; i++) {
        float a = o[i], b = o[i + half];
        o[i]        = mt_cpu_rot_lo(a, b, cs[i], sn[i]);
        o[i + half] = mt_cpu_rot_hi(a, b, cs[i], sn[i]);
    }
}

void mt_cpu_qk_norm_rope_forward(float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                 const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                 const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps)
{
    int half = hd / 2;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int p = pos0 + n % T;
        const float *cs = cos_tab + (size_t)p * (size_t)half;
        const float *sn = sin_tab + (size_t)p * (size_t)half;
        for (int h = 0; h < H; h++) {
            size_t row = (size_t)n * (size_t)H + (size_t)h;
            head_norm_rope(q + row * (size_t)hd, rstd_q + row, q_raw + row * (size_t)hd, wq, cs, sn, hd, eps);
        }
        for (int h = 0; h < K; h++) {
            size_t row = (size_t)n * (size_t)K + (size_t)h;
            head_norm_rope(k + row * (size_t)hd, rstd_k + row, k_raw + row * (size_t)hd, wk, cs, sn, hd, eps);
        }
    }
}

/* element c of g = R^T d for one head (backward rotation: s -> -s) */
static inline float rot_back(const float *d, const float *cs, const float *sn, int half, int c)
{
    if (c < half) return mt_cpu_rot_lo(d[c], d[c + half], cs[c], -sn[c]);
    int i = c - half;
    return mt_cpu_rot_hi(d[i], d[c], cs[i], -sn[i]);
}

/* One head: dx (=) the gradient of the raw head from d (the gradient after
 * RoPE). g = R^T d is staged in dx, then turned into dx in place. */
static inline void head_rope_norm_bwd(float *dx, const float *d, const float *x, const float *w, float r,
                                      const float *cs, const float *sn, int hd)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        dx[i]        = mt_cpu_rot_lo(d[i], d[i + half], cs[i], -sn[i]);
        dx[i + half] = mt_cpu_rot_hi(d[i], d[i + half], cs[i], -sn[i]);
    }
    float dot = 0.0f;
    #pragma omp simd reduction(+:dot)
    for (int c = 0; c < hd; c++) dot += dx[c] * w[c] * x[c];
    float mean = dot * r / (float)hd;   /* mean_c(g*w*xhat) */
    for (int c = 0; c < hd; c++) dx[c] = r * (dx[c] * w[c] - x[c] * r * mean);
}

/* dw[c0, c1) += sum over rows (n, h) in order of g * x * rstd, g = R^T d
 * recomputed per element (the same bits as in the row pass) */
static void dw_block(float *dw, const float *d, const float *x, const float *rstd, const float *cos_tab,
                     const float *sin_tab, int N, int T, int nh, int hd, int c0, int c1)
{
    enum { CB = 16 };
    int half = hd / 2;
    float acc[CB] = {0};
    for (int n = 0; n < N; n++) {
        int p = n % T;
        const float *cs = cos_tab + (size_t)p * (size_t)half;
        const float *sn = sin_tab + (size_t)p * (size_t)half;
        for (int h = 0; h < nh; h++) {
            size_t row = (size_t)n * (size_t)nh + (size_t)h;
            const float *dr = d + row * (size_t)hd, *xr = x + row * (size_t)hd;
            float r = rstd[row];
            for (int c = c0; c < c1; c++) acc[c - c0] += rot_back(dr, cs, sn, half, c) * xr[c] * r;
        }
    }
    for (int c = c0; c < c1; c++) dw[c] += acc[c - c0];
}

void mt_cpu_qk_norm_rope_backward(float *dq_raw, float *dk_raw, float *dwq, float *dwk, const float *dq,
                                  const float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                  const float *wk, const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                  const float *sin_tab, int N, int T, int H, int K, int hd)
{
    enum { CB = 16 };
    int half = hd / 2, ncb = (hd + CB - 1) / CB;
    #pragma omp parallel
    {
        /* rows and column sums read only inputs: no barrier between them */
        #pragma omp for schedule(static) nowait
        for (int n = 0; n < N; n++) {
            int p = n % T;
            const float *cs = cos_tab + (size_t)p * (size_t)half;
            const float *sn = sin_tab + (size_t)p * (size_t)half;
            for (int h = 0; h < H; h++) {
                size_t row = (size_t)n * (size_t)H + (size_t)h, off = row * (size_t)hd;
                head_rope_norm_bwd(dq_raw + off, dq + off, q_raw + off, wq, rstd_q[row], cs, sn, hd);
            }
            for (int h = 0; h < K; h++) {
                size_t row = (size_t)n * (size_t)K + (size_t)h, off = row * (size_t)hd;
                head_rope_norm_bwd(dk_raw + off, dk + off, k_raw + off, wk, rstd_k[row], cs, sn, hd);
            }
        }
        #pragma omp for schedule(static)
        for (int j = 0; j < 2 * ncb; j++) {
            int cb = j % ncb, c0 = cb * CB, c1 = c0 + CB < hd ? c0 + CB : hd;
            if (j < ncb) dw_block(dwq, dq, q_raw, rstd_q, cos_tab, sin_tab, N, T, H, hd, c0, c1);
            else         dw_block(dwk, dk, k_raw, rstd_k, cos_tab, sin_tab, N, T, K, hd, c0, c1);
        }
    }
}
