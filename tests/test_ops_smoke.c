/*
 * test_ops_smoke.c — cpu-kernel checks that the op harness (test_ops.c) does
 * not reach: attention over several key/query tiles (T > 64, online-softmax
 * rescaling across tiles, hd not a multiple of 32, GQA, KV-cache decode),
 * and xent at the real vocab width V = 50304 with softcap and in place.
 * References are naive double-precision implementations. Exits 1 on failure.
 * Run with MT_SMOKE_BENCH=1 to also print kernel timings.
 */
#include "ops/mt_ops.h"
#include "core/mt_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mt_test.h"

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void check(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (!(e <= worst)) worst = e;  /* NaN-safe */
    }
    int ok = worst <= tol;
    printf("%-60s %.3e %s\n", what, worst, ok ? "PASS" : "FAIL");
    n_fail += !ok;
}

/* naive causal GQA attention in double: forward (out, lse) and backward. */
static void ref_attention(double *out, double *lse, double *dq, double *dk, double *dv,
                          const float *q, const float *k, const float *v, const float *dout,
                          int B, int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    double scale = 1.0 / sqrt((double)hd);
    double *P = malloc(sizeof(double) * (size_t)Tk);
    double *dP = malloc(sizeof(double) * (size_t)Tk);
    if (dq) {
        memset(dq, 0, sizeof(double) * (size_t)B * Tq * H * hd);
        memset(dk, 0, sizeof(double) * (size_t)B * Tk * K * hd);
        memset(dv, 0, sizeof(double) * (size_t)B * Tk * K * hd);
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / K);
            for (int i = 0; i < Tq; i++) {
                int nk = q_pos0 + i + 1 < Tk ? q_pos0 + i + 1 : Tk;
                const float *qi = q + (((size_t)b * Tq + i) * H + h) * hd;
                double mx = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    const float *kj = k + (((size_t)b * Tk + j) * K + kh) * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)qi[d] * kj[d];
                    P[j] = s * scale;
                    if (P[j] > mx) mx = P[j];
                }
                double sum = 0;
                for (int j = 0; j < nk; j++) sum += exp(P[j] - mx);
                double l = mx + log(sum);
                lse[((size_t)b * H + h) * Tq + i] = l;
                double *oi = out + (((size_t)b * Tq + i) * H + h) * hd;
                for (int d = 0; d < hd; d++) oi[d] = 0;
                for (int j = 0; j < nk; j++) {
                    P[j] = exp(P[j] - l);
                    const float *vj = v + (((size_t)b * Tk + j) * K + kh) * hd;
                    for (int d = 0; d < hd; d++) oi[d] += P[j] * vj[d];
                }
                if (!dq) continue;
                const float *gi = dout + (((size_t)b * Tq + i) * H + h) * hd;
                double D = 0;
                for (int d = 0; d < hd; d++) D += (double)gi[d] * oi[d];
                for (int j = 0; j < nk; j++) {
                    const float *vj = v + (((size_t)b * Tk + j) * K + kh) * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)gi[d] * vj[d];
                    dP[j] = P[j] * (s - D) * scale;   /* dS * scale */
                }
                double *dqi = dq + (((size_t)b * Tq + i) * H + h) * hd;
                for (int j = 0; j < nk; j++) {
                    const float *kj = k + (((size_t)b * Tk + j) * K + kh) * hd;
                    double *dkj = dk + (((size_t)b * Tk + j) * K + kh) * hd;
                    double *dvj = dv + (((size_t)b * Tk + j) * K + kh) * hd;
                    for (int d = 0; d < hd; d++) {
                        dqi[d] += dP[j] * kj[d];
                        dkj[d] += dP[j] * qi[d];
                        dvj[d] += P[j] * gi[d];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

static void test_attention(const struct mt_ops_i *ops, int B, int T, int H, int K, int hd, int decode)
{
    unsigned s = 1234u + (unsigned)(T * 7 + hd);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *g = malloc(nq * 4);
    float *o = malloc(nq * 4), *lse = malloc((size_t)B * H * T * 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    double *ro = malloc(nq * 8), *rl = malloc((size_t)B * H * T * 8);
    double *rdq = malloc(nq * 8), *rdk = malloc(nk * 8), *rdv = malloc(nk * 8);
    for (size_t i = 0; i < nq; i++) { q[i] = 2.0f * frand(&s); g[i] = frand(&s); }
    for (size_t i = 0; i < nk; i++) { k[i] = 2.0f * frand(&s); v[i] = frand(&s); }
    char name[128];
    if (!decode) {
        ops->attention_forward(ops->be, o, lse, q, k, v, B, T, T, 0, H, K, hd);
        ops->attention_backward(ops->be, dq, dk, dv, g, q, k, v, o, lse, B, T, H, K, hd);
        ref_attention(ro, rl, rdq, rdk, rdv, q, k, v, g, B, T, T, 0, H, K, hd);
        snprintf(name, sizeof(name), "attention B=%d T=%d H=%d K=%d hd=%d out", B, T, H, K, hd);
        check(name, o, ro, nq, 1e-5);
        snprintf(name, sizeof(name), "attention B=%d T=%d H=%d K=%d hd=%d lse", B, T, H, K, hd);
        check(name, lse, rl, (size_t)B * H * T, 1e-5);
        snprintf(name, sizeof(name), "attention B=%d T=%d H=%d K=%d hd=%d dq", B, T, H, K, hd);
        check(name, dq, rdq, nq, 1e-4);
        snprintf(name, sizeof(name), "attention B=%d T=%d H=%d K=%d hd=%d dk", B, T, H, K, hd);
        check(name, dk, rdk, nk, 1e-4);
        snprintf(name, sizeof(name), "attention B=%d T=%d H=%d K=%d hd=%d dv", B, T, H, K, hd);
        check(name, dv, rdv, nk, 1e-4);
    } else {
        /* decode the last `decode` queries against the full cache */
        int Tq = decode, pos0 = T - decode;
        float *qd = malloc((size_t)B * Tq * H * hd * 4);
        for (int b = 0; b < B; b++)
            memcpy(qd + (size_t)b * Tq * H * hd, q + ((size_t)b * T + pos0) * H * hd, (size_t)Tq * H * hd * 4);
        ops->attention_forward(ops->be, o, lse, qd, k, v, B, Tq, T, pos0, H, K, hd);
        ref_attention(ro, rl, NULL, NULL, NULL, qd, k, v, NULL, B, Tq, T, pos0, H, K, hd);
        snprintf(name, sizeof(name), "attention decode B=%d Tk=%d Tq=%d H=%d K=%d hd=%d out", B, T, Tq, H, K, hd);
        check(name, o, ro, (size_t)B * Tq * H * hd, 1e-5);
        snprintf(name, sizeof(name), "attention decode B=%d Tk=%d Tq=%d H=%d K=%d hd=%d lse", B, T, Tq, H, K, hd);
        check(name, lse, rl, (size_t)B * H * Tq, 1e-5);
        free(qd);
    }
    free(q); free(k); free(v); free(g); free(o); free(lse); free(dq); free(dk); free(dv);
    free(ro); free(rl); free(rdq); free(rdk); free(rdv);
}

static void test_xent(const struct mt_ops_i *ops, int N, int V, float softcap)
{
    unsigned s = 99u;
    size_t n = (size_t)N * V;
    float *z = malloc(n * 4), *loss = malloc((size_t)N * 4), *lse = malloc((size_t)N * 4);
    double *rl = malloc((size_t)N * 8), *rd = malloc(n * 8);
    int32_t *t = malloc((size_t)N * 4);
    for (size_t i = 0; i < n; i++) z[i] = 6.0f * frand(&s);
    for (int i = 0; i < N; i++) t[i] = i == 1 ? -1 : (int32_t)((unsigned)(i * 7919) % (unsigned)V);
    float dscale = 1.0f / (float)N;
    for (int r = 0; r < N; r++) {
        const float *zr = z + (size_t)r * V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) {
            double sv = softcap > 0 ? softcap * tanh(zr[v] / (double)softcap) : zr[v];
            if (sv > mx) mx = sv;
        }
        for (int v = 0; v < V; v++) {
            double sv = softcap > 0 ? softcap * tanh(zr[v] / (double)softcap) : zr[v];
            sum += exp(sv - mx);
        }
        double l = mx + log(sum);
        double st = t[r] < 0 ? 0 : (softcap > 0 ? softcap * tanh(zr[t[r]] / (double)softcap) : zr[t[r]]);
        rl[r] = t[r] < 0 ? 0.0 : l - st;
        for (int v = 0; v < V; v++) {
            double th = softcap > 0 ? tanh(zr[v] / (double)softcap) : 0;
            double sv = softcap > 0 ? softcap * th : zr[v];
            double dsdz = softcap > 0 ? 1 - th * th : 1;
            rd[(size_t)r * V + v] = t[r] < 0 ? 0 : dscale * (exp(sv - l) - (v == t[r])) * dsdz;
        }
    }
    char name[128];
    ops->xent_forward(ops->be, loss, lse, z, t, N, V, softcap);
    snprintf(name, sizeof(name), "xent N=%d V=%d softcap=%g losses", N, V, softcap);
    check(name, loss, rl, (size_t)N, 1e-5);
    ops->xent_backward(ops->be, z, z, lse, t, dscale, N, V, softcap);  /* in place */
    snprintf(name, sizeof(name), "xent N=%d V=%d softcap=%g dlogits in place", N, V, softcap);
    check(name, z, rd, n, 1e-6);
    free(z); free(loss); free(lse); free(rl); free(rd); free(t);
}

static void bench(const struct mt_ops_i *ops)
{
    /* GPT-2 small shapes: B=4, T=1024, H=K=12, hd=64; lm head N=4096, V=50304 */
    int B = 4, T = 1024, H = 12, hd = 64, N = B * T, V = 50304;
    size_t nq = (size_t)B * T * H * hd;
    float *q = calloc(nq, 4), *k = calloc(nq, 4), *v = calloc(nq, 4), *o = calloc(nq, 4), *g = calloc(nq, 4);
    float *dq = calloc(nq, 4), *dk = calloc(nq, 4), *dv = calloc(nq, 4), *lse = calloc((size_t)B * H * T, 4);
    unsigned s = 5u;
    for (size_t i = 0; i < nq; i++) { q[i] = frand(&s); k[i] = frand(&s); v[i] = frand(&s); g[i] = frand(&s); }
    double t0 = mt_time_sec();
    ops->attention_forward(ops->be, o, lse, q, k, v, B, T, T, 0, H, H, hd);
    double t1 = mt_time_sec();
    ops->attention_backward(ops->be, dq, dk, dv, g, q, k, v, o, lse, B, T, H, H, hd);
    double t2 = mt_time_sec();
    double fl = 4.0 * B * H * (double)T * T / 2 * hd;  /* causal: half of 4 T^2 hd */
    printf("bench attention fwd %.3f s (%.1f GFLOP/s)  bwd %.3f s (%.1f GFLOP/s)\n", t1 - t0,
           fl / (t1 - t0) * 1e-9, t2 - t1, 2.5 * fl / (t2 - t1) * 1e-9);
    free(q); free(k); free(v); free(o); free(g); free(dq); free(dk); free(dv); free(lse);
    float *z = calloc((size_t)N * V, 4), *loss = calloc((size_t)N, 4), *l2 = calloc((size_t)N, 4);
    int32_t *t = calloc((size_t)N, 4);
    for (size_t i = 0; i < (size_t)N * V; i++) z[i] = frand(&s);
    t0 = mt_time_sec();
    ops->xent_forward(ops->be, loss, l2, z, t, N, V, 0.0f);
    t1 = mt_time_sec();
    ops->xent_backward(ops->be, z, z, l2, t, 1.0f / N, N, V, 0.0f);
    t2 = mt_time_sec();
    double lm = 2.0 * N * V * 768.0 * 3;
    printf("bench xent N=%d V=%d fwd %.3f s bwd %.3f s (lm-head gemm fwd+bwd = %.1f GFLOP)\n", N, V, t1 - t0,
           t2 - t1, lm * 1e-9);
    size_t n = (size_t)N * 3072;
    float *a = realloc(z, n * 4 * 3);
    t0 = mt_time_sec();
    ops->swiglu_forward(ops->be, a, a + n, a + 2 * n, n);
    t1 = mt_time_sec();
    ops->swiglu_backward(ops->be, a, a + n, a + 2 * n, a, a + n, n);
    t2 = mt_time_sec();
    printf("bench swiglu n=%zu fwd %.4f s bwd %.4f s\n", n, t1 - t0, t2 - t1);
    free(a); free(loss); free(l2); free(t);
}

int main(void)
{
    const struct mt_ops_i *ops = mt_ops_cpu();
    test_attention(ops, 1, 150, 4, 2, 64, 0);
    test_attention(ops, 2, 97, 2, 1, 80, 0);
    test_attention(ops, 1, 130, 2, 2, 128, 0);
    test_attention(ops, 1, 70, 3, 3, 12, 0);
    test_attention(ops, 1, 150, 4, 2, 64, 1);
    test_attention(ops, 2, 150, 4, 1, 32, 40);
    test_xent(ops, 4, 50304, 0.0f);
    test_xent(ops, 3, 50304, 30.0f);
    test_xent(ops, 3, 1003, 0.0f);
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    printf("info: blas='%s' coretype='%s' source='%s' threads=%d\n", info.blas, info.coretype,
           info.coretype_source, info.threads);
    EXPECT(strncmp(info.blas, "OpenBLAS", 8) == 0 && info.coretype[0], "blas '%s', coretype '%s'", info.blas,
           info.coretype);
    char why[64] = "";
    const struct mt_ops_i *cu = mt_ops_cuda(why, sizeof(why));
    printf("cuda: %p (%s)\n", (const void *)cu, why);
    if (getenv("MT_SMOKE_BENCH")) bench(ops);
    printf("test_ops_smoke: %s\n", n_fail ? "FAIL" : "PASS");
    return n_fail ? 1 : 0;
}
