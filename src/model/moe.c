/*
 * moe.c — dropless mixture of experts (SPEC.md section 1, 1b), forward and backward.
 *
 * Math, N = B*T rows h (N,D), E experts, top_k = k, M = N*k routed slots:
 *     r = h Wr^T (N,E);  p = softmax(r) in fp32;  lse_n = logsumexp(r_n)
 *     top-k by k rounds of argmax (first maximum wins); gates g_nj = p_{n,i_j} / S_n,
 *     S_n = sum_j p_{n,i_j}
 *     out_n += sum_j g_nj expert_{i_j}(h_n)  [+ shared(h_n)]
 *     aux  = sum_s aux_coef * E * sum_e f[s,e] P[s,e]         (normalised by n_sequences)
 *            f[s,e] = #slots of sequence s routed to e / (T*k)  (a constant: no gradient)
 *            P[s,e] = mean_t p[s,t,e]
 *     z    = z_coef * sum_n lse_n^2                          (normalised by n_tokens)
 * Dispatch: slots (n, j) are stably sorted by expert (ops->moe_route, a
 * counting sort on the backend), so expert e owns the contiguous rows
 * [e_off[e], e_off[e+1]) of the sorted buffer; pos[n*k+j] is the slot's row,
 * src_row[m] its token. Every expert then runs as plain GEMMs on its row
 * range (any expert may get all M rows).
 *
 * Host traffic per MoE layer (docs/cuda.md "MoE on the device"): routing,
 * the loss statistics and the aux/z gradients stay on the backend. The one
 * device-to-host copy is the E+1 expert offsets after moe_route, once per
 * forward (the grouped GEMM and the all-to-all-v take host sizes); the
 * backward reuses them (no copy). The layer's aux and z sums stay in
 * the piece's own struct (loss), read by the model once per forward for
 * all layers (moe_own_losses); the load histogram is counted on the backend
 * (moe_count_acc) and read once a step (moe_own_load). With the sizes on the
 * device (knob moe_sizes) the offsets are not read at all. Extra copies only
 * under the test hook test_force_routing.
 * Backward:
 *     term 1: combine: dy[pos] = g dout;  dg_nj = dout_n . y[pos]
 *     term 2: per-expert SwiGLU backward on its rows -> dxp; dh = sum_j dxp[pos] (+ shared)
 *     term 3: d aux / d p[s,t,e] = aux_coef*E*f[s,e] / T / n_sequences
 *             d z / d lse_n     = 2 z_coef lse_n / n_tokens
 *     term 4: router kernel: dr from dg (through the renormalisation: numerator and
 *             denominator), dp (aux) and dlse (z); then dWr += dr^T h, dh += dr Wr
 *
 * Null experts (SPEC 1e, n_null_experts Z): the router has E + Z rows
 * (Er = E + Z columns of r, p; the null ones last), top-k, the gates, the
 * aux statistics (f, P over Er columns, coefficient aux_coef*Er) and lse over
 * all of them. moe_route sorts the slots over the Er "experts" and gives a
 * null slot pos = -1: the real rows are [0, Mr), Mr = e_off[E]; permute,
 * the experts and the EP all-to-alls see only those, combine and its
 * backward skip the null slots (dg = 0 there), and the router backward
 * carries the renormalisation's gradient to the null logits as to any other.
 * The load histogram has Er columns per layer (the receipt's null share).
 *
 * Gradient rule: parameter grads +=; dh OVERWRITTEN (moe_backward); out
 * ACCUMULATES in forward (it holds the residual). Scratch is overwritten.
 */
#include "model_impl.h"
#include "moe_experts.h"


#include <string.h>

#include "../core/mt_knobs.h"

/* What an MoE layer saves beyond the shared ffn norm (struct mt_layer): its
 * ly->state entry (moe_carve fills it). Nm rows the block sees, M = Nm*k slots. */
struct moe_state {
    float   *probs;    /* (Nm, Er) router softmax, fp32 (Er = E + Z null experts)    */
    float   *rlse;     /* (Nm)     router logsumexp (z-loss)                        */
    int32_t *topk;     /* (Nm, k)  chosen experts                                   */
    float   *gates;    /* (Nm, k)  renormalised gate weights                        */
    int32_t *pos;      /* (Nm*k)   slot (n,j) -> row of the expert-sorted buffer    */
    int32_t *src_row;  /* (M)      row -> token                                     */
    float   *eg, *eu;  /* (M, Fe)  expert gate / up pre-activations (sorted rows); mt_bf16 where md->gu_bf16 */
    float   *ey;       /* (M, D)   expert outputs before gating (sorted rows)       */
    float   *sgp, *sup;/* (Nm, Fs) shared expert gate / up pre-activations; mt_bf16 where md->shared_gu */
    float   *f_share;  /* (B, Er)  f[s,e]: share of sequence s's T*k slots (no grad) */
    int32_t *e_off_d;  /* (Er+1)   moe_route's expert offsets, on the backend (device sizes read them there) */
    /* host (OTHER) */
    int     *e_off;    /* (Er+1)   row offset of each expert in the sorted buffer (nulls last: rows >= e_off[E] unused) */
    /* EP (ep > 1): rows received for this rank's experts, kept for backward */
    int     *r_cnt;    /* (ep*Ee)  rows from source rank s for local expert j: [s*Ee+j] */
    int      r_rows;   /* sum of r_cnt                                              */
    float   *rx;       /* (ep*M, D) received expert inputs (capacity: dropless worst case) */
};
_Static_assert(sizeof(struct moe_state) <= PIECE_STATE_MAX, "raise PIECE_STATE_MAX");

const int32_t *moe_state_topk(const void *state) { return state ? ((const struct moe_state *)state)->topk : NULL; }

/*
 * HOW IT WORKS — expert parallelism (ep > 1). This rank holds experts
 * [e0, e0+Ee). After routing, its slots are sorted by GLOBAL expert, so the
 * rows for rank r's experts are the contiguous range
 * [e_off[r*Ee], e_off[(r+1)*Ee]). One all-to-all of per-expert counts tells
 * each rank how many rows it receives from each source for each of its
 * experts (dropless: counts change every step, and zero is a valid count: a
 * rank with no tokens still joins every all-to-all, forward and backward).
 * Received rows arrive grouped [source][local expert]; each (source, expert)
 * chunk runs as plain GEMMs, and the outputs go back by the reverse
 * all-to-all into the sorted slot order, where combine works as on one rank.
 * Backward sends d(outputs) the same way and the input gradients back.
 */

/* The auxiliary losses of the n rows just routed (forward with targets):
 * moe_scr(pc)->loss[2*layer] = the aux sum (model rank 0 only under TP), [+1] =
 * the z sum, and st->f_share for the backward; all on the backend. Under TP
 * our n rows are the global rows row0.. (sequences of T rows may straddle
 * ranks): the per-sequence sums meet in one all-reduce over the model group
 * (its device communicator: no host copy), and model rank 0 alone reports
 * the aux loss (every rank needs f for the backward). */
static enum mt_status moe_losses(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_tp_axis *tp = &pc->tp;
    struct mt_moe_scratch *s = moe_scr(pc);
    struct moe_state *st = pc->st;
    const int E = moe_dims(pc)->E + moe_dims(pc)->Z;   /* every router column, null ones included */
    const int k = moe_dims(pc)->top_k, B = pc->B, T = pc->T, g0 = tp->tp > 1 ? moe_row0(pc) : 0;
    const size_t nseq = (size_t)2 * B * E;
    ops->moe_seq_stats(ops->be, s->seq, st->probs, st->topk, n, E, k, B, T, g0);
    if (tp->tp > 1) MT_CHECK(tpa_allreduce_f64(ctx, tp, s->seq, nseq));   /* on the device comm */
    ops->moe_aux_loss(ops->be, s->loss + 2 * (size_t)pc->layer, st->f_share, s->seq, st->rlse, n, B, E, k, T,
                      moe_dims(pc)->aux_coef, moe_dims(pc)->z_coef, !(tp->tp > 1 && tp->rank != 0));
    return MT_OK;
}

/* test hook (knob test_force_routing): every token to experts 0..k-1, gates
 * renormalised over them; the gates are staged in h_dprobs (free until backward) */
static void force_routing(const struct mt_piece_ctx *pc, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    struct mt_moe_scratch *s = moe_scr(pc);
    struct moe_state *st = pc->st;
    const int E = moe_dims(pc)->E + moe_dims(pc)->Z, k = moe_dims(pc)->top_k;
    ops->copy_to_host(ops->be, s->h_probs, st->probs, (size_t)n * E * sizeof(float));
    float *hg = s->h_dprobs;
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int j = 0; j < k; j++) sum += s->h_probs[(size_t)i * E + j];
        for (int j = 0; j < k; j++) {
            s->h_topk[(size_t)i * k + j] = j;
            hg[(size_t)i * k + j] = (float)(s->h_probs[(size_t)i * E + j] / sum);
        }
    }
    ops->copy_from_host(ops->be, st->topk, s->h_topk, (size_t)n * k * sizeof(int32_t));
    ops->copy_from_host(ops->be, st->gates, hg, (size_t)n * k * sizeof(float));
}

/* the shared expert's bf16 operand: the norm's twin at the block's Nm rows (NULL: none) */
static const mt_bf16 *shared_hb(const struct mt_piece_ctx *pc)
{
    if (!pc->nm->hb) return NULL;
    return pc->tp.tp > 1 && !pc->tp.sp ? pc->nm->hb + (size_t)moe_row0(pc) * (size_t)pc->D : pc->nm->hb;
}


/* One expert's c rows at row o of the sorted (or received) buffers by the dense
 * MLP's code: the per-expert loop (knob moe_grouped=0), the grouped GEMMs'
 * reference. gu_bf16: eg, eu hold bf16 (mlp_forward_gu / mlp_backward_gu, the
 * SwiGLU's twin in the scratch ab; no adapter, no ReDo there). */
static void expert_loop_forward(const struct mt_piece_ctx *pc, float *y, float *eg, float *eu, const float *x,
                                const struct mt_param *w, int c, size_t o)
{
    const size_t D = (size_t)pc->D, Fe = (size_t)moe_dims(pc)->Fe;
    if (moe_dims(pc)->gu_bf16)
        mlp_forward_gu(pc->ops, pc->s_lora, y + o * D, 0, NULL, (mt_bf16 *)eg + o * Fe, (mt_bf16 *)eu + o * Fe,
                       moe_scr(pc)->ab, x + o * D, NULL, &w[0], &w[1], &w[2], c, (int)D, (int)Fe);
    else
        mlp_forward(pc->ops, pc->s_lora, y + o * D, 0, eg + o * Fe, eu + o * Fe, pc->s_act, x + o * D, &w[0], &w[1],
                    &w[2], c, (int)D, (int)Fe);
}
/* ... its backward: dx = d x (overwritten), grads +=; j its local expert (ReDo's scores) */
static void expert_loop_backward(const struct mt_piece_ctx *pc, float *dx, const float *dy, const float *eg,
                                 const float *eu, const float *x, struct mt_param *w, int c, size_t o, int j)
{
    const size_t D = (size_t)pc->D, Fe = (size_t)moe_dims(pc)->Fe;
    if (moe_dims(pc)->gu_bf16)
        mlp_backward_gu(pc->ops, dx + o * D, 0, moe_scr(pc)->ab, pc->s_dact, pc->s_dg, pc->s_du, dy + o * D,
                        x + o * D, NULL, (const mt_bf16 *)eg + o * Fe, (const mt_bf16 *)eu + o * Fe, &w[0], &w[1],
                        &w[2], c, (int)D, (int)Fe, NULL, NULL);
    else
        mlp_backward_redo(pc->ops, pc->s_lora, pc->s_dlora, dx + o * D, 0, pc->s_act, pc->s_dact, pc->s_dg, pc->s_du,
                          dy + o * D, x + o * D, eg + o * Fe, eu + o * Fe, &w[0], &w[1], &w[2], c, (int)D, (int)Fe,
                          pc->redo ? pc->redo + (size_t)j * Fe : NULL);
}
/* The experts on host sizes: ey (sorted rows) from xp, after one read of the
 * offsets (the all-to-alls under EP). */
static enum mt_status experts_host_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, int n)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_moe_dims *md = moe_dims(pc);
    const struct mt_ep_axis *ea = &pc->ep;
    struct mt_moe_scratch *s = moe_scr(pc);
    struct moe_state *st = pc->st;
    const int D = pc->D, E = md->E, Er = md->E + md->Z, M = n * md->top_k;
    /* the layer's one device-to-host copy: the grouped GEMM's and the
     * all-to-all-v's host sizes (int32 on both sides: moe_route's contract) */
    _Static_assert(sizeof(int) == sizeof(int32_t), "e_off is copied as int32");
    ops->copy_to_host(ops->be, st->e_off, st->e_off_d, (size_t)(Er + 1) * sizeof(int32_t));
    MT_ASSERT(st->e_off[0] == 0 && st->e_off[Er] == M);

    /* only the real slots' rows [0, e_off[E]) move (null slots: pos -1, SPEC 1e) */
    ops->moe_permute(ops->be, s->xp, pc->nm->h, st->src_row, st->e_off[E], D);
    const int grouped = md->grouped;   /* one grouped GEMM per projection (moe_experts.c) */
    if (ea->ep == 1) {
        if (grouped) moe_experts_forward(pc, E, st->e_off, 1, E, st->eg, st->eu, st->ey, s->xp);
        for (int e = 0; e < E && !grouped; e++) {
            int r0 = st->e_off[e], c = st->e_off[e + 1] - r0;
            if (c > 0) expert_loop_forward(pc, st->ey, st->eg, st->eu, s->xp, &moe_w(pc)->experts[3 * e], c, r0);
        }
        return MT_OK;
    }
    /* per-expert counts first (every rank, even with nothing to send) */
    const int ep = ea->ep, Ee = ea->Ee;
    int64_t *sc = s->h_ecnt, *rc = s->h_ecnt + E;
    for (int e = 0; e < E; e++) sc[e] = st->e_off[e + 1] - st->e_off[e];
    MT_CHECK(epa_exchange_counts(ctx, ea, sc, rc, s->h_a2a));
    st->r_rows = 0;
    for (int i = 0; i < ep * Ee; i++) {
        st->r_cnt[i] = (int)rc[i];
        st->r_rows += (int)rc[i];
    }
    MT_ASSERT(st->r_rows <= ep * M);
    size_t scnt[MT_MAX_EP] = {0}, sdis[MT_MAX_EP] = {0}, rcnt[MT_MAX_EP] = {0}, rdis[MT_MAX_EP] = {0};
    epa_row_counts(ea, st->e_off, st->r_cnt, scnt, sdis, rcnt, rdis);
    MT_CHECK(epa_alltoallv_rows(ctx, ea, st->rx, s->xp, scnt, sdis, rcnt, rdis, D, s->h_a2a));
    if (grouped) moe_experts_forward(pc, ep * Ee, st->r_cnt, 0, Ee, st->eg, st->eu, s->ry, st->rx);
    size_t o = 0;
    for (int src = 0; src < ep && !grouped; src++)
        for (int j = 0; j < Ee; j++) {
            int c = st->r_cnt[src * Ee + j];
            if (c > 0) expert_loop_forward(pc, s->ry, st->eg, st->eu, st->rx, &moe_w(pc)->experts[3 * j], c, o);
            o += (size_t)c;
        }
    return epa_alltoallv_rows(ctx, ea, st->ey, s->ry, rcnt, rdis, scnt, sdis, D, s->h_a2a);   /* back to the sources */
}

/* out (n, D) += moe(h) for the n rows pc->nm->h (global rows row0.. of the
 * microbatch under TP, sequences of T rows). When want_loss, the layer's
 * slot of moe_scr(pc)->loss (device) gets the aux sum sum_s aux_coef*E*sum_e f P
 * (the whole microbatch's sequences, counted on model rank 0 only:
 * per-sequence statistics are all-reduced over the model group) and the z
 * sum z_coef * sum over the n rows of lse^2 (un-normalised; the model
 * divides by the global counts: mt_model_forward_stage). */
static enum mt_status moe_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, float *out, int n,
                                  int want_loss)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_moe_dims *md = moe_dims(pc);
    struct mt_moe_scratch *s = moe_scr(pc);
    struct moe_state *st = pc->st;
    const int D = pc->D, Er = md->E + md->Z, k = md->top_k;

    /* router (Er = E + Z rows): logits into the (free in forward) d-router-logits scratch */
    linear_forward(ops, s->drl, pc->nm->h, moe_w(pc)->router->data, n, D, Er, 0.0f);
    ops->router_forward(ops->be, st->probs, st->rlse, st->topk, st->gates, s->drl, n, Er, k);

    if (md->force_route) force_routing(pc, n);
    ops->moe_route(ops->be, st->pos, st->src_row, st->e_off_d, s->route_work, st->topk, n, k, Er, md->Z);
    /* the load histogram, counted on the backend (read once a step: moe_own_load) */
    ops->moe_count_acc(ops->be, s->load_d + (size_t)pc->layer * Er, st->e_off_d, Er, 1.0);
    if (md->dev_sizes) {
        /* the counts stay on the backend (no null experts: every slot is a real row, n k of them) */
        ops->moe_permute_bf16(ops->be, s->xb, pc->nm->h, st->src_row, n * k, D);   /* the GEMMs' operand only */
        moe_experts_forward_dev(pc, st->e_off_d, n * k, st->eg, st->eu, st->ey);
    } else {
        MT_CHECK(experts_host_forward(ctx, pc, n));
    }
    ops->moe_combine(ops->be, out, st->ey, st->pos, st->gates, n, k, D);
    if (md->Fs > 0 && md->shared_gu)   /* gate, up stored bf16 (moe_shared_gu); out += its output */
        mlp_forward_gu(ops, pc->s_lora, out, 1, NULL, (mt_bf16 *)st->sgp, (mt_bf16 *)st->sup, s->ab, pc->nm->h,
                       shared_hb(pc), moe_w(pc)->sg, moe_w(pc)->su, moe_w(pc)->sd, n, D, md->Fs);
    else if (md->Fs > 0)
        mlp_forward_b(ops, pc->s_lora, out, 1, st->sgp, st->sup, pc->s_act, s->ab, pc->nm->h, shared_hb(pc),
                      moe_w(pc)->sg, moe_w(pc)->su, moe_w(pc)->sd, n, D, md->Fs);

    return want_loss ? moe_losses(ctx, pc, n) : MT_OK;
}

/* dh (n, D) = d h from dout (n, D) = d out, plus the aux/z loss gradients
 * normalised by pc->norm; param grads +=. n = Nm rows (training). */
static enum mt_status moe_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, float *dh, const float *dout)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_moe_dims *md = moe_dims(pc);
    const struct mt_ep_axis *ea = &pc->ep;
    struct mt_moe_scratch *s = moe_scr(pc);
    const struct moe_state *st = pc->st;
    const int T = pc->T, n = moe_nm(pc), D = pc->D, E = md->E, Er = md->E + md->Z, k = md->top_k, Fe = md->Fe;
    /* the real slots' rows (device sizes: no null experts, all n k) */
    const int Mr = md->dev_sizes ? n * k : st->e_off[E], g0 = pc->tp.tp > 1 ? moe_row0(pc) : 0;
    float *t = pc->s_lora, *dt = pc->s_dlora;

    const int grouped = md->grouped;
    /* term 1: combine (device sizes: dy straight into its bf16 copy, the GEMMs' operand) */
    if (md->dev_sizes)
        ops->moe_combine_backward_bf16(ops->be, s->db, s->dgates, dout, st->ey, st->pos, st->gates, n, k, D);
    else
        ops->moe_combine_backward(ops->be, s->dy, s->dgates, dout, st->ey, st->pos, st->gates, n, k, D);
    /* term 2: experts on their row ranges (inputs re-permuted, not saved) */
    if (md->dev_sizes) {
        ops->moe_permute_bf16(ops->be, s->xb, pc->nm->h, st->src_row, Mr, D);
        moe_experts_backward_dev(pc, st->e_off_d, Mr, st->eg, st->eu, s->dxp);
    } else if (ea->ep == 1) {
        ops->moe_permute(ops->be, s->xp, pc->nm->h, st->src_row, Mr, D);
        if (grouped) moe_experts_backward(pc, E, st->e_off, 1, E, st->eg, st->eu, s->dxp, s->dy, s->xp);
        for (int e = 0; e < E && !grouped; e++) {
            int r0 = st->e_off[e], c = st->e_off[e + 1] - r0;
            if (c > 0)
                expert_loop_backward(pc, s->dxp, s->dy, st->eg, st->eu, s->xp, &moe_w(pc)->experts[3 * e], c, r0, e);
        }
    } else {
        const int ep = ea->ep, Ee = ea->Ee;
        size_t scnt[MT_MAX_EP] = {0}, sdis[MT_MAX_EP] = {0}, rcnt[MT_MAX_EP] = {0}, rdis[MT_MAX_EP] = {0};
        epa_row_counts(ea, st->e_off, st->r_cnt, scnt, sdis, rcnt, rdis);
        MT_CHECK(epa_alltoallv_rows(ctx, ea, s->rdy, s->dy, scnt, sdis, rcnt, rdis, D, s->h_a2a));
        if (grouped) moe_experts_backward(pc, ep * Ee, st->r_cnt, 0, Ee, st->eg, st->eu, s->rdx, s->rdy, st->rx);
        size_t o = 0;
        for (int src = 0; src < ep && !grouped; src++)
            for (int j = 0; j < Ee; j++) {
                int c = st->r_cnt[src * Ee + j];
                if (c > 0)
                    expert_loop_backward(pc, s->rdx, s->rdy, st->eg, st->eu, st->rx, &moe_w(pc)->experts[3 * j], c,
                                         o, j);
                o += (size_t)c;
            }
        MT_CHECK(epa_alltoallv_rows(ctx, ea, s->dxp, s->rdx, rcnt, rdis, scnt, sdis, D, s->h_a2a));
    }
    ops->moe_permute_backward(ops->be, dh, s->dxp, st->pos, n, k, D, 0);   /* =: dh's first term, no fill */
    if (md->Fs > 0 && md->shared_gu)   /* dh += the shared expert's d h, on its bf16 g, u */
        mlp_backward_gu(ops, dh, 1, s->ab, pc->s_dact, pc->s_dg, pc->s_du, dout, pc->nm->h, shared_hb(pc),
                        (const mt_bf16 *)st->sgp, (const mt_bf16 *)st->sup, moe_w(pc)->sg, moe_w(pc)->su,
                        moe_w(pc)->sd, n, D, md->Fs, pc->dyb, NULL);
    else if (md->Fs > 0)
        mlp_backward_b(ops, t, dt, dh, 1, pc->s_act, s->ab, pc->s_dact, pc->s_dg, pc->s_du, dout, pc->nm->h,
                       shared_hb(pc), st->sgp, st->sup, moe_w(pc)->sg, moe_w(pc)->su, moe_w(pc)->sd, n, D, md->Fs,
                       s->ab ? pc->dyb : NULL, pc->redo ? pc->redo + (size_t)pc->ep.Ee * Fe : NULL);

    /* term 3: aux and z gradients (on the backend) */
    double ns = pc->norm->n_sequences > 0 ? pc->norm->n_sequences : 1.0;
    double nt = pc->norm->n_tokens > 0 ? pc->norm->n_tokens : 1.0;
    ops->moe_aux_backward(ops->be, s->dprobs, s->dlse, st->f_share, st->rlse, n, Er, T, g0, md->aux_coef, md->z_coef,
                          ns, nt);

    /* term 4: router (a null slot's dg is 0; the renormalisation still reaches its logit) */
    ops->router_backward(ops->be, s->drl, s->dgates, s->dprobs, s->dlse, st->probs, st->topk, st->gates, n, Er, k);
    linear_backward(ops, dh, 1.0f, moe_w(pc)->router->frozen ? NULL : moe_w(pc)->router->grad, 1.0f, s->drl, pc->nm->h,
                    moe_w(pc)->router->data, n, D, Er);   /* LoRA: a frozen router computes dx only */
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* the MoE piece of the block-kind table (ffn of E)                    */
/* ------------------------------------------------------------------ */

/* MoE's global dims from its config keys, and this rank's experts [e0, e0 + Ee) of the expert axis. */
struct moe_gdims { int64_t E, Z, top_k, Fe, Fs; int e0, Ee; };
static struct moe_gdims moe_gdims_of(const struct mt_block_shape *s)
{
    const struct mt_config *cfg = s->cfg;
    const int Ee = cfg->n_experts / (s->ep > 1 ? s->ep : 1);
    return (struct moe_gdims){cfg->n_experts, cfg->n_null_experts, cfg->top_k, cfg->expert_hidden,
                              cfg->shared_expert_hidden, (s->ep > 1 ? s->ep_rank : 0) * Ee, Ee};
}

static void moe_params(const struct mt_block_shape *shape, mt_pspec_fn fn, void *user)
{
    const struct moe_gdims g = moe_gdims_of(shape), *s = &g;
    const int64_t D = shape->D, Er = s->E + s->Z, Fe = s->Fe, Fs = s->Fs;   /* the router: null rows last */
    const struct mt_pspec head[] = {
        {"post_attention_layernorm.weight", -1, 1, D, 1, MT_SCALE_ONES, MT_ROLE_GAIN, MT_LAYOUT_RESIDUAL, MT_BIND_NORM},
        {"mlp.gate.weight", -1, 2, Er, D, MT_SCALE_NORMAL, MT_ROLE_ROUTER, MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN(struct moe_w, router)},
    };
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) fn(user, &head[i]);
    for (int e = s->e0; e < s->e0 + s->Ee; e++) {   /* EP: this rank's experts only; moe_w.experts -> the first */
        const struct mt_pspec x[] = {
            {"mlp.experts.%d.gate_proj.weight", e, 2, Fe, D, MT_SCALE_NORMAL, MT_ROLE_EXPERT, MT_LAYOUT_EXPERT,
             e == s->e0 ? MT_BIND_OWN_DW(struct moe_w, experts) : MT_BIND_DW_GEMM},
            {"mlp.experts.%d.up_proj.weight", e, 2, Fe, D, MT_SCALE_NORMAL, MT_ROLE_EXPERT, MT_LAYOUT_EXPERT,
             MT_BIND_DW_GEMM},
            {"mlp.experts.%d.down_proj.weight", e, 2, D, Fe, MT_SCALE_NORMAL_OUT, MT_ROLE_EXPERT, MT_LAYOUT_EXPERT,
             MT_BIND_DW_GEMM},
        };
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) fn(user, &x[i]);
    }
    if (Fs <= 0) return;
    /* experts (shared included) are not split by TP: SPEC.md section 2 */
    const struct mt_pspec sh[] = {
        {"mlp.shared_expert.gate_proj.weight", -1, 2, Fs, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_MODEL_PARTIAL,
         MT_BIND_OWN_DW(struct moe_w, sg)},
        {"mlp.shared_expert.up_proj.weight", -1, 2, Fs, D, MT_SCALE_NORMAL, MT_ROLE_DENSE, MT_LAYOUT_MODEL_PARTIAL,
         MT_BIND_OWN_DW(struct moe_w, su)},
        {"mlp.shared_expert.down_proj.weight", -1, 2, D, Fs, MT_SCALE_NORMAL_OUT, MT_ROLE_DENSE,
         MT_LAYOUT_MODEL_PARTIAL, MT_BIND_OWN_DW(struct moe_w, sd)},
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) fn(user, &sh[i]);
}

/* The model's part of the rule below, NULL where the device-sized experts
 * apply, else why not: one definition for the runtime (sizes_on_device) and
 * the planner's pricing of the same layer (moe_work), so that a plan cannot
 * price a path its run does not take. grouped: knob moe_grouped (the planner:
 * its moe_dev_sizes, which folds moe_sizes=host in). */
static const char *dev_sizes_refusal(const struct mt_config *cfg, int bf16, int ep, int D, int grouped)
{
    if (!bf16) return "precision=fp32 (the device-sized GEMMs are bf16)";
    if (ep > 1) return "ep > 1 (the all-to-all-v takes host counts)";
    if (cfg->n_null_experts > 0) return "null experts";
    if (cfg->lora_rank > 0) return "LoRA (frozen experts and adapters run per group)";
    if (cfg->redo_every > 0) return "ReDo (scores per group)";
    if (!grouped) return "moe_grouped=0";
    if (cfg->n_experts > MT_GROUPED_DEV_MAX) return "more than 64 experts";
    if (!mt_grouped_dev_dims_ok(D, cfg->expert_hidden, 8, 8)) return "d_model or expert_hidden not a multiple of 8";
    return NULL;
}

/* Knob moe_sizes: may the layer keep its per-expert counts on the backend
 * (moe_experts_forward_dev: grouped bf16 GEMMs that read the offsets
 * there, no host read)? auto: where it applies, on a device backend (on a
 * host-memory one, cpu, the host sizes cost nothing, and its bits stay
 * those of the per-group calls). why gets the reason when not. */
static int sizes_on_device(const struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_moe_dims *md,
                           const struct mt_config *cfg, char *why, size_t n)
{
    const char *k = ctx ? mt_knob_str(ctx, MT_KNOB_MOE_SIZES) : "auto";
    const struct mt_ops_i *ops = pc->ops;
    const char *no = NULL;
    if (strcmp(k, "host") == 0) no = "moe_sizes=host";
    else if (!ops || !ops->gemm_grouped_rows || !ops->gemm_grouped_sum ||
             !ops->swiglu_backward_act_bf16 || !ops->swiglu_forward_bf16 || !ops->moe_permute_bf16 ||
             !ops->moe_combine_backward_bf16)
        no = "the backend has no device-sized grouped GEMM";
    else if (strcmp(k, "auto") == 0 && ops->host_memory)
        no = "auto on a host-memory backend (host sizes cost nothing there; moe_sizes=device runs the device path)";
    else no = dev_sizes_refusal(cfg, pc->bf16, pc->ep.ep, pc->D, md->grouped);
    snprintf(why, n, "%s", no ? no : "");
    return no == NULL;
}

/* precision=bf16 with the entries the experts' bf16 scratch serves (moe_carve_scratch
 * carves xb, ab, db then; ops NULL, the plan: yes) */
static int moe_bf16_scratch(const struct mt_piece_ctx *pc)
{
    return pc->bf16 && (!pc->ops || (pc->ops->cast_bf16 && pc->ops->swiglu_forward_bf16));
}

/* The routed experts' gate and up stored bf16 (moe_experts.c), as the dense
 * MLP's (mlp.c mlp_gu_bf16): their GEMMs write bf16 (gemm_bf16_out /
 * gemm_grouped_rows' bf16 output: the fp32 accumulator rounded once), the
 * SwiGLU reads them widened (swiglu_*_bf16_gu), and d act, the down
 * projection's backward GEMM's output, is stored bf16 too (_gud): 12 bytes a
 * hidden unit and slot less a step (the GEMMs' stores 4 + 2, the SwiGLU's
 * reads 4 + 2) and half of eg, eu's saved bytes. Rounding points more than
 * the fp32 storage, autocast's (a bf16 Linear output). Only where the
 * experts' fused backward runs every time: no ReDo (it scores the fp32 act),
 * no adapter on the experts (LoRA's terms read and add fp32); decided once
 * from the config, so that the carve, the plan and both directions agree.
 * All three paths run it with the same calls (the device-sized grouped GEMMs,
 * the host-sized ones, the per-expert loop: mlp_forward_gu / mlp_backward_gu,
 * whose merged gate/up backward the grouped paths follow). */
static int moe_gu_bf16(const struct mt_piece_ctx *pc, const struct mt_config *cfg)
{
    const struct mt_ops_i *o = pc->ops;
    if (!moe_bf16_scratch(pc) || cfg->redo_every > 0 || lora_adapts(cfg, MT_LORA_EXPERT) || !mlp_gu_ops(o)) return 0;
    /* the experts' fused backward (moe_experts.c), and the _gud entry the grouped paths call themselves */
    return !o || (o->swiglu_backward_bf16 && o->swiglu_backward_act_bf16 && o->swiglu_backward_act_bf16_gud);
}

/* ... and the shared expert's, as the dense MLP's (mlp.c mlp_gu_bf16): precision=bf16,
 * no ReDo (it scores the fp32 act); LoRA puts no adapter on it (no target names it) */
static int moe_shared_gu(const struct mt_piece_ctx *pc, const struct mt_moe_dims *md, const struct mt_config *cfg)
{
    return md->Fs > 0 && moe_bf16_scratch(pc) && cfg->redo_every <= 0 && mlp_gu_ops(pc->ops);   /* ab: its twin */
}

/* The block's dims (the rows of a call are its context's: moe_nm, moe_m,
 * moe_row0, moe_experts.h); the test knobs (forced routing, grouped expert
 * GEMMs) are read here, once. */
static void moe_setup(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, const struct mt_config *cfg)
{
    struct mt_moe_dims *md = moe_dims(pc);
    md->E = cfg->n_experts, md->Z = cfg->n_null_experts, md->top_k = cfg->top_k, md->Fe = cfg->expert_hidden;
    md->Fs = cfg->shared_expert_hidden, md->L = cfg->n_layer;
    md->aux_coef = cfg->aux_loss_coef;
    md->z_coef = cfg->z_loss_coef;
    /* test hook (knob test_force_routing, env MT_TEST_FORCE_ROUTING): 1 sends every
     * token to experts 0..top_k-1 (so that some expert ranks receive no token at all) */
    md->force_route = ctx && mt_knob_int(ctx, MT_KNOB_TEST_FORCE_ROUTING) == 1;
    md->grouped = ctx && mt_knob_int(ctx, MT_KNOB_MOE_GROUPED) != 0;   /* the experts' GEMMs grouped (moe_experts.c) */
    md->dev_sizes = sizes_on_device(ctx, pc, md, cfg, md->why_host, sizeof md->why_host);
    md->gu_bf16 = moe_gu_bf16(pc, cfg);
    md->shared_gu = moe_shared_gu(pc, md, cfg);
}

/* the load histogram on the host: one copy of the backend's */
const double *moe_own_load(const struct mt_ops_i *ops, void *own)
{
    struct moe_own *o = own;
    if (!o || !o->s.load) return NULL;
    ops->copy_to_host(ops->be, o->s.load, o->s.load_d, (size_t)o->d.L * (size_t)(o->d.E + o->d.Z) * sizeof(double));
    return o->s.load;
}

int moe_own_gate_up_bf16(const void *own)
{
    return own ? ((const struct moe_own *)own)->d.gu_bf16 : 0;
}

int moe_own_device_sizes(const void *own, const char **why)
{
    const struct moe_own *o = own;
    *why = o->d.why_host;
    return o->d.dev_sizes;
}

void moe_own_load_reset(const struct mt_ops_i *ops, void *own)
{
    struct moe_own *o = own;
    const size_t LE = o ? (size_t)o->d.L * (size_t)(o->d.E + o->d.Z) : 0;
    if (o && o->s.load_d) ops->fill(ops->be, (float *)o->s.load_d, 0.0f, 2 * LE);   /* doubles of +0.0 bits */
}

const double *moe_own_losses(const struct mt_ops_i *ops, void *own, int l0, int l1)
{
    struct moe_own *o = own;
    ops->copy_to_host(ops->be, o->s.h_loss + 2 * (size_t)l0, o->s.loss + 2 * (size_t)l0,
                      (size_t)(l1 - l0) * 2 * sizeof(double));
    return o->s.h_loss;
}

static enum mt_status moe_check(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const struct mt_moe_dims *md = moe_dims(pc);
    if (md->E < 1 || md->Z < 0 || md->top_k < 1 || md->top_k > md->E + md->Z)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: need 1 <= top_k <= n_experts + n_null_experts (top_k=%d E=%d Z=%d)",
                            md->top_k, md->E, md->Z);
    if (md->Fe < 1) return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: expert_hidden=%d must be >= 1", md->Fe);
    if (md->Fs < 0) return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: shared_expert_hidden=%d < 0", md->Fs);
    return MT_OK;
}

/* router (E + Z) D, top_k routed experts 3 D Fe each, the shared expert 3 D Fs.
 * Convention with null experts (SPEC 1e): every slot counts as a real
 * expert's (an upper bound; the receipt's null share says how much of it
 * did not run), so the FLOPs stay a function of the config alone. */
static double moe_mm(const struct mt_block_shape *sh)
{
    const struct moe_gdims g = moe_gdims_of(sh), *s = &g;
    const double D = (double)sh->D;
    return (double)(s->E + s->Z) * D + (double)s->top_k * 3.0 * D * (double)s->Fe + 3.0 * D * (double)s->Fs;
}

static double moe_inactive(const struct mt_block_shape *sh)
{
    const struct moe_gdims g = moe_gdims_of(sh), *s = &g;
    return (double)((size_t)(s->E - s->top_k) * 3 * (size_t)sh->D * (size_t)s->Fe);
}

/* The planner's work beyond the GEMMs: as the dense MLP's over top_k
 * experts' and the shared expert's hidden units, plus the router's softmax
 * and the permute / combine copies of top_k rows of D. */
static void moe_work(const struct mt_block_shape *sh, int rc, struct mt_work *w)
{
    const struct moe_gdims g = moe_gdims_of(sh), *s = &g;
    const double D = (double)sh->D;
    const double hid = (double)s->top_k * (double)s->Fe + (double)s->Fs;
    const struct mt_config *c = sh->cfg;
    if (!dev_sizes_refusal(c, !strcmp(c->precision, "bf16"), sh->ep, (int)sh->D, sh->moe_dev_sizes)) {
        /* precision=bf16 on cuda with the device-sized grouped experts (sizes_on_device's
         * default case), 4-byte elements per token, k = top_k slots, Er = E + Z:
         * norm: forward reads x, writes h, x_out (3 D; + h's twin 0.5 D with a shared
         *   expert), backward reads dh, x, dx, writes dx (4 D).
         * forward: moe_permute_bf16 reads fp32 h rows, writes bf16 (1.5 k D);
         *   swiglu_forward_bf16_gu reads bf16 g, u, writes bf16 act (1.5 k Fe; g, u stored
         *   bf16 by their GEMMs: moe_gu_bf16); moe_combine reads out, k rows of y, writes
         *   out ((2 + k) D).
         * backward: moe_combine_backward_bf16 reads dy for the bf16 copies (1 + 0.5 k) D
         *   and dy, y for dgates (1 + k) D; the re-permute (1.5 k D);
         *   swiglu_backward_act_bf16_gud reads bf16 dact, g, u, writes bf16 act, dg, du (3 k Fe);
         *   moe_permute_backward writing dh (=, no fill: (1 + k) D).
         * a shared expert as the dense MLP on bf16 g, u (moe_shared_gu): 1.5 + 3 per hidden
         *   unit and its dy rounded once (1.5 D); router softmax, routing, aux and their backward:
         *   about 8 Er + 8 k. rc: the forward again. */
        const double k = (double)s->top_k, Fe = (double)s->Fe, Fs = (double)s->Fs, Er = (double)(s->E + s->Z);
        /* the residual gradient's twin (plan_norm_twin): the norm's backward writes it
         * (0.5 D); the shared expert's dy reads it instead of rounding */
        const double tw = plan_norm_twin(sh);
        const double sh_n = s->Fs > 0 ? 0.5 * D : 0.0, sh_e = s->Fs > 0 ? 4.5 * Fs + 1.5 * (1.0 - tw) * D : 0.0;
        w->e[MT_WORK_NORM] += 7.0 * D + 0.5 * tw * D + sh_n + rc * (3.0 * D + sh_n);
        w->e[MT_WORK_ELEMENTWISE] += 6.5 * k * D + 5.0 * D + 4.5 * k * Fe + sh_e + 8.0 * Er + 8.0 * k +
                                     rc * (2.5 * k * D + 2.0 * D + 1.5 * k * Fe + 1.5 * Fs + 4.0 * Er + 4.0 * k);
        /* the routed experts' three products (moe_mm's k 3 D Fe, x 6 + 2 rc as the
         * planner counts every GEMM) run on the grouped kernels: their own rate */
        w->f_grouped += (6.0 + 2.0 * rc) * k * 3.0 * D * Fe;
        return;
    }
    w->e[MT_WORK_NORM] += 5.0 * D + rc * 2.0 * D;
    w->e[MT_WORK_ELEMENTWISE] += 8.0 * hid + 6.0 * D + rc * (3.0 * hid + 3.0 * D);
    w->e[MT_WORK_ELEMENTWISE] += (8.0 * (double)s->top_k * D + 4.0 * (double)(s->E + s->Z)) * (1.0 + rc / 2.0);
}

/* Saved: routing (probs, lse, top-k, gates, slot positions), expert
 * pre-activations (on the receiving side under EP) and outputs. */
static void moe_carve(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    struct moe_state *st = pc->st;
    const struct mt_moe_dims *md = moe_dims(pc);
    const size_t D = (size_t)pc->D, Nm = (size_t)moe_nm(pc), E = (size_t)(md->E + md->Z), k = (size_t)md->top_k;
    const size_t M = (size_t)moe_m(pc), Fe = (size_t)md->Fe, ep = (size_t)pc->ep.ep;   /* E: every router column */
    const enum mt_bucket A = MT_BUCKET_ACTS, O = MT_BUCKET_OTHER;
    ffn_norm_carve_pc(pc, c, ly);
    /* the experts see Nm rows: SP or one rank: all of h_mlp_n; TP without SP: our slice of it */
    pc->nm->h = (pc->tp.tp > 1 && !pc->tp.sp && pc->nm->h_n) ? pc->nm->h_n + (size_t)moe_row0(pc) * D : pc->nm->h_n;
    /* precision=bf16 with a shared expert: the norm's bf16 twin (its gate/up operand), as
     * the dense MLP's (mlp_carve; not under SP: the gathered rows are fp32) */
    pc->nm->hb = NULL;
    if (md->Fs > 0 && pc->bf16 && !pc->tp.sp && (!pc->ops || pc->ops->rmsnorm_resid_forward_bf16))
        pc->nm->hb = carve(c, A, (size_t)pc->Nr * D * sizeof(mt_bf16));
    st->probs = carve_f(c, A, Nm * E);
    /* small, so not the block's last ACTS carve: a carve's end is not padded,
     * and recompute=block (one shared set, then the slots' inputs) must not
     * come out larger than the per-layer sets by that tail */
    st->f_share = carve_f(c, A, (size_t)pc->B * E);
    st->rlse = carve_f(c, A, Nm);
    st->topk = carve_i(c, A, Nm * k);
    st->gates = carve_f(c, A, Nm * k);
    st->pos = carve_i(c, A, Nm * k);
    st->src_row = carve_i(c, A, M);
    const size_t ebytes = md->gu_bf16 ? sizeof(mt_bf16) : sizeof(float);   /* eg, eu: bf16 where gu_bf16 */
    if (ep == 1) {
        st->eg = carve(c, A, M * Fe * ebytes);
        st->eu = carve(c, A, M * Fe * ebytes);
    }
    st->ey = carve_f(c, A, M * D);
    if (md->Fs > 0) {
        const size_t sb = md->shared_gu ? sizeof(mt_bf16) : sizeof(float);   /* bf16 where shared_gu */
        st->sgp = carve(c, A, Nm * (size_t)md->Fs * sb);
        st->sup = carve(c, A, Nm * (size_t)md->Fs * sb);
    }
    st->e_off = carve(c, O, (E + 1) * sizeof(int));
    st->e_off_d = carve_i(c, A, (E + 16) / 16 * 16);   /* E+1 used; whole 64-byte lines: no carve padding */
    if (ep > 1) {
        /* dropless: every rank of the expert group may send all its M slots here */
        size_t cap = ep * M;
        st->r_cnt = carve(c, O, ep * (size_t)pc->ep.Ee * sizeof(int));
        st->rx = carve_f(c, A, cap * D);
        st->eg = carve(c, A, cap * Fe * ebytes);   /* expert activations live on the receiving side */
        st->eu = carve(c, A, cap * Fe * ebytes);
    }
}

/* Scratch of every MoE layer (WORKSPACE), the host staging of routing and
 * the load histogram (OTHER): the piece's own struct mt_moe_scratch. */
static void moe_carve_scratch(const struct mt_piece_ctx *pc, struct mt_carver *c)
{
    const struct mt_moe_dims *md = moe_dims(pc);
    struct mt_moe_scratch *s = moe_scr(pc);
    const size_t D = (size_t)pc->D, Nm = (size_t)moe_nm(pc), E = (size_t)(md->E + md->Z), k = (size_t)md->top_k;
    const size_t M = (size_t)moe_m(pc), ep = (size_t)pc->ep.ep;   /* E: every router column (h_ecnt: real ones) */
    const enum mt_bucket W = MT_BUCKET_WORKSPACE, O = MT_BUCKET_OTHER;
    s->xp = carve_f(c, W, M * D);
    s->dxp = carve_f(c, W, M * D);
    s->dy = carve_f(c, W, M * D);
    s->xb = s->ab = s->db = NULL;
    if (moe_bf16_scratch(pc)) {
        /* the routed experts' operands (moe_experts.c); ab also the shared expert's bf16(act) */
        const size_t R = ep * M, Fe = (size_t)md->Fe, wd = D > Fe ? D : Fe, sh = Nm * (size_t)md->Fs;
        s->xb = carve(c, W, R * D * sizeof(mt_bf16));
        s->ab = carve(c, W, (R * Fe > sh ? R * Fe : sh) * sizeof(mt_bf16));
        s->db = carve(c, W, R * wd * sizeof(mt_bf16));
    }
    if (ep > 1) {
        s->ry = carve_f(c, W, ep * M * D);
        s->rdy = carve_f(c, W, ep * M * D);
        s->rdx = carve_f(c, W, ep * M * D);
    }
    s->load = (double *)carve(c, O, (size_t)md->L * E * sizeof(double));
    s->load_d = (double *)carve(c, W, (size_t)md->L * E * sizeof(double));
    s->h_a2a = carve(c, O, 4 * ep * sizeof(size_t));
    s->h_ecnt = carve(c, O, 2 * E * sizeof(int64_t));
    s->drl = carve_f(c, W, Nm * E);
    s->dprobs = carve_f(c, W, Nm * E);
    s->dgates = carve_f(c, W, Nm * k);
    s->dlse = carve_f(c, W, Nm);
    s->route_work = carve_i(c, W, mt_moe_route_work(M, E));
    s->seq = carve(c, W, (size_t)pc->B * E * 2 * sizeof(double));
    s->loss = carve(c, W, (size_t)md->L * 2 * sizeof(double));
    if (md->force_route) {   /* the test hook's host staging */
        s->h_probs = carve_f(c, O, Nm * E);
        s->h_dprobs = carve_f(c, O, Nm * E);
        s->h_topk = carve_i(c, O, Nm * k);
    }
    s->h_loss = carve(c, O, (size_t)md->L * 2 * sizeof(double));
}

/* the shared SwiGLU scratch: the widest expert batch (all slots of the
 * expert group may land here) or the shared expert over Nm rows */
static size_t moe_scratch(const struct mt_piece_ctx *pc)
{
    size_t a = (size_t)pc->ep.ep * (size_t)moe_m(pc) * (size_t)moe_dims(pc)->Fe, b = (size_t)moe_nm(pc) * (size_t)moe_dims(pc)->Fs;
    return a > b ? a : b;
}

/* LoRA's x A^T rows: an expert batch may take every slot of the expert
 * group (ep x Nm x top_k, Nm = N/tp under tp > 1) */
static void moe_proj_scratch(const struct mt_piece_ctx *pc, size_t *rows, size_t *cols)
{
    const size_t Nm = (size_t)(pc->tp.tp > 1 ? pc->N / pc->tp.tp : pc->N);
    const size_t em = Nm * (size_t)moe_dims(pc)->top_k * (size_t)(pc->ep.ep > 0 ? pc->ep.ep : 1);
    if (em > *rows) *rows = em;
    /* the shared expert's gate/up outputs: their dy rounds once into the model's bf16 dy scratch */
    if ((size_t)moe_dims(pc)->Fs > *cols) *cols = (size_t)moe_dims(pc)->Fs;
}

static enum mt_status moe_piece_forward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc, struct mt_piece_fwd *a)
{
    const struct mt_ops_i *ops = pc->ops;
    const struct mt_tp_axis *tp = &pc->tp;
    const int n = a->B * a->T, D = pc->D, Nm = moe_nm(pc);
    ffn_norm_fwd(pc, a->x_out, n, 0);   /* the router reads h in fp32 */
    if (tp->tp > 1 && !tp->sp) {
        /* MoE in the SP region without SP: our Nm rows, then gather every rank's output */
        ops->fill(ops->be, pc->s_red, 0.0f, (size_t)Nm * D);
        MT_CHECK(moe_forward(ctx, pc, pc->s_red, Nm, a->want_loss));
        MT_CHECK(tpa_gather_rows(ctx, tp, pc->s_full, pc->s_red, Nm, D));
        ops->axpby(ops->be, a->x_out, pc->s_full, 1.0f, 1.0f, (size_t)n * D);
    } else {
        MT_CHECK(moe_forward(ctx, pc, a->x_out, tp->tp > 1 ? Nm : n, a->want_loss));
    }
    return MT_OK;   /* aux, z: in moe_scr(pc)->loss, summed by the model (moe_own_losses) */
}

/* The router's loss parts (mt_model.h), registered by every model of the
 * family (a dense model's stay 0 and take no gradient: the receipt keeps
 * the same series whatever the pattern). */
void moe_loss_register(struct mt_model *m)
{
    const int a = model_loss_add(m, &(struct mt_loss_part){"aux", "moe router", m->cfg.aux_loss_coef,
                                                            MT_LOSS_PER_SEQUENCE, m->any_moe, 0});
    const int z = model_loss_add(m, &(struct mt_loss_part){"z", "moe router", m->cfg.z_loss_coef,
                                                            MT_LOSS_PER_TOKEN, m->any_moe, 0});
    MT_ASSERT(a == MT_LOSS_AUX && z == MT_LOSS_Z);
    (void)a;
    (void)z;
}

/* dx is d x_out = d x_in (identity) + d branch */
static enum mt_status moe_piece_backward(struct mt_ctx *ctx, const struct mt_piece_ctx *pc)
{
    const int D = pc->D, Nm = moe_nm(pc);
    const int tp_nosp = pc->tp.tp > 1 && !pc->tp.sp;   /* our Nm rows of a whole dx */
    const float *dhr = pc->dh;
    MT_CHECK(moe_backward(ctx, pc, pc->dh, pc->dx + (tp_nosp ? (size_t)moe_row0(pc) * D : 0)));
    if (tp_nosp) {
        MT_CHECK(tpa_gather_rows(ctx, &pc->tp, pc->s_full, pc->dh, Nm, D));
        dhr = pc->s_full;
    }
    ffn_norm_bwd(pc, dhr, NULL);
    return MT_OK;
}

/* a recompute re-routed the layer: take its slots back out of the load histogram */
static void moe_undo_recompute(const struct mt_piece_ctx *pc)
{
    const int E = moe_dims(pc)->E + moe_dims(pc)->Z;   /* the histogram's columns */
    const struct moe_state *st = pc->st;
    pc->ops->moe_count_acc(pc->ops->be, moe_scr(pc)->load_d + (size_t)pc->layer * (size_t)E, st->e_off_d, E, -1.0);
}

const struct mt_piece mt_piece_moe = {
    /* .name                  = */ "moe",
    /* .tp_regions            = */ 0,
    /* .sp_gathers            = */ 1,
    /* .params                = */ moe_params,
    /* .check                 = */ moe_check,
    /* .mm_per_token          = */ moe_mm,
    /* .extra_flops_per_token = */ NULL,
    /* .inactive_params       = */ moe_inactive,
    /* .work_per_token        = */ moe_work,
    /* .carve_scratch         = */ moe_carve_scratch,
    /* .ffn_scratch           = */ moe_scratch,
    /* .proj_scratch          = */ moe_proj_scratch,
    /* .carve                 = */ moe_carve,
    /* .forward               = */ moe_piece_forward,
    /* .backward              = */ moe_piece_backward,
    /* .undo_recompute        = */ moe_undo_recompute,
    /* .decode_floats         = */ NULL,
    /* .state_bytes           = */ sizeof(struct moe_state),
    /* .own_bytes             = */ sizeof(struct moe_own),
    /* .setup                 = */ moe_setup,
};
