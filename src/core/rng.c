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
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t mt_rng_stream(const char *name)
{
    return (uint64_t)XXH64(name, strlen(name), 0);
}

double mt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
{
    uint64_t bits = mt_rng_splitmix64(seed ^ mt_rng_splitmix64(stream + counter));
    /* top 53 bits -> (0, 1]: never 0, so log() in Box–Muller is finite */
    return ((double)(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Box–Muller, cosine branch: z = sqrt(-2 ln u1) cos(2 pi u2) */
double mt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    double u1 = mt_rng_uniform(seed, stream, 2 * index);
    double u2 = mt_rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
