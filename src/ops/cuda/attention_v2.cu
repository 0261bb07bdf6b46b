/*
 * attention_v2.cu — FlashAttention-2-class causal GQA attention for
 * precision=bf16 (knob attn_kernel=v2, the default; attention_tc.cu holds
 * v1, the entries and the operand staging). Same layouts and contract as
 * attention_tc.cu: q, out, dout, dq (B,T,H,hd); k, v, dk, dv (B,T,K,hd); lse
 * (B,H,T); query head h reads kv head h / (H/K) (K/V never repeated);
 * scale = 1/sqrt(hd); Tq == Tk == T. Head dims 64 and 128 (a template
 * parameter HD); others run v1 (counted: attention_v2_fallbacks).
 *
 * Rounding points (c = scale log2(e), one fp32 constant; "2^" = exp2f):
 *   q, k, v, dout -> bf16 once per call (attention_tc.cu stages them)
 *   x_ij = c sum_d q_id k_jd                  (fp32 accumulation: base-2 score)
 * forward, one pass (online softmax, m the running row max of x):
 *   pt_ij = 2^(x_ij - m_i)                    (fp32; bf16(pt) feeds P V)
 *   l_i  = sum_j pt_ij, O_i = sum_j bf16(pt_ij) v_j, both rescaled by
 *          2^(m_old - m_new) whenever the max grows (fp32)
 *   out_i = O_i / l_i;  lse_i = (m_i + log2 l_i) ln 2
 * backward (as v1, from the stored lse: p normalised, nothing rescaled):
 *   p_ij = 2^(x_ij - lse_i log2 e)            (bf16(p) feeds P^T dO)
 *   dp_ij = sum_d dout_id v_jd;  D_i = dout_i . out_i (fp32 operands)
 *   ds_ij = scale p_ij (dp_ij - D_i)          (bf16(ds) feeds dS K and dS^T Q)
 * v1 rounds the normalised p to bf16; v2 rounds pt = p l / 2^(...) , the
 * same value up to a per-row factor: bf16's relative error does not depend
 * on the scale, so the first-order bound of docs/cuda.md ("Attention on
 * tensor cores") holds term by term; what v2 adds is fp32 roundoff only
 * (the rescale factors multiply O and l alike and cancel in O / l to first
 * order; c = scale log2 e rounded once: |x| u32 relative on p, inside the
 * score term's (hd+2) u32 |s|). tests/test_attn_bf16.c checks v2 against
 * the fp64 reference within that bound (docs/cuda.md derives it).
 *
 * HOW IT WORKS
 *
 * Warp-level mma.sync m16n8k16 (mma_sync.cuh: PTX ISA register layouts,
 * emulated exactly by tests/cuda/emu/mma_ptx.h) instead of wmma: an
 * accumulator's elements are known, so the softmax runs on them in
 * registers and P is re-packed as the A operand of P V without touching
 * shared memory. Blocks are 4 warps (128 threads) on 64-row tiles; a warp
 * owns 16 rows; lane l holds rows g = l/4 and g+8 of its warp's 16 and, per
 * n8 tile, the columns 2t, 2t+1 (t = l%4): a row's max and sum are reduced
 * over its 4-lane quad with two __shfl_xor_sync. Tiles move global ->
 * shared by cp.async (16 bytes, rows past T zero-filled), double-buffered:
 * the next key (or query) tile loads while this one is multiplied; shared
 * rows are padded by 8 bf16 (row stride = 16 mod 128 bytes: the 8 row
 * addresses of an ldmatrix hit 8 different bank groups). Operand fragments
 * come from shared memory by ldmatrix (x4: four 8x8 matrices per
 * instruction; .trans for operands whose k runs down the rows, V in P V).
 *
 * Forward, block = (query tile, head, batch), query tiles launched longest
 * first: Q's A fragments are re-read from shared memory per key tile (8 of
 * the 72 ldmatrix of a tile at hd 128; holding them would cost 32 more
 * registers); per key tile up to the diagonal: S = Q K^T (8 n8 tiles), x = c S, only the diagonal tile
 * masks (key > query -> -inf; every row sees key i0 <= i, so no row is
 * empty), m' = max(m, rowmax), alpha = 2^(m - m'), pt = 2^(x - m'), l = alpha
 * l + sum pt (per lane; the quad sum comes once at the end), O = alpha O +
 * bf16(pt) V. One QK^T per tile (v1 needed two passes).
 * Backward (deterministic: no atomics, fixed loop order), D = rowdot(dout,
 * out) first (attention.cu):
 *   dK/dV: block = (key tile, kv head, batch); warp w owns keys 16w..16w+15;
 *     loops over the heads of the GQA group, then query tiles from the
 *     diagonal, in that fixed order (K/V read once per group, never
 *     repeated): S^T = K_w Q^T, P^T, dP^T = V_w dO^T, dS^T in registers;
 *     dV_w += bf16(P^T) dO, dK_w += bf16(dS^T) Q with P^T, dS^T re-packed as
 *     A operands; Q and dO tiles (and their lse, D) double-buffered;
 *     and, given room (attention_tc.cu: MT_CUDA_ATTN_DS_MB), bf16(dS^T) as a
 *     64 x 64 tile [key][query] per (query tile, key tile) pair.
 *   dQ: block = (query tile, head, batch); per key tile up to the diagonal:
 *     dQ_w += bf16(dS) K from the stored tile (attn_v2_dq_ds_k: 5 tile
 *     products per tile pair in the backward); without room, S, P, dP, dS
 *     recomputed in registers (attn_v2_dq_k: 7), the same bits.
 * No float atomics (FlashAttention-2 adds dQ with them; not deterministic).
 */
#include "cuda_impl.cuh"
#include "mma_sync.cuh"
#include "attn_online.cuh"
#include "attn_sched.cuh"

#include <math.h>

#define V2_B       64   /* rows of a query tile = keys of a key tile */
#define V2_WARPS   4
#define V2_THREADS (V2_WARPS * MT_WARP)

typedef __nv_bfloat16 bf16;

static const float V2_LOG2E = 1.4426950408889634f;

/* rows [r0, r0 + 64) of one head of a (B,T,nh,HD) bf16 tensor into a shared
 * tile (64, HD + 8), asynchronously; rows past T are zeros */
template <int HD>
static __device__ __forceinline__ void v2_load_tile(bf16 *dst, const bf16 *src, int b, int r0, int T, int nh,
                                                    int head)
{
    constexpr int LD = HD + 8, CPR = HD / 8;
    const size_t rstride = (size_t)nh * HD;
    const bf16 *base = src + (size_t)b * (size_t)T * rstride + (size_t)head * HD;
    for (int e = threadIdx.x; e < V2_B * CPR; e += V2_THREADS) {
        const int r = e / CPR, c8 = (e - r * CPR) * 8;
        const bool ok = r0 + r < T;
        mt_cp_async16(dst + r * LD + c8, ok ? base + (size_t)(r0 + r) * rstride + c8 : base, ok ? 16 : 0);
    }
}

/* The ldmatrix x4 row address of lane l for the A operand (16x16) at rows
 * r0.., columns c0.. of a shared tile: matrices (rows 0-7, c0), (8-15, c0),
 * (0-7, c0+8), (8-15, c0+8) = a0..a3 */
template <int LD>
static __device__ __forceinline__ const bf16 *v2_a_addr(const bf16 *s, int r0, int c0, int lane)
{
    const int i = lane >> 3;
    return s + (r0 + (i & 1) * 8 + (lane & 7)) * LD + c0 + (i >> 1) * 8;
}
/* ... for the B operands of two n8 tiles whose n runs down the rows (n0..n0+15)
 * and k along them (k0..k0+15), non-trans: matrices (n0, k0) (n0, k0+8)
 * (n0+8, k0) (n0+8, k0+8) = b0, b1 of tile n0, b0, b1 of tile n0+8 */
template <int LD>
static __device__ __forceinline__ const bf16 *v2_bn_addr(const bf16 *s, int n0, int k0, int lane)
{
    const int i = lane >> 3;
    return s + (n0 + (i >> 1) * 8 + (lane & 7)) * LD + k0 + (i & 1) * 8;
}
/* ... whose k runs down the rows (k0..k0+15) and n along them (n0..n0+15),
 * .trans: matrices (k0, n0) (k0+8, n0) (k0, n0+8) (k0+8, n0+8) = the same order */
template <int LD>
static __device__ __forceinline__ const bf16 *v2_bk_addr(const bf16 *s, int k0, int n0, int lane)
{
    const int i = lane >> 3;
    return s + (k0 + (i & 1) * 8 + (lane & 7)) * LD + n0 + (i >> 1) * 8;
}

/* acc[MW][8][4] (16 MW x 64) = A B^T: A the 16 MW rows at a_row0 of shared
 * tile A, B the 64 rows of shared tile Bt, both (.., LD) over HD columns. A B
 * fragment pair is loaded once and used by all MW row tiles (v3, MW = 2: half
 * the shared-memory reads of B per product). */
template <int HD, int MW>
static __device__ __forceinline__ void v2_abt_m(float acc[MW][8][4], const bf16 *A, int a_row0, const bf16 *Bt,
                                                int lane)
{
    constexpr int LD = HD + 8;
#pragma unroll
    for (int mi = 0; mi < MW; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][j][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD; kk += 16) {
        uint32_t a[MW][4];
#pragma unroll
        for (int mi = 0; mi < MW; mi++) mt_ldsm_x4(a[mi], v2_a_addr<LD>(A, a_row0 + 16 * mi, kk, lane));
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t r[4];
            mt_ldsm_x4(r, v2_bn_addr<LD>(Bt, 16 * np, kk, lane));
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
            for (int mi = 0; mi < MW; mi++) {
                mt_mma_16816(acc[mi][2 * np], a[mi], b0);
                mt_mma_16816(acc[mi][2 * np + 1], a[mi], b1);
            }
        }
    }
}

/* the one-row-tile form (the backward kernels' warps own 16 rows) */
template <int HD>
static __device__ __forceinline__ void v2_abt(float acc[8][4], const bf16 *A, int a_row0, const bf16 *Bt, int lane)
{
    v2_abt_m<HD, 1>((float(*)[8][4])acc, A, a_row0, Bt, lane);
}

/* out[MW][HD/8][4] += A B for one k step of 16 (rows 16 s.. of a shared tile
 * Bs (64, LD) whose k runs down the rows: .trans): a[MW] the A operands of
 * the MW row tiles; each B fragment pair feeds all of them */
template <int HD, int MW>
static __device__ __forceinline__ void v2_mma_bk(float out[MW][HD / 8][4], const uint32_t a[MW][4], const bf16 *Bs,
                                                 int s, int lane)
{
    constexpr int LD = HD + 8;
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
        uint32_t r[4];
        mt_ldsm_x4_t(r, v2_bk_addr<LD>(Bs, 16 * s, 16 * np, lane));
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
        for (int mi = 0; mi < MW; mi++) {
            mt_mma_16816(out[mi][2 * np], a[mi], b0);
            mt_mma_16816(out[mi][2 * np + 1], a[mi], b1);
        }
    }
}

/* out[MW][HD/8][4] (16 MW x HD) += P B: P (16 MW x 64) given as accumulator
 * tiles p[MW][8][4] (rounded to bf16 here: the A operands), B the 64 rows of
 * a shared tile (64, LD); each B fragment pair serves all MW row tiles */
template <int HD, int MW>
static __device__ __forceinline__ void v2_pv_m(float out[MW][HD / 8][4], const float p[MW][8][4], const bf16 *Bs,
                                               int lane)
{
    uint32_t a[4][MW][4];   /* P as bf16 A operands first: the fp32 P is dead before the products */
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int mi = 0; mi < MW; mi++) {
            a[s][mi][0] = mt_pack_bf16(p[mi][2 * s][0], p[mi][2 * s][1]);
            a[s][mi][1] = mt_pack_bf16(p[mi][2 * s][2], p[mi][2 * s][3]);
            a[s][mi][2] = mt_pack_bf16(p[mi][2 * s + 1][0], p[mi][2 * s + 1][1]);
            a[s][mi][3] = mt_pack_bf16(p[mi][2 * s + 1][2], p[mi][2 * s + 1][3]);
        }
#pragma unroll
    for (int s = 0; s < 4; s++) v2_mma_bk<HD, MW>(out, a[s], Bs, s, lane);
}

template <int HD>
static __device__ __forceinline__ void v2_pv(float out[HD / 8][4], const float p[8][4], const bf16 *Bs, int lane)
{
    v2_pv_m<HD, 1>((float(*)[HD / 8][4])out, (const float(*)[8][4])p, Bs, lane);
}

/* acc[N][4] = 0 (N n8 accumulator tiles) */
template <int N>
static __device__ __forceinline__ void v2_zero(float acc[N][4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
}

/* one key tile of a forward warp (its rows w0.. as MW row tiles): S = Q K^T,
 * the mask on its diagonal tile wlast, the online softmax, O += P V; nothing
 * past wlast (-1: rows past T) */
template <int HD, int MW>
static __device__ MT_WARP_STEP void v2_fwd_step(float (&o)[MW][HD / 8][4], float (&m)[MW][2], float (&l)[MW][2],
                                                const bf16 *Qs, const bf16 *Kb, const bf16 *Vb, int kt, int wlast,
                                                int w0, int warp, int lane, float c)
{
    if (kt > wlast) return;
    const int g = lane >> 2, t = lane & 3;
    float s[MW][8][4];
    v2_abt_m<HD, MW>(s, Qs, 16 * MW * warp, Kb, lane);
    const int j0 = kt * V2_B;
#pragma unroll
    for (int mi = 0; mi < MW; mi++) {
        const int row0 = w0 + 16 * mi + g;  /* this lane's rows: row0, row0 + 8 */
        float alpha[2];
        mt_attn_online_tile(s[mi], m[mi], l[mi], alpha, kt == wlast, j0, row0, t, c);
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mi][j][e] *= alpha[e >> 1];
    }
    v2_pv_m<HD, MW>(o, s, Vb, lane);
}

/* ---- forward ----
 * A block of 4 warps owns 64 MW query rows (v2: MW 1, v3: MW 2), a warp the
 * 16 MW rows w0.. as MW row tiles of 16. Key tiles of 64 run from 0 to the
 * block's last; a warp computes on tile kt only up to its own diagonal tile
 * w0 / 64 (past it every key is later than its rows: skipped, not masked), and
 * masks on that tile alone, so each row sees exactly the tiles, order and
 * operations of MW 1: v3's bits are v2's. */
template <int HD, int MW>
static __global__ void __launch_bounds__(V2_THREADS)
attn_v2_fwd_k(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int H, int K,
              float c)
{
    constexpr int LD = HD + 8, TILE = V2_B * LD, QROWS = V2_B * MW;
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *Qs = (bf16 *)sm;         /* QROWS rows */
    bf16 *Ks = Qs + MW * TILE;     /* 2 buffers */
    bf16 *Vs = Ks + 2 * TILE;      /* 2 buffers */
    const int n_qt = (T + QROWS - 1) / QROWS;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = n_qt - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP, g = lane >> 2, t = lane & 3;
    const int i0 = qt * QROWS, w0 = i0 + 16 * MW * warp;  /* this warp's rows w0 .. w0 + 16 MW - 1 */
    const int wlast = w0 < T ? w0 / V2_B : -1;            /* its diagonal key tile (none: rows past T) */
    const int n_kt = ((i0 + QROWS < T ? i0 + QROWS : T) - 1) / V2_B + 1;

#pragma unroll
    for (int mi = 0; mi < MW; mi++) v2_load_tile<HD>(Qs + mi * TILE, q, b, i0 + V2_B * mi, T, H, h);
    v2_load_tile<HD>(Ks, k, b, 0, T, K, kvh);
    v2_load_tile<HD>(Vs, v, b, 0, T, K, kvh);
    mt_cp_async_commit();

    float o[MW][HD / 8][4];
#pragma unroll
    for (int mi = 0; mi < MW; mi++) v2_zero<HD / 8>(o[mi]);
    float m[MW][2], l[MW][2];
#pragma unroll
    for (int mi = 0; mi < MW; mi++) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;
    for (int kt = 0; kt < n_kt; kt++) {
        const bf16 *Kb = Ks + (kt & 1) * TILE, *Vb = Vs + (kt & 1) * TILE;
        if (kt + 1 < n_kt) {  /* the next key tile loads while this one is used */
            v2_load_tile<HD>(Ks + ((kt + 1) & 1) * TILE, k, b, (kt + 1) * V2_B, T, K, kvh);
            v2_load_tile<HD>(Vs + ((kt + 1) & 1) * TILE, v, b, (kt + 1) * V2_B, T, K, kvh);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        v2_fwd_step<HD, MW>(o, m, l, Qs, Kb, Vb, kt, wlast, w0, warp, lane, c);
        __syncthreads();  /* every warp is done with this buffer before it is refilled */
    }
#pragma unroll
    for (int mi = 0; mi < MW; mi++) {
        mt_attn_online_end<HD>(o[mi], m[mi], l[mi], lse, b, h, T, H, w0 + 16 * mi + g, t);
        mt_attn_write_rows<HD>(out, out_b, o[mi], b, w0 + 16 * mi, T, H, h, lane);
    }
}

/* ---- backward: dK, dV ---- */
/* one (head, query tile) item of a dK/dV block into buffer set `buf`:
 * Q and dO tiles (async), lse (base 2; +inf past T: p = 0) and D (plain) */
template <int HD>
static __device__ __forceinline__ void v2_dkdv_fetch(bf16 *Qb, bf16 *Gb, float *Lb, float *Db, const bf16 *q,
                                                     const bf16 *g, const float *lse, const float *D, int b, int h,
                                                     int i0, int T, int H)
{
    v2_load_tile<HD>(Qb, q, b, i0, T, H, h);
    v2_load_tile<HD>(Gb, g, b, i0, T, H, h);
    mt_attn_fetch_lse_d(Lb, Db, lse, D, b, h, i0, T, H);
}

template <int HD>
static __global__ void __launch_bounds__(V2_THREADS)
attn_v2_dkdv_k(float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, bf16 *ds, const bf16 *q, const bf16 *k, const bf16 *v,
               const bf16 *g, const float *lse, const float *D, int T, int H, int K, float scale, float c, int ldv_b)
{
    constexpr int LD = HD + 8, TILE = V2_B * LD;
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *Ks = (bf16 *)sm;
    bf16 *Vs = Ks + TILE;
    bf16 *Qs = Vs + TILE;      /* 2 buffers */
    bf16 *Gs = Qs + 2 * TILE;  /* 2 buffers */
    float *Ls = (float *)(Gs + 2 * TILE);  /* 2 x 64 */
    float *Ds = Ls + 2 * V2_B;             /* 2 x 64 */
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* kt 0 (the most work) first (attn_sched.cuh) */
    const int kt = sl.rank, kvh = sl.pair % K, b = sl.pair / K, grp = H / K;
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP, g4 = lane >> 2, t = lane & 3;
    const int j0 = kt * V2_B, key0 = j0 + 16 * warp + g4;  /* this lane's keys: key0, key0 + 8 */
    const int n_qt = (T + V2_B - 1) / V2_B, per_h = n_qt - kt, n_it = grp * per_h;

    v2_load_tile<HD>(Ks, k, b, j0, T, K, kvh);
    v2_load_tile<HD>(Vs, v, b, j0, T, K, kvh);
    v2_dkdv_fetch<HD>(Qs, Gs, Ls, Ds, q, g, lse, D, b, kvh * grp, j0, T, H);
    mt_cp_async_commit();

    float dka[HD / 8][4], dva[HD / 8][4];
    v2_zero<HD / 8>(dka);
    v2_zero<HD / 8>(dva);
    for (int it = 0; it < n_it; it++) {  /* heads of the group, then query tiles from the diagonal */
        const int qt = kt + it % per_h, i0 = qt * V2_B, buf = it & 1;
        const bf16 *Qb = Qs + buf * TILE, *Gb = Gs + buf * TILE;
        const float *Lb = Ls + buf * V2_B, *Db = Ds + buf * V2_B;
        if (it + 1 < n_it) {
            const int nb = (it + 1) & 1;
            v2_dkdv_fetch<HD>(Qs + nb * TILE, Gs + nb * TILE, Ls + nb * V2_B, Ds + nb * V2_B, q, g, lse, D, b,
                              kvh * grp + (it + 1) / per_h, (kt + (it + 1) % per_h) * V2_B, T, H);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        float s[8][4], dp[8][4];
        v2_abt<HD>(s, Ks, 16 * warp, Qb, lane);   /* S^T = K_w Q^T */
        v2_abt<HD>(dp, Vs, 16 * warp, Gb, lane);  /* dP^T = V_w dO^T */
        mt_attn_bwd_tile(s, dp, Lb, Db, qt == kt, i0, key0, t, c, scale);   /* P^T, dS^T */
        if (ds) {   /* dS^T as the A operand below rounds it: the dQ kernel's tile */
            uint32_t da[4][4];
            mt_attn_pack_a(da, dp);
            mt_attn_store_ds(ds + mt_attn_ds_tile(b, kvh * grp + it / per_h, qt, kt, H, n_qt), da, warp, lane);
        }
        v2_pv<HD>(dva, s, Gb, lane);   /* dV_w += P^T dO */
        v2_pv<HD>(dka, dp, Qb, lane);  /* dK_w += dS^T Q */
        __syncthreads();  /* the buffer is consumed before it is refilled */
    }
    mt_attn_write_rows<HD>(dk_b ? NULL : dk, dk_b, dka, b, j0 + 16 * warp, T, K, kvh, lane);   /* dk_b: bf16 only */
    mt_attn_write_rows<HD>(dv_b ? NULL : dv, dv_b, dva, b, j0 + 16 * warp, T, K, kvh, lane,
                           ldv_b);   /* dv_b: bf16 only */
}

/* ---- backward: dQ from the stored dS^T tiles (5 products a tile pair, not 7) ----
 * The dK/dV kernel stores each (query tile, key tile) pair's dS^T, bf16, as the
 * 64 x 64 tile [key][query] at v2_ds_tile (pairs kt <= qt in row order, per
 * (b, h)): the same bf16 values its dK product rounds. dQ_w = sum_kt dS_w K_kt
 * with dS_w (16 queries x 64 keys) read from the [key][query] tile by
 * ldmatrix .trans as A operands, K as in P V. Keys past T: their K rows are
 * zero-filled, so their dS entries (not masked there) add nothing. */
/* one key tile of a dQ warp: dQ_w += dS_w K with dS_w (its 16 MW queries from
 * column wc of its [key][query] tile Sb) by ldmatrix .trans; nothing past wlast */
template <int HD, int MW>
static __device__ MT_WARP_STEP void v2_dq_ds_step(float (&dqa)[MW][HD / 8][4], const bf16 *Sb, const bf16 *Kb, int kt,
                                                  int wlast, int wc, int lane)
{
    constexpr int LS = V2_B + 8;
    if (kt > wlast) return;
    const int mi8 = lane >> 3, r8 = lane & 7;
#pragma unroll
    for (int s = 0; s < 4; s++) {   /* keys 16s.. */
        uint32_t a[MW][4];   /* A (queries wc + 16 mi.., keys 16s..) from [key][query]: .trans */
#pragma unroll
        for (int mi = 0; mi < MW; mi++)
            mt_ldsm_x4_t(a[mi], Sb + (16 * s + (mi8 >> 1) * 8 + r8) * LS + wc + 16 * mi + (mi8 & 1) * 8);
        v2_mma_bk<HD, MW>(dqa, a, Kb, s, lane);
    }
}

template <int HD, int MW>
static __global__ void __launch_bounds__(V2_THREADS)
attn_v2_dq_ds_k(float *dq, bf16 *dq_b, const bf16 *ds, const bf16 *k, int T, int H, int K)
{
    constexpr int LD = HD + 8, TILE = V2_B * LD, LS = V2_B + 8, STILE = V2_B * LS, QROWS = V2_B * MW;
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *Ks = (bf16 *)sm;          /* 2 buffers */
    bf16 *Ss = Ks + 2 * TILE;       /* 2 buffers of MW dS^T tiles (one per 64-query half) */
    const int n_qt = (T + V2_B - 1) / V2_B, n_qb = (T + QROWS - 1) / QROWS;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qb = n_qb - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    /* this warp's 16 MW rows: in the 64-query tile wq (its dS tiles), from column wc of them */
    const int wq = qb * MW + (16 * MW * warp) / V2_B, wc = (16 * MW * warp) % V2_B, hf = wq - qb * MW;
    const int wlast = wq < n_qt ? wq : -1;  /* the warp's last key tile (its diagonal; none past T) */
    const int last_q = (qb * MW + MW - 1 < n_qt - 1 ? qb * MW + MW - 1 : n_qt - 1);  /* the block's last tile */
    v2_load_tile<HD>(Ks, k, b, 0, T, K, kvh);
#pragma unroll
    for (int f = 0; f < MW; f++)
        if (qb * MW + f <= last_q)
            mt_attn_load_ds<V2_THREADS>(Ss + f * STILE, ds + mt_attn_ds_tile(b, h, qb * MW + f, 0, H, n_qt));
    mt_cp_async_commit();
    float dqa[MW][HD / 8][4];
#pragma unroll
    for (int mi = 0; mi < MW; mi++) v2_zero<HD / 8>(dqa[mi]);
    for (int kt = 0; kt <= last_q; kt++) {
        const bf16 *Kb = Ks + (kt & 1) * TILE, *Sb = Ss + (kt & 1) * MW * STILE + hf * STILE;
        if (kt < last_q) {
            v2_load_tile<HD>(Ks + ((kt + 1) & 1) * TILE, k, b, (kt + 1) * V2_B, T, K, kvh);
#pragma unroll
            for (int f = 0; f < MW; f++)  /* the halves whose diagonal is not passed yet */
                if (kt + 1 <= qb * MW + f && qb * MW + f <= last_q)
                    mt_attn_load_ds<V2_THREADS>(Ss + ((kt + 1) & 1) * MW * STILE + f * STILE,
                               ds + mt_attn_ds_tile(b, h, qb * MW + f, kt + 1, H, n_qt));
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        v2_dq_ds_step<HD, MW>(dqa, Sb, Kb, kt, wlast, wc, lane);
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < MW; mi++)
        mt_attn_write_rows<HD>(dq_b ? NULL : dq, dq_b, dqa[mi], b, qb * QROWS + 16 * MW * warp + 16 * mi, T, H, h,
                               lane);
}

/* ---- backward: dQ, recomputing S and dP (the dS tiles over MT_CUDA_ATTN_DS_MB) ---- */
template <int HD>
static __global__ void __launch_bounds__(V2_THREADS)
attn_v2_dq_k(float *dq, bf16 *dq_b, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *g, const float *lse,
             const float *D, int T, int H, int K, float scale, float c)
{
    constexpr int LD = HD + 8, TILE = V2_B * LD;
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *Qs = (bf16 *)sm;
    bf16 *Gs = Qs + TILE;
    bf16 *Ks = Gs + TILE;      /* 2 buffers */
    bf16 *Vs = Ks + 2 * TILE;  /* 2 buffers */
    const int n_qt = (T + V2_B - 1) / V2_B;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = n_qt - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int warp = threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP, g4 = lane >> 2, t = lane & 3;
    const int i0 = qt * V2_B, row0 = i0 + 16 * warp + g4;
    const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
    float L2[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row0 + 8 * r;
        L2[r] = i < T ? lse[lrow + (size_t)i] * V2_LOG2E : INFINITY;
        Dr[r] = i < T ? D[lrow + (size_t)i] : 0.0f;
    }

    v2_load_tile<HD>(Qs, q, b, i0, T, H, h);
    v2_load_tile<HD>(Gs, g, b, i0, T, H, h);
    v2_load_tile<HD>(Ks, k, b, 0, T, K, kvh);
    v2_load_tile<HD>(Vs, v, b, 0, T, K, kvh);
    mt_cp_async_commit();
    float dqa[HD / 8][4];
    v2_zero<HD / 8>(dqa);
    for (int kt = 0; kt <= qt; kt++) {
        const bf16 *Kb = Ks + (kt & 1) * TILE, *Vb = Vs + (kt & 1) * TILE;
        if (kt < qt) {
            v2_load_tile<HD>(Ks + ((kt + 1) & 1) * TILE, k, b, (kt + 1) * V2_B, T, K, kvh);
            v2_load_tile<HD>(Vs + ((kt + 1) & 1) * TILE, v, b, (kt + 1) * V2_B, T, K, kvh);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        float s[8][4], dp[8][4];
        v2_abt<HD>(s, Qs, 16 * warp, Kb, lane);   /* S = Q_w K^T */
        v2_abt<HD>(dp, Gs, 16 * warp, Vb, lane);  /* dP = dO_w V^T */
        const int j0 = kt * V2_B;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[j][e] * c - L2[e >> 1]);
                if (kt == qt && j0 + 8 * j + 2 * t + (e & 1) > row0 + 8 * (e >> 1)) p = 0.0f;
                dp[j][e] = scale * p * (dp[j][e] - Dr[e >> 1]);
            }
        v2_pv<HD>(dqa, dp, Kb, lane);  /* dQ_w += dS K */
        __syncthreads();
    }
    mt_attn_write_rows<HD>(dq_b ? NULL : dq, dq_b, dqa, b, i0 + 16 * warp, T, H, h, lane);
}

/* ---- host side ---- */
static size_t v2_tile_bytes(int hd) { return (size_t)V2_B * (size_t)(hd + 8) * 2; }

int mt_attn_v2_supports(int hd) { return hd == 64 || hd == 128; }

/* the query rows a block owns in the forward and dQ kernels, 64 MW: the
 * instance's knob (attn_kernel v2: MW 1, v3: MW 2; same bits) */
static int v2_mw(void) { return mt_cuda_be->attn_v2 >= 2 ? 2 : 1; }

/* attn_kernel=v4 and v5: the forward, dK/dV and dQ (from the dS tiles) on wgmma (attention_wg.cu) */
static int v2_wgmma(void) { return mt_cuda_be->attn_v2 >= 3; }

template <int HD, int MW>
static void v2_fwd_mw(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T,
                      int H, int K)
{
    const size_t smem = (size_t)(4 + MW) * v2_tile_bytes(HD);
    if (!mt_cuda_smem_opt_in(attn_v2_fwd_k<HD, MW>, smem)) return;
    const float c = (1.0f / sqrtf((float)HD)) * V2_LOG2E;
    const dim3 grid = mt_attn_grid((T + V2_B * MW - 1) / (V2_B * MW), B * H, 4ll * T * HD);   /* K, V re-read */
    MT_LAUNCH((attn_v2_fwd_k<HD, MW>), grid, V2_THREADS, smem)(out, out_b, lse, q, k, v, T, H, K, c);
    MT_CUDA_KCHECK();
}

template <int HD>
static void v2_fwd(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T,
                   int H, int K)
{
    if (v2_mw() == 2) v2_fwd_mw<HD, 2>(out, out_b, lse, q, k, v, B, T, H, K);
    else v2_fwd_mw<HD, 1>(out, out_b, lse, q, k, v, B, T, H, K);
}

/* dQ from the stored tiles, 64 MW query rows a block */
template <int HD, int MW>
static void v2_dq_ds(float *dq, bf16 *dq_b, const bf16 *ds, const bf16 *k, int B, int T, int H, int K)
{
    const size_t smem = 2 * v2_tile_bytes(HD) + 2 * (size_t)MW * V2_B * (V2_B + 8) * 2;
    if (!mt_cuda_smem_opt_in(attn_v2_dq_ds_k<HD, MW>, smem)) return;
    const dim3 grid = mt_attn_grid((T + V2_B * MW - 1) / (V2_B * MW), B * H, 2ll * T * HD);   /* K re-read */
    MT_LAUNCH((attn_v2_dq_ds_k<HD, MW>), grid, V2_THREADS, smem)(dq, dq_b, ds, k, T, H, K);
    MT_CUDA_KCHECK();
}

/* ds: room for the dS^T tiles (attention_tc.cu sizes it; NULL: over MT_CUDA_ATTN_DS_MB,
 * dQ recomputes S and dP) */
template <int HD>
static void v2_bwd(float *dq, bf16 *dq_b, float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, bf16 *ds, const bf16 *q,
                   const bf16 *k, const bf16 *v, const bf16 *g, const float *lse, const float *D, int B, int T, int H,
                   int K, int ldv_b)
{
    const size_t s_kv = 6 * v2_tile_bytes(HD) + 4 * V2_B * sizeof(float), s_q = 6 * v2_tile_bytes(HD);
    const float scale = 1.0f / sqrtf((float)HD), c = scale * V2_LOG2E;
    const int nt = (T + V2_B - 1) / V2_B;
    if (v2_wgmma()) {   /* dK/dV on wgmma, the same dS tiles */
        mt_attn_wg_dkdv(dk, (mt_bf16 *)dk_b, dv, (mt_bf16 *)dv_b, (mt_bf16 *)ds, (const mt_bf16 *)q,
                        (const mt_bf16 *)k, (const mt_bf16 *)v, (const mt_bf16 *)g, lse, D, B, T, H, K, HD, ldv_b);
    } else {
        if (!mt_cuda_smem_opt_in(attn_v2_dkdv_k<HD>, s_kv)) return;
        const dim3 grid = mt_attn_grid(nt, B * K, 4ll * T * HD * (H / K));   /* the group's Q and dO re-read */
        MT_LAUNCH(attn_v2_dkdv_k<HD>, grid, V2_THREADS, s_kv)(dk, dk_b, dv, dv_b, ds, q, k, v, g, lse, D, T, H, K,
                                                             scale, c, ldv_b);
        MT_CUDA_KCHECK();
    }
    if (ds) {
        if (v2_wgmma())
            mt_attn_wg_dq(dq, (mt_bf16 *)dq_b, (const mt_bf16 *)ds, (const mt_bf16 *)k, B, T, H, K, HD);
        else if (v2_mw() == 2) v2_dq_ds<HD, 2>(dq, dq_b, ds, k, B, T, H, K);
        else v2_dq_ds<HD, 1>(dq, dq_b, ds, k, B, T, H, K);
        return;
    }
    if (!mt_cuda_smem_opt_in(attn_v2_dq_k<HD>, s_q)) return;
    mt_cuda_be->info.attention_dq_recompute++;
    MT_LAUNCH(attn_v2_dq_k<HD>, mt_attn_grid(nt, B * H, 4ll * T * HD), V2_THREADS, s_q)(dq, dq_b, q, k, v, g, lse, D,
                                                                                       T, H, K, scale, c);
    MT_CUDA_KCHECK();
}

void mt_attn_v2_forward(float *out, mt_bf16 *out_b, float *lse, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                        int B, int T, int H, int K, int hd)
{
    if (v2_wgmma()) {
        mt_attn_wg_forward(out, out_b, lse, q, k, v, B, T, H, K, hd);
        return;
    }
    if (hd == 64) v2_fwd<64>(out, (bf16 *)out_b, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, K);
    else v2_fwd<128>(out, (bf16 *)out_b, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, K);
}

void mt_attn_v2_backward(float *dq, mt_bf16 *dq_b, float *dk, mt_bf16 *dk_b, float *dv, mt_bf16 *dv_b, mt_bf16 *ds,
                         const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *g, const float *lse,
                         const float *D, int B, int T, int H, int K, int hd, int ldv_b)
{
    if (hd == 64)
        v2_bwd<64>(dq, (bf16 *)dq_b, dk, (bf16 *)dk_b, dv, (bf16 *)dv_b, (bf16 *)ds, (const bf16 *)q, (const bf16 *)k,
                   (const bf16 *)v, (const bf16 *)g, lse, D, B, T, H, K, ldv_b);
    else
        v2_bwd<128>(dq, (bf16 *)dq_b, dk, (bf16 *)dk_b, dv, (bf16 *)dv_b, (bf16 *)ds, (const bf16 *)q, (const bf16 *)k,
                    (const bf16 *)v, (const bf16 *)g, lse, D, B, T, H, K, ldv_b);
}
