/*
 * xent.cu — fused (optionally softcapped) softmax cross-entropy.
 *
 *   s = c tanh(z / c) if c = softcap > 0, else s = z
 *   forward:  lse_n = log sum_v exp(s_nv);  loss_n = lse_n - s_n[t_n]  (0 if t_n == -1)
 *   backward: dz_nv = dscale (exp(s_nv - lse_n) - [v == t_n]) ds/dz,
 *             ds/dz = 1 - tanh^2(z/c) with softcap, 1 without;  row = 0 if t_n == -1.  (=)
 *
 * One block per row streams the row in chunks of THREADS columns; no
 * probability is ever stored (the backward writes the gradient directly).
 * Forward is one pass with an online log-sum-exp per thread (running max m
 * and sum s, rescaled when the max grows), then a shared-memory tree merges
 * the THREADS (m, s) pairs in a fixed order: deterministic.
 * Backward: each element is read and then written by the same thread, so
 * dlogits == logits (in place) is safe, the target column included.
 * xent_fused_bf16: the same backward storing only bf16(dz) (mt_cuda_bf16_rn,
 * the rounding gemm_bf16 applied per call to the fp32 dz): the lm head's
 * backward GEMMs read it as stored.
 *
 * A row that fits shared memory (V * 4 bytes <= the device's opt-in block
 * limit, 227 KiB on an H100: V <= 58112, every common vocabulary below
 * Llama 3's) runs the ROW kernel instead, one block of 1024 threads a row:
 * the row moves global -> shared once (cp.async, 16 bytes at a time, every
 * load in flight at once; scalar loads where the row is not 16-byte aligned),
 * then three passes over shared memory: the max M, the sum S = sum_v
 * exp(s_v - M) (thread i owns columns i, i + 1024, ...; fixed-order warp and
 * block trees: deterministic), lse = M + log S; then the backward's
 * expressions above (the same ones) writing dz or bf16(dz). DRAM traffic a
 * row: V * 4 read once and the gradient written (the two kernels read the
 * fp32 row twice: at GPT-2's V 50304 and 16384 rows, 3.3 GB less). With a
 * softcap the first pass turns z into th = tanh(z / c) in place (s = c th;
 * ds/dz = 1 - th^2, the expressions above). Every xent entry takes it when
 * the row fits (forward, fused, fused_bf16: the same bits among them); the
 * two-kernel path stays for wider rows.
 */
#include "cuda_impl.cuh"
#include "mma_sync.cuh"   /* mt_cp_async16 */

#include <math.h>

#define THREADS 256

static __device__ __forceinline__ float cap(float z, float c, float ic)
{
    return c > 0.0f ? c * tanhf(z * ic) : z;
}

/* (m, s) <- (m, s) + (m2, s2) in log-sum-exp space */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else {
        s = s + s2 * expf(m2 - m);
    }
}

static __global__ void __launch_bounds__(THREADS)
xent_fwd_k(float *losses, float *lse_out, const float *logits, const int32_t *targets, int V, float softcap)
{
    __shared__ float sm_m[THREADS], sm_s[THREADS];
    const int n = blockIdx.x;
    const float *z = logits + (size_t)n * (size_t)V;
    const float ic = softcap > 0.0f ? 1.0f / softcap : 0.0f;
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += THREADS) lse_merge(m, s, cap(z[v], softcap, ic), 1.0f);
    sm_m[threadIdx.x] = m;
    sm_s[threadIdx.x] = s;
    for (int w = THREADS / 2; w > 0; w >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < w) {
            float a = sm_m[threadIdx.x], b = sm_s[threadIdx.x];
            lse_merge(a, b, sm_m[threadIdx.x + w], sm_s[threadIdx.x + w]);
            sm_m[threadIdx.x] = a;
            sm_s[threadIdx.x] = b;
        }
    }
    if (threadIdx.x == 0) {
        float lse = sm_m[0] + logf(sm_s[0]);
        lse_out[n] = lse;
        int t = targets[n];
        losses[n] = t < 0 ? 0.0f : lse - cap(z[t], softcap, ic);
    }
}

/* TWIN = 0: dz (fp32, in place allowed); TWIN = 1: only dzb = bf16(dz), the
 * same value rounded (xent_fused_bf16: the fp32 store is skipped). */
template <bool TWIN>
static __global__ void __launch_bounds__(THREADS)
xent_bwd_k(float *dlogits, __nv_bfloat16 *dlogits_bf16, const float *logits, const float *lse,
           const int32_t *targets, float dscale, int V, float softcap)
{
    const int n = blockIdx.x;
    const float *z = logits + (size_t)n * (size_t)V;
    float *dz = TWIN ? NULL : dlogits + (size_t)n * (size_t)V;
    __nv_bfloat16 *dzb = TWIN ? dlogits_bf16 + (size_t)n * (size_t)V : NULL;
    const int t = targets[n];
    if (t < 0) {
        for (int v = threadIdx.x; v < V; v += THREADS) {
            if (TWIN) dzb[v] = mt_cuda_bf16_rn(0.0f);
            else      dz[v] = 0.0f;
        }
        return;
    }
    const float l = lse[n];
    if (softcap > 0.0f) {
        const float ic = 1.0f / softcap;
        for (int v = threadIdx.x; v < V; v += THREADS) {
            float th = tanhf(z[v] * ic);
            float p = expf(softcap * th - l) - (v == t ? 1.0f : 0.0f);
            float g = dscale * p * (1.0f - th * th);
            if (TWIN) dzb[v] = mt_cuda_bf16_rn(g);
            else      dz[v] = g;
        }
    } else {
        for (int v = threadIdx.x; v < V; v += THREADS) {
            float p = expf(z[v] - l) - (v == t ? 1.0f : 0.0f);
            float g = dscale * p;
            if (TWIN) dzb[v] = mt_cuda_bf16_rn(g);
            else      dz[v] = g;
        }
    }
}

/* ---- one row in shared memory ---- */
#define ROW_THREADS 1024
enum xent_row_mode { XR_FORWARD = 0, XR_FUSED = 1, XR_FUSED_BF16 = 2, XR_FUSED_BF16_LOGITS = 3 };

/* the two lane- and warp-dependent steps of xr_block_reduce, each called by
 * every thread (MT_WARP_STEP: the branch stays inside, away from the barriers) */
static __device__ MT_WARP_STEP void xr_put(float *red, float v, int lane, int warp)
{
    if (lane == 0) red[warp] = v;
}
template <bool MAX>
static __device__ MT_WARP_STEP void xr_warp0(float *red, int lane, int warp)
{
    if (warp != 0) return;
    float w = red[lane];   /* ROW_THREADS / 32 = 32 warps */
    w = MAX ? mt_warp_max(w) : mt_warp_sum(w);
    if (lane == 0) red[32] = w;
}

/* block-wide reduction of one value per thread (max or sum), fixed order:
 * the warp's xor tree, then warp 0's over the 32 warp results; all threads
 * get the result (red: 33 floats of shared memory) */
template <bool MAX>
static __device__ __forceinline__ float xr_block_reduce(float v, float *red)
{
    const int lane = threadIdx.x % MT_WARP, warp = threadIdx.x / MT_WARP;
    v = MAX ? mt_warp_max(v) : mt_warp_sum(v);
    xr_put(red, v, lane, warp);
    __syncthreads();
    xr_warp0<MAX>(red, lane, warp);
    __syncthreads();
    const float r = red[32];
    __syncthreads();   /* red is reused by the next reduction */
    return r;
}

/* The per-thread passes of xent_row_k over this thread's columns tid, tid +
 * 1024, ...: their trip counts differ between threads (V not a multiple of
 * 1024), so each is a step called by every thread (MT_WARP_STEP: the loop's
 * guard stays away from the barriers between them). */
/* global -> shared: the whole row in flight (vec: V % 4 == 0, 16-byte rows) */
static __device__ MT_WARP_STEP void xr_load(float *row, const float *z, int V, int vec)
{
    if (vec) {
        for (int c = threadIdx.x; c < V / 4; c += ROW_THREADS) mt_cp_async16(row + 4 * c, z + 4 * c, 16);
        mt_cp_async_commit();
        mt_cp_async_wait<0>();
    } else {
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) row[v] = z[v];
    }
}
/* the same from a bf16 row, widened (vec: V % 8 == 0, 16-byte rows: 8 values a
 * load). XR_AHEAD loads a thread ahead (mt_block_move: one at a time was 7 round
 * trips a row at V 50304; now 2), and the 8 values go to shared memory as two
 * float4 stores (eight scalar stores 32 bytes apart a lane were 8-way bank
 * conflicts) */
#define XR_AHEAD 4
static __device__ MT_WARP_STEP void xr_load_b(float *row, const __nv_bfloat16 *z, int V, int vec)
{
    if (vec) {
        mt_block_move<XR_AHEAD, uint4>(
            V / 8, [&](int c) { return *(const uint4 *)(z + 8 * c); },
            [&](int c, uint4 u) {
                /* a 16-byte store is served 8 lanes a phase; 8 lanes' 32-byte pieces span 256
                 * bytes, so lanes c and c + 4 would store to the same banks (2 wavefronts a
                 * phase): the upper four of each 8 store their second half first */
                const float4 lo = float4{mt_bf16_lo(u.x), mt_bf16_hi(u.x), mt_bf16_lo(u.y), mt_bf16_hi(u.y)};
                const float4 hi = float4{mt_bf16_lo(u.z), mt_bf16_hi(u.z), mt_bf16_lo(u.w), mt_bf16_hi(u.w)};
                const int swap = (c >> 2) & 1;
                *(float4 *)(row + 8 * c + 4 * swap) = swap ? hi : lo;
                *(float4 *)(row + 8 * c + 4 * (1 - swap)) = swap ? lo : hi;
            });
    } else {
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) row[v] = __bfloat162float(z[v]);
    }
}
/* this thread's max of s_v; with a softcap the row becomes th_v = tanh(z_v / c) (s = c th) */
static __device__ MT_WARP_STEP float xr_max(float *row, int V, float softcap)
{
    float mx = -INFINITY;
    if (softcap > 0.0f) {
        const float ic = 1.0f / softcap;
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
            const float th = tanhf(row[v] * ic);
            row[v] = th;
            mx = fmaxf(mx, softcap * th);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) mx = fmaxf(mx, row[v]);
    }
    return mx;
}
/* this thread's sum of exp(c row_v - M) (c = softcap, or 1: s_v = c row_v) */
static __device__ MT_WARP_STEP float xr_sum(const float *row, int V, float c, float M)
{
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += ROW_THREADS) sum += expf(c * row[v] - M);
    return sum;
}
/* thread 0: lse and the loss */
static __device__ MT_WARP_STEP void xr_loss(float *losses, float *lse_out, const float *row, int n, int t, float c,
                                            float l)
{
    if (threadIdx.x != 0) return;
    lse_out[n] = l;
    losses[n] = t < 0 ? 0.0f : l - c * row[t];
}
/* the backward's expressions (xent_bwd_k) on this thread's columns: dz or bf16(dz) */
template <bool TWIN>
static __device__ MT_WARP_STEP void xr_grad(float *dz, __nv_bfloat16 *dzb, const float *row, int V, int t, float l,
                                            float dscale, float softcap)
{
    for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
        float g = 0.0f;
        if (t >= 0) {
            if (softcap > 0.0f) {
                const float th = row[v];
                const float p = expf(softcap * th - l) - (v == t ? 1.0f : 0.0f);
                g = dscale * p * (1.0f - th * th);
            } else {
                const float p = expf(row[v] - l) - (v == t ? 1.0f : 0.0f);
                g = dscale * p;
            }
        }
        if (TWIN) dzb[v] = mt_cuda_bf16_rn(g);
        else dz[v] = g;
    }
}

template <int MODE>
static __global__ void __launch_bounds__(ROW_THREADS)
xent_row_k(float *losses, float *lse_out, float *dlogits, __nv_bfloat16 *dlogits_bf16, const float *logits,
           const __nv_bfloat16 *logits_b, const int32_t *targets, float dscale, int V, float softcap, int vec)
{
    MT_DYN_SMEM(float, row);
    __shared__ float red[33];
    const int n = blockIdx.x;
    /* bf16 logits: the twin below goes over the same row, read whole by now (the barriers between) */
    if (MODE == XR_FUSED_BF16_LOGITS) xr_load_b(row, logits_b + (size_t)n * (size_t)V, V, vec);
    else xr_load(row, logits + (size_t)n * (size_t)V, V, vec);
    __syncthreads();
    const float c = softcap > 0.0f ? softcap : 1.0f;
    const float M = xr_block_reduce<true>(xr_max(row, V, softcap), red);
    const float S = xr_block_reduce<false>(xr_sum(row, V, c, M), red);
    const float l = M + logf(S);
    const int t = targets[n];
    xr_loss(losses, lse_out, row, n, t, c, l);
    if (MODE == XR_FUSED) xr_grad<false>(dlogits + (size_t)n * (size_t)V, NULL, row, V, t, l, dscale, softcap);
    if (MODE == XR_FUSED_BF16 || MODE == XR_FUSED_BF16_LOGITS)
        xr_grad<true>(NULL, dlogits_bf16 + (size_t)n * (size_t)V, row, V, t, l, dscale, softcap);
}

/* the ROW kernel when the row fits the block's shared memory (opt-in limit
 * read once per instance); 0: the two-kernel path */
template <int MODE>
static int xent_row(float *losses, float *lse_out, float *dlogits, __nv_bfloat16 *dlogits_bf16, const float *logits,
                    const int32_t *targets, float dscale, int N, int V, float softcap,
                    const __nv_bfloat16 *logits_b = NULL)
{
    const size_t smem = (size_t)V * sizeof(float);
    if (V < 1 || smem > (size_t)mt_cuda_be->smem_optin_bytes) return 0;
    if (!mt_cuda_smem_opt_in(xent_row_k<MODE>, smem)) return 0;
    const int vec = logits_b ? V % 8 == 0 && ((uintptr_t)logits_b & 15) == 0 : V % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    MT_LAUNCH(xent_row_k<MODE>, N, ROW_THREADS, smem)(losses, lse_out, dlogits, dlogits_bf16, logits, logits_b, targets,
                                                     dscale, V, softcap, vec);
    MT_CUDA_KCHECK();
    return 1;
}

extern "C" void mt_cuda_xent_forward(void *be, float *losses, float *lse_out, const float *logits, const int32_t *targets,
                                     int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    if (xent_row<XR_FORWARD>(losses, lse_out, NULL, NULL, logits, targets, 0.0f, N, V, softcap)) return;
    MT_LAUNCH(xent_fwd_k, N, THREADS, 0)(losses, lse_out, logits, targets, V, softcap);
    MT_CUDA_KCHECK();
}

/* xent_fused (fp32 dlogits in place over the logits): the ROW kernel, or the
 * forward kernel then the backward kernel */
extern "C" void mt_cuda_xent_fused(void *be, float *losses, float *lse_out, float *logits, const int32_t *targets,
                                   float dscale, int N, int V, float softcap)
{
    MT_CUDA_BIND(be);
    if (N <= 0) return;
    if (xent_row<XR_FUSED>(losses, lse_out, logits, NULL, logits, targets, dscale, N, V, softcap)) return;
    MT_LAUNCH(xent_fwd_k, N, THREADS, 0)(losses, lse_out, logits, targets, V, softcap);
    MT_CUDA_KCHECK();
    MT_LAUNCH(xent_bwd_k<false>, N, THREADS, 0)(logits, (__nv_bfloat16 *)NULL, logits, lse_out, targets, dscale, V,
                                                softcap);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_xent_backward(void *be, float *dlogits, const float *logits, const float *lse,
                                      const int32_t *targets, float dscale, int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    MT_LAUNCH(xent_bwd_k<false>, N, THREADS, 0)(dlogits, (__nv_bfloat16 *)NULL, logits, lse, targets, dscale, V, softcap);
    MT_CUDA_KCHECK();
}

/* xent_fused_bf16 (mt_ops.h): the ROW kernel, or the forward kernel then the
 * backward kernel storing only the bf16 twin (logits is read, not written:
 * consumed) */
extern "C" void mt_cuda_xent_fused_bf16(void *be, float *losses, float *lse_out, float *logits, mt_bf16 *dlogits_bf16,
                                        const int32_t *targets, float dscale, int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    if (xent_row<XR_FUSED_BF16>(losses, lse_out, NULL, (__nv_bfloat16 *)dlogits_bf16, logits, targets, dscale, N, V,
                                softcap))
        return;
    MT_LAUNCH(xent_fwd_k, N, THREADS, 0)(losses, lse_out, logits, targets, V, softcap);
    MT_CUDA_KCHECK();
    MT_LAUNCH(xent_bwd_k<true>, N, THREADS, 0)((float *)NULL, (__nv_bfloat16 *)dlogits_bf16, logits, lse_out, targets, dscale, V,
                                               softcap);
    MT_CUDA_KCHECK();
}

/* xent_fused_bf16_logits (mt_ops.h): the ROW kernel reading the bf16 row and
 * writing the twin over it; a row too long for shared memory widens the
 * logits into workspace first and runs xent_fused_bf16's two kernels on them
 * (the twin back over logits_b) */
extern "C" void mt_cuda_xent_fused_bf16_logits(void *be, float *losses, float *lse_out, mt_bf16 *logits_b,
                                               const int32_t *targets, float dscale, int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    __nv_bfloat16 *zb = (__nv_bfloat16 *)logits_b;
    if (xent_row<XR_FUSED_BF16_LOGITS>(losses, lse_out, NULL, zb, NULL, targets, dscale, N, V, softcap, zb)) return;
    float *z = (float *)mt_cuda_workspace((size_t)N * (size_t)V * sizeof(float));
    if (!z) return;
    mt_cuda_widen_bf16(be, z, logits_b, (size_t)N * (size_t)V);
    mt_cuda_xent_fused_bf16(be, losses, lse_out, z, logits_b, targets, dscale, N, V, softcap);
}
