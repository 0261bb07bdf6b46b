/*
 * mpi_collectives.c — run under mpirun (np=4) by tests/test_dist_mpi.sh.
 *
 *   mpi_collectives all       every collective on the world vs expected
 *                             values, non-blocking + wait, a batched P2P
 *                             ring, meshes dp=2,tp=2 / ep=2,tp=2 / pp=2,tp=2
 *                             (members, reuse, a collective per group) and
 *                             each rank's trace line;
 *   mpi_collectives badmesh   "--mesh tp=3" and dims {1,1,1,3}: every rank
 *                             must get MT_ERR_CONFIG (and not hang).
 * Each rank prints "rank R: OK" or "rank R: FAIL ..." lines; exit 0 only if
 * this rank saw no failure.
 */
#include "dist/mt_mesh.h"

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
        struct mt_mesh_dims bad = {1, 1, 1, 3};
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
