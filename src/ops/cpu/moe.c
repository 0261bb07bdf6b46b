/*
 * moe.c — MoE router (softmax + top-k + renormalised gates) and the
 * dropless permute / combine between token order and expert-sorted order.
 *
 * Router, per row n (E experts, k chosen):
 *   p = softmax(z), lse = log sum exp z;
 *   top-k: k rounds of argmax over p, first maximum wins (strict >), chosen excluded;
 *   S = sum_j p[idx_j], g_j = p[idx_j] / S.
 * Router backward (dlogits =):
 *   dp_e = dprobs_e (or 0);  dp[idx_j] += dg_j / S - sum_m dg_m g_m / S;
 *   dz_e = p_e (dp_e - sum_e' p_e' dp_e') + dlse p_e.
 * Permute/combine: pos (N*k) maps slot (n, j) to its row in the sorted
 * buffer, src_row (M) maps a sorted row back to its token. A slot with
 * pos < 0 is a null one (zero-computation expert, SPEC 1e): skipped, dgate 0.
 *
 * Device routing (mt_ops.h "MoE device routing"): the stable counting sort,
 * the aux loss's per-sequence statistics, the aux/z sums and gradients —
 * the host code model/moe.c ran before, loop for loop (sequential double
 * sums in row order: the same bits).
 *
 * Invariant: every loop is parallel over the index that owns its output
 * rows (pos is a permutation), sums run in j order: race-free, deterministic.
 */
#include "cpu_impl.h"
#include "../moe_math.h"

#include <math.h>
#include <string.h>

void mt_cpu_router_forward(float *probs, float *lse, int32_t *topk_idx, float *gates,
                           const float *logits, int N, int E, int k)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        mt_moe_router_row_forward(probs + (size_t)n * (size_t)E, lse + n, topk_idx + (size_t)n * (size_t)k,
                                  gates + (size_t)n * (size_t)k, logits + (size_t)n * (size_t)E, E, k);
}

void mt_cpu_router_backward(float *dlogits, const float *dgates, const float *dprobs,
                            const float *dlse, const float *probs, const int32_t *topk_idx,
                            const float *gates, int N, int E, int k)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *dp = dlogits + (size_t)n * (size_t)E;  /* dp lives in the output row */
        if (dprobs) memcpy(dp, dprobs + (size_t)n * (size_t)E, (size_t)E * sizeof(float));
        else        memset(dp, 0, (size_t)E * sizeof(float));
        mt_moe_router_row_backward(dp, probs + (size_t)n * (size_t)E, topk_idx + (size_t)n * (size_t)k,
                                   gates + (size_t)n * (size_t)k, dgates ? dgates + (size_t)n * (size_t)k : NULL,
                                   dlse ? dlse[n] : 0.0f, E, k);
    }
}

/* xp[m] = h[src_row[m]]   (=) */
void mt_cpu_moe_permute(float *xp, const float *h, const int32_t *src_row, int M, int C)
{
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        memcpy(xp + (size_t)m * (size_t)C, h + (size_t)src_row[m] * (size_t)C, (size_t)C * sizeof(float));
}

/* xb[m] = bf16(h[src_row[m]])   (=, nearest even: moe_permute then cast_bf16) */
void mt_cpu_moe_permute_bf16(uint16_t *xb, const float *h, const int32_t *src_row, int M, int C)
{
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const float *s = h + (size_t)src_row[m] * (size_t)C;
        uint16_t *d = xb + (size_t)m * (size_t)C;
        for (int c = 0; c < C; c++) d[c] = mt_cpu_f32_to_bf16(s[c]);
    }
}

/* dh[n] += sum_j dxp[pos[n*k+j]]   (+=, j order; accumulate 0: dh[n] = 0.0f + ..., no read) */
void mt_cpu_moe_permute_backward(float *dh, const float *dxp, const int32_t *pos, int N, int k, int C, int accumulate)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dh + (size_t)n * (size_t)C;
        if (!accumulate)
            for (int c = 0; c < C; c++) d[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[(size_t)n * (size_t)k + (size_t)j];
            if (r < 0) continue;   /* a null slot: no row */
            const float *s = dxp + (size_t)r * (size_t)C;
            for (int c = 0; c < C; c++) d[c] += s[c];
        }
    }
}

/* out[n] += sum_j gates[n,j] y[pos[n*k+j]]   (+=) */
void mt_cpu_moe_combine(float *out, const float *y, const int32_t *pos, const float *gates,
                        int N, int k, int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * (size_t)C;
        for (int j = 0; j < k; j++) {
            size_t s = (size_t)n * (size_t)k + (size_t)j;
            if (pos[s] < 0) continue;   /* a null slot contributes 0 */
            const float *yr = y + (size_t)pos[s] * (size_t)C;
            float gj = gates[s];
            for (int c = 0; c < C; c++) o[c] += gj * yr[c];
        }
    }
}

/* dy[pos[n*k+j]] = gates[n,j] dout[n];  dgates[n,j] = dout[n] . y[pos[n*k+j]]   (both =);
 * dy fp32 (dyf) or bf16 (dyb, each value rounded once: moe_combine_backward_bf16) */
static void combine_backward(float *dyf, uint16_t *dyb, float *dgates, const float *dout, const float *y,
                             const int32_t *pos, const float *gates, int N, int k, int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = dout + (size_t)n * (size_t)C;
        for (int j = 0; j < k; j++) {
            size_t s = (size_t)n * (size_t)k + (size_t)j;
            if (pos[s] < 0) {   /* a null slot: no row, no gate gradient through its (zero) output */
                dgates[s] = 0.0f;
                continue;
            }
            size_t r = (size_t)pos[s] * (size_t)C;
            const float *yr = y + r;
            float gj = gates[s], dot = 0.0f;
            #pragma omp simd reduction(+:dot)
            for (int c = 0; c < C; c++) dot += g[c] * yr[c];
            if (dyb)
                for (int c = 0; c < C; c++) dyb[r + c] = mt_cpu_f32_to_bf16(gj * g[c]);
            else
                for (int c = 0; c < C; c++) dyf[r + c] = gj * g[c];
            dgates[s] = dot;
        }
    }
}

void mt_cpu_moe_combine_backward(float *dy, float *dgates, const float *dout, const float *y,
                                 const int32_t *pos, const float *gates, int N, int k, int C)
{
    combine_backward(dy, NULL, dgates, dout, y, pos, gates, N, k, C);
}

/* ---- MoE device routing (mt_ops.h): the host code of model/moe.c as it was,
 * sequential where it sums in double (row order: its bits) ---- */

/* stable counting sort of the N*k slots by expert; work[e]: expert e's next row.
 * Experts E - n_null.. are null: counted, sorted last, but pos = -1, no src_row. */
void mt_cpu_moe_route(int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work, const int32_t *topk_idx, int N,
                      int k, int E, int n_null)
{
    const int Er = E - n_null;   /* the real experts */
    const size_t M = (size_t)N * (size_t)k;
    for (int e = 0; e <= E; e++) e_off[e] = 0;
    for (size_t s = 0; s < M; s++) e_off[topk_idx[s] + 1]++;
    for (int e = 0; e < E; e++) e_off[e + 1] += e_off[e];
    if (M == 0) return;
    for (int e = 0; e < E; e++) work[e] = e_off[e];
    for (size_t s = 0; s < M; s++) {
        int32_t r = work[topk_idx[s]]++;
        if (topk_idx[s] >= Er) {
            pos[s] = -1;
            continue;
        }
        pos[s] = r;
        src_row[r] = (int32_t)(s / (size_t)k);
    }
}

void mt_cpu_moe_seq_stats(double *seq, const float *probs, const int32_t *topk_idx, int N, int E, int k, int B, int T,
                          int g0)
{
    double *cnt = seq, *psum = seq + (size_t)B * (size_t)E;
    memset(seq, 0, (size_t)2 * (size_t)B * (size_t)E * sizeof(double));
    for (int i = 0; i < N; i++) {
        int q = (g0 + i) / T;
        if (q >= B) break;   /* cannot happen: the model's rows are the microbatch's */
        for (int j = 0; j < k; j++) cnt[(size_t)q * E + topk_idx[(size_t)i * k + j]] += 1.0;
        for (int e = 0; e < E; e++) psum[(size_t)q * E + e] += (double)probs[(size_t)i * E + e];
    }
}

void mt_cpu_moe_aux_loss(double *loss, float *f_share, const double *seq, const float *lse, int N, int B, int E, int k,
                         int T, float aux_coef, float z_coef, int count_aux)
{
    const double aux = mt_moe_aux_shares(f_share, seq, B, E, k, T, aux_coef);
    double z = 0.0;
    for (int i = 0; i < N; i++) z += (double)lse[i] * (double)lse[i];
    loss[0] = count_aux ? aux : 0.0;
    loss[1] = (double)z_coef * z;
}

void mt_cpu_moe_aux_backward(float *dprobs, float *dlse, const float *f_share, const float *lse, int N, int E, int T,
                             int g0, float aux_coef, float z_coef, double n_seq, double n_tok)
{
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *f = f_share + (size_t)((g0 + i) / T) * (size_t)E;
        for (int e = 0; e < E; e++)
            dprobs[(size_t)i * E + e] = (float)((double)aux_coef * E * (double)f[e] / (double)T / n_seq);
        dlse[i] = (float)(2.0 * (double)z_coef * (double)lse[i] / n_tok);
    }
}

void mt_cpu_moe_combine_backward_bf16(uint16_t *dyb, float *dgates, const float *dout, const float *y,
                                      const int32_t *pos, const float *gates, int N, int k, int C)
{
    combine_backward(NULL, dyb, dgates, dout, y, pos, gates, N, k, C);
}
