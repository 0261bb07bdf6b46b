/*
 * cuda_runtime.h (emulation) — the subset of the CUDA runtime and device
 * language that src/ops/cuda uses, implemented on the CPU so the kernels can
 * be run and checked on a machine without a GPU (tests/test_cuda_build.sh).
 *
 * Used only with -DMT_CUDA_EMU -Itests/cuda/emu; the real build never sees
 * it. Device memory is host memory; a kernel launch runs every block in
 * order, each block's threads as cooperative fibers on one OS
 * thread, switching only at __syncthreads and warp shuffles, so barrier and
 * shuffle semantics are exact (a barrier that not every live thread reaches
 * is reported as a deadlock and aborts). Launch checks follow the hardware:
 * block <= 1024 threads, grid.y/z <= 65535, dynamic shared memory > 48 KiB
 * only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize) for that
 * kernel, <= 227 KiB (sm_90). Fresh device and dynamic shared memory is
 * filled with 0xff bytes (NaN floats) so reads of unwritten memory show;
 * so is static shared memory, at every launch's start.
 * Device memory is guarded: host code outside a kernel, a cudaMemcpy/
 * cudaMemset or a cuBLAS(Lt) call that touches it faults, with a message
 * naming the buffer and a backtrace (emu.cc; MT_EMU_GUARD=0 turns it off),
 * and cudaMemcpyAsync checks its kind against where the pointers live.
 *
 * Stream capture and graphs (cudaStreamBeginCapture ... cudaGraphLaunch):
 * while a stream captures, every kernel launch, cudaMemsetAsync, device-to-
 * device cudaMemcpyAsync, event record and cuBLAS(Lt) call is recorded
 * (the kernel and a copy of its arguments, host scalars such as alpha and
 * beta copied, as the libraries read them at the call) instead of run;
 * cudaGraphLaunch runs the recorded calls in order. What a GPU refuses
 * during a global-mode capture fails the same way here and invalidates it
 * (cudaErrorStreamCaptureUnsupported; cudaStreamEndCapture then returns
 * cudaErrorStreamCaptureInvalidated): a host wait (stream or event
 * synchronize), cudaMalloc / cudaFree, a copy from or to pageable host
 * memory (the emulator has no pinned memory). cudaStreamIsCapturing tells.
 */
#ifndef MT_EMU_CUDA_RUNTIME_H
#define MT_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
/* static shared arrays live in one section, which the emulator fills with 0xff
 * (NaN floats) at every launch's start: a read of an element the launch's first
 * block has not written shows, where a plain static would hand it the previous
 * launch's value (emu.cc mt_emu_run; dynamic shared memory is filled per block) */
#define __shared__ static __attribute__((section("mt_emu_smem")))
#define __align__(n) alignas(n)

/* the vector types of the elementwise kernels' 16-byte accesses (CUDA's alignments) */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorIllegalState = 401,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
};
typedef struct mt_emu_stream *cudaStream_t;
/* Events: the emulator runs every operation when it is queued, so an event
 * completes when recorded and holds the host's monotonic clock then; an
 * elapsed time is the emulator's CPU time between two records (meaningless
 * as a GPU time, but real: the receipt marks it "timing_emulated"). */
struct mt_emu_event { int magic; double t; };
typedef struct mt_emu_event *cudaEvent_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#define cudaStreamNonBlocking 0x01

struct cudaUUID_t { char bytes[16]; };
struct cudaDeviceProp {
    char   name[256];
    cudaUUID_t uuid;
    int    major, minor, multiProcessorCount;
    size_t totalGlobalMem;
};
/* the attributes the backend reads (values as in CUDA's driver_types.h) */
enum cudaDeviceAttr {
    cudaDevAttrClockRate = 13,
    cudaDevAttrEccEnabled = 32,
    cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int d);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
/* stream capture and graphs (values as in driver_types.h) */
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
typedef struct mt_emu_graph *cudaGraph_t;
typedef struct mt_emu_graph *cudaGraphExec_t;   /* an instantiated graph is a copy of the call list */
typedef struct mt_emu_graph_node *cudaGraphNode_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
/* emulator internal: while a capture is active, record `call` (a call that
 * re-issues the captured operation) as the graph's next node and return 1;
 * otherwise 0 (run the operation now) */
int mt_emu_capture_record(const std::function<void()> &call);

cudaError_t mt_emu_func_set_attribute(const void *kern, cudaFuncAttribute attr, int value);
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *kern, cudaFuncAttribute attr, int value)
{
    return mt_emu_func_set_attribute((const void *)kern, attr, value);
}

/* ---- device side ---- */
void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
/* bit casts (device_functions.h) */
static inline unsigned int __float_as_uint(float f)
{
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned int u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* round-to-nearest arithmetic the compiler may not contract into an FMA
 * (math_functions.h): the volatile store keeps gcc from fusing, as ptxas may
 * not fuse mul.rn/add.rn */
static inline float __fmul_rn(float a, float b)
{
    volatile float r = a * b;
    return r;
}
static inline float __fadd_rn(float a, float b)
{
    volatile float r = a + b;
    return r;
}
static inline float __fsub_rn(float a, float b)
{
    volatile float r = a - b;
    return r;
}
/* all live lanes of the calling warp exchange `size` bytes: out = lane src's value */
void mt_emu_warp_exchange(const void *mine, void *out, int src_lane, size_t size);
int  mt_emu_lane(void);
/* a warp-collective instruction (emu.cc; mma_ptx.h): each lane gives `size`
 * (<= MT_EMU_COLL_BYTES) bytes, the last lane to arrive runs fn over the 32
 * slots (each MT_EMU_COLL_BYTES apart) in place, each lane gets out_size bytes of its slot back */
#define MT_EMU_COLL_BYTES 64
void mt_emu_warp_collective(const void *mine, size_t size, void *out, size_t out_size,
                            void (*fn)(unsigned char *slots, size_t stride));

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src)
{
    (void)mask;
    T r;
    mt_emu_warp_exchange(&v, &r, src & 31, sizeof(T));
    return r;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    (void)mask;
    T r;
    mt_emu_warp_exchange(&v, &r, (mt_emu_lane() ^ lane_mask) & 31, sizeof(T));
    return r;
}

/* a device libm that is not the host's (MT_EMU_LIBM_ULPS=k, read once; unset: 0): r
 * moved k ulps, up or down by its own bits (deterministic); r = 0 stays. For the
 * kernels whose bits must not depend on the libm (init.cu), so that their check
 * is exercised on the CPU */
double mt_emu_libm(double r);

/* ---- launches ---- */
void *mt_emu_dyn_smem(void);
void  mt_emu_run(const void *kern, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* the order launches run in: 0 forward (blocks and each block's threads first to last),
 * 1 reverse (last to first); MT_EMU_ORDER=forward|reverse sets it for a whole
 * program, this call for the emulator's self-tests (tests/cuda/smem_emu.cc) */
void  mt_emu_set_order(int reverse);
/* the name a kernel's statistics print under (MT_EMU_BANKS, emu.cc): the backend's
 * launcher names each kernel it launches (cuda_impl.cuh mt_cuda_launch) */
void  mt_emu_name_kernel(const void *kern, const char *name);

template <typename... P>
struct mt_emu_launch {
    void (*kern)(P...);
    dim3   grid, block;
    size_t smem;
    /* the arguments are copied, converted to the kernel's parameter types,
     * when the launch is made (as cudaLaunchKernel does): a captured launch
     * replays the values of its capture */
    template <typename... A>
    void operator()(A &&...args) const
    {
        std::function<void()> body = [k = kern, ... a = P(std::forward<A>(args))]() { k(a...); };
        const void *kp = (const void *)kern;
        const dim3 g = grid, b = block;
        const size_t sm = smem;
        if (mt_emu_capture_record([kp, g, b, sm, body]() { mt_emu_run(kp, g, b, sm, body); })) return;
        mt_emu_run(kp, g, b, sm, body);
    }
};
template <typename... P>
static inline mt_emu_launch<P...> mt_emu_launcher(void (*kern)(P...), dim3 grid, dim3 block, size_t smem)
{
    return mt_emu_launch<P...>{kern, grid, block, smem};
}

#endif /* MT_EMU_CUDA_RUNTIME_H */
