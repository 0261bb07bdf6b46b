/*
 * muon.c — Muon (Keller Jordan's, nanochat's split): momentum, then the
 * Nesterov direction orthogonalised by a quintic Newton–Schulz iteration
 * on the FULL matrix (GEMM-bound: ops->gemm in fp32; in precision=bf16,
 * ops->gemm_bf16_batched on batches of same-shape matrices, bf16 in and out).
 * It accepts the block matrices (roles DENSE and EXPERT, 2-D); the router, the Mamba-3 biases,
 * gains, embeddings and the head fall back to AdamW (mt_optim_kind_for).
 * State: momentum_buffer. Workspace (bucket WORKSPACE, sized for the
 * largest Muon matrix and the largest batch, holds nothing between calls):
 * d, x, and g for TP-split matrices only; y, a, b for the fp32 iteration,
 * the batch's bf16 x, x', a, b for the bf16 one (muon_ws_sizes).
 */
#include "mt_optim.h"

#include "../core/mt_knobs.h"
#include "../parallel/mt_comm.h"

#include <math.h>
#include <string.h>

/* Quintic Newton–Schulz coefficients (Keller Jordan's Muon / nanochat). */
#define NS_A     3.4445f
#define NS_B    (-4.7750f)
#define NS_C     2.0315f
#define NS_STEPS 5

/* workspace buffers, s = min(rows, cols), l = max(rows, cols); np, sp: n = s l
 * and s^2 rounded up to 128 elements (a batch's matrices 256 bytes apart) */
enum {
    WS_D,  /* (rows*cols) Nesterov direction d                                   */
    WS_X,  /* (s*l) iterate X (fp32 iteration); bf16: a TP-split matrix's result
            * widened (its box is copied out of it)                             */
    WS_Y,  /* (s*l) next iterate (fp32 iteration); TP column gather            */
    WS_A,  /* (s*s) A = X X^T (fp32 iteration)                                   */
    WS_B,  /* (s*s) B = b A + c A A (fp32 iteration)                             */
    WS_G,  /* (rows*cols) TP: gathered slices (split Muon params only)           */
    WS_X0, /* bf16 iteration: a batch's iterates X, nb x np bf16                 */
    WS_X1, /* bf16 iteration: their next iterates                                */
    WS_SA, /* bf16 iteration: the batch's A, nb x sp bf16                        */
    WS_SB, /* bf16 iteration: the batch's B                                      */
    WS_COUNT
};
_Static_assert(WS_COUNT <= MT_OPTIM_MAX_WS, "Muon's workspace fits the optimizer's table");

/* A batch of the bf16 iteration holds at most MUON_BATCH_ELEMS iterate
 * elements (32 MiB a bf16 copy): enough small matrices to fill a GPU (GPT-2
 * 124M's 768 x 768: 28 a batch), while a matrix that large alone runs alone
 * (d2048's 2048 x 5504; its 2048 x 2048: 4 a batch). Muon steps all of its
 * matrices in one list (whole_list), so a batch gathers a shape across the
 * model. */
#define MUON_BATCH_ELEMS ((size_t)1 << 24)

static size_t pad128(size_t n) { return (n + 127) & ~(size_t)127; }
/* the most matrices of n elements a batch holds; count: how many have that shape */
static int batch_cap(size_t n, int count)
{
    const size_t c = n ? MUON_BATCH_ELEMS / n : 1;
    return c < 1 ? 1 : c > (size_t)count ? count : (int)c;
}
static int same_shape(const struct mt_param *p, const struct mt_param *q)
{
    return p->shape[0] == q->shape[0] && p->shape[1] == q->shape[1];
}

static int is_split(const struct mt_param *p) { return p->len[0] != p->shape[0] || p->len[1] != p->shape[1]; }

/* Newton–Schulz's GEMMs in precision=bf16 (knob muon_ns_bf16, default on):
 * bf16 operands and storage, fp32 accumulation, as Muon's reference
 * implementation runs the iteration in bf16 (cuda: tensor cores instead of
 * fp32 CUDA cores, about ten times the rate); fp32 otherwise, as SPEC states
 * it. docs/model.md "Muon". */
int mt_optim_muon_ns_bf16(const struct mt_ctx *ctx, const struct mt_config *cfg)
{
    return !strcmp(cfg->precision, "bf16") && mt_knob_int(ctx, MT_KNOB_MUON_NS_BF16) != 0;
}

/* Workspace extents over every Muon matrix (kind `kind`): largest numel
 * and largest s*s of the FULL matrices (Newton–Schulz runs on the whole
 * matrix), g (and y, the column gather's) only when one is TP-split; the
 * fp32 iteration's y, a, b, or the bf16 iteration's batches (batch_cap: as
 * many matrices of a shape as there are, MUON_BATCH_ELEMS at most; a rank
 * that steps fewer of them forms no larger batch). */
static void muon_ws_sizes(const struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_param *params, int n,
                          int kind, size_t floats[MT_OPTIM_MAX_WS])
{
    size_t max_numel = 0, max_ss = 0, batch_n = 0, batch_ss = 0;
    int split = 0;
    for (int i = 0; i < n; i++) {
        const struct mt_param *p = &params[i];
        if ((int)p->optim != kind) continue;
        size_t r = (size_t)p->shape[0], c = (size_t)p->shape[1];
        size_t s = r < c ? r : c;
        if (r * c > max_numel) max_numel = r * c;
        if (s * s > max_ss) max_ss = s * s;
        int count = 0;
        for (int j = 0; j < n; j++) count += (int)params[j].optim == kind && same_shape(&params[j], p);
        const size_t nb = (size_t)batch_cap(r * c, count);
        if (nb * pad128(r * c) > batch_n) batch_n = nb * pad128(r * c);
        if (nb * pad128(s * s) > batch_ss) batch_ss = nb * pad128(s * s);
        split |= is_split(p);
    }
    if (max_numel == 0) return;
    floats[WS_D] = max_numel;
    floats[WS_G] = split ? max_numel : 0;
    if (mt_optim_muon_ns_bf16(ctx, cfg)) {   /* 2 bytes an element */
        floats[WS_X] = floats[WS_Y] = split ? max_numel : 0;
        floats[WS_X0] = floats[WS_X1] = (batch_n + 1) / 2;
        floats[WS_SA] = floats[WS_SB] = (batch_ss + 1) / 2;
    } else {
        floats[WS_X] = floats[WS_Y] = max_numel;
        floats[WS_A] = floats[WS_B] = max_ss;
    }
}

/* Newton–Schulz FLOPs of one update of a (rows x cols) matrix: 5
 * iterations of A = X X^T, B = bA + cAA, X = aX + BX on the s x l iterate
 * (s = min, l = max): 2 s^2 l + 2 s^3 + 2 s^2 l each. */
static double muon_flops(const struct mt_param *p)
{
    double r = (double)p->shape[0], c = (double)p->shape[1];
    double s = r < c ? r : c, l = r < c ? c : r;
    return 5.0 * (4.0 * s * s * l + 2.0 * s * s * s);
}

/* Bytes of Newton–Schulz's passes on one (rows x cols) matrix (n elements, s
 * = min) beyond its GEMMs (their traffic is in their FLOPs: muon_flops).
 * fp32: X from D (a copy, or the transpose of a tall matrix) 8n, the
 * normalisation 12n (the norm's read, the scale's read and write), a tall
 * matrix's transpose back 8n; per iteration B += b A 12 s^2 and Y = X 8n
 * (the third GEMM's beta term). bf16 (the batched iteration): it has no pass
 * of its own (its sums are the GEMMs' epilogues) and no transpose (a tall
 * matrix iterates as X^T). With muon_prep_bf16_multi (cuda) the momentum
 * runs inside the norm's first pass (g, m read, m written: 12n, not
 * pass_bytes' 16n with D) and D is recomputed as it is rounded into the
 * batch (g, m read, X written: 10n); the update reads its U as bf16 (2n less
 * than pass_bytes' 4n): 4n in all beyond pass_bytes. The per-matrix loop (a
 * backend without the entry, or cpu's entry, which is that loop; a TP-split
 * matrix) moves 4n more (D stored, read twice). */
static double muon_extra_bytes(const struct mt_param *p, int bf16)
{
    const double r = (double)p->shape[0], c = (double)p->shape[1], n = r * c, s = r < c ? r : c;
    if (bf16) return 4.0 * n;
    return 8.0 * n + 12.0 * n + (r > c ? 8.0 * n : 0.0) + NS_STEPS * (8.0 * n + 12.0 * s * s);
}

/* The bf16 iteration's kernels (muon_update_bf16): an error naming them when the backend lacks one */
static enum mt_status muon_bf16_kernels(struct mt_ctx *ctx, const struct mt_ops_i *ops)
{
    if (ops->gemm_bf16_batched && ops->normalize_fro_bf16 && ops->axpby_from_bf16 && ops->widen_bf16) return MT_OK;
    return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED,
                        "backend %s lacks gemm_bf16_batched/normalize_fro_bf16/axpby_from_bf16/widen_bf16 for Muon's "
                        "bf16 Newton-Schulz (knob muon_ns_bf16=0 runs it in fp32)", ops->name);
}

static enum mt_status muon_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                 const struct mt_param *p)
{
    if (p->ndim != 2)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: Muon parameter %s is not 2-D", p->name);
    if (is_split(p) && !(p->split == MT_SPLIT_ROWS ? p->len[1] == p->shape[1] : p->len[0] == p->shape[0]))
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED,
                            "optimizer: Muon parameter %s holds a box %lldx%lld of %lldx%lld that is not a TP split",
                            p->name, (long long)p->len[0], (long long)p->len[1], (long long)p->shape[0],
                            (long long)p->shape[1]);
    if (!ops->gemm || !ops->muon_momentum || !ops->transpose || !ops->copy)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks a Muon kernel (gemm/muon_momentum/transpose)",
                            ops->name);
    return mt_optim_muon_ns_bf16(ctx, cfg) ? muon_bf16_kernels(ctx, ops) : MT_OK;
}

/* M = mu M + G;  D = G + mu M into ws[WS_D], the FULL matrix (ops->muon_momentum; G read as
 * gscale G: the clip's scale rides in the momentum's read, takes_gscale) */
static enum mt_status muon_direction(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *st)
{
    const struct mt_ops_i *ops = run->ops;
    float *const *ws = run->ws;
    struct mt_param *p = st->p;
    const int R = (int)p->shape[0], C = (int)p->shape[1];
    const size_t n = (size_t)R * (size_t)C, nl = p->numel;
    if (!is_split(p)) {
        ops->muon_momentum(ops->be, ws[WS_D], st->s[0], p->grad, run->cfg->muon_momentum, n, run->gscale);
        return MT_OK;
    }
    /* TP: the momentum stays sharded (elementwise); the direction is
     * gathered over the model group so that every model rank runs
     * Newton–Schulz on the same full matrix and keeps its own slice */
    if (!run->tp_comm || mt_comm_size(run->tp_comm) * nl != n)
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "optimizer: %s is TP-split but no matching model group is set",
                            p->name);
    int tp = mt_comm_size(run->tp_comm);
    ops->muon_momentum(ops->be, ws[WS_G], st->s[0], p->grad, run->cfg->muon_momentum, nl, run->gscale);
    if (p->split == MT_SPLIT_ROWS)
        return mt_comm_allgather(ctx, run->tp_comm, ws[WS_D], ws[WS_G], nl, MT_DTYPE_F32);
    /* column blocks (R, C/tp) of rank r land at columns [r*C/tp, ...) of every row */
    const int Cl = (int)p->len[1];
    MT_CHECK(mt_comm_allgather(ctx, run->tp_comm, ws[WS_Y], ws[WS_G], nl, MT_DTYPE_F32));
    for (int r = 0; r < tp; r++)
        for (int i = 0; i < R; i++)
            ops->copy(ops->be, ws[WS_D] + (size_t)i * C + (size_t)r * Cl, ws[WS_Y] + ((size_t)r * R + i) * Cl,
                      (size_t)Cl * sizeof(float));
    return MT_OK;
}

/* the fp32 iteration's X0 = D, or D^T if R > C (so X is (s, l), s <= l), over ||X||_F + 1e-7, into x */
static void muon_start(const struct mt_ops_i *ops, float *x, const float *d, int R, int C)
{
    const size_t n = (size_t)R * (size_t)C;
    if (R > C) ops->transpose(ops->be, x, d, R, C);
    else       ops->copy(ops->be, x, d, n * sizeof(float));
    if (ops->normalize_fro) {
        ops->normalize_fro(ops->be, x, n, 1e-7);   /* the same numbers, the norm kept on the device */
    } else {
        double nrm = sqrt(ops->sumsq(ops->be, x, n));
        ops->axpby(ops->be, x, NULL, 0.0f, (float)(1.0 / (nrm + 1e-7)), n);
    }
}

/* The update's coefficients, P = b P + a U: a = -lr sqrt(max(1, R/C)), b = 1 - lr wd */
static void update_coeffs(const struct mt_optim_run *run, const struct mt_param *p, float lr, float *a, float *b)
{
    const double R = (double)p->shape[0], C = (double)p->shape[1];
    *a = (float)(-(double)lr * sqrt(R > C ? R / C : 1.0));
    *b = 1.0f - lr * (p->decay ? run->cfg->weight_decay : 0.0f);
}

/* P = P (1 - lr wd) - lr sqrt(max(1, R/C)) U with U (R, C) fp32 (TP: this rank's box of it) */
static void muon_apply(const struct mt_optim_run *run, struct mt_optim_slot *st, float *upd, float lr)
{
    const struct mt_ops_i *ops = run->ops;
    float *const *ws = run->ws;
    struct mt_param *p = st->p;
    const int R = (int)p->shape[0], C = (int)p->shape[1];
    float a, b;
    update_coeffs(run, p, lr, &a, &b);
    if (is_split(p)) {
        if (p->split == MT_SPLIT_ROWS) {
            upd += (size_t)p->off[0] * (size_t)C;
        } else {
            const int Cl = (int)p->len[1];
            for (int i = 0; i < R; i++)
                ops->copy(ops->be, ws[WS_G] + (size_t)i * Cl, upd + (size_t)i * C + (size_t)p->off[1],
                          (size_t)Cl * sizeof(float));
            upd = ws[WS_G];
        }
    }
    ops->axpby(ops->be, p->data, upd, a, b, p->numel);
}

/* muon_apply of a bf16 U (R, C): read as bf16 (axpby_from_bf16); a TP-split matrix widens it first */
static void muon_apply_bf16(const struct mt_optim_run *run, struct mt_optim_slot *st, const mt_bf16 *u, float lr)
{
    const struct mt_ops_i *ops = run->ops;
    struct mt_param *p = st->p;
    const int R = (int)p->shape[0], C = (int)p->shape[1];
    if (is_split(p)) {
        ops->widen_bf16(ops->be, run->ws[WS_X], u, (size_t)R * (size_t)C);
        muon_apply(run, st, run->ws[WS_X], lr);
        return;
    }
    float a, b;
    update_coeffs(run, p, lr, &a, &b);
    ops->axpby_from_bf16(ops->be, p->data, u, a, b, p->numel);
}

/* Each matrix j of a batch: its direction, normalised and rounded, into x + j np
 * (muon_direction then normalize_fro_bf16); muon_prep_bf16_multi where the
 * backend has it and no matrix is TP-split (split: its direction is gathered) */
static enum mt_status muon_prep_batch(struct mt_ctx *ctx, const struct mt_optim_run *run,
                                      struct mt_optim_slot *const *batch, int nb, int split, mt_bf16 *x, size_t np)
{
    const struct mt_ops_i *ops = run->ops;
    const size_t n = (size_t)batch[0]->p->shape[0] * (size_t)batch[0]->p->shape[1];
    if (!ops->muon_prep_bf16_multi || split) {
        for (int j = 0; j < nb; j++) {
            MT_CHECK(muon_direction(ctx, run, batch[j]));
            ops->normalize_fro_bf16(ops->be, x + (size_t)j * np, run->ws[WS_D], n, 1e-7);
        }
        return MT_OK;
    }
    for (int j0 = 0; j0 < nb; j0 += MT_OPS_LIST_MAX) {
        const int c = nb - j0 < MT_OPS_LIST_MAX ? nb - j0 : MT_OPS_LIST_MAX;
        mt_bf16 *xs[MT_OPS_LIST_MAX];
        float *ms[MT_OPS_LIST_MAX];
        const float *gs[MT_OPS_LIST_MAX];
        size_t ns[MT_OPS_LIST_MAX];
        for (int j = 0; j < c; j++) {
            xs[j] = x + (size_t)(j0 + j) * np;
            ms[j] = batch[j0 + j]->s[0];
            gs[j] = batch[j0 + j]->p->grad;
            ns[j] = n;
        }
        ops->muon_prep_bf16_multi(ops->be, xs, ms, gs, ns, c, run->cfg->muon_momentum, run->gscale, 1e-7,
                                  run->ws[WS_D]);
    }
    return MT_OK;
}

/* Each matrix j of a batch updated from its bf16 result x + j np (muon_apply_bf16);
 * axpby_from_bf16_multi where the backend has it and no matrix is TP-split */
static void muon_apply_batch(const struct mt_optim_run *run, struct mt_optim_slot *const *batch, int nb, int split,
                             const mt_bf16 *x, size_t np, float lr)
{
    const struct mt_ops_i *ops = run->ops;
    if (!ops->axpby_from_bf16_multi || split) {
        for (int j = 0; j < nb; j++) muon_apply_bf16(run, batch[j], x + (size_t)j * np, lr);
        return;
    }
    for (int j0 = 0; j0 < nb; j0 += MT_OPS_LIST_MAX) {
        const int c = nb - j0 < MT_OPS_LIST_MAX ? nb - j0 : MT_OPS_LIST_MAX;
        float *ys[MT_OPS_LIST_MAX], as[MT_OPS_LIST_MAX], bs[MT_OPS_LIST_MAX];
        const mt_bf16 *xs[MT_OPS_LIST_MAX];
        size_t ns[MT_OPS_LIST_MAX];
        for (int j = 0; j < c; j++) {
            struct mt_param *p = batch[j0 + j]->p;
            ys[j] = p->data;
            xs[j] = x + (size_t)(j0 + j) * np;
            ns[j] = p->numel;
            update_coeffs(run, p, lr, &as[j], &bs[j]);
        }
        ops->axpby_from_bf16_multi(ops->be, ys, xs, as, bs, ns, c);
    }
}

/*
 * Muon on one matrix P (R, C) with gradient G, momentum M, lr, wd, in fp32:
 *   M = mu M + G;  D = G + mu M                       (muon_direction)
 *   X = D, or D^T if R > C, so X is (s, l), s <= l
 *   X = X / (||X||_F + 1e-7)                          (muon_start)
 *   5 x:  A = X X^T (s,s);  B = b A + c A A;  X = a X + B X
 *   X back to (R, C);  P = P (1 - lr wd) - lr sqrt(max(1, R/C)) X   (muon_apply)
 */
static enum mt_status muon_update_fp32(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *st,
                                       float lr)
{
    const struct mt_ops_i *ops = run->ops;
    float *const *ws = run->ws;
    const int R = (int)st->p->shape[0], C = (int)st->p->shape[1];
    const int s = R > C ? C : R, l = R > C ? R : C;
    const size_t n = (size_t)R * (size_t)C;
    MT_CHECK(muon_direction(ctx, run, st));
    float *x = ws[WS_X], *y = ws[WS_Y], *a = ws[WS_A], *b = ws[WS_B];
    muon_start(ops, x, ws[WS_D], R, C);
    for (int it = 0; it < NS_STEPS; it++) {
        ops->gemm(ops->be, 0, 1, s, s, l, 1.0f, x, l, x, l, 0.0f, a, s);       /* A = X X^T       */
        ops->gemm(ops->be, 0, 0, s, s, s, NS_C, a, s, a, s, 0.0f, b, s);      /* B = c A A       */
        ops->axpby(ops->be, b, a, NS_B, 1.0f, (size_t)s * (size_t)s);         /* B += b A        */
        ops->copy(ops->be, y, x, n * sizeof(float));
        ops->gemm(ops->be, 0, 0, s, l, s, 1.0f, b, s, x, l, NS_A, y, l);      /* Y = a X + B X   */
        float *t = x; x = y; y = t;
    }
    if (R > C) { ops->transpose(ops->be, ws[WS_D], x, C, R); x = ws[WS_D]; }   /* back to (R, C) */
    muon_apply(run, st, x, lr);
    return MT_OK;
}

/*
 * The bf16 iteration on nb matrices of one shape (R, C) at once, s = min, l =
 * max. Each matrix's D, normalised, is rounded into the batch (X0, np apart:
 * normalize_fro_bf16); then per iteration three strided-batched GEMMs, bf16 in
 * and out, each sum in fp32 and rounded once as stored:
 *   A = bf16(X X^T);  B = bf16(c A A + b A);  X' = bf16(B X + a X)
 * (Muon's reference keeps X, A, B in bf16 too, rounding each product and
 * each sum); each result is applied from bf16 (axpby_from_bf16). A tall
 * matrix (R > C) iterates as X^T = D itself, (l, s): A = X^T^T X^T and
 * X'^T = X^T B^T + a X^T, so no transpose either way. Three launches an
 * iteration for the batch, where the fp32 form runs three GEMMs and two
 * passes per matrix.
 */
static enum mt_status muon_update_bf16(struct mt_ctx *ctx, const struct mt_optim_run *run,
                                       struct mt_optim_slot *const *batch, int nb, float lr)
{
    const struct mt_ops_i *ops = run->ops;
    float *const *ws = run->ws;
    const int R = (int)batch[0]->p->shape[0], C = (int)batch[0]->p->shape[1], tall = R > C;
    const int s = tall ? C : R, l = tall ? R : C;
    const size_t n = (size_t)R * (size_t)C, np = pad128(n), sp = pad128((size_t)s * (size_t)s);
    mt_bf16 *x = (mt_bf16 *)ws[WS_X0], *y = (mt_bf16 *)ws[WS_X1];
    mt_bf16 *a = (mt_bf16 *)ws[WS_SA], *b = (mt_bf16 *)ws[WS_SB];
    int split = 0;   /* a TP-split matrix: the per-matrix path, both ends */
    for (int j = 0; j < nb; j++) split |= is_split(batch[j]->p);
    MT_CHECK(muon_prep_batch(ctx, run, batch, nb, split, x, np));
    for (int it = 0; it < NS_STEPS; it++) {
        if (tall) ops->gemm_bf16_batched(ops->be, 1, 0, s, s, l, 1.0f, x, s, np, x, s, np, 0.0f, NULL, a, s, sp, nb);
        else      ops->gemm_bf16_batched(ops->be, 0, 1, s, s, l, 1.0f, x, l, np, x, l, np, 0.0f, NULL, a, s, sp, nb);
        ops->gemm_bf16_batched(ops->be, 0, 0, s, s, s, NS_C, a, s, sp, a, s, sp, NS_B, a, b, s, sp, nb);
        if (tall) ops->gemm_bf16_batched(ops->be, 0, 1, l, s, s, 1.0f, x, s, np, b, s, sp, NS_A, x, y, s, np, nb);
        else      ops->gemm_bf16_batched(ops->be, 0, 0, s, l, s, 1.0f, b, s, sp, x, l, np, NS_A, x, y, l, np, nb);
        mt_bf16 *t = x; x = y; y = t;
    }
    muon_apply_batch(run, batch, nb, split, x, np, lr);
    return MT_OK;
}

/* The list's matrices by shape (R, C), in order of first appearance (the
 * whole list: Muon is a whole_list class, so a shape's batch spans the
 * model); each shape's c matrices in ceil(c / cap) batches of nearly equal
 * size (the bf16 iteration; cap: batch_cap), or one by one (fp32). Each
 * matrix's update depends on its own numbers only: the batch it lands in
 * changes no bit on cpu (a loop of GEMMs). Every rank groups the same list
 * the same way, so a TP group's gathers pair up. */
static enum mt_status muon_step(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *const *slots,
                                int n)
{
    const float lr = (float)(run->cfg->muon_lr * run->lr_factor);
    if (!mt_optim_muon_ns_bf16(ctx, run->cfg)) {
        for (int i = 0; i < n; i++) MT_CHECK(muon_update_fp32(ctx, run, slots[i], lr));
        return MT_OK;
    }
    if (!run->scratch) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: Muon stepped without its scratch");
    /* a stable grouping by shape in the scratch: g[i, e) is the shape of g[i] */
    struct mt_optim_slot **g = run->scratch;
    memcpy(g, slots, (size_t)n * sizeof *g);
    for (int i = 0; i < n;) {
        int e = i + 1;
        for (int j = i + 1; j < n; j++) {
            if (!same_shape(g[j]->p, g[i]->p)) continue;
            struct mt_optim_slot *t = g[j];
            memmove(&g[e + 1], &g[e], (size_t)(j - e) * sizeof *g);
            g[e++] = t;
        }
        const int c = e - i, cap = batch_cap((size_t)g[i]->p->shape[0] * (size_t)g[i]->p->shape[1], c);
        const int batches = (c + cap - 1) / cap;
        for (int k = 0, j = i; k < batches; k++) {
            const int nb = (c - (j - i) + (batches - k) - 1) / (batches - k);   /* the rest over the batches left */
            MT_CHECK(muon_update_bf16(ctx, run, &g[j], nb, lr));
            j += nb;
        }
        i = e;
    }
    return MT_OK;
}

const struct mt_optim_i mt_optim_muon = {
    .name = "muon",
    .n_states = 1,
    .state_names = {"momentum_buffer"},
    .roles = 1u << MT_ROLE_DENSE | 1u << MT_ROLE_EXPERT,
    .matrices_only = 1,
    .whole_matrix = 1,
    .pass_bytes = 28.0,   /* momentum: reads g, m, writes m, d (16); update: reads p, U, writes p (12) */
    .shadow_bytes = 6.0,  /* the refresh re-reads p (4) and writes the shadow (2) */
    .whole_list = 1,      /* batches of a shape across the model */
    .takes_gscale = 1,    /* the clip's scale rides in muon_momentum's read of g */
    .flops = muon_flops,
    .extra_bytes = muon_extra_bytes,
    .ws_sizes = muon_ws_sizes,
    .check = muon_check,
    .init = NULL,
    .step = muon_step,
};
