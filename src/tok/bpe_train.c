/*
 * bpe_train.c — byte-level BPE training over unique pre-token chunks.
 *
 * HOW IT WORKS
 * 1. Counting: each added text is cut by the pre-tokenizer; every chunk goes
 *    into a hash map chunk bytes -> occurrence count. Training then works on
 *    the unique chunks ("words"), each weighted by its count, never on the
 *    raw text again.
 * 2. Pair counts: count[(x, y)] = sum over words w of weight(w) * (number of
 *    adjacent (x, y) in w), kept exactly at all times; each pair also keeps a
 *    list of the words it may occur in (entries may be stale or repeated:
 *    checked when used).
 * 3. A max-heap of (count, pair) with lazy deletion gives the next merge:
 *    most frequent pair, ties to the smaller (left id, right id), so training
 *    is deterministic. Between merges only pairs that contain the new token
 *    gain count; every other pair can only lose it. So an entry whose stored
 *    count differs from the live count is re-pushed with the live count when
 *    popped, and the first entry that matches is the true maximum.
 * 4. Merging (x, y) -> z visits only the words on (x, y)'s list and applies
 *    local deltas per occurrence (left to right, non-overlapping):
 *       (p, x) -= c, (p, z) += c     for the symbol p before (already merged)
 *       (y, n) -= c, (z, n) += c     for the symbol n after
 *       (x, y) -= c
 *    then pushes every pair that contains z. Cost per merge is proportional
 *    to the occurrences of the pair, not to the corpus.
 */
#include "mt_tok.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct chunk {
    uint64_t hash;
    uint64_t off;     /* into bytes */
    uint32_t len;
    uint64_t count;
};

struct mt_tok_trainer {
    /* chunk map */
    uint8_t      *bytes;   size_t nb, cap_b;
    struct chunk *ch;      size_t nch, cap_ch;
    uint32_t     *slot;    size_t slot_mask;   /* chunk index + 1; 0 = empty */
    uint64_t      n_text;
    int           used;
};

static enum mt_status grow(struct mt_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem)
{
    return mt_grow(ctx, p, cap, need, elem, 1024, MT_BUCKET_WORKSPACE);
}

enum mt_status mt_tok_trainer_create(struct mt_ctx *ctx, struct mt_tok_trainer **out)
{
    *out = NULL;
    struct mt_tok_trainer *tr = mt_alloc(ctx, sizeof *tr, MT_BUCKET_WORKSPACE);
    if (!tr) return MT_ERR_OOM;
    tr->slot_mask = (1u << 16) - 1;
    tr->slot = mt_alloc(ctx, (tr->slot_mask + 1) * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    if (!tr->slot) { mt_free(ctx, tr); return MT_ERR_OOM; }
    *out = tr;
    return MT_OK;
}

void mt_tok_trainer_destroy(struct mt_ctx *ctx, struct mt_tok_trainer *tr)
{
    if (!tr) return;
    mt_free(ctx, tr->bytes);
    mt_free(ctx, tr->ch);
    mt_free(ctx, tr->slot);
    mt_free(ctx, tr);
}

size_t mt_tok_trainer_n_chunks(const struct mt_tok_trainer *tr) { return tr->nch; }
uint64_t mt_tok_trainer_n_bytes(const struct mt_tok_trainer *tr) { return tr->n_text; }

static enum mt_status rehash_chunks(struct mt_ctx *ctx, struct mt_tok_trainer *tr)
{
    size_t ns = (tr->slot_mask + 1) * 2;
    uint32_t *slot = mt_alloc(ctx, ns * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    if (!slot) return MT_ERR_OOM;
    for (size_t i = 0; i < tr->nch; i++) {
        size_t h = tr->ch[i].hash & (ns - 1);
        while (slot[h]) h = (h + 1) & (ns - 1);
        slot[h] = (uint32_t)(i + 1);
    }
    mt_free(ctx, tr->slot);
    tr->slot = slot;
    tr->slot_mask = ns - 1;
    return MT_OK;
}

enum mt_status mt_tok_trainer_add(struct mt_ctx *ctx, struct mt_tok_trainer *tr, const uint8_t *s, size_t n)
{
    tr->n_text += n;
    for (size_t i = 0, j; i < n; i = j) {
        j = mt_tok_pretok_next(s, n, i);
        size_t len = j - i;
        if (len > UINT32_MAX) len = UINT32_MAX;  /* cannot happen for sane input; keeps the type honest */
        uint64_t hv = XXH3_64bits(s + i, len);
        size_t h = hv & tr->slot_mask;
        for (;; h = (h + 1) & tr->slot_mask) {
            uint32_t k = tr->slot[h];
            if (!k) break;
            struct chunk *c = &tr->ch[k - 1];
            if (c->hash == hv && c->len == len && !memcmp(tr->bytes + c->off, s + i, len)) {
                c->count++;
                goto next;
            }
        }
        if (tr->nch >= UINT32_MAX - 1)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "tokenizer train: more than 4G unique chunks");
        MT_CHECK(grow(ctx, (void **)&tr->ch, &tr->cap_ch, tr->nch + 1, sizeof *tr->ch));
        MT_CHECK(grow(ctx, (void **)&tr->bytes, &tr->cap_b, tr->nb + len, 1));
        memcpy(tr->bytes + tr->nb, s + i, len);
        tr->ch[tr->nch] = (struct chunk){hv, tr->nb, (uint32_t)len, 1};
        tr->nb += len;
        tr->slot[h] = (uint32_t)(++tr->nch);
        if (tr->nch * 2 > tr->slot_mask) MT_CHECK(rehash_chunks(ctx, tr));
    next:;
    }
    return MT_OK;
}

/* ---- training state ---- */

struct hent { int64_t count; uint64_t key; };

struct bpe {
    struct mt_ctx *ctx;
    /* words */
    uint32_t *sym;      /* symbols of every word, word w at [woff[w], woff[w]+wlen[w]) */
    uint64_t *woff;
    uint32_t *wlen;
    uint64_t *wcnt;
    uint32_t *wstamp;
    size_t    nw;
    /* pairs */
    uint64_t *pkey;  int64_t *pcnt;  int32_t *phead;  uint8_t *ptouched;
    size_t    np, cap_p;
    uint32_t *pslot;  size_t pslot_mask;     /* pair index + 1 */
    /* word lists: linked entries in one pool */
    uint32_t *lw;  int32_t *lnext;  size_t nl, cap_l, cap_l2;
    /* heap */
    struct hent *heap;  size_t nh, cap_h;
    uint32_t *touched;  size_t ntouched, cap_t;
};

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static enum mt_status pair_rehash(struct bpe *b)
{
    size_t ns = (b->pslot_mask + 1) * 2;
    uint32_t *slot = mt_alloc(b->ctx, ns * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    if (!slot) return MT_ERR_OOM;
    for (size_t i = 0; i < b->np; i++) {
        size_t h = mix64(b->pkey[i]) & (ns - 1);
        while (slot[h]) h = (h + 1) & (ns - 1);
        slot[h] = (uint32_t)(i + 1);
    }
    mt_free(b->ctx, b->pslot);
    b->pslot = slot;
    b->pslot_mask = ns - 1;
    return MT_OK;
}

/* Index of pair (x, y), created with count 0 and an empty list if new. */
static enum mt_status pair_get(struct bpe *b, uint32_t x, uint32_t y, size_t *idx)
{
    uint64_t key = (uint64_t)x << 32 | y;
    size_t h = mix64(key) & b->pslot_mask;
    for (;; h = (h + 1) & b->pslot_mask) {
        uint32_t k = b->pslot[h];
        if (!k) break;
        if (b->pkey[k - 1] == key) { *idx = k - 1; return MT_OK; }
    }
    if (b->np == b->cap_p) {
        size_t cap = b->cap_p, need = b->np + 1;
        MT_CHECK(grow(b->ctx, (void **)&b->pkey, &cap, need, sizeof *b->pkey)); cap = b->cap_p;
        MT_CHECK(grow(b->ctx, (void **)&b->pcnt, &cap, need, sizeof *b->pcnt)); cap = b->cap_p;
        MT_CHECK(grow(b->ctx, (void **)&b->phead, &cap, need, sizeof *b->phead)); cap = b->cap_p;
        MT_CHECK(grow(b->ctx, (void **)&b->ptouched, &cap, need, sizeof *b->ptouched));
        b->cap_p = cap;
    }
    size_t i = b->np++;
    b->pkey[i] = key;
    b->pcnt[i] = 0;
    b->phead[i] = -1;
    b->ptouched[i] = 0;
    b->pslot[h] = (uint32_t)(i + 1);
    if (b->np * 2 > b->pslot_mask) MT_CHECK(pair_rehash(b));
    *idx = i;
    return MT_OK;
}

/* Add word w to pair i's list unless it is already the most recent entry. */
static enum mt_status list_add(struct bpe *b, size_t i, uint32_t w)
{
    if (b->phead[i] >= 0 && b->lw[b->phead[i]] == w) return MT_OK;
    if (b->nl == b->cap_l) {
        size_t cap = b->cap_l;
        MT_CHECK(grow(b->ctx, (void **)&b->lw, &cap, b->nl + 1, sizeof *b->lw)); cap = b->cap_l;
        MT_CHECK(grow(b->ctx, (void **)&b->lnext, &cap, b->nl + 1, sizeof *b->lnext));
        b->cap_l = cap;
    }
    if (b->nl >= INT32_MAX) return mt_ctx_error(b->ctx, MT_ERR_OOM, "tokenizer train: pair lists too large");
    b->lw[b->nl] = w;
    b->lnext[b->nl] = b->phead[i];
    b->phead[i] = (int32_t)b->nl++;
    return MT_OK;
}

static inline int hent_better(struct hent a, struct hent c)
{
    return a.count > c.count || (a.count == c.count && a.key < c.key);
}

static enum mt_status heap_push(struct bpe *b, struct hent e)
{
    MT_CHECK(grow(b->ctx, (void **)&b->heap, &b->cap_h, b->nh + 1, sizeof *b->heap));
    size_t i = b->nh++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hent_better(e, b->heap[p])) break;
        b->heap[i] = b->heap[p];
        i = p;
    }
    b->heap[i] = e;
    return MT_OK;
}

static struct hent heap_pop(struct bpe *b)
{
    struct hent top = b->heap[0], last = b->heap[--b->nh];
    size_t i = 0, n = b->nh;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct hent mv = last;
        if (l < n && hent_better(b->heap[l], mv)) { m = l; mv = b->heap[l]; }
        if (r < n && hent_better(b->heap[r], mv)) m = r;
        if (m == i) break;
        b->heap[i] = b->heap[m];
        i = m;
    }
    if (n > 0) b->heap[i] = last;
    return top;
}

/* count[(x,y)] += d; pairs that contain z (d > 0) get w on their list and
 * are remembered for the heap. */
static enum mt_status delta(struct bpe *b, uint32_t x, uint32_t y, int64_t d, uint32_t w)
{
    size_t i;
    MT_CHECK(pair_get(b, x, y, &i));
    b->pcnt[i] += d;
    if (d > 0) {
        MT_CHECK(list_add(b, i, w));
        if (!b->ptouched[i]) {
            b->ptouched[i] = 1;
            MT_CHECK(grow(b->ctx, (void **)&b->touched, &b->cap_t, b->ntouched + 1, sizeof *b->touched));
            b->touched[b->ntouched++] = (uint32_t)i;
        }
    }
    return MT_OK;
}

static void bpe_free(struct bpe *b)
{
    struct mt_ctx *ctx = b->ctx;
    mt_free(ctx, b->sym); mt_free(ctx, b->woff); mt_free(ctx, b->wlen); mt_free(ctx, b->wcnt);
    mt_free(ctx, b->wstamp); mt_free(ctx, b->pkey); mt_free(ctx, b->pcnt); mt_free(ctx, b->phead);
    mt_free(ctx, b->ptouched); mt_free(ctx, b->pslot); mt_free(ctx, b->lw); mt_free(ctx, b->lnext);
    mt_free(ctx, b->heap); mt_free(ctx, b->touched);
}

/* Merge pair index pi = (x, y) into z in every word on its list. */
static enum mt_status merge_pair(struct bpe *b, size_t pi, uint32_t z, uint32_t stamp)
{
    uint32_t x = (uint32_t)(b->pkey[pi] >> 32), y = (uint32_t)b->pkey[pi];
    for (int32_t e = b->phead[pi]; e >= 0; e = b->lnext[e]) {
        uint32_t w = b->lw[e];
        if (b->wstamp[w] == stamp) continue;
        b->wstamp[w] = stamp;
        uint32_t *s = b->sym + b->woff[w];
        uint32_t L = b->wlen[w], r = 0, o = 0;
        int64_t c = (int64_t)b->wcnt[w];
        while (r < L) {
            if (r + 1 < L && s[r] == x && s[r + 1] == y) {
                if (o > 0) {
                    MT_CHECK(delta(b, s[o - 1], x, -c, w));
                    MT_CHECK(delta(b, s[o - 1], z, c, w));
                }
                if (r + 2 < L) {
                    MT_CHECK(delta(b, y, s[r + 2], -c, w));
                    MT_CHECK(delta(b, z, s[r + 2], c, w));
                }
                b->pcnt[pi] -= c;
                s[o++] = z;
                r += 2;
            } else {
                s[o++] = s[r++];
            }
        }
        b->wlen[w] = o;
    }
    b->phead[pi] = -1;  /* (x, y) can never occur again: x and y are no longer adjacent anywhere */
    for (size_t k = 0; k < b->ntouched; k++) {
        size_t i = b->touched[k];
        b->ptouched[i] = 0;
        if (b->pcnt[i] > 0) MT_CHECK(heap_push(b, (struct hent){b->pcnt[i], b->pkey[i]}));
    }
    b->ntouched = 0;
    return MT_OK;
}

enum mt_status mt_tok_trainer_run(struct mt_ctx *ctx, struct mt_tok_trainer *tr, int vocab_size,
                                  FILE *progress, struct mt_tok **out)
{
    *out = NULL;
    if (vocab_size < MT_TOK_MIN_VOCAB || vocab_size > MT_TOK_MAX_VOCAB)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                            "vocab size %d out of range [%d, %d] (256 bytes + %d special + at least 1 merge)",
                            vocab_size, MT_TOK_MIN_VOCAB, MT_TOK_MAX_VOCAB, MT_TOK_N_SPECIAL);
    if (tr->n_text == 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "tokenizer train: no text");
    if (tr->used) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "tokenizer train: trainer already used");
    tr->used = 1;
    int n_merges = vocab_size - 256 - MT_TOK_N_SPECIAL;
    double t0 = mt_time_sec();

    struct bpe b = {0};
    b.ctx = ctx;
    enum mt_status rc = MT_OK;
    uint32_t *merges = mt_alloc(ctx, (size_t)2 * n_merges * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    if (!merges) return MT_ERR_OOM;

    /* words: unique chunks of >= 2 bytes (a 1-byte chunk has no pair) */
    size_t nw = 0, nsym = 0;
    for (size_t i = 0; i < tr->nch; i++)
        if (tr->ch[i].len >= 2) { nw++; nsym += tr->ch[i].len; }
    b.nw = nw;
    b.sym = mt_alloc(ctx, nsym * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    b.woff = mt_alloc(ctx, nw * sizeof(uint64_t), MT_BUCKET_WORKSPACE);
    b.wlen = mt_alloc(ctx, nw * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    b.wcnt = mt_alloc(ctx, nw * sizeof(uint64_t), MT_BUCKET_WORKSPACE);
    b.wstamp = mt_alloc(ctx, nw * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    b.pslot_mask = (1u << 16) - 1;
    b.pslot = mt_alloc(ctx, (b.pslot_mask + 1) * sizeof(uint32_t), MT_BUCKET_WORKSPACE);
    if (!b.sym || !b.woff || !b.wlen || !b.wcnt || !b.wstamp || !b.pslot) { rc = MT_ERR_OOM; goto done; }
    {
        size_t w = 0, o = 0;
        for (size_t i = 0; i < tr->nch; i++) {
            const struct chunk *c = &tr->ch[i];
            if (c->len < 2) continue;
            b.woff[w] = o;
            b.wlen[w] = c->len;
            b.wcnt[w] = c->count;
            for (uint32_t k = 0; k < c->len; k++) b.sym[o + k] = tr->bytes[c->off + k];
            for (uint32_t k = 0; k + 1 < c->len; k++) {
                size_t pi;
                MT_CHECK_GOTO(pair_get(&b, b.sym[o + k], b.sym[o + k + 1], &pi), rc, done);
                b.pcnt[pi] += (int64_t)c->count;
                MT_CHECK_GOTO(list_add(&b, pi, (uint32_t)w), rc, done);
            }
            o += c->len;
            w++;
        }
    }
    for (size_t i = 0; i < b.np; i++)
        MT_CHECK_GOTO(heap_push(&b, (struct hent){b.pcnt[i], b.pkey[i]}), rc, done);
    if (progress)
        fprintf(progress, "tokenizer: %llu bytes, %zu unique chunks, %zu pairs; learning %d merges\n",
                (unsigned long long)tr->n_text, tr->nch, b.np, n_merges);

    int m = 0;
    for (; m < n_merges; m++) {
        size_t pi = 0;
        int found = 0;
        while (b.nh > 0) {
            struct hent e = heap_pop(&b);
            uint32_t x = (uint32_t)(e.key >> 32), y = (uint32_t)e.key;
            MT_CHECK_GOTO(pair_get(&b, x, y, &pi), rc, done);
            if (b.pcnt[pi] == e.count) { found = e.count > 0; break; }
            MT_ASSERT(b.pcnt[pi] < e.count);
            if (b.pcnt[pi] > 0) MT_CHECK_GOTO(heap_push(&b, (struct hent){b.pcnt[pi], e.key}), rc, done);
        }
        if (!found) break;
        merges[2 * m] = (uint32_t)(b.pkey[pi] >> 32);
        merges[2 * m + 1] = (uint32_t)b.pkey[pi];
        MT_CHECK_GOTO(merge_pair(&b, pi, 256u + (uint32_t)m, (uint32_t)m + 1), rc, done);
        if (progress && (m + 1) % 1000 == 0)
            fprintf(progress, "tokenizer: %d/%d merges (%.1f s)\n", m + 1, n_merges, mt_time_sec() - t0);
    }
    if (m < n_merges && progress)
        fprintf(progress, "tokenizer: the corpus supports only %d merges: vocab size is %d, not %d\n", m,
                256 + m + MT_TOK_N_SPECIAL, vocab_size);
    if (m == 0) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "tokenizer train: no byte pair to merge in the corpus");
        goto done;
    }
    rc = mt_tok_create(ctx, merges, m, out);
    if (rc == MT_OK && progress)
        fprintf(progress, "tokenizer: %d merges in %.1f s\n", m, mt_time_sec() - t0);
done:
    if (rc == MT_ERR_OOM && ctx->last_status != MT_ERR_OOM)
        mt_ctx_error(ctx, MT_ERR_OOM, "tokenizer train: out of memory");
    bpe_free(&b);
    mt_free(ctx, merges);
    return rc;
}
