/*
 * test_ssm.c — op harness of the Mamba-3 scan (mt_ops.h ssm_scan_*).
 *
 * Checks, on random inputs with several heads, even d_state and chunk sizes
 * that do and do not divide T:
 *   1. forward of the plain recurrence (chunk 0) and the chunked form against
 *      a double-precision recurrence written here from the math of mt_ops.h;
 *   2. backward (chunked) against central finite differences of that double
 *      recurrence, for every input (x, B, C, dt, lam, A, D) of a loss
 *      sum(R o y) with R random; dA and dD accumulate (+=);
 *   3. determinism: two calls give the same bits (forward and backward);
 *   3b. decoding: T calls of ssm_scan_step equal the chunk-0 forward, and
 *      ssm_prep_forward token by token with ang_state equals one call;
 *   4. with -b cuda: the mixer glue (ssm_prep_*, ssm_gate_norm_*) forward and
 *      backward equal the cpu backend's (1e-5; the cpu glue itself is checked
 *      by finite differences in test_mamba3);
 *   5. the gated norm over groups that span ranks (ssm_gate_norm_sums /
 *      _forward_ext / _backward_ext): simulated ranks' slices with their sum
 *      tables added equal the whole norm of the cpu backend (1e-5), and
 *      rank-local sums (the issue-31 plant) do not (test_gate_split);
 *   6. the prep with x / dx NULL (the bf16 scan reading x in proj and
 *      writing dx into dproj, ldx = W) gives the other outputs' bits, and the
 *      bf16 scan with ldx > H P the contiguous run's bits (test_prep_null,
 *      test_bf16_ldx).
 * Usage: test_ssm [-b cpu|cuda] [-bf16] [-bench [-chunk Q]]; exits 1 if any check fails.
 * -bf16 runs the precision=bf16 entries' checks alone (bench/gpu.sh runs
 * them under compute-sanitizer).
 * -bench times the recurrence against the chunked scan (not a test).
 */
#define _POSIX_C_SOURCE 199309L
#include "ops/mt_ops.h"
#include "core/mt_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "mt_test.h"

static const struct mt_ops_i *g_ops;
static struct mt_ctx g_ctx;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void)
{
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

struct inputs {
    int B, T, H, P, N;
    double *x, *Bm, *Cm, *dt, *lam, *A, *D, *R;
};

static size_t nx(const struct inputs *in) { return (size_t)in->B * in->T * in->H * in->P; }
static size_t nb(const struct inputs *in) { return (size_t)in->B * in->T * in->H * in->N; }
static size_t nd(const struct inputs *in) { return (size_t)in->B * in->T * in->H; }

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    return p;
}
static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    return p;
}

static void make_inputs(struct inputs *in, int B, int T, int H, int P, int N)
{
    in->B = B; in->T = T; in->H = H; in->P = P; in->N = N;
    in->x = dalloc(nx(in)); in->R = dalloc(nx(in));
    in->Bm = dalloc(nb(in)); in->Cm = dalloc(nb(in));
    in->dt = dalloc(nd(in)); in->lam = dalloc(nd(in));
    in->A = dalloc((size_t)H); in->D = dalloc((size_t)H);
    for (size_t i = 0; i < nx(in); i++) { in->x[i] = nrand(); in->R[i] = nrand(); }
    for (size_t i = 0; i < nb(in); i++) { in->Bm[i] = nrand(); in->Cm[i] = nrand() * 0.5; }
    /* dt in [0.01, 0.6], A in [-3, -0.2]: decays from ~1 to ~0.2 per step, so
     * both the intra-chunk mask and the carried state matter */
    for (size_t i = 0; i < nd(in); i++) { in->dt[i] = 0.01 + 0.59 * urand(); in->lam[i] = 0.05 + 0.9 * urand(); }
    for (int h = 0; h < H; h++) { in->A[h] = -(0.2 + 2.8 * urand()); in->D[h] = nrand(); }
}

static void free_inputs(struct inputs *in)
{
    free(in->x); free(in->R); free(in->Bm); free(in->Cm); free(in->dt); free(in->lam); free(in->A); free(in->D);
}

/* The double-precision recurrence, straight from the math; returns sum(R o y). */
static double ref_forward(const struct inputs *in, double *y)
{
    int B = in->B, T = in->T, H = in->H, P = in->P, N = in->N;
    double *S = dalloc((size_t)P * N), loss = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            memset(S, 0, (size_t)P * N * sizeof(double));
            for (int t = 0; t < T; t++) {
                size_t r = ((size_t)b * T + t) * H + h;
                const double *xt = in->x + r * P, *bt = in->Bm + r * N, *ct = in->Cm + r * N;
                const double *xp = xt - (size_t)H * P, *bp = bt - (size_t)H * N;
                double d = in->dt[r], l = in->lam[r], al = exp(d * in->A[h]);
                double ga = l * d, be = t > 0 ? (1.0 - l) * d * al : 0.0;
                for (int p = 0; p < P; p++) {
                    double acc = 0.0;
                    for (int n = 0; n < N; n++) {
                        double s = al * S[(size_t)p * N + n] + ga * xt[p] * bt[n];
                        if (t > 0) s += be * xp[p] * bp[n];
                        S[(size_t)p * N + n] = s;
                        acc += s * ct[n];
                    }
                    double yv = acc + in->D[h] * xt[p];
                    if (y) y[r * P + p] = yv;
                    loss += in->R[r * P + p] * yv;
                }
            }
        }
    free(S);
    return loss;
}

/* The recurrence's adjoint in double: g[0..6] = d sum(R o y) / d(x, B, C, dt,
 * lam, A, D), exact up to fp64 rounding, in O(forward) (the reference of the
 * bf16 backward at shapes too big for finite differences; test_bf16 checks it
 * against them where they run). With G_t the adjoint of S_t,
 *   G_t = R_t C_t^T + al_{t+1} G_{t+1},  dC_t = S_t^T R_t,  dD += R_t . x_t,
 *   dx_t = D R_t + ga_t G_t B_t + be_{t+1} G_{t+1} B_t,  dB_t likewise with x_t,
 *   ga = lam dt, be = (1 - lam) dt al, al = exp(dt A): the chain rule through
 *   <G_t, x_t B_t^T>, <G_t, x_{t-1} B_{t-1}^T> and <G_t, S_{t-1}>. */
static void ref_backward(const struct inputs *in, double *const g[7])
{
    const int B = in->B, T = in->T, H = in->H, P = in->P, N = in->N;
    const size_t PN = (size_t)P * N, len[7] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    for (int k = 0; k < 7; k++) memset(g[k], 0, len[k] * sizeof(double));
    double *S = dalloc((size_t)T * PN), *G = dalloc(PN), *Gp = dalloc(PN);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < T; t++) {   /* the forward's states, kept */
                const size_t r = ((size_t)b * T + t) * H + h;
                const double *xt = in->x + r * P, *bt = in->Bm + r * N;
                const double *xp = t > 0 ? xt - (size_t)H * P : NULL, *bp = t > 0 ? bt - (size_t)H * N : NULL;
                const double d = in->dt[r], l = in->lam[r], al = exp(d * in->A[h]);
                const double ga = l * d, be = t > 0 ? (1.0 - l) * d * al : 0.0;
                double *st = S + (size_t)t * PN;
                const double *sp = t > 0 ? st - PN : NULL;
                for (int p = 0; p < P; p++)
                    for (int n = 0; n < N; n++) {
                        const size_t i = (size_t)p * N + n;
                        st[i] = (t > 0 ? al * sp[i] + be * xp[p] * bp[n] : 0.0) + ga * xt[p] * bt[n];
                    }
            }
            double al_next = 0.0, be_next = 0.0;   /* al_{t+1}, be_{t+1}; G_{t+1} in Gp */
            for (int t = T - 1; t >= 0; t--) {
                const size_t r = ((size_t)b * T + t) * H + h;
                const double *xt = in->x + r * P, *bt = in->Bm + r * N, *ct = in->Cm + r * N, *Rt = in->R + r * P;
                const double d = in->dt[r], l = in->lam[r], al = exp(d * in->A[h]);
                const double ga = l * d, be = t > 0 ? (1.0 - l) * d * al : 0.0;
                const double *st = S + (size_t)t * PN, *sp = t > 0 ? st - PN : NULL;
                const double *xp = t > 0 ? xt - (size_t)H * P : NULL, *bp = t > 0 ? bt - (size_t)H * N : NULL;
                double dga = 0.0, dbe = 0.0, dal = 0.0;
                for (int p = 0; p < P; p++)
                    for (int n = 0; n < N; n++) {
                        const size_t i = (size_t)p * N + n;
                        G[i] = Rt[p] * ct[n] + (t + 1 < T ? al_next * Gp[i] : 0.0);
                        g[2][r * N + n] += Rt[p] * st[i];
                        g[0][r * P + p] += ga * G[i] * bt[n] + (t + 1 < T ? be_next * Gp[i] * bt[n] : 0.0);
                        g[1][r * N + n] += ga * G[i] * xt[p] + (t + 1 < T ? be_next * Gp[i] * xt[p] : 0.0);
                        dga += G[i] * xt[p] * bt[n];
                        if (t > 0) {
                            dbe += G[i] * xp[p] * bp[n];
                            dal += G[i] * sp[i];
                        }
                    }
                for (int p = 0; p < P; p++) {
                    g[0][r * P + p] += in->D[h] * Rt[p];
                    g[6][h] += Rt[p] * xt[p];
                }
                dal += dbe * (1.0 - l) * d;
                g[4][r] = dga * d - dbe * d * al;
                g[3][r] = dga * l + dbe * (1.0 - l) * al + dal * al * in->A[h];
                g[5][h] += dal * al * d;
                double *sw = G; G = Gp; Gp = sw;
                al_next = al, be_next = be;
            }
        }
    free(S); free(G); free(Gp);
}

static float *to_dev(const double *src, size_t n)
{
    float *h = falloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (float)src[i];
    float *d = g_ops->buf_alloc(g_ops->be, &g_ctx, (n ? n : 1) * sizeof(float), MT_BUCKET_OTHER);
    if (!d) { fprintf(stderr, "test_ssm: buf_alloc failed\n"); exit(1); }
    g_ops->copy_from_host(g_ops->be, d, h, n * sizeof(float));
    free(h);
    return d;
}
static float *dev_zero(size_t n)
{
    float *d = g_ops->buf_alloc(g_ops->be, &g_ctx, (n ? n : 1) * sizeof(float), MT_BUCKET_OTHER);
    if (!d) { fprintf(stderr, "test_ssm: buf_alloc failed\n"); exit(1); }
    return d;
}
static float *to_host(const float *d, size_t n)
{
    float *h = falloc(n);
    g_ops->sync(g_ops->be);
    g_ops->copy_to_host(g_ops->be, h, d, n * sizeof(float));
    return h;
}

struct dev {
    float *x, *Bm, *Cm, *dt, *lam, *A, *D, *R;
};
static void upload(struct dev *d, const struct inputs *in)
{
    d->x = to_dev(in->x, nx(in)); d->R = to_dev(in->R, nx(in));
    d->Bm = to_dev(in->Bm, nb(in)); d->Cm = to_dev(in->Cm, nb(in));
    d->dt = to_dev(in->dt, nd(in)); d->lam = to_dev(in->lam, nd(in));
    d->A = to_dev(in->A, (size_t)in->H); d->D = to_dev(in->D, (size_t)in->H);
}
static void release(struct dev *d)
{
    float *p[] = {d->x, d->R, d->Bm, d->Cm, d->dt, d->lam, d->A, d->D};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) g_ops->buf_free(g_ops->be, &g_ctx, p[i]);
}

/* max |a - ref| / max(1, max |ref|) */
static double rel_err(const float *a, const double *ref, size_t n)
{
    double m = 1.0, e = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - ref[i]));
    return e / m;
}

static void check(int ok, const char *what, const char *tag, double err, double tol)
{
    printf("%s %-40s %-22s err %.2e (tol %.0e)\n", ok ? "ok  " : "FAIL", what, tag, err, tol);
    n_fail += !ok;
}

static void test_forward(const struct inputs *in, int chunk)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d chunk=%d", in->T, chunk);
    double *yr = dalloc(nx(in));
    ref_forward(in, yr);
    struct dev d;
    upload(&d, in);
    float *y = dev_zero(nx(in)), *y2 = dev_zero(nx(in));
    g_ops->ssm_scan_forward(g_ops->be, y, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T, in->H, in->P, in->N, chunk);
    g_ops->ssm_scan_forward(g_ops->be, y2, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T, in->H, in->P, in->N, chunk);
    float *yh = to_host(y, nx(in)), *yh2 = to_host(y2, nx(in));
    double e = rel_err(yh, yr, nx(in));
    check(e < 2e-5, chunk > 0 ? "ssm_scan_forward chunked vs fp64" : "ssm_scan_forward recurrence vs fp64", tag, e, 2e-5);
    int same = memcmp(yh, yh2, nx(in) * sizeof(float)) == 0;
    check(same, "ssm_scan_forward deterministic", tag, same ? 0.0 : 1.0, 0);
    free(yh); free(yh2); free(yr);
    g_ops->buf_free(g_ops->be, &g_ctx, y); g_ops->buf_free(g_ops->be, &g_ctx, y2);
    release(&d);
}

/* central difference of sum(R o y) in double, step h relative */
static void fd_grad(struct inputs *in, double *v, size_t n, double *g)
{
    for (size_t i = 0; i < n; i++) {
        double v0 = v[i], h = 1e-6 * fmax(1.0, fabs(v0));
        v[i] = v0 + h;
        double lp = ref_forward(in, NULL);
        v[i] = v0 - h;
        double lm = ref_forward(in, NULL);
        v[i] = v0;
        g[i] = (lp - lm) / (2.0 * h);
    }
}

static void test_backward(struct inputs *in, int chunk)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d chunk=%d", in->T, chunk);
    int H = in->H;
    struct dev d;
    upload(&d, in);
    float *dx = dev_zero(nx(in)), *dB = dev_zero(nb(in)), *dC = dev_zero(nb(in));
    float *ddt = dev_zero(nd(in)), *dlam = dev_zero(nd(in));
    /* dA, dD start at 0.5: the kernel accumulates */
    double half[64];
    for (int h = 0; h < H; h++) half[h] = 0.5;
    float *dA = to_dev(half, (size_t)H), *dD = to_dev(half, (size_t)H);
    /* garbage in the overwritten outputs: the kernel must not read them */
    g_ops->fill(g_ops->be, dx, 1e3f, nx(in)); g_ops->fill(g_ops->be, dB, 1e3f, nb(in)); g_ops->fill(g_ops->be, dC, 1e3f, nb(in));
    g_ops->fill(g_ops->be, ddt, 1e3f, nd(in)); g_ops->fill(g_ops->be, dlam, 1e3f, nd(in));
    g_ops->ssm_scan_backward(g_ops->be, dx, dB, dC, ddt, dlam, dA, dD, d.R, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D,
                             in->B, in->T, in->H, in->P, in->N, chunk);
    struct { const char *name; float *dev; double *v; size_t n; double off; } g[] = {
        {"dx", dx, in->x, nx(in), 0}, {"dB", dB, in->Bm, nb(in), 0}, {"dC", dC, in->Cm, nb(in), 0},
        {"ddt", ddt, in->dt, nd(in), 0}, {"dlam", dlam, in->lam, nd(in), 0},
        {"dA (+=)", dA, in->A, (size_t)H, 0.5}, {"dD (+=)", dD, in->D, (size_t)H, 0.5},
    };
    for (size_t k = 0; k < sizeof(g) / sizeof(g[0]); k++) {
        double *fd = dalloc(g[k].n);
        fd_grad(in, g[k].v, g[k].n, fd);
        for (size_t i = 0; i < g[k].n; i++) fd[i] += g[k].off;
        float *an = to_host(g[k].dev, g[k].n);
        double e = rel_err(an, fd, g[k].n);
        char what[64];
        snprintf(what, sizeof what, "ssm_scan_backward %s vs fd", g[k].name);
        check(e < 2e-5, what, tag, e, 2e-5);
        free(fd); free(an);
    }
    /* determinism: a second call into fresh buffers gives the same bits */
    float *dx2 = dev_zero(nx(in)), *dB2 = dev_zero(nb(in)), *dC2 = dev_zero(nb(in));
    float *ddt2 = dev_zero(nd(in)), *dlam2 = dev_zero(nd(in));
    float *dA2 = to_dev(half, (size_t)H), *dD2 = to_dev(half, (size_t)H);
    g_ops->ssm_scan_backward(g_ops->be, dx2, dB2, dC2, ddt2, dlam2, dA2, dD2, d.R, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A,
                             d.D, in->B, in->T, in->H, in->P, in->N, chunk);
    float *one[] = {dx, dB, dC, ddt, dlam, dA, dD}, *two[] = {dx2, dB2, dC2, ddt2, dlam2, dA2, dD2};
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    int same = 1;
    for (size_t k = 0; k < sizeof(one) / sizeof(one[0]); k++) {
        float *a = to_host(one[k], len[k]), *b = to_host(two[k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, two[k]);
    }
    check(same, "ssm_scan_backward deterministic", tag, same ? 0.0 : 1.0, 0);
    float *p[] = {dx, dB, dC, ddt, dlam, dA, dD};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) g_ops->buf_free(g_ops->be, &g_ctx, p[i]);
    release(&d);
}

/* ---- precision=bf16: ssm_scan_*_bf16 (the intra-chunk products on bf16
 * operands; mt_ops.h) ----
 * Bound (docs/cuda.md "The Mamba-3 scan on tensor cores"). Every term of an
 * output is a product of inputs (x, B, C, R) with positive weights (gamma,
 * beta, the decays), and the path rounds each term's factors to bf16 at most
 * four times (x, B, C and M = G o L for the intra-chunk terms; C, the state
 * S_in, and x and v_j B_j inside S_in's own terms for the carried ones): |err_i| <= 4u sum_terms |term| + fp32
 * sums, u = 2^-8. The sum of |terms| is the fp64 reference run on |inputs|
 * (|x|, |B|, |C|, |R|, |D|): Yabs. Checked: |y - y_ref| <= 6u Yabs + 1e-6
 * max Yabs per element (1.5x the first-order bound), and some element
 * more than 1e-5 away (the bf16 path ran, not the fp32 one). The backward's
 * dx, dB, dC the same way against central differences of the reference
 * and of the |inputs| problem (dG, M rounded once more: 8u); ddt, dlam, dA,
 * dD, whose terms mix signs through the decays' derivatives, normwise:
 * max err <= 8u max |g_abs| (g_abs: the |inputs| problem's gradient).
 * Shapes too big for finite differences take both gradients from the fp64
 * adjoint (ref_backward), itself checked against the differences where they
 * run. */
static void abs_inputs(const struct inputs *in, struct inputs *ab)
{
    *ab = *in;
    size_t n[] = {nx(in), nx(in), nb(in), nb(in), (size_t)in->H};
    double **src[] = {&ab->x, &ab->R, &ab->Bm, &ab->Cm, &ab->D};
    for (size_t k = 0; k < 5; k++) {
        double *d = dalloc(n[k]);
        for (size_t i = 0; i < n[k]; i++) d[i] = fabs((*src[k])[i]);
        *src[k] = d;
    }
}
static void free_abs(struct inputs *ab)
{
    free(ab->x); free(ab->R); free(ab->Bm); free(ab->Cm); free(ab->D);
}

/* worst |a - ref| / (c u abs + slack max abs) over the elements (<= 1 passes) */
static double bound_ratio(const float *a, const double *ref, const double *abs_, size_t n, double c, int normwise)
{
    const double u = 1.0 / 256.0;
    double m = 0.0, w = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(abs_[i]));
    for (size_t i = 0; i < n; i++) {
        double b = normwise ? c * u * m : c * u * fabs(abs_[i]) + 1e-6 * m;
        w = fmax(w, fabs((double)a[i] - ref[i]) / fmax(b, 1e-30));
    }
    return w;
}

static uint16_t ref_bf16(float x);

/* a bf16 device buffer of n elements, every one the bits `fill` */
static mt_bf16 *dev_bf16(size_t n, uint16_t fill)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
    mt_bf16 *d = g_ops->buf_alloc(g_ops->be, &g_ctx, (n ? n : 1) * sizeof(mt_bf16), MT_BUCKET_OTHER);
    if (!h || !d) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) h[i] = fill;
    g_ops->copy_from_host(g_ops->be, d, h, n * sizeof(uint16_t));
    free(h);
    return d;
}

static uint16_t *bf16_to_host(const mt_bf16 *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!h) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    g_ops->sync(g_ops->be);
    g_ops->copy_to_host(g_ops->be, h, d, n * sizeof(uint16_t));
    return h;
}

#define BF16_SENTINEL 0x4321u

/* x (device, n rows of E) as host rows of ld floats: x at columns [off, off + E),
 * `fill` around it (the layout of x inside the mixer's proj rows, ldx = ld) */
static float *wide_rows(const float *x, size_t n, int E, int off, int ld, float fill)
{
    float *xc = to_host(x, n * (size_t)E), *hw = falloc(n * (size_t)ld);
    for (size_t i = 0; i < n * (size_t)ld; i++) hw[i] = fill;
    for (size_t r = 0; r < n; r++) memcpy(hw + r * ld + off, xc + r * E, (size_t)E * sizeof(float));
    free(xc);
    return hw;
}

/* dx_b (the mixer's dproj as bf16, mt_ops.h): dx written as bf16 in wide rows
 * (ldx) is bf16 of the contiguous run's fp32 dx (g1[0]), bit for bit (the
 * rows a chunk edge joins included), the rows' other columns untouched, every
 * other gradient the bits of the run without dx_b */
static void test_bf16_dxb(const struct inputs *in, int chunk, const struct dev *d, float *const g1[7], int small)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H, E = H * in->P, off = small ? 1 : 2, ld = off + E + 3;
    const size_t n = (size_t)in->B * in->T, wide = n * (size_t)ld;
    mt_bf16 *bw = dev_bf16(wide, BF16_SENTINEL);
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    float *g[7];
    for (int k = 1; k < 7; k++) g[k] = dev_zero(len[k]);
    g_ops->fill(g_ops->be, g[5], 0.0f, (size_t)H);
    g_ops->fill(g_ops->be, g[6], 0.0f, (size_t)H);
    /* x in the same wide layout: the contiguous x copied into wide fp32 rows */
    float *hw = wide_rows(d->x, n, E, off, ld, 0.0f), *xw = dev_zero(wide);
    g_ops->copy_from_host(g_ops->be, xw, hw, wide * sizeof(float));
    g_ops->ssm_scan_backward_bf16(g_ops->be, NULL, g[1], g[2], g[3], g[4], g[5], g[6], d->R, xw + off, ld, d->Bm,
                                  d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T, H, in->P, in->N, chunk, NULL,
                                  bw + off, NULL, NULL, NULL, NULL, 0, NULL, NULL);
    uint16_t *bh = bf16_to_host(bw, wide);
    float *d1 = to_host(g1[0], nx(in));
    size_t bad = 0, touched = 0;
    for (size_t r = 0; r < n; r++)
        for (int c = 0; c < ld; c++) {
            if (c >= off && c < off + E) bad += bh[r * ld + c] != ref_bf16(d1[r * E + (c - off)]);
            else touched += bh[r * ld + c] != BF16_SENTINEL;
        }
    int same = 1;
    for (int k = 1; k < 7; k++) {
        float *a = to_host(g[k], len[k]), *b = to_host(g1[k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, g[k]);
    }
    check(bad == 0, "scan_backward_bf16 dx_b = bf16(dx) (bits)", tag, (double)bad, 0);
    check(touched == 0 && same, "scan_backward_bf16 dx_b: other columns, other gradients as without", tag,
          (double)touched + !same, 0);
    /* ... and dB_b, dC_b with it (the mixer's call): dB, dC as bf16 only, each bf16 of the
     * fp32 run's value (the rows a chunk edge joins included; dBm, dCm NULL: not written),
     * dx_b and the other gradients as above */
    mt_bf16 *tw[2] = {dev_bf16(nb(in), BF16_SENTINEL), dev_bf16(nb(in), BF16_SENTINEL)};
    mt_bf16 *bw2 = dev_bf16(wide, BF16_SENTINEL);
    for (int k = 3; k < 7; k++) g[k] = dev_zero(len[k]);
    g_ops->fill(g_ops->be, g[5], 0.0f, (size_t)H);
    g_ops->fill(g_ops->be, g[6], 0.0f, (size_t)H);
    g_ops->ssm_scan_backward_bf16(g_ops->be, NULL, NULL, NULL, g[3], g[4], g[5], g[6], d->R, xw + off, ld, d->Bm,
                                  d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T, H, in->P, in->N, chunk, NULL,
                                  bw2 + off, NULL, NULL, NULL, NULL, 0, tw[0], tw[1]);
    uint16_t *bh2 = bf16_to_host(bw2, wide);
    same = memcmp(bh, bh2, wide * sizeof(uint16_t)) == 0;
    for (int k = 3; k < 7; k++) {
        float *a = to_host(g[k], len[k]), *b = to_host(g1[k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, g[k]);
    }
    size_t badbc = 0;
    for (int k = 0; k < 2; k++) {
        uint16_t *tb = bf16_to_host(tw[k], nb(in));
        float *f = to_host(g1[1 + k], nb(in));
        for (size_t i = 0; i < nb(in); i++) badbc += tb[i] != ref_bf16(f[i]);
        free(tb); free(f);
        g_ops->buf_free(g_ops->be, &g_ctx, tw[k]);
    }
    check(badbc == 0, "scan_backward_bf16 dB_b, dC_b = bf16(dB), bf16(dC) (bits)", tag, (double)badbc, 0);
    check(same, "scan_backward_bf16 dB_b, dC_b: dx_b, other gradients as without", tag, same ? 0.0 : 1.0, 0);
    free(bh2);
    g_ops->buf_free(g_ops->be, &g_ctx, bw2);
    free(bh); free(d1); free(hw);
    g_ops->buf_free(g_ops->be, &g_ctx, bw);
    g_ops->buf_free(g_ops->be, &g_ctx, xw);
}

/* a bf16 device copy of the n floats at d (device), each scaled by k, then rounded */
static mt_bf16 *dev_twin(const float *d, size_t n, float k)
{
    float *h = to_host(d, n);
    uint16_t *b = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!b) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) b[i] = ref_bf16(k * h[i]);
    mt_bf16 *t = dev_bf16(n, 0);
    g_ops->copy_from_host(g_ops->be, t, b, n * sizeof(uint16_t));
    free(h); free(b);
    return t;
}

/* a device fp32 copy of the n floats at d (device), each rounded to bf16 and widened */
static float *dev_rounded(const float *d, size_t n)
{
    float *h = to_host(d, n);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)ref_bf16(h[i]) << 16;
        memcpy(&h[i], &u, sizeof u);
    }
    float *r = dev_zero(n);
    g_ops->copy_from_host(g_ops->be, r, h, n * sizeof(float));
    free(h);
    return r;
}

/* Bh_b, Ch_b, dy_b (B, C and dy's bf16 twins, mt_ops.h): given bf16(Bm), bf16(Cm), bf16(dy) the
 * forward (keeping its states) and the backward (reading them) give y and
 * every gradient the bits of the runs without (y1, g1), with Bm, Cm given
 * and with both NULL (k = 3: the twins alone); given other twins (bf16(2 Bm),
 * bf16(2 Cm)) y, dx, dB and dC move: the products read them */
static void test_bf16_twins(const struct inputs *in, int chunk, const struct dev *d, const float *y1,
                            float *const g1[7])
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H;
    const size_t nst = mt_ssm_states_floats(in->B, in->T, H, in->P, in->N, chunk);
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    int same = 1, moved = 1, moved_dy = 1;
    for (int k = 1; k <= 4; k++) {   /* k = 4: bf16(2 dy) alone */
        const float scale = k == 2 ? 2.0f : 1.0f, *Bm = k == 3 ? NULL : d->Bm, *Cm = k == 3 ? NULL : d->Cm;
        mt_bf16 *tb = dev_twin(d->Bm, nb(in), scale), *tc = dev_twin(d->Cm, nb(in), scale);
        mt_bf16 *ty = dev_twin(d->R, nx(in), k == 4 ? 2.0f : scale);   /* dy's twin (the backward's products) */
        float *st = k != 2 ? dev_zero(nst) : NULL, *y = dev_zero(nx(in)), *g[7];
        for (int j = 0; j < 7; j++) g[j] = dev_zero(len[j]);
        g_ops->ssm_scan_forward_bf16(g_ops->be, y, d->x, H * in->P, Bm, Cm, d->dt, d->lam, d->A, d->D, in->B,
                                     in->T, H, in->P, in->N, chunk, st, tb, tc, NULL, NULL, 0);
        g_ops->ssm_scan_backward_bf16(g_ops->be, g[0], g[1], g[2], g[3], g[4], g[5], g[6], d->R, d->x, H * in->P,
                                      Bm, Cm, d->dt, d->lam, d->A, d->D, in->B, in->T, H, in->P, in->N, chunk,
                                      st, NULL, tb, tc, ty, NULL, 0, NULL, NULL);
        for (int j = -1; j < 7; j++) {
            const size_t m = j < 0 ? nx(in) : len[j];
            float *a = to_host(j < 0 ? y : g[j], m), *b = to_host(j < 0 ? y1 : g1[j], m);
            const int eq = memcmp(a, b, m * sizeof(float)) == 0;
            if (k == 1 || k == 3) same &= eq;
            else if (k == 2 && j < 3) moved &= !eq;   /* y, dx, dB, dC */
            else if (k == 4 && j >= 0 && j < 3) moved_dy &= !eq;   /* dx, dB, dC */
            free(a); free(b);
        }
        for (int j = 0; j < 7; j++) g_ops->buf_free(g_ops->be, &g_ctx, g[j]);
        g_ops->buf_free(g_ops->be, &g_ctx, y);
        if (st) g_ops->buf_free(g_ops->be, &g_ctx, st);
        g_ops->buf_free(g_ops->be, &g_ctx, tb); g_ops->buf_free(g_ops->be, &g_ctx, tc);
        g_ops->buf_free(g_ops->be, &g_ctx, ty);
    }
    check(same, "scan_*_bf16 given bf16(B), bf16(C), bf16(dy) twins (Bm, Cm given; NULL) = without (bits)", tag,
          same ? 0.0 : 1.0, 0);
    check(moved, "scan_*_bf16 twins read (bf16(2B), bf16(2C), bf16(2dy): y, dx, dB, dC move)", tag, moved ? 0.0 : 1.0,
          0);
    check(moved_dy, "scan_backward_bf16 dy's twin read (bf16(2dy): dx, dB, dC move)", tag, moved_dy ? 0.0 : 1.0, 0);
}

/* x_b, ldx_b (x stored bf16, mt_ops.h: the mixer's in-projection writes its x block
 * so): given x_b in wide bf16 rows (x NULL; offset 1: unaligned rows, the scalar
 * staging; else 8: the 16-byte moves), y and every gradient are the bits of the run
 * on the fp32 x = bf16(x) widened: the products stage the same values, and the fp32
 * terms (D x in y, dD's dy . x) read the widened x. States not kept, so the
 * backward's recompute of S_in reads x_b too. */
static void test_bf16_xb(const struct inputs *in, int chunk, const struct dev *d, int small)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H, E = H * in->P, off = small ? 1 : 8, ld = off + E + (small ? 3 : 8);
    const size_t n = (size_t)in->B * in->T, wide = n * (size_t)ld;
    float *xh = to_host(d->x, nx(in));
    uint16_t *bh = malloc(wide * sizeof(uint16_t));
    if (!bh) { fprintf(stderr, "test_ssm: out of memory\n"); exit(1); }
    for (size_t i = 0; i < wide; i++) bh[i] = BF16_SENTINEL;
    for (size_t r = 0; r < n; r++)
        for (int c = 0; c < E; c++) {
            const uint16_t b = ref_bf16(xh[r * E + c]);
            const uint32_t u = (uint32_t)b << 16;
            bh[r * ld + off + c] = b;
            memcpy(&xh[r * E + c], &u, sizeof u);   /* the fp32 run's x: bf16(x) widened */
        }
    float *xr = dev_zero(nx(in));
    mt_bf16 *xb = dev_bf16(wide, 0);
    g_ops->copy_from_host(g_ops->be, xr, xh, nx(in) * sizeof(float));
    g_ops->copy_from_host(g_ops->be, xb, bh, wide * sizeof(uint16_t));
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    float *y[2], *g[2][7];
    for (int run = 0; run < 2; run++) {   /* 0: fp32 x = bf16(x); 1: x_b */
        y[run] = dev_zero(nx(in));
        for (int k = 0; k < 7; k++) g[run][k] = dev_zero(len[k]);
        const float *x = run ? NULL : xr;
        const mt_bf16 *x_b = run ? xb + off : NULL;
        g_ops->ssm_scan_forward_bf16(g_ops->be, y[run], x, E, d->Bm, d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T,
                                     H, in->P, in->N, chunk, NULL, NULL, NULL, NULL, x_b, ld);
        g_ops->ssm_scan_backward_bf16(g_ops->be, g[run][0], g[run][1], g[run][2], g[run][3], g[run][4], g[run][5],
                                      g[run][6], d->R, x, E, d->Bm, d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T,
                                      H, in->P, in->N, chunk, NULL, NULL, NULL, NULL, NULL, x_b, ld, NULL, NULL);
    }
    float *a = to_host(y[0], nx(in)), *b = to_host(y[1], nx(in));
    int same = memcmp(a, b, nx(in) * sizeof(float)) == 0;
    free(a); free(b);
    for (int k = 0; k < 7; k++) {
        a = to_host(g[0][k], len[k]), b = to_host(g[1][k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, g[0][k]); g_ops->buf_free(g_ops->be, &g_ctx, g[1][k]);
    }
    check(same, "scan_*_bf16 given x_b (x stored bf16, wide rows) = on x = bf16(x) (bits)", tag, same ? 0.0 : 1.0, 0);
    free(xh); free(bh);
    g_ops->buf_free(g_ops->be, &g_ctx, xr); g_ops->buf_free(g_ops->be, &g_ctx, xb);
    g_ops->buf_free(g_ops->be, &g_ctx, y[0]); g_ops->buf_free(g_ops->be, &g_ctx, y[1]);
}

/* dy stored bf16 only (dy NULL, dy_b given: mt_ops.h; the gated norm's backward
 * writes it so): every gradient the bits of the backward given dy = bf16(dy)
 * widened and the same twin (the products stage the twin either way; D dy, dD
 * and the scaled e_i dy_i read the widened values) */
static void test_bf16_dyb_only(const struct inputs *in, int chunk, const struct dev *d)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H;
    float *rr = dev_rounded(d->R, nx(in));
    mt_bf16 *yb = dev_twin(d->R, nx(in), 1.0f);
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    float *g[2][7];
    for (int run = 0; run < 2; run++) {   /* 0: dy = bf16(dy) widened, with the twin; 1: the twin alone */
        for (int k = 0; k < 7; k++) g[run][k] = dev_zero(len[k]);
        g_ops->ssm_scan_backward_bf16(g_ops->be, g[run][0], g[run][1], g[run][2], g[run][3], g[run][4], g[run][5],
                                      g[run][6], run ? NULL : rr, d->x, H * in->P, d->Bm, d->Cm, d->dt, d->lam, d->A,
                                      d->D, in->B, in->T, H, in->P, in->N, chunk, NULL, NULL, NULL, NULL, yb, NULL, 0,
                                      NULL, NULL);
    }
    int same = 1;
    for (int k = 0; k < 7; k++) {
        float *a = to_host(g[0][k], len[k]), *b = to_host(g[1][k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, g[0][k]); g_ops->buf_free(g_ops->be, &g_ctx, g[1][k]);
    }
    check(same, "scan_backward_bf16 dy NULL (its twin alone) = dy given as bf16(dy) (bits)", tag, same ? 0.0 : 1.0, 0);
    g_ops->buf_free(g_ops->be, &g_ctx, rr);
    g_ops->buf_free(g_ops->be, &g_ctx, yb);
}

/* x and dx inside wider rows (ldx > H P: the mixer passes proj's and dproj's
 * xs columns, ldx = W): y and every gradient the bits of the contiguous run
 * (y1, g1: its outputs), and the wide dx's other columns untouched. Offset 1
 * (unaligned rows: the scalar staging path) on the small shapes, 4 on the
 * others. Only the tensor-core shapes take ldx (mt_ops.h) */
static void test_bf16_ldx(const struct inputs *in, int chunk, const struct dev *d, const float *y1,
                          float *const g1[7], int small)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H, E = H * in->P, off = small ? 1 : 4, ld = off + E + 3;
    const size_t n = (size_t)in->B * in->T, wide = n * (size_t)ld;
    float *hw = wide_rows(d->x, n, E, off, ld, 7.0f);   /* 7: the sentinel around x and dx */
    float *xw = dev_zero(wide), *dxw = dev_zero(wide), *y = dev_zero(nx(in));
    g_ops->copy_from_host(g_ops->be, xw, hw, wide * sizeof(float));
    g_ops->copy_from_host(g_ops->be, dxw, hw, wide * sizeof(float));
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    float *g[7];
    for (int k = 1; k < 7; k++) g[k] = dev_zero(len[k]);
    g[0] = dxw + off;
    g_ops->fill(g_ops->be, g[5], 0.0f, (size_t)H);
    g_ops->fill(g_ops->be, g[6], 0.0f, (size_t)H);
    g_ops->ssm_scan_forward_bf16(g_ops->be, y, xw + off, ld, d->Bm, d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T, H,
                                 in->P, in->N, chunk, NULL, NULL, NULL, NULL, NULL, 0);
    g_ops->ssm_scan_backward_bf16(g_ops->be, g[0], g[1], g[2], g[3], g[4], g[5], g[6], d->R, xw + off, ld, d->Bm,
                                  d->Cm, d->dt, d->lam, d->A, d->D, in->B, in->T, H, in->P, in->N, chunk, NULL, NULL,
                                  NULL, NULL, NULL, NULL, 0, NULL, NULL);
    float *a = to_host(y, nx(in)), *b = to_host(y1, nx(in));
    int same = memcmp(a, b, nx(in) * sizeof(float)) == 0, kept = 1;
    free(a); free(b);
    float *dw = to_host(dxw, wide), *d1 = to_host(g1[0], nx(in));
    for (size_t r = 0; r < n; r++)
        for (int c = 0; c < ld; c++) {
            const float v = dw[r * ld + c];
            if (c >= off && c < off + E) same &= memcmp(&v, d1 + r * E + (c - off), sizeof v) == 0;
            else kept &= v == 7.0f;
        }
    free(dw); free(d1);
    for (int k = 1; k < 7; k++) {
        a = to_host(g[k], len[k]), b = to_host(g1[k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, g[k]);
    }
    check(same, "scan_*_bf16 with x, dx in wider rows (ldx) = contiguous (bits)", tag, same ? 0.0 : 1.0, 0);
    check(kept, "scan_backward_bf16 ldx: the row's other columns untouched", tag, kept ? 0.0 : 1.0, 0);
    free(hw);
    g_ops->buf_free(g_ops->be, &g_ctx, xw); g_ops->buf_free(g_ops->be, &g_ctx, dxw);
    g_ops->buf_free(g_ops->be, &g_ctx, y);
}

static void test_bf16(struct inputs *in, int chunk, int with_fd)
{
    char tag[64];
    snprintf(tag, sizeof tag, "T=%d P=%d N=%d chunk=%d", in->T, in->P, in->N, chunk);
    const int H = in->H;
    struct inputs ab;
    abs_inputs(in, &ab);
    double *yr = dalloc(nx(in)), *ya = dalloc(nx(in));
    ref_forward(in, yr);
    ref_forward(&ab, ya);
    struct dev d;
    upload(&d, in);
    float *y = dev_zero(nx(in)), *y2 = dev_zero(nx(in));
    /* the second forward keeps its chunk states (mt_ssm_states_floats), which the
     * second backward below reads: both must be the bits of the runs without */
    const size_t nst = mt_ssm_states_floats(in->B, in->T, H, in->P, in->N, chunk);
    float *st = nst ? dev_zero(nst) : NULL;
    g_ops->ssm_scan_forward_bf16(g_ops->be, y, d.x, H * in->P, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T, H,
                                 in->P, in->N, chunk, NULL, NULL, NULL, NULL, NULL, 0);
    g_ops->ssm_scan_forward_bf16(g_ops->be, y2, d.x, H * in->P, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T, H,
                                 in->P, in->N, chunk, st, NULL, NULL, NULL, NULL, 0);
    float *yh = to_host(y, nx(in)), *yh2 = to_host(y2, nx(in));
    double r = bound_ratio(yh, yr, ya, nx(in), 6.0, 0), e = rel_err(yh, yr, nx(in));
    check(r <= 1.0, "scan_forward_bf16 vs fp64 (6u |terms|)", tag, r, 1);
    check(e > 1e-5, "scan_forward_bf16 rounded (bf16 ran)", tag, e, 1e-5);
    int same = memcmp(yh, yh2, nx(in) * sizeof(float)) == 0;
    check(same, "scan_forward_bf16 deterministic (and keeping the states)", tag, same ? 0.0 : 1.0, 0);
    if (nst) {   /* the tensor-core shapes: y as bf16 only (y_b, y NULL) = bf16 of that y, nearest even */
        mt_bf16 *yb = dev_bf16(nx(in), BF16_SENTINEL);
        g_ops->ssm_scan_forward_bf16(g_ops->be, NULL, d.x, H * in->P, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T,
                                     H, in->P, in->N, chunk, st, NULL, NULL, yb, NULL, 0);
        uint16_t *hb = bf16_to_host(yb, nx(in));
        size_t bad = 0;
        for (size_t i = 0; i < nx(in); i++) bad += hb[i] != ref_bf16(yh[i]);
        check(bad == 0, "scan_forward_bf16 y_b = bf16(y) (bits)", tag, (double)bad, 0);
        free(hb);
        g_ops->buf_free(g_ops->be, &g_ctx, yb);
    }
    free(yh); free(yh2); free(yr); free(ya);
    /* backward: dL/d(inputs) of L = sum(R o y) */
    float *dx = dev_zero(nx(in)), *dB = dev_zero(nb(in)), *dC = dev_zero(nb(in));
    float *ddt = dev_zero(nd(in)), *dlam = dev_zero(nd(in)), *dA = dev_zero((size_t)H), *dD = dev_zero((size_t)H);
    float *two[7];
    size_t len[] = {nx(in), nb(in), nb(in), nd(in), nd(in), (size_t)H, (size_t)H};
    for (int run = 0; run < 2; run++) {
        float *o[7] = {dx, dB, dC, ddt, dlam, dA, dD};
        if (run) for (int k = 0; k < 7; k++) o[k] = two[k] = dev_zero(len[k]);
        g_ops->fill(g_ops->be, o[5], 0.0f, (size_t)H);
        g_ops->fill(g_ops->be, o[6], 0.0f, (size_t)H);
        g_ops->fill(g_ops->be, o[0], 1e3f, nx(in));   /* overwritten outputs: garbage in */
        g_ops->ssm_scan_backward_bf16(g_ops->be, o[0], o[1], o[2], o[3], o[4], o[5], o[6], d.R, d.x, H * in->P, d.Bm,
                                      d.Cm, d.dt, d.lam, d.A, d.D, in->B, in->T, H, in->P, in->N, chunk,
                                      run ? st : NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL);
    }
    float *one[] = {dx, dB, dC, ddt, dlam, dA, dD};
    same = 1;
    for (int k = 0; k < 7; k++) {
        float *a = to_host(one[k], len[k]), *b = to_host(two[k], len[k]);
        same &= memcmp(a, b, len[k] * sizeof(float)) == 0;
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, two[k]);
    }
    check(same, "scan_backward_bf16 deterministic, and on the kept states = recomputed", tag, same ? 0.0 : 1.0, 0);
    if (st) g_ops->buf_free(g_ops->be, &g_ctx, st);
    if (nst) test_bf16_ldx(in, chunk, &d, y, (float *const[]){dx, dB, dC, ddt, dlam, dA, dD}, with_fd);
    if (nst) test_bf16_dxb(in, chunk, &d, (float *const[]){dx, dB, dC, ddt, dlam, dA, dD}, with_fd);
    if (nst) test_bf16_xb(in, chunk, &d, with_fd);
    if (nst) test_bf16_dyb_only(in, chunk, &d);
    if (nst) test_bf16_twins(in, chunk, &d, y, (float *const[]){dx, dB, dC, ddt, dlam, dA, dD});
    const char *names[] = {"dx", "dB", "dC", "ddt", "dlam", "dA", "dD"};
    double *gr[7], *ga[7];   /* the fp64 adjoint of the problem and of its |inputs| problem */
    for (int k = 0; k < 7; k++) gr[k] = dalloc(len[k]), ga[k] = dalloc(len[k]);
    ref_backward(in, gr);
    ref_backward(&ab, ga);
    if (with_fd) {
        /* the adjoint against finite differences, where they run: the reference of the shapes below */
        for (int k = 0; k < 7; k++) {
            double *v[] = {in->x, in->Bm, in->Cm, in->dt, in->lam, in->A, in->D};
            double *fd = dalloc(len[k]), m = 1e-30, worst = 0.0;
            fd_grad(in, v[k], len[k], fd);
            for (size_t i = 0; i < len[k]; i++) m = fmax(m, fabs(fd[i])), worst = fmax(worst, fabs(gr[k][i] - fd[i]));
            char what[64];
            snprintf(what, sizeof what, "fp64 adjoint %s vs fd (test reference)", names[k]);
            check(worst / m < 1e-6, what, tag, worst / m, 1e-6);
            free(fd);
        }
        struct { const char *name; float *dev; double *v, *va; size_t n; int normwise; } g[] = {
            {"dx", dx, in->x, ab.x, nx(in), 0}, {"dB", dB, in->Bm, ab.Bm, nb(in), 0},
            {"dC", dC, in->Cm, ab.Cm, nb(in), 0}, {"ddt", ddt, in->dt, ab.dt, nd(in), 1},
            {"dlam", dlam, in->lam, ab.lam, nd(in), 1}, {"dA", dA, in->A, ab.A, (size_t)H, 1},
            {"dD", dD, in->D, ab.D, (size_t)H, 1},
        };
        for (size_t k = 0; k < sizeof(g) / sizeof(g[0]); k++) {
            double *fd = dalloc(g[k].n), *fa = dalloc(g[k].n);
            fd_grad(in, g[k].v, g[k].n, fd);
            fd_grad(&ab, g[k].va, g[k].n, fa);
            for (size_t i = 0; i < g[k].n; i++) fa[i] = fabs(fa[i]);
            float *an = to_host(g[k].dev, g[k].n);
            double rr = bound_ratio(an, fd, fa, g[k].n, 8.0, g[k].normwise);
            char what[64];
            snprintf(what, sizeof what, "scan_backward_bf16 %s vs fd (8u%s)", g[k].name,
                     g[k].normwise ? " normwise" : " |terms|");
            check(rr <= 1.0, what, tag, rr, 1);
            free(fd); free(fa); free(an);
        }
    } else {   /* shapes too big for finite differences: the fp64 adjoint (checked against
                * them above) is the reference, in the same bounds; and the fp32 entry
                * differs (bf16 ran) but for dD, the same fp32 sum in both modes */
        float *f[7];
        for (int k = 0; k < 7; k++) f[k] = dev_zero(len[k]);
        g_ops->fill(g_ops->be, f[5], 0.0f, (size_t)H);
        g_ops->fill(g_ops->be, f[6], 0.0f, (size_t)H);
        g_ops->ssm_scan_backward(g_ops->be, f[0], f[1], f[2], f[3], f[4], f[5], f[6], d.R, d.x, d.Bm, d.Cm, d.dt,
                                 d.lam, d.A, d.D, in->B, in->T, H, in->P, in->N, chunk);
        for (int k = 0; k < 7; k++) {
            float *a = to_host(one[k], len[k]), *b = to_host(f[k], len[k]);
            const int normwise = k >= 3;
            for (size_t i = 0; i < len[k]; i++) ga[k][i] = fabs(ga[k][i]);
            double rr = bound_ratio(a, gr[k], ga[k], len[k], 8.0, normwise);
            char what[64];
            snprintf(what, sizeof what, "scan_backward_bf16 %s vs fp64 adjoint (8u%s)", names[k],
                     normwise ? " normwise" : " |terms|");
            check(rr <= 1.0, what, tag, rr, 1);
            const int eq = memcmp(a, b, len[k] * sizeof(float)) == 0;
            snprintf(what, sizeof what, "scan_backward_bf16 %s %s the fp32 entry", names[k],
                     k == 6 ? "=" : "differs from");
            check(k == 6 ? eq : !eq, what, tag, eq ? 0.0 : 1.0, 0);
            free(a); free(b);
            g_ops->buf_free(g_ops->be, &g_ctx, f[k]);
        }
    }
    for (int k = 0; k < 7; k++) free(gr[k]), free(ga[k]);
    for (int k = 0; k < 7; k++) g_ops->buf_free(g_ops->be, &g_ctx, one[k]);
    g_ops->buf_free(g_ops->be, &g_ctx, y); g_ops->buf_free(g_ops->be, &g_ctx, y2);
    release(&d);
    free_abs(&ab);
}

/* Run the glue ops on `ops` with host inputs; outputs copied back to host. */
struct glue_io {
    int B, T, H, P, G, N, n, W, E;
    float *proj, *dtb, *Alog, *gB, *gC, *Bb, *Cb, *gout;          /* inputs  */
    float *dx, *dBh, *dCh, *ddt, *dlam, *dA, *ys, *dyn;            /* upstream grads + scan output */
    float *out[17];                                                /* results */
    size_t outn[17];
    int nout;
};

static float *host_rand(size_t n, float mu, float sd)
{
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = mu + sd * (float)nrand();
    return p;
}

static float *up(const struct mt_ops_i *ops, const float *h, size_t n)
{
    float *d = ops->buf_alloc(ops->be, &g_ctx, (n ? n : 1) * sizeof(float), MT_BUCKET_OTHER);
    if (!d) { fprintf(stderr, "test_ssm: buf_alloc failed\n"); exit(1); }
    ops->copy_from_host(ops->be, d, h, n * sizeof(float));
    return d;
}

static void glue_run(const struct mt_ops_i *ops, struct glue_io *io)
{
    int n = io->n, H = io->H, N = io->N, E = io->E, W = io->W, G = io->G;
    size_t nx_ = (size_t)n * E, nb_ = (size_t)n * H * N, nd_ = (size_t)n * H;
    float *proj = up(ops, io->proj, (size_t)n * W), *dtb = up(ops, io->dtb, H), *Alog = up(ops, io->Alog, H);
    float *gB = up(ops, io->gB, N), *gC = up(ops, io->gC, N), *Bb = up(ops, io->Bb, (size_t)H * N);
    float *Cb = up(ops, io->Cb, (size_t)H * N), *gout = up(ops, io->gout, E);
    float *x = up(ops, io->dx, nx_), *Bh = up(ops, io->dBh, nb_), *Ch = up(ops, io->dCh, nb_);
    float *dt = up(ops, io->ddt, nd_), *lam = up(ops, io->dlam, nd_), *A = up(ops, io->dA, H);
    float *rstd = up(ops, io->ddt, (size_t)n * 2 * G);
    ops->ssm_prep_forward(ops->be, x, Bh, Ch, dt, lam, A, rstd, NULL, proj, dtb, Alog, gB, gC, Bb, Cb, io->B, io->T, H, io->P, G,
                          N, 1e-5f, NULL, NULL, NULL);
    float *dx = up(ops, io->dx, nx_), *dBh = up(ops, io->dBh, nb_), *dCh = up(ops, io->dCh, nb_);
    float *ddt = up(ops, io->ddt, nd_), *dlam = up(ops, io->dlam, nd_), *dA = up(ops, io->dA, H);
    float *dproj = up(ops, io->proj, (size_t)n * W);   /* every column overwritten below */
    float *gz = up(ops, io->dtb, H), *gl = up(ops, io->Alog, H), *ggB = up(ops, io->gB, N), *ggC = up(ops, io->gC, N);
    float *gBb = up(ops, io->Bb, (size_t)H * N), *gCb = up(ops, io->Cb, (size_t)H * N);
    ops->ssm_prep_backward(ops->be, dproj, gz, gl, ggB, ggC, gBb, gCb, dx, dBh, dCh, ddt, dlam, dA, Bb, Cb, lam, A,
                           rstd, proj, dtb, gB, gC, io->B, io->T, H, io->P, G, N, 1e-5f, NULL);
    float *ys = up(ops, io->ys, nx_), *yn = up(ops, io->ys, nx_), *ro = up(ops, io->ys, (size_t)n * G);
    float *dyn = up(ops, io->dyn, nx_), *dys = up(ops, io->ys, nx_), *ggo = up(ops, io->gout, E);
    ops->ssm_gate_norm_forward(ops->be, yn, ro, ys, proj, W, gout, n, E, G, 1e-5f);
    ops->ssm_gate_norm_backward(ops->be, dys, dproj, ggo, dyn, ys, proj, W, gout, ro, n, E, G);
    float *res[] = {x, Bh, Ch, dt, lam, A, rstd, dproj, gz, gl, ggB, ggC, gBb, gCb, yn, dys, ggo};
    size_t rn[] = {nx_, nb_, nb_, nd_, nd_, (size_t)H, (size_t)n * 2 * G, (size_t)n * W, (size_t)H, (size_t)H,
                   (size_t)N, (size_t)N, (size_t)H * N, (size_t)H * N, nx_, nx_, (size_t)E};
    io->nout = 17;
    for (int k = 0; k < 17; k++) {
        io->outn[k] = rn[k];
        io->out[k] = falloc(rn[k]);
        ops->sync(ops->be);
        ops->copy_to_host(ops->be, io->out[k], res[k], rn[k] * sizeof(float));
    }
    float *all[] = {proj, dtb, Alog, gB, gC, Bb, Cb, gout, x, Bh, Ch, dt, lam, A, rstd, dx, dBh, dCh, ddt, dlam, dA,
                    dproj, gz, gl, ggB, ggC, gBb, gCb, ys, yn, ro, dyn, dys, ggo};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) ops->buf_free(ops->be, &g_ctx, all[k]);
}

/* ssm_prep_forward with x NULL (not written) and ssm_prep_backward with dx
 * NULL (dproj's xs columns hold dx already: the bf16 scan with ldx = W
 * wrote them): every other output the bits of the runs with x, dx given */
/* (v = 1 also: the forward keeps its angles, ang_out, and the backward takes them, ang) */
static void test_prep_null(int B, int T, int H, int P, int G, int N)
{
    const struct mt_ops_i *ops = g_ops;
    const int n = B * T, E = H * P, W = 2 * E + 2 * G * N + H + H * N / 2 + H;
    const size_t nx_ = (size_t)n * E, nb_ = (size_t)n * H * N, nd_ = (size_t)n * H, nw = (size_t)n * W;
    char tag[64];
    snprintf(tag, sizeof tag, "%s T=%d", ops->name, T);
    const size_t ng = (nx_ > nb_ ? nx_ : nb_) + (size_t)n * 2 * G;   /* enough for any of them */
    float *hp = host_rand(nw, 0.0f, 1.0f), *hv = host_rand((size_t)H * N, 1.0f, 0.3f), *hg = host_rand(ng, 0.0f, 1.0f);
    float *proj = up(ops, hp, nw), *vH = up(ops, hv, H), *vN = up(ops, hv, N), *vHN = up(ops, hv, (size_t)H * N);
    float *f[2][6], *dproj[2], *par[2][6];
    /* v = 1 also asks for Bh, Ch's bf16 twins: bf16 of run 0's fp32 Bh, Ch, bit for bit;
     * and passes Bh, Ch NULL (the twins alone, mt_ops.h): their buffers untouched */
    mt_bf16 *tw[2] = {dev_bf16(nb_, BF16_SENTINEL), dev_bf16(nb_, BF16_SENTINEL)};
    /* v = 1: x and dx NULL; the angles kept by the forward (ang_out), taken by the backward */
    for (int v = 0; v < 2; v++) {
        f[v][0] = up(ops, hg, nx_); f[v][1] = up(ops, hg, nb_); f[v][2] = up(ops, hg, nb_);
        f[v][3] = up(ops, hg, nd_); f[v][4] = up(ops, hg, nd_); f[v][5] = up(ops, hg, (size_t)n * 2 * G);
        float *A = up(ops, hv, H), *ang = v ? up(ops, hg, (size_t)n * H * (N / 2)) : NULL;
        ops->ssm_prep_forward(ops->be, v ? NULL : f[v][0], v ? NULL : f[v][1], v ? NULL : f[v][2], f[v][3], f[v][4], A,
                              f[v][5], NULL, proj, vH, vH, vN, vN, vHN, vHN, B, T, H, P, G, N, 1e-5f,
                              v ? tw[0] : NULL, v ? tw[1] : NULL, ang);
        dproj[v] = up(ops, hp, nw);
        float *dx = up(ops, hg, nx_);
        if (v)   /* what the scan would have written: dx in the xs columns */
            for (int r = 0; r < n; r++)
                ops->copy_from_host(ops->be, dproj[v] + (size_t)r * W + E, hg + (size_t)r * E, (size_t)E * sizeof(float));
        for (int k = 0; k < 6; k++) par[v][k] = up(ops, hv, k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N);
        float *gBh = up(ops, hg, nb_), *gCh = up(ops, hg + 1, nb_), *gdt = up(ops, hg + 2, nd_);
        float *gdl = up(ops, hg + 3, nd_), *gA = up(ops, hv + 1, H);
        ops->ssm_prep_backward(ops->be, dproj[v], par[v][0], par[v][1], par[v][2], par[v][3], par[v][4], par[v][5],
                               v ? NULL : dx, gBh, gCh, gdt, gdl, gA, vHN, vHN, f[v][4], A, f[v][5], proj, vH,
                               vN, vN, B, T, H, P, G, N, 1e-5f, ang);
        float *tmp[] = {dx, A, gBh, gCh, gdt, gdl, gA};
        for (size_t k = 0; k < sizeof(tmp) / sizeof(tmp[0]); k++) ops->buf_free(ops->be, &g_ctx, tmp[k]);
        if (ang) ops->buf_free(ops->be, &g_ctx, ang);
    }
    int same = 1;
    for (int k = 1; k < 6; k++) {
        if (k < 3) continue;   /* Bh, Ch: NULL in run 1 */
        size_t len = k < 3 ? nb_ : k < 5 ? nd_ : (size_t)n * 2 * G;
        float *a = to_host(f[0][k], len), *b = to_host(f[1][k], len);
        same &= memcmp(a, b, len * sizeof(float)) == 0;
        free(a); free(b);
    }
    float *a = to_host(f[1][0], nx_);   /* x NULL: its buffer as it was */
    int kept = memcmp(a, hg, nx_ * sizeof(float)) == 0;
    free(a);
    for (int k = 1; k <= 2; k++) {   /* Bh, Ch NULL: likewise */
        a = to_host(f[1][k], nb_);
        kept &= memcmp(a, hg, nb_ * sizeof(float)) == 0;
        free(a);
    }
    check(same && kept, "prep forward, x, Bh and Ch NULL: the other outputs' bits, x, Bh and Ch untouched", tag,
          same && kept ? 0.0 : 1.0, 0);
    size_t twin_bad = 0;
    for (int k = 0; k < 2; k++) {
        float *fh = to_host(f[0][1 + k], nb_);   /* run 0's Bh, Ch (run 1 has none) */
        uint16_t *th = bf16_to_host(tw[k], nb_);
        for (size_t i = 0; i < nb_; i++) twin_bad += th[i] != ref_bf16(fh[i]);
        free(fh); free(th);
        ops->buf_free(ops->be, &g_ctx, tw[k]);
    }
    check(twin_bad == 0, "prep forward Bh_b, Ch_b = bf16(Bh), bf16(Ch) (bits)", tag, (double)twin_bad, 0);
    same = 1;
    float *d0 = to_host(dproj[0], nw), *d1 = to_host(dproj[1], nw);
    same &= memcmp(d0, d1, nw * sizeof(float)) == 0;
    free(d0); free(d1);
    for (int k = 0; k < 6; k++) {
        size_t len = k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N;
        float *p0 = to_host(par[0][k], len), *p1 = to_host(par[1][k], len);
        same &= memcmp(p0, p1, len * sizeof(float)) == 0;
        free(p0); free(p1);
    }
    check(same, "prep backward, dx NULL (in dproj already), the forward's angles: dproj, parameter gradients' bits",
          tag,
          same ? 0.0 : 1.0, 0);
    for (int v = 0; v < 2; v++) {
        for (int k = 0; k < 6; k++) ops->buf_free(ops->be, &g_ctx, f[v][k]);
        for (int k = 0; k < 6; k++) ops->buf_free(ops->be, &g_ctx, par[v][k]);
        ops->buf_free(ops->be, &g_ctx, dproj[v]);
    }
    float *all[] = {proj, vH, vN, vHN};
    for (size_t k = 0; k < 4; k++) ops->buf_free(ops->be, &g_ctx, all[k]);
    free(hp); free(hv); free(hg);
}

/* ssm_prep_backward_bf16 (precision=bf16's dproj as bf16, mt_ops.h): every
 * column ssm_prep_backward writes (xs's too with dx given) is bf16 of its fp32
 * value, bit for bit, in dproj_b; the columns it does not write (z; xs with
 * dx NULL) untouched; the parameter gradients the same bits */
static void test_prep_bf16(int B, int T, int H, int P, int G, int N)
{
    const struct mt_ops_i *ops = g_ops;
    const int n = B * T, E = H * P, W = 2 * E + 2 * G * N + H + H * N / 2 + H;
    const size_t nx_ = (size_t)n * E, nb_ = (size_t)n * H * N, nd_ = (size_t)n * H, nw = (size_t)n * W;
    const size_t ng = (nx_ > nb_ ? nx_ : nb_) + (size_t)n * 2 * G;
    float *hp = host_rand(nw, 0.0f, 1.0f), *hv = host_rand((size_t)H * N, 1.0f, 0.3f), *hg = host_rand(ng, 0.0f, 1.0f);
    float *proj = up(ops, hp, nw), *vH = up(ops, hv, H), *vN = up(ops, hv, N), *vHN = up(ops, hv, (size_t)H * N);
    float *Bh = up(ops, hg, nb_), *Ch = up(ops, hg, nb_), *dt = up(ops, hg, nd_), *lam = up(ops, hg + 5, nd_);
    float *rstd = up(ops, hg, (size_t)n * 2 * G), *A = up(ops, hv, H), *dx = up(ops, hg + 7, nx_);
    float *gBh = up(ops, hg + 1, nb_), *gCh = up(ops, hg + 2, nb_), *gdt = up(ops, hg + 3, nd_);
    float *gdl = up(ops, hg + 4, nd_), *gA = up(ops, hv + 1, H);
    ops->ssm_prep_forward(ops->be, NULL, Bh, Ch, dt, lam, A, rstd, NULL, proj, vH, vH, vN, vN, vHN, vHN, B, T, H, P,
                          G, N, 1e-5f, NULL, NULL, NULL);
    for (int withdx = 0; withdx < 2; withdx++) {
        char tag[64];
        snprintf(tag, sizeof tag, "%s T=%d dx %s", ops->name, T, withdx ? "given" : "NULL");
        float *dproj[2], *par[2][6];
        mt_bf16 *pb = dev_bf16(nw, BF16_SENTINEL);
        for (int v = 0; v < 2; v++) {   /* v = 1: the bf16 entry */
            dproj[v] = up(ops, hp, nw);
            for (int k = 0; k < 6; k++) par[v][k] = up(ops, hv, k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N);
            if (v)
                ops->ssm_prep_backward_bf16(ops->be, pb, dproj[v], par[v][0], par[v][1], par[v][2], par[v][3],
                                            par[v][4], par[v][5], withdx ? dx : NULL, gBh, gCh, gdt, gdl, gA, vHN,
                                            vHN, lam, A, rstd, proj, vH, vN, vN, B, T, H, P, G, N, 1e-5f, NULL, NULL,
                                            NULL);
            else
                ops->ssm_prep_backward(ops->be, dproj[v], par[v][0], par[v][1], par[v][2], par[v][3], par[v][4],
                                       par[v][5], withdx ? dx : NULL, gBh, gCh, gdt, gdl, gA, vHN, vHN, lam, A, rstd,
                                       proj, vH, vN, vN, B, T, H, P, G, N, 1e-5f, NULL);
        }
        float *d0 = to_host(dproj[0], nw);
        uint16_t *hb = bf16_to_host(pb, nw);
        const int c0 = withdx ? E : 2 * E;
        size_t bad = 0, touched = 0;
        for (size_t r = 0; r < (size_t)n; r++)
            for (int c = 0; c < W; c++) {
                if (c >= c0) bad += hb[r * W + c] != ref_bf16(d0[r * W + c]);
                else touched += hb[r * W + c] != BF16_SENTINEL;
            }
        int same = 1;
        for (int k = 0; k < 6; k++) {
            size_t len = k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N;
            float *p0 = to_host(par[0][k], len), *p1 = to_host(par[1][k], len);
            same &= memcmp(p0, p1, len * sizeof(float)) == 0;
            free(p0); free(p1);
        }
        check(bad == 0, "prep backward bf16: dproj_b = bf16(dproj) (bits)", tag, (double)bad, 0);
        check(touched == 0, "prep backward bf16: the columns it does not write untouched", tag, (double)touched, 0);
        check(same, "prep backward bf16: parameter gradients' bits", tag, same ? 0.0 : 1.0, 0);
        free(d0); free(hb);
        for (int v = 0; v < 2; v++) {
            for (int k = 0; k < 6; k++) ops->buf_free(ops->be, &g_ctx, par[v][k]);
            ops->buf_free(ops->be, &g_ctx, dproj[v]);
        }
        ops->buf_free(ops->be, &g_ctx, pb);
    }
    {   /* dBh_b, dCh_b (the scan backward's dB, dC as bf16 only; dBh, dCh NULL): dproj_b and
         * the parameter gradients the bits of the entry given dBh = bf16(dBh), dCh = bf16(dCh)
         * widened */
        char tag[64];
        snprintf(tag, sizeof tag, "%s T=%d", ops->name, T);
        float *rB = dev_rounded(gBh, nb_), *rC = dev_rounded(gCh, nb_), *dproj[2], *par[2][6];
        mt_bf16 *tB = dev_twin(gBh, nb_, 1.0f), *tC = dev_twin(gCh, nb_, 1.0f), *pb[2];
        for (int v = 0; v < 2; v++) {   /* v = 1: the twins */
            pb[v] = dev_bf16(nw, BF16_SENTINEL);
            dproj[v] = up(ops, hp, nw);
            for (int k = 0; k < 6; k++) par[v][k] = up(ops, hv, k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N);
            ops->ssm_prep_backward_bf16(ops->be, pb[v], dproj[v], par[v][0], par[v][1], par[v][2], par[v][3],
                                        par[v][4], par[v][5], NULL, v ? NULL : rB, v ? NULL : rC, gdt, gdl, gA, vHN,
                                        vHN, lam, A, rstd, proj, vH, vN, vN, B, T, H, P, G, N, 1e-5f, NULL,
                                        v ? tB : NULL, v ? tC : NULL);
        }
        uint16_t *b0 = bf16_to_host(pb[0], nw), *b1 = bf16_to_host(pb[1], nw);
        int same = memcmp(b0, b1, nw * sizeof(uint16_t)) == 0;
        for (int k = 0; k < 6; k++) {
            size_t len = k < 2 ? (size_t)H : k < 4 ? (size_t)N : (size_t)H * N;
            float *p0 = to_host(par[0][k], len), *p1 = to_host(par[1][k], len);
            same &= memcmp(p0, p1, len * sizeof(float)) == 0;
            free(p0); free(p1);
        }
        check(same, "prep backward bf16: dBh_b, dCh_b (bf16 only) = dBh, dCh given as their bf16 (bits)", tag,
              same ? 0.0 : 1.0, 0);
        free(b0); free(b1);
        for (int v = 0; v < 2; v++) {
            for (int k = 0; k < 6; k++) ops->buf_free(ops->be, &g_ctx, par[v][k]);
            ops->buf_free(ops->be, &g_ctx, dproj[v]);
            ops->buf_free(ops->be, &g_ctx, pb[v]);
        }
        ops->buf_free(ops->be, &g_ctx, rB); ops->buf_free(ops->be, &g_ctx, rC);
        ops->buf_free(ops->be, &g_ctx, tB); ops->buf_free(ops->be, &g_ctx, tC);
    }
    float *all[] = {proj, vH, vN, vHN, Bh, Ch, dt, lam, rstd, A, dx, gBh, gCh, gdt, gdl, gA};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) ops->buf_free(ops->be, &g_ctx, all[k]);
    free(hp); free(hv); free(hg);
}

static void test_glue_vs_cpu(int B, int T, int H, int P, int G, int N, float theta_scale)
{
    static const char *names[17] = {"x", "Bh", "Ch", "dt", "lam", "A", "rstd_bc", "dproj", "ddt_bias", "dA_log",
                                    "dgB", "dgC", "dB_bias", "dC_bias", "gate yn", "gate dy", "gate dw"};
    struct glue_io io = {.B = B, .T = T, .H = H, .P = P, .G = G, .N = N};
    char tag[64];
    snprintf(tag, sizeof tag, "%s T=%d", g_ops->name, T);
    io.n = io.B * io.T; io.E = io.H * io.P;
    io.W = 2 * io.E + 2 * io.G * io.N + io.H + io.H * io.N / 2 + io.H;
    size_t nx_ = (size_t)io.n * io.E, nb_ = (size_t)io.n * io.H * io.N, nd_ = (size_t)io.n * io.H;
    io.proj = host_rand((size_t)io.n * io.W, 0.0f, 1.0f);
    /* theta columns scaled: the angles are a running sum over T, and the two
     * backends add in different orders (cuda: a parallel scan); with |ang|
     * ~ sqrt(T) the difference is T ulp of a large angle, not a bug. */
    size_t oth = 2 * (size_t)io.E + 2 * (size_t)io.G * io.N + (size_t)io.H;
    for (int r = 0; r < io.n; r++)
        for (int k = 0; k < io.H * io.N / 2; k++) io.proj[(size_t)r * io.W + oth + k] *= theta_scale;
    io.dtb = host_rand(io.H, -1.0f, 0.5f); io.Alog = host_rand(io.H, 1.0f, 0.3f);
    io.gB = host_rand(io.N, 1.0f, 0.2f); io.gC = host_rand(io.N, 1.0f, 0.2f);
    io.Bb = host_rand((size_t)io.H * io.N, 1.0f, 0.3f); io.Cb = host_rand((size_t)io.H * io.N, 1.0f, 0.3f);
    io.gout = host_rand(io.E, 1.0f, 0.2f);
    io.dx = host_rand(nx_, 0.0f, 1.0f); io.dBh = host_rand(nb_, 0.0f, 1.0f); io.dCh = host_rand(nb_, 0.0f, 1.0f);
    io.ddt = host_rand(nd_ > (size_t)io.n * 2 * io.G ? nd_ : (size_t)io.n * 2 * io.G, 0.0f, 1.0f);
    io.dlam = host_rand(nd_, 0.0f, 1.0f); io.dA = host_rand(io.H, 0.0f, 1.0f);
    io.ys = host_rand(nx_, 0.0f, 1.0f); io.dyn = host_rand(nx_, 0.0f, 1.0f);
    struct glue_io ref = io;
    glue_run(mt_ops_cpu(), &ref);
    glue_run(g_ops, &io);
    for (int k = 0; k < io.nout; k++) {
        double m = 1.0, e = 0.0;
        for (size_t i = 0; i < io.outn[k]; i++) m = fmax(m, fabs(ref.out[k][i]));
        for (size_t i = 0; i < io.outn[k]; i++) e = fmax(e, fabs((double)io.out[k][i] - ref.out[k][i]));
        char what[64];
        snprintf(what, sizeof what, "ssm glue %s vs cpu", names[k]);
        check(e / m < 1e-5, what, tag, e / m, 1e-5);
        free(io.out[k]); free(ref.out[k]);
    }
    float *hs[] = {io.proj, io.dtb, io.Alog, io.gB, io.gC, io.Bb, io.Cb, io.gout, io.dx, io.dBh, io.dCh, io.ddt,
                   io.dlam, io.dA, io.ys, io.dyn};
    for (size_t k = 0; k < sizeof(hs) / sizeof(hs[0]); k++) free(hs[k]);
}

/*
 * The gated norm over groups that span ranks (ssm_gate_norm_sums / _ext;
 * replicated B/C under TP, docs/mamba3.md §10): tp simulated ranks hold E/tp
 * channels each; their group-sum tables (n, G), zero outside a rank's groups,
 * are added here (the model group's all-reduce), and every rank's forward
 * (out, rstd) and backward (dy, dz, dw) slice must equal the whole norm of
 * the cpu backend's ssm_gate_norm_* (finite-difference checked in
 * test_mamba3). The plant of issue 31 (each rank's own sums, no all-reduce)
 * must move the forward by far more than the tolerance where a group spans
 * ranks.
 */
static void gate_slice(float *dst, const float *src, int n, int ld_src, int c0, int w, int ld_dst)
{
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * ld_dst, src + (size_t)i * ld_src + c0, (size_t)w * sizeof(float));
}

static void test_gate_split(int n, int E, int G, int tp)
{
    const struct mt_ops_i *cpu = mt_ops_cpu(), *ops = g_ops;
    const int ldz = E + 3, El = E / tp, ldzl = El + 2, cg = E / G;
    const size_t nE = (size_t)n * E, nG = (size_t)n * G, nl = (size_t)n * El;
    float *y = host_rand(nE, 0.0f, 1.0f), *z = host_rand((size_t)n * ldz, 0.0f, 1.5f), *w = host_rand(E, 1.0f, 0.2f);
    float *dout = host_rand(nE, 0.0f, 1.0f);
    /* the whole norm on the cpu backend */
    float *r_out = falloc(nE), *r_rstd = falloc(nG), *r_dy = falloc(nE), *r_dz = falloc((size_t)n * ldz), *r_dw = falloc(E);
    cpu->ssm_gate_norm_forward(cpu->be, r_out, r_rstd, y, z, ldz, w, n, E, G, 1e-5f);
    cpu->ssm_gate_norm_backward(cpu->be, r_dy, r_dz, r_dw, dout, y, z, ldz, w, r_rstd, n, E, G);
    /* per rank: its slices on the backend under test */
    float *dy_[8], *dz_[8], *dw_[8], *dd_[8], *rs_[8];
    float *tab = falloc(nG), *tab2 = falloc(nG), *own = falloc(nG), *hl = falloc((size_t)n * ldzl);
    float *tdev = up(ops, tab, nG);
    MT_ASSERT(tp <= 8);
    for (int r = 0; r < tp; r++) {
        const int c0 = r * El;
        gate_slice(hl, y, n, E, c0, El, El); dy_[r] = up(ops, hl, nl);
        memset(hl, 0, (size_t)n * ldzl * sizeof(float));
        gate_slice(hl, z, n, ldz, c0, El, ldzl); dz_[r] = up(ops, hl, (size_t)n * ldzl);
        dw_[r] = up(ops, w + c0, El);
        gate_slice(hl, dout, n, E, c0, El, El); dd_[r] = up(ops, hl, nl);
        rs_[r] = up(ops, tab, nG);   /* rstd (n, ng <= G) */
    }
    /* forward: the sums of squares, all-reduced; then each rank's slice */
    for (int pass = 0; pass < 2; pass++) {   /* 0: forward sums; 1: the backward's mean-term sums */
        float *acc = pass ? tab2 : tab;
        memset(acc, 0, nG * sizeof(float));
        for (int r = 0; r < tp; r++) {
            const int c0 = r * El;
            ops->fill(ops->be, tdev, 0.0f, nG);
            ops->ssm_gate_norm_sums(ops->be, tdev + c0 / cg, G, dy_[r], dz_[r], ldzl, dw_[r], pass ? dd_[r] : NULL,
                                    pass ? rs_[r] : NULL, n, El, c0, cg);
            float *t = to_host(tdev, nG);
            for (size_t i = 0; i < nG; i++) acc[i] += t[i];
            if (r == 0 && !pass) memcpy(own, t, nG * sizeof(float));
            free(t);
        }
        if (pass) break;
        /* the forward from the reduced table */
        float *out = falloc(nE), *rstd = falloc(nG);
        g_ops->copy_from_host(g_ops->be, tdev, tab, nG * sizeof(float));
        for (int r = 0; r < tp; r++) {
            const int c0 = r * El, g0 = c0 / cg, ng = (c0 + El - 1) / cg - g0 + 1;
            float *o = dev_zero(nl);
            ops->ssm_gate_norm_forward_ext(ops->be, o, rs_[r], dy_[r], dz_[r], ldzl, dw_[r], tdev + g0, G, n, El, c0, cg,
                                           1e-5f);
            float *oh = to_host(o, nl), *rh = to_host(rs_[r], (size_t)n * ng);
            for (int i = 0; i < n; i++) {
                memcpy(out + (size_t)i * E + c0, oh + (size_t)i * El, (size_t)El * sizeof(float));
                for (int j = 0; j < ng; j++) rstd[(size_t)i * G + g0 + j] = rh[(size_t)i * ng + j];
            }
            free(oh); free(rh);
            ops->buf_free(ops->be, &g_ctx, o);
        }
        double m = 1.0, e = 0.0, er = 0.0, mr = 1.0;
        for (size_t i = 0; i < nE; i++) { m = fmax(m, fabs(r_out[i])); e = fmax(e, fabs((double)out[i] - r_out[i])); }
        for (size_t i = 0; i < nG; i++) { mr = fmax(mr, fabs(r_rstd[i])); er = fmax(er, fabs((double)rstd[i] - r_rstd[i])); }
        char tag[64];
        snprintf(tag, sizeof tag, "%s n=%d E=%d G=%d tp=%d", g_ops->name, n, E, G, tp);
        check(e / m < 1e-5, "gate norm split: out vs whole (cpu)", tag, e / m, 1e-5);
        check(er / mr < 1e-5, "gate norm split: rstd vs whole (cpu)", tag, er / mr, 1e-5);
        /* the plant: rank 0 normalises by its own sums only */
        if (cg > El || (El % cg) != 0) {
            float *o = dev_zero(nl);
            g_ops->copy_from_host(g_ops->be, tdev, own, nG * sizeof(float));
            ops->ssm_gate_norm_forward_ext(ops->be, o, rs_[0], dy_[0], dz_[0], ldzl, dw_[0], tdev, G, n, El, 0, cg, 1e-5f);
            float *oh = to_host(o, nl);
            double ep = 0.0;
            for (int i = 0; i < n; i++)
                for (int c = 0; c < El; c++) ep = fmax(ep, fabs((double)oh[(size_t)i * El + c] - r_out[(size_t)i * E + c]));
            check(ep / m > 1e-2, "gate norm split: rank-local sums differ", tag, ep / m, 1e-2);
            free(oh);
            ops->buf_free(ops->be, &g_ctx, o);
            /* restore rank 0's rstd for the backward */
            g_ops->copy_from_host(g_ops->be, tdev, tab, nG * sizeof(float));
            o = dev_zero(nl);
            ops->ssm_gate_norm_forward_ext(ops->be, o, rs_[0], dy_[0], dz_[0], ldzl, dw_[0], tdev, G, n, El, 0, cg, 1e-5f);
            ops->buf_free(ops->be, &g_ctx, o);
        }
        free(out); free(rstd);
    }
    /* backward from the reduced mean-term table */
    float *dy = falloc(nE), *dz = falloc((size_t)n * ldz), *dw = falloc(E);
    g_ops->copy_from_host(g_ops->be, tdev, tab2, nG * sizeof(float));
    for (int r = 0; r < tp; r++) {
        const int c0 = r * El, g0 = c0 / cg;
        float *ddy = dev_zero(nl), *ddz = up(ops, hl, (size_t)n * ldzl), *ddw = up(ops, dw + c0, El);
        ops->ssm_gate_norm_backward_ext(ops->be, ddy, ddz, ddw, dd_[r], dy_[r], dz_[r], ldzl, dw_[r], rs_[r], tdev + g0,
                                        G, n, El, c0, cg);
        float *a = to_host(ddy, nl), *b = to_host(ddz, (size_t)n * ldzl), *c = to_host(ddw, El);
        for (int i = 0; i < n; i++) {
            memcpy(dy + (size_t)i * E + c0, a + (size_t)i * El, (size_t)El * sizeof(float));
            memcpy(dz + (size_t)i * ldz + c0, b + (size_t)i * ldzl, (size_t)El * sizeof(float));
        }
        memcpy(dw + c0, c, (size_t)El * sizeof(float));
        free(a); free(b); free(c);
        float *p[] = {ddy, ddz, ddw};
        for (int k = 0; k < 3; k++) ops->buf_free(ops->be, &g_ctx, p[k]);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "%s n=%d E=%d G=%d tp=%d", g_ops->name, n, E, G, tp);
    const float *got[] = {dy, dz, dw}, *want[] = {r_dy, r_dz, r_dw};
    const size_t len[] = {nE, (size_t)n * ldz, (size_t)E};
    const char *nm[] = {"gate norm split: dy vs whole (cpu)", "gate norm split: dz vs whole (cpu)",
                        "gate norm split: dw vs whole (cpu)"};
    for (int k = 0; k < 3; k++) {
        double m = 1.0, e = 0.0;
        for (size_t i = 0; i < len[k]; i++) { m = fmax(m, fabs(want[k][i])); e = fmax(e, fabs((double)got[k][i] - want[k][i])); }
        check(e / m < 1e-5, nm[k], tag, e / m, 1e-5);
    }
    for (int r = 0; r < tp; r++) {
        float *p[] = {dy_[r], dz_[r], dw_[r], dd_[r], rs_[r]};
        for (int k = 0; k < 5; k++) ops->buf_free(ops->be, &g_ctx, p[k]);
    }
    ops->buf_free(ops->be, &g_ctx, tdev);
    float *hp[] = {y, z, w, dout, r_out, r_rstd, r_dy, r_dz, r_dw, tab, tab2, own, hl, dy, dz, dw};
    for (size_t k = 0; k < sizeof(hp) / sizeof(hp[0]); k++) free(hp[k]);
}

/* bf16(x), round to nearest even, the test's own reference (finite inputs) */
static uint16_t ref_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* y and z given as bf16 (y_b: the bf16 scan's ys stored so; zin_b: the in-projection's
 * bf16 z block, rows 2 ldz apart as in the mixer's proj, mt_ops.h) to both bf16
 * gated-norm entries, the fp32 operand NULL: the bits of the entries given their
 * widened values as fp32 y, z (out_b, rstd; backward dy, dz_b, dy_b, dw), each alone
 * and both. yh, zh: host y, z (rounded here; z rows ldz apart); dw on the device */
static void test_gate_yz_b(const float *yh, const float *zh, int ldz, const float *dw, int n, int E, int G,
                           const char *tag)
{
    const struct mt_ops_i *ops = g_ops;
    const size_t nE = (size_t)n * E, nG = (size_t)n * G, nz = (size_t)n * ldz, ldzb = 2 * (size_t)ldz;
    uint16_t *hb = malloc(nE * sizeof(uint16_t)), *hzb = malloc(n * ldzb * sizeof(uint16_t));
    float *hw = malloc(nE * sizeof(float)), *hzw = malloc(nz * sizeof(float));
    MT_ASSERT(hb && hw && hzb && hzw);
    for (size_t i = 0; i < nE; i++) {
        hb[i] = ref_bf16(yh[i]);
        const uint32_t u = (uint32_t)hb[i] << 16;
        memcpy(&hw[i], &u, sizeof u);
    }
    for (size_t i = 0; i < n * ldzb; i++) hzb[i] = BF16_SENTINEL;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < ldz; c++) {
            const uint16_t b = ref_bf16(zh[(size_t)r * ldz + c]);
            const uint32_t u = (uint32_t)b << 16;
            memcpy(&hzw[(size_t)r * ldz + c], &u, sizeof u);
            if (c < E) hzb[(size_t)r * ldzb + c] = b;
        }
    float *yw = up(ops, hw, nE), *zw = up(ops, hzw, nz);
    mt_bf16 *yb = dev_bf16(nE, 0), *zb_in = dev_bf16(n * ldzb, 0);
    ops->copy_from_host(ops->be, yb, hb, nE * sizeof(uint16_t));
    ops->copy_from_host(ops->be, zb_in, hzb, n * ldzb * sizeof(uint16_t));
    mt_bf16 *ob[4];
    float *rs[4];
    for (int v = 0; v < 4; v++) {   /* v & 1: y_b; v & 2: zin_b */
        const int vy = v & 1, vz = v & 2;
        ob[v] = dev_bf16(nE, BF16_SENTINEL);
        rs[v] = dev_zero(nG);
        ops->ssm_gate_norm_forward_bf16(ops->be, NULL, ob[v], rs[v], vy ? NULL : yw, vz ? NULL : zw, ldz, dw, n, E, G,
                                        1e-5f, vy ? yb : NULL, vz ? zb_in : NULL, (int)ldzb);
    }
    uint16_t *o0 = bf16_to_host(ob[0], nE);
    float *r0 = to_host(rs[0], nG);
    size_t bad = 0;
    for (int v = 1; v < 4; v++) {
        uint16_t *o1 = bf16_to_host(ob[v], nE);
        float *r1 = to_host(rs[v], nG);
        for (size_t i = 0; i < nE; i++) bad += o0[i] != o1[i];
        bad += memcmp(r0, r1, nG * sizeof(float)) != 0;
        free(o1); free(r1);
    }
    check(bad == 0, "gate norm bf16: y, z as bf16 (y_b, zin_b) = their widened values as fp32 (out_b, rstd bits)",
          tag, (double)bad, 0);
    if (ops->ssm_gate_norm_backward_bf16) {
        float *dout = host_rand(nE, 0.0f, 1.0f), *dd = up(ops, dout, nE), *gy[4], *gw[4];
        mt_bf16 *zb[4], *yt[4];
        for (int v = 0; v < 4; v++) {
            const int vy = v & 1, vz = v & 2;
            gy[v] = dev_zero(nE);
            gw[v] = dev_zero(E);
            zb[v] = dev_bf16(nz, BF16_SENTINEL);
            yt[v] = dev_bf16(nE, BF16_SENTINEL);
            ops->ssm_gate_norm_backward_bf16(ops->be, gy[v], zb[v], gw[v], dd, vy ? NULL : yw, vz ? NULL : zw, ldz, dw,
                                             rs[0], n, E, G, yt[v], vy ? yb : NULL, vz ? zb_in : NULL, (int)ldzb, NULL);
        }
        float *y0 = to_host(gy[0], nE), *w0 = to_host(gw[0], E);
        uint16_t *z0 = bf16_to_host(zb[0], nz), *t0 = bf16_to_host(yt[0], nE);
        size_t bb = 0;
        for (int v = 1; v < 4; v++) {
            float *y1 = to_host(gy[v], nE), *w1 = to_host(gw[v], E);
            uint16_t *z1 = bf16_to_host(zb[v], nz), *t1 = bf16_to_host(yt[v], nE);
            bb += (memcmp(y0, y1, nE * sizeof(float)) != 0) + (memcmp(w0, w1, E * sizeof(float)) != 0) +
                  (memcmp(z0, z1, nz * sizeof(uint16_t)) != 0) + (memcmp(t0, t1, nE * sizeof(uint16_t)) != 0);
            free(y1); free(w1); free(z1); free(t1);
        }
        check(bb == 0, "gate norm backward bf16: y_b, zin_b = their widened values (dy, dz_b, dy_b, dw bits)", tag,
              (double)bb, 0);
        for (int v = 0; v < 4; v++) {
            ops->buf_free(ops->be, &g_ctx, gy[v]);
            ops->buf_free(ops->be, &g_ctx, gw[v]);
            ops->buf_free(ops->be, &g_ctx, zb[v]);
            ops->buf_free(ops->be, &g_ctx, yt[v]);
        }
        ops->buf_free(ops->be, &g_ctx, dd);
        free(dout); free(y0); free(w0); free(z0); free(t0);
    }
    for (int v = 0; v < 4; v++) {
        ops->buf_free(ops->be, &g_ctx, ob[v]);
        ops->buf_free(ops->be, &g_ctx, rs[v]);
    }
    ops->buf_free(ops->be, &g_ctx, yw);
    ops->buf_free(ops->be, &g_ctx, zw);
    ops->buf_free(ops->be, &g_ctx, yb);
    ops->buf_free(ops->be, &g_ctx, zb_in);
    free(hb); free(hw); free(hzb); free(hzw); free(o0); free(r0);
}

/* ssm_gate_norm_forward_bf16 (precision=bf16's gated norm): out and rstd the
 * bits of ssm_gate_norm_forward on the same backend, out_b = bf16(out)
 * exactly (nearest even, the cpu's rounding), and with out NULL the same
 * twin and rstd. */
static void test_gate_bf16(int n, int E, int G)
{
    const struct mt_ops_i *ops = g_ops;
    const int ldz = E + 5;
    const size_t nE = (size_t)n * E, nG = (size_t)n * G;
    float *y = host_rand(nE, 0.0f, 1.0f), *z = host_rand((size_t)n * ldz, 0.0f, 1.5f), *w = host_rand(E, 1.0f, 0.2f);
    float *dy = up(ops, y, nE), *dz = up(ops, z, (size_t)n * ldz), *dw = up(ops, w, E);
    float *o0 = dev_zero(nE), *r0 = dev_zero(nG), *o1 = dev_zero(nE), *r1 = dev_zero(nG), *r2 = dev_zero(nG);
    mt_bf16 *b1 = ops->buf_alloc(ops->be, &g_ctx, nE * sizeof(mt_bf16), MT_BUCKET_OTHER);
    mt_bf16 *b2 = ops->buf_alloc(ops->be, &g_ctx, nE * sizeof(mt_bf16), MT_BUCKET_OTHER);
    MT_ASSERT(b1 && b2);
    ops->ssm_gate_norm_forward(ops->be, o0, r0, dy, dz, ldz, dw, n, E, G, 1e-5f);
    ops->ssm_gate_norm_forward_bf16(ops->be, o1, b1, r1, dy, dz, ldz, dw, n, E, G, 1e-5f, NULL, NULL, 0);
    ops->ssm_gate_norm_forward_bf16(ops->be, NULL, b2, r2, dy, dz, ldz, dw, n, E, G, 1e-5f, NULL, NULL, 0);
    float *h0 = to_host(o0, nE), *h1 = to_host(o1, nE), *hr0 = to_host(r0, nG), *hr1 = to_host(r1, nG);
    float *hr2 = to_host(r2, nG);
    mt_bf16 *hb1 = malloc(nE * sizeof(mt_bf16)), *hb2 = malloc(nE * sizeof(mt_bf16));
    MT_ASSERT(hb1 && hb2);
    ops->sync(ops->be);
    ops->copy_to_host(ops->be, hb1, b1, nE * sizeof(mt_bf16));
    ops->copy_to_host(ops->be, hb2, b2, nE * sizeof(mt_bf16));
    size_t bad_out = 0, bad_twin = 0, bad_null = 0, bad_rstd = 0;
    for (size_t i = 0; i < nE; i++) {
        bad_out += memcmp(&h0[i], &h1[i], sizeof(float)) != 0;
        bad_twin += hb1[i] != ref_bf16(h0[i]);
        bad_null += hb2[i] != hb1[i];
    }
    for (size_t i = 0; i < nG; i++)
        bad_rstd += memcmp(&hr0[i], &hr1[i], sizeof(float)) != 0 || memcmp(&hr0[i], &hr2[i], sizeof(float)) != 0;
    char tag[64];
    snprintf(tag, sizeof tag, "%s n=%d E=%d G=%d", ops->name, n, E, G);
    check(bad_out == 0, "gate norm bf16: out = ssm_gate_norm_forward's (bits)", tag, (double)bad_out, 0);
    check(bad_rstd == 0, "gate norm bf16: rstd = ssm_gate_norm_forward's (bits, out given or NULL)", tag, (double)bad_rstd, 0);
    check(bad_twin == 0, "gate norm bf16: twin = bf16(out), nearest even", tag, (double)bad_twin, 0);
    check(bad_null == 0, "gate norm bf16: out NULL gives the same twin", tag, (double)bad_null, 0);
    if (ops->ssm_gate_norm_backward_bf16) {
        /* the backward with dz as bf16 (dproj's z columns, mt_ops.h): dz_b = bf16(dz)
         * of ssm_gate_norm_backward, the row's other columns untouched; dy, dw its bits;
         * dy_b = bf16(dy) */
        const size_t nz = (size_t)n * ldz;
        float *dout = host_rand(nE, 0.0f, 1.0f), *dd = up(ops, dout, nE);
        float *gy[2], *gz = dev_zero(nz), *gw[2];
        mt_bf16 *zb = dev_bf16(nz, BF16_SENTINEL), *yb = dev_bf16(nE, BF16_SENTINEL);
        for (int v = 0; v < 2; v++) { gy[v] = dev_zero(nE); gw[v] = up(ops, w, E); }
        ops->ssm_gate_norm_backward(ops->be, gy[0], gz, gw[0], dd, dy, dz, ldz, dw, r0, n, E, G);
        ops->ssm_gate_norm_backward_bf16(ops->be, gy[1], zb, gw[1], dd, dy, dz, ldz, dw, r0, n, E, G, yb, NULL, NULL,
                                         0, NULL);
        float *hz = to_host(gz, nz), *y0 = to_host(gy[0], nE), *y1 = to_host(gy[1], nE);
        float *w0 = to_host(gw[0], E), *w1 = to_host(gw[1], E);
        uint16_t *hzb = bf16_to_host(zb, nz);
        size_t bad = 0, touched = 0;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < ldz; c++) {
                const size_t o = (size_t)i * ldz + c;
                if (c < E) bad += hzb[o] != ref_bf16(hz[o]);
                else touched += hzb[o] != BF16_SENTINEL;
            }
        const int same = memcmp(y0, y1, nE * sizeof(float)) == 0 && memcmp(w0, w1, E * sizeof(float)) == 0;
        check(bad == 0 && touched == 0, "gate norm backward bf16: dz_b = bf16(dz), stride kept", tag,
              (double)(bad + touched), 0);
        check(same, "gate norm backward bf16: dy, dw the bits of the fp32 entry", tag, same ? 0.0 : 1.0, 0);
        uint16_t *hyb = bf16_to_host(yb, nE);
        size_t bad_y = 0;
        for (size_t i = 0; i < nE; i++) bad_y += hyb[i] != ref_bf16(y0[i]);
        check(bad_y == 0, "gate norm backward bf16: dy_b = bf16(dy) (bits)", tag, (double)bad_y, 0);
        {   /* dy NULL: dy as bf16 only, into dy_b, the same bits; dz_b, dw unchanged */
            mt_bf16 *zb2 = dev_bf16(nz, BF16_SENTINEL), *yb2 = dev_bf16(nE, BF16_SENTINEL);
            float *gw2 = up(ops, w, E);
            ops->ssm_gate_norm_backward_bf16(ops->be, NULL, zb2, gw2, dd, dy, dz, ldz, dw, r0, n, E, G, yb2, NULL,
                                             NULL, 0, NULL);
            uint16_t *a = bf16_to_host(yb2, nE), *za = bf16_to_host(zb2, nz);
            float *w2 = to_host(gw2, E);
            const int same2 = memcmp(a, hyb, nE * sizeof(uint16_t)) == 0 &&
                              memcmp(za, hzb, nz * sizeof(uint16_t)) == 0 && memcmp(w2, w0, E * sizeof(float)) == 0;
            check(same2, "gate norm backward bf16 dy NULL: dy_b, dz_b, dw the bits of dy given", tag, same2 ? 0.0 : 1.0,
                  0);
            free(a); free(za); free(w2);
            ops->buf_free(ops->be, &g_ctx, zb2); ops->buf_free(ops->be, &g_ctx, yb2);
            ops->buf_free(ops->be, &g_ctx, gw2);
        }
        {   /* dout_b (dout stored bf16, dout NULL): the bits of the call given dout = bf16(dout) widened */
            mt_bf16 *zbv[2], *ybv[2], *db = dev_twin(dd, nE, 1.0f);
            float *gwv[2], *dr = falloc(nE);
            for (size_t i = 0; i < nE; i++) {
                const uint32_t u = (uint32_t)ref_bf16(dout[i]) << 16;
                memcpy(&dr[i], &u, sizeof u);
            }
            float *ddr = up(ops, dr, nE);
            for (int v = 0; v < 2; v++) {   /* 0: dout = bf16(dout) widened; 1: dout_b */
                zbv[v] = dev_bf16(nz, BF16_SENTINEL), ybv[v] = dev_bf16(nE, BF16_SENTINEL), gwv[v] = up(ops, w, E);
                ops->ssm_gate_norm_backward_bf16(ops->be, NULL, zbv[v], gwv[v], v ? NULL : ddr, dy, dz, ldz, dw, r0, n,
                                                 E, G, ybv[v], NULL, NULL, 0, v ? db : NULL);
            }
            uint16_t *y0b = bf16_to_host(ybv[0], nE), *y1b = bf16_to_host(ybv[1], nE);
            uint16_t *z0b = bf16_to_host(zbv[0], nz), *z1b = bf16_to_host(zbv[1], nz);
            float *w0v = to_host(gwv[0], E), *w1v = to_host(gwv[1], E);
            const int same3 = memcmp(y0b, y1b, nE * sizeof(uint16_t)) == 0 &&
                              memcmp(z0b, z1b, nz * sizeof(uint16_t)) == 0 && memcmp(w0v, w1v, E * sizeof(float)) == 0;
            check(same3, "gate norm backward bf16 dout_b: the bits of dout = bf16(dout)", tag, same3 ? 0.0 : 1.0, 0);
            free(y0b); free(y1b); free(z0b); free(z1b); free(w0v); free(w1v); free(dr);
            for (int v = 0; v < 2; v++) {
                ops->buf_free(ops->be, &g_ctx, zbv[v]); ops->buf_free(ops->be, &g_ctx, ybv[v]);
                ops->buf_free(ops->be, &g_ctx, gwv[v]);
            }
            ops->buf_free(ops->be, &g_ctx, db); ops->buf_free(ops->be, &g_ctx, ddr);
        }
        free(hyb);
        ops->buf_free(ops->be, &g_ctx, yb);
        float *fr[] = {dout, hz, y0, y1, w0, w1};
        for (size_t k = 0; k < sizeof(fr) / sizeof(fr[0]); k++) free(fr[k]);
        free(hzb);
        float *dv2[] = {dd, gy[0], gy[1], gz, gw[0], gw[1]};
        for (size_t k = 0; k < sizeof(dv2) / sizeof(dv2[0]); k++) ops->buf_free(ops->be, &g_ctx, dv2[k]);
        ops->buf_free(ops->be, &g_ctx, zb);
    }
    test_gate_yz_b(y, z, ldz, dw, n, E, G, tag);
    float *dv[] = {dy, dz, dw, o0, r0, o1, r1, r2};
    for (size_t k = 0; k < sizeof(dv) / sizeof(dv[0]); k++) ops->buf_free(ops->be, &g_ctx, dv[k]);
    ops->buf_free(ops->be, &g_ctx, b1);
    ops->buf_free(ops->be, &g_ctx, b2);
    float *hp[] = {y, z, w, h0, h1, hr0, hr1, hr2};
    for (size_t k = 0; k < sizeof(hp) / sizeof(hp[0]); k++) free(hp[k]);
    free(hb1); free(hb2);
}

/* Decoding: T calls of ssm_scan_step equal ssm_scan_forward(chunk 0), and T
 * single-token ssm_prep_forward calls with ang_state equal one call over T. */
static void test_decode(const struct inputs *in)
{
    int B = in->B, T = in->T, H = in->H, P = in->P, N = in->N;
    struct dev d;
    upload(&d, in);
    float *yf = dev_zero(nx(in));
    g_ops->ssm_scan_forward(g_ops->be, yf, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, B, T, H, P, N, 0);
    float *yref = to_host(yf, nx(in));
    float *xh = to_host(d.x, nx(in)), *bh = to_host(d.Bm, nb(in)), *ch = to_host(d.Cm, nb(in));
    float *dth = to_host(d.dt, nd(in)), *lh = to_host(d.lam, nd(in));
    size_t sx = (size_t)B * H * P, sb = (size_t)B * H * N, sd = (size_t)B * H;
    float *S = dev_zero((size_t)B * H * P * N), *xp = dev_zero(sx), *bp = dev_zero(sb), *y = dev_zero(sx);
    float *tx = falloc(sx), *tb = falloc(sb), *tc = falloc(sb), *td = falloc(sd), *tl = falloc(sd);
    float *dx = dev_zero(sx), *db = dev_zero(sb), *dc = dev_zero(sb), *dd = dev_zero(sd), *dl = dev_zero(sd);
    double e = 0.0, m = 1.0;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            size_t r = (size_t)b * T + t;
            memcpy(tx + (size_t)b * H * P, xh + r * H * P, (size_t)H * P * sizeof(float));
            memcpy(tb + (size_t)b * H * N, bh + r * H * N, (size_t)H * N * sizeof(float));
            memcpy(tc + (size_t)b * H * N, ch + r * H * N, (size_t)H * N * sizeof(float));
            memcpy(td + (size_t)b * H, dth + r * H, (size_t)H * sizeof(float));
            memcpy(tl + (size_t)b * H, lh + r * H, (size_t)H * sizeof(float));
        }
        g_ops->copy_from_host(g_ops->be, dx, tx, sx * sizeof(float)); g_ops->copy_from_host(g_ops->be, db, tb, sb * sizeof(float));
        g_ops->copy_from_host(g_ops->be, dc, tc, sb * sizeof(float)); g_ops->copy_from_host(g_ops->be, dd, td, sd * sizeof(float));
        g_ops->copy_from_host(g_ops->be, dl, tl, sd * sizeof(float));
        g_ops->ssm_scan_step(g_ops->be, y, S, xp, bp, dx, db, dc, dd, dl, d.A, d.D, B, H, P, N, t == 0);
        float *yh = to_host(y, sx);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < H * P; k++) {
                double ref = yref[((size_t)b * T + t) * H * P + k];
                m = fmax(m, fabs(ref));
                e = fmax(e, fabs(yh[(size_t)b * H * P + k] - ref));
            }
        free(yh);
    }
    check(e / m < 1e-6, "ssm_scan_step x T vs scan_forward chunk 0", g_ops->name, e / m, 1e-6);
    free(yref); free(xh); free(bh); free(ch); free(dth); free(lh);
    free(tx); free(tb); free(tc); free(td); free(tl);
    float *p[] = {yf, S, xp, bp, y, dx, db, dc, dd, dl};
    for (size_t k = 0; k < sizeof(p) / sizeof(p[0]); k++) g_ops->buf_free(g_ops->be, &g_ctx, p[k]);
    release(&d);

    /* prep: whole sequence vs token by token with ang_state */
    int G = 1, W = 2 * H * P + 2 * G * N + H + H * N / 2 + H, n = B * T;
    float *proj = host_rand((size_t)n * W, 0.0f, 1.0f), *dtb = host_rand(H, -1.0f, 0.5f);
    float *Alog = host_rand(H, 1.0f, 0.3f), *gB = host_rand(N, 1.0f, 0.2f), *gC = host_rand(N, 1.0f, 0.2f);
    float *Bb = host_rand((size_t)H * N, 1.0f, 0.3f), *Cb = host_rand((size_t)H * N, 1.0f, 0.3f);
    float *pj = up(g_ops, proj, (size_t)n * W), *pdtb = up(g_ops, dtb, H), *pAl = up(g_ops, Alog, H);
    float *pgB = up(g_ops, gB, N), *pgC = up(g_ops, gC, N), *pBb = up(g_ops, Bb, (size_t)H * N);
    float *pCb = up(g_ops, Cb, (size_t)H * N);
    float *ox = dev_zero((size_t)n * H * P), *oB = dev_zero((size_t)n * H * N), *oC = dev_zero((size_t)n * H * N);
    float *odt = dev_zero((size_t)n * H), *olam = dev_zero((size_t)n * H), *oA = dev_zero(H);
    float *orstd = dev_zero((size_t)n * 2 * G), *ang = dev_zero((size_t)B * H * N / 2);
    g_ops->ssm_prep_forward(g_ops->be, ox, oB, oC, odt, olam, oA, orstd, NULL, pj, pdtb, pAl, pgB, pgC, pBb, pCb, B, T, H, P, G,
                            N, 1e-5f, NULL, NULL, NULL);
    float *fullB = to_host(oB, (size_t)n * H * N), *fullC = to_host(oC, (size_t)n * H * N);
    float *row = falloc((size_t)B * W);
    float *prow = dev_zero((size_t)B * W);
    e = 0.0; m = 1.0;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) memcpy(row + (size_t)b * W, proj + ((size_t)b * T + t) * W, (size_t)W * sizeof(float));
        g_ops->copy_from_host(g_ops->be, prow, row, (size_t)B * W * sizeof(float));
        g_ops->ssm_prep_forward(g_ops->be, ox, oB, oC, odt, olam, oA, orstd, ang, prow, pdtb, pAl, pgB, pgC, pBb, pCb, B, 1, H, P,
                                G, N, 1e-5f, NULL, NULL, NULL);
        float *sB = to_host(oB, (size_t)B * H * N), *sC = to_host(oC, (size_t)B * H * N);
        for (int b = 0; b < B; b++)
            for (int k = 0; k < H * N; k++) {
                size_t r = ((size_t)b * T + t) * H * N + k;
                m = fmax(m, fmax(fabs(fullB[r]), fabs(fullC[r])));
                e = fmax(e, fmax(fabs(sB[(size_t)b * H * N + k] - fullB[r]), fabs(sC[(size_t)b * H * N + k] - fullC[r])));
            }
        free(sB); free(sC);
    }
    /* cpu: the same running sum, so equal to rounding of the rotation (1e-6);
     * cuda: the cumsum is a parallel scan (another order of additions), so the
     * angles differ by a few ulp of their size (~10 here): 1e-5 */
    double tol = strcmp(g_ops->name, "cpu") == 0 ? 1e-6 : 1e-5;
    check(e / m < tol, "ssm_prep_forward token by token (ang_state)", g_ops->name, e / m, tol);
    free(fullB); free(fullC); free(row); free(proj); free(dtb); free(Alog); free(gB); free(gC); free(Bb); free(Cb);
    float *q[] = {pj, pdtb, pAl, pgB, pgC, pBb, pCb, ox, oB, oC, odt, olam, oA, orstd, ang, prow};
    for (size_t k = 0; k < sizeof(q) / sizeof(q[0]); k++) g_ops->buf_free(g_ops->be, &g_ctx, q[k]);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(int only)
{
    struct inputs in;
    int B = 1, T = 1024, H = 8, P = 64, N = 64;
    make_inputs(&in, B, T, H, P, N);
    struct dev d;
    upload(&d, &in);
    float *y = dev_zero(nx(&in));
    float *dx = dev_zero(nx(&in)), *dB = dev_zero(nb(&in)), *dC = dev_zero(nb(&in));
    float *ddt = dev_zero(nd(&in)), *dlam = dev_zero(nd(&in)), *dA = dev_zero(64), *dD = dev_zero(64);
    int chunks[] = {0, 16, 32, 64, 128, 256};
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        if (only >= 0 && chunks[c] != only) continue;
        /* the machine is shared: the minimum of 10 runs */
        double tf = 1e30, tb = 0.0;
        for (int r = 0; r < 10; r++) {
            double t0 = now();
            g_ops->ssm_scan_forward(g_ops->be, y, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, B, T, H, P, N, chunks[c]);
            g_ops->sync(g_ops->be);
            tf = fmin(tf, now() - t0);
        }
        if (chunks[c] > 0) {
            tb = 1e30;
            for (int r = 0; r < 10; r++) {
                double t0 = now();
                g_ops->ssm_scan_backward(g_ops->be, dx, dB, dC, ddt, dlam, dA, dD, y, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A,
                                         d.D, B, T, H, P, N, chunks[c]);
                g_ops->sync(g_ops->be);
                tb = fmin(tb, now() - t0);
            }
        }
        /* recurrence flops: per token/head/state element ~ 6 (update) + 2 (readout) */
        double rec_flop = 8.0 * B * T * H * (double)P * N;
        printf("bench T=%d H=%d P=%d N=%d chunk=%-4d fwd %8.3f ms (%6.2f GFLOP/s of recurrence-equivalent work)  bwd %8.3f ms\n",
               T, H, P, N, chunks[c], tf * 1e3, rec_flop / tf * 1e-9, tb * 1e3);
    }
    free_inputs(&in);
}

/* precision=bf16 (the backends that have it): partial and single-token
 * chunks, T not a multiple of the chunk, and a shape of several 64-row
 * tiles, 64-column passes and source tiles per chunk (P 72, N 80, chunk
 * 128 over T 200: chunks of 128 + 72) */
/* ldx != H P where the chunked products do not run on tensor cores (chunk 0
 * here: the recurrence) is refused: MT_ERR_UNSUPPORTED in the backend's
 * status, naming ldx, and y, dx not written (mt_ops.h). The status is sticky,
 * so this runs last */
static void test_bf16_ldx_refused(void)
{
    if (!g_ops->status) return;
    struct inputs in;
    make_inputs(&in, 1, 20, 2, 4, 6);
    struct dev d;
    upload(&d, &in);
    const int E = 2 * 4, ld = E + 1;
    const size_t n = nx(&in), wide = (size_t)20 * ld;
    float *sent = falloc(wide);
    for (size_t i = 0; i < wide; i++) sent[i] = 7.0f;
    float *xw = dev_zero(wide), *y = dev_zero(n), *dxw = dev_zero(wide);
    float *g[6];
    for (int k = 0; k < 6; k++) g[k] = dev_zero(n);
    g_ops->copy_from_host(g_ops->be, xw, sent, wide * sizeof(float));
    g_ops->copy_from_host(g_ops->be, y, sent, n * sizeof(float));
    g_ops->copy_from_host(g_ops->be, dxw, sent, wide * sizeof(float));
    g_ops->ssm_scan_forward_bf16(g_ops->be, y, xw, ld, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0, NULL, NULL,
                                 NULL, NULL, NULL, 0);
    g_ops->ssm_scan_backward_bf16(g_ops->be, dxw, g[0], g[1], g[2], g[3], g[4], g[5], d.R, xw, ld, d.Bm, d.Cm, d.dt,
                                  d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL,
                                  NULL);
    char msg[256] = "";
    const enum mt_status st = g_ops->status(g_ops->be, msg, sizeof msg);
    float *yh = to_host(y, n), *dh = to_host(dxw, wide);
    int kept = memcmp(yh, sent, n * sizeof(float)) == 0 && memcmp(dh, sent, wide * sizeof(float)) == 0;
    const int ok = st == MT_ERR_UNSUPPORTED && strstr(msg, "ldx") != NULL && kept;
    check(ok, "scan_*_bf16 ldx != H*P off the tensor cores: refused, named, nothing written", "T=20 chunk=0",
          ok ? 0.0 : 1.0, 0);
    if (!ok) printf("     status %d \"%s\", outputs kept %d\n", (int)st, msg, kept);
    /* Bm or Cm NULL (a twin alone) off the tensor cores: refused too, y not written (the
     * status above is sticky: these are read from the outputs alone) */
    mt_bf16 *tb = dev_twin(d.Bm, nb(&in), 1.0f), *tc = dev_twin(d.Cm, nb(&in), 1.0f);
    for (int which = 0; which < 2; which++) {
        g_ops->ssm_scan_forward_bf16(g_ops->be, y, d.x, E, which ? d.Bm : NULL, which ? NULL : d.Cm, d.dt, d.lam, d.A,
                                     d.D, 1, 20, 2, 4, 6, 0, NULL, tb, tc, NULL, NULL, 0);
        free(yh);
        yh = to_host(y, n);
        kept = memcmp(yh, sent, n * sizeof(float)) == 0;
        check(kept, which ? "scan_*_bf16 Cm NULL off the tensor cores: refused, nothing written"
                          : "scan_*_bf16 Bm NULL off the tensor cores: refused, nothing written",
              "T=20 chunk=0", kept ? 0.0 : 1.0, 0);
    }
    g_ops->buf_free(g_ops->be, &g_ctx, tb); g_ops->buf_free(g_ops->be, &g_ctx, tc);
    {   /* y_b (y as bf16 only) off the tensor cores: refused, neither y nor y_b written */
        mt_bf16 *yb = dev_bf16(n, BF16_SENTINEL);
        g_ops->ssm_scan_forward_bf16(g_ops->be, y, d.x, E, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0, NULL,
                                     NULL, NULL, yb, NULL, 0);
        free(yh);
        yh = to_host(y, n);
        uint16_t *hb = bf16_to_host(yb, n);
        kept = memcmp(yh, sent, n * sizeof(float)) == 0;
        for (size_t i = 0; i < n; i++) kept &= hb[i] == BF16_SENTINEL;
        check(kept, "scan_forward_bf16 y_b off the tensor cores: refused, nothing written", "T=20 chunk=0",
              kept ? 0.0 : 1.0, 0);
        free(hb);
        g_ops->buf_free(g_ops->be, &g_ctx, yb);
    }
    {   /* x_b (x stored bf16) off the tensor cores, and x with x_b: refused, y not written */
        mt_bf16 *xb = dev_twin(d.x, n, 1.0f);
        for (int both = 0; both < 2; both++) {
            g_ops->ssm_scan_forward_bf16(g_ops->be, y, both ? d.x : NULL, E, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, 1, 20,
                                         2, 4, 6, both ? 4 : 0, NULL, NULL, NULL, NULL, xb, E);
            free(yh);
            yh = to_host(y, n);
            kept = memcmp(yh, sent, n * sizeof(float)) == 0;
            check(kept, both ? "scan_forward_bf16 x and x_b both given: refused, nothing written"
                             : "scan_forward_bf16 x_b off the tensor cores: refused, nothing written",
                  both ? "T=20 chunk=4" : "T=20 chunk=0", kept ? 0.0 : 1.0, 0);
        }
        g_ops->buf_free(g_ops->be, &g_ctx, xb);
    }
    {   /* dy NULL: without its twin on the tensor cores, and with it off them: refused, dx not written */
        mt_bf16 *ybt = dev_twin(d.R, n, 1.0f);
        for (int off_tc = 0; off_tc < 2; off_tc++) {
            g_ops->ssm_scan_backward_bf16(g_ops->be, dxw, g[0], g[1], g[2], g[3], g[4], g[5], NULL, d.x, E, d.Bm, d.Cm,
                                          d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, off_tc ? 0 : 4, NULL, NULL, NULL,
                                          NULL, off_tc ? ybt : NULL, NULL, 0, NULL, NULL);
            float *dh2 = to_host(dxw, wide);
            kept = memcmp(dh2, sent, wide * sizeof(float)) == 0;
            free(dh2);
            check(kept, off_tc ? "scan_backward_bf16 dy NULL off the tensor cores: refused, nothing written"
                               : "scan_backward_bf16 dy NULL without dy_b: refused, nothing written",
                  off_tc ? "T=20 chunk=0" : "T=20 chunk=4", kept ? 0.0 : 1.0, 0);
        }
        g_ops->buf_free(g_ops->be, &g_ctx, ybt);
    }
    {   /* dB_b, dC_b (dB, dC as bf16 only) off the tensor cores: refused, dx not written */
        mt_bf16 *tb2 = dev_bf16(n, BF16_SENTINEL);
        for (int which = 0; which < 2; which++) {
            g_ops->ssm_scan_backward_bf16(g_ops->be, dxw, g[0], g[1], g[2], g[3], g[4], g[5], d.R, d.x, E, d.Bm,
                                          d.Cm, d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0, NULL, NULL, NULL, NULL,
                                          NULL, NULL, 0, which ? NULL : tb2, which ? tb2 : NULL);
            float *dh2 = to_host(dxw, wide);
            uint16_t *hb2 = bf16_to_host(tb2, n);
            kept = memcmp(dh2, sent, wide * sizeof(float)) == 0;
            for (size_t i = 0; i < n; i++) kept &= hb2[i] == BF16_SENTINEL;
            free(dh2); free(hb2);
            check(kept, which ? "scan_backward_bf16 dC_b off the tensor cores: refused, nothing written"
                              : "scan_backward_bf16 dB_b off the tensor cores: refused, nothing written",
                  "T=20 chunk=0", kept ? 0.0 : 1.0, 0);
        }
        g_ops->buf_free(g_ops->be, &g_ctx, tb2);
    }
    /* ssm_prep_forward with Bh and its twin both NULL (cuda: MT_ERR_INVALID_ARG): dt,
     * its first output row, not written (T 20, H 2, P 4, G 1, N 6: W = 38) */
    if (strcmp(g_ops->name, "cpu") != 0) {
        float *hp = falloc(20 * 38), *hdt = falloc(40);
        for (int i = 0; i < 20 * 38; i++) hp[i] = 0.5f;
        for (int i = 0; i < 40; i++) hdt[i] = 7.0f;
        float *pj = dev_zero(20 * 38), *pdt = dev_zero(40), *o[5], *par = dev_zero(64);
        for (int k = 0; k < 5; k++) o[k] = dev_zero(20 * 12);
        g_ops->copy_from_host(g_ops->be, pj, hp, 20 * 38 * sizeof(float));
        g_ops->copy_from_host(g_ops->be, par, hp, 64 * sizeof(float));
        g_ops->copy_from_host(g_ops->be, pdt, hdt, 40 * sizeof(float));
        g_ops->ssm_prep_forward(g_ops->be, o[0], NULL, o[1], pdt, o[2], o[3], o[4], NULL, pj, par, par, par, par, par,
                                par, 1, 20, 2, 4, 1, 6, 1e-5f, NULL, NULL, NULL);
        float *back = to_host(pdt, 40);
        const int untouched = memcmp(back, hdt, 40 * sizeof(float)) == 0;
        check(untouched, "ssm_prep_forward Bh and Bh_b NULL: refused, nothing written", "T=20", untouched ? 0.0 : 1.0,
              0);
        /* ssm_prep_backward_bf16 with dBh_b alone (dCh_b NULL, dBh and dCh NULL): refused
         * (MT_ERR_INVALID_ARG), dproj_b not written */
        mt_bf16 *pbr = dev_bf16(20 * 38, BF16_SENTINEL), *tw1 = dev_bf16(20 * 12, 0);
        g_ops->ssm_prep_backward_bf16(g_ops->be, pbr, pj, par, par, par, par, par, par, NULL, NULL, NULL, pdt, pdt,
                                      par, par, par, pdt, par, par, pj, par, par, par, 1, 20, 2, 4, 1, 6, 1e-5f, NULL,
                                      tw1, NULL);
        uint16_t *hbr = bf16_to_host(pbr, 20 * 38);
        int kept_b = 1;
        for (int i = 0; i < 20 * 38; i++) kept_b &= hbr[i] == BF16_SENTINEL;
        check(kept_b, "ssm_prep_backward_bf16 dBh_b without dCh_b: refused, nothing written", "T=20",
              kept_b ? 0.0 : 1.0, 0);
        free(hbr);
        g_ops->buf_free(g_ops->be, &g_ctx, pbr); g_ops->buf_free(g_ops->be, &g_ctx, tw1);
        free(back); free(hp); free(hdt);
        for (int k = 0; k < 5; k++) g_ops->buf_free(g_ops->be, &g_ctx, o[k]);
        g_ops->buf_free(g_ops->be, &g_ctx, pj); g_ops->buf_free(g_ops->be, &g_ctx, pdt);
        g_ops->buf_free(g_ops->be, &g_ctx, par);
    }
    free(yh); free(dh); free(sent);
    float *all[] = {xw, y, dxw, g[0], g[1], g[2], g[3], g[4], g[5]};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) g_ops->buf_free(g_ops->be, &g_ctx, all[k]);
    release(&d);
    free_inputs(&in);
}

static void bf16_cases(void)
{
    if (g_ops->ssm_scan_forward_bf16 && g_ops->ssm_scan_backward_bf16) {
        struct { int B, T, H, P, N, chunk, fd; } bc[] = {
            {2, 37, 3, 4, 6, 8, 1}, {2, 37, 3, 4, 6, 64, 1}, {1, 64, 2, 8, 4, 1, 1}, {1, 64, 2, 8, 4, 7, 1},
            {1, 100, 2, 8, 4, 30, 1}, {1, 200, 1, 72, 80, 128, 0}, {2, 130, 2, 64, 64, 64, 0},
        };
        for (size_t c = 0; c < sizeof(bc) / sizeof(bc[0]); c++) {
            struct inputs in;
            make_inputs(&in, bc[c].B, bc[c].T, bc[c].H, bc[c].P, bc[c].N);
            test_bf16(&in, bc[c].chunk, bc[c].fd);
            free_inputs(&in);
        }
        /* chunk 0 (the recurrence): the fp32 entry's result, bit for bit */
        struct inputs in;
        make_inputs(&in, 1, 20, 2, 4, 6);
        struct dev d;
        upload(&d, &in);
        float *y = dev_zero(nx(&in)), *y2 = dev_zero(nx(&in));
        g_ops->ssm_scan_forward_bf16(g_ops->be, y, d.x, 2 * 4, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0,
                                     NULL, NULL, NULL, NULL, NULL, 0);
        g_ops->ssm_scan_forward(g_ops->be, y2, d.x, d.Bm, d.Cm, d.dt, d.lam, d.A, d.D, 1, 20, 2, 4, 6, 0);
        float *a = to_host(y, nx(&in)), *b = to_host(y2, nx(&in));
        const int same = memcmp(a, b, nx(&in) * sizeof(float)) == 0;
        check(same, "scan_forward_bf16 chunk 0 = fp32 entry", "T=20 chunk=0", same ? 0.0 : 1.0, 0);
        free(a); free(b);
        g_ops->buf_free(g_ops->be, &g_ctx, y); g_ops->buf_free(g_ops->be, &g_ctx, y2);
        release(&d);
        free_inputs(&in);
        test_bf16_ldx_refused();   /* last: it leaves the backend's sticky error set */
    } else if (strcmp(g_ops->name, "cpu") != 0) {
        printf("FAIL %s backend has no ssm_scan_*_bf16 entries\n", g_ops->name);
        n_fail++;
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a crash on a GPU keeps every line before it in the log */
    const char *backend = "cpu";
    int do_bench = 0, only = -1, bf16_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-b") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "-bench")) do_bench = 1;
        else if (!strcmp(argv[i], "-chunk") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-bf16")) bf16_only = 1;
        else { fprintf(stderr, "usage: test_ssm [-b cpu|cuda] [-bf16] [-bench [-chunk Q]]\n"); return 2; }
    }
    mt_ctx_init(&g_ctx);
    if (!strcmp(backend, "cpu")) g_ops = mt_ops_cpu();
    else if (!strcmp(backend, "cuda")) {
        char why[256];
        g_ops = mt_ops_cuda(why, sizeof why);
        if (!g_ops) { printf("SKIPPED (cuda backend: %s)\n", why); return 77; }
    } else { fprintf(stderr, "test_ssm: unknown backend %s\n", backend); return 2; }
    if (!g_ops->ssm_scan_forward || !g_ops->ssm_scan_backward || !g_ops->ssm_scan_step ||
        !g_ops->ssm_prep_forward) {
        printf("FAIL %s backend has no ssm_scan entries\n", g_ops->name);
        return 1;
    }
    if (do_bench) {
        mt_ops_cpu_pin_coretype(argc, argv);  /* the AVX-512 OpenBLAS kernels, as meshtrain uses */
        bench(only);
        return 0;
    }

    /* full: backward at every chunk of the row (and the recurrence's), decoding;
     * otherwise the forwards and the backward at chunks[1] only */
    struct { int B, T, H, P, N; int chunks[5]; int full; } cases[] = {
        {2, 37, 3, 4, 6, {0, 8, 16, 37, 64}, 1},   /* 8 and 16 do not divide 37; 64 > T */
        {1, 64, 2, 8, 4, {0, 64, 16, 1, 7}, 1},    /* one chunk; dividing; single-token chunks */
        /* several query-row tiles per chunk on cuda (16 rows a block): 64 leaves a
         * partial chunk of 36, 30 a last chunk of 10, 100 is one chunk of 7 tiles */
        {1, 100, 2, 8, 4, {0, 64, 30, 100, 0}, 0},
        /* cuda runs chunks above 256 as 256: 300 and 256 both give chunks of
         * 256 + 44 there (the cpu's fp32 backward loses ~3e-5 on dA with one
         * chunk of 300, so only the forward at those) */
        {1, 300, 1, 2, 2, {0, 64, 300, 256, 0}, 0},
    };
    if (bf16_only) {
        bf16_cases();
        printf("%s\n", n_fail ? "test_ssm: FAILED" : "test_ssm: all checks passed");
        return n_fail ? 1 : 0;
    }
    if (strcmp(g_ops->name, "cpu") != 0) {
        if (!g_ops->ssm_prep_forward || !g_ops->ssm_prep_backward || !g_ops->ssm_gate_norm_forward ||
            !g_ops->ssm_gate_norm_backward) {
            printf("FAIL %s backend has no ssm glue entries\n", g_ops->name);
            return 1;
        }
        test_glue_vs_cpu(2, 9, 4, 3, 2, 6, 1.0f);
        /* longer than one tile of the cuda cumsum (1024 positions) and than one
         * block of rows of the parameter-gradient column sums (128); theta
         * small, as in a trained model (the angle stays O(1) over T) */
        test_glue_vs_cpu(1, 1300, 2, 2, 2, 4, 0.05f);
    }
    test_prep_null(2, 9, 4, 3, 2, 6);   /* every backend: x / dx NULL (the bf16 scan's ldx path) */
    test_prep_null(1, 40, 2, 8, 1, 4);
    if (g_ops->ssm_prep_backward_bf16) {   /* optional (the cpu has none) */
        test_prep_bf16(2, 9, 4, 3, 2, 6);
        test_prep_bf16(1, 1300, 2, 2, 1, 4);   /* cuda: several cumsum tiles and column-sum blocks */
    } else if (strcmp(g_ops->name, "cpu") != 0) {
        printf("FAIL %s backend has no ssm_prep_backward_bf16 / ssm_gate_norm_backward_bf16\n", g_ops->name);
        n_fail++;
    }
    /* the gated norm over groups that span ranks: one group over 2 ranks; 2
     * groups over 4; 3 groups over 2 (a rank holds one and a half); groups
     * whole on a rank; one rank */
    if (g_ops->ssm_gate_norm_sums && g_ops->ssm_gate_norm_forward_ext && g_ops->ssm_gate_norm_backward_ext) {
        test_gate_split(7, 24, 1, 2);
        test_gate_split(5, 32, 2, 4);
        test_gate_split(5, 36, 3, 2);
        test_gate_split(6, 16, 4, 2);
        test_gate_split(4, 20, 2, 1);
        test_gate_split(300, 512, 1, 2);   /* cuda: several row blocks of the dw column sums */
    } else {
        printf("FAIL %s backend has no ssm_gate_norm_sums / _ext entries\n", g_ops->name);
        n_fail++;
    }
    if (g_ops->ssm_gate_norm_forward_bf16) {
        test_gate_bf16(7, 24, 1);
        test_gate_bf16(5, 36, 3);
        test_gate_bf16(33, 1000, 2);   /* cuda: several strides of a block's threads per group */
    } else {
        printf("FAIL %s backend has no ssm_gate_norm_forward_bf16\n", g_ops->name);
        n_fail++;
    }
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct inputs in;
        make_inputs(&in, cases[c].B, cases[c].T, cases[c].H, cases[c].P, cases[c].N);
        for (int k = 0; k < (cases[c].full ? 5 : 4); k++) test_forward(&in, cases[c].chunks[k]);
        if (cases[c].full) test_decode(&in);
        for (int k = 1; k < (cases[c].full ? 5 : 2); k++) test_backward(&in, cases[c].chunks[k]);
        if (cases[c].full) test_backward(&in, 0);
        free_inputs(&in);
    }
    bf16_cases();
    /* a gated-norm group of 640 channels against the cpu: several columns a thread
     * of cuda's 256, loaded ahead of their stores (gate_fwd_k / gate_bwd_k,
     * GATE_AHEAD; test_gate_bf16 compares the entries on one backend only).
     * Last: its draws do not move the other cases' inputs */
    if (strcmp(g_ops->name, "cpu") != 0) test_glue_vs_cpu(1, 24, 10, 64, 1, 8, 1.0f);
    printf("%s\n", n_fail ? "test_ssm: FAILED" : "test_ssm: all checks passed");
    return n_fail ? 1 : 0;
}
