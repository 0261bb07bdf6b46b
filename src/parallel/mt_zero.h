/*
 * mt_zero.h — data parallelism with ZeRO stages 0-3 over one reduction group.
 *
 * The engine owns every parameter's storage (the model is created with
 * MT_MODEL_EXTERNAL_PARAMS) and drives it through the model's unit hooks
 * (mt_model.h): it gathers parameters before a unit runs (stage 3), and it
 * reduces a unit's gradients as soon as that unit's backward is done, while
 * the next unit computes (every stage).
 *
 * Ownership: every parameter is owned WHOLE by one rank of the group
 * (greedy by size, largest first, to the least-loaded rank; the same answer
 * on every rank). Whole tensors keep Muon exact (Newton–Schulz needs the
 * full matrix, as distributed Muon implementations do) and make a rank's
 * checkpoint shard a list of complete tensors.
 *
 *   stage  params            grads                         optimizer state
 *   0      full, replicated  full, all-reduced             full (every rank updates all)
 *   1      full, replicated  full, all-reduced             owned only; updated params all-gathered
 *   2      full, replicated  owned only (reduce-scatter)   owned only; updated params all-gathered
 *   3      owned only        owned only (reduce-scatter)   owned only; units all-gathered before use
 *
 * A frozen parameter (a LoRA base tensor, mt_param.frozen) is in the params
 * column only: no gradient storage at any stage (its grad is NULL), no part
 * in any reduction, no optimizer state (docs/lora.md, "Memory").
 *
 * See docs/zero.md for the layout, the overlap and the bytes moved per step.
 */
#ifndef MT_ZERO_H
#define MT_ZERO_H

#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "mt_comm.h"
#include "../model/mt_model.h"
#include "../ops/mt_ops.h"

struct mt_zero;

/* Collective kinds counted in mt_zero_stats. */
enum mt_zero_coll { MT_ZERO_ALLREDUCE = 0, MT_ZERO_REDUCE_SCATTER, MT_ZERO_ALLGATHER, MT_ZERO_COLL_COUNT };

struct mt_zero_stats {
    double bytes[MT_ZERO_COLL_COUNT]; /* payload bytes (the full buffer each call covers), summed */
    long   calls[MT_ZERO_COLL_COUNT];
    double wait_s;                    /* time blocked in waits / blocking collectives (exposed comm) */
    double zeroed_floats;             /* gradient floats zeroed (the rest are written first by a GEMM) */
};

/* Build the engine for the parameters of `model` (created with
 * MT_MODEL_EXTERNAL_PARAMS) that `select` marks (NULL: all), over `comm`,
 * their reduction group. Parameters with different groups get one engine
 * each (dense: data x expert; partial over the model axis: data x expert x
 * model). Allocates parameter, gradient and communication storage and points
 * the selected parameters at it. stage 0..3; reshard_after_forward only
 * matters for stage 3. Install the hooks with mt_zero_install_hooks. Free
 * with mt_zero_destroy (before the model). */
enum mt_status mt_zero_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct mt_comm *comm, int stage,
                              int reshard_after_forward, struct mt_model *model, const unsigned char *select,
                              struct mt_zero **out);

/* The engines driving one model, one per reduction group, each with the
 * optimizer of the parameters it owns (opt[k] steps z[k]'s opt params): the
 * model's hooks call each engine in turn, and the training step drives all
 * of them through the mt_zero_set_* functions below (one call per phase
 * instead of a loop over engines at every call site). The set is the
 * caller's and must outlive the model's passes; mt_zero_set_destroy frees
 * the engines and optimizers it holds (not the set itself). */
#define MT_ZERO_MAX_ENGINES 4
struct mt_optim;
struct mt_zero_set {
    struct mt_zero  *z[MT_ZERO_MAX_ENGINES];
    struct mt_optim *opt[MT_ZERO_MAX_ENGINES];
    int              n;
};
void mt_zero_install_hooks(struct mt_model *model, struct mt_zero_set *set);
void mt_zero_destroy(struct mt_ctx *ctx, struct mt_zero *z);  /* no-op on NULL */

/* Pure size function: bytes per bucket this rank's engine allocates (same
 * computation as create, which asserts that the two agree byte for byte:
 * parameter, gradient and communication buffers, and the host bookkeeping
 * in OTHER). model may be a MT_MODEL_NO_ALLOC model (only its registry is read). */
void mt_zero_plan_bytes(const struct mt_model *model, const unsigned char *select, int group_size, int group_rank,
                        int stage, int reshard_after_forward, size_t bytes[MT_BUCKET_COUNT]);

/* The same for every rank of the group at once, from ONE layout (ownership
 * depends on shapes and group size only): bytes[r * MT_BUCKET_COUNT + b]
 * for group rank r; stage -1 gives all four stages in a row,
 * bytes[(z * group_size + r) * MT_BUCKET_COUNT + b] for stage z. If
 * owner != NULL, owner[i] = the group rank that
 * owns parameter i (model order; -1: not selected). O(P log P + P log size
 * + units * size). MT_ERR_OOM (temporary layout arrays, on ctx) or
 * MT_ERR_INVALID_ARG. */
enum mt_status mt_zero_plan_all(struct mt_ctx *ctx, const struct mt_model *model, const unsigned char *select,
                                int group_size, int stage, int reshard_after_forward, size_t *bytes, int *owner);

/* Does group rank `group_rank` run the optimizer on a parameter owned by
 * `owner` (-1: not in the engine)? Stage 0: every rank updates every
 * parameter; stages 1-3: the owner alone. The rule create uses for
 * mt_zero_opt_params. */
int mt_zero_runs_optimizer(int owner, int group_rank, int stage);

/* The parameters this rank runs the optimizer on (stage 0: all; else the
 * owned ones), as views with their data/grad in the engine's storage. Give
 * these to mt_optim_create and mt_ckpt_load. Valid until destroy. */
struct mt_param *mt_zero_opt_params(struct mt_zero *z, int *n);
/* Comm rank that owns parameter i (model order); -1: not in this engine. */
int mt_zero_owner(const struct mt_zero *z, int i);
int mt_zero_group_rank(const struct mt_zero *z);  /* this rank's rank in the engine's group */
/* Backend pointer to this rank's copy of parameter i's full data if it owns
 * it (stage 3) or holds it (stages 0-2); NULL otherwise. */
const float *mt_zero_param_data(const struct mt_zero *z, int i);

/* Counter-based init of every parameter this rank holds (SPEC.md: values
 * depend only on seed, name and global index). */
enum mt_status mt_zero_init_params(struct mt_ctx *ctx, struct mt_zero *z, uint64_t seed);

/* Start a step: zero gradients, drop gathered units. `step` is for messages. */
void mt_zero_begin_step(struct mt_zero *z, int step);
/* Before each microbatch's backward: is it the last one of the step? (stages
 * 0/1 reduce only once, after the last; stages 2/3 reduce every microbatch). */
void mt_zero_set_last_microbatch(struct mt_zero *z, int last);
/* After the last backward: complete every pending reduction; the opt params'
 * grads then hold the reduced (summed over the group) gradients. */
enum mt_status mt_zero_finish_grads(struct mt_ctx *ctx, struct mt_zero *z);
/* This rank's share of the squared-gradient sum (fp64, no reduction): the
 * parameters it owns, each counted once in the group, skipping those with
 * count[i] == 0 (count NULL: all). Summed over the world by the caller, it is
 * the global norm^2 when count leaves out the copies the group does not see
 * (a parameter replicated over the model axis but reduced over data only). */
double mt_zero_grad_sumsq_local(const struct mt_zero *z, const unsigned char *count);
/* After a non-finite gradient norm: name (len bytes) = the first parameter
 * whose gradient was marked non-finite on this rank before its reduction this
 * step (backends with nonfinite_mark; one host read of the marks); left
 * untouched when there is none. MT_ERR_OOM or MT_OK. */
enum mt_status mt_zero_nonfinite_culprit(struct mt_ctx *ctx, struct mt_zero *z, char *name, size_t len);
/* After the optimizer step: stages 1/2 all-gather the updated parameters;
 * stage 3 marks gathered units stale. */
enum mt_status mt_zero_sync_params(struct mt_ctx *ctx, struct mt_zero *z);

/* precision=bf16, after mt_model_bf16_invalidate that follows the update:
 * every model parameter whose shadow this rank's optimizer wrote in the
 * update (its view's bf16_ok, mt_optim.h) is marked fresh again (bf16_ok =
 * 1; the next forward's refresh skips it); the views' flags are consumed
 * (0). The rule: a parameter this rank runs the optimizer on (stage 0: all;
 * 1-3: the owned ones, each owned WHOLE) under a class that writes shadows
 * (AdamW); every other stays stale, refreshed after its gather. A write to
 * a view's data between the update and this call (ReDo) clears its flag. */
void mt_zero_bf16_mark_fresh(struct mt_zero *z);

/* Test-only fault injection: poison unit `unit`'s gradient with NaN at
 * `step` (before the finiteness check that precedes its reduction). */
void mt_zero_inject_nan(struct mt_zero *z, int step, int unit);
/* Test-only: at `step` the gradients left to their first GEMM (mt_param.h
 * grad_gemm) start as NaN instead of last step's values, so a write that
 * adds to one before that GEMM makes the loss or the norm non-finite. */
void mt_zero_inject_fresh_nan(struct mt_zero *z, int step);

/* MT_ZERO_OVERLAP as read at create (1: reductions and gathers overlap compute). */
int  mt_zero_overlap(const struct mt_zero *z);
void mt_zero_get_stats(const struct mt_zero *z, struct mt_zero_stats *out);
void mt_zero_reset_stats(struct mt_zero *z);

/* ---- the set API: every engine of the set, in order z[0], z[1], ... ---- */

/* Start a step on every engine: gradients zeroed, gathered units dropped. */
void mt_zero_set_zero_grad(struct mt_zero_set *set, int step);
/* Before each microbatch's backward: is it the step's last? */
void mt_zero_set_mark_last(struct mt_zero_set *set, int last);
/* Complete every engine's gradient reduction (mt_zero_finish_grads). */
enum mt_status mt_zero_set_reduce(struct mt_ctx *ctx, struct mt_zero_set *set);
/* The global gradient norm: sqrt of the world-sum (over `comm`, fp64) of the
 * engines' local squared sums (count as in mt_zero_grad_sumsq_local). The
 * optimizer clips with it (mt_optim_step); it is not finite when a gradient
 * is not. Collective over comm. */
enum mt_status mt_zero_set_clip_norm(struct mt_ctx *ctx, struct mt_zero_set *set, const unsigned char *count,
                                     struct mt_comm *comm, double *norm);
/* After a non-finite gradient norm, collective over comm (the norm's): the
 * lowest rank whose engines marked a gradient non-finite before its
 * reduction and that parameter, agreed by every rank, so that every rank
 * returns the same MT_ERR_NUMERIC "non-finite gradient on rank R in
 * parameter P at step S (found before the reduction)" (whichever prints
 * first before the job goes down says it); MT_OK when no rank marked one. */
enum mt_status mt_zero_set_nonfinite_culprit(struct mt_ctx *ctx, struct mt_zero_set *set, struct mt_comm *comm,
                                             int step);
/* The optimizer step of every engine (clipped by grad_norm), then the
 * parameter sync of every engine (stages 1/2 all-gather). */
enum mt_status mt_zero_set_step(struct mt_ctx *ctx, struct mt_zero_set *set, int step, double grad_norm);
enum mt_status mt_zero_set_sync(struct mt_ctx *ctx, struct mt_zero_set *set);
/* mt_zero_bf16_mark_fresh on every engine. */
void mt_zero_set_bf16_mark_fresh(struct mt_zero_set *set);
/* Counter-based init of every engine's parameters (mt_zero_init_params). */
enum mt_status mt_zero_set_init_params(struct mt_ctx *ctx, struct mt_zero_set *set, uint64_t seed);
/* Collective statistics summed over the engines; reset them all. */
void mt_zero_set_get_stats(const struct mt_zero_set *set, struct mt_zero_stats *out);
void mt_zero_set_reset_stats(struct mt_zero_set *set);
/* Every optimizer state the set holds (for the checkpoint), engine by
 * engine, each in parameter order, into st (NULL: only count). Returns the
 * count. */
struct mt_optim_state;
int mt_zero_set_states(const struct mt_zero_set *set, struct mt_optim_state *st);
/* Free every optimizer and engine of the set (NULL entries are fine). */
void mt_zero_set_destroy(struct mt_ctx *ctx, struct mt_zero_set *set);

#endif /* MT_ZERO_H */
