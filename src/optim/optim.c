/*
 * optim.c — the optimizer table, and what every class shares: state
 * allocation and naming, global-norm clipping, the lr schedule, the step
 * counter, the plan's bytes.
 *
 * Exactly SPEC.md section 1b. Every parameter follows its own `param->optim`,
 * an index into the table (the model sets it with mt_optim_kind_for). All
 * arithmetic on tensors goes through the ops table, so the same code drives
 * the cpu and cuda backends.
 *
 * Invariant: state tensors have exactly their parameter's box (numel floats,
 * backend memory, bucket OPTIM) and start at zero (or the class's init);
 * each class's workspace (bucket WORKSPACE) is sized by its ws_sizes over
 * its parameters and holds nothing between calls. `t` counts updates done
 * (0 before the first; the update at step() uses t+1, PyTorch's bias
 * correction from 1).
 */
#include "mt_optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The built-in table, in enum mt_optim_kind order: entry 0 is the fallback
 * (accepts every parameter). Each entry is defined in its own file; adding
 * an optimizer adds its name to the declaration and one line to the table. */
extern const struct mt_optim_i mt_optim_adamw, mt_optim_muon;   /* adamw.c, muon.c */
static const struct mt_optim_i *const builtin[] = {
    [MT_OPTIM_ADAMW] = &mt_optim_adamw,
    [MT_OPTIM_MUON]  = &mt_optim_muon,
};
#define N_BUILTIN ((int)(sizeof builtin / sizeof builtin[0]))

struct mt_optim {
    const struct mt_ops_i          *ops;
    struct mt_config                cfg;
    const struct mt_optim_i *const *classes;   /* classes[param->optim] (n_classes) */
    int                             n_classes;
    struct mt_optim_slot           *ps;        /* (n_params) model order            */
    int                             n_params;
    int                             n_states;
    long                            t;
    float                          *ws[MT_OPTIM_MAX_CLASSES][MT_OPTIM_MAX_WS];   /* per class (ws_sizes) */
    struct mt_optim_slot          **list;      /* a step's list (list_cap)          */
    struct mt_optim_slot          **scratch;   /* the class's scratch (list_cap)    */
    int                             list_cap;  /* max(n_params, MT_OPS_LIST_MAX)    */
    struct mt_comm                 *tp_comm;   /* model group: whole-matrix classes gather over it */
};

const struct mt_optim_i *mt_optim_class(int kind)
{
    return kind >= 0 && kind < N_BUILTIN ? builtin[kind] : NULL;
}

static int accepts(const struct mt_optim_i *c, const struct mt_param *p)
{
    return (c->roles >> (unsigned)p->role & 1u) && (!c->matrices_only || p->ndim == 2);
}

enum mt_optim_kind mt_optim_kind_for(const struct mt_config *cfg, const struct mt_param *p)
{
    if (p->frozen || cfg->lora_rank > 0) return MT_OPTIM_ADAMW;
    for (int k = 0; k < N_BUILTIN; k++)
        if (!strcmp(builtin[k]->name, cfg->optimizer)) return accepts(builtin[k], p) ? (enum mt_optim_kind)k : MT_OPTIM_ADAMW;
    return MT_OPTIM_ADAMW;
}

/* The states of p under table `classes`: its class's, none when frozen. */
static int n_states_in(const struct mt_optim_i *const *classes, const struct mt_param *p)
{
    return p->frozen ? 0 : classes[p->optim]->n_states;
}

/* bytes[] is overwritten: OPTIM = n_states x numel floats per parameter;
 * WORKSPACE = each class's ws_sizes; OTHER = the host bookkeeping (struct,
 * per-param table, the step's list and the class scratch). */
static void plan_bytes(const struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_optim_i *const *classes,
                       int n_classes, const struct mt_param *params, int n_params, size_t bytes[MT_BUCKET_COUNT])
{
    for (int b = 0; b < MT_BUCKET_COUNT; b++) bytes[b] = 0;
    for (int i = 0; i < n_params; i++)
        bytes[MT_BUCKET_OPTIM] += (size_t)n_states_in(classes, &params[i]) * params[i].numel * sizeof(float);
    for (int k = 0; k < n_classes; k++) {
        size_t f[MT_OPTIM_MAX_WS] = {0};
        if (classes[k]->ws_sizes) classes[k]->ws_sizes(ctx, cfg, params, n_params, k, f);
        for (int j = 0; j < MT_OPTIM_MAX_WS; j++) bytes[MT_BUCKET_WORKSPACE] += f[j] * sizeof(float);
    }
    const size_t list_cap = n_params > MT_OPS_LIST_MAX ? (size_t)n_params : MT_OPS_LIST_MAX;
    bytes[MT_BUCKET_OTHER] = sizeof(struct mt_optim) + (size_t)n_params * sizeof(struct mt_optim_slot) +
                             2 * list_cap * sizeof(struct mt_optim_slot *);   /* list, scratch */
}

void mt_optim_plan_bytes(const struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_param *params,
                         int n_params, size_t bytes[MT_BUCKET_COUNT])
{
    plan_bytes(ctx, cfg, builtin, N_BUILTIN, params, n_params, bytes);
}

static float *ws_alloc(struct mt_ctx *ctx, const struct mt_ops_i *ops, size_t n, enum mt_bucket b)
{
    return ops->buf_alloc(ops->be, ctx, n * sizeof(float), b);
}

/* Arguments, kernels, and every parameter against its class (check). */
static enum mt_status create_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                   const struct mt_optim_i *const *classes, int n_classes,
                                   const struct mt_param *params, int n_params)
{
    if (!ops || !cfg || (n_params > 0 && !params) || n_params < 0 || !classes || n_classes < 1 ||
        n_classes > MT_OPTIM_MAX_CLASSES)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_optim_create: NULL ops/cfg/params or a bad table");
    /* clipping, the norm and the states need these; report, never fall back */
    if (!ops->buf_alloc || !ops->buf_free || !ops->fill || !ops->axpby || !ops->sumsq)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks an optimizer kernel (axpby/sumsq)", ops->name);
    for (int i = 0; i < n_params; i++) {
        const struct mt_param *p = &params[i];
        /* a frozen parameter (LoRA base) has no gradient buffer: no state, never stepped */
        if (!p->data || (!p->grad && !p->frozen))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: parameter %s has no data/grad buffer", p->name);
        if ((int)p->optim < 0 || (int)p->optim >= n_classes)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer: parameter %s has optimizer kind %d of %d", p->name,
                                (int)p->optim, n_classes);
        const struct mt_optim_i *c = classes[p->optim];
        if (p->frozen) continue;
        if (c->n_states < 0 || c->n_states > MT_OPTIM_MAX_STATES || !c->step)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "optimizer %s: bad table entry", c->name);
        if (c->check) MT_CHECK(c->check(ctx, ops, cfg, p));
    }
    return MT_OK;
}

enum mt_status mt_optim_create_with(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                    const struct mt_optim_i *const *classes, int n_classes, struct mt_param *params,
                                    int n_params, struct mt_optim **out)
{
    *out = NULL;
    MT_CHECK(create_check(ctx, ops, cfg, classes, n_classes, params, n_params));
    struct mt_optim *o = mt_alloc(ctx, sizeof *o, MT_BUCKET_OTHER);
    if (!o) return MT_ERR_OOM;
    memset(o, 0, sizeof *o);
    o->ops = ops;
    o->cfg = *cfg;
    o->classes = classes;
    o->n_classes = n_classes;
    o->n_params = n_params;
    o->ps = mt_alloc(ctx, (size_t)n_params * sizeof(struct mt_optim_slot), MT_BUCKET_OTHER);
    if (!o->ps) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
    memset(o->ps, 0, (size_t)n_params * sizeof(struct mt_optim_slot));
    o->list_cap = n_params > MT_OPS_LIST_MAX ? n_params : MT_OPS_LIST_MAX;
    o->list = mt_alloc(ctx, (size_t)o->list_cap * sizeof *o->list, MT_BUCKET_OTHER);
    o->scratch = mt_alloc(ctx, (size_t)o->list_cap * sizeof *o->scratch, MT_BUCKET_OTHER);
    if (!o->list || !o->scratch) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
    enum mt_status rc = MT_OK;
    for (int i = 0; i < n_params; i++) {
        struct mt_optim_slot *s = &o->ps[i];
        s->p = &params[i];
        const int ns = n_states_in(classes, &params[i]);   /* 0: LoRA base, never updated */
        for (int j = 0; j < ns; j++) {
            s->s[j] = ws_alloc(ctx, ops, params[i].numel, MT_BUCKET_OPTIM);
            if (!s->s[j]) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
            o->n_states++;
        }
        if (ns > 0 && classes[params[i].optim]->init)
            MT_CHECK_GOTO(classes[params[i].optim]->init(ctx, ops, s), rc, fail);
    }
    for (int k = 0; k < n_classes; k++) {
        size_t f[MT_OPTIM_MAX_WS] = {0};
        if (classes[k]->ws_sizes) classes[k]->ws_sizes(ctx, cfg, params, n_params, k, f);
        for (int j = 0; j < MT_OPTIM_MAX_WS; j++) {
            if (f[j] == 0) continue;
            o->ws[k][j] = ws_alloc(ctx, ops, f[j], MT_BUCKET_WORKSPACE);
            if (!o->ws[k][j]) { mt_optim_destroy(ctx, o); return MT_ERR_OOM; }
        }
    }
    *out = o;
    return MT_OK;
fail:
    mt_optim_destroy(ctx, o);
    return rc;
}

enum mt_status mt_optim_create(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                               struct mt_param *params, int n_params, struct mt_optim **out)
{
    return mt_optim_create_with(ctx, ops, cfg, builtin, N_BUILTIN, params, n_params, out);
}

void mt_optim_destroy(struct mt_ctx *ctx, struct mt_optim *o)
{
    if (!o) return;
    const struct mt_ops_i *ops = o->ops;
    if (o->ps) {
        for (int i = 0; i < o->n_params; i++)
            for (int j = 0; j < MT_OPTIM_MAX_STATES; j++)
                if (o->ps[i].s[j]) ops->buf_free(ops->be, ctx, o->ps[i].s[j]);
        mt_free(ctx, o->ps);
    }
    for (int k = 0; k < MT_OPTIM_MAX_CLASSES; k++)
        for (int j = 0; j < MT_OPTIM_MAX_WS; j++)
            if (o->ws[k][j]) ops->buf_free(ops->be, ctx, o->ws[k][j]);
    if (o->list) mt_free(ctx, o->list);
    if (o->scratch) mt_free(ctx, o->scratch);
    mt_free(ctx, o);
}

/*
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

void mt_optim_set_tp_comm(struct mt_optim *o, struct mt_comm *tp_comm) { o->tp_comm = tp_comm; }

/*
 * Each class steps its parameters in model order, in lists of up to
 * MT_OPS_LIST_MAX (AdamW: one adamw_multi launch each on cuda), or all in
 * one list for a whole_list class (Muon: its batches span the model). Updates of
 * different parameters are independent, so running class by class instead
 * of parameter by parameter changes no bit; every rank of a TP group steps
 * the same whole-matrix parameters in the same order (their collectives
 * pair up).
 */
enum mt_status mt_optim_step(struct mt_ctx *ctx, struct mt_optim *o, int step, double grad_norm)
{
    const struct mt_ops_i *ops = o->ops;
    const struct mt_config *cfg = &o->cfg;
    if (!(grad_norm == grad_norm) || isinf(grad_norm))
        return mt_ctx_error(ctx, MT_ERR_NUMERIC, "non-finite gradient norm %g at step %d", grad_norm, step);

    /* every op of the update is the optimizer's in the profile (the clip, Muon's GEMMs and passes too) */
    const int scope = mt_ops_profile_scope(MT_OPK_OPTIMIZER);
    /* clip: g *= min(1, clip / (norm + 1e-6)), before every class: in place, or inside the
     * update of a class that takes the scale (AdamW, Muon: one fp32 multiply as it reads g, the
     * same bits; saves a read and a write of every gradient, 8 GB a step at 1B params) */
    float gscale = 1.0f;
    if (cfg->grad_clip > 0) {
        double sc = cfg->grad_clip / (grad_norm + 1e-6);
        if (sc < 1.0) {
            gscale = (float)sc;
            for (int i = 0; i < o->n_params; i++)
                if (!o->ps[i].p->frozen && !o->classes[o->ps[i].p->optim]->takes_gscale)
                    ops->axpby(ops->be, o->ps[i].p->grad, NULL, 0.0f, gscale, o->ps[i].p->numel);
        }
    }

    o->t++;
    struct mt_optim_run run = {.ops = ops, .cfg = cfg, .tp_comm = o->tp_comm, .t = o->t,
                               .lr_factor = mt_optim_lr_factor(cfg, step), .gscale = gscale,
                               .scratch = o->scratch};
    enum mt_status rc = MT_OK;
    for (int k = 0; k < o->n_classes && rc == MT_OK; k++) {
        memcpy(run.ws, o->ws[k], sizeof run.ws);
        run.gscale = o->classes[k]->takes_gscale ? gscale : 1.0f;   /* the others' gradients are scaled already */
        struct mt_optim_slot **list = o->list;
        const int cap = o->classes[k]->whole_list ? o->list_cap : MT_OPS_LIST_MAX;
        int n = 0;
        for (int i = 0; i < o->n_params; i++) {
            struct mt_optim_slot *s = &o->ps[i];
            if (s->p->frozen || (int)s->p->optim != k) continue;   /* LoRA: the base does not move */
            s->p->bf16_ok = 0;   /* its data changes: the shadow is stale unless the class writes it (AdamW) */
            list[n++] = s;
            if (n == cap) {
                if ((rc = o->classes[k]->step(ctx, &run, list, n)) != MT_OK) break;
                n = 0;
            }
        }
        if (rc == MT_OK && n > 0) rc = o->classes[k]->step(ctx, &run, list, n);
    }
    mt_ops_profile_scope(scope);
    return rc;
}

int mt_optim_state_count(const struct mt_optim *o)
{
    return o ? o->n_states : 0;
}

int mt_optim_param_n_states(const struct mt_param *p)
{
    return n_states_in(builtin, p);
}

static void state_name(const struct mt_optim_i *c, const char *param, int j, char *out, size_t n)
{
    snprintf(out, n, "%s.%s", param, c->state_names[j]);
}

void mt_optim_param_state_name(const struct mt_param *p, int j, char *out, size_t n)
{
    state_name(builtin[p->optim], p->name, j, out, n);
}

/* States in parameter order, each parameter's in its class's order (AdamW:
 * exp_avg then exp_avg_sq; Muon: momentum_buffer): the checkpoint's
 * optimizer entries. */
void mt_optim_state_get(const struct mt_optim *o, int i, struct mt_optim_state *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < o->n_params; k++) {
        const struct mt_optim_slot *st = &o->ps[k];
        int ns = n_states_in(o->classes, st->p);
        if (i >= ns) { i -= ns; continue; }
        out->param = st->p;
        state_name(o->classes[st->p->optim], st->p->name, i, out->name, sizeof out->name);
        out->data = st->s[i];
        return;
    }
    MT_ASSERT(0 && "optimizer state index out of range");
}

long mt_optim_get_t(const struct mt_optim *o) { return o->t; }
void mt_optim_set_t(struct mt_optim *o, long t) { o->t = t; }
