/*
 * ssm.c — the Mamba-3 SISO scan (trapezoidal recurrence) on the cpu: the plain
 * recurrence (the reference), the chunked SSD form (GEMM-bound) and its
 * backward by hand. The math and its derivation are in docs/mamba3.md; the
 * contract is the ssm_scan_* entries of src/ops/mt_ops.h.
 *
 * Per sequence b and head h (x_t, y_t in R^P, B_t, C_t in R^N, S in R^{PxN}):
 *   a_t = dt_t A,  alpha_t = exp(a_t),  gamma_t = lam_t dt_t,
 *   beta_t = (1 - lam_t) dt_t alpha_t   (beta_0 = 0: there is no x_{-1})
 *   S_t = alpha_t S_{t-1} + gamma_t x_t B_t^T + beta_t x_{t-1} B_{t-1}^T
 *   y_t = S_t C_t + D x_t
 *
 * Chunked form: the two input terms are one SSD input with 2q sources per
 * chunk of q tokens — source j < q is (x_t, B_t) with weight gamma_t at time
 * t = t0+j, source q+j is (x_{t-1}, B_{t-1}) with weight beta_t at the same
 * time t. With cum_i = sum_{r=t0}^{t0+i} a_r and s(j) the time of source j:
 *   Y    = (C Bc^T o L) Xc + diag(exp cum) C S_in^T                      (intra + inter)
 *   S_out = exp(cum_last) S_in + Xc^T diag(w_j exp(cum_last - cum_s(j))) Bc
 *   L[i,j] = w_j exp(cum_i - cum_s(j)) if s(j) <= i else 0
 * so each chunk is five small GEMMs (through mt_cpu_gemm) and O(q^2) exps.
 *
 * Parallelism: one task per (b, h), chunks in order inside it; per-thread
 * scratch. The GEMMs are called from inside the parallel region: the OpenMP
 * build of OpenBLAS that meshtrain links runs them single-threaded there, so
 * there is no oversubscription (each is a small q x 2q x N product). dA and dD are reduced over b in a fixed order after the parallel
 * loop, so results are bit-identical for a given thread count.
 */
#include "cpu_impl.h"
#include "../../core/mt_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the plain recurrence (fp32 state), the harness's reference ---- */
static void scan_recurrent_head(float *y, const float *x, const float *Bm, const float *Cm,
                                const float *dt, const float *lam, float A, float Dsk,
                                int T, int H, int P, int N, float *S)
{
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N;
    memset(S, 0, (size_t)P * (size_t)N * sizeof(float));
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * xld, *bt = Bm + (size_t)t * bld, *ct = Cm + (size_t)t * bld;
        float d = dt[(size_t)t * (size_t)H], l = lam[(size_t)t * (size_t)H];
        float alpha = expf(d * A), gamma = l * d, beta = t > 0 ? (1.0f - l) * d * alpha : 0.0f;
        const float *xp = t > 0 ? xt - xld : xt, *bp = t > 0 ? bt - bld : bt;
        float *yt = y + (size_t)t * xld;
        for (int p = 0; p < P; p++) {
            float *s = S + (size_t)p * (size_t)N;
            float gx = gamma * xt[p], bx = beta * xp[p], acc = 0.0f;
            for (int n = 0; n < N; n++) {
                s[n] = alpha * s[n] + gx * bt[n] + bx * bp[n];
                acc += s[n] * ct[n];
            }
            yt[p] = acc + Dsk * xt[p];
        }
    }
}

/* ---- chunked (SSD) form ---- */

/* Per-thread scratch of one chunk (Q = chunk size). */
struct ssm_scratch {
    float *Xc, *Bc, *w, *cum, *G, *Ce, *S, *E;    /* forward; E[i,s] = exp(cum_i - cum_s), s <= i */
    float *dM, *dXc, *dBc, *T1, *dwt, *dcum, *DS, *dS;  /* backward */
};

static int scratch_alloc(struct ssm_scratch *s, int Q, int P, int N, int backward)
{
    size_t q2 = 2 * (size_t)Q;
    size_t n = q2 * (size_t)P + q2 * (size_t)N + q2 + (size_t)Q + (size_t)Q * q2 + (size_t)Q * (size_t)(N > P ? N : P)
             + (size_t)P * (size_t)N + (size_t)Q * (size_t)Q;
    if (backward) n += (size_t)Q * q2 + q2 * (size_t)P + q2 * (size_t)N + q2 * (size_t)(N > P ? N : P) + q2 + (size_t)Q
                    + (size_t)Q * (size_t)(N > P ? N : P) + (size_t)P * (size_t)N;
    float *m = malloc(n * sizeof(float));
    if (!m) return 0;
    size_t mx = (size_t)(N > P ? N : P);
    s->Xc = m;            m += q2 * (size_t)P;
    s->Bc = m;            m += q2 * (size_t)N;
    s->w = m;             m += q2;
    s->cum = m;           m += (size_t)Q;
    s->G = m;             m += (size_t)Q * q2;
    s->Ce = m;            m += (size_t)Q * mx;
    s->S = m;             m += (size_t)P * (size_t)N;
    s->E = m;             m += (size_t)Q * (size_t)Q;
    if (backward) {
        s->dM = m;        m += (size_t)Q * q2;
        s->dXc = m;       m += q2 * (size_t)P;
        s->dBc = m;       m += q2 * (size_t)N;
        s->T1 = m;        m += q2 * mx;
        s->dwt = m;       m += q2;
        s->dcum = m;      m += (size_t)Q;
        s->DS = m;        m += (size_t)Q * mx;
        s->dS = m;
    }
    return 1;
}

/* Gather chunk [t0, t0+q) of one head: sources Xc/Bc (2q rows), weights w
 * (gamma_t, then beta_t), and the inclusive cumulative log decay cum. */
static void gather_chunk(struct ssm_scratch *s, const float *x, const float *Bm, const float *dt,
                         const float *lam, float A, int t0, int q, int H, int P, int N)
{
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N;
    float c = 0.0f;
    for (int i = 0; i < q; i++) {
        int t = t0 + i;
        float d = dt[(size_t)t * (size_t)H], l = lam[(size_t)t * (size_t)H], a = d * A;
        c += a;
        s->cum[i] = c;
        s->w[i] = l * d;
        memcpy(s->Xc + (size_t)i * (size_t)P, x + (size_t)t * xld, (size_t)P * sizeof(float));
        memcpy(s->Bc + (size_t)i * (size_t)N, Bm + (size_t)t * bld, (size_t)N * sizeof(float));
        float *xp = s->Xc + (size_t)(q + i) * (size_t)P, *bp = s->Bc + (size_t)(q + i) * (size_t)N;
        if (t > 0) {
            s->w[q + i] = (1.0f - l) * d * expf(a);
            memcpy(xp, x + (size_t)(t - 1) * xld, (size_t)P * sizeof(float));
            memcpy(bp, Bm + (size_t)(t - 1) * bld, (size_t)N * sizeof(float));
        } else {
            s->w[q + i] = 0.0f;
            memset(xp, 0, (size_t)P * sizeof(float));
            memset(bp, 0, (size_t)N * sizeof(float));
        }
    }
}

/* E[i,s] = exp(cum_i - cum_s) for s <= i (row i of q): one exp per pair,
 * shared by the two sources of time s; the argument is <= 0 (no overflow,
 * no cancellation, unlike exp(cum_i) / exp(cum_s) which underflows on long
 * chunks). Vectorised with the backend's exp where the cpu has AVX2. */
static void decay_table(struct ssm_scratch *s, int q)
{
    for (int i = 0; i < q; i++) {
        float *e = s->E + (size_t)i * (size_t)q, ci = s->cum[i];
        int j = 0;
#ifdef MT_CPU_HAVE_EXP8
        __m256 c8 = _mm256_set1_ps(ci);
        for (; j + 8 <= i + 1; j += 8)
            _mm256_storeu_ps(e + j, mt_cpu_exp8(_mm256_sub_ps(c8, _mm256_loadu_ps(s->cum + j))));
#endif
        for (; j <= i; j++) e[j] = mt_cpu_expf(ci - s->cum[j]);
    }
}

/* G (q x 2q) *= L: L[i,j] = w_j E[i,s(j)] for s(j) <= i, else 0. */
static void apply_mask(struct ssm_scratch *s, int q)
{
    for (int i = 0; i < q; i++) {
        float *g = s->G + (size_t)i * 2 * (size_t)q;
        const float *e = s->E + (size_t)i * (size_t)q;
        for (int j = 0; j <= i; j++) {
            g[j] *= s->w[j] * e[j];
            g[q + j] *= s->w[q + j] * e[j];
        }
        for (int j = i + 1; j < q; j++) g[j] = g[q + j] = 0.0f;
    }
}

/* S_out = exp(cum_last) S_in + Xc^T diag(w_j exp(cum_last - cum_s(j))) Bc.
 * Uses T1 (2q x N) as the scaled copy of Bc. */
static void state_update(struct ssm_scratch *s, float *Bw, int q, int P, int N)
{
    float cl = s->cum[q - 1];
    const float *el = s->E + (size_t)(q - 1) * (size_t)q;
    for (int j = 0; j < 2 * q; j++) {
        int sj = j < q ? j : j - q;
        float f = s->w[j] * el[sj];
        const float *b = s->Bc + (size_t)j * (size_t)N;
        float *o = Bw + (size_t)j * (size_t)N;
        for (int n = 0; n < N; n++) o[n] = f * b[n];
    }
    mt_cpu_gemm(1, 0, P, N, 2 * q, 1.0f, s->Xc, P, Bw, N, expf(cl), s->S, N);
}

static void scan_chunked_head(float *y, const float *x, const float *Bm, const float *Cm,
                              const float *dt, const float *lam, float A, float Dsk,
                              int T, int H, int P, int N, int Q, struct ssm_scratch *s, float *Bw)
{
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N;
    memset(s->S, 0, (size_t)P * (size_t)N * sizeof(float));
    for (int t0 = 0; t0 < T; t0 += Q) {
        int q = T - t0 < Q ? T - t0 : Q;
        const float *C = Cm + (size_t)t0 * bld;
        float *Y = y + (size_t)t0 * xld;
        gather_chunk(s, x, Bm, dt, lam, A, t0, q, H, P, N);
        decay_table(s, q);
        /* intra-chunk: G = C Bc^T (q x 2q), masked by L, Y = G Xc */
        mt_cpu_gemm(0, 1, q, 2 * q, N, 1.0f, C, (int)bld, s->Bc, N, 0.0f, s->G, 2 * q);
        apply_mask(s, q);
        mt_cpu_gemm(0, 0, q, P, 2 * q, 1.0f, s->G, 2 * q, s->Xc, P, 0.0f, Y, (int)xld);
        /* inter-chunk: Y += diag(exp cum) C S_in^T */
        if (t0 > 0) {
            for (int i = 0; i < q; i++) {
                float e = expf(s->cum[i]);
                const float *c = C + (size_t)i * bld;
                float *o = s->Ce + (size_t)i * (size_t)N;
                for (int n = 0; n < N; n++) o[n] = e * c[n];
            }
            mt_cpu_gemm(0, 1, q, P, N, 1.0f, s->Ce, N, s->S, N, 1.0f, Y, (int)xld);
        }
        if (t0 + q < T) state_update(s, Bw, q, P, N);
        for (int i = 0; i < q; i++) {
            float *yt = Y + (size_t)i * xld;
            const float *xt = x + (size_t)(t0 + i) * xld;
            for (int p = 0; p < P; p++) yt[p] += Dsk * xt[p];
        }
    }
}

void mt_cpu_ssm_scan_forward(float *y, const float *x, const float *Bm, const float *Cm,
                             const float *dt, const float *lam, const float *A, const float *Dsk,
                             int B, int T, int H, int P, int N, int chunk)
{
    const int ntask = B * H;
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N;
    if (ntask <= 0 || T <= 0) return;
    int Q = chunk > 0 ? (chunk < T ? chunk : T) : 0;
    #pragma omp parallel
    {
        struct ssm_scratch s;
        float *Sr = NULL;
        int ok = Q > 0 ? scratch_alloc(&s, Q, P, N, 0) : (Sr = malloc((size_t)P * (size_t)N * sizeof(float))) != NULL;
        float *Bw = NULL;
        if (ok && Q > 0) ok = (Bw = malloc(2 * (size_t)Q * (size_t)N * sizeof(float))) != NULL;
        MT_ASSERT(ok);  /* a few KB per thread; failure here is out of memory before the step */
        #pragma omp for schedule(static)
        for (int task = 0; task < ntask; task++) {
            int b = task / H, h = task % H;
            size_t ox = (size_t)b * (size_t)T * xld + (size_t)h * (size_t)P;
            size_t ob = (size_t)b * (size_t)T * bld + (size_t)h * (size_t)N;
            size_t od = (size_t)b * (size_t)T * (size_t)H + (size_t)h;
            if (Q > 0)
                scan_chunked_head(y + ox, x + ox, Bm + ob, Cm + ob, dt + od, lam + od, A[h], Dsk[h],
                                  T, H, P, N, Q, &s, Bw);
            else
                scan_recurrent_head(y + ox, x + ox, Bm + ob, Cm + ob, dt + od, lam + od, A[h], Dsk[h],
                                    T, H, P, N, Sr);
        }
        if (Q > 0) free(s.Xc);
        free(Sr);
        free(Bw);
    }
}

/* Backward of one head (derivation: docs/mamba3.md §4). Sall holds the state
 * entering each chunk (recomputed here, nc x P x N). dx, dBm are zeroed for
 * this head first and then accumulated (the beta sources of chunk c feed the
 * last token of chunk c-1); dCm is overwritten per chunk.
 *
 * Why one long function (~135 lines, over the ~120 guideline): each chunk's
 * step in reverse is one pass over shared state — the chunk's gathered
 * tables in s (Bc, Xc, w, E, cum), the carried dS, and the per-chunk
 * gradients dwt/dcum that the intra, through-S_out and inter parts all add
 * into before the scatter and the scalar pass read them. Split into
 * functions, each part would take a dozen of these as arguments with no
 * boundary a reader gains from; and the order of the float accumulations
 * is part of the result (the Mamba-3 references in tests/test_mamba3.c and
 * the bit checks compare it). The parts are labelled in order instead:
 * 1. states entering each chunk; 2. chunks in reverse: intra, through
 * S_out, inter, scatter of the sources, scalars. */
static void scan_backward_head(float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                               float *dA, float *dD, const float *dy, const float *x,
                               const float *Bm, const float *Cm, const float *dt, const float *lam,
                               float A, float Dsk, int T, int H, int P, int N, int Q,
                               struct ssm_scratch *s, float *Sall)
{
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N, PN = (size_t)P * (size_t)N;
    const int nc = (T + Q - 1) / Q;
    /* 1. states entering each chunk */
    memset(s->S, 0, PN * sizeof(float));
    for (int c = 0; c < nc; c++) {
        int t0 = c * Q, q = T - t0 < Q ? T - t0 : Q;
        memcpy(Sall + (size_t)c * PN, s->S, PN * sizeof(float));
        if (c + 1 < nc) {
            gather_chunk(s, x, Bm, dt, lam, A, t0, q, H, P, N);
            decay_table(s, q);
            state_update(s, s->T1, q, P, N);
        }
    }
    for (int t = 0; t < T; t++) {
        memset(dx + (size_t)t * xld, 0, (size_t)P * sizeof(float));
        memset(dBm + (size_t)t * bld, 0, (size_t)N * sizeof(float));
    }
    memset(s->dS, 0, PN * sizeof(float));
    double dA_acc = 0.0, dD_acc = 0.0;
    /* 2. chunks in reverse, carrying dS = dLoss/dS_out */
    for (int c = nc - 1; c >= 0; c--) {
        int t0 = c * Q, q = T - t0 < Q ? T - t0 : Q, q2 = 2 * q;
        const float *C = Cm + (size_t)t0 * bld, *dY = dy + (size_t)t0 * xld, *Sin = Sall + (size_t)c * PN;
        float *dC = dCm + (size_t)t0 * bld;
        gather_chunk(s, x, Bm, dt, lam, A, t0, q, H, P, N);
        decay_table(s, q);
        const float *Eq = s->E + (size_t)(q - 1) * (size_t)q;
        float cl = s->cum[q - 1], el = expf(cl);
        for (int j = 0; j < q2; j++) s->dwt[j] = 0.0f;
        for (int i = 0; i < q; i++) s->dcum[i] = 0.0f;
        /* intra: G = C Bc^T, M = G o L; dM = dY Xc^T; dXc = M^T dY */
        mt_cpu_gemm(0, 1, q, q2, N, 1.0f, C, (int)bld, s->Bc, N, 0.0f, s->G, q2);
        mt_cpu_gemm(0, 1, q, q2, P, 1.0f, dY, (int)xld, s->Xc, P, 0.0f, s->dM, q2);
        for (int i = 0; i < q; i++) {
            float *g = s->G + (size_t)i * q2, *dm = s->dM + (size_t)i * q2;
            const float *e = s->E + (size_t)i * (size_t)q;
            float dci = 0.0f;
            for (int j = 0; j < q2; j++) {
                int sj = j < q ? j : j - q;
                if (sj > i) { g[j] = 0.0f; dm[j] = 0.0f; continue; }
                float ex = e[sj];
                float dmg = dm[j] * g[j];             /* dLoss/dL[i,j] */
                float mm = dmg * s->w[j] * ex;        /* dM o M: the log-decay gradient */
                s->dwt[j] += dmg * ex;
                dci += mm;
                s->dcum[sj] -= mm;
                float l = s->w[j] * ex;
                g[j] *= l;                            /* G -> M */
                dm[j] *= l;                           /* dM -> dG */
            }
            s->dcum[i] += dci;
        }
        mt_cpu_gemm(1, 0, q2, P, q, 1.0f, s->G, q2, dY, (int)xld, 0.0f, s->dXc, P);
        /* dC = dG Bc; dBc = dG^T C */
        mt_cpu_gemm(0, 0, q, N, q2, 1.0f, s->dM, q2, s->Bc, N, 0.0f, dC, (int)bld);
        mt_cpu_gemm(1, 0, q2, N, q, 1.0f, s->dM, q2, C, (int)bld, 0.0f, s->dBc, N);
        /* through S_out = el S_in + Xc^T diag(v) Bc, v_j = w_j exp(cl - cum_s(j)) */
        if (c + 1 < nc) {
            mt_cpu_gemm(0, 0, q2, N, P, 1.0f, s->Xc, P, s->dS, N, 0.0f, s->T1, N);   /* Xc dS */
            for (int j = 0; j < q2; j++) {
                int sj = j < q ? j : j - q;
                float ex = Eq[sj], v = s->w[j] * ex;
                const float *t1 = s->T1 + (size_t)j * (size_t)N, *b = s->Bc + (size_t)j * (size_t)N;
                float *db = s->dBc + (size_t)j * (size_t)N;
                float qj = 0.0f;
                for (int n = 0; n < N; n++) { qj += t1[n] * b[n]; db[n] += v * t1[n]; }
                s->dwt[j] += qj * ex;
                s->dcum[q - 1] += qj * v;
                s->dcum[sj] -= qj * v;
            }
            mt_cpu_gemm(0, 1, q2, P, N, 1.0f, s->Bc, N, s->dS, N, 0.0f, s->T1, P);   /* Bc dS^T */
            for (int j = 0; j < q2; j++) {
                int sj = j < q ? j : j - q;
                float v = s->w[j] * Eq[sj];
                const float *t2 = s->T1 + (size_t)j * (size_t)P;
                float *d = s->dXc + (size_t)j * (size_t)P;
                for (int p = 0; p < P; p++) d[p] += v * t2[p];
            }
        }
        /* inter: Y += diag(e) C S_in^T (only c > 0 has a nonzero S_in) */
        if (c > 0) {
            double dsin = 0.0;
            for (size_t k = 0; k < PN; k++) dsin += (double)s->dS[k] * (double)Sin[k];
            s->dcum[q - 1] += (float)dsin * el;
            mt_cpu_gemm(0, 0, q, N, P, 1.0f, dY, (int)xld, Sin, N, 0.0f, s->DS, N);   /* dY S_in */
            for (int i = 0; i < q; i++) {
                float e = expf(s->cum[i]), de = 0.0f;
                const float *ds = s->DS + (size_t)i * (size_t)N, *ci = C + (size_t)i * bld;
                float *dci = dC + (size_t)i * bld;
                for (int n = 0; n < N; n++) { de += ds[n] * ci[n]; dci[n] += e * ds[n]; }
                s->dcum[i] += de * e;
                const float *dyi = dY + (size_t)i * xld;
                float *o = s->Ce + (size_t)i * (size_t)P;
                for (int p = 0; p < P; p++) o[p] = e * dyi[p];
            }
            /* dS_in = el dS_out + (diag(e) dY)^T C */
            mt_cpu_gemm(1, 0, P, N, q, 1.0f, s->Ce, P, C, (int)bld, el, s->dS, N);
        }
        /* scatter the sources: own tokens and the token before each */
        for (int i = 0; i < q; i++) {
            int t = t0 + i;
            float *dxt = dx + (size_t)t * xld, *dbt = dBm + (size_t)t * bld;
            const float *dyt = dy + (size_t)t * xld, *xt = x + (size_t)t * xld;
            const float *a1 = s->dXc + (size_t)i * (size_t)P, *b1 = s->dBc + (size_t)i * (size_t)N;
            float dd = 0.0f;
            for (int p = 0; p < P; p++) { dxt[p] += a1[p] + Dsk * dyt[p]; dd += dyt[p] * xt[p]; }
            for (int n = 0; n < N; n++) dbt[n] += b1[n];
            dD_acc += dd;
            if (t > 0) {
                const float *a2 = s->dXc + (size_t)(q + i) * (size_t)P, *b2 = s->dBc + (size_t)(q + i) * (size_t)N;
                float *dxp = dxt - xld, *dbp = dbt - bld;
                for (int p = 0; p < P; p++) dxp[p] += a2[p];
                for (int n = 0; n < N; n++) dbp[n] += b2[n];
            }
        }
        /* scalars: da_t = sum_{i >= t} dcum_i; then a, gamma, beta -> dt, lam, A */
        float run = 0.0f;
        for (int i = q - 1; i >= 0; i--) {
            int t = t0 + i;
            run += s->dcum[i];
            float d = dt[(size_t)t * (size_t)H], l = lam[(size_t)t * (size_t)H];
            float alpha = expf(d * A), dg = s->dwt[i], db = t > 0 ? s->dwt[q + i] : 0.0f;
            float beta = (1.0f - l) * d * alpha;
            ddt[(size_t)t * (size_t)H] = run * A + dg * l + db * (1.0f - l) * alpha * (1.0f + d * A);
            dlam[(size_t)t * (size_t)H] = dg * d - db * d * alpha;
            dA_acc += (double)run * d + (double)db * beta * d;
        }
    }
    *dA = (float)dA_acc;
    *dD = (float)dD_acc;
}

void mt_cpu_ssm_scan_backward(float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                              float *dA, float *dD, const float *dy, const float *x,
                              const float *Bm, const float *Cm, const float *dt, const float *lam,
                              const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                              int chunk)
{
    const int ntask = B * H;
    const size_t xld = (size_t)H * (size_t)P, bld = (size_t)H * (size_t)N;
    if (ntask <= 0 || T <= 0) return;
    int Q = chunk > 0 ? chunk : 64;
    if (Q > T) Q = T;
    const int nc = (T + Q - 1) / Q;
    float *part = malloc(2 * (size_t)ntask * sizeof(float));
    MT_ASSERT(part);
    #pragma omp parallel
    {
        struct ssm_scratch s;
        int ok = scratch_alloc(&s, Q, P, N, 1);
        float *Sall = ok ? malloc((size_t)nc * (size_t)P * (size_t)N * sizeof(float)) : NULL;
        MT_ASSERT(ok && Sall);
        #pragma omp for schedule(static)
        for (int task = 0; task < ntask; task++) {
            int b = task / H, h = task % H;
            size_t ox = (size_t)b * (size_t)T * xld + (size_t)h * (size_t)P;
            size_t ob = (size_t)b * (size_t)T * bld + (size_t)h * (size_t)N;
            size_t od = (size_t)b * (size_t)T * (size_t)H + (size_t)h;
            scan_backward_head(dx + ox, dBm + ob, dCm + ob, ddt + od, dlam + od, &part[2 * task],
                               &part[2 * task + 1], dy + ox, x + ox, Bm + ob, Cm + ob, dt + od,
                               lam + od, A[h], Dsk[h], T, H, P, N, Q, &s, Sall);
        }
        free(s.Xc);
        free(Sall);
    }
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++) {
            dA[h] += part[2 * (b * H + h)];
            dD[h] += part[2 * (b * H + h) + 1];
        }
    free(part);
}

/* One decoding step: the recurrence's update for every (b, h), the same
 * operation order as scan_recurrent_head (so T steps equal chunk 0 bit for bit). */
void mt_cpu_ssm_scan_step(float *y, float *S, float *xprev, float *Bprev, const float *x,
                          const float *Bm, const float *Cm, const float *dt, const float *lam,
                          const float *A, const float *Dsk, int B, int H, int P, int N, int first)
{
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int h = bh % H;
        const float *xt = x + (size_t)bh * P, *bt = Bm + (size_t)bh * N, *ct = Cm + (size_t)bh * N;
        float *s = S + (size_t)bh * P * N, *xp = xprev + (size_t)bh * P, *bp = Bprev + (size_t)bh * N;
        float *yt = y + (size_t)bh * P;
        float d = dt[bh], l = lam[bh], alpha = expf(d * A[h]), gamma = l * d;
        float beta = first ? 0.0f : (1.0f - l) * d * alpha;
        if (first) memset(s, 0, (size_t)P * N * sizeof(float));
        for (int p = 0; p < P; p++) {
            float *sr = s + (size_t)p * N;
            float gx = gamma * xt[p], bx = beta * (first ? xt[p] : xp[p]), acc = 0.0f;
            const float *bb = first ? bt : bp;
            for (int n = 0; n < N; n++) {
                sr[n] = alpha * sr[n] + gx * bt[n] + bx * bb[n];
                acc += sr[n] * ct[n];
            }
            yt[p] = acc + Dsk[h] * xt[p];
        }
        memcpy(xp, xt, (size_t)P * sizeof(float));
        memcpy(bp, bt, (size_t)N * sizeof(float));
    }
}
