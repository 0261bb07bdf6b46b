/*
 * optim.c — AdamW + Muon (nanochat split), global-norm clipping, lr schedule.
 *
 * Exactly SPEC.md section 1b. Every parameter follows its own `param->optim`
 * (the model sets it; cfg->optimizer "adamw" makes the model mark every
 * parameter AdamW). All arithmetic on tensors goes through the ops table, so
 * the same code drives the cpu and cuda backends: Muon is GEMM-bound and its
 * Newton–Schulz iteration runs on ops->gemm.
 *
 * Invariant: state tensors have exactly their parameter's box (numel floats,
 * backend memory, bucket OPTIM) and start at zero; the NS workspace (bucket
 * WORKSPACE) is sized for the largest Muon matrix and holds nothing between
 * calls. `t` counts AdamW updates done (0 before the first; the update at
 * step() uses t+1, PyTorch's bias correction from 1).
 */
#include "mt_optim.h"

#include "../parallel/mt_comm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Quintic Newton–Schulz coefficients (Keller Jordan's Muon / nanochat). */
#define NS_A     3.4445f
#define NS_B    (-4.7750f)
#define NS_C     2.0315f
#define NS_STEPS 5

struct pstate {
    struct mt_param *p;
    float *m;   /* AdamW exp_avg or Muon momentum_buffer (numel) */
    float *v;   /* AdamW exp_avg_sq (numel); NULL for Muon       */
};

struct mt_optim {
    const struct mt_ops_i *ops;
    struct mt_config       cfg;
    struct pstate         *ps;      /* (n_params) */
    int                    n_params;
    int                    n_states;
    long                   t;
    /* Muon Newton–Schulz workspace: s = min(rows, cols), l = max(rows, cols) */
    float *ws_d;   /* (rows*cols) Nesterov direction d            */
    float *ws_x;   /* (s*l) iterate X                             */
    float *ws_y;   /* (s*l) next iterate                          */
    float *ws_a;   /* (s*s) A = X X^T                             */
    float *ws_b;   /* (s*s) B = b A + c A A                       */
    float *ws_g;   /* (rows*cols) TP: gathered slices (split Muon params only) */
    struct mt_comm *tp_comm; /* model group: a TP-split Muon matrix is gathered over it */
};

static int is_split(const struct mt_param *p) { return p->len[0] != p->shape[0] || p->len[1] != p->shape[1]; }

/* Workspace extents over every Muon matrix: largest numel and largest s*s. */
static int any_split_muon(const struct mt_param *params, int n_params)
{
    for (int i = 0; i < n_params; i++)
        if (params[i].optim == MT_OPTIM_MUON && is_split(&params[i])) return 1;
    return 0;
}

static void muon_ws_sizes(const struct mt_param *params, int n_params, size_t *max_numel, size_t *max_ss)
{
    *max_numel = 0;
    *max_ss = 0;
    for (int i = 0; i < n_params; i++) {
        const struct mt_param *p = &params[i];
        if (p->optim != MT_OPTIM_MUON) continue;
        size_t r = (size_t)p->shape[0], c = (size_t)p->shape[1];   /* Newton–Schulz runs on the FULL matrix */
        size_t s = r < c ? r : c;
        if (r * c > *max_numel) *max_numel = r * c;
        if (s * s > *max_ss) *max_ss = s * s;
    }
}

/* bytes[] is overwritten: OPTIM = AdamW 2 x numel + Muon 1 x numel floats;
 * WORKSPACE = 3 x max numel + 2 x max s^2 floats (0 without Muon params);
 * OTHER = the host bookkeeping (struct + per-param table). */
void mt_optim_plan_bytes(const struct mt_config *cfg, const struct mt_param *params, int n_params,
                         size_t bytes[MT_BUCKET_COUNT])
{
    (void)cfg;
    for (int b = 0; b < MT_BUCKET_COUNT; b++) bytes[b] = 0;
    for (int i = 0; i < n_params; i++) {
        size_t nb = params[i].numel * sizeof(float);
        if (params[i].frozen) continue;   /* LoRA base: no state */
        bytes[MT_BUCKET_OPTIM] += params[i].optim == MT_OPTIM_ADAMW ? 2 * nb : nb;
    }
    size_t max_numel, max_ss;
    muon_ws_sizes(params, n_params, &max_numel, &max_ss);
    if (max_numel > 0)
        bytes[MT_BUCKET_WORKSPACE] = ((3 + (size_t)any_split_muon(params, n_params)) * max_numel + 2 * max_ss) * sizeof(float);
    bytes[MT_BUCKET_OTHER] = sizeof(struct mt_optim) + (size_t)n_params * sizeof(struct pstate);
}

static float *ws_alloc(struct mt_ctx *ctx, const struct mt_ops_i *ops, size_t n, enum mt_bucket b)
{
    return ops->buf_alloc(ops->be, ctx, n * sizeof(float), b);
}

enum mt_status mt_optim_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                               struct mt_param *params, int n_params, struct mt_optim **out)
{
    *out = NULL;
    if (!ops || !cfg || (n_params > 0 && !params) || n_params < 0)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_optim_create: NULL ops/cfg/params");
    /* the update needs these kernels; report, never fall back */
    if (!ops->buf_alloc || !ops->buf_free || !ops->fill || !ops->axpby || !ops->sumsq || !ops->adamw_update)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks an AdamW kernel (axpby/sumsq/adamw_update)",
                            ops->name);
    for (int i = 0; i < n_params; i++) {
        const struct mt_param *p = &params[i];
        /* a frozen parameter (LoRA base) has no gradient buffer: no state, never stepped */
        if (!p->data || (!p->grad && !p->frozen))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: parameter %s has no data/grad buffer", p->name);
        if (p->optim != MT_OPTIM_MUON) continue;
        if (p->ndim != 2)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: Muon parameter %s is not 2-D", p->name);
        if (is_split(p) && !(p->split == MT_SPLIT_ROWS ? p->len[1] == p->shape[1] : p->len[0] == p->shape[0]))
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED,
                                "optimizer: Muon parameter %s holds a box %lldx%lld of %lldx%lld that is not a TP split",
                                p->name, (long long)p->len[0], (long long)p->len[1], (long long)p->shape[0],
                                (long long)p->shape[1]);
        if (!ops->gemm || !ops->muon_momentum || !ops->transpose || !ops->copy)
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks a Muon kernel (gemm/muon_momentum/transpose)",
                                ops->name);
    }

    struct mt_optim *o = mt_alloc(ctx, sizeof *o, MT_BUCKET_OTHER);
    if (!o) return MT_ERR_OOM;
    o->ops = ops;
    o->cfg = *cfg;
    o->n_params = n_params;
    o->ps = mt_alloc(ctx, (size_t)n_params * sizeof(struct pstate), MT_BUCKET_OTHER);
    if (!o->ps) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
    for (int i = 0; i < n_params; i++) {
        struct pstate *s = &o->ps[i];
        s->p = &params[i];
        s->m = s->v = NULL;
        if (params[i].frozen) continue;   /* LoRA base: no state, never updated */
        s->m = ws_alloc(ctx, ops, params[i].numel, MT_BUCKET_OPTIM);
        if (!s->m) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
        o->n_states++;
        if (params[i].optim == MT_OPTIM_ADAMW) {
            s->v = ws_alloc(ctx, ops, params[i].numel, MT_BUCKET_OPTIM);
            if (!s->v) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
            o->n_states++;
        }
    }
    size_t max_numel, max_ss;
    muon_ws_sizes(params, n_params, &max_numel, &max_ss);
    if (max_numel > 0) {
        o->ws_d = ws_alloc(ctx, ops, max_numel, MT_BUCKET_WORKSPACE);
        o->ws_x = o->ws_d ? ws_alloc(ctx, ops, max_numel, MT_BUCKET_WORKSPACE) : NULL;
        o->ws_y = o->ws_x ? ws_alloc(ctx, ops, max_numel, MT_BUCKET_WORKSPACE) : NULL;
        o->ws_a = o->ws_y ? ws_alloc(ctx, ops, max_ss, MT_BUCKET_WORKSPACE) : NULL;
        o->ws_b = o->ws_a ? ws_alloc(ctx, ops, max_ss, MT_BUCKET_WORKSPACE) : NULL;
        if (!o->ws_b) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
        if (any_split_muon(params, n_params)) {
            o->ws_g = ws_alloc(ctx, ops, max_numel, MT_BUCKET_WORKSPACE);
            if (!o->ws_g) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
        }
    }
    *out = o;
    return MT_OK;
}

void mt_optim_destroy(struct mt_ctx *ctx, struct mt_optim *o)
{
    if (!o) return;
    const struct mt_ops_i *ops = o->ops;
    if (o->ps) {
        for (int i = 0; i < o->n_params; i++) {
            if (o->ps[i].m) ops->buf_free(ops->be, ctx, o->ps[i].m);
            if (o->ps[i].v) ops->buf_free(ops->be, ctx, o->ps[i].v);
        }
        mt_free(ctx, o->ps);
    }
    float *ws[6] = {o->ws_d, o->ws_x, o->ws_y, o->ws_a, o->ws_b, o->ws_g};
    for (int i = 0; i < 6; i++)
        if (ws[i]) ops->buf_free(ops->be, ctx, ws[i]);
    mt_free(ctx, o);
}

/*
 * Schedule factor, step s from 0, W = warmup_steps, S = total_steps, m = min_lr_frac:
 *   s < W:  (s+1)/W
 *   else    progress = (s-W)/max(1, S-W), clamped to [0,1] (steps past S hold
 *           the final value instead of climbing back up the cosine)
 *           cosine: m + (1-m)(1+cos(pi progress))/2; linear: 1-(1-m) progress; constant: 1
 */
double mt_optim_lr_factor(const struct mt_config *cfg, int step)
{
    int W = cfg->warmup_steps > 0 ? cfg->warmup_steps : 0;
    if (step < W) return (double)(step + 1) / (double)W;
    if (!strcmp(cfg->lr_schedule, "constant")) return 1.0;
    double m = cfg->min_lr_frac;
    int span = cfg->total_steps - W;
    double progress = (double)(step - W) / (double)(span > 1 ? span : 1);
    if (progress < 0) progress = 0;
    if (progress > 1) progress = 1;
    if (!strcmp(cfg->lr_schedule, "linear")) return 1.0 - (1.0 - m) * progress;
    return m + (1.0 - m) * (1.0 + cos(3.14159265358979323846 * progress)) / 2.0;   /* cosine (default) */
}

double mt_optim_grad_sumsq(struct mt_optim *o)
{
    double s = 0.0;
    for (int i = 0; i < o->n_params; i++)
        if (!o->ps[i].p->frozen) s += o->ops->sumsq(o->ops->be, o->ps[i].p->grad, o->ps[i].p->numel);
    return s;
}

/*
 * Muon on one matrix P (R, C) with gradient G, momentum M, lr, wd:
 *   M = mu M + G;  D = G + mu M                       (ops->muon_momentum)
 *   X = D, or D^T if R > C, so X is (s, l), s <= l
 *   X = X / (||X||_F + 1e-7)
 *   5 x:  A = X X^T (s,s);  B = b A + c A A;  X = a X + B X
 *   X back to (R, C);  P = P (1 - lr wd) - lr sqrt(max(1, R/C)) X
 */
static enum mt_status muon_update(struct mt_ctx *ctx, struct mt_optim *o, struct pstate *st, float lr, float wd)
{
    const struct mt_ops_i *ops = o->ops;
    struct mt_param *p = st->p;
    const int R = (int)p->shape[0], C = (int)p->shape[1];   /* the FULL matrix */
    const size_t n = (size_t)R * (size_t)C, nl = p->numel;
    const int split = is_split(p);
    const int tr = R > C;
    const int s = tr ? C : R, l = tr ? R : C;

    if (!split) {
        ops->muon_momentum(ops->be, o->ws_d, st->m, p->grad, o->cfg.muon_momentum, n);
    } else {
        /* TP: the momentum stays sharded (elementwise); the direction is
         * gathered over the model group so that every model rank runs
         * Newton–Schulz on the same full matrix and keeps its own slice */
        if (!o->tp_comm || mt_comm_size(o->tp_comm) * nl != n)
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "optimizer: %s is TP-split but no matching model group is set",
                                p->name);
        int tp = mt_comm_size(o->tp_comm);
        ops->muon_momentum(ops->be, o->ws_g, st->m, p->grad, o->cfg.muon_momentum, nl);
        if (p->split == MT_SPLIT_ROWS) {
            MT_CHECK(mt_comm_allgather(ctx, o->tp_comm, o->ws_d, o->ws_g, nl, MT_DTYPE_F32));
        } else {
            /* column blocks (R, C/tp) of rank r land at columns [r*C/tp, ...) of every row */
            const int Cl = (int)p->len[1];
            MT_CHECK(mt_comm_allgather(ctx, o->tp_comm, o->ws_y, o->ws_g, nl, MT_DTYPE_F32));
            for (int r = 0; r < tp; r++)
                for (int i = 0; i < R; i++)
                    ops->copy(ops->be, o->ws_d + (size_t)i * C + (size_t)r * Cl, o->ws_y + ((size_t)r * R + i) * Cl,
                              (size_t)Cl * sizeof(float));
        }
    }
    float *x = o->ws_x, *y = o->ws_y, *a = o->ws_a, *b = o->ws_b;
    if (tr) ops->transpose(ops->be, x, o->ws_d, R, C);
    else    ops->copy(ops->be, x, o->ws_d, n * sizeof(float));
    if (ops->normalize_fro) {
        ops->normalize_fro(ops->be, x, n, 1e-7);   /* the same numbers, the norm kept on the device */
    } else {
        double nrm = sqrt(ops->sumsq(ops->be, x, n));
        ops->axpby(ops->be, x, NULL, 0.0f, (float)(1.0 / (nrm + 1e-7)), n);
    }
    for (int it = 0; it < NS_STEPS; it++) {
        ops->gemm(ops->be, 0, 1, s, s, l, 1.0f, x, l, x, l, 0.0f, a, s);      /* A = X X^T       */
        ops->gemm(ops->be, 0, 0, s, s, s, NS_C, a, s, a, s, 0.0f, b, s);     /* B = c A A       */
        ops->axpby(ops->be, b, a, NS_B, 1.0f, (size_t)s * (size_t)s);        /* B += b A        */
        ops->copy(ops->be, y, x, n * sizeof(float));
        ops->gemm(ops->be, 0, 0, s, l, s, 1.0f, b, s, x, l, NS_A, y, l);     /* Y = a X + B X   */
        float *t = x; x = y; y = t;
    }
    float *upd = x;
    if (tr) { ops->transpose(ops->be, o->ws_d, x, C, R); upd = o->ws_d; }
    double scale = sqrt(R > C ? (double)R / (double)C : 1.0);
    if (split) {
        /* this rank's box of the full update */
        if (p->split == MT_SPLIT_ROWS) {
            upd += (size_t)p->off[0] * (size_t)C;
        } else {
            const int Cl = (int)p->len[1];
            for (int i = 0; i < R; i++)
                ops->copy(ops->be, o->ws_g + (size_t)i * Cl, upd + (size_t)i * C + (size_t)p->off[1], (size_t)Cl * sizeof(float));
            upd = o->ws_g;
        }
    }
    ops->axpby(ops->be, p->data, upd, (float)(-(double)lr * scale), 1.0f - lr * wd, nl);
    return MT_OK;
}

void mt_optim_set_tp_comm(struct mt_optim *o, struct mt_comm *tp_comm) { o->tp_comm = tp_comm; }

/* a list of AdamW tensors for one adamw_multi call (host arrays, on the stack) */
struct adamw_batch {
    float       *p[MT_OPS_LIST_MAX], *m[MT_OPS_LIST_MAX], *v[MT_OPS_LIST_MAX];
    const float *g[MT_OPS_LIST_MAX];
    size_t       n[MT_OPS_LIST_MAX];
    float        wd[MT_OPS_LIST_MAX];
    int          count;
};

static void adamw_flush(struct mt_optim *o, struct adamw_batch *ab, float lr, float bc1, float bc2)
{
    const struct mt_config *cfg = &o->cfg;
    if (ab->count == 0) return;
    o->ops->adamw_multi(o->ops->be, ab->p, ab->g, ab->m, ab->v, ab->n, ab->wd, ab->count, lr, cfg->adam_beta1,
                        cfg->adam_beta2, cfg->adam_eps, bc1, bc2);
    ab->count = 0;
}

enum mt_status mt_optim_step(struct mt_ctx *ctx, struct mt_optim *o, int step, double grad_norm)
{
    const struct mt_ops_i *ops = o->ops;
    const struct mt_config *cfg = &o->cfg;
    if (!(grad_norm == grad_norm) || isinf(grad_norm))
        return mt_ctx_error(ctx, MT_ERR_NUMERIC, "non-finite gradient norm %g at step %d", grad_norm, step);

    /* clip: g *= min(1, clip / (norm + 1e-6)), before both optimizers */
    if (cfg->grad_clip > 0) {
        double sc = cfg->grad_clip / (grad_norm + 1e-6);
        if (sc < 1.0)
            for (int i = 0; i < o->n_params; i++)
                if (!o->ps[i].p->frozen) ops->axpby(ops->be, o->ps[i].p->grad, NULL, 0.0f, (float)sc, o->ps[i].p->numel);
    }

    double f = mt_optim_lr_factor(cfg, step);
    float lr = (float)(cfg->lr * f), muon_lr = (float)(cfg->muon_lr * f);
    o->t++;
    double b1 = cfg->adam_beta1, b2 = cfg->adam_beta2;
    float bc1 = (float)(1.0 - pow(b1, (double)o->t));
    float bc2 = (float)(1.0 - pow(b2, (double)o->t));
    /* AdamW tensors go to adamw_multi in lists of MT_OPS_LIST_MAX (one launch
     * each on cuda); the updates are independent of each other and of Muon's,
     * so the order in which they run changes no bit */
    struct adamw_batch ab;
    ab.count = 0;
    for (int i = 0; i < o->n_params; i++) {
        struct pstate *st = &o->ps[i];
        struct mt_param *p = st->p;
        if (p->frozen) continue;   /* LoRA: the base does not move (docs/lora.md) */
        float wd = p->decay ? cfg->weight_decay : 0.0f;
        if (p->optim == MT_OPTIM_MUON) {
            MT_CHECK(muon_update(ctx, o, st, muon_lr, wd));
        } else if (ops->adamw_multi) {
            int c = ab.count++;
            ab.p[c] = p->data;
            ab.g[c] = p->grad;
            ab.m[c] = st->m;
            ab.v[c] = st->v;
            ab.n[c] = p->numel;
            ab.wd[c] = wd;
            if (ab.count == MT_OPS_LIST_MAX) adamw_flush(o, &ab, lr, bc1, bc2);
        } else {
            ops->adamw_update(ops->be, p->data, p->grad, st->m, st->v, p->numel, lr, cfg->adam_beta1, cfg->adam_beta2,
                              cfg->adam_eps, wd, bc1, bc2);
        }
    }
    adamw_flush(o, &ab, lr, bc1, bc2);
    return MT_OK;
}

int mt_optim_state_count(const struct mt_optim *o)
{
    return o ? o->n_states : 0;
}

int mt_optim_param_n_states(const struct mt_param *p)
{
    return p->frozen ? 0 : mt_optim_class_n_states(p->optim);
}

int mt_optim_class_n_states(int optim)
{
    return optim == MT_OPTIM_ADAMW ? 2 : 1;
}

void mt_optim_class_state_name(int optim, const char *param, int j, char *out, size_t n)
{
    if (optim == MT_OPTIM_ADAMW) snprintf(out, n, "%s.%s", param, j == 0 ? "exp_avg" : "exp_avg_sq");
    else snprintf(out, n, "%s.momentum_buffer", param);
}

/* States in parameter order: AdamW params give exp_avg then exp_avg_sq, Muon
 * params give momentum_buffer. */
void mt_optim_state_get(const struct mt_optim *o, int i, struct mt_optim_state *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < o->n_params; k++) {
        const struct pstate *st = &o->ps[k];
        int ns = st->p->frozen ? 0 : st->v ? 2 : 1;
        if (i >= ns) { i -= ns; continue; }
        out->param = st->p;
        mt_optim_class_state_name(st->v ? MT_OPTIM_ADAMW : MT_OPTIM_MUON, st->p->name, i, out->name, sizeof out->name);
        out->data = i == 0 ? st->m : st->v;
        return;
    }
    MT_ASSERT(0 && "optimizer state index out of range");
}

long mt_optim_get_t(const struct mt_optim *o) { return o->t; }
void mt_optim_set_t(struct mt_optim *o, long t) { o->t = t; }
