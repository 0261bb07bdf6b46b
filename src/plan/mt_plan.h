/*
 * mt_plan.h — the planner: every tensor's layout, the exact memory of every
 * rank, and a cost model of the step, before anything runs.
 *
 * The plan comes from the SAME size functions the runtime allocates with:
 * mt_model_create_par(MT_MODEL_NO_ALLOC) gives each rank's parameter
 * registry (names, global shapes, TP boxes, experts, pipeline stage) without
 * an arena; mt_model_plan_bytes_par the model's activations and workspace;
 * mt_zero_plan_all the ZeRO engine buffers of every rank of a reduction
 * group at once (and who owns what); mt_optim_plan_bytes the optimizer state
 * of the parameters a rank updates (mt_zero_runs_optimizer); the trainer's
 * own buffers come from mt_layout_host_bytes and mt_layout_stage_io_bytes. No
 * MPI, no large allocation: the plan of a 70B model on 1024 ranks takes
 * seconds. The trainer writes mt_plan_rank_bytes of every rank into the
 * receipt next to the measured peaks, so every run checks the plan.
 *
 * Example (tools/cmd_plan.c):
 *     struct mt_plan_setup su = {.dims = d, .zero_stage = 1, .steps = 10};
 *     MT_CHECK(mt_plan_pipeline_cut(ctx, &cfg, d.pp, NULL, su.first_layer));
 *     struct mt_plan *p;
 *     MT_CHECK(mt_plan_create(ctx, &cfg, &su, MT_PLAN_LAYOUT | MT_PLAN_VERIFY, &p));
 *     size_t b[MT_BUCKET_COUNT];
 *     mt_plan_rank_bytes(p, 3, b);                     // bytes per bucket of rank 3
 *     mt_plan_destroy(ctx, p);
 *
 * HOW IT WORKS — classes of ranks. A rank's memory depends on its pipeline
 * stage s (which layers, how many activation slots), its model and expert
 * coordinates (which TP slice, which experts) and its rank in each ZeRO
 * group (which parameters it owns). Slices and experts of one stage have
 * the same shapes in the same order, so the model registry, the ZeRO
 * layouts and the optimizer plans are computed once per stage, from the
 * representative (model 0, expert 0), and each rank's total is assembled
 * from its stage and its group ranks. MT_PLAN_VERIFY builds the registry of
 * every (stage, model, expert) coordinate and checks that claim parameter
 * by parameter (an internal error if it ever failed).
 */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include <stddef.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../parallel/mt_mesh.h"
#include "../parallel/mt_layout.h"

struct mt_model;
struct mt_model_par;

/* What to plan: the mesh, the ZeRO stage, the pipeline cut and the run
 * length (the trainer keeps a few numbers per step). Batch geometry,
 * microbatches, recompute and reshard_after_forward come from the config. */
struct mt_plan_runtime;
struct mt_plan_setup {
    struct mt_mesh_dims dims;
    int zero_stage;                       /* 0..3                                      */
    int first_layer[MT_MAX_LAYERS + 1];   /* stage s = layers [first[s], first[s+1])   */
    int steps;                            /* steps the run will take (<= 0: 1)          */
    /* the runtime bucket (all optional: zero-filled is a one-thread rank, MPI
     * iff world > 1, no data, the built-in constants) */
    int threads;                          /* OpenMP / OpenBLAS threads per rank (<= 0: 1) */
    double data_bytes;                    /* token shards the run maps (train + val)       */
    const struct mt_plan_runtime *runtime;   /* constants; NULL: mt_plan_runtime_default */
};

/* ---- the mesh rules --------------------------------------------------------
 * They live in mt_layout.h (src/parallel/layout.c), shared with the trainer.
 * The names below are the planner's earlier spellings, kept for callers
 * that still use them. */
static inline int mt_plan_group_rank(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g)
{
    return mt_layout_group_rank(d, rank, g);
}
static inline int mt_plan_n_slots(const struct mt_config *cfg, const struct mt_mesh_dims *d, int stage)
{
    return mt_layout_n_slots(cfg, d, stage);
}
static inline void mt_plan_model_par(const struct mt_config *cfg, const struct mt_mesh_dims *d, const int *first_layer,
                                     int rank, struct mt_model_par *par)
{
    mt_layout_model_par(cfg, d, first_layer, rank, par);
}
static inline int mt_plan_micro_batch(const struct mt_config *cfg, const struct mt_mesh_dims *d)
{
    return mt_layout_micro_batch(cfg, d);
}
static inline enum mt_status mt_plan_pipeline_cut(struct mt_ctx *ctx, const struct mt_config *cfg, int pp,
                                                  const char *spec, int *first)
{
    return mt_layout_pipeline_cut(ctx, cfg, pp, spec, first);
}

/* ---- the plan ------------------------------------------------------------ */

#define MT_PLAN_MAX_WORLD 65536   /* ranks the planner handles (per-rank tables) */
#define MT_PLAN_LAYOUT 1   /* keep the per-parameter layout table (mt_plan_param)        */
#define MT_PLAN_VERIFY 2   /* build every (stage, model, expert) registry and check the
                            * class claim above (costs pp*tp*ep registry builds)         */

struct mt_plan;

/* Plan `meshtrain train` with this config (resolved; the startup contract
 * already checked by the caller with mt_mesh_check_contract) and setup.
 * MT_ERR_CONFIG with the model's own message for a shape the model refuses
 * (e.g. B*T above 2^31); MT_ERR_OOM. Free with mt_plan_destroy. */
enum mt_status mt_plan_create(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_setup *su,
                              int flags, struct mt_plan **out);
void mt_plan_destroy(struct mt_ctx *ctx, struct mt_plan *p);   /* no-op on NULL */

/* Re-plan the same mesh for another choice of what the mesh does not fix
 * (auto-fit, --find-max): the registries and ZeRO layouts are kept, only
 * the batch-dependent bytes are recomputed (O(pp * L)). The startup
 * contract for the new values is the caller's to check. MT_ERR_CONFIG (the
 * model's own message) for a microbatch the model refuses (B*T >= 2^31). */
struct mt_plan_choice {
    int zero_stage, microbatches, recompute;   /* recompute: 0 none, 1 block */
    int seq_len, batch_size;
};
enum mt_status mt_plan_reselect(struct mt_ctx *ctx, struct mt_plan *p, const struct mt_plan_choice *c);
void mt_plan_get_choice(const struct mt_plan *p, struct mt_plan_choice *c);

int mt_plan_world(const struct mt_plan *p);
/* Bytes per bucket the trainer holds on `rank` while it trains: model,
 * ZeRO engines, optimizers, pipeline buffers, its own arrays. */
void mt_plan_rank_bytes(const struct mt_plan *p, int rank, size_t out[MT_BUCKET_COUNT]);
/* ---- the runtime bucket -------------------------------------------------- */

/* Memory the process holds outside mt_alloc: no allocation of meshtrain's
 * own, so no size function to share with the runtime. It is a model with a
 * few terms whose constants are MEASURED on the machine (bench/calibrate_runtime.sh
 * writes them into a profile's "runtime_memory" section; docs/plan.md has
 * the model and the table):
 *
 *   runtime = base + threads x min(per_thread + per_thread_per_column x W,
 *                                  the largest GEMM's operands)
 *               (one thread: single_thread + single_thread_per_column x W)
 *             + [world > 1] (mpi + (world-1) x mpi_per_peer + coll_scratch) + data
 *
 *   base         one rank without MPI: the binary's and libraries' resident
 *                code and data, libc/libgomp state, the main stack, malloc's slack
 *   per_thread   per OpenMP thread: OpenBLAS's per-thread GEMM pack buffers
 *                (the touched part) and the thread's stack. Measured: linear
 *                in the widest GEMM dimension W = max(V, F) (the vocabulary
 *                GEMMs pack panels along it), about 0.4 MB + 650 B x W per
 *                thread here. One thread runs OpenBLAS's serial driver, which
 *                packs less (its own two constants). A model smaller than
 *                OpenBLAS's blocks touches only its operands, 4 x D x (N + W)
 *   mpi          MPI initialised: Open MPI's, PMIx's and hwloc's code and state
 *   mpi_per_peer shared-memory transport state per other rank (FIFOs, endpoints)
 *   coll_scratch Open MPI's collective temporaries, kept in the heap by
 *                mt_dist_init's malloc thresholds. A step's ZeRO reductions
 *                are all in flight at once, so they scale with the engines'
 *                buffers B: ZeRO-0/1 all-reduce, every rank touches
 *                coll_scratch_ratio x B; ZeRO-2/3 reduce-scatter through the
 *                group's rank 0, which touches rs_scratch_ratio x B. Under
 *                TP: at least one activation (N x D floats) all-reduced.
 *   data         the token shards: mmapped and scanned whole at open, so every
 *                page is resident (file-backed, reclaimable, but in RSS) */
struct mt_plan_runtime {
    char   source[256];            /* where the constants come from             */
    double base_bytes;
    double per_thread_bytes;              /* OpenBLAS's threaded driver (threads > 1), per thread */
    double per_thread_per_column_bytes;
    double single_thread_bytes;           /* its serial driver (one thread)                        */
    double single_thread_per_column_bytes;
    double mpi_bytes;
    double mpi_per_peer_bytes;
    double coll_scratch_ratio;
    double rs_scratch_ratio;
};
/* The built-in constants: this machine's calibration (bench/profiles/cpu-local.json). */
void mt_plan_runtime_default(struct mt_plan_runtime *rt);
/* The "runtime_memory" section of a profile JSON file into rt. *found = 0
 * (rt untouched) when the file has none. MT_ERR_IO / MT_ERR_FORMAT naming
 * the file and key. */
enum mt_status mt_plan_runtime_load(struct mt_ctx *ctx, const char *path, struct mt_plan_runtime *rt, int *found);
/* The runtime bucket of a rank, term by term (bytes; total = their sum). */
struct mt_plan_runtime_terms {
    double base, threads, mpi, coll_scratch, data, total;
    double collective_bytes;   /* what coll_scratch scales (0 on one rank); not in total */
};
void mt_plan_rank_runtime(const struct mt_plan *p, int rank, struct mt_plan_runtime_terms *t);
/* The constants a plan uses. */
const struct mt_plan_runtime *mt_plan_get_runtime(const struct mt_plan *p);
/* Bytes of a rank: its buckets (mt_plan_rank_bytes) plus the runtime bucket.
 * This is what --mem-per-rank is checked against and what the receipt
 * compares with the rank's peak RSS. */
size_t mt_plan_rank_total(const struct mt_plan *p, int rank);
/* Its mt_alloc part alone (the buckets): what the allocator's peaks measure. */
size_t mt_plan_rank_alloc_total(const struct mt_plan *p, int rank);

/* The largest total over all ranks, and (if rank != NULL) the lowest rank
 * that has it. O(pp): per stage, the busiest group ranks are precomputed;
 * O(world) under ZeRO-2/3 on more than one rank, where the runtime bucket
 * differs between the ranks of a stage. */
size_t mt_plan_max_total(const struct mt_plan *p, int *rank);
/* Micro-batch sequences of the current choice. */
int mt_plan_micro(const struct mt_plan *p);

/* One parameter of the global model (registry order), as laid out. */
struct mt_plan_param {
    struct mt_param g;          /* the global registry entry: name, global shape, role, split, ... */
    int64_t local[2];           /* the box a holder stores (TP slice or whole)                   */
    int     stage;              /* pipeline stage holding it                                      */
    int     expert_rank;        /* expert coordinate holding it (routed experts under EP), else -1 */
    int     engine;             /* enum mt_plan_engine                                            */
    int     group;              /* enum mt_mesh_group it is reduced (and ZeRO-sharded) over       */
    int     group_size;
    int     owner;              /* group rank owning it whole (ZeRO >= 1: optimizer state, >= 2 grads, 3 data) */
    int     tp_split;           /* 1: each model rank holds a slice                               */
    int     reduce_model;       /* partial over the model axis (reduced over it too)              */
};
int mt_plan_n_params(const struct mt_plan *p);                  /* 0 without MT_PLAN_LAYOUT */
const struct mt_plan_param *mt_plan_param(const struct mt_plan *p, int i);

/* Ranks of parameter i: MT_PLAN_HOLDERS store it (or their slice of it)
 * between steps; MT_PLAN_OPTIMIZERS run its optimizer update. ranks needs
 * world slots; returns the count. */
enum mt_plan_ranks { MT_PLAN_HOLDERS = 0, MT_PLAN_OPTIMIZERS };
int mt_plan_param_ranks(const struct mt_plan *p, int i, enum mt_plan_ranks what, int *ranks);
/* "0-3,8,10-11" into buf (truncated with "..." if too long). */
void mt_plan_ranks_str(const int *ranks, int n, char *buf, size_t len);
/* Layout spec of parameter i: "[model, -]", "[-, model]", "[-, -]" (+ " @expert" for routed experts). */
void mt_plan_param_spec(const struct mt_plan *p, int i, char *buf, size_t len);

/* ---- cost model ---------------------------------------------------------- */

/* A device profile (bench/profiles/ *.json): what one rank can compute and
 * how fast ranks talk, inside a node and across nodes. Ranks are placed on
 * nodes in world-rank order, ranks_per_node at a time (model fastest, so a
 * TP group stays inside a node when tp <= ranks_per_node). */
/* A link: latency + volume / bandwidth per collective step (bytes/s per
 * rank and direction). Payloads above large_bytes (0: never) run at
 * large_bandwidth (gathers, point-to-point) and large_reduce_bandwidth
 * (all-reduce, reduce-scatter: the reduction runs on the host on CPUs). */
struct mt_plan_link { double bandwidth, latency, large_bytes, large_bandwidth, large_reduce_bandwidth; };
struct mt_plan_profile {
    char   name[64];
    double peak_flops;        /* one rank alone on a node (FLOP/s)                          */
    double node_peak_flops;   /* a whole node: ranks on a node share it                     */
    double efficiency;        /* fraction of peak the model's kernels reach end to end      */
    /* optional "by_precision": {"fp32": {peak_flops, efficiency}, "bf16": {...}}: a
     * device whose GEMM peak depends on the config's precision (a GPU: CUDA-core
     * fp32 vs tensor-core bf16). 0 = not given: the top-level numbers apply. */
    double peak_fp32, efficiency_fp32, peak_bf16, efficiency_bf16;
    double memory_bytes;      /* per rank (0: unknown)                                      */
    double overlap;           /* fraction of overlappable collective time hidden by compute */
    int    ranks_per_node;
    int    cores_per_node;           /* CPU profiles: more ranks than cores on a node ...     */
    double oversubscribed_latency;   /* ... make every collective step this slow (0: ignore) */
    struct mt_plan_link intra, inter;
    /* optional, for the per-op-kind breakdown (mt_plan_cost_kinds); 0 = not given:
     * memory_bandwidth_bytes_per_s (bytes read + written per second), else twice
     * measured.device_copy_bytes_per_s (cuda_calib: each byte read once, written once);
     * measured.attention_{fwd,bwd,fwd_bwd}_flop_per_s (causal FLOPs, cuda_calib's count);
     * measured.scan_fwd_bwd_flop_per_s; measured.attention_bf16_fwd_bwd_flop_per_s and
     * measured.scan_bf16_fwd_bwd_flop_per_s (precision=bf16's tensor-core kernels: used
     * when the config is bf16); measured.gemm_grouped_bf16_flop_per_s (the MoE experts'
     * grouped kernels, cuda_calib's grouped rows at the default tile);
     * measured.gemm_grouped_wgmma_bf16_flop_per_s (the same on wgmma: knob
     * grouped_gemm_kernel=wgmma, its checked rows); measured.muon_ns_bf16_flop_per_s
     * (Muon's batched bf16 Newton–Schulz, cuda_calib's muon_ns rows: the optimizer's
     * rate when that iteration runs) */
    double mem_bandwidth, attn_fwd_rate, attn_bwd_rate, attn_rate, scan_rate, attn_bf16_rate, scan_bf16_rate;
    double grouped_bf16_rate, grouped_wgmma_bf16_rate, muon_ns_bf16_rate;
    char   mem_basis[64], attn_precision[16];
};
/* Load a profile JSON file. MT_ERR_IO / MT_ERR_FORMAT naming the file and key. */
enum mt_status mt_plan_profile_load(struct mt_ctx *ctx, const char *path, struct mt_plan_profile *prof);

/* Predicted step time, per rank on the slowest stage. Seconds per step. */
struct mt_plan_cost {
    double flops_per_step;     /* model FLOPs of the whole step (MFU convention, all ranks)     */
    double rank_flops;         /* model FLOPs the busiest rank runs (its stage, recompute)      */
    double optimizer_flops;    /* Newton–Schulz FLOPs of the Muon updates it runs               */
    double peak_per_rank;      /* FLOP/s one rank has (profile, ranks sharing a node)           */
    double efficiency;         /* the fraction of it reached (profile, for the precision)       */
    const char *peak_basis;    /* "fp32" / "bf16" (by_precision entry used) or "profile"        */
    double optimizer_rate;     /* FLOP/s of the optimizer's GEMMs (Muon's Newton–Schulz: bf16 in
                                * precision=bf16 with knob muon_ns_bf16, or where cuda_precision=bf16
                                * makes the table's fp32 gemm bf16; fp32 otherwise) */
    const char *optimizer_basis; /* the by_precision entry it used ("fp32", "bf16") or "profile";
                                  * "measured (...)": the profile's muon_ns_bf16_flop_per_s      */
    double compute_s;          /* busiest rank's compute: microbatches + optimizer              */
    double tp_s, ep_s, pp_s;   /* model / expert / pipe axis collectives (blocking: exposed)    */
    double dp_s;               /* ZeRO / data-parallel collectives, all of them                 */
    double dp_exposed_s;       /* what overlap does not hide                                    */
    double bubble_s;           /* pipeline fill and drain: (pp-1) x slowest microbatch          */
    double step_s;             /* the prediction                                                */
    double tokens_per_s, mfu;
};
void mt_plan_cost(const struct mt_plan *p, const struct mt_plan_profile *prof, struct mt_plan_cost *out);

/* The predicted step by op kind, one rank of the slowest stage (docs/plan.md
 * section 5, "By op kind"): each kind's FLOPs and bytes per step from the
 * model's shapes, its time the roofline max(FLOPs / rate, bytes / memory
 * bandwidth) with the profile's rates (GEMMs at peak x efficiency for the
 * precision; attention at its measured rate where the profile has one, else
 * the GEMM rate; norms, elementwise, cross-entropy and the optimizer's
 * passes at the memory bandwidth); comm = the cost model's exposed
 * collectives; bubble = (pp-1) microbatches of the stage. step_s is their
 * sum. valid = 0 (all zero) when the profile has no memory bandwidth. */
enum mt_plan_kind {
    MT_PLAN_KIND_GEMM = 0, MT_PLAN_KIND_ATTENTION_FWD, MT_PLAN_KIND_ATTENTION_BWD, MT_PLAN_KIND_NORM,
    MT_PLAN_KIND_ELEMENTWISE, MT_PLAN_KIND_XENT, MT_PLAN_KIND_OPTIMIZER, MT_PLAN_KIND_SCAN,
    MT_PLAN_KIND_COMM, MT_PLAN_KIND_BUBBLE, MT_PLAN_KIND_COUNT
};
struct mt_plan_kinds {
    int    valid, stage;                 /* the stage described                                */
    double s[MT_PLAN_KIND_COUNT];        /* seconds per step                                   */
    double flops[MT_PLAN_KIND_COUNT];    /* per step of this rank (0 for comm, bubble)         */
    double bytes[MT_PLAN_KIND_COUNT];    /* bytes read + written per step of this rank         */
    double step_s;                       /* sum of s[]                                         */
    double gemm_rate, attn_fwd_rate, attn_bwd_rate, scan_rate, mem_bandwidth;   /* the rates used */
    const char *attn_basis, *scan_basis; /* "measured" or "gemm rate"                          */
    /* of flops[GEMM]: the MoE experts' products on the grouped kernels (precision=bf16,
     * the device-sized path), at grouped_rate (measured, else the GEMM rate: basis says) */
    double grouped_flops, grouped_rate;
    const char *grouped_basis;
    double optimizer_rate;               /* Newton–Schulz's GEMMs (mt_plan_cost's)              */
    const char *optimizer_basis;
};
const char *mt_plan_kind_name(enum mt_plan_kind k);
void mt_plan_cost_kinds(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                        struct mt_plan_kinds *out);

/* ---- output -------------------------------------------------------------- */

/* The plan as JSON text (malloc'ed; free()): schema "meshtrain.plan/1" with
 * the mesh, batch geometry, the layout table (if kept), every rank's memory
 * per bucket, and the cost section if cost != NULL. Key order and number
 * formats are fixed: the output is stable (tests/golden/). NULL on OOM. */
char *mt_plan_json(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost);
/* One rank's buckets as a JSON object text {"params": .., ..., "total": ..} into buf. */
void mt_plan_bytes_json(const size_t *bytes, char *buf, size_t len);

/* The config and setup a plan was made for. */
const struct mt_config *mt_plan_config(const struct mt_plan *p);
const struct mt_plan_setup *mt_plan_get_setup(const struct mt_plan *p);

#endif /* MT_PLAN_H */
