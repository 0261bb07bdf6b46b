/*
 * mt_comm.h — the collectives interface.
 *
 * A `struct mt_comm` is one process group (a mesh axis, or a product of
 * axes). Model and trainer code call only these functions; the
 * implementation behind them is a single-rank one (always built; on host
 * memory, or "self_dev" on backend memory), MPI (MT_WITH_MPI) or NCCL
 * (MT_WITH_NCCL, device memory; comm_nccl.h). On a group of size 1 every
 * collective is a copy or a no-op, so the single-rank trainer runs the same
 * code path as the distributed one.
 *
 * All calls return MT_OK or an error with a message on ctx (MPI errors are
 * converted at one boundary, comm_mpi.c; communicators use
 * MPI_ERRORS_RETURN). In-place operation happens if sendbuf == recvbuf
 * where a call says so.
 */
#ifndef MT_COMM_H
#define MT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "../core/mt_core.h"

/* MT_DTYPE_BF16: bf16 storage (uint16, the upper half of an fp32), for
 * grad_reduce_dtype=bf16; reductions: SUM only, each pairwise combine
 * widens both operands to fp32, adds and rounds to nearest even (MPI: a
 * user op; NCCL: ncclBfloat16, which does the same). */
enum mt_dtype { MT_DTYPE_F32 = 0, MT_DTYPE_F64, MT_DTYPE_I32, MT_DTYPE_I64, MT_DTYPE_U8, MT_DTYPE_BF16 };
enum mt_redop { MT_REDOP_SUM = 0, MT_REDOP_MAX, MT_REDOP_MIN };

size_t mt_dtype_size(enum mt_dtype dt);

struct mt_comm;  /* opaque; see comm_impl.h */

int mt_comm_size(const struct mt_comm *c);
int mt_comm_rank(const struct mt_comm *c);

/* A group of one rank (this process). Never fails except OOM. Free with mt_comm_destroy. */
enum mt_status mt_comm_create_self(struct mt_ctx *ctx, struct mt_comm **out);
void mt_comm_destroy(struct mt_comm *c);  /* no-op on NULL */

/* In place: buf (count) reduced over the group, result on every rank. */
enum mt_status mt_comm_allreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                 enum mt_dtype dt, enum mt_redop op);
/* recv (count) = sum over the group of send[rank*count .. +count]; send has size*count. */
enum mt_status mt_comm_reduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      size_t count, enum mt_dtype dt);
/* recv (size*count) = concat over ranks of send (count). In place if send == recv + rank*count. */
enum mt_status mt_comm_allgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                 size_t count, enum mt_dtype dt);
enum mt_status mt_comm_bcast(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                             enum mt_dtype dt, int root);
/* counts and displacements in elements, one per rank. */
enum mt_status mt_comm_alltoallv(struct mt_ctx *ctx, struct mt_comm *c,
                                 const void *send, const size_t *send_counts, const size_t *send_displs,
                                 void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                 enum mt_dtype dt);
enum mt_status mt_comm_barrier(struct mt_ctx *ctx, struct mt_comm *c);

/* Variable-count collectives: rank r owns counts[r] elements (0 allowed: a
 * rank may own nothing) at element offset displs[r] of the full buffer.
 * counts/displs have one entry per rank, are in elements, and must be
 * identical on every rank; the displacement of a rank with count 0 is never
 * used. Blocks may come in any order and leave gaps (gaps are neither read
 * nor written). On MPI every count, and the displacement of every rank
 * with a non-zero count, must fit an int (for reduce_scatterv so must the
 * sum of counts): larger values are refused with MT_ERR_UNSUPPORTED before
 * any rank communicates.
 *
 * allgatherv: recv (max_r displs[r]+counts[r]) gets, at recv + displs[r],
 * rank r's send (counts[r] elements). In place if send == (char *)recv +
 * displs[rank]*dtsize (the local block is already where it belongs). */
enum mt_status mt_comm_allgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                  const size_t *counts, const size_t *displs, enum mt_dtype dt);
/* reduce_scatterv: recv (counts[rank]) = sum over the group of
 * send[displs[rank] .. +counts[rank]]; send holds every rank's block (block
 * r at displs[r], counts[r] elements). Sum only. recv must not overlap any
 * block of send (MT_ERR_INVALID_ARG). On MPI, displacements that are not
 * the consecutive prefix sums of counts cost a packing copy of the blocks
 * (a temporary of sum(counts) elements, bucket comm). */
enum mt_status mt_comm_reduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       const size_t *counts, const size_t *displs, enum mt_dtype dt);

/* ---- additions (dist module): world, non-blocking collectives, batched P2P, process init ---- */

/* The world group: a duplicate of MPI_COMM_WORLD (errors returned, not fatal)
 * when MPI is built in and initialised (mt_dist_init under mpirun), otherwise
 * a self group. Free with mt_comm_destroy. */
enum mt_status mt_comm_create_world(struct mt_ctx *ctx, struct mt_comm **out);

/* A pending non-blocking collective. Buffers must stay untouched until
 * mt_comm_wait returns. The ctx passed to the i* call must outlive the req. */
struct mt_comm_req;

/* Non-blocking forms of allreduce / reduce_scatter / allgather: same
 * arguments and aliasing rules as the blocking calls, plus *req, which
 * receives a request to pass to mt_comm_wait exactly once. On error *req is
 * NULL and nothing is pending. Counts above INT_MAX are refused (MPI ints). */
enum mt_status mt_comm_iallreduce(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                  enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req);
enum mt_status mt_comm_ireduce_scatter(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       size_t count, enum mt_dtype dt, struct mt_comm_req **req);
enum mt_status mt_comm_iallgather(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                  size_t count, enum mt_dtype dt, struct mt_comm_req **req);
/* Non-blocking allgatherv / reduce_scatterv: same arguments and rules as
 * the blocking calls, plus *req as above. counts and displs are read (and
 * copied if needed) during the call: the caller may free or reuse them as
 * soon as it returns (the MPI implementation keeps its int copies, and any
 * packed send, in the request until wait). send and recv stay busy until
 * mt_comm_wait returns. */
enum mt_status mt_comm_iallgatherv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                   const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                   struct mt_comm_req **req);
enum mt_status mt_comm_ireduce_scatterv(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                        const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                        struct mt_comm_req **req);
/* Complete the operation and free req. req == NULL is a no-op returning MT_OK. */
enum mt_status mt_comm_wait(struct mt_ctx *ctx, struct mt_comm_req *req);

/* Batched point-to-point (pipeline sends): every op is posted at once
 * (MPI_Isend / MPI_Irecv) and completed by one wait-all, so the order of
 * ops in the batch cannot deadlock. `peer` is a rank of c. On a self group
 * peer must be 0 and each recv is matched with the first unmatched send of
 * the same tag (a copy). */
enum mt_p2p_kind { MT_P2P_SEND = 0, MT_P2P_RECV };
struct mt_p2p_op {
    enum mt_p2p_kind kind;
    int              peer;
    void            *buf;    /* const for sends */
    size_t           count;  /* elements        */
    enum mt_dtype    dt;
    int              tag;    /* >= 0            */
};
enum mt_status mt_comm_sendrecv_batch(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                      const struct mt_p2p_op *ops);

/* Process init (tools/ only). Under mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE
 * set) and built with MPI: MPI_Init_thread(FUNNELED) — only the main thread
 * calls MPI; otherwise one rank (world=1, rank=0). Also raises malloc's mmap
 * and trim thresholds so large collective temporaries are not mmap'ed and
 * page-faulted on every call. Built without MPI but launched by mpirun with
 * more than one rank: MT_ERR_UNSUPPORTED (N copies of a one-rank run would
 * silently duplicate work). MPI_Init failure: MT_ERR_COMM. */
enum mt_status mt_dist_init(int *argc, char ***argv, int *world, int *rank);
/* World size and rank of this process without any collective (1 and 0
 * when MPI is absent or not initialised). Safe to call before a mesh exists:
 * the startup contract is checked with it, identically on every rank. */
void mt_comm_world_info(int *world, int *rank);
void mt_dist_finalize(void);     /* MPI_Finalize if MPI was initialised; else nothing */
/* One line for the receipt naming the collective libraries this build
 * links, with the versions they report: the MPI library's own first line
 * (MPI_Get_library_version, e.g. "Open MPI v4.1.4, package: ...") or
 * "no MPI (single-rank build)", then "; NCCL 2.27.3" in an NCCL build. */
void mt_dist_libraries(char *buf, size_t n);

/* Agreement on a phase with no collective in it (docs/mesh.md "Hangs"):
 * every rank of comm (NULL: a world group made for the call, freed before
 * return) passes its local status; one all-reduce tells every rank the
 * lowest failing rank and its status. Returns MT_OK on every rank iff all
 * passed MT_OK. A failing rank returns its own status and keeps its own
 * message; the others return that rank's status (so every rank exits with
 * the same code) with the message "rank R failed during PHASE: STATUS (see
 * that rank's message); every rank stops". A rank that fails a phase alone
 * would otherwise leave the others waiting in their next collective. */
enum mt_status mt_comm_agree(struct mt_ctx *ctx, struct mt_comm *comm, enum mt_status local, const char *phase);

/* Agreement on what every rank was given (issue 33): each rank passes the
 * same ordered list of n keys (names) with a 64-bit hash of its own value of
 * each (the resolved config's keys, the mesh, --out, the data, the build...).
 * One all-gather of (n, hash of the list) on comm (NULL: a world group made
 * for the call); only on a difference a second all-gather of the n hashes
 * finds the first differing key. Returns MT_OK on every rank iff every rank
 * has the same list; else MT_ERR_CONFIG on every rank (exit 2) with "ranks
 * disagree on KEY: rank A and rank B were given different values (this
 * rank's: VALUE); every rank must be given the same configuration" (values:
 * this rank's value of each key for the message, may be NULL). Different n
 * (another build): KEY is "the list of keys (another build?)". MT_ERR_COMM
 * when the collective fails. */
enum mt_status mt_comm_agree_keys(struct mt_ctx *ctx, struct mt_comm *comm, int n, const char *const *names,
                                  const char *const *values, const uint64_t *hashes);
/* FNV-1a 64 of s (for mt_comm_agree_keys). */
uint64_t mt_comm_hash_str(const char *s);

/* ---- collective watchdog (watchdog.c; docs/mesh.md "Hangs") ----
 * A blocking collective, a wait on a non-blocking one, a batched P2P or a
 * split on a group of more than one rank that has not returned after
 * timeout_s seconds (a peer stopped, dead or stuck) ends the job: a thread
 * prints one line on stderr naming this rank, the collective, the group
 * size and the step (mt_comm_watchdog_set_step), then calls on_expire on
 * its own thread (tools/: _exit(1); the main thread is stuck inside MPI and
 * cannot unwind; should on_expire return, the watchdog thread ends and
 * watches no more). timeout_s <= 0: off (returns MT_OK, starts nothing).
 * One watchdog per process; the thread never calls MPI. Start before the
 * first collective, stop after the last (tools/ only). */
enum mt_status mt_comm_watchdog_start(struct mt_ctx *ctx, double timeout_s, void (*on_expire)(void));
void mt_comm_watchdog_stop(void);               /* no-op when not running          */
void mt_comm_watchdog_set_step(int step);       /* for the message; -1 = setup     */
void mt_dist_abort(int code);    /* MPI_Abort on world, or exit(code): tools/ only    */

#endif /* MT_COMM_H */
