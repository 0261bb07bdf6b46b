/*
 * mt_optim.h — the optimizer table (AdamW, Muon), global-norm clipping, schedule.
 *
 * Exactly SPEC.md section 1b. An optimizer is a `struct mt_optim_i`, like a
 * backend is a `struct mt_ops_i`: its name, its per-parameter state tensors
 * and their checkpoint names, the roles it accepts, the facts the planner
 * counts, and its update. The built-in table (src/optim/optim.c) is
 * indexed by `enum mt_optim_kind` (`param->optim`); each entry lives in its
 * own file (src/optim/adamw.c, muon.c). The role-to-optimizer rule
 * (mt_optim_kind_for) lives here too; the model only calls it.
 *
 * The optimizer object owns its state tensors (same box as their parameter,
 * bucket OPTIM) and each class's workspace (bucket WORKSPACE). Muon
 * orthogonalises the FULL matrix; on one rank the local box is the full
 * matrix (TP gathers it, mt_optim_set_tp_comm).
 *
 * State tensor names (checkpoints): "<param>.<state name>", e.g.
 * "<param>.exp_avg", "<param>.exp_avg_sq" (AdamW), "<param>.momentum_buffer"
 * (Muon). The checkpoint's optimizer entries are these, in parameter order.
 *
 * Adding an optimizer: a file with its `const struct mt_optim_i`, its
 * declaration and one line in the table (optim.c), its kernels in the ops tables if it needs new ones (and its
 * name in the `optimizer` config key to make it selectable). A test may
 * also pass its own table to mt_optim_create_with (tests/test_optim_table.c).
 */
#ifndef MT_OPTIM_H
#define MT_OPTIM_H

#include <stddef.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../ops/mt_ops.h"

struct mt_optim;
struct mt_comm;

#define MT_OPTIM_MAX_STATES  4   /* state tensors per parameter, at most          */
#define MT_OPTIM_MAX_WS      10  /* workspace buffers per optimizer class, at most */
#define MT_OPTIM_MAX_CLASSES 8   /* entries of one optimizer table, at most        */

/* One parameter the optimizer updates and its state tensors (s[j]: numel
 * floats, backend memory; NULL past the class's n_states, all NULL when
 * the parameter is frozen). */
struct mt_optim_slot {
    struct mt_param *p;
    float           *s[MT_OPTIM_MAX_STATES];
};

/* What a class's update sees: the same for every class in one step. */
struct mt_optim_run {
    const struct mt_ops_i  *ops;
    const struct mt_config *cfg;
    struct mt_comm         *tp_comm;            /* model group (TP), or NULL          */
    long                    t;                  /* this update's number, from 1       */
    double                  lr_factor;          /* mt_optim_lr_factor of this step    */
    float                   gscale;             /* the clip's scale for a class that
                                                 * takes it (takes_gscale): g reads as
                                                 * gscale * g; 1: no clip this step   */
    float                  *ws[MT_OPTIM_MAX_WS]; /* the class's workspace (ws_sizes)  */
    struct mt_optim_slot  **scratch;            /* host scratch of as many slot pointers
                                                 * as the step's list (whole_list classes:
                                                 * Muon groups its list there by shape)   */
};

/* An optimizer class: one table entry. Hooks may be NULL where noted. */
struct mt_optim_i {
    const char *name;                               /* config value and plan column: "adamw"   */
    int         n_states;                           /* state tensors per parameter (<= MAX)    */
    const char *state_names[MT_OPTIM_MAX_STATES];   /* checkpoint entry "<param>.<name>"       */
    unsigned    roles;                              /* roles it accepts: bits 1u << mt_param_role */
    int         matrices_only;                      /* 1: 2-D parameters only                  */
    int         whole_matrix;                       /* 1: runs on the FULL matrix: a TP-split
                                                     * parameter's update is all-gathered over
                                                     * the model group (planner: 2 x global
                                                     * numel floats moved)                     */
    double      pass_bytes;                         /* planner: bytes its elementwise update
                                                     * reads + writes per parameter element   */
    double      shadow_bytes;                       /* planner: bytes a bf16 shadow of a matrix
                                                     * it updates costs per element a step
                                                     * (precision=bf16): 2 when its pass writes
                                                     * the shadow, 6 when the next forward's
                                                     * refresh reads p and writes it          */
    int         whole_list;                         /* 1: step gets all of its parameters in
                                                     * one list (Muon: batches of a shape
                                                     * across the model); 0: lists of up to
                                                     * MT_OPS_LIST_MAX                        */
    int         takes_gscale;                       /* 1: its step applies run->gscale (the
                                                     * gradient clip) itself; 0: the clip
                                                     * scales its gradients in place first   */
    /* planner: FLOPs of one update beyond the elementwise pass (NULL: 0) */
    double (*flops)(const struct mt_param *p);
    /* planner: bytes one update reads + writes beyond pass_bytes per element
     * (Muon: Newton–Schulz's elementwise passes on the full matrix; bf16: the
     * batched bf16 iteration's, mt_optim_muon_ns_bf16); NULL: 0 */
    double (*extra_bytes)(const struct mt_param *p, int bf16);
    /* floats of each workspace buffer for the parameters of kind `kind`
     * among params[0..n) (the FULL shapes; 0 = not allocated) under cfg (its
     * precision) and ctx's knobs (Muon: muon_ns_bf16). Pure; NULL: no
     * workspace. create allocates exactly these, mt_optim_plan_bytes counts them. */
    void (*ws_sizes)(const struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_param *params, int n,
                     int kind, size_t floats[MT_OPTIM_MAX_WS]);
    /* at create, per parameter of this class: the kernels it needs under cfg
     * (and ctx's knobs) and the shapes it takes; an error code + message when
     * refused (NULL: none) */
    enum mt_status (*check)(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                            const struct mt_param *p);
    /* the states' start (NULL: zeros, as allocated) */
    enum mt_status (*init)(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct mt_optim_slot *slot);
    /* one update of n parameters of this class (<= MT_OPS_LIST_MAX, or all
     * of them for a whole_list class), model order, gradients already clipped. bf16 shadows (p->bf16 non-NULL,
     * precision=bf16): mt_optim_step clears p->bf16_ok before the update; a
     * class that writes p->bf16 = bf16(updated p) (nearest even, cast_bf16's
     * bits) sets it again (AdamW); one that leaves it 0 has the model
     * refresh the shadow at the next forward (Muon) */
    enum mt_status (*step)(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *const *slots,
                           int n);
};

/* The built-in class of kind `kind` (enum mt_optim_kind), or NULL. */
const struct mt_optim_i *mt_optim_class(int kind);
/* Muon's Newton–Schulz on bf16 operands: precision=bf16 and knob muon_ns_bf16 (ctx's, else
 * the alias or the default). The one rule of muon.c (which then requires the backend's
 * gemm_bf16_batched, cast_bf16 and widen_bf16) and of the planner's price. */
int mt_optim_muon_ns_bf16(const struct mt_ctx *ctx, const struct mt_config *cfg);
/* The role-to-optimizer rule: the class cfg->optimizer names where it
 * accepts p (role, ndim), else MT_OPTIM_ADAMW (accepts every parameter).
 * A LoRA run (lora_rank > 0) trains its adapters with AdamW and its frozen
 * base has no optimizer (docs/lora.md); so does a frozen p. Reads p->ndim,
 * role, frozen. */
enum mt_optim_kind mt_optim_kind_for(const struct mt_config *cfg, const struct mt_param *p);

enum mt_status mt_optim_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                               struct mt_param *params, int n_params, struct mt_optim **out);
/* The same with a caller's table (classes[param->optim], n_classes <=
 * MT_OPTIM_MAX_CLASSES): a test's toy optimizer. Not owned; must outlive
 * the optimizer. */
enum mt_status mt_optim_create_with(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                    const struct mt_optim_i *const *classes, int n_classes, struct mt_param *params,
                                    int n_params, struct mt_optim **out);
void mt_optim_destroy(struct mt_ctx *ctx, struct mt_optim *o);  /* no-op on NULL */

/* TP: a Muon matrix split over the model axis (its box is a row or column
 * block of the global matrix) is orthogonalised as the FULL matrix: the
 * Nesterov direction is all-gathered over tp_comm (every model rank runs the
 * same Newton–Schulz) and each rank applies its own block. Every rank of the
 * group must step the same split parameters in the same order (they do: the
 * views are in model order). Not owned; must outlive the optimizer. */
void mt_optim_set_tp_comm(struct mt_optim *o, struct mt_comm *tp_comm);

/* Schedule factor for step s (from 0), SPEC.md 1b; scales both lrs. */
double mt_optim_lr_factor(const struct mt_config *cfg, int step);

/* Global L2 norm of all gradients, accumulated in float64 (local params; the
 * distributed runtime reduces the squared sum over groups). */
double mt_optim_grad_sumsq(struct mt_optim *o);

/* One update at step `step` (from 0): clip with grad_norm (if grad_clip > 0:
 * g *= min(1, clip/(norm+1e-6))), then each class's step on its parameters.
 * Afterwards an updated parameter's bf16_ok says whether its class wrote its
 * bf16 shadow from the update (the step hook's contract above); a frozen
 * one's is untouched.
 * Increments the step counter t (from 1; AdamW's bias correction reads it).
 * A non-finite grad_norm -> MT_ERR_NUMERIC before anything is touched.
 * Clipping scales param->grad in place. The schedule's progress is clamped
 * to [0, 1]: steps past total_steps keep the final factor. */
enum mt_status mt_optim_step(struct mt_ctx *ctx, struct mt_optim *o, int step, double grad_norm);

/* Checkpoint access to the state. */
struct mt_optim_state {
    char                   name[160];  /* "<param>.exp_avg" ... */
    const struct mt_param *param;      /* shape/box are the param's */
    float                 *data;       /* backend memory, param->numel floats */
};
int  mt_optim_state_count(const struct mt_optim *o);
/* The state tensors of parameter p (built-in table, class p->optim),
 * whether or not this rank holds it: how many (0 when frozen: a LoRA base),
 * and the name of the j-th ("<param>.exp_avg", ...). The checkpoint's
 * global entry list is built from these; mt_optim_state_get names held
 * states the same way. */
int  mt_optim_param_n_states(const struct mt_param *p);
void mt_optim_param_state_name(const struct mt_param *p, int j, char *out, size_t n);
void mt_optim_state_get(const struct mt_optim *o, int i, struct mt_optim_state *out);
long mt_optim_get_t(const struct mt_optim *o);
void mt_optim_set_t(struct mt_optim *o, long t);

/* Pure size function (built-in table): bytes of optimizer state (bucket
 * OPTIM: n_states x numel floats per parameter) and the classes' workspace
 * (bucket WORKSPACE, ws_sizes) for these params; same as create allocates.
 * bytes[] is overwritten (zeroed first); OTHER holds the small host
 * bookkeeping create allocates with mt_alloc. */
void mt_optim_plan_bytes(const struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_param *params,
                         int n_params, size_t bytes[MT_BUCKET_COUNT]);

#endif /* MT_OPTIM_H */
