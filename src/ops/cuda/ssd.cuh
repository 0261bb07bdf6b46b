/*
 * ssd.cuh — what the chunked (SSD) Mamba-3 scan's two files share: ssm.cu
 * (the fp32 kernels, the passes between chunks, the orchestration) and
 * ssd_tc.cu (the intra-chunk products on tensor cores, precision=bf16).
 * The chunk's notation (sources j, weights w_j, cum) is ssm.cu's "HOW IT
 * WORKS"; the math is docs/mamba3.md.
 */
#ifndef MT_SSD_CUH
#define MT_SSD_CUH

#include "cuda_impl.cuh"

#define SSD_QMAX 256                  /* chunks above this run as 256 (same result to rounding) */
#define SSD_TC_QMAX 128               /* ssd_tc.cu: chunk, headdim and d_state up to this */
#define SSD_TC_STRIPS(Q) ((((Q) + 63) / 64) * 4)   /* ssd_tc.cu's 16-row strips a chunk: 4 warps a 64-row tile */
#define SSD_AL4(n) (((n) + 3) & ~3)   /* floats, rounded up to 16 bytes (float4 reads) */

struct ssd_dims {
    int B, T, H, P, N, Q, nc;
    int xs;   /* row stride of x and dx (floats): H P, or more where they live in the
               * mixer's proj rows (the bf16 entries' ldx; the tensor-core path only) */
    int xsb;  /* row stride of x stored bf16 (ssd_twins X; elements): the entries' ldx_b */
};

static inline struct ssd_dims ssd_dims_make(int B, int T, int H, int P, int N, int chunk)
{
    struct ssd_dims d = {B, T, H, P, N, 0, 0, H * P, H * P};
    d.Q = chunk < T ? chunk : T;
    if (d.Q > SSD_QMAX) d.Q = SSD_QMAX;
    d.nc = (T + d.Q - 1) / d.Q;
    return d;
}

/* weight of source j of a chunk at time t: gamma_t (own) or beta_t (0 at t = 0) */
static __device__ __forceinline__ float ssd_w(int own, const float *dt, const float *lam, float Ah, size_t r, int t)
{
    float d = dt[r], l = lam[r];
    return own ? l * d : (t > 0 ? (1.0f - l) * d * expf(d * Ah) : 0.0f);
}

/* ssd_tc.cu: B and C's bf16 twins (the prep's bf16(Bm), bf16(Cm), (B, T, H, N)
 * as Bm, Cm), or NULL: read where a product stages Bm or Cm as its operand
 * (the same values, half the bytes), the fp32 arrays where a term stays fp32 */
struct ssd_twins {
    const __nv_bfloat16 *B, *C;
    const __nv_bfloat16 *Y;   /* dy's (the backward): NULL, or bf16(dy) exactly */
    /* x as stored where the in-projection writes it bf16 (the tensor-core path only):
     * NULL, or x itself (rows d.xsb apart; the fp32 x is then NULL): every read of x,
     * the products' staging and the fp32 terms (D x, dD's dy . x) alike, widens it */
    const __nv_bfloat16 *X;
};

/* ssd_tc.cu: the shapes it runs (chunk Q, P, N each <= SSD_TC_QMAX) */
int ssd_tc_supports(struct ssd_dims d);
/* forward step 2 (ssd_state_k's contract: each full chunk's own state, B
 * from tw.B where given, Bm then may be NULL) and backward step 5
 * (ssd_dloc_k's) on tensor cores */
void ssd_tc_state(float *Sst, const float *cum, const float *x, const float *Bm, const float *dt, const float *lam,
                  const float *A, struct ssd_twins tw, struct ssd_dims d);
void ssd_tc_dloc(float *dSo, const float *cum, const float *dy, const float *Cm, struct ssd_twins tw,
                 struct ssd_dims d);
/* forward step 4 (ssd_out_k's contract) on tensor cores; y_b: y stored as bf16 only there */
void ssd_tc_out(float *y, __nv_bfloat16 *y_b, const __nv_bfloat16 *Sst, const float *cum, const float *x,
                const float *Bm, const float *Cm, const float *dt, const float *lam, const float *A, const float *Dsk,
                struct ssd_twins tw, struct ssd_dims d);
/* backward steps 7-8 and 10 (ssd_gm_k, ssd_dxc_k, ssd_dbc_k, ssd_dc_k's
 * contracts, then ssd_scatter_k's: dx and dBm written as token rows, D dy in
 * dx) on tensor cores; M and dG are stored as bf16 (B H nc, Q, 2Q) in their
 * float slots (only these kernels read them); dLE is not stored:
 * dcs gets its column sums per 16-row strip, (B H nc, SSD_TC_STRIPS(Q), 2Q),
 * for ssd_scal_k; edge_x (B H nc, P) and edge_B (B H nc, N) are scratch
 * (each chunk's source q). dxb non-NULL: dx is written there as bf16
 * (nearest even, of the fp32 value dx would hold; row stride d.xs) and not
 * to dx; last_x (B H nc, P) is then scratch too (the rows the next chunk's
 * source q joins, fp32 until ssd_tc_edge_k adds it). dBb, dCb likewise for dBm
 * (last_B (B H nc, N) its scratch) and dCm (no edge: written directly) */
void ssd_tc_backward_products(float *M, float *dG, float *dcs, float *rs, float *dx, __nv_bfloat16 *dxb,
                              float *last_x, float *dBm, __nv_bfloat16 *dBb, float *last_B, float *edge_x,
                              float *edge_B, float *qj, float *dCm, __nv_bfloat16 *dCb,
                              float *inter, const __nv_bfloat16 *Sst, const __nv_bfloat16 *dSo,
                              const float *cum, const float *dy, const float *x, const float *Bm, const float *Cm,
                              const float *dt, const float *lam, const float *A, const float *Dsk,
                              struct ssd_twins tw, struct ssd_dims d);

#endif /* MT_SSD_CUH */
