/*
 * muon.c — Muon (Keller Jordan's, nanochat's split): momentum, then the
 * Nesterov direction orthogonalised by a quintic Newton–Schulz iteration
 * on the FULL matrix (GEMM-bound: ops->gemm in fp32, ops->gemm_bf16 on bf16
 * operand copies in precision=bf16). It accepts the block
 * matrices (roles DENSE and EXPERT, 2-D); the router, the Mamba-3 biases,
 * gains, embeddings and the head fall back to AdamW (mt_optim_kind_for).
 * State: momentum_buffer. Workspace (bucket WORKSPACE, sized for the
 * largest Muon matrix, holds nothing between calls): d, x, y, a, b, g
 * for TP-split matrices only, and the bf16 copies of x and of a / b.
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

/* workspace buffers, s = min(rows, cols), l = max(rows, cols) */
enum {
    WS_D, /* (rows*cols) Nesterov direction d                        */
    WS_X, /* (s*l) iterate X                                         */
    WS_Y, /* (s*l) next iterate                                      */
    WS_A, /* (s*s) A = X X^T                                         */
    WS_B, /* (s*s) B = b A + c A A                                   */
    WS_G, /* (rows*cols) TP: gathered slices (split Muon params only) */
    WS_XB, /* (s*l bf16) X's bf16 operand copy (Newton–Schulz on bf16 operands) */
    WS_SB, /* (s*s bf16) A's, then B's bf16 operand copy                        */
};

static int is_split(const struct mt_param *p) { return p->len[0] != p->shape[0] || p->len[1] != p->shape[1]; }

/* Workspace extents over every Muon matrix (kind `kind`): largest numel
 * and largest s*s of the FULL matrices (Newton–Schulz runs on the whole
 * matrix), g only when one is TP-split, the bf16 operand copies in
 * precision=bf16 only. */
static void muon_ws_sizes(const struct mt_config *cfg, const struct mt_param *params, int n, int kind,
                          size_t floats[MT_OPTIM_MAX_WS])
{
    size_t max_numel = 0, max_ss = 0;
    int split = 0;
    for (int i = 0; i < n; i++) {
        const struct mt_param *p = &params[i];
        if ((int)p->optim != kind) continue;
        size_t r = (size_t)p->shape[0], c = (size_t)p->shape[1];
        size_t s = r < c ? r : c;
        if (r * c > max_numel) max_numel = r * c;
        if (s * s > max_ss) max_ss = s * s;
        split |= is_split(p);
    }
    if (max_numel == 0) return;
    floats[WS_D] = floats[WS_X] = floats[WS_Y] = max_numel;
    floats[WS_A] = floats[WS_B] = max_ss;
    floats[WS_G] = split ? max_numel : 0;
    /* the bf16 operand copies (precision=bf16; used with knob muon_ns_bf16): 2 bytes an element */
    if (!strcmp(cfg->precision, "bf16")) {
        floats[WS_XB] = (max_numel + 1) / 2;
        floats[WS_SB] = (max_ss + 1) / 2;
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
 * = min): X from D (a copy, or the transpose of a tall matrix) 8n, the
 * normalisation 12n (the norm's read, the scale's read and write), a tall
 * matrix's transpose back 8n; per iteration in fp32 B += b A 12 s^2 and Y =
 * X 8n (the third GEMM's beta term); with bf16 operands the copies of X and
 * A (read 4, write 2: 6n + 6 s^2) and B += b A written as B's copy (read 8,
 * write 2: 10 s^2; X takes a X + B X in place). The GEMMs' own traffic is in
 * their FLOPs (muon_flops). */
static double muon_extra_bytes(const struct mt_param *p, int gemm_bf16)
{
    const double r = (double)p->shape[0], c = (double)p->shape[1], n = r * c, s = r < c ? r : c;
    const double per_iter = gemm_bf16 ? 6.0 * n + 16.0 * s * s : 8.0 * n + 12.0 * s * s;
    return 8.0 * n + 12.0 * n + (r > c ? 8.0 * n : 0.0) + NS_STEPS * per_iter;
}

static enum mt_status muon_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_param *p)
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
    return MT_OK;
}

/* Newton–Schulz's GEMMs in precision=bf16 (knob muon_ns_bf16, default on):
 * bf16 operands, fp32 accumulation and fp32 storage, as Muon's reference
 * implementation runs the iteration in bf16 (cuda: tensor cores instead of
 * fp32 CUDA cores, about ten times the rate); fp32 otherwise, as SPEC states
 * it. The operands are rounded once into bf16 copies (cast_bf16: X once an
 * iteration for its two GEMMs, A and B before theirs) and the GEMMs read
 * those as stored, so no GEMM converts an operand per call; the sums (B +=
 * b A, a X + B X) stay in fp32. docs/model.md "Muon". */
int mt_optim_muon_ns_bf16(const struct mt_ctx *ctx, const struct mt_config *cfg)
{
    return !strcmp(cfg->precision, "bf16") && mt_knob_int(ctx, MT_KNOB_MUON_NS_BF16) != 0;
}

static int ns_bf16(struct mt_ctx *ctx, const struct mt_optim_run *run)
{
    const struct mt_ops_i *ops = run->ops;
    return mt_optim_muon_ns_bf16(ctx, run->cfg) && ops->gemm_bf16 && ops->cast_bf16 && ops->axpby_bf16;
}

/* C = alpha op(A) op(B) + beta C: fp32, or on the bf16 copies Ab, Bb of A and B */
static void ns_gemm(const struct mt_ops_i *ops, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                    const mt_bf16 *Ab, int lda, const float *B, const mt_bf16 *Bb, int ldb, float beta, float *C,
                    int ldc)
{
    if (Ab)
        ops->gemm_bf16(ops->be, ta, tb, M, N, K, alpha, Ab, MT_ELEM_BF16, lda, Bb, MT_ELEM_BF16, ldb, beta, C, ldc);
    else
        ops->gemm(ops->be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/*
 * Muon on one matrix P (R, C) with gradient G, momentum M, lr, wd:
 *   M = mu M + G;  D = G + mu M                       (ops->muon_momentum)
 *   X = D, or D^T if R > C, so X is (s, l), s <= l
 *   X = X / (||X||_F + 1e-7)
 *   5 x:  A = X X^T (s,s);  B = b A + c A A;  X = a X + B X
 *   X back to (R, C);  P = P (1 - lr wd) - lr sqrt(max(1, R/C)) X
 */
static enum mt_status muon_update(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *st, float lr,
                                  float wd)
{
    const struct mt_ops_i *ops = run->ops;
    float *const *ws = run->ws;   /* d, x, y, a, b, g (ws_sizes) */
    struct mt_param *p = st->p;
    const int R = (int)p->shape[0], C = (int)p->shape[1];   /* the FULL matrix */
    const size_t n = (size_t)R * (size_t)C, nl = p->numel;
    const int split = is_split(p);
    const int tr = R > C;
    const int s = tr ? C : R, l = tr ? R : C;

    if (!split) {
        ops->muon_momentum(ops->be, ws[WS_D], st->s[0], p->grad, run->cfg->muon_momentum, n);
    } else {
        /* TP: the momentum stays sharded (elementwise); the direction is
         * gathered over the model group so that every model rank runs
         * Newton–Schulz on the same full matrix and keeps its own slice */
        if (!run->tp_comm || mt_comm_size(run->tp_comm) * nl != n)
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "optimizer: %s is TP-split but no matching model group is set",
                                p->name);
        int tp = mt_comm_size(run->tp_comm);
        ops->muon_momentum(ops->be, ws[WS_G], st->s[0], p->grad, run->cfg->muon_momentum, nl);
        if (p->split == MT_SPLIT_ROWS) {
            MT_CHECK(mt_comm_allgather(ctx, run->tp_comm, ws[WS_D], ws[WS_G], nl, MT_DTYPE_F32));
        } else {
            /* column blocks (R, C/tp) of rank r land at columns [r*C/tp, ...) of every row */
            const int Cl = (int)p->len[1];
            MT_CHECK(mt_comm_allgather(ctx, run->tp_comm, ws[WS_Y], ws[WS_G], nl, MT_DTYPE_F32));
            for (int r = 0; r < tp; r++)
                for (int i = 0; i < R; i++)
                    ops->copy(ops->be, ws[WS_D] + (size_t)i * C + (size_t)r * Cl, ws[WS_Y] + ((size_t)r * R + i) * Cl,
                              (size_t)Cl * sizeof(float));
        }
    }
    float *x = ws[WS_X], *y = ws[WS_Y], *a = ws[WS_A], *b = ws[WS_B];
    if (tr) ops->transpose(ops->be, x, ws[WS_D], R, C);
    else    ops->copy(ops->be, x, ws[WS_D], n * sizeof(float));
    if (ops->normalize_fro) {
        ops->normalize_fro(ops->be, x, n, 1e-7);   /* the same numbers, the norm kept on the device */
    } else {
        double nrm = sqrt(ops->sumsq(ops->be, x, n));
        ops->axpby(ops->be, x, NULL, 0.0f, (float)(1.0 / (nrm + 1e-7)), n);
    }
    /* bf16 operands: the copies (NULL: fp32 GEMMs) */
    mt_bf16 *xb = ns_bf16(ctx, run) && ws[WS_XB] ? (mt_bf16 *)ws[WS_XB] : NULL, *sb = xb ? (mt_bf16 *)ws[WS_SB] : NULL;
    const size_t ss = (size_t)s * (size_t)s;
    for (int it = 0; it < NS_STEPS; it++) {
        if (xb) ops->cast_bf16(ops->be, xb, x, n);
        ns_gemm(ops, 0, 1, s, s, l, 1.0f, x, xb, l, x, xb, l, 0.0f, a, s);      /* A = X X^T       */
        if (sb) ops->cast_bf16(ops->be, sb, a, ss);
        ns_gemm(ops, 0, 0, s, s, s, NS_C, a, sb, s, a, sb, s, 0.0f, b, s);     /* B = c A A       */
        if (sb) {
            /* B += b A straight into B's bf16 copy (B's fp32 is not read again); the GEMM reads
             * X's bf16 copy, so X itself takes the result in place: X = a X + B X */
            ops->axpby_bf16(ops->be, sb, b, a, NS_B, 1.0f, ss);
            ns_gemm(ops, 0, 0, s, l, s, 1.0f, b, sb, s, x, xb, l, NS_A, x, l);
            continue;
        }
        ops->axpby(ops->be, b, a, NS_B, 1.0f, ss);                             /* B += b A        */
        ops->copy(ops->be, y, x, n * sizeof(float));
        ns_gemm(ops, 0, 0, s, l, s, 1.0f, b, NULL, s, x, NULL, l, NS_A, y, l); /* Y = a X + B X   */
        float *t = x; x = y; y = t;
    }
    float *upd = x;
    if (tr) { ops->transpose(ops->be, ws[WS_D], x, C, R); upd = ws[WS_D]; }
    double scale = sqrt(R > C ? (double)R / (double)C : 1.0);
    if (split) {
        /* this rank's box of the full update */
        if (p->split == MT_SPLIT_ROWS) {
            upd += (size_t)p->off[0] * (size_t)C;
        } else {
            const int Cl = (int)p->len[1];
            for (int i = 0; i < R; i++)
                ops->copy(ops->be, ws[WS_G] + (size_t)i * Cl, upd + (size_t)i * C + (size_t)p->off[1], (size_t)Cl * sizeof(float));
            upd = ws[WS_G];
        }
    }
    ops->axpby(ops->be, p->data, upd, (float)(-(double)lr * scale), 1.0f - lr * wd, nl);
    return MT_OK;
}

static enum mt_status muon_step(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *const *slots,
                                int n)
{
    const float lr = (float)(run->cfg->muon_lr * run->lr_factor);
    for (int i = 0; i < n; i++)
        MT_CHECK(muon_update(ctx, run, slots[i], lr, slots[i]->p->decay ? run->cfg->weight_decay : 0.0f));
    return MT_OK;
}

const struct mt_optim_i mt_optim_muon = {
    .name = "muon",
    .n_states = 1,
    .state_names = {"momentum_buffer"},
    .roles = 1u << MT_ROLE_DENSE | 1u << MT_ROLE_EXPERT,
    .matrices_only = 1,
    .whole_matrix = 1,
    .pass_bytes = 20.0,   /* the momentum and the update's elementwise passes */
    .shadow_bytes = 6.0,  /* the refresh re-reads p (4) and writes the shadow (2) */
    .flops = muon_flops,
    .extra_bytes = muon_extra_bytes,
    .ws_sizes = muon_ws_sizes,
    .check = muon_check,
    .init = NULL,
    .step = muon_step,
};
