/*
 * mt_export.h — Hugging Face interchange: safetensors + config.json.
 *
 * The model family of SPEC.md section 1 is Qwen3 (dense) / Qwen3-MoE: the
 * parameter names ARE the Hugging Face names, so export and import copy
 * tensors by name, with no renaming or permutation.
 *
 *     char warn[1024] = "";
 *     struct mt_export_opts eo = {.bos_token_id = -1};
 *     rc = mt_export_hf(&ctx, "run/ckpt/step_000100", "run/hf", &eo, warn, sizeof warn);
 *     // run/hf/config.json + model.safetensors (+ tokenizer files); a model HF
 *     // cannot represent exactly is refused unless eo.allow_lossy
 *     rc = mt_import_hf(&ctx, "run/hf", "run2/ckpt/step_000000", 0, 0, warn, sizeof warn);
 *
 * safetensors layout: u64 little-endian N, N bytes of JSON header (padded
 * with spaces to a multiple of 8), then the data section. The header maps
 * each name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
 * the data section) plus "__metadata__": {"format": "pt"}. The writer emits
 * F32 tensors in name order (strcmp), packed; the reader accepts F32, BF16
 * and F16 and converts to float.
 */
#ifndef MT_EXPORT_H
#define MT_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../ops/mt_ops.h"

#define MT_ST_MAX_DIM 4

enum mt_st_dtype { MT_ST_F32 = 0, MT_ST_BF16 = 1, MT_ST_F16 = 2, MT_ST_OTHER = 3 };

struct mt_st_tensor {
    char             name[160];
    int              ndim;                 /* 0..MT_ST_MAX_DIM                       */
    int64_t          shape[MT_ST_MAX_DIM];
    enum mt_st_dtype dtype;                /* writer: F32 only                        */
    char             dtype_str[16];        /* reader: as in the file ("F32", "I64"...) */
    int64_t          begin, end;           /* reader: byte range in the data section  */
    /* writer source: host memory `data`, or when data == NULL, numel floats
     * at byte `src_offset` of the open file `src_fd` */
    const float     *data;
    int              src_fd;
    int64_t          src_offset;
};

static inline size_t mt_st_numel(const struct mt_st_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Write a safetensors file at `path` (replaced if present) from n F32
 * tensors. `t` is sorted in place by name. Duplicate names ->
 * MT_ERR_INVALID_ARG; write failure -> MT_ERR_IO. */
enum mt_status mt_safetensors_write(struct mt_ctx *ctx, const char *path, struct mt_st_tensor *t, int n);

/* An open safetensors file (reader). */
struct mt_safetensors {
    int                  fd;
    int64_t              file_size;
    int64_t              data_start;   /* 8 + N                       */
    struct mt_st_tensor *t;            /* (n), in header order        */
    int                  n;
};

/* Open and validate (header JSON, every tensor's byte range against its
 * dtype, shape and the file size). Missing file -> MT_ERR_IO; malformed ->
 * MT_ERR_FORMAT naming the file (and tensor). Close with mt_safetensors_close. */
enum mt_status mt_safetensors_open(struct mt_ctx *ctx, const char *path, struct mt_safetensors **out);
void mt_safetensors_close(struct mt_ctx *ctx, struct mt_safetensors *st);  /* no-op on NULL */
const struct mt_st_tensor *mt_safetensors_find(const struct mt_safetensors *st, const char *name);
/* Read tensor t (of st) as mt_st_numel(t) floats into host dst (F32 copied,
 * BF16/F16 converted). Other dtypes -> MT_ERR_FORMAT. */
enum mt_status mt_safetensors_read_f32(struct mt_ctx *ctx, const struct mt_safetensors *st,
                                       const struct mt_st_tensor *t, float *dst);

/* Hugging Face config.json text for a resolved cfg: Qwen3ForCausalLM, or
 * Qwen3MoeForCausalLM when any layer is 'E'. bos_token_id < 0 = unknown
 * (bos/eos omitted; else eos_token_id = bos_token_id: meshtrain's one special
 * token <|bos|> also ends a document). Every model key HF has no field for is
 * written as meshtrain_<key> (logit_softcap, z_loss_coef,
 * shared_expert_hidden, and aux_loss_coef for dense models), and
 * "meshtrain_export": 1 marks the folder as an export, so that export ->
 * import gives back the same model config. What HF cannot represent is not
 * checked here: see mt_export_hf_lossy. Returns malloc'd text (free()),
 * NULL on allocation failure. */
char *mt_export_hf_config(const struct mt_config *cfg, int bos_token_id);
/* 1 when some layer's kind has no Hugging Face equivalent (M): the export
 * writes config.json with architectures ["MeshtrainHybrid"] (docs/export.md). */
int mt_export_hf_hybrid(const struct mt_config *cfg);

/* The features of a resolved cfg that the Hugging Face architecture of the
 * export cannot represent (its logits would differ from meshtrain's): a
 * logit softcap, a shared expert. Appends one line per feature to `what`
 * (may be NULL) and returns their count (0: the export is exact). */
int mt_export_hf_lossy(const struct mt_config *cfg, char *what, size_t what_len);

/* Parse a Qwen3 / Qwen3-MoE config.json (transformers 4 or 5 spellings:
 * rope_theta or rope_parameters.rope_theta, num_experts or
 * num_local_experts) into the model keys of cfg (the caller fills defaults
 * first); *tied is set to tie_word_embeddings. Refused with MT_ERR_FORMAT
 * naming the key: another architecture, rope scaling other than "default",
 * a sliding window, attention biases, an activation other than silu, and
 * norm_topk_prob false or missing (HF's default is false; meshtrain always
 * renormalises the top-k gates). A missing head_dim is 128 for qwen3 (HF's
 * default) and hidden_size / num_attention_heads for qwen3_moe. Warnings
 * (appended to warn, may be NULL) for keys read but without effect. */
enum mt_status mt_export_hf_config_parse(struct mt_ctx *ctx, const char *json_text, struct mt_config *cfg,
                                         int *tied, char *warn, size_t warn_len);

/* Files an export writes into its --out folder (NULL-terminated); nothing
 * else there is ever touched. */
extern const char *const mt_export_hf_files[];

struct mt_export_opts {
    int         bos_token_id;  /* < 0: the tokenizer's BOS, or omitted without a tokenizer      */
    int         force;         /* write into a non-empty --out that is not a previous export     */
    int         allow_lossy;   /* export what HF cannot represent, saying what is dropped        */
    const char *tokenizer;     /* tokenizer.bin to export; NULL: ckpt_dir/tokenizer.bin if there */
    int         merge;         /* LoRA checkpoint: write W + (alpha/r) B A (required for one)    */
};

/* --adapter options (docs/lora.md, "PEFT layouts"). */
struct mt_adapter_opts {
    int         force;       /* write into a non-empty out_dir that is not a previous adapter export  */
    int         hf_layout;   /* 4 or 5: the transformers major the adapter is for; 0: both where one
                              * file loads exactly on both, else `installed`                          */
    int         installed;   /* the transformers major found on this machine (0: none; the tool probes) */
    const char *base_name;   /* base_model_name_or_path; NULL: the run's Hugging Face base folder     */
};

/* LoRA checkpoint dir -> out_dir/{adapter_model.safetensors, adapter_config.json}
 * with Hugging Face PEFT names ("base_model.model." + the tensor's name +
 * ".lora_A/B.weight"), in one of two layouts (docs/lora.md, "PEFT layouts"):
 * transformers 4's per-expert names (target_modules a list, or on a model
 * with both dense and MoE layers a regex naming the dense MLP and the
 * experts apart), which peft 0.21 converts on load for transformers 5
 * except a mixed model's dense-MLP adapters (it drops them); or, for
 * layout 5 on a model with MoE layers, transformers 5's own: fused experts
 * (experts[.base_layer].lora_A/B, rank_pattern 2r for gate_up_proj) and the
 * dense MLP by target_parameters. Layout 0 (ao->hf_layout) writes the
 * transformers-4 file where it loads exactly on both majors, else the
 * layout of ao->installed (4 when 0). `note` (may be NULL) gets one line
 * saying the layout and why, then (after a newline) a warning when
 * base_model_name_or_path stays null. */
enum mt_status mt_export_lora_adapter(struct mt_ctx *ctx, const char *ckpt_dir, const char *out_dir,
                                      const struct mt_adapter_opts *ao, char *note, size_t note_len);

/* The run config of a PEFT LoRA adapter folder (adapter_config.json +
 * adapter_model.safetensors, either layout) on the base config cfg
 * (the --init-from model, resolved or not): sets lora_rank, lora_alpha and
 * lora_targets (from the tensors the file holds; every target_modules entry
 * must name a module meshtrain has a target for).
 * Refused (MT_ERR_INVALID_ARG / MT_ERR_FORMAT, one line naming the key or
 * tensor) for what meshtrain cannot honour: peft_type other than LORA,
 * lora_dropout != 0, bias != "none", use_dora, use_rslora, fan_in_fan_out,
 * rank_pattern / alpha_pattern other than transformers 5's fused gate_up
 * (2r, 2 alpha), layers_to_transform, modules_to_save, target_parameters
 * other than the dense MLP's weights and the fused experts, a module
 * meshtrain has no target for, and the experts' projections not all three
 * adapted. Either layout of mt_export_lora_adapter reads. */
enum mt_status mt_peft_config(struct mt_ctx *ctx, const char *adapter_dir, struct mt_config *cfg);

/* The adapter tensors of adapter_dir, checked against the registry of cfg
 * (the run's config, LoRA keys from mt_peft_config): every adapter present
 * (per expert, or unpacked from transformers 5's fused experts, whose
 * gate_up B must be block-diagonal), with the base's shapes, finite, no
 * tensor left over; written as a step-0 checkpoint at out_dir holding the
 * adapters only (no base, no optimizer state): setup loads the run's
 * adapters from it (mt_train_opts.lora_from). Refusals MT_ERR_INVALID_ARG. */
enum mt_status mt_peft_import(struct mt_ctx *ctx, const char *adapter_dir, const struct mt_config *cfg,
                              const char *out_dir);

/* Checkpoint dir -> out_dir/{config.json, model.safetensors,
 * generation_config.json[, tokenizer.json, tokenizer_config.json]}. Reads
 * the manifest and params.bin directly (checksum verified; no model, no
 * backend).
 *
 * Output protocol (nothing the command did not write is ever deleted):
 * out_dir may not be, contain or lie inside ckpt_dir (refused even with
 * force); an existing non-empty out_dir must be a previous export (its
 * config.json has "meshtrain_export") unless force. The files are written
 * into out_dir/.meshtrain_export.tmp and renamed over their namesakes one
 * by one; other files in out_dir stay. In a previous export, files of
 * mt_export_hf_files this export does not write (an old tokenizer.json) are
 * removed, so the folder never mixes two exports.
 *
 * Errors: bad/missing checkpoint -> MT_ERR_IO / MT_ERR_FORMAT; a model HF
 * cannot represent without allow_lossy (message names every feature),
 * refused output, bad tokenizer -> MT_ERR_INVALID_ARG / MT_ERR_FORMAT. With
 * allow_lossy, warn says exactly what the HF model drops. */
enum mt_status mt_export_hf(struct mt_ctx *ctx, const char *ckpt_dir, const char *out_dir,
                            const struct mt_export_opts *opts, char *warn, size_t warn_len);

/* hf_dir/{config.json, model.safetensors} -> checkpoint at out_dir, step 0,
 * no optimizer state (the loader then starts the optimizer from zero).
 * seq_len > 0 overrides max_position_embeddings as the model's seq_len.
 * Every tensor of the model must be present with its shape; with
 * tie_word_embeddings lm_head is embed_tokens (as in HF, whatever lm_head
 * the file holds). An existing out_dir without manifest.json that is not
 * empty is refused unless force; out_dir overlapping hf_dir is refused. */
enum mt_status mt_import_hf(struct mt_ctx *ctx, const char *hf_dir, const char *out_dir, int seq_len, int force,
                            char *warn, size_t warn_len);

/* dir is a Hugging Face folder: config.json + model.safetensors, no
 * manifest.json. */
int mt_import_hf_is_folder(const char *dir);

/* mt_import_hf of hf_dir (seq_len from the folder) into a fresh private
 * temporary directory (mkdtemp under $TMPDIR, else /tmp): tmp is that
 * directory (the caller removes it, mt_file_rm_rf; "" when none was made),
 * ckpt = tmp/ckpt, the checkpoint. The import is deterministic, so its
 * manifest hash identifies the folder's weights: an adapter-only LoRA
 * checkpoint names an HF base by it (docs/checkpoint.md). */
enum mt_status mt_import_hf_temp(struct mt_ctx *ctx, const char *hf_dir, char *tmp, size_t tmp_n, char *ckpt,
                                 size_t ckpt_n, char *warn, size_t warn_len);

/* mt_ckpt_load (no optimizer) for the tools that read a checkpoint's model
 * (logits, sample): an adapter-only checkpoint whose base is a Hugging Face
 * folder reads the base from the folder's temporary import (checked by its
 * manifest hash like any base). */
enum mt_status mt_import_ckpt_load(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                                   struct mt_param *params, int n_params);

#endif /* MT_EXPORT_H */
