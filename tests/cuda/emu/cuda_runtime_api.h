/*
 * cuda_runtime_api.h (emulation) — the CUDA runtime API as plain C code sees
 * it, for src/parallel/comm_nccl.c in the emulated NCCL build
 * (tests/test_cuda_emu_mesh.sh). Used only with -Itests/cuda/emu.
 *
 * cuda_runtime.h (the emulator proper) is C++ with C++ linkage; a C file
 * cannot call those functions by name. Here C gets the same types and enum
 * values and macros that map each cudaX it uses onto an extern "C" shim
 * mt_emuc_X (nccl_emu.cc), which calls the emulator's cudaX. Events and
 * stream queries are new here: the emulator runs every operation when it is
 * called, so a recorded event and a stream are always complete
 * (cudaSuccess), and waits on them are no-ops. cudaSetDevice and the
 * memory calls are the emulator's own (one device, ordinal 0; the
 * device-memory guard; cudaMemcpyAsync's kind checks).
 */
#ifndef MT_EMU_CUDA_RUNTIME_API_H
#define MT_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
#include "cuda_runtime.h"
extern "C" {
#else
typedef enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef struct mt_emu_stream *cudaStream_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
#define cudaStreamNonBlocking 0x01
typedef struct mt_emu_event *cudaEvent_t;   /* C++: cuda_runtime.h's */
#endif

#define cudaEventDisableTiming 0x02
/* the legacy default stream's handle value, as in the real header */
#define cudaStreamLegacy ((cudaStream_t)0x1)

/* the shims: the same arguments and results as the cudaX they stand for
 * (cudaError_t and cudaMemcpyKind travel as int) */
int         mt_emuc_SetDevice(int device);
int         mt_emuc_StreamCreateWithFlags(cudaStream_t *s, unsigned flags);
int         mt_emuc_StreamDestroy(cudaStream_t s);
int         mt_emuc_StreamQuery(cudaStream_t s);
int         mt_emuc_StreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
int         mt_emuc_EventCreateWithFlags(cudaEvent_t *e, unsigned flags);
int         mt_emuc_EventDestroy(cudaEvent_t e);
int         mt_emuc_EventRecord(cudaEvent_t e, cudaStream_t s);
int         mt_emuc_EventQuery(cudaEvent_t e);
int         mt_emuc_Malloc(void **p, size_t bytes);
int         mt_emuc_Free(void *p);
int         mt_emuc_MemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
int         mt_emuc_MemcpyAsync(void *dst, const void *src, size_t bytes, int kind, cudaStream_t s);
const char *mt_emuc_GetErrorString(int e);
const char *mt_emuc_GetErrorName(int e);

#ifdef __cplusplus
}
#else
#define cudaSetDevice(d)                  ((cudaError_t)mt_emuc_SetDevice(d))
#define cudaStreamCreateWithFlags(s, f)   ((cudaError_t)mt_emuc_StreamCreateWithFlags(s, f))
#define cudaStreamDestroy(s)              ((cudaError_t)mt_emuc_StreamDestroy(s))
#define cudaStreamQuery(s)                ((cudaError_t)mt_emuc_StreamQuery(s))
#define cudaStreamWaitEvent(s, e, f)      ((cudaError_t)mt_emuc_StreamWaitEvent(s, e, f))
#define cudaEventCreateWithFlags(e, f)    ((cudaError_t)mt_emuc_EventCreateWithFlags(e, f))
#define cudaEventDestroy(e)               ((cudaError_t)mt_emuc_EventDestroy(e))
#define cudaEventRecord(e, s)             ((cudaError_t)mt_emuc_EventRecord(e, s))
#define cudaEventQuery(e)                 ((cudaError_t)mt_emuc_EventQuery(e))
#define cudaMalloc(p, b)                  ((cudaError_t)mt_emuc_Malloc(p, b))
#define cudaFree(p)                       ((cudaError_t)mt_emuc_Free(p))
#define cudaMemsetAsync(d, v, b, s)       ((cudaError_t)mt_emuc_MemsetAsync(d, v, b, s))
#define cudaMemcpyAsync(d, src, b, k, s)  ((cudaError_t)mt_emuc_MemcpyAsync(d, src, b, (int)(k), s))
#define cudaGetErrorString(e)             mt_emuc_GetErrorString((int)(e))
#define cudaGetErrorName(e)               mt_emuc_GetErrorName((int)(e))
#endif

#endif /* MT_EMU_CUDA_RUNTIME_API_H */
