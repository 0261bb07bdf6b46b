/*
 * corpus.c — the list of text documents behind `tokenizer train` and
 * `prepare`: files and directories expanded in a fixed order, binary files
 * detected and skipped, an optional byte cap, and a running xxh64 over what
 * was read so that meta.json can say exactly which text went in.
 *
 * Invariant: the document list is a pure function of the inputs, their
 * contents and max_bytes (directory entries sorted by path with strcmp,
 * never in readdir order), so the same command gives the same shards.
 */
#define _GNU_SOURCE
#include "mt_tok.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../core/mt_fileio.h"

struct plist { char **p; size_t n, cap; };

static enum mt_status plist_add(struct mt_ctx *ctx, struct plist *l, const char *path)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 256;
        char **q = mt_alloc(ctx, nc * sizeof(char *), MT_BUCKET_OTHER);
        if (!q) return MT_ERR_OOM;
        if (l->p) memcpy(q, l->p, l->n * sizeof(char *));
        mt_free(ctx, l->p);
        l->p = q;
        l->cap = nc;
    }
    size_t len = strlen(path);
    char *s = mt_alloc(ctx, len + 1, MT_BUCKET_OTHER);
    if (!s) return MT_ERR_OOM;
    memcpy(s, path, len + 1);
    l->p[l->n++] = s;
    return MT_OK;
}

static void plist_free(struct mt_ctx *ctx, struct plist *l)
{
    for (size_t i = 0; i < l->n; i++) mt_free(ctx, l->p[i]);
    mt_free(ctx, l->p);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file under dir (symlinks not followed, so no loops and no
 * file counted twice). An unreadable subdirectory is an error. */
static enum mt_status walk(struct mt_ctx *ctx, const char *dir, struct plist *out)
{
    DIR *d = opendir(dir);
    if (!d) return mt_ctx_error(ctx, MT_ERR_IO, "cannot read directory %s: %s", dir, strerror(errno));
    enum mt_status rc = MT_OK;
    struct dirent *e;
    size_t dl = strlen(dir);
    char *path = NULL;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t need = dl + strlen(e->d_name) + 2;
        mt_free(ctx, path);
        path = mt_alloc(ctx, need, MT_BUCKET_OTHER);
        if (!path) { rc = MT_ERR_OOM; break; }
        snprintf(path, need, "%s%s%s", dir, (dl && dir[dl - 1] == '/') ? "" : "/", e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) { rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot stat %s: %s", path, strerror(errno)); break; }
        if (S_ISDIR(st.st_mode)) {
            if ((rc = walk(ctx, path, out)) != MT_OK) break;
        } else if (S_ISREG(st.st_mode)) {
            if ((rc = plist_add(ctx, out, path)) != MT_OK) break;
        }
    }
    mt_free(ctx, path);
    closedir(d);
    return rc;
}

void mt_tok_corpus_destroy(struct mt_ctx *ctx, struct mt_tok_corpus *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_files; i++) mt_free(ctx, c->paths[i]);
    mt_free(ctx, c->paths);
    mt_free(ctx, c->sizes);
    if (c->hash_state) XXH64_freeState(c->hash_state);
    mt_free(ctx, c);
}

/* Probe a file: 1 if binary (NUL in the first MT_TOK_BINARY_PROBE bytes). */
static enum mt_status probe(struct mt_ctx *ctx, const char *path, uint64_t *size, int *binary)
{
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, path, NULL, &fd, NULL));   /* not a FIFO (issue 33) */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return mt_ctx_error(ctx, MT_ERR_IO, "%s is not a regular file", path);
    }
    uint8_t buf[MT_TOK_BINARY_PROBE];
    size_t r = fread(buf, 1, sizeof buf, f);
    int err = ferror(f);
    fclose(f);
    if (err) return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno ? errno : EIO));
    *binary = memchr(buf, 0, r) != NULL;
    *size = (uint64_t)st.st_size;
    return MT_OK;
}

enum mt_status mt_tok_corpus_gather(struct mt_ctx *ctx, const char *const *inputs, int n_inputs,
                                    uint64_t max_bytes, struct mt_tok_corpus **out)
{
    *out = NULL;
    struct plist files = {0};
    enum mt_status rc = MT_OK;
    struct mt_tok_corpus *c = mt_alloc(ctx, sizeof *c, MT_BUCKET_OTHER);
    if (!c) return MT_ERR_OOM;
    c->max_bytes = max_bytes;
    for (int i = 0; i < n_inputs; i++) {
        struct stat st;
        if (stat(inputs[i], &st) != 0) {
            rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", inputs[i], strerror(errno));
            goto fail;
        }
        if (S_ISDIR(st.st_mode)) {
            size_t first = files.n;
            MT_CHECK_GOTO(walk(ctx, inputs[i], &files), rc, fail);
            qsort(files.p + first, files.n - first, sizeof(char *), cmp_str);
        } else if (S_ISREG(st.st_mode)) {
            MT_CHECK_GOTO(plist_add(ctx, &files, inputs[i]), rc, fail);
        } else {
            rc = mt_ctx_error(ctx, MT_ERR_IO, "%s is not a regular file or directory", inputs[i]);
            goto fail;
        }
    }
    c->paths = mt_alloc(ctx, (files.n + 1) * sizeof(char *), MT_BUCKET_OTHER);
    c->sizes = mt_alloc(ctx, (files.n + 1) * sizeof(uint64_t), MT_BUCKET_OTHER);
    if (!c->paths || !c->sizes) { rc = MT_ERR_OOM; goto fail; }
    for (size_t i = 0; i < files.n; i++) {
        if (max_bytes && c->total_bytes >= max_bytes) { c->truncated = 1; break; }
        uint64_t size;
        int binary;
        MT_CHECK_GOTO(probe(ctx, files.p[i], &size, &binary), rc, fail);
        if (binary) { c->n_binary++; continue; }
        if (size == 0) { c->n_empty++; continue; }
        if (max_bytes && c->total_bytes + size > max_bytes) {
            size = max_bytes - c->total_bytes;
            c->truncated = 1;
        }
        c->paths[c->n_files] = files.p[i];   /* move ownership */
        files.p[i] = NULL;
        c->sizes[c->n_files++] = size;
        c->total_bytes += size;
    }
    if (c->n_files == 0) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "no text in the input (%zu files: %d binary, %d empty)",
                          files.n, c->n_binary, c->n_empty);
        goto fail;
    }
    c->hash_state = XXH64_createState();
    if (!c->hash_state) { rc = MT_ERR_OOM; goto fail; }
    XXH64_reset(c->hash_state, 0);
    plist_free(ctx, &files);
    *out = c;
    return MT_OK;
fail:
    if (rc == MT_ERR_OOM && ctx->last_status != MT_ERR_OOM) mt_ctx_error(ctx, MT_ERR_OOM, "corpus: out of memory");
    plist_free(ctx, &files);
    mt_tok_corpus_destroy(ctx, c);
    return rc;
}

enum mt_status mt_tok_corpus_read(struct mt_ctx *ctx, struct mt_tok_corpus *c, int i, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (i != c->next_read || i >= c->n_files)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "corpus: documents must be read in order (%d, expected %d)",
                            i, c->next_read);
    const char *path = c->paths[i];
    FILE *f = fopen(path, "rb");
    if (!f) return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    size_t want = (size_t)c->sizes[i];
    uint8_t *b = mt_alloc(ctx, want + 1, MT_BUCKET_OTHER);
    if (!b) { fclose(f); return MT_ERR_OOM; }
    size_t r = fread(b, 1, want, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        mt_free(ctx, b);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno ? errno : EIO));
    }
    uint64_t r64 = r;
    XXH64_update(c->hash_state, path, strlen(path) + 1);
    XXH64_update(c->hash_state, &r64, sizeof r64);
    XXH64_update(c->hash_state, b, r);
    c->next_read++;
    *buf = b;
    *len = r;
    return MT_OK;
}

uint64_t mt_tok_corpus_hash(const struct mt_tok_corpus *c)
{
    return XXH64_digest(c->hash_state);
}
