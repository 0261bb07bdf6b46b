/*
 * moe_experts.c — the expert SwiGLU MLPs of an MoE block over their row
 * ranges, one grouped GEMM per projection (issue 19 item 3), LoRA included.
 *
 * The sorted buffer holds each group's rows back to back (a group = an
 * expert when ep == 1; a (source rank, local expert) pair when ep > 1), so
 * every projection of every group is one entry of ops->gemm_grouped:
 *
 *   forward   g_e = x_e Wg_e^T, u_e = x_e Wu_e^T   (two grouped calls)
 *             act_e = silu(g_e) * u_e              (per group: see below)
 *             y_e = act_e Wd_e^T                   (one grouped call)
 *   backward  act_e again; dWd_e += dy_e^T act_e, dact_e = dy_e Wd_e;
 *             dg_e, du_e = swiglu'(dact_e);
 *             dWg_e += dg_e^T x_e, dx_e = dg_e Wg_e; dWu_e += du_e^T x_e,
 *             dx_e += du_e Wu_e                    (six grouped calls)
 *
 * Under LoRA (docs/lora.md) the expert weights are frozen: their weight
 * gradient calls leave the frozen groups out (dx only, as proj_bwd does), and
 * where 'expert' is a target each projection's adapter follows its base call
 * exactly as proj_fwd / proj_bwd (lora.c) order it, one grouped call per
 * term, s = alpha/r:
 *   forward   t_e = x_e A_e^T;  y_e += s t_e B_e^T
 *   backward  t_e = x_e A_e^T;  dB_e += s dy_e^T t_e;  dt_e = s dy_e B_e;
 *             dA_e += dt_e^T x_e;  dx_e += dt_e A_e
 * with t, dt at each group's own rows of the (ep*M, r) LoRA scratch.
 *
 * These are exactly the gemm calls of mlp_forward / mlp_backward per expert
 * (same arguments, each group's scratch at its own rows instead of all at
 * row 0), reordered projection-major: every output element (a group's rows
 * of y, dx, dact, or one expert's dW, dA, dB over its groups in group order)
 * receives the same terms in the same order, so on the cpu table — whose
 * grouped entry IS those gemm calls — the numbers are bit-identical to the
 * per-expert loop. swiglu stays one call per group: the cpu kernel's SIMD
 * body and scalar tail round differently, so one call over all rows would
 * move the tails. Groups are taken 64 at a time (host arrays on the stack);
 * MoE layers have fewer experts than that in practice.
 *
 * precision=bf16: every projection runs as one gemm_bf16 per group on the
 * weights' bf16 shadows, and the activation operands are rounded ONCE per
 * chunk of groups into the piece's bf16 scratch (moe.c carves xb, ab, db):
 * x for gate, up and their weight gradients, the SwiGLU output for down
 * (swiglu_forward_bf16 writes both), dy, then dg, then du for the backward.
 * Without adapters on gate/up dg and du are read by those GEMMs alone, so
 * swiglu_backward_bf16 writes them as bf16 directly (the bits of
 * swiglu_backward then the rounding; no fp32 dg, du): dg into db where dy's
 * copy was, du into ab where the SwiGLU output's was (dWd has read both).
 * When, besides, nothing reads the fp32 act (no ReDo, no adapter on down),
 * the backward's recompute of act and that SwiGLU backward are one pass
 * per group (swiglu_backward_act_bf16: g, u read once): dact = dy Wd runs
 * first, then that kernel (act's twin into ab, dg, du into the fp32 scratch
 * s_dg, s_du as bf16: db still holds dy for dWd), then dWd += dy^T act.
 * Each output's GEMMs are the same calls in the same order per output.
 * A gemm_bf16 call with fp32 operands rounds them itself (into a padded
 * scratch, per call: the H100 run of 2026-11-27 counted 4e9 such elements
 * per moe8 step); the rounding is the same round-to-nearest-even, so the
 * numbers do not change (on the cpu table: bit for bit). The LoRA adapter
 * terms stay fp32, as in proj_fwd_b.
 */
#include "model_impl.h"
#include "moe_experts.h"

#define GROUP_CHUNK 64

struct group_set {
    int n;
    int rows[GROUP_CHUNK];
    size_t r0[GROUP_CHUNK];             /* first row in the sorted buffer */
    struct mt_param *w[GROUP_CHUNK];    /* the group's expert: [0] gate, [1] up, [2] down */
};

/* the next chunk of non-empty groups from g (returns the g to resume at) */
static int next_chunk(struct mt_param *experts, int n_groups, const int *cnt, int offsets, int ee, int g,
                      size_t *row, struct group_set *s)
{
    s->n = 0;
    for (; g < n_groups && s->n < GROUP_CHUNK; g++) {
        int c = offsets ? cnt[g + 1] - cnt[g] : cnt[g];
        if (c > 0) {
            s->rows[s->n] = c;
            s->r0[s->n] = *row;
            s->w[s->n] = &experts[3 * (g % ee)];
            s->n++;
        }
        *row += (size_t)(c > 0 ? c : 0);
    }
    return g;
}

/* one projection over n groups: C_i = alpha op(A_i) op(B_i) + beta C_i.
 * W: each group's expert weight of the projection (NULL: an adapter's
 * call). When it has a bf16 shadow (precision=bf16) the groups run as
 * wlinear's gemm_bf16 calls, one per group (C fp32), with B the weight's
 * fresh shadow where w_is_b, and Ab / Bb (when not NULL) the operands'
 * bf16 copies (else the fp32 ones, rounded in the call); else as one
 * grouped fp32 call. */
static void grouped_t(const struct mt_ops_i *ops, int ta, int tb, int n, const int *M, const int *N, const int *K,
                      float alpha, const float *const *A, const mt_bf16 *const *Ab, int lda, const float *const *B,
                      const mt_bf16 *const *Bb, int ldb, float beta, float *const *C, int ldc,
                      const struct mt_param *const *W, int w_is_b)
{
    if (n <= 0) return;
    if (W && W[0]->bf16) {
        for (int i = 0; i < n; i++) {
            const int sh = w_is_b && W[i]->bf16_ok;
            const void *a = Ab ? (const void *)Ab[i] : (const void *)A[i];
            const void *b = sh ? (const void *)W[i]->bf16 : Bb ? (const void *)Bb[i] : (const void *)B[i];
            ops->gemm_bf16(ops->be, ta, tb, M[i], N[i], K[i], alpha, a, Ab ? MT_ELEM_BF16 : MT_ELEM_F32, lda, b,
                           sh || Bb ? MT_ELEM_BF16 : MT_ELEM_F32, ldb, beta, C[i], ldc);
        }
        return;
    }
    if (ops->gemm_grouped) {
        ops->gemm_grouped(ops->be, ta, tb, n, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    for (int i = 0; i < n; i++) ops->gemm(ops->be, ta, tb, M[i], N[i], K[i], alpha, A[i], lda, B[i], ldb, beta, C[i], ldc);
}

/* grouped_t with fp32 operands only */
static void grouped(const struct mt_ops_i *ops, int ta, int tb, int n, const int *M, const int *N, const int *K,
                    float alpha, const float *const *A, int lda, const float *const *B, int ldb, float beta,
                    float *const *C, int ldc, const struct mt_param *const *W, int w_is_b)
{
    grouped_t(ops, ta, tb, n, M, N, K, alpha, A, NULL, lda, B, NULL, ldb, beta, C, ldc, W, w_is_b);
}

/* As grouped(), for outputs several groups may share: an expert's weight or
 * adapter gradient when ep > 1 (one group per source rank sends rows to the
 * same local expert). gemm_grouped wants distinct C[g] (a GPU runs the
 * groups concurrently), so the groups go in runs without a repeated C, in
 * group order: each C still sums its terms in that order (the loop's bits).
 * G: NULL, or the parameters whose gradients the C are: then group g's beta
 * is grad_beta(G[g], C[g]) (0 at the step's first write of a grad_gemm
 * gradient, model_impl.h), and a run also ends where it changes. */
static void grouped_acc(const struct mt_ops_i *ops, int ta, int tb, int n, const int *M, const int *N, const int *K,
                        float alpha, const float *const *A, const mt_bf16 *const *Ab, int lda, const float *const *B,
                        const mt_bf16 *const *Bb, int ldb, float beta, float *const *C, int ldc,
                        const struct mt_param *const *W, struct mt_param *const *G)
{
    float bg[GROUP_CHUNK];
    MT_ASSERT(n <= GROUP_CHUNK);
    for (int i = 0; i < n; i++) bg[i] = G ? grad_beta(G[i], C[i]) : beta;   /* in group order */
    int i0 = 0;
    for (int i = i0 + 1; i <= n; i++) {
        int repeat = 0;
        for (int j = i0; j < i && i < n; j++) repeat |= C[j] == C[i];
        if (i < n && !repeat && bg[i] == bg[i0]) continue;
        grouped_t(ops, ta, tb, i - i0, M + i0, N + i0, K + i0, alpha, A + i0, Ab ? Ab + i0 : NULL, lda, B + i0,
                  Bb ? Bb + i0 : NULL, ldb, bg[i0], C + i0, ldc, W ? W + i0 : NULL, 0);
        i0 = i;
    }
}

/* The chunk's groups (pick: their indices into s) whose projection p has
 * adapters (adapters 1) or whose weight p takes a gradient, i.e. is not
 * frozen (adapters 0). Returns the count. */
static int select_groups(const struct group_set *s, int p, int adapters, int *pick)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        if (adapters ? s->w[i][p].lora_a != NULL : !s->w[i][p].frozen) pick[n++] = i;
    return n;
}

/* Per-call arrays of a chunk: sizes and pointers of each entry. */
struct gcall {
    int M[GROUP_CHUNK], N[GROUP_CHUNK], K[GROUP_CHUNK];
    const float *a[GROUP_CHUNK], *b[GROUP_CHUNK];
    float *c[GROUP_CHUNK];
};

/* y_i += s (x_i A^T) B^T for the adapted groups of projection p; x (rows, in), y (rows, out) */
static void adapter_fwd(const struct mt_piece_ctx *pc, const struct group_set *s, int p, const float *x, int in,
                        float *y, int out)
{
    int pick[GROUP_CHUNK];
    const int n = select_groups(s, p, 1, pick);
    if (n == 0) return;
    const int r = (int)s->w[pick[0]][p].lora_a->len[0];
    const float sc = s->w[pick[0]][p].lora_scale;
    float *t = pc->s_lora;
    struct gcall g;
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        MT_ASSERT((int)s->w[i][p].lora_a->len[0] == r && s->w[i][p].lora_scale == sc);
        g.M[j] = s->rows[i];
        g.N[j] = r;
        g.K[j] = in;
        g.a[j] = x + s->r0[i] * in;
        g.b[j] = s->w[i][p].lora_a->data;
        g.c[j] = t + s->r0[i] * r;
    }
    grouped(pc->ops, 0, 1, n, g.M, g.N, g.K, 1.0f, g.a, in, g.b, in, 0.0f, g.c, r, NULL, 0);     /* t = x A^T */
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.N[j] = out;
        g.K[j] = r;
        g.a[j] = t + s->r0[i] * r;
        g.b[j] = s->w[i][p].lora_b->data;
        g.c[j] = y + s->r0[i] * out;
    }
    grouped(pc->ops, 0, 1, n, g.M, g.N, g.K, sc, g.a, r, g.b, r, 1.0f, g.c, out, NULL, 0);    /* y += s t B^T */
}

/* The adapter terms of proj_bwd for the adapted groups of projection p:
 * x (rows, in) the input, dy (rows, out) d output, dx (rows, in) +=. */
static void adapter_bwd(const struct mt_piece_ctx *pc, const struct group_set *s, int p, const float *x, int in,
                        const float *dy, int out, float *dx)
{
    int pick[GROUP_CHUNK];
    const int n = select_groups(s, p, 1, pick);
    if (n == 0) return;
    const int r = (int)s->w[pick[0]][p].lora_a->len[0];
    const float sc = s->w[pick[0]][p].lora_scale;
    float *t = pc->s_lora, *dt = pc->s_dlora;
    const struct mt_ops_i *ops = pc->ops;
    struct gcall g;
    int rows[GROUP_CHUNK], R[GROUP_CHUNK], IN[GROUP_CHUNK], OUT[GROUP_CHUNK];
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        MT_ASSERT((int)s->w[i][p].lora_a->len[0] == r && s->w[i][p].lora_scale == sc);
        rows[j] = s->rows[i];
        R[j] = r;
        IN[j] = in;
        OUT[j] = out;
    }
    /* t = x A^T */
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.a[j] = x + s->r0[i] * in;
        g.b[j] = s->w[i][p].lora_a->data;
        g.c[j] = t + s->r0[i] * r;
    }
    grouped(ops, 0, 1, n, rows, R, IN, 1.0f, g.a, in, g.b, in, 0.0f, g.c, r, NULL, 0);
    /* term 1: dB (out, r) += s dy^T t */
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.a[j] = dy + s->r0[i] * out;
        g.b[j] = t + s->r0[i] * r;
        g.c[j] = s->w[i][p].lora_b->grad;
    }
    grouped_acc(ops, 1, 0, n, OUT, R, rows, sc, g.a, NULL, out, g.b, NULL, r, 1.0f, g.c, r, NULL, NULL);
    /* term 2: dt = s dy B;  dA (r, in) += dt^T x */
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.b[j] = s->w[i][p].lora_b->data;
        g.c[j] = dt + s->r0[i] * r;
    }
    grouped(ops, 0, 0, n, rows, R, OUT, sc, g.a, out, g.b, r, 0.0f, g.c, r, NULL, 0);
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.a[j] = dt + s->r0[i] * r;
        g.b[j] = x + s->r0[i] * in;
        g.c[j] = s->w[i][p].lora_a->grad;
    }
    grouped_acc(ops, 1, 0, n, R, IN, rows, 1.0f, g.a, NULL, r, g.b, NULL, in, 1.0f, g.c, in, NULL, NULL);
    /* term 3: dx += dt A */
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        g.b[j] = s->w[i][p].lora_a->data;
        g.c[j] = dx + s->r0[i] * in;
    }
    grouped(ops, 0, 0, n, rows, IN, R, 1.0f, g.a, r, g.b, in, 1.0f, g.c, in, NULL, 0);
}

/* dW_p (out, in) += d^T x for the groups whose weight p is not frozen
 * (LoRA: none of them), = at the step's first write (grad_beta); d (rows,
 * out), x (rows, in); db, xb: their bf16 copies at the same rows
 * (precision=bf16) or NULL. */
static void weight_grad(const struct mt_piece_ctx *pc, const struct group_set *s, int p, const float *d,
                        const mt_bf16 *db, int out, const float *x, const mt_bf16 *xb, int in)
{
    int pick[GROUP_CHUNK];
    const int n = select_groups(s, p, 0, pick);
    struct gcall g;
    const mt_bf16 *ab[GROUP_CHUNK], *bb[GROUP_CHUNK];
    const struct mt_param *W[GROUP_CHUNK];
    struct mt_param *G[GROUP_CHUNK];
    for (int j = 0; j < n; j++) {
        const int i = pick[j];
        W[j] = G[j] = &s->w[i][p];
        g.M[j] = out;
        g.N[j] = in;
        g.K[j] = s->rows[i];
        g.a[j] = d ? d + s->r0[i] * out : NULL;   /* d NULL: db alone (bf16 dg, du) */
        g.b[j] = x + s->r0[i] * in;
        g.c[j] = s->w[i][p].grad;
        ab[j] = db ? db + s->r0[i] * out : NULL;
        bb[j] = xb ? xb + s->r0[i] * in : NULL;
    }
    grouped_acc(pc->ops, 1, 0, n, g.M, g.N, g.K, 1.0f, g.a, db ? ab : NULL, out, g.b, xb ? bb : NULL, in, 1.0f, g.c, in,
                W, G);
}

/* precision=bf16: the bf16 scratch when this chunk's experts have shadows
 * (moe.c carves it only in that mode), else NULL: the fp32 path */
static const struct mt_moe_scratch *bf16_scratch(const struct mt_piece_ctx *pc, const struct group_set *s)
{
    const struct mt_moe_scratch *ms = moe_scr(pc);
    return ms->xb && s->w[0][0].bf16 && s->w[0][1].bf16 && s->w[0][2].bf16 ? ms : NULL;
}

/* some group of the chunk has an adapter on gate or up (adapter_bwd reads their fp32 d) */
static int gate_up_adapted(const struct group_set *s)
{
    int pick[GROUP_CHUNK];
    return select_groups(s, 0, 1, pick) + select_groups(s, 1, 1, pick) > 0;
}

/* dst[r0*w ..) = bf16(src) over the chunk's rows (its groups are back to back) */
static mt_bf16 *round_rows(const struct mt_ops_i *ops, mt_bf16 *dst, const float *src, const struct group_set *s,
                           int w)
{
    const size_t r0 = s->r0[0], r1 = s->r0[s->n - 1] + (size_t)s->rows[s->n - 1];
    ops->cast_bf16(ops->be, dst + r0 * (size_t)w, src + r0 * (size_t)w, (r1 - r0) * (size_t)w);
    return dst;
}

/* each group's rows of a bf16 buffer of width w (NULL when buf is) */
static const mt_bf16 *const *rows_of(const mt_bf16 **out, const mt_bf16 *buf, const struct group_set *s, int w)
{
    if (!buf) return NULL;
    for (int i = 0; i < s->n; i++) out[i] = buf + s->r0[i] * (size_t)w;
    return out;
}

/* the fp32 act is read only by down's adapters and ReDo once the twin exists (the
 * GEMMs take ab): without them the twin alone, as the dense MLP's act_stored */
static int act_fp32_read(const struct mt_piece_ctx *pc, const struct group_set *s)
{
    int pick[GROUP_CHUNK];
    return pc->redo || select_groups(s, 2, 1, pick) > 0;
}

/* the SwiGLU output of every group of the chunk (and its bf16 twin in ab when given;
 * swiglu_forward_bf16 with out NULL when only that is read: the same bits) */
static void swiglu_groups(const struct mt_piece_ctx *pc, const struct group_set *s, mt_bf16 *ab, const float *eg,
                          const float *eu, int Fe)
{
    const struct mt_ops_i *ops = pc->ops;
    float *act = ab && !act_fp32_read(pc, s) ? NULL : pc->s_act;
    for (int i = 0; i < s->n; i++) {
        const size_t o = s->r0[i] * (size_t)Fe, n = (size_t)s->rows[i] * Fe;
        if (ab) ops->swiglu_forward_bf16(ops->be, act ? act + o : NULL, ab + o, eg + o, eu + o, n);
        else ops->swiglu_forward(ops->be, pc->s_act + o, eg + o, eu + o, n);
    }
}

void moe_experts_forward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee, float *eg,
                         float *eu, float *y, const float *x)
{
    const struct mt_ops_i *ops = pc->ops;
    const int D = pc->D, Fe = moe_dims(pc)->Fe, gu = moe_dims(pc)->gu_bf16;
    struct group_set s;
    size_t row = 0;
    int ND[GROUP_CHUNK], NF[GROUP_CHUNK];   /* every group's D and Fe; its rows are s.rows */
    const float *a[GROUP_CHUNK], *b[GROUP_CHUNK];
    const mt_bf16 *ab[GROUP_CHUNK];
    float *c[GROUP_CHUNK];
    const struct mt_param *W[3][GROUP_CHUNK];   /* each group's gate, up, down weight */
    for (int i = 0; i < GROUP_CHUNK; i++) { ND[i] = D; NF[i] = Fe; }
    const int *Mr = s.rows;
    for (int g = 0; g < n_groups;) {
        g = next_chunk(moe_w(pc)->experts, n_groups, cnt, offsets, ee, g, &row, &s);
        if (s.n == 0) continue;
        const struct mt_moe_scratch *bs = bf16_scratch(pc, &s);
        for (int i = 0; i < s.n; i++)
            for (int p = 0; p < 3; p++) W[p][i] = &s.w[i][p];
        const mt_bf16 *xr = bs ? round_rows(ops, bs->xb, x, &s, D) : NULL;
        if (gu) {   /* gate, up as bf16 (no adapters here), then act's twin from them */
            MT_ASSERT(xr);
            for (int i = 0; i < s.n; i++) {   /* mlp_forward_gu's calls, a group at a time */
                const size_t o = s.r0[i] * (size_t)Fe;
                mt_bf16 *gb = (mt_bf16 *)eg + o, *ub = (mt_bf16 *)eu + o;
                wlinear_forward_bf16_out(ops, gb, NULL, xr + s.r0[i] * D, &s.w[i][0], s.rows[i], D, Fe);
                wlinear_forward_bf16_out(ops, ub, NULL, xr + s.r0[i] * D, &s.w[i][1], s.rows[i], D, Fe);
                ops->swiglu_forward_bf16_gu(ops->be, bs->ab + o, gb, ub, (size_t)s.rows[i] * Fe);
            }
        } else {
            const mt_bf16 *const *xb = rows_of(ab, xr, &s, D);
            for (int i = 0; i < s.n; i++) a[i] = x + s.r0[i] * D;
            for (int i = 0; i < s.n; i++) { b[i] = s.w[i][0].data; c[i] = eg + s.r0[i] * Fe; }
            grouped_t(ops, 0, 1, s.n, Mr, NF, ND, 1.0f, a, xb, D, b, NULL, D, 0.0f, c, Fe, W[0], 1);   /* gate */
            adapter_fwd(pc, &s, 0, x, D, eg, Fe);
            for (int i = 0; i < s.n; i++) { b[i] = s.w[i][1].data; c[i] = eu + s.r0[i] * Fe; }
            grouped_t(ops, 0, 1, s.n, Mr, NF, ND, 1.0f, a, xb, D, b, NULL, D, 0.0f, c, Fe, W[1], 1);   /* up */
            adapter_fwd(pc, &s, 1, x, D, eu, Fe);
            swiglu_groups(pc, &s, bs ? bs->ab : NULL, eg, eu, Fe);
        }
        for (int i = 0; i < s.n; i++) {
            a[i] = pc->s_act + s.r0[i] * Fe;
            b[i] = s.w[i][2].data;
            c[i] = y + s.r0[i] * D;
        }
        const mt_bf16 *const *actb = rows_of(ab, bs ? bs->ab : NULL, &s, Fe);
        grouped_t(ops, 0, 1, s.n, Mr, ND, NF, 1.0f, a, actb, Fe, b, NULL, Fe, 0.0f, c, D, W[2], 1);   /* down */
        adapter_fwd(pc, &s, 2, pc->s_act, Fe, y, D);
    }
}

void moe_experts_backward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee,
                          const float *eg, const float *eu, float *dx, const float *dy, const float *x)
{
    const struct mt_ops_i *ops = pc->ops;
    const int D = pc->D, Fe = moe_dims(pc)->Fe, gu = moe_dims(pc)->gu_bf16;
    struct group_set s;
    size_t row = 0;
    int ND[GROUP_CHUNK], NF[GROUP_CHUNK];   /* every group's D and Fe; its rows are s.rows */
    const float *a[GROUP_CHUNK], *b[GROUP_CHUNK];
    const mt_bf16 *ab[GROUP_CHUNK];
    float *c[GROUP_CHUNK];
    const struct mt_param *W[3][GROUP_CHUNK];   /* each group's gate, up, down weight */
    for (int i = 0; i < GROUP_CHUNK; i++) { ND[i] = D; NF[i] = Fe; }
    const int *Mr = s.rows;
    for (int g = 0; g < n_groups;) {
        g = next_chunk(moe_w(pc)->experts, n_groups, cnt, offsets, ee, g, &row, &s);
        if (s.n == 0) continue;
        const struct mt_moe_scratch *bs = bf16_scratch(pc, &s);
        for (int i = 0; i < s.n; i++)
            for (int p = 0; p < 3; p++) W[p][i] = &s.w[i][p];
        /* direct: dg, du as bf16 only; fused: act's twin with them, in one pass (see the top) */
        const int direct = bs && ops->swiglu_backward_bf16 && !gate_up_adapted(&s);
        const int fused = direct && ops->swiglu_backward_act_bf16 && !act_fp32_read(pc, &s);
        MT_ASSERT(!gu || fused);   /* moe_gu_bf16's conditions */
        if (!fused) swiglu_groups(pc, &s, bs ? bs->ab : NULL, eg, eu, Fe);
        /* ReDo: each group's activations into its local expert's score accumulators */
        for (int i = 0; i < s.n && pc->redo; i++)
            ops->redo_score_acc(ops->be, pc->redo + (size_t)(s.w[i] - moe_w(pc)->experts) / 3 * Fe,
                                pc->s_act + s.r0[i] * Fe, (size_t)s.rows[i], Fe);
        /* down: dWd (D, Fe) += dy^T act (not frozen; fused: after the SwiGLU below);
         * dact (rows, Fe) = dy Wd (+ the adapter's path) */
        const mt_bf16 *dyb = bs ? round_rows(ops, bs->db, dy, &s, D) : NULL;
        if (!fused) weight_grad(pc, &s, 2, dy, dyb, D, pc->s_act, bs ? bs->ab : NULL, Fe);
        mt_bf16 *dab = gu ? (mt_bf16 *)pc->s_dact : NULL;   /* gu: d act stored bf16 */
        if (gu) {
            for (int i = 0; i < s.n; i++)
                wlinear_backward_dx_bf16_out(ops, dab + s.r0[i] * Fe, NULL, dyb + s.r0[i] * D, &s.w[i][2], s.rows[i],
                                             Fe, D);
        } else {
            for (int i = 0; i < s.n; i++) {
                a[i] = dy + s.r0[i] * D;
                b[i] = s.w[i][2].data;
                c[i] = pc->s_dact + s.r0[i] * Fe;
            }
            grouped_t(ops, 0, 0, s.n, Mr, NF, ND, 1.0f, a, rows_of(ab, dyb, &s, D), D, b, NULL, Fe, 0.0f, c, Fe, W[2],
                      1);
            adapter_bwd(pc, &s, 2, pc->s_act, Fe, dy, D, pc->s_dact);
        }
        /* direct: dg into db (dy's copy, read above), du into ab (act's, read by dWd above);
         * fused: act's twin into ab, dg, du into s_dg, s_du as bf16 (db is dWd's yet).
         * One call per group as swiglu_backward (the cpu's chunks: its bits) */
        mt_bf16 *dgb = direct ? (fused ? (mt_bf16 *)pc->s_dg : bs->db) : NULL;
        mt_bf16 *dub = direct ? (fused ? (mt_bf16 *)pc->s_du : bs->ab) : NULL;
        if (gu) dub = dgb + Fe;   /* gu: a row dg | du in s_dg (rows 2 Fe apart), mlp_backward_gu's operand */
        for (int i = 0; i < s.n; i++) {
            const size_t o = s.r0[i] * Fe, m = (size_t)s.rows[i] * Fe;
            if (gu)
                ops->swiglu_backward_act_bf16_gud(ops->be, bs->ab + o, dgb + 2 * o, dub + 2 * o, dab + o,
                                                  (const mt_bf16 *)eg + o, (const mt_bf16 *)eu + o, m, (size_t)Fe,
                                                  2 * (size_t)Fe);
            else if (fused)
                ops->swiglu_backward_act_bf16(ops->be, bs->ab + o, dgb + o, dub + o, pc->s_dact + o, eg + o, eu + o, m);
            else if (direct) ops->swiglu_backward_bf16(ops->be, dgb + o, dub + o, pc->s_dact + o, eg + o, eu + o, m);
            else ops->swiglu_backward(ops->be, pc->s_dg + o, pc->s_du + o, pc->s_dact + o, eg + o, eu + o, m);
        }
        if (fused) weight_grad(pc, &s, 2, dy, dyb, D, pc->s_act, bs->ab, Fe);
        /* gate then up: dW (Fe, D) += d^T x; dx (rows, D) = dg Wg, then += du Wu (each + its adapter's path);
         * bf16: x rounded once for both; d (dg, then du) into db where dy was, unless direct */
        const mt_bf16 *xb = bs ? round_rows(ops, bs->xb, x, &s, D) : NULL;
        for (int i = 0; i < s.n && gu; i++) {   /* gate and up together, as mlp_backward_gu: proj_bwd_rows */
            struct mt_param *w2[2] = {&s.w[i][0], &s.w[i][1]};
            proj_bwd_rows(ops, dx + s.r0[i] * D, 0.0f, w2, 2, dgb + 2 * s.r0[i] * Fe, MT_ELEM_BF16, 2 * Fe,
                          x + s.r0[i] * D, xb + s.r0[i] * D, s.rows[i], D, NULL);
        }
        for (int p = 0; p < 2 && !gu; p++) {
            float *d = direct ? NULL : p == 0 ? pc->s_dg : pc->s_du;
            const mt_bf16 *db = direct ? (p == 0 ? dgb : dub) : bs ? round_rows(ops, bs->db, d, &s, Fe) : NULL;
            weight_grad(pc, &s, p, d, db, Fe, x, xb, D);
            for (int i = 0; i < s.n; i++) {
                a[i] = d ? d + s.r0[i] * Fe : NULL;
                b[i] = s.w[i][p].data;
                c[i] = dx + s.r0[i] * D;
            }
            grouped_t(ops, 0, 0, s.n, Mr, ND, NF, 1.0f, a, rows_of(ab, db, &s, Fe), Fe, b, NULL, D,
                      p == 0 ? 0.0f : 1.0f, c, D, W[p], 1);
            adapter_bwd(pc, &s, p, x, D, d, Fe, dx);
        }
    }
    /* an expert no row reached (next_chunk skips it) took no GEMM: its gradient,
     * if left to its first write this step (grad_gemm), is zero */
    for (int e = 0; e < 3 * ee; e++) grad_zero_unwritten(ops, &moe_w(pc)->experts[e]);
}

/* ------------------------------------------------------------------ */
/* device sizes (moe.c md->dev_sizes)                                  */
/* ------------------------------------------------------------------ */

/* each expert's shadow of projection p (fresh: the unit's refresh ran before its forward) */
static void shadows(const struct mt_piece_ctx *pc, int p, const mt_bf16 **w)
{
    const int E = moe_dims(pc)->E;
    for (int e = 0; e < E; e++) {
        const struct mt_param *q = &moe_w(pc)->experts[3 * e + p];
        MT_ASSERT(q->bf16 && q->bf16_ok);
        w[e] = q->bf16;
    }
}

/*
 * The forward and backward of moe_experts_forward / _backward with the sizes
 * on the backend: every group is expert e's rows [offs[e], offs[e+1]) of the
 * M sorted rows, so each projection is one gemm_grouped_rows (rows of a
 * group times its expert's weight) or gemm_grouped_sum (a weight gradient,
 * summed over the group's rows), and each elementwise step one call over
 * all M rows; the operands are the bf16 scratch of the bf16 path (xb, ab,
 * db), the fused SwiGLU backward's outputs in s_dg, s_du:
 *   forward   (xb = bf16(x), moe.c's permute) g = xb Wg^T; u = xb Wu^T;
 *             ab = bf16(silu(g) u); y = ab Wd^T
 *   backward  (db = bf16(dy), moe.c's combine backward; xb again) dact = db Wd;
 *             ab, dg, du = swiglu_backward_act_bf16; dWd += db^T ab;
 *             dWg += dg^T xb; dx = dg Wg; dWu += du^T xb; dx += du Wu
 * The products are those of the per-group path on the same bf16 operands
 * (its fused branch: no ReDo, no adapters); only the fp32 summation order of
 * a GEMM may differ from cuBLAS's.
 */
void moe_experts_forward_dev(const struct mt_piece_ctx *pc, const int32_t *offs, int M, float *eg, float *eu,
                             float *y)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_moe_scratch *bs = moe_scr(pc);
    const int D = pc->D, Fe = moe_dims(pc)->Fe, E = moe_dims(pc)->E;
    const mt_bf16 *w[MT_GROUPED_DEV_MAX];
    const int gu = moe_dims(pc)->gu_bf16;
    const enum mt_elem et = gu ? MT_ELEM_BF16 : MT_ELEM_F32;   /* gu: g, u stored bf16 */
    shadows(pc, 0, w);
    ops->gemm_grouped_rows(ops->be, E, offs, M, Fe, D, 1, 1.0f, bs->xb, D, w, D, 0.0f, eg, et, Fe);
    shadows(pc, 1, w);
    ops->gemm_grouped_rows(ops->be, E, offs, M, Fe, D, 1, 1.0f, bs->xb, D, w, D, 0.0f, eu, et, Fe);
    if (gu) ops->swiglu_forward_bf16_gu(ops->be, bs->ab, (const mt_bf16 *)eg, (const mt_bf16 *)eu, (size_t)M * Fe);
    else ops->swiglu_forward_bf16(ops->be, NULL, bs->ab, eg, eu, (size_t)M * (size_t)Fe);
    shadows(pc, 2, w);
    ops->gemm_grouped_rows(ops->be, E, offs, M, D, Fe, 1, 1.0f, bs->ab, Fe, w, Fe, 0.0f, y, MT_ELEM_F32, D);
}

/* each expert's gradient of projection p, and the beta of the one call that
 * writes them all (every expert, empty ones included: they start and end a
 * step's first write together; grad_beta) */
static float grads(const struct mt_piece_ctx *pc, int p, float **g)
{
    const int E = moe_dims(pc)->E;
    struct mt_param *w[MT_GROUPED_DEV_MAX];
    for (int e = 0; e < E; e++) {
        w[e] = &moe_w(pc)->experts[3 * e + p];
        g[e] = w[e]->grad;
        MT_ASSERT(g[e] != NULL);   /* no frozen expert here (LoRA takes the host path) */
    }
    return grad_beta_all(w, E);
}

/* every expert's gate and up as proj_bwd_rows sees them: their shadows back to back
 * (params_whole: one (2 Fe, D) operand) -> *w; their gradients (grads_whole) -> *g */
static void gate_up_whole(const struct mt_piece_ctx *pc, int *w, int *g)
{
    const int E = moe_dims(pc)->E, Fe = moe_dims(pc)->Fe;
    *w = *g = 1;
    for (int e = 0; e < E; e++) {
        struct mt_param *w2[2] = {&moe_w(pc)->experts[3 * e], &moe_w(pc)->experts[3 * e + 1]};
        enum mt_elem t;
        const void *W = params_whole(w2, 2, 2 * (int64_t)Fe, &t);
        *w &= W != NULL && t == MT_ELEM_BF16;
        *g &= grads_whole(w2, 2) != NULL;
    }
}

/* each expert's gate gradient, the start of its (gate, up) pair (gate_up_whole), and the
 * beta of the one call that writes them all (grad_beta_all over the 2 E gradients) */
static float gate_up_grads(const struct mt_piece_ctx *pc, float **g)
{
    const int E = moe_dims(pc)->E;
    struct mt_param *w[2 * MT_GROUPED_DEV_MAX];
    for (int e = 0; e < E; e++) {
        w[2 * e] = &moe_w(pc)->experts[3 * e];
        w[2 * e + 1] = &moe_w(pc)->experts[3 * e + 1];
        g[e] = w[2 * e]->grad;
    }
    return grad_beta_all(w, 2 * E);
}

void moe_experts_backward_dev(const struct mt_piece_ctx *pc, const int32_t *offs, int M, const float *eg,
                              const float *eu, float *dx)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_moe_scratch *bs = moe_scr(pc);
    const int D = pc->D, Fe = moe_dims(pc)->Fe, E = moe_dims(pc)->E;
    const size_t MF = (size_t)M * (size_t)Fe;
    const mt_bf16 *w[MT_GROUPED_DEV_MAX];
    float *g[MT_GROUPED_DEV_MAX];
    mt_bf16 *dgb = (mt_bf16 *)pc->s_dg, *dub = (mt_bf16 *)pc->s_du;
    /* down: dact = dy Wd; then act's twin, dg, du in one pass; dWd += dy^T act */
    shadows(pc, 2, w);
    if (moe_dims(pc)->gu_bf16) {   /* g, u and d act stored bf16; dg | du in s_dg */
        mt_bf16 *dab = (mt_bf16 *)pc->s_dact;
        ops->gemm_grouped_rows(ops->be, E, offs, M, Fe, D, 0, 1.0f, bs->db, D, w, Fe, 0.0f, dab, MT_ELEM_BF16, Fe);
        ops->swiglu_backward_act_bf16_gud(ops->be, bs->ab, dgb, dgb + Fe, dab, (const mt_bf16 *)eg,
                                          (const mt_bf16 *)eu, MF, (size_t)Fe, 2 * (size_t)Fe);
    } else {
        ops->gemm_grouped_rows(ops->be, E, offs, M, Fe, D, 0, 1.0f, bs->db, D, w, Fe, 0.0f, pc->s_dact, MT_ELEM_F32,
                               Fe);
        ops->swiglu_backward_act_bf16(ops->be, bs->ab, dgb, dub, pc->s_dact, eg, eu, MF);
    }
    float beta = grads(pc, 2, g);
    ops->gemm_grouped_sum(ops->be, E, offs, D, Fe, 1.0f, bs->db, D, bs->ab, Fe, beta, g, Fe);
    /* gate, then up: dW (Fe, D) += d^T x; dx = dg Wg, then += du Wu; gu: dg | du one operand
     * (rows 2 Fe apart), and each of dW, dx one call for both where every expert's gate and
     * up lie back to back (gate_up_whole: proj_bwd_rows' calls, the host path's bits) */
    const int gu = moe_dims(pc)->gu_bf16, ld = gu ? 2 * Fe : Fe;
    int whole_w = 0, whole_g = 0;
    if (gu) gate_up_whole(pc, &whole_w, &whole_g);
    if (whole_g) {
        beta = gate_up_grads(pc, g);
        ops->gemm_grouped_sum(ops->be, E, offs, 2 * Fe, D, 1.0f, dgb, ld, bs->xb, D, beta, g, D);
    }
    if (whole_w) {
        shadows(pc, 0, w);
        ops->gemm_grouped_rows(ops->be, E, offs, M, D, 2 * Fe, 0, 1.0f, dgb, ld, w, D, 0.0f, dx, MT_ELEM_F32, D);
    }
    for (int p = 0; p < 2; p++) {
        const mt_bf16 *d = p == 0 ? dgb : gu ? dgb + Fe : dub;
        if (!whole_g) {
            beta = grads(pc, p, g);
            ops->gemm_grouped_sum(ops->be, E, offs, Fe, D, 1.0f, d, ld, bs->xb, D, beta, g, D);
        }
        if (!whole_w) {
            shadows(pc, p, w);
            ops->gemm_grouped_rows(ops->be, E, offs, M, D, Fe, 0, 1.0f, d, ld, w, D, p == 0 ? 0.0f : 1.0f, dx,
                                   MT_ELEM_F32, D);
        }
    }
}
