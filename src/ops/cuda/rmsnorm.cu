/*
 * rmsnorm.cu — RMSNorm forward/backward (also QK-norm: rows N*H, C = hd).
 *
 *   forward:  rstd = 1 / sqrt(mean_c(x^2) + eps),  out = x * rstd * w
 *   backward: xhat = x * rstd
 *     term 1  dw += sum_n dout * xhat                                   (+=)
 *     term 2  dx  = rstd * (dout*w - xhat * mean_c(dout * w * xhat))   (= or +=)
 *
 * Row layout (every path, so the bits depend on C only): a row is owned by a
 * group of G lanes, G = the power of two >= ceil(C/4) capped at 32 (C = 64:
 * 16 lanes, two rows a warp; C > 128: the whole warp). Lane l owns the
 * columns 4 l + 4 G j + i (i < 4, j = 0, 1, ...), sums its squares in that
 * order (fmaf), and the group combines by the butterfly xor G/2 .. 1. The
 * vector path (C % 4 == 0, 16-byte aligned pointers, C <= 2048) loads a
 * float4 per (lane, j) once and keeps the row in registers between the sum
 * and the store; the scalar path (anything else) reads the same columns in
 * the same order with scalar loads: the same bits.
 *
 * Backward, vector path (C <= 2048): one kernel. Each row group walks a
 * chunk of R consecutive rows in row order, writes dx, and keeps the dw
 * terms of its columns in registers (float4 per (lane, j)); at the chunk's
 * end it writes them as the chunk's partial (nchunk, C). A fixed-order
 * column reduction (rms_bwd_dw2_k: 32 slices of the chunks, each in chunk
 * order, then a fixed tree) adds them to dw. The scalar path keeps the
 * original warp-per-row dx kernel and the column pass rms_bwd_dw1_k (chunks
 * of DW_ROWS rows), then the same reduction. Deterministic, no atomics.
 *
 * Traffic (fp32, N rows of C): forward reads x once and writes out (+ the
 * bf16 twin, + resid for rmsnorm_resid_forward, fused.cu); backward reads
 * dout and x once (+ dx when accumulating), writes dx and nchunk x C partials.
 */
#include "cuda_impl.cuh"

#include <math.h>

#define ROWS_PER_BLOCK 8   /* warps per block (scalar backward) */
#define DW_ROWS        64  /* rows per dw partial (more when N > 65535 * 64) */
#define DW_THREADS     128
#define RMS_THREADS    256 /* threads per block of the row-group kernels */
#define RMS_VEC_MAX_C  2048
#define DWR_COLS       32  /* rms_bwd_dw2_k: columns per block */
#define DWR_SLICES     32  /*                chunk slices per block */

/* log2 of the lanes per row for C columns: G = pow2 >= ceil(C/4), <= 32 */
int mt_cuda_rms_lanes_log2(int C)
{
    int lg = 0;
    while (lg < 5 && (4 << lg) < C) lg++;
    return lg;
}


/* Forward, vector path: NV float4 per lane in registers. ob: NULL or the bf16
 * twin; out: NULL where the twin alone is wanted (both bf16 entries); resid:
 * NULL or the copy of inp (may alias inp: a lane loads its elements before it
 * stores them, no other lane touches them). */
template <int NV>
static __global__ void __launch_bounds__(RMS_THREADS)
rms_fwd_vec_k(float *out, __nv_bfloat16 *ob, float *rstd, float *resid, const float *inp, const float *w, int N,
              int C, int lg, float eps)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1));
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= (size_t)N) return;   /* the warp's first row: uniform */
    size_t n = t >> lg;
    bool live = n < (size_t)N;
    size_t base = live ? n * (size_t)C : 0;
    float4 xv[NV];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int c = 4 * (l + G * j);
        if (live && c < C) {
            xv[j] = mt_ld_f4(inp + base + c);
            ss = mt_rms_sq4(xv[j], ss);
        } else {
            xv[j] = float4{0.0f, 0.0f, 0.0f, 0.0f};
        }
    }
    ss = mt_rms_group_sum(ss, G);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (!live) return;
    if (l == 0) rstd[n] = r;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int c = 4 * (l + G * j);
        if (c >= C) break;
        float4 wv = mt_ld_f4(w + c), x = xv[j], y;
        y.x = x.x * r * wv.x;
        y.y = x.y * r * wv.y;
        y.z = x.z * r * wv.z;
        y.w = x.w * r * wv.w;
        if (out) mt_st_f4(out + base + c, y);
        if (resid) mt_st_f4(resid + base + c, x);
        if (ob) mt_st_bf16x4(ob + base + c, y);
    }
}

/* Forward, scalar path: the same columns, order and expressions. */
static __global__ void __launch_bounds__(RMS_THREADS)
rms_fwd_k(float *out, __nv_bfloat16 *ob, float *rstd, float *resid, const float *inp, const float *w, int N, int C,
          int lg, float eps)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1));
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= (size_t)N) return;
    size_t n = t >> lg;
    bool live = n < (size_t)N;
    const float *x = inp + (live ? n * (size_t)C : 0);
    float ss = 0.0f;
    if (live)
        for (int c0 = 4 * l; c0 < C; c0 += 4 * G)
            for (int i = 0; i < 4 && c0 + i < C; i++) ss = fmaf(x[c0 + i], x[c0 + i], ss);
    ss = mt_rms_group_sum(ss, G);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (!live) return;
    if (l == 0) rstd[n] = r;
    size_t base = n * (size_t)C;
    for (int c0 = 4 * l; c0 < C; c0 += 4 * G)
        for (int i = 0; i < 4 && c0 + i < C; i++) {
            int c = c0 + i;
            float v = x[c];   /* read before the write: resid may alias inp */
            float y = v * r * w[c];
            if (out) out[base + c] = y;
            if (resid) resid[base + c] = v;
            if (ob) ob[base + c] = mt_cuda_bf16_rn(y);
        }
}

/* Backward, vector path. Row group gi = chunk gi: rows gi*R .. gi*R+R-1 in
 * order; dw terms in registers, written to partial[gi] (NULL: dx only).
 * NV <= 8 keeps x and dout in registers between the dot and the store;
 * larger rows load them again (L1). */
template <int NV, typename DT>
static __global__ void __launch_bounds__(RMS_THREADS)
rms_bwd_vec_k(float *dinp, __nv_bfloat16 *dinp_b, float *partial, const DT *dout, const float *inp, const float *w,
              const float *rstd, int N, int C, int lg, int R, int accumulate)
{
    const bool cache = NV <= 8;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1));
    size_t nchunk = ((size_t)N + (size_t)R - 1) / (size_t)R, gi = t >> lg;
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= nchunk) return;
    bool cl = gi < nchunk;
    float4 acc[NV], xv[cache ? NV : 1], gv[cache ? NV : 1];
#pragma unroll
    for (int j = 0; j < NV; j++) acc[j] = float4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < (cache ? NV : 1); j++) xv[j] = gv[j] = float4{0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < R; i++) {
        size_t n = gi * (size_t)R + (size_t)i;
        bool live = cl && n < (size_t)N;
        size_t base = live ? n * (size_t)C : 0;
        float r = live ? rstd[n] : 0.0f, dot = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            int c = 4 * (l + G * j);
            if (live && c < C) {
                float4 x = mt_ld_f4(inp + base + c), g = mt_ld4(dout + base + c), wv = mt_ld_f4(w + c);
                if (cache) xv[cache ? j : 0] = x, gv[cache ? j : 0] = g;
                dot = fmaf(g.x * wv.x, x.x, dot);
                dot = fmaf(g.y * wv.y, x.y, dot);
                dot = fmaf(g.z * wv.z, x.z, dot);
                dot = fmaf(g.w * wv.w, x.w, dot);
            }
        }
        dot = mt_rms_group_sum(dot, G);
        if (!live) continue;
        float mean = dot * r / (float)C;  /* mean_c(dout*w*xhat) */
#pragma unroll
        for (int j = 0; j < NV; j++) {
            int c = 4 * (l + G * j);
            if (c >= C) break;
            float4 x = cache ? xv[cache ? j : 0] : mt_ld_f4(inp + base + c);
            float4 g = cache ? gv[cache ? j : 0] : mt_ld4(dout + base + c);
            float4 wv = mt_ld_f4(w + c), v;
            v.x = r * (g.x * wv.x - x.x * r * mean);
            v.y = r * (g.y * wv.y - x.y * r * mean);
            v.z = r * (g.z * wv.z - x.z * r * mean);
            v.w = r * (g.w * wv.w - x.w * r * mean);
            if (accumulate) {
                float4 d = mt_ld_f4(dinp + base + c);
                v.x = d.x + v.x;
                v.y = d.y + v.y;
                v.z = d.z + v.z;
                v.w = d.w + v.w;
            }
            mt_st_f4(dinp + base + c, v);
            if (dinp_b) mt_st_bf16x4(dinp_b + base + c, v);   /* the final d inp's twin */
            acc[j].x += g.x * x.x * r;
            acc[j].y += g.y * x.y * r;
            acc[j].z += g.z * x.z * r;
            acc[j].w += g.w * x.w * r;
        }
    }
    if (!partial || !cl) return;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        int c = 4 * (l + G * j);
        if (c < C) mt_st_f4(partial + gi * (size_t)C + c, acc[j]);
    }
}

/* Backward, scalar path: one warp per row (lane-strided sums). */
template <typename DT>
static __global__ void rms_bwd_dx_k(float *dinp, __nv_bfloat16 *dinp_b, const DT *dout, const float *inp,
                                    const float *w, const float *rstd, int N, int C, int accumulate)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (n >= N) return;
    const float *x = inp + (size_t)n * (size_t)C;
    const DT *g = dout + (size_t)n * (size_t)C;
    float *dx = dinp + (size_t)n * (size_t)C;
    float r = rstd[n], dot = 0.0f;
    for (int c = lane; c < C; c += MT_WARP) dot += mt_ld1(g + c) * w[c] * x[c];
    dot = mt_warp_sum(dot);
    float mean = dot * r / (float)C;  /* mean_c(dout*w*xhat) */
    for (int c = lane; c < C; c += MT_WARP) {
        float v = r * (mt_ld1(g + c) * w[c] - x[c] * r * mean);
        v = accumulate ? dx[c] + v : v;
        dx[c] = v;
        if (dinp_b) dinp_b[(size_t)n * (size_t)C + (size_t)c] = mt_cuda_bf16_rn(v);
    }
}

/* scalar path: partial[chunk][c] = sum over the chunk's rows (in order) of dout*x*rstd */
template <typename DT>
static __global__ void rms_bwd_dw1_k(float *partial, const DT *dout, const float *inp, const float *rstd,
                                     int N, int C, int rows)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int n0 = chunk * rows, n1 = n0 + rows < N ? n0 + rows : N;
    float acc = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t e = (size_t)n * (size_t)C + (size_t)c;
        acc += mt_ld1(dout + e) * inp[e] * rstd[n];
    }
    partial[(size_t)chunk * (size_t)C + (size_t)c] = acc;
}

/* dw (side blockIdx.y: dw0 over partial rows 0..nc0-1, dw1 over the next
 * nc1) += the column sums of the partials: slice s sums the chunks s, s +
 * DWR_SLICES, ... in order, then a fixed tree over the slices. NULL dw: skip. */
static __global__ void __launch_bounds__(DWR_COLS * DWR_SLICES)
rms_bwd_dw2_k(float *dw0, float *dw1, const float *partial, int nc0, int nc1, int C)
{
    __shared__ float sh[DWR_SLICES][DWR_COLS + 1];
    int z = blockIdx.y, tx = threadIdx.x % DWR_COLS, s = threadIdx.x / DWR_COLS;
    float *dw = z ? dw1 : dw0;
    if (!dw) return;   /* uniform over the block */
    int c = blockIdx.x * DWR_COLS + tx, nk = z ? nc1 : nc0;
    const float *p = partial + (size_t)(z ? nc0 : 0) * (size_t)C;
    float acc = 0.0f;
    if (c < C)
        for (int k = s; k < nk; k += DWR_SLICES) acc += p[(size_t)k * (size_t)C + (size_t)c];
    sh[s][tx] = acc;
    __syncthreads();
    for (int h = DWR_SLICES / 2; h > 0; h >>= 1) {
        if (s < h) sh[s][tx] += sh[s + h][tx];
        __syncthreads();
    }
    if (s == 0 && c < C) dw[c] += sh[0][tx];
}

void mt_cuda_rms_dw_reduce(float *dw0, float *dw1, const float *partial, int nc0, int nc1, int C)
{
    dim3 g((unsigned)((C + DWR_COLS - 1) / DWR_COLS), dw1 || nc1 ? 2u : 1u);
    MT_LAUNCH(rms_bwd_dw2_k, g, DWR_COLS * DWR_SLICES, 0)(dw0, dw1, partial, nc0, nc1, C);
    MT_CUDA_KCHECK();
}

/* blocks of RMS_THREADS for `groups` row groups of 1 << lg lanes */
static unsigned rms_blocks(size_t groups, int lg)
{
    size_t threads = groups << lg;
    return (unsigned)((threads + RMS_THREADS - 1) / RMS_THREADS);
}

/* float4 per lane for C columns (vector path, C <= RMS_VEC_MAX_C) */
static int rms_nv(int C)
{
    int nv = (C + 127) / 128;
    static const int sizes[] = {1, 2, 3, 4, 6, 8, 12, 16};
    for (int s : sizes)
        if (nv <= s) return s;
    return 0;
}

#define RMS_NV_SWITCH(nv, KERN, GRID, ...)                                                     \
    switch (nv) {                                                                              \
    case 1:  MT_LAUNCH(KERN<1>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 2:  MT_LAUNCH(KERN<2>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 3:  MT_LAUNCH(KERN<3>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 4:  MT_LAUNCH(KERN<4>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 6:  MT_LAUNCH(KERN<6>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 8:  MT_LAUNCH(KERN<8>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                    \
    case 12: MT_LAUNCH(KERN<12>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                   \
    default: MT_LAUNCH(KERN<16>, GRID, RMS_THREADS, 0)(__VA_ARGS__); break;                   \
    }

/* RMS_NV_SWITCH for rms_bwd_vec_k<NV, DT> (two template arguments) */
template <typename DT>
static void rms_bwd_vec_launch(int nv, unsigned blocks, float *dinp, __nv_bfloat16 *dinp_b, float *partial,
                               const DT *dout, const float *inp, const float *w, const float *rstd, int N, int C,
                               int lg, int R, int accumulate)
{
#define RMS_BWD_CASE(NV) \
    MT_LAUNCH((rms_bwd_vec_k<NV, DT>), blocks, RMS_THREADS, 0)(dinp, dinp_b, partial, dout, inp, w, rstd, N, C, lg, R, \
                                                              accumulate)
    switch (nv) {
    case 1:  RMS_BWD_CASE(1); break;
    case 2:  RMS_BWD_CASE(2); break;
    case 3:  RMS_BWD_CASE(3); break;
    case 4:  RMS_BWD_CASE(4); break;
    case 6:  RMS_BWD_CASE(6); break;
    case 8:  RMS_BWD_CASE(8); break;
    case 12: RMS_BWD_CASE(12); break;
    default: RMS_BWD_CASE(16); break;
    }
#undef RMS_BWD_CASE
}

/* rows of rmsnorm_forward (resid: NULL) and rmsnorm_resid_forward: one
 * kernel for both, so their out and rstd are the same bits by construction */
void mt_cuda_rms_rows_forward(float *out, __nv_bfloat16 *ob, float *rstd, float *resid, const float *inp,
                              const float *w, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    int lg = mt_cuda_rms_lanes_log2(C);
    unsigned blocks = rms_blocks((size_t)N, lg);
    bool vec = C % 4 == 0 && C <= RMS_VEC_MAX_C && mt_cuda_aligned(out, 16) && mt_cuda_aligned(inp, 16) &&
               mt_cuda_aligned(w, 16) && (!resid || mt_cuda_aligned(resid, 16)) && (!ob || mt_cuda_aligned(ob, 8));
    if (vec) {
        RMS_NV_SWITCH(rms_nv(C), rms_fwd_vec_k, blocks, out, ob, rstd, resid, inp, w, N, C, lg, eps)
    } else {
        MT_LAUNCH(rms_fwd_k, blocks, RMS_THREADS, 0)(out, ob, rstd, resid, inp, w, N, C, lg, eps);
    }
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_rmsnorm_forward(void *be, float *out, float *rstd, const float *inp, const float *weight,
                                        int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    mt_cuda_rms_rows_forward(out, NULL, rstd, NULL, inp, weight, N, C, eps);
}

extern "C" void mt_cuda_rmsnorm_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, const float *inp,
                                             const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    mt_cuda_rms_rows_forward(out, (__nv_bfloat16 *)out_bf16, rstd, NULL, inp, weight, N, C, eps);
}

/* both entries: dinp_b NULL, or where the final dinp's bf16 twin goes; dout of type DT
 * (float, or bf16: rmsnorm_backward_bf16's dout_b, read widened) */
template <typename DT>
static void rms_backward(float *dinp, __nv_bfloat16 *dinp_b, float *dweight, const DT *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C, int accumulate)
{
    if (N <= 0 || C <= 0) return;
    bool vec = C % 4 == 0 && C <= RMS_VEC_MAX_C && mt_cuda_aligned(dinp, 16) && mt_cuda_aligned(dout, 4 * sizeof(DT)) &&
               mt_cuda_aligned(inp, 16) && mt_cuda_aligned(weight, 16) && (!dinp_b || mt_cuda_aligned(dinp_b, 8));
    if (vec) {
        /* chunk rows: 64, halved (down to 8) while fewer than 1024 warps would run */
        int lg = mt_cuda_rms_lanes_log2(C), R = 64;
        while (R > 8 && ((((size_t)N + R - 1) / R) << lg) < (size_t)1024 * MT_WARP) R >>= 1;
        int nchunk = (int)(((size_t)N + R - 1) / R);
        float *partial = NULL;
        if (dweight) {
            partial = (float *)mt_cuda_workspace((size_t)nchunk * (size_t)C * sizeof(float));
            if (!partial) return;
            if (!mt_cuda_aligned(partial, 16)) vec = false;
        }
        if (vec) {
            unsigned blocks = rms_blocks((size_t)nchunk, lg);
            rms_bwd_vec_launch(rms_nv(C), blocks, dinp, dinp_b, partial, dout, inp, weight, rstd, N, C, lg, R,
                               accumulate);
            MT_CUDA_KCHECK();
            if (dweight) mt_cuda_rms_dw_reduce(dweight, NULL, partial, nchunk, 0, C);
            return;
        }
    }
    int rows = DW_ROWS;
    while ((N + rows - 1) / rows > 65535) rows *= 2;  /* grid.y limit */
    int nchunk = (N + rows - 1) / rows;
    float *partial = (float *)mt_cuda_workspace((size_t)nchunk * (size_t)C * sizeof(float));
    if (!partial) return;
    MT_LAUNCH(rms_bwd_dx_k<DT>, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (dinp, dinp_b, dout, inp, weight, rstd, N, C, accumulate);
    MT_CUDA_KCHECK();
    if (!dweight) return;   /* a frozen gain (LoRA base) has no gradient buffer: dx alone */
    dim3 g1((unsigned)((C + DW_THREADS - 1) / DW_THREADS), (unsigned)nchunk);
    MT_LAUNCH(rms_bwd_dw1_k<DT>, g1, DW_THREADS, 0)(partial, dout, inp, rstd, N, C, rows);
    MT_CUDA_KCHECK();
    mt_cuda_rms_dw_reduce(dweight, NULL, partial, nchunk, 0, C);
}

extern "C" void mt_cuda_rmsnorm_backward(void *be, float *dinp, float *dweight, const float *dout, const float *inp,
                                         const float *weight, const float *rstd, int N, int C, int accumulate)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    rms_backward(dinp, NULL, dweight, dout, inp, weight, rstd, N, C, accumulate);
}

extern "C" void mt_cuda_rmsnorm_backward_bf16(void *be, float *dinp, mt_bf16 *dinp_b, float *dweight, const float *dout,
                                              const float *inp, const float *weight, const float *rstd, int N, int C,
                                              int accumulate, const mt_bf16 *dout_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (dout_b)
        rms_backward(dinp, (__nv_bfloat16 *)dinp_b, dweight, (const __nv_bfloat16 *)dout_b, inp, weight, rstd, N, C,
                     accumulate);
    else
        rms_backward(dinp, (__nv_bfloat16 *)dinp_b, dweight, dout, inp, weight, rstd, N, C, accumulate);
}
