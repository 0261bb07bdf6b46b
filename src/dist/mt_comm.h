/*
 * mt_comm.h — the collectives interface.
 *
 * A `struct mt_comm` is one process group (a mesh axis, or a product of
 * axes). Model and trainer code call only these functions; the
 * implementation behind them is a single-rank one (always built), MPI
 * (MT_WITH_MPI) or NCCL (MT_WITH_CUDA). On a group of size 1 every
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

enum mt_dtype { MT_DTYPE_F32 = 0, MT_DTYPE_F64, MT_DTYPE_I32, MT_DTYPE_I64, MT_DTYPE_U8 };
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

#endif /* MT_COMM_H */
