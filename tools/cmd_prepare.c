/*
 * cmd_prepare.c — `meshtrain prepare`: text files -> llm.c token shards.
 *
 *   meshtrain prepare [--input PATH...] --tokenizer FILE --out DIR
 *                     [--shard-tokens N] [--val-frac F] [--max-bytes N]
 *
 * Each file is one document, written as <|bos|> + its tokens. Documents go to
 * DIR/train_NNNNNN.bin, except a held-out set that goes to DIR/val_NNNNNN.bin:
 * n_val = max(1, round(F * n_docs)) documents spread evenly over the list
 * (document i is held out iff floor((i+1) n_val / n) > floor(i n_val / n));
 * with a single document its last F of tokens are held out instead. Shards
 * hold at most N tokens (a document may straddle two shards, as in llm.c).
 * Also writes DIR/tokenizer.bin (a copy) and DIR/meta.json.
 *
 * Nothing is overwritten by a failed run: every input is checked before the
 * first byte is written, shards are written under temporary names and
 * renamed only once all of them exist; shards of an earlier run beyond the
 * new count are then removed so the directory holds one consistent stream.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cmd.h"
#include "core/mt_fileio.h"
#include "tok/mt_tok.h"
#include "io/mt_data.h"

#define MAX_INPUTS 4096
#define MAX_SHARDS 100000

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "meshtrain prepare: %s%s%s (see meshtrain prepare --help)\n", msg, arg ? " " : "", arg ? arg : "");
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain prepare [--input PATH...] --tokenizer FILE --out DIR\n"
            "                         [--shard-tokens N] [--val-frac F] [--max-bytes N]\n"
            "Each file is a document (<|bos|> first); directories are recursed in sorted order;\n"
            "binary files (NUL in the first 8 KiB) are skipped. No --input: the headers under\n"
            "%s, capped at --max-bytes (default %llu). Defaults: --shard-tokens 100000000,\n"
            "--val-frac 0.01. Writes DIR/train_000000.bin..., DIR/val_000000.bin,\n"
            "DIR/tokenizer.bin and DIR/meta.json.\n",
            MT_TOK_DEFAULT_CORPUS, (unsigned long long)MT_TOK_DEFAULT_MAX_BYTES);
}

/* One output stream (train or val): a token buffer flushed into shards. */
struct stream {
    const char *name;       /* "train" | "val" */
    uint16_t   *buf;        /* (shard_tokens) */
    size_t      n;
    int         n_shards;
    uint64_t    tokens;
    int         docs;
};

static void shard_path(char *out, size_t len, const char *dir, const char *name, int k, int tmp)
{
    if (tmp) snprintf(out, len, "%s/%s_%06d.bin.new.%ld", dir, name, k, (long)getpid());
    else snprintf(out, len, "%s/%s_%06d.bin", dir, name, k);
}

static enum mt_status flush(struct mt_ctx *ctx, struct stream *s, const char *dir)
{
    if (s->n == 0) return MT_OK;
    if (s->n_shards >= MAX_SHARDS)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "prepare: more than %d %s shards: raise --shard-tokens",
                            MAX_SHARDS, s->name);
    char path[4200];
    shard_path(path, sizeof path, dir, s->name, s->n_shards, 1);
    MT_CHECK(mt_data_write_shard(ctx, path, s->buf, s->n));
    s->n_shards++;
    s->n = 0;
    return MT_OK;
}

static enum mt_status append(struct mt_ctx *ctx, struct stream *s, const uint32_t *ids, size_t n,
                             size_t shard_tokens, const char *dir)
{
    for (size_t i = 0; i < n; i++) {
        s->buf[s->n++] = (uint16_t)ids[i];
        if (s->n == shard_tokens) MT_CHECK(flush(ctx, s, dir));
    }
    s->tokens += n;
    return MT_OK;
}

/* Remove temporaries of this run (failure path). */
static void remove_new(const char *dir, const struct stream *s)
{
    char path[4200];
    for (int k = 0; k < s->n_shards; k++) {
        shard_path(path, sizeof path, dir, s->name, k, 1);
        unlink(path);
    }
}

static enum mt_status commit(struct mt_ctx *ctx, const char *dir, const struct stream *s)
{
    char from[4200], to[4200];
    for (int k = 0; k < s->n_shards; k++) {
        shard_path(from, sizeof from, dir, s->name, k, 1);
        shard_path(to, sizeof to, dir, s->name, k, 0);
        if (rename(from, to) != 0) return mt_ctx_error(ctx, MT_ERR_IO, "cannot rename %s: %s", from, strerror(errno));
    }
    /* stale shards of an earlier run: NAME_NNNNNN.bin with NNNNNN >= n_shards */
    DIR *d = opendir(dir);
    if (!d) return MT_OK;
    struct dirent *e;
    size_t nl = strlen(s->name);
    while ((e = readdir(d)) != NULL) {
        const char *p = e->d_name;
        if (strncmp(p, s->name, nl) || p[nl] != '_' || strlen(p) != nl + 11 || strcmp(p + nl + 7, ".bin")) continue;
        int k = 0, ok = 1;
        for (int c = 0; c < 6; c++) {
            if (p[nl + 1 + c] < '0' || p[nl + 1 + c] > '9') ok = 0;
            else k = k * 10 + (p[nl + 1 + c] - '0');
        }
        if (ok && k >= s->n_shards) {
            snprintf(to, sizeof to, "%s/%s", dir, p);
            unlink(to);
        }
    }
    closedir(d);
    return MT_OK;
}

static enum mt_status write_text(struct mt_ctx *ctx, const char *path, const char *text)
{
    return mt_file_write_atomic(ctx, path, text, strlen(text), 0, MT_ERR_IO);
}

static void hex64(char *out, uint64_t v) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* The command line. prepare_args returns the process's exit code, or
 * GO_ON when the command continues. */
#define GO_ON (-1)
struct prep_opts {
    const char *inputs[MAX_INPUTS];
    int         n_inputs;
    const char *tok_path, *out;
    long long   shard_tokens, max_bytes;   /* max_bytes < 0: not given */
    double      val_frac;
    int         default_corpus;            /* no --input: the built-in corpus */
};
static int prepare_args(struct prep_opts *po, int argc, char **argv)
{
    static const char *const valued[] = {"--input", "--tokenizer", "--out", "--shard-tokens", "--val-frac",
                                         "--max-bytes", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (mt_cmd_option("prepare", NULL, valued, argc, argv, i) < 0) return 2;
        if (!strcmp(a, "--input")) {
            if (!strncmp(argv[i + 1], "--", 2)) return usage_error("--input needs a path", NULL);
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (po->n_inputs == MAX_INPUTS) return usage_error("too many --input paths", NULL);
                po->inputs[po->n_inputs++] = argv[++i];
            }
        } else if (!strcmp(a, "--tokenizer")) {
            po->tok_path = argv[++i];
        } else if (!strcmp(a, "--out")) {
            po->out = argv[++i];
        } else if (!strcmp(a, "--shard-tokens")) {
            po->shard_tokens = mt_cmd_size_arg("prepare", argv[++i]);
            if (po->shard_tokens < 0) return 2;   /* mt_cmd_size_arg said why */
            if (po->shard_tokens < 1 || po->shard_tokens > 2147483647LL)
                return usage_error("--shard-tokens must be in [1, 2147483647], got", argv[i]);
        } else if (!strcmp(a, "--val-frac")) {
            char *end;
            po->val_frac = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(po->val_frac >= 0 && po->val_frac <= 0.5))
                return usage_error("--val-frac must be in [0, 0.5], got", argv[i]);
        } else {   /* --max-bytes */
            po->max_bytes = mt_cmd_size_arg("prepare", argv[++i]);
            if (po->max_bytes < 0) return 2;   /* mt_cmd_size_arg said why */
        }
    }
    if (!po->tok_path) return usage_error("--tokenizer FILE is required", NULL);
    if (!po->out) return usage_error("--out DIR is required", NULL);
    po->default_corpus = mt_cmd_corpus_inputs(po->inputs, &po->n_inputs, &po->max_bytes);
    return GO_ON;
}

/* Document i of the corpus as tokens: <|bos|> then its encoding, in *ids
 * (reused across documents); *len its bytes. */
static enum mt_status encode_doc(struct mt_ctx *ctx, struct mt_tok *tok, struct mt_tok_corpus *corpus, int i,
                                 uint32_t bos, struct mt_tok_ids *ids, size_t *len)
{
    uint8_t *text;
    MT_CHECK(mt_tok_corpus_read(ctx, corpus, i, &text, len));
    ids->n = 0;
    enum mt_status rc = mt_tok_encode(ctx, tok, (const uint8_t *)"", 0, ids);  /* no-op; keeps ids allocated */
    if (rc == MT_OK) {
        if (ids->cap == 0) {
            ids->ids = mt_alloc(ctx, 1024 * sizeof(uint32_t), MT_BUCKET_OTHER);
            ids->cap = ids->ids ? 1024 : 0;
            if (!ids->ids) rc = MT_ERR_OOM;
        }
    }
    if (rc == MT_OK) {
        ids->ids[ids->n++] = bos;
        rc = mt_tok_encode(ctx, tok, text, *len, ids);
    }
    mt_free(ctx, text);
    return rc;
}

/* Document i of n (its tokens in ids) to its stream: held out iff
 * floor((i+1) n_val / n) > floor(i n_val / n); a single document's last
 * val_frac of tokens go to val. cap: the shard size. */
static enum mt_status route_doc(struct mt_ctx *ctx, const struct mt_tok_ids *ids, int i, int n, int n_val,
                                double val_frac, struct stream *tr, struct stream *va, size_t cap, const char *out)
{
    if (n_val > 0 && (int)((int64_t)(i + 1) * n_val / n) > (int)((int64_t)i * n_val / n)) {
        MT_CHECK(append(ctx, va, ids->ids, ids->n, cap, out));
        va->docs++;
    } else if (n == 1 && val_frac > 0 && ids->n >= 2) {
        size_t nv = (size_t)llround(val_frac * (double)ids->n);
        if (nv < 1) nv = 1;
        MT_CHECK(append(ctx, tr, ids->ids, ids->n - nv, cap, out));
        MT_CHECK(append(ctx, va, ids->ids + ids->n - nv, nv, cap, out));
        tr->docs++;
    } else {
        MT_CHECK(append(ctx, tr, ids->ids, ids->n, cap, out));
        tr->docs++;
    }
    return MT_OK;
}

/* meta.json (kept small: the trainer reads it whole), as malloc'd text
 * (free()); NULL when out of memory. */
static char *meta_json(const struct prep_opts *po, struct mt_tok *tok, const struct mt_tok_corpus *corpus,
                       uint32_t bos, uint64_t done_bytes, const struct stream *tr, const struct stream *va)
{
    const int n = corpus->n_files;
    char h_in[17], h_tok[17];
    hex64(h_in, mt_tok_corpus_hash(corpus));
    hex64(h_tok, mt_tok_hash(tok));
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", "meshtrain-shards");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddNumberToObject(j, "vocab_size", mt_tok_vocab_size(tok));
    cJSON_AddNumberToObject(j, "bos_id", bos);
    cJSON_AddStringToObject(j, "tokenizer", "tokenizer.bin");
    cJSON_AddStringToObject(j, "tokenizer_xxh64", h_tok);
    cJSON_AddBoolToObject(j, "default_corpus", po->default_corpus);
    cJSON *in = cJSON_AddArrayToObject(j, "inputs");
    for (int k = 0; k < po->n_inputs && k < 64; k++) cJSON_AddItemToArray(in, cJSON_CreateString(po->inputs[k]));
    cJSON_AddNumberToObject(j, "max_bytes", (double)po->max_bytes);
    cJSON_AddBoolToObject(j, "truncated", corpus->truncated);
    cJSON_AddNumberToObject(j, "files", n);
    cJSON_AddNumberToObject(j, "binary_files_skipped", corpus->n_binary);
    cJSON_AddNumberToObject(j, "empty_files_skipped", corpus->n_empty);
    cJSON_AddNumberToObject(j, "bytes", (double)done_bytes);
    cJSON_AddStringToObject(j, "input_xxh64", h_in);
    cJSON_AddStringToObject(j, "input_hash_covers", "for each file in order: path, NUL, uint64 LE byte count, bytes");
    cJSON_AddStringToObject(j, "first_file", corpus->paths[0]);
    cJSON_AddStringToObject(j, "last_file", corpus->paths[n - 1]);
    cJSON_AddNumberToObject(j, "val_frac", po->val_frac);
    cJSON_AddNumberToObject(j, "shard_tokens", (double)po->shard_tokens);
    cJSON_AddNumberToObject(j, "train_docs", tr->docs);
    cJSON_AddNumberToObject(j, "val_docs", va->docs);
    cJSON_AddNumberToObject(j, "train_tokens", (double)tr->tokens);
    cJSON_AddNumberToObject(j, "val_tokens", (double)va->tokens);
    cJSON_AddNumberToObject(j, "train_shards", tr->n_shards);
    cJSON_AddNumberToObject(j, "val_shards", va->n_shards);
    char *json = cJSON_Print(j);
    cJSON_Delete(j);
    return json;
}

/* Check every input, encode each document into its stream's temporary
 * shards, then rename them all, write tokenizer.bin and meta.json; on a
 * failure remove the temporaries (nothing of an earlier run is lost). */
int mt_cmd_prepare(int argc, char **argv)
{
    struct prep_opts po;
    memset(&po, 0, sizeof po);
    po.shard_tokens = 100000000;
    po.max_bytes = -1;
    po.val_frac = 0.01;
    int code = prepare_args(&po, argc, argv);
    if (code != GO_ON) return code;
    const char *out = po.out;

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_tok *tok = NULL;
    struct mt_tok_corpus *corpus = NULL;
    struct mt_tok_ids ids = {0};
    struct stream tr = {.name = "train"}, va = {.name = "val"};
    char *json = NULL;
    int wrote = 0;
    enum mt_status rc;
    double t0 = mt_time_sec(), last = t0;

    /* every input is checked before anything is written */
    MT_CHECK_GOTO(mt_tok_load(&ctx, po.tok_path, &tok), rc, done);
    MT_CHECK_GOTO(mt_tok_corpus_gather(&ctx, po.inputs, po.n_inputs, (uint64_t)po.max_bytes, &corpus), rc, done);
    if (mt_file_mkdir_p(out) != 0) {
        rc = mt_ctx_error(&ctx, MT_ERR_IO, "cannot create output directory %s: %s", out, strerror(errno));
        goto done;
    }
    int n = corpus->n_files;
    fprintf(stderr, "prepare: %d files, %llu bytes (%d binary skipped, %d empty%s) -> %s\n", n,
            (unsigned long long)corpus->total_bytes, corpus->n_binary, corpus->n_empty,
            corpus->truncated ? ", capped by --max-bytes" : "", out);
    size_t cap = (size_t)po.shard_tokens;
    /* buffers grow with the data, up to one shard */
    if (corpus->total_bytes + (uint64_t)n + 16 < cap) cap = (size_t)(corpus->total_bytes + (uint64_t)n + 16);
    tr.buf = mt_alloc(&ctx, cap * sizeof(uint16_t), MT_BUCKET_OTHER);
    va.buf = mt_alloc(&ctx, cap * sizeof(uint16_t), MT_BUCKET_OTHER);
    if (!tr.buf || !va.buf) { rc = MT_ERR_OOM; goto done; }
    int n_val = 0;
    if (po.val_frac > 0 && n >= 2) {
        n_val = (int)lround(po.val_frac * n);
        if (n_val < 1) n_val = 1;
        if (n_val > n - 1) n_val = n - 1;
    }
    uint32_t bos = (uint32_t)mt_tok_bos_id(&*tok);
    uint64_t done_bytes = 0;
    wrote = 1;
    for (int i = 0; i < n; i++) {
        size_t len;
        MT_CHECK_GOTO(encode_doc(&ctx, tok, corpus, i, bos, &ids, &len), rc, done);
        done_bytes += len;
        MT_CHECK_GOTO(route_doc(&ctx, &ids, i, n, n_val, po.val_frac, &tr, &va, cap, out), rc, done);
        double now = mt_time_sec();
        if (now - last >= 2.0 || i == n - 1) {
            last = now;
            fprintf(stderr, "prepare: %d/%d files, %.1f/%.1f MB, %llu tokens, %.1f MB/s\n", i + 1, n,
                    done_bytes / 1e6, corpus->total_bytes / 1e6, (unsigned long long)(tr.tokens + va.tokens),
                    done_bytes / 1e6 / (now - t0 + 1e-9));
        }
    }
    MT_CHECK_GOTO(flush(&ctx, &tr, out), rc, done);
    MT_CHECK_GOTO(flush(&ctx, &va, out), rc, done);
    json = meta_json(&po, tok, corpus, bos, done_bytes, &tr, &va);
    if (!json) { rc = mt_ctx_error(&ctx, MT_ERR_OOM, "out of memory writing meta.json"); goto done; }
    MT_CHECK_GOTO(commit(&ctx, out, &tr), rc, done);
    MT_CHECK_GOTO(commit(&ctx, out, &va), rc, done);
    wrote = 0;
    {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.bin", out);
        MT_CHECK_GOTO(mt_tok_save(&ctx, tok, path), rc, done);
        snprintf(path, sizeof path, "%s/meta.json", out);
        MT_CHECK_GOTO(write_text(&ctx, path, json), rc, done);
    }
    fprintf(stderr, "prepare: %llu train tokens in %d shard(s), %llu val tokens in %d shard(s) (%d docs), %.1f s\n",
            (unsigned long long)tr.tokens, tr.n_shards, (unsigned long long)va.tokens, va.n_shards, va.docs,
            mt_time_sec() - t0);
done:
    if (wrote) { remove_new(out, &tr); remove_new(out, &va); }
    if (rc != MT_OK) fprintf(stderr, "meshtrain prepare: %s\n", mt_ctx_last_error(&ctx));
    free(json);
    mt_tok_ids_free(&ctx, &ids);
    mt_free(&ctx, tr.buf);
    mt_free(&ctx, va.buf);
    mt_tok_corpus_destroy(&ctx, corpus);
    mt_tok_destroy(&ctx, tok);
    mt_ctx_free(&ctx);
    return rc == MT_OK ? 0 : mt_status_exit_code(rc);
}
