/* bench/attn_bench.c — attention forward+backward kernel time on one shape
 * (default config (a): B=8 T=256 H=4 K=2 hd=64), median of REPS, through the
 * cpu ops table. Usage: attn_bench [B T H K hd REPS]. MT_NO_AVX512=1 forces
 * the AVX2 kernels. Not a test. */
#include <stdio.h>
#include <stdlib.h>
#include "../src/ops/mt_ops.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int B = 8, T = 256, H = 4, K = 2, hd = 64, reps = 9;
    if (argc >= 7) {
        B = atoi(argv[1]); T = atoi(argv[2]); H = atoi(argv[3]); K = atoi(argv[4]);
        hd = atoi(argv[5]); reps = atoi(argv[6]);
    }
    const struct mt_ops_i *ops = mt_ops_cpu();
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd;
    float *q = malloc(nq * 4), *o = malloc(nq * 4), *dq = malloc(nq * 4), *g = malloc(nq * 4);
    float *k = malloc(nk * 4), *v = malloc(nk * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    float *lse = malloc((size_t)B * H * T * 4);
    srand(1);
    for (size_t i = 0; i < nq; i++) { q[i] = rand() / (float)RAND_MAX - 0.5f; g[i] = rand() / (float)RAND_MAX - 0.5f; }
    for (size_t i = 0; i < nk; i++) { k[i] = rand() / (float)RAND_MAX - 0.5f; v[i] = rand() / (float)RAND_MAX - 0.5f; }
    double *tf = malloc(reps * sizeof(double)), *tb = malloc(reps * sizeof(double));
    for (int r = -1; r < reps; r++) {
        double t0 = mt_time_sec();
        ops->attention_forward(ops->be, o, lse, q, k, v, B, T, T, 0, H, K, hd);
        double t1 = mt_time_sec();
        ops->attention_backward(ops->be, dq, dk, dv, g, q, k, v, o, lse, B, T, H, K, hd);
        double t2 = mt_time_sec();
        if (r >= 0) { tf[r] = t1 - t0; tb[r] = t2 - t1; }
    }
    qsort(tf, reps, sizeof(double), cmp);
    qsort(tb, reps, sizeof(double), cmp);
    double flop = 4.0 * B * H * (double)T * T / 2 * hd;   /* causal: half of QK^T and PV */
    printf("isa %s  fwd %.3f ms (%.1f GFLOP/s)  bwd %.3f ms (%.1f GFLOP/s)  [min fwd %.3f bwd %.3f]  checksum %.6g\n",
           mt_ops_cpu_isa(), tf[reps / 2] * 1e3, flop / tf[reps / 2] / 1e9, tb[reps / 2] * 1e3,
           2.5 * flop / tb[reps / 2] / 1e9, tf[0] * 1e3, tb[0] * 1e3, (double)dq[7] + dk[5] + o[3]);
    return 0;
}
