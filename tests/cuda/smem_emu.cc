/*
 * smem_emu.cc — the CPU emulator's shared memory as a GPU has it: fresh
 * static shared arrays at every launch (0xff, NaN: a read of what the first
 * block has not written shows, not the previous launch's value), and cp.async
 * (tests/cuda/emu/mma_ptx.h, emu.cc), which the tensor-core kernels that stage tiles asynchronously
 * (attention_v2.cu, gemm_grouped.cu, xent.cu: src/ops/cuda/mma_sync.cuh's
 * mt_cp_async16 / _commit / _wait) rely on under test (tests/test_cuda_build.sh
 * stage g). As on a GPU, where a copy is in flight until the issuing
 * thread's cp.async.wait_group covers it:
 *   - a read of the destination before the wait sees no data (NaN here);
 *   - wait<0> lands every committed group; wait<1> all but the newest
 *     committed one; copies not yet committed are not waited for;
 *   - nbytes 0 writes zeros;
 *   - another thread's copy is visible after its wait and a barrier, and a
 *     reader that runs before the copier's wait (no barrier) sees NaN;
 *   - a copy issued into a tile another warp has yet to read (a double
 *     buffer reused without the barrier) spoils that warp's read (NaN while
 *     in flight, the next tile once landed: here the issuer waits first).
 * And the launch order (MT_EMU_ORDER=reverse runs a launch's blocks and a
 * block's threads last to first): a race reads other values in the two
 * orders, a kernel with its barriers the same.
 * Built and run only against the emulator (C++, -DMT_CUDA_EMU).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

#include "../../src/ops/cuda/mma_sync.cuh"
#include "../../src/ops/cuda/wgmma.cuh"

#include <string.h>

static int n_pass, n_fail;
static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok) n_pass++;
    else n_fail++;
}

/* out[0..3]: thread 0's view of its own copies of src[0..3] (16 bytes each as
 * float4 = 4 floats; one float each recorded): before any wait, after wait<1>
 * with groups {A}, {B} committed and C uncommitted, after wait<0>, after a
 * commit of C and wait<0>; out[4]: a zero-fill copy after its wait */
__global__ void own_k(float *out, const float *src)
{
    __shared__ float s[20];
    if (threadIdx.x != 0) return;
    mt_cp_async16(s + 0, src + 0, 16);   /* group A */
    mt_cp_async_commit();
    mt_cp_async16(s + 4, src + 4, 16);   /* group B */
    mt_cp_async_commit();
    mt_cp_async16(s + 8, src + 8, 16);   /* C: not committed yet */
    out[0] = s[0];                        /* before any wait: in flight */
    mt_cp_async_wait<1>();                /* A lands; B (the newest committed) and C do not */
    out[1] = s[0];
    out[2] = s[4];
    out[3] = s[8];
    mt_cp_async_wait<0>();                /* B lands; C is uncommitted: still in flight */
    out[4] = s[4];
    out[5] = s[8];
    mt_cp_async_commit();
    mt_cp_async_wait<0>();                /* C lands */
    out[6] = s[8];
    mt_cp_async16(s + 12, src, 0);        /* zero fill */
    mt_cp_async_commit();
    mt_cp_async_wait<0>();
    out[7] = s[12];
}

/* 64 threads (2 warps): thread t copies 4 floats of src into the tile; warp
 * 1's reader (thread 32) reads thread 0's copy. barrier = 1: wait, then
 * __syncthreads, then read (right); 0: thread 32 waits only for its own
 * copy and reads thread 0's with no barrier between. Thread 0 runs first in
 * the emulator's sweep, so a reader of warp 1 would see its data; the
 * reverse case (thread 0 reading warp 1's copy) is the one that shows. */
__global__ void cross_k(float *out, const float *src, int barrier)
{
    float *s = (float *)mt_emu_dyn_smem();   /* dynamic: 0xff (NaN) at every block's start */
    const int t = (int)threadIdx.x;
    mt_cp_async16(s + 4 * t, src + 4 * t, 16);
    mt_cp_async_commit();
    mt_cp_async_wait<0>();
    if (barrier) __syncthreads();
    if (t == 0) out[0] = s[4 * 32];   /* thread 32's copy, read by thread 0 */
}

/* a double buffer reused without the barrier: every thread copies into
 * buf, waits, barrier; then warp 1 reads buf while warp 0 (which runs
 * first) has already issued the next tile's copy into buf: reuse without a
 * barrier after the reads. reuse_barrier = 1 puts that barrier in. */
__global__ void reuse_k(float *out, const float *src, int reuse_barrier)
{
    float *s = (float *)mt_emu_dyn_smem();
    const int t = (int)threadIdx.x;
    mt_cp_async16(s + 4 * t, src + 4 * t, 16);
    mt_cp_async_commit();
    mt_cp_async_wait<0>();
    __syncthreads();
    float v = s[(4 * t + 128) % 256];   /* warp 0 reads warp 1's rows and vice versa */
    if (reuse_barrier) __syncthreads();
    mt_cp_async16(s + 4 * t, src + 256 + 4 * t, 16);   /* the next tile into the same buffer */
    mt_cp_async_commit();
    out[t] = v;
    mt_cp_async_wait<0>();
}

static cudaStream_t g_s;
static void copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaMemcpyAsync(dst, src, n, kind, g_s);
    cudaStreamSynchronize(g_s);
}
/* the block reads s[0] before writing it, then writes 1 there */
__global__ void fresh_k(float *out)
{
    __shared__ float s[4];
    if (threadIdx.x == 0) {
        out[blockIdx.x] = s[0];
        s[0] = 1.0f;
    }
}

/* The launch order (mt_emu_set_order, MT_EMU_ORDER): a block's threads run
 * first to last or last to first, and so do a launch's blocks. These two
 * kernels race on a GPU without their barrier: what they read depends on
 * the order, so the two orders give different results. Thread t reads the
 * next thread's shared write: forward, the next thread has not run (NaN);
 * reverse, it has. */
__global__ void order_threads_k(float *out, int barrier)
{
    __shared__ float s[64];
    const int t = (int)threadIdx.x;
    s[t] = (float)t;
    if (barrier) __syncthreads();
    out[t] = s[(t + 1) % 64];
}
/* block b reads block b - 1's flag, then sets its own (flags zeroed first):
 * forward, block b - 1 ran before; reverse, after */
__global__ void order_blocks_k(float *flag)
{
    const int b = (int)blockIdx.x;
    if (threadIdx.x != 0) return;
    flag[8 + b] = b > 0 ? flag[b - 1] : -1.0f;
    flag[b] = (float)(b + 1);
}

/* the emulator's ldmatrix bank count (`smem_emu banks`, MT_EMU_BANKS=FILE: stage g
 * reads the file): a warp's ldmatrix.x4 over 32 rows of a shared tile whose rows are
 * PITCH bytes apart. 144 (128 + 16 of padding): 8 rows cover the 32 banks, 1
 * wavefront a phase; 128: every row on the same 4 banks, 8 */
template <int PITCH>
__global__ void banks_k(float *out)
{
    __shared__ float4 tile4[32 * PITCH / 16];   /* 16-byte aligned */
    unsigned char *tile = (unsigned char *)tile4;
    for (int i = (int)threadIdx.x; i < 32 * PITCH / 4; i += 32) ((float *)tile)[i] = 0.0f;
    __syncthreads();
    uint32_t r[4];
    mt_ldsm_x4(r, tile + threadIdx.x * PITCH);
    out[threadIdx.x] = (float)r[0];
}

/* the emulator's count of plain shared loads and stores (`smem_emu banks`, the same
 * file): lane l stores word l * STRIDE, then loads it back, loads word 0 (all lanes:
 * one word, a broadcast) and a 16-byte float4 (4 phases of 8 lanes). STRIDE 33: every
 * request conflict-free (the float4s side by side): st 1 phase 1 wavefront; ld 1 + 1 + 4
 * phases, 6 wavefronts. STRIDE 32: the word store and load each hit one bank, 32
 * wavefronts; the float4s 32 words apart, 8 to a bank: 8 a phase: ld 6 phases, 32 + 1 +
 * 4 x 8 = 65 wavefronts, worst 32 */
template <int STRIDE>
__global__ void banks_plain_k(float *out)
{
    /* dynamic shared memory: a template kernel's static arrays are outside the section
     * the emulator knows (emu_objects.sh refuses them in src/ops/cuda) */
    float4 *tile4 = (float4 *)mt_emu_dyn_smem();
    float *tile = (float *)tile4;
    tile[threadIdx.x * STRIDE] = (float)threadIdx.x;
    __syncthreads();
    const float4 v = tile4[threadIdx.x * (STRIDE == 33 ? 1 : 8)];
    out[threadIdx.x] = tile[threadIdx.x * STRIDE] + tile[0] + v.x + v.y + v.z + v.w;
}

/* ... and of cp.async's shared-memory side (the same file): lane l copies 16 bytes to
 * chunk l % 4 of row l / 4, rows PITCH bytes apart, 4 phases of 8 lanes (2 rows). 64:
 * the rows side by side, 1 wavefront a phase; 80 (20 words: the grouped GEMM's old
 * layout) two rows of a phase share the banks of one chunk: 2 a phase */
template <int PITCH>
__global__ void banks_cp_k(const float *src, float *out)
{
    unsigned char *tile = (unsigned char *)mt_emu_dyn_smem();
    mt_cp_async16(tile + (threadIdx.x / 4) * PITCH + (threadIdx.x % 4) * 16, src + 4 * threadIdx.x, 16);
    mt_cp_async_commit();
    mt_cp_async_wait<0>();
    out[threadIdx.x] = ((const float *)(tile + (threadIdx.x / 4) * PITCH + (threadIdx.x % 4) * 16))[0];
}

/* the emulator's sector count of global accesses (`smem_emu coalesce`, MT_EMU_COALESCE=FILE):
 * lane l loads float l * S, then float l + 1 (128 bytes 4 bytes past a sector's start: 5
 * sectors, 4 needed), and stores float l (4, 4). S 1: the first load 4 sectors, 4 needed:
 * gld 8 needed, 9 sectors, worst request 2 (5 / 4 rounded up). S 2: lanes 8 bytes apart,
 * 256 bytes touched for 128 read: 8 sectors, 4 needed: gld 8, 13, 2. Plus cp.async's
 * global side (banks_cp_k<64>'s 16 bytes a lane side by side: 16 sectors, 16 needed) */
template <int S>
__global__ void coal_k(const float *src, float *out)
{
    const float a = src[threadIdx.x * S];
    const float b = src[threadIdx.x + 1];
    out[threadIdx.x] = a + b;
}

/* the emulator's race check (`smem_emu race [barrier]` under MT_EMU_RACECHECK=1,
 * stage g): after a barrier, warp 1 reads the words warp 0 wrote before it, then warp 0
 * rewrites them. Without a second barrier between the read and the rewrite it is a
 * race: forward (warp 0 runs ahead) warp 1 reads words written in its epoch (RAW);
 * reversed (warp 1 runs ahead) warp 0 writes words read in its epoch (WAR). Both must
 * abort naming the kind; with the barrier both orders run */
static __device__ MT_WARP_STEP float race_read(const float *s)   /* (the host compiler would copy */
{                                                               /* a barrier into both branches) */
    return threadIdx.x >= 32 ? s[threadIdx.x - 32] : 0.0f;
}
static __device__ MT_WARP_STEP void race_write(float *s)
{
    if (threadIdx.x < 32) s[threadIdx.x] = -1.0f;
}
__global__ void race_k(float *out, int barrier)
{
    float *s = (float *)mt_emu_dyn_smem();
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    const float v = race_read(s);
    if (barrier) __syncthreads();
    race_write(s);
    out[threadIdx.x] = v;
}

/* wgmma's tile hash right after a wait (`smem_emu wg_race [barrier]`, run by
 * tests/test_cuda_build.sh stage g in the reverse order, whose eager sweep runs
 * warpgroup 1 ahead): both warpgroups issue a product and wait for it; then
 * warpgroup 1 issues a second on tile B while warpgroup 0 rewrites B. With a
 * barrier between the write and the issue it is a correct kernel (exit 0);
 * without, a race on a GPU that the emulator must name (abort). Before the
 * twentieth session it went unnamed: after a wait, the threads not yet back
 * from it still held that wait's computed products, so the next issuer did not
 * count as the first and nobody hashed the tiles. */
static __device__ MT_WARP_STEP void wg_race_issue(float (&d)[32], const unsigned char *A, const unsigned char *B)
{
    if (threadIdx.x / 128 != 1) return;
    mt_wgmma_fence();
    mt_wgmma_ss<64>(&d[0], mt_wgmma_desc_sw128(A), mt_wgmma_desc_sw128(B), 0);
    mt_wgmma_commit();
}
static __device__ MT_WARP_STEP void wg_race_write(unsigned char *B)
{
    if (threadIdx.x / 128 != 0) return;
    for (int i = (int)threadIdx.x; i < 4096; i += 128) ((uint16_t *)B)[i] = 0x4000;   /* bf16 2.0 */
}
static __device__ MT_WARP_STEP void wg_race_wait(void)
{
    if (threadIdx.x / 128 == 1) mt_wgmma_wait<0>();
}
__global__ void wg_race_k(float *out, int barrier)
{
    unsigned char *raw = (unsigned char *)mt_emu_dyn_smem();
    unsigned char *A = raw + ((1024u - (mt_smem_u32(raw) & 1023u)) & 1023u), *B = A + 8192;
    for (int i = (int)threadIdx.x; i < 8192; i += 256) ((uint16_t *)A)[i] = 0x3f80;   /* A and B: bf16 1.0 */
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
    mt_wgmma_fence();
    mt_wgmma_ss<64>(&d[0], mt_wgmma_desc_sw128(A), mt_wgmma_desc_sw128(B), 0);
    mt_wgmma_commit();
    mt_wgmma_wait<0>();
    if (barrier) {
        wg_race_write(B);
        __syncthreads();
        wg_race_issue(d, A, B);
    } else {
        wg_race_issue(d, A, B);
        wg_race_write(B);
        __syncthreads();
    }
    wg_race_wait();
    if (threadIdx.x == 128) out[0] = d[0];
}

static void to_host(float *h, const float *d, int n) { copy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost); }

int main(int argc, char **argv)
{
    float hsrc[512];
    for (int i = 0; i < 512; i++) hsrc[i] = (float)(i + 1);
    float *src = NULL, *out = NULL, h[64];
    cudaMalloc((void **)&src, sizeof hsrc);
    cudaMalloc((void **)&out, 64 * sizeof(float));
    cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking);
    copy(src, hsrc, sizeof hsrc, cudaMemcpyHostToDevice);
    if (argc > 1 && !strcmp(argv[1], "banks")) {   /* counts go to MT_EMU_BANKS at exit */
        mt_emu_name_kernel((const void *)banks_k<144>, "banks_k<144>");
        mt_emu_name_kernel((const void *)banks_k<128>, "banks_k<128>");
        mt_emu_launcher(banks_k<144>, dim3(1), dim3(32), 0)(out);
        mt_emu_launcher(banks_k<128>, dim3(1), dim3(32), 0)(out);
        mt_emu_name_kernel((const void *)banks_plain_k<33>, "banks_plain_k<33>");
        mt_emu_name_kernel((const void *)banks_plain_k<32>, "banks_plain_k<32>");
        mt_emu_launcher(banks_plain_k<33>, dim3(1), dim3(32), 32 * 33 * 4)(out);
        mt_emu_launcher(banks_plain_k<32>, dim3(1), dim3(32), 32 * 33 * 4)(out);
        mt_emu_name_kernel((const void *)banks_cp_k<64>, "banks_cp_k<64>");
        mt_emu_name_kernel((const void *)banks_cp_k<80>, "banks_cp_k<80>");
        mt_emu_launcher(banks_cp_k<64>, dim3(1), dim3(32), 8 * 80)(src, out);
        mt_emu_launcher(banks_cp_k<80>, dim3(1), dim3(32), 8 * 80)(src, out);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "coalesce")) {   /* counts go to MT_EMU_COALESCE at exit */
        mt_emu_name_kernel((const void *)coal_k<1>, "coal_k<1>");
        mt_emu_name_kernel((const void *)coal_k<2>, "coal_k<2>");
        mt_emu_name_kernel((const void *)banks_cp_k<64>, "banks_cp_k<64>");
        mt_emu_launcher(coal_k<1>, dim3(1), dim3(32), 0)(src, out);
        mt_emu_launcher(coal_k<2>, dim3(1), dim3(32), 0)(src, out);
        mt_emu_launcher(banks_cp_k<64>, dim3(1), dim3(32), 8 * 80)(src, out);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "race")) {   /* a process of its own: the race aborts it */
        const int barrier = argc > 2 && !strcmp(argv[2], "barrier");
        mt_emu_name_kernel((const void *)race_k, "race_k");
        mt_emu_launcher(race_k, dim3(1), dim3(64), 64 * sizeof(float))(out, barrier);
        to_host(h, out, 64);
        printf("race%s: warp 1 read %g .. %g (0 .. 31)\n", barrier ? " barrier" : "", h[32], h[63]);
        return h[32] == 0.0f && h[63] == 31.0f ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "wg_race")) {   /* a process of its own: the race aborts it */
        const int barrier = argc > 2 && !strcmp(argv[2], "barrier");
        mt_emu_launcher(wg_race_k, dim3(1), dim3(256), 16384 + MT_WGMMA_ALIGN_SLACK)(out, barrier);
        to_host(h, out, 1);
        printf("wg_race%s: the second product %g (16 x 1.0 x 2.0 = 32)\n", barrier ? " barrier" : "", h[0]);
        return h[0] == 32.0f ? 0 : 1;
    }

    mt_emu_launcher(own_k, dim3(1), dim3(32), 0)(out, src);
    to_host(h, out, 8);
    check(isnan(h[0]), "a copy read before any wait: not landed (NaN)");
    check(h[1] == 1.0f, "wait<1>: the older committed group landed");
    check(isnan(h[2]), "wait<1>: the newest committed group still in flight");
    check(isnan(h[3]), "wait<1>: an uncommitted copy still in flight");
    check(h[4] == 5.0f, "wait<0>: every committed group landed");
    check(isnan(h[5]), "wait<0>: an uncommitted copy still in flight");
    check(h[6] == 9.0f, "commit then wait<0>: it landed");
    check(h[7] == 0.0f, "nbytes 0: zeros");

    mt_emu_launcher(cross_k, dim3(1), dim3(64), 1024)(out, src, 1);
    to_host(h, out, 1);
    check(h[0] == 129.0f, "another thread's copy after its wait and a barrier: visible");
    mt_emu_launcher(cross_k, dim3(1), dim3(64), 1024)(out, src, 0);
    to_host(h, out, 1);
    check(isnan(h[0]), "another thread's copy without the barrier (read before its wait): NaN");

    mt_emu_launcher(reuse_k, dim3(1), dim3(64), 1024)(out, src, 1);
    to_host(h, out, 64);
    int good = 1;
    for (int t = 0; t < 64; t++) good &= h[t] == hsrc[(4 * t + 128) % 256];
    check(good, "a double buffer reused after a barrier: every read the first tile");
    mt_emu_launcher(reuse_k, dim3(1), dim3(64), 1024)(out, src, 0);
    to_host(h, out, 64);
    int spoiled = 0;
    for (int t = 32; t < 64; t++) spoiled += h[t] != hsrc[(4 * t + 128) % 256];   /* warp 0's rows, reissued */
    check(spoiled == 32, "a double buffer reused without the barrier: the later warp's reads not the first tile");

    mt_emu_launcher(fresh_k, dim3(1), dim3(32), 0)(out);
    mt_emu_launcher(fresh_k, dim3(1), dim3(32), 0)(out + 1);   /* the first launch wrote 1 */
    to_host(h, out, 2);
    check(isnan(h[0]) && isnan(h[1]), "static shared memory: NaN at every launch's start");

    float fwd[64], rev[64];
    for (int barrier = 0; barrier < 2; barrier++) {
        for (int r = 0; r < 2; r++) {
            mt_emu_set_order(r);
            mt_emu_launcher(order_threads_k, dim3(1), dim3(64), 0)(out, barrier);
            to_host(r ? rev : fwd, out, 64);
        }
        int nan_f = 0, val_r = 0, exact = 0;
        for (int t = 0; t < 63; t++) {
            nan_f += isnan(fwd[t]);
            val_r += rev[t] == (float)(t + 1);
        }
        for (int t = 0; t < 64; t++) exact += fwd[t] == (float)((t + 1) % 64) && rev[t] == fwd[t];
        if (!barrier)
            check(nan_f == 63 && val_r == 63, "order: a thread reading the next thread's shared write, no barrier: "
                                              "NaN forward, the value reversed");
        else check(exact == 64, "order: the same read after a barrier: exact in both orders");
    }
    for (int r = 0; r < 2; r++) {
        mt_emu_set_order(r);
        cudaMemsetAsync(out, 0, 16 * sizeof(float), g_s);
        mt_emu_launcher(order_blocks_k, dim3(8), dim3(32), 0)(out);
        to_host(r ? rev : fwd, out, 16);
    }
    int seen_f = 0, seen_r = 0;
    for (int b = 1; b < 8; b++) {
        seen_f += fwd[8 + b] == (float)b;
        seen_r += rev[8 + b] == 0.0f;
    }
    check(seen_f == 7 && seen_r == 7,
          "order: a block reading the previous block's write: seen forward, not yet written reversed");
    mt_emu_set_order(0);

    cudaFree(src);
    cudaFree(out);
    printf("smem_emu: %d checks, %d passed, %d failed\n", n_pass + n_fail, n_pass, n_fail);
    return n_fail ? 1 : 0;
}
