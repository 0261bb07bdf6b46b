/*
 * mma_ptx.h (emulation) — the warp-level PTX instructions that
 * src/ops/cuda/mma_sync.cuh wraps, with the register layouts the PTX ISA
 * documents (so code that builds or reads fragments by element, as the
 * FlashAttention-2 kernel of attention_v2.cu does, runs here exactly as on
 * the device):
 *
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  d = a b + c
 *     groupID g = lane >> 2, threadID_in_group t = lane % 4; a .b32 register
 *     holds two bf16, the lower-indexed element in the low 16 bits.
 *     A (16x16, 4 regs): a0 (row g, cols 2t, 2t+1), a1 (row g+8, cols 2t..),
 *                        a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8..)
 *     B (16x8, 2 regs):  b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9, col g)
 *     C, D (16x8 f32):   c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same)
 *   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
 *     lanes 8i..8i+7 give the 8 row addresses (16-byte aligned) of matrix i;
 *     register i of lane l holds matrix i's (row l>>2, cols 2(l%4), 2(l%4)+1),
 *     with .trans (rows 2(l%4), 2(l%4)+1, col l>>2).
 *
 * Each instruction is a warp collective (emu.cc mt_emu_warp_collective): all
 * 32 lanes arrive, the last one computes every lane's registers from the
 * gathered operands (mma) or from memory as it is at that moment (ldmatrix),
 * then every lane goes on with its own. A lane's register content is thus
 * exactly the device's. Products: bf16 x bf16 is exact in fp32; the 16 of a
 * dot product are added in order (k = 0..15) onto c in fp32, as mma.h does
 * for wmma (tensor cores add them another way: the fp32 accumulation term
 * of the tests' bounds covers it).
 */
#ifndef MT_EMU_MMA_PTX_H
#define MT_EMU_MMA_PTX_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The emulator's own fragment arithmetic is left out of the sanitizer's checks
 * (tests/cuda/emu_objects.sh): it checks its pointers itself, and the checks in
 * its 16 x 16 x 16 loops doubled the emulated attention's run time. Nor does it
 * carry the access instrumentation: its reads of shared memory are the
 * instruction's (ldmatrix, a wmma load), not plain loads for the bank count */
#ifndef MT_EMU_UNCHECKED
#define MT_EMU_UNCHECKED __attribute__((no_sanitize("alignment", "bounds", "thread")))
#endif

#include "cuda_runtime.h"

/* cp.async (cp.async.cg 16 bytes, commit_group, wait_group N), asynchronous as
 * on the device (emu.cc): a copy lands in shared memory only at a wait of
 * the issuing thread that covers its group (every committed group but the N
 * most recent; copies not yet committed are not waited for), and its 16
 * destination bytes read 0xff (NaN) from the issue until then. So a read
 * before the wait, a read of another thread's copy without the barrier
 * after its wait (when the reader runs first in the emulator's sweep), or a
 * copy issued into a tile some warp still reads (a missing barrier before
 * the reuse of a double buffer) shows as NaNs, as it would race on a GPU.
 * The source is read at the issue (nbytes 0: zeros). */
void mt_emu_cp_async16(void *dst, const void *src, int nbytes);
void mt_emu_cp_async_commit(void);
void mt_emu_cp_async_wait(int n);

static inline float mt_emu_bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
static inline float mt_emu_bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }

/* slot of a lane: a[4], b[2], c[4] in; d[4] out */
struct mt_emu_mma_slot { uint32_t a[4], b[2]; float c[4]; };

static inline MT_EMU_UNCHECKED void mt_emu_mma_16816_fn(unsigned char *slots, size_t stride)
{
    float A[16][16], Bm[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        mt_emu_mma_slot s;
        memcpy(&s, slots + (size_t)l * stride, sizeof s);
        const int g = l >> 2, t = l & 3;
        A[g][2 * t] = mt_emu_bf16_lo(s.a[0]);         A[g][2 * t + 1] = mt_emu_bf16_hi(s.a[0]);
        A[g + 8][2 * t] = mt_emu_bf16_lo(s.a[1]);     A[g + 8][2 * t + 1] = mt_emu_bf16_hi(s.a[1]);
        A[g][2 * t + 8] = mt_emu_bf16_lo(s.a[2]);     A[g][2 * t + 9] = mt_emu_bf16_hi(s.a[2]);
        A[g + 8][2 * t + 8] = mt_emu_bf16_lo(s.a[3]); A[g + 8][2 * t + 9] = mt_emu_bf16_hi(s.a[3]);
        Bm[2 * t][g] = mt_emu_bf16_lo(s.b[0]);        Bm[2 * t + 1][g] = mt_emu_bf16_hi(s.b[0]);
        Bm[2 * t + 8][g] = mt_emu_bf16_lo(s.b[1]);    Bm[2 * t + 9][g] = mt_emu_bf16_hi(s.b[1]);
        C[g][2 * t] = s.c[0]; C[g][2 * t + 1] = s.c[1]; C[g + 8][2 * t] = s.c[2]; C[g + 8][2 * t + 1] = s.c[3];
    }
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        float d[4];
        for (int e = 0; e < 4; e++) {
            const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
            float acc = C[r][c];
            for (int k = 0; k < 16; k++) acc += A[r][k] * Bm[k][c];
            d[e] = acc;
        }
        memcpy(slots + (size_t)l * stride, d, sizeof d);
    }
}

/* d += a b (the warp's 16x8 tile; d doubles as c) */
static inline void mt_emu_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    mt_emu_mma_slot s;
    memcpy(s.a, a, sizeof s.a);
    memcpy(s.b, b, sizeof s.b);
    memcpy(s.c, d, sizeof s.c);
    float out[4];
    mt_emu_warp_collective(&s, sizeof s, out, sizeof out, mt_emu_mma_16816_fn);
    memcpy(d, out, sizeof out);
}

/* MT_EMU_BANKS=FILE (emu.cc): each ldmatrix's shared-memory bank conflicts, per kernel */
void mt_emu_note_ldmatrix(const unsigned char *const row[32]);

template <bool TRANS>
static inline MT_EMU_UNCHECKED void mt_emu_ldmatrix_x4_fn(unsigned char *slots, size_t stride)
{
    const unsigned char *row[32];
    for (int l = 0; l < 32; l++) {
        memcpy(&row[l], slots + (size_t)l * stride, sizeof row[l]);
        if (((uintptr_t)row[l] & 15u) != 0) {
            fprintf(stderr, "cuda emu: ldmatrix: lane %d's row address %p is not 16-byte aligned\n", l,
                    (const void *)row[l]);
            abort();
        }
    }
    mt_emu_note_ldmatrix(row);
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        uint32_t r[4];
        for (int i = 0; i < 4; i++) {
            uint16_t e0, e1;
            if (!TRANS) {
                memcpy(&e0, row[8 * i + g] + 2 * (2 * t), 2);
                memcpy(&e1, row[8 * i + g] + 2 * (2 * t + 1), 2);
            } else {
                memcpy(&e0, row[8 * i + 2 * t] + 2 * g, 2);
                memcpy(&e1, row[8 * i + 2 * t + 1] + 2 * g, 2);
            }
            r[i] = (uint32_t)e0 | ((uint32_t)e1 << 16);
        }
        memcpy(slots + (size_t)l * stride, r, sizeof r);
    }
}

template <bool TRANS>
static inline void mt_emu_ldmatrix_x4(uint32_t r[4], const void *p)
{
    uint32_t out[4];
    mt_emu_warp_collective(&p, sizeof p, out, sizeof out, mt_emu_ldmatrix_x4_fn<TRANS>);
    memcpy(r, out, sizeof out);
}

/* ---- wgmma (src/ops/cuda/wgmma.cuh), sm_90a's warpgroup MMA ----
 * mt_emu_smem_offset(p): p's offset in the block's dynamic shared memory (the
 * emulator's shared-window address; the dynamic area is 1024-byte aligned on
 * the host, so the swizzle's address bits are the offset's). Other memory aborts.
 * mt_emu_wgmma_ss(d, n, da, db, acc, ta, tb): wgmma.mma_async m64nNk16 f32.bf16.bf16
 * with both operands from shared memory in the 128-byte swizzle, K-major, or
 * MN-major where ta (A) / tb (B), the instruction's imm-trans, are 1 (wgmma.cuh's
 * layouts; any other descriptor mode aborts). Asynchronous as on the device:
 * the issue records the product (its descriptors, and its C: the thread's d,
 * or the product before it on the same d that is not yet waited for) and
 * fills d with NaN. mt_emu_wgmma_wait(N) is a warpgroup collective (emu.cc
 * mt_emu_wg_collective: all 128 threads, the same call site, the same pending
 * products and descriptors, else abort); its last thread computes every
 * product of a group the wait covers (every committed group but the N most
 * recent), in issue order, reading both tiles as shared memory is AT THE WAIT
 * (the device reads them at some time before the wait returns: the latest
 * moment is the strict one), and each thread's result lands in its d. Each
 * product adds its 16 terms in k order onto C in fp32 (the device adds them
 * another way: the checks' fp32 accumulation term covers it). So reading d
 * before its wait shows (NaN), and so does a tile that changes between the
 * warpgroup's first issue of a product and its wait (the bits are compared:
 * abort): a stage refilled early, or another warpgroup's write with no barrier
 * before the issue — each a race on a GPU. */
uint32_t mt_emu_smem_offset(const void *p);
void mt_emu_wgmma_ss(float *d, int n, uint64_t da, uint64_t db, int acc, int ta, int tb);
/* ... with A from registers: a[4] as mma.m16n8k16's A fragment, warp q on rows 16 q .. 16 q + 15.
 * Their values are taken at the issue: the device may read them until the wait, so a
 * kernel must not write them before it, and that the emulator does NOT catch
 * (docs/cuda.md "wgmma") */
void mt_emu_wgmma_rs(float *d, int n, const uint32_t a[4], uint64_t db, int acc, int tb);
void mt_emu_wgmma_commit(void);
void mt_emu_wgmma_wait(int n);

#endif /* MT_EMU_MMA_PTX_H */
