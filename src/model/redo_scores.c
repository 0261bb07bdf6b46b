/*
 * redo_scores.c — ReDo's score accumulators on the model side (SPEC 1e;
 * docs/model.md "ReDo: recycling dormant units").
 *
 * A SwiGLU "set" is one dense MLP (mlp piece), one routed expert, or one
 * shared expert. Unit j of a set has the score sum S_j = sum over the step's
 * tokens of q(|silu(h Wg^T)_j * (h Wu^T)_j|), q the fixed point of mt_ops.h
 * (mt_redo_fix): integers, so the sum has one value whatever the order its
 * terms are added in (threads, microbatches, ranks, meshes).
 *
 * Where the terms come from: the SwiGLU backward recomputes act = silu(g)*u
 * from the forward's saved g, u (mlp.c, moe_experts.c) — the forward's
 * activations with the weights the step's forward used, exactly once per
 * microbatch (a recompute=block forward or an evaluation forward adds
 * nothing) — and, while the model is armed (mt_model_redo_arm), adds them
 * into the layer's accumulators (pc->redo). Each (token, unit) pair is
 * computed on exactly one rank of any mesh: TP splits the dense units, the
 * data axes split the tokens, experts live on one expert rank and see every
 * token routed to them there, the pipeline splits the layers. So the world
 * sum of the local accumulators (placed at their global units,
 * mt_model_redo_scores) is the single-rank S.
 *
 * Local layout (m->redo_acc, int64, WORKSPACE), layer after layer of the
 * stage: a dense layer F/tp units (this rank's rows of Wg), an MoE layer
 * Ee*Fe (local experts, in order) then Fs (the shared expert, whole on
 * every model rank, fed its N/tp rows).
 */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"

/* The SwiGLU sets' units as this rank holds them (the config's keys of the
 * mlp and moe pieces, cut by the model and expert axes). */
struct redo_dims { size_t F, Ee, e0, Fe, Fs; };
static struct redo_dims redo_dims_of(const struct mt_model *m)
{
    const struct mt_config *cfg = &m->cfg;
    const size_t Ee = (size_t)(cfg->n_experts / m->ep);
    return (struct redo_dims){(size_t)(cfg->mlp_hidden / m->tp), Ee, (size_t)m->ep_rank * Ee,
                              (size_t)cfg->expert_hidden, (size_t)cfg->shared_expert_hidden};
}

size_t model_redo_layer_units(const struct mt_model *m, int l)
{
    if (l < m->l0 || l >= m->l1) return 0;
    const struct redo_dims d = redo_dims_of(m);
    if (mt_blocks_layer_uses(&m->cfg, l, "moe")) return d.Ee * d.Fe + d.Fs;
    if (mt_blocks_layer_uses(&m->cfg, l, "mlp")) return d.F;
    return 0;
}

size_t model_redo_offset(const struct mt_model *m, int l)
{
    size_t o = 0;
    for (int k = m->l0; k < l; k++) o += model_redo_layer_units(m, k);
    return o;
}

void model_redo_carve(struct mt_model *m, struct mt_carver *c)
{
    m->redo_acc = NULL;
    if (m->cfg.redo_every <= 0) return;
    size_t n = model_redo_offset(m, m->l1);
    m->redo_acc = carve(c, MT_BUCKET_WORKSPACE, (n ? n : 1) * sizeof(int64_t));
}

void mt_model_redo_arm(struct mt_model *m, int on)
{
    m->redo_armed = on && m->redo_acc != NULL;
    if (!m->redo_armed) return;
    const size_t n = model_redo_offset(m, m->l1);
    /* int64 zero = two fp32 zeros */
    if (n) m->ops->fill(m->ops->be, (float *)m->redo_acc, 0.0f, 2 * n);
}

int mt_model_redo_sets(const struct mt_config *cfg, struct mt_redo_set *out, int cap)
{
    int n = 0;
    size_t off = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const int moe = mt_blocks_layer_uses(cfg, l, "moe"), mlp = mt_blocks_layer_uses(cfg, l, "mlp");
        if (!moe && !mlp) continue;
        const int n_sets = moe ? cfg->n_experts + (cfg->shared_expert_hidden > 0) : 1;
        for (int k = 0; k < n_sets; k++, n++) {
            const int expert = moe ? (k < cfg->n_experts ? k : MT_REDO_SHARED) : MT_REDO_DENSE;
            const int units = expert == MT_REDO_DENSE ? cfg->mlp_hidden
                              : expert == MT_REDO_SHARED ? cfg->shared_expert_hidden : cfg->expert_hidden;
            if (out && n < cap) {
                struct mt_redo_set *s = &out[n];
                memset(s, 0, sizeof *s);
                s->layer = l;
                s->expert = expert;
                s->units = units;
                s->off = off;
                static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
                for (int p = 0; p < 3; p++) {
                    if (expert >= 0)
                        snprintf(s->name[p], sizeof s->name[p], "model.layers.%d.mlp.experts.%d.%s.weight", l, expert,
                                 proj[p]);
                    else
                        snprintf(s->name[p], sizeof s->name[p], "model.layers.%d.mlp.%s%s.weight", l,
                                 expert == MT_REDO_SHARED ? "shared_expert." : "", proj[p]);
                }
            }
            off += (size_t)units;
        }
    }
    return n;
}

enum mt_status mt_model_redo_scores(struct mt_ctx *ctx, struct mt_model *m, const struct mt_redo_set *sets,
                                    int n_sets, int64_t *global)
{
    const size_t n = model_redo_offset(m, m->l1);
    if (!m->redo_acc || n == 0) return MT_OK;
    int64_t *loc = mt_alloc(ctx, n * sizeof(int64_t), MT_BUCKET_OTHER);
    if (!loc) return MT_ERR_OOM;
    m->ops->sync(m->ops->be);
    m->ops->copy_to_host(m->ops->be, loc, m->redo_acc, n * sizeof(int64_t));
    const struct redo_dims d = redo_dims_of(m);
    for (int i = 0; i < n_sets; i++) {
        const struct mt_redo_set *s = &sets[i];
        const int l = s->layer;
        if (l < m->l0 || l >= m->l1) continue;
        const int64_t *src = loc + model_redo_offset(m, l);
        int64_t *dst = global + s->off;
        if (s->expert == MT_REDO_DENSE) {
            /* this rank's F/tp rows of Wg: global units tp_rank*F .. */
            dst += (size_t)m->tp_rank * d.F;
            for (size_t j = 0; j < d.F; j++) dst[j] += src[j];
        } else if (s->expert == MT_REDO_SHARED) {
            src += d.Ee * d.Fe;
            for (int j = 0; j < s->units; j++) dst[j] += src[j];
        } else if (s->expert >= (int)d.e0 && s->expert < (int)(d.e0 + d.Ee)) {
            src += (size_t)(s->expert - (int)d.e0) * d.Fe;
            for (int j = 0; j < s->units; j++) dst[j] += src[j];
        }
    }
    mt_free(ctx, loc);
    return MT_OK;
}
