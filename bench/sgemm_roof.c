/*
 * sgemm_roof.c — measure the OpenBLAS sgemm roof that MFU is compared with.
 *
 * Runs square row-major cblas_sgemm (C = A B) at n = 2048, 3072, 4096 on the
 * requested thread count (default 2), best of `reps` runs per size, and
 * prints one JSON line: the best GFLOP/s over all sizes, per-size bests, and
 * the OpenBLAS core name that got loaded (set OPENBLAS_CORETYPE to compare
 * kernel sets: SKYLAKEX, COOPERLAKE, HASWELL, ...).
 *
 * Build (standalone, links the OpenMP OpenBLAS like meshtrain does):
 *   gcc -O2 -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-pthread \
 *       bench/sgemm_roof.c -o sgemm_roof \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas \
 *       -Wl,--disable-new-dtags,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp
 * or the CMake target `sgemm_roof` (bench/CMakeLists.txt).
 *
 * Usage: sgemm_roof [threads=2] [reps=5] [max_n=4096]
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps    = argc > 2 ? atoi(argv[2]) : 5;
    int max_n   = argc > 3 ? atoi(argv[3]) : 4096;
    if (threads < 1) threads = 1;
    if (reps < 1) reps = 1;
    openblas_set_num_threads(threads);

    size_t cap = (size_t)max_n * (size_t)max_n;
    float *a = malloc(cap * sizeof(float));
    float *b = malloc(cap * sizeof(float));
    float *c = malloc(cap * sizeof(float));
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_roof: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < cap; i++) {
        a[i] = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
        b[i] = (float)((i * 104729u) % 1000u) * 1e-3f - 0.5f;
        c[i] = 0.0f;
    }

    static const int sizes[] = {2048, 3072, 4096};
    double best_all = 0.0, per_size[3] = {0, 0, 0};
    int best_n = 0;
    for (int s = 0; s < 3; s++) {
        int n = sizes[s];
        if (n > max_n) break;
        /* warm-up: page in buffers, spin up the thread pool */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        for (int r = 0; r < reps; r++) {
            double t0 = now_sec();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            double dt = now_sec() - t0;
            double gf = 2.0 * (double)n * (double)n * (double)n / dt * 1e-9;
            if (gf > per_size[s]) per_size[s] = gf;
        }
        if (per_size[s] > best_all) {
            best_all = per_size[s];
            best_n = n;
        }
    }
    const char *env = getenv("OPENBLAS_CORETYPE");
    printf("{\"sgemm_gflops\": %.1f, \"best_n\": %d, \"gflops_2048\": %.1f, \"gflops_3072\": %.1f, "
           "\"gflops_4096\": %.1f, \"threads\": %d, \"reps\": %d, \"corename\": \"%s\", "
           "\"OPENBLAS_CORETYPE\": \"%s\", \"config\": \"%s\"}\n",
           best_all, best_n, per_size[0], per_size[1], per_size[2], threads, reps,
           openblas_get_corename(), env ? env : "", openblas_get_config());
    free(a);
    free(b);
    free(c);
    return 0;
}
