/*
 * mt_rng.h — counter-based random numbers for mesh-independent init.
 *
 * SPEC.md: "The value of element e of parameter p depends only on (seed, p's
 * name, e's global index)". There is no generator state to advance: a value is
 * a pure function of (seed, stream, counter), so a rank can materialise only
 * the slice it owns and still get the bits the single-rank run gets.
 *
 *   stream  = xxh64(parameter name)            (mt_rng_stream)
 *   u(c)    = splitmix64(seed ^ splitmix64(stream + c)) -> 53-bit uniform (0,1]
 *   normal(seed, stream, e) = Box–Muller on u(2e), u(2e+1), cosine branch
 *
 * Normals are computed in double and rounded to float once.
 */
#ifndef MT_RNG_H
#define MT_RNG_H

#include <stdint.h>

/* The generator's arithmetic, one definition for the host (rng.c) and the
 * device (the cuda backend's init_normal kernel, src/ops/cuda/init.cu): a
 * uniform is integer work and one exact scaling, so both sides get its bits. */
#if defined(__CUDACC__)
#define MT_RNG_INLINE static inline __host__ __device__
#else
#define MT_RNG_INLINE static inline
#endif
MT_RNG_INLINE uint64_t mt_rng_splitmix64_inline(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
/* top 53 bits -> (0, 1]: never 0, so log() in Box–Muller is finite */
MT_RNG_INLINE double mt_rng_uniform_inline(uint64_t seed, uint64_t stream, uint64_t counter)
{
    const uint64_t bits = mt_rng_splitmix64_inline(seed ^ mt_rng_splitmix64_inline(stream + counter));
    return ((double)(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* the global index (the counter of mt_rng_normal) of element (i, j) of a box at
 * (off0, off1) in a global (., shape1) tensor (mt_param.h: the owned box) */
MT_RNG_INLINE uint64_t mt_rng_box_index(int64_t off0, int64_t off1, int64_t shape1, int64_t i, int64_t j)
{
    return (uint64_t)(off0 + i) * (uint64_t)shape1 + (uint64_t)(off1 + j);
}

uint64_t mt_rng_splitmix64(uint64_t x);
uint64_t mt_rng_stream(const char *name);                 /* xxh64 of the name, seed 0 */
double   mt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter); /* in (0, 1] */
double   mt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);   /* N(0,1) */

#endif /* MT_RNG_H */
