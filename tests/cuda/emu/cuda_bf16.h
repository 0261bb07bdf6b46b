/*
 * cuda_bf16.h (emulation) — the bf16 type and the conversions src/ops/cuda
 * uses, bit-exact with CUDA's: __float2bfloat16_rn rounds to nearest, ties
 * to even (NaN stays a quiet NaN), __bfloat162float widens exactly.
 * See cuda_runtime.h in this directory.
 */
#ifndef MT_EMU_CUDA_BF16_H
#define MT_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);          /* round half to even; overflows to inf correctly */
    r.x = (uint16_t)(u >> 16);
    return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* MT_EMU_CUDA_BF16_H */
