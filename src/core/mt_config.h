/*
 * mt_config.h — every configuration key, declared once.
 *
 * Keys are SPEC.md section 1 (model) plus the training keys of section 5.
 * They come from defaults, then a JSON config file (--config F), then
 * `--set key=value` overrides, in that order. The table in config.c is the
 * single source of truth for names, types, defaults, ranges and help text;
 * `meshtrain --help` and the receipt are generated from it.
 *
 * 0 for a derived key means "derive it" (head_dim = D/H, mlp_hidden =
 * ceil(8D/3) rounded up to 64, expert_hidden = F/4, total_steps = the run's
 * steps); mt_config_resolve() fills them in and checks every shape rule.
 */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <stdint.h>
#include "mt_core.h"

#define MT_MAX_LAYERS 256

/* Most MTP modules (mtp_depth). */
#define MT_MTP_MAX_DEPTH 4

struct mt_config {
    /* ---- model (SPEC.md section 1) ---- */
    int   vocab_size;            /* V; 0 = from the tokenizer / data dir          */
    int   n_layer;               /* L                                              */
    int   d_model;               /* D                                              */
    int   n_head;                /* H                                              */
    int   n_kv_head;             /* K                                              */
    int   head_dim;              /* hd; 0 = D / H                                  */
    int   mlp_hidden;            /* F; 0 = ceil(8D/3) rounded up to 64             */
    int   seq_len;               /* T                                              */
    char  pattern[MT_MAX_LAYERS + 1]; /* "A"/"E" per layer; "" = "A" x L           */
    int   n_experts;
    int   top_k;
    int   expert_hidden;         /* 0 = F / 4                                      */
    int   shared_expert_hidden;  /* 0 = no shared expert                           */
    int   n_null_experts;        /* Z zero-computation experts (SPEC 1e); 0 = none */
    int   mtp_depth;             /* MTP modules Dm (SPEC 1e); 0 = off               */
    float mtp_loss_coef;         /* MTP: lambda; the loss adds lambda/Dm sum_k L_k  */
    char  mtp_block[4];          /* MTP: the module block's pattern letter           */
    float aux_loss_coef;
    float z_loss_coef;
    int   mamba_d_state;         /* M blocks (SPEC 1c): state N, even              */
    int   mamba_expand;          /* d_inner = mamba_expand * d_model               */
    int   mamba_headdim;         /* P, divides d_inner                             */
    int   mamba_ngroups;         /* G, divides nheads = d_inner / P                */
    int   mamba_chunk;           /* scan chunk (speed only)                        */
    float rope_theta;
    float norm_eps;
    float logit_softcap;         /* 0 = off                                        */

    /* ---- training ---- */
    int   batch_size;            /* global sequences per step                      */
    int   microbatches;          /* gradient-accumulation steps per step           */
    char  optimizer[16];         /* "muon" (default) | "adamw" (every param AdamW) */
    float lr;                    /* AdamW lr                                       */
    float muon_lr;
    float muon_momentum;
    float adam_beta1, adam_beta2, adam_eps;
    float weight_decay;
    float grad_clip;             /* 0 = off                                        */
    int   warmup_steps;
    int   total_steps;           /* 0 = the run's --steps                          */
    float min_lr_frac;
    char  lr_schedule[16];       /* "cosine" | "linear" | "constant"               */
    char  data_order[16];        /* "sequential" | "shuffled"                      */
    uint64_t seed;
    int   eval_every;            /* 0 = never                                      */
    int   eval_batches;          /* validation batches per evaluation              */
    int   save_every;            /* 0 = only at the end                            */
    int   save_final;            /* 1 = checkpoint at the end (default); 0 = none  */
    int   keep_last;             /* newest checkpoints of this command kept; 0 all */
    char  backend[16];           /* "cpu" | "cuda"                                 */
    int   lora_rank;             /* r > 0: LoRA adapters on lora_targets, base frozen (docs/lora.md) */
    float lora_alpha;            /* scale = alpha / r; 0 = r (scale 1)             */
    char  lora_targets[64];      /* comma list of q,k,v,o,gate,up,down,expert,in_proj,out_proj */
    char  recompute[16];         /* "none" | "block"                               */
    char  precision[8];          /* "fp32" | "bf16" (bf16 weight shadows, docs/cuda.md) */
    int   head_chunk_rows;       /* bf16: the lm head's fp32 logits in chunks of this many rows; 0 = all */
    char  grad_reduce_dtype[8];  /* "fp32" | "bf16" (zero.c: reductions in bf16)   */
    int   sequence_parallel;     /* bool, default 1 (used when tp > 1)             */
    int   reshard_after_forward; /* bool, default 1 (ZeRO-3)                       */
    int   threads;               /* 0 = OMP_NUM_THREADS or all cores               */
    float comm_timeout_s;        /* collective watchdog, seconds; 0 = off          */
    int   redo_every;            /* ReDo (SPEC 1e): recycle dormant SwiGLU units every N steps; 0 = off */
    float redo_tau;              /* ReDo: a unit with normalised score <= tau is recycled */
    int   replica_check_every;   /* replica hash check after every N-th step too; 0 = at the end only */
    float mod_capacity;          /* MoD (SPEC 1e): share c of a sequence's tokens a routed block runs, (0, 1] */
    float mod_aux_coef;          /* MoD: weight of the router's BCE loss (mod_aux part), >= 0 */
};

/* Fill every key with its default. Never fails. */
void mt_config_defaults(struct mt_config *cfg);

/* Apply a JSON object (file contents). Unknown key, wrong type or value out of
 * range -> MT_ERR_INVALID_ARG with a message naming the key. All or nothing.
 * A top-level "knobs" object holds runtime tunables, not config
 * (mt_knobs.h): they are checked always and stored into knobs when it is
 * not NULL (source "config"). */
struct mt_knobs;
enum mt_status mt_config_apply_json(struct mt_ctx *ctx, struct mt_config *cfg, const char *json_text);
enum mt_status mt_config_apply_json_knobs(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_knobs *knobs,
                                          const char *json_text);
enum mt_status mt_config_load_file(struct mt_ctx *ctx, struct mt_config *cfg, const char *path);
enum mt_status mt_config_load_file_knobs(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_knobs *knobs,
                                         const char *path);

/* Apply one "key=value" override. Same errors as above. */
enum mt_status mt_config_set(struct mt_ctx *ctx, struct mt_config *cfg, const char *key_eq_value);

/* Fill derived keys (head_dim, mlp_hidden, expert_hidden, pattern) and check
 * every single-rank shape rule: H % K == 0, head_dim even, D,H,K,L,T > 0,
 * pattern of length L over {A,E}, top_k in [1, n_experts] when any E block,
 * vocab_size in [2, 65536], ... -> MT_ERR_CONFIG naming the rule and numbers.
 * `run_steps` fills total_steps when it is 0. */
/* LoRA target bits (lora_targets: q,k,v,o,gate,up,down,expert,in_proj,out_proj;
 * the last two are the Mamba-3 mixer's projections of M blocks). */
enum { MT_LORA_Q = 1, MT_LORA_K = 2, MT_LORA_V = 4, MT_LORA_O = 8, MT_LORA_GATE = 16, MT_LORA_UP = 32,
       MT_LORA_DOWN = 64, MT_LORA_EXPERT = 128, MT_LORA_IN_PROJ = 256, MT_LORA_OUT_PROJ = 512 };
/* Bits of a comma list; 0, or -1 with the first unknown name in bad. */
int mt_config_lora_mask(const char *list, unsigned *mask, char *bad, size_t bad_len);

enum mt_status mt_config_resolve(struct mt_ctx *ctx, struct mt_config *cfg, int run_steps);

/* Serialise every key as a JSON object string (caller frees with free()).
 * Used by the receipt and the checkpoint manifest. */
char *mt_config_to_json(const struct mt_config *cfg);

/* Two configs describe the same model (every model key equal) — for resume. */
int mt_config_same_model(const struct mt_config *a, const struct mt_config *b, char *why, size_t why_len);

/* Print every key with type, default and help (for --help). */
void mt_config_print_help(void *file /* FILE* */);

/* 1 when layer l's block kind has routed experts (mt_blocks_layer_routed). */
int mt_config_is_moe_layer(const struct mt_config *cfg, int l);

#endif /* MT_CONFIG_H */
