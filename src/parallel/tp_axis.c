/*
 * tp_axis.c — the model axis's collectives, as the layers use them
 * (mt_axis.h says which collective enters and leaves a TP region).
 */
#include "mt_axis.h"

#include "../ops/mt_ops.h"
#include "mt_comm.h"

/* Accounting: payload bytes (the full buffer each call covers) and time spent
 * in the call, which is exposed: TP collectives block the layer that needs them. */
static enum mt_status account(const struct mt_tp_axis *a, enum mt_tp_coll k, size_t bytes, double t0,
                              enum mt_status rc)
{
    a->stats->bytes[k] += (double)bytes;
    a->stats->calls[k]++;
    a->stats->time_s += mt_time_sec() - t0;
    return rc;
}

enum mt_status tpa_gather_rows(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *out, const float *in, int rows,
                               int width)
{
    double t0 = mt_time_sec();
    size_t n = (size_t)rows * (size_t)width;
    return account(a, MT_TP_ALLGATHER, n * (size_t)a->tp * sizeof(float), t0,
                   mt_comm_allgather(ctx, a->comm, out, in, n, MT_DTYPE_F32));
}

enum mt_status tpa_reduce_scatter_rows(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *out, const float *in,
                                       int rows, int width)
{
    double t0 = mt_time_sec();
    size_t n = (size_t)rows * (size_t)width;
    return account(a, MT_TP_REDUCE_SCATTER, n * (size_t)a->tp * sizeof(float), t0,
                   mt_comm_reduce_scatter(ctx, a->comm, out, in, n, MT_DTYPE_F32));
}

enum mt_status tpa_allreduce(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *buf, size_t n)
{
    double t0 = mt_time_sec();
    return account(a, MT_TP_ALLREDUCE, n * sizeof(float), t0,
                   mt_comm_allreduce(ctx, a->comm, buf, n, MT_DTYPE_F32, MT_REDOP_SUM));
}

enum mt_status tpa_exit_add(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *x, float *part, float *tmp)
{
    const size_t D = (size_t)a->D;
    if (a->sp) {
        MT_CHECK(tpa_reduce_scatter_rows(ctx, a, tmp, part, a->Nr, a->D));
        a->ops->axpby(a->ops->be, x, tmp, 1.0f, 1.0f, (size_t)a->Nr * D);
    } else {
        MT_CHECK(tpa_allreduce(ctx, a, part, (size_t)a->N * D));
        a->ops->axpby(a->ops->be, x, part, 1.0f, 1.0f, (size_t)a->N * D);
    }
    return MT_OK;
}

enum mt_status tpa_allreduce_f64(struct mt_ctx *ctx, const struct mt_tp_axis *a, double *buf, size_t n)
{
    double t0 = mt_time_sec();
    return account(a, MT_TP_ALLREDUCE, n * sizeof(double), t0,
                   mt_comm_allreduce(ctx, a->comm, buf, n, MT_DTYPE_F64, MT_REDOP_SUM));
}
