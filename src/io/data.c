/*
 * data.c — llm.c token shards, memory-mapped, read as one stream.
 *
 * A shard is 256 int32 (magic 20240520, version 1, token count, zeros) then
 * `count` uint16 tokens; the file size must be exactly 1024 + 2*count.
 * mt_data_open maps every selected file read-only, checks its header and
 * scans every token against vocab_size, so that a bad shard is an error
 * before training starts, never a wrong embedding lookup later.
 *
 * Invariant: files[] are in name order and starts[f] is the stream offset of
 * file f's first token (starts[nfiles] == ntok), so stream position o lives in
 * the last file f with starts[f] <= o and starts[f+1] > o. Sequences straddle
 * file boundaries freely: the files are one stream (SPEC.md section 3).
 *
 * Bookkeeping (paths, the file table) uses plain malloc because
 * mt_data_close() takes no context; the tokens themselves are mmapped and
 * never copied, so they are not host allocations of any bucket.
 *
 * Selection: a regular file is taken as is. A directory takes every regular
 * `*.bin` in it, a glob pattern every match; for both, split "train" skips
 * names (basename) containing "val", split "val" keeps only those, NULL
 * keeps all; the result is sorted by strcmp (byte order, locale-free).
 */
#define _GNU_SOURCE
#include "mt_data.h"
#include "../core/mt_fileio.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_INTS  256
#define HEADER_BYTES (HEADER_INTS * sizeof(int32_t))

struct shard {
    char           *path;
    void           *map;     /* whole file, PROT_READ                 */
    size_t          map_len;
    const uint16_t *tok;     /* map + HEADER_BYTES, `n` tokens        */
    size_t          n;
    uint16_t        max;     /* largest token (0 when empty)          */
};

struct mt_data {
    int           nfiles;
    struct shard *files;     /* (nfiles)                              */
    size_t       *starts;    /* (nfiles + 1) stream offset of file f  */
    size_t        ntok;
    int           max_token;
    int           shuffled;      /* mt_data_set_order                     */
    uint64_t      shuffle_seed;
};

/* ---- selecting files ---- */

struct name_list {
    char **v;
    int    n, cap;
};

static int list_push(struct name_list *l, const char *s)
{
    if (l->n == l->cap) {
        int ncap = l->cap ? l->cap * 2 : 16;
        char **nv = realloc(l->v, (size_t)ncap * sizeof *nv);
        if (!nv) return -1;
        l->v = nv, l->cap = ncap;
    }
    if (!(l->v[l->n] = strdup(s))) return -1;
    l->n++;
    return 0;
}

static void list_free(struct name_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL, l->n = l->cap = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* 1 if a file named `base` belongs to `split` (NULL = every file).
 * `tokenizer.bin`, which `meshtrain prepare` puts beside the shards, is never a shard. */
static int split_keeps(const char *split, const char *base)
{
    if (!strcmp(base, "tokenizer.bin")) return 0;
    if (!split) return 1;
    int is_val = strstr(base, "val") != NULL;
    if (!strcmp(split, "val")) return is_val;
    return !is_val; /* "train" (and any other split name): everything but val */
}

static const char *basename_of(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static enum mt_status select_files(struct mt_ctx *ctx, const char *path, const char *split, struct name_list *out)
{
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return mt_ctx_error(ctx, MT_ERR_IO, "data path '%s' is neither a file nor a directory", path);
    if (exists && S_ISREG(st.st_mode)) {
        if (list_push(out, path)) return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory listing data files");
        return MT_OK;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (!dir) return mt_ctx_error(ctx, MT_ERR_IO, "cannot open data dir '%s': %s", path, strerror(errno));
        struct dirent *de;
        char full[4096];
        while ((de = readdir(dir))) {
            size_t nl = strlen(de->d_name);
            if (nl < 4 || strcmp(de->d_name + nl - 4, ".bin") || !split_keeps(split, de->d_name)) continue;
            snprintf(full, sizeof full, "%s/%s", path, de->d_name);
            struct stat fs;
            if (stat(full, &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
            if (list_push(out, full)) {
                closedir(dir);
                return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory listing data files");
            }
        }
        closedir(dir);
        if (out->n == 0)
            return mt_ctx_error(ctx, MT_ERR_IO, "no *.bin shard in data dir '%s' (split %s)", path,
                                split ? split : "all");
    } else if (strpbrk(path, "*?[")) {
        glob_t g;
        int grc = glob(path, 0, NULL, &g);
        if (grc == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++) {
                struct stat fs;
                if (!split_keeps(split, basename_of(g.gl_pathv[i]))) continue;
                if (stat(g.gl_pathv[i], &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
                if (list_push(out, g.gl_pathv[i])) {
                    globfree(&g);
                    return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory listing data files");
                }
            }
        }
        if (grc == 0 || grc == GLOB_NOMATCH) globfree(&g);
        if (out->n == 0)
            return mt_ctx_error(ctx, MT_ERR_IO, "no shard file matches '%s' (split %s)", path,
                                split ? split : "all");
    } else {
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot open data path '%s': %s", path, strerror(errno));
    }
    qsort(out->v, (size_t)out->n, sizeof out->v[0], cmp_str);
    return MT_OK;
}

/* ---- mapping and checking one shard ---- */

/* max over n uint16: a branch-free loop GCC/Clang vectorise (vpmaxuw), on
 * all OpenMP threads for a large shard (the open-time scan is O(tokens) of
 * startup: a 10B-token corpus is 20 GB). */
static uint16_t max_u16(const uint16_t *t, size_t n)
{
    uint16_t m = 0;
#pragma omp parallel for simd reduction(max : m) schedule(static) if (n > ((size_t)1 << 24))
    for (size_t i = 0; i < n; i++) m = t[i] > m ? t[i] : m;
    return m;
}

static enum mt_status map_shard(struct mt_ctx *ctx, struct shard *s, int vocab_size)
{
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, s->path, "shard", &fd, NULL));   /* not a FIFO or device (issue 33) */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot stat shard '%s': %s", s->path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    if (size < HEADER_BYTES) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "shard '%s' is %zu bytes, smaller than the %zu-byte header",
                            s->path, size, (size_t)HEADER_BYTES);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return mt_ctx_error(ctx, MT_ERR_IO, "cannot mmap shard '%s': %s", s->path, strerror(errno));
    s->map = map, s->map_len = size;

    const int32_t *h = (const int32_t *)map;
    if (h[0] != MT_SHARD_MAGIC)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "shard '%s': bad magic %d (expected %d)", s->path, h[0],
                            MT_SHARD_MAGIC);
    if (h[1] != MT_SHARD_VERSION)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "shard '%s': version %d (expected %d: uint16 tokens)", s->path, h[1],
                            MT_SHARD_VERSION);
    if (h[2] < 0 || (size_t)h[2] * 2 + HEADER_BYTES != size)
        return mt_ctx_error(ctx, MT_ERR_FORMAT,
                            "shard '%s': header count %d needs %zu bytes but the file has %zu", s->path, h[2],
                            h[2] < 0 ? (size_t)0 : (size_t)h[2] * 2 + HEADER_BYTES, size);
    s->n   = (size_t)h[2];
    s->tok = (const uint16_t *)((const char *)map + HEADER_BYTES);

    /* vocab_size <= 0: unknown yet (the caller infers it from max_token) */
    s->max = max_u16(s->tok, s->n);
    if (vocab_size > 0 && vocab_size <= 65535) {
        if (s->max >= vocab_size) {
            size_t i = 0;
            while (s->tok[i] < vocab_size) i++;
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "token %u >= vocab_size %d at position %zu of %s",
                                (unsigned)s->tok[i], vocab_size, i, s->path);
        }
    }
    return MT_OK;
}

static int path_names_something(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    glob_t g;
    int n = glob(path, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    globfree(&g);
    return n > 0;
}

enum mt_status mt_data_resolve_vocab(struct mt_ctx *ctx, const char *data_path, int *vocab_size, int from_ckpt)
{
    if (!data_path) return MT_OK;
    if (*vocab_size == 0 && !path_names_something(data_path))
        return mt_ctx_error(ctx, MT_ERR_IO, "--data %s: no such file, directory or glob match", data_path);
    char dir[2048], meta[2100];
    mt_file_dir_of(data_path, dir, sizeof dir);
    snprintf(meta, sizeof meta, "%s/meta.json", dir);
    if (!mt_file_is_regular(meta)) {
        if (*vocab_size != 0 || from_ckpt) return MT_OK;
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "vocab_size is not set and %s has no meta.json (a data dir written by "
                            "`meshtrain prepare` has one): --set vocab_size=N", dir);
    }
    char *buf;
    MT_CHECK(mt_file_read_text(ctx, meta, 1 << 20, &buf));
    cJSON *j = cJSON_Parse(buf);
    const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "vocab_size") : NULL;
    const int have = cJSON_IsNumber(v), dv = have ? v->valueint : 0;
    cJSON_Delete(j);
    mt_free(ctx, buf);
    if (!have || dv < 1) return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s has no numeric vocab_size", meta);
    if (*vocab_size == 0) *vocab_size = dv;
    else if (*vocab_size < dv || (*vocab_size > dv && !from_ckpt))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "vocab_size %d (%s) is %s than the data's vocabulary %d (%s, its "
                            "tokenizer's): %s", *vocab_size, from_ckpt ? "the checkpoint's" : "config",
                            *vocab_size > dv ? "larger" : "smaller", dv, meta,
                            from_ckpt ? "this data was tokenized for another model"
                                      : "drop vocab_size from the config (it is then read from meta.json) or set it "
                                        "to match");
    return MT_OK;
}

enum mt_status mt_data_open(struct mt_ctx *ctx, const char *path, const char *split, int vocab_size, int T,
                            struct mt_data **out)
{
    *out = NULL;
    if (!path || !*path) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "data: no path given");
    if (T < 1) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "data: seq_len %d < 1", T);

    struct name_list names = {0};
    enum mt_status rc = select_files(ctx, path, split, &names);
    if (rc != MT_OK) {
        list_free(&names);
        return rc;
    }

    struct mt_data *d = calloc(1, sizeof *d);
    if (d) d->files = calloc((size_t)names.n, sizeof *d->files);
    if (d) d->starts = calloc((size_t)names.n + 1, sizeof *d->starts);
    if (!d || !d->files || !d->starts) {
        if (d) free(d->files), free(d->starts);
        free(d);
        list_free(&names);
        return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory opening data");
    }
    /* hand the path strings to the shards */
    d->nfiles = names.n;
    for (int f = 0; f < names.n; f++) d->files[f].path = names.v[f], names.v[f] = NULL;
    list_free(&names);

    int max_tok = 0;
    for (int f = 0; f < d->nfiles; f++) {
        MT_CHECK_GOTO(map_shard(ctx, &d->files[f], vocab_size), rc, fail);
        d->starts[f] = d->ntok;
        d->ntok += d->files[f].n;
        if (d->files[f].max > max_tok) max_tok = d->files[f].max;
    }
    d->starts[d->nfiles] = d->ntok;
    d->max_token = max_tok;

    if (d->ntok < (size_t)T + 2) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "data '%s' has %zu tokens; seq_len %d needs at least %d", path,
                          d->ntok, T, T + 2);
        goto fail;
    }
    *out = d;
    return MT_OK;
fail:
    mt_data_close(d);
    return rc;
}

void mt_data_close(struct mt_data *d)
{
    if (!d) return;
    for (int f = 0; f < d->nfiles; f++) {
        if (d->files[f].map) munmap(d->files[f].map, d->files[f].map_len);
        free(d->files[f].path);
    }
    free(d->files);
    free(d->starts);
    free(d);
}

size_t mt_data_ntokens(const struct mt_data *d) { return d ? d->ntok : 0; }
int    mt_data_nfiles(const struct mt_data *d) { return d ? d->nfiles : 0; }
int    mt_data_max_token(const struct mt_data *d) { return d ? d->max_token : 0; }

/* Index of the file holding stream position o: the last f with starts[f] <= o
 * and a non-empty range (empty files share their start with the next one). */
static int file_of(const struct mt_data *d, size_t o)
{
    int lo = 0, hi = d->nfiles - 1;
    while (lo < hi) { /* largest f with starts[f] <= o */
        int mid = (lo + hi + 1) / 2;
        if (d->starts[mid] <= o) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/*
 * o = ((s*G + i) * T) mod (N - T - 1), computed as ((s*G + i) mod M) * T mod M
 * in 128 bits so no step count can overflow. Tokens o..o+T are copied (T+1 of
 * them); o <= N - T - 2 so o + T <= N - 2 is in range.
 */
void mt_data_set_order(struct mt_data *d, int shuffled, uint64_t seed)
{
    d->shuffled = shuffled;
    d->shuffle_seed = seed;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * Shuffled order: the stream is cut into W = (N-1)/T windows of T+1 tokens
 * starting at multiples of T; global sequence j (= s*G + i) of epoch
 * e = j / W reads window perm_e(j mod W). perm_e is a 4-round Feistel
 * permutation on the next power of two >= W (keyed by seed and epoch),
 * cycle-walked into [0, W): a bijection, so each epoch reads every window
 * once. A pure function of (seed, j): the same on every mesh.
 */
static uint64_t window_perm(uint64_t x, uint64_t W, uint64_t seed, uint64_t epoch)
{
    int bits = 2;
    while ((1ull << bits) < W) bits++;
    int lo = bits / 2, hi = bits - lo;
    uint64_t mlo = (1ull << lo) - 1, mhi = (1ull << hi) - 1;
    do {
        uint64_t L = x >> lo, R = x & mlo;   /* L: hi bits, R: lo bits */
        for (int r = 0; r < 4; r++) {
            /* alternate which half is mixed so both widths stay bijective */
            if (r % 2 == 0) L = (L ^ mix64(seed ^ mix64(epoch * 4 + (uint64_t)r) ^ R)) & mhi;
            else            R = (R ^ mix64(seed ^ mix64(epoch * 4 + (uint64_t)r) ^ L)) & mlo;
        }
        x = (L << lo) | R;
    } while (x >= W);
    return x;
}

void mt_data_sequence(const struct mt_data *d, int64_t step, int G, int64_t i, int T, int32_t *inp, int32_t *tgt)
{
    MT_ASSERT(d && step >= 0 && G > 0 && i >= 0 && T >= 1 && d->ntok >= (size_t)T + 2);
    size_t o;
    if (d->shuffled) {
        uint64_t W = (uint64_t)((d->ntok - 1) / (size_t)T);
        uint64_t j = (uint64_t)step * (uint64_t)G + (uint64_t)i;
        o = (size_t)window_perm(j % W, W, d->shuffle_seed, j / W) * (size_t)T;
    } else {
        unsigned __int128 M = (unsigned __int128)(d->ntok - (size_t)T - 1);
        unsigned __int128 a = ((unsigned __int128)step * (unsigned)G + (unsigned __int128)i) % M;
        o = (size_t)((a * (unsigned)T) % M);
    }

    int f = file_of(d, o);
    size_t in_file = o - d->starts[f];
    for (int k = 0; k <= T; k++) {
        while (in_file >= d->files[f].n) { /* next non-empty file */
            f++;
            in_file = 0;
            MT_ASSERT(f < d->nfiles);
        }
        int32_t v = d->files[f].tok[in_file++];
        if (k < T) inp[k] = v;
        if (k > 0) tgt[k - 1] = v;
    }
}

enum mt_status mt_data_write_shard(struct mt_ctx *ctx, const char *path, const uint16_t *tokens, size_t n)
{
    if (n > 2147483647u)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "shard '%s': %zu tokens exceed the int32 header count", path, n);
    if (strlen(path) >= 4096) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "shard path too long: '%s'", path);
    int32_t header[HEADER_INTS] = {0};
    header[0] = MT_SHARD_MAGIC;
    header[1] = MT_SHARD_VERSION;
    header[2] = (int32_t)n;

    struct mt_file_atomic a;
    MT_CHECK(mt_file_atomic_open(ctx, &a, path, MT_FILE_SYNC, MT_ERR_IO));
    int ok = fwrite(header, sizeof header, 1, a.f) == 1;
    if (ok && n) ok = fwrite(tokens, sizeof(uint16_t), n, a.f) == n;
    return mt_file_atomic_commit(ctx, &a, ok);
}
