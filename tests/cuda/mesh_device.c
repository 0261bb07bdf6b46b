/*
 * mesh_device.c — the device communicators of a one-rank mesh on the cuda
 * backend (src/parallel/mt_mesh.h, mt_mesh_create_nccl), on a GPU or under the
 * CPU emulator (tests/test_cuda_build.sh).
 *
 * A one-rank world needs neither MPI nor NCCL: every group's device
 * communicator is the one "self_dev" comm, whose copies go through the
 * backend's copy. The test wraps ops->copy in a counter, so it sees that
 * each collective that must move data does so through the backend exactly
 * once (and the in-place forms not at all) — on a GPU a host memmove on
 * these device pointers would crash instead. Also: the host mesh is
 * unchanged (device comm == host comm, no "dev=" in the trace), the trace
 * of the device mesh, argument errors, and no leak under injected
 * allocation failures. Exit 0 when every check passes, 77 (ctest's skip
 * code) with "SKIPPED (no GPU: ...)" where no device is present, 1 otherwise.
 *
 * `mesh_device --host-comm` instead runs one collective of the HOST mesh
 * (the plain self comm: memmove) on device buffers — what a trainer that
 * passes mt_mesh_comm() groups to device buffers does. On a GPU that is a
 * segmentation fault; under the emulator's device-memory guard too (the
 * test script expects the guard's message).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "parallel/mt_comm.h"
#include "parallel/mt_mesh.h"
#include "ops/mt_ops.h"
#include "ops/cuda/mt_ops_cuda.h"

static const struct mt_ops_i *g_ops;
static long g_copies, g_fail, g_pass;

static void copy_counted(void *be, void *dst, const void *src, size_t bytes)
{
    g_copies++;
    g_ops->copy(be, dst, src, bytes);
}

static void check(int ok, const char *what)
{
    printf("%s  %s\n", ok ? "PASS" : "FAIL", what);
    if (ok) g_pass++;
    else g_fail++;
}

/* n floats: upload x (n may be 0) */
static float *up(struct mt_ctx *ctx, const float *x, size_t n)
{
    float *d = g_ops->buf_alloc(g_ops->be, ctx, (n ? n : 1) * sizeof(float), MT_BUCKET_ACTS);
    if (!d) { fprintf(stderr, "mesh_device: buf_alloc failed\n"); exit(2); }
    if (n) g_ops->copy_from_host(g_ops->be, d, x, n * sizeof(float));
    return d;
}
static int equal(const float *d, const float *want, size_t n)
{
    float *h = malloc(n * sizeof(float));
    g_ops->sync(g_ops->be);
    g_ops->copy_to_host(g_ops->be, h, d, n * sizeof(float));
    int ok = memcmp(h, want, n * sizeof(float)) == 0;
    free(h);
    return ok;
}

static void test_collectives(struct mt_ctx *ctx, struct mt_comm *c)
{
    enum { N = 1000 };
    float x[N], y[2 * N], nanv[2 * N];
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 2 * N; i++) { y[i] = -(float)i; nanv[i] = 1e30f; }
    float *dx = up(ctx, x, N), *dy = up(ctx, nanv, 2 * N);
    size_t counts[1] = {N}, displs[1] = {7};
    char w[160];
    long c0;

#define EXPECT(nc, call, what)                                                                         \
    do {                                                                                               \
        c0 = g_copies;                                                                                 \
        enum mt_status st_ = (call);                                                                   \
        snprintf(w, sizeof w, "%-40s status %s, %ld backend copies (want %d)", what, mt_status_str(st_), \
                 g_copies - c0, nc);                                                                   \
        check(st_ == MT_OK && g_copies - c0 == (nc), w);                                               \
    } while (0)

    EXPECT(0, mt_comm_allreduce(ctx, c, dx, N, MT_DTYPE_F32, MT_REDOP_SUM), "allreduce (identity)");
    check(equal(dx, x, N), "allreduce leaves the buffer as it was");
    EXPECT(0, mt_comm_bcast(ctx, c, dx, N, MT_DTYPE_F32, 0), "bcast (identity)");
    EXPECT(0, mt_comm_barrier(ctx, c), "barrier");
    EXPECT(1, mt_comm_reduce_scatter(ctx, c, dy, dx, N, MT_DTYPE_F32), "reduce_scatter");
    check(equal(dy, x, N), "reduce_scatter: recv = send");
    g_ops->copy_from_host(g_ops->be, dy, nanv, 2 * N * sizeof(float));
    EXPECT(1, mt_comm_allgather(ctx, c, dy, dx, N, MT_DTYPE_F32), "allgather");
    check(equal(dy, x, N), "allgather: recv = send");
    EXPECT(0, mt_comm_allgather(ctx, c, dy, dy, N, MT_DTYPE_F32), "allgather in place (no copy)");
    g_ops->copy_from_host(g_ops->be, dy, nanv, 2 * N * sizeof(float));
    EXPECT(1, mt_comm_allgatherv(ctx, c, dy, dx, counts, displs, MT_DTYPE_F32), "allgatherv (displacement 7)");
    check(equal(dy + 7, x, N) && equal(dy, nanv, 7), "allgatherv: block at 7, gap untouched");
    EXPECT(1, mt_comm_reduce_scatterv(ctx, c, dx, dy, counts, displs, MT_DTYPE_F32), "reduce_scatterv");
    check(equal(dx, x, N), "reduce_scatterv: recv = send block");
    size_t sc[1] = {N}, sd[1] = {0}, rc[1] = {N}, rd[1] = {N};
    g_ops->copy_from_host(g_ops->be, dy, nanv, 2 * N * sizeof(float));
    EXPECT(1, mt_comm_alltoallv(ctx, c, dx, sc, sd, dy, rc, rd, MT_DTYPE_F32), "alltoallv");
    check(equal(dy + N, x, N) && equal(dy, nanv, N), "alltoallv: own block moved");
    struct mt_comm_req *req = NULL;
    g_ops->copy_from_host(g_ops->be, dy, y, 2 * N * sizeof(float));
    EXPECT(1, mt_comm_iallgather(ctx, c, dy, dx, N, MT_DTYPE_F32, &req), "iallgather");
    EXPECT(0, mt_comm_wait(ctx, req), "wait");
    check(equal(dy, x, N), "iallgather + wait: recv = send");
    g_ops->copy_from_host(g_ops->be, dx, nanv, N * sizeof(float));
    EXPECT(1, mt_comm_ireduce_scatterv(ctx, c, dx, dy, counts, sd, MT_DTYPE_F32, &req), "ireduce_scatterv");
    EXPECT(0, mt_comm_wait(ctx, req), "wait");
    check(equal(dx, x, N), "ireduce_scatterv + wait");
    EXPECT(1, mt_comm_iallreduce(ctx, c, dx, N, MT_DTYPE_F32, MT_REDOP_SUM, &req) == MT_OK
                  ? mt_comm_reduce_scatter(ctx, c, dy, dx, N, MT_DTYPE_F32) : MT_ERR_COMM,
           "iallreduce (identity) + reduce_scatter");
    EXPECT(0, mt_comm_wait(ctx, req), "wait");
    g_ops->copy_from_host(g_ops->be, dy, nanv, 2 * N * sizeof(float));
    struct mt_p2p_op ops[2] = {
        {MT_P2P_RECV, 0, dy + 3, N, MT_DTYPE_F32, 5},
        {MT_P2P_SEND, 0, dx, N, MT_DTYPE_F32, 5},
    };
    EXPECT(1, mt_comm_sendrecv_batch(ctx, c, 2, ops), "sendrecv_batch (send to self)");
    check(equal(dy + 3, x, N), "sendrecv_batch: received what was sent");
    g_ops->buf_free(g_ops->be, ctx, dx);
    g_ops->buf_free(g_ops->be, ctx, dy);
#undef EXPECT
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a crash on a GPU keeps every line before it in the log */
    char why[256] = "";
    g_ops = mt_ops_cuda(why, sizeof why);
    if (!g_ops) {
        printf("SKIPPED (no GPU: %s)\n", why);
        return 77;
    }
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_mesh_dims d = {.pp = 1, .dp = 1, .ep = 1, .tp = 1, .sp = 0};
    char line[4096];

    if (argc > 1 && !strcmp(argv[1], "--host-comm")) {
        struct mt_mesh *hm = NULL;
        float x[256] = {0};
        if (mt_mesh_create(&ctx, &d, NULL, 0, &hm) != MT_OK) return 1;
        float *dx = up(&ctx, x, 256), *dy = up(&ctx, x, 256);
        printf("reduce_scatter through the host self comm on device buffers (expected to crash)\n");
        fflush(stdout);
        mt_comm_reduce_scatter(&ctx, mt_mesh_comm(hm, MT_MESH_GROUP_DATA), dy, dx, 256, MT_DTYPE_F32);
        g_ops->sync(g_ops->be);
        printf("returned: the host self comm touched device memory without a fault\n");
        return 0;
    }

    /* the host mesh is what it always was */
    struct mt_mesh *hm = NULL;
    check(mt_mesh_create(&ctx, &d, NULL, 0, &hm) == MT_OK, "mt_mesh_create (host)");
    int same = hm != NULL && !mt_mesh_has_device_comms(hm);
    for (int g = 0; hm && g < MT_MESH_GROUP_COUNT; g++)
        same &= mt_mesh_device_comm(hm, (enum mt_mesh_group)g) == mt_mesh_comm(hm, (enum mt_mesh_group)g);
    check(same, "host mesh: device comm == host comm for every group");
    if (hm) mt_mesh_trace_line(hm, line, sizeof line);
    check(hm && !strstr(line, "dev="), "host mesh: trace line unchanged (no dev=)");
    mt_mesh_destroy(hm);

    /* the device mesh */
    struct mt_mesh_nccl_opts o = {0, mt_ops_cuda_stream(), copy_counted, g_ops->be};
    struct mt_mesh *m = NULL;
    enum mt_status st = mt_mesh_create_nccl(&ctx, &d, NULL, 0, &o, &m);
    check(st == MT_OK && m && mt_mesh_has_device_comms(m), "mt_mesh_create_nccl on one rank (no NCCL, no MPI needed)");
    if (!m) {
        fprintf(stderr, "%s\n", mt_ctx_last_error(&ctx));
        return 1;
    }
    struct mt_comm *dw = mt_mesh_device_comm(m, MT_MESH_GROUP_WORLD);
    int one = dw != mt_mesh_comm(m, MT_MESH_GROUP_WORLD) && mt_comm_size(dw) == 1 && mt_comm_rank(dw) == 0;
    for (int g = 0; g < MT_MESH_GROUP_COUNT; g++) one &= mt_mesh_device_comm(m, (enum mt_mesh_group)g) == dw;
    check(one, "device mesh: one device comm (size 1) shared by every group, distinct from the host comm");
    mt_mesh_trace_line(m, line, sizeof line);
    int n_dev = 0;
    for (const char *p = line; (p = strstr(p, "impl=self reused=")) != NULL; p++) n_dev++;
    int n_selfdev = 0;
    for (const char *p = line; (p = strstr(p, " dev=self_dev}")) != NULL; p++) n_selfdev++;
    check(n_dev == MT_MESH_GROUP_COUNT && n_selfdev == MT_MESH_GROUP_COUNT,
          "device mesh trace: every group impl=self (host) and dev=self_dev");
    printf("%s\n", line);
    test_collectives(&ctx, dw);
    mt_mesh_destroy(m);
    check(ctx.bytes_live[MT_BUCKET_COMM] == 0, "no comm bytes live after destroy");

    /* argument errors */
    m = (struct mt_mesh *)&ctx;
    check(mt_mesh_create_nccl(&ctx, &d, NULL, 0, NULL, &m) == MT_ERR_INVALID_ARG && m == NULL, "NULL options refused");
    struct mt_mesh_nccl_opts bad = {0, NULL, NULL, NULL};
    check(mt_mesh_create_nccl(&ctx, &d, NULL, 0, &bad, &m) == MT_ERR_INVALID_ARG && m == NULL, "NULL copy refused");
    mt_ctx_clear_error(&ctx);

    /* injected allocation failures: clean error, nothing leaked */
    int leaks = 0, oom = 0;
    for (int k = 1; k <= 40; k++) {
        ctx.fail_after = k;
        st = mt_mesh_create_nccl(&ctx, &d, NULL, 0, &o, &m);
        ctx.fail_after = 0;
        if (st == MT_OK) mt_mesh_destroy(m);
        else if (st == MT_ERR_OOM) oom++;
        else leaks++;  /* another error: counts as a failure */
        if (ctx.bytes_live[MT_BUCKET_COMM] != 0) leaks++;
        mt_ctx_clear_error(&ctx);
    }
    char w[96];
    snprintf(w, sizeof w, "OOM at each allocation: %d clean OOMs, 0 leaks or other errors (got %d)", oom, leaks);
    check(oom > 0 && leaks == 0, w);

    printf("mesh_device: %ld checks, %ld passed, %ld failed\n", g_pass + g_fail, g_pass, g_fail);
    mt_ctx_free(&ctx);
    return g_fail ? 1 : 0;
}
