/*
 * attention_bf16.c — the reference of attention in precision=bf16
 * (mt_ops.h attention_forward_bf16 / attention_backward_bf16): the rounding
 * points of the cuda tensor-core kernels (attention_tc.cu), in plain loops.
 *
 * Per (b, h), query i, keys j <= i, with q~, k~, v~, dout~ = bf16(q, k, v, dout):
 *   s_ij = scale q~_i . k~_j;  lse_i = log sum_j exp(s_ij)   (fp32)
 *   p_ij = exp(s_ij - lse_i);  out_i = sum_j bf16(p_ij) v~_j
 * backward, D_i = dout~_i . out~_i (out~ = bf16(out): FlashAttention-2's D, the
 * operands the products see; summed in fp32):
 *   dp_ij = dout~_i . v~_j;  ds_ij = scale p_ij (dp_ij - D_i)
 *   dv_j = sum_i bf16(p_ij) dout~_i;  dk_j = sum_i bf16(ds_ij) q~_i;  dq_i = sum_j bf16(ds_ij) k~_j
 *
 * It is the mode's reference, not a fast path: O(T^2 hd) loops, one task
 * per (b, h) forward and per (b, kv head) backward (a task owns its output
 * rows: dk/dv of its kv head, dq of the heads sharing it; sums in a fixed
 * order: deterministic). The rounded operands are fp32 copies (a bf16
 * value is an fp32 value), allocated per call.
 */
#include "cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bf16r(float x) { return mt_cpu_bf16_to_f32(mt_cpu_f32_to_bf16(x)); }

static float *rounded_copy(const float *x, size_t n)
{
    float *r = malloc((n ? n : 1) * sizeof(float));
    if (!r) return NULL;
    for (size_t i = 0; i < n; i++) r[i] = bf16r(x[i]);
    return r;
}

/* an operand's bf16 values as floats: rounded from x, or (x NULL) widened from
 * xb, where its producer left them rounded already (the same values) */
static float *operand(const float *x, const uint16_t *xb, size_t n)
{
    if (x) return rounded_copy(x, n);
    float *r = xb ? malloc((n ? n : 1) * sizeof(float)) : NULL;
    if (!r) return NULL;
    for (size_t i = 0; i < n; i++) r[i] = mt_cpu_bf16_to_f32(xb[i]);
    return r;
}

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* lse of query row i over keys 0..i (s computed into srow) */
static float row_scores(float *srow, const float *qi, const float *kg, size_t kld, int i, int hd, float scale)
{
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= i; j++) {
        srow[j] = dot(qi, kg + (size_t)j * kld, hd) * scale;
        if (srow[j] > m) m = srow[j];
    }
    for (int j = 0; j <= i; j++) l += expf(srow[j] - m);
    return m + logf(l);
}

/* kernels return void (mt_ops.h): on an allocation failure the outputs are
 * poisoned with NaN so the trainer's finite check stops the run */
static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

void mt_cpu_attention_forward_bf16(float *out, uint16_t *out_bf16, float *lse, const float *q, const float *k,
                                  const float *v, int B, int T, int H, int K, int hd, const uint16_t *qkv_b)
{
    const size_t qld = (size_t)H * hd, kld = (size_t)K * hd;
    const size_t nq = (size_t)B * T * qld, nk = (size_t)B * T * kld;
    float *qr = operand(q, qkv_b, nq), *kr = operand(k, qkv_b ? qkv_b + nq : NULL, nk);
    float *vr = operand(v, qkv_b ? qkv_b + nq + nk : NULL, nk);
    int ok = qr && kr && vr;
    const float scale = 1.0f / sqrtf((float)hd);
    const int grp = H / K;
#pragma omp parallel for collapse(2) schedule(dynamic) if (ok)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            if (!ok) continue;
            float *srow = malloc(((size_t)T + (size_t)hd) * sizeof(float));   /* + out's row when out is NULL */
            if (!srow) { ok = 0; continue; }
            const float *kg = kr + (size_t)b * T * kld + (size_t)(h / grp) * hd;
            const float *vg = vr + (size_t)b * T * kld + (size_t)(h / grp) * hd;
            for (int i = 0; i < T; i++) {
                const size_t at = ((size_t)b * T + i) * qld + (size_t)h * hd;
                const float L = row_scores(srow, qr + at, kg, kld, i, hd, scale);
                lse[((size_t)b * H + h) * T + i] = L;
                float *o = out ? out + at : srow + T;
                for (int d = 0; d < hd; d++) o[d] = 0.0f;
                for (int j = 0; j <= i; j++) {
                    const float p = bf16r(expf(srow[j] - L));
                    const float *vj = vg + (size_t)j * kld;
                    for (int d = 0; d < hd; d++) o[d] += p * vj[d];
                }
                if (out_bf16)
                    for (int d = 0; d < hd; d++) out_bf16[at + d] = mt_cpu_f32_to_bf16(o[d]);
            }
            free(srow);
        }
    free(qr); free(kr); free(vr);
    if (!ok && out) poison(out, nq);
    if (!ok && out_bf16)
        for (size_t i = 0; i < nq; i++) out_bf16[i] = 0x7fc0;   /* NaN */
}

void mt_cpu_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                   const float *k, const float *v, const float *out, const float *lse,
                                   int B, int T, int H, int K, int hd, const uint16_t *qkv_b, const uint16_t *dout_b,
                                   const uint16_t *out_b)
{
    const size_t qld = (size_t)H * hd, kld = (size_t)K * hd;
    const size_t nq = (size_t)B * T * qld, nk = (size_t)B * T * kld;
    float *qr = operand(q, qkv_b, nq), *kr = operand(k, qkv_b ? qkv_b + nq : NULL, nk);
    float *vr = operand(v, qkv_b ? qkv_b + nq + nk : NULL, nk);
    float *gr = operand(dout_b ? NULL : dout, dout_b, nq), *orr = operand(out_b ? NULL : out, out_b, nq);
    int ok = qr && kr && vr && gr && orr;
    const float scale = 1.0f / sqrtf((float)hd);
    const int grp = H / K;
#pragma omp parallel for collapse(2) schedule(dynamic) if (ok)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < K; g++) {
            if (!ok) continue;
            const size_t koff = (size_t)b * T * kld + (size_t)g * hd;
            for (int j = 0; j < T; j++) {
                memset(dk + koff + (size_t)j * kld, 0, (size_t)hd * sizeof(float));
                memset(dv + koff + (size_t)j * kld, 0, (size_t)hd * sizeof(float));
            }
            for (int h = g * grp; h < (g + 1) * grp; h++)
                for (int i = 0; i < T; i++) {
                    const size_t at = ((size_t)b * T + i) * qld + (size_t)h * hd;
                    const float L = lse[((size_t)b * H + h) * T + i];
                    const float Di = dot(gr + at, orr + at, hd);
                    float *dqi = dq + at;
                    for (int d = 0; d < hd; d++) dqi[d] = 0.0f;
                    for (int j = 0; j <= i; j++) {
                        const size_t kat = koff + (size_t)j * kld;
                        const float p = expf(dot(qr + at, kr + kat, hd) * scale - L);
                        const float dp = dot(gr + at, vr + kat, hd);
                        const float pb = bf16r(p), dsb = bf16r(scale * p * (dp - Di));
                        for (int d = 0; d < hd; d++) {
                            dv[kat + d] += pb * gr[at + d];
                            dk[kat + d] += dsb * qr[at + d];
                            dqi[d] += dsb * kr[kat + d];
                        }
                    }
                }
        }
    free(qr); free(kr); free(vr); free(gr); free(orr);
    if (!ok) { poison(dq, nq); poison(dk, nk); poison(dv, nk); }
}
