/*
 * zero.c — ZeRO stages 0-3 over one reduction group, driven by model hooks.
 *
 * HOW IT WORKS — layout. The model's parameters fall into units (mt_model.h:
 * 0 = wte, 1+l = block l, L+1 = final norm + head). Each parameter is owned
 * whole by one group rank. A unit's "packed" buffer holds its parameters
 * grouped by owner: [rank 0's params of u][rank 1's]...[rank n-1's], each
 * parameter 64-byte aligned, each segment padded to 16 floats. Every rank
 * computes the same layout (it depends on shapes and group size only), so:
 *
 *   - a unit's all-gather is ONE allgatherv: rank r sends its segment (which
 *     is contiguous in its owned storage) to displacement seg_displ[u][r];
 *   - a unit's gradient reduce-scatter is ONE reduce_scatterv of the packed
 *     gradient buffer: rank r receives the sum of its own segment;
 *   - stages 0-2 keep the whole model in one "full" buffer that is the
 *     concatenation of the packed units, so a unit's all-reduce (stages 0/1)
 *     and the post-update all-gather (stages 1/2) are one call each.
 *   - owned storage (stage 3 data, stage 2/3 grads) is the concatenation over
 *     units of this rank's segments.
 *
 * Gradients have their own packing (zlayout.g) with the same owners, over
 * the trainable parameters only; the data packing (zlayout.d) holds them
 * all. Without frozen parameters the two are equal offset for offset (the
 * same buffers, collectives and sums as ever). A frozen LoRA base tensor
 * has no gradient float (full, owned or scratch) and joins no reduction; a
 * unit with nothing trainable has no gradient collective (and no ZeRO-1/2
 * post-update all-gather), but ZeRO-3 still gathers it for its compute.
 *
 * HOW IT WORKS — overlap. Backward calls post_backward(u) as soon as unit
 * u's gradients are final; we check them for non-finite values (before any
 * reduction, so the message names the rank and parameter that produced
 * them) and start a non-blocking reduction. Stages 2/3 use two gradient
 * scratch buffers in turn: the reduction of unit u runs while unit u-1
 * computes into the other buffer. Stage 3 uses two gather buffers: while
 * unit u runs, unit u+1 (forward) or u-1 (backward) is being gathered. A
 * buffer that still holds the unit we need is reused without a gather (the
 * last unit of forward is the first of backward; the unit before it was
 * gathered moments ago too).
 *
 * Invariants: a gather buffer is overwritten only after its previous
 * gather completed and its unit is no longer in use; gradient scratch is
 * zeroed only after its previous reduce-scatter completed and was added
 * into owned storage.
 */
#include "mt_zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mt_core.h"
#include "../core/mt_knobs.h"

#define ZALIGN 16 /* floats: 64 bytes */

static size_t zalign(size_t n) { return (n + ZALIGN - 1) / ZALIGN * ZALIGN; }

/* One packing of the units: which parameters it holds, where. The data
 * packing holds every parameter of the engine; the gradient packing only
 * the trainable ones (a LoRA base is frozen: no gradient storage, no
 * reduction). Without frozen parameters the two are equal, offset for offset. */
struct zpack {
    size_t *uoff;         /* (P) offset of param i inside its unit's packed buf */
    size_t *ooff;         /* (P) offset of param i in its owner's storage       */
    size_t *seg_count;    /* (U*size) floats of rank r's segment of unit u      */
    size_t *seg_displ;    /* (U*size) its offset inside the packed unit         */
    size_t *unit_size;    /* (U) packed unit size (floats)                      */
    size_t *unit_base;    /* (U) offset of unit u in the full buffer            */
    size_t *own_base;     /* (U) offset of my segment of u in owned storage     */
    size_t *own_all;      /* (size) owned floats of every group rank            */
    size_t  full_total, own_total, max_unit, max_seg;
};

struct zlayout {
    int     n_params, n_units, size, rank;
    int    *owner;        /* (P) comm rank owning param i                       */
    int    *unit;         /* (P) unit of param i                                */
    struct zpack d, g;    /* data packing (every param), gradient packing (trainable) */
};

/* Is parameter i in the gradient packing? In the engine and not frozen. */
static int has_grad(const struct zlayout *l, const struct mt_param *p, int i)
{
    return l->owner[i] >= 0 && !p[i].frozen;
}

struct pending {
    struct mt_comm_req *req;
    int                 unit;   /* -1: none */
};

struct mt_zero {
    struct mt_ctx         *ctx;
    const struct mt_ops_i *ops;
    struct mt_comm        *comm;
    struct mt_model       *model;
    struct mt_param       *params;  /* the model's (P) */
    int                    stage, reshard;
    struct zlayout         lay;

    float *full;                 /* stages 0-2: (full_total) PARAMS; stage 3 !reshard: COMM */
    float *gfull;                /* stages 0/1: (full_total) GRADS                           */
    float *own_data;             /* stage 3: (own_total) PARAMS                              */
    float *own_grad;             /* stages 2/3: (own_total) GRADS                            */
    float *gbuf[2];              /* stage 3 reshard: (max_unit) COMM gather buffers          */
    int    gholds[2];            /* unit held (or being gathered) by gbuf[b], -1 none        */
    struct mt_comm_req *greq[2]; /* pending gather into gbuf[b]                              */
    int    gcur;                 /* gbuf index of the unit in use, -1 none                   */
    int   *gathered;             /* (U) stage 3 !reshard: unit gathered into full this step  */
    float *gscr[2], *grecv[2];   /* stages 2/3: (max_unit) grad scratch, (max_seg) recv      */
    struct pending rs[2];        /* pending reduce-scatter from gscr[b] into grecv[b]        */
    int    gslot;                /* next scratch slot                                        */
    struct pending *ar;          /* (U) stages 0/1 pending all-reduces                       */
    int    n_ar;
    /* grad_reduce_dtype=bf16 (group size > 1): the reductions run on bf16
     * copies (cast before, widened back into the fp32 buffer after) */
    int       red16;
    uint16_t *ar16;              /* stages 0/1: (full_total) COMM, bf16 of gfull             */
    uint16_t *rs16s[2], *rs16r[2]; /* stages 2/3: (max_unit) send, (max_seg) recv, COMM       */

    struct mt_param *views;      /* optimizer views (n_views)                                */
    int             *view_param; /* (n_views) model index of each view                      */
    int              n_views;
    const float    **nrm_x;      /* (P + 1) host list: the norm's sumsq_multi, the marks'    */
    size_t          *nrm_n;      /* (P + 1) its sizes                                        */
    int             *nf_slot;    /* (P) host: nonfinite_mark's flag index of each tensor     */
    float           *nf_flags;   /* (P) backend, OTHER: NaN where a parameter's gradient was
                                  * non-finite before its reduction this step, else 0        */
    int   last_mb, step;
    int   nan_step, nan_unit;
    int   fresh_nan_step;        /* test: the step whose first-write gradients start as NaN   */
    int   overlap;               /* MT_ZERO_OVERLAP (default 1): 0 waits for every collective at once */
    int   synced;                /* stages 1/2: a sync gathered every unit (after a load)    */
    struct mt_zero_stats st;
};

/* ------------------------------------------------------------------ */
/* layout (pure)                                                      */
/* ------------------------------------------------------------------ */

static void pack_free(struct mt_ctx *ctx, struct zpack *k)
{
    mt_free(ctx, k->uoff);
    mt_free(ctx, k->ooff);
    mt_free(ctx, k->seg_count);
    mt_free(ctx, k->seg_displ);
    mt_free(ctx, k->unit_size);
    mt_free(ctx, k->unit_base);
    mt_free(ctx, k->own_base);
    mt_free(ctx, k->own_all);
    memset(k, 0, sizeof *k);
}

static void layout_free(struct mt_ctx *ctx, struct zlayout *l)
{
    mt_free(ctx, l->owner);
    mt_free(ctx, l->unit);
    pack_free(ctx, &l->d);
    pack_free(ctx, &l->g);
    memset(l, 0, sizeof *l);
}

/* Owner of each parameter: largest first (ties: lower index) to the rank
 * with the least owned floats so far (ties: lower rank). Deterministic.
 * O(P log P + P log size): a sort by (numel desc, index asc) and a binary
 * min-heap of ranks keyed by (load, rank), whose root is exactly "the
 * least-loaded rank, ties to the lower rank". */
struct okey { size_t numel; int idx; };

static int okey_cmp(const void *a, const void *b)
{
    const struct okey *x = a, *y = b;
    if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int heap_less(const size_t *load, const int *h, int a, int b)
{
    return load[h[a]] < load[h[b]] || (load[h[a]] == load[h[b]] && h[a] < h[b]);
}

static void assign_owners(const struct mt_param *p, int P, const unsigned char *select, int size, int *owner,
                          size_t *load, int *heap, struct okey *order)
{
    int n = 0;
    for (int i = 0; i < P; i++) {
        owner[i] = -1;   /* not in this engine */
        if (!select || select[i]) order[n++] = (struct okey){p[i].numel, i};
    }
    qsort(order, (size_t)n, sizeof *order, okey_cmp);
    for (int r = 0; r < size; r++) { load[r] = 0; heap[r] = r; }   /* ascending ranks: a valid heap */
    for (int t = 0; t < n; t++) {
        int i = order[t].idx, best = heap[0];
        owner[i] = best;
        load[best] += zalign(p[i].numel);
        for (int k = 0;;) {   /* the root grew: sift it down */
            int c = 2 * k + 1;
            if (c >= size) break;
            if (c + 1 < size && heap_less(load, heap, c + 1, c)) c++;
            if (!heap_less(load, heap, c, k)) break;
            int tmp = heap[k]; heap[k] = heap[c]; heap[c] = tmp;
            k = c;
        }
    }
}

/* Host bytes (bucket OTHER) of one packing's arrays, and of the layout
 * arrays layout_build keeps (owner, unit, two packings). */
static size_t pack_other_bytes(int P, int U, int size)
{
    return (size_t)P * 2 * sizeof(size_t) + (size_t)U * (size_t)size * 2 * sizeof(size_t) +
           (size_t)U * 3 * sizeof(size_t) + (size_t)size * sizeof(size_t);
}

static size_t layout_other_bytes(int P, int U, int size)
{
    return (size_t)P * 2 * sizeof(int) + 2 * pack_other_bytes(P, U, size);
}

static int pack_alloc(struct mt_ctx *ctx, struct zpack *k, int P, int U, int size)
{
    k->uoff = mt_alloc(ctx, (size_t)P * sizeof(size_t), MT_BUCKET_OTHER);
    k->ooff = mt_alloc(ctx, (size_t)P * sizeof(size_t), MT_BUCKET_OTHER);
    k->seg_count = mt_alloc(ctx, (size_t)U * size * sizeof(size_t), MT_BUCKET_OTHER);
    k->seg_displ = mt_alloc(ctx, (size_t)U * size * sizeof(size_t), MT_BUCKET_OTHER);
    k->unit_size = mt_alloc(ctx, (size_t)U * sizeof(size_t), MT_BUCKET_OTHER);
    k->unit_base = mt_alloc(ctx, (size_t)U * sizeof(size_t), MT_BUCKET_OTHER);
    k->own_base = mt_alloc(ctx, (size_t)U * sizeof(size_t), MT_BUCKET_OTHER);
    k->own_all = mt_alloc(ctx, (size_t)size * sizeof(size_t), MT_BUCKET_OTHER);
    return k->uoff && k->ooff && k->seg_count && k->seg_displ && k->unit_size && k->unit_base && k->own_base &&
           k->own_all;
}

/* One packing of the parameters `in` marks (owners already assigned): per
 * unit, segment sizes by owner, then offsets in (owner, index) order.
 * O(P + U*size): the parameters of unit u are the index range [i0, i1).
 * cursor: (size) scratch. */
static void pack_build(const struct zlayout *l, const struct mt_param *p, const unsigned char *in, size_t *cursor,
                       struct zpack *k)
{
    const int P = l->n_params, U = l->n_units, size = l->size, rank = l->rank;
    for (int r = 0; r < size; r++) k->own_all[r] = 0;
    k->max_unit = k->max_seg = 0;
    size_t base = 0;
    for (int u = 0, i0 = 0; u < U; u++) {
        int i1 = i0;
        while (i1 < P && l->unit[i1] == u) i1++;
        size_t *cnt = k->seg_count + (size_t)u * size, *dis = k->seg_displ + (size_t)u * size;
        for (int r = 0; r < size; r++) cnt[r] = 0;
        for (int i = i0; i < i1; i++)
            if (in[i]) cnt[l->owner[i]] += zalign(p[i].numel);
        size_t off = 0;
        for (int r = 0; r < size; r++) {
            dis[r] = off;
            cursor[r] = off;
            if (r == rank) k->own_base[u] = k->own_all[r];
            off += cnt[r];
            if (cnt[r] > k->max_seg) k->max_seg = cnt[r];
        }
        for (int i = i0; i < i1; i++) {
            k->uoff[i] = k->ooff[i] = 0;
            if (!in[i]) continue;
            int r = l->owner[i];
            k->uoff[i] = cursor[r];
            k->ooff[i] = k->own_all[r] + (cursor[r] - dis[r]);
            cursor[r] += zalign(p[i].numel);
        }
        for (int r = 0; r < size; r++) k->own_all[r] += cnt[r];
        k->unit_size[u] = off;
        k->unit_base[u] = base;
        base += off;
        if (off > k->max_unit) k->max_unit = off;
        i0 = i1;
    }
    k->full_total = base;
    k->own_total = k->own_all[rank];
}

static enum mt_status layout_build(struct mt_ctx *ctx, const struct mt_model *m, const struct mt_param *p, int P,
                                   const unsigned char *select, int size, int rank, struct zlayout *l)
{
    memset(l, 0, sizeof *l);
    int U = mt_model_n_units(m);
    l->n_params = P;
    l->n_units = U;
    l->size = size;
    l->rank = rank;
    l->owner = mt_alloc(ctx, (size_t)P * sizeof(int), MT_BUCKET_OTHER);
    l->unit = mt_alloc(ctx, (size_t)P * sizeof(int), MT_BUCKET_OTHER);
    int ok = pack_alloc(ctx, &l->d, P, U, size);
    ok = pack_alloc(ctx, &l->g, P, U, size) && ok;
    /* temporaries */
    size_t *load = mt_alloc(ctx, (size_t)size * sizeof(size_t), MT_BUCKET_OTHER);
    size_t *cursor = mt_alloc(ctx, (size_t)size * sizeof(size_t), MT_BUCKET_OTHER);
    int *heap = mt_alloc(ctx, (size_t)size * sizeof(int), MT_BUCKET_OTHER);
    struct okey *order = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof(struct okey), MT_BUCKET_OTHER);
    unsigned char *in = mt_alloc(ctx, (size_t)(P > 0 ? P : 1), MT_BUCKET_OTHER);
    if (!ok || !l->owner || !l->unit || !load || !cursor || !heap || !order || !in) {
        mt_free(ctx, load);
        mt_free(ctx, cursor);
        mt_free(ctx, heap);
        mt_free(ctx, order);
        mt_free(ctx, in);
        layout_free(ctx, l);
        return MT_ERR_OOM;
    }
    /* ownership over every parameter of the engine, frozen or not: the data
     * layout (and so the gathers) is the same as without LoRA's freezing */
    assign_owners(p, P, select, size, l->owner, load, heap, order);
    for (int i = 0; i < P; i++) {
        l->unit[i] = mt_model_param_unit(m, i);
        MT_ASSERT(l->unit[i] >= 0 && l->unit[i] < U);
        MT_ASSERT(i == 0 || l->unit[i] >= l->unit[i - 1]); /* units are contiguous in model order */
    }
    for (int i = 0; i < P; i++) in[i] = l->owner[i] >= 0;
    pack_build(l, p, in, cursor, &l->d);
    for (int i = 0; i < P; i++) in[i] = (unsigned char)has_grad(l, p, i);
    pack_build(l, p, in, cursor, &l->g);
    mt_free(ctx, load);
    mt_free(ctx, cursor);
    mt_free(ctx, heap);
    mt_free(ctx, order);
    mt_free(ctx, in);
    return MT_OK;
}

/* Buffer sizes per bucket for one stage (floats) of group rank r, shared
 * by plan and create. Parameters follow the data packing, gradients (and
 * their reduce-scatter scratch) the gradient packing: a frozen parameter
 * has no gradient float anywhere. */
struct zsizes { size_t full, full_bucket, gfull, own_data, own_grad, gbuf, gscr, grecv, ar16, rs16s, rs16r; };

/* grad_reduce_dtype=bf16 and a group to reduce over (one rank reduces nothing: no rounding) */
static int reduce_bf16(const struct mt_model *model, int group_size)
{
    return group_size > 1 && !strcmp(mt_model_cfg(model)->grad_reduce_dtype, "bf16");
}

static struct zsizes zero_sizes(const struct zlayout *l, int r, int stage, int reshard, int red16)
{
    struct zsizes s;
    memset(&s, 0, sizeof s);
    if (red16 && stage <= 1) s.ar16 = l->g.full_total;
    if (red16 && stage >= 2) { s.rs16s = l->g.max_unit; s.rs16r = l->g.max_seg; }
    if (stage <= 2) { s.full = l->d.full_total; s.full_bucket = MT_BUCKET_PARAMS; }
    if (stage <= 1) s.gfull = l->g.full_total;
    if (stage == 3) {
        s.own_data = l->d.own_all[r];
        if (reshard) s.gbuf = l->d.max_unit;
        else { s.full = l->d.full_total; s.full_bucket = MT_BUCKET_COMM; }
    }
    if (stage >= 2) {
        s.own_grad = l->g.own_all[r];
        s.gscr = l->g.max_unit;
        s.grecv = l->g.max_seg;
    }
    return s;
}

/* Host bookkeeping (OTHER) of one engine: the struct, the layout arrays,
 * the pending-reduction and gathered tables, the optimizer views. */
static size_t engine_other_bytes(int P, int U, int size)
{
    size_t p1 = (size_t)(P > 0 ? P : 1);
    return sizeof(struct mt_zero) + layout_other_bytes(P, U, size) + (size_t)U * sizeof(struct pending) +
           (size_t)U * sizeof(int) + p1 * sizeof(struct mt_param) + p1 * sizeof(int) +
           (p1 + 1) * (sizeof(const float *) + sizeof(size_t)) + p1 * sizeof(int) + p1 * sizeof(float);
}

/* bytes[] += what create allocates for these sizes (zbuf allocates nothing for 0). */
static void add_sizes(const struct zsizes *s, size_t bytes[MT_BUCKET_COUNT])
{
    const size_t f = sizeof(float);
    bytes[s->full_bucket] += s->full * f;
    bytes[MT_BUCKET_GRADS] += s->gfull * f + s->own_grad * f;
    bytes[MT_BUCKET_PARAMS] += s->own_data * f;
    bytes[MT_BUCKET_COMM] += 2 * (s->gbuf + s->gscr + s->grecv) * f;
    bytes[MT_BUCKET_COMM] += (s->ar16 + 2 * (s->rs16s + s->rs16r)) * sizeof(uint16_t);
}

int mt_zero_runs_optimizer(int owner, int group_rank, int stage)
{
    return owner >= 0 && (stage == 0 || owner == group_rank);
}

enum mt_status mt_zero_plan_all(struct mt_ctx *ctx, const struct mt_model *model, const unsigned char *select,
                                int group_size, int stage, int reshard_after_forward, size_t *bytes, int *owner)
{
    if (group_size < 1 || stage < -1 || stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "ZeRO plan: group size %d, stage %d", group_size, stage);
    int P;
    struct mt_param *p = mt_model_params((struct mt_model *)model, &P);
    struct zlayout l;
    MT_CHECK(layout_build(ctx, model, p, P, select, group_size, 0, &l));
    size_t other = engine_other_bytes(P, l.n_units, group_size);
    int s0 = stage < 0 ? 0 : stage, s1 = stage < 0 ? 3 : stage;
    for (int st = s0; st <= s1; st++)
        for (int r = 0; r < group_size; r++) {
            size_t *b = bytes + ((size_t)(st - s0) * group_size + r) * MT_BUCKET_COUNT;
            for (int k = 0; k < MT_BUCKET_COUNT; k++) b[k] = 0;
            struct zsizes s = zero_sizes(&l, r, st, reshard_after_forward, reduce_bf16(model, group_size));
            add_sizes(&s, b);
            b[MT_BUCKET_OTHER] += other;
        }
    if (owner) memcpy(owner, l.owner, (size_t)P * sizeof(int));
    layout_free(ctx, &l);
    return MT_OK;
}

void mt_zero_plan_bytes(const struct mt_model *model, const unsigned char *select, int group_size, int group_rank,
                        int stage, int reshard_after_forward, size_t bytes[MT_BUCKET_COUNT])
{
    struct mt_ctx tmp;
    mt_ctx_init(&tmp);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) bytes[b] = 0;
    int P;
    struct mt_param *p = mt_model_params((struct mt_model *)model, &P);
    struct zlayout l;
    if (layout_build(&tmp, model, p, P, select, group_size, group_rank, &l) != MT_OK) return;
    struct zsizes s = zero_sizes(&l, group_rank, stage, reshard_after_forward, reduce_bf16(model, group_size));
    add_sizes(&s, bytes);
    bytes[MT_BUCKET_OTHER] += engine_other_bytes(P, l.n_units, group_size);
    layout_free(&tmp, &l);
}

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

/* unit u's segment counts / displacements in packing k (z->lay.d or z->lay.g) */
static const size_t *counts_of(const struct mt_zero *z, const struct zpack *k, int u)
{
    return k->seg_count + (size_t)u * z->lay.size;
}
static const size_t *displs_of(const struct mt_zero *z, const struct zpack *k, int u)
{
    return k->seg_displ + (size_t)u * z->lay.size;
}

static enum mt_status timed_wait(struct mt_ctx *ctx, struct mt_zero *z, struct mt_comm_req **req)
{
    if (!*req) return MT_OK;
    double t0 = mt_time_sec();
    enum mt_status rc = mt_comm_wait(ctx, *req);
    *req = NULL;
    z->st.wait_s += mt_time_sec() - t0;
    return rc;
}

static void count_coll(struct mt_zero *z, enum mt_zero_coll k, size_t floats)
{
    /* the reductions move bf16 under grad_reduce_dtype=bf16 */
    z->st.bytes[k] += (double)floats * (z->red16 && k != MT_ZERO_ALLGATHER ? sizeof(uint16_t) : sizeof(float));
    z->st.calls[k]++;
}

/* Point unit u's parameters' data at a packed unit buffer. */
static void point_data(struct mt_zero *z, int u, float *packed)
{
    for (int i = 0; i < z->lay.n_params; i++)
        if (z->lay.unit[i] == u && z->lay.owner[i] >= 0) z->params[i].data = packed + z->lay.d.uoff[i];
}

/* Point unit u's trainable parameters' grads at a packed unit gradient
 * buffer (gradient packing); a frozen parameter's grad stays NULL. */
static void point_grad(struct mt_zero *z, int u, float *packed)
{
    for (int i = 0; i < z->lay.n_params; i++)
        if (z->lay.unit[i] == u && has_grad(&z->lay, z->params, i)) z->params[i].grad = packed + z->lay.g.uoff[i];
}

/* ------------------------------------------------------------------ */
/* stage 3: gathers                                                   */
/* ------------------------------------------------------------------ */

static enum mt_status start_gather(struct mt_ctx *ctx, struct mt_zero *z, int u, float *dst,
                                   struct mt_comm_req **req)
{
    const struct zpack *d = &z->lay.d;
    count_coll(z, MT_ZERO_ALLGATHER, d->unit_size[u]);
    return mt_comm_iallgatherv(ctx, z->comm, dst, z->own_data + d->own_base[u], counts_of(z, d, u),
                               displs_of(z, d, u), MT_DTYPE_F32, req);
}

/* Make unit u's parameters available (stage 3) and prefetch unit u+dir. */
static enum mt_status ensure_unit(struct mt_ctx *ctx, struct mt_zero *z, int u, int dir)
{
    const int U = z->lay.n_units;
    if (!z->reshard) {
        /* keep every gathered unit for the rest of the step: one gather per unit per step */
        if (!z->gathered[u]) {
            struct mt_comm_req *req = NULL;
            MT_CHECK(start_gather(ctx, z, u, z->full + z->lay.d.unit_base[u], &req));
            MT_CHECK(timed_wait(ctx, z, &req));
            z->gathered[u] = 1;
        }
        point_data(z, u, z->full + z->lay.d.unit_base[u]);
        return MT_OK;
    }
    int b = z->gholds[0] == u ? 0 : (z->gholds[1] == u ? 1 : -1);
    if (b < 0) {
        b = z->gcur < 0 ? 0 : 1 - z->gcur;         /* never the buffer of the unit in use */
        MT_CHECK(timed_wait(ctx, z, &z->greq[b]));  /* a stale prefetch into it */
        z->gholds[b] = u;
        MT_CHECK(start_gather(ctx, z, u, z->gbuf[b], &z->greq[b]));
    }
    MT_CHECK(timed_wait(ctx, z, &z->greq[b]));
    z->gcur = b;
    point_data(z, u, z->gbuf[b]);
    int nu = u + dir, ob = 1 - b;
    if (z->overlap && nu >= 0 && nu < U && z->gholds[ob] != nu) {
        MT_CHECK(timed_wait(ctx, z, &z->greq[ob]));
        z->gholds[ob] = nu;
        MT_CHECK(start_gather(ctx, z, nu, z->gbuf[ob], &z->greq[ob]));
    }
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* stages 2/3: gradient reduce-scatter                                */
/* ------------------------------------------------------------------ */

/* Complete a pending gradient all-reduce (stages 0/1); under bf16 widen the
 * reduced copy back into the unit's fp32 gradients. */
static enum mt_status finish_ar(struct mt_ctx *ctx, struct mt_zero *z, struct pending *pd)
{
    int had = pd->req != NULL;
    MT_CHECK(timed_wait(ctx, z, &pd->req));
    if (had && z->red16) {
        const struct zpack *g = &z->lay.g;
        z->ops->widen_bf16(z->ops->be, z->gfull + g->unit_base[pd->unit], z->ar16 + g->unit_base[pd->unit], g->unit_size[pd->unit]);
    }
    return MT_OK;
}

/* Complete the reduce-scatter pending on slot s and add it into owned grads. */
static enum mt_status finish_rs(struct mt_ctx *ctx, struct mt_zero *z, int s)
{
    if (z->rs[s].unit < 0) return MT_OK;
    MT_CHECK(timed_wait(ctx, z, &z->rs[s].req));
    const struct zpack *g = &z->lay.g;
    int u = z->rs[s].unit;
    size_t n = counts_of(z, g, u)[z->lay.rank];
    if (n && z->red16) z->ops->widen_bf16(z->ops->be, z->grecv[s], z->rs16r[s], n);   /* the bf16 sum, back in fp32 */
    if (n) z->ops->axpby(z->ops->be, z->own_grad + g->own_base[u], z->grecv[s], 1.0f, 1.0f, n);
    z->rs[s].unit = -1;
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* hooks                                                              */
/* ------------------------------------------------------------------ */

static enum mt_status hook_pre_forward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero *z = user;
    if (z->lay.d.unit_size[u] == 0) return MT_OK;   /* no parameter of this engine in unit u */
    return z->stage == 3 ? ensure_unit(ctx, z, u, +1) : MT_OK;
}

/* zero len gradient floats at run (none: NULL), counted */
static void zero_run(struct mt_zero *z, float *run, size_t len)
{
    if (!run) return;
    z->ops->fill(z->ops->be, run, 0.0f, len);
    z->st.zeroed_floats += (double)len;
}

/* A unit whose parameters are all frozen (LoRA: the embedding, the head,
 * a layer without adapters) is still gathered (stage 3: its forward and
 * backward need the weights) but has no gradient scratch and no reduction. */
static enum mt_status hook_pre_backward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero *z = user;
    if (z->lay.d.unit_size[u] == 0) return MT_OK;
    if (z->stage == 3) MT_CHECK(ensure_unit(ctx, z, u, -1));
    if (z->stage >= 2 && z->lay.g.unit_size[u] > 0) {
        int s = z->gslot;
        z->gslot = 1 - s;
        MT_CHECK(finish_rs(ctx, z, s));
        z->ops->fill(z->ops->be, z->gscr[s], 0.0f, z->lay.g.unit_size[u]);
        z->st.zeroed_floats += (double)z->lay.g.unit_size[u];
        point_grad(z, u, z->gscr[s]);
    }
    return MT_OK;
}

/* A group of one rank reduces nothing: its gradients at the norm are this
 * rank's own, so a non-finite one makes the norm non-finite and is found
 * afterwards by a scan (mt_zero_nonfinite_culprit), with no marking pass over
 * them before the (absent) reduction (one GPU: a read of every gradient a
 * step saved). Needs the norm's one-pass sumsq_multi, which carries no marks then. */
static int unmarked(const struct mt_zero *z) { return z->lay.size == 1 && z->ops->sumsq_multi; }

static enum mt_status hook_post_backward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero *z = user;
    const struct zpack *gp = &z->lay.g;
    if (gp->unit_size[u] == 0) return MT_OK;   /* nothing of this engine in u trains */
    const struct mt_ops_i *ops = z->ops;
    /* the unit's packed gradient buffer for this microbatch (or accumulation) */
    float *g = z->stage >= 2 ? z->gscr[1 - z->gslot] : z->gfull + gp->unit_base[u];
    /* a gradient left to its first GEMM must have had it: else it holds last
     * step's values, plus whatever a writer that does not ask grad_beta added
     * (a spec flagged MT_BIND_DW_GEMM wrongly). Zeroing it here would hide
     * that writer's sum; a block whose GEMM can see no rows must not flag it. */
    for (int i = 0; i < z->lay.n_params; i++)
        if (z->lay.unit[i] == u && has_grad(&z->lay, z->params, i) && !z->params[i].grad_live)
            return mt_ctx_error(ctx, MT_ERR_RUNTIME,
                                "the gradient of %s is left to its first GEMM (grad_gemm) but no GEMM wrote it "
                                "in this microbatch's backward",
                                z->params[i].name);
    if (z->nan_step == z->step && z->nan_unit == u) {
        float nan = NAN;
        for (int i = 0; i < z->lay.n_params; i++)
            if (z->lay.unit[i] == u && has_grad(&z->lay, z->params, i)) {
                ops->copy_from_host(ops->be, z->params[i].grad, &nan, sizeof nan);
                break;
            }
    }
    /* non-finite check BEFORE the reduction: the culprit is this rank. With
     * nonfinite_mark (issue 27 item 3) the unit's gradients mark their flags
     * on the device, no host wait: the flags join the gradient norm and are
     * read only if it is not finite (mt_zero_set_nonfinite_culprit); a group of
     * one rank is not marked at all (unmarked) */
    if (unmarked(z)) {
        /* nothing before the (absent) reduction */
    } else if (ops->nonfinite_mark && ops->sumsq_multi && z->nf_flags) {
        int c = 0;
        for (int i = 0; i < z->lay.n_params; i++)
            if (z->lay.unit[i] == u && has_grad(&z->lay, z->params, i)) {
                z->nrm_x[c] = z->params[i].grad;
                z->nrm_n[c] = z->params[i].numel;
                z->nf_slot[c++] = i;
            }
        ops->nonfinite_mark(ops->be, z->nf_flags, z->nrm_x, z->nrm_n, z->nf_slot, c);
    } else if (!ops->all_finite(ops->be, g, gp->unit_size[u])) {
        const char *name = "(padding)";
        for (int i = 0; i < z->lay.n_params; i++)
            if (z->lay.unit[i] == u && has_grad(&z->lay, z->params, i) &&
                !ops->all_finite(ops->be, z->params[i].grad, z->params[i].numel)) {
                name = z->params[i].name;
                break;
            }
        return mt_ctx_error(ctx, MT_ERR_NUMERIC,
                            "non-finite gradient on rank %d in parameter %s at step %d (found before the reduction)",
                            ctx->rank, name, z->step);
    }
    if (z->stage >= 2) {
        int s = 1 - z->gslot;
        z->rs[s].unit = u;
        count_coll(z, MT_ZERO_REDUCE_SCATTER, gp->unit_size[u]);
        if (z->red16) {   /* bf16 on the wire: finish_rs widens the sum */
            ops->cast_bf16(ops->be, z->rs16s[s], g, gp->unit_size[u]);
            MT_CHECK(mt_comm_ireduce_scatterv(ctx, z->comm, z->rs16r[s], z->rs16s[s], counts_of(z, gp, u),
                                              displs_of(z, gp, u), MT_DTYPE_BF16, &z->rs[s].req));
        } else {
            MT_CHECK(mt_comm_ireduce_scatterv(ctx, z->comm, z->grecv[s], g, counts_of(z, gp, u), displs_of(z, gp, u),
                                              MT_DTYPE_F32, &z->rs[s].req));
        }
        return z->overlap ? MT_OK : finish_rs(ctx, z, s);
    }
    if (!z->last_mb) return MT_OK;
    struct pending *pd = &z->ar[z->n_ar++];
    pd->unit = u;
    count_coll(z, MT_ZERO_ALLREDUCE, gp->unit_size[u]);
    if (z->red16) {   /* bf16 on the wire: finish_ar widens the sum back into g */
        ops->cast_bf16(ops->be, z->ar16 + gp->unit_base[u], g, gp->unit_size[u]);
        MT_CHECK(mt_comm_iallreduce(ctx, z->comm, z->ar16 + gp->unit_base[u], gp->unit_size[u], MT_DTYPE_BF16,
                                    MT_REDOP_SUM, &pd->req));
    } else {
        MT_CHECK(mt_comm_iallreduce(ctx, z->comm, g, gp->unit_size[u], MT_DTYPE_F32, MT_REDOP_SUM, &pd->req));
    }
    return z->overlap ? MT_OK : finish_ar(ctx, z, pd);
}

/* ------------------------------------------------------------------ */
/* create / destroy                                                   */
/* ------------------------------------------------------------------ */

static float *zbuf(struct mt_ctx *ctx, const struct mt_ops_i *ops, size_t n, enum mt_bucket b, int *fail)
{
    if (n == 0 || *fail) return NULL;
    float *p = ops->buf_alloc(ops->be, ctx, n * sizeof(float), b);
    if (!p) *fail = 1;
    else ops->fill(ops->be, p, 0.0f, n);
    return p;
}

/* a bf16 staging buffer (COMM) of n elements; written before every use */
static uint16_t *zbuf16(struct mt_ctx *ctx, const struct mt_ops_i *ops, size_t n, int *fail)
{
    if (n == 0 || *fail) return NULL;
    uint16_t *p = ops->buf_alloc(ops->be, ctx, n * sizeof(uint16_t), MT_BUCKET_COMM);
    if (!p) *fail = 1;
    return p;
}

enum mt_status mt_zero_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct mt_comm *comm, int stage,
                              int reshard_after_forward, struct mt_model *model, const unsigned char *select,
                              struct mt_zero **out)
{
    *out = NULL;
    if (stage < 0 || stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "ZeRO stage must be 0, 1, 2 or 3 (got %d)", stage);
    size_t live0[MT_BUCKET_COUNT];   /* the plan must be what create allocates: checked below */
    for (int b = 0; b < MT_BUCKET_COUNT; b++) live0[b] = ctx->bytes_live[b];
    struct mt_zero *z = mt_alloc(ctx, sizeof *z, MT_BUCKET_OTHER);
    if (!z) return MT_ERR_OOM;
    memset(z, 0, sizeof *z);
    z->ctx = ctx;
    z->ops = ops;
    z->comm = comm;
    z->model = model;
    z->stage = stage;
    z->reshard = reshard_after_forward;
    z->gholds[0] = z->gholds[1] = -1;
    z->gcur = -1;
    z->rs[0].unit = z->rs[1].unit = -1;
    z->nan_step = z->fresh_nan_step = -1;
    /* knob zero_overlap (env MT_ZERO_OVERLAP; in the receipt): 0 completes every
     * collective as soon as it is started and prefetches nothing, so a run
     * measures what overlap hides */
    z->overlap = mt_knob_int(ctx, MT_KNOB_ZERO_OVERLAP) != 0;
    int P;
    z->params = mt_model_params(model, &P);
    enum mt_status rc = layout_build(ctx, model, z->params, P, select, mt_comm_size(comm), mt_comm_rank(comm), &z->lay);
    if (rc != MT_OK) { mt_free(ctx, z); return rc; }
    const struct zlayout *l = &z->lay;
    z->red16 = reduce_bf16(model, l->size);
    if (z->red16 && (!mt_ops_supports(ops, cast_bf16) || !mt_ops_supports(ops, widen_bf16))) {
        mt_zero_destroy(ctx, z);
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "grad_reduce_dtype=bf16: backend %s has no bf16 conversions",
                            ops->name);
    }
    struct zsizes s = zero_sizes(l, l->rank, stage, reshard_after_forward, z->red16);
    int fail = 0;
    z->full = zbuf(ctx, ops, s.full, (enum mt_bucket)s.full_bucket, &fail);
    z->gfull = zbuf(ctx, ops, s.gfull, MT_BUCKET_GRADS, &fail);
    z->own_data = zbuf(ctx, ops, s.own_data, MT_BUCKET_PARAMS, &fail);
    z->own_grad = zbuf(ctx, ops, s.own_grad, MT_BUCKET_GRADS, &fail);
    for (int b = 0; b < 2; b++) {
        z->gbuf[b] = zbuf(ctx, ops, s.gbuf, MT_BUCKET_COMM, &fail);
        z->gscr[b] = zbuf(ctx, ops, s.gscr, MT_BUCKET_COMM, &fail);
        z->grecv[b] = zbuf(ctx, ops, s.grecv, MT_BUCKET_COMM, &fail);
        z->rs16s[b] = zbuf16(ctx, ops, s.rs16s, &fail);
        z->rs16r[b] = zbuf16(ctx, ops, s.rs16r, &fail);
    }
    z->ar16 = zbuf16(ctx, ops, s.ar16, &fail);
    z->ar = mt_alloc(ctx, (size_t)l->n_units * sizeof(struct pending), MT_BUCKET_OTHER);
    z->gathered = mt_alloc(ctx, (size_t)l->n_units * sizeof(int), MT_BUCKET_OTHER);
    z->views = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof(struct mt_param), MT_BUCKET_OTHER);
    z->view_param = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof(int), MT_BUCKET_OTHER);
    z->nrm_x = mt_alloc(ctx, (size_t)((P > 0 ? P : 1) + 1) * sizeof(const float *), MT_BUCKET_OTHER);
    z->nrm_n = mt_alloc(ctx, (size_t)((P > 0 ? P : 1) + 1) * sizeof(size_t), MT_BUCKET_OTHER);
    z->nf_slot = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof(int), MT_BUCKET_OTHER);
    z->nf_flags = zbuf(ctx, ops, (size_t)(P > 0 ? P : 1), MT_BUCKET_OTHER, &fail);
    if (fail || !z->ar || !z->gathered || !z->views || !z->view_param || !z->nrm_x || !z->nrm_n || !z->nf_slot) {
        mt_zero_destroy(ctx, z);
        return MT_ERR_OOM;
    }
    memset(z->gathered, 0, (size_t)l->n_units * sizeof(int));

    /* model pointers: stages 0-2 data in full; stages 0/1 grads in gfull
     * (a frozen parameter has none: its grad stays NULL at every stage) */
    for (int i = 0; i < P; i++) {
        if (l->owner[i] < 0) continue;   /* another engine's parameter */
        int u = l->unit[i];
        z->params[i].data = stage <= 2 ? z->full + l->d.unit_base[u] + l->d.uoff[i] : NULL;
        z->params[i].grad = stage <= 1 && has_grad(l, z->params, i) ? z->gfull + l->g.unit_base[u] + l->g.uoff[i] : NULL;
    }
    /* optimizer views: stage 0 every parameter, else the owned ones */
    for (int i = 0; i < P; i++) {
        if (!mt_zero_runs_optimizer(l->owner[i], l->rank, stage)) continue;
        z->view_param[z->n_views] = i;
        struct mt_param *v = &z->views[z->n_views++];
        *v = z->params[i];
        if (stage >= 2) v->grad = has_grad(l, z->params, i) ? z->own_grad + l->g.ooff[i] : NULL;
        if (stage == 3) v->data = z->own_data + l->d.ooff[i];
    }
#ifndef NDEBUG
    {
        size_t plan[MT_BUCKET_COUNT];
        mt_zero_plan_bytes(model, select, l->size, l->rank, stage, reshard_after_forward, plan);
        for (int b = 0; b < MT_BUCKET_COUNT; b++) MT_ASSERT(ctx->bytes_live[b] - live0[b] == plan[b]);
    }
#else
    (void)live0;
#endif
    *out = z;
    return MT_OK;
}

void mt_zero_destroy(struct mt_ctx *ctx, struct mt_zero *z)
{
    if (!z) return;
    /* nothing may stay in flight on buffers we free */
    for (int b = 0; b < 2; b++) {
        if (z->greq[b]) mt_comm_wait(ctx, z->greq[b]);
        if (z->rs[b].req) mt_comm_wait(ctx, z->rs[b].req);
    }
    for (int k = 0; k < z->n_ar; k++)
        if (z->ar && z->ar[k].req) mt_comm_wait(ctx, z->ar[k].req);
    float *bufs[] = {z->full, z->gfull, z->own_data, z->own_grad, z->gbuf[0], z->gbuf[1],
                     z->gscr[0], z->gscr[1], z->grecv[0], z->grecv[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) z->ops->buf_free(z->ops->be, ctx, bufs[i]);
    uint16_t *b16[] = {z->ar16, z->rs16s[0], z->rs16s[1], z->rs16r[0], z->rs16r[1]};
    for (size_t i = 0; i < sizeof b16 / sizeof b16[0]; i++)
        if (b16[i]) z->ops->buf_free(z->ops->be, ctx, b16[i]);
    if (z->params)
        for (int i = 0; i < z->lay.n_params; i++)
            if (z->lay.owner && z->lay.owner[i] >= 0) z->params[i].data = z->params[i].grad = NULL;
    mt_free(ctx, z->ar);
    mt_free(ctx, z->gathered);
    mt_free(ctx, z->views);
    mt_free(ctx, z->view_param);
    mt_free(ctx, z->nrm_x);
    mt_free(ctx, z->nrm_n);
    mt_free(ctx, z->nf_slot);
    if (z->nf_flags) z->ops->buf_free(z->ops->be, ctx, z->nf_flags);
    layout_free(ctx, &z->lay);
    mt_free(ctx, z);
}

/* ------------------------------------------------------------------ */
/* accessors and the step                                             */
/* ------------------------------------------------------------------ */

struct mt_param *mt_zero_opt_params(struct mt_zero *z, int *n)
{
    *n = z->n_views;
    return z->views;
}

int mt_zero_owner(const struct mt_zero *z, int i) { return z->lay.owner[i]; }
int mt_zero_group_rank(const struct mt_zero *z) { return z->lay.rank; }

const float *mt_zero_param_data(const struct mt_zero *z, int i)
{
    const struct zlayout *l = &z->lay;
    if (l->owner[i] < 0) return NULL;
    if (z->stage <= 2) return z->full + l->d.unit_base[l->unit[i]] + l->d.uoff[i];
    return l->owner[i] == l->rank ? z->own_data + l->d.ooff[i] : NULL;
}

/* A backend whose buffers are host memory (host_memory: cpu) has them
 * filled in place (no staging, no copy); another draws the normal ones
 * itself (init_normal) and gets the rest through one host tensor, sized for
 * the largest of those, one copy each (mt_model_param_init). */
enum mt_status mt_zero_init_params(struct mt_ctx *ctx, struct mt_zero *z, uint64_t seed)
{
    const struct zlayout *l = &z->lay;
    const int in_place = z->ops->host_memory, on_device = mt_knob_int(ctx, MT_KNOB_PARAM_INIT_DEVICE) != 0;
    size_t maxn = 1;   /* the staging for the parameters the host draws for a device */
    for (int i = 0; i < l->n_params; i++) {
        const size_t s = mt_model_param_init_staging(z->ops, &z->params[i], on_device);
        if (s > maxn) maxn = s;
    }
    float *host = in_place ? NULL : mt_alloc(ctx, maxn * sizeof(float), MT_BUCKET_WORKSPACE);
    if (!in_place && !host) return MT_ERR_OOM;
    for (int i = 0; i < l->n_params; i++) {
        float *dst = (float *)mt_zero_param_data(z, i);
        if (!dst) continue;
        mt_model_param_init(z->ops, &z->params[i], seed, dst, in_place ? NULL : host, on_device);
    }
    mt_free(ctx, host);
    return MT_OK;
}

/* Stages 0/1 (the gradients live in gfull for the whole step; stages 2/3
 * zero each unit's scratch per microbatch anyway): zero gfull but for the
 * gradients left to their first GEMM (mt_param.h grad_gemm), whose
 * grad_live it clears, in runs of parameters adjacent in memory, each with
 * its padding. zbuf zeroed gfull whole, padding included, which nothing
 * writes after (a reduction adds zeros there). */
static void gfull_zero(struct mt_zero *z)
{
    float *run = NULL;
    size_t len = 0;
    for (int i = 0; i < z->lay.n_params; i++) {
        if (!has_grad(&z->lay, z->params, i)) continue;   /* another engine's, or frozen */
        struct mt_param *p = &z->params[i];
        p->grad_live = !p->grad_gemm;
        if (!p->grad_live) {
            if (z->fresh_nan_step == z->step)   /* test: a read before the first write shows */
                z->ops->fill(z->ops->be, p->grad, NAN, p->numel);
            continue;
        }
        if (run && p->grad == run + len) {
            len += zalign(p->numel);
            continue;
        }
        zero_run(z, run, len);
        run = p->grad;
        len = zalign(p->numel);
    }
    zero_run(z, run, len);
}

void mt_zero_begin_step(struct mt_zero *z, int step)
{
    z->step = step;
    z->last_mb = 1;
    if (z->gfull) {
        gfull_zero(z);
    } else {
        for (int i = 0; i < z->lay.n_params; i++)
            if (has_grad(&z->lay, z->params, i)) z->params[i].grad_live = 1;   /* the scratch is zeroed */
    }
    if (z->own_grad) z->ops->fill(z->ops->be, z->own_grad, 0.0f, z->lay.g.own_total);
    if (z->nf_flags) z->ops->fill(z->ops->be, z->nf_flags, 0.0f, (size_t)(z->lay.n_params > 0 ? z->lay.n_params : 1));
}

enum mt_status mt_zero_nonfinite_culprit(struct mt_ctx *ctx, struct mt_zero *z, char *name, size_t len)
{
    const struct mt_ops_i *ops = z->ops;
    const int P = z->lay.n_params;
    if (unmarked(z)) {   /* the first of this rank's gradients that is not finite */
        for (int k = 0; k < z->n_views; k++) {
            const int i = z->view_param[k];
            if (z->views[k].frozen || !z->views[k].grad || z->lay.owner[i] != z->lay.rank) continue;
            if (!ops->all_finite(ops->be, z->views[k].grad, z->views[k].numel)) {
                snprintf(name, len, "%s", z->params[i].name);
                break;
            }
        }
        return MT_OK;
    }
    if (!z->nf_flags || P <= 0) return MT_OK;
    float *h = mt_alloc(ctx, (size_t)P * sizeof(float), MT_BUCKET_OTHER);
    if (!h) return MT_ERR_OOM;
    ops->sync(ops->be);
    ops->copy_to_host(ops->be, h, z->nf_flags, (size_t)P * sizeof(float));
    int bad = -1;
    for (int i = 0; i < P && bad < 0; i++)
        if (h[i] != 0.0f) bad = i;
    mt_free(ctx, h);
    if (bad >= 0) snprintf(name, len, "%s", z->params[bad].name);
    return MT_OK;
}

void mt_zero_set_last_microbatch(struct mt_zero *z, int last) { z->last_mb = last; }

enum mt_status mt_zero_finish_grads(struct mt_ctx *ctx, struct mt_zero *z)
{
    enum mt_status rc = MT_OK, r;
    for (int k = 0; k < z->n_ar; k++)
        if ((r = finish_ar(ctx, z, &z->ar[k])) != MT_OK && rc == MT_OK) rc = r;
    z->n_ar = 0;
    for (int s = 0; s < 2; s++)
        if ((r = finish_rs(ctx, z, s)) != MT_OK && rc == MT_OK) rc = r;
    return rc;
}

double mt_zero_grad_sumsq_local(const struct mt_zero *z, const unsigned char *count)
{
    /* each parameter counted once in the group, by its owner, in model order:
     * s = 0 + sumsq(g_0) + sumsq(g_1) + ..., one sumsq_multi (one host wait
     * on cuda, issue 27 item 3) or the loop it stands for */
    double s = 0;
    int c = 0;
    for (int k = 0; k < z->n_views; k++) {
        int i = z->view_param[k];
        if (z->lay.owner[i] != z->lay.rank || (count && !count[i]) || z->views[k].frozen) continue;
        if (z->ops->sumsq_multi) {
            z->nrm_x[c] = z->views[k].grad;
            z->nrm_n[c++] = z->views[k].numel;
        } else {
            s += z->ops->sumsq(z->ops->be, z->views[k].grad, z->views[k].numel);
        }
    }
    if (!z->ops->sumsq_multi) return s;
    /* the non-finite marks last: + 0.0 (no bit changes) when every gradient
     * was finite before its reduction, NaN otherwise (hook_post_backward) */
    if (z->nf_flags && z->ops->nonfinite_mark) {   /* marked: hook_post_backward */
        z->nrm_x[c] = z->nf_flags;
        z->nrm_n[c++] = (size_t)(z->lay.n_params > 0 ? z->lay.n_params : 1);
    }
    return z->ops->sumsq_multi(z->ops->be, z->nrm_x, z->nrm_n, c);
}

enum mt_status mt_zero_sync_params(struct mt_ctx *ctx, struct mt_zero *z)
{
    const struct zlayout *l = &z->lay;
    if (z->stage == 3) {
        /* owned data changed: every gathered copy is stale */
        for (int b = 0; b < 2; b++) {
            MT_CHECK(timed_wait(ctx, z, &z->greq[b]));
            z->gholds[b] = -1;
        }
        z->gcur = -1;
        memset(z->gathered, 0, (size_t)l->n_units * sizeof(int));
        return MT_OK;
    }
    if (z->stage == 0 || l->size == 1) return MT_OK;
    /* stages 1/2: the owners updated their parameters inside `full`; in
     * place. The first sync gathers every unit (after a load each rank
     * holds only what it owns); later, a unit with nothing trainable did
     * not change (a LoRA base unit): not gathered again. */
    const struct zpack *d = &l->d;
    for (int u = 0; u < l->n_units; u++) {
        if (z->synced && d->unit_size[u] > 0 && l->g.unit_size[u] == 0) continue;
        float *ub = z->full + d->unit_base[u];
        struct mt_comm_req *req = NULL;
        count_coll(z, MT_ZERO_ALLGATHER, d->unit_size[u]);
        MT_CHECK(mt_comm_iallgatherv(ctx, z->comm, ub, ub + displs_of(z, d, u)[l->rank], counts_of(z, d, u),
                                     displs_of(z, d, u), MT_DTYPE_F32, &req));
        z->ar[z->n_ar].req = req;
        z->ar[z->n_ar++].unit = u;
    }
    enum mt_status rc = MT_OK, r;
    for (int k = 0; k < z->n_ar; k++)
        if ((r = timed_wait(ctx, z, &z->ar[k].req)) != MT_OK && rc == MT_OK) rc = r;
    z->n_ar = 0;
    z->synced = rc == MT_OK;
    return rc;
}

/* The optimizer ran on the views; a view's bf16 is its model parameter's
 * shadow (copied at create). Stages 0-2: the view's data IS the model's
 * (in `full`), updated whole here. Stage 3: the view's data is the owned
 * copy and the model's is the gather of it, an fp32 copy of the same bits:
 * a shadow written from either is the same. Non-owners (stages 1-3) did not
 * update the parameter: their flag is 0, their refresh follows the gather. */
void mt_zero_bf16_mark_fresh(struct mt_zero *z)
{
    for (int k = 0; k < z->n_views; k++) {
        struct mt_param *v = &z->views[k];
        if (v->bf16_ok && v->bf16) z->params[z->view_param[k]].bf16_ok = 1;
        v->bf16_ok = 0;
    }
}

void mt_zero_inject_fresh_nan(struct mt_zero *z, int step) { z->fresh_nan_step = step; }

void mt_zero_inject_nan(struct mt_zero *z, int step, int unit)
{
    z->nan_step = step;
    z->nan_unit = unit;
}

void mt_zero_get_stats(const struct mt_zero *z, struct mt_zero_stats *out) { *out = z->st; }
int  mt_zero_overlap(const struct mt_zero *z) { return z->overlap; }
void mt_zero_reset_stats(struct mt_zero *z) { memset(&z->st, 0, sizeof z->st); }

/* ------------------------------------------------------------------ */
/* several engines on one model                                       */
/* ------------------------------------------------------------------ */

static enum mt_status set_pre_forward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero_set *set = user;
    for (int k = 0; k < set->n; k++) MT_CHECK(hook_pre_forward(ctx, set->z[k], u));
    return MT_OK;
}

static enum mt_status set_pre_backward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero_set *set = user;
    for (int k = 0; k < set->n; k++) MT_CHECK(hook_pre_backward(ctx, set->z[k], u));
    return MT_OK;
}

static enum mt_status set_post_backward(struct mt_ctx *ctx, void *user, int u)
{
    struct mt_zero_set *set = user;
    for (int k = 0; k < set->n; k++) MT_CHECK(hook_post_backward(ctx, set->z[k], u));
    return MT_OK;
}

void mt_zero_install_hooks(struct mt_model *model, struct mt_zero_set *set)
{
    struct mt_model_hooks h;
    memset(&h, 0, sizeof h);
    h.user = set;
    h.pre_forward = set_pre_forward;
    h.pre_backward = set_pre_backward;
    h.post_backward = set_post_backward;
    mt_model_set_hooks(model, &h);
}
