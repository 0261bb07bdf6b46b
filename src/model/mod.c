/*
 * mod.c — Mixture-of-Depths: the router around a routed block (pattern
 * letters a, e; SPEC 1e, docs/model.md "Mixture-of-Depths"). A wrapper of
 * the block-kind table (struct mt_block_wrap, mt_blocks.h): the kind's steps
 * run unchanged on the rows it selects.
 *
 * Math, per microbatch of B sequences of T rows x (N = B T, D), capacity c:
 *     r_i  = x_i . w                      router mod.weight [D]
 *     C    = ceil(c T)                    rows a sequence sends through the block
 *     sel  = per sequence, the C largest r (ties to the lower position),
 *            kept in their original order: idx (B C) rows, tpos their positions
 *     y    = block(x[idx])                a shorter causal sequence (B, C) whose
 *                                         RoPE reads the original positions tpos
 *     x_out_i = x_i + s_i (y_j - x_i)     s_i = sigmoid(r_i), row i = idx[j]
 *     x_out_i = x_i                       the rows not selected
 *     aux  = mod_aux_coef sum_i BCE(s_i, sel_i)   (loss part mod_aux, / n_tokens)
 * Backward (dout = d x_out; the identity path is in dx already):
 *     d y_j   = s_i dout_i                       (moe_combine_backward: into the inner dx)
 *     dgate_i = dout_i . (y_j - x_i)
 *     dr_i    = dgate_i s_i (1 - s_i) + coef/n_tokens (s_i - sel_i)   (mod_backward)
 *     dx_i    = (1 - s_i) dout_i + dr_i w        (the selected rows; mod_backward, then
 *                                                 a rank-1 GEMM), dw += dr^T x
 *     then the block's steps turn d y into d x[idx] (their own identity path
 *     included), scattered (+=) into dx (moe_permute_backward).
 * The selection is piecewise constant: no gradient flows through it.
 *
 * RoPE at the original positions: the rows' positions differ per sequence,
 * so the wrapper gathers the table rows it needs (tpos) into tables of its
 * own, one row per inner row, and hands the steps rope_T = B C (row n reads
 * row n of them): the attention kernels are unchanged.
 *
 * Mesh: sequences are whole on a rank under dp, ZeRO, ep and pp; under tp
 * without SP every model rank holds every row with the same bits, so the
 * selection is the same everywhere and the inner pieces run their TP
 * collectives on the selected rows. With SP a sequence's r spans ranks:
 * every rank gathers all B T scores and selects the same rows, the steps run
 * sequence-parallel on its share of the B C selected ones (mod_enter,
 * mod_leave and their conjugates). The router is replicated (layout class
 * residual: under SP its gradient is a partial sum over the model group).
 */
#include <math.h>

#include "model_impl.h"

/* The router's parameter (its pc->pw in the layer: ly->w_wrap). */
struct mod_w { struct mt_param *w; };
_Static_assert(sizeof(struct mod_w) <= PIECE_W_MAX, "raise PIECE_W_MAX");

/* A routed layer's saved state (ly->wst). */
struct mod_state {
    int32_t *idx, *tpos;   /* (B C)  selected rows, their positions                          */
    int32_t *slot;         /* (N)    inner row of a selected row, -1 elsewhere                */
    float   *r, *s;        /* (N)    router score, sigmoid(r)                                 */
    float   *xi, *yo;      /* (n, D) inner input; inner output, then y - x (the combine's);
                            * n = B C, under SP this rank's B C / tp of them               */
    float   *dxi;          /* (n, D) inner gradient (d y, then d x[idx])                      */
    float   *yo_all;       /* SP: (B C, D) every rank's y - x, gathered (the combine's)       */
    float   *cs, *sn;      /* (B C, hd/2) the RoPE rows of the selected positions             */
    float   *dgate, *dr;   /* (N)    backward: d s, d r                                       */
    /* host staging of incremental decoding (the r > 0 rule is decided on the host) */
    float   *h_r, *h_s;    /* (N)                                                             */
    int32_t *h_idx;        /* (3 N)  the selected rows, their positions, every row's slot     */
};

extern const struct mt_block_wrap mt_block_wrap_mod;   /* below */

const int32_t *mod_state_slot(const struct mt_layer *ly)
{
    const struct mod_state *st = ly->wst;
    return mt_blocks_kind(ly->kind)->wrap == &mt_block_wrap_mod && st ? st->slot : NULL;
}

/* C = ceil(c T), at least 1; c is a float: a product within 1e-6 of an
 * integer counts as that integer (0.3 x 10 = 3, not 4). */
int mod_rows(const struct mt_config *cfg, int T)
{
    const double v = (double)cfg->mod_capacity * (double)T;
    int C = (int)ceil(v - 1e-6);
    if (C < 1) C = 1;
    return C > T ? T : C;
}

int mt_model_mod_rows(const struct mt_config *cfg, int l)
{
    return mt_blocks_kind(mt_blocks_layer_kind(cfg, l))->wrap == &mt_block_wrap_mod ? mod_rows(cfg, cfg->seq_len) : 0;
}

static void mod_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct mt_pspec p = {"mod.weight", -1, 1, s->D, 1, MT_SCALE_NORMAL, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL,
                               MT_BIND_OWN(struct mod_w, w)};
    fn(user, &p);
}

static struct mt_param *mod_router(const struct mt_piece_ctx *pc) { return ((const struct mod_w *)pc->pw)->w; }

/* sequence parallel: the block holds this rank's Nr rows of the flattened B T
 * (rows r0..), the steps this rank's share of the B C selected ones */
static int mod_sp(const struct mt_piece_ctx *pc) { return pc->tp.tp > 1 && pc->tp.sp; }
static int mod_inner_rows(const struct mt_piece_ctx *pc, int n_sel) { return mod_sp(pc) ? n_sel / pc->tp.tp : n_sel; }

/* The steps' context: B sequences of C rows, the wrapper's streams and RoPE rows. */
static void mod_inner(const struct mt_piece_ctx *pc, struct mt_piece_ctx *in)
{
    const struct mod_state *st = pc->ly ? pc->ly->wst : NULL;
    in->T = mod_rows(pc->cfg, pc->T);
    in->N = in->tp.N = pc->B * in->T;
    in->Nr = in->tp.Nr = mod_inner_rows(pc, in->N);
    in->x_in = st ? st->xi : NULL;
    in->dx = st ? st->dxi : NULL;
    in->rope_cos = st ? st->cs : NULL;
    in->rope_sin = st ? st->sn : NULL;
    in->rope_T = in->N;
}

static void mod_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct mod_state *st = ly->wst;
    const enum mt_bucket A = MT_BUCKET_ACTS;
    const size_t N = (size_t)pc->N, D = (size_t)pc->D, n = (size_t)pc->B * (size_t)mod_rows(pc->cfg, pc->T);
    const size_t half = (size_t)(model_head_dim(pc->cfg) / 2);
    st->idx = carve_i(c, A, n);
    st->tpos = carve_i(c, A, n);
    st->slot = carve_i(c, A, N);
    st->r = carve_f(c, A, N);
    st->s = carve_f(c, A, N);
    const size_t nl = (size_t)mod_inner_rows(pc, (int)n);
    st->xi = carve_f(c, A, nl * D);
    st->yo = carve_f(c, A, nl * D);
    st->dxi = carve_f(c, A, nl * D);
    st->yo_all = mod_sp(pc) ? carve_f(c, A, n * D) : NULL;
    st->cs = carve_f(c, A, n * half);
    st->sn = carve_f(c, A, n * half);
    st->dgate = carve_f(c, A, N);
    st->dr = carve_f(c, A, N);
    st->h_r = carve_f(c, MT_BUCKET_OTHER, N);
    st->h_s = carve_f(c, MT_BUCKET_OTHER, N);
    st->h_idx = carve_i(c, MT_BUCKET_OTHER, 3 * N);
}

/* Decoding (SPEC 1e: a token runs a routed block iff r > 0). The layer's
 * attention cache holds only the tokens that ran it, each at its original
 * position: the wrapper's decode state is its fill count (padded to 4
 * floats) and RoPE tables of its own, row j = the position of the j-th
 * token that ran, so the steps run with pos0 = fill and read row fill + n. */
static size_t mod_decode_floats(const struct mt_piece_ctx *pc, int t_max)
{
    return 4 + 2 * (size_t)t_max * (size_t)(model_head_dim(pc->cfg) / 2);
}

static enum mt_status mod_enter_decode(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_fwd *a,
                                       struct mt_piece_fwd *in, float **x_in)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mod_state *st = pc->ly->wst;
    const int n = a->B * a->T, D = pc->D, half = model_head_dim(pc->cfg) / 2;
    float *tab_cos = a->state + 4, *tab_sin = tab_cos + (size_t)a->t_max * half;
    float fillf;
    ops->copy_to_host(ops->be, &fillf, a->state, sizeof fillf);
    const int fill = (int)fillf;
    linear_forward(ops, st->r, pc->x_in, mod_router(pc)->data, n, D, 1, 0.0f);
    ops->copy_to_host(ops->be, st->h_r, st->r, (size_t)n * sizeof(float));
    int32_t *h_pos = st->h_idx + n, *h_slot = st->h_idx + 2 * n;
    int k = 0;
    for (int t = 0; t < n; t++) {
        st->h_s[t] = 1.0f / (1.0f + expf(-st->h_r[t]));
        h_slot[t] = st->h_r[t] > 0.0f ? k : -1;
        if (st->h_r[t] > 0.0f) {
            st->h_idx[k] = t;
            h_pos[k++] = a->pos0 + t;
        }
    }
    ops->copy_from_host(ops->be, st->slot, h_slot, (size_t)n * sizeof(int32_t));
    ops->copy_from_host(ops->be, st->s, st->h_s, (size_t)n * sizeof(float));
    if (k > 0) {
        ops->copy_from_host(ops->be, st->idx, st->h_idx, (size_t)k * sizeof(int32_t));
        ops->copy_from_host(ops->be, st->tpos, h_pos, (size_t)k * sizeof(int32_t));
        ops->moe_permute(ops->be, st->xi, pc->x_in, st->idx, k, D);
        ops->moe_permute(ops->be, tab_cos + (size_t)fill * half, a->cos_tab, st->tpos, k, half);
        ops->moe_permute(ops->be, tab_sin + (size_t)fill * half, a->sin_tab, st->tpos, k, half);
    }
    fillf = (float)(fill + k);
    ops->copy_from_host(ops->be, a->state, &fillf, sizeof fillf);
    (void)ctx;
    in->B = 1;
    in->T = k;   /* 0: no token runs the block this step */
    in->pos0 = fill;
    in->cos_tab = tab_cos;
    in->sin_tab = tab_sin;
    in->rope_T = 0;
    in->state = a->state + mod_decode_floats(pc, a->t_max);
    in->x_out = st->yo;
    *x_in = st->xi;
    return MT_OK;
}

/* r, the selection (and the aux sum into the layer's loss slot), the inner
 * input rows and their RoPE rows; the inner call is (B, C) rows into yo. */
static enum mt_status mod_enter(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_fwd *a,
                                struct mt_piece_fwd *in, float **x_in)
{
    if (a->state) return mod_enter_decode(ctx, pc, a, in, x_in);
    const struct mt_ops_i *ops = pc->ops;
    const struct mod_state *st = pc->ly->wst;
    const int B = a->B, T = a->T, C = mod_rows(pc->cfg, T), N = B * T, D = pc->D, half = model_head_dim(pc->cfg) / 2;
    const int nl = mod_inner_rows(pc, B * C), j0 = mod_sp(pc) ? pc->tp.rank * nl : 0;
    const float *x = pc->x_in;
    if (mod_sp(pc)) {
        /* a sequence's scores span ranks: every rank gathers all N of them and selects the same rows,
         * and takes its share of the selected rows from the gathered stream (s_full, free here) */
        linear_forward(ops, st->dr, pc->x_in, mod_router(pc)->data, pc->Nr, D, 1, 0.0f);
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, st->r, st->dr, pc->Nr, 1));
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->s_full, pc->x_in, pc->Nr, D));
        x = pc->s_full;
    } else {
        linear_forward(ops, st->r, pc->x_in, mod_router(pc)->data, N, D, 1, 0.0f);
    }
    /* TP: every model rank computes the same whole-batch aux; rank 0's counts */
    const float coef = pc->tp.tp > 1 && pc->tp.rank != 0 ? 0.0f : pc->cfg->mod_aux_coef;
    ops->mod_route(ops->be, st->idx, st->tpos, st->slot, st->s, a->want_loss ? pc->wrap_loss : NULL, st->r, B, T, C,
                   coef);
    ops->moe_permute(ops->be, st->xi, x, st->idx + j0, nl, D);
    ops->moe_permute(ops->be, st->cs, a->cos_tab, st->tpos, B * C, half);
    ops->moe_permute(ops->be, st->sn, a->sin_tab, st->tpos, B * C, half);
    in->B = B;
    in->T = C;
    in->pos0 = 0;
    in->cos_tab = st->cs;
    in->sin_tab = st->sn;
    in->rope_T = B * C;
    in->x_out = st->yo;
    *x_in = st->xi;
    return MT_OK;
}

/* x_out = x, then + s (y - x) on the selected rows (yo keeps y - x for the
 * backward; SP: every rank's, gathered, since a row's inner row may be another's) */
static enum mt_status mod_leave(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a,
                                const struct mt_piece_fwd *in)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mod_state *st = pc->ly->wst;
    const int D = pc->D, nl = mod_inner_rows(pc, in->B * in->T), Nr = a->state ? a->B * a->T : pc->Nr;
    const int r0 = mod_sp(pc) ? pc->tp.rank * pc->Nr : 0;
    ops->axpby(ops->be, st->yo, st->xi, -1.0f, 1.0f, (size_t)nl * D);
    const float *y = st->yo;
    if (mod_sp(pc)) {
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, st->yo_all, st->yo, nl, D));
        y = st->yo_all;
    }
    ops->copy(ops->be, a->x_out, pc->x_in, (size_t)Nr * D * sizeof(float));
    ops->moe_combine(ops->be, a->x_out, y, st->slot + r0, st->s + r0, Nr, 1, D);
    return MT_OK;
}

/* d y = s dout into the inner dx (SP: summed over the model group, each
 * inner row written by the rank holding its block row); the router's
 * gradient; dx = (1 - s) dout + dr w on the selected rows */
static enum mt_status mod_leave_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                         const struct mt_piece_ctx *in)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mod_state *st = pc->ly->wst;
    struct mt_param *w = mod_router(pc);
    const int Nr = pc->Nr, D = pc->D, r0 = mod_sp(pc) ? pc->tp.rank * Nr : 0;
    const double nt = pc->norm->n_tokens > 0 ? pc->norm->n_tokens : 1.0;
    if (mod_sp(pc)) {
        const int n_sel = in->N;
        ops->fill(ops->be, pc->s_full, 0.0f, (size_t)n_sel * D);
        ops->moe_combine_backward(ops->be, pc->s_full, st->dgate + r0, pc->dx, st->yo_all, st->slot + r0, st->s + r0,
                                  Nr, 1, D);
        MT_CHECK(tpa_reduce_scatter_rows(ctx, &pc->tp, in->dx, pc->s_full, in->Nr, D));
    } else {
        ops->moe_combine_backward(ops->be, in->dx, st->dgate, pc->dx, st->yo, st->slot, st->s, Nr, 1, D);
    }
    ops->mod_backward(ops->be, st->dr + r0, pc->dx, st->dgate + r0, st->s + r0, st->slot + r0, Nr, D,
                      (float)((double)pc->cfg->mod_aux_coef / nt));
    /* LoRA: the router is a frozen base tensor (no weight gradient); its aux and gate paths still reach x */
    linear_backward(ops, pc->dx, 1.0f, w->frozen ? NULL : w->grad, 1.0f, st->dr + r0, pc->x_in, w->data, Nr, D, 1);
    return MT_OK;
}

/* the steps' d x[idx] (their identity path included) scattered into dx */
static enum mt_status mod_enter_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                         const struct mt_piece_ctx *in)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mod_state *st = pc->ly->wst;
    if (!mod_sp(pc)) {
        ops->moe_permute_backward(ops->be, pc->dx, in->dx, st->slot, pc->N, 1, pc->D, 1);
        return MT_OK;
    }
    /* SP: every rank's inner rows gathered, each block row takes its own */
    MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->s_full, in->dx, in->Nr, pc->D));
    ops->moe_permute_backward(ops->be, pc->dx, pc->s_full, st->slot + pc->tp.rank * pc->Nr, pc->Nr, 1, pc->D, 1);
    return MT_OK;
}

/* What a routed block needs of the backend and the mesh (model creation,
 * before any allocation). */
static enum mt_status mod_check(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const int C = mod_rows(pc->cfg, pc->T);
    if (pc->ops && (!pc->ops->mod_route || !pc->ops->mod_backward))
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "Mixture-of-Depths: the %s backend has no mod_route / "
                            "mod_backward", pc->ops->name);
    if (pc->tp.tp > 1 && (pc->B * C) % pc->tp.tp != 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "Mixture-of-Depths under tp=%d: the routed rows B*C=%d*%d must "
                            "divide by tp (C = ceil(mod_capacity * seq_len))", pc->tp.tp, pc->B, C);
    return MT_OK;
}

/* The loss part of the routers' BCE (per token), registered when some layer is routed. */
static int mod_loss_register(struct mt_model *m)
{
    const double w = m->cfg.mod_aux_coef;
    return model_loss_add(m, &(struct mt_loss_part){"mod_aux", "mod router", w, MT_LOSS_PER_TOKEN, w != 0, 0});
}

/* the router: D multiply-adds per token */
static double mod_mm(const struct mt_block_shape *s) { return (double)s->D; }

const struct mt_block_wrap mt_block_wrap_mod = {
    .name = "mod",
    .params = mod_params,
    .state_bytes = sizeof(struct mod_state),
    .inner = mod_inner,
    .carve = mod_carve,
    .enter = mod_enter,
    .leave = mod_leave,
    .leave_backward = mod_leave_backward,
    .enter_backward = mod_enter_backward,
    .check = mod_check,
    .loss_register = mod_loss_register,
    .rows = mod_rows,
    .mm_per_token = mod_mm,
    .decode_floats = mod_decode_floats,
};
