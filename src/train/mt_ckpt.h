/*
 * mt_ckpt.h — checkpoints: a directory, manifest written last, resharding load.
 *
 * Layout of a checkpoint directory DIR (e.g. OUT/ckpt/step_000100):
 *   params.bin      every parameter, full global tensor, fp32 row-major, at
 *                   the offset the manifest gives (64-byte aligned)
 *   optim.bin       every optimizer state tensor, same scheme
 *   manifest.json   format version, config, mesh it was saved from, step,
 *                   data position, rng state (seed), adam t, and per tensor:
 *                   name, file, offset, global shape, dtype "F32"; per file:
 *                   size and xxh64 checksum. Written LAST.
 * Each rank pwrite()s only its box of each tensor; a run on another mesh
 * reads exactly the slices it owns (resharding on load). The directory is
 * written as DIR.tmp and renamed: a crash mid-save leaves the last good
 * checkpoint intact.
 *
 * `ops` may be NULL in save/load: parameter and state data are then host
 * memory (used by import/export, which run without a backend).
 */
#ifndef MT_CKPT_H
#define MT_CKPT_H

#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../core/mt_param.h"
#include "../ops/mt_ops.h"
#include "mt_optim.h"

struct mt_ckpt_meta {
    int      step;          /* steps completed                  */
    int64_t  data_pos;      /* next global sequence index       */
    uint64_t seed;
    long     adam_t;
    char     mesh[128];     /* "pp=1,dp=1,ep=1,tp=1"            */
};

/* Save params (+ optimizer state if o != NULL) to dir. */
enum mt_status mt_ckpt_save(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                            struct mt_param *params, int n_params, struct mt_optim *o);

/* Read only the manifest's config and meta (for resume/export/sample).
 * Errors: missing manifest (MT_ERR_IO), bad JSON or version (MT_ERR_FORMAT). */
enum mt_status mt_ckpt_read_meta(struct mt_ctx *ctx, const char *dir, struct mt_config *cfg,
                                 struct mt_ckpt_meta *meta);

/* Load the boxes this rank owns into params (+ optimizer state if o != NULL).
 * Verifies file checksums and every tensor's shape against the params:
 * mismatch -> MT_ERR_FORMAT naming the tensor / file. */
enum mt_status mt_ckpt_load(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            struct mt_param *params, int n_params, struct mt_optim *o);

/* One tensor of a checkpoint manifest (for export and tools that read a
 * checkpoint without building a model). */
struct mt_ckpt_tensor {
    char    name[160];
    char    file[32];     /* "params.bin" | "optim.bin"                   */
    int64_t offset;       /* bytes into file, 64-byte aligned             */
    int     ndim;         /* 1 or 2                                       */
    int64_t shape[2];     /* global shape; shape[1] == 1 when ndim == 1   */
};

/* The manifest's tensors stored in `file` ("params.bin", "optim.bin"; NULL =
 * every tensor), in manifest order, after verifying that file's checksum
 * (every listed file when `file` is NULL). *out is allocated with mt_alloc
 * (caller frees with mt_free). Errors as mt_ckpt_load. */
enum mt_status mt_ckpt_read_tensors(struct mt_ctx *ctx, const char *dir, const char *file,
                                    struct mt_ckpt_tensor **out, int *n);

/* Latest complete checkpoint under OUT/ckpt (by step), or the dir itself if
 * it holds a manifest.json. Writes the path into `path`. MT_ERR_IO if none. */
enum mt_status mt_ckpt_find(struct mt_ctx *ctx, const char *dir_or_out, char *path, size_t path_len);

#endif /* MT_CKPT_H */
