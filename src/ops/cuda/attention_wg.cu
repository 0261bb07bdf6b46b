/*
 * attention_wg.cu — causal attention on Hopper's warpgroup MMA (knob
 * attn_kernel=v4, and v5 below; precision=bf16; wgmma.cuh), head dims 64 and 128: the
 * forward here, then the backward's dK/dV and dQ kernels (below; D, the
 * staging and the dispatch are attention_v2.cu's and attention_tc.cu's).
 * The math and the rounding points are v2's (docs/cuda.md "v2"), operation
 * for operation; the forward's:
 *
 *   x_ij = (q_i . k_j) scale log2 e         (fp32 accumulation; -inf past the diagonal)
 *   m_i  = running max, alpha = 2^(m_old - m_new), l_i = alpha l_i + sum_j pt_ij
 *   pt_ij = 2^(x_ij - m_i)  (fp32; bf16(pt) feeds P V),  O_i = alpha O_i + sum_j bf16(pt_ij) v_j
 *   out_i = O_i / l_i,  lse_i = (m_i + log2 l_i) ln 2
 *
 * Block: 2 warpgroups (256 threads) on 128 query rows; warpgroup w on rows
 * i0 + 64 w .. + 63, one m64 tile (warp q of it on 16 rows, in mma.sync's C
 * layout: the softmax is v2_fwd_step's on the same registers). Key tiles of
 * 64 run from 0 to the block's last; warpgroup w computes on tile kt only up
 * to its own diagonal tile (i0 + 64 w) / 64 and masks that one (a branch
 * uniform over the warpgroup: wgmma needs all 128 of its threads).
 * Per key tile and warpgroup:
 *   S (64 x 64) = Q_w K^T: hd / 16 wgmma m64n64k16, both operands K-major from
 *     shared memory in the 128-byte swizzle (hd 128 as two 64-column halves,
 *     8 KiB apart); the online softmax on the accumulators;
 *   O (64 x hd) = alpha O + P V: 4 wgmma m64n(hd)k16, P from registers (two n8
 *     accumulator tiles packed as the A fragment, v2_pv's packing) and V^T from
 *     shared memory, K-major over the keys: V's tile comes by cp.async as it is
 *     and is transposed in shared memory (wg_transpose, as the backward's Q^T).
 * S runs one key tile ahead (since the nineteenth session: wg_fwd_tile): tile
 * kt issues S_{kt+1} and P V_kt together and runs tile kt + 1's softmax while
 * P V_kt is in flight. K and V tiles come by cp.async, two buffers each, loaded
 * two tiles ahead; since the twentieth session the block transposes V_{kt+1}
 * while tile kt's products run (before: V came through registers and 2-byte
 * stores, 16-way bank conflicts at hd 128, between two barriers). One barrier a
 * tile, at its top (fence.proxy.async before it: wgmma reads through the async
 * proxy): K_{kt+1}, V_{kt+1} landed and V_kt^T written; every buffer refilled in
 * the tile was last read before it.
 * Deterministic: fixed order, no atomics. Rows and keys past T: zero-filled.
 *
 * attn_kernel=v5 (since the twenty-sixth session; every kernel's MN = 1): the
 * same kernels with no transpose. The tiles a product takes transposed (V in
 * P V; Q and dO in dK, dV; K in dQ) are read as they come, MN-major, through
 * wgmma's imm-trans (wgmma.cuh mt_wgmma_desc_sw128_mn: a row of the tile is a k
 * of the product, its 64-column blocks 8 KiB apart). So a buffer is busy until
 * the product that reads it is waited for: the forward keeps three V buffers
 * (V_{kt+2} loads while P V_kt runs), the backward kernels refill theirs after
 * the tile's wait, and each backward tile has one barrier, not two. The bits
 * are v4's (the same products, operands and order).
 */
#include "cuda_impl.cuh"
#include "wgmma.cuh"
#include "attn_online.cuh"
#include "attn_sched.cuh"

#include <math.h>

typedef __nv_bfloat16 bf16;

#define WG_B       64    /* keys of a key tile = rows of a warpgroup */
#define WG_ROWS    128   /* query rows of a block */
#define WG_THREADS 256

static const float WG_LOG2E = 1.4426950408889634f;

/* attn_kernel=v5 (the instance's attn_v2 4): the transposed operands read MN-major, no transpose (below) */
static int wg_mn(void) { return mt_cuda_be->attn_v2 == 4; }

/* rows r0 .. r0 + NR - 1 of one head of a (B, T, nh, HD) bf16 tensor into swizzled
 * tiles of 64 rows (row r into tile r / 64, TILE bytes apart), asynchronously; past T zeros */
template <int HD, int NR>
static __device__ __forceinline__ void wg_load_rows(unsigned char *dst, const bf16 *src, int b, int r0, int T, int nh,
                                                    int head)
{
    constexpr int CPR = HD / 8, TILE = WG_B * HD * 2;
    const size_t rstride = (size_t)nh * HD;
    const bf16 *base = src + (size_t)b * (size_t)T * rstride + (size_t)head * HD;
    for (int e = threadIdx.x; e < NR * CPR; e += WG_THREADS) {
        const int r = e / CPR, c8 = e - r * CPR;
        const bool ok = r0 + r < T;
        mt_cp_async16(dst + (r / WG_B) * TILE + mt_wgmma_swz<WG_B>(r % WG_B, c8),
                      ok ? base + (size_t)(r0 + r) * rstride + 8 * c8 : base, ok ? 16 : 0);
    }
}

/* a swizzled 64-row tile (64 x HD) into its transpose (HD rows x 64 columns, K-major
 * over the tile's rows): 8 x 8 blocks by ldmatrix .trans, whose lane (g, t) receives
 * rows 2 t, 2 t + 1 of the block's column g as one word, stored as is */
template <int HD>
static __device__ __forceinline__ void wg_transpose(unsigned char *dst, const unsigned char *src)
{
    constexpr int N_X4 = (WG_B / 8) * (HD / 8) / 4;   /* ldmatrix.x4 of the tile: 4 blocks each */
    int tid = threadIdx.x;
#ifndef MT_CUDA_EMU
    asm volatile("" : "+r"(tid));   /* addresses per call: hoisted out of dQ's key loop they cost registers */
#endif
    const int warp = tid / MT_WARP, lane = tid % MT_WARP, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = warp; i < N_X4; i += WG_THREADS / MT_WARP) {
        const int blk = 4 * i + (lane >> 3);   /* the block this lane addresses: rows 8 (blk % 8).., chunk blk / 8 */
        uint32_t r[4];
        mt_ldsm_x4_t(r, src + mt_wgmma_swz<WG_B>(8 * (blk & 7) + (lane & 7), blk >> 3));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int bj = 4 * i + j;
            *(uint32_t *)(dst + mt_wgmma_swz<HD>(8 * (bj >> 3) + g, bj & 7) + 4 * t) = r[j];
        }
    }
}

static __device__ __forceinline__ void wg_s_zero(float (&s)[8][4])
{
#pragma unroll
    for (int i = 0; i < 32; i++) s[i / 4][i % 4] = 0.0f;
}

/* s (64 x 64) = A B^T over HD for two 64-row swizzled tiles (the forward's S = Q_w K^T,
 * the backward's S^T = K_w Q^T and dP^T = V_w dO^T), issued and committed as one group
 * (not waited for): hd / 16 wgmma m64n64k16, both operands K-major from shared memory
 * (hd 128: two 64-column halves); the caller zeroed s and issued the wgmma.fence */
template <int HD>
static __device__ __forceinline__ void wg_abt_issue(float (&s)[8][4], const unsigned char *A, const unsigned char *B)
{
    constexpr int HALF = WG_B * 128;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int off = (kk >> 2) * HALF + 32 * (kk & 3);
        mt_wgmma_ss<64>(&s[0][0], mt_wgmma_desc_sw128(A + off), mt_wgmma_desc_sw128(B + off), kk > 0);
    }
    mt_wgmma_commit();
}
/* The first key tile's S and its softmax (masked when it is the warpgroup's diagonal);
 * called by every thread (MT_WARP_STEP, as wg_fwd_tile below) */
template <int HD>
static __device__ MT_WARP_STEP void wg_fwd_first(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                 int wlast, const unsigned char *Qw, const unsigned char *K0,
                                                 int row0, int t, float c)
{
    wg_s_zero(s);
    mt_wgmma_fence_operand<32>(&s[0][0]);
    mt_wgmma_fence();
    wg_abt_issue<HD>(s, Qw, K0);
    mt_wgmma_wait<0>();
    mt_wgmma_fence_operand<32>(&s[0][0]);
    mt_attn_online_tile(s, m, l, alpha, 0 == wlast, 0, row0, t, c);
}

/* One key tile kt, after the barrier that made K_{kt+1}, V_{kt+1} (landed) and
 * V_kt^T visible and the caller's K_{kt+2}, V_{kt+2} loads; for a warpgroup up to
 * its diagonal, its softmax of tile kt done before (s: tile kt's p, fp32; alpha: its
 * rescale of O):
 *   O = alpha O; P = bf16(s) as A fragments (read by the wgmma until its wait)
 *   issue S_{kt+1} = Q K_{kt+1}^T into sn (group 1), then O += P V_kt (group 2)
 *   V_{kt+1}^T transposed (wg_transpose: this warpgroup's share) while they run
 *     (v4; v5 reads V_kt's own buffer, MN-major: nothing to transpose)
 *   wait for group 1; the online softmax of tile kt + 1 on sn (P V_kt in flight)
 *   wait for group 2
 * Past its diagonal a warpgroup computes nothing: that is only warpgroup 0 on the
 * block's last tile, where there is nothing to transpose (a warpgroup on rows past
 * T computes on zero rows, never written: with its share of the transpose under
 * that branch, ptxas serialized the wgmmas, C7520). S_{kt+1} is issued on the
 * warpgroup's last tile too, from whatever K buffer Kn holds (landed data, the result
 * unused): issued under `if (kt + 1 <= wlast)` it serialized the kernel (C7514). The
 * caller alternates s and sn between tiles by the call (no copy), a tile's issue and
 * waits inside one call and one branch: with the issue under `if` and the waits after
 * it, or split over two calls each under its own parity branch, ptxas serialized
 * (C7515). Each element's operations are v2's, in v2's order. Every thread calls it
 * (MT_WARP_STEP, as v2_fwd_step: under the emulator a real call, so that the host
 * compiler keeps the barrier after it in one place). */
template <int HD, int MN>
static __device__ MT_WARP_STEP void wg_fwd_tile(float (&o)[HD / 2], float (&s)[8][4], float (&sn)[8][4],
                                                float (&m)[2], float (&l)[2], float (&alpha)[2], int kt, int n_kt,
                                                int wlast, const unsigned char *Qw, const unsigned char *Ks,
                                                const unsigned char *Vs, unsigned char *Vt, int row0, int t, float c)
{
    constexpr int TILE = WG_B * HD * 2;
    if (kt > wlast) return;   /* warpgroup 0 on the block's last tile (uniform over it): nothing to transpose */
    /* P V_kt's B: V_kt as it came (v5: MN-major, buffer kt % 3) or its transpose (v4) */
    const unsigned char *Kn = Ks + ((kt + 1) & 1) * TILE, *Vb = MN ? Vs + (kt % 3) * TILE : Vt + (kt & 1) * TILE;
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[4 * j + e] *= alpha[e >> 1];
    uint32_t pa[4][4];   /* P as bf16 A fragments, key steps of 16 (v2_pv's packing): read until the wait */
    mt_attn_pack_a(pa, s);
    wg_s_zero(sn);
    mt_wgmma_fence_operand<HD / 2>(o);   /* the rescale and the zeroing stay before the fence */
    mt_wgmma_fence_operand<32>(&sn[0][0]);
    mt_wgmma_fence_operand<16>(&pa[0][0]);
    mt_wgmma_fence();   /* o, pa and sn were written by plain instructions */
    wg_abt_issue<HD>(sn, Qw, Kn);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if constexpr (MN) mt_wgmma_rs<HD, 1>(o, pa[kk], mt_wgmma_desc_sw128_mn(Vb + 2048 * kk, WG_B * 128), 1);
        else mt_wgmma_rs<HD>(o, pa[kk], mt_wgmma_desc_sw128(Vb + 32 * kk), 1);
    }
    mt_wgmma_commit();
    if (!MN && kt + 1 < n_kt)   /* V_{kt+1}^T while the products run (its buffer's reader, P V_{kt-1}, is done) */
        wg_transpose<HD>(Vt + ((kt + 1) & 1) * TILE, Vs + ((kt + 1) & 1) * TILE);
    mt_wgmma_wait<1>();   /* S_{kt+1} */
    mt_wgmma_fence_operand<32>(&sn[0][0]);
    if (kt + 1 <= wlast) mt_attn_online_tile(sn, m, l, alpha, kt + 1 == wlast, (kt + 1) * WG_B, row0, t, c);
    mt_wgmma_wait<0>();   /* P V_kt */
    mt_wgmma_fence_operand<HD / 2>(o);
}

template <int HD, int MN>
static __global__ void __launch_bounds__(WG_THREADS)
attn_wg_fwd_k(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int H, int K,
              float c)
{
    constexpr int TILE = WG_B * HD * 2;
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *Qs = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 2 tiles (wgmma.cuh) */
    unsigned char *Ks = Qs + 2 * TILE;      /* 2 buffers */
    unsigned char *Vs = Ks + 2 * TILE;      /* buffers of V as it comes: 2 (v4), 3 (v5: tile j in j % 3) */
    unsigned char *Vt = MN ? nullptr : Vs + 2 * TILE;   /* v4: 2 buffers of V^T */
    auto vbuf = [&](int j) { return Vs + (MN ? j % 3 : j & 1) * TILE; };
    const int n_qt = (T + WG_ROWS - 1) / WG_ROWS;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qt = n_qt - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int wg = mt_wgmma_group(), warp = (threadIdx.x % 128) / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int g = lane >> 2, t = lane & 3;
    const int i0 = qt * WG_ROWS, w0 = i0 + WG_B * wg;   /* this warpgroup's rows w0 .. w0 + 63 */
    /* its diagonal key tile; rows past T (the last block's warpgroup 1 when T % 128 <= 64)
     * compute on zero rows up to the block's last tile and are not written (wg_fwd_tile) */
    const int wlast = w0 / WG_B;
    const int n_kt = ((i0 + WG_ROWS < T ? i0 + WG_ROWS : T) - 1) / WG_B + 1;
    const int row0 = w0 + 16 * warp + g;                 /* this lane's rows: row0, row0 + 8 */

    const unsigned char *Qw = Qs + wg * TILE;
    float o[HD / 2], s[8][4], sn[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   /* m64n64's d[4 j + e] */
    float alpha[2];   /* the online softmax's rescale of O for the tile whose p is in s (or sn) */
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    /* prologue: Q, K_0, V_0, then K_1, V_1 (S runs a key tile ahead); V_0^T; S_0 and its softmax */
    wg_load_rows<HD, WG_ROWS>(Qs, q, b, i0, T, H, h);
    wg_load_rows<HD, WG_B>(Ks, k, b, 0, T, K, kvh);
    wg_load_rows<HD, WG_B>(Vs, v, b, 0, T, K, kvh);
    mt_cp_async_commit();
    if (n_kt > 1) {
        wg_load_rows<HD, WG_B>(Ks + TILE, k, b, WG_B, T, K, kvh);
        wg_load_rows<HD, WG_B>(vbuf(1), v, b, WG_B, T, K, kvh);
    }
    mt_cp_async_commit();
    mt_cp_async_wait<1>();
    mt_fence_proxy_async();
    __syncthreads();
    if (!MN) wg_transpose<HD>(Vt, Vs);
    wg_fwd_first<HD>(s, m, l, alpha, wlast, Qw, Ks, row0, t, c);
    for (int kt = 0; kt < n_kt; kt++) {
        mt_cp_async_wait<0>();   /* K_{kt+1}, V_{kt+1} landed */
        mt_fence_proxy_async();
        __syncthreads();   /* ... every thread's, and (v4) V_kt^T; every reader of the buffers refilled below done */
        if (kt + 2 < n_kt) {   /* into K_kt's buffer (S_kt is done) and V_kt's (v4: its transpose is done) or,
                                * v5, V_{kt-1}'s (P V_{kt-1} was waited for in tile kt - 1) */
            wg_load_rows<HD, WG_B>(Ks + (kt & 1) * TILE, k, b, (kt + 2) * WG_B, T, K, kvh);
            wg_load_rows<HD, WG_B>(vbuf(kt + 2), v, b, (kt + 2) * WG_B, T, K, kvh);
        }
        mt_cp_async_commit();
        if (kt & 1)   /* s, sn swap */
            wg_fwd_tile<HD, MN>(o, sn, s, m, l, alpha, kt, n_kt, wlast, Qw, Ks, Vs, Vt, row0, t, c);
        else wg_fwd_tile<HD, MN>(o, s, sn, m, l, alpha, kt, n_kt, wlast, Qw, Ks, Vs, Vt, row0, t, c);
    }
    if (w0 >= T) return;
    float (&of)[HD / 8][4] = *reinterpret_cast<float (*)[HD / 8][4]>(o);   /* the C layout's n8 tiles */
    mt_attn_online_end<HD>(of, m, l, lse, b, h, T, H, row0, t);
    mt_attn_write_rows<HD>(out, out_b, of, b, w0 + 16 * warp, T, H, h, lane);
}

/* ---- backward: dK, dV on wgmma ----
 * A block: 2 warpgroups on 128 keys (key tiles 2 kb and 2 kb + 1, one each), v2's
 * dK/dV loop and math (attn_online.cuh: mt_attn_bwd_tile): over the heads of the
 * GQA group, then the query tiles of 64 from the block's first diagonal; warpgroup
 * w computes on query tile qt only from its own diagonal (qt >= its key tile). Per
 * query tile and warpgroup (keys are the M side, 64 of them):
 *   S^T = K_w Q^T, dP^T = V_w dO^T: hd / 16 wgmma m64n64k16 each, SS, both K-major
 *     over hd (Q, dO, K, V as they come, swizzled by cp.async), waited for;
 *   P^T, dS^T in registers (v2's); bf16(dS^T) stored as the dQ kernel's tile;
 *   dV_w += P^T dO, dK_w += dS^T Q: 4 wgmma m64n(hd)k16 each, RS (P^T, dS^T packed
 *     as A fragments), B = dO^T, Q^T: K-major over the queries, i.e. the Q and dO
 *     tiles transposed in shared memory (ldmatrix .trans of 8 x 8 blocks, one 4-byte
 *     store per lane and block: wg_transpose).
 * Q, dO (and their lse, D) double-buffered by cp.async, Q^T and dO^T too; K, V
 * (128 rows) loaded once. Since the twentieth session the block transposes the
 * next query tile while this tile's RS products run (before: this tile's, under
 * S^T and dP^T, with a barrier more). Shared memory at hd 128: K 2, V 2, Q 2,
 * dO 2, Q^T 2, dO^T 2 tiles of 16 KiB (v5: no Q^T, dO^T, one barrier a tile, the
 * next-but-one item's lse, D loaded into registers under the RS products). Barriers a query tile: after the loads
 * landed (S^T, dP^T were waited for by then: Q, dO refill), after the RS wait
 * (fence.proxy.async first: the next Q^T, dO^T visible, this tile's free). Deterministic:
 * fixed order, no atomics; keys past T are zero rows whose dK/dV are not written,
 * queries past T have lse +inf (p = 0). Under the emulator its bits are v2's. */

/* one (head, query tile) item: Q and dO rows (async), lse (base 2; +inf past T) and D */
template <int HD>
static __device__ __forceinline__ void wg_bwd_fetch(unsigned char *Qb, unsigned char *Gb, float *Lb, float *Db,
                                                    const bf16 *q, const bf16 *g, const float *lse, const float *D,
                                                    int b, int h, int i0, int T, int H)
{
    wg_load_rows<HD, WG_B>(Qb, q, b, i0, T, H, h);
    wg_load_rows<HD, WG_B>(Gb, g, b, i0, T, H, h);
    mt_attn_fetch_lse_d(Lb, Db, lse, D, b, h, i0, T, H);
}

/* One query tile of a warpgroup on its key tile (mine: the query tile is at or past
 * its diagonal, uniform over it): S^T, dP^T (SS, waited for), P^T and dS^T in
 * registers, bf16(dS^T) stored for the dQ kernel, then dV += P^T dO, dK += dS^T Q
 * issued and committed, not waited for (the caller transposes the next tile
 * meanwhile and waits outside any branch: dQ's rule, wg_dq_issue). pa and da are
 * the RS products' A registers: the caller's, alive until that wait. Every thread
 * calls it (MT_WARP_STEP: under the emulator a real call). */
template <int HD, int MN>
static __device__ MT_WARP_STEP void wg_dkdv_tile(float (&dka)[HD / 2], float (&dva)[HD / 2], uint32_t (&pa)[4][4],
                                                 uint32_t (&da)[4][4], int mine, const unsigned char *Kw,
                                                 const unsigned char *Vw, const unsigned char *Qb,
                                                 const unsigned char *Gb, const unsigned char *Qtb,
                                                 const unsigned char *Gtb, const float *Lb, const float *Db,
                                                 bf16 *ds_tile, int diag, int i0, int key0, int warp, int lane,
                                                 float c, float scale)
{
    if (!mine) return;
    const int t = lane & 3;
    float s[8][4], dp[8][4];   /* S^T, dP^T: m64n64's d[4 j + e] */
    wg_s_zero(s);   /* not pinned before the fence (the first wgmma's scale-d 0 ignores them;
                     * pinning cost the hd 128 kernel 12 registers, 243 -> 255) */
    wg_s_zero(dp);
    mt_wgmma_fence();
    wg_abt_issue<HD>(s, Kw, Qb);    /* S^T = K_w Q^T */
    wg_abt_issue<HD>(dp, Vw, Gb);   /* dP^T = V_w dO^T */
    mt_wgmma_wait<0>();
    mt_wgmma_fence_operand<32>(&s[0][0]);
    mt_wgmma_fence_operand<32>(&dp[0][0]);
    mt_attn_bwd_tile(s, dp, Lb, Db, diag, i0, key0, t, c, scale);   /* P^T, dS^T */
    mt_attn_pack_a(pa, s);
    mt_attn_pack_a(da, dp);
    if (ds_tile) mt_attn_store_ds(ds_tile, da, warp, lane);
    mt_wgmma_fence_operand<HD / 2>(dva);
    mt_wgmma_fence_operand<HD / 2>(dka);
    mt_wgmma_fence_operand<16>(&pa[0][0]);
    mt_wgmma_fence_operand<16>(&da[0][0]);
    mt_wgmma_fence();
    if constexpr (MN) {   /* v5: dO and Q as they came, MN-major over the queries */
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            mt_wgmma_rs<HD, 1>(dva, pa[kk], mt_wgmma_desc_sw128_mn(Gb + 2048 * kk, WG_B * 128), 1);
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            mt_wgmma_rs<HD, 1>(dka, da[kk], mt_wgmma_desc_sw128_mn(Qb + 2048 * kk, WG_B * 128), 1);
    } else {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) mt_wgmma_rs<HD>(dva, pa[kk], mt_wgmma_desc_sw128(Gtb + 32 * kk), 1);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) mt_wgmma_rs<HD>(dka, da[kk], mt_wgmma_desc_sw128(Qtb + 32 * kk), 1);
    }
    mt_wgmma_commit();
}

template <int HD, int MN>
static __global__ void __launch_bounds__(WG_THREADS)
attn_wg_dkdv_k(float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, bf16 *ds, const bf16 *q, const bf16 *k, const bf16 *v,
               const bf16 *g, const float *lse, const float *D, int T, int H, int K, float scale, float c, int ldv_b)
{
    constexpr int TILE = WG_B * HD * 2;
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *Ks = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 2 tiles (wgmma.cuh) */
    unsigned char *Vs = Ks + 2 * TILE;   /* 2 tiles */
    unsigned char *Qs = Vs + 2 * TILE;   /* 2 buffers */
    unsigned char *Gs = Qs + 2 * TILE;   /* 2 buffers of dO */
    unsigned char *Qt = MN ? nullptr : Gs + 2 * TILE;   /* v4: 2 buffers of Q^T (HD rows x 64 queries) */
    unsigned char *Gt = MN ? nullptr : Qt + 2 * TILE;   /* v4: 2 buffers of dO^T */
    float *Ls = (float *)(MN ? Gs + 2 * TILE : Gt + 2 * TILE);   /* 2 x 64 */
    float *Ds = Ls + 2 * WG_B;              /* 2 x 64 */
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* kb 0 (the most work) first (attn_sched.cuh) */
    const int kb = sl.rank, kvh = sl.pair % K, b = sl.pair / K, grp = H / K;
    const int wg = mt_wgmma_group(), warp = (threadIdx.x % 128) / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int n_qt = (T + WG_B - 1) / WG_B, qt0 = 2 * kb, kt = qt0 + wg;   /* kt: this warpgroup's key tile */
    const int j0 = kt * WG_B, key0 = j0 + 16 * warp + (lane >> 2);   /* this lane's keys: key0, key0 + 8 */
    const int per_h = n_qt - qt0, n_it = grp * per_h;
    /* item it (head kvh grp + it / per_h, query tile qt0 + it % per_h): Q, dO, lse, D into buffer it & 1 */
    auto item_h = [&](int it) { return kvh * grp + it / per_h; };
    auto item_qt = [&](int it) { return qt0 + it % per_h; };
    auto fetch = [&](int it) {
        const int nb = it & 1;
        wg_bwd_fetch<HD>(Qs + nb * TILE, Gs + nb * TILE, Ls + nb * WG_B, Ds + nb * WG_B, q, g, lse, D, b, item_h(it),
                         item_qt(it) * WG_B, T, H);
    };

    wg_load_rows<HD, 2 * WG_B>(Ks, k, b, qt0 * WG_B, T, K, kvh);
    wg_load_rows<HD, 2 * WG_B>(Vs, v, b, qt0 * WG_B, T, K, kvh);
    fetch(0);
    mt_cp_async_commit();
    if (n_it > 1) fetch(1);
    mt_cp_async_commit();
    mt_cp_async_wait<1>();
    if (!MN) {
        __syncthreads();
        wg_transpose<HD>(Qt, Qs);   /* item 0's Q^T, dO^T */
        wg_transpose<HD>(Gt, Gs);
    }
    mt_fence_proxy_async();
    __syncthreads();

    float dka[HD / 2], dva[HD / 2];   /* m64n(HD) accumulators: the C layout's n8 tiles */
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.0f;
    for (int it = 0; it < n_it; it++) {   /* heads of the group, then query tiles from the diagonal */
        const int qt = item_qt(it), buf = it & 1, h = item_h(it);
        uint32_t pa[4][4], da[4][4];   /* P^T, dS^T as bf16 A fragments (query steps of 16): read until the wait */
        wg_dkdv_tile<HD, MN>(dka, dva, pa, da, qt >= kt, Ks + wg * TILE, Vs + wg * TILE, Qs + buf * TILE,
                         Gs + buf * TILE, MN ? nullptr : Qt + buf * TILE, MN ? nullptr : Gt + buf * TILE,
                         Ls + buf * WG_B, Ds + buf * WG_B,
                         ds ? ds + mt_attn_ds_tile(b, h, qt, kt, H, n_qt) : NULL, qt == kt, qt * WG_B, key0, warp,
                         lane, c, scale);
        mt_cp_async_wait<0>();   /* item it + 1 landed */
        const int nx = it + 2;   /* the item fetched into this item's buffers */
        if constexpr (MN) {      /* v5: this item's Q, dO are read until the RS products' wait */
            float lx = 0.0f, dx = 0.0f;   /* item nx's lse, D (threads 0..63): loaded under the RS products */
            if (nx < n_it && threadIdx.x < 64)
                mt_attn_lse_d_of(&lx, &dx, lse, D, b, item_h(nx), item_qt(nx) * WG_B, T, H);
            mt_wgmma_wait<0>();
            mt_fence_proxy_async();
            __syncthreads();     /* item it + 1 visible to wgmma; item it's Q, dO, lse, D read (they refill) */
            if (nx < n_it) {     /* wg_bwd_fetch with lse, D from the registers */
                wg_load_rows<HD, WG_B>(Qs + buf * TILE, q, b, item_qt(nx) * WG_B, T, H, item_h(nx));
                wg_load_rows<HD, WG_B>(Gs + buf * TILE, g, b, item_qt(nx) * WG_B, T, H, item_h(nx));
                if (threadIdx.x < 64) Ls[buf * WG_B + threadIdx.x] = lx, Ds[buf * WG_B + threadIdx.x] = dx;
            }
            mt_cp_async_commit();
        } else {
            __syncthreads();         /* ... every thread's; item it's Q, dO (S^T, dP^T waited for) and lse, D read */
            if (it + 1 < n_it) {     /* while this item's RS products run */
                wg_transpose<HD>(Qt + (buf ^ 1) * TILE, Qs + (buf ^ 1) * TILE);
                wg_transpose<HD>(Gt + (buf ^ 1) * TILE, Gs + (buf ^ 1) * TILE);
            }
            if (nx < n_it) fetch(nx);
            mt_cp_async_commit();
            mt_wgmma_wait<0>();
            mt_fence_proxy_async();
            __syncthreads();   /* the next item's Q^T, dO^T written; this item's read (their buffers refill) */
        }
    }
    mt_wgmma_fence_operand<HD / 2>(dka);   /* read below, after the last wait */
    mt_wgmma_fence_operand<HD / 2>(dva);
    float (&dkf)[HD / 8][4] = *reinterpret_cast<float (*)[HD / 8][4]>(dka);
    float (&dvf)[HD / 8][4] = *reinterpret_cast<float (*)[HD / 8][4]>(dva);
    mt_attn_write_rows<HD>(dk_b ? NULL : dk, dk_b, dkf, b, j0 + 16 * warp, T, K, kvh, lane);   /* dk_b: bf16 only */
    mt_attn_write_rows<HD>(dv_b ? NULL : dv, dv_b, dvf, b, j0 + 16 * warp, T, K, kvh, lane, ldv_b);
}

template <int HD, int MN>
static void wg_dkdv(float *dk, bf16 *dk_b, float *dv, bf16 *dv_b, bf16 *ds, const bf16 *q, const bf16 *k,
                    const bf16 *v, const bf16 *g, const float *lse, const float *D, int B, int T, int H, int K,
                    int ldv_b)
{
    const size_t smem = (MN ? 8 : 12) * (size_t)WG_B * HD * 2 + 4 * WG_B * sizeof(float) + MT_WGMMA_ALIGN_SLACK;
    if (!mt_cuda_smem_opt_in(attn_wg_dkdv_k<HD, MN>, smem)) return;
    const float scale = 1.0f / sqrtf((float)HD), c = scale * WG_LOG2E;
    const int n_kb = (T + 2 * WG_B - 1) / (2 * WG_B);
    const dim3 grid = mt_attn_grid(n_kb, B * K, 4ll * T * HD * (H / K));   /* the group's Q and dO re-read */
    MT_LAUNCH((attn_wg_dkdv_k<HD, MN>), grid, WG_THREADS, smem)(dk, dk_b, dv, dv_b, ds, q, k, v, g, lse, D, T, H, K,
                                                               scale, c, ldv_b);
    MT_CUDA_KCHECK();
}

void mt_attn_wg_dkdv(float *dk, mt_bf16 *dk_b, float *dv, mt_bf16 *dv_b, mt_bf16 *ds, const mt_bf16 *q,
                     const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *g, const float *lse, const float *D, int B,
                     int T, int H, int K, int hd, int ldv_b)
{
    auto f = hd == 64 ? (wg_mn() ? wg_dkdv<64, 1> : wg_dkdv<64, 0>) : (wg_mn() ? wg_dkdv<128, 1> : wg_dkdv<128, 0>);
    f(dk, (bf16 *)dk_b, dv, (bf16 *)dv_b, (bf16 *)ds, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
      (const bf16 *)g, lse, D, B, T, H, K, ldv_b);
}

/* dQ's products of one key tile, issued (not waited for) by a warpgroup up to its
 * diagonal (mine: uniform over it): A, its 16 queries x keys 16 s .. from the stored
 * [key][query] dS tile by ldmatrix .trans; B = K^T. The caller's wait is outside any
 * branch: with the wait under `if` as well ptxas serialized the kernel's wgmmas
 * (C7518); the issue alone under it, it does not (ptxas 13). Every thread calls it
 * (MT_WARP_STEP: under the emulator a real call, the barriers after it in one place). */
template <int HD, int MN>
static __device__ MT_WARP_STEP void wg_dq_issue(float (&dqa)[HD / 2], const bf16 *Sb, const unsigned char *Ktb,
                                            int mine, int warp, int lane)
{
    constexpr int LS = WG_B + 8;
    const int mi8 = lane >> 3, r8 = lane & 7;
    uint32_t a[4][4];
    if (!mine) return;
#pragma unroll
    for (int s = 0; s < 4; s++)
        mt_ldsm_x4_t(a[s], Sb + (16 * s + (mi8 >> 1) * 8 + r8) * LS + 16 * warp + (mi8 & 1) * 8);
    mt_wgmma_fence_operand<HD / 2>(dqa);
    mt_wgmma_fence_operand<16>(&a[0][0]);
    mt_wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; s++) {   /* B: K^T (v4) or K as it came, MN-major over the keys (v5) */
        if constexpr (MN) mt_wgmma_rs<HD, 1>(dqa, a[s], mt_wgmma_desc_sw128_mn(Ktb + 2048 * s, WG_B * 128), 1);
        else mt_wgmma_rs<HD>(dqa, a[s], mt_wgmma_desc_sw128(Ktb + 32 * s), 1);
    }
    mt_wgmma_commit();
}

/* ---- backward: dQ on wgmma, from the dK/dV kernel's dS^T tiles ----
 * A block: 2 warpgroups on 128 queries (query tiles 2 qb and 2 qb + 1, one each);
 * per key tile up to the block's last diagonal, warpgroup w (up to its own):
 *   dQ_w += dS_w K: 4 wgmma m64n(hd)k16, RS: dS_w (64 queries x 64 keys) as A
 *   fragments by ldmatrix .trans from the stored [key][query] tile (v2's dQ reads
 *   it so: mma.sync's A layout is wgmma's), B = K^T (hd rows x 64 keys, K-major
 *   over the keys): the K tile transposed in shared memory (wg_transpose).
 * v2's order (key tiles ascending, 4 key steps of 16 each): v2's bits under the
 * emulator. K and the two dS tiles double-buffered by cp.async, K^T too: tile
 * kt's products are issued first and the block transposes K_{kt+1} while they
 * run (the twentieth session; before, the transpose sat between two barriers
 * with the tensor cores idle, three barriers a tile). Two barriers a key tile:
 * after the loads landed (every ldmatrix of dS_kt and the transpose of K_kt are
 * done by then, so their buffers refill), after the wait (K^T_{kt+1} visible to
 * the async proxy, K^T_kt free). The A fragments and accumulators live across
 * the transpose: __launch_bounds__ holds the blocks an SM at the single-buffered
 * kernel's (hd 128: 2, 126 registers; hd 64: 3, 80 registers and a 16-byte spill,
 * tests/cuda/spill_allow.txt); uncapped, ptxas took 172 at hd 128 (1 block). v5 keeps
 * the caps (128 and 80 registers, no spill) though its smaller shared memory would hold more. */
template <int HD, int MN>
static __global__ void __launch_bounds__(WG_THREADS, HD == 64 ? 3 : 2)
attn_wg_dq_k(float *dq, bf16 *dq_b, const bf16 *ds, const bf16 *k, int T, int H, int K)
{
    constexpr int TILE = WG_B * HD * 2, LS = WG_B + 8, STILE = WG_B * LS * 2;   /* bytes */
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *Ks = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 2 buffers (wgmma.cuh) */
    unsigned char *Kt = MN ? nullptr : Ks + 2 * TILE;   /* v4: 2 buffers of K^T (HD rows x 64 keys) */
    unsigned char *Ss = Ks + (MN ? 2 : 4) * TILE;   /* 2 buffers x 2 dS^T tiles (64 x (64 + 8) bf16: ldmatrix rows) */
    const int n_qt = (T + WG_B - 1) / WG_B, n_qb = (T + WG_ROWS - 1) / WG_ROWS;
    const struct mt_attn_slot sl = mt_attn_block_slot();   /* the longest rows first (attn_sched.cuh) */
    const int qb = n_qb - 1 - sl.rank, h = sl.pair % H, b = sl.pair / H, kvh = h / (H / K);
    const int wg = mt_wgmma_group(), warp = (threadIdx.x % 128) / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int q0 = 2 * qb, qt = q0 + wg;                  /* this warpgroup's query tile */
    const int wlast = qt < n_qt ? qt : -1;                /* its last key tile (its diagonal; none past T) */
    const int last = q0 + 1 < n_qt ? q0 + 1 : n_qt - 1;   /* the block's */
    /* key tile j's K and the dS tiles whose diagonal is not passed yet, into buffer j & 1 */
    auto fetch = [&](int j) {
        wg_load_rows<HD, WG_B>(Ks + (j & 1) * TILE, k, b, j * WG_B, T, K, kvh);
#pragma unroll 1   /* unrolled, hd 64's spill under the 80-register cap grew from 4 to 8 bytes */
        for (int f = 0; f < 2; f++)
            if (j <= q0 + f && q0 + f <= last)
                mt_attn_load_ds<WG_THREADS>((bf16 *)(Ss + (j & 1) * 2 * STILE + f * STILE),
                                            ds + mt_attn_ds_tile(b, h, q0 + f, j, H, n_qt));
    };
    fetch(0);
    mt_cp_async_commit();
    if (last > 0) fetch(1);
    mt_cp_async_commit();
    mt_cp_async_wait<1>();
    if (!MN) {
        __syncthreads();
        wg_transpose<HD>(Kt, Ks);   /* K_0^T */
    }
    mt_fence_proxy_async();
    __syncthreads();
    float dqa[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dqa[i] = 0.0f;
    for (int kt = 0; kt <= last; kt++) {
        wg_dq_issue<HD, MN>(dqa, (const bf16 *)(Ss + (kt & 1) * 2 * STILE + wg * STILE),
                            (MN ? Ks : Kt) + (kt & 1) * TILE, kt <= wlast, warp, lane);
        mt_cp_async_wait<0>();   /* K_{kt+1} and its dS tiles landed */
        if constexpr (MN) {      /* v5: K_kt is read until the products' wait */
            mt_wgmma_wait<0>();
            mt_fence_proxy_async();
            __syncthreads();     /* K_{kt+1}, dS_{kt+1} visible; K_kt, dS_kt read (their buffers refill) */
            if (kt + 2 <= last) fetch(kt + 2);
            mt_cp_async_commit();
        } else {
            __syncthreads();         /* ... every thread's; dS_kt and K_kt read (their buffers refill below) */
            if (kt < last) wg_transpose<HD>(Kt + ((kt + 1) & 1) * TILE, Ks + ((kt + 1) & 1) * TILE);
            if (kt + 2 <= last) fetch(kt + 2);
            mt_cp_async_commit();
            mt_wgmma_wait<0>();
            mt_fence_proxy_async();
            __syncthreads();   /* K^T_{kt+1} written; tile kt's products done (its K^T buffer refills next tile) */
        }
    }
    mt_wgmma_fence_operand<HD / 2>(dqa);   /* read below, after the last wait */
    if (wlast < 0) return;
    float (&dqf)[HD / 8][4] = *reinterpret_cast<float (*)[HD / 8][4]>(dqa);
    mt_attn_write_rows<HD>(dq_b ? NULL : dq, dq_b, dqf, b, qt * WG_B + 16 * warp, T, H, h, lane);
}

template <int HD, int MN>
static void wg_dq(float *dq, bf16 *dq_b, const bf16 *ds, const bf16 *k, int B, int T, int H, int K)
{
    const size_t smem = (MN ? 2 : 4) * (size_t)WG_B * HD * 2 + 4 * (size_t)WG_B * (WG_B + 8) * 2 +
                        MT_WGMMA_ALIGN_SLACK;
    if (!mt_cuda_smem_opt_in(attn_wg_dq_k<HD, MN>, smem)) return;
    const dim3 grid = mt_attn_grid((T + WG_ROWS - 1) / WG_ROWS, B * H, 2ll * T * HD);   /* K re-read */
    MT_LAUNCH((attn_wg_dq_k<HD, MN>), grid, WG_THREADS, smem)(dq, dq_b, ds, k, T, H, K);
    MT_CUDA_KCHECK();
}

void mt_attn_wg_dq(float *dq, mt_bf16 *dq_b, const mt_bf16 *ds, const mt_bf16 *k, int B, int T, int H, int K, int hd)
{
    auto f = hd == 64 ? (wg_mn() ? wg_dq<64, 1> : wg_dq<64, 0>) : (wg_mn() ? wg_dq<128, 1> : wg_dq<128, 0>);
    f(dq, (bf16 *)dq_b, (const bf16 *)ds, (const bf16 *)k, B, T, H, K);
}

template <int HD, int MN>
static void wg_fwd(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T,
                   int H, int K)
{
    const size_t smem = (MN ? 7 : 8) * (size_t)WG_B * HD * 2 + MT_WGMMA_ALIGN_SLACK;
    if (!mt_cuda_smem_opt_in(attn_wg_fwd_k<HD, MN>, smem)) return;
    const float c = (1.0f / sqrtf((float)HD)) * WG_LOG2E;
    const dim3 grid = mt_attn_grid((T + WG_ROWS - 1) / WG_ROWS, B * H, 4ll * T * HD);   /* K, V re-read */
    MT_LAUNCH((attn_wg_fwd_k<HD, MN>), grid, WG_THREADS, smem)(out, out_b, lse, q, k, v, T, H, K, c);
    MT_CUDA_KCHECK();
}

void mt_attn_wg_forward(float *out, mt_bf16 *out_b, float *lse, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                        int B, int T, int H, int K, int hd)
{
    auto f = hd == 64 ? (wg_mn() ? wg_fwd<64, 1> : wg_fwd<64, 0>) : (wg_mn() ? wg_fwd<128, 1> : wg_fwd<128, 0>);
    f(out, (bf16 *)out_b, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, K);
}
