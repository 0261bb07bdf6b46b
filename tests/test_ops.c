/*
 * test_ops.c — the table-driven op harness (after ggml's test-backend-ops).
 *
 * For every backend available (cpu always; cuda when built and present) and
 * for every entry of `op_tests` below, each case:
 *   1. computes a plain float64 reference written from the math in
 *      src/ops/mt_ops.h (straight loops, no cleverness: attention builds the
 *      full T x T matrix);
 *   2. on the "ref" pass (no backend involved) checks the reference backward
 *      against central finite differences of the reference forward
 *      (eps 1e-6, tolerance 1e-6 relative to scale);
 *   3. on each backend pass runs the kernel on the same float inputs and
 *      checks forward (1e-5) and backward (1e-4) against the reference, the
 *      (=) vs (+=) rule of every backward output (outputs that must be
 *      overwritten are pre-filled with NaN, outputs that accumulate with
 *      known values), the in-place variants the header allows, and
 *      determinism (two calls, identical bits).
 * The scalar loss of the backward checks is L = sum(out * W) with random W,
 * so dout = W. Inputs come from a seeded generator reset per (op, backend),
 * so every backend sees the same bits: a future cuda pass is thereby also a
 * cuda-vs-cpu comparison through the shared fp64 reference.
 *
 * Error metric: max_i |got_i - ref_i| / max_i |ref_i|  ("relative to scale";
 * bit/exact checks print the number of differing elements with tol 0).
 * Output: one line per check: "backend op case max_err tol PASS|FAIL".
 * Adding an op = adding one entry to `op_tests` (name + run function).
 * A NULL table entry is a FAIL on cpu (the reference backend must be
 * complete) and a SKIP elsewhere.
 *
 * Usage: test_ops [-o OP_SUBSTRING] [-b BACKEND]; exits 1 if any check fails.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

#define TOL_FWD   1e-5  /* backend forward vs fp64 reference, relative to scale */
#define TOL_BWD   1e-4  /* backend backward vs fp64 reference backward          */
#define TOL_FD    1e-6  /* fp64 reference backward vs central differences       */
#define FD_EPS    1e-6
#define FD_PROBES 64    /* elements probed per tensor by finite differences    */
#define MAX_BUFS  2048   /* buffers a harness run holds (freed together at its end) */

struct harness {
    const struct mt_ops_i *ops;  /* NULL on the reference (finite-difference) pass */
    const char *bname;           /* "ref", "cpu", "cuda" */
    struct mt_ctx ctx;
    uint64_t rng;
    int n_pass, n_skip;   /* failures: n_fail (mt_test.h) */
    void *dbufs[MAX_BUFS];
    int   n_dbufs;
    void *hbufs[MAX_BUFS];
    int   n_hbufs;
};

/* ------------------------------------------------------------------------ */
/* random numbers, buffers                                                  */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t next_u64(struct harness *h) { return mix64(h->rng += 0x9E3779B97F4A7C15ull); }
static double urand(struct harness *h) { return (double)(next_u64(h) >> 11) * 0x1.0p-53; }
static int irand(struct harness *h, int n) { return (int)(next_u64(h) % (uint64_t)n); }

static void *halloc(struct harness *h, size_t bytes)
{
    void *p = mt_alloc(&h->ctx, bytes, MT_BUCKET_OTHER);
    if (!p || h->n_hbufs == MAX_BUFS) {
        fprintf(stderr, "test_ops: host allocation failed\n");
        exit(2);
    }
    h->hbufs[h->n_hbufs++] = p;
    return p;
}
static float   *new_f(struct harness *h, size_t n) { return halloc(h, n * sizeof(float)); }
static double  *new_d(struct harness *h, size_t n) { return halloc(h, n * sizeof(double)); }
static int32_t *new_i(struct harness *h, size_t n) { return halloc(h, n * sizeof(int32_t)); }

static float *rand_f(struct harness *h, size_t n, double lo, double hi)
{
    float *x = new_f(h, n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand(h));
    return x;
}
static float *nan_f(struct harness *h, size_t n)
{
    float *x = new_f(h, n);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static double *to_d(struct harness *h, const float *x, size_t n)
{
    double *d = new_d(h, n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
/* init + ref: the expected value of an accumulating (+=) output */
static double *plus(struct harness *h, const float *init, const double *ref, size_t n)
{
    double *d = new_d(h, n);
    for (size_t i = 0; i < n; i++) d[i] = (double)init[i] + ref[i];
    return d;
}

static void *dalloc(struct harness *h, size_t bytes)
{
    void *p = h->ops->buf_alloc(h->ops->be, &h->ctx, bytes ? bytes : 4, MT_BUCKET_OTHER);
    if (!p || h->n_dbufs == MAX_BUFS) {
        fprintf(stderr, "test_ops: %s buf_alloc(%zu) failed: %s\n", h->bname, bytes,
                mt_ctx_last_error(&h->ctx));
        exit(2);
    }
    h->dbufs[h->n_dbufs++] = p;
    return p;
}
static float *up_f(struct harness *h, const float *x, size_t n)
{
    float *p = dalloc(h, n * sizeof(float));
    if (n) h->ops->copy_from_host(h->ops->be, p, x, n * sizeof(float));
    return p;
}
static int32_t *up_i(struct harness *h, const int32_t *x, size_t n)
{
    int32_t *p = dalloc(h, n * sizeof(int32_t));
    if (n) h->ops->copy_from_host(h->ops->be, p, x, n * sizeof(int32_t));
    return p;
}
static float *down_f(struct harness *h, const float *d, size_t n)
{
    float *x = new_f(h, n);
    h->ops->sync(h->ops->be);
    if (n) h->ops->copy_to_host(h->ops->be, x, d, n * sizeof(float));
    return x;
}
static int32_t *down_i(struct harness *h, const int32_t *d, size_t n)
{
    int32_t *x = new_i(h, n);
    h->ops->sync(h->ops->be);
    if (n) h->ops->copy_to_host(h->ops->be, x, d, n * sizeof(int32_t));
    return x;
}

static void reset(struct harness *h)
{
    for (int i = 0; i < h->n_dbufs; i++) h->ops->buf_free(h->ops->be, &h->ctx, h->dbufs[i]);
    for (int i = 0; i < h->n_hbufs; i++) mt_free(&h->ctx, h->hbufs[i]);
    h->n_dbufs = h->n_hbufs = 0;
}

/* ------------------------------------------------------------------------ */
/* errors and reporting                                                     */

static double err_rel_d(const double *got, const double *ref, size_t n)
{
    double scale = 0, e = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    if (scale == 0) scale = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (!isfinite(d)) return INFINITY;
        if (d > e) e = d;
    }
    return e / scale;
}
static double err_rel(struct harness *h, const float *got, const double *ref, size_t n)
{
    return err_rel_d(to_d(h, got, n), ref, n);
}
/* number of 4-byte elements whose bits differ */
static double ndiff(const void *a, const void *b, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += memcmp((const char *)a + 4 * i, (const char *)b + 4 * i, 4) != 0;
    return (double)c;
}
static double ndiff_i(const int32_t *a, const int32_t *b, size_t n) { return ndiff(a, b, n); }

static int checkf(struct harness *h, const char *op, double err, double tol, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int checkf(struct harness *h, const char *op, double err, double tol, const char *fmt, ...)
{
    char cs[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cs, sizeof cs, fmt, ap);
    va_end(ap);
    int ok = err <= tol;  /* NaN fails */
    printf("%-4s  %-20s %-56s %10.3e %8.1e  %s\n", h->bname, op, cs, err, tol, ok ? "PASS" : "FAIL");
    if (ok) h->n_pass++;
    else n_fail++;
    return ok;
}

/* 1 if the backend has the entry; otherwise reports FAIL (cpu) or SKIP. */
static int has(struct harness *h, const char *op, int present)
{
    if (present) return 1;
    int must = strcmp(h->bname, "cpu") == 0;
    printf("%-4s  %-20s %-56s %10s %8s  %s\n", h->bname, op, "(table entry is NULL)", "-", "-",
           must ? "FAIL" : "SKIP");
    if (must) n_fail++;
    else h->n_skip++;
    return 0;
}

/* Central differences of loss f w.r.t. x, compared with grad: max abs error
 * over probed elements / max|grad|. Probes every element of small tensors,
 * FD_PROBES pseudo-random ones of larger tensors. */
typedef double (*loss_fn)(void *ud);
static double fd_err(double *x, size_t n, const double *grad, loss_fn f, void *ud)
{
    double scale = 0, e = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(grad[i]) > scale) scale = fabs(grad[i]);
    if (scale == 0) scale = 1;
    size_t probes = n < FD_PROBES ? n : FD_PROBES;
    for (size_t t = 0; t < probes; t++) {
        size_t i = n <= FD_PROBES ? t : (size_t)(mix64(n * 131 + t) % n);
        double x0 = x[i];
        x[i] = x0 + FD_EPS;
        double lp = f(ud);
        x[i] = x0 - FD_EPS;
        double lm = f(ud);
        x[i] = x0;
        double d = fabs((lp - lm) / (2 * FD_EPS) - grad[i]);
        if (!isfinite(d)) e = INFINITY;
        else if (d > e) e = d;
    }
    f(ud);  /* leave the forward's outputs at the unperturbed x again */
    return e / scale;
}
static double wsum(const double *out, const double *w, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += out[i] * w[i];
    return s;
}

/* ------------------------------------------------------------------------ */
/* gemm                                                                     */

static void ref_gemm(int tA, int tB, int M, int N, int K, double alpha, const double *A, int lda,
                     const double *B, int ldb, double beta, double *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int q = 0; q < K; q++) {
                double a = tA ? A[(size_t)q * lda + i] : A[(size_t)i * lda + q];
                double b = tB ? B[(size_t)j * ldb + q] : B[(size_t)q * ldb + j];
                s += a * b;
            }
            double *c = &C[(size_t)i * ldc + j];
            *c = alpha * s + (beta != 0 ? beta * *c : 0);
        }
}

static void gemm_case(struct harness *h, int tA, int tB, int M, int N, int K, int pad, float alpha, float beta)
{
    const char *op = "gemm";
    int lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = rand_f(h, na, -1, 1), *B = rand_f(h, nb, -1, 1);
    float *C0 = beta == 0 ? nan_f(h, nc) : rand_f(h, nc, -1, 1);  /* beta 0: C is not read */
    if (!h->ops || !has(h, op, h->ops->gemm != NULL)) return;
    char cs[96];
    snprintf(cs, sizeof cs, "tA=%d tB=%d M=%d N=%d K=%d ld+%d a=%g b=%g", tA, tB, M, N, K, pad, alpha, beta);

    double *Cr = beta == 0 ? new_d(h, nc) : to_d(h, C0, nc);
    ref_gemm(tA, tB, M, N, K, alpha, to_d(h, A, na), lda, to_d(h, B, nb), ldb, beta, Cr, ldc);
    float *dA = up_f(h, A, na), *dB = up_f(h, B, nb), *dC = up_f(h, C0, nc);
    h->ops->gemm(h->ops->be, tA, tB, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
    float *C = down_f(h, dC, nc);

    float *got = new_f(h, (size_t)M * N);
    double *ref = new_d(h, (size_t)M * N);
    double pad_diff = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            got[(size_t)i * N + j] = C[(size_t)i * ldc + j];
            ref[(size_t)i * N + j] = Cr[(size_t)i * ldc + j];
        }
        pad_diff += ndiff(&C[(size_t)i * ldc + N], &C0[(size_t)i * ldc + N], (size_t)pad);
    }
    checkf(h, op, err_rel(h, got, ref, (size_t)M * N), TOL_FWD, "%s", cs);
    checkf(h, op, pad_diff, 0, "%s ldc pad kept", cs);
    float *dC2 = up_f(h, C0, nc);
    h->ops->gemm(h->ops->be, tA, tB, M, N, K, alpha, dA, lda, dB, ldb, beta, dC2, ldc);
    checkf(h, op, ndiff(C, down_f(h, dC2, nc), nc), 0, "%s determinism", cs);
}

static int run_gemm(struct harness *h)
{
    int f0 = n_fail;
    for (int beta = 0; beta <= 1; beta++)
        for (int tA = 0; tA <= 1; tA++)
            for (int tB = 0; tB <= 1; tB++) gemm_case(h, tA, tB, 5, 7, 13, 3, 0.75f, (float)beta);
    for (int tA = 0; tA <= 1; tA++)
        for (int tB = 0; tB <= 1; tB++) gemm_case(h, tA, tB, 67, 45, 130, 5, 1.0f, 1.0f);
    gemm_case(h, 0, 1, 1, 37, 13, 0, 1.0f, 0.0f);  /* one row (decode), tight ld */
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* fill, axpby, sumsq, all_finite, transpose                                */

static int run_fill(struct harness *h)
{
    const char *op = "fill";
    int f0 = n_fail;
    if (!h->ops || !has(h, op, h->ops->fill != NULL)) return 1;
    const size_t ns[] = {1, 13, 1000, 70001};  /* the last one takes the threaded path */
    for (int c = 0; c < 4; c++) {
        size_t n = ns[c];
        float *x0 = rand_f(h, n + 1, -1, 1);
        float *dx = up_f(h, x0, n + 1);
        h->ops->fill(h->ops->be, dx, 3.25f, n);
        float *x = down_f(h, dx, n + 1);
        double bad = 0;
        for (size_t i = 0; i < n; i++) bad += x[i] != 3.25f;
        checkf(h, op, bad, 0, "n=%zu value", n);
        checkf(h, op, ndiff(&x[n], &x0[n], 1), 0, "n=%zu x[n] untouched", n);
    }
    return n_fail == f0;
}

static void axpby_case(struct harness *h, size_t n, int with_x, float a, float b)
{
    const char *op = "axpby";
    float *x = rand_f(h, n, -2, 2), *y0 = rand_f(h, n, -2, 2);
    if (!h->ops || !has(h, op, h->ops->axpby != NULL)) return;
    double *ref = new_d(h, n);
    for (size_t i = 0; i < n; i++) ref[i] = (with_x ? (double)a * x[i] : 0) + (double)b * y0[i];
    float *dx = with_x ? up_f(h, x, n) : NULL, *dy = up_f(h, y0, n);
    h->ops->axpby(h->ops->be, dy, dx, a, b, n);
    float *y = down_f(h, dy, n);
    checkf(h, op, err_rel(h, y, ref, n), TOL_FWD, "n=%zu x=%s a=%g b=%g", n, with_x ? "yes" : "NULL", a, b);
    float *dy2 = up_f(h, y0, n);
    h->ops->axpby(h->ops->be, dy2, dx, a, b, n);
    checkf(h, op, ndiff(y, down_f(h, dy2, n), n), 0, "n=%zu x=%s determinism", n, with_x ? "yes" : "NULL");
}

static int run_axpby(struct harness *h)
{
    int f0 = n_fail;
    axpby_case(h, 13, 1, 0.5f, -1.25f);
    axpby_case(h, 1001, 1, -2.0f, 0.75f);
    axpby_case(h, 13, 1, 1.0f, 0.0f);
    axpby_case(h, 70001, 1, 0.25f, 0.5f);
    axpby_case(h, 13, 0, 0.0f, 0.5f);
    axpby_case(h, 1001, 0, 3.0f, -0.25f);  /* x NULL: a is ignored */
    axpby_case(h, 13, 0, 1.0f, 0.0f);
    return n_fail == f0;
}

static int run_sumsq(struct harness *h)
{
    const char *op = "sumsq";
    int f0 = n_fail;
    const size_t ns[] = {0, 1, 13, 65539};
    for (int c = 0; c < 4; c++) {
        size_t n = ns[c];
        float *x = rand_f(h, n ? n : 1, -3, 3);
        if (!h->ops || !has(h, op, h->ops->sumsq != NULL)) continue;
        double ref = 0;
        for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
        float *dx = up_f(h, x, n ? n : 1);
        double s1 = h->ops->sumsq(h->ops->be, dx, n), s2 = h->ops->sumsq(h->ops->be, dx, n);
        checkf(h, op, fabs(s1 - ref) / (ref > 0 ? ref : 1), 1e-6, "n=%zu", n);
        checkf(h, op, ndiff(&s1, &s2, 2) > 0, 0, "n=%zu determinism", n);
    }
    return n_fail == f0;
}

static int run_all_finite(struct harness *h)
{
    const char *op = "all_finite";
    int f0 = n_fail;
    if (!h->ops || !has(h, op, h->ops->all_finite != NULL)) return 1;
    struct { const char *name; size_t n; long at; float val; int expect; } cs[] = {
        {"n=13 finite", 13, -1, 0, 1},
        {"n=1001 finite with FLT_MAX", 1001, 500, 3.4028235e38f, 1},
        {"n=13 NaN first", 13, 0, NAN, 0},
        {"n=13 NaN last", 13, 12, NAN, 0},
        {"n=1001 NaN middle", 1001, 517, NAN, 0},
        {"n=13 +inf", 13, 6, INFINITY, 0},
        {"n=1001 -inf last", 1001, 1000, -INFINITY, 0},
        {"n=70001 finite", 70001, -1, 0, 1},
        {"n=70001 NaN near end", 70001, 69998, NAN, 0},
        {"n=70001 +inf at start", 70001, 0, INFINITY, 0},
        {"n=0", 0, -1, 0, 1},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        size_t n = cs[c].n;
        float *x = rand_f(h, n + 1, -1e3, 1e3);
        if (cs[c].at >= 0) x[cs[c].at] = cs[c].val;
        x[n] = NAN;  /* past the end: must not be read */
        float *dx = up_f(h, x, n + 1);
        int r = h->ops->all_finite(h->ops->be, dx, n);
        checkf(h, op, r != cs[c].expect, 0, "%s (want %d got %d)", cs[c].name, cs[c].expect, r);
    }
    return n_fail == f0;
}

static int run_transpose(struct harness *h)
{
    const char *op = "transpose";
    int f0 = n_fail;
    const int rc[][2] = {{5, 13}, {1, 7}, {13, 1}, {67, 130}};
    for (int c = 0; c < 4; c++) {
        int R = rc[c][0], Cc = rc[c][1];
        size_t n = (size_t)R * Cc;
        float *in = rand_f(h, n, -1, 1);
        if (!h->ops || !has(h, op, h->ops->transpose != NULL)) continue;
        float *din = up_f(h, in, n), *dout = up_f(h, nan_f(h, n), n);
        h->ops->transpose(h->ops->be, dout, din, R, Cc);
        float *out = down_f(h, dout, n);
        double bad = 0;
        for (int i = 0; i < R; i++)
            for (int j = 0; j < Cc; j++) bad += out[(size_t)j * R + i] != in[(size_t)i * Cc + j];
        checkf(h, op, bad, 0, "rows=%d cols=%d", R, Cc);
    }
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* embedding                                                                */

struct embed_case {
    int N, C, V;
    const int32_t *idx;
    double *wte, *W, *out;
};
static void ref_embed_fwd(double *out, const int32_t *idx, const double *wte, int N, int C)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = wte[(size_t)idx[n] * C + c];
}
/* dwte[idx[n]] += dout[n] */
static void ref_embed_bwd(double *dwte, const double *dout, const int32_t *idx, int N, int C)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) dwte[(size_t)idx[n] * C + c] += dout[(size_t)n * C + c];
}
static double embed_loss(void *ud)
{
    struct embed_case *e = ud;
    ref_embed_fwd(e->out, e->idx, e->wte, e->N, e->C);
    return wsum(e->out, e->W, (size_t)e->N * e->C);
}

static void embed_case(struct harness *h, int N, int C, int V, int vrange)
{
    const char *op = "embed";
    size_t nw = (size_t)V * C, no = (size_t)N * C;
    int32_t *idx = new_i(h, N);
    for (int n = 0; n < N; n++) idx[n] = irand(h, vrange);  /* vrange < V forces repeats */
    idx[N - 1] = V - 1;
    if (N > 2) idx[1] = idx[0];
    float *wte = rand_f(h, nw, -1, 1), *W = rand_f(h, no, -1, 1), *dw0 = rand_f(h, nw, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d C=%d V=%d idx<%d", N, C, V, vrange);
    struct embed_case e = {N, C, V, idx, to_d(h, wte, nw), to_d(h, W, no), new_d(h, no)};
    ref_embed_fwd(e.out, idx, e.wte, N, C);
    double *gw = new_d(h, nw);
    ref_embed_bwd(gw, e.W, idx, N, C);
    if (!h->ops) {
        checkf(h, "embed_backward", fd_err(e.wte, nw, gw, embed_loss, &e), TOL_FD, "%s fd dwte", cs);
        return;
    }
    int32_t *didx = up_i(h, idx, N);
    float *dwte = up_f(h, wte, nw);
    if (has(h, "embed_forward", h->ops->embed_forward != NULL)) {
        float *dout = up_f(h, nan_f(h, no), no);
        h->ops->embed_forward(h->ops->be, dout, didx, dwte, N, C);
        checkf(h, "embed_forward", err_rel(h, down_f(h, dout, no), e.out, no), 0, "%s exact", cs);
    }
    (void)op;
    if (has(h, "embed_backward", h->ops->embed_backward != NULL)) {
        float *dW = up_f(h, W, no), *ddw = up_f(h, dw0, nw), *ddw2 = up_f(h, dw0, nw);
        h->ops->embed_backward(h->ops->be, ddw, dW, didx, N, C, V);
        float *got = down_f(h, ddw, nw);
        checkf(h, "embed_backward", err_rel(h, got, plus(h, dw0, gw, nw), nw), TOL_BWD, "%s dwte (+=)", cs);
        h->ops->embed_backward(h->ops->be, ddw2, dW, didx, N, C, V);
        checkf(h, "embed_backward", ndiff(got, down_f(h, ddw2, nw), nw), 0, "%s determinism", cs);
    }
}

static int run_embed(struct harness *h)
{
    int f0 = n_fail;
    embed_case(h, 10, 13, 37, 37);
    embed_case(h, 10, 13, 37, 3);   /* heavy repeats */
    embed_case(h, 128, 96, 501, 40);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* rmsnorm                                                                  */

struct rms_case {
    int N, C;
    double eps;
    double *x, *w, *W, *out, *rstd;
};
/* out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) */
static void ref_rms_fwd(double *out, double *rstd, const double *x, const double *w, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = xr[c] * r * w[c];
        rstd[n] = r;
    }
}
/* dx = rstd*(dout*w - xhat*mean_c(dout*w*xhat)) (=);  dw += sum_n dout*xhat */
static void ref_rms_bwd(double *dx, double *dw, const double *dout, const double *x, const double *w,
                        const double *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
        double r = rstd[n], m = 0;
        for (int c = 0; c < C; c++) m += g[c] * w[c] * xr[c] * r;
        m /= C;
        for (int c = 0; c < C; c++) {
            double xhat = xr[c] * r;
            dx[(size_t)n * C + c] = r * (g[c] * w[c] - xhat * m);
            dw[c] += g[c] * xhat;
        }
    }
}
static double rms_loss(void *ud)
{
    struct rms_case *r = ud;
    ref_rms_fwd(r->out, r->rstd, r->x, r->w, r->N, r->C, r->eps);
    return wsum(r->out, r->W, (size_t)r->N * r->C);
}

static void rms_case(struct harness *h, int N, int C, float eps)
{
    size_t n = (size_t)N * C;
    float *x = rand_f(h, n, -2, 2), *w = rand_f(h, C, 0.5, 1.5), *W = rand_f(h, n, -1, 1);
    float *dx0 = rand_f(h, n, -1, 1), *dw0 = rand_f(h, C, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d C=%d eps=%g", N, C, eps);
    struct rms_case r = {N, C, eps, to_d(h, x, n), to_d(h, w, C), to_d(h, W, n), new_d(h, n), new_d(h, N)};
    ref_rms_fwd(r.out, r.rstd, r.x, r.w, N, C, eps);
    double *gx = new_d(h, n), *gw = new_d(h, C);
    ref_rms_bwd(gx, gw, r.W, r.x, r.w, r.rstd, N, C);
    if (!h->ops) {
        checkf(h, "rmsnorm_backward", fd_err(r.x, n, gx, rms_loss, &r), TOL_FD, "%s fd dx", cs);
        checkf(h, "rmsnorm_backward", fd_err(r.w, C, gw, rms_loss, &r), TOL_FD, "%s fd dw", cs);
        return;
    }
    if (!has(h, "rmsnorm_forward", h->ops->rmsnorm_forward != NULL)) return;
    float *dxi = up_f(h, x, n), *dwi = up_f(h, w, C);
    float *dout = up_f(h, nan_f(h, n), n), *drstd = up_f(h, nan_f(h, N), N);
    h->ops->rmsnorm_forward(h->ops->be, dout, drstd, dxi, dwi, N, C, eps);
    float *out = down_f(h, dout, n), *rstd = down_f(h, drstd, N);
    checkf(h, "rmsnorm_forward", err_rel(h, out, r.out, n), TOL_FWD, "%s out", cs);
    checkf(h, "rmsnorm_forward", err_rel(h, rstd, r.rstd, N), TOL_FWD, "%s rstd", cs);
    float *dout2 = up_f(h, nan_f(h, n), n), *drstd2 = up_f(h, nan_f(h, N), N);
    h->ops->rmsnorm_forward(h->ops->be, dout2, drstd2, dxi, dwi, N, C, eps);
    checkf(h, "rmsnorm_forward", ndiff(out, down_f(h, dout2, n), n) + ndiff(rstd, down_f(h, drstd2, N), N), 0,
           "%s determinism", cs);

    if (!has(h, "rmsnorm_backward", h->ops->rmsnorm_backward != NULL)) return;
    float *dW = up_f(h, W, n);
    for (int acc = 0; acc <= 1; acc++) {
        float *gx0 = acc ? dx0 : nan_f(h, n);
        float *ddx = up_f(h, gx0, n), *ddw = up_f(h, dw0, C);
        h->ops->rmsnorm_backward(h->ops->be, ddx, ddw, dW, dxi, dwi, drstd, N, C, acc);
        float *gotx = down_f(h, ddx, n), *gotw = down_f(h, ddw, C);
        checkf(h, "rmsnorm_backward", err_rel(h, gotx, acc ? plus(h, dx0, gx, n) : gx, n), TOL_BWD,
               "%s acc=%d dx (%s)", cs, acc, acc ? "+=" : "=");
        checkf(h, "rmsnorm_backward", err_rel(h, gotw, plus(h, dw0, gw, C), C), TOL_BWD, "%s acc=%d dw (+=)", cs,
               acc);
        float *ddx2 = up_f(h, gx0, n), *ddw2 = up_f(h, dw0, C);
        h->ops->rmsnorm_backward(h->ops->be, ddx2, ddw2, dW, dxi, dwi, drstd, N, C, acc);
        checkf(h, "rmsnorm_backward", ndiff(gotx, down_f(h, ddx2, n), n) + ndiff(gotw, down_f(h, ddw2, C), C), 0,
               "%s acc=%d determinism", cs, acc);
    }
}

static int run_rmsnorm(struct harness *h)
{
    int f0 = n_fail;
    rms_case(h, 5, 13, 1e-6f);
    rms_case(h, 12, 6, 1e-5f);   /* QK-norm shape: rows N*H, C = hd */
    rms_case(h, 64, 256, 1e-6f);
    /* the wide rows of the cuda kernels' register paths (rmsnorm.cu: NV float4
     * a lane, NV = C / 128): GPT-2's 768 (NV 6), 2048 (NV 16, the largest), and
     * past it (the scalar kernel) */
    rms_case(h, 9, 768, 1e-6f);
    rms_case(h, 5, 2048, 1e-5f);
    rms_case(h, 3, 2052, 1e-5f);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* rope                                                                     */

struct rope_case {
    int N, T, pos0, nh, hd;
    const double *cs, *sn;  /* (Tmax, hd/2) */
    double *x, *W, *out;
};
static void ref_rope_fwd(double *out, const double *x, const double *cs, const double *sn, int N, int T, int pos0,
                         int nh, int hd)
{
    int half = hd / 2;
    for (int n = 0; n < N; n++) {
        int p = pos0 + n % T;
        for (int a = 0; a < nh; a++) {
            size_t b = ((size_t)n * nh + a) * hd;
            for (int i = 0; i < half; i++) {
                double c = cs[(size_t)p * half + i], s = sn[(size_t)p * half + i];
                double x1 = x[b + i], x2 = x[b + i + half];
                out[b + i] = x1 * c - x2 * s;
                out[b + i + half] = x2 * c + x1 * s;
            }
        }
    }
}
/* dinp = R^T dout */
static void ref_rope_bwd(double *dx, const double *g, const double *cs, const double *sn, int N, int T, int pos0,
                         int nh, int hd)
{
    int half = hd / 2;
    for (int n = 0; n < N; n++) {
        int p = pos0 + n % T;
        for (int a = 0; a < nh; a++) {
            size_t b = ((size_t)n * nh + a) * hd;
            for (int i = 0; i < half; i++) {
                double c = cs[(size_t)p * half + i], s = sn[(size_t)p * half + i];
                double g1 = g[b + i], g2 = g[b + i + half];
                dx[b + i] = g1 * c + g2 * s;
                dx[b + i + half] = -g1 * s + g2 * c;
            }
        }
    }
}
static double rope_loss(void *ud)
{
    struct rope_case *r = ud;
    ref_rope_fwd(r->out, r->x, r->cs, r->sn, r->N, r->T, r->pos0, r->nh, r->hd);
    return wsum(r->out, r->W, (size_t)r->N * r->nh * r->hd);
}

static void rope_case(struct harness *h, int B, int T, int pos0, int nh, int hd, double theta)
{
    int N = B * T, half = hd / 2, Tmax = pos0 + T;
    size_t n = (size_t)N * nh * hd, nt = (size_t)Tmax * half;
    float *cosf_ = new_f(h, nt), *sinf_ = new_f(h, nt);
    for (int p = 0; p < Tmax; p++)
        for (int i = 0; i < half; i++) {
            double inv_freq = pow(theta, -2.0 * i / hd);
            cosf_[(size_t)p * half + i] = (float)cos(p * inv_freq);
            sinf_[(size_t)p * half + i] = (float)sin(p * inv_freq);
        }
    float *x = rand_f(h, n, -2, 2), *W = rand_f(h, n, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "B=%d T=%d pos0=%d nh=%d hd=%d", B, T, pos0, nh, hd);
    struct rope_case r = {N, T, pos0, nh, hd, to_d(h, cosf_, nt), to_d(h, sinf_, nt), to_d(h, x, n), to_d(h, W, n),
                          new_d(h, n)};
    ref_rope_fwd(r.out, r.x, r.cs, r.sn, N, T, pos0, nh, hd);
    double *gx = new_d(h, n);
    ref_rope_bwd(gx, r.W, r.cs, r.sn, N, T, pos0, nh, hd);
    if (!h->ops) {
        checkf(h, "rope_backward", fd_err(r.x, n, gx, rope_loss, &r), TOL_FD, "%s fd dx", cs);
        return;
    }
    float *dcos = up_f(h, cosf_, nt), *dsin = up_f(h, sinf_, nt);
    if (has(h, "rope_forward", h->ops->rope_forward != NULL)) {
        float *dx = up_f(h, x, n), *dout = up_f(h, nan_f(h, n), n), *dinpl = up_f(h, x, n);
        h->ops->rope_forward(h->ops->be, dout, dx, dcos, dsin, N, T, pos0, nh, hd);
        float *out = down_f(h, dout, n);
        checkf(h, "rope_forward", err_rel(h, out, r.out, n), TOL_FWD, "%s out", cs);
        h->ops->rope_forward(h->ops->be, dinpl, dinpl, dcos, dsin, N, T, pos0, nh, hd);
        checkf(h, "rope_forward", ndiff(out, down_f(h, dinpl, n), n), 0, "%s in place == out of place", cs);
        float *dout2 = up_f(h, nan_f(h, n), n);
        h->ops->rope_forward(h->ops->be, dout2, dx, dcos, dsin, N, T, pos0, nh, hd);
        checkf(h, "rope_forward", ndiff(out, down_f(h, dout2, n), n), 0, "%s determinism", cs);
    }
    if (has(h, "rope_backward", h->ops->rope_backward != NULL)) {
        float *dg = up_f(h, W, n), *ddx = up_f(h, nan_f(h, n), n), *dinpl = up_f(h, W, n);
        h->ops->rope_backward(h->ops->be, ddx, dg, dcos, dsin, N, T, pos0, nh, hd);
        float *got = down_f(h, ddx, n);
        checkf(h, "rope_backward", err_rel(h, got, gx, n), TOL_BWD, "%s dx (=)", cs);
        h->ops->rope_backward(h->ops->be, dinpl, dinpl, dcos, dsin, N, T, pos0, nh, hd);
        checkf(h, "rope_backward", ndiff(got, down_f(h, dinpl, n), n), 0, "%s in place == out of place", cs);
    }
}

static int run_rope(struct harness *h)
{
    int f0 = n_fail;
    rope_case(h, 2, 5, 3, 3, 6, 10000.0);
    rope_case(h, 1, 7, 0, 2, 8, 10000.0);
    rope_case(h, 3, 4, 11, 1, 2, 500.0);
    rope_case(h, 2, 32, 7, 4, 64, 10000.0);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* attention                                                                */

struct attn_case {
    int B, T, H, K, hd;
    double *q, *k, *v, *W, *out, *lse, *S;  /* S: scratch (T, T) */
};
static size_t qix(int b, int i, int h, int d, int Tq, int H, int hd)
{
    return (((size_t)b * Tq + i) * H + h) * hd + d;
}
/* Full causal softmax: S_ij = scale q_i.k_j for j <= q_pos0 + i, else -inf;
 * lse_i = log sum_j exp(S_ij); out_i = sum_j exp(S_ij - lse_i) v_j. */
static void ref_attn_fwd(double *out, double *lse, double *S, const double *q, const double *k, const double *v,
                         int B, int Tq, int Tk, int q_pos0, int H, int K, int hd)
{
    double scale = 1.0 / sqrt((double)hd);
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < H; hh++) {
            int kh = hh / (H / K);
            for (int i = 0; i < Tq; i++) {
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < Tk; j++) {
                    double s = -INFINITY;
                    if (j <= q_pos0 + i) {
                        s = 0;
                        for (int d = 0; d < hd; d++)
                            s += q[qix(b, i, hh, d, Tq, H, hd)] * k[qix(b, j, kh, d, Tk, K, hd)];
                        s *= scale;
                    }
                    S[(size_t)i * Tk + j] = s;
                    if (s > m) m = s;
                }
                for (int j = 0; j < Tk; j++) sum += exp(S[(size_t)i * Tk + j] - m);
                double l = m + log(sum);
                lse[((size_t)b * H + hh) * Tq + i] = l;
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (int j = 0; j < Tk; j++) o += exp(S[(size_t)i * Tk + j] - l) * v[qix(b, j, kh, d, Tk, K, hd)];
                    out[qix(b, i, hh, d, Tq, H, hd)] = o;
                }
            }
        }
}
/* Header's backward (Tq == Tk, q_pos0 = 0): D_i = dout_i.out_i,
 * dS = P*(dout v^T - D), dq = scale dS k, dk = scale dS^T q, dv = P^T dout
 * (dk, dv summed over the query heads sharing a kv head). */
static void ref_attn_bwd(double *dq, double *dk, double *dv, const double *g, const double *q, const double *k,
                         const double *v, const double *out, const double *lse, int B, int T, int H, int K, int hd)
{
    double scale = 1.0 / sqrt((double)hd);
    memset(dk, 0, (size_t)B * T * K * hd * sizeof(double));
    memset(dv, 0, (size_t)B * T * K * hd * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < H; hh++) {
            int kh = hh / (H / K);
            for (int i = 0; i < T; i++) {
                double l = lse[((size_t)b * H + hh) * T + i], D = 0;
                for (int d = 0; d < hd; d++) D += g[qix(b, i, hh, d, T, H, hd)] * out[qix(b, i, hh, d, T, H, hd)];
                for (int d = 0; d < hd; d++) dq[qix(b, i, hh, d, T, H, hd)] = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0, dp = 0;
                    for (int d = 0; d < hd; d++) {
                        s += q[qix(b, i, hh, d, T, H, hd)] * k[qix(b, j, kh, d, T, K, hd)];
                        dp += g[qix(b, i, hh, d, T, H, hd)] * v[qix(b, j, kh, d, T, K, hd)];
                    }
                    double P = exp(scale * s - l), dS = P * (dp - D);
                    for (int d = 0; d < hd; d++) {
                        dq[qix(b, i, hh, d, T, H, hd)] += scale * dS * k[qix(b, j, kh, d, T, K, hd)];
                        dk[qix(b, j, kh, d, T, K, hd)] += scale * dS * q[qix(b, i, hh, d, T, H, hd)];
                        dv[qix(b, j, kh, d, T, K, hd)] += P * g[qix(b, i, hh, d, T, H, hd)];
                    }
                }
            }
        }
}
static double attn_loss(void *ud)
{
    struct attn_case *a = ud;
    ref_attn_fwd(a->out, a->lse, a->S, a->q, a->k, a->v, a->B, a->T, a->T, 0, a->H, a->K, a->hd);
    return wsum(a->out, a->W, (size_t)a->B * a->T * a->H * a->hd);
}

/* rows [i0, i0+Tq) of (B,T,H,hd) / of lse (B,H,T) */
static float *rows_f(struct harness *h, const float *x, int B, int T, int H, int hd, int i0, int Tq)
{
    float *r = new_f(h, (size_t)B * Tq * H * hd);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++)
            memcpy(&r[qix(b, i, 0, 0, Tq, H, hd)], &x[qix(b, i0 + i, 0, 0, T, H, hd)], (size_t)H * hd * sizeof(float));
    return r;
}
static double *rows_d(struct harness *h, const double *x, int B, int T, int H, int hd, int i0, int Tq)
{
    double *r = new_d(h, (size_t)B * Tq * H * hd);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++)
            memcpy(&r[qix(b, i, 0, 0, Tq, H, hd)], &x[qix(b, i0 + i, 0, 0, T, H, hd)], (size_t)H * hd * sizeof(double));
    return r;
}
static double *lse_rows_d(struct harness *h, const double *lse, int B, int T, int H, int i0, int Tq)
{
    double *r = new_d(h, (size_t)B * H * Tq);
    for (int bh = 0; bh < B * H; bh++)
        for (int i = 0; i < Tq; i++) r[(size_t)bh * Tq + i] = lse[(size_t)bh * T + i0 + i];
    return r;
}

static void attn_case(struct harness *h, int B, int T, int H, int K, int hd)
{
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * K * hd, nl = (size_t)B * H * T;
    float *q = rand_f(h, nq, -1.5, 1.5), *k = rand_f(h, nk, -1.5, 1.5), *v = rand_f(h, nk, -1, 1);
    float *W = rand_f(h, nq, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "B=%d T=%d H=%d K=%d hd=%d", B, T, H, K, hd);
    struct attn_case a = {B, T, H, K, hd, to_d(h, q, nq), to_d(h, k, nk), to_d(h, v, nk), to_d(h, W, nq),
                          new_d(h, nq), new_d(h, nl), new_d(h, (size_t)T * T)};
    ref_attn_fwd(a.out, a.lse, a.S, a.q, a.k, a.v, B, T, T, 0, H, K, hd);
    double *gq = new_d(h, nq), *gk = new_d(h, nk), *gv = new_d(h, nk);
    ref_attn_bwd(gq, gk, gv, a.W, a.q, a.k, a.v, a.out, a.lse, B, T, H, K, hd);
    if (!h->ops) {
        checkf(h, "attention_backward", fd_err(a.q, nq, gq, attn_loss, &a), TOL_FD, "%s fd dq", cs);
        checkf(h, "attention_backward", fd_err(a.k, nk, gk, attn_loss, &a), TOL_FD, "%s fd dk", cs);
        checkf(h, "attention_backward", fd_err(a.v, nk, gv, attn_loss, &a), TOL_FD, "%s fd dv", cs);
        return;
    }
    const char *opf = "attention_forward", *opb = "attention_backward";
    if (!has(h, opf, h->ops->attention_forward != NULL)) return;
    float *dq = up_f(h, q, nq), *dk = up_f(h, k, nk), *dv = up_f(h, v, nk);
    float *dout = up_f(h, nan_f(h, nq), nq), *dlse = up_f(h, nan_f(h, nl), nl);
    h->ops->attention_forward(h->ops->be, dout, dlse, dq, dk, dv, B, T, T, 0, H, K, hd);
    float *out = down_f(h, dout, nq), *lse = down_f(h, dlse, nl);
    checkf(h, opf, err_rel(h, out, a.out, nq), TOL_FWD, "%s train out", cs);
    checkf(h, opf, err_rel(h, lse, a.lse, nl), TOL_FWD, "%s train lse", cs);
    float *dout2 = up_f(h, nan_f(h, nq), nq), *dlse2 = up_f(h, nan_f(h, nl), nl);
    h->ops->attention_forward(h->ops->be, dout2, dlse2, dq, dk, dv, B, T, T, 0, H, K, hd);
    checkf(h, opf, ndiff(out, down_f(h, dout2, nq), nq) + ndiff(lse, down_f(h, dlse2, nl), nl), 0,
           "%s train determinism", cs);

    /* decoding (Tq = 1, q_pos0 = T-1) and a chunk (Tq = 3, q_pos0 = T-3) against
     * the rows of the full causal reference */
    for (int c = 0; c < 2; c++) {
        int Tq = c == 0 ? 1 : 3;
        if (Tq > T) continue;
        int p0 = T - Tq;
        size_t nqq = (size_t)B * Tq * H * hd, nll = (size_t)B * H * Tq;
        float *dqq = up_f(h, rows_f(h, q, B, T, H, hd, p0, Tq), nqq);
        float *doo = up_f(h, nan_f(h, nqq), nqq), *dll = up_f(h, nan_f(h, nll), nll);
        h->ops->attention_forward(h->ops->be, doo, dll, dqq, dk, dv, B, Tq, T, p0, H, K, hd);
        checkf(h, opf, err_rel(h, down_f(h, doo, nqq), rows_d(h, a.out, B, T, H, hd, p0, Tq), nqq), TOL_FWD,
               "%s Tq=%d q_pos0=%d out", cs, Tq, p0);
        checkf(h, opf, err_rel(h, down_f(h, dll, nll), lse_rows_d(h, a.lse, B, T, H, p0, Tq), nll), TOL_FWD,
               "%s Tq=%d q_pos0=%d lse", cs, Tq, p0);
    }

    if (!has(h, opb, h->ops->attention_backward != NULL)) return;
    float *dg = up_f(h, W, nq);
    float *ddq = up_f(h, nan_f(h, nq), nq), *ddk = up_f(h, nan_f(h, nk), nk), *ddv = up_f(h, nan_f(h, nk), nk);
    h->ops->attention_backward(h->ops->be, ddq, ddk, ddv, dg, dq, dk, dv, dout, dlse, B, T, H, K, hd);
    float *gotq = down_f(h, ddq, nq), *gotk = down_f(h, ddk, nk), *gotv = down_f(h, ddv, nk);
    checkf(h, opb, err_rel(h, gotq, gq, nq), TOL_BWD, "%s dq (=)", cs);
    checkf(h, opb, err_rel(h, gotk, gk, nk), TOL_BWD, "%s dk (=)", cs);
    checkf(h, opb, err_rel(h, gotv, gv, nk), TOL_BWD, "%s dv (=)", cs);
    /* overwrite with finite garbage too (a kernel that accumulates into NaN fails above anyway) */
    float *g7 = rand_f(h, nq, 5, 9);
    float *ddq2 = up_f(h, g7, nq), *ddk2 = up_f(h, g7, nk), *ddv2 = up_f(h, g7, nk);
    h->ops->attention_backward(h->ops->be, ddq2, ddk2, ddv2, dg, dq, dk, dv, dout, dlse, B, T, H, K, hd);
    checkf(h, opb, ndiff(gotq, down_f(h, ddq2, nq), nq) + ndiff(gotk, down_f(h, ddk2, nk), nk) +
                       ndiff(gotv, down_f(h, ddv2, nk), nk), 0,
           "%s determinism (prefill ignored)", cs);
}

static int run_attention(struct harness *h)
{
    int f0 = n_fail;
    attn_case(h, 2, 5, 4, 2, 6);   /* GQA H/K = 2 */
    attn_case(h, 1, 7, 3, 3, 8);   /* H/K = 1 */
    attn_case(h, 2, 6, 4, 1, 4);   /* MQA H/K = 4 */
    attn_case(h, 1, 1, 2, 1, 6);   /* one token */
    attn_case(h, 2, 64, 4, 2, 32); /* larger */
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* swiglu                                                                   */

struct swiglu_case {
    size_t n;
    double *g, *u, *W, *out;
};
static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static void ref_swiglu_fwd(double *out, const double *g, const double *u, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = g[i] * sigm(g[i]) * u[i];
}
/* dg = dout*u*silu'(g), du = dout*silu(g); silu'(x) = s + x s (1-s) */
static void ref_swiglu_bwd(double *dg, double *du, const double *dout, const double *g, const double *u, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double s = sigm(g[i]);
        dg[i] = dout[i] * u[i] * (s + g[i] * s * (1 - s));
        du[i] = dout[i] * g[i] * s;
    }
}
static double swiglu_loss(void *ud)
{
    struct swiglu_case *c = ud;
    ref_swiglu_fwd(c->out, c->g, c->u, c->n);
    return wsum(c->out, c->W, c->n);
}

static void swiglu_case(struct harness *h, size_t n)
{
    float *g = rand_f(h, n, -6, 6), *u = rand_f(h, n, -2, 2), *W = rand_f(h, n, -1, 1);
    struct swiglu_case c = {n, to_d(h, g, n), to_d(h, u, n), to_d(h, W, n), new_d(h, n)};
    ref_swiglu_fwd(c.out, c.g, c.u, n);
    double *gg = new_d(h, n), *gu = new_d(h, n);
    ref_swiglu_bwd(gg, gu, c.W, c.g, c.u, n);
    if (!h->ops) {
        checkf(h, "swiglu_backward", fd_err(c.g, n, gg, swiglu_loss, &c), TOL_FD, "n=%zu fd dgate", n);
        checkf(h, "swiglu_backward", fd_err(c.u, n, gu, swiglu_loss, &c), TOL_FD, "n=%zu fd dup", n);
        return;
    }
    float *dgt = up_f(h, g, n), *dup = up_f(h, u, n);
    if (has(h, "swiglu_forward", h->ops->swiglu_forward != NULL)) {
        float *dout = up_f(h, nan_f(h, n), n), *dout2 = up_f(h, nan_f(h, n), n);
        h->ops->swiglu_forward(h->ops->be, dout, dgt, dup, n);
        float *out = down_f(h, dout, n);
        checkf(h, "swiglu_forward", err_rel(h, out, c.out, n), TOL_FWD, "n=%zu out", n);
        h->ops->swiglu_forward(h->ops->be, dout2, dgt, dup, n);
        checkf(h, "swiglu_forward", ndiff(out, down_f(h, dout2, n), n), 0, "n=%zu determinism", n);
    }
    if (has(h, "swiglu_backward", h->ops->swiglu_backward != NULL)) {
        float *dW = up_f(h, W, n), *ddg = up_f(h, nan_f(h, n), n), *ddu = up_f(h, nan_f(h, n), n);
        h->ops->swiglu_backward(h->ops->be, ddg, ddu, dW, dgt, dup, n);
        float *got_g = down_f(h, ddg, n), *got_u = down_f(h, ddu, n);
        checkf(h, "swiglu_backward", err_rel(h, got_g, gg, n), TOL_BWD, "n=%zu dgate (=)", n);
        checkf(h, "swiglu_backward", err_rel(h, got_u, gu, n), TOL_BWD, "n=%zu dup (=)", n);
        float *ddg2 = up_f(h, nan_f(h, n), n), *ddu2 = up_f(h, nan_f(h, n), n);
        h->ops->swiglu_backward(h->ops->be, ddg2, ddu2, dW, dgt, dup, n);
        checkf(h, "swiglu_backward", ndiff(got_g, down_f(h, ddg2, n), n) + ndiff(got_u, down_f(h, ddu2, n), n), 0,
               "n=%zu determinism", n);
    }
}

static int run_swiglu(struct harness *h)
{
    int f0 = n_fail;
    swiglu_case(h, 13);
    swiglu_case(h, 1);
    swiglu_case(h, 4099);
    swiglu_case(h, 20001);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* cross-entropy                                                            */

struct xent_case {
    int N, V;
    double cap, dscale;
    const int32_t *t;
    double *z, *loss, *lse;
};
/* s = cap*tanh(z/cap) (or z); lse_n = logsumexp(s_n); loss_n = lse_n - s_n[t] (0 if t == -1) */
static void ref_xent_fwd(double *loss, double *lse, const double *z, const int32_t *t, int N, int V, double cap)
{
    for (int n = 0; n < N; n++) {
        const double *zr = z + (size_t)n * V;
        double m = -INFINITY, sum = 0, st = 0;
        for (int i = 0; i < V; i++) {
            double s = cap > 0 ? cap * tanh(zr[i] / cap) : zr[i];
            if (s > m) m = s;
        }
        for (int i = 0; i < V; i++) {
            double s = cap > 0 ? cap * tanh(zr[i] / cap) : zr[i];
            sum += exp(s - m);
            if (i == t[n]) st = s;
        }
        lse[n] = m + log(sum);
        loss[n] = t[n] < 0 ? 0 : lse[n] - st;
    }
}
/* dz = dscale * (softmax(s) - onehot(t)) * ds/dz, 0 for t == -1 */
static void ref_xent_bwd(double *dz, const double *z, const double *lse, const int32_t *t, double dscale, int N,
                         int V, double cap)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < V; i++) {
            double zz = z[(size_t)n * V + i], th = cap > 0 ? tanh(zz / cap) : 0;
            double s = cap > 0 ? cap * th : zz, dsdz = cap > 0 ? 1 - th * th : 1;
            dz[(size_t)n * V + i] = t[n] < 0 ? 0 : dscale * (exp(s - lse[n]) - (i == t[n])) * dsdz;
        }
}
static double xent_loss(void *ud)
{
    struct xent_case *x = ud;
    ref_xent_fwd(x->loss, x->lse, x->z, x->t, x->N, x->V, x->cap);
    double s = 0;
    for (int n = 0; n < x->N; n++) s += x->loss[n];
    return x->dscale * s;
}

static long twin_diff(struct harness *h, const uint16_t *d, const float *out, size_t n);
static float gu_f32(uint16_t b);
static uint16_t gu_b16(float f);
static uint16_t *down_b16(struct harness *h, const uint16_t *d, size_t n);
static long b16_diff(const uint16_t *a, const uint16_t *b, size_t n);
static uint16_t *poison_b16(struct harness *h, size_t m);
static uint16_t ref_bf16(float x);

static void xent_case(struct harness *h, int N, int V, float cap, double zr)
{
    size_t nz = (size_t)N * V;
    float *z = rand_f(h, nz, -zr, zr);
    int32_t *t = new_i(h, N);
    int valid = 0;
    for (int n = 0; n < N; n++) {
        t[n] = (n % 5 == 1) ? -1 : irand(h, V);
        valid += t[n] >= 0;
    }
    if (N > 2) t[N - 1] = V - 1;
    float dscale = 1.0f / (float)valid;
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d V=%d softcap=%g |z|<%g", N, V, cap, zr);
    struct xent_case x = {N, V, cap, dscale, t, to_d(h, z, nz), new_d(h, N), new_d(h, N)};
    ref_xent_fwd(x.loss, x.lse, x.z, t, N, V, cap);
    double *gz = new_d(h, nz);
    ref_xent_bwd(gz, x.z, x.lse, t, dscale, N, V, cap);
    if (!h->ops) {
        checkf(h, "xent_backward", fd_err(x.z, nz, gz, xent_loss, &x), TOL_FD, "%s fd dlogits", cs);
        return;
    }
    if (!has(h, "xent_forward", h->ops->xent_forward != NULL)) return;
    float *dz = up_f(h, z, nz);
    int32_t *dt = up_i(h, t, N);
    float *dloss = up_f(h, nan_f(h, N), N), *dlse = up_f(h, nan_f(h, N), N);
    h->ops->xent_forward(h->ops->be, dloss, dlse, dz, dt, N, V, cap);
    float *loss = down_f(h, dloss, N), *lse = down_f(h, dlse, N);
    checkf(h, "xent_forward", err_rel(h, loss, x.loss, N), TOL_FWD, "%s losses", cs);
    /* lse on rows with a target (what backward reads), then on ignored rows */
    float *lv = new_f(h, N), *li = new_f(h, N);
    double *rv = new_d(h, N), *ri = new_d(h, N);
    int nv = 0, ni = 0;
    for (int n = 0; n < N; n++) {
        if (t[n] >= 0) { lv[nv] = lse[n]; rv[nv++] = x.lse[n]; }
        else { li[ni] = lse[n]; ri[ni++] = x.lse[n]; }
    }
    checkf(h, "xent_forward", err_rel(h, lv, rv, nv), TOL_FWD, "%s lse", cs);
    checkf(h, "xent_forward", err_rel(h, li, ri, ni), TOL_FWD, "%s lse rows target=-1", cs);
    float *dloss2 = up_f(h, nan_f(h, N), N), *dlse2 = up_f(h, nan_f(h, N), N);
    h->ops->xent_forward(h->ops->be, dloss2, dlse2, dz, dt, N, V, cap);
    checkf(h, "xent_forward", ndiff(loss, down_f(h, dloss2, N), N) + ndiff(lse, down_f(h, dlse2, N), N), 0,
           "%s determinism", cs);

    if (!has(h, "xent_backward", h->ops->xent_backward != NULL)) return;
    float *ddz = up_f(h, nan_f(h, nz), nz);
    h->ops->xent_backward(h->ops->be, ddz, dz, dlse, dt, dscale, N, V, cap);
    float *got = down_f(h, ddz, nz);
    checkf(h, "xent_backward", err_rel(h, got, gz, nz), TOL_BWD, "%s dlogits (=)", cs);
    float *inpl = up_f(h, z, nz);
    h->ops->xent_backward(h->ops->be, inpl, inpl, dlse, dt, dscale, N, V, cap);
    checkf(h, "xent_backward", ndiff(got, down_f(h, inpl, nz), nz), 0, "%s in place (dlogits == logits)", cs);

    /* one pass: losses and lse as the forward's reference, dlogits (written over
     * the logits) as the backward's; deterministic */
    if (!has(h, "xent_fused", h->ops->xent_fused != NULL)) return;
    float *fz = up_f(h, z, nz), *fl = up_f(h, nan_f(h, N), N), *fs = up_f(h, nan_f(h, N), N);
    h->ops->xent_fused(h->ops->be, fl, fs, fz, dt, dscale, N, V, cap);
    checkf(h, "xent_fused", err_rel(h, down_f(h, fl, N), x.loss, N), TOL_FWD, "%s losses", cs);
    checkf(h, "xent_fused", err_rel(h, down_f(h, fs, N), x.lse, N), TOL_FWD, "%s lse", cs);
    float *fg = down_f(h, fz, nz);
    checkf(h, "xent_fused", err_rel(h, fg, gz, nz), TOL_BWD, "%s dlogits (in place)", cs);
    float *fz2 = up_f(h, z, nz), *fl2 = up_f(h, nan_f(h, N), N), *fs2 = up_f(h, nan_f(h, N), N);
    h->ops->xent_fused(h->ops->be, fl2, fs2, fz2, dt, dscale, N, V, cap);
    checkf(h, "xent_fused", ndiff(fg, down_f(h, fz2, nz), nz) + ndiff(down_f(h, fl, N), down_f(h, fl2, N), N), 0,
           "%s determinism", cs);

    /* the bf16 twin (lm head, precision=bf16): losses and lse are xent_fused's
     * bits, the twin is bf16(xent_fused's dlogits) element by element (ignored
     * rows included: zeros); deterministic. logits is consumed (not checked). */
    if (!has(h, "xent_fused_bf16", h->ops->xent_fused_bf16 != NULL)) return;
    float *bz = up_f(h, z, nz), *bl = up_f(h, nan_f(h, N), N), *bs = up_f(h, nan_f(h, N), N);
    uint16_t *bd = dalloc(h, nz * sizeof(uint16_t));
    h->ops->xent_fused_bf16(h->ops->be, bl, bs, bz, bd, dt, dscale, N, V, cap);
    checkf(h, "xent_fused_bf16", ndiff(down_f(h, fl, N), down_f(h, bl, N), N) + ndiff(down_f(h, fs, N), down_f(h, bs, N), N),
           0, "%s losses, lse == xent_fused (bits)", cs);
    checkf(h, "xent_fused_bf16", (double)twin_diff(h, bd, fg, nz), 0, "%s twin == bf16(xent_fused dlogits)", cs);
    float *bz2 = up_f(h, z, nz);
    uint16_t *bd2 = dalloc(h, nz * sizeof(uint16_t));
    h->ops->xent_fused_bf16(h->ops->be, bl, bs, bz2, bd2, dt, dscale, N, V, cap);
    uint16_t *hb = (uint16_t *)new_f(h, (nz + 1) / 2), *hb2 = (uint16_t *)new_f(h, (nz + 1) / 2);
    h->ops->sync(h->ops->be);
    h->ops->copy_to_host(h->ops->be, hb, bd, nz * sizeof(uint16_t));
    h->ops->copy_to_host(h->ops->be, hb2, bd2, nz * sizeof(uint16_t));
    checkf(h, "xent_fused_bf16", (double)(memcmp(hb, hb2, nz * sizeof(uint16_t)) != 0), 0, "%s determinism", cs);

    /* bf16 logits (xent_fused_bf16_logits, the lm head's bf16 GEMM output):
     * losses, lse and the twin (written over the logits) are the bits of
     * widening the logits and calling xent_fused_bf16 on this backend */
    if (!has(h, "xent_fused_bf16_logits", h->ops->xent_fused_bf16_logits != NULL)) return;
    uint16_t *zh = (uint16_t *)new_f(h, (nz + 1) / 2);
    float *zw = new_f(h, nz);
    for (size_t i = 0; i < nz; i++) {
        zh[i] = ref_bf16((float)z[i]);
        uint32_t u = (uint32_t)zh[i] << 16;
        memcpy(&zw[i], &u, sizeof u);
    }
    float *wz = up_f(h, zw, nz), *wl = up_f(h, nan_f(h, N), N), *ws = up_f(h, nan_f(h, N), N);
    uint16_t *wd = dalloc(h, nz * sizeof(uint16_t)), *lz = dalloc(h, nz * sizeof(uint16_t));
    h->ops->xent_fused_bf16(h->ops->be, wl, ws, wz, wd, dt, dscale, N, V, cap);
    h->ops->copy_from_host(h->ops->be, lz, zh, nz * sizeof(uint16_t));
    float *ll = up_f(h, nan_f(h, N), N), *ls = up_f(h, nan_f(h, N), N);
    h->ops->xent_fused_bf16_logits(h->ops->be, ll, ls, lz, dt, dscale, N, V, cap);
    uint16_t *hw = (uint16_t *)new_f(h, (nz + 1) / 2), *hl = (uint16_t *)new_f(h, (nz + 1) / 2);
    h->ops->sync(h->ops->be);
    h->ops->copy_to_host(h->ops->be, hw, wd, nz * sizeof(uint16_t));
    h->ops->copy_to_host(h->ops->be, hl, lz, nz * sizeof(uint16_t));
    checkf(h, "xent_fused_bf16_logits",
           ndiff(down_f(h, wl, N), down_f(h, ll, N), N) + ndiff(down_f(h, ws, N), down_f(h, ls, N), N), 0,
           "%s losses, lse == xent_fused_bf16 on the widened logits (bits)", cs);
    long tw = 0;
    for (size_t i = 0; i < nz; i++) tw += hw[i] != hl[i];
    checkf(h, "xent_fused_bf16_logits", (double)tw, 0, "%s twin (over the logits) == xent_fused_bf16's", cs);
}

static int run_xent(struct harness *h)
{
    int f0 = n_fail;
    xent_case(h, 6, 37, 0.0f, 4.0);
    xent_case(h, 6, 37, 15.0f, 40.0);
    xent_case(h, 7, 5, 15.0f, 3.0);
    xent_case(h, 32, 1000, 0.0f, 8.0);
    xent_case(h, 32, 1000, 15.0f, 40.0);
    xent_case(h, 9, 8192, 30.0f, 60.0);
    xent_case(h, 5, 64, 0.0f, 6.0);   /* V % 8 == 0: cuda's 16-byte bf16 row loads */
    xent_case(h, 3, 20000, 0.0f, 6.0);   /* ... 2500 of them: several a thread of its 1024, loaded ahead */
    xent_case(h, 2, 60000, 0.0f, 6.0);   /* a row over the shared-memory limit: cuda's two-kernel paths */
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* MoE router                                                               */

struct router_case {
    int N, E, k;
    double *z, *probs, *lse, *gates;
    int32_t *topk;
    char *chosen;                  /* scratch (E) */
    const double *Wg, *Wp, *Wl;    /* loss weights; Wp/Wl may be NULL */
};
/* probs = softmax(z), lse = logsumexp(z); topk: k rounds of argmax over probs,
 * first maximum wins; gates = p[topk] / sum_j p[topk_j] */
static void ref_router_fwd(struct router_case *r)
{
    int E = r->E, k = r->k;
    for (int n = 0; n < r->N; n++) {
        const double *z = r->z + (size_t)n * E;
        double *p = r->probs + (size_t)n * E, m = -INFINITY, sum = 0, S = 0;
        for (int e = 0; e < E; e++)
            if (z[e] > m) m = z[e];
        for (int e = 0; e < E; e++) sum += exp(z[e] - m);
        r->lse[n] = m + log(sum);
        for (int e = 0; e < E; e++) p[e] = exp(z[e] - r->lse[n]);
        memset(r->chosen, 0, (size_t)E);
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!r->chosen[e] && (best < 0 || p[e] > p[best])) best = e;
            r->chosen[best] = 1;
            r->topk[(size_t)n * k + j] = best;
            S += p[best];
        }
        for (int j = 0; j < k; j++) r->gates[(size_t)n * k + j] = p[r->topk[(size_t)n * k + j]] / S;
    }
}
/* dp = dprobs; dp[i_j] += dg_j/S - sum_m dg_m g_m / S;
 * dz_e = p_e (dp_e - sum_e' p_e' dp_e') + dlse p_e   (=) */
static void ref_router_bwd(double *dz, const double *dg, const double *dprobs, const double *dlse,
                           const double *probs, const int32_t *topk, const double *gates, double *dp, int N, int E,
                           int k)
{
    for (int n = 0; n < N; n++) {
        const double *p = probs + (size_t)n * E;
        double S = 0, gs = 0, dot = 0;
        for (int e = 0; e < E; e++) dp[e] = dprobs ? dprobs[(size_t)n * E + e] : 0;
        for (int j = 0; j < k; j++) {
            S += p[topk[(size_t)n * k + j]];
            gs += dg[(size_t)n * k + j] * gates[(size_t)n * k + j];
        }
        for (int j = 0; j < k; j++) dp[topk[(size_t)n * k + j]] += dg[(size_t)n * k + j] / S - gs / S;
        for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        for (int e = 0; e < E; e++) dz[(size_t)n * E + e] = p[e] * (dp[e] - dot) + (dlse ? dlse[n] * p[e] : 0);
    }
}
static double router_loss(void *ud)
{
    struct router_case *r = ud;
    ref_router_fwd(r);
    double L = wsum(r->gates, r->Wg, (size_t)r->N * r->k);
    if (r->Wp) L += wsum(r->probs, r->Wp, (size_t)r->N * r->E);
    if (r->Wl) L += wsum(r->lse, r->Wl, (size_t)r->N);
    return L;
}

/* tie: explicit rows with exact ties (first maximum must win); otherwise
 * well-separated logits (a shuffled ladder with gap `gap`), so a finite
 * difference never changes the top-k choice. */
static void router_case(struct harness *h, int N, int E, int k, int tie)
{
    size_t nz = (size_t)N * E, ng = (size_t)N * k;
    float *z = new_f(h, nz);
    if (tie) {
        static const float rows[4][6] = {
            {0.5f, 2, 1, 2, 2, -1}, {1, 1, 1, 1, 1, 1}, {3, 0, 3, 0, -2, 3}, {3, 1, 1, 0, 1, 2}};
        for (size_t i = 0; i < nz; i++) z[i] = rows[(i / E) % 4][i % E];
    } else {
        int *perm = (int *)new_i(h, E);
        double gap = E <= 8 ? 0.6 : 0.15;
        for (int n = 0; n < N; n++) {
            for (int e = 0; e < E; e++) perm[e] = e;
            for (int e = E - 1; e > 0; e--) {
                int j = irand(h, e + 1), tmp = perm[e];
                perm[e] = perm[j];
                perm[j] = tmp;
            }
            for (int e = 0; e < E; e++)
                z[(size_t)n * E + e] = (float)(gap * (perm[e] - E / 2) + gap * 0.2 * (urand(h) - 0.5));
        }
    }
    float *Wg = rand_f(h, ng, -1, 1), *Wp = rand_f(h, nz, -1, 1), *Wl = rand_f(h, N, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d E=%d k=%d%s", N, E, k, tie ? " ties" : "");
    double *dWg = to_d(h, Wg, ng), *dWp = to_d(h, Wp, nz), *dWl = to_d(h, Wl, N);
    struct router_case r = {N, E, k, to_d(h, z, nz), new_d(h, nz), new_d(h, N), new_d(h, ng), new_i(h, ng), halloc(h, E),
                            dWg, NULL, NULL};
    ref_router_fwd(&r);
    double *dpscr = new_d(h, E);
    if (!h->ops) {
        if (tie) {  /* the reference itself must honour first-maximum-wins */
            static const int32_t want[4][3] = {{1, 3, 4}, {0, 1, 2}, {0, 2, 5}, {0, 5, 1}};
            double bad = 0;
            for (int n = 0; n < N; n++)
                for (int j = 0; j < k; j++) bad += r.topk[(size_t)n * k + j] != want[n % 4][j];
            checkf(h, "router_forward", bad, 0, "%s reference topk", cs);
            return;
        }
        for (int c = 0; c < 4; c++) {
            r.Wp = (c & 1) ? dWp : NULL;
            r.Wl = (c & 2) ? dWl : NULL;
            double *gz = new_d(h, nz);
            ref_router_bwd(gz, dWg, r.Wp, r.Wl, r.probs, r.topk, r.gates, dpscr, N, E, k);
            checkf(h, "router_backward", fd_err(r.z, nz, gz, router_loss, &r), TOL_FD, "%s dprobs=%s dlse=%s fd", cs,
                   r.Wp ? "yes" : "NULL", r.Wl ? "yes" : "NULL");
        }
        return;
    }
    if (!has(h, "router_forward", h->ops->router_forward != NULL)) return;
    float *dz = up_f(h, z, nz), *dprobs = up_f(h, nan_f(h, nz), nz), *dlse = up_f(h, nan_f(h, N), N);
    float *dgates = up_f(h, nan_f(h, ng), ng);
    int32_t *dtopk = up_i(h, new_i(h, ng), ng);
    h->ops->router_forward(h->ops->be, dprobs, dlse, dtopk, dgates, dz, N, E, k);
    float *probs = down_f(h, dprobs, nz), *lse = down_f(h, dlse, N), *gates = down_f(h, dgates, ng);
    int32_t *topk = down_i(h, dtopk, ng);
    checkf(h, "router_forward", err_rel(h, probs, r.probs, nz), TOL_FWD, "%s probs", cs);
    checkf(h, "router_forward", err_rel(h, lse, r.lse, N), TOL_FWD, "%s lse", cs);
    checkf(h, "router_forward", ndiff_i(topk, r.topk, ng), 0, "%s topk_idx", cs);
    checkf(h, "router_forward", err_rel(h, gates, r.gates, ng), TOL_FWD, "%s gates", cs);
    float *dprobs2 = up_f(h, nan_f(h, nz), nz), *dlse2 = up_f(h, nan_f(h, N), N), *dgates2 = up_f(h, nan_f(h, ng), ng);
    int32_t *dtopk2 = up_i(h, new_i(h, ng), ng);
    h->ops->router_forward(h->ops->be, dprobs2, dlse2, dtopk2, dgates2, dz, N, E, k);
    checkf(h, "router_forward",
           ndiff(probs, down_f(h, dprobs2, nz), nz) + ndiff(lse, down_f(h, dlse2, N), N) +
               ndiff(gates, down_f(h, dgates2, ng), ng) + ndiff_i(topk, down_i(h, dtopk2, ng), ng),
           0, "%s determinism", cs);

    if (!has(h, "router_backward", h->ops->router_backward != NULL)) return;
    float *dWgd = up_f(h, Wg, ng), *dWpd = up_f(h, Wp, nz), *dWld = up_f(h, Wl, N);
    for (int c = 0; c < 4; c++) {
        int use_p = c & 1, use_l = c & 2;
        double *gz = new_d(h, nz);
        ref_router_bwd(gz, dWg, use_p ? dWp : NULL, use_l ? dWl : NULL, r.probs, r.topk, r.gates, dpscr, N, E, k);
        float *ddz = up_f(h, nan_f(h, nz), nz), *ddz2 = up_f(h, nan_f(h, nz), nz);
        h->ops->router_backward(h->ops->be, ddz, dWgd, use_p ? dWpd : NULL, use_l ? dWld : NULL, dprobs, dtopk, dgates, N, E, k);
        float *got = down_f(h, ddz, nz);
        checkf(h, "router_backward", err_rel(h, got, gz, nz), TOL_BWD, "%s dprobs=%s dlse=%s dlogits (=)", cs,
               use_p ? "yes" : "NULL", use_l ? "yes" : "NULL");
        h->ops->router_backward(h->ops->be, ddz2, dWgd, use_p ? dWpd : NULL, use_l ? dWld : NULL, dprobs, dtopk, dgates, N, E,
                                k);
        checkf(h, "router_backward", ndiff(got, down_f(h, ddz2, nz), nz), 0, "%s dprobs=%s dlse=%s determinism", cs,
               use_p ? "yes" : "NULL", use_l ? "yes" : "NULL");
    }
}

static int run_router(struct harness *h)
{
    int f0 = n_fail;
    router_case(h, 6, 8, 2, 0);
    router_case(h, 5, 5, 3, 0);
    router_case(h, 7, 4, 1, 0);
    router_case(h, 4, 6, 3, 1);   /* exact ties: first maximum wins, in every round */
    router_case(h, 64, 64, 4, 0);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* MoE permute / combine                                                    */

struct moe_case {
    int N, k, C, Mr;   /* Mr: the real slots' rows (null slots have none) */
    const int32_t *pos, *src;
    double *h, *y, *gates, *W, *xp, *out;
};
static void ref_permute(double *xp, const double *hh, const int32_t *src, int M, int C)
{
    for (int m = 0; m < M; m++)
        for (int c = 0; c < C; c++) xp[(size_t)m * C + c] = hh[(size_t)src[m] * C + c];
}
/* dh[n] += sum_j dxp[pos[n*k+j]]; a null slot (pos < 0, SPEC 1e) has no row */
static void ref_permute_bwd(double *dh, const double *dxp, const int32_t *pos, int N, int k, int C)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++)
            for (int c = 0; c < C && pos[(size_t)n * k + j] >= 0; c++)
                dh[(size_t)n * C + c] += dxp[(size_t)pos[(size_t)n * k + j] * C + c];
}
/* out[n] += sum_j gates[n,j] y[pos[n*k+j]]; a null slot adds nothing */
static void ref_combine(double *out, const double *y, const int32_t *pos, const double *g, int N, int k, int C)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++)
            for (int c = 0; c < C && pos[(size_t)n * k + j] >= 0; c++)
                out[(size_t)n * C + c] += g[(size_t)n * k + j] * y[(size_t)pos[(size_t)n * k + j] * C + c];
}
/* dy[pos] = g dout[n] (=); dgates[n,j] = dout[n].y[pos] (=), 0 for a null slot */
static void ref_combine_bwd(double *dy, double *dg, const double *dout, const double *y, const int32_t *pos,
                            const double *g, int N, int k, int C)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            if (pos[(size_t)n * k + j] < 0) {
                dg[(size_t)n * k + j] = 0;
                continue;
            }
            size_t r = (size_t)pos[(size_t)n * k + j];
            double s = 0;
            for (int c = 0; c < C; c++) {
                dy[r * C + c] = g[(size_t)n * k + j] * dout[(size_t)n * C + c];
                s += dout[(size_t)n * C + c] * y[r * C + c];
            }
            dg[(size_t)n * k + j] = s;
        }
}
static double permute_loss(void *ud)
{
    struct moe_case *m = ud;
    ref_permute(m->xp, m->h, m->src, m->Mr, m->C);
    return wsum(m->xp, m->W, (size_t)m->Mr * m->C);
}
static double combine_loss(void *ud)
{
    struct moe_case *m = ud;
    memset(m->out, 0, (size_t)m->N * m->C * sizeof(double));
    ref_combine(m->out, m->y, m->pos, m->gates, m->N, m->k, m->C);
    return wsum(m->out, m->W, (size_t)m->N * m->C);
}

/* nnull: experts E - nnull.. are null (SPEC 1e): their slots get pos -1 and no row */
static void moe_case(struct harness *h, int N, int k, int E, int C, int nnull)
{
    int M = N * k;
    /* routing as the model does it: k distinct experts per token, then the
     * slots sorted by expert, stable in slot order n*k+j */
    int32_t *expert = new_i(h, M), *pos = new_i(h, M), *src = new_i(h, M);
    int *perm = (int *)new_i(h, E);
    for (int n = 0; n < N; n++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < k; j++) {
            int r = j + irand(h, E - j), tmp = perm[j];
            perm[j] = perm[r];
            perm[r] = tmp;
            expert[(size_t)n * k + j] = perm[j];
        }
    }
    int m = 0;
    for (int e = 0; e < E; e++)
        for (int s = 0; s < M; s++)
            if (expert[s] == e) {
                if (e >= E - nnull) {
                    pos[s] = -1;
                    continue;
                }
                pos[s] = m;
                src[m++] = s / k;
            }
    const int Mr = m;
    size_t nh = (size_t)N * C, nm = (size_t)Mr * C, ng = (size_t)M;
    float *hh = rand_f(h, nh, -1, 1), *y = rand_f(h, nm, -1, 1), *g = rand_f(h, ng, 0.05, 1);
    float *Wh = rand_f(h, nm, -1, 1), *Wo = rand_f(h, nh, -1, 1), *init_h = rand_f(h, nh, -1, 1);
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d k=%d E=%d C=%d null=%d", N, k, E, C, nnull);
    struct moe_case mc = {N, k, C, Mr, pos, src, to_d(h, hh, nh), to_d(h, y, nm), to_d(h, g, ng), to_d(h, Wh, nm),
                          new_d(h, nm), new_d(h, nh)};
    double *xp = new_d(h, nm), *gh = new_d(h, nh), *out = new_d(h, nh), *gy = new_d(h, nm), *gg = new_d(h, ng);
    ref_permute(xp, mc.h, src, Mr, C);
    ref_permute_bwd(gh, mc.W, pos, N, k, C);
    ref_combine(out, mc.y, pos, mc.gates, N, k, C);
    double *Wod = to_d(h, Wo, nh);
    ref_combine_bwd(gy, gg, Wod, mc.y, pos, mc.gates, N, k, C);
    if (!h->ops) {
        checkf(h, "moe_permute_backward", fd_err(mc.h, nh, gh, permute_loss, &mc), TOL_FD, "%s fd dh", cs);
        mc.W = Wod;
        checkf(h, "moe_combine_backward", fd_err(mc.y, nm, gy, combine_loss, &mc), TOL_FD, "%s fd dy", cs);
        checkf(h, "moe_combine_backward", fd_err(mc.gates, ng, gg, combine_loss, &mc), TOL_FD, "%s fd dgates", cs);
        return;
    }
    int32_t *dpos = up_i(h, pos, M), *dsrc = up_i(h, src, M);
    float *dhh = up_f(h, hh, nh), *dy = up_f(h, y, nm), *dg = up_f(h, g, ng);
    if (has(h, "moe_permute", h->ops->moe_permute != NULL)) {
        float *dxp = up_f(h, nan_f(h, nm), nm);
        h->ops->moe_permute(h->ops->be, dxp, dhh, dsrc, Mr, C);
        checkf(h, "moe_permute", err_rel(h, down_f(h, dxp, nm), xp, nm), 0, "%s xp (=) exact", cs);
    }
    if (has(h, "moe_permute_backward", h->ops->moe_permute_backward != NULL)) {
        float *dW = up_f(h, Wh, nm), *ddh = up_f(h, init_h, nh), *ddh2 = up_f(h, init_h, nh);
        h->ops->moe_permute_backward(h->ops->be, ddh, dW, dpos, N, k, C, 1);
        float *got = down_f(h, ddh, nh);
        checkf(h, "moe_permute_backward", err_rel(h, got, plus(h, init_h, gh, nh), nh), TOL_BWD, "%s dh (+=)", cs);
        h->ops->moe_permute_backward(h->ops->be, ddh2, dW, dpos, N, k, C, 1);
        checkf(h, "moe_permute_backward", ndiff(got, down_f(h, ddh2, nh), nh), 0, "%s determinism", cs);
        /* accumulate 0 (=): on NaN, dh not read; the bits of a zero fill and then += */
        float *dz = up_f(h, init_h, nh), *dn = up_f(h, nan_f(h, nh), nh);
        h->ops->fill(h->ops->be, dz, 0.0f, nh);
        h->ops->moe_permute_backward(h->ops->be, dz, dW, dpos, N, k, C, 1);
        h->ops->moe_permute_backward(h->ops->be, dn, dW, dpos, N, k, C, 0);
        checkf(h, "moe_permute_backward", ndiff(down_f(h, dn, nh), down_f(h, dz, nh), nh), 0,
               "%s dh (=) on NaN == zero fill then += (bits)", cs);
    }
    if (has(h, "moe_combine", h->ops->moe_combine != NULL)) {
        float *dout = up_f(h, init_h, nh), *dout2 = up_f(h, init_h, nh);
        h->ops->moe_combine(h->ops->be, dout, dy, dpos, dg, N, k, C);
        float *got = down_f(h, dout, nh);
        checkf(h, "moe_combine", err_rel(h, got, plus(h, init_h, out, nh), nh), TOL_FWD, "%s out (+=)", cs);
        h->ops->moe_combine(h->ops->be, dout2, dy, dpos, dg, N, k, C);
        checkf(h, "moe_combine", ndiff(got, down_f(h, dout2, nh), nh), 0, "%s determinism", cs);
    }
    if (has(h, "moe_combine_backward", h->ops->moe_combine_backward != NULL)) {
        float *dWo = up_f(h, Wo, nh);
        float *ddy = up_f(h, nan_f(h, nm), nm), *ddg = up_f(h, nan_f(h, ng), ng);
        h->ops->moe_combine_backward(h->ops->be, ddy, ddg, dWo, dy, dpos, dg, N, k, C);
        float *goty = down_f(h, ddy, nm), *gotg = down_f(h, ddg, ng);
        checkf(h, "moe_combine_backward", err_rel(h, goty, gy, nm), TOL_BWD, "%s dy (=)", cs);
        checkf(h, "moe_combine_backward", err_rel(h, gotg, gg, ng), TOL_BWD, "%s dgates (=)", cs);
        float *ddy2 = up_f(h, nan_f(h, nm), nm), *ddg2 = up_f(h, nan_f(h, ng), ng);
        h->ops->moe_combine_backward(h->ops->be, ddy2, ddg2, dWo, dy, dpos, dg, N, k, C);
        checkf(h, "moe_combine_backward", ndiff(goty, down_f(h, ddy2, nm), nm) + ndiff(gotg, down_f(h, ddg2, ng), ng),
               0, "%s determinism", cs);
    }
}

static int run_moe(struct harness *h)
{
    int f0 = n_fail;
    moe_case(h, 7, 2, 5, 13, 0);
    moe_case(h, 5, 3, 4, 6, 0);
    moe_case(h, 6, 1, 3, 8, 0);
    moe_case(h, 64, 4, 16, 96, 0);
    moe_case(h, 9, 2, 6, 13, 2);    /* null experts (SPEC 1e): no row, dgates 0 */
    moe_case(h, 33, 3, 5, 40, 3);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* MoE device routing: moe_route, moe_seq_stats, moe_aux_loss, moe_aux_backward */

/* The aux and z losses as the model normalises them, in fp64, of probs and
 * lse (f, the routed shares, is a constant: no gradient). */
struct aux_case {
    int N, B, T, E, k, g0;
    const int32_t *topk;
    double *p, *lse, *f;   /* (N,E), (N), (B,E) */
    double aux_coef, z_coef, n_seq, n_tok;
};
static double aux_loss_ref(void *ud)
{
    struct aux_case *a = ud;
    double aux = 0, z = 0;
    for (int i = 0; i < a->N; i++) {
        int q = (a->g0 + i) / a->T;
        for (int e = 0; e < a->E; e++)
            aux += a->aux_coef * a->E * a->f[(size_t)q * a->E + e] * a->p[(size_t)i * a->E + e] / a->T;
        z += a->lse[i] * a->lse[i];
    }
    return aux / a->n_seq + a->z_coef * z / a->n_tok;
}

/* nnull: the last nnull of the E experts are null (SPEC 1e): pos -1, no src_row row */
static void routing_case(struct harness *h, int N, int B, int T, int E, int k, int g0, int skew, int nnull)
{
    const size_t M = (size_t)N * k, ne = (size_t)N * E, nq = (size_t)B * E;
    char cs[96];
    snprintf(cs, sizeof cs, "N=%d B=%d T=%d E=%d k=%d g0=%d null=%d%s", N, B, T, E, k, g0, nnull, skew ? " skewed" : "");
    /* k distinct experts per row (skewed: mostly the first k+1, the rest empty) */
    int32_t *topk = new_i(h, M ? M : 1);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = skew && irand(h, 4) ? irand(h, k + 1 < E ? k + 1 : E) : irand(h, E);
                dup = 0;
                for (int m = 0; m < j; m++) dup |= topk[(size_t)n * k + m] == e;
            } while (dup);
            topk[(size_t)n * k + j] = e;
        }
    /* the stable sort and the statistics, written out plainly */
    int32_t *pos = new_i(h, M ? M : 1), *src = new_i(h, M ? M : 1), *off = new_i(h, (size_t)E + 1);
    int32_t r = 0;
    for (int e = 0; e < E; e++) {
        off[e] = r;
        for (size_t sl = 0; sl < M; sl++)
            if (topk[sl] == e) {
                if (e >= E - nnull) {
                    pos[sl] = -1;
                    r++;
                    continue;
                }
                pos[sl] = r;
                src[r++] = (int32_t)(sl / (size_t)k);
            }
    }
    off[E] = r;
    const size_t Mr = (size_t)off[E - nnull];   /* src_row's written rows */
    float *p = rand_f(h, ne, 0, 1), *lse = rand_f(h, (size_t)N, -3, 3);
    double *seq = new_d(h, 2 * nq), *f = new_d(h, nq);
    for (int i = 0; i < N; i++) {
        int q = (g0 + i) / T;
        for (int j = 0; j < k; j++) seq[(size_t)q * E + topk[(size_t)i * k + j]] += 1;
        for (int e = 0; e < E; e++) seq[nq + (size_t)q * E + e] += p[(size_t)i * E + e];
    }
    const float ac = 0.01f, zc = 0.001f;
    const double nseq = 3, ntok = 97;
    double loss[2] = {0, 0};
    for (int q = 0; q < B; q++)
        for (int e = 0; e < E; e++) {
            f[(size_t)q * E + e] = (float)(seq[(size_t)q * E + e] / ((double)T * k));
            loss[0] += (double)ac * E * f[(size_t)q * E + e] * seq[nq + (size_t)q * E + e] / T;
        }
    for (int i = 0; i < N; i++) loss[1] += (double)zc * lse[i] * lse[i];
    double *dp = new_d(h, ne), *dl = new_d(h, (size_t)N);
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < E; e++) dp[(size_t)i * E + e] = (double)ac * E * f[(size_t)((g0 + i) / T) * E + e] / T / nseq;
        dl[i] = 2.0 * zc * lse[i] / ntok;
    }
    if (!h->ops) {
        struct aux_case a = {N, B, T, E, k, g0, topk, to_d(h, p, ne), to_d(h, lse, (size_t)N), f, ac, zc, nseq, ntok};
        checkf(h, "moe_aux_backward", fd_err(a.p, ne, dp, aux_loss_ref, &a), TOL_FD, "%s fd dprobs", cs);
        checkf(h, "moe_aux_backward", fd_err(a.lse, (size_t)N, dl, aux_loss_ref, &a), TOL_FD, "%s fd dlse", cs);
        return;
    }
    if (has(h, "moe_route", h->ops->moe_route != NULL)) {
        size_t nw = mt_moe_route_work(M, (size_t)E);
        int32_t *dt = up_i(h, topk, M), *work = dalloc(h, (nw ? nw : 1) * sizeof(int32_t));
        int32_t *dpos[2], *dsrc[2], *doff[2];
        for (int t = 0; t < 2; t++) {
            dpos[t] = dalloc(h, (M ? M : 1) * sizeof(int32_t));
            dsrc[t] = dalloc(h, (M ? M : 1) * sizeof(int32_t));
            doff[t] = dalloc(h, ((size_t)E + 1) * sizeof(int32_t));
            h->ops->moe_route(h->ops->be, dpos[t], dsrc[t], doff[t], work, dt, N, k, E, nnull);
        }
        int32_t *gp = down_i(h, dpos[0], M), *gs = down_i(h, dsrc[0], M), *go = down_i(h, doff[0], (size_t)E + 1);
        checkf(h, "moe_route", ndiff_i(gp, pos, M) + ndiff_i(gs, src, Mr) + ndiff_i(go, off, (size_t)E + 1), 0,
               "%s pos, src_row, e_off (=) exact", cs);
        checkf(h, "moe_route",
               ndiff_i(gp, down_i(h, dpos[1], M), M) + ndiff_i(gs, down_i(h, dsrc[1], M), Mr) +
                   ndiff_i(go, down_i(h, doff[1], (size_t)E + 1), (size_t)E + 1),
               0, "%s determinism", cs);
    }
    if (N == 0) return;
    float *dpr = up_f(h, p, ne), *dls = up_f(h, lse, (size_t)N);
    int32_t *dtk = up_i(h, topk, M);
    double *dseq = dalloc(h, 2 * nq * sizeof(double));
    double *hseq = new_d(h, 2 * nq), *hseq2 = new_d(h, 2 * nq);
    if (has(h, "moe_seq_stats", h->ops->moe_seq_stats != NULL)) {
        h->ops->moe_seq_stats(h->ops->be, dseq, dpr, dtk, N, E, k, B, T, g0);
        h->ops->sync(h->ops->be);
        h->ops->copy_to_host(h->ops->be, hseq, dseq, 2 * nq * sizeof(double));
        checkf(h, "moe_seq_stats", err_rel_d(hseq, seq, nq), 0, "%s counts (=) exact", cs);
        checkf(h, "moe_seq_stats", err_rel_d(hseq + nq, seq + nq, nq), TOL_FWD, "%s prob sums (=)", cs);
        h->ops->moe_seq_stats(h->ops->be, dseq, dpr, dtk, N, E, k, B, T, g0);
        h->ops->sync(h->ops->be);
        h->ops->copy_to_host(h->ops->be, hseq2, dseq, 2 * nq * sizeof(double));
        checkf(h, "moe_seq_stats", ndiff(hseq, hseq2, 4 * nq), 0, "%s determinism", cs);
    }
    float *fh = new_f(h, nq);
    for (size_t i = 0; i < nq; i++) fh[i] = (float)f[i];
    if (has(h, "moe_aux_loss", h->ops->moe_aux_loss != NULL)) {
        double *dloss = dalloc(h, 2 * sizeof(double)), got[2], got2[2], got0[2];
        float *df = up_f(h, nan_f(h, nq), nq), *df2 = up_f(h, nan_f(h, nq), nq);
        h->ops->copy_from_host(h->ops->be, dseq, seq, 2 * nq * sizeof(double));
        h->ops->moe_aux_loss(h->ops->be, dloss, df, dseq, dls, N, B, E, k, T, ac, zc, 1);
        h->ops->sync(h->ops->be);
        h->ops->copy_to_host(h->ops->be, got, dloss, sizeof got);
        float *gf = down_f(h, df, nq);
        checkf(h, "moe_aux_loss", err_rel_d(got, loss, 2), TOL_FWD, "%s aux, z sums (=)", cs);
        checkf(h, "moe_aux_loss", ndiff(gf, fh, nq), 0, "%s f_share (=) exact", cs);
        h->ops->moe_aux_loss(h->ops->be, dloss, df2, dseq, dls, N, B, E, k, T, ac, zc, 1);
        h->ops->sync(h->ops->be);
        h->ops->copy_to_host(h->ops->be, got2, dloss, sizeof got2);
        checkf(h, "moe_aux_loss", ndiff(got, got2, 4) + ndiff(gf, down_f(h, df2, nq), nq), 0, "%s determinism", cs);
        h->ops->moe_aux_loss(h->ops->be, dloss, df2, dseq, dls, N, B, E, k, T, ac, zc, 0);
        h->ops->sync(h->ops->be);
        h->ops->copy_to_host(h->ops->be, got0, dloss, sizeof got0);
        checkf(h, "moe_aux_loss", fabs(got0[0]) + ndiff(&got0[1], &got[1], 2), 0, "%s count_aux 0: aux 0, z kept", cs);
    }
    if (has(h, "moe_aux_backward", h->ops->moe_aux_backward != NULL)) {
        float *df = up_f(h, fh, nq), *ddp = up_f(h, nan_f(h, ne), ne), *ddl = up_f(h, nan_f(h, (size_t)N), (size_t)N);
        h->ops->moe_aux_backward(h->ops->be, ddp, ddl, df, dls, N, E, T, g0, ac, zc, nseq, ntok);
        float *gp = down_f(h, ddp, ne), *gl = down_f(h, ddl, (size_t)N);
        checkf(h, "moe_aux_backward", err_rel(h, gp, dp, ne), TOL_BWD, "%s dprobs (=)", cs);
        checkf(h, "moe_aux_backward", err_rel(h, gl, dl, (size_t)N), TOL_BWD, "%s dlse (=)", cs);
        h->ops->moe_aux_backward(h->ops->be, ddp, ddl, df, dls, N, E, T, g0, ac, zc, nseq, ntok);
        checkf(h, "moe_aux_backward", ndiff(gp, down_f(h, ddp, ne), ne) + ndiff(gl, down_f(h, ddl, (size_t)N), (size_t)N),
               0, "%s determinism", cs);
    }
}

static int run_routing(struct harness *h)
{
    int f0 = n_fail;
    routing_case(h, 64, 4, 16, 8, 2, 0, 0, 0);      /* one rank: N = B T */
    routing_case(h, 600, 3, 200, 16, 4, 0, 1, 0);   /* several route chunks, empty experts */
    routing_case(h, 37, 4, 16, 4, 2, 10, 0, 0);     /* a TP rank's rows straddling sequences */
    routing_case(h, 5, 1, 5, 70, 2, 0, 0, 0);       /* E above a warp */
    routing_case(h, 0, 1, 4, 4, 2, 0, 0, 0);        /* no rows */
    routing_case(h, 600, 3, 200, 10, 3, 0, 0, 4);   /* null experts (SPEC 1e): pos -1, sorted last */
    routing_case(h, 64, 4, 16, 6, 2, 0, 1, 1);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* Mixture-of-Depths routing (mod_route, mod_backward)                      */

/* The reference selection by brute force: per sequence the (r, t) pairs
 * sorted by r descending (NaN as -inf), then t ascending; the first C are
 * selected and listed in increasing t. BCE and sigmoid in fp64. */
struct mod_pair {
    double key;
    int t;
};
static int mod_pair_cmp(const void *a, const void *b)
{
    const struct mod_pair *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return x->t - y->t;
}
static double mod_softplus_d(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static void ref_mod_route(int32_t *idx, int32_t *tpos, int32_t *slot, double *s, double *loss, const float *r, int B,
                          int T, int C, double coef)
{
    struct mod_pair *pr = malloc(sizeof *pr * (size_t)T);
    unsigned char *sel = malloc((size_t)T);
    if (!pr || !sel) {
        fprintf(stderr, "test_ops: host allocation failed\n");
        exit(2);
    }
    double sum = 0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float v = r[(size_t)b * T + t];
            pr[t].key = isnan(v) ? -INFINITY : (double)v;
            pr[t].t = t;
            sel[t] = 0;
        }
        qsort(pr, (size_t)T, sizeof *pr, mod_pair_cmp);
        for (int j = 0; j < C && j < T; j++) sel[pr[j].t] = 1;
        int j = 0;
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)b * T + t;
            const double x = r[n];
            s[n] = 1.0 / (1.0 + exp(-x));
            sum += mod_softplus_d(sel[t] ? -x : x);
            if (!sel[t]) {
                slot[n] = -1;
                continue;
            }
            idx[(size_t)b * C + j] = (int32_t)n;
            tpos[(size_t)b * C + j] = t;
            slot[n] = b * C + j++;
        }
    }
    *loss = coef * sum;
    free(pr);
    free(sel);
}

/* nnan > 0: that many NaN and -inf scores (a NaN ranks as -inf: they tie),
 * the loss then NULL (its sum is NaN); ties: r on a 0.25 grid */
static void mod_route_case(struct harness *h, int B, int T, int C, int ties, int nnan)
{
    if (!h->ops) return;   /* no gradient here: mod_backward's case checks the formula */
    const size_t N = (size_t)B * T, M = (size_t)B * C;
    char cs[96];
    snprintf(cs, sizeof cs, "B=%d T=%d C=%d%s%s", B, T, C, ties ? " ties" : "", nnan ? " NaN -inf, loss NULL" : "");
    float *r = rand_f(h, N, -3, 3);
    if (ties)
        for (size_t i = 0; i < N; i++) r[i] = (float)(floor((double)r[i] * 4.0 / 3.0) / 4.0);
    for (int i = 0; i < nnan; i++) {
        r[irand(h, (int)N)] = NAN;
        r[irand(h, (int)N)] = -INFINITY;
    }
    int32_t *idx = new_i(h, M), *tpos = new_i(h, M), *slot = new_i(h, N), *neg = new_i(h, N);
    double *s = new_d(h, N), loss;
    const float coef = 0.37f;
    ref_mod_route(idx, tpos, slot, s, &loss, r, B, T, C, coef);
    for (size_t i = 0; i < N; i++) neg[i] = -7;
    if (!has(h, "mod_route", h->ops->mod_route != NULL)) return;
    float *dr = up_f(h, r, N);
    int32_t *gi[2], *gt[2], *gs[2];
    float *gsig[2];
    double gl[2] = {NAN, NAN};
    for (int k = 0; k < 2; k++) {
        int32_t *di = up_i(h, neg, M), *dt = up_i(h, neg, M), *dsl = up_i(h, neg, N);
        float *dsg = up_f(h, nan_f(h, N), N);
        double *dl = NULL;
        if (!nnan) {
            dl = dalloc(h, sizeof(double));
            h->ops->copy_from_host(h->ops->be, dl, &gl[k], sizeof(double));   /* NaN prefill */
        }
        h->ops->mod_route(h->ops->be, di, dt, dsl, dsg, dl, dr, B, T, C, coef);
        gi[k] = down_i(h, di, M);
        gt[k] = down_i(h, dt, M);
        gs[k] = down_i(h, dsl, N);
        gsig[k] = down_f(h, dsg, N);
        if (dl) {
            h->ops->sync(h->ops->be);
            h->ops->copy_to_host(h->ops->be, &gl[k], dl, sizeof(double));
        }
    }
    checkf(h, "mod_route", ndiff_i(gi[0], idx, M) + ndiff_i(gt[0], tpos, M) + ndiff_i(gs[0], slot, N), 0,
           "%s idx, tpos, slot (=) exact", cs);
    /* s: a NaN score's gate is NaN; compared on the others */
    size_t nan_off = 0;
    for (size_t i = 0; i < N; i++)
        if (isnan(s[i]) || isnan(gsig[0][i])) {
            nan_off += isnan(s[i]) != isnan(gsig[0][i]);
            s[i] = 0;
            gsig[0][i] = 0;
        }
    checkf(h, "mod_route", nan_off ? INFINITY : err_rel(h, gsig[0], s, N), 1e-6, "%s s (=)", cs);
    if (!nnan)
        checkf(h, "mod_route", fabs(gl[0] - loss) / fabs(loss), 1e-12, "%s loss (=) rel", cs);
    checkf(h, "mod_route",
           ndiff_i(gi[0], gi[1], M) + ndiff_i(gt[0], gt[1], M) + ndiff_i(gs[0], gs[1], N) +
               ndiff(&gl[0], &gl[1], 2),
           0, "%s determinism", cs);
}

/* mod_backward: the gradients of the combine x_out = x + s (y - x) on the
 * selected rows and of aux_scale * BCE(s, sel) w.r.t. r (s = sigmoid(r)),
 * dgate = dL/ds given:
 *     dr = (sel ? dgate s (1 - s) : 0) + aux_scale (s - sel)
 *     dx: dL/dx_out (1 - s) on the selected rows, unchanged on the others.
 * The ref pass checks dr against central differences of
 *     L(r) = sum_sel dgate sigmoid(r) + aux_scale sum BCE(sigmoid(r), sel). */
struct mod_bwd_case {
    int N;
    const int32_t *slot;
    const double *dgate;
    double *r, aux;
};
static double mod_bwd_loss(void *ud)
{
    struct mod_bwd_case *c = ud;
    double L = 0;
    for (int n = 0; n < c->N; n++) {
        const int sel = c->slot[n] >= 0;
        if (sel) L += c->dgate[n] / (1.0 + exp(-c->r[n]));
        L += c->aux * mod_softplus_d(sel ? -c->r[n] : c->r[n]);
    }
    return L;
}
static void mod_bwd_case(struct harness *h, int B, int T, int C, int D, float aux)
{
    const int N = B * T;
    const size_t nd = (size_t)N * D;
    char cs[96];
    snprintf(cs, sizeof cs, "N=%d D=%d C=%d aux=%g", N, D, C, (double)aux);
    float *r = rand_f(h, (size_t)N, -3, 3), *dg = rand_f(h, (size_t)N, -2, 2), *x = rand_f(h, nd, -2, 2);
    int32_t *idx = new_i(h, (size_t)B * C), *tpos = new_i(h, (size_t)B * C), *slot = new_i(h, (size_t)N);
    double *sd = new_d(h, (size_t)N), loss;
    ref_mod_route(idx, tpos, slot, sd, &loss, r, B, T, C, 0.0);
    float *s = new_f(h, (size_t)N);
    for (int n = 0; n < N; n++) {
        s[n] = (float)sd[n];
        if (slot[n] < 0) dg[n] = NAN;   /* not read there */
    }
    double *rdr = new_d(h, (size_t)N), *rdx = new_d(h, nd);
    for (int n = 0; n < N; n++) {
        const int sel = slot[n] >= 0;
        const double sn = s[n];
        rdr[n] = (sel ? (double)dg[n] * sn * (1 - sn) : 0.0) + (double)aux * (sn - sel);
        for (size_t i = (size_t)n * D; i < (size_t)(n + 1) * D; i++) rdx[i] = sel ? x[i] * (1 - sn) : x[i];
    }
    if (!h->ops) {
        /* the gradient at the exact sigmoid (rdr above uses the float gate the kernels read) */
        double *g = new_d(h, (size_t)N), *dgd = to_d(h, dg, (size_t)N);
        for (int n = 0; n < N; n++) {
            const int sel = slot[n] >= 0;
            g[n] = (sel ? dgd[n] * sd[n] * (1 - sd[n]) : 0.0) + (double)aux * (sd[n] - sel);
        }
        struct mod_bwd_case c = {N, slot, dgd, to_d(h, r, (size_t)N), aux};
        checkf(h, "mod_backward", fd_err(c.r, (size_t)N, g, mod_bwd_loss, &c), TOL_FD, "%s fd dr", cs);
        return;
    }
    if (!has(h, "mod_backward", h->ops->mod_backward != NULL)) return;
    float *ddg = up_f(h, dg, (size_t)N), *ds = up_f(h, s, (size_t)N);
    int32_t *dsl = up_i(h, slot, (size_t)N);
    float *got_r[2], *got_x[2];
    for (int k = 0; k < 2; k++) {
        float *ddr = up_f(h, nan_f(h, (size_t)N), (size_t)N), *ddx = up_f(h, x, nd);
        h->ops->mod_backward(h->ops->be, ddr, ddx, ddg, ds, dsl, N, D, aux);
        got_r[k] = down_f(h, ddr, (size_t)N);
        got_x[k] = down_f(h, ddx, nd);
    }
    size_t kept = 0;
    for (int n = 0; n < N; n++)
        if (slot[n] < 0) kept += (size_t)ndiff(got_x[0] + (size_t)n * D, x + (size_t)n * D, (size_t)D);
    checkf(h, "mod_backward", err_rel(h, got_r[0], rdr, (size_t)N), 1e-6, "%s dr (=)", cs);
    checkf(h, "mod_backward", err_rel(h, got_x[0], rdx, nd), 1e-6, "%s dx (in place)", cs);
    checkf(h, "mod_backward", (double)kept, 0, "%s unselected dx rows untouched", cs);
    checkf(h, "mod_backward", ndiff(got_r[0], got_r[1], (size_t)N) + ndiff(got_x[0], got_x[1], nd), 0,
           "%s determinism", cs);
}

static int run_mod(struct harness *h)
{
    int f0 = n_fail;
    mod_route_case(h, 3, 37, 5, 0, 0);
    mod_route_case(h, 2, 1500, 187, 0, 0);   /* several chunks of the cuda block */
    mod_route_case(h, 3, 37, 37, 0, 0);      /* C = T */
    mod_route_case(h, 3, 37, 1, 0, 0);
    mod_route_case(h, 4, 300, 40, 1, 0);     /* ties on a 0.25 grid */
    mod_route_case(h, 2, 600, 90, 1, 4);
    mod_route_case(h, 3, 37, 5, 1, 2);
    mod_route_case(h, 2, 300, 250, 0, 200);  /* mostly NaN / -inf: C falls among them (NaN = -inf, by position) */
    mod_bwd_case(h, 3, 37, 5, 64, 0.01f);
    mod_bwd_case(h, 2, 1500, 187, 33, 0.003f);
    mod_bwd_case(h, 1, 300, 300, 8, 0.0f);
    mod_bwd_case(h, 2, 50, 1, 1, 0.5f);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* optimizers                                                               */

/* PyTorch AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p *= 1 - lr wd;
 * p -= lr (m/bc1) / (sqrt(v/bc2) + eps) */
static void adamw_case(struct harness *h, size_t n, int t, int fresh, double gscale, float lr, float wd)
{
    const char *op = "adamw_update";
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    float bc1 = (float)(1 - pow(b1, t)), bc2 = (float)(1 - pow(b2, t));
    float *p = rand_f(h, n, -1, 1), *g = rand_f(h, n, -gscale, gscale);
    float *m = fresh ? new_f(h, n) : rand_f(h, n, -0.1 * gscale, 0.1 * gscale);
    float *v = fresh ? new_f(h, n) : rand_f(h, n, 0, 0.01 * gscale * gscale);
    if (!h->ops || !has(h, op, h->ops->adamw_update != NULL)) return;
    char cs[96];
    snprintf(cs, sizeof cs, "n=%zu t=%d %s |g|<%g lr=%g wd=%g", n, t, fresh ? "m=v=0" : "m,v given", gscale, lr, wd);
    double *rp = new_d(h, n), *rm = new_d(h, n), *rv = new_d(h, n);
    for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        rm[i] = (double)b1 * m[i] + (1 - (double)b1) * gi;
        rv[i] = (double)b2 * v[i] + (1 - (double)b2) * gi * gi;
        rp[i] = p[i] * (1 - (double)lr * wd);
        rp[i] -= (double)lr * (rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps);
    }
    float *dp = up_f(h, p, n), *dg = up_f(h, g, n), *dm = up_f(h, m, n), *dv = up_f(h, v, n);
    h->ops->adamw_update(h->ops->be, dp, dg, dm, dv, n, lr, b1, b2, eps, wd, bc1, bc2);
    float *gp = down_f(h, dp, n), *gm = down_f(h, dm, n), *gv = down_f(h, dv, n);
    checkf(h, op, err_rel(h, gp, rp, n), TOL_FWD, "%s p", cs);
    checkf(h, op, err_rel(h, gm, rm, n), TOL_FWD, "%s m", cs);
    checkf(h, op, err_rel(h, gv, rv, n), TOL_FWD, "%s v", cs);
    /* the update itself, relative to its own scale (p's scale can hide it) */
    double *rdel = new_d(h, n), *gdel = new_d(h, n);
    for (size_t i = 0; i < n; i++) {
        rdel[i] = rp[i] - p[i];
        gdel[i] = (double)gp[i] - p[i];
    }
    /* loose: p's own float rounding (|p| < 1) is up to 6e-5 of an lr=1e-3 update */
    checkf(h, op, err_rel_d(gdel, rdel, n), 1e-3, "%s p - p0", cs);
    float *dp2 = up_f(h, p, n), *dm2 = up_f(h, m, n), *dv2 = up_f(h, v, n);
    h->ops->adamw_update(h->ops->be, dp2, dg, dm2, dv2, n, lr, b1, b2, eps, wd, bc1, bc2);
    checkf(h, op, ndiff(gp, down_f(h, dp2, n), n) + ndiff(gm, down_f(h, dm2, n), n) + ndiff(gv, down_f(h, dv2, n), n),
           0, "%s determinism", cs);
}

static int run_adamw(struct harness *h)
{
    int f0 = n_fail;
    adamw_case(h, 13, 1, 1, 1.0, 1e-3f, 0.0f);
    adamw_case(h, 1001, 7, 0, 1.0, 0.5f, 0.1f);
    adamw_case(h, 13, 1, 1, 1e-8, 0.5f, 0.0f);   /* eps-dominated: eps outside the sqrt */
    adamw_case(h, 1001, 3, 0, 1e-3, 0.05f, 0.0f);
    adamw_case(h, 20001, 12, 0, 1.0, 0.01f, 0.1f);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* the multi-tensor entries (issue 27 item 3): each is the loop over its
 * single-tensor entry on the same backend, bit for bit, over more tensors
 * than one list (MT_OPS_LIST_MAX) holds, with empty and large ones        */

#define MULTI_N 35
static size_t multi_size(int i) { return i == 5 ? 0 : i == 3 ? 65539 : (size_t)(1 + (i * 37) % 300); }

static int run_sumsq_multi(struct harness *h)
{
    const char *op = "sumsq_multi";
    int f0 = n_fail;
    float *x[MULTI_N];
    size_t n[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) x[i] = rand_f(h, (n[i] = multi_size(i)) + 1, -3, 3);
    if (!h->ops || !has(h, op, h->ops->sumsq_multi != NULL)) return 1;
    const float *dx[MULTI_N];
    double ref = 0, loop = 0;
    for (int i = 0; i < MULTI_N; i++) {
        dx[i] = up_f(h, x[i], n[i] + 1);
        for (size_t j = 0; j < n[i]; j++) ref += (double)x[i][j] * x[i][j];
        loop += h->ops->sumsq(h->ops->be, dx[i], n[i]);
    }
    for (int c = 1; c <= MULTI_N; c += MULTI_N - 1) {   /* one tensor; all of them (two lists) */
        double r = 0;
        for (int i = 0; i < c; i++) r += h->ops->sumsq(h->ops->be, dx[i], n[i]);
        double s = h->ops->sumsq_multi(h->ops->be, dx, n, c);
        checkf(h, op, ndiff(&s, &r, 2), 0, "%d tensors == the loop over sumsq (bits)", c);
    }
    double s = h->ops->sumsq_multi(h->ops->be, dx, n, MULTI_N);
    checkf(h, op, fabs(s - ref) / ref, 1e-6, "%d tensors vs fp64", MULTI_N);
    double s2 = h->ops->sumsq_multi(h->ops->be, dx, n, MULTI_N);
    checkf(h, op, ndiff(&s, &loop, 2) + ndiff(&s, &s2, 2), 0, "%d tensors == the loop, determinism", MULTI_N);
    double z = h->ops->sumsq_multi(h->ops->be, dx, n, 0);
    checkf(h, op, z != 0.0, 0, "0 tensors is 0");
    return n_fail == f0;
}

static int run_normalize_fro(struct harness *h)
{
    const char *op = "normalize_fro";
    int f0 = n_fail;
    const size_t ns[] = {1, 13, 65539};
    for (int c = 0; c < 3; c++) {
        size_t n = ns[c];
        float *x = rand_f(h, n + 1, -3, 3);
        if (!h->ops || !has(h, op, h->ops->normalize_fro != NULL)) continue;
        double ss = 0;
        for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double *ref = new_d(h, n);
        for (size_t i = 0; i < n; i++) ref[i] = x[i] / (sqrt(ss) + 1e-7);
        float *dx = up_f(h, x, n + 1), *dy = up_f(h, x, n + 1);
        h->ops->normalize_fro(h->ops->be, dx, n, 1e-7);
        float *got = down_f(h, dx, n + 1);
        checkf(h, op, err_rel(h, got, ref, n), TOL_FWD, "n=%zu vs fp64", n);
        checkf(h, op, ndiff(&got[n], &x[n], 1), 0, "n=%zu x[n] untouched", n);
        /* what Muon did before: sumsq on the host, then axpby with the rounded scalar */
        double nrm = sqrt(h->ops->sumsq(h->ops->be, dy, n));
        h->ops->axpby(h->ops->be, dy, NULL, 0.0f, (float)(1.0 / (nrm + 1e-7)), n);
        checkf(h, op, ndiff(got, down_f(h, dy, n), n), 0, "n=%zu == sumsq + axpby (bits)", n);
        /* normalize_fro_bf16: == cast_bf16 of normalize_fro's result (bits), x untouched */
        if (!has(h, "normalize_fro_bf16", h->ops->normalize_fro_bf16 != NULL) || !h->ops->cast_bf16) continue;
        float *dz = up_f(h, x, n + 1);
        uint16_t *zb = poison_b16(h, n + 1), *cb = poison_b16(h, n);
        h->ops->normalize_fro_bf16(h->ops->be, zb, dz, n, 1e-7);
        h->ops->cast_bf16(h->ops->be, cb, dx, n);
        const uint16_t *z = down_b16(h, zb, n + 1);
        checkf(h, "normalize_fro_bf16", (double)(b16_diff(z, down_b16(h, cb, n), n) + (z[n] != 0xffffu)), 0,
               "n=%zu == cast_bf16(normalize_fro) (bits), dst[n] untouched", n);
        checkf(h, "normalize_fro_bf16", (double)ndiff(down_f(h, dz, n + 1), x, n + 1), 0, "n=%zu x untouched", n);
        /* axpby_from_bf16: == widen_bf16 + axpby (bits); b = 0 does not read y (NaN there) */
        if (!has(h, "axpby_from_bf16", h->ops->axpby_from_bf16 != NULL) || !h->ops->widen_bf16) continue;
        const float *y0 = rand_f(h, n + 1, -2, 2);
        float *ya = up_f(h, y0, n + 1), *yb = up_f(h, y0, n + 1), *w = up_f(h, nan_f(h, n), n);
        h->ops->axpby_from_bf16(h->ops->be, ya, zb, -0.02f, 0.999f, n);
        h->ops->widen_bf16(h->ops->be, w, zb, n);
        h->ops->axpby(h->ops->be, yb, w, -0.02f, 0.999f, n);
        const float *ga = down_f(h, ya, n + 1);
        checkf(h, "axpby_from_bf16", (double)(ndiff(ga, down_f(h, yb, n), n) + ndiff(&ga[n], &y0[n], 1)), 0,
               "n=%zu == widen_bf16 + axpby (bits), y[n] untouched", n);
        float *yn = up_f(h, nan_f(h, n), n), *yr = up_f(h, nan_f(h, n), n);
        h->ops->axpby_from_bf16(h->ops->be, yn, zb, 3.0f, 0.0f, n);
        h->ops->axpby(h->ops->be, yr, w, 3.0f, 0.0f, n);
        checkf(h, "axpby_from_bf16", (double)ndiff(down_f(h, yn, n), down_f(h, yr, n), n), 0,
               "n=%zu b = 0: y not read, == axpby (bits)", n);
    }
    return n_fail == f0;
}

static void adamw_shadow_case(struct harness *h, float gs);   /* below, with the bf16 helpers */

/* muon_prep_bf16_multi and axpby_from_bf16_multi (Muon's batch, mt_ops.h):
 * MULTI_N matrices (odd sizes, an empty one, more than one list), each x a
 * poisoned bf16 buffer with a guard element past n: m and x == the loop of
 * muon_momentum + normalize_fro_bf16 (bits), at gscale 1 and 0.37; the
 * guards untouched. Then the updates of
 * those x: == the loop of axpby_from_bf16 (bits), b = 0 for every third (y
 * NaN there: not read), the guards untouched. */
static void muon_multi_case(struct harness *h, float gs)
{
    reset(h);
    const float mu = 0.95f;
    float *m[MULTI_N], *m2[MULTI_N], *y[MULTI_N], *y2[MULTI_N], a[MULTI_N], b[MULTI_N];
    const float *g[MULTI_N];
    uint16_t *x[MULTI_N], *x2[MULTI_N];
    const uint16_t *xc[MULTI_N];
    size_t n[MULTI_N], nmax = 1;
    for (int i = 0; i < MULTI_N; i++) {
        n[i] = multi_size(i);
        const size_t k = n[i] + 1;
        if (k > nmax) nmax = k;
        float *hm = rand_f(h, k, -0.5, 0.5), *hy = i % 3 == 2 ? nan_f(h, k) : rand_f(h, k, -1, 1);
        g[i] = up_f(h, rand_f(h, k, -2, 2), k);
        m[i] = up_f(h, hm, k), m2[i] = up_f(h, hm, k);
        y[i] = up_f(h, hy, k), y2[i] = up_f(h, hy, k);
        x[i] = poison_b16(h, k), x2[i] = poison_b16(h, k);
        xc[i] = x[i];
        a[i] = -0.02f * (float)(1 + i % 4), b[i] = i % 3 == 2 ? 0.0f : 1.0f - 0.001f * (float)i;
    }
    float *d = dalloc(h, nmax * sizeof(float));
    for (int i = 0; i < MULTI_N; i++) {
        h->ops->muon_momentum(h->ops->be, d, m2[i], g[i], mu, n[i], gs);
        h->ops->normalize_fro_bf16(h->ops->be, x2[i], d, n[i], 1e-7);
    }
    h->ops->muon_prep_bf16_multi(h->ops->be, x, m, g, n, MULTI_N, mu, gs, 1e-7, d);
    long bad = 0, guard = 0;
    for (int i = 0; i < MULTI_N; i++) {
        const uint16_t *got = down_b16(h, x[i], n[i] + 1);
        bad += ndiff(down_f(h, m[i], n[i] + 1), down_f(h, m2[i], n[i] + 1), n[i] + 1) +
               b16_diff(got, down_b16(h, x2[i], n[i]), n[i]);
        guard += got[n[i]] != 0xffffu;
    }
    checkf(h, "muon_prep_bf16_multi", (double)bad, 0, "%d matrices, gscale %g: m, x == the loop (bits)", MULTI_N, gs);
    checkf(h, "muon_prep_bf16_multi", (double)guard, 0, "gscale %g: x[n] untouched", gs);
    if (!has(h, "axpby_from_bf16_multi", h->ops->axpby_from_bf16_multi != NULL)) return;
    for (int i = 0; i < MULTI_N; i++) h->ops->axpby_from_bf16(h->ops->be, y2[i], x[i], a[i], b[i], n[i]);
    h->ops->axpby_from_bf16_multi(h->ops->be, y, xc, a, b, n, MULTI_N);
    bad = guard = 0;
    for (int i = 0; i < MULTI_N; i++) {
        const float *got = down_f(h, y[i], n[i] + 1), *want = down_f(h, y2[i], n[i] + 1);
        bad += ndiff(got, want, n[i]);
        guard += ndiff(&got[n[i]], &want[n[i]], 1);
    }
    checkf(h, "axpby_from_bf16_multi", (double)bad, 0, "%d tensors, b = 0 for a third: == the loop (bits)", MULTI_N);
    checkf(h, "axpby_from_bf16_multi", (double)guard, 0, "y[n] untouched");
}

static int run_muon_multi(struct harness *h)
{
    int f0 = n_fail;
    if (!h->ops || !has(h, "muon_prep_bf16_multi", h->ops->muon_prep_bf16_multi != NULL)) return 1;
    if (!h->ops->muon_momentum || !h->ops->normalize_fro_bf16 || !h->ops->axpby_from_bf16) return 1;
    muon_multi_case(h, 1.0f);
    muon_multi_case(h, 0.37f);
    return n_fail == f0;
}

static int run_adamw_multi(struct harness *h)
{
    const char *op = "adamw_multi";
    int f0 = n_fail;
    const float lr = 0.02f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bc1 = 1 - 0.9f * 0.9f, bc2 = 1 - 0.95f * 0.95f;
    float *hp[MULTI_N], *hg[MULTI_N], *hm[MULTI_N], *hv[MULTI_N], wd[MULTI_N];
    size_t n[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) {
        n[i] = multi_size(i);
        size_t k = n[i] + 1;   /* one guard element past each tensor */
        hp[i] = rand_f(h, k, -1, 1);
        hg[i] = rand_f(h, k, -1, 1);
        hm[i] = rand_f(h, k, -0.1, 0.1);
        hv[i] = rand_f(h, k, 0, 0.01);
        wd[i] = i % 3 ? 0.1f : 0.0f;
    }
    if (!h->ops || !has(h, op, h->ops->adamw_multi != NULL)) return 1;
    float *p[MULTI_N], *m[MULTI_N], *v[MULTI_N], *p2[MULTI_N], *m2[MULTI_N], *v2[MULTI_N];
    const float *g[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) {
        size_t k = n[i] + 1;
        p[i] = up_f(h, hp[i], k), m[i] = up_f(h, hm[i], k), v[i] = up_f(h, hv[i], k), g[i] = up_f(h, hg[i], k);
        p2[i] = up_f(h, hp[i], k), m2[i] = up_f(h, hm[i], k), v2[i] = up_f(h, hv[i], k);
        h->ops->adamw_update(h->ops->be, p2[i], g[i], m2[i], v2[i], n[i], lr, b1, b2, eps, wd[i], bc1, bc2);
    }
    h->ops->adamw_multi(h->ops->be, p, NULL, g, m, v, n, wd, MULTI_N, lr, b1, b2, eps, bc1, bc2, 1.0f);
    double bad = 0, guard = 0;
    for (int i = 0; i < MULTI_N; i++) {
        size_t k = n[i] + 1;
        float *a = down_f(h, p[i], k), *b = down_f(h, p2[i], k);
        bad += ndiff(a, b, k) + ndiff(down_f(h, m[i], k), down_f(h, m2[i], k), k) +
               ndiff(down_f(h, v[i], k), down_f(h, v2[i], k), k);
        guard += ndiff(&a[n[i]], &hp[i][n[i]], 1);
    }
    checkf(h, op, bad, 0, "%d tensors == the loop over adamw_update (bits)", MULTI_N);
    checkf(h, op, guard, 0, "%d tensors: p past n untouched", MULTI_N);
    /* gscale (the gradient clip): == axpby(g, NULL, 0, gscale) then the loop, bits; g unchanged */
    const float gs = 0.3719f;
    bad = 0;
    double gmoved = 0;
    for (int i = 0; i < MULTI_N; i++) {
        size_t k = n[i] + 1;
        float *gc = up_f(h, hg[i], k);
        h->ops->axpby(h->ops->be, gc, NULL, 0.0f, gs, n[i]);
        h->ops->adamw_update(h->ops->be, p2[i], gc, m2[i], v2[i], n[i], lr, b1, b2, eps, wd[i], bc1, bc2);
    }
    h->ops->adamw_multi(h->ops->be, p, NULL, g, m, v, n, wd, MULTI_N, lr, b1, b2, eps, bc1, bc2, gs);
    for (int i = 0; i < MULTI_N; i++) {
        size_t k = n[i] + 1;
        bad += ndiff(down_f(h, p[i], k), down_f(h, p2[i], k), k) + ndiff(down_f(h, m[i], k), down_f(h, m2[i], k), k) +
               ndiff(down_f(h, v[i], k), down_f(h, v2[i], k), k);
        gmoved += ndiff(down_f(h, g[i], k), hg[i], k);
    }
    checkf(h, op, bad, 0, "%d tensors, gscale %g == axpby(g, gscale) + adamw_update (bits)", MULTI_N, gs);
    checkf(h, op, gmoved, 0, "%d tensors, gscale: g not written", MULTI_N);
    adamw_shadow_case(h, 1.0f);
    adamw_shadow_case(h, gs);
    return n_fail == f0;
}

static int run_nonfinite_mark(struct harness *h)
{
    const char *op = "nonfinite_mark";
    int f0 = n_fail;
    float *x[MULTI_N];
    size_t n[MULTI_N];
    int slot[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) {
        x[i] = rand_f(h, (n[i] = multi_size(i)) + 1, -3, 3);
        x[i][n[i]] = NAN;                       /* past the end: never read */
        slot[i] = MULTI_N - 1 - i;              /* flags in reverse order */
    }
    x[3][65538] = INFINITY;                     /* last element of the large one */
    x[7][0] = NAN;
    x[33][n[33] - 1] = -INFINITY;               /* in the second list */
    if (!h->ops || !has(h, op, h->ops->nonfinite_mark != NULL)) return 1;
    const float *dx[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) dx[i] = up_f(h, x[i], n[i] + 1);
    float *f0h = new_f(h, MULTI_N);
    f0h[0] = NAN;                               /* an earlier mark stays */
    float *df = up_f(h, f0h, MULTI_N);
    h->ops->nonfinite_mark(h->ops->be, df, dx, n, slot, MULTI_N);
    float *f = down_f(h, df, MULTI_N);
    double bad = 0;
    for (int i = 0; i < MULTI_N; i++) {
        int want_nan = i == 0 || i == MULTI_N - 1 - 3 || i == MULTI_N - 1 - 7 || i == MULTI_N - 1 - 33;
        bad += want_nan ? !isnan(f[i]) : memcmp(&f[i], &f0h[i], sizeof(float)) != 0;
    }
    checkf(h, op, bad, 0, "%d tensors: NaN exactly at the non-finite ones' slots", MULTI_N);
    /* the flags' sumsq: +0 when clean (adds nothing to a norm), NaN when marked */
    float *dz = up_f(h, new_f(h, MULTI_N), MULTI_N);
    h->ops->nonfinite_mark(h->ops->be, dz, dx + 8, n + 8, slot + 8, 20);   /* finite tensors 8..27 */
    const float *lz[1] = {dz}, *lf[1] = {df};
    size_t nf[1] = {MULTI_N};
    double sz = h->ops->sumsq_multi ? h->ops->sumsq_multi(h->ops->be, lz, nf, 1) : 1.0;
    double sf = h->ops->sumsq_multi ? h->ops->sumsq_multi(h->ops->be, lf, nf, 1) : 0.0;
    checkf(h, op, (sz != 0.0 || signbit(sz)) + !isnan(sf), 0, "sumsq of the flags: +0 clean, NaN marked");
    return n_fail == f0;
}

/* m = mu m + s g; d = s g + mu m (new m), s g one fp32 multiply (the clip's scale s); d may
 * alias g; g untouched otherwise; with s != 1 the bits of axpby(g, NULL, 0, s) then s = 1 */
static void muon_case(struct harness *h, size_t n, int alias, float gs)
{
    const char *op = "muon_momentum";
    const float mu = 0.95f;
    float *g = rand_f(h, n, -1, 1), *m = rand_f(h, n, -1, 1);
    if (!h->ops || !has(h, op, h->ops->muon_momentum != NULL)) return;
    double *rm = new_d(h, n), *rd = new_d(h, n);
    for (size_t i = 0; i < n; i++) {
        const double gi = (float)(gs * g[i]);
        rm[i] = (double)mu * m[i] + gi;
        rd[i] = gi + (double)mu * rm[i];
    }
    float *dg = up_f(h, g, n), *dm = up_f(h, m, n), *dd = alias ? dg : up_f(h, nan_f(h, n), n);
    h->ops->muon_momentum(h->ops->be, dd, dm, dg, mu, n, gs);
    float *gd = down_f(h, dd, n), *gm = down_f(h, dm, n);
    checkf(h, op, err_rel(h, gm, rm, n), TOL_FWD, "n=%zu%s gscale %g m", n, alias ? " d==g" : "", gs);
    checkf(h, op, err_rel(h, gd, rd, n), TOL_FWD, "n=%zu%s gscale %g d", n, alias ? " d==g" : "", gs);
    if (!alias) checkf(h, op, ndiff(down_f(h, dg, n), g, n), 0, "n=%zu gscale %g: g untouched", n, gs);
    float *dg2 = up_f(h, g, n), *dm2 = up_f(h, m, n), *dd2 = alias ? dg2 : up_f(h, nan_f(h, n), n);
    if (gs != 1.0f) h->ops->axpby(h->ops->be, dg2, NULL, 0.0f, gs, n);   /* the clip in place, then s = 1 */
    h->ops->muon_momentum(h->ops->be, dd2, dm2, dg2, mu, n, 1.0f);
    checkf(h, op, ndiff(gd, down_f(h, dd2, n), n) + ndiff(gm, down_f(h, dm2, n), n), 0,
           "n=%zu%s gscale %g: == %s (bits)", n, alias ? " d==g" : "", gs, gs != 1.0f ? "clip, then 1" : "rerun");
}

static int run_muon(struct harness *h)
{
    int f0 = n_fail;
    muon_case(h, 13, 0, 1.0f);
    muon_case(h, 13, 1, 1.0f);
    muon_case(h, 4099, 1, 0.37f);
    muon_case(h, 20001, 0, 1.0f);
    muon_case(h, 20001, 0, 0.37f);
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* fused chains: rmsnorm_resid, qk_norm_rope                                */
/* Reference = the composition of the unfused fp64 references above. On the
 * cpu backend the fused op must also equal the unfused ops' composition bit
 * for bit (the bitcheck gate relies on it); elsewhere to TOL_FWD / TOL_BWD
 * (another compiler may contract a*c - b*s differently in the two kernels). */

static double fused_tol(struct harness *h, double tol) { return strcmp(h->bname, "cpu") ? tol : 0; }

static void rms_resid_case(struct harness *h, int N, int C, float eps)
{
    size_t n = (size_t)N * C;
    float *x = rand_f(h, n, -2, 2), *w = rand_f(h, C, 0.5, 1.5);
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d C=%d", N, C);
    double *rout = new_d(h, n), *rrstd = new_d(h, N);
    ref_rms_fwd(rout, rrstd, to_d(h, x, n), to_d(h, w, C), N, C, eps);
    if (!h->ops) return;   /* its backward is rmsnorm_backward (checked there) */
    if (!has(h, "rmsnorm_resid_forward", h->ops->rmsnorm_resid_forward != NULL)) return;
    float *dxi = up_f(h, x, n), *dwi = up_f(h, w, C);
    float *dout = up_f(h, nan_f(h, n), n), *drstd = up_f(h, nan_f(h, N), N), *dres = up_f(h, nan_f(h, n), n);
    h->ops->rmsnorm_resid_forward(h->ops->be, dout, drstd, dres, dxi, dwi, N, C, eps);
    float *out = down_f(h, dout, n), *rstd = down_f(h, drstd, N), *res = down_f(h, dres, n);
    checkf(h, "rmsnorm_resid_forward", err_rel(h, out, rout, n), TOL_FWD, "%s out", cs);
    checkf(h, "rmsnorm_resid_forward", err_rel(h, rstd, rrstd, N), TOL_FWD, "%s rstd", cs);
    checkf(h, "rmsnorm_resid_forward", ndiff(res, x, n), 0, "%s resid == inp (=)", cs);
    /* the unfused pair on the same backend */
    float *uout = up_f(h, nan_f(h, n), n), *urstd = up_f(h, nan_f(h, N), N);
    h->ops->rmsnorm_forward(h->ops->be, uout, urstd, dxi, dwi, N, C, eps);
    float *uo = down_f(h, uout, n), *ur = down_f(h, urstd, N);
    checkf(h, "rmsnorm_resid_forward", ndiff(out, uo, n) + ndiff(rstd, ur, N), 0, "%s bits == rmsnorm_forward", cs);
    /* resid aliasing inp (allowed): inp unchanged, same out */
    float *dinpl = up_f(h, x, n), *dout2 = up_f(h, nan_f(h, n), n), *drstd2 = up_f(h, nan_f(h, N), N);
    h->ops->rmsnorm_resid_forward(h->ops->be, dout2, drstd2, dinpl, dinpl, dwi, N, C, eps);
    checkf(h, "rmsnorm_resid_forward", ndiff(down_f(h, dinpl, n), x, n) + ndiff(down_f(h, dout2, n), out, n) +
           ndiff(down_f(h, drstd2, N), rstd, N), 0, "%s resid == inp in place, determinism", cs);
}

struct qkr_case {
    int N, T, pos0, H, K, hd;
    double eps;
    const double *cs, *sn;
    double *q_raw, *k_raw, *wq, *wk, *Wq, *Wk;      /* inputs, loss weights */
    double *qn, *kn, *q, *k, *rq, *rk;              /* normed, rotated, rstd */
};
static void ref_qkr_fwd(struct qkr_case *r)
{
    ref_rms_fwd(r->qn, r->rq, r->q_raw, r->wq, r->N * r->H, r->hd, r->eps);
    ref_rms_fwd(r->kn, r->rk, r->k_raw, r->wk, r->N * r->K, r->hd, r->eps);
    ref_rope_fwd(r->q, r->qn, r->cs, r->sn, r->N, r->T, r->pos0, r->H, r->hd);
    ref_rope_fwd(r->k, r->kn, r->cs, r->sn, r->N, r->T, r->pos0, r->K, r->hd);
}
static double qkr_loss(void *ud)
{
    struct qkr_case *r = ud;
    ref_qkr_fwd(r);
    return wsum(r->q, r->Wq, (size_t)r->N * r->H * r->hd) + wsum(r->k, r->Wk, (size_t)r->N * r->K * r->hd);
}

static void qkr_case(struct harness *h, int B, int T, int pos0, int H, int K, int hd)
{
    const float eps = 1e-6f;
    int N = B * T, half = hd / 2, Tmax = pos0 + T;
    size_t nq = (size_t)N * H * hd, nk = (size_t)N * K * hd, nt = (size_t)Tmax * half;
    size_t NH = (size_t)N * H, NK = (size_t)N * K;
    float *cosf_ = new_f(h, nt), *sinf_ = new_f(h, nt);
    for (int p = 0; p < Tmax; p++)
        for (int i = 0; i < half; i++) {
            double inv_freq = pow(10000.0, -2.0 * i / hd);
            cosf_[(size_t)p * half + i] = (float)cos(p * inv_freq);
            sinf_[(size_t)p * half + i] = (float)sin(p * inv_freq);
        }
    float *qr = rand_f(h, nq, -2, 2), *kr = rand_f(h, nk, -2, 2), *wq = rand_f(h, hd, 0.5, 1.5);
    float *wk = rand_f(h, hd, 0.5, 1.5), *Wq = rand_f(h, nq, -1, 1), *Wk = rand_f(h, nk, -1, 1);
    float *dwq0 = rand_f(h, hd, -1, 1), *dwk0 = rand_f(h, hd, -1, 1);
    char cs[80];
    snprintf(cs, sizeof cs, "B=%d T=%d pos0=%d H=%d K=%d hd=%d", B, T, pos0, H, K, hd);
    struct qkr_case r = {N, T, pos0, H, K, hd, eps, to_d(h, cosf_, nt), to_d(h, sinf_, nt), to_d(h, qr, nq),
                         to_d(h, kr, nk), to_d(h, wq, hd), to_d(h, wk, hd), to_d(h, Wq, nq), to_d(h, Wk, nk),
                         new_d(h, nq), new_d(h, nk), new_d(h, nq), new_d(h, nk), new_d(h, NH), new_d(h, NK)};
    ref_qkr_fwd(&r);
    /* backward reference: R^T then the norm's backward (pos0 as the forward's) */
    double *gq = new_d(h, nq), *gk = new_d(h, nk), *gqr = new_d(h, nq), *gkr = new_d(h, nk);
    double *gwq = new_d(h, hd), *gwk = new_d(h, hd);
    ref_rope_bwd(gq, r.Wq, r.cs, r.sn, N, T, pos0, H, hd);
    ref_rope_bwd(gk, r.Wk, r.cs, r.sn, N, T, pos0, K, hd);
    ref_rms_bwd(gqr, gwq, gq, r.q_raw, r.wq, r.rq, (int)NH, hd);
    ref_rms_bwd(gkr, gwk, gk, r.k_raw, r.wk, r.rk, (int)NK, hd);
    if (!h->ops) {
        checkf(h, "qk_norm_rope_bwd", fd_err(r.q_raw, nq, gqr, qkr_loss, &r), TOL_FD, "%s fd dq_raw", cs);
        checkf(h, "qk_norm_rope_bwd", fd_err(r.k_raw, nk, gkr, qkr_loss, &r), TOL_FD, "%s fd dk_raw", cs);
        checkf(h, "qk_norm_rope_bwd", fd_err(r.wq, hd, gwq, qkr_loss, &r), TOL_FD, "%s fd dwq", cs);
        checkf(h, "qk_norm_rope_bwd", fd_err(r.wk, hd, gwk, qkr_loss, &r), TOL_FD, "%s fd dwk", cs);
        return;
    }
    if (!has(h, "qk_norm_rope_forward", h->ops->qk_norm_rope_forward != NULL)) return;
    float *dcos = up_f(h, cosf_, nt), *dsin = up_f(h, sinf_, nt);
    float *dqr = up_f(h, qr, nq), *dkr = up_f(h, kr, nk), *dwq = up_f(h, wq, hd), *dwk = up_f(h, wk, hd);
    float *dq = up_f(h, nan_f(h, nq), nq), *dk = up_f(h, nan_f(h, nk), nk);
    float *drq = up_f(h, nan_f(h, NH), NH), *drk = up_f(h, nan_f(h, NK), NK);
    h->ops->qk_norm_rope_forward(h->ops->be, dq, dk, drq, drk, dqr, dkr, dwq, dwk, dcos, dsin, N, T, pos0, H, K, hd, eps);
    float *q = down_f(h, dq, nq), *k = down_f(h, dk, nk), *rq = down_f(h, drq, NH), *rk = down_f(h, drk, NK);
    checkf(h, "qk_norm_rope_forward", err_rel(h, q, r.q, nq), TOL_FWD, "%s q", cs);
    checkf(h, "qk_norm_rope_forward", err_rel(h, k, r.k, nk), TOL_FWD, "%s k", cs);
    checkf(h, "qk_norm_rope_forward", err_rel(h, rq, r.rq, NH) + err_rel(h, rk, r.rk, NK), TOL_FWD, "%s rstd q, k",
           cs);
    /* the unfused chain on the same backend: rmsnorm_forward then rope_forward in place */
    float *uq = up_f(h, nan_f(h, nq), nq), *uk = up_f(h, nan_f(h, nk), nk);
    float *urq = up_f(h, nan_f(h, NH), NH), *urk = up_f(h, nan_f(h, NK), NK);
    h->ops->rmsnorm_forward(h->ops->be, uq, urq, dqr, dwq, (int)NH, hd, eps);
    h->ops->rmsnorm_forward(h->ops->be, uk, urk, dkr, dwk, (int)NK, hd, eps);
    h->ops->rope_forward(h->ops->be, uq, uq, dcos, dsin, N, T, pos0, H, hd);
    h->ops->rope_forward(h->ops->be, uk, uk, dcos, dsin, N, T, pos0, K, hd);
    float *uqh = down_f(h, uq, nq), *ukh = down_f(h, uk, nk);
    checkf(h, "qk_norm_rope_forward", err_rel(h, q, to_d(h, uqh, nq), nq) + err_rel(h, k, to_d(h, ukh, nk), nk),
           fused_tol(h, TOL_FWD), "%s == rmsnorm + rope (cpu: bits)", cs);
    checkf(h, "qk_norm_rope_forward", ndiff(rq, down_f(h, urq, NH), NH) + ndiff(rk, down_f(h, urk, NK), NK), 0,
           "%s rstd bits == rmsnorm_forward", cs);
    float *dq2 = up_f(h, nan_f(h, nq), nq), *dk2 = up_f(h, nan_f(h, nk), nk);
    h->ops->qk_norm_rope_forward(h->ops->be, dq2, dk2, drq, drk, dqr, dkr, dwq, dwk, dcos, dsin, N, T, pos0, H, K, hd, eps);
    checkf(h, "qk_norm_rope_forward", ndiff(q, down_f(h, dq2, nq), nq) + ndiff(k, down_f(h, dk2, nk), nk), 0,
           "%s determinism", cs);

    if (pos0 != 0) return;   /* the backward is the training form (positions from 0) */
    if (!has(h, "qk_norm_rope_backward", h->ops->qk_norm_rope_backward != NULL)) return;
    float *dgq = up_f(h, Wq, nq), *dgk = up_f(h, Wk, nk);
    float *ddqr = up_f(h, nan_f(h, nq), nq), *ddkr = up_f(h, nan_f(h, nk), nk);
    float *ddwq = up_f(h, dwq0, hd), *ddwk = up_f(h, dwk0, hd);
    h->ops->qk_norm_rope_backward(h->ops->be, ddqr, ddkr, ddwq, ddwk, dgq, dgk, dqr, dkr, dwq, dwk, drq, drk, dcos, dsin, N, T, H, K,
                             hd);
    float *gotq = down_f(h, ddqr, nq), *gotk = down_f(h, ddkr, nk);
    float *gotwq = down_f(h, ddwq, hd), *gotwk = down_f(h, ddwk, hd);
    checkf(h, "qk_norm_rope_bwd", err_rel(h, gotq, gqr, nq), TOL_BWD, "%s dq_raw (=)", cs);
    checkf(h, "qk_norm_rope_bwd", err_rel(h, gotk, gkr, nk), TOL_BWD, "%s dk_raw (=)", cs);
    checkf(h, "qk_norm_rope_bwd", err_rel(h, gotwq, plus(h, dwq0, gwq, hd), hd), TOL_BWD, "%s dwq (+=)", cs);
    checkf(h, "qk_norm_rope_bwd", err_rel(h, gotwk, plus(h, dwk0, gwk, hd), hd), TOL_BWD, "%s dwk (+=)", cs);
    /* dq, dk hold R^T of their input on return (=) */
    float *gotgq = down_f(h, dgq, nq), *gotgk = down_f(h, dgk, nk);
    checkf(h, "qk_norm_rope_bwd", err_rel(h, gotgq, gq, nq) + err_rel(h, gotgk, gk, nk), TOL_BWD,
           "%s dq, dk = R^T (in place)", cs);
    /* the unfused chain: rope_backward in place then rmsnorm_backward (accumulate 0) */
    float *tq = up_f(h, Wq, nq), *tk = up_f(h, Wk, nk);
    float *uqr = up_f(h, nan_f(h, nq), nq), *ukr = up_f(h, nan_f(h, nk), nk);
    float *uwq = up_f(h, dwq0, hd), *uwk = up_f(h, dwk0, hd);
    h->ops->rope_backward(h->ops->be, tq, tq, dcos, dsin, N, T, 0, H, hd);
    h->ops->rope_backward(h->ops->be, tk, tk, dcos, dsin, N, T, 0, K, hd);
    checkf(h, "qk_norm_rope_bwd",
           err_rel(h, gotgq, to_d(h, down_f(h, tq, nq), nq), nq) +
               err_rel(h, gotgk, to_d(h, down_f(h, tk, nk), nk), nk),
           fused_tol(h, TOL_BWD), "%s dq, dk == rope_backward (cpu: bits)", cs);
    h->ops->rmsnorm_backward(h->ops->be, uqr, uwq, tq, dqr, dwq, drq, (int)NH, hd, 0);
    h->ops->rmsnorm_backward(h->ops->be, ukr, uwk, tk, dkr, dwk, drk, (int)NK, hd, 0);
    float *uqrh = down_f(h, uqr, nq), *ukrh = down_f(h, ukr, nk);
    float *uwqh = down_f(h, uwq, hd), *uwkh = down_f(h, uwk, hd);
    checkf(h, "qk_norm_rope_bwd",
           err_rel(h, gotq, to_d(h, uqrh, nq), nq) + err_rel(h, gotk, to_d(h, ukrh, nk), nk),
           fused_tol(h, TOL_BWD), "%s dq_raw, dk_raw == rope + rmsnorm bwd (cpu: bits)", cs);
    checkf(h, "qk_norm_rope_bwd",
           err_rel(h, gotwq, to_d(h, uwqh, hd), hd) + err_rel(h, gotwk, to_d(h, uwkh, hd), hd),
           fused_tol(h, TOL_BWD), "%s dwq, dwk == rope + rmsnorm bwd (cpu: bits)", cs);
    float *ddqr2 = up_f(h, nan_f(h, nq), nq), *ddkr2 = up_f(h, nan_f(h, nk), nk);
    float *ddwq2 = up_f(h, dwq0, hd), *ddwk2 = up_f(h, dwk0, hd), *dgq2 = up_f(h, Wq, nq), *dgk2 = up_f(h, Wk, nk);
    h->ops->qk_norm_rope_backward(h->ops->be, ddqr2, ddkr2, ddwq2, ddwk2, dgq2, dgk2, dqr, dkr, dwq, dwk, drq, drk, dcos, dsin, N, T, H,
                             K, hd);
    checkf(h, "qk_norm_rope_bwd",
           ndiff(gotq, down_f(h, ddqr2, nq), nq) + ndiff(gotk, down_f(h, ddkr2, nk), nk) +
               ndiff(gotwq, down_f(h, ddwq2, hd), hd) + ndiff(gotwk, down_f(h, ddwk2, hd), hd),
           0, "%s determinism", cs);
}

/* bf16(x), round to nearest even, as the test's own reference (finite inputs) */
static uint16_t ref_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* elements of the device bf16 buffer d (n) that differ from ref_bf16(out[i]) */
static long twin_diff(struct harness *h, const uint16_t *d, const float *out, size_t n)
{
    uint16_t *b = (uint16_t *)new_f(h, (n + 1) / 2);
    h->ops->sync(h->ops->be);
    h->ops->copy_to_host(h->ops->be, b, d, n * sizeof(uint16_t));
    long bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != ref_bf16(out[i]);
    return bad;
}

/* precision=bf16 twins (mt_ops.h "bf16 activation twins"): the fp32 outputs
 * are the plain op's bits, the twin is bf16(out) nearest even, element by element */
static void bf16_twin_case(struct harness *h, int N, int C)
{
    if (!h->ops) return;
    size_t n = (size_t)N * C;
    char cs[64];
    snprintf(cs, sizeof cs, "N=%d C=%d", N, C);
    float *x = rand_f(h, n, -3, 3), *w = rand_f(h, C, 0.5, 1.5), *u = rand_f(h, n, -3, 3);
    float *dx = up_f(h, x, n), *dw = up_f(h, w, C), *du = up_f(h, u, n);
    if (has(h, "rmsnorm_resid_forward_bf16", h->ops->rmsnorm_resid_forward_bf16 != NULL)) {
        float *dout = up_f(h, nan_f(h, n), n), *drs = up_f(h, nan_f(h, N), N), *dres = up_f(h, nan_f(h, n), n);
        uint16_t *db = dalloc(h, n * sizeof(uint16_t));
        h->ops->rmsnorm_resid_forward_bf16(h->ops->be, dout, db, drs, dres, dx, dw, N, C, 1e-5f);
        float *uout = up_f(h, nan_f(h, n), n), *urs = up_f(h, nan_f(h, N), N), *ures = up_f(h, nan_f(h, n), n);
        h->ops->rmsnorm_resid_forward(h->ops->be, uout, urs, ures, dx, dw, N, C, 1e-5f);
        float *out = down_f(h, dout, n);
        checkf(h, "rmsnorm_resid_forward_bf16",
               ndiff(out, down_f(h, uout, n), n) + ndiff(down_f(h, drs, N), down_f(h, urs, N), N) +
                   ndiff(down_f(h, dres, n), x, n),
               0, "%s out, rstd, resid == rmsnorm_resid_forward (bits)", cs);
        checkf(h, "rmsnorm_resid_forward_bf16", (double)twin_diff(h, db, out, n), 0, "%s twin == bf16(out)", cs);
        /* out = NULL (mt_ops.h): the twin, rstd and resid alone, the same bits */
        float *nrs = up_f(h, nan_f(h, N), N), *nres = up_f(h, nan_f(h, n), n);
        uint16_t *dn = dalloc(h, n * sizeof(uint16_t));
        h->ops->rmsnorm_resid_forward_bf16(h->ops->be, NULL, dn, nrs, nres, dx, dw, N, C, 1e-5f);
        checkf(h, "rmsnorm_resid_forward_bf16",
               (double)twin_diff(h, dn, out, n) + ndiff(down_f(h, nrs, N), down_f(h, urs, N), N) +
                   ndiff(down_f(h, nres, n), x, n),
               0, "%s out = NULL: twin, rstd, resid the same bits", cs);
    }
    if (has(h, "rmsnorm_forward_bf16", h->ops->rmsnorm_forward_bf16 != NULL)) {
        float *dout = up_f(h, nan_f(h, n), n), *drs = up_f(h, nan_f(h, N), N);
        float *uout = up_f(h, nan_f(h, n), n), *urs = up_f(h, nan_f(h, N), N), *nrs = up_f(h, nan_f(h, N), N);
        uint16_t *db = dalloc(h, n * sizeof(uint16_t)), *dn = dalloc(h, n * sizeof(uint16_t));
        h->ops->rmsnorm_forward_bf16(h->ops->be, dout, db, drs, dx, dw, N, C, 1e-5f);
        h->ops->rmsnorm_forward(h->ops->be, uout, urs, dx, dw, N, C, 1e-5f);
        h->ops->rmsnorm_forward_bf16(h->ops->be, NULL, dn, nrs, dx, dw, N, C, 1e-5f);
        float *out = down_f(h, dout, n), *rs = down_f(h, urs, N);
        checkf(h, "rmsnorm_forward_bf16", ndiff(out, down_f(h, uout, n), n) + ndiff(down_f(h, drs, N), rs, N), 0,
               "%s out, rstd == rmsnorm_forward (bits)", cs);
        checkf(h, "rmsnorm_forward_bf16", (double)twin_diff(h, db, out, n) + twin_diff(h, dn, out, n) +
               ndiff(down_f(h, nrs, N), rs, N), 0, "%s twin == bf16(out), with out = NULL too", cs);
    }
    if (has(h, "rmsnorm_backward_bf16", h->ops->rmsnorm_backward_bf16 != NULL)) {
        /* dinp (accumulating) and dw the plain op's bits; the twin bf16 of the final dinp */
        float *g = rand_f(h, n, -1, 1), *dg = up_f(h, g, n), *rs = up_f(h, nan_f(h, N), N);
        float *ob = up_f(h, nan_f(h, n), n);
        h->ops->rmsnorm_forward(h->ops->be, ob, rs, dx, dw, N, C, 1e-5f);
        float *da = up_f(h, u, n), *db2 = up_f(h, u, n), *wa = up_f(h, w, C), *wb = up_f(h, w, C);
        uint16_t *tb = dalloc(h, n * sizeof(uint16_t));
        h->ops->rmsnorm_backward_bf16(h->ops->be, da, tb, wa, dg, dx, dw, rs, N, C, 1, NULL);
        h->ops->rmsnorm_backward(h->ops->be, db2, wb, dg, dx, dw, rs, N, C, 1);
        float *a = down_f(h, da, n);
        checkf(h, "rmsnorm_backward_bf16",
               ndiff(a, down_f(h, db2, n), n) + ndiff(down_f(h, wa, C), down_f(h, wb, C), C), 0,
               "%s dinp (+=), dw == rmsnorm_backward (bits)", cs);
        checkf(h, "rmsnorm_backward_bf16", (double)twin_diff(h, tb, a, n), 0, "%s twin == bf16(final dinp)", cs);
        /* dout_b: dout as bf16 (dout ignored: NULL), read widened: the bits of the
         * plain op given widen(dout_b); and with no twin (dinp_b NULL) */
        uint16_t *gb = (uint16_t *)new_f(h, (n + 1) / 2);
        float *gw = new_f(h, n);
        for (size_t i = 0; i < n; i++) gb[i] = ref_bf16(g[i]), gw[i] = gu_f32(gb[i]);
        uint16_t *dgb = dalloc(h, n * sizeof(uint16_t));
        h->ops->copy_from_host(h->ops->be, dgb, gb, n * sizeof(uint16_t));
        float *dc = up_f(h, u, n), *dd = up_f(h, u, n), *wc = up_f(h, w, C), *wd = up_f(h, w, C);
        uint16_t *tc = dalloc(h, n * sizeof(uint16_t));
        h->ops->rmsnorm_backward_bf16(h->ops->be, dc, tc, wc, NULL, dx, dw, rs, N, C, 1, dgb);
        h->ops->rmsnorm_backward(h->ops->be, dd, wd, up_f(h, gw, n), dx, dw, rs, N, C, 1);
        float *c2 = down_f(h, dc, n);
        checkf(h, "rmsnorm_backward_bf16",
               ndiff(c2, down_f(h, dd, n), n) + ndiff(down_f(h, wc, C), down_f(h, wd, C), C), 0,
               "%s dout_b: dinp (+=), dw == rmsnorm_backward of widen(dout_b) (bits)", cs);
        checkf(h, "rmsnorm_backward_bf16", (double)twin_diff(h, tc, c2, n), 0, "%s dout_b: twin == bf16(final dinp)",
               cs);
        float *de = up_f(h, u, n);
        h->ops->rmsnorm_backward_bf16(h->ops->be, de, NULL, NULL, NULL, dx, dw, rs, N, C, 0, dgb);
        h->ops->rmsnorm_backward(h->ops->be, dd, NULL, up_f(h, gw, n), dx, dw, rs, N, C, 0);
        checkf(h, "rmsnorm_backward_bf16", ndiff(down_f(h, de, n), down_f(h, dd, n), n), 0,
               "%s dout_b, no twin, no dw, (=): dinp == rmsnorm_backward (bits)", cs);
    }
    if (has(h, "swiglu_forward_bf16", h->ops->swiglu_forward_bf16 != NULL)) {
        float *dout = up_f(h, nan_f(h, n), n), *uout = up_f(h, nan_f(h, n), n);
        uint16_t *db = dalloc(h, n * sizeof(uint16_t));
        h->ops->swiglu_forward_bf16(h->ops->be, dout, db, dx, du, n);
        h->ops->swiglu_forward(h->ops->be, uout, dx, du, n);
        float *out = down_f(h, dout, n);
        checkf(h, "swiglu_forward_bf16", ndiff(out, down_f(h, uout, n), n), 0, "%s out == swiglu_forward (bits)", cs);
        checkf(h, "swiglu_forward_bf16", (double)twin_diff(h, db, out, n), 0, "%s twin == bf16(out)", cs);
        /* out = NULL (mt_ops.h): the twin alone, the same bits */
        uint16_t *dn = dalloc(h, n * sizeof(uint16_t));
        h->ops->swiglu_forward_bf16(h->ops->be, NULL, dn, dx, du, n);
        checkf(h, "swiglu_forward_bf16", (double)twin_diff(h, dn, out, n), 0, "%s out = NULL: twin == bf16(out)", cs);
    }
}

/* widen_bf16 (grad_reduce_dtype=bf16's way back): exact, every bf16 pattern
 * (NaNs: a NaN), then cast_bf16 of the result gives the pattern back */
static void widen_case(struct harness *h)
{
    if (!h->ops || !has(h, "widen_bf16", h->ops->widen_bf16 != NULL)) return;
    const size_t n = 65536;
    uint16_t *p = (uint16_t *)new_f(h, n / 2);
    for (size_t i = 0; i < n; i++) p[i] = (uint16_t)i;
    uint16_t *dp = dalloc(h, n * sizeof(uint16_t));
    h->ops->copy_from_host(h->ops->be, dp, p, n * sizeof(uint16_t));
    float *dw = up_f(h, nan_f(h, n), n);
    h->ops->widen_bf16(h->ops->be, dw, dp, n);
    float *w = down_f(h, dw, n);
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], sizeof u);
        int nan = (p[i] & 0x7fffu) > 0x7f80u;
        bad += nan ? !isnan(w[i]) : u != (uint32_t)p[i] << 16;
    }
    checkf(h, "widen_bf16", (double)bad, 0, "all 65536 patterns exact (NaN: NaN)");
}

/* a device bf16 buffer (n) as a host copy */
static uint16_t *down_b16(struct harness *h, const uint16_t *d, size_t n)
{
    uint16_t *b = (uint16_t *)new_f(h, (n + 1) / 2);
    h->ops->sync(h->ops->be);
    h->ops->copy_to_host(h->ops->be, b, d, n * sizeof(uint16_t));
    return b;
}
static long b16_diff(const uint16_t *a, const uint16_t *b, size_t n)
{
    long bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != b[i];
    return bad;
}
/* a device bf16 buffer (m) of bf16 NaN 0xffff: an element an op does not write stays so */
static uint16_t *poison_b16(struct harness *h, size_t m)
{
    uint16_t *p = (uint16_t *)new_f(h, (m + 1) / 2), *d = dalloc(h, m * sizeof(uint16_t));
    for (size_t i = 0; i < m; i++) p[i] = 0xffffu;
    h->ops->copy_from_host(h->ops->be, d, p, m * sizeof(uint16_t));
    return d;
}

/* adamw_multi's shadows (precision=bf16: pb[i] = cast_bf16 of the updated
 * p[i], mt_ops.h): MULTI_N tensors (odd sizes, an empty one, one past two
 * cpu chunks), each shadow poisoned (bf16 NaN, one guard element past n);
 * tensor i%4 == 1 has every buffer one element in (the cuda kernel's scalar
 * path), i%4 == 2 its shadow alone (p aligned, the shadow not: scalar too);
 * i%5 == 4 passes a NULL shadow (its buffer must stay poisoned: no tensor
 * writes another's); tensor 7 holds a NaN and an inf in p. The update's p,
 * m, v == adamw_multi without shadows (bits); each shadow == cast_bf16 of
 * that p on the same backend (bits, NaN included) and == the host's
 * rounding where finite; the guard and the NULL ones untouched. */
static void adamw_shadow_case(struct harness *h, float gs)
{
    reset(h);   /* the harness's buffer slots: the cases before are done with theirs */
    const char *op = "adamw_multi";
    const float lr = 0.02f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bc1 = 1 - 0.9f * 0.9f, bc2 = 1 - 0.95f * 0.95f;
    float *p[MULTI_N], *m[MULTI_N], *v[MULTI_N], *p2[MULTI_N], *m2[MULTI_N], *v2[MULTI_N], wd[MULTI_N];
    const float *g[MULTI_N];
    uint16_t *sb[MULTI_N], *cb[MULTI_N], *pb[MULTI_N];
    size_t n[MULTI_N];
    for (int i = 0; i < MULTI_N; i++) {
        n[i] = multi_size(i);
        const size_t k = n[i] + 2;   /* room for the offset and one guard element */
        const int off = i % 4 == 1, soff = i % 4 == 1 || i % 4 == 2;
        float *hp = rand_f(h, k, -1, 1), *hg = rand_f(h, k, -1, 1);
        float *hm = rand_f(h, k, -0.1, 0.1), *hv = rand_f(h, k, 0, 0.01);
        if (i == 7) hp[off + 2] = NAN, hp[off + 5] = INFINITY;
        wd[i] = i % 3 ? 0.1f : 0.0f;
        p[i] = up_f(h, hp, k) + off, m[i] = up_f(h, hm, k) + off, v[i] = up_f(h, hv, k) + off;
        g[i] = up_f(h, hg, k) + off;
        p2[i] = up_f(h, hp, k) + off, m2[i] = up_f(h, hm, k) + off, v2[i] = up_f(h, hv, k) + off;
        sb[i] = poison_b16(h, k) + soff;
        cb[i] = (uint16_t *)dalloc(h, k * sizeof(uint16_t));
        pb[i] = i % 5 == 4 ? NULL : sb[i];
    }
    h->ops->adamw_multi(h->ops->be, p2, NULL, g, m2, v2, n, wd, MULTI_N, lr, b1, b2, eps, bc1, bc2, gs);
    h->ops->adamw_multi(h->ops->be, p, pb, g, m, v, n, wd, MULTI_N, lr, b1, b2, eps, bc1, bc2, gs);
    double bad = 0;
    long shadow = 0, host = 0, untouched = 0;
    for (int i = 0; i < MULTI_N; i++) {
        const size_t k = n[i] + 1;
        float *a = down_f(h, p[i], k);
        bad += ndiff(a, down_f(h, p2[i], k), k) + ndiff(down_f(h, m[i], k), down_f(h, m2[i], k), k) +
               ndiff(down_f(h, v[i], k), down_f(h, v2[i], k), k);
        const uint16_t *got = down_b16(h, sb[i], k);
        for (size_t j = pb[i] ? n[i] : 0; j < k; j++) untouched += got[j] != 0xffffu;   /* guard; all of a NULL one */
        if (!pb[i]) continue;
        h->ops->cast_bf16(h->ops->be, cb[i], p[i], n[i]);
        shadow += b16_diff(got, down_b16(h, cb[i], n[i]), n[i]);
        for (size_t j = 0; j < n[i]; j++) host += isfinite(a[j]) && got[j] != ref_bf16(a[j]);
    }
    checkf(h, op, bad, 0, "shadows, gscale %g: p, m, v == without shadows (bits)", gs);
    checkf(h, op, (double)shadow, 0, "shadows, gscale %g: == cast_bf16(p updated) (bits)", gs);
    checkf(h, op, (double)host, 0, "shadows, gscale %g: == host bf16 of p (finite)", gs);
    checkf(h, op, (double)untouched, 0, "shadows, gscale %g: guard and NULL ones untouched", gs);
}

/* a host buffer of n random bf16 values in [-1, 1), uploaded (*dev) */
static uint16_t *rand_b16(struct harness *h, size_t n, uint16_t **dev)
{
    uint16_t *x = (uint16_t *)new_f(h, (n + 1) / 2);
    for (size_t i = 0; i < n; i++) x[i] = gu_b16((float)(2.0 * urand(h) - 1.0));
    *dev = dalloc(h, n * sizeof(uint16_t));
    h->ops->copy_from_host(h->ops->be, *dev, x, n * sizeof(uint16_t));
    return x;
}

/* gemm_bf16_batched (mt_ops.h), `count` matrices with gaps between them and
 * rows ld > their width apart: each element of D_i within the fp32 sum's error
 * (K + 2) 2^-24 (|alpha| sum |a b| + |beta c|) plus a bf16 rounding (2^-8 |ref|)
 * of the fp64 alpha op(A_i) op(B_i) + beta C_i, and == bf16(fp64) for at least
 * 98% (rounding, not truncation); the rows' padding and the gaps untouched;
 * C == D (in place) the same bits as C apart; C NULL at beta 0; a rerun the same
 * bits. Muon's three products: A = X X^T (tb), B = c A A + b A, X' = B X + a X. */
static void gemm_batched_case(struct harness *h, int ta, int tb, int M, int N, int K, int count, float alpha,
                              float beta)
{
    if (!h->ops || !has(h, "gemm_bf16_batched", h->ops->gemm_bf16_batched != NULL)) return;
    char cs[96];
    snprintf(cs, sizeof cs, "%s %s M=%d N=%d K=%d x%d beta %g", ta ? "A^T" : "A", tb ? "B^T" : "B", M, N, K, count,
             beta);
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int lda = ac + 8, ldb = bc + 8, ldd = N + 8;
    const size_t sa = (size_t)ar * lda + 16, sb = (size_t)br * ldb + 24, sd = (size_t)M * ldd + 8;
    uint16_t *dA, *dB, *dC;
    const uint16_t *A = rand_b16(h, sa * count, &dA), *B = rand_b16(h, sb * count, &dB);
    const uint16_t *Cv = rand_b16(h, sd * count, &dC);
    uint16_t *D = poison_b16(h, sd * count), *D2 = poison_b16(h, sd * count), *Dn = poison_b16(h, sd * count);
    uint16_t *Di = dalloc(h, sd * count * sizeof(uint16_t));
    h->ops->copy(h->ops->be, Di, dC, sd * count * sizeof(uint16_t));
    h->ops->gemm_bf16_batched(h->ops->be, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, beta, dC, D, ldd, sd,
                              count);
    h->ops->gemm_bf16_batched(h->ops->be, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, beta, dC, D2, ldd, sd,
                              count);
    h->ops->gemm_bf16_batched(h->ops->be, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, beta, Di, Di, ldd, sd,
                              count);
    if (beta == 0.0f)
        h->ops->gemm_bf16_batched(h->ops->be, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, 0.0f, NULL, Dn, ldd,
                                  sd, count);
    const size_t nd = sd * count;
    const uint16_t *d = down_b16(h, D, nd), *d2 = down_b16(h, D2, nd), *di = down_b16(h, Di, nd);
    long bad = 0, inexact = 0, kept = 0;
    for (int q = 0; q < count; q++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    const double x = gu_f32(A[q * sa + (ta ? (size_t)k * lda + i : (size_t)i * lda + k)]);
                    const double y = gu_f32(B[q * sb + (tb ? (size_t)j * ldb + k : (size_t)k * ldb + j)]);
                    ref += x * y, mag += fabs(x * y);
                }
                const double c = gu_f32(Cv[q * sd + (size_t)i * ldd + j]);
                ref = alpha * ref + beta * c;
                mag = fabs(alpha) * mag + fabs(beta * c);
                const uint16_t got = d[q * sd + (size_t)i * ldd + j];
                bad += !(fabs(gu_f32(got) - ref) <= 0x1.0p-8 * fabs(ref) + (K + 2) * 0x1.0p-24 * mag);
                inexact += got != gu_b16((float)ref);
            }
    for (size_t e = 0; e < nd; e++) {   /* outside every (M, N) block: the poison */
        const size_t q = e / sd, r = e % sd;
        if (q < (size_t)count && r < (size_t)M * ldd && (int)(r % ldd) < N) continue;
        kept += d[e] != 0xffffu;
    }
    checkf(h, "gemm_bf16_batched", (double)(bad + kept), 0, "%s: within the fp32 sum's bound of fp64, padding kept",
           cs);
    checkf(h, "gemm_bf16_batched", (double)inexact / ((double)M * N * count), 0.02, "%s: share not bf16(fp64)", cs);
    checkf(h, "gemm_bf16_batched", (double)b16_diff(d, d2, nd), 0, "%s: rerun (bits)", cs);
    long in_place = 0;
    for (int q = 0; q < count; q++)
        for (int i = 0; i < M; i++)
            in_place += b16_diff(d + q * sd + (size_t)i * ldd, di + q * sd + (size_t)i * ldd, (size_t)N);
    checkf(h, "gemm_bf16_batched", (double)in_place, 0, "%s: C == D in place (bits)", cs);
    if (beta == 0.0f)
        checkf(h, "gemm_bf16_batched", (double)b16_diff(d, down_b16(h, Dn, nd), nd), 0, "%s: C NULL (bits)", cs);
}

/* the backward SwiGLU cases' device inputs: gate, up, dout (m each, random), each view `off` elements in */
static void swiglu_bwd_inputs(struct harness *h, size_t m, int off, float **G, float **U, float **D)
{
    *G = up_f(h, rand_f(h, m, -6, 6), m) + off;
    *U = up_f(h, rand_f(h, m, -3, 3), m) + off;
    *D = up_f(h, rand_f(h, m, -2, 2), m) + off;
}

/* swiglu_backward_bf16 (mt_ops.h): dgate_b, dup_b are bf16 (nearest even) of
 * the bits swiglu_backward writes from the same inputs: equal to that op
 * followed by cast_bf16 on the same backend, and to the host's rounding of
 * its fp32 outputs. Every pointer `off` elements into its buffer (off 1: the
 * cuda kernel's scalar path), then dup_b alone one element off; n odd, and
 * n > 16384 (the cpu's threaded chunks of 4096 with a tail). */
static void swiglu_bwd_bf16_case(struct harness *h, size_t n, int off)
{
    if (!h->ops || !has(h, "swiglu_backward_bf16", h->ops->swiglu_backward_bf16 != NULL)) return;
    char cs[64];
    snprintf(cs, sizeof cs, "n=%zu off=%d", n, off);
    const size_t m = n + 1;
    float *G, *U, *D;
    swiglu_bwd_inputs(h, m, off, &G, &U, &D);
    float *DG = up_f(h, nan_f(h, m), m) + off, *DU = up_f(h, nan_f(h, m), m) + off;
    uint16_t *CG = (uint16_t *)dalloc(h, m * 2) + off, *CU = (uint16_t *)dalloc(h, m * 2) + off;
    uint16_t *BG = (uint16_t *)dalloc(h, m * 2) + off, *BU = (uint16_t *)dalloc(h, m * 2) + off;
    uint16_t *BM = (uint16_t *)dalloc(h, m * 2) + (1 - off), *BG2 = (uint16_t *)dalloc(h, m * 2) + off;
    uint16_t *BU2 = (uint16_t *)dalloc(h, m * 2) + off;
    h->ops->swiglu_backward(h->ops->be, DG, DU, D, G, U, n);
    h->ops->cast_bf16(h->ops->be, CG, DG, n);
    h->ops->cast_bf16(h->ops->be, CU, DU, n);
    h->ops->swiglu_backward_bf16(h->ops->be, BG, BU, D, G, U, n);
    const uint16_t *bg = down_b16(h, BG, n), *bu = down_b16(h, BU, n);
    checkf(h, "swiglu_backward_bf16", (double)(b16_diff(bg, down_b16(h, CG, n), n) + b16_diff(bu, down_b16(h, CU, n), n)),
           0, "%s == swiglu_backward + cast_bf16 (bits)", cs);
    checkf(h, "swiglu_backward_bf16",
           (double)(twin_diff(h, BG, down_f(h, DG, n), n) + twin_diff(h, BU, down_f(h, DU, n), n)), 0,
           "%s == host bf16 of swiglu_backward's bits", cs);
    /* dup_b alone at the other offset (cuda: the scalar path), the same bits */
    h->ops->swiglu_backward_bf16(h->ops->be, BG2, BM, D, G, U, n);
    checkf(h, "swiglu_backward_bf16", (double)(b16_diff(bg, down_b16(h, BG2, n), n) + b16_diff(bu, down_b16(h, BM, n), n)),
           0, "%s dup_b at offset %d: the same bits", cs, 1 - off);
    h->ops->swiglu_backward_bf16(h->ops->be, BG2, BU2, D, G, U, n);
    checkf(h, "swiglu_backward_bf16", (double)(b16_diff(bg, down_b16(h, BG2, n), n) + b16_diff(bu, down_b16(h, BU2, n), n)),
           0, "%s determinism", cs);
}

/* swiglu_backward_act_bf16 (mt_ops.h): act_b is swiglu_forward_bf16's twin
 * and dgate_b, dup_b are swiglu_backward_bf16's outputs on the same inputs,
 * bit for bit. Each call writes fresh outputs poisoned with bf16 NaN (an
 * element not written fails). Inputs `off` elements into their buffers
 * (off 1: the cuda kernel's scalar path); outputs there too, then each
 * output alone one element off (the others aligned: the scalar path on
 * cuda), then once more (determinism: the same bits again); n odd, and
 * n > 16384 (the cpu's threaded chunks of 4096 with a tail). */
/* one call with act_b, dgate_b, dup_b at element offsets o[0..2]: elements differing from tw, bg, bu */
static long act_bf16_diff(struct harness *h, const int o[3], const float *D, const float *G, const float *U, size_t n,
                          const uint16_t *const ref[3])
{
    uint16_t *out[3];
    for (int k = 0; k < 3; k++) out[k] = poison_b16(h, n + 1) + o[k];
    h->ops->swiglu_backward_act_bf16(h->ops->be, out[0], out[1], out[2], D, G, U, n);
    long bad = 0;
    for (int k = 0; k < 3; k++) bad += b16_diff(down_b16(h, out[k], n), ref[k], n);
    return bad;
}
static void swiglu_bwd_act_bf16_case(struct harness *h, size_t n, int off)
{
    if (!h->ops || !has(h, "swiglu_backward_act_bf16", h->ops->swiglu_backward_act_bf16 != NULL)) return;
    if (!h->ops->swiglu_forward_bf16 || !h->ops->swiglu_backward_bf16) return;   /* its references (their own FAIL) */
    const char *op = "swiglu_backward_act_bf16", *name[3] = {"act_b", "dgate_b", "dup_b"};
    char cs[64];
    snprintf(cs, sizeof cs, "n=%zu off=%d", n, off);
    const size_t m = n + 1;
    float *G, *U, *D;
    swiglu_bwd_inputs(h, m, off, &G, &U, &D);
    uint16_t *TW = poison_b16(h, m) + off, *BG = poison_b16(h, m) + off, *BU = poison_b16(h, m) + off;
    h->ops->swiglu_forward_bf16(h->ops->be, NULL, TW, G, U, n);
    h->ops->swiglu_backward_bf16(h->ops->be, BG, BU, D, G, U, n);
    const uint16_t *const ref[3] = {down_b16(h, TW, n), down_b16(h, BG, n), down_b16(h, BU, n)};
    int o[3] = {off, off, off};
    checkf(h, op, (double)act_bf16_diff(h, o, D, G, U, n, ref), 0,
           "%s == forward_bf16 twin, backward_bf16 (bits)", cs);
    for (int k = 0; k < 3; k++) {
        o[k] = 1 - off;
        checkf(h, op, (double)act_bf16_diff(h, o, D, G, U, n, ref), 0, "%s %s alone at offset %d: same bits", cs,
               name[k], 1 - off);
        o[k] = off;
    }
    checkf(h, op, (double)act_bf16_diff(h, o, D, G, U, n, ref), 0, "%s determinism", cs);
}

/* host bf16 (nearest even) and back, for the *_gu and gemm_bf16_out cases (finite values) */
static uint16_t gu_b16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float gu_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* swiglu_forward_bf16_gu / swiglu_backward_act_bf16_gu (mt_ops.h): gate and up
 * stored bf16 give the bits swiglu_forward_bf16 (twin) and
 * swiglu_backward_act_bf16 give on those values widened to fp32; inputs and
 * outputs `off` elements in (1: the cuda kernels' scalar path) */
static void swiglu_gu_case(struct harness *h, size_t n, int off)
{
    if (!h->ops || !has(h, "swiglu_forward_bf16_gu", h->ops->swiglu_forward_bf16_gu != NULL) ||
        !has(h, "swiglu_backward_act_bf16_gu", h->ops->swiglu_backward_act_bf16_gu != NULL))
        return;
    if (!h->ops->swiglu_forward_bf16 || !h->ops->swiglu_backward_act_bf16) return;   /* the references */
    char cs[64];
    snprintf(cs, sizeof cs, "n=%zu off=%d", n, off);
    const size_t m = n + 1;
    float *g = rand_f(h, m, -6, 6), *u = rand_f(h, m, -3, 3);
    uint16_t *gb = (uint16_t *)new_f(h, (m + 1) / 2), *ub = (uint16_t *)new_f(h, (m + 1) / 2);
    for (size_t i = 0; i < m; i++) {
        gb[i] = gu_b16(g[i]), ub[i] = gu_b16(u[i]);
        g[i] = gu_f32(gb[i]), u[i] = gu_f32(ub[i]);   /* the widened values */
    }
    uint16_t *GB = dalloc(h, m * 2), *UB = dalloc(h, m * 2);
    h->ops->copy_from_host(h->ops->be, GB, gb, m * 2);
    h->ops->copy_from_host(h->ops->be, UB, ub, m * 2);
    float *G = up_f(h, g, m) + off, *U = up_f(h, u, m) + off, *D = up_f(h, rand_f(h, m, -2, 2), m) + off;
    GB += off, UB += off;
    uint16_t *TW = poison_b16(h, m) + off, *TWg = poison_b16(h, m) + off;
    h->ops->swiglu_forward_bf16(h->ops->be, NULL, TW, G, U, n);
    h->ops->swiglu_forward_bf16_gu(h->ops->be, TWg, GB, UB, n);
    checkf(h, "swiglu_forward_bf16_gu", (double)b16_diff(down_b16(h, TW, n), down_b16(h, TWg, n), n), 0,
           "%s == swiglu_forward_bf16 on the widened g, u (bits)", cs);
    uint16_t *r[3], *o[3];
    for (int k = 0; k < 3; k++) r[k] = poison_b16(h, m) + off, o[k] = poison_b16(h, m) + off;
    h->ops->swiglu_backward_act_bf16(h->ops->be, r[0], r[1], r[2], D, G, U, n);
    h->ops->swiglu_backward_act_bf16_gu(h->ops->be, o[0], o[1], o[2], D, GB, UB, n);
    long bad = 0;
    for (int k = 0; k < 3; k++) bad += b16_diff(down_b16(h, r[k], n), down_b16(h, o[k], n), n);
    checkf(h, "swiglu_backward_act_bf16_gu", (double)bad, 0,
           "%s == swiglu_backward_act_bf16 on the widened g, u (act, dg, du bits)", cs);
    if (!has(h, "swiglu_backward_act_bf16_gud", h->ops->swiglu_backward_act_bf16_gud != NULL)) return;
    /* dout stored bf16 too: the bits of _gu on dout's widened values */
    float *d = rand_f(h, m, -2, 2);
    uint16_t *db = (uint16_t *)new_f(h, (m + 1) / 2);
    for (size_t i = 0; i < m; i++) db[i] = gu_b16(d[i]), d[i] = gu_f32(db[i]);
    uint16_t *DB = dalloc(h, m * 2);
    h->ops->copy_from_host(h->ops->be, DB, db, m * 2);
    float *DW = up_f(h, d, m) + off;
    DB += off;
    h->ops->swiglu_backward_act_bf16_gu(h->ops->be, r[0], r[1], r[2], DW, GB, UB, n);
    h->ops->swiglu_backward_act_bf16_gud(h->ops->be, o[0], o[1], o[2], DB, GB, UB, n, 0, 0);
    bad = 0;
    for (int k = 0; k < 3; k++) bad += b16_diff(down_b16(h, r[k], n), down_b16(h, o[k], n), n);
    checkf(h, "swiglu_backward_act_bf16_gud", (double)bad, 0,
           "%s == swiglu_backward_act_bf16_gu on the widened dout (act, dg, du bits)", cs);
    /* dg, du in rows of F (the largest divisor of n up to 16) ldo = 2 F + 4 apart, dg at
     * a row's column 0 and du at F (the merged gate/up operand, with a gap): each row the
     * dense call's, the gap untouched (poison), act the same */
    size_t F = 1;
    for (size_t f = 2; f <= 16; f++)
        if (n % f == 0) F = f;
    const size_t ldo = 2 * F + 4, rows = n / F;
    uint16_t *S = poison_b16(h, rows * ldo + 2 * F), *A2 = poison_b16(h, m) + off;
    h->ops->swiglu_backward_act_bf16_gud(h->ops->be, A2, S + off, S + off + F, DB, GB, UB, n, F, ldo);
    const uint16_t *hs = down_b16(h, S, rows * ldo + 2 * F), *hg = down_b16(h, o[1], n), *hu = down_b16(h, o[2], n);
    bad = b16_diff(down_b16(h, A2, n), down_b16(h, o[0], n), n);
    for (size_t r0 = 0; r0 < rows; r0++) {
        bad += b16_diff(hs + off + r0 * ldo, hg + r0 * F, F) + b16_diff(hs + off + r0 * ldo + F, hu + r0 * F, F);
        for (size_t c = 2 * F; c < ldo; c++) bad += hs[off + r0 * ldo + c] != 0xffffu;
    }
    checkf(h, "swiglu_backward_act_bf16_gud", (double)bad, 0,
           "%s F=%zu: dg, du in rows ldo apart = the dense call's rows, the gap untouched", cs, F);
}

/* A (M, K) and B (N, K) random in [-1, 1) on the device, as fp32 and as their bf16
 * roundings (the gemm_bf16_* cases: fp32 operands rounded in the call, bf16 ones as
 * stored); B read as (N, K) transposed or, same memory, as (K, N) */
struct gemm_ops { float *A, *B; uint16_t *AB, *BB; };
static void gemm_ops_make(struct harness *h, struct gemm_ops *o, int M, int N, int K)
{
    float *a = rand_f(h, (size_t)M * K, -1, 1), *b = rand_f(h, (size_t)N * K, -1, 1);
    uint16_t *ab = (uint16_t *)new_f(h, ((size_t)M * K + 1) / 2), *bb = (uint16_t *)new_f(h, ((size_t)N * K + 1) / 2);
    for (size_t i = 0; i < (size_t)M * K; i++) ab[i] = gu_b16(a[i]);
    for (size_t i = 0; i < (size_t)N * K; i++) bb[i] = gu_b16(b[i]);
    o->A = up_f(h, a, (size_t)M * K), o->B = up_f(h, b, (size_t)N * K);
    o->AB = dalloc(h, (size_t)M * K * 2), o->BB = dalloc(h, (size_t)N * K * 2);
    h->ops->copy_from_host(h->ops->be, o->AB, ab, (size_t)M * K * 2);
    h->ops->copy_from_host(h->ops->be, o->BB, bb, (size_t)N * K * 2);
}
/* variant v of 4: bf16 operands (v & 1) or fp32, B transposed (v < 2) or plain */
struct gemm_var { int bf, tb, ldb; enum mt_elem t; const void *pa, *pb; };
static struct gemm_var gemm_ops_variant(const struct gemm_ops *o, int v, int N, int K)
{
    struct gemm_var g;
    g.bf = v & 1, g.tb = !(v >> 1), g.ldb = g.tb ? K : N;
    g.t = g.bf ? MT_ELEM_BF16 : MT_ELEM_F32;
    g.pa = g.bf ? (const void *)o->AB : (const void *)o->A;
    g.pb = g.bf ? (const void *)o->BB : (const void *)o->B;
    return g;
}

/* gemm_bf16_out (mt_ops.h): C bf16 = bf16(gemm_bf16's fp32 result, beta 0),
 * within one bf16 unit in the last place (an algorithm may sum in another
 * order on a GPU; the cpu and the emulator: 0 elements off); fp32 operands
 * (rounded in the call) and bf16 ones (the direct path on cuda); C with a
 * leading dimension past N whose padding stays untouched; B as (N, K)
 * transposed (x W^T: gate, up, v) and as (K, N) plain (dy W: the o and down
 * projections' d att, d act) */
static void gemm_bf16_out_case(struct harness *h, int M, int N, int K)
{
    if (!h->ops || !has(h, "gemm_bf16_out", h->ops->gemm_bf16_out != NULL) || !h->ops->gemm_bf16) return;
    char cs[64];
    const int ldc = N + 3;
    struct gemm_ops o;
    gemm_ops_make(h, &o, M, N, K);
    for (int v = 0; v < 4; v++) {
        const struct gemm_var g = gemm_ops_variant(&o, v, N, K);
        float *C = dalloc(h, (size_t)M * N * 4);
        h->ops->gemm_bf16(h->ops->be, 0, g.tb, M, N, K, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, 0.0f, C, N);
        uint16_t *CB = poison_b16(h, (size_t)M * ldc);
        h->ops->gemm_bf16_out(h->ops->be, 0, g.tb, M, N, K, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, CB, ldc);
        const float *c = down_f(h, C, (size_t)M * N);
        const uint16_t *cb = down_b16(h, CB, (size_t)M * ldc);
        long off1 = 0, pad = 0, inexact = 0;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                const int d = (int)cb[(size_t)i * ldc + j] - (int)gu_b16(c[(size_t)i * N + j]);
                off1 += d < -1 || d > 1;
                inexact += d != 0;
            }
            for (int j = N; j < ldc; j++) pad += cb[(size_t)i * ldc + j] != 0xffffu;
        }
        snprintf(cs, sizeof cs, "M=%d N=%d K=%d %s operands, B%s", M, N, K, g.bf ? "bf16" : "fp32", g.tb ? "^T" : "");
        checkf(h, "gemm_bf16_out", (double)(off1 + pad), 0, "%s: bf16(gemm_bf16) within 1 ulp, ldc padding kept",
               cs);
        /* rounding, not truncation: another summation order moves a rare element by 1 ulp, truncation half of them */
        checkf(h, "gemm_bf16_out", (double)inexact / ((double)M * N), 0.01, "%s: share of elements not bf16(gemm_bf16)",
               cs);
    }
}

/* gemm_bf16_resid (mt_ops.h): C = alpha op(A) op(B) + R is exactly gemm_bf16 with
 * beta 1 onto a copy of R, bit for bit (the epilogue reads R where it read the
 * copy), on fp32 and bf16 operands (the per-call and direct paths on cuda), rows
 * ldc > N apart with the padding untouched, R == C (in place), and K = 0 (C = R) */
static void gemm_bf16_resid_case(struct harness *h, int M, int N, int K)
{
    if (!h->ops || !has(h, "gemm_bf16_resid", h->ops->gemm_bf16_resid != NULL) || !h->ops->gemm_bf16) return;
    char cs[64];
    const int ldc = N + 3;
    const size_t nc = (size_t)M * ldc;
    float *r = rand_f(h, nc, -2, 2), *R = up_f(h, r, nc);
    struct gemm_ops o;
    gemm_ops_make(h, &o, M, N, K);
    for (int v = 0; v < 4; v++) {
        const struct gemm_var g = gemm_ops_variant(&o, v, N, K);
        float *ref = up_f(h, r, nc), *got = up_f(h, nan_f(h, nc), nc), *inp = up_f(h, r, nc);
        h->ops->gemm_bf16(h->ops->be, 0, g.tb, M, N, K, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, 1.0f, ref, ldc);
        h->ops->gemm_bf16_resid(h->ops->be, 0, g.tb, M, N, K, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, R, got, ldc);
        h->ops->gemm_bf16_resid(h->ops->be, 0, g.tb, M, N, K, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, inp, inp, ldc);
        const float *e = down_f(h, ref, nc), *gv = down_f(h, got, nc), *ip = down_f(h, inp, nc);
        long bad = 0, pad = 0;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) bad += ndiff(e + (size_t)i * ldc + j, gv + (size_t)i * ldc + j, 1);
            for (int j = N; j < ldc; j++) pad += !isnan(gv[(size_t)i * ldc + j]);
        }
        snprintf(cs, sizeof cs, "M=%d N=%d K=%d %s operands, B%s", M, N, K, g.bf ? "bf16" : "fp32", g.tb ? "^T" : "");
        checkf(h, "gemm_bf16_resid", (double)(bad + pad), 0, "%s: == gemm_bf16 beta 1 on R's copy (bits), padding kept",
               cs);
        checkf(h, "gemm_bf16_resid", (double)ndiff(e, ip, nc), 0, "%s: R == C (in place): the same bits", cs);
        float *z = up_f(h, nan_f(h, nc), nc);
        h->ops->gemm_bf16_resid(h->ops->be, 0, g.tb, M, N, 0, 0.5f, g.pa, g.t, K, g.pb, g.t, g.ldb, R, z, ldc);
        const float *zz = down_f(h, z, nc);
        long zb = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) zb += ndiff(zz + (size_t)i * ldc + j, r + (size_t)i * ldc + j, 1);
        checkf(h, "gemm_bf16_resid", (double)zb, 0, "%s: K = 0: C = R", cs);
    }
}

static int run_fused(struct harness *h)
{
    int f0 = n_fail;
    rms_resid_case(h, 5, 13, 1e-6f);
    rms_resid_case(h, 64, 256, 1e-5f);
    rms_resid_case(h, 9, 768, 1e-5f);   /* the register paths of wide rows (run_rmsnorm) */
    rms_resid_case(h, 3, 2048, 1e-5f);
    bf16_twin_case(h, 5, 13);
    bf16_twin_case(h, 37, 200);
    widen_case(h);
    gemm_batched_case(h, 0, 1, 24, 24, 40, 3, 1.0f, 0.0f);         /* Muon's A = X X^T */
    gemm_batched_case(h, 0, 0, 24, 24, 24, 3, 2.0315f, -4.775f);   /* B = c A A + b A  */
    gemm_batched_case(h, 0, 0, 24, 40, 24, 3, 1.0f, 3.4445f);      /* X' = B X + a X   */
    gemm_batched_case(h, 0, 0, 13, 7, 5, 2, 1.0f, 0.5f);           /* odd sizes        */
    gemm_batched_case(h, 1, 0, 16, 8, 32, 1, -0.5f, 0.0f);         /* A^T, one matrix  */
    swiglu_bwd_bf16_case(h, 65, 0);
    swiglu_bwd_bf16_case(h, 7403, 1);
    swiglu_bwd_bf16_case(h, 33003, 0);
    swiglu_bwd_bf16_case(h, 33003, 1);
    swiglu_bwd_act_bf16_case(h, 65, 0);
    swiglu_bwd_act_bf16_case(h, 7403, 1);
    swiglu_bwd_act_bf16_case(h, 33003, 0);
    swiglu_bwd_act_bf16_case(h, 33003, 1);
    swiglu_gu_case(h, 65, 0);
    swiglu_gu_case(h, 7403, 1);
    swiglu_gu_case(h, 33003, 0);
    swiglu_gu_case(h, 4096, 0);   /* F 16: rows apart on the vector path (F, ldo multiples of 4) */
    gemm_bf16_out_case(h, 37, 24, 40);
    gemm_bf16_out_case(h, 64, 72, 128);
    gemm_bf16_resid_case(h, 37, 24, 40);
    gemm_bf16_resid_case(h, 64, 72, 128);
    qkr_case(h, 2, 5, 0, 3, 1, 8);
    qkr_case(h, 2, 5, 3, 3, 1, 8);      /* forward at an offset (decoding) */
    qkr_case(h, 1, 7, 0, 2, 2, 40);     /* a 16-column dw block straddles the two halves */
    qkr_case(h, 2, 32, 0, 4, 2, 64);    /* the bench's head shape */
    qkr_case(h, 2, 16, 0, 4, 2, 128);   /* the widest vector path (a full warp a head) */
    return n_fail == f0;
}

/* ------------------------------------------------------------------------ */
/* the table                                                                */

struct op_test {
    const char *name;
    int (*run)(struct harness *h);  /* 1 if every case passed */
};

static const struct op_test op_tests[] = {
    {"gemm", run_gemm},
    {"fill", run_fill},
    {"axpby", run_axpby},
    {"sumsq", run_sumsq},
    {"all_finite", run_all_finite},
    {"transpose", run_transpose},
    {"embed", run_embed},
    {"rmsnorm", run_rmsnorm},
    {"rope", run_rope},
    {"attention", run_attention},
    {"swiglu", run_swiglu},
    {"xent", run_xent},
    {"router", run_router},
    {"moe", run_moe},
    {"moe_routing", run_routing},
    {"mod_routing", run_mod},
    {"adamw_update", run_adamw},
    {"muon_momentum", run_muon},
    {"fused", run_fused},
    {"sumsq_multi", run_sumsq_multi},
    {"normalize_fro", run_normalize_fro},
    {"muon_prep_bf16_multi", run_muon_multi},
    {"adamw_multi", run_adamw_multi},
    {"nonfinite_mark", run_nonfinite_mark},
};

/* inputs depend only on the op's name: every backend sees the same bits */
static uint64_t seed_of(const char *name)
{
    uint64_t x = 1469598103934665603ull;
    for (; *name; name++) x = (x ^ (unsigned char)*name) * 1099511628211ull;
    return mix64(x);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a crash on a GPU keeps every line before it in the log */
    const char *op_filter = NULL, *backend_filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) op_filter = argv[++i];
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) backend_filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-o OP_SUBSTRING] [-b ref|cpu|cuda]\n", argv[0]);
            return 2;
        }
    }
    /* backends: the fp64 self-check pass, then every available table */
    char why[256] = "";
    const struct mt_ops_i *backends[3] = {NULL, mt_ops_cpu(), mt_ops_cuda(why, sizeof why)};
    const char *names[3] = {"ref", "cpu", "cuda"};
    if (!backends[2] && (!backend_filter || !strcmp(backend_filter, "cuda")))
        printf("cuda  (backend not available: %s)\n", why[0] ? why : "no reason given");

    struct harness h;
    memset(&h, 0, sizeof h);
    mt_ctx_init(&h.ctx);
    printf("%-4s  %-20s %-56s %10s %8s  %s\n", "bknd", "op", "case", "max_err", "tol", "result");
    for (int b = 0; b < 3; b++) {
        if (b > 0 && !backends[b]) continue;
        if (backend_filter && strcmp(backend_filter, names[b])) continue;
        h.ops = backends[b];
        h.bname = names[b];
        for (size_t t = 0; t < sizeof op_tests / sizeof op_tests[0]; t++) {
            if (op_filter && !strstr(op_tests[t].name, op_filter)) continue;
            h.rng = seed_of(op_tests[t].name);
            op_tests[t].run(&h);
            reset(&h);
        }
        if (h.ops) {
            /* every buf_alloc/host buffer of the harness was freed: accounting is back to zero */
            checkf(&h, "buf_alloc/buf_free", (double)h.ctx.bytes_live_total, 0, "accounting balanced after frees");
        }
    }
    mt_ctx_free(&h.ctx);
    printf("test_ops: %d passed, %d failed, %d skipped\n", h.n_pass, n_fail, h.n_skip);
    return n_fail ? 1 : 0;
}
