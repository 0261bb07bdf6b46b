/*
 * mt_ops_cuda.h — what the cuda backend offers beyond the ops table.
 *
 * The table itself comes from mt_ops_cuda() (src/ops/mt_ops.h). Its entries
 * return void, so a CUDA or cuBLAS failure inside one is recorded as a
 * sticky error (the first failure is kept) instead of aborting; callers that
 * want to know ask here, typically after ops->sync():
 *
 *     const struct mt_ops_i *ops = mt_ops_cuda(why, sizeof why);
 *     ... queue work ...
 *     ops->sync();
 *     char msg[384];
 *     if (mt_ops_cuda_status(msg, sizeof msg) != MT_OK)
 *         return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cuda backend: %s", msg);
 *
 * The host-visible reductions are poisoned once an error is recorded
 * (sumsq -> NaN, all_finite -> 0), so a trainer that checks its gradient
 * norm stops even if it never calls mt_ops_cuda_status().
 *
 * Declared here only (not in mt_ops.h) because they exist only in builds
 * with MT_WITH_CUDA; C code includes this header under that macro.
 */
#ifndef MT_OPS_CUDA_H
#define MT_OPS_CUDA_H

#include <stddef.h>
#include "../../core/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device and library description for the receipt (filled at init). */
struct mt_ops_cuda_info {
    char   device[256];        /* cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3" */
    int    ordinal;            /* device ordinal in use                           */
    int    cc_major, cc_minor; /* compute capability                               */
    int    sm_count;
    size_t mem_total;          /* bytes                                            */
    int    runtime_version;    /* cudaRuntimeGetVersion, e.g. 13000                */
    int    cublas_version;     /* cublasGetVersion, e.g. 130000                    */
    size_t workspace_bytes;    /* backend-private scratch currently held           */
};

/* MT_OK while no CUDA/cuBLAS call has failed; otherwise the first failure's
 * status and, in msg, "file:line: call: reason (+N more)". msg may be NULL. */
enum mt_status mt_ops_cuda_status(char *msg, size_t msg_len);

/* Fill `info`; MT_ERR_UNSUPPORTED if the backend was never initialised. */
enum mt_status mt_ops_cuda_get_info(struct mt_ops_cuda_info *info);

/* The cudaStream_t (as void *) every op of the table is queued on, in call
 * order; NULL before init. Collectives (NCCL) that read or write buffers of
 * this backend enqueue on it too, so no extra synchronisation is needed. */
void *mt_ops_cuda_stream(void);

/* Release the stream, cuBLAS handle and scratch. Buffers from buf_alloc
 * must be freed before. A later mt_ops_cuda() initialises again. */
void mt_ops_cuda_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* MT_OPS_CUDA_H */
