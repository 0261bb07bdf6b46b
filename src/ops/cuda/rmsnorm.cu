/*
 * rmsnorm.cu — RMSNorm forward/backward (also QK-norm: rows N*H, C = hd).
 *
 *   forward:  rstd = 1 / sqrt(mean_c(x^2) + eps),  out = x * rstd * w
 *   backward: xhat = x * rstd
 *     term 1  dw += sum_n dout * xhat                                   (+=)
 *     term 2  dx  = rstd * (dout*w - xhat * mean_c(dout * w * xhat))   (= or +=)
 *
 * One warp per row for the row-wise parts (lane-strided sums, butterfly
 * combine). dw is a fixed-order two-pass column reduction: pass 1 sums rows
 * in chunks of DW_ROWS (in row order) into partials (nchunk, C), pass 2 sums
 * the partials in chunk order and adds to dw. Deterministic, no atomics.
 */
#include "cuda_impl.cuh"

#include <math.h>

#define ROWS_PER_BLOCK 8   /* warps per block */
#define DW_ROWS        64  /* rows per dw partial (more when N > 65535 * 64) */
#define DW_THREADS     128

/* ob: NULL, or the bf16 copy of out written by the same store loop (precision=bf16) */
static __global__ void rms_fwd_k(float *out, __nv_bfloat16 *ob, float *rstd, const float *inp, const float *w, int N,
                                 int C, float eps)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (n >= N) return;
    const float *x = inp + (size_t)n * (size_t)C;
    float *o = out + (size_t)n * (size_t)C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += MT_WARP) ss += x[c] * x[c];
    ss = mt_warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[n] = r;
    if (!ob) {
        for (int c = lane; c < C; c += MT_WARP) o[c] = x[c] * r * w[c];
        return;
    }
    __nv_bfloat16 *b = ob + (size_t)n * (size_t)C;
    for (int c = lane; c < C; c += MT_WARP) {
        float v = x[c] * r * w[c];
        o[c] = v;
        b[c] = mt_cuda_bf16_rn(v);
    }
}

static __global__ void rms_bwd_dx_k(float *dinp, const float *dout, const float *inp, const float *w,
                                    const float *rstd, int N, int C, int accumulate)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (n >= N) return;
    const float *x = inp + (size_t)n * (size_t)C, *g = dout + (size_t)n * (size_t)C;
    float *dx = dinp + (size_t)n * (size_t)C;
    float r = rstd[n], dot = 0.0f;
    for (int c = lane; c < C; c += MT_WARP) dot += g[c] * w[c] * x[c];
    dot = mt_warp_sum(dot);
    float mean = dot * r / (float)C;  /* mean_c(dout*w*xhat) */
    for (int c = lane; c < C; c += MT_WARP) {
        float v = r * (g[c] * w[c] - x[c] * r * mean);
        dx[c] = accumulate ? dx[c] + v : v;
    }
}

/* partial[chunk][c] = sum over the chunk's rows (in order) of dout*x*rstd */
static __global__ void rms_bwd_dw1_k(float *partial, const float *dout, const float *inp, const float *rstd,
                                     int N, int C, int rows)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int n0 = chunk * rows, n1 = n0 + rows < N ? n0 + rows : N;
    float acc = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t e = (size_t)n * (size_t)C + (size_t)c;
        acc += dout[e] * inp[e] * rstd[n];
    }
    partial[(size_t)chunk * (size_t)C + (size_t)c] = acc;
}

static __global__ void rms_bwd_dw2_k(float *dweight, const float *partial, int nchunk, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < nchunk; k++) acc += partial[(size_t)k * (size_t)C + (size_t)c];
    dweight[c] += acc;
}

extern "C" void mt_cuda_rmsnorm_forward(void *be, float *out, float *rstd, const float *inp, const float *weight,
                                        int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(rms_fwd_k, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (out, (__nv_bfloat16 *)NULL, rstd, inp, weight, N, C, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_rmsnorm_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, const float *inp,
                                             const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(rms_fwd_k, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (out, (__nv_bfloat16 *)out_bf16, rstd, inp, weight, N, C, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_rmsnorm_backward(void *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                         const float *weight, const float *rstd, int N, int C, int accumulate)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    int rows = DW_ROWS;
    while ((N + rows - 1) / rows > 65535) rows *= 2;  /* grid.y limit */
    int nchunk = (N + rows - 1) / rows;
    float *partial = (float *)mt_cuda_workspace((size_t)nchunk * (size_t)C * sizeof(float));
    if (!partial) return;
    MT_LAUNCH(rms_bwd_dx_k, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (dinp, dout, inp, weight, rstd, N, C, accumulate);
    MT_CUDA_KCHECK();
    if (!dweight) return;   /* a frozen gain (LoRA base) has no gradient buffer: dx alone */
    dim3 g1((unsigned)((C + DW_THREADS - 1) / DW_THREADS), (unsigned)nchunk);
    MT_LAUNCH(rms_bwd_dw1_k, g1, DW_THREADS, 0)(partial, dout, inp, rstd, N, C, rows);
    MT_CUDA_KCHECK();
    MT_LAUNCH(rms_bwd_dw2_k, (C + DW_THREADS - 1) / DW_THREADS, DW_THREADS, 0)(dweight, partial, nchunk, C);
    MT_CUDA_KCHECK();
}
