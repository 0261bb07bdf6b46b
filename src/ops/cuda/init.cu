/*
 * init.cu — a parameter's normal init on the device (mt_ops.h init_normal),
 * with the host's bits: issue 28 item 1 (time to the first step; before, a
 * 1.5B-parameter model spent ~7 s of its 7.7 s to the first step drawing
 * normals on the host, then copied them over).
 *
 *   out[e] = (float)(std * z(gi)),  z = sqrt(-2 ln u1) cos(2 pi u2)  (mt_rng.h: u1, u2
 *   the uniforms 2 gi, 2 gi + 1), e = i cols + j, gi = (off0 + i) shape1 + off1 + j
 *
 * The uniforms are integer work and one exact scaling (mt_rng_uniform_inline,
 * shared with the host), so they are the host's bits. log and cos are
 * not: the device's libm is not glibc's (a few ulps of double apart at
 * most; sqrt is correctly rounded on both). So each value v is also checked: if the
 * float rounding of v - delta |v| and of v + delta |v| agree (rounding is
 * monotone), every double within delta |v| of v — the host's among them —
 * rounds to the same float, and v's float is the host's. Where they differ
 * (v within delta |v| of a rounding boundary: about 2 delta / 2^-23.5 of the
 * elements, ~2e-5 at delta 2^-40) the element is marked and the host
 * computes it with its own libm (mt_rng_normal) and writes it in. delta =
 * 2^-40 is 2^12 ulps of double: ~600 times the worst the two sides can
 * differ (log 1 + 1 ulp, halved by sqrt, cos 2 + 1, the roundings: ~7 ulps).
 *
 * Marks without atomics: thread t of T takes elements t, t + T, ... (K of
 * them, K <= 255: coalesced stores) and writes one word, its mark count
 * (bits 0-7) and the k of its first three marks (bits 8-15, 16-23, 24-31);
 * a thread with more than three has all its elements recomputed on the host
 * (at ~2e-5 a mark and K 255: never seen, handled). The words come back
 * (4 T bytes, ~0.4% of the box's) and the fixed values go out in one copy,
 * written by one scatter launch. Deterministic: the same bits every run.
 *
 * Under the emulator the kernel runs with glibc's libm, so no value differs;
 * MT_EMU_LIBM_ULPS=k (tests/cuda/emu) moves each log and cos result k ulps,
 * a device libm that is not the host's, for cuda_ops_vs_cpu's init group.
 */
#include "cuda_impl.cuh"

extern "C" {
#include "../../core/mt_rng.h"
}

#include <math.h>

#define INIT_DELTA  0x1p-40   /* relative: the host's v lies within delta |v| of the device's */
#define INIT_K      255       /* elements a thread at most (its k fits a byte) */
#define INIT_SLOTS  3         /* marks a word holds */
#define INIT_THREADS 256

#ifdef MT_CUDA_EMU
#define INIT_LIBM(x) mt_emu_libm(x)   /* MT_EMU_LIBM_ULPS: a libm k ulps off glibc's */
#else
#define INIT_LIBM(x) (x)
#endif

/* z of global index gi: mt_rng_normal's expression, operation for operation */
static __device__ __forceinline__ double init_z(uint64_t seed, uint64_t stream, uint64_t gi)
{
    const double u1 = mt_rng_uniform_inline(seed, stream, 2 * gi);
    const double u2 = mt_rng_uniform_inline(seed, stream, 2 * gi + 1);
    return sqrt(-2.0 * INIT_LIBM(log(u1))) * INIT_LIBM(cos(6.283185307179586 * u2));
}

static __global__ void init_normal_k(float *out, size_t n, size_t cols, int64_t off0, int64_t off1, int64_t shape1,
                                     uint64_t seed, uint64_t stream, double sd, uint32_t *marks)
{
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, T = (size_t)gridDim.x * blockDim.x;
    uint32_t word = 0, c = 0;
    for (uint32_t k = 0; k < INIT_K && t + (size_t)k * T < n; k++) {
        const size_t e = t + (size_t)k * T, i = e / cols;
        const uint64_t gi = mt_rng_box_index(off0, off1, shape1, (int64_t)i, (int64_t)(e - i * cols));
        const double v = sd * init_z(seed, stream, gi), w = fabs(v) * INIT_DELTA;
        out[e] = (float)v;
        if ((float)(v - w) != (float)(v + w)) {   /* the host's v may round to the other float */
            if (c < INIT_SLOTS) word |= k << (8 + 8 * c);
            c++;
        }
    }
    marks[t] = word | c;
}

static __global__ void init_scatter_k(float *out, const uint64_t *idx, const float *val, size_t m)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m; i += (size_t)gridDim.x * blockDim.x)
        out[idx[i]] = val[i];
}

/* the host's value of element e of the box (model.c init_value's NORMAL case) */
static float init_host_value(size_t e, size_t cols, int64_t off0, int64_t off1, int64_t shape1, uint64_t seed,
                             uint64_t stream, float std)
{
    const size_t i = e / cols;
    return (float)((double)std * mt_rng_normal(seed, stream, mt_rng_box_index(off0, off1, shape1, (int64_t)i,
                                                                                (int64_t)(e - i * cols))));
}

extern "C" void mt_cuda_init_normal(void *be, float *out, size_t rows, size_t cols, int64_t off0, int64_t off1,
                                    int64_t shape1, uint64_t seed, uint64_t stream, float std)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    const size_t n = rows * cols;
    if (!n) return;
    const size_t per_thread = (n + INIT_K - 1) / INIT_K;
    const size_t blocks = (per_thread + INIT_THREADS - 1) / INIT_THREADS, T = blocks * INIT_THREADS;
    uint32_t *marks = (uint32_t *)mt_cuda_workspace(T * sizeof(uint32_t));
    uint32_t *h = (uint32_t *)malloc(T * sizeof(uint32_t));
    if (!marks || !h) {   /* the workspace's OOM is recorded; the host's is said here */
        if (!h) mt_cuda_record(MT_ERR_OOM, "init_normal", "host marks", __FILE__, __LINE__);
        free(h);
        return;
    }
    MT_LAUNCH(init_normal_k, dim3((unsigned)blocks), INIT_THREADS, 0)(out, n, cols, off0, off1, shape1, seed, stream,
                                                                       (double)std, marks);
    MT_CUDA_KCHECK();
    MT_CUDA_CHECK(mt_cuda_memcpy(h, marks, T * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
    size_t m = 0, cap = 0;
    uint64_t *idx = NULL;
    float *val = NULL;
    for (size_t t = 0; t < T && mt_cuda_be->err == MT_OK; t++) {
        const uint32_t c = h[t] & 255u;
        for (uint32_t s = 0; s < (c > INIT_SLOTS ? INIT_K : c); s++) {   /* > 3 marks: all its elements */
            const size_t k = c > INIT_SLOTS ? s : (h[t] >> (8 + 8 * s)) & 255u, e = t + k * T;
            if (e >= n) break;
            if (m == cap) {
                cap = cap ? 2 * cap : 1024;
                uint64_t *ni = (uint64_t *)realloc(idx, cap * sizeof *idx);
                float *nv = ni ? (float *)realloc(val, cap * sizeof *val) : NULL;
                if (ni) idx = ni;
                if (!nv) {
                    mt_cuda_record(MT_ERR_OOM, "init_normal", "host fix list", __FILE__, __LINE__);
                    break;
                }
                val = nv;
            }
            idx[m] = e;
            val[m++] = init_host_value(e, cols, off0, off1, shape1, seed, stream, std);
        }
    }
    free(h);
    mt_cuda_be->info.init_normal_elems += (long long)n;   /* the receipt's gpu.param_init_device_elements */
    mt_cuda_be->info.init_normal_host_fixes += (long long)m;
    if (m && mt_cuda_be->err == MT_OK) {   /* the host's values in: one copy, one launch */
        unsigned char *ws = (unsigned char *)mt_cuda_workspace(m * (sizeof *idx + sizeof *val));
        if (ws) {
            MT_CUDA_CHECK(mt_cuda_memcpy(ws, idx, m * sizeof *idx, cudaMemcpyHostToDevice));
            MT_CUDA_CHECK(mt_cuda_memcpy(ws + m * sizeof *idx, val, m * sizeof *val, cudaMemcpyHostToDevice));
            MT_LAUNCH(init_scatter_k, mt_cuda_blocks(m, INIT_THREADS), INIT_THREADS, 0)
                (out, (const uint64_t *)ws, (const float *)(ws + m * sizeof *idx), m);
            MT_CUDA_KCHECK();
            MT_CUDA_CHECK(mt_cuda_stream_sync());   /* idx, val are host memory freed below */
        }
    }
    free(idx);
    free(val);
}
