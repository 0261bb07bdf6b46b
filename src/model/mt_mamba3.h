/*
 * mt_mamba3.h — the Mamba-3 SISO mixer (SPEC §1c, docs/mamba3.md) as a
 * standalone layer: forward and backward against the ops table, with its own
 * narrow context (dims, weights, saved activations). The model's `M` block
 * (src/model/mamba.c) wraps it; with LoRA it runs the stages below.
 *
 * Shapes (docs/glossary.md letters, plus the mixer's): n = B*T rows, D model
 * dim, E = H*P inner dim (H heads of headdim P), G groups, N state (even),
 * W = 2E + 2GN + H + H*N/2 + H the in-projection width.
 */
#ifndef MT_MAMBA3_H
#define MT_MAMBA3_H

#include <stddef.h>
#include "../ops/mt_ops.h"

struct mt_mamba3_dims {
    int D, H, P, G, N;  /* model dim, heads, headdim, groups (H % G == 0), state (even) */
    int chunk;          /* scan chunk (speed only); 0 = the plain recurrence (forward only) */
    float eps_bc;       /* B/C norm eps (1e-5) */
    float eps_out;      /* gated output norm eps (1e-5) */
    int scan_bf16;      /* precision=bf16: the scan through ssm_scan_*_bf16 where the
                           backend has both (the cpu has none: fp32 scan) */
};

/* Parameters (and, with the same layout, their gradients). */
struct mt_mamba3_weights {
    float *win;              /* (W, D) in-projection; NULL: given by parts below */
    /* the in-projection as its seven row blocks z (E), xs (E), B (GN), C (GN),
     * dt (H), theta (H N/2), lam (H), each (rows, D); read when win == NULL
     * (the model's registry holds them as separate tensors so that the model
     * axis can cut each by heads / groups) */
    float *win_part[7];
    float *wout;             /* (D, E) out-projection                */
    float *dt_bias, *A_log;  /* (H)                                  */
    float *Dsk;              /* (H) skip D                           */
    float *gB, *gC;          /* (N) B/C norm gains, shared by groups */
    float *B_bias, *C_bias;  /* (H, N)                               */
    float *g_out;            /* (E) gated norm gain                  */
};

/* Saved activations of one forward (backend memory). */
struct mt_mamba3_acts {
    float *proj;     /* (n, W) in-projection output (z, theta, raw B/C... read by backward) */
    float *x;        /* (n, H, P) */
    float *Bh, *Ch;  /* (n, H, N) normed, biased, rotated */
    float *dt, *lam; /* (n, H) */
    float *A;        /* (H) */
    float *rstd_bc;  /* (n, 2G) */
    float *ys;       /* (n, E) scan output (with the D skip) */
    float *rstd_o;   /* (n, G) */
    float *yn;       /* (n, E) gated norm output (input of Wout) */
    float *states;   /* the bf16 scan's chunk states kept for its backward
                        (mt_ssm_states_floats; NULL: recomputed there). Not
                        part of mt_mamba3_acts_floats: the owner carves them */
    mt_bf16 *Bh_b, *Ch_b; /* (n, H, N) Bh, Ch's bf16 twins, the bf16 scan's
                        operands where its products run (ssm_prep_forward's
                        Bh_b, Ch_b), or NULL; set by the owner, as states (in
                        Ch's memory: those shapes never use the fp32 Ch) */
    mt_bf16 *ys_b;   /* NULL, or ys stored as bf16 only, in ys's memory (the
                        owner sets it before ssm_forward where
                        mt_mamba3_ys_bf16_ok and both gated-norm passes take
                        the bf16 entries; mix_forward clears it) */
    mt_bf16 *z_b;    /* NULL, or z (proj's first E columns) stored as bf16
                        only, rows 2 W bf16 apart in proj's own memory (row r
                        at (mt_bf16 *)proj + 2 W r, in its fp32 z columns): the
                        in-projection's bf16 output of its z block, read by
                        both bf16 gated-norm passes (their zin_b); set by the
                        owner with ys_b (the same path), cleared with it */
    mt_bf16 *x_b;    /* NULL, or x (proj's next E columns) stored as bf16 only,
                        beside z: z_b + E, rows 2 W bf16 apart (the in-projection
                        writes z | x as one bf16 block); the scan's x (its x_b,
                        ldx_b 2 W: every read widens it). Set and cleared with
                        z_b */
};

/* Backward scratch (backend memory). */
struct mt_mamba3_scratch {
    float *dproj;      /* (n, W) */
    float *dyn, *dys;  /* (n, E) */
    float *dx;         /* (n, H, P) */
    float *dBh, *dCh;  /* (n, H, N) */
    float *ddt, *dlam; /* (n, H) */
    float *dA;         /* (H) */
    float *sink;       /* LoRA (frozen mixer): where the SSM kernels put the frozen vectors'
                        * gradients, which they compute alongside dx; not in
                        * mt_mamba3_scratch_floats (mamba.c carves it, LoRA only) */
    mt_bf16 *dyn_b;    /* NULL, or dyn stored bf16 only, in dyn's memory (the
                        * out-projection's backward GEMM with a bf16 output): set
                        * by the owner for mt_mamba3_mix_backward_b's bf16 gated
                        * norm, which reads it widened; the fp32 paths assert NULL */
};

int    mt_mamba3_in_width(const struct mt_mamba3_dims *d);
size_t mt_mamba3_weights_floats(const struct mt_mamba3_dims *d);
size_t mt_mamba3_acts_floats(const struct mt_mamba3_dims *d, int n);
size_t mt_mamba3_scratch_floats(const struct mt_mamba3_dims *d, int n);
/* Carve the structs out of one buffer of the size above. */
void mt_mamba3_weights_bind(struct mt_mamba3_weights *w, float *base, const struct mt_mamba3_dims *d);
void mt_mamba3_acts_bind(struct mt_mamba3_acts *a, float *base, const struct mt_mamba3_dims *d, int n);
void mt_mamba3_scratch_bind(struct mt_mamba3_scratch *s, float *base, const struct mt_mamba3_dims *d, int n);

/* out (n, D) = mixer(h (n, D)); saves acts. */
void mt_mamba3_forward(const struct mt_ops_i *ops, float *out, struct mt_mamba3_acts *a, const float *h,
                       const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int B, int T);
/* dh (n, D) = (accumulate 0) or += (accumulate 1); every parameter gradient +=. */
void mt_mamba3_backward(const struct mt_ops_i *ops, float *dh, int accumulate, struct mt_mamba3_weights *g,
                        struct mt_mamba3_scratch *s, const float *dout, const float *h,
                        const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                        const struct mt_mamba3_dims *d, int B, int T);

/* The same forward / backward in stages, for a caller that adds to the
 * projections (the model's LoRA adapters, src/model/mamba.c):
 *   forward  = in_forward (proj = h Win^T) + mix_forward (proj -> yn) + out = yn Wout^T
 *   backward = dWout += dout^T yn, dyn = dout Wout (into s->dyn)
 *              + mix_backward (s->dyn -> s->dproj; mixer gradients +=)
 *              + in_backward (dWin += dproj^T h, skipped for a NULL g->win_part[b];
 *                dh =/+= dproj Win)
 * mt_mamba3_forward / _backward are exactly these calls in this order.
 * mix_forward = ssm_forward (prep + scan: proj -> ys) + the gated norm (ys -> yn);
 * mix_backward = the gated norm's backward (s->dyn -> s->dys, dproj's z
 * columns) + ssm_backward (scan + prep backward: the rest of s->dproj), for a
 * caller whose gated norm spans ranks (mamba.c, replicated B/C under TP). */
void mt_mamba3_in_forward(const struct mt_ops_i *ops, float *proj, const float *h, const struct mt_mamba3_weights *w,
                          const struct mt_mamba3_dims *d, int n);
void mt_mamba3_mix_forward(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                           const struct mt_mamba3_dims *d, int B, int T);
void mt_mamba3_mix_backward(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                            const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                            const struct mt_mamba3_dims *d, int B, int T);
/* mix_backward with dproj written as bf16 into dproj_b (n, W) by its producers
 * where the backend and shape allow (returns 1: s->dproj is then scratch);
 * else mix_backward itself (returns 0: s->dproj holds dproj) */
int mt_mamba3_mix_backward_b(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                             const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                             const struct mt_mamba3_dims *d, int B, int T, mt_bf16 *dproj_b);
void mt_mamba3_ssm_forward(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                           const struct mt_mamba3_dims *d, int B, int T);
/* 1 where the scan may store ys as bf16 only (acts ys_b): its products run on tensor
 * cores (the bf16 scan's y_b) and the backend has the bf16 gated norm both ways and
 * the bf16 prep backward (mt_mamba3_mix_backward_b's path, given its dproj_b room) */
int mt_mamba3_ys_bf16_ok(const struct mt_ops_i *ops, const struct mt_mamba3_dims *d, int B, int T);
void mt_mamba3_ssm_backward(const struct mt_ops_i *ops, struct mt_mamba3_weights *g, struct mt_mamba3_scratch *s,
                            const struct mt_mamba3_acts *a, const struct mt_mamba3_weights *w,
                            const struct mt_mamba3_dims *d, int B, int T);
void mt_mamba3_in_backward(const struct mt_ops_i *ops, float *dh, int accumulate, struct mt_mamba3_weights *g,
                           const float *dproj, const float *h, const struct mt_mamba3_weights *w,
                           const struct mt_mamba3_dims *d, int n);

/* Decoding (one sequence): the recurrent state of one layer, floats: the
 * scan state S (H, P, N), the previous token's x (H, P) and B (H, N) (the
 * trapezoid's beta term) and the carried rotary angles (H, N/2). Zero = the
 * state before the first token. */
size_t mt_mamba3_state_floats(const struct mt_mamba3_dims *d);
/* out (T, D) = mixer(h (T, D)) for T new tokens at positions pos0.. of one
 * sequence, continuing `state` (updated in place): the same math as the
 * forward over the whole prefix, O(1) work per token in the prefix length
 * (ssm_scan_step + the carried angles). a: scratch of at least T rows. */
void mt_mamba3_decode(const struct mt_ops_i *ops, float *out, struct mt_mamba3_acts *a, float *state,
                      const float *h, const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int T,
                      int pos0);

/* mt_mamba3_decode's middle: a->proj (T, W) given, a->yn (T, E) out (the
 * caller runs the projections: in_forward before, yn Wout^T after). */
void mt_mamba3_decode_mix(const struct mt_ops_i *ops, struct mt_mamba3_acts *a, float *state,
                          const struct mt_mamba3_weights *w, const struct mt_mamba3_dims *d, int T, int pos0);

#endif /* MT_MAMBA3_H */
