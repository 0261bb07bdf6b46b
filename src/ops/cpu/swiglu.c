/*
 * swiglu.c — SwiGLU: out = silu(g) * u, elementwise over n = N*F values.
 *
 *   silu(x) = x s, s = sigmoid(x) = 1 / (1 + exp(-x));  silu'(x) = s + x s (1 - s)
 *   backward: dg = dout * u * silu'(g),  du = dout * silu(g)   (both =)
 *
 * Invariant: purely elementwise over fixed chunks; dgate/dup may alias
 * gate/up (each element is read before it is written). The bf16 entries
 * round (nearest even) fp32 values that fwd_range / bwd_range computed over
 * the same chunks as the plain entries: their bits, rounded.
 */
#include "cpu_impl.h"

#define CHUNK 4096  /* elements per parallel chunk */

static void fwd_range(float *out, const float *gate, const float *up, size_t lo, size_t hi)
{
    size_t i = lo;
#ifdef MT_CPU_HAVE_EXP8
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= hi; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, mt_cpu_exp8(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < hi; i++) {
        float g = gate[i];
        float s = 1.0f / (1.0f + mt_cpu_expf(-g));
        out[i] = g * s * up[i];
    }
}

/* act: NULL, or also act = silu * u = (g s) u, fwd_range's product in its
 * order (same s, same two roundings: its bits), from the same loads */
static void bwd_range(float *act, float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, size_t lo, size_t hi)
{
    size_t i = lo;
#ifdef MT_CPU_HAVE_EXP8
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= hi; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i), d = _mm256_loadu_ps(dout + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, mt_cpu_exp8(_mm256_sub_ps(zero, g))));
        __m256 silu = _mm256_mul_ps(g, s);
        __m256 dsilu = _mm256_fmadd_ps(silu, _mm256_sub_ps(one, s), s);  /* s + g s (1-s) */
        if (act) _mm256_storeu_ps(act + i, _mm256_mul_ps(silu, u));
        _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(d, u), dsilu));
        _mm256_storeu_ps(dup + i, _mm256_mul_ps(d, silu));
    }
#endif
    for (; i < hi; i++) {
        float g = gate[i], u = up[i], d = dout[i];
        float s = 1.0f / (1.0f + mt_cpu_expf(-g));
        float silu = g * s;
        if (act) act[i] = silu * u;
        dgate[i] = d * u * (s + g * s * (1.0f - s));
        dup[i]   = d * silu;
    }
}

void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++)
        fwd_range(out, gate, up, c * CHUNK, (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n);
}

/* the same chunks as mt_cpu_swiglu_forward (fwd_range's 8-wide groups start
 * at each chunk's first element either way: the same bits), each rounded to
 * bf16 while in cache; out == NULL: a chunk-sized stack buffer instead */
void mt_cpu_swiglu_forward_bf16(float *out, uint16_t *out_bf16, const float *gate, const float *up, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++) {
        const size_t lo = c * CHUNK, m = (c + 1) * CHUNK < n ? CHUNK : n - lo;
        float tmp[CHUNK], *o = out ? out + lo : tmp;
        fwd_range(o, gate + lo, up + lo, 0, m);
        for (size_t i = 0; i < m; i++) out_bf16[lo + i] = mt_cpu_f32_to_bf16(o[i]);
    }
}

void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++)
        bwd_range(NULL, dgate, dup, dout, gate, up, c * CHUNK, (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n);
}

/* the same chunks as mt_cpu_swiglu_backward (bwd_range's 8-wide groups start
 * at each chunk's first element either way: its bits), dg and du rounded to
 * bf16 (nearest even) while the chunk is in cache; the fp32 values live only
 * in two chunk-sized stack buffers (2 x 16 KiB per thread) */
void mt_cpu_swiglu_backward_bf16(uint16_t *dgate_b, uint16_t *dup_b, const float *dout, const float *gate,
                                 const float *up, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++) {
        const size_t lo = c * CHUNK, m = (c + 1) * CHUNK < n ? CHUNK : n - lo;
        float tg[CHUNK], tu[CHUNK];
        bwd_range(NULL, tg, tu, dout + lo, gate + lo, up + lo, 0, m);
        for (size_t i = 0; i < m; i++) {
            dgate_b[lo + i] = mt_cpu_f32_to_bf16(tg[i]);
            dup_b[lo + i] = mt_cpu_f32_to_bf16(tu[i]);
        }
    }
}

/* one read of gate, up, dout per chunk (mt_ops.h swiglu_backward_act_bf16):
 * bwd_range over mt_cpu_swiglu_backward_bf16's chunks also gives act, whose
 * 8-wide groups start where fwd_range's do in mt_cpu_swiglu_forward_bf16
 * (each chunk's first element): the three are those entries' bits, rounded
 * while the chunk is in cache (3 x 16 KiB of stack per thread). gate_b,
 * up_b: gate and up stored bf16 instead (the *_gu entry), widened per chunk
 * (exact) into two more stack buffers. */
static void bwd_act_chunks(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout, const float *gate,
                           const float *up, const uint16_t *dout_b, const uint16_t *gate_b, const uint16_t *up_b,
                           size_t n, size_t F, size_t ldo);

void mt_cpu_swiglu_backward_act_bf16(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout,
                                     const float *gate, const float *up, size_t n)
{
    bwd_act_chunks(act_b, dgate_b, dup_b, dout, gate, up, NULL, NULL, NULL, n, 0, 0);
}

/* gate and up stored bf16 (mt_ops.h *_bf16_gu): each chunk widened (exact)
 * into stack buffers, then the fp32 entries' chunk code: their expressions */
static void widen_chunk(float *dst, const uint16_t *src, size_t m)
{
    for (size_t i = 0; i < m; i++) dst[i] = mt_cpu_bf16_to_f32(src[i]);
}

void mt_cpu_swiglu_forward_bf16_gu(uint16_t *out_bf16, const uint16_t *gate, const uint16_t *up, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++) {
        const size_t lo = c * CHUNK, m = (c + 1) * CHUNK < n ? CHUNK : n - lo;
        float tg[CHUNK], tu[CHUNK], o[CHUNK];
        widen_chunk(tg, gate + lo, m);
        widen_chunk(tu, up + lo, m);
        fwd_range(o, tg, tu, 0, m);
        for (size_t i = 0; i < m; i++) out_bf16[lo + i] = mt_cpu_f32_to_bf16(o[i]);
    }
}

void mt_cpu_swiglu_backward_act_bf16_gu(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout,
                                        const uint16_t *gate, const uint16_t *up, size_t n)
{
    bwd_act_chunks(act_b, dgate_b, dup_b, dout, NULL, NULL, NULL, gate, up, n, 0, 0);
}

void mt_cpu_swiglu_backward_act_bf16_gud(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const uint16_t *dout,
                                         const uint16_t *gate, const uint16_t *up, size_t n, size_t F, size_t ldo)
{
    bwd_act_chunks(act_b, dgate_b, dup_b, NULL, NULL, NULL, dout, gate, up, n, F, ldo);
}

static void bwd_act_chunks(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout, const float *gate,
                           const float *up, const uint16_t *dout_b, const uint16_t *gate_b, const uint16_t *up_b,
                           size_t n, size_t F, size_t ldo)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static) if (n > 16384)
    for (size_t c = 0; c < nc; c++) {
        const size_t lo = c * CHUNK, m = (c + 1) * CHUNK < n ? CHUNK : n - lo;
        float g[CHUNK], u[CHUNK], d[CHUNK], ta[CHUNK], tg[CHUNK], tu[CHUNK];
        const float *gc = gate ? gate + lo : g, *uc = up ? up + lo : u, *dc = dout ? dout + lo : d;
        if (!gate) {
            widen_chunk(g, gate_b + lo, m);
            widen_chunk(u, up_b + lo, m);
        }
        if (!dout) widen_chunk(d, dout_b + lo, m);
        bwd_range(ta, tg, tu, dc, gc, uc, 0, m);
        for (size_t i = 0; i < m; i++) {
            const size_t e = lo + i, o = ldo ? (e / F) * ldo + e % F : e;   /* dg, du: rows ldo apart */
            act_b[e] = mt_cpu_f32_to_bf16(ta[i]);
            dgate_b[o] = mt_cpu_f32_to_bf16(tg[i]);
            dup_b[o] = mt_cpu_f32_to_bf16(tu[i]);
        }
    }
}

/* ReDo scores (mt_ops.h redo_score_acc): each term is a function of its
 * element alone and the sums are integers, so the column split over
 * threads cannot change a bit. */
void mt_cpu_redo_score_acc(int64_t *acc, const float *act, size_t rows, int F)
{
    #pragma omp parallel for schedule(static) if (rows * (size_t)F > 65536)
    for (int j = 0; j < F; j++) {
        int64_t s = 0;
        for (size_t i = 0; i < rows; i++) s += mt_redo_fix(act[i * (size_t)F + (size_t)j]);
        acc[j] += s;
    }
}
