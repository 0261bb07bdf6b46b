/*
 * test_toy_kind.c — what adding a block kind costs (issue 30): toy kinds
 * added with their pieces (in this file) and one line each of the kind
 * table, and nothing else. A block is a sequence of steps (mt_blocks.h),
 * each a piece with a residual policy:
 *
 *   S = toy_scale (NONE) + mlp (NONE)      the shape of A / E / M: a mixer
 *       that writes the stream itself, then the dense MLP
 *   G = toy_gate (ADD)                     ONE piece, no FFN
 *   T = attention (NONE) + toy_gate (ADD) + mlp (NONE)
 *                                          three pieces: the table's own
 *       pieces at other positions (the MLP reads the stream after step 1)
 *   W = toy_gate (ADD) inside the wrapper toy_wrap: the slot MoD fills; the
 *       model drives its hooks (the gate runs on the first ceil(T/2)
 *       positions of each sequence, combined half-and-half into the stream)
 *   H = toy_gate inside toy_half, a wrapper with one of its six row hooks:
 *       refused
 *
 * toy_scale writes the stream itself: x_out = x_in + rmsnorm(x_in) * g, g
 * its one parameter ("input_layernorm.weight", the step's norm gain).
 * Backward: dg += sum_rows (d x_out * rmsnorm(x_in)), d x_in += d x_out +
 * rmsnorm_backward(d x_out): the norm's backward accumulates onto dx, which
 * already holds the identity path.
 *
 * toy_gate leaves the norm and the residual add to the block (MT_RESID_ADD):
 * it sees h = rmsnorm(s_i) * g ("gate_norm.weight") and adds
 * w * silu(h) (w "gate.weight", per channel); its backward writes
 * dh = dy * w * silu'(h) and dw += sum_rows dy * silu(h); the block runs
 * the norm's backward. It computes on the host (the cpu backend's buffers
 * are host memory): a toy needs no kernel.
 *
 * The lines: the table (src/model/mt_block_kinds.def) expands
 * MT_BLOCK_KINDS_EXTRA after its own lines; this file defines it and
 * compiles the two files that expand the table (blocks.c, block_traits.c)
 * with it, so the library's copies are not linked and every consumer —
 * config checks, the model, the registry, the planner's counts — sees the
 * toys. Checks: the patterns resolve and build; the registry names of the
 * toy layers; a central-difference gradient check of every parameter (the
 * embedding below the toys' layers included) through the whole model
 * (loss = lm) for the pattern "SGTWA" (the wrapped W between T and A, so
 * that attention mixes its rows); the half-wrapped kind refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "parallel/mt_mesh.h"
#include "mt_test.h"

extern const struct mt_piece mt_piece_toy_scale, mt_piece_toy_gate;
extern const struct mt_block_wrap mt_block_wrap_toy_wrap, mt_block_wrap_toy_half;
#define MT_BLOCK_KINDS_EXTRA                                                                                     \
    MT_BLOCK_KIND('S', "scale+mlp", 0, 0, none, MT_STEP(toy_scale, NONE), MT_STEP(mlp, NONE))                    \
    MT_BLOCK_KIND('G', "gate", 0, 0, none, MT_STEP(toy_gate, ADD))                                               \
    MT_BLOCK_KIND('T', "attention+gate+mlp", 0, 0, none, MT_STEP(attention, NONE), MT_STEP(toy_gate, ADD),      \
                  MT_STEP(mlp, NONE))                                                                            \
    MT_BLOCK_KIND('W', "wrapped gate", 0, 0, toy_wrap, MT_STEP(toy_gate, ADD))                                   \
    MT_BLOCK_KIND('H', "half-wrapped gate", 0, 0, toy_half, MT_STEP(toy_gate, ADD))
#include "model/blocks.c"
#include "model/block_traits.c"

/* ---- toy_scale: writes the stream itself (MT_RESID_NONE) ---- */

static void scale_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct mt_pspec p = {"input_layernorm.weight", -1, 1, s->D, 1, MT_SCALE_ONES, MT_ROLE_GAIN,
                               MT_LAYOUT_RESIDUAL, MT_BIND_NORM};
    fn(user, &p);
}

/* saved: the normed rows (the scaled branch) and their rstd (the step's norm) */
static void scale_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    (void)ly;
    const size_t D = (size_t)pc->D, Nr = (size_t)pc->Nr;
    pc->nm->h_n = carve_f(c, MT_BUCKET_ACTS, Nr * D);
    pc->nm->h = pc->nm->h_n;
    pc->nm->rstd = carve_f(c, MT_BUCKET_ACTS, Nr);
}

/* row-local: this rank's residual rows only, no collective */
static enum mt_status scale_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    (void)ctx;
    const struct mt_ops_i *ops = pc->ops;
    const int n = a->B * a->T, Nr = pc->tp.sp ? n / pc->tp.tp : n, D = pc->D;
    ops->rmsnorm_resid_forward(ops->be, pc->nm->h_n, pc->nm->rstd, a->x_out, pc->x_in, pc->g->data, Nr, D,
                               pc->norm_eps);
    ops->axpby(ops->be, a->x_out, pc->nm->h_n, 1.0f, 1.0f, (size_t)Nr * D);
    return MT_OK;
}

static enum mt_status scale_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    (void)ctx;
    const struct mt_ops_i *ops = pc->ops;
    const int Nr = pc->Nr, D = pc->D;
    /* the norm's backward reads d x_out while it accumulates into dx: a copy first */
    ops->copy(ops->be, pc->dh, pc->dx, (size_t)Nr * D * sizeof(float));
    ops->rmsnorm_backward(ops->be, pc->dx, pc->g->grad, pc->dh, pc->x_in, pc->g->data, pc->nm->rstd, Nr, D, 1);
    return MT_OK;
}

const struct mt_piece mt_piece_toy_scale = {
    /* .name                  = */ "toy_scale",
    /* .tp_regions            = */ 0,
    /* .sp_gathers            = */ 0,
    /* .params                = */ scale_params,
    /* .check                 = */ NULL,
    /* .mm_per_token          = */ NULL,
    /* .extra_flops_per_token = */ NULL,
    /* .inactive_params       = */ NULL,
    /* .work_per_token        = */ NULL,
    /* .carve_scratch         = */ NULL,
    /* .ffn_scratch           = */ NULL,
    /* .proj_scratch          = */ NULL,
    /* .carve                 = */ scale_carve,
    /* .forward               = */ scale_forward,
    /* .backward              = */ scale_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ NULL,
    /* .state_bytes           = */ 0,
    /* .own_bytes             = */ 0,
    /* .setup                 = */ NULL,
};

/* ---- toy_gate: a branch the block wraps in pre-norm + add (MT_RESID_ADD) ---- */

struct gate_w { struct mt_param *w; };   /* (D) the per-channel gate */

static void gate_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct mt_pspec p[] = {
        {"gate_norm.weight", -1, 1, s->D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_NORM},
        {"gate.weight", -1, 1, s->D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_OWN(struct gate_w, w)},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fn(user, &p[i]);
}

/* the block carves the norm (MT_RESID_ADD); the branch saves nothing more */
static void gate_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    (void)pc, (void)c, (void)ly;
}

static double silu(double h) { return h / (1.0 + exp(-h)); }
static double dsilu(double h)
{
    const double sg = 1.0 / (1.0 + exp(-h));
    return sg * (1.0 + h * (1.0 - sg));
}

/* x_out += w * silu(h), h the block's normed rows (host memory: cpu backend) */
static enum mt_status gate_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    (void)ctx;
    const int Nr = a->B * a->T, D = pc->D;
    const float *h = pc->nm->h_n, *w = ((const struct gate_w *)pc->pw)->w->data;
    for (int r = 0; r < Nr; r++)
        for (int j = 0; j < D; j++) a->x_out[(size_t)r * D + j] += (float)(w[j] * silu(h[(size_t)r * D + j]));
    return MT_OK;
}

/* dh = dy * w * silu'(h) (OVERWRITES), dw += sum_rows dy * silu(h); dx untouched */
static enum mt_status gate_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    (void)ctx;
    const int Nr = pc->Nr, D = pc->D;
    const float *h = pc->nm->h_n, *dy = pc->dx;
    struct mt_param *w = ((const struct gate_w *)pc->pw)->w;
    for (int r = 0; r < Nr; r++)
        for (int j = 0; j < D; j++) {
            const size_t e = (size_t)r * D + j;
            pc->dh[e] = (float)(dy[e] * w->data[j] * dsilu(h[e]));
            w->grad[j] += (float)(dy[e] * silu(h[e]));
        }
    return MT_OK;
}

const struct mt_piece mt_piece_toy_gate = {
    /* .name                  = */ "toy_gate",
    /* .tp_regions            = */ 0,
    /* .sp_gathers            = */ 0,
    /* .params                = */ gate_params,
    /* .check                 = */ NULL,
    /* .mm_per_token          = */ NULL,
    /* .extra_flops_per_token = */ NULL,
    /* .inactive_params       = */ NULL,
    /* .work_per_token        = */ NULL,
    /* .carve_scratch         = */ NULL,
    /* .ffn_scratch           = */ NULL,
    /* .proj_scratch          = */ NULL,
    /* .carve                 = */ gate_carve,
    /* .forward               = */ gate_forward,
    /* .backward              = */ gate_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ NULL,
    /* .state_bytes           = */ 0,
    /* .own_bytes             = */ 0,
    /* .setup                 = */ NULL,
};

/* ---- the toys' rules (struct mt_piece_rules): what config.c and mesh.c ask ---- */

const struct mt_piece_rules mt_piece_rules_toy_scale = {"toy_scale", NULL, NULL};

/* a rule of its own, to show the hook: the config refuses a gate on a
 * d_model that is not a multiple of 4 when the pattern has a gate */
static enum mt_status gate_check_config(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    if (cfg->d_model % 4)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "toy_gate: d_model %% 4 != 0 (d_model=%d)", cfg->d_model);
    return MT_OK;
}

/* it computes on the host over the rows it is given: no split over the model axis */
static enum mt_status gate_check_axis(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree)
{
    (void)cfg;
    if (axis == MT_AXIS_TP && degree > 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh contract: toy_gate does not split over tp (tp=%d)", degree);
    return MT_OK;
}

const struct mt_piece_rules mt_piece_rules_toy_gate = {"toy_gate", gate_check_config, gate_check_axis};

/* ---- toy_wrap: a wrapper the model drives (the slot MoD fills) ----
 * The steps run on the first C = ceil(T/2) positions of each sequence, as a
 * shorter sequence (B, C). Its parameter w [D] ("wrap.weight", a router)
 * gives each row s = sigmoid(x . w); with y the steps' output, the block
 * writes x_out = x + s (y - x) on those rows and x_out = x elsewhere (MoD's
 * combine with a fixed selection). Backward on a selected row: d y = s dout
 * (leave_backward, into the inner dx), dr = (dout . (y - x)) s (1 - s),
 * dw += dr x, d x = (1 - s) dout + dr w, then the inner d input added
 * (enter_backward). Host loops: cpu buffers are host memory. */

struct toy_wrap_w { struct mt_param *w; };
struct toy_wrap_st { float *xi, *yo, *dxi, *s; };   /* (B C, D) inner input, output, d input; (B C) s */

static void wrap_params(const struct mt_block_shape *s, mt_pspec_fn fn, void *user)
{
    const struct mt_pspec p = {"wrap.weight", -1, 1, s->D, 1, MT_SCALE_NORMAL, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL,
                               MT_BIND_OWN(struct toy_wrap_w, w)};
    fn(user, &p);
}

static int wrap_C(const struct mt_piece_ctx *pc) { return (pc->T + 1) / 2; }
/* block row of inner row r */
static size_t wrap_row(const struct mt_piece_ctx *pc, int r) { return (size_t)(r / wrap_C(pc)) * pc->T + r % wrap_C(pc); }

static void wrap_inner(const struct mt_piece_ctx *pc, struct mt_piece_ctx *in)
{
    const struct toy_wrap_st *st = pc->ly ? pc->ly->wst : NULL;
    in->T = wrap_C(pc);
    in->N = in->Nr = in->tp.N = in->tp.Nr = pc->B * in->T;
    in->x_in = st ? st->xi : NULL;
    in->dx = st ? st->dxi : NULL;
}

static void wrap_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct toy_wrap_st *st = ly->wst;
    const size_t n = (size_t)pc->B * wrap_C(pc);
    st->xi = carve_f(c, MT_BUCKET_ACTS, n * pc->D);
    st->yo = carve_f(c, MT_BUCKET_ACTS, n * pc->D);
    st->dxi = carve_f(c, MT_BUCKET_ACTS, n * pc->D);
    st->s = carve_f(c, MT_BUCKET_ACTS, n);
}

static enum mt_status wrap_enter(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_piece_fwd *a,
                                 struct mt_piece_fwd *in, float **x_in)
{
    (void)ctx;
    const struct toy_wrap_st *st = pc->ly->wst;
    const float *w = ((const struct toy_wrap_w *)pc->pw)->w->data;
    const int D = pc->D, Ni = a->B * wrap_C(pc);
    for (int r = 0; r < Ni; r++) {
        const float *x = pc->ly->x_in + wrap_row(pc, r) * D;
        memcpy(st->xi + (size_t)r * D, x, D * sizeof(float));
        double dot = 0;
        for (int j = 0; j < D; j++) dot += (double)x[j] * w[j];
        st->s[r] = (float)(1.0 / (1.0 + exp(-dot)));
    }
    in->T = wrap_C(pc);
    in->x_out = st->yo;
    *x_in = st->xi;
    return MT_OK;
}

static enum mt_status wrap_leave(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a,
                                 const struct mt_piece_fwd *in)
{
    (void)ctx, (void)in;
    const struct toy_wrap_st *st = pc->ly->wst;
    const int D = pc->D, Ni = a->B * wrap_C(pc);
    memcpy(a->x_out, pc->ly->x_in, (size_t)pc->Nr * D * sizeof(float));
    for (int r = 0; r < Ni; r++)
        for (int j = 0; j < D; j++) {
            float *o = a->x_out + wrap_row(pc, r) * D + j;
            *o += st->s[r] * (st->yo[(size_t)r * D + j] - *o);
        }
    return MT_OK;
}

static enum mt_status wrap_leave_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                          const struct mt_piece_ctx *in)
{
    (void)ctx;
    const struct toy_wrap_st *st = pc->ly->wst;
    struct mt_param *w = ((const struct toy_wrap_w *)pc->pw)->w;
    const int D = pc->D;
    for (int r = 0; r < in->Nr; r++) {
        float *d = pc->dx + wrap_row(pc, r) * D;
        const float *x = pc->ly->x_in + wrap_row(pc, r) * D, *y = st->yo + (size_t)r * D;
        const double s = st->s[r];
        double ds = 0;
        for (int j = 0; j < D; j++) ds += (double)d[j] * (y[j] - x[j]);
        const double dr = ds * s * (1.0 - s);
        for (int j = 0; j < D; j++) {
            in->dx[(size_t)r * D + j] = (float)(s * d[j]);
            w->grad[j] += (float)(dr * x[j]);
            d[j] = (float)((1.0 - s) * d[j] + dr * w->data[j]);
        }
    }
    return MT_OK;
}

static enum mt_status wrap_enter_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                          const struct mt_piece_ctx *in)
{
    (void)ctx;
    for (int r = 0; r < in->Nr; r++)
        for (int j = 0; j < pc->D; j++) pc->dx[wrap_row(pc, r) * pc->D + j] += in->dx[(size_t)r * pc->D + j];
    return MT_OK;
}

const struct mt_block_wrap mt_block_wrap_toy_wrap = {
    .name = "toy_wrap", .params = wrap_params, .state_bytes = sizeof(struct toy_wrap_st), .inner = wrap_inner,
    .carve = wrap_carve, .enter = wrap_enter, .leave = wrap_leave, .leave_backward = wrap_leave_backward,
    .enter_backward = wrap_enter_backward };

/* a wrapper with some of its hooks: refused, not run as if unwrapped */
const struct mt_block_wrap mt_block_wrap_toy_half = { .name = "toy_half", .enter = wrap_enter };

/* ---- the checks ---- */

static double loss_of(struct mt_ctx *ctx, struct mt_model *m, const int32_t *idx, const int32_t *tgt,
                      const struct mt_loss_norm *norm)
{
    struct mt_loss_parts parts;
    MT_ASSERT(mt_model_forward(ctx, m, idx, tgt, norm, &parts) == MT_OK);
    return mt_loss_parts_total(parts.v, parts.n);
}

static void tiny_config(struct mt_config *cfg, const char *pattern)
{
    mt_config_defaults(cfg);
    cfg->vocab_size = 29;
    cfg->n_layer = (int)strlen(pattern);
    cfg->d_model = 16;
    cfg->n_head = 4;
    cfg->n_kv_head = 2;
    cfg->mlp_hidden = 24;
    cfg->seq_len = 5;
    cfg->batch_size = 2;
    cfg->microbatches = 1;
    snprintf(cfg->pattern, sizeof cfg->pattern, "%s", pattern);
}

/* index of the parameter called name, or -1 */
static int param_index(struct mt_param *ps, int np, const char *name)
{
    for (int i = 0; i < np; i++)
        if (!strcmp(ps[i].name, name)) return i;
    return -1;
}

/* parameters drawn with a spread so that no gradient is near zero */
static void spread_params(const struct mt_ops_i *ops, struct mt_param *ps, int np)
{
    for (int i = 0; i < np; i++) {
        float *h = malloc(ps[i].numel * sizeof(float));
        const uint64_t st = mt_rng_stream(ps[i].name);
        for (size_t e = 0; e < ps[i].numel; e++) {
            double z = mt_rng_normal(5, st, e);
            h[e] = ps[i].ndim == 1 ? (float)(1.0 + 0.3 * z) : (float)(0.25 * z);
        }
        ops->copy_from_host(ops->be, ps[i].data, h, ps[i].numel * sizeof(float));
        free(h);
    }
}

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    char letters[4 * MT_MAX_BLOCK_KINDS];
    EXPECT(mt_blocks_find('S') >= 0 && !strcmp(mt_blocks_kind(mt_blocks_find('S'))->name, "scale+mlp"),
           "the table has no S (%s)", mt_blocks_letters(letters, sizeof letters));
    EXPECT(mt_blocks_find('G') >= 0 && mt_blocks_kind(mt_blocks_find('G'))->n_steps == 1, "G: one step");
    EXPECT(mt_blocks_find('T') >= 0 && mt_blocks_kind(mt_blocks_find('T'))->n_steps == 3, "T: three steps");

    struct mt_config cfg;
    tiny_config(&cfg, "SGTWA");
    MT_ASSERT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK);
    const int B = 2, T = 5, N = B * T;
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, B, &m) == MT_OK);

    /* registry: the steps' parameters in order, each under its piece's suffixes */
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    const char *want[] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                          "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight"};
    for (int i = 0; i < 4; i++) EXPECT(!strcmp(ps[i].name, want[i]), "param %d is %s, want %s", i, ps[i].name, want[i]);
    const int g1 = param_index(ps, np, "model.layers.1.gate_norm.weight");
    EXPECT(g1 > 0 && !strcmp(ps[g1 + 1].name, "model.layers.1.gate.weight") &&
               !strcmp(ps[g1 + 2].name, "model.layers.2.input_layernorm.weight"),
           "layer 1 (G) is not gate_norm, gate");
    const int kn = param_index(ps, np, "model.layers.2.self_attn.k_norm.weight");
    EXPECT(kn > 0 && !strcmp(ps[kn + 1].name, "model.layers.2.gate_norm.weight") &&
               !strcmp(ps[kn + 3].name, "model.layers.2.post_attention_layernorm.weight"),
           "layer 2 (T) is not attention, gate, mlp");
    spread_params(ops, ps, np);
    /* the wrapper's router near 0 (as its normal(0, 0.02) init), so that
     * s = sigmoid(x . w) is not saturated and its gradient is well above
     * the central difference's noise */
    const int wr = param_index(ps, np, "model.layers.3.wrap.weight");
    EXPECT(wr > 0 && !strcmp(ps[wr + 1].name, "model.layers.3.gate_norm.weight"),
           "layer 3 (W) is not wrap (the wrapper's router first), gate_norm, gate");
    if (wr > 0) {
        float wv[64];
        MT_ASSERT(ps[wr].numel <= 64);
        for (size_t e = 0; e < ps[wr].numel; e++) wv[e] = (float)(0.15 * mt_rng_normal(6, 1, e));
        ops->copy_from_host(ops->be, ps[wr].data, wv, ps[wr].numel * sizeof(float));
    }
    int32_t idx[16], tgt[16];
    for (int i = 0; i < N; i++) {
        idx[i] = (int32_t)(mt_rng_splitmix64(11 + 2 * (uint64_t)i) % (uint64_t)cfg.vocab_size);
        tgt[i] = (int32_t)(mt_rng_splitmix64(12 + 2 * (uint64_t)i) % (uint64_t)cfg.vocab_size);
    }
    struct mt_loss_norm norm = {(double)N, (double)B, (double)N};

    mt_model_zero_grad(m);
    loss_of(&ctx, m, idx, tgt, &norm);
    MT_ASSERT(mt_model_backward(&ctx, m) == MT_OK);

    /* recompute=block re-runs each block's steps into one shared set (the
     * intermediate streams included): the same gradients, bit for bit */
    struct mt_config rcfg = cfg;
    snprintf(rcfg.recompute, sizeof rcfg.recompute, "block");
    struct mt_model *mr = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &rcfg, B, &mr) == MT_OK);
    int npr;
    struct mt_param *psr = mt_model_params(mr, &npr);
    MT_ASSERT(npr == np);
    for (int i = 0; i < np; i++) ops->copy(ops->be, psr[i].data, ps[i].data, ps[i].numel * sizeof(float));
    mt_model_zero_grad(mr);
    loss_of(&ctx, mr, idx, tgt, &norm);
    MT_ASSERT(mt_model_backward(&ctx, mr) == MT_OK);
    for (int i = 0; i < np; i++)
        EXPECT(!memcmp(psr[i].grad, ps[i].grad, ps[i].numel * sizeof(float)), "%s: recompute=block changed its grad",
               ps[i].name);
    mt_model_destroy(&ctx, mr);

    /* central differences, |ga - gfd| <= 2e-2 max(|ga|, |gfd|) + 5e-3 gscale + 1e-5
     * (test_model_grad.c's rule: fp32 loss noise ~1e-6 / eps) */
    const float eps = 2e-3f;
    int checked = 0;
    for (int i = 0; i < np; i++) {
        float *ga = malloc(ps[i].numel * sizeof(float)), *w = malloc(ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, ga, ps[i].grad, ps[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, w, ps[i].data, ps[i].numel * sizeof(float));
        double gscale = 0;
        for (size_t e = 0; e < ps[i].numel; e++) gscale = fmax(gscale, fabs(ga[e]));
        const size_t step = ps[i].numel > 6 ? ps[i].numel / 6 : 1;
        for (size_t e = 0; e < ps[i].numel; e += step) {
            const float w0 = w[e];
            w[e] = w0 + eps;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double lp = loss_of(&ctx, m, idx, tgt, &norm);
            w[e] = w0 - eps;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double lm = loss_of(&ctx, m, idx, tgt, &norm);
            w[e] = w0;
            ops->copy_from_host(ops->be, ps[i].data, w, ps[i].numel * sizeof(float));
            const double gfd = (lp - lm) / (2.0 * eps), g = ga[e];
            EXPECT(fabs(g - gfd) <= 2e-2 * fmax(fabs(g), fabs(gfd)) + 5e-3 * gscale + 1e-5,
                   "%s[%zu]: analytic %.6g, central difference %.6g", ps[i].name, e, g, gfd);
            checked++;
        }
        free(ga);
        free(w);
    }
    EXPECT(checked > 60, "only %d elements checked", checked);
    mt_model_destroy(&ctx, m);

    /* the wrapper slot: a kind whose wrapper has some of its row hooks is refused, not run as if unwrapped */
    tiny_config(&cfg, "AH");
    MT_ASSERT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK);
    m = NULL;
    EXPECT(mt_model_create(&ctx, ops, &cfg, B, &m) == MT_ERR_UNSUPPORTED && !m, "the half-wrapped kind H was not refused");
    mt_model_destroy(&ctx, m);

    /* the toy's own rules, through the pieces' rules table: config.c refuses
     * d_model % 4 != 0 only when a layer has the gate; the mesh
     * contract refuses tp > 1 for it, after the model's own tp rules */
    tiny_config(&cfg, "SG");
    cfg.d_model = 18, cfg.n_head = 3, cfg.n_kv_head = 1;
    EXPECT(mt_config_resolve(&ctx, &cfg, 1) == MT_ERR_CONFIG &&
               !strcmp(mt_ctx_last_error(&ctx), "toy_gate: d_model % 4 != 0 (d_model=18)"),
           "toy_gate's config rule: '%s'", mt_ctx_last_error(&ctx));
    mt_ctx_clear_error(&ctx);
    tiny_config(&cfg, "SA");
    cfg.d_model = 18, cfg.n_head = 3, cfg.n_kv_head = 1;
    EXPECT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK, "no gate, no gate rule: '%s'", mt_ctx_last_error(&ctx));
    mt_ctx_clear_error(&ctx);
    const struct mt_mesh_dims tp2 = {.pp = 1, .dp = 1, .ep = 1, .tp = 2};
    tiny_config(&cfg, "TA");
    MT_ASSERT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK);
    EXPECT(mt_mesh_check_contract(&ctx, &tp2, &cfg, 2, 1) == MT_ERR_CONFIG &&
               !strcmp(mt_ctx_last_error(&ctx), "mesh contract: toy_gate does not split over tp (tp=2)"),
           "toy_gate's mesh rule: '%s'", mt_ctx_last_error(&ctx));
    mt_ctx_clear_error(&ctx);
    tiny_config(&cfg, "SA");
    cfg.seq_len = 6;   /* sequence parallel splits the rows over tp */
    MT_ASSERT(mt_config_resolve(&ctx, &cfg, 1) == MT_OK);
    EXPECT(mt_mesh_check_contract(&ctx, &tp2, &cfg, 2, 1) == MT_OK, "S, A refused at tp=2: '%s'",
           mt_ctx_last_error(&ctx));
    mt_ctx_clear_error(&ctx);

    if (n_fail) {
        fprintf(stderr, "test_toy_kind: FAILED (%d)\n", n_fail);
        return 1;
    }
    printf("test_toy_kind: ok (%d elements of every parameter of SGTWA: S = scale + mlp, G = one gate piece, "
           "T = attention + gate + mlp, W = the gate in a wrapper; recompute bit-equal; the half-wrapped H refused; the gate's own config and "
           "mesh rules)\n", checked);
    return 0;
}
