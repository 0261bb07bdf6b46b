/*
 * swiglu.cu — SwiGLU: out = silu(g) * u, elementwise over n = N*F values.
 *
 *   silu(x) = x s, s = sigmoid(x) = 1 / (1 + exp(-x));  silu'(x) = s + x s (1 - s)
 *   backward: dg = dout * u * silu'(g),  du = dout * silu(g)   (both =)
 *
 * Invariant: one thread per element reads gate, up (and dout) before it
 * writes, so dgate/dup may alias gate/up (the vector path: one thread per
 * 4 elements, all read before any is written).
 */
#include "cuda_impl.cuh"

#define THREADS 256

/* one element of each direction: the expressions every path uses (same bits) */
static __device__ __forceinline__ float swiglu1(float g, float u)
{
    float s = 1.0f / (1.0f + expf(-g));
    return g * s * u;
}
/* returns act = silu * u = (g s) u: swiglu1's product in its order (same s,
 * same two roundings: its bits); a caller that drops it costs nothing */
static __device__ __forceinline__ float swiglu1_bwd(float &dg, float &du, float d, float g, float u)
{
    float s = 1.0f / (1.0f + expf(-g));
    float silu = g * s;
    dg = d * u * (s + silu * (1.0f - s));
    du = d * silu;
    return silu * u;
}

/* gate, up (and dout) as stored: fp32, or bf16 (the *_bf16_gu / _gud entries),
 * widened exactly by mt_ld4 (4 elements: 16 / 8 bytes) and mt_ld1 */

/* Vector path (docs/cuda.md "Vectorised elementwise kernels"): elements
 * [0, 4*n4) as float4 (n4 = 0 when a pointer is not 16-byte aligned, or the
 * twin 8-byte), then the scalar tail [4*n4, n). ob: NULL, or the bf16 twin
 * of out written by the same thread (precision=bf16); out: NULL when only
 * the twin is wanted (swiglu_forward_bf16, mt_ops.h), its store skipped.
 * I: gate and up's element type (float; bf16: swiglu_forward_bf16_gu). */
template <typename I>
static __global__ void swiglu_fwd_k(float *out, __nv_bfloat16 *ob, const I *gate, const I *up, size_t n4, size_t n)
{
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (size_t i = i0; i < n4; i += st) {
        float4 g = mt_ld4(gate + 4 * i), u = mt_ld4(up + 4 * i), y;
        y.x = swiglu1(g.x, u.x);
        y.y = swiglu1(g.y, u.y);
        y.z = swiglu1(g.z, u.z);
        y.w = swiglu1(g.w, u.w);
        if (out) mt_st_f4(out + 4 * i, y);
        if (ob) mt_st_bf16x4(ob + 4 * i, y);
    }
    for (size_t i = 4 * n4 + i0; i < n; i += st) {
        float y = swiglu1(mt_ld1(gate + i), mt_ld1(up + i));
        if (out) out[i] = y;
        if (ob) ob[i] = mt_cuda_bf16_rn(y);
    }
}

/* a backward output: fp32 as computed, or bf16 of it (nearest even; swiglu_backward_bf16) */
static __device__ __forceinline__ void bwd_st4(float *p, float4 v) { mt_st_f4(p, v); }
static __device__ __forceinline__ void bwd_st4(__nv_bfloat16 *p, float4 v) { mt_st_bf16x4(p, v); }
static __device__ __forceinline__ void bwd_st1(float *p, float v) { *p = v; }
static __device__ __forceinline__ void bwd_st1(__nv_bfloat16 *p, float v) { *p = mt_cuda_bf16_rn(v); }

/* swiglu1_bwd's dg, du, stored as O: float (swiglu_backward) or bf16
 * (swiglu_backward_bf16: the same bits rounded, 8-byte bf16x4 stores on the
 * vector path). ab: NULL, or also the bf16 twin of act from the same loads
 * (swiglu_backward_act_bf16, O bf16 only: swiglu_fwd_k's twin bits). Each
 * thread reads its elements of gate, up, dout before writing them, so fp32
 * dgate/dup may alias gate/up (vector path: the whole float4 first); bf16
 * outputs never alias the fp32 inputs. */
/* element e's place in dgate, dup: e, or (rows of F, ldo apart) (e / F) ldo + e % F
 * (32-bit: the entry refuses ldo beyond 2^32 elements) */
static __device__ __forceinline__ size_t bwd_out_at(size_t e, unsigned F, unsigned ldo)
{
    if (!ldo) return e;
    const unsigned r = (unsigned)e / F;
    return (size_t)r * ldo + ((unsigned)e - r * F);
}

template <typename O, typename I = float, typename DT = float>   /* DT: dout's element type */
static __global__ void swiglu_bwd_k(__nv_bfloat16 *ab, O *dgate, O *dup, const DT *dout, const I *gate,
                                    const I *up, size_t n4, size_t n, unsigned F, unsigned ldo)
{
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (size_t i = i0; i < n4; i += st) {   /* (ldo: F % 4 == 0, so a vector stays in its row) */
        float4 g = mt_ld4(gate + 4 * i), u = mt_ld4(up + 4 * i), d = mt_ld4(dout + 4 * i), rg, ru, a;
        a.x = swiglu1_bwd(rg.x, ru.x, d.x, g.x, u.x);
        a.y = swiglu1_bwd(rg.y, ru.y, d.y, g.y, u.y);
        a.z = swiglu1_bwd(rg.z, ru.z, d.z, g.z, u.z);
        a.w = swiglu1_bwd(rg.w, ru.w, d.w, g.w, u.w);
        if (ab) mt_st_bf16x4(ab + 4 * i, a);
        const size_t o = bwd_out_at(4 * i, F, ldo);
        bwd_st4(dgate + o, rg);
        bwd_st4(dup + o, ru);
    }
    for (size_t i = 4 * n4 + i0; i < n; i += st) {
        float g = mt_ld1(gate + i), u = mt_ld1(up + i), d = mt_ld1(dout + i), rg, ru;
        float a = swiglu1_bwd(rg, ru, d, g, u);
        if (ab) ab[i] = mt_cuda_bf16_rn(a);
        const size_t o = bwd_out_at(i, F, ldo);
        bwd_st1(dgate + o, rg);
        bwd_st1(dup + o, ru);
    }
}

/* whole float4s of n when every pointer allows them (ob: 8 bytes; NULL passes), else 0;
 * the launch covers max(vectors, tail) threads */
static size_t vec4_count(size_t n, const void *a, const void *b, const void *c, const void *d, const void *ob)
{
    if (!mt_cuda_aligned(a, 16) || !mt_cuda_aligned(b, 16) || !mt_cuda_aligned(c, 16) || (d && !mt_cuda_aligned(d, 16)) ||
        (ob && !mt_cuda_aligned(ob, 8)))
        return 0;
    return n / 4;
}
static unsigned vec4_blocks(size_t n4, size_t n)
{
    size_t tail = n - 4 * n4;
    return mt_cuda_blocks(n4 > tail ? n4 : tail, THREADS);
}

extern "C" void mt_cuda_swiglu_forward(void *be, float *out, const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    const size_t n4 = vec4_count(n, out, gate, up, NULL, NULL);
    MT_LAUNCH(swiglu_fwd_k<float>, vec4_blocks(n4, n), THREADS, 0)(out, (__nv_bfloat16 *)NULL, gate, up, n4, n);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_swiglu_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    const size_t n4 = vec4_count(n, out, gate, up, NULL, out_bf16);
    MT_LAUNCH(swiglu_fwd_k<float>, vec4_blocks(n4, n), THREADS, 0)(out, (__nv_bfloat16 *)out_bf16, gate, up, n4, n);
    MT_CUDA_KCHECK();
}

/* swiglu_forward_bf16_gu (mt_ops.h): gate, up stored bf16, only the twin */
extern "C" void mt_cuda_swiglu_forward_bf16_gu(void *be, mt_bf16 *out_bf16, const mt_bf16 *gate, const mt_bf16 *up,
                                               size_t n)
{
    MT_CUDA_BIND(be);
    if (!n) return;
    const size_t n4 = mt_cuda_aligned(gate, 8) && mt_cuda_aligned(up, 8) && mt_cuda_aligned(out_bf16, 8) ? n / 4 : 0;
    MT_LAUNCH(swiglu_fwd_k<__nv_bfloat16>, vec4_blocks(n4, n), THREADS, 0)(
        (float *)NULL, (__nv_bfloat16 *)out_bf16, (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, n4, n);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_swiglu_backward(void *be, float *dgate, float *dup, const float *dout, const float *gate,
                                        const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    const size_t n4 = vec4_count(n, dgate, dup, dout, gate, NULL) && mt_cuda_aligned(up, 16) ? n / 4 : 0;
    MT_LAUNCH(swiglu_bwd_k<float>, vec4_blocks(n4, n), THREADS, 0)((__nv_bfloat16 *)NULL, dgate, dup, dout, gate, up,
                                                                   n4, n, 0u, 0u);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_swiglu_backward_bf16(void *be, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                             const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    /* the fp32 inputs 16-byte aligned, both bf16 outputs 8-byte aligned, else the scalar path */
    const size_t n4 = vec4_count(n, dout, gate, up, NULL, dgate_b) && mt_cuda_aligned(dup_b, 8) ? n / 4 : 0;
    MT_LAUNCH(swiglu_bwd_k<__nv_bfloat16>, vec4_blocks(n4, n), THREADS, 0)(
        (__nv_bfloat16 *)NULL, (__nv_bfloat16 *)dgate_b, (__nv_bfloat16 *)dup_b, dout, gate, up, n4, n, 0u, 0u);
    MT_CUDA_KCHECK();
}

/* one launch for the backward's act twin, dg and du (mt_ops.h): gate, up,
 * dout read once, three bf16 stores */
extern "C" void mt_cuda_swiglu_backward_act_bf16(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                                 const float *dout, const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    /* the fp32 inputs 16-byte aligned, the three bf16 outputs 8-byte aligned, else the scalar path */
    const size_t n4 = vec4_count(n, dout, gate, up, NULL, dgate_b) && mt_cuda_aligned(dup_b, 8) &&
                              mt_cuda_aligned(act_b, 8) ? n / 4 : 0;
    MT_LAUNCH(swiglu_bwd_k<__nv_bfloat16>, vec4_blocks(n4, n), THREADS, 0)(
        (__nv_bfloat16 *)act_b, (__nv_bfloat16 *)dgate_b, (__nv_bfloat16 *)dup_b, dout, gate, up, n4, n, 0u, 0u);
    MT_CUDA_KCHECK();
}

/* swiglu_backward_act_bf16_gu (mt_ops.h): the same with gate, up stored bf16 */
extern "C" void mt_cuda_swiglu_backward_act_bf16_gu(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                                    const float *dout, const mt_bf16 *gate, const mt_bf16 *up, size_t n)
{
    MT_CUDA_BIND(be);
    if (!n) return;
    const size_t n4 = mt_cuda_aligned(dout, 16) && mt_cuda_aligned(gate, 8) && mt_cuda_aligned(up, 8) &&
                              mt_cuda_aligned(dgate_b, 8) && mt_cuda_aligned(dup_b, 8) && mt_cuda_aligned(act_b, 8)
                          ? n / 4 : 0;
    MT_LAUNCH((swiglu_bwd_k<__nv_bfloat16, __nv_bfloat16>), vec4_blocks(n4, n), THREADS, 0)(
        (__nv_bfloat16 *)act_b, (__nv_bfloat16 *)dgate_b, (__nv_bfloat16 *)dup_b, dout, (const __nv_bfloat16 *)gate,
        (const __nv_bfloat16 *)up, n4, n, 0u, 0u);
    MT_CUDA_KCHECK();
}

/* swiglu_backward_act_bf16_gud (mt_ops.h): ... and dout stored bf16 too */
extern "C" void mt_cuda_swiglu_backward_act_bf16_gud(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                                     const mt_bf16 *dout, const mt_bf16 *gate, const mt_bf16 *up,
                                                     size_t n, size_t F, size_t ldo)
{
    MT_CUDA_BIND(be);
    if (!n) return;
    if (ldo && (F == 0 || n % F || ldo < F || (n / F) * ldo > 0xffffffffu)) {
        MT_CUDA_UNSUPPORTED("swiglu_backward_act_bf16_gud: rows ldo apart need F | n, ldo >= F, under 2^32 elements");
        return;
    }
    /* the vector path: every pointer 8-byte aligned and, rows apart, each row's start too */
    const int rows_ok = !ldo || (F % 4 == 0 && ldo % 4 == 0);
    const size_t n4 = rows_ok && mt_cuda_aligned(dout, 8) && mt_cuda_aligned(gate, 8) && mt_cuda_aligned(up, 8) &&
                              mt_cuda_aligned(dgate_b, 8) && mt_cuda_aligned(dup_b, 8) && mt_cuda_aligned(act_b, 8)
                          ? n / 4 : 0;
    MT_LAUNCH((swiglu_bwd_k<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>), vec4_blocks(n4, n), THREADS, 0)(
        (__nv_bfloat16 *)act_b, (__nv_bfloat16 *)dgate_b, (__nv_bfloat16 *)dup_b, (const __nv_bfloat16 *)dout,
        (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, n4, n, (unsigned)(ldo ? F : 0), (unsigned)ldo);
    MT_CUDA_KCHECK();
}

/* ---- ReDo scores (mt_ops.h redo_score_acc) ----
 * A block owns 32 columns; its 8 warps take every 8th row of them (lane =
 * column: a warp reads 32 adjacent floats of a row), sum the fixed-point
 * terms of mt_redo_fix in int64, and the 8 partial sums per column meet in
 * shared memory. Integer sums: any order gives the cpu's integers. No
 * atomics (one block per column group adds into acc). */
#define REDO_COLS 32
#ifndef __noinline__   /* nvcc's host_defines.h has it; the CPU emulator's headers do not */
#define __noinline__ __attribute__((noinline))
#endif
#define REDO_LANES 8
static __device__ __forceinline__ long long redo_fix(float x)
{
    double a = fabs((double)x);
    if (!(a <= MT_REDO_FIX_CLAMP)) a = MT_REDO_FIX_CLAMP;
    return (long long)(a * MT_REDO_FIX_SCALE);
}
/* one thread's share of column j (0 past F); not inlined, so that no
 * branch of it can be merged with the barrier after it (every thread
 * reaches the one __syncthreads from the same place) */
static __device__ __noinline__ long long redo_colsum(const float *act, size_t rows, int F, int j, int lane)
{
    long long s = 0;
    if (j < F)
        for (size_t i = lane; i < rows; i += REDO_LANES) s += redo_fix(act[i * (size_t)F + (size_t)j]);
    return s;
}
static __global__ void redo_score_k(long long *acc, const float *act, size_t rows, int F)
{
    __shared__ long long part[REDO_LANES][REDO_COLS];
    const int c = threadIdx.x % REDO_COLS, lane = threadIdx.x / REDO_COLS;
    const int j = blockIdx.x * REDO_COLS + c;
    part[lane][c] = redo_colsum(act, rows, F, j, lane);
    __syncthreads();
    if (lane == 0 && j < F) {
        long long t = 0;
        for (int l = 0; l < REDO_LANES; l++) t += part[l][c];
        acc[j] += t;
    }
}

extern "C" void mt_cuda_redo_score_acc(void *be, int64_t *acc, const float *act, size_t rows, int F)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!rows || F <= 0) return;
    MT_LAUNCH(redo_score_k, (unsigned)((F + REDO_COLS - 1) / REDO_COLS), REDO_COLS * REDO_LANES, 0)(
        (long long *)acc, act, rows, F);
    MT_CUDA_KCHECK();
}
