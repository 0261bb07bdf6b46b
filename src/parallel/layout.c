/*
 * layout.c — the mesh rules (mt_layout.h), shared by the planner and the
 * trainer.
 */
#include "mt_layout.h"
#include "../model/mt_blocks.h"
#include "../model/mt_model.h"   /* MT_LOSS_MAX_PARTS */

#include <stdlib.h>
#include <string.h>

/* ---- reduction group per tensor ---- */

/* Every rule below reads the tensor's layout class (enum mt_layout, set by
 * the block table) and the mesh (degrees and sp), never the derived
 * split / reduce_model fields: the class is the one statement of the rule. */
static enum mt_layout param_class(const struct mt_param *p) { return (enum mt_layout)p->layout; }

enum mt_layout_engine mt_layout_class_engine(enum mt_layout l, const struct mt_mesh_dims *d)
{
    if (d->ep > 1 && l == MT_LAYOUT_EXPERT) return MT_LAYOUT_ENGINE_EXPERT;
    if (mt_layout_reduce_model(l, d->tp, d->sp)) return MT_LAYOUT_ENGINE_PARTIAL;
    return MT_LAYOUT_ENGINE_DENSE;
}

enum mt_layout_engine mt_layout_param_engine(const struct mt_param *p, const struct mt_mesh_dims *d)
{
    return mt_layout_class_engine(param_class(p), d);
}

/* Derived from the classes, not listed per axis: one past the highest engine
 * any layout class reaches on this mesh (engines are indexed by enum; one
 * below it that no class reaches, PARTIAL under ep > 1 and tp = 1, is
 * created empty). Gives 1, 2 (tp > 1) or 3 (ep > 1). */
int mt_layout_n_engines(const struct mt_mesh_dims *d)
{
    int n = 1;
    for (int l = 0; l < MT_LAYOUT_COUNT; l++) {
        const int e = (int)mt_layout_class_engine((enum mt_layout)l, d);
        if (e + 1 > n) n = e + 1;
    }
    return n;
}

enum mt_mesh_group mt_layout_engine_group(const struct mt_mesh_dims *d, enum mt_layout_engine e)
{
    switch (e) {
    case MT_LAYOUT_ENGINE_PARTIAL: return MT_MESH_GROUP_STAGE;
    case MT_LAYOUT_ENGINE_EXPERT:  return d->tp > 1 ? MT_MESH_GROUP_DATA_MODEL : MT_MESH_GROUP_DATA;
    default:                       return MT_MESH_GROUP_DATA_EXPERT;
    }
}

int mt_layout_group_rank(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g)
{
    struct mt_mesh_coord c;
    mt_mesh_coord_of(d, rank, &c);
    switch (g) {
    case MT_MESH_GROUP_WORLD:       return rank;
    case MT_MESH_GROUP_MODEL:       return c.model;
    case MT_MESH_GROUP_EXPERT:      return c.expert;
    case MT_MESH_GROUP_DATA:        return c.data;
    case MT_MESH_GROUP_DATA_EXPERT: return c.data * d->ep + c.expert;
    case MT_MESH_GROUP_DATA_MODEL:  return c.data * d->tp + c.model;
    case MT_MESH_GROUP_STAGE:       return (c.data * d->ep + c.expert) * d->tp + c.model;
    case MT_MESH_GROUP_PIPE:        return c.pipe;
    default:                        return 0;
    }
}

/* ---- writer and replica rules ---- */

int mt_layout_param_counted(const struct mt_param *p, const struct mt_mesh_dims *d, int tp_rank)
{
    const enum mt_layout l = param_class(p);
    return !(d->tp > 1 && mt_layout_class_engine(l, d) == MT_LAYOUT_ENGINE_DENSE && mt_layout_split(l) == MT_SPLIT_NONE &&
             tp_rank != 0);
}

int mt_layout_replicas_agree(const struct mt_mesh_dims *d, const struct mt_param *p, int rank_a, int rank_b)
{
    if (mt_layout_split(param_class(p)) == MT_SPLIT_NONE || d->tp <= 1) return 1;
    struct mt_mesh_coord ca, cb;
    mt_mesh_coord_of(d, rank_a, &ca);
    mt_mesh_coord_of(d, rank_b, &cb);
    return ca.model == cb.model;
}

/* ---- sequences ---- */

int mt_layout_micro_batch(const struct mt_config *cfg, const struct mt_mesh_dims *d)
{
    long long div = (long long)d->dp * d->ep * (cfg->microbatches > 0 ? cfg->microbatches : 1);
    return div > 0 ? (int)(cfg->batch_size / div) : 0;
}

/* ---- pipeline ---- */

int mt_layout_n_slots(const struct mt_config *cfg, const struct mt_mesh_dims *d, int stage)
{
    if (d->pp <= 1) return 1;
    int left = d->pp - stage, mb = cfg->microbatches > 0 ? cfg->microbatches : 1;
    return left < mb ? left : mb;
}

void mt_layout_model_par(const struct mt_config *cfg, const struct mt_mesh_dims *d, const int *first_layer, int rank,
                         struct mt_model_par *par)
{
    struct mt_mesh_coord c;
    mt_mesh_coord_of(d, rank, &c);
    memset(par, 0, sizeof *par);
    par->tp = d->tp;
    par->tp_rank = c.model;
    par->sp = d->tp > 1 && cfg->sequence_parallel;
    par->ep = d->ep;
    par->ep_rank = c.expert;
    par->layer0 = first_layer[c.pipe];
    par->layer1 = first_layer[c.pipe + 1];
    par->n_slots = mt_layout_n_slots(cfg, d, c.pipe);
}

size_t mt_layout_stage_io_bytes(const struct mt_model *m, const struct mt_config *cfg, int pp)
{
    if (pp <= 1) return 0;
    return (size_t)mt_model_stage_rows(m) * (size_t)cfg->d_model * sizeof(float);
}

/*
 * Contiguous split minimising the largest stage cost: dynamic programming
 * over (layers done, stages used), O(pp L^2), exact. The cost of a stage is
 * the FLOPs of its layers (mt_model_layer_flops) plus the head's 6 V D on
 * the last stage. Among equal splits the earliest cut wins (fewer layers on
 * earlier stages, which keep more microbatches in flight under 1F1B).
 */
static enum mt_status balanced_cut(struct mt_ctx *ctx, const struct mt_config *cfg, int pp, int *first)
{
    const int L = cfg->n_layer;
    if (pp < 1 || L < pp) return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh contract: n_layer >= pp (n_layer=%d, pp=%d)", L, pp);
    const size_t W = (size_t)L + 1;
    double *pre = mt_alloc(ctx, W * sizeof(double), MT_BUCKET_OTHER);
    double *best = mt_alloc(ctx, (size_t)(pp + 1) * W * sizeof(double), MT_BUCKET_OTHER);
    int *cut = mt_alloc(ctx, (size_t)(pp + 1) * W * sizeof(int), MT_BUCKET_OTHER);
    if (!pre || !best || !cut) {
        mt_free(ctx, pre);
        mt_free(ctx, best);
        mt_free(ctx, cut);
        return MT_ERR_OOM;
    }
    pre[0] = 0;
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + mt_model_layer_flops(cfg, l);
    const double head = mt_model_head_flops(cfg), INF = 1e300;
    /* best[s][j]: the least max cost placing layers [0, j) on stages [0, s) */
    for (size_t i = 0; i < (size_t)(pp + 1) * W; i++) { best[i] = INF; cut[i] = -1; }
    best[0] = 0;
    for (int s = 1; s <= pp; s++)
        for (int j = s; j <= L - (pp - s); j++)
            for (int i = s - 1; i < j; i++) {
                double prev = best[(size_t)(s - 1) * W + i];
                if (prev >= INF) continue;
                double c = pre[j] - pre[i] + (s == pp ? head : 0.0);
                double v = prev > c ? prev : c;
                if (v < best[(size_t)s * W + j] * (1 - 1e-12)) { best[(size_t)s * W + j] = v; cut[(size_t)s * W + j] = i; }
            }
    first[pp] = L;
    for (int s = pp, j = L; s >= 1; s--) {
        first[s - 1] = cut[(size_t)s * W + j];
        j = first[s - 1];
    }
    mt_free(ctx, pre);
    mt_free(ctx, best);
    mt_free(ctx, cut);
    return MT_OK;
}

enum mt_status mt_layout_pipeline_cut(struct mt_ctx *ctx, const struct mt_config *cfg, int pp, const char *spec,
                                      int *first)
{
    if (!spec || !*spec) {
        if (pp == 1) { first[0] = 0; first[1] = cfg->n_layer; return MT_OK; }
        return balanced_cut(ctx, cfg, pp, first);
    }
    int n = 0, sum = 0;
    const char *p = spec;
    first[0] = 0;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MT_MAX_LAYERS || (*end && *end != ','))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                                "--pp-layers '%s': expected pp positive layer counts separated by commas, e.g. 3,5",
                                spec);
        if (n >= pp)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--pp-layers '%s' names more than pp=%d stages", spec, pp);
        sum += (int)v;
        first[++n] = sum;
        p = *end ? end + 1 : end;
    }
    if (n != pp)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--pp-layers '%s' names %d stages, the mesh has pp=%d", spec, n, pp);
    if (sum != cfg->n_layer)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--pp-layers '%s' covers %d layers, the model has n_layer=%d", spec,
                            sum, cfg->n_layer);
    return MT_OK;
}

/* ---- host arrays ---- */

void mt_layout_host_sizes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world,
                          size_t bytes[MT_HOST_N])
{
    const size_t nh = (size_t)(n_steps > 0 ? n_steps : 1), P = (size_t)n_params, T = (size_t)cfg->seq_len;
    const int EZ = cfg->n_experts + cfg->n_null_experts;   /* the load histogram's columns (null experts last) */
    const size_t LE = (size_t)cfg->n_layer * (size_t)(EZ > 0 ? EZ : 1);
    const int moe = mt_blocks_any_routed(cfg);
    bytes[MT_HOST_ENG_OF] = P * sizeof(int);
    bytes[MT_HOST_SEL0] = bytes[MT_HOST_SEL1] = bytes[MT_HOST_SEL2] = P;
    bytes[MT_HOST_COUNT_MASK] = P;
    bytes[MT_HOST_IDX] = bytes[MT_HOST_TGT] = (size_t)Bm * T * sizeof(int32_t);
    bytes[MT_HOST_STEP_INDEX] = nh * sizeof(int);
    bytes[MT_HOST_EVAL_STEPS] = (nh + 1) * sizeof(int);
    for (int k = MT_HOST_LOSSES; k <= MT_HOST_TIMES; k++) bytes[k] = nh * sizeof(double);
    /* room for every loss part a model may register (mt_model_loss_parts: 3 of the
     * family, more under a test hook the config does not show) */
    bytes[MT_HOST_LOSS_PARTS] = nh * MT_LOSS_MAX_PARTS * sizeof(double);
    bytes[MT_HOST_EVAL_LOSSES] = (nh + 1) * sizeof(double);
    bytes[MT_HOST_MEM_ALL] = (size_t)world * 2 * MT_LAYOUT_MEM_SLOTS * sizeof(double);
    bytes[MT_HOST_IMBALANCE] = moe ? nh * sizeof(double) : 0;
    bytes[MT_HOST_LOAD_TOTAL] = bytes[MT_HOST_LOAD_STEP] = moe ? LE * sizeof(double) : 0;
}

size_t mt_layout_host_bytes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world)
{
    size_t b[MT_HOST_N], sum = 0;
    mt_layout_host_sizes(cfg, n_params, Bm, n_steps, world, b);
    for (int k = 0; k < MT_HOST_N; k++) sum += b[k];
    return sum;
}
