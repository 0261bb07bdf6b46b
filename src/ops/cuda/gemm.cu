/*
 * gemm.cu — C = alpha op(A) op(B) + beta C (row-major), fp32 through
 * cublasSgemm or bf16 through cuBLASLt, as mt_cuda_be->precision says.
 *
 * Row-major onto column-major: a row-major (R, S) matrix with leading
 * dimension ld is, byte for byte, the column-major (S, R) matrix (its
 * transpose) with the same ld. So the row-major product C = op(A) op(B) is
 * the column-major product C^T = op(B)^T op(A)^T, i.e.
 *     cublasSgemm(opB, opA, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc)
 * with the same transpose flags as given: op(B)^T of the column-major view
 * of B is exactly what cuBLAS's opB applied to that view yields.
 *
 * fp32 mode: CUBLAS_DEFAULT_MATH (IEEE fp32, no TF32) is set at init.
 *
 * bf16 mode (HOW IT WORKS):
 *   the table's buffers are fp32 (mt_ops.h), so the entry rounds its
 *   operands to bf16 (round to nearest even) into backend scratch, then
 *   runs one cuBLASLt matmul per tile with A, B bf16, compute and scale
 *   fp32, C = D fp32 (in place: beta C is read in fp32, the result written
 *   in fp32 — gradient accumulation with beta = 1 never rounds to bf16):
 *
 *     pick tiles mc x nc of C so that the bf16 copies of op(A)[mc rows] and
 *       op(B)[nc cols] fit MT_CUDA_BF16_SCRATCH_MB (one tile when they fit);
 *     for each row tile: convert op(A) rows -> sa (bf16, ld padded to 8)
 *       for each column tile: convert op(B) cols -> sb (once if nc == N)
 *         plan = cache[(ta, tb, mm, nn, K, lds, ldc, align(C))] or build it
 *                (descriptors + cublasLtMatmulAlgoGetHeuristic)
 *         cublasLtMatmul(sb as Lt's A, sa as Lt's B, C tile)   # the mapping above
 *
 *   K is never split, so each element's dot product runs in one matmul and
 *   tiling does not change the numbers. Why convert per call rather than
 *   keep bf16 shadow copies of the weights: the table's entries cannot
 *   tell a weight from an activation or know when the optimizer has
 *   changed a buffer (no hook after an update), so a shadow would need
 *   model and optimizer changes to stay valid; the conversion is one
 *   memory-bound pass over the operands (6 bytes per element against
 *   2·M·N·K flops), the same traffic a shadow refresh after every step
 *   would cost for weights, and activations would need it anyway.
 *   Scratch pointers are 256-byte aligned and the padded leading dimensions
 *   multiples of 8 elements (16 bytes), what the tensor-core kernels want;
 *   C keeps the caller's pointer and ldc, and its alignment (up to 16 bytes) is told
 *   to the heuristic (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C/D_BYTES).
 *   A tile the heuristic has no algorithm for runs through cublasSgemm on
 *   the fp32 operands instead: a named fallback, counted in
 *   mt_ops_cuda_info.gemm_bf16_fallbacks (never silent).
 *
 * Invariant (both modes): K == 0 or alpha == 0 never reaches cuBLAS (ld
 * arguments may be degenerate there); C is scaled by beta (beta == 0 writes
 * zeros without reading C, the BLAS rule), which is what the math says.
 * The error bound of bf16 mode is derived in docs/cuda.md ("bf16 mode").
 */
#include "cuda_impl.cuh"

#include <string.h>

/* C (M, N; ldc) = R (M, N; ldc): gemm_bf16_resid's seed where its product does not
 * read R itself (the sgemm fallback, K = 0 / alpha = 0) */
static __global__ void copy_rows_k(float *C, const float *R, int M, int N, int ldc)
{
    size_t total = (size_t)M * (size_t)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t o = e / (size_t)N * (size_t)ldc + e % (size_t)N;
        C[o] = R[o];
    }
}
static void copy_rows(float *C, const float *R, int M, int N, int ldc)
{
    if (C == R || M <= 0 || N <= 0) return;
    MT_LAUNCH(copy_rows_k, mt_cuda_blocks((size_t)M * (size_t)N, 256), 256, 0)(C, R, M, N, ldc);
    MT_CUDA_KCHECK();
}

static __global__ void scale_k(float *C, int M, int N, int ldc, float beta)
{
    size_t total = (size_t)M * (size_t)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)N, j = e % (size_t)N;
        float *c = C + i * (size_t)ldc + j;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

/* dst (rows, cols; ldd) = bf16(src (rows, cols; lds)), round to nearest even
 * (a bf16 source is copied as is: the packing of a bf16 operand).
 * Row y of a grid-stride over rows, 8 columns a thread: the row's start is
 * computed once (no 64-bit division per element: the flat-index version of
 * this kernel spent most of its time in e / cols and e % cols, and packing
 * is ~4e9 elements per step of the GPT-2 shape), and with vec the 8 columns
 * move as 16/32-byte loads and one 16-byte store; the columns past the last
 * group of 8, or every column when not vec, go one by one. */
static __device__ __forceinline__ __nv_bfloat16 as_bf16(float x) { return mt_cuda_bf16_rn(x); }
static __device__ __forceinline__ __nv_bfloat16 as_bf16(__nv_bfloat16 x) { return x; }
/* d[0, 8 n8) = bf16(s[0, 8 n8)), 4 elements a step from thread i0 in steps of
 * st: a warp's float4 loads are 512 contiguous bytes, its 8-byte stores 256.
 * (8 elements a thread as two float4 loads 16 bytes apart left every 32-byte
 * sector to two instructions: MT_EMU_COALESCE counted 2 sectors for each one a
 * load needs.) The same conversion of each element: the same bits. */
static __device__ __forceinline__ void cast_quads(__nv_bfloat16 *d, const float *s, size_t n8, size_t i0, size_t st)
{
    for (size_t q = i0; q < 2 * n8; q += st) mt_st_bf16x4(d + 4 * q, mt_ld_f4(s + 4 * q));
}
static __device__ __forceinline__ void pack_vec(__nv_bfloat16 *d, const float *s, int n8, int tid, int st)
{
    cast_quads(d, s, (size_t)n8, (size_t)tid, (size_t)st);
}
static __device__ __forceinline__ void pack_vec(__nv_bfloat16 *d, const __nv_bfloat16 *s, int n8, int tid, int st)
{
    for (int g = tid; g < n8; g += st) {   /* 16 bytes a lane, side by side */
        MT_VEC_CHECK(s + 8 * g, 16);
        MT_VEC_CHECK(d + 8 * g, 16);
        *reinterpret_cast<uint4 *>(d + 8 * g) = *reinterpret_cast<const uint4 *>(s + 8 * g);
    }
}
template <typename T>
static __global__ void to_bf16_k(__nv_bfloat16 *dst, int ldd, const T *src, int lds, int rows, int cols, int vec)
{
    const int n8 = vec ? cols / 8 : 0, tid = blockIdx.x * blockDim.x + threadIdx.x, st = gridDim.x * blockDim.x;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const T *s = src + (size_t)r * (size_t)lds;
        __nv_bfloat16 *d = dst + (size_t)r * (size_t)ldd;
        pack_vec(d, s, n8, tid, st);
        for (int c = 8 * n8 + tid; c < cols; c += st) d[c] = as_bf16(s[c]);
    }
}

/* the weights' shadows: dst[i] = bf16(src[i]); vector path: [0, 8*n8) by
 * cast_quads (n8 = 0 unless src and dst are 16-byte aligned), then the scalar tail */
static __device__ __forceinline__ void cast_span(__nv_bfloat16 *dst, const float *src, size_t n8, size_t n)
{
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    cast_quads(dst, src, n8, i0, st);
    for (size_t i = 8 * n8 + i0; i < n; i += st) dst[i] = mt_cuda_bf16_rn(src[i]);
}
static __global__ void cast_bf16_k(__nv_bfloat16 *dst, const float *src, size_t n8, size_t n)
{
    cast_span(dst, src, n8, n);
}

/* groups of 8 when both pointers are 16-byte aligned; the launch covers max(groups, tail) */
static size_t vec8_count(size_t n, const void *a, const void *b)
{
    return mt_cuda_aligned(a, 16) && mt_cuda_aligned(b, 16) ? n / 8 : 0;
}
static unsigned vec8_blocks(size_t n8, size_t n)
{
    size_t tail = n - 8 * n8;
    return mt_cuda_blocks(n8 > tail ? n8 : tail, 256);
}

static inline int pad8(int x) { return (x + 7) & ~7; }
static inline size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* largest power of two (<= 16) dividing the address: what the heuristic is
 * told an operand guarantees. Capped at 16 bytes (a tensor-core kernel's
 * vector / TMA access needs no more) because the alignments are part of the
 * plan cache's key: with the exact alignment (up to 256) the same shape on
 * buffers carved at different 64-byte offsets made up to 27 keys, and the
 * direct path (every bf16 twin and shadow) could cycle the 64-entry cache,
 * re-running the heuristic inside the step */
static inline int align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 16;
    while (al > 1 && (a & (uintptr_t)(al - 1))) al >>= 1;
    return al;
}
/* the alignment declared for cuBLASLt's C and D: the smaller of the two (D = C unless
 * gemm_bf16_resid reads its R as C) */
static inline int align_cr(const void *c, const void *r)
{
    return align_of(c) < align_of(r) ? align_of(c) : align_of(r);
}

static void sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc)
{
    if (!mt_cuda_graph_op("cublasSgemm", mt_cuda_sig(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)))
        return;
    mt_cuda_note_blas();
    MT_CUBLAS_CHECK(cublasSgemm(mt_cuda_be->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

/* ---- cuBLASLt plans ---- */

static void plan_release(struct mt_cuda_lt_plan *p)
{
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

extern "C" void mt_cuda_lt_plans_release(void)
{
    for (int i = 0; i < MT_CUDA_LT_PLANS; i++) plan_release(&mt_cuda_be->plans[i]);
    memset(mt_cuda_be->plan_next, 0, sizeof mt_cuda_be->plan_next);
    memset(mt_cuda_be->algos, 0, sizeof mt_cuda_be->algos);
    mt_cuda_be->algo_next = 0;
}

/* ---- Algorithm reuse ----
 * A heuristic query costs the host ~0.1 ms. Dense models meet a few dozen
 * shapes and query each once (the plan cache), but the routed experts'
 * GEMMs change shape every step (an expert's row count is M of its forward
 * and dx GEMMs, K of its weight gradient): the moe8 run of 2026-11-26 built
 * ~640 plans a step and its GEMMs took 4x the calibrated time. So a plan for
 * a new shape first asks the algorithm cache for its class (transposes, N,
 * M and K rounded up to a power of two, alignments: the varying dims of one
 * expert GEMM across steps stay in one or two classes), and takes that
 * algorithm when cublasLtMatmulAlgoCheck accepts it for the new layouts and
 * its workspace fits; else (or on the class's first shape) the heuristic
 * runs and its answer becomes the class's. Counted: gemm_plan_heuristics,
 * gemm_plan_algo_reuses. The numbers do not depend on the algorithm (K is
 * never split: every algorithm of a plan sums each dot product in one
 * matmul with fp32 accumulation, as the heuristic's own choice does). */
static int pow2_ceil(int x)
{
    int p = 1;
    while (p < x && p < (1 << 30)) p <<= 1;
    return p;
}

static struct mt_cuda_lt_algo_slot *algo_class(const struct mt_cuda_lt_plan *p, int create)
{
    const int mb = pow2_ceil(p->m), kb = pow2_ceil(p->k);
    for (int i = 0; i < MT_CUDA_LT_ALGOS; i++) {
        struct mt_cuda_lt_algo_slot *a = &mt_cuda_be->algos[i];
        if (a->used && a->ta == p->ta && a->tb == p->tb && a->mb == mb && a->n == p->n && a->kb == kb &&
            a->align_a == p->align_a && a->align_b == p->align_b && a->align_c == p->align_c &&
            a->c_bf16 == p->c_bf16 && a->batch == p->batch)
            return a;
    }
    if (!create) return NULL;
    struct mt_cuda_lt_algo_slot *a = &mt_cuda_be->algos[mt_cuda_be->algo_next];
    mt_cuda_be->algo_next = (mt_cuda_be->algo_next + 1) % MT_CUDA_LT_ALGOS;
    memset(a, 0, sizeof *a);
    a->used = 1;
    a->ta = p->ta; a->tb = p->tb; a->mb = mb; a->n = p->n; a->kb = kb;
    a->align_a = p->align_a; a->align_b = p->align_b; a->align_c = p->align_c; a->c_bf16 = p->c_bf16;
    a->batch = p->batch;
    return a;
}

/* the class's algorithm for plan p, when cuBLASLt accepts it for p's layouts */
static int algo_reuse(struct mt_cuda_lt_plan *p)
{
    const struct mt_cuda_lt_algo_slot *a = algo_class(p, 0);
    if (!a) return 0;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    if (cublasLtMatmulAlgoCheck(mt_cuda_be->lt, p->desc, p->la, p->lb, p->lc, p->lc, &a->algo, &res) !=
            CUBLAS_STATUS_SUCCESS ||
        res.state != CUBLAS_STATUS_SUCCESS || res.workspaceSize > MT_CUDA_LT_WS_BYTES)
        return 0;   /* not valid for this shape: the heuristic decides */
    p->algo = a->algo;
    p->ws = res.workspaceSize;
    p->ok = 1;
    mt_cuda_be->info.gemm_plan_algo_reuses++;
    return 1;
}

/* a strided batch of `count` matrices `stride` elements apart (gemm_bf16_batched) */
static int layout_batch(cublasLtMatrixLayout_t l, int count, long long stride)
{
    const int32_t c = (int32_t)count;
    const int64_t st = (int64_t)stride;
    return MT_CUBLASLT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c)) &&
           MT_CUBLASLT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st,
                                                           sizeof st));
}

/* Descriptors and algorithm for one bf16 tile, in the column-major view:
 * Lt's A = our op(B)^T source (sb, rows x cols as stored), Lt's B = our
 * op(A)^T source (sa), D = C (nn x mm column-major = our mm x nn row-major).
 * Returns 0 when a descriptor call failed (sticky error recorded). */
static int plan_build(struct mt_cuda_lt_plan *p)
{
    const cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t ta = (int32_t)opa, tb = (int32_t)opb;
    /* column-major shapes of the stored scratch: (rows, cols, ld) */
    const uint64_t a_rows = p->tb ? (uint64_t)p->k : (uint64_t)p->n, a_cols = p->tb ? (uint64_t)p->n : (uint64_t)p->k;
    const uint64_t b_rows = p->ta ? (uint64_t)p->m : (uint64_t)p->k, b_cols = p->ta ? (uint64_t)p->k : (uint64_t)p->m;
    if (!MT_CUBLASLT_OK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        !MT_CUBLASLT_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        !MT_CUBLASLT_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        !MT_CUBLASLT_OK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, a_rows, a_cols, p->ldb)) ||
        !MT_CUBLASLT_OK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, b_rows, b_cols, p->lda)) ||
        !MT_CUBLASLT_OK(cublasLtMatrixLayoutCreate(&p->lc, p->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, (uint64_t)p->n,
                                                   (uint64_t)p->m, p->ldc)))
        return 0;
    if (p->batch > 1 && !(layout_batch(p->la, p->batch, p->sb) && layout_batch(p->lb, p->batch, p->sa) &&
                          layout_batch(p->lc, p->batch, p->sd)))
        return 0;
    if (algo_reuse(p)) return 1;
    mt_cuda_be->info.gemm_plan_heuristics++;
    cublasLtMatmulPreference_t pref = NULL;
    const uint64_t max_ws = MT_CUDA_LT_WS_BYTES;
    /* Lt's A is our B, Lt's B our A (the mapping above) */
    const uint32_t al_a = (uint32_t)p->align_b, al_b = (uint32_t)p->align_a, al_c = (uint32_t)p->align_c;
    int ok = MT_CUBLASLT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
             MT_CUBLASLT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                                 sizeof max_ws)) &&
             MT_CUBLASLT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                                 sizeof al_a)) &&
             MT_CUBLASLT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                                 sizeof al_b)) &&
             MT_CUBLASLT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                                 sizeof al_c)) &&
             MT_CUBLASLT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                                 sizeof al_c));
    if (ok) {
        cublasLtMatmulHeuristicResult_t res;
        int n_res = 0;
        memset(&res, 0, sizeof res);
        /* "no algorithm" is an answer, not an error: the tile falls back */
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(mt_cuda_be->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                                           &res, &n_res);
        if (st == CUBLAS_STATUS_SUCCESS && n_res > 0 && res.state == CUBLAS_STATUS_SUCCESS &&
            res.workspaceSize <= MT_CUDA_LT_WS_BYTES) {
            p->algo = res.algo;
            p->ws = res.workspaceSize;
            p->ok = 1;
            algo_class(p, 1)->algo = res.algo;   /* the class's algorithm from now on */
        } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
            ok = MT_CUBLASLT_OK(st);
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return ok;
}

/* the cached plan of one matmul, or of a strided batch of `batch` (> 1) of
 * them, sa, sb, sd elements apart (A, B, C = D) */
static struct mt_cuda_lt_plan *plan_get_b(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, int align_c,
                                          int align_a, int align_b, int c_bf16, int batch, long long sa, long long sb,
                                          long long sd)
{
    if (batch <= 1) batch = 1, sa = sb = sd = 0;
    const long long key[] = {ta, tb, m, n, k, lda, ldb, ldc, align_c, align_a, align_b, c_bf16, batch, sa, sb, sd};
    /* the set: the key's fields mixed (FNV-1a), then avalanched (murmur3's fmix64) so the set's
     * low bits depend on every bit of every field, not only their low bits (sizes and leading
     * dimensions are mostly multiples of 64: without the finalizer most keys shared a set) */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof key / sizeof key[0]; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
    const int set = (int)(h % MT_CUDA_LT_SETS);
    struct mt_cuda_lt_plan *ways = &mt_cuda_be->plans[set * MT_CUDA_LT_WAYS];
    for (int i = 0; i < MT_CUDA_LT_WAYS; i++) {
        struct mt_cuda_lt_plan *p = &ways[i];
        if (p->used && p->ta == ta && p->tb == tb && p->m == m && p->n == n && p->k == k && p->lda == lda &&
            p->ldb == ldb && p->ldc == ldc && p->align_c == align_c && p->align_a == align_a && p->align_b == align_b &&
            p->c_bf16 == c_bf16 && p->batch == batch && p->sa == sa && p->sb == sb && p->sd == sd)
            return p;
    }
    struct mt_cuda_lt_plan *p = &ways[mt_cuda_be->plan_next[set]];
    mt_cuda_be->plan_next[set] = (unsigned char)((mt_cuda_be->plan_next[set] + 1) % MT_CUDA_LT_WAYS);
    /* a captured graph's matmul nodes use the plan's descriptors (and the emulator's replay
     * reads them): an evicted plan's would be destroyed under them, so the graphs go first
     * (as an allocation does it: the step goes on eagerly, the next records again) */
    if (p->used && mt_cuda_be->graph.want && mt_cuda_be->graph.step > 0) mt_cuda_graph_invalidate();
    plan_release(p);
    mt_cuda_be->ctr.plan_builds++;
    p->ta = ta; p->tb = tb; p->m = m; p->n = n; p->k = k;
    p->lda = lda; p->ldb = ldb; p->ldc = ldc; p->align_c = align_c;
    p->align_a = align_a; p->align_b = align_b; p->c_bf16 = c_bf16;
    p->batch = batch; p->sa = sa; p->sb = sb; p->sd = sd;
    if (!plan_build(p)) {
        plan_release(p);  /* error recorded; nothing cached */
        return NULL;
    }
    p->used = 1;
    return p;
}

static struct mt_cuda_lt_plan *plan_get(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, int align_c,
                                        int align_a, int align_b, int c_bf16)
{
    return plan_get_b(ta, tb, m, n, k, lda, ldb, ldc, align_c, align_a, align_b, c_bf16, 1, 0, 0, 0);
}

/* One matmul of a plan with an algorithm: D = alpha op(A) op(B) + beta C in our
 * row-major view (A, B our operands: Lt's B and A, the mapping above; C read
 * for beta, D written; a batch when the plan has one). Counted, a graph op
 * (its signature: the plan and every value the call passes), then issued. */
static void lt_matmul(const struct mt_cuda_lt_plan *p, float alpha, const void *A, const void *B, float beta,
                      const void *C, void *D)
{
    mt_cuda_be->info.gemm_bf16_calls++;
    if (!mt_cuda_graph_op("cublasLtMatmul", mt_cuda_sig((const void *)p, p->m, p->n, p->k, p->lda, p->ldb, p->ldc,
                                                        p->batch, alpha, B, A, beta, D, C)))
        return;
    mt_cuda_note_blas();
    MT_CUBLASLT_OK(cublasLtMatmul(mt_cuda_be->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, D, p->lc,
                                  &p->algo, mt_cuda_be->lt_ws, p->ws, mt_cuda_be->stream));
}

/* ---- bf16 ---- */

/* pack a stored operand (fp32: rounded and counted; bf16: copied). Launch:
 * a block per row (up to 65535, then grid-stride), threads for the row's
 * groups of 8 (rounded to a warp, at most 256): 96 for a 768-wide row. vec
 * when every row start of src and dst is 16-byte aligned. */
static void to_bf16(__nv_bfloat16 *dst, int ldd, const void *src, enum mt_elem t, int lds, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) return;
    const size_t es = t == MT_ELEM_BF16 ? 2 : 4;
    const int vec = mt_cuda_aligned(src, 16) && mt_cuda_aligned(dst, 16) && ((size_t)lds * es) % 16 == 0 &&
                    (ldd % 8) == 0;
    const int per_row = vec ? (cols / 8 > cols % 8 ? cols / 8 : cols % 8) : cols;
    int threads = (per_row + MT_WARP - 1) / MT_WARP * MT_WARP;
    if (threads > 256) threads = 256;
    int bx = (per_row + threads - 1) / threads;
    if (bx > 64) bx = 64;
    const dim3 grid((unsigned)bx, (unsigned)(rows < 65535 ? rows : 65535));
    if (t == MT_ELEM_BF16) {
        MT_LAUNCH(to_bf16_k<__nv_bfloat16>, grid, threads, 0)(dst, ldd, (const __nv_bfloat16 *)src, lds, rows, cols,
                                                               vec);
    } else {
        mt_cuda_be->info.gemm_bf16_cast_elems += (long)rows * (long)cols;
        MT_LAUNCH(to_bf16_k<float>, grid, threads, 0)(dst, ldd, (const float *)src, lds, rows, cols, vec);
    }
    MT_CUDA_KCHECK();
}

/* element offset into a stored operand of type t */
static inline const void *elem_at(const void *p, enum mt_elem t, size_t off)
{
    return t == MT_ELEM_BF16 ? (const void *)((const __nv_bfloat16 *)p + off) : (const void *)((const float *)p + off);
}

/* scratch bytes of op(A)'s rows [.., +mm) and op(B)'s columns [.., +nn) */
static size_t bytes_a(int ta, int mm, int K) { return up256((size_t)(ta ? K : mm) * (size_t)pad8(ta ? mm : K) * 2); }
static size_t bytes_b(int tb, int nn, int K) { return up256((size_t)(tb ? nn : K) * (size_t)pad8(tb ? K : nn) * 2); }

/* the largest multiple of 8 (>= 8, <= total) whose copy fits `avail` bytes */
static int fit_rows(size_t avail, size_t per_row, int total)
{
    size_t r = per_row ? avail / per_row : (size_t)total;
    r &= ~(size_t)7;
    if (r < 8) r = 8;
    return r >= (size_t)total ? total : (int)r;
}

/* C fp32 (c_bf16 0), or bf16 (c_bf16 1, gemm_bf16_out: beta 0, the fp32
 * result rounded once by cuBLASLt's epilogue); R: NULL, or what beta scales in
 * place of C (fp32, C's layout: gemm_bf16_resid, cuBLASLt's C operand with D = C) */
static void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const void *A, enum mt_elem at, int lda,
                      const void *B, enum mt_elem bt, int ldb, float beta, void *C, int ldc, int c_bf16, const float *R)
{
    const size_t cap = mt_cuda_be->bf16_cap;
    const size_t per_a = (size_t)2 * (size_t)(ta ? K : pad8(K)), per_b = (size_t)2 * (size_t)(tb ? pad8(K) : K);
    int mc = M, nc = N;
    if (bytes_a(ta, M, K) + bytes_b(tb, N, K) > cap) {
        if (bytes_b(tb, N, K) <= cap / 2)       mc = fit_rows(cap - bytes_b(tb, N, K), per_a, M);
        else if (bytes_a(ta, M, K) <= cap / 2)  nc = fit_rows(cap - bytes_a(ta, M, K), per_b, N);
        else { mc = fit_rows(cap / 2, per_a, M); nc = fit_rows(cap / 2, per_b, N); }
    }
    const size_t ba = bytes_a(ta, mc, K);
    char *ws = (char *)mt_cuda_workspace(ba + bytes_b(tb, nc, K));
    if (!ws) return;  /* sticky OOM recorded */
    __nv_bfloat16 *sa = (__nv_bfloat16 *)ws, *sb = (__nv_bfloat16 *)(ws + ba);
    for (int m0 = 0; m0 < M; m0 += mc) {
        const int mm = M - m0 < mc ? M - m0 : mc;
        /* op(A) rows m0..: stored rows (ta = 0) or stored columns (ta = 1) */
        const int lda_s = ta ? pad8(mm) : pad8(K);
        const void *a0 = elem_at(A, at, ta ? (size_t)m0 : (size_t)m0 * (size_t)lda);
        if (ta) to_bf16(sa, lda_s, a0, at, lda, K, mm);
        else    to_bf16(sa, lda_s, a0, at, lda, mm, K);
        for (int n0 = 0; n0 < N; n0 += nc) {
            const int nn = N - n0 < nc ? N - n0 : nc;
            const int ldb_s = tb ? pad8(K) : pad8(nn);
            const void *b0 = elem_at(B, bt, tb ? (size_t)n0 * (size_t)ldb : (size_t)n0);
            if (m0 == 0 || nc < N) {
                if (tb) to_bf16(sb, ldb_s, b0, bt, ldb, nn, K);
                else    to_bf16(sb, ldb_s, b0, bt, ldb, K, nn);
            }
            const size_t c_off = (size_t)m0 * (size_t)ldc + n0;
            void *c0 = c_bf16 ? (void *)((__nv_bfloat16 *)C + c_off) : (void *)((float *)C + c_off);
            const void *r0 = R ? (const void *)(R + c_off) : (const void *)c0;
            struct mt_cuda_lt_plan *p = plan_get(ta, tb, mm, nn, K, lda_s, ldb_s, ldc, align_cr(c0, r0), 256, 256,
                                                 c_bf16);
            if (!p) return;  /* descriptor failure recorded */
            if (!p->ok) {
                if (c_bf16) {   /* sgemm writes fp32 only */
                    MT_CUDA_UNSUPPORTED("cuBLASLt has no bf16 algorithm for a tile with a bf16 result");
                    return;
                }
                if (at != MT_ELEM_F32 || bt != MT_ELEM_F32) {
                    /* no fp32 original to fall back on: an error, never a silent substitute */
                    MT_CUDA_UNSUPPORTED("cuBLASLt has no bf16 algorithm for a tile with a bf16 operand");
                    return;
                }
                mt_cuda_be->info.gemm_bf16_fallbacks++;
                copy_rows((float *)c0, (const float *)r0, mm, nn, ldc);   /* sgemm's C is its D */
                sgemm(ta, tb, mm, nn, K, alpha, (const float *)a0, lda, (const float *)b0, ldb, beta, (float *)c0, ldc);
                continue;
            }
            lt_matmul(p, alpha, sa, sb, beta, r0, c0);
        }
    }
}

/* The shapes with nothing to multiply: an empty C, or K = 0 / alpha = 0
 * where C = beta C (cuBLAS would read A and B anyway). 1 when handled. */
static int gemm_degenerate(int M, int N, int K, float alpha, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return 1;
    if (K > 0 && alpha != 0.0f) return 0;
    if (beta != 1.0f) {
        MT_LAUNCH(scale_k, mt_cuda_blocks((size_t)M * (size_t)N, 256), 256, 0)(C, M, N, ldc, beta);
        MT_CUDA_KCHECK();
    }
    return 1;
}

extern "C" void mt_cuda_gemm(void *be, int transA, int transB, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (gemm_degenerate(M, N, K, alpha, beta, C, ldc)) return;
    if (mt_cuda_be->precision == MT_CUDA_PRECISION_BF16)
        gemm_bf16(transA, transB, M, N, K, alpha, A, MT_ELEM_F32, lda, B, MT_ELEM_F32, ldb, beta, C, ldc, 0, NULL);
    else
        sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* gemm_bf16 entry (precision=bf16): operands typed per call. Two bf16
 * operands are first tried AS STORED (the caller's pointers, leading
 * dimensions and alignments declared to the heuristic): one cuBLASLt matmul,
 * no conversion, no scratch — the path of a bf16 weight shadow times a bf16
 * operand. When the heuristic has no algorithm for that layout (e.g. a
 * leading dimension that is not a multiple of 8), or an operand is fp32,
 * the operands are packed (bf16 copied, fp32 rounded: counted in
 * gemm_bf16_cast_elems) into the padded scratch of the per-call path above.
 * The numbers are the same either way: bf16 products, fp32 accumulation,
 * K never split. Independent of mt_cuda_be->precision (the plain gemm entry
 * stays fp32 unless MT_CUDA_PRECISION=bf16 asks otherwise). */
/* the direct path or the per-call path, C fp32 or bf16 (c_bf16); R as gemm_bf16's */
static void gemm_bf16_call(int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                           int lda, const void *B, enum mt_elem b_type, int ldb, float beta, void *C, int ldc,
                           int c_bf16, const float *R)
{
    if (a_type == MT_ELEM_BF16 && b_type == MT_ELEM_BF16) {
        const void *Rc = R ? (const void *)R : (const void *)C;
        struct mt_cuda_lt_plan *p = plan_get(transA, transB, M, N, K, lda, ldb, ldc, align_cr(C, Rc), align_of(A),
                                             align_of(B), c_bf16);
        if (!p) return;  /* descriptor failure recorded */
        if (p->ok) {
            mt_cuda_be->info.gemm_bf16_direct++;
            lt_matmul(p, alpha, A, B, beta, Rc, C);
            return;
        }
    }
    gemm_bf16(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, ldc, c_bf16, R);
}

extern "C" void mt_cuda_gemm_bf16(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                                  enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb,
                                  float beta, float *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (gemm_degenerate(M, N, K, alpha, beta, C, ldc)) return;
    gemm_bf16_call(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, ldc, 0, NULL);
}

/* gemm_bf16_resid (mt_ops.h): C = alpha op(A) op(B) + R, cuBLASLt's C operand R
 * and D = C with beta 1 (the epilogue reads R where it read C's seed copy: the
 * same bits); K = 0 or alpha = 0: C = R */
extern "C" void mt_cuda_gemm_bf16_resid(void *be, int transA, int transB, int M, int N, int K, float alpha,
                                        const void *A, enum mt_elem a_type, int lda, const void *B,
                                        enum mt_elem b_type, int ldb, const float *R, float *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        copy_rows(C, R, M, N, ldc);
        return;
    }
    gemm_bf16_call(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, 1.0f, C, ldc, 0, R);
}

/* gemm_bf16_out (mt_ops.h): C bf16 = bf16(alpha op(A) op(B)), cuBLASLt's D
 * in bf16 (its epilogue rounds the fp32 accumulator once); K = 0 or alpha =
 * 0: zeros */
extern "C" void mt_cuda_gemm_bf16_out(void *be, int transA, int transB, int M, int N, int K, float alpha,
                                      const void *A, enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type,
                                      int ldb, mt_bf16 *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        for (int i = 0; i < (ldc == N ? 1 : M); i++)   /* bf16 zero = all bits 0 */
            MT_CUDA_CHECK(cudaMemsetAsync(C + (size_t)i * (size_t)ldc, 0, (size_t)N * 2 * (ldc == N ? (size_t)M : 1),
                                          mt_cuda_be->stream));
        return;
    }
    gemm_bf16_call(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, 0.0f, C, ldc, 1, NULL);
}

/* D_i = bf16(beta C_i) (gemm_bf16_batched with K = 0 or alpha = 0): a block row per matrix */
static __global__ void batched_scale_k(__nv_bfloat16 *D, const __nv_bfloat16 *C, float beta, int M, int N, int ldd,
                                       size_t stride_d)
{
    const size_t off = (size_t)blockIdx.y * stride_d;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)M * (size_t)N;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t at = off + e / (size_t)N * (size_t)ldd + e % (size_t)N;
        D[at] = mt_cuda_bf16_rn(beta == 0.0f ? 0.0f : beta * __bfloat162float(C[at]));
    }
}

/* the alignment a batch's operand keeps in every matrix: its base's, capped by its stride's */
static int align_batch(const void *p, size_t stride_elems, int count)
{
    const int a = align_of(p);
    if (count <= 1) return a;
    const int s = align_of((const void *)(uintptr_t)(stride_elems * 2));
    return a < s ? a : s;
}

/* gemm_bf16_batched (mt_ops.h): one cuBLASLt matmul over the batch (bf16 C and
 * D; C is D where beta is 0); with no algorithm for the batch, each matrix on
 * the per-call path (C_i copied into D_i first, then beta onto D_i). */
extern "C" void mt_cuda_gemm_bf16_batched(void *be, int transA, int transB, int M, int N, int K, float alpha,
                                          const mt_bf16 *A, int lda, size_t stride_a, const mt_bf16 *B, int ldb,
                                          size_t stride_b, float beta, const mt_bf16 *C, mt_bf16 *D, int ldd,
                                          size_t stride_d, int count)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (M <= 0 || N <= 0 || count <= 0) return;
    __nv_bfloat16 *d = (__nv_bfloat16 *)D;
    const __nv_bfloat16 *c = beta != 0.0f && C ? (const __nv_bfloat16 *)C : d;
    if (K <= 0 || alpha == 0.0f) {
        const dim3 grid(mt_cuda_blocks((size_t)M * (size_t)N, 256), (unsigned)count);
        MT_LAUNCH(batched_scale_k, grid, 256, 0)(d, c, beta, M, N, ldd, stride_d);
        MT_CUDA_KCHECK();
        return;
    }
    const int al_d = align_batch(D, stride_d, count), al_c = align_batch(c, stride_d, count);
    struct mt_cuda_lt_plan *p =
        plan_get_b(transA, transB, M, N, K, lda, ldb, ldd, al_d < al_c ? al_d : al_c, align_batch(A, stride_a, count),
                   align_batch(B, stride_b, count), 1, count, (long long)stride_a, (long long)stride_b,
                   (long long)stride_d);
    if (!p) return;  /* descriptor failure recorded */
    if (p->ok) {
        mt_cuda_be->info.gemm_bf16_direct++;
        lt_matmul(p, alpha, A, B, beta, c, d);
        return;
    }
    for (int i = 0; i < count; i++) {
        __nv_bfloat16 *di = d + (size_t)i * stride_d;
        if (c != d) to_bf16(di, ldd, c + (size_t)i * stride_d, MT_ELEM_BF16, ldd, M, N);
        gemm_bf16(transA, transB, M, N, K, alpha, A + (size_t)i * stride_a, MT_ELEM_BF16, lda,
                  B + (size_t)i * stride_b, MT_ELEM_BF16, ldb, beta, di, ldd, 1, NULL);
    }
}

extern "C" void mt_cuda_cast_bf16(void *be, mt_bf16 *dst, const float *src, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n == 0) return;
    const size_t n8 = vec8_count(n, dst, src);
    MT_LAUNCH(cast_bf16_k, vec8_blocks(n8, n), 256, 0)((__nv_bfloat16 *)dst, src, n8, n);
    MT_CUDA_KCHECK();
}

/* mt_cuda_cast_bf16 of a dense (rows, cols) source into rows ld apart (ld 0: cols,
 * the dense cast); the elements between dst's rows are not written. A thread an
 * element, row-major (the fallback paths' strided outputs, not a hot path). */
static __global__ void cast_bf16_rows_k(__nv_bfloat16 *dst, size_t ld, const float *src, size_t rows, size_t cols)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    const size_t r = i / cols, c = i - r * cols;
    dst[r * ld + c] = __float2bfloat16_rn(src[i]);
}

void mt_cuda_cast_bf16_rows(void *be, mt_bf16 *dst, size_t ld, const float *src, size_t rows, size_t cols)
{
    if (ld == 0 || ld == cols) { mt_cuda_cast_bf16(be, dst, src, rows * cols); return; }
    MT_CUDA_BIND(be);
    const size_t n = rows * cols;
    if (n == 0) return;
    MT_LAUNCH(cast_bf16_rows_k, (unsigned)((n + 255) / 256), 256, 0)((__nv_bfloat16 *)dst, ld, src, rows, cols);
    MT_CUDA_KCHECK();
}

/* cast_bf16_multi: cast_bf16_k's loops on up to MT_OPS_LIST_MAX tensors in
 * one launch, blockIdx.y the tensor (its pointers, vector groups and length
 * a launch argument, as adamw_multi_k); the same per-element conversion */
struct cast_list {
    __nv_bfloat16 *dst[MT_OPS_LIST_MAX];
    const float   *src[MT_OPS_LIST_MAX];
    size_t         n8[MT_OPS_LIST_MAX], n[MT_OPS_LIST_MAX];
};

static __global__ void cast_bf16_multi_k(struct cast_list L)
{
    const int t = blockIdx.y;
    cast_span(L.dst[t], L.src[t], L.n8[t], L.n[t]);
}

extern "C" void mt_cuda_cast_bf16_multi(void *be, mt_bf16 *const *dst, const float *const *src, const size_t *n,
                                        int count)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    for (int base = 0; base < count; base += MT_OPS_LIST_MAX) {
        const int c = count - base < MT_OPS_LIST_MAX ? count - base : MT_OPS_LIST_MAX;
        struct cast_list L;
        memset(&L, 0, sizeof L);
        unsigned blocks = 0;
        for (int t = 0; t < c; t++) {
            L.dst[t] = (__nv_bfloat16 *)dst[base + t];
            L.src[t] = src[base + t];
            L.n[t] = n[base + t];
            L.n8[t] = vec8_count(L.n[t], L.dst[t], L.src[t]);
            const unsigned b = L.n[t] ? vec8_blocks(L.n8[t], L.n[t]) : 0;
            if (b > blocks) blocks = b;
        }
        if (!blocks) continue;
        MT_LAUNCH(cast_bf16_multi_k, dim3(blocks, (unsigned)c), 256, 0)(L);
        MT_CUDA_KCHECK();
    }
}

/* dst[i] = float(src[i]) (exact: the bits shifted up); vector path as cast_bf16_k's,
 * 4 elements a step (8-byte loads, float4 stores: a warp's contiguous) */
static __global__ void widen_bf16_k(float *dst, const __nv_bfloat16 *src, size_t n8, size_t n)
{
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (size_t q = i0; q < 2 * n8; q += st) mt_st_f4(dst + 4 * q, mt_ld4(src + 4 * q));
    for (size_t i = 8 * n8 + i0; i < n; i += st) dst[i] = __bfloat162float(src[i]);
}

extern "C" void mt_cuda_widen_bf16(void *be, float *dst, const mt_bf16 *src, size_t n)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (n == 0) return;
    const size_t n8 = vec8_count(n, dst, src);
    MT_LAUNCH(widen_bf16_k, vec8_blocks(n8, n), 256, 0)(dst, (const __nv_bfloat16 *)src, n8, n);
    MT_CUDA_KCHECK();
}

/* ---- grouped GEMM (MoE experts) ----
 *
 * HOW IT WORKS: fp32 mode sends the non-empty groups to ONE
 * cublasGemmGroupedBatchedEx (cuBLAS >= 12.5) per chunk of up to 128 groups
 * (MoE layers have far fewer), with the row-major mapping of `sgemm` per
 * group (cuBLAS m = N[g], n = M[g], A' = B[g], B' = A[g]), group_size 1
 * each. Its pointer arrays must live in device memory: a one-block kernel
 * writes them into the backend workspace from a by-value argument (3 x 128
 * pointers = 3 KiB, under the 4 KiB parameter limit), so the call stays
 * stream-ordered with no host synchronisation (a pageable cudaMemcpyAsync
 * would sync the stream). The per-group m/n/k/ld/alpha/beta arrays are host
 * arrays, read by cuBLAS during the call. Groups with K = 0 or alpha = 0 (a
 * scale of C) go through mt_cuda_gemm. bf16 mode or an older cuBLAS: a loop
 * of mt_cuda_gemm — counted, with the reason in
 * mt_ops_cuda_info.gemm_grouped_fallback (the receipt's fallback_reason). */
#define MT_CUDA_GROUP_CHUNK 128

struct grouped_ptrs {
    const void *p[3 * MT_CUDA_GROUP_CHUNK];   /* A' (= B) [ng], B' (= A) [ng], C [ng] */
};

__global__ void grouped_ptrs_k(struct grouped_ptrs in, const void **out, int n)
{
    int i = threadIdx.x;
    if (i < n) out[i] = in.p[i];
}

static void grouped_loop(int transA, int transB, int n, const int *M, const int *N, const int *K, float alpha,
                         const float *const *A, int lda, const float *const *B, int ldb, float beta,
                         float *const *C, int ldc, const char *why)
{
    mt_cuda_be->info.gemm_grouped_loops++;
    snprintf(mt_cuda_be->info.gemm_grouped_fallback, sizeof mt_cuda_be->info.gemm_grouped_fallback, "%s", why);
    for (int g = 0; g < n; g++) mt_cuda_gemm(mt_cuda_be, transA, transB, M[g], N[g], K[g], alpha, A[g], lda, B[g], ldb, beta, C[g], ldc);
}

extern "C" void mt_cuda_gemm_grouped(void *be, int transA, int transB, int n, const int *M, const int *N, const int *K,
                                     float alpha, const float *const *A, int lda, const float *const *B, int ldb,
                                     float beta, float *const *C, int ldc)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    mt_cuda_be->info.gemm_grouped_calls++;
    if (n <= 0) return;
    if (mt_cuda_be->precision == MT_CUDA_PRECISION_BF16) {
        grouped_loop(transA, transB, n, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                     "bf16 mode: grouped GEMM runs as a loop of cuBLASLt bf16 matmuls (no grouped Lt path yet)");
        return;
    }
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
    cublasOperation_t ta[MT_CUDA_GROUP_CHUNK], tb[MT_CUDA_GROUP_CHUNK];
    int m[MT_CUDA_GROUP_CHUNK], nn[MT_CUDA_GROUP_CHUNK], k[MT_CUDA_GROUP_CHUNK], la[MT_CUDA_GROUP_CHUNK],
        lb[MT_CUDA_GROUP_CHUNK], lc[MT_CUDA_GROUP_CHUNK], gs[MT_CUDA_GROUP_CHUNK];
    float al[MT_CUDA_GROUP_CHUNK], bg[MT_CUDA_GROUP_CHUNK];
    struct grouped_ptrs pt = {};   /* zeroed: the unused tail is part of the launch's signature (graphs) */
    const void *tmp[3][MT_CUDA_GROUP_CHUNK];
    int g = 0;
    while (g < n) {
        int ng = 0;
        for (; g < n && ng < MT_CUDA_GROUP_CHUNK; g++) {
            if (M[g] <= 0 || N[g] <= 0) continue;
            if (K[g] <= 0 || alpha == 0.0f) {   /* C = beta C: the scale kernel */
                mt_cuda_gemm(mt_cuda_be, transA, transB, M[g], N[g], K[g], alpha, A[g], lda, B[g], ldb, beta, C[g], ldc);
                continue;
            }
            ta[ng] = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
            tb[ng] = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
            m[ng] = N[g];
            nn[ng] = M[g];
            k[ng] = K[g];
            la[ng] = ldb;
            lb[ng] = lda;
            lc[ng] = ldc;
            gs[ng] = 1;
            al[ng] = alpha;
            bg[ng] = beta;
            tmp[0][ng] = B[g];
            tmp[1][ng] = A[g];
            tmp[2][ng] = C[g];
            ng++;
        }
        if (ng == 0) continue;
        for (int a = 0; a < 3; a++) memcpy(pt.p + (size_t)a * ng, tmp[a], ng * sizeof(void *));
        const void **dptr = (const void **)mt_cuda_workspace(3 * (size_t)ng * sizeof(void *));
        if (!dptr) return;   /* recorded (sticky OOM) */
        MT_LAUNCH(grouped_ptrs_k, 1, 3 * MT_CUDA_GROUP_CHUNK, 0)(pt, dptr, 3 * ng);
        MT_CUDA_KCHECK();
        /* the host arrays are read at the call (a capture keeps their values) */
        uint64_t h = mt_cuda_sig((const void *)dptr, ng);
        h = mt_cuda_sig_array(mt_cuda_sig_array(mt_cuda_sig_array(h, m, ng), nn, ng), k, ng);
        h = mt_cuda_sig_array(mt_cuda_sig_array(mt_cuda_sig_array(h, ta, ng), tb, ng), al, ng);
        h = mt_cuda_sig_array(mt_cuda_sig_array(mt_cuda_sig_array(h, la, ng), lb, ng), lc, ng);
        if (!mt_cuda_graph_op("cublasGemmGroupedBatchedEx", mt_cuda_sig_array(h, bg, ng))) continue;
        mt_cuda_note_blas();
        MT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(mt_cuda_be->blas, ta, tb, m, nn, k, al, dptr, CUDA_R_32F, la,
                                                   dptr + ng, CUDA_R_32F, lb, bg, (void *const *)(dptr + 2 * ng),
                                                   CUDA_R_32F, lc, ng, gs, CUBLAS_COMPUTE_32F));
    }
#else
    grouped_loop(transA, transB, n, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                 "cuBLAS < 12.5 has no cublasGemmGroupedBatchedEx: loop of cublasSgemm");
#endif
}
