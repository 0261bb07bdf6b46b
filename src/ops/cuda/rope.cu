/*
 * rope.cu — rotary position embedding, rotate-half form, in place allowed.
 *
 *   x viewed as (N, nh, hd), row n at position p = pos0 + n % T, i < hd/2:
 *   forward   out_i = x_i c - x_{i+h} s,   out_{i+h} = x_{i+h} c + x_i s
 *   backward  (R^T) dx_i = g_i c + g_{i+h} s,  dx_{i+h} = g_{i+h} c - g_i s   (=)
 *   with c = cos_tab[p, i], s = sin_tab[p, i], h = hd/2.
 *
 * One thread per pair (n, head, i): it reads both elements of its pair
 * before writing them, so out == inp is safe.
 */
#include "cuda_impl.cuh"

#define THREADS 256

static __global__ void rope_k(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                              int N, int T, int pos0, int nh, int hd, float sign)
{
    int half = hd / 2;
    size_t total = (size_t)N * (size_t)nh * (size_t)half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % (size_t)half);
        size_t row = e / (size_t)half;          /* n * nh + head */
        int n = (int)(row / (size_t)nh);
        int p = pos0 + n % T;
        float c = cos_tab[(size_t)p * (size_t)half + i], s = sign * sin_tab[(size_t)p * (size_t)half + i];
        size_t off = row * (size_t)hd;
        float a = inp[off + i], b = inp[off + i + half];
        out[off + i]        = a * c - b * s;
        out[off + i + half] = b * c + a * s;
    }
}

static void rope_apply(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                       int N, int T, int pos0, int nh, int hd, float sign)
{
    size_t total = (size_t)N * (size_t)nh * (size_t)(hd / 2);
    if (!total) return;
    MT_LAUNCH(rope_k, mt_cuda_blocks(total, THREADS), THREADS, 0)(out, inp, cos_tab, sin_tab, N, T, pos0, nh, hd, sign);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_rope_forward(void *be, float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                                     int N, int T, int pos0, int nh, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    rope_apply(out, inp, cos_tab, sin_tab, N, T, pos0, nh, hd, 1.0f);
}

extern "C" void mt_cuda_rope_backward(void *be, float *dinp, const float *dout, const float *cos_tab, const float *sin_tab,
                                      int N, int T, int pos0, int nh, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    rope_apply(dinp, dout, cos_tab, sin_tab, N, T, pos0, nh, hd, -1.0f);
}
