/*
 * ssm_glue.c — the Mamba-3 mixer's elementwise stages around the scan
 * (mt_ops.h ssm_prep_* and ssm_gate_norm_*), so that the mixer runs on any
 * backend through the ops table. Math and gradients: docs/mamba3.md §2, §5.
 *
 * Layout: proj (n, W) rows of the in-projection, n = B*T, split in the
 * reference's order  z [E] | xs [E] | B [G*N] | C [G*N] | dt [H] | theta [H*N/2] | lam [H].
 *
 * prep forward, per row (b, t) and head h in group g = h / (H/G):
 *   x[h]   = xs[h*P .. h*P+P)
 *   dt     = softplus(dt_raw + dt_bias),  lam = sigmoid(lam_raw),  A = -exp(A_log)
 *   Bn_g   = rmsnorm(B_g) * gB   (eps; over N),  Cn_g likewise with gC
 *   ang_k  = sum_{r <= t} theta_{r,h,k}      k < N/2 (cumsum over the sequence)
 *   Bh[h]  = rot(Bn_g + B_bias[h], ang),  rot: pairs (k, k+N/2) as rotate-half:
 *            o_k = u_k cos - u_{k+N/2} sin,  o_{k+N/2} = u_k sin + u_{k+N/2} cos
 * Parallelism: forward tasks over (b, h); backward tasks over (b, g) (each
 * owns its heads and rows; the group norm's gradient sums the group's heads);
 * parameter gradients are written as per-task partials and summed in task
 * order.
 */
#include "cpu_impl.h"
#include "../../core/mt_core.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

static inline float softplusf(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
static inline float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

/* Shared by forward and backward: head h's rotated B or C row,
 * o = rot(raw rstd g + bias, ang) (c, s: cos, sin of the angles; bn, ub: N
 * floats of scratch each). The backward recomputes o with it rather than
 * reading the forward's Bh, Ch back: one code path, the same bits. */
static inline void norm_rotate(float *o, float *bn, float *ub, const float *raw, float rs, const float *g,
                               const float *bias, const float *c, const float *s, int N)
{
    const int half = N / 2;
    for (int k = 0; k < N; k++) bn[k] = raw[k] * rs * g[k];
    for (int k = 0; k < N; k++) ub[k] = bn[k] + bias[k];
    for (int k = 0; k < half; k++) {
        float a = ub[k], b = ub[k + half];
        o[k] = a * c[k] - b * s[k];
        o[k + half] = a * s[k] + b * c[k];
    }
}

void mt_cpu_ssm_prep_forward(float *x, float *Bh, float *Ch, float *dt, float *lam, float *A,
                             float *rstd, float *ang_state, const float *proj, const float *dt_bias, const float *A_log,
                             const float *gB, const float *gC, const float *B_bias, const float *C_bias,
                             int B, int T, int H, int P, int G, int N, float eps, float *ang_out)
{
    const int E = H * P, GN = G * N, half = N / 2, hpg = H / G;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + (size_t)H + (size_t)H * half + (size_t)H;
    const size_t oB = 2 * (size_t)E, oC = oB + GN, odt = oC + GN, oth = odt + H, olam = oth + (size_t)H * half;
    for (int h = 0; h < H; h++) A[h] = -expf(A_log[h]);
    /* tasks over (b, h): each head recomputes its group's norm (N work per
     * row, small next to the rotary); the group's first head writes rstd */
    #pragma omp parallel
    {
        float *ang = malloc(((size_t)half * 3 + 2 * (size_t)N) * sizeof(float));
        MT_ASSERT(ang);
        float *cs = ang + half, *sn = cs + half, *bn = sn + half, *ub = bn + N;
        #pragma omp for schedule(static)
        for (int task = 0; task < B * H; task++) {
            int b = task / H, h = task % H, g = h / hpg;
            float *as = ang_state ? ang_state + ((size_t)b * H + h) * half : NULL;
            if (as) memcpy(ang, as, (size_t)half * sizeof(float));
            else memset(ang, 0, (size_t)half * sizeof(float));
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t, r = n * H + h;
                const float *row = proj + n * W;
                const float *br = row + oB + (size_t)g * N, *cr = row + oC + (size_t)g * N;
                double sb = 0.0, sc = 0.0;
                for (int k = 0; k < N; k++) { sb += (double)br[k] * br[k]; sc += (double)cr[k] * cr[k]; }
                float rb = (float)(1.0 / sqrt(sb / N + eps)), rc = (float)(1.0 / sqrt(sc / N + eps));
                if (h % hpg == 0) {
                    rstd[n * 2 * G + g] = rb;
                    rstd[n * 2 * G + G + g] = rc;
                }
                if (x) memcpy(x + r * P, row + E + (size_t)h * P, (size_t)P * sizeof(float));
                dt[r] = softplusf(row[odt + h] + dt_bias[h]);
                lam[r] = sigmoidf_(row[olam + h]);
                const float *th = row + oth + (size_t)h * half;
                for (int k = 0; k < half; k++) { ang[k] += th[k]; cs[k] = cosf(ang[k]); sn[k] = sinf(ang[k]); }
                if (ang_out) memcpy(ang_out + r * half, ang, (size_t)half * sizeof(float));
                norm_rotate(Bh + r * N, bn, ub, br, rb, gB, B_bias + (size_t)h * N, cs, sn, N);
                norm_rotate(Ch + r * N, bn, ub, cr, rc, gC, C_bias + (size_t)h * N, cs, sn, N);
            }
            if (as) memcpy(as, ang, (size_t)half * sizeof(float));
        }
        free(ang);
    }
}

/* Backward (all of dproj's columns except z, which ssm_gate_norm_backward
 * writes). With o = rot(u) the rotated vector and dO its gradient:
 *   du     = R(ang)^T dO       (the inverse rotation)
 *   dang_k = -dO_k o_{k+N/2} + dO_{k+N/2} o_k      (summed over B and C)
 *   dtheta_t = sum_{t' >= t} dang_{t'}            (reverse cumsum over the sequence)
 *   dB_bias[h] += du;  dBn_g = sum_{h in g} du;  with xhat = B_raw rstd:
 *   dgB += dBn xhat;  dB_raw = rstd (dBn gB - xhat mean_k(dBn gB xhat))     (C likewise)
 *   ddt_raw = ddt sigmoid(dt_raw + dt_bias);  ddt_bias += ddt_raw;  dlam_raw = dlam lam (1-lam)
 *   dA_log += dA A                              (dA from the scan; A = -exp(A_log))
 * The angles are recomputed by the same forward cumsum as in the forward
 * (bit-identical), dang is parked in dproj's theta columns and turned into
 * dtheta by a reverse cumsum at the end of the task.
 */
void mt_cpu_ssm_prep_backward(float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                              float *dB_bias, float *dC_bias, const float *dx, const float *dBh,
                              const float *dCh, const float *ddt, const float *dlam, const float *dA,
                              const float *B_bias, const float *C_bias, const float *lam, const float *A,
                              const float *rstd, const float *proj, const float *dt_bias,
                              const float *gB, const float *gC, int B, int T, int H, int P, int G,
                              int N, float eps, const float *ang_in)
{
    const int E = H * P, GN = G * N, half = N / 2, hpg = H / G;
    const size_t W = 2 * (size_t)E + 2 * (size_t)GN + (size_t)H + (size_t)H * half + (size_t)H;
    const size_t oB = 2 * (size_t)E, oC = oB + GN, odt = oC + GN, oth = odt + H, olam = oth + (size_t)H * half;
    /* per-task (b, g) partials: dt_bias (H), gB (N), gC (N), B_bias (H*N), C_bias (H*N);
     * gB/gC are shared by the groups, so each task needs its own row (no race) */
    const size_t np = (size_t)H + 2 * (size_t)N + 2 * (size_t)H * N;
    float *part = calloc((size_t)B * G * np, sizeof(float));
    MT_ASSERT(part);
    for (int h = 0; h < H; h++) dA_log[h] += dA[h] * A[h];
    (void)eps;
    #pragma omp parallel
    {
        float *ang = malloc(((size_t)hpg * half + 7 * (size_t)N) * sizeof(float));
        MT_ASSERT(ang);
        float *dn = ang + (size_t)hpg * half, *du = dn + 2 * (size_t)N, *cs = du + N, *sn = cs + half;
        float *o = sn + half, *bn = o + N, *ub = bn + N;   /* the forward's Bh / Ch row, recomputed */
        #pragma omp for schedule(static)
        for (int task = 0; task < B * G; task++) {
            int b = task / G, g = task % G;
            float *pb = part + (size_t)task * np;
            float *p_dtb = pb, *p_gB = pb + H, *p_gC = p_gB + N, *p_Bb = p_gC + N, *p_Cb = p_Bb + (size_t)H * N;
            memset(ang, 0, (size_t)hpg * half * sizeof(float));
            for (int t = 0; t < T; t++) {
                size_t n = (size_t)b * T + t;
                const float *row = proj + n * W;
                float *drow = dproj + n * W;
                memset(dn, 0, 2 * (size_t)N * sizeof(float));   /* dBn_g, dCn_g */
                for (int j = 0; j < hpg; j++) {
                    int h = g * hpg + j;
                    size_t r = n * H + h;
                    if (dx) memcpy(drow + E + (size_t)h * P, dx + r * P, (size_t)P * sizeof(float));
                    float gdt = ddt[r] * sigmoidf_(row[odt + h] + dt_bias[h]);
                    drow[odt + h] = gdt;
                    p_dtb[h] += gdt;
                    drow[olam + h] = dlam[r] * lam[r] * (1.0f - lam[r]);
                    float *run = ang + (size_t)j * half, *dth = drow + oth + (size_t)h * half;
                    const float *th = row + oth + (size_t)h * half, *a = run;
                    if (ang_in) a = ang_in + r * half;   /* the forward's angles */
                    else for (int k = 0; k < half; k++) run[k] += th[k];
                    for (int k = 0; k < half; k++) { cs[k] = cosf(a[k]); sn[k] = sinf(a[k]); dth[k] = 0.0f; }
                    for (int pass = 0; pass < 2; pass++) {
                        const float *dO = (pass ? dCh : dBh) + r * N;
                        norm_rotate(o, bn, ub, row + (pass ? oC : oB) + (size_t)g * N,
                                    rstd[n * 2 * G + (size_t)pass * G + g], pass ? gC : gB,
                                    (pass ? C_bias : B_bias) + (size_t)h * N, cs, sn, N);
                        float *pbias = (pass ? p_Cb : p_Bb) + (size_t)h * N, *acc = dn + (size_t)pass * N;
                        for (int k = 0; k < half; k++) {
                            float d1 = dO[k], d2 = dO[k + half];
                            dth[k] += -d1 * o[k + half] + d2 * o[k];
                            du[k] = d1 * cs[k] + d2 * sn[k];
                            du[k + half] = -d1 * sn[k] + d2 * cs[k];
                        }
                        for (int k = 0; k < N; k++) { pbias[k] += du[k]; acc[k] += du[k]; }
                    }
                }
                /* group rmsnorm backward of B and C */
                for (int pass = 0; pass < 2; pass++) {
                    const float *raw = row + (pass ? oC : oB) + (size_t)g * N, *gw = pass ? gC : gB;
                    float rs = rstd[n * 2 * G + (size_t)pass * G + g], *pg = pass ? p_gC : p_gB;
                    const float *d = dn + (size_t)pass * N;
                    float *dr = drow + (pass ? oC : oB) + (size_t)g * N;
                    double m = 0.0;
                    for (int k = 0; k < N; k++) {
                        float xh = raw[k] * rs;
                        pg[k] += d[k] * xh;
                        m += (double)d[k] * gw[k] * xh;
                    }
                    float mean = (float)(m / N);
                    for (int k = 0; k < N; k++) dr[k] = rs * (d[k] * gw[k] - raw[k] * rs * mean);
                }
            }
            /* dtheta: reverse cumsum of dang over the sequence, in place */
            for (int j = 0; j < hpg; j++) {
                int h = g * hpg + j;
                float *run = ang + (size_t)j * half;
                memset(run, 0, (size_t)half * sizeof(float));
                for (int t = T - 1; t >= 0; t--) {
                    float *dth = dproj + ((size_t)b * T + t) * W + oth + (size_t)h * half;
                    for (int k = 0; k < half; k++) { run[k] += dth[k]; dth[k] = run[k]; }
                }
            }
        }
        free(ang);
    }
    for (int task = 0; task < B * G; task++) {
        const float *pb = part + (size_t)task * np;
        for (int h = 0; h < H; h++) ddt_bias[h] += pb[h];
        for (int k = 0; k < N; k++) { dgB[k] += pb[H + k]; dgC[k] += pb[H + N + k]; }
        for (size_t k = 0; k < (size_t)H * N; k++) {
            dB_bias[k] += pb[H + 2 * N + k];
            dC_bias[k] += pb[H + 2 * N + (size_t)H * N + k];
        }
    }
    free(part);
}

/* Gated grouped RMSNorm (the reference's norm_before_gate=False), rows n of
 * width E in G groups of E/G channels, z read with row stride ldz:
 *   v = y silu(z);  out = v rstd_g w,  rstd_g = 1/sqrt(mean_group(v^2) + eps)   rstd (n, G)
 * backward, vhat = v rstd:
 *   dw += dout vhat;  dv = rstd (dout w - vhat mean_group(dout w vhat))
 *   dy = dv silu(z) (=);  dz = dv y silu'(z) (=, row stride ldz)
 */
/* out (or NULL) and out_b (or NULL) = bf16(out): v is computed again for the
 * scaled pass rather than stored and read back (the same expression: the same
 * bits as storing it) */
void mt_cpu_ssm_gate_norm_forward_bf16(float *out, mt_bf16 *out_b, float *rstd, const float *y, const float *z,
                                       int ldz, const float *w, int n, int E, int G, float eps)
{
    const int cg = E / G;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *yr = y + (size_t)i * E, *zr = z + (size_t)i * ldz;
        for (int g = 0; g < G; g++) {
            double ss = 0.0;
            for (int c = g * cg; c < (g + 1) * cg; c++) {
                float v = yr[c] * zr[c] * sigmoidf_(zr[c]);
                ss += (double)v * v;
            }
            float rs = (float)(1.0 / sqrt(ss / cg + eps));
            rstd[(size_t)i * G + g] = rs;
            for (int c = g * cg; c < (g + 1) * cg; c++) {
                float o = yr[c] * zr[c] * sigmoidf_(zr[c]) * (rs * w[c]);
                if (out) out[(size_t)i * E + c] = o;
                if (out_b) out_b[(size_t)i * E + c] = mt_cpu_f32_to_bf16(o);
            }
        }
    }
}

void mt_cpu_ssm_gate_norm_forward(float *out, float *rstd, const float *y, const float *z, int ldz,
                                  const float *w, int n, int E, int G, float eps)
{
    mt_cpu_ssm_gate_norm_forward_bf16(out, NULL, rstd, y, z, ldz, w, n, E, G, eps);
}

void mt_cpu_ssm_gate_norm_backward(float *dy, float *dz, float *dw, const float *dout, const float *y,
                                   const float *z, int ldz, const float *w, const float *rstd,
                                   int n, int E, int G)
{
    const int cg = E / G;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    float *part = calloc((size_t)nt * E, sizeof(float));
    MT_ASSERT(part);
    #pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *pw = part + (size_t)tid * E;
        #pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            const float *yr = y + (size_t)i * E, *zr = z + (size_t)i * ldz, *d = dout + (size_t)i * E;
            float *dyr = dy + (size_t)i * E, *dzr = dz + (size_t)i * ldz;
            for (int g = 0; g < G; g++) {
                float rs = rstd[(size_t)i * G + g];
                double m = 0.0;
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    float vh = yr[c] * zr[c] * sigmoidf_(zr[c]) * rs;
                    pw[c] += d[c] * vh;
                    m += (double)d[c] * w[c] * vh;
                }
                float mean = (float)(m / cg);
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    float s = sigmoidf_(zr[c]), si = zr[c] * s;
                    float vh = yr[c] * si * rs;
                    float dv = rs * (d[c] * w[c] - vh * mean);
                    dyr[c] = dv * si;
                    dzr[c] = dv * yr[c] * (s + si * (1.0f - s));
                }
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int c = 0; c < E; c++) dw[c] += part[(size_t)t * E + c];
    free(part);
}

/*
 * The gated norm when its groups span ranks (replicated B/C under TP,
 * docs/mamba3.md §10): the per-row group sums as their own pass, so the
 * caller can all-reduce them over the model group, then the norm and its
 * backward from the reduced sums. The rank's channels [c0, c0 + E) of the
 * global d_inner meet the global groups of cg channels in ng local groups;
 * local group j covers local channels [lo_j, hi_j) (gate_span).
 */
static int gate_ng(int E, int c0, int cg) { return (c0 + E - 1) / cg - c0 / cg + 1; }

static void gate_span(int j, int E, int c0, int cg, int *lo, int *hi)
{
    int g = c0 / cg + j, a = g * cg - c0, b = (g + 1) * cg - c0;
    *lo = a > 0 ? a : 0;
    *hi = b < E ? b : E;
}

void mt_cpu_ssm_gate_norm_sums(float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                               const float *dout, const float *rstd, int n, int E, int c0, int cg)
{
    const int ng = gate_ng(E, c0, cg);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *yr = y + (size_t)i * E, *zr = z + (size_t)i * ldz;
        for (int j = 0; j < ng; j++) {
            int lo, hi;
            gate_span(j, E, c0, cg, &lo, &hi);
            double acc = 0.0;
            if (!dout) {
                for (int c = lo; c < hi; c++) {
                    float v = yr[c] * zr[c] * sigmoidf_(zr[c]);
                    acc += (double)v * v;
                }
            } else {
                const float *d = dout + (size_t)i * E;
                float rs = rstd[(size_t)i * ng + j];
                for (int c = lo; c < hi; c++) acc += (double)d[c] * w[c] * (yr[c] * zr[c] * sigmoidf_(zr[c]) * rs);
            }
            s[(size_t)i * lds + j] = (float)acc;
        }
    }
}

void mt_cpu_ssm_gate_norm_forward_ext(float *out, float *rstd, const float *y, const float *z, int ldz,
                                      const float *w, const float *s, int lds, int n, int E, int c0, int cg,
                                      float eps)
{
    const int ng = gate_ng(E, c0, cg);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *yr = y + (size_t)i * E, *zr = z + (size_t)i * ldz;
        float *o = out + (size_t)i * E;
        for (int j = 0; j < ng; j++) {
            int lo, hi;
            gate_span(j, E, c0, cg, &lo, &hi);
            float rs = (float)(1.0 / sqrt((double)s[(size_t)i * lds + j] / cg + eps));
            rstd[(size_t)i * ng + j] = rs;
            for (int c = lo; c < hi; c++) o[c] = yr[c] * zr[c] * sigmoidf_(zr[c]) * rs * w[c];
        }
    }
}

void mt_cpu_ssm_gate_norm_backward_ext(float *dy, float *dz, float *dw, const float *dout, const float *y,
                                       const float *z, int ldz, const float *w, const float *rstd, const float *s,
                                       int lds, int n, int E, int c0, int cg)
{
    const int ng = gate_ng(E, c0, cg);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    float *part = calloc((size_t)nt * E, sizeof(float));
    MT_ASSERT(part);
    #pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *pw = part + (size_t)tid * E;
        #pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            const float *yr = y + (size_t)i * E, *zr = z + (size_t)i * ldz, *d = dout + (size_t)i * E;
            float *dyr = dy + (size_t)i * E, *dzr = dz + (size_t)i * ldz;
            for (int j = 0; j < ng; j++) {
                int lo, hi;
                gate_span(j, E, c0, cg, &lo, &hi);
                float rs = rstd[(size_t)i * ng + j];
                float mean = (float)((double)s[(size_t)i * lds + j] / cg);
                for (int c = lo; c < hi; c++) {
                    float sg = sigmoidf_(zr[c]), si = zr[c] * sg;
                    float vh = yr[c] * si * rs;
                    pw[c] += d[c] * vh;
                    float dv = rs * (d[c] * w[c] - vh * mean);
                    dyr[c] = dv * si;
                    dzr[c] = dv * yr[c] * (sg + si * (1.0f - sg));
                }
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int c = 0; c < E; c++) dw[c] += part[(size_t)t * E + c];
    free(part);
}
