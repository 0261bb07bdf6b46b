/*
 * test_comm.c — the single-rank ("self") collectives: every collective is
 * the identity on a group of one; argument errors come back as statuses;
 * dtype sizes; allocation failure in create is reported and leaks nothing.
 * Variable-count forms (allgatherv / reduce_scatterv, blocking and not):
 * the one block lands at / comes from displs[0], count 0 touches nothing,
 * argument errors, and a NULL table entry is MT_ERR_UNSUPPORTED.
 * The collective watchdog (in process: a collective marked in progress past
 * the timeout fires once, never before it; completed ones never fire) and
 * the agreement on one rank.
 */
#include "parallel/comm_impl.h" /* a table with NULL v-entries: MT_ERR_UNSUPPORTED */

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "mt_test.h"


/* ---- the collective watchdog and the agreement (issue 13) ---- */

static atomic_int expired_count;
static void on_expire(void) { atomic_fetch_add(&expired_count, 1); } /* returns: the thread ends */

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_watchdog_and_agree(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    /* off / bad arguments */
    EXPECT(mt_comm_watchdog_start(&ctx, 0, on_expire) == MT_OK);     /* 0: off, starts nothing */
    EXPECT(mt_comm_wd_enter("allreduce", 2) == 0);
    EXPECT(mt_comm_watchdog_start(&ctx, 1, NULL) == MT_ERR_INVALID_ARG);
    mt_comm_watchdog_stop();                                         /* not running: no-op */

    /* collectives that complete never fire, however many, however long in all */
    EXPECT(mt_comm_watchdog_start(&ctx, 0.3, on_expire) == MT_OK);
    EXPECT(mt_comm_watchdog_start(&ctx, 0.3, on_expire) == MT_ERR_INVALID_ARG); /* one per process */
    double t0 = mt_time_sec();
    while (mt_time_sec() - t0 < 1.0) {
        int e = mt_comm_wd_enter("allreduce", 2);
        EXPECT(e == 1);
        sleep_s(0.05); /* each one well under the timeout */
        mt_comm_wd_leave(e);
    }
    EXPECT(mt_comm_wd_enter("allreduce", 1) == 0); /* a group of one never waits for anyone */
    /* nothing in progress for longer than the timeout: no fire either */
    sleep_s(0.6);
    EXPECT(atomic_load(&expired_count) == 0);

    /* one collective stuck past the timeout fires once, not before it */
    mt_comm_watchdog_set_step(7);
    t0 = mt_time_sec();
    int e = mt_comm_wd_enter("ireduce_scatterv", 2);
    int inner = mt_comm_wd_enter("allreduce", 2); /* nested: the outermost is reported */
    while (atomic_load(&expired_count) == 0 && mt_time_sec() - t0 < 5) sleep_s(0.01);
    double fired_after = mt_time_sec() - t0;
    mt_comm_wd_leave(inner);
    mt_comm_wd_leave(e);
    EXPECT(atomic_load(&expired_count) == 1);
    EXPECT(fired_after >= 0.3 && fired_after < 0.3 + 0.5);
    mt_comm_watchdog_stop();
    mt_comm_watchdog_set_step(-1);

    /* agreement on one rank: the local status, its message kept */
    struct mt_comm *self = NULL;
    EXPECT(mt_comm_create_self(&ctx, &self) == MT_OK);
    EXPECT(mt_comm_agree(&ctx, self, MT_OK, "setup") == MT_OK);
    EXPECT(mt_comm_agree(&ctx, NULL, MT_OK, "setup") == MT_OK); /* a world group made for it */
    mt_ctx_error(&ctx, MT_ERR_IO, "cannot open data path 'x'");
    EXPECT(mt_comm_agree(&ctx, self, MT_ERR_IO, "setup") == MT_ERR_IO);
    EXPECT(!strcmp(mt_ctx_last_error(&ctx), "cannot open data path 'x'"));
    EXPECT(mt_comm_agree(&ctx, NULL, MT_ERR_IO, "setup") == MT_ERR_IO);
    mt_comm_destroy(self);
    EXPECT(ctx.bytes_live_total == 0);
    mt_ctx_free(&ctx);
}

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

    /* allgatherv: send (counts[0]) lands at recv + displs[0]; the rest untouched */
    {
        float vs[3] = {4, 5, 6}, vr[6] = {-1, -1, -1, -1, -1, -1};
        size_t cnt = 3, dsp = 2;
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, &cnt, &dsp, MT_DTYPE_F32) == MT_OK);
        EXPECT(vr[0] == -1 && vr[1] == -1 && vr[2] == 4 && vr[3] == 5 && vr[4] == 6 && vr[5] == -1);
        /* in place: send is recv + displs[0] */
        double vd[4] = {-1, 7, 8, -1};
        cnt = 2;
        dsp = 1;
        EXPECT(mt_comm_allgatherv(&ctx, c, vd, vd + 1, &cnt, &dsp, MT_DTYPE_F64) == MT_OK);
        EXPECT(vd[0] == -1 && vd[1] == 7 && vd[2] == 8 && vd[3] == -1);
        /* count 0: NULL buffers allowed, nothing touched, any displacement */
        cnt = 0;
        dsp = (size_t)-1;
        EXPECT(mt_comm_allgatherv(&ctx, c, NULL, NULL, &cnt, &dsp, MT_DTYPE_F32) == MT_OK);
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, NULL, &cnt, &dsp, MT_DTYPE_F32) == MT_OK && vr[0] == -1 && vr[2] == 4);
        /* argument errors */
        cnt = 3;
        dsp = 0;
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, NULL, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "allgatherv: NULL count or displacement") != NULL);
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, &cnt, NULL, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_allgatherv(&ctx, c, NULL, vs, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, NULL, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, &cnt, &dsp, (enum mt_dtype)42) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_allgatherv(&ctx, NULL, vr, vs, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        dsp = (size_t)-2; /* displs + counts overflows */
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "overflows") != NULL);
        cnt = (size_t)1 << 62; /* bytes overflow */
        dsp = 0;
        EXPECT(mt_comm_allgatherv(&ctx, c, vr, vs, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_INVALID_ARG);
    }

    /* reduce_scatterv: recv (counts[0]) = send[displs[0] ..] */
    {
        double vs[6] = {1, 2, 3, 4, 5, 6}, vr[4] = {-1, -1, -1, -1};
        size_t cnt = 3, dsp = 2;
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vr, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_OK);
        EXPECT(vr[0] == 3 && vr[1] == 4 && vr[2] == 5 && vr[3] == -1);
        EXPECT(vs[0] == 1 && vs[5] == 6);
        cnt = 0;
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, NULL, NULL, &cnt, &dsp, MT_DTYPE_F64) == MT_OK);
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vr, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_OK && vr[0] == 3);
        /* recv must not alias send: in place, and a partial overlap */
        cnt = 2;
        dsp = 1;
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vs + 1, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_ERR_INVALID_ARG);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "must not alias") != NULL);
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vs + 2, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_ERR_INVALID_ARG);
        /* but recv in a part of the buffer no block covers is fine */
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vs + 3, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_OK);
        EXPECT(vs[3] == 2 && vs[4] == 3 && vs[1] == 2);
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vr, NULL, &cnt, &dsp, MT_DTYPE_F64) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, NULL, vs, &cnt, &dsp, MT_DTYPE_F64) == MT_ERR_INVALID_ARG);
        EXPECT(mt_comm_reduce_scatterv(&ctx, c, vr, vs, &cnt, NULL, MT_DTYPE_F64) == MT_ERR_INVALID_ARG);
    }

    /* non-blocking v-forms: counts/displs may die right after the call */
    {
        size_t live_v = ctx.bytes_live_total;
        float gs[2] = {1, 2}, gr[4] = {0}, rs[5] = {9, 9, 3, 4, 9}, rr[2] = {0};
        size_t gcnt = 2, gdsp = 1, rcnt = 2, rdsp = 2;
        struct mt_comm_req *qa = NULL, *qb = NULL;
        EXPECT(mt_comm_iallgatherv(&ctx, c, gr, gs, &gcnt, &gdsp, MT_DTYPE_F32, &qa) == MT_OK && qa);
        EXPECT(mt_comm_ireduce_scatterv(&ctx, c, rr, rs, &rcnt, &rdsp, MT_DTYPE_F32, &qb) == MT_OK && qb);
        gcnt = rcnt = 99;
        gdsp = rdsp = 99;
        EXPECT(mt_comm_wait(&ctx, qb) == MT_OK);
        EXPECT(mt_comm_wait(&ctx, qa) == MT_OK);
        EXPECT(gr[0] == 0 && gr[1] == 1 && gr[2] == 2 && gr[3] == 0);
        EXPECT(rr[0] == 3 && rr[1] == 4);
        EXPECT(ctx.bytes_live_total == live_v);
        /* errors: *req NULL on return, nothing allocated */
        struct mt_comm_req *qe = (struct mt_comm_req *)&ctx;
        gcnt = 2;
        gdsp = 1;
        EXPECT(mt_comm_iallgatherv(&ctx, c, gr, gs, NULL, &gdsp, MT_DTYPE_F32, &qe) == MT_ERR_INVALID_ARG && qe == NULL);
        EXPECT(mt_comm_iallgatherv(&ctx, c, gr, gs, &gcnt, &gdsp, MT_DTYPE_F32, NULL) == MT_ERR_INVALID_ARG);
        qe = (struct mt_comm_req *)&ctx;
        rcnt = 2;
        rdsp = 0;
        EXPECT(mt_comm_ireduce_scatterv(&ctx, c, rs + 1, rs, &rcnt, &rdsp, MT_DTYPE_F32, &qe) == MT_ERR_INVALID_ARG);
        EXPECT(qe == NULL);
        EXPECT(mt_comm_ireduce_scatterv(&ctx, c, rr, rs, &rcnt, &rdsp, MT_DTYPE_F32, NULL) == MT_ERR_INVALID_ARG);
        /* allocation failure of the request: reported, *req NULL, nothing leaked */
        ctx.fail_after = 1;
        qe = (struct mt_comm_req *)&ctx;
        EXPECT(mt_comm_ireduce_scatterv(&ctx, c, rr, rs, &rcnt, &rdsp, MT_DTYPE_F32, &qe) == MT_ERR_OOM && qe == NULL);
        EXPECT(ctx.bytes_live_total == live_v);
    }

    /* a table without the v-entries: each call reports MT_ERR_UNSUPPORTED by name */
    {
        struct mt_comm_i t = mt_comm_self_iface;
        t.name = "nov";
        t.allgatherv = NULL;
        t.reduce_scatterv = NULL;
        t.iallgatherv = NULL;
        t.ireduce_scatterv = NULL;
        struct mt_comm fake = *c;
        fake.iface = &t;
        float ua[2] = {1, 2}, ub[2];
        size_t cnt = 2, dsp = 0;
        struct mt_comm_req *qu = (struct mt_comm_req *)&ctx;
        EXPECT(mt_comm_allgatherv(&ctx, &fake, ub, ua, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "allgatherv is not supported by the 'nov'") != NULL);
        EXPECT(mt_comm_reduce_scatterv(&ctx, &fake, ub, ua, &cnt, &dsp, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);
        EXPECT(mt_comm_iallgatherv(&ctx, &fake, ub, ua, &cnt, &dsp, MT_DTYPE_F32, &qu) == MT_ERR_UNSUPPORTED && !qu);
        qu = (struct mt_comm_req *)&ctx;
        EXPECT(mt_comm_ireduce_scatterv(&ctx, &fake, ub, ua, &cnt, &dsp, MT_DTYPE_F32, &qu) == MT_ERR_UNSUPPORTED && !qu);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "ireduce_scatterv is not supported") != NULL);
    }

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
    test_watchdog_and_agree();
    if (n_fail) {
        fprintf(stderr, "test_comm: %d failure(s)\n", n_fail);
        return 1;
    }
    printf("test_comm: ok\n");
    return 0;
}
