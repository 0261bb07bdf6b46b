/*
 * pipe_axis.c — the pipe axis's point-to-point, as the 1F1B schedule
 * (src/train/pipeline.c) uses it (mt_axis.h). Activations go forward with
 * tag ACT, their gradients backward with tag GRAD, each to the same model
 * rank of the neighbour stage (the pipe group spans only the pipe axis).
 */
#include "mt_axis.h"

#include "mt_comm.h"

enum { TAG_ACT = 1, TAG_GRAD = 2 };

enum mt_status ppa_tick(struct mt_ctx *ctx, struct mt_comm *pipe, int stage, size_t count, const float *send_act,
                        float *recv_act, const float *send_grad, float *recv_grad)
{
    struct mt_p2p_op ops[4];
    int n = 0;
    if (send_act) ops[n++] = (struct mt_p2p_op){MT_P2P_SEND, stage + 1, (void *)send_act, count, MT_DTYPE_F32, TAG_ACT};
    if (recv_act) ops[n++] = (struct mt_p2p_op){MT_P2P_RECV, stage - 1, recv_act, count, MT_DTYPE_F32, TAG_ACT};
    if (send_grad)
        ops[n++] = (struct mt_p2p_op){MT_P2P_SEND, stage - 1, (void *)send_grad, count, MT_DTYPE_F32, TAG_GRAD};
    if (recv_grad) ops[n++] = (struct mt_p2p_op){MT_P2P_RECV, stage + 1, recv_grad, count, MT_DTYPE_F32, TAG_GRAD};
    if (n == 0) return MT_OK;
    return mt_comm_sendrecv_batch(ctx, pipe, n, ops);
}
