/*
 * cuda_ops_vs_cpu.c — every entry of the cuda ops table against the cpu
 * table (the reference), on the same random fp32 inputs.
 *
 * For each op and case: inputs come from a seeded generator; the op runs on
 * the cpu backend (pass 0) and twice on the cuda backend (passes 1 and 2),
 * each pass on freshly uploaded buffers. Checks, one line each:
 *   - cuda vs cpu: max_i |cuda_i - cpu_i| / max_i |cpu_i| <= 1e-5 ("relative
 *     to scale"; integer outputs must match exactly);
 *   - determinism: pass 1 and pass 2 give identical bits;
 *   - the (=) / (+=) rule: outputs that are overwritten are pre-filled with
 *     NaN (a kernel that reads them fails the comparison), outputs that
 *     accumulate are pre-filled with the same random values on both backends;
 *   - the in-place variants mt_ops.h allows (rope, swiglu backward, xent
 *     backward, muon's d == g);
 *   - buf_alloc/buf_free accounting on the ctx buckets, zero fill, the
 *     injected allocation failure, and that no CUDA error was recorded.
 * Every entry the cpu table fills must be non-NULL in the cuda table.
 *
 * All of the above runs in fp32 mode (mt_ops_cuda_set_precision(FP32),
 * whatever MT_CUDA_PRECISION says). Then the bf16 section switches the table
 * to bf16 and checks gemm — the only entry precision changes — element by
 * element against the cpu fp32 result with the bound derived in
 * docs/cuda.md ("bf16 mode"):
 *     |gpu_ij - cpu_ij| <= |alpha| (BF16_C u S_ij + 2 K 2^-24 T_ij) + 2^-22 |beta c_ij|
 *     u = 2^-8, S_ij = sqrt(sum_k (a_ik b_kj)^2), T_ij = sum_k |a_ik b_kj|,
 * reported as max_ij err_ij / bound_ij (must be <= 1); that bf16 really
 * ran (a large-K case must NOT meet the fp32 tolerance); determinism; the
 * unaligned-C, transposed, padded, K = 0 / alpha = 0 cases; shapes whose
 * operand copies exceed MT_CUDA_BF16_SCRATCH_MB when it is set small (tiles);
 * and the precision query / setter.
 *
 * Exit status: 0 when every check passes; 77 (ctest's skip code) with
 * "SKIPPED (no GPU: ...)" when mt_ops_cuda() returns NULL (no device, or no
 * driver); 1 on any failure.
 * Usage: cuda_ops_vs_cpu [-o OP_SUBSTRING]
 */
#define _POSIX_C_SOURCE 200809L   /* setenv (the init group's emulated libm) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_knobs.h"
#include "core/mt_rng.h"
#include "ops/mt_ops.h"
#include "ops/cuda/mt_ops_cuda.h"

#define TOL      1e-5
#define MAX_BUFS 128   /* a test's buffers on one backend between two release() calls */
/* bf16 bound (docs/cuda.md): unit roundoff of bf16 and the constant on the
 * random-sign (sqrt) term */
#define BF16_U   0x1.0p-8
#define BF16_C   6.0

struct be {
    const struct mt_ops_i *ops;
    const char            *name;
    struct mt_ctx          ctx;
    void                  *bufs[MAX_BUFS];
    int                    nbufs;
};

static struct be   g_be[2];      /* 0 cpu, 1 cuda */
static const char *g_filter;
static int         g_pass, g_fail;
static uint64_t    g_rng;

/* ---- random numbers ---- */
static uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }
static int    irand(int n) { return (int)(next_u64() % (uint64_t)n); }

static void *xmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "cuda_ops_vs_cpu: out of host memory\n");
        exit(2);
    }
    return p;
}
static float *rnd(size_t n, double lo, double hi)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}
static float *nans(size_t n)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* ---- backend buffers ---- */
static void *dalloc(struct be *b, size_t bytes)
{
    void *p = b->ops->buf_alloc(b->ops->be, &b->ctx, bytes ? bytes : 4, MT_BUCKET_ACTS);
    if (!p || b->nbufs == MAX_BUFS) {
        fprintf(stderr, "cuda_ops_vs_cpu: %s buf_alloc(%zu) failed: %s\n", b->name, bytes,
                mt_ctx_last_error(&b->ctx));
        exit(2);
    }
    b->bufs[b->nbufs++] = p;
    return p;
}
static float *upf(struct be *b, const float *x, size_t n)
{
    float *p = dalloc(b, n * sizeof(float));
    if (n) b->ops->copy_from_host(b->ops->be, p, x, n * sizeof(float));
    return p;
}
static int32_t *upi(struct be *b, const int32_t *x, size_t n)
{
    int32_t *p = dalloc(b, n * sizeof(int32_t));
    if (n) b->ops->copy_from_host(b->ops->be, p, x, n * sizeof(int32_t));
    return p;
}
/* host copy of n floats of d (malloc'd; the caller frees) */
static float *downf(struct be *b, const float *d, size_t n)
{
    float *x = xmalloc(n * sizeof(float));
    b->ops->sync(b->ops->be);
    if (n) b->ops->copy_to_host(b->ops->be, x, d, n * sizeof(float));
    return x;
}
static int32_t *downi(struct be *b, const int32_t *d, size_t n)
{
    int32_t *x = xmalloc(n * sizeof(int32_t));
    b->ops->sync(b->ops->be);
    if (n) b->ops->copy_to_host(b->ops->be, x, d, n * sizeof(int32_t));
    return x;
}
static void release(struct be *b)
{
    for (int i = 0; i < b->nbufs; i++) b->ops->buf_free(b->ops->be, &b->ctx, b->bufs[i]);
    b->nbufs = 0;
}

/* ---- reporting ---- */
static void report(const char *op, const char *what, double err, double tol)
{
    int ok = err <= tol;  /* NaN fails */
    printf("cuda  %-22s %-52s %10.3e %8.1e  %s\n", op, what, err, tol, ok ? "PASS" : "FAIL");
    if (ok) g_pass++;
    else g_fail++;
}
static double rel_err(const float *got, const float *ref, size_t n)
{
    double scale = 0.0, e = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)ref[i]) > scale) scale = fabs((double)ref[i]);
    if (scale == 0.0) scale = 1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!isfinite(d)) return INFINITY;
        if (d > e) e = d;
    }
    return e / scale;
}
static size_t ndiff(const void *a, const void *b, size_t n4)
{
    size_t c = 0;
    for (size_t i = 0; i < n4; i++) c += memcmp((const char *)a + 4 * i, (const char *)b + 4 * i, 4) != 0;
    return c;
}
/* compare the three passes of one float output: cuda vs cpu, cuda twice; frees them */
static void check3(const char *op, const char *what, float *r[3], size_t n)
{
    char w[160];
    report(op, what, rel_err(r[1], r[0], n), TOL);
    snprintf(w, sizeof w, "%s: deterministic (differing elements)", what);
    report(op, w, (double)ndiff(r[1], r[2], n), 0);
    for (int p = 0; p < 3; p++) free(r[p]);
}
static void check3i(const char *op, const char *what, int32_t *r[3], size_t n)
{
    char w[160];
    snprintf(w, sizeof w, "%s (differing elements)", what);
    report(op, w, (double)ndiff(r[1], r[0], n), 0);
    snprintf(w, sizeof w, "%s: deterministic (differing elements)", what);
    report(op, w, (double)ndiff(r[1], r[2], n), 0);
    for (int p = 0; p < 3; p++) free(r[p]);
}
/* A group of checks: its seed, after its marker line. A run that crashes or
 * hangs (a stage box ends it) names the group it was in: its last "# group"
 * line (stdout is line-buffered; bench/gpu_fallbacks.py reads it). */
#define RUN(seed, call)                    \
    do {                                   \
        printf("# group %s\n", #call);     \
        g_rng = (seed);                    \
        call;                              \
    } while (0)

static int selected(const char *op)
{
    return !g_filter || strstr(op, g_filter);
}
#define BE(pass) (&g_be[(pass) == 0 ? 0 : 1])

/* ---- table completeness ---- */
static void test_table(void)
{
    const struct mt_ops_i *c = g_be[0].ops, *g = g_be[1].ops;
    struct { const char *name; int cpu, cuda; } e[] = {
#define E(f) { #f, c->f != NULL, g->f != NULL }
        E(buf_alloc), E(buf_free), E(copy_to_host), E(copy_from_host), E(copy), E(sync),
        E(fill), E(axpby), E(sumsq), E(all_finite), E(gemm), E(embed_forward), E(embed_backward),
        E(rmsnorm_forward), E(rmsnorm_backward), E(rope_forward), E(rope_backward),
        E(attention_forward), E(attention_backward), E(swiglu_forward), E(swiglu_backward),
        E(xent_forward), E(xent_backward), E(router_forward), E(router_backward),
        E(moe_permute), E(moe_permute_backward), E(moe_combine), E(moe_combine_backward), E(moe_permute_bf16),
        E(moe_combine_backward_bf16),
        E(adamw_update), E(muon_momentum), E(transpose), E(gemm_bf16), E(cast_bf16), E(gemm_bf16_batched),
        E(rmsnorm_forward_bf16),
        E(rmsnorm_resid_forward), E(qk_norm_rope_forward), E(qk_norm_rope_backward), E(rmsnorm_resid_forward_bf16),
        E(qk_norm_rope_backward_bf16), E(qk_norm_rope_forward_bf16), E(rmsnorm_backward_bf16),
        E(swiglu_forward_bf16), E(swiglu_backward_bf16), E(swiglu_backward_act_bf16), E(swiglu_forward_bf16_gu),
        E(swiglu_backward_act_bf16_gu), E(swiglu_backward_act_bf16_gud), E(gemm_bf16_out), E(gemm_bf16_resid),
        E(widen_bf16),
        E(moe_route), E(moe_seq_stats), E(moe_aux_loss), E(moe_aux_backward), E(xent_fused), E(xent_fused_bf16),
        E(sumsq_multi), E(normalize_fro), E(normalize_fro_bf16), E(axpby_from_bf16), E(muon_prep_bf16_multi),
        E(axpby_from_bf16_multi),
        E(adamw_multi), E(nonfinite_mark), E(cast_bf16_multi), E(attention_forward_bf16),
        E(attention_backward_bf16), E(op_profile), E(redo_score_acc), E(mod_route), E(mod_backward),
        E(gemm_grouped_rows), E(gemm_grouped_sum), E(moe_count_acc), E(ssm_gate_norm_forward_bf16), E(xent_fused_bf16_logits),
#undef E
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (e[i].cpu && !e[i].cuda) {
            printf("cuda  table: %s is NULL\n", e[i].name);
            missing++;
        }
    report("table", "entries the cpu table fills (missing)", missing, 0);
    /* backend facts (mt_ops.h): the cpu table is the host's and has no device
     * entries; the cuda table is a device's, and its entries are the instance
     * queries of mt_ops_cuda.h (what the trainer and the receipt read) */
    struct mt_ops_device_info in;
    const char *how = NULL;
    int wrong = (c->host_memory != 1) + (c->device_info != NULL) + (c->status != NULL) + (c->queue != NULL) +
                (g->host_memory != 0) + !g->status + !g->device_info + !g->step_counters + !g->queue +
                !g->gemm_precision + (c->graph_mode != NULL) + (c->graph_info != NULL) + !g->graph_mode + !g->graph_info;
    if (!wrong) {
        wrong += g->device_info(g->be, &in) != MT_OK;
        wrong += g->queue(g->be) != mt_ops_cuda_stream_of(g->be) || !g->queue(g->be);
        wrong += (g->gemm_precision(g->be) == MT_ELEM_BF16) != (mt_ops_cuda_get_precision_of(g->be) ==
                                                                 MT_CUDA_PRECISION_BF16);
        wrong += g->status(g->be, NULL, 0) != mt_ops_cuda_status_of(g->be, NULL, 0);
        wrong += !c->op_profile(c->be, &how) || !how || (g->op_profile(g->be, &how), !how);
    }
    report("table", "backend facts: host/device memory, device entries (wrong)", wrong, 0);
}

/* ---- memory ---- */
static void test_memory(void)
{
    if (!selected("memory")) return;
    struct be *b = &g_be[1];
    struct mt_ctx *ctx = &b->ctx;
    size_t n = 1000;
    size_t live0 = ctx->bytes_live[MT_BUCKET_GRADS], total0 = ctx->bytes_live_total;
    float *d = b->ops->buf_alloc(b->ops->be, ctx, n * sizeof(float), MT_BUCKET_GRADS);
    report("buf_alloc", "returns a buffer", d ? 0 : 1, 0);
    if (!d) return;
    report("buf_alloc", "bucket grads accounted (bytes off)",
           fabs((double)(ctx->bytes_live[MT_BUCKET_GRADS] - live0) - (double)(n * sizeof(float))), 0);
    float *h = downf(b, d, n), *zero = xmalloc(n * sizeof(float));
    report("buf_alloc", "zero-filled (differing elements)", (double)ndiff(h, zero, n), 0);
    free(h);
    float *x = rnd(n, -1, 1);
    float *d2 = b->ops->buf_alloc(b->ops->be, ctx, n * sizeof(float), MT_BUCKET_ACTS);
    b->ops->copy_from_host(b->ops->be, d, x, n * sizeof(float));
    b->ops->copy(b->ops->be, d2, d, n * sizeof(float));
    h = downf(b, d2, n);
    report("copy", "host -> dev -> dev -> host round trip (differing)", (double)ndiff(h, x, n), 0);
    free(h);
    b->ops->buf_free(b->ops->be, ctx, d2);
    b->ops->buf_free(b->ops->be, ctx, d);
    b->ops->buf_free(b->ops->be, ctx, NULL);
    report("buf_free", "accounting back to start (bytes off)",
           fabs((double)ctx->bytes_live_total - (double)total0) +
               fabs((double)ctx->bytes_live[MT_BUCKET_GRADS] - (double)live0), 0);
    void *z = b->ops->buf_alloc(b->ops->be, ctx, 0, MT_BUCKET_OTHER);
    report("buf_alloc", "0 bytes gives a valid pointer", z ? 0 : 1, 0);
    b->ops->buf_free(b->ops->be, ctx, z);
    ctx->fail_after = 1;
    void *f = b->ops->buf_alloc(b->ops->be, ctx, 64, MT_BUCKET_OTHER);
    report("buf_alloc", "injected failure: NULL + MT_ERR_OOM",
           (f == NULL && ctx->last_status == MT_ERR_OOM) ? 0 : 1, 0);
    if (f) b->ops->buf_free(b->ops->be, ctx, f);
    ctx->fail_after = 0;
    mt_ctx_clear_error(ctx);
    free(x);
    free(zero);
}

/* ---- elementwise ---- */
static void test_fill_axpby(void)
{
    if (!selected("fill") && !selected("axpby")) return;
    const size_t n = 100003;
    float *x = rnd(n, -2, 2), *y = rnd(n, -2, 2), *ny = nans(n);
    float *r[3];
    for (int c = 0; c < 2; c++) {
        float v = c ? 1.5f : 0.0f;
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *d = upf(b, ny, n);
            b->ops->fill(b->ops->be, d, v, n);
            r[p] = downf(b, d, n);
            release(b);
        }
        check3("fill", c ? "value 1.5" : "value 0", r, n);
    }
    /* (x?, a, b, y prefill) */
    struct { int hasx; float a, bb; int nan_y; const char *what; } cs[] = {
        {1, 0.7f, -1.3f, 0, "y = a x + b y"},
        {1, 0.7f, 0.0f, 1, "b = 0: y = a x, y not read (NaN prefill)"},
        {0, 0.0f, 0.25f, 0, "x = NULL: y = b y"},
        {0, 0.0f, 0.0f, 1, "x = NULL, b = 0: y = 0 (NaN prefill)"},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dy = upf(b, cs[c].nan_y ? ny : y, n);
            float *dx = cs[c].hasx ? upf(b, x, n) : NULL;
            b->ops->axpby(b->ops->be, dy, dx, cs[c].a, cs[c].bb, n);
            r[p] = downf(b, dy, n);
            release(b);
        }
        check3("axpby", cs[c].what, r, n);
    }
    free(x);
    free(y);
    free(ny);
}

/* sum x^2 in the cuda backend's shape-only order (elementwise.cu; the
 * constants are MT_CUDA_RED_BLOCKS and MT_CUDA_RED_THREADS): 1024 spans of
 * bs = ceil(n / 1024); in span b thread t sums x[lo + t], x[lo + t + 256],
 * ... from 0.0, then a tree (w = 128 .. 1: s[i] += s[i + w]); then the same
 * over the 1024 partials. Exact on any device while a thread holds at most
 * one square (bs <= 256): no product for a contraction to fuse */
static double tree256(double *s)
{
    for (int w = 128; w > 0; w >>= 1)
        for (int i = 0; i < w; i++) s[i] += s[i + w];
    return s[0];
}
static double sumsq_shape_order(const float *x, size_t n)
{
    enum { RB = 1024, RT = 256 };
    static double part[RB];
    double s[RT];
    const size_t bs = (n + RB - 1) / RB;
    for (size_t b = 0; b < RB; b++) {
        size_t lo = b * bs < n ? b * bs : n, hi = b * bs + bs < n ? b * bs + bs : n;
        for (int t = 0; t < RT; t++) {
            double acc = 0.0;
            for (size_t i = lo + (size_t)t; i < hi; i += RT) acc += (double)x[i] * (double)x[i];
            s[t] = acc;
        }
        part[b] = tree256(s);
    }
    for (int t = 0; t < RT; t++) {
        double acc = 0.0;
        for (int i = t; i < RB; i += RT) acc += part[i];
        s[t] = acc;
    }
    return tree256(s);
}

static void test_reductions(void)
{
    if (!selected("sumsq") && !selected("all_finite")) return;
    /* the order, bit for bit: spans summed by one thread (bs <= 32: n <= 32 Ki) and by a block's
     * tree. Values over 24 binades; past n = 1024 one span alone is nonzero, so the total is its
     * partial (in a sum of 1024 partials the last rounding hides a partial's last bits). Another
     * order of 32 such squares rounds otherwise about every other time: 12 draws of the span */
    size_t exact[] = {1, 1000, 32768, 32769, 200000};
    for (size_t c = 0; c < sizeof exact / sizeof exact[0]; c++) {
        size_t n = exact[c], bs = (n + 1023) / 1024;
        int draws = bs <= 32 ? 12 : 2, differ = 0;
        for (int d = 0; d < draws; d++) {
            float *x = rnd(n, -3, 3);
            for (size_t i = 0; i < n; i++)
                x[i] = n <= 1024 || i / bs == (size_t)(7 + 61 * d) ? (float)ldexp(x[i], (int)(urand() * 24) - 12)
                                                                    : 0.0f;
            struct be *b = &g_be[1];
            double got = b->ops->sumsq(b->ops->be, upf(b, x, n), n), want = sumsq_shape_order(x, n);
            release(b);
            differ += memcmp(&got, &want, sizeof got) != 0;
            free(x);
        }
        char w[96];
        snprintf(w, sizeof w, "n = %zu: the shape-only order (draws of %d differ)", n, draws);
        report("sumsq", w, differ, 0);
    }
    size_t sizes[] = {1, 1000, 1234567};
    for (size_t c = 0; c < 3; c++) {
        size_t n = sizes[c];
        float *x = rnd(n, -3, 3);
        double s[3];
        int f[3][3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *d = upf(b, x, n);
            s[p] = b->ops->sumsq(b->ops->be, d, n);
            f[p][0] = b->ops->all_finite(b->ops->be, d, n);
            float bad = INFINITY;
            b->ops->copy_from_host(b->ops->be, d + n - 1, &bad, sizeof bad);        /* +inf at the end */
            f[p][1] = b->ops->all_finite(b->ops->be, d, n);
            b->ops->copy_from_host(b->ops->be, d + n - 1, &x[n - 1], sizeof(float));  /* restore the end */
            bad = NAN;
            b->ops->copy_from_host(b->ops->be, d + n / 2, &bad, sizeof bad);        /* NaN in the middle */
            f[p][2] = b->ops->all_finite(b->ops->be, d, n);
            release(b);
        }
        char w[96];
        snprintf(w, sizeof w, "n = %zu (relative error)", n);
        report("sumsq", w, fabs(s[1] - s[0]) / (fabs(s[0]) > 0 ? fabs(s[0]) : 1), TOL);
        snprintf(w, sizeof w, "n = %zu: deterministic (bits differ)", n);
        report("sumsq", w, memcmp(&s[1], &s[2], sizeof(double)) != 0, 0);
        snprintf(w, sizeof w, "n = %zu: finite / +inf / NaN (mismatches)", n);
        int mism = 0;
        for (int k = 0; k < 3; k++) mism += (f[1][k] != f[0][k]) + (f[2][k] != f[0][k]);
        mism += f[0][0] != 1 || f[0][1] != 0 || f[0][2] != 0;
        report("all_finite", w, mism, 0);
        free(x);
    }
    struct be *b = &g_be[1];
    float *d = dalloc(b, 4);
    report("sumsq", "n = 0 is 0", b->ops->sumsq(b->ops->be, d, 0) != 0.0, 0);
    report("all_finite", "n = 0 is 1", b->ops->all_finite(b->ops->be, d, 0) != 1, 0);
    release(b);
}

/* ---- nonfinite_mark: each tensor read as float4s from its first 16-byte
 * boundary, the 0-3 floats before it (head) and after the last whole float4
 * (tail) one by one, blocks per tensor in proportion to its size, each
 * thread striding over ~8 float4s ----
 * 40 tensors (two launches of MT_OPS_LIST_MAX) of sizes 0 .. 100003 in one
 * buffer, each 0-3 floats past a 64-byte boundary (every head length, tails
 * 0-3); the slots a permutation; one flag marked before the call. Each case
 * puts one non-finite value where one path owns it; the flags must be the
 * cpu's bit for bit (twice: deterministic) and the cpu's the expected ones. */
static void test_nonfinite_mark(void)
{
    if (!selected("nonfinite_mark")) return;
    enum { NT = 40 };
    static const size_t n12[12] = {100003, 1, 3, 5, 65537, 0, 2048, 12345, 4, 2, 7, 40000};
    static const size_t off12[12] = {0, 1, 2, 3, 1, 0, 3, 2, 1, 2, 3, 1};
    size_t n[NT], at[NT], total = 0;
    int slot[NT];
    for (int t = 0; t < NT; t++) {
        n[t] = t < 12 ? n12[t] : (size_t)((t * 37) % 61);
        total = (total + 15) & ~(size_t)15;                  /* a 64-byte boundary of the buffer, */
        at[t] = total + (t < 12 ? off12[t] : (size_t)t % 4); /* then 0-3 floats                   */
        total = at[t] + n[t];
        slot[t] = (t * 7) % NT;
    }
    /* tensor 0: 25000 float4s over 13 blocks (3328 a sweep) + a tail of 3; 4: head 3, 16383
     * float4s, tail 2; 3: head 1, one float4; 1: n = 1 < its head; 11: tail 1; 35 (second
     * launch): n = 14, head 1, tail 1 */
    struct { int t; size_t i; float v; const char *what; } cs[] = {
        {-1, 0, 0.0f, "all finite: only the earlier mark"},
        {0, 100002, NAN, "largest, aligned: its last element (tail)"},
        {0, 99999, INFINITY, "largest: the last float4's last lane"},
        {0, 4 * 3328 * 5 + 1, -INFINITY, "largest: a float4 of the 6th stride"},
        {4, 65536, NAN, "4 bytes off: its last element (tail)"},
        {4, 0, NAN, "4 bytes off: its first element (head)"},
        {4, 3, INFINITY, "4 bytes off: the first float4"},
        {3, 4, NAN, "12 bytes off, n = 5: the float4"},
        {1, 0, NAN, "n = 1, 4 bytes off (head cut to n)"},
        {11, 39999, NAN, "n = 40000, 4 bytes off: tail of 1"},
        {35, 13, NAN, "second launch: a tail"},
    };
    float *host = rnd(total, -3, 3), *f0 = rnd(NT, -1, 1);
    f0[slot[9]] = NAN;   /* an earlier mark stays */
    struct be *g = BE(1);
    float *probe = dalloc(g, total * sizeof(float));
    size_t wrong_align = 0;   /* the device views are as misaligned as the test means */
    for (int t = 0; t < NT; t++) wrong_align += (((uintptr_t)(probe + at[t]) & 15) == 0) != (at[t] % 4 == 0);
    release(g);
    report("nonfinite_mark", "views 0-3 floats off 16 bytes on the device (wrong)", (double)wrong_align, 0);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        float keep = 0.0f;
        if (cs[c].t >= 0) {
            keep = host[at[cs[c].t] + cs[c].i];
            host[at[cs[c].t] + cs[c].i] = cs[c].v;
        }
        float *r[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *d = upf(b, host, total), *fl = upf(b, f0, NT);
            const float *x[NT];
            for (int t = 0; t < NT; t++) x[t] = d + at[t];
            b->ops->nonfinite_mark(b->ops->be, fl, x, n, slot, NT);
            r[p] = downf(b, fl, NT);
            release(b);
        }
        size_t bad = ndiff(r[1], r[0], NT) + ndiff(r[2], r[0], NT);
        for (int t = 0; t < NT; t++) {   /* the cpu's flags: NaN exactly at 9's and the case's slots */
            const int want = t == 9 || t == cs[c].t;
            bad += want ? !isnan(r[0][slot[t]]) : ndiff(&r[0][slot[t]], &f0[slot[t]], 1);
        }
        char w[128];
        snprintf(w, sizeof w, "%s (wrong flags)", cs[c].what);
        report("nonfinite_mark", w, (double)bad, 0);
        for (int p = 0; p < 3; p++) free(r[p]);
        if (cs[c].t >= 0) host[at[cs[c].t] + cs[c].i] = keep;
    }
    free(host);
    free(f0);
}

/* ---- gemm ---- */
static void test_gemm(void)
{
    if (!selected("gemm")) return;
    struct { int tA, tB, M, N, K, pad; float alpha, beta; } cs[] = {
        {0, 0, 67, 45, 33, 3, 0.7f, 0.0f}, {0, 1, 67, 45, 33, 3, 1.0f, 0.5f},
        {1, 0, 67, 45, 33, 0, 1.0f, 1.0f}, {1, 1, 67, 45, 33, 5, -0.3f, 0.0f},
        {0, 1, 256, 384, 512, 0, 1.0f, 0.0f}, {0, 0, 31, 17, 0, 2, 1.0f, 0.5f},
        {1, 0, 20, 30, 40, 1, 0.0f, 0.0f},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int M = cs[c].M, N = cs[c].N, K = cs[c].K, pad = cs[c].pad;
        int ar = cs[c].tA ? K : M, ac = cs[c].tA ? M : K;  /* A stored (ar, ac) */
        int br = cs[c].tB ? N : K, bc = cs[c].tB ? K : N;
        int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
        size_t na = (size_t)(ar > 0 ? ar : 1) * (size_t)lda, nb = (size_t)(br > 0 ? br : 1) * (size_t)ldb;
        size_t nc = (size_t)M * (size_t)ldc;
        float *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1);
        float *C0 = cs[c].beta == 0.0f ? nans(nc) : rnd(nc, -1, 1);
        if (cs[c].beta == 0.0f) /* padding columns of C are never written: keep them finite */
            for (int i = 0; i < M; i++)
                for (int j = N; j < ldc; j++) C0[(size_t)i * ldc + j] = 7.0f;
        float *r[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dA = upf(b, A, na), *dB = upf(b, B, nb), *dC = upf(b, C0, nc);
            b->ops->gemm(b->ops->be, cs[c].tA, cs[c].tB, M, N, K, cs[c].alpha, dA, lda > 0 ? lda : 1, dB, ldb > 0 ? ldb : 1,
                         cs[c].beta, dC, ldc);
            r[p] = downf(b, dC, nc);
            release(b);
        }
        char w[128];
        snprintf(w, sizeof w, "tA=%d tB=%d M=%d N=%d K=%d pad=%d alpha=%g beta=%g", cs[c].tA, cs[c].tB, M, N, K,
                 pad, cs[c].alpha, cs[c].beta);
        check3("gemm", w, r, nc);
        free(A);
        free(B);
        free(C0);
    }
}

/* ---- grouped gemm (MoE experts) ----
 * The two shapes the model uses: a projection (rows of one sorted buffer x
 * one weight per group, M varies, transB) and a weight gradient (dW += d^T x,
 * K varies, beta = 1). Groups of 0 rows and a K = 0 group (C scaled by
 * beta) are included. cpu grouped must equal the per-group cpu gemm loop
 * bit for bit (that is its contract); cuda grouped = cpu to 1e-5, twice
 * identically; in bf16 mode the loop runs and is counted with a reason. */
static void test_gemm_grouped(int bf16)
{
    if (!selected("gemm")) return;
    enum { G = 6 };
    const int rows[G] = {37, 0, 5, 64, 1, 23}, D = 48, F = 40;
    int tot = 0, off[G];
    for (int g = 0; g < G; g++) { off[g] = tot; tot += rows[g]; }
    for (int shape = 0; shape < 2; shape++) {
        /* shape 0: C_g (rows, F) = X_g (rows, D) W_g^T, W_g (F, D)
         * shape 1: C_g (F, D) += Y_g^T (rows, F)^T X_g (rows, D)  (K = rows; group 1 has K = 0) */
        size_t nx = (size_t)tot * D, ny = (size_t)tot * F, nw = (size_t)G * F * D;
        size_t nc = shape == 0 ? (size_t)tot * F : nw;
        float *X = rnd(nx, -1, 1), *Y = rnd(ny, -1, 1), *W = rnd(nw, -1, 1), *C0 = shape == 0 ? nans(nc) : rnd(nc, -1, 1);
        float *r[4];
        for (int p = 0; p < 4; p++) {   /* 0: cpu grouped, 1-2: cuda grouped, 3: cpu per-group gemm loop */
            struct be *b = p == 3 ? BE(0) : BE(p);
            float *dX = upf(b, X, nx), *dY = upf(b, Y, ny), *dW = upf(b, W, nw), *dC = upf(b, C0, nc);
            int M[G], N[G], K[G];
            const float *A[G], *B[G];
            float *C[G];
            for (int g = 0; g < G; g++) {
                if (shape == 0) {
                    M[g] = rows[g]; N[g] = F; K[g] = D;
                    A[g] = dX + (size_t)off[g] * D; B[g] = dW + (size_t)g * F * D; C[g] = dC + (size_t)off[g] * F;
                } else {
                    M[g] = F; N[g] = D; K[g] = rows[g];
                    A[g] = dY + (size_t)off[g] * F; B[g] = dX + (size_t)off[g] * D; C[g] = dC + (size_t)g * F * D;
                }
            }
            int tA = shape == 1, tB = shape == 0, lda = shape == 0 ? D : F, ldc = shape == 0 ? F : D;
            float beta = shape == 0 ? 0.0f : 1.0f;
            if (p == 3) {
                for (int g = 0; g < G; g++)
                    if (M[g] > 0) b->ops->gemm(b->ops->be, tA, tB, M[g], N[g], K[g], 1.0f, A[g], lda, B[g], D, beta, C[g], ldc);
            } else {
                b->ops->gemm_grouped(b->ops->be, tA, tB, G, M, N, K, 1.0f, A, lda, B, D, beta, C, ldc);
            }
            r[p] = downf(b, dC, nc);
            release(b);
        }
        char w[128];
        snprintf(w, sizeof w, "%s, %d groups (one empty)%s", shape == 0 ? "projection, M varies" : "dW += d^T x, K varies",
                 G, bf16 ? ", bf16 mode (loop)" : "");
        if (!bf16) {
            report("gemm_grouped", "cpu grouped = cpu per-group gemm (differing elements)", (double)ndiff(r[0], r[3], nc), 0);
            check3("gemm_grouped", w, r, nc);
        } else {
            report("gemm_grouped", w, (double)ndiff(r[1], r[2], nc), 0);   /* deterministic; numbers: bf16 bound of gemm */
            for (int p = 0; p < 3; p++) free(r[p]);
        }
        free(r[3]);
        free(X); free(Y); free(W); free(C0);
    }
    struct mt_ops_cuda_info in;
    mt_ops_cuda_get_info(&in);
    if (bf16)
        report("gemm_grouped", "bf16 mode: loop counted with a reason", (in.gemm_grouped_loops < 2) + (in.gemm_grouped_fallback[0] == 0), 0);
    else
        printf("cuda gemm_grouped: %ld calls, %ld as loops%s%s\n", in.gemm_grouped_calls, in.gemm_grouped_loops,
               in.gemm_grouped_fallback[0] ? ": " : "", in.gemm_grouped_fallback);
}

/* ---- gemm in bf16 mode ---- */
/* element (r, c) of op(X) for X stored row-major with leading dimension ld */
static double opel(const float *X, int trans, int ld, int r, int c)
{
    return trans ? (double)X[(size_t)c * ld + r] : (double)X[(size_t)r * ld + c];
}

static void test_gemm_bf16(void)
{
    if (!selected("gemm")) return;
    /* coff: C passed at an offset of coff floats (an unaligned C pointer) */
    struct { int tA, tB, M, N, K, pad, coff; float alpha, beta; } cs[] = {
        {0, 0, 67, 45, 33, 3, 0, 0.7f, 0.0f},   {0, 1, 67, 45, 33, 3, 0, 1.0f, 0.5f},
        {1, 0, 67, 45, 33, 0, 1, 1.0f, 1.0f},   {1, 1, 67, 45, 33, 5, 3, -0.3f, 0.0f},
        {0, 1, 256, 384, 512, 0, 0, 1.0f, 0.0f}, {0, 0, 31, 17, 0, 2, 0, 1.0f, 0.5f},
        {1, 0, 20, 30, 40, 1, 0, 0.0f, 0.0f},   {0, 1, 64, 96, 1000, 0, 1, 1.0f, 1.0f},
        /* operand copies of ~2 MB: tiled when MT_CUDA_BF16_SCRATCH_MB=1 (rows, columns, both) */
        {0, 1, 2000, 64, 512, 0, 0, 1.0f, 0.0f}, {1, 0, 64, 2000, 512, 0, 0, 1.0f, 1.0f},
        {1, 1, 520, 520, 1000, 4, 1, 0.5f, 0.25f},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int M = cs[c].M, N = cs[c].N, K = cs[c].K, pad = cs[c].pad, co = cs[c].coff;
        int ar = cs[c].tA ? K : M, ac = cs[c].tA ? M : K;
        int br = cs[c].tB ? N : K, bc = cs[c].tB ? K : N;
        int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
        size_t na = (size_t)(ar > 0 ? ar : 1) * (size_t)lda, nb = (size_t)(br > 0 ? br : 1) * (size_t)ldb;
        size_t nc = (size_t)M * (size_t)ldc;
        float *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1);
        float *C0 = cs[c].beta == 0.0f ? nans(nc + (size_t)co) : rnd(nc + (size_t)co, -1, 1);
        if (cs[c].beta == 0.0f)
            for (int i = 0; i < M; i++)
                for (int j = N; j < ldc; j++) C0[(size_t)co + (size_t)i * ldc + j] = 7.0f;
        float *r[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dA = upf(b, A, na), *dB = upf(b, B, nb), *dC = upf(b, C0, nc + (size_t)co);
            b->ops->gemm(b->ops->be, cs[c].tA, cs[c].tB, M, N, K, cs[c].alpha, dA, lda > 0 ? lda : 1, dB, ldb > 0 ? ldb : 1,
                         cs[c].beta, dC + co, ldc);
            r[p] = downf(b, dC + co, nc);
            release(b);
        }
        /* err / bound, element by element */
        double worst = 0.0, fp32_err = 0.0, scale = 0.0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < ldc; j++) {
                size_t e = (size_t)i * ldc + j;
                double S2 = 0.0, T = 0.0;
                for (int k = 0; j < N && k < K; k++) {
                    double t = opel(A, cs[c].tA, lda, i, k) * opel(B, cs[c].tB, ldb, k, j);
                    S2 += t * t;
                    T += fabs(t);
                }
                double cij = j < N && cs[c].beta != 0.0f ? (double)C0[(size_t)co + e] : 0.0;
                double bound = fabs((double)cs[c].alpha) * (BF16_C * BF16_U * sqrt(S2) + 2.0 * K * 0x1.0p-24 * T) +
                               0x1.0p-22 * fabs((double)cs[c].beta * cij) + 1e-30;
                double d = fabs((double)r[1][e] - (double)r[0][e]);
                if (!(d == d)) d = INFINITY;
                if (d / bound > worst) worst = d / bound;
                if (d > fp32_err) fp32_err = d;
                if (fabs((double)r[0][e]) > scale) scale = fabs((double)r[0][e]);
            }
        char w[160];
        snprintf(w, sizeof w, "bf16 tA=%d tB=%d M=%d N=%d K=%d pad=%d coff=%d alpha=%g beta=%g (err/bound)",
                 cs[c].tA, cs[c].tB, M, N, K, pad, co, cs[c].alpha, cs[c].beta);
        report("gemm", w, worst, 1.0);
        snprintf(w, sizeof w, "bf16 tA=%d tB=%d M=%d N=%d K=%d: deterministic (differing elements)", cs[c].tA,
                 cs[c].tB, M, N, K);
        report("gemm", w, (double)ndiff(r[1], r[2], nc), 0);
        if (K >= 512) {
            /* the operands really were rounded: fp32's 1e-5 must NOT hold */
            snprintf(w, sizeof w, "bf16 M=%d N=%d K=%d: rel. diff from fp32 %.1e > 1e-5 (bf16 ran)", M, N, K,
                     fp32_err / (scale > 0 ? scale : 1));
            report("gemm", w, fp32_err / (scale > 0 ? scale : 1) > TOL ? 0 : 1, 0);
        }
        for (int p = 0; p < 3; p++) free(r[p]);
        free(A);
        free(B);
        free(C0);
    }
}

/* ---- gemm_bf16 / cast_bf16: the entries of precision=bf16 ----
 * The cpu table's gemm_bf16 rounds the operands to bf16 and runs sgemm: the
 * same bf16 products, fp32 sums in another order. So cuda = cpu within the
 * accumulation term of the bound alone, 2K 2^-24 T + 2^-22 |beta c| (no
 * operand-rounding term: both round identically), for every combination of
 * operand types; bf16 x bf16 with aligned operands must take the direct
 * path (counted, no conversion), and cast_bf16 must equal the cpu's
 * rounding bit for bit (ties to even, NaN, infinities, subnormals).
 * NaN: every NaN becomes the canonical 0x7fff, what the device's
 * cvt.rn.bf16.f32 returns: the H200 run of 2026-11-26 differed from the cpu
 * twin (then "payload kept, quiet bit set") in exactly the one NaN input,
 * 1 of 4099. The edge list below holds NaNs of both signs, quiet and
 * signalling, with payloads in the high and the low half (the class the
 * emulator missed), subnormal ties and the tie at the largest finite value. */
static uint16_t host_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;   /* canonical NaN, as cvt.rn.bf16.f32 */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void test_bf16_operands(void)
{
    if (!selected("bf16_operands")) return;
    /* cast: random values plus the edge cases */
    {
        const size_t n = 4099;
        float *x = rnd(n, -3, 3);
        const uint32_t edge[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                 0x00000001u, 0x80400000u, 0x7f7fffffu, 0x00000000u, 0x80000000u,
                                 /* NaNs: quiet and signalling, both signs, payload high / low / all ones */
                                 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa50000u, 0xffd2a5a5u,
                                 0x7fffffffu, 0xffffffffu, 0x7f80ffffu,
                                 /* subnormal ties (to even: down, up), the tie at the largest finite -> inf */
                                 0x00008000u, 0x00018000u, 0x80018000u, 0x007f8000u, 0x7f7f8000u, 0xff7f8000u};
        for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) memcpy(&x[i * 7], &edge[i], 4);
        uint16_t *r[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dx = upf(b, x, n);
            uint16_t *dy = dalloc(b, n * 2);
            b->ops->cast_bf16(b->ops->be, dy, dx, n);
            r[p] = xmalloc(n * 2);
            b->ops->copy_to_host(b->ops->be, r[p], dy, n * 2);
            release(b);
        }
        size_t bad = 0, bad_host = 0, bad_nan = 0, n_nan = 0;
        for (size_t i = 0; i < n; i++) {
            bad += r[0][i] != r[1][i] || r[1][i] != r[2][i];
            bad_host += r[0][i] != host_bf16(x[i]);
            if (x[i] != x[i]) {
                n_nan++;
                bad_nan += r[1][i] != 0x7fffu || r[0][i] != 0x7fffu;
            }
        }
        report("bf16_operands", "cast_bf16 = cpu bit for bit (differing, of 4099)", (double)bad, 0);
        report("bf16_operands", "cpu cast_bf16 = round to nearest even (differing)", (double)bad_host, 0);
        report("bf16_operands", "cast_bf16 NaN -> 0x7fff, cuda and cpu (differing, of 10)", (double)(bad_nan + (n_nan != 10)), 0);
        /* widen_bf16 of the rounded values (grad_reduce_dtype=bf16's way back): exact, = cpu bit for bit */
        float *wd[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            uint16_t *dh = dalloc(b, n * 2);
            b->ops->copy_from_host(b->ops->be, dh, r[0], n * 2);
            float *dw = upf(b, x, n);
            b->ops->widen_bf16(b->ops->be, dw, dh, n);
            wd[p] = downf(b, dw, n);
            release(b);
        }
        size_t wbad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &wd[1][i], 4);
            int nan = (r[0][i] & 0x7fffu) > 0x7f80u;
            wbad += nan ? wd[1][i] == wd[1][i] : u != (uint32_t)r[0][i] << 16;
        }
        report("bf16_operands", "widen_bf16 exact (differing, of 4099)", (double)wbad, 0);
        report("bf16_operands", "widen_bf16 = cpu, deterministic (differing)",
               (double)(ndiff(wd[1], wd[0], n) + ndiff(wd[1], wd[2], n)), 0);
        for (int p = 0; p < 3; p++) free(wd[p]);
        for (int p = 0; p < 3; p++) free(r[p]);
        free(x);
    }
    /* rmsnorm_forward_bf16: out and rstd as rmsnorm_forward (1e-5 vs cpu),
     * and the twin is exactly the rounding of the out the kernel wrote */
    {
        const int N = 37, C = 200;
        float *x = rnd((size_t)N * C, -2, 2), *w = rnd(C, 0.5, 1.5);
        float *o[3], *rs[3];
        uint16_t *ob[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dx = upf(b, x, (size_t)N * C), *dw = upf(b, w, C), *dout = upf(b, x, (size_t)N * C);
            float *drs = upf(b, w, N);
            uint16_t *dob = dalloc(b, (size_t)N * C * 2);
            b->ops->rmsnorm_forward_bf16(b->ops->be, dout, dob, drs, dx, dw, N, C, 1e-6f);
            o[p] = downf(b, dout, (size_t)N * C);
            rs[p] = downf(b, drs, N);
            ob[p] = xmalloc((size_t)N * C * 2);
            b->ops->copy_to_host(b->ops->be, ob[p], dob, (size_t)N * C * 2);
            release(b);
        }
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)N * C; i++) bad += ob[1][i] != host_bf16(o[1][i]) || ob[0][i] != host_bf16(o[0][i]);
        report("bf16_operands", "rmsnorm_forward_bf16 out vs cpu", rel_err(o[1], o[0], (size_t)N * C), TOL);
        report("bf16_operands", "rmsnorm_forward_bf16 rstd vs cpu", rel_err(rs[1], rs[0], N), TOL);
        report("bf16_operands", "rmsnorm_forward_bf16 twin = bf16(out) (differing)", (double)bad, 0);
        report("bf16_operands", "rmsnorm_forward_bf16 deterministic (differing)",
               (double)(ndiff(o[1], o[2], (size_t)N * C) + ndiff(ob[1], ob[2], (size_t)N * C / 2)), 0);
        for (int p = 0; p < 3; p++) { free(o[p]); free(rs[p]); free(ob[p]); }
        free(x);
        free(w);
    }
    /* the block's twins (precision=bf16): rmsnorm_resid_forward_bf16 and
     * swiglu_forward_bf16 write the plain op's fp32 outputs (the same bits
     * as the plain cuda op) and bf16(out) exactly, deterministic */
    {
        const int N = 37, C = 200;
        const size_t n = (size_t)N * C;
        float *x = rnd(n, -2, 2), *w = rnd(C, 0.5, 1.5), *u = rnd(n, -3, 3);
        float *o[3], *po[3], *rs[3], *res[3], *so[3], *pso[3];
        uint16_t *ob[3], *sb[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dx = upf(b, x, n), *dw = upf(b, w, C), *du = upf(b, u, n), *dout = upf(b, x, n), *dres = upf(b, u, n);
            float *drs = upf(b, w, N), *pout = upf(b, x, n), *pres = upf(b, u, n), *prs = upf(b, w, N);
            float *sout = upf(b, x, n), *psout = upf(b, u, n);
            uint16_t *dob = dalloc(b, n * 2), *dsb = dalloc(b, n * 2);
            b->ops->rmsnorm_resid_forward_bf16(b->ops->be, dout, dob, drs, dres, dx, dw, N, C, 1e-5f);
            b->ops->rmsnorm_resid_forward(b->ops->be, pout, prs, pres, dx, dw, N, C, 1e-5f);
            b->ops->swiglu_forward_bf16(b->ops->be, sout, dsb, dx, du, n);
            b->ops->swiglu_forward(b->ops->be, psout, dx, du, n);
            o[p] = downf(b, dout, n);
            po[p] = downf(b, pout, n);
            rs[p] = downf(b, drs, N);
            res[p] = downf(b, dres, n);
            so[p] = downf(b, sout, n);
            pso[p] = downf(b, psout, n);
            ob[p] = xmalloc(n * 2);
            sb[p] = xmalloc(n * 2);
            b->ops->copy_to_host(b->ops->be, ob[p], dob, n * 2);
            b->ops->copy_to_host(b->ops->be, sb[p], dsb, n * 2);
            release(b);
        }
        size_t bad = 0, sbad = 0;
        for (size_t i = 0; i < n; i++) {
            bad += ob[1][i] != host_bf16(o[1][i]) || ob[0][i] != host_bf16(o[0][i]);
            sbad += sb[1][i] != host_bf16(so[1][i]) || sb[0][i] != host_bf16(so[0][i]);
        }
        report("bf16_operands", "rmsnorm_resid_forward_bf16 out vs cpu", rel_err(o[1], o[0], n), TOL);
        report("bf16_operands", "rmsnorm_resid_forward_bf16 out, resid = the plain op's bits (differing)",
               (double)(ndiff(o[1], po[1], n) + ndiff(res[1], x, n)), 0);
        report("bf16_operands", "rmsnorm_resid_forward_bf16 rstd vs cpu", rel_err(rs[1], rs[0], N), TOL);
        report("bf16_operands", "rmsnorm_resid_forward_bf16 twin = bf16(out) (differing)", (double)bad, 0);
        report("bf16_operands", "swiglu_forward_bf16 out vs cpu", rel_err(so[1], so[0], n), TOL);
        report("bf16_operands", "swiglu_forward_bf16 out = the plain op's bits (differing)",
               (double)ndiff(so[1], pso[1], n), 0);
        report("bf16_operands", "swiglu_forward_bf16 twin = bf16(out) (differing)", (double)sbad, 0);
        report("bf16_operands", "bf16 twins deterministic (differing)",
               (double)(ndiff(o[1], o[2], n) + ndiff(ob[1], ob[2], n / 2) + ndiff(so[1], so[2], n) +
                        ndiff(sb[1], sb[2], n / 2)), 0);
        for (int p = 0; p < 3; p++) {
            free(o[p]); free(po[p]); free(rs[p]); free(res[p]); free(so[p]); free(pso[p]); free(ob[p]); free(sb[p]);
        }
        free(x); free(w); free(u);
    }
    struct { int tA, tB, M, N, K, pad; float alpha, beta; } cs[] = {
        {0, 1, 64, 96, 128, 0, 1.0f, 0.0f},  {1, 0, 96, 64, 256, 0, 1.0f, 1.0f}, {0, 0, 40, 48, 56, 0, 0.5f, 0.5f},
        {0, 1, 37, 29, 51, 3, 1.0f, 0.0f},   {1, 1, 33, 65, 17, 1, -1.0f, 0.25f},
    };
    const enum mt_elem ty[3][2] = {{MT_ELEM_BF16, MT_ELEM_BF16}, {MT_ELEM_F32, MT_ELEM_BF16}, {MT_ELEM_F32, MT_ELEM_F32}};
    struct mt_ops_cuda_info i0, i1;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
        for (int t = 0; t < 3; t++) {
            int M = cs[c].M, N = cs[c].N, K = cs[c].K, pad = cs[c].pad;
            int ar = cs[c].tA ? K : M, ac = cs[c].tA ? M : K, br = cs[c].tB ? N : K, bc = cs[c].tB ? K : N;
            int lda = ac + pad, ldb = bc + pad, ldc = N;
            size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)M * ldc;
            float *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1), *C0 = rnd(nc, -1, 1);
            uint16_t *Ah = xmalloc(na * 2), *Bh = xmalloc(nb * 2);
            for (size_t e = 0; e < na; e++) Ah[e] = host_bf16(A[e]);
            for (size_t e = 0; e < nb; e++) Bh[e] = host_bf16(B[e]);
            float *r[3];
            mt_ops_cuda_get_info(&i0);
            for (int p = 0; p < 3; p++) {
                struct be *b = BE(p);
                const void *dA, *dB;
                if (ty[t][0] == MT_ELEM_BF16) {
                    void *d = dalloc(b, na * 2);
                    b->ops->copy_from_host(b->ops->be, d, Ah, na * 2);
                    dA = d;
                } else {
                    dA = upf(b, A, na);
                }
                if (ty[t][1] == MT_ELEM_BF16) {
                    void *d = dalloc(b, nb * 2);
                    b->ops->copy_from_host(b->ops->be, d, Bh, nb * 2);
                    dB = d;
                } else {
                    dB = upf(b, B, nb);
                }
                float *dC = upf(b, C0, nc);
                b->ops->gemm_bf16(b->ops->be, cs[c].tA, cs[c].tB, M, N, K, cs[c].alpha, dA, ty[t][0], lda, dB, ty[t][1], ldb,
                                  cs[c].beta, dC, ldc);
                r[p] = downf(b, dC, nc);
                release(b);
            }
            mt_ops_cuda_get_info(&i1);
            double worst = 0.0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double T = 0.0;
                    for (int k = 0; k < K; k++) T += fabs(opel(A, cs[c].tA, lda, i, k) * opel(B, cs[c].tB, ldb, k, j));
                    size_t e = (size_t)i * ldc + j;
                    double bound = fabs((double)cs[c].alpha) * 2.0 * K * 0x1.0p-24 * T * 1.01 +
                                   0x1.0p-22 * fabs((double)cs[c].beta * C0[e]) + 1e-30;
                    double d = fabs((double)r[1][e] - (double)r[0][e]);
                    if (!(d == d)) d = INFINITY;
                    if (d / bound > worst) worst = d / bound;
                }
            char w[160];
            const char *tn[2] = {"f32", "bf16"};
            snprintf(w, sizeof w, "A %s B %s tA=%d tB=%d M=%d N=%d K=%d pad=%d: cuda vs cpu (err/acc. bound)",
                     tn[ty[t][0]], tn[ty[t][1]], cs[c].tA, cs[c].tB, M, N, K, pad);
            report("bf16_operands", w, worst, 1.0);
            snprintf(w, sizeof w, "A %s B %s M=%d N=%d K=%d: deterministic (differing elements)", tn[ty[t][0]],
                     tn[ty[t][1]], M, N, K);
            report("bf16_operands", w, (double)ndiff(r[1], r[2], nc), 0);
            /* both bf16 and aligned (pad 0, K and N multiples of 8): the direct
             * path, twice, with no element converted */
            if (t == 0 && pad == 0 && K % 8 == 0 && N % 8 == 0 && M % 8 == 0) {
                snprintf(w, sizeof w, "bf16 x bf16 M=%d N=%d K=%d: direct matmuls (of 2), elements cast", M, N, K);
                report("bf16_operands", w,
                       (double)(i1.gemm_bf16_direct - i0.gemm_bf16_direct != 2) +
                           (double)(i1.gemm_bf16_cast_elems - i0.gemm_bf16_cast_elems),
                       0);
            }
            if (t == 2) {
                snprintf(w, sizeof w, "f32 x f32 M=%d N=%d K=%d: operand elements counted as cast", M, N, K);
                report("bf16_operands", w,
                       (double)(i1.gemm_bf16_cast_elems - i0.gemm_bf16_cast_elems != 2 * (long)(na - (size_t)pad * ar + nb - (size_t)pad * br)),
                       0);
            }
            for (int p = 0; p < 3; p++) free(r[p]);
            free(A); free(B); free(C0); free(Ah); free(Bh);
        }
    /* algorithm reuse (gemm.cu): expert-like GEMMs whose row count changes
     * (M of a forward, K of a weight gradient) within one power-of-two class
     * query the heuristic once per class and reuse its algorithm after a
     * check; the products stay within the bound of the cpu's */
    struct { int tA, tB, N, vary_k; } rc[] = {{0, 1, 48, 0}, {1, 0, 40, 1}};
    const int sizes[3] = {100, 90, 120};   /* one class: 128 */
    for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++) {
        mt_ops_cuda_get_info(&i0);
        double worst = 0.0;
        for (int v = 0; v < 3; v++) {
            int M = rc[c].vary_k ? 24 : sizes[v], N = rc[c].N, K = rc[c].vary_k ? sizes[v] : 56;
            int ar = rc[c].tA ? K : M, ac = rc[c].tA ? M : K, br = rc[c].tB ? N : K, bc = rc[c].tB ? K : N;
            size_t na = (size_t)ar * ac, nb = (size_t)br * bc, nc = (size_t)M * N;
            float *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1), *r[2];
            for (int p = 0; p < 2; p++) {
                struct be *b = BE(p);
                float *dA = upf(b, A, na), *dB = upf(b, B, nb), *dC = dalloc(b, nc * sizeof(float));
                b->ops->gemm_bf16(b->ops->be, rc[c].tA, rc[c].tB, M, N, K, 1.0f, dA, MT_ELEM_F32, ac, dB, MT_ELEM_F32, bc,
                                  0.0f, dC, N);
                r[p] = downf(b, dC, nc);
                release(b);
            }
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double T = 0.0;
                    for (int k = 0; k < K; k++) T += fabs(opel(A, rc[c].tA, ac, i, k) * opel(B, rc[c].tB, bc, k, j));
                    double d = fabs((double)r[1][(size_t)i * N + j] - (double)r[0][(size_t)i * N + j]);
                    double bound = 2.0 * K * 0x1.0p-24 * T * 1.01 + 1e-30;
                    if (!(d == d)) d = INFINITY;
                    if (d / bound > worst) worst = d / bound;
                }
            free(r[0]); free(r[1]); free(A); free(B);
        }
        mt_ops_cuda_get_info(&i1);
        char w[160];
        snprintf(w, sizeof w, "%s varies 100, 90, 120 (tA=%d tB=%d): cuda vs cpu (err/acc. bound)",
                 rc[c].vary_k ? "K" : "M", rc[c].tA, rc[c].tB);
        report("bf16_operands", w, worst, 1.0);
        snprintf(w, sizeof w, "%s varies in one class: 1 heuristic query, 2 checked reuses (off by)",
                 rc[c].vary_k ? "K" : "M");
        report("bf16_operands", w,
               (double)labs(i1.gemm_plan_heuristics - i0.gemm_plan_heuristics - 1) +
                   (double)labs(i1.gemm_plan_algo_reuses - i0.gemm_plan_algo_reuses - 2),
               0);
    }
}

/* ---- instances (docs/cuda.md, "The backend handle"): the default table in
 * fp32 and a second one made by mt_ops_cuda_create() in bf16, calls
 * interleaved. Each must give its own mode's GEMM (fp32: 1e-5 from cpu; bf16:
 * 1e-5 from cpu on bf16-rounded operands, and visibly not fp32), count only
 * its own bf16 matmuls, keep its own stream and precision, and the default
 * must keep working after the second is destroyed. A backend that acted on
 * one process-wide instance fails the first interleaved pair. */
static void test_instances(void)
{
    if (!selected("instances")) return;
    char why[256] = "";
    report("instances", "create(precision 42) refused", mt_ops_cuda_create((enum mt_cuda_precision)42, why, sizeof why) != NULL, 0);
    const struct mt_ops_i *oa = g_be[1].ops, *ob = mt_ops_cuda_create(MT_CUDA_PRECISION_BF16, why, sizeof why);
    if (!ob) {
        report("instances", why[0] ? why : "mt_ops_cuda_create returned NULL", 1, 0);
        return;
    }
    struct be bb = {.ops = ob, .name = "cuda2"};
    mt_ctx_init(&bb.ctx);
    mt_ops_cuda_set_precision_of(oa->be, MT_CUDA_PRECISION_FP32);
    report("instances", "distinct instance, stream; precisions fp32 / bf16",
           (ob->be == oa->be) + (mt_ops_cuda_stream_of(ob->be) == mt_ops_cuda_stream_of(oa->be)) +
               (mt_ops_cuda_get_precision_of(oa->be) != MT_CUDA_PRECISION_FP32) +
               (mt_ops_cuda_get_precision_of(ob->be) != MT_CUDA_PRECISION_BF16) +
               (mt_ops_cuda_get_precision() != MT_CUDA_PRECISION_FP32),
           0);
    const int M = 24, N = 40, K = 64;
    float *A = rnd((size_t)M * K, -1, 1), *B = rnd((size_t)K * N, -1, 1);
    float *Ar = xmalloc((size_t)M * K * 4), *Br = xmalloc((size_t)K * N * 4);
    for (int i = 0; i < M * K; i++) { uint32_t u = (uint32_t)host_bf16(A[i]) << 16; memcpy(&Ar[i], &u, 4); }
    for (int i = 0; i < K * N; i++) { uint32_t u = (uint32_t)host_bf16(B[i]) << 16; memcpy(&Br[i], &u, 4); }
    /* references on the cpu: fp32 operands, bf16-rounded operands */
    float *ref[2];
    for (int r = 0; r < 2; r++) {
        float *dA = upf(BE(0), r ? Ar : A, (size_t)M * K), *dB = upf(BE(0), r ? Br : B, (size_t)K * N);
        float *dC = dalloc(BE(0), (size_t)M * N * 4);
        BE(0)->ops->gemm(BE(0)->ops->be, 0, 0, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dC, N);
        ref[r] = downf(BE(0), dC, (size_t)M * N);
        release(BE(0));
    }
    struct mt_ops_cuda_info ia0, ib0, ia1, ib1;
    mt_ops_cuda_get_info_of(oa->be, &ia0);
    mt_ops_cuda_get_info_of(ob->be, &ib0);
    /* interleaved: a, b, a, b, each on its own buffers; results read last */
    float *dC[4];
    for (int c = 0; c < 4; c++) {
        struct be *b = c % 2 ? &bb : BE(1);
        float *dA = upf(b, A, (size_t)M * K), *dB = upf(b, B, (size_t)K * N);
        dC[c] = dalloc(b, (size_t)M * N * 4);
        b->ops->gemm(b->ops->be, 0, 0, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dC[c], N);
    }
    float *got[4];
    for (int c = 0; c < 4; c++) got[c] = downf(c % 2 ? &bb : BE(1), dC[c], (size_t)M * N);
    mt_ops_cuda_get_info_of(oa->be, &ia1);
    mt_ops_cuda_get_info_of(ob->be, &ib1);
    for (int c = 0; c < 4; c++) {
        char w[120];
        snprintf(w, sizeof w, "call %d on %s: %s gemm vs cpu (rel)", c, c % 2 ? "created" : "default",
                 c % 2 ? "bf16 (rounded operands)" : "fp32");
        report("instances", w, rel_err(got[c], ref[c % 2], (size_t)M * N), 1e-5);
    }
    report("instances", "created instance's result is not fp32 (rel diff > 1e-4)",
           rel_err(got[1], ref[0], (size_t)M * N) > 1e-4 ? 0 : 1, 0);
    report("instances", "bf16 matmuls counted: default +0, created +2",
           (double)(ia1.gemm_bf16_calls - ia0.gemm_bf16_calls != 0) + (double)(ib1.gemm_bf16_calls - ib0.gemm_bf16_calls != 2), 0);
    report("instances", "info precision: default fp32, created bf16 (set by caller)",
           strcmp(ia1.precision, "fp32") != 0 || strcmp(ib1.precision, "bf16") != 0 ||
               strcmp(ib1.precision_source, "set by caller") != 0, 0);
    for (int c = 0; c < 4; c++) free(got[c]);
    release(BE(1));
    release(&bb);
    char msg[384];
    report("instances", "created instance: no CUDA error", mt_ops_cuda_status_of(ob->be, msg, sizeof msg) != MT_OK, 0);
    report("instances", "created instance: ctx bytes live after frees", (double)bb.ctx.bytes_live_total, 0);
    mt_ops_cuda_destroy(ob);
    mt_ctx_free(&bb.ctx);
    /* the default after the destroy: still fp32, still working */
    {
        struct be *b = BE(1);
        float *dA = upf(b, A, (size_t)M * K), *dB = upf(b, B, (size_t)K * N), *dc = dalloc(b, (size_t)M * N * 4);
        b->ops->gemm(b->ops->be, 0, 0, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dc, N);
        float *g = downf(b, dc, (size_t)M * N);
        release(b);
        report("instances", "default after destroying the other: fp32 gemm vs cpu (rel)", rel_err(g, ref[0], (size_t)M * N), 1e-5);
        free(g);
    }
    report("instances", "default after destroy: no CUDA error, stream live",
           (mt_ops_cuda_status(msg, sizeof msg) != MT_OK) + (mt_ops_cuda_stream() == NULL), 0);
    free(ref[0]); free(ref[1]); free(A); free(B); free(Ar); free(Br);
}

static void test_precision_api(void)
{
    report("precision", "set(bf16) ok, get() == bf16",
           (mt_ops_cuda_set_precision(MT_CUDA_PRECISION_BF16) != MT_OK) + (mt_ops_cuda_get_precision() != MT_CUDA_PRECISION_BF16), 0);
    report("precision", "set(42) refused, precision unchanged",
           (mt_ops_cuda_set_precision((enum mt_cuda_precision)42) != MT_ERR_INVALID_ARG) +
               (mt_ops_cuda_get_precision() != MT_CUDA_PRECISION_BF16), 0);
    enum mt_cuda_precision q = MT_CUDA_PRECISION_FP32;
    report("precision", "parse bf16 / fp32 / BF16 / empty",
           (mt_ops_cuda_precision_parse("bf16", &q) != MT_OK || q != MT_CUDA_PRECISION_BF16) +
               (mt_ops_cuda_precision_parse("fp32", &q) != MT_OK || q != MT_CUDA_PRECISION_FP32) +
               (mt_ops_cuda_precision_parse("BF16", &q) != MT_ERR_INVALID_ARG) +
               (mt_ops_cuda_precision_parse("", &q) != MT_ERR_INVALID_ARG), 0);
    struct mt_ops_cuda_info info;
    mt_ops_cuda_get_info(&info);
    report("precision", "info says bf16, set by caller",
           strcmp(info.precision, "bf16") != 0 || strcmp(info.precision_source, "set by caller") != 0, 0);
}

/* ---- embedding ----
 * N 300: the sort in one block's shared memory; N 40000 (P 65536: 512 KiB of
 * keys, past an H100's 227 KiB) the pass-per-launch sort over global memory,
 * and token 3's group of ~5700 rows. Both sum each row's group in token
 * order, as the cpu: the same bits */
static void embed_case(int N, int C, int V)
{
    float *wte = rnd((size_t)V * C, -1, 1), *dout = rnd((size_t)N * C, -1, 1), *dw0 = rnd((size_t)V * C, -1, 1);
    int32_t *idx = xmalloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) idx[n] = n % 7 == 0 ? 3 : irand(V);  /* token 3 repeats a lot */
    float *nout = nans((size_t)N * C);
    float *rf[3], *rb[3];
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *dw = upf(b, wte, (size_t)V * C), *o = upf(b, nout, (size_t)N * C);
        int32_t *di = upi(b, idx, N);
        b->ops->embed_forward(b->ops->be, o, di, dw, N, C);
        rf[p] = downf(b, o, (size_t)N * C);
        float *g = upf(b, dout, (size_t)N * C), *dwte = upf(b, dw0, (size_t)V * C);
        b->ops->embed_backward(b->ops->be, dwte, g, di, N, C, V);
        rb[p] = downf(b, dwte, (size_t)V * C);
        release(b);
    }
    char what[96];
    snprintf(what, sizeof what, "N=%d C=%d V=%d", N, C, V);
    check3("embed_forward", what, rf, (size_t)N * C);
    snprintf(what, sizeof what, "N=%d: dwte += (repeated tokens), bits of the cpu (differing elements)", N);
    report("embed_backward", what, (double)ndiff(rb[1], rb[0], (size_t)V * C), 0);
    snprintf(what, sizeof what, "N=%d: dwte += (repeated tokens)", N);
    check3("embed_backward", what, rb, (size_t)V * C);
    free(wte);
    free(dout);
    free(dw0);
    free(idx);
    free(nout);
}

static void test_embed(void)
{
    if (!selected("embed")) return;
    embed_case(300, 70, 50);
    embed_case(40000, 8, 50);
}

/* ---- rmsnorm ---- */
static void test_rmsnorm(void)
{
    if (!selected("rmsnorm")) return;
    int shapes[][2] = {{37, 200}, {128, 64}, {5, 1000}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t nx = (size_t)N * C;
        float *x = rnd(nx, -2, 2), *w = rnd((size_t)C, 0.5, 1.5), *dout = rnd(nx, -1, 1);
        float *dx0 = rnd(nx, -1, 1), *dw0 = rnd((size_t)C, -1, 1), *nx_ = nans(nx), *nN = nans((size_t)N);
        float *ro[3] = {0}, *rr[3] = {0}, *rdx[3] = {0}, *rdxa[3] = {0}, *rdw[3] = {0};
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dxin = upf(b, x, nx), *dw = upf(b, w, (size_t)C), *o = upf(b, nx_, nx), *rs = upf(b, nN, (size_t)N);
            b->ops->rmsnorm_forward(b->ops->be, o, rs, dxin, dw, N, C, 1e-5f);
            ro[p] = downf(b, o, nx);
            rr[p] = downf(b, rs, (size_t)N);
            /* backward from the cpu's rstd so both backends see the same saved buffer */
            float *rsc = upf(b, rr[0], (size_t)N);
            float *g = upf(b, dout, nx), *ddx = upf(b, nx_, nx), *ddw = upf(b, dw0, (size_t)C);
            b->ops->rmsnorm_backward(b->ops->be, ddx, ddw, g, dxin, dw, rsc, N, C, 0);
            rdx[p] = downf(b, ddx, nx);
            float *ddx2 = upf(b, dx0, nx);
            b->ops->rmsnorm_backward(b->ops->be, ddx2, ddw, g, dxin, dw, rsc, N, C, 1);
            rdxa[p] = downf(b, ddx2, nx);
            rdw[p] = downf(b, ddw, (size_t)C);  /* dw0 + 2 * sum */
            release(b);
        }
        char w1[96];
        snprintf(w1, sizeof w1, "N=%d C=%d out", N, C);
        check3("rmsnorm_forward", w1, ro, nx);
        snprintf(w1, sizeof w1, "N=%d C=%d rstd", N, C);
        check3("rmsnorm_forward", w1, rr, (size_t)N);
        snprintf(w1, sizeof w1, "N=%d C=%d dx (=, NaN prefill)", N, C);
        check3("rmsnorm_backward", w1, rdx, nx);
        snprintf(w1, sizeof w1, "N=%d C=%d dx (accumulate=1: +=)", N, C);
        check3("rmsnorm_backward", w1, rdxa, nx);
        snprintf(w1, sizeof w1, "N=%d C=%d dw (+=, called twice)", N, C);
        check3("rmsnorm_backward", w1, rdw, (size_t)C);
        free(x); free(w); free(dout); free(dx0); free(dw0); free(nx_); free(nN);
    }
}

/* the rotary tables (Tmax, hd/2): cos / sin of p * 10000^(-2i/hd), as the model builds them */
static void rope_tables(int Tmax, int hd, float **cs, float **sn)
{
    const int half = hd / 2;
    *cs = xmalloc(sizeof(float) * Tmax * half), *sn = xmalloc(sizeof(float) * Tmax * half);
    for (int p = 0; p < Tmax; p++)
        for (int i = 0; i < half; i++) {
            double f = pow(10000.0, -2.0 * i / hd);
            (*cs)[p * half + i] = (float)cos(p * f);
            (*sn)[p * half + i] = (float)sin(p * f);
        }
}

/* ---- rope ---- */
static void test_rope(void)
{
    if (!selected("rope")) return;
    const int B = 2, T = 13, nh = 3, hd = 16, pos0 = 5, Tmax = 32, half = hd / 2;
    const int N = B * T;
    size_t n = (size_t)N * nh * hd;
    float *cs, *sn;
    rope_tables(Tmax, hd, &cs, &sn);
    float *x = rnd(n, -1, 1), *nn = nans(n);
    float *rf[3], *ri[3], *rb[3];
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *dc = upf(b, cs, (size_t)Tmax * half), *ds = upf(b, sn, (size_t)Tmax * half);
        float *dx = upf(b, x, n), *o = upf(b, nn, n);
        b->ops->rope_forward(b->ops->be, o, dx, dc, ds, N, T, pos0, nh, hd);
        rf[p] = downf(b, o, n);
        b->ops->rope_forward(b->ops->be, dx, dx, dc, ds, N, T, pos0, nh, hd);  /* in place */
        ri[p] = downf(b, dx, n);
        b->ops->rope_backward(b->ops->be, dx, dx, dc, ds, N, T, pos0, nh, hd); /* in place, inverse */
        rb[p] = downf(b, dx, n);
        release(b);
    }
    check3("rope_forward", "pos0=5 out-of-place", rf, n);
    check3("rope_forward", "pos0=5 in place", ri, n);
    check3("rope_backward", "in place (R^T R x)", rb, n);
    free(cs); free(sn); free(x); free(nn);
}

/* ---- fused chains: rmsnorm_resid, qk_norm_rope ---- */
static void test_qk_bwd_bf16(int hd);
static void test_fused(void)
{
    if (!selected("fused")) return;
    {
        const int N = 37, C = 200;
        size_t nx = (size_t)N * C;
        float *x = rnd(nx, -2, 2), *w = rnd((size_t)C, 0.5, 1.5), *nx_ = nans(nx), *nN = nans((size_t)N);
        float *ro[3], *rr[3], *rs[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dx = upf(b, x, nx), *dw = upf(b, w, (size_t)C), *o = upf(b, nx_, nx), *r = upf(b, nN, (size_t)N);
            float *res = upf(b, nx_, nx);
            b->ops->rmsnorm_resid_forward(b->ops->be, o, r, res, dx, dw, N, C, 1e-5f);
            ro[p] = downf(b, o, nx);
            rr[p] = downf(b, r, (size_t)N);
            rs[p] = downf(b, res, nx);
            release(b);
        }
        check3("rmsnorm_resid_forward", "N=37 C=200 out", ro, nx);
        check3("rmsnorm_resid_forward", "N=37 C=200 rstd", rr, (size_t)N);
        report("rmsnorm_resid_forward", "resid == inp (differing elements)", (double)ndiff(rs[1], x, nx), 0);
        check3("rmsnorm_resid_forward", "N=37 C=200 resid", rs, nx);
        free(x); free(w); free(nx_); free(nN);
    }
    /* hd = 40: a lane's elements and a dw column block straddle the halves; K = 2 < H = 3 */
    const int B = 2, T = 11, H = 3, K = 2, hd = 40, half = hd / 2, Tmax = 16, N = B * T;
    size_t nq = (size_t)N * H * hd, nk = (size_t)N * K * hd, NH = (size_t)N * H, NK = (size_t)N * K;
    float *cs, *sn;
    rope_tables(Tmax, hd, &cs, &sn);
    float *qr = rnd(nq, -2, 2), *kr = rnd(nk, -2, 2);
    float *wq = rnd((size_t)hd, 0.5, 1.5), *wk = rnd((size_t)hd, 0.5, 1.5);
    float *gq = rnd(nq, -1, 1), *gk = rnd(nk, -1, 1), *dwq0 = rnd((size_t)hd, -1, 1), *dwk0 = rnd((size_t)hd, -1, 1);
    float *nq_ = nans(nq), *nk_ = nans(nk);
    float *rq[3], *rk[3], *rrq[3], *rrk[3], *rdq[3], *rdk[3], *rwq[3], *rwk[3], *rq5[3], *rgq[3], *rgk[3];
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *dc = upf(b, cs, (size_t)Tmax * half), *ds = upf(b, sn, (size_t)Tmax * half);
        float *dqr = upf(b, qr, nq), *dkr = upf(b, kr, nk);
        float *dwq = upf(b, wq, (size_t)hd), *dwk = upf(b, wk, (size_t)hd);
        float *q = upf(b, nq_, nq), *k = upf(b, nk_, nk), *sq = upf(b, nq_, NH), *sk = upf(b, nk_, NK);
        b->ops->qk_norm_rope_forward(b->ops->be, q, k, sq, sk, dqr, dkr, dwq, dwk, dc, ds, N, T, 0, H, K, hd, 1e-6f);
        rq[p] = downf(b, q, nq);
        rk[p] = downf(b, k, nk);
        rrq[p] = downf(b, sq, NH);
        rrk[p] = downf(b, sk, NK);
        /* backward from the cpu's rstd so both backends see the same saved buffers */
        float *sqc = upf(b, rrq[0], NH), *skc = upf(b, rrk[0], NK);
        float *dg = upf(b, gq, nq), *dgk = upf(b, gk, nk), *dx = upf(b, nq_, nq), *dxk = upf(b, nk_, nk);
        float *ddwq = upf(b, dwq0, (size_t)hd), *ddwk = upf(b, dwk0, (size_t)hd);
        b->ops->qk_norm_rope_backward(b->ops->be, dx, dxk, ddwq, ddwk, dg, dgk, dqr, dkr, dwq, dwk, sqc, skc, dc, ds, N, T, H, K,
                                      hd);
        rdq[p] = downf(b, dx, nq);
        rdk[p] = downf(b, dxk, nk);
        rwq[p] = downf(b, ddwq, (size_t)hd);
        rwk[p] = downf(b, ddwk, (size_t)hd);
        rgq[p] = downf(b, dg, nq);    /* R^T of the input, in place */
        rgk[p] = downf(b, dgk, nk);
        /* the decoding form: positions from pos0 = 5 */
        b->ops->qk_norm_rope_forward(b->ops->be, q, k, sq, sk, dqr, dkr, dwq, dwk, dc, ds, N, T, 5, H, K, hd, 1e-6f);
        rq5[p] = downf(b, q, nq);
        release(b);
    }
    check3("qk_norm_rope_forward", "hd=40 H=3 K=2 q", rq, nq);
    check3("qk_norm_rope_forward", "hd=40 H=3 K=2 k", rk, nk);
    check3("qk_norm_rope_forward", "rstd q", rrq, NH);
    check3("qk_norm_rope_forward", "rstd k", rrk, NK);
    check3("qk_norm_rope_forward", "pos0=5 q", rq5, nq);
    check3("qk_norm_rope_backward", "dq_raw (=, NaN prefill)", rdq, nq);
    check3("qk_norm_rope_backward", "dk_raw (=, NaN prefill)", rdk, nk);
    check3("qk_norm_rope_backward", "dwq (+=)", rwq, (size_t)hd);
    check3("qk_norm_rope_backward", "dwk (+=)", rwk, (size_t)hd);
    check3("qk_norm_rope_backward", "dq = R^T dq (in place)", rgq, nq);
    check3("qk_norm_rope_backward", "dk = R^T dk (in place)", rgk, nk);
    free(cs); free(sn); free(qr); free(kr); free(wq); free(wk); free(gq); free(gk); free(dwq0); free(dwk0);
    free(nq_); free(nk_);
    test_qk_bwd_bf16(40);
    test_qk_bwd_bf16(64);
}

static void qk_raw_b_case(struct be *b, int p, int hd, int N, int T, int H, int K, const float *qr, const float *kr,
                          const float *gq, const float *gk, const float *dw0, const float *dwq, const float *dwk,
                          const float *sq, const float *sk, const float *dc, const float *ds, const float *nq_);
static void qk_din_b_case(struct be *b, int p, int hd, int N, int T, int H, int K, int xb, const float *qr,
                          const float *kr, const float *gq, const float *gk, const float *dw0, const float *dwq,
                          const float *dwk, const float *sq, const float *sk, const float *dc, const float *ds,
                          const float *nq_);

/* qk_norm_rope_backward_bf16 at head dim hd (40: cuda's scalar path, 64: its
 * vector path): on each backend, d q_raw and d k_raw = bf16 of the fp32
 * entry's outputs bit for bit, dwq and dwk (+=) equal to the fp32 entry's
 * bit for bit, two runs equal */
static void test_qk_bwd_bf16(int hd)
{
    const int B = 2, T = 9, H = 4, K = 2, half = hd / 2, N = B * T;
    const size_t nq = (size_t)N * H * hd, nk = (size_t)N * K * hd, NH = (size_t)N * H, NK = (size_t)N * K;
    float *cs, *sn;
    rope_tables(T, hd, &cs, &sn);
    float *qr = rnd(nq, -2, 2), *kr = rnd(nk, -2, 2), *wq = rnd((size_t)hd, 0.5, 1.5), *wk = rnd((size_t)hd, 0.5, 1.5);
    float *gq = rnd(nq, -1, 1), *gk = rnd(nk, -1, 1), *dw0 = rnd((size_t)hd, -1, 1);
    float *rsq = rnd(NH, 0.5, 2), *rsk = rnd(NK, 0.5, 2), *nq_ = nans(nq);
    for (int p = 0; p < 2; p++) {
        struct be *b = BE(p);
        float *dc = upf(b, cs, (size_t)T * half), *ds = upf(b, sn, (size_t)T * half);
        float *dqr = upf(b, qr, nq), *dkr = upf(b, kr, nk), *dwq = upf(b, wq, (size_t)hd), *dwk = upf(b, wk, (size_t)hd);
        float *sq = upf(b, rsq, NH), *sk = upf(b, rsk, NK);
        /* the fp32 entry */
        float *dg = upf(b, gq, nq), *dgk = upf(b, gk, nk), *dx = upf(b, nq_, nq), *dxk = upf(b, nq_, nk);
        float *gwq = upf(b, dw0, (size_t)hd), *gwk = upf(b, dw0, (size_t)hd);
        b->ops->qk_norm_rope_backward(b->ops->be, dx, dxk, gwq, gwk, dg, dgk, dqr, dkr, dwq, dwk, sq, sk, dc, ds, N, T, H,
                                      K, hd);
        float *fq = downf(b, dx, nq), *fk = downf(b, dxk, nk), *fwq = downf(b, gwq, (size_t)hd);
        float *fwk = downf(b, gwk, (size_t)hd);
        /* the bf16 entry, twice */
        uint16_t *bq[2], *bk[2];
        float *bwq = NULL, *bwk = NULL;
        for (int r = 0; r < 2; r++) {
            float *eg = upf(b, gq, nq), *egk = upf(b, gk, nk), *ex = upf(b, nq_, nq), *exk = upf(b, nq_, nk);
            float *hwq = upf(b, dw0, (size_t)hd), *hwk = upf(b, dw0, (size_t)hd);
            b->ops->qk_norm_rope_backward_bf16(b->ops->be, (mt_bf16 *)ex, (mt_bf16 *)exk, hwq, hwk, eg, egk, dqr, dkr, dwq,
                                               dwk, sq, sk, dc, ds, N, T, H, K, hd, NULL, NULL, NULL, NULL, 0, 0);
            bq[r] = (uint16_t *)downi(b, (const int32_t *)ex, nq / 2);
            bk[r] = (uint16_t *)downi(b, (const int32_t *)exk, nk / 2);
            if (r == 0) bwq = downf(b, hwq, (size_t)hd), bwk = downf(b, hwk, (size_t)hd);
        }
        double bad = 0;
        for (size_t i = 0; i < nq; i++) bad += bq[0][i] != host_bf16(fq[i]);
        for (size_t i = 0; i < nk; i++) bad += bk[0][i] != host_bf16(fk[i]);
        char w[120];
        snprintf(w, sizeof w, "%s hd=%d: dq_raw, dk_raw = bf16(the fp32 entry's) (differing)", p ? "cuda" : "cpu", hd);
        report("qk_norm_rope_backward_bf16", w, bad, 0);
        snprintf(w, sizeof w, "%s hd=%d: dwq, dwk = the fp32 entry's (differing)", p ? "cuda" : "cpu", hd);
        report("qk_norm_rope_backward_bf16", w, (double)(ndiff(bwq, fwq, (size_t)hd) + ndiff(bwk, fwk, (size_t)hd)), 0);
        snprintf(w, sizeof w, "%s hd=%d: deterministic (differing)", p ? "cuda" : "cpu", hd);
        report("qk_norm_rope_backward_bf16", w, (double)(ndiff(bq[0], bq[1], nq / 2) + ndiff(bk[0], bk[1], nk / 2)), 0);
        free(fq); free(fk); free(fwq); free(fwk); free(bwq); free(bwk);
        for (int r = 0; r < 2; r++) free(bq[r]), free(bk[r]);
        /* the forward: q, k = bf16(the fp32 entry's), rstd the same bits */
        float *q32 = upf(b, nq_, nq), *k32 = upf(b, nq_, nk), *rq = upf(b, nq_, NH), *rk = upf(b, nq_, NK);
        float *rq2 = upf(b, nq_, NH), *rk2 = upf(b, nq_, NK);
        int32_t *q16 = (int32_t *)upf(b, nq_, nq / 2), *k16 = (int32_t *)upf(b, nq_, nk / 2);
        b->ops->qk_norm_rope_forward(b->ops->be, q32, k32, rq, rk, dqr, dkr, dwq, dwk, dc, ds, N, T, 0, H, K, hd, 1e-6f);
        b->ops->qk_norm_rope_forward_bf16(b->ops->be, (mt_bf16 *)q16, (mt_bf16 *)k16, rq2, rk2, dqr, dkr, dwq, dwk, dc,
                                          ds, N, T, 0, H, K, hd, 1e-6f, NULL, NULL);
        float *hq32 = downf(b, q32, nq), *hk32 = downf(b, k32, nk), *hrq = downf(b, rq, NH), *hrk = downf(b, rk, NK);
        float *hrq2 = downf(b, rq2, NH), *hrk2 = downf(b, rk2, NK);
        uint16_t *hq16 = (uint16_t *)downi(b, q16, nq / 2), *hk16 = (uint16_t *)downi(b, k16, nk / 2);
        double badf = 0;
        for (size_t i = 0; i < nq; i++) badf += hq16[i] != host_bf16(hq32[i]);
        for (size_t i = 0; i < nk; i++) badf += hk16[i] != host_bf16(hk32[i]);
        snprintf(w, sizeof w, "%s hd=%d: q, k = bf16(the fp32 entry's) (differing)", p ? "cuda" : "cpu", hd);
        report("qk_norm_rope_forward_bf16", w, badf, 0);
        snprintf(w, sizeof w, "%s hd=%d: rstd = the fp32 entry's (differing)", p ? "cuda" : "cpu", hd);
        report("qk_norm_rope_forward_bf16", w, (double)(ndiff(hrq, hrq2, NH) + ndiff(hrk, hrk2, NK)), 0);
        free(hq32); free(hk32); free(hrq); free(hrk); free(hrq2); free(hrk2); free(hq16); free(hk16);
        qk_raw_b_case(b, p, hd, N, T, H, K, qr, kr, gq, gk, dw0, dwq, dwk, sq, sk, dc, ds, nq_);
        for (int xb = 0; xb < 2; xb++) qk_din_b_case(b, p, hd, N, T, H, K, xb, qr, kr, gq, gk, dw0, dwq, dwk, sq, sk, dc, ds, nq_);
        release(b);
    }
    free(cs); free(sn); free(qr); free(kr); free(wq); free(wk); free(gq); free(gk); free(dw0); free(rsq); free(rsk);
    free(nq_);
}

/* d q, d k given as bf16 to the bf16 backward (dq_b, dk_b: the attention
 * backward's bf16-only outputs), with q_raw, k_raw as fp32 or (xb) as bf16:
 * d q_raw, d k_raw, dwq, dwk the bits of the entry given the widened values
 * as fp32 dq, dk (cuda: hd 64 the vector kernel reads them, QK_DB; hd 40 the
 * scalar path widens them first); dq, dk scratch, poisoned with NaN */
static void qk_din_b_case(struct be *b, int p, int hd, int N, int T, int H, int K, int xb, const float *qr,
                          const float *kr, const float *gq, const float *gk, const float *dw0, const float *dwq,
                          const float *dwk, const float *sq, const float *sk, const float *dc, const float *ds,
                          const float *nq_)
{
    const size_t nq = (size_t)N * H * hd, nk = (size_t)N * K * hd, n = nq + nk;
    uint16_t *gb = xmalloc(n * 2), *xr = xmalloc(n * 2);
    float *gw = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        gb[i] = host_bf16(i < nq ? gq[i] : gk[i - nq]);
        xr[i] = host_bf16(i < nq ? qr[i] : kr[i - nq]);
        const uint32_t u = (uint32_t)gb[i] << 16;
        memcpy(&gw[i], &u, 4);
    }
    const mt_bf16 *xq = xb ? (const mt_bf16 *)upf(b, (const float *)xr, n / 2) : NULL, *xk = xq ? xq + nq : NULL;
    const float *q32 = xb ? NULL : upf(b, qr, nq), *k32 = xb ? NULL : upf(b, kr, nk);
    const mt_bf16 *dinq = (const mt_bf16 *)upf(b, (const float *)gb, n / 2), *dink = dinq + nq;
    uint16_t *o[2];
    float *dw[2][2];
    for (int v = 0; v < 2; v++) {   /* v 1: d q, d k given as bf16 */
        float *eg = upf(b, v ? nq_ : gw, nq), *egk = upf(b, v ? nq_ : gw + nq, nk);
        float *hwq = upf(b, dw0, (size_t)hd), *hwk = upf(b, dw0, (size_t)hd);
        mt_bf16 *b16 = (mt_bf16 *)upf(b, nq_, n / 2);
        b->ops->qk_norm_rope_backward_bf16(b->ops->be, b16, b16 + nq, hwq, hwk, eg, egk, q32, k32, dwq, dwk, sq, sk, dc,
                                           ds, N, T, H, K, hd, xq, xk, v ? dinq : NULL, v ? dink : NULL, 0, 0);
        o[v] = (uint16_t *)downi(b, (const int32_t *)b16, n / 2);
        dw[v][0] = downf(b, hwq, (size_t)hd), dw[v][1] = downf(b, hwk, (size_t)hd);
    }
    char w[140];
    snprintf(w, sizeof w, "%s hd=%d%s: d q, d k as bf16: dq_raw, dk_raw, dwq, dwk the same bits (differing)",
             p ? "cuda" : "cpu", hd, xb ? " q_raw_b" : "");
    report("qk_norm_rope_backward_bf16", w,
           (double)(ndiff(o[0], o[1], n / 2) + ndiff(dw[0][0], dw[1][0], (size_t)hd) +
                    ndiff(dw[0][1], dw[1][1], (size_t)hd)),
           0);
    {   /* and into one buffer with rows ld apart (d q_raw at column 0, d k_raw at H hd, K hd
         * left for dv: the merged q/k/v backward's operand, ld_dq_raw, ld_dk_raw): each row
         * the dense call's, the columns between untouched (a sentinel) */
        const size_t ld = (size_t)(H + 2 * K) * hd, wq_ = (size_t)H * hd, wk_ = (size_t)K * hd;
        uint16_t *hs = xmalloc((size_t)N * ld * 2);
        for (size_t i = 0; i < (size_t)N * ld; i++) hs[i] = 0x1234;
        float *eg = upf(b, nq_, nq), *egk = upf(b, nq_, nk);
        float *hwq = upf(b, dw0, (size_t)hd), *hwk = upf(b, dw0, (size_t)hd);
        mt_bf16 *sb = (mt_bf16 *)upf(b, (const float *)hs, (size_t)N * ld / 2);
        b->ops->qk_norm_rope_backward_bf16(b->ops->be, sb, sb + wq_, hwq, hwk, eg, egk, q32, k32, dwq, dwk, sq, sk, dc,
                                           ds, N, T, H, K, hd, xq, xk, dinq, dink, (int)ld, (int)ld);
        uint16_t *st = (uint16_t *)downi(b, (const int32_t *)sb, (size_t)N * ld / 2);
        float *sw0 = downf(b, hwq, (size_t)hd), *sw1 = downf(b, hwk, (size_t)hd);
        size_t bad = ndiff(sw0, dw[1][0], (size_t)hd) + ndiff(sw1, dw[1][1], (size_t)hd);
        for (size_t r = 0; r < (size_t)N; r++) {
            bad += ndiff(st + r * ld, o[1] + r * wq_, wq_ / 2) +   /* (ndiff counts 4-byte pairs) */
                   ndiff(st + r * ld + wq_, o[1] + nq + r * wk_, wk_ / 2);
            for (size_t c = wq_ + wk_; c < ld; c++) bad += st[r * ld + c] != 0x1234;
        }
        snprintf(w, sizeof w, "%s hd=%d%s: rows ld apart: the dense call's rows and dw, the gap untouched (differing)",
                 p ? "cuda" : "cpu", hd, xb ? " q_raw_b" : "");
        report("qk_norm_rope_backward_bf16", w, (double)bad, 0);
        free(hs); free(st); free(sw0); free(sw1);
    }
    for (int v = 0; v < 2; v++) free(o[v]), free(dw[v][0]), free(dw[v][1]);
    free(gb); free(xr); free(gw);
}

/* q_raw, k_raw given as bf16 (q_raw_b, k_raw_b: their GEMMs' bf16 outputs) to
 * both bf16 entries: the bits of the entries given the widened values as fp32
 * (q, k or d q_raw, d k_raw; rstd; dwq, dwk) */
static void qk_raw_b_case(struct be *b, int p, int hd, int N, int T, int H, int K, const float *qr, const float *kr,
                          const float *gq, const float *gk, const float *dw0, const float *dwq, const float *dwk,
                          const float *sq, const float *sk, const float *dc, const float *ds, const float *nq_)
{
    const size_t nq = (size_t)N * H * hd, nk = (size_t)N * K * hd, NH = (size_t)N * H, NK = (size_t)N * K;
    uint16_t *hb = xmalloc((nq + nk) * 2);
    float *hw = xmalloc((nq + nk) * 4);
    for (size_t i = 0; i < nq + nk; i++) {
        hb[i] = host_bf16(i < nq ? qr[i] : kr[i - nq]);
        const uint32_t u = (uint32_t)hb[i] << 16;
        memcpy(&hw[i], &u, 4);
    }
    float *w32 = upf(b, hw, nq + nk), *w16 = upf(b, (const float *)hb, (nq + nk) / 2);
    const mt_bf16 *qb = (const mt_bf16 *)w16, *kb = qb + nq;
    uint16_t *o[2][2];
    float *r[2][4];
    for (int v = 0; v < 2; v++) {   /* v 1: given as bf16 */
        /* each side's q and k outputs in one buffer (k's after q's nq bf16) */
        mt_bf16 *f16 = (mt_bf16 *)upf(b, nq_, (nq + nk) / 2), *b16 = (mt_bf16 *)upf(b, nq_, (nq + nk) / 2);
        float *rq = upf(b, nq_, NH), *rk = upf(b, nq_, NK);
        b->ops->qk_norm_rope_forward_bf16(b->ops->be, f16, f16 + nq, rq, rk, v ? NULL : w32, v ? NULL : w32 + nq, dwq,
                                          dwk, dc, ds, N, T, 0, H, K, hd, 1e-6f, v ? qb : NULL, v ? kb : NULL);
        float *eg = upf(b, gq, nq), *egk = upf(b, gk, nk);
        float *hwq = upf(b, dw0, (size_t)hd), *hwk = upf(b, dw0, (size_t)hd);
        b->ops->qk_norm_rope_backward_bf16(b->ops->be, b16, b16 + nq, hwq, hwk, eg, egk, v ? NULL : w32,
                                           v ? NULL : w32 + nq, dwq, dwk, sq, sk, dc, ds, N, T, H, K, hd,
                                           v ? qb : NULL, v ? kb : NULL, NULL, NULL, 0, 0);
        o[v][0] = (uint16_t *)downi(b, (const int32_t *)f16, (nq + nk) / 2);
        o[v][1] = (uint16_t *)downi(b, (const int32_t *)b16, (nq + nk) / 2);
        r[v][0] = downf(b, rq, NH), r[v][1] = downf(b, rk, NK);
        r[v][2] = downf(b, hwq, (size_t)hd), r[v][3] = downf(b, hwk, (size_t)hd);
    }
    char w[120];
    snprintf(w, sizeof w, "%s hd=%d: q_raw, k_raw as bf16: q, k, rstd the bits of the widened fp32 (differing)",
             p ? "cuda" : "cpu", hd);
    report("qk_norm_rope_forward_bf16", w,
           (double)(ndiff(o[0][0], o[1][0], (nq + nk) / 2) + ndiff(r[0][0], r[1][0], NH) + ndiff(r[0][1], r[1][1], NK)),
           0);
    snprintf(w, sizeof w, "%s hd=%d: q_raw, k_raw as bf16: dq_raw, dk_raw, dwq, dwk the same bits (differing)",
             p ? "cuda" : "cpu", hd);
    report("qk_norm_rope_backward_bf16", w,
           (double)(ndiff(o[0][1], o[1][1], (nq + nk) / 2) + ndiff(r[0][2], r[1][2], (size_t)hd) +
                    ndiff(r[0][3], r[1][3], (size_t)hd)),
           0);
    for (int v = 0; v < 2; v++) {
        free(o[v][0]); free(o[v][1]);
        for (int k = 0; k < 4; k++) free(r[v][k]);
    }
    free(hb); free(hw);
}

/* ---- attention ---- */
static void test_attention(void)
{
    if (!selected("attention")) return;
    struct { int B, Tq, Tk, q_pos0, H, K, hd, bwd; const char *what; } cs[] = {
        {2, 70, 70, 0, 4, 2, 40, 1, "train B=2 T=70 H=4 K=2 hd=40"},
        {1, 33, 33, 0, 2, 2, 64, 1, "train B=1 T=33 H=2 K=2 hd=64"},
        {1, 40, 40, 0, 2, 1, 128, 1, "train B=1 T=40 H=2 K=1 hd=128"},
        {1, 20, 20, 0, 1, 1, 200, 1, "train B=1 T=20 H=1 K=1 hd=200"},
        {2, 1, 50, 49, 4, 2, 32, 0, "decode Tq=1 Tk=50 q_pos0=49"},
        {1, 7, 45, 38, 4, 4, 48, 0, "prefill chunk Tq=7 Tk=45 q_pos0=38"},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int B = cs[c].B, Tq = cs[c].Tq, Tk = cs[c].Tk, H = cs[c].H, K = cs[c].K, hd = cs[c].hd;
        size_t nq = (size_t)B * Tq * H * hd, nk = (size_t)B * Tk * K * hd, nl = (size_t)B * H * Tq;
        float *q = rnd(nq, -1, 1), *k = rnd(nk, -1, 1), *v = rnd(nk, -1, 1), *dout = rnd(nq, -1, 1);
        float *nQ = nans(nq), *nK = nans(nk), *nL = nans(nl);
        float *ro[3] = {0}, *rl[3] = {0}, *rdq[3] = {0}, *rdk[3] = {0}, *rdv[3] = {0};
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dq_ = upf(b, q, nq), *dk_ = upf(b, k, nk), *dv_ = upf(b, v, nk);
            float *o = upf(b, nQ, nq), *l = upf(b, nL, nl);
            b->ops->attention_forward(b->ops->be, o, l, dq_, dk_, dv_, B, Tq, Tk, cs[c].q_pos0, H, K, hd);
            ro[p] = downf(b, o, nq);
            rl[p] = downf(b, l, nl);
            if (cs[c].bwd) {
                /* backward from the cpu's out/lse: both backends see the same saved buffers */
                float *oc = upf(b, ro[0], nq), *lc = upf(b, rl[0], nl), *g = upf(b, dout, nq);
                float *gq = upf(b, nQ, nq), *gk = upf(b, nK, nk), *gv = upf(b, nK, nk);
                b->ops->attention_backward(b->ops->be, gq, gk, gv, g, dq_, dk_, dv_, oc, lc, B, Tq, H, K, hd);
                rdq[p] = downf(b, gq, nq);
                rdk[p] = downf(b, gk, nk);
                rdv[p] = downf(b, gv, nk);
            }
            release(b);
        }
        char w[128];
        snprintf(w, sizeof w, "%s out", cs[c].what);
        check3("attention_forward", w, ro, nq);
        snprintf(w, sizeof w, "%s lse", cs[c].what);
        check3("attention_forward", w, rl, nl);
        if (cs[c].bwd) {
            snprintf(w, sizeof w, "%s dq (=)", cs[c].what);
            check3("attention_backward", w, rdq, nq);
            snprintf(w, sizeof w, "%s dk (=)", cs[c].what);
            check3("attention_backward", w, rdk, nk);
            snprintf(w, sizeof w, "%s dv (=)", cs[c].what);
            check3("attention_backward", w, rdv, nk);
        }
        free(q); free(k); free(v); free(dout); free(nQ); free(nK); free(nL);
    }
}

/* ---- swiglu ---- */
static void test_swiglu(void)
{
    if (!selected("swiglu")) return;
    const size_t n = 10007;
    float *g = rnd(n, -6, 6), *u = rnd(n, -2, 2), *dout = rnd(n, -1, 1), *nn = nans(n);
    float *rf[3], *rg[3], *ru[3], *rgi[3], *rui[3];
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *dg = upf(b, g, n), *du = upf(b, u, n), *o = upf(b, nn, n), *dd = upf(b, dout, n);
        b->ops->swiglu_forward(b->ops->be, o, dg, du, n);
        rf[p] = downf(b, o, n);
        float *gg = upf(b, nn, n), *gu = upf(b, nn, n);
        b->ops->swiglu_backward(b->ops->be, gg, gu, dd, dg, du, n);
        rg[p] = downf(b, gg, n);
        ru[p] = downf(b, gu, n);
        b->ops->swiglu_backward(b->ops->be, dg, du, dd, dg, du, n);  /* in place: dgate = gate, dup = up */
        rgi[p] = downf(b, dg, n);
        rui[p] = downf(b, du, n);
        release(b);
    }
    check3("swiglu_forward", "n=10007", rf, n);
    check3("swiglu_backward", "dgate (=)", rg, n);
    check3("swiglu_backward", "dup (=)", ru, n);
    check3("swiglu_backward", "dgate in place", rgi, n);
    check3("swiglu_backward", "dup in place", rui, n);
    free(g); free(u); free(dout); free(nn);
}

/* ---- ReDo scores (redo_score_acc): integers, so cuda must equal cpu exactly ----
 * acc (+=) starts from the same values on both; act has a NaN, values past
 * the clamp and exact zeros; F = 45 leaves a partial 32-column group, 1001
 * rows a partial lane; a second call accumulates onto the first. */
static void test_redo(void)
{
    if (!selected("redo")) return;
    const size_t rows = 1001;
    const int F = 45;
    const size_t n = rows * (size_t)F;
    float *act = rnd(n, -3, 3);
    act[7] = NAN;
    act[100] = 1e6f;
    act[101] = -7e4f;
    act[200] = 0.0f;
    act[201] = -0.0f;
    int64_t init[45], *r[3];
    for (int j = 0; j < F; j++) init[j] = (int64_t)(next_u64() >> 20);
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *d = upf(b, act, n);
        int64_t *acc = dalloc(b, sizeof init);
        b->ops->copy_from_host(b->ops->be, acc, init, sizeof init);
        b->ops->redo_score_acc(b->ops->be, acc, d, rows, F);
        b->ops->redo_score_acc(b->ops->be, acc, d + F, rows - 1, F);   /* += again, from row 1 */
        r[p] = xmalloc(sizeof init);
        b->ops->sync(b->ops->be);
        b->ops->copy_to_host(b->ops->be, r[p], acc, sizeof init);
        release(b);
    }
    /* the host reference of the cpu pass: the fixed point of mt_ops.h, row by row */
    size_t bad = 0;
    for (int j = 0; j < F; j++) {
        int64_t e = init[j];
        for (size_t i = 0; i < rows; i++) e += mt_redo_fix(act[i * F + j]);
        for (size_t i = 1; i < rows; i++) e += mt_redo_fix(act[i * F + j]);
        bad += e != r[0][j];
    }
    report("redo_score_acc", "cpu = host fixed-point sums (differing units)", (double)bad, 0);
    report("redo_score_acc", "cuda = cpu, int64 (differing units)", (double)ndiff(r[1], r[0], 2 * (size_t)F), 0);
    report("redo_score_acc", "deterministic (differing units)", (double)ndiff(r[1], r[2], 2 * (size_t)F), 0);
    for (int p = 0; p < 3; p++) free(r[p]);
    free(act);
}

/* ---- cast_bf16_multi (the shadow refresh): 40 tensors, more than one
 * launch's MT_OPS_LIST_MAX, views 0-3 elements off 16 bytes (vector and
 * scalar paths in one launch), lengths 0, 1, 7, 8 and longer with a tail:
 * every element = the host's rounding, on both backends, and nothing
 * between the views written (the gaps keep their 0xffff fill) */
static void test_cast_multi(void)
{
    if (!selected("cast_bf16_multi")) return;
    enum { NT = 40 };
    size_t off[NT], len[NT], at = 0;
    for (int t = 0; t < NT; t++) {
        static const size_t L[] = {0, 1, 7, 8, 1003, 4096, 333, 20};
        off[t] = at + (size_t)(t % 4);
        len[t] = L[t % 8] + (size_t)(t / 8);
        at = off[t] + len[t] + 5;
    }
    float *h = rnd(at, -50, 50);
    for (int k = 0; k < 2; k++) {
        struct be *b = BE(k);
        float *G = upf(b, h, at);
        uint16_t *CB = dalloc(b, at * 2), *fill = xmalloc(at * 2), *out = xmalloc(at * 2);
        memset(fill, 0xff, at * 2);
        b->ops->copy_from_host(b->ops->be, CB, fill, at * 2);
        mt_bf16 *dst[NT];
        const float *src[NT];
        for (int t = 0; t < NT; t++) dst[t] = CB + off[t], src[t] = G + off[t];
        b->ops->cast_bf16_multi(b->ops->be, dst, src, len, NT);
        b->ops->copy_to_host(b->ops->be, out, CB, at * 2);
        size_t bad = 0, touched = 0, t = 0;
        for (size_t i = 0; i < at; i++) {
            while (t < NT && i >= off[t] + len[t]) t++;
            if (t < NT && i >= off[t]) bad += out[i] != host_bf16(h[i]);
            else touched += out[i] != 0xffff;
        }
        char w[128];
        snprintf(w, sizeof w, "%s: 40 tensors = host rounding, gaps untouched (differing)", k ? "cuda" : "cpu");
        report("cast_bf16_multi", w, (double)(bad + touched), 0);
        free(fill); free(out);
        release(b);
    }
    free(h);
}

/* ---- adamw_multi with shadows (precision=bf16: pb[t] = cast_bf16 of the
 * updated p[t], mt_ops.h): 40 tensors (two launches of MT_OPS_LIST_MAX),
 * views 0-3 elements off 16 bytes (p's vector and scalar paths) and shadows
 * 0-3 off 8 bytes (the bf16x4 store and the scalar one), lengths 0, 1, 7,
 * 8 and longer with a tail, every 5th shadow NULL, the clip's scale on, one
 * NaN and one inf in p. Per backend: p, m, v == adamw_multi without shadows
 * (bits); each shadow == the host's rounding of that backend's updated p
 * (bits, NaN canonical) and == its cast_bf16_multi; nothing else of the
 * shadow buffer written (the gaps and the NULL ones keep 0xffff). cuda vs
 * cpu: p, m, v to TOL (test_optim's bound), deterministic. */
static void test_adamw_multi(void)
{
    if (!selected("adamw_multi")) return;
    enum { NT = 40 };
    size_t off[NT], soff[NT], len[NT], at = 0, sat = 0;
    for (int t = 0; t < NT; t++) {
        static const size_t L[] = {0, 1, 7, 8, 1003, 4096, 333, 20};
        off[t] = at + (size_t)(t % 4);
        soff[t] = sat + (size_t)((t / 4) % 4);
        len[t] = L[t % 8] + (size_t)(t / 8);
        at = off[t] + len[t] + 5;
        sat = soff[t] + len[t] + 3;
    }
    float *hp = rnd(at, -1, 1), *hg = rnd(at, -1, 1), *hm = rnd(at, -0.1, 0.1), *hv = rnd(at, 0, 0.01);
    hp[off[4] + 2] = NAN, hp[off[4] + 9] = INFINITY;
    float wd[NT];
    for (int t = 0; t < NT; t++) wd[t] = t % 3 ? 0.1f : 0.0f;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bc1 = 1.0f - 0.9f * 0.9f * 0.9f,
                bc2 = 1.0f - 0.95f * 0.95f * 0.95f, gs = 0.3719f;
    float *rp[3], *rm[3], *rv[3];
    for (int k = 0; k < 3; k++) {
        struct be *b = BE(k);
        const char *bn = k ? "cuda" : "cpu";
        float *P = upf(b, hp, at), *G = upf(b, hg, at), *M = upf(b, hm, at), *V = upf(b, hv, at);
        float *P2 = upf(b, hp, at), *M2 = upf(b, hm, at), *V2 = upf(b, hv, at);
        uint16_t *SB = dalloc(b, sat * 2), *CB = dalloc(b, sat * 2), *fill = xmalloc(sat * 2), *out = xmalloc(sat * 2),
                 *cast = xmalloc(sat * 2);
        memset(fill, 0xff, sat * 2);
        b->ops->copy_from_host(b->ops->be, SB, fill, sat * 2);
        float *p[NT], *m[NT], *v[NT], *p2[NT], *m2[NT], *v2[NT];
        const float *g[NT], *pc[NT];
        mt_bf16 *pb[NT], *cb[NT];
        for (int t = 0; t < NT; t++) {
            p[t] = P + off[t], m[t] = M + off[t], v[t] = V + off[t], g[t] = G + off[t];
            p2[t] = P2 + off[t], m2[t] = M2 + off[t], v2[t] = V2 + off[t];
            pb[t] = t % 5 == 4 ? NULL : SB + soff[t];
            cb[t] = CB + soff[t], pc[t] = p[t];
        }
        b->ops->adamw_multi(b->ops->be, p2, NULL, g, m2, v2, len, wd, NT, lr, b1, b2, eps, bc1, bc2, gs);
        b->ops->adamw_multi(b->ops->be, p, pb, g, m, v, len, wd, NT, lr, b1, b2, eps, bc1, bc2, gs);
        b->ops->cast_bf16_multi(b->ops->be, cb, pc, len, NT);
        rp[k] = downf(b, P, at), rm[k] = downf(b, M, at), rv[k] = downf(b, V, at);
        float *q2 = downf(b, P2, at), *n2 = downf(b, M2, at), *w2 = downf(b, V2, at);
        b->ops->copy_to_host(b->ops->be, out, SB, sat * 2);
        b->ops->copy_to_host(b->ops->be, cast, CB, sat * 2);
        size_t host = 0, viacast = 0, touched = 0, t = 0;
        for (size_t i = 0; i < sat; i++) {
            while (t < NT && i >= soff[t] + len[t]) t++;
            if (t < NT && i >= soff[t] && pb[t]) {
                host += out[i] != host_bf16(rp[k][off[t] + (i - soff[t])]);
                viacast += out[i] != cast[i];
            } else touched += out[i] != 0xffff;
        }
        char w[128];
        snprintf(w, sizeof w, "%s: p, m, v == without shadows (differing)", bn);
        if (k < 2)
            report("adamw_multi", w, (double)(ndiff(rp[k], q2, at) + ndiff(rm[k], n2, at) + ndiff(rv[k], w2, at)), 0);
        snprintf(w, sizeof w, "%s: shadows == host bf16 of updated p (differing)", bn);
        if (k < 2) report("adamw_multi", w, (double)host, 0);
        snprintf(w, sizeof w, "%s: shadows == cast_bf16_multi of p (differing)", bn);
        if (k < 2) report("adamw_multi", w, (double)viacast, 0);
        snprintf(w, sizeof w, "%s: gaps, NULL shadows untouched (differing)", bn);
        if (k < 2) report("adamw_multi", w, (double)touched, 0);
        free(q2); free(n2); free(w2); free(fill); free(out); free(cast);
        release(b);
    }
    /* the NaN and inf of tensor 4 make p non-finite there: compare the rest to TOL */
    for (int k = 0; k < 3; k++) rp[k][off[4] + 2] = rp[k][off[4] + 9] = 0.0f;
    check3("adamw_multi", "p (cuda vs cpu, shadows on)", rp, at);
    check3("adamw_multi", "m", rm, at);
    check3("adamw_multi", "v", rv, at);
    free(hp); free(hg); free(hm); free(hv);
}

/* ---- vectorised elementwise kernels (docs/cuda.md "Vectorised elementwise kernels") ----
 * swiglu forward (plain and _bf16), swiglu backward (and in place),
 * cast_bf16 and widen_bf16 take the 16-byte vector path on aligned buffers
 * and the scalar form on views one element off: both must give the same
 * bits (the vector path is a layout change, not new math). n = 10007 leaves
 * a tail after the 4- and 8-wide groups. cast / widen are also exact
 * against the host's rounding. swiglu_forward_bf16 with out = NULL writes
 * the twin alone: the same bits on both paths. swiglu_backward_bf16 is
 * bf16 of swiglu_backward's dg, du (host rounding of the plain op's bits)
 * on both paths, and on the scalar path when only dup_b is one element off.
 * swiglu_backward_act_bf16 is bf16 of swiglu_forward's out and of
 * swiglu_backward's dg, du on both paths, and with only act_b one element
 * off (the other two aligned: the scalar path). */
static uint16_t host_bf16(float f);
static void test_vec_elementwise(void)
{
    if (!selected("vec")) return;
    const size_t n = 10007, m = n + 1;
    float *g = rnd(m, -6, 6), *u = rnd(m, -2, 2), *d = rnd(m, -1, 1);
    struct be *b = BE(1);
    float *o[2], *po[2], *dg[2], *du[2], *ig[2], *iu[2], *wd[2];
    uint16_t *tw[2], *cb[2], *tn[2], *bg[2], *bu[2], *bm[2], *fa[2], *fg[2], *fu[2], *fm[2];
    float *hg = xmalloc(m * 4), *hu = xmalloc(m * 4), *hd = xmalloc(m * 4);
    size_t fbad2 = 0;   /* the act_b-off call's dg, du unlike the aligned call's (whole buffers) */
    for (int off = 0; off < 2; off++) {
        /* the same n inputs at element `off` of the device buffers */
        memset(hg, 0, m * 4); memset(hu, 0, m * 4); memset(hd, 0, m * 4);
        memcpy(hg + off, g, n * 4); memcpy(hu + off, u, n * 4); memcpy(hd + off, d, n * 4);
        float *G = upf(b, hg, m), *U = upf(b, hu, m), *D = upf(b, hd, m), *IG = upf(b, hg, m), *IU = upf(b, hu, m);
        float *O = dalloc(b, m * 4), *PO = dalloc(b, m * 4), *DG = dalloc(b, m * 4), *DU = dalloc(b, m * 4);
        float *WD = dalloc(b, m * 4);
        uint16_t *TW = dalloc(b, m * 2), *CB = dalloc(b, m * 2), *TN = dalloc(b, m * 2);
        uint16_t *BG = dalloc(b, m * 2), *BU = dalloc(b, m * 2), *BM = dalloc(b, m * 2);
        uint16_t *FA = dalloc(b, m * 2), *FG = dalloc(b, m * 2), *FU = dalloc(b, m * 2), *FM = dalloc(b, m * 2);
        uint16_t *FG2 = dalloc(b, m * 2), *FU2 = dalloc(b, m * 2);
        b->ops->swiglu_forward_bf16(b->ops->be, O + off, TW + off, G + off, U + off, n);
        b->ops->swiglu_forward_bf16(b->ops->be, NULL, TN + off, G + off, U + off, n);
        b->ops->swiglu_forward(b->ops->be, PO + off, G + off, U + off, n);
        b->ops->swiglu_backward(b->ops->be, DG + off, DU + off, D + off, G + off, U + off, n);
        b->ops->swiglu_backward(b->ops->be, IG + off, IU + off, D + off, IG + off, IU + off, n);  /* in place */
        b->ops->swiglu_backward_bf16(b->ops->be, BG + off, BU + off, D + off, G + off, U + off, n);
        /* dgate_b at BG + off again, dup_b at the other offset: one output off alone takes the scalar path */
        b->ops->swiglu_backward_bf16(b->ops->be, BG + off, BM + (1 - off), D + off, G + off, U + off, n);
        b->ops->swiglu_backward_act_bf16(b->ops->be, FA + off, FG + off, FU + off, D + off, G + off, U + off, n);
        /* act_b alone at the other offset: the scalar path (dg, du into their own buffers, checked equal) */
        b->ops->swiglu_backward_act_bf16(b->ops->be, FM + (1 - off), FG2 + off, FU2 + off, D + off, G + off, U + off, n);
        b->ops->cast_bf16(b->ops->be, CB + off, G + off, n);
        b->ops->widen_bf16(b->ops->be, WD + off, CB + off, n);
        o[off] = downf(b, O + off, n);
        po[off] = downf(b, PO + off, n);
        dg[off] = downf(b, DG + off, n);
        du[off] = downf(b, DU + off, n);
        ig[off] = downf(b, IG + off, n);
        iu[off] = downf(b, IU + off, n);
        wd[off] = downf(b, WD + off, n);
        tw[off] = xmalloc(n * 2);
        cb[off] = xmalloc(n * 2);
        tn[off] = xmalloc(n * 2);
        b->ops->copy_to_host(b->ops->be, tw[off], TW + off, n * 2);
        b->ops->copy_to_host(b->ops->be, tn[off], TN + off, n * 2);
        b->ops->copy_to_host(b->ops->be, cb[off], CB + off, n * 2);
        bg[off] = xmalloc(n * 2);
        bu[off] = xmalloc(n * 2);
        bm[off] = xmalloc(n * 2);
        b->ops->copy_to_host(b->ops->be, bg[off], BG + off, n * 2);
        b->ops->copy_to_host(b->ops->be, bu[off], BU + off, n * 2);
        b->ops->copy_to_host(b->ops->be, bm[off], BM + (1 - off), n * 2);
        fa[off] = xmalloc(n * 2);
        fg[off] = xmalloc(n * 2);
        fu[off] = xmalloc(n * 2);
        fm[off] = xmalloc(n * 2);
        uint16_t *fg2 = xmalloc(n * 2), *fu2 = xmalloc(n * 2);
        b->ops->copy_to_host(b->ops->be, fa[off], FA + off, n * 2);
        b->ops->copy_to_host(b->ops->be, fg[off], FG + off, n * 2);
        b->ops->copy_to_host(b->ops->be, fu[off], FU + off, n * 2);
        b->ops->copy_to_host(b->ops->be, fm[off], FM + (1 - off), n * 2);
        b->ops->copy_to_host(b->ops->be, fg2, FG2 + off, n * 2);
        b->ops->copy_to_host(b->ops->be, fu2, FU2 + off, n * 2);
        fbad2 += (size_t)(memcmp(fg2, fg[off], n * 2) != 0) + (size_t)(memcmp(fu2, fu[off], n * 2) != 0);
        free(fg2); free(fu2);
        release(b);
    }
    size_t tbad = 0, cbad = 0, wbad = 0, nbad = 0, bbad = 0, fbad = fbad2;
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            bbad += bg[k][i] != host_bf16(dg[0][i]) || bu[k][i] != host_bf16(du[0][i]) || bm[k][i] != bu[k][i];
            fbad += fa[k][i] != host_bf16(po[0][i]) || fg[k][i] != host_bf16(dg[0][i]) ||
                    fu[k][i] != host_bf16(du[0][i]) || fm[k][i] != fa[k][i];
        }
        tbad += tw[0][i] != host_bf16(o[0][i]) || tw[1][i] != tw[0][i];
        nbad += tn[0][i] != tw[0][i] || tn[1][i] != tw[0][i];
        cbad += cb[0][i] != host_bf16(g[i]) || cb[1][i] != cb[0][i];
        uint32_t bits = (uint32_t)cb[0][i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        wbad += memcmp(&wd[0][i], &f, 4) != 0 || memcmp(&wd[1][i], &f, 4) != 0;
    }
    report("vec_elementwise", "swiglu_forward vector = scalar path (differing bits, n=10007)",
           (double)(ndiff(po[0], po[1], n) + ndiff(o[0], o[1], n) + ndiff(o[0], po[0], n)), 0);
    report("vec_elementwise", "swiglu_forward_bf16 twin = bf16(out), vector = scalar (differing)", (double)tbad, 0);
    report("vec_elementwise", "swiglu_forward_bf16 out = NULL: the same twin, both paths (differing)", (double)nbad, 0);
    report("vec_elementwise", "swiglu_backward vector = scalar path (differing bits)",
           (double)(ndiff(dg[0], dg[1], n) + ndiff(du[0], du[1], n)), 0);
    report("vec_elementwise", "swiglu_backward in place = out of place, both paths (differing bits)",
           (double)(ndiff(ig[0], dg[0], n) + ndiff(iu[0], du[0], n) + ndiff(ig[1], dg[1], n) + ndiff(iu[1], du[1], n)), 0);
    report("vec_elementwise", "swiglu_backward_bf16 = bf16(swiglu_backward), both paths, dup_b alone off (differing)",
           (double)bbad, 0);
    report("vec_elementwise", "swiglu_backward_act_bf16 = bf16(swiglu_forward), bf16(swiglu_backward), both paths, act_b alone off (differing)",
           (double)fbad, 0);
    report("vec_elementwise", "cast_bf16 = host rounding, vector = scalar (differing)", (double)cbad, 0);
    report("vec_elementwise", "widen_bf16 exact, vector = scalar (differing)", (double)wbad, 0);
    for (int k = 0; k < 2; k++) {
        free(o[k]); free(po[k]); free(dg[k]); free(du[k]); free(ig[k]); free(iu[k]); free(wd[k]); free(tw[k]); free(cb[k]); free(tn[k]);
        free(bg[k]); free(bu[k]); free(bm[k]); free(fa[k]); free(fg[k]); free(fu[k]); free(fm[k]);
    }
    free(g); free(u); free(d); free(hg); free(hu); free(hd);
}

/* ---- xent ---- */
static void test_xent(void)
{
    if (!selected("xent")) return;
    /* cuda: rows of V <= 58112 run the one-pass ROW kernel (xent.cu; V 999: scalar
     * loads, not 16-byte rows), V 60000 the two-kernel path */
    struct { int N, V; float cap; } cs[] = {{37, 1000, 0.0f}, {37, 1000, 15.0f}, {4, 50304, 0.0f}, {3, 50304, 30.0f},
                                            {9, 999, 0.0f}, {5, 999, 20.0f}, {2, 60000, 0.0f}, {2, 60000, 25.0f}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int N = cs[c].N, V = cs[c].V;
        size_t nz = (size_t)N * V;
        float *z = rnd(nz, -20, 20), *nz_ = nans(nz), *nN = nans((size_t)N);
        int32_t *t = xmalloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) t[n] = n % 5 == 3 ? -1 : irand(V);
        float dscale = 1.0f / (float)N;
        float *rl[3] = {0}, *rs[3] = {0}, *rd[3] = {0}, *ri[3] = {0};
        float *fl3[3] = {0}, *fs3[3] = {0}, *fd3[3] = {0};   /* xent_fused */
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dz = upf(b, z, nz), *loss = upf(b, nN, (size_t)N), *lse = upf(b, nN, (size_t)N);
            int32_t *dt = upi(b, t, N);
            b->ops->xent_forward(b->ops->be, loss, lse, dz, dt, N, V, cs[c].cap);
            rl[p] = downf(b, loss, (size_t)N);
            rs[p] = downf(b, lse, (size_t)N);
            float *lc = upf(b, rs[0], (size_t)N), *g = upf(b, nz_, nz);
            b->ops->xent_backward(b->ops->be, g, dz, lc, dt, dscale, N, V, cs[c].cap);
            rd[p] = downf(b, g, nz);
            b->ops->xent_backward(b->ops->be, dz, dz, lc, dt, dscale, N, V, cs[c].cap);  /* in place */
            ri[p] = downf(b, dz, nz);
            /* xent_fused (loss, lse, dlogits in place over fresh logits): cuda's ROW kernel
             * or its two kernels against the cpu's */
            float *fz = upf(b, z, nz);
            b->ops->xent_fused(b->ops->be, loss, lse, fz, dt, dscale, N, V, cs[c].cap);
            fl3[p] = downf(b, loss, (size_t)N);
            fs3[p] = downf(b, lse, (size_t)N);
            fd3[p] = downf(b, fz, nz);
            release(b);
        }
        char w[96];
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g losses", N, V, cs[c].cap);
        check3("xent_forward", w, rl, (size_t)N);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g lse", N, V, cs[c].cap);
        check3("xent_forward", w, rs, (size_t)N);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g dlogits (=)", N, V, cs[c].cap);
        check3("xent_backward", w, rd, nz);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g in place", N, V, cs[c].cap);
        check3("xent_backward", w, ri, nz);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g losses", N, V, cs[c].cap);
        check3("xent_fused", w, fl3, (size_t)N);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g lse", N, V, cs[c].cap);
        check3("xent_fused", w, fs3, (size_t)N);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g dlogits (in place)", N, V, cs[c].cap);
        check3("xent_fused", w, fd3, nz);
        /* xent_fused_bf16 (the lm head's bf16 dlogits): losses and lse = xent_fused's
         * bits on the same backend; the twin = bf16(xent_fused's dlogits) exactly */
        size_t tbad = 0, lbad = 0;
        for (int p = 0; p < 2; p++) {
            struct be *b = BE(p);
            float *fz = upf(b, z, nz), *fl = upf(b, nN, (size_t)N), *fs = upf(b, nN, (size_t)N);
            float *bz = upf(b, z, nz), *bl = upf(b, nN, (size_t)N), *bs = upf(b, nN, (size_t)N);
            int32_t *dt = upi(b, t, N);
            uint16_t *db = dalloc(b, nz * 2);
            b->ops->xent_fused(b->ops->be, fl, fs, fz, dt, dscale, N, V, cs[c].cap);
            b->ops->xent_fused_bf16(b->ops->be, bl, bs, bz, db, dt, dscale, N, V, cs[c].cap);
            float *hf = downf(b, fz, nz), *a1 = downf(b, fl, (size_t)N), *a2 = downf(b, bl, (size_t)N);
            float *s1 = downf(b, fs, (size_t)N), *s2 = downf(b, bs, (size_t)N);
            uint16_t *hb = xmalloc(nz * 2);
            b->ops->copy_to_host(b->ops->be, hb, db, nz * 2);
            for (size_t i = 0; i < nz; i++) tbad += hb[i] != host_bf16(hf[i]);
            lbad += ndiff(a1, a2, (size_t)N) + ndiff(s1, s2, (size_t)N);
            free(hf); free(a1); free(a2); free(s1); free(s2); free(hb);
            release(b);
        }
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g losses, lse = xent_fused (cpu and cuda, differing)", N, V, cs[c].cap);
        report("xent_fused_bf16", w, (double)lbad, 0);
        snprintf(w, sizeof w, "N=%d V=%d softcap=%g twin = bf16(xent_fused dlogits) (cpu and cuda, differing)", N, V,
                 cs[c].cap);
        report("xent_fused_bf16", w, (double)tbad, 0);
        free(z); free(nz_); free(nN); free(t);
    }
}

/* ---- MoE router ---- */
static void test_router(void)
{
    if (!selected("router")) return;
    int shapes[][3] = {{70, 8, 2}, {33, 16, 4}, {10, 4, 1}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
        size_t ne = (size_t)N * E, nk = (size_t)N * k;
        /* well-separated logits (a permutation of a grid plus small noise): top-k has no near ties */
        float *z = xmalloc(sizeof(float) * ne);
        for (int n = 0; n < N; n++) {
            for (int e = 0; e < E; e++) z[(size_t)n * E + e] = (float)e * 0.37f;
            for (int e = E - 1; e > 0; e--) {
                int j = irand(e + 1);
                float tmp = z[(size_t)n * E + e];
                z[(size_t)n * E + e] = z[(size_t)n * E + j];
                z[(size_t)n * E + j] = tmp;
            }
            for (int e = 0; e < E; e++) z[(size_t)n * E + e] += (float)(0.01 * urand());
        }
        float *dg = rnd(nk, -1, 1), *dp = rnd(ne, -1, 1), *dl = rnd((size_t)N, -1, 1);
        float *nE = nans(ne), *nN = nans((size_t)N), *nK = nans(nk);
        int32_t *nI = xmalloc(sizeof(int32_t) * nk);
        float *rp[3] = {0}, *rl[3] = {0}, *rg[3] = {0}, *rd1[3] = {0}, *rd2[3] = {0};
        int32_t *ri[3] = {0};
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dz = upf(b, z, ne), *pr = upf(b, nE, ne), *ls = upf(b, nN, (size_t)N), *gt = upf(b, nK, nk);
            int32_t *ix = upi(b, nI, nk);
            b->ops->router_forward(b->ops->be, pr, ls, ix, gt, dz, N, E, k);
            rp[p] = downf(b, pr, ne);
            rl[p] = downf(b, ls, (size_t)N);
            rg[p] = downf(b, gt, nk);
            ri[p] = downi(b, ix, nk);
            /* backward from the cpu's saved buffers */
            float *pc = upf(b, rp[0], ne), *gc = upf(b, rg[0], nk);
            int32_t *ic = upi(b, ri[0], nk);
            float *ddg = upf(b, dg, nk), *ddp = upf(b, dp, ne), *ddl = upf(b, dl, (size_t)N);
            float *out1 = upf(b, nE, ne), *out2 = upf(b, nE, ne);
            b->ops->router_backward(b->ops->be, out1, ddg, ddp, ddl, pc, ic, gc, N, E, k);
            b->ops->router_backward(b->ops->be, out2, ddg, NULL, NULL, pc, ic, gc, N, E, k);
            rd1[p] = downf(b, out1, ne);
            rd2[p] = downf(b, out2, ne);
            release(b);
        }
        char w[96];
        snprintf(w, sizeof w, "N=%d E=%d k=%d probs", N, E, k);
        check3("router_forward", w, rp, ne);
        snprintf(w, sizeof w, "N=%d E=%d k=%d lse", N, E, k);
        check3("router_forward", w, rl, (size_t)N);
        snprintf(w, sizeof w, "N=%d E=%d k=%d gates", N, E, k);
        check3("router_forward", w, rg, nk);
        snprintf(w, sizeof w, "N=%d E=%d k=%d topk_idx", N, E, k);
        check3i("router_forward", w, ri, nk);
        snprintf(w, sizeof w, "N=%d E=%d k=%d dgates+dprobs+dlse (=)", N, E, k);
        check3("router_backward", w, rd1, ne);
        snprintf(w, sizeof w, "N=%d E=%d k=%d dgates only (=)", N, E, k);
        check3("router_backward", w, rd2, ne);
        free(z); free(dg); free(dp); free(dl); free(nE); free(nN); free(nK); free(nI);
    }
}

/* ---- MoE permute / combine ---- */
/* null_every > 0: every null_every-th slot is a null one (SPEC 1e): pos -1,
 * no row; the real slots hold the rows [0, Mr). C % 4 == 0: the cuda row
 * kernels' 16-byte form, else the scalar one. The bf16 forms (permute_bf16,
 * combine_backward_bf16): cuda = cpu bit for bit, each = the rounding of its
 * backend's fp32 form, rows they do not own (null slots') untouched. */
static void test_moe_case(int null_every, int C)
{
    const int N = 50, k = 2, M = N * k;
    int32_t *pos = xmalloc(sizeof(int32_t) * M), *src = xmalloc(sizeof(int32_t) * M);
    int Mr = 0;
    for (int s = 0; s < M; s++) pos[s] = null_every > 0 && s % null_every == 0 ? -1 : Mr++;
    int32_t *perm = xmalloc(sizeof(int32_t) * (Mr ? Mr : 1));
    for (int m = 0; m < Mr; m++) perm[m] = m;
    for (int m = Mr - 1; m > 0; m--) {
        int j = irand(m + 1), tmp = perm[m];
        perm[m] = perm[j];
        perm[j] = tmp;
    }
    for (int s = 0; s < M; s++)
        if (pos[s] >= 0) pos[s] = perm[pos[s]];
    for (int s = 0; s < M; s++)
        if (pos[s] >= 0) src[pos[s]] = s / k;
    float *h = rnd((size_t)N * C, -1, 1), *dxp = rnd((size_t)M * C, -1, 1), *dh0 = rnd((size_t)N * C, -1, 1);
    float *y = rnd((size_t)M * C, -1, 1), *gates = rnd((size_t)M, 0, 1), *out0 = rnd((size_t)N * C, -1, 1);
    float *dout = rnd((size_t)N * C, -1, 1), *nM = nans((size_t)M * C), *nS = nans((size_t)M);
    float *rp[3], *rpb[3], *rpb0[3], *rc[3], *rdy[3], *rdg[3], *rdg16[3];
    int32_t *rp16[3], *rdy16[3];
    const size_t M2 = (size_t)M * C / 2;   /* bf16 pairs (M C is even) */
    int32_t *pad = xmalloc(sizeof(int32_t) * M2);
    for (size_t i = 0; i < M2; i++) pad[i] = 0x7fc07fc0;   /* bf16 NaN pairs: untouched rows stay so */
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        int32_t *dpos = upi(b, pos, M), *dsrc = upi(b, src, M);
        float *dh = upf(b, h, (size_t)N * C), *xp = upf(b, nM, (size_t)M * C);
        b->ops->moe_permute(b->ops->be, xp, dh, dsrc, Mr, C);
        rp[p] = downf(b, xp, (size_t)M * C);
        float *ddh = upf(b, dh0, (size_t)N * C), *ddxp = upf(b, dxp, (size_t)M * C);
        b->ops->moe_permute_backward(b->ops->be, ddh, ddxp, dpos, N, k, C, 1);
        rpb[p] = downf(b, ddh, (size_t)N * C);
        float *ddh0 = upf(b, nans((size_t)N * C), (size_t)N * C);   /* =: dh not read (NaN would show) */
        b->ops->moe_permute_backward(b->ops->be, ddh0, ddxp, dpos, N, k, C, 0);
        rpb0[p] = downf(b, ddh0, (size_t)N * C);
        float *dy_ = upf(b, y, (size_t)M * C), *dg_ = upf(b, gates, (size_t)M), *o = upf(b, out0, (size_t)N * C);
        b->ops->moe_combine(b->ops->be, o, dy_, dpos, dg_, N, k, C);
        rc[p] = downf(b, o, (size_t)N * C);
        float *gy = upf(b, nM, (size_t)M * C), *gg = upf(b, nS, (size_t)M), *dd = upf(b, dout, (size_t)N * C);
        b->ops->moe_combine_backward(b->ops->be, gy, gg, dd, dy_, dpos, dg_, N, k, C);
        rdy[p] = downf(b, gy, (size_t)M * C);
        rdg[p] = downf(b, gg, (size_t)M);
        int32_t *xb = upi(b, pad, M2), *gyb = upi(b, pad, M2);
        float *gg2 = upf(b, nS, (size_t)M);
        b->ops->moe_permute_bf16(b->ops->be, (mt_bf16 *)xb, dh, dsrc, Mr, C);
        b->ops->moe_combine_backward_bf16(b->ops->be, (mt_bf16 *)gyb, gg2, dd, dy_, dpos, dg_, N, k, C);
        rp16[p] = downi(b, xb, M2);
        rdy16[p] = downi(b, gyb, M2);
        rdg16[p] = downf(b, gg2, (size_t)M);
        release(b);
    }
    /* each backend's bf16 form = the rounding of its fp32 form (elements past Mr rows: still NaN) */
    for (int p = 0; p < 2; p++) {
        double bad_p = 0, bad_d = 0;
        const uint16_t *x16 = (const uint16_t *)rp16[p], *d16 = (const uint16_t *)rdy16[p];
        for (size_t i = 0; i < (size_t)M * C; i++) {
            const int own = i < (size_t)Mr * C;
            bad_p += x16[i] != (own ? host_bf16(rp[p][i]) : 0x7fc0u);
            bad_d += d16[i] != (own ? host_bf16(rdy[p][i]) : 0x7fc0u);
        }
        char w2[96];
        snprintf(w2, sizeof w2, "%s: = bf16(moe_permute), other rows untouched (differing)", p ? "cuda" : "cpu");
        report("moe_permute_bf16", w2, bad_p, 0);
        snprintf(w2, sizeof w2, "%s: dy = bf16(moe_combine_backward's) (differing)", p ? "cuda" : "cpu");
        report("moe_combine_backward_bf16", w2, bad_d, 0);
    }
    char w[96];
    const char *nl = null_every > 0 ? " [null slots]" : "";
    snprintf(w, sizeof w, "xp = h[src_row] (=)%s", nl);
    check3("moe_permute", w, rp, (size_t)Mr * C);
    snprintf(w, sizeof w, "dh += (j order)%s", nl);
    check3("moe_permute_backward", w, rpb, (size_t)N * C);
    snprintf(w, sizeof w, "dh = (accumulate 0)%s", nl);
    check3("moe_permute_backward", w, rpb0, (size_t)N * C);
    snprintf(w, sizeof w, "out += gates y%s", nl);
    check3("moe_combine", w, rc, (size_t)N * C);
    snprintf(w, sizeof w, "dy (=)%s", nl);
    check3("moe_combine_backward", w, rdy, (size_t)Mr * C);
    if (null_every > 0) {   /* a null slot: dgates exactly 0 on every backend (before check3 frees them) */
        double nz = 0;
        for (int p = 0; p < 3; p++)
            for (int s = 0; s < M; s++) nz += pos[s] < 0 && rdg[p][s] != 0.0f;
        report("moe_combine_backward", "null slots: dgates 0 (nonzero count)", nz, 0);
    }
    snprintf(w, sizeof w, "dgates (=)%s", nl);
    check3("moe_combine_backward", w, rdg, (size_t)M);   /* frees every pass (check3 frees what it checks) */
    snprintf(w, sizeof w, "xb = bf16(h[src_row]) C %d%s", C, nl);
    check3i("moe_permute_bf16", w, rp16, M2);
    snprintf(w, sizeof w, "dy bf16 C %d%s", C, nl);
    check3i("moe_combine_backward_bf16", w, rdy16, M2);
    snprintf(w, sizeof w, "dgates (=) C %d%s", C, nl);
    check3("moe_combine_backward_bf16", w, rdg16, (size_t)M);
    free(pad);
    free(pos); free(src); free(perm); free(h); free(dxp); free(dh0); free(y); free(gates); free(out0); free(dout);
    free(nM); free(nS);
}

static void test_moe(void)
{
    if (!selected("moe")) return;
    test_moe_case(0, 24);
    test_moe_case(3, 24);   /* null experts (SPEC 1e) */
    test_moe_case(0, 22);   /* C % 4 != 0: the scalar row kernels */
    test_moe_case(3, 22);
}

/* ---- MoE device routing (moe_route, moe_seq_stats, moe_aux_loss, moe_aux_backward) ---- */
/* distinct experts per row; skew > 0 sends most slots to the low experts (empty ones at the top) */
static int32_t *route_topk(int N, int k, int E, int skew)
{
    int32_t *t = xmalloc(sizeof(int32_t) * (size_t)N * (size_t)k);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = skew && irand(4) ? irand(k + 1 < E ? k + 1 : E) : irand(E);
                dup = 0;
                for (int m = 0; m < j; m++) dup |= t[(size_t)n * k + m] == e;
            } while (dup);
            t[(size_t)n * k + j] = e;
        }
    return t;
}
static double *downd(struct be *b, const double *d, size_t n)
{
    double *x = xmalloc(n * sizeof(double));
    b->ops->sync(b->ops->be);
    if (n) b->ops->copy_to_host(b->ops->be, x, d, n * sizeof(double));
    return x;
}
static double rel_err_d(const double *got, const double *ref, size_t n)
{
    double scale = 0.0, e = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    if (scale == 0.0) scale = 1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (!isfinite(d)) return INFINITY;
        if (d > e) e = d;
    }
    return e / scale;
}
static void check3d(const char *op, const char *what, double *r[3], size_t n)
{
    char w[160];
    report(op, what, rel_err_d(r[1], r[0], n), TOL);
    snprintf(w, sizeof w, "%s: deterministic (differing elements)", what);
    report(op, w, (double)ndiff(r[1], r[2], 2 * n), 0);
    for (int p = 0; p < 3; p++) free(r[p]);
}

static void test_moe_route(void)
{
    if (!selected("moe_route")) return;
    /* N k E skew Z: one chunk, several chunks with a partial last one, empty experts, E > the warp;
     * Z > 0: the last Z experts are null (SPEC 1e: pos -1, no src_row) */
    int shapes[][5] = {{70, 2, 8, 0, 0}, {300, 4, 16, 0, 0}, {1000, 1, 3, 1, 0}, {513, 2, 8, 1, 0}, {5, 2, 70, 0, 0},
                       {0, 2, 4, 0, 0}, {600, 3, 10, 0, 4}, {513, 2, 8, 1, 5}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int N = shapes[c][0], k = shapes[c][1], E = shapes[c][2], skew = shapes[c][3], Z = shapes[c][4];
        size_t M = (size_t)N * k, nw = mt_moe_route_work(M, (size_t)E);
        int32_t *topk = route_topk(N, k, E, skew), *neg = xmalloc(sizeof(int32_t) * (M + (size_t)E + 1 + nw));
        for (size_t i = 0; i < M + (size_t)E + 1 + nw; i++) neg[i] = -7;
        /* the reference: a stable sort by expert, written out plainly */
        int32_t *rp = xmalloc(sizeof(int32_t) * (M + 1)), *rs = xmalloc(sizeof(int32_t) * (M + 1));
        int32_t *ro = xmalloc(sizeof(int32_t) * ((size_t)E + 1));
        int32_t r = 0;
        for (int e = 0; e < E; e++) {
            ro[e] = r;
            for (size_t s = 0; s < M; s++)
                if (topk[s] == e) {
                    rp[s] = e >= E - Z ? -1 : r;
                    rs[r++] = e >= E - Z ? -7 : (int32_t)(s / (size_t)k);   /* a null row: not written */
                }
        }
        ro[E] = r;
        int32_t *gp[3], *gs[3], *go[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            int32_t *dt = upi(b, topk, M), *dp = upi(b, neg, M), *ds = upi(b, neg, M);
            int32_t *dof = upi(b, neg, (size_t)E + 1), *dw = upi(b, neg, nw ? nw : 1);
            b->ops->moe_route(b->ops->be, dp, ds, dof, dw, dt, N, k, E, Z);
            gp[p] = downi(b, dp, M);
            gs[p] = downi(b, ds, M);
            go[p] = downi(b, dof, (size_t)E + 1);
            release(b);
        }
        char w[96], sk[32];
        snprintf(sk, sizeof sk, "%s%s", skew ? " skewed" : "", Z ? " null" : "");
        snprintf(w, sizeof w, "N=%d k=%d E=%d%s cpu = a plain stable sort (differing)", N, k, E, sk);
        report("moe_route", w,
               (double)(ndiff(gp[0], rp, M) + ndiff(gs[0], rs, M) + ndiff(go[0], ro, (size_t)E + 1)), 0);
        snprintf(w, sizeof w, "N=%d k=%d E=%d%s pos", N, k, E, sk);
        check3i("moe_route", w, gp, M);
        snprintf(w, sizeof w, "N=%d k=%d E=%d%s src_row", N, k, E, sk);
        check3i("moe_route", w, gs, M);
        snprintf(w, sizeof w, "N=%d k=%d E=%d%s e_off", N, k, E, sk);
        check3i("moe_route", w, go, (size_t)E + 1);
        free(topk); free(neg); free(rp); free(rs); free(ro);
    }
}

static void test_moe_aux(void)
{
    if (!selected("moe_aux") && !selected("moe_seq")) return;
    /* N B T E k g0: one rank (N = B T); a TP rank's rows straddling sequences */
    int shapes[][6] = {{64, 4, 16, 8, 2, 0}, {37, 4, 16, 4, 2, 10}, {300, 3, 100, 16, 4, 0}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int N = shapes[c][0], B = shapes[c][1], T = shapes[c][2], E = shapes[c][3], k = shapes[c][4];
        int g0 = shapes[c][5];
        size_t ne = (size_t)N * E, nq = (size_t)B * E;
        float *probs = rnd(ne, 0, 1), *lse = rnd((size_t)N, -3, 3), *nE = nans(ne), *nN = nans((size_t)N);
        float *nQ = nans(nq);
        int32_t *topk = route_topk(N, k, E, 0);
        double *rseq[3], *rloss[3];
        float *rf[3], *rdp[3], *rdl[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dpr = upf(b, probs, ne), *dls = upf(b, lse, (size_t)N), *df = upf(b, nQ, nq);
            int32_t *dtk = upi(b, topk, (size_t)N * k);
            double *dseq = dalloc(b, 2 * nq * sizeof(double)), *dloss = dalloc(b, 2 * sizeof(double));
            b->ops->moe_seq_stats(b->ops->be, dseq, dpr, dtk, N, E, k, B, T, g0);
            rseq[p] = downd(b, dseq, 2 * nq);
            b->ops->moe_aux_loss(b->ops->be, dloss, df, dseq, dls, N, B, E, k, T, 0.01f, 0.001f, 1);
            rloss[p] = downd(b, dloss, 2);
            rf[p] = downf(b, df, nq);
            float *ddp = upf(b, nE, ne), *ddl = upf(b, nN, (size_t)N);
            b->ops->moe_aux_backward(b->ops->be, ddp, ddl, df, dls, N, E, T, g0, 0.01f, 0.001f, 3.0, 123.0);
            rdp[p] = downf(b, ddp, ne);
            rdl[p] = downf(b, ddl, (size_t)N);
            release(b);
        }
        /* the counts against the routing itself (every slot counted once) */
        double tot = 0;
        for (size_t i = 0; i < nq; i++) tot += rseq[0][i];
        char w[96];
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d cpu counts sum to N k (off by)", N, B, T, E, k, g0);
        report("moe_seq_stats", w, fabs(tot - (double)N * k), 0);
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d counts, prob sums (=)", N, B, T, E, k, g0);
        check3d("moe_seq_stats", w, rseq, 2 * nq);
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d aux, z (=)", N, B, T, E, k, g0);
        check3d("moe_aux_loss", w, rloss, 2);
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d f_share (=)", N, B, T, E, k, g0);
        check3("moe_aux_loss", w, rf, nq);
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d dprobs (=)", N, B, T, E, k, g0);
        check3("moe_aux_backward", w, rdp, ne);
        snprintf(w, sizeof w, "N=%d B=%d T=%d E=%d k=%d g0=%d dlse (=)", N, B, T, E, k, g0);
        check3("moe_aux_backward", w, rdl, (size_t)N);
        free(probs); free(lse); free(nE); free(nN); free(nQ); free(topk);
    }
}

/* ---- grouped bf16 GEMMs sized on the device (gemm_grouped_rows, gemm_grouped_sum) and moe_count_acc ----
 * The groups are row ranges [offs[g], offs[g+1]) of one buffer, offs in
 * backend memory. Layouts: n = 1, 3, 8; empty groups first, in the middle,
 * last; sizes 0, 1, 37, 130, 300 (not multiples of the kernels' 32 / 128),
 * whole tiles (128, 256); offs[n] < max_rows. N, K (rows), M, N (sum) are
 * multiples of 8 but not of 128 (72, 40, 136, 264). Every operand has 8
 * padding columns of NaN (and A's rows past offs[n] are NaN): a kernel that
 * reads them turns results into NaN.
 * cuda vs cpu, element by element: both sum the same exact bf16 products in
 * fp32, in different orders, so each is within K u T_ij of the exact sum
 * (u = 2^-24, T_ij = sum_k |a_ik b_kj|, the standard gamma_K bound), hence
 *     |cuda_ij - cpu_ij| <= |alpha| 2 K u T_ij + 2^-22 |beta c_ij|
 * (c = 2 covers the two sums; the alpha scale and the beta term add one
 * rounding each, inside the slack since K >= 8 (rows) and T_ij >= |sum|;
 * an empty group of sum: the bound is the beta term, i.e. C_g = beta C_g).
 * bf16 C: cuda and cpu round fp32 values within that bound once each, so
 * |cuda - cpu| <= bound + 1 bf16 ulp; and exactly: cuda's bf16 C = RNE of the
 * fp32 C of the same entry (the same accumulators), bit for bit.
 * Also: rows at or past offs[n] and every padding column of C untouched
 * (poisoned with 7.0, compared bitwise), C not read where beta = 0 (NaN
 * there), two cuda runs identical, empty groups of sum exactly beta C_g
 * (beta 0: zeros; beta 1: unchanged), a bad shape recorded as an error
 * with nothing written (on a second instance, whose sticky error is its own).
 * moe_count_acc: exact (the same double operations), +1 then -1, entries
 * past n untouched. */
static uint16_t gg_nan16 = 0x7fc0u, gg_seven16 = 0x40e0u;   /* bf16 NaN, 7.0 */
static float gg_bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* (rows, ld) bf16: random in [-1, 1] where r < vr and c < vc, NaN elsewhere */
static uint16_t *gg_rnd_bf16(int rows, int ld, int vr, int vc)
{
    uint16_t *x = xmalloc((size_t)rows * (size_t)ld * 2 + 2);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ld; c++)
            x[(size_t)r * ld + c] = r < vr && c < vc ? host_bf16((float)(2.0 * urand() - 1.0)) : gg_nan16;
    return x;
}
static void *gg_up16(struct be *b, const uint16_t *x, size_t n)
{
    void *p = dalloc(b, n * 2);
    if (n) b->ops->copy_from_host(b->ops->be, p, x, n * 2);
    return p;
}
static uint16_t *gg_down16(struct be *b, const void *d, size_t n)
{
    uint16_t *x = xmalloc(n * 2 + 2);
    b->ops->sync(b->ops->be);
    if (n) b->ops->copy_to_host(b->ops->be, x, d, n * 2);
    return x;
}
/* one bf16 ulp at |v| (normal range; tiny for 0) */
static double gg_ulp16(double v)
{
    int e;
    frexp(fabs(v), &e);
    return v == 0.0 ? 0x1.0p-133 : ldexp(1.0, e - 8);
}

/* ---- wgmma (not a table op: mt_ops_cuda_wgmma_probe_of, wgmma_probe.cu) ----
 * C = A B^T with bf16 A (M x K) and B (N x K) on Hopper's warpgroup MMA against
 * the double product of the same bf16 values: |C - ref| <= 2 K u32 sum_k |a b|
 * (fp32 accumulation in some order; the products are exact), with A from
 * shared memory and from registers (ldmatrix: the RS form), K-major; then the
 * MN-major forms (imm-trans: B stored K x N, with A from shared memory and from
 * registers; A stored K x M; both), the same values transposed in
 * memory, so the reference is the same. Shapes: one slice of K (64), more
 * slices than the 3 stages (K 640: the ring wraps), a grid of 2 x 3 tiles (the
 * MN-major forms the last two); twice each, bit for bit; a shape off the tiles
 * and A from registers read MN-major refused. Where the device code has no
 * sm_90a instructions: SKIPPED, said. */
static const char *wg_form_name(int form)
{
    static const char *const names[] = {"A smem", "A regs", "A smem, B MN-major", "A regs, B MN-major", "A MN-major",
                                        "?", "A MN-major, B MN-major", "?"};
    return names[form & 7];
}

/* the (rows x cols) row-major bf16 matrix x transposed (cols x rows), a fresh copy */
static uint16_t *wg_transposed(const uint16_t *x, int rows, int cols)
{
    uint16_t *t = xmalloc((size_t)rows * cols * sizeof *t);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = x[(size_t)i * cols + j];
    return t;
}

static void test_wgmma(void)
{
    if (!selected("wgmma")) return;
    struct be *b = BE(1);
    static const int cs[][3] = {{128, 128, 64}, {128, 128, 640}, {256, 384, 192}};
    static const int forms[] = {0, MT_WGMMA_PROBE_A_REGS, MT_WGMMA_PROBE_B_MN,
                                MT_WGMMA_PROBE_A_REGS | MT_WGMMA_PROBE_B_MN, MT_WGMMA_PROBE_A_MN,
                                MT_WGMMA_PROBE_A_MN | MT_WGMMA_PROBE_B_MN};
    const int ncs = (int)(sizeof cs / sizeof cs[0]), nf = (int)(sizeof forms / sizeof forms[0]);
    for (int f = 0; f < nf; f++)
        for (int c = forms[f] & (MT_WGMMA_PROBE_A_MN | MT_WGMMA_PROBE_B_MN) ? 1 : 0; c < ncs; c++) {
            const int M = cs[c][0], N = cs[c][1], K = cs[c][2], form = forms[f];
            uint16_t *A = gg_rnd_bf16(M, K, M, K), *B = gg_rnd_bf16(N, K, N, K);
            /* the operands as the form reads them: MN-major ones stored transposed */
            uint16_t *As = form & MT_WGMMA_PROBE_A_MN ? wg_transposed(A, M, K) : NULL;
            uint16_t *Bs = form & MT_WGMMA_PROBE_B_MN ? wg_transposed(B, N, K) : NULL;
            float *r[2];
            enum mt_status st = MT_OK;
            void *dA = gg_up16(b, As ? As : A, (size_t)M * K), *dB = gg_up16(b, Bs ? Bs : B, (size_t)N * K);
            free(As); free(Bs);
            for (int p = 0; p < 2; p++) {   /* twice: the second run's bits must be the first's */
                float *dC = dalloc(b, (size_t)M * N * sizeof(float));
                st = mt_ops_cuda_wgmma_probe_of(b->ops->be, dC, dA, dB, M, N, K, form);
                r[p] = downf(b, dC, (size_t)M * N);
            }
            release(b);
            char w[160];
            if (st == MT_ERR_UNSUPPORTED) {
                printf("SKIPPED (wgmma does not run here: no sm_90a device code in the build, "
                       "or not an sm_90 device)\n");
                free(A); free(B); free(r[0]); free(r[1]);
                return;
            }
            double worst = st == MT_OK ? 0.0 : INFINITY;
            for (int i = 0; i < M && st == MT_OK; i++)
                for (int j = 0; j < N; j++) {
                    double ref = 0.0, T = 0.0;
                    for (int k = 0; k < K; k++) {
                        const double v = (double)gg_bf2f(A[(size_t)i * K + k]) * gg_bf2f(B[(size_t)j * K + k]);
                        ref += v;
                        T += fabs(v);
                    }
                    double d = fabs((double)r[0][(size_t)i * N + j] - ref) / (2.0 * K * 0x1.0p-24 * T + 1e-30);
                    if (!(d == d)) d = INFINITY;
                    if (d > worst) worst = d;
                }
            snprintf(w, sizeof w, "M=%d N=%d K=%d %s vs fp64 (err/bound)", M, N, K, wg_form_name(form));
            report("wgmma", w, worst, 1.0);
            snprintf(w, sizeof w, "M=%d N=%d K=%d %s: deterministic (differing)", M, N, K, wg_form_name(form));
            report("wgmma", w, (double)ndiff(r[0], r[1], (size_t)M * N), 0);
            free(A); free(B); free(r[0]); free(r[1]);
        }
    report("wgmma", "M=100 refused (not a multiple of 128)",
           mt_ops_cuda_wgmma_probe_of(b->ops->be, NULL, NULL, NULL, 100, 128, 64, 0) != MT_ERR_INVALID_ARG, 0);
    report("wgmma", "A from registers read MN-major refused",
           mt_ops_cuda_wgmma_probe_of(b->ops->be, NULL, NULL, NULL, 128, 128, 64,
                                      MT_WGMMA_PROBE_A_REGS | MT_WGMMA_PROBE_A_MN) != MT_ERR_INVALID_ARG, 0);
}

/* ---- init_normal (setup, not a step op: init.cu) ----
 * A parameter's normal init drawn on the device has the host's bits (model.c
 * init_value: std * mt_rng_normal in double, rounded once): a whole matrix, a
 * TP-like box (row and column offsets in a wider global shape), a vector, and
 * 8M elements. The device's libm is not the host's; init.cu marks the values
 * whose rounding that could change and takes the host's. Under the emulator
 * (whose libm is the host's) MT_EMU_LIBM_ULPS=2048, set here unless the
 * environment sets it, moves every log and cos result 2048 ulps (up to ~0.75
 * of init.cu's bound; above ~2700 the group would fail by design): without
 * the host's fixes 32 of the 8M elements differ, and the 8M box must have
 * had fixes (two launches: the draw and the scatter), so the check cannot
 * pass with the perturbation gone. Twice each: the same bits. Run before the
 * opt-in wgmma groups: every training's setup runs this kernel. */
static void test_init_normal(void)
{
    if (!selected("init_normal")) return;
    struct be *b = BE(1);
    if (!b->ops->init_normal) {
        report("init_normal", "the cuda table has init_normal (missing)", 1, 0);
        return;
    }
    setenv("MT_EMU_LIBM_ULPS", "2048", 0);
    static const struct { size_t rows, cols; int64_t off0, off1, shape1; float std; } cs[] = {
        {300, 37, 0, 0, 37, 0.02f}, {64, 300, 128, 700, 2000, 1.0f}, {4099, 1, 0, 0, 1, 0.5f},
        {2048, 4096, 4096, 0, 4096, 0.02f}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const size_t n = cs[c].rows * cs[c].cols;
        const uint64_t seed = 1234 + c, stream = mt_rng_stream("model.layers.0.mlp.up_proj.weight");
        float *host = xmalloc(n * sizeof(float)), *r[2];
        for (size_t e = 0; e < n; e++) {
            const size_t i = e / cs[c].cols, j = e % cs[c].cols;
            const uint64_t gi = (uint64_t)(cs[c].off0 + (int64_t)i) * (uint64_t)cs[c].shape1 +
                                (uint64_t)(cs[c].off1 + (int64_t)j);
            host[e] = (float)((double)cs[c].std * mt_rng_normal(seed, stream, gi));
        }
        long launches = 0;
        for (int p = 0; p < 2; p++) {
            float *d = dalloc(b, n * sizeof(float));
            struct mt_ops_cuda_counters c0, c1;
            mt_ops_cuda_counters_of(b->ops->be, &c0);
            b->ops->init_normal(b->ops->be, d, cs[c].rows, cs[c].cols, cs[c].off0, cs[c].off1, cs[c].shape1, seed,
                                stream, cs[c].std);
            mt_ops_cuda_counters_of(b->ops->be, &c1);
            launches = c1.launches - c0.launches;
            r[p] = downf(b, d, n);
        }
        release(b);
        char w[160];
        snprintf(w, sizeof w, "%zu x %zu at (%lld, %lld) of width %lld: == the host's bits (differing)", cs[c].rows,
                 cs[c].cols, (long long)cs[c].off0, (long long)cs[c].off1, (long long)cs[c].shape1);
        report("init_normal", w, (double)ndiff(r[0], host, n), 0);
        snprintf(w, sizeof w, "%zu x %zu: deterministic (differing)", cs[c].rows, cs[c].cols);
        report("init_normal", w, (double)ndiff(r[0], r[1], n), 0);
        if (n > 1000000) {   /* ~2e-5 of 8M marked: the host's fixes ran (the scatter's launch) */
            snprintf(w, sizeof w, "%zu x %zu: the host's fixes written (launches, want 2)", cs[c].rows, cs[c].cols);
            report("init_normal", w, fabs((double)launches - 2.0), 0);
        }
        free(host); free(r[0]); free(r[1]);
    }
}

/* whether knob grouped_gemm_kernel=wgmma is taken here (an sm_90a build on an sm_90 device); the
 * cuda table left on mma, the default; a SKIPPED line for `what`'s wgmma half where it is not */
static int gg_wgmma_runs(const char *what)
{
    const int wg = mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "wgmma") == MT_OK;
    mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "mma");
    if (!wg) printf("SKIPPED (%s on wgmma: no sm_90a device code in the build, or not an sm_90 device)\n", what);
    return wg;
}

/* Every case on the mma.sync kernels (on_wg 0), or with knob
 * grouped_gemm_kernel=wgmma (on_wg 1; gemm_grouped_wg.cu: 128 x 256 tiles, K
 * slices of 64 through 4 stages; transB's B K-major, the others' MN-major)
 * where wgmma runs: the last five cases are its shapes (N 520: three column
 * tiles, the last one partial; K 640 = 10 slices, the stage ring wrapped twice;
 * K 72: two slices, the second partial; K 648: the eleventh slice 8 wide;
 * groups of several row tiles, one ending inside a tile). The wgmma half is its
 * own group, run after the rest (main): a fault there cannot cost the others. */
static void gg_rows_cases(int on_wg)
{
    if (!selected("gemm_grouped_rows")) return;
    struct { int n, sz[8], extra, N, K, tB, cbf; float alpha, beta; } cs[] = {
        {1, {130}, 22, 72, 40, 1, 0, 1.0f, 0.0f},
        {3, {0, 37, 300}, 9, 136, 264, 0, 0, 0.5f, 1.0f},
        {3, {37, 0, 1}, 5, 72, 40, 0, 1, 1.0f, 0.0f},
        {8, {5, 130, 0, 1, 37, 0, 64, 0}, 40, 136, 264, 1, 1, -1.25f, 0.0f},
        {8, {0, 3, 0, 129, 0, 0, 2, 0}, 1, 72, 40, 1, 0, 1.0f, 1.0f},
        {3, {128, 256, 0}, 8, 136, 40, 0, 0, 1.0f, 0.0f},
        {3, {300, 0, 129}, 3, 520, 640, 1, 0, 0.75f, 1.0f},
        {2, {257, 64}, 64, 264, 136, 1, 1, 1.0f, 0.0f},
        {1, {200}, 8, 264, 72, 1, 0, 1.0f, 0.0f},
        {3, {300, 0, 129}, 3, 520, 640, 0, 1, 1.0f, 0.0f},
        {2, {200, 64}, 8, 264, 648, 0, 0, 0.75f, 1.0f},
    };
    const int n_cs = (int)(sizeof cs / sizeof cs[0]);
    if (on_wg && !gg_wgmma_runs("gemm_grouped_rows")) return;
    mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, on_wg ? "wgmma" : "mma");
    for (int c = 0; c < n_cs; c++) {
        const int n = cs[c].n, N = cs[c].N, K = cs[c].K, tB = cs[c].tB, cbf = cs[c].cbf;
        const float alpha = cs[c].alpha, beta = cs[c].beta;
        int32_t offs[9];
        offs[0] = 0;
        for (int g = 0; g < n; g++) offs[g + 1] = offs[g] + cs[c].sz[g];
        const int R = offs[n], max_rows = R + cs[c].extra;
        const int lda = K + 8, br = tB ? N : K, bc = tB ? K : N, ldb = bc + 8, ldc = N + 8;
        const size_t na = (size_t)max_rows * lda, nbg = (size_t)br * ldb, nc = (size_t)max_rows * ldc;
        uint16_t *A = gg_rnd_bf16(max_rows, lda, R, K), *Bh = xmalloc((size_t)n * nbg * 2);
        for (int g = 0; g < n; g++) {
            uint16_t *b1 = gg_rnd_bf16(br, ldb, br, bc);
            memcpy(Bh + (size_t)g * nbg, b1, nbg * 2);
            free(b1);
        }
        /* C: inside the groups NaN (beta 0: must not be read) or random (beta 1); outside 7.0 */
        float *C0 = xmalloc(nc * 4);
        uint16_t *C0h = xmalloc(nc * 2);
        for (int r = 0; r < max_rows; r++)
            for (int j = 0; j < ldc; j++) {
                const int in = r < R && j < N;
                const size_t e = (size_t)r * ldc + j;
                C0[e] = in ? (beta != 0.0f ? (float)(2.0 * urand() - 1.0) : NAN) : 7.0f;
                C0h[e] = in ? gg_nan16 : gg_seven16;
            }
        /* passes 0 cpu, 1-2 cuda, 3 cuda with an fp32 C (bf16 cases: the accumulators' twin) */
        void *r[4] = {NULL, NULL, NULL, NULL};
        const int np = cbf ? 4 : 3;
        for (int p = 0; p < np; p++) {
            struct be *b = BE(p);
            const int bf = cbf && p < 3;
            const mt_bf16 *dA = gg_up16(b, A, na), *dBall = gg_up16(b, Bh, (size_t)n * nbg), *dB[8];
            for (int g = 0; g < n; g++) dB[g] = dBall + (size_t)g * nbg;
            int32_t *doffs = upi(b, offs, (size_t)n + 1);
            void *dC = bf ? gg_up16(b, C0h, nc) : (void *)upf(b, C0, nc);
            b->ops->gemm_grouped_rows(b->ops->be, n, doffs, max_rows, N, K, tB, alpha, dA, lda, dB, ldb,
                                      bf ? 0.0f : (p == 3 ? 0.0f : beta), dC, bf ? MT_ELEM_BF16 : MT_ELEM_F32, ldc);
            r[p] = bf ? (void *)gg_down16(b, dC, nc) : (void *)downf(b, dC, nc);
            release(b);
        }
        /* element by element over the groups; untouched outside */
        double worst = 0.0;
        size_t outside = 0, twin = 0;
        for (int g = 0; g < n; g++)
            for (int i = offs[g]; i < offs[g + 1]; i++)
                for (int j = 0; j < N; j++) {
                    double T = 0.0;
                    for (int k = 0; k < K; k++) {
                        const double a = gg_bf2f(A[(size_t)i * lda + k]);
                        const double bv = gg_bf2f(Bh[(size_t)g * nbg + (tB ? (size_t)j * ldb + k : (size_t)k * ldb + j)]);
                        T += fabs(a * bv);
                    }
                    const size_t e = (size_t)i * ldc + j;
                    const double cij = beta != 0.0f ? (double)C0[e] : 0.0;
                    double bound = fabs((double)alpha) * 2.0 * K * 0x1.0p-24 * T + 0x1.0p-22 * fabs((double)beta * cij) + 1e-30;
                    double got, ref;
                    if (cbf) {
                        got = gg_bf2f(((uint16_t *)r[1])[e]);
                        ref = gg_bf2f(((uint16_t *)r[0])[e]);
                        bound += gg_ulp16(fabs(got) > fabs(ref) ? got : ref);
                        twin += ((uint16_t *)r[1])[e] != host_bf16(((float *)r[3])[e]);
                    } else {
                        got = ((float *)r[1])[e];
                        ref = ((float *)r[0])[e];
                    }
                    double d = fabs(got - ref);
                    if (!(d == d)) d = INFINITY;
                    if (d / bound > worst) worst = d / bound;
                }
        for (int i = 0; i < max_rows; i++)
            for (int j = 0; j < ldc; j++) {
                const size_t e = (size_t)i * ldc + j;
                if (i < R && j < N) continue;
                outside += cbf ? ((uint16_t *)r[1])[e] != C0h[e] : memcmp((float *)r[1] + e, C0 + e, 4) != 0;
            }
        char lay[64], w[200];
        int o = snprintf(lay, sizeof lay, "n=%d {", n);
        for (int g = 0; g < n && o < (int)sizeof lay; g++) o += snprintf(lay + o, sizeof lay - o, g ? ",%d" : "%d", cs[c].sz[g]);
        snprintf(lay + o, o < (int)sizeof lay ? sizeof lay - o : 0, "}");
        const char *kn = on_wg ? " wgmma" : "";
        snprintf(w, sizeof w, "%s max_rows=%d N=%d K=%d tB=%d%s C %s a=%g b=%g (err/bound)", lay, max_rows, N, K, tB,
                 kn, cbf ? "bf16" : "f32", alpha, beta);
        report("gemm_grouped_rows", w, worst, 1.0);
        snprintf(w, sizeof w, "%s N=%d tB=%d%s C %s: rows >= offs[n], pad columns untouched (differing)", lay, N, tB,
                 kn, cbf ? "bf16" : "f32");
        report("gemm_grouped_rows", w, (double)outside, 0);
        snprintf(w, sizeof w, "%s N=%d K=%d tB=%d%s: deterministic (differing elements)", lay, N, K, tB, kn);
        report("gemm_grouped_rows", w, (double)(cbf ? ndiff(r[1], r[2], nc / 2) : ndiff(r[1], r[2], nc)), 0);
        if (cbf) {
            snprintf(w, sizeof w, "%s N=%d K=%d tB=%d%s: bf16 C = RNE(the fp32 C's bits) (differing)", lay, N, K, tB,
                     kn);
            report("gemm_grouped_rows", w, (double)twin, 0);
        }
        for (int p = 0; p < 4; p++) free(r[p]);
        free(A); free(Bh); free(C0); free(C0h);
    }
    mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "mma");   /* the default, for the rest */
    if (on_wg) return;
    /* a shape outside the contract (N = 70): recorded as an error, nothing written (a second instance) */
    char why[256] = "", msg[384] = "";
    const struct mt_ops_i *ob = mt_ops_cuda_create(MT_CUDA_PRECISION_FP32, why, sizeof why);
    if (!ob) {
        report("gemm_grouped_rows", why[0] ? why : "mt_ops_cuda_create returned NULL", 1, 0);
        return;
    }
    struct be bb = {.ops = ob, .name = "cuda2"};
    mt_ctx_init(&bb.ctx);
    const int32_t offs[2] = {0, 16};
    uint16_t *A = gg_rnd_bf16(16, 40, 16, 40), *Bh = gg_rnd_bf16(72, 40, 72, 40);
    float *C0 = rnd(16 * 72, -1, 1);
    const mt_bf16 *dB[1] = {gg_up16(&bb, Bh, 72 * 40)};
    float *dC = upf(&bb, C0, 16 * 72);
    ob->gemm_grouped_rows(ob->be, 1, upi(&bb, offs, 2), 16, 70, 40, 1, 1.0f, gg_up16(&bb, A, 16 * 40), 40, dB, 40,
                          0.0f, dC, MT_ELEM_F32, 72);
    float *got = downf(&bb, dC, 16 * 72);
    const enum mt_status st = mt_ops_cuda_status_of(ob->be, msg, sizeof msg);
    report("gemm_grouped_rows", "N = 70: recorded (status, message names the entry), C untouched",
           (st == MT_OK) + (strstr(msg, "gemm_grouped_rows") == NULL) + (double)ndiff(got, C0, 16 * 72), 0);
    free(got); free(A); free(Bh); free(C0);
    release(&bb);
    mt_ops_cuda_destroy(ob);
    mt_ctx_free(&bb.ctx);
}
static void test_gemm_grouped_rows(void) { gg_rows_cases(0); }
static void test_gemm_grouped_rows_wgmma(void) { gg_rows_cases(1); }

/* Every case on the mma.sync kernels (on_wg 0) or on wgmma (1; knob
 * grouped_gemm_kernel=wgmma: both operands MN-major, 128 x 256 tiles, the
 * group's rows in slices of 64) where it runs, its own group as the rows'; the
 * last two cases are its shapes (M 136: two row tiles, the second partial; N
 * 520: three column tiles; groups of 200 rows: the fourth slice 8 wide, 640:
 * the stage ring wrapped twice, 1 row; an empty group between) */
static void gg_sum_cases(int on_wg)
{
    if (!selected("gemm_grouped_sum")) return;
    struct { int n, sz[8], extra, M, N; float alpha, beta; } cs[] = {
        {3, {37, 0, 130}, 3, 72, 136, 1.0f, 1.0f},
        {1, {300}, 0, 136, 72, 0.5f, 0.0f},
        {8, {5, 0, 1, 37, 0, 64, 3, 0}, 7, 72, 40, -1.0f, 0.0f},
        {3, {0, 33, 0}, 2, 40, 72, 1.0f, 1.0f},
        {3, {200, 0, 640}, 5, 136, 520, 1.0f, 1.0f},
        {2, {64, 1}, 0, 264, 264, 0.5f, 0.0f},
    };
    const int n_cs = (int)(sizeof cs / sizeof cs[0]);
    if (on_wg && !gg_wgmma_runs("gemm_grouped_sum")) return;
    mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, on_wg ? "wgmma" : "mma");
    for (int c = 0; c < n_cs; c++) {
        const int n = cs[c].n, M = cs[c].M, N = cs[c].N;
        const float alpha = cs[c].alpha, beta = cs[c].beta;
        int32_t offs[9];
        offs[0] = 0;
        for (int g = 0; g < n; g++) offs[g + 1] = offs[g] + cs[c].sz[g];
        const int R = offs[n], rows = R + cs[c].extra, lda = M + 8, ldb = N + 8, ldc = N + 8;
        const size_t na = (size_t)rows * lda, nb = (size_t)rows * ldb, ncg = (size_t)M * ldc, nc = (size_t)n * ncg;
        uint16_t *A = gg_rnd_bf16(rows, lda, R, M), *Bh = gg_rnd_bf16(rows, ldb, R, N);
        float *C0 = xmalloc(nc * 4);
        for (size_t e = 0; e < nc; e++)
            C0[e] = (int)(e % (size_t)ldc) >= N ? 7.0f : beta != 0.0f ? (float)(2.0 * urand() - 1.0) : NAN;
        float *r[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            const mt_bf16 *dA = gg_up16(b, A, na), *dB = gg_up16(b, Bh, nb);
            int32_t *doffs = upi(b, offs, (size_t)n + 1);
            float *dC = upf(b, C0, nc), *Cg[8];
            for (int g = 0; g < n; g++) Cg[g] = dC + (size_t)g * ncg;
            b->ops->gemm_grouped_sum(b->ops->be, n, doffs, M, N, alpha, dA, lda, dB, ldb, beta, Cg, ldc);
            r[p] = downf(b, dC, nc);
            release(b);
        }
        double worst = 0.0;
        size_t pads = 0, empty = 0;
        for (int g = 0; g < n; g++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    const size_t e = (size_t)g * ncg + (size_t)i * ldc + j;
                    if (j >= N) {
                        pads += memcmp(r[1] + e, C0 + e, 4) != 0;
                        continue;
                    }
                    double T = 0.0;
                    for (int q = offs[g]; q < offs[g + 1]; q++)
                        T += fabs((double)gg_bf2f(A[(size_t)q * lda + i]) * (double)gg_bf2f(Bh[(size_t)q * ldb + j]));
                    const int K = offs[g + 1] - offs[g];
                    const double cij = beta != 0.0f ? (double)C0[e] : 0.0;
                    const double bound = fabs((double)alpha) * 2.0 * K * 0x1.0p-24 * T +
                                         0x1.0p-22 * fabs((double)beta * cij) + 1e-30;
                    double d = fabs((double)r[1][e] - (double)r[0][e]);
                    if (!(d == d)) d = INFINITY;
                    if (d / bound > worst) worst = d / bound;
                    if (K == 0) empty += beta == 0.0f ? r[1][e] != 0.0f : memcmp(r[1] + e, C0 + e, 4) != 0;
                }
        char lay[64], w[200];
        int o = snprintf(lay, sizeof lay, "n=%d {", n);
        for (int g = 0; g < n && o < (int)sizeof lay; g++) o += snprintf(lay + o, sizeof lay - o, g ? ",%d" : "%d", cs[c].sz[g]);
        snprintf(lay + o, o < (int)sizeof lay ? sizeof lay - o : 0, "}");
        const char *kn = on_wg ? " wgmma" : "";
        snprintf(w, sizeof w, "%s M=%d N=%d%s a=%g b=%g (err/bound)", lay, M, N, kn, alpha, beta);
        report("gemm_grouped_sum", w, worst, 1.0);
        snprintf(w, sizeof w, "%s M=%d N=%d%s b=%g: empty groups = beta C_g exactly (differing)", lay, M, N, kn, beta);
        report("gemm_grouped_sum", w, (double)empty, 0);
        snprintf(w, sizeof w, "%s M=%d N=%d%s: pad columns untouched (differing)", lay, M, N, kn);
        report("gemm_grouped_sum", w, (double)pads, 0);
        snprintf(w, sizeof w, "%s M=%d N=%d%s: deterministic (differing elements)", lay, M, N, kn);
        report("gemm_grouped_sum", w, (double)ndiff(r[1], r[2], nc), 0);
        for (int p = 0; p < 3; p++) free(r[p]);
        free(A); free(Bh); free(C0);
    }
    mt_ops_cuda_set_knob_of(BE(1)->ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "mma");   /* the default, for the rest */
}
static void test_gemm_grouped_sum(void) { gg_sum_cases(0); }
static void test_gemm_grouped_sum_wgmma(void) { gg_sum_cases(1); }

static void test_moe_count_acc(void)
{
    if (!selected("moe_count_acc")) return;
    const int cs[3][9] = {{1, 130}, {3, 0, 37, 300}, {8, 5, 130, 0, 1, 37, 0, 64, 0}};
    for (int c = 0; c < 3; c++) {
        const int n = cs[c][0];
        int32_t o1[9], o2[9];
        o1[0] = o2[0] = 0;
        for (int g = 0; g < n; g++) {
            o1[g + 1] = o1[g] + cs[c][g + 1];
            o2[g + 1] = o2[g] + irand(50);
        }
        double *L0 = xmalloc(((size_t)n + 2) * sizeof(double)), *r[3];
        for (int e = 0; e < n + 2; e++) L0[e] = 100.0 * urand() - 50.0;
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            double *dl = dalloc(b, ((size_t)n + 2) * sizeof(double));
            b->ops->copy_from_host(b->ops->be, dl, L0, ((size_t)n + 2) * sizeof(double));
            int32_t *d1 = upi(b, o1, (size_t)n + 1), *d2 = upi(b, o2, (size_t)n + 1);
            b->ops->moe_count_acc(b->ops->be, dl, d1, n, 1.0);
            b->ops->moe_count_acc(b->ops->be, dl, d2, n, -1.0);
            r[p] = downd(b, dl, (size_t)n + 2);
            release(b);
        }
        size_t bad = 0;
        for (int e = 0; e < n + 2; e++) {
            const double want = e < n ? L0[e] + (double)(o1[e + 1] - o1[e]) - (double)(o2[e + 1] - o2[e]) : L0[e];
            bad += r[0][e] != want;
        }
        char w[120];
        snprintf(w, sizeof w, "n=%d +1 then -1: cpu = the plain sums, entries past n untouched (differing)", n);
        report("moe_count_acc", w, (double)bad, 0);
        snprintf(w, sizeof w, "n=%d +1 then -1 vs cpu (differing elements)", n);
        report("moe_count_acc", w, (double)ndiff(r[1], r[0], 2 * ((size_t)n + 2)), 0);
        snprintf(w, sizeof w, "n=%d: deterministic (differing elements)", n);
        report("moe_count_acc", w, (double)ndiff(r[1], r[2], 2 * ((size_t)n + 2)), 0);
        for (int p = 0; p < 3; p++) free(r[p]);
        free(L0);
    }
}

/* ---- Mixture-of-Depths routing (mod_route, mod_backward) ----
 * The selection is a rank count, so idx / tpos / slot must equal the cpu's
 * exactly; s is the same float expression (a few ulp of expf apart at
 * most); the loss is a double sum in another order (1e-12 relative).
 * Scores: uniform, or rounded to 0.25 steps in [-1, 1] (ties everywhere,
 * C inside a tie group), with NaN and -inf rows (a NaN ranks as -inf: the
 * two tie, broken by position; in the last case most rows are NaN or -inf
 * and C falls among them). T = 1500 is several chunks of the
 * kernel's block; C = T, C = 1. Outputs are pre-filled with -7 / NaN (a
 * missing write shows). The NaN cases run with loss NULL (the cpu's sum
 * is NaN there); the others run both ways and must agree. */
static float *mod_scores(int n, int ties, int nnan)
{
    float *r = rnd((size_t)n, -3, 3);
    if (ties)
        for (int i = 0; i < n; i++) r[i] = (float)(floor((double)r[i] * 4.0 / 3.0) / 4.0);
    for (int i = 0; i < nnan; i++) {
        r[irand(n)] = NAN;
        r[irand(n)] = -INFINITY;
    }
    return r;
}
/* max over i of the distance in ulps of a[i] and b[i] (NaN = NaN: 0, NaN vs a number: inf) */
static double max_ulp(const float *a, const float *b, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i]))) return INFINITY;
            continue;
        }
        int32_t ia, ib;
        memcpy(&ia, &a[i], 4);
        memcpy(&ib, &b[i], 4);
        int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
        double d = fabs((double)(oa - ob));
        if (d > e) e = d;
    }
    return e;
}
static void test_mod(void)
{
    if (!selected("mod_")) return;
    /* B T C ties nan */
    int cs[][5] = {{3, 37, 5, 0, 0},   {2, 1500, 187, 0, 0}, {3, 37, 37, 0, 0}, {3, 37, 1, 0, 0}, {1, 1, 1, 0, 0},
                   {4, 300, 40, 1, 0}, {2, 1500, 700, 1, 0}, {3, 37, 5, 1, 2},  {2, 600, 90, 1, 5}, {2, 260, 260, 1, 3},
                   {2, 300, 250, 0, 200}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int B = cs[c][0], T = cs[c][1], C = cs[c][2], ties = cs[c][3], nnan = cs[c][4];
        const size_t N = (size_t)B * T, M = (size_t)B * C;
        const float coef = 0.37f;
        float *r = mod_scores((int)N, ties, nnan), *nN = nans(N);
        int32_t *neg = xmalloc(sizeof(int32_t) * N);
        for (size_t i = 0; i < N; i++) neg[i] = -7;
        int32_t *gi[3], *gt[3], *gs[3], *gi0[3], *gt0[3], *gs0[3];
        float *gsig[3], *gsig0[3];
        double gl[3] = {0, 0, 0};
        const double nan_d = NAN;
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dr = upf(b, r, N);
            for (int wl = 0; wl < 2; wl++) {   /* wl 1: with the loss (not in the NaN cases) */
                if (wl && nnan) {
                    gi[p] = gi0[p], gt[p] = gt0[p], gs[p] = gs0[p], gsig[p] = gsig0[p];
                    continue;
                }
                int32_t *di = upi(b, neg, M), *dt = upi(b, neg, M), *ds = upi(b, neg, N);
                float *dsig = upf(b, nN, N);
                double *dl = NULL;
                if (wl) {
                    dl = dalloc(b, sizeof(double));
                    b->ops->copy_from_host(b->ops->be, dl, &nan_d, sizeof(double));
                }
                b->ops->mod_route(b->ops->be, di, dt, ds, dsig, dl, dr, B, T, C, coef);
                (wl ? gi : gi0)[p] = downi(b, di, M);
                (wl ? gt : gt0)[p] = downi(b, dt, M);
                (wl ? gs : gs0)[p] = downi(b, ds, N);
                (wl ? gsig : gsig0)[p] = downf(b, dsig, N);
                if (wl) {
                    b->ops->sync(b->ops->be);
                    b->ops->copy_to_host(b->ops->be, &gl[p], dl, sizeof(double));
                }
            }
            release(b);
        }
        char w[128], k[64];
        snprintf(k, sizeof k, "B=%d T=%d C=%d%s%s", B, T, C, ties ? " ties" : "", nnan ? " NaN -inf, loss NULL" : "");
        /* loss NULL changes nothing else */
        size_t d0 = 0;
        for (int p = 0; p < 3; p++)
            d0 += ndiff(gi[p], gi0[p], M) + ndiff(gt[p], gt0[p], M) + ndiff(gs[p], gs0[p], N) +
                  ndiff(gsig[p], gsig0[p], N);
        if (!nnan) {
            snprintf(w, sizeof w, "%s loss NULL: same outputs (differing)", k);
            report("mod_route", w, (double)d0, 0);
            double e = fabs(gl[1] - gl[0]) / fabs(gl[0]);
            snprintf(w, sizeof w, "%s loss (=) rel", k);
            report("mod_route", w, isfinite(gl[0]) && gl[0] != 0 ? e : INFINITY, 1e-12);
            snprintf(w, sizeof w, "%s loss: deterministic (differing)", k);
            report("mod_route", w, (double)ndiff(&gl[1], &gl[2], 2), 0);
        }
        snprintf(w, sizeof w, "%s s (=), ulps", k);
        report("mod_route", w, max_ulp(gsig[1], gsig[0], N), 4);
        snprintf(w, sizeof w, "%s s: deterministic (differing)", k);
        report("mod_route", w, (double)ndiff(gsig[1], gsig[2], N), 0);
        snprintf(w, sizeof w, "%s idx", k);
        check3i("mod_route", w, gi, M);
        snprintf(w, sizeof w, "%s tpos", k);
        check3i("mod_route", w, gt, M);
        snprintf(w, sizeof w, "%s slot", k);
        check3i("mod_route", w, gs, N);
        for (int p = 0; p < 3; p++) {
            free(gsig[p]);
            if (!nnan) free(gi0[p]), free(gt0[p]), free(gs0[p]), free(gsig0[p]);
        }
        free(r); free(nN); free(neg);
    }
    /* mod_backward on a cpu routing: dr (=) with NaN prefill, dx scaled in place on the selected rows;
     * dgate NaN on the unselected rows (the formula does not read it there) */
    int bs[][4] = {{3, 37, 5, 64}, {2, 1500, 187, 33}, {1, 300, 300, 8}, {2, 50, 1, 1}};
    const float aux[] = {0.01f, 0.003f, 0.0f, 0.5f};
    for (size_t c = 0; c < sizeof bs / sizeof bs[0]; c++) {
        const int B = bs[c][0], T = bs[c][1], C = bs[c][2], D = bs[c][3], N = B * T;
        const size_t nd = (size_t)N * D;
        float *r = mod_scores(N, 0, 0), *s = xmalloc(sizeof(float) * N), *dg = rnd((size_t)N, -2, 2);
        float *x = rnd(nd, -2, 2), *nN = nans((size_t)N);
        int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)B * C), *tp = xmalloc(sizeof(int32_t) * (size_t)B * C);
        int32_t *slot = xmalloc(sizeof(int32_t) * N);
        mt_ops_cpu()->mod_route(mt_ops_cpu()->be, idx, tp, slot, s, NULL, r, B, T, C, 0.0f);
        for (int n = 0; n < N; n++)
            if (slot[n] < 0) dg[n] = NAN;
        float *gr[3], *gx[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *ddr = upf(b, nN, (size_t)N), *ddx = upf(b, x, nd), *ddg = upf(b, dg, (size_t)N);
            float *ds = upf(b, s, (size_t)N);
            int32_t *dsl = upi(b, slot, (size_t)N);
            b->ops->mod_backward(b->ops->be, ddr, ddx, ddg, ds, dsl, N, D, aux[c]);
            gr[p] = downf(b, ddr, (size_t)N);
            gx[p] = downf(b, ddx, nd);
            release(b);
        }
        size_t kept = 0;
        for (int n = 0; n < N; n++)
            if (slot[n] < 0) kept += ndiff(gx[1] + (size_t)n * D, x + (size_t)n * D, (size_t)D);
        char w[128], k[64];
        snprintf(k, sizeof k, "N=%d D=%d C=%d aux=%g", N, D, C, (double)aux[c]);
        snprintf(w, sizeof w, "%s unselected dx rows untouched (differing)", k);
        report("mod_backward", w, (double)kept, 0);
        snprintf(w, sizeof w, "%s dr (=)", k);
        report("mod_backward", w, rel_err(gr[1], gr[0], (size_t)N), 1e-6);
        snprintf(w, sizeof w, "%s dr: deterministic (differing)", k);
        report("mod_backward", w, (double)ndiff(gr[1], gr[2], (size_t)N), 0);
        snprintf(w, sizeof w, "%s dx (in place)", k);
        report("mod_backward", w, rel_err(gx[1], gx[0], nd), 1e-6);
        snprintf(w, sizeof w, "%s dx: deterministic (differing)", k);
        report("mod_backward", w, (double)ndiff(gx[1], gx[2], nd), 0);
        for (int p = 0; p < 3; p++) free(gr[p]), free(gx[p]);
        free(r); free(s); free(dg); free(x); free(nN); free(idx); free(tp); free(slot);
    }
}

/* ---- optimizer kernels ---- */
static void test_optim(void)
{
    if (!selected("adamw") && !selected("muon") && !selected("transpose")) return;
    const size_t n = 10007;
    float *p0 = rnd(n, -1, 1), *g = rnd(n, -1, 1), *m0 = rnd(n, -0.1, 0.1), *v0 = rnd(n, 0, 0.01), *nn = nans(n);
    float *rp[3], *rm[3], *rv[3], *rd[3], *rmm[3], *ra[3];
    for (int p = 0; p < 3; p++) {
        struct be *b = BE(p);
        float *dp = upf(b, p0, n), *dg = upf(b, g, n), *dm = upf(b, m0, n), *dv = upf(b, v0, n);
        b->ops->adamw_update(b->ops->be, dp, dg, dm, dv, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f - 0.9f * 0.9f * 0.9f,
                             1.0f - 0.95f * 0.95f * 0.95f);
        rp[p] = downf(b, dp, n);
        rm[p] = downf(b, dm, n);
        rv[p] = downf(b, dv, n);
        float *dd = upf(b, nn, n), *mm = upf(b, m0, n);
        b->ops->muon_momentum(b->ops->be, dd, mm, dg, 0.95f, n, 1.0f);
        rd[p] = downf(b, dd, n);
        rmm[p] = downf(b, mm, n);
        b->ops->muon_momentum(b->ops->be, dg, mm, dg, 0.95f, n, 0.37f);  /* d aliases g; the clip's scale */
        ra[p] = downf(b, dg, n);
        release(b);
    }
    check3("adamw_update", "p", rp, n);
    check3("adamw_update", "m", rm, n);
    check3("adamw_update", "v", rv, n);
    check3("muon_momentum", "d (=)", rd, n);
    check3("muon_momentum", "m", rmm, n);
    check3("muon_momentum", "d aliases g", ra, n);
    int shapes[][2] = {{70, 45}, {1, 33}, {64, 64}};
    for (int s = 0; s < 3; s++) {
        int R = shapes[s][0], Cc = shapes[s][1];
        size_t nt = (size_t)R * Cc;
        float *x = rnd(nt, -1, 1), *nt_ = nans(nt), *rt[3];
        for (int p = 0; p < 3; p++) {
            struct be *b = BE(p);
            float *dx = upf(b, x, nt), *o = upf(b, nt_, nt);
            b->ops->transpose(b->ops->be, o, dx, R, Cc);
            rt[p] = downf(b, o, nt);
            release(b);
        }
        char w[64];
        snprintf(w, sizeof w, "rows=%d cols=%d", R, Cc);
        check3("transpose", w, rt, nt);
        free(x);
        free(nt_);
    }
    free(p0); free(g); free(m0); free(v0); free(nn);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a crash on a GPU keeps every line before it in the log */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) g_filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-o OP_SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    char why[256] = "";
    const struct mt_ops_i *cuda = mt_ops_cuda(why, sizeof why);
    if (!cuda && !strncmp(why, "MT_CUDA_", 8)) {  /* a bad tunable, not a missing GPU */
        printf("FAIL: %s\n", why);
        return 1;
    }
    if (!cuda) {
        printf("SKIPPED (no GPU: %s)\n", why[0] ? why : "mt_ops_cuda returned NULL");
        return 77;
    }
    struct mt_ops_cuda_info info;
    if (mt_ops_cuda_get_info(&info) == MT_OK)
        printf("cuda device: %s (sm_%d%d, %d SMs, %.1f GiB), runtime %d, cuBLAS %d\n", info.device, info.cc_major,
               info.cc_minor, info.sm_count, (double)info.mem_total / (1024.0 * 1024.0 * 1024.0),
               info.runtime_version, info.cublas_version);
    /* the precision chosen at creation: MT_CUDA_PRECISION if set, else fp32 */
    const char *envp = getenv(MT_CUDA_PRECISION_ENV);
    printf("cuda precision at creation: %s (%s), bf16 operand scratch cap %zu MiB\n",
           mt_ops_cuda_precision_name(mt_ops_cuda_get_precision()), info.precision_source, info.bf16_scratch_cap >> 20);
    g_be[0].ops = mt_ops_cpu();
    g_be[0].name = "cpu";
    g_be[1].ops = cuda;
    g_be[1].name = "cuda";
    mt_ctx_init(&g_be[0].ctx);
    mt_ctx_init(&g_be[1].ctx);
    report("precision", "at creation = MT_CUDA_PRECISION (or fp32 when unset)",
           strcmp(mt_ops_cuda_precision_name(mt_ops_cuda_get_precision()), envp && envp[0] ? envp : "fp32") != 0, 0);

    /* ---- fp32 mode: every op to 1e-5 ---- */
    mt_ops_cuda_set_precision(MT_CUDA_PRECISION_FP32);
    RUN(1, test_table());
    RUN(2, test_memory());
    RUN(3, test_fill_axpby());
    RUN(4, test_reductions());
    RUN(26, test_nonfinite_mark());
    RUN(5, test_gemm());
    RUN(17, test_gemm_grouped(0));
    RUN(6, test_embed());
    RUN(7, test_rmsnorm());
    RUN(8, test_rope());
    RUN(9, test_attention());
    RUN(10, test_swiglu());
    RUN(23, test_vec_elementwise());
    RUN(27, test_cast_multi());
    RUN(24, test_redo());
    RUN(11, test_xent());
    RUN(12, test_router());
    RUN(13, test_moe());
    RUN(21, test_moe_route());
    RUN(22, test_moe_aux());
    RUN(25, test_mod());
    RUN(14, test_optim());
    RUN(28, test_adamw_multi());
    RUN(19, test_fused());
    RUN(29, test_gemm_grouped_rows());
    RUN(30, test_gemm_grouped_sum());
    RUN(31, test_moe_count_acc());
    RUN(35, test_init_normal());
    RUN(32, test_wgmma());
    /* the grouped GEMMs on wgmma (opt-in, new), after the rest: a fault there costs no other group */
    RUN(33, test_gemm_grouped_rows_wgmma());
    RUN(34, test_gemm_grouped_sum_wgmma());

    /* ---- bf16 mode: gemm to the derived bound ---- */
    RUN(15, test_precision_api());
    RUN(16, test_gemm_bf16());
    RUN(18, test_gemm_grouped(1));
    RUN(19, test_bf16_operands());   /* independent of the plain entry's precision */
    RUN(20, test_instances());      /* a second instance (bf16) beside the default (fp32) */
    struct mt_ops_cuda_info after;
    if (mt_ops_cuda_get_info(&after) == MT_OK)
        printf("cuda bf16: %ld cuBLASLt matmuls, %ld sgemm fallbacks\n", after.gemm_bf16_calls,
               after.gemm_bf16_fallbacks);
    mt_ops_cuda_set_precision(MT_CUDA_PRECISION_FP32);

    char msg[512];
    cuda->sync(cuda->be);
    enum mt_status st = mt_ops_cuda_status(msg, sizeof msg);
    report("status", st == MT_OK ? "no CUDA error recorded" : msg, st != MT_OK, 0);
    report("accounting", "cuda ctx bytes live after all frees", (double)g_be[1].ctx.bytes_live_total, 0);
    printf("cuda_ops_vs_cpu: %d checks, %d passed, %d failed\n", g_pass + g_fail, g_pass, g_fail);
    mt_ctx_free(&g_be[0].ctx);
    mt_ctx_free(&g_be[1].ctx);
    return g_fail ? 1 : 0;
}
