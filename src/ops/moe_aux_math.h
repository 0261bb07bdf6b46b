/*
 * moe_aux_math.h — the MoE load-balancing term both backends compute
 * (mt_ops.h moe_aux_loss): one definition, included by the cpu twin
 * (src/ops/cpu/moe.c) and the cuda kernel (src/ops/cuda/moe.cu), so the two
 * cannot drift apart. Plain C; under nvcc it is a host + device function.
 *
 *   f[q,e] = float(cnt[q,e] / (T k));   aux = sum_q aux_coef E sum_e f[q,e] psum[q,e] / T
 * cnt = seq[0], psum = seq[1] (2, B, E) double; sequences in order, experts in order.
 */
#ifndef MT_MOE_AUX_MATH_H
#define MT_MOE_AUX_MATH_H

#include <stddef.h>

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

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

#endif /* MT_MOE_AUX_MATH_H */
