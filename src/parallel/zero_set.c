/*
 * zero_set.c — the engines of one model driven as one (mt_zero.h, "the set
 * API"). A model has one ZeRO engine per reduction group (data x expert;
 * data x expert x model for parameters partial over the model axis; the
 * experts' group under EP), each with its own optimizer; every phase of the
 * step runs on all of them in the same order on every rank, so the
 * collectives they issue line up across ranks.
 */
#include "mt_zero.h"

#include <math.h>
#include <string.h>

#include "../optim/mt_optim.h"

void mt_zero_set_zero_grad(struct mt_zero_set *set, int step)
{
    for (int k = 0; k < set->n; k++) mt_zero_begin_step(set->z[k], step);
}

void mt_zero_set_mark_last(struct mt_zero_set *set, int last)
{
    for (int k = 0; k < set->n; k++) mt_zero_set_last_microbatch(set->z[k], last);
}

enum mt_status mt_zero_set_reduce(struct mt_ctx *ctx, struct mt_zero_set *set)
{
    for (int k = 0; k < set->n; k++) MT_CHECK(mt_zero_finish_grads(ctx, set->z[k]));
    return MT_OK;
}

/* norm = sqrt(sum over ranks of sum over engines of the owned grads' squares):
 * each parameter is owned by exactly one rank of its group and counted once */
enum mt_status mt_zero_set_clip_norm(struct mt_ctx *ctx, struct mt_zero_set *set, const unsigned char *count,
                                     struct mt_comm *comm, double *norm)
{
    double ss = 0;
    for (int k = 0; k < set->n; k++) ss += mt_zero_grad_sumsq_local(set->z[k], count);
    MT_CHECK(mt_comm_allreduce(ctx, comm, &ss, 1, MT_DTYPE_F64, MT_REDOP_SUM));
    *norm = sqrt(ss);
    return MT_OK;
}

enum mt_status mt_zero_set_nonfinite_culprit(struct mt_ctx *ctx, struct mt_zero_set *set, struct mt_comm *comm,
                                             int step)
{
    enum { NAME = 128 };
    char name[NAME] = "";
    for (int k = 0; k < set->n && !name[0]; k++) MT_CHECK(mt_zero_nonfinite_culprit(ctx, set->z[k], name, NAME));
    /* who: the lowest culprit rank; then its parameter name, summed from zeros */
    double who = name[0] ? (double)ctx->rank : 1e300, buf[NAME];
    MT_CHECK(mt_comm_allreduce(ctx, comm, &who, 1, MT_DTYPE_F64, MT_REDOP_MIN));
    if (who >= 1e300) return MT_OK;
    for (int c = 0; c < NAME; c++) buf[c] = who == (double)ctx->rank ? (double)(unsigned char)name[c] : 0.0;
    MT_CHECK(mt_comm_allreduce(ctx, comm, buf, NAME, MT_DTYPE_F64, MT_REDOP_SUM));
    for (int c = 0; c < NAME; c++) name[c] = (char)(unsigned char)buf[c];
    name[NAME - 1] = 0;
    return mt_ctx_error(ctx, MT_ERR_NUMERIC,
                        "non-finite gradient on rank %d in parameter %s at step %d (found before the reduction)",
                        (int)who, name, step);
}

enum mt_status mt_zero_set_step(struct mt_ctx *ctx, struct mt_zero_set *set, int step, double grad_norm)
{
    for (int k = 0; k < set->n; k++) MT_CHECK(mt_optim_step(ctx, set->opt[k], step, grad_norm));
    return MT_OK;
}

enum mt_status mt_zero_set_sync(struct mt_ctx *ctx, struct mt_zero_set *set)
{
    for (int k = 0; k < set->n; k++) MT_CHECK(mt_zero_sync_params(ctx, set->z[k]));
    return MT_OK;
}

void mt_zero_set_bf16_mark_fresh(struct mt_zero_set *set)
{
    for (int k = 0; k < set->n; k++) mt_zero_bf16_mark_fresh(set->z[k]);
}

enum mt_status mt_zero_set_init_params(struct mt_ctx *ctx, struct mt_zero_set *set, uint64_t seed)
{
    for (int k = 0; k < set->n; k++) MT_CHECK(mt_zero_init_params(ctx, set->z[k], seed));
    return MT_OK;
}

void mt_zero_set_get_stats(const struct mt_zero_set *set, struct mt_zero_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < set->n; k++) {
        struct mt_zero_stats z1;
        mt_zero_get_stats(set->z[k], &z1);
        for (int c = 0; c < MT_ZERO_COLL_COUNT; c++) {
            out->bytes[c] += z1.bytes[c];
            out->calls[c] += z1.calls[c];
        }
        out->wait_s += z1.wait_s;
        out->zeroed_floats += z1.zeroed_floats;
    }
}

void mt_zero_set_reset_stats(struct mt_zero_set *set)
{
    for (int k = 0; k < set->n; k++) mt_zero_reset_stats(set->z[k]);
}

int mt_zero_set_states(const struct mt_zero_set *set, struct mt_optim_state *st)
{
    int n = 0;
    for (int k = 0; k < set->n; k++)
        for (int j = 0; j < mt_optim_state_count(set->opt[k]); j++, n++)
            if (st) mt_optim_state_get(set->opt[k], j, &st[n]);
    return n;
}

void mt_zero_set_destroy(struct mt_ctx *ctx, struct mt_zero_set *set)
{
    for (int k = 0; k < MT_ZERO_MAX_ENGINES; k++) {
        mt_optim_destroy(ctx, set->opt[k]);
        mt_zero_destroy(ctx, set->z[k]);
        set->opt[k] = NULL;
        set->z[k] = NULL;
    }
    set->n = 0;
}
