/*
 * gemm.c — C = alpha op(A) op(B) + beta C through OpenBLAS cblas_sgemm
 * (row-major). The only place the cpu backend touches BLAS for compute.
 *
 * Invariant: K == 0 never reaches OpenBLAS (its argument check rejects
 * lda == 0); C is scaled by beta instead, which is what the math says.
 */
#include "cpu_impl.h"

#include <cblas.h>

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
