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
 * Saving on a mesh (ZeRO: each rank owns whole parameters and optimizer
 * states): every rank builds the same global entry list and passes data
 * only for what it owns,
 *
 *     struct mt_ckpt_entry e[] = {
 *         {"lm_head.weight",         0, &head, mine ? head.data : NULL},
 *         {"lm_head.weight.exp_avg", 1, &head, mine ? m.data    : NULL},
 *     };
 *     rc = mt_ckpt_save_group(ctx, ops, dp_comm, dir, cfg, &meta, e, 2);
 *
 * and every rank then gets the same outcome. On load each rank passes only
 * the params (and an optimizer holding only the states) it owns.
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

struct mt_comm;   /* the collectives interface, ../dist/mt_comm.h */

/* One tensor of the checkpoint's GLOBAL layout. Every rank passes the same
 * list in the same order (names, files, global shapes); only `data` differs. */
struct mt_ckpt_entry {
    const char            *name;   /* tensor name in the manifest (< 160 bytes, unique)          */
    int                    file;   /* 0: params.bin, 1: optim.bin                                 */
    const struct mt_param *p;      /* global shape (ndim, shape) and the box (off, len, numel) held */
    const float           *data;   /* this rank's box (p->numel floats), backend memory (host if
                                      ops == NULL); NULL: this rank writes nothing of it          */
};

/*
 * Collective save over `comm`: every rank calls it with the same dir, cfg,
 * meta and entry list. Tensors are laid out in list order within each file
 * (64-byte aligned). Comm rank 0 creates DIR.tmp and sizes the files; every
 * rank pwrite()s the boxes it holds data for and fsyncs; after all ranks are
 * done, rank 0 hashes the files, writes manifest.json LAST and swaps DIR.tmp
 * into DIR. Bytes of a tensor that no rank writes read back as zeros.
 * params.bin always exists (possibly empty); optim.bin only if an entry
 * targets it. cfg and meta are read on rank 0 only (but must be non-NULL).
 *
 * The outcome is agreed on: every rank returns MT_OK, or every rank returns
 * the same error status. The failing rank keeps its own message; the others
 * get one naming the failing rank (the highest one if several failed). No
 * rank is left waiting in a collective. Errors: MT_ERR_INVALID_ARG (bad or
 * duplicate entry, box outside its shape, lists or dirs that differ across
 * ranks: detected before anything is written, DIR untouched), MT_ERR_IO,
 * MT_ERR_OOM, MT_ERR_COMM. On any error DIR is untouched and DIR.tmp is
 * removed once the ranks have agreed to fail. comm == NULL is
 * MT_ERR_INVALID_ARG on that rank alone (no collective is possible).
 */
enum mt_status mt_ckpt_save_group(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct mt_comm *comm,
                                  const char *dir, const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                                  const struct mt_ckpt_entry *entries, int n_entries);

/* Save params (+ optimizer state if o != NULL) to dir, as one rank:
 * mt_ckpt_save_group on a self group with params (in order) to params.bin,
 * then every mt_optim_state_get state to optim.bin. */
enum mt_status mt_ckpt_save(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                            struct mt_param *params, int n_params, struct mt_optim *o);

/* Read only the manifest's config and meta (for resume/export/sample).
 * Errors: missing manifest (MT_ERR_IO), bad JSON or version (MT_ERR_FORMAT). */
enum mt_status mt_ckpt_read_meta(struct mt_ctx *ctx, const char *dir, struct mt_config *cfg,
                                 struct mt_ckpt_meta *meta);

/* Load the boxes this rank owns into params (+ optimizer state if o != NULL).
 * `params` may be any subset of the checkpoint's parameters (a rank passes
 * only what it owns), and `o` may hold states for any subset: exactly those
 * are read, nothing else is touched. If the checkpoint has no optim.bin (an
 * import) o's states are zeroed and its t is 0; else t is the saved adam_t.
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
