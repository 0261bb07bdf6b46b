/*
 * comm.c — the public collectives (argument checks, then dispatch through
 * the communicator's table) and the single-rank "self" implementation.
 *
 * Invariant: a public call never reaches an implementation with a NULL
 * comm, a bad dtype, or a NULL buffer for a non-zero count; an
 * implementation only has to do its job. On a group of one rank every
 * collective is the identity: allreduce and barrier do nothing, reduce-
 * scatter / allgather / alltoallv copy (memmove: in place is allowed), bcast
 * from root 0 does nothing; allgatherv copies send to recv + displs[0] and
 * reduce_scatterv copies send + displs[0] to recv (counts[0] elements each).
 * The "self_dev" table is the same code on backend memory: c->copy (the
 * backend's copy) moves the data instead of memmove; the in-place cases
 * (equal pointers) copy nothing in either, and partial overlaps are not a
 * legal use of any collective.
 */
#include "comm_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

size_t mt_dtype_size(enum mt_dtype dt)
{
    switch (dt) {
    case MT_DTYPE_F32: return 4;
    case MT_DTYPE_F64: return 8;
    case MT_DTYPE_I32: return 4;
    case MT_DTYPE_I64: return 8;
    case MT_DTYPE_U8:  return 1;
    case MT_DTYPE_BF16: return 2;
    }
    return 0;
}

int mt_comm_size(const struct mt_comm *c) { return c ? c->size : 0; }
int mt_comm_rank(const struct mt_comm *c) { return c ? c->rank : -1; }

/* ------------------------------------------------------------------ */
/* argument checks shared by every public call                         */
/* ------------------------------------------------------------------ */

static enum mt_status check_comm(struct mt_ctx *ctx, const struct mt_comm *c, const char *op)
{
    if (!c) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: NULL communicator", op);
    return MT_OK;
}

static enum mt_status check_buf(struct mt_ctx *ctx, const void *p, size_t count, enum mt_dtype dt,
                                const char *op, const char *what)
{
    if (mt_dtype_size(dt) == 0)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: unknown dtype %d", op, (int)dt);
    if (!p && count > 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: NULL %s with count %zu", op, what, count);
    return MT_OK;
}

/* counts/displs of a v-collective: non-NULL, and *extent = max over ranks
 * with a non-zero count of displs[r] + counts[r] (elements of the full
 * buffer), whose byte size must fit a size_t. */
static enum mt_status check_v(struct mt_ctx *ctx, const struct mt_comm *c, const size_t *counts,
                              const size_t *displs, enum mt_dtype dt, const char *op, size_t *extent)
{
    *extent = 0;
    if (mt_dtype_size(dt) == 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: unknown dtype %d", op, (int)dt);
    if (!counts || !displs) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: NULL count or displacement array", op);
    size_t es = mt_dtype_size(dt);
    for (int r = 0; r < c->size; r++) {
        if (counts[r] == 0) continue;
        if (counts[r] > SIZE_MAX / es || displs[r] > SIZE_MAX / es - counts[r])
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: rank %d block (displacement %zu, count %zu) overflows size_t bytes",
                                op, r, displs[r], counts[r]);
        if (displs[r] + counts[r] > *extent) *extent = displs[r] + counts[r];
    }
    return MT_OK;
}

/* reduce_scatterv: recv (counts[rank]) must not overlap a block of send that is read. */
static enum mt_status check_no_alias(struct mt_ctx *ctx, const struct mt_comm *c, const void *recv, const void *send,
                                     const size_t *counts, const size_t *displs, enum mt_dtype dt, const char *op)
{
    size_t es = mt_dtype_size(dt);
    size_t n = counts[c->rank];
    if (n == 0) return MT_OK;
    uintptr_t r0 = (uintptr_t)recv, r1 = r0 + n * es;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] == 0) continue;
        uintptr_t s0 = (uintptr_t)send + displs[r] * es, s1 = s0 + counts[r] * es;
        if (r0 < s1 && s0 < r1)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s: recv overlaps rank %d's block of send (recv must not alias send)",
                                op, r);
    }
    return MT_OK;
}

static enum mt_status unsupported(struct mt_ctx *ctx, const struct mt_comm *c, const char *op)
{
    return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "%s is not supported by the '%s' communicator", op,
                        c->iface->name);
}

/* ------------------------------------------------------------------ */
/* public dispatch                                                     */
/* ------------------------------------------------------------------ */

/* Return `call` (an implementation's blocking operation) marked as the
 * collective `op` in progress on c for the watchdog (watchdog.c). */
#define GUARDED(c, op, call)                                   \
    do {                                                       \
        int wd_ = mt_comm_wd_enter((op), (c)->size);                 \
        enum mt_status st_ = (call);                           \
        mt_comm_wd_leave(wd_);                                 \
        return st_;                                            \
    } while (0)

/* A posted request remembers its name for the watchdog's message. */
static enum mt_status named(enum mt_status st, struct mt_comm_req **req, const char *op)
{
    if (st == MT_OK && *req) (*req)->op = op;
    return st;
}

enum mt_status mt_comm_allreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                 enum mt_dtype dt, enum mt_redop op)
{
    MT_CHECK(check_comm(ctx, c, "allreduce"));
    MT_CHECK(check_buf(ctx, buf, count, dt, "allreduce", "buffer"));
    if (op != MT_REDOP_SUM && op != MT_REDOP_MAX && op != MT_REDOP_MIN)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "allreduce: unknown reduction %d", (int)op);
    if (dt == MT_DTYPE_BF16 && op != MT_REDOP_SUM)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "allreduce: bf16 reduces by sum only (got reduction %d)", (int)op);
    if (!c->iface->allreduce) return unsupported(ctx, c, "allreduce");
    GUARDED(c, "allreduce", c->iface->allreduce(ctx, c, buf, count, dt, op));
}

enum mt_status mt_comm_reduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      size_t count, enum mt_dtype dt)
{
    MT_CHECK(check_comm(ctx, c, "reduce_scatter"));
    MT_CHECK(check_buf(ctx, recv, count, dt, "reduce_scatter", "recv"));
    MT_CHECK(check_buf(ctx, send, count, dt, "reduce_scatter", "send"));
    if (!c->iface->reduce_scatter) return unsupported(ctx, c, "reduce_scatter");
    GUARDED(c, "reduce_scatter", c->iface->reduce_scatter(ctx, c, recv, send, count, dt));
}

enum mt_status mt_comm_allgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                 size_t count, enum mt_dtype dt)
{
    MT_CHECK(check_comm(ctx, c, "allgather"));
    MT_CHECK(check_buf(ctx, recv, count, dt, "allgather", "recv"));
    MT_CHECK(check_buf(ctx, send, count, dt, "allgather", "send"));
    if (!c->iface->allgather) return unsupported(ctx, c, "allgather");
    GUARDED(c, "allgather", c->iface->allgather(ctx, c, recv, send, count, dt));
}

enum mt_status mt_comm_bcast(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                             enum mt_dtype dt, int root)
{
    MT_CHECK(check_comm(ctx, c, "bcast"));
    MT_CHECK(check_buf(ctx, buf, count, dt, "bcast", "buffer"));
    if (root < 0 || root >= c->size)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "bcast: root %d outside the group of %d ranks", root, c->size);
    if (!c->iface->bcast) return unsupported(ctx, c, "bcast");
    GUARDED(c, "bcast", c->iface->bcast(ctx, c, buf, count, dt, root));
}

enum mt_status mt_comm_alltoallv(struct mt_ctx *ctx, struct mt_comm *c,
                                 const void *send, const size_t *send_counts, const size_t *send_displs,
                                 void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                 enum mt_dtype dt)
{
    MT_CHECK(check_comm(ctx, c, "alltoallv"));
    if (!send_counts || !send_displs || !recv_counts || !recv_displs)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: NULL count or displacement array");
    if (mt_dtype_size(dt) == 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: unknown dtype %d", (int)dt);
    if (!c->iface->alltoallv) return unsupported(ctx, c, "alltoallv");
    GUARDED(c, "alltoallv", c->iface->alltoallv(ctx, c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt));
}

enum mt_status mt_comm_barrier(struct mt_ctx *ctx, struct mt_comm *c)
{
    MT_CHECK(check_comm(ctx, c, "barrier"));
    if (!c->iface->barrier) return unsupported(ctx, c, "barrier");
    GUARDED(c, "barrier", c->iface->barrier(ctx, c));
}

enum mt_status mt_comm_allgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                  const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    size_t extent;
    MT_CHECK(check_comm(ctx, c, "allgatherv"));
    MT_CHECK(check_v(ctx, c, counts, displs, dt, "allgatherv", &extent));
    MT_CHECK(check_buf(ctx, recv, extent, dt, "allgatherv", "recv"));
    MT_CHECK(check_buf(ctx, send, counts[c->rank], dt, "allgatherv", "send"));
    if (!c->iface->allgatherv) return unsupported(ctx, c, "allgatherv");
    GUARDED(c, "allgatherv", c->iface->allgatherv(ctx, c, recv, send, counts, displs, dt));
}

enum mt_status mt_comm_reduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    size_t extent;
    MT_CHECK(check_comm(ctx, c, "reduce_scatterv"));
    MT_CHECK(check_v(ctx, c, counts, displs, dt, "reduce_scatterv", &extent));
    MT_CHECK(check_buf(ctx, recv, counts[c->rank], dt, "reduce_scatterv", "recv"));
    MT_CHECK(check_buf(ctx, send, extent, dt, "reduce_scatterv", "send"));
    MT_CHECK(check_no_alias(ctx, c, recv, send, counts, displs, dt, "reduce_scatterv"));
    if (!c->iface->reduce_scatterv) return unsupported(ctx, c, "reduce_scatterv");
    GUARDED(c, "reduce_scatterv", c->iface->reduce_scatterv(ctx, c, recv, send, counts, displs, dt));
}

enum mt_status mt_comm_iallreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                  enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req)
{
    if (!req) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "iallreduce: NULL request pointer");
    *req = NULL;
    MT_CHECK(check_comm(ctx, c, "iallreduce"));
    MT_CHECK(check_buf(ctx, buf, count, dt, "iallreduce", "buffer"));
    if (op != MT_REDOP_SUM && op != MT_REDOP_MAX && op != MT_REDOP_MIN)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "iallreduce: unknown reduction %d", (int)op);
    if (dt == MT_DTYPE_BF16 && op != MT_REDOP_SUM)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "iallreduce: bf16 reduces by sum only (got reduction %d)", (int)op);
    if (!c->iface->iallreduce) return unsupported(ctx, c, "iallreduce");
    return named(c->iface->iallreduce(ctx, c, buf, count, dt, op, req), req, "iallreduce");
}

enum mt_status mt_comm_ireduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    if (!req) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "ireduce_scatter: NULL request pointer");
    *req = NULL;
    MT_CHECK(check_comm(ctx, c, "ireduce_scatter"));
    MT_CHECK(check_buf(ctx, recv, count, dt, "ireduce_scatter", "recv"));
    MT_CHECK(check_buf(ctx, send, count, dt, "ireduce_scatter", "send"));
    if (!c->iface->ireduce_scatter) return unsupported(ctx, c, "ireduce_scatter");
    return named(c->iface->ireduce_scatter(ctx, c, recv, send, count, dt, req), req, "ireduce_scatter");
}

enum mt_status mt_comm_iallgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                  size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    if (!req) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "iallgather: NULL request pointer");
    *req = NULL;
    MT_CHECK(check_comm(ctx, c, "iallgather"));
    MT_CHECK(check_buf(ctx, recv, count, dt, "iallgather", "recv"));
    MT_CHECK(check_buf(ctx, send, count, dt, "iallgather", "send"));
    if (!c->iface->iallgather) return unsupported(ctx, c, "iallgather");
    return named(c->iface->iallgather(ctx, c, recv, send, count, dt, req), req, "iallgather");
}

enum mt_status mt_comm_iallgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                   const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                   struct mt_comm_req **req)
{
    size_t extent;
    if (!req) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "iallgatherv: NULL request pointer");
    *req = NULL;
    MT_CHECK(check_comm(ctx, c, "iallgatherv"));
    MT_CHECK(check_v(ctx, c, counts, displs, dt, "iallgatherv", &extent));
    MT_CHECK(check_buf(ctx, recv, extent, dt, "iallgatherv", "recv"));
    MT_CHECK(check_buf(ctx, send, counts[c->rank], dt, "iallgatherv", "send"));
    if (!c->iface->iallgatherv) return unsupported(ctx, c, "iallgatherv");
    return named(c->iface->iallgatherv(ctx, c, recv, send, counts, displs, dt, req), req, "iallgatherv");
}

enum mt_status mt_comm_ireduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                        const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                        struct mt_comm_req **req)
{
    size_t extent;
    if (!req) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "ireduce_scatterv: NULL request pointer");
    *req = NULL;
    MT_CHECK(check_comm(ctx, c, "ireduce_scatterv"));
    MT_CHECK(check_v(ctx, c, counts, displs, dt, "ireduce_scatterv", &extent));
    MT_CHECK(check_buf(ctx, recv, counts[c->rank], dt, "ireduce_scatterv", "recv"));
    MT_CHECK(check_buf(ctx, send, extent, dt, "ireduce_scatterv", "send"));
    MT_CHECK(check_no_alias(ctx, c, recv, send, counts, displs, dt, "ireduce_scatterv"));
    if (!c->iface->ireduce_scatterv) return unsupported(ctx, c, "ireduce_scatterv");
    return named(c->iface->ireduce_scatterv(ctx, c, recv, send, counts, displs, dt, req), req, "ireduce_scatterv");
}

enum mt_status mt_comm_wait(struct mt_ctx *ctx, struct mt_comm_req *req)
{
    if (!req) return MT_OK;
    MT_ASSERT(req->comm && req->comm->iface->wait);
    GUARDED(req->comm, req->op ? req->op : "wait", req->comm->iface->wait(ctx, req));
}

enum mt_status mt_comm_sendrecv_batch(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                      const struct mt_p2p_op *ops)
{
    MT_CHECK(check_comm(ctx, c, "sendrecv_batch"));
    if (n_ops < 0 || (n_ops > 0 && !ops))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "sendrecv_batch: bad op list (n_ops=%d)", n_ops);
    for (int i = 0; i < n_ops; i++) {
        const struct mt_p2p_op *o = &ops[i];
        if (o->kind != MT_P2P_SEND && o->kind != MT_P2P_RECV)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "sendrecv_batch: op %d has unknown kind %d", i, (int)o->kind);
        if (o->peer < 0 || o->peer >= c->size)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "sendrecv_batch: op %d peer %d outside the group of %d ranks",
                                i, o->peer, c->size);
        if (o->tag < 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "sendrecv_batch: op %d has negative tag %d", i, o->tag);
        MT_CHECK(check_buf(ctx, o->buf, o->count, o->dt, "sendrecv_batch", "op buffer"));
    }
    if (n_ops == 0) return MT_OK;
    if (!c->iface->sendrecv_batch) return unsupported(ctx, c, "sendrecv_batch");
    GUARDED(c, "sendrecv_batch", c->iface->sendrecv_batch(ctx, c, n_ops, ops));
}

enum mt_status mt_comm_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                             struct mt_comm **out)
{
    if (!out) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "split: NULL output");
    *out = NULL;
    MT_CHECK(check_comm(ctx, parent, "split"));
    if (colour < 0 && colour != MT_COMM_UNDEFINED)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "split: negative colour %d", colour);
    if (!parent->iface->split) return unsupported(ctx, parent, "split");
    GUARDED(parent, "split", parent->iface->split(ctx, parent, colour, key, out));
}

void mt_comm_destroy(struct mt_comm *c)
{
    if (!c) return;
    c->iface->destroy(c);
}

enum mt_status mt_comm_create_world(struct mt_ctx *ctx, struct mt_comm **out)
{
    if (!out) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "create_world: NULL output");
    *out = NULL;
    int world = 1, rank = 0;
    mt_comm_world_info(&world, &rank);
    if (world > 1) {
        int wd = mt_comm_wd_enter("create_world", world); /* MPI_Comm_dup: collective */
        enum mt_status st = mt_comm_mpi_create_world(ctx, out);
        mt_comm_wd_leave(wd);
        return st;
    }
    return mt_comm_create_self(ctx, out);
}

/* MIN of v = failed ? rank * 256 + status : INT64_MAX: the lowest failing
 * rank and its status (statuses are < 256), on every rank, in one
 * all-reduce of one value. */
enum mt_status mt_comm_agree(struct mt_ctx *ctx, struct mt_comm *comm, enum mt_status local, const char *phase)
{
    char own[sizeof ctx->errmsg];
    snprintf(own, sizeof own, "%s", local != MT_OK ? mt_ctx_last_error(ctx) : "");
    struct mt_comm *made = NULL;
    enum mt_status crc = comm ? MT_OK : mt_comm_create_world(ctx, &made);
    if (!comm) comm = made;
    int64_t v = INT64_MAX;
    if (crc == MT_OK) {
        if (local != MT_OK) v = (int64_t)comm->rank * 256 + (int64_t)local;
        crc = mt_comm_allreduce(ctx, comm, &v, 1, MT_DTYPE_I64, MT_REDOP_MIN);
    }
    mt_comm_destroy(made);
    if (local != MT_OK) return mt_ctx_error(ctx, local, "%s", own); /* this rank's own failure comes first */
    if (crc != MT_OK || v == INT64_MAX) return crc;
    enum mt_status st = (enum mt_status)(v % 256);
    return mt_ctx_error(ctx, st, "rank %d failed during %s: %s (see that rank's message); every rank stops",
                        (int)(v / 256), phase, mt_status_str(st));
}

uint64_t mt_comm_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* HOW IT WORKS: the common case (every rank agrees) costs one all-gather of
 * two values per rank; the per-key hashes travel only when something
 * differs, to name the first differing key and the first rank that differs
 * from rank 0 (or, when rank 0 agrees with all, the pair that differs). */
enum mt_status mt_comm_agree_keys(struct mt_ctx *ctx, struct mt_comm *comm, int n, const char *const *names,
                                  const char *const *values, const uint64_t *hashes)
{
    struct mt_comm *made = NULL;
    if (!comm) MT_CHECK(mt_comm_create_world(ctx, &made));
    if (!comm) comm = made;
    const int P = comm->size;
    enum mt_status rc = MT_OK;
    int64_t mine[2] = {n, 0};
    uint64_t total = 1469598103934665603ull;
    for (int i = 0; i < n; i++) total = (total ^ hashes[i]) * 1099511628211ull;
    memcpy(&mine[1], &total, sizeof total);
    int64_t *all = mt_alloc(ctx, (size_t)P * 2 * sizeof *all, MT_BUCKET_OTHER);
    int64_t *keys = NULL;
    if (!all) { rc = MT_ERR_OOM; goto done; }
    MT_CHECK_GOTO(mt_comm_allgather(ctx, comm, all, mine, 2, MT_DTYPE_I64), rc, done);
    int same = 1, same_n = 1;
    for (int r = 1; r < P; r++) {
        if (all[2 * r] != all[0]) same_n = 0;
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) same = 0;
    }
    if (same) goto done;
    if (!same_n) {
        int r = 1;
        while (r < P && all[2 * r] == all[0]) r++;
        rc = mt_ctx_error(ctx, MT_ERR_CONFIG,
                          "ranks disagree on the list of keys (another build?): rank 0 has %lld, rank %d has %lld; "
                          "every rank must run the same build with the same configuration",
                          (long long)all[0], r, (long long)all[2 * r]);
        goto done;
    }
    keys = mt_alloc(ctx, (size_t)P * (size_t)(n > 0 ? n : 1) * sizeof *keys, MT_BUCKET_OTHER);
    if (!keys) { rc = MT_ERR_OOM; goto done; }
    MT_CHECK_GOTO(mt_comm_allgather(ctx, comm, keys, hashes, (size_t)n, MT_DTYPE_I64), rc, done);
    for (int i = 0; i < n; i++)
        for (int a = 0; a < P; a++)
            for (int b = a + 1; b < P; b++) {
                if (keys[(size_t)a * (size_t)n + (size_t)i] == keys[(size_t)b * (size_t)n + (size_t)i]) continue;
                rc = mt_ctx_error(ctx, MT_ERR_CONFIG,
                                  "ranks disagree on %s: rank %d and rank %d were given different values (rank %d's: "
                                  "%s); every rank must be given the same configuration, mesh, data and --out",
                                  names[i], a, b, comm->rank, values && values[i] ? values[i] : "?");
                goto done;
            }
    /* the list hashes differ but no key does: cannot happen (same n, same hashes) */
    rc = mt_ctx_error(ctx, MT_ERR_CONFIG, "ranks disagree on their configuration (hash of the key list)");
done:
    mt_free(ctx, keys);
    mt_free(ctx, all);
    mt_comm_destroy(made);
    return rc;
}

/* ------------------------------------------------------------------ */
/* the self implementation: one rank                                   */
/* ------------------------------------------------------------------ */

/* Host memory: memmove; backend memory (self_dev): the backend's copy. */
static void self_move(const struct mt_comm *c, void *dst, const void *src, size_t bytes)
{
    if (c->copy) c->copy(c->copy_be, dst, src, bytes);
    else memmove(dst, src, bytes);
}

static enum mt_status self_allreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                     enum mt_dtype dt, enum mt_redop op)
{
    return MT_OK; /* the reduction of one value is that value */
}

static enum mt_status self_reduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                          size_t count, enum mt_dtype dt)
{
    if (recv != send && count) self_move(c, recv, send, count * mt_dtype_size(dt));
    return MT_OK;
}

static enum mt_status self_allgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                     size_t count, enum mt_dtype dt)
{
    if (recv != send && count) self_move(c, recv, send, count * mt_dtype_size(dt));
    return MT_OK;
}

static enum mt_status self_bcast(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                 enum mt_dtype dt, int root)
{
    return MT_OK; /* root == 0 was checked */
}

static enum mt_status self_alltoallv(struct mt_ctx *ctx, struct mt_comm *c,
                                     const void *send, const size_t *send_counts, const size_t *send_displs,
                                     void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                     enum mt_dtype dt)
{
    if (send_counts[0] != recv_counts[0])
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: sends %zu elements to itself but expects %zu",
                            send_counts[0], recv_counts[0]);
    if (send_counts[0] == 0) return MT_OK;
    if (!send || !recv) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: NULL buffer with count %zu", send_counts[0]);
    size_t es = mt_dtype_size(dt);
    char *dst = (char *)recv + recv_displs[0] * es;
    const char *src = (const char *)send + send_displs[0] * es;
    if (dst != src) self_move(c, dst, src, send_counts[0] * es);
    return MT_OK;
}

static enum mt_status self_barrier(struct mt_ctx *ctx, struct mt_comm *c)
{
    return MT_OK;
}

static enum mt_status self_allgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    if (counts[0] == 0) return MT_OK; /* recv may be NULL */
    size_t es = mt_dtype_size(dt);
    char *dst = (char *)recv + displs[0] * es;
    if (dst != send) self_move(c, dst, send, counts[0] * es);
    return MT_OK;
}

static enum mt_status self_reduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                           const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    size_t es = mt_dtype_size(dt);
    if (counts[0] > 0) self_move(c, recv, (const char *)send + displs[0] * es, counts[0] * es); /* no alias: checked */
    return MT_OK;
}

enum mt_status mt_comm_req_done(struct mt_ctx *ctx, struct mt_comm *c, struct mt_comm_req **req)
{
    struct mt_comm_req *r = mt_alloc(ctx, sizeof *r, MT_BUCKET_COMM);
    if (!r) return MT_ERR_OOM;
    r->comm = c;
    r->ctx = ctx;
    r->scratch = NULL;
#ifdef MT_WITH_MPI
    r->mpi = MPI_REQUEST_NULL;
#endif
    *req = r;
    return MT_OK;
}

static enum mt_status self_iallreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                      enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req)
{
    return mt_comm_req_done(ctx, c, req);
}

static enum mt_status self_ireduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                           size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    MT_CHECK(self_reduce_scatter(ctx, c, recv, send, count, dt));
    return mt_comm_req_done(ctx, c, req);
}

static enum mt_status self_iallgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    MT_CHECK(self_allgather(ctx, c, recv, send, count, dt));
    return mt_comm_req_done(ctx, c, req);
}

static enum mt_status self_iallgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                       struct mt_comm_req **req)
{
    MT_CHECK(self_allgatherv(ctx, c, recv, send, counts, displs, dt));
    return mt_comm_req_done(ctx, c, req);
}

static enum mt_status self_ireduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                            const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                            struct mt_comm_req **req)
{
    MT_CHECK(self_reduce_scatterv(ctx, c, recv, send, counts, displs, dt));
    return mt_comm_req_done(ctx, c, req);
}

static enum mt_status self_wait(struct mt_ctx *ctx, struct mt_comm_req *req)
{
    mt_free(req->ctx, req->scratch);
    mt_free(req->ctx, req);
    return MT_OK;
}

/* Each recv takes the first not-yet-used send with the same tag; the sizes
 * must agree (as MPI would require of a matching pair). O(n_ops^2), and
 * batches are a handful of ops. */
static enum mt_status self_sendrecv_batch(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                          const struct mt_p2p_op *ops)
{
    unsigned char used_small[64];
    unsigned char *used = used_small;
    if (n_ops > (int)sizeof used_small) {
        used = mt_alloc(ctx, (size_t)n_ops, MT_BUCKET_COMM);
        if (!used) return MT_ERR_OOM;
    } else {
        memset(used_small, 0, sizeof used_small);
    }
    enum mt_status rc = MT_OK;
    for (int i = 0; i < n_ops && rc == MT_OK; i++) {
        if (ops[i].kind != MT_P2P_RECV) continue;
        int j = 0;
        while (j < n_ops && (used[j] || ops[j].kind != MT_P2P_SEND || ops[j].tag != ops[i].tag)) j++;
        if (j == n_ops) {
            rc = mt_ctx_error(ctx, MT_ERR_COMM, "sendrecv_batch: recv op %d (tag %d) has no matching send on a self group",
                              i, ops[i].tag);
            break;
        }
        size_t sb = ops[j].count * mt_dtype_size(ops[j].dt), rb = ops[i].count * mt_dtype_size(ops[i].dt);
        if (sb != rb) {
            rc = mt_ctx_error(ctx, MT_ERR_COMM, "sendrecv_batch: tag %d sends %zu bytes but receives %zu", ops[i].tag, sb, rb);
            break;
        }
        used[j] = 1;
        if (rb && ops[i].buf != ops[j].buf) self_move(c, ops[i].buf, ops[j].buf, rb);
    }
    if (used != used_small) mt_free(ctx, used);
    return rc;
}

static enum mt_status self_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                                 struct mt_comm **out)
{
    if (colour == MT_COMM_UNDEFINED) return MT_OK;
    if (parent->copy) return mt_comm_create_self_dev(ctx, parent->copy, parent->copy_be, out);
    return mt_comm_create_self(ctx, out);
}

static void self_destroy(struct mt_comm *c)
{
    mt_free(c->ctx, c);
}

const struct mt_comm_i mt_comm_self_iface = {
    /* .name             = */ "self",
    /* .allreduce        = */ self_allreduce,
    /* .reduce_scatter   = */ self_reduce_scatter,
    /* .allgather        = */ self_allgather,
    /* .bcast            = */ self_bcast,
    /* .alltoallv        = */ self_alltoallv,
    /* .barrier          = */ self_barrier,
    /* .allgatherv       = */ self_allgatherv,
    /* .reduce_scatterv  = */ self_reduce_scatterv,
    /* .iallreduce       = */ self_iallreduce,
    /* .ireduce_scatter  = */ self_ireduce_scatter,
    /* .iallgather       = */ self_iallgather,
    /* .iallgatherv      = */ self_iallgatherv,
    /* .ireduce_scatterv = */ self_ireduce_scatterv,
    /* .wait             = */ self_wait,
    /* .sendrecv_batch   = */ self_sendrecv_batch,
    /* .split            = */ self_split,
    /* .destroy          = */ self_destroy,
};

enum mt_status mt_comm_create_self(struct mt_ctx *ctx, struct mt_comm **out)
{
    if (!out) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "create_self: NULL output");
    *out = NULL;
    struct mt_comm *c = mt_alloc(ctx, sizeof *c, MT_BUCKET_COMM);
    if (!c) return MT_ERR_OOM;
    c->iface = &mt_comm_self_iface;
    c->size = 1;
    c->rank = 0;
    c->ctx = ctx;
#ifdef MT_WITH_MPI
    c->mpi = MPI_COMM_NULL;
#endif
    *out = c;
    return MT_OK;
}

const struct mt_comm_i mt_comm_self_dev_iface = {
    /* .name             = */ "self_dev",
    /* .allreduce        = */ self_allreduce,
    /* .reduce_scatter   = */ self_reduce_scatter,
    /* .allgather        = */ self_allgather,
    /* .bcast            = */ self_bcast,
    /* .alltoallv        = */ self_alltoallv,
    /* .barrier          = */ self_barrier,
    /* .allgatherv       = */ self_allgatherv,
    /* .reduce_scatterv  = */ self_reduce_scatterv,
    /* .iallreduce       = */ self_iallreduce,
    /* .ireduce_scatter  = */ self_ireduce_scatter,
    /* .iallgather       = */ self_iallgather,
    /* .iallgatherv      = */ self_iallgatherv,
    /* .ireduce_scatterv = */ self_ireduce_scatterv,
    /* .wait             = */ self_wait,
    /* .sendrecv_batch   = */ self_sendrecv_batch,
    /* .split            = */ self_split,
    /* .destroy          = */ self_destroy,
};

enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, void *copy_be,
                                       struct mt_comm **out)
{
    if (!out) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "create_self_dev: NULL output");
    *out = NULL;
    if (!copy) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "create_self_dev: NULL backend copy");
    MT_CHECK(mt_comm_create_self(ctx, out));
    (*out)->iface = &mt_comm_self_dev_iface;
    (*out)->copy = copy;
    (*out)->copy_be = copy_be;
    return MT_OK;
}
