/*
 * mt_blocks.h — the block-kind table: what each pattern letter is made of.
 *
 * A block kind (one letter of cfg->pattern) is a SEQUENCE of pieces (steps),
 * each a sub-layer on the residual stream with its own input norm and a
 * residual policy, optionally inside a wrapper (a router around the whole
 * sequence: Mixture-of-Depths). Step i reads the stream s_i and writes
 * s_{i+1}; s_0 is the block's input, s_n its output:
 *
 *     MT_RESID_NONE  s_{i+1} = piece(s_i)         the piece writes the stream itself
 *                                                 (its norm and residual add fused inside)
 *     MT_RESID_ADD   s_{i+1} = s_i + piece(rmsnorm(s_i) * g_i)
 *                                                 the block runs the norm and the add; the
 *                                                 piece sees the normed rows, adds its branch
 *
 *     kind  steps (all MT_RESID_NONE)   file of the pieces
 *     A     attention, dense MLP        attention.c, mlp.c
 *     E     attention, MoE              attention.c, moe.c
 *     M     Mamba-3, dense MLP          mamba.c (wrapping mamba3.c), mlp.c
 *
 * (The three kinds of the table fuse the norm and the residual add into their
 * kernels: rmsnorm_resid_forward writes x_in's copy, the output GEMM adds onto
 * it with beta 1; so they are MT_RESID_NONE, and bit-identical to the time a
 * block was exactly mixer + ffn.)
 *
 * A piece (struct mt_piece) declares everything the rest of the runtime
 * needs to know about it, in one place:
 *   - its parameters: HF suffix, global shape, layout class (how the model
 *     and expert axes hold it, see enum mt_layout), init, role (optimizer
 *     class: Muon for block matrices except the router, AdamW otherwise),
 *     and which field it binds to (MT_BIND / MT_BIND_OWN, model_impl.h);
 *   - its dims, derived from the config's keys (struct mt_block_shape
 *     carries the config and only the dims every block shares);
 *   - its FLOPs per token (matmul parameters active per token, plus any
 *     non-parameter FLOPs such as attention scores) and its work for the
 *     planner's time model (work_per_token, by op kind);
 *   - its saved activations and scratch (carve: one function run with NULL
 *     bases for the plan and with arenas for the model, so they agree), in
 *     structs of its own the model only sizes (state_bytes per layer,
 *     own_bytes per model), and its decode state (decode_floats);
 *   - its forward and backward, and what a recompute must undo.
 *
 * The parameter registry of a model (names, boxes, reduction rules, export
 * names) is built once by walking the table (mt_blocks_params) and every
 * consumer reads that registry: the model binds its layers from it, the
 * planner sizes from it, checkpoints and export list it, receipts count it.
 *
 * The table is mt_block_kinds.def, one MT_BLOCK_KIND line per letter listing
 * its steps. Adding a block kind = one piece file (its params, flops, carve,
 * forward, backward) or none (a new sequence of existing pieces), one line in
 * mt_block_kinds.def, and its kernels in the ops table. See
 * docs/architecture.md, "Block kinds".
 */
#ifndef MT_BLOCKS_H
#define MT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_config.h"
#include "../core/mt_param.h"

/*
 * Layout class of a parameter: how the mesh holds it and which group its
 * gradient must be reduced over beyond the data group. This is the one
 * rule the planner and the trainer's layout module read (via mt_param.layout,
 * mt_layout_split and mt_layout_reduce_model); nothing else should decide
 * it from names or roles.
 */
enum mt_layout {
    MT_LAYOUT_RESIDUAL = 0, /* acts on residual-stream rows (norm gains, embedding, head):
                             * whole on every model rank; grad partial over the model group
                             * iff sequence parallel (each rank saw its N/tp rows)         */
    MT_LAYOUT_TP_ROWS,      /* column-parallel matrix (Wq, Wk, Wv, Wg, Wu): rows split over
                             * the model group (whole heads / hidden units); grad complete */
    MT_LAYOUT_TP_COLS,      /* row-parallel matrix (Wo, Wd): columns split; grad complete  */
    MT_LAYOUT_MODEL_PARTIAL,/* whole on every model rank, grad a partial sum over the model
                             * group whenever tp > 1: qk-norm gains (shared by split heads),
                             * router and shared expert (they run on N/tp rows)           */
    MT_LAYOUT_EXPERT,       /* a routed expert's matrix: whole, held by one expert rank;
                             * under tp > 1 partial over the model group like the router  */
    MT_LAYOUT_COUNT
};

/* Which dimension the model axis splits (mt_param.split). */
static inline enum mt_split mt_layout_split(enum mt_layout l)
{
    return l == MT_LAYOUT_TP_ROWS ? MT_SPLIT_ROWS : l == MT_LAYOUT_TP_COLS ? MT_SPLIT_COLS : MT_SPLIT_NONE;
}

/* 1: under this (tp, sp) the rank's grad is a partial sum over the model group. */
static inline int mt_layout_reduce_model(enum mt_layout l, int tp, int sp)
{
    if (tp <= 1) return 0;
    switch (l) {
    case MT_LAYOUT_RESIDUAL:      return sp != 0;
    case MT_LAYOUT_MODEL_PARTIAL: return 1;
    case MT_LAYOUT_EXPERT:        return 1;
    default:                      return 0;
    }
}

const char *mt_layout_name(enum mt_layout l);   /* "residual", "tp_rows", ... */

/* Initial value of a parameter, resolved to (init, init_std) by the registry:
 * NORMAL 0.02, NORMAL_OUT 0.02/sqrt(2 L) (projections back into the residual
 * stream, GPT-2 style), ONES for gains. */
enum mt_init_scale { MT_SCALE_NORMAL = 0, MT_SCALE_NORMAL_OUT, MT_SCALE_ONES,
                      MT_SCALE_DT_BIAS, MT_SCALE_A_LOG,   /* Mamba-3 (SPEC 1c), see mt_param.h */
                      MT_SCALE_LORA_A,    /* a LoRA A: normal(0, 1/r), i.e. std 1/sqrt(r)  */
                      MT_SCALE_ZEROS };   /* a LoRA B: zeros (the adapter starts as 0)     */

/*
 * What a piece's shape functions (params, FLOPs) see: the config, from which
 * each piece derives its own dims (its keys: attention n_head, n_kv_head,
 * head_dim; the dense MLP mlp_hidden; MoE n_experts, top_k, expert_hidden,
 * ...; Mamba-3 mamba_*), and the dims every block shares. Shapes are global
 * (the model axis is NOT applied: boxes are cut by the registry from the
 * layout class); ep, ep_rank say which share of an expert-split piece this
 * rank holds (one rank: 1, 0).
 */
struct mt_block_shape {
    const struct mt_config *cfg;    /* the config the pieces read their own keys from          */
    int64_t D, T, L;                /* model width, sequence length, layers                   */
    int     tp;                     /* the model axis' degree, where a layout class depends on it
                                     * (Mamba-3 B/C: split or replicated); 0 or 1: none     */
    int     ep, ep_rank;            /* the expert axis: degree, this rank's coordinate         */
    int     scan_bf16;              /* knob scan_bf16 as the run sets it (1, the default):
                                     * the work model's Mamba-3 scan kernels (mamba.c)       */
    int     moe_dev_sizes;          /* 1 (the default): MoE may keep its expert sizes on the
                                     * device (knobs moe_sizes not host, moe_grouped on): the
                                     * work model's grouped expert path (moe.c)             */
};

/* One parameter as a piece declares it. The registry turns it into a
 * struct mt_param named "model.layers.<l>.<suffix>" (suffix printed with
 * `expert` when expert >= 0). bind: where the layer points at it — MT_BIND
 * (a field every kind has: the input norms) or MT_BIND_OWN (a field of the
 * piece's own weight struct; model_impl.h) — or -1 (bound as a range by an
 * earlier entry, e.g. experts[]). */
struct mt_pspec {
    const char        *suffix;     /* printf format with at most one %d (the expert) */
    int                expert;     /* global expert index, or -1                     */
    int                ndim;       /* 1 or 2                                         */
    int64_t            rows, cols; /* global shape (cols 1 when ndim == 1)           */
    enum mt_init_scale init;
    enum mt_param_role role;
    enum mt_layout     layout;
    int                bind;       /* MT_BIND(field), MT_BIND_OWN(type, field) or -1 */
};

/*
 * The planner's time model (plan.c): the work of one piece per token of a
 * training step (forward + backward) by the kind of op that does it, FLOPs
 * f[] and activation elements read + written e[] (the planner takes 4 bytes
 * each). The indices are the planner's op kinds (enum mt_plan_kind,
 * mt_plan.h; plan.c asserts they agree); the GEMMs' FLOPs are the planner's
 * own, from mm_per_token.
 */
enum mt_work_kind {
    MT_WORK_GEMM = 0, MT_WORK_ATTENTION_FWD, MT_WORK_ATTENTION_BWD, MT_WORK_NORM, MT_WORK_ELEMENTWISE,
    MT_WORK_XENT, MT_WORK_OPTIMIZER, MT_WORK_SCAN, MT_WORK_COUNT
};
struct mt_work {
    double f[MT_WORK_COUNT], e[MT_WORK_COUNT];
    /* of f[MT_WORK_GEMM]: the FLOPs the grouped expert kernels run (moe.c's
     * device-sized path, gemm_grouped_rows / _sum: mma.sync, not cuBLAS), which
     * the planner prices at their own rate when the profile measured one */
    double f_grouped;
};

/* Visitor a piece calls once per parameter, in registry order. */
typedef void (*mt_pspec_fn)(void *user, const struct mt_pspec *s);

struct mt_model;
struct mt_layer;
struct mt_ctx;
struct mt_carver;
struct mt_piece_ctx;

/* Per-call arguments of a piece's forward (training and incremental decoding). */
struct mt_piece_fwd {
    int          B, T, pos0;            /* rows B*T; first position (decoding: cache length)   */
    const float *cos_tab, *sin_tab;     /* RoPE tables covering positions [0, pos0 + T)         */
    int          rope_T;                /* RoPE row of row n: pos0 + n % rope_T of the tables;
                                         * 0: T (a routed block's inner call passes its
                                         * gathered tables, one row per row: rope_T = B*T) */
    float       *state;                 /* decoding: this piece's state (decode_floats of it for
                                         * t_max positions); NULL when training                 */
    int          t_max;                 /* decoding: the positions the state holds              */
    float       *x_out;                 /* the step's output stream s_{i+1} (Nr, D): NONE writes
                                         * it whole; ADD finds s_i there and adds its branch     */
    int          want_loss;             /* compute auxiliary losses                             */
    double       aux, z;                /* auxiliary loss sums (added to by the piece)          */
};

/*
 * A sub-layer: one step of a block kind. params, carve, forward and backward
 * are required; the other entries may be NULL where the piece has nothing of
 * that sort (check, FLOPs beyond its matmuls, scratch, undo_recompute).
 * Everything but the shape functions takes the narrow context (struct
 * mt_piece_ctx, model_impl.h: ops, the layer, the step's streams and input
 * norm, dims, scratch, the axis handles), never the whole model. A piece owns
 * two structs it defines in its .c file and the model only sizes: per layer
 * its saved activations (state_bytes; pc->st, filled by carve) and per model
 * its dims, scratch and staging (own_bytes; pc->own, dims filled by setup,
 * buffers by carve_scratch).
 *
 * The stream contract, by the step's residual policy (enum mt_resid):
 *   NONE: forward reads pc->x_in (s_i, Nr rows) and writes a->x_out (s_{i+1})
 *     whole; it runs its own input norm (gain pc->g, saved in pc->nm, which
 *     its carve carves) and adds the residual itself. backward reads pc->dx =
 *     d s_{i+1} and turns it into d s_i in place (ACCUMULATES its branch's
 *     d(input) into dx, which already holds the identity path).
 *   ADD: the block carves pc->nm (h_n, rstd) and runs h_n = rmsnorm(s_i) * g
 *     and s_{i+1} = s_i before the piece; forward reads pc->nm->h_n (Nr rows)
 *     and ADDS its branch into a->x_out. backward reads pc->dx = d s_{i+1}
 *     (must not change it) and OVERWRITES pc->dh (Nr, D) with d h_n; the
 *     block then accumulates the norm's backward into dx. TP collectives, if
 *     the piece splits work over the model axis, are its own (tpa_*, mt_axis.h).
 * Either way parameter grads ACCUMULATE (+=).
 */
struct mt_piece {
    const char *name;                                     /* "attention", "mlp", "moe"            */
    /* communication shape under TP, for the planner's time model: TP regions
     * a forward enters (all-gather in + reduce-scatter out with SP, one
     * all-reduce without), and all-gathers of its output without SP (pieces
     * that run in the sequence-parallel region on N/tp rows, like MoE) */
    int         tp_regions, sp_gathers;
    /* parameters in registry order (the piece's input norm first) */
    void   (*params)(const struct mt_block_shape *s, mt_pspec_fn fn, void *user);
    /* the piece's own dimension rules (dims filled, pc->ly NULL); NULL: none */
    enum mt_status (*check)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc);
    /* matmul parameters active per token (x6 for training FLOPs) */
    double (*mm_per_token)(const struct mt_block_shape *s);
    /* training FLOPs per token beyond 6 x matmul params (attention scores) */
    double (*extra_flops_per_token)(const struct mt_block_shape *s);
    /* parameters a token does not use (routed experts it is not sent to) */
    double (*inactive_params)(const struct mt_block_shape *s);
    /* the planner's time model: ADD this piece's work per token beyond its
     * GEMMs (norms, elementwise passes, attention, the scan) into w; rc 1:
     * recompute=block (the forward runs twice); NULL: none */
    void   (*work_per_token)(const struct mt_block_shape *s, int rc, struct mt_work *w);
    /* carve scratch this piece needs beyond the shared set (once per model)
     * into the piece's own scratch struct the context points at */
    void   (*carve_scratch)(const struct mt_piece_ctx *pc, struct mt_carver *c);
    /* widest SwiGLU-style hidden activation (elements) this piece needs in the shared scratch */
    size_t (*ffn_scratch)(const struct mt_piece_ctx *pc);
    /* its share of the shared projection scratch: raise *rows to the most
     * rows one projection of it sees (LoRA's x A^T, s_lora) and *cols to its
     * widest dense projection output (precision=bf16's dy copy, s_dyb); the
     * model starts from N rows and D cols; NULL: nothing beyond those */
    void   (*proj_scratch)(const struct mt_piece_ctx *pc, size_t *rows, size_t *cols);
    /* carve this piece's saved activations into pc->st (NONE: and its input
     * norm, pc->nm); c NULL-based: sizes only; pc->ly == ly */
    void   (*carve)(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly);
    enum mt_status (*forward)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a);
    /* NONE: reads dx = d(step output); ACCUMULATES d(step input) into dx.
     * ADD: reads dx, OVERWRITES dh (Nr, D) = d(normed input). Param grads += */
    enum mt_status (*backward)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc);
    /* recompute=block re-ran forward of layer pc->layer: undo its side effects (load histograms) */
    void   (*undo_recompute)(const struct mt_piece_ctx *pc);
    /* incremental decoding (infer.c): floats of one layer's decode state for
     * t_max positions (attention: its K and V rows; Mamba-3: the recurrent
     * state); NULL: the piece keeps none */
    size_t (*decode_floats)(const struct mt_piece_ctx *pc, int t_max);
    /* sizeof the piece's per-layer state struct (its saved activations,
     * defined in its .c file): the model carves one per layer (per kind
     * under recompute=block) and hands it to carve / forward / backward as
     * pc->st; 0: none */
    size_t state_bytes;
    /* sizeof the piece's per-model struct (its dims, its WORKSPACE scratch,
     * host staging; defined in its .c file): the model keeps one per
     * distinct piece (mt_blocks_piece_index) and hands it over as pc->own;
     * 0: none */
    size_t own_bytes;
    /* fill pc->own's dims from cfg and the context's dims and axes (pc->own
     * zeroed), once per model; ctx NULL when planning or checking (test
     * knobs off); NULL: nothing to fill */
    void (*setup)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_config *cfg);
};

/*
 * What a piece requires of the config and of the mesh, readable without the
 * piece's code: src/core (mt_config_resolve) and src/parallel (the mesh
 * contract) call these through block_traits.c, which links without the
 * layers and the ops. Each piece of the table has one
 * `const struct mt_piece_rules mt_piece_rules_<name>` (its MT_STEP name;
 * block_traits.c declares it from the table), defined where core links it:
 * piece_rules.c for the table's pieces, the test file for a test's. A hook runs only when some layer of the pattern uses the
 * piece, pieces in the table's order (line order, steps in order, each once),
 * the first failure returned. Its message is the whole line the user sees
 * (the mesh's with its "mesh contract: " prefix), raised with
 * mt_ctx_error(ctx, MT_ERR_CONFIG, ...).
 */
struct mt_piece_rules {
    const char *name;   /* the piece's table name: "attention", "mlp", "moe", "mamba" */
    /* the piece's config rules (its keys' divisibility, what it refuses),
     * after the pattern is parsed and head_dim, mlp_hidden, expert_hidden
     * derived; NULL: none */
    enum mt_status (*check_config)(struct mt_ctx *ctx, const struct mt_config *cfg);
    /* what it needs of one mesh axis's degree (axis: enum mt_axis, mt_mesh.h);
     * the contract asks for the model axis, then the expert axis; NULL: none */
    enum mt_status (*check_axis)(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree);
};

/* block_traits.c: run check_config / check_axis of every piece the pattern
 * uses (above); MT_OK when all pass. */
enum mt_status mt_blocks_check_config(struct mt_ctx *ctx, const struct mt_config *cfg);
enum mt_status mt_blocks_check_axis(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree);

/* How a step meets the residual stream (the stream contract above). */
enum mt_resid {
    MT_RESID_NONE = 0,   /* the piece writes the stream itself (norm + add fused inside) */
    MT_RESID_ADD,        /* pre-norm + residual add, run by the block around the piece  */
};

/* Most steps one block kind may list. */
#define MT_BLOCK_MAX_PIECES 4

/* One step of a block: a piece and how it meets the stream. */
struct mt_block_step {
    const struct mt_piece *piece;
    enum mt_resid          resid;
};

/*
 * A wrapper around a block's whole sequence of steps: where a router that
 * sends only some rows through the block sits (Mixture-of-Depths, SPEC 1e:
 * lowercase letters). The kind's steps then run on the wrapper's rows
 * instead of the block's. The slot is the contract MoD fills: every kind of
 * the table has `none` (mt_block_wrap_none, blocks.c: no hooks). The model
 * (model.c: carve_block, model_block_forward, model_block_backward, so the
 * recompute re-run too) drives a wrapper with all six row hooks (inner ..
 * enter_backward) and refuses one with some of them:
 *   params          its own parameters (the router), before the steps'
 *                   (MT_BIND_OWN binds into ly->w_wrap; the hooks get it as
 *                   pc->pw, and the block's input stream as pc->x_in;
 *                   MT_BIND_NORM is not for a wrapper)
 *   state_bytes     its saved state per layer (the selection), carved in
 *                   OTHER into ly->wst before carve runs
 *   inner           the context the steps see, from the block's (`in` starts
 *                   as a copy of it): rows N / Nr, B, T (and tp.N / tp.Nr) of
 *                   the subset, in->x_in the inner input stream and in->dx its
 *                   gradient buffer (the steps' backward turns d output into
 *                   d input there); the steps carve and run on those
 *   carve           its state, the inner input / output streams and their gradient
 *   enter / leave   forward: choose and gather the rows into the inner input
 *                   stream (and the inner call's B, T, positions, x_out);
 *                   combine the inner output into the block's x_out
 *   leave_backward / enter_backward   their conjugates: d x_out into the inner
 *                   d output (the steps then run their backward on it), the
 *                   inner d input scattered (+=) into the block's dx
 * and, optional:
 *   check           what it needs of the backend and the mesh, on the block's
 *                   context with dims only (pc->ly NULL), before allocation
 *   loss_register   registers its loss part (model_loss_add) and returns its
 *                   index; its layers' sums go to that part: enter writes the
 *                   layer's sum (one double, backend memory) at pc->wrap_loss
 *                   when the call wants losses, the model adds them up
 */
struct mt_block_wrap {
    const char *name;
    void   (*params)(const struct mt_block_shape *s, mt_pspec_fn fn, void *user);
    size_t state_bytes;
    void   (*inner)(const struct mt_piece_ctx *pc, struct mt_piece_ctx *in);
    void   (*carve)(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly);
    enum mt_status (*enter)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_fwd *a,
                            struct mt_piece_fwd *in, float **x_in);
    enum mt_status (*leave)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a,
                            const struct mt_piece_fwd *in);
    enum mt_status (*leave_backward)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_ctx *in);
    enum mt_status (*enter_backward)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_ctx *in);
    enum mt_status (*check)(struct mt_ctx *ctx, const struct mt_piece_ctx *pc);
    int    (*loss_register)(struct mt_model *m);
    /* the FLOPs convention: rows per sequence of T the steps see (the
     * block's FLOPs count at that length, times rows/T), and the
     * wrapper's own matmul parameters per token; NULL: T, 0 */
    int    (*rows)(const struct mt_config *cfg, int T);
    double (*mm_per_token)(const struct mt_block_shape *s);
    /* incremental decoding: floats of the wrapper's own decode state for
     * t_max positions, before its steps' (the layer's state: the wrapper's,
     * then the steps' in order; enter hands the steps theirs in in->state).
     * enter may set in->T = 0: no row runs the steps (leave still runs). */
    size_t (*decode_floats)(const struct mt_piece_ctx *pc, int t_max);
};

/* One pattern letter: its steps, in forward order. */
struct mt_block_kind {
    char                        letter;    /* its pattern letter                             */
    const char                 *name;      /* "attention+mlp", ...                           */
    int                         routed;    /* 1: has routed experts (load histogram, EP axis) */
    int                         hf;        /* 1: has a Hugging Face (Qwen3 / Qwen3-MoE) equivalent */
    const struct mt_block_wrap *wrap;      /* &mt_block_wrap_none (no hooks): every row runs
                                            * through the steps                               */
    int                         n_steps;   /* in [1, MT_BLOCK_MAX_PIECES]                     */
    struct mt_block_step        steps[MT_BLOCK_MAX_PIECES];
};

/* The wrapper of a kind without one (no hooks). */
extern const struct mt_block_wrap mt_block_wrap_none;

/* Most kinds the table may hold (stack arrays indexed by kind). */
#define MT_MAX_BLOCK_KINDS 12
/* Most distinct pieces (the steps of every kind). */
#define MT_MAX_PIECES (2 * MT_MAX_BLOCK_KINDS)

/* Index of the kind for `letter` in the table, or -1. */
int mt_blocks_find(char letter);
/* The table: n kinds (the index is what struct mt_layer.kind holds). The
 * functions from mt_blocks_count to mt_blocks_any_routed (block_traits.c)
 * need none of the model's code: src/core and src/parallel may call them. */
const struct mt_block_kind *mt_blocks_kind(int index);   /* blocks.c: with its pieces */
/* blocks.c: index of piece p among the table's distinct pieces (the steps
 * in line order, each once), in [0, MT_MAX_PIECES); -1: not in it. */
int mt_blocks_piece_index(const struct mt_piece *p);
int mt_blocks_count(void);
/* 1: kind `index` has a Hugging Face equivalent (export). */
int mt_blocks_kind_hf(int index);
/* 1: kind `index` runs inside a wrapper (a router: Mixture-of-Depths' a, e). */
int mt_blocks_kind_wrapped(int index);
/* 1: kind `index` has routed experts (the table's `routed`). */
int mt_blocks_kind_routed(int index);
/* "A, E": the letters of the table into buf (len >= 4 * MT_MAX_BLOCK_KINDS
 * holds them all), for error messages; returns buf. */
const char *mt_blocks_letters(char *buf, size_t len);

/* Kind index of layer l (the pattern's letter; the table's first kind past its end). */
int mt_blocks_layer_kind(const struct mt_config *cfg, int l);
/* 1 when layer l (or, _any, some layer) has routed experts. */
int mt_blocks_layer_routed(const struct mt_config *cfg, int l);
int mt_blocks_any_routed(const struct mt_config *cfg);
/* 1 when some layer's kind has the piece `piece` (its name in
 * mt_block_kinds.def: "attention", "mlp", "moe", "mamba"): the config and
 * mesh rules of a piece's own keys, without spelling a letter. */
int mt_blocks_pattern_uses(const struct mt_config *cfg, const char *piece);
/* How the model axis holds Mamba-3's B and C (SPEC 1c; mamba.c): "split" (by
 * group, mamba_ngroups % tp == 0) or "replicated"; NULL without M blocks or
 * without a model axis (tp <= 1). For the receipt. */
const char *mt_mamba_tp_mode(const struct mt_config *cfg, int tp);
int mt_blocks_layer_uses(const struct mt_config *cfg, int l, const char *piece);   /* the same for layer l */
/* The letter of kind `index` ('\0' when out of range). */
char mt_blocks_letter(int index);
/* pattern (n_layer + 1 chars) = the default kind's letter (the table's first
 * line) n_layer times: an empty `pattern` key. */
void mt_blocks_default_pattern(char *pattern, int n_layer);
/* Index of the first of pattern[0..n) that names no kind, or -1. */
int mt_blocks_pattern_check(const char *pattern, size_t n);

/* Global shape of cfg as pieces see it (one rank: ep 1, ep_rank 0; s->cfg = cfg). */
void mt_blocks_shape(const struct mt_config *cfg, struct mt_block_shape *s);

/* LoRA: the suffix of the first tensor targeted by `mask` whose layout
 * class has no adapter rule (docs/lora.md), or NULL when every one has. */
const char *mt_blocks_lora_rule(const struct mt_config *cfg, unsigned mask);

/* Walk the parameters of block l, in registry order (its wrapper's, then its
 * steps in order); _step: of step i alone, adapters included; _wrap: of its
 * wrapper alone (none without one). */
void mt_blocks_layer_wrap_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, mt_pspec_fn fn,
                                 void *user);
void mt_blocks_layer_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, mt_pspec_fn fn,
                            void *user);
void mt_blocks_layer_step_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, int step,
                                 mt_pspec_fn fn, void *user);
/* The same for a block of kind `kind` outside the pattern (an MTP module's block). */
void mt_blocks_kind_step_params(const struct mt_config *cfg, const struct mt_block_shape *s, int kind, int step,
                                mt_pspec_fn fn, void *user);
/* FLOPs per token of one block of kind `kind` (6 x matmul params + extra). */
double mt_blocks_kind_flops(const struct mt_block_shape *s, int kind);

/* Training FLOPs per token of block l: 6 x matmul params active + extra. */
double mt_blocks_layer_flops(const struct mt_config *cfg, const struct mt_block_shape *s, int l);
/* Per-layer TP communication counts of layers [l0, l1), for the planner:
 * TP regions of the first step (mixer) and of the later ones (ffn),
 * SP-region output gathers, routed layers; with l1 = n_layer (the last
 * stage) the MTP modules' blocks too. */
struct mt_blocks_comm {
    double mixer_regions, ffn_regions, sp_gathers;   /* a routed (wrapped) block's count as its rows share C/T:
                                                      * its regions carry B C rows, not B T */
    int    routed;
};
void mt_blocks_comm_counts(const struct mt_config *cfg, int l0, int l1, struct mt_blocks_comm *out);

/* The planner's work per token of block l beyond its GEMMs: each step's
 * work_per_token in order, ADDED into w (rc: recompute=block). */
void mt_blocks_layer_work(const struct mt_config *cfg, const struct mt_block_shape *s, int l, int rc,
                          struct mt_work *w);

/* Parameters of block l no token uses (unrouted experts), for active counts. */
double mt_blocks_layer_inactive(const struct mt_config *cfg, const struct mt_block_shape *s, int l);
/* Matmul parameters of block l active per token. */
double mt_blocks_layer_mm(const struct mt_config *cfg, const struct mt_block_shape *s, int l);
/* Non-parameter FLOPs per token of block l (attention scores and values). */
double mt_blocks_layer_extra(const struct mt_config *cfg, const struct mt_block_shape *s, int l);

#endif /* MT_BLOCKS_H */
