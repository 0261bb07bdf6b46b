/*
 * tokenizer.c — a trained byte-level BPE tokenizer: merge table, encoder,
 * decoder, and the file format (docs/tokenizer.md).
 *
 * Invariant: token 256+i is merges[i] = (left, right) with left, right <
 * 256+i, and its bytes are bytes(left) ++ bytes(right); specials follow the
 * merges. Encoding a chunk applies merges lowest rank (= earliest) first,
 * leftmost first among equal ranks, until no adjacent pair has a merge —
 * exactly the order the trainer created them, so a training chunk encodes
 * to the symbols the trainer ended with.
 *
 * Encoding speed comes from a cache of chunk -> ids (most chunks repeat);
 * chunks longer than a few dozen bytes use an O(n log n) heap instead of
 * the quadratic rescan.
 */
#define _GNU_SOURCE
#include "mt_tok.h"
#include "../core/mt_fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define HEADER_BYTES      32
#define PRETOK_GPT4_V1    1
#define MAX_TOKEN_BYTES   (1u << 30)   /* sum of all token lengths, sanity bound */
#define CACHE_MAX_CHUNK   256          /* longer chunks are not cached          */
#define CACHE_ARENA_MAX   (32u << 20)  /* clear the cache beyond this          */
#define HEAP_THRESHOLD    64           /* chunks longer than this use the heap */

static const char *const special_names[MT_TOK_N_SPECIAL] = {"<|bos|>"};

struct cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len;   /* into cache_bytes  */
    uint32_t ids_off, ids_len;   /* into cache_ids    */
};

struct mt_tok {
    int       vocab, n_merges, n_special, bos;
    uint32_t *merges;        /* (2*M) */
    uint64_t *tok_off;       /* (V+1) prefix offsets into tok_bytes */
    uint8_t  *tok_bytes;
    /* pair (left<<32|right) -> rank, open addressing; key UINT64_MAX = empty */
    uint64_t *pm_keys;
    uint32_t *pm_vals;
    size_t    pm_mask;
    char    **special;       /* (n_special) names */
    uint64_t  file_hash;
    /* chunk cache (mutable state: one thread at a time) */
    struct cache_entry *ce;  /* (ce_mask+1); hash 0 = empty */
    size_t    ce_mask, ce_n;
    uint8_t  *cache_bytes;
    uint32_t *cache_ids;
    size_t    cb_n, ci_n;    /* used; capacity is CACHE_ARENA_MAX bytes / ids */
};

/* ---- small growable arrays ---- */

static enum mt_status grow(struct mt_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem)
{
    return mt_grow(ctx, p, cap, need, elem, 64, MT_BUCKET_OTHER);
}

static enum mt_status ids_push(struct mt_ctx *ctx, struct mt_tok_ids *v, uint32_t id)
{
    if (v->n == v->cap) MT_CHECK(grow(ctx, (void **)&v->ids, &v->cap, v->n + 1, sizeof *v->ids));
    v->ids[v->n++] = id;
    return MT_OK;
}

void mt_tok_ids_free(struct mt_ctx *ctx, struct mt_tok_ids *v)
{
    if (!v) return;
    mt_free(ctx, v->ids);
    memset(v, 0, sizeof *v);
}

/* ---- pair -> rank map ---- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static inline int pair_rank(const struct mt_tok *t, uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 32) | b;
    for (size_t h = mix64(key) & t->pm_mask;; h = (h + 1) & t->pm_mask) {
        if (t->pm_keys[h] == key) return (int)t->pm_vals[h];
        if (t->pm_keys[h] == UINT64_MAX) return -1;
    }
}

/* ---- construction ---- */

void mt_tok_destroy(struct mt_ctx *ctx, struct mt_tok *t)
{
    if (!t) return;
    mt_free(ctx, t->merges);
    mt_free(ctx, t->tok_off);
    mt_free(ctx, t->tok_bytes);
    mt_free(ctx, t->pm_keys);
    mt_free(ctx, t->pm_vals);
    if (t->special)
        for (int i = 0; i < t->n_special; i++) mt_free(ctx, t->special[i]);
    mt_free(ctx, t->special);
    mt_free(ctx, t->ce);
    mt_free(ctx, t->cache_bytes);
    mt_free(ctx, t->cache_ids);
    mt_free(ctx, t);
}

static enum mt_status build(struct mt_ctx *ctx, const uint32_t *merges, int n_merges,
                            const char *const *specials, int n_special, struct mt_tok **out)
{
    *out = NULL;
    if (n_merges < 0 || 256 + (long)n_merges + n_special > MT_TOK_MAX_VOCAB)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: %d merges + %d specials exceed vocab %d",
                            n_merges, n_special, MT_TOK_MAX_VOCAB);
    struct mt_tok *t = mt_alloc(ctx, sizeof *t, MT_BUCKET_OTHER);
    if (!t) return MT_ERR_OOM;
    enum mt_status rc = MT_OK;
    t->n_merges = n_merges;
    t->n_special = n_special;
    t->vocab = 256 + n_merges + n_special;
    t->bos = -1;
    int V = t->vocab;
    t->merges = mt_alloc(ctx, (size_t)2 * n_merges * sizeof(uint32_t) + 8, MT_BUCKET_OTHER);
    t->tok_off = mt_alloc(ctx, ((size_t)V + 1) * sizeof(uint64_t), MT_BUCKET_OTHER);
    t->special = mt_alloc(ctx, (size_t)n_special * sizeof(char *) + 8, MT_BUCKET_OTHER);
    if (!t->merges || !t->tok_off || !t->special) { rc = MT_ERR_OOM; goto fail; }
    if (n_merges) memcpy(t->merges, merges, (size_t)2 * n_merges * sizeof(uint32_t));

    /* token lengths -> offsets, validating merges */
    uint64_t *len = t->tok_off;  /* reuse: len[i] then prefix sums in place */
    for (int i = 0; i < 256; i++) len[i] = 1;
    for (int i = 0; i < n_merges; i++) {
        uint32_t a = merges[2 * i], b = merges[2 * i + 1];
        if (a >= 256u + (uint32_t)i || b >= 256u + (uint32_t)i) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: merge %d (%u, %u) refers to a later token", i, a, b);
            goto fail;
        }
        len[256 + i] = len[a] + len[b];
        if (len[256 + i] > MAX_TOKEN_BYTES) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: token %d is absurdly long", 256 + i);
            goto fail;
        }
    }
    for (int s = 0; s < n_special; s++) {
        size_t l = strlen(specials[s]);
        t->special[s] = mt_alloc(ctx, l + 1, MT_BUCKET_OTHER);
        if (!t->special[s]) { rc = MT_ERR_OOM; goto fail; }
        memcpy(t->special[s], specials[s], l);
        len[256 + n_merges + s] = l;
        if (!strcmp(specials[s], "<|bos|>") && t->bos < 0) t->bos = 256 + n_merges + s;
    }
    if (t->bos < 0) { rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: no <|bos|> special token"); goto fail; }
    uint64_t total = 0;
    for (int i = 0; i < V; i++) {
        uint64_t l = len[i];
        len[i] = total;
        total += l;
        if (total > MAX_TOKEN_BYTES) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: token bytes exceed %u", MAX_TOKEN_BYTES);
            goto fail;
        }
    }
    len[V] = total;
    t->tok_bytes = mt_alloc(ctx, total + 1, MT_BUCKET_OTHER);
    if (!t->tok_bytes) { rc = MT_ERR_OOM; goto fail; }
    for (int i = 0; i < 256; i++) t->tok_bytes[t->tok_off[i]] = (uint8_t)i;
    for (int i = 0; i < n_merges; i++) {
        uint32_t a = merges[2 * i], b = merges[2 * i + 1];
        uint8_t *dst = t->tok_bytes + t->tok_off[256 + i];
        size_t la = t->tok_off[a + 1] - t->tok_off[a];
        memcpy(dst, t->tok_bytes + t->tok_off[a], la);
        memcpy(dst + la, t->tok_bytes + t->tok_off[b], t->tok_off[b + 1] - t->tok_off[b]);
    }
    for (int s = 0; s < n_special; s++)
        memcpy(t->tok_bytes + t->tok_off[256 + n_merges + s], t->special[s], strlen(t->special[s]));

    /* pair map: load factor <= 1/2 */
    size_t cap = 16;
    while (cap < (size_t)n_merges * 2 + 2) cap *= 2;
    t->pm_mask = cap - 1;
    t->pm_keys = mt_alloc(ctx, cap * sizeof(uint64_t), MT_BUCKET_OTHER);
    t->pm_vals = mt_alloc(ctx, cap * sizeof(uint32_t), MT_BUCKET_OTHER);
    if (!t->pm_keys || !t->pm_vals) { rc = MT_ERR_OOM; goto fail; }
    memset(t->pm_keys, 0xff, cap * sizeof(uint64_t));
    for (int i = 0; i < n_merges; i++) {
        uint64_t key = ((uint64_t)merges[2 * i] << 32) | merges[2 * i + 1];
        size_t h = mix64(key) & t->pm_mask;
        while (t->pm_keys[h] != UINT64_MAX) {
            if (t->pm_keys[h] == key) {
                rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: merge %d duplicates an earlier merge", i);
                goto fail;
            }
            h = (h + 1) & t->pm_mask;
        }
        t->pm_keys[h] = key;
        t->pm_vals[h] = (uint32_t)i;
    }
    /* the identifying hash is that of the file image */
    uint8_t *img;
    size_t img_len;
    MT_CHECK_GOTO(mt_tok_serialize(ctx, t, &img, &img_len), rc, fail);
    t->file_hash = XXH64(img, img_len, 0);
    mt_free(ctx, img);
    *out = t;
    return MT_OK;
fail:
    if (rc == MT_ERR_OOM && ctx->last_status != MT_ERR_OOM)
        mt_ctx_error(ctx, MT_ERR_OOM, "tokenizer: out of memory");
    mt_tok_destroy(ctx, t);
    return rc;
}

enum mt_status mt_tok_create(struct mt_ctx *ctx, const uint32_t *merges, int n_merges, struct mt_tok **out)
{
    return build(ctx, merges, n_merges, special_names, MT_TOK_N_SPECIAL, out);
}

int mt_tok_vocab_size(const struct mt_tok *t) { return t->vocab; }
int mt_tok_n_merges(const struct mt_tok *t) { return t->n_merges; }
int mt_tok_bos_id(const struct mt_tok *t) { return t->bos; }
uint64_t mt_tok_hash(const struct mt_tok *t) { return t->file_hash; }

void mt_tok_merge(const struct mt_tok *t, int i, uint32_t *left, uint32_t *right)
{
    MT_ASSERT(i >= 0 && i < t->n_merges);
    *left = t->merges[2 * i];
    *right = t->merges[2 * i + 1];
}

const uint8_t *mt_tok_token_bytes(const struct mt_tok *t, uint32_t id, size_t *len)
{
    if (id >= (uint32_t)t->vocab) { *len = 0; return NULL; }
    *len = (size_t)(t->tok_off[id + 1] - t->tok_off[id]);
    return t->tok_bytes + t->tok_off[id];
}

/* ---- file format ---- */

static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get_u32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get_u64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

enum mt_status mt_tok_serialize(struct mt_ctx *ctx, const struct mt_tok *t, uint8_t **buf, size_t *len)
{
    size_t n = HEADER_BYTES + (size_t)8 * t->n_merges;
    for (int s = 0; s < t->n_special; s++) n += 4 + strlen(t->special[s]);
    n += 8;
    uint8_t *b = mt_alloc(ctx, n, MT_BUCKET_OTHER);
    if (!b) return MT_ERR_OOM;
    memcpy(b, MT_TOK_MAGIC, 8);
    put_u32(b + 8, MT_TOK_VERSION);
    put_u32(b + 12, (uint32_t)t->vocab);
    put_u32(b + 16, (uint32_t)t->n_merges);
    put_u32(b + 20, (uint32_t)t->n_special);
    put_u32(b + 24, PRETOK_GPT4_V1);
    put_u32(b + 28, 0);
    size_t o = HEADER_BYTES;
    for (int i = 0; i < 2 * t->n_merges; i++, o += 4) put_u32(b + o, t->merges[i]);
    for (int s = 0; s < t->n_special; s++) {
        uint32_t l = (uint32_t)strlen(t->special[s]);
        put_u32(b + o, l);
        memcpy(b + o + 4, t->special[s], l);
        o += 4 + l;
    }
    put_u64(b + o, XXH64(b, o, 0));
    *buf = b;
    *len = n;
    return MT_OK;
}

enum mt_status mt_tok_deserialize(struct mt_ctx *ctx, const uint8_t *b, size_t n, struct mt_tok **out)
{
    *out = NULL;
    if (n < 12 || memcmp(b, MT_TOK_MAGIC, 8) != 0)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "not a meshtrain tokenizer file (bad magic)");
    uint32_t version = get_u32(b + 8);
    if (version != MT_TOK_VERSION)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file version %u, this build reads version %d",
                            version, MT_TOK_VERSION);
    if (n < HEADER_BYTES + 8)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file truncated (%zu bytes)", n);
    uint32_t vocab = get_u32(b + 12), nm = get_u32(b + 16), ns = get_u32(b + 20), pre = get_u32(b + 24);
    if (nm > MT_TOK_MAX_VOCAB || ns < 1 || ns > 256 || (uint64_t)256 + nm + ns != vocab || vocab > MT_TOK_MAX_VOCAB)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file: inconsistent sizes (vocab %u, %u merges, %u specials)",
                            vocab, nm, ns);
    if (pre != PRETOK_GPT4_V1)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file: unknown pre-tokenizer %u", pre);
    size_t o = HEADER_BYTES + (size_t)8 * nm;
    if (o + 8 > n) return mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file truncated (%zu bytes)", n);
    char *names[256];
    int got = 0;
    enum mt_status rc = MT_OK;
    for (uint32_t s = 0; s < ns; s++) {
        if (o + 4 > n - 8) { rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file truncated (%zu bytes)", n); goto done; }
        uint32_t l = get_u32(b + o);
        if (l == 0 || l > 256 || o + 4 + l > n - 8) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file truncated or bad special token length");
            goto done;
        }
        names[s] = mt_alloc(ctx, l + 1, MT_BUCKET_OTHER);
        if (!names[s]) { rc = MT_ERR_OOM; goto done; }
        got++;
        memcpy(names[s], b + o + 4, l);
        o += 4 + l;
    }
    if (o + 8 != n) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file: %zu bytes, expected %zu", n, o + 8);
        goto done;
    }
    if (get_u64(b + o) != XXH64(b, o, 0)) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer file: checksum mismatch (corrupted)");
        goto done;
    }
    {
        uint32_t *merges = mt_alloc(ctx, (size_t)8 * nm + 8, MT_BUCKET_OTHER);
        if (!merges) { rc = MT_ERR_OOM; goto done; }
        for (uint32_t i = 0; i < 2 * nm; i++) merges[i] = get_u32(b + HEADER_BYTES + 4 * (size_t)i);
        rc = build(ctx, merges, (int)nm, (const char *const *)names, (int)ns, out);
        mt_free(ctx, merges);
    }
done:
    for (int s = 0; s < got; s++) mt_free(ctx, names[s]);
    return rc;
}

enum mt_status mt_tok_load(struct mt_ctx *ctx, const char *path, struct mt_tok **out)
{
    *out = NULL;
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, path, "tokenizer", &fd, NULL));   /* not a FIFO (issue 33) */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot open tokenizer %s: %s", path, strerror(errno));
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    enum mt_status rc = MT_OK;
    for (;;) {
        if (n == cap) MT_CHECK_GOTO(grow(ctx, (void **)&buf, &cap, n + 65536, 1), rc, done);
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n > (size_t)64 << 20) { rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer %s: file too large", path); goto done; }
    }
    if (ferror(f)) { rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot read tokenizer %s: %s", path, strerror(errno)); goto done; }
    rc = mt_tok_deserialize(ctx, buf, n, out);
    if (rc != MT_OK && rc != MT_ERR_OOM) {
        char msg[sizeof ctx->errmsg];
        snprintf(msg, sizeof msg, "%s", ctx->errmsg);
        mt_ctx_error(ctx, rc, "%s: %s", path, msg);
    }
done:
    fclose(f);
    mt_free(ctx, buf);
    return rc;
}

enum mt_status mt_tok_save(struct mt_ctx *ctx, const struct mt_tok *t, const char *path)
{
    uint8_t *buf;
    size_t n;
    MT_CHECK(mt_tok_serialize(ctx, t, &buf, &n));
    enum mt_status rc = mt_file_write_atomic(ctx, path, buf, n, 0, MT_ERR_IO);
    mt_free(ctx, buf);
    return rc;
}

/* ---- encoding ---- */

/* Quadratic reference: merge the lowest-rank adjacent pair (leftmost on
 * ties) until none is left. ids holds the chunk's bytes on entry. */
static size_t merge_naive(const struct mt_tok *t, uint32_t *ids, size_t n)
{
    while (n > 1) {
        int best = -1;
        size_t at = 0;
        for (size_t k = 0; k + 1 < n; k++) {
            int r = pair_rank(t, ids[k], ids[k + 1]);
            if (r >= 0 && (best < 0 || r < best)) { best = r; at = k; }
        }
        if (best < 0) break;
        ids[at] = 256u + (uint32_t)best;
        memmove(ids + at + 1, ids + at + 2, (n - at - 2) * sizeof *ids);
        n--;
    }
    return n;
}

/* Heap version: symbols in a doubly linked list over the original
 * positions; a min-heap of (rank, left position) candidates, validated
 * lazily on pop (a stale entry names a dead symbol or a pair whose rank
 * changed). Same result as merge_naive: (rank, position) order is exactly
 * "lowest rank, leftmost first". */
struct cand { uint32_t rank, pos; };

static int cand_less(struct cand a, struct cand b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct cand *h, size_t *n, struct cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n)
{
    struct cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct cand mv = last;
        if (l < *n && cand_less(h[l], mv)) { m = l; mv = h[l]; }
        if (r < *n && cand_less(h[r], mv)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static enum mt_status merge_heap(struct mt_ctx *ctx, const struct mt_tok *t, uint32_t *ids, size_t *n_io)
{
    size_t n = *n_io;
    if (n < 2) return MT_OK;
    const uint32_t NONE = UINT32_MAX;
    uint32_t *nxt = mt_alloc(ctx, n * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    uint32_t *prv = mt_alloc(ctx, n * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    struct cand *h = mt_alloc(ctx, 2 * n * sizeof(struct cand), MT_BUCKET_WORKSPACE);
    if (!nxt || !prv || !h) {
        mt_free(ctx, nxt); mt_free(ctx, prv); mt_free(ctx, h);
        return MT_ERR_OOM;
    }
    size_t hn = 0;
    for (size_t k = 0; k < n; k++) {
        nxt[k] = k + 1 < n ? (uint32_t)(k + 1) : NONE;
        prv[k] = k > 0 ? (uint32_t)(k - 1) : NONE;
        if (k + 1 < n) {
            int r = pair_rank(t, ids[k], ids[k + 1]);
            if (r >= 0) heap_push(h, &hn, (struct cand){(uint32_t)r, (uint32_t)k});
        }
    }
    /* each merge pushes at most 2 candidates and kills one symbol: heap <= 2n */
    while (hn > 0) {
        struct cand c = heap_pop(h, &hn);
        uint32_t p = c.pos, q = nxt[p];
        if (prv[p] == p || q == NONE) continue;               /* dead or last */
        if (pair_rank(t, ids[p], ids[q]) != (int)c.rank) continue;  /* stale */
        ids[p] = 256u + c.rank;
        uint32_t qq = nxt[q];
        nxt[p] = qq;
        if (qq != NONE) prv[qq] = p;
        prv[q] = q;                                            /* mark dead */
        if (prv[p] != NONE) {
            int r = pair_rank(t, ids[prv[p]], ids[p]);
            if (r >= 0) heap_push(h, &hn, (struct cand){(uint32_t)r, prv[p]});
        }
        if (qq != NONE) {
            int r = pair_rank(t, ids[p], ids[qq]);
            if (r >= 0) heap_push(h, &hn, (struct cand){(uint32_t)r, p});
        }
    }
    size_t m = 0;
    for (uint32_t k = 0; k != NONE; k = nxt[k]) ids[m++] = ids[k];
    *n_io = m;
    mt_free(ctx, nxt); mt_free(ctx, prv); mt_free(ctx, h);
    return MT_OK;
}

enum mt_status mt_tok_encode_chunk(struct mt_ctx *ctx, const struct mt_tok *t, const uint8_t *s, size_t n,
                                   int method, struct mt_tok_ids *out)
{
    if (n == 0) return MT_OK;
    MT_CHECK(grow(ctx, (void **)&out->ids, &out->cap, out->n + n, sizeof *out->ids));
    uint32_t *ids = out->ids + out->n;
    for (size_t k = 0; k < n; k++) ids[k] = s[k];
    size_t m = n;
    if (method == 1 || (method == 0 && n <= HEAP_THRESHOLD)) m = merge_naive(t, ids, n);
    else MT_CHECK(merge_heap(ctx, t, ids, &m));
    out->n += m;
    return MT_OK;
}

static enum mt_status cache_init(struct mt_ctx *ctx, struct mt_tok *t)
{
    if (t->ce) return MT_OK;
    t->ce_mask = (1u << 17) - 1;
    t->ce = mt_alloc(ctx, (t->ce_mask + 1) * sizeof *t->ce, MT_BUCKET_WORKSPACE);
    t->cache_bytes = mt_alloc(ctx, CACHE_ARENA_MAX, MT_BUCKET_WORKSPACE);
    t->cache_ids = mt_alloc(ctx, CACHE_ARENA_MAX, MT_BUCKET_WORKSPACE);
    if (!t->ce || !t->cache_bytes || !t->cache_ids) return MT_ERR_OOM;
    return MT_OK;
}

static void cache_clear(struct mt_tok *t)
{
    memset(t->ce, 0, (t->ce_mask + 1) * sizeof *t->ce);
    t->ce_n = t->cb_n = t->ci_n = 0;
}

enum mt_status mt_tok_encode(struct mt_ctx *ctx, struct mt_tok *t, const uint8_t *s, size_t n,
                             struct mt_tok_ids *out)
{
    MT_CHECK(cache_init(ctx, t));
    const size_t ids_cap = CACHE_ARENA_MAX / sizeof(uint32_t);
    for (size_t i = 0, j; i < n; i = j) {
        j = mt_tok_pretok_next(s, n, i);
        size_t len = j - i;
        if (len == 1) { MT_CHECK(ids_push(ctx, out, s[i])); continue; }
        if (len > CACHE_MAX_CHUNK) { MT_CHECK(mt_tok_encode_chunk(ctx, t, s + i, len, 0, out)); continue; }
        uint64_t hv = XXH3_64bits(s + i, len) | 1;  /* 0 marks an empty slot */
        size_t h = hv & t->ce_mask;
        for (;; h = (h + 1) & t->ce_mask) {
            struct cache_entry *e = &t->ce[h];
            if (e->hash == 0) break;
            if (e->hash == hv && e->key_len == len && !memcmp(t->cache_bytes + e->key_off, s + i, len)) break;
        }
        struct cache_entry *e = &t->ce[h];
        if (e->hash) {   /* hit */
            MT_CHECK(grow(ctx, (void **)&out->ids, &out->cap, out->n + e->ids_len, sizeof *out->ids));
            memcpy(out->ids + out->n, t->cache_ids + e->ids_off, e->ids_len * sizeof(uint32_t));
            out->n += e->ids_len;
            continue;
        }
        size_t before = out->n;
        MT_CHECK(mt_tok_encode_chunk(ctx, t, s + i, len, 0, out));
        size_t m = out->n - before;
        if (t->ce_n + 1 > (t->ce_mask + 1) / 2 || t->cb_n + len > CACHE_ARENA_MAX || t->ci_n + m > ids_cap) {
            cache_clear(t);
            h = hv & t->ce_mask;
            while (t->ce[h].hash) h = (h + 1) & t->ce_mask;
            e = &t->ce[h];
        }
        memcpy(t->cache_bytes + t->cb_n, s + i, len);
        memcpy(t->cache_ids + t->ci_n, out->ids + before, m * sizeof(uint32_t));
        *e = (struct cache_entry){hv, (uint32_t)t->cb_n, (uint32_t)len, (uint32_t)t->ci_n, (uint32_t)m};
        t->cb_n += len;
        t->ci_n += m;
        t->ce_n++;
    }
    return MT_OK;
}

enum mt_status mt_tok_decode(struct mt_ctx *ctx, const struct mt_tok *t, const uint32_t *ids, size_t n,
                             uint8_t **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= (uint32_t)t->vocab)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "token id %u at position %zu is outside the vocabulary (%d)",
                                ids[i], i, t->vocab);
        total += (size_t)(t->tok_off[ids[i] + 1] - t->tok_off[ids[i]]);
    }
    uint8_t *b = mt_alloc(ctx, total + 1, MT_BUCKET_OTHER);
    if (!b) return MT_ERR_OOM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = (size_t)(t->tok_off[ids[i] + 1] - t->tok_off[ids[i]]);
        memcpy(b + o, t->tok_bytes + t->tok_off[ids[i]], l);
        o += l;
    }
    *text = b;
    *len = total;
    return MT_OK;
}
