/*
 * memory.cu — device buffers accounted on the ctx buckets, copies, sync.
 *
 * Accounting is mt_alloc's (src/core/core.c), through the same helpers:
 * mt_ctx_alloc_check counts every request and runs the test hook
 * `fail_after`, mt_ctx_account keeps bytes_live/peak per bucket and in total.
 *
 * Invariant: every live buffer starts MT_CUDA_HDR bytes after the pointer
 * cudaMalloc returned; those bytes (device memory) hold {bytes, bucket,
 * magic}, so buf_free can undo the accounting without any host-side table.
 * The header is 256 bytes, so user pointers keep cudaMalloc's 256-byte
 * alignment.
 */
#include "cuda_impl.cuh"

#include <stdio.h>
#include <string.h>

#define MT_CUDA_HDR   256
#define MT_CUDA_MAGIC 0x6d74637564614246ull  /* "mtcudaBF" */

struct buf_header {
    uint64_t bytes;
    uint64_t bucket;
    uint64_t magic;
};

/* Zero-filled device buffer; NULL + MT_ERR_OOM on the ctx on failure. */
extern "C" void *mt_cuda_buf_alloc(void *be, struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if ((int)bucket < 0 || bucket >= MT_BUCKET_COUNT) bucket = MT_BUCKET_OTHER;
    if (!mt_ctx_alloc_check(ctx, bytes, bucket, "device memory")) return NULL;
    size_t total = bytes + MT_CUDA_HDR;
    char *base = NULL;
    cudaError_t e = total < bytes ? cudaErrorMemoryAllocation : mt_cuda_malloc((void **)&base, total);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  /* allocation failures are not sticky in CUDA */
        if (ctx) mt_ctx_error(ctx, MT_ERR_OOM, "out of device memory allocating %zu bytes for %s: %s", bytes,
                              mt_bucket_name(bucket), cudaGetErrorString(e));
        return NULL;
    }
    struct buf_header h = {(uint64_t)bytes, (uint64_t)bucket, MT_CUDA_MAGIC};
    int ok = MT_CUDA_OK(mt_cuda_memset(base + MT_CUDA_HDR, 0, bytes)) &&
             MT_CUDA_OK(mt_cuda_memcpy(base, &h, sizeof h, cudaMemcpyHostToDevice)) &&
             MT_CUDA_OK(mt_cuda_stream_sync());  /* h lives on this stack frame */
    if (!ok) {
        mt_cuda_free(base);
        if (ctx) mt_ctx_error(ctx, MT_ERR_RUNTIME, "cuda buffer setup failed: %s", mt_cuda_be->errmsg);
        return NULL;
    }
    mt_ctx_account(ctx, bytes, bucket, 1);
    mt_cuda_note_mem();
    return base + MT_CUDA_HDR;
}

/* No-op on NULL. Waits for queued work (cudaFree does anyway). */
extern "C" void mt_cuda_buf_free(void *be, struct mt_ctx *ctx, void *p)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!p) return;
    char *base = (char *)p - MT_CUDA_HDR;
    struct buf_header h;
    memset(&h, 0, sizeof h);
    if (MT_CUDA_OK(mt_cuda_memcpy(&h, base, sizeof h, cudaMemcpyDeviceToHost)) && MT_CUDA_OK(mt_cuda_stream_sync())) {
        if (h.magic == MT_CUDA_MAGIC && h.bucket < MT_BUCKET_COUNT)
            mt_ctx_account(ctx, (size_t)h.bytes, (enum mt_bucket)h.bucket, 0);
        else
            mt_cuda_record(MT_ERR_RUNTIME, "buf_free", "pointer was not returned by buf_alloc (bad header)",
                           __FILE__, __LINE__);
    }
    MT_CUDA_CHECK(mt_cuda_free(base));
}

/* Host copies are synchronous: the host buffer may be read or reused as
 * soon as the call returns. */
extern "C" void mt_cuda_copy_to_host(void *be, void *dst_host, const void *src, size_t bytes)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!bytes) return;
    MT_CUDA_CHECK(mt_cuda_memcpy(dst_host, src, bytes, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
}

extern "C" void mt_cuda_copy_from_host(void *be, void *dst, const void *src_host, size_t bytes)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!bytes) return;
    MT_CUDA_CHECK(mt_cuda_memcpy(dst, src_host, bytes, cudaMemcpyHostToDevice));
    MT_CUDA_CHECK(mt_cuda_stream_sync());
}

/* device to device, queued (ordered with the kernels around it) */
extern "C" void mt_cuda_copy(void *be, void *dst, const void *src, size_t bytes)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (!bytes || dst == src) return;
    MT_CUDA_CHECK(mt_cuda_memcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

/* Wait for every queued op; the first recorded error is printed once. */
extern "C" void mt_cuda_sync(void *be)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    MT_CUDA_CHECK(mt_cuda_stream_sync());
    MT_CUDA_KCHECK();
    if (mt_cuda_be->err != MT_OK && !mt_cuda_be->err_reported) {
        mt_cuda_be->err_reported = 1;
        fprintf(stderr, "meshtrain cuda backend error: %s\n", mt_cuda_be->errmsg);
    }
}
