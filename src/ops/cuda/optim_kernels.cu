/*
 * optim_kernels.cu — elementwise optimizer updates (AdamW, Muon momentum)
 * and the transpose Muon's Newton–Schulz uses for wide matrices.
 *
 *   AdamW (PyTorch): m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *                    p *= 1 - lr wd;  p -= lr (m/bc1) / (sqrt(v/bc2) + eps)
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

/* one tensor's AdamW over a grid-stride loop (mt_ops.h): the single-tensor
 * kernel and the multi-tensor one run exactly this, so their bits agree */
static __device__ __forceinline__ void adamw_span(float *p, const float *g, float *m, float *v, size_t n, float lr,
                                                  float b1, float b2, float eps, float decay, float bc1, float bc2)
{
    /* __fmul_rn/__fadd_rn: plain `a * b + c` compiles to PTX mul.f32/add.f32,
     * which ptxas may fuse into an FMA in one kernel and not in the other (the
     * H100 run of 2026-11-26: 865 values of adamw_multi differed from the
     * loop over adamw_update); the _rn forms are never fused, so every
     * kernel that runs this span rounds the same way */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(1.0f - b1, gi));
        float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(1.0f - b2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float step = __fmul_rn(lr, mi / bc1) / __fadd_rn(sqrtf(vi / bc2), eps);
        p[i] = __fsub_rn(__fmul_rn(p[i], decay), step);
    }
}

static __global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n,
                               float lr, float b1, float b2, float eps, float decay, float bc1, float bc2)
{
    adamw_span(p, g, m, v, n, lr, b1, b2, eps, decay, bc1, bc2);
}

static __global__ void muon_momentum_k(float *d, float *m, const float *g, float mu, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = mu * m[i] + gi;
        m[i] = mi;
        d[i] = gi + mu * mi;
    }
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
    MT_LAUNCH(adamw_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(p, g, m, v, n, lr, b1, b2, eps, decay, bc1, bc2);
    MT_CUDA_KCHECK();
}

/* adamw_multi (issue 27 item 3): adamw_k on up to MT_OPS_LIST_MAX tensors in
 * one launch, blockIdx.y the tensor (its pointers and decay a launch
 * argument), the same per-element arithmetic */
struct adamw_list {
    float       *p[MT_OPS_LIST_MAX];
    const float *g[MT_OPS_LIST_MAX];
    float       *m[MT_OPS_LIST_MAX];
    float       *v[MT_OPS_LIST_MAX];
    size_t       n[MT_OPS_LIST_MAX];
    float        decay[MT_OPS_LIST_MAX];
};

static __global__ void adamw_multi_k(struct adamw_list L, float lr, float b1, float b2, float eps, float bc1, float bc2)
{
    const int t = blockIdx.y;
    adamw_span(L.p[t], L.g[t], L.m[t], L.v[t], L.n[t], lr, b1, b2, eps, L.decay[t], bc1, bc2);
}

extern "C" void mt_cuda_adamw_multi(void *be, float *const *p, const float *const *g, float *const *m, float *const *v,
                                    const size_t *n, const float *wd, int count, float lr, float b1, float b2,
                                    float eps, float bc1, float bc2)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct adamw_list L;
        memset(&L, 0, sizeof L);
        size_t nmax = 0;
        for (int t = 0; t < c; t++) {
            L.p[t] = p[base + t];
            L.g[t] = g[base + t];
            L.m[t] = m[base + t];
            L.v[t] = v[base + t];
            L.n[t] = n[base + t];
            L.decay[t] = 1.0f - lr * wd[base + t];   /* as adamw_update computes it */
            if (L.n[t] > nmax) nmax = L.n[t];
        }
        if (!nmax) continue;
        MT_LAUNCH(adamw_multi_k, dim3(mt_cuda_blocks(nmax, THREADS), (unsigned)c), THREADS, 0)(L, lr, b1, b2, eps,
                                                                                               bc1, bc2);
        MT_CUDA_KCHECK();
    }
}

extern "C" void mt_cuda_muon_momentum(void *be, float *d, float *m, const float *g, float mu, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(muon_momentum_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(d, m, g, mu, n);
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
