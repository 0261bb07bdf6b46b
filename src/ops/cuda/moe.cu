/*
 * moe.cu — MoE router (softmax + top-k + renormalised gates) and the
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
 * buffer, src_row (M) maps a sorted row back to its token.
 *
 * Invariant: every thread owns the output elements it writes (the router
 * is one thread per row — E and k are small —, permute/combine one thread
 * per (row, column), combine's dgates one warp per slot) and sums in j or
 * column order: race-free, deterministic, no atomics.
 */
#include "cuda_impl.cuh"

#include <math.h>

#define THREADS 256

static __global__ void router_fwd_k(float *probs, float *lse, int32_t *topk_idx, float *gates,
                                    const float *logits, int N, int E, int k)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *z = logits + (size_t)n * (size_t)E;
    float *p = probs + (size_t)n * (size_t)E;
    int32_t *ix = topk_idx + (size_t)n * (size_t)k;
    float *g = gates + (size_t)n * (size_t)k;
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
    lse[n] = mx + (float)log(sum);
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

static __global__ void router_bwd_k(float *dlogits, const float *dgates, const float *dprobs, const float *dlse,
                                    const float *probs, const int32_t *topk_idx, const float *gates,
                                    int N, int E, int k)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *p = probs + (size_t)n * (size_t)E;
    const int32_t *ix = topk_idx + (size_t)n * (size_t)k;
    const float *g = gates + (size_t)n * (size_t)k;
    float *dp = dlogits + (size_t)n * (size_t)E;  /* dp lives in the output row */
    for (int e = 0; e < E; e++) dp[e] = dprobs ? dprobs[(size_t)n * (size_t)E + e] : 0.0f;
    if (dgates) {
        const float *dg = dgates + (size_t)n * (size_t)k;
        float S = 0.0f, dgg = 0.0f;
        for (int j = 0; j < k; j++) {
            S += p[ix[j]];
            dgg += dg[j] * g[j];
        }
        for (int j = 0; j < k; j++) dp[ix[j]] += dg[j] / S - dgg / S;
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
    float dl = dlse ? dlse[n] : 0.0f;
    for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pdp) + dl * p[e];
}

/* xp[m] = h[src_row[m]]   (=) */
static __global__ void permute_k(float *xp, const float *h, const int32_t *src_row, int M, int C)
{
    size_t total = (size_t)M * (size_t)C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t m = e / (size_t)C, c = e % (size_t)C;
        xp[e] = h[(size_t)src_row[m] * (size_t)C + c];
    }
}

/* dh[n] += sum_j dxp[pos[n*k+j]]   (+=, j order) */
static __global__ void permute_bwd_k(float *dh, const float *dxp, const int32_t *pos, int N, int k, int C)
{
    size_t total = (size_t)N * (size_t)C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t n = e / (size_t)C, c = e % (size_t)C;
        float acc = dh[e];
        for (int j = 0; j < k; j++) acc += dxp[(size_t)pos[n * (size_t)k + (size_t)j] * (size_t)C + c];
        dh[e] = acc;
    }
}

/* out[n] += sum_j gates[n,j] y[pos[n*k+j]]   (+=) */
static __global__ void combine_k(float *out, const float *y, const int32_t *pos, const float *gates,
                                 int N, int k, int C)
{
    size_t total = (size_t)N * (size_t)C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t n = e / (size_t)C, c = e % (size_t)C;
        float acc = out[e];
        for (int j = 0; j < k; j++) {
            size_t s = n * (size_t)k + (size_t)j;
            acc += gates[s] * y[(size_t)pos[s] * (size_t)C + c];
        }
        out[e] = acc;
    }
}

/* dy[pos[s]] = gates[s] dout[n]   (=), s = n*k + j */
static __global__ void combine_bwd_dy_k(float *dy, const float *dout, const int32_t *pos, const float *gates,
                                        int N, int k, int C)
{
    size_t total = (size_t)N * (size_t)k * (size_t)C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t s = e / (size_t)C, c = e % (size_t)C, n = s / (size_t)k;
        dy[(size_t)pos[s] * (size_t)C + c] = gates[s] * dout[n * (size_t)C + c];
    }
}

/* dgates[s] = dout[n] . y[pos[s]]   (=); one warp per slot */
static __global__ void combine_bwd_dg_k(float *dgates, const float *dout, const float *y, const int32_t *pos,
                                        int N, int k, int C)
{
    size_t s = (size_t)blockIdx.x * (blockDim.x / MT_WARP) + threadIdx.x / MT_WARP;
    int lane = threadIdx.x % MT_WARP;
    if (s >= (size_t)N * (size_t)k) return;
    const float *g = dout + (s / (size_t)k) * (size_t)C, *yr = y + (size_t)pos[s] * (size_t)C;
    float acc = 0.0f;
    for (int c = lane; c < C; c += MT_WARP) acc += g[c] * yr[c];
    acc = mt_warp_sum(acc);
    if (lane == 0) dgates[s] = acc;
}

extern "C" void mt_cuda_router_forward(void *be, float *probs, float *lse, int32_t *topk_idx, float *gates,
                                       const float *logits, int N, int E, int k)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    MT_LAUNCH(router_fwd_k, (N + 127) / 128, 128, 0)(probs, lse, topk_idx, gates, logits, N, E, k);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_router_backward(void *be, float *dlogits, const float *dgates, const float *dprobs,
                                        const float *dlse, const float *probs, const int32_t *topk_idx,
                                        const float *gates, int N, int E, int k)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    MT_LAUNCH(router_bwd_k, (N + 127) / 128, 128, 0)(dlogits, dgates, dprobs, dlse, probs, topk_idx, gates, N, E, k);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_permute(void *be, float *xp, const float *h, const int32_t *src_row, int M, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    size_t total = (size_t)M * (size_t)C;
    if (M <= 0 || C <= 0) return;
    MT_LAUNCH(permute_k, mt_cuda_blocks(total, THREADS), THREADS, 0)(xp, h, src_row, M, C);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_permute_backward(void *be, float *dh, const float *dxp, const int32_t *pos, int N, int k, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(permute_bwd_k, mt_cuda_blocks((size_t)N * (size_t)C, THREADS), THREADS, 0)(dh, dxp, pos, N, k, C);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_combine(void *be, float *out, const float *y, const int32_t *pos, const float *gates,
                                    int N, int k, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(combine_k, mt_cuda_blocks((size_t)N * (size_t)C, THREADS), THREADS, 0)(out, y, pos, gates, N, k, C);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_combine_backward(void *be, float *dy, float *dgates, const float *dout, const float *y,
                                             const int32_t *pos, const float *gates, int N, int k, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || k <= 0) return;
    if (C > 0) {
        MT_LAUNCH(combine_bwd_dy_k, mt_cuda_blocks((size_t)N * (size_t)k * (size_t)C, THREADS), THREADS, 0)
            (dy, dout, pos, gates, N, k, C);
        MT_CUDA_KCHECK();
    }
    size_t slots = (size_t)N * (size_t)k;
    MT_LAUNCH(combine_bwd_dg_k, (unsigned)((slots + THREADS / MT_WARP - 1) / (THREADS / MT_WARP)), THREADS, 0)
        (dgates, dout, y, pos, N, k, C);
    MT_CUDA_KCHECK();
}
