/*
 * comm_mpi.c — the MPI implementation of the collectives, and process init.
 *
 * Compiled always; the MPI code exists only under MT_WITH_MPI. Without it,
 * mt_dist_init reports one rank and the world is a self group.
 *
 * Invariants:
 *  - every communicator created here has MPI_ERRORS_RETURN, so an MPI
 *    failure comes back as a return code (not an abort) and is converted to
 *    an mt_status + MPI_Error_string message at ONE boundary, MPI_CHECK;
 *  - MPI counts are int: a count above INT_MAX is an MT_ERR_UNSUPPORTED
 *    error, except for allreduce and bcast, which are cut into chunks; the
 *    v-collectives refuse counts and displacements above INT_MAX (and, for
 *    reduce_scatterv, a sum of counts above INT_MAX) the same way, on every
 *    rank alike since the arrays are identical, before any rank posts;
 *  - a pending request owns whatever MPI still reads (int count arrays, a
 *    packed send buffer) in req->scratch, freed by wait;
 *  - comm->rank / comm->size are cached at creation and equal MPI's.
 */
#define _GNU_SOURCE
#include "comm_impl.h"
#include "comm_nccl.h"

#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tunables (written down here, at the point of use): malloc thresholds so
 * MPI's large temporaries are reused from the heap instead of mmap'ed and
 * page-faulted on every collective. We ask for a 1 GiB mmap threshold; a
 * glibc that refuses it (some cap it at HEAP_MAX_SIZE/2 = 32 MiB) gets the cap. */
#define MT_MALLOC_MMAP_THRESHOLD      ((int)(1 << 30))
#define MT_MALLOC_MMAP_THRESHOLD_CAP  ((int)(32 << 20))
#define MT_MALLOC_TRIM_THRESHOLD      ((int)(3 << 29))   /* 1.5 GiB */

static void tune_malloc(void)
{
    if (!mallopt(M_MMAP_THRESHOLD, MT_MALLOC_MMAP_THRESHOLD))
        mallopt(M_MMAP_THRESHOLD, MT_MALLOC_MMAP_THRESHOLD_CAP);
    mallopt(M_TRIM_THRESHOLD, MT_MALLOC_TRIM_THRESHOLD);
}

#ifndef MT_WITH_MPI

enum mt_status mt_comm_mpi_create_world(struct mt_ctx *ctx, struct mt_comm **out)
{
    *out = NULL;
    return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "MPI communicator requested but meshtrain was built without MPI");
}

void mt_comm_world_info(int *world, int *rank)
{
    *world = 1;
    *rank = 0;
}

enum mt_status mt_dist_init(int *argc, char ***argv, int *world, int *rank)
{
    tune_malloc();
    if (world) *world = 1;
    if (rank) *rank = 0;
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n) n = getenv("PMI_SIZE");
    if (n && atoi(n) > 1) return MT_ERR_UNSUPPORTED; /* N copies of a one-rank run would duplicate work */
    return MT_OK;
}

void mt_dist_finalize(void) {}

void mt_dist_abort(int code)
{
    exit(code);
}

#else /* MT_WITH_MPI */

/* Launched by a process manager that expects MPI_Init? */
static int launched_under_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL;
}

/* The one conversion boundary: MPI error code -> mt_status + message. */
static enum mt_status mpi_error(struct mt_ctx *ctx, int code, const char *call, const char *file, int line)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", code);
    return mt_ctx_error(ctx, MT_ERR_COMM, "%s failed: %s (%s:%d)", call, msg, file, line);
}

#define MPI_CHECK(ctx, call)                                                  \
    do {                                                                      \
        int mpi_rc_ = (call);                                                 \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_error((ctx), mpi_rc_, #call, __FILE__, __LINE__); \
    } while (0)

static MPI_Datatype mpi_dtype(enum mt_dtype dt)
{
    switch (dt) {
    case MT_DTYPE_F32: return MPI_FLOAT;
    case MT_DTYPE_F64: return MPI_DOUBLE;
    case MT_DTYPE_I32: return MPI_INT32_T;
    case MT_DTYPE_I64: return MPI_INT64_T;
    case MT_DTYPE_U8:  return MPI_UINT8_T;
    case MT_DTYPE_BF16: return MPI_UINT16_T;   /* bf16 storage, summed by the user op below */
    }
    return MPI_DATATYPE_NULL;
}

/* bf16 sum, element by element: inout = bf16(f32(in) + f32(inout)), round
 * to nearest even (NaN stays a quiet NaN): fp32 accumulation per pair, the
 * result stored in bf16 as NCCL's ncclBfloat16 sum does. */
static float bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN: quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_round(bf16_widen(a[i]) + bf16_widen(b[i]));
}
static MPI_Op g_bf16_sum = MPI_OP_NULL;   /* created on first use (commutative), freed by MPI_Finalize */

/* the reduction op for dtype dt: bf16 sums through the user op (comm.c allows SUM only) */
static MPI_Op mpi_op(enum mt_redop op, enum mt_dtype dt)
{
    if (dt == MT_DTYPE_BF16) {
        if (g_bf16_sum == MPI_OP_NULL && MPI_Op_create(bf16_sum_fn, 1, &g_bf16_sum) != MPI_SUCCESS) return MPI_OP_NULL;
        return g_bf16_sum;
    }
    switch (op) {
    case MT_REDOP_SUM: return MPI_SUM;
    case MT_REDOP_MAX: return MPI_MAX;
    case MT_REDOP_MIN: return MPI_MIN;
    }
    return MPI_OP_NULL;
}

static enum mt_status check_int_count(struct mt_ctx *ctx, size_t count, const char *op)
{
    if (count > (size_t)INT_MAX)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "%s: count %zu exceeds INT_MAX (MPI int counts); split the buffer",
                            op, count);
    return MT_OK;
}

static int mpi_is_up(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

void mt_comm_world_info(int *world, int *rank)
{
    *world = 1;
    *rank = 0;
    if (!mpi_is_up()) return;
    MPI_Comm_size(MPI_COMM_WORLD, world);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
}

/* ---- blocking collectives ---------------------------------------- */

/* In place; chunks of at most INT_MAX elements (element-wise ops commute
 * with cutting the buffer). */
static enum mt_status mpi_allreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                    enum mt_dtype dt, enum mt_redop op)
{
    size_t es = mt_dtype_size(dt);
    for (size_t off = 0; off < count;) {
        size_t n = count - off < (size_t)INT_MAX ? count - off : (size_t)INT_MAX;
        MPI_CHECK(ctx, MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, mpi_dtype(dt), mpi_op(op, dt), c->mpi));
        off += n;
    }
    return MT_OK;
}

static enum mt_status mpi_reduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                         size_t count, enum mt_dtype dt)
{
    MT_CHECK(check_int_count(ctx, count, "reduce_scatter"));
    MPI_CHECK(ctx, MPI_Reduce_scatter_block(send, recv, (int)count, mpi_dtype(dt), mpi_op(MT_REDOP_SUM, dt), c->mpi));
    return MT_OK;
}

static int allgather_in_place(const struct mt_comm *c, const void *recv, const void *send, size_t count,
                              enum mt_dtype dt)
{
    return send == (const char *)recv + (size_t)c->rank * count * mt_dtype_size(dt);
}

static enum mt_status mpi_allgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                    size_t count, enum mt_dtype dt)
{
    MT_CHECK(check_int_count(ctx, count, "allgather"));
    if (allgather_in_place(c, recv, send, count, dt))
        MPI_CHECK(ctx, MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, mpi_dtype(dt), c->mpi));
    else
        MPI_CHECK(ctx, MPI_Allgather(send, (int)count, mpi_dtype(dt), recv, (int)count, mpi_dtype(dt), c->mpi));
    return MT_OK;
}

static enum mt_status mpi_bcast(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                enum mt_dtype dt, int root)
{
    size_t es = mt_dtype_size(dt);
    for (size_t off = 0; off < count;) {
        size_t n = count - off < (size_t)INT_MAX ? count - off : (size_t)INT_MAX;
        MPI_CHECK(ctx, MPI_Bcast((char *)buf + off * es, (int)n, mpi_dtype(dt), root, c->mpi));
        off += n;
    }
    return MT_OK;
}

/* size_t counts/displacements -> the int arrays MPI wants (one allocation of
 * 4 * size ints). */
static enum mt_status mpi_alltoallv(struct mt_ctx *ctx, struct mt_comm *c,
                                    const void *send, const size_t *send_counts, const size_t *send_displs,
                                    void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                    enum mt_dtype dt)
{
    int n = c->size;
    int *v = mt_alloc(ctx, 4 * (size_t)n * sizeof(int), MT_BUCKET_COMM);
    if (!v) return MT_ERR_OOM;
    int *sc = v, *sd = v + n, *rc_ = v + 2 * n, *rd = v + 3 * n;
    const size_t *src[4] = {send_counts, send_displs, recv_counts, recv_displs};
    const char *what[4] = {"send count", "send displacement", "recv count", "recv displacement"};
    for (int a = 0; a < 4; a++) {
        for (int i = 0; i < n; i++) {
            if (src[a][i] > (size_t)INT_MAX) {
                enum mt_status st = mt_ctx_error(ctx, MT_ERR_UNSUPPORTED,
                                                 "alltoallv: %s %zu for rank %d exceeds INT_MAX (MPI int counts)",
                                                 what[a], src[a][i], i);
                mt_free(ctx, v);
                return st;
            }
            v[a * n + i] = (int)src[a][i];
        }
    }
    int mrc = MPI_Alltoallv(send, sc, sd, mpi_dtype(dt), recv, rc_, rd, mpi_dtype(dt), c->mpi);
    mt_free(ctx, v);
    MPI_CHECK(ctx, mrc);
    return MT_OK;
}

static enum mt_status mpi_barrier(struct mt_ctx *ctx, struct mt_comm *c)
{
    MPI_CHECK(ctx, MPI_Barrier(c->mpi));
    return MT_OK;
}

/* ---- variable counts ---------------------------------------------- */

static enum mt_status int_refused(struct mt_ctx *ctx, const char *op, const char *what, size_t v, int rank)
{
    return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "%s: %s %zu for rank %d exceeds INT_MAX (MPI int counts)", op, what,
                        v, rank);
}

/* The int arrays MPI_(I)allgatherv reads: one mt_alloc of 2*size ints,
 * counts then displacements (0 for a rank with count 0: never used). The
 * caller frees *out (blocking) or hands it to the request (wait frees it). */
static enum mt_status allgatherv_ints(struct mt_ctx *ctx, struct mt_comm *c, const size_t *counts,
                                      const size_t *displs, const char *op, int **out)
{
    int n = c->size;
    *out = NULL;
    for (int r = 0; r < n; r++) {
        if (counts[r] > (size_t)INT_MAX) return int_refused(ctx, op, "count", counts[r], r);
        if (counts[r] > 0 && displs[r] > (size_t)INT_MAX) return int_refused(ctx, op, "displacement", displs[r], r);
    }
    int *v = mt_alloc(ctx, 2 * (size_t)n * sizeof(int), MT_BUCKET_COMM);
    if (!v) return MT_ERR_OOM;
    for (int r = 0; r < n; r++) {
        v[r] = (int)counts[r];
        v[n + r] = counts[r] > 0 ? (int)displs[r] : 0;
    }
    *out = v;
    return MT_OK;
}

/* In place iff this rank's block already sits at its place in recv. */
static int allgatherv_in_place(const struct mt_comm *c, const void *recv, const void *send, const size_t *counts,
                               const size_t *displs, enum mt_dtype dt)
{
    return counts[c->rank] > 0 && send == (const char *)recv + displs[c->rank] * mt_dtype_size(dt);
}

static enum mt_status mpi_allgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                     const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    int *v;
    MT_CHECK(allgatherv_ints(ctx, c, counts, displs, "allgatherv", &v));
    int n = c->size, mrc;
    if (allgatherv_in_place(c, recv, send, counts, displs, dt))
        mrc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, v, v + n, mpi_dtype(dt), c->mpi);
    else
        mrc = MPI_Allgatherv(send, v[c->rank], mpi_dtype(dt), recv, v, v + n, mpi_dtype(dt), c->mpi);
    mt_free(ctx, v);
    MPI_CHECK(ctx, mrc);
    return MT_OK;
}

/* What MPI_(I)reduce_scatter reads. It has no displacements: the send
 * blocks must be consecutive in rank order. One mt_alloc in *scratch: the
 * size int recv counts (*icounts), padded to 64 bytes, then — only when the
 * non-empty blocks are not consecutive from the first one's displacement —
 * the blocks packed in rank order (sum(counts) elements). *sendp is where
 * MPI reads: into send, or the packed copy. The caller frees *scratch
 * (blocking) or hands it to the request (wait frees it). */
static enum mt_status reduce_scatterv_prep(struct mt_ctx *ctx, struct mt_comm *c, const void *send,
                                           const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                           const char *op, void **scratch, int **icounts, const void **sendp)
{
    int n = c->size;
    size_t es = mt_dtype_size(dt), total = 0, base = 0;
    int consecutive = 1, first = 1;
    *scratch = NULL;
    for (int r = 0; r < n; r++) {
        if (counts[r] > (size_t)INT_MAX) return int_refused(ctx, op, "count", counts[r], r);
        if (counts[r] == 0) continue;
        if (first) base = displs[r];
        first = 0;
        if (displs[r] != base + total) consecutive = 0;
        total += counts[r];
        if (total > (size_t)INT_MAX)
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED,
                                "%s: the counts of ranks 0..%d add up to %zu, above INT_MAX (MPI int counts)", op, r,
                                total);
    }
    size_t head = ((size_t)n * sizeof(int) + 63) & ~(size_t)63;
    char *mem = mt_alloc(ctx, head + (consecutive ? 0 : total * es), MT_BUCKET_COMM);
    if (!mem) return MT_ERR_OOM;
    int *ic = (int *)mem;
    for (int r = 0; r < n; r++) ic[r] = (int)counts[r];
    if (consecutive) {
        *sendp = total > 0 ? (const char *)send + base * es : send;
    } else {
        char *p = mem + head;
        for (int r = 0; r < n; r++) {
            if (counts[r] == 0) continue;
            memcpy(p, (const char *)send + displs[r] * es, counts[r] * es);
            p += counts[r] * es;
        }
        *sendp = mem + head;
    }
    *scratch = mem;
    *icounts = ic;
    return MT_OK;
}

static enum mt_status mpi_reduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                          const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    void *scratch;
    int *ic;
    const void *sp;
    MT_CHECK(reduce_scatterv_prep(ctx, c, send, counts, displs, dt, "reduce_scatterv", &scratch, &ic, &sp));
    int mrc = MPI_Reduce_scatter(sp, recv, ic, mpi_dtype(dt), mpi_op(MT_REDOP_SUM, dt), c->mpi);
    mt_free(ctx, scratch);
    MPI_CHECK(ctx, mrc);
    return MT_OK;
}

/* ---- non-blocking ------------------------------------------------- */

static enum mt_status req_new(struct mt_ctx *ctx, struct mt_comm *c, struct mt_comm_req **out)
{
    return mt_comm_req_done(ctx, c, out); /* MPI_REQUEST_NULL until the post fills it */
}

/* Post `call` into (req)->mpi; on failure free the request (and its
 * scratch) and convert. */
#define MPI_POST(ctx, req, call)                                              \
    do {                                                                      \
        int mpi_rc_ = (call);                                                 \
        if (mpi_rc_ != MPI_SUCCESS) {                                         \
            mt_free((req)->ctx, (req)->scratch);                              \
            mt_free((req)->ctx, (req));                                       \
            (req) = NULL;                                                     \
            return mpi_error((ctx), mpi_rc_, #call, __FILE__, __LINE__);      \
        }                                                                     \
    } while (0)

static enum mt_status mpi_iallreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                     enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req)
{
    MT_CHECK(check_int_count(ctx, count, "iallreduce"));
    struct mt_comm_req *r;
    MT_CHECK(req_new(ctx, c, &r));
    MPI_POST(ctx, r, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_dtype(dt), mpi_op(op, dt), c->mpi, &r->mpi));
    *req = r;
    return MT_OK;
}

static enum mt_status mpi_ireduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                          size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    MT_CHECK(check_int_count(ctx, count, "ireduce_scatter"));
    struct mt_comm_req *r;
    MT_CHECK(req_new(ctx, c, &r));
    MPI_POST(ctx, r, MPI_Ireduce_scatter_block(send, recv, (int)count, mpi_dtype(dt), mpi_op(MT_REDOP_SUM, dt), c->mpi, &r->mpi));
    *req = r;
    return MT_OK;
}

static enum mt_status mpi_iallgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                     size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    MT_CHECK(check_int_count(ctx, count, "iallgather"));
    struct mt_comm_req *r;
    MT_CHECK(req_new(ctx, c, &r));
    if (allgather_in_place(c, recv, send, count, dt))
        MPI_POST(ctx, r, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, mpi_dtype(dt), c->mpi, &r->mpi));
    else
        MPI_POST(ctx, r, MPI_Iallgather(send, (int)count, mpi_dtype(dt), recv, (int)count, mpi_dtype(dt), c->mpi, &r->mpi));
    *req = r;
    return MT_OK;
}

/* The request owns the int arrays (and any packed send) until wait. */
static enum mt_status mpi_iallgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                      struct mt_comm_req **req)
{
    int *v;
    MT_CHECK(allgatherv_ints(ctx, c, counts, displs, "iallgatherv", &v));
    struct mt_comm_req *r;
    enum mt_status st = req_new(ctx, c, &r);
    if (st != MT_OK) {
        mt_free(ctx, v);
        return st;
    }
    r->scratch = v;
    int n = c->size;
    if (allgatherv_in_place(c, recv, send, counts, displs, dt))
        MPI_POST(ctx, r, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, v, v + n, mpi_dtype(dt), c->mpi, &r->mpi));
    else
        MPI_POST(ctx, r, MPI_Iallgatherv(send, v[c->rank], mpi_dtype(dt), recv, v, v + n, mpi_dtype(dt), c->mpi, &r->mpi));
    *req = r;
    return MT_OK;
}

static enum mt_status mpi_ireduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                           const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                           struct mt_comm_req **req)
{
    void *scratch;
    int *ic;
    const void *sp;
    MT_CHECK(reduce_scatterv_prep(ctx, c, send, counts, displs, dt, "ireduce_scatterv", &scratch, &ic, &sp));
    struct mt_comm_req *r;
    enum mt_status st = req_new(ctx, c, &r);
    if (st != MT_OK) {
        mt_free(ctx, scratch);
        return st;
    }
    r->scratch = scratch;
    MPI_POST(ctx, r, MPI_Ireduce_scatter(sp, recv, ic, mpi_dtype(dt), mpi_op(MT_REDOP_SUM, dt), c->mpi, &r->mpi));
    *req = r;
    return MT_OK;
}

static enum mt_status mpi_wait(struct mt_ctx *ctx, struct mt_comm_req *req)
{
    int mrc = MPI_SUCCESS;
    if (req->mpi != MPI_REQUEST_NULL) mrc = MPI_Wait(&req->mpi, MPI_STATUS_IGNORE);
    mt_free(req->ctx, req->scratch);
    mt_free(req->ctx, req);
    MPI_CHECK(ctx, mrc);
    return MT_OK;
}

/* All ops posted, then one MPI_Waitall: a batch {send to next, recv from
 * prev} on a ring cannot deadlock whatever the order of ops. */
static enum mt_status mpi_sendrecv_batch(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                         const struct mt_p2p_op *ops)
{
    for (int i = 0; i < n_ops; i++) MT_CHECK(check_int_count(ctx, ops[i].count, "sendrecv_batch"));
    MPI_Request *rq = mt_alloc(ctx, (size_t)n_ops * sizeof *rq, MT_BUCKET_COMM);
    if (!rq) return MT_ERR_OOM;
    int mrc = MPI_SUCCESS, posted = 0;
    for (int i = 0; i < n_ops && mrc == MPI_SUCCESS; i++, posted++) {
        const struct mt_p2p_op *o = &ops[i];
        if (o->kind == MT_P2P_SEND)
            mrc = MPI_Isend(o->buf, (int)o->count, mpi_dtype(o->dt), o->peer, o->tag, c->mpi, &rq[i]);
        else
            mrc = MPI_Irecv(o->buf, (int)o->count, mpi_dtype(o->dt), o->peer, o->tag, c->mpi, &rq[i]);
    }
    if (mrc != MPI_SUCCESS) posted--; /* the failed post left no request */
    /* complete whatever was posted even on failure: never leave requests
     * referring to the caller's buffers behind */
    int wrc = posted > 0 ? MPI_Waitall(posted, rq, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    mt_free(ctx, rq);
    MPI_CHECK(ctx, mrc);
    MPI_CHECK(ctx, wrc);
    return MT_OK;
}

/* ---- creation ----------------------------------------------------- */

static enum mt_status mpi_wrap(struct mt_ctx *ctx, MPI_Comm mc, struct mt_comm **out);

static enum mt_status mpi_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                                struct mt_comm **out)
{
    MPI_Comm nc = MPI_COMM_NULL;
    MPI_CHECK(ctx, MPI_Comm_split(parent->mpi, colour == MT_COMM_UNDEFINED ? MPI_UNDEFINED : colour, key, &nc));
    if (nc == MPI_COMM_NULL) return MT_OK;
    return mpi_wrap(ctx, nc, out);
}

static void mpi_destroy(struct mt_comm *c)
{
    if (c->mpi != MPI_COMM_NULL && mpi_is_up()) MPI_Comm_free(&c->mpi);
    mt_free(c->ctx, c);
}

static const struct mt_comm_i mpi_iface = {
    /* .name             = */ "mpi",
    /* .allreduce        = */ mpi_allreduce,
    /* .reduce_scatter   = */ mpi_reduce_scatter,
    /* .allgather        = */ mpi_allgather,
    /* .bcast            = */ mpi_bcast,
    /* .alltoallv        = */ mpi_alltoallv,
    /* .barrier          = */ mpi_barrier,
    /* .allgatherv       = */ mpi_allgatherv,
    /* .reduce_scatterv  = */ mpi_reduce_scatterv,
    /* .iallreduce       = */ mpi_iallreduce,
    /* .ireduce_scatter  = */ mpi_ireduce_scatter,
    /* .iallgather       = */ mpi_iallgather,
    /* .iallgatherv      = */ mpi_iallgatherv,
    /* .ireduce_scatterv = */ mpi_ireduce_scatterv,
    /* .wait             = */ mpi_wait,
    /* .sendrecv_batch   = */ mpi_sendrecv_batch,
    /* .split            = */ mpi_split,
    /* .destroy          = */ mpi_destroy,
};

/* Takes ownership of mc (freed on failure too). Sets MPI_ERRORS_RETURN. */
static enum mt_status mpi_wrap(struct mt_ctx *ctx, MPI_Comm mc, struct mt_comm **out)
{
    int rc = MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    int size = 0, rank = 0;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mc, &size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mc, &rank);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&mc);
        return mpi_error(ctx, rc, "MPI_Comm_set_errhandler/size/rank", __FILE__, __LINE__);
    }
    struct mt_comm *c = mt_alloc(ctx, sizeof *c, MT_BUCKET_COMM);
    if (!c) {
        MPI_Comm_free(&mc);
        return MT_ERR_OOM;
    }
    c->iface = &mpi_iface;
    c->size = size;
    c->rank = rank;
    c->ctx = ctx;
    c->mpi = mc;
    *out = c;
    return MT_OK;
}

enum mt_status mt_comm_mpi_create_world(struct mt_ctx *ctx, struct mt_comm **out)
{
    *out = NULL;
    if (!mpi_is_up())
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "MPI world requested but MPI is not initialised (mt_dist_init)");
    /* the world handle itself must return errors too: MPI_Comm_dup is the
     * first call that could fail here */
    MPI_CHECK(ctx, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_CHECK(ctx, MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    return mpi_wrap(ctx, dup, out);
}

/* ---- process init ------------------------------------------------- */

enum mt_status mt_dist_init(int *argc, char ***argv, int *world, int *rank)
{
    tune_malloc();
    if (world) *world = 1;
    if (rank) *rank = 0;
    if (!launched_under_mpi() && !mpi_is_up()) return MT_OK;
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return MT_ERR_COMM;
        /* provided < FUNNELED still works: OpenMP threads never call MPI */
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int w = 1, r = 0;
    mt_comm_world_info(&w, &r);
    if (world) *world = w;
    if (rank) *rank = r;
    return MT_OK;
}

void mt_dist_finalize(void)
{
    if (mpi_is_up()) MPI_Finalize();
}

void mt_dist_abort(int code)
{
    if (mpi_is_up()) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

#endif /* MT_WITH_MPI */

void mt_dist_libraries(char *buf, size_t n)
{
    if (!buf || !n) return;
#ifdef MT_WITH_MPI
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    /* one of the calls MPI allows before MPI_Init */
    if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) snprintf(lib, sizeof lib, "MPI (version query failed)");
    lib[strcspn(lib, "\r\n")] = 0;   /* its first line */
    snprintf(buf, n, "%s", lib);
#else
    snprintf(buf, n, "no MPI (single-rank build)");
#endif
#ifdef MT_WITH_NCCL
    size_t used = strlen(buf);
    if (used + 2 < n) {
        snprintf(buf + used, n - used, "; ");
        mt_comm_nccl_version(buf + used + 2, n - used - 2);
    }
#endif
}
