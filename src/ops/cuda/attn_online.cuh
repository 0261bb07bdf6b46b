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
 * The caller rescales its O accumulators by alpha (one per row half).
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

#endif /* MT_ATTN_ONLINE_CUH */
