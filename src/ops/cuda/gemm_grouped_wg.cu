/*
 * gemm_grouped_wg.cu — the grouped GEMMs of the MoE experts (gemm_grouped.cu's
 * contract, groups and grids) on Hopper's warpgroup MMA (wgmma.cuh), knob
 * grouped_gemm_kernel=wgmma (docs/cuda.md "Grouped GEMMs on wgmma"). Three
 * products, one block design:
 *
 *   NT  (rows, transB; the forward y_g = x_g W_g^T: gate|up and down)
 *       C[r, n] = alpha sum_k A[r, k] B_g[n, k] (+ beta C)    A, B_g K-major
 *   NN  (rows; the backward dx_g = dy_g W_g)
 *       C[r, n] = alpha sum_k A[r, k] B_g[k, n] (+ beta C)    B_g MN-major
 *   SUM (the weight gradient dW_g = dy_g^T x_g)
 *       C_g[m, n] = alpha sum_{r in g} A[r, m] B[r, n] + beta C_g   A, B MN-major
 *
 * A K-major operand is a tile of rows of 64 k (wgmma's native form); an
 * MN-major one is a tile of 64 k rows of the MN elements, read by the
 * instruction's imm-trans (wgmma.cuh mt_wgmma_desc_sw128_mn): no transpose,
 * no ldmatrix, either way straight from global memory by cp.async. A block is
 * 2 warpgroups on a 128 x 256 output tile, warpgroup w on rows (m) 64 w ..
 * 64 w + 63, its 64 x 256 as two m64n128 accumulators (128 fp32 registers a
 * thread). k runs in slices of 64 (K for the rows products, the group's rows
 * for SUM), each slice per warpgroup 4 k16 steps x 2 halves = 8 wgmma
 * m64n128k16, both operands from shared memory (A: 128 x 64, 16 KiB; B: 256 x
 * 64, 32 KiB), committed as one group. The pipeline (4 stages, 193 KiB):
 * slices kt + 1 and kt + 2 in flight by cp.async while slice kt's wgmmas run,
 * with slice kt - 1's still running (wait_group 1 after each commit); the
 * stage refilled at step kt is slice kt - 2's, which every warpgroup's wait of
 * step kt - 1 retired before the step's barrier. One barrier a slice.
 * Out-of-range 16-byte chunks (rows past the group, MN past N or M, k past K
 * or the group's rows; N, M, K multiples of 8: a chunk is all in or all out)
 * are zero-filled by cp.async (source size 0) and masked at the store.
 * Deterministic: each output element is one thread's accumulator, k slices in
 * order, no atomics; the sum's order within a k16 step is the tensor core's
 * (the mma.sync kernels' bits are not promised, the fp32 bound of the harness
 * is). An empty group of SUM runs no slice: C_g = beta C_g (zeros for beta 0).
 */
#include "cuda_impl.cuh"
#include "wgmma.cuh"
#include "gemm_grouped.cuh"

typedef __nv_bfloat16 bf16;

#define GW_BM      128
#define GW_BN      256
#define GW_BK      64
#define GW_STAGES  4
#define GW_THREADS 256
#define GW_TILE_A  (GW_BM * GW_BK * 2)      /* 16 KiB */
#define GW_TILE_B  (GW_BN * GW_BK * 2)      /* 32 KiB: two 128-row halves, 16 KiB apart */
#define GW_STAGE   (GW_TILE_A + GW_TILE_B)
#define GW_SMEM    (GW_STAGES * GW_STAGE + MT_WGMMA_ALIGN_SLACK)

/* K-major: rows row0 .. row0 + R - 1 (those below `end`), columns k0 .. k0 + 63 (those below K) of src
 * (ld) into a swizzled R-row tile, asynchronously; the rest zero-filled (R 8 / 256 chunks a thread) */
template <int R>
static __device__ __forceinline__ void gw_load(unsigned char *tile, const bf16 *src, int ld, int row0, int end, int k0,
                                               int K)
{
#pragma unroll
    for (int i = 0; i < R * 8 / GW_THREADS; i++) {
        const int e = (int)threadIdx.x + GW_THREADS * i, r = e >> 3, c = e & 7;
        const bool ok = row0 + r < end && k0 + 8 * c < K;
        mt_cp_async16(tile + mt_wgmma_swz<R>(r, c), ok ? src + (size_t)(row0 + r) * (size_t)ld + k0 + 8 * c : src,
                      ok ? 16 : 0);
    }
}

/* MN-major: k rows k0 .. k0 + 63 (those below kend) of src (ld), its columns c0 .. c0 + C - 1 (those below
 * cend) into a 64 k-row tile (mt_wgmma_swz<GW_BK>(k, chunk): 64-column blocks GW_MN_LBO apart), the rest
 * zero-filled (C 8 / 256 chunks a thread) */
#define GW_MN_LBO (GW_BK * 128)   /* 8 KiB: a 64-column block of 64 k rows */
template <int C>
static __device__ __forceinline__ void gw_load_mn(unsigned char *tile, const bf16 *src, int ld, int k0, int kend,
                                                  int c0, int cend)
{
#pragma unroll
    for (int i = 0; i < GW_BK * C / 8 / GW_THREADS; i++) {
        const int e = (int)threadIdx.x + GW_THREADS * i, r = e / (C / 8), c = e % (C / 8);
        const bool ok = k0 + r < kend && c0 + 8 * c < cend;
        mt_cp_async16(tile + mt_wgmma_swz<GW_BK>(r, c), ok ? src + (size_t)(k0 + r) * (size_t)ld + c0 + 8 * c : src,
                      ok ? 16 : 0);
    }
}

/* an operand's descriptor: K-major (MN 0) or MN-major (1; 64-column blocks GW_MN_LBO apart) */
template <int MN>
static __device__ __forceinline__ uint64_t gw_desc(const unsigned char *p)
{
    return MN ? mt_wgmma_desc_sw128_mn(p, GW_MN_LBO) : mt_wgmma_desc_sw128(p);
}

/* The block's product: nk slices through the stage ring, load(stage, kt) filling a stage (A's tile at
 * its start, B's GW_TILE_A after); TA / TB: A / B MN-major. Warpgroup w's A is the 64 rows (K-major) or
 * the 64-column block (MN-major) 8 KiB into the tile either way; B's two 128-column halves are 16 KiB
 * apart either way (K-major: 128 rows; MN-major: two blocks). */
template <int TA, int TB, typename Load>
static __device__ __forceinline__ void gw_mainloop(const unsigned char *S, int nk, Load load, float (&acc)[2][64])
{
    const int wg = mt_wgmma_group();
#pragma unroll
    for (int i = 0; i < 64; i++) acc[0][i] = acc[1][i] = 0.0f;
    for (int s = 0; s < 2; s++) {
        if (s < nk) load(s, s);
        mt_cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        mt_cp_async_wait<1>();    /* slice kt landed (this thread's copies; kt + 1 may be in flight) */
        mt_fence_proxy_async();   /* ... visible to wgmma, after the barrier */
        __syncthreads();          /* every thread's; slice kt - 2's wgmmas retired by every warpgroup */
        if (kt + 2 < nk) load((kt + 2) % GW_STAGES, kt + 2);
        mt_cp_async_commit();
        const unsigned char *b = S + (kt % GW_STAGES) * GW_STAGE + GW_TILE_A;
        const unsigned char *a = b - GW_TILE_A + wg * 8192;
        mt_wgmma_fence_operand<64>(acc[0]);
        mt_wgmma_fence_operand<64>(acc[1]);
        mt_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++) {
            const uint64_t da = gw_desc<TA>(a + (TA ? 2048 : 32) * kk);
            const unsigned char *b0 = b + (TB ? 2048 : 32) * kk;
            mt_wgmma_128_ss<TA, TB>(acc[0], da, gw_desc<TB>(b0), 1);
            mt_wgmma_128_ss<TA, TB>(acc[1], da, gw_desc<TB>(b0 + GW_TILE_B / 2), 1);
        }
        mt_wgmma_commit();
        mt_wgmma_wait<1>();       /* slice kt - 1's group retired (kt's may run on) */
    }
    mt_wgmma_wait<0>();
    mt_wgmma_fence_operand<64>(acc[0]);
    mt_wgmma_fence_operand<64>(acc[1]);
}

/* The epilogue: acc[h][4 j + e] is row 16 q + lr + 8 (e >> 1) of the warpgroup's 64 (from row0, those
 * below end), column n0 + 128 h + 8 j + 2 t + (e & 1) (those below N) */
template <typename CT>
static __device__ __forceinline__ void gw_store(const float (&acc)[2][64], CT *C, int ldc, int row0, int end, int n0,
                                                int N, float alpha, float beta)
{
    const int tid = threadIdx.x, q = (tid % 128) / MT_WARP, lane = tid % MT_WARP, lr = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        const int r = row0 + 16 * q + lr + 8 * e2;
        if (r >= end) continue;
        CT *crow = C + (size_t)r * (size_t)ldc;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int c = n0 + 128 * h + 8 * j + 2 * t;
                if (c >= N) continue;   /* N is a multiple of 8: c + 1 < N too */
                gg_store2(crow + c, alpha * acc[h][4 * j + 2 * e2], alpha * acc[h][4 * j + 2 * e2 + 1], beta);
            }
    }
}

/* NT and NN: block (x: column tile of N, y: row tile, groups in order: gemm_grouped.cuh) */
template <int TB, typename CT>
static __global__ void __launch_bounds__(GW_THREADS, 1)
gw_rows_k(gg_bptrs Bp, const int32_t *offs, int n, int max_rows, int N, int K, float alpha, const bf16 *A, int lda,
          int ldb, float beta, CT *C, int ldc)
{
    __shared__ int so[MT_GROUPED_DEV_MAX + 1];
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *S = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 1024-aligned (wgmma.cuh) */
    int g = 0, r0 = 0, r1 = 0;   /* this block's group and rows [r0, r1) (gemm_grouped.cuh) */
    if (!gg_block_rows(so, offs, n, max_rows, GW_BM, &g, &r0, &r1)) return;   /* past the last tile */
    const bf16 *Bg = Bp.p[g];
    const int n0 = blockIdx.x * GW_BN;

    /* slice kt into stage st: A's 128 rows x 64 k; B's 256 rows x 64 k (NT) or 64 k rows x 256 (NN) */
    auto load = [&](int st, int kt) {
        unsigned char *As = S + st * GW_STAGE;
        gw_load<GW_BM>(As, A, lda, r0, r1, kt * GW_BK, K);
        if constexpr (TB) gw_load_mn<GW_BN>(As + GW_TILE_A, Bg, ldb, kt * GW_BK, K, n0, N);
        else gw_load<GW_BN>(As + GW_TILE_A, Bg, ldb, n0, N, kt * GW_BK, K);
    };
    float acc[2][64];   /* columns 0-127 and 128-255 of the warpgroup's 64 rows */
    gw_mainloop<0, TB>(S, (K + GW_BK - 1) / GW_BK, load, acc);
    gw_store(acc, C, ldc, r0 + 64 * mt_wgmma_group(), r1, n0, N, alpha, beta);
}

/* SUM: block (x: column tile of N, y: row tile of M, z: group) */
static __global__ void __launch_bounds__(GW_THREADS, 1)
gw_sum_k(gg_cptrs Cp, const int32_t *offs, int M, int N, float alpha, const bf16 *A, int lda, const bf16 *B, int ldb,
         float beta, int ldc)
{
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *S = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 1024-aligned (wgmma.cuh) */
    const int g = blockIdx.z, m0 = blockIdx.y * GW_BM, n0 = blockIdx.x * GW_BN;
    const int lo = offs[g] > 0 ? offs[g] : 0, rows = offs[g + 1] > lo ? offs[g + 1] - lo : 0;
    const bf16 *Ag = A + (size_t)lo * (size_t)lda, *Bg = B + (size_t)lo * (size_t)ldb;

    /* slice kt (the group's rows 64 kt ..) into stage st: A's 64 rows x 128 m, B's 64 rows x 256 n */
    auto load = [&](int st, int kt) {
        unsigned char *As = S + st * GW_STAGE;
        gw_load_mn<GW_BM>(As, Ag, lda, kt * GW_BK, rows, m0, M);
        gw_load_mn<GW_BN>(As + GW_TILE_A, Bg, ldb, kt * GW_BK, rows, n0, N);
    };
    float acc[2][64];
    gw_mainloop<1, 1>(S, (rows + GW_BK - 1) / GW_BK, load, acc);
    gw_store(acc, Cp.p[g], ldc, m0 + 64 * mt_wgmma_group(), M, n0, N, alpha, beta);
}

template <int TB, typename CT>
static void gw_rows_launch_t(const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N, int K, float alpha,
                             const bf16 *A, int lda, int ldb, float beta, CT *C, int ldc)
{
    if (!mt_cuda_smem_opt_in(gw_rows_k<TB, CT>, GW_SMEM)) return;
    const dim3 grid((unsigned)((N + GW_BN - 1) / GW_BN), (unsigned)((max_rows + GW_BM - 1) / GW_BM + n));
    MT_LAUNCH((gw_rows_k<TB, CT>), grid, GW_THREADS, GW_SMEM)(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta,
                                                             C, ldc);
    MT_CUDA_KCHECK();
}

/* gemm_grouped.cu's entries, their checks done */
void mt_cuda_gw_rows(int transB, int c_bf16, const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N,
                     int K, float alpha, const bf16 *A, int lda, int ldb, float beta, void *C, int ldc)
{
    switch ((transB ? 0 : 1) + 2 * (c_bf16 != 0)) {
    case 0: gw_rows_launch_t<0, float>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (float *)C, ldc); break;
    case 1: gw_rows_launch_t<1, float>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (float *)C, ldc); break;
    case 2: gw_rows_launch_t<0, bf16>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (bf16 *)C, ldc); break;
    default: gw_rows_launch_t<1, bf16>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (bf16 *)C, ldc); break;
    }
}

void mt_cuda_gw_sum(const gg_cptrs &cp, const int32_t *offs, int n, int M, int N, float alpha, const bf16 *A, int lda,
                    const bf16 *B, int ldb, float beta, int ldc)
{
    if (!mt_cuda_smem_opt_in(gw_sum_k, GW_SMEM)) return;
    const dim3 grid((unsigned)((N + GW_BN - 1) / GW_BN), (unsigned)((M + GW_BM - 1) / GW_BM), (unsigned)n);
    MT_LAUNCH(gw_sum_k, grid, GW_THREADS, GW_SMEM)(cp, offs, M, N, alpha, A, lda, B, ldb, beta, ldc);
    MT_CUDA_KCHECK();
}
