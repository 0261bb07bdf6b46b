/*
 * mma.h (emulation) — the warp matrix (WMMA) API of CUDA's <mma.h> that
 * src/ops/cuda uses: 16x16x16 tiles, bf16 operands, fp32 accumulators.
 * See cuda_runtime.h in this directory.
 *
 * On a GPU a fragment is spread over the warp's 32 lanes in a layout CUDA
 * leaves unspecified; code that only moves fragments through
 * load_matrix_sync / store_matrix_sync / fill_fragment / mma_sync never
 * depends on it. Here every lane holds the whole 16x16 tile, so each lane
 * computes the warp's result on its own (32 times the work, the same
 * numbers): exact for layout-independent code. (A lane whose operands
 * equal the first lane's, bit for bit, takes that lane's product instead
 * of computing it again: emu.cc, mt_emu_wmma_mma_recall.) Loads and stores are
 * warp-wide like the device's: done once, by the first lane to reach a
 * load and the last to reach a store (emu.cc), so a missing __syncwarp
 * shows here as it races there. `x` and `num_elements` exist
 * but mean "the whole tile"; kernels must not index them (they would be
 * wrong on the device).
 *
 * Checks (abort with a message, like the rest of the emulator): the
 * pointer of a load/store must be 256-bit (32-byte) aligned and ldm a
 * multiple of 8 elements for 16-bit types and of 4 for float — the
 * device's rules (CUDA C++ Programming Guide, "Warp Matrix Functions").
 *
 * Products: bf16 x bf16 is exact in fp32; the sum over k runs in order
 * (k = 0..15) in fp32 onto the accumulator. Tensor cores add the 16
 * products in another (wider, then truncated) way: the fp32 accumulation
 * term of the tests' bounds covers the difference.
 */
#ifndef MT_EMU_MMA_H
#define MT_EMU_MMA_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_bf16.h"

/* The emulator's own fragment arithmetic is left out of the sanitizer's checks
 * (tests/cuda/emu_objects.sh): it checks its pointers itself, and the checks in
 * its 16 x 16 x 16 loops doubled the emulated attention's run time. Nor does it
 * carry the access instrumentation: its reads of shared memory are the
 * instruction's (ldmatrix, a wmma load), not plain loads for the bank count */
#ifndef MT_EMU_UNCHECKED
#define MT_EMU_UNCHECKED __attribute__((no_sanitize("alignment", "bounds", "thread")))
#endif

/* emu.cc: the first lane of the warp to reach a load does it (1: load,
 * then publish; 0: x holds the first lane's tile); the last lane to reach
 * a store does it (1) — see emu.cc for why */
int  mt_emu_wmma_load_first(float *x);
void mt_emu_wmma_load_publish(const float *x);
int  mt_emu_wmma_store_last(void);
/* emu.cc: a product the warp's first lane computed from the same operands
 * (1: d filled; 0: compute and publish; -1: compute) */
int  mt_emu_wmma_mma_recall(const float *a, const float *b, const float *c, float *d);
void mt_emu_wmma_mma_publish(const float *a, const float *b, const float *c, const float *d);

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "emulated wmma: only 16x16x16 tiles");
    enum { num_elements = 256 };
    float x[256];  /* the whole tile, row-major (row r, column c at r*16 + c) */
};

static inline MT_EMU_UNCHECKED void mt_emu_wmma_check(const void *p, unsigned ldm, unsigned elem_bytes,
                                                      const char *what)
{
    unsigned mult = elem_bytes == 2 ? 8u : 4u;
    if (((uintptr_t)p & 31u) != 0 || ldm % mult != 0) {
        fprintf(stderr, "cuda emu: wmma %s: pointer %p not 32-byte aligned or ldm %u not a multiple of %u\n", what,
                p, ldm, mult);
        abort();
    }
}

static inline MT_EMU_UNCHECKED float mt_emu_wmma_elem(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
static inline MT_EMU_UNCHECKED float mt_emu_wmma_elem(const float *p, size_t i) { return p[i]; }

/* operand tiles: the Layout of the fragment says how memory is read */
template <typename Use, typename T, typename E>
static inline MT_EMU_UNCHECKED void mt_emu_wmma_load(float *x, const E *p, unsigned ldm, bool col)
{
    mt_emu_wmma_check(p, ldm, (unsigned)sizeof(E), "load_matrix_sync");
    if (!mt_emu_wmma_load_first(x)) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            x[r * 16 + c] = col ? mt_emu_wmma_elem(p, (size_t)c * ldm + (size_t)r)
                                : mt_emu_wmma_elem(p, (size_t)r * ldm + (size_t)c);
    mt_emu_wmma_load_publish(x);
}
template <typename Use, typename T>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm)
{
    mt_emu_wmma_load<Use, T>(f.x, p, ldm, false);
}
template <typename Use, typename T>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm)
{
    mt_emu_wmma_load<Use, T>(f.x, p, ldm, true);
}
/* accumulators: the layout is given at the call */
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout)
{
    mt_emu_wmma_load<accumulator, float>(f.x, p, ldm, layout == mem_col_major);
}
static inline MT_EMU_UNCHECKED void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                                      unsigned ldm, layout_t layout)
{
    mt_emu_wmma_check(p, ldm, 4, "store_matrix_sync");
    if (!mt_emu_wmma_store_last()) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            size_t at = layout == mem_col_major ? (size_t)c * ldm + (size_t)r : (size_t)r * ldm + (size_t)c;
            p[at] = f.x[r * 16 + c];
        }
}
template <typename Use, typename T, typename Layout>
static inline MT_EMU_UNCHECKED void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}
/* d = a b + c; d may be c */
template <typename LA, typename LB>
static inline MT_EMU_UNCHECKED void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    const int recalled = mt_emu_wmma_mma_recall(a.x, b.x, c.x, d.x);
    if (recalled == 1) return;
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) {
            float s = c.x[r * 16 + col];
            for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + col];
            out[r * 16 + col] = s;
        }
    if (recalled == 0) mt_emu_wmma_mma_publish(a.x, b.x, c.x, out);
    for (int i = 0; i < 256; i++) d.x[i] = out[i];
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif /* MT_EMU_MMA_H */
