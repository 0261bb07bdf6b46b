/*
 * mpi_collectives.c — run under mpirun (np=4) by tests/test_dist_mpi.sh.
 *
 *   mpi_collectives all       every collective on the world vs expected
 *                             values (v-collectives: gaps, any block order,
 *                             a rank owning nothing, packed and direct
 *                             reduce_scatterv), non-blocking + wait (count
 *                             arrays clobbered before wait), a batched P2P
 *                             ring, meshes dp=2,tp=2 / ep=2,tp=2 / pp=2,tp=2
 *                             (members, reuse, a collective per group) and
 *                             each rank's trace line;
 *   mpi_collectives badmesh   "--mesh tp=3" and dims {1,1,1,3}: every rank
 *                             must get MT_ERR_CONFIG (and not hang).
 * Each rank prints "rank R: OK" or "rank R: FAIL ..." lines; exit 0 only if
 * this rank saw no failure.
 */
#include "parallel/mt_mesh.h"

#include <stdio.h>
#include <string.h>

static int n_fail = 0, g_rank = 0;
#define EXPECT(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            printf("rank %d: FAIL %s:%d: %s\n", g_rank, __FILE__, __LINE__, #cond);       \
            n_fail++;                                                                     \
        }                                                                                 \
    } while (0)
#define EXPECT_OK(call)                                                                   \
    do {                                                                                  \
        enum mt_status st_ = (call);                                                      \
        if (st_ != MT_OK) {                                                               \
            printf("rank %d: FAIL %s:%d: %s -> %s\n", g_rank, __FILE__, __LINE__, #call,  \
                   mt_ctx_last_error(&ctx));                                              \
            n_fail++;                                                                     \
        }                                                                                 \
    } while (0)

/* Variable-count collectives on the world (W == 4). Values are small
 * integers in float/double, so every sum is exact. */
static void test_world_v(struct mt_ctx *c_, struct mt_comm *w, int W, int R)
{
    struct mt_ctx ctx = *c_;
    if (W != 4) return;
    const float SENT = -7.0f;

    /* allgatherv, out of place, F32: blocks out of rank order with gaps at
     * 3 and 6; rank 1 owns nothing (NULL send) and its displacement points
     * past the end. Rank r's element k is 10r + k + 1. */
    {
        const size_t cnt[4] = {2, 0, 3, 1}, dsp[4] = {4, 99, 0, 7};
        float mine[3], all[9];
        for (size_t k = 0; k < cnt[R]; k++) mine[k] = (float)(10 * R + (int)k + 1);
        for (int j = 0; j < 9; j++) all[j] = SENT;
        EXPECT_OK(mt_comm_allgatherv(&ctx, w, all, R == 1 ? NULL : mine, cnt, dsp, MT_DTYPE_F32));
        const float want[9] = {21, 22, 23, SENT, 1, 2, SENT, 31, SENT};
        for (int j = 0; j < 9; j++) EXPECT(all[j] == want[j]);
    }

    /* allgatherv in place, F64: rank r's block (r elements) at displs
     * 6,3,1,0 — rank 0 owns nothing; each rank pre-fills only its own block. */
    {
        const size_t cnt[4] = {0, 1, 2, 3}, dsp[4] = {6, 0, 1, 3};
        double all[7];
        for (int j = 0; j < 7; j++) all[j] = -1;
        for (size_t k = 0; k < cnt[R]; k++) all[dsp[R] + k] = 100 * R + (int)k;
        EXPECT_OK(mt_comm_allgatherv(&ctx, w, all, all + dsp[R], cnt, dsp, MT_DTYPE_F64));
        const double want[7] = {100, 200, 201, 300, 301, 302, -1};
        for (int j = 0; j < 7; j++) EXPECT(all[j] == want[j]);
    }

    /* reduce_scatterv, consecutive displs (MPI reads send directly), F32;
     * rank 2 owns nothing and passes NULL recv. send_r[j] = (r+1)(j+1), so
     * recv[k] = 10 (displs[R] + k + 1). */
    {
        const size_t cnt[4] = {1, 3, 0, 2}, dsp[4] = {0, 1, 4, 4};
        float send[6], recv[4];
        for (int j = 0; j < 6; j++) send[j] = (float)((R + 1) * (j + 1));
        for (int k = 0; k < 4; k++) recv[k] = SENT;
        EXPECT_OK(mt_comm_reduce_scatterv(&ctx, w, R == 2 ? NULL : recv, send, cnt, dsp, MT_DTYPE_F32));
        for (size_t k = 0; k < cnt[R]; k++) EXPECT(recv[k] == (float)(10 * (dsp[R] + k + 1)));
        for (size_t k = cnt[R]; k < 4; k++) EXPECT(recv[k] == SENT);
        for (int j = 0; j < 6; j++) EXPECT(send[j] == (float)((R + 1) * (j + 1))); /* send untouched */
    }

    /* reduce_scatterv, non-consecutive displs (packed), F64: blocks
     * r1 [0,1) r3 [1,4) r0 [6,8), a gap at [4,6) holding junk that must not
     * leak into any sum; rank 2 owns nothing (displacement irrelevant). */
    {
        const size_t cnt[4] = {2, 1, 0, 3}, dsp[4] = {6, 0, 3, 1};
        double send[8], recv[4];
        for (int j = 0; j < 8; j++) send[j] = (j == 4 || j == 5) ? 1e9 * (R + 1) : (R + 1) * (j + 1);
        for (int k = 0; k < 4; k++) recv[k] = SENT;
        EXPECT_OK(mt_comm_reduce_scatterv(&ctx, w, recv, send, cnt, dsp, MT_DTYPE_F64));
        for (size_t k = 0; k < cnt[R]; k++) EXPECT(recv[k] == 10.0 * (double)(dsp[R] + k + 1));
        for (size_t k = cnt[R]; k < 4; k++) EXPECT(recv[k] == SENT);
    }

    /* the same consecutive layout shifted by a base offset of 2 */
    {
        const size_t cnt[4] = {2, 2, 1, 0}, dsp[4] = {2, 4, 6, 0};
        float send[7], recv[2] = {SENT, SENT};
        for (int j = 0; j < 7; j++) send[j] = (float)((R + 1) * (j + 1));
        EXPECT_OK(mt_comm_reduce_scatterv(&ctx, w, recv, send, cnt, dsp, MT_DTYPE_F32));
        for (size_t k = 0; k < cnt[R]; k++) EXPECT(recv[k] == (float)(10 * (dsp[R] + k + 1)));
        if (cnt[R] < 2) EXPECT(recv[1] == SENT);
    }

    /* non-blocking: an out-of-place iallgatherv, an in-place iallgatherv
     * and a packed ireduce_scatterv in flight together; their count and
     * displacement arrays are overwritten (and the scratch of the packed
     * one held) before the waits. */
    {
        size_t live0 = ctx.bytes_live_total;
        size_t gc[4] = {1, 2, 0, 3}, gd[4] = {5, 0, 9, 2};   /* recv 6: [r1 r1 r3 r3 r3 r0] */
        size_t ic[4] = {2, 2, 2, 2}, id[4] = {0, 2, 4, 6};   /* in place, consecutive */
        size_t rc_[4] = {3, 0, 1, 2}, rd[4] = {3, 0, 0, 1};  /* packed: r2 [0,1) r3 [1,3) r0 [3,6) */
        float gmine[3], gall[6], iall[8], rsend[6], rrecv[3];
        for (size_t k = 0; k < gc[R]; k++) gmine[k] = (float)(10 * R + (int)k);
        for (int j = 0; j < 6; j++) gall[j] = SENT;
        for (int j = 0; j < 8; j++) iall[j] = (j / 2 == R) ? (float)(R * 100 + j) : SENT;
        for (int j = 0; j < 6; j++) rsend[j] = (float)((R + 1) * (j + 1));
        for (int k = 0; k < 3; k++) rrecv[k] = SENT;
        const size_t my_rc = rc_[R], my_rd = rd[R];
        struct mt_comm_req *qa = NULL, *qb = NULL, *qc = NULL;
        EXPECT_OK(mt_comm_iallgatherv(&ctx, w, gall, gmine, gc, gd, MT_DTYPE_F32, &qa));
        EXPECT_OK(mt_comm_iallgatherv(&ctx, w, iall, iall + id[R], ic, id, MT_DTYPE_F32, &qb));
        EXPECT_OK(mt_comm_ireduce_scatterv(&ctx, w, rrecv, rsend, rc_, rd, MT_DTYPE_F32, &qc));
        EXPECT(ctx.bytes_live_total > live0); /* requests and their scratch held */
        memset(gc, 0xff, sizeof gc);
        memset(gd, 0xff, sizeof gd);
        memset(ic, 0xff, sizeof ic);
        memset(id, 0xff, sizeof id);
        memset(rc_, 0xff, sizeof rc_);
        memset(rd, 0xff, sizeof rd);
        EXPECT_OK(mt_comm_wait(&ctx, qc));
        EXPECT_OK(mt_comm_wait(&ctx, qa));
        EXPECT_OK(mt_comm_wait(&ctx, qb));
        EXPECT(ctx.bytes_live_total == live0);
        const float gwant[6] = {10, 11, 30, 31, 32, 0};
        for (int j = 0; j < 6; j++) EXPECT(gall[j] == gwant[j]);
        for (int j = 0; j < 8; j++) EXPECT(iall[j] == (float)((j / 2) * 100 + j));
        for (size_t k = 0; k < my_rc; k++) EXPECT(rrecv[k] == (float)(10 * (my_rd + k + 1)));
        for (size_t k = my_rc; k < 3; k++) EXPECT(rrecv[k] == SENT);
    }

    /* refused before MPI on every rank alike (no memory touched, nobody hangs) */
    {
        /* send ranges here span GiB upward from x (never touched): recv y
         * lives in static storage, below the stack, so it aliases none */
        static float y[4];
        float x[4] = {0};
        size_t big[4] = {1, 1, (size_t)1 << 33, 1}, d4[4] = {0, 1, 2, 3};
        EXPECT(mt_comm_allgatherv(&ctx, w, x, x + R, big, d4, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "count 8589934592 for rank 2 exceeds INT_MAX") != NULL);
        size_t one[4] = {1, 1, 1, 1}, fard[4] = {0, 1, (size_t)1 << 32, 3};
        EXPECT(mt_comm_allgatherv(&ctx, w, x, x, one, fard, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "displacement") != NULL);
        struct mt_comm_req *q = NULL;
        EXPECT(mt_comm_iallgatherv(&ctx, w, x, x, one, fard, MT_DTYPE_F32, &q) == MT_ERR_UNSUPPORTED && q == NULL);
        /* each count fits an int but the sum does not */
        size_t half[4] = {(size_t)INT32_MAX / 2 + 1, (size_t)INT32_MAX / 2 + 1, 0, 0}, hd[4] = {0, 0, 0, 0};
        hd[1] = half[0];
        EXPECT(mt_comm_reduce_scatterv(&ctx, w, R < 2 ? y : NULL, x, half, hd, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);
        EXPECT(strstr(mt_ctx_last_error(&ctx), "above INT_MAX") != NULL);
        EXPECT(mt_comm_ireduce_scatterv(&ctx, w, y, x, big, d4, MT_DTYPE_F32, &q) == MT_ERR_UNSUPPORTED && q == NULL);
        EXPECT(ctx.bytes_live_total == c_->bytes_live_total);
    }
    *c_ = ctx;
}

static void test_world(struct mt_ctx *c_, int W, int R)
{
    struct mt_ctx ctx = *c_;
    struct mt_comm *w = NULL;
    EXPECT_OK(mt_comm_create_world(&ctx, &w));
    if (!w) return;
    EXPECT(mt_comm_size(w) == W && mt_comm_rank(w) == R);

    /* allreduce, every dtype and op: x_r[i] = r + i */
    float f[3];
    double dd[3];
    int32_t i32[3];
    int64_t i64[3];
    uint8_t u8[3];
    for (int op = MT_REDOP_SUM; op <= MT_REDOP_MIN; op++) {
        for (int i = 0; i < 3; i++) {
            f[i] = (float)(R + i);
            dd[i] = R + i + 0.5;
            i32[i] = R * 1000 + i;
            i64[i] = (int64_t)(R + 1) << 40;
            u8[i] = (uint8_t)(R + i);
        }
        EXPECT_OK(mt_comm_allreduce(&ctx, w, f, 3, MT_DTYPE_F32, (enum mt_redop)op));
        EXPECT_OK(mt_comm_allreduce(&ctx, w, dd, 3, MT_DTYPE_F64, (enum mt_redop)op));
        EXPECT_OK(mt_comm_allreduce(&ctx, w, i32, 3, MT_DTYPE_I32, (enum mt_redop)op));
        EXPECT_OK(mt_comm_allreduce(&ctx, w, i64, 3, MT_DTYPE_I64, (enum mt_redop)op));
        EXPECT_OK(mt_comm_allreduce(&ctx, w, u8, 3, MT_DTYPE_U8, (enum mt_redop)op));
        int sumr = W * (W - 1) / 2;
        for (int i = 0; i < 3; i++) {
            if (op == MT_REDOP_SUM) {
                EXPECT(f[i] == (float)(sumr + W * i));
                EXPECT(dd[i] == sumr + W * (i + 0.5));
                EXPECT(i32[i] == 1000 * sumr + W * i);
                EXPECT(i64[i] == ((int64_t)(W * (W + 1) / 2) << 40));
                EXPECT(u8[i] == (uint8_t)(sumr + W * i));
            } else if (op == MT_REDOP_MAX) {
                EXPECT(f[i] == (float)(W - 1 + i) && i32[i] == 1000 * (W - 1) + i && i64[i] == ((int64_t)W << 40));
            } else {
                EXPECT(f[i] == (float)i && dd[i] == i + 0.5 && i32[i] == i && i64[i] == ((int64_t)1 << 40));
            }
        }
    }

    /* bf16 (grad_reduce_dtype=bf16): sum only, each pair widened to fp32,
     * added, rounded to nearest even. x_r = 1 + 2^-7 (0x3f81, 1.0 + 1 ulp):
     * W (1 + 2^-7) is a bf16 value for W = 1, 2, 4 (the ulp doubles with
     * the exponent), so every pairwise sum is exact; 256 (0x4380) sums to
     * 256 W; rank 0's 1.0 plus the others' 0 stays 1.0 */
    {
        uint16_t h[3] = {0x3f81, 0x4380, (uint16_t)(R == 0 ? 0x3f80 : 0x0000)};   /* 1+2^-8, 256, 1 or 0 */
        EXPECT_OK(mt_comm_allreduce(&ctx, w, h, 3, MT_DTYPE_BF16, MT_REDOP_SUM));
        float v[3];
        for (int i = 0; i < 3; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&v[i], &u, 4);
        }
        EXPECT(v[0] == (float)W * (1.0f + 1.0f / 128.0f) || (W != 1 && W != 2 && W != 4));
        EXPECT(v[1] == 256.0f * (float)W);
        EXPECT(v[2] == 1.0f);
        uint16_t s16[64], r16[2];
        for (int j = 0; j < 2 * W; j++) s16[j] = 0x3f80;   /* 1.0 */
        EXPECT_OK(mt_comm_reduce_scatter(&ctx, w, r16, s16, 2, MT_DTYPE_BF16));
        for (int k = 0; k < 2; k++) {
            uint32_t u = (uint32_t)r16[k] << 16;
            float x;
            memcpy(&x, &u, 4);
            EXPECT(x == (float)W);
        }
        EXPECT(mt_comm_allreduce(&ctx, w, h, 3, MT_DTYPE_BF16, MT_REDOP_MAX) == MT_ERR_INVALID_ARG);
    }

    /* reduce_scatter: send[j] = 100*r + j (j < W*2); recv[k] = sum_r send[R*2+k] */
    float send[64], recv[2];
    for (int j = 0; j < 2 * W; j++) send[j] = (float)(100 * R + j);
    EXPECT_OK(mt_comm_reduce_scatter(&ctx, w, recv, send, 2, MT_DTYPE_F32));
    for (int k = 0; k < 2; k++) EXPECT(recv[k] == (float)(100 * W * (W - 1) / 2 + W * (2 * R + k)));

    /* allgather, out of place and in place */
    int32_t mine[2] = {10 * R, 10 * R + 1}, all[64];
    memset(all, 0xff, sizeof all);
    EXPECT_OK(mt_comm_allgather(&ctx, w, all, mine, 2, MT_DTYPE_I32));
    for (int r = 0; r < W; r++) EXPECT(all[2 * r] == 10 * r && all[2 * r + 1] == 10 * r + 1);
    memset(all, 0xff, sizeof all);
    all[2 * R] = 7 * R;
    all[2 * R + 1] = 7 * R + 3;
    EXPECT_OK(mt_comm_allgather(&ctx, w, all, all + 2 * R, 2, MT_DTYPE_I32));
    for (int r = 0; r < W; r++) EXPECT(all[2 * r] == 7 * r && all[2 * r + 1] == 7 * r + 3);

    /* bcast from the last rank */
    double b[2] = {R, -R};
    EXPECT_OK(mt_comm_bcast(&ctx, w, b, 2, MT_DTYPE_F64, W - 1));
    EXPECT(b[0] == W - 1 && b[1] == -(W - 1));

    /* alltoallv: rank r sends (p+1) copies of 100*r+p to rank p */
    size_t sc[16], sd[16], rc[16], rd[16];
    int32_t abuf[64], rbuf[64];
    size_t off = 0;
    for (int p = 0; p < W; p++) {
        sc[p] = (size_t)p + 1;
        sd[p] = off;
        for (size_t k = 0; k < sc[p]; k++) abuf[off + k] = 100 * R + p;
        off += sc[p];
    }
    off = 0;
    for (int p = 0; p < W; p++) {
        rc[p] = (size_t)R + 1;
        rd[p] = off;
        off += rc[p];
    }
    memset(rbuf, 0, sizeof rbuf);
    EXPECT_OK(mt_comm_alltoallv(&ctx, w, abuf, sc, sd, rbuf, rc, rd, MT_DTYPE_I32));
    for (int p = 0; p < W; p++)
        for (size_t k = 0; k < rc[p]; k++) EXPECT(rbuf[rd[p] + k] == 100 * p + R);

    EXPECT_OK(mt_comm_barrier(&ctx, w));

    /* non-blocking: three in flight at once, then wait */
    float ar[4], rs_send[64], rs_recv[2];
    int32_t ag[64];
    for (int i = 0; i < 4; i++) ar[i] = (float)(R * i);
    for (int j = 0; j < 2 * W; j++) rs_send[j] = (float)(R + j);
    ag[R] = R * R;
    struct mt_comm_req *q1 = NULL, *q2 = NULL, *q3 = NULL;
    EXPECT_OK(mt_comm_iallreduce(&ctx, w, ar, 4, MT_DTYPE_F32, MT_REDOP_SUM, &q1));
    EXPECT_OK(mt_comm_ireduce_scatter(&ctx, w, rs_recv, rs_send, 2, MT_DTYPE_F32, &q2));
    EXPECT_OK(mt_comm_iallgather(&ctx, w, ag, ag + R, 1, MT_DTYPE_I32, &q3));
    EXPECT_OK(mt_comm_wait(&ctx, q3));
    EXPECT_OK(mt_comm_wait(&ctx, q1));
    EXPECT_OK(mt_comm_wait(&ctx, q2));
    for (int i = 0; i < 4; i++) EXPECT(ar[i] == (float)(i * W * (W - 1) / 2));
    for (int k = 0; k < 2; k++) EXPECT(rs_recv[k] == (float)(W * (W - 1) / 2 + W * (2 * R + k)));
    for (int r = 0; r < W; r++) EXPECT(ag[r] == r * r);

    test_world_v(&ctx, w, W, R);

    /* batched p2p ring: recv posted before send; two tags each way */
    int next = (R + 1) % W, prev = (R + W - 1) % W;
    float s1[3] = {(float)R, (float)R + 0.25f, (float)R + 0.5f}, r1[3] = {0};
    int64_t s2 = 1000 + R, r2 = 0;
    struct mt_p2p_op ops[4] = {
        {MT_P2P_RECV, prev, r1, 3, MT_DTYPE_F32, 1},
        {MT_P2P_RECV, next, &r2, 1, MT_DTYPE_I64, 2},
        {MT_P2P_SEND, next, s1, 3, MT_DTYPE_F32, 1},
        {MT_P2P_SEND, prev, &s2, 1, MT_DTYPE_I64, 2},
    };
    EXPECT_OK(mt_comm_sendrecv_batch(&ctx, w, 4, ops));
    EXPECT(r1[0] == (float)prev && r1[2] == (float)prev + 0.5f && r2 == 1000 + next);

    /* a count above INT_MAX is refused before MPI sees it (no memory touched) */
    EXPECT(mt_comm_reduce_scatter(&ctx, w, recv, send, (size_t)1 << 33, MT_DTYPE_F32) == MT_ERR_UNSUPPORTED);

    mt_comm_destroy(w);
    EXPECT(ctx.bytes_live_total == c_->bytes_live_total);
    *c_ = ctx;
}

/* members of group g on this rank as reported by the comm: allgather of world ranks */
static void check_group(struct mt_ctx *ctx_, struct mt_mesh *mesh, enum mt_mesh_group g)
{
    struct mt_ctx ctx = *ctx_;
    struct mt_comm *c = mt_mesh_comm(mesh, g);
    const struct mt_mesh_dims *d = mt_mesh_get_dims(mesh);
    int R = mt_mesh_rank(mesh);
    int want[64], got[64];
    int n = mt_mesh_group_members(d, R, g, want);
    EXPECT(c && mt_comm_size(c) == n);
    if (!c || mt_comm_size(c) != n) return;
    EXPECT(want[mt_comm_rank(c)] == R);
    int32_t me = R;
    int32_t allr[64];
    EXPECT_OK(mt_comm_allgather(&ctx, c, allr, &me, 1, MT_DTYPE_I32));
    for (int i = 0; i < n; i++) got[i] = allr[i];
    EXPECT(memcmp(got, want, (size_t)n * sizeof(int)) == 0);
    /* and a sum: the group's member ranks add up */
    double s = R, want_s = 0;
    for (int i = 0; i < n; i++) want_s += want[i];
    EXPECT_OK(mt_comm_allreduce(&ctx, c, &s, 1, MT_DTYPE_F64, MT_REDOP_SUM));
    EXPECT(s == want_s);
    *ctx_ = ctx;
}

static void test_mesh(struct mt_ctx *ctx_, const char *spec, int W, int R)
{
    struct mt_ctx ctx = *ctx_;
    struct mt_mesh_dims d;
    EXPECT_OK(mt_mesh_parse(&ctx, spec, W, &d));
    struct mt_mesh *mesh = NULL;
    EXPECT_OK(mt_mesh_create(&ctx, &d, NULL, 1, &mesh));
    if (!mesh) return;
    for (int g = 0; g < MT_MESH_GROUP_COUNT; g++) {
        check_group(&ctx, mesh, (enum mt_mesh_group)g);
        enum mt_mesh_group src;
        int reused = mt_mesh_group_reused(mesh, (enum mt_mesh_group)g, &src);
        EXPECT(src == mt_mesh_group_source(&d, R, (enum mt_mesh_group)g));
        EXPECT(reused == (src != (enum mt_mesh_group)g));
        if (reused) EXPECT(mt_mesh_comm(mesh, (enum mt_mesh_group)g) == mt_mesh_comm(mesh, src));
    }
    if (d.dp == 2 && d.ep == 1 && d.tp == 2) {
        enum mt_mesh_group src;
        EXPECT(mt_mesh_group_reused(mesh, MT_MESH_GROUP_DATA_EXPERT, &src) && src == MT_MESH_GROUP_DATA);
        EXPECT(mt_mesh_data_expert_comm(mesh) == mt_mesh_data_comm(mesh));
        EXPECT(mt_mesh_stage_comm(mesh) == mt_mesh_world_comm(mesh));
        EXPECT(mt_mesh_expert_comm(mesh) == mt_mesh_pipe_comm(mesh) && mt_comm_size(mt_mesh_pipe_comm(mesh)) == 1);
        EXPECT(mt_mesh_get_preds(mesh)->sp_on == 1 && mt_mesh_get_preds(mesh)->ep_active == 0);
    }
    char line[2048];
    mt_mesh_trace_line(mesh, line, sizeof line);
    printf("rank %d: %s: %s\n", R, spec, line);
    mt_mesh_destroy(mesh);
    EXPECT(ctx.bytes_live_total == ctx_->bytes_live_total);
    *ctx_ = ctx;
}

int main(int argc, char **argv)
{
    int W = 0, R = 0;
    if (mt_dist_init(&argc, &argv, &W, &R) != MT_OK) {
        printf("rank ?: FAIL mt_dist_init\n");
        return 1;
    }
    g_rank = R;
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    ctx.rank = R;
    const char *mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "badmesh") == 0) {
        struct mt_mesh_dims d;
        enum mt_status st = mt_mesh_parse(&ctx, "tp=3", W, &d);
        printf("rank %d: badmesh parse -> %s: %s\n", R, mt_status_str(st), mt_ctx_last_error(&ctx));
        EXPECT(st == MT_ERR_CONFIG);
        struct mt_mesh_dims bad = {.pp = 1, .dp = 1, .ep = 1, .tp = 3, .sp = 0};
        struct mt_mesh *mesh = NULL;
        st = mt_mesh_create(&ctx, &bad, NULL, 0, &mesh);
        printf("rank %d: badmesh create -> %s: %s\n", R, mt_status_str(st), mt_ctx_last_error(&ctx));
        EXPECT(st == MT_ERR_CONFIG && mesh == NULL);
    } else {
        EXPECT(W == 4);
        test_world(&ctx, W, R);
        test_mesh(&ctx, "dp=2,tp=2", W, R);
        test_mesh(&ctx, "ep=2,tp=2", W, R);
        test_mesh(&ctx, "pp=2,tp=2", W, R);
        test_mesh(&ctx, "tp=4", W, R);
        test_mesh(&ctx, "dp=4", W, R);
        EXPECT(ctx.bytes_live_total == 0);
    }
    if (!n_fail) printf("rank %d: OK %s\n", R, mode);
    fflush(stdout);
    mt_dist_finalize();
    return n_fail ? 1 : 0;
}
