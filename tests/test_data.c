/*
 * test_data.c — llm.c shards: write, open (file / dir / glob / split), the
 * batch-order formula across file boundaries, and every bad-shard error.
 * Exits non-zero on failure.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/mt_data.h"
#include "mt_test.h"


static char dir[64];

static const char *pathf(const char *name)
{
    static char buf[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* raw file writer for malformed shards */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count, const uint16_t *tok, size_t n)
{
    int32_t h[256] = {0};
    h[0] = magic, h[1] = version, h[2] = count;
    FILE *f = fopen(path, "wb");
    fwrite(h, sizeof h, 1, f);
    if (n) fwrite(tok, 2, n, f);
    fclose(f);
}

/* Reference: the formula on one flat array. */
static void ref_sequence(const uint16_t *all, size_t N, int64_t s, int G, int64_t i, int T, int32_t *inp,
                         int32_t *tgt)
{
    size_t o = (size_t)(((uint64_t)(s * G + i) * (uint64_t)T) % (N - (size_t)T - 1));
    for (int k = 0; k < T; k++) inp[k] = all[o + (size_t)k], tgt[k] = all[o + (size_t)k + 1];
}

/* tokens all[o..o+T) as int32 (static buffer) */
static const int32_t *rinp_of(const uint16_t *all, int o, int T)
{
    static int32_t b[64];
    for (int k = 0; k < T; k++) b[k] = all[o + k];
    return b;
}

static void test_stream(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    /* three shards in name order (written out of order), sizes 37, 0, 23, 5 */
    enum { N0 = 37, N2 = 23, N3 = 5, N = N0 + N2 + N3, V = 1000 };
    uint16_t all[N];
    for (int k = 0; k < N; k++) all[k] = (uint16_t)((k * 7919 + 13) % V);
    EXPECT(mt_data_write_shard(&ctx, pathf("d_03.bin"), all + N0 + N2, N3) == MT_OK);
    EXPECT(mt_data_write_shard(&ctx, pathf("d_00.bin"), all, N0) == MT_OK);
    EXPECT(mt_data_write_shard(&ctx, pathf("d_01.bin"), NULL, 0) == MT_OK);
    EXPECT(mt_data_write_shard(&ctx, pathf("d_02.bin"), all + N0, N2) == MT_OK);
    /* a val shard and a non-.bin file that the train split must skip */
    uint16_t val[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    EXPECT(mt_data_write_shard(&ctx, pathf("d_val_00.bin"), val, 10) == MT_OK);
    FILE *f = fopen(pathf("notes.txt"), "w");
    fputs("hello", f);
    fclose(f);

    struct mt_data *d = NULL;
    int T = 8;
    EXPECT(mt_data_open(&ctx, dir, "train", V, T, &d) == MT_OK);
    EXPECT(mt_data_nfiles(d) == 4 && mt_data_ntokens(d) == N);
    int mx = 0;
    for (int k = 0; k < N; k++) mx = all[k] > mx ? all[k] : mx;
    EXPECT(mt_data_max_token(d) == mx);

    int32_t inp[64], tgt[64], rinp[64], rtgt[64];
    int straddles = 0;
    for (int64_t s = 0; s < 40; s++)
        for (int i = 0; i < 3; i++) {
            mt_data_sequence(d, s, 3, i, T, inp, tgt);
            ref_sequence(all, N, s, 3, i, T, rinp, rtgt);
            EXPECT(!memcmp(inp, rinp, sizeof(int32_t) * (size_t)T) && !memcmp(tgt, rtgt, sizeof(int32_t) * (size_t)T));
            size_t o = (size_t)(((uint64_t)(s * 3 + i) * (uint64_t)T) % (N - (size_t)T - 1));
            straddles += (o < N0 && o + (size_t)T >= N0) || (o < N0 + N2 && o + (size_t)T >= N0 + N2);
        }
    EXPECT(straddles >= 3); /* the loop really crossed file boundaries */
    /* every offset, T = 1 .. 20, including the last valid one */
    for (int t = 1; t <= 20; t++)
        for (int64_t i = 0; i < N; i++) {
            mt_data_sequence(d, 0, 1, i, t, inp, tgt);
            ref_sequence(all, N, 0, 1, i, t, rinp, rtgt);
            EXPECT(!memcmp(inp, rinp, sizeof(int32_t) * (size_t)t) && !memcmp(tgt, rtgt, sizeof(int32_t) * (size_t)t));
        }
    /* huge step: no overflow (reference in 128 bits) */
    {
        int64_t s = (int64_t)1 << 60;
        mt_data_sequence(d, s, 7, 5, T, inp, tgt);
        unsigned __int128 a = (unsigned __int128)s * 7 + 5;
        size_t o = (size_t)((a * (unsigned)T) % (N - T - 1));
        EXPECT(inp[0] == all[o] && tgt[T - 1] == all[o + (size_t)T]);
    }
    mt_data_close(d);
    /* shuffled order: each epoch reads each of the W = (N-1)/T windows once,
     * the order depends on the seed, and it is a pure function of (step, i):
     * a split of the batch over ranks reads the same sequences */
    EXPECT(mt_data_open(&ctx, dir, "train", V, T, &d) == MT_OK);
    mt_data_set_order(d, 1, 42);
    {
        enum { W = (N - 1) / 8 };
        int seen[W] = {0}, firsts[2][W];
        for (int e = 0; e < 2; e++) {
            memset(seen, 0, sizeof seen);
            for (int j = 0; j < W; j++) {
                mt_data_sequence(d, e * W + j, 1, 0, T, inp, tgt);
                int w = -1;
                for (int c = 0; c < W; c++)
                    if (!memcmp(inp, rinp_of(all, c * T, T), sizeof(int32_t) * (size_t)T)) w = c;
                EXPECT(w >= 0);
                if (w >= 0) seen[w]++;
                firsts[e][j] = w;
                EXPECT(tgt[T - 1] == (int32_t)all[w * T + T]);
            }
            for (int c = 0; c < W; c++) EXPECT(seen[c] == 1);
        }
        EXPECT(memcmp(firsts[0], firsts[1], sizeof firsts[0]) != 0);   /* a new order each epoch */
        int inp2[64], tgt2[64];
        mt_data_sequence(d, 3, 4, 2, T, inp, tgt);      /* step 3, G=4, sequence 2 ... */
        mt_data_sequence(d, 0, 1, 14, T, inp2, tgt2);   /* ... is global sequence 14 */
        EXPECT(!memcmp(inp, inp2, sizeof(int32_t) * (size_t)T));
        mt_data_set_order(d, 1, 43);
        mt_data_sequence(d, 0, 1, 0, T, inp2, tgt2);
        int differs = memcmp(inp, inp2, sizeof(int32_t) * (size_t)T) != 0;
        for (int j = 1; j < W && !differs; j++) {
            mt_data_set_order(d, 1, 42);
            mt_data_sequence(d, 0, 1, j, T, inp, tgt);
            mt_data_set_order(d, 1, 43);
            mt_data_sequence(d, 0, 1, j, T, inp2, tgt2);
            differs = memcmp(inp, inp2, sizeof(int32_t) * (size_t)T) != 0;
        }
        EXPECT(differs);   /* the seed matters */
    }
    mt_data_close(d);


    /* split val, NULL = all, a single file, a glob */
    EXPECT(mt_data_open(&ctx, dir, "val", V, T, &d) == MT_OK);
    EXPECT(mt_data_nfiles(d) == 1 && mt_data_ntokens(d) == 10);
    mt_data_sequence(d, 0, 1, 0, T, inp, tgt);
    EXPECT(inp[0] == 1 && tgt[0] == 2 && tgt[T - 1] == 9);
    mt_data_close(d);
    EXPECT(mt_data_open(&ctx, dir, NULL, V, T, &d) == MT_OK);
    EXPECT(mt_data_nfiles(d) == 5 && mt_data_ntokens(d) == N + 10);
    mt_data_close(d);
    EXPECT(mt_data_open(&ctx, pathf("d_02.bin"), "train", V, T, &d) == MT_OK);
    EXPECT(mt_data_nfiles(d) == 1 && mt_data_ntokens(d) == N2);
    mt_data_close(d);
    EXPECT(mt_data_open(&ctx, pathf("d_0[23].bin"), NULL, V, T, &d) == MT_OK);
    EXPECT(mt_data_nfiles(d) == 2 && mt_data_ntokens(d) == N2 + N3);
    mt_data_sequence(d, 0, 1, 0, T, inp, tgt);
    EXPECT(inp[0] == all[N0]);
    mt_data_close(d);

    /* vocab_size 0 = unchecked; exact vocab bound is fine */
    EXPECT(mt_data_open(&ctx, dir, "train", 0, T, &d) == MT_OK);
    mt_data_close(d);
    EXPECT(mt_data_open(&ctx, dir, "train", mx + 1, T, &d) == MT_OK);
    mt_data_close(d);
    EXPECT_ERR(mt_data_open(&ctx, dir, "train", mx, T, &d), MT_ERR_INVALID_ARG, "vocab_size");
    EXPECT(d == NULL);

    /* too short a stream for T */
    EXPECT_ERR(mt_data_open(&ctx, dir, "train", V, N - 1, &d), MT_ERR_INVALID_ARG, "seq_len");
    EXPECT(mt_data_open(&ctx, dir, "train", V, N - 2, &d) == MT_OK); /* N == T + 2: one sequence */
    mt_data_sequence(d, 5, 2, 1, N - 2, inp, tgt);
    EXPECT(inp[0] == all[0] && tgt[N - 3] == all[N - 2]);
    mt_data_close(d);

    mt_ctx_free(&ctx);
}

static void test_bad(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_data *d = (struct mt_data *)1;
    uint16_t tok[300];
    for (int k = 0; k < 300; k++) tok[k] = (uint16_t)k;

    write_raw(pathf("bad_magic.bin"), 20240521, 1, 300, tok, 300);
    EXPECT_ERR(mt_data_open(&ctx, pathf("bad_magic.bin"), NULL, 1000, 8, &d), MT_ERR_FORMAT, "bad_magic.bin");
    EXPECT(strstr(mt_ctx_last_error(&ctx), "20240521") != NULL);
    EXPECT(d == NULL);

    write_raw(pathf("bad_version.bin"), 20240520, 2, 300, tok, 300);
    EXPECT_ERR(mt_data_open(&ctx, pathf("bad_version.bin"), NULL, 1000, 8, &d), MT_ERR_FORMAT, "version 2");

    write_raw(pathf("bad_count.bin"), 20240520, 1, 301, tok, 300);
    EXPECT_ERR(mt_data_open(&ctx, pathf("bad_count.bin"), NULL, 1000, 8, &d), MT_ERR_FORMAT, "301");
    EXPECT(strstr(mt_ctx_last_error(&ctx), "1624") != NULL); /* the file size */

    write_raw(pathf("neg_count.bin"), 20240520, 1, -5, tok, 0);
    EXPECT_ERR(mt_data_open(&ctx, pathf("neg_count.bin"), NULL, 1000, 8, &d), MT_ERR_FORMAT, "neg_count.bin");

    FILE *f = fopen(pathf("short.bin"), "wb");
    fwrite(tok, 2, 10, f);
    fclose(f);
    EXPECT_ERR(mt_data_open(&ctx, pathf("short.bin"), NULL, 1000, 8, &d), MT_ERR_FORMAT, "short.bin");

    tok[123] = 9000;
    EXPECT(mt_data_write_shard(&ctx, pathf("big_tok.bin"), tok, 300) == MT_OK);
    EXPECT_ERR(mt_data_open(&ctx, pathf("big_tok.bin"), NULL, 8192, 8, &d), MT_ERR_INVALID_ARG,
               "token 9000 >= vocab_size 8192 at position 123 of");
    EXPECT(strstr(mt_ctx_last_error(&ctx), "big_tok.bin") != NULL);
    /* the same file is fine with a larger vocab, and max_token reports it */
    EXPECT(mt_data_open(&ctx, pathf("big_tok.bin"), NULL, 9001, 8, &d) == MT_OK);
    EXPECT(mt_data_max_token(d) == 9000);
    mt_data_close(d);

    /* a directory where one shard is bad fails as a whole */
    EXPECT_ERR(mt_data_open(&ctx, dir, NULL, 1000, 8, &d), MT_ERR_FORMAT, NULL);

    EXPECT_ERR(mt_data_open(&ctx, pathf("missing.bin"), NULL, 1000, 8, &d), MT_ERR_IO, "missing.bin");
    EXPECT_ERR(mt_data_open(&ctx, pathf("nomatch_*.bin"), NULL, 1000, 8, &d), MT_ERR_IO, "nomatch_");

    char empty[300];
    snprintf(empty, sizeof empty, "%s/emptydir", dir);
    mkdir(empty, 0700);
    EXPECT_ERR(mt_data_open(&ctx, empty, "train", 1000, 8, &d), MT_ERR_IO, "emptydir");
    /* a dir with only a val shard is empty for "train" */
    uint16_t v[20] = {0};
    char vp[320];
    snprintf(vp, sizeof vp, "%s/val.bin", empty);
    EXPECT(mt_data_write_shard(&ctx, vp, v, 20) == MT_OK);
    EXPECT_ERR(mt_data_open(&ctx, empty, "train", 1000, 8, &d), MT_ERR_IO, "split train");
    EXPECT(mt_data_open(&ctx, empty, "val", 1000, 8, &d) == MT_OK);
    mt_data_close(d);
    unlink(vp);
    rmdir(empty);

    /* no temporary left behind by write_shard; unwritable target is IO */
    EXPECT(access(pathf("big_tok.bin.tmp"), F_OK) != 0);
    EXPECT_ERR(mt_data_write_shard(&ctx, pathf("no/such/dir/x.bin"), tok, 3), MT_ERR_IO, "x.bin");
    mt_data_close(NULL);
    mt_ctx_free(&ctx);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/mt_test_data_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_stream();
    test_bad();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    if (n_fail) {
        fprintf(stderr, "test_data: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_data: ok\n");
    return 0;
}
