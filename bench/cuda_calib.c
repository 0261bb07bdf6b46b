/*
 * cuda_calib.c — measured GEMM, attention and one-rank all-reduce rates of
 * the cuda backend, for the planner's GPU profile (docs/cuda.md,
 * "Calibrating the planner's GPU profile"; bench/profiles/gpu_profile.py
 * turns the output into a profile).
 *
 *   cuda_calib [--quick] [--reps N] [--warmup N] [--gemm MxNxK,...]
 *              [--attn BxTxHxD,...] [--scan BxTxHxPxNxQ,...] [--allreduce-mib A,B,...]
 *              [--out FILE]
 *
 * Everything goes through the ops table (src/ops/mt_ops.h) of the default
 * cuda instance, as the trainer does: gemm in fp32 precision (cublasSgemm,
 * IEEE fp32), gemm in bf16 precision with fp32 operands (rounded per call,
 * as the plain gemm entry does in MT_CUDA_PRECISION=bf16), gemm_bf16 on
 * bf16 operands as stored (the weights' shadows: the tensor-core rate), and
 * attention_forward / attention_backward (causal), in fp32 and with the
 * precision=bf16 entries (attention_*_bf16: tensor cores) under each of their
 * kernel sets, v1 (wmma), v2 (FlashAttention-2-class) and v3 (v2 with 128
 * query rows a block; knob attn_kernel, set per row; rows of a head dim v2
 * lacks say "kernel": "v1" three times and v2_ran false): four rows per shape. Every timed run is one
 * call followed by ops->sync: the wall time of the queued work. The figure
 * is the median of --reps runs after --warmup untimed ones.
 *
 * FLOP counts: gemm 2*M*N*K. Attention (the flash-attention papers' count):
 * forward 4*B*H*T*T*hd, halved for the causal mask; backward 2.5x the
 * forward (five T x T x hd products instead of two).
 *
 * Muon ("muon_ns"): one iteration of the batched bf16 Newton–Schulz
 * (src/optim/muon.c) at the d2048 and GPT-2 124M benchmarks' batches, three
 * gemm_bf16_batched calls, nb (4 s^2 l + 2 s^3) FLOPs; "muon_ns_bf16_flop_per_s"
 * their sum over their time (the planner's optimizer rate where it runs).
 *
 * MoE experts ("grouped"): gpu_moe8's expert products (8 groups of 1024
 * rows, d_model 2048, expert_hidden 2752) through the device-sized entries
 * gemm_grouped_rows / gemm_grouped_sum (one launch; at both block tile
 * widths, bn 256 and 128: MT_CUDA_GG_BN) and as one gemm_bf16 a group (the
 * host-sized path), 2*M*F*D FLOPs each: the moe_sizes A/B; and, last
 * ("grouped_wgmma", below), where wgmma runs, each product with
 * grouped_gemm_kernel=wgmma, checked against the mma.sync result first.
 *
 * Mamba-3 scan (ssm_scan_forward + ssm_scan_backward, the chunked SSD form
 * at chunk Q; the d_model 2048 hybrid's M layer by default: B 4, T 2048,
 * H 64 heads of P 64, state N 64, chunk 64): FLOPs counted as the
 * recurrence, the planner's convention (src/model/mamba.c mamba_extra,
 * src/plan/plan.c): per token and head the state update alpha S + gamma x
 * B^T + beta x' B'^T (3 P N multiply-adds) and the read S C (P N): forward
 * 8*B*T*H*P*N, backward twice that (16*B*T*H*P*N), fwd+bwd 24*B*T*H*P*N.
 * The chunked form's extra intra-chunk products are not counted (as flash
 * attention's recompute is not), so this is an effective rate, directly
 * comparable with the planner's MT_PLAN_KIND_SCAN work. "layer_core" puts
 * the scan's fwd+bwd seconds beside the attention rows' at the same B and T
 * (the core of an M layer vs that of an A layer; the projections are GEMMs,
 * timed in the gemm rows).
 *
 * Last, and never fatal (a wrong kernel or a CUDA error is reported in its row,
 * and every row above is already written): "wgmma", the wgmma probe
 * (mt_ops_cuda_wgmma_probe_of, A from shared memory and from registers, K-major,
 * and the MN-major forms: B, A, both) checked against gemm_bf16 and timed beside
 * it; "attention_v4", attn_kernel=v4's forward and backward (wgmma; dQ v3's)
 * against v3's results and timed beside it, per shape of head dim 64 or 128,
 * the two directions checked and timed apart;
 * "attention_v5", the same for attn_kernel=v5 (v4 reading its transposed
 * operands MN-major: the first use of that wgmma form in attention);
 * "attention_order", v3 in the default block order (longest tile first in
 * L2-sized groups of pairs, attn_sched.cuh) against groups of one pair (the
 * order before): the same bits, and each order's forward and backward times;
 * "grouped_wgmma" (calib_grouped_wgmma), the experts' products on wgmma.
 *
 * All-reduce: with NCCL in the build (MT_WITH_NCCL) a one-rank NCCL world
 * (mt_comm_nccl_create_world with no MPI world), mt_comm_allreduce in place
 * over 1..256 MiB; bandwidth = bytes / time ("algbw"; a one-rank ring moves
 * nothing over a link, so this is not a link figure). Without NCCL the
 * one-rank device comm is self_dev, whose all-reduce is the identity: the
 * JSON says so and times a device copy (ops->copy) of the same sizes
 * instead (bytes / time, one read and one write of each byte).
 *
 * Before timing, one small gemm per precision is checked against a double
 * reference on the host (fp32 to 1e-5 of max|C|; bf16 on bf16-rounded
 * operands to 1e-4), so a broken kernel is not timed: exit 1 with
 * "check": {"ok": false} in the JSON. Exit 77 with "SKIPPED (no GPU: ...)"
 * where there is no device. --quick: tiny sizes (the CPU emulator of
 * tests/test_cuda_build.sh; its numbers are meaningless, the run checks
 * that the program works and writes valid JSON).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_knobs.h"
#include "parallel/mt_comm.h"
#include "parallel/mt_mesh.h"
#include "ops/mt_ops.h"
#include "ops/cuda/mt_ops_cuda.h"
#ifdef MT_WITH_NCCL
#include "parallel/comm_nccl.h"
#endif

#define CAL_MAX_SHAPES 32
#define CAL_ATTN_ROWS  4   /* per attention shape: fp32, bf16 v1, v2, v3 */

struct cal_gemm_shape { int m, n, k; const char *set; };
struct cal_attn_shape { int b, t, h, hd; };
struct cal_scan_shape { int b, t, h, p, n, q; };

static const struct mt_ops_i *g_ops;
static struct mt_ctx g_ctx;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void)  /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* bf16 round to nearest even, back in fp32 (finite inputs only here) */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static mt_bf16 to_bf16(float x)
{
    float r = round_bf16(x);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (mt_bf16)(u >> 16);
}

static double bf16_to_f(mt_bf16 h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void *dev_alloc(size_t bytes)
{
    void *p = g_ops->buf_alloc(g_ops->be, &g_ctx, bytes ? bytes : 4, MT_BUCKET_WORKSPACE);
    if (!p) {
        fprintf(stderr, "cuda_calib: device allocation of %zu bytes failed: %s\n", bytes, mt_ctx_last_error(&g_ctx));
        exit(1);
    }
    return p;
}

/* a device buffer of n floats uniform in [-1, 1) (uploaded in 16 MiB pieces) */
static float *dev_rand(size_t n)
{
    float *d = dev_alloc(n * sizeof(float));
    size_t piece = (size_t)1 << 22;
    float *h = malloc((n < piece ? n : piece) * sizeof(float));
    if (!h) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    for (size_t i = 0; i < n; i += piece) {
        size_t c = n - i < piece ? n - i : piece;
        for (size_t j = 0; j < c; j++) h[j] = frand();
        g_ops->copy_from_host(g_ops->be, d + i, h, c * sizeof(float));
    }
    g_ops->sync(g_ops->be);
    free(h);
    return d;
}

/* a device buffer of n floats uniform in [lo, hi) */
static float *dev_uniform(size_t n, float lo, float hi)
{
    float *d = dev_alloc(n * sizeof(float));
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    for (size_t j = 0; j < n; j++) h[j] = lo + (hi - lo) * 0.5f * (frand() + 1.0f);
    g_ops->copy_from_host(g_ops->be, d, h, n * sizeof(float));
    g_ops->sync(g_ops->be);
    free(h);
    return d;
}

/* fails (exit 1) on a sticky CUDA error, naming the phase */
static void check_status(const char *phase)
{
    char msg[512];
    g_ops->sync(g_ops->be);
    if (mt_ops_cuda_status_of(g_ops->be, msg, sizeof msg) != MT_OK) {
        fprintf(stderr, "cuda_calib: CUDA error during %s: %s\n", phase, msg);
        exit(1);
    }
}

/* ---------------------------------------------------------------- timing */

enum cal_gemm_kind { CAL_FP32, CAL_BF16_F32IN, CAL_BF16 };
static const char *const k_kind_name[] = {"fp32", "bf16_fp32_operands", "bf16"};

struct cal_gemm_ctx {
    enum cal_gemm_kind kind;
    int m, n, k;
    const float *a, *b;
    const mt_bf16 *a16, *b16;
    float *c;
};

static void run_gemm(const struct cal_gemm_ctx *g)
{
    /* y = x W^T, the linear layer's form: A (M,K), B (N,K) transposed */
    if (g->kind == CAL_BF16)
        g_ops->gemm_bf16(g_ops->be, 0, 1, g->m, g->n, g->k, 1.0f, g->a16, MT_ELEM_BF16, g->k, g->b16, MT_ELEM_BF16,
                         g->k, 0.0f, g->c, g->n);
    else
        g_ops->gemm(g_ops->be, 0, 1, g->m, g->n, g->k, 1.0f, g->a, g->k, g->b, g->k, 0.0f, g->c, g->n);
}

/* median and min of reps timed runs after warmup untimed ones */
struct cal_time { double median, min; };
typedef void (*cal_fn)(const void *arg);

static struct cal_time time_runs(cal_fn fn, const void *arg, int warmup, int reps)
{
    double t[256];
    if (reps > 256) reps = 256;
    for (int i = 0; i < warmup; i++) fn(arg);
    g_ops->sync(g_ops->be);
    for (int i = 0; i < reps; i++) {
        double t0 = mt_time_sec();
        fn(arg);
        g_ops->sync(g_ops->be);
        t[i] = mt_time_sec() - t0;
    }
    struct cal_time r;
    r.median = mt_sort_median(t, reps);   /* sorts t: t[0] is the minimum */
    r.min = t[0];
    return r;
}

static void gemm_fn(const void *arg) { run_gemm(arg); }

/* Hopper's warpgroup MMA, probed (mt_ops_cuda_wgmma_probe_of: C = A B^T, bf16
 * operands as stored): its status kept for the row */
struct cal_wgmma_ctx { int m, n, k, form; const mt_bf16 *a, *b; float *c; enum mt_status st; };
static void wgmma_fn(const void *arg)
{
    struct cal_wgmma_ctx *w = (struct cal_wgmma_ctx *)arg;
    w->st = mt_ops_cuda_wgmma_probe_of(g_ops->be, w->c, w->a, w->b, w->m, w->n, w->k, w->form);
}

/* The MoE experts' products (issue 28 item 2): E equal groups of R rows of a
 * sorted buffer. grouped: the device-sized entries (gemm_grouped_rows: the
 * forward's x W^T, the backward's dy W; gemm_grouped_sum: dW += dy^T x),
 * one launch each; loop: one gemm_bf16 per group, the host-sized path
 * (moe_sizes=host). Same FLOPs, same operands. */
enum cal_grp_kind { CAL_GRP_NT, CAL_GRP_NN, CAL_GRP_SUM, CAL_GRP_KINDS };
static const char *const k_grp_name[CAL_GRP_KINDS] = {"rows_xWT", "rows_dyW", "sum_dW"};
struct cal_grp_ctx {
    enum cal_grp_kind kind;
    int loop, E, R, D, F;                 /* groups, rows a group, d_model, expert_hidden */
    const int32_t *offs;                  /* device, E+1 */
    const mt_bf16 *x, *w[64];             /* x (E R, D) or (E R, F); w: each group's weight */
    float *c, *cg[64];                    /* rows output (E R, .); sum outputs (F, D) each */
};
static void grp_fn(const void *arg)
{
    const struct cal_grp_ctx *g = arg;
    const int E = g->E, R = g->R, D = g->D, F = g->F;
    switch (g->kind) {
    case CAL_GRP_NT:   /* g = x Wg^T: (R, D) x (F, D)^T */
        if (!g->loop) g_ops->gemm_grouped_rows(g_ops->be, E, g->offs, E * R, F, D, 1, 1.0f, g->x, D, g->w, D, 0.0f,
                                               g->c, MT_ELEM_F32, F);
        else for (int e = 0; e < E; e++)
            g_ops->gemm_bf16(g_ops->be, 0, 1, R, F, D, 1.0f, g->x + (size_t)e * R * D, MT_ELEM_BF16, D, g->w[e],
                             MT_ELEM_BF16, D, 0.0f, g->c + (size_t)e * R * F, F);
        break;
    case CAL_GRP_NN:   /* dx = dg Wg: (R, F) x (F, D) */
        if (!g->loop) g_ops->gemm_grouped_rows(g_ops->be, E, g->offs, E * R, D, F, 0, 1.0f, g->x, F, g->w, D, 0.0f,
                                               g->c, MT_ELEM_F32, D);
        else for (int e = 0; e < E; e++)
            g_ops->gemm_bf16(g_ops->be, 0, 0, R, D, F, 1.0f, g->x + (size_t)e * R * F, MT_ELEM_BF16, F, g->w[e],
                             MT_ELEM_BF16, D, 0.0f, g->c + (size_t)e * R * D, D);
        break;
    default:           /* dWg (F, D) += dg^T x: (R, F)^T (R, D); x: dg, then the (E R, D) input at w[0] */
        if (!g->loop) g_ops->gemm_grouped_sum(g_ops->be, E, g->offs, F, D, 1.0f, g->x, F, g->w[0], D, 1.0f,
                                              g->cg, D);
        else for (int e = 0; e < E; e++)
            g_ops->gemm_bf16(g_ops->be, 1, 0, F, D, R, 1.0f, g->x + (size_t)e * R * F, MT_ELEM_BF16, F,
                             g->w[0] + (size_t)e * R * D, MT_ELEM_BF16, D, 1.0f, g->cg[e], D);
        break;
    }
}

/* The grouped product once, into a zeroed output for sum_dW (the timed calls
 * accumulate there), read back to the host (n floats: *n_out): the wgmma row's
 * check against the mma.sync kernels' result. zeros: F D floats of 0. */
static float *grp_once(const struct cal_grp_ctx *g, const float *zeros, size_t *n_out)
{
    const size_t M = (size_t)g->E * g->R, nw = (size_t)g->F * g->D;
    const size_t n = g->kind == CAL_GRP_SUM ? (size_t)g->E * nw : M * (size_t)(g->kind == CAL_GRP_NT ? g->F : g->D);
    float *h = malloc(n * sizeof(float));
    if (!h) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    if (g->kind == CAL_GRP_SUM)
        for (int e = 0; e < g->E; e++) g_ops->copy_from_host(g_ops->be, g->cg[e], zeros, nw * sizeof(float));
    grp_fn(g);
    if (g->kind == CAL_GRP_SUM)
        for (int e = 0; e < g->E; e++) g_ops->copy_to_host(g_ops->be, h + (size_t)e * nw, g->cg[e], nw * sizeof(float));
    else
        g_ops->copy_to_host(g_ops->be, h, g->c, n * sizeof(float));
    *n_out = n;
    return h;
}

/* Muon's bf16 Newton–Schulz (src/optim/muon.c muon_update_bf16, a wide or
 * square batch): one iteration's three gemm_bf16_batched calls on nb matrices
 * of (s, l), np and sp elements apart; FLOPs nb (4 s^2 l + 2 s^3) */
struct cal_ns_ctx { int s, l, nb; size_t np, sp; mt_bf16 *x, *y, *a, *b; };
static void ns_fn(const void *arg)
{
    const struct cal_ns_ctx *c = arg;
    const int s = c->s, l = c->l;
    g_ops->gemm_bf16_batched(g_ops->be, 0, 1, s, s, l, 1.0f, c->x, l, c->np, c->x, l, c->np, 0.0f, NULL, c->a, s, c->sp,
                             c->nb);
    g_ops->gemm_bf16_batched(g_ops->be, 0, 0, s, s, s, 2.0315f, c->a, s, c->sp, c->a, s, c->sp, -4.775f, c->a, c->b, s,
                             c->sp, c->nb);
    g_ops->gemm_bf16_batched(g_ops->be, 0, 0, s, l, s, 1.0f, c->b, s, c->sp, c->x, l, c->np, 3.4445f, c->x, c->y, l,
                             c->np, c->nb);
}

/* --------------------------------------------------------------- checks */

/* one small gemm per kind against a double host reference. Returns the
 * worst error relative to max|C_ref|. */
static double check_gemm(enum cal_gemm_kind kind, int m, int n, int k)
{
    size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
    float *ha = malloc(na * 4), *hb = malloc(nb * 4), *hc = malloc(nc * 4);
    mt_bf16 *ha16 = malloc(na * 2), *hb16 = malloc(nb * 2);
    if (!ha || !hb || !hc || !ha16 || !hb16) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    for (size_t i = 0; i < na; i++) ha[i] = frand();
    for (size_t i = 0; i < nb; i++) hb[i] = frand();
    int bf = kind != CAL_FP32;
    /* the reference sees the operands the kernel multiplies: bf16-rounded in bf16 precision */
    double worst = 0, cmax = 0;
    double *ref = malloc(nc * sizeof(double));
    if (!ref) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float x = ha[(size_t)i * k + p], y = hb[(size_t)j * k + p];
                if (bf) x = round_bf16(x), y = round_bf16(y);
                s += (double)x * (double)y;
            }
            ref[(size_t)i * n + j] = s;
            if (fabs(s) > cmax) cmax = fabs(s);
        }
    for (size_t i = 0; i < na; i++) ha16[i] = to_bf16(ha[i]);
    for (size_t i = 0; i < nb; i++) hb16[i] = to_bf16(hb[i]);
    struct cal_gemm_ctx g = {kind, m, n, k, NULL, NULL, NULL, NULL, NULL};
    float *da = dev_alloc(na * 4), *db = dev_alloc(nb * 4), *dc = dev_alloc(nc * 4);
    mt_bf16 *da16 = dev_alloc(na * 2), *db16 = dev_alloc(nb * 2);
    g_ops->copy_from_host(g_ops->be, da, ha, na * 4);
    g_ops->copy_from_host(g_ops->be, db, hb, nb * 4);
    g_ops->copy_from_host(g_ops->be, da16, ha16, na * 2);
    g_ops->copy_from_host(g_ops->be, db16, hb16, nb * 2);
    g.a = da, g.b = db, g.a16 = da16, g.b16 = db16, g.c = dc;
    run_gemm(&g);
    g_ops->sync(g_ops->be);
    g_ops->copy_to_host(g_ops->be, hc, dc, nc * 4);
    for (size_t i = 0; i < nc; i++) {
        double e = fabs((double)hc[i] - ref[i]);
        if (!(e <= worst)) worst = e;  /* NaN sticks */
    }
    g_ops->buf_free(g_ops->be, &g_ctx, da), g_ops->buf_free(g_ops->be, &g_ctx, db);
    g_ops->buf_free(g_ops->be, &g_ctx, dc), g_ops->buf_free(g_ops->be, &g_ctx, da16);
    g_ops->buf_free(g_ops->be, &g_ctx, db16);
    free(ha), free(hb), free(hc), free(ha16), free(hb16), free(ref);
    return cmax > 0 ? worst / cmax : worst;
}

/* ------------------------------------------------------------- attention */

struct cal_attn_ctx {
    int b, t, h, hd, fwd, bf16;  /* bf16: the precision=bf16 entries (tensor cores), 1 = v1, 2 = v2 */
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    mt_bf16 *qkvb;   /* bf16: the rounded q, k, v the forward leaves for the backward (as the model runs it) */
    mt_bf16 *outb, *doutb;   /* bf16: out and dout as bf16 only, as the model hands them (attention.c) */
    mt_bf16 *dqb, *dkb;      /* bf16: dq, dk leave as bf16 only, as the model takes them */
};

static void attn_fn(const void *arg)
{
    const struct cal_attn_ctx *a = arg;
    if (a->bf16 && a->fwd)
        g_ops->attention_forward_bf16(g_ops->be, NULL, a->outb, a->lse, a->q, a->k, a->v, a->b, a->t, a->h, a->h,
                                      a->hd, a->qkvb);
    else if (a->bf16)
        g_ops->attention_backward_bf16(g_ops->be, a->dq, a->dk, a->dv, NULL, a->q, a->k, a->v, NULL, a->lse, a->b,
                                       a->t, a->h, a->h, a->hd, a->qkvb, NULL, a->doutb, a->outb, a->dqb, a->dkb,
                                       0);
    else if (a->fwd)
        g_ops->attention_forward(g_ops->be, a->out, a->lse, a->q, a->k, a->v, a->b, a->t, a->t, 0, a->h, a->h, a->hd);
    else
        g_ops->attention_backward(g_ops->be, a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->b,
                                  a->t, a->h, a->h, a->hd);
}

/* ------------------------------------------------------------- Mamba-3 scan */

struct cal_scan_ctx {
    struct cal_scan_shape s;
    int fwd, bf16;   /* bf16: ssm_scan_*_bf16 (precision=bf16's entries) */
    float *x, *Bm, *Cm, *dt, *lam, *A, *Dsk, *y, *dy, *dx, *dBm, *dCm, *ddt, *dlam, *dA, *dDsk;
    float *states;   /* bf16: the chunk states the forward keeps for the backward, as training runs it */
    mt_bf16 *Bb, *Cb; /* bf16: B and C's bf16 twins (the prep writes them in training) */
    mt_bf16 *Yb;      /* bf16: dy's twin (the gated norm's backward writes it in training) */
};

static void scan_fn(const void *arg)
{
    const struct cal_scan_ctx *c = arg;
    const struct cal_scan_shape *s = &c->s;
    if (c->fwd && c->bf16)
        g_ops->ssm_scan_forward_bf16(g_ops->be, c->states ? NULL : c->y, c->x, s->h * s->p, c->Bm, c->Cm, c->dt,
                                     c->lam, c->A, c->Dsk,
                                     s->b, s->t, s->h, s->p, s->n, s->q, c->states, c->Bb, c->Cb,
                                     c->states ? (mt_bf16 *)c->y : NULL, NULL, 0);   /* y as bf16 only, as training */
    else if (c->fwd)
        g_ops->ssm_scan_forward(g_ops->be, c->y, c->x, c->Bm, c->Cm, c->dt, c->lam, c->A, c->Dsk, s->b, s->t, s->h,
                                s->p, s->n, s->q);
    else if (c->bf16)
        g_ops->ssm_scan_backward_bf16(g_ops->be, c->dx, c->dBm, c->dCm, c->ddt, c->dlam, c->dA, c->dDsk, c->dy, c->x,
                                      s->h * s->p, c->Bm, c->Cm, c->dt, c->lam, c->A, c->Dsk, s->b, s->t, s->h, s->p, s->n, s->q,
                                      c->states, NULL, c->Bb, c->Cb, c->Yb, NULL, 0,
                                      c->states ? (mt_bf16 *)c->dBm : NULL,   /* dB, dC as bf16 only, as training */
                                      c->states ? (mt_bf16 *)c->dCm : NULL);
    else
        g_ops->ssm_scan_backward(g_ops->be, c->dx, c->dBm, c->dCm, c->ddt, c->dlam, c->dA, c->dDsk, c->dy, c->x,
                                 c->Bm, c->Cm, c->dt, c->lam, c->A, c->Dsk, s->b, s->t, s->h, s->p, s->n, s->q);
}

/* --------------------------------------------------------- copy / comm */

struct cal_copy_ctx { void *dst, *src; size_t bytes; };
static void copy_fn(const void *arg)
{
    const struct cal_copy_ctx *c = arg;
    g_ops->copy(g_ops->be, c->dst, c->src, c->bytes);
}

#ifdef MT_WITH_NCCL
struct cal_ar_ctx { struct mt_comm *c; float *buf; size_t n; int failed; };
static void allreduce_fn(const void *arg)
{
    struct cal_ar_ctx *a = (struct cal_ar_ctx *)arg;
    if (mt_comm_allreduce(&g_ctx, a->c, a->buf, a->n, MT_DTYPE_F32, MT_REDOP_SUM) != MT_OK) a->failed = 1;
}
#endif

/* ------------------------------------------------------------------ args */

static int parse_list3(const char *s, struct cal_gemm_shape *out, int max, const char *set)
{
    int n = 0;
    while (s && *s && n < max) {
        int m, nn, k, used = 0;
        if (sscanf(s, "%dx%dx%d%n", &m, &nn, &k, &used) != 3 || m < 1 || nn < 1 || k < 1) return -1;
        out[n++] = (struct cal_gemm_shape){m, nn, k, set};
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse_list4(const char *s, struct cal_attn_shape *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        int b, t, h, d, used = 0;
        if (sscanf(s, "%dx%dx%dx%d%n", &b, &t, &h, &d, &used) != 4 || b < 1 || t < 1 || h < 1 || d < 1) return -1;
        out[n++] = (struct cal_attn_shape){b, t, h, d};
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse_list6(const char *s, struct cal_scan_shape *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        int b, t, h, p, st, q, len = 0;
        if (sscanf(s, "%dx%dx%dx%dx%dx%d%n", &b, &t, &h, &p, &st, &q, &len) != 6 || b < 1 || t < 1 || h < 1 ||
            p < 1 || st < 1 || q < 1)
            return -1;
        out[n++] = (struct cal_scan_shape){b, t, h, p, st, q};
        s += len;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse_sizes(const char *s, double *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v > 0)) return -1;
        out[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr, "usage: cuda_calib [--quick] [--reps N] [--warmup N] [--gemm MxNxK,...] [--attn BxTxHxD,...]\n"
                    "                  [--scan BxTxHxPxNxQ,...] [--allreduce-mib A,B,...] [--out FILE]\n");
}

/* ------------------------------------------------------------------ JSON */

/* every piece of the JSON goes to stdout and, with --out, to the file too */
static FILE *g_out2;
static void emit(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    if (g_out2) {
        va_start(ap, fmt);
        vfprintf(g_out2, fmt, ap);
        va_end(ap);
    }
}

static void json_str(FILE *f, const char *s)  /* a JSON string of s (control characters dropped) */
{
    emit(f, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') emit(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20) emit(f, "%c", *s);
    }
    emit(f, "\"");
}

/* max |x - ref| / max |ref| over n values (bf16 bits, or fp32 when f32); -1: a non-finite difference */
static double cal_max_rel(const void *x, const void *ref, size_t n, int f32)
{
    double dmax = 0.0, rmax = 0.0;
    for (size_t e = 0; e < n; e++) {
        const double xv = f32 ? ((const float *)x)[e] : bf16_to_f(((const uint16_t *)x)[e]);
        const double rv = f32 ? ((const float *)ref)[e] : bf16_to_f(((const uint16_t *)ref)[e]);
        const double d = fabs(xv - rv);
        if (!(d == d) || isinf(d)) return -1.0;
        if (d > dmax) dmax = d;
        if (fabs(rv) > rmax) rmax = fabs(rv);
    }
    return rmax > 0.0 ? dmax / rmax : -1.0;
}

/* The grouped products' operands: gpu_moe8's layer (E 8 groups of 1024 rows,
 * d_model 2048, expert_hidden 2752; --quick: 3 x 40, 64, 48), random bf16 */
struct cal_grp_bufs {
    int E, R, D, F;
    int32_t *offs;
    float *t, *c, *cg[64];
    mt_bf16 *x, *xin, *w[64];
};
static void grp_bufs_make(struct cal_grp_bufs *gb, int quick)
{
    const int E = quick ? 3 : 8, R = quick ? 40 : 1024, D = quick ? 64 : 2048, F = quick ? 48 : 2752;
    const size_t M = (size_t)E * R, nw = (size_t)F * D, wide = D > F ? (size_t)D : (size_t)F;
    gb->E = E, gb->R = R, gb->D = D, gb->F = F;
    int32_t hoffs[65];
    for (int e = 0; e <= E; e++) hoffs[e] = e * R;
    gb->offs = dev_alloc((size_t)(E + 1) * sizeof(int32_t));
    g_ops->copy_from_host(g_ops->be, gb->offs, hoffs, (size_t)(E + 1) * sizeof(int32_t));
    gb->t = dev_rand(M * wide > nw ? M * wide : nw), gb->c = dev_alloc(M * wide * 4);
    gb->x = dev_alloc(M * wide * 2), gb->xin = dev_alloc(M * (size_t)D * 2);
    g_ops->cast_bf16(g_ops->be, gb->x, gb->t, M * wide);
    g_ops->cast_bf16(g_ops->be, gb->xin, gb->t, M * (size_t)D);
    for (int e = 0; e < E; e++) {
        gb->w[e] = dev_alloc(nw * 2), gb->cg[e] = dev_alloc(nw * 4);
        g_ops->cast_bf16(g_ops->be, gb->w[e], gb->t, nw);
    }
}
static void grp_bufs_free(struct cal_grp_bufs *gb)
{
    for (int e = 0; e < gb->E; e++)
        g_ops->buf_free(g_ops->be, &g_ctx, gb->w[e]), g_ops->buf_free(g_ops->be, &g_ctx, gb->cg[e]);
    g_ops->buf_free(g_ops->be, &g_ctx, gb->offs), g_ops->buf_free(g_ops->be, &g_ctx, gb->t);
    g_ops->buf_free(g_ops->be, &g_ctx, gb->c), g_ops->buf_free(g_ops->be, &g_ctx, gb->x);
    g_ops->buf_free(g_ops->be, &g_ctx, gb->xin);
}
/* kind k's products over gb: the device-sized entry, or one gemm_bf16 a group (loop) */
static struct cal_grp_ctx grp_ctx_of(const struct cal_grp_bufs *gb, int k, int loop)
{
    struct cal_grp_ctx g = {(enum cal_grp_kind)k, loop, gb->E, gb->R, gb->D, gb->F, gb->offs, gb->x, {0}, gb->c, {0}};
    for (int e = 0; e < gb->E; e++) g.w[e] = k == CAL_GRP_SUM ? gb->xin : gb->w[e], g.cg[e] = gb->cg[e];
    return g;
}

/* "grouped": each product through the device-sized entries (mma.sync) at both block
 * tile widths (bn 256, the default, and 128) beside one gemm_bf16 a group */
static void calib_grouped(FILE *f, int quick, int warmup, int reps)
{
    struct cal_grp_bufs gb;
    grp_bufs_make(&gb, quick);
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_BF16);
    const double flops = 2.0 * (double)gb.E * gb.R * gb.F * gb.D;
    static const int bns[2] = {256, 128};   /* the grouped kernels' tile columns (MT_CUDA_GG_BN): both */
    for (int k = 0; k < CAL_GRP_KINDS; k++) {
        struct cal_grp_ctx g = grp_ctx_of(&gb, k, 1);
        struct cal_time tl = time_runs(grp_fn, &g, warmup, reps);   /* a gemm_bf16 per group */
        g.loop = 0;
        for (int b = 0; b < 2; b++) {
            if (mt_ops_cuda_set_gg_bn_of(g_ops->be, bns[b]) != MT_OK) {
                fprintf(stderr, "cuda_calib: MT_CUDA_GG_BN could not be set\n");
                exit(1);
            }
            struct cal_time tg = time_runs(grp_fn, &g, warmup, reps);
            check_status("grouped");
            emit(f, "%s\n  {\"kind\": \"%s\", \"kernel\": \"mma\", \"bn\": %d, \"groups\": %d, "
                    "\"rows_per_group\": %d, \"d\": %d, \"f\": %d, \"flops\": %.6g, \"grouped_median_s\": %.6e, "
                    "\"grouped_flop_per_s\": %.6e, \"loop_median_s\": %.6e, \"loop_flop_per_s\": %.6e}",
                 k || b ? "," : "", k_grp_name[k], bns[b], gb.E, gb.R, gb.D, gb.F, flops, tg.median,
                 flops / tg.median, tl.median, flops / tl.median);
        }
    }
    mt_ops_cuda_set_gg_bn_of(g_ops->be, 256);   /* the default again */
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_FP32);
    grp_bufs_free(&gb);
}

/* "grouped_wgmma": each product on wgmma (knob grouped_gemm_kernel=wgmma;
 * gemm_grouped_wg.cu, its tile 128 x 256; rows_dyW's B and sum_dW's A and B
 * MN-major) where it runs, checked against the mma.sync kernels' result first
 * (max |C_wgmma - C_mma| / max |C_mma|: fp32 sums of the same bf16 products in
 * two orders, ~1e-6; a wrong layout is O(1); "ok" below 1e-3) and timed only
 * when ok. Like calib_wgmma, never fatal and run last (new device code: a fault
 * is reported in its row and costs no other row). */
static void calib_grouped_wgmma(FILE *f, int quick, int warmup, int reps)
{
    if (mt_ops_cuda_set_knob_of(g_ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "wgmma") != MT_OK) return;   /* no wgmma */
    struct cal_grp_bufs gb;
    grp_bufs_make(&gb, quick);
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_BF16);
    const double flops = 2.0 * (double)gb.E * gb.R * gb.F * gb.D;
    float *zeros = calloc((size_t)gb.F * gb.D, sizeof(float));
    if (!zeros) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    enum mt_status st = MT_OK;
    for (int k = 0; k < CAL_GRP_KINDS && st == MT_OK; k++) {   /* after an error the context is gone */
        struct cal_grp_ctx g = grp_ctx_of(&gb, k, 0);
        size_t n_out = 0;
        char msg[256] = "";
        mt_ops_cuda_set_knob_of(g_ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "mma");
        float *ref = grp_once(&g, zeros, &n_out);
        mt_ops_cuda_set_knob_of(g_ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "wgmma");
        float *got = grp_once(&g, zeros, &n_out);
        g_ops->sync(g_ops->be);
        st = mt_ops_cuda_status_of(g_ops->be, msg, sizeof msg);
        const double rel = st == MT_OK ? cal_max_rel(got, ref, n_out, 1) : -1.0;
        free(ref), free(got);
        const int ok = st == MT_OK && rel >= 0.0 && rel < 1e-3;
        struct cal_time tw = {0, 0};
        if (ok) {
            tw = time_runs(grp_fn, &g, warmup, reps);
            g_ops->sync(g_ops->be);
            st = mt_ops_cuda_status_of(g_ops->be, msg, sizeof msg);
        }
        if (st != MT_OK) fprintf(stderr, "cuda_calib: CUDA error in the grouped GEMMs on wgmma: %s\n", msg);
        emit(f, "%s\n  {\"kind\": \"%s\", \"kernel\": \"wgmma\", \"bn\": 256, \"groups\": %d, "
                "\"rows_per_group\": %d, \"d\": %d, \"f\": %d, \"flops\": %.6g, \"status\": \"%s\", "
                "\"max_rel_vs_mma\": %.3e, \"ok\": %s, \"grouped_median_s\": %.6e, \"grouped_flop_per_s\": %.6e}",
             k ? "," : "", k_grp_name[k], gb.E, gb.R, gb.D, gb.F, flops, mt_status_str(st), rel,
             ok && st == MT_OK ? "true" : "false", tw.median, ok && st == MT_OK ? flops / tw.median : 0.0);
    }
    free(zeros);
    mt_ops_cuda_set_knob_of(g_ops->be, MT_KNOB_GROUPED_GEMM_KERNEL, "mma");
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_FP32);
    grp_bufs_free(&gb);
}

/* the (rows x cols) bf16 matrix x on the device, transposed (cols x rows) into a new
 * device buffer through the host: an MN-major probe form's operand */
static mt_bf16 *dev_transposed_bf16(const mt_bf16 *x, int rows, int cols)
{
    const size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(n * 2), *t = malloc(n * 2);
    if (!h || !t) { fprintf(stderr, "cuda_calib: out of host memory\n"); exit(1); }
    g_ops->copy_to_host(g_ops->be, h, x, n * 2);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = h[(size_t)i * cols + j];
    mt_bf16 *d = dev_alloc(n * 2);
    g_ops->copy_from_host(g_ops->be, d, t, n * 2);
    free(h), free(t);
    return d;
}

/* The wgmma probe (wgmma_probe.cu, 128 x 128 tiles, 3 stages) in each form: A from
 * shared memory or from registers ("a"), K-major; B MN-major (imm-trans: "b_major"),
 * with A from either; A MN-major ("a_major"), alone and with B (the same values
 * stored transposed) beside gemm_bf16 (cuBLASLt) on the same bf16 operands, checked
 * first against it (max |C_wgmma - C_cublas| / max |C|, both fp32 sums of the
 * same products): a wrong kernel or a CUDA error in it is reported, not timed ("ok"
 * false, no wgmma rate). A wrong MN-major row beside right K-major ones names the
 * imm-trans layout (mt_wgmma_desc_sw128_mn), nothing else. main runs it last, so
 * that it costs no other row. */
static void calib_wgmma(FILE *f, int quick, int warmup, int reps)
{
    const int ws[2][3] = {{quick ? 128 : 4096, quick ? 256 : 4096, quick ? 192 : 4096},
                          {quick ? 128 : 8192, quick ? 128 : 8192, quick ? 64 : 2048}};
    static const int forms[] = {0, MT_WGMMA_PROBE_A_REGS, MT_WGMMA_PROBE_B_MN,
                                MT_WGMMA_PROBE_A_REGS | MT_WGMMA_PROBE_B_MN, MT_WGMMA_PROBE_A_MN,
                                MT_WGMMA_PROBE_A_MN | MT_WGMMA_PROBE_B_MN};
    for (int s = 0; s < 2; s++) {   /* per shape: the cuBLAS reference and its time once, then each probe form */
        const int m = ws[s][0], n = ws[s][1], k = ws[s][2];
        const size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
        const double flops = 2.0 * m * n * (double)k;
        float *t = dev_rand(na > nb ? na : nb), *c = dev_alloc(nc * 4), *cref = dev_alloc(nc * 4);
        mt_bf16 *a16 = dev_alloc(na * 2), *b16 = dev_alloc(nb * 2);
        g_ops->cast_bf16(g_ops->be, a16, t, na);
        g_ops->cast_bf16(g_ops->be, b16, t, nb);
        mt_bf16 *a16t = dev_transposed_bf16(a16, m, k), *b16t = dev_transposed_bf16(b16, n, k);
        mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_BF16);
        struct cal_gemm_ctx g = {CAL_BF16, m, n, k, t, t, a16, b16, cref};
        const struct cal_time tc = time_runs(gemm_fn, &g, warmup, reps);   /* leaves the reference in cref */
        mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_FP32);
        float *h = malloc(nc * 4), *hr = malloc(nc * 4);
        if (h && hr) g_ops->copy_to_host(g_ops->be, hr, cref, nc * 4);
        for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
            const int form = forms[fi], a_mn = !!(form & MT_WGMMA_PROBE_A_MN), b_mn = !!(form & MT_WGMMA_PROBE_B_MN);
            struct cal_wgmma_ctx w = {m, n, k, form, a_mn ? a16t : a16, b_mn ? b16t : b16, c, MT_OK};
            g_ops->fill(g_ops->be, c, NAN, nc);   /* a form that writes nothing cannot pass on the last one's C */
            wgmma_fn(&w);
            g_ops->sync(g_ops->be);
            char msg[256];
            if (w.st == MT_OK && mt_ops_cuda_status_of(g_ops->be, msg, sizeof msg) != MT_OK) {
                fprintf(stderr, "cuda_calib: CUDA error in the wgmma probe: %s\n", msg);
                w.st = MT_ERR_RUNTIME;
            }
            /* -1: not compared (an error, or a non-finite difference); JSON has no inf */
            double rel = -1.0;
            if (h && hr && w.st == MT_OK) {
                g_ops->copy_to_host(g_ops->be, h, c, nc * 4);
                rel = cal_max_rel(h, hr, nc, 1);
            }
            const int w_ok = w.st == MT_OK && rel >= 0.0 && rel <= 1e-4;
            struct cal_time tw = {0, 0};
            if (w_ok) tw = time_runs(wgmma_fn, &w, warmup, reps);
            emit(f, "%s\n  {\"m\": %d, \"n\": %d, \"k\": %d, \"a\": \"%s\", \"a_major\": \"%s\", "
                    "\"b_major\": \"%s\", \"status\": \"%s\", \"ok\": %s, \"max_rel_vs_cublas\": %.3e, "
                    "\"flops\": %.6g, \"wgmma_median_s\": %.6e, \"wgmma_flop_per_s\": %.6e, "
                    "\"cublas_median_s\": %.6e, \"cublas_flop_per_s\": %.6e}",
                 s || fi ? "," : "", m, n, k, form & MT_WGMMA_PROBE_A_REGS ? "registers" : "shared",
                 a_mn ? "mn" : "k", b_mn ? "mn" : "k", mt_status_str(w.st), w_ok ? "true" : "false", rel, flops,
                 tw.median, w_ok ? flops / tw.median : 0.0, tc.median, flops / tc.median);
        }
        free(h), free(hr);
        g_ops->buf_free(g_ops->be, &g_ctx, t), g_ops->buf_free(g_ops->be, &g_ctx, c);
        g_ops->buf_free(g_ops->be, &g_ctx, cref), g_ops->buf_free(g_ops->be, &g_ctx, a16);
        g_ops->buf_free(g_ops->be, &g_ctx, b16), g_ops->buf_free(g_ops->be, &g_ctx, a16t);
        g_ops->buf_free(g_ops->be, &g_ctx, b16t);
    }
}

/* one attention's bf16 results on the host (out, dq, dk as the model takes them: bf16;
 * dv fp32) */
struct cal_attn_host { uint16_t *out, *dq, *dk; float *dv; };

/* the forward and backward of a under attn_kernel `kern`, results to h; MT_OK or why not */
static enum mt_status attn_run_to_host(struct cal_attn_ctx *a, const char *kern, struct cal_attn_host *h,
                                       char *msg, size_t cap)
{
    const size_t n = (size_t)a->b * a->t * a->h * a->hd;
    enum mt_status st = mt_ops_cuda_set_attn_kernel_of(g_ops->be, kern);
    if (st != MT_OK) return st;   /* v4 refused: wgmma does not run here */
    a->fwd = 1, attn_fn(a);
    a->fwd = 0, attn_fn(a);
    g_ops->sync(g_ops->be);
    st = mt_ops_cuda_status_of(g_ops->be, msg, cap);
    if (st != MT_OK) return st;
    g_ops->copy_to_host(g_ops->be, h->out, a->outb, n * 2);
    g_ops->copy_to_host(g_ops->be, h->dq, a->dqb, n * 2);
    g_ops->copy_to_host(g_ops->be, h->dk, a->dkb, n * 2);
    g_ops->copy_to_host(g_ops->be, h->dv, a->dv, n * 4);
    return MT_OK;
}

/* the bf16 attention of shape s on random operands (v3 or v4 as set later, dQ
 * from the dS tiles) and two host copies of its results, for an A/B of two
 * kernels or orders; 0 when a host buffer could not be had */
static int attn_pair_setup(struct cal_attn_ctx *a, const struct cal_attn_shape *s, struct cal_attn_host h[2])
{
    const struct cal_attn_ctx z = {s->b, s->t, s->h, s->hd, 1, 3, NULL, NULL, NULL, NULL, NULL, NULL,
                                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    *a = z;
    const size_t n = (size_t)a->b * a->t * a->h * a->hd;
    a->q = dev_rand(n), a->k = dev_rand(n), a->v = dev_rand(n), a->dout = dev_rand(n);
    a->dq = dev_alloc(n * 4), a->dk = dev_alloc(n * 4), a->dv = dev_alloc(n * 4);
    a->lse = dev_alloc((size_t)a->b * a->h * a->t * 4);
    a->qkvb = (mt_bf16 *)dev_alloc(3 * n * 2), a->outb = (mt_bf16 *)dev_alloc(n * 2);
    a->doutb = (mt_bf16 *)dev_alloc(n * 2), a->dqb = (mt_bf16 *)dev_alloc(n * 2);
    a->dkb = (mt_bf16 *)dev_alloc(n * 2);
    g_ops->cast_bf16(g_ops->be, a->doutb, a->dout, n);
    int have = 1;
    for (int k = 0; k < 2; k++) {
        h[k].out = malloc(n * 2), h[k].dq = malloc(n * 2), h[k].dk = malloc(n * 2), h[k].dv = malloc(n * 4);
        have = have && h[k].out && h[k].dq && h[k].dk && h[k].dv;
    }
    return have;
}

static void attn_pair_free(struct cal_attn_ctx *a, struct cal_attn_host h[2])
{
    for (int k = 0; k < 2; k++) free(h[k].out), free(h[k].dq), free(h[k].dk), free(h[k].dv);
    float *bufs[] = {a->q, a->k, a->v, a->dout, a->dq, a->dk, a->dv, a->lse, (float *)a->qkvb, (float *)a->outb,
                     (float *)a->doutb, (float *)a->dqb, (float *)a->dkb};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++) g_ops->buf_free(g_ops->be, &g_ctx, bufs[b]);
}

/* the block order of the causal attention kernels (src/ops/cuda/attn_sched.cuh):
 * each shape at head dim 64 or 128 under v3, the default order (longest tile
 * first in L2-sized groups of (batch, head) pairs) against groups of one pair
 * (the order before: a pair's tiles, then the next pair's): the results' bits
 * (must be equal: only which block runs a tile changed) and the forward's and
 * backward's times in each. Last and never fatal, like calib_attn_v4. */
static void calib_attn_order(FILE *f, const struct cal_attn_shape *as, int n_as, int warmup, int reps)
{
    int first = 1;
    for (int i = 0; i < n_as; i++) {
        if (as[i].hd != 64 && as[i].hd != 128) continue;
        struct cal_attn_ctx a;
        struct cal_attn_host h[2];   /* the default order, groups of one pair */
        const int have = attn_pair_setup(&a, &as[i], h);
        const size_t n = (size_t)a.b * a.t * a.h * a.hd;
        struct cal_time tf[2] = {{0, 0}, {0, 0}}, tb[2] = {{0, 0}, {0, 0}};
        char msg[256] = "";
        enum mt_status st = have ? MT_OK : MT_ERR_OOM;
        for (int k = 0; k < 2 && st == MT_OK; k++) {
            mt_ops_cuda_set_attn_group_kib_of(g_ops->be, k ? 1 : 0);
            st = attn_run_to_host(&a, "v3", &h[k], msg, sizeof msg);
            if (st != MT_OK) break;
            a.fwd = 1, tf[k] = time_runs(attn_fn, &a, warmup, reps);
            a.fwd = 0, tb[k] = time_runs(attn_fn, &a, warmup, reps);
        }
        mt_ops_cuda_set_attn_group_kib_of(g_ops->be, 0);
        if (st != MT_OK && msg[0]) fprintf(stderr, "cuda_calib: CUDA error in the attention order A/B: %s\n", msg);
        const int same = st == MT_OK && !memcmp(h[0].out, h[1].out, n * 2) && !memcmp(h[0].dq, h[1].dq, n * 2) &&
                         !memcmp(h[0].dk, h[1].dk, n * 2) && !memcmp(h[0].dv, h[1].dv, n * 4);
        emit(f, "%s\n  {\"b\": %d, \"t\": %d, \"h\": %d, \"hd\": %d, \"kernel\": \"v3\", \"status\": \"%s\", "
                "\"same_bits\": %s, \"fwd_median_s\": %.6e, \"fwd_median_s_one_pair_groups\": %.6e, "
                "\"bwd_median_s\": %.6e, \"bwd_median_s_one_pair_groups\": %.6e}",
             first ? "" : ",", a.b, a.t, a.h, a.hd, mt_status_str(st), same ? "true" : "false", tf[0].median,
             tf[1].median, tb[0].median, tb[1].median);
        first = 0;
        attn_pair_free(&a, h);
    }
}

/* attn_kernel=v4 (attention_wg.cu: the forward, dK/dV and dQ on wgmma, dQ from
 * the dK/dV kernel's dS tiles), or v5 (the same reading V, Q, dO, K MN-major: no
 * transposes), `kern`: each attention shape at head dim 64 or 128 under v3 and kern
 * (its fields named by it: "v4_fwd_median_s", "v5_..."),
 * kern's bf16 out, dq, dk and fp32 dv compared with v3's (max |diff| / max |x| per
 * output: the two sum in other orders, so a bf16 ulp or so apart; <= 1e-2 else that
 * direction's "ok" is false and it gets no rates). The forward ("ok") and the
 * backward ("bwd_ok") separately, so a wrong dK/dV cannot hide a right forward.
 * Like calib_wgmma, last and never fatal: a CUDA error is reported in the row. */
static void calib_attn_v4(FILE *f, const struct cal_attn_shape *as, int n_as, int warmup, int reps, const char *kern)
{
    int first = 1;
    for (int i = 0; i < n_as; i++) {
        if (as[i].hd != 64 && as[i].hd != 128) continue;
        struct cal_attn_ctx a;
        struct cal_attn_host h[2];   /* v3, v4 */
        const int have = attn_pair_setup(&a, &as[i], h);
        const size_t n = (size_t)a.b * a.t * a.h * a.hd;
        struct cal_time t3 = {0, 0}, t4 = {0, 0}, b3 = {0, 0}, b4 = {0, 0};
        char msg[256] = "";
        enum mt_status st = have ? attn_run_to_host(&a, "v3", &h[0], msg, sizeof msg) : MT_ERR_OOM;
        if (st == MT_OK) st = attn_run_to_host(&a, kern, &h[1], msg, sizeof msg);
        double rel = -1.0, rel_b = -1.0;
        if (st == MT_OK) {
            rel = cal_max_rel(h[1].out, h[0].out, n, 0);
            const double r[3] = {cal_max_rel(h[1].dq, h[0].dq, n, 0), cal_max_rel(h[1].dk, h[0].dk, n, 0),
                                 cal_max_rel(h[1].dv, h[0].dv, n, 1)};
            rel_b = r[0] < 0 || r[1] < 0 || r[2] < 0 ? -1.0 : fmax(r[0], fmax(r[1], r[2]));
        } else if (msg[0]) {
            fprintf(stderr, "cuda_calib: CUDA error in attn_kernel=v3/%s: %s\n", kern, msg);
        }
        const int ok = st == MT_OK && rel >= 0.0 && rel <= 1e-2, ok_b = st == MT_OK && rel_b >= 0.0 && rel_b <= 1e-2;
        for (int k = 1; k >= 0 && (ok || ok_b); k--) {   /* kern then v3: each direction that is right */
            mt_ops_cuda_set_attn_kernel_of(g_ops->be, k ? kern : "v3");
            a.fwd = 1;
            if (ok) *(k ? &t4 : &t3) = time_runs(attn_fn, &a, warmup, reps);
            a.fwd = 0;   /* the backward from the forward's lse just left */
            if (ok_b) *(k ? &b4 : &b3) = time_runs(attn_fn, &a, warmup, reps);
        }
        mt_ops_cuda_set_attn_kernel_of(g_ops->be, "v3");
        const double ff = 2.0 * a.b * a.h * (double)a.t * a.t * a.hd, fb = 2.5 * ff;
        emit(f, "%s\n  {\"b\": %d, \"t\": %d, \"h\": %d, \"hd\": %d, \"kernel\": \"%s\", \"status\": \"%s\", "
                "\"ok\": %s, \"max_rel_vs_v3\": %.3e, \"fwd_flops\": %.6g, \"%s_fwd_median_s\": %.6e, "
                "\"%s_fwd_flop_per_s\": %.6e, \"v3_fwd_median_s\": %.6e, \"v3_fwd_flop_per_s\": %.6e, \"bwd_ok\": %s, "
                "\"bwd_max_rel_vs_v3\": %.3e, \"bwd_flops\": %.6g, \"%s_bwd_median_s\": %.6e, "
                "\"%s_bwd_flop_per_s\": %.6e, "
                "\"v3_bwd_median_s\": %.6e, \"v3_bwd_flop_per_s\": %.6e}",
             first ? "" : ",", a.b, a.t, a.h, a.hd, kern, mt_status_str(st), ok ? "true" : "false", rel, ff, kern,
             t4.median, kern, ok ? ff / t4.median : 0.0, t3.median, ok ? ff / t3.median : 0.0,
             ok_b ? "true" : "false", rel_b, fb, kern, b4.median, kern, ok_b ? fb / b4.median : 0.0, b3.median,
             ok_b ? fb / b3.median : 0.0);
        first = 0;
        attn_pair_free(&a, h);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, reps = 20, warmup = 3;
    const char *gemm_arg = NULL, *attn_arg = NULL, *scan_arg = NULL, *ar_arg = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--gemm") && v) gemm_arg = argv[++i];
        else if (!strcmp(a, "--attn") && v) attn_arg = argv[++i];
        else if (!strcmp(a, "--scan") && v) scan_arg = argv[++i];
        else if (!strcmp(a, "--allreduce-mib") && v) ar_arg = argv[++i];
        else if (!strcmp(a, "--out") && v) out_path = argv[++i];
        else { usage(); return 2; }
    }
    if (reps < 1 || reps > 256 || warmup < 0) {
        fprintf(stderr, "cuda_calib: --reps in [1,256], --warmup >= 0\n");
        return 2;
    }
    if (quick && reps == 20) reps = 3, warmup = warmup == 3 ? 1 : warmup;

    /* default sizes: square 4096^3, a wide 8192x8192x2048, and the GEMMs of
     * one d_model 2048 layer (bench/configs/gpu_d2048_dense.json: 8192
     * tokens, 16 heads of 64, mlp_hidden 5504) in the y = x W^T form */
    struct cal_gemm_shape gs[CAL_MAX_SHAPES];
    int n_gs;
    if (gemm_arg) n_gs = parse_list3(gemm_arg, gs, CAL_MAX_SHAPES, "given");
    else if (quick) n_gs = parse_list3("64x64x64,96x32x48", gs, CAL_MAX_SHAPES, "square");
    else {
        n_gs = parse_list3("4096x4096x4096,8192x8192x2048", gs, CAL_MAX_SHAPES, "square");
        n_gs += parse_list3("8192x6144x2048,8192x2048x2048,8192x5504x2048,8192x2048x5504", gs + n_gs,
                            CAL_MAX_SHAPES - n_gs, "layer_d2048");
    }
    struct cal_attn_shape as[CAL_MAX_SHAPES];
    int n_as = parse_list4(attn_arg ? attn_arg : quick ? "1x32x2x16,1x32x1x32,1x70x1x64"
                                                       : "8x1024x32x64,8x1024x16x128,4x2048x32x64,4x2048x16x128",
                           as, CAL_MAX_SHAPES);
    /* the d2048 hybrid's M layer (d_inner 4096 = 64 heads of 64, state 64, chunk
     * 64); --quick: tiny (T 32, chunk 12: T not a multiple of it), the B, T of the quick attention rows */
    struct cal_scan_shape ss[CAL_MAX_SHAPES];
    int n_ss = parse_list6(scan_arg ? scan_arg : quick ? "1x32x2x8x8x12" : "4x2048x64x64x64x64", ss, CAL_MAX_SHAPES);
    double ar_mib[CAL_MAX_SHAPES];
    int n_ar = parse_sizes(ar_arg ? ar_arg : quick ? "0.015625,0.0625" : "1,4,16,64,256", ar_mib, CAL_MAX_SHAPES);
    if (n_gs < 0 || n_as < 0 || n_ss < 0 || n_ar < 0) {
        fprintf(stderr, "cuda_calib: bad size list\n");
        usage();
        return 2;
    }

    char why[256] = "";
    g_ops = mt_ops_cuda(why, sizeof why);
    if (!g_ops) {
        if (!strncmp(why, "MT_CUDA_", 8)) { fprintf(stderr, "cuda_calib: %s\n", why); return 1; }
        printf("SKIPPED (no GPU: %s)\n", why[0] ? why : "mt_ops_cuda returned NULL");
        return 77;
    }
    if (!g_ops->gemm_bf16 || !g_ops->cast_bf16 || !g_ops->attention_forward || !g_ops->attention_backward ||
        !g_ops->attention_forward_bf16 || !g_ops->attention_backward_bf16 || !g_ops->ssm_scan_forward ||
        !g_ops->ssm_scan_backward) {
        fprintf(stderr, "cuda_calib: the cuda table lacks gemm_bf16, cast_bf16, attention (fp32 or bf16) or the scan\n");
        return 1;
    }
    mt_ctx_init(&g_ctx);
    struct mt_ops_cuda_info info;
    memset(&info, 0, sizeof info);
    mt_ops_cuda_get_info_of(g_ops->be, &info);

    FILE *f = stdout;
    if (out_path && !(g_out2 = fopen(out_path, "w"))) {
        fprintf(stderr, "cuda_calib: cannot write %s\n", out_path);
        return 1;
    }

    /* ---- checks before any timing ---- */
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_FP32);
    double e32 = check_gemm(CAL_FP32, 37, 29, 70);
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_BF16);
    double e16m = check_gemm(CAL_BF16_F32IN, 37, 29, 70);
    double e16 = check_gemm(CAL_BF16, 37, 29, 70);
    check_status("the checks");
    /* fp32: sgemm vs double on K=70, |x| < 1: well inside 1e-5 of max|C|;
     * bf16: the operands are rounded the same way on both sides, products
     * exact in fp32, fp32 accumulation: 1e-4 leaves room for its order */
    int ok = e32 <= 1e-5 && e16m <= 1e-4 && e16 <= 1e-4;

    emit(f, "{\n \"tool\": \"cuda_calib\", \"version\": 1, \"quick\": %s, \"reps\": %d, \"warmup\": %d,\n",
         quick ? "true" : "false", reps, warmup);
    emit(f, " \"device\": {\"name\": ");
    json_str(f, info.device);
    emit(f, ", \"emulated\": %s, \"cc\": \"%d.%d\", \"sm_count\": %d, \"mem_total_bytes\": %zu, "
            "\"runtime_version\": %d, \"driver_version\": %d, \"cublas_version\": %d},\n",
         info.emulated ? "true" : "false", info.cc_major, info.cc_minor, info.sm_count, info.mem_total,
         info.runtime_version, info.driver_version, info.cublas_version);
#ifdef MT_WITH_NCCL
    emit(f, " \"build\": {\"nccl\": true},\n");
#else
    emit(f, " \"build\": {\"nccl\": false},\n");
#endif
    emit(f, " \"check\": {\"ok\": %s, \"shape\": \"37x29x70\", \"fp32_max_rel\": %.3e, "
            "\"bf16_fp32_operands_max_rel\": %.3e, "
            "\"bf16_max_rel\": %.3e, \"tol_fp32\": 1e-5, \"tol_bf16\": 1e-4}",
         ok ? "true" : "false", e32, e16m, e16);
    if (!ok) {
        emit(f, "\n}\n");
        fprintf(stderr, "cuda_calib: gemm check FAILED (fp32 %.3e, bf16 fp32-operands %.3e, bf16 %.3e): "
                        "nothing timed\n",
                e32, e16m, e16);
        if (g_out2) fclose(g_out2);
        return 1;
    }

    /* ---- gemm ---- */
    emit(f, ",\n \"gemm\": [");
    double best[3] = {0, 0, 0};
    for (int s = 0; s < n_gs; s++) {
        size_t na = (size_t)gs[s].m * gs[s].k, nb = (size_t)gs[s].n * gs[s].k, nc = (size_t)gs[s].m * gs[s].n;
        float *a = dev_rand(na), *b = dev_rand(nb), *c = dev_alloc(nc * 4);
        mt_bf16 *a16 = dev_alloc(na * 2), *b16 = dev_alloc(nb * 2);
        g_ops->cast_bf16(g_ops->be, a16, a, na);
        g_ops->cast_bf16(g_ops->be, b16, b, nb);
        double flops = 2.0 * gs[s].m * gs[s].n * (double)gs[s].k;
        for (int kd = 0; kd < 3; kd++) {
            mt_ops_cuda_set_precision_of(g_ops->be, kd == CAL_FP32 ? MT_CUDA_PRECISION_FP32 : MT_CUDA_PRECISION_BF16);
            struct cal_gemm_ctx g = {(enum cal_gemm_kind)kd, gs[s].m, gs[s].n, gs[s].k, a, b, a16, b16, c};
            struct cal_time t = time_runs(gemm_fn, &g, warmup, reps);
            check_status("gemm");
            double r = flops / t.median;
            if (r > best[kd]) best[kd] = r;
            emit(f, "%s\n  {\"m\": %d, \"n\": %d, \"k\": %d, \"set\": \"%s\", \"precision\": \"%s\", \"flops\": %.6g, "
                    "\"median_s\": %.6e, \"min_s\": %.6e, \"flop_per_s\": %.6e}",
                 s || kd ? "," : "", gs[s].m, gs[s].n, gs[s].k, gs[s].set, k_kind_name[kd], flops, t.median, t.min, r);
        }
        g_ops->buf_free(g_ops->be, &g_ctx, a), g_ops->buf_free(g_ops->be, &g_ctx, b);
        g_ops->buf_free(g_ops->be, &g_ctx, c), g_ops->buf_free(g_ops->be, &g_ctx, a16);
        g_ops->buf_free(g_ops->be, &g_ctx, b16);
    }
    mt_ops_cuda_set_precision_of(g_ops->be, MT_CUDA_PRECISION_FP32);
    emit(f, "\n ],\n \"gemm_best_flop_per_s\": {\"fp32\": %.6e, \"bf16_fp32_operands\": %.6e, \"bf16\": %.6e},\n",
         best[0], best[1], best[2]);

    /* ---- the MoE experts' grouped products (calib_grouped; their wgmma rows go last) ---- */
    emit(f, " \"grouped\": [");
    if (g_ops->gemm_grouped_rows && g_ops->gemm_grouped_sum) calib_grouped(f, quick, warmup, reps);
    emit(f, "\n ],\n");

    /* ---- Muon's batched bf16 Newton–Schulz (muon.c): one iteration at d2048's
     * batches (2048 x 2048, 4 a batch; 2048 x 5504 alone) and GPT-2 124M's (its
     * 48 of 768 x 768 as 2 batches of 24; its 24 of 2048 x 768 as 3 of 8, the
     * s x l iterate 768 x 2048 either way); --quick: two tiny ones. The
     * optimizer's rate in the planner where that iteration runs (sum FLOPs /
     * sum time) ---- */
    emit(f, " \"muon_ns\": [");
    double ns_flops = 0, ns_s = 0;
    if (g_ops->gemm_bf16_batched) {
        static const int full[4][3] = {{2048, 2048, 4}, {2048, 5504, 1}, {768, 768, 24}, {768, 2048, 8}};
        static const int tiny[2][3] = {{24, 40, 3}, {16, 48, 1}};
        const int n_ns = quick ? 2 : 4;
        for (int r = 0; r < n_ns; r++) {
            const int *sh = quick ? tiny[r] : full[r];
            struct cal_ns_ctx c = {sh[0], sh[1], sh[2], 0, 0, NULL, NULL, NULL, NULL};
            c.np = ((size_t)c.s * c.l + 127) & ~(size_t)127, c.sp = ((size_t)c.s * c.s + 127) & ~(size_t)127;
            const size_t nx = c.np * c.nb, ns = c.sp * c.nb;
            const float amp = (float)(1.0 / sqrt((double)c.s * c.l));   /* X normalised, as Muon's X0 */
            float *t = dev_uniform(nx, -amp, amp);
            c.x = dev_alloc(nx * 2), c.y = dev_alloc(nx * 2), c.a = dev_alloc(ns * 2), c.b = dev_alloc(ns * 2);
            g_ops->cast_bf16(g_ops->be, c.x, t, nx);
            const double flops = c.nb * (4.0 * c.s * c.s * (double)c.l + 2.0 * c.s * (double)c.s * c.s);
            struct cal_time tm = time_runs(ns_fn, &c, warmup, reps);
            check_status("muon_ns");
            ns_flops += flops, ns_s += tm.median;
            emit(f, "%s\n  {\"s\": %d, \"l\": %d, \"batch\": %d, \"flops\": %.6g, \"median_s\": %.6e, "
                    "\"flop_per_s\": %.6e}",
                 r ? "," : "", c.s, c.l, c.nb, flops, tm.median, flops / tm.median);
            g_ops->buf_free(g_ops->be, &g_ctx, t), g_ops->buf_free(g_ops->be, &g_ctx, c.x);
            g_ops->buf_free(g_ops->be, &g_ctx, c.y), g_ops->buf_free(g_ops->be, &g_ctx, c.a);
            g_ops->buf_free(g_ops->be, &g_ctx, c.b);
        }
    }
    emit(f, "\n ],\n \"muon_ns_bf16_flop_per_s\": %.6e,\n", ns_s > 0 ? ns_flops / ns_s : 0.0);

    /* ---- attention (causal, H = K: no GQA sharing): the fp32 kernels, then
     * the precision=bf16 ones (tensor cores) with attn_kernel=v1, v2, then v3
     * (the default), each shape ---- */
    emit(f, " \"attention\": [");
    static const char *const kern_name[CAL_ATTN_ROWS] = {"fp32", "v1", "v2", "v3"};
    double best_fb = 0, best_fb16 = 0, best_fb16_v1 = 0, best_fb16_v2 = 0;
    double as_s[CAL_ATTN_ROWS * CAL_MAX_SHAPES] = {0}, ss_s[2 * CAL_MAX_SHAPES] = {0};
    for (int s = 0; s < CAL_ATTN_ROWS * n_as; s++) {
        struct cal_attn_ctx a = {as[s / CAL_ATTN_ROWS].b, as[s / CAL_ATTN_ROWS].t, as[s / CAL_ATTN_ROWS].h,
                                 as[s / CAL_ATTN_ROWS].hd, 1, s % CAL_ATTN_ROWS, NULL, NULL, NULL, NULL, NULL, NULL,
                                 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        struct mt_ops_cuda_info i0, i1;
        if (a.bf16 && mt_ops_cuda_set_attn_kernel_of(g_ops->be, kern_name[a.bf16]) != MT_OK) {
            fprintf(stderr, "cuda_calib: attn_kernel could not be set\n");
            return 1;
        }
        mt_ops_cuda_get_info_of(g_ops->be, &i0);
        size_t n = (size_t)a.b * a.t * a.h * a.hd;
        a.q = dev_rand(n), a.k = dev_rand(n), a.v = dev_rand(n), a.dout = dev_rand(n);
        a.out = dev_alloc(n * 4), a.dq = dev_alloc(n * 4), a.dk = dev_alloc(n * 4), a.dv = dev_alloc(n * 4);
        a.lse = dev_alloc((size_t)a.b * a.h * a.t * 4);
        if (a.bf16) {
            a.qkvb = (mt_bf16 *)dev_alloc(3 * n * 2);   /* bf16 q, k, v (H = K here) */
            a.outb = (mt_bf16 *)dev_alloc(n * 2), a.doutb = (mt_bf16 *)dev_alloc(n * 2);
            a.dqb = (mt_bf16 *)dev_alloc(n * 2), a.dkb = (mt_bf16 *)dev_alloc(n * 2);
            g_ops->cast_bf16(g_ops->be, a.doutb, a.dout, n);
        }
        /* 4*B*H*T^2*hd for the two products, halved by the causal mask */
        double ff = 2.0 * a.b * a.h * (double)a.t * a.t * a.hd, fb = 2.5 * ff;
        struct cal_time tf = time_runs(attn_fn, &a, warmup, reps);
        a.fwd = 0;
        struct cal_time tb = time_runs(attn_fn, &a, warmup, reps);
        check_status("attention");
        mt_ops_cuda_get_info_of(g_ops->be, &i1);
        const int v2_ran = i1.attention_v2_calls > i0.attention_v2_calls;
        double rfb = (ff + fb) / (tf.median + tb.median);
        as_s[s] = tf.median + tb.median;   /* [4 a + i]: kern_name[i] */
        double *best_at = a.bf16 == 3 ? &best_fb16 : a.bf16 == 2 ? &best_fb16_v2 : a.bf16 ? &best_fb16_v1 : &best_fb;
        if (rfb > *best_at) *best_at = rfb;
        emit(f, "%s\n  {\"precision\": \"%s\", \"kernel\": \"%s\", \"v2_ran\": %s, \"b\": %d, \"t\": %d, \"h\": %d, "
                "\"hd\": %d, \"causal\": true, \"fwd_flops\": %.6g, "
                "\"bwd_flops\": %.6g, \"fwd_median_s\": %.6e, \"bwd_median_s\": %.6e, \"fwd_flop_per_s\": %.6e, "
                "\"bwd_flop_per_s\": %.6e, \"fwd_bwd_flop_per_s\": %.6e}",
             s ? "," : "", a.bf16 ? "bf16" : "fp32", !a.bf16 || v2_ran ? kern_name[a.bf16] : "v1",
             v2_ran ? "true" : "false",
             a.b, a.t, a.h, a.hd, ff, fb, tf.median, tb.median, ff / tf.median, fb / tb.median, rfb);
        float *bufs[] = {a.q, a.k, a.v, a.dout, a.out, a.dq, a.dk, a.dv, a.lse, (float *)a.qkvb, (float *)a.outb,
                         (float *)a.doutb, (float *)a.dqb, (float *)a.dkb};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g_ops->buf_free(g_ops->be, &g_ctx, bufs[i]);
    }
    emit(f, "\n ],\n \"attention_best_fwd_bwd_flop_per_s\": %.6e, \"attention_precision\": \"fp32\",\n", best_fb);
    mt_ops_cuda_set_attn_kernel_of(g_ops->be, "v3");  /* the default again */
    /* bf16 best: the default kernels (attn_kernel=v3; v1 where v2/v3 lack the
     * head dim), and v1's and v2's beside it (the A/Bs) */
    emit(f, " \"attention_bf16_best_fwd_bwd_flop_per_s\": %.6e, \"attention_bf16_v1_best_fwd_bwd_flop_per_s\": %.6e, "
            "\"attention_bf16_v2_best_fwd_bwd_flop_per_s\": %.6e,\n",
         best_fb16, best_fb16_v1, best_fb16_v2);

    /* ---- Mamba-3 scan, chunked: fp32, then precision=bf16's entries (the
     * intra-chunk products on tensor cores) where the table has them ---- */
    emit(f, " \"scan\": [");
    double best_scan = 0, best_scan16 = 0;   /* fp32 rows, bf16 rows */
    const int n_prec = g_ops->ssm_scan_forward_bf16 && g_ops->ssm_scan_backward_bf16 ? 2 : 1;
    for (int s = 0; s < n_ss; s++)
    for (int bf = 0; bf < n_prec; bf++) {
        struct cal_scan_ctx c;
        memset(&c, 0, sizeof c);
        c.s = ss[s], c.fwd = 1, c.bf16 = bf;
        const size_t bt = (size_t)c.s.b * c.s.t, nx = bt * c.s.h * c.s.p, nb = bt * c.s.h * c.s.n,
                     nh = bt * c.s.h;
        /* inputs in the mixer's ranges: dt = softplus(.) > 0, lam = sigmoid(.), A < 0 */
        c.x = dev_rand(nx), c.Bm = dev_rand(nb), c.Cm = dev_rand(nb), c.dy = dev_rand(nx);
        c.dt = dev_uniform(nh, 0.001f, 0.1f), c.lam = dev_uniform(nh, 0.0f, 1.0f);
        c.A = dev_uniform((size_t)c.s.h, -8.0f, -1.0f), c.Dsk = dev_rand((size_t)c.s.h);
        c.y = dev_alloc(nx * 4), c.dx = dev_alloc(nx * 4), c.dBm = dev_alloc(nb * 4), c.dCm = dev_alloc(nb * 4);
        c.ddt = dev_alloc(nh * 4), c.dlam = dev_alloc(nh * 4);
        c.dA = dev_uniform((size_t)c.s.h, 0.0f, 0.0f), c.dDsk = dev_uniform((size_t)c.s.h, 0.0f, 0.0f);
        const size_t nst = bf ? mt_ssm_states_floats(c.s.b, c.s.t, c.s.h, c.s.p, c.s.n, c.s.q) : 0;
        c.states = nst ? dev_alloc(nst * 4) : NULL;   /* the forward (timed first) fills them */
        c.Bb = nst ? dev_alloc(nb * 2) : NULL, c.Cb = nst ? dev_alloc(nb * 2) : NULL;
        c.Yb = nst ? dev_alloc(nx * 2) : NULL;
        if (nst) g_ops->cast_bf16(g_ops->be, c.Bb, c.Bm, nb), g_ops->cast_bf16(g_ops->be, c.Cb, c.Cm, nb);
        if (nst) g_ops->cast_bf16(g_ops->be, c.Yb, c.dy, nx);
        const double ff = 8.0 * (double)bt * c.s.h * c.s.p * c.s.n, fb = 2.0 * ff;
        struct cal_time tf = time_runs(scan_fn, &c, warmup, reps);
        c.fwd = 0;
        struct cal_time tb = time_runs(scan_fn, &c, warmup, reps);
        check_status("scan");
        const double sfb = tf.median + tb.median, r = (ff + fb) / sfb;
        double *best_of = bf ? &best_scan16 : &best_scan;
        if (r > *best_of) *best_of = r;
        emit(f, "%s\n  {\"b\": %d, \"t\": %d, \"h\": %d, \"p\": %d, \"n\": %d, \"chunk\": %d, \"precision\": \"%s\", "
                "\"fwd_flops\": %.6g, \"bwd_flops\": %.6g, \"fwd_median_s\": %.6e, \"bwd_median_s\": %.6e, "
                "\"fwd_bwd_s\": %.6e, \"fwd_flop_per_s\": %.6e, \"bwd_flop_per_s\": %.6e, \"fwd_bwd_flop_per_s\": %.6e}",
             s || bf ? "," : "", c.s.b, c.s.t, c.s.h, c.s.p, c.s.n, c.s.q, bf ? "bf16" : "fp32", ff, fb, tf.median, tb.median, sfb, ff / tf.median,
             fb / tb.median, r);
        float *bufs[] = {c.x, c.Bm, c.Cm, c.dt, c.lam, c.A, c.Dsk, c.y, c.dy, c.dx, c.dBm, c.dCm, c.ddt, c.dlam, c.dA, c.dDsk};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g_ops->buf_free(g_ops->be, &g_ctx, bufs[i]);
        if (c.states) g_ops->buf_free(g_ops->be, &g_ctx, c.states);
        if (c.Bb) g_ops->buf_free(g_ops->be, &g_ctx, c.Bb), g_ops->buf_free(g_ops->be, &g_ctx, c.Cb);
        if (c.Yb) g_ops->buf_free(g_ops->be, &g_ctx, c.Yb);
        ss_s[2 * s + bf] = sfb;
        if (n_prec == 1) ss_s[2 * s + 1] = sfb;   /* no bf16 entries: precision=bf16 runs the fp32 scan */
    }
    emit(f, "\n ],\n \"scan_best_fwd_bwd_flop_per_s\": %.6e, \"scan_bf16_best_fwd_bwd_flop_per_s\": %.6e, "
            "\"scan_flop_convention\": \"recurrence: fwd 8 BTHPN, bwd 16 BTHPN (the planner's)\",\n", best_scan, best_scan16);
    /* the core of an M layer (scan) beside that of an A layer (attention) at
     * the same B, T: seconds per fwd+bwd, each attention shape of that B, T;
     * scan_over_attention_bf16 compares what precision=bf16 runs (the bf16
     * scan entries where there are any) */
    emit(f, " \"layer_core\": [");
    int nlc = 0;
    for (int s = 0; s < n_ss; s++)
        for (int a = 0; a < n_as; a++) {
            if (as[a].b != ss[s].b || as[a].t != ss[s].t) continue;
            emit(f, "%s\n  {\"b\": %d, \"t\": %d, \"scan\": \"%dx%dx%dx%dx%dx%d\", \"attention\": \"%dx%dx%dx%d\", "
                    "\"scan_fwd_bwd_s\": %.6e, \"scan_bf16_fwd_bwd_s\": %.6e, \"attention_fp32_fwd_bwd_s\": %.6e, "
                    "\"attention_bf16_fwd_bwd_s\": %.6e, \"attention_bf16_v1_fwd_bwd_s\": %.6e, "
                    "\"attention_bf16_v2_fwd_bwd_s\": %.6e, \"scan_over_attention_bf16\": %.6g}",
                 nlc++ ? "," : "", ss[s].b, ss[s].t, ss[s].b, ss[s].t, ss[s].h, ss[s].p, ss[s].n, ss[s].q, as[a].b,
                 as[a].t, as[a].h, as[a].hd, ss_s[2 * s], ss_s[2 * s + 1], as_s[4 * a], as_s[4 * a + 3],
                 as_s[4 * a + 1], as_s[4 * a + 2], as_s[4 * a + 3] > 0 ? ss_s[2 * s + 1] / as_s[4 * a + 3] : 0.0);
        }
    emit(f, "\n ],\n");

    /* ---- one-rank all-reduce (NCCL) or device copy ---- */
    int ar_ok = 1;
#ifdef MT_WITH_NCCL
    double best_bw = 0;
    struct mt_comm *nc = NULL;
    if (mt_comm_nccl_create_world(&g_ctx, NULL, info.ordinal, &nc) != MT_OK ||
        mt_comm_nccl_set_input_stream(&g_ctx, nc, mt_ops_cuda_stream_of(g_ops->be)) != MT_OK) {
        emit(f, " \"allreduce\": {\"available\": false, \"comm\": \"nccl\", \"why\": ");
        json_str(f, mt_ctx_last_error(&g_ctx));
        emit(f, "},\n");  /* not a failure of the run: the profile keeps its datasheet links */
        mt_ctx_clear_error(&g_ctx);
        mt_comm_destroy(nc);  /* NULL: nothing */
    } else {
        emit(f, " \"allreduce\": {\"available\": true, \"comm\": \"nccl\", \"ranks\": 1, \"dtype\": \"f32\", "
                "\"note\": \"one rank: bytes/time of an in-place ncclAllReduce on one GPU; no link is crossed\", "
                "\"sizes\": [");
        for (int s = 0; s < n_ar; s++) {
            size_t bytes = ((size_t)(ar_mib[s] * 1048576.0) + 3) & ~(size_t)3;
            struct cal_ar_ctx a = {nc, dev_rand(bytes / 4), bytes / 4, 0};
            struct cal_time t = time_runs(allreduce_fn, &a, warmup, reps);
            if (a.failed) ar_ok = 0;
            double bw = (double)bytes / t.median;
            if (bw > best_bw) best_bw = bw;
            emit(f, "%s{\"bytes\": %zu, \"median_s\": %.6e, \"algbw_bytes_per_s\": %.6e}", s ? ", " : "", bytes,
                 t.median, bw);
            g_ops->buf_free(g_ops->be, &g_ctx, a.buf);
        }
        emit(f, "], \"ok\": %s, \"best_algbw_bytes_per_s\": %.6e},\n", ar_ok ? "true" : "false", best_bw);
        mt_comm_destroy(nc);
    }
#else
    emit(f, " \"allreduce\": {\"available\": false, \"comm\": \"self_dev\", \"why\": \"this build has no NCCL "
            "(MT_WITH_NCCL off): the one-rank device comm is self_dev, whose all-reduce is the identity (no data "
            "moves), so there is nothing to time\"},\n");
#endif
    emit(f, " \"device_copy\": {\"note\": \"ops->copy device to device; bytes/time (each byte read once and written "
            "once)\", \"sizes\": [");
    double best_copy = 0;
    for (int s = 0; s < n_ar; s++) {
        size_t bytes = ((size_t)(ar_mib[s] * 1048576.0) + 3) & ~(size_t)3;
        struct cal_copy_ctx c = {dev_alloc(bytes), dev_rand(bytes / 4), bytes};
        struct cal_time t = time_runs(copy_fn, &c, warmup, reps);
        double bw = (double)bytes / t.median;
        if (bw > best_copy) best_copy = bw;
        emit(f, "%s{\"bytes\": %zu, \"median_s\": %.6e, \"bytes_per_s\": %.6e}", s ? ", " : "", bytes, t.median, bw);
        g_ops->buf_free(g_ops->be, &g_ctx, c.dst), g_ops->buf_free(g_ops->be, &g_ctx, c.src);
    }
    check_status("copies");
    emit(f, "], \"best_bytes_per_s\": %.6e}", best_copy);

    /* ---- wgmma, last (calib_wgmma) ---- */
    emit(f, ",\n \"wgmma\": [");
    calib_wgmma(f, quick, warmup, reps);
    emit(f, "\n ],\n \"attention_v4\": [");
    calib_attn_v4(f, as, n_as, warmup, reps, "v4");
    emit(f, "\n ],\n \"attention_v5\": [");
    calib_attn_v4(f, as, n_as, warmup, reps, "v5");
    emit(f, "\n ],\n \"attention_order\": [");
    calib_attn_order(f, as, n_as, warmup, reps);
    emit(f, "\n ],\n \"grouped_wgmma\": [");
    if (g_ops->gemm_grouped_rows && g_ops->gemm_grouped_sum) calib_grouped_wgmma(f, quick, warmup, reps);
    emit(f, "\n ]\n}\n");
    if (g_out2) fclose(g_out2);
    size_t live = g_ctx.bytes_live_total;
    mt_ctx_free(&g_ctx);
    if (live) fprintf(stderr, "cuda_calib: %zu device bytes still accounted live at exit\n", live);
    return ar_ok && !live ? 0 : 1;
}
