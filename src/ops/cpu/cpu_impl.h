/*
 * cpu_impl.h — internal prototypes of the cpu backend (the .c files of src/ops/cpu) and
 * the small vectorisable math helpers they share.
 *
 * Every mt_cpu_* function implements the mt_ops_i entry of the same name with
 * exactly the contract written in mt_ops.h; ops_cpu.c puts them in the table.
 * Parallelism: OpenMP static schedules over rows/blocks that each thread
 * owns; reductions run in a fixed order, so results are bit-identical for a
 * given thread count (most are also independent of it).
 */
#ifndef MT_CPU_IMPL_H
#define MT_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include "../mt_ops.h"   /* enum mt_elem (gemm_bf16) */
#include <math.h>

/* ---- exp for the hot loops (Cephes expf polynomial, ~1 ulp on [-87, 88]) ----
 * exp(x) = 2^n * p(r), n = round(x / ln2), r = x - n ln2 (two-part ln2).
 * x < -87.33 -> 0 (also -inf), x > 88.72 -> +inf, NaN -> NaN.
 * mt_cpu_exp8 is the AVX2/FMA form used by the hot loops (gcc will not
 * vectorise the scalar form under the default -ftrapping-math, and glibc's
 * vector expf needs -ffast-math); mt_cpu_expf is the scalar form for tails. */
static inline float mt_cpu_expf(float x)
{
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.0f ? -87.0f : xc;
    float fx = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    float r  = xc - fx * 0.693359375f;
    r        = r - fx * -2.12194440e-4f;
    float p  = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } u;
    u.i = ((int32_t)fx + 127) << 23;
    float res = p * u.f;
    res = x < -87.33654475f ? 0.0f : res;
    res = x > 88.72283905f ? __builtin_inff() : res;
    return res;
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error ~1e-7 (enough for softcap). */
static inline float mt_cpu_tanhf(float x)
{
    return 1.0f - 2.0f / (mt_cpu_expf(2.0f * x) + 1.0f);
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MT_CPU_HAVE_EXP8 1
static inline __m256 mt_cpu_exp8(__m256 x)
{
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_cvtps_epi32(fx);
    __m256 pw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    __m256 res = _mm256_mul_ps(p, pw);
    res = _mm256_blendv_ps(res, _mm256_setzero_ps(),
                           _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654475f), _CMP_LT_OQ));
    res = _mm256_blendv_ps(res, _mm256_set1_ps(__builtin_inff()),
                           _mm256_cmp_ps(x, _mm256_set1_ps(88.72283905f), _CMP_GT_OQ));
    return _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline __m256 mt_cpu_tanh8(__m256 x)
{
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = mt_cpu_exp8(_mm256_add_ps(x, x));
    return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

static inline float mt_cpu_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* ---- RoPE's rotation of one pair (rope.c, fused.c) ----
 * lo = a c - b s, hi = b c + a s, written as explicit FMAs (the first product
 * fused, the second rounded) so the rounding does not depend on the
 * compiler's contraction setting (-ffp-contract): every kernel that rotates
 * calls these and gets the same bits. */
static inline float mt_cpu_rot_lo(float a, float b, float c, float s) { return fmaf(a, c, -(b * s)); }
static inline float mt_cpu_rot_hi(float a, float b, float c, float s) { return fmaf(b, c, a * s); }

/* 1 when the CPU has AVX-512 F/BW/DQ/VL and MT_NO_AVX512 is unset (ops_cpu.c) */
int mt_cpu_have_avx512(void);

/* ---- memory / elementwise (elementwise.c) ---- */
void   mt_cpu_fill(float *x, float value, size_t n);
void   mt_cpu_axpby(float *y, const float *x, float a, float b, size_t n);
double mt_cpu_sumsq(const float *x, size_t n);
int    mt_cpu_all_finite(const float *x, size_t n);
void   mt_cpu_transpose(float *out, const float *in, int rows, int cols);

/* ---- gemm.c ---- */
void mt_cpu_gemm(int transA, int transB, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc);
/* bf16 mode: operands rounded to bf16 into fp32 scratch, then sgemm */
void mt_cpu_gemm_bf16(int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                      int lda, const void *B, enum mt_elem b_type, int ldb, float beta, float *C, int ldc);
void mt_cpu_gemm_bf16_out(int transA, int transB, int M, int N, int K, float alpha, const void *A, enum mt_elem a_type,
                          int lda, const void *B, enum mt_elem b_type, int ldb, uint16_t *C, int ldc);
void mt_cpu_gemm_bf16_resid(int transA, int transB, int M, int N, int K, float alpha, const void *A,
                            enum mt_elem a_type, int lda, const void *B, enum mt_elem b_type, int ldb, const float *R,
                            float *C, int ldc);
void mt_cpu_cast_bf16(uint16_t *dst, const float *src, size_t n);
void mt_cpu_gemm_bf16_batched(int transA, int transB, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                              size_t stride_a, const uint16_t *B, int ldb, size_t stride_b, float beta,
                              const uint16_t *C, uint16_t *D, int ldd, size_t stride_d, int count);
void mt_cpu_cast_bf16_rows(uint16_t *dst, size_t ld, const float *src, size_t rows, size_t cols);
uint16_t mt_cpu_f32_to_bf16(float f);   /* round to nearest even; NaN -> 0x7fff (= cuda's mt_cuda_bf16_rn) */
float    mt_cpu_bf16_to_f32(uint16_t h);

/* ---- embed.c ---- */
void mt_cpu_embed_forward(float *out, const int32_t *idx, const float *wte, int N, int C);
void mt_cpu_embed_backward(float *dwte, const float *dout, const int32_t *idx, int N, int C, int V);

/* ---- rmsnorm.c ---- */
void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps);
void mt_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C, int accumulate);
/* the same with dout as bf16 (dout_b non-NULL: dout ignored), read widened */
void mt_cpu_rmsnorm_backward_b(float *dinp, float *dweight, const float *dout, const uint16_t *dout_b,
                               const float *inp, const float *weight, const float *rstd, int N, int C,
                               int accumulate);

/* ---- rope.c ---- */
void mt_cpu_rope_forward(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                         int N, int T, int pos0, int nh, int hd);
void mt_cpu_rope_backward(float *dinp, const float *dout, const float *cos_tab, const float *sin_tab,
                          int N, int T, int pos0, int nh, int hd);

/* ---- attention_bf16.c: precision=bf16's reference (mt_ops.h attention_*_bf16) ---- */
void mt_cpu_attention_forward_bf16(float *out, uint16_t *out_bf16, float *lse, const float *q, const float *k,
                                   const float *v, int B, int T, int H, int K, int hd, const uint16_t *qkv_b);
void mt_cpu_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse,
                                    int B, int T, int H, int K, int hd, const uint16_t *qkv_b, const uint16_t *dout_b,
                                    const uint16_t *out_b);
/* ---- attention.c ---- */
void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              int B, int Tq, int Tk, int q_pos0, int H, int K, int hd);
void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse,
                               int B, int T, int H, int K, int hd);

/* ---- swiglu.c ---- */
/* Mixture-of-Depths routing (mt_ops.h mod_route, mod_backward; mod.c) */
void mt_cpu_mod_route(int32_t *idx, int32_t *tpos, int32_t *slot, float *s, double *loss, const float *r, int B,
                      int T, int C, float coef);
void mt_cpu_mod_backward(float *dr, float *dx, const float *dgate, const float *s, const int32_t *slot, int N, int D,
                         float aux_scale);
/* ReDo: acc[j] += sum_i q(|act[i*F+j]|), the fixed point of mt_ops.h (redo_score_acc) */
void mt_cpu_redo_score_acc(int64_t *acc, const float *act, size_t rows, int F);
void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* out (may be NULL: not written) and out_bf16 = bf16(out): mt_cpu_swiglu_forward's bits, rounded */
void mt_cpu_swiglu_forward_bf16(float *out, uint16_t *out_bf16, const float *gate, const float *up, size_t n);
void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);
/* dgate_b, dup_b = bf16(dg), bf16(du): mt_cpu_swiglu_backward's bits, rounded (no fp32 output) */
void mt_cpu_swiglu_backward_bf16(uint16_t *dgate_b, uint16_t *dup_b, const float *dout, const float *gate,
                                 const float *up, size_t n);
/* act_b = mt_cpu_swiglu_forward_bf16's twin, dgate_b, dup_b = mt_cpu_swiglu_backward_bf16's: one pass */
void mt_cpu_swiglu_backward_act_bf16(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout,
                                     const float *gate, const float *up, size_t n);
void mt_cpu_swiglu_forward_bf16_gu(uint16_t *out_bf16, const uint16_t *gate, const uint16_t *up, size_t n);
void mt_cpu_swiglu_backward_act_bf16_gu(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const float *dout,
                                        const uint16_t *gate, const uint16_t *up, size_t n);
void mt_cpu_swiglu_backward_act_bf16_gud(uint16_t *act_b, uint16_t *dgate_b, uint16_t *dup_b, const uint16_t *dout,
                                         const uint16_t *gate, const uint16_t *up, size_t n, size_t F,
                                         size_t ldo);

/* ---- xent.c ---- */
void mt_cpu_xent_forward(float *losses, float *lse_out, const float *logits, const int32_t *targets,
                         int N, int V, float softcap);
void mt_cpu_xent_backward(float *dlogits, const float *logits, const float *lse,
                          const int32_t *targets, float dscale, int N, int V, float softcap);
void mt_cpu_xent_fused(float *losses, float *lse_out, float *logits, const int32_t *targets, float dscale,
                       int N, int V, float softcap);
/* the same, plus dlogits_bf16 = bf16(dlogits) from the row's last pass (xent_fused_bf16) */
void mt_cpu_xent_fused_bf16_logits(float *losses, float *lse_out, uint16_t *logits_b, const int32_t *targets,
                                   float dscale, int N, int V, float softcap);
void mt_cpu_xent_fused_bf16(float *losses, float *lse_out, float *logits, uint16_t *dlogits_bf16,
                            const int32_t *targets, float dscale, int N, int V, float softcap);

/* ---- fused.c (fused elementwise chains) ---- */
void mt_cpu_rms_rows_forward(float *out, uint16_t *ob, float *rstd, float *resid, const float *inp,
                             const float *weight, int N, int C, float eps);
void mt_cpu_rmsnorm_resid_forward(float *out, float *rstd, float *resid, const float *inp, const float *weight,
                                  int N, int C, float eps);
void mt_cpu_qk_norm_rope_forward(float *q, float *k, float *rstd_q, float *rstd_k, const float *q_raw,
                                 const float *k_raw, const float *wq, const float *wk, const float *cos_tab,
                                 const float *sin_tab, int N, int T, int pos0, int H, int K, int hd, float eps);
void mt_cpu_qk_norm_rope_backward(float *dq_raw, float *dk_raw, float *dwq, float *dwk, float *dq,
                                  float *dk, const float *q_raw, const float *k_raw, const float *wq,
                                  const float *wk, const float *rstd_q, const float *rstd_k, const float *cos_tab,
                                  const float *sin_tab, int N, int T, int H, int K, int hd);

/* ---- moe.c ---- */
void mt_cpu_router_forward(float *probs, float *lse, int32_t *topk_idx, float *gates,
                           const float *logits, int N, int E, int k);
void mt_cpu_router_backward(float *dlogits, const float *dgates, const float *dprobs,
                            const float *dlse, const float *probs, const int32_t *topk_idx,
                            const float *gates, int N, int E, int k);
void mt_cpu_moe_permute(float *xp, const float *h, const int32_t *src_row, int M, int C);
void mt_cpu_moe_permute_backward(float *dh, const float *dxp, const int32_t *pos, int N, int k, int C, int accumulate);
void mt_cpu_moe_combine(float *out, const float *y, const int32_t *pos, const float *gates,
                        int N, int k, int C);
void mt_cpu_moe_combine_backward(float *dy, float *dgates, const float *dout, const float *y,
                                 const int32_t *pos, const float *gates, int N, int k, int C);
/* MoE device routing (mt_ops.h) */
void mt_cpu_moe_permute_bf16(uint16_t *xb, const float *h, const int32_t *src_row, int M, int C);
void mt_cpu_moe_combine_backward_bf16(uint16_t *dyb, float *dgates, const float *dout, const float *y,
                                      const int32_t *pos, const float *gates, int N, int k, int C);
void mt_cpu_moe_route(int32_t *pos, int32_t *src_row, int32_t *e_off, int32_t *work, const int32_t *topk_idx, int N,
                      int k, int E, int n_null);
void mt_cpu_moe_seq_stats(double *seq, const float *probs, const int32_t *topk_idx, int N, int E, int k, int B, int T,
                          int g0);
void mt_cpu_moe_aux_loss(double *loss, float *f_share, const double *seq, const float *lse, int N, int B, int E, int k,
                         int T, float aux_coef, float z_coef, int count_aux);
void mt_cpu_moe_aux_backward(float *dprobs, float *dlse, const float *f_share, const float *lse, int N, int E, int T,
                             int g0, float aux_coef, float z_coef, double n_seq, double n_tok);

/* ---- optim_kernels.c ---- */
void mt_cpu_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                         float lr, float b1, float b2, float eps, float wd, float bc1, float bc2);
/* the same with g read as gs * g (adamw_multi's gscale; gs = 1: adamw_update's bits) and, when
 * pb != NULL, pb = mt_cpu_cast_bf16 of the updated p (adamw_multi's shadow; NULL: not written) */
void mt_cpu_adamw_update_gs(float *p, uint16_t *pb, const float *g, float gs, float *m, float *v, size_t n,
                            float lr, float b1, float b2, float eps, float wd, float bc1, float bc2);
void mt_cpu_muon_momentum(float *d, float *m, const float *g, float mu, size_t n, float gscale);

/* ssm.c — Mamba-3 scan (mt_ops.h ssm_scan_*) */
void mt_cpu_ssm_scan_forward(float *y, const float *x, const float *Bm, const float *Cm,
                             const float *dt, const float *lam, const float *A, const float *Dsk,
                             int B, int T, int H, int P, int N, int chunk);
void mt_cpu_ssm_scan_backward(float *dx, float *dBm, float *dCm, float *ddt, float *dlam,
                              float *dA, float *dDsk, const float *dy, const float *x,
                              const float *Bm, const float *Cm, const float *dt, const float *lam,
                              const float *A, const float *Dsk, int B, int T, int H, int P, int N,
                              int chunk);
/* ssm_glue.c — the mixer's stages around the scan (mt_ops.h ssm_prep_*, ssm_gate_norm_*) */
void mt_cpu_ssm_scan_step(float *y, float *S, float *xprev, float *Bprev, const float *x,
                         const float *Bm, const float *Cm, const float *dt, const float *lam,
                         const float *A, const float *Dsk, int B, int H, int P, int N, int first);
void mt_cpu_ssm_prep_forward(float *x, float *Bh, float *Ch, float *dt, float *lam, float *A,
                             float *rstd, float *ang_state, const float *proj, const float *dt_bias, const float *A_log,
                             const float *gB, const float *gC, const float *B_bias, const float *C_bias,
                             int B, int T, int H, int P, int G, int N, float eps, float *ang_out);
void mt_cpu_ssm_prep_backward(float *dproj, float *ddt_bias, float *dA_log, float *dgB, float *dgC,
                              float *dB_bias, float *dC_bias, const float *dx, const float *dBh,
                              const float *dCh, const float *ddt, const float *dlam, const float *dA,
                              const float *B_bias, const float *C_bias, const float *lam, const float *A,
                              const float *rstd, const float *proj, const float *dt_bias,
                              const float *gB, const float *gC, int B, int T, int H, int P, int G,
                              int N, float eps, const float *ang);
/* ... and out_b = bf16(out) (NULL: none); out NULL: not stored */
void mt_cpu_ssm_gate_norm_forward_bf16(float *out, uint16_t *out_b, float *rstd, const float *y, const float *z,
                                       int ldz, const float *w, int n, int E, int G, float eps);
void mt_cpu_ssm_gate_norm_forward(float *out, float *rstd, const float *y, const float *z, int ldz,
                                  const float *w, int n, int E, int G, float eps);
void mt_cpu_ssm_gate_norm_backward(float *dy, float *dz, float *dw, const float *dout, const float *y,
                                   const float *z, int ldz, const float *w, const float *rstd,
                                   int n, int E, int G);
void mt_cpu_ssm_gate_norm_sums(float *s, int lds, const float *y, const float *z, int ldz, const float *w,
                               const float *dout, const float *rstd, int n, int E, int c0, int cg);
void mt_cpu_ssm_gate_norm_forward_ext(float *out, float *rstd, const float *y, const float *z, int ldz,
                                      const float *w, const float *s, int lds, int n, int E, int c0, int cg,
                                      float eps);
void mt_cpu_ssm_gate_norm_backward_ext(float *dy, float *dz, float *dw, const float *dout, const float *y,
                                       const float *z, int ldz, const float *w, const float *rstd, const float *s,
                                       int lds, int n, int E, int c0, int cg);

#endif /* MT_CPU_IMPL_H */
