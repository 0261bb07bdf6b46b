/*
 * cublasLt.h (emulation) — the cuBLASLt calls src/ops/cuda uses (bf16 mode),
 * on the CPU. Only the combination the backend needs is implemented —
 * A, B CUDA_R_16BF, C = D CUDA_R_32F, CUBLAS_COMPUTE_32F, scale CUDA_R_32F,
 * column-major layouts — and every other one returns
 * CUBLAS_STATUS_NOT_SUPPORTED. The checks follow the library: layout
 * shapes must agree with the transposes (op(A) m x k, op(B) k x n, D m x n),
 * ld >= rows, C's layout equal to D's, attribute sizes exact, the workspace
 * at least what the algorithm asked for, and every pointer aligned as the
 * heuristic's preference said (the default 256 bytes when the caller set
 * none: forgetting to declare an unaligned C is an error here too).
 * Products of two bf16 are exact in fp32; they are summed in fp32 in k order.
 * Test hook: MT_EMU_LT_NO_ALGO=1 makes the heuristic find no algorithm
 * (CUBLAS_STATUS_NOT_SUPPORTED, as the library answers), to exercise the
 * caller's fallback; MT_EMU_LT_NO_BATCH=1 only for a strided batch of more than one
 * matrix (gemm_bf16_batched's per-matrix fallback).
 * See cuda_runtime.h in this directory.
 */
#ifndef MT_EMU_CUBLASLT_H
#define MT_EMU_CUBLASLT_H

#include "cublas_v2.h"

typedef struct mt_emu_lt *cublasLtHandle_t;
typedef struct mt_emu_lt_desc *cublasLtMatmulDesc_t;
typedef struct mt_emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct mt_emu_lt_pref *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t               workspaceSize;
    cublasStatus_t       state;
    float                wavesCount;
    int                  reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 } cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
size_t         cublasLtGetVersion(void);
const char    *cublasLtGetStatusString(cublasStatus_t s);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
/* strided batches (gemm_bf16_batched): every layout of a matmul says the same
 * count (int32); the offset (int64, elements) from one matrix to the next */
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned);
/* the emulator's check: the shape is one it multiplies and the algorithm one
 * its heuristic returned (magic); result: that algorithm's workspace */
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                       const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *result);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream);

#endif /* MT_EMU_CUBLASLT_H */
