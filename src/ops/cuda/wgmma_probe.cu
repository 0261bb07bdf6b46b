/*
 * wgmma_probe.cu — C = A B^T on Hopper's warpgroup MMA (wgmma.cuh): the
 * first kernel built on it, and the check that its layouts are the
 * device's. Not an op of the table: cuda_ops_vs_cpu (group wgmma) compares
 * it with a double-precision product on the device and under the emulator,
 * cuda_calib times it beside cuBLAS (docs/cuda.md "wgmma").
 *
 *   C (M x N, f32, row-major, ldc N) = A B^T, C[m][n] = sum_k A(m, k) B(n, k), with
 *   A(m, k) = A[m K + k] (K-major: M x K row-major) or, MT_WGMMA_PROBE_A_MN,
 *   A[k M + m] (MN-major: K x M row-major), and B(n, k) = B[n K + k] or,
 *   MT_WGMMA_PROBE_B_MN, B[k N + n]; M, N multiples of 128, K of 64; A from
 *   shared memory (SS) or, MT_WGMMA_PROBE_A_REGS, from registers (RS: the form
 *   an attention kernel's P V takes; K-major A only)
 *
 * The MN-major forms read their tiles through the instruction's imm-trans
 * (mt_wgmma_desc_sw128_mn): the layout the grouped kernels' backward
 * (gemm_grouped_wg.cu) and attention v5 stand on, alone here, so that a wrong
 * leading byte offset or slice step shows in one line with nothing else
 * around it (B at N 128 spans two 64-element MN blocks: its LBO is used).
 *
 * Block: 2 warpgroups (256 threads) on a 128 x 128 tile of C, warpgroup w on
 * its rows 64 w .. 64 w + 63. K goes in slices of 64 (one 128-byte swizzle
 * row), 3 stages of cp.async in flight; per slice each warpgroup issues 4
 * wgmma m64n128k16 (k 16 each: K-major descriptors 32 bytes apart, MN-major
 * 2048), commits them as one group and waits for it before the barrier that
 * frees the stage for refilling. Deterministic: every element's sum runs in
 * one accumulator in k order, no atomics.
 */
#include "cuda_impl.cuh"
#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define WP_BM 128
#define WP_BN 128
#define WP_BK 64
#define WP_STAGES 3
#define WP_THREADS 256
#define WP_TILE (WP_BM * WP_BK * 2)                  /* bytes of an A or B stage: 16 KiB (BM = BN) */
#define WP_SMEM (WP_STAGES * 2 * WP_TILE + MT_WGMMA_ALIGN_SLACK)

/* K-major (MN 0): rows row0 .. row0 + 127, columns k0 .. k0 + 63 of src (ld K) into a
 * swizzled tile; MN-major (1): k rows k0 .. k0 + 63, columns row0 .. row0 + 127 of src
 * (ld: the MN extent) into mt_wgmma_swz<64>(k, chunk), its two 64-column blocks
 * WP_MN_LBO apart. Either way the tile is 16 KiB and warpgroup w's 64 rows (or
 * columns) are the 8 KiB at 8192 w. */
#define WP_MN_LBO (WP_BK * 128)
template <int MN>
static __device__ __forceinline__ void wp_load(unsigned char *tile, const bf16 *src, int row0, int k0, int ld)
{
    for (int i = threadIdx.x; i < 128 * 8; i += WP_THREADS) {
        if constexpr (MN) {
            const int k = i >> 4, c = i & 15;
            const bf16 *g = src + (size_t)(k0 + k) * (size_t)ld + (size_t)(row0 + 8 * c);
            mt_cp_async16(tile + mt_wgmma_swz<WP_BK>(k, c), g, 16);
        } else {
            const int r = i >> 3, c = i & 7;
            const bf16 *g = src + (size_t)(row0 + r) * (size_t)ld + (size_t)(k0 + 8 * c);
            mt_cp_async16(tile + mt_wgmma_swz<WP_BM>(r, c), g, 16);
        }
    }
}

/* an operand's descriptor for k16 slice kk of the 64-k tile at p */
template <int MN>
static __device__ __forceinline__ uint64_t wp_desc(const unsigned char *p, int kk)
{
    return MN ? mt_wgmma_desc_sw128_mn(p + 2048 * kk, WP_MN_LBO) : mt_wgmma_desc_sw128(p + 32 * kk);
}

/* RS 0: both operands from shared memory; 1: A from registers, each warp's 16 x 16 block
 * of a k step loaded by an x4 ldmatrix from the swizzled tile (lanes 8i .. 8i + 7 give
 * matrix i's rows: i & 1 the row half, i >> 1 the column chunk), as an attention kernel's
 * P would come from its accumulators */
template <int RS, int TA, int TB>
static __global__ void __launch_bounds__(WP_THREADS) wgmma_probe_k(float *C, const bf16 *A, const bf16 *B, int M,
                                                                  int N, int K)
{
    static_assert(!(RS && TA), "A from registers is K-major (ldmatrix from a K-major tile)");
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *As = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* wgmma.cuh */
    unsigned char *Bs = As + WP_STAGES * WP_TILE;
    const int m0 = blockIdx.y * WP_BM, n0 = blockIdx.x * WP_BN, wg = threadIdx.x / 128, nk = K / WP_BK;
    float d[64];
    uint32_t af[WP_BK / 16][4];   /* RS: the A fragments of a slice (read by wgmma until the wait) */
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    for (int s = 0; s < WP_STAGES - 1; s++) {
        if (s < nk) {
            wp_load<TA>(As + s * WP_TILE, A, m0, s * WP_BK, TA ? M : K);
            wp_load<TB>(Bs + s * WP_TILE, B, n0, s * WP_BK, TB ? N : K);
        }
        mt_cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        mt_cp_async_wait<WP_STAGES - 2>();   /* slice kt landed (this thread's copies) */
        mt_fence_proxy_async();               /* ... visible to wgmma, after the barrier */
        __syncthreads();                      /* every thread's copies; slice kt - 1's wgmmas done */
        const int nx = kt + WP_STAGES - 1;    /* into the stage slice kt - 1 used */
        if (nx < nk) {
            wp_load<TA>(As + (nx % WP_STAGES) * WP_TILE, A, m0, nx * WP_BK, TA ? M : K);
            wp_load<TB>(Bs + (nx % WP_STAGES) * WP_TILE, B, n0, nx * WP_BK, TB ? N : K);
        }
        mt_cp_async_commit();
        const unsigned char *a = As + (kt % WP_STAGES) * WP_TILE + wg * 8192, *b = Bs + (kt % WP_STAGES) * WP_TILE;
        if constexpr (RS) {
            const int lane = threadIdx.x % MT_WARP, i = lane >> 3, r = 16 * ((threadIdx.x % 128) / MT_WARP) +
                                                                       (lane & 7) + 8 * (i & 1);
#pragma unroll
            for (int kk = 0; kk < WP_BK / 16; kk++) mt_ldsm_x4(af[kk], a + mt_wgmma_swz<WP_BM>(r, 2 * kk + (i >> 1)));
        }
        mt_wgmma_fence();   /* after the A registers' loads: wgmma reads them */
#pragma unroll
        for (int kk = 0; kk < WP_BK / 16; kk++) {
            if constexpr (RS) mt_wgmma_128_rs<TB>(d, af[kk], wp_desc<TB>(b, kk), 1);
            else mt_wgmma_128_ss<TA, TB>(d, wp_desc<TA>(a, kk), wp_desc<TB>(b, kk), 1);
        }
        mt_wgmma_commit();
        mt_wgmma_wait<0>();
    }
    const int q = (threadIdx.x % 128) / MT_WARP, lane = threadIdx.x % MT_WARP, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const size_t row = (size_t)(m0 + 64 * wg + 16 * q + g + 8 * h), col = (size_t)(n0 + 8 * j + 2 * t);
            *(float2 *)(C + row * (size_t)N + col) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        }
}

/* wgmma runs here: the build has sm_90a device code (cmake/cuda.cmake: MT_CUDA_SM90A)
 * and the bound instance's device is sm_90 (the only one that code runs on) */
int mt_cuda_wgmma_available(void)
{
#if defined(MT_CUDA_EMU)
    return 1;
#elif defined(MT_CUDA_SM90A)
    return mt_cuda_be->info.cc_major == 9 && mt_cuda_be->info.cc_minor == 0;
#else
    return 0;
#endif
}

template <int RS, int TA, int TB>
static enum mt_status wp_launch(float *C, const bf16 *A, const bf16 *B, int M, int N, int K)
{
    void (*k)(float *, const bf16 *, const bf16 *, int, int, int) = wgmma_probe_k<RS, TA, TB>;
    if (!mt_cuda_smem_opt_in(k, WP_SMEM)) return MT_ERR_RUNTIME;
    MT_LAUNCH((wgmma_probe_k<RS, TA, TB>), dim3(N / WP_BN, M / WP_BM), WP_THREADS, WP_SMEM)(C, A, B, M, N, K);
    MT_CUDA_KCHECK();
    return MT_OK;
}

/* On the bound instance's stream (ops_cuda.cu mt_ops_cuda_wgmma_probe_of); form:
 * MT_WGMMA_PROBE_* bits (A from registers is K-major: with A_MN refused) */
enum mt_status mt_cuda_wgmma_probe(float *C, const void *A, const void *B, int M, int N, int K, int form)
{
    if (M <= 0 || N <= 0 || K <= 0 || M % WP_BM || N % WP_BN || K % WP_BK || M / WP_BM > 65535 ||
        (form & ~(MT_WGMMA_PROBE_A_REGS | MT_WGMMA_PROBE_A_MN | MT_WGMMA_PROBE_B_MN)) ||
        ((form & MT_WGMMA_PROBE_A_REGS) && (form & MT_WGMMA_PROBE_A_MN)))
        return MT_ERR_INVALID_ARG;
    if (!mt_cuda_wgmma_available()) return MT_ERR_UNSUPPORTED;
    const bf16 *a = (const bf16 *)A, *b = (const bf16 *)B;
    switch (form) {
    case 0:                                                  return wp_launch<0, 0, 0>(C, a, b, M, N, K);
    case MT_WGMMA_PROBE_A_REGS:                              return wp_launch<1, 0, 0>(C, a, b, M, N, K);
    case MT_WGMMA_PROBE_B_MN:                                return wp_launch<0, 0, 1>(C, a, b, M, N, K);
    case MT_WGMMA_PROBE_A_REGS | MT_WGMMA_PROBE_B_MN:        return wp_launch<1, 0, 1>(C, a, b, M, N, K);
    case MT_WGMMA_PROBE_A_MN:                                return wp_launch<0, 1, 0>(C, a, b, M, N, K);
    default: /* A_MN | B_MN */                               return wp_launch<0, 1, 1>(C, a, b, M, N, K);
    }
}
