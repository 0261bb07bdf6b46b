/*
 * mt_axis.h — the model (TP / SP) and expert (EP) axes as the layers use
 * them: the handle a piece holds for each axis, the collectives it issues
 * through it, and their accounting; and the pipe axis's point-to-point
 * between neighbour stages (pipe_axis.c, `ppa_`), for the trainer's 1F1B
 * schedule. The layers never call mt_comm.h themselves; these wrappers are
 * where a model-axis, expert-axis or pipe-axis collective lives (tp_axis.c,
 * ep_axis.c, pipe_axis.c), next to the mesh that made the groups.
 *
 * Model axis. Rows are token rows of the microbatch (N = B*T). Under SP each
 * rank holds a contiguous block of Nr = N/tp rows, block r on rank r, so
 * entering a TP region is an all-gather in rank order and leaving it a
 * reduce-scatter: no permutation is ever needed (a [B, T, D] layout sharded
 * on its flattened rows; Megatron's [T, B, D] sharded on T is the same idea).
 *
 *   forward                          backward (the conjugates)
 *   SP entry   all-gather rows       reduce-scatter rows
 *   SP exit    reduce-scatter rows   all-gather rows
 *   no SP exit all-reduce            (entry's conjugate) all-reduce
 *
 * Expert axis (dropless MoE, ep > 1). Rank r owns experts
 * [r*Ee, (r+1)*Ee); the slots sorted by expert send the rows of those
 * experts to r. One all-to-all of per-expert counts first (every rank joins
 * it, even with nothing to send: zero is a valid count), then the rows by an
 * all-to-all-v; the reverse all-to-all brings the outputs (and in the
 * backward the gradients) back. Callers check tp > 1 / ep > 1: no call here
 * is a no-op on a group of one.
 */
#ifndef MT_AXIS_H
#define MT_AXIS_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"

struct mt_comm;
struct mt_ops_i;

/* Model-axis collectives issued by the layers (cumulative since create). */
enum mt_tp_coll { MT_TP_ALLGATHER = 0, MT_TP_REDUCE_SCATTER, MT_TP_ALLREDUCE, MT_TP_COLL_COUNT };
struct mt_tp_stats {
    double bytes[MT_TP_COLL_COUNT];  /* payload: the full (gathered / pre-scatter) buffer */
    long   calls[MT_TP_COLL_COUNT];
    double time_s;                   /* inside the calls (blocking: all of it is exposed) */
};

/* Expert-axis all-to-alls (cumulative since create). */
struct mt_ep_stats {
    double dispatch_bytes;   /* rows sent + received by the token all-to-alls, fwd + bwd (bytes) */
    double a2a_s;            /* time in the all-to-alls (blocking: exposed)                       */
    long   a2a_calls;
};

struct mt_tp_axis {              /* the model (TP / SP) axis                        */
    struct mt_comm        *comm;     /* model group (tp > 1 only)                   */
    struct mt_tp_stats    *stats;    /* accounting of the model's TP collectives    */
    const struct mt_ops_i *ops;
    int tp, sp;                      /* group size; 1: sequence parallel            */
    int N, Nr, D;                    /* rows in a TP region, residual rows, width   */
    struct mt_comm        *comm_host; /* host statistics (= comm on the cpu backend) */
    int rank;                        /* this rank in the model group                */
};

struct mt_ep_axis {              /* the expert axis (MoE, ep > 1)                   */
    struct mt_comm     *comm;        /* expert group                                */
    struct mt_comm     *comm_host;   /* host counts (= comm on the cpu backend)     */
    struct mt_ep_stats *stats;       /* accounting of the all-to-alls               */
    int ep, rank, Ee, e0;            /* group size, rank, local experts, first one  */
};

/* ---- tp_axis.c ---- */
enum mt_status tpa_gather_rows(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *out, const float *in, int rows,
                               int width);
enum mt_status tpa_reduce_scatter_rows(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *out, const float *in,
                                       int rows, int width);
enum mt_status tpa_allreduce(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *buf, size_t n);
/* Leave a TP region: `part` (N, D) holds this rank's partial sum of the
 * region's output; add the full sum of this rank's residual rows into
 * x (Nr, D). SP: reduce-scatter; no SP: all-reduce. `part` is clobbered;
 * `tmp` (Nr, D) is scratch for the SP case. */
enum mt_status tpa_exit_add(struct mt_ctx *ctx, const struct mt_tp_axis *a, float *x, float *part, float *tmp);
/* sum of n doubles (backend memory: the MoE routing statistics) over the
 * model group, on its device communicator (the host one on the cpu backend) */
enum mt_status tpa_allreduce_f64(struct mt_ctx *ctx, const struct mt_tp_axis *a, double *buf, size_t n);

/* ---- ep_axis.c ---- */
/* The per-expert counts: send[e] = rows this rank routes to expert e (all E
 * = ep*Ee experts, host int64); recv[r*Ee + j] = rows rank r routes to this
 * rank's local expert j. scratch: 2*ep size_t. */
enum mt_status epa_exchange_counts(struct mt_ctx *ctx, const struct mt_ep_axis *a, const int64_t *send, int64_t *recv,
                                   size_t *scratch);
/* Rows per peer, from the sorted slots' expert offsets e_off (E+1: rank r's
 * rows are [e_off[r*Ee], e_off[(r+1)*Ee])) and the received counts r_cnt
 * (ep*Ee, as epa_exchange_counts gave): what this rank sends (scnt, sdis)
 * and receives (rcnt, rdis, grouped [source][local expert]), in rows. */
void epa_row_counts(const struct mt_ep_axis *a, const int *e_off, const int *r_cnt, size_t *scnt, size_t *sdis,
                    size_t *rcnt, size_t *rdis);
/* all-to-all-v of rows of `width` floats: (s*) what we send, (r*) what we
 * get, in rows; the reverse exchange swaps the two. scratch: 4*ep size_t. */
enum mt_status epa_alltoallv_rows(struct mt_ctx *ctx, const struct mt_ep_axis *a, float *recv, const float *send,
                                  const size_t *scnt, const size_t *sdis, const size_t *rcnt, const size_t *rdis,
                                  int width, size_t *scratch);

/* ---- the pipe axis (pipe_axis.c) ---- */

/* One tick of the pipeline on stage `stage` of the pipe group `pipe`: any of
 * send this stage's output activations to stage+1, receive the input from
 * stage-1, send the input gradient to stage-1, receive the output gradient
 * from stage+1 (NULL: not this tick), `count` floats each, as ONE batched
 * operation (every send and receive posted, one wait-all): no ordering of
 * the pairs can deadlock. Nothing to do returns MT_OK. */
enum mt_status ppa_tick(struct mt_ctx *ctx, struct mt_comm *pipe, int stage, size_t count, const float *send_act,
                        float *recv_act, const float *send_grad, float *recv_grad);

#endif
