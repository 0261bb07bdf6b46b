/*
 * mt_data.h — llm.c token shards and the mesh-independent batch order.
 *
 * A shard: 256 int32 header (magic 20240520, version 1, token count), then
 * uint16 tokens. Several shards are one stream in name order. Opening checks
 * every header against its file size and every token against vocab_size, so
 * that bad data is an error before any output is written.
 *
 * Default order (SPEC.md section 3): with G sequences per global batch and N
 * tokens, global sequence i of step s reads tokens [o, o+T] with
 * o = ((s*G + i) * T) mod (N - T - 1); inputs are the first T, targets the
 * last T. A rank asks only for the sequences it owns.
 */
#ifndef MT_DATA_H
#define MT_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"

#define MT_SHARD_MAGIC   20240520
#define MT_SHARD_VERSION 1

struct mt_data;

/* path: a shard file, a directory (every *.bin in it, name order; when
 * `split` is "train" files whose name contains "val" are skipped, when "val"
 * only those are taken; NULL = all), or a glob pattern. Errors: MT_ERR_IO
 * (missing/unreadable/empty), MT_ERR_FORMAT (magic, version, count vs size),
 * MT_ERR_INVALID_ARG (token >= vocab_size: names file and position), and a
 * stream shorter than T+2 tokens. */
/* The model's vocabulary against the data's (train's and plan's --data).
 * The data's is DIR/meta.json's vocab_size (DIR: data_path's directory;
 * `meshtrain prepare` writes it from the tokenizer). *vocab_size 0 (unset)
 * takes it; a set one must equal it (a bigger model wastes rows and
 * mismatches the tokenizer `sample`/`export` later check; a smaller one
 * cannot embed the ids), except from_ckpt (--resume/--init-from: the
 * checkpoint fixes the shape): then only a smaller one is refused. Errors
 * (one line, MT_ERR_CONFIG): the mismatch, naming both numbers and meta.json;
 * unset and no meta.json ("vocab_size is not set ..."), unless from_ckpt;
 * MT_ERR_IO: data_path names no file, directory or glob match (checked
 * first when unset: the path is the problem, not the config); MT_ERR_FORMAT:
 * meta.json without a numeric vocab_size. */
enum mt_status mt_data_resolve_vocab(struct mt_ctx *ctx, const char *data_path, int *vocab_size, int from_ckpt);

enum mt_status mt_data_open(struct mt_ctx *ctx, const char *path, const char *split, int vocab_size,
                            int T, struct mt_data **out);
void   mt_data_close(struct mt_data *d);  /* no-op on NULL */
size_t mt_data_ntokens(const struct mt_data *d);
int    mt_data_nfiles(const struct mt_data *d);
/* Largest token id seen (for vocab checks / inference). */
int    mt_data_max_token(const struct mt_data *d);

/* Global sequence i (0 <= i < G) of step s: inp, tgt (T) host int32. */
/* Order of sequences: 0 = SPEC.md section 3 default; 1 = shuffled windows
 * (data.c: a seeded per-epoch permutation, identical on every mesh). */
void mt_data_set_order(struct mt_data *d, int shuffled, uint64_t seed);
void mt_data_sequence(const struct mt_data *d, int64_t step, int G, int64_t i, int T,
                      int32_t *inp, int32_t *tgt);

/* Write a shard (used by prepare and by tests). */
enum mt_status mt_data_write_shard(struct mt_ctx *ctx, const char *path, const uint16_t *tokens, size_t n);

#endif /* MT_DATA_H */
