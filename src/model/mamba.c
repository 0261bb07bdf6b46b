/*
 * mamba.c — the Mamba-3 mixer piece of the block-kind table (pattern letter
 * `M` = this mixer + the dense MLP, SPEC 1c): the registry's view of the
 * standalone mixer in mamba3.c.
 *
 * Math (N = B*T rows, residual stream x_in (N, D)):
 *     h     = rmsnorm(x_in) * g_in                      (input_layernorm)
 *     x_out = x_in + mamba3(h)                          (mt_mamba3_forward, mamba3.c)
 * Backward:
 *     dh  = mamba3_backward(dx)                         (param grads +=, dh overwritten)
 *     dx += rmsnorm_backward(dh)                        (residual: identity already in dx)
 *
 * Parameters (model.layers.{l}.*, HF-style suffixes under `mixer.`):
 *     mixer.in_proj.weight  (W, D)  Win, rows z|xs|B|C|dt|theta|lam    Muon
 *     mixer.out_proj.weight (D, E)  Wout, init / sqrt(2L)               Muon
 *     mixer.dt_bias, mixer.A_log, mixer.D (H)                           AdamW, no decay
 *     mixer.B_norm.weight, mixer.C_norm.weight (N)                      AdamW, no decay
 *     mixer.B_bias, mixer.C_bias (H, N)                                 AdamW, no decay
 *     mixer.norm.weight (E)  gated grouped RMSNorm gain                 AdamW, no decay
 * (W = 2E + 2GN + H + H N/2 + H; E = d_inner, H heads of P, G groups, N state.)
 *
 * The model axis (docs/mamba3.md §10, docs/parallel.md): like attention, a
 * TP region inside the SP region. Each rank runs H/tp heads (the contract
 * demands nheads % tp == 0): the in-projection is registered as seven row
 * blocks, each a TP_ROWS tensor cut into whole heads (z, x, dt, theta, lam);
 * the per-head vectors and B/C biases are cut by heads, the gated norm's
 * gain by the heads' channels, Wout by columns; the B/C norm gains (shared
 * by every group) are partial sums. B and C, two modes (SPEC 1c; the
 * receipt's mamba_tp_mode):
 *   split       (mamba_ngroups % tp == 0): B, C cut by whole groups (TP_ROWS),
 *               G/tp groups a rank, every B/C group and gated-norm group on
 *               one rank; the mixer's kernels run unchanged on the local dims.
 *   replicated  (otherwise): B, C whole on every rank (MODEL_PARTIAL: each
 *               rank's gradient is its heads' share, summed over the model
 *               group); a rank computes the groups its heads read (sub heads
 *               per local group, each inside one global group: bc_group);
 *               a gated-norm group spans ranks, so its per-row sums (of
 *               squares forward, of the mean term backward) are all-reduced
 *               over the model group (gate_fwd_rep / gate_bwd_rep).
 * Incremental decoding (a->state != NULL, one rank): the layer's recurrent
 * state (mt_mamba3_decode), not a KV cache.
 */
#include <string.h>
#include "model_impl.h"
#include "../core/mt_knobs.h"

/* What a Mamba-3 layer saves beyond the shared input norm (struct mt_layer):
 * its ly->state entry (mamba_carve fills it). */
struct mamba_state {
    struct mt_mamba3_acts mb;   /* the mixer's saved activations (ACTS, one carve)      */
    mt_bf16 *yn_b;              /* (N, E) precision=bf16: bf16(mb.yn), Wout's operand;
                                 * else NULL                                            */
};
_Static_assert(sizeof(struct mamba_state) <= PIECE_STATE_MAX, "raise PIECE_STATE_MAX");

/* The Mamba-3 mixer's parameters beyond its input norm (its pc->pw in the
 * layer; SPEC 1c, mt_mamba3.h): in/out projections, per-head dt_bias, A_log,
 * D skip, B/C norm gains (N), B/C biases (H, N), gated norm gain. */
struct mamba_w {
    struct mt_param *mwin[7];      /* in_proj blocks z, x, B, C, dt, theta, lam (rows, D) */
    struct mt_param *mwout, *mdt_bias, *ma_log, *md, *mgb, *mgc, *mbb, *mcb, *mgout;
};
_Static_assert(sizeof(struct mamba_w) <= PIECE_W_MAX, "raise PIECE_W_MAX");
static struct mamba_w *mbw(const struct mt_piece_ctx *pc) { return pc->pw; }

/* The Mamba-3 mixer's per-model struct (its pc->own): this rank's dims
 * (mamba_setup) and the backward scratch every M layer shares (WORKSPACE,
 * mamba_carve_scratch). Replicated B/C (rep 1, mamba_ngroups % tp != 0):
 * h0 this rank's first global head, hpg the global heads per group, sub the
 * heads per local B/C group (d.G = d.H / sub), Gg the global groups; gsum
 * (N, Gg) WORKSPACE, the gated norm's per-row group sums. */
struct mamba_own {
    struct mt_mamba3_dims    d;
    struct mt_mamba3_scratch s;
    int                      rep, h0, hpg, sub, Gg;
    float                   *gsum;
};
_Static_assert(sizeof(struct mamba_own) <= PIECE_OWN_MAX, "raise PIECE_OWN_MAX");
static const struct mt_mamba3_dims *mdims(const struct mt_piece_ctx *pc) { return &((struct mamba_own *)pc->own)->d; }
static struct mt_mamba3_scratch *mb_s(const struct mt_piece_ctx *pc) { return &((struct mamba_own *)pc->own)->s; }
static const struct mamba_own *mown(const struct mt_piece_ctx *pc) { return pc->own; }

/* SPEC 1c: B and C split by group when G % tp == 0, otherwise replicated */
static int bc_replicated(int64_t G, int tp) { return tp > 1 && G % tp != 0; }

const char *mt_mamba_tp_mode(const struct mt_config *cfg, int tp)
{
    if (tp <= 1 || !mt_blocks_pattern_uses(cfg, "mamba")) return NULL;
    return bc_replicated(cfg->mamba_ngroups, tp) ? "replicated" : "split";
}

static int gcd_i(int a, int b) { return b ? gcd_i(b, a % b) : a; }

/* replicated B/C: the global group local group k reads (its first head's) */
static int bc_group(const struct mamba_own *o, int k) { return (o->h0 + k * o->sub) / o->hpg; }

/* The mixer's global dims from its config keys: d_inner, heads, headdim,
 * groups, state. */
struct mamba_gdims { int64_t mE, mH, mP, mG, mN; };
static struct mamba_gdims mamba_gdims_of(const struct mt_config *cfg)
{
    struct mamba_gdims g;
    g.mE = (int64_t)cfg->mamba_expand * cfg->d_model;
    g.mP = cfg->mamba_headdim;
    g.mH = g.mP > 0 ? g.mE / g.mP : 0;
    g.mG = cfg->mamba_ngroups;
    g.mN = cfg->mamba_d_state;
    return g;
}

/* this rank's heads and groups (the model axis splits both); eps 1e-5 for
 * the B/C and gated norms, as the reference (SPEC 1c) */
static void mamba_setup(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_config *cfg)
{
    const struct mamba_gdims g = mamba_gdims_of(cfg);
    const int tp = pc->tp.tp, Hl = (int)g.mH / tp;
    struct mamba_own *o = pc->own;
    o->rep = bc_replicated(g.mG, tp);
    int Gl = (int)g.mG / tp;
    if (o->rep) {
        /* local B/C groups of sub heads: sub divides the heads per global
         * group and the rank's heads, so none crosses a group's edge */
        o->hpg = (int)(g.mH / g.mG);
        o->sub = gcd_i(o->hpg, Hl);
        o->h0 = pc->tp.rank * Hl;
        o->Gg = (int)g.mG;
        Gl = Hl / o->sub;
    }
    /* knob scan_bf16 (default 1; ctx NULL, planning: the default) */
    const int scan_bf16 = pc->bf16 && (!ctx || mt_knob_int(ctx, MT_KNOB_SCAN_BF16) != 0);
    o->d = (struct mt_mamba3_dims){cfg->d_model, Hl, (int)g.mP, Gl, (int)g.mN, cfg->mamba_chunk, 1e-5f, 1e-5f,
                                   scan_bf16};
}

static void mamba_params(const struct mt_block_shape *sh, mt_pspec_fn fn, void *user)
{
    const struct mamba_gdims g = mamba_gdims_of(sh->cfg), *s = &g;
    const int64_t D = sh->D, E = s->mE, H = s->mH, G = s->mG, N = s->mN;
    /* B, C: cut by groups (split) or whole with a partial gradient (replicated) */
    const enum mt_layout lbc = bc_replicated(G, sh->tp) ? MT_LAYOUT_MODEL_PARTIAL : MT_LAYOUT_TP_ROWS;
    const struct mt_pspec p[] = {
        {"input_layernorm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_NORM},
        /* Win as its seven row blocks: each is cut by heads (z, x, dt, theta, lam)
         * or by groups (B, C; mamba_ngroups % tp == 0; else replicated) */
        {"mixer.in_proj_z.weight", -1, 2, E, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mamba_w, mwin[0])},
        {"mixer.in_proj_x.weight", -1, 2, E, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mamba_w, mwin[1])},
        {"mixer.in_proj_B.weight", -1, 2, G * N, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, lbc, MT_BIND_OWN_DW(struct mamba_w, mwin[2])},
        {"mixer.in_proj_C.weight", -1, 2, G * N, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, lbc, MT_BIND_OWN_DW(struct mamba_w, mwin[3])},
        {"mixer.in_proj_dt.weight", -1, 2, H, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mamba_w, mwin[4])},
        {"mixer.in_proj_theta.weight", -1, 2, H * (N / 2), D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS,
         MT_BIND_OWN_DW(struct mamba_w, mwin[5])},
        {"mixer.in_proj_lam.weight", -1, 2, H, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_TP_ROWS, MT_BIND_OWN_DW(struct mamba_w, mwin[6])},
        {"mixer.out_proj.weight", -1, 2, D, E, MT_SCALE_NORMAL_OUT, MT_ROLE_DENSE, MT_LAYOUT_TP_COLS, MT_BIND_OWN_DW(struct mamba_w, mwout)},
        {"mixer.dt_bias", -1, 1, H, 1, MT_SCALE_DT_BIAS, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, mdt_bias)},
        {"mixer.A_log", -1, 1, H, 1, MT_SCALE_A_LOG, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, ma_log)},
        {"mixer.D", -1, 1, H, 1, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, md)},
        /* one [N] gain shared by every group and head: partial under a head split */
        {"mixer.B_norm.weight", -1, 1, N, 1, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN(struct mamba_w, mgb)},
        {"mixer.C_norm.weight", -1, 1, N, 1, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN(struct mamba_w, mgc)},
        {"mixer.B_bias", -1, 2, H, N, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, mbb)},
        {"mixer.C_bias", -1, 2, H, N, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, mcb)},
        {"mixer.norm.weight", -1, 1, E, 1, MT_SCALE_ONES, MT_ROLE_SSM, MT_LAYOUT_TP_ROWS, MT_BIND_OWN(struct mamba_w, mgout)},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) fn(user, &p[i]);
}

static enum mt_status mamba_check(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct mt_mamba3_dims *d = mdims(pc);
    if (d->H < 1 || d->P < 1 || d->G < 1 || d->N < 2 || d->N % 2 != 0 || d->H % d->G != 0 || d->chunk < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG,
                            "model: M blocks need nheads, headdim, chunk >= 1, even mamba_d_state and ngroups | nheads "
                            "(nheads=%d headdim=%d d_state=%d ngroups=%d chunk=%d)",
                            d->H, d->P, d->N, d->G, d->chunk);
    /* the model axis: mdims holds this rank's heads and (local) groups; the
     * contract (mesh.c) guarantees nheads % tp == 0 */
    if (mown(pc)->rep && pc->lora)
        return mt_ctx_error(ctx, MT_ERR_CONFIG,
                            "model: LoRA on M blocks with B/C replicated over the model axis (mamba_ngroups %% tp "
                            "!= 0: mamba_ngroups=%d, tp=%d) is not supported; use mamba_ngroups divisible by tp",
                            mown(pc)->Gg, pc->tp.tp);
    return MT_OK;
}

/* Win and Wout: D (W + E) multiply-adds per token */
static double mamba_mm(const struct mt_block_shape *sh)
{
    const struct mamba_gdims g = mamba_gdims_of(sh->cfg), *s = &g;
    const double W = (double)(2 * s->mE + 2 * s->mG * s->mN + s->mH + s->mH * (s->mN / 2) + s->mH);
    return (double)sh->D * (W + (double)s->mE);
}

/* The scan, counted as its recurrence (the chunked form's extra in-chunk
 * products are an implementation choice, like flash attention's recompute):
 * per token and head, the state update alpha S + gamma x B^T + beta x' B'^T
 * is 3 P N multiply-adds and the read S C one more: 4 P N = 8 P N FLOPs
 * forward, x3 for training: 24 H P N per token. */
static double mamba_extra(const struct mt_block_shape *sh)
{
    const struct mamba_gdims g = mamba_gdims_of(sh->cfg), *s = &g;
    return 24.0 * (double)s->mH * (double)s->mP * (double)s->mN;
}

/* precision=bf16 on cuda, in 4-byte elements (bf16 = 0.5) per token; E = H P,
 * the per-head B, C are H N each (HN), theta H N/2, W the in-projection's width.
 * The mixer's activations stay fp32; what bf16 changes is the norms' twins,
 * the gated norm writing only Wout's bf16 operand, and dy, dproj rounded once.
 *   norm: input norm forward reads x, writes h and its twin (2.5 D; one rank
 *     without LoRA: + x_out, the residual's seed that Wout's GEMM adds onto,
 *     3.5 D, and no residual add below; h not stored where the in-projection
 *     reads the twin alone, 1 D less: plan_norm_h_store), backward
 *     4 D; gated norm forward reads ys, z, writes bf16 yn (2.5 E), backward
 *     reads dyn, ys, z, writes dys, dz (5 E; dg's sums inside that pass; the
 *     tensor-core scan's shapes: dz as bf16, - 0.5 E, and dys's bf16 twin for
 *     the scan's products, + 0.5 E).
 *   elementwise: prep forward: the angles' cumsum (HN) and the row pass reading
 *     xs, B, C, dt, lam, the angles (E + 2 G N + 2 H + HN/2), writing x, Bh, Ch,
 *     dt, lam (E + 2 HN + 2 H; the tensor-core scan's shapes: + Bh, Ch's bf16
 *     twins, HN, and no fp32 Bh, Ch, - 2 HN); the residual add (3 D); dy and dproj rounded
 *     (1.5 D, 1.5 W; dproj not where its producers write it as bf16, below);
 *     prep backward: two angle scans (2 HN; one, HN, on the tensor-core scan's
 *     shapes, where the forward keeps its angles), the row pass
 *     (reads dx, ddt, dlam, lam, dt, theta, dBh, dCh, B, C: E + 4 H + 2.5 HN +
 *     2 G N; the tensor-core scan's shapes: dBh, dCh as bf16, 1.5 HN; Bh, Ch
 *     recomputed from B, C, rstd, the gains and the cached biases,
 *     not read; writes dx, dt, lam, theta, dB, dC: E + 2 H + 0.5 HN +
 *     2 G N; du and the bias / gain sums stay in its per-block scratch and
 *     partial rows) and dt_bias's column sum (H). With the tensor-core scan
 *     neither pass moves x or dx (the scan reads and writes them in proj's
 *     rows): 2 E less each.
 *   scan on tensor cores (ssd_tc.cu: chunk, P, N <= MT_SSM_STATES_MAX), kernel
 *     by kernel, with S = H P N / Q (nc - 1) / nc the chunk states a token (S_in,
 *     dS_out: those of the chunks before the last, the ones the kernels write,
 *     pass and read) and H Q the bf16 M or dG a token:
 *     Bh and Ch enter every term as their bf16 twins, the only copies the prep
 *     writes there (0.5 HN each), so a read of either is 0.5 HN; x is stored
 *     bf16 by the in-projection (acts x_b), so a read of it is 0.5 E. A chunk's
 *     own state and dS_out's local part are fp32 (S a write or a read); S_in and
 *     dS_out as the passes write them bf16 (0.5 S; since the twenty-eighth session).
 *     forward: the cumsum (2 H); each chunk's own state (reads x, the Bh twin,
 *       scaled per source: 0.5 E + 0.5 HN + S, + 3 H for dt, lam, cum); the pass
 *       between chunks (1.5 S); the output (reads x, Bh, Ch twins, S_in, writes ys:
 *       E + HN + 0.5 S + 3 H; ys as bf16 only, mamba.c ys_bf16): 1.5 E + 1.5 HN + 3 S + 8 H;
 *     backward (the states kept by the forward; dys stored bf16 only, its twin,
 *       so a read of it is 0.5 E): the cumsum (2 H); dS_out's local part (dys,
 *       scaled per row before rounding, Ch twin: 0.5 E + 0.5 HN + S) and pass
 *       (1.5 S); M, dG and dC in one kernel (reads the Ch, Bh twins, dys, x, S_in,
 *       writes M, dG and dCh as bf16: E + 1.5 HN + 0.5 S + 2 H Q; since the
 *       twenty-eighth session: dC's kernel read dG, the Bh and Ch twins, dys and
 *       cum again, 0.5 E + HN + H Q + H more); dx
 *       (M, dys for the product and for D dy, Bh twin, dS_out, writes dx, bf16:
 *       H Q + 1.5 E + 0.5 HN + 0.5 S); dB (dG, Ch twin, x, dS_out, the Bh twin for
 *       qj, writes dBh as bf16: H Q + 0.5 E + 1.5 HN + 0.5 S);
 *       the scalars (dys, x, S_in, dS_out: E + S, ~6 H more):
 *       4.5 E + 4 HN + 5 S + 4 H Q + 14 H.
 *     Elsewhere (the fp32 scan): reads x, Bh, Ch, dt, lam, writes ys (2 E +
 *     2 HN + 2 H); backward reads those and dys, writes their gradients (3 E
 *     + 4 HN + 4 H); its chunk states and in-chunk arrays not counted.
 * rc: the forward again. */
static void mamba_work_bf16(const struct mt_block_shape *sh, int rc, struct mt_work *w)
{
    const struct mamba_gdims g = mamba_gdims_of(sh->cfg), *s = &g;
    const double D = (double)sh->D, E = (double)s->mE, H = (double)s->mH, GN = (double)s->mG * (double)s->mN;
    const double HN = H * (double)s->mN, W = 2.0 * E + 2.0 * GN + 2.0 * H + H * (double)(s->mN / 2);
    /* the tensor-core scan's shapes: those whose chunk states the layer keeps (the run's
     * knob scan_bf16, sh->scan_bf16: off, the fp32 scan and none of the rows below that
     * need S > 0); there the scan reads x in proj and writes dx into dproj
     * (mamba3.c scan_in_proj): the prep's copies of x (2 E each way) are gone */
    const int T = sh->cfg->seq_len, chunk = sh->cfg->mamba_chunk;
    const double S_kept = T > 0 && sh->scan_bf16
                              ? (double)mt_ssm_states_count(1, T, (int)s->mH, (int)s->mP, (int)s->mN, chunk) / T
                              : 0.0;
    const double xcopy = S_kept > 0 ? 0.0 : 2.0 * E;
    /* ... and dproj's producers write it as bf16 (mt_mamba3_mix_backward_b): no 1.5 W
     * rounding pass; dz, dx half their stores (0.5 E each), the prep's final B, C and
     * dtheta columns too (GN + 0.25 HN; lam's bf16 store replaces its fp32 one, dt
     * keeps its fp32 store for dt_bias's sum and adds the bf16 one) */
    const double dpb = S_kept > 0 ? 1.0 : 0.0;
    /* the tensor-core shapes: + the B, C twins (HN), - the fp32 Bh, Ch (2 HN; the scan reads the twins alone) */
    const double prep_f = xcopy + (S_kept > 0 ? 2.5 : 3.5) * HN + 2.0 * GN + 4.0 * H;
    /* ... and the forward keeps its angles for the prep's backward there (in a->Bh, which the
     * tensor-core shapes leave free): one angle scan less (HN); and reads dBh, dCh as the
     * scan's bf16 (dB_b, dC_b: HN less) */
    const double prep_b = xcopy + (S_kept > 0 ? 3.0 : 5.0) * HN + 4.0 * GN + 7.0 * H - dpb * (0.25 * HN + GN);
    double scan_f = 2.0 * E + 2.0 * HN + 2.0 * H, scan_b = 3.0 * E + 4.0 * HN + 4.0 * H;
    if (S_kept > 0) {
        const int q = chunk < T ? chunk : T, nc = (T + q - 1) / q;
        const double HQ = H * (double)q;
        /* the kernels write, pass and read the states of the chunks before the last only
         * (ssd_tc.cu: nc - 1 of them; tests/cuda/footprint_check.py) */
        const double Sm = S_kept * (double)(nc - 1) / (double)nc;
        /* x stored bf16 by the in-projection (acts x_b, with z_b): its reads halve, the
         * own state's and the output's (1 E forward), M/dG's, dB's and dD's (1.5 E back) */
        /* the states: each chunk's own in fp32 (written, read by the pass: 2 Sm), S_in
         * and dS_out as the passes write them, bf16 (0.5 Sm a write or a read) */
        scan_f = 1.5 * E + 1.5 * HN + 3.0 * Sm + 8.0 * H;
        /* ... and dys stored bf16 only (its twin): dloc's, D dy's and dD's reads halve (1.5 E);
         * dBh, dCh written as bf16 only (dB_b, dC_b: HN) */
        scan_b = 4.5 * E + 4.0 * HN + 5.0 * Sm + 4.0 * HQ + 14.0 * H;
    }
    w->e[MT_WORK_SCAN] += scan_f + scan_b + rc * scan_f;
    /* the residual: seeded by the input norm (1 D) where mamba.c does (one rank, no LoRA),
     * else added by an axpby pass (3 D) */
    const double seed = sh->tp <= 1 && sh->cfg->lora_rank <= 0 ? 1.0 : 0.0, resid = seed > 0 ? 0.0 : 3.0 * D;
    /* the residual gradient's twin (plan_norm_twin): the input norm's backward writes it
     * (0.5 D), Wout's backward reads it instead of rounding dy (1.5 D) */
    const double hs = plan_norm_h_store(sh), tw = plan_norm_twin(sh), dhb = plan_dh_bf16(sh);
    /* the tensor-core shapes: the gated norm reads ys as bf16 (ys_bf16), forward and backward,
     * and z too (mt_mamba3_acts z_b: the in-projection's bf16 z block), the same reads */
    const double ysb = S_kept > 0 ? 0.5 : 0.0;
    /* ... and d h as bf16 from the in-projection's dX GEMM (plan_dh_bf16): 0.5 D less */
    /* ... and where seeded, Wout's GEMM adds x_in itself (plan_resid_gemm): no seed written */
    const double sw = seed > 0 && plan_resid_gemm(sh) > 0 ? 0.0 : seed;
    /* ... and dys written as its bf16 twin alone (the scan widens it): the fp32 store gone (1 E);
     * and dyn read as bf16 (the out-projection's backward GEMM writes it so: 0.5 E) */
    w->e[MT_WORK_NORM] += (5.5 + hs + sw + 0.5 * tw - 0.5 * dhb) * D + (7.5 - 7.0 * ysb) * E +
                          rc * ((1.5 + hs + sw) * D + (2.5 - 2.0 * ysb) * E);
    w->e[MT_WORK_ELEMENTWISE] += prep_f + prep_b + resid + 1.5 * (1.0 - tw) * D + (1.0 - dpb) * 1.5 * W +
                                 rc * (prep_f + resid);
}

/* The planner's work beyond the GEMMs: the scan's FLOPs as the receipt
 * counts them (mamba_extra), its bytes x, B, C, dt in and y out, backward
 * twice that; ~12 elements per inner channel of conv, activations and
 * gating; the norms. rc: recompute repeats the forward. */
static void mamba_work(const struct mt_block_shape *sh, int rc, struct mt_work *w)
{
    const struct mamba_gdims g = mamba_gdims_of(sh->cfg), *s = &g;
    const double D = (double)sh->D;
    const double mE = (double)s->mE, io = 2.0 * mE + 2.0 * (double)s->mG * (double)s->mN + (double)s->mH;
    w->f[MT_WORK_SCAN] += mamba_extra(sh) * (1.0 + rc / 3.0);
    if (!strcmp(sh->cfg->precision, "bf16")) {
        mamba_work_bf16(sh, rc, w);
        return;
    }
    w->e[MT_WORK_SCAN] += io * (3.0 + rc);
    w->e[MT_WORK_NORM] += 5.0 * D + 6.0 * mE + rc * (2.0 * D + 3.0 * mE);
    w->e[MT_WORK_ELEMENTWISE] += 12.0 * mE + 6.0 * D + rc * (4.0 * mE + 3.0 * D);
}

/* Saved: the input norm and its rstd, the mixer's activations (one block,
 * mt_mamba3_acts_floats). */
static void mamba_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct mamba_state *st = pc->st;
    const size_t D = (size_t)pc->D, Nr = (size_t)pc->Nr, N = (size_t)pc->N;
    const enum mt_bucket A = MT_BUCKET_ACTS;
    pc->nm->h_n = carve_f(c, A, Nr * D);
    pc->nm->h = pc->tp.sp ? carve_f(c, A, N * D) : pc->nm->h_n;   /* SP: the gathered copy is saved */
    /* precision=bf16: the in-projection's operand twin, written by the input
     * norm (not under SP, whose gathered rows are fp32; as attention.c) */
    pc->nm->hb = NULL;
    if (pc->bf16 && !pc->tp.sp && (!pc->ops || pc->ops->rmsnorm_forward_bf16)) pc->nm->hb = carve(c, A, Nr * D * 2);
    pc->nm->rstd = carve_f(c, A, Nr);
    float *acts = carve_f(c, A, mt_mamba3_acts_floats(mdims(pc), pc->N));
    if (acts) mt_mamba3_acts_bind(&st->mb, acts, mdims(pc), pc->N);
    /* precision=bf16 with the bf16 scan: its chunk states, kept for the backward
     * (mt_ssm_states_floats; 0 where the shape has none). Carved from the config
     * alone, so the plan and every backend agree; the cpu, whose scan stays fp32,
     * leaves them unused. At the d2048 hybrid 134 MB an M layer, for the
     * backward's states product and its pass between chunks (ssd_states: 2.2 ms
     * an M layer on the H100 of 2026-11-27, then fp32 kernels) */
    const struct mt_mamba3_dims *d = mdims(pc);
    const size_t ns = pc->bf16 && d->scan_bf16 && pc->T > 0
                          ? mt_ssm_states_floats(pc->N / pc->T, pc->T, d->H, d->P, d->N, d->chunk) : 0;
    float *states = ns ? carve_f(c, A, ns) : NULL;
    /* ... and, with them, Bh and Ch's bf16 twins, the products' operands (2 bytes an
     * element where the scan's staging read 4; 67 MB each an M layer at the d2048
     * hybrid), both in the fp32 Ch's memory (N HN floats hold the two N HN bf16
     * twins): a run uses the twins (the tensor-core scan's shapes, mamba3.c
     * scan_in_proj) or the fp32 Ch (every other shape, the cpu), never both, so
     * nothing is carved for them (134 MB an M layer at the d2048 hybrid) */
    const size_t nbc = ns ? pc->N * (size_t)d->H * (size_t)d->N : 0;
    if (acts) {
        st->mb.states = states;
        st->mb.Bh_b = nbc ? (mt_bf16 *)st->mb.Ch : NULL;
        st->mb.Ch_b = nbc ? (mt_bf16 *)st->mb.Ch + nbc : NULL;
    }
    /* precision=bf16: the gated norm output's twin, Wout's operand (forward and
     * dWout), rounded once per forward by cast_bf16 (this rank's E channels) */
    st->yn_b = NULL;
    if (pc->bf16) st->yn_b = carve(c, A, N * (size_t)mdims(pc)->H * (size_t)mdims(pc)->P * 2);
}

/* LoRA: the frozen mixer's vectors (dt_bias, A_log, D: H; B/C norms: N;
 * B/C biases: H N; gated norm: E) have no gradient buffer, but the fused
 * SSM kernels compute their gradients alongside dx: they land in this
 * sink (each slice 16-float aligned), zeroed per backward and never read.
 * The frozen matrices' weight gradients are skipped (mamba3.c). */
static size_t sink_slice(size_t n) { return (n + 15) / 16 * 16; }

static size_t mamba_sink_floats(const struct mt_mamba3_dims *d)
{
    size_t H = (size_t)d->H, N = (size_t)d->N;
    return 3 * sink_slice(H) + 2 * sink_slice(N) + 2 * sink_slice(H * N) + sink_slice(H * (size_t)d->P);
}

static void mamba_sink(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, float *sink,
                       const struct mt_mamba3_dims *d)
{
    size_t H = (size_t)d->H, N = (size_t)d->N;
    float **v[] = {&g->dt_bias, &g->A_log, &g->Dsk, &g->gB, &g->gC, &g->B_bias, &g->C_bias, &g->g_out};
    const size_t n[] = {H, H, H, N, N, H * N, H * N, H * (size_t)d->P};
    ops->fill(ops->be, sink, 0.0f, mamba_sink_floats(d));
    for (size_t k = 0; k < sizeof n / sizeof n[0]; k++) {
        if (!*v[k]) *v[k] = sink;
        sink += sink_slice(n[k]);
    }
}

/* backward scratch (WORKSPACE), shared by every M layer */
static void mamba_carve_scratch(const struct mt_piece_ctx *pc, struct mt_carver *c)
{
    float *s = carve_f(c, MT_BUCKET_WORKSPACE, mt_mamba3_scratch_floats(mdims(pc), pc->N));
    if (s) mt_mamba3_scratch_bind(mb_s(pc), s, mdims(pc), pc->N);
    if (mown(pc)->rep)   /* the gated norm's per-row group sums (all-reduced) */
        ((struct mamba_own *)pc->own)->gsum = carve_f(c, MT_BUCKET_WORKSPACE, (size_t)pc->N * (size_t)mown(pc)->Gg);
    if (pc->lora) mb_s(pc)->sink = carve_f(c, MT_BUCKET_WORKSPACE, mamba_sink_floats(mdims(pc)));
}

/* the mixer's weights (use_grad 0) or their gradients (1) as mamba3.c wants them */
static void mamba_weights(const struct mamba_w *w, int use_grad, struct mt_mamba3_weights *out)
{
#define MB_PICK(p) (use_grad ? (p)->grad : (p)->data)
    out->win = NULL;   /* by blocks */
    for (int b = 0; b < 7; b++) out->win_part[b] = MB_PICK(w->mwin[b]);
    out->wout = MB_PICK(w->mwout);
    out->dt_bias = MB_PICK(w->mdt_bias);
    out->A_log = MB_PICK(w->ma_log);
    out->Dsk = MB_PICK(w->md);
    out->gB = MB_PICK(w->mgb);
    out->gC = MB_PICK(w->mgc);
    out->B_bias = MB_PICK(w->mbb);
    out->C_bias = MB_PICK(w->mcb);
    out->g_out = MB_PICK(w->mgout);
#undef MB_PICK
}

/*
 * LoRA (docs/lora.md): the in-projection's seven blocks share one adapter A
 * (r, D) -- one low-rank update of the stacked Win, as SPEC 1d's "in
 * projection" -- with B cut into the blocks' rows (mixer.in_proj_<blk>.lora_B);
 * the out-projection has its own A, B (proj_fwd / proj_bwd). The mixer runs in
 * stages (mt_mamba3.h) so the adapters' terms join proj / dyn / dh:
 *     proj_b += s (h A_in^T) B_b^T;   out = yn Wout^T + s (yn A_out^T) B_out^T
 * Under TP: h is whole, A_in whole (its gradient partial over the model
 * group), B_b this rank's rows of each block; yn holds this rank's heads'
 * channels, A_out their columns, B_out whole (gradient partial), and the
 * adapter's output joins the partial sum the TP exit reduces.
 */
static void in_rows(const struct mamba_w *w, int rows[7])
{
    for (int b = 0; b < 7; b++) rows[b] = (int)w->mwin[b]->len[0];
}

/*
 * precision=bf16 (docs/cuda.md "bf16 mixed precision"): Win's seven blocks
 * and Wout have bf16 shadows (model.c bf16_shadowed), and their GEMMs run
 * through gemm_bf16 by wlinear's operand rules (the shadow when fresh, the
 * fp32 operands rounded in the call; hb = bf16(h) from the input norm, or
 * NULL). Win's blocks write column slices of proj / read those of dproj
 * (ld W), so these are wlinear's calls with a stride. fp32 mode (no
 * shadow) runs mt_mamba3_in_forward / _in_backward unchanged: the same bits.
 */
static int mixer_bf16(const struct mamba_w *w) { return w->mwout->bf16 != NULL; }

/* precision=bf16: the input norm's fp32 output h has no reader when the bf16
 * mixer's in-projection GEMMs (forward, dWin; in_fwd, in_bwd and their _rep
 * forms read hb wherever it exists) take its twin hb (not under SP) and no
 * adapter reads h (LoRA's terms are fp32). The norm then stores the twin
 * alone, and h goes to the mixer as NULL, so a reader missed here faults. */
static int mamba_h_unread(const struct mt_piece_ctx *pc)
{
    return pc->nm->hb && mixer_bf16(mbw(pc)) && !pc->lora;
}
static const float *mamba_h(const struct mt_piece_ctx *pc, const float *h) { return mamba_h_unread(pc) ? NULL : h; }

/*
 * Win's seven blocks as one (W, D) operand (params_whole, model_impl.h): where
 * their GEMM operands lie back to back in block order, one GEMM over all W
 * columns does the seven blocks' work: forward one launch instead of seven, and
 * backward dh's K runs over W in one product instead of seven accumulations into
 * dh (n, D) in fp32 (six extra reads and writes of it; four of the blocks are 64
 * rows at d2048, so their products were all memory). NULL where they are not
 * contiguous (a different operand type, engine-owned data): block by block.
 */
static const void *win_whole(const struct mamba_w *lw, int W, enum mt_elem *t)
{
    return params_whole(lw->mwin, 7, W, t);
}

/* Win's seven blocks are grad_gemm (mt_param.h): the bf16 in-projection's
 * GEMMs write them whole (one GEMM for all seven, grad_beta_all, or one a
 * block, grad_beta); where their writers add instead (the fp32 mixer in
 * mamba3.c, the replicated-B/C row segments) they are zeroed first */
static void win_zero_unwritten(const struct mt_piece_ctx *pc)
{
    for (int b = 0; b < 7; b++) grad_zero_unwritten(pc->ops, mbw(pc)->mwin[b]);
}
/* proj (n, W) = h Win^T, whole (win_whole) or block by block. z_b: NULL, or the z block
 * as bf16 alone (mt_mamba3_acts z_b: rows 2 W bf16 apart in proj's memory; autocast's
 * rounding of a Linear's output), and with x_b (= z_b + E: acts x_b) the x block beside it
 * (z | x one bf16 output where their weights lie back to back), the others fp32 from the
 * next block's column: two GEMMs */
static void in_fwd(const struct mt_piece_ctx *pc, float *proj, const float *h, const mt_bf16 *hb,
                   const struct mt_mamba3_weights *w, int n, mt_bf16 *z_b, const mt_bf16 *x_b)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mamba_w *lw = mbw(pc);
    if (!mixer_bf16(lw)) { mt_mamba3_in_forward(ops, proj, h, w, mdims(pc), n); return; }
    if (n <= 0) return;
    const int W = mt_mamba3_in_width(mdims(pc)), D = pc->D;
    const void *x = hb ? (const void *)hb : (const void *)h;
    const enum mt_elem xt = hb ? MT_ELEM_BF16 : MT_ELEM_F32;
    enum mt_elem tw;
    int rows[7], off = 0, b0 = 0;
    in_rows(lw, rows);
    if (z_b) {
        const int nb = x_b ? 2 : 1, zx = rows[0] + (x_b ? rows[1] : 0);
        MT_ASSERT(!x_b || x_b == z_b + rows[0]);
        const void *Wzx = params_whole(lw->mwin, nb, zx, &tw);
        if (Wzx) ops->gemm_bf16_out(ops->be, 0, 1, n, zx, D, 1.0f, x, xt, D, Wzx, tw, D, z_b, 2 * W);
        for (int b = 0; b < nb && !Wzx; b++) {
            const void *Wb = wlinear_op(lw->mwin[b], &tw);
            ops->gemm_bf16_out(ops->be, 0, 1, n, rows[b], D, 1.0f, x, xt, D, Wb, tw, D, z_b + off, 2 * W);
            off += rows[b];
        }
        off = zx, b0 = nb;
        const void *Wr = params_whole(lw->mwin + nb, 7 - nb, W - off, &tw);   /* the rest, back to back */
        if (Wr) {
            ops->gemm_bf16(ops->be, 0, 1, n, W - off, D, 1.0f, x, xt, D, Wr, tw, D, 0.0f, proj + off, W);
            return;
        }
    } else {
        const void *Ww = win_whole(lw, W, &tw);
        if (Ww) { ops->gemm_bf16(ops->be, 0, 1, n, W, D, 1.0f, x, xt, D, Ww, tw, D, 0.0f, proj, W); return; }
    }
    for (int b = b0; b < 7; b++) {
        const void *Wb = wlinear_op(lw->mwin[b], &tw);
        if (rows[b] > 0) ops->gemm_bf16(ops->be, 0, 1, n, rows[b], D, 1.0f, x, xt, D, Wb, tw, D, 0.0f, proj + off, W);
        off += rows[b];
    }
}

/* dWin_b += dproj_b^T h (a frozen block skipped); dh = sum_b dproj_b Win_b; each whole
 * where it can be (proj_bwd_rows; the fp32 mixer: g->win_part[b] NULL for a frozen block).
 * dh_b: NULL, or room for dh as bf16 (dh_bf16_room): returns 1 where dh went there */
static int in_bwd(const struct mt_piece_ctx *pc, float *dh, struct mt_mamba3_weights *g, const float *dproj,
                  const mt_bf16 *dproj_b, const float *h, const mt_bf16 *hb, const struct mt_mamba3_weights *w, int n,
                  mt_bf16 *dh_b)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mamba_w *lw = mbw(pc);
    if (!mixer_bf16(lw)) {   /* the fp32 library's GEMMs add */
        win_zero_unwritten(pc);
        mt_mamba3_in_backward(ops, dh, 0, g, dproj, h, w, mdims(pc), n);
        return 0;
    }
    if (n <= 0) return 0;
    const int W = mt_mamba3_in_width(mdims(pc));
    /* dproj feeds two GEMMs per block: its producers' bf16 (dproj_b), or rounded once here
     * (dyb_round), else fp32 rounded in the calls; the seven blocks as one operand
     * (proj_bwd_rows: whole where Win's blocks and their gradients lie back to back) */
    const mt_bf16 *pb = dproj_b ? dproj_b : dyb_round(ops, pc->dyb, dproj, (size_t)n * (size_t)W);
    return proj_bwd_rows(ops, dh, 0.0f, lw->mwin, 7, pb ? (const void *)pb : (const void *)dproj,
                         pb ? MT_ELEM_BF16 : MT_ELEM_F32, W, h, hb, n, pc->D, dh_b);
}

/*
 * Replicated B/C (mamba_ngroups % tp != 0): the in-projection by row segments.
 * Blocks z, x, dt, theta, lam are this rank's rows (one segment each); B and
 * C are whole on every rank and local group k reads global group
 * bc_group(k): one N-row segment of the weight per local group, written to
 * proj's next N columns. fp32 (ops->gemm) or the bf16 shadow (gemm_bf16),
 * as in_fwd. Backward: dW's segment rows +=, dh = sum of dproj_seg W_seg.
 */
static int rep_nseg(const struct mt_piece_ctx *pc, int b) { return b == 2 || b == 3 ? mdims(pc)->G : 1; }

/* segment k of block b: its first weight row and its row count */
static void rep_seg(const struct mt_piece_ctx *pc, int b, int k, int *r0, int *rows)
{
    const int N = mdims(pc)->N;
    if (b == 2 || b == 3) { *r0 = bc_group(mown(pc), k) * N; *rows = N; }
    else { *r0 = 0; *rows = (int)mbw(pc)->mwin[b]->len[0]; }
}

/* the weight operand from row r0 on: its bf16 shadow when fresh, else fp32 */
static const void *wop_row(const struct mt_param *w, int r0, enum mt_elem *t)
{
    const void *p = wlinear_op(w, t);
    const size_t es = *t == MT_ELEM_BF16 ? sizeof(mt_bf16) : sizeof(float);
    return (const char *)p + (size_t)r0 * (size_t)w->len[1] * es;
}

static void in_fwd_rep(const struct mt_piece_ctx *pc, float *proj, const float *h, const mt_bf16 *hb, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mamba_w *lw = mbw(pc);
    const int W = mt_mamba3_in_width(mdims(pc)), D = pc->D, bf = mixer_bf16(lw);
    int off = 0;
    for (int b = 0; b < 7; b++)
        for (int k = 0; k < rep_nseg(pc, b); k++) {
            int r0, rows;
            rep_seg(pc, b, k, &r0, &rows);
            if (rows > 0 && n > 0) {
                if (bf) {
                    enum mt_elem tw;
                    const void *Wb = wop_row(lw->mwin[b], r0, &tw);
                    ops->gemm_bf16(ops->be, 0, 1, n, rows, D, 1.0f, hb ? (const void *)hb : (const void *)h,
                                   hb ? MT_ELEM_BF16 : MT_ELEM_F32, D, Wb, tw, D, 0.0f, proj + off, W);
                } else {
                    ops->gemm(ops->be, 0, 1, n, rows, D, 1.0f, h, D, lw->mwin[b]->data + (size_t)r0 * D, D, 0.0f,
                              proj + off, W);
                }
            }
            off += rows;
        }
}

static void in_bwd_rep(const struct mt_piece_ctx *pc, float *dh, const float *dproj, const float *h,
                       const mt_bf16 *hb, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mamba_w *lw = mbw(pc);
    const int W = mt_mamba3_in_width(mdims(pc)), D = pc->D, bf = mixer_bf16(lw);
    int off = 0, first = 1;
    win_zero_unwritten(pc);   /* the segments' GEMMs add */
    const mt_bf16 *pb = bf && n > 0 ? dyb_round(ops, pc->dyb, dproj, (size_t)n * (size_t)W) : NULL;   /* as in_bwd */
    const enum mt_elem pt = pb ? MT_ELEM_BF16 : MT_ELEM_F32;
    for (int b = 0; b < 7; b++)
        for (int k = 0; k < rep_nseg(pc, b); k++) {
            int r0, rows;
            rep_seg(pc, b, k, &r0, &rows);
            if (rows > 0 && n > 0) {
                float *gw = lw->mwin[b]->grad + (size_t)r0 * D;
                if (bf) {
                    enum mt_elem tw;
                    const void *Wb = wop_row(lw->mwin[b], r0, &tw);
                    const void *dp = pb ? (const void *)(pb + off) : (const void *)(dproj + off);
                    ops->gemm_bf16(ops->be, 1, 0, rows, D, n, 1.0f, dp, pt, W,
                                   hb ? (const void *)hb : (const void *)h, hb ? MT_ELEM_BF16 : MT_ELEM_F32, D, 1.0f,
                                   gw, D);
                    ops->gemm_bf16(ops->be, 0, 0, n, D, rows, 1.0f, dp, pt, W, Wb, tw, D, first ? 0.0f : 1.0f, dh, D);
                } else {
                    ops->gemm(ops->be, 1, 0, rows, D, n, 1.0f, dproj + off, W, h, D, 1.0f, gw, D);
                    ops->gemm(ops->be, 0, 0, n, D, rows, 1.0f, dproj + off, W, lw->mwin[b]->data + (size_t)r0 * D, D,
                              first ? 0.0f : 1.0f, dh, D);
                }
                first = 0;
            }
            off += rows;
        }
}

/* The gated norm whose groups span ranks: this rank's channels [c0, c0 + E)
 * meet the global groups of cg channels; their per-row sums go into columns
 * [c0 / cg, ...) of gsum (N, Gg), zero elsewhere, and are all-reduced over
 * the model group before the norm (forward: sums of squares; backward: the
 * mean term's sums). */
static void gate_geom(const struct mt_piece_ctx *pc, int *c0, int *cg, float **s)
{
    const struct mamba_own *o = mown(pc);
    *c0 = o->h0 * mdims(pc)->P;
    *cg = o->hpg * mdims(pc)->P;
    *s = o->gsum + *c0 / *cg;
}

static enum mt_status gate_fwd_rep(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                   const struct mt_mamba3_weights *w, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    struct mt_mamba3_acts *a = &((struct mamba_state *)pc->st)->mb;
    const int E = mdims(pc)->H * mdims(pc)->P, W = mt_mamba3_in_width(mdims(pc)), Gg = mown(pc)->Gg;
    int c0, cg;
    float *s;
    gate_geom(pc, &c0, &cg, &s);
    ops->fill(ops->be, mown(pc)->gsum, 0.0f, (size_t)n * Gg);
    ops->ssm_gate_norm_sums(ops->be, s, Gg, a->ys, a->proj, W, w->g_out, NULL, NULL, n, E, c0, cg);
    MT_CHECK(tpa_allreduce(ctx, &pc->tp, mown(pc)->gsum, (size_t)n * Gg));
    ops->ssm_gate_norm_forward_ext(ops->be, a->yn, a->rstd_o, a->ys, a->proj, W, w->g_out, s, Gg, n, E, c0, cg,
                                   mdims(pc)->eps_out);
    return MT_OK;
}

static enum mt_status gate_bwd_rep(struct mt_ctx *ctx, const struct mt_piece_ctx *pc,
                                   const struct mt_mamba3_weights *w, struct mt_mamba3_weights *g, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_mamba3_acts *a = &((struct mamba_state *)pc->st)->mb;
    struct mt_mamba3_scratch *sc = mb_s(pc);
    const int E = mdims(pc)->H * mdims(pc)->P, W = mt_mamba3_in_width(mdims(pc)), Gg = mown(pc)->Gg;
    int c0, cg;
    float *s;
    gate_geom(pc, &c0, &cg, &s);
    ops->fill(ops->be, mown(pc)->gsum, 0.0f, (size_t)n * Gg);
    ops->ssm_gate_norm_sums(ops->be, s, Gg, a->ys, a->proj, W, w->g_out, sc->dyn, a->rstd_o, n, E, c0, cg);
    MT_CHECK(tpa_allreduce(ctx, &pc->tp, mown(pc)->gsum, (size_t)n * Gg));
    /* dz lands in dproj's z columns, as mt_mamba3_mix_backward */
    ops->ssm_gate_norm_backward_ext(ops->be, sc->dys, sc->dproj, g->g_out, sc->dyn, a->ys, a->proj, W, w->g_out,
                                    a->rstd_o, s, Gg, n, E, c0, cg);
    return MT_OK;
}

/* dWout += dy^T yn (its twin in precision=bf16) and d yn = dy Wout, or (dyn_b not NULL)
 * written as bf16 only there (the GEMM's bf16 output, which the bf16 gated norm's backward
 * reads widened); two GEMMs read dy, so in precision=bf16 it is rounded once (dyb_round) */
static void wout_bwd(const struct mt_piece_ctx *pc, const float *dy, struct mt_mamba3_weights *g, int n,
                     mt_bf16 *dyn_b)
{
    const struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    const int E = mdims(pc)->H * mdims(pc)->P;
    const mt_bf16 *dyb = mixer_bf16(mbw(pc)) ? dyb_round(ops, pc->dyb, dy, (size_t)n * (size_t)pc->D) : NULL;
    wlinear_backward_db(ops, dyn_b ? NULL : mb_s(pc)->dyn, 0.0f, g->wout, dy, dyb, st->mb.yn, st->yn_b,
                        mbw(pc)->mwout, n, E, pc->D);
    if (dyn_b) wlinear_backward_dx_bf16_out(ops, dyn_b, dy, dyb, mbw(pc)->mwout, n, E, pc->D);
}

/* the whole mixer with replicated B/C: out (n, D) = mixer(h) / its backward */
static enum mt_status mixer_fwd_rep(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, float *out, const float *h,
                                    const mt_bf16 *hb, const struct mt_mamba3_weights *w, int B, int T)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    const int n = B * T, E = mdims(pc)->H * mdims(pc)->P;
    in_fwd_rep(pc, st->mb.proj, h, hb, n);
    st->mb.ys_b = NULL;   /* the spanning gated norm reads the fp32 ys and z */
    st->mb.z_b = st->mb.x_b = NULL;
    mt_mamba3_ssm_forward(ops, &st->mb, w, mdims(pc), B, T);
    MT_CHECK(gate_fwd_rep(ctx, pc, w, n));
    if (st->yn_b) ops->cast_bf16(ops->be, st->yn_b, st->mb.yn, (size_t)n * (size_t)E);
    wlinear_forward(ops, out, st->mb.yn, st->yn_b, mbw(pc)->mwout, n, E, pc->D, 0.0f);
    return MT_OK;
}

static enum mt_status mixer_bwd_rep(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const float *dy,
                                    const struct mt_mamba3_weights *w, struct mt_mamba3_weights *g)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    const int n = pc->B * pc->T;
    wout_bwd(pc, dy, g, n, NULL);
    MT_CHECK(gate_bwd_rep(ctx, pc, w, g, n));
    mt_mamba3_ssm_backward(ops, g, mb_s(pc), &st->mb, w, mdims(pc), pc->B, pc->T);
    in_bwd_rep(pc, pc->dh, mb_s(pc)->dproj, mamba_h(pc, pc->nm->h), pc->nm->hb, n);
    return MT_OK;
}

/* The scan's output ys stored as bf16 only (in ys's memory; autocast's rounding of the
 * scan's output), where the scan writes it so (mt_mamba3_ys_bf16_ok), this forward's
 * gated norm is the bf16 one and the backward's will be too: mt_mamba3_mix_backward_b
 * given its dproj room, which mixer_bwd takes from the dy scratch (proj_scratch sizes it
 * for that in bf16 mode; checked here all the same). The scan's store and the gated
 * norm's reads (one pass forward, its second from cache, and one backward) 4 -> 2 bytes:
 * 6 bytes an element of ys (mamba_work_bf16); else NULL, the fp32 ys. */
static mt_bf16 *ys_bf16(const struct mt_piece_ctx *pc, int B, int T)
{
    const size_t n = (size_t)B * (size_t)T, W = (size_t)mt_mamba3_in_width(mdims(pc));
    float *ys = ((struct mamba_state *)pc->st)->mb.ys;
    return dyb_fits(pc->dyb, n * W) && mt_mamba3_ys_bf16_ok(pc->ops, mdims(pc), B, T) ? (mt_bf16 *)ys : NULL;
}

/* out (n, D) = mixer(h) + beta out: mt_mamba3_forward's stages with the projections
 * above; beta 1 (the residual seeded in out) only on the bf16 path (mixer_bf16); resid:
 * NULL, or out = resid + mixer(h), Wout's GEMM reading resid (resid_in_gemm; beta unused) */
static void mixer_fwd(const struct mt_piece_ctx *pc, float *out, const float *h, const mt_bf16 *hb,
                      const struct mt_mamba3_weights *w, int B, int T, float beta, const float *resid)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    if (!mixer_bf16(mbw(pc))) {
        MT_ASSERT(beta == 0.0f);
        mt_mamba3_forward(ops, out, &st->mb, h, w, mdims(pc), B, T);
        return;
    }
    const struct mt_mamba3_dims *d = mdims(pc);
    const int n = B * T, E = d->H * d->P, W = mt_mamba3_in_width(d);
    const int gb = st->yn_b && ops->ssm_gate_norm_forward_bf16;   /* the bf16 gated norm */
    /* ys as bf16 (ys_bf16) and, on the same path, z: the in-projection writes its z block
     * as bf16 alone, which only the two bf16 gated-norm passes read (autocast's rounding
     * of a Linear's output; 4 bytes an element of z: the GEMM's store, two reads) */
    st->mb.ys_b = gb ? ys_bf16(pc, B, T) : NULL;
    st->mb.z_b = st->mb.ys_b && ops->gemm_bf16_out ? (mt_bf16 *)st->mb.proj : NULL;
    /* ... and x beside z, the scan's x: every read of it widens it (acts x_b) */
    st->mb.x_b = st->mb.z_b ? st->mb.z_b + E : NULL;
    in_fwd(pc, st->mb.proj, h, hb, w, n, st->mb.z_b, st->mb.x_b);
    if (gb) {
        /* mt_mamba3_mix_forward with the gated norm writing Wout's operand alone:
         * the fp32 yn has no reader on this path (Wout is shadowed, so wlinear and
         * wout_bwd read the twin), so neither its store nor a cast pass */
        mt_mamba3_ssm_forward(ops, &st->mb, w, d, B, T);
        ops->ssm_gate_norm_forward_bf16(ops->be, NULL, st->yn_b, st->mb.rstd_o, st->mb.ys_b ? NULL : st->mb.ys,
                                        st->mb.z_b ? NULL : st->mb.proj, W, w->g_out, n, E, d->G, d->eps_out,
                                        st->mb.ys_b, st->mb.z_b, 2 * W);
    } else {
        mt_mamba3_mix_forward(ops, &st->mb, w, d, B, T);
        if (st->yn_b) ops->cast_bf16(ops->be, st->yn_b, st->mb.yn, (size_t)n * (size_t)E);
    }
    if (resid) wlinear_forward_resid(ops, out, resid, st->mb.yn, st->yn_b, mbw(pc)->mwout, n, E, pc->D);
    else wlinear_forward(ops, out, st->mb.yn, st->yn_b, mbw(pc)->mwout, n, E, pc->D, beta);
}

/* dh = d h (overwritten), the mixer's gradients += : mt_mamba3_backward's stages.
 * Returns dh as bf16 in its own memory (dh_bf16_room), or NULL: dh written fp32 */
static const mt_bf16 *mixer_bwd(const struct mt_piece_ctx *pc, const float *dy, const struct mt_mamba3_weights *w,
                                struct mt_mamba3_weights *g)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    if (!mixer_bf16(mbw(pc))) {
        /* the fp32 mixer's Wout GEMM adds (mamba3.c takes no parameters): zero
         * a gradient left to its first write (grad_gemm) before it */
        grad_zero_unwritten(ops, mbw(pc)->mwout);
        win_zero_unwritten(pc);
        mt_mamba3_backward(ops, pc->dh, 0, g, mb_s(pc), dy, pc->nm->h, &st->mb, w, mdims(pc), pc->B, pc->T);
        return NULL;
    }
    const int n = pc->B * pc->T;
    /* dyn as bf16 only where the forward took the bf16 gated norm (ys_b: the backward's is
     * the bf16 one too, mt_mamba3_mix_backward_b), its one reader: autocast's rounding of
     * the out-projection's input gradient (4 bytes an element: the store, the read) */
    mt_bf16 *dyn_b = st->mb.ys_b && ops->gemm_bf16_out ? (mt_bf16 *)mb_s(pc)->dyn : NULL;
    wout_bwd(pc, dy, g, n, dyn_b);
    /* dproj as bf16 from its producers where they can (mt_mamba3_mix_backward_b), into
     * the dy scratch: wout_bwd's GEMMs, its other readers, come before on the stream */
    mt_bf16 *room = dyb_room(pc->dyb, (size_t)n * (size_t)mt_mamba3_in_width(mdims(pc)));
    mb_s(pc)->dyn_b = dyn_b;
    const int direct = mt_mamba3_mix_backward_b(ops, g, mb_s(pc), &st->mb, w, mdims(pc), pc->B, pc->T, room);
    mb_s(pc)->dyn_b = NULL;
    mt_bf16 *dhb = dh_bf16_room(pc);
    return in_bwd(pc, pc->dh, g, mb_s(pc)->dproj, direct ? room : NULL, mamba_h(pc, pc->nm->h), pc->nm->hb, w, n, dhb)
               ? dhb : NULL;
}

static void mixer_fwd_lora(const struct mt_piece_ctx *pc, float *out, const float *h, const struct mt_mamba3_weights *w,
                           float *state, int B, int T, int pos0)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    const int n = B * T, D = pc->D, E = mdims(pc)->H * mdims(pc)->P, W = mt_mamba3_in_width(mdims(pc));
    int rows[7];
    in_rows(mbw(pc), rows);
    in_fwd(pc, st->mb.proj, h, state ? NULL : pc->nm->hb, w, n, NULL, NULL);   /* the adapters add fp32 into proj */
    lora_fwd_add(ops, pc->s_lora, st->mb.proj, W, h, (const struct mt_param *const *)mbw(pc)->mwin, rows, 7, n, D);
    if (state) mt_mamba3_decode_mix(ops, &st->mb, state, w, mdims(pc), T, pos0);
    else mt_mamba3_mix_forward(ops, &st->mb, w, mdims(pc), B, T);
    const mt_bf16 *ynb = state ? NULL : st->yn_b;   /* decoding: rounded per call */
    if (ynb) ops->cast_bf16(ops->be, st->yn_b, st->mb.yn, (size_t)n * (size_t)E);
    proj_fwd_b(ops, pc->s_lora, out, st->mb.yn, ynb, mbw(pc)->mwout, n, E, D, 0.0f);
}

static void mixer_bwd_lora(const struct mt_piece_ctx *pc, const float *dy, const struct mt_mamba3_weights *w,
                           struct mt_mamba3_weights *g)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    struct mt_mamba3_scratch *s = mb_s(pc);
    const int n = pc->B * pc->T, D = pc->D, E = mdims(pc)->H * mdims(pc)->P, W = mt_mamba3_in_width(mdims(pc));
    int rows[7];
    in_rows(mbw(pc), rows);
    for (int b = 0; b < 7; b++)
        if (mbw(pc)->mwin[b]->frozen) g->win_part[b] = NULL;   /* no weight gradient for the frozen base */
    proj_bwd_b(ops, pc->s_lora, pc->s_dlora, s->dyn, 0.0f, mbw(pc)->mwout, dy, st->mb.yn, st->yn_b, n, E, D, pc->dyb);
    mt_mamba3_mix_backward(ops, g, s, &st->mb, w, mdims(pc), pc->B, pc->T);
    in_bwd(pc, pc->dh, g, s->dproj, NULL, pc->nm->h, pc->nm->hb, w, n, NULL);   /* the adapters add to dh */
    lora_bwd_add(ops, pc->s_lora, pc->s_dlora, pc->dh, s->dproj, W, pc->nm->h, mbw(pc)->mwin, rows, 7, n, D);
}

static enum mt_status mamba_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    struct mamba_state *st = pc->st;
    const struct mt_ops_i *ops = pc->ops;
    const int n = a->B * a->T, D = pc->D;
    if (a->state) {
        /* decoding, B == 1, one rank: a->state is this layer's recurrent state
         * (mamba_decode_floats: no t_max dependence), O(1) per new token */
        MT_ASSERT(a->B == 1 && pc->tp.tp == 1);
        struct mt_mamba3_weights w;
        mamba_weights(mbw(pc), 0, &w);
        ops->rmsnorm_forward(ops->be, pc->nm->h_n, pc->nm->rstd, pc->x_in, pc->g->data, n, D, pc->norm_eps);
        if (pc->lora) mixer_fwd_lora(pc, a->x_out, pc->nm->h_n, &w, a->state, 1, a->T, a->pos0);
        else mt_mamba3_decode(ops, a->x_out, &st->mb, a->state, pc->nm->h_n, &w, mdims(pc), a->T, a->pos0);
        ops->axpby(ops->be, a->x_out, pc->x_in, 1.0f, 1.0f, (size_t)n * D);
        return MT_OK;
    }
    const int Nr = pc->tp.sp ? n / pc->tp.tp : n;     /* residual rows on this rank */
    struct mt_mamba3_weights w;
    mamba_weights(mbw(pc), 0, &w);
    /* one rank, no adapter, the bf16 mixer: the input norm also seeds x_out = x_in and
     * Wout's GEMM adds onto it (beta 1), as attention's Wo: no axpby pass (3 D floats a
     * row: read x_out and x_in, write x_out; the seed and the GEMM's read of it are 2) */
    const int seed = pc->tp.tp == 1 && !pc->lora && mixer_bf16(mbw(pc)) && pc->nm->hb &&
                     ops->rmsnorm_resid_forward_bf16;
    float *hn = mamba_h_unread(pc) ? NULL : pc->nm->h_n;   /* NULL: the twin alone */
    const int fold = seed && resid_in_gemm(pc, mbw(pc)->mwout);   /* Wout's GEMM reads x_in: no seed */
    if (seed)
        ops->rmsnorm_resid_forward_bf16(ops->be, hn, pc->nm->hb, pc->nm->rstd, fold ? NULL : a->x_out, pc->x_in,
                                        pc->g->data, Nr, D, pc->norm_eps);
    else if (pc->nm->hb)   /* precision=bf16: + the bf16 twin, the in-projection's operand */
        ops->rmsnorm_forward_bf16(ops->be, hn, pc->nm->hb, pc->nm->rstd, pc->x_in, pc->g->data, Nr, D, pc->norm_eps);
    else ops->rmsnorm_forward(ops->be, pc->nm->h_n, pc->nm->rstd, pc->x_in, pc->g->data, Nr, D, pc->norm_eps);
    if (seed) {
        mixer_fwd(pc, a->x_out, hn, pc->nm->hb, &w, a->B, a->T, 1.0f, fold ? pc->x_in : NULL);
        return MT_OK;
    }
    if (pc->tp.tp == 1) {
        /* x_out = mamba3(h), then += x_in (the residual path) */
        if (pc->lora) mixer_fwd_lora(pc, a->x_out, pc->nm->h_n, &w, NULL, a->B, a->T, 0);
        else mixer_fwd(pc, a->x_out, hn, pc->nm->hb, &w, a->B, a->T, 0.0f, NULL);
        ops->axpby(ops->be, a->x_out, pc->x_in, 1.0f, 1.0f, (size_t)n * D);
        return MT_OK;
    }
    /* TP region, like attention: this rank's heads and groups over all n rows;
     * Wout holds their columns, so the output is a partial sum (TP exit) */
    if (pc->tp.sp) MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->nm->h, pc->nm->h_n, Nr, D));
    const float *hh = mamba_h(pc, pc->nm->h);
    if (mown(pc)->rep) MT_CHECK(mixer_fwd_rep(ctx, pc, pc->s_red, hh, pc->nm->hb, &w, a->B, a->T));
    else if (pc->lora) mixer_fwd_lora(pc, pc->s_red, pc->nm->h, &w, NULL, a->B, a->T, 0);
    else mixer_fwd(pc, pc->s_red, hh, pc->nm->hb, &w, a->B, a->T, 0.0f, NULL);
    ops->copy(ops->be, a->x_out, pc->x_in, (size_t)Nr * D * sizeof(float));
    return tpa_exit_add(ctx, &pc->tp, a->x_out, pc->s_red, pc->s_full);
}

static enum mt_status mamba_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct mt_ops_i *ops = pc->ops;
    const int Nr = pc->Nr, D = pc->D;
    struct mt_mamba3_weights w, g;
    mamba_weights(mbw(pc), 0, &w);
    mamba_weights(mbw(pc), 1, &g);
    if (mb_s(pc)->sink) mamba_sink(ops, &g, mb_s(pc)->sink, mdims(pc));   /* LoRA: frozen vectors */
    /* the TP exit's conjugate: SP gathers the rows of d x_out; without SP dx is already whole */
    const float *dy = pc->dx;
    if (pc->tp.sp) {
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->s_full, pc->dx, Nr, D));
        dy = pc->s_full;
    }
    /* dh = d h (overwritten; under TP this rank's heads' partial sum), every mixer gradient += */
    const mt_bf16 *dh_b = NULL;   /* dh as bf16 in its own memory (dh_bf16_room), from the one dX GEMM */
    if (mown(pc)->rep) MT_CHECK(mixer_bwd_rep(ctx, pc, dy, &w, &g));
    else if (pc->lora) mixer_bwd_lora(pc, dy, &w, &g);
    else dh_b = mixer_bwd(pc, dy, &w, &g);
    /* the TP entry's conjugate: SP reduce-scatters the rows; without SP all-reduce */
    const float *dhr = pc->dh;
    if (pc->tp.sp) {
        MT_CHECK(tpa_reduce_scatter_rows(ctx, &pc->tp, pc->s_red, pc->dh, Nr, D));
        dhr = pc->s_red;
    } else if (pc->tp.tp > 1) {
        MT_CHECK(tpa_allreduce(ctx, &pc->tp, pc->dh, (size_t)pc->N * D));
    }
    MT_ASSERT(Nr == pc->Nr && (!dh_b || dhr == pc->dh));
    norm_bwd_twin(pc, dhr, dh_b);   /* + the residual gradient's bf16 twin */
    return MT_OK;
}

/* precision=bf16: the model's bf16 dy scratch also holds d proj (N x the in-projection's
 * local width), rounded once for the in-projection's backward (in_bwd) */
static void mamba_proj_scratch(const struct mt_piece_ctx *pc, size_t *rows, size_t *cols)
{
    (void)rows;
    const size_t W = (size_t)mt_mamba3_in_width(mdims(pc));
    if (W > *cols) *cols = W;   /* (only precision=bf16 carves that scratch) */
}

/* the recurrent state (scan state, previous x and B, rotary angles): O(1) in t_max */
static size_t mamba_decode_floats(const struct mt_piece_ctx *pc, int t_max)
{
    (void)t_max;
    return mt_mamba3_state_floats(mdims(pc));
}

const struct mt_piece mt_piece_mamba = {
    /* .name                  = */ "mamba3",
    /* .tp_regions            = */ 1,
    /* .sp_gathers            = */ 0,
    /* .params                = */ mamba_params,
    /* .check                 = */ mamba_check,
    /* .mm_per_token          = */ mamba_mm,
    /* .extra_flops_per_token = */ mamba_extra,
    /* .inactive_params       = */ NULL,
    /* .work_per_token        = */ mamba_work,
    /* .carve_scratch         = */ mamba_carve_scratch,
    /* .ffn_scratch           = */ NULL,
    /* .proj_scratch          = */ mamba_proj_scratch,
    /* .carve                 = */ mamba_carve,
    /* .forward               = */ mamba_forward,
    /* .backward              = */ mamba_backward,
    /* .undo_recompute        = */ NULL,
    /* .decode_floats         = */ mamba_decode_floats,
    /* .state_bytes           = */ sizeof(struct mamba_state),
    /* .own_bytes             = */ sizeof(struct mamba_own),
    /* .setup                 = */ mamba_setup,
};
