/*
 * moe_math.h — the MoE row math both backends compute: the router's row
 * forward and backward (mt_ops.h router_forward / router_backward) and the
 * load-balancing term (moe_aux_loss). One definition, included by the cpu
 * twin (src/ops/cpu/moe.c) and the cuda kernels (src/ops/cuda/moe.cu), so the
 * two cannot drift apart (the top-k choice above all: a tie broken another
 * way routes a token elsewhere). Plain C; under nvcc host + device functions.
 */
#ifndef MT_MOE_MATH_H
#define MT_MOE_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

/* One token's router: p = softmax(z) over E experts (the sum in double),
 * lse = logsumexp(z); the top k of p, the lowest index first among equals
 * (a strict > keeps the earlier one), ix in order of choice; the gates
 * renormalised over the chosen: g_j = p[ix_j] / S, S = sum_j p[ix_j]. */
static inline MT_HOST_DEVICE void mt_moe_router_row_forward(float *p, float *lse, int32_t *ix, float *g,
                                                            const float *z, int E, int k)
{
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        float ex = expf(z[e] - mx);
        p[e] = ex;
        sum += ex;
    }
    float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++) p[e] *= inv;
    *lse = mx + (float)log(sum);
    float S = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int m = 0; m < j; m++) taken |= (ix[m] == e);
            if (taken) continue;
            if (best < 0 || p[e] > bv) {
                best = e;
                bv = p[e];
            }
        }
        ix[j] = best;
        S += bv;
    }
    for (int j = 0; j < k; j++) g[j] = p[ix[j]] / S;
}

/* Its backward, into dp (the output row, E wide), from dp's incoming value
 * (dprobs, or 0: the caller fills it), the gates' gradient dg (NULL: none)
 * and the lse's dl:
 *   through g_j = p_ix_j / S:  dp[ix_j] += dg_j / S - (sum_i dg_i g_i) / S
 *   through p = softmax(z):    dz_e = p_e (dp_e - sum_f p_f dp_f) + dl p_e */
static inline MT_HOST_DEVICE void mt_moe_router_row_backward(float *dp, const float *p, const int32_t *ix,
                                                             const float *g, const float *dg, float dl, int E, int k)
{
    if (dg) {
        float S = 0.0f, dgg = 0.0f;
        for (int j = 0; j < k; j++) {
            S += p[ix[j]];
            dgg += dg[j] * g[j];
        }
        for (int j = 0; j < k; j++) dp[ix[j]] += dg[j] / S - dgg / S;
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
    for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pdp) + dl * p[e];
}

/* f[q,e] = float(cnt[q,e] / (T k));   aux = sum_q aux_coef E sum_e f[q,e] psum[q,e] / T
 * cnt = seq[0], psum = seq[1] (2, B, E) double; sequences in order, experts in order. */
static inline MT_HOST_DEVICE double mt_moe_aux_shares(float *f_share, const double *seq, int B, int E, int k, int T,
                                                      float aux_coef)
{
    const double *cnt = seq, *psum = seq + (size_t)B * (size_t)E;
    double aux = 0.0;
    for (int q = 0; q < B; q++) {
        float *f = f_share + (size_t)q * E;
        double acc = 0.0;
        for (int e = 0; e < E; e++) {
            f[e] = (float)(cnt[(size_t)q * E + e] / ((double)T * k));
            acc += (double)f[e] * (psum[(size_t)q * E + e] / (double)T);
        }
        aux += (double)aux_coef * E * acc;
    }
    return aux;
}

#endif /* MT_MOE_MATH_H */
