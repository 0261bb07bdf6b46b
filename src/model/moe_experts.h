/*
 * moe_experts.h — the expert MLPs of an MoE block as grouped GEMMs
 * (moe_experts.c). Groups are row ranges of the sorted buffer, back to back
 * from row 0: group g has cnt[g] rows (offsets = 0) or cnt[g+1] - cnt[g]
 * rows (offsets = 1: e.g. the layer's e_off), and the weights of local expert g % ee.
 * y/dx, dy and x are (rows, D); eg, eu (the saved gate/up), the (ep*M, Fe)
 * SwiGLU scratch and the (ep*M, r) LoRA scratch are used at each group's own
 * rows. moe.c runs them when pc->moe.grouped (knob moe_grouped), else its
 * per-expert mlp_forward / mlp_backward loop: the same bits on the cpu table,
 * with or without LoRA. Where md->gu_bf16, eg and eu hold mt_bf16 elements
 * (the GEMMs' bf16 outputs; moe.c carves half the bytes), not floats.
 */
#ifndef MT_MOE_EXPERTS_H
#define MT_MOE_EXPERTS_H

#include <stddef.h>
#include <stdint.h>
#include "model_impl.h"

/* The MoE piece's per-model struct (its pc->own, own_bytes; moe.c's setup
 * fills the dims, its carve_scratch the buffers): private to moe.c and
 * moe_experts.c, the two files of the piece. */
/* The MoE piece's own buffers (moe.c carves them, once per model): scratch
 * shared by every E layer (WORKSPACE), the host staging of routing and the
 * load histogram (OTHER). Nm rows the block sees, M = Nm*k routed slots. */
struct mt_moe_scratch {
    float   *xp, *dxp, *dy;      /* (M, D) permuted inputs / their grads / d expert out          */
    float   *ry, *rdy, *rdx;     /* (ep*M, D) EP: expert outputs / their grads / d inputs, received side */
    float   *drl, *dprobs;       /* (Nm, E) d router logits (the logits in forward), d probs (aux) */
    float   *dgates;             /* (Nm, k)                                                       */
    float   *dlse;               /* (Nm)                                                          */
    /* precision=bf16 (NULL in fp32): the experts' GEMM operands rounded once per chunk of
     * groups, not inside every gemm_bf16 call (moe_experts.c): (ep*M) rows each */
    mt_bf16 *xb;                 /* (ep*M, D)  the expert input x (gate, up; dWg, dWu)            */
    mt_bf16 *ab;                 /* (ep*M, Fe) the SwiGLU output (down; dWd), then du (bf16 direct) */
    mt_bf16 *db;                 /* (ep*M, max(D, Fe)) dy (dWd, dact), then dg (then du if not direct) */
    int32_t *route_work;         /* mt_moe_route_work(M, E) moe_route scratch                     */
    double  *seq;                /* (2, B, E) per-sequence routed-slot counts and prob sums (aux) */
    double  *loss;               /* (L, 2) each layer's aux and z sums of the last forward (device) */
    /* host (OTHER): the test hook's staging, the layers' loss sums */
    float   *h_probs, *h_dprobs; /* (Nm, E) force_routing: probs in, gates out                    */
    int32_t *h_topk;             /* (Nm*k)  force_routing: the forced experts                     */
    double  *h_loss;             /* (L, 2) host copy of loss (mt_model_forward_stage)             */
    size_t  *h_a2a;              /* (4*ep) all-to-all send/recv counts and displs                 */
    int64_t *h_ecnt;             /* (2*E) per-expert slot counts sent / received                  */
    double  *load;               /* (L*E) host copy of load_d, read once a step (moe_own_load)   */
    double  *load_d;             /* (L*E) routed slots per expert since the last reset, counted on the backend */
};


struct mt_moe_dims {             /* what an E block's ffn needs beyond the shared dims */
    int   E, top_k, Fe, Fs, L;       /* experts, routed per token, expert / shared hidden, layers */
    int   Z;                         /* null experts (SPEC 1e): router columns E..E+Z-1   */
    float aux_coef, z_coef;          /* load-balancing and router z loss coefficients     */
    int   force_route;               /* test hook test_force_routing                      */
    int   grouped;                   /* knob moe_grouped: grouped expert GEMMs            */
    int   dev_sizes;                 /* knob moe_sizes: the expert counts stay on the backend  */
    int   gu_bf16;                   /* gate, up (eg, eu) and d act stored bf16 (moe.c moe_gu_bf16) */
    int   shared_gu;                 /* the shared expert's the same (sgp, sup; moe.c moe_shared_gu) */
    char  why_host[160];             /* why not dev_sizes ("" when it is)                  */
};

/* The MoE piece's parameters beyond its input norm (its pc->pw in the layer). */
struct moe_w {
    struct mt_param *router;       /* (E, D)                                      */
    struct mt_param *experts;      /* local expert j (global e0+j): [3j] gate (Fe,D), [3j+1] up, [3j+2] down (D,Fe) */
    struct mt_param *sg, *su, *sd; /* shared expert (Fs,D),(Fs,D),(D,Fs); NULL if Fs == 0 */
};
_Static_assert(sizeof(struct moe_w) <= PIECE_W_MAX, "raise PIECE_W_MAX");
static inline struct moe_w *moe_w(const struct mt_piece_ctx *pc) { return pc->pw; }

struct moe_own {
    struct mt_moe_dims    d;
    struct mt_moe_scratch s;
};
_Static_assert(sizeof(struct moe_own) <= PIECE_OWN_MAX, "raise PIECE_OWN_MAX");
static inline struct mt_moe_dims *moe_dims(const struct mt_piece_ctx *pc) { return &((struct moe_own *)pc->own)->d; }
static inline struct mt_moe_scratch *moe_scr(const struct mt_piece_ctx *pc) { return &((struct moe_own *)pc->own)->s; }
/* The rows of a call, from its context (a routed block's inner call sees
 * fewer than the model's N): under TP the experts see the Nm = N/tp rows of
 * the sequence-parallel region, global rows row0.., M = Nm*k slots. */
static inline int moe_nm(const struct mt_piece_ctx *pc) { return pc->tp.tp > 1 ? pc->N / pc->tp.tp : pc->N; }
static inline int moe_m(const struct mt_piece_ctx *pc) { return moe_nm(pc) * moe_dims(pc)->top_k; }
static inline int moe_row0(const struct mt_piece_ctx *pc) { return pc->tp.tp > 1 ? pc->tp.rank * (pc->N / pc->tp.tp) : 0; }

void moe_experts_forward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee, float *eg,
                         float *eu, float *y, const float *x);
void moe_experts_backward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee,
                          const float *eg, const float *eu, float *dx, const float *dy, const float *x);

/* Device sizes (md->dev_sizes; ep 1, precision=bf16, no LoRA or ReDo): the
 * E experts' groups are the rows [offs[e], offs[e+1]) of the M sorted rows,
 * offs on the backend; each projection is one gemm_grouped_rows or
 * gemm_grouped_sum, each elementwise step one call over all M rows. */
/* x and dy come as their bf16 copies, already in the scratch's xb and db
 * (moe.c writes them by moe_permute_bf16 / moe_combine_backward_bf16). */
void moe_experts_forward_dev(const struct mt_piece_ctx *pc, const int32_t *offs, int M, float *eg, float *eu,
                             float *y);
void moe_experts_backward_dev(const struct mt_piece_ctx *pc, const int32_t *offs, int M, const float *eg,
                              const float *eu, float *dx);

#endif /* MT_MOE_EXPERTS_H */
