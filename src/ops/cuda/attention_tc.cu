/*
 * attention_tc.cu — causal GQA attention on tensor cores for precision=bf16
 * (mt_ops.h attention_forward_bf16 / attention_backward_bf16): the entries,
 * the operand staging and the v1 kernels (knob attn_kernel=v1). With
 * attn_kernel=v2 (the default) the entries hand head dims 64 and 128 to
 * attention_v2.cu (FlashAttention-2-class, mma.sync; its header has its
 * rounding points); other head dims run v1, counted
 * (mt_ops_cuda_info.attention_v2_fallbacks). bf16
 * operands, fp32 accumulation, softmax statistics in fp32. Same layouts as
 * attention.cu: q, out, dout, dq (B,T,H,hd); k, v, dk, dv (B,T,K,hd); lse
 * (B,H,T); query head h reads kv head h / (H/K) (K/V are never repeated in
 * memory); scale = 1/sqrt(hd); training shapes (Tq == Tk == T, q_pos0 = 0).
 *
 * Rounding points (the cpu twin, src/ops/cpu/attention_bf16.c, rounds at
 * the same ones; docs/cuda.md "Attention on tensor cores" bounds the error):
 *   q, k, v, dout  -> bf16 once per call (cast into the workspace)
 *   s_ij = scale * sum_d q_id k_jd           (fp32 accumulation)
 *   p_ij = exp(s_ij - lse_i)                 (fp32; bf16(p) feeds P V and P^T dO)
 *   o_i  = sum_j bf16(p_ij) v_j              (fp32 accumulation; out fp32, + bf16 twin)
 *   dp_ij = sum_d dout_id v_jd;  D_i = dout_i . out_i (fp32 operands)
 *   ds_ij = scale p_ij (dp_ij - D_i)         (bf16(ds) feeds dS K and dS^T Q)
 *   dv_j = sum_i bf16(p_ij) dout_i;  dk_j = sum_i bf16(ds_ij) q_i;  dq_i = sum_j bf16(ds_ij) k_j
 *
 * HOW IT WORKS
 *
 * Tiles of 64 queries x 64 keys; a block is 4 warps (128 threads); a warp
 * owns 16 rows of the tile and multiplies with nvcuda::wmma 16x16x16 bf16
 * fragments. Every fragment moves only through load/store/mma/fill, never
 * by element, so nothing depends on the (unspecified) fragment layout: the
 * CPU emulator (tests/cuda/emu/mma.h) runs the same code exactly. The head
 * dim is padded with zeros to hd16 = a multiple of 16 in shared memory;
 * shared rows are padded by 8 bf16 / 4 floats against bank conflicts (and
 * keep wmma's 32-byte alignment).
 *
 * Forward, block = (query tile, head, batch), two passes over the visible
 * key tiles (causal: tiles up to the diagonal):
 *   1. S_w = Q_w K^T per tile; two lanes per row keep the running max m and
 *      sum l (l = l e^(m-m') + sum e^(s-m')); lse = m + log l.
 *   2. S_w again (the same products, the same bits), P = bf16(exp(s - lse))
 *      already normalised, O_w += P V in accumulator fragments.
 * Two passes instead of FlashAttention's rescaled single pass: rescaling
 * O by a per-row factor needs the fragment layout (or a round trip of O
 * through shared memory per tile); the second QK^T costs +50% forward
 * FLOPs, ~11% of forward+backward.
 * Backward (no atomics, fixed order: deterministic), after D = rowdot(dout, out):
 *   dK/dV: block = (key tile, kv head, batch); warp w owns keys 16w..16w+15;
 *     for each head of the group, each query tile from the diagonal:
 *     S^T = K_w Q^T, P^T (kept in registers, bf16 copy in smem), dP^T = V_w dO^T,
 *     dS^T, then dV_w += P^T dO, dK_w += dS^T Q (accumulators in fragments);
 *     each dS^T tile is also stored (bf16) for dQ.
 *   dQ: block = (query tile, head, batch); per key tile up to the diagonal:
 *     dQ_w += dS K, dS read column-major from the stored tile.
 * dQ = dS K reads the dS tiles the dK/dV kernel stored (bf16, packed causal
 * tiles in the workspace): no float atomics, no second recompute; over
 * MT_CUDA_ATTN_DS_MB the dQ kernel recomputes S, P, dP per tile instead.
 * Head dims above 128 run the fp32 kernels of attention.cu (named in
 * mt_ops_cuda_info.attention_fp32_fallbacks).
 */
#include "cuda_impl.cuh"
#include "attn_sched.cuh"

#include <math.h>
#include <mma.h>

using namespace nvcuda;

#define TC_B     64            /* rows of a query tile = keys of a key tile */
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * MT_WARP)
#define TC_LDS   (TC_B + 4)    /* row stride of a warp's fp32 score tile */
#define TC_LDP   (TC_B + 8)    /* row stride of a warp's bf16 P / dS tile */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

struct alignas(16) tc_u128 { uint32_t w[4]; };

static __host__ __device__ inline int tc_hd16(int hd) { return (hd + 15) & ~15; }

/* rows [r0, r0 + 64) of one head of a (B,T,nh,hd) bf16 tensor into a shared
 * tile (64, ld) zero-padded past T and past hd. vec: hd % 8 == 0 and the
 * tensor 16-byte aligned, 16-byte copies. */
static __device__ void tc_load_tile(bf16 *dst, int ld, const bf16 *src, int b, int r0, int T, int nh, int head,
                                    int hd, int hd16, bool vec)
{
    const size_t rstride = (size_t)nh * (size_t)hd;
    const bf16 *base = src + ((size_t)b * (size_t)T) * rstride + (size_t)head * (size_t)hd;
    if (vec) {
        const int cpr = hd16 / 8;  /* 16-byte chunks per row */
        for (int e = threadIdx.x; e < TC_B * cpr; e += TC_THREADS) {
            const int r = e / cpr, c8 = (e - r * cpr) * 8;
            tc_u128 val = {{0u, 0u, 0u, 0u}};
            if (r0 + r < T && c8 < hd) val = *(const tc_u128 *)(base + (size_t)(r0 + r) * rstride + c8);
            *(tc_u128 *)(dst + r * ld + c8) = val;
        }
    } else {
        const bf16 zero = __float2bfloat16_rn(0.0f);
        for (int e = threadIdx.x; e < TC_B * hd16; e += TC_THREADS) {
            const int r = e / hd16, c = e - r * hd16;
            dst[r * ld + c] = (r0 + r < T && c < hd) ? base[(size_t)(r0 + r) * rstride + c] : zero;
        }
    }
}

/* acc[f] (16 x 16 f) = rows of A (16 x hd16 at a, lda) times B^T, B the 64
 * rows of a shared tile (ldb): S = A B^T, accumulated over hd16 / 16 steps */
static __device__ __forceinline__ void tc_abt(frag_c acc[4], const bf16 *a, int lda, const bf16 *bt, int ldb,
                                              int hd16)
{
#pragma unroll
    for (int f = 0; f < 4; f++) wmma::fill_fragment(acc[f], 0.0f);
    for (int kk = 0; kk < hd16; kk += 16) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + kk, (unsigned)lda);
#pragma unroll
        for (int f = 0; f < 4; f++) {
            frag_b_col fb;  /* B^T: element (d, n) = B[n][d] */
            wmma::load_matrix_sync(fb, bt + (size_t)(16 * f) * (size_t)ldb + kk, (unsigned)ldb);
            wmma::mma_sync(acc[f], fa, fb, acc[f]);
        }
    }
}

/* out[f] += P (16 x 64 at p, ldp) times the 64 rows of a shared tile (ldb),
 * f over the hd16 / 16 column blocks */
template <int NF>
static __device__ __forceinline__ void tc_pv(frag_c out[NF], const bf16 *p, int ldp, const bf16 *b, int ldb, int nf)
{
#pragma unroll
    for (int kk = 0; kk < TC_B; kk += 16) {
        frag_a fa;
        wmma::load_matrix_sync(fa, p + kk, (unsigned)ldp);
#pragma unroll
        for (int f = 0; f < NF; f++) {
            if (f >= nf) break;
            frag_b_row fb;
            wmma::load_matrix_sync(fb, b + (size_t)kk * (size_t)ldb + 16 * f, (unsigned)ldb);
            wmma::mma_sync(out[f], fa, fb, out[f]);
        }
    }
}

static __device__ __forceinline__ void tc_store4(float *s, const frag_c acc[4])
{
#pragma unroll
    for (int f = 0; f < 4; f++) wmma::store_matrix_sync(s + 16 * f, acc[f], TC_LDS, wmma::mem_row_major);
}

/* a warp's accumulators (16 x hd16) -> rows of a (B,T,nh,hd) fp32 tensor
 * (and its bf16 twin), through the warp's staging tile (16, hd16 + 4) */
template <int NF>
static __device__ void tc_write_rows(float *dst, bf16 *dst_b, float *stage, const frag_c acc[NF], int nf, int b,
                                     int r0, int T, int nh, int head, int hd, int hd16, int ldb = 0)
{
    const int lds = hd16 + 4, lane = threadIdx.x % MT_WARP;
#pragma unroll
    for (int f = 0; f < NF; f++) {
        if (f >= nf) break;
        wmma::store_matrix_sync(stage + 16 * f, acc[f], (unsigned)lds, wmma::mem_row_major);
    }
    __syncwarp();
    const size_t rstride = (size_t)nh * (size_t)hd, rstride_b = ldb ? (size_t)ldb : rstride;   /* dst_b's rows */
    for (int e = lane; e < 16 * hd; e += MT_WARP) {
        const int r = e / hd, c = e - r * hd;
        if (r0 + r >= T) continue;
        const size_t row = (size_t)b * (size_t)T + (size_t)(r0 + r), col = (size_t)head * (size_t)hd + c;
        const float v = stage[r * lds + c];
        if (dst) dst[row * rstride + col] = v;
        if (dst_b) dst_b[row * rstride_b + col] = __float2bfloat16_rn(v);
    }
    __syncwarp();
}

/* ---- forward ---- */
template <int NF>
static __global__ void __launch_bounds__(TC_THREADS)
attn_tc_fwd_k(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int H,
              int K, int hd, float scale, int vec)
{
    MT_DYN_SMEM(unsigned char, sm);
    const int hd16 = tc_hd16(hd), nf = hd16 / 16, ldh = hd16 + 8;
    bf16 *Qs = (bf16 *)sm;
    bf16 *Ks = Qs + TC_B * ldh;
    bf16 *Vs = Ks + TC_B * ldh;
    float *Ss = (float *)(Vs + TC_B * ldh);
    bf16 *Ps = (bf16 *)(Ss + TC_WARPS * 16 * TC_LDS);
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = (T + TC_B - 1) / TC_B - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int i0 = qt * TC_B;
    float *Sw = Ss + warp * 16 * TC_LDS;
    bf16 *Pw = Ps + warp * 16 * TC_LDP;
    const int r = lane >> 1, c0 = (lane & 1) * 32;  /* two lanes per row, 32 columns each */
    const int qi = i0 + 16 * warp + r;              /* this lane's query */

    tc_load_tile(Qs, ldh, q, b, i0, T, H, h, hd, hd16, vec != 0);
    const int n_kt = qt + 1;  /* key tiles up to the diagonal */
    float m = -INFINITY, l = 0.0f;
    frag_c acc[4];
    for (int pass = 0; pass < 2; pass++) {
        frag_c o[NF];
#pragma unroll
        for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
        const float lse_i = m + logf(l);
        for (int kt = 0; kt < n_kt; kt++) {
            const int j0 = kt * TC_B;
            __syncthreads();  /* the previous tile is consumed (and Q is loaded) */
            tc_load_tile(Ks, ldh, k, b, j0, T, K, kvh, hd, hd16, vec != 0);
            if (pass == 1) tc_load_tile(Vs, ldh, v, b, j0, T, K, kvh, hd, hd16, vec != 0);
            __syncthreads();
            tc_abt(acc, Qs + (16 * warp) * ldh, ldh, Ks, ldh, hd16);
            tc_store4(Sw, acc);
            __syncwarp();
            const float *srow = Sw + r * TC_LDS + c0;
            if (pass == 0) {
                float mx = -INFINITY;
                for (int c = 0; c < 32; c++) {
                    const int j = j0 + c0 + c;
                    if (j <= qi && j < T) mx = fmaxf(mx, srow[c] * scale);
                }
                mx = fmaxf(mx, __shfl_xor_sync(MT_FULL_MASK, mx, 1));
                /* every lane shuffles (full mask); a row with no visible key
                 * in this tile (mnew = -inf only before its first) keeps m, l */
                const float mnew = fmaxf(m, mx);
                float sum = 0.0f;
                for (int c = 0; c < 32; c++) {
                    const int j = j0 + c0 + c;
                    if (j <= qi && j < T) sum += expf(srow[c] * scale - mnew);
                }
                sum += __shfl_xor_sync(MT_FULL_MASK, sum, 1);
                if (mnew != -INFINITY) {
                    l = l * expf(m - mnew) + sum;
                    m = mnew;
                }
            } else {
                bf16 *prow = Pw + r * TC_LDP + c0;
                for (int c = 0; c < 32; c++) {
                    const int j = j0 + c0 + c;
                    const float p = (j <= qi && j < T) ? expf(srow[c] * scale - lse_i) : 0.0f;
                    prow[c] = __float2bfloat16_rn(p);
                }
                __syncwarp();
                tc_pv<NF>(o, Pw, TC_LDP, Vs, ldh, nf);
            }
            __syncwarp();  /* the score tile is read before the next tile overwrites it */
        }
        if (pass == 1) {
            if ((lane & 1) == 0 && qi < T) lse[((size_t)b * (size_t)H + (size_t)h) * (size_t)T + (size_t)qi] = lse_i;
            __syncthreads();  /* every warp is done with K and V: they become the staging tiles */
            float *stage = (float *)Ks + warp * 16 * (hd16 + 4);
            tc_write_rows<NF>(out, out_b, stage, o, nf, b, i0 + 16 * warp, T, H, h, hd, hd16);
        }
    }
}

/* The dS^T tiles of the backward, kept for the dQ product (bf16): per
 * (b, h) the causal tiles (qt >= kt) packed row by row, tile (qt, kt) at
 * index qt (qt+1)/2 + kt, each 64 keys x 64 queries, key-major. */
static __device__ __forceinline__ size_t tc_ds_tile(int b, int h, int H, int qt, int kt, int n_qt)
{
    const size_t ntri = (size_t)n_qt * (size_t)(n_qt + 1) / 2;
    return (((size_t)b * (size_t)H + (size_t)h) * ntri + (size_t)qt * (size_t)(qt + 1) / 2 + (size_t)kt) *
           (size_t)(TC_B * TC_B);
}
/* a warp's 16 rows (keys) of dS^T from its shared tile (ld TC_LDP) into the
 * global tile, 16-byte copies (the rows were written before a __syncwarp) */
static __device__ void tc_store_ds(bf16 *dsg, const bf16 *DSw, int b, int h, int H, int qt, int kt, int n_qt)
{
    bf16 *tile = dsg + tc_ds_tile(b, h, H, qt, kt, n_qt) + (size_t)(16 * (threadIdx.x / MT_WARP)) * TC_B;
    for (int e = threadIdx.x % MT_WARP; e < 16 * TC_B / 8; e += MT_WARP) {
        const int r = e / (TC_B / 8), c8 = (e - r * (TC_B / 8)) * 8;
        *(tc_u128 *)(tile + r * TC_B + c8) = *(const tc_u128 *)(DSw + r * TC_LDP + c8);
    }
}

/* ---- backward: dK, dV ---- */
template <int NF>
static __global__ void __launch_bounds__(TC_THREADS)
attn_tc_dkdv_k(float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, bf16 *dsg, const bf16 *q, const bf16 *k, const bf16 *v,
               const bf16 *g, const float *lse, const float *D, int T, int H, int K, int hd, float scale, int vec,
               int ldv_b)
{
    MT_DYN_SMEM(unsigned char, sm);
    const int hd16 = tc_hd16(hd), nf = hd16 / 16, ldh = hd16 + 8;
    bf16 *Ks = (bf16 *)sm;
    bf16 *Vs = Ks + TC_B * ldh;
    bf16 *Qs = Vs + TC_B * ldh;
    bf16 *Gs = Qs + TC_B * ldh;
    float *Ss = (float *)(Gs + TC_B * ldh);
    bf16 *Ps = (bf16 *)(Ss + TC_WARPS * 16 * TC_LDS);
    bf16 *DSs = Ps + TC_WARPS * 16 * TC_LDP;
    float *Ls = (float *)(DSs + TC_WARPS * 16 * TC_LDP);
    float *Dsh = Ls + TC_B;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* kt 0 (the most work) first (attn_sched.cuh) */
    const int kt = sl.rank, kvh = sl.pair % K, b = sl.pair / K, grp = H / K;
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int j0 = kt * TC_B;
    float *Sw = Ss + warp * 16 * TC_LDS;
    bf16 *Pw = Ps + warp * 16 * TC_LDP, *DSw = DSs + warp * 16 * TC_LDP;
    const int r = lane >> 1, c0 = (lane & 1) * 32;
    const int kj = j0 + 16 * warp + r;  /* this lane's key */

    tc_load_tile(Ks, ldh, k, b, j0, T, K, kvh, hd, hd16, vec != 0);
    tc_load_tile(Vs, ldh, v, b, j0, T, K, kvh, hd, hd16, vec != 0);
    frag_c dka[NF], dva[NF], acc[4];
#pragma unroll
    for (int f = 0; f < NF; f++) {
        wmma::fill_fragment(dka[f], 0.0f);
        wmma::fill_fragment(dva[f], 0.0f);
    }
    const int n_qt = (T + TC_B - 1) / TC_B;
    for (int gi = 0; gi < grp; gi++) {
        const int h = kvh * grp + gi;
        const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
        for (int qt = kt; qt < n_qt; qt++) {  /* query tiles from the diagonal on */
            const int i0 = qt * TC_B;
            __syncthreads();
            tc_load_tile(Qs, ldh, q, b, i0, T, H, h, hd, hd16, vec != 0);
            tc_load_tile(Gs, ldh, g, b, i0, T, H, h, hd, hd16, vec != 0);
            if (threadIdx.x < TC_B) {
                const int i = i0 + (int)threadIdx.x;
                Ls[threadIdx.x] = i < T ? lse[lrow + (size_t)i] : 0.0f;
                Dsh[threadIdx.x] = i < T ? D[lrow + (size_t)i] : 0.0f;
            }
            __syncthreads();
            /* S^T = K_w Q^T -> P^T (registers, and bf16 in smem) */
            tc_abt(acc, Ks + (16 * warp) * ldh, ldh, Qs, ldh, hd16);
            tc_store4(Sw, acc);
            __syncwarp();
            float p[32];
            const float *srow = Sw + r * TC_LDS + c0;
            bf16 *prow = Pw + r * TC_LDP + c0;
            for (int c = 0; c < 32; c++) {
                const int i = i0 + c0 + c;
                p[c] = (i >= kj && i < T && kj < T) ? expf(srow[c] * scale - Ls[c0 + c]) : 0.0f;
                prow[c] = __float2bfloat16_rn(p[c]);
            }
            __syncwarp();
            /* dP^T = V_w dO^T -> dS^T */
            tc_abt(acc, Vs + (16 * warp) * ldh, ldh, Gs, ldh, hd16);
            tc_store4(Sw, acc);
            __syncwarp();
            bf16 *dsrow = DSw + r * TC_LDP + c0;
            for (int c = 0; c < 32; c++)
                dsrow[c] = __float2bfloat16_rn(scale * p[c] * (srow[c] - Dsh[c0 + c]));
            __syncwarp();
            tc_pv<NF>(dva, Pw, TC_LDP, Gs, ldh, nf);   /* dV_w += P^T dO */
            tc_pv<NF>(dka, DSw, TC_LDP, Qs, ldh, nf);  /* dK_w += dS^T Q */
            if (dsg) tc_store_ds(dsg, DSw, b, h, H, qt, kt, n_qt);  /* for the dQ product */
        }
    }
    __syncthreads();  /* Q and dO become the staging tiles */
    float *stage = (float *)Qs + warp * 16 * (hd16 + 4);
    tc_write_rows<NF>(dk_b ? NULL : dk, dk_b, stage, dka, nf, b, j0 + 16 * warp, T, K, kvh, hd, hd16);   /* dk_b: bf16 only */
    tc_write_rows<NF>(dv_b ? NULL : dv, dv_b, stage, dva, nf, b, j0 + 16 * warp, T, K, kvh, hd, hd16,
                      ldv_b);   /* dv_b: bf16 only, rows ldv_b apart */
}

/* ---- backward: dQ ---- */
template <int NF>
static __global__ void __launch_bounds__(TC_THREADS)
attn_tc_dq_k(float *dq, bf16 *dq_b, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *g, const float *lse,
             const float *D, int T, int H, int K, int hd, float scale, int vec)
{
    MT_DYN_SMEM(unsigned char, sm);
    const int hd16 = tc_hd16(hd), nf = hd16 / 16, ldh = hd16 + 8;
    bf16 *Qs = (bf16 *)sm;
    bf16 *Gs = Qs + TC_B * ldh;
    bf16 *Ks = Gs + TC_B * ldh;
    bf16 *Vs = Ks + TC_B * ldh;
    float *Ss = (float *)(Vs + TC_B * ldh);
    bf16 *DSs = (bf16 *)(Ss + TC_WARPS * 16 * TC_LDS);
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = (T + TC_B - 1) / TC_B - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int i0 = qt * TC_B;
    float *Sw = Ss + warp * 16 * TC_LDS;
    bf16 *DSw = DSs + warp * 16 * TC_LDP;
    const int r = lane >> 1, c0 = (lane & 1) * 32;
    const int qi = i0 + 16 * warp + r;
    const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
    const float L = qi < T ? lse[lrow + (size_t)qi] : 0.0f, Di = qi < T ? D[lrow + (size_t)qi] : 0.0f;

    tc_load_tile(Qs, ldh, q, b, i0, T, H, h, hd, hd16, vec != 0);
    tc_load_tile(Gs, ldh, g, b, i0, T, H, h, hd, hd16, vec != 0);
    frag_c dqa[NF], acc[4];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(dqa[f], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        const int j0 = kt * TC_B;
        __syncthreads();
        tc_load_tile(Ks, ldh, k, b, j0, T, K, kvh, hd, hd16, vec != 0);
        tc_load_tile(Vs, ldh, v, b, j0, T, K, kvh, hd, hd16, vec != 0);
        __syncthreads();
        tc_abt(acc, Qs + (16 * warp) * ldh, ldh, Ks, ldh, hd16);  /* S = Q_w K^T */
        tc_store4(Sw, acc);
        __syncwarp();
        float p[32];
        const float *srow = Sw + r * TC_LDS + c0;
        for (int c = 0; c < 32; c++) {
            const int j = j0 + c0 + c;
            p[c] = (j <= qi && j < T && qi < T) ? expf(srow[c] * scale - L) : 0.0f;
        }
        __syncwarp();
        tc_abt(acc, Gs + (16 * warp) * ldh, ldh, Vs, ldh, hd16);  /* dP = dO_w V^T */
        tc_store4(Sw, acc);
        __syncwarp();
        bf16 *dsrow = DSw + r * TC_LDP + c0;
        for (int c = 0; c < 32; c++) dsrow[c] = __float2bfloat16_rn(scale * p[c] * (srow[c] - Di));
        __syncwarp();
        tc_pv<NF>(dqa, DSw, TC_LDP, Ks, ldh, nf);  /* dQ_w += dS K */
    }
    __syncthreads();
    float *stage = (float *)Ks + warp * 16 * (hd16 + 4);
    tc_write_rows<NF>(dq_b ? NULL : dq, dq_b, stage, dqa, nf, b, i0 + 16 * warp, T, H, h, hd, hd16);
}

/* ---- backward: dQ from the stored dS tiles (one product per tile) ---- */
template <int NF>
static __global__ void __launch_bounds__(TC_THREADS)
attn_tc_dq_ds_k(float *dq, bf16 *dq_b, const bf16 *dsg, const bf16 *k, int T, int H, int K, int hd, int vec)
{
    MT_DYN_SMEM(unsigned char, sm);
    const int hd16 = tc_hd16(hd), nf = hd16 / 16, ldh = hd16 + 8;
    bf16 *Ks = (bf16 *)sm;
    bf16 *DSt = Ks + TC_B * ldh;  /* (64 keys, TC_LDP) dS^T */
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = (T + TC_B - 1) / TC_B - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, n_qt = (T + TC_B - 1) / TC_B;
    frag_c dqa[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(dqa[f], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        tc_load_tile(Ks, ldh, k, b, kt * TC_B, T, K, kvh, hd, hd16, vec != 0);
        const bf16 *tile = dsg + tc_ds_tile(b, h, H, qt, kt, n_qt);
        for (int e = threadIdx.x; e < TC_B * TC_B / 8; e += TC_THREADS) {
            const int r = e / (TC_B / 8), c8 = (e - r * (TC_B / 8)) * 8;
            *(tc_u128 *)(DSt + r * TC_LDP + c8) = *(const tc_u128 *)(tile + r * TC_B + c8);
        }
        __syncthreads();
        /* dQ_w += dS (16 queries x 64 keys: dS^T read column-major) K */
#pragma unroll
        for (int kk = 0; kk < TC_B; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> fa;
            wmma::load_matrix_sync(fa, DSt + kk * TC_LDP + 16 * warp, TC_LDP);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                if (f >= nf) break;
                frag_b_row fb;
                wmma::load_matrix_sync(fb, Ks + (size_t)kk * (size_t)ldh + 16 * f, (unsigned)ldh);
                wmma::mma_sync(dqa[f], fa, fb, dqa[f]);
            }
        }
    }
    __syncthreads();
    float *stage = (float *)sm + warp * 16 * (hd16 + 4);
    tc_write_rows<NF>(dq_b ? NULL : dq, dq_b, stage, dqa, nf, b, qt * TC_B + 16 * warp, T, H, h, hd, hd16);
}

/* ---- host side ---- */
static size_t tc_up256(size_t b) { return (b + 255) & ~(size_t)255; }

static size_t tc_smem_fwd(int hd16)
{
    return (size_t)3 * TC_B * (hd16 + 8) * 2 + (size_t)TC_WARPS * 16 * TC_LDS * 4 + (size_t)TC_WARPS * 16 * TC_LDP * 2;
}
static size_t tc_smem_dkdv(int hd16)
{
    return (size_t)4 * TC_B * (hd16 + 8) * 2 + (size_t)TC_WARPS * 16 * TC_LDS * 4 +
           (size_t)2 * TC_WARPS * 16 * TC_LDP * 2 + (size_t)2 * TC_B * 4;
}
static size_t tc_smem_dq_ds(int hd16)
{
    /* K tile + dS^T tile; the epilogue's staging (4 x 16 x (hd16+4) floats) fits in both */
    size_t tiles = (size_t)TC_B * (hd16 + 8) * 2 + (size_t)TC_B * TC_LDP * 2;
    size_t stage = (size_t)TC_WARPS * 16 * (hd16 + 4) * 4;
    return tiles > stage ? tiles : stage;
}
static size_t tc_smem_dq(int hd16)
{
    return (size_t)4 * TC_B * (hd16 + 8) * 2 + (size_t)TC_WARPS * 16 * TC_LDS * 4 + (size_t)TC_WARPS * 16 * TC_LDP * 2;
}

#define TC_ROWDOT_THREADS 256   /* tc_rowdot_k: 8 rows a block */

/* bf16 copies of the call's operands in the workspace, each 256-byte aligned */
struct tc_operands {
    bf16 *q, *k, *v, *g;
    float *D;
    bf16 *ds;  /* backward: the dS^T tiles for dQ (NULL: dQ recomputes P and dP) */
    int vec;
};

/* Bytes of the dS^T tiles of a backward call; above the instance's cap
 * (MT_CUDA_ATTN_DS_MB, read at creation; 0: always) dQ recomputes them */
static size_t tc_ds_bytes(int B, int T, int H)
{
    const size_t nt = (size_t)(T + TC_B - 1) / TC_B;
    return (size_t)B * (size_t)H * (nt * (nt + 1) / 2) * TC_B * TC_B * 2;
}
/* The call's bf16 operands: q, k, v in the caller's qkv_b (mt_ops.h) when it
 * is given and 16-byte aligned (the kernels' row loads), else in the
 * workspace; dout, D and the dS tiles (backward) in the workspace. The
 * forward rounds q, k, v; the backward rounds dout, and q, k, v only when
 * they are not the caller's (saved by its forward: the same bits). */
static int tc_stage(struct tc_operands *o, const float *q, const float *k, const float *v, const float *dout,
                    const mt_bf16 *dout_b, int B, int T, int H, int K, int hd, const mt_bf16 *qkv_b)
{
    const int bwd = dout || dout_b;   /* the backward's staging (dout's bf16, D) */
    /* dout given as bf16 (its producer rounded it, mt_ops.h) is read in place when its
     * rows start on 16 bytes; else (fp32, or unaligned) it gets a staging slot */
    const int g_in_place = dout_b && hd % 8 == 0 && ((uintptr_t)dout_b & 15) == 0;
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd;
    /* an operand given as NULL is in qkv_b already (its producer rounded it there, mt_ops.h) */
    const int given = !q || !k || !v, aligned = hd % 8 == 0 && ((uintptr_t)qkv_b & 15) == 0;
    if (given && !qkv_b) {
        MT_CUDA_UNSUPPORTED("attention (bf16): q, k or v NULL without qkv_b");
        return 0;
    }
    const int saved = qkv_b && (given || aligned);
    const size_t bq = tc_up256(nq * 2), bk = tc_up256(nk * 2), bd = bwd ? tc_up256((size_t)B * H * T * 4) : 0;
    const size_t bg = bwd && !g_in_place ? bq : 0;
    const size_t bqkv = saved ? 0 : bq + 2 * bk;
    const size_t bds =
        bwd && tc_ds_bytes(B, T, H) <= mt_cuda_be->attn_ds_cap ? tc_up256(tc_ds_bytes(B, T, H)) : 0;
    const size_t need = bqkv + bg + bd + bds;
    unsigned char *ws = NULL;   /* a forward on the caller's qkv_b needs none (and asks for none: 0 bytes of a */
    if (need && !(ws = (unsigned char *)mt_cuda_workspace(need))) return 0;   /* never grown workspace is NULL) */
    o->ds = bds ? (bf16 *)(ws + bqkv + bg + bd) : NULL;
    if (saved) {
        o->q = (bf16 *)qkv_b;
        o->k = o->q + nq;   /* nq * 2 bytes: a multiple of 16 when hd % 8 == 0 */
        o->v = o->k + nk;
    } else {
        o->q = (bf16 *)ws;
        o->k = (bf16 *)(ws + bq);
        o->v = (bf16 *)(ws + bq + bk);
    }
    o->g = g_in_place ? (bf16 *)dout_b : bg ? (bf16 *)(ws + bqkv) : NULL;
    o->D = bwd ? (float *)(ws + bqkv + bg) : NULL;
    /* 256-byte workspace / 16-byte qkv_b: rows start on 16 bytes when hd % 8 == 0 */
    o->vec = hd % 8 == 0 && (!saved || aligned);
    /* the roundings in one launch (cast_bf16_multi: the same bits as one cast each); the
     * backward's q, k, v are saved, and an operand given as NULL is rounded already */
    mt_bf16 *dst[4];
    const float *src[4];
    size_t n[4];
    int c = 0;
    const float *from[4] = {q, k, v, dout};
    mt_bf16 *to[4] = {(mt_bf16 *)o->q, (mt_bf16 *)o->k, (mt_bf16 *)o->v, (mt_bf16 *)o->g};
    const size_t len[4] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        if (!from[i] || (i < 3 && saved && bwd)) continue;
        dst[c] = to[i], src[c] = from[i], n[c++] = len[i];
    }
    if (c) mt_cuda_cast_bf16_multi(mt_cuda_be, dst, src, n, c);
    if (dout_b && !g_in_place &&   /* unaligned: copied into its slot */
        !MT_CUDA_OK(cudaMemcpyAsync(o->g, dout_b, nq * 2, cudaMemcpyDeviceToDevice, mt_cuda_be->stream)))
        return 0;
    return 1;
}

/* D (B,H,T) = rowwise bf16(dout) . bf16(out) summed in fp32 (FlashAttention-2's
 * D: the operands the products see); g: bf16(dout) (the staged operand), out
 * as bf16 (out_b) or fp32 (rounded as read). One warp per (b, t, h) row, the
 * lanes' strided sums then the warp's tree (attention.cu's rowdot order) */
static __global__ void tc_rowdot_k(float *D, const bf16 *g, const float *out, const bf16 *out_b, int B, int T, int H,
                                   int hd)
{
    const size_t row = (size_t)blockIdx.x * (TC_ROWDOT_THREADS / MT_WARP) + threadIdx.x / MT_WARP;
    const int lane = threadIdx.x % MT_WARP;
    if (row >= (size_t)B * (size_t)T * (size_t)H) return;
    const size_t at = row * (size_t)hd;
    float acc = 0.0f;
    for (int d = lane; d < hd; d += MT_WARP) {
        const float o = out_b ? __bfloat162float(out_b[at + d]) : __bfloat162float(__float2bfloat16_rn(out[at + d]));
        acc += __bfloat162float(g[at + d]) * o;
    }
    acc = mt_warp_sum(acc);
    if (lane == 0) {
        const size_t h = row % (size_t)H, bt = row / (size_t)H, t = bt % (size_t)T, b = bt / (size_t)T;
        D[(b * (size_t)H + h) * (size_t)T + t] = acc;
    }
}

static void tc_rowdot(float *D, const bf16 *g, const float *out, const mt_bf16 *out_b, int B, int T, int H, int hd)
{
    const size_t rows = (size_t)B * (size_t)T * (size_t)H, per = TC_ROWDOT_THREADS / MT_WARP;
    MT_LAUNCH(tc_rowdot_k, (unsigned)((rows + per - 1) / per), TC_ROWDOT_THREADS, 0)(D, g, out, (const bf16 *)out_b, B,
                                                                                   T, H, hd);
    MT_CUDA_KCHECK();
}

template <int NF>
static void tc_fwd_launch(float *out, bf16 *out_b, float *lse, const struct tc_operands *o, int B, int T, int H,
                          int K, int hd)
{
    const size_t smem = tc_smem_fwd(tc_hd16(hd));
    if (!mt_cuda_smem_opt_in(attn_tc_fwd_k<NF>, smem)) return;
    const dim3 grid = mt_attn_grid((T + TC_B - 1) / TC_B, B * H, 4ll * T * hd);   /* K, V re-read */
    MT_LAUNCH(attn_tc_fwd_k<NF>, grid, TC_THREADS, smem)(out, out_b, lse, o->q, o->k, o->v, T, H, K, hd,
                                                         1.0f / sqrtf((float)hd), o->vec);
    MT_CUDA_KCHECK();
}

template <int NF>
static void tc_bwd_launch(float *dq, bf16 *dq_b, float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, const float *lse,
                          const struct tc_operands *o, int B, int T, int H, int K, int hd, int ldv_b)
{
    const int hd16 = tc_hd16(hd);
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t s_kv = tc_smem_dkdv(hd16), s_q = o->ds ? tc_smem_dq_ds(hd16) : tc_smem_dq(hd16);
    if (!mt_cuda_smem_opt_in(attn_tc_dkdv_k<NF>, s_kv)) return;
    if (o->ds ? !mt_cuda_smem_opt_in(attn_tc_dq_ds_k<NF>, s_q) : !mt_cuda_smem_opt_in(attn_tc_dq_k<NF>, s_q)) return;
    const int nt = (T + TC_B - 1) / TC_B;
    const dim3 g_kv = mt_attn_grid(nt, B * K, 4ll * T * hd * (H / K)), g_q = mt_attn_grid(nt, B * H, 4ll * T * hd);
    MT_LAUNCH(attn_tc_dkdv_k<NF>, g_kv, TC_THREADS, s_kv)(
        dk, dk_b, dv, dv_b, o->ds, o->q, o->k, o->v, o->g, lse, o->D, T, H, K, hd, scale, o->vec, ldv_b);
    MT_CUDA_KCHECK();
    if (o->ds) {  /* dQ = dS K from the tiles the dK/dV kernel stored */
        MT_LAUNCH(attn_tc_dq_ds_k<NF>, g_q, TC_THREADS, s_q)(
            dq, dq_b, o->ds, o->k, T, H, K, hd, o->vec);
    } else {      /* over the cap: recompute S, P, dP per tile */
        mt_cuda_be->info.attention_dq_recompute++;
        MT_LAUNCH(attn_tc_dq_k<NF>, g_q, TC_THREADS, s_q)(
            dq, dq_b, o->q, o->k, o->v, o->g, lse, o->D, T, H, K, hd, scale, o->vec);
    }
    MT_CUDA_KCHECK();
}

/* attn_kernel=v2 (the instance's choice) runs attention_v2.cu for head dims
 * 64 and 128; any other head dim runs v1, counted and named */
static int tc_use_v2(int hd)
{
    if (!mt_cuda_be->attn_v2) return 0;
    if (mt_attn_v2_supports(hd)) {
        mt_cuda_be->info.attention_v2_calls++;
        return 1;
    }
    mt_cuda_be->info.attention_v2_fallbacks++;
    mt_cuda_be->info.attention_v2_fallback_hd = hd;
    return 0;
}

static int tc_shape_ok(int H, int K, int hd)
{
    if (hd < 1 || K < 1 || H % K != 0) {
        MT_CUDA_UNSUPPORTED("attention (bf16): head dim must be >= 1 and H a multiple of K");
        return 0;
    }
    return 1;
}

/* The fp32 fallback (hd > 128) wants fp32 operands: q, k, v given as NULL
 * (already in qkv_b), dout, out given as NULL (dout_b, out_b: the backward's
 * bf16 forms, mt_ops.h) are widened into the workspace past its first `skip`
 * bytes (the fp32 backward's own rowdot scratch, which it takes from the same
 * grow-only workspace's base); out32 (the forward with out NULL): room there
 * for the fp32 out. Returns 0 on a failure (recorded). */
static int fp32_operands(void *be, const float **q, const float **k, const float **v, const float **dout,
                         const mt_bf16 *dout_b, const float **out, const mt_bf16 *out_b, const mt_bf16 *qkv_b,
                         size_t nq, size_t nk, size_t skip, float **out32)
{
    const float **op[5] = {q, k, v, dout, out};
    const mt_bf16 *src[5] = {qkv_b, qkv_b ? qkv_b + nq : NULL, qkv_b ? qkv_b + nq + nk : NULL, dout_b, out_b};
    const size_t len[5] = {nq, nk, nk, nq, nq};
    size_t need = 0;
    for (int i = 0; i < 5; i++) {
        if (!op[i] || *op[i]) continue;
        if (!src[i]) {
            MT_CUDA_UNSUPPORTED(i < 3 ? "attention (bf16): q, k or v NULL without qkv_b"
                                      : "attention (bf16): dout or out NULL without its bf16 form");
            return 0;
        }
        need += len[i];
    }
    if (!need && !out32) return 1;
    skip = tc_up256(skip);
    unsigned char *ws = (unsigned char *)mt_cuda_workspace(skip + (need + (out32 ? nq : 0)) * sizeof(float));
    if (!ws) return 0;
    float *w = (float *)(ws + skip);
    for (int i = 0; i < 5; i++)
        if (op[i] && !*op[i]) {
            mt_cuda_widen_bf16(be, w, src[i], len[i]);
            *op[i] = w;
            w += len[i];
        }
    if (out32) *out32 = w;
    return 1;
}

extern "C" void mt_cuda_attention_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *lse, const float *q,
                                               const float *k, const float *v, int B, int T, int H, int K, int hd,
                                               mt_bf16 *qkv_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (!tc_shape_ok(H, K, hd)) return;
    if (hd > 128) {  /* no tensor-core tiles for it: the fp32 kernels, counted */
        mt_cuda_be->info.attention_fp32_fallbacks++;
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd;
        float *o32 = out;   /* out NULL (out_bf16 alone, mt_ops.h): fp32 past the operands */
        if (!fp32_operands(be, &q, &k, &v, NULL, NULL, NULL, NULL, qkv_b, nq, nk, 0, out ? NULL : &o32)) return;
        mt_cuda_attention_forward(be, o32, lse, q, k, v, B, T, T, 0, H, K, hd);
        if (out_bf16) mt_cuda_cast_bf16(be, out_bf16, o32, nq);
        return;
    }
    struct tc_operands o;
    if (!tc_stage(&o, q, k, v, NULL, NULL, B, T, H, K, hd, qkv_b)) return;
    mt_cuda_be->info.attention_tc_calls++;
    if (tc_use_v2(hd)) {  /* attention_v2.cu: FlashAttention-2-class, one pass */
        mt_attn_v2_forward(out, out_bf16, lse, (const mt_bf16 *)o.q, (const mt_bf16 *)o.k, (const mt_bf16 *)o.v, B, T,
                           H, K, hd);
        return;
    }
    if (hd <= 64) tc_fwd_launch<4>(out, (bf16 *)out_bf16, lse, &o, B, T, H, K, hd);
    else          tc_fwd_launch<8>(out, (bf16 *)out_bf16, lse, &o, B, T, H, K, hd);
}

extern "C" void mt_cuda_attention_backward_bf16(void *be, float *dq, float *dk, float *dv, const float *dout,
                                                const float *q, const float *k, const float *v, const float *out,
                                                const float *lse, int B, int T, int H, int K, int hd,
                                                const mt_bf16 *qkv_b, mt_bf16 *dv_b, const mt_bf16 *dout_b,
                                                const mt_bf16 *out_b, mt_bf16 *dq_b, mt_bf16 *dk_b, int ldv_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (!tc_shape_ok(H, K, hd)) return;
    if (ldv_b < 0 || (ldv_b && (ldv_b < K * hd || (ldv_b & 1) || !mt_cuda_aligned(dv_b, 4)))) {
        MT_CUDA_UNSUPPORTED("attention (bf16): ldv_b must be 0 or even and >= K hd, dv_b 4-byte aligned");
        return;
    }
    if (dout_b) dout = NULL;   /* the bf16 forms win (mt_ops.h) */
    if (out_b) out = NULL;
    if ((!dout && !dout_b) || (!out && !out_b)) {
        MT_CUDA_UNSUPPORTED("attention (bf16): backward without dout or out (fp32 or bf16)");
        return;
    }
    if (hd > 128) {   /* (D from the fp32 values it gets: the fp32 kernels' rowdot) */
        mt_cuda_be->info.attention_fp32_fallbacks++;
        const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd;
        if (!fp32_operands(be, &q, &k, &v, &dout, dout_b, &out, out_b, qkv_b, nq, nk, (size_t)B * T * H * sizeof(float),
                           NULL))
            return;
        mt_cuda_attention_backward(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, hd);
        /* dv scratch: rounded once (rows ldv_b apart) */
        if (dv_b) mt_cuda_cast_bf16_rows(be, dv_b, (size_t)ldv_b, dv, (size_t)B * T, (size_t)K * hd);
        if (dq_b) mt_cuda_cast_bf16(be, dq_b, dq, (size_t)B * T * H * hd);   /* ... and dq, dk */
        if (dk_b) mt_cuda_cast_bf16(be, dk_b, dk, (size_t)B * T * K * hd);
        return;
    }
    struct tc_operands o;
    const int v2 = tc_use_v2(hd);
    if (!tc_stage(&o, q, k, v, dout, dout_b, B, T, H, K, hd, qkv_b)) return;
    tc_rowdot(o.D, o.g, out, out_b, B, T, H, hd);
    mt_cuda_be->info.attention_tc_calls++;
    if (v2) {
        mt_attn_v2_backward(dq, dq_b, dk, dk_b, dv, dv_b, (mt_bf16 *)o.ds, (const mt_bf16 *)o.q, (const mt_bf16 *)o.k,
                            (const mt_bf16 *)o.v, (const mt_bf16 *)o.g, lse, o.D, B, T, H, K, hd, ldv_b);
        return;
    }
    bf16 *qb = (bf16 *)dq_b, *kb = (bf16 *)dk_b, *vb = (bf16 *)dv_b;
    if (hd <= 64) tc_bwd_launch<4>(dq, qb, dk, kb, dv, vb, lse, &o, B, T, H, K, hd, ldv_b);
    else          tc_bwd_launch<8>(dq, qb, dk, kb, dv, vb, lse, &o, B, T, H, K, hd, ldv_b);
}
