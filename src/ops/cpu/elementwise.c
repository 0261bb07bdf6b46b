/*
 * elementwise.c — fill, axpby, sumsq, all_finite, transpose (cpu backend).
 *
 * Invariant: every reduction (sumsq, all_finite) combines fixed blocks in a
 * fixed order, so its result does not depend on the thread count.
 */
#include "cpu_impl.h"

#include <string.h>

#define SUMSQ_BLOCKS 64  /* fixed partial count: thread-count independent */

void mt_cpu_fill(float *x, float value, size_t n)
{
    if (value == 0.0f) {
        memset(x, 0, n * sizeof(float));
        return;
    }
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* y = a*x + b*y; x == NULL: y = b*y. b == 0 does not read y (BLAS rule). */
void mt_cpu_axpby(float *y, const float *x, float a, float b, size_t n)
{
    if (!x) {
        if (b == 0.0f) {
            memset(y, 0, n * sizeof(float));
            return;
        }
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) y[i] = b * y[i];
    } else if (b == 0.0f) {
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) y[i] = a * x[i];
    } else {
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) y[i] = a * x[i] + b * y[i];
    }
}

/* sum x_i^2 in double: SUMSQ_BLOCKS contiguous blocks, each summed in order
 * (4 double lanes), then the block sums added in block order. */
double mt_cpu_sumsq(const float *x, size_t n)
{
    double part[SUMSQ_BLOCKS];
    size_t bs = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++) {
        size_t lo = (size_t)blk * bs, hi = lo + bs;
        if (lo > n) lo = n;
        if (hi > n) hi = n;
        double s = 0.0;
        #pragma omp simd reduction(+:s)
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[blk] = s;
    }
    double tot = 0.0;
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++) tot += part[blk];
    return tot;
}

/* finite <=> exponent bits not all ones. */
int mt_cpu_all_finite(const float *x, size_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    #pragma omp parallel for schedule(static) reduction(|:bad) if (n > 65536)
    for (size_t i = 0; i < n; i++) bad |= ((u[i] & 0x7f800000u) == 0x7f800000u);
    return bad ? 0 : 1;
}

/* out (cols, rows) = in (rows, cols)^T, 32x32 tiles. */
void mt_cpu_transpose(float *out, const float *in, int rows, int cols)
{
    enum { TB = 32 };
    int nrb = (rows + TB - 1) / TB;
    #pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)cols > 16384)
    for (int rb = 0; rb < nrb; rb++) {
        int r0 = rb * TB, r1 = r0 + TB < rows ? r0 + TB : rows;
        for (int c0 = 0; c0 < cols; c0 += TB) {
            int c1 = c0 + TB < cols ? c0 + TB : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    out[(size_t)c * (size_t)rows + (size_t)r] = in[(size_t)r * (size_t)cols + (size_t)c];
        }
    }
}
