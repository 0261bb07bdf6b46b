/*
 * cublas_v2.h (emulation) — the cuBLAS calls src/ops/cuda uses, on the CPU:
 * a naive column-major sgemm with cuBLAS's argument checks (so a wrong
 * row-major -> column-major mapping shows up as a failed status or wrong
 * numbers). cuBLASLt is in cublasLt.h. See cuda_runtime.h in this directory.
 */
#ifndef MT_EMU_CUBLAS_V2_H
#define MT_EMU_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef struct mt_emu_cublas *cublasHandle_t;
enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
/* library_types.h / cublas_api.h values (the ones src/ops/cuda uses) */
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TENSOR_OP_MATH = 1, CUBLAS_PEDANTIC_MATH = 2 };

const char    *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
/* the user workspace (the emulator's GEMMs need none: checked, kept nowhere) */
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasGetVersion(cublasHandle_t h, int *v);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
/* grouped batched GEMM (cuBLAS >= 12.5): fp32 operands, CUBLAS_COMPUTE_32F,
 * host per-group arrays, DEVICE pointer arrays (checked) */
#define CUBLAS_VERSION 130100
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void *alpha_array,
                                          const void *const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void *beta_array, void *const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType);

#endif /* MT_EMU_CUBLAS_V2_H */
