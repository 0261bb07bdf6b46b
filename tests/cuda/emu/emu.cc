/*
 * emu.cc — the CPU emulation behind tests/cuda/emu/cuda_runtime.h and
 * cublas_v2.h (see there for what is emulated and what is checked).
 *
 * HOW IT WORKS: a launch runs the grid's blocks one after another (first to
 * last; MT_EMU_ORDER=reverse: last to first, and each block's threads swept
 * last to first too, eagerly — see order_reverse). For a
 * block, every thread is a fiber (own stack, x86-64 register switch); the
 * scheduler sweeps the runnable fibers round-robin, each running until it
 * blocks at a barrier or returns (and then switching straight to the next
 * runnable fiber of the sweep: the same order, half the switches). __syncthreads waits for every live
 * (not yet returned) thread of the block, a warp exchange for every live
 * lane of the warp (CUDA's linear-thread-id warps). Shuffle values go
 * through a per-warp double buffer indexed by the lane's exchange count, so
 * a lane released from exchange n can never overwrite a value another lane
 * has yet to read. No runnable fiber while some are blocked = deadlock
 * (divergent barrier): reported and aborted, since this is test code.
 *
 * cuBLAS and cuBLASLt are naive loops with the libraries' argument checks
 * (see cublas_v2.h and cublasLt.h).
 *
 * HOW IT WORKS — the device-memory guard: every cudaMalloc is its own
 * mapping, kept PROT_NONE except while "the device" runs — a kernel launch,
 * a cudaMemcpy/cudaMemset, a cuBLAS or cuBLASLt call (dev_scope). Host code
 * that dereferences a device pointer (a memmove on a device buffer, a
 * host read of a result without copy_to_host) therefore faults here as it
 * would on a GPU, and the SIGSEGV handler names the buffer and prints the
 * host backtrace. Inside a dev_scope the handler instead opens the buffer
 * that faulted (mprotect read/write) and lets the access retry; the scope's
 * end closes the buffers it opened — so the cost is a fault per buffer a
 * kernel touches, not an mprotect of every buffer per launch.
 * cudaMemcpyAsync also checks its kind against where the pointers live
 * (HostToDevice from device memory is an error). MT_EMU_GUARD=0 turns the
 * protection off (the kind checks stay).
 */
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cublas_v2.h"
#include "cublasLt.h"
#include "mma_ptx.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---------------- runtime ---------------- */
static cudaError_t g_last = cudaSuccess;
static std::map<const void *, int> g_smem_optin;

/* ---- shared-memory bank conflicts (MT_EMU_BANKS=FILE) ----
 * The device serves a warp's shared-memory request in wavefronts: 32 banks of
 * 4 bytes, one word per bank a wavefront (the same word to many lanes is one).
 * A request is served in phases of 128 bytes: an ldmatrix.x4 is 4 phases of 8
 * rows of 16 bytes, a plain access of up to 4 bytes a lane 1 phase (the 32
 * lanes), of 8 bytes 2 (16 lanes each), of 16 bytes 4 (8 lanes each); a
 * conflict-free phase is 1 wavefront, lanes that ask for different words of
 * one bank cost more. The emulator sees the addresses (host addresses: a
 * common shift by a multiple of 4 moves every bank alike, so the count is the
 * device's) of every ldmatrix (mt_emu_note_ldmatrix) and of every plain load
 * and store of shared memory (sh_note below: the kernels' objects carry the
 * compiler's access instrumentation) and of every cp.async's 16 destination
 * bytes (at its issue, grouped like a plain 16-byte store) and keeps, per kind
 * and kernel, the phases seen, their wavefronts and the worst phase; at exit
 * each line goes to FILE: KIND NAME PHASES WAVEFRONTS WORST, KIND ldmatrix,
 * ld, st or cp.async. */
struct bank_stat { unsigned long long phases = 0, wavefronts = 0; int worst = 0; };
/* the global-memory kinds (GL_*: MT_EMU_COALESCE, below) count in the same
 * struct: phases the ideal sectors, wavefronts the sectors */
enum { BANK_LDMATRIX, BANK_LD, BANK_ST, BANK_CPASYNC, GL_LD, GL_ST, GL_CPASYNC, BANK_KINDS };
static const char *const g_bank_kind[BANK_KINDS] = {"ldmatrix", "ld", "st", "cp.async", "gld", "gst", "gcp.async"};
static std::map<const void *, std::string> g_kernel_name;
static std::map<const void *, bank_stat> g_banks[BANK_KINDS];
static const void *g_cur_kernel;
static int g_banks_on = -1;   /* counting on: MT_EMU_BANKS or MT_EMU_COALESCE (the request grouping is one) */
static int g_coal_on = 0;     /* MT_EMU_COALESCE: global accesses too */

void mt_emu_name_kernel(const void *kern, const char *name)
{
    if (name && g_kernel_name.find(kern) == g_kernel_name.end()) g_kernel_name[kern] = name;
}

/* kinds [k0, k1) into the file the variable names (unset or empty: none) */
static void counts_write(const char *var, int k0, int k1)
{
    const char *path = getenv(var);
    FILE *f = path && *path ? fopen(path, "w") : NULL;
    if (!f) return;
    for (int k = k0; k < k1; k++)
        for (const auto &kv : g_banks[k]) {
            if (kv.second.phases == 0) continue;   /* only requests left out (broadcasts) */
            auto it = g_kernel_name.find(kv.first);
            fprintf(f, "%s %s %llu %llu %d\n", g_bank_kind[k], it != g_kernel_name.end() ? it->second.c_str() : "?",
                    kv.second.phases, kv.second.wavefronts, kv.second.worst);
        }
    fclose(f);
}

static void banks_write(void)
{
    counts_write("MT_EMU_BANKS", 0, GL_LD);
    counts_write("MT_EMU_COALESCE", GL_LD, BANK_KINDS);
}

static void sh_sites_write(void);
static int banks_on(void)
{
    if (g_banks_on < 0) {
        g_coal_on = getenv("MT_EMU_COALESCE") && *getenv("MT_EMU_COALESCE");
        g_banks_on = (getenv("MT_EMU_BANKS") && *getenv("MT_EMU_BANKS")) || g_coal_on;
        if (g_banks_on) atexit(banks_write);
        if (g_banks_on) atexit(sh_sites_write);
    }
    return g_banks_on;
}

/* one phase: the 4-byte words its lanes ask for (n of them, any order, repeats
 * allowed) -> wavefronts, the most distinct words that share one bank */
static void bank_phase(const uintptr_t *word, int n, bank_stat &st)
{
    if (n == 0) return;
    unsigned banks = 0, shared = 0;
    for (int i = 0; i < n; i++) {
        const unsigned bit = 1u << (word[i] % 32);
        shared |= banks & bit;
        banks |= bit;
    }
    if (!shared) {   /* every word on its own bank: the common case, 1 */
        st.phases++;
        st.wavefronts++;
        st.worst = std::max(st.worst, 1);
        return;
    }
    uintptr_t seen[32][32];   /* per bank, the distinct words asked for (a phase has at most 32 words) */
    int cnt[32] = {0}, worst = 0;
    for (int i = 0; i < n; i++) {
        const int bank = (int)(word[i] % 32);
        int dup = 0;
        for (int j = 0; j < cnt[bank]; j++) dup |= seen[bank][j] == word[i];
        if (!dup) seen[bank][cnt[bank]++] = word[i];
        worst = std::max(worst, cnt[bank]);
    }
    st.phases++;
    st.wavefronts += (unsigned long long)worst;
    st.worst = std::max(st.worst, worst);
}

static void rc_ldmatrix(const unsigned char *const row[32]);
void mt_emu_note_ldmatrix(const unsigned char *const row[32])
{
    rc_ldmatrix(row);
    if (!banks_on()) return;
    bank_stat &st = g_banks[BANK_LDMATRIX][g_cur_kernel];
    for (int ph = 0; ph < 4; ph++) {
        uintptr_t words[32];
        for (int r = 0; r < 8; r++)
            for (int w = 0; w < 4; w++) words[4 * r + w] = (uintptr_t)row[8 * ph + r] / 4 + (uintptr_t)w;
        bank_phase(words, 32, st);
    }
}

/* ---- the device-memory guard (see the file comment) ---- */
static std::map<uintptr_t, size_t> g_dev;  /* mapping base -> length (page multiple) */
static int g_dev_depth;                    /* nesting of dev_scope                   */
static int g_guard = -1;                   /* MT_EMU_GUARD, read once (default on)   */

static int guard_on(void)
{
    if (g_guard < 0) {
        const char *e = getenv("MT_EMU_GUARD");
        g_guard = !(e && e[0] == '0');
    }
    return g_guard;
}
/* buffers opened (by a fault) during the current dev_scope; a fixed array,
 * since it is filled from the signal handler */
#define MAX_OPEN 65536
static uintptr_t g_open[MAX_OPEN];
static size_t    g_open_len[MAX_OPEN];
static int       g_n_open;
/* the device stops running: close what it opened */
static void dev_close_all(void)
{
    for (int i = 0; i < g_n_open; i++)
        if (mprotect((void *)g_open[i], g_open_len[i], PROT_NONE) != 0) {
            perror("cuda emu: mprotect");
            abort();
        }
    g_n_open = 0;
}
/* the device is running: device memory accessible (opened on first touch).
 * The signal handler reads g_dev_depth and fills g_open: the compiler
 * barriers keep the device's memory accesses inside the scope (without
 * them an inlined memset may be moved across the increment). */
static inline void compiler_barrier(void) { __asm__ __volatile__("" ::: "memory"); }
struct dev_scope {
    dev_scope() { g_dev_depth++; compiler_barrier(); }
    ~dev_scope() { compiler_barrier(); if (--g_dev_depth == 0 && guard_on()) dev_close_all(); }
    dev_scope(const dev_scope &) = delete;
    dev_scope &operator=(const dev_scope &) = delete;
};
/* the device buffer holding [p, p + bytes), or end() */
static std::map<uintptr_t, size_t>::iterator dev_find(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = g_dev.upper_bound(a);
    if (it == g_dev.begin()) return g_dev.end();
    --it;
    if (a >= it->first && a + bytes <= it->first + it->second) return it;
    return g_dev.end();
}
static int is_dev(const void *p, size_t bytes) { return dev_find(p, bytes) != g_dev.end(); }
static int overlaps_dev(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = g_dev.upper_bound(a + (bytes ? bytes - 1 : 0));
    if (it == g_dev.begin()) return 0;
    --it;
    return a < it->first + it->second && it->first < a + (bytes ? bytes : 1);
}
static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    auto it = dev_find(si->si_addr, 1);
    if (it != g_dev.end() && g_dev_depth > 0 && g_n_open < MAX_OPEN &&
        mprotect((void *)it->first, it->second, PROT_READ | PROT_WRITE) == 0) {
        g_open[g_n_open] = it->first;  /* the device touches it: open, retry */
        g_open_len[g_n_open++] = it->second;
        return;
    }
    if (it != g_dev.end())
        fprintf(stderr, "cuda emu: host access to DEVICE memory at %p (device buffer [%p, +%zu)) outside any "
                        "kernel, copy or cuBLAS call: on a GPU this is a crash. Host backtrace:\n",
                si->si_addr, (void *)it->first, it->second);
    else
        fprintf(stderr, "cuda emu: segmentation fault at %p (not device memory)\n", si->si_addr);
    void *bt[48];
    int n = backtrace(bt, 48);
    backtrace_symbols_fd(bt, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
static void install_segv_handler(void)
{
    static int done;
    if (done) return;
    done = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
}

static cudaError_t fail(cudaError_t e)
{
    if (g_last == cudaSuccess) g_last = e;
    return e;
}

/* ---- stream capture (see cuda_runtime.h) ----
 * One capture at a time (the backend captures its one stream, in global
 * mode). A node is a call that re-issues the captured operation: replaying
 * it with no capture active runs the operation with the values it was
 * captured with. */
struct mt_emu_graph { int magic; std::vector<std::function<void()>> nodes; };
#define MT_EMU_GRAPH_MAGIC 0x47524150
static cudaStream_t g_cap_stream;   /* the capturing stream, or NULL          */
static int          g_cap_invalid;  /* something the capture refuses happened  */
static std::vector<std::function<void()>> g_cap_nodes;

int mt_emu_capture_record(const std::function<void()> &call)
{
    if (!g_cap_stream) return 0;
    if (!g_cap_invalid) g_cap_nodes.push_back(call);
    return 1;
}
/* an operation a capture refuses (global mode: any stream) */
static int capture_refuses(const char *what)
{
    if (!g_cap_stream) return 0;
    if (!g_cap_invalid)
        fprintf(stderr, "cuda emu: %s while a stream is capturing: not permitted (the capture is invalidated)\n", what);
    g_cap_invalid = 1;
    return 1;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    if (!s || g_cap_stream) return fail(cudaErrorIllegalState);
    g_cap_stream = s;
    g_cap_invalid = 0;
    g_cap_nodes.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    if (!g || !s || s != g_cap_stream) return fail(cudaErrorIllegalState);
    g_cap_stream = NULL;
    *g = NULL;
    if (g_cap_invalid) {
        g_cap_nodes.clear();
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = new mt_emu_graph{MT_EMU_GRAPH_MAGIC, std::move(g_cap_nodes)};
    g_cap_nodes.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    if (!status) return fail(cudaErrorInvalidValue);
    *status = s && s == g_cap_stream ? (g_cap_invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                                     : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
static int graph_ok(const mt_emu_graph *g) { return g && g->magic == MT_EMU_GRAPH_MAGIC; }
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n)
{
    if (!graph_ok(g) || !n || nodes) return fail(cudaErrorInvalidValue);  /* the count only */
    *n = g->nodes.size();
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    if (!exec || !graph_ok(g) || flags) return fail(cudaErrorInvalidValue);
    *exec = new mt_emu_graph{MT_EMU_GRAPH_MAGIC, g->nodes};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!graph_ok(exec) || !s) return fail(cudaErrorInvalidValue);
    if (capture_refuses("cudaGraphLaunch")) return fail(cudaErrorStreamCaptureUnsupported);
    for (auto &n : exec->nodes) n();
    return cudaSuccess;
}
static cudaError_t graph_free(mt_emu_graph *g)
{
    if (!g) return cudaSuccess;
    if (!graph_ok(g)) return fail(cudaErrorInvalidValue);
    g->magic = 0;
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { return graph_free(exec); }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { return graph_free(g); }

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    }
    return "unknown error";
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidValue); }
cudaError_t cudaDriverGetVersion(int *v) { *v = 0; return cudaSuccess; } /* no driver: 0 */
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "meshtrain CPU emulation of sm_90");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;
    p->totalGlobalMem = (size_t)1 << 32;
    memcpy(p->uuid.bytes, "meshtrain-emu-00", 16);   /* GPU-6d657368-... in the receipt */
    return d == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}
/* made-up but plausible numbers (an H100 SXM's clocks and bus), so the
 * receipt's derived bandwidth has something to compute; an attribute the
 * emulator does not know fails like an invalid one */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int d)
{
    if (d != 0) return fail(cudaErrorInvalidValue);
    switch (attr) {
    case cudaDevAttrClockRate: *value = 1980000; return cudaSuccess;
    case cudaDevAttrEccEnabled: *value = 0; return cudaSuccess;
    case cudaDevAttrMemoryClockRate: *value = 2619000; return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; return cudaSuccess;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; return cudaSuccess;   /* an H100 SXM's */
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; return cudaSuccess;   /* an H100's */
    }
    return fail(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d)
{
    if (d != 0 || len < 1) return fail(cudaErrorInvalidValue);
    snprintf(id, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    if (capture_refuses("cudaStreamSynchronize (a host wait)")) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}
/* one mapping per buffer (page aligned, so cudaMalloc's 256-byte alignment
 * holds), filled with 0xff (NaN) so reads of unwritten memory show */
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    install_segv_handler();
    if (capture_refuses("cudaMalloc")) return fail(cudaErrorStreamCaptureUnsupported);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = ((bytes ? bytes : 1) + page - 1) / page * page;
    void *q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return cudaErrorMemoryAllocation;
    memset(q, 0xff, len);
    if (guard_on() && mprotect(q, len, PROT_NONE) != 0) {
        munmap(q, len);
        return cudaErrorMemoryAllocation;
    }
    g_dev[(uintptr_t)q] = len;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    if (capture_refuses("cudaFree")) return fail(cudaErrorStreamCaptureUnsupported);
    auto it = g_dev.find((uintptr_t)p);
    if (it == g_dev.end()) {
        fprintf(stderr, "cuda emu: cudaFree(%p): not a pointer cudaMalloc returned\n", p);
        return fail(cudaErrorInvalidValue);
    }
    for (int i = 0; i < g_n_open; i++)  /* freed inside a scope: forget it */
        if (g_open[i] == it->first) {
            g_n_open--;
            g_open[i] = g_open[g_n_open];
            g_open_len[i] = g_open_len[g_n_open];
            i--;
        }
    munmap((void *)it->first, it->second);
    g_dev.erase(it);
    return cudaSuccess;
}
/* free = the emulated 4 GiB minus the pages of the live cudaMalloc mappings */
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    size_t used = 0;
    for (auto &kv : g_dev) used += kv.second;
    *total_b = (size_t)1 << 32;
    *free_b = used < *total_b ? *total_b - used : 0;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s)
{
    (void)s;
    if (bytes && (!dst || !src)) return fail(cudaErrorInvalidValue);
    if (!bytes) return cudaSuccess;
    /* the kind must say where the pointers live (cudaMemcpyDefault: anything) */
    int sd = is_dev(src, bytes), dd = is_dev(dst, bytes);
    int ok = kind == cudaMemcpyDefault ||
             (kind == cudaMemcpyHostToDevice && !overlaps_dev(src, bytes) && dd) ||
             (kind == cudaMemcpyDeviceToHost && sd && !overlaps_dev(dst, bytes)) ||
             (kind == cudaMemcpyDeviceToDevice && sd && dd) ||
             (kind == cudaMemcpyHostToHost && !overlaps_dev(src, bytes) && !overlaps_dev(dst, bytes));
    if (!ok) {
        fprintf(stderr, "cuda emu: cudaMemcpyAsync kind %d with src %s, dst %s (%zu bytes)\n", (int)kind,
                sd ? "device" : "host", dd ? "device" : "host", bytes);
        return fail(cudaErrorInvalidValue);
    }
    if (g_cap_stream) {
        /* device to device: a memcpy node; host memory here is pageable */
        if (!(sd && dd)) {
            capture_refuses("cudaMemcpyAsync to or from pageable host memory");
            return fail(cudaErrorStreamCaptureUnsupported);
        }
        mt_emu_capture_record([=]() { cudaMemcpyAsync(dst, src, bytes, kind, s); });
        return cudaSuccess;
    }
    dev_scope on;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    (void)s;
    if (bytes && !dst) return fail(cudaErrorInvalidValue);
    if (!bytes) return cudaSuccess;
    if (!is_dev(dst, bytes)) {
        fprintf(stderr, "cuda emu: cudaMemsetAsync on host memory %p\n", dst);
        return fail(cudaErrorInvalidValue);
    }
    if (mt_emu_capture_record([=]() { cudaMemsetAsync(dst, value, bytes, s); })) return cudaSuccess;
    dev_scope on;
    memset(dst, value, bytes);
    return cudaSuccess;
}
#define MT_EMU_EV_MAGIC 0x45564e54
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new mt_emu_event{MT_EMU_EV_MAGIC, -1.0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e || e->magic != MT_EMU_EV_MAGIC) return fail(cudaErrorInvalidValue);
    e->magic = 0;
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    if (!e || e->magic != MT_EMU_EV_MAGIC) return fail(cudaErrorInvalidValue);
    if (mt_emu_capture_record([=]() { cudaEventRecord(e, s); })) return cudaSuccess;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (capture_refuses("cudaEventSynchronize (a host wait)")) return fail(cudaErrorStreamCaptureUnsupported);
    return e && e->magic == MT_EMU_EV_MAGIC ? cudaSuccess : fail(cudaErrorInvalidValue);
}
/* as CUDA: both events must have been recorded */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!start || !end || start->magic != MT_EMU_EV_MAGIC || end->magic != MT_EMU_EV_MAGIC || start->t < 0 || end->t < 0)
        return fail(cudaErrorInvalidValue);
    *ms = (float)(1e3 * (end->t - start->t));
    return cudaSuccess;
}
cudaError_t mt_emu_func_set_attribute(const void *kern, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
        return fail(cudaErrorInvalidValue);
    g_smem_optin[kern] = value;
    return cudaSuccess;
}

/* ---------------- fibers ---------------- */
/* A fiber switch saves the callee-saved registers, MXCSR and the x87
 * control word on the current stack and swaps stack pointers (x86-64 SysV;
 * no system call, unlike swapcontext, which matters at ~10^5 switches per
 * launch). A fresh fiber's stack is laid out as if it had switched out just
 * before entering fiber_entry. */
#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif
extern "C" void mt_emu_switch(void **save_sp, void *new_sp);
asm(R"(
    .text
    .globl mt_emu_switch
    .type mt_emu_switch, @function
mt_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mt_emu_switch, .-mt_emu_switch
)");

enum { RUNNABLE, WAIT_BLOCK, WAIT_WARP, WAIT_WG, DONE };
struct fiber {
    void    *sp;
    dim3     tid;
    int      state, warp, lane;
    unsigned nexch;  /* warp exchanges done: double-buffer phase */
    unsigned nwload, nwstore, nwmma; /* wmma loads / stores / products done (mma.h): their sequence numbers */
    void    *site;   /* call site of the barrier it waits at (divergence check) */
    unsigned cp_committed; /* cp.async groups committed (mt_emu_cp_async_commit) */
    unsigned nwg;          /* warpgroup collectives done: double-buffer phase */
    unsigned wg_committed; /* wgmma groups committed (mt_emu_wgmma_commit) */
    unsigned wg_inflight;  /* its wgmma products not computed yet (a wait's last thread computes them) */
};

#define STACK_BYTES (64 * 1024)
/* fiber t's stack starts t * STACK_STRIDE into g_stacks: 7 cache lines more
 * than its size, so the stack tops (where every switch saves and restores)
 * fall in different cache sets; at a power-of-two stride they would all
 * share one, and a switch would miss the cache every time */
#define STACK_STRIDE (STACK_BYTES + 7 * 64)
static void                        *g_sched_sp;
static std::vector<fiber>           g_f;
static std::vector<char>            g_stacks;
static std::vector<int>             g_warp_live, g_warp_arrived;
static std::vector<int>             g_wg_arrived;   /* per warpgroup (4 warps) */
static std::vector<unsigned char>   g_wgslots;      /* [warpgroup][phase 2][thread 128][MT_EMU_WG_BYTES] */
static std::vector<unsigned char>   g_slots;  /* [warp][phase 2][lane 32][8 bytes] */
static std::vector<unsigned char>   g_cslots; /* warp collectives: [warp][phase 2][lane 32][MT_EMU_COLL_BYTES] */
/* dynamic shared memory: 128-byte aligned like the device's (wmma tiles
 * need 32-byte alignment; a std::vector's data has only malloc's 16) */
struct dyn_smem {
    unsigned char *p = nullptr;
    size_t n = 0;
    void resize(size_t want)
    {
        if (want <= n) return;
        free(p);
        /* 1024: wgmma's 128-byte swizzle reads address bits 7-9 (mt_emu_smem_offset) */
        p = (unsigned char *)aligned_alloc(1024, (want + 1023) & ~(size_t)1023);
        if (!p) abort();
        n = want;
    }
    unsigned char *data() { return p; }
    size_t size() const { return n; }
};
static dyn_smem g_dyn;
/* wmma tiles in flight (mma.h): a load is done by the FIRST lane of the
 * warp to reach it and handed to the others, a store by the LAST (see
 * mt_emu_wmma_load_first); per warp, keyed by the op's sequence number */
struct wmma_tile { float x[256]; int left; };
/* the in-flight ops of one warp by sequence number: lanes reach them in
 * order and the last lane takes them in order, so a queue from the oldest
 * one still wanted (a std::map here cost a fifth of the emulated wmma
 * attention's time); an entry with left 0 is absent */
template <typename T> struct seq_queue {
    std::deque<T> items;
    unsigned      base = 0;
    T *find(unsigned seq)
    {
        if (seq < base || seq - base >= items.size()) return nullptr;
        T *t = &items[seq - base];
        return t->left > 0 ? t : nullptr;
    }
    T *add(unsigned seq, int others)  /* for the warp's other lanes; nullptr: none, or seq already retired */
    {
        if (others <= 0 || seq < base) return nullptr;
        while (items.size() <= seq - base) { items.emplace_back(); items.back().left = 0; }
        items[seq - base].left = others;
        return &items[seq - base];
    }
    void taken(T *t)  /* one more lane took t */
    {
        if (--t->left > 0) return;
        while (!items.empty() && items.front().left <= 0) { items.pop_front(); base++; }
    }
};
static std::vector<seq_queue<wmma_tile>> g_wmma_loads;
static std::vector<std::map<unsigned, int>>       g_wmma_stores;
/* wmma products in flight: the first lane's operands and result, for the
 * other lanes to take when theirs are the same (mt_emu_wmma_mma_recall) */
struct wmma_product { float a[256], b[256], c[256], d[256]; int left; };
static std::vector<seq_queue<wmma_product>> g_wmma_mmas;
/* cp.async copies in flight, per fiber (mma_ptx.h): the 16 bytes read at the
 * issue, where they go, and the group they join (the issuer's commit count then) */
struct cp_pending { unsigned char *dst; unsigned char data[16]; unsigned group; const void *pc; };
static std::vector<std::vector<cp_pending>> g_cp;
/* a thread's wgmma not yet waited for (mt_emu_wgmma_ss): its operands, its C
 * (the thread's d at the issue, or the product `chain` before it on the same
 * d), its group; computed and landed in d by the covering wait */
struct wg_pending {
    float *d;
    uint64_t da, db;   /* da 0 for A from registers (rs): a */
    uint32_t a[4];
    int n, acc, rs, chain, done;
    int tr;            /* imm-trans: bit 0 A MN-major, bit 1 B */
    int hashed;        /* the warpgroup's first thread to issue it: tiles_hash below */
    uint64_t tiles_hash;   /* its shared-memory operands' bits at that issue (wg_tiles_hash) */
    unsigned group;
    float c[128], v[128];
};
static std::vector<std::vector<wg_pending>> g_wgp;
static int                          g_cur, g_live, g_block_arrived;
static const std::function<void()> *g_body;

/* MT_EMU_ORDER=reverse: blocks run last to first and the scheduler sweeps a
 * block's threads from the last to the first, eagerly: whenever a fiber
 * blocks, the highest runnable one runs next (the caller itself when it is
 * that one), so the last warp (and warpgroup) runs as far ahead of the
 * lower ones as their barriers let it, where the forward sweep runs the
 * warps round-robin, one collective each a round. A kernel without races gives
 * the same bits in both orders; one that depends on the order (a block
 * reading what another block of the same launch writes, a thread reading
 * shared memory another thread writes with no barrier between, float
 * atomics) gives other bits in one of them, where on a GPU it races. Every
 * pair of blocks and of threads runs the other way round, so a comparison
 * of a forward and a reverse run catches either direction of a race
 * (docs/cuda.md, "The CPU emulator"). Read once. */
static int g_reverse = -1;
static int order_reverse(void)
{
    if (g_reverse < 0) {
        const char *e = getenv("MT_EMU_ORDER");
        if (!e || !*e || !strcmp(e, "forward")) g_reverse = 0;
        else if (!strcmp(e, "reverse")) g_reverse = 1;
        else {
            fprintf(stderr, "cuda emu: MT_EMU_ORDER=%s: expected forward or reverse\n", e);
            abort();
        }
    }
    return g_reverse;
}
void mt_emu_set_order(int reverse) { g_reverse = reverse != 0; }
/* position p of the sweep -> fiber index, and back (the map is its own inverse) */
static size_t sweep_pos(size_t p) { return g_reverse > 0 ? g_f.size() - 1 - p : p; }
/* the eager sweep's start: no fiber before this sweep position is runnable (a fiber
 * stops being runnable only when it blocks itself, the current one, which was the first;
 * make_runnable lowers it), so a yield scans from here, not from 0: O(1) a switch */
static size_t g_first_hint;
static void make_runnable(size_t t)
{
    g_f[t].state = RUNNABLE;
    const size_t p = sweep_pos(t);
    if (p < g_first_hint) g_first_hint = p;
}

/* The calling fiber blocks (or returns): on to the next RUNNABLE fiber of
 * the scheduler's sweep, switched to directly (one switch, not two through
 * the scheduler), or back to the scheduler when the sweep has none left.
 * The order is the scheduler's own: it would check the fibers after g_cur
 * in turn at this very moment. Whoever switches into a fiber sets g_cur
 * and threadIdx first. */
static void yield_to_sched(void)
{
    fiber &cur = g_f[g_cur];
    const size_t nt = g_f.size();
    for (size_t p = g_reverse > 0 ? g_first_hint : sweep_pos((size_t)g_cur) + 1; p < nt; p++) {   /* reverse: eager */
        const size_t t = sweep_pos(p);
        if (g_f[t].state == RUNNABLE) {
            g_first_hint = p;
            if ((int)t == g_cur) return;   /* eager, and the caller is the first runnable: it goes on */
            g_cur = (int)t;
            threadIdx = g_f[t].tid;
            mt_emu_switch(&cur.sp, g_f[t].sp);
            return;
        }
    }
    if (g_reverse > 0) g_first_hint = nt;
    mt_emu_switch(&cur.sp, g_sched_sp);
}

/* ---- plain loads and stores: shared ones for the bank count (MT_EMU_BANKS), global
 * ones for the sector count (MT_EMU_COALESCE, gl_count below) ----
 * The kernels' objects are compiled with GCC's ThreadSanitizer instrumentation
 * and without its runtime (tests/cuda/emu_objects.sh): the compiler calls
 * __tsan_readN / __tsan_writeN(address) before each memory access it cannot
 * prove private, and the emulator defines them (below). An access inside the
 * block's shared memory (dynamic, or the static arrays' section) is recorded
 * for its warp by instruction (the call's return address) and by the lane's
 * count of that instruction since the warp last met: the k-th execution of
 * an instruction by each lane of a warp is one request, as on the device,
 * where a warp issues an instruction for all its lanes at once. A warp meets
 * at a barrier, a shuffle, an mma or ldmatrix, a warpgroup collective or the
 * block's end: there its requests are complete and counted (sh_flush), and
 * the counts restart (lanes that diverged are in step again). Lanes that ran
 * a conditional access a different number of times between two meetings are
 * paired by count, not by loop iteration: a rough count there, exact in
 * uniform code. The emulator's own fragment helpers carry no instrumentation
 * (MT_EMU_UNCHECKED), so an emulated ldmatrix or wmma load is not also counted
 * as plain loads. */
struct sh_row {
    uint32_t addr[32];   /* of the lanes in mask (the others unset: a new request costs no clearing) */
    unsigned mask;
    sh_row() : mask(0) {}
};   /* low 32 address bits: banks and words within 4 GiB */
struct sh_site {
    unsigned n[32] = {0};        /* per lane: its executions since the warp last met */
    std::vector<sh_row> rows;    /* request k: each lane's address of its k-th execution */
    int size = 0, kind = 0, dirty = 0;
    bank_stat total;             /* this warp's requests here so far (MT_EMU_BANKS_SITES; worst unused) */
};
#define SH_CACHE 256   /* per warp: a direct-mapped cache of key -> site in front of the map (sh_note's cost) */
struct sh_warp {
    std::unordered_map<uintptr_t, sh_site> sites;   /* by instruction and 16-byte piece (sh_note) */
    std::vector<sh_site *> dirty;            /* those with requests since the last meeting */
    uintptr_t cache_key[SH_CACHE] = {0};
    sh_site  *cache_site[SH_CACHE] = {nullptr};
};
static std::vector<sh_warp> g_sh;           /* per warp of the running block */
static int g_sh_running;                    /* a block runs (the hooks' fiber is g_cur) */

/* the static shared arrays' section (cuda_runtime.h __shared__): the linker's
 * bounds, weak so that a program without one links */
extern "C" unsigned char __start_mt_emu_smem[] __attribute__((weak));
extern "C" unsigned char __stop_mt_emu_smem[] __attribute__((weak));
static unsigned char *const g_static_smem = __start_mt_emu_smem;
static const size_t g_static_smem_bytes =
    __start_mt_emu_smem ? (size_t)((uintptr_t)__stop_mt_emu_smem - (uintptr_t)__start_mt_emu_smem) : 0;

/* the shared memory address a lies in: the block's dynamic area or the static
 * arrays' section (its base; dyn picks the race check's shadow); false: neither */
struct sh_region { uintptr_t base; bool dyn; };
static bool sh_region_of(uintptr_t a, sh_region *r)
{
    if (a - (uintptr_t)g_dyn.data() < g_dyn.size()) *r = {(uintptr_t)g_dyn.data(), true};
    else if (a - (uintptr_t)g_static_smem < g_static_smem_bytes) *r = {(uintptr_t)g_static_smem, false};
    else return false;
    return true;
}

/* a request: its lanes in phases (size <= 4: 1 phase of 32 lanes; 8: 2 of 16; 16: 4 of 8) */
static void sh_count(const sh_row &r, int size, bank_stat &st)
{
    const int words = size <= 4 ? 1 : size / 4, lanes_per_phase = 32 / words;
    for (int l0 = 0; l0 < 32; l0 += lanes_per_phase) {
        uintptr_t word[32];
        int n = 0;
        const unsigned phase_lanes = lanes_per_phase == 32 ? ~0u : ((1u << lanes_per_phase) - 1) << l0;
        for (unsigned m = r.mask & phase_lanes; m; m &= m - 1) {
            const int l = __builtin_ctz(m);
            const uintptr_t first = r.addr[l] / 4, last = ((uintptr_t)r.addr[l] + (uintptr_t)size - 1) / 4;
            for (uintptr_t w = first; w <= last && n < 32; w++) word[n++] = w;
        }
        bank_phase(word, n, st);
    }
}

/* MT_EMU_COALESCE=FILE: the same requests of global memory (every address
 * outside shared memory and the threads' stacks: a kernel's locals and
 * by-value arguments live there, registers on a device), counted in 32-byte
 * sectors, the unit of an SM's L1 and the L2: a request's sectors (the
 * distinct 32-byte segments its lanes touch) against its ideal (its distinct
 * bytes / 32, rounded up: what contiguous, aligned lanes would touch). In
 * FILE, KIND gld, gst or gcp.async (cp.async's global side), PHASES the ideal
 * sectors, WAVEFRONTS the sectors, WORST the largest ratio of a request
 * (rounded up). A request of one address (a broadcast: a kernel's scalar,
 * threadIdx, the launcher's copy of the arguments; or a lone lane) is left
 * out: one sector, nothing to learn, and it would dilute the ratios.
 * A ratio over 1 is a request the L1 serves in more sectors than
 * its bytes need (strided lanes, a misaligned row); the L2 and DRAM may still
 * see each sector once when the next requests reuse the lines (a warp walking
 * 32 rows one element a step): a pointer for ncu, not a measurement of HBM. */
static void gl_count(const sh_row &r, int size, bank_stat &st)
{
    uint64_t lo[32], sec[64];   /* the low 32 address bits, widened: a lane's end may pass 2^32 */
    int n = 0, ns = 0;
    for (unsigned m = r.mask; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        lo[n++] = r.addr[l];
        for (uint64_t s = lo[n - 1] / 32; s <= (lo[n - 1] + (uint64_t)size - 1) / 32; s++) sec[ns++] = s;
    }
    std::sort(lo, lo + n);
    if (n == 0 || lo[0] == lo[n - 1]) return;   /* one address (a broadcast, one lane) is one sector: not counted */
    std::sort(sec, sec + ns);
    const int sectors = (int)(std::unique(sec, sec + ns) - sec);
    unsigned long long bytes = 0;
    uint64_t end = 0;   /* the union of [lo, lo + size): the lanes sorted by address */
    for (int i = 0; i < n; i++) {
        const uint64_t b = std::max(lo[i], end), e = lo[i] + (uint64_t)size;
        if (e > b) bytes += e - b;
        end = std::max(end, e);
    }
    const int ideal = (int)((bytes + 31) / 32);
    st.phases += (unsigned long long)ideal;
    st.wavefronts += (unsigned long long)sectors;
    st.worst = std::max(st.worst, (sectors + ideal - 1) / ideal);
}

static void sh_flush(int w)
{
    sh_warp &sw = g_sh[(size_t)w];
    for (sh_site *s : sw.dirty) {
        bank_stat &st = g_banks[s->kind][g_cur_kernel];
        const bank_stat before = st;
        for (const sh_row &r : s->rows)
            if (s->kind >= GL_LD) gl_count(r, s->size, st);
            else sh_count(r, s->size, st);
        s->total.phases += st.phases - before.phases;
        s->total.wavefronts += st.wavefronts - before.wavefronts;
        s->rows.clear();
        memset(s->n, 0, sizeof s->n);
        s->dirty = 0;
    }
    sw.dirty.clear();
}

static void sh_flush_all(void)
{
    for (size_t w = 0; w < g_sh.size(); w++) sh_flush((int)w);
}

/* MT_EMU_BANKS_SITES=FILE: the plain accesses above 1 wavefront a phase (or, gld /
 * gst, above 1 sector a needed one) by instruction, every warp's together, worst
 * first: KIND OBJECT+OFFSET PHASES WAVEFRONTS (`addr2line -f -C -e OBJECT OFFSET`
 * names the source line), for finding what a kernel's count comes from */
static void sh_sites_write(void)
{
    const char *path = getenv("MT_EMU_BANKS_SITES");
    FILE *f = path && *path ? fopen(path, "w") : NULL;
    if (!f) return;
    std::map<uintptr_t, std::pair<int, bank_stat>> by_pc;
    for (const sh_warp &sw : g_sh)
        for (const auto &kv : sw.sites) {
            auto &e = by_pc[kv.first];
            e.first = kv.second.kind;
            e.second.phases += kv.second.total.phases;
            e.second.wavefronts += kv.second.total.wavefronts;
        }
    std::vector<std::pair<double, uintptr_t>> order;
    for (const auto &kv : by_pc)
        if (kv.second.second.wavefronts > kv.second.second.phases)
            order.push_back({(double)kv.second.second.wavefronts / (double)kv.second.second.phases, kv.first});
    std::sort(order.rbegin(), order.rend());
    for (const auto &o : order) {
        const auto &e = by_pc[o.second];
        Dl_info info;
        const void *pc = (const void *)(o.second & (((uintptr_t)1 << 48) - 1));
        if (dladdr(pc, &info) && info.dli_fname)
            fprintf(f, "%s %s+0x%lx %llu %llu\n", g_bank_kind[e.first], info.dli_fname,
                    (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase - 1),   /* inside the call */
                    e.second.phases, e.second.wavefronts);
    }
    fclose(f);
}

/* ---- shared-memory race check (MT_EMU_RACECHECK=1) ----
 * The same instrumented accesses, plus ldmatrix's rows and cp.async's landing,
 * checked against happens-before as CUDA defines it for shared memory: two
 * threads' accesses are ordered by a __syncthreads between them, or, in one
 * warp, by a warp meeting (__syncwarp, a shuffle, an mma or ldmatrix). Each
 * 4-byte word keeps its last writer and its last reader (thread, block epoch,
 * that warp's epoch: epochs only grow, a barrier's release and a block's start
 * advance the block's, a meeting its warp's). A read of a word another thread
 * wrote with nothing between (RAW: a missing barrier after a store), or a
 * write of one another thread read with nothing between (WAR: a buffer
 * refilled while a warp still reads it; cp.async's copy checked as it lands,
 * at its thread's wait), aborts naming the kernel, the block, both threads
 * and the instruction. Not checked: two writes (WAW: many threads storing the
 * same flag is common and harmless), wgmma's own reads (the tile hash covers
 * a change in flight), wmma loads and stores, and an older reader than the last. This is
 * a race on the device whatever order the emulator runs the threads in, where
 * MT_EMU_ORDER=reverse shows a race only when it changes a result. */
struct rc_access { uint32_t tid1 = 0, bep = 0, wep = 0; };   /* tid1: the thread + 1 (0: none) */
struct rc_word { rc_access w, r; };
static std::vector<rc_word> g_rc_dyn, g_rc_static;   /* a word's last writer and reader */
static uint32_t g_rc_bep = 1;                        /* the block epoch */
static std::vector<uint32_t> g_rc_wep;               /* per warp */
static int g_race_on = -1;

static int race_on(void)
{
    if (g_race_on < 0) {
        const char *e = getenv("MT_EMU_RACECHECK");
        g_race_on = e && *e && strcmp(e, "0") != 0;
    }
    return g_race_on;
}

/* is access a ordered before the current one of thread tid? */
static bool rc_ordered(const rc_access &a, int tid)
{
    if (a.tid1 == 0 || a.tid1 == (uint32_t)tid + 1 || a.bep != g_rc_bep) return true;
    const int warp = tid / 32;
    return (int)(a.tid1 - 1) / 32 == warp && a.wep != g_rc_wep[(size_t)warp];
}

static void rc_report(const char *what, uintptr_t a, const sh_region &r, int tid, const rc_access &other,
                      const void *pc)
{
    const auto it = g_kernel_name.find(g_cur_kernel);
    Dl_info info;
    const bool named = pc && dladdr(pc, &info) && info.dli_fname;
    fprintf(stderr,
            "cuda emu: shared-memory race (%s) in %s, block (%u,%u,%u): thread %d (warp %d) at byte %zu of %s "
            "shared memory, last %s by thread %d (warp %d) with no barrier between",
            what, it != g_kernel_name.end() ? it->second.c_str() : "a kernel", blockIdx.x, blockIdx.y, blockIdx.z, tid,
            tid / 32, (size_t)(a - r.base), r.dyn ? "dynamic" : "static", what[0] == 'R' ? "written" : "read",
            (int)other.tid1 - 1, ((int)other.tid1 - 1) / 32);
    if (named)
        fprintf(stderr, " (the instruction: addr2line -f -C -i -e %s 0x%lx)", info.dli_fname,
                (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase - 1));
    fprintf(stderr, "\n");
    abort();
}

/* thread tid reads (write 0) or writes [a, a + size) of shared memory region r */
static void rc_access_range(uintptr_t a, size_t size, int write, int tid, const void *pc, const sh_region &r)
{
    std::vector<rc_word> &sh = r.dyn ? g_rc_dyn : g_rc_static;
    const uintptr_t base = r.base;
    const rc_access now = {(uint32_t)tid + 1, g_rc_bep, g_rc_wep[(size_t)(tid / 32)]};
    for (uintptr_t w = (a - base) / 4; w <= (a - base + size - 1) / 4 && w < sh.size(); w++) {
        rc_word &e = sh[w];
        if (write) {
            if (!rc_ordered(e.r, tid)) rc_report("WAR", base + 4 * w, r, tid, e.r, pc);
            e.w = now;
            e.r = rc_access();
        } else {
            if (!rc_ordered(e.w, tid)) rc_report("RAW", base + 4 * w, r, tid, e.w, pc);
            e.r = now;
        }
    }
}

/* an ldmatrix's rows, read by the lanes that gave them (its warp's collective,
 * before the meeting it is) */
static void rc_ldmatrix(const unsigned char *const row[32])
{
    if (g_race_on <= 0 || !g_sh_running) return;
    const int t0 = g_f[(size_t)g_cur].warp * 32;
    for (int l = 0; l < 32; l++) {
        sh_region r;
        if (sh_region_of((uintptr_t)row[l], &r)) rc_access_range((uintptr_t)row[l], 16, 0, t0 + l, NULL, r);
    }
}

/* an access of the current thread into its warp's requests (sh_flush counts them: banks
 * for the shared kinds, sectors for GL_*) */
static void sh_bank_note(const void *p, size_t size, int kind, const void *pc)
{
    const uintptr_t a = (uintptr_t)p;
    const fiber &f = g_f[(size_t)g_cur];
    sh_warp &sw = g_sh[(size_t)f.warp];
    for (size_t off = 0; off < size; off += 16) {   /* a range (a struct copy): 16-byte pieces, in order */
        /* user addresses: 47 bits; bit 63: global (a helper's pc may see both spaces) */
        const uintptr_t key = (uintptr_t)pc ^ (uintptr_t)(off / 16) << 48 ^ (uintptr_t)(kind >= GL_LD) << 63;
        const size_t slot = (key ^ key >> 8) % SH_CACHE;
        if (sw.cache_key[slot] != key) {
            sw.cache_key[slot] = key;
            sw.cache_site[slot] = &sw.sites[key];
        }
        sh_site &s = *sw.cache_site[slot];
        if (!s.dirty) {
            s.dirty = 1;
            s.size = (int)std::min(size - off, (size_t)16);
            s.kind = kind;
            sw.dirty.push_back(&s);
        }
        const unsigned k = s.n[f.lane]++;
        if (k == s.rows.size()) s.rows.emplace_back();   /* a lane's count grows by one: k <= size */
        s.rows[k].addr[f.lane] = (uint32_t)(a + off);
        s.rows[k].mask |= 1u << f.lane;
    }
}

/* a global access the sector count takes: not a thread's stack (its locals and
 * by-value arguments: registers on a device) */
static bool gl_counted(const void *p) { return (uintptr_t)p - (uintptr_t)g_stacks.data() >= g_stacks.size(); }

/* MT_EMU_FOOTPRINT=FILE: each launch's footprint in global memory, one line a
 * launch in launch order, "NAME READ_BYTES WRITE_BYTES": the distinct 32-byte
 * sectors its threads read (plain loads and cp.async's sources) and wrote
 * (plain stores), times 32, on the same instrumented accesses as the sector
 * count (outside shared memory and the threads' stacks), broadcasts
 * included. A launch moves at least that between the SMs and the L2, and
 * that much through DRAM when its data is not in the L2 already: the traffic
 * docs/plan.md prices a memory-bound op at (tests/cuda/footprint_check.py
 * puts the two side by side). NAME as the launch log writes it (no spaces or
 * parentheses). Sectors a thread reads again, and re-reads through the L1,
 * count once: this is not the L1's traffic (MT_EMU_COALESCE is). */
static int g_foot_on = -1;
static FILE *g_foot_f;
static std::unordered_set<uint64_t> g_foot_sec[2];   /* [0] read, [1] written: sector numbers */
static uint64_t g_foot_last[2] = {~0ull, ~0ull};     /* the last sector noted (the common repeat) */

static int foot_on(void)
{
    if (g_foot_on < 0) {
        const char *path = getenv("MT_EMU_FOOTPRINT");
        g_foot_f = path && *path ? fopen(path, "w") : NULL;
        g_foot_on = g_foot_f != NULL;
        if (g_foot_f) setvbuf(g_foot_f, NULL, _IOFBF, 1 << 16);
    }
    return g_foot_on;
}

static void foot_note(const void *p, size_t size, int write)
{
    const uint64_t a = (uint64_t)(uintptr_t)p;
    for (uint64_t sec = a / 32; sec <= (a + size - 1) / 32; sec++) {
        if (sec == g_foot_last[write]) continue;
        g_foot_last[write] = sec;
        g_foot_sec[write].insert(sec);
    }
}

/* the launch of kern ended: its line, and the sets cleared for the next */
static void foot_flush(const void *kern)
{
    auto it = g_kernel_name.find(kern);
    char word[160];
    size_t n = 0;
    for (const char *c = it != g_kernel_name.end() ? it->second.c_str() : "?"; *c && n + 1 < sizeof word; c++)
        if (*c != ' ' && *c != '(' && *c != ')') word[n++] = *c;
    word[n] = 0;
    fprintf(g_foot_f, "%s %llu %llu\n", word, 32ull * (unsigned long long)g_foot_sec[0].size(),
            32ull * (unsigned long long)g_foot_sec[1].size());
    fflush(g_foot_f);
    for (int k = 0; k < 2; k++) g_foot_sec[k].clear(), g_foot_last[k] = ~0ull;
}

/* an instrumented access (the __tsan_* calls below): the race check and the
 * bank count; outside shared memory and the threads' stacks, the sector count
 * and the footprint */
static void sh_note(const void *p, size_t size, int kind, const void *pc)
{
    sh_region r;
    if (!g_sh_running) return;
    if (!sh_region_of((uintptr_t)p, &r)) {
        if (!gl_counted(p)) return;
        if (g_coal_on > 0) sh_bank_note(p, size, kind == BANK_ST ? GL_ST : GL_LD, pc);
        if (g_foot_on > 0) foot_note(p, size, kind == BANK_ST);
        return;
    }
    if (g_race_on > 0) rc_access_range((uintptr_t)p, size, kind == BANK_ST, g_cur, pc, r);
    if (g_banks_on > 0) sh_bank_note(p, size, kind, pc);
}

static void release_block_if_ready(void)
{
    if (g_block_arrived > 0 && g_block_arrived == g_live) {
        if (g_banks_on > 0) sh_flush_all();
        g_rc_bep++;
        for (auto &f : g_f)
            if (f.state == WAIT_BLOCK) make_runnable((size_t)(&f - g_f.data()));
        g_block_arrived = 0;
    }
}

/* the fibers of warp w: [w * 32, min(w * 32 + 32, block size)) */
static size_t warp_end(int w) { return (size_t)w * 32 + 32 < g_f.size() ? (size_t)w * 32 + 32 : g_f.size(); }

static void release_warp_if_ready(int w)
{
    if (g_warp_arrived[w] > 0 && g_warp_arrived[w] == g_warp_live[w]) {
        if (g_banks_on > 0) sh_flush(w);
        if (g_race_on > 0) g_rc_wep[(size_t)w]++;
        for (size_t t = (size_t)w * 32, e = warp_end(w); t < e; t++)
            if (g_f[t].state == WAIT_WARP) make_runnable(t);
        g_warp_arrived[w] = 0;
    }
}

/* Every live thread of the group must wait at the same call site: a barrier
 * or full-mask shuffle reached from different places (divergent code) is
 * undefined on the GPU even where it happens to work. */
static void check_sites(int warp, const char *what)
{
    void *site = NULL;
    const size_t b = warp >= 0 ? (size_t)warp * 32 : 0, e = warp >= 0 ? warp_end(warp) : g_f.size();
    for (size_t t = b; t < e; t++) {
        const fiber &f = g_f[t];
        if (f.state == DONE) continue;
        if (!site) site = f.site;
        if (f.site != site) {
            fprintf(stderr, "cuda emu: divergent %s in block (%u,%u,%u): threads wait at different call sites\n",
                    what, blockIdx.x, blockIdx.y, blockIdx.z);
            abort();
        }
    }
}

__attribute__((noinline)) void __syncthreads(void)
{
    g_f[g_cur].site = __builtin_return_address(0);
    if (g_block_arrived + 1 == g_live) check_sites(-1, "__syncthreads");
    g_f[g_cur].state = WAIT_BLOCK;
    g_block_arrived++;
    release_block_if_ready();
    yield_to_sched();
}

int mt_emu_lane(void) { return g_f[g_cur].lane; }

__attribute__((noinline)) void mt_emu_warp_exchange(const void *mine, void *out, int src_lane, size_t size)
{
    fiber &f = g_f[g_cur];
    f.site = __builtin_return_address(0);
    int full = (int)(g_f.size() - (size_t)f.warp * 32 < 32 ? g_f.size() - (size_t)f.warp * 32 : 32);
    if (g_warp_live[f.warp] != full) {
        fprintf(stderr, "cuda emu: full-mask warp shuffle after some lanes of the warp returned\n");
        abort();
    }
    if (g_warp_arrived[f.warp] + 1 == g_warp_live[f.warp]) check_sites(f.warp, "warp shuffle");
    unsigned phase = f.nexch++ & 1u;
    unsigned char *base = &g_slots[((size_t)f.warp * 2 + phase) * 32 * 8];
    memcpy(base + (size_t)f.lane * 8, mine, size);
    f.state = WAIT_WARP;
    g_warp_arrived[f.warp]++;
    release_warp_if_ready(f.warp);
    yield_to_sched();
    if (src_lane >= 32 || (size_t)f.warp * 32 + (size_t)src_lane >= g_f.size()) {
        fprintf(stderr, "cuda emu: shuffle from lane %d outside the block\n", src_lane);
        abort();
    }
    memcpy(out, base + (size_t)src_lane * 8, size);
}

/* A warp-collective instruction (mma_ptx.h: mma.sync, ldmatrix): every
 * live lane of the warp (all 32, as the full-mask instruction needs) puts
 * `size` bytes in its slot; the LAST lane to arrive runs fn over the 32
 * slots (in place: fn leaves each lane's result in its slot) while no lane
 * has gone on, so fn sees memory as it is at the instruction, then every
 * lane takes its slot back (out_size bytes). The phase is the lane's exchange count, shared
 * with shuffles: a lane cannot reach collective n+2 before every lane has
 * left collective n+1, so slot reuse is safe (as for shuffles). */
__attribute__((noinline)) void mt_emu_warp_collective(const void *mine, size_t size, void *out, size_t out_size,
                                                      void (*fn)(unsigned char *slots, size_t stride))
{
    fiber &f = g_f[g_cur];
    f.site = __builtin_return_address(0);
    int full = (int)(g_f.size() - (size_t)f.warp * 32 < 32 ? g_f.size() - (size_t)f.warp * 32 : 32);
    if (full != 32 || g_warp_live[f.warp] != 32 || size > MT_EMU_COLL_BYTES ||
        out_size > MT_EMU_COLL_BYTES) {
        fprintf(stderr, "cuda emu: warp-collective mma/ldmatrix needs all 32 lanes of the warp live (%d of %d)\n",
                g_warp_live[f.warp], full);
        abort();
    }
    const bool last = g_warp_arrived[f.warp] + 1 == g_warp_live[f.warp];
    if (last) check_sites(f.warp, "warp-collective mma/ldmatrix");
    unsigned phase = f.nexch++ & 1u;
    unsigned char *base = &g_cslots[((size_t)f.warp * 2 + phase) * 32 * MT_EMU_COLL_BYTES];
    memcpy(base + (size_t)f.lane * MT_EMU_COLL_BYTES, mine, size);
    if (last) fn(base, MT_EMU_COLL_BYTES);
    f.state = WAIT_WARP;
    g_warp_arrived[f.warp]++;
    release_warp_if_ready(f.warp);
    yield_to_sched();
    memcpy(out, base + (size_t)f.lane * MT_EMU_COLL_BYTES, out_size);
}

void *mt_emu_dyn_smem(void) { return g_dyn.data(); }

/* ---- the warpgroup collective and wgmma (mma_ptx.h) ---- */
#define MT_EMU_WG_BYTES 16   /* a wait's slot (wg_wait_slot) */

static void release_wg_if_ready(int wg)
{
    if (g_wg_arrived[wg] > 0 && g_wg_arrived[wg] == 128) {
        for (int w = 4 * wg; g_banks_on > 0 && w < 4 * wg + 4; w++) sh_flush(w);
        for (size_t t = (size_t)wg * 128; t < (size_t)wg * 128 + 128; t++)
            if (g_f[t].state == WAIT_WG) make_runnable(t);
        g_wg_arrived[wg] = 0;
    }
}

/* As mt_emu_warp_collective over the 128 threads of a warpgroup (warps 4 w ..
 * 4 w + 3, all of them live and at the same call site): the last to arrive
 * runs fn over the 128 slots, then each takes its slot back. */
__attribute__((noinline)) static void mt_emu_wg_collective(const void *mine, size_t size, void *out, size_t out_size,
                                 void (*fn)(unsigned char *slots, size_t stride))
{
    fiber &f = g_f[g_cur];
    f.site = __builtin_return_address(0);
    const int wg = f.warp / 4;
    bool full = (size_t)wg * 128 + 128 <= g_f.size() && size <= MT_EMU_WG_BYTES && out_size <= MT_EMU_WG_BYTES;
    for (int w = 4 * wg; full && w < 4 * wg + 4; w++) full = g_warp_live[w] == 32;
    if (!full) {
        fprintf(stderr, "cuda emu: wgmma needs all 128 threads of its warpgroup (warps %d-%d) live\n", 4 * wg,
                4 * wg + 3);
        abort();
    }
    const bool last = g_wg_arrived[wg] + 1 == 128;
    if (last)
        for (size_t t = (size_t)wg * 128; t < (size_t)wg * 128 + 128; t++)
            if (g_f[t].site != f.site) {
                fprintf(stderr, "cuda emu: divergent wgmma in block (%u,%u,%u): threads of warpgroup %d at "
                                "different call sites\n", blockIdx.x, blockIdx.y, blockIdx.z, wg);
                abort();
            }
    unsigned phase = f.nwg++ & 1u;
    unsigned char *base = &g_wgslots[((size_t)wg * 2 + phase) * 128 * MT_EMU_WG_BYTES];
    const size_t me = (size_t)g_cur - (size_t)wg * 128;
    memcpy(base + me * MT_EMU_WG_BYTES, mine, size);
    if (last) fn(base, MT_EMU_WG_BYTES);
    f.state = WAIT_WG;
    g_wg_arrived[wg]++;
    release_wg_if_ready(wg);
    yield_to_sched();
    memcpy(out, base + me * MT_EMU_WG_BYTES, out_size);
}

uint32_t mt_emu_smem_offset(const void *p)
{
    const unsigned char *b = g_dyn.data(), *q = (const unsigned char *)p;
    if (!b || q < b || q >= b + g_dyn.size()) {
        fprintf(stderr, "cuda emu: shared-window address of %p: not in the block's dynamic shared memory\n", p);
        abort();
    }
    return (uint32_t)(q - b);
}

/* the bf16 element (row, k) of a 128-byte-swizzled tile (wgmma.cuh), row being m or n:
 * K-major (mn 0): 8-row atoms SBO apart, a row's 64 k in its 128-byte line;
 * MN-major (mn 1, the instruction's imm-trans): a k's 64 rows in one 128-byte line,
 * 8 k a 1024-byte atom, 8-k groups SBO apart, 64-row blocks LBO apart (PTX ISA
 * "Shared Memory Matrix Layout"; CUTLASS's canonical GMMA layouts). Either way the
 * swizzle is of the address: bits 4-6 ^= bits 7-9 */
static MT_EMU_UNCHECKED float wg_elem(uint64_t desc, int mn, int row, int k)
{
    const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
                   sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    uint32_t a = mn ? start + (uint32_t)(row / 64) * lbo + (uint32_t)(row % 64) * 2u + (uint32_t)(k / 8) * sbo +
                          (uint32_t)(k % 8) * 128u
                    : start + (uint32_t)(row / 8) * sbo + (uint32_t)(row % 8) * 128u + (uint32_t)k * 2u;
    a ^= ((a >> 7) & 7u) << 4;
    if ((size_t)a + 2 > g_dyn.size()) {
        fprintf(stderr, "cuda emu: wgmma tile element (%d, %d) at shared offset %u: past the %zu bytes of dynamic "
                        "shared memory\n", row, k, a, g_dyn.size());
        abort();
    }
    uint16_t h;
    memcpy(&h, g_dyn.data() + a, 2);
    return __uint_as_float((uint32_t)h << 16);
}

/* K-major: wgmma.cuh's mt_wgmma_desc_sw128 (stride 1024, the start 128-byte aligned
 * but for the k slice's 32-byte steps); MN-major: mt_wgmma_desc_sw128_mn (the start
 * at an atom, 1024-byte aligned; LBO and SBO whole atoms) */
static void wg_check_desc(uint64_t d, int mn, const char *which)
{
    const unsigned mode = (unsigned)(d >> 62), base_off = (unsigned)((d >> 49) & 7);
    const unsigned start = (unsigned)((d & 0x3FFF) << 4), in_atom = start & 1023u;
    const unsigned lbo = (unsigned)(((d >> 16) & 0x3FFF) << 4), sbo = (unsigned)(((d >> 32) & 0x3FFF) << 4);
    const int ok = mode == 1 && base_off == 0 &&
                   (mn ? in_atom == 0 && lbo && lbo % 1024 == 0 && sbo && sbo % 1024 == 0
                       : in_atom % 32 == 0 && in_atom < 128 && sbo == 1024);
    if (!ok) {
        fprintf(stderr, "cuda emu: wgmma %s descriptor %#llx (%s-major): only wgmma.cuh's 128-byte swizzles are "
                        "emulated (mode 1, base offset 0; K-major: stride 1024, start 128-byte aligned but for the "
                        "k slice's 32-byte steps; MN-major: start, leading and stride offsets whole 1024-byte atoms)\n",
                which, (unsigned long long)d, mn ? "MN" : "K");
        abort();
    }
}

/* a product's shared-memory operands read through their descriptors: A's 64 x 16
 * unless da is 0 (A from registers), B's n x 16; tr bit 0: A MN-major, bit 1: B */
static MT_EMU_UNCHECKED void wg_read_tiles(uint64_t da, uint64_t db, int tr, int n, float (*A)[16], float (*B)[16])
{
    if (da)
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < 16; k++) A[m][k] = wg_elem(da, tr & 1, m, k);
    for (int c = 0; c < n; c++)
        for (int k = 0; k < 16; k++) B[c][k] = wg_elem(db, (tr >> 1) & 1, c, k);
}

/* FNV-1a of the bf16 bits of what wg_read_tiles read (A's rows: 64, or 0 from registers) */
static uint64_t wg_tiles_hash(const float (*A)[16], int a_rows, const float (*B)[16], int n)
{
    uint64_t h = 1469598103934665603ull;
    const float *src[2] = {&A[0][0], &B[0][0]};
    const int cnt[2] = {16 * a_rows, 16 * n};
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < cnt[w]; i++) {
            uint32_t u;
            memcpy(&u, &src[w][i], 4);
            h = (h ^ (u >> 16)) * 1099511628211ull;
        }
    return h;
}

/* A thread issues: its product is recorded, its d reads NaN until the wait. The
 * warpgroup's first thread to issue it also records its tiles' bits: the device
 * reads them at some time between the issue and the wait, so they must not change
 * in between (wg_wait_fn compares; a write by another warpgroup with no barrier
 * between, or a stage refilled early, changes them: a race on a GPU). */
static void wg_issue(float *d, int n, uint64_t da, const uint32_t *a, uint64_t db, int acc, int tr)
{
    if (n != 64 && n != 128 && n != 256) {
        fprintf(stderr, "cuda emu: wgmma n%d: not emulated (64, 128, 256)\n", n);
        abort();
    }
    std::vector<wg_pending> &pend = g_wgp[(size_t)g_cur];
    wg_pending p;
    p.d = d, p.da = da, p.db = db, p.n = n, p.acc = acc, p.rs = a != NULL, p.chain = -1, p.done = 0, p.tr = tr;
    p.hashed = 1;
    /* the first issuer: no other thread of the warpgroup has more products in flight
     * (counted, not the pending lists' sizes: a thread not yet back from the last wait
     * still holds that wait's computed products until it returns) */
    const size_t t0 = (size_t)(g_f[g_cur].warp / 4) * 128;
    const unsigned mine = g_f[g_cur].wg_inflight++;
    for (size_t l = t0; l < t0 + 128 && l < g_f.size() && p.hashed; l++)
        if (l != (size_t)g_cur && g_f[l].wg_inflight > mine) p.hashed = 0;
    if (p.hashed) {
        static float A[64][16], B[256][16];
        if (a == NULL) wg_check_desc(da, tr & 1, "A");
        wg_check_desc(db, (tr >> 1) & 1, "B");
        wg_read_tiles(a ? 0 : da, db, tr, n, A, B);
        p.tiles_hash = wg_tiles_hash(A, a ? 0 : 64, B, n);
    }
    if (a) memcpy(p.a, a, sizeof p.a);
    p.group = g_f[g_cur].wg_committed;
    for (size_t i = pend.size(); i-- > 0;)
        if (pend[i].d == d) { p.chain = (int)i; break; }
    if (p.chain < 0) memcpy(p.c, d, (size_t)(n / 2) * sizeof(float));
    pend.push_back(p);
    memset(d, 0xff, (size_t)(n / 2) * sizeof(float));   /* NaN until the wait */
}

void mt_emu_wgmma_ss(float *d, int n, uint64_t da, uint64_t db, int acc, int ta, int tb)
{
    wg_issue(d, n, da, NULL, db, acc, (ta ? 1 : 0) | (tb ? 2 : 0));
}
void mt_emu_wgmma_rs(float *d, int n, const uint32_t a[4], uint64_t db, int acc, int tb)
{
    wg_issue(d, n, 0, a, db, acc, tb ? 2 : 0);
}

void mt_emu_wgmma_commit(void) { g_f[g_cur].wg_committed++; }

struct wg_wait_slot { int wg, n; unsigned committed; };

/* The last thread of the warpgroup at a wait: every product of a group the
 * wait covers, for all 128 threads, in issue order, reading the tiles as
 * shared memory is NOW (the device reads them some time before the wait
 * returns: a stage refilled before the wait is read refilled, as it may be
 * there). Each product's operands must be the warpgroup's (same index, same
 * descriptors, n, acc on every thread). */
static MT_EMU_UNCHECKED void wg_wait_fn(unsigned char *slots, size_t stride)
{
    wg_wait_slot w0;
    memcpy(&w0, slots, sizeof w0);
    const size_t t0 = (size_t)w0.wg * 128;
    for (int l = 1; l < 128; l++) {
        wg_wait_slot w;
        memcpy(&w, slots + (size_t)l * stride, sizeof w);
        if (w.n != w0.n || w.committed != w0.committed || g_wgp[t0 + l].size() != g_wgp[t0].size()) {
            fprintf(stderr, "cuda emu: wgmma.wait_group: threads of warpgroup %d differ (thread %d: wait %d, %u "
                            "groups committed, %zu products pending; thread 0: %d, %u, %zu)\n", w0.wg, l, w.n,
                    w.committed, g_wgp[t0 + l].size(), w0.n, w0.committed, g_wgp[t0].size());
            abort();
        }
    }
    static float A[64][16], B[256][16];
    std::vector<wg_pending> &v0 = g_wgp[t0];
    for (size_t i = 0; i < v0.size(); i++) {
        const wg_pending &p0 = v0[i];
        if (p0.group + (unsigned)w0.n >= w0.committed) break;   /* this group and later stay in flight */
        for (int l = 1; l < 128; l++) {
            const wg_pending &p = g_wgp[t0 + l][i];
            if (p.da != p0.da || p.db != p0.db || p.n != p0.n || p.acc != p0.acc || p.rs != p0.rs ||
                p.tr != p0.tr || p.group != p0.group) {
                fprintf(stderr, "cuda emu: wgmma operands differ across warpgroup %d (thread %d, product %zu)\n",
                        w0.wg, l, i);
                abort();
            }
        }
        if (!p0.rs) wg_check_desc(p0.da, p0.tr & 1, "A");
        wg_check_desc(p0.db, (p0.tr >> 1) & 1, "B");
        const int N = p0.n;
        wg_read_tiles(p0.rs ? 0 : p0.da, p0.db, p0.tr, N, A, B);   /* the tiles as they are now */
        const uint64_t now = wg_tiles_hash(A, p0.rs ? 0 : 64, B, N);
        for (int l = 0; l < 128; l++) {
            const wg_pending &p = g_wgp[t0 + l][i];
            if (p.hashed && p.tiles_hash != now) {
                fprintf(stderr, "cuda emu: block (%u,%u,%u), warpgroup %d: the shared-memory operands of a wgmma "
                                "changed between its issue and its wait (the device reads them in between: a race; "
                                "a write with no barrier before the product, or a tile refilled before its wait)\n",
                        blockIdx.x, blockIdx.y, blockIdx.z, w0.wg);
                abort();
            }
        }
        if (p0.rs) {   /* each warp's 16 rows from its lanes' registers (mma.m16n8k16's A layout) */
            for (int l = 0; l < 128; l++) {
                const uint32_t *a = g_wgp[t0 + l][i].a;
                const int r = 16 * (l / 32) + ((l % 32) >> 2), c = 2 * (l & 3);
                A[r][c] = mt_emu_bf16_lo(a[0]), A[r][c + 1] = mt_emu_bf16_hi(a[0]);
                A[r + 8][c] = mt_emu_bf16_lo(a[1]), A[r + 8][c + 1] = mt_emu_bf16_hi(a[1]);
                A[r][c + 8] = mt_emu_bf16_lo(a[2]), A[r][c + 9] = mt_emu_bf16_hi(a[2]);
                A[r + 8][c + 8] = mt_emu_bf16_lo(a[3]), A[r + 8][c + 9] = mt_emu_bf16_hi(a[3]);
            }
        }
        for (int l = 0; l < 128; l++) {
            std::vector<wg_pending> &v = g_wgp[t0 + l];
            wg_pending &p = v[i];
            const float *c = p.chain >= 0 ? v[(size_t)p.chain].v : p.c;
            const int q = l / 32, g = (l % 32) >> 2, t = l & 3;
            for (int e2 = 0; e2 < N / 2; e2++) {
                const int j = e2 / 4, e = e2 % 4, r = 16 * q + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
                float acc = p.acc ? c[e2] : 0.0f;
                for (int k = 0; k < 16; k++) acc += A[r][k] * B[col][k];
                p.v[e2] = acc;
            }
            p.done = 1;
            g_f[t0 + l].wg_inflight--;
        }
    }
}

/* wait_group n: a warpgroup collective (as the device's .sync.aligned); every
 * product of a committed group but the n most recent is computed and lands in
 * its d, unless a later product on that d is still in flight (d stays NaN) */
void mt_emu_wgmma_wait(int n)
{
    wg_wait_slot w;
    w.wg = g_f[g_cur].warp / 4, w.n = n, w.committed = g_f[g_cur].wg_committed;
    mt_emu_wg_collective(&w, sizeof w, &w, 0, wg_wait_fn);
    std::vector<wg_pending> &v = g_wgp[(size_t)g_cur];
    size_t nd = 0;   /* the computed products: a prefix (groups in issue order) */
    while (nd < v.size() && v[nd].done) nd++;
    for (size_t i = 0; i < nd; i++) {
        int newer = 0;
        for (size_t k = i + 1; k < v.size() && !newer; k++) newer = v[k].d == v[i].d;
        if (!newer) memcpy(v[i].d, v[i].v, (size_t)(v[i].n / 2) * sizeof(float));
    }
    for (size_t k = nd; k < v.size(); k++) {   /* products left: their C from a landed one, copied */
        if (v[k].chain < 0) continue;
        if ((size_t)v[k].chain < nd) {
            memcpy(v[k].c, v[(size_t)v[k].chain].v, sizeof v[k].c);
            v[k].chain = -1;
        } else {
            v[k].chain -= (int)nd;
        }
    }
    v.erase(v.begin(), v.begin() + (std::ptrdiff_t)nd);
}

void mt_emu_cp_async16(void *dst, const void *src, int nbytes)
{
    cp_pending p;
    p.dst = (unsigned char *)dst;
    if (nbytes) memcpy(p.data, src, 16);
    else memset(p.data, 0, 16);
    p.group = g_f[g_cur].cp_committed;
    p.pc = __builtin_return_address(0);
    if (g_banks_on > 0 && g_sh_running) sh_bank_note(dst, 16, BANK_CPASYNC, p.pc);   /* its shared-memory side */
    if (g_coal_on > 0 && g_sh_running && nbytes) sh_bank_note(src, (size_t)nbytes, GL_CPASYNC, p.pc);   /* global */
    if (g_foot_on > 0 && g_sh_running && nbytes) foot_note(src, (size_t)nbytes, 0);
    memset(dst, 0xff, 16);   /* undefined until the wait: NaN */
    g_cp[(size_t)g_cur].push_back(p);
}

void mt_emu_cp_async_commit(void) { g_f[g_cur].cp_committed++; }

/* wait_group n: every copy of a committed group but the n most recent lands
 * (in issue order); later and uncommitted ones stay in flight */
void mt_emu_cp_async_wait(int n)
{
    const unsigned done = g_f[g_cur].cp_committed;
    std::vector<cp_pending> &v = g_cp[(size_t)g_cur];
    size_t keep = 0;
    for (size_t i = 0; i < v.size(); i++) {
        if (v[i].group + (unsigned)n < done) {
            sh_region r;
            if (g_race_on > 0 && g_sh_running && sh_region_of((uintptr_t)v[i].dst, &r))
                rc_access_range((uintptr_t)v[i].dst, 16, 1, g_cur, v[i].pc, r);
            memcpy(v[i].dst, v[i].data, 16);
        } else v[keep++] = v[i];
    }
    v.resize(keep);
}

/* wmma (mma.h). On the device a fragment op is one warp-wide instruction;
 * here every lane runs it, one after the other between switch points (lane
 * 0 first). The first lane to reach its n-th load reads memory and hands
 * the tile to the rest; the last lane to reach its n-th store writes it. So
 * a lane's shared-memory writes reach a wmma load only through a barrier
 * (__syncwarp / __syncthreads) before it, and a wmma store reaches other
 * lanes' reads only through a barrier after it — as on the device, where a
 * missing __syncwarp is a race. Without this a missing barrier would pass:
 * the last lane, which runs after every write, would publish right tiles. */
int mt_emu_wmma_load_first(float *x)
{
    fiber &f = g_f[g_cur];
    const unsigned seq = f.nwload++;
    seq_queue<wmma_tile> &q = g_wmma_loads[f.warp];
    wmma_tile *t = q.find(seq);
    if (!t) return 1;
    memcpy(x, t->x, sizeof t->x);
    q.taken(t);
    return 0;
}
void mt_emu_wmma_load_publish(const float *x)
{
    fiber &f = g_f[g_cur];
    wmma_tile *t = g_wmma_loads[f.warp].add(f.nwload - 1, g_warp_live[f.warp] - 1);
    if (t) memcpy(t->x, x, sizeof t->x);
}
int mt_emu_wmma_store_last(void)
{
    fiber &f = g_f[g_cur];
    const unsigned seq = f.nwstore++;
    auto &m = g_wmma_stores[f.warp];
    if (++m[seq] < g_warp_live[f.warp]) return 0;
    m.erase(seq);
    return 1;
}

/* A product is arithmetic on the lane's own fragments, so every lane would
 * compute the same 16 x 16 x 16 tile: 32 times the work, three quarters of
 * the emulated wmma attention's time. The first lane to reach its n-th
 * product computes it and keeps operands and result; a later lane whose
 * operands are bitwise the same takes the result (the same bits it would
 * compute: the arithmetic is deterministic), one whose operands differ (a
 * kernel that made its lanes' fragments differ) computes its own.
 * Returns 1: d is filled; 0: compute, then mt_emu_wmma_mma_publish;
 * -1: compute, publish nothing. */
int mt_emu_wmma_mma_recall(const float *a, const float *b, const float *c, float *d)
{
    fiber &f = g_f[g_cur];
    const unsigned seq = f.nwmma++;
    seq_queue<wmma_product> &q = g_wmma_mmas[f.warp];
    wmma_product *p = q.find(seq);
    if (!p) return 0;
    const int same = !memcmp(p->a, a, sizeof p->a) && !memcmp(p->b, b, sizeof p->b) && !memcmp(p->c, c, sizeof p->c);
    if (same) memcpy(d, p->d, sizeof p->d);
    q.taken(p);
    return same ? 1 : -1;
}
void mt_emu_wmma_mma_publish(const float *a, const float *b, const float *c, const float *d)
{
    fiber &f = g_f[g_cur];
    wmma_product *p = g_wmma_mmas[f.warp].add(f.nwmma - 1, g_warp_live[f.warp] - 1);
    if (!p) return;
    memcpy(p->a, a, sizeof p->a);
    memcpy(p->b, b, sizeof p->b);
    memcpy(p->c, c, sizeof p->c);
    memcpy(p->d, d, sizeof p->d);
}

/* a warp barrier: every live lane of the warp arrives before any goes on
 * (and, as on the device, orders their shared-memory accesses) */
void __syncwarp(unsigned mask)
{
    (void)mask;
    int dummy = 0, out;
    mt_emu_warp_exchange(&dummy, &out, mt_emu_lane(), sizeof dummy);
}

static void fiber_entry(void)
{
    (*g_body)();
    fiber &f = g_f[g_cur];
    f.state = DONE;
    g_live--;
    g_warp_live[f.warp]--;
    release_block_if_ready();
    release_warp_if_ready(f.warp);
    yield_to_sched();  /* never resumed */
    abort();
}

/* stack top T (16-aligned): [T-72] mxcsr, fcw | r15 r14 r13 r12 rbx rbp | [T-16] fiber_entry | [T-8] 0 */
static void *fiber_stack_init(char *stack, size_t bytes)
{
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    uint64_t *w = (uint64_t *)top;
    w[-1] = 0;                            /* fake return address of fiber_entry */
    w[-2] = (uint64_t)(uintptr_t)&fiber_entry;
    for (int i = 3; i <= 8; i++) w[-i] = 0; /* rbp rbx r12 r13 r14 r15 */
    uint32_t *ctl = (uint32_t *)&w[-9];
    ctl[0] = 0x1f80;                      /* MXCSR default */
    ctl[1] = 0x037f;                      /* x87 control word default */
    return &w[-9];
}

/* GCC's -fsanitize=thread calls, for the bank and sector counts and the race check (sh_note;
 * every other check of that sanitizer is not wanted here, its runtime not linked) */
#define MT_EMU_TSAN_SIZED(n)                                                                                  \
    extern "C" void __tsan_read##n(void *p) { sh_note(p, n, BANK_LD, __builtin_return_address(0)); }          \
    extern "C" void __tsan_write##n(void *p) { sh_note(p, n, BANK_ST, __builtin_return_address(0)); }         \
    extern "C" void __tsan_unaligned_read##n(void *p) { sh_note(p, n, BANK_LD, __builtin_return_address(0)); } \
    extern "C" void __tsan_unaligned_write##n(void *p) { sh_note(p, n, BANK_ST, __builtin_return_address(0)); }
MT_EMU_TSAN_SIZED(1)
MT_EMU_TSAN_SIZED(2)
MT_EMU_TSAN_SIZED(4)
MT_EMU_TSAN_SIZED(8)
MT_EMU_TSAN_SIZED(16)
#undef MT_EMU_TSAN_SIZED
extern "C" void __tsan_read_range(void *p, unsigned long n) { sh_note(p, n, BANK_LD, __builtin_return_address(0)); }
extern "C" void __tsan_write_range(void *p, unsigned long n) { sh_note(p, n, BANK_ST, __builtin_return_address(0)); }
extern "C" void __tsan_init(void) {}

/* MT_EMU_FAIL_KERNEL=NAME: every launch of the kernel named so (as the backend's
 * launcher names it, mt_emu_name_kernel) fails, cudaErrorLaunchFailure, and runs
 * nothing: a device fault, for the tests of what a caller reports (test_cuda_build g) */
static bool launch_fails(const void *kern)
{
    static const char *name = getenv("MT_EMU_FAIL_KERNEL");
    if (!name || !*name) return false;
    auto it = g_kernel_name.find(kern);
    return it != g_kernel_name.end() && it->second == name;
}

void mt_emu_run(const void *kern, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
    if (launch_fails(kern)) {
        fail(cudaErrorLaunchFailure);
        return;
    }
    size_t nt = (size_t)block.x * block.y * block.z;
    if (nt == 0 || nt > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
        block.z > 64) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (smem > 48 * 1024) {
        auto it = g_smem_optin.find(kern);
        if (it == g_smem_optin.end() || (size_t)it->second < smem) {
            fprintf(stderr, "cuda emu: %zu bytes of dynamic shared memory without opt-in\n", smem);
            fail(cudaErrorInvalidValue);
            return;
        }
    }
    dev_scope on;
    g_cur_kernel = kern;
    foot_on();
    int nw = (int)((nt + 31) / 32);
    if (banks_on() && g_sh.size() < (size_t)nw) g_sh.resize((size_t)nw);
    if (race_on()) {   /* shadows grow only: a word's old entries carry older epochs (ordered) */
        if (g_rc_wep.size() < (size_t)nw) g_rc_wep.resize((size_t)nw, 0);
        if (g_rc_dyn.size() < (smem + 3) / 4) g_rc_dyn.resize((smem + 3) / 4);   /* past smem: not checked */
        if (g_rc_static.size() < (g_static_smem_bytes + 3) / 4) g_rc_static.resize((g_static_smem_bytes + 3) / 4);
    }
    g_f.assign(nt, fiber());
    if (g_stacks.size() < nt * STACK_STRIDE) g_stacks.resize(nt * STACK_STRIDE);
    g_warp_live.assign(nw, 0);
    g_warp_arrived.assign(nw, 0);
    g_slots.assign((size_t)nw * 2 * 32 * 8, 0);
    g_cslots.assign((size_t)nw * 2 * 32 * MT_EMU_COLL_BYTES, 0);
    const int nwg = (nw + 3) / 4;
    g_wg_arrived.assign((size_t)nwg, 0);
    const size_t wg_bytes = (size_t)nwg * 2 * 128 * MT_EMU_WG_BYTES;
    if (g_wgslots.size() < wg_bytes) g_wgslots.resize(wg_bytes);
    g_wmma_loads.assign((size_t)nw, {});
    g_wmma_stores.assign((size_t)nw, {});
    g_wmma_mmas.assign((size_t)nw, {});
    if (g_cp.size() < nt) g_cp.resize(nt);   /* cleared per block below; their capacity kept across launches */
    if (g_wgp.size() < nt) g_wgp.resize(nt);
    g_dyn.resize(smem ? smem : 16);
    g_body = &body;
    /* static shared arrays NaN at the launch's start (its first block sees what it did not
     * write as NaN; per block, the fill of every kernel's arrays cost test_ssm 23%) */
    if (g_static_smem_bytes) memset(g_static_smem, 0xff, g_static_smem_bytes);
    gridDim = grid;
    blockDim = block;
    const size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    const int rev = order_reverse();
    for (size_t bi = 0; bi < nblocks; bi++) {
        const size_t b = rev ? nblocks - 1 - bi : bi;
        const unsigned bx = (unsigned)(b % grid.x), by = (unsigned)(b / grid.x % grid.y),
                       bz = (unsigned)(b / ((size_t)grid.x * grid.y));
        blockIdx = dim3(bx, by, bz);
        if (smem) memset(g_dyn.data(), 0xff, g_dyn.size());
        for (size_t t = 0; t < nt; t++) {
            fiber &f = g_f[t];
            f.tid = dim3((unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                         (unsigned)(t / ((size_t)block.x * block.y)));
            f.state = RUNNABLE;
            f.warp = (int)(t / 32);
            f.lane = (int)(t % 32);
            f.nexch = 0;
            f.nwload = f.nwstore = f.nwmma = 0;
            f.cp_committed = 0;
            g_cp[t].clear();   /* a block's copies never waited for: not the next block's */
            f.nwg = f.wg_committed = 0;
            g_wgp[t].clear();
            f.sp = fiber_stack_init(&g_stacks[t * STACK_STRIDE], STACK_BYTES);
        }
        for (int w = 0; w < nw; w++) {
            g_warp_live[w] = (int)(nt - (size_t)w * 32 < 32 ? nt - (size_t)w * 32 : 32);
            g_warp_arrived[w] = 0;
            /* a lane that returned early leaves the ops it never took: not the next block's */
            g_wmma_loads[w] = {};
            g_wmma_stores[w].clear();
            g_wmma_mmas[w] = {};
        }
        g_live = (int)nt;
        g_first_hint = 0;
        g_block_arrived = 0;
        std::fill(g_wg_arrived.begin(), g_wg_arrived.end(), 0);
        g_sh_running = g_banks_on > 0 || g_race_on > 0 || g_foot_on > 0;   /* the access hooks' work (sh_note) */
        g_rc_bep++;
        for (;;) {
            int ran = 0;
            for (size_t p = 0; p < nt; p++) {
                const size_t t = sweep_pos(p);
                if (g_f[t].state != RUNNABLE) continue;
                g_cur = (int)t;
                threadIdx = g_f[t].tid;
                mt_emu_switch(&g_sched_sp, g_f[t].sp);
                ran = 1;
                /* forward: past the fibers it switched to directly (yield_to_sched); reverse
                 * (eager): from the first runnable again (with p++: g_first_hint) */
                p = g_reverse > 0 ? g_first_hint - 1 : sweep_pos((size_t)g_cur);
            }
            if (g_live == 0) break;
            if (!ran) {
                fprintf(stderr, "cuda emu: deadlock in block (%u,%u,%u): %d live threads wait at a "
                                "barrier not all of them reach\n", bx, by, bz, g_live);
                abort();
            }
        }
        g_sh_running = 0;
        if (g_banks_on > 0) sh_flush_all();   /* the requests after the last meeting */
    }
    if (g_foot_on > 0) foot_flush(kern);
}

/* ---------------- cuBLAS ---------------- */
const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) { (void)h; (void)m; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h || (bytes && !is_dev(ws, bytes))) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetVersion(cublasHandle_t h, int *v) { (void)h; *v = 130000; return CUBLAS_STATUS_SUCCESS; }

/* column-major: C (m,n) = alpha op(A) op(B) + beta C; op(A) (m,k), op(B) (k,n) */
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    {   /* captured: alpha and beta are read now (host pointer mode) */
        const float al = *alpha, be = *beta;
        if (mt_emu_capture_record([=]() { cublasSgemm(h, ta, tb, m, n, k, &al, A, lda, B, ldb, &be, C, ldc); }))
            return CUBLAS_STATUS_SUCCESS;
    }
    dev_scope on;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int l = 0; l < k; l++) {
                float a = ta == CUBLAS_OP_N ? A[(size_t)l * lda + i] : A[(size_t)i * lda + l];
                float b = tb == CUBLAS_OP_N ? B[(size_t)j * ldb + l] : B[(size_t)l * ldb + j];
                acc += a * b;
            }
            float *c = &C[(size_t)j * ldc + i];
            *c = *beta == 0.0f ? *alpha * acc : *alpha * acc + *beta * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* Grouped: each group through the emulated sgemm above, in group order. The
 * pointer arrays are read on the device by the real library, so they must be
 * device memory (a host array is an error here, a crash there). */
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void *alpha_array,
                                          const void *const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void *beta_array, void *const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
    size_t total = 0;
    for (int g = 0; g < group_count; g++) {
        if (group_size[g] < 0) return CUBLAS_STATUS_INVALID_VALUE;
        total += (size_t)group_size[g];
    }
    if (total == 0) return CUBLAS_STATUS_SUCCESS;
    const size_t pb = total * sizeof(void *);
    if (!is_dev(Aarray, pb) || !is_dev(Barray, pb) || !is_dev((const void *)Carray, pb)) {
        fprintf(stderr, "cuda emu: cublasGemmGroupedBatchedEx: the pointer arrays must be device memory\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (g_cap_stream) {  /* captured: the host arrays are read now, the device pointer arrays at replay */
        std::vector<cublasOperation_t> tav(transa_array, transa_array + group_count),
            tbv(transb_array, transb_array + group_count);
        std::vector<int> mv(m_array, m_array + group_count), nv(n_array, n_array + group_count),
            kv(k_array, k_array + group_count), lav(lda_array, lda_array + group_count),
            lbv(ldb_array, ldb_array + group_count), lcv(ldc_array, ldc_array + group_count),
            gsv(group_size, group_size + group_count);
        std::vector<float> alv((const float *)alpha_array, (const float *)alpha_array + group_count),
            bev((const float *)beta_array, (const float *)beta_array + group_count);
        mt_emu_capture_record([=]() {
            cublasGemmGroupedBatchedEx(h, tav.data(), tbv.data(), mv.data(), nv.data(), kv.data(), alv.data(), Aarray,
                                       Atype, lav.data(), Barray, Btype, lbv.data(), bev.data(), Carray, Ctype,
                                       lcv.data(), group_count, gsv.data(), computeType);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    std::vector<const float *> a(total), b(total);
    std::vector<float *> c(total);
    {
        dev_scope on;
        for (size_t i = 0; i < total; i++) {
            a[i] = (const float *)Aarray[i];
            b[i] = (const float *)Barray[i];
            c[i] = (float *)Carray[i];
        }
    }
    const float *al = (const float *)alpha_array, *be = (const float *)beta_array;
    size_t i = 0;
    for (int g = 0; g < group_count; g++)
        for (int j = 0; j < group_size[g]; j++, i++) {
            cublasStatus_t st = cublasSgemm(h, transa_array[g], transb_array[g], m_array[g], n_array[g], k_array[g],
                                            &al[g], a[i], lda_array[g], b[i], ldb_array[g], &be[g], c[i],
                                            ldc_array[g]);
            if (st != CUBLAS_STATUS_SUCCESS) return st;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------- cuBLASLt ---------------- */
struct mt_emu_lt { int magic; };
struct mt_emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t      scale;
    int32_t             ta, tb;  /* cublasOperation_t */
};
struct mt_emu_lt_layout {
    cudaDataType_t type;
    uint64_t       rows, cols;
    int64_t        ld;
    int32_t        batch;    /* matrices (1 unless set)            */
    int64_t        stride;   /* elements from one to the next       */
};
struct mt_emu_lt_pref {
    uint64_t max_ws;
    uint32_t align[4];           /* A, B, C, D; library default 256 */
};
/* what the emulated heuristic stores in cublasLtMatmulAlgo_t::data */
enum { ALGO_MAGIC = 0, ALGO_WS = 1, ALGO_ALIGN = 2 /* 2..5 */ };
#define LT_ALGO_MAGIC 0x4c54414c474f3031ull  /* "LTALGO01" */

const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }
size_t cublasLtGetVersion(void) { return 130000; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new mt_emu_lt{1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    *d = new mt_emu_lt_desc{compute, scale, (int32_t)CUBLAS_OP_N, (int32_t)CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    if (!d || !buf || size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t v;
    memcpy(&v, buf, sizeof v);
    if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->ta = v;
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) d->tb = v;
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    /* the library refuses ld < rows for a column-major layout */
    if (!l || ld < 1 || (uint64_t)ld < rows) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new mt_emu_lt_layout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size)
{
    if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, size);
        if (v < 1) return CUBLAS_STATUS_INVALID_VALUE;
        l->batch = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
        if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->stride, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new mt_emu_lt_pref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size)
{
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    int i = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
    if (i < 0 || i > 3 || size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->align[i], buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

/* the problem the descriptors describe: D (m, n) = op(A) (m, k) op(B) (k, n) */
static cublasStatus_t lt_shape(const mt_emu_lt_desc *d, const mt_emu_lt_layout *a, const mt_emu_lt_layout *b,
                               const mt_emu_lt_layout *c, const mt_emu_lt_layout *dd, uint64_t *m, uint64_t *n,
                               uint64_t *k)
{
    if (!d || !a || !b || !c || !dd) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F || a->type != CUDA_R_16BF ||
        b->type != CUDA_R_16BF || c->type != dd->type || (dd->type != CUDA_R_32F && dd->type != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;  /* the emulator knows bf16 x bf16 -> fp32 or bf16 (C = D type) only */
    *m = dd->rows;
    *n = dd->cols;
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (am != *m || bn != *n || ak != bk || c->rows != dd->rows || c->cols != dd->cols || c->ld != dd->ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* one batch count for all four; C's stride D's */
    if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch || c->stride != dd->stride)
        return CUBLAS_STATUS_INVALID_VALUE;
    *k = ak;
    return CUBLAS_STATUS_SUCCESS;
}

/* test hook MT_EMU_LT_NO_BATCH=1: no algorithm for a strided batch (> 1 matrix), every
 * single matmul as usual (gemm_bf16_batched's per-matrix fallback) */
static int lt_no_batch(const mt_emu_lt_layout *dd)
{
    const char *nb = getenv("MT_EMU_LT_NO_BATCH");
    return nb && nb[0] == '1' && dd->batch > 1;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                       const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *result)
{
    if (!h || !algo || !result) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dd, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const char *none = getenv("MT_EMU_LT_NO_ALGO");
    if ((none && none[0] == '1') || algo->data[ALGO_MAGIC] != LT_ALGO_MAGIC || lt_no_batch(dd))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(result, 0, sizeof *result);
    result->algo = *algo;
    result->workspaceSize = algo->data[ALGO_WS];
    result->state = CUBLAS_STATUS_SUCCESS;
    result->wavesCount = 1.0f;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!h || !p || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dd, &m, &n, &k);
    *returned = 0;
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    /* test hook: a library with no algorithm for anything (the caller's fallback) */
    const char *none = getenv("MT_EMU_LT_NO_ALGO");
    if ((none && none[0] == '1') || lt_no_batch(dd)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    /* an algorithm that asks for (up to) 1 MiB of workspace, so that a
     * caller passing none, or less than it asked for, fails */
    size_t ws = p->max_ws < ((size_t)1 << 20) ? (size_t)p->max_ws : ((size_t)1 << 20);
    results[0].algo.data[ALGO_MAGIC] = LT_ALGO_MAGIC;
    results[0].algo.data[ALGO_WS] = ws;
    for (int i = 0; i < 4; i++) results[0].algo.data[ALGO_ALIGN + i] = p->align[i];
    results[0].workspaceSize = ws;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static int aligned(const void *ptr, uint64_t al) { return al <= 1 || ((uintptr_t)ptr % al) == 0; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream)
{
    (void)stream;
    if (!h || !alpha || !beta || !A || !B || !D || !algo || algo->data[ALGO_MAGIC] != LT_ALGO_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, n, k;
    cublasStatus_t st = lt_shape(d, a, b, c, dd, &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (workspace_bytes < algo->data[ALGO_WS] || (algo->data[ALGO_WS] && !workspace)) return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (be != 0.0f && !C) return CUBLAS_STATUS_INVALID_VALUE;
    if (!aligned(A, algo->data[ALGO_ALIGN]) || !aligned(B, algo->data[ALGO_ALIGN + 1]) ||
        (be != 0.0f && !aligned(C, algo->data[ALGO_ALIGN + 2])) || !aligned(D, algo->data[ALGO_ALIGN + 3])) {
        fprintf(stderr, "cuda emu: cublasLtMatmul pointer less aligned than the algorithm's preference\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    {   /* captured: alpha, beta and the algorithm are read now; the descriptors must outlive the graph */
        const cublasLtMatmulAlgo_t al_algo = *algo;
        if (mt_emu_capture_record([=]() {
                cublasLtMatmul(h, d, &al, A, a, B, b, &be, C, c, D, dd, &al_algo, workspace, workspace_bytes, stream);
            }))
            return CUBLAS_STATUS_SUCCESS;
    }
    dev_scope on;
    const __nv_bfloat16 *Ab = (const __nv_bfloat16 *)A, *Bb = (const __nv_bfloat16 *)B;
    const float *Cf = (const float *)C;
    float *Df = (float *)D;
    const int d16 = dd->type == CUDA_R_16BF;   /* bf16 C and D: the fp32 result rounded once (nearest even) */
    const __nv_bfloat16 *Cb = (const __nv_bfloat16 *)C;
    __nv_bfloat16 *Db = (__nv_bfloat16 *)D;
    for (int32_t q = 0; q < dd->batch; q++) {   /* a strided batch: matrix q at q strides */
        const uint64_t oa = (uint64_t)q * (uint64_t)a->stride, ob = (uint64_t)q * (uint64_t)b->stride;
        const uint64_t od = (uint64_t)q * (uint64_t)dd->stride;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float acc = 0.0f;
                for (uint64_t l = 0; l < k; l++) {
                    const uint64_t ia = d->ta == CUBLAS_OP_N ? l * (uint64_t)a->ld + i : i * (uint64_t)a->ld + l;
                    const uint64_t ib = d->tb == CUBLAS_OP_N ? j * (uint64_t)b->ld + l : l * (uint64_t)b->ld + j;
                    const __nv_bfloat16 x = Ab[oa + ia], y = Bb[ob + ib];
                    acc += __bfloat162float(x) * __bfloat162float(y);  /* exact product, fp32 sum */
                }
                float r = al * acc;
                const uint64_t at = od + j * (uint64_t)dd->ld + i;
                if (be != 0.0f)   /* beta = 0: C is not read */
                    r += be * (d16 ? __bfloat162float(Cb[at]) : Cf[at]);
                if (d16) Db[at] = __float2bfloat16_rn(r);
                else Df[at] = r;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- a device libm that is not the host's (cuda_runtime.h mt_emu_libm) ---- */
double mt_emu_libm(double r)
{
    static const int ulps = [] {
        const char *e = getenv("MT_EMU_LIBM_ULPS");
        return e && *e ? atoi(e) : 0;
    }();
    if (ulps == 0 || r == 0.0 || !std::isfinite(r)) return r;
    uint64_t b;
    memcpy(&b, &r, sizeof b);
    const double ulp = nextafter(r, INFINITY) - r, sign = (b >> 17) & 1 ? 1.0 : -1.0;
    return r + sign * ulps * ulp;
}
