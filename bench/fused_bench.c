/* bench/fused_bench.c — the fused elementwise chains against the unfused ops
 * they replace, per layer of config (a) (default B=8 T=256 D=256 H=4 K=2
 * hd=64), through the cpu ops table, in ONE process with the variants
 * interleaved rep by rep (a noisy shared machine hits both alike):
 *   resid   rmsnorm_forward + copy (the residual seed)   vs rmsnorm_resid_forward
 *   qk fwd  rmsnorm_forward x2 + rope_forward x2          vs qk_norm_rope_forward
 *   qk bwd  rope_backward x2 + rmsnorm_backward x2        vs qk_norm_rope_backward
 * Prints the median ms of each and the ratio unfused/fused, and checks that
 * both give the same bits (one more call of each from the same inputs). Under callgrind (REPS 1) the per-chain
 * instruction counts come from callgrind_annotate on the chain_* functions.
 * Build: gcc -O2 -fopenmp -Isrc bench/fused_bench.c build/libmeshtrain_lib.a
 *        -lopenblas -lcjson -lxxhash -lm -o fused_bench
 * Usage: fused_bench [REPS [B T D H K hd]]. Not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../src/ops/mt_ops.h"

static const struct mt_ops_i *ops;
static int B = 8, T = 256, D = 256, H = 4, K = 2, hd = 64;
static float *x, *w, *h1, *h2, *r1, *r2, *res1, *res2;             /* resid chain (N, D) */
static float *qr, *kr, *wq, *wk, *q1, *k1, *q2, *k2, *rq, *rk;     /* qk chain */
static float *cs, *sn, *gq, *gk, *gq1, *gk1, *gq2, *gk2, *dq1, *dk1, *dq2, *dk2, *dw1, *dw2;

static int cmp(const void *a, const void *b)
{
    double p = *(const double *)a, q = *(const double *)b;
    return (p > q) - (p < q);
}
static float *rnd(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
    return p;
}

/* noinline: callgrind attributes each chain's instructions to one function */
__attribute__((noinline)) static void chain_resid_unfused(void)
{
    int N = B * T;
    ops->rmsnorm_forward(ops->be, h1, r1, x, w, N, D, 1e-6f);
    ops->copy(ops->be, res1, x, (size_t)N * D * sizeof(float));
}
__attribute__((noinline)) static void chain_resid_fused(void)
{
    ops->rmsnorm_resid_forward(ops->be, h2, r2, res2, x, w, B * T, D, 1e-6f);
}
__attribute__((noinline)) static void chain_qkf_unfused(void)
{
    int N = B * T;
    ops->rmsnorm_forward(ops->be, q1, rq, qr, wq, N * H, hd, 1e-6f);
    ops->rmsnorm_forward(ops->be, k1, rk, kr, wk, N * K, hd, 1e-6f);
    ops->rope_forward(ops->be, q1, q1, cs, sn, N, T, 0, H, hd);
    ops->rope_forward(ops->be, k1, k1, cs, sn, N, T, 0, K, hd);
}
__attribute__((noinline)) static void chain_qkf_fused(void)
{
    ops->qk_norm_rope_forward(ops->be, q2, k2, rq, rk, qr, kr, wq, wk, cs, sn, B * T, T, 0, H, K, hd, 1e-6f);
}
__attribute__((noinline)) static void chain_qkb_unfused(void)
{
    int N = B * T;
    ops->rope_backward(ops->be, gq1, gq1, cs, sn, N, T, 0, H, hd);   /* in place, as the model ran it */
    ops->rope_backward(ops->be, gk1, gk1, cs, sn, N, T, 0, K, hd);
    ops->rmsnorm_backward(ops->be, dq1, dw1, gq1, qr, wq, rq, N * H, hd, 0);
    ops->rmsnorm_backward(ops->be, dk1, dw1 + hd, gk1, kr, wk, rk, N * K, hd, 0);
}
__attribute__((noinline)) static void chain_qkb_fused(void)
{
    ops->qk_norm_rope_backward(ops->be, dq2, dk2, dw2, dw2 + hd, gq2, gk2, qr, kr, wq, wk, rq, rk, cs, sn, B * T, T, H, K, hd);
}

int main(int argc, char **argv)
{
    int reps = argc >= 2 ? atoi(argv[1]) : 21;
    if (argc >= 9) {
        B = atoi(argv[2]); T = atoi(argv[3]); D = atoi(argv[4]); H = atoi(argv[5]); K = atoi(argv[6]);
        hd = atoi(argv[7]);
    }
    if (reps < 1) reps = 1;
    ops = mt_ops_cpu();
    size_t N = (size_t)B * T, nx = N * D, nq = N * H * hd, nk = N * K * hd, half = hd / 2;
    srand(1);
    x = rnd(nx, -2, 2); w = rnd(D, 0.5f, 1.5f);
    h1 = rnd(nx, 0, 0); h2 = rnd(nx, 0, 0); res1 = rnd(nx, 0, 0); res2 = rnd(nx, 0, 0);
    r1 = rnd(N, 0, 0); r2 = rnd(N, 0, 0);
    qr = rnd(nq, -2, 2); kr = rnd(nk, -2, 2); wq = rnd(hd, 0.5f, 1.5f); wk = rnd(hd, 0.5f, 1.5f);
    q1 = rnd(nq, 0, 0); q2 = rnd(nq, 0, 0); k1 = rnd(nk, 0, 0); k2 = rnd(nk, 0, 0);
    rq = rnd(N * H, 0, 0); rk = rnd(N * K, 0, 0);
    cs = rnd((size_t)T * half, -1, 1); sn = rnd((size_t)T * half, -1, 1);
    gq = rnd(nq, -1, 1); gk = rnd(nk, -1, 1);
    gq1 = rnd(nq, 0, 0); gk1 = rnd(nk, 0, 0); gq2 = rnd(nq, 0, 0); gk2 = rnd(nk, 0, 0);
    dq1 = rnd(nq, 0, 0); dq2 = rnd(nq, 0, 0); dk1 = rnd(nk, 0, 0); dk2 = rnd(nk, 0, 0);
    dw1 = calloc(2 * (size_t)hd, sizeof(float)); dw2 = calloc(2 * (size_t)hd, sizeof(float));

    void (*const fn[6])(void) = {chain_resid_unfused, chain_resid_fused, chain_qkf_unfused, chain_qkf_fused,
                                 chain_qkb_unfused, chain_qkb_fused};
    const char *name[3] = {"resid (norm + residual seed)", "qk_norm + rope fwd", "qk_norm + rope bwd"};
    double *t = malloc(6 * (size_t)reps * sizeof(double));
    for (int r = -1; r < reps; r++)      /* rep -1: warm-up */
        for (int f = 0; f < 6; f++) {
            int g = r & 1 ? f ^ 1 : f;   /* alternate which variant of a pair runs first */
            double t0 = mt_time_sec();
            fn[g]();
            if (r >= 0) t[(size_t)g * reps + r] = mt_time_sec() - t0;
        }
    /* same bits: once more each from the same inputs (the backward rotates dq, dk in place) */
    memcpy(gq1, gq, nq * 4); memcpy(gk1, gk, nk * 4); memcpy(gq2, gq, nq * 4); memcpy(gk2, gk, nk * 4);
    memset(dw1, 0, 2 * (size_t)hd * 4); memset(dw2, 0, 2 * (size_t)hd * 4);
    for (int f = 0; f < 6; f++) fn[f]();
    size_t bad = 0;
    bad += memcmp(gq1, gq2, nq * 4) != 0; bad += memcmp(gk1, gk2, nk * 4) != 0;
    bad += memcmp(h1, h2, nx * 4) != 0; bad += memcmp(res1, res2, nx * 4) != 0; bad += memcmp(r1, r2, N * 4) != 0;
    bad += memcmp(q1, q2, nq * 4) != 0; bad += memcmp(k1, k2, nk * 4) != 0;
    bad += memcmp(dq1, dq2, nq * 4) != 0; bad += memcmp(dk1, dk2, nk * 4) != 0;
    bad += memcmp(dw1, dw2, 2 * (size_t)hd * 4) != 0;
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    printf("B=%d T=%d D=%d H=%d K=%d hd=%d threads=%d reps=%d isa=%s  outputs %s\n", B, T, D, H, K, hd,
           info.threads, reps, mt_ops_cpu_isa(), bad ? "DIFFER" : "bit-identical");
    printf("| chain | unfused ms | fused ms | unfused/fused |\n| --- | ---: | ---: | ---: |\n");
    for (int c = 0; c < 3; c++) {
        double *u = t + (size_t)(2 * c) * reps, *f = t + (size_t)(2 * c + 1) * reps;
        qsort(u, reps, sizeof(double), cmp);
        qsort(f, reps, sizeof(double), cmp);
        printf("| %s | %.3f | %.3f | %.2f |\n", name[c], u[reps / 2] * 1e3, f[reps / 2] * 1e3, u[reps / 2] / f[reps / 2]);
    }
    return bad ? 1 : 0;
}
