/*
 * mt_model.h — the decoder-only model family of SPEC.md section 1.
 *
 * A model owns its parameters (data + grad), its saved activations for one
 * microbatch, and scratch buffers, all allocated once at create time through
 * the ops table (backend memory). It calls kernels only through `ops` and
 * collectives only through the axis wrappers (src/parallel/mt_axis.h).
 *
 * Typical step on one rank (grad accumulation over microbatches):
 *
 *     mt_model_zero_grad(m);
 *     for (mb = 0; mb < microbatches; mb++) {
 *         mt_model_forward(ctx, m, idx, targets, &norm, &parts);   // saves activations
 *         mt_model_backward(ctx, m);                                // grads +=
 *     }
 *
 * Loss parts. The loss is a list of parts (struct mt_loss_part), each
 * registered by the piece that computes it, in a fixed order: the head's
 * "lm" first, the MoE router's "aux" and "z" next (registered by every
 * model of the family, MoE or not: a dense model's are 0, so every receipt
 * has the same series), then any extra part (the test hook
 * test_loss_part's "hidden_l2"). mt_model_loss_parts lists them; a forward
 * returns one value per part in that order. The loss is their sum.
 *
 * Normalisation (SPEC.md: over the WHOLE global batch): the caller passes
 * global counts in `norm`; each microbatch returns part k's contribution
 * already divided by the count its `reduce` names, so summing parts over
 * microbatches (and ranks) gives the global loss, and the gradients sum the
 * same way:
 *   lm  = sum over valid targets of CE / norm->n_targets          (PER_TARGET)
 *   aux = sum over MoE layers, over this microbatch's sequences s of
 *         aux_coef * E * sum_e f[s,e] P[s,e]  / norm->n_sequences (PER_SEQUENCE)
 *   z   = sum over MoE layers, over this microbatch's tokens of
 *         z_coef * lse(router logits)^2 / norm->n_tokens          (PER_TOKEN)
 *   hidden_l2 = w * sum over tokens of |x_final|^2 / norm->n_tokens (PER_TOKEN)
 * A part's weight is already inside its value (aux_coef, z_coef, w).
 */
#ifndef MT_MODEL_H
#define MT_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../ops/mt_ops.h"
#include "../parallel/mt_axis.h"

struct mt_model;  /* opaque; model_impl.h */

struct mt_loss_norm {
    double n_targets;    /* global count of targets != -1 in the step's global batch */
    double n_sequences;  /* global sequences in the step                            */
    double n_tokens;     /* global tokens (n_sequences * T)                          */
};

/* The global count a loss part's sums are divided by (see above). */
enum mt_loss_reduce {
    MT_LOSS_PER_TARGET = 0,  /* / norm->n_targets   */
    MT_LOSS_PER_SEQUENCE,    /* / norm->n_sequences */
    MT_LOSS_PER_TOKEN,       /* / norm->n_tokens    */
    MT_LOSS_PER_TARGET_AHEAD, /* / (n_targets - ahead * n_sequences): the rows with a target `ahead`
                               * more tokens on (MTP module k, ahead = k); exact when ignored targets are
                               * at most a suffix of each sequence (none in training) */
};

#define MT_LOSS_MAX_PARTS 8
/* The family's parts, always registered and always first (mt_model_create). */
enum { MT_LOSS_LM = 0, MT_LOSS_AUX = 1, MT_LOSS_Z = 2, MT_LOSS_FAMILY_PARTS = 3 };

struct mt_loss_part {
    const char         *name;     /* the receipt series "<name>_losses": "lm", "aux", "z", ...  */
    const char         *owner;    /* the piece that computes it: "head", "moe router"            */
    double              weight;   /* its coefficient (already inside the value; 1 for lm)        */
    enum mt_loss_reduce reduce;   /* how a microbatch's sum is normalised                        */
    int                 backward; /* 1: its gradient enters the backward (0: reported only)      */
    int                 ahead;    /* MT_LOSS_PER_TARGET_AHEAD: how many tokens further (MTP's k)  */
};

struct mt_loss_parts {
    int    n;                      /* parts registered (mt_model_loss_parts)                     */
    double v[MT_LOSS_MAX_PARTS];   /* part k's share of this microbatch, normalised and weighted */
};

/* "targets", "sequences", "tokens": what the receipt says a part is divided by. */
static inline const char *mt_loss_reduce_name(enum mt_loss_reduce r)
{
    return r == MT_LOSS_PER_SEQUENCE ? "sequences" : r == MT_LOSS_PER_TOKEN ? "tokens"
           : r == MT_LOSS_PER_TARGET_AHEAD ? "targets k ahead" : "targets";
}

/* The loss: the parts' sum, added in registration order (lm + aux + z + ...:
 * the order the receipt's "losses" has always been summed in). */
static inline double mt_loss_parts_total(const double *v, int n)
{
    double s = n > 0 ? v[0] : 0.0;
    for (int k = 1; k < n; k++) s += v[k];
    return s;
}

/* The model's loss parts in order (*n of them, 3 <= *n <= MT_LOSS_MAX_PARTS).
 * Pointer valid until destroy. Works on a MT_MODEL_NO_ALLOC model. */
const struct mt_loss_part *mt_model_loss_parts(const struct mt_model *m, int *n);

/* Build the model for microbatches of B sequences of cfg->seq_len tokens.
 * cfg must be resolved (mt_config_resolve). Registers every parameter with
 * its HF name, shape, optimizer kind (per cfg->optimizer), init and role;
 * allocates params, grads, activations and scratch through ops->buf_alloc.
 * Parameters are NOT initialised: call mt_model_init_params or load them.
 * On failure returns an error and *out stays NULL. Free with mt_model_destroy. */
enum mt_status mt_model_create(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                               const struct mt_config *cfg, int B, struct mt_model **out);
void mt_model_destroy(struct mt_ctx *ctx, struct mt_model *m);  /* no-op on NULL */

/*
 * Tensor parallelism (the `model` axis, Megatron style) and sequence
 * parallelism. With tp > 1 this rank holds H/tp query heads and K/tp kv
 * heads (rows of Wq/Wk/Wv, columns of Wo) and F/tp of the dense hidden (rows
 * of Wg/Wu, columns of Wd). With SP on, the residual stream, norms, the
 * embedding, the head and the MoE blocks hold N/tp of the microbatch's N =
 * B*T token rows (a contiguous block: rows [tp_rank*N/tp, ...)); a TP region
 * starts with an all-gather and ends with a reduce-scatter. With SP off they
 * hold all N rows (replicated) and a TP region ends with an all-reduce;
 * MoE blocks still take their N/tp rows (SPEC.md: MoE under TP runs in the
 * sequence-parallel region) and all-gather the result.
 * Parameters whose gradient on this rank is a partial sum over the model
 * group get p->reduce_model = 1 (see mt_param.h).
 */
struct mt_comm;
struct mt_model_par {
    int             tp, tp_rank;  /* model axis degree and this rank's coordinate (1, 0: no TP) */
    int             sp;           /* sequence parallel (used when tp > 1)                         */
    struct mt_comm *tp_comm;      /* the model group; NULL when tp == 1                           */
    int             ep, ep_rank;  /* expert axis: this rank holds experts [ep_rank*E/ep, +E/ep)   */
    struct mt_comm *ep_comm;      /* the expert group (token all-to-all); NULL when ep == 1       */
    /* Host twins of tp_comm / ep_comm for the host arrays the model reduces (the
     * MoE sequence statistics, the per-expert counts). On a GPU mesh tp_comm and
     * ep_comm are device (NCCL) comms that cannot take host pointers; NULL: use
     * tp_comm / ep_comm (the cpu backend, where both are host memory). */
    struct mt_comm *tp_comm_host, *ep_comm_host;
    /* pipeline stage: layers [layer0, layer1) (both 0: all); the first stage
     * holds the embedding, the last the final norm and the head */
    int             layer0, layer1;
    int             n_slots;      /* activation sets for microbatches in flight (1F1B); 0 = 1     */
};

/*
 * Pipeline stages. A stage model runs its layers on one microbatch:
 *   first stage: tokens in;  other stages: x_in (Nr, D) from the previous stage;
 *   last stage: the loss;    other stages: the output (Nr, D) for the next one.
 * With n_slots > 1 the model keeps that many microbatches' activations:
 * mt_model_set_slot(k) picks where the next forward saves (and the next
 * backward reads) them.
 */
enum mt_status mt_model_forward_stage(struct mt_ctx *ctx, struct mt_model *m, const int32_t *idx,
                                      const int32_t *targets, const float *x_in, const struct mt_loss_norm *norm,
                                      struct mt_loss_parts *out);
/* dy: gradient of this stage's output (Nr, D); NULL on the last stage. */
enum mt_status mt_model_backward_stage(struct mt_ctx *ctx, struct mt_model *m, const float *dy);
float *mt_model_stage_output(struct mt_model *m);   /* (Nr, D) after a forward (not last stage)  */
float *mt_model_stage_dinput(struct mt_model *m);   /* (Nr, D) after a backward (not first stage) */
int  mt_model_stage_rows(const struct mt_model *m); /* Nr: rows of the tensors stages exchange   */
void mt_model_set_slot(struct mt_model *m, int k);
int  mt_model_n_slots(const struct mt_model *m);
const struct mt_config *mt_model_cfg(const struct mt_model *m);   /* the resolved config it was built with */
/* The cost of layer l per token, training FLOPs (an E block: attention +
 * router + top_k experts + shared expert; an A block: attention + dense MLP),
 * and of the head (6 V D): what the pipeline cut balances
 * (mt_layout_pipeline_cut in src/parallel/layout.c). */
double mt_model_layer_flops(const struct mt_config *cfg, int l);
double mt_model_head_flops(const struct mt_config *cfg);   /* 6 x mt_head.mm_per_token (head.c) */
/* FLOPs per token of stage s given the split (for the receipt). */
double mt_model_stage_flops(const struct mt_config *cfg, int layer0, int layer1);

/* Expert-parallel dispatch statistics (cumulative since create, this rank). */
void mt_model_ep_stats(const struct mt_model *m, struct mt_ep_stats *out);
/* Routed slots per expert (global index) counted on this rank since the last
 * reset, per MoE layer: load[l*E + e] (layers without MoE stay 0). */
const double *mt_model_moe_load(const struct mt_model *m);
void mt_model_moe_load_reset(struct mt_model *m);
/* Where the MoE layers' per-expert counts live (knob moe_sizes): 1 = on the
 * backend (no host read in the step), 0 = read on the host once a layer,
 * with *why the reason; 1 for a model without MoE layers (why ""). */
int mt_model_moe_device_sizes(const struct mt_model *m, const char **why);
/* 1 when the routed experts' gate and up (and d act) are stored bf16 (precision=bf16,
 * no ReDo, no adapter on the experts: moe.c moe_gu_bf16), else 0 */
int mt_model_moe_gate_up_bf16(const struct mt_model *m);
enum mt_status mt_model_create_par(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                   int B, int flags, const struct mt_model_par *par, struct mt_model **out);
/* ctx: the knobs the pieces read where they carve (scan_bf16: the chunk states a Mamba-3
 * layer keeps; head_bf16_logits), as create reads them: a plan of a run must see the run's
 * knobs (ctx->knobs), or plan and measured differ; NULL: the defaults */
void mt_model_plan_bytes_par(struct mt_ctx *ctx, const struct mt_config *cfg, int B, int flags,
                             const struct mt_model_par *par, size_t bytes[MT_BUCKET_COUNT]);

/* Model-axis collectives issued by the layers (cumulative since create;
 * struct mt_tp_stats: src/parallel/mt_axis.h). */
void mt_model_tp_stats(const struct mt_model *m, struct mt_tp_stats *out);

/* flags for mt_model_create_ex / _par */
#define MT_MODEL_EXTERNAL_PARAMS 1  /* do not allocate params/grads: every p->data and
                                     * p->grad is NULL until the caller points them at
                                     * its own storage (the ZeRO engine, src/parallel/zero.c) */
#define MT_MODEL_NO_ALLOC        2  /* planning only: build the parameter registry of this
                                     * rank (names, global shapes, boxes, units) and run every
                                     * check create runs, but allocate no arena, no layer and
                                     * no RoPE table; ops may be NULL and the communicators
                                     * in par are not needed. Only mt_model_params,
                                     * mt_model_param_unit, mt_model_n_units,
                                     * mt_model_stage_rows and destroy may be called. Small:
                                     * the struct and the parameter table (OTHER bucket). */

/* The checks mt_model_create_par runs (shapes, degrees, B*T range, slots),
 * without creating anything: MT_OK or MT_ERR_CONFIG / INVALID_ARG with the
 * message create would give. Run it before mt_model_plan_bytes_par, which
 * assumes a valid configuration. */
enum mt_status mt_model_check_par(struct mt_ctx *ctx, const struct mt_config *cfg, int B, const struct mt_model_par *par);
enum mt_status mt_model_create_ex(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                                  const struct mt_config *cfg, int B, int flags, struct mt_model **out);

/*
 * Units and hooks (how ZeRO / FSDP drives the model without the model knowing).
 *
 * The model is cut into units: unit 0 = the embedding (wte), unit 1+l =
 * block l, unit L+1 = the final norm and lm_head. Forward visits units
 * 0..L+1, backward L+1..0. Before a unit's forward (backward) runs,
 * pre_forward (pre_backward) is called: the hook may gather the unit's
 * parameters and re-point p->data / p->grad. After a unit's backward,
 * post_backward is called: its parameter gradients for this microbatch are
 * final, so the hook may start reducing them while the next unit computes.
 * A hook that returns an error stops the pass with that error. NULL entries
 * are skipped. Hooks do not run during KV-cache inference.
 */
struct mt_model_hooks {
    void *user;
    enum mt_status (*pre_forward)(struct mt_ctx *ctx, void *user, int unit);
    enum mt_status (*pre_backward)(struct mt_ctx *ctx, void *user, int unit);
    enum mt_status (*post_backward)(struct mt_ctx *ctx, void *user, int unit);
};
void mt_model_set_hooks(struct mt_model *m, const struct mt_model_hooks *h); /* NULL clears */
int  mt_model_n_units(const struct mt_model *m);                               /* L + 2 */
/* Unit of parameter i (index in mt_model_params order). */
int  mt_model_param_unit(const struct mt_model *m, int i);

/* Parameters in a fixed order: wte, then per layer l in order
 *   input_layernorm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm,
 *   post_attention_layernorm, then either mlp.{gate,up,down}_proj (A) or
 *   mlp.gate (router), mlp.experts.{e}.{gate,up,down}_proj for e in order,
 *   [mlp.shared_expert.{gate,up,down}_proj] (E),
 * then model.norm, lm_head. Pointer valid until destroy. */
struct mt_param *mt_model_params(struct mt_model *m, int *n_params);

/* Counter-based init (mt_rng.h): normal(0, 0.02) for matrices, output
 * projections (o_proj, down_proj, expert and shared down_proj) scaled by
 * 1/sqrt(2L), gains 1. Each rank fills only its box; values depend only on
 * (seed, name, global index). */
enum mt_status mt_model_init_params(struct mt_ctx *ctx, struct mt_model *m, uint64_t seed);
/* One parameter's init values into dst (its storage on ops' backend): a normal
 * init by ops->init_normal where the table has one and on_device (knob
 * param_init_device), else filled on the host, in place (host NULL) or through
 * host (numel floats) and one copy. The same bits either way. */
void mt_model_param_init(const struct mt_ops_i *ops, const struct mt_param *p, uint64_t seed, float *dst,
                         float *host, int on_device);
/* The host staging (floats) mt_model_param_init needs for p: its numel where the
 * host draws it for a device backend, else 0 (drawn on the device, or in place). */
size_t mt_model_param_init_staging(const struct mt_ops_i *ops, const struct mt_param *p, int on_device);
/* The init values of p's owned box (host, p->numel floats), as a pure
 * function of (seed, p->name, global index): what init_params writes. */
void mt_model_param_values(const struct mt_param *p, uint64_t seed, float *out_host);

/* Forward one microbatch. idx, targets: host int32 (B, T); targets may be
 * NULL (no loss; logits only). Token ids must be < vocab_size (checked:
 * MT_ERR_INVALID_ARG naming the position). Saves what backward needs. */
enum mt_status mt_model_forward(struct mt_ctx *ctx, struct mt_model *m,
                                const int32_t *idx, const int32_t *targets,
                                const struct mt_loss_norm *norm, struct mt_loss_parts *out);

/* Backward of the last forward (which must have had targets): parameter
 * grads ACCUMULATE (+=). */
enum mt_status mt_model_backward(struct mt_ctx *ctx, struct mt_model *m);

void mt_model_zero_grad(struct mt_model *m);
/* precision=bf16: the weights changed (optimizer update, load, any write to
 * a parameter's data). Marks every bf16 shadow stale; a stale shadow is
 * rewritten at its unit's next forward (until then the GEMMs round the fp32
 * weight per call). Shadows start stale. A caller that writes parameters
 * after a forward must call this before the next one, or the GEMMs read
 * the old weights' shadows. After the update the trainer then sets
 * bf16_ok again on the shadows the optimizer wrote from the new weights
 * (mt_zero_set_bf16_mark_fresh): those are not rewritten. No-op in fp32. */
void mt_model_bf16_invalidate(struct mt_model *m);

/* ---- ReDo (SPEC 1e; redo_scores.c, docs/model.md "ReDo") ----
 * A SwiGLU set: the dense MLP of a layer, one routed expert, or a shared
 * expert, with its units' place in the global score vector (off, in set
 * order: layers in order, an MoE layer's experts 0..E-1 then its shared
 * expert) and the names of its Wg, Wu, Wd. */
enum { MT_REDO_DENSE = -1, MT_REDO_SHARED = -2 };
struct mt_redo_set {
    int    layer, expert;     /* expert: >= 0 routed, MT_REDO_DENSE, MT_REDO_SHARED */
    int    units;             /* its hidden size (global)                             */
    size_t off;               /* its first unit in the global vector                  */
    char   name[3][128];      /* Wg, Wu, Wd parameter names                           */
};
/* The sets of cfg (out NULL: count only; at most cap written); returns the count. */
int mt_model_redo_sets(const struct mt_config *cfg, struct mt_redo_set *out, int cap);
/* on: zero the score accumulators and let the backward passes add into them
 * (a step whose update is followed by an event); off: stop. No-op when
 * redo_every is 0 (nothing carved). */
void mt_model_redo_arm(struct mt_model *m, int on);
/* global[s.off + j] += this rank's score sums of unit j of set s (int64, the
 * fixed point of mt_ops.h), for the sets this rank computes (its stage, its
 * TP rows, its experts): summed over the world they are the single-rank sums. */
enum mt_status mt_model_redo_scores(struct mt_ctx *ctx, struct mt_model *m, const struct mt_redo_set *sets,
                                    int n_sets, int64_t *global);

/* Logits (B, T, V) of the last forward, backend memory; raw (before softcap).
 * Valid until the next forward/backward. After a forward WITH targets the
 * buffer holds d(loss)/d(logits) instead (the head's one-pass cross-entropy,
 * when the backend has xent_fused), unless mt_model_keep_logits(m, 1). */
const float *mt_model_logits(const struct mt_model *m);
void mt_model_keep_logits(struct mt_model *m, int keep);

/* The GLOBAL parameter list (one rank: every expert, full shapes) in model
 * order, without data. Returns the count; fills out only if cap >= count. */
int mt_model_registry(const struct mt_config *cfg, struct mt_param *out, int cap);
/* The same with the layout classes a model axis of degree tp gives (a class
 * may depend on it: Mamba-3's B/C are split or replicated, SPEC 1c); names,
 * shapes and boxes are still the one-rank registry's. */
int mt_model_registry_tp(const struct mt_config *cfg, int tp, struct mt_param *out, int cap);

/* Parameter counts: total, and active per token (MoE: top_k experts + shared). */
void mt_model_param_counts(const struct mt_config *cfg, size_t *total, size_t *active);
/* Parameters that train (total minus the frozen LoRA base; all without LoRA). */
size_t mt_model_param_trainable(const struct mt_config *cfg);

/* Matmul parameters per token for the MFU convention
 * (6 * matmul params + 12 * L * T * H * hd FLOPs per token; MoE: active experts only). */
double mt_model_flops_per_token(const struct mt_config *cfg);

/* Memory plan: pure size function, same numbers mt_model_create allocates
 * (bytes per bucket: params, grads, acts, workspace, other). No side effects.
 * cfg->recompute == "block" plans (and create builds) the recompute layout:
 * per microbatch slot only each block's input, plus one shared set of block
 * internals that backward refills by re-running the block's forward. */
void mt_model_plan_bytes(const struct mt_config *cfg, int B, size_t bytes[MT_BUCKET_COUNT]);
/* Same, for mt_model_create_ex with flags (EXTERNAL_PARAMS: no PARAMS / GRADS). */
void mt_model_plan_bytes_ex(const struct mt_config *cfg, int B, int flags, size_t bytes[MT_BUCKET_COUNT]);

/* ---- inference with a KV cache (sampling) ---- */
struct mt_kv_cache;
/* Cache for one sequence of at most t_max tokens (t_max <= cfg->seq_len is not
 * required; RoPE tables are sized for t_max). Model must have been created
 * with B >= 1. Free with mt_model_kv_destroy. */
enum mt_status mt_model_kv_create(struct mt_ctx *ctx, struct mt_model *m, int t_max,
                                  struct mt_kv_cache **out);
void mt_model_kv_destroy(struct mt_ctx *ctx, struct mt_model *m, struct mt_kv_cache *c);
/* Feed n new tokens (n >= 1; prefill when n > 1) at positions cache_len..,
 * append their K/V to the cache, write the raw logits (V) of the LAST token to
 * logits_host (softcap applied if configured). Error if the cache would overflow. */
enum mt_status mt_model_kv_step(struct mt_ctx *ctx, struct mt_model *m, struct mt_kv_cache *c,
                                const int32_t *tokens, int n, float *logits_host);
int mt_model_kv_len(const struct mt_kv_cache *c);

/* Mixture-of-Depths (mod.c): the rows C = ceil(mod_capacity seq_len) per
 * sequence layer l runs through its block; 0 when layer l is not routed. */
int mt_model_mod_rows(const struct mt_config *cfg, int l);

#endif /* MT_MODEL_H */
