/*
 * gemm.c — C = alpha op(A) op(B) + beta C through OpenBLAS cblas_sgemm
 * (row-major). The only place the cpu backend touches BLAS for compute.
 *
 * Invariant: K == 0 never reaches OpenBLAS (its argument check rejects
 * lda == 0); C is scaled by beta instead, which is what the math says.
 */
#include "cpu_impl.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void mt_cpu_gemm(int transA, int transB, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        for (int i = 0; i < M; i++) {
            float *c = C + (size_t)i * (size_t)ldc;
            for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- bf16 mode (mt_ops.h gemm_bf16 / cast_bf16) ----
 * The cpu backend has no bf16 arithmetic; it reproduces the mode's numbers:
 * each operand is rounded to bf16 (nearest even) and widened back into fp32
 * scratch, then multiplied by sgemm. A product of two bf16 values (8
 * significant bits each) is exact in fp32, so this is "bf16 operands, fp32
 * accumulation" — the tensor-core contract — up to the order of the fp32
 * sums. It is the reference the cuda bf16 path is checked against and lets
 * precision=bf16 train on cpu (slower than fp32: a conversion per call). */

uint16_t mt_cpu_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;   /* NaN: the canonical NaN, as the device (mt_cuda_bf16_rn) */
    u += 0x7fffu + ((u >> 16) & 1u);                                             /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float mt_cpu_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void mt_cpu_cast_bf16(uint16_t *dst, const float *src, size_t n)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = mt_cpu_f32_to_bf16(src[i]);
}

/* mt_cpu_cast_bf16 of a dense (rows, cols) source into rows ld apart (ld 0: cols);
 * the elements between dst's rows are not written */
void mt_cpu_cast_bf16_rows(uint16_t *dst, size_t ld, const float *src, size_t rows, size_t cols)
{
    if (ld == 0 || ld == cols) { mt_cpu_cast_bf16(dst, src, rows * cols); return; }
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) dst[i * ld + j] = mt_cpu_f32_to_bf16(src[i * cols + j]);
}

/* dense (rows, cols) fp32 copy of a stored operand, every value a bf16 value */
static void round_operand(float *dst, const void *src, enum mt_elem t, int ld, int rows, int cols)
{
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
        float *d = dst + (size_t)i * (size_t)cols;
        if (t == MT_ELEM_BF16) {
            const uint16_t *s = (const uint16_t *)src + (size_t)i * (size_t)ld;
            for (int j = 0; j < cols; j++) d[j] = mt_cpu_bf16_to_f32(s[j]);
        } else {
            const float *s = (const float *)src + (size_t)i * (size_t)ld;
            for (int j = 0; j < cols; j++) d[j] = mt_cpu_bf16_to_f32(mt_cpu_f32_to_bf16(s[j]));
        }
    }
}

void mt_cpu_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                      int lda, const void *B, enum mt_elem b_type, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        mt_cpu_gemm(transA, transB, M, N, K, alpha, NULL, 1, NULL, 1, beta, C, ldc);
        return;
    }
    const int ar = transA ? K : M, ac = transA ? M : K, br = transB ? N : K, bc = transB ? K : N;
    float *a = malloc((size_t)ar * (size_t)ac * sizeof(float));
    float *b = malloc((size_t)br * (size_t)bc * sizeof(float));
    if (!a || !b) {
        /* kernels return void (mt_ops.h): poison C so the trainer's finite check stops the run */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * (size_t)ldc + j] = NAN;
        free(a);
        free(b);
        return;
    }
    round_operand(a, A, a_type, lda, ar, ac);
    round_operand(b, B, b_type, ldb, br, bc);
    mt_cpu_gemm(transA, transB, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
    free(a);
    free(b);
}

/* gemm_bf16_out (mt_ops.h): gemm_bf16 with beta 0 into fp32 scratch, each
 * result rounded to bf16 (nearest even) as it is stored */
void mt_cpu_gemm_bf16_out(int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                          int lda, const void *B, enum mt_elem b_type, int ldb, uint16_t *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    float *t = malloc((size_t)M * (size_t)N * sizeof(float));
    if (!t) {   /* kernels return void (mt_ops.h): a NaN result stops the run at the finite check */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * (size_t)ldc + j] = 0x7fffu;
        return;
    }
    mt_cpu_gemm_bf16(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, 0.0f, t, N);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * (size_t)ldc + j] = mt_cpu_f32_to_bf16(t[(size_t)i * (size_t)N + j]);
    free(t);
}

/* gemm_bf16_batched (mt_ops.h): per matrix, fp32 scratch seeded with C_i
 * widened (beta != 0), gemm_bf16 with beta onto it, then each result rounded
 * once as it is stored in D_i */
void mt_cpu_gemm_bf16_batched(int transA, int transB, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                              size_t stride_a, const uint16_t *B, int ldb, size_t stride_b, float beta,
                              const uint16_t *C, uint16_t *D, int ldd, size_t stride_d, int count)
{
    if (M <= 0 || N <= 0 || count <= 0) return;
    float *t = malloc((size_t)M * (size_t)N * sizeof(float));
    for (int b = 0; b < count; b++) {
        uint16_t *d = D + (size_t)b * stride_d;
        const uint16_t *c = C ? C + (size_t)b * stride_d : NULL;
        if (!t) {   /* kernels return void (mt_ops.h): a NaN result stops the run at the finite check */
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) d[(size_t)i * (size_t)ldd + j] = 0x7fffu;
            continue;
        }
        if (beta != 0.0f)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++)
                    t[(size_t)i * (size_t)N + j] = mt_cpu_bf16_to_f32(c[(size_t)i * (size_t)ldd + j]);
        mt_cpu_gemm_bf16(transA, transB, M, N, K, alpha, A + (size_t)b * stride_a, MT_ELEM_BF16, lda,
                         B + (size_t)b * stride_b, MT_ELEM_BF16, ldb, beta, t, N);
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                d[(size_t)i * (size_t)ldd + j] = mt_cpu_f32_to_bf16(t[(size_t)i * (size_t)N + j]);
    }
    free(t);
}

/* gemm_bf16_resid (mt_ops.h): its definition, the seed copy C = R, then gemm_bf16
 * with beta 1 */
void mt_cpu_gemm_bf16_resid(int transA, int transB, int M, int N, int K, float alpha, const void *A,
                            enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, const float *R,
                            float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (R != C)
        for (int i = 0; i < M; i++)
            memcpy(C + (size_t)i * (size_t)ldc, R + (size_t)i * (size_t)ldc, (size_t)N * sizeof(float));
    mt_cpu_gemm_bf16(transA, transB, M, N, K, alpha, A, a_type, lda, B, b_type, ldb, 1.0f, C, ldc);
}
