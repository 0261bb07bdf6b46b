/*
 * ops_cuda.cu — the cuda backend's kernel table, its one-time initialisation
 * (device check, stream, cuBLAS handle, reduction scratch), the sticky error
 * and the workspace.
 *
 * Invariant: mt_ops_cuda() returns the table only when the state is fully
 * initialised (`ready`); every entry then queues work on mt_cuda_g.stream in
 * call order, so a single stream orders all kernels, copies and GEMMs.
 */
#include "cuda_impl.cuh"

#include <stdio.h>
#include <string.h>

struct mt_cuda_state mt_cuda_g;

int mt_cuda_record(enum mt_status st, const char *call, const char *reason, const char *file, int line)
{
    mt_cuda_g.n_errors++;
    if (mt_cuda_g.err == MT_OK) {
        const char *base = strrchr(file, '/');
        mt_cuda_g.err = st;
        snprintf(mt_cuda_g.errmsg, sizeof mt_cuda_g.errmsg, "%s:%d: %s: %s", base ? base + 1 : file, line,
                 call, reason ? reason : "?");
    }
    return 0;
}

void *mt_cuda_workspace(size_t bytes)
{
    if (bytes <= mt_cuda_g.ws_bytes) return mt_cuda_g.ws;
    size_t want = bytes + bytes / 4;  /* grow by 25% more than asked: fewer regrowths */
    want = (want + 255) & ~(size_t)255;
    if (mt_cuda_g.ws) {
        /* cudaFree waits for the device: no queued kernel still reads the old buffer */
        MT_CUDA_CHECK(cudaFree(mt_cuda_g.ws));
        mt_cuda_g.ws = NULL;
        mt_cuda_g.ws_bytes = 0;
        mt_cuda_g.info.workspace_bytes = 0;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  /* an OOM from cudaMalloc is not sticky in CUDA: clear it */
        char why[96];
        snprintf(why, sizeof why, "workspace of %zu bytes: %s", want, cudaGetErrorString(e));
        mt_cuda_record(MT_ERR_OOM, "cudaMalloc", why, __FILE__, __LINE__);
        return NULL;
    }
    mt_cuda_g.ws = p;
    mt_cuda_g.ws_bytes = want;
    mt_cuda_g.info.workspace_bytes = want;
    return p;
}

static const struct mt_ops_i cuda_ops = {
    /* .name                 = */ .name                 = "cuda",
    /* .buf_alloc            = */ .buf_alloc            = mt_cuda_buf_alloc,
    /* .buf_free             = */ .buf_free             = mt_cuda_buf_free,
    /* .copy_to_host         = */ .copy_to_host         = mt_cuda_copy_to_host,
    /* .copy_from_host       = */ .copy_from_host       = mt_cuda_copy_from_host,
    /* .copy                 = */ .copy                 = mt_cuda_copy,
    /* .sync                 = */ .sync                 = mt_cuda_sync,
    /* .fill                 = */ .fill                 = mt_cuda_fill,
    /* .axpby                = */ .axpby                = mt_cuda_axpby,
    /* .sumsq                = */ .sumsq                = mt_cuda_sumsq,
    /* .all_finite           = */ .all_finite           = mt_cuda_all_finite,
    /* .gemm                 = */ .gemm                 = mt_cuda_gemm,
    /* .embed_forward        = */ .embed_forward        = mt_cuda_embed_forward,
    /* .embed_backward       = */ .embed_backward       = mt_cuda_embed_backward,
    /* .rmsnorm_forward      = */ .rmsnorm_forward      = mt_cuda_rmsnorm_forward,
    /* .rmsnorm_backward     = */ .rmsnorm_backward     = mt_cuda_rmsnorm_backward,
    /* .rope_forward         = */ .rope_forward         = mt_cuda_rope_forward,
    /* .rope_backward        = */ .rope_backward        = mt_cuda_rope_backward,
    /* .attention_forward    = */ .attention_forward    = mt_cuda_attention_forward,
    /* .attention_backward   = */ .attention_backward   = mt_cuda_attention_backward,
    /* .swiglu_forward       = */ .swiglu_forward       = mt_cuda_swiglu_forward,
    /* .swiglu_backward      = */ .swiglu_backward      = mt_cuda_swiglu_backward,
    /* .xent_forward         = */ .xent_forward         = mt_cuda_xent_forward,
    /* .xent_backward        = */ .xent_backward        = mt_cuda_xent_backward,
    /* .router_forward       = */ .router_forward       = mt_cuda_router_forward,
    /* .router_backward      = */ .router_backward      = mt_cuda_router_backward,
    /* .moe_permute          = */ .moe_permute          = mt_cuda_moe_permute,
    /* .moe_permute_backward = */ .moe_permute_backward = mt_cuda_moe_permute_backward,
    /* .moe_combine          = */ .moe_combine          = mt_cuda_moe_combine,
    /* .moe_combine_backward = */ .moe_combine_backward = mt_cuda_moe_combine_backward,
    /* .adamw_update         = */ .adamw_update         = mt_cuda_adamw_update,
    /* .muon_momentum        = */ .muon_momentum        = mt_cuda_muon_momentum,
    /* .transpose            = */ .transpose            = mt_cuda_transpose,
};

/* Undo a partial init; the state returns to all-zero. */
static void release_state(void)
{
    if (mt_cuda_g.blas) cublasDestroy(mt_cuda_g.blas);
    if (mt_cuda_g.red_partial) cudaFree(mt_cuda_g.red_partial);
    if (mt_cuda_g.red_flag) cudaFree(mt_cuda_g.red_flag);
    if (mt_cuda_g.ws) cudaFree(mt_cuda_g.ws);
    if (mt_cuda_g.stream) cudaStreamDestroy(mt_cuda_g.stream);
    (void)cudaGetLastError();
    memset(&mt_cuda_g, 0, sizeof mt_cuda_g);
}

static int init_fail(char *why, size_t why_len, const char *step, const char *reason)
{
    if (why && why_len) snprintf(why, why_len, "%s: %s", step, reason);
    release_state();
    return 0;
}

static int init_state(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return init_fail(why, why_len, "no usable CUDA device (cudaGetDeviceCount)", cudaGetErrorString(e));
    }
    if (n < 1) return init_fail(why, why_len, "no CUDA device", "cudaGetDeviceCount returned 0");
    memset(&mt_cuda_g, 0, sizeof mt_cuda_g);
    int dev = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return init_fail(why, why_len, "cudaGetDevice", cudaGetErrorString(e));
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return init_fail(why, why_len, "cudaGetDeviceProperties", cudaGetErrorString(e));
    if (prop.major < 7)
        return init_fail(why, why_len, "device too old", "compute capability >= 7.0 required");
    mt_cuda_g.device = dev;
    struct mt_ops_cuda_info *in = &mt_cuda_g.info;
    snprintf(in->device, sizeof in->device, "%s", prop.name);
    in->ordinal = dev;
    in->cc_major = prop.major;
    in->cc_minor = prop.minor;
    in->sm_count = prop.multiProcessorCount;
    in->mem_total = prop.totalGlobalMem;
    cudaRuntimeGetVersion(&in->runtime_version);

    if ((e = cudaStreamCreateWithFlags(&mt_cuda_g.stream, cudaStreamNonBlocking)) != cudaSuccess)
        return init_fail(why, why_len, "cudaStreamCreate", cudaGetErrorString(e));
    cublasStatus_t bs = cublasCreate(&mt_cuda_g.blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        mt_cuda_g.blas = NULL;
        return init_fail(why, why_len, "cublasCreate", cublasGetStatusString(bs));
    }
    /* fp32 mode: plain IEEE fp32 GEMMs (no TF32), the same numbers the cpu
     * backend is checked against; deterministic on one GPU model. */
    if ((bs = cublasSetStream(mt_cuda_g.blas, mt_cuda_g.stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetMathMode(mt_cuda_g.blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasGetVersion(mt_cuda_g.blas, &in->cublas_version)) != CUBLAS_STATUS_SUCCESS)
        return init_fail(why, why_len, "cublas setup", cublasGetStatusString(bs));
    if ((e = cudaMalloc((void **)&mt_cuda_g.red_partial, (MT_CUDA_RED_BLOCKS + 1) * sizeof(double))) != cudaSuccess ||
        (e = cudaMalloc((void **)&mt_cuda_g.red_flag, sizeof(int))) != cudaSuccess)
        return init_fail(why, why_len, "cudaMalloc (reduction scratch)", cudaGetErrorString(e));
    mt_cuda_g.ready = 1;
    return 1;
}

extern "C" const struct mt_ops_i *mt_ops_cuda(char *why, size_t why_len)
{
    if (!mt_cuda_g.ready && !init_state(why, why_len)) return NULL;
    if (why && why_len) why[0] = 0;
    return &cuda_ops;
}

extern "C" enum mt_status mt_ops_cuda_status(char *msg, size_t msg_len)
{
    if (msg && msg_len) {
        if (mt_cuda_g.err == MT_OK) msg[0] = 0;
        else if (mt_cuda_g.n_errors > 1)
            snprintf(msg, msg_len, "%s (+%ld more)", mt_cuda_g.errmsg, mt_cuda_g.n_errors - 1);
        else
            snprintf(msg, msg_len, "%s", mt_cuda_g.errmsg);
    }
    return mt_cuda_g.err;
}

extern "C" enum mt_status mt_ops_cuda_get_info(struct mt_ops_cuda_info *info)
{
    if (!mt_cuda_g.ready) return MT_ERR_UNSUPPORTED;
    *info = mt_cuda_g.info;
    return MT_OK;
}

extern "C" void *mt_ops_cuda_stream(void)
{
    return mt_cuda_g.ready ? (void *)mt_cuda_g.stream : NULL;
}

extern "C" void mt_ops_cuda_shutdown(void)
{
    if (!mt_cuda_g.ready) return;
    cudaStreamSynchronize(mt_cuda_g.stream);
    release_state();
}
