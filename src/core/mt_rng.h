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

uint64_t mt_rng_splitmix64(uint64_t x);
uint64_t mt_rng_stream(const char *name);                 /* xxh64 of the name, seed 0 */
double   mt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter); /* in (0, 1] */
double   mt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);   /* N(0,1) */

#endif /* MT_RNG_H */
