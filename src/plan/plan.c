/*
 * plan.c — the planner: per-rank memory from the runtime's own size
 * functions, the layout of every parameter, and the step-time cost model.
 *
 * Invariant: no number here is a formula of its own. Bytes come from
 * mt_model_plan_bytes_par (model), mt_zero_plan_all (ZeRO engines),
 * mt_optim_plan_bytes (optimizer), mt_layout_host_bytes and
 * mt_layout_stage_io_bytes (trainer), over the registry that
 * mt_model_create_par(MT_MODEL_NO_ALLOC) builds, and the rules that decide
 * which engine, group and owner a parameter gets are the functions the
 * trainer calls (mt_layout_param_engine, mt_layout_engine_group,
 * mt_zero_runs_optimizer). The trainer puts this plan next to its measured
 * peaks in every receipt (distributed.memory_plan).
 *
 * HOW IT WORKS — the plan in two steps. mt_plan_create builds, per pipeline
 * stage, the registry of the representative rank (model 0, expert 0) and
 * every ZeRO engine's plan for ALL four stages and every group rank (one
 * layout per engine: ownership depends on shapes and group size only), with
 * the optimizer bytes of each group rank added. Those do not depend on the
 * batch. plan_select then fixes (ZeRO stage, microbatches, recompute):
 * the model's activation and workspace bytes per stage, the trainer's
 * buffers, and each rank's total = its stage's + its group ranks' engines.
 * Auto-fit (tools/cmd_plan.c) calls plan_select many times per mesh.
 */
#include "mt_plan.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/mt_fileio.h"
#include "../core/mt_knobs.h"
#include "../model/mt_blocks.h"
#include "../model/mt_model.h"
#include "../optim/mt_optim.h"
#include "../parallel/mt_layout.h"
#include "../parallel/mt_zero.h"

#define NB MT_BUCKET_COUNT
#define NZ 4   /* ZeRO stages */

/* The runtime bucket's built-in constants (mt_plan_runtime_default): this
 * machine's calibration by bench/calibrate_runtime.sh. */
#define MT_PLAN_RT_BASE          7301964.0
#define MT_PLAN_RT_PER_THREAD    557307.0
#define MT_PLAN_RT_PER_COLUMN    635.8
#define MT_PLAN_RT_SINGLE        344565.0
#define MT_PLAN_RT_SINGLE_COLUMN 1284.7
#define MT_PLAN_RT_MPI           6526164.0
#define MT_PLAN_RT_MPI_PER_PEER  1662500.0
#define MT_PLAN_RT_COLL_SCRATCH  1.262
#define MT_PLAN_RT_RS_SCRATCH    1.15

/* ------------------------------------------------------------------ */
/* the plan object                                                     */
/* ------------------------------------------------------------------ */

/* One ZeRO engine of one stage, for every ZeRO stage and group rank. */
struct eng_plan {
    int     used;         /* the trainer creates this engine                               */
    int     group, size;  /* mesh group, its size                                          */
    size_t *bytes;        /* (NZ * size * NB) engine buffers + optimizer, per stage, group rank */
    int    *owner;        /* (P) group rank owning parameter i; -1 other engines            */
    /* for the cost model */
    double  param_bytes;  /* fp32 bytes of the engine's parameters on one rank              */
    int     units;        /* units holding any of them (collective calls per sweep)         */
    double *opt_flops;    /* (2 * size) optimizer FLOPs per update (Muon: Newton–Schulz): [0] stage 0, [1] owners */
    double *opt_gather;   /* (2 * size) TP: bytes of full matrices gathered for split whole-matrix params */
};

struct stage_plan {
    struct mt_model *model;    /* NO_ALLOC registry of the representative rank (model 0, expert 0) */
    int              n_params;
    int              rep_rank;
    int             *engine;   /* (P) */
    struct eng_plan  eng[MT_LAYOUT_ENGINE_COUNT];
    size_t           model_bytes[NB];   /* selection-dependent: model + pipeline buffers + trainer arrays */
    double           flops_block, flops_head;   /* FLOPs per token of the stage's blocks, of its head */
};

struct mt_plan {
    struct mt_config     cfg;
    struct mt_plan_setup su;
    int                  world, Bm, zero;
    struct stage_plan   *st;          /* (pp) */
    size_t              *eng_rank;    /* (NZ * world * NB) every engine of a rank, summed, per ZeRO stage */
    size_t              *stage_max;   /* (NZ * pp) largest engine total over a stage's ranks            */
    int                 *stage_arg;   /* (NZ * pp) the lowest rank that has it                          */
    struct mt_plan_param *params;     /* layout table (MT_PLAN_LAYOUT) */
    int                  n_params;
    struct mt_plan_runtime rt;        /* the runtime bucket's constants */
    /* the knobs the cost model reads, as the run sets them (mt_plan_create's ctx; the
     * defaults without one): the Mamba-3 scan's kernels, the head's logits, and where
     * the MoE experts' sizes live (moe_sizes != host and moe_grouped on: the grouped path);
     * the precision of the optimizer's GEMMs (Muon's Newton–Schulz: bf16 operands in
     * precision=bf16 unless knob muon_ns_bf16=0, or where cuda_precision=bf16 makes the
     * table's fp32 gemm bf16; fp32 otherwise; the bytes count the bf16 copies of the first
     * way, an approximation of the second's per-call conversions); the grouped kernels'
     * family (knob grouped_gemm_kernel: wgmma or mma.sync, each its own measured rate) */
    int scan_bf16, head_bf16_logits, moe_dev_sizes, optim_gemm_bf16, muon_bf16, grouped_wgmma;
};

int mt_plan_world(const struct mt_plan *p) { return p->world; }
int mt_plan_micro(const struct mt_plan *p) { return p->Bm; }

void mt_plan_rank_bytes(const struct mt_plan *p, int rank, size_t out[MT_BUCKET_COUNT])
{
    struct mt_mesh_coord c;
    mt_mesh_coord_of(&p->su.dims, rank, &c);
    const size_t *e = p->eng_rank + ((size_t)p->zero * p->world + rank) * NB;
    for (int b = 0; b < NB; b++) out[b] = p->st[c.pipe].model_bytes[b] + e[b];
}
const struct mt_config *mt_plan_config(const struct mt_plan *p) { return &p->cfg; }
const struct mt_plan_setup *mt_plan_get_setup(const struct mt_plan *p) { return &p->su; }
int mt_plan_n_params(const struct mt_plan *p) { return p->n_params; }
const struct mt_plan_param *mt_plan_param(const struct mt_plan *p, int i) { return &p->params[i]; }

static size_t sum_nb(const size_t *b)
{
    size_t t = 0;
    for (int k = 0; k < NB; k++) t += b[k];
    return t;
}

size_t mt_plan_rank_alloc_total(const struct mt_plan *p, int rank)
{
    size_t b[NB];
    mt_plan_rank_bytes(p, rank, b);
    return sum_nb(b);
}

/* ---- the runtime bucket (the model is in mt_plan.h) ---- */

void mt_plan_runtime_default(struct mt_plan_runtime *rt)
{
    /* bench/calibrate_runtime.sh on this machine (2 x AMD EPYC vCPU, OpenBLAS
     * 0.3.21 openmp Haswell kernels, Open MPI 4.1 over vader), the same
     * numbers as bench/profiles/cpu-local.json's "runtime_memory" */
    memset(rt, 0, sizeof *rt);
    snprintf(rt->source, sizeof rt->source, "built-in (bench/calibrate_runtime.sh on cpu-local)");
    rt->base_bytes = MT_PLAN_RT_BASE;
    rt->per_thread_bytes = MT_PLAN_RT_PER_THREAD;
    rt->per_thread_per_column_bytes = MT_PLAN_RT_PER_COLUMN;
    rt->single_thread_bytes = MT_PLAN_RT_SINGLE;
    rt->single_thread_per_column_bytes = MT_PLAN_RT_SINGLE_COLUMN;
    rt->mpi_bytes = MT_PLAN_RT_MPI;
    rt->mpi_per_peer_bytes = MT_PLAN_RT_MPI_PER_PEER;
    rt->coll_scratch_ratio = MT_PLAN_RT_COLL_SCRATCH;
    rt->rs_scratch_ratio = MT_PLAN_RT_RS_SCRATCH;
}

const struct mt_plan_runtime *mt_plan_get_runtime(const struct mt_plan *p) { return &p->rt; }

/* Open MPI's collective temporaries of a rank (bytes). The ZeRO engines
 * issue a unit's reduction as soon as its backward is done and wait for all
 * of them at the end of the backward, so every unit of an engine reduced
 * over more than one rank is in flight together: its whole per-rank buffer
 * (param_bytes). ZeRO-0/1 all-reduce it: every rank receives into
 * temporaries (coll_scratch_ratio x bytes). ZeRO-2/3 reduce-scatter it:
 * libnbc reduces up a binomial tree to group rank 0 and scatters from there,
 * so the receiving temporaries are touched on the root (rs_scratch_ratio x
 * bytes) and a leaf touches none (measured on 2 ranks; with more, the
 * tree's inner ranks receive too and are not modelled). TP collectives
 * block, one activation (N x D floats) at a time, all-reduced. *bytes gets
 * what the ratios multiply. */
static double coll_scratch(const struct mt_plan *p, int rank, double *bytes)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    struct mt_mesh_coord c;
    mt_mesh_coord_of(d, rank, &c);
    const struct stage_plan *sp = &p->st[c.pipe];
    double ar = 0, rs = 0;
    for (int k = 0; k < mt_layout_n_engines(d); k++) {
        const struct eng_plan *e = &sp->eng[k];
        if (!e->used || e->size < 2) continue;
        if (p->zero <= 1) ar += e->param_bytes;
        else if (mt_layout_group_rank(d, rank, (enum mt_mesh_group)e->group) == 0) rs += e->param_bytes;
    }
    if (d->tp > 1) {
        double act = (double)p->Bm * p->cfg.seq_len * p->cfg.d_model * sizeof(float);
        if (act > ar) ar = act;
    }
    *bytes = ar + rs;
    return p->rt.coll_scratch_ratio * ar + p->rt.rs_scratch_ratio * rs;
}

void mt_plan_rank_runtime(const struct mt_plan *p, int rank, struct mt_plan_runtime_terms *t)
{
    const struct mt_plan_runtime *rt = &p->rt;
    memset(t, 0, sizeof *t);
    t->base = rt->base_bytes;
    /* OpenBLAS's pack buffers per thread grow with the widest GEMM dimension
     * (calibrated: a + b x W); a model whose GEMMs are smaller than that
     * touches only its operands (the microbatch's N x D and D x W) */
    const struct mt_config *cfg = &p->cfg;
    double wide = cfg->vocab_size > cfg->mlp_hidden ? cfg->vocab_size : cfg->mlp_hidden;
    double gemm = 4.0 * cfg->d_model * ((double)p->Bm * cfg->seq_len + wide);
    const int nt = p->su.threads > 0 ? p->su.threads : 1;
    double blas = nt == 1 ? rt->single_thread_bytes + rt->single_thread_per_column_bytes * wide
                          : rt->per_thread_bytes + rt->per_thread_per_column_bytes * wide;
    t->threads = nt * (gemm < blas ? gemm : blas);
    if (p->world > 1) {   /* MPI is initialised exactly when there is more than one rank */
        t->mpi = rt->mpi_bytes + (p->world - 1) * rt->mpi_per_peer_bytes;
        t->coll_scratch = coll_scratch(p, rank, &t->collective_bytes);
    }
    t->data = p->su.data_bytes > 0 ? p->su.data_bytes : 0;
    /* whole bytes, so that the JSON totals stay integers */
    t->base = floor(t->base), t->threads = floor(t->threads), t->mpi = floor(t->mpi);
    t->coll_scratch = floor(t->coll_scratch), t->data = floor(t->data);
    t->total = t->base + t->threads + t->mpi + t->coll_scratch + t->data;
}

static size_t rank_runtime(const struct mt_plan *p, int rank)
{
    struct mt_plan_runtime_terms t;
    mt_plan_rank_runtime(p, rank, &t);
    return (size_t)t.total;
}

size_t mt_plan_rank_total(const struct mt_plan *p, int rank)
{
    return mt_plan_rank_alloc_total(p, rank) + rank_runtime(p, rank);
}

size_t mt_plan_max_total(const struct mt_plan *p, int *rank)
{
    size_t best = 0;
    int arg = 0;
    if (p->zero >= 2 && p->world > 1) {
        /* the runtime bucket then differs between ranks of a stage (the
         * reduce-scatter temporaries sit on each group's rank 0): every rank */
        for (int r = 0; r < p->world; r++) {
            size_t t = mt_plan_rank_total(p, r);
            if (r == 0 || t > best) { best = t; arg = r; }
        }
        if (rank) *rank = arg;
        return best;
    }
    for (int s = 0; s < p->su.dims.pp; s++) {   /* stages are contiguous rank blocks, in order */
        /* the runtime bucket is the same on every rank of a stage */
        int r = p->stage_arg[(size_t)p->zero * p->su.dims.pp + s];
        size_t t = sum_nb(p->st[s].model_bytes) + p->stage_max[(size_t)p->zero * p->su.dims.pp + s] +
                   rank_runtime(p, r);
        if (s == 0 || t > best) { best = t; arg = r; }
    }
    if (rank) *rank = arg;
    return best;
}

void mt_plan_get_choice(const struct mt_plan *p, struct mt_plan_choice *c)
{
    c->zero_stage = p->zero;
    c->microbatches = p->cfg.microbatches;
    c->recompute = strcmp(p->cfg.recompute, "block") == 0;
    c->seq_len = p->cfg.seq_len;
    c->batch_size = p->cfg.batch_size;
}

void mt_plan_destroy(struct mt_ctx *ctx, struct mt_plan *p)
{
    if (!p) return;
    for (int s = 0; p->st && s < p->su.dims.pp; s++) {
        struct stage_plan *sp = &p->st[s];
        for (int k = 0; k < MT_LAYOUT_ENGINE_COUNT; k++) {
            mt_free(ctx, sp->eng[k].bytes);
            mt_free(ctx, sp->eng[k].owner);
            mt_free(ctx, sp->eng[k].opt_flops);
            mt_free(ctx, sp->eng[k].opt_gather);
        }
        mt_free(ctx, sp->engine);
        mt_model_destroy(ctx, sp->model);
    }
    mt_free(ctx, p->st);
    mt_free(ctx, p->eng_rank);
    mt_free(ctx, p->stage_max);
    mt_free(ctx, p->stage_arg);
    mt_free(ctx, p->params);
    mt_free(ctx, p);
}

static int is_tp_split(const struct mt_param *p) { return p->len[0] != p->shape[0] || p->len[1] != p->shape[1]; }

/* One update of p as its optimizer class declares it: FLOPs beyond the
 * elementwise pass (Muon: Newton–Schulz) into *flops, and the bytes a
 * whole-matrix class gathers for a TP-split p (2 x the full matrix) into
 * *gather; both added to. */
static void opt_update_cost(const struct mt_param *p, double *flops, double *gather)
{
    const struct mt_optim_i *c = mt_optim_class(p->optim);
    if (c->flops) *flops += c->flops(p);
    if (c->whole_matrix && is_tp_split(p)) *gather += 2.0 * (double)mt_param_global_numel(p) * sizeof(float);
}

/* Engine k of stage sp: ZeRO buffers for all stages and group ranks, plus
 * the optimizer of what each group rank updates. */
static enum mt_status engine_build(struct mt_ctx *ctx, const struct mt_plan *p, struct stage_plan *sp, int k)
{
    struct eng_plan *e = &sp->eng[k];
    const struct mt_mesh_dims *d = &p->su.dims;
    int P;
    struct mt_param *params = mt_model_params(sp->model, &P);
    e->used = 1;
    e->group = (int)mt_layout_engine_group(d, (enum mt_layout_engine)k);
    e->size = mt_mesh_group_size(d, (enum mt_mesh_group)e->group);
    const int G = e->size;
    e->bytes = mt_alloc(ctx, (size_t)NZ * G * NB * sizeof(size_t), MT_BUCKET_OTHER);
    e->owner = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof(int), MT_BUCKET_OTHER);
    e->opt_flops = mt_alloc(ctx, (size_t)2 * G * sizeof(double), MT_BUCKET_OTHER);
    e->opt_gather = mt_alloc(ctx, (size_t)2 * G * sizeof(double), MT_BUCKET_OTHER);
    unsigned char *sel = mt_alloc(ctx, (size_t)(P > 0 ? P : 1), MT_BUCKET_OTHER);
    struct mt_param *views = mt_alloc(ctx, (size_t)(P > 0 ? P : 1) * sizeof *views, MT_BUCKET_OTHER);
    int *start = mt_alloc(ctx, (size_t)(G + 1) * sizeof(int), MT_BUCKET_OTHER);
    enum mt_status rc = MT_OK;
    if (!e->bytes || !e->owner || !e->opt_flops || !e->opt_gather || !sel || !views || !start) {
        rc = MT_ERR_OOM;
        goto done;
    }
    int n_sel = 0, last_unit = -1;
    for (int i = 0; i < P; i++) {
        sel[i] = sp->engine[i] == k;
        if (!sel[i]) continue;
        n_sel++;
        e->param_bytes += (double)params[i].numel * sizeof(float);
        int u = mt_model_param_unit(sp->model, i);
        if (u != last_unit) { e->units++; last_unit = u; }
    }
    MT_CHECK_GOTO(mt_zero_plan_all(ctx, sp->model, sel, G, -1, p->cfg.reshard_after_forward, e->bytes, e->owner), rc,
                  done);
    /* stage 0: every rank updates every selected parameter */
    size_t ob[NB];
    int n = 0;
    double mf = 0, mg = 0;
    for (int i = 0; i < P; i++) {
        if (!mt_zero_runs_optimizer(e->owner[i], 0, 0)) continue;
        views[n++] = params[i];
        opt_update_cost(&params[i], &mf, &mg);
    }
    MT_ASSERT(n == n_sel);
    mt_optim_plan_bytes(ctx, &p->cfg, views, n, ob);
    for (int r = 0; r < G; r++) {
        for (int b = 0; b < NB; b++) e->bytes[(size_t)r * NB + b] += ob[b];
        e->opt_flops[r] = mf;
        e->opt_gather[r] = mg;
    }
    /* stages 1-3: the owner alone; views grouped by owner (counting sort, model order kept) */
    for (int r = 0; r <= G; r++) start[r] = 0;
    for (int i = 0; i < P; i++)
        if (e->owner[i] >= 0) start[e->owner[i] + 1]++;
    for (int r = 0; r < G; r++) start[r + 1] += start[r];
    for (int i = 0; i < P; i++) {
        int r = e->owner[i];
        if (r < 0 || !mt_zero_runs_optimizer(r, r, 1)) continue;
        views[start[r]++] = params[i];
    }
    for (int r = G; r > 0; r--) start[r] = start[r - 1];
    start[0] = 0;
    for (int r = 0; r < G; r++) {
        mt_optim_plan_bytes(ctx, &p->cfg, views + start[r], start[r + 1] - start[r], ob);
        double f = 0, g = 0;
        for (int j = start[r]; j < start[r + 1]; j++) opt_update_cost(&views[j], &f, &g);
        e->opt_flops[G + r] = f;
        e->opt_gather[G + r] = g;
        for (int z = 1; z < NZ; z++)
            for (int b = 0; b < NB; b++) e->bytes[((size_t)z * G + r) * NB + b] += ob[b];
    }
done:
    mt_free(ctx, sel);
    mt_free(ctx, views);
    mt_free(ctx, start);
    return rc;
}

/* Same parameters, shapes, boxes and roles, in the same order (names and
 * box offsets aside)? The class claim of mt_plan.h. */
static int same_registry(const struct mt_model *a, const struct mt_model *b, char *why, size_t n)
{
    int na, nb;
    struct mt_param *pa = mt_model_params((struct mt_model *)a, &na), *pb = mt_model_params((struct mt_model *)b, &nb);
    if (na != nb) return snprintf(why, n, "%d vs %d parameters", na, nb), 0;
    for (int i = 0; i < na; i++) {
        const struct mt_param *x = &pa[i], *y = &pb[i];
        if (x->numel != y->numel || x->shape[0] != y->shape[0] || x->shape[1] != y->shape[1] ||
            x->len[0] != y->len[0] || x->len[1] != y->len[1] || x->role != y->role || x->split != y->split ||
            x->reduce_model != y->reduce_model || x->optim != y->optim ||
            mt_model_param_unit(a, i) != mt_model_param_unit(b, i))
            return snprintf(why, n, "parameter %d (%.120s vs %.120s) differs", i, x->name, y->name), 0;
    }
    return 1;
}

static enum mt_status verify_classes(struct mt_ctx *ctx, const struct mt_plan *p)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    for (int s = 0; s < d->pp; s++)
        for (int e = 0; e < d->ep; e++)
            for (int t = 0; t < d->tp; t++) {
                if (e == 0 && t == 0) continue;
                struct mt_mesh_coord c = {.pipe = s, .data = 0, .expert = e, .model = t};
                int rank = mt_mesh_rank_of(d, &c);
                struct mt_model_par par;
                mt_layout_model_par(&p->cfg, d, p->su.first_layer, rank, &par);
                struct mt_model *m = NULL;
                MT_CHECK(mt_model_create_par(ctx, NULL, &p->cfg, d->tp, MT_MODEL_NO_ALLOC, &par, &m));
                char why[400];
                int ok = same_registry(p->st[s].model, m, why, sizeof why);
                mt_model_destroy(ctx, m);
                if (!ok)
                    return mt_ctx_error(ctx, MT_ERR_RUNTIME,
                                        "plan: internal: rank %d's registry is not its stage's class: %s", rank, why);
            }
    return MT_OK;
}

/* Every rank's engines summed, for each ZeRO stage, and each stage's busiest rank. */
static void engines_per_rank(struct mt_plan *p)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    const int n_eng = mt_layout_n_engines(d), W = p->world, pp = d->pp;
    for (int z = 0; z < NZ; z++)
        for (int s = 0; s < pp; s++) { p->stage_max[(size_t)z * pp + s] = 0; p->stage_arg[(size_t)z * pp + s] = -1; }
    for (int r = 0; r < W; r++) {
        struct mt_mesh_coord c;
        mt_mesh_coord_of(d, r, &c);
        const struct stage_plan *sp = &p->st[c.pipe];
        for (int z = 0; z < NZ; z++) {
            size_t *b = p->eng_rank + ((size_t)z * W + r) * NB;
            for (int q = 0; q < NB; q++) b[q] = 0;
            for (int k = 0; k < n_eng; k++) {
                const struct eng_plan *e = &sp->eng[k];
                int g = mt_layout_group_rank(d, r, (enum mt_mesh_group)e->group);
                const size_t *eb = e->bytes + ((size_t)z * e->size + g) * NB;
                for (int q = 0; q < NB; q++) b[q] += eb[q];
            }
            size_t t = sum_nb(b), *mx = &p->stage_max[(size_t)z * pp + c.pipe];
            int *arg = &p->stage_arg[(size_t)z * pp + c.pipe];
            if (*arg < 0 || t > *mx) { *mx = t; *arg = r; }
        }
    }
}

/* Fix the choice: per-stage model bytes (activations and workspace depend
 * on the microbatch, its slots and recompute), the pipeline buffers and the
 * trainer's arrays. Rank totals are assembled on demand from these and
 * eng_rank. */
static enum mt_status plan_select(struct mt_ctx *ctx, struct mt_plan *p, const struct mt_plan_choice *ch)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    if (ch->zero_stage < 0 || ch->zero_stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--zero must be 0, 1, 2 or 3 (got %d)", ch->zero_stage);
    p->zero = ch->zero_stage;
    p->su.zero_stage = ch->zero_stage;
    p->cfg.microbatches = ch->microbatches > 0 ? ch->microbatches : 1;
    snprintf(p->cfg.recompute, sizeof p->cfg.recompute, "%s", ch->recompute ? "block" : "none");
    p->cfg.seq_len = ch->seq_len;
    p->cfg.batch_size = ch->batch_size;
    p->Bm = mt_layout_micro_batch(&p->cfg, d);
    for (int s = 0; s < d->pp; s++) {
        struct stage_plan *sp = &p->st[s];
        struct mt_model_par par;
        mt_layout_model_par(&p->cfg, d, p->su.first_layer, sp->rep_rank, &par);
        MT_CHECK(mt_model_check_par(ctx, &p->cfg, p->Bm, &par));
        mt_model_plan_bytes_par(ctx, &p->cfg, p->Bm, MT_MODEL_EXTERNAL_PARAMS, &par, sp->model_bytes);
        /* act_in, grad_in: the registry's model has B = tp sequences; the buffers hold a microbatch's (Bm),
         * and a stage's rows are linear in B */
        sp->model_bytes[MT_BUCKET_COMM] +=
            2 * (mt_layout_stage_io_bytes(sp->model, &p->cfg, d->pp) * (size_t)p->Bm / (size_t)(d->tp > 0 ? d->tp : 1));
        sp->model_bytes[MT_BUCKET_OTHER] +=
            mt_layout_host_bytes(&p->cfg, sp->n_params, p->Bm, p->su.steps > 0 ? p->su.steps : 1, p->world);
    }
    return MT_OK;
}

enum mt_status mt_plan_reselect(struct mt_ctx *ctx, struct mt_plan *p, const struct mt_plan_choice *c)
{
    return plan_select(ctx, p, c);
}

static enum mt_status layout_build(struct mt_ctx *ctx, struct mt_plan *p);

enum mt_status mt_plan_create(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_setup *su,
                              int flags, struct mt_plan **out)
{
    *out = NULL;
    const struct mt_mesh_dims *d = &su->dims;
    if (su->zero_stage < 0 || su->zero_stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--zero must be 0, 1, 2 or 3 (got %d)", su->zero_stage);
    long long world = mt_mesh_dims_world(d);
    if (world < 1 || world > MT_PLAN_MAX_WORLD)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "plan: world=%lld is outside [1, %d], the planner's range", world,
                            MT_PLAN_MAX_WORLD);
    struct mt_plan *p = mt_alloc(ctx, sizeof *p, MT_BUCKET_OTHER);
    if (!p) return MT_ERR_OOM;
    p->cfg = *cfg;
    p->su = *su;
    mt_mesh_dims_set_sp(&p->su.dims, cfg);   /* the layout rules read it */
    d = &p->su.dims;
    p->world = (int)world;
    if (su->runtime) p->rt = *su->runtime;
    else mt_plan_runtime_default(&p->rt);
    p->su.runtime = &p->rt;
    p->scan_bf16 = !ctx || mt_knob_int(ctx, MT_KNOB_SCAN_BF16) != 0;
    p->head_bf16_logits = !ctx || mt_knob_int(ctx, MT_KNOB_HEAD_BF16_LOGITS) != 0;
    p->moe_dev_sizes = !ctx || (strcmp(mt_knob_str(ctx, MT_KNOB_MOE_SIZES), "host") != 0 &&
                                mt_knob_int(ctx, MT_KNOB_MOE_GROUPED) != 0);
    p->grouped_wgmma = ctx && !strcmp(mt_knob_str(ctx, MT_KNOB_GROUPED_GEMM_KERNEL), "wgmma");
    /* Muon's Newton–Schulz in bf16: the batched bf16 iteration (precision=bf16 with knob
     * muon_ns_bf16, muon.c), or the fp32 iteration with every gemm of the cuda backend in
     * bf16 (knob cuda_precision=bf16: its rate, the fp32 iteration's passes) */
    p->muon_bf16 = mt_optim_muon_ns_bf16(ctx, &p->cfg);
    p->optim_gemm_bf16 = p->muon_bf16 || (ctx && !strcmp(mt_knob_str(ctx, MT_KNOB_CUDA_PRECISION), "bf16"));
    enum mt_status rc = MT_OK;
    p->st = mt_alloc(ctx, (size_t)d->pp * sizeof *p->st, MT_BUCKET_OTHER);
    p->eng_rank = mt_alloc(ctx, (size_t)NZ * p->world * NB * sizeof(size_t), MT_BUCKET_OTHER);
    p->stage_max = mt_alloc(ctx, (size_t)NZ * d->pp * sizeof(size_t), MT_BUCKET_OTHER);
    p->stage_arg = mt_alloc(ctx, (size_t)NZ * d->pp * sizeof(int), MT_BUCKET_OTHER);
    if (!p->st || !p->eng_rank || !p->stage_max || !p->stage_arg) { rc = MT_ERR_OOM; goto fail; }
    for (int s = 0; s < d->pp; s++) {
        struct stage_plan *sp = &p->st[s];
        struct mt_mesh_coord c = {.pipe = s, .data = 0, .expert = 0, .model = 0};
        sp->rep_rank = mt_mesh_rank_of(d, &c);
        struct mt_model_par par;
        mt_layout_model_par(cfg, d, su->first_layer, sp->rep_rank, &par);
        /* the registry does not depend on the batch: B = tp keeps B*T divisible by tp */
        MT_CHECK_GOTO(mt_model_create_par(ctx, NULL, cfg, d->tp, MT_MODEL_NO_ALLOC, &par, &sp->model), rc, fail);
        struct mt_param *params = mt_model_params(sp->model, &sp->n_params);
        sp->engine = mt_alloc(ctx, (size_t)(sp->n_params > 0 ? sp->n_params : 1) * sizeof(int), MT_BUCKET_OTHER);
        if (!sp->engine) { rc = MT_ERR_OOM; goto fail; }
        for (int i = 0; i < sp->n_params; i++) sp->engine[i] = (int)mt_layout_param_engine(&params[i], d);
        for (int k = 0; k < mt_layout_n_engines(d); k++) MT_CHECK_GOTO(engine_build(ctx, p, sp, k), rc, fail);
        const int L = cfg->n_layer;
        sp->flops_head = par.layer1 == L ? mt_model_stage_flops(cfg, L, L) : 0.0;
        sp->flops_block = mt_model_stage_flops(cfg, par.layer0, par.layer1) - sp->flops_head;
    }
    if (flags & MT_PLAN_VERIFY) MT_CHECK_GOTO(verify_classes(ctx, p), rc, fail);
    engines_per_rank(p);
    struct mt_plan_choice ch = {su->zero_stage, cfg->microbatches > 0 ? cfg->microbatches : 1,
                                strcmp(cfg->recompute, "block") == 0, cfg->seq_len, cfg->batch_size};
    MT_CHECK_GOTO(plan_select(ctx, p, &ch), rc, fail);
    if (flags & MT_PLAN_LAYOUT) MT_CHECK_GOTO(layout_build(ctx, p), rc, fail);
    *out = p;
    return MT_OK;
fail:
    mt_plan_destroy(ctx, p);
    return rc;
}

/* ------------------------------------------------------------------ */
/* the layout table                                                    */
/* ------------------------------------------------------------------ */

static int stage_of_layer(const struct mt_plan *p, int layer, int role)
{
    const int pp = p->su.dims.pp;
    if (layer < 0) return role == MT_ROLE_EMBED ? 0 : pp - 1;
    for (int s = 0; s < pp; s++)
        if (layer >= p->su.first_layer[s] && layer < p->su.first_layer[s + 1]) return s;
    return pp - 1;
}

/* 0 gate_proj, 1 up_proj, 2 down_proj: an expert's matrix */
static int expert_kind(const char *name)
{
    if (strstr(name, "gate_proj")) return 0;
    if (strstr(name, "up_proj")) return 1;
    return 2;
}

/* Index in the representative registry of global parameter g: the same name,
 * or for a routed expert under EP the same position among the stage's local
 * experts (expert j sits where expert j mod Ee sits on expert rank 0). */
static int rep_index(const struct stage_plan *sp, const struct mt_param *g, int Ee, int ep, int *cursor)
{
    int P;
    struct mt_param *ps = mt_model_params(sp->model, &P);
    if (g->role != MT_ROLE_EXPERT || ep == 1)
        for (int k = 0; k < P; k++) {   /* both lists are in model order: search from the last hit */
            int i = (*cursor + k) % P;
            if (ps[i].layer == g->layer && strcmp(ps[i].name, g->name) == 0) return *cursor = i;
        }
    if (g->role == MT_ROLE_EXPERT && ep > 1) {
        int jl = g->expert % Ee, kind = expert_kind(g->name);
        for (int i = 0; i < P; i++)
            if (ps[i].role == MT_ROLE_EXPERT && ps[i].layer == g->layer && ps[i].expert == jl &&
                expert_kind(ps[i].name) == kind)
                return i;
        return -1;
    }
    for (int i = 0; i < P; i++)
        if (ps[i].layer == g->layer && strcmp(ps[i].name, g->name) == 0) return i;
    return -1;
}

static enum mt_status layout_build(struct mt_ctx *ctx, struct mt_plan *p)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    int ng = mt_model_registry(&p->cfg, NULL, 0);
    struct mt_param *glob = mt_alloc(ctx, (size_t)(ng > 0 ? ng : 1) * sizeof *glob, MT_BUCKET_OTHER);
    p->params = mt_alloc(ctx, (size_t)(ng > 0 ? ng : 1) * sizeof *p->params, MT_BUCKET_OTHER);
    if (!glob || !p->params) { mt_free(ctx, glob); return MT_ERR_OOM; }
    mt_model_registry(&p->cfg, glob, ng);
    const int Ee = p->cfg.n_experts / (d->ep > 0 ? d->ep : 1);
    int cursor[MT_MAX_LAYERS + 1];   /* per stage: where the last name was found */
    memset(cursor, 0, sizeof cursor);
    for (int i = 0; i < ng; i++) {
        struct mt_plan_param *pp = &p->params[i];
        memset(pp, 0, sizeof *pp);
        pp->g = glob[i];
        pp->stage = stage_of_layer(p, glob[i].layer, glob[i].role);
        const struct stage_plan *sp = &p->st[pp->stage];
        int li = rep_index(sp, &glob[i], Ee > 0 ? Ee : 1, d->ep, &cursor[pp->stage]);
        if (li < 0) {
            mt_free(ctx, glob);
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "plan: internal: %s not in stage %d's registry", glob[i].name,
                                pp->stage);
        }
        const struct mt_param *lp = &mt_model_params(sp->model, NULL)[li];
        pp->local[0] = lp->len[0];
        pp->local[1] = lp->len[1];
        pp->expert_rank = glob[i].role == MT_ROLE_EXPERT && d->ep > 1 ? glob[i].expert / Ee : -1;
        pp->engine = sp->engine[li];
        const struct eng_plan *e = &sp->eng[pp->engine];
        pp->group = e->group;
        pp->group_size = e->size;
        pp->owner = e->owner[li];
        pp->tp_split = is_tp_split(lp);
        pp->reduce_model = lp->reduce_model && d->tp > 1;
    }
    p->n_params = ng;
    mt_free(ctx, glob);
    return MT_OK;
}

int mt_plan_param_ranks(const struct mt_plan *p, int i, enum mt_plan_ranks what, int *ranks)
{
    const struct mt_plan_param *pp = &p->params[i];
    const struct mt_mesh_dims *d = &p->su.dims;
    int n = 0;
    for (int r = 0; r < p->world; r++) {
        struct mt_mesh_coord c;
        mt_mesh_coord_of(d, r, &c);
        if (c.pipe != pp->stage || (pp->expert_rank >= 0 && c.expert != pp->expert_rank)) continue;
        int g = mt_layout_group_rank(d, r, (enum mt_mesh_group)pp->group);
        if (what == MT_PLAN_HOLDERS && p->zero == 3 && g != pp->owner) continue;
        if (what == MT_PLAN_OPTIMIZERS && !mt_zero_runs_optimizer(pp->owner, g, p->zero)) continue;
        ranks[n++] = r;
    }
    return n;
}

void mt_plan_ranks_str(const int *ranks, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        char item[32];
        if (j == i) snprintf(item, sizeof item, "%s%d", at ? "," : "", ranks[i]);
        else snprintf(item, sizeof item, "%s%d-%d", at ? "," : "", ranks[i], ranks[j]);
        size_t il = strlen(item);
        if (at + il + 4 >= len) {
            if (at + 4 < len) snprintf(buf + at, len - at, ",...");
            return;
        }
        memcpy(buf + at, item, il + 1);
        at += il;
        i = j + 1;
    }
}

void mt_plan_param_spec(const struct mt_plan *p, int i, char *buf, size_t len)
{
    const struct mt_plan_param *pp = &p->params[i];
    const char *d0 = "-", *d1 = "-";
    if (pp->tp_split && pp->g.split == MT_SPLIT_ROWS) d0 = "model";
    if (pp->tp_split && pp->g.split == MT_SPLIT_COLS) d1 = "model";
    if (pp->g.ndim == 1) snprintf(buf, len, "[%s]", d0);
    else snprintf(buf, len, "[%s, %s]%s", d0, d1, pp->expert_rank >= 0 ? " @expert" : "");
}

/* ------------------------------------------------------------------ */
/* the runtime bucket's constants from a profile                       */
/* ------------------------------------------------------------------ */

enum mt_status mt_plan_runtime_load(struct mt_ctx *ctx, const char *path, struct mt_plan_runtime *rt, int *found)
{
    *found = 0;
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, path, "profile", &fd, NULL));   /* not a FIFO (issue 33) */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot open profile '%s'", path);
    }
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *sec = j ? cJSON_GetObjectItemCaseSensitive(j, "runtime_memory") : NULL;
    if (!sec) {
        cJSON_Delete(j);
        return j ? MT_OK : mt_ctx_error(ctx, MT_ERR_FORMAT, "profile '%s' is not JSON", path);
    }
    static const char *keys[] = {"base_bytes", "per_thread_bytes", "per_thread_per_column_bytes",
                                 "single_thread_bytes", "single_thread_per_column_bytes", "mpi_bytes",
                                 "mpi_per_peer_bytes", "collective_scratch_ratio", "reduce_scatter_scratch_ratio"};
    enum { NK = sizeof keys / sizeof keys[0] };
    double v[NK];
    for (int k = 0; k < NK; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(sec, keys[k]);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > 1e15) {
            cJSON_Delete(j);
            return mt_ctx_error(ctx, MT_ERR_FORMAT, "profile '%s': runtime_memory.%s must be a number >= 0", path,
                                keys[k]);
        }
        v[k] = x->valuedouble;
    }
    memset(rt, 0, sizeof *rt);
    rt->base_bytes = v[0], rt->per_thread_bytes = v[1], rt->per_thread_per_column_bytes = v[2];
    rt->single_thread_bytes = v[3], rt->single_thread_per_column_bytes = v[4];
    rt->mpi_bytes = v[5], rt->mpi_per_peer_bytes = v[6], rt->coll_scratch_ratio = v[7], rt->rs_scratch_ratio = v[8];
    snprintf(rt->source, sizeof rt->source, "%s (runtime_memory)", path);
    cJSON_Delete(j);
    *found = 1;
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* cost model                                                          */
/* ------------------------------------------------------------------ */

static double num_or(const cJSON *o, const char *key, double def, int *missing)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (missing && !v) *missing = 1;
    return def;
}

/* The optional rates of the per-op-kind breakdown (mt_plan_profile); a
 * missing or non-positive one stays 0 (its kind falls back to the GEMM rate
 * or, for the memory bandwidth, the breakdown is off). */
static void profile_load_rates(const cJSON *j, struct mt_plan_profile *prof)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "measured");
    prof->mem_bandwidth = num_or(j, "memory_bandwidth_bytes_per_s", 0, NULL);
    snprintf(prof->mem_basis, sizeof prof->mem_basis, "memory_bandwidth_bytes_per_s");
    if (prof->mem_bandwidth <= 0 && m) {
        prof->mem_bandwidth = 2.0 * num_or(m, "device_copy_bytes_per_s", 0, NULL);
        snprintf(prof->mem_basis, sizeof prof->mem_basis, "2 x measured.device_copy_bytes_per_s");
    }
    if (prof->mem_bandwidth <= 0) prof->mem_bandwidth = 0, prof->mem_basis[0] = 0;
    if (!m) return;
    prof->attn_fwd_rate = fmax(0, num_or(m, "attention_fwd_flop_per_s", 0, NULL));
    prof->attn_bwd_rate = fmax(0, num_or(m, "attention_bwd_flop_per_s", 0, NULL));
    prof->attn_rate = fmax(0, num_or(m, "attention_fwd_bwd_flop_per_s", 0, NULL));
    prof->scan_rate = fmax(0, num_or(m, "scan_fwd_bwd_flop_per_s", 0, NULL));
    prof->attn_bf16_rate = fmax(0, num_or(m, "attention_bf16_fwd_bwd_flop_per_s", 0, NULL));
    prof->scan_bf16_rate = fmax(0, num_or(m, "scan_bf16_fwd_bwd_flop_per_s", 0, NULL));
    prof->grouped_bf16_rate = fmax(0, num_or(m, "gemm_grouped_bf16_flop_per_s", 0, NULL));
    prof->grouped_wgmma_bf16_rate = fmax(0, num_or(m, "gemm_grouped_wgmma_bf16_flop_per_s", 0, NULL));
    prof->muon_ns_bf16_rate = fmax(0, num_or(m, "muon_ns_bf16_flop_per_s", 0, NULL));
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(m, "attention_precision");
    snprintf(prof->attn_precision, sizeof prof->attn_precision, "%s", cJSON_IsString(ap) ? ap->valuestring : "");
}

enum mt_status mt_plan_profile_load(struct mt_ctx *ctx, const char *path, struct mt_plan_profile *prof)
{
    memset(prof, 0, sizeof *prof);
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, path, "device profile", &fd, NULL));   /* not a FIFO (issue 33) */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot open device profile '%s'", path);
    }
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "device profile '%s' is not a JSON object", path);
    }
    int miss = 0;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(j, "name");
    snprintf(prof->name, sizeof prof->name, "%s", cJSON_IsString(nm) ? nm->valuestring : "unnamed");
    prof->peak_flops = num_or(j, "peak_flops", 0, &miss);
    prof->node_peak_flops = num_or(j, "node_peak_flops", prof->peak_flops, NULL);
    prof->efficiency = num_or(j, "efficiency", 0, &miss);
    prof->memory_bytes = num_or(j, "memory_bytes", 0, NULL);
    prof->overlap = num_or(j, "overlap", 0, NULL);
    prof->ranks_per_node = (int)num_or(j, "ranks_per_node", 1, &miss);
    prof->cores_per_node = (int)num_or(j, "cores_per_node", 0, NULL);
    prof->oversubscribed_latency = num_or(j, "oversubscribed_latency_s", 0, NULL);
    const cJSON *byp = cJSON_GetObjectItemCaseSensitive(j, "by_precision");
    const cJSON *bp[2] = {byp ? cJSON_GetObjectItemCaseSensitive(byp, "fp32") : NULL,
                          byp ? cJSON_GetObjectItemCaseSensitive(byp, "bf16") : NULL};
    double *bpeak[2] = {&prof->peak_fp32, &prof->peak_bf16};
    double *beff[2] = {&prof->efficiency_fp32, &prof->efficiency_bf16};
    int bad_byp = byp && !cJSON_IsObject(byp);
    for (int k = 0; k < 2; k++) {
        if (!bp[k]) continue;
        *bpeak[k] = num_or(bp[k], "peak_flops", 0, &bad_byp);
        *beff[k] = num_or(bp[k], "efficiency", prof->efficiency, NULL);
        if (*bpeak[k] <= 0 || *beff[k] <= 0) bad_byp = 1;
    }
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(j, "links");
    const cJSON *in = links ? cJSON_GetObjectItemCaseSensitive(links, "intra_node") : NULL;
    const cJSON *ex = links ? cJSON_GetObjectItemCaseSensitive(links, "inter_node") : NULL;
    if (!in || !ex) miss = 1;
    const cJSON *lk[2] = {in, ex};
    struct mt_plan_link *dst[2] = {&prof->intra, &prof->inter};
    for (int k = 0; k < 2; k++) {
        if (!lk[k]) continue;
        dst[k]->bandwidth = num_or(lk[k], "bandwidth_bytes_per_s", 0, &miss);
        dst[k]->latency = num_or(lk[k], "latency_s", 0, &miss);
        dst[k]->large_bytes = num_or(lk[k], "large_bytes", 0, NULL);
        dst[k]->large_bandwidth = num_or(lk[k], "large_bandwidth_bytes_per_s", dst[k]->bandwidth, NULL);
        dst[k]->large_reduce_bandwidth = num_or(lk[k], "large_reduce_bandwidth_bytes_per_s", dst[k]->large_bandwidth, NULL);
    }
    profile_load_rates(j, prof);
    cJSON_Delete(j);
    if (bad_byp)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "device profile '%s': by_precision must be an object whose fp32 and "
                            "bf16 entries each have peak_flops > 0 (and optionally efficiency > 0)", path);
    if (miss || prof->peak_flops <= 0 || prof->efficiency <= 0 || prof->ranks_per_node < 1 ||
        prof->intra.bandwidth <= 0 || prof->inter.bandwidth <= 0 || prof->overlap < 0 || prof->overlap > 1)
        return mt_ctx_error(ctx, MT_ERR_FORMAT,
                            "device profile '%s': needs peak_flops > 0, efficiency > 0, ranks_per_node >= 1, overlap in "
                            "[0,1], links.intra_node and links.inter_node {bandwidth_bytes_per_s, latency_s}",
                            path);
    return MT_OK;
}

/* The link a group of kind g runs over: intra-node when all its members
 * (those of rank 0's group; every group of a kind has the same shape) sit
 * on one node, ranks being placed ranks_per_node at a time in world order. */
static struct mt_plan_link group_link_raw(const struct mt_plan *p, const struct mt_plan_profile *prof,
                                          enum mt_mesh_group g)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    int n = mt_mesh_group_size(d, g), node0 = -1, same = 1;
    /* members of rank 0's group: every rank whose coordinates outside g are 0 */
    for (int r = 0, seen = 0; r < p->world && seen < n; r++) {
        struct mt_mesh_coord c;
        mt_mesh_coord_of(d, r, &c);
        int in = 1;
        switch (g) {
        case MT_MESH_GROUP_MODEL:       in = c.pipe == 0 && c.data == 0 && c.expert == 0; break;
        case MT_MESH_GROUP_EXPERT:      in = c.pipe == 0 && c.data == 0 && c.model == 0; break;
        case MT_MESH_GROUP_DATA:        in = c.pipe == 0 && c.expert == 0 && c.model == 0; break;
        case MT_MESH_GROUP_DATA_EXPERT: in = c.pipe == 0 && c.model == 0; break;
        case MT_MESH_GROUP_DATA_MODEL:  in = c.pipe == 0 && c.expert == 0; break;
        case MT_MESH_GROUP_STAGE:       in = c.pipe == 0; break;
        case MT_MESH_GROUP_PIPE:        in = c.data == 0 && c.expert == 0 && c.model == 0; break;
        default: break;
        }
        if (!in) continue;
        seen++;
        int node = r / prof->ranks_per_node;
        if (node0 < 0) node0 = node;
        else if (node != node0) same = 0;
    }
    return same ? prof->intra : prof->inter;
}

static struct mt_plan_link group_link(const struct mt_plan *p, const struct mt_plan_profile *prof, enum mt_mesh_group g)
{
    struct mt_plan_link l = group_link_raw(p, prof, g);
    int on_node = p->world < prof->ranks_per_node ? p->world : prof->ranks_per_node;
    if (prof->cores_per_node > 0 && on_node > prof->cores_per_node && l.latency < prof->oversubscribed_latency)
        l.latency = prof->oversubscribed_latency;
    return l;
}

/* Ring collectives over n ranks, payload S bytes (the full buffer): n-1
 * steps of latency, (n-1)/n S bytes through each rank's link (twice for an
 * all-reduce); reductions of large payloads at the link's reduce bandwidth. */
static double link_bw(struct mt_plan_link l, double S, int reduce)
{
    if (l.large_bytes > 0 && S > l.large_bytes) return reduce ? l.large_reduce_bandwidth : l.large_bandwidth;
    return l.bandwidth;
}
static double t_gather(double S, int n, struct mt_plan_link l)
{
    return n <= 1 ? 0.0 : (double)(n - 1) / n * S / link_bw(l, S, 0) + (n - 1) * l.latency;
}
static double t_reduce_scatter(double S, int n, struct mt_plan_link l)
{
    return n <= 1 ? 0.0 : (double)(n - 1) / n * S / link_bw(l, S, 1) + (n - 1) * l.latency;
}
static double t_allreduce(double S, int n, struct mt_plan_link l)
{
    return n <= 1 ? 0.0 : 2.0 * (double)(n - 1) / n * S / link_bw(l, S, 1) + 2 * (n - 1) * l.latency;
}

/* The rate one rank's GEMMs of one precision run at (FLOP/s): the profile's
 * peak for that precision where it distinguishes them, the node's peak
 * shared by the ranks on it (never above one rank's), times the efficiency.
 * Fills *peak_rank, *eff and *basis ("fp32" / "bf16": the by_precision entry
 * used; "profile": none). */
static double precision_rate(const struct mt_plan *p, const struct mt_plan_profile *prof, int bf16, double *peak_rank,
                             double *eff, const char **basis)
{
    int on_node = p->world < prof->ranks_per_node ? p->world : prof->ranks_per_node;
    /* the precision picks the peak where the profile distinguishes them;
     * ranks on a node share the node's peak in the same proportion */
    const double by_peak = bf16 ? prof->peak_bf16 : prof->peak_fp32;
    const double scale = by_peak > 0 ? by_peak / prof->peak_flops : 1.0;
    *eff = by_peak > 0 ? (bf16 ? prof->efficiency_bf16 : prof->efficiency_fp32) : prof->efficiency;
    *basis = by_peak > 0 ? (bf16 ? "bf16" : "fp32") : "profile";
    double peak = prof->node_peak_flops * scale / on_node;
    if (peak > prof->peak_flops * scale) peak = prof->peak_flops * scale;
    *peak_rank = peak;
    return peak * *eff;
}

/* The model's GEMM rate (its config's precision; fills the cost's
 * efficiency, peak basis and per-rank peak) and the optimizer's (Muon's
 * Newton–Schulz in the precision it runs in, optim_gemm_bf16; on a profile
 * with one peak the same). */
static double cost_rate(const struct mt_plan *p, const struct mt_plan_profile *prof, struct mt_plan_cost *out)
{
    double opt_peak, opt_eff;
    out->optimizer_rate = precision_rate(p, prof, p->optim_gemm_bf16, &opt_peak, &opt_eff, &out->optimizer_basis);
    if (p->muon_bf16 && prof->muon_ns_bf16_rate > 0) {   /* cuda_calib's batched iteration, measured */
        out->optimizer_rate = prof->muon_ns_bf16_rate;
        out->optimizer_basis = "measured (batched bf16 Newton-Schulz)";
    }
    return precision_rate(p, prof, !strcmp(p->cfg.precision, "bf16"), &out->peak_per_rank, &out->efficiency,
                          &out->peak_basis);
}

/* One microbatch of stage s on one rank, in seconds: compute (fl FLOPs at
 * `rate`) and the collectives of the model (tp), expert (ep) and pipe (pp)
 * axes, which do not overlap the compute. */
struct stage_mb {
    double fl, comp, tp, ep, pp;
};
static void stage_microbatch(const struct mt_plan *p, int s, double rate, struct mt_plan_link lm,
                             struct mt_plan_link le, struct mt_plan_link lp, struct stage_mb *o)
{
    const struct mt_config *cfg = &p->cfg;
    const struct mt_mesh_dims *d = &p->su.dims;
    const int pp = d->pp, tp = d->tp, ep = d->ep;
    const int rc = strcmp(cfg->recompute, "block") == 0, sp_on = tp > 1 && cfg->sequence_parallel;
    const double T = cfg->seq_len, D = cfg->d_model, N = (double)p->Bm * T;   /* rows of one microbatch */
    const double f = sizeof(float);
    const struct stage_plan *st = &p->st[s];
    struct mt_blocks_comm bc;   /* the stage's layers, per the block-kind table */
    mt_blocks_comm_counts(cfg, p->su.first_layer[s], p->su.first_layer[s + 1], &bc);
    const int n_moe = bc.routed;
    /* compute: this rank's share of the microbatch (TP splits heads, hidden and the MoE rows) */
    double fl = (st->flops_block * (1.0 + (rc ? 1.0 / 3.0 : 0.0)) + st->flops_head) * N / tp;
    double comp = fl / rate;
    /* model axis: per layer, forward (and recompute) + backward, payload N x D floats */
    double S = N * D * f, tpc = 0;
    if (tp > 1) {
        /* a TP region: SP all-gather in + reduce-scatter out, or one all-reduce out without SP */
        double region = sp_on ? t_gather(S, tp, lm) + t_reduce_scatter(S, tp, lm) : t_allreduce(S, tp, lm);
        /* mixer regions (attention), ffn regions (the dense FFN); pieces in the SP region
         * (MoE) need no collective with SP and one all-gather of their output without */
        double fwd = bc.mixer_regions * region + bc.ffn_regions * region +
                     bc.sp_gathers * (sp_on ? 0.0 : t_gather(S, tp, lm));
        tpc = fwd * (2.0 + (rc ? 1.0 : 0.0));   /* backward runs the conjugates; recompute the forward again */
    }
    /* expert axis: per MoE layer a count exchange + dispatch + combine forward, two backward */
    double epc = 0;
    if (ep > 1 && n_moe) {
        double Nm = tp > 1 ? N / tp : N, Sa = Nm * cfg->top_k * D * f;
        double a2a = (double)(ep - 1) / ep * Sa / link_bw(le, Sa, 0) + (ep - 1) * le.latency;
        double cnt = (ep - 1) * le.latency;
        epc = n_moe * ((cnt + 2 * a2a) * (1.0 + (rc ? 1.0 : 0.0)) + 2 * a2a);
    }
    /* pipe axis: activation out, gradient back (Nr x D floats) */
    double ppc = 0;
    if (pp > 1) {
        double Sr = (sp_on ? N / tp : N) * D * f;
        ppc = 2 * (Sr / link_bw(lp, Sr, 0) + lp.latency);
    }
    o->fl = fl;
    o->comp = comp;
    o->tp = tpc;
    o->ep = epc;
    o->pp = ppc;
}

/* Stage s's data axes (its ZeRO engines) and optimizer, on the busiest
 * group rank, in seconds: `total` the reductions and gathers, `exposed` the
 * part the backward (`comp`, one microbatch's compute) cannot hide, `opt`
 * Muon's Newton-Schulz (`opt_flops`) plus the TP gathers of split matrices. */
struct stage_dp {
    double total, exposed, opt, opt_flops;
};
static void stage_data(const struct mt_plan *p, const struct mt_plan_profile *prof, int s, double comp, double opt_rate,
                       struct mt_plan_link lm, struct stage_dp *o)
{
    const struct mt_config *cfg = &p->cfg;
    const struct mt_mesh_dims *d = &p->su.dims;
    const int M = cfg->microbatches > 0 ? cfg->microbatches : 1, tp = d->tp;
    const struct stage_plan *st = &p->st[s];
    double dpt = 0, dpx = 0, opt = 0, opt_fl = 0;
    for (int k = 0; k < mt_layout_n_engines(d); k++) {
        const struct eng_plan *e = &st->eng[k];
        const struct mt_plan_link l = group_link(p, prof, (enum mt_mesh_group)e->group);
        const int g = e->size, z = p->zero;
        const double W = e->param_bytes, calls = e->units;
        double ov_ar = 0, ov_mb = 0, nov = 0;
        if (g > 1 && W > 0) {
            /* one call per unit: the per-call latencies of a sweep */
            double ag = t_gather(W, g, l) + calls * (g - 1) * l.latency;
            /* grad_reduce_dtype=bf16: the gradient reductions move 2 bytes per element
             * (zero.c); the parameter gathers stay fp32 */
            const double Wr = strcmp(cfg->grad_reduce_dtype, "bf16") ? W : 0.5 * W;
            double rs = t_reduce_scatter(Wr, g, l) + calls * (g - 1) * l.latency;
            double ar = t_allreduce(Wr, g, l) + calls * 2 * (g - 1) * l.latency;
            if (z <= 1) ov_ar += ar;                 /* during the last microbatch's backward */
            if (z == 1 || z == 2) nov += ag;        /* after the optimizer step: nothing to hide behind */
            if (z >= 2) ov_mb += M * rs;            /* reduce-scatter per microbatch, in its backward */
            if (z == 3) ov_mb += cfg->reshard_after_forward ? 2.0 * M * ag : ag;   /* prefetched gathers */
        }
        double win_ar = comp * 2.0 / 3.0, win_mb = M * comp;
        double ov = ov_ar + ov_mb;
        double hidden = prof->overlap * ((ov_ar < win_ar ? ov_ar : win_ar) + (ov_mb < win_mb ? ov_mb : win_mb));
        double last_unit = calls > 0 ? ov / calls : 0;   /* the last unit's reduction has nothing to hide behind */
        double exposed = ov - hidden;
        if (exposed < last_unit && ov > 0) exposed = last_unit;
        dpt += ov + nov;
        dpx += exposed + nov;
        /* Newton–Schulz of the matrices the busiest group rank updates (+ TP gathers of split ones) */
        double mf = 0, mg = 0;
        for (int r = 0; r < g; r++) {
            int idx = z == 0 ? r : g + r;
            if (e->opt_flops[idx] > mf) mf = e->opt_flops[idx];
            if (e->opt_gather[idx] > mg) mg = e->opt_gather[idx];
        }
        opt += mf / opt_rate + (tp > 1 ? t_gather(mg, tp, lm) : 0.0);
        opt_fl += mf;
    }
    o->total = dpt;
    o->exposed = dpx;
    o->opt = opt;
    o->opt_flops = opt_fl;
}

/* The step time: every stage's microbatch (stage_microbatch) and data axes
 * (stage_data); the slowest microbatch paces the pipeline, M of them plus
 * pp - 1 of bubble, then the exposed data-axis time and the optimizer of the
 * stage where those are largest. */
void mt_plan_cost(const struct mt_plan *p, const struct mt_plan_profile *prof, struct mt_plan_cost *out)
{
    memset(out, 0, sizeof *out);
    const struct mt_config *cfg = &p->cfg;
    const int M = cfg->microbatches > 0 ? cfg->microbatches : 1, pp = p->su.dims.pp;
    const double T = cfg->seq_len;
    const double rate = cost_rate(p, prof, out), peak = out->peak_per_rank;
    out->flops_per_step = mt_model_flops_per_token(cfg) * cfg->batch_size * T;

    const struct mt_plan_link lm = group_link(p, prof, MT_MESH_GROUP_MODEL);
    const struct mt_plan_link le = group_link(p, prof, MT_MESH_GROUP_EXPERT);
    const struct mt_plan_link lp = group_link(p, prof, MT_MESH_GROUP_PIPE);
    double t_mb_max = 0, comp_mb_max = 0, opt_max = 0, dp_total = 0, dp_exposed = 0, rank_flops = 0;
    double tp_mb_max = 0, ep_mb_max = 0, pp_mb_max = 0, opt_flops = 0;
    for (int s = 0; s < pp; s++) {
        struct stage_mb mb;
        stage_microbatch(p, s, rate, lm, le, lp, &mb);
        double t_mb = mb.comp + mb.tp + mb.ep + mb.pp;
        if (t_mb > t_mb_max) {
            t_mb_max = t_mb;
            comp_mb_max = mb.comp;
            tp_mb_max = mb.tp;
            ep_mb_max = mb.ep;
            pp_mb_max = mb.pp;
            rank_flops = mb.fl * M;
        }
        struct stage_dp dp;
        stage_data(p, prof, s, mb.comp, out->optimizer_rate, lm, &dp);
        if (s == 0 || dp.exposed + dp.opt > dp_exposed + opt_max) {
            dp_exposed = dp.exposed;
            opt_max = dp.opt;
            dp_total = dp.total;
            opt_flops = dp.opt_flops;
        }
    }
    out->rank_flops = rank_flops;
    out->optimizer_flops = opt_flops;
    out->compute_s = M * comp_mb_max + opt_max;
    out->tp_s = M * tp_mb_max;
    out->ep_s = M * ep_mb_max;
    out->pp_s = M * pp_mb_max;
    out->dp_s = dp_total;
    out->dp_exposed_s = dp_exposed;
    out->bubble_s = (pp - 1) * t_mb_max;
    out->step_s = (M + pp - 1) * t_mb_max + dp_exposed + opt_max;
    out->tokens_per_s = out->step_s > 0 ? cfg->batch_size * T / out->step_s : 0;
    out->mfu = out->step_s > 0 ? out->flops_per_step / (out->step_s * p->world * peak) : 0;
}

/* ------------------------------------------------------------------ */
/* cost by op kind                                                     */
/* ------------------------------------------------------------------ */

static const char *const kind_names[MT_PLAN_KIND_COUNT] = {
    "gemm", "attention_fwd", "attention_bwd", "norm", "elementwise", "xent", "optimizer", "scan", "comm", "bubble",
};
const char *mt_plan_kind_name(enum mt_plan_kind k) { return k < MT_PLAN_KIND_COUNT ? kind_names[k] : "?"; }

/* Work per token of one training step (forward + backward): FLOPs f[] and
 * activation elements read + written e[] (fp32, x 4 bytes later), by op
 * kind: struct mt_work (mt_blocks.h), whose indices are ours. Each block's
 * pieces say theirs (work_per_token: attention.c, mlp.c, moe.c, mamba.c). */
_Static_assert((int)MT_WORK_GEMM == (int)MT_PLAN_KIND_GEMM &&
                   (int)MT_WORK_ATTENTION_FWD == (int)MT_PLAN_KIND_ATTENTION_FWD &&
                   (int)MT_WORK_ATTENTION_BWD == (int)MT_PLAN_KIND_ATTENTION_BWD &&
                   (int)MT_WORK_NORM == (int)MT_PLAN_KIND_NORM &&
                   (int)MT_WORK_ELEMENTWISE == (int)MT_PLAN_KIND_ELEMENTWISE &&
                   (int)MT_WORK_XENT == (int)MT_PLAN_KIND_XENT && (int)MT_WORK_OPTIMIZER == (int)MT_PLAN_KIND_OPTIMIZER &&
                   (int)MT_WORK_SCAN == (int)MT_PLAN_KIND_SCAN,
               "struct mt_work's indices are the planner's op kinds");

/* Layers [l0, l1) of a stage, plus its embedding (first stage: gather
 * forward, scatter-add backward) and head (last: final norm; the logits'
 * softmax and loss read them twice and write their gradient: 3 V). */
static void stage_work(const struct mt_plan *p, int l0, int l1, int rc, struct mt_work *w)
{
    const struct mt_config *cfg = &p->cfg;
    memset(w, 0, sizeof *w);
    struct mt_block_shape s;
    mt_blocks_shape(cfg, &s);
    s.scan_bf16 = p->scan_bf16;
    s.moe_dev_sizes = p->moe_dev_sizes;
    for (int l = l0; l < l1; l++) {
        w->f[MT_PLAN_KIND_GEMM] += (6.0 + 2.0 * rc) * mt_blocks_layer_mm(cfg, &s, l);
        mt_blocks_layer_work(cfg, &s, l, rc, w);   /* each step's, in order */
    }
    /* precision=bf16 (cuda): the embedding's gather reads a row, writes x (2 D)
     * and its backward reads dy and adds into the gradient's row (3 D); the
     * final norm writes h's bf16 twin too (forward 2.5 D, backward 3 D); and
     * the cross-entropy reads each logit once and writes only the bf16
     * dlogits: on bf16 logits (xent_fused_bf16_logits, the default) 1 V
     * (with knob head_bf16_logits=0, fp32 logits: 1.5 V) */
    const int bf16 = !strcmp(cfg->precision, "bf16");
    if (l0 == 0) w->e[MT_PLAN_KIND_ELEMENTWISE] += bf16 ? 5.0 * (double)s.D : 4.0 * (double)s.D;
    if (l1 == cfg->n_layer) {
        w->f[MT_PLAN_KIND_GEMM] += 6.0 * (double)cfg->vocab_size * (double)s.D;
        w->e[MT_PLAN_KIND_NORM] += bf16 ? 5.5 * (double)s.D : 5.0 * (double)s.D;
        w->e[MT_PLAN_KIND_XENT] += (bf16 ? (p->head_bf16_logits ? 1.0 : 1.5) : 3.0) * (double)cfg->vocab_size;
    }
}

/* The optimizer's passes over the parameters group rank 0 updates (every
 * one at ZeRO-0): its class's pass_bytes per parameter (AdamW reads p, g,
 * m, v and writes p, m, v: 28; Muon's momentum 16 and update 12), the gradient zeroing 4, the
 * bf16 shadow of a matrix (precision=bf16) its class's shadow_bytes (AdamW
 * writes it in its pass: 2; the refresh after Muon's update: 6), its
 * class's extra_bytes (Muon: Newton–Schulz's passes on the full matrix) and
 * the clip's 8 where the class does not take the scale (Muon). */
static double optimizer_bytes(const struct mt_plan *p, const struct stage_plan *sp)
{
    int P;
    const struct mt_param *ps = mt_model_params(sp->model, &P);
    const int bf16 = !strcmp(p->cfg.precision, "bf16");
    double b = 0;
    for (int i = 0; i < P; i++) {
        const struct eng_plan *e = &sp->eng[sp->engine[i]];
        if (ps[i].frozen || (p->zero > 0 && e->owner && e->owner[i] != 0)) continue;
        double per = mt_optim_class(ps[i].optim)->pass_bytes;
        if (bf16 && ps[i].ndim == 2 && !strstr(ps[i].name, "embed_tokens"))
            per += mt_optim_class(ps[i].optim)->shadow_bytes;
        /* the gradient's zeroing (4), none for one its first GEMM writes on
         * ZeRO-0/1 (grad_gemm, zero.c gfull_zero); precision=bf16 also counts the
         * gradient norm's sumsq_multi read (4; the clip's scale is inside
         * adamw_multi, and one rank has no marking pass) */
        const double zeroing = ps[i].grad_gemm && p->zero <= 1 ? 0.0 : 4.0;
        b += (double)ps[i].numel * (bf16 ? per + zeroing + 4.0 : per + zeroing);
        const struct mt_optim_i *oc = mt_optim_class(ps[i].optim);
        if (oc->extra_bytes) b += oc->extra_bytes(&ps[i], p->muon_bf16);   /* Muon: Newton–Schulz's passes */
        /* the clip in place (read, write) for a class that does not take its scale: counted as
         * if it clips, as training's first steps do (the norm decides at run time) */
        if (p->cfg.grad_clip > 0 && !oc->takes_gscale) b += 8.0 * (double)ps[i].numel;
    }
    return b;
}

/* The rate each kind runs at (mt_plan_kinds); a kind with none is bytes only. */
static void kind_rates(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                       struct mt_plan_kinds *out)
{
    const double fb = prof->attn_rate;
    const int bf16 = cost->peak_basis && !strcmp(cost->peak_basis, "bf16");
    out->gemm_rate = cost->peak_per_rank * cost->efficiency;
    out->mem_bandwidth = prof->mem_bandwidth;
    /* precision=bf16 runs the tensor-core attention: its own measured rate when the profile has one */
    if (bf16 && prof->attn_bf16_rate > 0) {
        out->attn_fwd_rate = out->attn_bwd_rate = prof->attn_bf16_rate;
        out->attn_basis = "measured (bf16 tensor-core kernels)";
    } else {
        out->attn_fwd_rate = prof->attn_fwd_rate > 0 ? prof->attn_fwd_rate : fb > 0 ? fb : out->gemm_rate;
        out->attn_bwd_rate = prof->attn_bwd_rate > 0 ? prof->attn_bwd_rate : fb > 0 ? fb : out->gemm_rate;
        out->attn_basis = prof->attn_fwd_rate > 0 || fb > 0 ? "measured" : "gemm rate";
    }
    /* ... and the scan's products on tensor cores (ssm_scan_*_bf16) likewise, unless the
     * run's knob scan_bf16=0 keeps the fp32 scan (CUDA cores: its own rate below) */
    const int scan_tc = bf16 && p->scan_bf16;
    if (scan_tc && prof->scan_bf16_rate > 0) {
        out->scan_rate = prof->scan_bf16_rate;
        out->scan_basis = "measured (bf16 tensor-core scan)";
    } else if (scan_tc && prof->attn_bf16_rate > 0) {
        /* no measured bf16 scan: the fp32 scan's rate (CUDA cores) would price
         * tensor-core kernels at a tenth of their speed; the tensor-core
         * attention's measured rate stands in (the same mma.sync design), and
         * the bytes the pieces count usually decide (docs/plan.md) */
        out->scan_rate = prof->attn_bf16_rate;
        out->scan_basis = "proxy: the bf16 attention's measured rate (no measured bf16 scan)";
    } else {
        out->scan_rate = prof->scan_rate > 0 ? prof->scan_rate : out->gemm_rate;
        const char *m = bf16 && !p->scan_bf16 ? "measured (fp32 scan: knob scan_bf16=0)" : "measured";
        out->scan_basis = prof->scan_rate > 0 ? m : "gemm rate";
    }
    /* the MoE experts' grouped kernels (mma.sync, gemm_grouped.cu; or wgmma,
     * gemm_grouped_wg.cu, under knob grouped_gemm_kernel=wgmma): the measured rate of the
     * family that runs; without one, the dense GEMMs' (cuBLAS) rate, named as the
     * assumption it is (never the other family's) */
    const double grouped = p->grouped_wgmma ? prof->grouped_wgmma_bf16_rate : prof->grouped_bf16_rate;
    if (bf16 && grouped > 0) {
        out->grouped_rate = grouped;
        out->grouped_basis = p->grouped_wgmma ? "measured (grouped bf16 expert kernels on wgmma)"
                                              : "measured (grouped bf16 expert kernels)";
    } else {
        out->grouped_rate = out->gemm_rate;
        out->grouped_basis = p->grouped_wgmma ? "assumed: the GEMM rate (no measured wgmma grouped rate)"
                                              : "assumed: the GEMM rate (no measured grouped rate)";
    }
}

static double kind_rate(const struct mt_plan_kinds *k, int kind)
{
    switch (kind) {
    case MT_PLAN_KIND_GEMM:          return k->gemm_rate;
    case MT_PLAN_KIND_ATTENTION_FWD: return k->attn_fwd_rate;
    case MT_PLAN_KIND_ATTENTION_BWD: return k->attn_bwd_rate;
    case MT_PLAN_KIND_SCAN:          return k->scan_rate;
    default:                         return 0.0;
    }
}

/* One microbatch of stage st on one rank: each kind's FLOPs, bytes and
 * roofline time (*fg: the GEMM FLOPs on the grouped kernels, at their rate);
 * returns the sum of the times. */
static double stage_kinds(const struct mt_plan *p, const struct mt_plan_kinds *k, int st, double f[], double b[],
                          double t[], double *fg)
{
    const struct mt_config *cfg = &p->cfg;
    const double N = (double)p->Bm * cfg->seq_len / p->su.dims.tp;   /* this rank's rows of a microbatch */
    struct mt_work w;
    stage_work(p, p->su.first_layer[st], p->su.first_layer[st + 1], !strcmp(cfg->recompute, "block"), &w);
    double sum = 0;
    for (int i = 0; i < MT_PLAN_KIND_OPTIMIZER; i++) {
        f[i] = w.f[i] * N;
        b[i] = w.e[i] * N * sizeof(float);
        const double r = kind_rate(k, i), tb = b[i] / k->mem_bandwidth;
        double tf = r > 0 ? f[i] / r : 0;
        if (i == MT_PLAN_KIND_GEMM) {   /* the grouped share at its own rate */
            *fg = w.f_grouped * N;
            tf = (f[i] - *fg) / r + *fg / k->grouped_rate;
        }
        t[i] = tf > tb ? tf : tb;
        sum += t[i];
    }
    f[MT_PLAN_KIND_SCAN] = w.f[MT_PLAN_KIND_SCAN] * N;
    b[MT_PLAN_KIND_SCAN] = w.e[MT_PLAN_KIND_SCAN] * N * sizeof(float);
    const double ts = f[MT_PLAN_KIND_SCAN] / k->scan_rate, tsb = b[MT_PLAN_KIND_SCAN] / k->mem_bandwidth;
    t[MT_PLAN_KIND_SCAN] = ts > tsb ? ts : tsb;
    return sum + t[MT_PLAN_KIND_SCAN];
}

void mt_plan_cost_kinds(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                        struct mt_plan_kinds *out)
{
    memset(out, 0, sizeof *out);
    if (!prof || prof->mem_bandwidth <= 0 || cost->peak_per_rank <= 0) return;
    kind_rates(p, prof, cost, out);
    const int M = p->cfg.microbatches > 0 ? p->cfg.microbatches : 1, pp = p->su.dims.pp;
    double best = -1;
    for (int st = 0; st < pp; st++) {   /* the slowest stage's microbatch */
        double f[MT_PLAN_KIND_COUNT] = {0}, b[MT_PLAN_KIND_COUNT] = {0}, t[MT_PLAN_KIND_COUNT] = {0}, fg = 0;
        double sum = stage_kinds(p, out, st, f, b, t, &fg);
        if (sum <= best) continue;
        best = sum;
        out->stage = st;
        out->grouped_flops = M * fg;
        for (int i = 0; i < MT_PLAN_KIND_COUNT; i++) out->flops[i] = M * f[i], out->bytes[i] = M * b[i], out->s[i] = M * t[i];
    }
    /* the optimizer: Newton–Schulz GEMMs, then the elementwise passes */
    out->flops[MT_PLAN_KIND_OPTIMIZER] = cost->optimizer_flops;
    out->bytes[MT_PLAN_KIND_OPTIMIZER] = optimizer_bytes(p, &p->st[out->stage]);
    out->optimizer_rate = cost->optimizer_rate;
    out->optimizer_basis = cost->optimizer_basis;
    out->s[MT_PLAN_KIND_OPTIMIZER] = cost->optimizer_flops / cost->optimizer_rate +
                                     out->bytes[MT_PLAN_KIND_OPTIMIZER] / out->mem_bandwidth;
    const double blocking = cost->tp_s + cost->ep_s + cost->pp_s;   /* per step: M microbatches */
    out->s[MT_PLAN_KIND_COMM] = blocking + cost->dp_exposed_s;
    out->s[MT_PLAN_KIND_BUBBLE] = (pp - 1) * (best + blocking / M);
    for (int i = 0; i < MT_PLAN_KIND_COUNT; i++) out->step_s += out->s[i];
    out->valid = 1;
}

/* ------------------------------------------------------------------ */
/* JSON                                                                */
/* ------------------------------------------------------------------ */

/* The buckets, then "runtime" if rt != NULL, then "total" (of all of them). */
static cJSON *bytes_obj(const size_t *b, const struct mt_plan_runtime_terms *rt)
{
    cJSON *o = cJSON_CreateObject();
    double t = 0;
    for (int k = 0; k < NB; k++) {
        cJSON_AddNumberToObject(o, mt_bucket_name((enum mt_bucket)k), (double)b[k]);
        t += (double)b[k];
    }
    if (rt) {
        cJSON_AddNumberToObject(o, "runtime", rt->total);
        t += rt->total;
    }
    cJSON_AddNumberToObject(o, "total", t);
    return o;
}

void mt_plan_bytes_json(const size_t *bytes, char *buf, size_t len)
{
    cJSON *o = bytes_obj(bytes, NULL);
    char *t = cJSON_PrintUnformatted(o);
    snprintf(buf, len, "%s", t ? t : "{}");
    free(t);
    cJSON_Delete(o);
}

static cJSON *shape_arr(int ndim, const int64_t *s)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s[i]));
    return a;
}

/* mt_plan_json's sections, each appended to root in the order of docs/plan.md
 * (meshtrain.plan/1), so the golden files read like the document. */

/* "mesh" (sizes, groups, pipeline stages), "batch" and "parameters" */
static void plan_json_mesh(cJSON *root, const struct mt_plan *p)
{
    const struct mt_config *cfg = &p->cfg;
    const struct mt_mesh_dims *d = &p->su.dims;
    cJSON *m = cJSON_AddObjectToObject(root, "mesh");
    cJSON_AddNumberToObject(m, "world", p->world);
    cJSON_AddNumberToObject(m, "pp", d->pp);
    cJSON_AddNumberToObject(m, "dp", d->dp);
    cJSON_AddNumberToObject(m, "ep", d->ep);
    cJSON_AddNumberToObject(m, "tp", d->tp);
    cJSON_AddBoolToObject(m, "sequence_parallel", d->tp > 1 && cfg->sequence_parallel);
    cJSON_AddNumberToObject(m, "zero_stage", p->zero);
    cJSON *gs = cJSON_AddObjectToObject(m, "group_sizes");
    for (int g = 0; g < MT_MESH_GROUP_COUNT; g++)
        cJSON_AddNumberToObject(gs, mt_mesh_group_name((enum mt_mesh_group)g), mt_mesh_group_size(d, (enum mt_mesh_group)g));
    cJSON *stages = cJSON_AddArrayToObject(m, "pipeline_stages");
    for (int s = 0; s < d->pp; s++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "stage", s);
        cJSON_AddNumberToObject(o, "first_layer", p->su.first_layer[s]);
        cJSON_AddNumberToObject(o, "end_layer", p->su.first_layer[s + 1]);
        cJSON_AddNumberToObject(o, "activation_slots", mt_layout_n_slots(cfg, d, s));
        cJSON_AddItemToArray(stages, o);
    }
    cJSON *bt = cJSON_AddObjectToObject(root, "batch");
    cJSON_AddNumberToObject(bt, "batch_size", cfg->batch_size);
    cJSON_AddNumberToObject(bt, "microbatches", cfg->microbatches);
    cJSON_AddNumberToObject(bt, "micro_batch_seqs", p->Bm);
    cJSON_AddNumberToObject(bt, "seq_len", cfg->seq_len);
    cJSON_AddStringToObject(bt, "recompute", cfg->recompute);
    size_t total = 0, active = 0;
    mt_model_param_counts(cfg, &total, &active);
    cJSON *pc = cJSON_AddObjectToObject(root, "parameters");
    cJSON_AddNumberToObject(pc, "total", (double)total);
    cJSON_AddNumberToObject(pc, "active_per_token", (double)active);
}

/* "layout": one entry per parameter (shapes, holders, reduction, ZeRO owner) */
static void plan_json_layout(cJSON *root, const struct mt_plan *p)
{
    cJSON *lay = cJSON_AddArrayToObject(root, "layout");
    int *ranks = malloc((size_t)p->world * sizeof(int));
    char *rs = malloc(4096);
    for (int i = 0; ranks && rs && i < p->n_params; i++) {
        const struct mt_plan_param *pp = &p->params[i];
        cJSON *o = cJSON_CreateObject();
        char spec[64];
        mt_plan_param_spec(p, i, spec, sizeof spec);
        cJSON_AddStringToObject(o, "name", pp->g.name);
        cJSON_AddItemToObject(o, "global_shape", shape_arr(pp->g.ndim, pp->g.shape));
        cJSON_AddStringToObject(o, "spec", spec);
        cJSON_AddItemToObject(o, "local_shape", shape_arr(pp->g.ndim, pp->local));
        cJSON_AddNumberToObject(o, "stage", pp->stage);
        if (pp->expert_rank >= 0) cJSON_AddNumberToObject(o, "expert_rank", pp->expert_rank);
        else cJSON_AddNullToObject(o, "expert_rank");
        int n = mt_plan_param_ranks(p, i, MT_PLAN_HOLDERS, ranks);
        mt_plan_ranks_str(ranks, n, rs, 4096);
        cJSON_AddStringToObject(o, "holders", rs);
        cJSON_AddNumberToObject(o, "n_holders", n);
        cJSON_AddStringToObject(o, "reduce_group", mt_mesh_group_name((enum mt_mesh_group)pp->group));
        cJSON_AddNumberToObject(o, "reduce_group_size", pp->group_size);
        cJSON_AddBoolToObject(o, "partial_over_model", pp->reduce_model);
        cJSON *z = cJSON_AddObjectToObject(o, "zero");
        cJSON_AddStringToObject(z, "sharded", p->zero == 0 ? "none" : p->zero == 1 ? "optim" :
                                              p->zero == 2 ? "optim+grads" : "optim+grads+params");
        cJSON_AddNumberToObject(z, "owner_group_rank", pp->owner);
        n = mt_plan_param_ranks(p, i, MT_PLAN_OPTIMIZERS, ranks);
        mt_plan_ranks_str(ranks, n, rs, 4096);
        cJSON_AddStringToObject(z, "optimizer_ranks", rs);
        /* "frozen": a LoRA base tensor (no gradient, no optimizer state), as in the text table */
        cJSON_AddStringToObject(o, "optimizer", pp->g.frozen ? "frozen" : mt_optim_class(pp->g.optim)->name);
        cJSON_AddItemToArray(lay, o);
    }
    free(ranks);
    free(rs);
}

/* "memory": bytes and runtime terms per rank, the runtime model, the maximum */
static void plan_json_memory(cJSON *root, const struct mt_plan *p)
{
    const struct mt_mesh_dims *d = &p->su.dims;
    cJSON *mem = cJSON_AddObjectToObject(root, "memory");
    cJSON *per = cJSON_AddArrayToObject(mem, "per_rank");
    for (int r = 0; r < p->world; r++) {
        struct mt_mesh_coord c;
        mt_mesh_coord_of(d, r, &c);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        char co[96];
        snprintf(co, sizeof co, "pipe=%d,data=%d,expert=%d,model=%d", c.pipe, c.data, c.expert, c.model);
        cJSON_AddStringToObject(o, "coord", co);
        size_t b[NB];
        mt_plan_rank_bytes(p, r, b);
        struct mt_plan_runtime_terms rt;
        mt_plan_rank_runtime(p, r, &rt);
        cJSON_AddItemToObject(o, "bytes", bytes_obj(b, &rt));
        cJSON *rj = cJSON_AddObjectToObject(o, "runtime_terms");
        cJSON_AddNumberToObject(rj, "base", rt.base);
        cJSON_AddNumberToObject(rj, "threads", rt.threads);
        cJSON_AddNumberToObject(rj, "mpi", rt.mpi);
        cJSON_AddNumberToObject(rj, "collective_scratch", rt.coll_scratch);
        cJSON_AddNumberToObject(rj, "data", rt.data);
        cJSON_AddNumberToObject(rj, "collective_bytes", rt.collective_bytes);
        cJSON_AddItemToArray(per, o);
    }
    cJSON *rm = cJSON_AddObjectToObject(mem, "runtime_model");
    cJSON_AddNumberToObject(rm, "threads_per_rank", p->su.threads > 0 ? p->su.threads : 1);
    cJSON_AddBoolToObject(rm, "mpi", p->world > 1);
    cJSON_AddNumberToObject(rm, "data_bytes", floor(p->su.data_bytes));
    cJSON_AddNumberToObject(rm, "base_bytes", p->rt.base_bytes);
    cJSON_AddNumberToObject(rm, "per_thread_bytes", p->rt.per_thread_bytes);
    cJSON_AddNumberToObject(rm, "per_thread_per_column_bytes", p->rt.per_thread_per_column_bytes);
    cJSON_AddNumberToObject(rm, "single_thread_bytes", p->rt.single_thread_bytes);
    cJSON_AddNumberToObject(rm, "single_thread_per_column_bytes", p->rt.single_thread_per_column_bytes);
    cJSON_AddNumberToObject(rm, "mpi_bytes", p->rt.mpi_bytes);
    cJSON_AddNumberToObject(rm, "mpi_per_peer_bytes", p->rt.mpi_per_peer_bytes);
    cJSON_AddNumberToObject(rm, "collective_scratch_ratio", p->rt.coll_scratch_ratio);
    cJSON_AddNumberToObject(rm, "reduce_scatter_scratch_ratio", p->rt.rs_scratch_ratio);
    cJSON_AddStringToObject(rm, "source", p->rt.source);
    int mx;
    size_t mt = mt_plan_max_total(p, &mx);
    cJSON_AddNumberToObject(mem, "max_rank", mx);
    cJSON_AddNumberToObject(mem, "max_total", (double)mt);
}

/* "cost.by_kind": the step by op kind (mt_plan_cost_kinds) when the profile
 * has a memory bandwidth: seconds (summing to step_s), FLOPs and bytes per
 * kind, and the rates with where they came from */
static void plan_json_kinds(cJSON *c, const struct mt_plan *p, const struct mt_plan_profile *prof,
                            const struct mt_plan_cost *cost)
{
    struct mt_plan_kinds k;
    mt_plan_cost_kinds(p, prof, cost, &k);
    if (!k.valid) return;
    cJSON *o = cJSON_AddObjectToObject(c, "by_kind");
    cJSON *sec = cJSON_AddObjectToObject(o, "seconds"), *fl = cJSON_AddObjectToObject(o, "flops");
    cJSON *by = cJSON_AddObjectToObject(o, "bytes");
    for (int i = 0; i < MT_PLAN_KIND_COUNT; i++) {
        cJSON_AddNumberToObject(sec, mt_plan_kind_name((enum mt_plan_kind)i), k.s[i]);
        cJSON_AddNumberToObject(fl, mt_plan_kind_name((enum mt_plan_kind)i), k.flops[i]);
        cJSON_AddNumberToObject(by, mt_plan_kind_name((enum mt_plan_kind)i), k.bytes[i]);
    }
    cJSON_AddNumberToObject(o, "step_s", k.step_s);
    cJSON_AddNumberToObject(o, "stage", k.stage);
    cJSON_AddNumberToObject(o, "gemm_flop_per_s", k.gemm_rate);
    cJSON_AddNumberToObject(o, "attention_fwd_flop_per_s", k.attn_fwd_rate);
    cJSON_AddNumberToObject(o, "attention_bwd_flop_per_s", k.attn_bwd_rate);
    cJSON_AddStringToObject(o, "attention_basis", k.attn_basis);
    cJSON_AddNumberToObject(o, "scan_flop_per_s", k.scan_rate);
    cJSON_AddStringToObject(o, "scan_basis", k.scan_basis);
    cJSON_AddNumberToObject(o, "gemm_grouped_flops", k.grouped_flops);
    cJSON_AddNumberToObject(o, "gemm_grouped_flop_per_s", k.grouped_rate);
    cJSON_AddStringToObject(o, "gemm_grouped_basis", k.grouped_basis);
    cJSON_AddNumberToObject(o, "optimizer_flop_per_s", k.optimizer_rate);
    cJSON_AddStringToObject(o, "optimizer_basis", k.optimizer_basis);
    cJSON *kn = cJSON_AddObjectToObject(o, "knobs");   /* the run's knobs this model priced */
    cJSON_AddNumberToObject(kn, "scan_bf16", p->scan_bf16);
    cJSON_AddNumberToObject(kn, "head_bf16_logits", p->head_bf16_logits);
    cJSON_AddNumberToObject(kn, "moe_dev_sizes", p->moe_dev_sizes);
    cJSON_AddStringToObject(kn, "grouped_gemm_kernel", p->grouped_wgmma ? "wgmma" : "mma");
    cJSON_AddNumberToObject(kn, "optim_gemm_bf16", p->optim_gemm_bf16);
    cJSON_AddNumberToObject(o, "memory_bandwidth_bytes_per_s", k.mem_bandwidth);
    cJSON_AddStringToObject(o, "memory_bandwidth_basis", prof->mem_basis);
}

/* "cost": the time model's terms */
static void plan_json_cost(cJSON *root, const struct mt_plan *p, const struct mt_plan_profile *prof,
                           const struct mt_plan_cost *cost)
{
    cJSON *c = cJSON_AddObjectToObject(root, "cost");
    cJSON_AddStringToObject(c, "profile", prof->name);
    cJSON_AddNumberToObject(c, "peak_flops_per_rank", cost->peak_per_rank);
    cJSON_AddStringToObject(c, "peak_basis", cost->peak_basis);
    cJSON_AddNumberToObject(c, "efficiency", cost->efficiency);
    cJSON_AddNumberToObject(c, "flops_per_step", cost->flops_per_step);
    cJSON_AddNumberToObject(c, "busiest_rank_flops", cost->rank_flops);
    cJSON_AddNumberToObject(c, "optimizer_flops", cost->optimizer_flops);
    cJSON_AddNumberToObject(c, "compute_s", cost->compute_s);
    cJSON_AddNumberToObject(c, "tp_comm_s", cost->tp_s);
    cJSON_AddNumberToObject(c, "ep_comm_s", cost->ep_s);
    cJSON_AddNumberToObject(c, "pp_comm_s", cost->pp_s);
    cJSON_AddNumberToObject(c, "dp_comm_s", cost->dp_s);
    cJSON_AddNumberToObject(c, "dp_exposed_s", cost->dp_exposed_s);
    cJSON_AddNumberToObject(c, "bubble_s", cost->bubble_s);
    cJSON_AddNumberToObject(c, "step_s", cost->step_s);
    cJSON_AddNumberToObject(c, "tokens_per_s", cost->tokens_per_s);
    cJSON_AddNumberToObject(c, "mfu", cost->mfu);
    plan_json_kinds(c, p, prof, cost);
}

char *mt_plan_json(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "meshtrain.plan/1");
    char *cj = mt_config_to_json(&p->cfg);
    cJSON *cfgj = cj ? cJSON_Parse(cj) : NULL;
    free(cj);
    cJSON_AddItemToObject(root, "config", cfgj ? cfgj : cJSON_CreateNull());
    plan_json_mesh(root, p);
    if (p->n_params) plan_json_layout(root, p);
    plan_json_memory(root, p);
    if (cost && prof) plan_json_cost(root, p, prof, cost);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    return txt;
}
