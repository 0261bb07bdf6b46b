/*
 * test_mamba3.c — the standalone Mamba-3 mixer (src/model/mamba3.c):
 *   1. gradient check of every parameter and of dh against central finite
 *      differences of the fp32 forward (loss = sum(R o out) summed in double),
 *      tolerance as in test_model_grad.c:
 *        |g_ana - g_fd| <= 5e-3 max(|g_ana|, |g_fd|) + 1e-3 gscale + 1e-4 (step 2e-3)
 *      (gscale = the tensor's largest |g|; a wrong term shows at ~gscale);
 *   2. the accumulation rule: a second backward doubles every parameter
 *      gradient and, with accumulate = 1, dh;
 *   3. the chunked and recurrent forward agree (chunk is a speed knob);
 *   4. with --dump DIR, writes dims, weights, input and output for the
 *      independent numpy reference tests/mamba3_ref.py (test_mamba3_ref.sh).
 * -bench times the mixer against an attention layer (not a test).
 * Shapes: D 8, H 4 heads of P 4, G 2 groups, N 6, B 2, T 11, chunk 4 (does not
 * divide T). Weights are drawn with a larger spread than the real init so
 * every path (rotary angles, decays, gates) carries gradient.
 */
#define _POSIX_C_SOURCE 199309L
#include "core/mt_core.h"
#include "model/mt_mamba3.h"
#include "ops/mt_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "mt_test.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double urand(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(float mu, float sd)
{
    double u = urand() + 1e-12, v = urand();
    return mu + sd * (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) { fprintf(stderr, "test_mamba3: out of memory\n"); exit(1); }
    return p;
}

struct fixture {
    struct mt_mamba3_dims d;
    int B, T, n;
    float *wbuf, *gbuf, *abuf, *sbuf, *h, *R, *out, *dh;
    struct mt_mamba3_weights w, g;
    struct mt_mamba3_acts a;
    struct mt_mamba3_scratch s;
};

static void setup(struct fixture *f, int chunk)
{
    struct mt_mamba3_dims d = {.D = 8, .H = 4, .P = 4, .G = 2, .N = 6, .chunk = chunk, .eps_bc = 1e-5f, .eps_out = 1e-5f};
    f->d = d;
    f->B = 2; f->T = 11; f->n = f->B * f->T;
    size_t nw = mt_mamba3_weights_floats(&d);
    f->wbuf = falloc(nw); f->gbuf = falloc(nw);
    f->abuf = falloc(mt_mamba3_acts_floats(&d, f->n));
    f->sbuf = falloc(mt_mamba3_scratch_floats(&d, f->n));
    mt_mamba3_weights_bind(&f->w, f->wbuf, &d);
    mt_mamba3_weights_bind(&f->g, f->gbuf, &d);
    mt_mamba3_acts_bind(&f->a, f->abuf, &d, f->n);
    mt_mamba3_scratch_bind(&f->s, f->sbuf, &d, f->n);
    int W = mt_mamba3_in_width(&d), E = d.H * d.P;
    for (size_t i = 0; i < (size_t)W * d.D; i++) f->w.win[i] = nrand(0.0f, 0.35f);
    for (size_t i = 0; i < (size_t)d.D * E; i++) f->w.wout[i] = nrand(0.0f, 0.35f);
    for (int h = 0; h < d.H; h++) {
        f->w.dt_bias[h] = nrand(-1.5f, 0.5f);
        f->w.A_log[h] = logf(1.0f + 3.0f * (float)urand());
        f->w.Dsk[h] = nrand(1.0f, 0.3f);
    }
    for (int k = 0; k < d.N; k++) { f->w.gB[k] = nrand(1.0f, 0.2f); f->w.gC[k] = nrand(1.0f, 0.2f); }
    for (int k = 0; k < d.H * d.N; k++) { f->w.B_bias[k] = nrand(1.0f, 0.3f); f->w.C_bias[k] = nrand(1.0f, 0.3f); }
    for (int k = 0; k < E; k++) f->w.g_out[k] = nrand(1.0f, 0.2f);
    f->h = falloc((size_t)f->n * d.D); f->R = falloc((size_t)f->n * d.D);
    f->out = falloc((size_t)f->n * d.D); f->dh = falloc((size_t)f->n * d.D);
    for (int i = 0; i < f->n * d.D; i++) { f->h[i] = nrand(0.0f, 1.0f); f->R[i] = nrand(0.0f, 1.0f); }
}

static void teardown(struct fixture *f)
{
    free(f->wbuf); free(f->gbuf); free(f->abuf); free(f->sbuf);
    free(f->h); free(f->R); free(f->out); free(f->dh);
}

static double loss(struct fixture *f, const struct mt_ops_i *ops)
{
    mt_mamba3_forward(ops, f->out, &f->a, f->h, &f->w, &f->d, f->B, f->T);
    double L = 0.0;
    for (int i = 0; i < f->n * f->d.D; i++) L += (double)f->R[i] * f->out[i];
    return L;
}

static void grad_check(struct fixture *f, const struct mt_ops_i *ops, const char *name, float *v, const float *g,
                       size_t n)
{
    double gscale = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) gscale = fmax(gscale, fabs(g[i]));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v0 = v[i], eps = 2e-3f * fmaxf(1.0f, fabsf(v0));
        v[i] = v0 + eps;
        double lp = loss(f, ops);
        v[i] = v0 - eps;
        double lm = loss(f, ops);
        v[i] = v0;
        double fd = (lp - lm) / (2.0 * (double)eps), an = g[i];
        double err = fabs(an - fd), tol = 5e-3 * fmax(fabs(an), fabs(fd)) + 1e-3 * gscale + 1e-4;
        worst = fmax(worst, err / tol);
        if (err > tol && bad++ < 3) fprintf(stderr, "  %s[%zu]: analytic %.6g fd %.6g\n", name, i, an, fd);
    }
    printf("%s mamba3 grad %-8s n=%-4zu gscale %.3g worst err/tol %.3f\n", bad ? "FAIL" : "ok  ", name, n, gscale, worst);
    n_fail += bad != 0;
}

static int dump(struct fixture *f, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/dims.txt", dir);
    FILE *fp = fopen(path, "w");
    if (!fp) { fprintf(stderr, "test_mamba3: cannot write %s\n", path); return 2; }
    fprintf(fp, "%d %d %d %d %d %d %d\n", f->d.D, f->d.H, f->d.P, f->d.G, f->d.N, f->B, f->T);
    fclose(fp);
    struct { const char *name; const float *p; size_t n; } files[] = {
        {"weights.f32", f->wbuf, mt_mamba3_weights_floats(&f->d)},
        {"h.f32", f->h, (size_t)f->n * f->d.D},
        {"out.f32", f->out, (size_t)f->n * f->d.D},
    };
    for (size_t k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k].name);
        fp = fopen(path, "wb");
        if (!fp || fwrite(files[k].p, sizeof(float), files[k].n, fp) != files[k].n) {
            fprintf(stderr, "test_mamba3: cannot write %s\n", path);
            if (fp) fclose(fp);
            return 1;
        }
        fclose(fp);
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -bench: one M mixer (config (d): D 256, expand 2, headdim 64, N 64, G 1,
 * chunk 64) against the attention part of one A block (D 256, H 4, K 2,
 * hd 64: q/k/v/o projections and the flash attention; norms and RoPE left out),
 * B 4 x T 1024, forward + backward, minimum of 3 runs. Not a test. */
static void bench(const struct mt_ops_i *ops)
{
    int B = 4, T = 1024, n = B * T, D = 256;
    struct mt_mamba3_dims d = {.D = D, .H = 8, .P = 64, .G = 1, .N = 64, .chunk = 64, .eps_bc = 1e-5f, .eps_out = 1e-5f};
    size_t nw = mt_mamba3_weights_floats(&d);
    float *wb = falloc(nw), *gb = falloc(nw), *ab = falloc(mt_mamba3_acts_floats(&d, n));
    float *sb = falloc(mt_mamba3_scratch_floats(&d, n));
    struct mt_mamba3_weights w, g;
    struct mt_mamba3_acts a;
    struct mt_mamba3_scratch s;
    mt_mamba3_weights_bind(&w, wb, &d); mt_mamba3_weights_bind(&g, gb, &d);
    mt_mamba3_acts_bind(&a, ab, &d, n); mt_mamba3_scratch_bind(&s, sb, &d, n);
    for (size_t i = 0; i < nw; i++) wb[i] = nrand(0.0f, 0.02f);
    for (int h = 0; h < d.H; h++) { w.dt_bias[h] = -3.0f; w.A_log[h] = 1.0f; w.Dsk[h] = 1.0f; }
    for (int k = 0; k < d.N; k++) w.gB[k] = w.gC[k] = 1.0f;
    float *h = falloc((size_t)n * D), *out = falloc((size_t)n * D), *dh = falloc((size_t)n * D);
    for (size_t i = 0; i < (size_t)n * D; i++) h[i] = nrand(0.0f, 1.0f);
    double tm = 1e30, tscan = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        mt_mamba3_forward(ops, out, &a, h, &w, &d, B, T);
        mt_mamba3_backward(ops, dh, 0, &g, &s, out, h, &a, &w, &d, B, T);
        tm = fmin(tm, now_s() - t0);
        t0 = now_s();
        ops->ssm_scan_forward(ops->be, a.ys, a.x, a.Bh, a.Ch, a.dt, a.lam, a.A, w.Dsk, B, T, d.H, d.P, d.N, d.chunk);
        ops->ssm_scan_backward(ops->be, s.dx, s.dBh, s.dCh, s.ddt, s.dlam, s.dA, g.Dsk, s.dys, a.x, a.Bh, a.Ch, a.dt, a.lam,
                               a.A, w.Dsk, B, T, d.H, d.P, d.N, d.chunk);
        tscan = fmin(tscan, now_s() - t0);
    }
    /* stage breakdown (same calls as mt_mamba3_forward/backward, timed one by one) */
    {
        int W = mt_mamba3_in_width(&d), E = d.H * d.P;
        double st[9];
        for (int k = 0; k < 9; k++) st[k] = 1e30;
        for (int r = 0; r < 3; r++) {
            double t[10];
            t[0] = now_s();
            ops->gemm(ops->be, 0, 1, n, W, D, 1.0f, h, D, w.win, D, 0.0f, a.proj, W);
            t[1] = now_s();
            ops->ssm_prep_forward(ops->be, a.x, a.Bh, a.Ch, a.dt, a.lam, a.A, a.rstd_bc, NULL, a.proj, w.dt_bias, w.A_log, w.gB,
                                  w.gC, w.B_bias, w.C_bias, B, T, d.H, d.P, d.G, d.N, d.eps_bc, NULL, NULL, NULL);
            t[2] = now_s();
            ops->ssm_scan_forward(ops->be, a.ys, a.x, a.Bh, a.Ch, a.dt, a.lam, a.A, w.Dsk, B, T, d.H, d.P, d.N, d.chunk);
            t[3] = now_s();
            ops->ssm_gate_norm_forward(ops->be, a.yn, a.rstd_o, a.ys, a.proj, W, w.g_out, n, E, d.G, d.eps_out);
            ops->gemm(ops->be, 0, 1, n, D, E, 1.0f, a.yn, E, w.wout, E, 0.0f, out, D);
            t[4] = now_s();
            ops->gemm(ops->be, 1, 0, D, E, n, 1.0f, out, D, a.yn, E, 1.0f, g.wout, E);
            ops->gemm(ops->be, 0, 0, n, E, D, 1.0f, out, D, w.wout, E, 0.0f, s.dyn, E);
            t[5] = now_s();
            ops->ssm_gate_norm_backward(ops->be, s.dys, s.dproj, g.g_out, s.dyn, a.ys, a.proj, W, w.g_out, a.rstd_o, n, E, d.G);
            t[6] = now_s();
            ops->ssm_scan_backward(ops->be, s.dx, s.dBh, s.dCh, s.ddt, s.dlam, s.dA, g.Dsk, s.dys, a.x, a.Bh, a.Ch, a.dt,
                                   a.lam, a.A, w.Dsk, B, T, d.H, d.P, d.N, d.chunk);
            t[7] = now_s();
            ops->ssm_prep_backward(ops->be, s.dproj, g.dt_bias, g.A_log, g.gB, g.gC, g.B_bias, g.C_bias, s.dx, s.dBh, s.dCh,
                                   s.ddt, s.dlam, s.dA, w.B_bias, w.C_bias, a.lam, a.A, a.rstd_bc, a.proj, w.dt_bias,
                                   w.gB, w.gC, B, T, d.H, d.P, d.G, d.N, d.eps_bc, NULL);
            t[8] = now_s();
            ops->gemm(ops->be, 1, 0, W, D, n, 1.0f, s.dproj, W, h, D, 1.0f, g.win, D);
            ops->gemm(ops->be, 0, 0, n, D, W, 1.0f, s.dproj, W, w.win, D, 0.0f, dh, D);
            t[9] = now_s();
            for (int k = 0; k < 9; k++) st[k] = fmin(st[k], t[k + 1] - t[k]);
        }
        printf("bench stages (ms): fwd in-proj %.1f, prep %.1f, scan %.1f, gate+out-proj %.1f | "
               "bwd out-proj %.1f, gate %.1f, scan %.1f, prep %.1f, in-proj %.1f\n",
               st[0] * 1e3, st[1] * 1e3, st[2] * 1e3, st[3] * 1e3, st[4] * 1e3, st[5] * 1e3, st[6] * 1e3,
               st[7] * 1e3, st[8] * 1e3);
    }
    /* attention part of an A block */
    int H = 4, K = 2, hd = 64, Oq = H * hd, Okv = K * hd;
    float *wq = falloc((size_t)(Oq + 2 * Okv) * D), *wo = falloc((size_t)D * Oq);
    for (size_t i = 0; i < (size_t)(Oq + 2 * Okv) * D; i++) wq[i] = nrand(0.0f, 0.02f);
    for (size_t i = 0; i < (size_t)D * Oq; i++) wo[i] = nrand(0.0f, 0.02f);
    float *q = falloc((size_t)n * Oq), *k = falloc((size_t)n * Okv), *v = falloc((size_t)n * Okv);
    float *att = falloc((size_t)n * Oq), *lse = falloc((size_t)n * H), *dq = falloc((size_t)n * Oq);
    float *dk = falloc((size_t)n * Okv), *dv = falloc((size_t)n * Okv), *datt = falloc((size_t)n * Oq);
    float *dwq = falloc((size_t)(Oq + 2 * Okv) * D), *dwo = falloc((size_t)D * Oq);
    double ta = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        ops->gemm(ops->be, 0, 1, n, Oq, D, 1.0f, h, D, wq, D, 0.0f, q, Oq);
        ops->gemm(ops->be, 0, 1, n, Okv, D, 1.0f, h, D, wq + (size_t)Oq * D, D, 0.0f, k, Okv);
        ops->gemm(ops->be, 0, 1, n, Okv, D, 1.0f, h, D, wq + (size_t)(Oq + Okv) * D, D, 0.0f, v, Okv);
        ops->attention_forward(ops->be, att, lse, q, k, v, B, T, T, 0, H, K, hd);
        ops->gemm(ops->be, 0, 1, n, D, Oq, 1.0f, att, Oq, wo, Oq, 0.0f, out, D);
        ops->gemm(ops->be, 1, 0, D, Oq, n, 1.0f, out, D, att, Oq, 1.0f, dwo, Oq);
        ops->gemm(ops->be, 0, 0, n, Oq, D, 1.0f, out, D, wo, Oq, 0.0f, datt, Oq);
        ops->attention_backward(ops->be, dq, dk, dv, datt, q, k, v, att, lse, B, T, H, K, hd);
        ops->gemm(ops->be, 1, 0, Oq, D, n, 1.0f, dq, Oq, h, D, 1.0f, dwq, D);
        ops->gemm(ops->be, 1, 0, Okv, D, n, 1.0f, dk, Okv, h, D, 1.0f, dwq + (size_t)Oq * D, D);
        ops->gemm(ops->be, 1, 0, Okv, D, n, 1.0f, dv, Okv, h, D, 1.0f, dwq + (size_t)(Oq + Okv) * D, D);
        ops->gemm(ops->be, 0, 0, n, D, Oq, 1.0f, dq, Oq, wq, D, 0.0f, dh, D);
        ops->gemm(ops->be, 0, 0, n, D, Okv, 1.0f, dk, Okv, wq + (size_t)Oq * D, D, 1.0f, dh, D);
        ops->gemm(ops->be, 0, 0, n, D, Okv, 1.0f, dv, Okv, wq + (size_t)(Oq + Okv) * D, D, 1.0f, dh, D);
        ta = fmin(ta, now_s() - t0);
    }
    printf("bench B=%d T=%d D=%d: M mixer fwd+bwd %.1f ms (%.2f us/token; scan fwd+bwd %.1f ms = %.0f%%), "
           "A attention part fwd+bwd %.1f ms (%.2f us/token)\n",
           B, T, D, tm * 1e3, tm * 1e6 / n, tscan * 1e3, 100.0 * tscan / tm, ta * 1e3, ta * 1e6 / n);
    free(wb); free(gb); free(ab); free(sb); free(h); free(out); free(dh);
    free(wq); free(wo); free(q); free(k); free(v); free(att); free(lse); free(dq); free(dk); free(dv);
    free(datt); free(dwq); free(dwo);
}

int main(int argc, char **argv)
{
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct fixture f;
    if (argc == 3 && !strcmp(argv[1], "--dump")) {
        setup(&f, 4);
        loss(&f, ops);
        int rc = dump(&f, argv[2]);
        teardown(&f);
        return rc;
    }
    if (argc == 2 && !strcmp(argv[1], "-bench")) {
        mt_ops_cpu_pin_coretype(argc, argv);  /* the AVX-512 OpenBLAS kernels, as meshtrain uses */
        bench(ops);
        return 0;
    }
    if (argc != 1) { fprintf(stderr, "usage: test_mamba3 [--dump DIR | -bench]\n"); return 2; }

    /* 3. chunked vs recurrent forward */
    setup(&f, 0);
    loss(&f, ops);
    size_t no = (size_t)f.n * f.d.D;
    float *ref = falloc(no);
    memcpy(ref, f.out, no * sizeof(float));
    int chunks[] = {4, 11, 64};
    for (int c = 0; c < 3; c++) {
        f.d.chunk = chunks[c];
        loss(&f, ops);
        double e = 0.0, m = 1e-30;
        for (size_t i = 0; i < no; i++) { e = fmax(e, fabs(f.out[i] - ref[i])); m = fmax(m, fabs(ref[i])); }
        int ok = e / m < 1e-5;
        printf("%s mamba3 forward chunk %d vs recurrence: rel err %.2e\n", ok ? "ok  " : "FAIL", chunks[c], e / m);
        n_fail += !ok;
    }
    free(ref);
    teardown(&f);

    /* 1. gradient check */
    setup(&f, 4);
    loss(&f, ops);
    mt_mamba3_backward(ops, f.dh, 0, &f.g, &f.s, f.R, f.h, &f.a, &f.w, &f.d, f.B, f.T);
    int W = mt_mamba3_in_width(&f.d), E = f.d.H * f.d.P;
    struct { const char *name; float *v, *g; size_t n; } t[] = {
        {"h", f.h, f.dh, (size_t)f.n * f.d.D},
        {"win", f.w.win, f.g.win, (size_t)W * f.d.D},
        {"wout", f.w.wout, f.g.wout, (size_t)f.d.D * E},
        {"dt_bias", f.w.dt_bias, f.g.dt_bias, (size_t)f.d.H},
        {"A_log", f.w.A_log, f.g.A_log, (size_t)f.d.H},
        {"D", f.w.Dsk, f.g.Dsk, (size_t)f.d.H},
        {"gB", f.w.gB, f.g.gB, (size_t)f.d.N},
        {"gC", f.w.gC, f.g.gC, (size_t)f.d.N},
        {"B_bias", f.w.B_bias, f.g.B_bias, (size_t)f.d.H * f.d.N},
        {"C_bias", f.w.C_bias, f.g.C_bias, (size_t)f.d.H * f.d.N},
        {"g_out", f.w.g_out, f.g.g_out, (size_t)E},
    };
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++) grad_check(&f, ops, t[k].name, t[k].v, t[k].g, t[k].n);

    /* 2. accumulation: parameter grads +=, dh += with accumulate = 1 */
    size_t nw = mt_mamba3_weights_floats(&f.d);
    float *g1 = falloc(nw), *dh1 = falloc(no);
    memcpy(g1, f.gbuf, nw * sizeof(float));
    memcpy(dh1, f.dh, no * sizeof(float));
    loss(&f, ops);
    mt_mamba3_backward(ops, f.dh, 1, &f.g, &f.s, f.R, f.h, &f.a, &f.w, &f.d, f.B, f.T);
    double e = 0.0;
    for (size_t i = 0; i < nw; i++) e = fmax(e, fabs(f.gbuf[i] - 2.0f * g1[i]) / fmax(1.0, fabs(g1[i])));
    for (size_t i = 0; i < no; i++) e = fmax(e, fabs(f.dh[i] - 2.0f * dh1[i]) / fmax(1.0, fabs(dh1[i])));
    int ok = e < 1e-5;
    printf("%s mamba3 backward twice doubles every gradient (err %.2e)\n", ok ? "ok  " : "FAIL", e);
    n_fail += !ok;
    free(g1); free(dh1);
    teardown(&f);
    printf("%s\n", n_fail ? "test_mamba3: FAILED" : "test_mamba3: all checks passed");
    return n_fail ? 1 : 0;
}
