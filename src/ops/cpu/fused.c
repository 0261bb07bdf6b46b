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
 *   qk_norm_rope_backward  per row: g = R^T dq (written back into dq, as
 *       rope_backward in place), dq_raw = rmsnorm_backward_hd(g) (=) while
 *       the head is in L1; then, after one barrier in the same region,
 *       dwq += sum_rows g * xhat (k likewise).
 *
 * Numerics: every value is computed by the same float operations in the same
 * order as the unfused ops (rmsnorm.c's loops are written the same way; the
 * rotation is cpu_impl.h's mt_cpu_rot_lo/hi, shared with rope.c), so fused ==
 * unfused bit for bit under any contraction setting (test_ops checks it on
 * the cpu backend). In particular dw keeps rmsnorm_backward's 16-column
 * blocks, each summed over rows 0..N-1 in order by one thread (independent
 * of the thread count).
 */
#include "cpu_impl.h"

#include <math.h>

/* The rows of rmsnorm(x) * w with its optional outputs: out (fp32), ob (its
 * bf16 twin, nearest even), resid (the copy of x; may alias inp); each NULL
 * where not wanted. Every rmsnorm forward of the backend is this loop
 * (rmsnorm.c's too), so out and rstd are the same bits whichever outputs are
 * asked for (-O3 unswitches the NULL tests out of the column loop: as fast as
 * the unconditional stores, measured). */
void mt_cpu_rms_rows_forward(float *out, uint16_t *ob, float *rstd, float *resid, const float *inp,
                             const float *weight, int N, int C, float eps)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t row = (size_t)n * (size_t)C;
        const float *x = inp + row;
        float ss = 0.0f;
        #pragma omp simd reduction(+:ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) {
            float v = x[c];      /* read before the writes: resid may alias inp */
            float y = v * r * weight[c];
            if (out) out[row + c] = y;
            if (ob) ob[row + c] = mt_cpu_f32_to_bf16(y);
            if (resid) resid[row + c] = v;
        }
    }
}

void mt_cpu_rmsnorm_resid_forward(float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                  int N, int C, float eps)
{
    mt_cpu_rms_rows_forward(out, NULL, rstd, resid, inp, weight, N, C, eps);
}

/* One head (hd values at x) normed and rotated into o, pair by pair. */
static inline void head_norm_rope(float *restrict o, float *rstd, const float *restrict x, const float *restrict w,
                                  const float *restrict cs, const float *restrict sn, int hd, float eps)
{
    int half = hd / 2;
    float ss = 0.0f;
    #pragma omp simd reduction(+:ss)
    for (int c = 0; c < hd; c++) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    *rstd = r;
    for (int i = 0; i < half; i++) {
        float a = x[i] * r * w[i], b = x[i + half] * r * w[i + half];   /* the normed pair, as rmsnorm.c */
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

/* One head: d (in: the gradient after RoPE; out: g = R^T of it, the
 * gradient of the normed head, as rope_backward in place), dx (=) the
 * gradient of the raw head from g, as rmsnorm_backward. */
static inline void head_rope_norm_bwd(float *restrict dx, float *restrict d, const float *restrict x,
                                      const float *restrict w, float r, const float *restrict cs,
                                      const float *restrict sn, int hd)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = d[i], b = d[i + half];
        d[i]        = mt_cpu_rot_lo(a, b, cs[i], -sn[i]);
        d[i + half] = mt_cpu_rot_hi(a, b, cs[i], -sn[i]);
    }
    float dot = 0.0f;
    #pragma omp simd reduction(+:dot)
    for (int c = 0; c < hd; c++) dot += d[c] * w[c] * x[c];
    float mean = dot * r / (float)hd;   /* mean_c(g*w*xhat) */
    for (int c = 0; c < hd; c++) dx[c] = r * (d[c] * w[c] - x[c] * r * mean);
}

/* dw[c0, c1) += sum over rows 0..rows-1, in order, of g * x * rstd (rmsnorm.c's dw loop) */
static void dw_block(float *dw, const float *g, const float *x, const float *rstd, size_t rows, int hd, int c0,
                     int c1)
{
    enum { CB = 16 };
    float acc[CB] = {0};
    for (size_t n = 0; n < rows; n++) {
        const float *xr = x + n * (size_t)hd;
        const float *gr = g + n * (size_t)hd;
        float r = rstd[n];
        for (int c = c0; c < c1; c++) acc[c - c0] += gr[c] * xr[c] * r;
    }
    for (int c = c0; c < c1; c++) dw[c] += acc[c - c0];
}

void mt_cpu_qk_norm_rope_backward(float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq, float *dk,
                                  const float *q_raw, const float *k_raw, const float *wq, const float *wk,
                                  const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                  const float *sin_tab, int N, int T, int H, int K, int hd)
{
    enum { CB = 16 };
    int half = hd / 2, ncb = (hd + CB - 1) / CB;
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
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
        /* (the barrier above) the column sums read every row's g; q's blocks
         * (N*H rows) and k's (N*K) dealt round-robin so threads get both */
        #pragma omp for schedule(static, 1)
        for (int j = 0; j < 2 * ncb; j++) {
            int cb = j % ncb, c0 = cb * CB, c1 = c0 + CB < hd ? c0 + CB : hd;
            /* a NULL dw: the gain is frozen (LoRA) and has no gradient storage */
            if (j < ncb) { if (dwq) dw_block(dwq, dq, q_raw, rstd_q, (size_t)N * (size_t)H, hd, c0, c1); }
            else if (dwk) dw_block(dwk, dk, k_raw, rstd_k, (size_t)N * (size_t)K, hd, c0, c1);
        }
    }
}
