/*
 * wgmma_probe.cu — C = A B^T on Hopper's warpgroup MMA (wgmma.cuh): the
 * first kernel built on it, and the check that its layouts are the
 * device's. Not an op of the table: cuda_ops_vs_cpu (group wgmma) compares
 * it with a double-precision product on the device and under the emulator,
 * cuda_calib times it beside cuBLAS (docs/cuda.md "wgmma").
 *
 *   C (M x N, f32, row-major, ldc N) = A (M x K, bf16, row-major) B (N x K, bf16, row-major)^T
 *   M, N multiples of 128, K of 64; A from shared memory (SS) or, a_regs, from
 *   registers (RS: the form an attention kernel's P V takes)
 *
 * Block: 2 warpgroups (256 threads) on a 128 x 128 tile of C, warpgroup w on
 * its rows 64 w .. 64 w + 63. K goes in slices of 64 columns (one 128-byte
 * swizzle row), 3 stages of cp.async in flight; per slice each warpgroup
 * issues 4 wgmma m64n128k16 (k 16 each, descriptors 32 bytes apart), commits
 * them as one group and waits for it before the barrier that frees the
 * stage for refilling. Deterministic: every element's sum runs in one
 * accumulator in k order, no atomics.
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

/* rows row0 .. row0 + 127, columns k0 .. k0 + 63 of src (ld K) into a swizzled tile */
static __device__ __forceinline__ void wp_load(unsigned char *tile, const bf16 *src, int row0, int k0, int K)
{
    for (int i = threadIdx.x; i < 128 * 8; i += WP_THREADS) {
        const int r = i >> 3, c = i & 7;
        mt_cp_async16(tile + mt_wgmma_swz<WP_BM>(r, c), src + (size_t)(row0 + r) * (size_t)K + (size_t)(k0 + 8 * c),
                      16);
    }
}

/* RS 0: both operands from shared memory; 1: A from registers, each warp's 16 x 16 block
 * of a k step loaded by an x4 ldmatrix from the swizzled tile (lanes 8i .. 8i + 7 give
 * matrix i's rows: i & 1 the row half, i >> 1 the column chunk), as an attention kernel's
 * P would come from its accumulators */
template <int RS>
static __global__ void __launch_bounds__(WP_THREADS) wgmma_probe_k(float *C, const bf16 *A, const bf16 *B, int N,
                                                                  int K)
{
    MT_DYN_SMEM(unsigned char, sm_raw);
    unsigned char *As = sm_raw + ((1024u - (mt_smem_u32(sm_raw) & 1023u)) & 1023u);   /* wgmma.cuh */
    unsigned char *Bs = As + WP_STAGES * WP_TILE;
    const int m0 = blockIdx.y * WP_BM, n0 = blockIdx.x * WP_BN, wg = threadIdx.x / 128, nk = K / WP_BK;
    float d[64];
    uint32_t af[WP_BK / 16][4];   /* RS: the A fragments of a slice (read by wgmma until the wait) */
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    for (int s = 0; s < WP_STAGES - 1; s++) {
        if (s < nk) {
            wp_load(As + s * WP_TILE, A, m0, s * WP_BK, K);
            wp_load(Bs + s * WP_TILE, B, n0, s * WP_BK, K);
        }
        mt_cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        mt_cp_async_wait<WP_STAGES - 2>();   /* slice kt landed (this thread's copies) */
        mt_fence_proxy_async();               /* ... visible to wgmma, after the barrier */
        __syncthreads();                      /* every thread's copies; slice kt - 1's wgmmas done */
        const int nx = kt + WP_STAGES - 1;    /* into the stage slice kt - 1 used */
        if (nx < nk) {
            wp_load(As + (nx % WP_STAGES) * WP_TILE, A, m0, nx * WP_BK, K);
            wp_load(Bs + (nx % WP_STAGES) * WP_TILE, B, n0, nx * WP_BK, K);
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
            if constexpr (RS) mt_wgmma_128_rs(d, af[kk], mt_wgmma_desc_sw128(b + 32 * kk), 1);
            else mt_wgmma_128_ss(d, mt_wgmma_desc_sw128(a + 32 * kk), mt_wgmma_desc_sw128(b + 32 * kk), 1);
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

/* On the bound instance's stream (ops_cuda.cu mt_ops_cuda_wgmma_probe_of). */
enum mt_status mt_cuda_wgmma_probe(float *C, const void *A, const void *B, int M, int N, int K, int a_regs)
{
    if (M <= 0 || N <= 0 || K <= 0 || M % WP_BM || N % WP_BN || K % WP_BK || M / WP_BM > 65535)
        return MT_ERR_INVALID_ARG;
    if (!mt_cuda_wgmma_available()) return MT_ERR_UNSUPPORTED;
    void (*k)(float *, const bf16 *, const bf16 *, int, int) = a_regs ? wgmma_probe_k<1> : wgmma_probe_k<0>;
    if (!mt_cuda_smem_opt_in(k, WP_SMEM)) return MT_ERR_RUNTIME;
    if (a_regs) MT_LAUNCH(wgmma_probe_k<1>, dim3(N / WP_BN, M / WP_BM), WP_THREADS, WP_SMEM)
                    (C, (const bf16 *)A, (const bf16 *)B, N, K);
    else MT_LAUNCH(wgmma_probe_k<0>, dim3(N / WP_BN, M / WP_BM), WP_THREADS, WP_SMEM)
             (C, (const bf16 *)A, (const bf16 *)B, N, K);
    MT_CUDA_KCHECK();
    return MT_OK;
}
