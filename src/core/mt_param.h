/*
 * mt_param.h — a model parameter: its global shape and the slice this rank owns.
 *
 * Every parameter knows its global shape and the box of it this rank holds,
 * even when the box is the whole tensor (one rank). A box is a per-dimension
 * [off, off+len) range; the local buffer is that box, row-major:
 *
 *     local[i][j] == global[off[0] + i][off[1] + j]     (shape (len[0], len[1]))
 *
 * 1-D parameters use dim 0 only (len[1] = shape[1] = 1, off[1] = 0).
 * TP row split (Wq/Wk/Wv/Wg/Wu): box on dim 0; column split (Wo/Wd): box on
 * dim 1. Whole experts per rank under EP: the box is the full tensor, and a
 * rank simply does not hold the other experts' parameters.
 *
 * `data` and `grad` are backend memory (host memory for the cpu backend).
 * Gradient rule: `grad` ACCUMULATES (+=) over microbatches; the trainer zeroes
 * it once per step, or, for a gradient written whole by GEMMs (grad_gemm),
 * leaves it and the step's first GEMM writes it with beta 0 (grad_live).
 */
#ifndef MT_PARAM_H
#define MT_PARAM_H

#include <stddef.h>
#include <stdint.h>

enum mt_optim_kind { MT_OPTIM_ADAMW = 0, MT_OPTIM_MUON = 1 };

enum mt_init_kind {
    MT_INIT_NORMAL = 0, /* normal(0, init_std) from mt_rng_normal(seed, stream(name), global index) */
    MT_INIT_ONES   = 1, /* gains */
    MT_INIT_ZEROS  = 2,
    MT_INIT_DT_BIAS = 3, /* Mamba-3 dt_bias: softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] (SPEC 1c) */
    MT_INIT_A_LOG  = 4,  /* Mamba-3 A_log: log(a), a uniform in [1, 16]                              */
};

/* How the `model` (TP) axis splits this parameter. On one rank: NONE. */
enum mt_split { MT_SPLIT_NONE = 0, MT_SPLIT_ROWS = 1, MT_SPLIT_COLS = 2 };

/* What the parameter is, for reduction-group and optimizer decisions. */
enum mt_param_role {
    MT_ROLE_EMBED = 0,   /* wte                                   */
    MT_ROLE_HEAD,        /* lm_head                               */
    MT_ROLE_GAIN,        /* rmsnorm / qk-norm gains (1-D)         */
    MT_ROLE_DENSE,       /* dense block matrices (attn, mlp, shared expert) */
    MT_ROLE_ROUTER,      /* MoE router                            */
    MT_ROLE_EXPERT,      /* routed expert matrices                */
    MT_ROLE_SSM,         /* Mamba-3 per-head / per-state vectors and biases:
                          * AdamW without weight decay, even when 2-D (B_bias) */
};

struct mt_param {
    char    name[128];     /* Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int     ndim;          /* 1 or 2 */
    int64_t shape[2];      /* global shape; shape[1] == 1 when ndim == 1 */
    int64_t off[2];        /* owned box offset (global coordinates) */
    int64_t len[2];        /* owned box extent; local shape */
    size_t  numel;         /* len[0] * len[1] */
    float  *data;          /* (len[0], len[1]) local slice, backend memory */
    float  *grad;          /* same shape; accumulates (+=) */
    enum mt_optim_kind optim;
    enum mt_init_kind  init;
    float   init_std;      /* for MT_INIT_NORMAL */
    int     decay;         /* 1: weight decay applies (2-D parameters only) */
    enum mt_param_role role;
    enum mt_split      split;
    int     layer;         /* block index, -1 for wte / final norm / head */
    int     expert;        /* expert index for MT_ROLE_EXPERT, else -1 */
    int     reduce_model;  /* 1: under TP this rank's grad is a partial sum over the model
                            * group (sequence-parallel rows, split heads): reduce it there too */
    int     layout;        /* enum mt_layout (src/model/mt_blocks.h): the rule split and
                            * reduce_model are derived from; what layout code should read */
    /* LoRA (docs/lora.md). frozen: a base parameter of a LoRA run (no weight
     * gradient is computed for matrices, no update, not in the clip norm).
     * lora_a / lora_b: on a targeted base matrix W (out, in), its adapters
     * A (r, in) and B (out, r) in the registry; y = x W^T + lora_scale (x A^T) B^T. */
    int     frozen;
    struct mt_param *lora_a, *lora_b;
    float   lora_scale;    /* lora_alpha / lora_rank */
    /* precision=bf16 (docs/cuda.md): the weight's bf16 shadow (len[0] x len[1]
     * bf16 values, backend memory, model-owned; NULL: no shadow, the GEMMs
     * read `data`) and whether it holds bf16(data) now. Written by the
     * optimizer's update where its class can (AdamW, mt_optim.h), else by
     * the model at the unit's first forward after mt_model_bf16_invalidate. */
    uint16_t *bf16;
    int       bf16_ok;
    /* Zeroing by first write (docs/zero.md, "Gradient zeroing"). grad_gemm:
     * every write of this gradient is a GEMM over the whole tensor that asks
     * grad_beta (model_impl.h; the piece's spec says so, MT_BIND_DW_GEMM),
     * so a ZeRO-0/1 engine need not zero it: it clears grad_live at the
     * step's start, and the first GEMM takes beta 0 and sets it. grad_live
     * 1: the gradient holds this step's sum so far (zeroed, or written),
     * and a write adds to it. */
    int       grad_gemm, grad_live;
};

static inline size_t mt_param_global_numel(const struct mt_param *p)
{
    return (size_t)p->shape[0] * (size_t)p->shape[1];
}

#endif /* MT_PARAM_H */
