/*
 * attention_wg.cu — the causal attention forward on Hopper's warpgroup MMA
 * (knob attn_kernel=v4, precision=bf16; wgmma.cuh), head dims 64 and 128;
 * the backward stays v3's (attention_v2.cu). The math and the rounding points
 * are v2's forward (docs/cuda.md "v2"), operation for operation:
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
 *     8 KiB apart); wait; the online softmax on the accumulators;
 *   O (64 x hd) = alpha O + P V: 4 wgmma m64n(hd)k16, P from registers (two n8
 *     accumulator tiles packed as the A fragment, v2_pv's packing) and V^T from
 *     shared memory, K-major over the keys: V is transposed on its way in (a
 *     16-byte global load of 8 head dims of one key, 8 two-byte stores).
 * K tiles come by cp.async, double-buffered; V's next tile is loaded into
 * registers while this tile computes and stored transposed at the top of the
 * next iteration. Barriers: one after the loads (the tiles, with
 * fence.proxy.async before it: wgmma reads through the async proxy), one at
 * the end of the tile (no buffer is refilled while a warpgroup still reads it).
 * Deterministic: fixed order, no atomics. Rows and keys past T: zero-filled.
 */
#include "cuda_impl.cuh"
#include "wgmma.cuh"
#include "attn_online.cuh"

#include <math.h>

typedef __nv_bfloat16 bf16;

#define WG_B       64    /* keys of a key tile = rows of a warpgroup */
#define WG_ROWS    128   /* query rows of a block */
#define WG_THREADS 256

static const float WG_LOG2E = 1.4426950408889634f;

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

/* V's key tile j0 .. j0 + 63: each thread's 16-byte pieces (8 head dims of one key) into registers */
template <int HD>
static __device__ __forceinline__ void wg_v_fetch(uint4 (&vr)[WG_B * HD / 8 / WG_THREADS], const bf16 *v, int b,
                                                  int j0, int T, int K, int kvh)
{
    constexpr int CPR = HD / 8;
    const size_t rstride = (size_t)K * HD;
    const bf16 *base = v + (size_t)b * (size_t)T * rstride + (size_t)kvh * HD;
#pragma unroll
    for (int i = 0; i < WG_B * CPR / WG_THREADS; i++) {
        const int e = threadIdx.x + i * WG_THREADS, r = e / CPR, c8 = e - r * CPR;
        vr[i] = j0 + r < T ? *(const uint4 *)(base + (size_t)(j0 + r) * rstride + 8 * c8) : uint4{0, 0, 0, 0};
    }
}

/* ... and from the registers into V^T (HD rows, 64 keys: one swizzled half) */
template <int HD>
static __device__ __forceinline__ void wg_v_store(unsigned char *vt, const uint4 (&vr)[WG_B * HD / 8 / WG_THREADS])
{
    constexpr int CPR = HD / 8;
#pragma unroll
    for (int i = 0; i < WG_B * CPR / WG_THREADS; i++) {
        const int e = threadIdx.x + i * WG_THREADS, r = e / CPR, c8 = e - r * CPR;   /* key r, dims 8 c8 .. */
        const uint32_t w[4] = {vr[i].x, vr[i].y, vr[i].z, vr[i].w};
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int n = 8 * c8 + u;
            *(uint16_t *)(vt + mt_wgmma_swz<HD>(n, r >> 3) + 2 * (r & 7)) = (uint16_t)(w[u >> 1] >> (16 * (u & 1)));
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(WG_THREADS)
attn_wg_fwd_k(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int H, int K,
              float c)
{
    constexpr int TILE = WG_B * HD * 2, HALF = WG_B * 128, NV = WG_B * HD / 8 / WG_THREADS;
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *Qs = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 2 tiles (wgmma.cuh) */
    unsigned char *Ks = Qs + 2 * TILE;      /* 2 buffers */
    unsigned char *Vt = Ks + 2 * TILE;      /* 2 buffers of V^T */
    const int n_qt = (T + WG_ROWS - 1) / WG_ROWS;
    const int qt = n_qt - 1 - (int)blockIdx.x;  /* the longest rows first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (H / K);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / MT_WARP, lane = threadIdx.x % MT_WARP;
    const int g = lane >> 2, t = lane & 3;
    const int i0 = qt * WG_ROWS, w0 = i0 + WG_B * wg;   /* this warpgroup's rows w0 .. w0 + 63 */
    const int wlast = w0 < T ? w0 / WG_B : -1;          /* its diagonal key tile (none: rows past T) */
    const int n_kt = ((i0 + WG_ROWS < T ? i0 + WG_ROWS : T) - 1) / WG_B + 1;
    const int row0 = w0 + 16 * warp + g;                 /* this lane's rows: row0, row0 + 8 */

    wg_load_rows<HD, WG_ROWS>(Qs, q, b, i0, T, H, h);
    wg_load_rows<HD, WG_B>(Ks, k, b, 0, T, K, kvh);
    mt_cp_async_commit();
    uint4 vr[NV];
    wg_v_fetch<HD>(vr, v, b, 0, T, K, kvh);

    float o[HD / 2], s[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};   /* s: m64n64's d[4 j + e] */
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    for (int kt = 0; kt < n_kt; kt++) {
        const unsigned char *Kb = Ks + (kt & 1) * TILE, *Vb = Vt + (kt & 1) * TILE;
        wg_v_store<HD>(Vt + (kt & 1) * TILE, vr);
        if (kt + 1 < n_kt) {  /* the next key tile loads while this one is used */
            wg_load_rows<HD, WG_B>(Ks + ((kt + 1) & 1) * TILE, k, b, (kt + 1) * WG_B, T, K, kvh);
            wg_v_fetch<HD>(vr, v, b, (kt + 1) * WG_B, T, K, kvh);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        mt_fence_proxy_async();
        __syncthreads();
        if (kt <= wlast) {   /* uniform over the warpgroup */
            const unsigned char *Qw = Qs + wg * TILE;
#pragma unroll
            for (int i = 0; i < 32; i++) s[i / 4][i % 4] = 0.0f;
            mt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const int off = (kk >> 2) * HALF + 32 * (kk & 3);
                mt_wgmma_ss<64>(&s[0][0], mt_wgmma_desc_sw128(Qw + off), mt_wgmma_desc_sw128(Kb + off), kk > 0);
            }
            mt_wgmma_commit();
            mt_wgmma_wait<0>();
            float alpha[2];   /* the online softmax, v2's (attn_online.cuh) */
            mt_attn_online_tile(s, m, l, alpha, kt == wlast, kt * WG_B, row0, t, c);
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[4 * j + e] *= alpha[e >> 1];
            uint32_t pa[4][4];   /* P as bf16 A fragments, key steps of 16 (v2_pv's packing) */
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                pa[kk][0] = mt_pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = mt_pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = mt_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = mt_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            mt_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) mt_wgmma_rs<HD>(o, pa[kk], mt_wgmma_desc_sw128(Vb + 32 * kk), 1);
            mt_wgmma_commit();
            mt_wgmma_wait<0>();
        }
        __syncthreads();  /* every warpgroup is done with this buffer before it is refilled */
    }
    if (wlast < 0) return;
    float (&of)[HD / 8][4] = *reinterpret_cast<float (*)[HD / 8][4]>(o);   /* the C layout's n8 tiles */
    mt_attn_online_end<HD>(of, m, l, lse, b, h, T, H, row0, t);
    mt_attn_write_rows<HD>(out, out_b, of, b, w0 + 16 * warp, T, H, h, lane);
}

template <int HD>
static void wg_fwd(float *out, bf16 *out_b, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T,
                   int H, int K)
{
    const size_t smem = 6 * (size_t)WG_B * HD * 2 + MT_WGMMA_ALIGN_SLACK;
    if (!mt_cuda_smem_opt_in(attn_wg_fwd_k<HD>, smem)) return;
    const float c = (1.0f / sqrtf((float)HD)) * WG_LOG2E;
    dim3 grid((unsigned)((T + WG_ROWS - 1) / WG_ROWS), (unsigned)H, (unsigned)B);
    MT_LAUNCH(attn_wg_fwd_k<HD>, grid, WG_THREADS, smem)(out, out_b, lse, q, k, v, T, H, K, c);
    MT_CUDA_KCHECK();
}

void mt_attn_wg_forward(float *out, mt_bf16 *out_b, float *lse, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                        int B, int T, int H, int K, int hd)
{
    if (hd == 64) wg_fwd<64>(out, (bf16 *)out_b, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, K);
    else wg_fwd<128>(out, (bf16 *)out_b, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, H, K);
}
