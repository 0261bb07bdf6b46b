/*
 * test_attn_bf16.c — op harness of attention in precision=bf16 (mt_ops.h
 * attention_forward_bf16 / attention_backward_bf16): the cpu reference of
 * the mode, and with -b cuda the tensor-core kernels (attention_tc.cu; under
 * the CPU emulator in CI, tests/test_cuda_build.sh stage b3).
 *
 * Checks, per shape (GQA ratios 1, 2, 8; T a multiple of the 64-row tile,
 * not one, and below one; hd 64, 128, 40 (padded to 48) and 20 (no 16-byte
 * rows)):
 *   1. out, lse, dq, dk, dv against a double-precision reference of the
 *      exact math on the unrounded inputs, element by element within the
 *      first-order worst-case bound of the mode's roundings (derived in
 *      docs/cuda.md, "Attention on tensor cores"; computed here per element
 *      from the reference's own sums); reports the largest err / bound;
 *   2. bf16 really ran: out differs from the reference by more than fp32
 *      could (> 1e-5 of max|out|) somewhere;
 *   3. out_bf16 == bf16(out) bit for bit; a NULL out_bf16 is allowed;
 *   4. determinism: a second call gives the same bits (forward and backward);
 *   5. with -b cuda: the outputs equal the cpu reference of the mode within
 *      the same bound (both are rounded at the same points);
 *   6. with -b cuda, every shape runs under each kernel set (knob
 *      attn_kernel, set per instance): v1 (attention_tc.cu, wmma), v2
 *      (attention_v2.cu, mma.sync, one-pass online softmax: P rounded to
 *      bf16 before normalisation, O rescaled; the same bound holds, derived
 *      in docs/cuda.md) and v3 (v2 with 128 query rows a block in the
 *      forward and dQ kernels: v2's bits, checked bit for bit); the receipt
 *      counters say which ran: under v2 and v3, hd 64 and 128 count
 *      attention_v2_calls, other head dims count attention_v2_fallbacks (run
 *      by v1); under v1 neither moves.
 * Usage: test_attn_bf16 [-b cpu|cuda]; exits 1 if any check fails, 77 if the
 * backend is not available.
 */
#include "ops/mt_ops.h"
#include "core/mt_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mt_test.h"
#ifdef MT_WITH_CUDA
#include "ops/cuda/mt_ops_cuda.h"
#endif

static int g_pass = 0;
static const struct mt_ops_i *g_ops, *g_cpu;
static struct mt_ctx g_ctx;
static const char *g_kernel = "";  /* -b cuda: the attn_kernel under test, "v1" .. "v5" */

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static double nrand(void)
{
    double a[2];
    for (int t = 0; t < 2; t++) {
        g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
        a[t] = (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2.0 * log(a[0] + 1e-12)) * cos(6.283185307179586 * a[1]);
}

static void check(int ok, const char *what, const char *detail)
{
    printf("%s  %-58s %s\n", ok ? "ok  " : "FAIL", what, detail);
    if (ok) g_pass++; else n_fail++;
}

static void *xalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) { fprintf(stderr, "test_attn_bf16: out of memory\n"); exit(1); }
    return p;
}

/* device buffers of the backend under test */
static void *dev(const struct mt_ops_i *ops, size_t bytes)
{
    void *d = ops->buf_alloc(ops->be, &g_ctx, bytes ? bytes : 4, MT_BUCKET_OTHER);
    if (!d) { fprintf(stderr, "test_attn_bf16: buf_alloc failed\n"); exit(1); }
    return d;
}
static void *up(const struct mt_ops_i *ops, const void *h, size_t bytes)
{
    void *d = dev(ops, bytes);
    ops->copy_from_host(ops->be, d, h, bytes);
    return d;
}
static void down(const struct mt_ops_i *ops, void *h, const void *d, size_t bytes)
{
    ops->sync(ops->be);
    ops->copy_to_host(ops->be, h, d, bytes);
}

struct shape { int B, T, H, K, hd; };

/* the reference in double and the per-element bounds */
struct ref {
    double *out, *lse, *dq, *dk, *dv;
    double *b_out, *b_lse, *b_dq, *b_dk, *b_dv;
};

static const double U16 = 1.0 / 256.0;         /* bf16 unit roundoff 2^-8 */
static const double U32 = 1.0 / 16777216.0;    /* fp32 unit roundoff 2^-24 */

/* Forward and backward in double with the bound terms (docs/cuda.md):
 *   e_s  = (2u + (hd+2)u32) scale sum_d |q k|           (score error)
 *   e_lse = max_j e_s + (T+2) u32                          (forward)
 *   eps_p = e_s + e_lse + u + 4u32                         (bf16(p) relative)
 *   out: sum_j p |v| (eps_p + u + (T+2)u32)
 *   backward (out, lse given as fp32 values of the reference's):
 *   eps_p' = e_s + u32 (|lse| + 6); e_dp = (2u + (hd+2)u32) sum_d |dO v|
 *   e_D = (2u + (hd+2) u32) sum_d |dO out|      (D over bf16(dO), bf16(out))
 *   E_ds = scale p (eps_p' |dp - D| + e_dp + e_D) + u |ds| + 4u32 |ds|
 *   dq: sum_j (E_ds |k| + |ds| |k| (u + (T+2)u32)); dk likewise with q
 *   dv: sum_i p |dO| (eps_p' + 2u + (T+2)u32) */
static void reference(struct ref *r, const struct shape *s, const float *q, const float *k, const float *v,
                      const float *g)
{
    const int B = s->B, T = s->T, H = s->H, K = s->K, hd = s->hd, grp = H / K;
    const size_t qld = (size_t)H * hd, kld = (size_t)K * hd;
    const size_t nq = (size_t)B * T * qld, nk = (size_t)B * T * kld, nl = (size_t)B * H * T;
    const double scale = 1.0 / sqrt((double)hd), es_c = 2 * U16 + (hd + 2) * U32;
    r->out = xalloc(nq * 8); r->lse = xalloc(nl * 8); r->dq = xalloc(nq * 8); r->dk = xalloc(nk * 8);
    r->dv = xalloc(nk * 8); r->b_out = xalloc(nq * 8); r->b_lse = xalloc(nl * 8); r->b_dq = xalloc(nq * 8);
    r->b_dk = xalloc(nk * 8); r->b_dv = xalloc(nk * 8);
    double *sv = xalloc((size_t)T * 8), *es = xalloc((size_t)T * 8), *p = xalloc((size_t)T * 8);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t kb = (size_t)b * T * kld + (size_t)(h / grp) * hd;
            for (int i = 0; i < T; i++) {
                const size_t at = ((size_t)b * T + i) * qld + (size_t)h * hd, li = ((size_t)b * H + h) * T + i;
                double m = -INFINITY, emax = 0;
                for (int j = 0; j <= i; j++) {
                    double d = 0, a = 0;
                    for (int c = 0; c < hd; c++) {
                        d += (double)q[at + c] * k[kb + (size_t)j * kld + c];
                        a += fabs((double)q[at + c] * k[kb + (size_t)j * kld + c]);
                    }
                    sv[j] = d * scale;
                    es[j] = es_c * scale * a;
                    if (sv[j] > m) m = sv[j];
                    if (es[j] > emax) emax = es[j];
                }
                double l = 0;
                for (int j = 0; j <= i; j++) l += exp(sv[j] - m);
                const double L = m + log(l), e_lse = emax + (T + 2) * U32;
                r->lse[li] = L;
                r->b_lse[li] = e_lse + 4 * U32 * fabs(L);
                for (int j = 0; j <= i; j++) p[j] = exp(sv[j] - L);
                for (int c = 0; c < hd; c++) {
                    double o = 0, bo = 0;
                    for (int j = 0; j <= i; j++) {
                        const double vv = v[kb + (size_t)j * kld + c];
                        o += p[j] * vv;
                        bo += p[j] * fabs(vv) * (es[j] + e_lse + 2 * U16 + (T + 6) * U32);
                    }
                    r->out[at + c] = o;
                    r->b_out[at + c] = bo;
                }
            }
        }
    /* backward with out and lse as the fp32 values the kernel receives */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t kb = (size_t)b * T * kld + (size_t)(h / grp) * hd;
            for (int i = 0; i < T; i++) {
                const size_t at = ((size_t)b * T + i) * qld + (size_t)h * hd, li = ((size_t)b * H + h) * T + i;
                const double L = (float)r->lse[li];
                double D = 0, eD = 0;
                for (int c = 0; c < hd; c++) {
                    const double o = (float)r->out[at + c];
                    D += (double)g[at + c] * o;
                    eD += fabs((double)g[at + c] * o);
                }
                eD *= 2 * U16 + (hd + 2) * U32;
                for (int j = 0; j <= i; j++) {
                    const size_t kj = kb + (size_t)j * kld;
                    double sd = 0, a = 0, dp = 0, adp = 0;
                    for (int c = 0; c < hd; c++) {
                        sd += (double)q[at + c] * k[kj + c];
                        a += fabs((double)q[at + c] * k[kj + c]);
                        dp += (double)g[at + c] * v[kj + c];
                        adp += fabs((double)g[at + c] * v[kj + c]);
                    }
                    const double pij = exp(sd * scale - L);
                    const double eps_p = es_c * scale * a + U32 * (fabs(L) + 6);
                    const double ds = scale * pij * (dp - D);
                    const double E_ds = scale * pij * (eps_p * fabs(dp - D) + es_c * adp + eD) +
                                        (U16 + 4 * U32) * fabs(ds);
                    for (int c = 0; c < hd; c++) {
                        const double kk = k[kj + c], qq = q[at + c], gg = g[at + c];
                        r->dq[at + c] += ds * kk;
                        r->b_dq[at + c] += E_ds * fabs(kk) + fabs(ds * kk) * (U16 + (T + 2) * U32);
                        r->dk[kj + c] += ds * qq;
                        r->b_dk[kj + c] += E_ds * fabs(qq) + fabs(ds * qq) * (U16 + (T * grp + 2) * U32);
                        r->dv[kj + c] += pij * gg;
                        r->b_dv[kj + c] += pij * fabs(gg) * (eps_p + 2 * U16 + (T * grp + 6) * U32);
                    }
                }
            }
        }
    free(sv); free(es); free(p);
}

static void ref_free(struct ref *r)
{
    free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv);
    free(r->b_out); free(r->b_lse); free(r->b_dq); free(r->b_dk); free(r->b_dv);
}

/* worst err / bound over n elements (err = |got - want|); bound floor:
 * 1e-30; a non-finite output is an infinite ratio */
static double worst_ratio(const float *got, const double *want, const double *bound, size_t n, double slack)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = fabs((double)got[i] - want[i]) / (slack * bound[i] + 1e-30);
        if (e > w) w = e;
    }
    return w;
}

struct outs {
    float *out, *lse, *dq, *dk, *dv;
    uint16_t *outb, *dvb, *dqb, *dkb;
    int dvb_same_dqdk, outnull_same, dvb_ld_ok;
};

/* How run() hands the entries their qkv_b (mt_ops.h): none (the backend
 * stages q, k, v itself both times), a buffer, or a buffer with the fp32 q,
 * k, v overwritten between the forward and the backward (a backend that keeps
 * its rounded operands there must not read them again) */
enum qkvb_mode { QKVB_NONE, QKVB_SAVED, QKVB_SAVED_POISONED, QKVB_GIVEN };
/* QKVB_GIVEN: q, k, v rounded into qkv_b beforehand (cast_bf16, as their
 * producers would) and passed as NULL to both entries */

/* one forward + backward on `ops`, results on the host */
static void run_qkvb(const struct mt_ops_i *ops, const struct shape *s, const float *q, const float *k,
                     const float *v, const float *g, const float *out_in, const float *lse_in, struct outs *o,
                     enum qkvb_mode mode)
{
    const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->K * s->hd;
    const size_t nl = (size_t)s->B * s->H * s->T;
    float *dq_ = up(ops, q, nq * 4), *dk_ = up(ops, k, nk * 4), *dv_ = up(ops, v, nk * 4), *dg = up(ops, g, nq * 4);
    float *dout = dev(ops, nq * 4), *dlse = dev(ops, nl * 4);
    uint16_t *doutb = dev(ops, nq * 2), *qkvb = mode == QKVB_NONE ? NULL : dev(ops, (nq + 2 * nk) * 2);
    const int given = mode == QKVB_GIVEN;
    if (given) {
        ops->cast_bf16(ops->be, qkvb, dq_, nq);
        ops->cast_bf16(ops->be, qkvb + nq, dk_, nk);
        ops->cast_bf16(ops->be, qkvb + nq + nk, dv_, nk);
    }
    const float *qa = given ? NULL : dq_, *ka = given ? NULL : dk_, *va = given ? NULL : dv_;
    ops->attention_forward_bf16(ops->be, dout, doutb, dlse, qa, ka, va, s->B, s->T, s->H, s->K, s->hd, qkvb);
    o->out = xalloc(nq * 4); o->lse = xalloc(nl * 4); o->outb = xalloc(nq * 2);
    down(ops, o->out, dout, nq * 4); down(ops, o->lse, dlse, nl * 4); down(ops, o->outb, doutb, nq * 2);
    {   /* out NULL: out_bf16 alone, the same bits (and lse) */
        uint16_t *ob2 = dev(ops, nq * 2), *h2 = xalloc(nq * 2);
        float *l2 = dev(ops, nl * 4), *hl = xalloc(nl * 4);
        ops->attention_forward_bf16(ops->be, NULL, ob2, l2, qa, ka, va, s->B, s->T, s->H, s->K, s->hd, qkvb);
        down(ops, h2, ob2, nq * 2); down(ops, hl, l2, nl * 4);
        o->outnull_same = !memcmp(h2, o->outb, nq * 2) && !memcmp(hl, o->lse, nl * 4);
        free(h2); free(hl);
        ops->buf_free(ops->be, &g_ctx, ob2); ops->buf_free(ops->be, &g_ctx, l2);
    }
    if (mode == QKVB_SAVED_POISONED) {
        ops->fill(ops->be, dq_, 1e3f, nq);
        ops->fill(ops->be, dk_, -1e3f, nk);
        ops->fill(ops->be, dv_, 7.0f, nk);
    }
    /* backward from the reference's out and lse (fp32), so its bound is the backward's own */
    float *oin = up(ops, out_in, nq * 4), *lin = up(ops, lse_in, nl * 4);
    float *gq = dev(ops, nq * 4), *gk = dev(ops, nk * 4), *gv = dev(ops, nk * 4);
    ops->attention_backward_bf16(ops->be, gq, gk, gv, dg, qa, ka, va, oin, lin, s->B, s->T, s->H, s->K, s->hd, qkvb,
                                 NULL, NULL, NULL, NULL, NULL, 0);
    o->dq = xalloc(nq * 4); o->dk = xalloc(nk * 4); o->dv = xalloc(nk * 4);
    down(ops, o->dq, gq, nq * 4); down(ops, o->dk, gk, nk * 4); down(ops, o->dv, gv, nk * 4);
    /* again with dv_b (dv as bf16 only, gv2 scratch) and dout, out given as bf16 only
     * (dout_b, out_b: rounded as their producers would): dq and dk the same bits */
    float *gq2 = dev(ops, nq * 4), *gk2 = dev(ops, nk * 4), *gv2 = dev(ops, nk * 4);
    uint16_t *dvb = dev(ops, nk * 2), *gb = dev(ops, nq * 2), *ob = dev(ops, nq * 2);
    ops->cast_bf16(ops->be, gb, dg, nq);
    ops->cast_bf16(ops->be, ob, oin, nq);
    ops->attention_backward_bf16(ops->be, gq2, gk2, gv2, NULL, qa, ka, va, NULL, lin, s->B, s->T, s->H, s->K, s->hd,
                                 qkvb, dvb, gb, ob, NULL, NULL, 0);
    o->dvb = xalloc(nk * 2);
    down(ops, o->dvb, dvb, nk * 2);
    float *hq = xalloc(nq * 4), *hk = xalloc(nk * 4);
    down(ops, hq, gq2, nq * 4); down(ops, hk, gk2, nk * 4);
    o->dvb_same_dqdk = !memcmp(hq, o->dq, nq * 4) && !memcmp(hk, o->dk, nk * 4);
    free(hq); free(hk);
    /* and with dq_b, dk_b too (dq, dk as bf16 only; gq2, gk2 scratch, poisoned first) */
    uint16_t *dqb = dev(ops, nq * 2), *dkb = dev(ops, nk * 2);
    ops->fill(ops->be, gq2, NAN, nq);
    ops->fill(ops->be, gk2, NAN, nk);
    ops->attention_backward_bf16(ops->be, gq2, gk2, gv2, NULL, qa, ka, va, NULL, lin, s->B, s->T, s->H, s->K, s->hd,
                                 qkvb, dvb, gb, ob, dqb, dkb, 0);
    o->dqb = xalloc(nq * 2); o->dkb = xalloc(nk * 2);
    down(ops, o->dqb, dqb, nq * 2); down(ops, o->dkb, dkb, nk * 2);
    {   /* dv_b's rows ldv_b apart (the merged q/k/v backward's operand): each row as the
         * dense dv_b's, the elements between rows untouched (a sentinel) */
        const size_t rows = (size_t)s->B * s->T, w = (size_t)s->K * s->hd, ld = w + 6;
        uint16_t *h = xalloc(rows * ld * 2);
        for (size_t i = 0; i < rows * ld; i++) h[i] = 0x1234;
        uint16_t *sb = up(ops, h, rows * ld * 2);
        ops->attention_backward_bf16(ops->be, gq2, gk2, gv2, NULL, qa, ka, va, NULL, lin, s->B, s->T, s->H, s->K,
                                     s->hd, qkvb, sb, gb, ob, dqb, dkb, (int)ld);
        down(ops, h, sb, rows * ld * 2);
        int ok = 1;
        for (size_t r = 0; r < rows; r++) {
            ok &= !memcmp(h + r * ld, o->dvb + r * w, w * 2);
            for (size_t c = w; c < ld; c++) ok &= h[r * ld + c] == 0x1234;
        }
        o->dvb_ld_ok = ok;
        free(h);
        ops->buf_free(ops->be, &g_ctx, sb);
    }
    void *bufs[] = {dq_, dk_, dv_, dg, dout, dlse, doutb, oin, lin, gq, gk, gv, qkvb, gq2, gk2, gv2, dvb, gb, ob, dqb, dkb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) ops->buf_free(ops->be, &g_ctx, bufs[i]);
}

static void run(const struct mt_ops_i *ops, const struct shape *s, const float *q, const float *k, const float *v,
                const float *g, const float *out_in, const float *lse_in, struct outs *o)
{
    run_qkvb(ops, s, q, k, v, g, out_in, lse_in, o, QKVB_NONE);
}

static void outs_free(struct outs *o)
{
    free(o->out); free(o->lse); free(o->dq); free(o->dk); free(o->dv); free(o->outb); free(o->dvb); free(o->dqb); free(o->dkb);
}

/* b[i] == bf16(x[i]) for every i, nearest even (the values here are finite) */
static int bf16_of(const uint16_t *b, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if (b[i] != (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)) return 0;
    }
    return 1;
}

static int same_bits(const struct outs *a, const struct outs *b, const struct shape *s)
{
    const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->K * s->hd;
    const size_t nl = (size_t)s->B * s->H * s->T;
    return !memcmp(a->out, b->out, nq * 4) && !memcmp(a->lse, b->lse, nl * 4) && !memcmp(a->dq, b->dq, nq * 4) &&
           !memcmp(a->dk, b->dk, nk * 4) && !memcmp(a->dv, b->dv, nk * 4) && !memcmp(a->outb, b->outb, nq * 2);
}

/* every output within slack x its bound of the reference; returns the worst ratio */
static double vs_bound(const struct outs *o, const struct ref *r, const struct shape *s, double slack, char *why,
                       size_t len)
{
    const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->K * s->hd;
    const size_t nl = (size_t)s->B * s->H * s->T;
    double w[5] = {worst_ratio(o->out, r->out, r->b_out, nq, slack), worst_ratio(o->lse, r->lse, r->b_lse, nl, slack),
                   worst_ratio(o->dq, r->dq, r->b_dq, nq, slack), worst_ratio(o->dk, r->dk, r->b_dk, nk, slack),
                   worst_ratio(o->dv, r->dv, r->b_dv, nk, slack)};
    double m = 0;
    for (int i = 0; i < 5; i++) if (w[i] > m) m = w[i];
    snprintf(why, len, "err/bound out %.3f lse %.3f dq %.3f dk %.3f dv %.3f", w[0], w[1], w[2], w[3], w[4]);
    return m;
}

/* hd 136: no tensor-core tiles (cuda runs the fp32 kernels, counted); with q, k,
 * v given as NULL in qkv_b the entries widen them first: finite, and within
 * 2e-2 of max|x| of the run on the fp32 operands (those are not rounded there);
 * on cpu the same bits */
static void test_given_fallback(void)
{
    const struct shape sh = {1, 24, 2, 1, 136}, *s = &sh;
    const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->K * s->hd;
    const size_t nl = (size_t)s->B * s->H * s->T;
    float *q = xalloc(nq * 4), *k = xalloc(nk * 4), *v = xalloc(nk * 4), *g = xalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) q[i] = (float)nrand(), g[i] = (float)nrand();
    for (size_t i = 0; i < nk; i++) k[i] = (float)nrand(), v[i] = (float)nrand();
    float *out_in = xalloc(nq * 4), *lse_in = xalloc(nl * 4);
    {   /* a forward on the fp32 operands gives the backward's out and lse */
        float *dq_ = up(g_ops, q, nq * 4), *dk_ = up(g_ops, k, nk * 4), *dv_ = up(g_ops, v, nk * 4);
        float *o = dev(g_ops, nq * 4), *l = dev(g_ops, nl * 4);
        g_ops->attention_forward_bf16(g_ops->be, o, NULL, l, dq_, dk_, dv_, s->B, s->T, s->H, s->K, s->hd, NULL);
        down(g_ops, out_in, o, nq * 4);
        down(g_ops, lse_in, l, nl * 4);
        void *bufs[] = {dq_, dk_, dv_, o, l};
        for (size_t i = 0; i < 5; i++) g_ops->buf_free(g_ops->be, &g_ctx, bufs[i]);
    }
    struct outs a, b;
    run_qkvb(g_ops, s, q, k, v, g, out_in, lse_in, &a, QKVB_NONE);
    run_qkvb(g_ops, s, q, k, v, g, out_in, lse_in, &b, QKVB_GIVEN);
    double worst = 0, mx = 0;
    int finite = 1;
    const float *pa[4] = {a.out, a.dq, a.dk, a.dv}, *pb[4] = {b.out, b.dq, b.dk, b.dv};
    const size_t n[4] = {nq, nq, nk, nk};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < n[t]; i++) {
            finite &= isfinite(pb[t][i]) != 0;
            if (fabs(pa[t][i]) > mx) mx = fabs(pa[t][i]);
            if (fabs(pa[t][i] - pb[t][i]) > worst) worst = fabs(pa[t][i] - pb[t][i]);
        }
    char why[96];
    snprintf(why, sizeof why, "max diff %.3g, max|x| %.3g", worst, mx);
    check(a.dvb_ld_ok && b.dvb_ld_ok, "hd 136: dv_b's rows ldv_b apart (the fallback's cast)", "");
    if (g_ops == g_cpu)
        check(same_bits(&a, &b, s), "cpu hd 136: q, k, v NULL in qkv_b: the same bits", why);
    else
        check(finite && worst <= 2e-2 * mx, "cuda hd 136 (fp32 fallback): q, k, v NULL in qkv_b, widened", why);
    outs_free(&a);
    outs_free(&b);
    free(q); free(k); free(v); free(g); free(out_in); free(lse_in);
}

static void test_shape(const struct shape *s)
{
    const size_t nq = (size_t)s->B * s->T * s->H * s->hd, nk = (size_t)s->B * s->T * s->K * s->hd;
    const size_t nl = (size_t)s->B * s->H * s->T;
    float *q = xalloc(nq * 4), *k = xalloc(nk * 4), *v = xalloc(nk * 4), *g = xalloc(nq * 4);
    /* QK-normed heads have entries ~1: scores of a few units, peaked rows */
    for (size_t i = 0; i < nq; i++) { q[i] = (float)(1.5 * nrand()); g[i] = (float)nrand(); }
    for (size_t i = 0; i < nk; i++) { k[i] = (float)(1.5 * nrand()); v[i] = (float)nrand(); }
    struct ref r;
    reference(&r, s, q, k, v, g);
    float *out_in = xalloc(nq * 4), *lse_in = xalloc(nl * 4);
    for (size_t i = 0; i < nq; i++) out_in[i] = (float)r.out[i];
    for (size_t i = 0; i < nl; i++) lse_in[i] = (float)r.lse[i];

    char name[96], why[200];
    snprintf(name, sizeof name, "%s%s%s%s B%d T%d H%d K%d hd%d", g_ops->name, *g_kernel ? "[" : "", g_kernel,
             *g_kernel ? "]" : "", s->B, s->T, s->H, s->K, s->hd);
    struct outs a, b;
#ifdef MT_WITH_CUDA
    struct mt_ops_cuda_info i0, i1;
    if (*g_kernel) mt_ops_cuda_get_info_of(g_ops->be, &i0);
#endif
    run(g_ops, s, q, k, v, g, out_in, lse_in, &a);
    double worst = vs_bound(&a, &r, s, 1.0, why, sizeof why);
    char what[160];
    snprintf(what, sizeof what, "%s: within the bf16 bound", name);
    check(worst <= 1.0, what, why);

    double maxo = 0, maxe = 0;
    for (size_t i = 0; i < nq; i++) {
        if (fabs(r.out[i]) > maxo) maxo = fabs(r.out[i]);
        if (fabs(a.out[i] - r.out[i]) > maxe) maxe = fabs(a.out[i] - r.out[i]);
    }
    snprintf(what, sizeof what, "%s: bf16 ran (out err > 1e-5 max|out|)", name);
    snprintf(why, sizeof why, "max err %.3g, max|out| %.3g", maxe, maxo);
    check(maxe > 1e-5 * maxo, what, why);

    snprintf(what, sizeof what, "%s: out_bf16 == bf16(out)", name);
    check(bf16_of(a.outb, a.out, nq), what, "");
    snprintf(what, sizeof what, "%s: out NULL: the same out_bf16 and lse (bits)", name);
    check(a.outnull_same, what, "");
    /* dv_b: dv stored as bf16 only = bf16 of the fp32 dv, dq and dk unchanged */
    const int dvb = a.dvb_same_dqdk && bf16_of(a.dvb, a.dv, nk);
    snprintf(what, sizeof what, "%s: dv_b == bf16(dv); dout, out as bf16: dq, dk the same bits", name);
    snprintf(why, sizeof why, "dq, dk same: %d", a.dvb_same_dqdk);
    check(dvb, what, why);
    /* dq_b, dk_b: dq, dk stored as bf16 only = bf16 of the fp32 dq, dk */
    snprintf(what, sizeof what, "%s: dq_b == bf16(dq), dk_b == bf16(dk)", name);
    check(bf16_of(a.dqb, a.dq, nq) && bf16_of(a.dkb, a.dk, nk), what, "");
    snprintf(what, sizeof what, "%s: dv_b rows ldv_b apart, gaps unwritten", name);
    check(a.dvb_ld_ok, what, "");

    run(g_ops, s, q, k, v, g, out_in, lse_in, &b);
    snprintf(what, sizeof what, "%s: deterministic (second call, same bits)", name);
    check(same_bits(&a, &b, s), what, "");
    outs_free(&b);

#ifdef MT_WITH_CUDA
    if (*g_kernel) {  /* four forward (each run's second with out NULL) and eight backward calls (each run's
                       * second with dv_b, dout_b, out_b, its third with dq_b, dk_b too, its fourth with dv_b's
                       * rows apart): which kernels ran them */
        mt_ops_cuda_get_info_of(g_ops->be, &i1);
        const long dv2 = i1.attention_v2_calls - i0.attention_v2_calls;
        const long dfb = i1.attention_v2_fallbacks - i0.attention_v2_fallbacks;
        const int v2_hd = s->hd == 64 || s->hd == 128;
        const int v2_set = strcmp(g_kernel, "v1") != 0;  /* v2 .. v5: attention_v2.cu (v4, v5: _wg.cu) */
        const int want_v2 = v2_set && v2_hd;
        const int ok = !strcmp(i1.attn_kernel, g_kernel) && dv2 == (want_v2 ? 12 : 0) &&
                       dfb == (v2_set && !v2_hd ? 12 : 0) && (dfb == 0 || i1.attention_v2_fallback_hd == s->hd);
        snprintf(what, sizeof what, "%s: ran %s", name, want_v2 ? g_kernel : v2_set ? "v1 (v2 fallback, counted)" : "v1");
        snprintf(why, sizeof why, "attn_kernel %s, +%ld v2 calls, +%ld v2 fallbacks (hd %d)", i1.attn_kernel, dv2,
                 dfb, i1.attention_v2_fallback_hd);
        check(ok, what, why);
        /* v3: 128 query rows a block, each row's tiles, order and operations as v2. v4 (the
         * forward on wgmma, the backward v3's): under the emulator its products add their
         * terms in v2's order (the emulated wgmma, like the emulated mma.sync, sums a k-step's
         * 16 in order onto C), so every other operation being v2's gives v2's bits; a GPU's
         * wgmma sums in its own order: the bound above is the check there. v5 (v4 reading its
         * transposed operands MN-major) the same */
        const int wg = !strcmp(g_kernel, "v4") || !strcmp(g_kernel, "v5");
        if (!strcmp(g_kernel, "v3") || (wg && i1.emulated && want_v2)) {
            struct outs c2;
            mt_ops_cuda_set_attn_kernel_of(g_ops->be, "v2");
            run(g_ops, s, q, k, v, g, out_in, lse_in, &c2);
            mt_ops_cuda_set_attn_kernel_of(g_ops->be, g_kernel);
            snprintf(what, sizeof what, "%s: %s == v2 bit for bit (out, lse, dq, dk, dv)%s", name, g_kernel,
                     wg ? " under the emulator" : "");
            check(same_bits(&a, &c2, s), what, "");
            outs_free(&c2);
        }
    }
#endif

    /* qkv_b given: the same bits; on cuda (which keeps its rounded q, k, v there)
     * also with the fp32 q, k, v overwritten before the backward */
    run_qkvb(g_ops, s, q, k, v, g, out_in, lse_in, &b, QKVB_SAVED);
    snprintf(what, sizeof what, "%s: qkv_b given: the same bits", name);
    check(same_bits(&a, &b, s), what, "");
    outs_free(&b);
    run_qkvb(g_ops, s, q, k, v, g, out_in, lse_in, &b, QKVB_GIVEN);
    snprintf(what, sizeof what, "%s: q, k, v NULL, rounded in qkv_b beforehand: the same bits", name);
    check(same_bits(&a, &b, s), what, "");
    outs_free(&b);
    if (g_ops != g_cpu && s->hd % 8 == 0) {   /* cuda keeps them for 16-byte rows (hd % 8 == 0) */
        run_qkvb(g_ops, s, q, k, v, g, out_in, lse_in, &b, QKVB_SAVED_POISONED);
        snprintf(what, sizeof what, "%s: qkv_b: backward reads the saved q, k, v", name);
        check(same_bits(&a, &b, s), what, "");
        outs_free(&b);
    }


    if (g_ops != g_cpu) {
        struct outs c;
        run(g_cpu, s, q, k, v, g, out_in, lse_in, &c);
        /* cpu twin vs this backend: the same roundings, so well inside one bound */
        struct ref rc = r;
        rc.out = xalloc(nq * 8); rc.lse = xalloc(nl * 8); rc.dq = xalloc(nq * 8);
        rc.dk = xalloc(nk * 8); rc.dv = xalloc(nk * 8);
        for (size_t i = 0; i < nq; i++) { rc.out[i] = c.out[i]; rc.dq[i] = c.dq[i]; }
        for (size_t i = 0; i < nk; i++) { rc.dk[i] = c.dk[i]; rc.dv[i] = c.dv[i]; }
        for (size_t i = 0; i < nl; i++) rc.lse[i] = c.lse[i];
        worst = vs_bound(&a, &rc, s, 1.0, why, sizeof why);
        snprintf(what, sizeof what, "%s: == cpu reference of the mode within the bound", name);
        check(worst <= 1.0, what, why);
        free(rc.out); free(rc.lse); free(rc.dq); free(rc.dk); free(rc.dv);
        outs_free(&c);
    }
    outs_free(&a);
    ref_free(&r);
    free(q); free(k); free(v); free(g); free(out_in); free(lse_in);
}

int main(int argc, char **argv)
{
    const char *backend = "cpu", *only = NULL;   /* -k: one kernel set of the cuda backend (a rerun, a plant) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-b") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "-k") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "usage: test_attn_bf16 [-b cpu|cuda] [-k v1|v2|v3|v4|v5]\n"); return 2; }
    }
    /* line-buffered: a run that crashes on a GPU keeps every line before the crash in its
     * log, and the "# attn_kernel" line names the kernel set it was in (bench/gpu_fallbacks.py) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    mt_ctx_init(&g_ctx);
    g_cpu = mt_ops_cpu();
    if (!strcmp(backend, "cpu")) g_ops = g_cpu;
    else if (!strcmp(backend, "cuda")) {
        char why[256];
        g_ops = mt_ops_cuda(why, sizeof why);
        if (!g_ops) { printf("SKIPPED (cuda backend: %s)\n", why); return 77; }
    } else { fprintf(stderr, "test_attn_bf16: unknown backend %s\n", backend); return 2; }
    if (!g_ops->attention_forward_bf16 || !g_ops->attention_backward_bf16) {
        printf("FAIL %s backend has no attention_*_bf16 entries\n", g_ops->name);
        return 1;
    }
    const struct shape shapes[] = {
        {2, 100, 4, 4, 64},   /* GQA 1, T = 64 + 36: a partial tile */
        {1, 130, 4, 2, 128},  /* GQA 2, hd 128, three tiles (the last of 2 rows) */
        {1, 64, 8, 1, 64},    /* GQA 8, exactly one tile */
        {1, 37, 2, 1, 40},    /* hd 40: padded to 48 in the tiles; T below one tile */
        {1, 50, 2, 2, 20},    /* hd 20: rows not 16-byte multiples (scalar loads) */
        {1, 200, 8, 1, 128},  /* GQA 8, hd 128, four tiles (the last of 8 rows) */
        {1, 257, 2, 2, 64},   /* five tiles, the last of one row */
    };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    if (g_ops == g_cpu) {
        (void)only;   /* the kernel sets are the cuda backend's */
        for (size_t i = 0; i < n_shapes; i++) test_shape(&shapes[i]);
    } else {
#ifdef MT_WITH_CUDA
        /* each kernel set of the instance (knob attn_kernel): v1, v2, v3 (the default), then
         * v4 and v5 (wgmma, new: a failure there cannot mask the sets before it) */
        const char *kernels[] = {"v1", "v2", "v3", "v4", "v5"};
        for (int kk = 0; kk < 5; kk++) {
            g_kernel = kernels[kk];
            if (only && strcmp(only, g_kernel)) continue;
            printf("# attn_kernel %s\n", g_kernel);
            const enum mt_status st = mt_ops_cuda_set_attn_kernel_of(g_ops->be, g_kernel);
            if (st == MT_ERR_UNSUPPORTED && kk >= 3) {   /* wgmma: sm_90a code on an sm_90 device */
                printf("SKIPPED (attn_kernel %s: wgmma does not run here)\n", g_kernel);
                continue;
            }
            if (st != MT_OK) {
                printf("FAIL mt_ops_cuda_set_attn_kernel_of(%s)\n", g_kernel);
                return 1;
            }
            for (size_t i = 0; i < n_shapes; i++) test_shape(&shapes[i]);
        }
        check(mt_ops_cuda_set_attn_kernel_of(g_ops->be, "v6") == MT_ERR_INVALID_ARG, "attn_kernel=v6 refused", "");
#endif
    }
    test_given_fallback();
    printf("test_attn_bf16: %d passed, %d failed\n", g_pass, n_fail);
    return n_fail ? 1 : 0;
}
