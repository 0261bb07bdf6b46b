/*
 * fused.cu — the fused elementwise chains (mt_ops.h: rmsnorm_resid_forward,
 * qk_norm_rope_forward/backward), as in src/ops/cpu/fused.c.
 *
 *   rmsnorm_resid_forward  out = rmsnorm(x) * w, rstd;  resid = x
 *   qk_norm_rope_forward   q = rope(rmsnorm_hd(q_raw) * wq), k likewise
 *   qk_norm_rope_backward  g = R^T dq (into dq, in place); dq_raw =
 *                          rmsnorm_backward_hd(g) (=); dwq += sum_rows g * xhat
 *                          (k likewise)
 *
 * One warp per row (a residual row, or one head of q or k: rows 0..N*H-1 are
 * q's heads, N*H..N*H+N*K-1 k's, one launch for both), lane-strided sums and
 * the butterfly combine of rmsnorm.cu, so the norms round as rmsnorm.cu's.
 * The rotation is written as the FMAs fused.c uses (fmaf(a,c,-(b s)),
 * fmaf(b,c,a s)). dw is rmsnorm.cu's fixed-order two-pass column reduction
 * (chunks of DW_ROWS rows in row order, then the chunks in order) over the
 * g left in dq, dk, q's and k's in the same two launches (blockIdx.z).
 * Deterministic, no atomics.
 */
#include "cuda_impl.cuh"

#include <math.h>

#define ROWS_PER_BLOCK 8   /* warps per block */
#define DW_ROWS        64  /* rows per dw partial (more when a side has > 65535 * 64 rows) */
#define DW_THREADS     128

static __device__ __forceinline__ float rot_lo(float a, float b, float c, float s) { return fmaf(a, c, -(b * s)); }
static __device__ __forceinline__ float rot_hi(float a, float b, float c, float s) { return fmaf(b, c, a * s); }

/* ob: NULL, or the bf16 twin of out written by the same store loop (precision=bf16) */
static __global__ void rms_resid_k(float *out, __nv_bfloat16 *ob, float *rstd, float *resid, const float *inp,
                                   const float *w, int N, int C, float eps)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (n >= N) return;
    const float *x = inp + (size_t)n * (size_t)C;
    float *o = out + (size_t)n * (size_t)C, *s = resid + (size_t)n * (size_t)C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += MT_WARP) ss += x[c] * x[c];
    ss = mt_warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[n] = r;
    for (int c = lane; c < C; c += MT_WARP) {
        float v = x[c];   /* the lane reads its element before writing it: resid may alias inp */
        float y = v * r * w[c];
        o[c] = y;
        s[c] = v;
        if (ob) ob[(size_t)n * (size_t)C + (size_t)c] = mt_cuda_bf16_rn(y);
    }
}

/* The head of row `row` of the concatenated (q rows, k rows) view. */
struct qk_row {
    size_t off;   /* element offset of the head in its buffer */
    int    is_k;  /* 0: q, 1: k */
    int    n;     /* token row (position pos0 + n % T) */
};
static __device__ __forceinline__ qk_row qk_locate(int row, int N, int H, int K, int hd)
{
    qk_row r;
    int nq = N * H;
    r.is_k = row >= nq;
    int hr = r.is_k ? row - nq : row;
    r.n = r.is_k ? hr / K : hr / H;
    r.off = (size_t)hr * (size_t)hd;
    return r;
}

static __global__ void qk_fwd_k(float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (row >= N * (H + K)) return;
    qk_row l = qk_locate(row, N, H, K, hd);
    const float *x = (l.is_k ? k_raw : q_raw) + l.off, *w = l.is_k ? wk : wq;
    float *o = (l.is_k ? k : q) + l.off;
    int half = hd / 2, p = pos0 + l.n % T;
    const float *cs = cos_tab + (size_t)p * (size_t)half, *sn = sin_tab + (size_t)p * (size_t)half;
    float ss = 0.0f;
    for (int c = lane; c < hd; c += MT_WARP) ss += x[c] * x[c];
    ss = mt_warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    if (lane == 0) (l.is_k ? rstd_k : rstd_q)[row - (l.is_k ? N * H : 0)] = r;
    for (int i = lane; i < half; i += MT_WARP) {
        float a = x[i] * r * w[i], b = x[i + half] * r * w[i + half];
        o[i]        = rot_lo(a, b, cs[i], sn[i]);
        o[i + half] = rot_hi(a, b, cs[i], sn[i]);
    }
}

/* One warp per head: lane l owns the pairs (i, i+half), i = l + 32 j, so it
 * reads both elements of a pair before writing g = R^T d back (in place, no
 * other lane touches them), sums its terms of mean_c(g w xhat) and later
 * reads back only its own g. */
static __global__ void qk_bwd_dx_k(float *dq_raw, float *dk_raw, float *dq, float *dk, const float *q_raw,
                                   const float *k_raw, const float *wq, const float *wk, const float *rstd_q,
                                   const float *rstd_k, const float *cos_tab, const float *sin_tab, int N, int T,
                                   int H, int K, int hd)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (row >= N * (H + K)) return;
    qk_row l = qk_locate(row, N, H, K, hd);
    float *d = (l.is_k ? dk : dq) + l.off, *dx = (l.is_k ? dk_raw : dq_raw) + l.off;
    const float *x = (l.is_k ? k_raw : q_raw) + l.off, *w = l.is_k ? wk : wq;
    float r = l.is_k ? rstd_k[row - N * H] : rstd_q[row];
    int half = hd / 2, p = l.n % T;
    const float *cs = cos_tab + (size_t)p * (size_t)half, *sn = sin_tab + (size_t)p * (size_t)half;
    float dot = 0.0f;
    for (int i = lane; i < half; i += MT_WARP) {
        float a = d[i], b = d[i + half];
        float g0 = rot_lo(a, b, cs[i], -sn[i]), g1 = rot_hi(a, b, cs[i], -sn[i]);
        d[i] = g0;
        d[i + half] = g1;
        dot += g0 * w[i] * x[i];
        dot += g1 * w[i + half] * x[i + half];
    }
    dot = mt_warp_sum(dot);
    float mean = dot * r / (float)hd;  /* mean_c(g*w*xhat) */
    for (int i = lane; i < half; i += MT_WARP) {
        dx[i] = r * (d[i] * w[i] - x[i] * r * mean);
        dx[i + half] = r * (d[i + half] * w[i + half] - x[i + half] * r * mean);
    }
}

/* partial[z][chunk][c] = sum over the chunk's rows (in order) of g*x*rstd; z = 0: q, 1: k */
static __global__ void qk_bwd_dw1_k(float *partial, const float *gq, const float *gk, const float *q_raw,
                                    const float *k_raw, const float *rstd_q, const float *rstd_k, int N, int H,
                                    int K, int hd, int rows_q, int rows_k, int nchunk_q)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y, z = blockIdx.z;
    int nrow = N * (z ? K : H), rows = z ? rows_k : rows_q;
    int n0 = chunk * rows, n1 = n0 + rows < nrow ? n0 + rows : nrow;
    if (c >= hd || n0 >= nrow) return;
    const float *g = z ? gk : gq, *x = z ? k_raw : q_raw, *rs = z ? rstd_k : rstd_q;
    float acc = 0.0f;
    for (int row = n0; row < n1; row++) {
        size_t e = (size_t)row * (size_t)hd + (size_t)c;
        acc += g[e] * x[e] * rs[row];
    }
    partial[((size_t)(z ? nchunk_q : 0) + (size_t)chunk) * (size_t)hd + (size_t)c] = acc;
}

static __global__ void qk_bwd_dw2_k(float *dwq, float *dwk, const float *partial, int nchunk_q, int nchunk_k, int hd)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, z = blockIdx.y;
    float *dw = z ? dwk : dwq;
    if (c >= hd || !dw) return;   /* NULL: a frozen gain (LoRA), no gradient storage */
    int k0 = z ? nchunk_q : 0, nk = z ? nchunk_k : nchunk_q;
    float acc = 0.0f;
    for (int k = 0; k < nk; k++) acc += partial[(size_t)(k0 + k) * (size_t)hd + (size_t)c];
    dw[c] += acc;
}

extern "C" void mt_cuda_rmsnorm_resid_forward(void *be, float *out, float *rstd, float *resid, const float *inp,
                                              const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(rms_resid_k, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (out, (__nv_bfloat16 *)NULL, rstd, resid, inp, weight, N, C, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_rmsnorm_resid_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, float *resid,
                                                   const float *inp, const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(rms_resid_k, (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (out, (__nv_bfloat16 *)out_bf16, rstd, resid, inp, weight, N, C, eps);
    MT_CUDA_KCHECK();
}

extern "C" void mt_cuda_qk_norm_rope_forward(void *be, float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                             const float *k_raw, const float *wq, const float *wk,
                                             const float *cos_tab, const float *sin_tab, int N, int T, int pos0,
                                             int H, int K, int hd, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int rows = N * (H + K);
    if (rows <= 0 || hd <= 0) return;
    MT_LAUNCH(qk_fwd_k, (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (q, k, rstd_q, rstd_k, q_raw, k_raw, wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd, eps);
    MT_CUDA_KCHECK();
}

/* rows per dw chunk for `nrow` rows: DW_ROWS, doubled while the grid's y would pass 65535 */
static int dw_rows(int nrow)
{
    int rows = DW_ROWS;
    while ((nrow + rows - 1) / rows > 65535) rows *= 2;
    return rows;
}

extern "C" void mt_cuda_qk_norm_rope_backward(void *be, float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                              float *dk, const float *q_raw, const float *k_raw,
                                              const float *wq, const float *wk, const float *rstd_q,
                                              const float *rstd_k, const float *cos_tab, const float *sin_tab,
                                              int N, int T, int H, int K, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    int rows = N * (H + K);
    if (rows <= 0 || hd <= 0) return;
    int rq = dw_rows(N * H), rk = dw_rows(N * K);
    int ncq = (N * H + rq - 1) / rq, nck = (N * K + rk - 1) / rk;
    float *partial = (float *)mt_cuda_workspace((size_t)(ncq + nck) * (size_t)hd * sizeof(float));
    if (!partial) return;
    MT_LAUNCH(qk_bwd_dx_k, (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * MT_WARP, 0)
        (dq_raw, dk_raw, dq, dk, q_raw, k_raw, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab, N, T, H, K, hd);
    MT_CUDA_KCHECK();
    if (!dwq && !dwk) return;   /* both gains frozen (LoRA): dx only */
    dim3 g1((unsigned)((hd + DW_THREADS - 1) / DW_THREADS), (unsigned)(ncq > nck ? ncq : nck), 2u);
    MT_LAUNCH(qk_bwd_dw1_k, g1, DW_THREADS, 0)
        (partial, dq, dk, q_raw, k_raw, rstd_q, rstd_k, N, H, K, hd, rq, rk, ncq);
    MT_CUDA_KCHECK();
    dim3 g2((unsigned)((hd + DW_THREADS - 1) / DW_THREADS), 2u);
    MT_LAUNCH(qk_bwd_dw2_k, g2, DW_THREADS, 0)(dwq, dwk, partial, ncq, nck, hd);
    MT_CUDA_KCHECK();
}
