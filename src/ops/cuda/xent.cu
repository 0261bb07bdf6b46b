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
 */
#include "cuda_impl.cuh"

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

extern "C" void mt_cuda_xent_forward(void *be, float *losses, float *lse_out, const float *logits, const int32_t *targets,
                                     int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    MT_LAUNCH(xent_fwd_k, N, THREADS, 0)(losses, lse_out, logits, targets, V, softcap);
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

/* xent_fused_bf16 (mt_ops.h): the forward kernel, then the backward kernel
 * storing only the bf16 twin (logits is read, not written: consumed) */
extern "C" void mt_cuda_xent_fused_bf16(void *be, float *losses, float *lse_out, float *logits, mt_bf16 *dlogits_bf16,
                                        const int32_t *targets, float dscale, int N, int V, float softcap)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0) return;
    MT_LAUNCH(xent_fwd_k, N, THREADS, 0)(losses, lse_out, logits, targets, V, softcap);
    MT_CUDA_KCHECK();
    MT_LAUNCH(xent_bwd_k<true>, N, THREADS, 0)((float *)NULL, (__nv_bfloat16 *)dlogits_bf16, logits, lse_out, targets, dscale, V,
                                               softcap);
    MT_CUDA_KCHECK();
}
