/*
 * mt_optim.h — AdamW + Muon (nanochat split), global-norm clipping, schedule.
 *
 * Exactly SPEC.md section 1b. The optimizer owns its state tensors (same box
 * as their parameter, bucket OPTIM) and a Newton–Schulz workspace (bucket
 * WORKSPACE). Muon orthogonalises the FULL matrix; on one rank the local box
 * is the full matrix (later axes gather or assign whole matrices per rank).
 *
 * State tensor names (checkpoints): "<param>.exp_avg", "<param>.exp_avg_sq"
 * (AdamW), "<param>.momentum_buffer" (Muon).
 */
#ifndef MT_OPTIM_H
#define MT_OPTIM_H

#include <stddef.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../ops/mt_ops.h"

struct mt_optim;

enum mt_status mt_optim_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                               struct mt_param *params, int n_params, struct mt_optim **out);
void mt_optim_destroy(struct mt_ctx *ctx, struct mt_optim *o);  /* no-op on NULL */

/* TP: a Muon matrix split over the model axis (its box is a row or column
 * block of the global matrix) is orthogonalised as the FULL matrix: the
 * Nesterov direction is all-gathered over tp_comm (every model rank runs the
 * same Newton–Schulz) and each rank applies its own block. Every rank of the
 * group must step the same split parameters in the same order (they do: the
 * views are in model order). Not owned; must outlive the optimizer. */
struct mt_comm;
void mt_optim_set_tp_comm(struct mt_optim *o, struct mt_comm *tp_comm);

/* Schedule factor for step s (from 0), SPEC.md 1b; scales both lrs. */
double mt_optim_lr_factor(const struct mt_config *cfg, int step);

/* Global L2 norm of all gradients, accumulated in float64 (local params; the
 * distributed runtime reduces the squared sum over groups). */
double mt_optim_grad_sumsq(struct mt_optim *o);

/* One update at step `step` (from 0): clip with grad_norm (if grad_clip > 0:
 * g *= min(1, clip/(norm+1e-6))), then AdamW and Muon per parameter kind.
 * Increments the AdamW step counter t (from 1). A non-finite grad_norm ->
 * MT_ERR_NUMERIC before anything is touched. Clipping scales param->grad in
 * place. The schedule's progress is clamped to [0, 1]: steps past
 * total_steps keep the final factor. */
enum mt_status mt_optim_step(struct mt_ctx *ctx, struct mt_optim *o, int step, double grad_norm);

/* Checkpoint access to the state. */
struct mt_optim_state {
    char                   name[160];  /* "<param>.exp_avg" ... */
    const struct mt_param *param;      /* shape/box are the param's */
    float                 *data;       /* backend memory, param->numel floats */
};
int  mt_optim_state_count(const struct mt_optim *o);
/* The state tensors of a parameter of optimizer kind `optim` (enum
 * mt_optim_kind), whether or not this rank holds it: how many (AdamW 2,
 * Muon 1), and the name of the j-th ("<param>.exp_avg", "<param>.exp_avg_sq",
 * "<param>.momentum_buffer"). The checkpoint's global entry list is built
 * from these; mt_optim_state_get names held states the same way. */
int  mt_optim_class_n_states(int optim);
/* States of one parameter: its class's, or 0 when frozen (a LoRA base). */
int  mt_optim_param_n_states(const struct mt_param *p);
void mt_optim_class_state_name(int optim, const char *param, int j, char *out, size_t n);
void mt_optim_state_get(const struct mt_optim *o, int i, struct mt_optim_state *out);
long mt_optim_get_t(const struct mt_optim *o);
void mt_optim_set_t(struct mt_optim *o, long t);

/* Pure size function: bytes of optimizer state (bucket OPTIM) and NS
 * workspace (bucket WORKSPACE) for these params; same as create allocates.
 * bytes[] is overwritten (zeroed first); OTHER holds the small host
 * bookkeeping create allocates with mt_alloc. */
void mt_optim_plan_bytes(const struct mt_config *cfg, const struct mt_param *params, int n_params,
                         size_t bytes[MT_BUCKET_COUNT]);

#endif /* MT_OPTIM_H */
