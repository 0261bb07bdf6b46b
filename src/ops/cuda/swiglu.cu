/*
 * swiglu.cu — SwiGLU: out = silu(g) * u, elementwise over n = N*F values.
 *
 *   silu(x) = x s, s = sigmoid(x) = 1 / (1 + exp(-x));  silu'(x) = s + x s (1 - s)
 *   backward: dg = dout * u * silu'(g),  du = dout * silu(g)   (both =)
 *
 * Invariant: one thread per element reads gate, up (and dout) before it
 * writes, so dgate/dup may alias gate/up.
 */
#include "cuda_impl.cuh"

#define THREADS 256

/* ob: NULL, or the bf16 twin of out written by the same thread (precision=bf16) */
static __global__ void swiglu_fwd_k(float *out, __nv_bfloat16 *ob, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        float s = 1.0f / (1.0f + expf(-g));
        float y = g * s * up[i];
        out[i] = y;
        if (ob) ob[i] = mt_cuda_bf16_rn(y);
    }
}

static __global__ void swiglu_bwd_k(float *dgate, float *dup, const float *dout, const float *gate,
                                    const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i], d = dout[i];
        float s = 1.0f / (1.0f + expf(-g));
        float silu = g * s;
        dgate[i] = d * u * (s + silu * (1.0f - s));
        dup[i]   = d * silu;
    }
}

extern "C" void mt_cuda_swiglu_forward(void *be, float *out, const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(swiglu_fwd_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(out, (__nv_bfloat16 *)NULL, gate, up, n);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_swiglu_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, const float *gate, const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(swiglu_fwd_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(out, (__nv_bfloat16 *)out_bf16, gate, up, n);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_swiglu_backward(void *be, float *dgate, float *dup, const float *dout, const float *gate,
                                        const float *up, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!n) return;
    MT_LAUNCH(swiglu_bwd_k, mt_cuda_blocks(n, THREADS), THREADS, 0)(dgate, dup, dout, gate, up, n);
    MT_CUDA_KCHECK();
}
