/*
 * gemm.cu — C = alpha op(A) op(B) + beta C (row-major) through cublasSgemm.
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
 * Invariant: K == 0 or alpha == 0 never reaches cuBLAS (ld arguments may be
 * degenerate there); C is scaled by beta (beta == 0 writes zeros without
 * reading C, the BLAS rule), which is what the math says.
 */
#include "cuda_impl.cuh"

static __global__ void scale_k(float *C, int M, int N, int ldc, float beta)
{
    size_t total = (size_t)M * (size_t)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)N, j = e % (size_t)N;
        float *c = C + i * (size_t)ldc + j;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

extern "C" void mt_cuda_gemm(int transA, int transB, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        if (beta == 1.0f) return;
        MT_LAUNCH(scale_k, mt_cuda_blocks((size_t)M * (size_t)N, 256), 256, 0)(C, M, N, ldc, beta);
        MT_CUDA_KCHECK();
        return;
    }
    MT_CUBLAS_CHECK(cublasSgemm(mt_cuda_g.blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}
