/*
 * test_tok.c — the BPE tokenizer: pre-tokenizer splits, hand-computed
 * merges, deterministic training, exact round trips on odd bytes, file
 * format errors (version, truncation, corruption) and vocab bounds.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tok/mt_tok.h"
#include "mt_test.h"

static uint64_t rng_state = 0x1234;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Split text and compare with the expected chunks (NULL-terminated). */
static void check_split(const char *text, const char *const *want)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t n = strlen(text), i = 0, k = 0;
    while (i < n) {
        size_t j = mt_tok_pretok_next(s, n, i);
        if (!want[k]) { EXPECT(0, "split of \"%s\": extra chunk \"%.*s\"", text, (int)(j - i), text + i); return; }
        EXPECT(j - i == strlen(want[k]) && !memcmp(s + i, want[k], j - i),
               "split of \"%s\": chunk %zu is \"%.*s\", want \"%s\"", text, k, (int)(j - i), text + i, want[k]);
        i = j;
        k++;
    }
    EXPECT(want[k] == NULL, "split of \"%s\": missing chunk \"%s\"", text, want[k]);
}

static void test_pretok(void)
{
    check_split("Hello world", (const char *[]){"Hello", " world", NULL});
    check_split("12345", (const char *[]){"123", "45", NULL});
    check_split("x1234567y", (const char *[]){"x", "123", "456", "7", "y", NULL});
    check_split("x = a+b;;  // ok\n\n  y",
                (const char *[]){"x", " =", " a", "+b", ";;", " ", " //", " ok", "\n\n", " ", " y", NULL});
    check_split("it's DON'T we'll", (const char *[]){"it", "'s", " DON", "'T", " we", "'ll", NULL});
    check_split("h\xc3\xa9llo w\xc3\xb6rld", (const char *[]){"h\xc3\xa9llo", " w\xc3\xb6rld", NULL});
    check_split("a   ", (const char *[]){"a", "   ", NULL});
    check_split("foo\r\n", (const char *[]){"foo", "\r\n", NULL});
    check_split("});\nint", (const char *[]){"});\n", "int", NULL});
    check_split("\xff\xfe" "abc", (const char *[]){"\xff\xfe", "abc", NULL});
    check_split("\t\tx", (const char *[]){"\t", "\tx", NULL});
    check_split("...!!!", (const char *[]){"...!!!", NULL});
    check_split(" 42", (const char *[]){" ", "42", NULL});
}

static struct mt_tok *train_text(struct mt_ctx *ctx, const char *const *texts, const size_t *lens, int n, int vocab)
{
    struct mt_tok_trainer *tr;
    if (mt_tok_trainer_create(ctx, &tr) != MT_OK) return NULL;
    for (int i = 0; i < n; i++)
        if (mt_tok_trainer_add(ctx, tr, (const uint8_t *)texts[i], lens ? lens[i] : strlen(texts[i])) != MT_OK) {
            mt_tok_trainer_destroy(ctx, tr);
            return NULL;
        }
    struct mt_tok *tok = NULL;
    enum mt_status rc = mt_tok_trainer_run(ctx, tr, vocab, NULL, &tok);
    EXPECT(rc == MT_OK, "train: %s", mt_ctx_last_error(ctx));
    mt_tok_trainer_destroy(ctx, tr);
    return tok;
}

static void expect_merges(const struct mt_tok *tok, const uint32_t *want, int n, const char *what)
{
    EXPECT(mt_tok_n_merges(tok) == n, "%s: %d merges, want %d", what, mt_tok_n_merges(tok), n);
    for (int i = 0; i < n && i < mt_tok_n_merges(tok); i++) {
        uint32_t a, b;
        mt_tok_merge(tok, i, &a, &b);
        EXPECT(a == want[2 * i] && b == want[2 * i + 1], "%s: merge %d is (%u,%u), want (%u,%u)", what, i, a, b,
               want[2 * i], want[2 * i + 1]);
    }
}

static void test_known_merges(struct mt_ctx *ctx)
{
    /* "aaabdaaabac" (one chunk): pairs aa:4 ab:2 bd da ba ac:1.
     *  1. (a,a)=4 -> 256: Z a b d Z a b a c; now (Z,a)=2 and (a,b)=2 tie:
     *  2. smaller ids win: (a,b)=(97,98) -> 257: Z Y d Z Y a c
     *  3. (Z,Y)=(256,257)=2 -> 258: X d X a c */
    const char *t1[] = {"aaabdaaabac"};
    struct mt_tok *tok = train_text(ctx, t1, NULL, 1, 256 + 3 + MT_TOK_N_SPECIAL);
    EXPECT(tok != NULL, "train tiny");
    if (!tok) return;
    const uint32_t want1[] = {97, 97, 97, 98, 256, 257};
    expect_merges(tok, want1, 3, "aaabdaaabac");
    EXPECT(mt_tok_vocab_size(tok) == 260 && mt_tok_bos_id(tok) == 259, "vocab %d bos %d", mt_tok_vocab_size(tok),
           mt_tok_bos_id(tok));
    struct mt_tok_ids ids = {0};
    EXPECT(mt_tok_encode(ctx, tok, (const uint8_t *)"aaabdaaabac", 11, &ids) == MT_OK, "encode");
    const uint32_t want_ids[] = {258, 100, 258, 97, 99};
    EXPECT(ids.n == 5 && !memcmp(ids.ids, want_ids, sizeof want_ids), "encode gave %zu ids", ids.n);
    mt_tok_ids_free(ctx, &ids);
    mt_tok_destroy(ctx, tok);

    /* "ab ab ab cd" -> chunks "ab", " ab" x2, " cd": merges never cross chunks.
     *  (a,b)=3 -> 256; then (' ',256)=2 -> 257; then (' ',c)=1 and (c,d)=1 tie:
     *  (32,99) < (99,100) -> 258. */
    const char *t2[] = {"ab ab ab cd"};
    tok = train_text(ctx, t2, NULL, 1, 256 + 3 + MT_TOK_N_SPECIAL);
    EXPECT(tok != NULL, "train tiny 2");
    if (!tok) return;
    const uint32_t want2[] = {97, 98, 32, 256, 32, 99};
    expect_merges(tok, want2, 3, "ab ab ab cd");
    mt_tok_destroy(ctx, tok);

    /* the corpus runs out of pairs: "ab" supports one merge only */
    const char *t3[] = {"ab"};
    tok = train_text(ctx, t3, NULL, 1, 1000);
    EXPECT(tok && mt_tok_n_merges(tok) == 1 && mt_tok_vocab_size(tok) == 258, "early stop");
    mt_tok_destroy(ctx, tok);
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void roundtrip(struct mt_ctx *ctx, struct mt_tok *tok, const uint8_t *s, size_t n, const char *what)
{
    struct mt_tok_ids ids = {0};
    EXPECT(mt_tok_encode(ctx, tok, s, n, &ids) == MT_OK, "%s: encode: %s", what, mt_ctx_last_error(ctx));
    uint8_t *back = NULL;
    size_t m = 0;
    EXPECT(mt_tok_decode(ctx, tok, ids.ids, ids.n, &back, &m) == MT_OK, "%s: decode", what);
    EXPECT(m == n && (n == 0 || !memcmp(back, s, n)), "%s: round trip differs (%zu -> %zu ids -> %zu bytes)", what,
           n, ids.n, m);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] == (uint32_t)mt_tok_bos_id(tok)) { EXPECT(0, "%s: encode produced bos", what); break; }
    mt_free(ctx, back);
    mt_tok_ids_free(ctx, &ids);
}

static const char *HEADER = "/usr/include/stdio.h";

static void test_roundtrip_and_determinism(struct mt_ctx *ctx)
{
    size_t hn = 0;
    uint8_t *hdr = read_file(HEADER, &hn);
    EXPECT(hdr != NULL, "cannot read %s", HEADER);
    if (!hdr) return;
    const char *texts[] = {(const char *)hdr};
    size_t lens[] = {hn};
    struct mt_tok *a = train_text(ctx, texts, lens, 1, 600);
    struct mt_tok *b = train_text(ctx, texts, lens, 1, 600);
    EXPECT(a && b, "train on %s", HEADER);
    if (!a || !b) { free(hdr); return; }
    EXPECT(mt_tok_n_merges(a) == 600 - 257, "merges %d", mt_tok_n_merges(a));
    uint8_t *ia, *ib;
    size_t la, lb;
    EXPECT(mt_tok_serialize(ctx, a, &ia, &la) == MT_OK && mt_tok_serialize(ctx, b, &ib, &lb) == MT_OK, "serialize");
    EXPECT(la == lb && !memcmp(ia, ib, la), "training twice gave different files");
    EXPECT(mt_tok_hash(a) == mt_tok_hash(b), "hash");
    mt_free(ctx, ib);

    /* real file: round trip, and compresses */
    struct mt_tok_ids ids = {0};
    mt_tok_encode(ctx, a, hdr, hn, &ids);
    EXPECT(ids.n < hn / 2, "%s: %zu bytes -> %zu tokens, expected < half", HEADER, hn, ids.n);
    mt_tok_ids_free(ctx, &ids);
    roundtrip(ctx, a, hdr, hn, "stdio.h");

    /* random bytes: NUL, invalid UTF-8, everything */
    size_t rn = 200000;
    uint8_t *r = malloc(rn);
    for (size_t i = 0; i < rn; i++) r[i] = (uint8_t)rnd();
    roundtrip(ctx, a, r, rn, "random bytes");
    /* random mix of header snippets, NULs and high bytes */
    for (size_t i = 0; i < rn; i++) {
        uint64_t x = rnd();
        r[i] = (x & 7) == 0 ? (uint8_t)(x >> 8) : (x & 7) == 1 ? 0 : hdr[(x >> 16) % hn];
    }
    roundtrip(ctx, a, r, rn, "mixed bytes");
    /* 100 KB single lines */
    memset(r, 'a', 100000);
    roundtrip(ctx, a, r, 100000, "100 KB of 'a'");
    for (size_t i = 0; i < 100000; i++) r[i] = hdr[i % hn] == '\n' ? ' ' : hdr[i % hn];
    roundtrip(ctx, a, r, 100000, "100 KB line");
    roundtrip(ctx, a, r, 0, "empty");
    roundtrip(ctx, a, (const uint8_t *)"<|bos|>", 7, "bos text");

    /* the heap encoder agrees with the quadratic reference */
    const char *chunks[] = {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                            " __attribute__", "#include", "                                        ",
                            "/*****************************************************************************"};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        struct mt_tok_ids x = {0}, y = {0};
        size_t n = strlen(chunks[c]);
        mt_tok_encode_chunk(ctx, a, (const uint8_t *)chunks[c], n, 1, &x);
        mt_tok_encode_chunk(ctx, a, (const uint8_t *)chunks[c], n, 2, &y);
        EXPECT(x.n == y.n && !memcmp(x.ids, y.ids, x.n * sizeof *x.ids), "heap != naive on chunk %zu", c);
        mt_tok_ids_free(ctx, &x);
        mt_tok_ids_free(ctx, &y);
    }
    for (int rep = 0; rep < 200; rep++) {  /* random chunks of header bytes */
        size_t off = rnd() % hn, n = 2 + rnd() % 300;
        if (off + n > hn) continue;
        struct mt_tok_ids x = {0}, y = {0};
        mt_tok_encode_chunk(ctx, a, hdr + off, n, 1, &x);
        mt_tok_encode_chunk(ctx, a, hdr + off, n, 2, &y);
        EXPECT(x.n == y.n && !memcmp(x.ids, y.ids, x.n * sizeof *x.ids), "heap != naive at %zu+%zu", off, n);
        mt_tok_ids_free(ctx, &x);
        mt_tok_ids_free(ctx, &y);
    }

    /* decode rejects ids outside the vocab */
    uint32_t bad[2] = {65, 600};
    uint8_t *txt;
    size_t tl;
    EXPECT(mt_tok_decode(ctx, a, bad, 2, &txt, &tl) == MT_ERR_INVALID_ARG, "decode out-of-range id");

    /* file format: save/load, truncation, version, corruption */
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_tok_%ld.bin", (long)getpid());
    EXPECT(mt_tok_save(ctx, a, path) == MT_OK, "save: %s", mt_ctx_last_error(ctx));
    struct mt_tok *c = NULL;
    EXPECT(mt_tok_load(ctx, path, &c) == MT_OK, "load: %s", mt_ctx_last_error(ctx));
    EXPECT(c && mt_tok_hash(c) == mt_tok_hash(a) && mt_tok_vocab_size(c) == 600, "load gives the same tokenizer");
    mt_tok_destroy(ctx, c);
    remove(path);
    EXPECT(mt_tok_load(ctx, path, &c) == MT_ERR_IO && c == NULL, "missing file -> IO");
    size_t cuts[] = {0, 4, 8, 11, 12, 31, 32, 100, la / 2, la - 9, la - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        enum mt_status st = mt_tok_deserialize(ctx, ia, cuts[k], &c);
        EXPECT(st == MT_ERR_FORMAT && c == NULL, "truncated at %zu gave %s", cuts[k], mt_status_str(st));
    }
    uint8_t *mod = malloc(la);
    memcpy(mod, ia, la);
    mod[8] = 2;  /* version 2 */
    EXPECT(mt_tok_deserialize(ctx, mod, la, &c) == MT_ERR_FORMAT && strstr(mt_ctx_last_error(ctx), "version"),
           "version 2: %s", mt_ctx_last_error(ctx));
    memcpy(mod, ia, la);
    mod[40] ^= 1;  /* a merge id */
    EXPECT(mt_tok_deserialize(ctx, mod, la, &c) == MT_ERR_FORMAT, "corrupt merge");
    memcpy(mod, ia, la);
    mod[0] = 'X';
    EXPECT(mt_tok_deserialize(ctx, mod, la, &c) == MT_ERR_FORMAT, "bad magic");
    EXPECT(mt_tok_deserialize(ctx, ia, la, &c) == MT_OK, "intact image loads");
    mt_tok_destroy(ctx, c);
    free(mod);
    mt_free(ctx, ia);
    free(r);
    free(hdr);
    mt_tok_destroy(ctx, a);
    mt_tok_destroy(ctx, b);
}

static void test_bounds(struct mt_ctx *ctx)
{
    struct mt_tok_trainer *tr;
    struct mt_tok *tok = NULL;
    mt_tok_trainer_create(ctx, &tr);
    EXPECT(mt_tok_trainer_run(ctx, tr, 1000, NULL, &tok) == MT_ERR_INVALID_ARG, "no text");
    mt_tok_trainer_destroy(ctx, tr);
    mt_tok_trainer_create(ctx, &tr);
    mt_tok_trainer_add(ctx, tr, (const uint8_t *)"hello hello", 11);
    EXPECT(mt_tok_trainer_run(ctx, tr, MT_TOK_MIN_VOCAB - 1, NULL, &tok) == MT_ERR_INVALID_ARG, "vocab 257");
    EXPECT(mt_tok_trainer_run(ctx, tr, 65537, NULL, &tok) == MT_ERR_INVALID_ARG, "vocab 65537");
    EXPECT(mt_tok_trainer_run(ctx, tr, MT_TOK_MIN_VOCAB, NULL, &tok) == MT_OK && tok, "vocab 258");
    EXPECT(tok && mt_tok_vocab_size(tok) == MT_TOK_MIN_VOCAB, "min vocab");
    mt_tok_destroy(ctx, tok);
    mt_tok_trainer_destroy(ctx, tr);
    /* allocation failure is an error, not a crash */
    for (long k = 1; k < 40; k += 3) {
        ctx->fail_after = k;
        mt_tok_trainer_create(ctx, &tr);
        if (tr) {
            mt_tok_trainer_add(ctx, tr, (const uint8_t *)"ab ab ab cd ef gh", 17);
            tok = NULL;
            enum mt_status st = mt_tok_trainer_run(ctx, tr, 270, NULL, &tok);
            EXPECT(st == MT_OK || st == MT_ERR_OOM || st == MT_ERR_INVALID_ARG, "fail_after %ld: %s", k,
                   mt_status_str(st));
            mt_tok_destroy(ctx, tok);
            mt_tok_trainer_destroy(ctx, tr);
        }
        ctx->fail_after = 0;
    }
}

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    test_pretok();
    test_known_merges(&ctx);
    test_roundtrip_and_determinism(&ctx);
    test_bounds(&ctx);
    EXPECT(ctx.bytes_live_total == 0, "%zu bytes leaked", ctx.bytes_live_total);
    mt_ctx_free(&ctx);
    if (n_fail) {
        fprintf(stderr, "test_tok: %d failure(s)\n", n_fail);
        return 1;
    }
    printf("test_tok: ok\n");
    return 0;
}
