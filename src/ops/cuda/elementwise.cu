/*
 * elementwise.cu — fill, axpby, sumsq, all_finite (cuda backend).
 *
 * sumsq is a fixed-order two-pass reduction in double: pass 1 gives block b
 * (of MT_CUDA_RED_BLOCKS) the contiguous range [b*bs, (b+1)*bs); each of its
 * threads sums a fixed strided subset in order, then a shared-memory tree
 * combines the threads; pass 2 (one block) sums the partials the same way.
 * The order depends only on n: same bits every call, no atomics.
 * all_finite: every thread that sees a non-finite value stores 1 into a
 * zeroed flag (all writers store the same value: deterministic).
 * nonfinite_mark: the same test over a list of tensors, 16-byte loads, one
 * 1-D grid whose blocks each belong to one tensor (its comment below).
 * sumsq_multi (issue 27 item 3): pass 1 of every tensor in one launch per
 * MT_OPS_LIST_MAX tensors (blockIdx.y = the tensor, its list a launch
 * argument), each tensor's partials exactly sumsq's; pass 2 is one block
 * that reduces tensor i's partials as sumsq's pass 2 does and adds the
 * results in index order: the host loop over sumsq, one host wait.
 * normalize_fro: sumsq's two passes, then a scale kernel that reads the sum
 * from device memory (Muon's X / ||X||_F without a host round trip).
 */
#include "cuda_impl.cuh"

#include <math.h>
#include <string.h>

#define THREADS 256

static __global__ void fill_k(float *x, float value, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

/* mode 0: y = b*y;  1: y = a*x (y not read);  2: y = a*x + b*y, rounded as fma(a, x, rn(b y)).
 * Written out: left to nvcc's contraction, `a*x + b*y` became fma(a, x, rn(b y)) in this kernel
 * and fma(b, y, rn(a x)) in axpby_from_bf16_multi_k (its a*x hoisted out of a branch): a
 * quarter of the elements differ (a review of the PTX, session 25). axpby_from_bf16 rounds the
 * same way (mt_cuda_axpby2), so it stays widen_bf16 + axpby bit for bit. */
static __device__ __forceinline__ float mt_cuda_axpby2(float a, float x, float b, float y)
{
    return fmaf(a, x, __fmul_rn(b, y));
}
static __global__ void axpby_k(float *y, const float *x, float a, float b, size_t n, int mode)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (mode == 0)      y[i] = __fmul_rn(b, y[i]);
        else if (mode == 1) y[i] = __fmul_rn(a, x[i]);
        else                y[i] = mt_cuda_axpby2(a, x[i], b, y[i]);
    }
}

/* shared-memory tree over MT_CUDA_RED_THREADS doubles; result in s[0] */
static __device__ void block_tree_sum(double *s)
{
    for (int w = MT_CUDA_RED_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    }
    __syncthreads();
}

/* The element loaders of the sum's first pass: element i's value, loaded
 * once per call of the pass (every element of [0, n) exactly once) */
struct ld_plain {   /* x[i] */
    const float *x;
    __device__ __forceinline__ float operator()(size_t i) const { return x[i]; }
};
/* muon_momentum's element (mt_cuda_muon_elem): m updated, the Nesterov direction
 * d returned (muon_prep_bf16_multi: the momentum inside the norm's first pass) */
struct ld_muon {
    float       *m;
    const float *g;
    float        mu, gs;
    __device__ __forceinline__ float operator()(size_t i) const { return mt_cuda_muon_elem(m, g, mu, gs, i); }
};

/* block blockIdx.x's partial of sum x^2 over its span [x*bs, +bs) of n, in
 * a fixed order (the single- and multi-tensor passes share it: same bits) */
template <class LD>
static __device__ __forceinline__ double sumsq_block(LD x, size_t n, size_t bs)
{
    __shared__ double s[MT_CUDA_RED_THREADS];
    size_t lo = blockIdx.x * bs, hi = lo + bs;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    double acc = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += MT_CUDA_RED_THREADS) {
        const double v = (double)x(i);   /* each element loaded once (a loader may update state: ld_muon) */
        acc += v * v;
    }
    s[threadIdx.x] = acc;
    block_tree_sum(s);
    return s[0];
}

/* Spans of at most this many elements are summed by one thread. A tensor of
 * n <= 32 MT_CUDA_RED_BLOCKS elements (32 Ki: the norms' weights, biases,
 * every tensor of a tiny model) has them alone: its MT_CUDA_RED_BLOCKS
 * partials, one per thread, take MT_CUDA_RED_BLOCKS / MT_CUDA_RED_THREADS
 * blocks instead of a block each (1024 trees of nine barriers for at most 32
 * squares each: most of an emulated tiny step, and on a GPU a thousand
 * nearly empty blocks a norm weight). */
#define SUMSQ_SERIAL 32
#define SUMSQ_SERIAL_BLOCKS ((MT_CUDA_RED_BLOCKS + MT_CUDA_RED_THREADS - 1) / MT_CUDA_RED_THREADS)
static_assert(MT_CUDA_RED_THREADS >= SUMSQ_SERIAL, "the tree's last steps are the serial ones");

/* sumsq_block's value for a span [lo, hi) of m = hi - lo <= 32 elements,
 * by one thread, bit for bit: its thread t < m holds one square (0.0 + x^2
 * = x^2), the rest 0.0, so the tree's steps w >= 32 add +0.0 (exact: the
 * squares are >= +0) and w = 16 .. 1 pair the same leaves as here */
template <class LD>
static __device__ __forceinline__ double sumsq_span_serial(LD x, size_t lo, size_t hi)
{
    /* The tree's pairs (leaf i with i + 16, then + 8, ...) are the adjacent
     * pairs of the leaves in bit-reversed order (j = bitrev5(i)), so one
     * pass over j in order, keeping one pending sum a level (a binary
     * counter: j's trailing ones are the levels that close), adds exactly
     * the tree's operands. Unrolled: every index a constant, six doubles in
     * registers (a 32-leaf array cost 72 registers for the whole kernel,
     * the large tensors' blocks too) */
    static_assert(SUMSQ_SERIAL == 32, "five levels");
    const int m = (int)(hi - lo);
    double level[5], a = 0.0;
#pragma unroll
    for (int j = 0; j < SUMSQ_SERIAL; j++) {
        const int i = ((j & 1) << 4) | ((j & 2) << 2) | (j & 4) | ((j & 8) >> 2) | ((j & 16) >> 4);
        const double v = i < m ? (double)x(lo + i) : 0.0;
        a = v * v;
#pragma unroll
        for (int l = 0; l < 5; l++) {
            if (!((j >> l) & 1)) {
                level[l] = a;
                break;
            }
            a = level[l] + a;
        }
    }
    return a;   /* j = 31 closed every level */
}

/* the MT_CUDA_RED_BLOCKS partials of sum x^2 of one tensor into partial[]:
 * a block each (spans over 32: the launch has MT_CUDA_RED_BLOCKS blocks in
 * x), or a thread each (the launch's first SUMSQ_SERIAL_BLOCKS blocks; the
 * choice is the tensor's, so uniform over every block) */
template <class LD>
static __device__ __forceinline__ void sumsq_partials(double *partial, LD x, size_t n)
{
    const size_t bs = (n + MT_CUDA_RED_BLOCKS - 1) / MT_CUDA_RED_BLOCKS;
    if (bs > SUMSQ_SERIAL) {
        const double s0 = sumsq_block(x, n, bs);
        if (threadIdx.x == 0) partial[blockIdx.x] = s0;
        return;
    }
    const size_t b = (size_t)blockIdx.x * MT_CUDA_RED_THREADS + threadIdx.x;
    if (b >= MT_CUDA_RED_BLOCKS) return;
    size_t lo = b * bs, hi = lo + bs;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    partial[b] = sumsq_span_serial(x, lo, hi);
}

/* the blocks a launch of sumsq_partials needs in x for a tensor of n */
static unsigned sumsq_grid_x(size_t n)
{
    return (n + MT_CUDA_RED_BLOCKS - 1) / MT_CUDA_RED_BLOCKS > SUMSQ_SERIAL ? MT_CUDA_RED_BLOCKS : SUMSQ_SERIAL_BLOCKS;
}

static __global__ void sumsq_pass1_k(double *partial, const float *x, size_t n)
{
    sumsq_partials(partial, ld_plain{x}, n);
}

static __global__ void sumsq_pass2_k(double *partial, int nparts)
{
    __shared__ double s[MT_CUDA_RED_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += MT_CUDA_RED_THREADS) acc += partial[i];
    s[threadIdx.x] = acc;
    block_tree_sum(s);
    if (threadIdx.x == 0) partial[nparts] = s[0];
}

/* exponent all ones: +-inf or NaN */
static __device__ __forceinline__ unsigned nonfinite_bits(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

static __global__ void nonfinite_k(int *flag, const float *x, size_t n)
{
    const uint32_t *u = (const uint32_t *)x;
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= nonfinite_bits(u[i]);
    if (bad) *flag = 1;
}

extern "C" void mt_cuda_fill(void *be, float *x, float value, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    if (value == 0.0f) {
        MT_CUDA_CHECK(mt_cuda_memset(x, 0, n * sizeof(float)));
        return;
    }
    MT_LAUNCH(fill_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(x, value, n);
    MT_CUDA_KCHECK();
}

/* y = a*x + b*y; x == NULL: y = b*y. b == 0 does not read y (BLAS rule). */
extern "C" void mt_cuda_axpby(void *be, float *y, const float *x, float a, float b, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    if (!x && b == 0.0f) {
        MT_CUDA_CHECK(mt_cuda_memset(y, 0, n * sizeof(float)));
        return;
    }
    int mode = !x ? 0 : (b == 0.0f ? 1 : 2);
    MT_LAUNCH(axpby_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(y, x, a, b, n, mode);
    MT_CUDA_KCHECK();
}

extern "C" double mt_cuda_sumsq(void *be, const float *x, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (mt_cuda_be->err != MT_OK) return NAN;
    if (!n) return 0.0;
    MT_LAUNCH(sumsq_pass1_k, sumsq_grid_x(n), MT_CUDA_RED_THREADS, 0)(mt_cuda_be->red_partial, x, n);
    MT_CUDA_KCHECK();
    MT_LAUNCH(sumsq_pass2_k, 1, MT_CUDA_RED_THREADS, 0)(mt_cuda_be->red_partial, MT_CUDA_RED_BLOCKS);
    MT_CUDA_KCHECK();
    double r = NAN;
    MT_CUDA_CHECK(mt_cuda_memcpy(&r, mt_cuda_be->red_partial + MT_CUDA_RED_BLOCKS, sizeof r, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
    return mt_cuda_be->err != MT_OK ? NAN : r;
}

extern "C" int mt_cuda_all_finite(void *be, const float *x, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (mt_cuda_be->err != MT_OK) return 0;
    if (!n) return 1;
    MT_CUDA_CHECK(mt_cuda_memset(mt_cuda_be->red_flag, 0, sizeof(int)));
    MT_LAUNCH(nonfinite_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(mt_cuda_be->red_flag, x, n);
    MT_CUDA_KCHECK();
    int bad = 1;
    MT_CUDA_CHECK(mt_cuda_memcpy(&bad, mt_cuda_be->red_flag, sizeof bad, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
    return mt_cuda_be->err == MT_OK && bad == 0;
}

/* ---- step synchronisation (issue 27 item 3; docs/cuda.md "Host waits in the step") ---- */

struct sumsq_list {
    const float *x[MT_OPS_LIST_MAX];
    size_t       n[MT_OPS_LIST_MAX];
};

/* grid (the largest sumsq_grid_x of the c tensors, c): block (b, t) is sumsq_pass1_k's
 * block b of tensor base + t (a tensor that needs fewer blocks has the rest do nothing) */
static __global__ void sumsq_multi_pass1_k(double *partial, struct sumsq_list L, int base)
{
    sumsq_partials(partial + (size_t)(base + (int)blockIdx.y) * MT_CUDA_RED_BLOCKS, ld_plain{L.x[blockIdx.y]},
                   L.n[blockIdx.y]);
}

/* one block: tensor i's sum as sumsq_pass2_k forms it, then out = 0 + t_0 + t_1 + ... in order */
static __global__ void sumsq_multi_pass2_k(double *out, const double *partial, int count)
{
    __shared__ double s[MT_CUDA_RED_THREADS];
    double tot = 0.0;
    for (int t = 0; t < count; t++) {
        double acc = 0.0;
        for (int i = threadIdx.x; i < MT_CUDA_RED_BLOCKS; i += MT_CUDA_RED_THREADS)
            acc += partial[(size_t)t * MT_CUDA_RED_BLOCKS + i];
        s[threadIdx.x] = acc;
        block_tree_sum(s);
        if (threadIdx.x == 0) tot += s[0];
    }
    if (threadIdx.x == 0) out[0] = tot;
}

/* x = (float)(1 / (sqrt(*ss) + eps)) * x: the host's scalar, rounded once, then axpby's y = b*y */
static __global__ void scale_rnorm_k(float *x, const double *ss, double eps, size_t n)
{
    float b = (float)(1.0 / (sqrt(*ss) + eps));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = b * x[i];
}

extern "C" double mt_cuda_sumsq_multi(void *be, const float *const *x, const size_t *n, int count)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (mt_cuda_be->err != MT_OK) return NAN;
    if (count <= 0) return 0.0;
    double *part = (double *)mt_cuda_workspace(((size_t)count * MT_CUDA_RED_BLOCKS + 1) * sizeof(double));
    if (!part) return NAN;
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct sumsq_list L;
        memset(&L, 0, sizeof L);
        unsigned gx = 1;
        for (int t = 0; t < c; t++) {
            L.x[t] = x[base + t];
            L.n[t] = n[base + t];
            const unsigned g = sumsq_grid_x(L.n[t]);
            if (g > gx) gx = g;
        }
        MT_LAUNCH(sumsq_multi_pass1_k, dim3(gx, (unsigned)c), MT_CUDA_RED_THREADS, 0)(part, L, base);
        MT_CUDA_KCHECK();
    }
    double *out = part + (size_t)count * MT_CUDA_RED_BLOCKS;
    MT_LAUNCH(sumsq_multi_pass2_k, 1, MT_CUDA_RED_THREADS, 0)(out, part, count);
    MT_CUDA_KCHECK();
    double r = NAN;
    MT_CUDA_CHECK(mt_cuda_memcpy(&r, out, sizeof r, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
    return mt_cuda_be->err != MT_OK ? NAN : r;
}

/* normalize_fro_bf16 (mt_ops.h): scale_rnorm_k's scalar and product, then the rounding */
static __global__ void scale_rnorm_bf16_k(__nv_bfloat16 *dst, const float *x, const double *ss, double eps, size_t n)
{
    float b = (float)(1.0 / (sqrt(*ss) + eps));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = mt_cuda_bf16_rn(__fmul_rn(b, x[i]));
}

/* axpby_from_bf16 (mt_ops.h): axpby_k's modes 1 and 2 on the widened x */
static __device__ __forceinline__ void axpby_from_bf16_span(float *y, const __nv_bfloat16 *x, float a, float b,
                                                            size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float xi = __bfloat162float(x[i]);
        y[i] = b == 0.0f ? __fmul_rn(a, xi) : mt_cuda_axpby2(a, xi, b, y[i]);
    }
}
static __global__ void axpby_from_bf16_k(float *y, const __nv_bfloat16 *x, float a, float b, size_t n)
{
    axpby_from_bf16_span(y, x, a, b, n);
}

/* sumsq's two passes over x into the backend's reduction slot (normalize_fro and its bf16 form):
 * the device address of the sum */
static const double *fro_sumsq(const float *x, size_t n)
{
    MT_LAUNCH(sumsq_pass1_k, sumsq_grid_x(n), MT_CUDA_RED_THREADS, 0)(mt_cuda_be->red_partial, x, n);
    MT_CUDA_KCHECK();
    MT_LAUNCH(sumsq_pass2_k, 1, MT_CUDA_RED_THREADS, 0)(mt_cuda_be->red_partial, MT_CUDA_RED_BLOCKS);
    MT_CUDA_KCHECK();
    return mt_cuda_be->red_partial + MT_CUDA_RED_BLOCKS;
}

extern "C" void mt_cuda_normalize_fro_bf16(void *be, mt_bf16 *dst, const float *x, size_t n, double eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    const double *ss = fro_sumsq(x, n);
    MT_LAUNCH(scale_rnorm_bf16_k, mt_cuda_blocks(n, THREADS), THREADS, 0)((__nv_bfloat16 *)dst, x, ss, eps, n);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_axpby_from_bf16(void *be, float *y, const mt_bf16 *x, float a, float b, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(axpby_from_bf16_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(y, (const __nv_bfloat16 *)x, a, b, n);
    MT_CUDA_KCHECK();
}

/* ---- Muon's batch, multi-tensor (muon_prep_bf16_multi, axpby_from_bf16_multi; mt_ops.h) ----
 * muon_prep_bf16_multi per MT_OPS_LIST_MAX matrices, blockIdx.y the matrix:
 *   pass 1  the momentum of every element inside sumsq's first pass over the
 *           direction d (ld_muon: the partials of sumsq(d), m stored, d not);
 *   pass 2  each matrix's sum from its partials (sumsq_pass2_k's order);
 *   scale   x = bf16(s d), s = (float)(1 / (sqrt(sum) + eps)), d recomputed
 *           from the stored m and g (mt_cuda_muon_dir: the same bits).
 * The loop's bits: muon_momentum's d, sumsq's order, normalize_fro_bf16's
 * scalar and rounding; d never stored (8 bytes an element less). */
struct muon_list {
    __nv_bfloat16 *x[MT_OPS_LIST_MAX];
    float         *m[MT_OPS_LIST_MAX];
    const float   *g[MT_OPS_LIST_MAX];
    size_t         n[MT_OPS_LIST_MAX];
};

static __global__ void muon_prep_pass1_k(double *partial, struct muon_list L, float mu, float gs)
{
    const int t = blockIdx.y;
    sumsq_partials(partial + (size_t)t * MT_CUDA_RED_BLOCKS, ld_muon{L.m[t], L.g[t], mu, gs}, L.n[t]);
}

/* block t: sumsq_pass2_k's sum of matrix t's partials, into out[t] */
static __global__ void sumsq_pass2_rows_k(double *out, const double *partial)
{
    __shared__ double s[MT_CUDA_RED_THREADS];
    const double *p = partial + (size_t)blockIdx.x * MT_CUDA_RED_BLOCKS;
    double acc = 0.0;
    for (int i = threadIdx.x; i < MT_CUDA_RED_BLOCKS; i += MT_CUDA_RED_THREADS) acc += p[i];
    s[threadIdx.x] = acc;
    block_tree_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

static __global__ void muon_prep_scale_k(struct muon_list L, const double *ss, double eps, float mu, float gs)
{
    const int t = blockIdx.y;
    const float b = (float)(1.0 / (sqrt(ss[t]) + eps));
    const float *m = L.m[t], *g = L.g[t];
    __nv_bfloat16 *x = L.x[t];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < L.n[t]; i += (size_t)gridDim.x * blockDim.x)
        x[i] = mt_cuda_bf16_rn(__fmul_rn(b, mt_cuda_muon_dir(m, g, mu, gs, i)));
}

extern "C" void mt_cuda_muon_prep_bf16_multi(void *be, mt_bf16 *const *x, float *const *m, const float *const *g,
                                             const size_t *n, int count, float mu, float gscale, double eps,
                                             float *d)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    (void)d;            /* never stored: recomputed from m and g */
    if (count <= 0) return;
    const int lc = count < MT_OPS_LIST_MAX ? count : MT_OPS_LIST_MAX;
    double *part = (double *)mt_cuda_workspace((size_t)lc * (MT_CUDA_RED_BLOCKS + 1) * sizeof(double));
    if (!part) return;
    double *ss = part + (size_t)lc * MT_CUDA_RED_BLOCKS;
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        const int c = count - base < lc ? count - base : lc;
        struct muon_list L;
        memset(&L, 0, sizeof L);
        size_t nmax = 0;
        unsigned gx = 1;
        for (int t = 0; t < c; t++) {
            L.x[t] = (__nv_bfloat16 *)x[base + t];
            L.m[t] = m[base + t];
            L.g[t] = g[base + t];
            L.n[t] = n[base + t];
            if (L.n[t] > nmax) nmax = L.n[t];
            if (sumsq_grid_x(L.n[t]) > gx) gx = sumsq_grid_x(L.n[t]);
        }
        if (!nmax) continue;
        MT_LAUNCH(muon_prep_pass1_k, dim3(gx, (unsigned)c), MT_CUDA_RED_THREADS, 0)(part, L, mu, gscale);
        MT_CUDA_KCHECK();
        MT_LAUNCH(sumsq_pass2_rows_k, (unsigned)c, MT_CUDA_RED_THREADS, 0)(ss, part);
        MT_CUDA_KCHECK();
        MT_LAUNCH(muon_prep_scale_k, dim3(mt_cuda_blocks(nmax, THREADS), (unsigned)c), THREADS, 0)(L, ss, eps, mu,
                                                                                                   gscale);
        MT_CUDA_KCHECK();
    }
}

/* axpby_from_bf16_k on up to MT_OPS_LIST_MAX tensors, blockIdx.y the tensor */
struct axpby_bf16_list {
    float               *y[MT_OPS_LIST_MAX];
    const __nv_bfloat16 *x[MT_OPS_LIST_MAX];
    size_t               n[MT_OPS_LIST_MAX];
    float                a[MT_OPS_LIST_MAX], b[MT_OPS_LIST_MAX];
};

static __global__ void axpby_from_bf16_multi_k(struct axpby_bf16_list L)
{
    const int t = blockIdx.y;
    axpby_from_bf16_span(L.y[t], L.x[t], L.a[t], L.b[t], L.n[t]);
}

extern "C" void mt_cuda_axpby_from_bf16_multi(void *be, float *const *y, const mt_bf16 *const *x, const float *a,
                                              const float *b, const size_t *n, int count)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        const int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct axpby_bf16_list L;
        memset(&L, 0, sizeof L);
        size_t nmax = 0;
        for (int t = 0; t < c; t++) {
            L.y[t] = y[base + t];
            L.x[t] = (const __nv_bfloat16 *)x[base + t];
            L.n[t] = n[base + t];
            L.a[t] = a[base + t];
            L.b[t] = b[base + t];
            if (L.n[t] > nmax) nmax = L.n[t];
        }
        if (!nmax) continue;
        MT_LAUNCH(axpby_from_bf16_multi_k, dim3(mt_cuda_blocks(nmax, THREADS), (unsigned)c), THREADS, 0)(L);
        MT_CUDA_KCHECK();
    }
}

extern "C" void mt_cuda_normalize_fro(void *be, float *x, size_t n, double eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    const double *ss = fro_sumsq(x, n);
    MT_LAUNCH(scale_rnorm_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(x, ss, eps, n);
    MT_CUDA_KCHECK();
}

/* nonfinite_mark, for bandwidth (it reads every gradient once per step): tensor
 * t of a launch owns the blocks [b0[t], b0[t+1]) of a 1-D grid, about one per
 * MARK_PER_BLOCK elements (at least 1, at most mt_cuda_blocks' cap, the
 * threads stride over the rest), so no block is empty and the grid is about
 * sum(n) / MARK_PER_BLOCK blocks, not (blocks of the largest) x (tensors).
 * Each tensor is read as float4s from its first 16-byte boundary; the head
 * before it and the tail after the last whole float4 (at most 3 + 3
 * elements) are read one by one. The test per element is all_finite's, so
 * the same flags are set. */
#define MARK_PER_BLOCK (THREADS * 32)   /* 8 float4s per thread */
struct mark_list {
    const float *x[MT_OPS_LIST_MAX];
    size_t       n[MT_OPS_LIST_MAX];
    int          slot[MT_OPS_LIST_MAX];
    unsigned     b0[MT_OPS_LIST_MAX + 1];   /* first block of tensor t; b0[c] = the grid */
};

/* every writer stores the same NaN (deterministic) */
static __global__ void nonfinite_mark_k(float *flags, struct mark_list L, int c)
{
    int t = 0;   /* this block's tensor: the same for all its threads */
    while (t + 1 < c && blockIdx.x >= L.b0[t + 1]) t++;
    const float *x = L.x[t];
    const size_t n = L.n[t];
    /* head: the 0..3 floats before x's first 16-byte boundary (floats are 4-byte aligned) */
    size_t h = ((16u - ((uintptr_t)x & 15u)) & 15u) / 4u;
    if (h > n) h = n;
    const size_t nv = (n - h) / 4, rest = h + 4 * nv;   /* float4s, then the tail [rest, n) */
    const size_t i0 = (size_t)(blockIdx.x - L.b0[t]) * blockDim.x + threadIdx.x;
    const size_t st = (size_t)(L.b0[t + 1] - L.b0[t]) * blockDim.x;
    const uint32_t *u = (const uint32_t *)x;
    unsigned bad = 0;
#pragma unroll 4
    for (size_t i = i0; i < nv; i += st) {
        const float4 v = mt_ld_f4(x + h + 4 * i);
        bad |= nonfinite_bits(__float_as_uint(v.x)) | nonfinite_bits(__float_as_uint(v.y)) |
               nonfinite_bits(__float_as_uint(v.z)) | nonfinite_bits(__float_as_uint(v.w));
    }
    if (i0 < h) bad |= nonfinite_bits(u[i0]);                 /* block 0 of the tensor: h, n - rest <= 3 */
    if (i0 < n - rest) bad |= nonfinite_bits(u[rest + i0]);
    if (bad) flags[L.slot[t]] = __uint_as_float(0x7fc00000u);
}

extern "C" void mt_cuda_nonfinite_mark(void *be, float *flags, const float *const *x, const size_t *n, const int *slot,
                                       int count)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct mark_list L;
        memset(&L, 0, sizeof L);
        size_t total = 0;
        for (int t = 0; t < c; t++) {
            L.x[t] = x[base + t];
            L.n[t] = n[base + t];
            L.slot[t] = slot[base + t];
            L.b0[t + 1] = L.b0[t] + mt_cuda_blocks(L.n[t], MARK_PER_BLOCK);   /* MARK_PER_BLOCK items a block */
            total += L.n[t];
        }
        if (!total) continue;
        MT_LAUNCH(nonfinite_mark_k, L.b0[c], THREADS, 0)(flags, L, c);
        MT_CUDA_KCHECK();
    }
}
