/*
 * attn_online.cuh — one key tile of the online softmax for a warp's 16 query
 * rows, on the scores in mma.sync's m16n8 accumulator layout (8 n8 tiles =
 * 64 keys; lane l: g = l >> 2, t = l % 4; s[j][e] is row g + 8 (e >> 1), key
 * 8 j + 2 t + (e & 1)). Shared by v2/v3's forward (attention_v2.cu, on
 * mma.sync) and v4's (attention_wg.cu, on wgmma, whose m64 accumulators are
 * the same layout warp by warp), so the two run the same operations in the
 * same order (v4 == v2 bit for bit under the emulator):
 *
 *   x = s c  (c = scale log2 e; -inf past the diagonal on tile wlast)
 *   m_new = max(m, max_j x),  alpha = 2^(m - m_new),  l = alpha l
 *   p = 2^(x - m_new)  (into s),  l += sum_j p   (this lane's part: the quad sums at the end)
 *
 * The caller rescales its O accumulators by alpha (one per row half). After
 * the last tile mt_attn_online_end divides O by l and writes the rows' lse,
 * and mt_attn_write_rows stores a warp's 16 accumulator rows (also the
 * backward's dQ, dK, dV).
 */
#ifndef MT_ATTN_ONLINE_CUH
#define MT_ATTN_ONLINE_CUH

static __device__ __forceinline__ void mt_attn_online_tile(float (&s)[8][4], float (&m)[2], float (&l)[2],
                                                           float (&alpha)[2], int masked, int j0, int row0, int t,
                                                           float c)
{
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = s[j][e] * c;
            if (masked && j0 + 8 * j + 2 * t + (e & 1) > row0 + 8 * (e >> 1)) x = -INFINITY;
            s[j][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(MT_FULL_MASK, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(MT_FULL_MASK, mx[r], 2));
        const float mnew = fmaxf(m[r], mx[r]);  /* finite: every row sees a key per tile */
        alpha[r] = exp2f(m[r] - mnew);          /* 0 on the first tile (m = -inf) */
        m[r] = mnew;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = exp2f(s[j][e] - m[e >> 1]);
            s[j][e] = p;
            l[e >> 1] += p;
        }
}

/* after the last tile: l summed over the quad, O = O / l, lse = (m + log2 l) ln 2
 * for this lane's rows row0, row0 + 8 (those before T; lane t = 0 writes) */
template <int HD>
static __device__ __forceinline__ void mt_attn_online_end(float (&o)[HD / 8][4], const float (&m)[2], float (&l)[2],
                                                          float *lse, int b, int h, int T, int H, int row0, int t)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(MT_FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(MT_FULL_MASK, l[r], 2);
    }
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = o[j][e] / l[e >> 1];
    if (t == 0) {
        const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
        const float ln2 = 0.6931471805599453f;
        if (row0 < T) lse[lrow + (size_t)row0] = (m[0] + log2f(l[0])) * ln2;
        if (row0 + 8 < T) lse[lrow + (size_t)row0 + 8] = (m[1] + log2f(l[1])) * ln2;
    }
}

struct alignas(8) mt_attn_f2 { float x, y; };

/* a warp's accumulator rows (16 x HD at row r0 of a (B,T,nh,HD) fp32 tensor
 * and its optional bf16 twin, whose rows are ldb apart: 0 = nh HD, dense), each
 * lane its own pairs; rows past T skipped */
template <int HD>
static __device__ __forceinline__ void mt_attn_write_rows(float *dst, __nv_bfloat16 *dst_b,
                                                          const float acc[HD / 8][4], int b, int r0, int T, int nh,
                                                          int head, int lane, int ldb = 0)
{
    const int g = lane >> 2, t = lane & 3;
    const size_t ld = (size_t)nh * HD, ldt = ldb ? (size_t)ldb : ld;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = r0 + g + 8 * half;
        if (r >= T) continue;
        const size_t row = (size_t)b * (size_t)T + (size_t)r, col = (size_t)head * HD + 2 * t;
        const size_t at = row * ld + col, atb = row * ldt + col;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            mt_attn_f2 v = {acc[j][2 * half], acc[j][2 * half + 1]};
            if (dst) *(mt_attn_f2 *)(dst + at + 8 * j) = v;
            if (dst_b) *(uint32_t *)(dst_b + atb + 8 * j) = mt_pack_bf16(v.x, v.y);
        }
    }
}

/* ---- the backward's per-tile pieces (v2's dK/dV kernel on mma.sync, v4's on wgmma:
 * the same operations, so v4 == v2 bit for bit under the emulator) ----
 * Scores transposed: s[j][e], dp[j][e] are S^T, dP^T at key row g + 8 (e >> 1) of the
 * warp's 16, query column 8 j + 2 t + (e & 1) of the 64-query tile at i0; Lb, Db that
 * tile's lse log2 e (+inf past T: p = 0) and D:
 *   p = 2^(s c - Lb[col])  (0 above the diagonal on the masked tile: query < key)
 *   ds = scale p (dp - Db[col])
 * p into s, ds into dp. */
static __device__ __forceinline__ void mt_attn_bwd_tile(float (&s)[8][4], float (&dp)[8][4], const float *Lb,
                                                        const float *Db, int masked, int i0, int key0, int t,
                                                        float c, float scale)
{
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 8 * j + 2 * t + (e & 1);  /* query i0 + col */
            float p = exp2f(s[j][e] * c - Lb[col]);
            if (masked && i0 + col < key0 + 8 * (e >> 1)) p = 0.0f;
            s[j][e] = p;
            dp[j][e] = scale * p * (dp[j][e] - Db[col]);
        }
}

/* thread i's (i < 64) query of a tile at i0: its lse, base 2 (+inf past T: p = 0), and D (0 past T) */
static __device__ __forceinline__ void mt_attn_lse_d_of(float *l, float *d, const float *lse, const float *D, int b,
                                                        int h, int i0, int T, int H)
{
    const size_t lrow = ((size_t)b * (size_t)H + (size_t)h) * (size_t)T;
    const int i = i0 + (int)threadIdx.x;
    *l = i < T ? lse[lrow + (size_t)i] * 1.4426950408889634f : INFINITY;
    *d = i < T ? D[lrow + (size_t)i] : 0.0f;
}

/* a query tile's lse (base 2) and D for the dK/dV kernels: 64 values each, by threads
 * 0..63 (plain loads and stores) */
static __device__ __forceinline__ void mt_attn_fetch_lse_d(float *Lb, float *Db, const float *lse, const float *D,
                                                           int b, int h, int i0, int T, int H)
{
    if (threadIdx.x < 64) mt_attn_lse_d_of(&Lb[threadIdx.x], &Db[threadIdx.x], lse, D, b, h, i0, T, H);
}

/* 16 rows x 64 of accumulator tiles (8 n8 tiles) as bf16 A fragments of 4 k steps of
 * 16: a[kk] = mma.sync's m16n8k16 A layout (rows g, g + 8; columns 16 kk + 2 t, + 8) */
static __device__ __forceinline__ void mt_attn_pack_a(uint32_t (&a)[4][4], const float (&s)[8][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        a[kk][0] = mt_pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = mt_pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = mt_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = mt_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

/* The dS^T tiles the dQ kernel reads: per (b, h) the pairs (query tile qt, key tile
 * kt <= qt) of 64 x 64 bf16 [key][query], in row order; the element offset of one */
static __device__ __forceinline__ size_t mt_attn_ds_tile(int b, int h, int qt, int kt, int H, int n_qt)
{
    const size_t pairs = (size_t)n_qt * (n_qt + 1) / 2;
    return (((size_t)b * H + h) * pairs + (size_t)qt * (qt + 1) / 2 + kt) * 64 * 64;
}

/* a 64 x 64 dS^T tile (contiguous) into a shared tile of rows 64 + 8 apart (the
 * dQ kernels' ldmatrix rows), asynchronously, by a block of NT threads */
template <int NT>
static __device__ __forceinline__ void mt_attn_load_ds(__nv_bfloat16 *dst, const __nv_bfloat16 *src)
{
    constexpr int LS = 64 + 8, CPR = 64 / 8;
    for (int e = threadIdx.x; e < 64 * CPR; e += NT) {
        const int r = e / CPR, c8 = (e - r * CPR) * 8;
        mt_cp_async16(dst + r * LS + c8, src + (size_t)r * 64 + c8, 16);
    }
}

/* a warp's 16 key rows of a dS^T tile from its packed A fragments (the same bf16
 * values the dK product multiplies) */
static __device__ __forceinline__ void mt_attn_store_ds(__nv_bfloat16 *tile, const uint32_t (&a)[4][4], int warp,
                                                        int lane)
{
    const int g = lane >> 2, t = lane & 3;
    __nv_bfloat16 *r0 = tile + (16 * warp + g) * 64 + 2 * t, *r8 = r0 + 8 * 64;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        *(uint32_t *)(r0 + 16 * kk) = a[kk][0];
        *(uint32_t *)(r8 + 16 * kk) = a[kk][1];
        *(uint32_t *)(r0 + 16 * kk + 8) = a[kk][2];
        *(uint32_t *)(r8 + 16 * kk + 8) = a[kk][3];
    }
}

#endif /* MT_ATTN_ONLINE_CUH */
