/*
 * model_impl.h — internals of struct mt_model (private to src/model/ and tests).
 *
 * Memory layout (STYLE.md 10): one arena per lifetime bucket, allocated once
 * in mt_model_create through ops->buf_alloc, with named views carved out of
 * it by model_layout(). mt_model_plan_bytes runs the same carving with NULL
 * bases, so the plan and the allocation can never disagree.
 *
 *   PARAMS     every parameter's data (its owned box)
 *   GRADS      every parameter's grad (same boxes; ACCUMULATE +=)
 *   ACTS       saved activations of one microbatch (B sequences of T tokens)
 *   WORKSPACE  activation-gradient scratch reused by every layer, RoPE tables
 *   OTHER      host staging (router probs, routing bookkeeping, losses), via mt_alloc
 *
 * Shape letters (docs/glossary.md): B T N=B*T D V, and each piece's own in
 * its file (attention H K hd QD KD, the MLP F, MoE E k M Fe Fs, Mamba-3's):
 * the model's structs hold only the dims every block shares.
 *
 * Gradient rule for the whole model: parameter grads ACCUMULATE (+=) over
 * backward calls; activation gradients OVERWRITE (=), except the residual
 * stream gradient `dx`, into which each block ACCUMULATES its branch.
 */
#ifndef MT_MODEL_IMPL_H
#define MT_MODEL_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "mt_model.h"
#include "mt_blocks.h"
#include "mt_mamba3.h"

/* Largest expert-parallel degree (stack arrays of all-to-all counts). */
#define MT_MAX_EP 256

/* The parameters every step of a block has (views into mt_model.params),
 * bound from the registry: the step's input norm gain, declared by its piece
 * with bind MT_BIND_NORM (below). A piece's own parameters are a struct of
 * its own in the layer (w_own, MT_BIND_OWN). */
struct mt_layer_w {
    struct mt_param *ln[MT_BLOCK_MAX_PIECES]; /* (D) step i's input norm gain (A: input_layernorm,
                                               * then post_attention_layernorm); NULL: none */
};

/* A step's input norm, saved for its backward (struct mt_layer.nrm[i]):
 * carved by the piece (MT_RESID_NONE) or by the block (MT_RESID_ADD). */
struct mt_norm_acts {
    float   *h_n;    /* (Nr, D) rmsnorm(s_i) * g_i (this rank's rows)                      */
    float   *h;      /* the rows the piece reads: (N, D) gathered over TP (== h_n without
                      * SP); MoE: (Nm, D), a view of h_n                                   */
    float   *rstd;   /* (Nr)                                                               */
    mt_bf16 *hb;     /* (Nr, D) precision=bf16: bf16(h_n), not under SP; NULL: none        */
};

/* One slot of a piece's own struct (layer weights, model scratch): aligned
 * for pointers, doubles and 64-bit integers. */
union mt_piece_own { void *p; double d; int64_t i; };
/* Largest struct of weight pointers a piece may bind in a layer (each piece
 * asserts its struct fits). */
#define PIECE_W_MAX 256

/* One block: its kind, its parameters and what its forward saves. Per step
 * i of its kind (mt_blocks.h): w.ln[i], w_own[i], nrm[i], state[i]; the
 * stream s_0 = x_in, s_{i+1} = x_step[i] (the last step writes the next
 * layer's x_in or the stage output instead). */
struct mt_layer {
    int kind;                      /* index into the block-kind table (mt_blocks.h) */
    int moe;                       /* the kind's `routed` flag (routing buffers valid) */
    int index;                     /* layer number l (its row of the MoE load histogram) */
    struct mt_layer_w w;           /* the parameters every kind has                 */
    /* each step's own parameter pointers: a struct the piece's .c file
     * defines, bound from the registry (MT_BIND_OWN) and handed to the
     * piece as pc->pw */
    union mt_piece_own w_own[MT_BLOCK_MAX_PIECES][PIECE_W_MAX / sizeof(union mt_piece_own)];

    /* saved activations every kind shares (ACTS): the residual stream and
     * each step's input norm */
    float *x_in;                              /* (Nr, D) s_0, the stream entering the block */
    float *x_step[MT_BLOCK_MAX_PIECES - 1];   /* (Nr, D) s_{i+1} after step i < n-1 (carve_block);
                                               * A: x_step[0] = x_in + attn(...), "x_mid"   */
    struct mt_norm_acts nrm[MT_BLOCK_MAX_PIECES];
    /* each step's own saved activations: a struct the piece's .c file
     * defines (struct mt_piece.state_bytes), carved in OTHER by
     * carve_block; NULL when the piece declares none */
    void *state[MT_BLOCK_MAX_PIECES];
    /* the kind's wrapper's saved state (struct mt_block_wrap.state_bytes,
     * OTHER), NULL without one: carve_block carves it before the steps */
    void *wst;
    /* the wrapper's parameter pointers (MT_BIND_OWN of its params), handed
     * to its hooks as pc->pw; a router needs one */
    union mt_piece_own w_wrap[4];
};
/* The steps of the two-step kinds of the table (A, E, M). */
enum { MT_PIECE_MIXER = 0, MT_PIECE_FFN = 1 };
/* Largest state_bytes a piece may declare (model.c sizes a throwaway state
 * with it when carving for sizes only; each piece asserts its struct fits). */
#define PIECE_STATE_MAX 512
/* Largest own_bytes a piece may declare (struct mt_model holds one of this
 * size per distinct piece; each piece asserts its struct fits). */
#define PIECE_OWN_MAX 512

/* One MTP module's saved activations in a slot (mtp.c; the module's block
 * is a layer of its own kind, carved like a main block). Rows: this rank's
 * Nr (under SP its block of the microbatch). */
struct mt_mtp_slot {
    struct mt_layer ly;          /* the block: x_in = h' (Nr, D), its internals    */
    int32_t *emb_idx, *tgt;      /* (Nr) tgt[i+k-1] (0 where none), tgt[i+k] (-1 where none) */
    float   *e_raw, *de_raw;     /* (Nr, D) wte rows of emb_idx; d of them (the embedding's backward) */
    float   *hn, *hrstd;         /* (Nr, D) rmsnorm(h^{k-1}) * hnorm; (Nr) its rstd */
    float   *en, *erstd;         /* (Nr, D) rmsnorm(e_raw) * enorm; (Nr)            */
    float   *out;                /* (Nr, D) h^k, the block's output                 */
    float   *on, *orstd;         /* (Nr, D) rmsnorm(h^k) * norm; (Nr)               */
    float   *logits, *losses, *xlse;   /* (Nr, V) logits, then dlogits; (Nr); (Nr) */
};

/* One microbatch's saved activations (pipeline slots); the model's "current"
 * fields (idx ... xlse, layers, norm, have_*) are copied from the selected slot. */
#define MT_MAX_SLOTS 64
struct mt_slot {
    int32_t *idx, *targets;
    float   *x_final, *h_final, *rstd_final, *logits, *losses, *xlse;
    mt_bf16 *h_final_bf16;     /* precision=bf16: bf16(h_final), the lm head's GEMM operand */
    mt_bf16 *dlogits_bf16;     /* precision=bf16: bf16(dlogits), the lm head backward's dy operand */
    struct mt_layer *layers;   /* (L), only [l0, l1) carved */
    struct mt_mtp_slot *mtp;   /* (mtp_depth) the MTP modules' (last stage; mt_alloc OTHER), else NULL */
    struct mt_loss_norm norm;
    int have_fwd, have_targets;
};

/* precision=bf16: WORKSPACE scratch for the one rounding of a projection's
 * output gradient dy (cap elements): proj_bwd_b rounds dy into it once
 * (ops->cast_bf16) and both GEMMs, dW += dy^T x and dx = dy W, read that
 * copy, instead of each rounding dy inside gemm_bf16 (the same bf16 values,
 * round to nearest even both ways: the same bits, half the conversions) */
struct mt_dyb {
    mt_bf16     *p;
    size_t       cap;
    /* the residual gradient's twin: p holds bf16(twin_of[0..twin_n)), written by
     * the block input norm's backward that made twin_of final (norm_bwd_twin),
     * so the next piece's first dyb_round of that same array reads it instead of
     * rounding again (the same bits). Any other write of p (dyb_room, a
     * dyb_round that misses) and every write of the array outside a piece's
     * final norm (dyb_twin_drop, model.c and mtp.c) drops it: NULL. */
    const float *twin_of;
    size_t       twin_n;
};

struct mt_model {
    struct mt_config       cfg;
    int l0, l1, first, last;   /* pipeline stage: layers [l0, l1); has wte / has the head */
    int n_slots, cur_slot;
    struct mt_slot slots[MT_MAX_SLOTS];
    const struct mt_ops_i *ops;
    int B, T, N;
    int V, L, D;             /* the pieces' own dims live in their own structs (own[]) */
    /* TP / SP (mt_model.h): N = B*T rows in a TP region; Nr rows of the residual
     * stream on this rank (N/tp with SP, else N); row0 = first global row of
     * this rank's share (N/tp rows). */
    int ep, ep_rank;         /* the expert axis (1, 0 without routed blocks)          */
    struct mt_comm *ep_comm;
    struct mt_comm *ep_comm_host; /* host counts (mt_model.h); = ep_comm on the cpu backend */
    struct mt_ep_stats ep_stats;
    int tp, tp_rank, sp, Nr, Nm, row0;
    int registry_tp;         /* mt_model_registry_tp: the model axis layout classes are chosen
                              * for (Mamba-3 B/C) while shapes stay global (tp 1); 0: tp */
    struct mt_comm *tp_comm;
    struct mt_comm *tp_comm_host; /* host statistics (mt_model.h); = tp_comm on the cpu backend */
    struct mt_tp_stats tp_stats;
    int any_moe;             /* some layer's kind is routed (mt_blocks_any_routed)                   */
    unsigned kinds_used;     /* bit k: some layer (any stage) is of block kind k                     */
    int recompute;           /* cfg recompute=block: slots keep x_in per layer only (model_layout) */
    int no_alloc;            /* MT_MODEL_NO_ALLOC: registry only, no arenas (planning)              */

    int              n_params;
    struct mt_param *params;   /* order of mt_model.h; mt_alloc (OTHER) */
    struct mt_param *wte, *norm_f, *lm_head;
    struct mt_layer *layers;   /* (L) mt_alloc (OTHER) */

    /* WORKSPACE: constants */
    float *rope_cos, *rope_sin;  /* (T, hd/2) cos(p * theta^(-2i/hd)) computed in double */

    /* ACTS: model-level saved tensors */
    int32_t *idx, *targets;      /* (N) backend copies of the inputs                 */
    float   *x_final;            /* (Nr, D) residual stream after the last block     */
    float   *h_final;            /* (Nr, D) rmsnorm(x_final) * g_final               */
    mt_bf16 *h_final_bf16;       /* (Nr, D) bf16(h_final), precision=bf16 only       */
    float   *rstd_final;         /* (Nr)                                             */
    float   *logits;             /* (Nr, V) raw logits; dlogits in place in backward */
    mt_bf16 *dlogits_bf16;       /* (Nr, V) bf16(dlogits) from xent_fused_bf16, precision=bf16 only */
    float   *losses, *xlse;      /* (Nr) per-row CE and logsumexp of (capped) logits */

    /* WORKSPACE: activation-gradient scratch, reused by every layer */
    float *dx;                   /* (Nr, D) residual stream gradient                 */
    float *dh;                   /* (N, D) gradient w.r.t. a normed input            */
    float *s_full;               /* (N, D) TP: gathered rows (tp > 1 only)           */
    float *s_red;                /* (N, D) TP: partial sums / reduce-scatter output  */
    float *s_act, *s_dact, *s_dg, *s_du; /* (the pieces' widest ffn_scratch) SwiGLU scratch */
    float *s_lora, *s_dlora;             /* (rows, r) LoRA x A^T and its gradient (lora.c; rows:
                                          * the pieces' proj_scratch) */
    struct mt_dyb s_dyb;                 /* (N x the widest dense projection, proj_scratch) bf16 dy,
                                          * precision=bf16 */
    /* each distinct piece's own struct (its dims, scratch and staging; the
     * piece's .c file defines it, own_bytes its size), indexed by
     * mt_blocks_piece_index; model_own() points the context at it */
    union mt_piece_own own[MT_MAX_PIECES][PIECE_OWN_MAX / sizeof(union mt_piece_own)];

    /* OTHER: host staging */
    float   *h_losses;           /* (N)      */

    void  *arena[MT_BUCKET_COUNT];       /* backend arenas (PARAMS..WORKSPACE); OTHER is host */
    size_t arena_bytes[MT_BUCKET_COUNT];

    /* distributed runtime (mt_model_set_hooks); external: params/grads not in our arenas */
    int                    external_params;
    struct mt_model_hooks  hooks;

    /* the loss parts (mt_model.h), in order: the head's lm, the router's aux
     * and z, the head's extras; hidden_l2: the test hook's part (-1: none) */
    int                 n_loss;
    struct mt_loss_part loss[MT_LOSS_MAX_PARTS];
    int                 loss_hidden_l2;

    /* state of the last forward */
    int                 have_fwd, have_targets;
    struct mt_loss_norm norm;
    /* head: keep_logits (mt_model_keep_logits) turns the fused cross-entropy
     * off; dlogits_ready: the last forward with targets left dlogits in logits */
    int                 keep_logits, dlogits_ready;
    int                 head_bf16_logits;   /* knob head_bf16_logits (head.c): bf16 logits where the backend can */
    int                 dlogits_twin;   /* ...and its bf16 twin in dlogits_bf16 (precision=bf16) */
    int                 logits_rows;    /* rows of `logits` carved: Nr, or head_chunk_rows (bf16 twin only) */
    /* precision=bf16: shadows carved (PARAMS bucket) for the matrices
     * bf16_shadowed() selects; refreshed per unit after its pre_forward hook */
    int                 bf16;
    /* ReDo (redo_every > 0; redo_scores.c): one int64 score accumulator per
     * SwiGLU unit of the stage's layers (WORKSPACE), layer by layer
     * (model_redo_local); redo_armed: the backward passes add into them */
    int64_t            *redo_acc;
    int                 redo_armed;
    /* MTP (mtp.c, SPEC 1e): Dm modules on the last stage (0: off); their
     * parameters (bound after the head's) and the current slot's buffers;
     * loss part of module k: loss_mtp0 + k - 1 */
    int                 mtp_depth, mtp_kind, loss_mtp0;
    struct mt_mtp_params { struct mt_param *enorm, *hnorm, *norm, *eh; } mtp_p[MT_MTP_MAX_DEPTH];
    struct mt_mtp_slot *mtp;
    float              *mtp_dsave, *mtp_carry, *mtp_tmp;   /* (Nr, D) WORKSPACE: the backward's */
    int32_t            *mtp_host;                          /* (2 Nr) host: the rows' shifted ids */
    /* wrappers with a loss part (struct mt_block_wrap.loss_register; MoD's
     * mod_aux): the part of kind k (-1: none), each layer's sum (L doubles,
     * WORKSPACE, written by the wrapper's enter) and its host copy (OTHER) */
    int                 wrap_part[MT_MAX_BLOCK_KINDS];
    int                 any_wrap_loss;
    double             *wrap_loss, *wrap_loss_h;
};

/* ---- carving (model_layout and the pieces' carve functions) ---- */

/* Offsets per bucket; with NULL bases only the offsets advance (the plan). */
struct mt_carver { char *base[MT_BUCKET_COUNT]; size_t off[MT_BUCKET_COUNT]; };

static inline void *carve(struct mt_carver *c, enum mt_bucket b, size_t bytes)
{
    size_t o = (c->off[b] + 63) & ~(size_t)63;
    c->off[b] = o + bytes;
    return c->base[b] ? c->base[b] + o : NULL;
}
static inline float *carve_f(struct mt_carver *c, enum mt_bucket b, size_t n) { return carve(c, b, n * sizeof(float)); }
static inline int32_t *carve_i(struct mt_carver *c, enum mt_bucket b, size_t n)
{
    return carve(c, b, n * sizeof(int32_t));
}

/* ---- helpers shared by the layer files ---- */

/* y (n, out) = x (n, in) W^T + beta * y, W (out, in). */
static inline void linear_forward(const struct mt_ops_i *ops, float *y, const float *x,
                                  const float *w, int n, int in, int out, float beta)
{
    if (n <= 0) return;
    ops->gemm(ops->be, 0, 1, n, out, in, 1.0f, x, in, w, in, beta, y, out);
}

/* dW (out, in) = dy^T x + beta_dw dW;  dx (n, in) = dy W + beta_dx * dx  (dw / dx NULL: skipped). */
static inline void linear_backward(const struct mt_ops_i *ops, float *dx, float beta_dx, float *dw, float beta_dw,
                                   const float *dy, const float *x, const float *w,
                                   int n, int in, int out)
{
    if (n <= 0) return;
    if (dw) ops->gemm(ops->be, 1, 0, out, in, n, 1.0f, dy, out, x, in, beta_dw, dw, in);
    if (dx) ops->gemm(ops->be, 0, 0, n, in, out, 1.0f, dy, out, w, in, beta_dx, dx, in);
}

/* The beta of a GEMM about to write w's whole gradient dw (mt_param.h,
 * grad_gemm): 0 at the step's first write of a gradient nobody zeroed, else 1
 * (+=). Any other dw (a slice, or not w's) and any parameter not flagged
 * grad_gemm add: 1. */
static inline float grad_beta(struct mt_param *w, const float *dw)
{
    if (!w->grad_gemm || dw != w->grad || w->grad_live) return 1.0f;
    w->grad_live = 1;
    return 0.0f;
}
/* grad_beta for one GEMM that writes the whole gradients of n parameters at
 * once (the device-sized experts' grouped call, Mamba-3's whole in_proj):
 * they start and end each step's first write together, so they share it */
static inline float grad_beta_all(struct mt_param *const *w, int n)
{
    float beta = 1.0f;
    int mixed = 0;
    for (int i = 0; i < n; i++) {
        const float b = grad_beta(w[i], w[i]->grad);
        if (i == 0) beta = b;
        mixed += b != beta;
    }
    MT_ASSERT(mixed == 0);
    return beta;
}
/* A grad_gemm gradient its GEMM is known to skip this microbatch (a routed
 * expert no row reached): zero, if nothing wrote it yet this step. */
static inline void grad_zero_unwritten(const struct mt_ops_i *ops, struct mt_param *w)
{
    if (!w->grad_gemm || !w->grad || w->frozen || w->grad_live) return;
    ops->fill(ops->be, w->grad, 0.0f, w->numel);
    w->grad_live = 1;
}

/* The same two helpers on a parameter: with a bf16 shadow (precision=bf16)
 * the GEMMs run on bf16 operands with fp32 accumulation (ops->gemm_bf16):
 * the weight as its shadow when that is fresh (no conversion), else rounded
 * in the call; x and dy are fp32 buffers, rounded in the call. */
static inline void wlinear_forward(const struct mt_ops_i *ops, float *y, const float *x, const mt_bf16 *xb,
                                   const struct mt_param *w, int n, int in, int out, float beta)
{
    if (!w->bf16) { linear_forward(ops, y, x, w->data, n, in, out, beta); return; }
    if (n <= 0) return;
    const void *W = w->bf16_ok ? (const void *)w->bf16 : (const void *)w->data;
    ops->gemm_bf16(ops->be, 0, 1, n, out, in, 1.0f, xb ? (const void *)xb : (const void *)x, xb ? MT_ELEM_BF16 : MT_ELEM_F32,
                   in, W, w->bf16_ok ? MT_ELEM_BF16 : MT_ELEM_F32, in, beta, y, out);
}
/* y (n, out) bf16 = bf16(x W^T) (ops->gemm_bf16_out; w shadowed, precision=bf16): for an
 * output whose readers take bf16 storage (the SwiGLU's gate and up, mlp.c) */
static inline void wlinear_forward_bf16_out(const struct mt_ops_i *ops, mt_bf16 *y, const float *x, const mt_bf16 *xb,
                                            const struct mt_param *w, int n, int in, int out)
{
    if (n <= 0) return;
    const void *W = w->bf16_ok ? (const void *)w->bf16 : (const void *)w->data;
    ops->gemm_bf16_out(ops->be, 0, 1, n, out, in, 1.0f, xb ? (const void *)xb : (const void *)x,
                       xb ? MT_ELEM_BF16 : MT_ELEM_F32, in, W, w->bf16_ok ? MT_ELEM_BF16 : MT_ELEM_F32, in, y, out);
}
/* dx (n, in) bf16 = bf16(dy W) (ops->gemm_bf16_out; w shadowed, precision=bf16): for a
 * gradient whose one reader takes bf16 storage (the attention's d att, the SwiGLU's
 * d act); dyb: NULL, or dy's bf16 twin (read instead of dy) */
static inline void wlinear_backward_dx_bf16_out(const struct mt_ops_i *ops, mt_bf16 *dx, const float *dy,
                                                const mt_bf16 *dyb, const struct mt_param *w, int n, int in, int out)
{
    if (n <= 0) return;
    const void *W = w->bf16_ok ? (const void *)w->bf16 : (const void *)w->data;
    ops->gemm_bf16_out(ops->be, 0, 0, n, in, out, 1.0f, dyb ? (const void *)dyb : (const void *)dy,
                       dyb ? MT_ELEM_BF16 : MT_ELEM_F32, out, W, w->bf16_ok ? MT_ELEM_BF16 : MT_ELEM_F32, in, dx, in);
}
/* xb: NULL, or x's bf16 twin (written by its producer: bf16(x) exactly, the same operand values);
 * dyb: NULL, or dy's bf16 twin (the same rule; the lm head's dlogits from xent_fused_bf16): with a
 * shadow the GEMMs read it instead of dy (dy is not read then and may be NULL). fp32 mode (no
 * shadow) reads dy, never the twins. */
static inline void wlinear_backward_db(const struct mt_ops_i *ops, float *dx, float beta_dx, float *dw,
                                       const float *dy, const mt_bf16 *dyb, const float *x, const mt_bf16 *xb,
                                       struct mt_param *w, int n, int in, int out)
{
    if (n <= 0) return;
    const float beta_dw = dw ? grad_beta(w, dw) : 1.0f;
    if (!w->bf16) { linear_backward(ops, dx, beta_dx, dw, beta_dw, dy, x, w->data, n, in, out); return; }
    const void *W = w->bf16_ok ? (const void *)w->bf16 : (const void *)w->data;
    const void *DY = dyb ? (const void *)dyb : (const void *)dy;
    const enum mt_elem dyt = dyb ? MT_ELEM_BF16 : MT_ELEM_F32;
    if (dw)
        ops->gemm_bf16(ops->be, 1, 0, out, in, n, 1.0f, DY, dyt, out, xb ? (const void *)xb : (const void *)x,
                       xb ? MT_ELEM_BF16 : MT_ELEM_F32, in, beta_dw, dw, in);
    if (dx) ops->gemm_bf16(ops->be, 0, 0, n, in, out, 1.0f, DY, dyt, out, W, w->bf16_ok ? MT_ELEM_BF16 : MT_ELEM_F32, in,
                           beta_dx, dx, in);
}
/* proj_bwd_b's backward for a dy its producer wrote as bf16 only (dyb; the
 * attention's dq', dk', dv): dW += dy^T x where w trains, dx = beta dx + dy W.
 * No adapter on w (LoRA's terms read the fp32 dy). */
static inline void proj_bwd_dyb(const struct mt_ops_i *ops, float *dx, float beta_dx, struct mt_param *w,
                                const mt_bf16 *dyb, const float *x, const mt_bf16 *xb, int n, int in, int out)
{
    MT_ASSERT(!w->lora_a);
    wlinear_backward_db(ops, dx, beta_dx, w->frozen ? NULL : w->grad, NULL, dyb, x, xb, w, n, in, out);
}
/* w's GEMM operand: its bf16 shadow when fresh, else the fp32 data (gemm_bf16 rounds it) */
static inline const void *wlinear_op(const struct mt_param *w, enum mt_elem *t)
{
    *t = w->bf16_ok ? MT_ELEM_BF16 : MT_ELEM_F32;
    return w->bf16_ok ? (const void *)w->bf16 : (const void *)w->data;
}
/* n projections' operands (wlinear_op) as one (rows, in) matrix, rows their outputs'
 * sum: where they lie back to back in order with one element type, as one rank's
 * carve lays out a piece's parameters and their shadows (registry order); else NULL */
static inline const void *params_whole(struct mt_param *const *w, int n, int64_t rows, enum mt_elem *t)
{
    const void *first = wlinear_op(w[0], t);
    const char *next = (const char *)first;
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        enum mt_elem ti;
        if (wlinear_op(w[i], &ti) != (const void *)next || ti != *t) return NULL;
        next += (size_t)(w[i]->len[0] * w[i]->len[1]) * (ti == MT_ELEM_BF16 ? sizeof(mt_bf16) : sizeof(float));
        sum += w[i]->len[0];
    }
    return sum == rows ? first : NULL;
}
/* ... and their fp32 gradients as one matrix (NULL: not back to back, or one frozen) */
static inline float *grads_whole(struct mt_param *const *w, int n)
{
    for (int i = 0; i < n; i++) {
        if (w[i]->frozen || !w[i]->grad) return NULL;
        if (i > 0 && w[i]->grad != w[i - 1]->grad + w[i - 1]->len[0] * w[i - 1]->len[1]) return NULL;
    }
    return w[0]->grad;
}
/* The backward of n projections of one input x (n_rows, in) whose outputs' gradients
 * are one operand dy (n_rows, ld) of type dyt (bf16: written so by their producers;
 * fp32: rounded in the call): projection i's rows of W (its len[0] outputs) are its
 * columns of dy, in order (their sum is ld). The base weights' terms only: an
 * adapter's are the caller's (LoRA's read the fp32 dy: mamba.c's lora_bwd_add; the
 * bf16-only callers, attention and the SwiGLU, take no adapter on these weights).
 * dW_i (+)= dy_i^T x where w_i trains; dx = beta_dx dx + sum_i dy_i W_i.
 * One GEMM for all dW and one for dx where the gradients / operands lie back to
 * back (grads_whole, params_whole), over K = ld: dx written once instead of once
 * and then read and rewritten per further projection in fp32, and x read once for
 * every dW; else a GEMM a projection at its columns (an empty one, 0 rows under TP,
 * writes nothing: its gradient zeroed if nothing wrote it yet). Attention's q/k/v,
 * the SwiGLU's gate/up, Mamba-3's seven in-projection blocks.
 * dx_b: NULL, or room (n_rows, in) bf16 for dx (dh_bf16_room): where dx is one GEMM's
 * output (whole operands, beta_dx 0) it is written there as bf16 alone and the call
 * returns 1 (dx not written); else 0. */
static inline int proj_bwd_rows(const struct mt_ops_i *ops, float *dx, float beta_dx, struct mt_param *const *w,
                                int n, const void *dy, enum mt_elem dyt, int ld, const float *x, const mt_bf16 *xb,
                                int n_rows, int in, mt_bf16 *dx_b)
{
    if (n_rows <= 0) return 0;
    const void *X = xb ? (const void *)xb : (const void *)x;
    const enum mt_elem xt = xb ? MT_ELEM_BF16 : MT_ELEM_F32;
    const size_t es = dyt == MT_ELEM_BF16 ? sizeof(mt_bf16) : sizeof(float);
    enum mt_elem tw;
    const void *W = params_whole(w, n, ld, &tw);
    float *gw = grads_whole(w, n);
    const int out_b = W && dx_b && beta_dx == 0.0f && ops->gemm_bf16_out;
    if (gw) ops->gemm_bf16(ops->be, 1, 0, ld, in, n_rows, 1.0f, dy, dyt, ld, X, xt, in, grad_beta_all(w, n), gw, in);
    if (out_b) ops->gemm_bf16_out(ops->be, 0, 0, n_rows, in, ld, 1.0f, dy, dyt, ld, W, tw, in, dx_b, in);
    else if (W) ops->gemm_bf16(ops->be, 0, 0, n_rows, in, ld, 1.0f, dy, dyt, ld, W, tw, in, beta_dx, dx, in);
    if (gw && W) return out_b;
    int off = 0, first = 1;
    for (int i = 0; i < n; i++) {
        const int rows = (int)w[i]->len[0];
        if (rows <= 0) {
            grad_zero_unwritten(ops, w[i]);   /* an empty projection: nothing to write */
            continue;
        }
        const void *dyi = (const char *)dy + (size_t)off * es;
        if (!gw && !w[i]->frozen)
            ops->gemm_bf16(ops->be, 1, 0, rows, in, n_rows, 1.0f, dyi, dyt, ld, X, xt, in,
                           grad_beta(w[i], w[i]->grad), w[i]->grad, in);
        if (!W) {
            const void *Wi = wlinear_op(w[i], &tw);
            ops->gemm_bf16(ops->be, 0, 0, n_rows, in, rows, 1.0f, dyi, dyt, ld, Wi, tw, in, first ? beta_dx : 1.0f,
                           dx, in);
        }
        first = 0;
        off += rows;
    }
    return out_b;
}
/* the model's bf16 dy scratch when it holds n > 0 elements, else NULL (none, or too
 * small). The caller may write it: the residual gradient's twin there is dropped. */
static inline int dyb_fits(const struct mt_dyb *dyb, size_t n) { return dyb && dyb->p && n > 0 && n <= dyb->cap; }
static inline mt_bf16 *dyb_room(struct mt_dyb *dyb, size_t n)
{
    if (!dyb_fits(dyb, n)) return NULL;
    dyb->twin_of = NULL;
    return dyb->p;
}
/* the twin no longer stands for its array: the array is about to change, or
 * changed, outside a piece's final norm (model.c, mtp.c) */
static inline void dyb_twin_drop(struct mt_dyb *dyb) { dyb->twin_of = NULL; }
/* precision=bf16: n elements of dy rounded once into the model's bf16 dy scratch, for
 * the GEMMs that read it (a gemm_bf16 given fp32 rounds its operand per call); NULL
 * when there is no scratch or it is too small (they round per call). When the
 * scratch already holds dy's twin (the residual gradient, from the previous piece's
 * norm_bwd_twin), that copy, with no rounding pass. */
static inline const mt_bf16 *dyb_round(const struct mt_ops_i *ops, struct mt_dyb *dyb, const float *dy, size_t n)
{
    if (dyb && dyb->twin_of == dy && dyb->twin_n == n && n > 0) return dyb->p;
    mt_bf16 *p = dyb_room(dyb, n);
    if (p) ops->cast_bf16(ops->be, p, dy, n);
    return p;
}
static inline void wlinear_backward(const struct mt_ops_i *ops, float *dx, float beta_dx, float *dw,
                                    const float *dy, const float *x, const mt_bf16 *xb, struct mt_param *w,
                                    int n, int in, int out)
{
    wlinear_backward_db(ops, dx, beta_dx, dw, dy, NULL, x, xb, w, n, in, out);
}

/* The planner's count of the block input norm's fp32 store, in D a token: 0
 * where the pieces store the bf16 twin alone (attention.c attn_h_unread,
 * mlp.c's gate/up path, mamba.c mamba_h_unread: precision=bf16, no SP, no
 * adapter reading h), else 1. Any LoRA counts as an adapter on h (the code
 * asks per projection): the count errs high there. */
static inline int plan_bf16_twins(const struct mt_block_shape *s)   /* bf16, and the norms have twins: no SP */
{
    return !strcmp(s->cfg->precision, "bf16") && !(s->tp > 1 && s->cfg->sequence_parallel);
}
static inline double plan_norm_h_store(const struct mt_block_shape *s)
{
    return plan_bf16_twins(s) && s->cfg->lora_rank <= 0 ? 0.0 : 1.0;
}

/* The planner's count of the residual gradient's twin (norm_bwd_twin): 1 where
 * a piece's final norm backward writes bf16(dx) (0.5 D more there) and the next
 * piece's dyb_round of dx reads it (its 1.5 D rounding pass gone):
 * precision=bf16 without SP; else 0. First order: the top block's first reader
 * (after the head) and a wrapper's steps still round. */
static inline double plan_norm_twin(const struct mt_block_shape *s) { return plan_bf16_twins(s) ? 1.0 : 0.0; }
/* The planner's count of d h as bf16 (dh_bf16_room): 1 where a piece's dX GEMM writes
 * it so and the input norm's backward reads it at 2 bytes (0.5 D less there; the
 * GEMM's store is not priced): precision=bf16, one model rank (as the planner's shape
 * knows it), no adapter; else 0 */
static inline double plan_dh_bf16(const struct mt_block_shape *s)
{
    return !strcmp(s->cfg->precision, "bf16") && s->tp <= 1 && s->cfg->lora_rank <= 0 ? 1.0 : 0.0;
}
/* The planner's count of the residual add in the output GEMM (resid_in_gemm): 1 where
 * the input norm does not seed x_out (1 D less written a forward; the GEMM's read of
 * x_in instead of x_out is not priced): precision=bf16, one model rank; else 0. The
 * pieces that take it ask for their own paths too (mlp.c: gate/up stored bf16, mamba.c:
 * the seeded, adapter-free mixer) */
static inline double plan_resid_gemm(const struct mt_block_shape *s)
{
    return !strcmp(s->cfg->precision, "bf16") && s->tp <= 1 ? 1.0 : 0.0;
}

/* head_dim as config.c resolves it (0: d_model / n_head): attention's head
 * width and the RoPE tables' (model.c, infer.c). */
static inline int model_head_dim(const struct mt_config *cfg)
{
    return cfg->head_dim > 0 ? cfg->head_dim : (cfg->n_head > 0 ? cfg->d_model / cfg->n_head : 0);
}

/* ---- the narrow context of a piece (docs/architecture.md, "Block kinds") ----
 * What a converted piece's carve / forward / backward may touch, instead of
 * the whole struct mt_model: the ops table, the layer (its weights, params and
 * saved activations), the dims it needs, the shared scratch, and the
 * collective handle of its axis (struct mt_tp_axis / mt_ep_axis, whose
 * collectives live in src/parallel: mt_axis.h). model_piece_ctx builds one
 * per layer call. */
struct mt_piece_ctx {
    const struct mt_ops_i *ops;
    struct mt_layer       *ly;       /* weights (ly->w), saved activations          */
    /* this step of ly's block (model.c piece_bind sets them per call) */
    int                    step;     /* its index in the kind's steps               */
    const float           *x_in;     /* (Nr, D) s_i, the stream entering the step   */
    struct mt_param       *g;        /* its input norm gain (ly->w.ln[step])        */
    struct mt_norm_acts   *nm;       /* its saved input norm (&ly->nrm[step])       */
    void                  *st;       /* this piece's own saved activations (its
                                      * ly->state[] entry; model.c sets it per call) */
    void                  *own;      /* this piece's per-model struct (dims, scratch,
                                      * staging: own_bytes; model.c sets it per call) */
    void                  *pw;       /* this piece's parameters in the layer (its
                                      * ly->w_own[] entry; model.c sets it per call) */
    int   N, Nr, D;                  /* rows, residual rows, width (a piece's own dims:
                                      * its pc->own, filled by its setup)            */
    int   B, T;                      /* the microbatch (training: N = B*T)          */
    const float *rope_cos, *rope_sin; /* (T, head_dim/2) training RoPE tables        */
    int   rope_T;                    /* row n reads table row n % rope_T; 0: T (a
                                      * routed block's inner rows: gathered tables) */
    float norm_eps;
    int   recompute, lora;           /* cfg recompute=block; LoRA adapters on       */
    /* shared WORKSPACE scratch (see struct mt_model) */
    float *dx, *dh, *s_full, *s_red;
    float *s_act, *s_dact, *s_dg, *s_du, *s_lora, *s_dlora;
    struct mt_dyb *dyb;              /* bf16 dy scratch (precision=bf16; p NULL else) */
    int   bf16;                      /* precision=bf16: carve the activation twins  */
    const struct mt_loss_norm   *norm;  /* the microbatch's loss normalisation (aux/z) */
    int   layer;                     /* ly's layer number (-1: ly NULL)             */
    const struct mt_config *cfg;     /* the model's config (a piece's own keys)     */
    double *wrap_loss;               /* a wrapper with a loss part: the layer's sum
                                      * (backend memory); NULL: none                */
    /* ReDo (redo_scores.c): while armed, the layer's score accumulators
     * (int64, backend): mlp [F local]; moe [Ee*Fe local experts][Fs shared].
     * The backward adds each SwiGLU's |silu(g)*u| (ops->redo_score_acc). NULL: off */
    int64_t *redo;
    struct mt_tp_axis tp;
    struct mt_ep_axis ep;
};

/* precision=bf16 on one model rank: room for d h (the block input norm's output
 * gradient) as bf16, in dh's own memory, for the piece's dX GEMM (proj_bwd_rows'
 * dx_b) when the input norm's backward is its one reader (no adapter adds to it, no
 * TP reduction sums it); NULL: dh stays fp32. A rounding point, autocast's (a bf16
 * Linear's input gradient): 4 bytes an element of d h not moved (the GEMM's store
 * and the norm's read at 2 bytes, not 4) */
static inline mt_bf16 *dh_bf16_room(const struct mt_piece_ctx *pc)
{
    const struct mt_ops_i *ops = pc->ops;
    return pc->bf16 && pc->tp.tp == 1 && ops->rmsnorm_backward_bf16 && ops->gemm_bf16_out ? (mt_bf16 *)pc->dh : NULL;
}
/* A piece's last op: dx += rmsnorm_backward(dh) over its Nr rows (the step's input
 * norm, accumulate 1); dh_b: NULL, or dh as bf16 (dh_bf16_room; dh then unread). In
 * precision=bf16, where the backend has the bf16 entry and the dy scratch holds the
 * rows, the same pass also leaves bf16(dx) there (the residual gradient's twin:
 * struct mt_dyb), so the next piece's first dyb_round(dx) is a read, not a rounding
 * pass (the same bits). */
static inline void norm_bwd_twin(const struct mt_piece_ctx *pc, const float *dh, const mt_bf16 *dh_b)
{
    const struct mt_ops_i *ops = pc->ops;
    const size_t n = (size_t)pc->Nr * (size_t)pc->D;
    /* under SP the next piece's GEMMs read the gathered rows, never dx itself: no twin */
    mt_bf16 *tw = pc->bf16 && !pc->tp.sp && ops->rmsnorm_backward_bf16 ? dyb_room(pc->dyb, n) : NULL;
    if (!tw && !dh_b) {
        ops->rmsnorm_backward(ops->be, pc->dx, pc->g->grad, dh, pc->x_in, pc->g->data, pc->nm->rstd, pc->Nr, pc->D, 1);
        return;
    }
    ops->rmsnorm_backward_bf16(ops->be, pc->dx, tw, pc->g->grad, dh_b ? NULL : dh, pc->x_in, pc->g->data,
                               pc->nm->rstd, pc->Nr, pc->D, 1, dh_b);
    if (!tw) return;
    pc->dyb->twin_of = pc->dx;
    pc->dyb->twin_n = n;
}
/* A piece's output projection w adding its branch onto the residual stream takes the
 * add into its GEMM: y = r + x W^T with r the step's input stream x_in, read by the
 * GEMM's epilogue (ops->gemm_bf16_resid) where the input norm would have seeded y = r
 * first, 4 bytes an element written and read back (the same bits). Where w runs its
 * bf16 GEMM (a shadow), the step's norm writes its twin (rmsnorm_resid_forward_bf16,
 * which then takes no resid), on one model rank (under TP the branch is a partial sum
 * added by tpa_exit_add after its reduction) */
static inline int resid_in_gemm(const struct mt_piece_ctx *pc, const struct mt_param *w)
{
    return pc->tp.tp == 1 && w->bf16 && pc->nm->hb && pc->ops->gemm_bf16_resid && pc->ops->rmsnorm_resid_forward_bf16;
}
/* y (n, out) = r + x W^T, one GEMM (resid_in_gemm; w shadowed) */
static inline void wlinear_forward_resid(const struct mt_ops_i *ops, float *y, const float *r, const float *x,
                                         const mt_bf16 *xb, const struct mt_param *w, int n, int in, int out)
{
    if (n <= 0) return;
    enum mt_elem wt;
    const void *W = wlinear_op(w, &wt);
    ops->gemm_bf16_resid(ops->be, 0, 1, n, out, in, 1.0f, xb ? (const void *)xb : (const void *)x,
                         xb ? MT_ELEM_BF16 : MT_ELEM_F32, in, W, wt, in, r, y, out);
}
/* model.c: the narrow context of layer ly (ly may be NULL: dims only). */
void model_piece_ctx(struct mt_model *m, struct mt_layer *ly, struct mt_piece_ctx *pc);

/* ---- lora.c: a projection with its adapters (docs/lora.md) ----
 * proj_fwd: y = x W^T + beta y, plus (alpha/r) (x A^T) B^T when W has adapters.
 * proj_bwd: dx = dy W + beta_dx dx (+ the adapter's path); dW += dy^T x
 * unless W is frozen; dA, dB +=. Shapes are W's local box: in = W->len[1],
 * out = W->len[0]; the adapters' boxes match by their layout rule.
 * t, dt: (n, r) scratch (s_lora, s_dlora). */
void proj_fwd(const struct mt_ops_i *ops, float *t, float *y, const float *x, const struct mt_param *w, int n, int in,
              int out, float beta);
void proj_bwd(const struct mt_ops_i *ops, float *t, float *dt, float *dx, float beta_dx, struct mt_param *w,
              const float *dy, const float *x, int n, int in, int out);
/* the same with x's bf16 twin xb (NULL: none): the base GEMMs read xb (wlinear_*);
 * dyb: NULL, or the scratch above */
void proj_fwd_b(const struct mt_ops_i *ops, float *t, float *y, const float *x, const mt_bf16 *xb,
                const struct mt_param *w, int n, int in, int out, float beta);
void proj_bwd_b(const struct mt_ops_i *ops, float *t, float *dt, float *dx, float beta_dx, struct mt_param *w,
                const float *dy, const float *x, const mt_bf16 *xb, int n, int in, int out, struct mt_dyb *dyb);
/* proj_fwd_b with beta 1 onto y = r, the add in the base GEMM (resid_in_gemm: w shadowed) */
void proj_fwd_resid(const struct mt_ops_i *ops, float *t, float *y, const float *r, const float *x, const mt_bf16 *xb,
                    const struct mt_param *w, int n, int in, int out);
/* The adapter half alone, for one A shared by nb stacked base matrices w[b]
 * (rows[b], in) whose outputs are column slices of y / dy (row stride ldy):
 * y_b += s (x A^T) B_b^T; backward dB_b, dA +=, dx += (the base's GEMMs are
 * the caller's). w[0]->lora_a is the A; nothing happens without one. */
void lora_fwd_add(const struct mt_ops_i *ops, float *t, float *y, int ldy, const float *x,
                  const struct mt_param *const *w, const int *rows, int nb, int n, int in);
void lora_bwd_add(const struct mt_ops_i *ops, float *t, float *dt, float *dx, const float *dy, int ldy, const float *x,
                  struct mt_param *const *w, const int *rows, int nb, int n, int in);

/* ---- layer files ---- */

/* redo_scores.c: units (score accumulators) layer l holds on this rank (0:
 * not on this stage, or no SwiGLU); the first accumulator of layer l (its
 * offset in m->redo_acc); the carve of m->redo_acc (redo_every > 0). */
size_t model_redo_layer_units(const struct mt_model *m, int l);
size_t model_redo_offset(const struct mt_model *m, int l);
void   model_redo_carve(struct mt_model *m, struct mt_carver *c);

/* mlp.c: SwiGLU y = (silu(h Wg^T) * (h Wu^T)) Wd^T over n rows of width D, hidden F,
 * every projection through proj_fwd (t: the LoRA scratch s_lora).
 * out = y (accumulate 0) or out += y (accumulate 1); g, u (n, F) saved; act (n, F) scratch. */
void mlp_forward(const struct mt_ops_i *ops, float *t, float *out, int accumulate, float *g, float *u, float *act,
                 const float *h, const struct mt_param *wg, const struct mt_param *wu, const struct mt_param *wd,
                 int n, int D, int F);
/* dh = (accumulate 0) or += (accumulate 1); the weights' grads += (frozen W: none;
 * adapters: +=, lora.c). Scratch act, dact, dg, du (n, F); t, dt the LoRA scratch. */
void mlp_backward(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act, float *dact,
                  float *dg, float *du, const float *dout, const float *h, const float *g, const float *u,
                  struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D, int F);
/* the same with the bf16 operands of precision=bf16 (each NULL: that operand fp32, rounded
 * in the call): hb = bf16(h), act_b scratch (n, F) for bf16(act), dyb the dy scratch;
 * redo: the ReDo scores of its F units (int64 (F), +=; NULL: none). The backward may
 * leave bf16(du) in act_b and bf16(dg) in dyb->p, and dg, du unwritten (mlp.c dgu_direct),
 * or bf16(act) in act_b and bf16(dg), bf16(du) in the first halves of dg, du (act_fused) */
void mlp_forward_b(const struct mt_ops_i *ops, float *t, float *out, int accumulate, float *g, float *u, float *act,
                   mt_bf16 *act_b, const float *h, const mt_bf16 *hb, const struct mt_param *wg,
                   const struct mt_param *wu, const struct mt_param *wd, int n, int D, int F);
void mlp_backward_b(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act,
                    mt_bf16 *act_b, float *dact, float *dg, float *du, const float *dout, const float *h,
                    const mt_bf16 *hb, const float *g, const float *u, struct mt_param *wg, struct mt_param *wu,
                    struct mt_param *wd, int n, int D, int F, struct mt_dyb *dyb, int64_t *redo);
/* the same, adding the ReDo scores of its F units to redo (int64 (F), +=; NULL: none) */
void mlp_backward_redo(const struct mt_ops_i *ops, float *t, float *dt, float *dh, int accumulate, float *act,
                       float *dact, float *dg, float *du, const float *dout, const float *h, const float *g,
                       const float *u, struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D,
                       int F, int64_t *redo);

/* the same with gate and up stored bf16 (gb, ub (n, F): their GEMMs' bf16 outputs) and
 * d act too (mlp.c mlp_gu_bf16; the MoE experts' moe_gu_bf16): no adapter on gate, up or
 * down, no ReDo. Forward: out = y, or resid + y (resid not NULL: down's GEMM adds it;
 * accumulate ignored), or out += y. Backward: act_b as mlp_backward_b's fused path, dact,
 * dg, du scratch (n F floats each; bf16 there); dh_b NULL or room for dh as bf16
 * (returns 1 where dh went there, not written; else 0) */
void mlp_forward_gu(const struct mt_ops_i *ops, float *t, float *out, int accumulate, const float *resid,
                    mt_bf16 *gb, mt_bf16 *ub, mt_bf16 *act_b, const float *h, const mt_bf16 *hb,
                    const struct mt_param *wg, const struct mt_param *wu, const struct mt_param *wd, int n, int D,
                    int F);
int mlp_backward_gu(const struct mt_ops_i *ops, float *dh, int accumulate, mt_bf16 *act_b, float *dact, float *dg,
                    float *du, const float *dout, const float *h, const mt_bf16 *hb, const mt_bf16 *gb,
                    const mt_bf16 *ub, struct mt_param *wg, struct mt_param *wu, struct mt_param *wd, int n, int D,
                    int F, struct mt_dyb *dyb, mt_bf16 *dh_b);

/* The choice mlp_forward_gu / mlp_backward_gu make for gate and up (mlp.c
 * mlp_gu_bf16, moe.c moe_gu_bf16 / moe_shared_gu), decided once from the config:
 * the entries they run on (ops NULL, the plan: all there), and whether LoRA
 * adapts any of `targets` (an adapter reads and adds fp32; a list that does not
 * parse counts as yes). */
static inline int mlp_gu_ops(const struct mt_ops_i *o)
{
    return !o || (o->gemm_bf16_out && o->swiglu_forward_bf16_gu && o->swiglu_backward_act_bf16_gu);
}
static inline int lora_adapts(const struct mt_config *cfg, unsigned targets)
{
    unsigned mask = 0;
    char bad[32];
    return cfg->lora_rank > 0 &&
           (mt_config_lora_mask(cfg->lora_targets, &mask, bad, sizeof bad) != 0 || (mask & targets) != 0);
}

/* moe.c: what the model reads of the MoE piece's own struct (own: its
 * pc->own, model_own): the load histogram (L, E) and its reset, and the aux
 * and z sums of layers [l0, l1) of the last forward, copied to the host in
 * one transfer (returns the host (L, 2) array, rows l0.. valid). */
const double *moe_own_load(const struct mt_ops_i *ops, void *own);
void moe_own_load_reset(const struct mt_ops_i *ops, void *own);
int moe_own_device_sizes(const void *own, const char **why);
int moe_own_gate_up_bf16(const void *own);   /* the routed experts' gate, up stored bf16 (moe_gu_bf16) */
const double *moe_own_losses(const struct mt_ops_i *ops, void *own, int l0, int l1);
/* moe.c: the top-k experts of an MoE layer's state (its ly->state[MT_PIECE_FFN]), (Nm, k) on the backend; for tests. */
const int32_t *moe_state_topk(const void *state);
/* mod.c: a routed layer's selection (N: inner row or -1), NULL for an unrouted one (tests) */
const int32_t *mod_state_slot(const struct mt_layer *ly);

/* The pieces of the block-kind table (blocks.c). */
extern const struct mt_piece mt_piece_attention;   /* attention.c */
extern const struct mt_piece mt_piece_mlp;         /* mlp.c       */
extern const struct mt_piece mt_piece_moe;         /* moe.c       */
extern const struct mt_piece mt_piece_mamba;       /* mamba.c     */

/* model.c: the fused pre-norm of a step that writes the stream itself (the
 * ffn pieces mlp.c, moe.c; pc bound to the step).
 * fwd: nm->h_n = rmsnorm(x_in) * g on this rank's Nr rows of n, and
 * x_out = x_in (the residual path; the piece adds its branch), one pass; x_out NULL:
 * no seed (the piece's output GEMM adds x_in itself: resid_in_gemm).
 * bwd: dx += rmsnorm_backward(dhr), dhr = d nm->h_n (Nr, D); dhr_b: NULL, or dhr as bf16
 * (dh_bf16_room; dhr then unread).
 * carve_pc: what such a piece saves first: the norm (nm->h_n, nm->rstd). */
/* twin_only: the norm stores its bf16 twin hb alone (h_n not written), for a
 * piece whose GEMMs all read hb (rmsnorm_resid_forward_bf16 with out NULL) */
void ffn_norm_fwd(const struct mt_piece_ctx *pc, float *x_out, int n, int twin_only);
void ffn_norm_bwd(const struct mt_piece_ctx *pc, const float *dhr, const mt_bf16 *dhr_b);
void ffn_norm_carve_pc(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly);
/* mt_pspec.bind values: MT_BIND_NORM the step's input norm gain
 * (ly->w.ln[step], read as pc->g), MT_BIND_OWN a field of the piece's own
 * weight struct `type` (in ly->w_own[step]; flagged by MT_BIND_PIECE). */
#define MT_BIND_NORM 0x20000000
#define MT_BIND_PIECE 0x40000000
#define MT_BIND_OWN(type, field) ((int)(MT_BIND_PIECE | offsetof(type, field)))
/* MT_BIND_DW_GEMM: or'ed into a spec's bind (alone: no binding), says every
 * write of the parameter's gradient is a whole-tensor GEMM through
 * wlinear_backward_db (mt_param.h grad_gemm: no zeroing pass). */
#define MT_BIND_DW_GEMM 0x10000000
#define MT_BIND_OWN_DW(type, field) (MT_BIND_OWN(type, field) | MT_BIND_DW_GEMM)

/* head.c: 1 when a forward (with_loss) can run the head in logits_rows chunks:
 * the fused cross-entropy with the bf16 twin (every row's dlogits kept in bf16). */
int head_chunked(const struct mt_model *m, int with_loss);

/* The head as a piece (head.c): the final norm, lm_head and cross-entropy
 * as one unit (unit L+1, the last stage's), declaring its parameters (in
 * registry order: model.norm.weight, lm_head.weight), its FLOPs and its
 * loss parts, like a block's pieces (mt_blocks.h) do. */
struct mt_head_piece {
    const char *name;                                              /* "head"                   */
    void   (*params)(int64_t V, int64_t D, mt_pspec_fn fn, void *user);
    double (*mm_per_token)(int64_t V, int64_t D);                  /* matmul params (x6: FLOPs) */
    /* append its loss parts (mt_model.h): "lm" (extras 0), then after the
     * router's "aux" and "z" its extra parts (extras 1); MT_ERR_CONFIG for a
     * bad test hook value */
    enum mt_status (*loss_register)(struct mt_ctx *ctx, struct mt_model *m, int extras);
    /* h_final, logits (n rows); with_loss: per-row CE, and sum[k] += the
     * un-normalised sum of each of its loss parts k (lm: the sum of CE) */
    void   (*forward)(struct mt_model *m, int n, int with_loss, double *sum);
    /* dlogits in place, dWlm +=, dg_final +=, dx = d x_final (OVERWRITES):
     * the gradient of every head part that enters the backward */
    void   (*backward)(struct mt_model *m);
};
extern const struct mt_head_piece mt_head;

/* ---- mtp.c: the MTP modules (SPEC 1e, docs/model.md "MTP") ----
 * Parameters after the head's (registry order; the head's ZeRO unit):
 * module k's model.mtp.{k-1}.{enorm,hnorm,norm,eh_proj}.weight
 * (mtp_module_params, full names), then its block's, named
 * model.mtp.{k-1}.block.<suffix> (model.c walks the kind's steps). */
void   mtp_module_params(const struct mt_model *m, int k, mt_pspec_fn fn, void *user);
void   mtp_loss_register(struct mt_model *m);
/* mod.c: rows C = ceil(mod_capacity T) a routed block runs per sequence of T */
int    mod_rows(const struct mt_config *cfg, int T);
void   mtp_carve(struct mt_model *m, struct mt_carver *c, struct mt_slot *S);
/* forward, first stage (wte valid: its ZeRO unit): the modules' embedding rows,
 * into the slot (one stage) or into `tail` (Dm blocks of (Nr, D): a pipeline) */
void   mtp_embed_forward(struct mt_model *m, const int32_t *targets_host, float *tail);
/* pipeline, a later stage: the rows from the input's tail (last stage: into the
 * slot, with the rows' ids; else: on into the output's tail) */
void   mtp_stage_rows_in(struct mt_model *m, const int32_t *targets_host, const float *tail);
/* pipeline, a stage after the first: the rows' gradient into dx's tail (last
 * stage: from the slot; else: from dy_out's tail) */
void   mtp_stage_rows_back(struct mt_model *m, const float *dy_tail);
/* forward, after the head: h' , the blocks, the logits and sum[part] += CE sums */
enum mt_status mtp_forward(struct mt_ctx *ctx, struct mt_model *m, double *sum);
/* backward, after the head's (dx = d x_final): dx += the modules' d h^0 */
enum mt_status mtp_backward(struct mt_ctx *ctx, struct mt_model *m);
/* backward, first stage: dwte += the modules' embedding rows' gradients (from
 * the slot, or from `tail`: a pipeline) */
void   mtp_embed_backward(struct mt_model *m, const float *tail);
double mtp_flops_per_token(const struct mt_config *cfg, const struct mt_block_shape *s);
/* model.c's block calls, for the modules' blocks */
enum mt_status model_block_backward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly);
void model_carve_block(struct mt_model *m, struct mt_carver *c, struct mt_layer *ly, int kind);
struct mt_piece_fwd model_train_fwd(const struct mt_model *m, float *x_out, int want_loss);

/* The loss-part registry (mt_model.h): each piece that computes loss parts
 * appends them with model_loss_add (head.c; returns the part's index), in
 * mt_model_create: the head's "lm", moe.c's "aux" and "z"
 * (moe_loss_register), the head's extras. */
int  model_loss_add(struct mt_model *m, const struct mt_loss_part *p);
/* The global count part p's sums are divided by (mt_model.h, enum mt_loss_reduce). */
double model_loss_count(const struct mt_loss_norm *norm, const struct mt_loss_part *p);
void moe_loss_register(struct mt_model *m);

/* model.c: value of every element of p's owned box, row-major (len0, len1),
 * as a pure function of (seed, p->name, global index), on all OpenMP
 * threads. out_host (numel). model_param_fill_serial: the same on one thread
 * in index order (the reference the parallel fill is tested against). */
void model_param_fill(const struct mt_param *p, uint64_t seed, float *out_host);
void model_param_fill_serial(const struct mt_param *p, uint64_t seed, float *out_host);

/* model.c: cos/sin tables (tmax, hd/2) built in double, rounded to float once. */
enum mt_status model_rope_build(struct mt_ctx *ctx, const struct mt_model *m, float *cos_dev, float *sin_dev, int tmax);

/* model.c: floats of one layer's decode state for t_max positions (its
 * steps' decode_floats in order), for infer.c. */
size_t model_decode_floats(struct mt_model *m, int kind, int t_max);
/* model.c: x_out = block(x_in) for layer ly (its kind's steps in order);
 * decoding: a->state is the layer's state (model_decode_floats), cut per step. */
enum mt_status model_block_forward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly,
                                   struct mt_piece_fwd *a);

#endif /* MT_MODEL_IMPL_H */
