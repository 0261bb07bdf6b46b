/*
 * mt_export.h — Hugging Face interchange: safetensors + config.json.
 *
 * The model family of SPEC.md section 1 is Qwen3 (dense) / Qwen3-MoE: the
 * parameter names ARE the Hugging Face names, so export and import copy
 * tensors by name, with no renaming or permutation.
 *
 *     char warn[1024];
 *     rc = mt_export_hf(&ctx, "run/ckpt/step_000100", "run/hf", -1, 0, warn, sizeof warn);
 *     // run/hf/config.json + run/hf/model.safetensors; warn lists what HF will not reproduce
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
 * (omitted). Appends warnings (one per line) to warn for what HF will not
 * reproduce (shared expert, logit softcap). Returns malloc'd text (free()),
 * NULL on allocation failure. */
char *mt_export_hf_config(const struct mt_config *cfg, int bos_token_id, char *warn, size_t warn_len);

/* Parse a Qwen3 / Qwen3-MoE config.json into the model keys of cfg (the
 * caller fills defaults first); *tied is set to tie_word_embeddings.
 * Unsupported architecture or feature -> MT_ERR_FORMAT naming the key. */
enum mt_status mt_export_hf_config_parse(struct mt_ctx *ctx, const char *json_text, struct mt_config *cfg,
                                         int *tied, char *warn, size_t warn_len);

/* Checkpoint dir -> out_dir/{config.json, model.safetensors}. Reads the
 * manifest and params.bin directly (checksum verified; no model, no
 * backend). Writes out_dir.tmp and renames it; an existing out_dir that is
 * not a previous export (no model.safetensors) and not empty is refused
 * unless force. Errors: bad/missing checkpoint -> MT_ERR_IO / MT_ERR_FORMAT,
 * refused output -> MT_ERR_INVALID_ARG. */
enum mt_status mt_export_hf(struct mt_ctx *ctx, const char *ckpt_dir, const char *out_dir, int bos_token_id,
                            int force, char *warn, size_t warn_len);

/* hf_dir/{config.json, model.safetensors} -> checkpoint at out_dir, step 0,
 * no optimizer state (the loader then starts the optimizer from zero).
 * seq_len > 0 overrides max_position_embeddings as the model's seq_len.
 * Every tensor of the model must be present with its shape (lm_head may be
 * absent when tie_word_embeddings: it is copied from embed_tokens).
 * An existing out_dir without manifest.json that is not empty is refused
 * unless force. */
enum mt_status mt_import_hf(struct mt_ctx *ctx, const char *hf_dir, const char *out_dir, int seq_len, int force,
                            char *warn, size_t warn_len);

#endif /* MT_EXPORT_H */
