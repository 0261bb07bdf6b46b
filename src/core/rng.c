/*
 * rng.c — counter-based generator: a value is a pure function of
 * (seed, stream, counter), see mt_rng.h. No state, so any slice of a
 * parameter can be materialised on its own and match the full tensor.
 */
#include "mt_rng.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

uint64_t mt_rng_splitmix64(uint64_t x)
{
    return mt_rng_splitmix64_inline(x);
}

uint64_t mt_rng_stream(const char *name)
{
    return (uint64_t)XXH64(name, strlen(name), 0);
}

double mt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
{
    return mt_rng_uniform_inline(seed, stream, counter);
}

/* Box–Muller, cosine branch: z = sqrt(-2 ln u1) cos(2 pi u2) */
double mt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    double u1 = mt_rng_uniform(seed, stream, 2 * index);
    double u2 = mt_rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
