/*
 * wgmma.cuh — Hopper's warpgroup-level tensor-core instructions (sm_90a),
 * with the operand layouts of the PTX ISA, for kernels that keep their
 * tiles in shared memory and their accumulators in registers (the dense
 * peak: mma.sync reaches about two thirds of it, docs/cuda.md "v2").
 *
 *   mt_wgmma_fence()          wgmma.fence: before the first wgmma that reads
 *                             accumulators the thread wrote by other instructions
 *   mt_wgmma_fence_operand<N>(d)  keeps plain accesses to N accumulators (float) or
 *                             register-A words (uint32_t) on their side of a fence or
 *                             a wait (the compiler may move them)
 *   mt_fence_proxy_async()    fence.proxy.async.shared::cta: shared memory written
 *                             by plain stores or cp.async becomes visible to wgmma
 *                             (the async proxy); then a barrier
 *   mt_wgmma_commit()         wgmma.commit_group: the wgmmas issued so far form a group
 *   mt_wgmma_wait<N>()        wgmma.wait_group N: all but the N most recent groups
 *                             are done; their accumulators may be read or written,
 *                             the shared memory they read may be refilled
 *   mt_wgmma_desc_sw128(p)    the shared-memory matrix descriptor of a K-major bf16
 *                             tile at p in the 128-byte swizzle (below)
 *   mt_wgmma_128_ss(d, da, db, acc)
 *                             D (64 x 128, f32) = A (64 x 16, bf16) B (128 x 16, bf16)^T
 *                             (+ D when acc): wgmma.mma_async.sync.aligned.m64n128k16
 *                             .f32.bf16.bf16, both operands K-major from shared memory;
 *                             mt_wgmma_128_ss<TA, TB>: A (TA 1) or B (TB 1) MN-major
 *                             (imm-trans; mt_wgmma_desc_sw128_mn, below); the _rs forms
 *                             take TB alike (A from registers has no transpose)
 *   mt_wgmma_64_ss, mt_wgmma_64_rs  the same at N = 64 (32 accumulators); mt_wgmma_ss<N>,
 *                             mt_wgmma_rs<N> choose by N
 *   mt_wgmma_128_rs(d, a, db, acc)
 *                             the same with A from registers: a[4] (.b32, two bf16 each)
 *                             in mma.sync's m16n8k16 A layout on the warp's 16 rows
 *                             (mma_sync.cuh: an x4 ldmatrix of the 16 x 16 block, or two
 *                             n8 accumulator tiles packed: FlashAttention's P V)
 *
 * A warpgroup is 4 consecutive warps (threads 128 w .. 128 w + 127); every
 * one of its threads issues each instruction with the same descriptors.
 *
 * Accumulator layout (m64nNk16, f32; warp q = 0..3 of the warpgroup, lane
 * l: g = l >> 2, t = l % 4): d[4 j + e] is D[16 q + g + 8 (e >> 1)][8 j + 2 t
 * + (e & 1)], j = 0 .. N/8 - 1: mma.sync's m16n8 C fragment, one per n8
 * column tile, the warp on its 16 rows.
 *
 * Shared tiles, K-major, 128-byte swizzle: rows of 64 bf16 (128 bytes); 8
 * rows make a 1024-byte atom, 1024-byte aligned; atoms of consecutive 8-row
 * groups 1024 bytes apart (the descriptor's stride byte offset). Inside an
 * atom row r holds its 16-byte chunk c (elements 8c .. 8c + 7) at chunk
 * position c ^ r:
 *     byte(row, k) = (row / 8) 1024 + (row % 8) 128 + ((k / 8) ^ (row % 8)) 16 + (k % 8) 2
 * The k-th 16-column slice of a 64-column tile is the descriptor of the
 * tile's address plus 32 k bytes: the hardware applies the swizzle to the
 * address bits (bits 4-6 ^= bits 7-9), hence the alignment.
 *
 * Descriptor (64 bits): start address >> 4 (bits 0-13), leading byte offset
 * >> 4 (16-29; unused for a swizzled K-major tile, 1 by convention), stride
 * byte offset >> 4 (32-45: 1024), base offset 0 (49-51), swizzle mode 1 =
 * 128 bytes (62-63).
 *
 * Under the CPU emulator (MT_CUDA_EMU) the same calls run
 * tests/cuda/emu/mma_ptx.h: a warpgroup collective that reads the tiles
 * through the descriptor exactly as above (other modes abort), and that is
 * asynchronous as on the device: an accumulator reads NaN from the issue
 * until a covering mt_wgmma_wait, so a missing wait shows.
 */
#ifndef MT_WGMMA_CUH
#define MT_WGMMA_CUH

#include <stdint.h>

#include <type_traits>

#include "mma_sync.cuh"

/* sm_90a's arch-specific instructions are compiled in (cmake/cuda.cmake builds
 * for 90a and then defines MT_CUDA_SM90A for the host side: mt_cuda_wgmma_available);
 * elsewhere each call traps */
#if defined(MT_CUDA_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_WGMMA_ON 1
#else
#define MT_WGMMA_ON 0
#endif

/* the shared-window address of p (32 bits); under the emulator its offset in
 * the block's dynamic shared memory */
static __device__ __forceinline__ uint32_t mt_smem_u32(const void *p)
{
#ifdef MT_CUDA_EMU
    return mt_emu_smem_offset(p);
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

/* a kernel's first atom goes at the dynamic area's next 1024-byte boundary of the
 * shared window: p + ((1024 - (mt_smem_u32(p) & 1023)) & 1023), written out in the
 * kernel (as a helper function it cost attention_wg.cu's hd-64 kernel 42 registers
 * under ptxas 13); the area asks for MT_WGMMA_ALIGN_SLACK bytes more */
#define MT_WGMMA_ALIGN_SLACK 1024

/* byte offset of 16-byte chunk c8 (columns 8 c8 .. 8 c8 + 7) of row r in a K-major
 * swizzled tile of R rows; wider than 64 columns, each 64-column half is its own
 * R-row tile, R 128 bytes after the one before */
template <int R>
static __device__ __forceinline__ uint32_t mt_wgmma_swz(int r, int c8)
{
    return (uint32_t)((c8 >> 3) * (R * 128) + (r >> 3) * 1024 + (r & 7) * 128 + (((c8 & 7) ^ (r & 7)) << 4));
}

static __device__ __forceinline__ uint64_t mt_wgmma_desc_sw128(const void *p)
{
    return (uint64_t)((mt_smem_u32(p) & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* The MN-major form (the instruction's imm-trans: B as (K, N) rows of N, or A as
 * (K, M) rows of M, with no transpose): a tile stored as mt_wgmma_swz<R>(k, c8)
 * with k the row (R k rows) and c8 the MN chunk: a k's 64 MN elements in one
 * 128-byte line, 8 k an atom, 8-k groups 1024 bytes apart (the stride byte
 * offset), 64-element MN blocks R 128 bytes apart (the leading byte offset, lbo).
 * The k-th 16-k slice is the tile's address plus 2048 k bytes: every start is an
 * atom (PTX ISA "Shared Memory Matrix Layout"; CUTLASS's canonical
 * Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) with T 8 bf16) */
static __device__ __forceinline__ uint64_t mt_wgmma_desc_sw128_mn(const void *p, uint32_t lbo)
{
    return (uint64_t)((mt_smem_u32(p) & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* this thread's warpgroup in the block (threadIdx.x / 128) as ptxas can see to be the
 * same across the warp (a shuffle from lane 0): a branch on it around wgmma is then
 * known to be uniform. Computed from threadIdx.x plainly, the branch counts as
 * divergent and ptxas serializes every wgmma of the kernel (C7518, "compiler-inserted
 * WG.DP in divergent path": each waits for the one before it) — CUTLASS's
 * canonical_warp_group_idx does the same */
static __device__ __forceinline__ int mt_wgmma_group(void)
{
#ifdef MT_CUDA_EMU
    return (int)(threadIdx.x / 128);   /* the same value; a shuffle here is a fiber switch that moved the host
                                          compiler's barriers into both arms of branches (a divergence abort) */
#else
    return __shfl_sync(MT_FULL_MASK, (int)(threadIdx.x / 128), 0);
#endif
}

/* N registers at d pinned in program order (CUTLASS's warpgroup_fence_operand):
 * an empty asm that reads and writes each, so the compiler keeps the plain writes
 * before it (zeroing, the online softmax's rescale of O) ahead of the wgmma.fence
 * that follows, and the reads after a wait behind it. Without it nvcc moved 63 of
 * v4 forward's 64 `O *= alpha` products past the fence and the next S's issue
 * (register access there is undefined, PTX ISA); ptxas repaired it by injecting a
 * warpgroup.arrive (C7519) before the P V wgmmas. T float: accumulators; T
 * uint32_t: a register-A fragment (P, dS packed as bf16 pairs), written before the
 * fence and read by the wgmma until its wait (FlashAttention-3 pins them too).
 * Nothing under the emulator (program order). */
template <int N, typename T>
static __device__ __forceinline__ void mt_wgmma_fence_operand(T *d)
{
    static_assert(std::is_same<T, float>::value || std::is_same<T, uint32_t>::value, "float or uint32_t registers");
#if defined(MT_CUDA_EMU)
    (void)d;
#else
#pragma unroll
    for (int i = 0; i < N; i++) {
        if constexpr (std::is_same<T, float>::value) asm volatile("" : "+f"(d[i])::"memory");
        else asm volatile("" : "+r"(d[i])::"memory");
    }
#endif
}

static __device__ __forceinline__ void mt_wgmma_fence(void)
{
#if defined(MT_CUDA_EMU)
#elif MT_WGMMA_ON
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mt_fence_proxy_async(void)
{
#if defined(MT_CUDA_EMU)
#elif MT_WGMMA_ON
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mt_wgmma_commit(void)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_commit();
#elif MT_WGMMA_ON
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

template <int N>
static __device__ __forceinline__ void mt_wgmma_wait(void)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_wait(N);
#elif MT_WGMMA_ON
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    __trap();
#endif
}

/* the 64 accumulator operands of an n128 instruction */
#define MT_WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

template <int TA = 0, int TB = 0>
static __device__ __forceinline__ void mt_wgmma_128_ss(float d[64], uint64_t da, uint64_t db, int acc)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_ss(d, 128, da, db, acc, TA, TB);
#elif MT_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n}\n"
        : MT_WG_D8(0), MT_WG_D8(8), MT_WG_D8(16), MT_WG_D8(24), MT_WG_D8(32), MT_WG_D8(40), MT_WG_D8(48),
          MT_WG_D8(56)
        : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
#else
    (void)d; (void)da; (void)db; (void)acc;
    __trap();
#endif
}
/* A from registers: the warp's 16 rows x 16 k (wgmma's register A fragment for
 * m64nNk16 bf16 is mma.m16n8k16's on rows 16 q .. 16 q + 15 of warp q) */
template <int TB = 0>
static __device__ __forceinline__ void mt_wgmma_128_rs(float d[64], const uint32_t a[4], uint64_t db, int acc)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_rs(d, 128, a, db, acc, TB);
#elif MT_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : MT_WG_D8(0), MT_WG_D8(8), MT_WG_D8(16), MT_WG_D8(24), MT_WG_D8(32), MT_WG_D8(40), MT_WG_D8(48),
          MT_WG_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
#else
    (void)d; (void)a; (void)db; (void)acc;
    __trap();
#endif
}
/* N = 64 (32 accumulators): attention's S = Q K^T on a 64-key tile (SS) and, at head
 * dim 64, its P V (RS) */
static __device__ __forceinline__ void mt_wgmma_64_ss(float d[32], uint64_t da, uint64_t db, int acc)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_ss(d, 64, da, db, acc, 0, 0);
#elif MT_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : MT_WG_D8(0), MT_WG_D8(8), MT_WG_D8(16), MT_WG_D8(24)
        : "l"(da), "l"(db), "r"(acc));
#else
    (void)d; (void)da; (void)db; (void)acc;
    __trap();
#endif
}

template <int TB = 0>
static __device__ __forceinline__ void mt_wgmma_64_rs(float d[32], const uint32_t a[4], uint64_t db, int acc)
{
#if defined(MT_CUDA_EMU)
    mt_emu_wgmma_rs(d, 64, a, db, acc, TB);
#elif MT_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : MT_WG_D8(0), MT_WG_D8(8), MT_WG_D8(16), MT_WG_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
#else
    (void)d; (void)a; (void)db; (void)acc;
    __trap();
#endif
}

/* by N: mt_wgmma_ss<N>, mt_wgmma_rs<N, TB> (N 64 or 128; TB 1: B MN-major) */
template <int N>
static __device__ __forceinline__ void mt_wgmma_ss(float *d, uint64_t da, uint64_t db, int acc)
{
    static_assert(N == 64 || N == 128, "wgmma: n64 or n128");
    if constexpr (N == 64) mt_wgmma_64_ss(d, da, db, acc);
    else mt_wgmma_128_ss(d, da, db, acc);
}
template <int N, int TB = 0>
static __device__ __forceinline__ void mt_wgmma_rs(float *d, const uint32_t a[4], uint64_t db, int acc)
{
    static_assert(N == 64 || N == 128, "wgmma: n64 or n128");
    if constexpr (N == 64) mt_wgmma_64_rs<TB>(d, a, db, acc);
    else mt_wgmma_128_rs<TB>(d, a, db, acc);
}
#undef MT_WG_D8

#endif /* MT_WGMMA_CUH */
