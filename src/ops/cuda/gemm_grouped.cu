/*
 * gemm_grouped.cu — the grouped bf16 GEMMs of the MoE experts whose group
 * sizes live on the device (mt_ops.h, "grouped bf16 GEMMs sized on the
 * device"), and moe_count_acc. Nothing is read back to the host: one launch
 * serves every expert (and a CUDA graph can hold it).
 *
 * The groups are row ranges of one expert-sorted buffer: group g owns rows
 * [offs[g], offs[g+1]) (offs: n+1 int32 in device memory, n <= 64).
 *   gemm_grouped_rows (forward y = x W_g^T, transB; dx = dy W_g, not):
 *     C[r,:] (N) = alpha A[r,:] op(B_g) + beta C[r,:]      r in group g
 *     A (rows, K) lda bf16; B_g (N, K) ldb if transB else (K, N) ldb, bf16;
 *     C (rows, N) ldc fp32, or bf16 (beta 0: the fp32 value rounded once,
 *     nearest even); rows at or past offs[n] (and past max_rows) untouched.
 *   gemm_grouped_sum (weight gradient dW_g += dy_g^T x_g):
 *     C_g (M, N) fp32 = alpha sum_{r in g} A[r,:]^T B[r,:] + beta C_g
 *     A (rows, M) lda, B (rows, N) ldb, bf16; an empty group: C_g = beta C_g
 *     (beta 0: zeros, C_g not read).
 *   moe_count_acc: load[e] (double) += sign (offs[e+1] - offs[e]), e < n.
 * A product of two bf16 values is exact in fp32; the sums are fp32, in the
 * tensor core's order (the cpu reference sums in OpenBLAS's: the harness
 * bounds the difference by the fp32 accumulation term, c K 2^-24 sum|a b|).
 *
 * HOW IT WORKS
 *
 * Warp-level mma.sync m16n8k16 bf16 -> fp32 (mma_sync.cuh; run exactly by
 * tests/cuda/emu/mma_ptx.h under the emulator). A block is 256 threads =
 * 8 warps and owns a 128 x BN tile of the output; the warps form 2 (rows)
 * x 4 (columns), a warp owns 64 x BN/4 = 4 m16 x BN/32 n8 accumulator tiles
 * (BN 128: 64 fp32 registers a thread, ~128 in all, two blocks an SM; BN
 * 256, the default: 128, ~220 in all, one block an SM, each A fragment read
 * from shared memory feeding twice the mma: 8 ldmatrix a 32 mma instead of
 * 6 a 16). The k order of every output element is the same at either BN. The k dimension (K of rows, the group's rows
 * of sum) runs in steps of BK = 32 through a 3-stage cp.async pipeline:
 * tile kt+2 is in flight while tile kt is multiplied (one __syncthreads a
 * step: the stage refilled at step kt is the one every warp finished at
 * step kt-1). Shared rows are padded by 8 bf16 (row strides of 80 and 272
 * bytes: the 8 row addresses of an ldmatrix fall in 8 distinct 16-byte
 * bank groups). Operand fragments come from shared memory by ldmatrix x4:
 *   rows: A tile [128 m][32 k] (row-major A), non-trans -> A fragments;
 *         transB: B tile [128 n][32 k], non-trans -> B fragments (as K in
 *         Q K^T); else B tile [32 k][128 n] from (K, N), .trans (as V in P V);
 *   sum:  A^T as A operand: tile [32 rows][128 m] of A (rows, M), .trans;
 *         B tile [32 rows][128 n], .trans.
 * Out-of-range 16-byte chunks (rows past the group, k past K, columns past
 * N or M: every dimension is a multiple of 8, so a chunk is all in or all
 * out) are zero-filled by cp.async with source size 0 and never read;
 * stores are masked to the group's rows and to N (M), two adjacent columns
 * a lane (8-byte fp32 or 4-byte bf16 pairs).
 * Grids, sized on the host without the group sizes:
 *   rows: (ceil(N/BN), ceil(max_rows/128) + n): group g needs ceil(rows_g
 *     / 128) row tiles, at most rows_g / 128 + 1 when rows_g > 0, so the
 *     sum over groups is at most offs[n] / 128 + n. A block reads offs into
 *     shared memory (clamped to [0, max_rows]) and walks the groups to map
 *     its y index to (group, first row); blocks past the last tile exit. A
 *     tile never spans two groups (its last rows are masked), so a group's
 *     rows are written by its own blocks only.
 *   sum:  (ceil(N/BN), ceil(M/128), n): a block loops over its group's rows
 *     in steps of 32 (the tail zero-filled); an empty group runs no step and
 *     writes beta C_g (zeros for beta 0).
 * Deterministic: every output element is one thread's accumulator, summed
 * over k in one fixed order (k tiles in order, each mma's fixed order), no
 * split of k, no atomics; the order does not depend on scheduling, nor (for
 * rows) on where a row falls in its tile.
 * The B_g (rows) and C_g (sum) pointers travel by value in the launch (a
 * struct of MT_GROUPED_DEV_MAX pointers, the unused tail zeroed: part of
 * the launch's signature under CUDA graphs).
 */
#include "cuda_impl.cuh"
#include "mma_sync.cuh"
#include "gemm_grouped.cuh"

#include <type_traits>

typedef __nv_bfloat16 bf16;

#define GG_BM      128                 /* rows (m) of a block's tile        */
/* BN, the columns (n) of a block's tile: a template parameter, 128 (warp
 * tiles 64 x 32) or 256 (64 x 64: half the ldmatrix traffic per mma, the
 * CUTLASS sm80 shape; one block an SM); the backend's gg_bn picks it
 * (MT_CUDA_GG_BN, default 256), the same products and k order either way */
#define GG_BK      32                  /* k a pipeline step                 */
#define GG_STAGES  3
#define GG_THREADS 256
#define GG_LDK     (GG_BK + 8)         /* shared row of k: 40 bf16 (80 bytes)  */
#define GG_LDM     (GG_BM + 8)         /* shared row of m: 136 (272 bytes)  */
#define GG_TILE_MK (GG_BM * GG_LDK)    /* [128][40]: A (rows)                */
#define GG_TILE_KM (GG_BK * GG_LDM)    /* [32][136]: A^T (sum)               */
/* shared row of n (BN + 8: 136 or 264 bf16, 272 or 528 bytes) and B's tiles */
template <int BN> struct gg_tiles {
    static constexpr int LDN = BN + 8;
    static constexpr int NK = BN * GG_LDK;   /* [BN][40]: B^T (rows, transB) */
    static constexpr int KN = GG_BK * LDN;   /* [32][BN+8]: B (rows, !transB; sum) */
};


/* ---- fragments (lane l: i = l >> 3 names the 8x8 matrix whose row address it gives) ---- */
/* A operands of the 4 m16 tiles at rows m0.. of a [m][k] tile (row stride LD), k0..k0+15 */
template <int LD>
static __device__ __forceinline__ void gg_frag_a_mk(uint32_t a[4][4], const bf16 *s, int m0, int k0, int lane)
{
    const int i = lane >> 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
        mt_ldsm_x4(a[mi], s + (m0 + 16 * mi + (i & 1) * 8 + (lane & 7)) * LD + k0 + (i >> 1) * 8);
}
/* ... of a [k][m] tile (A^T stored), .trans: matrices (k0, m0) (k0, m0+8) (k0+8, m0) (k0+8, m0+8) */
static __device__ __forceinline__ void gg_frag_a_km(uint32_t a[4][4], const bf16 *s, int m0, int k0, int lane)
{
    const int i = lane >> 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
        mt_ldsm_x4_t(a[mi], s + (k0 + (i >> 1) * 8 + (lane & 7)) * GG_LDM + m0 + 16 * mi + (i & 1) * 8);
}
/* B operands of the NI n8 tiles at columns n0.. of a [n][k] tile, non-trans:
 * matrices (n0, k0) (n0, k0+8) (n0+8, k0) (n0+8, k0+8) = b0 b1 of n0, b0 b1 of n0+8 */
template <int NI>
static __device__ __forceinline__ void gg_frag_b_nk(uint32_t b[NI][2], const bf16 *s, int n0, int k0, int lane)
{
    const int i = lane >> 3;
#pragma unroll
    for (int np = 0; np < NI / 2; np++) {
        uint32_t r[4];
        mt_ldsm_x4(r, s + (n0 + 16 * np + (i >> 1) * 8 + (lane & 7)) * GG_LDK + k0 + (i & 1) * 8);
        b[2 * np][0] = r[0]; b[2 * np][1] = r[1]; b[2 * np + 1][0] = r[2]; b[2 * np + 1][1] = r[3];
    }
}
/* ... of a [k][n] tile (row stride LD), .trans: matrices (k0, n0) (k0+8, n0) (k0, n0+8) (k0+8, n0+8), the same order */
template <int NI, int LD>
static __device__ __forceinline__ void gg_frag_b_kn(uint32_t b[NI][2], const bf16 *s, int n0, int k0, int lane)
{
    const int i = lane >> 3;
#pragma unroll
    for (int np = 0; np < NI / 2; np++) {
        uint32_t r[4];
        mt_ldsm_x4_t(r, s + (k0 + (i & 1) * 8 + (lane & 7)) * LD + n0 + 16 * np + (i >> 1) * 8);
        b[2 * np][0] = r[0]; b[2 * np][1] = r[1]; b[2 * np + 1][0] = r[2]; b[2 * np + 1][1] = r[3];
    }
}
template <int NI>
static __device__ __forceinline__ void gg_mma(float acc[4][NI][4], const uint32_t a[4][4], const uint32_t b[NI][2])
{
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++) mt_mma_16816(acc[mi][ni], a[mi], b[ni]);
}

/* acc = 0, then the k tiles through the GG_STAGES-deep cp.async pipeline
 * (both kernels' main loop): load(stage, kt) issues tile kt's copies into a
 * stage, mul(stage) multiplies a landed stage into acc. Tile kt+2 is in
 * flight while kt is multiplied; one barrier a step (the stage refilled at
 * step kt is the one every warp finished at step kt-1). */
template <typename Load, typename Mul, int NI>
static __device__ __forceinline__ void gg_mainloop(int ktiles, Load &load, Mul mul, float (&acc)[4][NI][4])
{
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < GG_STAGES - 1; s++) {
        if (s < ktiles) load(s, s);
        mt_cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        mt_cp_async_wait<GG_STAGES - 2>();
        __syncthreads();   /* tile kt landed for every thread; stage (kt-1) % 3 consumed by every warp */
        if (kt + GG_STAGES - 1 < ktiles) load((kt + GG_STAGES - 1) % GG_STAGES, kt + GG_STAGES - 1);
        mt_cp_async_commit();
        mul(kt % GG_STAGES);
    }
}

/* The warp's 64 x (8 NI) block of alpha acc into C (+ beta C) at rows r0 + .., columns c0 + ..:
 * lane (g4, t) holds rows g4, g4 + 8 of each m16 tile, columns 2t, 2t+1 of each n8 tile; rows at
 * or past r_end and columns at or past N (a multiple of 8: c + 1 < N too) are not written */
template <int NI, typename CT>
static __device__ __forceinline__ void gg_epilogue(CT *C, int ldc, int r0, int r_end, int c0, int N,
                                                   const float (&acc)[4][NI][4], float alpha, float beta, int lane)
{
    const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + 16 * mi + g4 + 8 * h;
            if (r >= r_end) continue;
            CT *crow = C + (size_t)r * (size_t)ldc;
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                const int c = c0 + 8 * ni + 2 * t4;
                if (c >= N) continue;
                gg_store2(crow + c, alpha * acc[mi][ni][2 * h], alpha * acc[mi][ni][2 * h + 1], beta);
            }
        }
}

/* ---- gemm_grouped_rows ----
 * MODE = TB + 2 (C bf16) + 4 (BN 256): one template argument (a kernel's name in the launch log and
 * the profile has no comma) */
template <int MODE> struct gg_mode {
    static constexpr int TB = MODE & 1, BN = MODE & 4 ? 256 : 128;
    typedef typename std::conditional<(MODE & 2) != 0, bf16, float>::type CT;
};
/* block (x: column tile, y: row tile over all groups); TB = transB; CT = float or bf16; BN the tile's columns.
 * Long, as a GEMM main loop is: the tile mapping, the loaders, the pipeline and the epilogue share the
 * thread's registers (pointers, masks, accumulators); split into calls they would pass them all. */
template <int MODE>
static __global__ void __launch_bounds__(GG_THREADS, gg_mode<MODE>::BN == 128 ? 2 : 1)
gg_rows_k(gg_bptrs Bp, const int32_t *offs, int n, int max_rows, int N, int K, float alpha, const bf16 *A, int lda,
          int ldb, float beta, typename gg_mode<MODE>::CT *C, int ldc)
{
    constexpr int TB = gg_mode<MODE>::TB, BN = gg_mode<MODE>::BN;
    constexpr int TILE_B = TB ? gg_tiles<BN>::NK : gg_tiles<BN>::KN, STAGE = GG_TILE_MK + TILE_B;
    constexpr int LDN = gg_tiles<BN>::LDN, NI = BN / 32, BI = BN / 64;   /* n8 tiles a warp, B chunks a thread */
    constexpr int CPR = BN / 8;                                            /* 16-byte chunks of a [k][n] row */
    __shared__ int so[MT_GROUPED_DEV_MAX + 1];
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *S = (bf16 *)sm;   /* stage s: A at S + s STAGE, B after it */
    const int tid = threadIdx.x;
    int g = 0, r0 = 0, r1 = 0;   /* this block's group and rows [r0, r1) (gemm_grouped.cuh) */
    if (!gg_block_rows(so, offs, n, max_rows, GG_BM, &g, &r0, &r1)) return;   /* past the last tile: the whole block */
    const bf16 *Bg = Bp.p[g];
    const int n0 = blockIdx.x * BN;

    /* this thread's 16-byte chunks: A rows ra + 64 i at k column ca; B [n][k] likewise (rows
     * ra + 64 i), B [k][n] k rows tid / CPR + (256 / CPR) i at column (tid % CPR) 8.
     * ra: a 16-byte copy is served 8 lanes a phase, 2 rows of 64 bytes; rows GG_LDK = 40 bf16
     * (20 words) apart take banks 20 r + [0, 16), so neighbours overlap by one chunk (2-way,
     * the emulator's count: 1.3-2.0 wavefronts a phase); rows 4 apart (80 = 16 mod 32) take
     * the other 16 banks. So a phase's lanes 0-3 copy row R and 4-7 row R + 4; a warp still
     * covers the same 8 rows (the same global transactions) */
    const int ca = (tid & 3) * 8, ra = (tid >> 5) * 8 + ((tid >> 3) & 3) + ((tid >> 2) & 1) * 4;
    const bf16 *pa[2], *pb[BI];
    bool oka[2], okb[BI];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = r0 + ra + 64 * i;
        oka[i] = r < r1;
        pa[i] = A + (size_t)(oka[i] ? r : r0) * (size_t)lda + ca;
    }
#pragma unroll
    for (int i = 0; i < BI; i++) {
        if (TB) {
            const int nn = n0 + ra + 64 * i;
            okb[i] = nn < N;
            pb[i] = Bg + (size_t)(okb[i] ? nn : 0) * (size_t)ldb + ca;
        } else {
            const int cn = n0 + (tid % CPR) * 8;
            okb[i] = cn < N;
            pb[i] = Bg + (size_t)(tid / CPR + (GG_THREADS / CPR) * i) * (size_t)ldb + (okb[i] ? cn : 0);
        }
    }
    const int ktiles = (K + GG_BK - 1) / GG_BK;
    auto load = [&](int stage, int kt) {
        bf16 *As = S + stage * STAGE, *Bs = As + GG_TILE_MK;
        const int k0 = kt * GG_BK;
        const bool kin = k0 + ca < K;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = ra + 64 * i;
            const bool ok = oka[i] && kin;
            mt_cp_async16(As + r * GG_LDK + ca, ok ? pa[i] + k0 : A, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < BI; i++) {
            if (TB) {
                const int r = ra + 64 * i;
                const bool ok = okb[i] && kin;
                mt_cp_async16(Bs + r * GG_LDK + ca, ok ? pb[i] + k0 : Bg, ok ? 16 : 0);
            } else {
                const int kr = tid / CPR + (GG_THREADS / CPR) * i;
                const bool ok = okb[i] && k0 + kr < K;
                mt_cp_async16(Bs + kr * LDN + (tid % CPR) * 8, ok ? pb[i] + (size_t)k0 * (size_t)ldb : Bg,
                              ok ? 16 : 0);
            }
        }
    };

    const int lane = tid & 31, warp = tid >> 5, wm = (warp >> 2) * 64, wn = (warp & 3) * (BN / 4);
    float acc[4][NI][4];
    gg_mainloop(ktiles, load, [&](int stage) {
        const bf16 *As = S + stage * STAGE, *Bs = As + GG_TILE_MK;
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            uint32_t a[4][4], b[NI][2];
            gg_frag_a_mk<GG_LDK>(a, As, wm, kk, lane);
            if (TB) gg_frag_b_nk<NI>(b, Bs, wn, kk, lane);
            else gg_frag_b_kn<NI, LDN>(b, Bs, wn, kk, lane);
            gg_mma<NI>(acc, a, b);
        }
    }, acc);

    gg_epilogue<NI>(C, ldc, r0 + wm, r1, n0 + wn, N, acc, alpha, beta, lane);
}

/* ---- gemm_grouped_sum ----
 * block (x: column tile of N, y: row tile of M, z: group) */
template <int BN>
static __global__ void __launch_bounds__(GG_THREADS, BN == 128 ? 2 : 1)
gg_sum_k(gg_cptrs Cp, const int32_t *offs, int M, int N, float alpha, const bf16 *A, int lda, const bf16 *B, int ldb,
         float beta, int ldc)
{
    constexpr int LDN = gg_tiles<BN>::LDN, STAGE = GG_TILE_KM + gg_tiles<BN>::KN, NI = BN / 32, BI = BN / 64;
    constexpr int CPR = BN / 8;   /* 16-byte chunks of a B row */
    MT_DYN_SMEM(unsigned char, sm);
    bf16 *S = (bf16 *)sm;   /* stage s: A^T tile at S + s STAGE, B tile after it */
    const int tid = threadIdx.x, g = blockIdx.z, m0 = blockIdx.y * GG_BM, n0 = blockIdx.x * BN;
    const int lo = offs[g] > 0 ? offs[g] : 0, rows = offs[g + 1] > lo ? offs[g + 1] - lo : 0;
    float *Cg = Cp.p[g];

    /* this thread's chunks: A^T k rows (tid >> 4) + 16 i at m column (tid & 15) 8; B k rows
     * tid / CPR + (256 / CPR) i at n column (tid % CPR) 8 */
    const int cc = (tid & 15) * 8, kr0 = tid >> 4, cb = (tid % CPR) * 8, kb0 = tid / CPR;
    const bool oka = m0 + cc < M, okb = n0 + cb < N;
    const bf16 *pa = A + (size_t)lo * (size_t)lda + (oka ? m0 + cc : 0);
    const bf16 *pb = B + (size_t)lo * (size_t)ldb + (okb ? n0 + cb : 0);
    const int ktiles = (rows + GG_BK - 1) / GG_BK;
    auto load = [&](int stage, int kt) {
        bf16 *As = S + stage * STAGE, *Bs = As + GG_TILE_KM;
        const int k0 = kt * GG_BK;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int kr = kr0 + 16 * i;
            const bool a_ok = oka && k0 + kr < rows;
            mt_cp_async16(As + kr * GG_LDM + cc, a_ok ? pa + (size_t)(k0 + kr) * (size_t)lda : A, a_ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < BI; i++) {
            const int kr = kb0 + (GG_THREADS / CPR) * i;
            const bool b_ok = okb && k0 + kr < rows;
            mt_cp_async16(Bs + kr * LDN + cb, b_ok ? pb + (size_t)(k0 + kr) * (size_t)ldb : B, b_ok ? 16 : 0);
        }
    };

    const int lane = tid & 31, warp = tid >> 5, wm = (warp >> 2) * 64, wn = (warp & 3) * (BN / 4);
    float acc[4][NI][4];
    gg_mainloop(ktiles, load, [&](int stage) {
        const bf16 *As = S + stage * STAGE, *Bs = As + GG_TILE_KM;
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            uint32_t a[4][4], b[NI][2];
            gg_frag_a_km(a, As, wm, kk, lane);
            gg_frag_b_kn<NI, LDN>(b, Bs, wn, kk, lane);
            gg_mma<NI>(acc, a, b);
        }
    }, acc);

    gg_epilogue<NI>(Cg, ldc, m0 + wm, M, n0 + wn, N, acc, alpha, beta, lane);
}

/* ---- moe_count_acc ---- */
static __global__ void gg_count_acc_k(double *load, const int32_t *offs, int n, double sign)
{
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        load[e] += sign * (double)(offs[e + 1] - offs[e]);
}

/* ---- host side ---- */
template <int MODE>
static void gg_rows_launch_mode(const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N, int K,
                                float alpha, const bf16 *A, int lda, int ldb, float beta, void *C, int ldc)
{
    constexpr int TB = gg_mode<MODE>::TB, BN = gg_mode<MODE>::BN;
    const size_t smem = (size_t)GG_STAGES * (GG_TILE_MK + (TB ? gg_tiles<BN>::NK : gg_tiles<BN>::KN)) * sizeof(bf16);
    if (!mt_cuda_smem_opt_in(gg_rows_k<MODE>, smem)) return;
    const dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((max_rows + GG_BM - 1) / GG_BM + n));
    MT_LAUNCH(gg_rows_k<MODE>, grid, GG_THREADS, smem)(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta,
                                                       (typename gg_mode<MODE>::CT *)C, ldc);
    MT_CUDA_KCHECK();
}
/* transB, a bf16 C, the backend's BN -> the kernel's MODE */
static void gg_rows_launch(int tb, int c_bf16, const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N,
                           int K, float alpha, const bf16 *A, int lda, int ldb, float beta, void *C, int ldc)
{
    switch (tb + 2 * c_bf16 + 4 * (mt_cuda_be->gg_bn == 256)) {
#define GG_CASE(m) case m: gg_rows_launch_mode<m>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, C, ldc); break;
    GG_CASE(0) GG_CASE(1) GG_CASE(2) GG_CASE(3) GG_CASE(4) GG_CASE(5) GG_CASE(6) GG_CASE(7)
#undef GG_CASE
    }
}
template <int BN>
static void gg_sum_launch(const gg_cptrs &cp, const int32_t *offs, int n, int M, int N, float alpha, const bf16 *A,
                          int lda, const bf16 *B, int ldb, float beta, int ldc)
{
    const size_t smem = (size_t)GG_STAGES * (GG_TILE_KM + gg_tiles<BN>::KN) * sizeof(bf16);
    if (!mt_cuda_smem_opt_in(gg_sum_k<BN>, smem)) return;
    const dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + GG_BM - 1) / GG_BM), (unsigned)n);
    MT_LAUNCH(gg_sum_k<BN>, grid, GG_THREADS, smem)(cp, offs, M, N, alpha, A, lda, B, ldb, beta, ldc);
    MT_CUDA_KCHECK();
}

static int gg_aligned16(const void *p) { return mt_cuda_aligned(p, 16); }

extern "C" void mt_cuda_gemm_grouped_rows(void *be, int n, const int32_t *offs, int max_rows, int N, int K,
                                          int transB, float alpha, const mt_bf16 *A, int lda,
                                          const mt_bf16 *const *B, int ldb, float beta, void *C,
                                          enum mt_elem c_type, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n <= 0 || max_rows <= 0) return;
    if (n > MT_GROUPED_DEV_MAX) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_rows: more than MT_GROUPED_DEV_MAX groups");
        return;
    }
    if (!mt_grouped_dev_dims_ok(N, K, lda, ldb) || ldc <= 0 || ldc % 8 || lda < K || ldc < N ||
        ldb < (transB ? K : N)) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_rows: N, K and the leading dimensions must be multiples of 8 (>= the rows)");
        return;
    }
    if (c_type != MT_ELEM_F32 && !(c_type == MT_ELEM_BF16 && beta == 0.0f)) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_rows: C must be fp32, or bf16 with beta 0");
        return;
    }
    if ((max_rows + GG_BM - 1) / GG_BM + n > 65535) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_rows: max_rows over the grid's row tiles (65535)");
        return;
    }
    gg_bptrs bp = {};   /* zeroed: the unused tail is part of the launch's signature (graphs) */
    int ok = gg_aligned16(A) && gg_aligned16(C);
    for (int g = 0; g < n; g++) {
        bp.p[g] = (const bf16 *)B[g];
        ok = ok && gg_aligned16(B[g]);
    }
    if (!ok) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_rows: A, C and every B_g must be 16-byte aligned");
        return;
    }
    if (mt_cuda_be->gg_wgmma)   /* knob grouped_gemm_kernel=wgmma: gemm_grouped_wg.cu */
        mt_cuda_gw_rows(transB, c_type == MT_ELEM_BF16, bp, offs, n, max_rows, N, K, alpha, (const bf16 *)A, lda, ldb,
                        beta, C, ldc);
    else
        gg_rows_launch(transB != 0, c_type == MT_ELEM_BF16, bp, offs, n, max_rows, N, K, alpha, (const bf16 *)A, lda,
                       ldb, beta, C, ldc);
}

extern "C" void mt_cuda_gemm_grouped_sum(void *be, int n, const int32_t *offs, int M, int N, float alpha,
                                         const mt_bf16 *A, int lda, const mt_bf16 *B, int ldb, float beta,
                                         float *const *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n <= 0) return;
    if (n > MT_GROUPED_DEV_MAX) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_sum: more than MT_GROUPED_DEV_MAX groups");
        return;
    }
    if (!mt_grouped_dev_dims_ok(M, N, lda, ldb) || ldc <= 0 || ldc % 8 || lda < M || ldb < N || ldc < N) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_sum: M, N and the leading dimensions must be multiples of 8 (>= the rows)");
        return;
    }
    if ((M + GG_BM - 1) / GG_BM > 65535) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_sum: M over the grid's row tiles (65535)");
        return;
    }
    gg_cptrs cp = {};   /* zeroed tail (graphs) */
    int ok = gg_aligned16(A) && gg_aligned16(B);
    for (int g = 0; g < n; g++) {
        cp.p[g] = C[g];
        ok = ok && gg_aligned16(C[g]);
    }
    if (!ok) {
        MT_CUDA_UNSUPPORTED("gemm_grouped_sum: A, B and every C_g must be 16-byte aligned");
        return;
    }
    if (mt_cuda_be->gg_wgmma)   /* knob grouped_gemm_kernel=wgmma: gemm_grouped_wg.cu */
        mt_cuda_gw_sum(cp, offs, n, M, N, alpha, (const bf16 *)A, lda, (const bf16 *)B, ldb, beta, ldc);
    else if (mt_cuda_be->gg_bn == 128)
        gg_sum_launch<128>(cp, offs, n, M, N, alpha, (const bf16 *)A, lda, (const bf16 *)B, ldb, beta, ldc);
    else
        gg_sum_launch<256>(cp, offs, n, M, N, alpha, (const bf16 *)A, lda, (const bf16 *)B, ldb, beta, ldc);
}

extern "C" void mt_cuda_moe_count_acc(void *be, double *load, const int32_t *offs, int n, double sign)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n <= 0) return;
    MT_LAUNCH(gg_count_acc_k, mt_cuda_blocks((size_t)n, 128), 128, 0)(load, offs, n, sign);
    MT_CUDA_KCHECK();
}
