/*
 * comm_nccl.h — creating the NCCL communicator (comm_nccl.c, MT_WITH_NCCL).
 *
 * An NCCL communicator is an ordinary `struct mt_comm` ("nccl" table):
 * after creation it is used only through mt_comm.h, like the self and MPI
 * ones, except that every buffer is DEVICE memory of the communicator's
 * device. Its groups come from mt_comm_split (ncclCommSplit). See
 * docs/mesh.md, section "NCCL", for the stream, completion and timeout
 * rules.
 *
 * Example (one GPU per process, under mpirun):
 *     struct mt_comm *host, *gpu;
 *     MT_CHECK(mt_comm_create_world(ctx, &host));             // MPI (or self)
 *     MT_CHECK(mt_comm_nccl_create_world(ctx, host, local_rank, &gpu));
 *     MT_CHECK(mt_comm_allreduce(ctx, gpu, d_grads, n, MT_DTYPE_F32, MT_REDOP_SUM));
 *     mt_comm_destroy(gpu);   // before host: NCCL's teardown may still use the network
 *     mt_comm_destroy(host);
 */
#ifndef MT_COMM_NCCL_H
#define MT_COMM_NCCL_H

#include "mt_comm.h"

#ifdef MT_WITH_NCCL

/* "NCCL major.minor.patch" from ncclGetVersion (the library loaded at run
 * time, not the header's), or "NCCL (version query failed)". */
void mt_comm_nccl_version(char *buf, size_t n);

/* The NCCL world: one NCCL rank per rank of `mpi_world`, same rank order,
 * on CUDA device `device` (made current on the calling thread). Collective
 * over mpi_world: rank 0 calls ncclGetUniqueId and broadcasts it with
 * mt_comm_bcast (MT_DTYPE_U8), then every rank calls ncclCommInitRank.
 * mpi_world must be a host group (MPI or self; NULL means a world of this
 * process alone) and is only borrowed: the caller keeps and frees it. The
 * new communicator owns a non-blocking CUDA stream and reads its wait
 * timeout from MT_NCCL_TIMEOUT_S (seconds, default 600).
 *
 * Before ncclCommInitRank (which waits for every rank) the ranks agree, by
 * an allreduce over mpi_world, that each prepared its device, stream and
 * (rank 0) the id: a local failure is reported on every rank instead of
 * leaving the others in NCCL's init. Errors: MT_ERR_INVALID_ARG (NULL out,
 * negative device, mpi_world not a host group), MT_ERR_CONFIG (bad
 * MT_NCCL_TIMEOUT_S), CUDA/NCCL failures as MT_ERR_COMM / MT_ERR_RUNTIME /
 * MT_ERR_OOM with the vendor's message. On error *out is NULL. Free with
 * mt_comm_destroy. */
enum mt_status mt_comm_nccl_create_world(struct mt_ctx *ctx, struct mt_comm *mpi_world, int device,
                                         struct mt_comm **out);

/* Also order every later operation of NCCL communicator c after the work
 * queued on `stream` (a cudaStream_t, as void *) at the time of the call —
 * the stream that produces the send buffers, e.g. the cuda backend's
 * mt_ops_cuda_stream(), which is non-blocking and so not covered by the
 * legacy-stream fence. NULL removes it. Communicators split from c later
 * inherit it. Not thread-safe against operations on c. MT_ERR_INVALID_ARG
 * if c is not an NCCL communicator. */
enum mt_status mt_comm_nccl_set_input_stream(struct mt_ctx *ctx, struct mt_comm *c, void *stream);

/* 1 if c is an NCCL communicator. */
int mt_comm_is_nccl(const struct mt_comm *c);

#endif /* MT_WITH_NCCL */

#endif /* MT_COMM_NCCL_H */
