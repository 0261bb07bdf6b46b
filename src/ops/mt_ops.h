/*
 * mt_ops.h — the kernel interface: one table of function pointers per backend.
 *
 * Model and optimizer code call kernels only through a `const struct
 * mt_ops_i *` (ggml's ggml_backend_i). The cpu backend fills it with OpenBLAS
 * + OpenMP kernels (src/ops/cpu/), the cuda backend with CUDA kernels
 * (src/ops/cuda/). A NULL entry means "unsupported on this backend": callers
 * check with mt_ops_supports() and report it, never fall back silently.
 *
 * Conventions (all kernels):
 * - Buffers are backend memory (device pointers on cuda). float32, row-major.
 * - Shape comments use the glossary of docs/glossary.md:
 *     B batch (sequences), T sequence length, N = B*T rows, C/D model dim,
 *     V vocab, H query heads, K kv heads, hd head dim, F hidden,
 *     E experts, k top_k, M = N*k routed rows.
 * - Outputs first, then inputs, then weights, then dimensions (llm.c).
 * - Gradient rule: each backward says per output whether it OVERWRITES (=)
 *   or ACCUMULATES (+=). Parameter gradients always accumulate.
 * - Kernels do not fail on valid shapes: they return void. Shape checks
 *   happen once in the model (internal invariants).
 * - Deterministic: same inputs and thread count -> same bits (static
 *   scheduling, fixed reduction orders; no atomics on float).
 */
#ifndef MT_OPS_H
#define MT_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"

/* Element types of the bf16 mode's operands (every other buffer is fp32).
 * mt_bf16 is bf16 storage: the upper 16 bits of an IEEE fp32. */
enum mt_elem { MT_ELEM_F32 = 0, MT_ELEM_BF16 = 1 };
typedef uint16_t mt_bf16;

/* A device backend's description for the receipt (the table's device_info
 * entry; filled at init, the memory figures at each call). Every field is
 * the cuda backend's today; "" / -1 where a query failed. */
struct mt_ops_device_info {
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
    long   gemm_plan_heuristics; /* cuBLASLt heuristic queries (a plan built for a
                                  new shape; host time, ~0.1 ms each)             */
    long   gemm_plan_algo_reuses; /* new shapes that took the algorithm of a cached
                                  shape of the same class (checked, no heuristic) */
    long   gemm_grouped_calls; /* grouped GEMM entries called                      */
    long   gemm_grouped_loops; /* ... of those, run as a loop of gemm calls        */
    char   gemm_grouped_fallback[128]; /* why the last loop ran ("" = never)     */
    /* attention_forward_bf16 / _backward_bf16 (precision=bf16, attention_tc.cu): */
    long   attention_tc_calls;        /* calls run on tensor cores (wmma bf16)     */
    long   attention_fp32_fallbacks;  /* calls run by the fp32 kernels (hd > 128)  */
    long   attention_dq_recompute;    /* backward calls whose dS tiles were over
                                         MT_CUDA_ATTN_DS_MB: dQ recomputed P, dP   */
    char   attn_kernel[4];            /* "v1", "v2" or "v3": the bf16 attention kernels
                                         chosen (knob attn_kernel, MT_CUDA_ATTN_KERNEL) */
    long   attention_v2_calls;        /* calls run by attention_v2.cu             */
    long long attn_group_bytes;       /* the causal kernels' block order: a group of
                                         (batch, head) pairs re-reads at most this
                                         (attn_sched.cuh; a third of the L2 unless
                                         MT_CUDA_ATTN_GROUP_KIB or cuda_calib's A/B) */
    long   attention_v2_fallbacks;    /* v2 chosen, head dim not 64/128: ran v1    */
    int    attention_v2_fallback_hd;  /* the head dim of the last such call        */
    /* ssm_scan_forward_bf16 / _backward_bf16 (precision=bf16, ssd_tc.cu): */
    long   ssm_scan_tc_calls;         /* calls whose intra-chunk products ran on
                                         tensor cores                              */
    long   ssm_scan_tc_fallbacks;     /* calls run by the fp32 entries (chunk <= 0,
                                         or chunk, headdim or d_state above 128)   */
    /* init_normal (init.cu): parameter elements drawn on the device, and of those
     * the ones the host computed and wrote in (the libm-sensitive roundings) */
    long long init_normal_elems;
    long long init_normal_host_fixes;
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
    int    kernel_profile;     /* 1: each kernel launch timed too (MT_CUDA_KERNEL_PROFILE) */
};

/* What a device backend asked of the device (docs/cuda.md, "Per-op profile
 * and counters"), counted where the backend calls the runtime, so exact (the
 * same under the emulator). Running totals since the instance was created;
 * the trainer's step marks (the table's profile_step) keep per-step deltas
 * (the table's step_counters entry, the first MT_OPS_STEP_LOG steps). */
struct mt_ops_device_counters {
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
    long      plan_builds;   /* cuBLASLt plans built (a plan-cache miss: descriptors,
                                maybe a heuristic query); none after the first step
                                unless the cache is too small for the step's shapes */
    long      graph_launches;/* cudaGraphLaunch of a captured segment (CUDA graphs) */
    long      graph_ops;     /* device ops those launches stood for (not counted
                                in launches/blas_calls/memsets/d2d above)        */
};

/* CUDA graphs of the step (src/ops/cuda/graph.cu; docs/cuda.md "CUDA graphs"),
 * for the receipt: whether they ran, and how the step's segments went. */
struct mt_ops_graph_info {
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
#define MT_OPS_STEP_LOG 256   /* steps whose counter deltas are kept one by one */

struct mt_ops_i {
    const char *name;  /* "cpu", "cuda" */
    void       *be;    /* the backend instance: every entry receives it first, ops->gemm(ops->be, ...) */

    /* ---- memory ---- */
    /* Zero-filled backend buffer tagged with a bucket (accounted on ctx). NULL + MT_ERR_OOM on failure. */
    void *(*buf_alloc)(void *be, struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket);
    void  (*buf_free)(void *be, struct mt_ctx *ctx, void *p);
    void  (*copy_to_host)(void *be, void *dst_host, const void *src, size_t bytes);
    void  (*copy_from_host)(void *be, void *dst, const void *src_host, size_t bytes);
    void  (*copy)(void *be, void *dst, const void *src, size_t bytes);      /* backend to backend */
    void  (*sync)(void *be);                                            /* wait for queued work */

    /* ---- elementwise / reductions ---- */
    void   (*fill)(void *be, float *x, float value, size_t n);
    /* y = a*x + b*y  (x may be NULL: y = b*y) */
    void   (*axpby)(void *be, float *y, const float *x, float a, float b, size_t n);
    /* sum of squares accumulated in double; result returned on the host */
    double (*sumsq)(void *be, const float *x, size_t n);
    /* 1 if every element is finite */
    int    (*all_finite)(void *be, const float *x, size_t n);

    /* ---- GEMM ----
     * C (M,N) = alpha * op(A) op(B) + beta * C, row-major;
     * op(A) is (M,K): A is (M,K) with lda >= K, or (K,M) if transA with lda >= M.
     * op(B) is (K,N): B is (K,N) with ldb >= N, or (N,K) if transB with ldb >= K.
     * Linear layer y = x W^T with W (O,I): gemm(0,1, N,O,I, 1, x,I, W,I, 0, y,O). */
    void (*gemm)(void *be, int transA, int transB, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc);
    /* Grouped GEMM (the MoE experts: one call per projection instead of one
     * per expert). For g in [0, n): exactly gemm(transA, transB, M[g], N[g],
     * K[g], alpha, A[g], lda, B[g], ldb, beta, C[g], ldc) — same contract,
     * same numbers as those n calls, in any order (the C[g] must not
     * overlap). M, N, K, A, B, C are HOST arrays of n entries; the matrices
     * are backend buffers. cpu: those n gemm calls; cuda: one
     * cublasGemmGroupedBatchedEx in fp32 mode (a counted loop otherwise,
     * mt_ops_cuda_info.gemm_grouped_fallback says why). May be NULL in a
     * table that has no grouped form: callers loop over gemm then. */
    void (*gemm_grouped)(void *be, int transA, int transB, int n, const int *M, const int *N, const int *K, float alpha,
                         const float *const *A, int lda, const float *const *B, int ldb, float beta,
                         float *const *C, int ldc);
    /* ---- bf16 GEMM (precision=bf16, docs/cuda.md "bf16 mixed precision") ----
     * C (M,N) fp32 = alpha * op(A) op(B) + beta * C with the gemm contract,
     * each operand given as fp32 (MT_ELEM_F32) or as bf16 storage (MT_ELEM_BF16:
     * mt_bf16 elements, lda/ldb in elements). The product runs on bf16
     * values with fp32 accumulation: an fp32 operand is rounded to bf16
     * (nearest even) inside the call — a counted per-call conversion
     * (mt_ops_cuda_info.gemm_bf16_cast_elems on cuda); a bf16 operand is
     * used as stored. C is read and written in fp32 (beta = 1 accumulation
     * never rounds to bf16). cpu: the operands rounded into fp32 scratch,
     * then sgemm (the same products: a product of two bf16 values is exact
     * in fp32). NULL: the backend has no bf16 mode (callers refuse
     * precision=bf16, never fall back). */
    void (*gemm_bf16)(void *be, int transA, int transB, int M, int N, int K, float alpha,
                      const void *A, enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb,
                      float beta, float *C, int ldc);
    /* gemm_bf16_out: C (M,N) bf16 = bf16(alpha op(A) op(B)): gemm_bf16's
     * product with beta 0 and its fp32 result rounded once (nearest even) as
     * it is stored (cuda: cuBLASLt's bf16 D; cpu: gemm_bf16 into fp32 scratch,
     * then the rounding). For a GEMM output whose readers want bf16 storage
     * (the SwiGLU's gate and up in precision=bf16: half the bytes written and
     * read). Optional (NULL: the caller keeps the fp32 output). */
    void (*gemm_bf16_out)(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                          enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, mt_bf16 *C,
                          int ldc);
    /* gemm_bf16_resid: C (M,N) fp32 = alpha op(A) op(B) + R, R (M,N) fp32 at
     * C's row stride ldc: exactly gemm_bf16 with beta 1 onto a copy of R (the
     * same bits), without the copy (cuda: cuBLASLt's C operand R, D = C). R
     * may be C (then it is gemm_bf16 with beta 1); otherwise they must not
     * overlap. For a block's output projection adding its branch onto the
     * residual stream, x_out = x_in + y W^T: the input norm no longer seeds
     * x_out = x_in (4 bytes an element written, then read by the GEMM's
     * epilogue). Optional (NULL: the caller seeds C = R, then beta 1). */
    void (*gemm_bf16_resid)(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                            enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, const float *R,
                            float *C, int ldc);
    /* ---- grouped bf16 GEMMs sized on the device (MoE, ep = 1; issue 28 item 2) ----
     * The groups are row ranges of an expert-sorted buffer: group g owns rows
     * [offs[g], offs[g+1]) (offs: n+1 int32 in BACKEND memory, nondecreasing,
     * offs[0] = 0, offs[n] <= max_rows), so the sizes never reach the host and
     * one launch serves every expert (and a CUDA graph can hold it).
     * gemm_grouped_rows: for every group g and row r of it,
     *     C[r,:] (N) = alpha A[r,:] op(B_g) + beta C[r,:]
     *   A bf16 (rows, K) lda; B_g bf16: (N, K) ldb when transB (a weight
     *   W (out, in): y = x W^T), else (K, N) ldb (dx = dy W); B a HOST array
     *   of n backend pointers. C (rows, N) ldc: c_type MT_ELEM_F32, or
     *   MT_ELEM_BF16 (beta must be 0; the fp32 result rounded once, nearest
     *   even). max_rows: a host bound of offs[n] (sizes the launch); rows at
     *   or past offs[n] are not touched.
     * gemm_grouped_sum: for every group g,
     *     C_g (M, N) fp32 = alpha sum over rows r of g of A[r,:]^T B[r,:] + beta C_g
     *   A bf16 (rows, M) lda, B bf16 (rows, N) ldb (the weight gradient
     *   dW_g += dy_g^T x_g); C a HOST array of n distinct backend pointers;
     *   an empty group leaves beta C_g.
     * Both: products of bf16 values accumulated in fp32, each output element
     * in one fixed order (deterministic). n <= MT_GROUPED_DEV_MAX; every
     * dimension and leading dimension a multiple of 8 and every buffer 16-byte
     * aligned (cuda's 16-byte loads: mt_grouped_dev_dims_ok). cpu: gemm_bf16 /
     * gemm_bf16_out per group, reading offs directly (the reference); cuda:
     * one launch each (gemm_grouped.cu). Optional (NULL: the MoE layer reads
     * the offsets on the host and sizes its GEMMs there). */
    void (*gemm_grouped_rows)(void *be, int n, const int32_t *offs, int max_rows, int N, int K, int transB,
                              float alpha, const mt_bf16 *A, int lda, const mt_bf16 *const *B, int ldb, float beta,
                              void *C, enum mt_elem c_type, int ldc);
    void (*gemm_grouped_sum)(void *be, int n, const int32_t *offs, int M, int N, float alpha, const mt_bf16 *A,
                             int lda, const mt_bf16 *B, int ldb, float beta, float *const *C, int ldc);
    /* dst[i] = bf16(src[i]), round to nearest even (NaN stays NaN): the
     * bf16 shadows of the weights, written once per step. */
    void (*cast_bf16)(void *be, mt_bf16 *dst, const float *src, size_t n);
    /* gemm_bf16_batched: for i in [0, count), bf16 in and bf16 out,
     *     D_i (M,N) = bf16(alpha op(A_i) op(B_i) + beta C_i)
     * with A_i = A + i stride_a, B_i = B + i stride_b, C_i = C + i stride_d,
     * D_i = D + i stride_d (strides in elements; C_i and D_i share ldd), the
     * gemm contract's shapes and transposes. Products of bf16 values summed in
     * fp32, the sum alpha acc + beta c in fp32, rounded once (nearest even)
     * as it is stored. C may be D (in place) or NULL when beta == 0; no
     * operand overlaps D otherwise. Elements of D between its rows (ldd > N)
     * and between its matrices are not written. Muon's Newton–Schulz on a
     * batch of same-shape matrices (muon.c): three such calls an iteration
     * instead of three GEMMs and four elementwise passes per matrix. cpu:
     * count gemm_bf16 calls into fp32 scratch seeded with C_i, then the
     * rounding; cuda: one cuBLASLt matmul with a batch count (bf16 C and D).
     * Optional (NULL: Muon's bf16 iteration is refused with its reason; knob
     * muon_ns_bf16=0 runs the fp32 one, which needs only gemm). */
    void (*gemm_bf16_batched)(void *be, int transA, int transB, int M, int N, int K, float alpha, const mt_bf16 *A,
                              int lda, size_t stride_a, const mt_bf16 *B, int ldb, size_t stride_b, float beta,
                              const mt_bf16 *C, mt_bf16 *D, int ldd, size_t stride_d, int count);

    /* ---- embedding ---- */
    /* out (N,C) = wte[idx[n]] ; idx (N) int32 in [0,V) */
    void (*embed_forward)(void *be, float *out, const int32_t *idx, const float *wte, int N, int C);
    /* dwte (V,C) += ; rows scattered in a fixed order (deterministic) */
    void (*embed_backward)(void *be, float *dwte, const float *dout, const int32_t *idx, int N, int C, int V);

    /* ---- RMSNorm: out = x / sqrt(mean(x^2) + eps) * w ----
     * rows N of width C; rstd (N) saved for backward.
     * backward: with xhat = x*rstd,
     *   dw   += sum_n dout*xhat                                     (+=)
     *   dx    = rstd * (dout*w - xhat * mean_c(dout*w*xhat))      (= or += per accumulate)
     * QK-norm is this op with rows N*H (or N*K) and C = hd, w shared by heads.
     * dweight NULL: dx only (a frozen gain has no gradient buffer). */
    void (*rmsnorm_forward)(void *be, float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps);
    void (*rmsnorm_backward)(void *be, float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C, int accumulate);
    /* precision=bf16: rmsnorm_forward (same out, same rstd) that also writes
     * out_bf16 = bf16(out) (nearest even) from the same kernel: the GEMM
     * operand, so the GEMMs reading the norm output convert nothing.
     * out may be NULL: only the twin (and rstd) is written, the same bits,
     * for a caller whose GEMMs read the twin alone. Optional (NULL: the GEMMs
     * round out per call). */
    void (*rmsnorm_forward_bf16)(void *be, float *out, mt_bf16 *out_bf16, float *rstd, const float *inp,
                                 const float *weight, int N, int C, float eps);

    /* ---- RoPE, rotate-half, in place allowed (out == inp) ----
     * x viewed as (N, nh, hd); row n has position pos0 + n % T.
     * cos_tab/sin_tab (Tmax, hd/2): cos(p * inv_freq[i]), inv_freq[i] = theta^(-2i/hd).
     *   out_i        = x_i cos - x_{i+hd/2} sin
     *   out_{i+hd/2} = x_{i+hd/2} cos + x_i sin
     * backward is the inverse rotation (dinp = R^T dout), in place allowed, (=). */
    void (*rope_forward)(void *be, float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                         int N, int T, int pos0, int nh, int hd);
    void (*rope_backward)(void *be, float *dinp, const float *dout, const float *cos_tab, const float *sin_tab,
                          int N, int T, int pos0, int nh, int hd);

    /* ---- causal attention, GQA, flash style (no T x T matrix kept) ----
     * q (B,Tq,H,hd), k,v (B,Tk,K,hd), out (B,Tq,H,hd), lse (B,H,Tq).
     * Query i of a sequence sits at position q_pos0 + i and reads keys j <= q_pos0 + i
     * (training: Tq == Tk, q_pos0 = 0; decoding with a KV cache: Tq = 1, q_pos0 = Tk-1).
     * Query head h reads kv head h / (H/K). scale = 1/sqrt(hd).
     * lse[b,h,i] = log sum_j exp(scale * q.k_j) (natural log), saved for backward.
     * backward (Tq == Tk, q_pos0 = 0): recomputes P from q,k,lse;
     *   D_i = sum_d dout_i * out_i;  dS = P * (dout v^T - D);
     *   dq = scale dS k; dk = scale dS^T q (summed over the heads sharing a kv head); dv = P^T dout
     *   dq, dk, dv all OVERWRITE (=). */
    void (*attention_forward)(void *be, float *out, float *lse, const float *q, const float *k, const float *v,
                              int B, int Tq, int Tk, int q_pos0, int H, int K, int hd);
    void (*attention_backward)(void *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse,
                               int B, int T, int H, int K, int hd);

    /* ---- SwiGLU: out = silu(g) * u, rows N of width F ----
     * backward: dg = dout * u * silu'(g), du = dout * silu(g)   (both =)
     * silu(x) = x*sigmoid(x), silu'(x) = s + x*s*(1-s) */
    void (*swiglu_forward)(void *be, float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(void *be, float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);

    /* ---- fused (optional softcap) softmax cross-entropy ----
     * logits (N,V) raw z = h Wlm^T. With c = softcap > 0: s = c*tanh(z/c), else s = z.
     * forward: losses[n] = lse(s_n) - s_n[target]  (0 where target == -1);
     *          lse_out (N) saved for backward. targets in [0,V) or -1.
     * backward: dlogits[n,:] = dscale * (softmax(s_n) - onehot(target)) * ds/dz
     *           (0 for rows with target -1); ds/dz = 1 - tanh^2(z/c) with softcap.
     *           OVERWRITES; may alias logits (in place) to save V*N memory. */
    void (*xent_forward)(void *be, float *losses, float *lse_out, const float *logits, const int32_t *targets,
                         int N, int V, float softcap);
    void (*xent_backward)(void *be, float *dlogits, const float *logits, const float *lse,
                          const int32_t *targets, float dscale, int N, int V, float softcap);

    /* ---- MoE router (fp32) ----
     * logits (N,E) -> probs = softmax(logits) (N,E), lse (N) = logsumexp(logits),
     * topk_idx (N,k): k rounds of argmax over probs, first maximum wins, chosen
     * entries excluded from later rounds; gates (N,k) = p[topk] / sum_j p[topk_j].
     * backward: dlogits (N,E) OVERWRITTEN from
     *   dgates (N,k)  through the renormalisation: dp_i(j) += dg_j/S - sum_m dg_m g_m / S,
     *   dprobs (N,E)  extra gradient w.r.t. probs (aux loss), may be NULL,
     *   dlse (N)      gradient w.r.t. lse (z-loss), may be NULL,
     *   then softmax backward: dlogit_e = p_e (dp_e - sum_e' p_e' dp_e') + dlse * p_e. */
    void (*router_forward)(void *be, float *probs, float *lse, int32_t *topk_idx, float *gates,
                           const float *logits, int N, int E, int k);
    void (*router_backward)(void *be, float *dlogits, const float *dgates, const float *dprobs,
                            const float *dlse, const float *probs, const int32_t *topk_idx,
                            const float *gates, int N, int E, int k);

    /* ---- MoE permute / combine (dropless, race-free, deterministic) ----
     * Routed slot (n, j) lives at row pos[n*k + j] of the expert-sorted buffer
     * (M = N*k rows), src_row[m] = the token n of row m.
     * permute:          xp[m] = h[src_row[m]]                       (=)
     * permute_backward: dh[n] (+)= sum_j dxp[pos[n*k+j]]  (j order; accumulate 1: +=,
     *                   0: = as 0.0f + the terms, the bits of a zero fill then +=)
     * combine:          out[n] += sum_j gates[n,j] * y[pos[n*k+j]]  (+=)
     * combine_backward: dy[pos[n*k+j]] = gates[n,j] * dout[n]       (=)
     *                   dgates[n,j]   = dot(dout[n], y[pos[n*k+j]]) (=)
     * A slot with pos < 0 is a null one (a zero-computation expert, SPEC 1e;
     * moe_route writes -1): it has no row: no term in permute_backward and
     * combine, no dy row, and dgates[n,j] = 0. */
    void (*moe_permute)(void *be, float *xp, const float *h, const int32_t *src_row, int M, int C);
    void (*moe_permute_backward)(void *be, float *dh, const float *dxp, const int32_t *pos, int N, int k, int C,
                                 int accumulate);
    void (*moe_combine)(void *be, float *out, const float *y, const int32_t *pos, const float *gates,
                        int N, int k, int C);
    void (*moe_combine_backward)(void *be, float *dy, float *dgates, const float *dout, const float *y,
                                 const int32_t *pos, const float *gates, int N, int k, int C);
    /* The two with a bf16 output (the device-sized experts' operands,
     * moe_experts.c): moe_permute_bf16 writes xb[m] = bf16(h[src_row[m]]),
     * moe_combine_backward_bf16 dyb[pos[s]] = bf16(gates[s] dout[n]) and
     * dgates as moe_combine_backward; each value rounded once (nearest even):
     * the bits of the fp32 form followed by cast_bf16, with 8 of its 14 bytes
     * an element (permute) not moved. Optional (NULL: the fp32 form, then
     * cast_bf16). */
    void (*moe_permute_bf16)(void *be, mt_bf16 *xb, const float *h, const int32_t *src_row, int M, int C);
    void (*moe_combine_backward_bf16)(void *be, mt_bf16 *dyb, float *dgates, const float *dout, const float *y,
                                      const int32_t *pos, const float *gates, int N, int k, int C);

    /* ---- optimizers ----
     * AdamW (PyTorch): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     *   p *= 1 - lr*wd;  p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
     *   with bc1 = 1 - b1^t, bc2 = 1 - b2^t (t from 1). */
    void (*adamw_update)(void *be, float *p, const float *g, float *m, float *v, size_t n,
                         float lr, float b1, float b2, float eps, float wd, float bc1, float bc2);
    /* Muon momentum: m = mu*m + g; d = g + mu*m (Nesterov direction), d may alias g;
     * each g element read as gscale * g (one fp32 multiply: the value the clip's
     * axpby(g, NULL, 0, gscale) would store; g itself is not written; 1: g as is). */
    void (*muon_momentum)(void *be, float *d, float *m, const float *g, float mu, size_t n, float gscale);
    /* out (cols, rows) = transpose of in (rows, cols) */
    void (*transpose)(void *be, float *out, const float *in, int rows, int cols);

    /* ---- Mamba-3 SISO scan (trapezoidal; docs/mamba3.md) ----
     * x (B,T,H,P); Bm, Cm (B,T,H,N), per head (already normed, biased and
     * rotated by the caller); dt (B,T,H) after softplus; lam (B,T,H) after
     * sigmoid; A (H) negative; Dsk (H) the skip. Per (b, h), S (P,N), S_{-1} = 0:
     *   alpha = exp(dt A), gamma = lam dt, beta = (1-lam) dt alpha (beta_0 = 0)
     *   S_t = alpha_t S_{t-1} + gamma_t x_t B_t^T + beta_t x_{t-1} B_{t-1}^T
     *   y_t = S_t C_t + Dsk x_t                                     y (B,T,H,P) (=)
     * chunk <= 0: the plain recurrence (fp32 state; the reference); chunk > 0:
     * the chunked SSD form (GEMM-bound; equal up to fp32 rounding).
     * backward (chunked; chunk <= 0 means 64): dx, dBm, dCm, ddt, dlam (=);
     *   dA, dDsk (+=, reduced over sequences in a fixed order). */
    void (*ssm_scan_forward)(void *be, float *y, const float *x, const float *Bm, const float *Cm,
                             const float *dt, const float *lam, const float *A, const float *Dsk,
                             int B, int T, int H, int P, int N, int chunk);
    void (*ssm_scan_backward)(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                              float *dA, float *dDsk, const float *dy, const float *x,
                              const float *Bm, const float *Cm, const float *dt, const float *lam,
                              const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                              int chunk);
    /* ---- Mamba-3 mixer glue around the scan (docs/mamba3.md §2, §5) ----
     * proj (B*T, W) in-projection rows, W = 2E + 2GN + H + H*N/2 + H, split
     * z | xs | B | C | dt | theta | lam (E = H*P, G groups of H/G heads, N even).
     * prep_forward: x (B,T,H,P) = xs (x NULL: not written; the bf16 scan can
     *   read xs in proj itself, ldx = W); dt = softplus(dt_raw + dt_bias); lam =
     *   sigmoid(lam_raw); A (H) = -exp(A_log); Bh/Ch (B,T,H,N) = rot(ang,
     *   rmsnorm_N(B_g) gB + B_bias[h]) with ang = cumsum_t theta (rotate-half
     *   pairs (k, k+N/2)); rstd (B*T, 2G) saved (B's groups, then C's).
     *   ang_state (B,H,N/2) or NULL: when given, the cumsum starts from it and
     *   the last position's angles are written back (decoding token by token);
     *   NULL starts from 0 (training). Bh_b, Ch_b: NULL, or Bh, Ch are also
     *   written there as bf16 (nearest even; the same layout): the bf16 scan's
     *   operand twins (ssm_scan_*_bf16). Bh or Ch NULL with its twin given:
     *   the twin alone (the bf16 scan on its tensor-core shapes reads no fp32
     *   B, C; cuda refuses an array and its twin both NULL, MT_ERR_INVALID_ARG).
     *   ang_out: NULL, or (B*T, H, N/2) floats where the angles (the cumsum)
     *   are left for ssm_prep_backward's ang.
     * prep_backward: dproj (=) on every column but z's (dx NULL: nor xs's, which
     *   then hold dx already: the bf16 scan wrote them, ldx = W); ddt_bias, dA_log, dgB,
     *   dgC, dB_bias, dC_bias (+=). dA is the scan's dA. B_bias, C_bias: the
     *   forward's biases; the backward recomputes Bh, Ch (for the angles'
     *   gradient) from them, proj's raw B, C, rstd and the gains, the same bits
     *   as the forward's (a read of 2 H N floats a row less than taking them).
     *   ang: NULL (the angles recomputed: one more cumsum over the sequence),
     *   or the forward's ang_out of the same inputs (the same bits).
     * gate_norm: out (n,E) = rmsnorm over each of G groups of (y silu(z)) * w,
     *   z and dz with row stride ldz; rstd (n,G). backward: dy, dz (=), dw (+=). */
    void (*ssm_prep_forward)(void *be, float *x, float *Bh, float *Ch, float *dt, float *lam, float *A,
                             float *rstd, float *ang_state, const float *proj, const float *dt_bias,
                             const float *A_log, const float *gB, const float *gC,
                             const float *B_bias, const float *C_bias,
                             int B, int T, int H, int P, int G, int N, float eps, mt_bf16 *Bh_b,
                             mt_bf16 *Ch_b, float *ang_out);
    void (*ssm_prep_backward)(void *be, float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                              float *dB_bias, float *dC_bias, const float *dx, const float *dBh,
                              const float *dCh, const float *ddt, const float *dlam, const float *dA,
                              const float *B_bias, const float *C_bias, const float *lam, const float *A,
                              const float *rstd, const float *proj, const float *dt_bias,
                              const float *gB, const float *gC, int B, int T, int H, int P, int G,
                              int N, float eps, const float *ang);
    void (*ssm_gate_norm_forward)(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                  const float *w, int n, int E, int G, float eps);
    void (*ssm_gate_norm_backward)(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                   const float *z, int ldz, const float *w, const float *rstd,
                                   int n, int E, int G);
    /* One step of the scan for decoding (the recurrence, O(1) per token):
     * S (B,H,P,N), xprev (B,H,P), Bprev (B,H,N) are the state, in/out; x (B,H,P),
     * Bm, Cm (B,H,N), dt, lam (B,H) the new token. first != 0: the token is a
     * sequence's first (S and the beta term taken as 0). y (B,H,P) (=).
     * T steps equal ssm_scan_forward(chunk 0) over the T tokens. */
    void (*ssm_scan_step)(void *be, float *y, float *S, float *xprev, float *Bprev, const float *x,
                          const float *Bm, const float *Cm, const float *dt, const float *lam,
                          const float *A, const float *Dsk, int B, int H, int P, int N, int first);
    /* ---- cross-entropy forward and backward in one pass over the logits ----
     * losses, lse_out as xent_forward; logits is CONSUMED: on return it holds
     * xent_backward's dlogits for dscale (OVERWRITES). One exp per element
     * instead of two (the backward does not recompute softmax over V).
     * Optional (NULL: the model runs xent_forward then xent_backward). */
    void (*xent_fused)(void *be, float *losses, float *lse_out, float *logits, const int32_t *targets, float dscale,
                       int N, int V, float softcap);

    /* ---- fused elementwise chains (one pass, one parallel region each) ----
     * Same bits as the unfused ops they replace (named below).
     * rmsnorm_resid_forward: out, rstd = rmsnorm_forward(inp); resid = inp (=)
     *   (the residual stream's seed, which the branch's output GEMM then adds
     *   onto with beta 1: the norm and the residual share one read of inp).
     *   resid may alias inp. Its backward is rmsnorm_backward with accumulate
     *   1 onto the residual gradient (d inp = d resid + the norm's term).
     * qk_norm_rope_forward: q = rope(rmsnorm_hd(q_raw) * wq) over rows N*H,
     *   k likewise over N*K, positions pos0 + n % T: exactly rmsnorm_forward
     *   (rows N*H, C = hd) then rope_forward in place, for q and for k.
     * qk_norm_rope_backward: dq, dk in: d q, d k (after RoPE); out: R^T of
     *   them (OVERWRITTEN: the gradients of the normed heads); dq_raw, dk_raw
     *   (=), dwq, dwk (+=; either may be NULL: a frozen gain, dx only): exactly
     *   rope_backward in place then rmsnorm_backward(accumulate 0), for q and
     *   for k (training: pos0 = 0). */
    void (*rmsnorm_resid_forward)(void *be, float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                  int N, int C, float eps);
    void (*qk_norm_rope_forward)(void *be, float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                 const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                 const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps);
    void (*qk_norm_rope_backward)(void *be, float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                  float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                  const float *wk, const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                  const float *sin_tab, int N, int T, int H, int K, int hd);

    /* ---- bf16 activation twins (precision=bf16, docs/cuda.md "bf16 activations") ----
     * The op above of the same name with the same fp32 outputs (same bits),
     * that also writes out_bf16 = bf16(out) (nearest even) from the same
     * kernel: the block's GEMM operands, so no GEMM converts them per call.
     * Optional (NULL: the model leaves the twin out and the GEMMs round out).
     * swiglu_forward_bf16: out may be NULL: only the twin is written (the
     * same bf16 bits), for a caller whose GEMMs read the twin alone (the
     * dense MLP's down projection: 4 bytes a hidden unit not stored).
     * rmsnorm_resid_forward_bf16 likewise (rstd and resid still written):
     * the block input norm whose GEMMs all read the twin (4 bytes a row
     * element not stored). */
    void (*rmsnorm_resid_forward_bf16)(void *be, float *out, mt_bf16 *out_bf16, float *rstd, float *resid, const float *inp,
                                       const float *weight, int N, int C, float eps);
    void (*swiglu_forward_bf16)(void *be, float *out, mt_bf16 *out_bf16, const float *gate, const float *up, size_t n);
    /* qk_norm_rope_forward_bf16: qk_norm_rope_forward with q, k stored ONLY as
     * bf16 (qb, kb = bf16 of that op's fp32 outputs, nearest even), rstd_q,
     * rstd_k as there: the attention's operands straight into the caller's
     * qkv_b (attention_forward_bf16 with q, k NULL); 10 bytes an element of q
     * and k not moved (the fp32 store, the attention's read of it). */
    void (*qk_norm_rope_forward_bf16)(void *be, mt_bf16 *qb, mt_bf16 *kb, float *rstd_q, float *rstd_k,
                                      const float *q_raw, const float *k_raw, const float *wq, const float *wk,
                                      const float *cos_tab, const float *sin_tab, int N, int T, int pos0, int H, int K,
                                      int hd, float eps, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b);
    /* qk_norm_rope_backward_bf16: qk_norm_rope_backward with d q_raw, d k_raw
     * stored ONLY as bf16 (dq_raw_b, dk_raw_b = bf16 of that op's fp32
     * outputs, nearest even: its bits then cast_bf16), dwq, dwk as there (+=);
     * dq, dk (in) are scratch: their contents afterwards are unspecified (the
     * rotated g need not be stored). For the q/k projections' backward whose
     * GEMMs read dy as bf16 (no adapters on q, k): 12 bytes an element not
     * moved (the fp32 store, g's store, the cast's read and write).
     * dq_b, dk_b: NULL, or the incoming gradient as bf16 (the attention
     * backward's dq_b, dk_b), read widened (exact) in place of dq, dk, which
     * stay scratch (a backend may widen into them); both or neither.
     * ld_dq_raw, ld_dk_raw: the row strides of dq_raw_b, dk_raw_b in elements
     * (a row: one token's H hd, K hd values; 0 means dense rows; else at least
     * that, and the elements between rows are not written): d q', d k' into one
     * (N, H hd + 2 K hd) operand beside dv (attention_backward_bf16's ldv_b). */
    void (*qk_norm_rope_backward_bf16)(void *be, mt_bf16 *dq_raw_b, mt_bf16 *dk_raw_b, float *dwq, float *dwk,
                                       float *dq, float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                       const float *wk, const float *rstd_q, const float *rstd_k,
                                       const float *cos_tab, const float *sin_tab, int N, int T, int H, int K, int hd,
                                       const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b, const mt_bf16 *dq_b,
                                       const mt_bf16 *dk_b, int ld_dq_raw, int ld_dk_raw);
    /* (both bf16 entries) q_raw_b, k_raw_b: NULL, or q_raw, k_raw stored as
     * bf16 (their GEMMs' bf16 outputs: autocast's rounding of a Linear's
     * output), read widened (exact) in place of q_raw, k_raw (then ignored,
     * may be NULL); both or neither. 4 bytes an element of q', k' not moved
     * forward (the fp32 store, the read), 2 backward. */
    /* rmsnorm_backward_bf16: rmsnorm_backward (same dinp, same dweight, the
     * same bits) that also writes dinp_b = bf16 of the final dinp (after
     * the accumulation; nearest even) from the same pass: a block input
     * norm's backward gives the residual gradient's twin to the next piece,
     * whose GEMMs would round it (struct mt_dyb in model_impl.h). Optional
     * (NULL: the readers round dinp themselves).
     * dinp_b may be NULL (no twin: dinp alone).
     * dout_b: NULL, or dout stored as bf16 (the dX GEMM's bf16 output:
     * autocast's rounding of a Linear's input gradient), read widened (exact)
     * in place of dout (then ignored, may be NULL): the same bits as dout =
     * widen(dout_b). 4 bytes an element of d h not moved (2 written by the
     * GEMM, 2 read here). */
    void (*rmsnorm_backward_bf16)(void *be, float *dinp, mt_bf16 *dinp_b, float *dweight, const float *dout,
                                  const float *inp, const float *weight, const float *rstd, int N, int C,
                                  int accumulate, const mt_bf16 *dout_b);
    /* swiglu_backward_bf16: dgate_b = bf16(dg), dup_b = bf16(du) (nearest
     * even; =), where dg, du are exactly the values swiglu_backward computes
     * from the same dout, gate, up (its bits, element by element), and no
     * fp32 output at all: for a caller whose only readers of dg, du are
     * bf16 GEMMs (precision=bf16 without adapters), which then see the bits
     * they saw after swiglu_backward + cast_bf16. The outputs must not
     * overlap the inputs nor each other (no in-place form). Optional (NULL:
     * the model runs swiglu_backward and rounds). */
    void (*swiglu_backward_bf16)(void *be, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout, const float *gate,
                                 const float *up, size_t n);
    /* swiglu_backward_act_bf16: swiglu_forward_bf16's twin and
     * swiglu_backward_bf16's two outputs from ONE read of gate, up (and
     * dout): act_b = bf16(silu(g) * u), exactly the bits swiglu_forward_bf16
     * writes for its twin, and dgate_b, dup_b exactly swiglu_backward_bf16's
     * (all =, nearest even). For a caller that recomputes act in backward
     * only for its bf16 twin (the down projection's dW) and then needs dg,
     * du in bf16: 8 bytes a hidden unit (g, u in fp32) read once instead of
     * twice. The three outputs must not overlap the inputs nor each other.
     * Optional (NULL: the model runs the two entries). */
    void (*swiglu_backward_act_bf16)(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                     const float *gate, const float *up, size_t n);
    /* swiglu_forward_bf16 (out NULL: the twin only) and swiglu_backward_act_bf16
     * with gate and up STORED bf16 (gemm_bf16_out's outputs): the same
     * expressions on the widened (exact) values. Optional (NULL: the model
     * keeps gate and up in fp32). */
    void (*swiglu_forward_bf16_gu)(void *be, mt_bf16 *out_bf16, const mt_bf16 *gate, const mt_bf16 *up, size_t n);
    void (*swiglu_backward_act_bf16_gu)(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                        const mt_bf16 *gate, const mt_bf16 *up, size_t n);
    /* swiglu_backward_act_bf16_gu with dout stored bf16 too (the down
     * projection's backward GEMM with a bf16 output: autocast's rounding of
     * d act; 4 bytes a hidden unit not moved): the same expressions on the
     * widened values. Optional (NULL: the model keeps d act in fp32).
     * F, ldo: ldo 0, dgate_b and dup_b dense like the inputs; else their rows
     * of F elements (F divides n) lie ldo apart (ldo >= F; the elements
     * between rows not written): d gate beside d up in one (rows, 2 F) operand,
     * the gate and up projections' merged backward GEMMs (mlp.c). */
    void (*swiglu_backward_act_bf16_gud)(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                         const mt_bf16 *dout, const mt_bf16 *gate, const mt_bf16 *up, size_t n,
                                         size_t F, size_t ldo);
    /* dst[i] = (float)src[i] (exact: every bf16 value is an fp32 value): the
     * way back of a bf16 gradient reduction (grad_reduce_dtype=bf16). NULL:
     * the backend refuses grad_reduce_dtype=bf16. */
    void (*widen_bf16)(void *be, float *dst, const mt_bf16 *src, size_t n);

    /* ---- attention in bf16 (precision=bf16; docs/cuda.md "Attention on tensor cores") ----
     * attention_forward/backward's contract for training shapes (Tq == Tk == T,
     * q_pos0 = 0) with bf16 operands and fp32 accumulation, rounded (nearest
     * even) at these points only: q, k, v, dout on entry; p_ij = exp(s_ij -
     * lse_i) (normalised, fp32) before P V and P^T dout; ds_ij = scale p_ij
     * (dp_ij - D_i) before dS k and dS^T q. s, lse, dp, D and every output
     * are fp32. out_bf16 (may be NULL) = bf16(out): the Wo GEMM's operand.
     * dq, dk, dv OVERWRITE. Optional (NULL: the model runs the fp32 entries).
     * cpu: the reference of the mode (same rounding points); cuda: wmma
     * tensor-core tiles (attention_tc.cu).
     * qkv_b: NULL, or the caller's room for bf16(q), bf16(k), bf16(v) in that
     * order ((B T H hd + 2 B T K hd) bf16, contiguous), saved between the two
     * calls: the forward leaves the rounded operands there and the backward
     * given the same buffer (q, k, v unchanged since) reads them instead of
     * rounding q, k, v again (cuda: 6 bytes an element of the backward's
     * staging). The same bits either way; a backend may ignore it (cpu).
     * dv_b (backward): NULL, or where dv goes as bf16 ONLY (bf16 of the fp32
     * dv, nearest even; dv is scratch then, its contents unspecified): for a
     * v projection whose bf16 GEMMs are dv's only readers (8 bytes an element
     * of dv not moved: the fp32 store, the cast's read). Must not overlap dv.
     * ldv_b: dv_b's row stride in elements (a row: one token's K hd values;
     * 0 means K hd, dense rows; else >= K hd, and the elements between rows
     * are not written): dv beside d q', d k' in one (B T, H hd + 2 K hd)
     * operand, the q/k/v projections' merged backward GEMMs (attention.c).
     * q, k, v NULL (either entry; with qkv_b): that operand is already in
     * qkv_b, rounded by its producer (qk_norm_rope_forward_bf16, a v GEMM
     * with a bf16 output): the entries read it there (the same values the
     * rounding of the fp32 operand would give, so the same bits).
     * out NULL (forward): only out_bf16 is stored (its readers take bf16).
     * D_i = dout_i . out_i (backward) is summed in fp32 over bf16(dout) and
     * bf16(out), the operands the products see (FlashAttention-2's D).
     * dout_b, out_b (backward): NULL, or dout / out as bf16 (their producers
     * rounded them: o_proj's backward GEMM with a bf16 output, the forward's
     * out_bf16); the fp32 array is then not read and may be NULL. The same
     * values either way, so the same bits.
     * dq_b, dk_b (backward): NULL, or where dq / dk go as bf16 ONLY, as dv_b
     * for dv (dq / dk scratch then; must not overlap them): for the QK-norm
     * backward that reads them (qk_norm_rope_backward_bf16's dq_b, dk_b; 4
     * bytes an element of q and k not moved). Both or neither. */
    void (*attention_forward_bf16)(void *be, float *out, mt_bf16 *out_bf16, float *lse, const float *q,
                                   const float *k, const float *v, int B, int T, int H, int K, int hd,
                                   mt_bf16 *qkv_b);
    void (*attention_backward_bf16)(void *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse,
                                    int B, int T, int H, int K, int hd, const mt_bf16 *qkv_b, mt_bf16 *dv_b,
                                    const mt_bf16 *dout_b, const mt_bf16 *out_b, mt_bf16 *dq_b, mt_bf16 *dk_b,
                                    int ldv_b);
    /* ---- the Mamba-3 scan in bf16 (precision=bf16; docs/cuda.md "The Mamba-3
     * scan on tensor cores") ----
     * ssm_scan_forward/backward's contract with the chunked form's
     * intra-chunk products on bf16 operands and fp32 accumulation, rounded
     * (nearest even) at these points only: x, B, C, dy and the chunk states
     * S_in, dS_out as the pass between chunks writes them (every reader
     * takes them so: the products, and the scalar gradients' <dS_out, S_in>
     * term; mamba_ssm's state passing stores them in the input's dtype too);
     * v_j B_j in a chunk's own state Xc^T diag(v) Bc, e_i dy_i in dS_out's local term (e dY)^T C; M = (C
     * Bc^T) o L before M Xc; M and dG = (dY Xc^T) o L before M^T dY, dG^T C,
     * dG Bc. Decays, weights, the states' passes between chunks (their
     * running sums), the scalar gradients and every output are fp32.
     * chunk <= 0, or a shape the backend does not take, runs the fp32
     * entries (cuda counts it: ssm_scan_tc_fallbacks). Optional (NULL: the
     * model runs the fp32 entries; the cpu has none: its scan stays fp32 in
     * precision=bf16). cuda: ssd_tc.cu.
     * states: NULL, or mt_ssm_states_floats(B, T, H, P, N, chunk) floats, the
     * chunk states S_in (B, H, nc, P, N) as bf16: the forward leaves them there and the
     * backward of the same inputs reads them instead of recomputing them (the
     * same kernels' values: the same bits either way). Where the chunked
     * products do not run (the fp32 fallback) they are neither written nor
     * read.
     * ldx: the row stride (floats) of x and dx, H P for (B,T,H,P) arrays; more
     * lets them live in the mixer's proj / dproj rows (ldx = W: xs's columns,
     * no copy either way). Only where the chunked products run: the shapes
     * with mt_ssm_states_floats > 0; elsewhere ldx != H P is refused (cuda:
     * MT_ERR_UNSUPPORTED, nothing written).
     * dx_b (backward): NULL, or dx is written there as bf16 (nearest even, of
     * the fp32 dx; row stride ldx) and dx is not written (may be NULL): the
     * mixer's dproj as the in-projection backward's operand. The same shapes
     * only; elsewhere refused like ldx.
     * dB_b, dC_b (backward): NULL, or dBm, dCm are written there as bf16
     * ((B,T,H,N), each the fp32 value rounded once, nearest even, the row a
     * chunk edge joins after its sum) and dBm, dCm are not written (may be
     * NULL): for ssm_prep_backward_bf16's dBh_b, dCh_b (half the bytes each
     * way; autocast's rounding of a product's output). The same shapes only;
     * elsewhere refused like ldx.
     * Bh_b, Ch_b (both): NULL, or Bm, Cm's bf16 twins (bf16(Bm), bf16(Cm)
     * exactly: ssm_prep_forward's Bh_b, Ch_b), read where a product stages Bm
     * or Cm as its operand (half the bytes; the same operand values, so the
     * same bits). Where the chunked products run, B and C enter every term
     * as bf16(B), bf16(C): a chunk's own state v_j bf16(B_j) and the row
     * sums qj, inter too (from the twins, or rounded where read: the same
     * bits), so with Bh_b, Ch_b there Bm, Cm may be NULL (elsewhere refused
     * like ldx).
     * dy_b (backward): NULL, or dy's bf16 twin (bf16(dy) exactly:
     * ssm_gate_norm_backward_bf16's dy_b), read where a product stages dy as
     * its operand (half the bytes, the same bits); dy is still read where it
     * enters fp32 terms (D dy, dD, the scaled e_i dy_i). Where the chunked
     * products run on tensor cores dy may be NULL with dy_b: dy stored bf16
     * only (the gated norm's backward given dy NULL), every read widening the
     * twin, those terms too (e_i dy_i: bf16(e_i bf16(dy_i))); elsewhere dy
     * NULL is refused (MT_ERR_UNSUPPORTED, nothing written). */
    /* y_b (forward): NULL, or where y goes as bf16 ONLY (each value the fp32 y
     * rounded once, nearest even; y is not written and may be NULL): for a
     * gated norm that reads it so (ssm_gate_norm_*_bf16's y_b; autocast's
     * rounding of the scan's output). Only where the chunked products run on
     * tensor cores (elsewhere MT_ERR_UNSUPPORTED, nothing written).
     * x_b, ldx_b (both): NULL, or x as STORED bf16 (rows ldx_b >= H P apart;
     * x is then NULL: exactly one of them), e.g. the in-projection's x block
     * written by a bf16-output GEMM (autocast's rounding of a Linear's
     * output): every read of x widens it, the products' staging (the same
     * operand values as staging bf16(x)) and the fp32 terms (D x in y, dD's
     * dy . x) alike. Only where the chunked products run on tensor cores
     * (elsewhere MT_ERR_UNSUPPORTED, nothing written). */
    void (*ssm_scan_forward_bf16)(void *be, float *y, const float *x, int ldx, const float *Bm, const float *Cm,
                                  const float *dt, const float *lam, const float *A, const float *Dsk,
                                  int B, int T, int H, int P, int N, int chunk, float *states,
                                  const mt_bf16 *Bh_b, const mt_bf16 *Ch_b, mt_bf16 *y_b, const mt_bf16 *x_b,
                                  int ldx_b);
    void (*ssm_scan_backward_bf16)(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                                   float *dA, float *dDsk, const float *dy, const float *x, int ldx,
                                   const float *Bm, const float *Cm, const float *dt, const float *lam,
                                   const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                                   int chunk, const float *states, mt_bf16 *dx_b, const mt_bf16 *Bh_b,
                                   const mt_bf16 *Ch_b, const mt_bf16 *dy_b, const mt_bf16 *x_b, int ldx_b,
                                   mt_bf16 *dB_b, mt_bf16 *dC_b);

    /* ---- MoE device routing (issue 28 item 2; docs/cuda.md "MoE on the device") ----
     * The routing that followed router_forward on the host, as kernels, so
     * that the routed slots, the loss statistics and the aux/z gradients
     * never leave the device. Same numbers as the host code they replace
     * (the cpu twins bit for bit; cuda: the same integers, the double sums
     * in a fixed tree order). Rows i in [0, N) are global rows g0 + i of a
     * microbatch of B sequences of T rows (g0 = 0 on one rank; TP: the
     * rank's first row), row i's sequence q = (g0 + i) / T < B.
     *
     * moe_route: the STABLE counting sort of the M = N*k slots s = n*k + j
     *   by expert e = topk_idx[s] (all =):
     *     e_off (E+1) int32: exclusive scan of the per-expert slot counts
     *       (e_off[0] = 0, e_off[E] = M; count of e = e_off[e+1] - e_off[e]);
     *     pos (M): pos[s] = e_off[e] + #{s' < s : topk_idx[s'] = e};
     *     src_row (M): src_row[pos[s]] = n.
     *   The last n_null of the E experts are null (SPEC 1e; 0 = none): they
     *   sort last and are counted in e_off like the others, but their slots
     *   get pos[s] = -1 and their rows [e_off[E - n_null], M) of src_row are
     *   not written (no data moves for them).
     *   One answer: every backend writes the same integers. work: int32
     *   scratch of mt_moe_route_work(M, E) elements (cuda: per-chunk counts;
     *   cpu: its first E, the running row of each expert). No atomics: per (chunk, expert) counts,
     *   a scan, per (chunk, expert) placement.
     * moe_seq_stats: seq (2, B, E) double (=): seq[0][q][e] = number of the
     *   slots of q's rows routed to e, seq[1][q][e] = sum over q's rows of
     *   probs[i][e]; rows in order (cpu), a fixed tree (cuda); sequences
     *   with no rows here are 0 (TP: the model group all-reduces seq).
     * moe_aux_loss: from seq (after any all-reduce), f_share (B, E) float
     *   (=): f = float(cnt / (T k)); loss (2) double (=):
     *     loss[0] = count_aux ? sum_q aux_coef E sum_e f[q,e] psum[q,e] / T : 0
     *     loss[1] = z_coef sum_i lse_i^2 over the N rows.
     * moe_aux_backward (all =): dprobs (N, E) = float(aux_coef E f[q,e] / T / n_seq),
     *   dlse (N) = float(2 z_coef lse_i / n_tok) (the router_backward inputs). */
    /* moe_count_acc: load[e] += sign (offs[e+1] - offs[e]) for e in [0, n):
     * the layer's routed slots per expert (moe_route's offsets) added into the
     * backend's histogram (double) that the trainer reads once a step (sign -1:
     * a recompute takes its routing back out). Required with the routing
     * entries (an MoE layer calls it whatever the expert sizes' path). */
    void (*moe_count_acc)(void *be, double *load, const int32_t *offs, int n, double sign);
    void (*moe_route)(void *be, int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work,
                      const int32_t *topk_idx, int N, int k, int E, int n_null);
    void (*moe_seq_stats)(void *be, double *seq, const float *probs, const int32_t *topk_idx, int N, int E, int k,
                          int B, int T, int g0);
    void (*moe_aux_loss)(void *be, double *loss, float *f_share, const double *seq, const float *lse, int N, int B,
                         int E, int k, int T, float aux_coef, float z_coef, int count_aux);
    void (*moe_aux_backward)(void *be, float *dprobs, float *dlse, const float *f_share, const float *lse, int N,
                             int E, int T, int g0, float aux_coef, float z_coef, double n_seq, double n_tok);

    /* ---- step marks for the per-op profile and device counters (optional) ----
     * The trainer calls profile_step(be, 0) as a step begins and
     * profile_step(be, 1) after the step's final sync(), with the profile
     * still enabled: a backend that times ops asynchronously (cuda: event
     * pairs) adds the step's op times to the profile there
     * (mt_ops_profile_add), once per step, and closes the step's counters.
     * NULL (cpu): the wrappers time each call on the host as it runs. */
    void (*profile_step)(void *be, int end);

    /* ---- lm head: the bf16 twin of dlogits (issue 27 item 3; docs/cuda.md "Cross-entropy") ----
     * xent_fused that also writes dlogits_bf16 (N, V) = bf16(dlogits), round
     * to nearest even (mt_cpu_f32_to_bf16 / mt_cuda_bf16_rn), from the same
     * pass: the backward GEMMs of the lm head (dW += dz^T h, dh = dz W) read
     * it as their bf16 operand instead of rounding the fp32 dlogits per call.
     * losses, lse_out and the twin are exactly xent_fused's (its fp32 dlogits,
     * then rounded); logits is CONSUMED and its contents on return are
     * UNSPECIFIED (cpu: xent_fused's fp32 dlogits; cuda: not written, a
     * store of 4 bytes per element saved). Optional (NULL: xent_fused, and
     * the GEMMs round per call). */
    void (*xent_fused_bf16)(void *be, float *losses, float *lse_out, float *logits, mt_bf16 *dlogits_bf16,
                            const int32_t *targets, float dscale, int N, int V, float softcap);
    /* xent_fused_bf16 on bf16 logits (the lm head's GEMM with a bf16 output,
     * as autocast stores a Linear's output): reads logits_b (N, V), writes
     * losses, lse_out and, IN PLACE over logits_b, the bf16 twin of dlogits.
     * The same numbers as widening logits_b to fp32 and calling
     * xent_fused_bf16 (bit for bit on each backend); no fp32 logits exist
     * (the head's traffic per element: GEMM 2 bytes written, then 2 read and
     * 2 written, against 4 + 4 + 2). Optional (NULL: fp32 logits). */
    void (*xent_fused_bf16_logits)(void *be, float *losses, float *lse_out, mt_bf16 *logits_b,
                                   const int32_t *targets, float dscale, int N, int V, float softcap);

    /* ---- step synchronisation: multi-tensor reductions and updates (issue 27 item 3;
     * docs/cuda.md "Host waits in the step") ----
     * Each is the loop over the single-tensor entry it names, in index
     * order, with the same numbers (cpu: that loop, bit for bit), in fewer
     * launches and host waits. x, n, p, g, m, v, wd are HOST arrays of count
     * entries (cuda passes them to the kernels as launch arguments in chunks
     * of MT_OPS_LIST_MAX: nothing copied, nothing allocated); the tensors are
     * backend buffers. Optional (NULL: callers loop over the single entry).
     *
     * sumsq_multi: s = 0.0; for i in order: s += sumsq(x[i], n[i]); return s
     *   on the host (one host wait on cuda, not one per tensor). n[i] may be 0
     *   (adds +0.0: the same s as leaving the tensor out).
     * normalize_fro: x = (float)(1 / (sqrt(sumsq(x, n)) + eps)) * x (the
     *   scalar in double, rounded once, then one fp32 multiply per element:
     *   axpby(x, NULL, 0, that scalar, n)); the norm never leaves the device.
     * adamw_multi: adamw_update(p[i], g[i], m[i], v[i], n[i], lr, b1, b2, eps,
     *   wd[i], bc1, bc2) for every i (the tensors must not overlap), with each
     *   g[i] element read as gscale * g (one fp32 multiply: the value that
     *   axpby(g, NULL, 0, gscale) would store; g itself is not written; gscale
     *   1: g as is). The gradient clip's scale rides here instead of a
     *   separate read and write of every gradient (optim.c). pb may be NULL
     *   (no shadows), else pb[i] (NULL: none for tensor i) receives
     *   cast_bf16(p[i] after its update, n[i]): the same bits (nearest even),
     *   from the value the update has in hand, so precision=bf16's shadow of
     *   p[i] is fresh without a second read of p (adamw.c; pb[i] must not
     *   overlap any tensor of the call).
     * (cast_bf16_multi: below, with its entry.)
     * nonfinite_mark: flags[slot[i]] = NaN for every i with all_finite(x[i],
     *   n[i]) == 0; every other flag untouched (marks accumulate until the
     *   caller zeroes flags, a backend buffer). No host wait: the trainer adds
     *   sumsq(flags) (+0.0 when clean, NaN otherwise) to the gradient norm and
     *   reads the flags only when that norm is not finite. */
    double (*sumsq_multi)(void *be, const float *const *x, const size_t *n, int count);
    void   (*normalize_fro)(void *be, float *x, size_t n, double eps);
    /* normalize_fro_bf16: dst = bf16(normalize_fro's value of x), x untouched:
     *   the same scalar and fp32 multiply, then cast_bf16's rounding, in one
     *   pass that stores no fp32 (Muon's X0 into its bf16 batch). Optional,
     *   as gemm_bf16_batched. */
    void   (*normalize_fro_bf16)(void *be, mt_bf16 *dst, const float *x, size_t n, double eps);
    /* axpby_from_bf16: y = a x + b y with x bf16 (axpby's expression on the
     *   widened x, y not read when b = 0: the bits of widen_bf16 then axpby,
     *   without the fp32 copy; Muon's update from its bf16 result). Optional,
     *   as gemm_bf16_batched. */
    void   (*axpby_from_bf16)(void *be, float *y, const mt_bf16 *x, float a, float b, size_t n);
    /* muon_prep_bf16_multi: for every i in order, muon_momentum(d, m[i], g[i],
     *   mu, n[i], gscale) and then normalize_fro_bf16(x[i], d, n[i], eps), d
     *   a caller's scratch of max n[i] floats (its contents after the call
     *   unspecified): m[i] and x[i] (Muon's bf16 X0) get the bits of that
     *   loop (cpu: the loop), on cuda in three launches per MT_OPS_LIST_MAX
     *   matrices instead of four per matrix (the momentum runs inside the
     *   norm's first pass and d is recomputed from m and g as it is rounded:
     *   d not touched). The tensors must not overlap. Optional (NULL: muon.c
     *   loops). */
    void   (*muon_prep_bf16_multi)(void *be, mt_bf16 *const *x, float *const *m, const float *const *g,
                                   const size_t *n, int count, float mu, float gscale, double eps, float *d);
    /* axpby_from_bf16_multi: axpby_from_bf16(y[i], x[i], a[i], b[i], n[i])
     *   for every i (no y[i] overlaps another tensor of the call), the same
     *   bits, one launch per MT_OPS_LIST_MAX tensors (Muon's updates of a
     *   batch). Optional (NULL: muon.c loops). */
    void   (*axpby_from_bf16_multi)(void *be, float *const *y, const mt_bf16 *const *x, const float *a,
                                    const float *b, const size_t *n, int count);
    void   (*adamw_multi)(void *be, float *const *p, mt_bf16 *const *pb, const float *const *g, float *const *m,
                          float *const *v, const size_t *n, const float *wd, int count, float lr, float b1, float b2,
                          float eps, float bc1, float bc2, float gscale);
    void   (*nonfinite_mark)(void *be, float *flags, const float *const *x, const size_t *n, const int *slot, int count);
    /* cast_bf16_multi: cast_bf16(dst[i], src[i], n[i]) for every i (the
     * tensors must not overlap), the same bits: precision=bf16's shadow
     * refresh, one launch per unit on cuda instead of one per matrix. */
    void   (*cast_bf16_multi)(void *be, mt_bf16 *const *dst, const float *const *src, const size_t *n, int count);
    /* init_normal: a parameter's owned box (rows x cols, row-major) with its
     *   normal init, the host's bits (model.c init_value): out[i cols + j] =
     *   (float)(std * mt_rng_normal(seed, stream, (off0 + i) shape1 + off1 + j))
     *   (mt_rng.h), without staging the box through host memory. Outside the
     *   step loop (it reads a count back). Optional (NULL: the host fills it). */
    void   (*init_normal)(void *be, float *out, size_t rows, size_t cols, int64_t off0, int64_t off1, int64_t shape1,
                          uint64_t seed, uint64_t stream, float std);

    /* ---- backend facts (issue 30 item 6; docs/architecture.md "The backend behind the table") ----
     * What code outside src/ops learns about a backend, asked of its table:
     * nothing there compares the table's name or includes a backend's own
     * header, so a build without CUDA compiles the same callers. A NULL
     * entry means "absent on this backend" (the cpu table fills no device
     * entry); callers report the absence, they never guess.
     *
     * host_memory: 1 when buf_alloc's buffers are host memory and the
     *   kernels run on the host's cores (cpu): a caller may fill a buffer in
     *   place instead of staging it through copy_from_host, and the ranks of
     *   a node share those cores. 0: a device's memory and cores (cuda).
     * status: MT_OK while no kernel, copy or library call of the instance
     *   has failed; otherwise the first failure's status and, in msg (may be
     *   NULL), "file:line: call: reason (+N more)" (the entries return void
     *   and keep a sticky error; call sync() first). NULL: entries cannot fail.
     * device_info: *info = the device and its libraries for the receipt,
     *   memory figures as of this call. MT_ERR_UNSUPPORTED without a live
     *   instance. NULL: no device (cpu).
     * step_counters: what each step asked of the device, between the step
     *   marks (profile_step): *n_steps = steps closed so far and the first
     *   min(*n_steps, MT_OPS_STEP_LOG) per-step deltas (valid while the
     *   instance lives). NULL: nothing counted.
     * queue: the native queue every entry runs on in call order (cuda: its
     *   cudaStream_t as void *), for collectives that read the table's
     *   buffers (they enqueue there: no extra synchronisation). NULL: host.
     * gemm_precision: the element type the plain gemm entry computes its
     *   products in now (cuda: MT_CUDA_PRECISION or the knob cuda_precision,
     *   MT_ELEM_BF16 = every call rounds its fp32 operands). NULL: always fp32.
     * kernels_isa: the instruction set the kernels dispatched to at load
     *   ("avx512" / "avx2"). NULL: not a host ISA choice.
     * op_profile: 1 when the per-op profile (below) times this table's
     *   entries, 0 when its timing is switched off (cuda:
     *   MT_CUDA_OP_PROFILE=0); *how says how they are timed either way.
     *   NULL: the table has no per-op profile. */
    int host_memory;
    enum mt_status (*status)(void *be, char *msg, size_t msg_len);
    enum mt_status (*device_info)(void *be, struct mt_ops_device_info *info);
    const struct mt_ops_device_counters *(*step_counters)(void *be, int *n_steps);
    void *(*queue)(void *be);
    enum mt_elem (*gemm_precision)(void *be);
    const char *(*kernels_isa)(void *be);
    int (*op_profile)(void *be, const char **how);
    /* ---- CUDA graphs of the step (issue 27 item 4; docs/cuda.md "CUDA graphs") ----
     * graph_mode(be, on, why_not): the trainer says, before each step,
     * whether the step may run as graphs (one GPU, static shapes; the
     * cuda_graphs knob) and, when not, why (kept for the receipt). The
     * backend then captures the device work between the step's host waits
     * (between the profile_step marks) once and replays it; results are
     * bit-identical to eager (same kernels, same arguments; an argument that
     * changes per step keeps its segment eager). No-op when `on` is
     * unchanged. NULL (cpu): no graphs. */
    void   (*graph_mode)(void *be, int on, const char *why_not);
    /* graph_info(be, out): how the step's graphs went, for the receipt
     * (struct mt_ops_graph_info above). NULL (cpu): no graphs. */
    void   (*graph_info)(void *be, struct mt_ops_graph_info *out);

    /* ---- ReDo scores (SPEC 1e; docs/model.md "ReDo") ----
     * redo_score_acc: acc[j] += sum over i < rows of q(|act[i*F + j]|) for
     * j < F (act row-major (rows, F), acc int64 backend memory, +=), with the
     * fixed point q(x) = (int64)trunc(min(x, 2^16) * 2^24) (NaN: 2^40). Each
     * term depends on its element alone and integer sums are associative,
     * so every backend, thread split and mesh gives the same integers (the
     * exactness the recycling decision needs). Optional (NULL: redo_every
     * is refused on that backend). */
    void   (*redo_score_acc)(void *be, int64_t *acc, const float *act, size_t rows, int F);
    /* ---- Mixture-of-Depths routing (SPEC 1e; src/model/mod.c, docs/model.md) ----
     * r (N = B*T) float: the router's score per row, sequence b on rows
     * b*T .. b*T+T-1. Per sequence the C rows with the largest r are
     * selected, ties to the lower position: row b*T + t is selected iff
     *     #{t' : r[b,t'] > r[b,t] or (r[b,t'] == r[b,t] and t' < t)} < C
     * (a NaN compares as -inf; exact and order-free: every backend selects
     * the same rows). mod_route writes (all =):
     *     idx  (B*C) int32  the selected rows of sequence b at b*C + j, j-th in
     *                       increasing t: idx = b*T + t
     *     tpos (B*C) int32  their positions t (the RoPE row to read)
     *     slot (N)   int32  b*C + j on a selected row, -1 on the others
     *     s    (N)   float  sigmoid(r), every row
     *     loss (1)  double  coef * sum over the N rows of BCE(s, sel) =
     *                       coef * sum (sel ? softplus(-r) : softplus(r))
     *                       (loss NULL: not computed); rows in order (cpu),
     *                       a fixed tree (cuda)
     * mod_backward (the combine x_out = x + s (y - x) on the selected rows):
     *     dr (N) (=) = (slot >= 0 ? dgate s (1 - s) : 0) + aux_scale (s - sel)
     *     dx (N, D): the selected rows scaled by (1 - s) in place (=); the
     *                others unchanged
     * Optional (NULL: routed blocks are refused on that backend). */
    void   (*mod_route)(void *be, int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss,
                        const float *r, int B, int T, int C, float coef);
    void   (*mod_backward)(void *be, float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot,
                           int N, int D, float aux_scale);
    /* ---- the gated norm of the Mamba-3 mixer when its groups span ranks ----
     * (replicated B/C under TP, mamba_ngroups % tp != 0: docs/mamba3.md §10).
     * The rank holds channels [c0, c0 + E) of the global d_inner; groups are
     * cg channels wide, so local channel c is in local group
     * j = (c0 + c) / cg - c0 / cg, j < ng = (c0 + E - 1) / cg - c0 / cg + 1.
     * s points at the rank's first group's column of an (n, lds) table of
     * per-row group sums (the caller all-reduces it over the model group);
     * rstd (n, ng).
     * sums: s (=) per row and local group: dout NULL: sum (y silu z)^2 (the
     *   forward's); else sum dout w (y silu z) rstd (the backward's mean term).
     * forward_ext: rstd = 1/sqrt(s/cg + eps); out = (y silu z) rstd w   (=)
     * backward_ext: ssm_gate_norm_backward with the mean term s/cg: dy, dz
     *   (=), dw (+=). With c0 = 0, cg = E/G and the local sums, forward_ext
     *   and backward_ext are ssm_gate_norm_* up to fp32 rounding. */
    void   (*ssm_gate_norm_sums)(void *be, float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                                 const float *dout, const float *rstd, int n, int E, int c0, int cg);
    void   (*ssm_gate_norm_forward_ext)(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                        const float *w, const float *s, int lds, int n, int E, int c0, int cg,
                                        float eps);
    void   (*ssm_gate_norm_backward_ext)(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                         const float *z, int ldz, const float *w, const float *rstd, const float *s,
                                         int lds, int n, int E, int c0, int cg);
    /* precision=bf16: ssm_gate_norm_forward (the same out, the same rstd) that
     * also writes out_b = bf16(out) (nearest even), Wout's GEMM operand, from
     * the same pass; out NULL: not stored (its only reader was that operand's
     * rounding). Optional (NULL: the forward, then cast_bf16).
     * y_b (both bf16 gated-norm entries): NULL, or y stored as bf16 (the bf16
     * scan's y_b), read widened (exact) in place of y, which may be NULL.
     * zin_b (both): NULL, or z stored as bf16 at row stride ldz_b (the
     * in-projection's bf16 output of its z block: autocast's rounding of a
     * Linear's output), read widened (exact) in place of z, which may then be
     * NULL; ldz keeps naming the row stride of the backward's dz / dz_b. The
     * same bits as z = widen(z_b). */
    void   (*ssm_gate_norm_forward_bf16)(void *be, float *out, mt_bf16 *out_b, float *rstd, const float *y,
                                         const float *z, int ldz, const float *w, int n, int E, int G, float eps,
                                         const mt_bf16 *y_b, const mt_bf16 *zin_b, int ldz_b);
    /* precision=bf16, the mixer's dproj written as the in-projection backward's
     * bf16 operand by its producers (no fp32 dproj store and no cast pass):
     * ssm_gate_norm_backward with dz_b = bf16(dz) (row stride ldz) in place of
     * dz; ssm_prep_backward with dproj_b = bf16 of every column it writes (the
     * fp32 values, rounded once, nearest even), dproj then its scratch (fp32,
     * contents unspecified after). With ssm_scan_backward_bf16's dx_b, the
     * three fill all W columns of dproj_b with the bits cast_bf16 would give
     * the fp32 dproj. Optional (NULL: the fp32 entries, then cast_bf16).
     * The gated norm's dy_b: NULL, or dy also written there as bf16 (nearest
     * even), the scan backward's dy twin; with dy_b, dy may be NULL: written
     * as bf16 only (cuda: dy and dy_b both NULL is MT_ERR_INVALID_ARG).
     * Its dout_b: NULL, or dout stored bf16 (the out-projection's backward
     * GEMM with a bf16 output: autocast's rounding of the gradient), read
     * widened (exact) in place of dout, which may then be NULL.
     * The prep backward's dBh_b, dCh_b: NULL, or dBh, dCh stored bf16 (the
     * scan backward's dB_b, dC_b), read widened (exact) in place of dBh, dCh,
     * which may then be NULL (both or neither). */
    void   (*ssm_gate_norm_backward_bf16)(void *be, float *dy, mt_bf16 *dz_b, float *dw, const float *dout,
                                          const float *y, const float *z, int ldz, const float *w, const float *rstd,
                                          int n, int E, int G, mt_bf16 *dy_b, const mt_bf16 *y_b,
                                          const mt_bf16 *zin_b, int ldz_b, const mt_bf16 *dout_b);
    void   (*ssm_prep_backward_bf16)(void *be, mt_bf16 *dproj_b, float *dproj, float *ddt_bias, float *dA_log,
                                     float *dgB, float *dgC, float *dB_bias, float *dC_bias, const float *dx,
                                     const float *dBh, const float *dCh, const float *ddt, const float *dlam,
                                     const float *dA, const float *B_bias, const float *C_bias, const float *lam,
                                     const float *A, const float *rstd, const float *proj, const float *dt_bias,
                                     const float *gB, const float *gC, int B, int T, int H, int P, int G, int N,
                                     float eps, const float *ang, const mt_bf16 *dBh_b, const mt_bf16 *dCh_b);
};

/* Tensors per launch of the multi-tensor entries (their kernel-argument lists). */
#define MT_OPS_LIST_MAX 32

/* The chunk states the bf16 scan entries keep for their backward (their
 * states argument): the shapes whose chunked products run there (chunk,
 * headdim and d_state up to MT_SSM_STATES_MAX: cuda's tensor-core scan) keep
 * (B, H, nc, P, N) states, nc = ceil(T / min(chunk, T)), stored bf16 (since
 * the twenty-eighth session: the form every reader takes them in) in
 * mt_ssm_states_floats floats, half their count rounded up; others 0. A model
 * saves them with its activations: the backward then skips the states'
 * product and their sequential pass between chunks (ssd_states). */
#define MT_SSM_STATES_MAX 128
static inline size_t mt_ssm_states_count(int B, int T, int H, int P, int N, int chunk)
{
    if (chunk < 1 || T < 1 || chunk > MT_SSM_STATES_MAX || P > MT_SSM_STATES_MAX || N > MT_SSM_STATES_MAX) return 0;
    const int q = chunk < T ? chunk : T, nc = (T + q - 1) / q;
    return (size_t)B * (size_t)H * (size_t)nc * (size_t)P * (size_t)N;
}
static inline size_t mt_ssm_states_floats(int B, int T, int H, int P, int N, int chunk)
{
    return (mt_ssm_states_count(B, T, H, P, N, chunk) + 1) / 2;
}

/* gemm_grouped_rows / gemm_grouped_sum: at most this many groups a call
 * (the group pointers travel by value in the launch) */
#define MT_GROUPED_DEV_MAX 64
/* their shape rule: every dimension and leading dimension a multiple of 8 */
static inline int mt_grouped_dev_dims_ok(int a, int b, int c, int d)
{
    return a > 0 && b > 0 && c > 0 && d > 0 && a % 8 == 0 && b % 8 == 0 && c % 8 == 0 && d % 8 == 0;
}

/* moe_route's chunk of slots (one (chunk, expert) count per thread) and its
 * scratch size in int32 elements, for M slots over E experts. */
#define MT_MOE_ROUTE_CHUNK 256
static inline size_t mt_moe_route_work(size_t M, size_t E)
{
    return (M + MT_MOE_ROUTE_CHUNK - 1) / MT_MOE_ROUTE_CHUNK * E;
}

/* ReDo's fixed point (redo_score_acc): |x| clamped to 2^16, times 2^24,
 * truncated; NaN counts as the clamp. A step's sum per unit stays below
 * 2^63 while the unit's |activations| sum to less than 2^39. */
#define MT_REDO_FIX_SCALE 16777216.0   /* 2^24 */
#define MT_REDO_FIX_CLAMP 65536.0      /* 2^16 */
static inline int64_t mt_redo_fix(float x)
{
    double a = x < 0 ? -(double)x : (double)x;
    if (!(a <= MT_REDO_FIX_CLAMP)) a = MT_REDO_FIX_CLAMP;   /* NaN too */
    return (int64_t)(a * MT_REDO_FIX_SCALE);
}

/* Backends. mt_ops_cpu() never fails. mt_ops_cuda() returns NULL when the
 * build has no CUDA (MT_WITH_CUDA off) or no device is present; `why` then
 * says which. */
const struct mt_ops_i *mt_ops_cpu(void);
const struct mt_ops_i *mt_ops_cuda(char *why, size_t why_len);

/* The ops table of backend `name` ("cpu" or "cuda") for a command that runs
 * the model (train, logits): the one place outside a backend that knows the
 * names (src/ops/ops.c). cuda binds the node-local rank's GPU
 * (mt_ops_local_rank) and takes the default instance, its GEMM precision
 * from MT_CUDA_PRECISION or the knob cuda_precision when ctx's config or
 * command line set it. Errors: MT_ERR_INVALID_ARG "backend 'X' is unknown
 * (cpu or cuda)"; MT_ERR_UNSUPPORTED "backend 'cuda' is not available:
 * <why> (use backend=cpu)" for a build without CUDA or no device. */
enum mt_status mt_ops_by_name(struct mt_ctx *ctx, const char *name, const struct mt_ops_i **ops);
/* 1 when backend `name` is compiled into this binary (whether or not a
 * device is present): cpu always, cuda with MT_WITH_CUDA; 0 otherwise. For
 * the receipt's build identity (mt_build.h). */
int mt_ops_built(const char *name);
/* The node-local rank (which device this process drives): the launcher's
 * variable (Open MPI, MPICH/Hydra, Slurm, LOCAL_RANK), 0 when none is set. */
int mt_ops_local_rank(void);

/* Information about the cpu backend's BLAS for the receipt: library, the
 * core type in use (e.g. "SkylakeX"), threads, and how it was chosen. */
struct mt_ops_cpu_info {
    char blas[64];          /* "OpenBLAS 0.3.21 (openmp)" */
    char coretype[32];      /* openblas_get_corename() */
    char coretype_source[96]; /* "OPENBLAS_CORETYPE set by meshtrain (avx512 cpu)" / "user env" / "auto" */
    int  threads;
};
void mt_ops_cpu_info(struct mt_ops_cpu_info *info);
void mt_ops_cpu_set_threads(int n);

/* Call first thing in main(): OpenBLAS picks its kernels when it is loaded,
 * and Debian's build does not recognise recent AVX-512 cores (it falls back
 * to AVX2 kernels at half speed). If OPENBLAS_CORETYPE is unset and the CPU
 * has AVX-512, this sets it (and MT_CORETYPE_SOURCE) and re-execs the binary
 * so OpenBLAS loads with the right kernels. Returns when nothing needed to be
 * done or the re-exec failed. */
void mt_ops_cpu_pin_coretype(int argc, char **argv);

/* ---- per-op profile (cpu and cuda backends) ----
 * Every entry of the cpu table runs through a thin wrapper that, when the
 * profile is on, adds its wall time to the op's kind (one predictable branch
 * when off); the cuda table's wrappers record a cudaEvent pair around the
 * call instead and add the pairs' elapsed times at the step's end mark
 * (profile_step above). Kinds: gemm (gemm, transpose), attention (forward),
 * attention_bwd, xent, norm (rmsnorm and
 * the fused norm chains rmsnorm_resid, qk_norm_rope),
 * elementwise (rope, swiglu, embed, fill/axpby/sumsq/all_finite, MoE router,
 * permute/combine and the device routing), optimizer (adamw, muon momentum); communication is
 * not an op: the trainer adds its exposed communication time with
 * mt_ops_profile_add. Single-threaded callers only (the kernels are called
 * from one thread; their parallelism is inside). */
enum mt_op_kind {
    MT_OPK_GEMM, MT_OPK_ATTENTION, MT_OPK_XENT, MT_OPK_NORM, MT_OPK_ELEMENTWISE,
    MT_OPK_OPTIMIZER, MT_OPK_COMM, MT_OPK_SCAN, MT_OPK_ATTENTION_BWD, MT_OPK_COUNT
};
void        mt_ops_profile_enable(int on);
int         mt_ops_profile_enabled(void);
void        mt_ops_profile_reset(void);
void        mt_ops_profile_add(enum mt_op_kind kind, double seconds);
/* seconds[k] and calls[k] (either may be NULL) summed since the last reset */
void        mt_ops_profile_get(double seconds[MT_OPK_COUNT], long calls[MT_OPK_COUNT]);
const char *mt_ops_profile_kind_name(enum mt_op_kind kind);
/* While a scope is set (kind >= 0) every op counts under that kind, whatever
 * its table entry's: its time (mt_ops_profile_add) and, on cuda, its
 * launches in the launch log. The optimizer step sets MT_OPK_OPTIMIZER
 * (src/optim/optim.c): Muon's Newton–Schulz GEMMs, copies and passes are the
 * optimizer's, where the plan prices them. Returns the previous scope (-1:
 * none), for the caller to restore. */
int         mt_ops_profile_scope(int kind);
/* the kind an op whose entry is of kind `kind` counts under now */
enum mt_op_kind mt_ops_profile_kind(enum mt_op_kind kind);
/* The same time by table entry (the function that ran: "p_gemm" on cpu,
 * "mt_cuda_attention_backward_bf16" on cuda), up to MT_OPS_PROFILE_ENTRIES
 * names (later ones counted in the last slot, "(more)"): which kernel of a
 * kind the time went to. name must be a string that lives as long as the
 * process (a literal). */
#define MT_OPS_PROFILE_ENTRIES 192
void        mt_ops_profile_add_entry(const char *name, double seconds);
/* the entries since the last reset, in first-seen order; returns their count */
int         mt_ops_profile_entries(const char **names, double *seconds, long *calls, int cap);

/* ---- the startup sgemm roof (cpu backend) ----
 * Median FLOP/s of `reps` timed runs per size of square sgemms through `ops`
 * (after one untimed warm-up per size), over the sizes given; the best size's
 * median is the roof and lo/hi are that size's min/max run (the spread).
 * Private scratch (not in any ctx's accounting). Returns 0 on OOM. */
struct mt_ops_roof {
    double flops;        /* median of the best size */
    double lo, hi;       /* min and max run of that size */
    int    size, runs;   /* the size it came from, timed runs per size */
};
double mt_ops_measure_roof(const struct mt_ops_i *ops, const int *sizes, int n_sizes, int reps,
                           struct mt_ops_roof *out);

/* Instruction set the cpu kernels dispatched to at load ("avx512" or "avx2"). */
const char *mt_ops_cpu_isa(void);

/* Offset of entry `field` in the table is not NULL. */
#define mt_ops_supports(ops, field) ((ops)->field != NULL)

#endif /* MT_OPS_H */
