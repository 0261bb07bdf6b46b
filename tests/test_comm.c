/*
 * test_comm.c — the single-rank ("self") collectives: every collective is
 * the identity on a group of one; argument errors come back as statuses;
 * dtype sizes; allocation failure in create is reported and leaks nothing.
 */
#include "dist/mt_comm.h"

#include <stdio.h>
#include <string.h>

static int n_fail = 0;
#define EXPECT(cond)                                                              \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);    \
            n_fail++;                                                             \
        }                                                                         \
    } while (0)

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);

    EXPECT(mt_dtype_size(MT_DTYPE_F32) == 4);
    EXPECT(mt_dtype_size(MT_DTYPE_F64) == 8);
    EXPECT(mt_dtype_size(MT_DTYPE_I32) == 4);
    EXPECT(mt_dtype_size(MT_DTYPE_I64) == 8);
    EXPECT(mt_dtype_size(MT_DTYPE_U8) == 1);
    EXPECT(mt_dtype_size((enum mt_dtype)42) == 0);

    int world = -1, rank = -1;
    EXPECT(mt_dist_init(NULL, NULL, &world, &rank) == MT_OK);
    EXPECT(world == 1 && rank == 0);

    struct mt_comm *c = NULL;
    EXPECT(mt_comm_create_self(&ctx, &c) == MT_OK && c);
    EXPECT(mt_comm_size(c) == 1 && mt_comm_rank(c) == 0);

    /* allreduce: identity for every op */
    float x[5] = {1, -2, 3.5f, 0, 7};
    for (int op = MT_REDOP_SUM; op <= MT_REDOP_MIN; op++) {
        EXPECT(mt_comm_allreduce(&ctx, c, x, 5, MT_DTYPE_F32, (enum mt_redop)op) == MT_OK);
        EXPECT(x[0] == 1 && x[1] == -2 && x[2] == 3.5f && x[3] == 0 && x[4] == 7);
    }
    EXPECT(mt_comm_allreduce(&ctx, c, x, 5, MT_DTYPE_F32, (enum mt_redop)9) == MT_ERR_INVALID_ARG);
    EXPECT(mt_comm_allreduce(&ctx, c, NULL, 5, MT_DTYPE_F32, MT_REDOP_SUM) == MT_ERR_INVALID_ARG);
    EXPECT(mt_comm_allreduce(&ctx, c, NULL, 0, MT_DTYPE_F32, MT_REDOP_SUM) == MT_OK);
    EXPECT(mt_comm_allreduce(&ctx, NULL, x, 5, MT_DTYPE_F32, MT_REDOP_SUM) == MT_ERR_INVALID_ARG);
    EXPECT(strstr(mt_ctx_last_error(&ctx), "NULL communicator") != NULL);

    /* reduce_scatter: recv = send (one rank) */
    double s[4] = {1, 2, 3, 4}, r[4] = {0};
    EXPECT(mt_comm_reduce_scatter(&ctx, c, r, s, 4, MT_DTYPE_F64) == MT_OK);
    EXPECT(memcmp(r, s, sizeof s) == 0);

    /* allgather: out of place and in place */
    int32_t gi[3] = {7, 8, 9}, go[3] = {0};
    EXPECT(mt_comm_allgather(&ctx, c, go, gi, 3, MT_DTYPE_I32) == MT_OK);
    EXPECT(go[0] == 7 && go[1] == 8 && go[2] == 9);
    EXPECT(mt_comm_allgather(&ctx, c, go, go, 3, MT_DTYPE_I32) == MT_OK);
    EXPECT(go[0] == 7 && go[2] == 9);

    /* bcast: root 0 fine, root 1 is outside the group */
    int64_t b[2] = {5, 6};
    EXPECT(mt_comm_bcast(&ctx, c, b, 2, MT_DTYPE_I64, 0) == MT_OK && b[0] == 5 && b[1] == 6);
    EXPECT(mt_comm_bcast(&ctx, c, b, 2, MT_DTYPE_I64, 1) == MT_ERR_INVALID_ARG);

    /* alltoallv with displacements */
    uint8_t as[6] = {10, 11, 12, 13, 14, 15}, ar[6] = {0};
    size_t sc = 3, sd = 2, rcn = 3, rd = 1;
    EXPECT(mt_comm_alltoallv(&ctx, c, as, &sc, &sd, ar, &rcn, &rd, MT_DTYPE_U8) == MT_OK);
    EXPECT(ar[0] == 0 && ar[1] == 12 && ar[2] == 13 && ar[3] == 14 && ar[4] == 0);
    rcn = 2;
    EXPECT(mt_comm_alltoallv(&ctx, c, as, &sc, &sd, ar, &rcn, &rd, MT_DTYPE_U8) == MT_ERR_INVALID_ARG);

    EXPECT(mt_comm_barrier(&ctx, c) == MT_OK);

    /* non-blocking forms + wait; the request is freed by wait */
    size_t live0 = ctx.bytes_live_total;
    struct mt_comm_req *q1 = NULL, *q2 = NULL, *q3 = NULL;
    float y[3] = {1, 2, 3}, yr[3] = {0}, yg[3] = {0};
    EXPECT(mt_comm_iallreduce(&ctx, c, y, 3, MT_DTYPE_F32, MT_REDOP_SUM, &q1) == MT_OK && q1);
    EXPECT(mt_comm_ireduce_scatter(&ctx, c, yr, y, 3, MT_DTYPE_F32, &q2) == MT_OK && q2);
    EXPECT(mt_comm_iallgather(&ctx, c, yg, y, 3, MT_DTYPE_F32, &q3) == MT_OK && q3);
    EXPECT(mt_comm_wait(&ctx, q1) == MT_OK);
    EXPECT(mt_comm_wait(&ctx, q2) == MT_OK);
    EXPECT(mt_comm_wait(&ctx, q3) == MT_OK);
    EXPECT(mt_comm_wait(&ctx, NULL) == MT_OK);
    EXPECT(y[0] == 1 && y[2] == 3 && yr[1] == 2 && yg[2] == 3);
    EXPECT(ctx.bytes_live_total == live0);
    struct mt_comm_req *qbad = (struct mt_comm_req *)&ctx;
    EXPECT(mt_comm_iallreduce(&ctx, c, y, 3, (enum mt_dtype)99, MT_REDOP_SUM, &qbad) == MT_ERR_INVALID_ARG);
    EXPECT(qbad == NULL);

    /* batched p2p on a self group: recv matched with the send of its tag */
    float p_a[2] = {1, 2}, p_b[3] = {3, 4, 5}, r_a[2] = {0}, r_b[3] = {0};
    struct mt_p2p_op ops[4] = {
        {MT_P2P_RECV, 0, r_b, 3, MT_DTYPE_F32, 7},
        {MT_P2P_SEND, 0, p_a, 2, MT_DTYPE_F32, 3},
        {MT_P2P_SEND, 0, p_b, 3, MT_DTYPE_F32, 7},
        {MT_P2P_RECV, 0, r_a, 2, MT_DTYPE_F32, 3},
    };
    EXPECT(mt_comm_sendrecv_batch(&ctx, c, 4, ops) == MT_OK);
    EXPECT(r_a[0] == 1 && r_a[1] == 2 && r_b[0] == 3 && r_b[2] == 5);
    ops[3].count = 1; /* size mismatch */
    EXPECT(mt_comm_sendrecv_batch(&ctx, c, 4, ops) == MT_ERR_COMM);
    ops[3].count = 2;
    ops[3].peer = 1; /* outside the group */
    EXPECT(mt_comm_sendrecv_batch(&ctx, c, 4, ops) == MT_ERR_INVALID_ARG);
    EXPECT(strstr(mt_ctx_last_error(&ctx), "peer 1") != NULL);
    ops[3].peer = 0;
    ops[3].tag = 5; /* no send with tag 5 */
    EXPECT(mt_comm_sendrecv_batch(&ctx, c, 4, ops) == MT_ERR_COMM);
    EXPECT(mt_comm_sendrecv_batch(&ctx, c, 0, NULL) == MT_OK);

    mt_comm_destroy(c);
    mt_comm_destroy(NULL);

    /* the world without MPI initialised is one rank */
    struct mt_comm *w = NULL;
    EXPECT(mt_comm_create_world(&ctx, &w) == MT_OK && mt_comm_size(w) == 1);
    mt_comm_destroy(w);
    EXPECT(ctx.bytes_live_total == 0);

    /* allocation failure: reported, nothing leaked, *out NULL */
    ctx.fail_after = 1;
    c = (struct mt_comm *)&ctx;
    EXPECT(mt_comm_create_self(&ctx, &c) == MT_ERR_OOM && c == NULL);
    EXPECT(ctx.bytes_live_total == 0);

    mt_ctx_free(&ctx);
    if (n_fail) {
        fprintf(stderr, "test_comm: %d failure(s)\n", n_fail);
        return 1;
    }
    printf("test_comm: ok\n");
    return 0;
}
