/*
 * optim_kernels.cu — elementwise optimizer updates (AdamW, Muon momentum)
 * and the transpose Muon's Newton–Schulz uses for wide matrices.
 *
 *   AdamW (PyTorch): m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *                    p *= 1 - lr wd;  p -= lr (m/bc1) / (sqrt(v/bc2) + eps)
 *                    pb (may be NULL) = bf16(p) of the updated p, nearest even
 *                    (mt_cuda_bf16_rn: cast_bf16's bits; adamw_multi's shadows)
 *   Muon:            m = mu m + g;  d = g + mu m  (Nesterov), d may alias g.
 *   transpose:       out (cols, rows) = in (rows, cols)^T via 32x33 smem tiles.
 *
 * Invariant: one thread per element (transpose: per tile element), each
 * element read before written: d == g is safe.
 */
#include "cuda_impl.cuh"

#include <math.h>
#include <string.h>

#define THREADS 256
#define TB      32

/* one element's AdamW. __fmul_rn/__fadd_rn: plain `a * b + c` compiles to
 * PTX mul.f32/add.f32, which ptxas may fuse into an FMA in one kernel and
 * not in the other (the H100 run of 2026-11-26: 865 values of adamw_multi
 * differed from the loop over adamw_update); the _rn forms are never fused,
 * so every kernel that runs this rounds the same way */
static __device__ __forceinline__ void adamw_elem(float &p, float gi, float &m, float &v, float lr, float b1,
                                                  float b2, float eps, float decay, float bc1, float bc2)
{
    float mi = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(1.0f - b1, gi));
    float vi = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(1.0f - b2, gi), gi));
    m = mi;
    v = vi;
    float step = __fmul_rn(lr, mi / bc1) / __fadd_rn(sqrtf(vi / bc2), eps);
    p = __fsub_rn(__fmul_rn(p, decay), step);
}

/* one tensor's AdamW over a grid-stride loop (mt_ops.h): the single-tensor
 * kernel and the multi-tensor one run exactly this, so their bits agree.
 * Groups of 4 as float4 loads and stores when all four buffers are 16-byte
 * aligned (the carver aligns to 64: always, but for views) and the shadow
 * pb 8-byte aligned (its 4 values: one bf16x4 store), then the tail; each
 * element's arithmetic is adamw_elem either way, its shadow mt_cuda_bf16_rn
 * of the p it stores. pb is the same for every thread of a block (NULL: no
 * shadow), so its branch never diverges. */
static __device__ __forceinline__ void adamw_span(float *p, __nv_bfloat16 *pb, const float *g, float gs, float *m,
                                                  float *v, size_t n, float lr, float b1, float b2, float eps,
                                                  float decay, float bc1, float bc2)
{
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    const int vec = (((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) & 15) == 0 && ((uintptr_t)pb & 7) == 0;
    const size_t n4 = vec ? n / 4 : 0;
    for (size_t i = i0; i < n4; i += st) {
        float4 P = mt_ld_f4(p + 4 * i), G = mt_ld_f4(g + 4 * i), M = mt_ld_f4(m + 4 * i), V = mt_ld_f4(v + 4 * i);
        adamw_elem(P.x, __fmul_rn(G.x, gs), M.x, V.x, lr, b1, b2, eps, decay, bc1, bc2);
        adamw_elem(P.y, __fmul_rn(G.y, gs), M.y, V.y, lr, b1, b2, eps, decay, bc1, bc2);
        adamw_elem(P.z, __fmul_rn(G.z, gs), M.z, V.z, lr, b1, b2, eps, decay, bc1, bc2);
        adamw_elem(P.w, __fmul_rn(G.w, gs), M.w, V.w, lr, b1, b2, eps, decay, bc1, bc2);
        mt_st_f4(p + 4 * i, P);
        mt_st_f4(m + 4 * i, M);
        mt_st_f4(v + 4 * i, V);
        if (pb) mt_st_bf16x4(pb + 4 * i, P);
    }
    for (size_t i = 4 * n4 + i0; i < n; i += st) {
        adamw_elem(p[i], __fmul_rn(g[i], gs), m[i], v[i], lr, b1, b2, eps, decay, bc1, bc2);
        if (pb) pb[i] = mt_cuda_bf16_rn(p[i]);
    }
}

/* blocks of an AdamW launch over n elements: a thread per group of 4, at
 * most 2048 blocks (16 of 256 threads per SM on a 132-SM H100 and then some:
 * the grid-stride loop does the rest; adamw_multi launches this many for
 * EVERY tensor of its list, most of them small, so an uncapped grid was
 * mostly empty blocks) */
static unsigned adamw_blocks(size_t n)
{
    unsigned b = mt_cuda_blocks((n + 3) / 4, THREADS);
    return b > 2048 ? 2048 : b;
}

static __global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n,
                               float lr, float b1, float b2, float eps, float decay, float bc1, float bc2)
{
    adamw_span(p, NULL, g, 1.0f, m, v, n, lr, b1, b2, eps, decay, bc1, bc2);
}

static __global__ void muon_momentum_k(float *d, float *m, const float *g, float mu, size_t n, float gscale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = mt_cuda_muon_elem(m, g, mu, gscale, i);   /* g read before d written: d may alias g */
}

/* block (32, 8): tile (32 x 32) of `in` starting at (r0, c0) = (blockIdx.y, blockIdx.x) * 32 */
static __global__ void transpose_k(float *out, const float *in, int rows, int cols)
{
    __shared__ float tile[TB][TB + 1];
    int c0 = blockIdx.x * TB, r0 = blockIdx.y * TB;
    for (int dy = threadIdx.y; dy < TB; dy += blockDim.y) {
        int r = r0 + dy, c = c0 + (int)threadIdx.x;
        if (r < rows && c < cols) tile[dy][threadIdx.x] = in[(size_t)r * (size_t)cols + (size_t)c];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < TB; dy += blockDim.y) {
        int c = c0 + dy, r = r0 + (int)threadIdx.x;  /* out row c, column r */
        if (r < rows && c < cols) out[(size_t)c * (size_t)rows + (size_t)r] = tile[threadIdx.x][dy];
    }
}

extern "C" void mt_cuda_adamw_update(void *be, float *p, const float *g, float *m, float *v, size_t n,
                                     float lr, float b1, float b2, float eps, float wd, float bc1, float bc2)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    float decay = 1.0f - lr * wd;
    MT_LAUNCH(adamw_k, adamw_blocks(n), THREADS, 0)(p, g, m, v, n, lr, b1, b2, eps, decay, bc1, bc2);
    MT_CUDA_KCHECK();
}

/* adamw_multi (issue 27 item 3): adamw_k on up to MT_OPS_LIST_MAX tensors in
 * one launch, blockIdx.y the tensor (its pointers and decay a launch
 * argument), the same per-element arithmetic; pb[t] the tensor's bf16
 * shadow, written in the same pass (NULL: none) */
struct adamw_list {
    float         *p[MT_OPS_LIST_MAX];
    __nv_bfloat16 *pb[MT_OPS_LIST_MAX];
    const float   *g[MT_OPS_LIST_MAX];
    float         *m[MT_OPS_LIST_MAX];
    float         *v[MT_OPS_LIST_MAX];
    size_t         n[MT_OPS_LIST_MAX];
    float          decay[MT_OPS_LIST_MAX];
};

static __global__ void adamw_multi_k(struct adamw_list L, float lr, float b1, float b2, float eps, float bc1, float bc2,
                                     float gs)
{
    const int t = blockIdx.y;
    adamw_span(L.p[t], L.pb[t], L.g[t], gs, L.m[t], L.v[t], L.n[t], lr, b1, b2, eps, L.decay[t], bc1, bc2);
}

extern "C" void mt_cuda_adamw_multi(void *be, float *const *p, mt_bf16 *const *pb, const float *const *g,
                                    float *const *m, float *const *v, const size_t *n, const float *wd, int count,
                                    float lr, float b1, float b2, float eps, float bc1, float bc2, float gscale)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct adamw_list L;
        memset(&L, 0, sizeof L);
        size_t nmax = 0;
        for (int t = 0; t < c; t++) {
            L.p[t] = p[base + t];
            L.pb[t] = pb ? (__nv_bfloat16 *)pb[base + t] : NULL;
            L.g[t] = g[base + t];
            L.m[t] = m[base + t];
            L.v[t] = v[base + t];
            L.n[t] = n[base + t];
            L.decay[t] = 1.0f - lr * wd[base + t];   /* as adamw_update computes it */
            if (L.n[t] > nmax) nmax = L.n[t];
        }
        if (!nmax) continue;
        MT_LAUNCH(adamw_multi_k, dim3(adamw_blocks(nmax), (unsigned)c), THREADS, 0)(L, lr, b1, b2, eps,
                                                                                               bc1, bc2, gscale);
        MT_CUDA_KCHECK();
    }
}

extern "C" void mt_cuda_muon_momentum(void *be, float *d, float *m, const float *g, float mu, size_t n,
                                      float gscale)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(muon_momentum_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(d, m, g, mu, n, gscale);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_transpose(void *be, float *out, const float *in, int rows, int cols)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (rows <= 0 || cols <= 0) return;
    dim3 grid((unsigned)((cols + TB - 1) / TB), (unsigned)((rows + TB - 1) / TB));
    MT_LAUNCH(transpose_k, grid, dim3(TB, 8), 0)(out, in, rows, cols);
    MT_CUDA_KCHECK();
}
