/*
 * piece_rules.c — what each piece of the block-kind table requires of the
 * config and of the mesh (struct mt_piece_rules, mt_blocks.h): its keys'
 * divisibility and what it refuses. Kept apart from the pieces' files (which
 * pull in the ops) so that src/core (mt_config_resolve) and src/parallel
 * (mt_mesh_check_contract) link them through block_traits.c without the
 * layers. A new piece adds its rules here (or in any file core links) and
 * names them nowhere else: the kind table's MT_STEP(piece, ...) finds
 * mt_piece_rules_<piece>.
 *
 * The rules the whole model shares (vocab, heads, head_dim, mlp_hidden, the
 * attention and MLP splits over tp, batch) stay in config.c and mesh.c: they
 * hold for every pattern, whichever pieces it uses.
 */
#include "mt_blocks.h"
#include "../core/mt_core.h"
#include "../parallel/mt_mesh.h"   /* enum mt_axis */

#include <stdint.h>

#define RULE(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return mt_ctx_error(ctx, MT_ERR_CONFIG, __VA_ARGS__); \
    } while (0)

#define CONTRACT_FAIL(ctx, ...) mt_ctx_error((ctx), MT_ERR_CONFIG, "mesh contract: " __VA_ARGS__)

/* ---- attention, mlp: the model's own dims (config.c, mesh.c) ---- */

const struct mt_piece_rules mt_piece_rules_attention = {"attention", NULL, NULL};
const struct mt_piece_rules mt_piece_rules_mlp = {"mlp", NULL, NULL};

/* ---- moe: routed experts (n_experts, n_null_experts, top_k, expert_hidden) ---- */

/* expert_hidden is derived (F / 4 when 0) by config.c before this runs */
static enum mt_status moe_check_config(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    RULE(cfg->top_k >= 1 && cfg->top_k <= cfg->n_experts + cfg->n_null_experts,
         "top_k in [1, n_experts + n_null_experts] (top_k=%d, n_experts=%d, n_null_experts=%d)", cfg->top_k,
         cfg->n_experts, cfg->n_null_experts);
    RULE(cfg->expert_hidden > 0, "expert_hidden > 0 (expert_hidden=%d, mlp_hidden=%d)", cfg->expert_hidden,
         cfg->mlp_hidden);
    return MT_OK;
}

/* the expert axis splits the experts: whole experts per expert rank */
static enum mt_status moe_check_axis(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree)
{
    if (axis == MT_AXIS_EP) {
        if (cfg->n_experts < 1 || cfg->n_experts % degree)
            return CONTRACT_FAIL(ctx, "n_experts %% ep != 0 (n_experts=%d, ep=%d)", cfg->n_experts, degree);
        if (cfg->top_k > cfg->n_experts + cfg->n_null_experts) {   /* null experts (SPEC 1e) count as choices */
            if (cfg->n_null_experts == 0)
                return CONTRACT_FAIL(ctx, "top_k > n_experts (top_k=%d, n_experts=%d)", cfg->top_k, cfg->n_experts);
            return CONTRACT_FAIL(ctx, "top_k > n_experts + n_null_experts (top_k=%d, n_experts=%d, n_null_experts=%d)",
                                 cfg->top_k, cfg->n_experts, cfg->n_null_experts);
        }
    }
    return MT_OK;
}

const struct mt_piece_rules mt_piece_rules_moe = {"moe", moe_check_config, moe_check_axis};

/* ---- mamba: the Mamba-3 mixer (mamba_d_state, _expand, _headdim, _ngroups) ---- */

static enum mt_status mamba_check_config(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    /* SPEC 1c: d_inner = expand D split into heads of P; rotary pairs need an even N */
    int64_t e = (int64_t)cfg->mamba_expand * cfg->d_model;
    RULE(cfg->mamba_d_state % 2 == 0, "mamba_d_state must be even (mamba_d_state=%d)", cfg->mamba_d_state);
    RULE(e <= (1 << 24), "mamba_expand * d_model too large (mamba_expand=%d, d_model=%d)", cfg->mamba_expand,
         cfg->d_model);
    RULE(e % cfg->mamba_headdim == 0, "mamba_headdim must divide d_inner = mamba_expand * d_model (mamba_headdim=%d, d_inner=%lld)",
         cfg->mamba_headdim, (long long)e);
    int64_t nh = e / cfg->mamba_headdim;
    RULE(nh % cfg->mamba_ngroups == 0, "mamba_ngroups must divide nheads = d_inner / mamba_headdim (mamba_ngroups=%d, nheads=%lld)",
         cfg->mamba_ngroups, (long long)nh);
    return MT_OK;
}

/* heads split over the model axis; B/C groups split when
 * mamba_ngroups % tp == 0, else computed replicated (SPEC 1c;
 * docs/mamba3.md, "The model axis") */
static enum mt_status mamba_check_axis(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree)
{
    const int tp = degree;
    if (axis == MT_AXIS_TP && tp > 1) {
        long long mh = cfg->mamba_headdim > 0 ? (long long)cfg->mamba_expand * cfg->d_model / cfg->mamba_headdim : 0;
        if (mh % tp)
            return CONTRACT_FAIL(ctx,
                                 "mamba nheads %% tp != 0 (nheads=%lld = mamba_expand*d_model/mamba_headdim, tp=%d): "
                                 "the model axis splits the Mamba-3 mixer by heads",
                                 mh, tp);
    }
    return MT_OK;
}

const struct mt_piece_rules mt_piece_rules_mamba = {"mamba", mamba_check_config, mamba_check_axis};
