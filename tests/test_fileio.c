/*
 * test_fileio.c — the shared file helpers (src/core/fileio.c) and the one
 * size parser (mt_size_parse in src/core/core.c):
 *   1. sizes: binary units are powers of 2^10, decimal ones of 10^3, a plain
 *      number is bytes; a bare K/M/G/T is refused and the reason names both
 *      spellings; garbage, negative numbers and unknown units are refused;
 *   2. mkdir_p makes nested directories, accepts an existing one and refuses
 *      a path through a regular file; rm_rf removes a tree and accepts a
 *      missing path;
 *   3. pwrite_all / pread_all round-trip at an offset; a read past the end
 *      fails (short file);
 *   4. read_text: the content; a file over the cap, a directory and a file
 *      with a NUL byte are MT_ERR_FORMAT, a missing file MT_ERR_IO;
 *   5. copy: the bytes arrive; dir_of gives the parent or the directory;
 *   6. atomic replace: a new file and a replaced one hold exactly the new
 *      bytes and no PATH.tmp is left; a failed writer (ok = 0) and a rename
 *      onto a directory leave the old content, no PATH.tmp, and return the
 *      caller's error code; discard leaves the old content;
 *   7. the error record (src/core/core.c): mt_ctx_error records the caller's
 *      file:line (path from tests/ or src/ on: no checkout prefix), shown as
 *      a " [file:line]" suffix only when err_show_where is set; a raised
 *      error inside the library names the library's file; clear forgets it.
 * Exits non-zero on failure.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mt_core.h"
#include "core/mt_fileio.h"
#include "mt_test.h"

static void test_sizes(void)
{
    static const struct { const char *s; double v; } ok[] = {
        {"0", 0}, {"123", 123}, {"8e10", 8e10}, {"5B", 5}, {"1KiB", 1024}, {"2MiB", 2097152},
        {"80GiB", 80.0 * 1073741824.0}, {"1.5TiB", 1.5 * 1099511627776.0}, {"1kB", 1e3}, {"1KB", 1e3},
        {"3MB", 3e6}, {"80GB", 80e9}, {"2TB", 2e12}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        double v = -1;
        char why[200];
        int r = mt_size_parse(ok[i].s, &v, why, sizeof why);
        EXPECT(r == 0 && v == ok[i].v, "'%s' -> r=%d v=%.17g (want %.17g) %s", ok[i].s, r, v, ok[i].v, why);
    }
    static const char *bare[] = {"80G", "1M", "2k", "3T", "4K"};
    for (size_t i = 0; i < sizeof bare / sizeof bare[0]; i++) {
        double v = 7;
        char why[200] = "";
        int r = mt_size_parse(bare[i], &v, why, sizeof why);
        EXPECT(r == -1 && strstr(why, "ambiguous") && strstr(why, "iB (2^") && strstr(why, "B (10^"),
               "'%s' -> r=%d why '%s'", bare[i], r, why);
    }
    char why[200] = "";
    double v;
    EXPECT(mt_size_parse("80G", &v, why, sizeof why) == -1 && strstr(why, "80GiB") && strstr(why, "80GB"),
           "80G why '%s'", why);
    static const char *bad[] = {"", "-5", "+5", "12XB", "GiB", "1 GiB", "nan", "1e999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = 0;
        EXPECT(mt_size_parse(bad[i], &v, why, sizeof why) == -1 && why[0], "'%s' accepted or no reason", bad[i]);
    }
    EXPECT(mt_size_parse("12XB", &v, NULL, 0) == -1, "NULL why");
}

static void test_files(const char *root)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/a/b/c", root);
    EXPECT(mt_file_mkdir_p(p) == 0 && mt_file_is_dir(p), "mkdir_p %s", p);
    EXPECT(mt_file_mkdir_p(p) == 0, "mkdir_p of an existing directory");
    snprintf(q, sizeof q, "%s/a/f", root);
    int fd = open(q, O_RDWR | O_CREAT | O_TRUNC, 0644);
    EXPECT(fd >= 0, "create %s", q);
    const char msg[] = "hello, file";
    EXPECT(mt_file_pwrite_all(fd, msg, sizeof msg - 1, 100) == 0, "pwrite_all");
    char back[32] = {0};
    EXPECT(mt_file_pread_all(fd, back, sizeof msg - 1, 100) == 0 && !memcmp(back, msg, sizeof msg - 1), "pread_all");
    EXPECT(mt_file_pread_all(fd, back, 8, 105) == -1, "read past the end must fail");
    close(fd);
    EXPECT(mt_file_is_regular(q) && !mt_file_is_dir(q), "is_regular");
    snprintf(p, sizeof p, "%s/a/f/sub", root);
    EXPECT(mt_file_mkdir_p(p) == -1, "mkdir_p through a file must fail");
    EXPECT(mt_file_mkdir_p(q) == -1, "mkdir_p of a regular file must fail");

    snprintf(p, sizeof p, "%s/t.txt", root);
    FILE *f = fopen(p, "w");
    fputs("{\"x\": 1}", f);
    fclose(f);
    char *text = NULL;
    EXPECT(mt_file_read_text(&ctx, p, 64, &text) == MT_OK && text && !strcmp(text, "{\"x\": 1}"), "read_text");
    mt_free(&ctx, text);
    EXPECT(mt_file_read_text(&ctx, p, 4, &text) == MT_ERR_FORMAT && !text, "over the cap");
    EXPECT(mt_file_read_text(&ctx, root, 64, &text) == MT_ERR_FORMAT, "a directory");
    snprintf(q, sizeof q, "%s/missing", root);
    EXPECT(mt_file_read_text(&ctx, q, 64, &text) == MT_ERR_IO, "missing file");
    snprintf(q, sizeof q, "%s/nul.txt", root);
    f = fopen(q, "w");
    fwrite("ab\0cd", 1, 5, f);
    fclose(f);
    EXPECT(mt_file_read_text(&ctx, q, 64, &text) == MT_ERR_FORMAT, "NUL byte");

    snprintf(q, sizeof q, "%s/a/b/copy.txt", root);
    EXPECT(mt_file_copy(&ctx, p, q) == MT_OK, "copy: %s", mt_ctx_last_error(&ctx));
    EXPECT(mt_file_read_text(&ctx, q, 64, &text) == MT_OK && !strcmp(text, "{\"x\": 1}"), "copied bytes");
    mt_free(&ctx, text);
    char dir[1024];
    mt_file_dir_of(q, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/a/b", root);
    EXPECT(!strcmp(dir, p), "dir_of file: %s", dir);
    mt_file_dir_of(p, dir, sizeof dir);
    EXPECT(!strcmp(dir, p), "dir_of dir: %s", dir);
    mt_file_dir_of("bare", dir, sizeof dir);
    EXPECT(!strcmp(dir, "."), "dir_of bare: %s", dir);

    snprintf(p, sizeof p, "%s/a", root);
    EXPECT(mt_file_rm_rf(p) == 0 && !mt_file_is_dir(p), "rm_rf");
    EXPECT(mt_file_rm_rf(p) == 0, "rm_rf of a missing path");
    EXPECT(ctx.bytes_live_total == 0, "leak: %zu bytes live", ctx.bytes_live_total);
    mt_ctx_free(&ctx);
}

static int has(const char *path, const char *want)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char *text = NULL;
    int ok = mt_file_read_text(&ctx, path, 1024, &text) == MT_OK && !strcmp(text, want);
    mt_free(&ctx, text);
    mt_ctx_free(&ctx);
    return ok;
}

static void test_atomic(const char *root)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char p[1024], t[1040];
    snprintf(p, sizeof p, "%s/atomic.txt", root);
    snprintf(t, sizeof t, "%s.tmp", p);
    EXPECT(mt_file_write_atomic(&ctx, p, "one", 3, MT_FILE_SYNC | MT_FILE_SYNC_DIR, MT_ERR_IO) == MT_OK &&
           has(p, "one") && access(t, F_OK) != 0, "new file");
    EXPECT(mt_file_write_atomic(&ctx, p, "two!", 4, 0, MT_ERR_IO) == MT_OK && has(p, "two!") && access(t, F_OK) != 0,
           "replaced");
    struct mt_file_atomic a;
    EXPECT(mt_file_atomic_open(&ctx, &a, p, 0, MT_ERR_RUNTIME) == MT_OK, "open");
    fputs("half", a.f);
    EXPECT(mt_file_atomic_commit(&ctx, &a, 0) == MT_ERR_RUNTIME && has(p, "two!") && access(t, F_OK) != 0,
           "failed writer: old content kept, caller's code");
    EXPECT(mt_file_atomic_open(&ctx, &a, p, 0, MT_ERR_IO) == MT_OK, "open 2");
    fputs("gone", a.f);
    mt_file_atomic_discard(&a);
    EXPECT(has(p, "two!") && access(t, F_OK) != 0, "discard");
    snprintf(p, sizeof p, "%s/adir", root);
    snprintf(t, sizeof t, "%s.tmp", p);
    EXPECT(mt_file_mkdir_p(p) == 0, "mkdir");
    EXPECT(mt_file_write_atomic(&ctx, p, "x", 1, 0, MT_ERR_IO) == MT_ERR_IO && mt_file_is_dir(p) && access(t, F_OK) != 0 &&
           strstr(mt_ctx_last_error(&ctx), p), "rename onto a directory: %s", mt_ctx_last_error(&ctx));
    mt_ctx_free(&ctx);
}

static void test_error_where(void)
{
    struct mt_ctx ctx;
    char where[128], want[128];
    mt_ctx_init(&ctx);
    ctx.err_show_where = 0;
    EXPECT(!strcmp(mt_ctx_last_where(&ctx, where, sizeof where), ""), "no error, no place: '%s'", where);
    int line = __LINE__ + 1;
    mt_ctx_error(&ctx, MT_ERR_IO, "cannot open %s", "x");
    snprintf(want, sizeof want, "test_fileio.c:%d", line);
    EXPECT(!strcmp(mt_ctx_last_where(&ctx, where, sizeof where), want), "recorded '%s', want '%s'", where, want);
    EXPECT(!strcmp(mt_ctx_last_error(&ctx), "cannot open x"), "shown plain: '%s'", mt_ctx_last_error(&ctx));
    ctx.err_show_where = 1;
    char shown[256];
    snprintf(shown, sizeof shown, "cannot open x [%s]", want);
    EXPECT(!strcmp(mt_ctx_last_error(&ctx), shown), "shown with place: '%s', want '%s'", mt_ctx_last_error(&ctx),
           shown);
    /* raised inside the library: the place is the library's file, from src/ on */
    char *text = NULL;
    EXPECT(mt_file_read_text(&ctx, "/nonexistent/mt_where", 16, &text) == MT_ERR_IO, "a missing file");
    mt_ctx_last_where(&ctx, where, sizeof where);
    EXPECT(!strncmp(where, "src/core/", 9) && strchr(where, ':'), "library place '%s'", where);
    mt_ctx_clear_error(&ctx);
    EXPECT(!strcmp(mt_ctx_last_where(&ctx, where, sizeof where), ""), "cleared: '%s'", where);
    mt_ctx_free(&ctx);
}

int main(void)
{
    char root[] = "/tmp/mt_fileio_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    test_sizes();
    test_files(root);
    test_atomic(root);
    test_error_where();
    mt_file_rm_rf(root);
    if (n_fail) fprintf(stderr, "test_fileio: %d failure(s)\n", n_fail);
    else printf("test_fileio: ok\n");
    return n_fail ? 1 : 0;
}
