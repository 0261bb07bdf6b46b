/*
 * comm_impl.h — internals of struct mt_comm (private to src/parallel).
 *
 * A communicator is a size, a rank and an implementation table of function
 * pointers (ggml's ggml_backend_i): the public functions in comm.c check
 * their arguments once and dispatch through `iface`. Implementations:
 *   comm.c      "self": one rank, every collective a copy or a no-op
 *               (memmove on host memory);
 *   comm.c      "self_dev": the same on backend (device) memory: every copy
 *               goes through the backend's copy (ops->copy: for cuda a
 *               cudaMemcpyAsync queued on the backend's stream), so the
 *               result is ordered before the backend's later kernels;
 *   comm_mpi.c  "mpi":  MPI, compiled when MT_WITH_MPI;
 *   comm_nccl.c "nccl": NCCL on device memory, compiled when MT_WITH_NCCL.
 * A NULL entry means "unsupported": the public call returns
 * MT_ERR_UNSUPPORTED naming the op and the implementation.
 *
 * Ownership: a comm remembers the ctx it was created with and frees itself
 * through it, so that ctx must outlive the comm.
 */
#ifndef MT_COMM_IMPL_H
#define MT_COMM_IMPL_H

#include "mt_comm.h"

#ifdef MT_WITH_MPI
#include <mpi.h>
#endif

/* Colour for mt_comm_split meaning "this rank joins no new group". */
#define MT_COMM_UNDEFINED (-1)

struct mt_comm_i {
    const char *name; /* "self", "mpi" */
    enum mt_status (*allreduce)(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                enum mt_dtype dt, enum mt_redop op);
    enum mt_status (*reduce_scatter)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                     size_t count, enum mt_dtype dt);
    enum mt_status (*allgather)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                size_t count, enum mt_dtype dt);
    enum mt_status (*bcast)(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                            enum mt_dtype dt, int root);
    enum mt_status (*alltoallv)(struct mt_ctx *ctx, struct mt_comm *c,
                                const void *send, const size_t *send_counts, const size_t *send_displs,
                                void *recv, const size_t *recv_counts, const size_t *recv_displs,
                                enum mt_dtype dt);
    enum mt_status (*barrier)(struct mt_ctx *ctx, struct mt_comm *c);
    /* variable counts (arrays already checked: non-NULL, extents fit size_t bytes) */
    enum mt_status (*allgatherv)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                 const size_t *counts, const size_t *displs, enum mt_dtype dt);
    enum mt_status (*reduce_scatterv)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      const size_t *counts, const size_t *displs, enum mt_dtype dt);
    /* non-blocking: fill *req (allocated by the implementation) */
    enum mt_status (*iallreduce)(struct mt_ctx *ctx, struct mt_comm *c, void *buf, size_t count,
                                 enum mt_dtype dt, enum mt_redop op, struct mt_comm_req **req);
    enum mt_status (*ireduce_scatter)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                      size_t count, enum mt_dtype dt, struct mt_comm_req **req);
    enum mt_status (*iallgather)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                 size_t count, enum mt_dtype dt, struct mt_comm_req **req);
    /* counts/displs belong to the caller only until return: copy what the
     * pending operation needs into the request (req->scratch) */
    enum mt_status (*iallgatherv)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                  const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                  struct mt_comm_req **req);
    enum mt_status (*ireduce_scatterv)(struct mt_ctx *ctx, struct mt_comm *c, void *recv, const void *send,
                                       const size_t *counts, const size_t *displs, enum mt_dtype dt,
                                       struct mt_comm_req **req);
    /* complete and free req (never NULL here), req->scratch included */
    enum mt_status (*wait)(struct mt_ctx *ctx, struct mt_comm_req *req);
    enum mt_status (*sendrecv_batch)(struct mt_ctx *ctx, struct mt_comm *c, int n_ops,
                                     const struct mt_p2p_op *ops);
    /* New group of the parent's ranks passing the same colour, ordered by
     * key (MPI_Comm_split). Collective over the parent. colour ==
     * MT_COMM_UNDEFINED: take part, get *out = NULL. */
    enum mt_status (*split)(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                            struct mt_comm **out);
    /* release implementation state and the struct itself */
    void (*destroy)(struct mt_comm *c);
};

/* A backend copy (the signature of mt_ops_i.copy): bytes from src to dst,
 * both in the backend's memory; regions do not overlap. */
typedef void (*mt_comm_copy_fn)(void *be, void *dst, const void *src, size_t bytes);

struct mt_comm {
    const struct mt_comm_i *iface;
    int                     size;
    int                     rank;
    struct mt_ctx          *ctx;   /* allocator owner; must outlive the comm */
    void                   *copy_be;  /* the backend instance `copy` receives */
    mt_comm_copy_fn         copy;  /* self_dev: how data moves; NULL elsewhere (host memmove) */
#ifdef MT_WITH_MPI
    MPI_Comm                mpi;   /* MPI_COMM_NULL for the self implementation */
#endif
};

/* A pending request. `comm` dispatches the wait; implementations keep their
 * state after the header (MPI: the MPI_Request). `scratch` is one mt_alloc
 * block (on req->ctx, bucket comm) that must live until the operation
 * completes — MPI's int count/displacement arrays and a packed send buffer
 * for the v-collectives — freed by wait; NULL when there is none. */
struct mt_comm_req {
    struct mt_comm *comm;
    struct mt_ctx  *ctx;           /* allocator owner */
    const char     *op;            /* "iallreduce", ...: the watchdog's message (set by comm.c) */
    void           *scratch;       /* owned; freed by wait */
#ifdef MT_WITH_MPI
    MPI_Request     mpi;
#endif
};

/* Implemented in comm.c: the self table, for use by other implementations. */
extern const struct mt_comm_i mt_comm_self_iface;
/* comm.c: the one-rank group on backend memory ("self_dev", see above):
 * every collective is the identity, its copies made by `copy` (required).
 * Blocking calls return once the copy is issued: the result is ordered by
 * the backend (its stream), not host-synchronous — exactly what the
 * backend's next kernel or copy_to_host needs. Splits keep the copy. Never
 * fails except OOM / NULL arguments. Free with mt_comm_destroy. */
extern const struct mt_comm_i mt_comm_self_dev_iface;
enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, void *copy_be,
                                       struct mt_comm **out);

/* comm.c: allocate a completed request (for implementations with nothing pending). */
enum mt_status mt_comm_req_done(struct mt_ctx *ctx, struct mt_comm *c, struct mt_comm_req **req);

/* Dispatch split through the table (comm.c). */
enum mt_status mt_comm_split(struct mt_ctx *ctx, struct mt_comm *parent, int colour, int key,
                             struct mt_comm **out);

/* comm_mpi.c: the MPI world duplicate, or MT_ERR_UNSUPPORTED when MPI is not
 * built in or not initialised (the caller falls back to self). */
enum mt_status mt_comm_mpi_create_world(struct mt_ctx *ctx, struct mt_comm **out);
/* comm_mpi.c: world size and rank of this process without any collective
 * (1 and 0 when MPI is absent or not initialised). */
void mt_comm_world_info(int *world, int *rank);

/* watchdog.c: mark a blocking collective named `op` on a group of
 * group_size ranks as in progress (returns 1 if marked: a watchdog runs and
 * the group has more than one rank) and
 * unmark it (pass enter's result). Main thread only; nesting keeps the
 * outermost. Cost: three atomic stores. */
int  mt_comm_wd_enter(const char *op, int group_size);
void mt_comm_wd_leave(int entered);

#endif /* MT_COMM_IMPL_H */
