/*
 * gemm_grouped.cuh — what the grouped GEMM kernels share (gemm_grouped.cu's
 * mma.sync kernels and gemm_grouped_wg.cu's wgmma ones): the B_g / C_g pointer
 * structs a launch passes by value, the block-to-(group, rows) walk of the
 * rows kernels' grid, the epilogue's two-column store.
 */
#ifndef MT_GEMM_GROUPED_CUH
#define MT_GEMM_GROUPED_CUH

#include "cuda_impl.cuh"

struct gg_bptrs { const __nv_bfloat16 *p[MT_GROUPED_DEV_MAX]; };
struct gg_cptrs { float *p[MT_GROUPED_DEV_MAX]; };
struct alignas(8) gg_f2 { float x, y; };

/* The rows kernels' grid is (column tiles, ceil(max_rows / BM) + n): group g
 * needs ceil(rows_g / BM) row tiles, at most rows_g / BM + 1 when rows_g > 0,
 * so the sum over groups is at most offs[n] / BM + n. The block fills so[] (the
 * kernel's shared n + 1 ints) with offs clamped to [0, max_rows] (threads 0 ..
 * n), then a barrier; then its y-th row tile, groups in order: its group g and
 * rows [r0, r1); 0 when the block is past the last tile (the grid is an upper
 * bound). Every thread of the block calls it (the barrier). */
static __device__ __forceinline__ int gg_block_rows(int *so, const int32_t *offs, int n, int max_rows, int BM, int *g,
                                                    int *r0, int *r1)
{
    if ((int)threadIdx.x <= n) {
        const int o = offs[threadIdx.x];
        so[threadIdx.x] = o < 0 ? 0 : o > max_rows ? max_rows : o;
    }
    __syncthreads();
    int y = blockIdx.y;
    for (int k = 0; k < n; k++) {
        const int lo = so[k], hi = so[k + 1] > lo ? so[k + 1] : lo, t = (hi - lo + BM - 1) / BM;
        if (y < t) {
            *g = k;
            *r0 = lo + y * BM;
            *r1 = hi;
            return 1;
        }
        y -= t;
    }
    return 0;
}

/* c[0], c[1] = v0, v1 (alpha applied) + beta c (fp32; beta 0: c not read), or bf16 RNE (beta 0, host-checked) */
static __device__ __forceinline__ void gg_store2(float *c, float v0, float v1, float beta)
{
    if (beta != 0.0f) {
        const gg_f2 o = *(const gg_f2 *)c;
        v0 = fmaf(beta, o.x, v0);
        v1 = fmaf(beta, o.y, v1);
    }
    *(gg_f2 *)c = gg_f2{v0, v1};
}
static __device__ __forceinline__ void gg_store2(__nv_bfloat16 *c, float v0, float v1, float beta)
{
    (void)beta;
    *(uint32_t *)c = mt_pack_bf16x2(v0, v1);
}

/* gemm_grouped_wg.cu: the rows and sum products on wgmma (knob grouped_gemm_kernel=wgmma), their checks done */
void mt_cuda_gw_rows(int transB, int c_bf16, const gg_bptrs &bp, const int32_t *offs, int n, int max_rows, int N,
                     int K, float alpha, const __nv_bfloat16 *A, int lda, int ldb, float beta, void *C, int ldc);
void mt_cuda_gw_sum(const gg_cptrs &cp, const int32_t *offs, int n, int M, int N, float alpha,
                    const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta, int ldc);

#endif
