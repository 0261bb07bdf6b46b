/*
 * nccl_emu.cc — an emulated NCCL (tests/cuda/emu/nccl.h) on MPI, for the
 * emulated MT_WITH_NCCL + MT_WITH_MPI meshtrain of
 * tests/test_cuda_emu_mesh.sh: one MPI process per emulated GPU, device
 * memory being the emulator's guarded host mappings. Also the extern "C"
 * shims through which the C file src/parallel/comm_nccl.c reaches the
 * emulator's CUDA runtime (cuda_runtime_api.h).
 *
 * HOW IT WORKS
 *   communicator   = a private MPI communicator (errors return, never
 *                    abort the job). ncclCommInitRank splits
 *                    MPI_COMM_WORLD (every world rank must take part: the
 *                    only bootstrap meshtrain uses), NCCL rank = MPI rank
 *                    order; ncclCommSplit = MPI_Comm_split (colour, key;
 *                    ties by parent rank, as NCCL).
 *   device buffers = staged: cudaMemcpyAsync DeviceToHost into a host
 *                    vector, MPI on host memory, cudaMemcpyAsync
 *                    HostToDevice back. The copies are the emulator's, so
 *                    the device-memory guard holds (MPI never touches a
 *                    device mapping) and a host pointer or a range that
 *                    runs past its device buffer is refused, as NCCL
 *                    refuses or faults on it (ncclInvalidArgument).
 *   reductions     = every rank gathers every contribution and folds them
 *                    in rank order 0, 1, ..., n-1: deterministic and
 *                    bitwise identical on every rank, as NCCL's ring
 *                    result is the same on every rank (its order differs:
 *                    fine within the fp32 tolerance, docs/cuda.md).
 *   allreduce      = MPI_Allgather + fold;  reduce_scatter = MPI_Alltoall
 *                    of the blocks + fold;  reduce = MPI_Gather + fold at
 *                    the root;  allgather, broadcast = MPI's.
 *   groups         = ncclGroupStart .. ncclGroupEnd queue the operations;
 *                    GroupEnd posts every send/recv as MPI_Isend/Irecv (one
 *                    tag: MPI's per-peer order is NCCL's posting-order
 *                    pairing), runs the collectives in posting order, then
 *                    waits. An operation outside a group runs at once.
 *   streams        = the emulator is synchronous: an operation is complete
 *                    when its call returns; ncclCommGetAsyncError reports
 *                    the sticky error of a failed call, else ncclSuccess.
 *
 * NOT emulated (docs/cuda.md, emulator limits): NCCL's algorithms and
 * their summation order, asynchronous progress and stream ordering, the
 * NVLink / IB transports, fp16/bf16 reductions (ncclInvalidArgument here),
 * ncclCommInitRank over a subset of the MPI world, non-NULL split configs.
 */
#include "nccl.h"
#include "cuda_runtime_api.h"

/* the C API only (Open MPI and MPICH would pull in their C++ bindings) */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>

/* ---------------- CUDA runtime shims for C callers ---------------- */

#define EV_MAGIC 0x45564e54   /* = emu.cc's MT_EMU_EV_MAGIC: one event type (cuda_runtime.h) */

extern "C" {
int mt_emuc_SetDevice(int device) { return (int)cudaSetDevice(device); }
int mt_emuc_StreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return (int)cudaStreamCreateWithFlags(s, flags); }
int mt_emuc_StreamDestroy(cudaStream_t s) { return (int)cudaStreamDestroy(s); }
/* synchronous emulator: whatever was queued has run */
int mt_emuc_StreamQuery(cudaStream_t s) { (void)s; return (int)cudaSuccess; }
int mt_emuc_StreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)s;
    (void)flags;
    return e && e->magic == EV_MAGIC ? (int)cudaSuccess : (int)cudaErrorInvalidValue;
}
int mt_emuc_EventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = new mt_emu_event{EV_MAGIC, -1.0};
    return (int)cudaSuccess;
}
int mt_emuc_EventDestroy(cudaEvent_t e)
{
    if (!e || e->magic != EV_MAGIC) return (int)cudaErrorInvalidValue;
    e->magic = 0;
    delete e;
    return (int)cudaSuccess;
}
int mt_emuc_EventRecord(cudaEvent_t e, cudaStream_t s) { return (int)cudaEventRecord(e, s); }
int mt_emuc_EventQuery(cudaEvent_t e) { return e && e->magic == EV_MAGIC ? (int)cudaSuccess : (int)cudaErrorInvalidValue; }
int mt_emuc_Malloc(void **p, size_t bytes) { return (int)cudaMalloc(p, bytes); }
int mt_emuc_Free(void *p) { return (int)cudaFree(p); }
int mt_emuc_MemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    return (int)cudaMemsetAsync(dst, value, bytes, s);
}
int mt_emuc_MemcpyAsync(void *dst, const void *src, size_t bytes, int kind, cudaStream_t s)
{
    return (int)cudaMemcpyAsync(dst, src, bytes, (cudaMemcpyKind)kind, s);
}
const char *mt_emuc_GetErrorString(int e)
{
    if (e == 101) return "invalid device ordinal";
    if (e == 600) return "device not ready";
    return cudaGetErrorString((cudaError_t)e);
}
const char *mt_emuc_GetErrorName(int e)
{
    switch (e) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 9: return "cudaErrorInvalidConfiguration";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    case 600: return "cudaErrorNotReady";
    case 719: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}
} /* extern "C" */

/* ---------------- emulated NCCL ---------------- */

struct ncclComm {
    MPI_Comm     mpi;
    int          size, rank;
    ncclResult_t async;  /* sticky: the first failure of an operation on this comm */
};

static thread_local char g_last[512];

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    va_end(ap);
    if (c && c->async == ncclSuccess && r != ncclInvalidArgument && r != ncclInvalidUsage) c->async = r;
    return r;
}

static ncclResult_t mpi_check(ncclComm_t c, int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return ncclSuccess;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return fail(c, ncclSystemError, "emulated NCCL: %s: %s", what, s);
}

static size_t dtype_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0; /* fp16 / bf16 / out of range: not emulated */
    }
}

template <typename T>
static void fold_t(T *acc, const T *x, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; i++)
        switch (op) {
        case ncclSum: case ncclAvg: acc[i] = acc[i] + x[i]; break;
        case ncclProd: acc[i] = acc[i] * x[i]; break;
        case ncclMax: acc[i] = x[i] > acc[i] ? x[i] : acc[i]; break;
        case ncclMin: acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
        default: break;
        }
}

template <typename T>
static void avg_t(T *acc, size_t n, int ranks)
{
    for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)ranks);
}

/* out = contribution[0] op contribution[1] op ... op contribution[n-1],
 * left to right (all: n blocks of count elements, rank order). */
static void fold(void *out, const char *all, int n, size_t count, ncclDataType_t dt, ncclRedOp_t op)
{
    size_t bytes = count * dtype_size(dt);
    memcpy(out, all, bytes);
    for (int r = 1; r < n; r++) {
        const void *x = all + (size_t)r * bytes;
        switch (dt) {
        case ncclInt8: fold_t((int8_t *)out, (const int8_t *)x, count, op); break;
        case ncclUint8: fold_t((uint8_t *)out, (const uint8_t *)x, count, op); break;
        case ncclInt32: fold_t((int32_t *)out, (const int32_t *)x, count, op); break;
        case ncclUint32: fold_t((uint32_t *)out, (const uint32_t *)x, count, op); break;
        case ncclInt64: fold_t((int64_t *)out, (const int64_t *)x, count, op); break;
        case ncclUint64: fold_t((uint64_t *)out, (const uint64_t *)x, count, op); break;
        case ncclFloat32: fold_t((float *)out, (const float *)x, count, op); break;
        case ncclFloat64: fold_t((double *)out, (const double *)x, count, op); break;
        default: break;
        }
    }
    if (op != ncclAvg) return;
    switch (dt) {
    case ncclInt8: avg_t((int8_t *)out, count, n); break;
    case ncclUint8: avg_t((uint8_t *)out, count, n); break;
    case ncclInt32: avg_t((int32_t *)out, count, n); break;
    case ncclUint32: avg_t((uint32_t *)out, count, n); break;
    case ncclInt64: avg_t((int64_t *)out, count, n); break;
    case ncclUint64: avg_t((uint64_t *)out, count, n); break;
    case ncclFloat32: avg_t((float *)out, count, n); break;
    case ncclFloat64: avg_t((double *)out, count, n); break;
    default: break;
    }
}

/* device -> host staging through the emulator's copy (guard-safe; refuses
 * host memory and ranges past the end of a device buffer) */
static ncclResult_t to_host(ncclComm_t c, std::vector<char> &h, const void *dev, size_t bytes, const char *what)
{
    h.resize(bytes ? bytes : 1);
    if (!bytes) return ncclSuccess;
    if (cudaMemcpyAsync(h.data(), dev, bytes, cudaMemcpyDeviceToHost, NULL) != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(c, ncclInvalidArgument, "emulated NCCL: %s: send buffer %p (+%zu bytes) is not device memory",
                    what, dev, bytes);
    }
    return ncclSuccess;
}

static ncclResult_t to_dev(ncclComm_t c, void *dev, const void *h, size_t bytes, const char *what)
{
    if (!bytes) return ncclSuccess;
    if (cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, NULL) != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(c, ncclInvalidArgument, "emulated NCCL: %s: receive buffer %p (+%zu bytes) is not device memory",
                    what, dev, bytes);
    }
    return ncclSuccess;
}

static ncclResult_t int_count(ncclComm_t c, size_t bytes, int *out, const char *what)
{
    if (bytes > (size_t)INT_MAX)
        return fail(c, ncclInvalidArgument, "emulated NCCL: %s: %zu bytes exceed the MPI staging limit", what, bytes);
    *out = (int)bytes;
    return ncclSuccess;
}

#define NCHECK(x)                               \
    do {                                        \
        ncclResult_t r_ = (x);                  \
        if (r_ != ncclSuccess) return r_;       \
    } while (0)

enum op_kind { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BCAST, OP_REDUCE, OP_SEND, OP_RECV };

struct op {
    op_kind        kind;
    ncclComm_t     comm;
    const void    *send;
    void          *recv;
    size_t         count;
    ncclDataType_t dt;
    ncclRedOp_t    red;
    int            root;  /* root, or peer for send/recv */
};

static ncclResult_t run_collective(const op &o)
{
    ncclComm_t c = o.comm;
    const size_t es = dtype_size(o.dt), bytes = o.count * es;
    const int n = c->size;
    int ib = 0;
    NCHECK(int_count(c, bytes * (size_t)n, &ib, "collective"));
    ib = (int)bytes;
    std::vector<char> mine, all, out(bytes ? bytes : 1);
    switch (o.kind) {
    case OP_ALLREDUCE:
        NCHECK(to_host(c, mine, o.send, bytes, "ncclAllReduce"));
        all.resize((size_t)n * bytes + 1);
        NCHECK(mpi_check(c, MPI_Allgather(mine.data(), ib, MPI_BYTE, all.data(), ib, MPI_BYTE, c->mpi), "allreduce"));
        fold(out.data(), all.data(), n, o.count, o.dt, o.red);
        return to_dev(c, o.recv, out.data(), bytes, "ncclAllReduce");
    case OP_REDUCE_SCATTER:
        NCHECK(to_host(c, mine, o.send, bytes * (size_t)n, "ncclReduceScatter"));
        all.resize((size_t)n * bytes + 1);
        NCHECK(mpi_check(c, MPI_Alltoall(mine.data(), ib, MPI_BYTE, all.data(), ib, MPI_BYTE, c->mpi), "reduce_scatter"));
        fold(out.data(), all.data(), n, o.count, o.dt, o.red);
        return to_dev(c, o.recv, out.data(), bytes, "ncclReduceScatter");
    case OP_ALLGATHER:
        NCHECK(to_host(c, mine, o.send, bytes, "ncclAllGather"));
        all.resize((size_t)n * bytes + 1);
        NCHECK(mpi_check(c, MPI_Allgather(mine.data(), ib, MPI_BYTE, all.data(), ib, MPI_BYTE, c->mpi), "allgather"));
        return to_dev(c, o.recv, all.data(), (size_t)n * bytes, "ncclAllGather");
    case OP_BCAST:
        if (c->rank == o.root) NCHECK(to_host(c, out, o.send, bytes, "ncclBroadcast"));
        NCHECK(mpi_check(c, MPI_Bcast(out.data(), ib, MPI_BYTE, o.root, c->mpi), "broadcast"));
        return to_dev(c, o.recv, out.data(), bytes, "ncclBroadcast");
    case OP_REDUCE:
        NCHECK(to_host(c, mine, o.send, bytes, "ncclReduce"));
        all.resize((size_t)n * bytes + 1);
        NCHECK(mpi_check(c, MPI_Gather(mine.data(), ib, MPI_BYTE, all.data(), ib, MPI_BYTE, o.root, c->mpi), "reduce"));
        if (c->rank != o.root) return ncclSuccess;
        fold(out.data(), all.data(), n, o.count, o.dt, o.red);
        return to_dev(c, o.recv, out.data(), bytes, "ncclReduce");
    default:
        return fail(c, ncclInternalError, "emulated NCCL: not a collective");
    }
}

/* the queue of the open group (one per process: meshtrain posts from one thread) */
static int             g_depth;
static std::vector<op> g_ops;
static ncclResult_t    g_group_err = ncclSuccess;

#define P2P_TAG 0x4e43

/* Post every send/recv (nonblocking), run the collectives in order, wait,
 * deliver the receives. */
static ncclResult_t run_group(std::vector<op> &ops)
{
    size_t np = 0;
    for (const op &o : ops) np += o.kind == OP_SEND || o.kind == OP_RECV;
    std::vector<std::vector<char>> bufs(np);
    std::vector<MPI_Request> reqs(np, MPI_REQUEST_NULL);
    std::vector<const op *> p2p(np);
    ncclResult_t st = ncclSuccess;
    size_t k = 0;
    for (const op &o : ops) {
        if (o.kind != OP_SEND && o.kind != OP_RECV) continue;
        const size_t bytes = o.count * dtype_size(o.dt);
        int ib = 0;
        p2p[k] = &o;
        if (st == ncclSuccess) st = int_count(o.comm, bytes, &ib, "send/recv");
        if (st == ncclSuccess && o.kind == OP_SEND) {
            st = to_host(o.comm, bufs[k], o.send, bytes, "ncclSend");
            if (st == ncclSuccess)
                st = mpi_check(o.comm, MPI_Isend(bufs[k].data(), ib, MPI_BYTE, o.root, P2P_TAG, o.comm->mpi, &reqs[k]),
                               "send");
        } else if (st == ncclSuccess) {
            bufs[k].resize(bytes ? bytes : 1);
            st = mpi_check(o.comm, MPI_Irecv(bufs[k].data(), ib, MPI_BYTE, o.root, P2P_TAG, o.comm->mpi, &reqs[k]),
                           "recv");
        }
        k++;
    }
    for (const op &o : ops)
        if (st == ncclSuccess && o.kind != OP_SEND && o.kind != OP_RECV) st = run_collective(o);
    /* wait for what was posted even after a failure: no request outlives the group */
    std::vector<MPI_Status> sts(np);
    int wrc = np ? MPI_Waitall((int)np, reqs.data(), sts.data()) : MPI_SUCCESS;
    if (st != ncclSuccess) return st;
    if (wrc != MPI_SUCCESS) return mpi_check(np ? p2p[0]->comm : NULL, wrc, "send/recv (count mismatch?)");
    for (size_t i = 0; i < np; i++) {
        const op &o = *p2p[i];
        if (o.kind != OP_RECV) continue;
        int got = 0;
        MPI_Get_count(&sts[i], MPI_BYTE, &got);
        const size_t bytes = o.count * dtype_size(o.dt);
        if ((size_t)got != bytes)
            return fail(o.comm, ncclInvalidUsage, "emulated NCCL: ncclRecv of %zu bytes from %d got %d: the peer's "
                        "ncclSend count differs", bytes, o.root, got);
        NCHECK(to_dev(o.comm, o.recv, bufs[i].data(), bytes, "ncclRecv"));
    }
    return ncclSuccess;
}

/* check an operation's arguments, then run it (outside a group) or queue it */
static ncclResult_t post(const op &o, const char *what)
{
    ncclComm_t c = o.comm;
    ncclResult_t st = ncclSuccess;
    if (!c || c->mpi == MPI_COMM_NULL)
        st = fail(c, ncclInvalidArgument, "%s: NULL or destroyed communicator", what);
    else if (dtype_size(o.dt) == 0)
        st = fail(c, ncclInvalidArgument, "%s: data type %d is not emulated (fp16/bf16 reductions: see nccl_emu.cc)",
                  what, (int)o.dt);
    else if ((unsigned)o.red >= (unsigned)ncclNumOps)
        st = fail(c, ncclInvalidArgument, "%s: bad reduction op %d", what, (int)o.red);
    else if (o.root < 0 || o.root >= c->size)
        st = fail(c, ncclInvalidArgument, "%s: root/peer %d outside [0, %d)", what, o.root, c->size);
    else if (o.count > 0 && ((o.kind != OP_RECV && !o.send && !(o.kind == OP_BCAST && c->rank != o.root)) ||
                             (o.kind != OP_SEND && !o.recv && !(o.kind == OP_REDUCE && c->rank != o.root))))
        st = fail(c, ncclInvalidArgument, "%s: NULL buffer", what);
    else if (c->async != ncclSuccess)
        st = fail(c, c->async, "%s: the communicator failed earlier (%s)", what, ncclGetErrorString(c->async));
    if (g_depth > 0) {
        if (st != ncclSuccess && g_group_err == ncclSuccess) g_group_err = st;
        if (st == ncclSuccess) g_ops.push_back(o);
        return st;
    }
    if (st != ncclSuccess) return st;
    std::vector<op> one(1, o);
    return run_group(one);
}

extern "C" {

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return g_last;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError) return fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *asyncError = comm->async;
    return ncclSuccess;
}

#define ID_MAGIC "meshtrain emulated NCCL id"

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return fail(NULL, ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    static unsigned long serial;
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "%s %ld %ld.%09ld %lu", ID_MAGIC, (long)getpid(), (long)ts.tv_sec,
             ts.tv_nsec, ++serial);
    return ncclSuccess;
}

static ncclResult_t new_comm(MPI_Comm m, ncclComm_t *out)
{
    MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
    ncclComm_t c = new ncclComm;
    c->mpi = m;
    MPI_Comm_size(m, &c->size);
    MPI_Comm_rank(m, &c->rank);
    c->async = ncclSuccess;
    *out = c;
    return ncclSuccess;
}

/* Collective over MPI_COMM_WORLD: the ranks check that they hold the same
 * id and distinct ranks in [0, nranks) before the split. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (!comm) return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: NULL comm");
    *comm = NULL;
    int inited = 0, fin = 0, world = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin) return fail(NULL, ncclSystemError, "emulated NCCL: ncclCommInitRank needs MPI initialised");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks != world)
        return fail(NULL, ncclInvalidUsage, "emulated NCCL: ncclCommInitRank over %d of the %d MPI ranks is not "
                    "emulated (init the world, then ncclCommSplit)", nranks, world);
    if (rank < 0 || rank >= nranks) return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    if (strncmp(id.internal, ID_MAGIC, strlen(ID_MAGIC)) != 0)
        return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
    std::vector<ncclUniqueId> ids((size_t)world);
    std::vector<int> ranks((size_t)world);
    int rc = MPI_Allgather(&id, (int)sizeof id, MPI_BYTE, ids.data(), (int)sizeof id, MPI_BYTE, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_check(NULL, rc, "ncclCommInitRank");
    std::vector<int> seen((size_t)world, 0);
    for (int r = 0; r < world; r++) {
        if (memcmp(&ids[(size_t)r], &id, sizeof id) != 0)
            return fail(NULL, ncclInvalidUsage, "ncclCommInitRank: MPI rank %d holds another unique id", r);
        if (ranks[(size_t)r] < 0 || ranks[(size_t)r] >= world || seen[(size_t)ranks[(size_t)r]]++)
            return fail(NULL, ncclInvalidUsage, "ncclCommInitRank: NCCL rank %d given twice or out of range",
                        ranks[(size_t)r]);
    }
    MPI_Comm m = MPI_COMM_NULL;
    rc = MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &m);
    if (rc != MPI_SUCCESS) return mpi_check(NULL, rc, "ncclCommInitRank (MPI_Comm_split)");
    return new_comm(m, comm);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    if (!comm || !newcomm) return fail(comm, ncclInvalidArgument, "ncclCommSplit: NULL argument");
    if (config) return fail(comm, ncclInvalidArgument, "emulated NCCL: ncclCommSplit with a config is not emulated");
    if (g_depth > 0) return fail(comm, ncclInvalidUsage, "emulated NCCL: ncclCommSplit inside a group is not emulated");
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return fail(comm, ncclInvalidArgument, "ncclCommSplit: colour %d", color);
    MPI_Comm m = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
    if (rc != MPI_SUCCESS) return mpi_check(comm, rc, "ncclCommSplit");
    if (m == MPI_COMM_NULL) return ncclSuccess;
    return new_comm(m, newcomm);
}

/* the emulator reports itself as NCCL 0.0.0: a receipt cannot mistake it for a real NCCL */
ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return fail(NULL, ncclInvalidArgument, "ncclGetVersion: NULL argument");
    *version = 0;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count) return fail(NULL, ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank) return fail(NULL, ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

static void free_comm(ncclComm_t comm)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
    delete comm;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return fail(NULL, ncclInvalidArgument, "ncclCommDestroy: NULL comm");
    free_comm(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm) free_comm(comm);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    g_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (g_depth <= 0) return fail(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--g_depth > 0) return ncclSuccess;
    std::vector<op> ops;
    ops.swap(g_ops);
    ncclResult_t err = g_group_err;
    g_group_err = ncclSuccess;
    if (err != ncclSuccess) return err; /* a post failed: the group is dropped */
    return run_group(ops);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_ALLREDUCE, comm, sendbuff, recvbuff, count, datatype, op_, 0}, "ncclAllReduce");
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_REDUCE_SCATTER, comm, sendbuff, recvbuff, recvcount, datatype, op_, 0}, "ncclReduceScatter");
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_ALLGATHER, comm, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0}, "ncclAllGather");
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_BCAST, comm, sendbuff, recvbuff, count, datatype, ncclSum, root}, "ncclBroadcast");
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op_,
                        int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_REDUCE, comm, sendbuff, recvbuff, count, datatype, op_, root}, "ncclReduce");
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_SEND, comm, sendbuff, NULL, count, datatype, ncclSum, peer}, "ncclSend");
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    return post(op{OP_RECV, comm, NULL, recvbuff, count, datatype, ncclSum, peer}, "ncclRecv");
}

} /* extern "C" */
