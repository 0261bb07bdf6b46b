/*
 * ssd_tc.cu — the chunked Mamba-3 scan's intra-chunk products on tensor
 * cores, for precision=bf16 (mt_ops.h ssm_scan_forward_bf16 / _backward_bf16;
 * docs/cuda.md "The Mamba-3 scan on tensor cores"). ssm.cu keeps everything
 * else of the chunked form (the cumulative decay, the states' passes
 * between chunks, the scalar gradients) in fp32 and calls these in place of
 * its fp32 product kernels (ssm.cu steps 2, 4, 5, 7, 8), with bf16 operands
 * and fp32 accumulation. Each writes what the fp32 kernel it replaces
 * writes, except in the backward: dLE's column sums instead of dLE (7), and
 * dx, dB as token rows (8a, 8b with step 10's scatter) instead of per-source
 * rows.
 *
 * Rounding points (nearest even; every other value fp32):
 *   x, B, C, dy, and the states S_in, dS_out as ssm.cu's passes store them
 *   (bf16, staged as they are; since the twenty-eighth session) (x may
 *   come stored bf16, ssd_twins X, and dy as its twin Y alone: staged as
 *   stored, and widened where they enter an fp32 term: D x, D dy, dD,
 *   the local e_i dy_i);
 *   B and C wherever they enter a term: the row sums qj and inter take
 *   bf16(B), bf16(C) too, so that B and C are read as their bf16 twins
 *   alone (the prep stores no fp32 B, C on these shapes; since the eleventh
 *   session);
 *   v_j bf16(B_j) in a chunk's own state Xc^T diag(v) Bc (step 2), e_i dy_i
 *   in dS_out's local term (diag(e) dY)^T C (step 5);
 *   forward: M = (C Bc^T) o L before M Xc;
 *   backward: M and dG = (dY Xc^T) o L, stored bf16 (their only readers are
 *   the products here), before M^T dY, dG^T C and dG Bc.
 * G = C Bc^T, dM = dY Xc^T, the decay factors, dLE = dM o G o E and every
 * row / column sum (rs, qj, inter) are fp32 from the fp32 accumulators.
 * Outputs: fp32, or where the caller asks bf16 of the fp32 value (dx: dx_b,
 * dB, dC: dB_b, dC_b; a token row a chunk edge joins waits in fp32 until
 * ssd_tc_edge_k has added the edge, then is rounded once).
 *
 * HOW IT WORKS. One block of 4 warps per (b, h, chunk, tile of 64 rows);
 * the rows are query rows (forward, 7, 8c), tokens (8a, 8b: a token's two
 * sources) or state rows p (2, 5), 16 per warp.
 * A block first stages what its products read into shared memory as bf16
 * (rows padded by 8 elements: ldmatrix's 8 row addresses land in 8
 * different bank groups), then every warp runs its strip on its own:
 * tc_mma, mma.sync m16n8k16 with ldmatrix operands (mma_sync.cuh: the PTX
 * register layouts, emulated exactly under MT_CUDA_EMU), 64 output columns
 * per accumulator pass (acc[8][4]). A chunk's sources are not stored twice:
 * the staged token rows t0-1 .. t0+q-1 (q+1 rows, row q+1 zeros) serve both,
 * source j < q (own) being row j+1 and source q+i (beta) row i, mapped per
 * ldmatrix lane (tc_row). Padding (q, 2q, P, N up to multiples of 16) is
 * zeros in shared memory, so it adds nothing. Sums over a row of the
 * accumulators (rs, qj, inter) go in a fixed order: a lane's columns in
 * order, then its quad by two xor shuffles. No atomics: reruns are
 * bit-identical.
 */
#include "cuda_impl.cuh"
#include "mma_sync.cuh"
#include "ssd.cuh"

#include <math.h>

typedef __nv_bfloat16 bf16;
struct alignas(8) tc_f2 { float x, y; };   /* a paired fp32 store (float2 where the emulator has none) */

#define TC_B 64                 /* rows of a block: 4 warps x 16 */
#define TC_THREADS 128
static_assert(TC_B == 64 && TC_THREADS == 128, "SSD_TC_STRIPS (ssd.cuh): 4 warp strips of 16 rows a 64-row tile");
#define TC_LD(w) ((w) + 8)      /* shared row stride (bf16) of a w-wide tile */

static __host__ __device__ __forceinline__ int tc_r16(int n) { return (n + 15) & ~15; }
static __host__ __device__ __forceinline__ int tc_min(int a, int b) { return a < b ? a : b; }

/* a shared bf16 operand: row r at s + r*ld; src = 1: r is a chunk's source
 * (j < q: row j+1; q <= j < 2q: row j-q; beyond: the zero row zr) */
struct tc_op {
    const bf16 *s;
    int ld, q, zr, src;
};
static __device__ __forceinline__ const bf16 *tc_row(const struct tc_op &o, int r)
{
    if (o.src) r = r < o.q ? r + 1 : (r < 2 * o.q ? r - o.q : o.zr);
    return o.s + (size_t)r * o.ld;
}
static __device__ __forceinline__ struct tc_op tc_plain(const bf16 *s, int ld)
{
    struct tc_op o = {s, ld, 0, 0, 0};
    return o;
}
static __device__ __forceinline__ struct tc_op tc_sources(const bf16 *s, int ld, int q)
{
    struct tc_op o = {s, ld, q, q + 1, 1};
    return o;
}

/* acc (16 x 64: n8 tiles 0..7) += A[m0..m0+16, 0..K) B[0..K, n0..n0+nw), K and
 * nw multiples of 16 (nw <= 64; tiles past nw untouched). A_KM: A stored
 * [k][m] (.trans), else [m][k]; B_NK: B stored [n][k], else [k][n] (.trans).
 * ldmatrix x4 matrices: A (m 0-7, k 0-7) (m 8-15, k 0-7) (m 0-7, k 8-15)
 * (m 8-15, k 8-15) = a0..a3; B (n 0-7, k 0-7) (n 0-7, k 8-15) (n 8-15, k 0-7)
 * (n 8-15, k 8-15) = b0, b1 of two n8 tiles. Warp-uniform arguments. */
/* one k step of it: acc += a B[k0..k0+16, n0..n0+nw) for A's fragment a (registers) */
template <int B_NK>
static __device__ __forceinline__ void tc_mma_step(float acc[8][4], const uint32_t a[4], const struct tc_op &B, int k0,
                                                   int n0, int nw, int lane)
{
    const int mi = lane >> 3, r8 = lane & 7;
#pragma unroll
    for (int np = 0; np < 4; np++) {
        if (16 * np >= nw) break;
        uint32_t r[4];
        if (B_NK) mt_ldsm_x4(r, tc_row(B, n0 + 16 * np + (mi >> 1) * 8 + r8) + k0 + (mi & 1) * 8);
        else mt_ldsm_x4_t(r, tc_row(B, k0 + (mi & 1) * 8 + r8) + n0 + 16 * np + (mi >> 1) * 8);
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mt_mma_16816(acc[2 * np], a, b0);
        mt_mma_16816(acc[2 * np + 1], a, b1);
    }
}
template <int A_KM, int B_NK>
static __device__ __forceinline__ void tc_mma(float acc[8][4], const struct tc_op &A, int m0, const struct tc_op &B,
                                              int n0, int nw, int K, int lane)
{
    const int mi = lane >> 3, r8 = lane & 7;
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4];
        if (A_KM) mt_ldsm_x4_t(a, tc_row(A, k0 + (mi >> 1) * 8 + r8) + m0 + (mi & 1) * 8);
        else mt_ldsm_x4(a, tc_row(A, m0 + (mi & 1) * 8 + r8) + k0 + (mi >> 1) * 8);
        tc_mma_step<B_NK>(acc, a, B, k0, n0, nw, lane);
    }
}

static __device__ __forceinline__ void tc_zero(float acc[8][4])
{
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
}

/* the row (within the strip's 16) and column (within the 64) of accumulator
 * element e of n8 tile j of a lane (mma_sync.cuh's C layout) */
#define TC_EROW(lane, e) (((lane) >> 2) + 8 * ((e) >> 1))
#define TC_ECOL(lane, j, e) (8 * (j) + 2 * ((lane) & 3) + ((e) & 1))

/* columns c, c+1 (c even) of a row of width w at dst (dst = the row + c):
 * one 8-byte store where both are in the row and dst is 8-byte aligned */
static __device__ __forceinline__ void tc_put2(float *dst, int c, int w, float a, float b)
{
    if (c + 1 < w && ((uintptr_t)dst & 7) == 0) {
        *(tc_f2 *)dst = tc_f2{a, b};
        return;
    }
    if (c < w) dst[0] = a;
    if (c + 1 < w) dst[1] = b;
}

/* tc_put2 rounded to bf16 (nearest even): one 4-byte store where it can */
static __device__ __forceinline__ void tc_put2b(bf16 *dst, int c, int w, float a, float b)
{
    const bf16 ra = __float2bfloat16_rn(a), rb = __float2bfloat16_rn(b);
    if (c + 1 < w && ((uintptr_t)dst & 3) == 0) {
        *(uint32_t *)dst = (uint32_t)__bfloat16_as_ushort(ra) | (uint32_t)__bfloat16_as_ushort(rb) << 16;
        return;
    }
    if (c < w) dst[0] = ra;
    if (c + 1 < w) dst[1] = rb;
}

/* acc += sc[r] a2 per strip row r (the second product of 8a-8c, scaled per
 * row: v_j or e_i), and sums[u] += a2 . operand over the strip's columns
 * n < ncols where at(r, n, &o) (false: none) gives the operand of the row
 * sums qj and inter (a lane's two rows: u = 0, 1) */
template <typename At>
static __device__ __forceinline__ void tc_fold(float acc[8][4], const float a2[8][4], const float *sc, int m0,
                                               int nc0, int ncols, int lane, float sums[2], At at)
{
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = m0 + TC_EROW(lane, e), n = nc0 + TC_ECOL(lane, j, e);
            float o;
            if (n < ncols && at(r, n, &o)) sums[e >> 1] += a2[j][e] * o;
            acc[j][e] += sc[r] * a2[j][e];
        }
}

/* a sum over the 4 lanes of a quad (the lanes holding one accumulator row) */
static __device__ __forceinline__ float tc_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* The staging loops move their tiles TC_AHEAD elements a thread at a time
 * (mt_block_move): one load at a time was 8 memory round trips a thread for a
 * 64 x 64 fp32 tile */
#define TC_AHEAD 8

/* x widened from its bf16 rounding (nearest even): a twin's value */
static __device__ __forceinline__ float tc_bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* dst[r][k] (r < nr, k < kw) = bf16(s_r src[tok][k]) for the token tok = row(r, s_r)
 * (-1: none, a zero row) and k < ncols, else 0 (src: token 0's row; rows sld
 * apart; T float or bf16). RB: each source value rounded to bf16 before its
 * scale, bf16(s_r bf16(src)) (a bf16 src is so already). Four columns a move
 * (a 16- or 8-byte load, an 8-byte store) where src's rows are so aligned and
 * ncols a multiple of 4 (kw always is: a multiple of 16). */
template <int RB = 0, typename T, typename Row>
static __device__ void tc_stage_rows(bf16 *dst, int ld, int nr, int kw, const T *src, size_t sld, int ncols,
                                     Row row)
{
    if (((uintptr_t)src & (4 * sizeof(T) - 1)) == 0 && sld % 4 == 0 && ncols % 4 == 0) {
        const int kw4 = kw / 4;
        mt_block_move<TC_AHEAD, float4>(
            nr * kw4,
            [&](int e) {
                const int r = e / kw4, k = 4 * (e - r * kw4);
                float s = 1.0f;
                const int tok = row(r, s);
                float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                if (tok >= 0 && k < ncols) {
                    v = mt_ld4(src + (size_t)tok * sld + k);
                    if (RB) v.x = tc_bf16r(v.x), v.y = tc_bf16r(v.y), v.z = tc_bf16r(v.z), v.w = tc_bf16r(v.w);
                    v.x *= s, v.y *= s, v.z *= s, v.w *= s;
                }
                return v;
            },
            [&](int e, float4 v) {
                const int r = e / kw4, k = 4 * (e - r * kw4);
                uint2 b;
                b.x = mt_pack_bf16(v.x, v.y);
                b.y = mt_pack_bf16(v.z, v.w);
                *(uint2 *)(dst + r * ld + k) = b;
            });
        return;
    }
    mt_block_move<TC_AHEAD, float>(
        nr * kw,
        [&](int e) {
            const int r = e / kw, k = e - r * kw;
            float s = 1.0f;
            const int tok = row(r, s);
            if (tok < 0 || k >= ncols) return 0.0f;
            const float v = mt_ld1(src + (size_t)tok * sld + k);
            return s * (RB ? tc_bf16r(v) : v);
        },
        [&](int e, float v) {
            const int r = e / kw;
            dst[r * ld + (e - r * kw)] = __float2bfloat16_rn(v);
        });
}

/* tc_stage_rows of the tokens tok0 + r in [lo, hi), unscaled */
static __device__ void tc_stage(bf16 *dst, int ld, int nr, int kw, const float *src, size_t sld, int ncols, int tok0,
                                int lo, int hi)
{
    tc_stage_rows(dst, ld, nr, kw, src, sld, ncols, [&](int r, float &) {
        const int tok = tok0 + r;
        return tok >= lo && tok < hi ? tok : -1;
    });
}

/* dst[r][k] (r < nr, k < kw) = src[row(r)][k0 + k] where row(r) >= 0 (-1: a zero row)
 * and k0 + k < khi, else 0; src's bf16 rows sld apart. Eight columns a move (16-byte
 * moves) where the rows from column k0 on are 16-byte aligned and khi a multiple of 8 */
template <typename Row>
static __device__ void tc_stage_brows(bf16 *dst, int ld, int nr, int kw, const bf16 *src, size_t sld, int k0, int khi,
                                      Row row)
{
    if (((uintptr_t)(src + k0) & 15) == 0 && sld % 8 == 0 && khi % 8 == 0) {
        const int kw8 = kw / 8;
        mt_block_move<TC_AHEAD, uint4>(
            nr * kw8,
            [&](int e) {
                const int r = e / kw8, k = 8 * (e - r * kw8), sr = row(r);
                uint4 v = {0u, 0u, 0u, 0u};
                if (sr >= 0 && k0 + k < khi) v = *(const uint4 *)(src + (size_t)sr * sld + k0 + k);
                return v;
            },
            [&](int e, uint4 v) {
                const int r = e / kw8;
                *(uint4 *)(dst + r * ld + 8 * (e - r * kw8)) = v;
            });
        return;
    }
    mt_block_move<TC_AHEAD, bf16>(
        nr * kw,
        [&](int e) {
            const int r = e / kw, k = e - r * kw, sr = row(r);
            return sr >= 0 && k0 + k < khi ? src[(size_t)sr * sld + k0 + k] : __float2bfloat16_rn(0.0f);
        },
        [&](int e, bf16 v) {
            const int r = e / kw;
            dst[r * ld + (e - r * kw)] = v;
        });
}

/* dst[r][k] (r < nr, k < kw) = src[r][k0 + k] where r < rhi and k0 + k < khi, else 0 */
static __device__ void tc_stage_b(bf16 *dst, int ld, int nr, int kw, const bf16 *src, size_t sld, int rhi, int k0,
                                  int khi)
{
    tc_stage_brows(dst, ld, nr, kw, src, sld, k0, khi, [&](int r) { return r < rhi ? r : -1; });
}

/* the block's chunk */
struct tc_chunk {
    int ci, bh, c, b, h, t0, q;
    size_t xld, bld, ob;   /* xld: y, dy's row stride (H P); bld: B, C's (H N) */
    size_t xs;             /* x, dx's (d.xs: H P, or proj's row where x lives there) */
    size_t xsb;            /* x's where it is stored bf16 (ssd_twins X; d.xsb) */
};
/* chunk ci = (b*H + h)*nc + c */
static __device__ __forceinline__ struct tc_chunk tc_chunk_at(struct ssd_dims d, int ci)
{
    struct tc_chunk k;
    k.ci = ci;
    k.bh = k.ci / d.nc;
    k.c = k.ci % d.nc;
    k.b = k.bh / d.H;
    k.h = k.bh % d.H;
    k.t0 = k.c * d.Q;
    k.q = tc_min(d.Q, d.T - k.t0);
    k.xld = (size_t)d.H * d.P;
    k.bld = (size_t)d.H * d.N;
    k.xs = (size_t)d.xs;
    k.xsb = (size_t)d.xsb;
    k.ob = (size_t)k.b * d.T;
    return k;
}
/* An fp32 operand m (rows sld apart; the chunk's head at m + off, ncols wide)
 * with tw its bf16 twin (bf16(m) exactly, as its producer writes it) or NULL:
 * the rows staged as tc_stage stages them, from the twin where given (half
 * the bytes, the same staged values; m is then not read and may be NULL).
 * The head's offset is taken here, from the kernel's parameters, so a kernel
 * keeps no pointer it may not use. */
/* the rows staged from the head's bf16 rows th (tsld apart) where given, else from its
 * fp32 rows mh (sld apart) rounded: tc_stage's rows either way */
static __device__ void tc_stage_head(bf16 *dst, int ld, int nr, int kw, const float *mh, size_t sld, const bf16 *th,
                                     size_t tsld, int ncols, int tok0, int lo, int hi)
{
    if (!th) {
        tc_stage(dst, ld, nr, kw, mh, sld, ncols, tok0, lo, hi);
        return;
    }
    tc_stage_brows(dst, ld, nr, kw, th, tsld, 0, ncols, [&](int r) {
        const int tok = tok0 + r;
        return tok >= lo && tok < hi ? tok : -1;
    });
}
static __device__ void tc_stage_twin(bf16 *dst, int ld, int nr, int kw, const float *m, const bf16 *tw, size_t off,
                                     size_t sld, int ncols, int tok0, int lo, int hi)
{
    tc_stage_head(dst, ld, nr, kw, tw ? NULL : m + off, sld, tw ? tw + off : NULL, sld, ncols, tok0, lo, hi);
}
/* B or C ((B T, H N), the prep's twins) */
static __device__ void tc_stage_bc(bf16 *dst, int ld, int nr, int kw, const float *m, const bf16 *tw,
                                   const struct tc_chunk &k, int N, int tok0, int lo, int hi)
{
    tc_stage_twin(dst, ld, nr, kw, m, tw, k.ob * k.bld + (size_t)k.h * N, k.bld, N, tok0, lo, hi);
}
/* dy ((B T, H P), the gated norm backward's twin) */
static __device__ void tc_stage_dy(bf16 *dst, int ld, int nr, int kw, const float *dy, const bf16 *tw,
                                   const struct tc_chunk &k, int P, int tok0, int lo, int hi)
{
    tc_stage_twin(dst, ld, nr, kw, dy, tw, k.ob * k.xld + (size_t)k.h * P, k.xld, P, tok0, lo, hi);
}
/* x's head rows ((B T, H P) at row stride k.xs, or stored bf16 at k.xsb: ssd_twins X),
 * staged as tc_stage stages them: the bf16 x as stored, the fp32 one rounded */
static __device__ void tc_stage_x(bf16 *dst, int ld, int nr, int kw, const float *x, const bf16 *X,
                                  const struct tc_chunk &k, int P, int tok0, int lo, int hi)
{
    const size_t hp = (size_t)k.h * P;
    tc_stage_head(dst, ld, nr, kw, X ? NULL : x + k.ob * k.xs + hp, k.xs, X ? X + k.ob * k.xsb + hp : NULL, k.xsb, P,
                  tok0, lo, hi);
}
/* m at columns p and p + 1 of row `row` (b: 0 past P), fp32 or bf16 widened: the
 * pair as one 8- or 4-byte load where aligned (a warp's requests in the
 * accumulator layout touch 8 rows' sectors; two loads a pair touched them twice:
 * MT_EMU_COALESCE), else element by element; the same values either way */
template <typename T>
static __device__ __forceinline__ void tc_pair_at(const T *m, size_t row, int p, int P, float &a, float &b)
{
    const T *s = m + row + p;
    if (p + 1 < P && ((uintptr_t)s & (2 * sizeof(T) - 1)) == 0) {
        if constexpr (sizeof(T) == 4) {
            const float2 v = *(const float2 *)s;
            a = v.x, b = v.y;
        } else {
            const uint32_t u = *(const uint32_t *)s;
            a = mt_bf16_lo(u), b = mt_bf16_hi(u);
        }
        return;
    }
    a = mt_ld1(s);
    b = p + 1 < P ? mt_ld1(s + 1) : 0.0f;
}
/* x and dy at the chunk's token t (absolute), columns p, p + 1 (tc_pair_at): the
 * fp32 values, or the bf16 ones widened (X: x stored bf16 by the in-projection;
 * dy NULL: stored bf16 only, ssd_twins Y) */
static __device__ __forceinline__ void tc_x_pair(const float *x, const bf16 *X, const struct tc_chunk &k, int P,
                                                 size_t t, int p, float &a, float &b)
{
    const size_t hp = (size_t)k.h * P;
    if (X) tc_pair_at(X, (k.ob + t) * k.xsb + hp, p, P, a, b);
    else tc_pair_at(x, (k.ob + t) * k.xs + hp, p, P, a, b);
}
static __device__ __forceinline__ void tc_dy_pair(const float *dy, const bf16 *Y, const struct tc_chunk &k, int P,
                                                  size_t t, int p, float &a, float &b)
{
    const size_t at = (k.ob + t) * k.xld + (size_t)k.h * P;
    if (dy) tc_pair_at(dy, at, p, P, a, b);
    else tc_pair_at(Y, at, p, P, a, b);
}
/* tc_stage_rows<1> of B's head rows (row(r, s) as there: dst = bf16(s bf16(B))),
 * from B's twin tw where given (m may then be NULL), else m rounded as read:
 * the same bits */
template <typename Row>
static __device__ void tc_stage_rows_bc(bf16 *dst, int ld, int nr, int kw, const float *m, const bf16 *tw,
                                        const struct tc_chunk &k, int N, Row row)
{
    const size_t off = k.ob * k.bld + (size_t)k.h * N;
    if (tw) tc_stage_rows<1>(dst, ld, nr, kw, tw + off, k.bld, N, row);
    else tc_stage_rows<1>(dst, ld, nr, kw, m + off, k.bld, N, row);
}
/* bf16(B or C) at the chunk's token row t (from t0), column n, widened: the
 * twin's value, or m's rounded as read (the same bits) */
static __device__ __forceinline__ float tc_bc_at(const float *m, const bf16 *tw, const struct tc_chunk &k, int N,
                                                 int t, int n)
{
    const size_t at = k.ob * k.bld + (size_t)k.h * N + (size_t)(k.t0 + t) * k.bld + n;
    return __bfloat162float(tw ? tw[at] : __float2bfloat16_rn(m[at]));
}
/* the block's: grid x = the chunks */
static __device__ __forceinline__ struct tc_chunk tc_chunk_of(struct ssd_dims d)
{
    return tc_chunk_at(d, (int)blockIdx.x);
}

/* w[j] (j < 2q) and cm[i] (i < q) of the chunk into shared memory */
static __device__ void tc_weights(float *w, float *cm, const struct tc_chunk &k, const float *cum, const float *dt,
                                  const float *lam, const float *A, struct ssd_dims d)
{
    const float Ah = A[k.h];
    for (int i = (int)threadIdx.x; i < k.q; i += (int)blockDim.x) {
        const size_t r = (k.ob + k.t0 + i) * d.H + k.h;
        w[i] = ssd_w(1, dt, lam, Ah, r, k.t0 + i);
        w[k.q + i] = ssd_w(0, dt, lam, Ah, r, k.t0 + i);
        cm[i] = cum[(size_t)k.bh * d.T + k.t0 + i];
    }
}

/* v[jj] = w_j exp(cum_last - cum_s(j)) for the n sources j = j0 + jj (0 past
 * 2q and without a next chunk): a source's weight in S_out (ssd_state_k's and
 * ssd_dxc_k's v), one exp a source */
static __device__ void tc_vout(float *v, const float *w, const float *cm, int j0, int n, int q, int has_next)
{
    for (int jj = (int)threadIdx.x; jj < n; jj += (int)blockDim.x) {
        const int j = j0 + jj, sj = j < q ? j : j - q;
        v[jj] = has_next && j < 2 * q ? w[j] * expf(cm[q - 1] - cm[sj]) : 0.0f;
    }
}

/* ---- forward: Y (ssd_out_k) ----
 * per warp strip (16 query rows i): for each 64 sources, G = C Bc^T (fp32),
 * M = G o L rounded into the warp's rows of Ms; then per 64 columns p:
 * acc = e_i (C S_in^T) (c > 0), acc += M Xc, y = acc + D x */
static size_t tc_out_smem(struct ssd_dims d)
{
    const size_t Np = TC_LD(tc_r16(d.N)), Pp = TC_LD(tc_r16(d.P)), S = TC_LD(tc_r16(2 * d.Q));
    return SSD_AL4(3 * (size_t)d.Q) * sizeof(float) +
           ((size_t)TC_B * Np + (d.Q + 2) * (Np + Pp) + (size_t)tc_r16(d.P) * Np + (size_t)TC_B * S) * sizeof(bf16);
}

static __global__ void __launch_bounds__(TC_THREADS)
ssd_tc_out_k(float *y, bf16 *y_b, const bf16 *Sst, const float *cum, const float *x, const float *Bm,
             const float *Cm, const float *dt, const float *lam, const float *A, const float *Dsk, struct ssd_twins tw,
             struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);
    const struct tc_chunk k = tc_chunk_of(d);
    const int i0 = (int)blockIdx.y * TC_B;
    if (i0 >= k.q) return;
    const int q = k.q, Np = tc_r16(d.N), Pp = tc_r16(d.P), s16 = tc_r16(2 * q), lane = (int)threadIdx.x & 31;
    const int m0 = ((int)threadIdx.x >> 5) * 16, LN = TC_LD(Np), LP = TC_LD(Pp), LS = TC_LD(tc_r16(2 * d.Q));
    float *w = sm, *cm = w + 2 * d.Q;
    bf16 *Cs = (bf16 *)(sm + SSD_AL4(3 * d.Q)), *Bt = Cs + TC_B * LN, *Xt = Bt + (d.Q + 2) * LN;
    bf16 *Si = Xt + (d.Q + 2) * LP, *Ms = Si + Pp * LN;
    tc_weights(w, cm, k, cum, dt, lam, A, d);
    tc_stage_bc(Cs, LN, TC_B, Np, Cm, tw.C, k, d.N, k.t0 + i0, 0, k.t0 + q);
    tc_stage_bc(Bt, LN, q + 2, Np, Bm, tw.B, k, d.N, k.t0 - 1, 0, k.t0 + q);
    tc_stage_x(Xt, LP, q + 2, Pp, x, tw.X, k, d.P, k.t0 - 1, 0, k.t0 + q);
    if (k.c > 0) tc_stage_b(Si, LN, Pp, Np, Sst + (size_t)k.ci * d.P * d.N, d.N, d.P, 0, d.N);
    __syncthreads();
    if (i0 + m0 >= q) return;   /* warp-uniform; no barrier below */
    const struct tc_op Cop = tc_plain(Cs, LN), Bop = tc_sources(Bt, LN, q), Xop = tc_sources(Xt, LP, q);
    const struct tc_op Sop = tc_plain(Si, LN), Mop = tc_plain(Ms, LS);
    float acc[8][4];
    for (int s0 = 0; s0 < s16; s0 += 64) {
        tc_zero(acc);
        tc_mma<0, 1>(acc, Cop, m0, Bop, s0, tc_min(64, s16 - s0), Np, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {   /* a pair of columns jj, jj+1 (jj even): one 4-byte store */
                const int il = m0 + TC_EROW(lane, e), i = i0 + il, jj = s0 + TC_ECOL(lane, j, e);
                if (jj >= s16) continue;
                float m[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int ju = jj + u, sj = ju < q ? ju : ju - q;
                    m[u] = i < q && ju < 2 * q && sj <= i ? acc[j][e + u] * (w[ju] * expf(cm[i] - cm[sj])) : 0.0f;
                }
                *(uint32_t *)(Ms + il * LS + jj) = mt_pack_bf16(m[0], m[1]);
            }
    }
    __syncwarp();
    float erow[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int i = i0 + m0 + (lane >> 2) + 8 * u;
        erow[u] = i < q ? expf(cm[i]) : 0.0f;
    }
    const float Dh = Dsk[k.h];
    for (int pc = 0; pc < Pp; pc += 64) {
        const int nw = tc_min(64, Pp - pc);
        tc_zero(acc);
        if (k.c > 0) {
            tc_mma<0, 1>(acc, Cop, m0, Sop, pc, nw, Np, lane);
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[j][e] *= erow[e >> 1];
        }
        tc_mma<0, 0>(acc, Mop, m0, Xop, pc, nw, s16, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {   /* columns p, p+1 */
                const int i = i0 + m0 + TC_EROW(lane, e), p = pc + TC_ECOL(lane, j, e);
                if (i >= q || p >= d.P) continue;
                const size_t t = (size_t)k.t0 + i;
                const size_t at = (k.ob + t) * k.xld + (size_t)k.h * d.P + p;
                float xa, xb;
                tc_x_pair(x, tw.X, k, d.P, t, p, xa, xb);
                const float v0 = acc[j][e] + Dh * xa;
                const float v1 = p + 1 < d.P ? acc[j][e + 1] + Dh * xb : 0.0f;
                if (y_b) tc_put2b(y_b + at, p, d.P, v0, v1);   /* y as bf16 only (mt_ops.h y_b) */
                else tc_put2(y + at, p, d.P, v0, v1);
            }
    }
}

/* ---- backward 7 + 8c: M, dG (bf16), rs and dLE's column sums; dC and inter (ssd_gm_k, ssd_dc_k) ----
 * per warp strip (16 query rows), per 64 sources: G = C Bc^T and
 * dM = dY Xc^T (fp32), then the fp32 kernel's epilogue element by element.
 * dLE = dM o G o E is not stored: its only reader, ssd_scal_k, needs its
 * column sums alone (dw_j = sum_i dLE[i,j]; the dcum term sum_{i'>=i} of
 * the row's two sources is w0 colsum_i + w1 colsum_{q+i}, dLE being 0 above
 * the diagonal), so each warp strip writes its 16 rows' sums per source,
 * dcs (B H nc, 4 rt strips, 2Q): a lane's two rows, then the 8 lanes of a
 * column by xor shuffles (a fixed tree); ssd_scal_k adds the strips in
 * order. Before: dLE as fp32 (B H nc, Q, 2Q), 0.27 GB written and read back
 * an M layer at the d2048 hybrid's shape.
 * M and dG go out as bf16 for ssd_tc_tok_k; dC = dG Bc + e_i dY S_in takes
 * dG from the epilogue's registers: a lane's bf16(dG) pairs of n8 tiles 2 kk
 * and 2 kk + 1 are the A fragment of sources 16 kk .. (mma_sync.cuh's A
 * layout is two C tiles side by side), the products in the order the staged
 * dG was read (sources ascending), so dC has its bits of before. Since the
 * twenty-eighth session one kernel (before: ssd_tc_dc_k read dG back,
 * 16 KB a token at the d2048 hybrid, and staged dY and Bc again; 8c's
 * inter_i = e_i sum_n ds_in bf16(C_in): C as it enters the products, read
 * from its twin where given, else rounded here, the same bits). */
static size_t tc_gm_smem(struct ssd_dims d)
{
    const size_t Np = TC_LD(tc_r16(d.N)), Pp = TC_LD(tc_r16(d.P));
    return (SSD_AL4(3 * (size_t)d.Q) + SSD_AL4(TC_B)) * sizeof(float) +
           ((size_t)TC_B * (Np + Pp) + (d.Q + 2) * (Np + Pp) + (size_t)tc_r16(d.P) * Np) * sizeof(bf16);
}

/* Long, and why: dG's fragments live in registers from the epilogue to dC's products, so
 * both stay in one body (at 166-168 registers, near where the loop form spilled: NPASS) */
template <int NPASS>   /* dC's 64-column passes: tc_r16(N) / 64 rounded up (N <= SSD_TC_QMAX: 1 or 2) */
static __global__ void __launch_bounds__(TC_THREADS)
ssd_tc_gm_k(bf16 *Mb, bf16 *dGb, float *dcs, float *rs, float *dCm, bf16 *dCb, float *inter, const bf16 *Sst,
            const float *cum, const float *dy, const float *x, const float *Bm, const float *Cm, const float *dt,
            const float *lam, const float *A, struct ssd_twins tw, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);
    const struct tc_chunk k = tc_chunk_of(d);
    const int i0 = (int)blockIdx.y * TC_B;
    if (i0 >= k.q) return;
    const int q = k.q, Np = tc_r16(d.N), Pp = tc_r16(d.P), s16 = tc_r16(2 * q), lane = (int)threadIdx.x & 31;
    const int m0 = ((int)threadIdx.x >> 5) * 16, LN = TC_LD(Np), LP = TC_LD(Pp);
    float *w = sm, *cm = w + 2 * d.Q, *e = sm + SSD_AL4(3 * d.Q);
    bf16 *Cs = (bf16 *)(e + SSD_AL4(TC_B)), *Ys = Cs + TC_B * LN, *Bt = Ys + TC_B * LP, *Xt = Bt + (d.Q + 2) * LN;
    bf16 *Si = Xt + (d.Q + 2) * LP;
    tc_weights(w, cm, k, cum, dt, lam, A, d);
    for (int il = (int)threadIdx.x; il < TC_B; il += (int)blockDim.x)
        e[il] = i0 + il < q ? expf(cum[(size_t)k.bh * d.T + k.t0 + i0 + il]) : 0.0f;
    tc_stage_bc(Cs, LN, TC_B, Np, Cm, tw.C, k, d.N, k.t0 + i0, 0, k.t0 + q);
    tc_stage_dy(Ys, LP, TC_B, Pp, dy, tw.Y, k, d.P, k.t0 + i0, 0, k.t0 + q);
    tc_stage_bc(Bt, LN, q + 2, Np, Bm, tw.B, k, d.N, k.t0 - 1, 0, k.t0 + q);
    tc_stage_x(Xt, LP, q + 2, Pp, x, tw.X, k, d.P, k.t0 - 1, 0, k.t0 + q);
    if (k.c > 0) tc_stage_b(Si, LN, Pp, Np, Sst + (size_t)k.ci * d.P * d.N, d.N, d.P, 0, d.N);
    __syncthreads();
    if (i0 + m0 >= q) return;
    const struct tc_op Cop = tc_plain(Cs, LN), Yop = tc_plain(Ys, LP), Sop = tc_plain(Si, LN);
    const struct tc_op Bop = tc_sources(Bt, LN, q), Xop = tc_sources(Xt, LP, q);
    float rsum[2] = {0.0f, 0.0f}, de[2] = {0.0f, 0.0f};
    float *cs_out = dcs + ((size_t)k.ci * SSD_TC_STRIPS(d.Q) + blockIdx.y * 4 + (threadIdx.x >> 5)) * 2 * d.Q;
    /* dC's columns, 64 a pass; G, dM again in each (N <= 64: one pass). A compile-time count:
     * as a loop over Np, ptxas spilled 36 bytes at 168 registers (unrolled, none) */
#pragma unroll
    for (int pass = 0; pass < NPASS; pass++) {
        const int nc0 = 64 * pass, nw = tc_min(64, Np - nc0), first = pass == 0;
        float acc[8][4];
        tc_zero(acc);
        for (int s0 = 0; s0 < s16; s0 += 64) {
            const int sw = tc_min(64, s16 - s0);
            float ag[8][4], ad[8][4], cs[8][2];
            uint32_t ga[4][4];   /* bf16(dG) of sources s0 + 16 kk .. as A fragments (0 where not stored) */
            tc_zero(ag);
            tc_zero(ad);
            tc_mma<0, 1>(ag, Cop, m0, Bop, s0, sw, Np, lane);
            tc_mma<0, 1>(ad, Yop, m0, Xop, s0, sw, Pp, lane);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                cs[j][0] = cs[j][1] = 0.0f;
#pragma unroll
                for (int u2 = 0; u2 < 4; u2 += 2) {   /* columns jj, jj+1 (jj even, 2q even): paired stores */
                    const int i = i0 + m0 + TC_EROW(lane, u2), jj = s0 + TC_ECOL(lane, j, u2);
                    float m[2] = {0.0f, 0.0f}, dg[2] = {0.0f, 0.0f}, dle[2] = {0.0f, 0.0f};
                    const int in = i < q && jj < 2 * q;
                    if (in)
#pragma unroll
                        for (int u = 0; u < 2; u++) {
                            const int ju = jj + u, sj = ju < q ? ju : ju - q;
                            if (sj > i) continue;
                            const float ex = expf(cm[i] - cm[sj]), dmg = ad[j][u2 + u] * ag[j][u2 + u];
                            const float l = w[ju] * ex;
                            dle[u] = dmg * ex;
                            if (first) rsum[u2 >> 1] += dmg * w[ju] * ex;
                            m[u] = ag[j][u2 + u] * l;
                            dg[u] = ad[j][u2 + u] * l;
                        }
                    const uint32_t gp = mt_pack_bf16(dg[0], dg[1]);
                    ga[j >> 1][(j & 1) * 2 + (u2 >> 1)] = gp;
                    if (!in || !first) continue;
                    const size_t at = ((size_t)k.ci * d.Q + i) * 2 * d.Q + jj;
                    *(uint32_t *)(Mb + at) = mt_pack_bf16(m[0], m[1]);
                    *(uint32_t *)(dGb + at) = gp;
                    cs[j][0] += dle[0];   /* row lane/4, then row lane/4 + 8 */
                    cs[j][1] += dle[1];
                }
            }
            if (first)   /* the strip's column sums: the 8 lanes holding a column (lane % 4
                          * equal) by a xor tree, every lane; lanes 0-3 store */
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        float c = cs[j][u];
                        c += __shfl_xor_sync(0xffffffffu, c, 4);
                        c += __shfl_xor_sync(0xffffffffu, c, 8);
                        c += __shfl_xor_sync(0xffffffffu, c, 16);
                        const int jj = s0 + TC_ECOL(lane, j, u);
                        if (lane < 4 && jj < 2 * q) cs_out[jj] = c;
                    }
#pragma unroll
            for (int kk = 0; kk < 4; kk++)   /* dC += dG Bc over these sources, ascending */
                if (16 * kk < sw) tc_mma_step<0>(acc, ga[kk], Bop, s0 + 16 * kk, nc0, nw, lane);
        }
        if (k.c > 0) {
            float a2[8][4];
            tc_zero(a2);
            tc_mma<0, 0>(a2, Yop, m0, Sop, nc0, nw, Pp, lane);
            /* inter: the query row's C, bf16 */
            tc_fold(acc, a2, e, m0, nc0, d.N, lane, de, [&](int il, int n, float *o) {
                if (i0 + il >= q) return false;
                *o = tc_bc_at(Cm, tw.C, k, d.N, i0 + il, n);
                return true;
            });
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int u = 0; u < 4; u += 2) {
                const int i = i0 + m0 + TC_EROW(lane, u), n = nc0 + TC_ECOL(lane, j, u);
                const size_t o = (k.ob + k.t0 + i) * k.bld + (size_t)k.h * d.N + n;
                if (i < q && n < d.N) {
                    if (dCb) tc_put2b(dCb + o, n, d.N, acc[j][u], acc[j][u + 1]);   /* (dCm not written) */
                    else tc_put2(dCm + o, n, d.N, acc[j][u], acc[j][u + 1]);
                }
            }
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const float sr = tc_quad_sum(rsum[u]), si = tc_quad_sum(de[u]);
        const int il = m0 + (lane >> 2) + 8 * u, i = i0 + il;
        if ((lane & 3) == 0 && i < q) {
            rs[(size_t)k.ci * d.Q + i] = sr;
            inter[(size_t)k.ci * d.Q + i] = si * e[il];   /* (0 in chunk 0: no S_in) */
        }
    }
}

/* ---- backward 8a / 8b + 10: dx, dB (token rows) and qj ----
 * ssd_dxc_k / ssd_dbc_k's products, summed per token here instead of stored
 * per source and summed by ssd_scatter_k. Token t0+r of a chunk is two
 * sources: its own, j = r, and the beta source of token t0+r+1, j = q+r+1
 * (in this chunk for r < q-1; for r = q-1 it is the next chunk's source q).
 * Both map to the same staged token row (tc_row), so one block of 64 token
 * rows runs, per warp strip (16 tokens r):
 *   8a  dx_r = M[:, r]^T dY + M[:, q+r+1]^T dY + (v_r + v_{q+r+1}) (B_r dS_out^T) + D dy_r
 *   8b  dB_r = dG[:, r]^T C + dG[:, q+r+1]^T C + (v_r + v_{q+r+1}) t_r, t = Xc dS_out,
 *       qj_r = qj_{q+r+1} = sum_n t_rn bf16(B_rn) (one value: the same row)
 * (both M columns staged, one accumulator; the dS_out product once a token,
 * not once a source). The chunk's source q (token t0-1, chunks c >= 1),
 * whose token row belongs to the chunk before, is computed by the block of
 * rows 0 from the same staged operands (fp32 sums of the bf16 values, a
 * thread an output) into edge (nch, P or N); ssd_tc_edge_k then adds it to
 * token t0-1's row. Before: the per-source dXc and dBc ((nch, 2Q, P + N),
 * 1.07 GB written and read back at the d2048 hybrid's shape, an M layer)
 * and ssd_scatter_k; the sums are the same terms, in another order. */
static size_t tc_tok_smem(struct ssd_dims d)
{
    const size_t Np = TC_LD(tc_r16(d.N)), Pp = TC_LD(tc_r16(d.P)), Q16 = (size_t)tc_r16(d.Q), W = Np > Pp ? Np : Pp;
    return (SSD_AL4(3 * (size_t)d.Q) + TC_B + SSD_AL4(Q16) + SSD_AL4((size_t)tc_r16(d.N))) * sizeof(float) +
           (2 * Q16 * TC_LD(TC_B) + Q16 * W + (d.Q + 2) * W + (size_t)tc_r16(d.P) * Np) * sizeof(bf16);
}

/* the chunk's source q (token t0-1: the staged token row 0), a thread an
 * output column n < W (W 0: none): edge[n] = sum_i g_iq R_in + vq t_n, t_n its dS_out
 * product (8a: B_{t0-1} . dS_out[n, :]; 8b: x_{t0-1} . dS_out[:, n], kept in
 * tq for qj), only with a next chunk (has_next: dS_out exists). No barrier inside: a
 * function of its own, so every thread reaches the caller's next barrier
 * from the same place */
template <int DB>
static __device__ __noinline__ void tc_edge_row(float *edge, float *tq, const float *gq, const bf16 *Rs, int LW,
                                                const bf16 *St, const bf16 *Sd, int LN, int W, int q,
                                                struct ssd_dims d, int has_next, float vq)
{
    for (int n = (int)threadIdx.x; n < W; n += (int)blockDim.x) {
        float s = 0.0f, t = 0.0f;
        for (int i = 0; i < q; i++) s += gq[i] * __bfloat162float(Rs[i * LW + n]);
        if (has_next) {
            if (DB)
                for (int p = 0; p < d.P; p++) t += __bfloat162float(St[p]) * __bfloat162float(Sd[p * LN + n]);
            else
                for (int m = 0; m < d.N; m++) t += __bfloat162float(St[m]) * __bfloat162float(Sd[n * LN + m]);
        }
        edge[n] = s + vq * t;
        if (DB) tq[n] = t;
    }
}

/* MODE 0: dx (8a), 1: dB and qj (8b), 2: dx as bf16 into outb (8a; the rows
 * the next chunk's edge joins into last, fp32 until ssd_tc_edge_k), 3: dB as
 * bf16 into outb and qj (8b; likewise) */
#define TC_TOK_DX 0
#define TC_TOK_DB 1
#define TC_TOK_DXB 2
#define TC_TOK_DBB 3
/* 4 blocks an SM, as its 48 KB of shared memory allows at the d2048 hybrid's
 * shape: registers capped at 128 (the staging's loads in flight took <2> to 137,
 * 3 blocks) */
#define TC_TOK_BLOCKS 4
template <int MODE>
static __global__ void __launch_bounds__(TC_THREADS, TC_TOK_BLOCKS)
ssd_tc_tok_k(float *out, bf16 *outb, float *last, float *edge, float *qj, const bf16 *Gb, const bf16 *dSo,
             const float *cum, const float *dy, const float *x, const float *Bm, const float *Cm, const float *dt,
             const float *lam, const float *A, const float *Dsk, struct ssd_twins tw, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);
    constexpr int DB = MODE == TC_TOK_DB || MODE == TC_TOK_DBB, OB = MODE == TC_TOK_DXB || MODE == TC_TOK_DBB;
    const struct tc_chunk k = tc_chunk_of(d);
    const int i0 = (int)blockIdx.y * TC_B, q = k.q;
    if (i0 >= q) return;
    const int Np = tc_r16(d.N), Pp = tc_r16(d.P), q16 = tc_r16(q), lane = (int)threadIdx.x & 31, has_next = k.c + 1 < d.nc;
    const int m0 = ((int)threadIdx.x >> 5) * 16, LN = TC_LD(Np), nt = (int)blockDim.x;
    const int edge_rows = i0 == 0 && k.c > 0;   /* this block also computes the chunk's source q */
    /* 8a: the product's columns are P, its rows' operand is B (K = N), the
     * right-hand operand dY; 8b: columns N, rows' operand x (K = P), C */
    const int W = DB ? d.N : d.P, Wp = DB ? Np : Pp, LW = TC_LD(Wp), Kp = DB ? Pp : Np, LK = TC_LD(Kp);
    float *w = sm, *cm = w + 2 * d.Q, *v = sm + SSD_AL4(3 * d.Q), *gq = v + TC_B, *tq = gq + SSD_AL4(tc_r16(d.Q));
    bf16 *Go = (bf16 *)(tq + SSD_AL4(Np)), *Gn = Go + tc_r16(d.Q) * TC_LD(TC_B), *Rs = Gn + tc_r16(d.Q) * TC_LD(TC_B);
    bf16 *St = Rs + tc_r16(d.Q) * LW, *Sd = St + (d.Q + 2) * LK;
    const bf16 *Gc = Gb + (size_t)k.ci * d.Q * 2 * d.Q;   /* the chunk's M (8a) or dG (8b): (q, 2q) of (Q, 2Q) */
    tc_weights(w, cm, k, cum, dt, lam, A, d);
    /* (loops before a barrier that some threads skip, and the edge row's call
     * below, are written so every thread reaches each barrier from one place:
     * the emulator checks it, the host compiler would otherwise duplicate it) */
    for (int i = (int)threadIdx.x; i < (edge_rows ? q : 0); i += nt) gq[i] = __bfloat162float(Gc[(size_t)i * 2 * d.Q + q]);
    /* own sources r (columns i0.., < q) and beta sources q+r+1 (< 2q) */
    tc_stage_b(Go, TC_LD(TC_B), q16, TC_B, Gc, 2 * (size_t)d.Q, q, i0, q);
    tc_stage_b(Gn, TC_LD(TC_B), q16, TC_B, Gc, 2 * (size_t)d.Q, q, q + i0 + 1, 2 * q);
    if (DB) tc_stage_bc(Rs, LW, q16, Wp, Cm, tw.C, k, d.N, k.t0, 0, k.t0 + q);
    else tc_stage_dy(Rs, LW, q16, Wp, dy, tw.Y, k, d.P, k.t0, 0, k.t0 + q);
    if (has_next) {
        if (DB) tc_stage_x(St, LK, q + 2, Kp, x, tw.X, k, d.P, k.t0 - 1, 0, k.t0 + q);
        else tc_stage_bc(St, LK, q + 2, Kp, Bm, tw.B, k, d.N, k.t0 - 1, 0, k.t0 + q);
        tc_stage_b(Sd, LN, Pp, Np, dSo + (size_t)k.ci * d.P * d.N, d.N, d.P, 0, d.N);
    }
    __syncthreads();
    /* v of a token row: its two sources' weights in S_out (0 without a next chunk) */
    for (int rl = (int)threadIdx.x; rl < TC_B; rl += nt) {
        const int r = i0 + rl;
        float s = 0.0f;
        if (has_next && r < q) {
            s = w[r] * expf(cm[q - 1] - cm[r]);
            if (r + 1 < q) s += w[q + r + 1] * expf(cm[q - 1] - cm[r + 1]);
        }
        v[rl] = s;
    }
    tc_edge_row<DB>(edge + (size_t)k.ci * W, tq, gq, Rs, LW, St, Sd, LN, edge_rows ? W : 0, q, d, has_next,
                    has_next ? w[q] * expf(cm[q - 1] - cm[0]) : 0.0f);
    __syncthreads();
    if (i0 + m0 >= q) return;
    const struct tc_op Oop = tc_plain(Go, TC_LD(TC_B)), Nop = tc_plain(Gn, TC_LD(TC_B)), Rop = tc_plain(Rs, LW);
    const struct tc_op Sop = tc_sources(St, LK, q), Dop = tc_plain(Sd, LN);
    const float Dh = Dsk[k.h];
    float acc[8][4], a2[8][4], qp[2] = {0.0f, 0.0f};
    for (int nc0 = 0; nc0 < Wp; nc0 += 64) {
        const int nw = tc_min(64, Wp - nc0);
        tc_zero(acc);
        tc_mma<1, 0>(acc, Oop, m0, Rop, nc0, nw, q16, lane);
        tc_mma<1, 0>(acc, Nop, m0, Rop, nc0, nw, q16, lane);
        if (has_next) {
            tc_zero(a2);
            if (DB) tc_mma<0, 0>(a2, Sop, i0 + m0, Dop, nc0, nw, Kp, lane);   /* Xc dS_out */
            else tc_mma<0, 1>(a2, Sop, i0 + m0, Dop, nc0, nw, Kp, lane);      /* Bc dS_out^T */
            tc_fold(acc, a2, v, m0, nc0, d.N, lane, qp, [&](int rl, int n, float *o) {
                const int r = i0 + rl;
                if (!DB || r >= q) return false;
                *o = tc_bc_at(Bm, tw.B, k, d.N, r, n);
                return true;
            });
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = i0 + m0 + TC_EROW(lane, e), n = nc0 + TC_ECOL(lane, j, e);
                if (r >= q || n >= W) continue;
                const size_t t = k.ob + k.t0 + r;
                float v0 = acc[j][e], v1 = acc[j][e + 1];
                if (!DB) {
                    const size_t tr = (size_t)k.t0 + r;
                    float ya, yb;
                    tc_dy_pair(dy, tw.Y, k, d.P, tr, n, ya, yb);
                    v0 += Dh * ya;
                    v1 = n + 1 < W ? v1 + Dh * yb : 0.0f;
                }
                const size_t o = t * (DB ? k.bld : k.xs) + (size_t)k.h * W + n;
                if (!OB) tc_put2(out + o, n, W, v0, v1);
                else if (has_next && r == q - 1)   /* the next chunk's edge joins it: fp32 until then */
                    tc_put2(last + (size_t)k.ci * W + n, n, W, v0, v1);
                else tc_put2b(outb + o, n, W, v0, v1);
            }
    }
    if (DB)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const float s = tc_quad_sum(qp[u]);
            const int r = i0 + m0 + (lane >> 2) + 8 * u;
            if ((lane & 3) == 0 && r < q) {
                qj[(size_t)k.ci * 2 * d.Q + r] = s;
                if (r + 1 < q) qj[(size_t)k.ci * 2 * d.Q + q + r + 1] = s;
            }
        }
    if (DB && i0 == 0 && threadIdx.x == 0) {   /* qj of source q, in n order (bf16 B; tq: the barrier above;
                                                * 0 in chunk 0: no token t0-1, as before) */
        float s = 0.0f;
        if (edge_rows && has_next)
            for (int n = 0; n < d.N; n++) s += tq[n] * tc_bc_at(Bm, tw.B, k, d.N, -1, n);
        qj[(size_t)k.ci * 2 * d.Q + q] = s;
    }
}

/* 10 (the rest): token t0-1's row += the chunk's source q (chunks c >= 1),
 * after both ssd_tc_tok_k: one block a chunk, threads over P + N. dxb, dBb
 * (bf16 dx, dB): that row's other terms wait in last_x, last_B (the chunk
 * before's slot, fp32) and the sum is rounded here: the fp32 path's value,
 * rounded once */
static __global__ void ssd_tc_edge_k(float *dx, bf16 *dxb, const float *last_x, float *dBm, bf16 *dBb,
                                     const float *last_B, const float *ex, const float *eB, struct ssd_dims d)
{
    const int bh = (int)blockIdx.x / (d.nc - 1), c = (int)blockIdx.x % (d.nc - 1) + 1;
    const struct tc_chunk k = tc_chunk_at(d, bh * d.nc + c);
    const size_t t = k.ob + k.t0 - 1;
    for (int e = (int)threadIdx.x; e < d.P + d.N; e += (int)blockDim.x) {
        if (e >= d.P) {
            const int n = e - d.P;
            const size_t o = t * k.bld + (size_t)k.h * d.N + n;
            const float eb = eB[(size_t)k.ci * d.N + n];
            if (dBb) dBb[o] = __float2bfloat16_rn(last_B[(size_t)(k.ci - 1) * d.N + n] + eb);
            else dBm[o] += eb;
            continue;
        }
        const size_t o = t * k.xs + (size_t)k.h * d.P + e;
        if (dxb) dxb[o] = __float2bfloat16_rn(last_x[(size_t)(k.ci - 1) * d.P + e] + ex[(size_t)k.ci * d.P + e]);
        else dx[o] += ex[(size_t)k.ci * d.P + e];
    }
}

/* ---- forward 2 / backward 5: a chunk's P x N outer-product sums (ssd_state_k, ssd_dloc_k) ----
 * per warp strip (16 rows p), 64 columns n a pass, K over the chunk's rows:
 *   DL = 0  Sloc_c = Xc^T diag(v) Bc, v_j = w_j exp(cum_last - cum_s(j)),
 *           chunks c < nc-1 (full: q = Q); Xc the mapped token rows, v_j Bc
 *           staged per source (2q rows: own and beta weights differ)
 *   DL = 1  Dloc_c = (diag(exp cum) dY)^T C, chunks c >= 1
 * rounding: x, bf16(v_j bf16(B_j)) (DL 0); bf16(e_i dy_i), C (DL 1) */
/* rows of Us: the token rows (DL 0) or the chunk's rows padded to 16 (DL 1) */
static __host__ __device__ __forceinline__ size_t tc_outer_urows(struct ssd_dims d)
{
    return (size_t)(d.Q + 2 > tc_r16(d.Q) ? d.Q + 2 : tc_r16(d.Q));
}
static size_t tc_outer_smem(struct ssd_dims d)
{
    const size_t Np = TC_LD(tc_r16(d.N)), Pp = TC_LD(tc_r16(d.P)), S16 = (size_t)tc_r16(2 * d.Q);
    return (SSD_AL4(3 * (size_t)d.Q) + S16) * sizeof(float) + (tc_outer_urows(d) * Pp + S16 * Np) * sizeof(bf16);
}

template <int DL>
static __global__ void __launch_bounds__(TC_THREADS)
ssd_tc_outer_k(float *out, const float *cum, const float *u, const bf16 *ub, const float *vsrc, const bf16 *vtw,
               const float *dt, const float *lam, const float *A, struct ssd_dims d)
{
    MT_DYN_SMEM(float, sm);
    /* grid x: (b, h, chunk) over nc-1 chunks: c < nc-1 (DL 0) or c >= 1 (DL 1); y: 64-row tiles of P */
    const int bh = (int)blockIdx.x / (d.nc - 1), c = (int)blockIdx.x % (d.nc - 1) + DL;
    const struct tc_chunk k = tc_chunk_at(d, bh * d.nc + c);
    const int t0 = k.t0, q = k.q, p0 = (int)blockIdx.y * TC_B;
    const int Np = tc_r16(d.N), Pp = tc_r16(d.P), lane = (int)threadIdx.x & 31, m0 = ((int)threadIdx.x >> 5) * 16;
    const int K = DL ? tc_r16(q) : tc_r16(2 * q), LN = TC_LD(Np), LP = TC_LD(Pp);
    float *w = sm, *cm = w + 2 * d.Q, *sc = sm + SSD_AL4(3 * d.Q);   /* sc: a row's scale, K of them */
    bf16 *Us = (bf16 *)(sc + tc_r16(2 * d.Q)), *Vs = Us + tc_outer_urows(d) * LP;
    if (DL)   /* no weights (dt, lam, A NULL): the decays alone */
        for (int i = (int)threadIdx.x; i < q; i += (int)blockDim.x) cm[i] = cum[(size_t)bh * d.T + t0 + i];
    else tc_weights(w, cm, k, cum, dt, lam, A, d);
    __syncthreads();
    if (DL)   /* sc_i = e_i = exp(cum_i) (0 past q) */
        for (int i = (int)threadIdx.x; i < K; i += (int)blockDim.x) sc[i] = i < q ? expf(cm[i]) : 0.0f;
    else tc_vout(sc, w, cm, 0, K, q, 1);   /* sc_j = v_j: every staged chunk has a next one */
    __syncthreads();
    if (DL) {   /* Us rows i: bf16(e_i dy_i) (K rows, 0 past q); Vs rows i: C_i */
        const auto rows = [&](int i, float &s) {
            s = sc[i];
            return i < q ? t0 + i : -1;
        };
        const size_t off = k.ob * k.xld + (size_t)k.h * d.P;
        if (u) tc_stage_rows(Us, LP, K, Pp, u + off, k.xld, d.P, rows);
        else tc_stage_rows(Us, LP, K, Pp, ub + off, k.xld, d.P, rows);   /* dy stored bf16 only: bf16(e_i bf16(dy_i)) */
        tc_stage_bc(Vs, LN, K, Np, vsrc, vtw, k, d.N, t0, 0, t0 + q);
    } else {    /* Us: the token rows of x (sources mapped); Vs rows j: bf16(v_j bf16(B_src(j))) */
        tc_stage_x(Us, LP, q + 2, Pp, u, ub, k, d.P, t0 - 1, 0, t0 + q);
        tc_stage_rows_bc(Vs, LN, K, Np, vsrc, vtw, k, d.N, [&](int j, float &s) {
            const int tok = t0 + (j < q ? j : j - q - 1);
            s = sc[j];
            return j < 2 * q && tok >= 0 ? tok : -1;
        });
    }
    __syncthreads();
    if (p0 + m0 >= d.P) return;
    const struct tc_op Uop = DL ? tc_plain(Us, LP) : tc_sources(Us, LP, q), Vop = tc_plain(Vs, LN);
    float acc[8][4];
    float *o = out + (size_t)k.ci * d.P * d.N;
    for (int nc0 = 0; nc0 < Np; nc0 += 64) {
        tc_zero(acc);
        tc_mma<1, 0>(acc, Uop, p0 + m0, Vop, nc0, tc_min(64, Np - nc0), K, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {   /* n, n+1 (n even, N even): one 8-byte store */
                const int p = p0 + m0 + TC_EROW(lane, e), n = nc0 + TC_ECOL(lane, j, e);
                if (p < d.P && n < d.N) *(tc_f2 *)(o + (size_t)p * d.N + n) = tc_f2{acc[j][e], acc[j][e + 1]};
            }
    }
}

/* ---- launches ---- */

int ssd_tc_supports(struct ssd_dims d)
{
    return d.Q <= SSD_TC_QMAX && d.P <= SSD_TC_QMAX && d.N <= SSD_TC_QMAX;
}

void ssd_tc_state(float *Sst, const float *cum, const float *x, const float *Bm, const float *dt, const float *lam,
                  const float *A, struct ssd_twins tw, struct ssd_dims d)
{
    if (d.nc < 2) return;
    const size_t smem = tc_outer_smem(d);
    if (!mt_cuda_smem_opt_in(ssd_tc_outer_k<0>, smem)) return;
    MT_LAUNCH(ssd_tc_outer_k<0>, dim3((unsigned)(d.B * d.H * (d.nc - 1)), (unsigned)((d.P + TC_B - 1) / TC_B)),
              TC_THREADS, smem)(Sst, cum, x, tw.X, Bm, tw.B, dt, lam, A, d);
    MT_CUDA_KCHECK();
}

void ssd_tc_dloc(float *dSo, const float *cum, const float *dy, const float *Cm, struct ssd_twins tw,
                 struct ssd_dims d)
{
    if (d.nc < 2) return;
    const size_t smem = tc_outer_smem(d);
    if (!mt_cuda_smem_opt_in(ssd_tc_outer_k<1>, smem)) return;
    MT_LAUNCH(ssd_tc_outer_k<1>, dim3((unsigned)(d.B * d.H * (d.nc - 1)), (unsigned)((d.P + TC_B - 1) / TC_B)),
              TC_THREADS, smem)(dSo, cum, dy, dy ? (const bf16 *)NULL : tw.Y, Cm, tw.C, (const float *)NULL,
                                (const float *)NULL, (const float *)NULL, d);
    MT_CUDA_KCHECK();
}

void ssd_tc_out(float *y, bf16 *y_b, const bf16 *Sst, const float *cum, const float *x, const float *Bm,
                const float *Cm, const float *dt, const float *lam, const float *A, const float *Dsk,
                struct ssd_twins tw, struct ssd_dims d)
{
    const size_t smem = tc_out_smem(d);
    if (!mt_cuda_smem_opt_in(ssd_tc_out_k, smem)) return;
    MT_LAUNCH(ssd_tc_out_k, dim3((unsigned)(d.B * d.H * d.nc), (unsigned)((d.Q + TC_B - 1) / TC_B)), TC_THREADS,
              smem)(y, y_b, Sst, cum, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    MT_CUDA_KCHECK();
}

void ssd_tc_backward_products(float *M, float *dG, float *dcs, float *rs, float *dx, bf16 *dxb, float *last_x,
                              float *dBm, bf16 *dBb, float *last_B, float *edge_x, float *edge_B, float *qj,
                              float *dCm, bf16 *dCb, float *inter, const bf16 *Sst, const bf16 *dSo,
                              const float *cum, const float *dy, const float *x, const float *Bm, const float *Cm,
                              const float *dt, const float *lam, const float *A, const float *Dsk,
                              struct ssd_twins tw, struct ssd_dims d)
{
    const unsigned nch = (unsigned)(d.B * d.H * d.nc), rt = (unsigned)((d.Q + TC_B - 1) / TC_B);
    bf16 *Mb = (bf16 *)M, *dGb = (bf16 *)dG;
    const size_t gm = tc_gm_smem(d), tok = tc_tok_smem(d);
    static_assert(SSD_TC_QMAX <= 128, "ssd_tc_gm_k: N in two 64-column passes at most");
    const bool two = tc_r16(d.N) > 64;
    if (!mt_cuda_smem_opt_in(two ? ssd_tc_gm_k<2> : ssd_tc_gm_k<1>, gm) || !mt_cuda_smem_opt_in(ssd_tc_tok_k<TC_TOK_DX>, tok) ||
        !mt_cuda_smem_opt_in(ssd_tc_tok_k<TC_TOK_DXB>, tok) || !mt_cuda_smem_opt_in(ssd_tc_tok_k<TC_TOK_DB>, tok) ||
        !mt_cuda_smem_opt_in(ssd_tc_tok_k<TC_TOK_DBB>, tok))
        return;
    if (two)
        MT_LAUNCH(ssd_tc_gm_k<2>, dim3(nch, rt), TC_THREADS, gm)(Mb, dGb, dcs, rs, dCm, dCb, inter, Sst, cum, dy, x, Bm,
                                                                 Cm, dt, lam, A, tw, d);
    else
        MT_LAUNCH(ssd_tc_gm_k<1>, dim3(nch, rt), TC_THREADS, gm)(Mb, dGb, dcs, rs, dCm, dCb, inter, Sst, cum, dy, x, Bm,
                                                                 Cm, dt, lam, A, tw, d);
    MT_CUDA_KCHECK();
    if (dxb)
        MT_LAUNCH(ssd_tc_tok_k<TC_TOK_DXB>, dim3(nch, rt), TC_THREADS, tok)(
            (float *)NULL, dxb, last_x, edge_x, (float *)NULL, Mb, dSo, cum, dy, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    else
        MT_LAUNCH(ssd_tc_tok_k<TC_TOK_DX>, dim3(nch, rt), TC_THREADS, tok)(
            dx, (bf16 *)NULL, (float *)NULL, edge_x, (float *)NULL, Mb, dSo, cum, dy, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    MT_CUDA_KCHECK();
    if (dBb)
        MT_LAUNCH(ssd_tc_tok_k<TC_TOK_DBB>, dim3(nch, rt), TC_THREADS, tok)(
            (float *)NULL, dBb, last_B, edge_B, qj, dGb, dSo, cum, dy, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    else
        MT_LAUNCH(ssd_tc_tok_k<TC_TOK_DB>, dim3(nch, rt), TC_THREADS, tok)(
            dBm, (bf16 *)NULL, (float *)NULL, edge_B, qj, dGb, dSo, cum, dy, x, Bm, Cm, dt, lam, A, Dsk, tw, d);
    MT_CUDA_KCHECK();
    if (d.nc > 1) {
        MT_LAUNCH(ssd_tc_edge_k, (unsigned)(d.B * d.H * (d.nc - 1)), 64, 0)(dx, dxb, last_x, dBm, dBb, last_B, edge_x,
                                                                             edge_B, d);
        MT_CUDA_KCHECK();
    }
}
