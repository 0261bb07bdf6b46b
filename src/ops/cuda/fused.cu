/*
 * fused.cu — the fused elementwise chains (mt_ops.h: rmsnorm_resid_forward,
 * qk_norm_rope_forward/backward), as in src/ops/cpu/fused.c.
 *
 *   rmsnorm_resid_forward  out = rmsnorm(x) * w, rstd;  resid = x
 *   qk_norm_rope_forward   q = rope(rmsnorm_hd(q_raw) * wq), k likewise
 *   qk_norm_rope_backward  g = R^T dq (into dq, in place); dq_raw =
 *                          rmsnorm_backward_hd(g) (=); dwq += sum_rows g * xhat
 *                          (k likewise); its _bf16 form stores dq_raw, dk_raw
 *                          as bf16 only (and, on the vector path, not g)
 *
 * rmsnorm_resid_forward is rmsnorm.cu's forward kernel itself (with its
 * resid store on): the same bits as rmsnorm_forward by construction.
 *
 * QK rows (one head of q or k: rows 0..N*H-1 are q's heads, N*H..N*H+N*K-1
 * k's, one launch for both) use rmsnorm.cu's row layout: a group of G lanes
 * per row, G = pow2 >= ceil(hd/4) (hd = 64: 16 lanes, two heads a warp),
 * lane l owning the columns 4 l + 4 G j + i, squares summed in that order
 * (fmaf), butterfly over the group: rstd is rmsnorm_forward's to the bit.
 * Vector path (hd a power of two in 8..128, 16-byte aligned pointers): one
 * float4 per lane; the RoPE partner of column c (c +- hd/2) is lane l ^ G/2's
 * same slot, exchanged by shuffle. The backward walks a chunk of R heads of
 * one side (q or k) per group in row order, writing g in place and dx, and
 * keeps its columns' dw terms in registers: partial (chunks, hd), q's chunks
 * then k's, summed by rmsnorm.cu's fixed-order column reduction. Otherwise
 * (scalar path) the pair loop below, lane-strided over the group, and the
 * column pass qk_bwd_dw1_k (chunks of DW_ROWS rows). The rotation is written
 * as the FMAs fused.c uses (fmaf(a,c,-(b s)), fmaf(b,c,a s)). Deterministic,
 * no atomics.
 */
#include "cuda_impl.cuh"

#include <math.h>
#include <type_traits>

#define ROWS_PER_BLOCK 8   /* warps per block */
#define DW_ROWS        64  /* rows per dw partial (more when a side has > 65535 * 64 rows) */
#define DW_THREADS     128

static __device__ __forceinline__ float rot_lo(float a, float b, float c, float s) { return fmaf(a, c, -(b * s)); }
static __device__ __forceinline__ float rot_hi(float a, float b, float c, float s) { return fmaf(b, c, a * s); }

#define QK_THREADS 256

static __device__ __forceinline__ float4 qk_shfl4(float4 v, int o)
{
    float4 r;
    r.x = __shfl_xor_sync(MT_FULL_MASK, v.x, o);
    r.y = __shfl_xor_sync(MT_FULL_MASK, v.y, o);
    r.z = __shfl_xor_sync(MT_FULL_MASK, v.z, o);
    r.w = __shfl_xor_sync(MT_FULL_MASK, v.w, o);
    return r;
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

/* the backward's output offset of head row hr (token hr / per, head hr % per; per: H
 * or K heads a token) in a buffer whose token rows are ld apart (0: per hd, dense) */
static __device__ __forceinline__ size_t qk_out_off(int hr, int per, int hd, int ld)
{
    if (!ld) return (size_t)hr * (size_t)hd;
    const int n = hr / per;
    return (size_t)n * (size_t)ld + (size_t)(hr - n * per) * (size_t)hd;
}

/* a rotary pair's two results, o[i] and o[i + half]: fp32, or rounded once to
 * bf16 (OB: T is __nv_bfloat16) */
template <int OB, typename T>
static __device__ __forceinline__ void st_pair(T *o, int i, int half, float v0, float v1)
{
    if constexpr (OB) {
        o[i] = mt_cuda_bf16_rn(v0);
        o[i + half] = mt_cuda_bf16_rn(v1);
    } else {
        o[i] = v0;
        o[i + half] = v1;
    }
}

/* Forward, scalar path: a group of G = 1 << lg lanes per head (rmsnorm.cu's
 * layout and order for the sum), the pairs (i, i+half) lane-strided over the
 * group. */
/* F: QK_OB (q, k stored bf16 only, qk_norm_rope_forward_bf16: each value rounded
 * once) | QK_XB (q_raw, k_raw stored bf16: gemm_bf16_out's outputs, widened) */
#define QK_OB 1
#define QK_XB 2
#define QK_OBXB 3   /* QK_OB | QK_XB (a name without spaces: the launch log's); QK_XB comes
                     * only with QK_OB: the bf16 entries alone take q_raw_b, k_raw_b */
#define QK_DB 4     /* backward, vector path: the incoming d q, d k are bf16 (the attention
                     * backward's dq_b, dk_b), with QK_OB only */
#define QK_OBDB 5   /* QK_OB | QK_DB */
#define QK_OBXBDB 7 /* QK_OB | QK_XB | QK_DB */
/* q_raw, k_raw's element type under flags F */
template <int F> using qk_xt = typename std::conditional<(F & QK_XB) != 0, __nv_bfloat16, float>::type;
template <int F>
static __global__ void __launch_bounds__(QK_THREADS)
qk_fwd_k(void *q, void *k, float *rstd_q, float *rstd_k, const void *q_raw, const void *k_raw,
         const float *wq, const float *wk, const float *cos_tab, const float *sin_tab, int N, int T, int pos0,
         int H, int K, int hd, int lg, float eps)
{
    constexpr int OB = F & QK_OB;
    typedef qk_xt<F> XT;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1)), rows = N * (H + K);
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= (size_t)rows) return;   /* the warp's first row: uniform */
    int row = (int)(t >> lg);
    bool live = row < rows;
    qk_row rl = qk_locate(live ? row : 0, N, H, K, hd);
    const XT *x = (const XT *)(rl.is_k ? k_raw : q_raw) + rl.off;
    const float *w = rl.is_k ? wk : wq;
    float ss = 0.0f;
    if (live)
        for (int c0 = 4 * l; c0 < hd; c0 += 4 * G)
            for (int i = 0; i < 4 && c0 + i < hd; i++) ss = fmaf(mt_ld1(x + c0 + i), mt_ld1(x + c0 + i), ss);
    ss = mt_rms_group_sum(ss, G);
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    if (!live) return;
    if (l == 0) (rl.is_k ? rstd_k : rstd_q)[row - (rl.is_k ? N * H : 0)] = r;
    typedef typename std::conditional<OB != 0, __nv_bfloat16, float>::type QT;
    QT *o = (QT *)(rl.is_k ? k : q) + rl.off;
    int half = hd / 2, p = pos0 + rl.n % T;
    const float *cs = cos_tab + (size_t)p * (size_t)half, *sn = sin_tab + (size_t)p * (size_t)half;
    for (int i = l; i < half; i += G) {
        float a = mt_ld1(x + i) * r * w[i], b = mt_ld1(x + i + half) * r * w[i + half];
        const float lo_v = rot_lo(a, b, cs[i], sn[i]), hi_v = rot_hi(a, b, cs[i], sn[i]);
        st_pair<OB>(o, i, half, lo_v, hi_v);
    }
}

/* Forward, vector path: hd = 4 G, one float4 per lane; lanes l < G/2 hold
 * the first half (a), l ^ G/2 the matching second half (b). */
template <int F>
static __global__ void __launch_bounds__(QK_THREADS)
qk_fwd_vec_k(void *q, void *k, float *rstd_q, float *rstd_k, const void *q_raw, const void *k_raw,
             const float *wq, const float *wk, const float *cos_tab, const float *sin_tab, int N, int T, int pos0,
             int H, int K, int hd, int lg, float eps)
{
    constexpr int OB = F & QK_OB;
    typedef qk_xt<F> XT;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1)), rows = N * (H + K);
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= (size_t)rows) return;
    int row = (int)(t >> lg);
    bool live = row < rows;
    qk_row rl = qk_locate(live ? row : 0, N, H, K, hd);
    float4 x = {0.0f, 0.0f, 0.0f, 0.0f}, y = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) x = mt_ld4((const XT *)(rl.is_k ? k_raw : q_raw) + rl.off + 4 * l);
    float ss = mt_rms_group_sum(mt_rms_sq4(x, 0.0f), G);
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    if (live) {
        float4 w = mt_ld_f4((rl.is_k ? wk : wq) + 4 * l);
        y.x = x.x * r * w.x;
        y.y = x.y * r * w.y;
        y.z = x.z * r * w.z;
        y.w = x.w * r * w.w;
    }
    float4 yp = qk_shfl4(y, G >> 1);   /* the partner half */
    if (!live) return;
    if (l == 0) (rl.is_k ? rstd_k : rstd_q)[row - (rl.is_k ? N * H : 0)] = r;
    int half = hd / 2, p = pos0 + rl.n % T, lo = l < (G >> 1), i = 4 * (lo ? l : l - (G >> 1));
    float4 cs = mt_ld_f4(cos_tab + (size_t)p * (size_t)half + i), sn = mt_ld_f4(sin_tab + (size_t)p * (size_t)half + i);
    float4 o;
    if (lo) {
        o.x = rot_lo(y.x, yp.x, cs.x, sn.x);
        o.y = rot_lo(y.y, yp.y, cs.y, sn.y);
        o.z = rot_lo(y.z, yp.z, cs.z, sn.z);
        o.w = rot_lo(y.w, yp.w, cs.w, sn.w);
    } else {
        o.x = rot_hi(yp.x, y.x, cs.x, sn.x);
        o.y = rot_hi(yp.y, y.y, cs.y, sn.y);
        o.z = rot_hi(yp.z, y.z, cs.z, sn.z);
        o.w = rot_hi(yp.w, y.w, cs.w, sn.w);
    }
    if constexpr (OB) mt_st_bf16x4((__nv_bfloat16 *)(rl.is_k ? k : q) + rl.off + 4 * l, o);
    else mt_st_f4((float *)(rl.is_k ? k : q) + rl.off + 4 * l, o);
}

/* Backward, vector path (hd = 4 G). Group gi = chunk gi of the concatenated
 * chunks (q's ncq chunks of R heads, then k's nck): its heads in order; per
 * head g = R^T d via the partner lane's d, g stored in place (each lane
 * stores only its own slot, after the exchange), dx = rstd (g w - xhat
 * mean_c(g w xhat)) (=), dw terms g x rstd in registers, written to
 * partial[gi] at the end (partial NULL: both gains frozen). */
/* F: QK_OB (d q_raw, d k_raw stored bf16 only, qk_norm_rope_backward_bf16; g
 * not stored) | QK_XB (q_raw, k_raw stored bf16) | QK_DB (d q, d k given as
 * bf16: dq, dk point at bf16, read widened) */
template <int F>
static __global__ void __launch_bounds__(QK_THREADS)
qk_bwd_vec_k(void *dq_raw, void *dk_raw, float *dq, float *dk, float *partial, const void *q_raw,
             const void *k_raw, const float *wq, const float *wk, const float *rstd_q, const float *rstd_k,
             const float *cos_tab, const float *sin_tab, int N, int T, int H, int K, int hd, int lg, int R,
             int ncq, int nck, int ldq_o, int ldk_o)
{
    constexpr int OB = F & QK_OB, DB = F & QK_DB;
    static_assert(!DB || OB, "a bf16 d in needs the bf16 d out (g is not stored)");
    typedef qk_xt<F> XT;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int G = 1 << lg, l = (int)(t & (size_t)(G - 1)), nch = ncq + nck;
    if (((t & ~(size_t)(MT_WARP - 1)) >> lg) >= (size_t)nch) return;
    int gi = (int)(t >> lg);
    bool cl = gi < nch;
    int is_k = gi >= ncq, lc = is_k ? gi - ncq : gi, per = is_k ? K : H, nrow = N * per;
    float *d = is_k ? dk : dq;
    void *dx = is_k ? dk_raw : dq_raw;
    const XT *xs = (const XT *)(is_k ? k_raw : q_raw);
    const float *rs = is_k ? rstd_k : rstd_q;
    int half = hd / 2, lo = l < (G >> 1), ii = 4 * (lo ? l : l - (G >> 1));
    float4 w = mt_ld_f4((is_k ? wk : wq) + 4 * l), acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < R; i++) {
        int hr = lc * R + i;
        bool live = cl && hr < nrow;
        size_t e = live ? (size_t)hr * (size_t)hd + (size_t)(4 * l) : 0;
        float4 dv = {0.0f, 0.0f, 0.0f, 0.0f}, x = {0.0f, 0.0f, 0.0f, 0.0f}, cs = dv, sn = dv, g;
        float r = 0.0f;
        if (live) {
            int p = (hr / per) % T;
            if constexpr (DB) dv = mt_ld4((const __nv_bfloat16 *)(const void *)d + e);
            else dv = mt_ld_f4(d + e);
            x = mt_ld4(xs + e);
            r = rs[hr];
            cs = mt_ld_f4(cos_tab + (size_t)p * (size_t)half + ii);
            sn = mt_ld_f4(sin_tab + (size_t)p * (size_t)half + ii);
        }
        float4 dp = qk_shfl4(dv, G >> 1);   /* the partner half, read before anyone stores */
        if (lo) {
            g.x = rot_lo(dv.x, dp.x, cs.x, -sn.x);
            g.y = rot_lo(dv.y, dp.y, cs.y, -sn.y);
            g.z = rot_lo(dv.z, dp.z, cs.z, -sn.z);
            g.w = rot_lo(dv.w, dp.w, cs.w, -sn.w);
        } else {
            g.x = rot_hi(dp.x, dv.x, cs.x, -sn.x);
            g.y = rot_hi(dp.y, dv.y, cs.y, -sn.y);
            g.z = rot_hi(dp.z, dv.z, cs.z, -sn.z);
            g.w = rot_hi(dp.w, dv.w, cs.w, -sn.w);
        }
        float dot = 0.0f;
        dot = fmaf(g.x * w.x, x.x, dot);
        dot = fmaf(g.y * w.y, x.y, dot);
        dot = fmaf(g.z * w.z, x.z, dot);
        dot = fmaf(g.w * w.w, x.w, dot);
        dot = mt_rms_group_sum(dot, G);
        if (!live) continue;
        if constexpr (!OB) mt_st_f4(d + e, g);
        float mean = dot * r / (float)hd;  /* mean_c(g*w*xhat) */
        float4 v;
        v.x = r * (g.x * w.x - x.x * r * mean);
        v.y = r * (g.y * w.y - x.y * r * mean);
        v.z = r * (g.z * w.z - x.z * r * mean);
        v.w = r * (g.w * w.w - x.w * r * mean);
        const size_t eo = qk_out_off(hr, per, hd, is_k ? ldk_o : ldq_o) + (size_t)(4 * l);   /* dx's rows */
        if constexpr (OB) mt_st_bf16x4((__nv_bfloat16 *)dx + eo, v);
        else mt_st_f4((float *)dx + eo, v);
        acc.x += g.x * x.x * r;
        acc.y += g.y * x.y * r;
        acc.z += g.z * x.z * r;
        acc.w += g.w * x.w * r;
    }
    if (partial && cl) mt_st_f4(partial + (size_t)gi * (size_t)hd + (size_t)(4 * l), acc);
}

/* Backward, scalar path. One warp per head: lane l owns the pairs (i, i+half), i = l + 32 j, so it
 * reads both elements of a pair before writing g = R^T d back (in place, no
 * other lane touches them), sums its terms of mean_c(g w xhat) and later
 * reads back only its own g. */
template <int F>   /* QK_OB: dx stored bf16 (each value rounded once); QK_XB: q_raw, k_raw stored bf16 */
static __global__ void qk_bwd_dx_k(void *dq_raw, void *dk_raw, float *dq, float *dk, const void *q_raw,
                                   const void *k_raw, const float *wq, const float *wk, const float *rstd_q,
                                   const float *rstd_k, const float *cos_tab, const float *sin_tab, int N, int T,
                                   int H, int K, int hd, int ldq_o, int ldk_o)
{
    constexpr int OB = F & QK_OB;
    typedef qk_xt<F> XT;
    typedef typename std::conditional<OB != 0, __nv_bfloat16, float>::type DX;
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / MT_WARP, lane = threadIdx.x % MT_WARP;
    if (row >= N * (H + K)) return;
    qk_row l = qk_locate(row, N, H, K, hd);
    float *d = (l.is_k ? dk : dq) + l.off;
    DX *dx = (DX *)(l.is_k ? dk_raw : dq_raw) +
             qk_out_off(l.is_k ? row - N * H : row, l.is_k ? K : H, hd, l.is_k ? ldk_o : ldq_o);   /* its rows */
    const XT *x = (const XT *)(l.is_k ? k_raw : q_raw) + l.off;
    const float *w = l.is_k ? wk : wq;
    float r = l.is_k ? rstd_k[row - N * H] : rstd_q[row];
    int half = hd / 2, p = l.n % T;
    const float *cs = cos_tab + (size_t)p * (size_t)half, *sn = sin_tab + (size_t)p * (size_t)half;
    float dot = 0.0f;
    for (int i = lane; i < half; i += MT_WARP) {
        float a = d[i], b = d[i + half];
        float g0 = rot_lo(a, b, cs[i], -sn[i]), g1 = rot_hi(a, b, cs[i], -sn[i]);
        d[i] = g0;
        d[i + half] = g1;
        dot += g0 * w[i] * mt_ld1(x + i);
        dot += g1 * w[i + half] * mt_ld1(x + i + half);
    }
    dot = mt_warp_sum(dot);
    float mean = dot * r / (float)hd;  /* mean_c(g*w*xhat) */
    for (int i = lane; i < half; i += MT_WARP) {
        const float v0 = r * (d[i] * w[i] - mt_ld1(x + i) * r * mean);
        const float v1 = r * (d[i + half] * w[i + half] - mt_ld1(x + i + half) * r * mean);
        st_pair<OB>(dx, i, half, v0, v1);
    }
}

/* partial[z][chunk][c] = sum over the chunk's rows (in order) of g*x*rstd; z = 0: q, 1: k */
template <typename XT>   /* q_raw, k_raw as stored (fp32; bf16: QK_XB) */
static __global__ void qk_bwd_dw1_k(float *partial, const float *gq, const float *gk, const XT *q_raw,
                                    const XT *k_raw, const float *rstd_q, const float *rstd_k, int N, int H,
                                    int K, int hd, int rows_q, int rows_k, int nchunk_q)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y, z = blockIdx.z;
    int nrow = N * (z ? K : H), rows = z ? rows_k : rows_q;
    int n0 = chunk * rows, n1 = n0 + rows < nrow ? n0 + rows : nrow;
    if (c >= hd || n0 >= nrow) return;
    const float *g = z ? gk : gq, *rs = z ? rstd_k : rstd_q;
    const XT *x = z ? k_raw : q_raw;
    float acc = 0.0f;
    for (int row = n0; row < n1; row++) {
        size_t e = (size_t)row * (size_t)hd + (size_t)c;
        acc += g[e] * mt_ld1(x + e) * rs[row];
    }
    partial[((size_t)(z ? nchunk_q : 0) + (size_t)chunk) * (size_t)hd + (size_t)c] = acc;
}

extern "C" void mt_cuda_rmsnorm_resid_forward(void *be, float *out, float *rstd, float *resid, const float *inp,
                                              const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    mt_cuda_rms_rows_forward(out, NULL, rstd, resid, inp, weight, N, C, eps);
}

extern "C" void mt_cuda_rmsnorm_resid_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, float *resid,
                                                   const float *inp, const float *weight, int N, int C, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    mt_cuda_rms_rows_forward(out, (__nv_bfloat16 *)out_bf16, rstd, resid, inp, weight, N, C, eps);
}

/* the vector path's shape: hd a power of two, 8..128 (one float4 per lane) */
static bool qk_vec_hd(int hd) { return hd >= 8 && hd <= 128 && (hd & (hd - 1)) == 0; }

/* the forward of both entries; ob: q, k are bf16 (qk_norm_rope_forward_bf16);
 * xb: q_raw, k_raw are bf16 (their GEMMs' bf16 outputs) */
#define QK_FWD_ARGS q, k, rstd_q, rstd_k, q_raw, k_raw, wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd, lg, eps
static void qk_forward(void *q, void *k, int ob, float *rstd_q, float *rstd_k, const void *q_raw, const void *k_raw,
                       int xb, const float *wq, const float *wk, const float *cos_tab, const float *sin_tab, int N,
                       int T, int pos0, int H, int K, int hd, float eps)
{
    int rows = N * (H + K);
    if (rows <= 0 || hd <= 0) return;
    int lg = mt_cuda_rms_lanes_log2(hd);
    unsigned blocks = (unsigned)((((size_t)rows << lg) + QK_THREADS - 1) / QK_THREADS);
    const size_t oa = ob ? 8 : 16, xa = xb ? 8 : 16;   /* a lane's 4 outputs, its 4 inputs */
    bool vec = qk_vec_hd(hd) && mt_cuda_aligned(q, oa) && mt_cuda_aligned(k, oa) && mt_cuda_aligned(q_raw, xa) &&
               mt_cuda_aligned(k_raw, xa) && mt_cuda_aligned(wq, 16) && mt_cuda_aligned(wk, 16) &&
               mt_cuda_aligned(cos_tab, 16) && mt_cuda_aligned(sin_tab, 16);
    switch ((vec ? 4 : 0) | (ob ? QK_OB : 0) | (xb ? QK_XB : 0)) {
    case 4 | QK_OBXB: MT_LAUNCH(qk_fwd_vec_k<QK_OBXB>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    case 4 | QK_OB: MT_LAUNCH(qk_fwd_vec_k<QK_OB>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    case 4: MT_LAUNCH(qk_fwd_vec_k<0>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    case QK_OBXB: MT_LAUNCH(qk_fwd_k<QK_OBXB>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    case QK_OB: MT_LAUNCH(qk_fwd_k<QK_OB>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    default: MT_LAUNCH(qk_fwd_k<0>, blocks, QK_THREADS, 0)(QK_FWD_ARGS); break;
    }
    MT_CUDA_KCHECK();
}
#undef QK_FWD_ARGS

extern "C" void mt_cuda_qk_norm_rope_forward(void *be, float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                             const float *k_raw, const float *wq, const float *wk,
                                             const float *cos_tab, const float *sin_tab, int N, int T, int pos0,
                                             int H, int K, int hd, float eps)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    qk_forward(q, k, 0, rstd_q, rstd_k, q_raw, k_raw, 0, wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd, eps);
}

extern "C" void mt_cuda_qk_norm_rope_forward_bf16(void *be, mt_bf16 *qb, mt_bf16 *kb, float *rstd_q, float *rstd_k,
                                                  const float *q_raw, const float *k_raw, const float *wq,
                                                  const float *wk, const float *cos_tab, const float *sin_tab, int N,
                                                  int T, int pos0, int H, int K, int hd, float eps,
                                                  const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    const int xb = q_raw_b != NULL;   /* (mt_ops.h: both or neither) */
    qk_forward(qb, kb, 1, rstd_q, rstd_k, xb ? (const void *)q_raw_b : q_raw, xb ? (const void *)k_raw_b : k_raw, xb,
               wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd, eps);
}

/* rows per dw chunk for `nrow` rows: DW_ROWS, doubled while the grid's y would pass 65535 */
static int dw_rows(int nrow)
{
    int rows = DW_ROWS;
    while ((nrow + rows - 1) / rows > 65535) rows *= 2;
    return rows;
}

/* the backward of both entries; ob: dq_raw, dk_raw are bf16 (qk_norm_rope_backward_bf16);
 * xb: q_raw, k_raw are bf16; dq_b, dk_b (ob only): the incoming d q, d k as bf16, read by
 * the vector kernel (QK_DB: its dq, dk arguments point at them), else widened into the
 * scratch dq, dk first (exact) for the scalar path, which stores g there */
#define QK_BWD_VEC_ARGS dq_raw, dk_raw, din_q, din_k, partial, q_raw, k_raw, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab, \
                        N, T, H, K, hd, lg, R, ncq, nck, ldq_o, ldk_o
#define QK_BWD_DX_ARGS dq_raw, dk_raw, dq, dk, q_raw, k_raw, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab, N, T, H, K, hd, \
                       ldq_o, ldk_o
static void qk_backward(void *dq_raw, void *dk_raw, int ob, float *dwq, float *dwk, float *dq, float *dk,
                        const void *q_raw, const void *k_raw, int xb, const float *wq, const float *wk,
                        const float *rstd_q, const float *rstd_k, const float *cos_tab, const float *sin_tab, int N,
                        int T, int H, int K, int hd, const mt_bf16 *dq_b, const mt_bf16 *dk_b, int ldq_o, int ldk_o)
{
    const int db = ob && dq_b != NULL;
    const int f = (ob ? QK_OB : 0) | (xb ? QK_XB : 0);
    const size_t xa = xb ? 8 : 16;
    int rows = N * (H + K);
    if (rows <= 0 || hd <= 0) return;
    /* the vector kernel's d in: fp32 dq, dk, or (QK_DB) the bf16 ones, 8 bytes a load */
    float *din_q = db ? (float *)(void *)dq_b : dq, *din_k = db ? (float *)(void *)dk_b : dk;
    /* a lane's 4 outputs stored at once (16 bytes fp32, 8 bf16): rows ld apart keep them aligned */
    const int ld_ok = ldq_o % 4 == 0 && ldk_o % 4 == 0;
    bool vec = qk_vec_hd(hd) && ld_ok && mt_cuda_aligned(dq_raw, 16) && mt_cuda_aligned(dk_raw, 16) &&
               mt_cuda_aligned(din_q, db ? 8 : 16) && mt_cuda_aligned(din_k, db ? 8 : 16) &&
               mt_cuda_aligned(q_raw, xa) && mt_cuda_aligned(k_raw, xa) && mt_cuda_aligned(wq, 16) &&
               mt_cuda_aligned(wk, 16) && mt_cuda_aligned(cos_tab, 16) && mt_cuda_aligned(sin_tab, 16);
    if (vec) {
        /* heads per chunk: 64, halved (down to 8) while fewer than 1024 warps would run */
        int lg = mt_cuda_rms_lanes_log2(hd), R = 64, ncq, nck;
        for (;;) {
            ncq = (N * H + R - 1) / R;
            nck = (N * K + R - 1) / R;
            if (R <= 8 || ((size_t)(ncq + nck) << lg) >= (size_t)1024 * MT_WARP) break;
            R >>= 1;
        }
        float *partial = NULL;
        if (dwq || dwk) {
            partial = (float *)mt_cuda_workspace((size_t)(ncq + nck) * (size_t)hd * sizeof(float));
            if (!partial) return;
            if (!mt_cuda_aligned(partial, 16)) vec = false;
        }
        if (vec) {
            unsigned blocks = (unsigned)((((size_t)(ncq + nck) << lg) + QK_THREADS - 1) / QK_THREADS);
            switch (f | (db ? QK_DB : 0)) {
            case QK_OBXBDB: MT_LAUNCH(qk_bwd_vec_k<QK_OBXBDB>, blocks, QK_THREADS, 0)(QK_BWD_VEC_ARGS); break;
            case QK_OBDB: MT_LAUNCH(qk_bwd_vec_k<QK_OBDB>, blocks, QK_THREADS, 0)(QK_BWD_VEC_ARGS); break;
            case QK_OBXB: MT_LAUNCH(qk_bwd_vec_k<QK_OBXB>, blocks, QK_THREADS, 0)(QK_BWD_VEC_ARGS); break;
            case QK_OB: MT_LAUNCH(qk_bwd_vec_k<QK_OB>, blocks, QK_THREADS, 0)(QK_BWD_VEC_ARGS); break;
            default: MT_LAUNCH(qk_bwd_vec_k<0>, blocks, QK_THREADS, 0)(QK_BWD_VEC_ARGS); break;
            }
            MT_CUDA_KCHECK();
            if (partial) mt_cuda_rms_dw_reduce(dwq, dwk, partial, ncq, nck, hd);
            return;
        }
    }
    if (db) {   /* the scalar path reads and rewrites fp32 d in place */
        mt_cuda_widen_bf16(mt_cuda_be, dq, dq_b, (size_t)N * (size_t)H * (size_t)hd);
        mt_cuda_widen_bf16(mt_cuda_be, dk, dk_b, (size_t)N * (size_t)K * (size_t)hd);
    }
    int rq = dw_rows(N * H), rk = dw_rows(N * K);
    int ncq = (N * H + rq - 1) / rq, nck = (N * K + rk - 1) / rk;
    float *partial = (float *)mt_cuda_workspace((size_t)(ncq + nck) * (size_t)hd * sizeof(float));
    if (!partial) return;
    const unsigned nb = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    switch (f) {
    case QK_OBXB: MT_LAUNCH(qk_bwd_dx_k<QK_OBXB>, nb, ROWS_PER_BLOCK * MT_WARP, 0)(QK_BWD_DX_ARGS); break;
    case QK_OB: MT_LAUNCH(qk_bwd_dx_k<QK_OB>, nb, ROWS_PER_BLOCK * MT_WARP, 0)(QK_BWD_DX_ARGS); break;
    default: MT_LAUNCH(qk_bwd_dx_k<0>, nb, ROWS_PER_BLOCK * MT_WARP, 0)(QK_BWD_DX_ARGS); break;
    }
    MT_CUDA_KCHECK();
    if (!dwq && !dwk) return;   /* both gains frozen (LoRA): dx only */
    dim3 g1((unsigned)((hd + DW_THREADS - 1) / DW_THREADS), (unsigned)(ncq > nck ? ncq : nck), 2u);
    if (xb)
        MT_LAUNCH(qk_bwd_dw1_k<__nv_bfloat16>, g1, DW_THREADS, 0)
            (partial, dq, dk, (const __nv_bfloat16 *)q_raw, (const __nv_bfloat16 *)k_raw, rstd_q, rstd_k, N, H, K, hd,
             rq, rk, ncq);
    else
        MT_LAUNCH(qk_bwd_dw1_k<float>, g1, DW_THREADS, 0)
            (partial, dq, dk, (const float *)q_raw, (const float *)k_raw, rstd_q, rstd_k, N, H, K, hd, rq, rk, ncq);
    MT_CUDA_KCHECK();
    mt_cuda_rms_dw_reduce(dwq, dwk, partial, ncq, nck, hd);
}
#undef QK_BWD_VEC_ARGS
#undef QK_BWD_DX_ARGS

extern "C" void mt_cuda_qk_norm_rope_backward(void *be, float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                              float *dk, const float *q_raw, const float *k_raw,
                                              const float *wq, const float *wk, const float *rstd_q,
                                              const float *rstd_k, const float *cos_tab, const float *sin_tab,
                                              int N, int T, int H, int K, int hd)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    qk_backward(dq_raw, dk_raw, 0, dwq, dwk, dq, dk, q_raw, k_raw, 0, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab, N, T, H,
                K, hd, NULL, NULL, 0, 0);
}

extern "C" void mt_cuda_qk_norm_rope_backward_bf16(void *be, mt_bf16 *dq_raw_b, mt_bf16 *dk_raw_b, float *dwq,
                                                   float *dwk, float *dq, float *dk, const float *q_raw,
                                                   const float *k_raw, const float *wq, const float *wk,
                                                   const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                                   const float *sin_tab, int N, int T, int H, int K, int hd,
                                                   const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b,
                                                   const mt_bf16 *dq_b, const mt_bf16 *dk_b, int ld_dq_raw,
                                                   int ld_dk_raw)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    const int xb = q_raw_b != NULL;
    if (ld_dq_raw < 0 || ld_dk_raw < 0 || (ld_dq_raw && ld_dq_raw < H * hd) || (ld_dk_raw && ld_dk_raw < K * hd)) {
        MT_CUDA_UNSUPPORTED("qk_norm_rope_backward_bf16: a row stride under its row (ld_dq_raw, ld_dk_raw)");
        return;
    }
    qk_backward(dq_raw_b, dk_raw_b, 1, dwq, dwk, dq, dk, xb ? (const void *)q_raw_b : q_raw,
                xb ? (const void *)k_raw_b : k_raw, xb, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab, N, T, H, K, hd, dq_b,
                dk_b, ld_dq_raw, ld_dk_raw);
}
