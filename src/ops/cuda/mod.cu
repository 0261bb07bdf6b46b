/*
 * mod.cu — Mixture-of-Depths routing on the device (mt_ops.h mod_route,
 * mod_backward; the cpu twin is src/ops/cpu/mod.c).
 *
 * Selection, per sequence b of T scores r: row t is selected iff
 *     rank(t) = #{t' : key(t') > key(t) or (key(t') == key(t) and t' < t)} < C,
 * key(t) = r[b,t], NaN mapped to -inf (a total order: ties to the lower
 * position). The rank is a count, not a sort, so it is exact and the same
 * rows as the cpu's whatever the thread split.
 *
 * mod_route_k, one block per sequence: the rows are taken in chunks of
 * MOD_THREADS (thread i owns row t0 + i); each thread counts the rows that
 * beat its row over shared-memory tiles of MOD_THREADS keys (O(T) compares a
 * row, skipped once the count reaches C); a block-wide exclusive scan of
 * the selected flags (warp shuffles, then the warp totals) plus the
 * selected count of the earlier chunks gives j, the row's place in
 * increasing t. Writes idx, tpos, slot, s = 1 / (1 + e^-r) (the cpu's
 * float expression) and, when the loss is asked for, the block's partial
 * sum of the BCE terms
 *     sel ? softplus(-r) : softplus(r),  softplus(x) = max(x, 0) + log1p(e^-|x|)
 * in double: each thread sums its rows in chunk order, then a fixed
 * shared-memory tree. mod_loss_k, one block, sums the B partials (strided
 * per thread, then the same tree) and writes coef * sum. Every order is a
 * function of B and T only: reruns give the same bits; no atomics and no
 * host round trip. The partials live in the backend's workspace (B doubles).
 *
 * mod_backward_k: grid-stride over the (N, D) elements of dx (selected rows
 * scaled by 1 - s, in place; others untouched), the first N indices also
 * writing dr = (sel ? dgate s (1 - s) : 0) + aux_scale (s - sel) (=).
 */
#include "cuda_impl.cuh"

#include <math.h>

/* one block per sequence, and B blocks are few: the widest block, so that
 * a thread has T / 1024 rows (each O(T) compares) rather than T / 256 */
#define MOD_THREADS 1024
#define MOD_WARPS   (MOD_THREADS / MT_WARP)
#define MOD_BWD_THREADS 256

/* r with NaN mapped to -inf, so that the order is total (the cpu's mod_key) */
static __device__ __forceinline__ float mod_key(float r) { return r != r ? -INFINITY : r; }

/* softplus(x) = log(1 + e^x), stable for either sign (the cpu's mod_softplus) */
static __device__ __forceinline__ double mod_softplus(double x) { return (x > 0 ? x : 0.0) + log1p(exp(-fabs(x))); }

/* The emulator checks that every lane reaches a shuffle from one call site,
 * and gcc split the first form of this scan (a conditional source lane and
 * add) into two copies of the shuffle: under emulation the scan is a
 * function of its own, its shuffle unconditional; nvcc inlines it. */
#ifdef MT_CUDA_EMU
#define MOD_SCAN_INLINE __attribute__((noinline))
#else
#define MOD_SCAN_INLINE __forceinline__
#endif
/* inclusive scan of v over the warp (Hillis-Steele: lane - o wraps, masked off below o) */
static __device__ MOD_SCAN_INLINE int mod_warp_scan(int v, int lane)
{
    for (int o = 1; o < MT_WARP; o <<= 1) {
        const int y = __shfl_sync(MT_FULL_MASK, v, (lane - o) & (MT_WARP - 1));
        v += lane >= o ? y : 0;
    }
    return v;
}

/* fixed tree over MOD_THREADS doubles in shared memory; every thread calls
 * it, the sum is in red[0] afterwards (the shape depends on MOD_THREADS only) */
static __device__ __forceinline__ void mod_tree(double *red, double v)
{
    red[threadIdx.x] = v;
    for (int w = MOD_THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    }
    __syncthreads();
}

static __global__ void __launch_bounds__(MOD_THREADS)
mod_route_k(int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *part, const float *r, int T, int C)
{
    __shared__ float  tile[MOD_THREADS];
    __shared__ int    wtot[MOD_WARPS];
    __shared__ double red[MOD_THREADS];
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid % MT_WARP, warp = tid / MT_WARP;
    const float *rb = r + (size_t)b * T;
    int base = 0;      /* rows selected in the earlier chunks (the same in every thread) */
    double acc = 0.0;  /* this thread's BCE terms, its rows in increasing t */
    for (int t0 = 0; t0 < T; t0 += MOD_THREADS) {
        const int t = t0 + tid, live = t < T;
        const float rt = live ? rb[t] : 0.0f, v = mod_key(rt);
        int beat = 0;
        for (int u0 = 0; u0 < T; u0 += MOD_THREADS) {
            __syncthreads();   /* the previous tile is read by everyone */
            if (u0 + tid < T) tile[tid] = mod_key(rb[u0 + tid]);
            __syncthreads();
            const int m = T - u0 < MOD_THREADS ? T - u0 : MOD_THREADS;
            if (live && beat < C)
                for (int i = 0; i < m; i++) {
                    const float w = tile[i];
                    beat += w > v || (w == v && u0 + i < t);
                }
        }
        const int sel = live && beat < C;
        /* exclusive scan of sel over the block: inclusive within the warp, then the earlier warps' totals */
        const int inc = mod_warp_scan(sel, lane);
        if (lane == MT_WARP - 1) wtot[warp] = inc;
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < MOD_WARPS; w++) {
            before += w < warp ? wtot[w] : 0;
            total += wtot[w];
        }
        if (live) {
            const size_t n = (size_t)b * T + t;
            if (sel) {
                const int j = base + before + inc - 1;
                idx[(size_t)b * C + j] = (int32_t)n;
                tpos[(size_t)b * C + j] = t;
                slot[n] = b * C + j;
            } else {
                slot[n] = -1;
            }
            s[n] = 1.0f / (1.0f + expf(-rt));
            if (part) acc += mod_softplus(sel ? -(double)rt : (double)rt);
        }
        base += total;   /* wtot is rewritten only after the next chunk's tile barriers */
    }
    if (!part) return;   /* uniform over the block */
    mod_tree(red, acc);
    if (tid == 0) part[b] = red[0];
}

/* one block: loss[0] = coef * (the B partials, strided per thread, then the tree) */
static __global__ void __launch_bounds__(MOD_THREADS) mod_loss_k(double *loss, const double *part, int B, float coef)
{
    __shared__ double red[MOD_THREADS];
    double acc = 0.0;
    for (int b = threadIdx.x; b < B; b += MOD_THREADS) acc += part[b];
    mod_tree(red, acc);
    if (threadIdx.x == 0) loss[0] = (double)coef * red[0];
}

static __global__ void mod_backward_k(float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot,
                                      int N, int D, float aux_scale)
{
    const size_t nd = (size_t)N * (size_t)(D > 0 ? D : 0), total = nd > (size_t)N ? nd : (size_t)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        if (e < (size_t)N) {
            const float sn = s[e];
            const int sel = slot[e] >= 0;
            dr[e] = (sel ? dgate[e] * sn * (1.0f - sn) : 0.0f) + aux_scale * (sn - (float)sel);
        }
        if (e < nd) {
            const size_t n = e / (size_t)D;
            if (slot[n] >= 0) dx[e] *= 1.0f - s[n];
        }
    }
}

extern "C" void mt_cuda_mod_route(void *be, int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss,
                                  const float *r, int B, int T, int C, float coef)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    const int rows = B > 0 && T > 0;
    double *part = NULL;
    if (loss && rows) {
        part = (double *)mt_cuda_workspace((size_t)B * sizeof(double));
        if (!part) return;   /* sticky OOM recorded by the workspace */
    }
    if (rows) {
        MT_LAUNCH(mod_route_k, (unsigned)B, MOD_THREADS, 0)(idx, tpos, slot, s, part, r, T, C);
        MT_CUDA_KCHECK();
    }
    if (loss) {   /* no rows: coef * 0, as the cpu */
        MT_LAUNCH(mod_loss_k, 1, MOD_THREADS, 0)(loss, (const double *)part, rows ? B : 0, coef);
        MT_CUDA_KCHECK();
    }
}

extern "C" void mt_cuda_mod_backward(void *be, float *dr, float *dx, const float *dgate, const float *s,
                                     const int32_t *slot, int N, int D, float aux_scale)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    const size_t nd = (size_t)N * (size_t)(D > 0 ? D : 0), total = nd > (size_t)N ? nd : (size_t)N;
    MT_LAUNCH(mod_backward_k, mt_cuda_blocks(total, MOD_BWD_THREADS), MOD_BWD_THREADS, 0)(dr, dx, dgate, s, slot, N,
                                                                                           D, aux_scale);
    MT_CUDA_KCHECK();
}
