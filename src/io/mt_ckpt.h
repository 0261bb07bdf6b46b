/*
 * mt_ckpt.h — checkpoints: a directory, manifest written last, resharding load.
 *
 * Layout of a checkpoint directory DIR (e.g. OUT/ckpt/step_000100):
 *   params.bin      every parameter, full global tensor, fp32 row-major, at
 *                   the offset the manifest gives (64-byte aligned)
 *   optim.bin       every optimizer state tensor, same scheme
 *   tokenizer.bin   (optional) the data's tokenizer, copied in before the
 *                   commit and listed with its checksum
 *   manifest.json   format version, config, mesh it was saved from, step,
 *                   data position, rng state (seed), optimizer steps, run id, and per
 *                   tensor: name, file, offset, global shape, dtype "F32";
 *                   per file: size and xxh64 checksum; and "manifest_xxh64",
 *                   the xxh64 of the manifest's own canonical text (every
 *                   other key, printed unformatted). Written LAST.
 *                   Version 3 (adapter-only LoRA): also "base": {manifest_hash,
 *                   path}; the tensors are the adapters and their optimizer
 *                   state, every other parameter is the base's (mt_ckpt_load_base).
 * A checkpoint that belongs to a training run (non-empty run id) also
 * updates DIR/../latest ("step_NNNNNN\nRUN_ID\n", written atomically after
 * the commit); mt_ckpt_resolve follows it. See docs/checkpoint.md.
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
#include "../optim/mt_optim.h"

#define MT_CKPT_RUN_ID_LEN 17   /* 16 lowercase hex digits + NUL */

struct mt_ckpt_meta {
    int      step;          /* steps completed, 0 ..= 100000000                          */
    int64_t  data_pos;      /* next global sequence index (= step * batch_size)          */
    uint64_t seed;
    long     optim_t;       /* optimizer steps taken: 0 at step 0, 1 ..= step after
                               (manifest key "adam_t": the format keeps its name) */
    char     mesh[128];     /* "pp=1,dp=1,ep=1,tp=1"                                     */
    char     run_id[MT_CKPT_RUN_ID_LEN];   /* the training run (lineage: a resume keeps
                                              it); "" = none (import): no `latest`   */
    const char *tokenizer;  /* save only (rank 0): a file copied in as tokenizer.bin
                               before the commit, NULL = none; NULL after a read     */
    /* An adapter-only LoRA checkpoint (docs/checkpoint.md) holds the adapters
     * and their optimizer state; the frozen base lives in another checkpoint,
     * named here: its manifest hash (manifest_xxh64, what is checked) and
     * its absolute path (a hint: resume may name it with --init-from). */
    char     base_hash[MT_CKPT_RUN_ID_LEN];   /* 16 hex digits; "" = a full checkpoint */
    char     base_path[4096];
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
 * ranks, a meta out of range: detected before anything is written, DIR
 * untouched), MT_ERR_NUMERIC (a rank's data holds a NaN or Inf: the message
 * names the tensor, the rank and meta->step; nothing is committed),
 * MT_ERR_RUNTIME (a write, fsync, rename or the tokenizer copy failed: full
 * disk, quota, file size limit... — a runtime failure, not bad input),
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
 * The manifest is validated in full first (its own checksum, every field:
 * step, data_pos, adam_t ranges, seed, files, tensor offsets equal to the
 * layout save computes, file sizes). Errors: missing manifest (MT_ERR_IO),
 * anything else wrong with it (MT_ERR_FORMAT, naming the field). */
enum mt_status mt_ckpt_read_meta(struct mt_ctx *ctx, const char *dir, struct mt_config *cfg,
                                 struct mt_ckpt_meta *meta);

/* Load the boxes this rank owns into params (+ optimizer state if o != NULL).
 * `params` may be any subset of the checkpoint's parameters (a rank passes
 * only what it owns), and `o` may hold states for any subset: exactly those
 * are read, nothing else is touched. If the checkpoint has no optim.bin and
 * its step is 0 (an import) o's states are zeroed and its t is 0; a step > 0
 * without optim.bin is refused (MT_ERR_FORMAT: a resumed run would silently
 * restart its optimizer). Else t is the saved optim_t.
 * Verifies file checksums and every tensor's shape against the params:
 * mismatch -> MT_ERR_FORMAT naming the tensor / file. */
enum mt_status mt_ckpt_load(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            struct mt_param *params, int n_params, struct mt_optim *o);

/* mt_ckpt_load of an adapter-only checkpoint `dir` (meta base_hash set):
 * the parameters it holds (adapters) and the optimizer states come from
 * dir, every other parameter from its base: `base_dir`, or the recorded
 * base_path when base_dir is NULL, after mt_ckpt_base_check. For a full
 * checkpoint base_dir must be NULL and this is mt_ckpt_load (which is this
 * call with base_dir NULL). */
enum mt_status mt_ckpt_load_base(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir, const char *base_dir,
                                 struct mt_param *params, int n_params, struct mt_optim *o);

/* The manifest hash of checkpoint `dir` (its validated manifest_xxh64, 16
 * lowercase hex digits + NUL): what an adapter-only checkpoint records of
 * its base. Errors of mt_ckpt_read_meta. */
enum mt_status mt_ckpt_manifest_hash(struct mt_ctx *ctx, const char *dir, char hash[MT_CKPT_RUN_ID_LEN]);

/* The base of adapter-only checkpoint `dir` (its meta `m`) is `base_dir`
 * (NULL: m->base_path): a full checkpoint there (not itself adapter-only)
 * whose manifest hash is m->base_hash. MT_ERR_INVALID_ARG (one line) when
 * the base is missing, has another hash or is adapter-only. */
enum mt_status mt_ckpt_base_check(struct mt_ctx *ctx, const char *dir, const struct mt_ckpt_meta *m,
                                  const char *base_dir);

/* One tensor of a checkpoint manifest (for export and tools that read a
 * checkpoint without building a model). */
/* Every tensor of DIR's params.bin is a parameter of `saved` (the config
 * mt_ckpt_read_meta read from the same manifest) with the global shape that
 * config gives it (issue 33 item 7: a manifest saying n_layer=1 over 2-layer
 * tensors, its checksum recomputed, used to resume silently dropping the
 * second layer). Called by resume, export and logits. MT_ERR_FORMAT naming
 * the count and the first stray tensor, or the tensor whose shape differs. */
enum mt_status mt_ckpt_check_tensors(struct mt_ctx *ctx, const char *dir, const struct mt_config *saved);

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

/*
 * Which checkpoint directory `--resume DIR` (or `export --ckpt DIR`) means;
 * every command that picks a checkpoint calls this.
 *   - DIR holds a manifest.json: DIR itself (load validates it; no fallback:
 *     the user named it).
 *   - DIR/ckpt/latest exists (a training output): the checkpoint it names,
 *     if intact (manifest valid, every listed file matches its checksum).
 *     If not, the newest intact checkpoint of the SAME run (run id) with a
 *     lower step; `note` then says which one was damaged and why, and which
 *     one is used (the caller prints it). Another run's checkpoints are never
 *     picked.
 *   - no latest (outputs of older builds, imports): the newest intact
 *     step_N under DIR/ckpt (damaged ones skipped, saying so in `note`);
 *     refused if the intact candidates belong to more than one run.
 * `note` (may be NULL) is "" when there is nothing to say. Errors: MT_ERR_IO
 * (nothing there), MT_ERR_FORMAT (damaged, no intact fallback of the run),
 * MT_ERR_INVALID_ARG (several runs and no latest; path too long).
 */
enum mt_status mt_ckpt_resolve(struct mt_ctx *ctx, const char *dir_or_out, char *path, size_t path_len, char *note,
                               size_t note_len);

/* mt_ckpt_resolve for callers that cannot show the note (export, sample):
 * where resolve would fall back (or skip a damaged newest checkpoint), find
 * refuses instead (MT_ERR_FORMAT, the note as message, suggesting to pass the
 * fallback directory): a checkpoint is never substituted silently. */
enum mt_status mt_ckpt_find(struct mt_ctx *ctx, const char *dir_or_out, char *path, size_t path_len);

/* A fresh run id: 16 lowercase hex digits from the clock, pid and
 * /dev/urandom (unique across runs for every practical purpose). */
void mt_ckpt_run_id_new(char out[MT_CKPT_RUN_ID_LEN]);

/* Delete checkpoint `dir` if (and only if) its manifest is readable and
 * names `run_id` (non-empty): a pruner never deletes what its run did not
 * write. MT_ERR_INVALID_ARG if it belongs to another run (or none), errors of
 * mt_ckpt_read_meta, MT_ERR_RUNTIME if removal fails. */
enum mt_status mt_ckpt_remove(struct mt_ctx *ctx, const char *dir, const char *run_id);

/* The output directory's lock: creates `out_dir` (mkdir -p) and OUT/.lock,
 * takes an exclusive non-blocking flock on it and writes this pid into it;
 * *fd holds the lock until mt_ckpt_unlock (or process exit). Errors:
 * MT_ERR_INVALID_ARG (held by another process: "in use", naming its pid),
 * MT_ERR_IO (cannot create: bad path, permissions), MT_ERR_RUNTIME (no
 * space). The .lock file is left in place (removing it would race). */
enum mt_status mt_ckpt_lock(struct mt_ctx *ctx, const char *out_dir, int *fd);
void mt_ckpt_unlock(int fd);   /* fd < 0: no-op */

#endif /* MT_CKPT_H */
