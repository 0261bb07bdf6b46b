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
 * buffer, src_row (M) maps a sorted row back to its token. A slot with
 * pos < 0 is a null one (zero-computation expert, SPEC 1e): skipped, dgate 0.
 *
 * Device routing (docs/cuda.md "MoE on the device"): the stable counting
 * sort of the slots by expert (per (chunk, expert) counts, a one-block
 * scan, per (chunk, expert) placement in slot order), the per-sequence
 * statistics of the aux loss, the aux/z sums and their gradients.
 *
 * Invariant: every thread owns the output elements it writes (the router
 * is one thread per row — E and k are small —, permute/combine one block
 * per row and one thread per column (or 4), combine's dgates one warp per
 * slot, the routing one thread per (chunk, expert)) and sums in j, column
 * or a fixed tree order:
 * race-free, deterministic, no atomics.
 */
#include "cuda_impl.cuh"
#include "../moe_math.h"

#include <math.h>

#define THREADS 256

/* one thread per token: the router's row math, moe_math.h (the cpu twin's) */
static __global__ void router_fwd_k(float *probs, float *lse, int32_t *topk_idx, float *gates,
                                    const float *logits, int N, int E, int k)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    mt_moe_router_row_forward(probs + (size_t)n * (size_t)E, lse + n, topk_idx + (size_t)n * (size_t)k,
                              gates + (size_t)n * (size_t)k, logits + (size_t)n * (size_t)E, E, k);
}

static __global__ void router_bwd_k(float *dlogits, const float *dgates, const float *dprobs, const float *dlse,
                                    const float *probs, const int32_t *topk_idx, const float *gates,
                                    int N, int E, int k)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float *dp = dlogits + (size_t)n * (size_t)E;  /* dp lives in the output row */
    for (int e = 0; e < E; e++) dp[e] = dprobs ? dprobs[(size_t)n * (size_t)E + e] : 0.0f;
    mt_moe_router_row_backward(dp, probs + (size_t)n * (size_t)E, topk_idx + (size_t)n * (size_t)k,
                               gates + (size_t)n * (size_t)k, dgates ? dgates + (size_t)n * (size_t)k : NULL,
                               dlse ? dlse[n] : 0.0f, E, k);
}

/* The row kernels below: one block per row of the output (blockIdx.x, up
 * to 2^31 - 1 rows), its threads over the columns; the 16-byte form (V4 =
 * 1: C % 4 == 0 and every base 16-byte aligned, checked on the host) moves
 * 4 columns a thread, with each element's expression the scalar form's (the
 * same bits). No per-element division (the grid-stride form divided a
 * 64-bit index by C for every element). */

/* xp[m] = h[src_row[m]]   (=); MODE = V4 + 2 OB, OB: xp is bf16, each value rounded once (permute_bf16)
 * (one template argument: a kernel's name in the launch log and the profile has no comma) */
template <int MODE>
static __global__ void permute_k(void *xp, const float *h, const int32_t *src_row, int C)
{
    constexpr int V4 = MODE & 1, OB = MODE >> 1;
    const size_t m = blockIdx.x;
    const float *src = h + (size_t)src_row[m] * (size_t)C;
    if constexpr (V4) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            const float4 v = mt_ld_f4(src + c);
            if constexpr (OB) mt_st_bf16x4((__nv_bfloat16 *)xp + m * (size_t)C + c, v);
            else mt_st_f4((float *)xp + m * (size_t)C + c, v);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            if constexpr (OB) ((__nv_bfloat16 *)xp)[m * (size_t)C + c] = mt_cuda_bf16_rn(src[c]);
            else ((float *)xp)[m * (size_t)C + c] = src[c];
        }
    }
}

/* out[n] += sum_j w_nj src[pos[n*k+j]]   (+=, j order; a null slot, pos < 0, adds 0):
 * permute_backward (MODE = V4: w = 1, a plain add) and combine (MODE = V4 + 2:
 * w = gates) */
template <int MODE>
static __global__ void gather_add_k(float *out, const float *src, const int32_t *pos, const float *gates, int k, int C,
                                    int accumulate)
{
    constexpr int V4 = MODE & 1, W = MODE >> 1;
    const size_t n = blockIdx.x;
    const int32_t *pn = pos + n * (size_t)k;
    const float *gn = W ? gates + n * (size_t)k : NULL;
    float *o = out + n * (size_t)C;
    if constexpr (V4) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            float4 acc = accumulate ? mt_ld_f4(o + c) : float4{0.0f, 0.0f, 0.0f, 0.0f};
            for (int j = 0; j < k; j++) {
                if (pn[j] < 0) continue;
                const float4 v = mt_ld_f4(src + (size_t)pn[j] * (size_t)C + c);
                if constexpr (W) {
                    const float g = gn[j];
                    acc.x += g * v.x, acc.y += g * v.y, acc.z += g * v.z, acc.w += g * v.w;
                } else {
                    acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
                }
            }
            mt_st_f4(o + c, acc);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = accumulate ? o[c] : 0.0f;
            for (int j = 0; j < k; j++) {
                if (pn[j] < 0) continue;
                const float v = src[(size_t)pn[j] * (size_t)C + c];
                if constexpr (W) acc += gn[j] * v;
                else acc += v;
            }
            o[c] = acc;
        }
    }
}

/* dy[pos[s]] = gates[s] dout[n]   (=), s = n*k + j (blockIdx.x); MODE = V4 + 2 OB, OB: dy is bf16, rounded once */
template <int MODE>
static __global__ void combine_bwd_dy_k(void *dy, const float *dout, const int32_t *pos, const float *gates, int k,
                                        int C)
{
    constexpr int V4 = MODE & 1, OB = MODE >> 1;
    const size_t s = blockIdx.x;
    if (pos[s] < 0) return;   /* a null slot: no row */
    const float g = gates[s], *src = dout + (s / (size_t)k) * (size_t)C;
    const size_t r = (size_t)pos[s] * (size_t)C;
    if constexpr (V4) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            float4 v = mt_ld_f4(src + c);
            v.x = g * v.x, v.y = g * v.y, v.z = g * v.z, v.w = g * v.w;
            if constexpr (OB) mt_st_bf16x4((__nv_bfloat16 *)dy + r + c, v);
            else mt_st_f4((float *)dy + r + c, v);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            if constexpr (OB) ((__nv_bfloat16 *)dy)[r + c] = mt_cuda_bf16_rn(g * src[c]);
            else ((float *)dy)[r + c] = g * src[c];
        }
    }
}

/* dgates[s] = dout[n] . y[pos[s]]   (=); one warp per slot */
static __global__ void combine_bwd_dg_k(float *dgates, const float *dout, const float *y, const int32_t *pos,
                                        int N, int k, int C)
{
    size_t s = (size_t)blockIdx.x * (blockDim.x / MT_WARP) + threadIdx.x / MT_WARP;
    int lane = threadIdx.x % MT_WARP;
    if (s >= (size_t)N * (size_t)k) return;
    if (pos[s] < 0) {   /* a null slot: no row */
        if (lane == 0) dgates[s] = 0.0f;
        return;
    }
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

/* the row kernels' block: up to 256 threads, a warp at least; v4: the 16-byte form */
static unsigned row_threads(int C, int v4)
{
    const int w = v4 ? (C + 3) / 4 : C;
    return w >= THREADS ? THREADS : w <= MT_WARP ? MT_WARP : (unsigned)((w + MT_WARP - 1) / MT_WARP * MT_WARP);
}

/* out[n] += sum_j w src[pos] (gather_add_k; gates NULL: w = 1); accumulate 0: out[n] = 0.0f + ..., out not read */
static void gather_add(float *out, const float *src, const int32_t *pos, const float *gates, int N, int k, int C,
                       int accumulate)
{
    const int v4 = C % 4 == 0 && mt_cuda_aligned(out, 16) && mt_cuda_aligned(src, 16);
    switch (v4 + 2 * (gates != NULL)) {
    case 3: MT_LAUNCH(gather_add_k<3>, N, row_threads(C, 1), 0)(out, src, pos, gates, k, C, accumulate); break;
    case 2: MT_LAUNCH(gather_add_k<2>, N, row_threads(C, 0), 0)(out, src, pos, gates, k, C, accumulate); break;
    case 1: MT_LAUNCH(gather_add_k<1>, N, row_threads(C, 1), 0)(out, src, pos, gates, k, C, accumulate); break;
    default: MT_LAUNCH(gather_add_k<0>, N, row_threads(C, 0), 0)(out, src, pos, gates, k, C, accumulate); break;
    }
    MT_CUDA_KCHECK();
}

static void permute(void *xp, int out_bf16, const float *h, const int32_t *src_row, int M, int C)
{
    if (M <= 0 || C <= 0) return;
    const int v4 = C % 4 == 0 && mt_cuda_aligned(xp, out_bf16 ? 8 : 16) && mt_cuda_aligned(h, 16);
    const unsigned t = row_threads(C, v4);
    switch (v4 + 2 * out_bf16) {
    case 3: MT_LAUNCH(permute_k<3>, M, t, 0)(xp, h, src_row, C); break;
    case 2: MT_LAUNCH(permute_k<2>, M, t, 0)(xp, h, src_row, C); break;
    case 1: MT_LAUNCH(permute_k<1>, M, t, 0)(xp, h, src_row, C); break;
    default: MT_LAUNCH(permute_k<0>, M, t, 0)(xp, h, src_row, C); break;
    }
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_permute(void *be, float *xp, const float *h, const int32_t *src_row, int M, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    permute(xp, 0, h, src_row, M, C);
}

extern "C" void mt_cuda_moe_permute_bf16(void *be, mt_bf16 *xb, const float *h, const int32_t *src_row, int M, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    permute(xb, 1, h, src_row, M, C);
}

extern "C" void mt_cuda_moe_permute_backward(void *be, float *dh, const float *dxp, const int32_t *pos, int N, int k,
                                             int C, int accumulate)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    gather_add(dh, dxp, pos, NULL, N, k, C, accumulate);
}

extern "C" void mt_cuda_moe_combine(void *be, float *out, const float *y, const int32_t *pos, const float *gates,
                                    int N, int k, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    gather_add(out, y, pos, gates, N, k, C, 1);
}

static void combine_backward(void *dy, int dy_bf16, float *dgates, const float *dout, const float *y,
                             const int32_t *pos, const float *gates, int N, int k, int C)
{
    if (N <= 0 || k <= 0) return;
    const size_t slots = (size_t)N * (size_t)k;
    if (C > 0) {
        const int v4 = C % 4 == 0 && mt_cuda_aligned(dy, dy_bf16 ? 8 : 16) && mt_cuda_aligned(dout, 16);
        const unsigned t = row_threads(C, v4);
        switch (v4 + 2 * dy_bf16) {
        case 3: MT_LAUNCH(combine_bwd_dy_k<3>, (unsigned)slots, t, 0)(dy, dout, pos, gates, k, C); break;
        case 2: MT_LAUNCH(combine_bwd_dy_k<2>, (unsigned)slots, t, 0)(dy, dout, pos, gates, k, C); break;
        case 1: MT_LAUNCH(combine_bwd_dy_k<1>, (unsigned)slots, t, 0)(dy, dout, pos, gates, k, C); break;
        default: MT_LAUNCH(combine_bwd_dy_k<0>, (unsigned)slots, t, 0)(dy, dout, pos, gates, k, C); break;
        }
        MT_CUDA_KCHECK();
    }
    MT_LAUNCH(combine_bwd_dg_k, (unsigned)((slots + THREADS / MT_WARP - 1) / (THREADS / MT_WARP)), THREADS, 0)
        (dgates, dout, y, pos, N, k, C);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_combine_backward(void *be, float *dy, float *dgates, const float *dout, const float *y,
                                             const int32_t *pos, const float *gates, int N, int k, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    combine_backward(dy, 0, dgates, dout, y, pos, gates, N, k, C);
}

extern "C" void mt_cuda_moe_combine_backward_bf16(void *be, mt_bf16 *dyb, float *dgates, const float *dout,
                                                  const float *y, const int32_t *pos, const float *gates, int N, int k,
                                                  int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    combine_backward(dyb, 1, dgates, dout, y, pos, gates, N, k, C);
}

/* ------------------------------------------------------------------ */
/* MoE device routing (mt_ops.h): the counting sort, the aux/z statistics */
/* and gradients. No atomics: every count and sum has one owner thread    */
/* or a fixed tree, so reruns give the same bits.                          */
/* ------------------------------------------------------------------ */

#define CH MT_MOE_ROUTE_CHUNK

/* work[c*E + e] = slots of chunk c routed to e; one thread per (chunk, expert) */
static __global__ void route_count_k(int32_t *work, const int32_t *topk, int M, int E, int nch)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nch * E) return;
    int c = t / E, e = t % E, lo = c * CH, hi = lo + CH < M ? lo + CH : M, n = 0;
    for (int s = lo; s < hi; s++) n += topk[s] == e;
    work[t] = n;
}

/* one block: e_off = exclusive scan of the expert totals; work[c*E + e]
 * becomes chunk c's first row for e (e_off[e] + the counts of earlier chunks) */
static __global__ void route_scan_k(int32_t *e_off, int32_t *work, int E, int nch)
{
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t n = 0;
        for (int c = 0; c < nch; c++) n += work[(size_t)c * E + e];
        e_off[e + 1] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        e_off[0] = 0;
        for (int e = 0; e < E; e++) e_off[e + 1] += e_off[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t r = e_off[e];
        for (int c = 0; c < nch; c++) {
            int32_t n = work[(size_t)c * E + e];
            work[(size_t)c * E + e] = r;
            r += n;
        }
    }
}

/* pos / src_row of chunk c's slots of expert e, in slot order (stable);
 * a null expert's slots (e >= Er) get pos -1 and no src_row */
static __global__ void route_place_k(int32_t *pos, int32_t *src_row, const int32_t *work, const int32_t *topk, int M,
                                     int k, int E, int nch, int Er)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nch * E) return;
    int c = t / E, e = t % E, lo = c * CH, hi = lo + CH < M ? lo + CH : M;
    int32_t r = work[t];
    if (e >= Er) {
        for (int s = lo; s < hi; s++)
            if (topk[s] == e) pos[s] = -1;
        return;
    }
    for (int s = lo; s < hi; s++)
        if (topk[s] == e) {
            pos[s] = r;
            src_row[r++] = s / k;
        }
}

/* one block per (sequence q, expert e): slot count and prob sum over q's rows */
static __global__ void seq_stats_k(double *seq, const float *probs, const int32_t *topk, int N, int E, int k, int B,
                                   int T, int g0)
{
    __shared__ double sc[MT_CUDA_RED_THREADS], sp[MT_CUDA_RED_THREADS];
    int q = blockIdx.x / E, e = blockIdx.x % E;
    long lo = (long)q * T - g0, hi = lo + T;
    if (lo < 0) lo = 0;
    if (hi > N) hi = N;
    double c = 0.0, p = 0.0;
    for (long i = lo + threadIdx.x; i < hi; i += MT_CUDA_RED_THREADS) {
        for (int j = 0; j < k; j++) c += topk[i * k + j] == e ? 1.0 : 0.0;
        p += (double)probs[i * E + e];
    }
    sc[threadIdx.x] = c;
    sp[threadIdx.x] = p;
    for (int w = MT_CUDA_RED_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) {
            sc[threadIdx.x] += sc[threadIdx.x + w];
            sp[threadIdx.x] += sp[threadIdx.x + w];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        seq[(size_t)q * E + e] = sc[0];
        seq[(size_t)B * E + (size_t)q * E + e] = sp[0];
    }
}

/* one block: f_share, the aux sum (sequence order) and the z sum (fixed tree) */
static __global__ void aux_loss_k(double *loss, float *f_share, const double *seq, const float *lse, int N, int B,
                                  int E, int k, int T, float aux_coef, float z_coef, int count_aux)
{
    __shared__ double s[MT_CUDA_RED_THREADS];
    double z = 0.0;
    for (int i = threadIdx.x; i < N; i += MT_CUDA_RED_THREADS) z += (double)lse[i] * (double)lse[i];
    s[threadIdx.x] = z;
    for (int w = MT_CUDA_RED_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    const double aux = mt_moe_aux_shares(f_share, seq, B, E, k, T, aux_coef);  /* the cpu twin's code */
    loss[0] = count_aux ? aux : 0.0;
    loss[1] = (double)z_coef * s[0];
}

/* thread per (row, expert); the expert-0 thread of a row writes dlse */
static __global__ void aux_bwd_k(float *dprobs, float *dlse, const float *f_share, const float *lse, int N, int E,
                                 int T, int g0, float aux_coef, float z_coef, double n_seq, double n_tok)
{
    size_t total = (size_t)N * (size_t)E;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        size_t i = t / (size_t)E, e = t % (size_t)E;
        float f = f_share[(size_t)((g0 + (long)i) / T) * E + e];
        dprobs[t] = (float)((double)aux_coef * E * (double)f / (double)T / n_seq);
        if (e == 0) dlse[i] = (float)(2.0 * (double)z_coef * (double)lse[i] / n_tok);
    }
}

extern "C" void mt_cuda_moe_route(void *be, int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work,
                                  const int32_t *topk_idx, int N, int k, int E, int n_null)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (E <= 0) return;
    int M = N * k, nch = (M + CH - 1) / CH;
    if (M <= 0) {
        MT_CUDA_CHECK(cudaMemsetAsync(e_off, 0, (size_t)(E + 1) * sizeof(int32_t), mt_cuda_be->stream));
        return;
    }
    unsigned blocks = (unsigned)((nch * E + 127) / 128);
    MT_LAUNCH(route_count_k, blocks, 128, 0)(work, topk_idx, M, E, nch);
    MT_CUDA_KCHECK();
    MT_LAUNCH(route_scan_k, 1, E < 256 ? ((E + 31) / 32) * 32 : 256, 0)(e_off, work, E, nch);
    MT_CUDA_KCHECK();
    MT_LAUNCH(route_place_k, blocks, 128, 0)(pos, src_row, work, topk_idx, M, k, E, nch, E - n_null);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_seq_stats(void *be, double *seq, const float *probs, const int32_t *topk_idx, int N, int E,
                                      int k, int B, int T, int g0)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B <= 0 || E <= 0) return;
    MT_LAUNCH(seq_stats_k, (unsigned)(B * E), MT_CUDA_RED_THREADS, 0)(seq, probs, topk_idx, N, E, k, B, T, g0);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_aux_loss(void *be, double *loss, float *f_share, const double *seq, const float *lse, int N,
                                     int B, int E, int k, int T, float aux_coef, float z_coef, int count_aux)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    MT_LAUNCH(aux_loss_k, 1, MT_CUDA_RED_THREADS, 0)(loss, f_share, seq, lse, N, B, E, k, T, aux_coef, z_coef,
                                                     count_aux);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_moe_aux_backward(void *be, float *dprobs, float *dlse, const float *f_share, const float *lse,
                                         int N, int E, int T, int g0, float aux_coef, float z_coef, double n_seq,
                                         double n_tok)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    size_t total = (size_t)N * (size_t)E;
    if (total == 0) return;
    MT_LAUNCH(aux_bwd_k, mt_cuda_blocks(total, THREADS), THREADS, 0)(dprobs, dlse, f_share, lse, N, E, T, g0, aux_coef,
                                                                     z_coef, n_seq, n_tok);
    MT_CUDA_KCHECK();
}
