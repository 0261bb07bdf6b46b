/*
 * moe_experts.c — the expert SwiGLU MLPs of an MoE block over their row
 * ranges, one grouped GEMM per projection (issue 19 item 3).
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
 * These are exactly the gemm calls of mlp_forward / mlp_backward per expert
 * (same arguments, each group's scratch at its own rows of the (ep*M, Fe)
 * scratch instead of all at row 0), reordered projection-major: the groups
 * are independent, so on the cpu table — whose grouped entry IS those gemm
 * calls — the numbers are bit-identical to the per-expert loop. swiglu stays
 * one call per group: the cpu kernel's SIMD body and scalar tail round
 * differently, so one call over all rows would move the tails.
 * Groups are taken 64 at a time (host arrays on the stack); MoE layers have
 * fewer experts than that in practice.
 */
#include "model_impl.h"
#include "moe_experts.h"

#define GROUP_CHUNK 64

struct group_set {
    int n;
    int rows[GROUP_CHUNK];
    size_t r0[GROUP_CHUNK];             /* first row in the sorted buffer */
    const struct mt_param *w[GROUP_CHUNK];
};

/* the next chunk of non-empty groups from g (returns the g to resume at) */
static int next_chunk(const struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee, int g,
                      size_t *row, struct group_set *s)
{
    s->n = 0;
    for (; g < n_groups && s->n < GROUP_CHUNK; g++) {
        int c = offsets ? cnt[g + 1] - cnt[g] : cnt[g];
        if (c > 0) {
            s->rows[s->n] = c;
            s->r0[s->n] = *row;
            s->w[s->n] = &ly->w.experts[3 * (g % ee)];
            s->n++;
        }
        *row += (size_t)(c > 0 ? c : 0);
    }
    return g;
}

/* one projection over the chunk: C_i = op(A_i) op(B_i) (+ beta C_i) */
static void grouped(const struct mt_ops_i *ops, int ta, int tb, int n, const int *M, const int *N, const int *K,
                    const float *const *A, int lda, const float *const *B, int ldb, float beta, float *const *C,
                    int ldc)
{
    if (ops->gemm_grouped) {
        ops->gemm_grouped(ta, tb, n, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    for (int i = 0; i < n; i++) ops->gemm(ta, tb, M[i], N[i], K[i], 1.0f, A[i], lda, B[i], ldb, beta, C[i], ldc);
}

/* The grouped path runs the plain base GEMMs and writes every expert weight
 * gradient: under LoRA (frozen experts, possibly with adapters, docs/lora.md)
 * the per-expert loops in moe.c run instead, through lora.c. */
int moe_experts_grouped(const struct mt_model *m)
{
    return m->cfg.lora_rank == 0;
}

void moe_experts_forward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                         float *y, const float *x)
{
    const struct mt_ops_i *ops = m->ops;
    const int D = m->D, Fe = m->Fe;
    struct group_set s;
    size_t row = 0;
    int ND[GROUP_CHUNK], NF[GROUP_CHUNK];   /* every group's D and Fe; its rows are s.rows */
    const float *a[GROUP_CHUNK], *b[GROUP_CHUNK];
    float *c[GROUP_CHUNK];
    for (int i = 0; i < GROUP_CHUNK; i++) { ND[i] = D; NF[i] = Fe; }
    const int *Mr = s.rows;
    for (int g = 0; g < n_groups;) {
        g = next_chunk(ly, n_groups, cnt, offsets, ee, g, &row, &s);
        if (s.n == 0) continue;
        for (int i = 0; i < s.n; i++) a[i] = x + s.r0[i] * D;
        for (int i = 0; i < s.n; i++) { b[i] = s.w[i][0].data; c[i] = ly->eg + s.r0[i] * Fe; }
        grouped(ops, 0, 1, s.n, Mr, NF, ND, a, D, b, D, 0.0f, c, Fe);                /* gate */
        for (int i = 0; i < s.n; i++) { b[i] = s.w[i][1].data; c[i] = ly->eu + s.r0[i] * Fe; }
        grouped(ops, 0, 1, s.n, Mr, NF, ND, a, D, b, D, 0.0f, c, Fe);                /* up */
        for (int i = 0; i < s.n; i++)
            ops->swiglu_forward(m->s_act + s.r0[i] * Fe, ly->eg + s.r0[i] * Fe, ly->eu + s.r0[i] * Fe,
                                (size_t)s.rows[i] * Fe);
        for (int i = 0; i < s.n; i++) {
            a[i] = m->s_act + s.r0[i] * Fe;
            b[i] = s.w[i][2].data;
            c[i] = y + s.r0[i] * D;
        }
        grouped(ops, 0, 1, s.n, Mr, ND, NF, a, Fe, b, Fe, 0.0f, c, D);               /* down */
    }
}

void moe_experts_backward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                          float *dx, const float *dy, const float *x)
{
    const struct mt_ops_i *ops = m->ops;
    const int D = m->D, Fe = m->Fe;
    struct group_set s;
    size_t row = 0;
    int ND[GROUP_CHUNK], NF[GROUP_CHUNK];   /* every group's D and Fe; its rows are s.rows */
    const float *a[GROUP_CHUNK], *b[GROUP_CHUNK];
    float *c[GROUP_CHUNK];
    for (int i = 0; i < GROUP_CHUNK; i++) { ND[i] = D; NF[i] = Fe; }
    const int *Mr = s.rows;
    for (int g = 0; g < n_groups;) {
        g = next_chunk(ly, n_groups, cnt, offsets, ee, g, &row, &s);
        if (s.n == 0) continue;
        for (int i = 0; i < s.n; i++)
            ops->swiglu_forward(m->s_act + s.r0[i] * Fe, ly->eg + s.r0[i] * Fe, ly->eu + s.r0[i] * Fe,
                                (size_t)s.rows[i] * Fe);
        /* down: dWd (D, Fe) += dy^T act; dact (rows, Fe) = dy Wd */
        for (int i = 0; i < s.n; i++) {
            a[i] = dy + s.r0[i] * D;
            b[i] = m->s_act + s.r0[i] * Fe;
            c[i] = s.w[i][2].grad;
        }
        grouped(ops, 1, 0, s.n, ND, NF, Mr, a, D, b, Fe, 1.0f, c, Fe);
        for (int i = 0; i < s.n; i++) { b[i] = s.w[i][2].data; c[i] = m->s_dact + s.r0[i] * Fe; }
        grouped(ops, 0, 0, s.n, Mr, NF, ND, a, D, b, Fe, 0.0f, c, Fe);
        for (int i = 0; i < s.n; i++)
            ops->swiglu_backward(m->s_dg + s.r0[i] * Fe, m->s_du + s.r0[i] * Fe, m->s_dact + s.r0[i] * Fe,
                                 ly->eg + s.r0[i] * Fe, ly->eu + s.r0[i] * Fe, (size_t)s.rows[i] * Fe);
        /* gate then up: dW (Fe, D) += d^T x; dx (rows, D) = dg Wg, then += du Wu */
        for (int p = 0; p < 2; p++) {
            float *d = p == 0 ? m->s_dg : m->s_du;
            for (int i = 0; i < s.n; i++) {
                a[i] = d + s.r0[i] * Fe;
                b[i] = x + s.r0[i] * D;
                c[i] = s.w[i][p].grad;
            }
            grouped(ops, 1, 0, s.n, NF, ND, Mr, a, Fe, b, D, 1.0f, c, D);
            for (int i = 0; i < s.n; i++) { b[i] = s.w[i][p].data; c[i] = dx + s.r0[i] * D; }
            grouped(ops, 0, 0, s.n, Mr, ND, NF, a, Fe, b, D, p == 0 ? 0.0f : 1.0f, c, D);
        }
    }
}
