/*
 * mt_ops_cuda.h — what the cuda backend offers beyond the ops table.
 *
 * The table itself comes from mt_ops_cuda() (src/ops/mt_ops.h). Its entries
 * return void, so a CUDA or cuBLAS failure inside one is recorded as a
 * sticky error (the first failure is kept) instead of aborting; callers that
 * want to know ask here, typically after ops->sync(ops->be):
 *
 *     const struct mt_ops_i *ops = mt_ops_cuda(why, sizeof why);
 *     ... queue work ...
 *     ops->sync(ops->be);
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

/* GEMM precision of the table (docs/cuda.md, "bf16 mode").
 *   FP32: cublasSgemm in IEEE fp32 (no TF32): the checking mode, 1e-5 from cpu.
 *   BF16: cuBLASLt with bf16 operands and fp32 accumulation and output. The
 *         gemm entry rounds op(A) and op(B) to bf16 in backend scratch on every
 *         call; C stays fp32 (so beta = 1 gradient accumulation stays fp32),
 *         and every buffer of the table (weights, grads, optimizer state,
 *         activations) stays fp32. Everything that goes through gemm is bf16,
 *         Muon's Newton-Schulz included; no other op changes.
 * Chosen when the default table is created (first mt_ops_cuda()) from the runtime
 * tunable MT_CUDA_PRECISION=fp32|bf16 (default fp32; another value makes
 * mt_ops_cuda() return NULL with the reason), changeable afterwards with
 * mt_ops_cuda_set_precision(). */
enum mt_cuda_precision {
    MT_CUDA_PRECISION_FP32 = 0,
    MT_CUDA_PRECISION_BF16 = 1,
};
#define MT_CUDA_PRECISION_ENV "MT_CUDA_PRECISION"

/* Device and library description for the receipt (filled at init). */
struct mt_ops_cuda_info {
    char   device[256];        /* cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3" */
    int    ordinal;            /* device ordinal in use                           */
    int    cc_major, cc_minor; /* compute capability                               */
    int    sm_count;
    size_t mem_total;          /* bytes                                            */
    int    runtime_version;    /* cudaRuntimeGetVersion, e.g. 13000                */
    int    cublas_version;     /* cublasGetVersion, e.g. 130000                    */
    size_t cublaslt_version;   /* cublasLtGetVersion, e.g. 130000                  */
    size_t workspace_bytes;    /* backend-private scratch currently held (the
                                  grow-only workspace + cuBLASLt's workspace)     */
    char   precision[8];       /* "fp32" or "bf16": the GEMM precision now in use */
    char   precision_source[40]; /* "default", "MT_CUDA_PRECISION", "set by caller" */
    size_t bf16_scratch_cap;   /* MT_CUDA_BF16_SCRATCH_MB in bytes: the bf16 copies
                                  of one GEMM's operands are tiled to fit it      */
    long   gemm_bf16_calls;    /* cuBLASLt bf16 matmuls run (tiles counted)       */
    long   gemm_bf16_fallbacks;/* tiles cuBLASLt had no algorithm for, run by
                                  cublasSgemm in fp32 instead (named, counted)    */
    /* gemm_bf16 entry (precision=bf16, operands typed per call): */
    long   gemm_bf16_direct;   /* matmuls on the caller's bf16 operands as stored
                                  (weights' shadows: no conversion at all)        */
    long   gemm_bf16_cast_elems; /* fp32 operand elements rounded to bf16 inside
                                  gemm / gemm_bf16 (the per-call conversions left) */
    long   gemm_grouped_calls; /* grouped GEMM entries called                      */
    long   gemm_grouped_loops; /* ... of those, run as a loop of gemm calls        */
    char   gemm_grouped_fallback[128]; /* why the last loop ran ("" = never)     */
    /* attention_forward_bf16 / _backward_bf16 (precision=bf16, attention_tc.cu): */
    long   attention_tc_calls;        /* calls run on tensor cores (wmma bf16)     */
    long   attention_fp32_fallbacks;  /* calls run by the fp32 kernels (hd > 128)  */
    long   attention_dq_recompute;    /* backward calls whose dS tiles were over
                                         MT_CUDA_ATTN_DS_MB: dQ recomputed P, dP   */
    /* receipt fields (issue 19 item 5) */
    int    device_count;       /* cudaGetDeviceCount at init                       */
    int    driver_version;     /* cudaDriverGetVersion, e.g. 13000                 */
    int    emulated;           /* 1 under the CPU emulator (tests/cuda/emu): every
                                  device field above is the emulator's, not a GPU's */
    size_t mem_free_now;       /* cudaMemGetInfo at this call: free bytes         */
    size_t mem_used_peak;      /* max of total - free after every allocation (the
                                  device's view: every process, the CUDA context,
                                  cuBLAS; next to the allocator's bucket peaks)   */
    /* which physical device ran (issue 20 item 4); "" / -1 where the query failed */
    char   uuid[48];           /* cudaDeviceProp.uuid as nvidia-smi -L prints it:
                                  "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"      */
    char   pci_bus_id[32];     /* cudaDeviceGetPCIBusId, e.g. "0000:18:00.0"      */
    int    ecc_enabled;        /* cudaDevAttrEccEnabled (0/1)                      */
    int    sm_clock_khz;       /* cudaDevAttrClockRate: the SM's peak clock       */
    int    mem_clock_khz;      /* cudaDevAttrMemoryClockRate: peak memory clock   */
    int    mem_bus_width_bits; /* cudaDevAttrGlobalMemoryBusWidth                 */
    int    op_profile;         /* 1: the table's entries time themselves with event
                                  pairs while the profile is on (MT_CUDA_OP_PROFILE,
                                  default 1; 0 = off, for measuring its cost)    */
    char   launch_log[256];    /* MT_CUDA_LAUNCH_LOG's file, "" = no launch log   */
};

/* What the backend asked of the device (docs/cuda.md, "Per-op profile and
 * counters"), counted where the backend calls the runtime, so exact (the
 * same under the emulator). Running totals since the instance was created;
 * the trainer's step marks (the table's profile_step) keep per-step deltas. */
struct mt_ops_cuda_counters {
    long      launches;      /* our kernels (MT_LAUNCH)                            */
    long      blas_calls;    /* cuBLAS / cuBLASLt calls that run work (sgemm,
                                Lt matmul, grouped GEMM): >= 1 kernel each      */
    long      memsets;       /* cudaMemsetAsync                                   */
    long      h2d, d2h, d2d; /* cudaMemcpyAsync by direction                      */
    long long h2d_bytes, d2h_bytes, d2d_bytes;
    long      syncs;         /* host waits for the stream (cudaStreamSynchronize) */
    long      allocs, frees; /* cudaMalloc / cudaFree (buffers, workspace growth) */
    long      ws_grows;      /* of those allocs: growths of the backend's grow-only
                                workspace (sized by its first users, so in the
                                first step; docs/cuda.md)                        */
    long      graph_launches;/* cudaGraphLaunch of a captured segment (CUDA graphs) */
    long      graph_ops;     /* device ops those launches stood for (not counted
                                in launches/blas_calls/memsets/d2d above)        */
};

/* CUDA graphs of the step (graph.cu; docs/cuda.md "CUDA graphs"), for the
 * receipt: whether they ran, and how the step's segments went. */
struct mt_ops_cuda_graph_info {
    int  want;              /* graph_mode on (the trainer's decision)           */
    int  ran;               /* want, no failure, >= 1 segment replayed           */
    int  failed;            /* a capture or replay failed (sticky error)        */
    long steps;             /* steps run with graphs wanted                     */
    long captured_step;     /* graph step of the capture (1), -1: none          */
    int  segments;          /* segments (between host waits) of the last step   */
    int  static_segments;   /* ... captured and replayed                        */
    int  dynamic_segments;  /* ... eager: a by-value argument changed per step  */
    long graph_ops;         /* device ops inside the static segments            */
    long graph_nodes;       /* nodes of their graphs                            */
    char why_not[200];      /* why off ("" when wanted)                         */
    char why_dynamic[160];  /* the first op that made a segment dynamic         */
};
void mt_ops_cuda_graph_info_of(void *be, struct mt_ops_cuda_graph_info *out);
/* Environment variable naming a file the backend appends one line per
 * kernel launch to ("launch NAME grid X Y Z block X Y Z threads N"), per
 * copy ("copy h2d|d2h|d2d BYTES"), host wait ("sync 0") and device
 * allocation ("alloc BYTES"), and a line per step mark ("step K begin" /
 * "step K end"); unset: no log. */
#define MT_CUDA_LAUNCH_LOG_ENV "MT_CUDA_LAUNCH_LOG"
#define MT_CUDA_STEP_LOG       256   /* steps whose deltas are kept one by one */
/* Runtime tunable, read at creation: "0" turns the per-op event pairs off. */
#define MT_CUDA_OP_PROFILE_ENV "MT_CUDA_OP_PROFILE"

/* The plain queries below act on the default instance (mt_ops_cuda());
 * their _of forms (end of file) take an instance.
 *
 * MT_OK while no CUDA/cuBLAS call has failed; otherwise the first failure's
 * status and, in msg, "file:line: call: reason (+N more)". msg may be NULL. */
enum mt_status mt_ops_cuda_status(char *msg, size_t msg_len);

/* Fill `info`; MT_ERR_UNSUPPORTED if the backend was never initialised. */
enum mt_status mt_ops_cuda_get_info(struct mt_ops_cuda_info *info);

/* The cudaStream_t (as void *) every op of the table is queued on, in call
 * order; NULL before init. Collectives (NCCL) that read or write buffers of
 * this backend enqueue on it too, so no extra synchronisation is needed. */
void *mt_ops_cuda_stream(void);

/* Switch the GEMM precision of the table for every later gemm call (work
 * already queued keeps its precision). MT_ERR_UNSUPPORTED before the table
 * exists (call mt_ops_cuda() first: it reads MT_CUDA_PRECISION), MT_ERR_INVALID_ARG
 * for a value outside the enum. */
enum mt_status mt_ops_cuda_set_precision(enum mt_cuda_precision p);
/* The precision now in use (FP32 before init). */
enum mt_cuda_precision mt_ops_cuda_get_precision(void);
/* "fp32" / "bf16" ("?" for a value outside the enum). */
const char *mt_ops_cuda_precision_name(enum mt_cuda_precision p);
/* Parse "fp32" / "bf16" (exact, lower case): MT_OK or MT_ERR_INVALID_ARG. */
enum mt_status mt_ops_cuda_precision_parse(const char *s, enum mt_cuda_precision *out);

/* Bind this process to device (local_rank mod device count) before the
 * table exists (call it before mt_ops_cuda(): the backend uses the current
 * device). MT_ERR_UNSUPPORTED after init on another device or without one. */
enum mt_status mt_ops_cuda_use_device(int local_rank);

/* Release the default instance's stream, cuBLAS handle and scratch. Buffers
 * from buf_alloc must be freed before. A later mt_ops_cuda() initialises
 * again. Instances from mt_ops_cuda_create() are not touched. */
void mt_ops_cuda_shutdown(void);

/* More instances (docs/cuda.md, "The backend handle"). mt_ops_cuda() is the
 * default instance; mt_ops_cuda_create() returns another table whose `be` is
 * a new, independent instance: its own stream, cuBLAS and cuBLASLt handles
 * and plans, scratch and workspace, GEMM precision `p` (source "set by
 * caller"; MT_CUDA_BF16_SCRATCH_MB is read as for the default), counters and
 * sticky error. Entries of each table act on their own instance only, so two
 * models (or two streams) coexist in one process; the device is the current
 * one (mt_ops_cuda_use_device()). NULL with the reason in `why` on failure.
 * Device buffers may be passed between instances only after a sync() of the
 * writer (the two streams are not ordered with each other). */
const struct mt_ops_i *mt_ops_cuda_create(enum mt_cuda_precision p, char *why, size_t why_len);
/* Synchronise and release the instance of `ops` and the table itself (the
 * pointer is invalid after). The default table goes through shutdown.
 * Buffers it allocated must be freed before. NULL: nothing. */
void mt_ops_cuda_destroy(const struct mt_ops_i *ops);
/* The per-instance forms of the queries above, given ops->be (NULL = the
 * default instance): what the plain forms report for the default. */
enum mt_status mt_ops_cuda_status_of(void *be, char *msg, size_t msg_len);
enum mt_status mt_ops_cuda_get_info_of(void *be, struct mt_ops_cuda_info *info);
enum mt_status mt_ops_cuda_set_precision_of(void *be, enum mt_cuda_precision p);
enum mt_cuda_precision mt_ops_cuda_get_precision_of(void *be);
void *mt_ops_cuda_stream_of(void *be);
/* The running counters of instance `be` (NULL = default); zeros without one. */
void mt_ops_cuda_counters_of(void *be, struct mt_ops_cuda_counters *out);
/* Steps closed by the step marks so far (*n_steps, all of them) and a
 * pointer to the first min(n_steps, MT_CUDA_STEP_LOG) per-step deltas
 * (valid until the instance is destroyed); NULL without an instance. */
const struct mt_ops_cuda_counters *mt_ops_cuda_step_counters_of(void *be, int *n_steps);

#ifdef __cplusplus
}
#endif

#endif /* MT_OPS_CUDA_H */
