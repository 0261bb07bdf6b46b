/*
 * cmd_tokenizer.c — `meshtrain tokenizer train|encode|decode`.
 *
 *   train  [--input PATH...] [--vocab N] --out FILE [--max-bytes N]
 *   encode --tokenizer FILE [--input F] [--output F] [--bos]
 *   decode --tokenizer FILE [--input F] [--output F]
 *
 * encode writes token ids as decimal numbers separated by spaces (one line);
 * decode reads whitespace-separated ids and writes the exact bytes. With no
 * --input, train uses the default corpus (MT_TOK_DEFAULT_CORPUS, capped at
 * MT_TOK_DEFAULT_MAX_BYTES) and encode/decode read stdin. Output files are
 * written to a temporary name and renamed. Exit codes: 0 ok, 2 bad input,
 * 1 runtime failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cmd.h"
#include "tok/mt_tok.h"
#include "core/mt_fileio.h"

#define MAX_INPUTS 4096

static int fail(struct mt_ctx *ctx, enum mt_status rc)
{
    fprintf(stderr, "meshtrain tokenizer: %s\n", mt_ctx_last_error(ctx));
    return mt_status_exit_code(rc);
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "meshtrain tokenizer: %s%s%s (see meshtrain tokenizer --help)\n", msg, arg ? " " : "",
            arg ? arg : "");
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain tokenizer train  [--input PATH...] [--vocab N] --out FILE [--max-bytes N]\n"
            "       meshtrain tokenizer encode --tokenizer FILE [--input F] [--output F] [--bos]\n"
            "       meshtrain tokenizer decode --tokenizer FILE [--input F] [--output F]\n"
            "train: byte-level BPE, vocab N in [%d, %d] (default 8192) = 256 bytes + merges + <|bos|>.\n"
            "  PATH: files or directories (recursed, sorted); binary files skipped. No --input:\n"
            "  the C/C++ headers under %s, capped at --max-bytes (default %llu).\n"
            "encode: text -> ids (decimal, space separated); decode: ids -> text. stdin/stdout by default.\n",
            MT_TOK_MIN_VOCAB, MT_TOK_MAX_VOCAB, MT_TOK_DEFAULT_CORPUS,
            (unsigned long long)MT_TOK_DEFAULT_MAX_BYTES);
}

static enum mt_status read_all(struct mt_ctx *ctx, const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    size_t n = 0, cap = 1 << 16;
    uint8_t *b = malloc(cap);
    enum mt_status rc = MT_OK;
    for (;;) {
        if (!b) { rc = mt_ctx_error(ctx, MT_ERR_OOM, "out of memory reading input"); break; }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n == cap) {
            cap *= 2;
            uint8_t *q = realloc(b, cap);
            if (!q) free(b);
            b = q;
        }
    }
    if (rc == MT_OK && ferror(f)) rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path ? path : "stdin", strerror(errno));
    if (path) fclose(f);
    if (rc != MT_OK) { free(b); return rc; }
    *buf = b;
    *len = n;
    return MT_OK;
}

/* Open the output: stdout, or an atomic replace of path (mt_file_atomic,
 * committed by finish_out). */
static FILE *open_out(struct mt_ctx *ctx, const char *path, struct mt_file_atomic *a)
{
    if (!path) return stdout;
    return mt_file_atomic_open(ctx, a, path, 0, MT_ERR_IO) == MT_OK ? a->f : NULL;
}

/* ok = 0: the command failed, the file is left as it was. */
static enum mt_status finish_out(struct mt_ctx *ctx, const char *path, struct mt_file_atomic *a, int ok)
{
    if (!path) {
        if (fflush(stdout) != 0) return mt_ctx_error(ctx, MT_ERR_IO, "cannot write stdout: %s", strerror(errno));
        return MT_OK;
    }
    if (!ok) { mt_file_atomic_discard(a); return MT_OK; }
    return mt_file_atomic_commit(ctx, a, 1);
}

static int cmd_train(int argc, char **argv)
{
    const char *inputs[MAX_INPUTS];
    int n_inputs = 0, vocab = 8192;
    long long max_bytes = -1;
    const char *out = NULL;
    static const char *const valued[] = {"--input", "--vocab", "--out", "--max-bytes", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (mt_cmd_option("tokenizer", NULL, valued, argc, argv, i) < 0) return 2;
        if (!strcmp(a, "--input")) {
            if (argv[i + 1][0] == '-') return usage_error("--input needs a path", NULL);
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (n_inputs == MAX_INPUTS) return usage_error("too many --input paths", NULL);
                inputs[n_inputs++] = argv[++i];
            }
        } else if (!strcmp(a, "--vocab")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i]) return usage_error("bad --vocab", argv[i]);
            if (v < MT_TOK_MIN_VOCAB || v > MT_TOK_MAX_VOCAB) {
                fprintf(stderr, "meshtrain tokenizer: --vocab %ld out of range [%d, %d] (256 bytes + %d special + >= 1 merge)\n",
                        v, MT_TOK_MIN_VOCAB, MT_TOK_MAX_VOCAB, MT_TOK_N_SPECIAL);
                return 2;
            }
            vocab = (int)v;
        } else if (!strcmp(a, "--out")) {
            out = argv[++i];
        } else {   /* --max-bytes */
            max_bytes = mt_cmd_size_arg("tokenizer", argv[++i]);
            if (max_bytes < 0) return 2;   /* mt_cmd_size_arg said why */
        }
    }
    if (!out) return usage_error("train needs --out FILE", NULL);
    mt_cmd_corpus_inputs(inputs, &n_inputs, &max_bytes);

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_tok_corpus *corpus = NULL;
    struct mt_tok_trainer *tr = NULL;
    struct mt_tok *tok = NULL;
    enum mt_status rc;
    double t0 = mt_time_sec();
    MT_CHECK_GOTO(mt_tok_corpus_gather(&ctx, inputs, n_inputs, (uint64_t)max_bytes, &corpus), rc, done);
    fprintf(stderr, "tokenizer: %d files, %llu bytes (%d binary skipped%s)\n", corpus->n_files,
            (unsigned long long)corpus->total_bytes, corpus->n_binary, corpus->truncated ? ", capped" : "");
    MT_CHECK_GOTO(mt_tok_trainer_create(&ctx, &tr), rc, done);
    for (int i = 0; i < corpus->n_files; i++) {
        uint8_t *buf;
        size_t len;
        MT_CHECK_GOTO(mt_tok_corpus_read(&ctx, corpus, i, &buf, &len), rc, done);
        rc = mt_tok_trainer_add(&ctx, tr, buf, len);
        mt_free(&ctx, buf);
        if (rc != MT_OK) goto done;
    }
    fprintf(stderr, "tokenizer: pre-tokenized in %.1f s\n", mt_time_sec() - t0);
    MT_CHECK_GOTO(mt_tok_trainer_run(&ctx, tr, vocab, stderr, &tok), rc, done);
    MT_CHECK_GOTO(mt_tok_save(&ctx, tok, out), rc, done);
    fprintf(stderr, "tokenizer: wrote %s (vocab %d, bos %d, hash %016llx) in %.1f s\n", out, mt_tok_vocab_size(tok),
            mt_tok_bos_id(tok), (unsigned long long)mt_tok_hash(tok), mt_time_sec() - t0);
done:
    mt_tok_destroy(&ctx, tok);
    mt_tok_trainer_destroy(&ctx, tr);
    mt_tok_corpus_destroy(&ctx, corpus);
    int code = rc == MT_OK ? 0 : fail(&ctx, rc);
    mt_ctx_free(&ctx);
    return code;
}

static int cmd_codec(int argc, char **argv, int encode)
{
    const char *tok_path = NULL, *in = NULL, *out = NULL;
    int bos = 0;
    static const char *const valued[] = {"--tokenizer", "--input", "--output", NULL};
    static const char *const enc_flags[] = {"--bos", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        const int kind = mt_cmd_option("tokenizer", encode ? enc_flags : NULL, valued, argc, argv, i);
        if (kind < 0) return 2;
        if (kind == 0) { bos = 1; continue; }   /* --bos (encode) */
        if (!strcmp(a, "--tokenizer")) tok_path = argv[i + 1];
        else if (!strcmp(a, "--input")) in = argv[i + 1];
        else out = argv[i + 1];   /* --output */
        i++;
    }
    if (!tok_path) return usage_error(encode ? "encode needs --tokenizer FILE" : "decode needs --tokenizer FILE", NULL);
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_tok *tok = NULL;
    uint8_t *text = NULL, *dec = NULL;
    size_t n = 0;
    struct mt_tok_ids ids = {0};
    FILE *f = NULL;
    struct mt_file_atomic atom;
    enum mt_status rc;
    MT_CHECK_GOTO(mt_tok_load(&ctx, tok_path, &tok), rc, done);
    MT_CHECK_GOTO(read_all(&ctx, in, &text, &n), rc, done);
    if (encode) {
        struct mt_tok_ids body = {0};
        MT_CHECK_GOTO(mt_tok_encode(&ctx, tok, text, n, &body), rc, done);
        f = open_out(&ctx, out, &atom);
        if (!f) { mt_tok_ids_free(&ctx, &body); rc = MT_ERR_IO; goto done; }
        if (bos) fprintf(f, "%d%s", mt_tok_bos_id(tok), body.n ? " " : "");
        for (size_t i = 0; i < body.n; i++) fprintf(f, i ? " %u" : "%u", body.ids[i]);
        fputc('\n', f);
        mt_tok_ids_free(&ctx, &body);
    } else {
        size_t cap = 0, i = 0;
        while (i < n) {
            while (i < n && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) i++;
            if (i == n) break;
            if (text[i] < '0' || text[i] > '9') {
                rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "decode: not a token id at byte %zu of the input", i);
                goto done;
            }
            uint64_t v = 0;
            while (i < n && text[i] >= '0' && text[i] <= '9' && v <= UINT32_MAX) v = v * 10 + (text[i++] - '0');
            if (v >= (uint64_t)mt_tok_vocab_size(tok)) {
                rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "decode: token id %llu (id #%zu) is outside the vocabulary (%d)",
                                  (unsigned long long)v, ids.n, mt_tok_vocab_size(tok));
                goto done;
            }
            if (ids.n == cap) {
                cap = cap ? 2 * cap : 1024;
                uint32_t *q = mt_alloc(&ctx, cap * sizeof(uint32_t), MT_BUCKET_OTHER);
                if (!q) { rc = MT_ERR_OOM; goto done; }
                if (ids.ids) memcpy(q, ids.ids, ids.n * sizeof(uint32_t));
                mt_free(&ctx, ids.ids);
                ids.ids = q;
            }
            ids.ids[ids.n++] = (uint32_t)v;
        }
        size_t m;
        MT_CHECK_GOTO(mt_tok_decode(&ctx, tok, ids.ids, ids.n, &dec, &m), rc, done);
        f = open_out(&ctx, out, &atom);
        if (!f) { rc = MT_ERR_IO; goto done; }
        fwrite(dec, 1, m, f);
    }
    rc = finish_out(&ctx, out, &atom, 1);
    f = NULL;
done:
    if (f) finish_out(&ctx, out, &atom, 0);
    mt_free(&ctx, ids.ids);
    mt_free(&ctx, dec);
    free(text);
    mt_tok_destroy(&ctx, tok);
    int code = rc == MT_OK ? 0 : fail(&ctx, rc);
    mt_ctx_free(&ctx);
    return code;
}

int mt_cmd_tokenizer(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "encode")) return cmd_codec(argc - 1, argv + 1, 1);
    if (!strcmp(argv[1], "decode")) return cmd_codec(argc - 1, argv + 1, 0);
    return usage_error("unknown subcommand", argv[1]);
}
