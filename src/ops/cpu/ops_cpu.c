/*
 * ops_cpu.c — the cpu backend's kernel table (OpenBLAS + OpenMP), its BLAS
 * information for the receipt, thread control, and the OpenBLAS core-type pin.
 *
 * Invariant: the table is a constant; the only process state touched here is
 * the environment (before OpenBLAS loads, via re-exec) and the OpenMP/OpenBLAS
 * thread counts.
 */
#define _GNU_SOURCE
#include "../mt_ops.h"
#include "cpu_impl.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *cpu_buf_alloc(void *be, struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    return mt_alloc(ctx, bytes, bucket);
}

static void cpu_buf_free(void *be, struct mt_ctx *ctx, void *p)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    mt_free(ctx, p);
}

static void cpu_copy(void *be, void *dst, const void *src, size_t bytes)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    if (bytes && dst != src) memcpy(dst, src, bytes);
}

static void cpu_sync(void *be)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
}

/* ---- per-op profile: thin wrappers (see mt_ops.h) ----
 * When off, a wrapper is one well-predicted branch and a tail call; when on,
 * two clock reads (~40 ns) around a kernel that runs for microseconds. */
static int    prof_on;
static double prof_sec[MT_OPK_COUNT];
static long   prof_calls[MT_OPK_COUNT];
static struct { const char *name; double sec; long calls; } prof_ent[MT_OPS_PROFILE_ENTRIES];
static int    prof_n_ent;

#define PROF(kind, call)                              \
    do {                                              \
        if (!prof_on) { call; return; }               \
        double t0_ = mt_time_sec();                   \
        call;                                         \
        double dt_ = mt_time_sec() - t0_;             \
        mt_ops_profile_add(kind, dt_);                \
        mt_ops_profile_add_entry(__func__, dt_);      \
    } while (0)
#define PROF_RET(kind, type, call)                    \
    do {                                              \
        if (!prof_on) return call;                    \
        double t0_ = mt_time_sec();                   \
        type r_ = call;                               \
        double dt_ = mt_time_sec() - t0_;             \
        mt_ops_profile_add(kind, dt_);                \
        mt_ops_profile_add_entry(__func__, dt_);      \
        return r_;                                    \
    } while (0)

void mt_ops_profile_enable(int on) { prof_on = on != 0; }
int  mt_ops_profile_enabled(void) { return prof_on; }

void mt_ops_profile_reset(void)
{
    memset(prof_sec, 0, sizeof prof_sec);
    memset(prof_calls, 0, sizeof prof_calls);
    memset(prof_ent, 0, sizeof prof_ent);
    prof_n_ent = 0;
}

void mt_ops_profile_add_entry(const char *name, double seconds)
{
    if (!prof_on || !name) return;
    /* by pointer (the same literal every call: one pass of compares), then by
     * text for a name first seen through another pointer */
    int i = 0;
    while (i < prof_n_ent && prof_ent[i].name != name) i++;
    if (i == prof_n_ent) {
        i = 0;
        while (i < prof_n_ent && strcmp(prof_ent[i].name, name) != 0) i++;
    }
    if (i == prof_n_ent) {
        if (prof_n_ent == MT_OPS_PROFILE_ENTRIES) {
            i = MT_OPS_PROFILE_ENTRIES - 1;
            prof_ent[i].name = "(more)";
        } else {
            prof_ent[prof_n_ent++].name = name;
        }
    }
    prof_ent[i].sec += seconds;
    prof_ent[i].calls++;
}

int mt_ops_profile_entries(const char **names, double *seconds, long *calls, int cap)
{
    int n = prof_n_ent < cap ? prof_n_ent : cap;
    for (int i = 0; i < n; i++) {
        if (names) names[i] = prof_ent[i].name;
        if (seconds) seconds[i] = prof_ent[i].sec;
        if (calls) calls[i] = prof_ent[i].calls;
    }
    return n;
}

/* the kind every op counts under while set (mt_ops_profile_scope), or -1 */
static int prof_scope = -1;

int mt_ops_profile_scope(int kind)
{
    const int before = prof_scope;
    prof_scope = kind >= 0 && kind < MT_OPK_COUNT ? kind : -1;
    return before;
}

enum mt_op_kind mt_ops_profile_kind(enum mt_op_kind kind)
{
    return prof_scope >= 0 ? (enum mt_op_kind)prof_scope : kind;
}

void mt_ops_profile_add(enum mt_op_kind kind, double seconds)
{
    kind = mt_ops_profile_kind(kind);
    if (!prof_on || (int)kind < 0 || kind >= MT_OPK_COUNT) return;
    prof_sec[kind] += seconds;
    prof_calls[kind]++;
}

void mt_ops_profile_get(double seconds[MT_OPK_COUNT], long calls[MT_OPK_COUNT])
{
    for (int k = 0; k < MT_OPK_COUNT; k++) {
        if (seconds) seconds[k] = prof_sec[k];
        if (calls) calls[k] = prof_calls[k];
    }
}

const char *mt_ops_profile_kind_name(enum mt_op_kind kind)
{
    static const char *const names[MT_OPK_COUNT] = {"gemm", "attention", "xent", "norm", "elementwise",
                                                    "optimizer", "communication", "scan",
                                                    "attention_bwd"};
    return (int)kind >= 0 && kind < MT_OPK_COUNT ? names[kind] : "?";
}

/* a device copy is elementwise work in the profile (Muon's, the pipeline's), as on cuda */
static void p_copy(void *be, void *dst, const void *src, size_t bytes)
{
    PROF(MT_OPK_ELEMENTWISE, cpu_copy(be, dst, src, bytes));
}
static void p_fill(void *be, float *x, float value, size_t n) {
    (void)be;   /* stateless / not yet used (docs/cuda.md) */ PROF(MT_OPK_ELEMENTWISE, mt_cpu_fill(x, value, n)); }
static void p_axpby(void *be, float *y, const float *x, float a, float b, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_axpby(y, x, a, b, n));
}
static double p_sumsq(void *be, const float *x, size_t n) {
    (void)be;   /* stateless / not yet used (docs/cuda.md) */ PROF_RET(MT_OPK_ELEMENTWISE, double, mt_cpu_sumsq(x, n)); }
static int p_all_finite(void *be, const float *x, size_t n) {
    (void)be;   /* stateless / not yet used (docs/cuda.md) */ PROF_RET(MT_OPK_ELEMENTWISE, int, mt_cpu_all_finite(x, n)); }
static void p_gemm(void *be, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_GEMM, mt_cpu_gemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}
/* the n gemm calls themselves, in group order: bit-identical to the loop it replaces */
static void p_gemm_grouped(void *be, int transA, int transB, int n, const int *M, const int *N, const int *K, float alpha,
                           const float *const *A, int lda, const float *const *B, int ldb, float beta,
                           float *const *C, int ldc)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    for (int g = 0; g < n; g++)
        if (M[g] > 0 && N[g] > 0)
            p_gemm(be, transA, transB, M[g], N[g], K[g], alpha, A[g], lda, B[g], ldb, beta, C[g], ldc);
}
static void p_gemm_bf16(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                        enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, float beta, float *C,
                        int ldc)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_GEMM, mt_cpu_gemm_bf16(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, beta, C, ldc));
}
static void p_gemm_bf16_out(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                            enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, mt_bf16 *C,
                            int ldc)
{
    (void)be;
    PROF(MT_OPK_GEMM, mt_cpu_gemm_bf16_out(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, C, ldc));
}
static void p_gemm_bf16_resid(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                              enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, const float *R,
                              float *C, int ldc)
{
    (void)be;
    PROF(MT_OPK_GEMM, mt_cpu_gemm_bf16_resid(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, R, C, ldc));
}
/* gemm_grouped_rows / gemm_grouped_sum (mt_ops.h): the reference, one
 * gemm_bf16 (or gemm_bf16_out) per non-empty group; offs is host memory here */
static void grouped_rows(int n, const int32_t *offs, int N, int K, int transB, float alpha, const mt_bf16 *A,
                         int lda, const mt_bf16 *const *B, int ldb, float beta, void *C, enum mt_elem c_type, int ldc)
{
    for (int g = 0; g < n; g++) {
        const int r0 = offs[g], rows = offs[g + 1] - offs[g];
        if (rows <= 0) continue;
        const mt_bf16 *a = A + (size_t)r0 * (size_t)lda;
        if (c_type == MT_ELEM_BF16)
            mt_cpu_gemm_bf16_out(0, transB, rows, N, K, alpha, a, MT_ELEM_BF16, lda, B[g], MT_ELEM_BF16, ldb,
                                 (mt_bf16 *)C + (size_t)r0 * (size_t)ldc, ldc);
        else
            mt_cpu_gemm_bf16(0, transB, rows, N, K, alpha, a, MT_ELEM_BF16, lda, B[g], MT_ELEM_BF16, ldb, beta,
                             (float *)C + (size_t)r0 * (size_t)ldc, ldc);
    }
}
static void grouped_sum(int n, const int32_t *offs, int M, int N, float alpha, const mt_bf16 *A, int lda,
                        const mt_bf16 *B, int ldb, float beta, float *const *C, int ldc)
{
    for (int g = 0; g < n; g++) {   /* an empty group: C_g = beta C_g (gemm's K = 0) */
        const int r0 = offs[g];
        mt_cpu_gemm_bf16(1, 0, M, N, offs[g + 1] - r0, alpha, A + (size_t)r0 * (size_t)lda, MT_ELEM_BF16, lda,
                         B + (size_t)r0 * (size_t)ldb, MT_ELEM_BF16, ldb, beta, C[g], ldc);
    }
}
static void count_acc(double *load, const int32_t *offs, int n, double sign)
{
    for (int e = 0; e < n; e++) load[e] += sign * (double)(offs[e + 1] - offs[e]);
}
static void p_gemm_grouped_rows(void *be, int n, const int32_t *offs, int max_rows, int N, int K, int transB,
                                float alpha, const mt_bf16 *A, int lda, const mt_bf16 *const *B, int ldb, float beta,
                                void *C, enum mt_elem c_type, int ldc)
{
    (void)be;
    (void)max_rows;
    PROF(MT_OPK_GEMM, grouped_rows(n, offs, N, K, transB, alpha, A, lda, B, ldb, beta, C, c_type, ldc));
}
static void p_gemm_grouped_sum(void *be, int n, const int32_t *offs, int M, int N, float alpha, const mt_bf16 *A,
                               int lda, const mt_bf16 *B, int ldb, float beta, float *const *C, int ldc)
{
    (void)be;
    PROF(MT_OPK_GEMM, grouped_sum(n, offs, M, N, alpha, A, lda, B, ldb, beta, C, ldc));
}
static void p_moe_count_acc(void *be, double *load, const int32_t *offs, int n, double sign)
{
    (void)be;
    PROF(MT_OPK_ELEMENTWISE, count_acc(load, offs, n, sign));
}
static void p_cast_bf16(void *be, mt_bf16 *dst, const float *src, size_t n) {
    (void)be;   /* stateless / not yet used (docs/cuda.md) */ PROF(MT_OPK_ELEMENTWISE, mt_cpu_cast_bf16(dst, src, n)); }
static void p_gemm_bf16_batched(void *be, int transA, int transB, int M, int N, int K, float alpha, const mt_bf16 *A,
                                int lda, size_t stride_a, const mt_bf16 *B, int ldb, size_t stride_b, float beta,
                                const mt_bf16 *C, mt_bf16 *D, int ldd, size_t stride_d, int count)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_GEMM, mt_cpu_gemm_bf16_batched(transA, transB, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta,
                                               C, D, ldd, stride_d, count));
}
static void p_cast_bf16_multi(void *be, mt_bf16 *const *dst, const float *const *src, const size_t *n, int count)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    /* optimizer: its one caller refreshes the weights' shadows (model.c), as the plan counts it */
    PROF(MT_OPK_OPTIMIZER, for (int i = 0; i < count; i++) mt_cpu_cast_bf16(dst[i], src[i], n[i]));
}
static void p_widen_bf16(void *be, float *dst, const mt_bf16 *src, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, for (size_t i = 0; i < n; i++) dst[i] = mt_cpu_bf16_to_f32(src[i]));
}
static void p_embed_forward(void *be, float *out, const int32_t *idx, const float *wte, int N, int C)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_embed_forward(out, idx, wte, N, C));
}
static void p_embed_backward(void *be, float *dwte, const float *dout, const int32_t *idx, int N, int C, int V)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_embed_backward(dwte, dout, idx, N, C, V));
}
static void p_rmsnorm_forward(void *be, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                              float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rmsnorm_forward(out, rstd, inp, weight, N, C, eps));
}
/* the same rmsnorm with its output rounded in the same pass; out NULL: the twin alone */
static void p_rmsnorm_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, const float *inp, const float *weight,
                                   int N, int C, float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rms_rows_forward(out, out_bf16, rstd, NULL, inp, weight, N, C, eps));
}
static void p_rmsnorm_backward(void *be, float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C, int accumulate)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, accumulate));
}
/* the same backward (dout as bf16 where dout_b), then the final dinp rounded (the cpu
 * backend has no fused form: same numbers) */
static void p_rmsnorm_backward_bf16(void *be, float *dinp, mt_bf16 *dinp_b, float *dweight, const float *dout,
                                    const float *inp, const float *weight, const float *rstd, int N, int C,
                                    int accumulate, const mt_bf16 *dout_b)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rmsnorm_backward_b(dinp, dweight, dout, dout_b, inp, weight, rstd, N, C, accumulate);
         if (dinp_b) mt_cpu_cast_bf16(dinp_b, dinp, (size_t)N * (size_t)C));
}
static void p_rope_forward(void *be, float *out, const float *inp, const float *cos_tab, const float *sin_tab, int N,
                           int T, int pos0, int nh, int hd)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_rope_forward(out, inp, cos_tab, sin_tab, N, T, pos0, nh, hd));
}
static void p_rope_backward(void *be, float *dinp, const float *dout, const float *cos_tab, const float *sin_tab, int N,
                            int T, int pos0, int nh, int hd)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_rope_backward(dinp, dout, cos_tab, sin_tab, N, T, pos0, nh, hd));
}
static void p_attention_forward(void *be, float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ATTENTION, mt_cpu_attention_forward(out, lse, q, k, v, B, Tq, Tk, q_pos0, H, K, hd));
}
static void p_attention_backward(void *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse, int B,
                                 int T, int H, int K, int hd)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ATTENTION_BWD, mt_cpu_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, hd));
}
static void p_attention_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *lse, const float *q,
                                     const float *k, const float *v, int B, int T, int H, int K, int hd,
                                     mt_bf16 *qkv_b)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    /* the reference rounds its operands per call (mt_ops.h allows it); qkv_b is read
     * only for an operand given as NULL (its producer rounded it there) */
    PROF(MT_OPK_ATTENTION, mt_cpu_attention_forward_bf16(out, out_bf16, lse, q, k, v, B, T, H, K, hd, qkv_b));
}
/* attention_backward_bf16 (mt_ops.h); dv_b, dq_b, dk_b: the fp32 dv, dq, dk (scratch then) rounded once,
 * dv_b's rows ldv_b apart */
static void attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse, int B, int T, int H, int K,
                                    int hd, const mt_bf16 *qkv_b, mt_bf16 *dv_b, const mt_bf16 *dout_b,
                                    const mt_bf16 *out_b, mt_bf16 *dq_b, mt_bf16 *dk_b, int ldv_b)
{
    const size_t BT = (size_t)B * (size_t)T, nq = BT * (size_t)H * (size_t)hd, nk = BT * (size_t)K * (size_t)hd;
    mt_cpu_attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, hd, qkv_b, dout_b, out_b);
    if (dv_b) mt_cpu_cast_bf16_rows(dv_b, (size_t)ldv_b, dv, BT, (size_t)K * (size_t)hd);
    if (dq_b) mt_cpu_cast_bf16(dq_b, dq, nq);
    if (dk_b) mt_cpu_cast_bf16(dk_b, dk, nk);
}
static void p_attention_backward_bf16(void *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                      const float *k, const float *v, const float *out, const float *lse, int B,
                                      int T, int H, int K, int hd, const mt_bf16 *qkv_b, mt_bf16 *dv_b,
                                      const mt_bf16 *dout_b, const mt_bf16 *out_b, mt_bf16 *dq_b, mt_bf16 *dk_b,
                                      int ldv_b)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ATTENTION_BWD, attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, K, hd, qkv_b, dv_b,
                                                       dout_b, out_b, dq_b, dk_b, ldv_b));
}
static void p_swiglu_forward(void *be, float *out, const float *gate, const float *up, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_forward(out, gate, up, n));
}
static void p_swiglu_backward(void *be, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                              size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_backward(dgate, dup, dout, gate, up, n));
}
static void p_xent_forward(void *be, float *losses, float *lse_out, const float *logits, const int32_t *targets, int N,
                           int V, float softcap)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_XENT, mt_cpu_xent_forward(losses, lse_out, logits, targets, N, V, softcap));
}
static void p_xent_backward(void *be, float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                            float dscale, int N, int V, float softcap)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_XENT, mt_cpu_xent_backward(dlogits, logits, lse, targets, dscale, N, V, softcap));
}
static void p_xent_fused(void *be, float *losses, float *lse_out, float *logits, const int32_t *targets, float dscale,
                         int N, int V, float softcap)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_XENT, mt_cpu_xent_fused(losses, lse_out, logits, targets, dscale, N, V, softcap));
}
static void p_xent_fused_bf16(void *be, float *losses, float *lse_out, float *logits, mt_bf16 *dlogits_bf16,
                              const int32_t *targets, float dscale, int N, int V, float softcap)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_XENT, mt_cpu_xent_fused_bf16(losses, lse_out, logits, dlogits_bf16, targets, dscale, N, V, softcap));
}
static void p_xent_fused_bf16_logits(void *be, float *losses, float *lse_out, mt_bf16 *logits_b, const int32_t *targets,
                                     float dscale, int N, int V, float softcap)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_XENT, mt_cpu_xent_fused_bf16_logits(losses, lse_out, logits_b, targets, dscale, N, V, softcap));
}
static void p_router_forward(void *be, float *probs, float *lse, int32_t *topk_idx, float *gates, const float *logits,
                             int N, int E, int k)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_router_forward(probs, lse, topk_idx, gates, logits, N, E, k));
}
static void p_router_backward(void *be, float *dlogits, const float *dgates, const float *dprobs, const float *dlse,
                              const float *probs, const int32_t *topk_idx, const float *gates, int N, int E,
                              int k)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE,
         mt_cpu_router_backward(dlogits, dgates, dprobs, dlse, probs, topk_idx, gates, N, E, k));
}
static void p_moe_permute(void *be, float *xp, const float *h, const int32_t *src_row, int M, int C)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_permute(xp, h, src_row, M, C));
}
static void p_moe_permute_backward(void *be, float *dh, const float *dxp, const int32_t *pos, int N, int k, int C,
                                   int accumulate)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_permute_backward(dh, dxp, pos, N, k, C, accumulate));
}
static void p_moe_combine(void *be, float *out, const float *y, const int32_t *pos, const float *gates, int N, int k, int C)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_combine(out, y, pos, gates, N, k, C));
}
static void p_moe_combine_backward(void *be, float *dy, float *dgates, const float *dout, const float *y,
                                   const int32_t *pos, const float *gates, int N, int k, int C)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_combine_backward(dy, dgates, dout, y, pos, gates, N, k, C));
}
static void p_moe_permute_bf16(void *be, mt_bf16 *xb, const float *h, const int32_t *src_row, int M, int C)
{
    (void)be;
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_permute_bf16(xb, h, src_row, M, C));
}
static void p_moe_combine_backward_bf16(void *be, mt_bf16 *dyb, float *dgates, const float *dout, const float *y,
                                        const int32_t *pos, const float *gates, int N, int k, int C)
{
    (void)be;
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_combine_backward_bf16(dyb, dgates, dout, y, pos, gates, N, k, C));
}
static void p_moe_route(void *be, int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work,
                        const int32_t *topk_idx, int N, int k, int E, int n_null)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_route(pos, src_row, e_off, work, topk_idx, N, k, E, n_null));
}
static void p_moe_seq_stats(void *be, double *seq, const float *probs, const int32_t *topk_idx, int N, int E, int k,
                            int B, int T, int g0)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_seq_stats(seq, probs, topk_idx, N, E, k, B, T, g0));
}
static void p_moe_aux_loss(void *be, double *loss, float *f_share, const double *seq, const float *lse, int N, int B,
                           int E, int k, int T, float aux_coef, float z_coef, int count_aux)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_moe_aux_loss(loss, f_share, seq, lse, N, B, E, k, T, aux_coef, z_coef, count_aux));
}
static void p_moe_aux_backward(void *be, float *dprobs, float *dlse, const float *f_share, const float *lse, int N,
                               int E, int T, int g0, float aux_coef, float z_coef, double n_seq, double n_tok)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE,
         mt_cpu_moe_aux_backward(dprobs, dlse, f_share, lse, N, E, T, g0, aux_coef, z_coef, n_seq, n_tok));
}
static void p_adamw_update(void *be, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                           float eps, float wd, float bc1, float bc2)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_OPTIMIZER, mt_cpu_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2));
}
/* step synchronisation (issue 27 item 3): the loops over the single-tensor
 * kernels the entries are defined by (mt_ops.h), so the bits are theirs */
static double cpu_sumsq_multi(const float *const *x, const size_t *n, int count)
{
    double s = 0.0;
    for (int i = 0; i < count; i++) s += mt_cpu_sumsq(x[i], n[i]);
    return s;
}
static double p_sumsq_multi(void *be, const float *const *x, const size_t *n, int count)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF_RET(MT_OPK_OPTIMIZER, double, cpu_sumsq_multi(x, n, count));   /* the gradient norm's (zero.c) */
}
static void cpu_normalize_fro(float *x, size_t n, double eps)
{
    double nrm = sqrt(mt_cpu_sumsq(x, n));
    mt_cpu_axpby(x, NULL, 0.0f, (float)(1.0 / (nrm + eps)), n);
}
static void p_normalize_fro(void *be, float *x, size_t n, double eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, cpu_normalize_fro(x, n, eps));
}
/* normalize_fro_bf16 / axpby_from_bf16 (mt_ops.h): normalize_fro's scalar and
 * product, then the rounding; axpby's expression on the widened x */
static void cpu_normalize_fro_bf16(mt_bf16 *dst, const float *x, size_t n, double eps)
{
    const float b = (float)(1.0 / (sqrt(mt_cpu_sumsq(x, n)) + eps));
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = mt_cpu_f32_to_bf16(b * x[i]);
}
static void p_normalize_fro_bf16(void *be, mt_bf16 *dst, const float *x, size_t n, double eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, cpu_normalize_fro_bf16(dst, x, n, eps));
}
static void cpu_axpby_from_bf16(float *y, const mt_bf16 *x, float a, float b, size_t n)
{
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)   /* b = 0: y is not read (axpby's rule) */
        y[i] = b == 0.0f ? a * mt_cpu_bf16_to_f32(x[i]) : a * mt_cpu_bf16_to_f32(x[i]) + b * y[i];
}
static void p_axpby_from_bf16(void *be, float *y, const mt_bf16 *x, float a, float b, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, cpu_axpby_from_bf16(y, x, a, b, n));
}
/* muon_prep_bf16_multi / axpby_from_bf16_multi (mt_ops.h): the loops over the single entries */
static void cpu_muon_prep_bf16_multi(mt_bf16 *const *x, float *const *m, const float *const *g, const size_t *n,
                                     int count, float mu, float gscale, double eps, float *d)
{
    for (int i = 0; i < count; i++) {
        mt_cpu_muon_momentum(d, m[i], g[i], mu, n[i], gscale);
        cpu_normalize_fro_bf16(x[i], d, n[i], eps);
    }
}
static void p_muon_prep_bf16_multi(void *be, mt_bf16 *const *x, float *const *m, const float *const *g,
                                   const size_t *n, int count, float mu, float gscale, double eps, float *d)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_OPTIMIZER, cpu_muon_prep_bf16_multi(x, m, g, n, count, mu, gscale, eps, d));
}
static void cpu_axpby_from_bf16_multi(float *const *y, const mt_bf16 *const *x, const float *a, const float *b,
                                      const size_t *n, int count)
{
    for (int i = 0; i < count; i++) cpu_axpby_from_bf16(y[i], x[i], a[i], b[i], n[i]);
}
static void p_axpby_from_bf16_multi(void *be, float *const *y, const mt_bf16 *const *x, const float *a,
                                    const float *b, const size_t *n, int count)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_OPTIMIZER, cpu_axpby_from_bf16_multi(y, x, a, b, n, count));
}
static void cpu_adamw_multi(float *const *p, mt_bf16 *const *pb, const float *const *g, float *const *m,
                            float *const *v, const size_t *n, const float *wd, int count, float lr, float b1, float b2,
                            float eps, float bc1, float bc2, float gscale)
{
    for (int i = 0; i < count; i++)
        mt_cpu_adamw_update_gs(p[i], pb ? pb[i] : NULL, g[i], gscale, m[i], v[i], n[i], lr, b1, b2, eps, wd[i], bc1,
                               bc2);
}
static void p_adamw_multi(void *be, float *const *p, mt_bf16 *const *pb, const float *const *g, float *const *m,
                          float *const *v, const size_t *n, const float *wd, int count, float lr, float b1, float b2,
                          float eps, float bc1, float bc2, float gscale)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_OPTIMIZER, cpu_adamw_multi(p, pb, g, m, v, n, wd, count, lr, b1, b2, eps, bc1, bc2, gscale));
}
static void cpu_nonfinite_mark(float *flags, const float *const *x, const size_t *n, const int *slot, int count)
{
    for (int i = 0; i < count; i++)
        if (!mt_cpu_all_finite(x[i], n[i])) flags[slot[i]] = NAN;
}
static void p_nonfinite_mark(void *be, float *flags, const float *const *x, const size_t *n, const int *slot, int count)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, cpu_nonfinite_mark(flags, x, n, slot, count));
}
static void p_redo_score_acc(void *be, int64_t *acc, const float *act, size_t rows, int F)
{
    (void)be;   /* stateless */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_redo_score_acc(acc, act, rows, F));
}
static void p_mod_route(void *be, int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss,
                        const float *r, int B, int T, int C, float coef)
{
    (void)be;   /* stateless */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_mod_route(idx, tpos, slot, s, loss, r, B, T, C, coef));
}
static void p_mod_backward(void *be, float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot,
                           int N, int D, float aux_scale)
{
    (void)be;   /* stateless */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_mod_backward(dr, dx, dgate, s, slot, N, D, aux_scale));
}
static void p_muon_momentum(void *be, float *d, float *m, const float *g, float mu, size_t n, float gscale)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_OPTIMIZER, mt_cpu_muon_momentum(d, m, g, mu, n, gscale));
}
static void p_transpose(void *be, float *out, const float *in, int rows, int cols)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_GEMM, mt_cpu_transpose(out, in, rows, cols));
}

static void p_ssm_scan_forward(void *be, float *y, const float *x, const float *Bm, const float *Cm, const float *dt,
                               const float *lam, const float *A, const float *Dsk, int B, int T, int H, int P,
                               int N, int chunk)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_SCAN, mt_cpu_ssm_scan_forward(y, x, Bm, Cm, dt, lam, A, Dsk, B, T, H, P, N, chunk));
}
static void p_ssm_scan_backward(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam, float *dA, float *dDsk,
                                const float *dy, const float *x, const float *Bm, const float *Cm, const float *dt,
                                const float *lam, const float *A, const float *Dsk, int B, int T, int H, int P,
                                int N, int chunk)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_SCAN, mt_cpu_ssm_scan_backward(dx, dBm, dCm, ddt, dlam, dA, dDsk, dy, x, Bm, Cm, dt, lam, A, Dsk,
                                               B, T, H, P, N, chunk));
}
static void p_ssm_prep_forward(void *be, float *x, float *Bh, float *Ch, float *dt, float *lam, float *A, float *rstd,
                               float *ang_state, const float *proj, const float *dt_bias, const float *A_log,
                               const float *gB, const float *gC, const float *B_bias, const float *C_bias, int B,
                               int T, int H, int P, int G, int N, float eps, mt_bf16 *Bh_b, mt_bf16 *Ch_b,
                               float *ang_out)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    const size_t nbc = (size_t)B * T * H * N;
    /* Bh or Ch NULL: only its twin wanted (mt_ops.h); the cpu computes it in a temporary */
    const size_t bytes = (nbc ? nbc : 1) * sizeof(float);
    float *Bw = Bh ? Bh : malloc(bytes), *Cw = Ch ? Ch : malloc(bytes);
    MT_ASSERT(Bw && Cw);
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_ssm_prep_forward(x, Bw, Cw, dt, lam, A, rstd, ang_state, proj, dt_bias, A_log,
                                                     gB, gC, B_bias, C_bias, B, T, H, P, G, N, eps, ang_out);
         if (Bh_b) mt_cpu_cast_bf16((uint16_t *)Bh_b, Bw, nbc);
         if (Ch_b) mt_cpu_cast_bf16((uint16_t *)Ch_b, Cw, nbc));
    if (Bw != Bh) free(Bw);
    if (Cw != Ch) free(Cw);
}
static void p_ssm_prep_backward(void *be, float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                                float *dB_bias, float *dC_bias, const float *dx, const float *dBh, const float *dCh,
                                const float *ddt, const float *dlam, const float *dA, const float *B_bias,
                                const float *C_bias, const float *lam, const float *A, const float *rstd,
                                const float *proj, const float *dt_bias, const float *gB, const float *gC, int B,
                                int T, int H, int P, int G, int N, float eps, const float *ang)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE,
         mt_cpu_ssm_prep_backward(dproj, ddt_bias, dA_log, dgB, dgC, dB_bias, dC_bias, dx, dBh, dCh, ddt, dlam, dA,
                                  B_bias, C_bias, lam, A, rstd, proj, dt_bias, gB, gC, B, T, H, P, G, N, eps, ang));
}
static void p_ssm_gate_norm_forward(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                    const float *w, int n, int E, int G, float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_ssm_gate_norm_forward(out, rstd, y, z, ldz, w, n, E, G, eps));
}
/* y_b, zin_b: y, z stored as bf16, widened (exact) into temporaries first (z's rows E
 * apart; the cpu has no bf16 scan, so no model run hands it either: the contract's
 * reference) */
static void gate_fwd_bf16(float *out, mt_bf16 *out_b, float *rstd, const float *y, const float *z, int ldz,
                          const float *w, int n, int E, int G, float eps, const mt_bf16 *y_b, const mt_bf16 *zin_b,
                          int ldz_b)
{
    const size_t ne = (size_t)n * (size_t)E;
    float *t = y_b && ne ? malloc(ne * sizeof(float)) : NULL, *tz = zin_b && ne ? malloc(ne * sizeof(float)) : NULL;
    if ((y_b && ne && !t) || (zin_b && ne && !tz)) {   /* no room: the output poisoned (NaN), as the QK-norm's */
        for (size_t i = 0; out_b && i < ne; i++) out_b[i] = 0x7fffu;
        free(t);
        free(tz);
        return;
    }
    if (t) {
        for (size_t i = 0; i < ne; i++) t[i] = mt_cpu_bf16_to_f32(y_b[i]);
        y = t;
    }
    if (tz) {
        for (int r = 0; r < n; r++)
            for (int c = 0; c < E; c++)
                tz[(size_t)r * E + c] = mt_cpu_bf16_to_f32(zin_b[(size_t)r * (size_t)ldz_b + (size_t)c]);
        z = tz;
        ldz = E;
    }
    mt_cpu_ssm_gate_norm_forward_bf16(out, out_b, rstd, y, z, ldz, w, n, E, G, eps);
    free(t);
    free(tz);
}
static void p_ssm_gate_norm_forward_bf16(void *be, float *out, mt_bf16 *out_b, float *rstd, const float *y,
                                         const float *z, int ldz, const float *w, int n, int E, int G, float eps,
                                         const mt_bf16 *y_b, const mt_bf16 *zin_b, int ldz_b)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, gate_fwd_bf16(out, out_b, rstd, y, z, ldz, w, n, E, G, eps, y_b, zin_b, ldz_b));
}
static void p_ssm_gate_norm_backward(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                     const float *z, int ldz, const float *w, const float *rstd, int n, int E, int G)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_ssm_gate_norm_backward(dy, dz, dw, dout, y, z, ldz, w, rstd, n, E, G));
}
static void p_ssm_gate_norm_sums(void *be, float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                                 const float *dout, const float *rstd, int n, int E, int c0, int cg)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_ssm_gate_norm_sums(s, lds, y, z, ldz, w, dout, rstd, n, E, c0, cg));
}
static void p_ssm_gate_norm_forward_ext(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                        const float *w, const float *s, int lds, int n, int E, int c0, int cg,
                                        float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_ssm_gate_norm_forward_ext(out, rstd, y, z, ldz, w, s, lds, n, E, c0, cg, eps));
}
static void p_ssm_gate_norm_backward_ext(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                         const float *z, int ldz, const float *w, const float *rstd, const float *s,
                                         int lds, int n, int E, int c0, int cg)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_ssm_gate_norm_backward_ext(dy, dz, dw, dout, y, z, ldz, w, rstd, s, lds, n, E, c0, cg));
}
static void p_ssm_scan_step(void *be, float *y, float *S, float *xprev, float *Bprev, const float *x, const float *Bm,
                            const float *Cm, const float *dt, const float *lam, const float *A, const float *Dsk,
                            int B, int H, int P, int N, int first)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_SCAN, mt_cpu_ssm_scan_step(y, S, xprev, Bprev, x, Bm, Cm, dt, lam, A, Dsk, B, H, P, N, first));
}

/* the fused chains (fused.c) count as norm: each is a norm with its neighbours folded in */
static void p_rmsnorm_resid_forward(void *be, float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                    int N, int C, float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rmsnorm_resid_forward(out, rstd, resid, inp, weight, N, C, eps));
}
/* the bf16 twins: the fp32 op's values, rounded in the same pass; out NULL: the twin alone */
static void p_rmsnorm_resid_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, float *resid, const float *inp,
                                         const float *weight, int N, int C, float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_rms_rows_forward(out, out_bf16, rstd, resid, inp, weight, N, C, eps));
}
static void p_swiglu_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, const float *gate, const float *up, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_forward_bf16(out, out_bf16, gate, up, n));
}
static void p_swiglu_backward_bf16(void *be, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout, const float *gate,
                                   const float *up, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_backward_bf16(dgate_b, dup_b, dout, gate, up, n));
}
static void p_swiglu_backward_act_bf16(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                       const float *gate, const float *up, size_t n)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_backward_act_bf16(act_b, dgate_b, dup_b, dout, gate, up, n));
}
static void p_swiglu_forward_bf16_gu(void *be, mt_bf16 *out_bf16, const mt_bf16 *gate, const mt_bf16 *up, size_t n)
{
    (void)be;
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_forward_bf16_gu(out_bf16, gate, up, n));
}
static void p_swiglu_backward_act_bf16_gu(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                          const mt_bf16 *gate, const mt_bf16 *up, size_t n)
{
    (void)be;
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_backward_act_bf16_gu(act_b, dgate_b, dup_b, dout, gate, up, n));
}
static void p_swiglu_backward_act_bf16_gud(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                           const mt_bf16 *dout, const mt_bf16 *gate, const mt_bf16 *up, size_t n,
                                           size_t F, size_t ldo)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_ELEMENTWISE, mt_cpu_swiglu_backward_act_bf16_gud(act_b, dgate_b, dup_b, dout, gate, up, n, F, ldo));
}
static void p_qk_norm_rope_forward(void *be, float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                   const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                   const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_qk_norm_rope_forward(q, k, rstd_q, rstd_k, q_raw, k_raw, wq, wk, cos_tab, sin_tab, N, T,
                                                  pos0, H, K, hd, eps));
}
static void p_qk_norm_rope_backward(void *be, float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                    float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                    const float *wk, const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                    const float *sin_tab, int N, int T, int H, int K, int hd)
{
    (void)be;   /* stateless / not yet used (docs/cuda.md) */
    PROF(MT_OPK_NORM, mt_cpu_qk_norm_rope_backward(dq_raw, dk_raw, dwq, dwk, dq, dk, q_raw, k_raw, wq, wk, rstd_q,
                                                   rstd_k, cos_tab, sin_tab, N, T, H, K, hd));
}
/* The bf16 QK-norm entries: the fp32 op into scratch, then each value rounded
 * once. One scratch of nq + nk floats for the fp32 outputs, and nq + nk more
 * where q_raw, k_raw come as bf16 (q_raw_b, k_raw_b; mt_ops.h): widened
 * (exact) there, the fp32 op's inputs. NULL: no memory (the caller poisons its
 * outputs: kernels return void, mt_ops.h; NaN stops the run at the finite check) */
static float *qk_scratch(const float **q_raw, const float **k_raw, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b,
                         size_t nq, size_t nk)
{
    float *t = malloc((q_raw_b ? 2 : 1) * (nq + nk ? nq + nk : 1) * sizeof(float));
    if (!t || !q_raw_b) return t;
    float *w = t + nq + nk;
    for (size_t i = 0; i < nq; i++) w[i] = mt_cpu_bf16_to_f32(q_raw_b[i]);
    for (size_t i = 0; i < nk; i++) w[nq + i] = mt_cpu_bf16_to_f32(k_raw_b[i]);
    *q_raw = w, *k_raw = w + nq;
    return t;
}
static void qk_poison(mt_bf16 *a, size_t na, mt_bf16 *b, size_t nb)
{
    for (size_t i = 0; i < na; i++) a[i] = 0x7fffu;
    for (size_t i = 0; i < nb; i++) b[i] = 0x7fffu;
}
static void qk_fwd_bf16(mt_bf16 *qb, mt_bf16 *kb, float *rstd_q, float *rstd_k, const float *q_raw, const float *k_raw,
                        const float *wq, const float *wk, const float *cos_tab, const float *sin_tab, int N, int T,
                        int pos0, int H, int K, int hd, float eps, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b)
{
    const size_t nq = (size_t)N * (size_t)H * (size_t)hd, nk = (size_t)N * (size_t)K * (size_t)hd;
    float *t = qk_scratch(&q_raw, &k_raw, q_raw_b, k_raw_b, nq, nk);
    if (!t) { qk_poison(qb, nq, kb, nk); return; }
    mt_cpu_qk_norm_rope_forward(t, t + nq, rstd_q, rstd_k, q_raw, k_raw, wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd,
                                eps);
    mt_cpu_cast_bf16(qb, t, nq);
    mt_cpu_cast_bf16(kb, t + nq, nk);
    free(t);
}
static void p_qk_norm_rope_forward_bf16(void *be, mt_bf16 *qb, mt_bf16 *kb, float *rstd_q, float *rstd_k,
                                        const float *q_raw, const float *k_raw, const float *wq, const float *wk,
                                        const float *cos_tab, const float *sin_tab, int N, int T, int pos0, int H,
                                        int K, int hd, float eps, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b)
{
    (void)be;
    PROF(MT_OPK_NORM, qk_fwd_bf16(qb, kb, rstd_q, rstd_k, q_raw, k_raw, wq, wk, cos_tab, sin_tab, N, T, pos0, H, K, hd,
                                  eps, q_raw_b, k_raw_b));
}
static void qk_bwd_bf16(mt_bf16 *dq_raw_b, mt_bf16 *dk_raw_b, float *dwq, float *dwk, float *dq, float *dk,
                        const float *q_raw, const float *k_raw, const float *wq, const float *wk, const float *rstd_q,
                        const float *rstd_k, const float *cos_tab, const float *sin_tab, int N, int T, int H, int K,
                        int hd, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b, const mt_bf16 *dq_b,
                        const mt_bf16 *dk_b, int ld_dq_raw, int ld_dk_raw)
{
    const size_t nq = (size_t)N * (size_t)H * (size_t)hd, nk = (size_t)N * (size_t)K * (size_t)hd;
    float *t = qk_scratch(&q_raw, &k_raw, q_raw_b, k_raw_b, nq, nk);
    if (!t) {   /* their rows alone (ld) */
        const size_t lq = ld_dq_raw ? (size_t)ld_dq_raw : (size_t)H * (size_t)hd;
        const size_t lk = ld_dk_raw ? (size_t)ld_dk_raw : (size_t)K * (size_t)hd;
        for (size_t r = 0; r < (size_t)N; r++) qk_poison(dq_raw_b + r * lq, nq / N, dk_raw_b + r * lk, nk / N);
        return;
    }
    if (dq_b) {   /* the incoming gradient as bf16: widened into the scratch dq, dk (exact) */
        for (size_t i = 0; i < nq; i++) dq[i] = mt_cpu_bf16_to_f32(dq_b[i]);
        for (size_t i = 0; i < nk; i++) dk[i] = mt_cpu_bf16_to_f32(dk_b[i]);
    }
    mt_cpu_qk_norm_rope_backward(t, t + nq, dwq, dwk, dq, dk, q_raw, k_raw, wq, wk, rstd_q, rstd_k, cos_tab, sin_tab,
                                 N, T, H, K, hd);
    mt_cpu_cast_bf16_rows(dq_raw_b, (size_t)ld_dq_raw, t, (size_t)N, (size_t)H * (size_t)hd);
    mt_cpu_cast_bf16_rows(dk_raw_b, (size_t)ld_dk_raw, t + nq, (size_t)N, (size_t)K * (size_t)hd);
    free(t);
}
static void p_qk_norm_rope_backward_bf16(void *be, mt_bf16 *dq_raw_b, mt_bf16 *dk_raw_b, float *dwq, float *dwk,
                                         float *dq, float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                         const float *wk, const float *rstd_q, const float *rstd_k,
                                         const float *cos_tab, const float *sin_tab, int N, int T, int H, int K, int hd,
                                         const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b, const mt_bf16 *dq_b,
                                         const mt_bf16 *dk_b, int ld_dq_raw, int ld_dk_raw)
{
    (void)be;
    PROF(MT_OPK_NORM, qk_bwd_bf16(dq_raw_b, dk_raw_b, dwq, dwk, dq, dk, q_raw, k_raw, wq, wk, rstd_q, rstd_k, cos_tab,
                                  sin_tab, N, T, H, K, hd, q_raw_b, k_raw_b, dq_b, dk_b, ld_dq_raw, ld_dk_raw));
}

/* backend facts: the ISA the kernels dispatched to (mt_ops_cpu_isa), and
 * the per-op profile's timing, which every entry's wrapper does (PROF) */
static const char *cpu_kernels_isa(void *be)
{
    (void)be;
    return mt_ops_cpu_isa();
}

static int cpu_op_profile(void *be, const char **how)
{
    (void)be;
    *how = "host wall clock around each ops-table call";
    return 1;
}

static const struct mt_ops_i cpu_ops = {
    /* .name                 = */ .name                 = "cpu",
    /* .buf_alloc            = */ .buf_alloc            = cpu_buf_alloc,
    /* .buf_free             = */ .buf_free             = cpu_buf_free,
    /* .copy_to_host         = */ .copy_to_host         = cpu_copy,
    /* .copy_from_host       = */ .copy_from_host       = cpu_copy,
    /* .copy                 = */ .copy                 = p_copy,
    /* .sync                 = */ .sync                 = cpu_sync,
    /* .ssm_scan_forward     = */ .ssm_scan_forward     = p_ssm_scan_forward,
    /* .ssm_scan_backward    = */ .ssm_scan_backward    = p_ssm_scan_backward,
    /* .ssm_prep_forward     = */ .ssm_prep_forward     = p_ssm_prep_forward,
    /* .ssm_prep_backward    = */ .ssm_prep_backward    = p_ssm_prep_backward,
    /* .ssm_gate_norm_fwd    = */ .ssm_gate_norm_forward  = p_ssm_gate_norm_forward,
    /* .ssm_gate_norm_bwd    = */ .ssm_gate_norm_backward = p_ssm_gate_norm_backward,
    /* .ssm_scan_step        = */ .ssm_scan_step        = p_ssm_scan_step,
    /* .ssm_gate_norm_sums   = */ .ssm_gate_norm_sums   = p_ssm_gate_norm_sums,
    /* .ssm_gate_norm_fwd_ext = */ .ssm_gate_norm_forward_ext  = p_ssm_gate_norm_forward_ext,
    /* .ssm_gate_norm_fwd_bf16 = */ .ssm_gate_norm_forward_bf16 = p_ssm_gate_norm_forward_bf16,
    /* .ssm_gate_norm_bwd_ext = */ .ssm_gate_norm_backward_ext = p_ssm_gate_norm_backward_ext,
    /* .fill                 = */ .fill                 = p_fill,
    /* .axpby                = */ .axpby                = p_axpby,
    /* .sumsq                = */ .sumsq                = p_sumsq,
    /* .all_finite           = */ .all_finite           = p_all_finite,
    /* .gemm                 = */ .gemm                 = p_gemm,
    /* .gemm_grouped         = */ .gemm_grouped         = p_gemm_grouped,
    /* .gemm_bf16            = */ .gemm_bf16            = p_gemm_bf16,
    /* .gemm_bf16_out        = */ .gemm_bf16_out        = p_gemm_bf16_out,
    /* .gemm_bf16_resid      = */ .gemm_bf16_resid      = p_gemm_bf16_resid,
    /* .gemm_grouped_rows    = */ .gemm_grouped_rows    = p_gemm_grouped_rows,
    /* .gemm_grouped_sum     = */ .gemm_grouped_sum     = p_gemm_grouped_sum,
    /* .cast_bf16            = */ .cast_bf16            = p_cast_bf16,
    /* .gemm_bf16_batched    = */ .gemm_bf16_batched    = p_gemm_bf16_batched,
    /* .embed_forward        = */ .embed_forward        = p_embed_forward,
    /* .embed_backward       = */ .embed_backward       = p_embed_backward,
    /* .rmsnorm_forward      = */ .rmsnorm_forward      = p_rmsnorm_forward,
    /* .rmsnorm_backward     = */ .rmsnorm_backward     = p_rmsnorm_backward,
    /* .rmsnorm_forward_bf16 = */ .rmsnorm_forward_bf16 = p_rmsnorm_forward_bf16,
    /* .rope_forward         = */ .rope_forward         = p_rope_forward,
    /* .rope_backward        = */ .rope_backward        = p_rope_backward,
    /* .attention_forward    = */ .attention_forward    = p_attention_forward,
    /* .attention_backward   = */ .attention_backward   = p_attention_backward,
    /* .swiglu_forward       = */ .swiglu_forward       = p_swiglu_forward,
    /* .swiglu_backward      = */ .swiglu_backward      = p_swiglu_backward,
    /* .xent_forward         = */ .xent_forward         = p_xent_forward,
    /* .xent_backward        = */ .xent_backward        = p_xent_backward,
    /* .router_forward       = */ .router_forward       = p_router_forward,
    /* .router_backward      = */ .router_backward      = p_router_backward,
    /* .moe_permute          = */ .moe_permute          = p_moe_permute,
    /* .moe_permute_backward = */ .moe_permute_backward = p_moe_permute_backward,
    /* .moe_combine          = */ .moe_combine          = p_moe_combine,
    /* .moe_combine_backward = */ .moe_combine_backward = p_moe_combine_backward,
    /* .moe_permute_bf16     = */ .moe_permute_bf16     = p_moe_permute_bf16,
    /* .moe_combine_backward_bf16 = */ .moe_combine_backward_bf16 = p_moe_combine_backward_bf16,
    /* .adamw_update         = */ .adamw_update         = p_adamw_update,
    /* .muon_momentum        = */ .muon_momentum        = p_muon_momentum,
    /* .transpose            = */ .transpose            = p_transpose,
    /* .xent_fused           = */ .xent_fused           = p_xent_fused,
    /* .rmsnorm_resid_forward = */ .rmsnorm_resid_forward = p_rmsnorm_resid_forward,
    /* .qk_norm_rope_forward  = */ .qk_norm_rope_forward  = p_qk_norm_rope_forward,
    /* .qk_norm_rope_backward = */ .qk_norm_rope_backward = p_qk_norm_rope_backward,
    /* .qk_norm_rope_forward_bf16 = */ .qk_norm_rope_forward_bf16 = p_qk_norm_rope_forward_bf16,
    /* .qk_norm_rope_backward_bf16 = */ .qk_norm_rope_backward_bf16 = p_qk_norm_rope_backward_bf16,
    /* .rmsnorm_backward_bf16 = */ .rmsnorm_backward_bf16 = p_rmsnorm_backward_bf16,
    /* .rmsnorm_resid_forward_bf16 = */ .rmsnorm_resid_forward_bf16 = p_rmsnorm_resid_forward_bf16,
    /* .swiglu_forward_bf16        = */ .swiglu_forward_bf16        = p_swiglu_forward_bf16,
    /* .swiglu_backward_bf16       = */ .swiglu_backward_bf16       = p_swiglu_backward_bf16,
    /* .swiglu_backward_act_bf16   = */ .swiglu_backward_act_bf16   = p_swiglu_backward_act_bf16,
    /* .swiglu_forward_bf16_gu     = */ .swiglu_forward_bf16_gu     = p_swiglu_forward_bf16_gu,
    /* .swiglu_backward_act_bf16_gu= */ .swiglu_backward_act_bf16_gu = p_swiglu_backward_act_bf16_gu,
    /* .swiglu_backward_act_bf16_gud= */ .swiglu_backward_act_bf16_gud = p_swiglu_backward_act_bf16_gud,
    /* .widen_bf16                 = */ .widen_bf16                 = p_widen_bf16,
    /* .attention_forward_bf16     = */ .attention_forward_bf16     = p_attention_forward_bf16,
    /* .attention_backward_bf16    = */ .attention_backward_bf16    = p_attention_backward_bf16,
    /* MoE device routing */
    /* .moe_count_acc              = */ .moe_count_acc              = p_moe_count_acc,
    /* .moe_route                  = */ .moe_route                  = p_moe_route,
    /* .moe_seq_stats              = */ .moe_seq_stats              = p_moe_seq_stats,
    /* .moe_aux_loss               = */ .moe_aux_loss               = p_moe_aux_loss,
    /* .moe_aux_backward           = */ .moe_aux_backward           = p_moe_aux_backward,
    /* lm head: the bf16 twin of dlogits */
    /* .xent_fused_bf16            = */ .xent_fused_bf16            = p_xent_fused_bf16,
    /* .xent_fused_bf16_logits     = */ .xent_fused_bf16_logits     = p_xent_fused_bf16_logits,
    /* step synchronisation (issue 27 item 3) */
    /* .sumsq_multi                = */ .sumsq_multi                = p_sumsq_multi,
    /* .normalize_fro              = */ .normalize_fro              = p_normalize_fro,
    /* .normalize_fro_bf16         = */ .normalize_fro_bf16         = p_normalize_fro_bf16,
    /* .axpby_from_bf16            = */ .axpby_from_bf16            = p_axpby_from_bf16,
    /* .muon_prep_bf16_multi       = */ .muon_prep_bf16_multi       = p_muon_prep_bf16_multi,
    /* .axpby_from_bf16_multi      = */ .axpby_from_bf16_multi      = p_axpby_from_bf16_multi,
    /* .adamw_multi                = */ .adamw_multi                = p_adamw_multi,
    /* .nonfinite_mark             = */ .nonfinite_mark             = p_nonfinite_mark,
    /* .cast_bf16_multi            = */ .cast_bf16_multi            = p_cast_bf16_multi,
    /* backend facts (issue 30 item 6): host memory, no device entries */
    /* .host_memory                = */ .host_memory                = 1,
    /* .kernels_isa                = */ .kernels_isa                = cpu_kernels_isa,
    /* .op_profile                 = */ .op_profile                 = cpu_op_profile,
    /* ReDo scores (SPEC 1e) */
    /* .redo_score_acc             = */ .redo_score_acc             = p_redo_score_acc,
    /* Mixture-of-Depths routing (SPEC 1e) */
    /* .mod_route                  = */ .mod_route                  = p_mod_route,
    /* .mod_backward               = */ .mod_backward               = p_mod_backward,
};

const struct mt_ops_i *mt_ops_cpu(void)
{
    return &cpu_ops;
}

/* blas = "OpenBLAS <version> (<openmp|pthread>)" from openblas_get_config(),
 * whose text is "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... USE_OPENMP ...". */
void mt_ops_cpu_info(struct mt_ops_cpu_info *info)
{
    memset(info, 0, sizeof(*info));
    const char *cfg = openblas_get_config();
    char ver[32] = "?";
    if (cfg && sscanf(cfg, "OpenBLAS %31s", ver) != 1) snprintf(ver, sizeof(ver), "?");
    snprintf(info->blas, sizeof(info->blas), "OpenBLAS %s (%s)", ver,
             cfg && strstr(cfg, "USE_OPENMP") ? "openmp" : "pthread");
    const char *core = openblas_get_corename();
    snprintf(info->coretype, sizeof(info->coretype), "%s", core ? core : "?");
    const char *src = getenv("MT_CORETYPE_SOURCE");
    if (src)
        snprintf(info->coretype_source, sizeof(info->coretype_source), "%s", src);
    else if (getenv("OPENBLAS_CORETYPE"))
        snprintf(info->coretype_source, sizeof(info->coretype_source), "user env OPENBLAS_CORETYPE");
    else
        snprintf(info->coretype_source, sizeof(info->coretype_source), "openblas auto-detect");
    info->threads = omp_get_max_threads();
}

void mt_ops_cpu_set_threads(int n)
{
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

/*
 * Core-type choice. Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) ships these
 * AVX-512 kernel sets: SKYLAKEX and COOPERLAKE (no SAPPHIRERAPIDS: asking for
 * it loads Cooperlake). On this project's Sapphire Rapids-class machine its
 * auto-detection picks SkylakeX; on other recent cores it may pick Haswell
 * (AVX2, measured 2/3 of the speed). bench/sgemm_roof, 2 threads, square
 * 2048-4096, best of 5 (GFLOP/s, two runs each):
 *     HASWELL 219.8 / 214.2   SKYLAKEX 331.1 / 337.3   COOPERLAKE 338.8 / 342.9
 * COOPERLAKE is the fastest (its sgemm kernel is SkylakeX's; it adds BF16),
 * so it is chosen when the CPU has avx512_bf16, SKYLAKEX otherwise.
 */
void mt_ops_cpu_pin_coretype(int argc, char **argv)
{
    (void)argc;
    if (getenv("OPENBLAS_CORETYPE") || getenv("MT_NO_REEXEC")) return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return;
    const char *core = __builtin_cpu_supports("avx512bf16") ? "COOPERLAKE" : "SKYLAKEX";
    char why[96];
    snprintf(why, sizeof(why), "OPENBLAS_CORETYPE=%s set by meshtrain (avx512 cpu)", core);
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0 || setenv("MT_CORETYPE_SOURCE", why, 1) != 0) {
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("MT_CORETYPE_SOURCE");
        return;
    }
    execv("/proc/self/exe", argv);
    /* re-exec failed: OpenBLAS keeps what it detected; do not claim a pin */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("MT_CORETYPE_SOURCE");
}

/* The x86-64-v3 build (AVX2/FMA) runs everywhere; kernels with an AVX-512
 * form pick it once at load when the CPU has AVX-512 F/BW/DQ/VL (see
 * cpu_impl.h mt_cpu_have_avx512). */
int mt_cpu_have_avx512(void)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               !getenv("MT_NO_AVX512");
    }
    return have;
}

const char *mt_ops_cpu_isa(void)
{
    return mt_cpu_have_avx512() ? "avx512" : "avx2";
}
