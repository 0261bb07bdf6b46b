/*
 * config.c — the table of every configuration key, and everything driven by it.
 *
 * Invariant: `keys[]` below is the single source of truth. Defaults, JSON
 * apply, `--set key=value`, --help, to_json and same_model all walk it; a key
 * that is not in the table does not exist. Defaults are written as strings and
 * go through the same parser as `--set`, so a default can never violate its
 * own range. Ranges in the table are inclusive and checked when a value is
 * set (MT_ERR_INVALID_ARG); the cross-key shape rules and the strict bounds
 * (eps > 0, beta < 1, ...) are checked by mt_config_resolve (MT_ERR_CONFIG).
 *
 * Choices the spec leaves open (also in the --help text):
 *   - min_lr_frac defaults to 0.0 (cosine decays to zero, nanochat-style).
 *   - seed (u64) is written to JSON as a number when it is exactly
 *     representable as a double (<= 2^53), else as a decimal string; both
 *     forms are accepted on input, so to_json -> apply_json is exact.
 *   - Floats are written with the shortest %.Ng (N = 6..9) that reads back
 *     to the same float, so the receipt shows 0.01 rather than 0.0099999998.
 */
#define _GNU_SOURCE
#include "mt_config.h"
#include "mt_fileio.h"
#include "mt_knobs.h"
#include "../model/mt_blocks.h"   /* pattern letters: the block-kind table */

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum key_type { KT_INT, KT_FLOAT, KT_STRING, KT_BOOL, KT_U64 };

struct key {
    const char   *name;
    enum key_type type;
    size_t        off;      /* offsetof into struct mt_config                 */
    size_t        size;     /* KT_STRING: buffer size including the NUL       */
    const char   *def;      /* default, parsed like a --set value             */
    double        min, max; /* inclusive, numeric keys only                   */
    const char   *allowed;  /* KT_STRING enums: "a|b|c"; NULL = free text     */
    int           model;    /* 1: part of the model shape (same_model)        */
    const char   *help;
};

#define OFF(f)     offsetof(struct mt_config, f)
#define SZ(f)      sizeof(((struct mt_config *)0)->f)
#define IMAX       2147483647.0
#define FMAXV      ((double)FLT_MAX)

static const struct key keys[] = {
    /* ---- model (SPEC.md section 1) ---- */
    {"vocab_size",   KT_INT,   OFF(vocab_size),   0, "0",     0, 65536, NULL, 1, "V, at most 65536; 0 = from the tokenizer / data dir"},
    {"n_layer",      KT_INT,   OFF(n_layer),      0, "4",     1, MT_MAX_LAYERS, NULL, 1, "L, number of blocks"},
    {"d_model",      KT_INT,   OFF(d_model),      0, "256",   1, 1 << 20, NULL, 1, "D, residual width"},
    {"n_head",       KT_INT,   OFF(n_head),       0, "4",     1, 65536, NULL, 1, "H, query heads"},
    {"n_kv_head",    KT_INT,   OFF(n_kv_head),    0, "2",     1, 65536, NULL, 1, "K, key/value heads (H % K == 0)"},
    {"head_dim",     KT_INT,   OFF(head_dim),     0, "0",     0, 65536, NULL, 1, "hd, even; 0 = D / H"},
    {"mlp_hidden",   KT_INT,   OFF(mlp_hidden),   0, "0",     0, 1 << 24, NULL, 1, "F, SwiGLU hidden; 0 = ceil(8D/3) rounded up to 64"},
    {"seq_len",      KT_INT,   OFF(seq_len),      0, "256",   2, 1 << 24, NULL, 1, "T, tokens per sequence"},
    {"pattern",      KT_STRING, OFF(pattern), SZ(pattern), "", 0, 0, NULL, 1, "one letter per layer, A = attention + MLP, E = attention + MoE, M = Mamba-3 + MLP; lowercase a / e: that block routed by Mixture-of-Depths (docs/model.md); \"\" = A x L"},
    {"n_experts",    KT_INT,   OFF(n_experts),    0, "8",     1, 65536, NULL, 1, "experts per MoE block"},
    {"top_k",        KT_INT,   OFF(top_k),        0, "2",     1, 65536, NULL, 1, "experts per token, in [1, n_experts]"},
    {"expert_hidden", KT_INT,  OFF(expert_hidden), 0, "0",    0, 1 << 24, NULL, 1, "SwiGLU hidden of each expert; 0 = F / 4"},
    {"shared_expert_hidden", KT_INT, OFF(shared_expert_hidden), 0, "0", 0, 1 << 24, NULL, 1, "hidden of the shared expert; 0 = none"},
    {"n_null_experts", KT_INT, OFF(n_null_experts), 0, "0", 0, 65536, NULL, 1, "Z null (zero-computation) experts of each MoE block: the router has n_experts + Z rows, a slot on a null expert adds 0 and moves no data (SPEC 1e)"},
    {"mtp_depth",    KT_INT,   OFF(mtp_depth),    0, "0",     0, MT_MTP_MAX_DEPTH, NULL, 1, "MTP (multi-token prediction, DeepSeek-V3 style): Dm modules after the last block, module k predicts the token k+1 ahead; 0 = off (docs/model.md)"},
    {"mtp_loss_coef", KT_FLOAT, OFF(mtp_loss_coef), 0, "0.3", 0, FMAXV, NULL, 1, "MTP: the loss adds (mtp_loss_coef / mtp_depth) x the sum of the modules' cross-entropies"},
    {"mtp_block",    KT_STRING, OFF(mtp_block), SZ(mtp_block), "A", 0, 0, NULL, 1, "MTP: the block kind (pattern letter) of each module's block; a kind without routed experts"},
    {"aux_loss_coef", KT_FLOAT, OFF(aux_loss_coef), 0, "0.01", 0, FMAXV, NULL, 1, "MoE load-balancing loss weight"},
    {"z_loss_coef",  KT_FLOAT, OFF(z_loss_coef),  0, "0.001", 0, FMAXV, NULL, 1, "MoE router z-loss weight"},
    {"mod_capacity", KT_FLOAT, OFF(mod_capacity), 0, "0.125", 0, 1, NULL, 1, "MoD: a routed block (lowercase a / e) runs C = ceil(c * seq_len) tokens of each sequence; 0 < c <= 1"},
    {"mod_aux_coef", KT_FLOAT, OFF(mod_aux_coef), 0, "0.01", 0, FMAXV, NULL, 1, "MoD: weight of the router's BCE loss (sigmoid(r), selected), loss part mod_aux"},
    {"mamba_d_state", KT_INT,  OFF(mamba_d_state), 0, "64",   2, 65536, NULL, 1, "M blocks: SSM state N per head, even"},
    {"mamba_expand", KT_INT,   OFF(mamba_expand), 0, "2",     1, 64, NULL, 1, "M blocks: d_inner = mamba_expand * d_model"},
    {"mamba_headdim", KT_INT,  OFF(mamba_headdim), 0, "64",   1, 65536, NULL, 1, "M blocks: headdim P, divides d_inner"},
    {"mamba_ngroups", KT_INT,  OFF(mamba_ngroups), 0, "1",    1, 65536, NULL, 1, "M blocks: B/C groups G, divides nheads"},
    {"mamba_chunk",  KT_INT,   OFF(mamba_chunk),  0, "64",    1, 65536, NULL, 0, "M blocks: scan chunk length (speed only: may change on resume)"},
    {"rope_theta",   KT_FLOAT, OFF(rope_theta),   0, "10000", 0, FMAXV, NULL, 1, "RoPE base (> 0)"},
    {"norm_eps",     KT_FLOAT, OFF(norm_eps),     0, "1e-6",  0, 1, NULL, 1, "RMSNorm epsilon (> 0)"},
    {"logit_softcap", KT_FLOAT, OFF(logit_softcap), 0, "0",   0, FMAXV, NULL, 1, "c * tanh(logits / c); 0 = off"},

    /* ---- training (SPEC.md sections 1b and 5) ---- */
    {"batch_size",   KT_INT,   OFF(batch_size),   0, "8",     1, IMAX, NULL, 0, "global sequences per step"},
    {"microbatches", KT_INT,   OFF(microbatches), 0, "1",     1, IMAX, NULL, 0, "gradient-accumulation steps per step (divides batch_size)"},
    {"optimizer",    KT_STRING, OFF(optimizer), SZ(optimizer), "muon", 0, 0, "muon|adamw", 0, "muon = Muon for block matrices + AdamW for the rest; adamw = AdamW everywhere"},
    {"lr",           KT_FLOAT, OFF(lr),           0, "3e-3",  0, FMAXV, NULL, 0, "AdamW learning rate"},
    {"muon_lr",      KT_FLOAT, OFF(muon_lr),      0, "0.02",  0, FMAXV, NULL, 0, "Muon learning rate"},
    {"muon_momentum", KT_FLOAT, OFF(muon_momentum), 0, "0.95", 0, 1, NULL, 0, "Muon momentum mu, in [0, 1)"},
    {"adam_beta1",   KT_FLOAT, OFF(adam_beta1),   0, "0.9",   0, 1, NULL, 0, "AdamW beta1, in [0, 1)"},
    {"adam_beta2",   KT_FLOAT, OFF(adam_beta2),   0, "0.95",  0, 1, NULL, 0, "AdamW beta2, in [0, 1)"},
    {"adam_eps",     KT_FLOAT, OFF(adam_eps),     0, "1e-8",  0, 1, NULL, 0, "AdamW epsilon (> 0)"},
    {"weight_decay", KT_FLOAT, OFF(weight_decay), 0, "0",     0, FMAXV, NULL, 0, "decoupled weight decay, 2-D parameters only"},
    {"grad_clip",    KT_FLOAT, OFF(grad_clip),    0, "1.0",   0, FMAXV, NULL, 0, "global L2 gradient-norm clip; 0 = off"},
    {"warmup_steps", KT_INT,   OFF(warmup_steps), 0, "0",     0, IMAX, NULL, 0, "linear warmup steps"},
    {"total_steps",  KT_INT,   OFF(total_steps),  0, "0",     0, IMAX, NULL, 0, "schedule length; 0 = the run's --steps"},
    {"min_lr_frac",  KT_FLOAT, OFF(min_lr_frac),  0, "0.0",   0, 1, NULL, 0, "final lr as a fraction of the peak (0.0 = decay to zero)"},
    {"lr_schedule",  KT_STRING, OFF(lr_schedule), SZ(lr_schedule), "cosine", 0, 0, "cosine|linear|constant", 0, "decay after warmup"},
    {"data_order",   KT_STRING, OFF(data_order), SZ(data_order), "sequential", 0, 0, "sequential|shuffled", 0, "sequential = sequence i of step s starts at token ((s*G+i)*T) mod (N-T-1); shuffled = a seeded permutation of T-token windows per epoch (mesh-independent)"},
    {"seed",         KT_U64,   OFF(seed),         0, "1337",  0, 0, NULL, 0, "init / data seed"},
    {"eval_every",   KT_INT,   OFF(eval_every),   0, "0",     0, IMAX, NULL, 0, "validation every N steps; 0 = never"},
    {"eval_batches", KT_INT,   OFF(eval_batches), 0, "4",     0, IMAX, NULL, 0, "validation batches (of batch_size sequences) per evaluation; 0: the whole val split"},
    {"save_every",   KT_INT,   OFF(save_every),   0, "0",     0, IMAX, NULL, 0, "checkpoint every N steps; 0 = only at the end"},
    {"save_final",   KT_BOOL,  OFF(save_final),   0, "true",  0, 1, NULL, 0, "write the checkpoint at the end of the run; false = receipt only (benchmarks; --no-save)"},
    {"keep_last",    KT_INT,   OFF(keep_last),    0, "0",     0, IMAX, NULL, 0, "keep this run's newest N checkpoints, delete the older ones it wrote; 0 = keep all"},
    {"backend",      KT_STRING, OFF(backend), SZ(backend), "cpu", 0, 0, "cpu|cuda", 0, "compute backend"},
    {"lora_rank",    KT_INT,   OFF(lora_rank),    0, "0",     0, 65536, NULL, 0, "LoRA rank r; 0 = off (full training). r > 0 freezes the base (docs/lora.md)"},
    {"lora_alpha",   KT_FLOAT, OFF(lora_alpha),   0, "0",     0, FMAXV, NULL, 0, "LoRA scale numerator: y += (alpha / r) (x A^T) B^T; 0 = r"},
    {"lora_targets", KT_STRING, OFF(lora_targets), SZ(lora_targets), "q,v", 0, 0, NULL, 0, "comma list of q,k,v,o,gate,up,down,expert,in_proj,out_proj (M blocks; the router never)"},
    {"recompute",    KT_STRING, OFF(recompute), SZ(recompute), "none", 0, 0, "none|block", 0, "activation recomputation"},
    {"precision",    KT_STRING, OFF(precision), SZ(precision), "fp32", 0, 0, "fp32|bf16", 0, "bf16: GEMMs on bf16 shadows of the weights, fp32 master weights and optimizer state (docs/cuda.md)"},
    {"head_chunk_rows", KT_INT, OFF(head_chunk_rows), 0, "0", 0, IMAX, NULL, 0, "precision=bf16: the lm head's logits GEMM and cross-entropy in chunks of this many rows (fp32 logits bounded at chunk x V; the bf16 dlogits keep every row); 0 = all rows at once; no effect in fp32, and with bf16 logits (knob head_bf16_logits, the default where the backend has them) it only shrinks the fp32 logits buffer, which training then does not use (docs/cuda.md)"},
    {"grad_reduce_dtype", KT_STRING, OFF(grad_reduce_dtype), SZ(grad_reduce_dtype), "fp32", 0, 0, "fp32|bf16", 0, "gradient reduction dtype over the data group (bf16: cast, reduced with fp32 per pair, widened back)"},
    {"sequence_parallel", KT_BOOL, OFF(sequence_parallel), 0, "true", 0, 1, NULL, 0, "sequence parallelism when tp > 1"},
    {"reshard_after_forward", KT_BOOL, OFF(reshard_after_forward), 0, "true", 0, 1, NULL, 0, "ZeRO-3: free gathered params after forward"},
    {"threads",      KT_INT,   OFF(threads),      0, "0",     0, 65536, NULL, 0, "CPU threads; 0 = OMP_NUM_THREADS or all cores"},
    {"comm_timeout_s", KT_FLOAT, OFF(comm_timeout_s), 0, "300", 0, FMAXV, NULL, 0, "a collective still waiting for a peer after this many seconds ends the job (watchdog, several ranks only); 0 = off"},
    {"redo_every",   KT_INT,   OFF(redo_every),   0, "0",     0, IMAX, NULL, 0, "ReDo: after the update of every N-th step recycle the dormant SwiGLU units (dense MLPs, experts); 0 = off (docs/model.md)"},
    {"redo_tau",     KT_FLOAT, OFF(redo_tau),     0, "0.025", 0, FMAXV, NULL, 0, "ReDo: a unit whose score (mean |activation| / the layer's mean) is <= tau is recycled"},
    {"replica_check_every", KT_INT, OFF(replica_check_every), 0, "0", 0, IMAX, NULL, 0, "run the replica hash check (every copy of a parameter bit-identical on the ranks that hold it) after every N-th step too, not only at the end; a mismatch ends the run at that step; 0 = at the end only"},
};

#define MT_CONFIG_MAX_BYTES (16 << 20)   /* a config file: JSON of a few KiB */
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

static const char *type_name(enum key_type t)
{
    switch (t) {
    case KT_INT:    return "int";
    case KT_FLOAT:  return "float";
    case KT_STRING: return "string";
    case KT_BOOL:   return "bool";
    case KT_U64:    return "u64";
    }
    return "?";
}

/* ---- lookup, with a did-you-mean ---- */

static const struct key *find_key(const char *name, size_t len)
{
    for (int i = 0; i < N_KEYS; i++)
        if (strlen(keys[i].name) == len && !strncmp(keys[i].name, name, len))
            return &keys[i];
    return NULL;
}

/* Levenshtein distance of a[0..na) and b[0..nb), two rows; names are short. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    int row0[64], row1[64];
    if (na >= 63 || nb >= 63) return 1 << 20;
    for (size_t j = 0; j <= nb; j++) row0[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        row1[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = row0[j - 1] + (a[i - 1] != b[j - 1]);
            int del = row0[j] + 1, ins = row1[j - 1] + 1;
            row1[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(row0, row1, (nb + 1) * sizeof row0[0]);
    }
    return row0[nb];
}

static enum mt_status unknown_key(struct mt_ctx *ctx, const char *name, size_t len)
{
    int best = 1 << 20;
    const char *sugg = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        int d = edit_distance(name, len, keys[i].name, strlen(keys[i].name));
        if (d < best) best = d, sugg = keys[i].name;
    }
    /* suggest only near misses: at most 2 edits and less than half the name */
    if (sugg && best <= 2 && (size_t)best * 2 < len)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "unknown config key '%.*s' (did you mean '%s'?)",
                            (int)len, name, sugg);
    return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "unknown config key '%.*s' (meshtrain train --help lists them)",
                        (int)len, name);
}

/* ---- storing values (range-checked) ---- */

static void *field(struct mt_config *cfg, const struct key *k) { return (char *)cfg + k->off; }
static const void *cfield(const struct mt_config *cfg, const struct key *k) { return (const char *)cfg + k->off; }

static enum mt_status store_int(struct mt_ctx *ctx, struct mt_config *cfg, const struct key *k, double v)
{
    if (v < k->min || v > k->max)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': %.17g is out of range [%.0f, %.0f]",
                            k->name, v, k->min, k->max);
    *(int *)field(cfg, k) = (int)v;
    return MT_OK;
}

static enum mt_status store_float(struct mt_ctx *ctx, struct mt_config *cfg, const struct key *k, double v)
{
    if (!isfinite(v))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': value is not finite", k->name);
    if (v < k->min || v > k->max)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': %g is out of range [%g, %g]",
                            k->name, v, k->min, k->max);
    *(float *)field(cfg, k) = (float)v;
    return MT_OK;
}

static enum mt_status store_string(struct mt_ctx *ctx, struct mt_config *cfg, const struct key *k, const char *s)
{
    size_t n = strlen(s);
    if (n >= k->size)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': value is %zu characters, at most %zu allowed",
                            k->name, n, k->size - 1);
    if (k->allowed) {
        /* s must equal one '|'-separated word of k->allowed */
        const char *p = k->allowed;
        int ok = 0;
        while (*p && !ok) {
            const char *e = strchr(p, '|');
            size_t wl = e ? (size_t)(e - p) : strlen(p);
            ok = (wl == n && !strncmp(p, s, n));
            p = e ? e + 1 : p + wl;
        }
        if (!ok)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': '%s' is not one of %s",
                                k->name, s, k->allowed);
    }
    memcpy(field(cfg, k), s, n + 1);
    return MT_OK;
}

/* ---- parsing text values (the --set path; defaults use it too) ---- */

static enum mt_status set_text(struct mt_ctx *ctx, struct mt_config *cfg, const struct key *k, const char *val)
{
    char *end = NULL;
    switch (k->type) {
    case KT_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (end == val || *end != '\0' || errno == ERANGE)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': '%s' is not an integer", k->name, val);
        return store_int(ctx, cfg, k, (double)v);
    }
    case KT_FLOAT: {
        errno = 0;
        double v = strtod(val, &end);
        if (end == val || *end != '\0' || errno == ERANGE)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': '%s' is not a number", k->name, val);
        return store_float(ctx, cfg, k, v);
    }
    case KT_BOOL:
        if (!strcmp(val, "true") || !strcmp(val, "1")) *(int *)field(cfg, k) = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "0")) *(int *)field(cfg, k) = 0;
        else return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': '%s' is not a bool (true|false|1|0)",
                                 k->name, val);
        return MT_OK;
    case KT_U64: {
        const char *p = val;
        while (*p == ' ') p++;
        errno = 0;
        unsigned long long v = (*p == '-' || *p == '+') ? 0 : strtoull(p, &end, 10);
        if (*p == '-' || *p == '+' || end == p || *end != '\0' || errno == ERANGE)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': '%s' is not an unsigned 64-bit integer",
                                k->name, val);
        *(uint64_t *)field(cfg, k) = (uint64_t)v;
        return MT_OK;
    }
    case KT_STRING:
        return store_string(ctx, cfg, k, val);
    }
    return MT_ERR_RUNTIME;
}

void mt_config_defaults(struct mt_config *cfg)
{
    struct mt_ctx scratch;
    mt_ctx_init(&scratch);
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_KEYS; i++) {
        enum mt_status st = set_text(&scratch, cfg, &keys[i], keys[i].def);
        MT_ASSERT(st == MT_OK); /* a default that fails its own parser is a bug in keys[] */
        (void)st;
    }
}

enum mt_status mt_config_set(struct mt_ctx *ctx, struct mt_config *cfg, const char *key_eq_value)
{
    if (!key_eq_value)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--set needs key=value");
    const char *eq = strchr(key_eq_value, '=');
    if (!eq || eq == key_eq_value)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--set '%s': expected key=value", key_eq_value);
    const struct key *k = find_key(key_eq_value, (size_t)(eq - key_eq_value));
    if (!k) return unknown_key(ctx, key_eq_value, (size_t)(eq - key_eq_value));
    return set_text(ctx, cfg, k, eq + 1);
}

/* ---- JSON ---- */

static enum mt_status set_json(struct mt_ctx *ctx, struct mt_config *cfg, const struct key *k, const cJSON *v)
{
    switch (k->type) {
    case KT_INT:
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': expected an integer", k->name);
        return store_int(ctx, cfg, k, v->valuedouble);
    case KT_FLOAT:
        if (!cJSON_IsNumber(v))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': expected a number", k->name);
        return store_float(ctx, cfg, k, v->valuedouble);
    case KT_BOOL:
        if (cJSON_IsBool(v)) {
            *(int *)field(cfg, k) = cJSON_IsTrue(v) ? 1 : 0;
            return MT_OK;
        }
        if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) {
            *(int *)field(cfg, k) = (int)v->valuedouble;
            return MT_OK;
        }
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': expected true or false", k->name);
    case KT_U64:
        if (cJSON_IsString(v)) return set_text(ctx, cfg, k, v->valuestring);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
            v->valuedouble != floor(v->valuedouble))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                                "config key '%s': expected a non-negative integer (as a string above 2^53)", k->name);
        *(uint64_t *)field(cfg, k) = (uint64_t)v->valuedouble;
        return MT_OK;
    case KT_STRING:
        if (!cJSON_IsString(v))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config key '%s': expected a string", k->name);
        return store_string(ctx, cfg, k, v->valuestring);
    }
    return MT_ERR_RUNTIME;
}

/* A one-line refusal naming the place `at` in `text`: line and column (from
 * 1) and a short excerpt with control characters shown as spaces. */
static enum mt_status json_where(struct mt_ctx *ctx, const char *text, const char *at, const char *what)
{
    if (!at || at < text) at = text;
    size_t off = (size_t)(at - text);
    int line = 1, col = 1;
    for (const char *p = text; p < at && *p; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    char near[24];
    size_t n = 0;
    for (const char *p = at; *p && n < sizeof near - 1; p++) near[n++] = (*p >= 0 && *p < ' ') ? ' ' : *p;
    near[n] = '\0';
    return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config: %s at line %d, column %d (offset %zu) near '%s'", what,
                        line, col, off, near);
}

/* The config's "knobs" object: each member a knob name, its value a bool,
 * number or string (mt_knobs_set_from, source CONFIG). Here and not in
 * knobs.c so that the knobs table needs no JSON library (comm_nccl.c reads
 * it in archives linked without cJSON). */
static enum mt_status apply_knobs(struct mt_ctx *ctx, struct mt_knobs *k, const cJSON *obj)
{
    if (!cJSON_IsObject(obj))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config knobs: expected an object of NAME: VALUE");
    for (const cJSON *it = obj->child; it; it = it->next) {
        char v[MT_KNOB_VALUE_LEN + 1];
        if (cJSON_IsBool(it)) snprintf(v, sizeof v, "%d", cJSON_IsTrue(it) ? 1 : 0);
        else if (cJSON_IsNumber(it)) snprintf(v, sizeof v, "%.17g", it->valuedouble);
        else if (cJSON_IsString(it)) snprintf(v, sizeof v, "%s", it->valuestring);
        else
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config knobs.%s: expected a bool, number or string",
                                it->string);
        MT_CHECK(mt_knobs_set_from(ctx, k, it->string, strlen(it->string), v, MT_KNOB_CONFIG));
    }
    return MT_OK;
}

/* All-or-nothing: the keys are applied to a copy, which replaces *cfg only if
 * every key was accepted. */
enum mt_status mt_config_apply_json(struct mt_ctx *ctx, struct mt_config *cfg, const char *json_text)
{
    return mt_config_apply_json_knobs(ctx, cfg, NULL, json_text);
}

enum mt_status mt_config_apply_json_knobs(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_knobs *knobs,
                                          const char *json_text)
{
    if (!json_text) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config: no JSON text");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json_text, &end, 0);
    if (!root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        return json_where(ctx, json_text, at, "invalid JSON");
    }
    enum mt_status rc = MT_OK;
    struct mt_config tmp = *cfg;
    struct mt_knobs ktmp;   /* knobs too are all or nothing (checked even when not kept) */
    if (knobs) ktmp = *knobs;
    else mt_knobs_init(&ktmp);
    /* one object and nothing after it but white space: cJSON stops at the
     * end of the first value and would ignore the rest */
    while (end && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && *end) {
        rc = json_where(ctx, json_text, end, "trailing text after the JSON object");
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config: the top level must be a JSON object");
        goto done;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        const int is_knobs = !strcmp(it->string, "knobs");
        const struct key *k = is_knobs ? NULL : find_key(it->string, strlen(it->string));
        if (!k && !is_knobs) {
            rc = unknown_key(ctx, it->string, strlen(it->string));
            goto done;
        }
        /* cJSON keeps every member; a repeated key would silently take the last value */
        for (const cJSON *prev = root->child; prev != it; prev = prev->next)
            if (!strcmp(prev->string, it->string)) {
                rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config: duplicate config key '%s'", it->string);
                goto done;
            }
        if (is_knobs) MT_CHECK_GOTO(apply_knobs(ctx, &ktmp, it), rc, done);
        else MT_CHECK_GOTO(set_json(ctx, &tmp, k, it), rc, done);
    }
    *cfg = tmp;
    if (knobs) *knobs = ktmp;
done:
    cJSON_Delete(root);
    return rc;
}

enum mt_status mt_config_load_file(struct mt_ctx *ctx, struct mt_config *cfg, const char *path)
{
    return mt_config_load_file_knobs(ctx, cfg, NULL, path);
}

enum mt_status mt_config_load_file_knobs(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_knobs *knobs,
                                         const char *path)
{
    /* a regular file of at most MT_CONFIG_MAX_BYTES: /dev/zero or a FIFO
     * used to grow without end or block forever (issue 33 item 3) */
    int fd;
    int64_t fsize;
    char label[64];
    snprintf(label, sizeof label, "config file");
    MT_CHECK(mt_file_open_regular(ctx, path, label, &fd, &fsize));
    if (fsize > MT_CONFIG_MAX_BYTES) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "config file '%s' has %lld bytes (at most %d)", path, (long long)fsize,
                            MT_CONFIG_MAX_BYTES);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot open config file '%s'", path);
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                fclose(f);
                return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory reading '%s'", path);
            }
            buf = nb, cap = ncap;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got < 4096) break;
        if (len > MT_CONFIG_MAX_BYTES) {   /* grew while read */
            free(buf);
            fclose(f);
            return mt_ctx_error(ctx, MT_ERR_FORMAT, "config file '%s' is over %d bytes", path, MT_CONFIG_MAX_BYTES);
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot read config file '%s'", path);
    }
    buf[len] = '\0';
    /* the JSON text ends at the first NUL: refuse what a NUL would hide */
    const char *nul = memchr(buf, '\0', len);
    enum mt_status rc = nul ? mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "config: NUL byte at offset %zu (not a text file?)",
                                           (size_t)(nul - buf))
                            : mt_config_apply_json_knobs(ctx, cfg, knobs, buf);
    free(buf);
    if (rc != MT_OK) {
        /* prefix the file name, keeping the key-naming message */
        char msg[sizeof ctx->errmsg];
        snprintf(msg, sizeof msg, "%s", mt_ctx_last_error(ctx));
        mt_ctx_error(ctx, rc, "%s: %s", path, msg);
    }
    return rc;
}

/* Shortest "%.Ng" (N in 6..9) that reads back to the same float. */
static void format_float(char *buf, size_t n, float v)
{
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

/* Value as text: for --help defaults, same_model's `why`, and JSON. */
static void value_text(const struct mt_config *cfg, const struct key *k, char *buf, size_t n)
{
    const void *p = cfield(cfg, k);
    switch (k->type) {
    case KT_INT:    snprintf(buf, n, "%d", *(const int *)p); break;
    case KT_FLOAT:  format_float(buf, n, *(const float *)p); break;
    case KT_BOOL:   snprintf(buf, n, "%s", *(const int *)p ? "true" : "false"); break;
    case KT_U64:    snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case KT_STRING: snprintf(buf, n, "\"%s\"", (const char *)p); break;
    }
}

char *mt_config_to_json(const struct mt_config *cfg)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    char buf[64];
    int ok = 1;
    for (int i = 0; i < N_KEYS && ok; i++) {
        const struct key *k = &keys[i];
        const void *p = cfield(cfg, k);
        switch (k->type) {
        case KT_INT:
            ok = cJSON_AddNumberToObject(root, k->name, *(const int *)p) != NULL;
            break;
        case KT_FLOAT:
            format_float(buf, sizeof buf, *(const float *)p);
            ok = cJSON_AddRawToObject(root, k->name, buf) != NULL;
            break;
        case KT_BOOL:
            ok = cJSON_AddBoolToObject(root, k->name, *(const int *)p) != NULL;
            break;
        case KT_U64: {
            uint64_t v = *(const uint64_t *)p;
            snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
            ok = (v <= (1ull << 53) ? cJSON_AddRawToObject(root, k->name, buf)
                                    : cJSON_AddStringToObject(root, k->name, buf)) != NULL;
            break;
        }
        case KT_STRING:
            ok = cJSON_AddStringToObject(root, k->name, (const char *)p) != NULL;
            break;
        }
    }
    char *out = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!out) return NULL;
    /* cJSON allocates with its hooks (malloc by default); hand back a malloc'd copy */
    char *copy = strdup(out);
    cJSON_free(out);
    return copy;
}

int mt_config_same_model(const struct mt_config *a, const struct mt_config *b, char *why, size_t why_len)
{
    for (int i = 0; i < N_KEYS; i++) {
        const struct key *k = &keys[i];
        if (!k->model) continue;
        int same;
        if (k->type == KT_STRING)
            same = !strcmp((const char *)cfield(a, k), (const char *)cfield(b, k));
        else if (k->type == KT_U64)
            same = *(const uint64_t *)cfield(a, k) == *(const uint64_t *)cfield(b, k);
        else if (k->type == KT_FLOAT)
            same = *(const float *)cfield(a, k) == *(const float *)cfield(b, k);
        else
            same = *(const int *)cfield(a, k) == *(const int *)cfield(b, k);
        if (!same) {
            if (why && why_len) {
                char va[MT_MAX_LAYERS + 8], vb[MT_MAX_LAYERS + 8];
                value_text(a, k, va, sizeof va);
                value_text(b, k, vb, sizeof vb);
                snprintf(why, why_len, "%s differs: %s vs %s", k->name, va, vb);
            }
            return 0;
        }
    }
    if (why && why_len) why[0] = '\0';
    return 1;
}

void mt_config_print_help(void *file)
{
    FILE *f = file ? (FILE *)file : stdout;
    struct mt_config def;
    mt_config_defaults(&def);
    char buf[MT_MAX_LAYERS + 8];
    fprintf(f, "config keys (--config FILE.json, --set key=value):\n");
    for (int i = 0; i < N_KEYS; i++) {
        const struct key *k = &keys[i];
        value_text(&def, k, buf, sizeof buf);
        if (k->allowed)
            fprintf(f, "  %-22s %-6s %-8s %s (%s)\n", k->name, type_name(k->type), buf, k->help, k->allowed);
        else
            fprintf(f, "  %-22s %-6s %-8s %s\n", k->name, type_name(k->type), buf, k->help);
    }
}

/* ---- resolve: derived keys and the single-rank shape rules ---- */

#define RULE(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return mt_ctx_error(ctx, MT_ERR_CONFIG, __VA_ARGS__); \
    } while (0)

/* Every table key within its table range / allowed set (the struct may
 * have been edited directly rather than through set/apply_json). */
static enum mt_status resolve_ranges(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    for (int i = 0; i < N_KEYS; i++) {
        const struct key *k = &keys[i];
        const void *p = cfield(cfg, k);
        if (k->type == KT_INT) {
            int v = *(const int *)p;
            RULE(v >= k->min && v <= k->max, "%s=%d is out of range [%.0f, %.0f]", k->name, v, k->min, k->max);
        } else if (k->type == KT_FLOAT) {
            float v = *(const float *)p;
            RULE(isfinite(v) && v >= k->min && v <= k->max, "%s=%g is out of range [%g, %g]", k->name,
                 (double)v, k->min, k->max);
        } else if (k->type == KT_STRING) {
            const char *s = (const char *)p;
            RULE(memchr(s, '\0', k->size) != NULL, "%s is not NUL-terminated", k->name);
            if (k->allowed) {
                struct mt_ctx scratch;
                struct mt_config tmp;
                mt_ctx_init(&scratch);
                RULE(store_string(&scratch, &tmp, k, s) == MT_OK, "%s='%s' is not one of %s", k->name, s,
                     k->allowed);
            }
        }
    }
    return MT_OK;
}

/* Vocabulary, dimensions, heads; head_dim and mlp_hidden derived. */
static enum mt_status resolve_dims(struct mt_ctx *ctx, struct mt_config *cfg)
{
    RULE(cfg->vocab_size != 0,
         "vocab_size is not set (give it in the config or train on a prepared data dir with a tokenizer)");
    RULE(cfg->vocab_size >= 2 && cfg->vocab_size <= 65536, "vocab_size in [2, 65536] (vocab_size=%d)",
         cfg->vocab_size);
    RULE(cfg->n_layer > 0 && cfg->d_model > 0 && cfg->n_head > 0 && cfg->n_kv_head > 0,
         "n_layer, d_model, n_head, n_kv_head > 0 (n_layer=%d, d_model=%d, n_head=%d, n_kv_head=%d)",
         cfg->n_layer, cfg->d_model, cfg->n_head, cfg->n_kv_head);
    RULE(cfg->seq_len >= 2, "seq_len >= 2 (seq_len=%d)", cfg->seq_len);
    RULE(cfg->n_head % cfg->n_kv_head == 0, "n_head %% n_kv_head != 0 (n_head=%d, n_kv_head=%d)", cfg->n_head,
         cfg->n_kv_head);

    if (cfg->head_dim == 0) {
        RULE(cfg->d_model % cfg->n_head == 0,
             "d_model %% n_head != 0 and head_dim is not set (d_model=%d, n_head=%d)", cfg->d_model, cfg->n_head);
        cfg->head_dim = cfg->d_model / cfg->n_head;
    }
    RULE(cfg->head_dim % 2 == 0, "head_dim must be even for RoPE (head_dim=%d)", cfg->head_dim);

    if (cfg->mlp_hidden == 0) {
        int64_t f = ((int64_t)8 * cfg->d_model + 2) / 3;
        f = (f + 63) / 64 * 64;
        RULE(f <= (1 << 24), "derived mlp_hidden too large (d_model=%d)", cfg->d_model);
        cfg->mlp_hidden = (int)f;
    }
    return MT_OK;
}

/* The block pattern ("A" x L when empty), expert_hidden derived, and the
 * rules of the pieces the pattern uses; *n_moe: the layers with routed
 * experts. */
static enum mt_status resolve_pattern(struct mt_ctx *ctx, struct mt_config *cfg, int *n_moe_out)
{
    size_t plen = strlen(cfg->pattern);
    if (plen == 0) {
        mt_blocks_default_pattern(cfg->pattern, cfg->n_layer);
        plen = (size_t)cfg->n_layer;
    }
    RULE(plen == (size_t)cfg->n_layer, "pattern length != n_layer (pattern length=%zu, n_layer=%d)", plen,
         cfg->n_layer);
    /* MoD (SPEC 1e): the key range [0, 1] is the table's; c = 0 would route no token */
    RULE(cfg->mod_capacity > 0.0f, "mod_capacity must be in (0, 1] (mod_capacity=%g)", (double)cfg->mod_capacity);
    for (size_t l = 0; l < plen; l++) {
        const char ch = cfg->pattern[l];
        RULE(ch != 'm', "pattern[%zu]='m': Mamba-3 blocks cannot be routed (Mixture-of-Depths routes a and e only); "
             "use 'M'", l);
    }
    char letters[4 * MT_MAX_BLOCK_KINDS];
    const int bad = mt_blocks_pattern_check(cfg->pattern, plen);
    RULE(bad < 0, "pattern letters must be one of %s (pattern[%d]='%c')", mt_blocks_letters(letters, sizeof letters),
         bad, bad >= 0 ? cfg->pattern[bad] : ' ');
    int n_moe = 0;   /* layers with routed experts */
    for (size_t l = 0; l < plen; l++) n_moe += mt_blocks_layer_routed(cfg, (int)l);

    RULE(cfg->n_experts >= 1, "n_experts >= 1 (n_experts=%d)", cfg->n_experts);
    if (cfg->expert_hidden == 0) cfg->expert_hidden = cfg->mlp_hidden / 4;
    /* the pieces' own rules (piece_rules.c): MoE's top_k / expert_hidden,
     * Mamba-3's shape, each when the pattern uses the piece */
    MT_CHECK(mt_blocks_check_config(ctx, cfg));
    /* MTP's block: a kind of the table without routed experts (its per-sequence
     * MoE statistics would cover positions past T-k), whose rules ran: the
     * default kind or one the pattern uses */
    if (cfg->mtp_depth > 0) {
        const int kb = strlen(cfg->mtp_block) == 1 ? mt_blocks_find(cfg->mtp_block[0]) : -1;
        RULE(kb >= 0, "mtp_block must be one pattern letter of %s (mtp_block=\"%s\")",
             mt_blocks_letters(letters, sizeof letters), cfg->mtp_block);
        RULE(!mt_blocks_kind_routed(kb), "mtp_block=%s has routed experts: an MTP module's block must not (mtp_depth=%d)",
             cfg->mtp_block, cfg->mtp_depth);
        /* a routed (Mixture-of-Depths) block would select among rows past T-1-k too */
        RULE(!mt_blocks_kind_wrapped(kb), "mtp_block=%s is a routed (Mixture-of-Depths) block: an MTP module's block "
             "must be unrouted (mtp_depth=%d)", cfg->mtp_block, cfg->mtp_depth);
        RULE(strchr(cfg->pattern, cfg->mtp_block[0]) || cfg->mtp_block[0] == mt_blocks_letter(0),
             "mtp_block=%s is not in pattern %s: use a kind the pattern has, or %c", cfg->mtp_block, cfg->pattern,
             mt_blocks_letter(0));
    }
    *n_moe_out = n_moe;
    return MT_OK;
}

/* Batch split and optimizer constants. */
static enum mt_status resolve_training(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    RULE(cfg->batch_size > 0 && cfg->microbatches > 0, "batch_size, microbatches > 0 (batch_size=%d, microbatches=%d)",
         cfg->batch_size, cfg->microbatches);
    RULE(cfg->batch_size % cfg->microbatches == 0, "batch_size %% microbatches != 0 (batch_size=%d, microbatches=%d)",
         cfg->batch_size, cfg->microbatches);

    RULE(cfg->norm_eps > 0, "norm_eps > 0 (norm_eps=%g)", (double)cfg->norm_eps);
    RULE(cfg->adam_eps > 0, "adam_eps > 0 (adam_eps=%g)", (double)cfg->adam_eps);
    RULE(cfg->rope_theta > 0, "rope_theta > 0 (rope_theta=%g)", (double)cfg->rope_theta);
    RULE(cfg->adam_beta1 >= 0 && cfg->adam_beta1 < 1, "adam_beta1 in [0, 1) (adam_beta1=%g)", (double)cfg->adam_beta1);
    RULE(cfg->adam_beta2 >= 0 && cfg->adam_beta2 < 1, "adam_beta2 in [0, 1) (adam_beta2=%g)", (double)cfg->adam_beta2);
    RULE(cfg->muon_momentum >= 0 && cfg->muon_momentum < 1, "muon_momentum in [0, 1) (muon_momentum=%g)",
         (double)cfg->muon_momentum);
    return MT_OK;
}

/* LoRA: known targets, and r <= min(in, out) of every targeted matrix
 * (a rank-r update of a matrix with a smaller side is not low-rank);
 * lora_alpha defaults to the rank. */
static enum mt_status resolve_lora(struct mt_ctx *ctx, struct mt_config *cfg, int n_moe)
{
    if (cfg->lora_rank > 0) {
        char bad[64];
        unsigned mask = 0;
        RULE(mt_config_lora_mask(cfg->lora_targets, &mask, bad, sizeof bad) == 0,
             "lora_targets: unknown target '%s' (one of q,k,v,o,gate,up,down,expert,in_proj,out_proj)", bad);
        RULE(mask != 0, "lora_targets is empty (one or more of q,k,v,o,gate,up,down,expert,in_proj,out_proj)");
        const int has_m = mt_blocks_pattern_uses(cfg, "mamba");
        RULE(has_m || !(mask & (MT_LORA_IN_PROJ | MT_LORA_OUT_PROJ)),
             "lora_targets: in_proj / out_proj are the Mamba-3 mixer's projections: the pattern has no M block");
        const char *norule = mt_blocks_lora_rule(cfg, mask);
        RULE(!norule, "lora_targets: %s has no adapter layout rule for its split (docs/lora.md)", norule ? norule : "");
        const int64_t D = cfg->d_model, QD = (int64_t)cfg->n_head * cfg->head_dim,
                      KD = (int64_t)cfg->n_kv_head * cfg->head_dim;
        int64_t lim = D;
        if (mask & (MT_LORA_Q | MT_LORA_O)) lim = QD < lim ? QD : lim;
        if (mask & (MT_LORA_K | MT_LORA_V)) lim = KD < lim ? KD : lim;
        if ((mask & (MT_LORA_GATE | MT_LORA_UP | MT_LORA_DOWN)) && cfg->mlp_hidden < lim) lim = cfg->mlp_hidden;
        if ((mask & MT_LORA_EXPERT) && n_moe > 0 && cfg->expert_hidden < lim) lim = cfg->expert_hidden;
        /* M blocks: Win stacked (W, D), Wout (D, d_inner); W > d_inner >= D */
        if ((mask & (MT_LORA_IN_PROJ | MT_LORA_OUT_PROJ)) && has_m && (int64_t)cfg->mamba_expand * D < lim)
            lim = (int64_t)cfg->mamba_expand * D;
        RULE(cfg->lora_rank <= lim, "lora_rank=%d exceeds min(in, out)=%lld of a targeted matrix",
             cfg->lora_rank, (long long)lim);
        if (cfg->lora_alpha == 0) cfg->lora_alpha = (float)cfg->lora_rank;
    }
    return MT_OK;
}

/*
 * In steps (each a function above), the first broken rule returned.
 * Derivations:
 *   head_dim      = D / H                          (D % H must be 0)
 *   mlp_hidden    = 64 * ceil(ceil(8D/3) / 64)
 *   expert_hidden = F / 4
 *   pattern       = "A" x L
 *   total_steps   = run_steps
 */
enum mt_status mt_config_resolve(struct mt_ctx *ctx, struct mt_config *cfg, int run_steps)
{
    int n_moe = 0;
    MT_CHECK(resolve_ranges(ctx, cfg));
    MT_CHECK(resolve_dims(ctx, cfg));
    MT_CHECK(resolve_pattern(ctx, cfg, &n_moe));
    MT_CHECK(resolve_training(ctx, cfg));
    MT_CHECK(resolve_lora(ctx, cfg, n_moe));
    RULE(cfg->mtp_depth == 0 || cfg->seq_len > cfg->mtp_depth,
         "mtp_depth=%d needs seq_len > mtp_depth (seq_len=%d): module k predicts the token k+1 ahead",
         cfg->mtp_depth, cfg->seq_len);
    RULE(cfg->redo_every == 0 || cfg->lora_rank == 0,
         "redo_every=%d needs full training: LoRA freezes the SwiGLU weights it would recycle (lora_rank=%d)",
         cfg->redo_every, cfg->lora_rank);
    RULE(run_steps >= 0, "run steps >= 0 (steps=%d)", run_steps);
    if (cfg->total_steps == 0) cfg->total_steps = run_steps;
    return MT_OK;
}

/* Bits of a comma list of LoRA targets; returns 0, or -1 with the first
 * unknown name in bad. */
int mt_config_lora_mask(const char *list, unsigned *mask, char *bad, size_t bad_len)
{
    static const char *const names[] = {"q", "k", "v", "o", "gate", "up", "down", "expert", "in_proj", "out_proj"};
    const int nn = (int)(sizeof names / sizeof names[0]);
    *mask = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int hit = -1;
        for (int i = 0; i < nn; i++)
            if (strlen(names[i]) == n && !strncmp(p, names[i], n)) hit = i;
        if (hit < 0) {
            snprintf(bad, bad_len, "%.*s", (int)n, p);
            return -1;
        }
        *mask |= 1u << hit;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

int mt_config_is_moe_layer(const struct mt_config *cfg, int l) { return mt_blocks_layer_routed(cfg, l); }
