/*
 * attention.cu — causal GQA attention, flash style: no T x T matrix exists,
 * not even per block beyond one (BQ x BK) tile held in registers.
 *
 * Layouts: q, out, dout, dq (B,Tq,H,hd); k, v, dk, dv (B,Tk,K,hd); lse, D
 * (B,H,Tq). Query head h reads kv head h / (H/K); query i sits at position
 * q_pos0 + i and reads keys j <= q_pos0 + i. scale = 1/sqrt(hd).
 *
 * HOW IT WORKS
 *
 * Tiles are BQ = BK = 32 rows, a block is 8 warps (256 threads), hd <= 256.
 * Shared memory holds the tiles; tiles read "one row per lane" are padded to
 * a row stride of hd+1 floats so the 32 lanes hit 32 different banks.
 *
 * Forward, block = (b, h, block of 32 queries); warp w owns query rows
 * 4w..4w+3, lane l owns key l of the current key tile and output columns
 * d = l, l+32, ... (registers). Online softmax per row:
 *     s_l = scale q.k_l (masked -inf);  m' = max(m, max_l s_l);
 *     p_l = exp(s_l - m');  l = l e^(m-m') + sum_l p_l;
 *     o = o e^(m-m') + sum_l p_l v_l      (p_l broadcast by __shfl_sync)
 * and at the end o /= l, lse = m + log l. Only the key tiles up to the last
 * visible key are visited.
 *
 * Backward (Tq == Tk == T, q_pos0 = 0), three kernels, no atomics:
 *   1. D_i = dout_i . out_i                              (one warp per row)
 *   2. dK, dV: block = (b, kv head, key tile of 32). Warp w owns keys
 *      4w..4w+3 (dk, dv accumulators in registers, lane = column); for each
 *      head of the group and each query tile at or after the key tile, lane
 *      i recomputes  p_ij = exp(scale q_i.k_j - lse_i),  dp_ij = dout_i.v_j,
 *      ds_ij = scale p_ij (dp_ij - D_i),  then
 *          dv_j += sum_i p_ij dout_i,   dk_j += sum_i ds_ij q_i
 *      (i in order, heads in order: fixed summation order).
 *   3. dQ: block = (b, h, query tile); warp w owns rows 4w..4w+3, lane j
 *      recomputes ds_ij for key j of each key tile up to the diagonal and
 *          dq_i += sum_j ds_ij k_j.
 * P is recomputed twice (2 and 3) instead of accumulating dq with float
 * atomics (FlashAttention-2's choice): the price of determinism. dq, dk, dv
 * are written once at the end (=).
 *
 * The dot products run on CUDA cores in fp32 (correctness first); a tensor
 * core (mma / bf16) version is future work and must keep this file's
 * contract and determinism.
 */
#include "cuda_impl.cuh"

#include <math.h>

#define BQ      32
#define BK      32
#define NWARPS  8
#define THREADS (NWARPS * MT_WARP)
#define RPW     (BQ / NWARPS)   /* query rows per warp */
#define KPW     (BK / NWARPS)   /* keys per warp (dK/dV kernel) */
#define HD_MAX  256

/* ---- forward ---- */
template <int NR>
static __global__ void __launch_bounds__(THREADS)
attn_fwd_k(float *out, float *lse, const float *q, const float *k, const float *v,
           int Tq, int Tk, int q_pos0, int H, int K, int hd, float scale)
{
    MT_DYN_SMEM(float, sm);
    const int hdp = hd + 1;
    float *Qs = sm;               /* (BQ, hd)  */
    float *Ks = Qs + BQ * hd;     /* (BK, hdp) */
    float *Vs = Ks + BK * hdp;    /* (BK, hd)  */
    const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int i0 = qb * BQ, nq = Tq - i0 < BQ ? Tq - i0 : BQ;
    const size_t qld = (size_t)H * (size_t)hd, kld = (size_t)K * (size_t)hd;
    const float *qg = q + ((size_t)b * (size_t)Tq + (size_t)i0) * qld + (size_t)h * (size_t)hd;
    float       *og = out + ((size_t)b * (size_t)Tq + (size_t)i0) * qld + (size_t)h * (size_t)hd;
    const float *kg = k + (size_t)b * (size_t)Tk * kld + (size_t)kvh * (size_t)hd;
    const float *vg = v + (size_t)b * (size_t)Tk * kld + (size_t)kvh * (size_t)hd;

    for (int e = threadIdx.x; e < BQ * hd; e += THREADS) {
        int r = e / hd, d = e - r * hd;
        Qs[e] = r < nq ? qg[(size_t)r * qld + d] : 0.0f;
    }
    float m[RPW], l[RPW], o[RPW][NR];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int t = 0; t < NR; t++) o[rr][t] = 0.0f;
    }
    int kend = q_pos0 + i0 + nq < Tk ? q_pos0 + i0 + nq : Tk;
    for (int j0 = 0; j0 < kend; j0 += BK) {
        const int nk = kend - j0 < BK ? kend - j0 : BK;
        __syncthreads();  /* Q is loaded; the previous K/V tile is consumed */
        for (int e = threadIdx.x; e < BK * hd; e += THREADS) {
            int jj = e / hd, d = e - jj * hd;
            float kv = 0.0f, vv = 0.0f;
            if (jj < nk) {
                kv = kg[(size_t)(j0 + jj) * kld + d];
                vv = vg[(size_t)(j0 + jj) * kld + d];
            }
            Ks[jj * hdp + d] = kv;
            Vs[jj * hd + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (r >= nq) break;  /* warp-uniform */
            const bool vis = lane < nk && j0 + lane <= q_pos0 + i0 + r;
            float s = -INFINITY;
            if (vis) {
                const float *qr = Qs + r * hd, *kr = Ks + lane * hdp;
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
                s = dot * scale;
            }
            const float mx = mt_warp_max(s);
            if (mx == -INFINITY) continue;  /* no visible key in this tile (warp-uniform) */
            const float mnew = fmaxf(m[rr], mx);
            const float alpha = expf(m[rr] - mnew);  /* 0 on the first visible tile */
            const float p = vis ? expf(s - mnew) : 0.0f;
            l[rr] = l[rr] * alpha + mt_warp_sum(p);
            m[rr] = mnew;
#pragma unroll
            for (int t = 0; t < NR; t++) o[rr][t] *= alpha;
            for (int jj = 0; jj < nk; jj++) {
                const float pj = __shfl_sync(MT_FULL_MASK, p, jj);
                const float *vr = Vs + jj * hd;
#pragma unroll
                for (int t = 0; t < NR; t++) {
                    const int d = lane + t * MT_WARP;
                    if (d < hd) o[rr][t] += pj * vr[d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nq) break;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
        for (int t = 0; t < NR; t++) {
            const int d = lane + t * MT_WARP;
            if (d < hd) og[(size_t)r * qld + d] = o[rr][t] * inv;
        }
        if (lane == 0)
            lse[((size_t)b * (size_t)H + (size_t)h) * (size_t)Tq + (size_t)(i0 + r)] =
                l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

/* ---- backward 1: D (B,H,T) = rowwise dout . out; one warp per (b, t, h) row ---- */
static __global__ void attn_bwd_d_k(float *D, const float *dout, const float *out, int B, int T, int H, int hd)
{
    const size_t row = (size_t)blockIdx.x * NWARPS + threadIdx.x / MT_WARP;
    const int lane = threadIdx.x % MT_WARP;
    if (row >= (size_t)B * (size_t)T * (size_t)H) return;
    const float *g = dout + row * (size_t)hd, *o = out + row * (size_t)hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += MT_WARP) acc += g[d] * o[d];
    acc = mt_warp_sum(acc);
    if (lane == 0) {
        size_t h = row % (size_t)H, bt = row / (size_t)H, t = bt % (size_t)T, b = bt / (size_t)T;
        D[(b * (size_t)H + h) * (size_t)T + t] = acc;
    }
}

/* ---- backward 2: dK, dV ---- */
template <int NR>
static __global__ void __launch_bounds__(THREADS)
attn_bwd_dkdv_k(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                const float *lse, const float *D, int T, int H, int K, int hd, float scale)
{
    MT_DYN_SMEM(float, sm);
    const int hdp = hd + 1;
    float *Ks = sm;               /* (BK, hd)  */
    float *Vs = Ks + BK * hd;     /* (BK, hd)  */
    float *Qs = Vs + BK * hd;     /* (BQ, hdp) */
    float *Gs = Qs + BQ * hdp;    /* (BQ, hdp) dout */
    float *Ls = Gs + BQ * hdp;    /* (BQ) lse */
    float *Ds = Ls + BQ;          /* (BQ) D   */
    const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int grp = H / K;
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int j0 = kb * BK, nk = T - j0 < BK ? T - j0 : BK;
    const size_t qld = (size_t)H * (size_t)hd, kld = (size_t)K * (size_t)hd;
    const size_t koff = ((size_t)b * (size_t)T + (size_t)j0) * kld + (size_t)kvh * (size_t)hd;

    for (int e = threadIdx.x; e < BK * hd; e += THREADS) {
        int jj = e / hd, d = e - jj * hd;
        Ks[e] = jj < nk ? k[koff + (size_t)jj * kld + d] : 0.0f;
        Vs[e] = jj < nk ? v[koff + (size_t)jj * kld + d] : 0.0f;
    }
    float dka[KPW][NR], dva[KPW][NR];
#pragma unroll
    for (int kk = 0; kk < KPW; kk++)
#pragma unroll
        for (int t = 0; t < NR; t++) dka[kk][t] = dva[kk][t] = 0.0f;

    for (int g = 0; g < grp; g++) {
        const int h = kvh * grp + g;
        const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
        for (int i0 = j0; i0 < T; i0 += BQ) {  /* query tiles at or after the key tile */
            const int nq = T - i0 < BQ ? T - i0 : BQ;
            const size_t qoff = ((size_t)b * (size_t)T + (size_t)i0) * qld + (size_t)h * (size_t)hd;
            __syncthreads();  /* previous Q/dout tile consumed (K/V loaded on the first pass) */
            for (int e = threadIdx.x; e < BQ * hd; e += THREADS) {
                int r = e / hd, d = e - r * hd;
                Qs[r * hdp + d] = r < nq ? q[qoff + (size_t)r * qld + d] : 0.0f;
                Gs[r * hdp + d] = r < nq ? dout[qoff + (size_t)r * qld + d] : 0.0f;
            }
            if (threadIdx.x < BQ) {
                int r = threadIdx.x;
                Ls[r] = r < nq ? lse[lrow + (size_t)(i0 + r)] : -INFINITY;
                Ds[r] = r < nq ? D[lrow + (size_t)(i0 + r)] : 0.0f;
            }
            __syncthreads();
            const int i = lane;
            const float Li = Ls[i], Di = Ds[i];
#pragma unroll
            for (int kk = 0; kk < KPW; kk++) {
                const int jj = warp * KPW + kk;
                if (jj >= nk) break;  /* warp-uniform */
                float p = 0.0f, ds = 0.0f;
                if (i < nq && i0 + i >= j0 + jj && Li != -INFINITY) {
                    const float *qi = Qs + i * hdp, *gi = Gs + i * hdp, *kj = Ks + jj * hd, *vj = Vs + jj * hd;
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < hd; d++) {
                        s += qi[d] * kj[d];
                        dp += gi[d] * vj[d];
                    }
                    p = expf(scale * s - Li);
                    ds = scale * p * (dp - Di);
                }
                for (int ii = 0; ii < nq; ii++) {
                    const float pi = __shfl_sync(MT_FULL_MASK, p, ii), dsi = __shfl_sync(MT_FULL_MASK, ds, ii);
                    const float *qr = Qs + ii * hdp, *gr = Gs + ii * hdp;
#pragma unroll
                    for (int t = 0; t < NR; t++) {
                        const int d = lane + t * MT_WARP;
                        if (d < hd) {
                            dva[kk][t] += pi * gr[d];
                            dka[kk][t] += dsi * qr[d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int kk = 0; kk < KPW; kk++) {
        const int jj = warp * KPW + kk;
        if (jj >= nk) break;
#pragma unroll
        for (int t = 0; t < NR; t++) {
            const int d = lane + t * MT_WARP;
            if (d < hd) {
                dk[koff + (size_t)jj * kld + d] = dka[kk][t];
                dv[koff + (size_t)jj * kld + d] = dva[kk][t];
            }
        }
    }
}

/* ---- backward 3: dQ ---- */
template <int NR>
static __global__ void __launch_bounds__(THREADS)
attn_bwd_dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
              const float *lse, const float *D, int T, int H, int K, int hd, float scale)
{
    MT_DYN_SMEM(float, sm);
    const int hdp = hd + 1;
    float *Ks = sm;               /* (BK, hdp) */
    float *Vs = Ks + BK * hdp;    /* (BK, hdp) */
    float *Qs = Vs + BK * hdp;    /* (BQ, hd)  */
    float *Gs = Qs + BQ * hd;     /* (BQ, hd) dout */
    const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int i0 = qb * BQ, nq = T - i0 < BQ ? T - i0 : BQ;
    const size_t qld = (size_t)H * (size_t)hd, kld = (size_t)K * (size_t)hd;
    const size_t qoff = ((size_t)b * (size_t)T + (size_t)i0) * qld + (size_t)h * (size_t)hd;
    const float *kg = k + (size_t)b * (size_t)T * kld + (size_t)kvh * (size_t)hd;
    const float *vg = v + (size_t)b * (size_t)T * kld + (size_t)kvh * (size_t)hd;
    const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T + (size_t)i0;

    for (int e = threadIdx.x; e < BQ * hd; e += THREADS) {
        int r = e / hd, d = e - r * hd;
        Qs[e] = r < nq ? q[qoff + (size_t)r * qld + d] : 0.0f;
        Gs[e] = r < nq ? dout[qoff + (size_t)r * qld + d] : 0.0f;
    }
    float L[RPW], Dr[RPW], dqa[RPW][NR];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        L[rr] = r < nq ? lse[lrow + (size_t)r] : -INFINITY;
        Dr[rr] = r < nq ? D[lrow + (size_t)r] : 0.0f;
#pragma unroll
        for (int t = 0; t < NR; t++) dqa[rr][t] = 0.0f;
    }
    const int kend = i0 + nq;  /* <= T */
    for (int j0 = 0; j0 < kend; j0 += BK) {
        const int nk = kend - j0 < BK ? kend - j0 : BK;
        __syncthreads();
        for (int e = threadIdx.x; e < BK * hd; e += THREADS) {
            int jj = e / hd, d = e - jj * hd;
            Ks[jj * hdp + d] = jj < nk ? kg[(size_t)(j0 + jj) * kld + d] : 0.0f;
            Vs[jj * hdp + d] = jj < nk ? vg[(size_t)(j0 + jj) * kld + d] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = warp * RPW + rr;
            if (r >= nq) break;  /* warp-uniform */
            float ds = 0.0f;
            if (lane < nk && j0 + lane <= i0 + r && L[rr] != -INFINITY) {
                const float *qr = Qs + r * hd, *gr = Gs + r * hd, *kj = Ks + lane * hdp, *vj = Vs + lane * hdp;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < hd; d++) {
                    s += qr[d] * kj[d];
                    dp += gr[d] * vj[d];
                }
                const float p = expf(scale * s - L[rr]);
                ds = scale * p * (dp - Dr[rr]);
            }
            for (int jj = 0; jj < nk; jj++) {
                const float dsj = __shfl_sync(MT_FULL_MASK, ds, jj);
                const float *kr = Ks + jj * hdp;
#pragma unroll
                for (int t = 0; t < NR; t++) {
                    const int d = lane + t * MT_WARP;
                    if (d < hd) dqa[rr][t] += dsj * kr[d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nq) break;
#pragma unroll
        for (int t = 0; t < NR; t++) {
            const int d = lane + t * MT_WARP;
            if (d < hd) dq[qoff + (size_t)r * qld + d] = dqa[rr][t];
        }
    }
}

/* ---- host side ---- */
static int check_shape(int H, int K, int hd)
{
    if (hd < 1 || hd > HD_MAX) {
        MT_CUDA_UNSUPPORTED("attention: head dim must be in [1, 256]");
        return 0;
    }
    if (K < 1 || H % K != 0) {
        MT_CUDA_UNSUPPORTED("attention: H must be a multiple of K");
        return 0;
    }
    return 1;
}

template <int NR>
static void fwd_launch(float *out, float *lse, const float *q, const float *k, const float *v,
                       int B, int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    size_t smem = (size_t)(BQ * hd + BK * (hd + 1) + BK * hd) * sizeof(float);
    if (!mt_cuda_smem_opt_in(attn_fwd_k<NR>, smem)) return;
    dim3 grid((unsigned)((Tq + BQ - 1) / BQ), (unsigned)H, (unsigned)B);
    MT_LAUNCH(attn_fwd_k<NR>, grid, THREADS, smem)(out, lse, q, k, v, Tq, Tk, q_pos0, H, K, hd,
                                                   1.0f / sqrtf((float)hd));
    MT_CUDA_KCHECK();
}

template <int NR>
static void bwd_launch(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                       const float *v, const float *lse, const float *D, int B, int T, int H, int K, int hd)
{
    const float scale = 1.0f / sqrtf((float)hd);
    size_t smem_kv = (size_t)(2 * BK * hd + 2 * BQ * (hd + 1) + 2 * BQ) * sizeof(float);
    size_t smem_q = (size_t)(2 * BK * (hd + 1) + 2 * BQ * hd) * sizeof(float);
    if (!mt_cuda_smem_opt_in(attn_bwd_dkdv_k<NR>, smem_kv) || !mt_cuda_smem_opt_in(attn_bwd_dq_k<NR>, smem_q)) return;
    dim3 gkv((unsigned)((T + BK - 1) / BK), (unsigned)K, (unsigned)B);
    MT_LAUNCH(attn_bwd_dkdv_k<NR>, gkv, THREADS, smem_kv)(dk, dv, dout, q, k, v, lse, D, T, H, K, hd, scale);
    MT_CUDA_KCHECK();
    dim3 gq((unsigned)((T + BQ - 1) / BQ), (unsigned)H, (unsigned)B);
    MT_LAUNCH(attn_bwd_dq_k<NR>, gq, THREADS, smem_q)(dq, dout, q, k, v, lse, D, T, H, K, hd, scale);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_attention_rowdot(float *D, const float *dout, const float *out, int B, int T, int H, int hd)
{
    const size_t rows = (size_t)B * (size_t)T * (size_t)H;
    MT_LAUNCH(attn_bwd_d_k, (unsigned)((rows + NWARPS - 1) / NWARPS), THREADS, 0)(D, dout, out, B, T, H, hd);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_attention_forward(void *be, float *out, float *lse, const float *q, const float *k, const float *v,
                                          int B, int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B <= 0 || Tq <= 0 || H <= 0) return;
    if (!check_shape(H, K, hd)) return;
    if (hd <= 64)       fwd_launch<2>(out, lse, q, k, v, B, Tq, Tk, q_pos0, H, K, hd);
    else if (hd <= 128) fwd_launch<4>(out, lse, q, k, v, B, Tq, Tk, q_pos0, H, K, hd);
    else                fwd_launch<8>(out, lse, q, k, v, B, Tq, Tk, q_pos0, H, K, hd);
}

extern "C" void mt_cuda_attention_backward(void *be, float *dq, float *dk, float *dv, const float *dout,
                                           const float *q, const float *k, const float *v,
                                           const float *out, const float *lse,
                                           int B, int T, int H, int K, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (!check_shape(H, K, hd)) return;
    const size_t rows = (size_t)B * (size_t)T * (size_t)H;
    float *D = (float *)mt_cuda_workspace(rows * sizeof(float));
    if (!D) return;
    mt_cuda_attention_rowdot(D, dout, out, B, T, H, hd);
    if (hd <= 64)       bwd_launch<2>(dq, dk, dv, dout, q, k, v, lse, D, B, T, H, K, hd);
    else if (hd <= 128) bwd_launch<4>(dq, dk, dv, dout, q, k, v, lse, D, B, T, H, K, hd);
    else                bwd_launch<8>(dq, dk, dv, dout, q, k, v, lse, D, B, T, H, K, hd);
}
