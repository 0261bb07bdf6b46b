/*
 * mma_sync.cuh — warp-level tensor-core instructions with the register
 * layouts of the PTX ISA (sm_80+), for kernels that build and read
 * fragments by element (attention_v2.cu): unlike nvcuda::wmma, whose
 * fragment layout CUDA leaves unspecified, these are documented, so a
 * per-row softmax can run on the accumulators in registers.
 *
 *   mt_mma_16816(d, a, b)   d (16x8 f32) += a (16x16 bf16, row) b (16x8 bf16, col)
 *                           mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   mt_ldsm_x4(r, p)        ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   mt_ldsm_x4_t(r, p)      ... .trans
 *   mt_cp_async16(dst, src, n)  cp.async.cg (16 bytes; n = 0 writes zeros);
 *   mt_cp_async_commit(), mt_cp_async_wait<N>()
 *
 * Layouts (lane l: g = l >> 2, t = l % 4; two bf16 per .b32 register, the
 * lower-indexed element in the low half):
 *   A: a0 (row g, cols 2t, 2t+1)  a1 (row g+8, cols 2t, 2t+1)
 *      a2 (row g, cols 2t+8, 2t+9) a3 (row g+8, cols 2t+8, 2t+9)
 *   B: b0 (rows 2t, 2t+1, col g)  b1 (rows 2t+8, 2t+9, col g)
 *   C/D: c0, c1 (row g, cols 2t, 2t+1)  c2, c3 (row g+8, cols 2t, 2t+1)
 *   ldmatrix x4: lanes 8i..8i+7 give the row addresses (16-byte aligned,
 *   shared memory) of 8x8 matrix i; register i = matrix i's (row g, cols
 *   2t, 2t+1), with .trans (rows 2t, 2t+1, col g).
 * Hence: two adjacent n8 accumulator tiles (16x16, fp32) rounded to bf16
 * pairs ARE the A operand of the next product (FlashAttention-2's P V with
 * P never leaving registers); an x4 ldmatrix of a row-major tile gives an A
 * operand (16x16), or the B operands of two n8 tiles (rows = n, non-trans,
 * for products with a transposed tile such as Q K^T; .trans for rows = k,
 * such as P V).
 *
 * Under the CPU emulator (MT_CUDA_EMU) the same calls run
 * tests/cuda/emu/mma_ptx.h: warp collectives with exactly these layouts;
 * cp.async asynchronous as here: a copy lands at its thread's covering wait,
 * its destination NaN until then (a missing wait or barrier shows).
 */
#ifndef MT_MMA_SYNC_CUH
#define MT_MMA_SYNC_CUH

#include <stdint.h>

#ifdef MT_CUDA_EMU
#include <mma_ptx.h>
#endif

/* MT_WARP_STEP: the inlining of a warp's step between two __syncthreads of a
 * loop when some warps skip it (a warp-dependent branch). The step takes the
 * branch inside and is called by every thread, so the caller has no branch
 * there. nvcc treats a barrier as convergent and never copies it; the
 * emulator's host compiler may copy the small block holding the barrier call
 * into both arms of a branch before it, and the emulator, which names a
 * barrier by its call site, then sees warps wait at two sites: under the
 * emulator the step is a real call. */
#ifdef MT_CUDA_EMU
#define MT_WARP_STEP __attribute__((noinline))
#else
#define MT_WARP_STEP __forceinline__
#endif

/* two floats -> a .b32 of two bf16 (round to nearest even), lo in the low half */
static __device__ __forceinline__ uint32_t mt_pack_bf16(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

static __device__ __forceinline__ void mt_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef MT_CUDA_EMU
    mt_emu_mma_16816(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d; (void)a; (void)b;
    __trap();  /* sm_80+ only (the build targets sm_90) */
#endif
}

static __device__ __forceinline__ void mt_ldsm_x4(uint32_t r[4], const void *p)
{
#ifdef MT_CUDA_EMU
    mt_emu_ldmatrix_x4<false>(r, p);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#else
    (void)r; (void)p;
    __trap();
#endif
}

static __device__ __forceinline__ void mt_ldsm_x4_t(uint32_t r[4], const void *p)
{
#ifdef MT_CUDA_EMU
    mt_emu_ldmatrix_x4<true>(r, p);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#else
    (void)r; (void)p;
    __trap();
#endif
}

/* 16 bytes global -> shared, asynchronously; nbytes 16 copies, 0 writes
 * zeros (src is not read then, but must be a valid address) */
static __device__ __forceinline__ void mt_cp_async16(void *dst, const void *src, int nbytes)
{
#ifdef MT_CUDA_EMU
    mt_emu_cp_async16(dst, src, nbytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(nbytes));
#else
    (void)dst; (void)src; (void)nbytes;
    __trap();
#endif
}
static __device__ __forceinline__ void mt_cp_async_commit(void)
{
#ifdef MT_CUDA_EMU
    mt_emu_cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/* wait until at most N committed groups are in flight (this thread's);
 * a __syncthreads after it makes every thread's copies visible */
template <int N>
static __device__ __forceinline__ void mt_cp_async_wait(void)
{
#ifdef MT_CUDA_EMU
    mt_emu_cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

#endif /* MT_MMA_SYNC_CUH */
