/*
 * mt_tok.h — the byte-level BPE tokenizer: pre-tokenizer, trainer, encoder,
 * decoder, file format, and the text corpus reader used by `prepare`.
 *
 * Vocabulary layout (V = vocab_size):
 *   ids 0..255                 the 256 single bytes
 *   ids 256..256+M-1           merges, in training order (merge i -> id 256+i)
 *   ids 256+M..V-1             special tokens; today one: <|bos|> (= V-1)
 * so V = 256 + M + MT_TOK_N_SPECIAL. Encoding never produces a special token
 * (the text "<|bos|>" in the input is encoded as plain bytes), so
 * decode(encode(x)) == x for every byte string x; decoding a special token
 * gives its name.
 *
 * Pre-tokenization (GPT-4 split pattern, hand-written for UTF-8, see
 * pretokenize.c) cuts text into chunks; merges never cross a chunk boundary.
 *
 * Example:
 *     struct mt_tok_trainer *tr;
 *     mt_tok_trainer_create(ctx, &tr);
 *     mt_tok_trainer_add(ctx, tr, text, n);            // any number of times
 *     struct mt_tok *tok;
 *     mt_tok_trainer_run(ctx, tr, 4096, NULL, &tok);   // 4096-token vocab
 *     mt_tok_trainer_destroy(ctx, tr);
 *     struct mt_tok_ids ids = {0};
 *     mt_tok_encode(ctx, tok, text, n, &ids);          // appends to ids
 *     mt_tok_save(ctx, tok, "tok.bin");
 *     mt_tok_ids_free(ctx, &ids);
 *     mt_tok_destroy(ctx, tok);
 *
 * File format: docs/tokenizer.md (magic "MTBPETOK", version 1, checksum).
 */
#ifndef MT_TOK_H
#define MT_TOK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "../core/mt_core.h"

#define MT_TOK_MAGIC      "MTBPETOK"   /* 8 bytes, no terminator in the file */
#define MT_TOK_VERSION    1
#define MT_TOK_N_SPECIAL  1            /* <|bos|> */
#define MT_TOK_MIN_VOCAB  (256 + MT_TOK_N_SPECIAL + 1)  /* bytes + specials + >= 1 merge = 258 */
#define MT_TOK_MAX_VOCAB  65536        /* ids are uint16 in the shards */

struct mt_tok;          /* opaque: a loaded/trained tokenizer (tokenizer.c) */
struct mt_tok_trainer;  /* opaque: chunk counts + BPE trainer (bpe_train.c) */

/* A growable list of token ids (uint32 so that 65535 and friends fit). */
struct mt_tok_ids {
    uint32_t *ids;
    size_t    n, cap;
};
void mt_tok_ids_free(struct mt_ctx *ctx, struct mt_tok_ids *v);  /* frees ids, zeroes v */

/* ---- pre-tokenizer (pretokenize.c) ----
 * End (exclusive) of the chunk that starts at s[i] (i < n); always > i.
 * Splitting a text is `for (i = 0; i < n; i = j) j = mt_tok_pretok_next(s, n, i);` */
size_t mt_tok_pretok_next(const uint8_t *s, size_t n, size_t i);

/* ---- trainer (bpe_train.c) ---- */
enum mt_status mt_tok_trainer_create(struct mt_ctx *ctx, struct mt_tok_trainer **out);
void mt_tok_trainer_destroy(struct mt_ctx *ctx, struct mt_tok_trainer *tr);  /* no-op on NULL */
/* Pre-tokenize text and count its unique chunks (weighted by occurrence). */
enum mt_status mt_tok_trainer_add(struct mt_ctx *ctx, struct mt_tok_trainer *tr,
                                  const uint8_t *text, size_t n);
/* Number of unique chunks / total bytes added so far. */
size_t   mt_tok_trainer_n_chunks(const struct mt_tok_trainer *tr);
uint64_t mt_tok_trainer_n_bytes(const struct mt_tok_trainer *tr);
/* Learn up to vocab_size - 256 - MT_TOK_N_SPECIAL merges. Most frequent pair
 * first; ties go to the smaller (left id, right id). If the corpus runs out of
 * pairs first, training stops early and the vocabulary is smaller (the
 * returned tokenizer says its real size). progress: NULL or a stream for
 * progress lines. Errors: vocab_size outside [MT_TOK_MIN_VOCAB,
 * MT_TOK_MAX_VOCAB] -> MT_ERR_INVALID_ARG; no text -> MT_ERR_INVALID_ARG.
 * The trainer is consumed: run it once. */
enum mt_status mt_tok_trainer_run(struct mt_ctx *ctx, struct mt_tok_trainer *tr, int vocab_size,
                                  FILE *progress, struct mt_tok **out);

/* ---- the tokenizer (tokenizer.c) ---- */
/* Build from a merge list: merges[2*i], merges[2*i+1] are the left and right
 * ids of token 256+i (each < 256+i). MT_ERR_FORMAT if a merge is invalid. */
enum mt_status mt_tok_create(struct mt_ctx *ctx, const uint32_t *merges, int n_merges,
                             struct mt_tok **out);
void mt_tok_destroy(struct mt_ctx *ctx, struct mt_tok *tok);  /* no-op on NULL */

/* Errors: MT_ERR_IO (missing/unreadable), MT_ERR_FORMAT (bad magic, other
 * version, truncated, checksum, invalid merge). */
enum mt_status mt_tok_load(struct mt_ctx *ctx, const char *path, struct mt_tok **out);
/* Written to "<path>.tmp.<pid>" then renamed: an existing file is replaced
 * only by a complete one. */
enum mt_status mt_tok_save(struct mt_ctx *ctx, const struct mt_tok *tok, const char *path);
/* The whole file image (what mt_tok_save writes); caller frees with mt_free. */
enum mt_status mt_tok_serialize(struct mt_ctx *ctx, const struct mt_tok *tok, uint8_t **buf,
                                size_t *len);
enum mt_status mt_tok_deserialize(struct mt_ctx *ctx, const uint8_t *buf, size_t len,
                                  struct mt_tok **out);

int mt_tok_vocab_size(const struct mt_tok *tok);
int mt_tok_n_merges(const struct mt_tok *tok);
int mt_tok_bos_id(const struct mt_tok *tok);
/* Merge i (0 <= i < n_merges): left and right ids of token 256+i. */
void mt_tok_merge(const struct mt_tok *tok, int i, uint32_t *left, uint32_t *right);
/* xxh64 of the file image (identifies the tokenizer in meta.json). */
uint64_t mt_tok_hash(const struct mt_tok *tok);

/* tokenizer.json text (Hugging Face `tokenizers`: Split(GPT-4 regex) +
 * ByteLevel pre-tokenizer, BPE model with every merge, <|bos|> as a special
 * added token) encoding like mt_tok_encode on the texts docs/export.md
 * lists. *out is malloc'd (free()). Two tokens with the same bytes ->
 * MT_ERR_FORMAT (HF's vocabulary cannot hold both). hf_json.c */
enum mt_status mt_tok_hf_json(struct mt_ctx *ctx, const struct mt_tok *tok, char **out);

/* Append the ids of text to out (no BOS added). Uses an internal chunk cache,
 * so a tokenizer must not be used by two threads at once. */
enum mt_status mt_tok_encode(struct mt_ctx *ctx, struct mt_tok *tok, const uint8_t *text, size_t n,
                             struct mt_tok_ids *out);
/* Encode ONE chunk (no pre-tokenization) — for tests. method: 0 auto,
 * 1 quadratic reference (lowest-rank pair, leftmost first, until none),
 * 2 heap-based O(n log n). Both give the same ids. */
enum mt_status mt_tok_encode_chunk(struct mt_ctx *ctx, const struct mt_tok *tok, const uint8_t *chunk,
                                   size_t n, int method, struct mt_tok_ids *out);
/* Bytes of one token (NULL, *len = 0 if id >= vocab_size). Pointer valid
 * until destroy. Specials give their name ("<|bos|>"). */
const uint8_t *mt_tok_token_bytes(const struct mt_tok *tok, uint32_t id, size_t *len);
/* Decode ids into a new buffer (caller frees with mt_free). An id >= vocab
 * -> MT_ERR_INVALID_ARG naming the position. */
enum mt_status mt_tok_decode(struct mt_ctx *ctx, const struct mt_tok *tok, const uint32_t *ids,
                             size_t n, uint8_t **text, size_t *len);

/* ---- the text corpus (corpus.c) ----
 * Inputs are files or directories (recursed; regular files only, symlinks
 * not followed; each directory's files in sorted path order). Files with a
 * NUL byte in their first 8 KiB are binary: skipped and counted. Empty
 * files are skipped. With max_bytes > 0, files are taken in order until the
 * total reaches max_bytes (the last one cut short). */
#define MT_TOK_DEFAULT_CORPUS     "/usr/include"
#define MT_TOK_DEFAULT_MAX_BYTES  (20ull * 1000 * 1000)
#define MT_TOK_BINARY_PROBE       8192

struct mt_tok_corpus {
    int       n_files;          /* text files taken (documents)            */
    char    **paths;            /* (n_files)                                */
    uint64_t *sizes;            /* (n_files) bytes taken from each file     */
    uint64_t  total_bytes;      /* sum of sizes                             */
    int       n_binary;         /* files skipped as binary                  */
    int       n_empty;          /* empty files skipped                      */
    int       truncated;        /* 1 if max_bytes cut the corpus            */
    uint64_t  max_bytes;
    /* running hash of (path, size, contents) of the files read so far, in order */
    void     *hash_state;
    int       next_read;
};

/* Errors: an input missing / unreadable / not a file or directory ->
 * MT_ERR_IO naming it; no text at all -> MT_ERR_INVALID_ARG. */
enum mt_status mt_tok_corpus_gather(struct mt_ctx *ctx, const char *const *inputs, int n_inputs,
                                    uint64_t max_bytes, struct mt_tok_corpus **out);
void mt_tok_corpus_destroy(struct mt_ctx *ctx, struct mt_tok_corpus *c);  /* no-op on NULL */
/* Read document i (must be read in order 0, 1, ...; updates the hash) into a
 * buffer the caller frees with mt_free. Bytes read = min(size, what is there). */
enum mt_status mt_tok_corpus_read(struct mt_ctx *ctx, struct mt_tok_corpus *c, int i,
                                  uint8_t **buf, size_t *len);
/* xxh64 over (path, size, contents) of every file read so far. */
uint64_t mt_tok_corpus_hash(const struct mt_tok_corpus *c);

#endif /* MT_TOK_H */
