/*
 * redo.c — ReDo, recycling dormant SwiGLU units (SPEC 1e; docs/model.md
 * "ReDo: recycling dormant units"): the event after the update of step s
 * (from 1) with s % redo_every == 0, and its receipt.
 *
 *   arm     before the step's microbatches (step.c): the model zeroes its
 *           score accumulators and every SwiGLU backward adds its units'
 *           fixed-point |activation| sums (redo_scores.c)
 *   scores  each rank places its sums at their global units, one int64
 *           all-reduce (SUM) over the world: integer sums, so every rank of
 *           every mesh holds the single-rank integers, bit for bit
 *   decide  per set (a dense MLP, an expert, a shared expert), on every rank
 *           the same double arithmetic on the same integers: sum S over the
 *           set in unit order; S == 0 (no token routed, or every term below
 *           the fixed point's step): skipped; else unit j is recycled when
 *           S_j / (S / units) <= redo_tau
 *   apply   after the optimizers' update and BEFORE the ZeRO sync (step.c),
 *           on the parameters this rank runs the optimizer on (stage 0:
 *           all it holds; stages 1-3: the ones it owns): rows j of Wg and
 *           Wu inside the rank's box get element e = j*cols + c of
 *           0.02 * normal(seed, "<name>@redo<s>", e) (the init generator,
 *           mt_rng.h), column j of Wd inside the box 0, and every optimizer
 *           state of those tensors 0 on the same rows / column. The sync
 *           then spreads the owners' rows (ZeRO-1/2 all-gather; ZeRO-3
 *           gathers the fresh values at the next use), TP boxes hold each
 *           unit on one model rank, experts live on their expert rank.
 *
 * Near ties: the decision reads exact integers (after the fixed point's
 * truncation, element by element) and the same double operations in the
 * same order on every rank, so a score a hair above or below tau falls the
 * same way on every mesh; the only approximation is the fixed point's step
 * of 2^-24 per element.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <cjson/cJSON.h>

#include "../core/mt_rng.h"
#include "../optim/mt_optim.h"
#include "train_impl.h"

#define REDO_RECEIPT_UNITS 4096   /* units listed per event in the receipt (all of them hashed) */

struct redo_event {
    int       step;        /* s, from 1                                   */
    int      *per_layer;   /* (L) units recycled                          */
    int       n_units;     /* recycled in all                             */
    int      *set_of;      /* (n_units) set index of each, then unit       */
    int      *unit;
    uint64_t  hash;        /* xxh64 of the (set, unit) pairs in order      */
};

struct mt_train_redo {
    int                 n_sets;
    struct mt_redo_set *sets;
    size_t              n_units;   /* global units over all sets */
    int64_t            *score;     /* (n_units) the event's sums */
    int                 n_ev, cap;
    struct redo_event  *ev;
};

static enum mt_status redo_init(struct mt_ctx *ctx, struct run_state *rs)
{
    if (rs->redo) return MT_OK;
    struct mt_train_redo *r = mt_alloc(ctx, sizeof *r, MT_BUCKET_OTHER);
    if (!r) return MT_ERR_OOM;
    memset(r, 0, sizeof *r);
    rs->redo = r;
    r->n_sets = mt_model_redo_sets(rs->cfg, NULL, 0);
    r->sets = mt_alloc(ctx, (size_t)(r->n_sets ? r->n_sets : 1) * sizeof *r->sets, MT_BUCKET_OTHER);
    if (!r->sets) return MT_ERR_OOM;
    mt_model_redo_sets(rs->cfg, r->sets, r->n_sets);
    for (int i = 0; i < r->n_sets; i++) r->n_units += (size_t)r->sets[i].units;
    r->score = mt_alloc(ctx, (r->n_units ? r->n_units : 1) * sizeof(int64_t), MT_BUCKET_OTHER);
    return r->score ? MT_OK : MT_ERR_OOM;
}

void mt_train_redo_free(struct mt_ctx *ctx, struct run_state *rs)
{
    struct mt_train_redo *r = rs->redo;
    if (!r) return;
    for (int i = 0; i < r->n_ev; i++) {
        mt_free(ctx, r->ev[i].per_layer);
        mt_free(ctx, r->ev[i].set_of);
        mt_free(ctx, r->ev[i].unit);
    }
    mt_free(ctx, r->ev);
    mt_free(ctx, r->sets);
    mt_free(ctx, r->score);
    mt_free(ctx, r);
    rs->redo = NULL;
}

/* The units of set i to recycle (1 in mark[]), from the reduced sums. */
static int redo_decide(const struct mt_redo_set *s, const int64_t *S, double tau, unsigned char *mark)
{
    double sum = 0;
    if (s->units <= 0) return 0;
    for (int j = 0; j < s->units; j++) sum += (double)S[j];
    memset(mark, 0, (size_t)s->units);
    if (!(sum > 0)) return 0;   /* no tokens (or none above the fixed point's step): skipped */
    const double mean = sum / s->units;
    int n = 0;
    for (int j = 0; j < s->units; j++)
        if ((double)S[j] / mean <= tau) {
            mark[j] = 1;
            n++;
        }
    return n;
}

/* Rows (which 0, 1: Wg, Wu) or column (2: Wd) j of the box of p, for every
 * marked j: x (p's box on the host) gets the fresh rows (fresh != 0) or 0. */
static void redo_rewrite(const struct mt_param *p, int which, const unsigned char *mark, int units, float *x,
                         int fresh, uint64_t seed, int step)
{
    const int64_t r0 = p->off[0], c0 = p->off[1], nr = p->len[0], nc = p->len[1];
    uint64_t stream = 0;
    if (fresh) {
        char nm[200];
        snprintf(nm, sizeof nm, "%s@redo%d", p->name, step);
        stream = mt_rng_stream(nm);
    }
    if (which < 2) {
        for (int64_t i = 0; i < nr; i++) {
            const int64_t j = r0 + i;
            if (j >= units || !mark[j]) continue;
            for (int64_t c = 0; c < nc; c++) {
                const uint64_t gi = (uint64_t)j * (uint64_t)p->shape[1] + (uint64_t)(c0 + c);
                x[i * nc + c] = fresh ? (float)(0.02 * mt_rng_normal(seed, stream, gi)) : 0.0f;
            }
        }
    } else {
        for (int64_t c = 0; c < nc; c++) {
            const int64_t j = c0 + c;
            if (j >= units || !mark[j]) continue;
            for (int64_t i = 0; i < nr; i++) x[i * nc + c] = 0.0f;
        }
    }
}

/* Apply set s's marks to the tensors this rank updates: parameters and their optimizer state. */
static enum mt_status redo_apply(struct mt_ctx *ctx, struct run_state *rs, const struct mt_redo_set *s,
                                 const unsigned char *mark, int step, const struct mt_optim_state *st, int n_st,
                                 float *host, size_t host_n)
{
    const struct mt_ops_i *ops = rs->ops;
    for (int k = 0; k < rs->zset.n; k++) {
        int n = 0;
        struct mt_param *ps = mt_zero_opt_params(rs->zset.z[k], &n);
        for (int i = 0; i < n; i++) {
            struct mt_param *p = &ps[i];
            int which = -1;
            for (int w = 0; w < 3; w++)
                if (!strcmp(p->name, s->name[w])) which = w;
            if (which < 0 || !p->data || p->numel == 0) continue;
            MT_ASSERT(p->numel <= host_n);
            ops->sync(ops->be);
            ops->copy_to_host(ops->be, host, p->data, p->numel * sizeof(float));
            redo_rewrite(p, which, mark, s->units, host, which < 2, rs->cfg->seed, step);
            ops->copy_from_host(ops->be, p->data, host, p->numel * sizeof(float));
            p->bf16_ok = 0;   /* the update's shadow (AdamW) is stale now: the next forward rewrites it */
            for (int q = 0; q < n_st; q++) {
                if (strcmp(st[q].param->name, p->name) || !st[q].data) continue;
                ops->copy_to_host(ops->be, host, st[q].data, p->numel * sizeof(float));
                redo_rewrite(p, which, mark, s->units, host, 0, 0, step);
                ops->copy_from_host(ops->be, st[q].data, host, p->numel * sizeof(float));
            }
        }
    }
    (void)ctx;
    return MT_OK;
}

static enum mt_status redo_record(struct mt_ctx *ctx, struct mt_train_redo *r, int step, int L, int n_units,
                                  unsigned char *const *marks)
{
    if (r->n_ev == r->cap) {
        int cap = r->cap ? 2 * r->cap : 8;
        struct redo_event *ev = mt_alloc(ctx, (size_t)cap * sizeof *ev, MT_BUCKET_OTHER);
        if (!ev) return MT_ERR_OOM;
        if (r->n_ev) memcpy(ev, r->ev, (size_t)r->n_ev * sizeof *ev);
        mt_free(ctx, r->ev);
        r->ev = ev;
        r->cap = cap;
    }
    struct redo_event *e = &r->ev[r->n_ev];
    memset(e, 0, sizeof *e);
    e->step = step;
    e->n_units = n_units;
    e->per_layer = mt_alloc(ctx, (size_t)L * sizeof(int), MT_BUCKET_OTHER);
    e->set_of = mt_alloc(ctx, (size_t)(n_units ? n_units : 1) * sizeof(int), MT_BUCKET_OTHER);
    e->unit = mt_alloc(ctx, (size_t)(n_units ? n_units : 1) * sizeof(int), MT_BUCKET_OTHER);
    if (!e->per_layer || !e->set_of || !e->unit) return MT_ERR_OOM;
    memset(e->per_layer, 0, (size_t)L * sizeof(int));
    int k = 0;
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    for (int i = 0; i < r->n_sets; i++)
        for (int j = 0; j < r->sets[i].units; j++)
            if (marks[i][j]) {
                e->set_of[k] = i;
                e->unit[k++] = j;
                e->per_layer[r->sets[i].layer]++;
                const int32_t pair[2] = {i, j};
                XXH64_update(h, pair, sizeof pair);
            }
    e->hash = XXH64_digest(h);
    XXH64_freeState(h);
    r->n_ev++;
    return MT_OK;
}

enum mt_status mt_train_redo_event(struct mt_ctx *ctx, struct run_state *rs, int step)
{
    MT_CHECK(redo_init(ctx, rs));
    struct mt_train_redo *r = rs->redo;
    memset(r->score, 0, r->n_units * sizeof(int64_t));
    MT_CHECK(mt_model_redo_scores(ctx, rs->model, r->sets, r->n_sets, r->score));
    /* integer sums over every rank: the single-rank sums on every mesh */
    MT_CHECK(mt_comm_allreduce(ctx, rs->sumc, r->score, r->n_units, MT_DTYPE_I64, MT_REDOP_SUM));

    enum mt_status rc = MT_OK;
    unsigned char **marks = mt_alloc(ctx, (size_t)(r->n_sets ? r->n_sets : 1) * sizeof *marks, MT_BUCKET_OTHER);
    unsigned char *mk = mt_alloc(ctx, r->n_units ? r->n_units : 1, MT_BUCKET_OTHER);
    int n_st = mt_zero_set_states(&rs->zset, NULL);
    struct mt_optim_state *st = mt_alloc(ctx, (size_t)(n_st ? n_st : 1) * sizeof *st, MT_BUCKET_OTHER);
    size_t host_n = 1;
    for (int k = 0; k < rs->zset.n; k++) {
        int n = 0;
        struct mt_param *ps = mt_zero_opt_params(rs->zset.z[k], &n);
        for (int i = 0; i < n; i++)
            if (ps[i].numel > host_n) host_n = ps[i].numel;
    }
    float *host = mt_alloc(ctx, host_n * sizeof(float), MT_BUCKET_OTHER);
    if (!marks || !mk || !st || !host) {
        rc = MT_ERR_OOM;
        goto done;
    }
    mt_zero_set_states(&rs->zset, st);
    int total = 0;
    for (int i = 0; i < r->n_sets; i++) {
        marks[i] = mk + r->sets[i].off;
        const int n = redo_decide(&r->sets[i], r->score + r->sets[i].off, rs->cfg->redo_tau, marks[i]);
        total += n;
        if (n) MT_CHECK_GOTO(redo_apply(ctx, rs, &r->sets[i], marks[i], step, st, n_st, host, host_n), rc, done);
    }
    rc = redo_record(ctx, r, step, rs->cfg->n_layer, total, marks);
done:
    mt_free(ctx, host);
    mt_free(ctx, st);
    mt_free(ctx, mk);
    mt_free(ctx, marks);
    return rc;
}

/* The receipt's "redo" object (JSON text, malloc'ed; NULL when redo_every is 0). */
char *mt_train_redo_json(const struct run_state *rs)
{
    const struct mt_config *cfg = rs->cfg;
    if (cfg->redo_every <= 0) return NULL;
    const struct mt_train_redo *r = rs->redo;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "every", cfg->redo_every);
    cJSON_AddNumberToObject(o, "tau", cfg->redo_tau);
    cJSON_AddStringToObject(o, "score", "sum over the step's tokens of fixed-point |silu(g)*u| (2^-24 steps, clamp "
                                        "2^16), int64 all-reduced over the world; / the set's mean");
    cJSON *evs = cJSON_AddArrayToObject(o, "events");
    for (int i = 0; r && i < r->n_ev; i++) {
        const struct redo_event *e = &r->ev[i];
        cJSON *ej = cJSON_CreateObject();
        cJSON_AddNumberToObject(ej, "step", e->step);
        cJSON_AddNumberToObject(ej, "recycled", e->n_units);
        cJSON *pl = cJSON_AddArrayToObject(ej, "per_layer");
        for (int l = 0; l < cfg->n_layer; l++) cJSON_AddItemToArray(pl, cJSON_CreateNumber(e->per_layer[l]));
        char hx[24];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)e->hash);
        cJSON_AddStringToObject(ej, "units_xxh64", hx);
        /* "model.layers.0.mlp": [j, ...], in set order (an expert: "...mlp.experts.3") */
        cJSON *u = cJSON_AddObjectToObject(ej, "units");
        cJSON *cur = NULL;
        int cur_set = -1;
        const int shown = e->n_units < REDO_RECEIPT_UNITS ? e->n_units : REDO_RECEIPT_UNITS;
        for (int k = 0; k < shown; k++) {
            if (e->set_of[k] != cur_set) {
                cur_set = e->set_of[k];
                char key[160];
                snprintf(key, sizeof key, "%s", r->sets[cur_set].name[0]);
                char *dot = strstr(key, ".gate_proj.weight");
                if (dot) *dot = 0;
                cur = cJSON_AddArrayToObject(u, key);
            }
            cJSON_AddItemToArray(cur, cJSON_CreateNumber(e->unit[k]));
        }
        cJSON_AddBoolToObject(ej, "units_truncated", shown < e->n_units);
        cJSON_AddItemToArray(evs, ej);
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}
