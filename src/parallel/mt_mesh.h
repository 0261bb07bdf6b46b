/*
 * mt_mesh.h — the named device mesh `pipe x data x expert x model`.
 *
 * SPEC.md section 2. Ranks form a 4-D grid with sizes pp, dp, ep, tp
 * (pp*dp*ep*tp == world); `model` varies fastest, so a TP group is a run of
 * contiguous ranks on one host:
 *
 *     rank = ((pipe*dp + data)*ep + expert)*tp + model
 *
 * Each rank joins one group per kind below. A group's ranks are the ranks
 * that share every coordinate NOT in the group; inside a group, ranks are
 * ordered by world rank, so for a one-axis group the comm rank equals the
 * coordinate on that axis (model group rank == model coordinate).
 *
 *   group        axes                 used for
 *   world        all                  loss / norm reductions, barriers
 *   model        model                TP collectives, SP gather/scatter
 *   expert       expert               MoE token all-to-all
 *   data         data                 expert-weight gradients
 *   data_expert  data x expert        dense gradients (effective dp = dp*ep)
 *   data_model   data x model         expert gradients when tp > 1 (SP routing)
 *   stage        data x expert x model gains/router gradients under SP
 *                                     (= every rank of one pipeline stage)
 *   pipe         pipe                 pipeline P2P
 *
 * A communicator whose member set equals one already built is reused, not
 * created again (every single-rank group shares one self communicator).
 * These communicators work on host memory. A GPU run also asks for device
 * communicators (mt_mesh_create_nccl / mt_mesh_device_comm, below): NCCL
 * between ranks, the backend's copy within one.
 * Derived predicates come from the degrees only, never from whether some
 * communicator object exists.
 *
 * Example (tools/):
 *     struct mt_mesh_dims d;
 *     MT_CHECK(mt_mesh_parse(ctx, "pp=1,tp=2", world, &d));         // dp derived
 *     MT_CHECK(mt_mesh_check_contract(ctx, &d, &cfg, world, cfg.microbatches));
 *     struct mt_mesh *mesh;
 *     MT_CHECK(mt_mesh_create(ctx, &d, &cfg, zero_stage, &mesh));    // collective over world
 *     char line[1024]; mt_mesh_trace_line(mesh, line, sizeof line); puts(line);
 *     mt_comm_allreduce(ctx, mt_mesh_comm(mesh, MT_MESH_GROUP_DATA_EXPERT), g, n, MT_DTYPE_F32, MT_REDOP_SUM);
 *     mt_mesh_destroy(mesh);
 */
#ifndef MT_MESH_H
#define MT_MESH_H

#include <stddef.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "mt_comm.h"

/* Upper bound on one degree (parse rejects more). */
#define MT_MESH_MAX_DEGREE 65536

/* The axes, outermost first: rank = ((pipe*dp + data)*ep + expert)*tp + model.
 * An axis is data: its name, its position here and its row in mesh.c's axis
 * table; the groups (below) are sets of axes. Adding an axis (context
 * parallel) is one entry here, one table row, the groups that span it and the
 * collective its layers issue. */
enum mt_axis { MT_AXIS_PP = 0, MT_AXIS_DP, MT_AXIS_EP, MT_AXIS_TP, MT_AXIS_COUNT };

/* Degrees, indexed by axis (deg[MT_AXIS_TP] is tp), and whether sequence
 * parallelism is on: sp = 1 iff tp > 1 and the config's sequence_parallel
 * (mt_mesh_dims_set_sp). The layout rules read sp (a residual-row parameter's
 * grad is a partial sum over the model group only under SP). mt_mesh_parse
 * leaves sp 0; sp is not part of the mesh string (mt_mesh_dims_str). The
 * named members alias the array for the code that reads one axis by name. */
struct mt_mesh_dims {
    union {
        int deg[MT_AXIS_COUNT];
        struct { int pp, dp, ep, tp; };
    };
    int sp;
};

/* This rank's position on each axis (at[MT_AXIS_TP] is the model coordinate). */
struct mt_mesh_coord {
    union {
        int at[MT_AXIS_COUNT];
        struct { int pipe, data, expert, model; };
    };
};

/* "pp" / "pipe" ... of an axis (short_name NULL-safe: "?" out of range). */
const char *mt_axis_name(enum mt_axis a);
const char *mt_axis_long_name(enum mt_axis a);

/* Creation order (also the order of MPI_Comm_split calls and of the trace). */
enum mt_mesh_group {
    MT_MESH_GROUP_WORLD = 0,
    MT_MESH_GROUP_MODEL,
    MT_MESH_GROUP_EXPERT,
    MT_MESH_GROUP_DATA,
    MT_MESH_GROUP_DATA_EXPERT,
    MT_MESH_GROUP_DATA_MODEL,
    MT_MESH_GROUP_STAGE,
    MT_MESH_GROUP_PIPE,
    MT_MESH_GROUP_COUNT
};

/* Derived predicates (from degrees and this rank's coordinates only). */
struct mt_mesh_preds {
    int ep_active;   /* ep > 1                                   */
    int tp_active;   /* tp > 1                                   */
    int sp_on;       /* tp > 1 && cfg->sequence_parallel         */
    int dp_active;   /* dp > 1                                   */
    int pp_active;   /* pp > 1                                   */
    int pp_stage;    /* this rank's pipe coordinate              */
    int grad_dp;     /* dp * ep: replicas of a dense parameter   */
    int zero_stage;  /* as passed in (0..3)                      */
};

/* ---- pure functions (no MPI, no allocation) ---------------------- */

/* Parse "pp=2,dp=2,ep=1,tp=2" (also pipe=/data=/expert=/model=; any order;
 * omitted axes are 1; NULL or "" is all ones). When dp is omitted and
 * world > 0, dp = world / (pp*ep*tp). When world > 0 the product must equal
 * it. Errors (one line naming the rule and the numbers):
 *   MT_ERR_INVALID_ARG  unknown axis, degree not a positive integer (or
 *                       > MT_MESH_MAX_DEGREE), duplicate axis, bad syntax;
 *   MT_ERR_CONFIG       world not divisible when deriving dp, product != world.
 * *out is written only on success. */
enum mt_status mt_mesh_parse(struct mt_ctx *ctx, const char *spec, int world, struct mt_mesh_dims *out);

/* "pp=1,dp=2,ep=1,tp=2" (the checkpoint manifest's mesh string). */
void mt_mesh_dims_str(const struct mt_mesh_dims *d, char *buf, size_t n);
/* d->sp = tp > 1 && cfg->sequence_parallel (cfg NULL: taken as on, as in
 * mt_mesh_derive_preds). */
void mt_mesh_dims_set_sp(struct mt_mesh_dims *d, const struct mt_config *cfg);
/* pp*dp*ep*tp (as long long: no overflow for valid degrees). */
long long mt_mesh_dims_world(const struct mt_mesh_dims *d);

int  mt_mesh_rank_of(const struct mt_mesh_dims *d, const struct mt_mesh_coord *c);
void mt_mesh_coord_of(const struct mt_mesh_dims *d, int rank, struct mt_mesh_coord *c);

const char *mt_mesh_group_name(enum mt_mesh_group g); /* "world", "model", "data_expert", ... */
/* Number of ranks in a group of kind g. */
int mt_mesh_group_size(const struct mt_mesh_dims *d, enum mt_mesh_group g);
/* World ranks of the group of kind g that `rank` joins, ascending (= comm
 * rank order). members needs mt_mesh_group_size() slots; may be NULL to
 * only count. Returns the count. */
int mt_mesh_group_members(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g, int *members);
/* Reuse plan: the first group kind (in creation order) whose member set on
 * `rank` equals that of g; g itself when g gets a communicator of its own.
 * Single-rank groups all resolve to the first single-rank kind (one self
 * communicator). Same answer on every rank (it depends on degrees only). */
enum mt_mesh_group mt_mesh_group_source(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g);

/* The startup contract of SPEC.md section 2, checked before any allocation.
 * cfg should be resolved (mt_config_resolve); a 0 mlp_hidden or an empty
 * pattern are derived here the same way. microbatches <= 0 means
 * cfg->microbatches (1 if that is 0 too). Rules, in this order:
 *   world == pp*dp*ep*tp; n_head % tp; n_kv_head % tp; (n_head + 2*n_kv_head) % tp;
 *   mlp_hidden % tp; n_experts % ep and top_k <= n_experts (when any E block);
 *   n_layer >= pp; batch_size % (dp*ep*microbatches); seq_len % tp (SP on, tp > 1).
 * The first violation -> MT_ERR_CONFIG, e.g.
 *   "mesh contract: n_head % tp != 0 (n_head=4, tp=3)". */
enum mt_status mt_mesh_check_contract(struct mt_ctx *ctx, const struct mt_mesh_dims *d,
                                      const struct mt_config *cfg, int world, int microbatches);

/* Predicates from degrees. cfg may be NULL (sequence_parallel taken as on). */
void mt_mesh_derive_preds(const struct mt_mesh_dims *d, const struct mt_mesh_coord *c,
                          const struct mt_config *cfg, int zero_stage, struct mt_mesh_preds *out);

/* ---- the live mesh ------------------------------------------------ */

struct mt_mesh; /* opaque */

/* Build this rank's communicators. Collective over the world: every rank
 * must call it with the same dims. The world is MPI's when MPI is up (see
 * mt_dist_init), otherwise one rank. Checks, before any collective or
 * allocation, that dims are >= 1 and multiply to the world size
 * (MT_ERR_CONFIG otherwise, identically on every rank: no hang).
 * cfg (may be NULL) and zero_stage only feed the predicates. ctx must
 * outlive the mesh. On failure *out is NULL. Free with mt_mesh_destroy. */
enum mt_status mt_mesh_create(struct mt_ctx *ctx, const struct mt_mesh_dims *d, const struct mt_config *cfg,
                              int zero_stage, struct mt_mesh **out);
void mt_mesh_destroy(struct mt_mesh *mesh); /* no-op on NULL; frees each distinct comm once */

/* ---- GPU runs: device communicators next to the host ones ---------- */

/* How a GPU rank builds its device communicators. */
struct mt_mesh_nccl_opts {
    int    device;   /* CUDA ordinal of this rank (NCCL binds it; unused on a world of one) */
    void  *stream;   /* cudaStream_t (as void *) that produces the buffers the
                        collectives read — the cuda backend's mt_ops_cuda_stream();
                        every NCCL operation waits for the work queued there
                        (NULL: the legacy default stream only)                   */
    void (*copy)(void *be, void *dst, const void *src, size_t bytes);
                     /* the backend's copy (ops->copy), required: the single-rank
                        groups move backend buffers with it, never with memmove */
    void  *copy_be;  /* the backend instance copy receives (ops->be) */
};

/* mt_mesh_create, plus one device communicator per group for collectives on
 * backend (device) buffers; collective over the world. The host
 * communicators (mt_mesh_comm) are built exactly as mt_mesh_create builds
 * them and keep serving host values (losses, norms, counts, hashes). The
 * device ones (mt_mesh_device_comm) follow the same groups and reuse:
 *   world of one rank     -> every group is one "self_dev" comm: a self comm
 *                            whose copies go through opts->copy (no NCCL, no
 *                            MPI: a single-GPU run needs neither);
 *   world of N > 1        -> an NCCL world over the MPI world (MPI broadcasts
 *                            the unique id; mt_comm_nccl_create_world), NCCL
 *                            splits for multi-rank groups, and the self_dev
 *                            comm for single-rank groups; each NCCL comm
 *                            fences on opts->stream.
 * Errors (identical on every rank, before any collective):
 * MT_ERR_INVALID_ARG for NULL opts or opts->copy; MT_ERR_UNSUPPORTED for a
 * world > 1 in a build without MT_WITH_NCCL; then as mt_mesh_create, and
 * NCCL/CUDA failures as mt_comm_nccl_create_world reports them. Free with
 * mt_mesh_destroy (device comms are destroyed before the host ones). */
enum mt_status mt_mesh_create_nccl(struct mt_ctx *ctx, const struct mt_mesh_dims *d, const struct mt_config *cfg,
                                   int zero_stage, const struct mt_mesh_nccl_opts *opts, struct mt_mesh **out);

/* The communicator for BACKEND buffers of group g: the device one on a mesh
 * from mt_mesh_create_nccl, the host one (same as mt_mesh_comm) otherwise —
 * on the cpu backend, backend buffers are host memory. Owned by the mesh. */
struct mt_comm *mt_mesh_device_comm(const struct mt_mesh *mesh, enum mt_mesh_group g);
/* 1 if the mesh came from mt_mesh_create_nccl. */
int mt_mesh_has_device_comms(const struct mt_mesh *mesh);

/* Accessors. The comm belongs to the mesh (do not destroy it). */
struct mt_comm *mt_mesh_comm(const struct mt_mesh *mesh, enum mt_mesh_group g);
int  mt_mesh_rank(const struct mt_mesh *mesh);   /* world rank */
int  mt_mesh_world(const struct mt_mesh *mesh);  /* world size */
const struct mt_mesh_dims  *mt_mesh_get_dims(const struct mt_mesh *mesh);
const struct mt_mesh_coord *mt_mesh_get_coord(const struct mt_mesh *mesh);
const struct mt_mesh_preds *mt_mesh_get_preds(const struct mt_mesh *mesh);
/* 1 if group g shares the communicator of an earlier group (or of the self
 * group); *source (may be NULL) receives that group. */
int  mt_mesh_group_reused(const struct mt_mesh *mesh, enum mt_mesh_group g, enum mt_mesh_group *source);

static inline struct mt_comm *mt_mesh_world_comm(const struct mt_mesh *m)       { return mt_mesh_comm(m, MT_MESH_GROUP_WORLD); }
static inline struct mt_comm *mt_mesh_model_comm(const struct mt_mesh *m)       { return mt_mesh_comm(m, MT_MESH_GROUP_MODEL); }
static inline struct mt_comm *mt_mesh_expert_comm(const struct mt_mesh *m)      { return mt_mesh_comm(m, MT_MESH_GROUP_EXPERT); }
static inline struct mt_comm *mt_mesh_data_comm(const struct mt_mesh *m)        { return mt_mesh_comm(m, MT_MESH_GROUP_DATA); }
static inline struct mt_comm *mt_mesh_data_expert_comm(const struct mt_mesh *m) { return mt_mesh_comm(m, MT_MESH_GROUP_DATA_EXPERT); }
static inline struct mt_comm *mt_mesh_data_model_comm(const struct mt_mesh *m)  { return mt_mesh_comm(m, MT_MESH_GROUP_DATA_MODEL); }
static inline struct mt_comm *mt_mesh_stage_comm(const struct mt_mesh *m)       { return mt_mesh_comm(m, MT_MESH_GROUP_STAGE); }
static inline struct mt_comm *mt_mesh_pipe_comm(const struct mt_mesh *m)        { return mt_mesh_comm(m, MT_MESH_GROUP_PIPE); }

/* The step-0 trace line (no newline), e.g.
 *   mesh rank=3 coord(pipe=0,data=1,expert=0,model=1) world{size=4 members=[0,1,2,3] impl=mpi reused=no}
 *   model{size=2 members=[2,3] impl=mpi reused=no} expert{size=1 members=[3] impl=self reused=no}
 *   ... data_expert{size=2 members=[1,3] impl=mpi reused=data} ...
 *   ep_active=0 tp_active=1 sp_on=1 dp_active=1 pp_active=0 pp_stage=0 grad_dp=2 zero_stage=1
 * Member lists longer than 16 are abbreviated "[a,b,c,...,z]". On a mesh
 * with device communicators each group also says " dev=nccl" or
 * " dev=self_dev" before its closing brace. Truncated to n-1 characters;
 * returns the length it wanted (snprintf). */
size_t mt_mesh_trace_line(const struct mt_mesh *mesh, char *buf, size_t n);
/* The line the trainer prints: the same as mt_mesh_trace_line, except on a
 * one-rank mesh, where the seven groups that are all the world's
 * communicator are named once: "model,expert,...,pipe{=world}". */
size_t mt_mesh_trace_line_brief(const struct mt_mesh *mesh, char *buf, size_t n);

#endif /* MT_MESH_H */
