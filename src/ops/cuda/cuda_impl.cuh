/*
 * cuda_impl.cuh — internal header of the cuda backend (the .cu files of
 * src/ops/cuda): the backend state, the one vendor-status boundary, launch
 * helpers and the prototypes of every mt_cuda_* kernel entry.
 *
 * Every mt_cuda_* function implements the mt_ops_i entry of the same name
 * with exactly the contract written in src/ops/mt_ops.h; ops_cuda.cu puts
 * them in the table. They are extern "C" so the table (and a C caller) sees
 * plain C entry points; templates and kernels stay inside the .cu files.
 *
 * Process state. The backend's state is an instance, `struct
 * mt_cuda_backend` (the stream every op is queued on, the cuBLAS and
 * cuBLASLt handles, the GEMM precision (fp32 or bf16) and the cached
 * cuBLASLt plans, fixed reduction scratch, a grow-only workspace, the
 * counters and the sticky error, and the table that hands it out as `be`).
 * mt_ops_cuda() makes the default one; mt_ops_cuda_create() makes more, each
 * independent. Every table entry receives its instance as `be` and binds it
 * first thing (MT_CUDA_BIND): that sets `mt_cuda_be`, a *thread-local*
 * "current instance" pointer, which the helpers below (sticky error,
 * workspace, MT_LAUNCH's stream, the plan cache) read. Why a bound pointer
 * rather than threading B through every helper: the helpers are called from
 * ~50 entries and their kernels' launch macros; the pointer is set on entry
 * from the argument, so no state outlives a call's choice of instance, and
 * thread-local so two host threads driving two instances do not race
 * (docs/cuda.md, "The backend handle"). Calls from outside the table
 * (mt_ops_cuda_status(), _get_info(), ...) bind the instance they are given
 * (or the default one) the same way.
 *
 * Errors. Kernels return void (mt_ops.h). Every CUDA runtime / cuBLAS status
 * goes through MT_CUDA_CHECK_GEN (ggml's CUDA_CHECK_GEN) which turns a
 * failure into a *sticky* error: the first failure is kept (status and
 * "file:line: call: reason"), later ones are counted. Nothing aborts. The
 * error surfaces through mt_ops_cuda_status() (src/ops/cuda/mt_ops_cuda.h),
 * once on stderr at the next sync(), and by poisoning the host-visible
 * reductions: sumsq() returns NaN and all_finite() returns 0, so the
 * trainer's existing non-finite-gradient check stops the run instead of
 * training on garbage.
 *
 * Determinism: same inputs on the same GPU model -> same bits. No atomics on
 * floats anywhere: every reduction has a fixed tree/loop order that depends
 * only on the shapes (not on scheduling).
 *
 * Emulation: with MT_CUDA_EMU defined, these files compile as plain C++
 * against tests/cuda/emu (a CPU emulator of the few CUDA features used:
 * fibers for threads, __syncthreads, warp shuffles, a naive cuBLAS sgemm and
 * cuBLASLt bf16 matmul),
 * so the kernels can be checked on a machine without a GPU. Kernel launches
 * therefore go through MT_LAUNCH and dynamic shared memory through
 * MT_DYN_SMEM; nothing else differs.
 */
#ifndef MT_CUDA_IMPL_CUH
#define MT_CUDA_IMPL_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the core headers are plain C without extern "C" guards; the system headers
 * they pull in are included above, outside the C-linkage block */
extern "C" {
#include "../mt_ops.h"
}
#include "mt_ops_cuda.h"

/* ---- backend state (ops_cuda.cu) ---- */
#define MT_CUDA_RED_BLOCKS  1024   /* fixed partial count of sumsq: shape-only order */
#define MT_CUDA_LT_WS_BYTES ((size_t)32 << 20) /* cuBLASLt workspace: 32 MiB (NVIDIA's advice for Hopper) */
/* the runtime tunables (bf16_scratch_mb, attn_ds_mb, attn_kernel, grouped_gemm_bn,
 * attn_group_kib): their aliases, defaults and ranges are the knob table's
 * (src/core/knobs.c), read once at creation (ops_cuda.cu read_tunables) */
#define MT_CUDA_RED_THREADS 256

/* One cached cuBLASLt bf16 matmul (gemm.cu): the descriptors and the
 * algorithm the heuristic chose for one (transposes, sizes, leading
 * dimensions, C alignment, batch). Built on first use, reused after. The
 * cache is set-associative: a key's hash picks one of MT_CUDA_LT_SETS sets
 * of MT_CUDA_LT_WAYS plans (a lookup compares 4 keys, not all), evicted
 * round-robin within the set. 256 plans: a hybrid MoE step with Muon's
 * batches met 54 distinct ones at GPUSHAPE's shapes (the old 64-plan cache
 * was one model away from rebuilding plans, and querying heuristics, every
 * step). */
#define MT_CUDA_LT_SETS  64
#define MT_CUDA_LT_WAYS  4
#define MT_CUDA_LT_PLANS (MT_CUDA_LT_SETS * MT_CUDA_LT_WAYS)
struct mt_cuda_lt_plan {
    int                     used;
    int                     ta, tb, m, n, k, lda, ldb, ldc, align_c;  /* the key (row-major view) */
    int                     align_a, align_b; /* + operand alignments (256: packed scratch)   */
    int                     c_bf16;     /* + C = D stored bf16 (gemm_bf16_out), else fp32 */
    int                     batch;      /* + matrices a call (gemm_bf16_batched; 1: one)  */
    long long               sa, sb, sd; /* + their strides in elements (batch > 1)        */
    int                     ok;         /* 0: no algorithm: the tile falls back to sgemm */
    cublasLtMatmulDesc_t    desc;
    cublasLtMatrixLayout_t  la, lb, lc; /* cuBLASLt's A (= our B), B (= our A), C = D     */
    cublasLtMatmulAlgo_t    algo;
    size_t                  ws;         /* workspace the algorithm needs                  */
};

/* The algorithm of a shape class (gemm.cu, "Algorithm reuse"): transposes,
 * N exact, M and K rounded up to a power of two, the operand alignments.
 * A new shape of a known class takes the class's algorithm after
 * cublasLtMatmulAlgoCheck instead of a heuristic query. */
#define MT_CUDA_LT_ALGOS 64
#define MT_CUDA_KPROF_NAMES 160   /* distinct kernels the kernel profile labels (more: counted as "kernel:(more)") */
struct mt_cuda_lt_algo_slot {
    int                  used;
    int                  ta, tb, mb, n, kb, align_a, align_b, align_c, c_bf16, batch;
    cublasLtMatmulAlgo_t algo;
};

/* CUDA graphs (graph.cu, docs/cuda.md "CUDA graphs"): the step's segments
 * between host waits, by position in the step. */
#define MT_CUDA_GRAPH_SEGS 256
enum { MT_CUDA_SEG_NEW = 0, MT_CUDA_SEG_STATIC, MT_CUDA_SEG_DYNAMIC };
struct mt_cuda_graph_seg {
    int             state;     /* MT_CUDA_SEG_*                                      */
    int             n_ops;     /* device ops of its last eager or captured run        */
    int             sig_cap;
    uint64_t       *sig;       /* (n_ops) each op's signature (kernel, geometry, arguments) */
    const char    **name;      /* (n_ops) each op's name, for the mismatch message    */
    cudaGraphExec_t exec;      /* STATIC: the instantiated capture                    */
    long            nodes;     /* nodes of the captured graph                          */
};
struct mt_cuda_graphs {
    int   want;                /* graph_mode(be, 1): graphs wherever the step allows  */
    int   active;              /* inside a step mark with want set                    */
    int   step;                /* steps run with want set (0: eager, recording)        */
    int   seg, open, mode;     /* the current segment: index, begun, how it runs      */
    int   cur_n;               /* its device ops so far                               */
    int   prev_n, match;       /* capturing: the recorded run's op count; all equal so far */
    int   n_segs;              /* segments of the last step                           */
    int   failed;              /* a capture or replay failed: eager from then on      */
    long  captured_step;       /* graph step at which segments were captured (-1)      */
    struct mt_cuda_graph_seg segs[MT_CUDA_GRAPH_SEGS];
    char  why_not[200];        /* why graphs are off, or "" (graph_mode's reason)      */
    char  why_dynamic[160];    /* the first op that made a segment DYNAMIC             */
};

struct mt_cuda_backend {
    int            ready;          /* 1 after a successful mt_ops_cuda()        */
    int            device;         /* cudaGetDevice() at init                    */
    cudaStream_t   stream;         /* every op is queued here, in call order     */
    cublasHandle_t blas;
    /* bf16 mode (gemm.cu): precision, cuBLASLt handle, its workspace, plans */
    enum mt_cuda_precision precision;
    cublasLtHandle_t lt;
    void          *lt_ws;          /* MT_CUDA_LT_WS_BYTES of device memory       */
    size_t         bf16_cap;       /* operand scratch cap per gemm (bytes)       */
    size_t         attn_ds_cap;    /* bf16 attention: dS tiles kept up to this   */
    int            smem_optin_bytes; /* a block's dynamic shared memory limit
                                      after opt-in (cudaDevAttrMaxSharedMemory-
                                      PerBlockOptin; 48 KiB if unknown)          */
    int            attn_v2;        /* bf16 attention: 0 = v1 (attention_tc.cu),
                                      1 = attention_v2.cu (knob attn_kernel=v2),
                                      2 = the same with 128 query rows a block in
                                      the forward and dQ kernels (v3, same bits),
                                      3 = wgmma (v4, attention_wg.cu), 4 = v4 with
                                      its transposed operands MN-major (v5) */
    int            gg_bn;          /* grouped GEMMs (gemm_grouped.cu): the block
                                      tile's columns, 128 or 256 (MT_CUDA_GG_BN) */
    int            gg_wgmma;       /* 1: the grouped rows and sum products on wgmma
                                      (gemm_grouped_wg.cu; MT_CUDA_GG_KERNEL=wgmma) */
    long long      attn_group_bytes; /* causal attention's block order (attn_sched.cuh):
                                      the operands a group of (batch, head) pairs
                                      re-reads, at most this (a third of the L2;
                                      MT_CUDA_ATTN_GROUP_KIB overrides)           */
    long long      attn_group_default; /* that budget as set at creation           */
    struct mt_cuda_lt_plan plans[MT_CUDA_LT_PLANS];
    unsigned char  plan_next[MT_CUDA_LT_SETS]; /* round-robin eviction cursor of each set */
    struct mt_cuda_lt_algo_slot algos[MT_CUDA_LT_ALGOS];
    int            algo_next;      /* round-robin eviction cursor of algos[]     */
    /* sticky error: first failure wins; see the file comment */
    enum mt_status err;
    long           n_errors;
    int            err_reported;   /* printed once on stderr by sync()           */
    char           errmsg[384];
    /* fixed scratch for the host-visible reductions (allocated at init) */
    double        *red_partial;    /* (MT_CUDA_RED_BLOCKS + 1) device doubles    */
    int           *red_flag;       /* (1) device int for all_finite              */
    /* grow-only workspace for kernels that need temporary device memory
     * (attention's D rows, rmsnorm's dw partials, embed's sort keys). Not on
     * a ctx bucket (the entries take no ctx); its size is in mt_ops_cuda_info. */
    void          *ws;
    size_t         ws_bytes;
    /* what the device was asked to do (mt_ops_cuda.h): running totals, and
     * the per-step deltas between the trainer's step marks (profile_step) */
    struct mt_ops_cuda_counters ctr, ctr_at_begin;
    struct mt_ops_cuda_counters step_ctr[MT_CUDA_STEP_LOG];
    int            n_steps;        /* steps closed (the first MT_CUDA_STEP_LOG logged) */
    FILE          *launch_log;     /* MT_CUDA_LAUNCH_LOG: one line per launch, or NULL */
    const char    *cur_entry;      /* the table entry running (ops_cuda.cu's PROF wrappers), or NULL, */
    int            cur_kind;       /* and its enum mt_op_kind: the launch log's "op KIND ENTRY"       */
    /* per-op profile (ops_cuda.cu): an event pair around each table call
     * while mt_ops_profile_enabled(), resolved at the step's end mark */
    cudaEvent_t   *prof_ev;        /* (2 * prof_cap) start, end, start, end, ...  */
    unsigned char *prof_kind;      /* (prof_cap) enum mt_op_kind of each pair     */
    const char   **prof_name;      /* (prof_cap) the table entry of each pair     */
    int            prof_n, prof_cap;
    long           prof_dropped;   /* pairs not recorded (pool could not grow)   */
    /* MT_CUDA_KERNEL_PROFILE: per-launch pairs too, named "kernel:NAME"
     * (labels made once per kernel name, freed at shutdown) */
    struct { const char *kern; char *label; } kprof_label[MT_CUDA_KPROF_NAMES];
    int            kprof_n;
    struct mt_ops_cuda_info info;
    struct mt_cuda_graphs graph;   /* CUDA graphs of the step's segments (graph.cu) */
    struct mt_ops_i table;         /* the table handing out this instance as be */
};
/* The instance the current call acts on (ops_cuda.cu): set from the entry's
 * `be` by MT_CUDA_BIND, per host thread; NULL before any instance exists. */
extern thread_local struct mt_cuda_backend *mt_cuda_be;
#define MT_CUDA_BIND(be) ((void)(mt_cuda_be = (struct mt_cuda_backend *)(be)))

/* After an allocation: the device's used bytes (cudaMemGetInfo: total -
 * free, every allocation of the process and the context) into the peak the
 * receipt reports next to the allocator's. Allocations happen at setup and
 * on workspace growth only, so the query is off the step's hot path. */
static inline void mt_cuda_note_mem(void)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    mt_cuda_be->info.mem_free_now = fr;
    if (tot - fr > mt_cuda_be->info.mem_used_peak) mt_cuda_be->info.mem_used_peak = tot - fr;
}

/* Record a failure (sticky, first one kept). Returns 0 for use in conditions. */
int mt_cuda_record(enum mt_status st, const char *call, const char *reason, const char *file, int line);

/* One boundary per vendor: CUDA runtime and cuBLAS statuses become a sticky
 * mt_status here and nowhere else. Evaluates to 1 on success, 0 on failure. */
template <typename S, typename F>
static inline int mt_cuda_check_gen(S st, S success, F to_string, const char *call, const char *file, int line)
{
    if (st == success) return 1;
    return mt_cuda_record(MT_ERR_RUNTIME, call, to_string(st), file, line);
}
#define MT_CUDA_CHECK_GEN(call, success, to_string) \
    mt_cuda_check_gen((call), (success), (to_string), #call, __FILE__, __LINE__)
#define MT_CUDA_OK(call)    MT_CUDA_CHECK_GEN(call, cudaSuccess, cudaGetErrorString)
#define MT_CUBLAS_OK(call)  MT_CUDA_CHECK_GEN(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
#define MT_CUBLASLT_OK(call) MT_CUDA_CHECK_GEN(call, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString)
#define MT_CUDA_CHECK(call) ((void)MT_CUDA_OK(call))
#define MT_CUBLAS_CHECK(call) ((void)MT_CUBLAS_OK(call))
/* after every kernel launch: launch-configuration errors are reported here */
#define MT_CUDA_KCHECK()    MT_CUDA_CHECK(cudaGetLastError())

/* dynamic shared memory above the default 48 KiB needs the kernel's opt-in
 * (once per kernel is enough; asking again is cheap). 0: refused (recorded) */
template <typename F>
static int mt_cuda_smem_opt_in(F *kern, size_t bytes)
{
    if (bytes <= 48 * 1024) return 1;
    return MT_CUDA_OK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
/* a precondition a kernel cannot honour (e.g. head dim too large) */
#define MT_CUDA_UNSUPPORTED(what) \
    ((void)mt_cuda_record(MT_ERR_UNSUPPORTED, __func__, (what), __FILE__, __LINE__))

/* Grow-only workspace of at least `bytes` (NULL + sticky OOM on failure).
 * Valid until the next call; ops use it only within their own call, all on
 * the one stream, so one buffer serves every op. */
void *mt_cuda_workspace(size_t bytes);

/* C = A B^T on wgmma (wgmma_probe.cu; mt_ops_cuda_wgmma_probe_of); whether wgmma
 * runs on the bound instance (sm_90a code, an sm_90 device): the probe and
 * attn_kernel=v4 ask */
int mt_cuda_wgmma_available(void);
enum mt_status mt_cuda_wgmma_probe(float *C, const void *A, const void *B, int M, int N, int K, int form);

/* ---- CUDA graphs (graph.cu; docs/cuda.md "CUDA graphs") ----
 * While graphs are active (inside a step mark, graph_mode on), every device
 * operation the stream can capture (kernel launch, memset, device copy,
 * cuBLAS call) first calls mt_cuda_graph_op with its signature (what it is
 * and every value it passes: the kernel, its geometry and its arguments as
 * converted to the kernel's parameters); it returns 0 when the operation is
 * part of a segment being replayed (do not issue it: the graph does), 1 to
 * issue it (eagerly, or into a capture). Every operation a capture refuses
 * (host wait, copy to or from host memory, allocation, free) calls
 * mt_cuda_graph_boundary first: the segment ends there. */
int  mt_cuda_graph_op_slow(const char *name, uint64_t sig);
void mt_cuda_graph_boundary_slow(void);
/* an allocation or free may move a buffer a captured graph points to (the
 * grow-only workspace): every graph is dropped and recorded again */
void mt_cuda_graph_invalidate(void);
static inline int mt_cuda_graph_op(const char *name, uint64_t sig)
{
    return mt_cuda_be->graph.active ? mt_cuda_graph_op_slow(name, sig) : 1;
}
static inline void mt_cuda_graph_boundary(void)
{
    if (mt_cuda_be->graph.active) mt_cuda_graph_boundary_slow();
}
/* FNV-1a over a value's bytes: signatures of by-value arguments */
#define MT_CUDA_SIG0 1469598103934665603ull
template <typename T>
static inline uint64_t mt_cuda_sig_add(uint64_t h, const T &v)
{
    unsigned char b[sizeof(T)];
    memcpy(b, &v, sizeof b);
    for (size_t i = 0; i < sizeof b; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
template <typename... T>
static inline uint64_t mt_cuda_sig(const T &...v)
{
    uint64_t h = MT_CUDA_SIG0;
    ((h = mt_cuda_sig_add(h, v)), ...);
    return h;
}
/* host arrays a call reads (cuBLAS's per-group sizes): their contents */
template <typename T>
static inline uint64_t mt_cuda_sig_array(uint64_t h, const T *a, int n)
{
    for (int i = 0; i < n; i++) h = mt_cuda_sig_add(h, a[i]);
    return h;
}

/* ---- counted device work (docs/cuda.md, "Per-op profile and counters") ----
 * Every kernel launch, cuBLAS call, copy, memset, host wait and device
 * allocation of the backend goes through one of these, so the counters of
 * mt_ops_cuda_counters_of() are exact by construction, on a GPU and under
 * the emulator alike (the launch log, MT_CUDA_LAUNCH_LOG, written from the
 * same helpers, lists them one by one). */
void mt_cuda_note_launch(const char *name, dim3 grid, dim3 block, size_t smem);
/* the other device operations in the launch log, when it is on */
void mt_cuda_log_op(const char *what, size_t bytes);
static inline void mt_cuda_note_blas(void) { mt_cuda_be->ctr.blas_calls++; }
static inline cudaError_t mt_cuda_memcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (kind != cudaMemcpyDeviceToDevice) mt_cuda_graph_boundary();   /* pageable host memory */
    else if (!mt_cuda_graph_op("copy d2d", mt_cuda_sig(dst, src, bytes))) return cudaSuccess;
    struct mt_ops_cuda_counters *c = &mt_cuda_be->ctr;
    if (kind == cudaMemcpyHostToDevice) c->h2d++, c->h2d_bytes += (long long)bytes;
    else if (kind == cudaMemcpyDeviceToHost) c->d2h++, c->d2h_bytes += (long long)bytes;
    else c->d2d++, c->d2d_bytes += (long long)bytes;
    if (mt_cuda_be->launch_log)
        mt_cuda_log_op(kind == cudaMemcpyHostToDevice ? "copy h2d" : kind == cudaMemcpyDeviceToHost ? "copy d2h" : "copy d2d",
                       bytes);
    return cudaMemcpyAsync(dst, src, bytes, kind, mt_cuda_be->stream);
}
static inline cudaError_t mt_cuda_memset(void *dst, int value, size_t bytes)
{
    if (!mt_cuda_graph_op("memset", mt_cuda_sig(dst, value, bytes))) return cudaSuccess;
    mt_cuda_be->ctr.memsets++;
    if (mt_cuda_be->launch_log) mt_cuda_log_op("memset", bytes);
    return cudaMemsetAsync(dst, value, bytes, mt_cuda_be->stream);
}
/* the host waits for the stream */
static inline cudaError_t mt_cuda_stream_sync(void)
{
    mt_cuda_graph_boundary();
    mt_cuda_be->ctr.syncs++;
    if (mt_cuda_be->launch_log) mt_cuda_log_op("sync", 0);
    return cudaStreamSynchronize(mt_cuda_be->stream);
}
static inline cudaError_t mt_cuda_malloc(void **p, size_t bytes)
{
    mt_cuda_graph_boundary();
    if (mt_cuda_be->graph.want && mt_cuda_be->graph.step > 0) mt_cuda_graph_invalidate();
    mt_cuda_be->ctr.allocs++;
    if (mt_cuda_be->launch_log) mt_cuda_log_op("alloc", bytes);
    return cudaMalloc(p, bytes);
}
/* cudaFree also waits for the device: counted as a free, not a sync */
static inline cudaError_t mt_cuda_free(void *p)
{
    if (p) mt_cuda_graph_boundary();
    if (p && mt_cuda_be->graph.want && mt_cuda_be->graph.step > 0) mt_cuda_graph_invalidate();
    if (p) mt_cuda_be->ctr.frees++;
    return cudaFree(p);
}

/* per-launch event pairs (MT_CUDA_KERNEL_PROFILE; ops_cuda.cu): the pair's
 * index, or -1 when not timing (profile off, graphs active, pool full) */
int  mt_cuda_kprof_begin(const char *kern);
void mt_cuda_kprof_end(int i);

/* ---- launches ----
 * MT_LAUNCH(kern, grid, block, smem)(args...): counted (note_launch), then
 * launched on the bound instance's stream; while graphs are active the
 * launch's signature (kernel, geometry, the arguments converted to the
 * kernel's parameter types, as the launch copies them) goes to
 * mt_cuda_graph_op first, and a launch that a replayed graph stands for is
 * not issued. */
template <typename... P>
struct mt_cuda_launch {
    void (*kern)(P...);
    dim3        grid, block;
    size_t      smem;
    const char *name;
    template <typename... A>
    void operator()(const A &...args) const
    {
        if (mt_cuda_be->graph.active) {
            uint64_t h = mt_cuda_sig((const void *)kern, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
            ((h = mt_cuda_sig_add(h, P(args))), ...);
            if (!mt_cuda_graph_op(name, h)) return;
        }
        mt_cuda_note_launch(name, grid, block, smem);
        const int kp = mt_cuda_be->info.kernel_profile ? mt_cuda_kprof_begin(name) : -1;
#ifdef MT_CUDA_EMU
        mt_emu_name_kernel((const void *)kern, name);
        mt_emu_launcher(kern, grid, block, smem)(args...);
#else
        kern<<<grid, block, smem, mt_cuda_be->stream>>>(args...);
#endif
        if (kp >= 0) mt_cuda_kprof_end(kp);
    }
};
template <typename... P>
static inline mt_cuda_launch<P...> mt_cuda_launcher(void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                                                    const char *name)
{
    return mt_cuda_launch<P...>{kern, grid, block, smem, name};
}
#define MT_LAUNCH(kern, grid, block, smem) mt_cuda_launcher((kern), dim3(grid), dim3(block), (size_t)(smem), #kern)
#ifdef MT_CUDA_EMU
#define MT_DYN_SMEM(type, name) type *name = (type *)mt_emu_dyn_smem()
#else
#define MT_DYN_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

#define MT_WARP 32
#define MT_FULL_MASK 0xffffffffu

/* blocks for a grid-stride loop over n items (capped; loops cover the rest) */
static inline unsigned mt_cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

/* butterfly reductions over a full warp: every lane gets the result, and the
 * combination order depends only on lane numbers (deterministic). */
static __device__ __forceinline__ float mt_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL_MASK, v, o);
    return v;
}
static __device__ __forceinline__ float mt_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MT_FULL_MASK, v, o));
    return v;
}

/* ---- the norms' row groups (rmsnorm.cu, fused.cu) ----
 * A row of C columns is G = 2^lg lanes (mt_cuda_rms_lanes_log2), each lane
 * holding float4s. Both files sum squares with mt_rms_sq4 and combine a group
 * with mt_rms_group_sum, so qk_norm_rope's rstd is rmsnorm_forward's bits. */
static __device__ __forceinline__ float mt_rms_sq4(float4 v, float ss)
{
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    return fmaf(v.w, v.w, ss);
}
/* butterfly over the G lanes of a row group (full-mask shuffles: every lane
 * of the warp takes part; xor < G stays inside the group) */
static __device__ __forceinline__ float mt_rms_group_sum(float v, int G)
{
    for (int o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(MT_FULL_MASK, v, o);
    return v;
}
/* rmsnorm.cu's host entries that fused.cu reuses: the forward rows (resid:
 * NULL or the copy of inp), the dw column reduction, the lanes per row */
void mt_cuda_rms_rows_forward(float *out, __nv_bfloat16 *ob, float *rstd, float *resid, const float *inp,
                              const float *w, int N, int C, float eps);
void mt_cuda_rms_dw_reduce(float *dw0, float *dw1, const float *partial, int nc0, int nc1, int C);
int  mt_cuda_rms_lanes_log2(int C);

/* fp32 -> bf16, round to nearest even, by bit arithmetic: the rounding of
 * the kernels whose bf16 output is a stored tensor (cast_bf16, the operand
 * copies of gemm, the bf16 twins of rmsnorm/swiglu/the fused block), the
 * same function as the cpu twin mt_cpu_f32_to_bf16, so cuda = cpu bit for
 * bit by construction on every input, whatever the hardware conversion
 * does (the tensor-core attention's inner loops keep __float2bfloat16_rn,
 * one instruction, which rounds the same way, NaN included; the emulator's
 * mirrors it):
 *   NaN (any sign, any payload) -> 0x7fff, the canonical NaN that
 *     __float2bfloat16_rn (cvt.rn.bf16.f32) returns on the device: on the
 *     H200 (2026-11-26) the cpu twin's old "payload kept, quiet bit set"
 *     differed in exactly the harness's one NaN input, 1 of 4099;
 *   subnormals kept and rounded like any value (no flush to zero);
 *   overflow past the largest bf16 rounds to infinity; infinities exact. */
static __device__ __forceinline__ __nv_bfloat16 mt_cuda_bf16_rn(float f)
{
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16((unsigned short)0x7fffu);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}

/* Muon's momentum on element i (mt_ops.h muon_momentum; its kernel and
 * muon_prep_bf16_multi's run this): the clip's product rounded once, then
 * explicit FMAs (the cpu kernel's), m = mu m + g stored, the Nesterov
 * direction d = mu m + g returned; mt_cuda_muon_dir recomputes that d from
 * the stored m, the same bits */
static __device__ __forceinline__ float mt_cuda_muon_g(const float *g, float gs, size_t i)
{
    return gs == 1.0f ? g[i] : __fmul_rn(gs, g[i]);
}
static __device__ __forceinline__ float mt_cuda_muon_elem(float *m, const float *g, float mu, float gs, size_t i)
{
    const float gi = mt_cuda_muon_g(g, gs, i), mi = fmaf(mu, m[i], gi);
    m[i] = mi;
    return fmaf(mu, mi, gi);
}
static __device__ __forceinline__ float mt_cuda_muon_dir(const float *m, const float *g, float mu, float gs, size_t i)
{
    return fmaf(mu, m[i], mt_cuda_muon_g(g, gs, i));
}

/* ---- 16-byte vector access (elementwise kernels; docs/cuda.md "Vectorised elementwise kernels") ----
 * A kernel that takes the vector path loads/stores 4 floats (float4) or 8
 * bf16 (uint4), 4 bf16 (uint2) at a time from pointers its host side
 * checked with mt_cuda_aligned(); elements past the last whole vector go
 * through the scalar form (the tail), so each element's math is the scalar
 * kernel's expression: the same bits. The emulator aborts on a misaligned
 * vector access (a fault on the device). */
static inline int mt_cuda_aligned(const void *p, size_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }
#ifdef MT_CUDA_EMU
#define MT_VEC_CHECK(p, b)                                                                           \
    do {                                                                                             \
        if (((uintptr_t)(p) & ((b) - 1)) != 0) {                                                     \
            fprintf(stderr, "emu: misaligned %d-byte vector access at %p (%s:%d)\n", (int)(b),       \
                    (const void *)(p), __FILE__, __LINE__);                                          \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)
#else
#define MT_VEC_CHECK(p, b) ((void)0)
#endif
static __device__ __forceinline__ float4 mt_ld_f4(const float *p)
{
    MT_VEC_CHECK(p, 16);
    return *reinterpret_cast<const float4 *>(p);
}
static __device__ __forceinline__ void mt_st_f4(float *p, float4 v)
{
    MT_VEC_CHECK(p, 16);
    *reinterpret_cast<float4 *>(p) = v;
}
/* bf16 pairs packed low element first (little-endian, as stored) */
static __device__ __forceinline__ unsigned mt_pack_bf16x2(float a, float b)
{
    return (unsigned)__bfloat16_as_ushort(mt_cuda_bf16_rn(a)) |
           ((unsigned)__bfloat16_as_ushort(mt_cuda_bf16_rn(b)) << 16);
}
/* 4 bf16 = bf16(v) (8 bytes) */
static __device__ __forceinline__ void mt_st_bf16x4(__nv_bfloat16 *p, float4 v)
{
    MT_VEC_CHECK(p, 8);
    uint2 o;
    o.x = mt_pack_bf16x2(v.x, v.y);
    o.y = mt_pack_bf16x2(v.z, v.w);
    *reinterpret_cast<uint2 *>(p) = o;
}
static __device__ __forceinline__ float mt_bf16_lo(unsigned u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float mt_bf16_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
/* an element, or 4 (16 / 8 bytes), as stored: fp32, or bf16 widened (exact) */
static __device__ __forceinline__ float mt_ld1(const float *p) { return *p; }
static __device__ __forceinline__ float mt_ld1(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ float4 mt_ld4(const float *p) { return mt_ld_f4(p); }
static __device__ __forceinline__ float4 mt_ld4(const __nv_bfloat16 *p)
{
    MT_VEC_CHECK(p, 8);
    const uint2 r = *reinterpret_cast<const uint2 *>(p);
    return float4{mt_bf16_lo(r.x), mt_bf16_hi(r.x), mt_bf16_lo(r.y), mt_bf16_hi(r.y)};
}

/* A block's cooperative move of elements e < n (a thread's e: threadIdx.x, +
 * blockDim.x, ...), AHEAD of a thread's at a time: their loads, then their
 * stores. A loop that loads an element and stores it before the next load waits
 * a memory round trip per element (nvcc does not move a conditional load above
 * the store before it), one load in flight a warp (the H100 of 2026-11-27 wants
 * ~20 KB in flight an SM). ld(e) returns element e's value (its zero outside the
 * source), st(e, v) stores it: the plain loop's values and places, the same
 * bits. Used by the tile stagings of ssd_tc.cu and ssm.cu and xent.cu's row load */
template <int AHEAD, typename V, typename Ld, typename St>
static __device__ __forceinline__ void mt_block_move(int n, Ld ld, St st)
{
    const int nt = (int)blockDim.x;
    for (int e0 = (int)threadIdx.x; e0 < n; e0 += AHEAD * nt) {
        V v[AHEAD] = {};
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
            if (e0 + u * nt < n) v[u] = ld(e0 + u * nt);
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
            if (e0 + u * nt < n) st(e0 + u * nt, v[u]);
    }
}

#ifdef __cplusplus
extern "C" {
#endif

/* ---- graph.cu ---- */
void mt_cuda_graph_step_mark(int end);
void mt_cuda_graph_release(void);
void mt_cuda_graph_mode(void *be, int on, const char *why_not);

/* ---- memory.cu ---- */
void *mt_cuda_buf_alloc(void *be, struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket);
void  mt_cuda_buf_free(void *be, struct mt_ctx *ctx, void *p);
void  mt_cuda_copy_to_host(void *be, void *dst_host, const void *src, size_t bytes);
void  mt_cuda_copy_from_host(void *be, void *dst, const void *src_host, size_t bytes);
void  mt_cuda_copy(void *be, void *dst, const void *src, size_t bytes);
void  mt_cuda_sync(void *be);

/* ---- elementwise.cu ---- */
void   mt_cuda_fill(void *be, float *x, float value, size_t n);
void   mt_cuda_axpby(void *be, float *y, const float *x, float a, float b, size_t n);
double mt_cuda_sumsq(void *be, const float *x, size_t n);
int    mt_cuda_all_finite(void *be, const float *x, size_t n);
double mt_cuda_sumsq_multi(void *be, const float *const *x, const size_t *n, int count);
void   mt_cuda_normalize_fro(void *be, float *x, size_t n, double eps);
void   mt_cuda_normalize_fro_bf16(void *be, mt_bf16 *dst, const float *x, size_t n, double eps);
void   mt_cuda_axpby_from_bf16(void *be, float *y, const mt_bf16 *x, float a, float b, size_t n);
void   mt_cuda_muon_prep_bf16_multi(void *be, mt_bf16 *const *x, float *const *m, const float *const *g,
                                    const size_t *n, int count, float mu, float gscale, double eps, float *d);
void   mt_cuda_axpby_from_bf16_multi(void *be, float *const *y, const mt_bf16 *const *x, const float *a,
                                     const float *b, const size_t *n, int count);
void   mt_cuda_nonfinite_mark(void *be, float *flags, const float *const *x, const size_t *n, const int *slot, int count);

/* ---- gemm.cu ---- */
/* release every cached cuBLASLt plan of the bound instance (destroy) */
void mt_cuda_lt_plans_release(void);
void mt_cuda_gemm(void *be, int transA, int transB, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);
void mt_cuda_gemm_bf16(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                       int lda, const void *B, enum mt_elem b_type, int ldb, float beta, float *C, int ldc);
void mt_cuda_gemm_bf16_out(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                           enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, mt_bf16 *C,
                           int ldc);
void mt_cuda_gemm_bf16_resid(void *be, int transA, int transB, int M, int N, int K, float alpha, const void *A,
                             enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, const float *R,
                             float *C, int ldc);
void mt_cuda_cast_bf16(void *be, mt_bf16 *dst, const float *src, size_t n);
void mt_cuda_gemm_bf16_batched(void *be, int transA, int transB, int M, int N, int K, float alpha, const mt_bf16 *A,
                               int lda, size_t stride_a, const mt_bf16 *B, int ldb, size_t stride_b, float beta,
                               const mt_bf16 *C, mt_bf16 *D, int ldd, size_t stride_d, int count);
void mt_cuda_cast_bf16_multi(void *be, mt_bf16 *const *dst, const float *const *src, const size_t *n, int count);
void mt_cuda_init_normal(void *be, float *out, size_t rows, size_t cols, int64_t off0, int64_t off1, int64_t shape1,
                         uint64_t seed, uint64_t stream, float std);
void mt_cuda_cast_bf16_rows(void *be, mt_bf16 *dst, size_t ld, const float *src, size_t rows, size_t cols);
void mt_cuda_widen_bf16(void *be, float *dst, const mt_bf16 *src, size_t n);
void mt_cuda_gemm_grouped(void *be, int transA, int transB, int n, const int *M, const int *N, const int *K, float alpha,
                          const float *const *A, int lda, const float *const *B, int ldb, float beta,
                          float *const *C, int ldc);

/* ---- gemm_grouped.cu (group sizes on the device: mt_ops.h) ---- */
void mt_cuda_gemm_grouped_rows(void *be, int n, const int32_t *offs, int max_rows, int N, int K, int transB,
                               float alpha, const mt_bf16 *A, int lda, const mt_bf16 *const *B, int ldb, float beta,
                               void *C, enum mt_elem c_type, int ldc);
void mt_cuda_gemm_grouped_sum(void *be, int n, const int32_t *offs, int M, int N, float alpha, const mt_bf16 *A,
                              int lda, const mt_bf16 *B, int ldb, float beta, float *const *C, int ldc);
void mt_cuda_moe_count_acc(void *be, double *load, const int32_t *offs, int n, double sign);

/* ---- embed.cu ---- */
void mt_cuda_embed_forward(void *be, float *out, const int32_t *idx, const float *wte, int N, int C);
void mt_cuda_embed_backward(void *be, float *dwte, const float *dout, const int32_t *idx, int N, int C, int V);

/* ---- rmsnorm.cu ---- */
void mt_cuda_rmsnorm_forward(void *be, float *out, float *rstd, const float *inp, const float *weight,
                             int N, int C, float eps);
void mt_cuda_rmsnorm_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, const float *inp,
                                  const float *weight, int N, int C, float eps);
void mt_cuda_rmsnorm_backward(void *be, float *dinp, float *dweight, const float *dout, const float *inp,
                              const float *weight, const float *rstd, int N, int C, int accumulate);
void mt_cuda_rmsnorm_backward_bf16(void *be, float *dinp, mt_bf16 *dinp_b, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const float *rstd, int N, int C,
                                   int accumulate, const mt_bf16 *dout_b);

/* ---- rope.cu ---- */
void mt_cuda_rope_forward(void *be, float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                          int N, int T, int pos0, int nh, int hd);
void mt_cuda_rope_backward(void *be, float *dinp, const float *dout, const float *cos_tab, const float *sin_tab,
                           int N, int T, int pos0, int nh, int hd);

/* ---- attention.cu ---- */
void mt_cuda_attention_forward(void *be, float *out, float *lse, const float *q, const float *k, const float *v,
                               int B, int Tq, int Tk, int q_pos0, int H, int K, int hd);
void mt_cuda_attention_backward(void *be, float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse,
                                int B, int T, int H, int K, int hd);
/* D (B,H,T) = rowwise dout . out (fp32), on the bound instance's stream */
void mt_cuda_attention_rowdot(float *D, const float *dout, const float *out, int B, int T, int H, int hd);
/* ---- attention_v2.cu (called by attention_tc.cu's entries on its staged
 * bf16 operands; D = rowdot(dout, out)) ---- */
int  mt_attn_v2_supports(int hd);  /* 64 and 128 */
/* attn_kernel=v4's forward, dK/dV and dQ from the dS tiles (attention_wg.cu: wgmma;
 * mt_attn_v2_forward and mt_attn_v2_backward hand them over; without room for the
 * tiles dQ is v2's recompute) */
void mt_attn_wg_forward(float *out, mt_bf16 *out_b, float *lse, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                        int B, int T, int H, int K, int hd);
void mt_attn_wg_dkdv(float *dk, mt_bf16 *dk_b, float *dv, mt_bf16 *dv_b, mt_bf16 *ds, const mt_bf16 *q,
                     const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *g, const float *lse, const float *D, int B,
                     int T, int H, int K, int hd, int ldv_b);
void mt_attn_wg_dq(float *dq, mt_bf16 *dq_b, const mt_bf16 *ds, const mt_bf16 *k, int B, int T, int H, int K, int hd);
void mt_attn_v2_forward(float *out, mt_bf16 *out_b, float *lse, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                        int B, int T, int H, int K, int hd);
/* ds: workspace for the dS^T tiles (dQ from them), NULL: dQ recomputes S and dP (counted) */
void mt_attn_v2_backward(float *dq, mt_bf16 *dq_b, float *dk, mt_bf16 *dk_b, float *dv, mt_bf16 *dv_b, mt_bf16 *ds,
                         const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *g, const float *lse,
                         const float *D, int B, int T, int H, int K, int hd, int ldv_b);
/* ---- attention_tc.cu ---- */
void mt_cuda_attention_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *lse, const float *q,
                                    const float *k, const float *v, int B, int T, int H, int K, int hd,
                                    mt_bf16 *qkv_b);
void mt_cuda_attention_backward_bf16(void *be, float *dq, float *dk, float *dv, const float *dout,
                                     const float *q, const float *k, const float *v, const float *out,
                                     const float *lse, int B, int T, int H, int K, int hd, const mt_bf16 *qkv_b,
                                     mt_bf16 *dv_b, const mt_bf16 *dout_b, const mt_bf16 *out_b, mt_bf16 *dq_b,
                                     mt_bf16 *dk_b, int ldv_b);

/* ---- swiglu.cu ---- */
void mt_cuda_swiglu_forward(void *be, float *out, const float *gate, const float *up, size_t n);
void mt_cuda_swiglu_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, const float *gate, const float *up, size_t n);
void mt_cuda_redo_score_acc(void *be, int64_t *acc, const float *act, size_t rows, int F);
void mt_cuda_swiglu_backward(void *be, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, size_t n);
void mt_cuda_swiglu_backward_bf16(void *be, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout, const float *gate,
                                  const float *up, size_t n);
void mt_cuda_swiglu_backward_act_bf16(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b, const float *dout,
                                      const float *gate, const float *up, size_t n);
void mt_cuda_swiglu_forward_bf16_gu(void *be, mt_bf16 *out_bf16, const mt_bf16 *gate, const mt_bf16 *up, size_t n);
void mt_cuda_swiglu_backward_act_bf16_gu(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                         const float *dout, const mt_bf16 *gate, const mt_bf16 *up, size_t n);
void mt_cuda_swiglu_backward_act_bf16_gud(void *be, mt_bf16 *act_b, mt_bf16 *dgate_b, mt_bf16 *dup_b,
                                          const mt_bf16 *dout, const mt_bf16 *gate, const mt_bf16 *up, size_t n,
                                          size_t F, size_t ldo);

/* ---- xent.cu ---- */
void mt_cuda_xent_forward(void *be, float *losses, float *lse_out, const float *logits, const int32_t *targets,
                          int N, int V, float softcap);
void mt_cuda_xent_backward(void *be, float *dlogits, const float *logits, const float *lse,
                           const int32_t *targets, float dscale, int N, int V, float softcap);
void mt_cuda_xent_fused(void *be, float *losses, float *lse_out, float *logits, const int32_t *targets, float dscale,
                        int N, int V, float softcap);
void mt_cuda_xent_fused_bf16(void *be, float *losses, float *lse_out, float *logits, mt_bf16 *dlogits_bf16,
                             const int32_t *targets, float dscale, int N, int V, float softcap);
void mt_cuda_xent_fused_bf16_logits(void *be, float *losses, float *lse_out, mt_bf16 *logits_b, const int32_t *targets,
                                    float dscale, int N, int V, float softcap);

/* ---- moe.cu ---- */
void mt_cuda_router_forward(void *be, float *probs, float *lse, int32_t *topk_idx, float *gates,
                            const float *logits, int N, int E, int k);
void mt_cuda_router_backward(void *be, float *dlogits, const float *dgates, const float *dprobs,
                             const float *dlse, const float *probs, const int32_t *topk_idx,
                             const float *gates, int N, int E, int k);
void mt_cuda_moe_permute(void *be, float *xp, const float *h, const int32_t *src_row, int M, int C);
void mt_cuda_moe_permute_backward(void *be, float *dh, const float *dxp, const int32_t *pos, int N, int k, int C,
                                  int accumulate);
void mt_cuda_moe_permute_bf16(void *be, mt_bf16 *xb, const float *h, const int32_t *src_row, int M, int C);
void mt_cuda_moe_combine_backward_bf16(void *be, mt_bf16 *dyb, float *dgates, const float *dout, const float *y,
                                       const int32_t *pos, const float *gates, int N, int k, int C);
void mt_cuda_moe_combine(void *be, float *out, const float *y, const int32_t *pos, const float *gates,
                         int N, int k, int C);
void mt_cuda_moe_combine_backward(void *be, float *dy, float *dgates, const float *dout, const float *y,
                                  const int32_t *pos, const float *gates, int N, int k, int C);
/* MoE device routing (mt_ops.h) */
void mt_cuda_moe_route(void *be, int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work,
                       const int32_t *topk_idx, int N, int k, int E, int n_null);
void mt_cuda_moe_seq_stats(void *be, double *seq, const float *probs, const int32_t *topk_idx, int N, int E, int k,
                           int B, int T, int g0);
void mt_cuda_moe_aux_loss(void *be, double *loss, float *f_share, const double *seq, const float *lse, int N, int B,
                          int E, int k, int T, float aux_coef, float z_coef, int count_aux);
void mt_cuda_moe_aux_backward(void *be, float *dprobs, float *dlse, const float *f_share, const float *lse, int N,
                              int E, int T, int g0, float aux_coef, float z_coef, double n_seq, double n_tok);

/* ---- mod.cu — Mixture-of-Depths routing (mt_ops.h) ---- */
void mt_cuda_mod_route(void *be, int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss, const float *r,
                       int B, int T, int C, float coef);
void mt_cuda_mod_backward(void *be, float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot,
                          int N, int D, float aux_scale);

/* ---- optim_kernels.cu ---- */
void mt_cuda_adamw_update(void *be, float *p, const float *g, float *m, float *v, size_t n,
                          float lr, float b1, float b2, float eps, float wd, float bc1, float bc2);
void mt_cuda_muon_momentum(void *be, float *d, float *m, const float *g, float mu, size_t n, float gscale);
void mt_cuda_adamw_multi(void *be, float *const *p, mt_bf16 *const *pb, const float *const *g, float *const *m,
                         float *const *v, const size_t *n, const float *wd, int count, float lr, float b1, float b2,
                         float eps, float bc1, float bc2, float gscale);
void mt_cuda_transpose(void *be, float *out, const float *in, int rows, int cols);
/* ssm.cu — Mamba-3 scan and mixer glue (docs/mamba3.md) */
void mt_cuda_ssm_scan_forward(void *be, float *y, const float *x, const float *Bm, const float *Cm,
                              const float *dt, const float *lam, const float *A, const float *Dsk,
                              int B, int T, int H, int P, int N, int chunk);
void mt_cuda_ssm_scan_backward(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                               float *dA, float *dDsk, const float *dy, const float *x,
                               const float *Bm, const float *Cm, const float *dt, const float *lam,
                               const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                               int chunk);
/* precision=bf16: the chunked scan's intra-chunk products on tensor cores (ssd_tc.cu) */
void mt_cuda_ssm_scan_forward_bf16(void *be, float *y, const float *x, int ldx, const float *Bm, const float *Cm,
                                   const float *dt, const float *lam, const float *A, const float *Dsk,
                                   int B, int T, int H, int P, int N, int chunk, float *states,
                                   const mt_bf16 *Bh_b, const mt_bf16 *Ch_b, mt_bf16 *y_b, const mt_bf16 *x_b,
                                   int ldx_b);
void mt_cuda_ssm_scan_backward_bf16(void *be, float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                                    float *dA, float *dDsk, const float *dy, const float *x, int ldx,
                                    const float *Bm, const float *Cm, const float *dt, const float *lam,
                                    const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                                    int chunk, const float *states, mt_bf16 *dx_b, const mt_bf16 *Bh_b,
                                    const mt_bf16 *Ch_b, const mt_bf16 *dy_b, const mt_bf16 *x_b, int ldx_b,
                                    mt_bf16 *dB_b, mt_bf16 *dC_b);
void mt_cuda_ssm_scan_step(void *be, float *y, float *S, float *xprev, float *Bprev, const float *x,
                         const float *Bm, const float *Cm, const float *dt, const float *lam,
                         const float *A, const float *Dsk, int B, int H, int P, int N, int first);
void mt_cuda_ssm_prep_forward(void *be, float *x, float *Bh, float *Ch, float *dt, float *lam, float *A,
                              float *rstd, float *ang_state, const float *proj, const float *dt_bias, const float *A_log,
                              const float *gB, const float *gC, const float *B_bias, const float *C_bias,
                              int B, int T, int H, int P, int G, int N, float eps, mt_bf16 *Bh_b, mt_bf16 *Ch_b,
                              float *ang_out);
void mt_cuda_ssm_prep_backward(void *be, float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                               float *dB_bias, float *dC_bias, const float *dx, const float *dBh,
                               const float *dCh, const float *ddt, const float *dlam, const float *dA,
                               const float *B_bias, const float *C_bias, const float *lam, const float *A,
                               const float *rstd, const float *proj, const float *dt_bias,
                               const float *gB, const float *gC, int B, int T, int H, int P, int G,
                               int N, float eps, const float *ang);
void mt_cuda_ssm_prep_backward_bf16(void *be, mt_bf16 *dproj_b, float *dproj, float *ddt_bias, float *dA_log,
                                    float *dgB, float *dgC, float *dB_bias, float *dC_bias, const float *dx,
                                    const float *dBh, const float *dCh, const float *ddt, const float *dlam,
                                    const float *dA, const float *B_bias, const float *C_bias, const float *lam,
                                    const float *A, const float *rstd, const float *proj, const float *dt_bias,
                                    const float *gB, const float *gC, int B, int T, int H, int P, int G, int N,
                                    float eps, const float *ang, const mt_bf16 *dBh_b, const mt_bf16 *dCh_b);
void mt_cuda_ssm_gate_norm_forward(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                   const float *w, int n, int E, int G, float eps);
void mt_cuda_ssm_gate_norm_backward(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                    const float *z, int ldz, const float *w, const float *rstd,
                                    int n, int E, int G);
void mt_cuda_ssm_gate_norm_backward_bf16(void *be, float *dy, mt_bf16 *dz_b, float *dw, const float *dout,
                                         const float *y, const float *z, int ldz, const float *w, const float *rstd,
                                         int n, int E, int G, mt_bf16 *dy_b, const mt_bf16 *y_b,
                                         const mt_bf16 *zin_b, int ldz_b, const mt_bf16 *dout_b);
void mt_cuda_ssm_gate_norm_sums(void *be, float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                                const float *dout, const float *rstd, int n, int E, int c0, int cg);
void mt_cuda_ssm_gate_norm_forward_ext(void *be, float *out, float *rstd, const float *y, const float *z, int ldz,
                                       const float *w, const float *s, int lds, int n, int E, int c0, int cg,
                                       float eps);
void mt_cuda_ssm_gate_norm_forward_bf16(void *be, float *out, mt_bf16 *out_b, float *rstd, const float *y,
                                        const float *z, int ldz, const float *w, int n, int E, int G, float eps,
                                        const mt_bf16 *y_b, const mt_bf16 *zin_b, int ldz_b);
void mt_cuda_ssm_gate_norm_backward_ext(void *be, float *dy, float *dz, float *dw, const float *dout, const float *y,
                                        const float *z, int ldz, const float *w, const float *rstd, const float *s,
                                        int lds, int n, int E, int c0, int cg);
/* fused.cu — the fused elementwise chains (mt_ops.h) */
void mt_cuda_rmsnorm_resid_forward(void *be, float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                   int N, int C, float eps);
void mt_cuda_rmsnorm_resid_forward_bf16(void *be, float *out, mt_bf16 *out_bf16, float *rstd, float *resid, const float *inp,
                                        const float *weight, int N, int C, float eps);
void mt_cuda_qk_norm_rope_forward(void *be, float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                  const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                  const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps);
void mt_cuda_qk_norm_rope_backward(void *be, float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                   float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                   const float *wk, const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                   const float *sin_tab, int N, int T, int H, int K, int hd);
void mt_cuda_qk_norm_rope_forward_bf16(void *be, mt_bf16 *qb, mt_bf16 *kb, float *rstd_q, float *rstd_k,
                                       const float *q_raw, const float *k_raw, const float *wq, const float *wk,
                                       const float *cos_tab, const float *sin_tab, int N, int T, int pos0, int H, int K,
                                       int hd, float eps, const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b);
void mt_cuda_qk_norm_rope_backward_bf16(void *be, mt_bf16 *dq_raw_b, mt_bf16 *dk_raw_b, float *dwq, float *dwk,
                                        float *dq, float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                        const float *wk, const float *rstd_q, const float *rstd_k,
                                        const float *cos_tab, const float *sin_tab, int N, int T, int H, int K, int hd,
                                        const mt_bf16 *q_raw_b, const mt_bf16 *k_raw_b, const mt_bf16 *dq_b,
                                        const mt_bf16 *dk_b, int ld_dq_raw, int ld_dk_raw);

#ifdef __cplusplus
}
#endif

#endif /* MT_CUDA_IMPL_CUH */
