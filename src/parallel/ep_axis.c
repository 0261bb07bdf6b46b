/*
 * ep_axis.c — the expert axis's all-to-alls, as the MoE layer uses them
 * (mt_axis.h: counts first, then the rows; the reverse exchange swaps send
 * and receive). Blocking: their time is exposed and accounted here.
 */
#include "mt_axis.h"

#include "mt_comm.h"

enum mt_status epa_exchange_counts(struct mt_ctx *ctx, const struct mt_ep_axis *a, const int64_t *send, int64_t *recv,
                                   size_t *scratch)
{
    const int ep = a->ep, Ee = a->Ee;
    size_t *cnt = scratch, *dis = scratch + ep;   /* Ee counts to and from every peer */
    for (int r = 0; r < ep; r++) {
        cnt[r] = (size_t)Ee;
        dis[r] = (size_t)r * (size_t)Ee;
    }
    double t0 = mt_time_sec();
    enum mt_status rc = mt_comm_alltoallv(ctx, a->comm_host, send, cnt, dis, recv, cnt, dis, MT_DTYPE_I64);
    a->stats->a2a_s += mt_time_sec() - t0;
    return rc;
}

void epa_row_counts(const struct mt_ep_axis *a, const int *e_off, const int *r_cnt, size_t *scnt, size_t *sdis,
                    size_t *rcnt, size_t *rdis)
{
    const int ep = a->ep, Ee = a->Ee;
    size_t off = 0;
    for (int r = 0; r < ep; r++) {
        sdis[r] = (size_t)e_off[r * Ee];
        scnt[r] = (size_t)(e_off[(r + 1) * Ee] - e_off[r * Ee]);
        size_t c = 0;
        for (int j = 0; j < Ee; j++) c += (size_t)r_cnt[r * Ee + j];
        rcnt[r] = c;
        rdis[r] = off;
        off += c;
    }
}

enum mt_status epa_alltoallv_rows(struct mt_ctx *ctx, const struct mt_ep_axis *a, float *recv, const float *send,
                                  const size_t *scnt, const size_t *sdis, const size_t *rcnt, const size_t *rdis,
                                  int width, size_t *scratch)
{
    const int ep = a->ep;
    size_t *e = scratch; /* element counts: 4 arrays of ep */
    double rows = 0;
    for (int r = 0; r < ep; r++) {
        e[r] = scnt[r] * (size_t)width;
        e[ep + r] = sdis[r] * (size_t)width;
        e[2 * ep + r] = rcnt[r] * (size_t)width;
        e[3 * ep + r] = rdis[r] * (size_t)width;
        if (r != a->rank) rows += (double)scnt[r] + (double)rcnt[r];
    }
    double t0 = mt_time_sec();
    enum mt_status rc = mt_comm_alltoallv(ctx, a->comm, send, e, e + ep, recv, e + 2 * ep, e + 3 * ep, MT_DTYPE_F32);
    a->stats->a2a_s += mt_time_sec() - t0;
    a->stats->a2a_calls++;
    a->stats->dispatch_bytes += rows * width * sizeof(float);
    return rc;
}
