/*
 * roof.c — the startup sgemm roof: a median, not a best-of.
 *
 * Why: a single best-of-3 at one size moved between 121 and 174 GFLOP/s from
 * run to run on a shared machine (issue 18), which moved MFU by 20 points.
 * Here each size gets one untimed warm-up and `reps` timed runs; the roof is
 * the largest per-size median (a few sizes, because the best blocking of the
 * BLAS differs by size), and the receipt gets that size's min..max as the
 * spread. FLOPs of one run: 2 n^3.
 */
#include "../mt_ops.h"

#include <stdlib.h>

double mt_ops_measure_roof(const struct mt_ops_i *ops, const int *sizes, int n_sizes, int reps,
                           struct mt_ops_roof *out)
{
    struct mt_ops_roof best = {0, 0, 0, 0, reps};
    if (reps < 1) reps = 1;
    int nmax = 0;
    for (int s = 0; s < n_sizes; s++) nmax = sizes[s] > nmax ? sizes[s] : nmax;
    struct mt_ctx tmp;
    mt_ctx_init(&tmp);
    size_t elems = (size_t)nmax * (size_t)nmax;
    float *a = ops->buf_alloc(ops->be, &tmp, elems * sizeof(float), MT_BUCKET_OTHER);
    float *b = ops->buf_alloc(ops->be, &tmp, elems * sizeof(float), MT_BUCKET_OTHER);
    float *c = ops->buf_alloc(ops->be, &tmp, elems * sizeof(float), MT_BUCKET_OTHER);
    double *runs = malloc((size_t)reps * sizeof(double));
    if (a && b && c && runs && nmax > 0) {
        ops->fill(ops->be, a, 0.5f, elems);
        ops->fill(ops->be, b, 0.25f, elems);
        for (int s = 0; s < n_sizes; s++) {
            int n = sizes[s];
            if (n <= 0) continue;
            ops->gemm(ops->be, 0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up: pages, BLAS buffers */
            ops->sync(ops->be);
            for (int r = 0; r < reps; r++) {
                double t0 = mt_time_sec();
                ops->gemm(ops->be, 0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
                ops->sync(ops->be);
                double dt = mt_time_sec() - t0;
                runs[r] = dt > 0 ? 2.0 * n * (double)n * n / dt : 0;
            }
            double med = mt_sort_median(runs, reps);   /* runs sorted: [0] min, [reps-1] max */
            if (med > best.flops) {
                best.flops = med;
                best.lo = runs[0];
                best.hi = runs[reps - 1];
                best.size = n;
            }
        }
    }
    free(runs);
    ops->buf_free(ops->be, &tmp, a);
    ops->buf_free(ops->be, &tmp, b);
    ops->buf_free(ops->be, &tmp, c);
    best.runs = reps;
    if (out) *out = best;
    return best.flops;
}
