/*
 * graph_emu.cc — the CPU emulator's stream capture and graphs
 * (tests/cuda/emu/cuda_runtime.h), which the cuda backend's CUDA graphs
 * (src/ops/cuda/graph.cu) rely on under test (tests/test_cuda_build.sh
 * stage g). Checks, as a GPU behaves:
 *   - while a stream captures, a kernel launch, a memset, a device copy and
 *     a cuBLAS sgemm are recorded, not run; cudaStreamIsCapturing says so;
 *   - cudaGraphLaunch runs them in order with the values of the capture
 *     (a kernel argument and sgemm's alpha changed on the host afterwards
 *     do not reach the replay), every launch again;
 *   - a host wait (cudaStreamSynchronize), cudaMalloc and a copy from
 *     pageable host memory during a capture fail with
 *     cudaErrorStreamCaptureUnsupported and invalidate it: EndCapture
 *     returns cudaErrorStreamCaptureInvalidated and no graph.
 * Built and run only against the emulator (C++, -DMT_CUDA_EMU).
 */
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stdio.h>

static int n_pass, n_fail;
static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok) n_pass++;
    else n_fail++;
}

__global__ void add_k(float *x, float v, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] += v;
}

static void to_host(float *h, const float *d, int n)
{
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMemcpyAsync(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
}

int main(void)
{
    const int n = 4;
    float *x = NULL, *y = NULL, *c = NULL, h[4];
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&x, n * sizeof(float));
    cudaMalloc((void **)&y, n * sizeof(float));
    cudaMalloc((void **)&c, sizeof(float));
    cudaMemsetAsync(x, 0, n * sizeof(float), s);
    cublasHandle_t blas;
    cublasCreate(&blas);
    cublasSetStream(blas, s);

    /* capture: memset y = 0, x += v (v = 1), y = x (copy), c = alpha * x . y (alpha = 2) */
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "BeginCapture");
    check(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive, "IsCapturing: active");
    float v = 1.0f, alpha = 2.0f, beta = 0.0f;
    check(cudaMemsetAsync(y, 0, n * sizeof(float), s) == cudaSuccess, "memset captured");
    mt_emu_launcher(add_k, dim3(1), dim3(32), 0)(x, v, n);
    check(cudaGetLastError() == cudaSuccess, "launch captured");
    check(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s) == cudaSuccess, "d2d copy captured");
    check(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, n, &alpha, x, n, y, n, &beta, c, 1) == CUBLAS_STATUS_SUCCESS,
          "sgemm captured");
    v = 100.0f;       /* changed after the capture: the graph keeps 1 and 2 */
    alpha = 100.0f;
    cudaGraph_t g = NULL;
    check(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "EndCapture: a graph");
    size_t nodes = 0;
    check(cudaGraphGetNodes(g, NULL, &nodes) == cudaSuccess && nodes == 4, "4 nodes");
    check(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "IsCapturing: none after");
    to_host(h, x, n);
    check(h[0] == 0.0f && h[3] == 0.0f, "nothing ran during the capture");
    cudaGraphExec_t ex = NULL;
    check(cudaGraphInstantiate(&ex, g, 0) == cudaSuccess && ex, "Instantiate");
    cudaGraphDestroy(g);   /* the exec is independent of the graph */
    float r = 0;
    for (int launch = 1; launch <= 2; launch++) {
        check(cudaGraphLaunch(ex, s) == cudaSuccess, "GraphLaunch");
        to_host(h, x, n);
        to_host(&r, c, 1);
        /* x = launch (each launch adds the captured 1), c = 2 * n * launch^2 */
        char what[300];
        snprintf(what, sizeof what, "launch %d: x = %g (want %d), c = %g (want %d): capture-time values", launch, h[0],
                 launch, r, 2 * n * launch * launch);
        check(h[0] == (float)launch && h[3] == (float)launch && r == (float)(2 * n * launch * launch), what);
    }
    cudaGraphExecDestroy(ex);

    /* what a capture refuses: each fails and invalidates it */
    struct { const char *what; int kind; } refused[] = {{"cudaStreamSynchronize", 0}, {"cudaMalloc", 1},
                                                        {"pageable host-to-device copy", 2}};
    for (auto &t : refused) {
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        mt_emu_launcher(add_k, dim3(1), dim3(32), 0)(x, 1.0f, n);
        void *p = NULL;
        cudaError_t e = t.kind == 0   ? cudaStreamSynchronize(s)
                        : t.kind == 1 ? cudaMalloc(&p, 64)
                                      : cudaMemcpyAsync(x, h, sizeof(float), cudaMemcpyHostToDevice, s);
        (void)cudaGetLastError();
        cudaStreamIsCapturing(s, &st);
        cudaGraph_t bad = NULL;
        cudaError_t ee = cudaStreamEndCapture(s, &bad);
        (void)cudaGetLastError();
        char what[300];
        snprintf(what, sizeof what, "%s during a capture: %s, capture invalidated, EndCapture %s", t.what,
                 cudaGetErrorString(e), cudaGetErrorString(ee));
        check(e == cudaErrorStreamCaptureUnsupported && st == cudaStreamCaptureStatusInvalidated &&
                  ee == cudaErrorStreamCaptureInvalidated && !bad && !p, what);
    }
    to_host(h, x, n);
    check(h[0] == 2.0f, "the invalidated captures ran nothing");
    cublasDestroy(blas);
    cudaFree(x);
    cudaFree(y);
    cudaFree(c);
    cudaStreamDestroy(s);
    printf("graph_emu: %d checks, %d passed, %d failed\n", n_pass + n_fail, n_pass, n_fail);
    return n_fail ? 1 : 0;
}
