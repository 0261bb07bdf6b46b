/*
 * plan_fit.c — auto-fit and find-max over the planner (mt_plan_fit.h).
 */
#include "mt_plan_fit.h"
#include "../model/mt_blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mt_plan_fit_human(double b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (b >= 1024 && i < 5) b /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

void mt_plan_fit_mesh_str(const struct mt_mesh_dims *d, char *buf, size_t n)
{
    snprintf(buf, n, "pp=%d,dp=%d,ep=%d,tp=%d", d->pp, d->dp, d->ep, d->tp);
}

int mt_plan_fit_meshes(int world, struct mt_mesh_dims *out, int cap)
{
    int n = 0;
    for (int pp = 1; pp <= world; pp++) {
        if (world % pp) continue;
        for (int tp = 1; tp <= world / pp; tp++) {
            if ((world / pp) % tp) continue;
            for (int ep = 1; ep <= world / pp / tp; ep++) {
                if ((world / pp / tp) % ep) continue;
                if (out && n < cap) out[n] = (struct mt_mesh_dims){.pp = pp, .dp = world / pp / tp / ep, .ep = ep, .tp = tp};   /* sp: mt_plan_create */
                n++;
            }
        }
    }
    return n;
}

/* a new zeroed entry at the end of a list (grown x2 on ctx); NULL: OOM */
static struct mt_plan_fit_cand *cand_push(struct mt_ctx *ctx, struct mt_plan_fit_cand **v, int *n, int *cap)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        struct mt_plan_fit_cand *nv = mt_alloc(ctx, (size_t)nc * sizeof *nv, MT_BUCKET_OTHER);
        if (!nv) return NULL;
        if (*n) memcpy(nv, *v, (size_t)*n * sizeof *nv);
        mt_free(ctx, *v);
        *v = nv;
        *cap = nc;
    }
    struct mt_plan_fit_cand *x = &(*v)[(*n)++];
    memset(x, 0, sizeof *x);
    return x;
}

static int cand_cmp(const void *a, const void *b)
{
    const struct mt_plan_fit_cand *x = a, *y = b;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    if (x->mem != y->mem) return x->mem < y->mem ? -1 : 1;
    return 0;
}

int mt_plan_fit_largest_bucket(const size_t *b)
{
    int k = 0;
    for (int i = 1; i < MT_BUCKET_COUNT; i++)
        if (b[i] > b[k]) k = i;
    return k;
}

/* ---- find-max: the largest value in [1, hi] steps of `unit` that fits; monotone assumed ---- */

struct fm_ctx {
    struct mt_ctx *ctx;
    struct mt_plan *plan;
    const struct mt_config *cfg;
    struct mt_plan_choice base;
    const struct mt_mesh_dims *d;
    int world, what;   /* 0 seq_len, 1 batch_size */
    double mem;
    size_t need;       /* memory at the last probe that passed the contract */
};

static int fm_fits(struct fm_ctx *f, long v)
{
    struct mt_config c = *f->cfg;
    struct mt_plan_choice ch = f->base;
    if (f->what == 0) ch.seq_len = c.seq_len = (int)v;
    else ch.batch_size = c.batch_size = (int)v;
    c.microbatches = ch.microbatches;
    if (mt_mesh_check_contract(f->ctx, f->d, &c, f->world, ch.microbatches) != MT_OK) return 0;
    if (mt_plan_reselect(f->ctx, f->plan, &ch) != MT_OK) return 0;
    f->need = mt_plan_max_total(f->plan, NULL);
    return (double)f->need <= f->mem;
}

static long find_max_value(struct fm_ctx *f, long unit, long hi_units)
{
    if (hi_units < 1 || !fm_fits(f, unit)) return 0;
    long lo = 1, hi = hi_units;   /* lo fits */
    while (lo < hi) {
        long mid = lo + (hi - lo + 1) / 2;
        if (fm_fits(f, mid * unit)) lo = mid;
        else hi = mid - 1;
    }
    return lo * unit;
}

/* the unit and the upper bound (in units) of the searched value on mesh d */
static void fm_range(const struct mt_config *cfg, const struct mt_mesh_dims *d, int what, int mb, long *unit, long *hi)
{
    if (what == 0) {
        *unit = d->tp > 1 && cfg->sequence_parallel ? d->tp : 1;
        long bm = cfg->batch_size / ((long)d->dp * d->ep * mb);
        long cap = bm > 0 ? 2147483647L / bm : 0;
        if (cap > 1 << 24) cap = 1 << 24;   /* the seq_len key's range */
        *hi = cap / *unit;
    } else {
        *unit = (long)d->dp * d->ep * mb;
        long cap = 2147483647L / cfg->seq_len;   /* a microbatch of B*T < 2^31 tokens */
        *hi = cap / ((long)d->dp * d->ep);
        if (*hi > 2147483647L / *unit) *hi = 2147483647L / *unit;
    }
}

long mt_plan_fit_find_max(struct mt_ctx *ctx, struct mt_plan *plan, const struct mt_config *cfg,
                          const struct mt_mesh_dims *d, int world, int what, double mem, long *unit, size_t *need)
{
    struct mt_plan_choice base;
    mt_plan_get_choice(plan, &base);
    struct fm_ctx f = {ctx, plan, cfg, base, d, world, what, mem, 0};
    long hi;
    fm_range(cfg, d, what, cfg->microbatches, unit, &hi);
    long v = find_max_value(&f, *unit, hi);
    if (v == 0) (void)fm_fits(&f, *unit);   /* the need at the smallest value, for the message */
    *need = f.need;
    return v;
}

/* ---- the search ---- */

static enum mt_status reject(struct mt_ctx *ctx, struct mt_plan_fit *f, const struct mt_plan_fit_cand *cc,
                             const char *why)
{
    struct mt_plan_fit_cand *x = cand_push(ctx, &f->rej, &f->n_rej, &f->cap_rej);
    if (!x) return MT_ERR_OOM;
    *x = *cc;
    snprintf(x->reason, sizeof x->reason, "%s", why);
    return MT_OK;
}

/* One (ZeRO stage, recompute) choice on a planned mesh x microbatch count:
 * find-max's value, or a fitting / rejected candidate. */
static enum mt_status try_choice(struct mt_ctx *ctx, const struct mt_config *c, const struct mt_plan_fit_opts *o,
                                 struct mt_plan *plan, const struct mt_plan_fit_cand *cc, struct mt_plan_fit *f)
{
    struct mt_plan_choice ch = {cc->zero, cc->mb, cc->rc, c->seq_len, c->batch_size};
    if (o->find_max >= 0) {
        struct fm_ctx fm = {ctx, plan, c, ch, &cc->d, o->world, o->find_max, o->mem, 0};
        long unit, hi;
        fm_range(c, &cc->d, o->find_max, cc->mb, &unit, &hi);
        long v = find_max_value(&fm, unit, hi);
        if (v > f->best_val) { f->best_val = v; f->best_fm = *cc; }
        return MT_OK;
    }
    if (mt_plan_reselect(ctx, plan, &ch) != MT_OK) return reject(ctx, f, cc, mt_ctx_last_error(ctx));
    struct mt_plan_fit_cand x = *cc;
    x.mem = mt_plan_max_total(plan, &x.mem_rank);
    if (!f->smallest || x.mem < f->smallest) { f->smallest = x.mem; f->smallest_c = x; }
    if ((double)x.mem > o->mem) {
        size_t b[MT_BUCKET_COUNT];
        mt_plan_rank_bytes(plan, x.mem_rank, b);
        int lb = mt_plan_fit_largest_bucket(b);
        char h1[32], h2[32], h3[32], why[320];
        snprintf(why, sizeof why, "memory: over --mem-per-rank, largest bucket %s (rank %d needs %s > %s; %s %s)",
                 mt_bucket_name((enum mt_bucket)lb), x.mem_rank, mt_plan_fit_human((double)x.mem, h1, sizeof h1),
                 mt_plan_fit_human(o->mem, h2, sizeof h2), mt_bucket_name((enum mt_bucket)lb),
                 mt_plan_fit_human((double)b[lb], h3, sizeof h3));
        return reject(ctx, f, &x, why);
    }
    mt_plan_cost(plan, o->prof, &x.cost);
    x.step_s = x.cost.step_s;
    x.tps = x.cost.tokens_per_s;
    x.mfu = x.cost.mfu;
    struct mt_plan_fit_cand *y = cand_push(ctx, &f->ok, &f->n_ok, &f->cap_ok);
    if (!y) return MT_ERR_OOM;
    *y = x;
    return MT_OK;
}

/* Every microbatch count and choice of one mesh (the plan is built once per
 * mesh, at its first microbatch count the contract accepts, and re-selected). */
static enum mt_status try_mesh(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_fit_opts *o,
                               const struct mt_mesh_dims *d, struct mt_plan_fit *f)
{
    /* microbatch counts: the divisors of the per-data-rank batch (find-max batch_size: the config's) */
    long per = cfg->batch_size % ((long)d->dp * d->ep) == 0 ? cfg->batch_size / ((long)d->dp * d->ep) : 0;
    int mbs[64], n_mb = 0;
    if (o->find_max == 1 || per == 0) mbs[n_mb++] = cfg->microbatches;
    else
        for (long m = 1; m <= per && n_mb < 64; m++)
            if (per % m == 0) mbs[n_mb++] = (int)m;
    struct mt_plan *plan = NULL;
    enum mt_status rc = MT_OK;
    for (int k = 0; k < n_mb && rc == MT_OK; k++) {
        struct mt_config c = *cfg;
        c.microbatches = mbs[k];
        f->n_cand++;
        struct mt_plan_fit_cand cc;
        memset(&cc, 0, sizeof cc);
        cc.d = *d;
        cc.zero = cc.rc = -1;
        cc.mb = mbs[k];
        if (mt_mesh_check_contract(ctx, d, &c, o->world, mbs[k]) != MT_OK) {
            rc = reject(ctx, f, &cc, mt_ctx_last_error(ctx));
            continue;
        }
        if (!plan) {
            struct mt_plan_setup su;
            memset(&su, 0, sizeof su);
            su.dims = *d;
            su.steps = o->steps;
            su.threads = o->threads;
            su.data_bytes = o->data_bytes;
            su.runtime = o->runtime;
            if (mt_layout_pipeline_cut(ctx, &c, d->pp, NULL, su.first_layer) != MT_OK ||
                mt_plan_create(ctx, &c, &su, 0, &plan) != MT_OK) {
                plan = NULL;
                rc = ctx->last_status == MT_ERR_OOM ? MT_ERR_OOM : reject(ctx, f, &cc, mt_ctx_last_error(ctx));
                continue;
            }
        }
        for (int z = 0; z < 4 && rc == MT_OK; z++)
            for (int r = 0; r < 2 && rc == MT_OK; r++) {
                if (o->zero >= 0 && z != o->zero) continue;
                cc.zero = z;
                cc.rc = r;
                rc = try_choice(ctx, &c, o, plan, &cc, f);
            }
    }
    mt_plan_destroy(ctx, plan);
    return rc;
}

enum mt_status mt_plan_fit_search(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_fit_opts *o,
                                  struct mt_plan_fit *out)
{
    memset(out, 0, sizeof *out);
    int nm = mt_plan_fit_meshes(o->world, NULL, 0);
    struct mt_mesh_dims *meshes = mt_alloc(ctx, (size_t)nm * sizeof *meshes, MT_BUCKET_OTHER);
    if (!meshes) return MT_ERR_OOM;
    mt_plan_fit_meshes(o->world, meshes, nm);
    const int any_moe = mt_blocks_any_routed(cfg);
    enum mt_status rc = MT_OK;
    for (int mi = 0; mi < nm && rc == MT_OK; mi++) {
        /* without an E block the expert axis is data parallelism: the same layout as dp*ep */
        if (!any_moe && meshes[mi].ep > 1) { out->skipped_ep++; continue; }
        rc = try_mesh(ctx, cfg, o, &meshes[mi], out);
    }
    mt_free(ctx, meshes);
    if (rc != MT_OK) return mt_ctx_error(ctx, MT_ERR_OOM, "plan: out of memory in the auto-fit search");
    if (out->n_ok) qsort(out->ok, (size_t)out->n_ok, sizeof *out->ok, cand_cmp);
    return MT_OK;
}

void mt_plan_fit_free(struct mt_ctx *ctx, struct mt_plan_fit *fit)
{
    mt_free(ctx, fit->ok);
    mt_free(ctx, fit->rej);
    fit->ok = fit->rej = NULL;
    fit->n_ok = fit->n_rej = 0;
}

enum mt_status mt_plan_fit_plan(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_fit_cand *c,
                                const struct mt_plan_fit_opts *o, struct mt_plan **out)
{
    struct mt_config cc = *cfg;
    cc.microbatches = c->mb;
    snprintf(cc.recompute, sizeof cc.recompute, "%s", c->rc ? "block" : "none");
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = c->d;
    su.zero_stage = c->zero;
    su.steps = o->steps;
    su.threads = o->threads;
    su.data_bytes = o->data_bytes;
    su.runtime = o->runtime;
    MT_CHECK(mt_layout_pipeline_cut(ctx, &cc, c->d.pp, NULL, su.first_layer));
    return mt_plan_create(ctx, &cc, &su, 0, out);
}
