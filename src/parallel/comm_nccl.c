/*
 * comm_nccl.c — the NCCL implementation of the collectives ("nccl" table).
 *
 * Plain C11 against the NCCL and CUDA runtime C APIs (no device code). The
 * body exists only under MT_WITH_NCCL (CMake -DMT_WITH_NCCL=ON, which also
 * links libnccl and cudart); otherwise this file is empty.
 *
 * Invariants:
 *  - every buffer is device memory of the communicator's device, and every
 *    call first makes that device current on the calling thread;
 *  - each communicator owns one non-blocking CUDA stream, and all of its
 *    operations are queued there in call order. Each call first makes the
 *    stream wait for an event recorded on the legacy default stream (the
 *    "input fence"), so work queued earlier on the default stream or on any
 *    blocking stream — the kernels that produced the send buffers — runs
 *    before the collective reads them; and, when an input stream was given
 *    (mt_comm_nccl_set_input_stream: the cuda backend's non-blocking stream,
 *    which the legacy stream does not order), on an event recorded there too;
 *  - blocking calls return with the operation complete (host-synchronous,
 *    as with MPI); i* calls return once it is queued, with a cudaEvent
 *    recorded after it in the request, and mt_comm_wait waits for that event;
 *  - every wait (the end of a blocking call, mt_comm_wait, destroy) polls
 *    for completion AND ncclCommGetAsyncError, and gives up after
 *    timeout_s: an asynchronous NCCL error or the timeout aborts the NCCL
 *    communicator (ncclCommAbort) and returns MT_ERR_COMM. A dead peer is an
 *    error, never a hang. An aborted communicator fails every later call at
 *    once with MT_ERR_COMM (destroy still frees it);
 *  - NCCL and CUDA status codes become an mt_status + message at one macro,
 *    VENDOR_CHECK_GEN. Nothing here aborts the process.
 *
 * NCCL counts are size_t: unlike MPI there is no INT_MAX limit anywhere.
 */
#define _GNU_SOURCE
#include "comm_nccl.h"
#include "comm_impl.h"
#include "../core/mt_knobs.h"

#ifdef MT_WITH_NCCL

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 13, 0)
#error "comm_nccl.c needs NCCL >= 2.13 (ncclGetLastError, ncclCommGetAsyncError)"
#endif

/* ncclCommSplit arrived in NCCL 2.18. Before it, a split creates the child
 * from a fresh unique id broadcast over a host (MPI) group that every NCCL
 * communicator then keeps alongside it. Define MT_NCCL_SPLIT_BY_ID to force
 * that path on a newer NCCL (tests/test_nccl_build.sh compiles it so). */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0) && !defined(MT_NCCL_SPLIT_BY_ID)
#define MT_NCCL_SPLIT_BY_ID 1
#endif

/* Runtime tunable (knob nccl_timeout_s in src/core/knobs.c, env alias
 * below): how long one wait may last before the communicator is declared
 * dead and aborted. Read once, when the world is created; splits inherit it.
 * The default here matches the knob table's. */
#define MT_NCCL_TIMEOUT_ENV       "MT_NCCL_TIMEOUT_S"
#define MT_NCCL_TIMEOUT_DEFAULT_S 600.0

/* Wait loop pacing: the first polls spin (small collectives finish in
 * microseconds), later ones sleep between queries to leave the core to the
 * OpenMP workers. */
#define MT_NCCL_SPIN_POLLS    1000UL
#define MT_NCCL_POLL_SLEEP_NS 20000L

struct nccl_comm {
    struct mt_comm  base;       /* first: the struct mt_comm * of an "nccl" comm points here */
    ncclComm_t      nccl;       /* NULL once aborted                                          */
    cudaStream_t    stream;     /* non-blocking; every operation of this comm is queued here  */
    cudaEvent_t     fence;      /* input fence, recorded on the legacy default stream         */
    cudaStream_t    input;      /* also fenced on (the producing backend's stream); NULL: none */
    int32_t        *word;       /* (1) device int: barrier payload, stand-in empty p2p buffer */
    int             device;     /* CUDA ordinal                                               */
    int             aborted;    /* 1 after ncclCommAbort                                      */
    double          timeout_s;  /* one wait's limit (MT_NCCL_TIMEOUT_S)                       */
    struct mt_comm *host;       /* MT_NCCL_SPLIT_BY_ID: owned host group over the same ranks,
                                   same order (bootstraps the ids of splits); else NULL       */
};

struct nccl_req {
    struct mt_comm_req base;    /* first */
    cudaEvent_t        done;    /* recorded on the comm stream after the operation */
};

static const struct mt_comm_i nccl_iface;

static inline struct nccl_comm *as_nccl(struct mt_comm *c)
{
    return (struct nccl_comm *)c;
}

/* ------------------------------------------------------------------ */
/* the one conversion boundary: CUDA / NCCL codes -> mt_status + text  */
/* ------------------------------------------------------------------ */

static enum mt_status cuda_to_status(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return MT_ERR_OOM;
    case cudaErrorInvalidDevice:    /* a device ordinal the caller chose */
    case cudaErrorInvalidValue:     return MT_ERR_INVALID_ARG;
    default:                        return MT_ERR_RUNTIME;
    }
}

static enum mt_status nccl_to_status(ncclResult_t r)
{
    switch (r) {
    case ncclInvalidArgument:       /* e.g. a host pointer, or a buffer on another device */
    case ncclInvalidUsage:          return MT_ERR_INVALID_ARG;
    default:                        return MT_ERR_COMM; /* system, internal, remote, CUDA */
    }
}

/* NCCL keeps a human-readable reason (peer, transport, errno) per thread. */
static const char *nccl_detail(ncclResult_t r)
{
    (void)r;
    return ncclGetLastError(NULL);
}

static enum mt_status vendor_error(struct mt_ctx *ctx, enum mt_status st, const char *what, const char *text,
                                   const char *detail, const char *file, int line)
{
    if (detail && detail[0])
        return mt_ctx_error(ctx, st, "%s failed: %s [%s] (%s:%d)", what, text, detail, file, line);
    return mt_ctx_error(ctx, st, "%s failed: %s (%s:%d)", what, text, file, line);
}

/* Evaluate `value` (of vendor type `type`) once; unless it equals
 * `success`, record the message on ctx and RETURN the mt_status from the
 * enclosing function (ggml's CUDA_CHECK_GEN, but returning). Functions that
 * must clean up call a small helper that uses it. */
#define VENDOR_CHECK_GEN(ctx, type, value, what, success, to_status, to_string, to_detail)               \
    do {                                                                                                \
        type vendor_rc_ = (value);                                                                      \
        if (vendor_rc_ != (success))                                                                    \
            return vendor_error((ctx), to_status(vendor_rc_), (what), to_string(vendor_rc_),            \
                                to_detail(vendor_rc_), __FILE__, __LINE__);                             \
    } while (0)

#define CUDA_CHECK_AS(ctx, value, what) \
    VENDOR_CHECK_GEN(ctx, cudaError_t, value, what, cudaSuccess, cuda_to_status, cudaGetErrorString, cudaGetErrorName)
#define NCCL_CHECK_AS(ctx, value, what) \
    VENDOR_CHECK_GEN(ctx, ncclResult_t, value, what, ncclSuccess, nccl_to_status, ncclGetErrorString, nccl_detail)
#define CUDA_CHECK(ctx, call) CUDA_CHECK_AS(ctx, call, #call)
#define NCCL_CHECK(ctx, call) NCCL_CHECK_AS(ctx, call, #call)

/* ------------------------------------------------------------------ */
/* types, device binding, waiting                                      */
/* ------------------------------------------------------------------ */

static ncclDataType_t nccl_dtype(enum mt_dtype dt)
{
    switch (dt) {
    case MT_DTYPE_F32: return ncclFloat32;
    case MT_DTYPE_F64: return ncclFloat64;
    case MT_DTYPE_I32: return ncclInt32;
    case MT_DTYPE_I64: return ncclInt64;
    case MT_DTYPE_U8:  return ncclUint8;
    case MT_DTYPE_BF16:
        /* ncclBfloat16 (= 9 since NCCL 2.10; its enum name is declared only
         * when cuda_bf16.h was seen before nccl.h on NCCL < 2.19, hence the
         * value): the sum accumulates each pair in fp32, stored in bf16 */
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
        return (ncclDataType_t)9;
#else
        return ncclNumTypes;   /* no bf16 in this NCCL: the call fails, named */
#endif
    }
    return ncclNumTypes; /* unreachable: comm.c checked dt; NCCL would refuse it */
}

static ncclRedOp_t nccl_op(enum mt_redop op)
{
    switch (op) {
    case MT_REDOP_SUM: return ncclSum;
    case MT_REDOP_MAX: return ncclMax;
    case MT_REDOP_MIN: return ncclMin;
    }
    return ncclNumOps; /* unreachable: comm.c checked op */
}

static enum mt_status bind_device(struct mt_ctx *ctx, const struct nccl_comm *nc)
{
    CUDA_CHECK(ctx, cudaSetDevice(nc->device));
    return MT_OK;
}

static enum mt_status aborted_error(struct mt_ctx *ctx, const char *op)
{
    return mt_ctx_error(ctx, MT_ERR_COMM, "%s: the NCCL communicator was aborted after an earlier failure "
                        "(peer error or %s timeout); recreate it", op, MT_NCCL_TIMEOUT_ENV);
}

/* Stop NCCL's kernels and proxy threads for good and drop the handle. The
 * stream, events and device word stay until destroy. */
static void abort_comm(struct nccl_comm *nc)
{
    if (nc->nccl) (void)ncclCommAbort(nc->nccl);
    nc->nccl = NULL;
    nc->aborted = 1;
}

/* Convert an asynchronous NCCL error (a peer died, a connection broke)
 * while the handle still exists, so that its last-error text is kept. */
static enum mt_status async_error(struct mt_ctx *ctx, ncclResult_t r)
{
    NCCL_CHECK_AS(ctx, r, "NCCL asynchronous error (ncclCommGetAsyncError; communicator aborted)");
    return MT_OK;
}

static void poll_pause(unsigned long n)
{
    if (n < MT_NCCL_SPIN_POLLS) return;
    struct timespec ts = {0, MT_NCCL_POLL_SLEEP_NS};
    nanosleep(&ts, NULL);
}

/*
 * HOW IT WORKS — waiting without hanging
 *
 *   t0 = now
 *   loop:
 *     q = ev ? cudaEventQuery(ev) : cudaStreamQuery(stream)
 *     q == success      -> done
 *     q != not-ready    -> CUDA error (the context is broken; no abort)
 *     ncclCommGetAsyncError(comm) != success/in-progress
 *                       -> message, ncclCommAbort, MT_ERR_COMM
 *     now - t0 > timeout_s
 *                       -> ncclCommAbort, MT_ERR_COMM naming MT_NCCL_TIMEOUT_S
 *     spin (first MT_NCCL_SPIN_POLLS polls), then sleep 20 us per poll
 *
 * An NCCL kernel waiting for a dead peer never finishes by itself; only
 * NCCL's proxy thread notices the broken connection (async error) — or
 * nothing does, if the peer hangs rather than dies (timeout). ncclCommAbort
 * makes the kernels return, so the stream drains afterwards. ev == NULL
 * waits for everything queued on the comm stream (blocking calls). ctx may
 * be NULL (destroy): then the message is dropped, the status kept.
 */
static enum mt_status await(struct mt_ctx *ctx, struct nccl_comm *nc, cudaEvent_t ev, const char *op)
{
    double t0 = mt_time_sec();
    for (unsigned long n = 0;; n++) {
        cudaError_t q = ev ? cudaEventQuery(ev) : cudaStreamQuery(nc->stream);
        if (q == cudaSuccess) return MT_OK;
        if (q != cudaErrorNotReady) CUDA_CHECK_AS(ctx, q, ev ? "cudaEventQuery" : "cudaStreamQuery");
        ncclResult_t async = ncclSuccess;
        ncclResult_t qr = ncclCommGetAsyncError(nc->nccl, &async);
        if (qr != ncclSuccess) async = qr;
        if (async != ncclSuccess && async != ncclInProgress) {
            enum mt_status st = async_error(ctx, async);
            abort_comm(nc);
            return st;
        }
        if (mt_time_sec() - t0 > nc->timeout_s) {
            abort_comm(nc);
            return mt_ctx_error(ctx, MT_ERR_COMM,
                                "%s: NCCL operation not complete after %g s (%s): a peer is dead or stuck; "
                                "communicator aborted", op, nc->timeout_s, MT_NCCL_TIMEOUT_ENV);
        }
        poll_pause(n);
    }
}

/* Start of every operation: refuse an aborted comm, bind the device, and
 * order the comm stream after the legacy default stream and the input
 * stream (input fence). One event serves both: cudaStreamWaitEvent waits
 * for the record that precedes it, so re-recording afterwards is safe. */
static enum mt_status enter(struct mt_ctx *ctx, struct nccl_comm *nc, const char *op)
{
    if (nc->aborted) return aborted_error(ctx, op);
    MT_CHECK(bind_device(ctx, nc));
    CUDA_CHECK(ctx, cudaEventRecord(nc->fence, cudaStreamLegacy));
    CUDA_CHECK(ctx, cudaStreamWaitEvent(nc->stream, nc->fence, 0));
    if (nc->input) {
        CUDA_CHECK(ctx, cudaEventRecord(nc->fence, nc->input));
        CUDA_CHECK(ctx, cudaStreamWaitEvent(nc->stream, nc->fence, 0));
    }
    return MT_OK;
}

/* Close a group: NCCL must see ncclGroupEnd even when a post inside the
 * group failed (it then drops the group); the first error wins. */
static enum mt_status group_end(struct mt_ctx *ctx, enum mt_status posted)
{
    if (posted != MT_OK) {
        (void)ncclGroupEnd();
        return posted;
    }
    NCCL_CHECK(ctx, ncclGroupEnd());
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* posting: queue one operation on the comm stream (no waiting)        */
/* ------------------------------------------------------------------ */

static enum mt_status post_allreduce(struct mt_ctx *ctx, struct nccl_comm *nc, void *buf, size_t count,
                                     enum mt_dtype dt, enum mt_redop op)
{
    if (count == 0) return MT_OK; /* same count on every rank: all skip */
    NCCL_CHECK(ctx, ncclAllReduce(buf, buf, count, nccl_dtype(dt), nccl_op(op), nc->nccl, nc->stream));
    return MT_OK;
}

/* NCCL's in-place rule is ours: recv == send + rank*count. */
static enum mt_status post_reduce_scatter(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                          size_t count, enum mt_dtype dt)
{
    if (count == 0) return MT_OK;
    NCCL_CHECK(ctx, ncclReduceScatter(send, recv, count, nccl_dtype(dt), ncclSum, nc->nccl, nc->stream));
    return MT_OK;
}

/* In place when send == recv + rank*count: NCCL's rule and ours. */
static enum mt_status post_allgather(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                     size_t count, enum mt_dtype dt)
{
    if (count == 0) return MT_OK;
    NCCL_CHECK(ctx, ncclAllGather(send, recv, count, nccl_dtype(dt), nc->nccl, nc->stream));
    return MT_OK;
}

/* Equal counts at consecutive displacements (displs[r] = displs[0] +
 * r*counts[0]): the v-collective is the plain one on the shifted buffer. */
static int v_is_uniform(const struct nccl_comm *nc, const size_t *counts, const size_t *displs)
{
    for (int r = 1; r < nc->base.size; r++)
        if (counts[r] != counts[0] || displs[r] != displs[0] + (size_t)r * counts[0]) return 0;
    return 1;
}

/*
 * HOW IT WORKS — the v-collectives (NCCL has neither)
 *
 * allgatherv:      group { for r with counts[r] > 0:
 *                            ncclBroadcast(root r, send -> recv + displs[r]) }
 * reduce_scatterv: group { for r with counts[r] > 0:
 *                            ncclReduce(root r, send + displs[r] -> recv on r) }
 *
 * One group, so NCCL launches the size operations together instead of
 * serialising them; every rank sees the same counts, so every rank posts
 * the same sequence (an empty block is skipped everywhere). Per rank this
 * moves about sum(counts) elements, as the ring allgather / reduce-scatter
 * would. Gaps between blocks are never touched. The uniform case (equal
 * counts, consecutive blocks) goes to ncclAllGather / ncclReduceScatter
 * directly: same result, NCCL's tuned algorithm.
 */
static enum mt_status post_bcast_blocks(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                        const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    size_t es = mt_dtype_size(dt);
    for (int r = 0; r < nc->base.size; r++) {
        if (counts[r] == 0) continue;
        char *dst = (char *)recv + displs[r] * es;
        const void *src = r == nc->base.rank ? send : dst; /* sendbuff is read on the root only */
        NCCL_CHECK(ctx, ncclBroadcast(src, dst, counts[r], nccl_dtype(dt), r, nc->nccl, nc->stream));
    }
    return MT_OK;
}

static enum mt_status post_allgatherv(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                      const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    if (v_is_uniform(nc, counts, displs)) {
        if (counts[0] == 0) return MT_OK; /* every block empty: recv may be NULL */
        return post_allgather(ctx, nc, (char *)recv + displs[0] * mt_dtype_size(dt), send, counts[0], dt);
    }
    NCCL_CHECK(ctx, ncclGroupStart());
    return group_end(ctx, post_bcast_blocks(ctx, nc, recv, send, counts, displs, dt));
}

static enum mt_status post_reduce_blocks(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                         const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    size_t es = mt_dtype_size(dt);
    for (int r = 0; r < nc->base.size; r++) {
        if (counts[r] == 0) continue;
        const char *src = (const char *)send + displs[r] * es;
        void *dst = r == nc->base.rank ? recv : (void *)src; /* recvbuff is written on the root only */
        NCCL_CHECK(ctx, ncclReduce(src, dst, counts[r], nccl_dtype(dt), ncclSum, r, nc->nccl, nc->stream));
    }
    return MT_OK;
}

static enum mt_status post_reduce_scatterv(struct mt_ctx *ctx, struct nccl_comm *nc, void *recv, const void *send,
                                           const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    if (v_is_uniform(nc, counts, displs)) {
        if (counts[0] == 0) return MT_OK;
        return post_reduce_scatter(ctx, nc, recv, (const char *)send + displs[0] * mt_dtype_size(dt), counts[0], dt);
    }
    NCCL_CHECK(ctx, ncclGroupStart());
    return group_end(ctx, post_reduce_blocks(ctx, nc, recv, send, counts, displs, dt));
}

/* ------------------------------------------------------------------ */
/* blocking collectives: enter, post, wait for the stream              */
/* ------------------------------------------------------------------ */

static enum mt_status nccl_allreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                     enum mt_dtype dt, enum mt_redop op)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "allreduce"));
    MT_CHECK(post_allreduce(ctx, nc, buf, count, dt, op));
    return await(ctx, nc, NULL, "allreduce");
}

static enum mt_status nccl_reduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                          size_t count, enum mt_dtype dt)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "reduce_scatter"));
    MT_CHECK(post_reduce_scatter(ctx, nc, recv, send, count, dt));
    return await(ctx, nc, NULL, "reduce_scatter");
}

static enum mt_status nccl_allgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                     size_t count, enum mt_dtype dt)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "allgather"));
    MT_CHECK(post_allgather(ctx, nc, recv, send, count, dt));
    return await(ctx, nc, NULL, "allgather");
}

/* In place (NCCL's broadcast with sendbuff == recvbuff). */
static enum mt_status nccl_bcast(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                 enum mt_dtype dt, int root)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "bcast"));
    if (count > 0)
        NCCL_CHECK(ctx, ncclBroadcast(buf, buf, count, nccl_dtype(dt), root, nc->nccl, nc->stream));
    return await(ctx, nc, NULL, "bcast");
}

/* Every peer but this rank: one ncclSend / ncclRecv per non-empty block. */
static enum mt_status post_exchange(struct mt_ctx *ctx, struct nccl_comm *nc, const void *send,
                                    const size_t *send_counts, const size_t *send_displs, void *recv,
                                    const size_t *recv_counts, const size_t *recv_displs, enum mt_dtype dt)
{
    size_t es = mt_dtype_size(dt);
    for (int p = 0; p < nc->base.size; p++) {
        if (p == nc->base.rank) continue;
        if (send_counts[p] > 0)
            NCCL_CHECK(ctx, ncclSend((const char *)send + send_displs[p] * es, send_counts[p], nccl_dtype(dt), p,
                                     nc->nccl, nc->stream));
        if (recv_counts[p] > 0)
            NCCL_CHECK(ctx, ncclRecv((char *)recv + recv_displs[p] * es, recv_counts[p], nccl_dtype(dt), p,
                                     nc->nccl, nc->stream));
    }
    return MT_OK;
}

/* All-to-all with variable blocks: this rank's own block is a device copy
 * on the comm stream, every other block one grouped send/recv (NCCL matches
 * them per peer, in posting order). A count mismatch between two ranks
 * cannot be seen locally: NCCL then hangs or fails, and the wait turns that
 * into an error. */
static enum mt_status post_alltoallv(struct mt_ctx *ctx, struct nccl_comm *nc,
                                     const void *send, const size_t *send_counts, const size_t *send_displs,
                                     void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                     enum mt_dtype dt)
{
    int me = nc->base.rank;
    size_t es = mt_dtype_size(dt);
    NCCL_CHECK(ctx, ncclGroupStart());
    MT_CHECK(group_end(ctx, post_exchange(ctx, nc, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt)));
    if (send_counts[me] > 0) {
        const char *own_src = (const char *)send + send_displs[me] * es;
        char *own_dst = (char *)recv + recv_displs[me] * es;
        if (own_src != own_dst)
            CUDA_CHECK(ctx, cudaMemcpyAsync(own_dst, own_src, send_counts[me] * es, cudaMemcpyDeviceToDevice, nc->stream));
    }
    return MT_OK;
}

static enum mt_status nccl_alltoallv(struct mt_ctx *ctx, struct mt_comm *c,
                                     const void *send, const size_t *send_counts, const size_t *send_displs,
                                     void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                     enum mt_dtype dt)
{
    struct nccl_comm *nc = as_nccl(c);
    int me = nc->base.rank;
    if (send_counts[me] != recv_counts[me])
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: rank %d sends %zu elements to itself but expects %zu",
                            me, send_counts[me], recv_counts[me]);
    for (int p = 0; p < nc->base.size; p++)
        if ((send_counts[p] > 0 && !send) || (recv_counts[p] > 0 && !recv))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "alltoallv: NULL buffer with a non-zero count for rank %d", p);
    MT_CHECK(enter(ctx, nc, "alltoallv"));
    enum mt_status st = post_alltoallv(ctx, nc, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt);
    if (st != MT_OK) {
        (void)await(NULL, nc, NULL, "alltoallv"); /* the exchange may be queued already: drain it */
        return st;
    }
    return await(ctx, nc, NULL, "alltoallv");
}

/* NCCL has no barrier: a 1-element allreduce cannot complete on any rank
 * before every rank has joined it, and the wait makes it host-visible. */
static enum mt_status nccl_barrier(struct mt_ctx *ctx, struct mt_comm *c)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "barrier"));
    NCCL_CHECK(ctx, ncclAllReduce(nc->word, nc->word, 1, ncclInt32, ncclSum, nc->nccl, nc->stream));
    return await(ctx, nc, NULL, "barrier");
}

static enum mt_status nccl_allgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "allgatherv"));
    MT_CHECK(post_allgatherv(ctx, nc, recv, send, counts, displs, dt));
    return await(ctx, nc, NULL, "allgatherv");
}

static enum mt_status nccl_reduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                           const size_t *counts, const size_t *displs, enum mt_dtype dt)
{
    struct nccl_comm *nc = as_nccl(c);
    MT_CHECK(enter(ctx, nc, "reduce_scatterv"));
    MT_CHECK(post_reduce_scatterv(ctx, nc, recv, send, counts, displs, dt));
    return await(ctx, nc, NULL, "reduce_scatterv");
}

/* ------------------------------------------------------------------ */
/* non-blocking: the request is an event recorded after the operation  */
/* ------------------------------------------------------------------ */

static enum mt_status event_create(struct mt_ctx *ctx, cudaEvent_t *ev)
{
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
    return MT_OK;
}

static enum mt_status event_record(struct mt_ctx *ctx, cudaEvent_t ev, cudaStream_t s)
{
    CUDA_CHECK(ctx, cudaEventRecord(ev, s));
    return MT_OK;
}

static void req_free(struct nccl_req *r)
{
    struct mt_ctx *owner = r->base.ctx;
    if (r->done) (void)cudaEventDestroy(r->done); /* released once complete, if still pending */
    mt_free(owner, r->base.scratch);
    mt_free(owner, r);
}

/* Allocated (with its event) BEFORE the post, so that a queued operation
 * always has a request to wait on. */
static enum mt_status req_new(struct mt_ctx *ctx, struct nccl_comm *nc, struct nccl_req **out)
{
    *out = NULL;
    struct nccl_req *r = mt_alloc(ctx, sizeof *r, MT_BUCKET_COMM);
    if (!r) return MT_ERR_OOM;
    r->base.comm = &nc->base;
    r->base.ctx = ctx;
    r->base.scratch = NULL; /* counts/displs are consumed while posting: nothing to keep */
#ifdef MT_WITH_MPI
    r->base.mpi = MPI_REQUEST_NULL;
#endif
    enum mt_status st = event_create(ctx, &r->done);
    if (st != MT_OK) {
        r->done = NULL;
        req_free(r);
        return st;
    }
    *out = r;
    return MT_OK;
}

/* End of an i* call: a failed post frees r (nothing is pending); a good one
 * gets its event. Should recording fail, the queued work is drained here
 * (bounded by the timeout) so that no operation outlives the call unseen. */
static enum mt_status req_finish(struct mt_ctx *ctx, struct nccl_comm *nc, struct nccl_req *r, enum mt_status posted,
                                 struct mt_comm_req **out)
{
    if (posted != MT_OK) {
        req_free(r);
        return posted;
    }
    enum mt_status st = event_record(ctx, r->done, nc->stream);
    if (st != MT_OK) {
        (void)await(NULL, nc, NULL, "drain");
        req_free(r);
        return st;
    }
    *out = &r->base;
    return MT_OK;
}

static enum mt_status nccl_iallreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                      enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req)
{
    struct nccl_comm *nc = as_nccl(c);
    struct nccl_req *r;
    MT_CHECK(enter(ctx, nc, "iallreduce"));
    MT_CHECK(req_new(ctx, nc, &r));
    return req_finish(ctx, nc, r, post_allreduce(ctx, nc, buf, count, dt, op), req);
}

static enum mt_status nccl_ireduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                           size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    struct nccl_comm *nc = as_nccl(c);
    struct nccl_req *r;
    MT_CHECK(enter(ctx, nc, "ireduce_scatter"));
    MT_CHECK(req_new(ctx, nc, &r));
    return req_finish(ctx, nc, r, post_reduce_scatter(ctx, nc, recv, send, count, dt), req);
}

static enum mt_status nccl_iallgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      size_t count, enum mt_dtype dt, struct mt_comm_req **req)
{
    struct nccl_comm *nc = as_nccl(c);
    struct nccl_req *r;
    MT_CHECK(enter(ctx, nc, "iallgather"));
    MT_CHECK(req_new(ctx, nc, &r));
    return req_finish(ctx, nc, r, post_allgather(ctx, nc, recv, send, count, dt), req);
}

static enum mt_status nccl_iallgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                       struct mt_comm_req **req)
{
    struct nccl_comm *nc = as_nccl(c);
    struct nccl_req *r;
    MT_CHECK(enter(ctx, nc, "iallgatherv"));
    MT_CHECK(req_new(ctx, nc, &r));
    return req_finish(ctx, nc, r, post_allgatherv(ctx, nc, recv, send, counts, displs, dt), req);
}

static enum mt_status nccl_ireduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                            const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                            struct mt_comm_req **req)
{
    struct nccl_comm *nc = as_nccl(c);
    struct nccl_req *r;
    MT_CHECK(enter(ctx, nc, "ireduce_scatterv"));
    MT_CHECK(req_new(ctx, nc, &r));
    return req_finish(ctx, nc, r, post_reduce_scatterv(ctx, nc, recv, send, counts, displs, dt), req);
}

/* Errors go to the ctx passed here; memory returns to the request's owner. */
static enum mt_status nccl_wait(struct mt_ctx *ctx, struct mt_comm_req *req)
{
    struct nccl_req *r = (struct nccl_req *)req;
    struct nccl_comm *nc = as_nccl(req->comm);
    enum mt_status st;
    if (nc->aborted) {
        st = aborted_error(ctx, "wait");
    } else {
        st = bind_device(ctx, nc);
        if (st == MT_OK) st = await(ctx, nc, r->done, "wait");
    }
    req_free(r);
    return st;
}

/* ------------------------------------------------------------------ */
/* batched point-to-point                                              */
/* ------------------------------------------------------------------ */

/*
 * HOW IT WORKS — tags on a library without tags
 *
 * MPI pairs the k-th send with tag t from A to B with the k-th receive of
 * tag t at B from A. NCCL has no tags: inside a group it pairs the sends
 * from A to B with the receives at B from A in posting order. Posting each
 * side's ops to one peer sorted by (tag, position in the batch) gives NCCL
 * the pairing MPI would have made; ops to different peers are independent.
 * Everything is one group, so the order of ops in the batch cannot
 * deadlock (a ring's "send next, receive previous" included). A send to
 * this rank itself is NCCL's local copy.
 */
struct p2p_key {
    int peer, kind, tag, idx;
};

static int p2p_key_cmp(const void *a, const void *b)
{
    const struct p2p_key *x = a, *y = b;
    if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static enum mt_status post_p2p_ops(struct mt_ctx *ctx, struct nccl_comm *nc, const struct mt_p2p_op *ops,
                                   const struct p2p_key *keys, int n_ops)
{
    for (int k = 0; k < n_ops; k++) {
        const struct mt_p2p_op *o = &ops[keys[k].idx];
        void *buf = o->buf ? o->buf : (void *)nc->word; /* count 0: still posted, so pairing holds */
        if (o->kind == MT_P2P_SEND)
            NCCL_CHECK(ctx, ncclSend(buf, o->count, nccl_dtype(o->dt), o->peer, nc->nccl, nc->stream));
        else
            NCCL_CHECK(ctx, ncclRecv(buf, o->count, nccl_dtype(o->dt), o->peer, nc->nccl, nc->stream));
    }
    return MT_OK;
}

static enum mt_status post_p2p(struct mt_ctx *ctx, struct nccl_comm *nc, const struct mt_p2p_op *ops,
                               const struct p2p_key *keys, int n_ops)
{
    MT_CHECK(enter(ctx, nc, "sendrecv_batch"));
    NCCL_CHECK(ctx, ncclGroupStart());
    return group_end(ctx, post_p2p_ops(ctx, nc, ops, keys, n_ops));
}

static enum mt_status nccl_sendrecv_batch(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                          const struct mt_p2p_op *ops)
{
    struct nccl_comm *nc = as_nccl(c);
    struct p2p_key *keys = mt_alloc(ctx, (size_t)n_ops * sizeof *keys, MT_BUCKET_COMM);
    if (!keys) return MT_ERR_OOM;
    for (int i = 0; i < n_ops; i++)
        keys[i] = (struct p2p_key){ops[i].peer, (int)ops[i].kind, ops[i].tag, i};
    qsort(keys, (size_t)n_ops, sizeof *keys, p2p_key_cmp);
    enum mt_status st = post_p2p(ctx, nc, ops, keys, n_ops);
    mt_free(ctx, keys);
    MT_CHECK(st);
    return await(ctx, nc, NULL, "sendrecv_batch");
}

/* ------------------------------------------------------------------ */
/* creation, split, destroy                                            */
/* ------------------------------------------------------------------ */

/* Frees what comm_alloc made (all of it, whatever stage it reached); the
 * NCCL handle is the caller's business (destroy or abort first). */
static void comm_release(struct nccl_comm *nc)
{
    (void)cudaSetDevice(nc->device);
    if (nc->word) (void)cudaFree(nc->word);
    if (nc->fence) (void)cudaEventDestroy(nc->fence);
    if (nc->stream) (void)cudaStreamDestroy(nc->stream);
    mt_comm_destroy(nc->host);
    mt_free(nc->base.ctx, nc);
}

static enum mt_status comm_alloc_device(struct mt_ctx *ctx, struct nccl_comm *nc)
{
    CUDA_CHECK(ctx, cudaSetDevice(nc->device));
    CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking));
    CUDA_CHECK(ctx, cudaEventCreateWithFlags(&nc->fence, cudaEventDisableTiming));
    CUDA_CHECK(ctx, cudaMalloc((void **)&nc->word, sizeof *nc->word));
    CUDA_CHECK(ctx, cudaMemsetAsync(nc->word, 0, sizeof *nc->word, nc->stream));
    return MT_OK;
}

/* The local, non-collective half of creating a communicator: struct,
 * device, stream, fence event, device word (size 1 / rank 0 and no NCCL
 * handle until the caller attaches one). On failure nothing is held. */
static enum mt_status comm_alloc(struct mt_ctx *ctx, int device, double timeout_s, struct nccl_comm **out)
{
    *out = NULL;
    struct nccl_comm *nc = mt_alloc(ctx, sizeof *nc, MT_BUCKET_COMM); /* zero-filled: handles NULL */
    if (!nc) return MT_ERR_OOM;
    nc->base.iface = &nccl_iface;
    nc->base.size = 1;
    nc->base.rank = 0;
    nc->base.ctx = ctx;
#ifdef MT_WITH_MPI
    nc->base.mpi = MPI_COMM_NULL; /* not an MPI communicator */
#endif
    nc->device = device;
    nc->timeout_s = timeout_s;
    enum mt_status st = comm_alloc_device(ctx, nc);
    if (st != MT_OK) {
        comm_release(nc);
        return st;
    }
    *out = nc;
    return MT_OK;
}

static enum mt_status read_timeout(struct mt_ctx *ctx, double *out)
{
    /* knob nccl_timeout_s (env alias MT_NCCL_TIMEOUT_S): a command-line or
     * config value was checked when set; the alias's text is checked here */
    *out = MT_NCCL_TIMEOUT_DEFAULT_S;
    const char *s = mt_knob_str(ctx, MT_KNOB_NCCL_TIMEOUT);
    if (!s || !s[0]) return MT_OK;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v) || !(v > 0))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "%s=%s: expected a positive number of seconds", MT_NCCL_TIMEOUT_ENV, s);
    *out = v;
    return MT_OK;
}

static enum mt_status unique_id(struct mt_ctx *ctx, ncclUniqueId *id)
{
    NCCL_CHECK(ctx, ncclGetUniqueId(id));
    return MT_OK;
}

static enum mt_status init_rank(struct mt_ctx *ctx, struct nccl_comm *nc, int n, ncclUniqueId id, int rank)
{
    CUDA_CHECK(ctx, cudaSetDevice(nc->device));
    NCCL_CHECK(ctx, ncclCommInitRank(&nc->nccl, n, id, rank));
    return MT_OK;
}

/*
 * HOW IT WORKS — bootstrapping over a host group
 *
 *   every rank:  local = [caller's checks] + comm_alloc (device, stream,
 *                event, word) + (host rank 0) ncclGetUniqueId
 *   allreduce(MIN, ok = local succeeded) over host       # everyone learns
 *   if !ok: every rank returns an error                  # nobody enters init
 *   bcast(id, 128 bytes U8, root 0) over host
 *   ncclCommInitRank(host.size, id, host.rank)           # NCCL rank = host rank
 *
 * ncclCommInitRank waits for all ranks with no timeout, so a rank that
 * failed locally must not leave the others there: hence the agreement
 * first. `local` carries a failure the caller found before (it still takes
 * part). `keep` (may be NULL) is stored in the new comm, or destroyed on
 * failure.
 */
static enum mt_status create_from_host(struct mt_ctx *ctx, struct mt_comm *host, int device, double timeout_s,
                                       enum mt_status local, struct mt_comm *keep, struct mt_comm **out)
{
    struct nccl_comm *nc = NULL;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (local == MT_OK) local = comm_alloc(ctx, device, timeout_s, &nc);
    if (local == MT_OK && host->rank == 0) local = unique_id(ctx, &id);
    int32_t ok = local == MT_OK;
    enum mt_status st = mt_comm_allreduce(ctx, host, &ok, 1, MT_DTYPE_I32, MT_REDOP_MIN);
    if (st == MT_OK && !ok)
        st = local != MT_OK ? local
                            : mt_ctx_error(ctx, MT_ERR_COMM, "nccl create: another rank failed to prepare its device "
                                           "or the unique id (see that rank's error); no communicator created");
    if (st == MT_OK) st = mt_comm_bcast(ctx, host, &id, sizeof id, MT_DTYPE_U8, 0);
    if (st == MT_OK) st = init_rank(ctx, nc, host->size, id, host->rank);
    if (st != MT_OK) {
        mt_comm_destroy(keep);
        if (nc) comm_release(nc);
        return st;
    }
    nc->base.size = host->size;
    nc->base.rank = host->rank;
    nc->host = keep;
    *out = &nc->base;
    return MT_OK;
}

#ifdef MT_NCCL_SPLIT_BY_ID

/* The child's host group is MPI_Comm_split of the parent's (same colour,
 * key; ties by parent rank, as ncclCommSplit orders them), and the child
 * NCCL comm is bootstrapped over it — and keeps it for its own splits. */
static enum mt_status nccl_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                                 struct mt_comm **out)
{
    struct nccl_comm *p = as_nccl(parent);
    struct mt_comm *child_host = NULL;
    MT_CHECK(mt_comm_split(ctx, p->host, colour, key, &child_host)); /* collective over the parent */
    if (!child_host) return MT_OK;                                   /* colour UNDEFINED           */
    enum mt_status local = p->aborted ? aborted_error(ctx, "split") : MT_OK;
    MT_CHECK(create_from_host(ctx, child_host, p->device, p->timeout_s, local, child_host, out));
    as_nccl(*out)->input = p->input;  /* the child fences on the parent's input stream */
    return MT_OK;
}

#else /* ncclCommSplit */

static enum mt_status comm_count(struct mt_ctx *ctx, ncclComm_t comm, int *size, int *rank)
{
    NCCL_CHECK(ctx, ncclCommCount(comm, size));
    NCCL_CHECK(ctx, ncclCommUserRank(comm, rank));
    return MT_OK;
}

static enum mt_status split_handle(struct mt_ctx *ctx, struct nccl_comm *p, int colour, int key, ncclComm_t *out)
{
    MT_CHECK(bind_device(ctx, p));
    /* config NULL: the child inherits the parent's (blocking) config */
    NCCL_CHECK(ctx, ncclCommSplit(p->nccl, colour == MT_COMM_UNDEFINED ? NCCL_SPLIT_NOCOLOR : colour, key, out, NULL));
    return MT_OK;
}

/* ncclCommSplit orders the child's ranks by key, ties by parent rank — as
 * MPI_Comm_split does. A rank that fails locally after the split aborts its
 * handle; its peers then see that at their first wait (async error or
 * timeout), not in a hang. */
static enum mt_status nccl_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                                 struct mt_comm **out)
{
    struct nccl_comm *p = as_nccl(parent);
    if (p->aborted) return aborted_error(ctx, "split"); /* the other ranks wait in ncclCommSplit: see docs */
    ncclComm_t child = NULL;
    MT_CHECK(split_handle(ctx, p, colour, key, &child));
    if (!child) return MT_OK; /* NCCL_SPLIT_NOCOLOR */
    struct nccl_comm *nc = NULL;
    int size = 0, rank = 0;
    enum mt_status st = comm_alloc(ctx, p->device, p->timeout_s, &nc);
    if (st == MT_OK) st = comm_count(ctx, child, &size, &rank);
    if (st != MT_OK) {
        (void)ncclCommAbort(child);
        if (nc) comm_release(nc);
        return st;
    }
    nc->nccl = child;
    nc->base.size = size;
    nc->base.rank = rank;
    nc->input = p->input;  /* the child fences on the parent's input stream */
    *out = &nc->base;
    return MT_OK;
}

#endif /* MT_NCCL_SPLIT_BY_ID */

/* A healthy comm first drains its stream (bounded by the timeout: a dead
 * peer becomes an abort, not a hang), then ncclCommDestroy; a failed or
 * aborted one is aborted. Errors here have nowhere to go and are dropped. */
static void nccl_destroy(struct mt_comm *c)
{
    struct nccl_comm *nc = as_nccl(c);
    (void)cudaSetDevice(nc->device);
    if (nc->nccl && await(NULL, nc, NULL, "destroy") != MT_OK) abort_comm(nc);
    if (nc->nccl) (void)ncclCommDestroy(nc->nccl);
    nc->nccl = NULL;
    comm_release(nc);
}

static const struct mt_comm_i nccl_iface = {
    /* .name             = */ "nccl",
    /* .allreduce        = */ nccl_allreduce,
    /* .reduce_scatter   = */ nccl_reduce_scatter,
    /* .allgather        = */ nccl_allgather,
    /* .bcast            = */ nccl_bcast,
    /* .alltoallv        = */ nccl_alltoallv,
    /* .barrier          = */ nccl_barrier,
    /* .allgatherv       = */ nccl_allgatherv,
    /* .reduce_scatterv  = */ nccl_reduce_scatterv,
    /* .iallreduce       = */ nccl_iallreduce,
    /* .ireduce_scatter  = */ nccl_ireduce_scatter,
    /* .iallgather       = */ nccl_iallgather,
    /* .iallgatherv      = */ nccl_iallgatherv,
    /* .ireduce_scatterv = */ nccl_ireduce_scatterv,
    /* .wait             = */ nccl_wait,
    /* .sendrecv_batch   = */ nccl_sendrecv_batch,
    /* .split            = */ nccl_split,
    /* .destroy          = */ nccl_destroy,
};

enum mt_status mt_comm_nccl_create_world(struct mt_ctx *ctx, struct mt_comm *mpi_world, int device,
                                         struct mt_comm **out)
{
    if (!out) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "nccl create_world: NULL output");
    *out = NULL;
    /* the id travels in host memory: the bootstrap group must be MPI or self */
    if (mpi_world && mpi_world->iface == &nccl_iface)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "nccl create_world: the bootstrap group must be a host (MPI or "
                            "self) communicator, not an NCCL one");
    struct mt_comm *self = NULL, *keep = NULL;
    if (!mpi_world) MT_CHECK(mt_comm_create_self(ctx, &self));
    struct mt_comm *host = mpi_world ? mpi_world : self;

    /* local checks: a failure is carried into the agreement, not returned */
    double timeout_s = MT_NCCL_TIMEOUT_DEFAULT_S;
    enum mt_status local = read_timeout(ctx, &timeout_s);
    if (local == MT_OK && device < 0)
        local = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "nccl create_world: negative CUDA device %d", device);
#ifdef MT_NCCL_SPLIT_BY_ID
    /* our own host group, for the ids of later splits (collective: taken whatever `local` says) */
    enum mt_status ks = mt_comm_split(ctx, host, 0, host->rank, &keep);
    if (local == MT_OK) local = ks;
#endif
    enum mt_status st = create_from_host(ctx, host, device, timeout_s, local, keep, out);
    mt_comm_destroy(self);
    return st;
}

enum mt_status mt_comm_nccl_set_input_stream(struct mt_ctx *ctx, struct mt_comm *c, void *stream)
{
    if (!c || c->iface != &nccl_iface)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "nccl set_input_stream: %s is not an NCCL communicator",
                            c ? c->iface->name : "NULL");
    as_nccl(c)->input = (cudaStream_t)stream;
    return MT_OK;
}

int mt_comm_is_nccl(const struct mt_comm *c)
{
    return c && c->iface == &nccl_iface;
}

void mt_comm_nccl_version(char *buf, size_t n)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess || v < 0) { snprintf(buf, n, "NCCL (version query failed)"); return; }
    /* NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older ones major*1000 + minor*100 + patch */
    const int major = v >= 10000 ? v / 10000 : v / 1000, rest = v >= 10000 ? v % 10000 : v % 1000;
    snprintf(buf, n, "NCCL %d.%d.%d", major, rest / 100, rest % 100);
}

#endif /* MT_WITH_NCCL */
