/*
 * ssm.cu — the Mamba-3 scan and the mixer's glue on the cuda backend
 * (mt_ops.h ssm_scan_*, ssm_prep_*, ssm_gate_norm_*; math in docs/mamba3.md,
 * launch geometry in docs/cuda.md "Mamba-3 on cuda").
 *
 * - scan, chunk > 0: the chunked (SSD) form of src/ops/cpu/ssm.c, every chunk
 *   of every (b, h) in parallel: a block-level scan for the chunk's
 *   cumulative log decay, the intra-chunk products as tiled kernels over
 *   (b, h, chunk, rows or sources), and the state carried between chunks by
 *   one short pass over the T/Q chunks per (b, h, p, n) (forward: S_in;
 *   backward: dS_out, in reverse). See the HOW IT WORKS blocks below.
 * - scan, chunk <= 0: the plain recurrence, kept as the fp32 reference
 *   (mt_ops.h): one block per (b, h), one thread per state row p, S in
 *   shared memory; its backward is the recurrence's adjoint in reverse time,
 *   states recomputed per 64 steps from checkpoints, reductions over p in a
 *   fixed order:
 *     dS += dy_t C_t^T;  dC_t = S_t^T dy_t
 *     dx_t = gamma_t dS B_t + [carry from t+1: beta_{t+1} dS_{t+1} B_t] + D dy_t
 *     dB_t = gamma_t dS^T x_t + [carry: beta_{t+1} dS_{t+1}^T x_t]
 *     dalpha_t = <dS, S_{t-1}>, dgamma_t = x_t . dS B_t, dbeta_t = x_{t-1} . dS B_{t-1}
 *     dS <- alpha_t dS
 * - prep: the rotary angles' cumulative sum as a block-level scan per
 *   (b, h, pair) over tiles of T; the rest per (row, head) and per (row,
 *   group); parameter gradients as two-pass column sums.
 * - gate norm: one block per (row, group); dw as two-pass column sums.
 * No atomics anywhere: every sum has a fixed order, reruns are bit-identical.
 * fp32 throughout, except in precision=bf16 (ssm_scan_*_bf16): there the
 * chunked form's intra-chunk products (steps 4, 7, 8 below) run on tensor
 * cores with bf16 operands (ssd_tc.cu); everything else here stays fp32.
 */
#include "cuda_impl.cuh"
#include "ssd.cuh"

#include <math.h>

#define GLUE_THREADS 64

/* ---------------- chunked (SSD) form: shared pieces ----------------
 *
 * HOW IT WORKS (forward; math in docs/mamba3.md §3, mirrored from
 * src/ops/cpu/ssm.c). Per (b, h) the sequence is cut into nc chunks of
 * Q tokens (the last one q = T - t0 <= Q). Chunk c has 2q sources: j < q is
 * (x_t, B_t) with weight w_j = gamma_t at time t = t0+j, j = q+i is
 * (x_{t-1}, B_{t-1}) with weight beta_t at time t0+i (none at t = 0).
 * cum_i = sum_{r=t0}^{t0+i} a_r (inclusive, inside the chunk).
 *   1. ssd_cum_k      cum per chunk: a block-level scan over the chunk
 *   2. ssd_state_k    Sloc_c = Xc^T diag(w_j exp(cum_last - cum_s(j))) Bc   (P x N per chunk)
 *   3. ssd_pass_k     S_in_0 = 0, S_in_{c+1} = exp(cum_last_c) S_in_c + Sloc_c
 *                     (the only loop along the sequence: nc steps, one thread per (b, h, p, n))
 *   4. ssd_out_k      Y = (C Bc^T o L) Xc + diag(exp cum) C S_in^T + D x,
 *                     L[i,j] = w_j exp(cum_i - cum_s(j)) for s(j) <= i
 * Steps 2 and 4 are the intra-chunk matrix products, tiled per (b, h, chunk,
 * tile); fp32 with fp32 accumulation, every sum in a fixed order (no
 * atomics), so reruns are bit-identical. The backward (below) runs the same
 * pieces plus the adjoint's products; its only sequential loops are the
 * chunk passes (nc steps) and the chunk-local ones (q or 2q terms). */

#define SSD_RT 16             /* query rows (or sources) per block of ssd_out_k and the backward kernels */
/* ssd_out_k's G^T row pitch: a thread writes its source's row as 4 float4s; rows 16
 * floats apart put a phase's 8 lanes on 2 bank groups (4-way: stored one float at a
 * time, 16-way), rows 20 apart on 8 (20 j mod 32 takes 8 values 4 apart): conflict-free,
 * and the rows stay 16-byte aligned for ssd_ld_rt's broadcast reads */
#define SSD_GTP (SSD_RT + 4)
/* the row pitch of the KT x RT transposed tiles (ssd_stage_tile_t, BtT, xtT): 16 lanes
 * store one row's element of 16 columns, c * pitch apart; at 16 they hit 2 banks (8- to
 * 16-way), at 20 8 banks (2-way; a pitch that keeps ssd_ld_rt's 16-byte alignment is a
 * multiple of 4, so 8 is the most) */
#define SSD_RTP (SSD_RT + 4)
#define SSD_SCAN_THREADS 128  /* block of the chunk scans */
#define SSD_ROWS_PER_SCAL ((SSD_QMAX + SSD_SCAN_THREADS - 1) / SSD_SCAN_THREADS)   /* chunk rows a thread of ssd_scal_k */

/* threads for a block over n items: a power of two in [32, cap] */
static inline unsigned pow2_threads(int n, unsigned cap)
{
    unsigned t = 32;
    while (t < (unsigned)n && t < cap) t <<= 1;
    return t;
}

/* In-place inclusive prefix sum (reverse: suffix sum) of a[0..n) in shared
 * memory by the whole block: thread k sums its contiguous segment in order,
 * the segment totals are scanned (Hillis-Steele, log2 blockDim steps, in
 * tot[blockDim]), then each segment adds its offset. The order of additions
 * depends only on n and blockDim: deterministic. Every thread must call it. */
static __device__ void block_scan(float *a, float *tot, int n, int reverse)
{
    int nt = (int)blockDim.x, k = (int)threadIdx.x, seg = (n + nt - 1) / nt;
    int lo = k * seg, hi = lo + seg < n ? lo + seg : n;
    float s = 0.0f;
    for (int i = lo; i < hi; i++) {
        int ix = reverse ? n - 1 - i : i;
        s += a[ix];
        a[ix] = s;
    }
    tot[k] = s;
    __syncthreads();
    for (int o = 1; o < nt; o <<= 1) {
        float v = k >= o ? tot[k - o] : 0.0f;
        __syncthreads();
        tot[k] += v;
        __syncthreads();
    }
    float off = k > 0 ? tot[k - 1] : 0.0f;
    if (k > 0)
        for (int i = lo; i < hi; i++) a[reverse ? n - 1 - i : i] += off;
    __syncthreads();
}

/* Sum of v over the block (blockDim a power of two), tree order fixed by
 * thread numbers; every thread gets the result. red: blockDim entries. */
template <typename F>
static __device__ F block_sum(F v, F *red)
{
    int k = (int)threadIdx.x;
    red[k] = v;
    __syncthreads();
    for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
        if (k < s) red[k] += red[k + s];
        __syncthreads();
    }
    F r = red[0];
    __syncthreads();
    return r;
}

/* 1. cum[(b*H + h)*T + t]: per chunk inclusive sum of a = dt A */
static __global__ void ssd_cum_k(float *cum, const float *dt, const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* a (Q), tot (blockDim) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q;
    float *a = sm, *tot = sm + d.Q, Ah = A[h];
    for (int i = (int)threadIdx.x; i < q; i += (int)blockDim.x) a[i] = dt[((size_t)b * d.T + t0 + i) * d.H + h] * Ah;
    __syncthreads();
    block_scan(a, tot, q, 0);
    for (int i = (int)threadIdx.x; i < q; i += (int)blockDim.x) cum[(size_t)bh * d.T + t0 + i] = a[i];
}

/* Steps 2 and 5 are outer-product sums over a chunk's rows, P x N per chunk:
 * a block takes a 64 x 64 tile of (p, n), 256 threads as 16 x 16 with 4 x 4
 * outputs each, and stages SSD_IT rows of the two operands at a time (64
 * columns each), so one staged pair of float4 feeds 16 multiply-adds.
 * Each output keeps one accumulator and the plain loop's row order. */
#define SSD_OT 64
#define SSD_IT 32

/* stage rows [i0, i0+ni) of two (b, h) operands, tokens t0 + i - shift, the
 * tile's 64 columns each (0 outside the operand or before token 0) */
static __device__ void ssd_stage_pair(float *us, float *vs, const float *u, size_t uld, int ucols, int u0,
                                      const float *v, size_t vld, int vcols, int v0, int t0, int shift, int i0, int ni)
{
    for (int k = (int)threadIdx.x; k < ni * SSD_OT; k += (int)blockDim.x) {
        int r = k / SSD_OT, col = k % SSD_OT, t = t0 + i0 + r - shift;
        us[k] = t >= 0 && u0 + col < ucols ? u[(size_t)t * uld + u0 + col] : 0.0f;
        vs[k] = t >= 0 && v0 + col < vcols ? v[(size_t)t * vld + v0 + col] : 0.0f;
    }
}

/* write a thread's 4 x 4 outputs of the tile at (p0, n0) into out (P x N) */
static __device__ void ssd_put_tile(float *out, const float acc[4][4], int p0, int n0, int P, int N)
{
    int tp = (int)threadIdx.x / 16, tn = (int)threadIdx.x % 16;
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int p = p0 + tp * 4 + a, n = n0 + tn * 4 + b;
            if (p < P && n < N) out[(size_t)p * N + n] = acc[a][b];
        }
}

/* 2. Sst[ci] = sum_j x_tok(j) (v_j B_tok(j))^T, v_j = w_j exp(cum_last - cum_s(j)),
 * own sources (i ascending), then beta sources; the full chunks c < nc-1
 * (grid x: (b, h, c), y: 64 x 64 tiles of (p, n); 256 threads) */
static __global__ void ssd_state_k(float *Sst, const float *cum, const float *x, const float *Bm, const float *dt,
                                   const float *lam, const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* v (2Q), xs, bs (IT x 64 each) */
    int bh = (int)blockIdx.x / (d.nc - 1), c = (int)blockIdx.x % (d.nc - 1), b = bh / d.H, h = bh % d.H;
    int t0 = c * d.Q, q = d.Q, ntn = (d.N + SSD_OT - 1) / SSD_OT;
    int p0 = (int)blockIdx.y / ntn * SSD_OT, n0 = (int)blockIdx.y % ntn * SSD_OT;
    int tp = (int)threadIdx.x / 16, tn = (int)threadIdx.x % 16;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N;
    float *v = sm, *xs = v + SSD_AL4(2 * d.Q), *bs = xs + SSD_IT * SSD_OT;   /* float4 reads: 16-byte aligned */
    const float *cm = cum + (size_t)bh * d.T + t0, Ah = A[h];
    const float *xh = x + (size_t)b * d.T * xld + (size_t)h * d.P, *Bh = Bm + (size_t)b * d.T * bld + (size_t)h * d.N;
    float cl = cm[q - 1];
    for (int i = (int)threadIdx.x; i < q; i += (int)blockDim.x) {
        size_t r = ((size_t)b * d.T + t0 + i) * d.H + h;
        float ex = expf(cl - cm[i]);
        v[i] = ssd_w(1, dt, lam, Ah, r, t0 + i) * ex;
        v[q + i] = ssd_w(0, dt, lam, Ah, r, t0 + i) * ex;
    }
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[a][e] = 0.0f;
    for (int pass = 0; pass < 2; pass++)        /* 0: x_t, B_t; 1: x_{t-1}, B_{t-1} */
        for (int i0 = 0; i0 < q; i0 += SSD_IT) {
            int ni = q - i0 < SSD_IT ? q - i0 : SSD_IT;
            __syncthreads();
            ssd_stage_pair(xs, bs, xh, xld, d.P, p0, Bh, bld, d.N, n0, t0, pass, i0, ni);
            __syncthreads();
            for (int r = 0; r < ni; r++) {
                if (pass && t0 + i0 + r == 0) continue;   /* no beta source at t = 0 */
                float vv = v[pass * q + i0 + r];
                float4 xv = *(const float4 *)(xs + r * SSD_OT + tp * 4), bv = *(const float4 *)(bs + r * SSD_OT + tn * 4);
                float xa[4] = {xv.x, xv.y, xv.z, xv.w}, vb[4] = {vv * bv.x, vv * bv.y, vv * bv.z, vv * bv.w};
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[a][e] += xa[a] * vb[e];
            }
        }
    ssd_put_tile(Sst + ((size_t)bh * d.nc + c) * PN, acc, p0, n0, d.P, d.N);
}

/* both kernels' launch: 64 x 64 tiles of (p, n) on grid y, 256 threads */
static dim3 ssd_tile_grid(unsigned nx, struct ssd_dims d)
{
    return dim3(nx, (unsigned)(((d.P + SSD_OT - 1) / SSD_OT) * ((d.N + SSD_OT - 1) / SSD_OT)));
}

/* 3. in place: Sst[c] (the chunk's own state) -> the state entering chunk c.
 * One thread per (b, h, p, n), nc steps. The loads of SSD_PASS_AHEAD chunks
 * are issued before their stores: the compiler cannot prove a slot's store
 * and the next slot's load apart, so the plain loop waits one memory round
 * trip per chunk (the H100 run of 2026-11-27: 1.6 ms per call at B4 T2048
 * H64 P64 N64, ~20x its bytes at the device's bandwidth). Each slot is
 * still read before it is written and s takes the same operations in the
 * same order: the same bits. */
#define SSD_PASS_AHEAD 8
/* a pass's output: fp32 (in place: So == Sl), or bf16 (the tensor-core scan: the
 * states as the products and the scalars read them, mamba_ssm's state passing's
 * dtype; Sl then a separate fp32 buffer: a bf16 store in place would overwrite
 * floats that other threads have yet to read) */
static __device__ __forceinline__ void ssd_put(float *o, float v) { *o = v; }
static __device__ __forceinline__ void ssd_put(__nv_bfloat16 *o, float v) { *o = __float2bfloat16_rn(v); }
template <typename TO>
static __global__ void ssd_pass_k(TO *So, float *Sl, const float *cum, struct ssd_dims d)
{
    const size_t PN = (size_t)d.P * d.N, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)d.B * d.H * PN) return;
    size_t bh = i / PN, e = i % PN;
    const float *S = Sl + bh * d.nc * PN + e;
    TO *O = So + bh * d.nc * PN + e;
    const float *cl = cum + bh * d.T + d.Q - 1;   /* chunk c's last cumulative log decay: cl[c * Q] */
    float s = 0.0f;
    for (int c0 = 0; c0 < d.nc; c0 += SSD_PASS_AHEAD) {
        float loc[SSD_PASS_AHEAD], dec[SSD_PASS_AHEAD];
#pragma unroll
        for (int k = 0; k < SSD_PASS_AHEAD; k++) {
            const int c = c0 + k;
            loc[k] = c + 1 < d.nc ? S[(size_t)c * PN] : 0.0f;
            dec[k] = c + 1 < d.nc ? cl[(size_t)c * d.Q] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < SSD_PASS_AHEAD; k++) {
            const int c = c0 + k;
            if (c >= d.nc) break;
            ssd_put(O + (size_t)c * PN, s);
            if (c + 1 < d.nc) s = expf(dec[k]) * s + loc[k];
        }
    }
}

/* Staging. The kernels below (4, 7, 8a) read whole rows of B, C, x, dY,
 * S_in and dS_out per output; a thread reading "its" row straight from
 * global memory makes every load of a warp touch 32 cache lines (rows are
 * H*N or H*P floats apart), which serialises the loads one lane at a time
 * (that was 0.6 TF/s on an H200). So a block stages the rows it shares in
 * shared memory, SSD_KT columns at a time, with rows padded to SSD_KT + 1
 * floats (lanes reading one column of consecutive rows hit distinct banks),
 * and each thread keeps SSD_RT outputs in registers (the block's rows or
 * sources), so one staged value feeds SSD_RT multiply-adds. Every output is
 * still summed in the plain order (n, p or i ascending, one accumulator),
 * so the staging changes no bit of the result. */
#define SSD_KT 16
#define SSD_KP (SSD_KT + 1)

/* Source j of a chunk (0 <= j < 2q): its time s(j) inside the chunk and the
 * row of the staged source rows that holds its token, row r <-> token
 * t0 - 1 + r (own source: token t0 + j; beta source: token t0 + s(j) - 1).
 * valid: the token exists (the beta source of t = 0 has none). */
struct ssd_src {
    int sj, r, valid;
};
static __device__ __forceinline__ struct ssd_src ssd_source(int j, int q, int t0)
{
    struct ssd_src s;
    s.sj = j < q ? j : j - q;
    s.r = j < q ? j + 1 : s.sj;
    s.valid = t0 - 1 + s.r >= 0;
    return s;
}

/* loads a thread issues before it uses them (mt_block_move and the loops below):
 * one at a time, a loop waited a memory round trip per element */
#define SSD_AHEAD 8

static __device__ __forceinline__ float ssd_f(float v) { return v; }
static __device__ __forceinline__ float ssd_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* stage rows [0, nr) x columns [c0, c0+kc) of a (b, h) operand into
 * dst[r * SSD_KP + k]; row r is token t0 - 1 + r (0 when it does not exist);
 * src fp32, or bf16 (widened).
 * Banks: the odd pitch SSD_KP = 17 lets thread i read row i conflict-free, but
 * a warp storing two neighbouring rows of 16 (words 17r + [0, 16) and
 * 17r + [17, 33)) puts two words on one bank. With full 16-column tiles a warp
 * stores rows r and r + 16 instead (17 x 16 = 16 mod 32: the two halves take
 * the 32 banks), element e of the move at row ssd_stage_row(e), column e % 16,
 * over whole 32-row blocks (rows past nr skipped) */
static __device__ __forceinline__ int ssd_stage_row(int e)
{
    const int g = e >> 5;   /* the warp-sized group of 32 elements: rows R and R + 16 */
    return (g >> 4) * 32 + (g & 15) + 16 * ((e >> 4) & 1);
}
template <typename T>
static __device__ void ssd_stage_rows(float *dst, const T *src, size_t ld, int t0, int nr, int c0, int kc)
{
    static_assert(SSD_KT == 16 && SSD_KP == 17, "ssd_stage_row pairs rows 16 apart: 17 x 16 = 16 (mod 32)");
    if (kc == SSD_KT) {
        mt_block_move<SSD_AHEAD, float>(
            (nr + 31) / 32 * 32 * SSD_KT,
            [&](int e) {
                const int r = ssd_stage_row(e), tok = t0 - 1 + r;
                return r < nr && tok >= 0 ? ssd_f(src[(size_t)tok * ld + c0 + (e & 15)]) : 0.0f;
            },
            [&](int e, float v) {
                const int r = ssd_stage_row(e);
                if (r < nr) dst[r * SSD_KP + (e & 15)] = v;
            });
        return;
    }
    mt_block_move<SSD_AHEAD, float>(
        nr * kc,
        [&](int k) {
            const int r = k / kc, tok = t0 - 1 + r;
            return tok >= 0 ? ssd_f(src[(size_t)tok * ld + c0 + (k - r * kc)]) : 0.0f;
        },
        [&](int k, float v) {
            const int r = k / kc;
            dst[r * SSD_KP + (k - r * kc)] = v;
        });
}

/* acc + p[0] + p[ld] + ... + p[(n-1) ld], added in that order (its bits are that
 * order's), COL_AHEAD loads issued before they are added: a thread waits a memory
 * round trip per COL_AHEAD terms, not per term. The column sums (one thread a
 * column: a final pass over the prep's 512 per-block rows at the d2048 hybrid,
 * 32 blocks, was 512 round trips a thread, 128 with nvcc's 4-way unroll) and the
 * prep backward's sum of a group's heads */
#define COL_AHEAD 16
static __device__ __forceinline__ float col_chain(const float *p, size_t ld, int n, float acc)
{
    for (int r0 = 0; r0 < n; r0 += COL_AHEAD) {
        float v[COL_AHEAD];
#pragma unroll
        for (int u = 0; u < COL_AHEAD; u++) v[u] = r0 + u < n ? p[(size_t)(r0 + u) * ld] : 0.0f;
#pragma unroll
        for (int u = 0; u < COL_AHEAD; u++)
            if (r0 + u < n) acc += v[u];
    }
    return acc;
}

/* stage the RT x kc tile of rows t+il (ni of them; the rest 0), columns
 * c0.., TRANSPOSED: dst[c * SSD_RTP + il], so that the RT rows of one
 * column are 16 consecutive floats (ssd_ld_rt reads them as 4 float4) */
static __device__ void ssd_stage_tile_t(float *dst, const float *src, size_t ld, int t, int ni, int c0, int kc)
{
    for (int k = (int)threadIdx.x; k < SSD_RT * SSD_KT; k += (int)blockDim.x) {
        int il = k / SSD_KT, c = k % SSD_KT;
        dst[c * SSD_RTP + il] = il < ni && c < kc ? src[(size_t)(t + il) * ld + c0 + c] : 0.0f;
    }
}

/* v[0..RT) = p[0..RT) by 4 float4 loads (p 16-byte aligned): the
 * broadcast operand of the RT multiply-adds in 4 load instructions, not 16 */
static __device__ __forceinline__ void ssd_ld_rt(const float *p, float v[SSD_RT])
{
#pragma unroll
    for (int u = 0; u < SSD_RT / 4; u++) {
        float4 f = ((const float4 *)p)[u];
        v[4 * u] = f.x; v[4 * u + 1] = f.y; v[4 * u + 2] = f.z; v[4 * u + 3] = f.w;
    }
}

/* g[il] = C_{i0+il} . B_tok(source s) for the RT query rows of a tile and
 * this thread's source (ssd_out_k's G and ssd_gm_k's), n ascending: the
 * chunk's source rows (nr of them) staged in St, the tile's C rows
 * transposed in CtT, SSD_KT columns at a time. Every thread must call it. */
static __device__ __forceinline__ void ssd_g_rows(float g[SSD_RT], float *St, float *CtT, const float *Bh,
                                                  const float *Ch, size_t bld, int N, int t0, int i0, int ni, int nr,
                                                  int r, int live)
{
#pragma unroll
    for (int il = 0; il < SSD_RT; il++) g[il] = 0.0f;
    for (int n0 = 0; n0 < N; n0 += SSD_KT) {
        int kn = N - n0 < SSD_KT ? N - n0 : SSD_KT;
        __syncthreads();
        ssd_stage_rows(St, Bh, bld, t0, nr, n0, kn);
        ssd_stage_tile_t(CtT, Ch, bld, t0 + i0, ni, n0, kn);
        __syncthreads();
        if (live)
            for (int k = 0; k < kn; k++) {
                float bv = St[r * SSD_KP + k], cv[SSD_RT];
                ssd_ld_rt(CtT + k * SSD_RTP, cv);
#pragma unroll
                for (int il = 0; il < SSD_RT; il++) g[il] += cv[il] * bv;
            }
    }
}

/* stage np rows x kn columns [n0, n0+kn) of a P x N state (S_in or dS_out,
 * rows from S) into St[row * SSD_KP + c] */
static __device__ __forceinline__ void ssd_stage_state(float *St, const float *S, int N, int np, int n0, int kn)
{
    for (int k = (int)threadIdx.x; k < np * kn; k += (int)blockDim.x)
        St[(k / kn) * SSD_KP + k % kn] = S[(size_t)(k / kn) * N + n0 + k % kn];
}

/* Sums over the block for RT rows at once, in block_sum's tree order:
 * red[il * nt + k] = val[il] of thread k, then red[k] += red[k + st] for
 * st = nt/2 .. 1 (nt = blockDim, a power of two), the RT x st additions of
 * a level spread over the block. Row il's sum ends in red[il * nt]. Every
 * thread must call it. */
static __device__ __forceinline__ void ssd_rows_tree(float *red, const float *val)
{
    int nt = (int)blockDim.x, tid = (int)threadIdx.x;
    __syncthreads();   /* red may overlay what the block read last */
#pragma unroll
    for (int il = 0; il < SSD_RT; il++) red[il * nt + tid] = val[il];
    __syncthreads();
    for (int st = nt / 2; st > 0; st >>= 1) {
        for (int k = tid; k < SSD_RT * st; k += nt) red[(k / st) * nt + k % st] += red[(k / st) * nt + k % st + st];
        __syncthreads();
    }
}

/* 4. Y rows [i0, i0+ni) of chunk ci (grid x: (b, h, c), y: row tiles).
 *   a. thread per source j, the tile's rows in registers:
 *      G[il][j] = (C_i . B_tok(j)) w_j exp(cum_i - cum_s(j))   (0 where s(j) > i)
 *   b. thread per column p, rows in registers:
 *      Y_ip = sum_j G[il][j] x_tok(j),p + e_i C_i . S_in[p] + D x_ip */
static __global__ void ssd_out_k(float *y, const float *Sst, const float *cum, const float *x, const float *Bm,
                                 const float *Cm, const float *dt, const float *lam, const float *A,
                                 const float *Dsk, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* w (2Q), cum (Q), GT (2Q x GTP), CtT (KT x RTP), stage (max((Q+1), blockDim) x KP) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, i0 = (int)blockIdx.y * SSD_RT;
    if (i0 >= q) return;
    int ni = q - i0 < SSD_RT ? q - i0 : SSD_RT, q2 = 2 * q, nt = (int)blockDim.x, tid = (int)threadIdx.x;
    int imax = i0 + ni - 1, nr = imax + 2;    /* source rows: tokens t0-1 .. t0+imax */
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N, ob = (size_t)b * d.T;
    float *w = sm, *cm = w + 2 * d.Q, *GT = sm + SSD_AL4(3 * d.Q), *CtT = GT + SSD_GTP * 2 * d.Q;
    float *St = CtT + SSD_RTP * SSD_KT;
    float Ah = A[h], Dh = Dsk[h];
    const float *Bh = Bm + ob * bld + (size_t)h * d.N, *Ch = Cm + ob * bld + (size_t)h * d.N;
    const float *xh = x + ob * xld + (size_t)h * d.P;
    for (int i = tid; i < q; i += nt) {
        size_t r = (ob + t0 + i) * d.H + h;
        w[i] = ssd_w(1, dt, lam, Ah, r, t0 + i);
        w[q + i] = ssd_w(0, dt, lam, Ah, r, t0 + i);
        cm[i] = cum[(size_t)bh * d.T + t0 + i];
    }
    /* a. G */
    for (int jb = 0; jb < q2; jb += nt) {
        int j = jb + tid;
        struct ssd_src s = ssd_source(j < q2 ? j : 0, q, t0);
        int live = j < q2 && s.valid && s.sj <= imax;
        float g[SSD_RT];
        ssd_g_rows(g, St, CtT, Bh, Ch, bld, d.N, t0, i0, ni, nr, s.r, live);
        if (j < q2) {
            float gt[SSD_RT];
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) {
                int i = i0 + il;
                gt[il] = il < ni && live && s.sj <= i ? g[il] * (w[j] * expf(cm[i] - cm[s.sj])) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < SSD_RT / 4; u++)
                ((float4 *)(GT + j * SSD_GTP))[u] = float4{gt[4 * u], gt[4 * u + 1], gt[4 * u + 2], gt[4 * u + 3]};
        }
    }
    /* b. Y */
    float e[SSD_RT];
#pragma unroll
    for (int il = 0; il < SSD_RT; il++) e[il] = il < ni ? expf(cm[i0 + il]) : 0.0f;
    for (int pb = 0; pb < d.P; pb += nt) {
        int p = pb + tid, live = p < d.P;
        float acc[SSD_RT];
#pragma unroll
        for (int il = 0; il < SSD_RT; il++) acc[il] = 0.0f;
        __syncthreads();   /* G written; the stage free */
        if (live) {
            for (int j = 0; j <= imax; j++) {
                float xv = xh[(size_t)(t0 + j) * xld + p], gv[SSD_RT];
                ssd_ld_rt(GT + j * SSD_GTP, gv);
#pragma unroll
                for (int il = 0; il < SSD_RT; il++)
                    if (il < ni && j <= i0 + il) acc[il] += gv[il] * xv;
            }
            for (int j = 0; j <= imax; j++) {
                if (t0 + j == 0) continue;
                float xv = xh[(size_t)(t0 + j - 1) * xld + p], gv[SSD_RT];
                ssd_ld_rt(GT + (q + j) * SSD_GTP, gv);
#pragma unroll
                for (int il = 0; il < SSD_RT; il++)
                    if (il < ni && j <= i0 + il) acc[il] += gv[il] * xv;
            }
        }
        if (c > 0) {   /* + e_i C_i . S_in[p]: S_in rows p of this chunk staged KT columns at a time */
            float s2[SSD_RT];
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) s2[il] = 0.0f;
            int np = d.P - pb < nt ? d.P - pb : nt;
            const float *S = Sst + (size_t)ci * PN + (size_t)pb * d.N;
            for (int n0 = 0; n0 < d.N; n0 += SSD_KT) {
                int kn = d.N - n0 < SSD_KT ? d.N - n0 : SSD_KT;
                __syncthreads();
                ssd_stage_state(St, S, d.N, np, n0, kn);
                ssd_stage_tile_t(CtT, Ch, bld, t0 + i0, ni, n0, kn);
                __syncthreads();
                if (live)
                    for (int k = 0; k < kn; k++) {
                        float sv = St[tid * SSD_KP + k], cv[SSD_RT];
                        ssd_ld_rt(CtT + k * SSD_RTP, cv);
#pragma unroll
                        for (int il = 0; il < SSD_RT; il++) s2[il] += (e[il] * cv[il]) * sv;
                    }
            }
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) acc[il] += s2[il];
        }
        if (live)
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) {
                if (il >= ni) break;
                size_t t = (size_t)t0 + i0 + il;
                y[(ob + t) * xld + (size_t)h * d.P + p] = acc[il] + Dh * xh[t * xld + p];
            }
    }
}

/* its shared memory */
static size_t ssd_out_smem(struct ssd_dims d, unsigned nt)
{
    size_t stage = (size_t)((size_t)d.Q + 1 > nt ? (size_t)d.Q + 1 : nt) * SSD_KP;
    return (SSD_AL4(3 * (size_t)d.Q) + (size_t)SSD_GTP * 2 * d.Q + SSD_RTP * SSD_KT + stage) * sizeof(float);
}

/* the states entering each chunk (steps 1-3); cum must hold step 1. fp32: into Sst,
 * in place. tc (Sst_b non-NULL): step 2 on tensor cores (ssd_tc.cu) into Sst, the
 * fp32 scratch of each chunk's own state, and the pass into Sst_b, bf16 */
static void ssd_states(float *Sst, __nv_bfloat16 *Sst_b, const float *cum, const float *x, const float *Bm,
                       const float *dt, const float *lam, const float *A, struct ssd_dims d, struct ssd_twins tw)
{
    const size_t PN = (size_t)d.P * d.N;
    if (Sst_b) ssd_tc_state(Sst, cum, x, Bm, dt, lam, A, tw, d);
    else if (d.nc > 1) {
        MT_LAUNCH(ssd_state_k, ssd_tile_grid((unsigned)(d.B * d.H * (d.nc - 1)), d), 256,
                  (SSD_AL4(2 * (size_t)d.Q) + 2 * SSD_IT * SSD_OT) * sizeof(float))(Sst, cum, x, Bm, dt, lam, A, d);
        MT_CUDA_KCHECK();
    }
    size_t n = (size_t)d.B * d.H * PN;
    if (Sst_b) MT_LAUNCH(ssd_pass_k<__nv_bfloat16>, (unsigned)((n + 255) / 256), 256, 0)(Sst_b, Sst, cum, d);
    else MT_LAUNCH(ssd_pass_k<float>, (unsigned)((n + 255) / 256), 256, 0)(Sst, Sst, cum, d);
    MT_CUDA_KCHECK();
}

static void ssd_cum(float *cum, const float *dt, const float *A, struct ssd_dims d)
{
    MT_LAUNCH(ssd_cum_k, (unsigned)(d.B * d.H * d.nc), SSD_SCAN_THREADS,
              ((size_t)d.Q + SSD_SCAN_THREADS) * sizeof(float))(cum, dt, A, d);
    MT_CUDA_KCHECK();
}

/* the floats of workspace that n bf16 values take (16-byte aligned, as every region) */
static size_t ssd_bf16_floats(size_t n) { return SSD_AL4((n + 1) / 2); }

/* tc: step 4 on tensor cores (ssd_tc.cu, precision=bf16; ssd_tc_supports(d)) */
static void ssd_forward(float *y, const float *x, const float *Bm, const float *Cm, const float *dt,
                        const float *lam, const float *A, const float *Dsk, struct ssd_dims d, int tc,
                        float *states, struct ssd_twins tw, __nv_bfloat16 *y_b = NULL)
{
    const size_t PN = (size_t)d.P * d.N, nbh = (size_t)d.B * d.H, nst = nbh * d.nc * PN;
    /* cum (B H, T); Sst: S_in (B H nc, P, N) fp32, in the caller's states when given (kept for the
     * backward); tc: Sst the fp32 scratch of the chunks' own states and S_in bf16 (Sst_b), in the
     * caller's states when given */
    const size_t sb = tc && !states ? ssd_bf16_floats(nst) : 0;   /* Sst_b's floats in ws */
    float *ws = (float *)mt_cuda_workspace((nbh * d.T + (tc || !states ? nst : 0) + sb) * sizeof(float));
    if (!ws) return;
    float *cum = ws, *Sst = tc || !states ? ws + nbh * d.T : states;
    __nv_bfloat16 *Sst_b = !tc ? NULL : states ? (__nv_bfloat16 *)states : (__nv_bfloat16 *)(Sst + nst);
    ssd_cum(cum, dt, A, d);
    ssd_states(Sst, Sst_b, cum, x, Bm, dt, lam, A, d, tw);
    if (tc) { ssd_tc_out(y, y_b, Sst_b, cum, x, Bm, Cm, dt, lam, A, Dsk, tw, d); return; }   /* (y_b: tc only) */
    size_t smem = ssd_out_smem(d, 128);
    if (!mt_cuda_smem_opt_in(ssd_out_k, smem)) return;
    MT_LAUNCH(ssd_out_k, dim3((unsigned)(nbh * d.nc), (unsigned)((d.Q + SSD_RT - 1) / SSD_RT)), 128, smem)(
        y, Sst, cum, x, Bm, Cm, dt, lam, A, Dsk, d);
    MT_CUDA_KCHECK();
}

/* ---------------- chunked (SSD) backward ----------------
 *
 * HOW IT WORKS (derivation: docs/mamba3.md §4; same terms as the cpu's
 * scan_backward_head). With the states entering each chunk S_in (forward
 * steps 1-3) and the gradient leaving each chunk dS_out, every chunk is
 * independent, so the chunks run in parallel:
 *   5. ssd_dloc_k    Dloc_c = (diag(exp cum) dY)^T C          (P x N, chunks c >= 1)
 *   6. ssd_dpass_k   dS_out_{nc-1} = 0, dS_out_{c-1} = exp(cum_last_c) dS_out_c + Dloc_c
 *                    (nc steps, one thread per (b, h, p, n))
 *   7. ssd_gm_k      per query row i: G = C_i Bc^T, dM = dY_i Xc^T; M = G o L,
 *                    dG = dM o L, dLE = dM o G o E (the decay's gradient) and its
 *                    row sum with w (dcum_i's intra term)
 *   8. ssd_dxc_k     dXc_j = M^T dY + v_j (Bc dS_out^T)_j            (per source j)
 *      ssd_dbc_k     dBc_j = dG^T C + v_j (Xc dS_out)_j, q_j = (Xc dS_out)_j . Bc_j
 *      ssd_dc_k      dC_i = dG Bc + e_i (dY S_in)_i, and e_i (dY S_in)_i . C_i
 *   9. ssd_scal_k    dw_j, dcum_i, the reverse scan da = suffix sums of dcum in the
 *                    chunk, then ddt, dlam and the chunk's dA, dD partials
 *  10. ssd_scatter_k dx_t = dXc(own) + dXc(beta source of t+1) + D dy_t; dB alike
 *  11. ssd_reduce_k  dA, dD += the partials, per head over (b, chunk) in order
 * Workspace: cum, S_in, dS_out, M, dG, dLE (q x 2q per chunk), dXc, dBc and
 * the per-row / per-source scalars (ssd_backward). On tensor cores (tc,
 * ssd_tc.cu): 7 writes dLE's column sums instead of dLE, 8 and 10 become
 * ssd_tc_tok_k (dx, dB as token rows) + ssd_tc_edge_k, so the workspace holds
 * no dLE, dXc or dBc (and no S_in when the forward kept the states). */

/* 5. dSo[ci] = sum_i (exp(cum_i) dY_i) C_i^T for chunks c >= 1, i ascending
 * (grid x: (b, h, c-1), y: 64 x 64 tiles of (p, n); 256 threads; as step 2) */
static __global__ void ssd_dloc_k(float *dSo, const float *cum, const float *dy, const float *Cm, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* e (Q), ys, cs (IT x 64 each) */
    int bh = (int)blockIdx.x / (d.nc - 1), c = 1 + (int)blockIdx.x % (d.nc - 1), b = bh / d.H, h = bh % d.H;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, ntn = (d.N + SSD_OT - 1) / SSD_OT;
    int p0 = (int)blockIdx.y / ntn * SSD_OT, n0 = (int)blockIdx.y % ntn * SSD_OT;
    int tp = (int)threadIdx.x / 16, tn = (int)threadIdx.x % 16;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N;
    float *e = sm, *ys = e + SSD_AL4(d.Q), *cs = ys + SSD_IT * SSD_OT;
    const float *dyh = dy + (size_t)b * d.T * xld + (size_t)h * d.P, *Ch = Cm + (size_t)b * d.T * bld + (size_t)h * d.N;
    for (int i = (int)threadIdx.x; i < q; i += (int)blockDim.x) e[i] = expf(cum[(size_t)bh * d.T + t0 + i]);
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[a][k] = 0.0f;
    for (int i0 = 0; i0 < q; i0 += SSD_IT) {
        int ni = q - i0 < SSD_IT ? q - i0 : SSD_IT;
        __syncthreads();
        ssd_stage_pair(ys, cs, dyh, xld, d.P, p0, Ch, bld, d.N, n0, t0, 0, i0, ni);
        __syncthreads();
        for (int r = 0; r < ni; r++) {
            float ev = e[i0 + r];
            float4 yv = *(const float4 *)(ys + r * SSD_OT + tp * 4), cv = *(const float4 *)(cs + r * SSD_OT + tn * 4);
            float ey[4] = {ev * yv.x, ev * yv.y, ev * yv.z, ev * yv.w}, ca[4] = {cv.x, cv.y, cv.z, cv.w};
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int k = 0; k < 4; k++) acc[a][k] += ey[a] * ca[k];
        }
    }
    ssd_put_tile(dSo + ((size_t)bh * d.nc + c) * PN, acc, p0, n0, d.P, d.N);
}

/* 6. in place: dSo[c] (Dloc_c) -> dS_out of chunk c, in reverse chunk order
 * (loads issued SSD_PASS_AHEAD chunks ahead of their stores, as ssd_pass_k) */
template <typename TO>
static __global__ void ssd_dpass_k(TO *So, float *Sl, const float *cum, struct ssd_dims d)
{
    const size_t PN = (size_t)d.P * d.N, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)d.B * d.H * PN) return;
    size_t bh = i / PN, e = i % PN;
    const float *S = Sl + bh * d.nc * PN + e;
    TO *O = So + bh * d.nc * PN + e;
    float s = 0.0f;
    for (int c0 = d.nc - 1; c0 >= 0; c0 -= SSD_PASS_AHEAD) {
        float loc[SSD_PASS_AHEAD], dec[SSD_PASS_AHEAD];
#pragma unroll
        for (int k = 0; k < SSD_PASS_AHEAD; k++) {
            const int c = c0 - k, tl = (c + 1) * d.Q < d.T ? (c + 1) * d.Q - 1 : d.T - 1;
            loc[k] = c > 0 ? S[(size_t)c * PN] : 0.0f;
            dec[k] = c > 0 ? cum[bh * d.T + tl] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < SSD_PASS_AHEAD; k++) {
            const int c = c0 - k;
            if (c < 0) break;
            ssd_put(O + (size_t)c * PN, s);
            if (c > 0) s = expf(dec[k]) * s + loc[k];
        }
    }
}

/* 7-8: each block takes SSD_RT consecutive query rows or sources of one
 * chunk; 7 and 8a stage the rows they share (see "Staging" above), 8b and
 * 8c read along their threads' contiguous columns already. */

/* 7. per (b, h, c, tile of query rows i), thread per source j, the tile's
 * rows in registers: G = C_i . B_tok(j) and dM = dY_i . x_tok(j) (B, x rows
 * and the C, dY tiles staged), then M = G o L, dG = dM o L, dLE = dM o G o E
 * at ((ci*Q + i)*2Q + j), and rs[ci*Q + i] = sum_j w_j dLE[i,j] (each
 * thread's j in order, then the block's tree per row: the order of the
 * one-row-at-a-time kernel). */
static __global__ void ssd_gm_k(float *M, float *dG, float *dLE, float *rs, const float *cum, const float *dy,
                                const float *x, const float *Bm, const float *Cm, const float *dt, const float *lam,
                                const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* red (RT x blockDim), CtT, dYtT (KT x RTP each), Bt, Xt ((Q+1) x KP each) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H, i0 = (int)blockIdx.y * SSD_RT;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, nt = (int)blockDim.x, tid = (int)threadIdx.x;
    if (i0 >= q) return;
    int ni = q - i0 < SSD_RT ? q - i0 : SSD_RT, imax = i0 + ni - 1, nr = imax + 2;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, ob = (size_t)b * d.T;
    float *red = sm, *CtT = red + SSD_RT * nt, *dYtT = CtT + SSD_RTP * SSD_KT, *Bt = dYtT + SSD_RTP * SSD_KT;
    float *Xt = Bt + (d.Q + 1) * SSD_KP;
    const float *cm = cum + (size_t)bh * d.T + t0, Ah = A[h];
    const float *Bh = Bm + ob * bld + (size_t)h * d.N, *Ch = Cm + ob * bld + (size_t)h * d.N;
    const float *xh = x + ob * xld + (size_t)h * d.P, *dyh = dy + ob * xld + (size_t)h * d.P;
    float rsum[SSD_RT];
#pragma unroll
    for (int il = 0; il < SSD_RT; il++) rsum[il] = 0.0f;
    for (int jb = 0; jb < 2 * q; jb += nt) {
        int j = jb + tid;
        struct ssd_src s = ssd_source(j < 2 * q ? j : 0, q, t0);
        int live = j < 2 * q && s.valid && s.sj <= imax;
        float g[SSD_RT], dm[SSD_RT];
        ssd_g_rows(g, Bt, CtT, Bh, Ch, bld, d.N, t0, i0, ni, nr, s.r, live);
#pragma unroll
        for (int il = 0; il < SSD_RT; il++) dm[il] = 0.0f;
        for (int p0 = 0; p0 < d.P; p0 += SSD_KT) {
            int kp = d.P - p0 < SSD_KT ? d.P - p0 : SSD_KT;
            __syncthreads();
            ssd_stage_rows(Xt, xh, xld, t0, nr, p0, kp);
            ssd_stage_tile_t(dYtT, dyh, xld, t0 + i0, ni, p0, kp);
            __syncthreads();
            if (live)
                for (int k = 0; k < kp; k++) {
                    float xv = Xt[s.r * SSD_KP + k], yv[SSD_RT];
                    ssd_ld_rt(dYtT + k * SSD_RTP, yv);
#pragma unroll
                    for (int il = 0; il < SSD_RT; il++) dm[il] += yv[il] * xv;
                }
        }
        if (j >= 2 * q) continue;
        float w = live ? ssd_w(j < q, dt, lam, Ah, (ob + t0 + s.sj) * d.H + h, t0 + s.sj) : 0.0f;
#pragma unroll
        for (int il = 0; il < SSD_RT; il++) {
            int i = i0 + il;
            if (il >= ni) break;
            float m = 0.0f, dg = 0.0f, dle = 0.0f;
            if (live && s.sj <= i) {
                float ex = expf(cm[i] - cm[s.sj]), dmg = dm[il] * g[il], l = w * ex;
                dle = dmg * ex;
                rsum[il] += dmg * w * ex;
                m = g[il] * l;
                dg = dm[il] * l;
            }
            const size_t row = ((size_t)ci * d.Q + i) * 2 * d.Q;
            M[row + j] = m;
            dG[row + j] = dg;
            dLE[row + j] = dle;
        }
    }
    ssd_rows_tree(red, rsum);   /* rs: the tree of block_sum, every row at once */
    if (tid < ni) rs[(size_t)ci * d.Q + i0 + tid] = red[tid * nt];
}

/* 8a and 8b's tile of sources j0 .. j0 + nj - 1 of chunk ci (q rows, tokens from t0): each
 * source's first query row (from; q: none) and token (tok; -1: none) in registers, the tile's
 * least first row (returned); the tile's columns of the chunk's (Q x 2Q) matrix G (M or dG)
 * staged as Gt (q x RT, 0 past nj), and the state term's weight v_j = w_j exp(cum_last -
 * cum_{s(j)}) (0 without a next chunk) */
static __device__ __forceinline__ int ssd_src_tile(int (&from)[SSD_RT], int (&tok)[SSD_RT], float *Gt, float *v,
                                                   const float *G, const float *cm, const float *dt,
                                                   const float *lam, const float *A, int ci, int j0, int nj, int q,
                                                   int t0, int has_next, size_t ob, int h, struct ssd_dims d)
{
    const int nt = (int)blockDim.x, tid = (int)threadIdx.x;
    int smin = q;
#pragma unroll
    for (int jj = 0; jj < SSD_RT; jj++) {
        struct ssd_src s = ssd_source(j0 + jj < 2 * q ? j0 + jj : 0, q, t0);
        const int ok = jj < nj && s.valid;
        from[jj] = ok ? s.sj : q;
        tok[jj] = ok ? t0 - 1 + s.r : -1;
        smin = from[jj] < smin ? from[jj] : smin;
    }
    for (int k = tid; k < q * SSD_RT; k += nt) {
        int i = k / SSD_RT, jj = k % SSD_RT;
        Gt[k] = jj < nj ? G[((size_t)ci * d.Q + i) * 2 * d.Q + j0 + jj] : 0.0f;
    }
    for (int jj = tid; jj < SSD_RT; jj += nt) {
        int j = j0 + jj;
        struct ssd_src s = ssd_source(j < 2 * q ? j : 0, q, t0);
        v[jj] = jj < nj && has_next && s.valid
              ? ssd_w(j < q, dt, lam, A[h], (ob + t0 + s.sj) * d.H + h, t0 + s.sj) * expf(cm[q - 1] - cm[s.sj]) : 0.0f;
    }
    return smin;
}

static size_t ssd_gm_smem(struct ssd_dims d, unsigned nt)
{
    return ((size_t)SSD_RT * nt + 2 * SSD_RTP * SSD_KT + 2 * ((size_t)d.Q + 1) * SSD_KP) * sizeof(float);
}

/* 8a. per (b, h, c, tile of RT sources j), thread per column p, the tile's
 * sources in registers: dXc_j = sum_{i >= s(j)} M[i,j] dY_i + v_j (B_tok(j) . dS_out[p])
 * (the tile's M columns staged once; dS_out rows and the sources' B rows staged KT columns at a time) */
static __global__ void ssd_dxc_k(float *dXc, const float *M, const float *dSo, const float *cum, const float *dy,
                                 const float *Bm, const float *dt, const float *lam, const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* Mt (Q x RT), v (RT), BtT (KT x RTP), St (blockDim x KP) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H, j0 = (int)blockIdx.y * SSD_RT;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, nt = (int)blockDim.x, tid = (int)threadIdx.x;
    if (j0 >= 2 * q) return;
    int nj = 2 * q - j0 < SSD_RT ? 2 * q - j0 : SSD_RT, has_next = c + 1 < d.nc;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N, ob = (size_t)b * d.T;
    float *Mt = sm, *v = Mt + d.Q * SSD_RT, *BtT = v + SSD_RT, *St = BtT + SSD_RTP * SSD_KT;
    const float *cm = cum + (size_t)bh * d.T + t0;
    const float *Bh = Bm + ob * bld + (size_t)h * d.N;
    int from[SSD_RT], tok[SSD_RT];   /* the first query row each source reaches (q: none); tok unused */
    const int smin = ssd_src_tile(from, tok, Mt, v, M, cm, dt, lam, A, ci, j0, nj, q, t0, has_next, ob, h, d);
    for (int pb = 0; pb < d.P; pb += nt) {
        int p = pb + tid, live = p < d.P, np = d.P - pb < nt ? d.P - pb : nt;
        float acc[SSD_RT];
#pragma unroll
        for (int jj = 0; jj < SSD_RT; jj++) acc[jj] = 0.0f;
        __syncthreads();
        if (live) {
            const float *dyh = dy + ob * xld + (size_t)h * d.P + p;
            for (int i = smin; i < q; i++) {
                float dv = dyh[(size_t)(t0 + i) * xld];
                float mv[SSD_RT];
                ssd_ld_rt(Mt + i * SSD_RT, mv);
#pragma unroll
                for (int jj = 0; jj < SSD_RT; jj++)
                    if (i >= from[jj]) acc[jj] += mv[jj] * dv;
            }
        }
        if (has_next) {   /* + v_j B_tok(j) . dS_out[p] */
            float t2[SSD_RT];
#pragma unroll
            for (int jj = 0; jj < SSD_RT; jj++) t2[jj] = 0.0f;
            const float *S = dSo + (size_t)ci * PN + (size_t)pb * d.N;
            for (int n0 = 0; n0 < d.N; n0 += SSD_KT) {
                int kn = d.N - n0 < SSD_KT ? d.N - n0 : SSD_KT;
                __syncthreads();
                ssd_stage_state(St, S, d.N, np, n0, kn);
                for (int k = tid; k < SSD_RT * SSD_KT; k += nt) {
                    int jj = k / SSD_KT, cc = k % SSD_KT;
                    struct ssd_src s = ssd_source(j0 + jj < 2 * q ? j0 + jj : 0, q, t0);
                    BtT[cc * SSD_RTP + jj] = jj < nj && s.valid && cc < kn ? Bh[(size_t)(t0 - 1 + s.r) * bld + n0 + cc] : 0.0f;
                }
                __syncthreads();
                if (live)
                    for (int k = 0; k < kn; k++) {
                        float sv = St[tid * SSD_KP + k], bv[SSD_RT];
                        ssd_ld_rt(BtT + k * SSD_RTP, bv);
#pragma unroll
                        for (int jj = 0; jj < SSD_RT; jj++) t2[jj] += bv[jj] * sv;
                    }
            }
#pragma unroll
            for (int jj = 0; jj < SSD_RT; jj++) acc[jj] += v[jj] * t2[jj];
        }
        if (live)
#pragma unroll
            for (int jj = 0; jj < SSD_RT; jj++) {
                if (jj >= nj) break;
                dXc[((size_t)ci * 2 * d.Q + j0 + jj) * d.P + p] = acc[jj];
            }
    }
}

static size_t ssd_dxc_smem(struct ssd_dims d, unsigned nt)
{
    return ((size_t)d.Q * SSD_RT + SSD_RT + SSD_RTP * SSD_KT + (size_t)nt * SSD_KP) * sizeof(float);
}

/* 8b. per (b, h, c, tile of RT sources j), thread per column n, the tile's
 * sources in registers: dBc_j = sum_{i >= s(j)} dG[i,j] C_i + v_j t_j with
 * t_j[n] = x_tok(j) . dS_out[:, n], and qj[ci*2Q + j] = sum_n t_j[n] B_tok(j)[n]
 * (the tile's dG columns and the sources' x rows staged; C and dS_out read
 * along n, coalesced) */
static __global__ void ssd_dbc_k(float *dBc, float *qj, const float *dG, const float *dSo, const float *cum,
                                 const float *x, const float *Bm, const float *Cm, const float *dt, const float *lam,
                                 const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* red (RT x blockDim), dGt (Q x RT), v (RT), xtT (KT x RTP) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H, j0 = (int)blockIdx.y * SSD_RT;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, nt = (int)blockDim.x, tid = (int)threadIdx.x;
    if (j0 >= 2 * q) return;
    int nj = 2 * q - j0 < SSD_RT ? 2 * q - j0 : SSD_RT, has_next = c + 1 < d.nc;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N, ob = (size_t)b * d.T;
    float *red = sm, *dGt = red + SSD_RT * nt, *v = dGt + d.Q * SSD_RT, *xtT = v + SSD_RT;
    const float *cm = cum + (size_t)bh * d.T + t0;
    const float *Bh = Bm + ob * bld + (size_t)h * d.N, *Ch = Cm + ob * bld + (size_t)h * d.N;
    const float *xh = x + ob * xld + (size_t)h * d.P, *S = dSo + (size_t)ci * PN;
    int from[SSD_RT], tok[SSD_RT];   /* first query row (q: none) and token of each source */
    const int smin = ssd_src_tile(from, tok, dGt, v, dG, cm, dt, lam, A, ci, j0, nj, q, t0, has_next, ob, h, d);
    float qp[SSD_RT];
#pragma unroll
    for (int jj = 0; jj < SSD_RT; jj++) qp[jj] = 0.0f;
    for (int nb = 0; nb < d.N; nb += nt) {
        int n = nb + tid, live = n < d.N;
        float acc[SSD_RT];
#pragma unroll
        for (int jj = 0; jj < SSD_RT; jj++) acc[jj] = 0.0f;
        __syncthreads();
        if (live)
            for (int i = smin; i < q; i++) {
                float cv = Ch[(size_t)(t0 + i) * bld + n];
                float gv[SSD_RT];
                ssd_ld_rt(dGt + i * SSD_RT, gv);
#pragma unroll
                for (int jj = 0; jj < SSD_RT; jj++)
                    if (i >= from[jj]) acc[jj] += gv[jj] * cv;
            }
        if (has_next) {
            float t1[SSD_RT];
#pragma unroll
            for (int jj = 0; jj < SSD_RT; jj++) t1[jj] = 0.0f;
            for (int p0 = 0; p0 < d.P; p0 += SSD_KT) {
                int kp = d.P - p0 < SSD_KT ? d.P - p0 : SSD_KT;
                __syncthreads();
                for (int k = tid; k < SSD_RT * SSD_KT; k += nt) {
                    int jj = k / SSD_KT, cc = k % SSD_KT;
                    struct ssd_src s = ssd_source(j0 + jj < 2 * q ? j0 + jj : 0, q, t0);
                    int tk = jj < nj && s.valid ? t0 - 1 + s.r : -1;   /* = tok[jj] */
                    xtT[cc * SSD_RTP + jj] = tk >= 0 && cc < kp ? xh[(size_t)tk * xld + p0 + cc] : 0.0f;
                }
                __syncthreads();
                if (live)
                    for (int kk = 0; kk < kp; kk++) {
                        float sv = S[(size_t)(p0 + kk) * d.N + n], xv[SSD_RT];
                        ssd_ld_rt(xtT + kk * SSD_RTP, xv);
#pragma unroll
                        for (int jj = 0; jj < SSD_RT; jj++) t1[jj] += xv[jj] * sv;
                    }
            }
            if (live)
#pragma unroll
                for (int jj = 0; jj < SSD_RT; jj++)
                    if (tok[jj] >= 0) {
                        qp[jj] += t1[jj] * Bh[(size_t)tok[jj] * bld + n];
                        acc[jj] += v[jj] * t1[jj];
                    }
        }
        if (live)
#pragma unroll
            for (int jj = 0; jj < SSD_RT; jj++) {
                if (jj >= nj) break;
                dBc[((size_t)ci * 2 * d.Q + j0 + jj) * d.N + n] = acc[jj];
            }
    }
    ssd_rows_tree(red, qp);
    if (tid < nj) qj[(size_t)ci * 2 * d.Q + j0 + tid] = red[tid * nt];
}

static size_t ssd_dbc_smem(struct ssd_dims d, unsigned nt)
{
    return ((size_t)SSD_RT * nt + (size_t)d.Q * SSD_RT + SSD_RT + SSD_RTP * SSD_KT) * sizeof(float);
}

/* 8c. per (b, h, c, tile of RT query rows i), thread per column n, the
 * tile's rows in registers: dC_i = sum_j dG[i,j] B_tok(j) + e_i ds_i with
 * ds_i[n] = dY_i . S_in[:, n], and inter[ci*Q + i] = e_i sum_n ds_i[n] C_i[n]
 * (the tile's dG rows staged transposed, its dY rows KT columns at a time;
 * B and S_in read along n, coalesced) */
static __global__ void ssd_dc_k(float *dCm, float *inter, const float *dG, const float *Sst, const float *cum,
                                const float *dy, const float *Bm, const float *Cm, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);   /* red (RT x blockDim), dGt (2Q x RT), e (RT), ytT (KT x RTP) */
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H, i0 = (int)blockIdx.y * SSD_RT;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, nt = (int)blockDim.x, tid = (int)threadIdx.x;
    if (i0 >= q) return;
    int ni = q - i0 < SSD_RT ? q - i0 : SSD_RT, imax = i0 + ni - 1;
    const size_t xld = (size_t)d.H * d.P, bld = (size_t)d.H * d.N, PN = (size_t)d.P * d.N, ob = (size_t)b * d.T;
    float *red = sm, *dGt = red + SSD_RT * nt, *e = dGt + 2 * d.Q * SSD_RT, *ytT = e + SSD_RT;
    const float *Bh = Bm + ob * bld + (size_t)h * d.N, *Ch = Cm + ob * bld + (size_t)h * d.N;
    const float *dyh = dy + ob * xld + (size_t)h * d.P, *S = Sst + (size_t)ci * PN;
    for (int k = tid; k < 2 * q * SSD_RT; k += nt) {
        int j = k / SSD_RT, il = k % SSD_RT;
        dGt[k] = il < ni ? dG[((size_t)ci * d.Q + i0 + il) * 2 * d.Q + j] : 0.0f;
    }
    for (int il = tid; il < SSD_RT; il += nt) e[il] = il < ni ? expf(cum[(size_t)bh * d.T + t0 + i0 + il]) : 0.0f;
    float de[SSD_RT];
#pragma unroll
    for (int il = 0; il < SSD_RT; il++) de[il] = 0.0f;
    for (int nb = 0; nb < d.N; nb += nt) {
        int n = nb + tid, live = n < d.N;
        float acc[SSD_RT];
#pragma unroll
        for (int il = 0; il < SSD_RT; il++) acc[il] = 0.0f;
        __syncthreads();
        if (live) {
            for (int j = 0; j <= imax; j++) {
                float bv = Bh[(size_t)(t0 + j) * bld + n];
                float gv[SSD_RT];
                ssd_ld_rt(dGt + j * SSD_RT, gv);
#pragma unroll
                for (int il = 0; il < SSD_RT; il++)
                    if (il < ni && j <= i0 + il) acc[il] += gv[il] * bv;
            }
            for (int j = 0; j <= imax; j++) {
                if (t0 + j == 0) continue;
                float bv = Bh[(size_t)(t0 + j - 1) * bld + n];
                float gv[SSD_RT];
                ssd_ld_rt(dGt + (q + j) * SSD_RT, gv);
#pragma unroll
                for (int il = 0; il < SSD_RT; il++)
                    if (il < ni && j <= i0 + il) acc[il] += gv[il] * bv;
            }
        }
        if (c > 0) {
            float ds[SSD_RT];
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) ds[il] = 0.0f;
            for (int p0 = 0; p0 < d.P; p0 += SSD_KT) {
                int kp = d.P - p0 < SSD_KT ? d.P - p0 : SSD_KT;
                __syncthreads();
                ssd_stage_tile_t(ytT, dyh, xld, t0 + i0, ni, p0, kp);
                __syncthreads();
                if (live)
                    for (int kk = 0; kk < kp; kk++) {
                        float sv = S[(size_t)(p0 + kk) * d.N + n], yv[SSD_RT];
                        ssd_ld_rt(ytT + kk * SSD_RTP, yv);
#pragma unroll
                        for (int il = 0; il < SSD_RT; il++) ds[il] += yv[il] * sv;
                    }
            }
            if (live)
#pragma unroll
                for (int il = 0; il < SSD_RT; il++) {
                    if (il >= ni) break;
                    de[il] += ds[il] * Ch[(size_t)(t0 + i0 + il) * bld + n];
                    acc[il] += e[il] * ds[il];
                }
        }
        if (live)
#pragma unroll
            for (int il = 0; il < SSD_RT; il++) {
                if (il >= ni) break;
                dCm[(ob + t0 + i0 + il) * bld + (size_t)h * d.N + n] = acc[il];
            }
    }
    ssd_rows_tree(red, de);
    if (tid < ni) inter[(size_t)ci * d.Q + i0 + tid] = red[tid * nt] * e[tid];
}

static size_t ssd_dc_smem(struct ssd_dims d, unsigned nt)
{
    return ((size_t)SSD_RT * nt + 2 * (size_t)d.Q * SSD_RT + SSD_RT + SSD_RTP * SSD_KT) * sizeof(float);
}

/* 9. one block per (b, h, c): dw_j, dcum_i, da = reverse scan of dcum in the
 * chunk, ddt and dlam (=), and the chunk's dA, dD partials (double) */
/* colsum_j = sum_i dLE[i,j] (dLE is 0 for i < s(j)): from dLE's rows, or
 * (cs, tensor cores) from its column sums per 16-row strip, in strip order */
static __device__ __forceinline__ float ssd_colsum(const float *dL, const float *cs, int j, int q, int sj, size_t Q2)
{
    float a = 0.0f;
    if (cs)
        for (int s = 0; s < (q + 15) / 16; s++) a += cs[(size_t)s * Q2 + j];
    else
        for (int i = sj; i < q; i++) a += dL[(size_t)i * Q2 + j];
    return a;
}

/* dLE: the chunks' dLE (B H nc, Q, 2Q), or with colsums (tensor cores,
 * ssd_tc.cu) its strip column sums (B H nc, SSD_TC_STRIPS(Q), 2Q) */
template <typename TS>
static __global__ void ssd_scal_k(float *ddt, float *dlam, double *part, const float *dLE, int colsums, const float *rs,
                                  const float *qj, const float *inter, const TS *Sst, const TS *dSo,
                                  const float *cum, const float *dy, const __nv_bfloat16 *yb, const float *x,
                                  const __nv_bfloat16 *xb, const float *dt, const float *lam, const float *A,
                                  struct ssd_dims d)
{
    MT_DYN_SMEM(double, dred);   /* blockDim doubles, then dcum (Q), dw, csum (2Q each), tot (blockDim), ys, xs (Q x KP) floats */
    float *dcum = (float *)(dred + blockDim.x), *dw = dcum + d.Q, *csum = dw + 2 * d.Q, *tot = csum + 2 * d.Q;
    float *ys = tot + blockDim.x, *xs = ys + d.Q * SSD_KP;
    int ci = (int)blockIdx.x, bh = ci / d.nc, c = ci % d.nc, b = bh / d.H, h = bh % d.H, nt = (int)blockDim.x;
    int t0 = c * d.Q, q = d.T - t0 < d.Q ? d.T - t0 : d.Q, has_next = c + 1 < d.nc;
    const size_t xld = (size_t)d.H * d.P, PN = (size_t)d.P * d.N, ob = (size_t)b * d.T, Q2 = 2 * (size_t)d.Q;
    const float *cm = cum + (size_t)bh * d.T + t0, Ah = A[h];
    const float *dL = colsums ? NULL : dLE + (size_t)ci * d.Q * Q2;
    const float *cs = colsums ? dLE + (size_t)ci * SSD_TC_STRIPS(d.Q) * Q2 : NULL;
    const float *qc = qj + (size_t)ci * Q2;
    /* dw_j = sum_{i >= s(j)} dLE[i,j] (+ q_j E[q-1, s(j)] through S_out); the column
     * sums kept for dcum below (read after block_sum's barriers) */
    for (int j = (int)threadIdx.x; j < 2 * q; j += nt) {
        int sj = j < q ? j : j - q;
        float a = ssd_colsum(dL, cs, j, q, sj, Q2);
        csum[j] = a;
        if (has_next) a += qc[j] * expf(cm[q - 1] - cm[sj]);
        dw[j] = a;
    }
    /* through S_out: dcum_{q-1} += sum_j q_j v_j; the <dS_out, S_in> term */
    double sq = 0.0, sd = 0.0;
    if (has_next)
        for (int j = (int)threadIdx.x; j < 2 * q; j += nt) {
            int sj = j < q ? j : j - q;
            sq += (double)(qc[j] * ssd_w(j < q, dt, lam, Ah, (ob + t0 + sj) * d.H + h, t0 + sj) * expf(cm[q - 1] - cm[sj]));
        }
    if (c > 0)   /* SSD_AHEAD pairs loaded a thread, then summed in the same order */
        for (size_t k0 = threadIdx.x; k0 < PN; k0 += (size_t)SSD_AHEAD * nt) {
            float so[SSD_AHEAD], si[SSD_AHEAD];
#pragma unroll
            for (int u = 0; u < SSD_AHEAD; u++) {
                const size_t k = k0 + (size_t)u * nt;
                so[u] = k < PN ? ssd_f(dSo[(size_t)ci * PN + k]) : 0.0f;
                si[u] = k < PN ? ssd_f(Sst[(size_t)ci * PN + k]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < SSD_AHEAD; u++)
                if (k0 + (size_t)u * nt < PN) sd += (double)so[u] * (double)si[u];
        }
    sq = block_sum(sq, dred);
    sd = block_sum(sd, dred);
    /* dcum_i = rowsum_i - sum_{i' >= i} w dLE[i', src(i)] - q_j v_j (both sources of time i) + inter_i */
    for (int i = (int)threadIdx.x; i < q; i += nt) {
        size_t r = (ob + t0 + i) * d.H + h;
        float w0 = ssd_w(1, dt, lam, Ah, r, t0 + i), w1 = ssd_w(0, dt, lam, Ah, r, t0 + i), col = 0.0f;
        if (cs) col = w0 * csum[i] + w1 * csum[q + i];
        else   /* dLE itself: the products summed row by row (the fp32 path) */
            for (int k = i; k < q; k++) col += w0 * dL[(size_t)k * Q2 + i] + w1 * dL[(size_t)k * Q2 + q + i];
        float v = rs[(size_t)ci * d.Q + i] - col;
        if (has_next) {
            float el = expf(cm[q - 1] - cm[i]);
            v -= qc[i] * (w0 * el) + qc[q + i] * (w1 * el);
        }
        if (c > 0) v += inter[(size_t)ci * d.Q + i];
        if (i == q - 1) v += (float)sq + (c > 0 ? (float)sd * expf(cm[q - 1]) : 0.0f);
        dcum[i] = v;
    }
    __syncthreads();
    block_scan(dcum, tot, q, 1);
    /* dD's terms dY_t . x_t, a row a thread: the chunk's dY and x rows staged
     * KT columns at a time (rows padded: thread i reads row i conflict-free;
     * before, each thread read its own row from global memory, uncoalesced) */
    float sxy[SSD_ROWS_PER_SCAL];
#pragma unroll
    for (int u = 0; u < SSD_ROWS_PER_SCAL; u++) sxy[u] = 0.0f;
    for (int p0 = 0; p0 < d.P; p0 += SSD_KT) {
        int kp = d.P - p0 < SSD_KT ? d.P - p0 : SSD_KT;
        __syncthreads();
        /* row i: token t0 + i; dy, or (NULL) its bf16 twin widened, and x likewise */
        if (dy) ssd_stage_rows(ys, dy + ob * xld + (size_t)h * d.P, xld, t0 + 1, q, p0, kp);
        else ssd_stage_rows(ys, yb + ob * xld + (size_t)h * d.P, xld, t0 + 1, q, p0, kp);
        if (xb) ssd_stage_rows(xs, xb + ob * (size_t)d.xsb + (size_t)h * d.P, (size_t)d.xsb, t0 + 1, q, p0, kp);
        else ssd_stage_rows(xs, x + ob * (size_t)d.xs + (size_t)h * d.P, (size_t)d.xs, t0 + 1, q, p0, kp);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < SSD_ROWS_PER_SCAL; u++) {
            int i = (int)threadIdx.x + u * nt;
            if (i < q)
                for (int k = 0; k < kp; k++) sxy[u] += ys[i * SSD_KP + k] * xs[i * SSD_KP + k];
        }
    }
    double pa = 0.0, pd = 0.0;
    for (int i = (int)threadIdx.x, u = 0; i < q; i += nt, u++) {
        int t = t0 + i;
        size_t r = (ob + t) * d.H + h;
        float dd = dt[r], l = lam[r], al = expf(dd * Ah), run = dcum[i], dg = dw[i], db = t > 0 ? dw[q + i] : 0.0f;
        float beta = (1.0f - l) * dd * al;
        ddt[r] = run * Ah + dg * l + db * (1.0f - l) * al * (1.0f + dd * Ah);
        dlam[r] = dg * dd - db * dd * al;
        pa += (double)run * dd + (double)db * beta * dd;
        float sv = 0.0f;
#pragma unroll
        for (int w = 0; w < SSD_ROWS_PER_SCAL; w++) sv = w == u ? sxy[w] : sv;
        pd += sv;
    }
    pa = block_sum(pa, dred);
    pd = block_sum(pd, dred);
    if (threadIdx.x == 0) { part[2 * (size_t)ci] = pa; part[2 * (size_t)ci + 1] = pd; }
}

/* 10. one block per row (b, t, h), threads over its P + N columns: the own
 * source plus the beta source of token t+1 (in the next chunk for a chunk's
 * last token). (Before: one thread per element with five 64-bit divisions
 * for its indices: 0.64 ms a call on the H100 of 2026-11-27, ~3x its bytes.)
 * The same additions in the same order: the same bits. */
static __global__ void ssd_scatter_k(float *dx, float *dBm, const float *dXc, const float *dBc, const float *dy,
                                     const float *Dsk, struct ssd_dims d)
{
    const size_t rh = blockIdx.x;   /* (b*T + t)*H + h */
    const int h = (int)(rh % d.H), bt = (int)(rh / d.H), t = bt % d.T, b = bt / d.T, bh = b * d.H + h;
    const size_t ci = (size_t)bh * d.nc + t / d.Q;
    const int has1 = t + 1 < d.T, c1 = (t + 1) / d.Q, t01 = c1 * d.Q, q1 = d.T - t01 < d.Q ? d.T - t01 : d.Q;
    const size_t own = ci * 2 * d.Q + (size_t)(t % d.Q), nxt = ((size_t)bh * d.nc + c1) * 2 * d.Q + q1 + (t + 1 - t01);
    const float Dh = Dsk[h];
    for (int k = (int)threadIdx.x; k < d.P + d.N; k += (int)blockDim.x) {
        const int is_x = k < d.P, m = is_x ? k : k - d.P, width = is_x ? d.P : d.N;
        const float *src = is_x ? dXc : dBc;
        float v = src[own * width + m];
        if (is_x) v += Dh * dy[rh * d.P + m];
        if (has1) v += src[nxt * width + m];
        if (is_x) dx[rh * d.P + m] = v;
        else dBm[rh * d.N + m] = v;
    }
}

/* 11. dA, dDsk (+=): per head, the (b, chunk) partials in order */
static __global__ void ssd_reduce_k(float *dA, float *dDsk, const double *part, struct ssd_dims d)
{
    int h = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (h >= d.H) return;
    double a = 0.0, s = 0.0;
    for (int b = 0; b < d.B; b++)
        for (int c0 = 0; c0 < d.nc; c0 += SSD_AHEAD) {   /* the loads ahead, the sums in order */
            double pa[SSD_AHEAD], ps[SSD_AHEAD];
#pragma unroll
            for (int u = 0; u < SSD_AHEAD; u++) {
                const size_t ci = ((size_t)b * d.H + h) * d.nc + c0 + u;
                pa[u] = c0 + u < d.nc ? part[2 * ci] : 0.0;
                ps[u] = c0 + u < d.nc ? part[2 * ci + 1] : 0.0;
            }
#pragma unroll
            for (int u = 0; u < SSD_AHEAD; u++)
                if (c0 + u < d.nc) a += pa[u], s += ps[u];
        }
    dA[h] += (float)a;
    dDsk[h] += (float)s;
}

/* dxb, dBb, dCb (tensor cores only): dx, dBm, dCm written there as bf16 instead
 * (ssd_tc_backward_products) */
static void ssd_backward(float *dx, __nv_bfloat16 *dxb, float *dBm, __nv_bfloat16 *dBb, float *dCm,
                         __nv_bfloat16 *dCb, float *ddt, float *dlam, float *dA,
                         float *dDsk, const float *dy, const float *x, const float *Bm, const float *Cm,
                         const float *dt, const float *lam, const float *A, const float *Dsk, struct ssd_dims d,
                         int tc, const float *states, struct ssd_twins tw)
{
    const size_t PN = (size_t)d.P * d.N, nbh = (size_t)d.B * d.H, nch = nbh * d.nc, Q2 = 2 * (size_t)d.Q;
    /* per-source rows (fp32 kernels) or, on tensor cores, a chunk's source q
     * alone (ssd_tc.cu writes dx, dBm as token rows); S_in's slot only when
     * the forward did not keep the states */
    const size_t src_rows = tc ? 1 : Q2;
    /* S_in: fp32 (B H nc, P, N), or on tensor cores bf16 (in half the floats) and dS_out too,
     * beside its fp32 slot (each chunk's local part, passed into the bf16 copy) */
    const size_t half = ssd_bf16_floats(nch * PN), sst = states ? 0 : tc ? half : nch * PN, dsb = tc ? half : 0;
    const size_t dle = tc ? nch * SSD_TC_STRIPS(d.Q) * Q2 : nch * d.Q * Q2;   /* dLE, or its column sums */
    const size_t mg = tc ? SSD_AL4(nch * d.Q * d.Q) : nch * d.Q * Q2;   /* M, dG: bf16 on tensor cores */
    const size_t lastx = tc ? nch * (size_t)d.P : 0;   /* ssd_tc_backward_products' last_x */
    const size_t lastb = tc && dBb ? nch * (size_t)d.N : 0;   /* ... and last_B */
    const size_t nf = nbh * d.T + sst + nch * PN + dsb + 2 * mg + dle + nch * src_rows * ((size_t)d.P + d.N)
                    + nch * Q2 + 2 * nch * d.Q + lastx + lastb;
    double *part = (double *)mt_cuda_workspace(2 * nch * sizeof(double) + nf * sizeof(float));
    if (!part) return;
    /* part (B H nc, 2) doubles; cum (B H, T); Sst = S_in, dSo = dS_out (B H nc, P, N), on tensor
     * cores S_in bf16 (sst: half the floats, none when kept) and dS_out's bf16 copy dSo_b after its
     * fp32 slot (the chunks' local parts, read by the pass);
     * M, dG, dLE (B H nc, Q, 2Q; tensor cores: M, dG as bf16, dLE's strip column sums, (B H nc, strips, 2Q)); dXc (B H nc, 2Q or 1, P); dBc (B H nc, 2Q or 1, N);
     * qj (B H nc, 2Q); rs, inter (B H nc, Q); last_x (tensor cores: B H nc, P); last_B (dBb: B H nc, N) */
    float *cum = (float *)(part + 2 * nch), *Sst = cum + nbh * d.T, *dSo = Sst + sst;
    __nv_bfloat16 *dSo_b = tc ? (__nv_bfloat16 *)(dSo + nch * PN) : NULL;
    float *M = dSo + nch * PN + dsb, *dG = M + mg, *dLE = dG + mg;
    float *dXc = dLE + dle, *dBc = dXc + nch * src_rows * d.P, *qj = dBc + nch * src_rows * d.N;
    float *rs = qj + nch * Q2, *inter = rs + nch * d.Q, *last_x = inter + nch * d.Q, *last_B = last_x + lastx;
    ssd_cum(cum, dt, A, d);
    /* S_in: the forward's when it kept them (the same kernels' values), else recomputed
     * (tc: the chunks' own states in dSo's slot, free until dS_out's local part).
     * Only read from here on (the pointer's const is the forward's contract, cast away) */
    __nv_bfloat16 *Sst_b = !tc ? NULL : states ? (__nv_bfloat16 *)states : (__nv_bfloat16 *)Sst;
    if (states) Sst = (float *)states;
    else if (tc) ssd_states(dSo, Sst_b, cum, x, Bm, dt, lam, A, d, tw);
    else ssd_states(Sst, NULL, cum, x, Bm, dt, lam, A, d, tw);
    if (tc) ssd_tc_dloc(dSo, cum, dy, Cm, tw, d);
    else if (d.nc > 1) {
        MT_LAUNCH(ssd_dloc_k, ssd_tile_grid((unsigned)(nbh * (d.nc - 1)), d), 256,
                  (SSD_AL4((size_t)d.Q) + 2 * SSD_IT * SSD_OT) * sizeof(float))(dSo, cum, dy, Cm, d);
        MT_CUDA_KCHECK();
    }
    if (tc) MT_LAUNCH(ssd_dpass_k<__nv_bfloat16>, (unsigned)((nbh * PN + 255) / 256), 256, 0)(dSo_b, dSo, cum, d);
    else MT_LAUNCH(ssd_dpass_k<float>, (unsigned)((nbh * PN + 255) / 256), 256, 0)(dSo, dSo, cum, d);
    MT_CUDA_KCHECK();
    if (tc) {   /* steps 7-8 on tensor cores (ssd_tc.cu) */
        ssd_tc_backward_products(M, dG, dLE, rs, dx, dxb, last_x, dBm, dBb, last_B, dXc, dBc, qj, dCm, dCb, inter,
                                 Sst_b, dSo_b, cum, dy, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    } else {
        unsigned tj = pow2_threads(2 * d.Q, 256), tp = pow2_threads(d.P, 256), tn = pow2_threads(d.N, 256);
        unsigned rt = (unsigned)((d.Q + SSD_RT - 1) / SSD_RT), st = (unsigned)((Q2 + SSD_RT - 1) / SSD_RT);
        size_t gm_smem = ssd_gm_smem(d, tj);
        if (!mt_cuda_smem_opt_in(ssd_gm_k, gm_smem)) return;
        MT_LAUNCH(ssd_gm_k, dim3((unsigned)nch, rt), tj, gm_smem)(M, dG, dLE, rs, cum, dy, x, Bm, Cm, dt, lam, A, d);
        MT_CUDA_KCHECK();
        MT_LAUNCH(ssd_dxc_k, dim3((unsigned)nch, st), tp, ssd_dxc_smem(d, tp))(dXc, M, dSo, cum, dy, Bm, dt, lam, A, d);
        MT_CUDA_KCHECK();
        MT_LAUNCH(ssd_dbc_k, dim3((unsigned)nch, st), tn, ssd_dbc_smem(d, tn))(dBc, qj, dG, dSo, cum, x, Bm, Cm, dt,
                                                                                  lam, A, d);
        MT_CUDA_KCHECK();
        size_t dc_smem = ssd_dc_smem(d, tn);
        if (!mt_cuda_smem_opt_in(ssd_dc_k, dc_smem)) return;
        MT_LAUNCH(ssd_dc_k, dim3((unsigned)nch, rt), tn, dc_smem)(dCm, inter, dG, Sst, cum, dy, Bm, Cm, d);
        MT_CUDA_KCHECK();
    }
    unsigned ts = SSD_SCAN_THREADS;
    const size_t scal_smem = ts * sizeof(double) + (5 * (size_t)d.Q + ts + 2 * (size_t)d.Q * SSD_KP) * sizeof(float);
    if (tc)
        MT_LAUNCH(ssd_scal_k<__nv_bfloat16>, (unsigned)nch, ts, scal_smem)(
            ddt, dlam, part, dLE, tc, rs, qj, inter, Sst_b, dSo_b, cum, dy, tw.Y, x, tw.X, dt, lam, A, d);
    else
        MT_LAUNCH(ssd_scal_k<float>, (unsigned)nch, ts, scal_smem)(
            ddt, dlam, part, dLE, tc, rs, qj, inter, Sst, dSo, cum, dy, tw.Y, x, tw.X, dt, lam, A, d);
    MT_CUDA_KCHECK();
    if (!tc) {   /* (tensor cores: dx, dBm written above) */
        MT_LAUNCH(ssd_scatter_k, (unsigned)((size_t)d.B * d.T * d.H), pow2_threads(d.P + d.N, 256), 0)(dx, dBm, dXc,
                                                                                                        dBc, dy, Dsk, d);
        MT_CUDA_KCHECK();
    }
    MT_LAUNCH(ssd_reduce_k, (unsigned)((d.H + 63) / 64), 64, 0)(dA, dDsk, part, d);
    MT_CUDA_KCHECK();
}

/* ---------------- scan forward (recurrence) ---------------- */

static __global__ void scan_fwd_k(float *y, const float *x, const float *Bm, const float *Cm, const float *dt,
                                  const float *lam, const float *A, const float *Dsk, int T, int H, int P, int N)
{
    MT_DYN_SMEM(float, sm);
    float *S = sm, *bb = S + (size_t)P * N, *cc = bb + 2 * N;  /* bb: two B buffers */
    int bh = blockIdx.x, b = bh / H, h = bh % H, p = threadIdx.x;
    const size_t xld = (size_t)H * P, bld = (size_t)H * N;
    const float *xb = x + (size_t)b * T * xld + (size_t)h * P, *Bb = Bm + (size_t)b * T * bld + (size_t)h * N;
    const float *Cb = Cm + (size_t)b * T * bld + (size_t)h * N;
    const float *dtb = dt + (size_t)b * T * H + h, *lb = lam + (size_t)b * T * H + h;
    float *yb = y + (size_t)b * T * xld + (size_t)h * P;
    float Ah = A[h], Dh = Dsk[h], xprev = 0.0f;
    for (int i = p; i < P * N; i += blockDim.x) S[i] = 0.0f;
    for (int t = 0; t < T; t++) {
        float *bcur = bb + (t & 1) * N, *bprev = bb + ((t + 1) & 1) * N;
        __syncthreads();
        for (int n = p; n < N; n += blockDim.x) {
            bcur[n] = Bb[(size_t)t * bld + n];
            cc[n] = Cb[(size_t)t * bld + n];
        }
        __syncthreads();
        if (p < P) {
            float d = dtb[(size_t)t * H], l = lb[(size_t)t * H], al = expf(d * Ah);
            float xt = xb[(size_t)t * xld + p];
            float gx = l * d * xt, bx = t > 0 ? (1.0f - l) * d * al * xprev : 0.0f, acc = 0.0f;
            float *s = S + (size_t)p * N;
            for (int n = 0; n < N; n++) {
                float v = al * s[n] + gx * bcur[n];
                if (t > 0) v += bx * bprev[n];
                s[n] = v;
                acc += v * cc[n];
            }
            yb[(size_t)t * xld + p] = acc + Dh * xt;
            xprev = xt;
        }
    }
}

extern "C" void mt_cuda_ssm_scan_forward(void *be, float *y, const float *x, const float *Bm, const float *Cm,
                                         const float *dt, const float *lam, const float *A, const float *Dsk,
                                         int B, int T, int H, int P, int N, int chunk)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B * H == 0 || T == 0) return;
    if (chunk > 0) {
        ssd_forward(y, x, Bm, Cm, dt, lam, A, Dsk, ssd_dims_make(B, T, H, P, N, chunk), 0, NULL, ssd_twins{});
        return;
    }
    if (P > 1024) { MT_CUDA_UNSUPPORTED("ssm scan: headdim > 1024"); return; }
    size_t smem = ((size_t)P * N + 3 * (size_t)N) * sizeof(float);
    MT_LAUNCH(scan_fwd_k, B * H, P, smem)(y, x, Bm, Cm, dt, lam, A, Dsk, T, H, P, N);
    MT_CUDA_KCHECK();
}

/* ---------------- scan backward ---------------- */

/* One recurrence step of row p: s = alpha s + gamma x_t B_t + beta x_{t-1} B_{t-1}. */
static __device__ void step_row(float *s, float al, float gx, float bx, const float *bt, const float *bp, int N, int t)
{
    for (int n = 0; n < N; n++) {
        float v = al * s[n] + gx * bt[n];
        if (t > 0) v += bx * bp[n];
        s[n] = v;
    }
}

/* One block per (sequence, head), thread p owns state row p. Why one long
 * kernel (~120 lines): the reverse pass keeps the carried dS, the chunk's
 * recomputed states and the x / B carries in shared memory across every
 * time step, with __syncthreads between the row and column phases; split
 * into kernels, that state would round-trip through global memory each
 * step, and into __device__ helpers each would take most of the locals.
 * The phases are labelled instead: 1. checkpoints of S per chunk; 2. chunks
 * in reverse: recompute the chunk's states, then per step the row phase
 * (dS, dx), the column phase (dB, dC) and the scalars (ddt, dlam, dA, dD). */
static __global__ void scan_bwd_k(float *dx, float *dBm, float *dCm, float *ddt, float *dlam, float *part,
                                  float *ws, const float *dy, const float *x, const float *Bm, const float *Cm,
                                  const float *dt, const float *lam, const float *A, const float *Dsk,
                                  int T, int H, int P, int N, int Q)
{
    MT_DYN_SMEM(float, sm);
    const int nc = (T + Q - 1) / Q;
    float *dS = sm, *red = dS + (size_t)P * N, *dyv = red + 3 * (size_t)P, *carryB = dyv + P;
    int bh = blockIdx.x, b = bh / H, h = bh % H, p = threadIdx.x;
    const size_t xld = (size_t)H * P, bld = (size_t)H * N, PN = (size_t)P * N;
    float *ck = ws + (size_t)bh * (size_t)(nc + Q) * PN, *cs = ck + (size_t)nc * PN;
    const size_t ob = (size_t)b * T;
    const float *xb = x + ob * xld + (size_t)h * P, *Bb = Bm + ob * bld + (size_t)h * N;
    const float *Cb = Cm + ob * bld + (size_t)h * N, *dyb = dy + ob * xld + (size_t)h * P;
    const float *dtb = dt + ob * H + h, *lb = lam + ob * H + h;
    float *dxb = dx + ob * xld + (size_t)h * P, *dBb = dBm + ob * bld + (size_t)h * N, *dCb = dCm + ob * bld + (size_t)h * N;
    float *ddtb = ddt + ob * H + h, *dlb = dlam + ob * H + h;
    float Ah = A[h], Dh = Dsk[h];
    /* 1. checkpoints: ck[c] = S before chunk c (row p by thread p) */
    if (p < P) {
        for (int n = 0; n < N; n++) ck[(size_t)p * N + n] = 0.0f;
        for (int c = 0; c + 1 < nc; c++) {
            const float *cur = ck + (size_t)c * PN + (size_t)p * N;
            float *nx = ck + (size_t)(c + 1) * PN + (size_t)p * N;
            for (int n = 0; n < N; n++) nx[n] = cur[n];
            for (int t = c * Q; t < (c + 1) * Q; t++) {
                float d = dtb[(size_t)t * H], l = lb[(size_t)t * H], al = expf(d * Ah);
                float gx = l * d * xb[(size_t)t * xld + p];
                float bx = t > 0 ? (1.0f - l) * d * al * xb[(size_t)(t - 1) * xld + p] : 0.0f;
                step_row(nx, al, gx, bx, Bb + (size_t)t * bld, t > 0 ? Bb + (size_t)(t - 1) * bld : Bb, N, t);
            }
        }
    }
    for (int i = p; i < (int)PN; i += blockDim.x) dS[i] = 0.0f;
    for (int n = p; n < N; n += blockDim.x) carryB[n] = 0.0f;
    float carryx = 0.0f;
    double dA_acc = 0.0, dD_acc = 0.0;
    __syncthreads();
    /* 2. chunks in reverse */
    for (int c = nc - 1; c >= 0; c--) {
        int t0 = c * Q, q = T - t0 < Q ? T - t0 : Q;
        /* states S_t for t in the chunk: cs[i] = S_{t0+i} */
        if (p < P) {
            const float *prev = ck + (size_t)c * PN + (size_t)p * N;
            for (int i = 0; i < q; i++) {
                int t = t0 + i;
                float *s = cs + (size_t)i * PN + (size_t)p * N;
                for (int n = 0; n < N; n++) s[n] = prev[n];
                float d = dtb[(size_t)t * H], l = lb[(size_t)t * H], al = expf(d * Ah);
                float gx = l * d * xb[(size_t)t * xld + p];
                float bx = t > 0 ? (1.0f - l) * d * al * xb[(size_t)(t - 1) * xld + p] : 0.0f;
                step_row(s, al, gx, bx, Bb + (size_t)t * bld, t > 0 ? Bb + (size_t)(t - 1) * bld : Bb, N, t);
                prev = s;
            }
        }
        __syncthreads();
        for (int i = q - 1; i >= 0; i--) {
            int t = t0 + i;
            const float *St = cs + (size_t)i * PN;
            const float *Sp = i > 0 ? cs + (size_t)(i - 1) * PN : ck + (size_t)c * PN;
            const float *Bt = Bb + (size_t)t * bld, *Bp = t > 0 ? Bb + (size_t)(t - 1) * bld : Bb;
            const float *Ct = Cb + (size_t)t * bld;
            float d = dtb[(size_t)t * H], l = lb[(size_t)t * H], al = expf(d * Ah);
            float ga = l * d, be = t > 0 ? (1.0f - l) * d * al : 0.0f;
            if (p < P) dyv[p] = dyb[(size_t)t * xld + p];
            __syncthreads();
            /* row phase: dS += dy C^T; dS B_t, dS B_{t-1}; <dS, S_{t-1}> row parts */
            if (p < P) {
                float *ds = dS + (size_t)p * N, dyp = dyv[p], xt = xb[(size_t)t * xld + p];
                float xp = t > 0 ? xb[(size_t)(t - 1) * xld + p] : 0.0f;
                float sb = 0.0f, sbp = 0.0f, sa = 0.0f;
                for (int n = 0; n < N; n++) {
                    float v = ds[n] + dyp * Ct[n];
                    ds[n] = v;
                    sb += v * Bt[n];
                    sbp += v * Bp[n];
                    sa += v * Sp[(size_t)p * N + n];
                }
                dxb[(size_t)t * xld + p] = ga * sb + carryx + Dh * dyp;
                carryx = be * sbp;
                red[p] = xt * sb;
                red[P + p] = xp * sbp;
                red[2 * P + p] = sa;
            }
            __syncthreads();
            /* column phase: dC_t = S_t^T dy; dB_t = gamma dS^T x_t + carry; new carry */
            for (int n = p; n < N; n += blockDim.x) {
                float c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
                for (int r = 0; r < P; r++) {
                    float dsv = dS[(size_t)r * N + n];
                    c1 += St[(size_t)r * N + n] * dyv[r];
                    c2 += dsv * xb[(size_t)t * xld + r];
                    if (t > 0) c3 += dsv * xb[(size_t)(t - 1) * xld + r];
                }
                dCb[(size_t)t * bld + n] = c1;
                dBb[(size_t)t * bld + n] = ga * c2 + carryB[n];
                carryB[n] = be * c3;
            }
            if (p == 0) {
                float dg = 0.0f, db = 0.0f, dal = 0.0f, dd = 0.0f;
                for (int r = 0; r < P; r++) {
                    dg += red[r]; db += red[P + r]; dal += red[2 * P + r];
                    dd += dyv[r] * xb[(size_t)t * xld + r];
                }
                if (t == 0) db = 0.0f;
                float da = dal * al;
                ddtb[(size_t)t * H] = da * Ah + dg * l + db * (1.0f - l) * al * (1.0f + d * Ah);
                dlb[(size_t)t * H] = dg * d - db * d * al;
                dA_acc += (double)da * d + (double)db * be * d;
                dD_acc += dd;
            }
            __syncthreads();
            /* dS <- alpha dS (S_t = alpha S_{t-1} + ...) */
            if (p < P)
                for (int n = 0; n < N; n++) dS[(size_t)p * N + n] *= al;
            __syncthreads();
        }
    }
    if (p == 0) {
        part[2 * bh] = (float)dA_acc;
        part[2 * bh + 1] = (float)dD_acc;
    }
}

static __global__ void scan_bwd_reduce_k(float *dA, float *dD, const float *part, int B, int H)
{
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float a = 0.0f, d = 0.0f;
    for (int b = 0; b < B; b++) { a += part[2 * (b * H + h)]; d += part[2 * (b * H + h) + 1]; }
    dA[h] += a;
    dD[h] += d;
}

extern "C" void mt_cuda_ssm_scan_backward(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                                          float *dA, float *dDsk, const float *dy, const float *x,
                                          const float *Bm, const float *Cm, const float *dt, const float *lam,
                                          const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                                          int chunk)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (B * H == 0 || T == 0) return;
    if (chunk > 0) {
        ssd_backward(dx, NULL, dBm, NULL, dCm, NULL, ddt, dlam, dA, dDsk, dy, x, Bm, Cm, dt, lam, A, Dsk,
                     ssd_dims_make(B, T, H, P, N, chunk), 0, NULL, ssd_twins{});
        return;
    }
    if (P > 1024) { MT_CUDA_UNSUPPORTED("ssm scan: headdim > 1024"); return; }
    int Q = 64;
    if (Q > T) Q = T;
    int nc = (T + Q - 1) / Q;
    size_t PN = (size_t)P * N, per = (size_t)(nc + Q) * PN;
    size_t bytes = ((size_t)B * H * per + 2 * (size_t)B * H) * sizeof(float);
    float *ws = (float *)mt_cuda_workspace(bytes);
    if (!ws) return;
    float *part = ws + (size_t)B * H * per;
    size_t smem = (PN + 4 * (size_t)P + (size_t)N) * sizeof(float);
    MT_LAUNCH(scan_bwd_k, B * H, P, smem)(dx, dBm, dCm, ddt, dlam, part, ws, dy, x, Bm, Cm, dt, lam, A, Dsk,
                                          T, H, P, N, Q);
    MT_CUDA_KCHECK();
    MT_LAUNCH(scan_bwd_reduce_k, (H + 63) / 64, 64, 0)(dA, dDsk, part, B, H);
    MT_CUDA_KCHECK();
}

/* ---------------- scan in precision=bf16 ----------------
 * The chunked form with its intra-chunk products on tensor cores
 * (ssd_tc.cu); chunk <= 0 (the recurrence, the reference) and shapes
 * ssd_tc.cu does not take (chunk, P or N above SSD_TC_QMAX) run the fp32
 * entries, counted in ssm_scan_tc_fallbacks. */
static_assert(SSD_TC_QMAX == MT_SSM_STATES_MAX, "mt_ssm_states_floats sizes the states of exactly the tensor-core shapes");
static int scan_tc_pick(struct ssd_dims d, int chunk)
{
    const int tc = chunk > 0 && ssd_tc_supports(d);
    if (tc) mt_cuda_be->info.ssm_scan_tc_calls++;
    else mt_cuda_be->info.ssm_scan_tc_fallbacks++;
    return tc;
}

static struct ssd_twins ssd_bf16_twins(const mt_bf16 *Bh_b, const mt_bf16 *Ch_b, const mt_bf16 *dy_b,
                                       const mt_bf16 *x_b)
{
    return ssd_twins{(const __nv_bfloat16 *)Bh_b, (const __nv_bfloat16 *)Ch_b, (const __nv_bfloat16 *)dy_b,
                     (const __nv_bfloat16 *)x_b};
}

/* ldx != H P (x, dx in the mixer's proj rows), a bf16 dx and Bm or Cm NULL
 * (their twins alone): the tensor-core path only (mt_ops.h); elsewhere
 * refused, nothing written */
static int scan_args_ok(int tc, int ldx, int H, int P, const mt_bf16 *dx_b, const float *Bm, const float *Cm,
                       struct ssd_twins tw)
{
    if ((!Bm && !(tc && tw.B)) || (!Cm && !(tc && tw.C)))
        return mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_*_bf16",
                              "Bm or Cm NULL without its twin or where the chunked products do not run on tensor cores",
                              __FILE__, __LINE__);
    if (!tc && dx_b)
        return mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_backward_bf16",
                              "a bf16 dx (dx_b) where the chunked products do not run on tensor cores", __FILE__,
                              __LINE__);
    if (tw.X && !tc)
        return mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_*_bf16",
                              "x stored bf16 (x_b) where the chunked products do not run on tensor cores", __FILE__,
                              __LINE__);
    if (ldx == H * P || (tc && ldx > H * P)) return 1;
    return mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_*_bf16",
                          "ldx != H*P where the chunked products do not run on tensor cores", __FILE__, __LINE__);
}

/* x or its bf16 storage x_b (rows ldx_b >= H P apart), exactly one of them */
static int scan_x_ok(const float *x, const mt_bf16 *x_b, int ldx_b, int H, int P)
{
    if ((x != NULL) == (x_b != NULL) || (x_b && ldx_b < H * P))
        return mt_cuda_record(MT_ERR_INVALID_ARG, "ssm_scan_*_bf16",
                              "exactly one of x and x_b (then ldx_b >= H*P) must be given", __FILE__, __LINE__);
    return 1;
}

extern "C" void mt_cuda_ssm_scan_forward_bf16(void *be, float *y, const float *x, int ldx, const float *Bm,
                                              const float *Cm, const float *dt, const float *lam, const float *A,
                                              const float *Dsk, int B, int T, int H, int P, int N, int chunk,
                                              float *states, const mt_bf16 *Bh_b, const mt_bf16 *Ch_b,
                                              mt_bf16 *y_b, const mt_bf16 *x_b, int ldx_b)
{
    MT_CUDA_BIND(be);
    if (B * H == 0 || T == 0) return;
    struct ssd_dims d = ssd_dims_make(B, T, H, P, N, chunk > 0 ? chunk : 1);   /* (chunk <= 0: not used) */
    const int tc = scan_tc_pick(d, chunk);
    const struct ssd_twins tw = ssd_bf16_twins(Bh_b, Ch_b, NULL, x_b);
    if (!scan_x_ok(x, x_b, ldx_b, H, P) || !scan_args_ok(tc, ldx, H, P, NULL, Bm, Cm, tw)) return;
    if (y_b && !tc) {
        mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_forward_bf16",
                       "y_b (y as bf16 only) where the chunked products do not run on tensor cores", __FILE__,
                       __LINE__);
        return;
    }
    if (!y_b && !y) {
        mt_cuda_record(MT_ERR_INVALID_ARG, "ssm_scan_forward_bf16", "y and y_b both NULL", __FILE__, __LINE__);
        return;
    }
    if (!tc) {
        mt_cuda_ssm_scan_forward(be, y, x, Bm, Cm, dt, lam, A, Dsk, B, T, H, P, N, chunk);
        return;
    }
    d.xs = ldx;
    d.xsb = x_b ? ldx_b : d.xsb;
    ssd_forward(y, x, Bm, Cm, dt, lam, A, Dsk, d, 1, states, tw, (__nv_bfloat16 *)y_b);
}

extern "C" void mt_cuda_ssm_scan_backward_bf16(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                                               float *dA, float *dDsk, const float *dy, const float *x, int ldx,
                                               const float *Bm, const float *Cm, const float *dt, const float *lam,
                                               const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                                               int chunk, const float *states, mt_bf16 *dx_b,
                                               const mt_bf16 *Bh_b, const mt_bf16 *Ch_b, const mt_bf16 *dy_b,
                                               const mt_bf16 *x_b, int ldx_b, mt_bf16 *dB_b, mt_bf16 *dC_b)
{
    MT_CUDA_BIND(be);
    if (B * H == 0 || T == 0) return;
    struct ssd_dims d = ssd_dims_make(B, T, H, P, N, chunk > 0 ? chunk : 1);   /* (chunk <= 0: not used) */
    const int tc = scan_tc_pick(d, chunk);
    const struct ssd_twins tw = ssd_bf16_twins(Bh_b, Ch_b, dy_b, x_b);
    if (!scan_x_ok(x, x_b, ldx_b, H, P) || !scan_args_ok(tc, ldx, H, P, dx_b, Bm, Cm, tw)) return;
    if (!tc && (dB_b || dC_b)) {
        mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_backward_bf16",
                       "a bf16 dB or dC (dB_b, dC_b) where the chunked products do not run on tensor cores", __FILE__,
                       __LINE__);
        return;
    }
    if (!dy && !(tc && dy_b)) {   /* dy stored bf16 only: its twin alone, on the tensor cores */
        mt_cuda_record(MT_ERR_UNSUPPORTED, "ssm_scan_backward_bf16",
                       "dy NULL without its twin dy_b, or where the chunked products do not run on tensor cores",
                       __FILE__, __LINE__);
        return;
    }
    if (!tc) {
        mt_cuda_ssm_scan_backward(be, dx, dBm, dCm, ddt, dlam, dA, dDsk, dy, x, Bm, Cm, dt, lam, A, Dsk, B, T, H, P,
                                  N, chunk);
        return;
    }
    d.xs = ldx;
    d.xsb = x_b ? ldx_b : d.xsb;
    ssd_backward(dx, (__nv_bfloat16 *)dx_b, dBm, (__nv_bfloat16 *)dB_b, dCm, (__nv_bfloat16 *)dC_b, ddt, dlam, dA,
                 dDsk, dy, x, Bm, Cm, dt, lam, A, Dsk, d, 1, states, tw);
}

/* ---------------- prep (split, softplus, sigmoid, B/C norm + bias + rotary) ----------------
 *
 * HOW IT WORKS. The rotary angles are a cumulative sum over the sequence:
 * ang_scan_k runs it as a block-level scan per (b, h, pair k), over the
 * sequence in tiles of ANG_TILE positions (the running total carried from
 * tile to tile). Everything else is one
 * block of PREP_THREADS per row (b, t), threads over the row's contiguous
 * columns: prep_rows_k (the B/C group norms as fixed-order block sums, the x
 * copy, dt / lam, then one thread per rotary pair (h, k)); in the backward
 * prep_bwd_row_k (the x / dt / lam columns, the rotation's inverse and dang
 * per pair (h, k), then per (B or C, group): the heads' du summed in head
 * order and the rmsnorm backward; PREP_RB rows a block, its B/C bias and gain
 * gradients summed over them as it goes), ang_scan_k in reverse for dtheta,
 * and the parameter gradients as column sums over rows in two passes of fixed
 * order (colsum_*_k: blocks of COL_RB rows, or the PREP_RB-row partials, then
 * the blocks in order). No atomics:
 * reruns are bit-identical. (Before: ang_scan_k the same, but one thread per
 * (row, head) for the rest,
 * looping over P and N with strided, uncoalesced accesses.) */

#define ANG_SEG 4
#define ANG_THREADS 256
#define ANG_TILE (ANG_SEG * ANG_THREADS)
#define PREP_THREADS 256
#define COL_RB 128

static __device__ __forceinline__ float softplus_d(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
static __device__ __forceinline__ float sigmoid_d(float v) { return 1.0f / (1.0f + expf(-v)); }

/* One block per (b, h, ANG_KG consecutive pairs k): for each k, dst[t] =
 * sum_{r<=t} src[r] (reverse: sum_{r>=t}), src at src[(b*T + t)*sld + h*shs
 * + k], dst likewise (may alias src: a tile is read whole before it is
 * written). With ang_state (forward only) the sum starts from it and the
 * total is written back. The tile moves between global and shared memory
 * ANG_KG columns at a time, the k's of one t side by side (one 32-byte
 * sector per t instead of one 4-byte word: a column alone is a strided
 * read, ~10x its bytes on the H100 of 2026-11-27); each column is then
 * scanned by block_scan exactly as with one block per k (same n, same
 * blockDim): the same bits. Column stride ANG_TILE + 4 floats: the 4 t x 8 k
 * of a warp's load land in 32 different banks. */
#define ANG_KG 8
#define ANG_COL (ANG_TILE + 4)
static __global__ void ang_scan_k(float *dst, __nv_bfloat16 *dstb, size_t dld, int dhs, const float *src, size_t sld,
                                  int shs, float *ang_state, int T, int H, int half, int reverse)
{
    MT_DYN_SMEM(float, a);    /* ANG_KG columns of ANG_COL, then tot (blockDim) */
    float *tot = a + ANG_KG * ANG_COL;
    const int ngk = (half + ANG_KG - 1) / ANG_KG, gk = (int)blockIdx.x % ngk, bh = (int)blockIdx.x / ngk;
    const int h = bh % H, b = bh / H, nt = (int)blockDim.x, k0 = gk * ANG_KG;
    const int nk = half - k0 < ANG_KG ? half - k0 : ANG_KG;
    float carry[ANG_KG];
#pragma unroll
    for (int kk = 0; kk < ANG_KG; kk++) carry[kk] = ang_state && kk < nk ? ang_state[(size_t)bh * half + k0 + kk] : 0.0f;
    for (int s0 = 0; s0 < T; s0 += ANG_TILE) {
        int n = T - s0 < ANG_TILE ? T - s0 : ANG_TILE;
        /* the tile's loads SSD_AHEAD a thread ahead (one at a time: 32 round trips a tile) */
        mt_block_move<SSD_AHEAD, float>(
            n * ANG_KG,
            [&](int e) {
                const int i = e / ANG_KG, kk = e % ANG_KG, t = reverse ? T - 1 - (s0 + i) : s0 + i;
                return kk < nk ? src[((size_t)b * T + t) * sld + (size_t)h * shs + k0 + kk] : 0.0f;
            },
            [&](int e, float v) {
                if (e % ANG_KG < nk) a[(e % ANG_KG) * ANG_COL + e / ANG_KG] = v;
            });
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < ANG_KG; kk++) {
            if (kk >= nk) break;   /* uniform over the block */
            if (threadIdx.x == 0) a[kk * ANG_COL] += carry[kk];
            __syncthreads();
            block_scan(a + kk * ANG_COL, tot, n, 0);
            carry[kk] = a[kk * ANG_COL + n - 1];
        }
        for (int e = (int)threadIdx.x; e < n * ANG_KG; e += nt) {
            int i = e / ANG_KG, kk = e % ANG_KG, t = reverse ? T - 1 - (s0 + i) : s0 + i;
            const size_t o = ((size_t)b * T + t) * dld + (size_t)h * dhs + k0 + kk;
            if (kk < nk && dstb) dstb[o] = __float2bfloat16_rn(a[kk * ANG_COL + i]);
            else if (kk < nk) dst[o] = a[kk * ANG_COL + i];
        }
        __syncthreads();
    }
    if (ang_state && (int)threadIdx.x < nk) {
        float c = 0.0f;   /* carry[] indexed by the thread: registers, so a switch-free copy */
#pragma unroll
        for (int kk = 0; kk < ANG_KG; kk++)
            if (kk == (int)threadIdx.x) c = carry[kk];
        ang_state[(size_t)bh * half + k0 + threadIdx.x] = c;
    }
}

/* Head h's normed, biased, rotated pair (k, k + N/2) of B or C: u = raw rstd g
 * + bias, o = rot(u, ang) with (c, s) = (cos, sin) ang. The forward's and the
 * backward's one expression: the backward recomputes o (for dang) rather
 * than reading the forward's fp32 Bh, Ch back, and gets the same bits (its
 * angles are the forward's scan again, bit-identical). */
static __device__ __forceinline__ void prep_rot(float *o1, float *o2, const float *raw, float rs, const float *g,
                                                const float *bias, int k, int half, float c, float s)
{
    const float u1 = raw[k] * rs * g[k] + bias[k];
    const float u2 = raw[k + half] * rs * g[k + half] + bias[k + half];
    *o1 = u1 * c - u2 * s;
    *o2 = u1 * s + u2 * c;
}

/* Bh, Ch's values at (r, k) and (r, k + N/2) (o NULL: not stored), and their
 * bf16 twins where asked */
static __device__ __forceinline__ void prep_put_pair(float *o, __nv_bfloat16 *ob, size_t i, size_t j, float a, float b)
{
    if (o) {
        o[i] = a;
        o[j] = b;
    }
    if (ob) {
        ob[i] = __float2bfloat16_rn(a);
        ob[j] = __float2bfloat16_rn(b);
    }
}

/* One block per row n = (b, t), threads over its columns; the angles wait in
 * angs, pair k of row r = n H + h at angs[r ahs + k] (ang_scan_k): Bh's first
 * N/2 slots of every head (ahs = N), or a workspace (ahs = N/2) where Bh is
 * NULL. Block 0 also writes A. Bhb, Chb: NULL, or Bh, Ch's bf16 twins (the
 * bf16 scan's operands); Bh or Ch NULL (with its twin): the twin alone */
static __global__ void prep_rows_k(const float *angs, int ahs, float *x, float *Bh, float *Ch, __nv_bfloat16 *Bhb,
                                   __nv_bfloat16 *Chb, float *dt, float *lam, float *A, float *rstd, const float *proj, const float *dt_bias,
                                   const float *A_log, const float *gB, const float *gC, const float *B_bias,
                                   const float *C_bias, int nrow, int H, int P, int G, int N, float eps)
{
    MT_DYN_SMEM(double, dred); /* blockDim doubles, then rs (2G floats) */
    float *rs = (float *)(dred + blockDim.x);
    int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    size_t n = blockIdx.x;
    if (n == 0)
        for (int h = tid; h < H; h += nt) A[h] = -expf(A_log[h]);
    if (n >= (size_t)nrow) return;
    int half = N / 2, E = H * P, GN = G * N, hpg = H / G;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + H + (size_t)H * half + H;
    const size_t oB = 2 * (size_t)E, oC = oB + GN, odt = oC + GN, olam = odt + H + (size_t)H * half;
    const float *row = proj + n * W;
    /* rms of B's and C's groups (pg = pass*G + g: B's groups, then C's) */
    for (int pg = 0; pg < 2 * G; pg++) {
        const float *v = row + oB + (size_t)pg * N;
        double sq = 0.0;
        for (int k = tid; k < N; k += nt) sq += (double)v[k] * v[k];
        sq = block_sum(sq, dred);
        if (tid == 0) rs[pg] = (float)(1.0 / sqrt(sq / N + eps));
    }
    __syncthreads();
    for (int pg = tid; pg < 2 * G; pg += nt) rstd[n * 2 * G + pg] = rs[pg];
    if (x)   /* NULL: the bf16 scan reads xs in proj (ldx) */
        for (int e = tid; e < E; e += nt) x[n * E + e] = row[E + e];
    for (int h = tid; h < H; h += nt) {
        size_t r = n * H + h;
        dt[r] = softplus_d(row[odt + h] + dt_bias[h]);
        lam[r] = sigmoid_d(row[olam + h]);
    }
    for (int j = tid; j < H * half; j += nt) {
        int h = j / half, k = j % half, g = h / hpg;
        size_t r = n * H + h;
        const float *br = row + oB + (size_t)g * N, *cr = row + oC + (size_t)g * N;
        float ang = angs[r * ahs + k], c = cosf(ang), s = sinf(ang), o1, o2;
        prep_rot(&o1, &o2, br, rs[g], gB, B_bias + (size_t)h * N, k, half, c, s);
        prep_put_pair(Bh, Bhb, r * N + k, r * N + k + half, o1, o2);
        prep_rot(&o1, &o2, cr, rs[G + g], gC, C_bias + (size_t)h * N, k, half, c, s);
        prep_put_pair(Ch, Chb, r * N + k, r * N + k + half, o1, o2);
    }
}

/* dstb non-NULL: the sums written there as bf16 (nearest even), not to dst */
static void ang_scan(float *dst, mt_bf16 *dstb, size_t dld, int dhs, const float *src, size_t sld, int shs,
                     float *ang_state, int B, int T, int H, int half, int reverse)
{
    const size_t ngk = (size_t)(half + ANG_KG - 1) / ANG_KG;
    MT_LAUNCH(ang_scan_k, (unsigned)((size_t)B * H * ngk), ANG_THREADS,
              ((size_t)ANG_KG * ANG_COL + ANG_THREADS) * sizeof(float))(dst, (__nv_bfloat16 *)dstb, dld, dhs, src, sld,
                                                                         shs, ang_state, T, H, half, reverse);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_ssm_prep_forward(void *be, float *x, float *Bh, float *Ch, float *dt, float *lam, float *A,
                                         float *rstd, float *ang_state, const float *proj, const float *dt_bias, const float *A_log,
                                         const float *gB, const float *gC, const float *B_bias,
                                         const float *C_bias, int B, int T, int H, int P, int G, int N, float eps,
                                         mt_bf16 *Bh_b, mt_bf16 *Ch_b, float *ang_out)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if ((!Bh && !Bh_b) || (!Ch && !Ch_b)) {
        mt_cuda_record(MT_ERR_INVALID_ARG, "ssm_prep_forward", "Bh or Ch NULL without its bf16 twin", __FILE__,
                       __LINE__);
        return;
    }
    int half = N / 2, E = H * P, GN = G * N;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + H + (size_t)H * half + H, oth = 2 * (size_t)E + 2 * (size_t)GN + H;
    /* the angles: in ang_out (kept for the backward), Bh's slots, or (Bh NULL: its twin
     * alone) the workspace */
    const int ahs = Bh && !ang_out ? N : half;
    float *angs = ang_out ? ang_out
                 : Bh     ? Bh
                          : (float *)mt_cuda_workspace(((size_t)B * T * H * half + 1) * sizeof(float));
    if (!angs) return;
    if (B * T > 0 && half > 0)
        ang_scan(angs, NULL, (size_t)H * ahs, ahs, proj + oth, W, half, ang_state, B, T, H, half, 0);
    unsigned nb = B * T > 0 ? (unsigned)(B * T) : 1u;
    MT_LAUNCH(prep_rows_k, nb, PREP_THREADS, PREP_THREADS * sizeof(double) + 2 * (size_t)G * sizeof(float))(
        angs, ahs, x, Bh, Ch, (__nv_bfloat16 *)Bh_b, (__nv_bfloat16 *)Ch_b, dt, lam, A, rstd, proj, dt_bias, A_log, gB,
        gC, B_bias, C_bias, B * T, H, P, G, N, eps);
    MT_CUDA_KCHECK();
}

/* One block per row n = (b, t). Phase 1, threads over the row's columns: the
 * x, dt and lam columns of dproj; per pair (h, k) the rotation's inverse
 * u = R^T dO into du (B's, then C's: (rows, H, N) each) and dang into the
 * theta column, which holds the angles on entry (or ang holds them: the
 * forward's, kept). Phase 2 (after the block's barrier: du of this row is
 * written), per (B or C, group), threads over N:
 * dBn = the group's heads' du summed in head order; the rmsnorm backward
 * into dproj's B / C columns; dBn * xhat into gs (pass, rows, G, N). */
/* PREP_RB rows a block of prep_bwd_row_k, in order: the B/C biases' and
 * gains' column sums over those rows accumulate in the block's partial row
 * (part_u, part_g; its threads keep their columns from row to row, so no two
 * threads share one), and du lives in a per-block scratch reused row after
 * row (L2-resident), not in an (n, 2 H N) array: before, du was written to
 * memory, read back, then read again by two column-sum passes (0.8 GB a call
 * at the d2048 hybrid's shape, three quarters of the kernel's traffic). The
 * column sums then add PREP_RB rows in order, then the blocks in order
 * (colsum_final_k): a fixed order, bit-identical reruns (not the bits of the
 * 128-row blocks before: 16 rows keep 512 blocks in flight at n = 8192). */
#define PREP_RB 16

/* a final dproj value at column c: fp32, or bf16 where the caller takes dproj as bf16 (brow) */
static __device__ __forceinline__ void prep_put(float *drow, __nv_bfloat16 *brow, size_t c, float v)
{
    if (brow) brow[c] = __float2bfloat16_rn(v);
    else drow[c] = v;
}

/* dBh, dCh as stored: fp32, or bf16 (the scan backward's dB_b, dC_b), read widened */
template <typename GT>
static __global__ void prep_bwd_row_k(float *dproj, __nv_bfloat16 *dpb, float *du_slots, float *part_u, float *part_g,
                                      const float *dx,
                                      const GT *dBh, const GT *dCh, const float *ddt, const float *dlam,
                                      const float *B_bias, const float *C_bias, const float *lam, const float *rstd,
                                      const float *proj, const float *dt_bias, const float *gB, const float *gC,
                                      const float *ang, int nrow, int H, int P, int G, int N)
{
    MT_DYN_SMEM(double, dred);  /* blockDim doubles, then dn (N floats) */
    float *dn = (float *)(dred + blockDim.x);
    int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    int half = N / 2, E = H * P, GN = G * N, hpg = H / G;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + H + (size_t)H * half + H;
    const size_t odt = 2 * (size_t)E + 2 * (size_t)GN, oth = odt + H, olam = oth + (size_t)H * half;
    const size_t HN = (size_t)H * N, n0 = (size_t)blockIdx.x * PREP_RB;
    const size_t n1 = n0 + PREP_RB < (size_t)nrow ? n0 + PREP_RB : (size_t)nrow;
    float *du = du_slots + (size_t)blockIdx.x * 2 * HN, *pu = part_u + (size_t)blockIdx.x * 2 * HN;
    float *pgs = part_g + (size_t)blockIdx.x * 2 * N;
    for (size_t n = n0; n < n1; n++) {
        const int first = n == n0;
        const float *row = proj + n * W;
        float *drow = dproj + n * W;
        __nv_bfloat16 *brow = dpb ? dpb + n * W : NULL;
        if (dx)   /* NULL: the bf16 scan wrote dx into these columns (ldx) */
            for (int e = tid; e < E; e += nt) prep_put(drow, brow, E + e, dx[n * E + e]);
        for (int h = tid; h < H; h += nt) {
            size_t r = n * H + h;
            drow[odt + h] = ddt[r] * sigmoid_d(row[odt + h] + dt_bias[h]);   /* fp32 too: dt_bias's column sum */
            if (brow) brow[odt + h] = __float2bfloat16_rn(drow[odt + h]);
            prep_put(drow, brow, olam + h, dlam[r] * lam[r] * (1.0f - lam[r]));
        }
        for (int j = tid; j < H * half; j += nt) {
            int h = j / half, k = j % half, g = h / hpg;
            size_t r = n * H + h;
            float *dth = drow + oth + j;
            float a = ang ? ang[r * half + k] : *dth, c = cosf(a), s = sinf(a), dang = 0.0f;
            for (int pass = 0; pass < 2; pass++) {
                const GT *dO = (pass ? dCh : dBh) + r * N;
                const size_t at = (size_t)pass * HN + (size_t)h * N + k;
                const size_t oc = 2 * (size_t)E + (pass ? GN : 0) + (size_t)g * N;
                float o1, o2;   /* the forward's Bh / Ch pair, recomputed (raw B / C, rstd, gain, bias: cached) */
                prep_rot(&o1, &o2, row + oc, rstd[n * 2 * G + (size_t)pass * G + g], pass ? gC : gB,
                         (pass ? C_bias : B_bias) + (size_t)h * N, k, half, c, s);
                float d1 = ssd_f(dO[k]), d2 = ssd_f(dO[k + half]);
                dang += -d1 * o2 + d2 * o1;
                float u0 = d1 * c + d2 * s, u1 = -d1 * s + d2 * c;
                du[at] = u0;
                du[at + half] = u1;
                pu[at] = first ? u0 : pu[at] + u0;   /* the B / C bias gradients' rows, in order */
                pu[at + half] = first ? u1 : pu[at + half] + u1;
            }
            *dth = dang;
        }
        __syncthreads();  /* this row's du, written above by the block, is read below */
        for (int pg = 0; pg < 2 * G; pg++) {
            int pass = pg / G, g = pg % G;
            const size_t oc = 2 * (size_t)E + (pass ? GN : 0);
            const float *raw = row + oc + (size_t)g * N, *gw = pass ? gC : gB;
            float rs = rstd[n * 2 * G + pg];
            double m = 0.0;
            for (int k = tid; k < N; k += nt) {
                const float v = col_chain(du + (size_t)pass * HN + (size_t)g * hpg * N + k, (size_t)N, hpg, 0.0f);
                dn[k] = v;
                float xh = raw[k] * rs, gv = v * xh;
                float *acc = pgs + (size_t)pass * N + k;   /* the gains' gradients: (row, group) in order */
                *acc = first && g == 0 ? gv : *acc + gv;
                m += (double)v * gw[k] * xh;
            }
            m = block_sum(m, dred);
            float mean = (float)(m / N);
            for (int k = tid; k < N; k += nt)
                prep_put(drow, brow, oc + (size_t)g * N + k, rs * (dn[k] * gw[k] - raw[k] * rs * mean));
            __syncthreads();  /* dn is reused by the next (pass, group), du by the next row */
        }
    }
}

/* column sums over rows, pass 1: part[rb][col] = sum of rows [rb*COL_RB, ...) in order */
static __global__ void colsum_part_k(float *part, const float *X, size_t ld, int R, int ncol)
{
    int col = (int)(blockIdx.x * blockDim.x + threadIdx.x), rb = (int)blockIdx.y;
    if (col >= ncol) return;
    int r1 = (rb + 1) * COL_RB < R ? (rb + 1) * COL_RB : R;
    part[(size_t)rb * ncol + col] = col_chain(X + (size_t)rb * COL_RB * ld + col, ld, r1 - rb * COL_RB, 0.0f);
}

/* pass 2: out[col] += the row blocks' sums in order (block rb's at part + rb * ld) */
static __global__ void colsum_final_k(float *out, const float *part, int nrb, int ncol, size_t ld)
{
    int col = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (col >= ncol) return;
    out[col] += col_chain(part + col, ld, nrb, 0.0f);
}

/* out (ncol) += the nrb partial rows at part, ld apart, in order (pass 2 alone:
 * for kernels that sum their own rows as they go) */
static void colsum_blocks(float *out, const float *part, int nrb, int ncol, size_t ld)
{
    MT_LAUNCH(colsum_final_k, (unsigned)((ncol + 127) / 128), 128, 0)(out, part, nrb, ncol, ld);
    MT_CUDA_KCHECK();
}

/* out (ncol) += sum over R rows of X (row stride ld); part: ceil(R/COL_RB)*ncol floats */
static void colsum(float *out, float *part, const float *X, size_t ld, int R, int ncol)
{
    int nrb = (R + COL_RB - 1) / COL_RB;
    if (nrb == 0 || ncol == 0) return;
    MT_LAUNCH(colsum_part_k, dim3((unsigned)((ncol + 127) / 128), (unsigned)nrb), 128, 0)(part, X, ld, R, ncol);
    MT_CUDA_KCHECK();
    colsum_blocks(out, part, nrb, ncol, (size_t)ncol);
}

static __global__ void prep_bwd_alog_k(float *dA_log, const float *dA, const float *A, int H)
{
    int h = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (h < H) dA_log[h] += dA[h] * A[h];
}

/* dproj_b non-NULL: every column the backward writes goes there as bf16; dproj
 * is then scratch (the theta and dt columns' fp32 sums). dBh_b, dCh_b non-NULL:
 * dBh, dCh stored bf16, read in their place */
static void prep_backward(float *dproj, mt_bf16 *dproj_b, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                          float *dB_bias, float *dC_bias, const float *dx, const float *dBh, const float *dCh,
                          const float *ddt, const float *dlam, const float *dA, const float *B_bias,
                          const float *C_bias, const float *lam, const float *A, const float *rstd, const float *proj,
                          const float *dt_bias, const float *gB, const float *gC, int B, int T, int H, int P, int G,
                          int N, const float *ang, const mt_bf16 *dBh_b, const mt_bf16 *dCh_b)
{
    int nrow = B * T, half = N / 2, E = H * P, GN = G * N;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + H + (size_t)H * half + H;
    const size_t odt = 2 * (size_t)E + 2 * (size_t)GN, oth = odt + H;
    MT_LAUNCH(prep_bwd_alog_k, (unsigned)((H + 63) / 64), 64, 0)(dA_log, dA, A, H);
    MT_CUDA_KCHECK();
    if (nrow == 0) return;
    /* workspace: per block of PREP_RB rows its du scratch and its partial rows (B/C biases 2 H N,
     * gains 2 N), then dt_bias's column-sum partials */
    const size_t HN = (size_t)H * N, nblk = ((size_t)nrow + PREP_RB - 1) / PREP_RB;
    const size_t nrb = ((size_t)nrow + COL_RB - 1) / COL_RB;
    float *du = (float *)mt_cuda_workspace((nblk * (4 * HN + 2 * (size_t)N) + nrb * (size_t)H) * sizeof(float));
    if (!du) return;
    float *pu = du + nblk * 2 * HN, *pgs = pu + nblk * 2 * HN, *part = pgs + nblk * 2 * (size_t)N;
    /* the angles: the forward's (ang), or its scan again (bit-identical) into dproj's theta columns */
    if (half > 0 && !ang) ang_scan(dproj + oth, NULL, W, half, proj + oth, W, half, NULL, B, T, H, half, 0);
    const size_t rsm = PREP_THREADS * sizeof(double) + (size_t)N * sizeof(float);
    if (dBh_b)
        MT_LAUNCH(prep_bwd_row_k<__nv_bfloat16>, (unsigned)nblk, PREP_THREADS, rsm)(
            dproj, (__nv_bfloat16 *)dproj_b, du, pu, pgs, dx, (const __nv_bfloat16 *)dBh_b,
            (const __nv_bfloat16 *)dCh_b, ddt, dlam, B_bias, C_bias, lam, rstd, proj, dt_bias, gB, gC, ang, nrow, H, P,
            G, N);
    else
        MT_LAUNCH(prep_bwd_row_k<float>, (unsigned)nblk, PREP_THREADS, rsm)(
            dproj, (__nv_bfloat16 *)dproj_b, du, pu, pgs, dx, dBh, dCh, ddt, dlam, B_bias, C_bias, lam, rstd, proj,
            dt_bias, gB, gC, ang, nrow, H, P, G, N);
    MT_CUDA_KCHECK();
    /* dtheta = reverse cumsum of dang over the sequence */
    if (half > 0)
        ang_scan(dproj + oth, dproj_b ? dproj_b + oth : NULL, W, half, dproj + oth, W, half, NULL, B, T, H, half, 1);
    colsum(ddt_bias, part, dproj + odt, W, nrow, H);
    /* the blocks' partial rows, in block order */
    colsum_blocks(dB_bias, pu, (int)nblk, (int)HN, 2 * HN);
    colsum_blocks(dC_bias, pu + HN, (int)nblk, (int)HN, 2 * HN);
    colsum_blocks(dgB, pgs, (int)nblk, N, 2 * (size_t)N);
    colsum_blocks(dgC, pgs + N, (int)nblk, N, 2 * (size_t)N);
}

extern "C" void mt_cuda_ssm_prep_backward(void *be, float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                                          float *dB_bias, float *dC_bias, const float *dx, const float *dBh,
                                          const float *dCh, const float *ddt, const float *dlam, const float *dA,
                                          const float *B_bias, const float *C_bias, const float *lam, const float *A,
                                          const float *rstd, const float *proj, const float *dt_bias,
                                          const float *gB, const float *gC, int B, int T, int H, int P, int G,
                                          int N, float eps, const float *ang)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    (void)eps;
    prep_backward(dproj, NULL, ddt_bias, dA_log, dgB, dgC, dB_bias, dC_bias, dx, dBh, dCh, ddt, dlam, dA, B_bias,
                  C_bias, lam, A, rstd, proj, dt_bias, gB, gC, B, T, H, P, G, N, ang, NULL, NULL);
}

extern "C" void mt_cuda_ssm_prep_backward_bf16(void *be, mt_bf16 *dproj_b, float *dproj, float *ddt_bias,
                                               float *dA_log, float *dgB, float *dgC, float *dB_bias, float *dC_bias,
                                               const float *dx, const float *dBh, const float *dCh, const float *ddt,
                                               const float *dlam, const float *dA, const float *B_bias,
                                               const float *C_bias, const float *lam, const float *A,
                                               const float *rstd, const float *proj, const float *dt_bias,
                                               const float *gB, const float *gC, int B, int T, int H, int P, int G,
                                               int N, float eps, const float *ang, const mt_bf16 *dBh_b,
                                               const mt_bf16 *dCh_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    (void)eps;
    if ((dBh_b != NULL) != (dCh_b != NULL) || (!dBh_b && (!dBh || !dCh))) {
        mt_cuda_record(MT_ERR_INVALID_ARG, "ssm_prep_backward_bf16",
                       "dBh_b and dCh_b: both or neither (neither: dBh and dCh given)", __FILE__, __LINE__);
        return;
    }
    prep_backward(dproj, dproj_b, ddt_bias, dA_log, dgB, dgC, dB_bias, dC_bias, dx, dBh, dCh, ddt, dlam, dA, B_bias,
                  C_bias, lam, A, rstd, proj, dt_bias, gB, gC, B, T, H, P, G, N, ang, dBh_b, dCh_b);
}

/* ---------------- gated grouped RMSNorm ----------------
 * Forward: one block per (row, group), threads over the group's E/G
 * channels; backward: one per (GATE_RB rows, group). The sums of squares and
 * the backward's mean term are fixed-order block reductions in double; dw is
 * a two-pass column sum: the backward's blocks sum their rows in order
 * (gate_bwd_k's partial rows), then colsum_final_k the blocks in order. The
 * replicated-B/C entries (_ext) keep one block per row and gate_dw_part_ext_k's
 * separate first pass over blocks of COL_RB rows. */

/* out (NULL: not stored) and its bf16 twin out_b (NULL: none). v is computed
 * again in the scaled pass instead of stored and read back: the same
 * expression, the same bits, and a row's y, z come back from L1/L2 where the
 * store and re-read of out went to memory (out once stored: 8 bytes an element
 * fewer; the bf16 output alone: no fp32 store and no cast pass). */
#define GATE_AHEAD 4
/* y, z as stored: fp32, or bf16 (the scan's y_b; the in-projection's z_b), read widened */
template <typename YT, typename ZT>
static __global__ void gate_fwd_k(float *out, __nv_bfloat16 *out_b, float *rstd, const YT *y, const ZT *z, int ldz,
                                  const float *w, int E, int G, float eps)
{
    MT_DYN_SMEM(double, dred);  /* blockDim */
    int i = (int)blockIdx.x, row = i / G, g = i % G, cg = E / G, nt = (int)blockDim.x;
    const YT *yr = y + (size_t)row * E;
    const ZT *zr = z + (size_t)row * ldz;
    double ss = 0.0;
    for (int c = g * cg + (int)threadIdx.x; c < (g + 1) * cg; c += nt) {
        const float zc = mt_ld1(zr + c);
        float v = mt_ld1(yr + c) * zc * sigmoid_d(zc);
        ss += (double)v * v;
    }
    ss = block_sum(ss, dred);
    float rs = (float)(1.0 / sqrt(ss / cg + eps));
    if (threadIdx.x == 0) rstd[i] = rs;
    /* the scaled pass: GATE_AHEAD columns' loads before their stores (nvcc cannot move
     * a load above a store it cannot prove apart: a round trip a column otherwise;
     * 4, not SSD_AHEAD's 8: the registers held would cost blocks an SM) */
    const int c1 = (g + 1) * cg;
    for (int c0 = g * cg + (int)threadIdx.x; c0 < c1; c0 += GATE_AHEAD * nt) {
        float yv[GATE_AHEAD], zv[GATE_AHEAD], wv[GATE_AHEAD];
#pragma unroll
        for (int u = 0; u < GATE_AHEAD; u++) {
            const int c = c0 + u * nt;
            yv[u] = c < c1 ? mt_ld1(yr + c) : 0.0f, zv[u] = c < c1 ? mt_ld1(zr + c) : 0.0f;
            wv[u] = c < c1 ? w[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GATE_AHEAD; u++) {
            const int c = c0 + u * nt;
            if (c >= c1) break;
            float o = yv[u] * zv[u] * sigmoid_d(zv[u]) * (rs * wv[u]);
            if (out) out[(size_t)row * E + c] = o;
            if (out_b) out_b[(size_t)row * E + c] = mt_cuda_bf16_rn(o);
        }
    }
}

/* One block per (GATE_RB rows, group), the rows in order; threads over the
 * group's channels, each keeping its channels from row to row, so dw's first
 * pass (sum over the rows of dout vhat) accumulates in the block's partial
 * row part[rb][c] as it goes (then colsum_final_k over the blocks in order).
 * Before, a separate pass re-read dout, y, z for it (~0.4 GB a call at the
 * d2048 hybrid's shape). 16 rows: 512 blocks at n = 8192. */
#define GATE_RB 16

/* dzb non-NULL: dz written there as bf16 (row stride ldz), not to dz; YT, ZT: y, z as
 * gate_fwd_k (z at row stride ldzi); doutb non-NULL: dout stored bf16, read widened */
template <typename YT, typename ZT>
static __global__ void gate_bwd_k(float *dy, __nv_bfloat16 *dyb, float *dz, __nv_bfloat16 *dzb, float *part,
                                  const float *dout, const __nv_bfloat16 *doutb, const YT *y, const ZT *z, int ldzi,
                                  int ldz, const float *w, const float *rstd, int n, int E, int G)
{
    MT_DYN_SMEM(double, dred);  /* blockDim */
    int rb = (int)blockIdx.x, g = (int)blockIdx.y, cg = E / G, nt = (int)blockDim.x;
    int r0 = rb * GATE_RB, r1 = r0 + GATE_RB < n ? r0 + GATE_RB : n;
    float *pw = part + (size_t)rb * E;
    for (int row = r0; row < r1; row++) {
        const YT *yr = y + (size_t)row * E;
        const ZT *zr = z + (size_t)row * ldzi;
        const size_t oz = (size_t)row * ldz, oy = (size_t)row * E;
        const auto d = [&](int c) { return doutb ? __bfloat162float(doutb[oy + c]) : dout[oy + c]; };
        float rs = rstd[(size_t)row * G + g];
        double m = 0.0;
        for (int c = g * cg + (int)threadIdx.x; c < (g + 1) * cg; c += nt)
        {
            const float zc = mt_ld1(zr + c);
            m += (double)d(c) * w[c] * (mt_ld1(yr + c) * zc * sigmoid_d(zc) * rs);
        }
        m = block_sum(m, dred);
        float mean = (float)(m / cg);
        const int c1 = (g + 1) * cg;   /* GATE_AHEAD columns' loads before their stores, as gate_fwd_k */
        for (int c0 = g * cg + (int)threadIdx.x; c0 < c1; c0 += GATE_AHEAD * nt) {
            float zv[GATE_AHEAD], yv[GATE_AHEAD], dvv[GATE_AHEAD], wv[GATE_AHEAD], pv[GATE_AHEAD];
#pragma unroll
            for (int u = 0; u < GATE_AHEAD; u++) {
                const int c = c0 + u * nt, in = c < c1;
                zv[u] = in ? mt_ld1(zr + c) : 0.0f, yv[u] = in ? mt_ld1(yr + c) : 0.0f, dvv[u] = in ? d(c) : 0.0f;
                wv[u] = in ? w[c] : 0.0f, pv[u] = in && row != r0 ? pw[c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < GATE_AHEAD; u++) {
                const int c = c0 + u * nt;
                if (c >= c1) break;
                float s = sigmoid_d(zv[u]), si = zv[u] * s, vh = yv[u] * si * rs;
                float dv = rs * (dvv[u] * wv[u] - vh * mean);
                const float dzv = dv * yv[u] * (s + si * (1.0f - s));
                const float dyv = dv * si;
                if (dy) dy[oy + c] = dyv;   /* NULL: dy as bf16 only (dyb) */
                if (dyb) dyb[oy + c] = __float2bfloat16_rn(dyv);
                if (dzb) dzb[oz + c] = __float2bfloat16_rn(dzv);
                else dz[oz + c] = dzv;
                pw[c] = row == r0 ? dvv[u] * vh : pv[u] + dvv[u] * vh;   /* dw: this block's rows, in order */
            }
        }
    }
}

/* gate_fwd_k<YT, ZT> over n G blocks (y, z typed as given) */
template <typename YT, typename ZT>
static void gate_fwd_launch(float *out, mt_bf16 *out_b, float *rstd, const YT *y, const ZT *z, int ldz, const float *w,
                            int n, int E, int G, float eps)
{
    unsigned t = pow2_threads(E / G, 256);
    MT_LAUNCH((gate_fwd_k<YT, ZT>), (unsigned)((size_t)n * G), t, t * sizeof(double))(
        out, (__nv_bfloat16 *)out_b, rstd, y, z, ldz, w, E, G, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_ssm_gate_norm_forward_bf16(void *be, float *out, mt_bf16 *out_b, float *rstd, const float *y,
                                                   const float *z, int ldz, const float *w, int n, int E, int G,
                                                   float eps, const mt_bf16 *y_b, const mt_bf16 *zin_b, int ldz_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n * G == 0) return;
    const __nv_bfloat16 *yb = (const __nv_bfloat16 *)y_b, *zb = (const __nv_bfloat16 *)zin_b;
    if (yb && zb) gate_fwd_launch(out, out_b, rstd, yb, zb, ldz_b, w, n, E, G, eps);
    else if (yb) gate_fwd_launch(out, out_b, rstd, yb, z, ldz, w, n, E, G, eps);
    else if (zb) gate_fwd_launch(out, out_b, rstd, y, zb, ldz_b, w, n, E, G, eps);
    else gate_fwd_launch(out, out_b, rstd, y, z, ldz, w, n, E, G, eps);
}

extern "C" void mt_cuda_ssm_gate_norm_forward(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                              const float *w, int n, int E, int G, float eps)
{
    mt_cuda_ssm_gate_norm_forward_bf16(be, out, NULL, rstd, y, z, ldz, w, n, E, G, eps, NULL, NULL, 0);
}

/* gate_bwd_k<YT, ZT> (y, z typed as given; z at row stride ldzi) */
template <typename YT, typename ZT>
static void gate_bwd_launch(dim3 grid, unsigned t, float *dy, mt_bf16 *dy_b, float *dz, mt_bf16 *dz_b, float *part,
                            const float *dout, const mt_bf16 *dout_b, const YT *y, const ZT *z, int ldzi, int ldz,
                            const float *w, const float *rstd, int n, int E, int G)
{
    MT_LAUNCH((gate_bwd_k<YT, ZT>), grid, t, t * sizeof(double))(dy, (__nv_bfloat16 *)dy_b, dz, (__nv_bfloat16 *)dz_b,
                                                                 part, dout, (const __nv_bfloat16 *)dout_b, y, z, ldzi,
                                                                 ldz, w, rstd, n, E, G);
    MT_CUDA_KCHECK();
}

static void gate_backward(float *dy, mt_bf16 *dy_b, float *dz, mt_bf16 *dz_b, float *dw, const float *dout,
                          const float *y, const float *z, int ldz, const float *w, const float *rstd, int n, int E,
                          int G, const mt_bf16 *y_b = NULL, const mt_bf16 *zin_b = NULL, int ldz_b = 0,
                          const mt_bf16 *dout_b = NULL)
{
    if (n * G == 0) return;
    unsigned t = pow2_threads(E / G, 256);
    int nrb = (n + GATE_RB - 1) / GATE_RB;
    float *part = (float *)mt_cuda_workspace((size_t)nrb * E * sizeof(float));
    if (!part) return;
    const dim3 grid((unsigned)nrb, (unsigned)G);
    const __nv_bfloat16 *yb = (const __nv_bfloat16 *)y_b, *zb = (const __nv_bfloat16 *)zin_b;
    const mt_bf16 *db = dout_b;
    if (yb && zb) gate_bwd_launch(grid, t, dy, dy_b, dz, dz_b, part, dout, db, yb, zb, ldz_b, ldz, w, rstd, n, E, G);
    else if (yb) gate_bwd_launch(grid, t, dy, dy_b, dz, dz_b, part, dout, db, yb, z, ldz, ldz, w, rstd, n, E, G);
    else if (zb) gate_bwd_launch(grid, t, dy, dy_b, dz, dz_b, part, dout, db, y, zb, ldz_b, ldz, w, rstd, n, E, G);
    else gate_bwd_launch(grid, t, dy, dy_b, dz, dz_b, part, dout, db, y, z, ldz, ldz, w, rstd, n, E, G);
    colsum_blocks(dw, part, nrb, E, (size_t)E);
}

extern "C" void mt_cuda_ssm_gate_norm_backward(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                               const float *z, int ldz, const float *w, const float *rstd,
                                               int n, int E, int G)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    gate_backward(dy, NULL, dz, NULL, dw, dout, y, z, ldz, w, rstd, n, E, G);
}

extern "C" void mt_cuda_ssm_gate_norm_backward_bf16(void *be, float *dy, mt_bf16 *dz_b, float *dw, const float *dout,
                                                    const float *y, const float *z, int ldz, const float *w,
                                                    const float *rstd, int n, int E, int G, mt_bf16 *dy_b,
                                                    const mt_bf16 *y_b, const mt_bf16 *zin_b, int ldz_b,
                                                    const mt_bf16 *dout_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if ((!dy && !dy_b) || (!dout && !dout_b)) {   /* dy NULL: written as bf16 only, into dy_b; dout: read from dout_b */
        mt_cuda_record(MT_ERR_INVALID_ARG, "ssm_gate_norm_backward_bf16", "dy and dy_b, or dout and dout_b, both NULL",
                       __FILE__, __LINE__);
        return;
    }
    gate_backward(dy, dy_b, NULL, dz_b, dw, dout, y, z, ldz, w, rstd, n, E, G, y_b, zin_b, ldz_b, dout_b);
}

/* ---------------- the gated norm over groups that span ranks ----------------
 * (replicated B/C under TP, mt_ops.h ssm_gate_norm_sums / _ext; docs/mamba3.md
 * §10). Local group j of the rank's channels [c0, c0 + E) covers the local
 * channels [lo, hi) of gate_span. One block per (row, local group) as above,
 * the sums as fixed-order block reductions in double; dw as the two-pass
 * column sums (rstd read at the channel's local group). */

static __device__ __forceinline__ void gate_span_d(int j, int E, int c0, int cg, int *lo, int *hi)
{
    int g = c0 / cg + j, a = g * cg - c0, b = (g + 1) * cg - c0;
    *lo = a > 0 ? a : 0;
    *hi = b < E ? b : E;
}

static int gate_ng_h(int E, int c0, int cg) { return (c0 + E - 1) / cg - c0 / cg + 1; }

static __global__ void gate_sums_k(float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                                   const float *dout, const float *rstd, int E, int c0, int cg, int ng)
{
    MT_DYN_SMEM(double, dred);  /* blockDim */
    int i = (int)blockIdx.x, row = i / ng, j = i % ng, nt = (int)blockDim.x, lo, hi;
    gate_span_d(j, E, c0, cg, &lo, &hi);
    const float *yr = y + (size_t)row * E, *zr = z + (size_t)row * ldz;
    double acc = 0.0;
    if (!dout) {
        for (int c = lo + (int)threadIdx.x; c < hi; c += nt) {
            float v = yr[c] * zr[c] * sigmoid_d(zr[c]);
            acc += (double)v * v;
        }
    } else {
        const float *d = dout + (size_t)row * E;
        float rs = rstd[i];
        for (int c = lo + (int)threadIdx.x; c < hi; c += nt)
            acc += (double)d[c] * w[c] * (yr[c] * zr[c] * sigmoid_d(zr[c]) * rs);
    }
    acc = block_sum(acc, dred);
    if (threadIdx.x == 0) s[(size_t)row * lds + j] = (float)acc;
}

static __global__ void gate_fwd_ext_k(float *out, float *rstd, const float *y, const float *z, int ldz, const float *w,
                                      const float *s, int lds, int E, int c0, int cg, int ng, float eps)
{
    int i = (int)blockIdx.x, row = i / ng, j = i % ng, nt = (int)blockDim.x, lo, hi;
    gate_span_d(j, E, c0, cg, &lo, &hi);
    const float *yr = y + (size_t)row * E, *zr = z + (size_t)row * ldz;
    float *o = out + (size_t)row * E;
    float rs = (float)(1.0 / sqrt((double)s[(size_t)row * lds + j] / cg + eps));
    if (threadIdx.x == 0) rstd[i] = rs;
    for (int c = lo + (int)threadIdx.x; c < hi; c += nt) o[c] = yr[c] * zr[c] * sigmoid_d(zr[c]) * rs * w[c];
}

static __global__ void gate_bwd_ext_k(float *dy, float *dz, const float *dout, const float *y, const float *z, int ldz,
                                      const float *w, const float *rstd, const float *s, int lds, int E, int c0,
                                      int cg, int ng)
{
    int i = (int)blockIdx.x, row = i / ng, j = i % ng, nt = (int)blockDim.x, lo, hi;
    gate_span_d(j, E, c0, cg, &lo, &hi);
    const float *yr = y + (size_t)row * E, *zr = z + (size_t)row * ldz, *d = dout + (size_t)row * E;
    float *dyr = dy + (size_t)row * E, *dzr = dz + (size_t)row * ldz;
    float rs = rstd[i], mean = (float)((double)s[(size_t)row * lds + j] / cg);
    for (int c = lo + (int)threadIdx.x; c < hi; c += nt) {
        float sg = sigmoid_d(zr[c]), si = zr[c] * sg, vh = yr[c] * si * rs;
        float dv = rs * (d[c] * w[c] - vh * mean);
        dyr[c] = dv * si;
        dzr[c] = dv * yr[c] * (sg + si * (1.0f - sg));
    }
}

/* dw pass 1 with the channel's local group (c0, cg) */
static __global__ void gate_dw_part_ext_k(float *part, const float *dout, const float *y, const float *z, int ldz,
                                          const float *rstd, int n, int E, int c0, int cg, int ng)
{
    int c = (int)(blockIdx.x * blockDim.x + threadIdx.x), rb = (int)blockIdx.y;
    if (c >= E) return;
    int j = (c0 + c) / cg - c0 / cg, r1 = (rb + 1) * COL_RB < n ? (rb + 1) * COL_RB : n;
    float acc = 0.0f;
    for (int row = rb * COL_RB; row < r1; row++) {
        float zv = z[(size_t)row * ldz + c];
        acc += dout[(size_t)row * E + c] * (y[(size_t)row * E + c] * zv * sigmoid_d(zv) * rstd[(size_t)row * ng + j]);
    }
    part[(size_t)rb * E + c] = acc;
}

extern "C" void mt_cuda_ssm_gate_norm_sums(void *be, float *s, int lds, const float *y, const float *z, int ldz,
                                           const float *w, const float *dout, const float *rstd, int n, int E, int c0,
                                           int cg)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int ng = gate_ng_h(E, c0, cg);
    if (n * ng == 0) return;
    unsigned t = pow2_threads(cg < E ? cg : E, 256);
    MT_LAUNCH(gate_sums_k, (unsigned)((size_t)n * ng), t, t * sizeof(double))(s, lds, y, z, ldz, w, dout, rstd, E, c0,
                                                                               cg, ng);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_ssm_gate_norm_forward_ext(void *be, float *out, float *rstd, const float *y, const float *z,
                                                  int ldz, const float *w, const float *s, int lds, int n, int E,
                                                  int c0, int cg, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int ng = gate_ng_h(E, c0, cg);
    if (n * ng == 0) return;
    unsigned t = pow2_threads(cg < E ? cg : E, 256);
    MT_LAUNCH(gate_fwd_ext_k, (unsigned)((size_t)n * ng), t, 0)(out, rstd, y, z, ldz, w, s, lds, E, c0, cg, ng, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_ssm_gate_norm_backward_ext(void *be, float *dy, float *dz, float *dw, const float *dout,
                                                   const float *y, const float *z, int ldz, const float *w,
                                                   const float *rstd, const float *s, int lds, int n, int E, int c0,
                                                   int cg)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int ng = gate_ng_h(E, c0, cg);
    if (n * ng == 0) return;
    unsigned t = pow2_threads(cg < E ? cg : E, 256);
    MT_LAUNCH(gate_bwd_ext_k, (unsigned)((size_t)n * ng), t, 0)(dy, dz, dout, y, z, ldz, w, rstd, s, lds, E, c0, cg,
                                                                ng);
    MT_CUDA_KCHECK();
    int nrb = (n + COL_RB - 1) / COL_RB;
    float *part = (float *)mt_cuda_workspace((size_t)nrb * E * sizeof(float));
    if (!part) return;
    MT_LAUNCH(gate_dw_part_ext_k, dim3((unsigned)((E + 127) / 128), (unsigned)nrb), 128, 0)(part, dout, y, z, ldz,
                                                                                           rstd, n, E, c0, cg, ng);
    MT_CUDA_KCHECK();
    colsum_blocks(dw, part, nrb, E, (size_t)E);
}

/* ---------------- one decoding step ---------------- */

/* One thread per (b, h, p): row p of S; the same operation order as scan_fwd_k. */
static __global__ void scan_step_k(float *y, float *S, float *xprev, float *Bprev, const float *x, const float *Bm,
                                   const float *Cm, const float *dt, const float *lam, const float *A,
                                   const float *Dsk, int B, int H, int P, int N, int first)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * H * P) return;
    int bh = i / P, p = i % P, h = bh % H;
    const float *bt = Bm + (size_t)bh * N, *ct = Cm + (size_t)bh * N, *bp = Bprev + (size_t)bh * N;
    float *s = S + ((size_t)bh * P + p) * N;
    float d = dt[bh], l = lam[bh], al = expf(d * A[h]), xt = x[i];
    float gx = l * d * xt, bx = first ? 0.0f : (1.0f - l) * d * al * xprev[i], acc = 0.0f;
    for (int n = 0; n < N; n++) {
        float v = (first ? 0.0f : al * s[n]) + gx * bt[n];
        if (!first) v += bx * bp[n];
        s[n] = v;
        acc += v * ct[n];
    }
    y[i] = acc + Dsk[h] * xt;
}

/* The state's "previous token" after the step: a separate launch, so no
 * thread reads Bprev after another overwrote it. */
static __global__ void scan_step_shift_k(float *xprev, float *Bprev, const float *x, const float *Bm, int nx, int nb)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nx) xprev[i] = x[i];
    if (i < nb) Bprev[i] = Bm[i];
}

extern "C" void mt_cuda_ssm_scan_step(void *be, float *y, float *S, float *xprev, float *Bprev, const float *x,
                                      const float *Bm, const float *Cm, const float *dt, const float *lam,
                                      const float *A, const float *Dsk, int B, int H, int P, int N, int first)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int n = B * H * P, nb = B * H * N, m = n > nb ? n : nb;
    if (m == 0) return;
    MT_LAUNCH(scan_step_k, (n + GLUE_THREADS - 1) / GLUE_THREADS, GLUE_THREADS, 0)(y, S, xprev, Bprev, x, Bm, Cm, dt,
                                                                                  lam, A, Dsk, B, H, P, N, first);
    MT_CUDA_KCHECK();
    MT_LAUNCH(scan_step_shift_k, (m + GLUE_THREADS - 1) / GLUE_THREADS, GLUE_THREADS, 0)(xprev, Bprev, x, Bm, n, nb);
    MT_CUDA_KCHECK();
}
