/*
 * gemm_grouped_wg.cu — gemm_grouped_rows with transB (the MoE experts'
 * forward, y_g = x_g W_g^T: gate|up and down) on Hopper's warpgroup MMA
 * (wgmma.cuh), knob grouped_gemm_kernel=wgmma (docs/cuda.md "Grouped GEMMs
 * on wgmma"). The contract, the groups and the grid are gemm_grouped.cu's;
 * only the block's product differs:
 *
 *   C[r, n0 .. n0+255] = alpha A[r, :] B_g[n0 .. n0+255, :]^T (+ beta C), r in the tile's rows of group g
 *
 * Both operands are K-major (A rows of K, B_g rows of K), wgmma's native
 * form: no transpose, no ldmatrix. A block is 2 warpgroups on a 128 x 256
 * tile, warpgroup w on rows 64 w .. 64 w + 63, its 64 x 256 as two m64n128
 * accumulators (128 fp32 registers a thread). K runs in slices of 64 (one
 * 128-byte swizzle row), each slice per warpgroup 4 k16 steps x 2 halves =
 * 8 wgmma m64n128k16, both operands from shared memory (A: 128 rows, 16 KiB;
 * B: 256 rows, 32 KiB, its halves 16 KiB apart), committed as one group.
 * The pipeline (4 stages, 193 KiB): slices kt + 1 and kt + 2 in flight by
 * cp.async while slice kt's wgmmas run, with slice kt - 1's still running
 * (wait_group 1 after each commit); the stage refilled at step kt is slice
 * kt - 2's, which every warpgroup's wait of step kt - 1 retired before the
 * step's barrier. One barrier a slice.
 * Rows past the group, columns past N and k past K are zero-filled by
 * cp.async (source size 0; N, K multiples of 8: a 16-byte chunk is all in or
 * all out) and masked at the store. Deterministic: each output element is one
 * thread's accumulator, k slices in order, no atomics; the sum's order
 * within a k16 step is the tensor core's (the mma.sync kernel's bits are not
 * promised, the fp32 bound of the harness is).
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

/* rows row0 .. row0 + R - 1 (those below `end`), columns k0 .. k0 + 63 (those below K) of src (ld) into a
 * swizzled R-row tile, asynchronously; the rest zero-filled (R 8 / 256 chunks a thread) */
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

template <typename CT>
static __global__ void __launch_bounds__(GW_THREADS, 1)
gw_rows_k(gg_bptrs Bp, const int32_t *offs, int n, int max_rows, int N, int K, float alpha, const bf16 *A, int lda,
          int ldb, float beta, CT *C, int ldc)
{
    __shared__ int so[MT_GROUPED_DEV_MAX + 1];
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *S = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* 1024-aligned (wgmma.cuh) */
    gg_offs_clamped(so, offs, n, max_rows);
    __syncthreads();
    int g = 0, r0 = 0, r1 = 0;   /* this block's group and rows [r0, r1) (gemm_grouped.cuh) */
    if (!gg_block_rows(so, n, GW_BM, &g, &r0, &r1)) return;   /* past the last tile: the whole block */
    const bf16 *Bg = Bp.p[g];
    const int tid = threadIdx.x, n0 = blockIdx.x * GW_BN, nk = (K + GW_BK - 1) / GW_BK;

    /* slice kt into stage st: A's 128 rows x 8 chunks (4 a thread), B's 256 x 8 (8 a thread) */
    auto load = [&](int st, int kt) {
        unsigned char *As = S + st * GW_STAGE;
        gw_load<GW_BM>(As, A, lda, r0, r1, kt * GW_BK, K);
        gw_load<GW_BN>(As + GW_TILE_A, Bg, ldb, n0, N, kt * GW_BK, K);
    };

    const int wg = mt_wgmma_group();
    float acc[2][64];   /* columns 0-127 and 128-255 of the warpgroup's 64 rows */
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
        const unsigned char *b = S + (kt % GW_STAGES) * GW_STAGE + GW_TILE_A;   /* B: 256 rows of 128 bytes */
        const unsigned char *a = b - GW_TILE_A + wg * (64 * 128);                /* A: this warpgroup's 64 rows */
        mt_wgmma_fence_operand<64>(acc[0]);
        mt_wgmma_fence_operand<64>(acc[1]);
        mt_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GW_BK / 16; kk++) {
            const uint64_t da = mt_wgmma_desc_sw128(a + 32 * kk);
            mt_wgmma_128_ss(acc[0], da, mt_wgmma_desc_sw128(b + 32 * kk), 1);
            mt_wgmma_128_ss(acc[1], da, mt_wgmma_desc_sw128(b + GW_BN / 2 * 128 + 32 * kk), 1);
        }
        mt_wgmma_commit();
        mt_wgmma_wait<1>();       /* slice kt - 1's group retired (kt's may run on) */
    }
    mt_wgmma_wait<0>();
    mt_wgmma_fence_operand<64>(acc[0]);
    mt_wgmma_fence_operand<64>(acc[1]);

    /* epilogue: acc[h][4 j + e] is row 16 q + lr + 8 (e >> 1) of the warpgroup's 64,
     * column 128 h + 8 j + 2 t + (e & 1) */
    const int q = (tid % 128) / MT_WARP, lane = tid % MT_WARP, lr = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        const int r = r0 + 64 * wg + 16 * q + lr + 8 * e2;
        if (r >= r1) continue;
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

template <typename CT>
static void gw_rows_launch_t(const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N, int K, float alpha,
                             const bf16 *A, int lda, int ldb, float beta, CT *C, int ldc)
{
    if (!mt_cuda_smem_opt_in(gw_rows_k<CT>, GW_SMEM)) return;
    const dim3 grid((unsigned)((N + GW_BN - 1) / GW_BN), (unsigned)((max_rows + GW_BM - 1) / GW_BM + n));
    MT_LAUNCH(gw_rows_k<CT>, grid, GW_THREADS, GW_SMEM)(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, C, ldc);
    MT_CUDA_KCHECK();
}

/* gemm_grouped.cu's entry, its checks done: the transB product on wgmma */
void mt_cuda_gw_rows(int c_bf16, const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N, int K,
                     float alpha, const bf16 *A, int lda, int ldb, float beta, void *C, int ldc)
{
    if (c_bf16) gw_rows_launch_t<bf16>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (bf16 *)C, ldc);
    else gw_rows_launch_t<float>(bp, offs, n, max_rows, N, K, alpha, A, lda, ldb, beta, (float *)C, ldc);
}
