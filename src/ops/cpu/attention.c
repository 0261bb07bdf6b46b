/*
 * attention.c — causal GQA attention, flash style (no T x T matrix).
 *
 * Layouts: q, out (B,Tq,H,hd); k, v (B,Tk,K,hd); lse (B,H,Tq). Query head h
 * reads kv head h / (H/K); query i sits at position q_pos0 + i and reads keys
 * j <= q_pos0 + i. scale = 1/sqrt(hd).
 *
 * Forward (per task = (b, h, block of BQ queries)), online softmax over key
 * blocks of BK:  S = scale Q K^T;  m' = max(m, rowmax S);  P = exp(S - m');
 *   l = l e^(m-m') + rowsum P;  O = O e^(m-m') + P V;  finally O /= l,
 *   lse = m + log l (natural log).
 * Backward (per task = (b, kv head)): for each key block, for each head of the
 * group and each query block at or after it, recompute P = exp(S - lse), then
 *   D_i = dout_i . out_i;  dP = dO V^T;  dS = scale P (dP - D);
 *   dQ += dS K;  dK += dS^T Q;  dV += P^T dO   (dq, dk, dv overwritten first).
 *
 * Invariant (determinism): each task owns its output rows (forward: out/lse
 * rows of its queries; backward: dk/dv rows of its kv head and dq rows of
 * the heads sharing it) and sums in a fixed block order. Scratch is small
 * fixed-size stack tiles (hd <= MT_ATTN_HD_MAX).
 *
 * The tile products run through mm_acc, a register-blocked tile GEMM:
 * 4 rows x 64 columns in AVX-512 when the CPU has it (chosen at run time,
 * mt_cpu_have_avx512), else 2 x 32 in AVX2/FMA (the x86-64-v3 baseline), with
 * a scalar tail. Both forms give the same bits (same FMA chain per element).
 * Measured (bench/attn_bench.c, config (a)'s shape B=8 T=256 H=4 K=2 hd=64,
 * 2 threads, best of 15, shared machine): forward / backward ms
 *     AVX-512 tiles 2.96 / 5.79   AVX2 tiles 3.55 / 7.48
 *     OpenBLAS cblas_sgemm per tile (single-threaded inside the region) 3.70 / 7.23
 * so the tiles stay on the hand kernel: at 32x64x64 OpenBLAS's packing costs
 * more than its better inner kernel gains.
 */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>
#include "../../core/mt_core.h"

#define BQ 32
#define BK 64
#define MT_ATTN_HD_MAX 256

/* C[r][w] += sum_{t<L} A[r][t] * Bm[t][w],  r < R, w < W.
 * Every path computes each C element as the same FMA chain in t order, so the
 * AVX-512 and AVX2 forms give identical bits (only the blocking differs). */
static void mm_acc_avx2(float *C, size_t ldc, const float *A, size_t lda, const float *Bm, size_t ldb,
                        int R, int L, int W)
{
    int r = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; r + 2 <= R; r += 2) {
        const float *a0 = A + (size_t)r * lda, *a1 = a0 + lda;
        float *c0 = C + (size_t)r * ldc, *c1 = c0 + ldc;
        int w = 0;
        for (; w + 32 <= W; w += 32) {
            __m256 x0 = _mm256_loadu_ps(c0 + w), x1 = _mm256_loadu_ps(c0 + w + 8);
            __m256 x2 = _mm256_loadu_ps(c0 + w + 16), x3 = _mm256_loadu_ps(c0 + w + 24);
            __m256 y0 = _mm256_loadu_ps(c1 + w), y1 = _mm256_loadu_ps(c1 + w + 8);
            __m256 y2 = _mm256_loadu_ps(c1 + w + 16), y3 = _mm256_loadu_ps(c1 + w + 24);
            for (int t = 0; t < L; t++) {
                const float *b = Bm + (size_t)t * ldb + w;
                __m256 s0 = _mm256_broadcast_ss(a0 + t), s1 = _mm256_broadcast_ss(a1 + t);
                __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
                __m256 b2 = _mm256_loadu_ps(b + 16), b3 = _mm256_loadu_ps(b + 24);
                x0 = _mm256_fmadd_ps(s0, b0, x0); y0 = _mm256_fmadd_ps(s1, b0, y0);
                x1 = _mm256_fmadd_ps(s0, b1, x1); y1 = _mm256_fmadd_ps(s1, b1, y1);
                x2 = _mm256_fmadd_ps(s0, b2, x2); y2 = _mm256_fmadd_ps(s1, b2, y2);
                x3 = _mm256_fmadd_ps(s0, b3, x3); y3 = _mm256_fmadd_ps(s1, b3, y3);
            }
            _mm256_storeu_ps(c0 + w, x0); _mm256_storeu_ps(c0 + w + 8, x1);
            _mm256_storeu_ps(c0 + w + 16, x2); _mm256_storeu_ps(c0 + w + 24, x3);
            _mm256_storeu_ps(c1 + w, y0); _mm256_storeu_ps(c1 + w + 8, y1);
            _mm256_storeu_ps(c1 + w + 16, y2); _mm256_storeu_ps(c1 + w + 24, y3);
        }
        for (; w + 8 <= W; w += 8) {
            __m256 x0 = _mm256_loadu_ps(c0 + w), y0 = _mm256_loadu_ps(c1 + w);
            for (int t = 0; t < L; t++) {
                __m256 b0 = _mm256_loadu_ps(Bm + (size_t)t * ldb + w);
                x0 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + t), b0, x0);
                y0 = _mm256_fmadd_ps(_mm256_broadcast_ss(a1 + t), b0, y0);
            }
            _mm256_storeu_ps(c0 + w, x0);
            _mm256_storeu_ps(c1 + w, y0);
        }
        for (; w < W; w++) {
            float s0 = c0[w], s1 = c1[w];
            for (int t = 0; t < L; t++) {
                float b = Bm[(size_t)t * ldb + w];
                s0 += a0[t] * b;
                s1 += a1[t] * b;
            }
            c0[w] = s0;
            c1[w] = s1;
        }
    }
#endif
    for (; r < R; r++) {
        const float *a = A + (size_t)r * lda;
        float *c = C + (size_t)r * ldc;
        for (int t = 0; t < L; t++) {
            const float *b = Bm + (size_t)t * ldb;
            float s = a[t];
            for (int w = 0; w < W; w++) c[w] += s * b[w];
        }
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define MT_ATTN_HAVE_512 1
/* AVX-512 form: 4 rows x 64 columns (16 zmm accumulators; per t 4 broadcasts
 * and 4 loads feed 16 FMAs, twice the AVX2 form's ratio), 4 x 16 for the
 * remaining columns; rows/columns left over go to the AVX2 form. */
__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma,avx2")))
static void mm_acc_avx512(float *C, size_t ldc, const float *A, size_t lda, const float *Bm, size_t ldb,
                          int R, int L, int W)
{
    int r = 0, wdone = 0;
    for (; r + 4 <= R; r += 4) {
        const float *a0 = A + (size_t)r * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        float *c0 = C + (size_t)r * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
        int w = 0;
        for (; w + 64 <= W; w += 64) {
            __m512 x[4][4];
            for (int j = 0; j < 4; j++) {
                x[0][j] = _mm512_loadu_ps(c0 + w + 16 * j);
                x[1][j] = _mm512_loadu_ps(c1 + w + 16 * j);
                x[2][j] = _mm512_loadu_ps(c2 + w + 16 * j);
                x[3][j] = _mm512_loadu_ps(c3 + w + 16 * j);
            }
            for (int t = 0; t < L; t++) {
                const float *b = Bm + (size_t)t * ldb + w;
                __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
                __m512 b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
                __m512 s0 = _mm512_set1_ps(a0[t]), s1 = _mm512_set1_ps(a1[t]);
                __m512 s2 = _mm512_set1_ps(a2[t]), s3 = _mm512_set1_ps(a3[t]);
                x[0][0] = _mm512_fmadd_ps(s0, b0, x[0][0]); x[0][1] = _mm512_fmadd_ps(s0, b1, x[0][1]);
                x[0][2] = _mm512_fmadd_ps(s0, b2, x[0][2]); x[0][3] = _mm512_fmadd_ps(s0, b3, x[0][3]);
                x[1][0] = _mm512_fmadd_ps(s1, b0, x[1][0]); x[1][1] = _mm512_fmadd_ps(s1, b1, x[1][1]);
                x[1][2] = _mm512_fmadd_ps(s1, b2, x[1][2]); x[1][3] = _mm512_fmadd_ps(s1, b3, x[1][3]);
                x[2][0] = _mm512_fmadd_ps(s2, b0, x[2][0]); x[2][1] = _mm512_fmadd_ps(s2, b1, x[2][1]);
                x[2][2] = _mm512_fmadd_ps(s2, b2, x[2][2]); x[2][3] = _mm512_fmadd_ps(s2, b3, x[2][3]);
                x[3][0] = _mm512_fmadd_ps(s3, b0, x[3][0]); x[3][1] = _mm512_fmadd_ps(s3, b1, x[3][1]);
                x[3][2] = _mm512_fmadd_ps(s3, b2, x[3][2]); x[3][3] = _mm512_fmadd_ps(s3, b3, x[3][3]);
            }
            for (int j = 0; j < 4; j++) {
                _mm512_storeu_ps(c0 + w + 16 * j, x[0][j]);
                _mm512_storeu_ps(c1 + w + 16 * j, x[1][j]);
                _mm512_storeu_ps(c2 + w + 16 * j, x[2][j]);
                _mm512_storeu_ps(c3 + w + 16 * j, x[3][j]);
            }
        }
        for (; w + 16 <= W; w += 16) {
            __m512 x0 = _mm512_loadu_ps(c0 + w), x1 = _mm512_loadu_ps(c1 + w);
            __m512 x2 = _mm512_loadu_ps(c2 + w), x3 = _mm512_loadu_ps(c3 + w);
            for (int t = 0; t < L; t++) {
                __m512 b0 = _mm512_loadu_ps(Bm + (size_t)t * ldb + w);
                x0 = _mm512_fmadd_ps(_mm512_set1_ps(a0[t]), b0, x0);
                x1 = _mm512_fmadd_ps(_mm512_set1_ps(a1[t]), b0, x1);
                x2 = _mm512_fmadd_ps(_mm512_set1_ps(a2[t]), b0, x2);
                x3 = _mm512_fmadd_ps(_mm512_set1_ps(a3[t]), b0, x3);
            }
            _mm512_storeu_ps(c0 + w, x0); _mm512_storeu_ps(c1 + w, x1);
            _mm512_storeu_ps(c2 + w, x2); _mm512_storeu_ps(c3 + w, x3);
        }
        wdone = w;
    }
    /* leftovers: columns [wdone, W) of rows [0, r), then all columns of rows [r, R) */
    if (r > 0 && wdone < W) mm_acc_avx2(C + wdone, ldc, A, lda, Bm + wdone, ldb, r, L, W - wdone);
    if (r < R) mm_acc_avx2(C + (size_t)r * ldc, ldc, A + (size_t)r * lda, lda, Bm, ldb, R - r, L, W);
}
#endif

static void mm_acc(float *C, size_t ldc, const float *A, size_t lda, const float *Bm, size_t ldb,
                   int R, int L, int W)
{
#ifdef MT_ATTN_HAVE_512
    if (mt_cpu_have_avx512()) {
        mm_acc_avx512(C, ldc, A, lda, Bm, ldb, R, L, W);
        return;
    }
#endif
    mm_acc_avx2(C, ldc, A, lda, Bm, ldb, R, L, W);
}

/* s[jj] = exp(a s[jj] - m) for jj < nv, 0 for nv <= jj < BK; returns the
 * sum of the row (8 lanes, fixed order). */
static float exp_row(float *s, float m, float a, int nv)
{
#ifdef MT_CPU_HAVE_EXP8
    const __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(a), vnv = _mm256_castsi256_ps(_mm256_set1_epi32(nv));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int jj = 0; jj < BK; jj += 8) {
        __m256 e = mt_cpu_exp8(_mm256_fmsub_ps(va, _mm256_loadu_ps(s + jj), vm));
        __m256i idx = _mm256_add_epi32(iota, _mm256_set1_epi32(jj));
        __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_castps_si256(vnv), idx));
        e = _mm256_and_ps(e, keep);
        _mm256_storeu_ps(s + jj, e);
        acc = _mm256_add_ps(acc, e);
    }
    return mt_cpu_hsum8(acc);
#else
    float sum = 0.0f;
    for (int jj = 0; jj < BK; jj++) {
        float p = jj < nv ? mt_cpu_expf(a * s[jj] - m) : 0.0f;
        s[jj] = p;
        sum += p;
    }
    return sum;
#endif
}

/* dst (hd, BK) = rows src[j*ld + d], j < nk, zero-padded to BK columns. */
static void load_transposed(float *dst, const float *src, size_t ld, int nk, int hd)
{
    for (int jj = 0; jj < nk; jj++) {
        const float *s = src + (size_t)jj * ld;
        for (int d = 0; d < hd; d++) dst[d * BK + jj] = s[d];
    }
    if (nk < BK)
        for (int d = 0; d < hd; d++)
            for (int jj = nk; jj < BK; jj++) dst[d * BK + jj] = 0.0f;
}

void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              int B, int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    MT_ASSERT(hd <= MT_ATTN_HD_MAX && H % K == 0);
    const int    grp   = H / K;
    const int    nqb   = (Tq + BQ - 1) / BQ;
    const size_t qld   = (size_t)H * (size_t)hd, kld = (size_t)K * (size_t)hd;
    const float  scale = 1.0f / sqrtf((float)hd);
    const int    ntask = B * H * nqb;

    #pragma omp parallel for schedule(static, 1)
    for (int task = 0; task < ntask; task++) {
        float Kt[MT_ATTN_HD_MAX * BK];
        float S[BQ * BK];
        float m[BQ], l[BQ];
        int b = task / (H * nqb), h = (task / nqb) % H, qb = task % nqb;
        int kvh = h / grp;
        int i0 = qb * BQ, nq = Tq - i0 < BQ ? Tq - i0 : BQ;
        const float *qr = q + ((size_t)b * (size_t)Tq + (size_t)i0) * qld + (size_t)h * (size_t)hd;
        float       *orow = out + ((size_t)b * (size_t)Tq + (size_t)i0) * qld + (size_t)h * (size_t)hd;
        const float *kb = k + (size_t)b * (size_t)Tk * kld + (size_t)kvh * (size_t)hd;
        const float *vb = v + (size_t)b * (size_t)Tk * kld + (size_t)kvh * (size_t)hd;
        for (int ii = 0; ii < nq; ii++) {
            m[ii] = -INFINITY;
            l[ii] = 0.0f;
            memset(orow + (size_t)ii * qld, 0, (size_t)hd * sizeof(float));
        }
        int kend = q_pos0 + i0 + nq;
        if (kend > Tk) kend = Tk;
        for (int j0 = 0; j0 < kend; j0 += BK) {
            int nk = kend - j0 < BK ? kend - j0 : BK;
            load_transposed(Kt, kb + (size_t)j0 * kld, kld, nk, hd);
            memset(S, 0, sizeof(S));
            mm_acc(S, BK, qr, qld, Kt, BK, nq, hd, BK);
            for (int ii = 0; ii < nq; ii++) {
                float *s = S + ii * BK;
                int nv = q_pos0 + i0 + ii - j0 + 1;   /* keys jj < nv are visible */
                if (nv > nk) nv = nk;
                if (nv <= 0) {
                    memset(s, 0, BK * sizeof(float));
                    continue;
                }
                float mx = m[ii];
                for (int jj = 0; jj < nv; jj++) {
                    s[jj] *= scale;
                    mx = s[jj] > mx ? s[jj] : mx;
                }
                float alpha = mt_cpu_expf(m[ii] - mx);
                float sum = exp_row(s, mx, 1.0f, nv);
                l[ii] = l[ii] * alpha + sum;
                m[ii] = mx;
                if (alpha != 1.0f) {
                    float *o = orow + (size_t)ii * qld;
                    for (int d = 0; d < hd; d++) o[d] *= alpha;
                }
            }
            mm_acc(orow, qld, S, BK, vb + (size_t)j0 * kld, kld, nq, nk, hd);
        }
        for (int ii = 0; ii < nq; ii++) {
            float *o = orow + (size_t)ii * qld;
            float *ls = lse + ((size_t)b * (size_t)H + (size_t)h) * (size_t)Tq + (size_t)(i0 + ii);
            if (l[ii] > 0.0f) {
                float inv = 1.0f / l[ii];
                for (int d = 0; d < hd; d++) o[d] *= inv;
                *ls = m[ii] + logf(l[ii]);
            } else {
                *ls = -INFINITY;
            }
        }
    }
}

void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse,
                               int B, int T, int H, int K, int hd)
{
    MT_ASSERT(hd <= MT_ATTN_HD_MAX && H % K == 0);
    const int    grp   = H / K;
    const size_t qld   = (size_t)H * (size_t)hd, kld = (size_t)K * (size_t)hd;
    const float  scale = 1.0f / sqrtf((float)hd);
    const int    ntask = B * K;

    #pragma omp parallel for schedule(static)
    for (int task = 0; task < ntask; task++) {
        float Kt[MT_ATTN_HD_MAX * BK], Vt[MT_ATTN_HD_MAX * BK];
        float S[BQ * BK], dP[BQ * BK], Pt[BK * BQ], dSt[BK * BQ];
        int b = task / K, kvh = task % K;
        size_t bq = (size_t)b * (size_t)T * qld, bk = (size_t)b * (size_t)T * kld + (size_t)kvh * (size_t)hd;
        for (int t = 0; t < T; t++) {
            memset(dk + bk + (size_t)t * kld, 0, (size_t)hd * sizeof(float));
            memset(dv + bk + (size_t)t * kld, 0, (size_t)hd * sizeof(float));
            for (int g = 0; g < grp; g++)
                memset(dq + bq + (size_t)t * qld + (size_t)(kvh * grp + g) * (size_t)hd, 0,
                       (size_t)hd * sizeof(float));
        }
        for (int j0 = 0; j0 < T; j0 += BK) {
            int nk = T - j0 < BK ? T - j0 : BK;
            const float *kr = k + bk + (size_t)j0 * kld;
            load_transposed(Kt, kr, kld, nk, hd);
            load_transposed(Vt, v + bk + (size_t)j0 * kld, kld, nk, hd);
            float *dkr = dk + bk + (size_t)j0 * kld, *dvr = dv + bk + (size_t)j0 * kld;
            for (int g = 0; g < grp; g++) {
                int h = kvh * grp + g;
                for (int i0 = (j0 / BQ) * BQ; i0 < T; i0 += BQ) {
                    int nq = T - i0 < BQ ? T - i0 : BQ;
                    size_t roff = bq + (size_t)i0 * qld + (size_t)h * (size_t)hd;
                    const float *qr = q + roff, *gr = dout + roff, *orr = out + roff;
                    const float *lr = lse + ((size_t)b * (size_t)H + (size_t)h) * (size_t)T + (size_t)i0;
                    memset(S, 0, sizeof(S));
                    memset(dP, 0, sizeof(dP));
                    mm_acc(S, BK, qr, qld, Kt, BK, nq, hd, BK);
                    mm_acc(dP, BK, gr, qld, Vt, BK, nq, hd, BK);
                    for (int ii = 0; ii < nq; ii++) {
                        const float *gi = gr + (size_t)ii * qld, *oi = orr + (size_t)ii * qld;
                        float D = 0.0f;
                        #pragma omp simd reduction(+:D)
                        for (int d = 0; d < hd; d++) D += gi[d] * oi[d];
                        float L = lr[ii];
                        int nv = i0 + ii - j0 + 1;
                        if (nv > nk) nv = nk;
                        float *s = S + ii * BK, *dp = dP + ii * BK;
                        exp_row(s, L, scale, nv);   /* s = P row */
                        for (int jj = 0; jj < BK; jj++) {
                            float p = s[jj];
                            s[jj] = scale * p * (dp[jj] - D);
                            dp[jj] = p;
                        }
                        for (int jj = 0; jj < BK; jj++) {
                            dSt[jj * BQ + ii] = s[jj];
                            Pt[jj * BQ + ii] = dp[jj];
                        }
                    }
                    mm_acc(dq + roff, qld, S, BK, kr, kld, nq, nk, hd);
                    mm_acc(dkr, kld, dSt, BQ, qr, qld, nk, nq, hd);
                    mm_acc(dvr, kld, Pt, BQ, gr, qld, nk, nq, hd);
                }
            }
        }
    }
}
