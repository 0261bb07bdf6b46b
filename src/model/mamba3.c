/*
 * mamba3.c — the Mamba-3 SISO mixer (SPEC §1c), forward and backward side by
 * side, every step through the ops table (docs/mamba3.md has the derivation).
 *
 * Math, n = B*T rows of h (n, D):
 *   proj = h Win^T                                  (n, W), split z|xs|B|C|dt|theta|lam
 *   x, Bh, Ch, dt, lam, A = prep(proj)              softplus, sigmoid, B/C rmsnorm + bias +
 *                                                   data-dependent rotary (ssm_prep_forward)
 *   ys = scan(x, Bh, Ch, dt, lam, A) + Dsk x        trapezoidal SSM (ssm_scan_forward)
 *   yn = rmsnorm_group(ys silu(z)) g_out            (ssm_gate_norm_forward)
 *   out = yn Wout^T                                 (n, D)
 * Backward, in reverse:
 *   term 1: dWout += dout^T yn;  dyn = dout Wout
 *   term 2: dys, dz (into dproj's z columns), dg_out += (ssm_gate_norm_backward)
 *   term 3: dx, dBh, dCh, ddt, dlam, dA, dDsk += (ssm_scan_backward)
 *   term 4: dproj's other columns, ddt_bias, dA_log, dgB, dgC, dB_bias, dC_bias += (ssm_prep_backward)
 *   term 5: dWin += dproj^T h;  dh (=/+=) dproj Win
 * Win is one (W, D) matrix or its seven row blocks (mt_mamba3_weights.win_part:
 * seven GEMMs on column slices of proj / dproj, the same products).
 * Gradient rule: parameter gradients +=; dh = or += per `accumulate`; the
 * scratch is overwritten.
 */
#include "mt_mamba3.h"

int mt_mamba3_in_width(const struct mt_mamba3_dims *d)
{
    int E = d->H * d->P;
    return 2 * E + 2 * d->G * d->N + d->H + d->H * (d->N / 2) + d->H;
}

size_t mt_mamba3_weights_floats(const struct mt_mamba3_dims *d)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d);
    return W * d->D + (size_t)d->D * E + 3 * (size_t)d->H + 2 * (size_t)d->N + 2 * (size_t)d->H * d->N + E;
}

void mt_mamba3_weights_bind(struct mt_mamba3_weights *w, float *p, const struct mt_mamba3_dims *d)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d);
    w->win = p;     p += W * d->D;
    w->wout = p;    p += (size_t)d->D * E;
    w->dt_bias = p; p += d->H;
    w->A_log = p;   p += d->H;
    w->Dsk = p;     p += d->H;
    w->gB = p;      p += d->N;
    w->gC = p;      p += d->N;
    w->B_bias = p;  p += (size_t)d->H * d->N;
    w->C_bias = p;  p += (size_t)d->H * d->N;
    w->g_out = p;
}

size_t mt_mamba3_acts_floats(const struct mt_mamba3_dims *d, int n)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d), HN = (size_t)d->H * d->N;
    return (size_t)n * (W + E + 2 * HN + 2 * (size_t)d->H + 2 * (size_t)d->G + E + (size_t)d->G + E) + d->H;
}

void mt_mamba3_acts_bind(struct mt_mamba3_acts *a, float *p, const struct mt_mamba3_dims *d, int n)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d), HN = (size_t)d->H * d->N, N = (size_t)n;
    a->states = NULL;   /* the owner carves them where it keeps them (mamba.c) */
    a->Bh_b = a->Ch_b = NULL;
    a->proj = p;    p += N * W;
    a->x = p;       p += N * E;
    a->Bh = p;      p += N * HN;
    a->Ch = p;      p += N * HN;
    a->dt = p;      p += N * d->H;
    a->lam = p;     p += N * d->H;
    a->A = p;       p += d->H;
    a->rstd_bc = p; p += N * 2 * d->G;
    a->ys = p;      p += N * E;
    a->rstd_o = p;  p += N * d->G;
    a->yn = p;
}

size_t mt_mamba3_scratch_floats(const struct mt_mamba3_dims *d, int n)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d), HN = (size_t)d->H * d->N;
    return (size_t)n * (W + 3 * E + 2 * HN + 2 * (size_t)d->H) + d->H;
}

void mt_mamba3_scratch_bind(struct mt_mamba3_scratch *s, float *p, const struct mt_mamba3_dims *d, int n)
{
    size_t E = (size_t)d->H * d->P, W = (size_t)mt_mamba3_in_width(d), HN = (size_t)d->H * d->N, N = (size_t)n;
    s->dproj = p; p += N * W;
    s->dyn = p;   p += N * E;
    s->dys = p;   p += N * E;
    s->dx = p;    p += N * E;
    s->dBh = p;   p += N * HN;
    s->dCh = p;   p += N * HN;
    s->ddt = p;   p += N * d->H;
    s->dlam = p;  p += N * d->H;
    s->dA = p;
    s->dyn_b = NULL;   /* the owner sets it around a bf16 backward (mt_mamba3_scratch) */
}

/* Rows of the seven in-projection blocks, in proj's column order. */
static void in_blocks(const struct mt_mamba3_dims *d, int rows[7])
{
    const int E = d->H * d->P, GN = d->G * d->N;
    rows[0] = E; rows[1] = E; rows[2] = GN; rows[3] = GN; rows[4] = d->H; rows[5] = d->H * (d->N / 2); rows[6] = d->H;
}

/* proj (n, W) = h Win^T, from the whole Win or its seven blocks (column slices of proj) */
void mt_mamba3_in_forward(const struct mt_ops_i *ops, float *proj, const float *h, const struct mt_mamba3_weights *w,
                       const struct mt_mamba3_dims *d, int n)
{
    const int W = mt_mamba3_in_width(d);
    if (w->win) { ops->gemm(ops->be, 0, 1, n, W, d->D, 1.0f, h, d->D, w->win, d->D, 0.0f, proj, W); return; }
    int rows[7], off = 0;
    in_blocks(d, rows);
    for (int b = 0; b < 7; b++) {
        if (rows[b] > 0) ops->gemm(ops->be, 0, 1, n, rows[b], d->D, 1.0f, h, d->D, w->win_part[b], d->D, 0.0f, proj + off, W);
        off += rows[b];
    }
}

/* dWin += dproj^T h;  dh (=/+=) dproj Win, whole or by blocks */
void mt_mamba3_in_backward(const struct mt_ops_i *ops, float *dh, int accumulate, struct mt_mamba3_weights *g,
                        const float *dproj, const float *h, const struct mt_mamba3_weights *w,
                        const struct mt_mamba3_dims *d, int n)
{
    const int W = mt_mamba3_in_width(d);
    if (w->win) {
        if (g->win) ops->gemm(ops->be, 1, 0, W, d->D, n, 1.0f, dproj, W, h, d->D, 1.0f, g->win, d->D);
        ops->gemm(ops->be, 0, 0, n, d->D, W, 1.0f, dproj, W, w->win, d->D, accumulate ? 1.0f : 0.0f, dh, d->D);
        return;
    }
    int rows[7], off = 0, first = 1;
    in_blocks(d, rows);
    for (int b = 0; b < 7; b++) {
        if (rows[b] > 0) {
            if (g->win_part[b])   /* NULL: a frozen block (LoRA) has no weight gradient */
                ops->gemm(ops->be, 1, 0, rows[b], d->D, n, 1.0f, dproj + off, W, h, d->D, 1.0f, g->win_part[b], d->D);
            ops->gemm(ops->be, 0, 0, n, d->D, rows[b], 1.0f, dproj + off, W, w->win_part[b], d->D,
                      (accumulate || !first) ? 1.0f : 0.0f, dh, d->D);
            first = 0;
        }
        off += rows[b];
    }
}

void mt_mamba3_forward(const struct mt_ops_i *ops, float *out, struct mt_mamba3_acts *a, const float *h,
                       const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int B, int T)
{
    const int n = B * T, E = d->H * d->P;
    mt_mamba3_in_forward(ops, a->proj, h, w, d, n);
    mt_mamba3_mix_forward(ops, a, w, d, B, T);
    ops->gemm(ops->be, 0, 1, n, d->D, E, 1.0f, a->yn, E, w->wout, E, 0.0f, out, d->D);
}

void mt_mamba3_mix_forward(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                           const struct mt_mamba3_dims *d, int B, int T)
{
    const int n = B * T, E = d->H * d->P, W = mt_mamba3_in_width(d);
    a->ys_b = NULL;   /* the fp32 gated norm reads the fp32 ys and z */
    a->z_b = a->x_b = NULL;
    mt_mamba3_ssm_forward(ops, a, w, d, B, T);
    /* z is the first E columns of proj */
    ops->ssm_gate_norm_forward(ops->be, a->yn, a->rstd_o, a->ys, a->proj, W, w->g_out, n, E, d->G, d->eps_out);
}

/* precision=bf16 and the backend has the bf16 scan (both directions): the
 * scan's intra-chunk products on bf16 operands (mt_ops.h ssm_scan_*_bf16) */
static int scan_bf16(const struct mt_ops_i *ops, const struct mt_mamba3_dims *d)
{
    return d->scan_bf16 && ops->ssm_scan_forward_bf16 && ops->ssm_scan_backward_bf16;
}

/* ... and its chunked products run there (the shapes whose chunk states the
 * layer keeps): the scan then reads x in proj's xs columns and writes dx into
 * dproj's (ldx = W), and the prep copies neither (2 x 8 bytes an element of
 * x a step not moved; x and dx stay carved: the cpu and the other shapes use
 * them) */
static int scan_in_proj(const struct mt_ops_i *ops, const struct mt_mamba3_dims *d, int B, int T)
{
    return scan_bf16(ops, d) && mt_ssm_states_floats(B, T, d->H, d->P, d->N, d->chunk) > 0;
}

int mt_mamba3_ys_bf16_ok(const struct mt_ops_i *ops, const struct mt_mamba3_dims *d, int B, int T)
{
    return scan_in_proj(ops, d, B, T) && ops->ssm_gate_norm_forward_bf16 && ops->ssm_gate_norm_backward_bf16 &&
           ops->ssm_prep_backward_bf16;
}

/* Where the products run on tensor cores (scan_in_proj) the fp32 a->Bh is not
 * written; it keeps the prep forward's rotary angles (N/2 of its N floats a
 * head) for the prep's backward instead (ssm_prep_*'s ang_out, ang) */
static float *kept_angles(const struct mt_mamba3_acts *a, int in_proj)
{
    return in_proj ? a->Bh : NULL;
}

/* the bf16 scan's fp32 x: none where it is stored bf16 (acts x_b), proj's xs columns
 * (scan_in_proj), else the prep's copy */
static const float *scan_x(const struct mt_mamba3_acts *a, int in_proj, int E)
{
    return a->x_b ? NULL : in_proj ? a->proj + E : a->x;
}

void mt_mamba3_ssm_forward(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                           const struct mt_mamba3_dims *d, int B, int T)
{
    const int E = d->H * d->P, W = mt_mamba3_in_width(d), in_proj = scan_in_proj(ops, d, B, T);
    /* where the products run on tensor cores, the prep writes Bh, Ch's bf16 twins, their
     * operands, and nothing else of them: the scan reads B, C there as bf16 alone (mt_ops.h),
     * 2 bytes an element, and no fp32 Bh, Ch is stored (a->Bh, a->Ch stay carved: the other
     * shapes and the cpu use them); a->Bh keeps the rotary angles there instead (kept_angles):
     * one cumsum over the sequence less in the prep's backward */
    mt_bf16 *Bb = in_proj ? a->Bh_b : NULL, *Cb = in_proj ? a->Ch_b : NULL;
    float *Bh = in_proj ? NULL : a->Bh, *Ch = in_proj ? NULL : a->Ch;
    ops->ssm_prep_forward(ops->be, in_proj ? NULL : a->x, Bh, Ch, a->dt, a->lam, a->A, a->rstd_bc, NULL,
                          a->proj, w->dt_bias, w->A_log, w->gB, w->gC, w->B_bias, w->C_bias, B, T, d->H, d->P, d->G,
                          d->N, d->eps_bc, Bb, Cb, kept_angles(a, in_proj));
    MT_ASSERT(!a->ys_b || in_proj);
    MT_ASSERT(!a->x_b || a->ys_b);
    /* x: proj's xs columns (row stride W), stored bf16 there (x_b), or the prep's copy; ys as bf16 only (ys_b) */
    if (scan_bf16(ops, d))
        ops->ssm_scan_forward_bf16(ops->be, a->ys_b ? NULL : a->ys, scan_x(a, in_proj, E), in_proj ? W : E, Bh, Ch,
                                   a->dt, a->lam, a->A, w->Dsk, B, T, d->H, d->P, d->N, d->chunk, a->states, Bb, Cb,
                                   a->ys_b, a->x_b, 2 * W);
    else
        ops->ssm_scan_forward(ops->be, a->ys, a->x, a->Bh, a->Ch, a->dt, a->lam, a->A, w->Dsk, B, T, d->H, d->P, d->N,
                              d->chunk);
}

void mt_mamba3_backward(const struct mt_ops_i *ops, float *dh, int accumulate, struct mt_mamba3_weights *g,
                        struct mt_mamba3_scratch *s, const float *dout, const float *h,
                        const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                        const struct mt_mamba3_dims *d, int B, int T)
{
    const int n = B * T, E = d->H * d->P;
    /* term 1 */
    if (g->wout) ops->gemm(ops->be, 1, 0, d->D, E, n, 1.0f, dout, d->D, a->yn, E, 1.0f, g->wout, E);  /* NULL: frozen */
    ops->gemm(ops->be, 0, 0, n, E, d->D, 1.0f, dout, d->D, w->wout, E, 0.0f, s->dyn, E);
    mt_mamba3_mix_backward(ops, g, s, a, w, d, B, T);
    /* term 5 */
    mt_mamba3_in_backward(ops, dh, accumulate, g, s->dproj, h, w, d, n);
}

void mt_mamba3_mix_backward(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                            const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                            const struct mt_mamba3_dims *d, int B, int T)
{
    MT_ASSERT(!a->ys_b);   /* the fp32 gated norm reads the fp32 ys */
    const int n = B * T, E = d->H * d->P, W = mt_mamba3_in_width(d);
    /* term 2: dz lands in dproj's z columns */
    MT_ASSERT(!s->dyn_b);   /* the fp32 gated norm reads the fp32 dyn */
    ops->ssm_gate_norm_backward(ops->be, s->dys, s->dproj, g->g_out, s->dyn, a->ys, a->proj, W, w->g_out,
                                a->rstd_o, n, E, d->G);
    mt_mamba3_ssm_backward(ops, g, s, a, w, d, B, T);
}

/* On mt_mamba3_mix_backward_b's path the gated norm's backward also writes
 * dys as bf16 for the scan's products to stage (half the bytes, the same
 * bits); s->dx holds it: those shapes leave it unused (the scan writes dx
 * into dproj) */
static mt_bf16 *dys_twin(const struct mt_mamba3_scratch *s)
{
    return (mt_bf16 *)s->dx;
}

/* ... and dBh, dCh as bf16 only, written by the scan's backward and read by the
 * prep's (half the bytes each way; a rounding point, autocast's): in the first
 * half of their fp32 memory, which those shapes leave unused */
static mt_bf16 *dbc_twin(float *dXh)
{
    return (mt_bf16 *)dXh;
}

/* terms 3 and 4; dproj_b: NULL, or dproj's columns are written there as bf16
 * (mt_mamba3_mix_backward_b's shapes and entries only; dys's, dBh's and dCh's
 * twins with them) */
static void ssm_backward(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                         const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                         const struct mt_mamba3_dims *d, int B, int T, mt_bf16 *dproj_b)
{
    const int E = d->H * d->P, W = mt_mamba3_in_width(d), in_proj = scan_in_proj(ops, d, B, T);
    /* term 3 */
    ops->fill(ops->be, s->dA, 0.0f, (size_t)d->H);
    if (scan_bf16(ops, d))   /* in_proj: x from proj, dx into dproj's xs columns; the forward's chunk states */
        ops->ssm_scan_backward_bf16(ops->be, in_proj ? s->dproj + E : s->dx, dproj_b ? NULL : s->dBh,
                                    dproj_b ? NULL : s->dCh, s->ddt, s->dlam, s->dA,
                                    g->Dsk, dproj_b ? NULL : s->dys, scan_x(a, in_proj, E), in_proj ? W : E,
                                    in_proj ? NULL : a->Bh, in_proj ? NULL : a->Ch, a->dt,
                                    a->lam, a->A, w->Dsk, B, T, d->H, d->P, d->N, d->chunk, a->states,
                                    dproj_b ? dproj_b + E : NULL, in_proj ? a->Bh_b : NULL, in_proj ? a->Ch_b : NULL,
                                    dproj_b ? dys_twin(s) : NULL, a->x_b, 2 * W, dproj_b ? dbc_twin(s->dBh) : NULL,
                                    dproj_b ? dbc_twin(s->dCh) : NULL);
    else
        ops->ssm_scan_backward(ops->be, s->dx, s->dBh, s->dCh, s->ddt, s->dlam, s->dA, g->Dsk, s->dys, a->x, a->Bh,
                               a->Ch, a->dt, a->lam, a->A, w->Dsk, B, T, d->H, d->P, d->N, d->chunk);
    /* term 4 */
    if (dproj_b)
        ops->ssm_prep_backward_bf16(ops->be, dproj_b, s->dproj, g->dt_bias, g->A_log, g->gB, g->gC, g->B_bias,
                                    g->C_bias, NULL, NULL, NULL, s->ddt, s->dlam, s->dA, w->B_bias, w->C_bias,
                                    a->lam, a->A, a->rstd_bc, a->proj, w->dt_bias, w->gB, w->gC, B, T, d->H, d->P, d->G,
                                    d->N, d->eps_bc, kept_angles(a, in_proj), dbc_twin(s->dBh), dbc_twin(s->dCh));
    else
        ops->ssm_prep_backward(ops->be, s->dproj, g->dt_bias, g->A_log, g->gB, g->gC, g->B_bias, g->C_bias,
                               in_proj ? NULL : s->dx, s->dBh, s->dCh, s->ddt, s->dlam, s->dA, w->B_bias,
                               w->C_bias, a->lam, a->A, a->rstd_bc, a->proj, w->dt_bias, w->gB, w->gC, B, T, d->H, d->P, d->G, d->N,
                               d->eps_bc, kept_angles(a, in_proj));
}

void mt_mamba3_ssm_backward(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                            const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                            const struct mt_mamba3_dims *d, int B, int T)
{
    ssm_backward(ops, g, s, a, w, d, B, T, NULL);
}

/* Where the scan writes dx into dproj (scan_in_proj) and the backend has the
 * bf16-output glue, dproj's three producers (the gated norm: z; the scan: xs;
 * the prep: the rest) write it as bf16 straight into dproj_b, the
 * in-projection backward's operand: the bits cast_bf16 gives the fp32 dproj,
 * without its store (4 bytes an element), the cast's read (4) and the cast's
 * own store (2): 10 W bytes a row become 2 (the d2048 hybrid: ~0.69 GB an M
 * layer). Else the fp32 path and 0. */
int mt_mamba3_mix_backward_b(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                             const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                             const struct mt_mamba3_dims *d, int B, int T, mt_bf16 *dproj_b)
{
    const int n = B * T, E = d->H * d->P, W = mt_mamba3_in_width(d);
    if (!dproj_b || !mt_mamba3_ys_bf16_ok(ops, d, B, T)) {
        MT_ASSERT(!a->ys_b && !a->z_b && !a->x_b);   /* the fp32 gated norm reads the fp32 ys, z (mt_mamba3_acts) */
        mt_mamba3_mix_backward(ops, g, s, a, w, d, B, T);
        return 0;
    }
    /* dys as bf16 only (its twin): the tensor-core scan, its one reader, widens it */
    ops->ssm_gate_norm_backward_bf16(ops->be, NULL, dproj_b, g->g_out, s->dyn_b ? NULL : s->dyn, a->ys_b ? NULL : a->ys,
                                     a->proj, W, w->g_out, a->rstd_o, n, E, d->G, dys_twin(s), a->ys_b, a->z_b, 2 * W,
                                     s->dyn_b);
    ssm_backward(ops, g, s, a, w, d, B, T, dproj_b);
    return 1;
}

size_t mt_mamba3_state_floats(const struct mt_mamba3_dims *d)
{
    size_t H = (size_t)d->H, P = (size_t)d->P, N = (size_t)d->N;
    return H * P * N + H * P + H * N + H * (N / 2);
}

void mt_mamba3_decode(const struct mt_ops_i *ops, float *out, struct mt_mamba3_acts *a, float *state,
                      const float *h, const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int T,
                      int pos0)
{
    const int E = d->H * d->P;
    mt_mamba3_in_forward(ops, a->proj, h, w, d, T);
    mt_mamba3_decode_mix(ops, a, state, w, d, T, pos0);
    ops->gemm(ops->be, 0, 1, T, d->D, E, 1.0f, a->yn, E, w->wout, E, 0.0f, out, d->D);
}

void mt_mamba3_decode_mix(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, float *state,
                          const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int T, int pos0)
{
    const int E = d->H * d->P, W = mt_mamba3_in_width(d), HN = d->H * d->N;
    float *S = state, *xprev = S + (size_t)HN * d->P, *Bprev = xprev + E, *ang = Bprev + HN;
    /* the rotary cumsum continues from the carried angles (and writes them back) */
    ops->ssm_prep_forward(ops->be, a->x, a->Bh, a->Ch, a->dt, a->lam, a->A, a->rstd_bc, ang, a->proj, w->dt_bias,
                          w->A_log, w->gB, w->gC, w->B_bias, w->C_bias, 1, T, d->H, d->P, d->G, d->N, d->eps_bc,
                          NULL, NULL, NULL);
    for (int t = 0; t < T; t++)
        ops->ssm_scan_step(ops->be, a->ys + (size_t)t * E, S, xprev, Bprev, a->x + (size_t)t * E, a->Bh + (size_t)t * HN,
                           a->Ch + (size_t)t * HN, a->dt + (size_t)t * d->H, a->lam + (size_t)t * d->H, a->A,
                           w->Dsk, 1, d->H, d->P, d->N, pos0 + t == 0);
    ops->ssm_gate_norm_forward(ops->be, a->yn, a->rstd_o, a->ys, a->proj, W, w->g_out, T, E, d->G, d->eps_out);
}
