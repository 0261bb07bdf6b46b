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
 * with MT_WITH_CUDA. Only src/ops and the cuda tests and bench include this
 * header (under that macro): the trainer, the receipt and the tools read the
 * same queries through the table's backend facts (mt_ops.h: status,
 * device_info, step_counters, queue, gemm_precision, op_profile), which work
 * in every build (scripts/check_layers.py).
 */
#ifndef MT_OPS_CUDA_H
#define MT_OPS_CUDA_H

#include <stddef.h>
#include "../../core/mt_core.h"
#include "../mt_ops.h"

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

/* Device and library description for the receipt (filled at init): the
 * table's struct mt_ops_device_info (mt_ops.h), which code outside the
 * backend reads through the device_info entry; this name is the backend's. */
#define mt_ops_cuda_info mt_ops_device_info

/* What the backend asked of the device: the table's struct
 * mt_ops_device_counters (mt_ops.h, step_counters entry); this name is the
 * backend's. */
#define mt_ops_cuda_counters mt_ops_device_counters

/* CUDA graphs of the step: the table's struct mt_ops_graph_info (mt_ops.h,
 * graph_info entry); this name is the backend's. */
#define mt_ops_cuda_graph_info mt_ops_graph_info
void mt_ops_cuda_graph_info_of(void *be, struct mt_ops_cuda_graph_info *out);
/* Environment variable naming a file the backend appends one line per
 * kernel launch to ("launch NAME grid X Y Z block X Y Z threads N"), per
 * copy ("copy h2d|d2h|d2d BYTES"), host wait ("sync 0") and device
 * allocation ("alloc BYTES"), and a line per step mark ("step K begin" /
 * "step K end"); unset: no log. */
#define MT_CUDA_LAUNCH_LOG_ENV "MT_CUDA_LAUNCH_LOG"
#define MT_CUDA_STEP_LOG       MT_OPS_STEP_LOG   /* steps whose deltas are kept one by one */
/* Runtime tunable, read at creation: "0" turns the per-op event pairs off. */
#define MT_CUDA_OP_PROFILE_ENV "MT_CUDA_OP_PROFILE"
/* Runtime tunable (bench), read at creation: "1" also times every kernel
 * launch of the step with an event pair (eager launches only: a replayed
 * graph is one unit). Each kernel then appears in the receipt's
 * timing.op_profile_by_entry as "kernel:NAME" beside the table entries
 * that launched it (the kinds' totals do not count them twice). The extra
 * events cost ~2-4 us a launch: for finding the slow kernel, not for
 * tokens/s. */
#define MT_CUDA_KERNEL_PROFILE_ENV "MT_CUDA_KERNEL_PROFILE"

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
/* The bf16 attention kernels (knob attn_kernel; MT_CUDA_ATTN_KERNEL is read
 * at init): "v1" (attention_tc.cu, wmma, two-pass forward), "v2"
 * (attention_v2.cu, FlashAttention-2-class; head dims 64 and 128, others
 * run v1, counted), "v3" (the default: v2 with 128 query rows a block in
 * the forward and dQ kernels, 32 a warp; v2's bits), "v4" (attention_wg.cu: the
 * forward, dK/dV and dQ on wgmma) or "v5" (v4 reading its transposed operands
 * MN-major: no transposes in shared memory). MT_ERR_INVALID_ARG for another name,
 * MT_ERR_UNSUPPORTED before the table exists, or for v4, v5 where wgmma does not run
 * (no sm_90a device code in the build, or a device other than sm_90). */
enum mt_status mt_ops_cuda_set_attn_kernel(const char *name);

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
enum mt_status mt_ops_cuda_set_attn_kernel_of(void *be, const char *name);
/* the causal attention's block order (attn_sched.cuh): the budget of a group of
 * (batch, head) pairs in KiB; 1: groups of one pair (the order before the
 * twenty-second session; cuda_calib's A/B), 0: the one set at creation
 * (MT_CUDA_ATTN_GROUP_KIB, else a third of the L2); MT_ERR_INVALID_ARG below 0
 * or over 2^30 */
enum mt_status mt_ops_cuda_set_attn_group_kib_of(void *be, long long kib);
/* the grouped GEMMs' block tile columns (gemm_grouped.cu): 128 or 256
 * (MT_CUDA_GG_BN at creation, default 256); MT_ERR_INVALID_ARG otherwise */
enum mt_status mt_ops_cuda_set_gg_bn_of(void *be, int bn);
/* A runtime tunable the cuda backend reads, by its knob (`knob` an enum
 * mt_knob_id, src/core/mt_knobs.h: cuda_precision, attn_kernel, attn_ds_mb,
 * attn_group_kib, grouped_gemm_bn, grouped_gemm_kernel, bf16_scratch_mb), set
 * to `value` after creation, as a run's config or --knob sets it
 * (src/ops/ops.c; the MT_* aliases are read at creation). MT_ERR_INVALID_ARG
 * for a value the knob table refuses or a knob the backend does not read;
 * MT_ERR_UNSUPPORTED without an instance, or for attn_kernel=v4, v5 or
 * grouped_gemm_kernel=wgmma where wgmma does not run. */
enum mt_status mt_ops_cuda_set_knob_of(void *be, int knob, const char *value);
/* Those knobs (enum mt_knob_id values) in *knobs; returns their count. */
int mt_ops_cuda_knobs(const int **knobs);
enum mt_cuda_precision mt_ops_cuda_get_precision_of(void *be);
/* Hopper's warpgroup MMA, probed (wgmma_probe.cu; docs/cuda.md "wgmma"): C (M x N,
 * fp32, row-major) = A (M x K, bf16, row-major) B (N x K, bf16, row-major)^T on the
 * instance's stream, through wgmma.mma_async with 128-byte-swizzled K-major shared
 * tiles. form: 0, or these bits: MT_WGMMA_PROBE_A_REGS, A from registers instead
 * (loaded by ldmatrix: the RS form); MT_WGMMA_PROBE_B_MN, B given as (K x N)
 * row-major and read MN-major (the instruction's imm-trans); MT_WGMMA_PROBE_A_MN, A
 * given as (K x M) row-major, likewise (not with A_REGS). M and N multiples of 128,
 * K of 64, else MT_ERR_INVALID_ARG; MT_ERR_UNSUPPORTED where wgmma does not run (no
 * sm_90a device code in the build, or not an sm_90 device). Not an op of the table:
 * the first kernel on wgmma, checked by cuda_ops_vs_cpu and timed by cuda_calib. */
#define MT_WGMMA_PROBE_A_REGS 1
#define MT_WGMMA_PROBE_B_MN 2
#define MT_WGMMA_PROBE_A_MN 4
enum mt_status mt_ops_cuda_wgmma_probe_of(void *be, float *C, const void *A, const void *B, int M, int N, int K,
                                          int form);
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
