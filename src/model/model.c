/*
 * model.c — the model object: parameter registry, memory plan and carving,
 * counter-based init, and the forward/backward orchestration over blocks.
 *
 * Invariant: every buffer the model touches is carved by model_layout() out of
 * one arena per bucket, allocated once in mt_model_create; mt_model_plan_bytes
 * runs the very same carving with NULL bases, so the plan equals what create
 * allocates, byte for byte. Nothing is allocated in forward/backward.
 *
 * Block (SPEC.md section 1), for the residual stream x (N, D): its kind's
 * steps in order (mt_blocks.h), e.g. A
 *     x_mid = x + attn(rmsnorm(x) * g_attn)                 attention.c
 *     x_out = x_mid + ffn(rmsnorm(x_mid) * g_mlp)           mlp.c (A) / moe.c (E)
 * each step either writing the stream itself (MT_RESID_NONE) or with the
 * pre-norm and the residual add run here around it (MT_RESID_ADD,
 * step_norm_fwd / step_norm_bwd). Backward walks the blocks and their steps
 * in reverse with one residual gradient buffer dx: each branch's backward
 * ACCUMULATES into dx (residual rule), parameter grads ACCUMULATE (+=),
 * other activation gradients OVERWRITE (=).
 */
#include "model_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mt_knobs.h"
#include "../core/mt_rng.h"
#include "../optim/mt_optim.h"

/* ------------------------------------------------------------------ */
/* shapes                                                              */
/* ------------------------------------------------------------------ */

/* Fill the dimension fields of m from cfg (no allocation). par NULL = one rank. */
static void model_dims_par(struct mt_model *m, const struct mt_config *cfg, int B, const struct mt_model_par *par);

/* Each distinct piece the model uses: its own struct zeroed and its dims
 * filled (setup); ctx NULL: test knobs off (planning, checking). */
static void model_pieces_setup(struct mt_ctx *ctx, struct mt_model *m);

static void model_dims(struct mt_model *m, const struct mt_config *cfg, int B)
{
    model_dims_par(m, cfg, B, NULL);
}

static void model_dims_par(struct mt_model *m, const struct mt_config *cfg, int B, const struct mt_model_par *par)
{
    m->cfg = *cfg;
    m->B = B;
    m->T = cfg->seq_len;
    long long n_rows = (long long)B * cfg->seq_len;
    m->N = n_rows > 0 && n_rows <= INT_MAX ? (int)n_rows : 0;   /* 0: rejected by check_dims */
    m->V = cfg->vocab_size;
    m->L = cfg->n_layer;
    m->D = cfg->d_model;
    m->any_moe = mt_blocks_any_routed(cfg);   /* the expert axis splits the model only then */
    m->kinds_used = 0;
    for (int l = 0; l < m->L && l < MT_MAX_LAYERS; l++) m->kinds_used |= 1u << mt_blocks_layer_kind(cfg, l);
    /* MTP (mtp.c): the modules' block kind is used too (its pieces' scratch) */
    m->mtp_depth = cfg->mtp_depth > 0 && cfg->mtp_depth <= MT_MTP_MAX_DEPTH ? cfg->mtp_depth : 0;
    m->mtp_kind = m->mtp_depth ? mt_blocks_find(cfg->mtp_block[0]) : -1;
    if (m->mtp_kind < 0) m->mtp_depth = 0;
    else m->kinds_used |= 1u << m->mtp_kind;
    /* a wrapper with a loss part (MoD's mod_aux): its per-layer sums are carved (model_layout) */
    m->any_wrap_loss = 0;
    for (int b = 0; b < mt_blocks_count(); b++)
        if ((m->kinds_used >> b & 1u) && mt_blocks_kind(b)->wrap->loss_register) m->any_wrap_loss = 1;
    /* the model axis and its row shares (each piece splits its own dims: setup) */
    m->tp = par && par->tp > 1 ? par->tp : 1;
    m->tp_rank = m->tp > 1 ? par->tp_rank : 0;
    m->sp = m->tp > 1 && par->sp;
    m->tp_comm = m->tp > 1 ? par->tp_comm : NULL;
    m->tp_comm_host = m->tp > 1 && par->tp_comm_host ? par->tp_comm_host : m->tp_comm;
    m->ep = par && par->ep > 1 && m->any_moe ? par->ep : 1;   /* no MoE block: the expert axis is data */
    m->ep_rank = m->ep > 1 ? par->ep_rank : 0;
    m->ep_comm = m->ep > 1 ? par->ep_comm : NULL;
    m->ep_comm_host = m->ep > 1 && par->ep_comm_host ? par->ep_comm_host : m->ep_comm;
    m->l0 = par && par->layer1 > par->layer0 ? par->layer0 : 0;
    m->l1 = par && par->layer1 > par->layer0 ? par->layer1 : m->L;
    m->first = m->l0 == 0;
    m->last = m->l1 == m->L;
    m->n_slots = par && par->n_slots > 1 ? par->n_slots : 1;
    m->Nr = m->sp ? m->N / m->tp : m->N;
    m->row0 = m->tp_rank * (m->N / m->tp);
    m->recompute = strcmp(cfg->recompute, "block") == 0;
    m->bf16 = strcmp(cfg->precision, "bf16") == 0;
    model_pieces_setup(NULL, m);
}

/* 1 when piece p is the first step (the mixer) of a kind the model uses. */
static int piece_first(const struct mt_model *m, const struct mt_piece *p)
{
    for (int b = 0; b < mt_blocks_count(); b++)
        if ((m->kinds_used >> b & 1u) && mt_blocks_kind(b)->steps[0].piece == p) return 1;
    return 0;
}

/* The distinct pieces of the kinds any layer of the model uses (every
 * stage: scratch is sized for the model), each once, in table order:
 * later 0, those at the first step of some kind (the mixers; attention is
 * A's and E's); later 1, the others (the ffns). Returns the count (out:
 * MT_MAX_PIECES). */
static int model_pieces(const struct mt_model *m, int later, const struct mt_piece **out)
{
    int n = 0;
    for (int b = 0; b < mt_blocks_count(); b++) {
        const struct mt_block_kind *k = mt_blocks_kind(b);
        for (int i = 0; (m->kinds_used >> b & 1u) && i < k->n_steps; i++) {
            const struct mt_piece *pc = k->steps[i].piece;
            int seen = piece_first(m, pc) == later;
            for (int j = 0; j < n; j++) seen |= out[j] == pc;
            if (!seen) out[n++] = pc;
        }
    }
    return n;
}

/* model_pieces of both: the first steps', then the others' (out: MT_MAX_PIECES). */
static int model_all_pieces(const struct mt_model *m, const struct mt_piece **out)
{
    int n = model_pieces(m, 0, out);
    return n + model_pieces(m, 1, out + n);
}

/* Piece p's own struct in m (NULL: p declares none). */
static void *model_own(struct mt_model *m, const struct mt_piece *p)
{
    int i = mt_blocks_piece_index(p);
    MT_ASSERT(i >= 0 && p->own_bytes <= sizeof m->own[0]);
    return p->own_bytes ? (void *)m->own[i] : NULL;
}

static void model_pieces_setup(struct mt_ctx *ctx, struct mt_model *m)
{
    const struct mt_piece *pcs[MT_MAX_PIECES];
    int n = model_all_pieces(m, pcs);
    struct mt_piece_ctx pc;
    model_piece_ctx(m, NULL, &pc);
    for (int i = 0; i < n; i++) {
        pc.own = model_own(m, pcs[i]);
        if (pc.own) memset(pc.own, 0, pcs[i]->own_bytes);
        if (pcs[i]->setup) pcs[i]->setup(ctx, &pc, &m->cfg);
    }
}

static enum mt_status check_dims(struct mt_ctx *ctx, struct mt_model *m)
{
    if (m->B < 1) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model: B=%d must be >= 1", m->B);
    if (m->N < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: a microbatch of B*T=%lld tokens is above 2^31-1 (B=%d, T=%d)",
                            (long long)m->B * m->cfg.seq_len, m->B, m->cfg.seq_len);
    if (m->V < 2 || m->V > 65536)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: vocab_size=%d not in [2, 65536]", m->V);
    if (m->L < 1 || m->L > MT_MAX_LAYERS)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: n_layer=%d not in [1, %d]", m->L, MT_MAX_LAYERS);
    if (m->D < 1 || m->T < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: need D, T >= 1 (D=%d T=%d)", m->D, m->T);
    /* a wrapper around a kind's steps (mt_blocks.h, struct mt_block_wrap) is
     * driven by carve_block, model_block_forward and model_block_backward:
     * all of its row hooks or none (a partial one would run as if unwrapped) */
    for (int b = 0; b < mt_blocks_count(); b++) {
        const struct mt_block_wrap *w = mt_blocks_kind(b)->wrap;
        const int n_hooks = !!w->inner + !!w->carve + !!w->enter + !!w->leave + !!w->leave_backward +
                            !!w->enter_backward;
        if ((m->kinds_used >> b & 1u) && n_hooks != 0 && n_hooks != 6)
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "model: block kind '%c' has the wrapper %s with %d of its 6 "
                                "row hooks (inner, carve, enter, leave, leave_backward, enter_backward): it needs all "
                                "or none", mt_blocks_kind(b)->letter, w->name, n_hooks);
    }
    /* each piece the model uses checks its own dimensions (first steps, then the others) */
    struct mt_piece_ctx pc;
    model_piece_ctx(m, NULL, &pc);
    const struct mt_piece *pcs[MT_MAX_PIECES];
    int n = model_all_pieces(m, pcs);
    for (int i = 0; i < n; i++) {
        pc.own = model_own(m, pcs[i]);
        if (pcs[i]->check) MT_CHECK(pcs[i]->check(ctx, &pc));
    }
    /* letters past the pattern's end are the default kind */
    const size_t plen = strlen(m->cfg.pattern);
    const int bad = mt_blocks_pattern_check(m->cfg.pattern, plen < (size_t)m->L ? plen : (size_t)m->L);
    char letters[4 * MT_MAX_BLOCK_KINDS];
    if (bad >= 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: pattern letter %d is '%c', want one of %s", bad,
                            m->cfg.pattern[bad], mt_blocks_letters(letters, sizeof letters));
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* parameter registry                                                  */
/* ------------------------------------------------------------------ */

typedef void (*param_visit_fn)(void *user, const struct mt_param *p);

/* Turn a piece's declaration (or a model-level one: layer -1) into this
 * rank's struct mt_param: HF name, box under TP (from the layout class),
 * reduction rule, init and optimizer class. */
static void visit_param(param_visit_fn fn, void *user, const struct mt_model *m, const struct mt_pspec *sp, int layer,
                        const char *prefix)
{
    const struct mt_config *cfg = &m->cfg;
    struct mt_param p;
    memset(&p, 0, sizeof p);
    if (prefix) {   /* an MTP module's block: model.mtp.{k-1}.block.<suffix>, in the head's unit */
        char suffix[96];
        snprintf(suffix, sizeof suffix, sp->suffix, sp->expert);
        snprintf(p.name, sizeof p.name, "%s%s", prefix, suffix);
    } else if (layer >= 0) {
        char suffix[96];
        snprintf(suffix, sizeof suffix, sp->suffix, sp->expert);   /* formats without %d ignore it */
        snprintf(p.name, sizeof p.name, "model.layers.%d.%s", layer, suffix);
    } else {
        snprintf(p.name, sizeof p.name, "%s", sp->suffix);
    }
    p.ndim = sp->ndim;
    p.shape[0] = sp->rows;
    p.shape[1] = sp->ndim == 2 ? sp->cols : 1;
    p.len[0] = p.shape[0];
    p.len[1] = p.shape[1];
    enum mt_split split = mt_layout_split(sp->layout);
    if (m->tp > 1 && split != MT_SPLIT_NONE) {
        /* TP: whole heads / hidden units per rank (the contract guarantees divisibility) */
        int d = split == MT_SPLIT_ROWS ? 0 : 1;
        p.len[d] = p.shape[d] / m->tp;
        p.off[d] = (int64_t)m->tp_rank * p.len[d];
    }
    p.reduce_model = mt_layout_reduce_model(sp->layout, m->tp, m->sp);
    p.layout = (int)sp->layout;
    p.numel = (size_t)p.len[0] * (size_t)p.len[1];
    p.init = sp->init == MT_SCALE_ONES ? MT_INIT_ONES
             : sp->init == MT_SCALE_ZEROS ? MT_INIT_ZEROS
             : sp->init == MT_SCALE_DT_BIAS ? MT_INIT_DT_BIAS
             : sp->init == MT_SCALE_A_LOG ? MT_INIT_A_LOG : MT_INIT_NORMAL;
    p.init_std = sp->init == MT_SCALE_ONES || sp->init == MT_SCALE_ZEROS || sp->init == MT_SCALE_DT_BIAS ||
                         sp->init == MT_SCALE_A_LOG
                     ? 0.0f
                 : sp->init == MT_SCALE_NORMAL_OUT ? (float)(0.02 / sqrt(2.0 * m->L))
                 : sp->init == MT_SCALE_LORA_A ? (float)(1.0 / sqrt((double)cfg->lora_rank)) : 0.02f;
    /* LoRA: the adapters (A, B) train (AdamW: mt_optim_kind_for); everything else is frozen */
    const int adapter = sp->init == MT_SCALE_LORA_A || sp->init == MT_SCALE_ZEROS;
    p.frozen = cfg->lora_rank > 0 && !adapter;
    p.role = sp->role;
    p.split = split;
    p.layer = layer;
    p.expert = sp->expert;
    p.decay = sp->ndim == 2 && sp->role != MT_ROLE_SSM;
    /* the optimizer of its role, by the optimizers' rule (src/optim) */
    p.optim = mt_optim_kind_for(cfg, &p);
    p.grad_gemm = sp->bind >= 0 && (sp->bind & MT_BIND_DW_GEMM);
    p.grad_live = 1;   /* until a ZeRO engine leaves it to its first GEMM (mt_zero_begin_step) */
    fn(user, &p);
}

/* Global shapes of this rank's model as the pieces see them (its experts). */
static void model_shape(const struct mt_model *m, struct mt_block_shape *s)
{
    mt_blocks_shape(&m->cfg, s);
    s->ep = m->ep;
    s->ep_rank = m->ep_rank;
    s->tp = m->registry_tp > 1 ? m->registry_tp : m->tp;
}

/* What a piece's declarations turn into: a full mt_param (build), a count
 * (count, no names formatted) or a layer binding (bind). */
struct spec_walk {
    const struct mt_model *m;
    param_visit_fn         fn;      /* build: receives each mt_param           */
    void                  *user;
    int                    layer;
    int                    n;       /* count / registry index                  */
    struct mt_layer       *ly;      /* bind: the layer whose fields are set    */
    int                    step;    /* bind: the step of the block being walked */
    struct mt_param       *params;  /* bind: the registry                      */
    const char            *prefix;  /* an MTP module's block: its name prefix (layer -1) */
};

static void spec_build(void *user, const struct mt_pspec *s)
{
    struct spec_walk *w = user;
    visit_param(w->fn, w->user, w->m, s, w->layer, w->prefix);
}

static void spec_count(void *user, const struct mt_pspec *s)
{
    (void)s;
    ((struct spec_walk *)user)->n++;
}

static void spec_bind(void *user, const struct mt_pspec *s)
{
    struct spec_walk *w = user;
    /* step -1: the wrapper's (w_wrap), which has no input norm */
    /* MT_BIND_DW_GEMM is a flag for visit_param; alone it binds nothing */
    const int bind = s->bind < 0 || (s->bind & ~MT_BIND_DW_GEMM) == 0 ? -1 : s->bind & ~MT_BIND_DW_GEMM;
    MT_ASSERT(bind < 0 || bind == MT_BIND_NORM || (bind & MT_BIND_PIECE));
    MT_ASSERT(w->step >= 0 || bind < 0 ||
              (bind != MT_BIND_NORM && (size_t)(bind & ~MT_BIND_PIECE) < sizeof w->ly->w_wrap));
    void *own = w->step >= 0 ? (void *)w->ly->w_own[w->step] : (void *)w->ly->w_wrap;
    if (bind == MT_BIND_NORM) w->ly->w.ln[w->step] = &w->params[w->n];
    else if (bind >= 0) *(struct mt_param **)((char *)own + (bind & ~MT_BIND_PIECE)) = &w->params[w->n];
    w->n++;
}

/* The model-level parameters around the blocks. */
static const struct mt_pspec *embed_spec(const struct mt_model *m, struct mt_pspec *s)
{
    *s = (struct mt_pspec){"model.embed_tokens.weight", -1, 2, m->V, m->D, MT_SCALE_NORMAL, MT_ROLE_EMBED,
                           MT_LAYOUT_RESIDUAL, -1};
    return s;
}

/* The MTP modules' parameters (last stage, after the head's): each
 * module's own (mtp.c), then its block's under the name prefix. */
static void mtp_walk(const struct mt_model *m, const struct mt_block_shape *shape, mt_pspec_fn fn, struct spec_walk *w)
{
    char prefix[48];
    for (int k = 1; k <= m->mtp_depth; k++) {
        w->prefix = NULL;
        mtp_module_params(m, k, fn, w);
        snprintf(prefix, sizeof prefix, "model.mtp.%d.block.", k - 1);
        w->prefix = prefix;
        for (int i = 0; i < mt_blocks_kind(m->mtp_kind)->n_steps; i++)
            mt_blocks_kind_step_params(&m->cfg, shape, m->mtp_kind, i, fn, w);
    }
    w->prefix = NULL;
}

/* Every parameter of this rank's stage, in registry order: wte (first
 * stage), each block's steps in order, final norm and head (last
 * stage). The order is the checkpoint's and the export's. */
static void build_params(const struct mt_model *m, param_visit_fn fn, void *user)
{
    struct mt_pspec ps;
    struct mt_block_shape shape;
    model_shape(m, &shape);
    if (m->first) visit_param(fn, user, m, embed_spec(m, &ps), -1, NULL);
    struct spec_walk w = { m, fn, user, 0, 0, NULL, 0, NULL, NULL };
    for (int l = m->l0; l < m->l1; l++) {
        w.layer = l;
        mt_blocks_layer_params(&m->cfg, &shape, l, spec_build, &w);
    }
    if (!m->last) return;
    w.layer = -1;   /* model-level, as the embedding */
    mt_head.params(m->V, m->D, spec_build, &w);
    mtp_walk(m, &shape, spec_build, &w);
}

struct param_sink { struct mt_param *arr; int n; size_t numel; };

static void sink_param(void *user, const struct mt_param *p)
{
    struct param_sink *s = user;
    if (s->arr) s->arr[s->n] = *p;
    s->n++;
    s->numel += p->numel;
}

/* Parameters build_params visits, counted without formatting names (the
 * slow part): the same walk with a counting visitor. */
static int model_n_params(const struct mt_model *m)
{
    struct mt_block_shape shape;
    model_shape(m, &shape);
    struct spec_walk w = { m, NULL, NULL, 0, 0, NULL, 0, NULL, NULL };
    for (int l = m->l0; l < m->l1; l++) mt_blocks_layer_params(&m->cfg, &shape, l, spec_count, &w);
    if (m->last) mtp_walk(m, &shape, spec_count, &w);
    return w.n + (m->first ? 1 : 0) + (m->last ? 2 : 0);
}

/* ------------------------------------------------------------------ */
/* memory plan and carving                                             */
/* ------------------------------------------------------------------ */

/* pc (built for layer ly) as step i of ly's block sees it: the step's
 * streams, input norm, state, parameters and the piece's own struct. */
static void piece_bind(struct mt_model *m, struct mt_piece_ctx *pc, struct mt_layer *ly, int i)
{
    const struct mt_block_kind *k = mt_blocks_kind(ly->kind);
    pc->step = i;
    pc->x_in = i == 0 ? ly->x_in : ly->x_step[i - 1];
    pc->g = ly->w.ln[i];
    pc->nm = &ly->nrm[i];
    pc->st = ly->state[i];
    pc->pw = ly->w_own[i];
    pc->own = model_own(m, k->steps[i].piece);
}

/* Carve one block's saved internals (everything its backward reads except
 * x_in) into ly, step by step: the step's state struct (OTHER), its input
 * norm when the block runs it (MT_RESID_ADD), what the piece saves, and the
 * stream after the step unless it is the last (the next layer's x_in). */
void model_carve_block(struct mt_model *m, struct mt_carver *c, struct mt_layer *ly, int kind)
{
    const struct mt_block_kind *k = mt_blocks_kind(kind);
    const size_t D = (size_t)m->D;
    struct mt_piece_ctx pc;
    model_piece_ctx(m, ly, &pc);
    ly->kind = kind;   /* piece_bind reads it (a recompute set or a plan's dummy has none yet) */
    /* sizes only (NULL bases): the piece still fills a state struct, a
     * throwaway one here; PIECE_STATE_MAX bounds every piece's state_bytes */
    _Alignas(64) unsigned char tmp[PIECE_STATE_MAX];
    size_t Nr = (size_t)m->Nr;
    if (k->wrap->carve) {   /* the wrapper's state, then the steps on its inner rows */
        _Alignas(64) unsigned char wtmp[PIECE_STATE_MAX];
        MT_ASSERT(k->wrap->state_bytes <= sizeof wtmp);
        ly->wst = k->wrap->state_bytes ? carve(c, MT_BUCKET_OTHER, k->wrap->state_bytes) : NULL;
        const int wsized = k->wrap->state_bytes && !ly->wst;
        if (wsized) ly->wst = wtmp;
        if (ly->wst) memset(ly->wst, 0, k->wrap->state_bytes);
        pc.pw = ly->w_wrap;
        k->wrap->carve(&pc, c, ly);
        struct mt_piece_ctx in = pc;
        k->wrap->inner(&pc, &in);
        pc = in;
        Nr = (size_t)in.Nr;
        if (wsized) ly->wst = NULL;
    }
    for (int i = 0; i < k->n_steps; i++) {
        const struct mt_piece *p = k->steps[i].piece;
        MT_ASSERT(p->state_bytes <= sizeof tmp);
        ly->state[i] = p->state_bytes ? carve(c, MT_BUCKET_OTHER, p->state_bytes) : NULL;
        const int sized = p->state_bytes && !ly->state[i];
        if (sized) ly->state[i] = tmp;
        if (ly->state[i]) memset(ly->state[i], 0, p->state_bytes);   /* fields a carve skips: NULL */
        piece_bind(m, &pc, ly, i);
        if (k->steps[i].resid == MT_RESID_ADD) {
            ly->nrm[i].h_n = ly->nrm[i].h = carve_f(c, MT_BUCKET_ACTS, Nr * D);
            ly->nrm[i].rstd = carve_f(c, MT_BUCKET_ACTS, Nr);
        }
        p->carve(&pc, c, ly);
        if (sized) ly->state[i] = NULL;
        if (i + 1 < k->n_steps) ly->x_step[i] = carve_f(c, MT_BUCKET_ACTS, Nr * D);
    }
}

void model_piece_ctx(struct mt_model *m, struct mt_layer *ly, struct mt_piece_ctx *pc)
{
    memset(pc, 0, sizeof *pc);
    pc->ops = m->ops;
    pc->ly = ly;
    pc->N = m->N;
    pc->Nr = m->Nr;
    pc->D = m->D;
    pc->B = m->B;
    pc->T = m->T;
    pc->rope_cos = m->rope_cos;
    pc->rope_sin = m->rope_sin;
    pc->norm_eps = m->cfg.norm_eps;
    pc->recompute = m->recompute;
    pc->lora = m->cfg.lora_rank > 0;
    pc->dx = m->dx;
    pc->dh = m->dh;
    pc->s_full = m->s_full;
    pc->s_red = m->s_red;
    pc->s_act = m->s_act;
    pc->bf16 = m->bf16;
    pc->s_dact = m->s_dact;
    pc->s_dg = m->s_dg;
    pc->s_du = m->s_du;
    pc->s_lora = m->s_lora;
    pc->s_dlora = m->s_dlora;
    pc->dyb = &m->s_dyb;
    pc->norm = &m->norm;
    pc->layer = ly ? ly->index : -1;
    pc->cfg = &m->cfg;
    pc->wrap_loss = ly && m->wrap_loss && m->wrap_part[ly->kind] >= 0 ? m->wrap_loss + ly->index : NULL;
    pc->redo = ly && m->redo_armed ? m->redo_acc + model_redo_offset(m, ly->index) : NULL;
    pc->tp = (struct mt_tp_axis){m->tp_comm, &m->tp_stats, m->ops, m->tp, m->sp, m->N, m->Nr, m->D, m->tp_comm_host,
                                 m->tp_rank};
    /* the expert axis splits the routed experts: Ee a rank, the first at ep_rank * Ee */
    const int Ee = m->cfg.n_experts / m->ep;
    pc->ep = (struct mt_ep_axis){m->ep_comm, m->ep_comm_host, &m->ep_stats, m->ep, m->ep_rank, Ee, m->ep_rank * Ee};
}

/* Recompute: layer ly uses the shared internals of blk, keeping its own
 * identity (kind, parameters) and its saved input x_in. */
static void share_block(struct mt_layer *ly, const struct mt_layer *blk)
{
    struct mt_layer keep = *ly;
    *ly = *blk;
    ly->kind = keep.kind;
    ly->moe = keep.moe;
    ly->index = keep.index;
    ly->w = keep.w;
    memcpy(ly->w_own, keep.w_own, sizeof ly->w_own);
    memcpy(ly->w_wrap, keep.w_wrap, sizeof ly->w_wrap);
    ly->x_in = keep.x_in;
}

void ffn_norm_carve_pc(const struct mt_piece_ctx *pc, struct mt_carver *c, struct mt_layer *ly)
{
    (void)ly;
    pc->nm->h_n = carve_f(c, MT_BUCKET_ACTS, (size_t)pc->Nr * (size_t)pc->D);
    pc->nm->rstd = carve_f(c, MT_BUCKET_ACTS, (size_t)pc->Nr);
}

/* carve_scratch of every distinct first-step (later: other) piece the model uses. */
static void carve_piece_scratch(struct mt_model *m, struct mt_carver *c, int later)
{
    const struct mt_piece *pcs[MT_MAX_PIECES];
    int n = model_pieces(m, later, pcs);
    struct mt_piece_ctx pc;
    model_piece_ctx(m, NULL, &pc);
    for (int i = 0; i < n; i++) {
        pc.own = model_own(m, pcs[i]);
        if (pcs[i]->carve_scratch) pcs[i]->carve_scratch(&pc, c);
    }
}

/* 1 when some layer of this stage is of kind k. */
static int stage_has_kind(const struct mt_model *m, int k)
{
    for (int l = m->l0; l < m->l1; l++)
        if (mt_blocks_layer_kind(&m->cfg, l) == k) return 1;
    return 0;
}


/* precision=bf16: the matrices that get a bf16 shadow — those whose GEMMs
 * run through proj_fwd / proj_bwd (attention, dense MLP, shared expert), the
 * routed experts (moe_experts.c: wlinear's gemm_bf16 calls per group),
 * Mamba-3's in/out projections (mamba.c: gemm_bf16 per block) and the lm
 * head. Not the router (fp32 by design; MT_ROLE_DENSE is not its role),
 * LoRA adapters (small; fp32). */
static int bf16_shadowed(const struct mt_param *p)
{
    if (p->ndim != 2 || strstr(p->name, ".lora_")) return 0;
    return p->role == MT_ROLE_HEAD || p->role == MT_ROLE_EXPERT || p->role == MT_ROLE_DENSE;
}

/* (Nr, D) blocks a stage exchanges: its output (or input gradient), and with
 * MTP on a pipeline the depths' embedding rows wte[tgt[i+k-1]] forward and
 * their gradients back (mtp.c: wte lives on the first stage, the modules on
 * the last). */
static size_t model_io_blocks(const struct mt_model *m)
{
    return m->mtp_depth && !(m->first && m->last) ? (size_t)(1 + m->mtp_depth) : 1;
}

/* A wrapper's loss part: each layer's sum on the backend, and its host copy. */
static void wrap_loss_carve(struct mt_model *m, struct mt_carver *c)
{
    if (!m->any_wrap_loss) return;
    m->wrap_loss = carve(c, MT_BUCKET_WORKSPACE, (size_t)m->L * sizeof(double));
    m->wrap_loss_h = carve(c, MT_BUCKET_OTHER, (size_t)m->L * sizeof(double));
}

/* Carve every buffer. With NULL bases only the offsets (sizes) advance;
 * m->params / m->layers may be NULL then (param sizes come from the registry).
 *
 * Activations per microbatch slot: idx, targets, x_final (the stage output)
 * and, on the last stage, the head's h_final, rstd_final, logits, losses,
 * xlse; per layer x_in and the block internals. With recompute=block a slot
 * keeps only x_in per layer: every layer of every slot points its internals
 * at ONE shared set per block kind present on the stage, which forward overwrites layer by layer and
 * backward refills by re-running the block's forward (mt_model_backward_stage). */
static void model_layout(struct mt_model *m, struct mt_carver *c)
{
    /* m->slots[k].layers NULL (plan): carve into dummies, only the offsets matter */
    const size_t N = (size_t)m->N, D = (size_t)m->D, Nr = (size_t)m->Nr;
    const enum mt_bucket A = MT_BUCKET_ACTS, W = MT_BUCKET_WORKSPACE, O = MT_BUCKET_OTHER;
    const int n_kinds = mt_blocks_count();

    /* parameters, then grads, in registry order (plan_bytes carves them
     * itself from the registry, before calling this with params == NULL) */
    if (m->params && !m->external_params) {
        for (int i = 0; i < m->n_params; i++) {
            m->params[i].data = carve_f(c, MT_BUCKET_PARAMS, m->params[i].numel);
            m->params[i].grad = carve_f(c, MT_BUCKET_GRADS, m->params[i].numel);
        }
    }
    /* bf16 shadows: model-owned even when the engines own data (ZeRO), after
     * the params in PARAMS (plan_bytes carves them in the same order) */
    if (m->params && m->bf16)
        for (int i = 0; i < m->n_params; i++)
            if (bf16_shadowed(&m->params[i])) m->params[i].bf16 = carve(c, MT_BUCKET_PARAMS, m->params[i].numel * 2);

    m->rope_cos = carve_f(c, W, (size_t)m->T * (size_t)(model_head_dim(&m->cfg) / 2));
    m->rope_sin = carve_f(c, W, (size_t)m->T * (size_t)(model_head_dim(&m->cfg) / 2));

    /* recompute: the shared internals, one set per kind on this stage, carved once */
    struct mt_layer blk[MT_MAX_BLOCK_KINDS];
    memset(blk, 0, sizeof blk);
    if (m->recompute)
        for (int b = 0; b < n_kinds; b++)
            if (stage_has_kind(m, b)) model_carve_block(m, c, &blk[b], b);

    for (int sl = 0; sl < m->n_slots; sl++) {
        struct mt_slot dslot;
        memset(&dslot, 0, sizeof dslot);
        struct mt_slot *S = m->slots[sl].layers ? &m->slots[sl] : &dslot;
        S->idx = carve_i(c, A, N);
        S->targets = carve_i(c, A, N);
        /* a stage before the last sends its output and, with MTP on a pipeline, the depths' embedding rows */
        S->x_final = carve_f(c, A, (m->last ? 1 : model_io_blocks(m)) * Nr * D);
        if (m->last) {
            S->h_final = carve_f(c, A, Nr * D);
            /* the twin only where the norm kernel can write it (plan: ops unknown, counted) */
            if (m->bf16 && (!m->ops || m->ops->rmsnorm_forward_bf16)) S->h_final_bf16 = carve(c, A, Nr * D * 2);
            S->rstd_final = carve_f(c, A, Nr);
            /* the dlogits twin where the cross-entropy can write it (plan: ops unknown, counted);
             * with it, head_chunk_rows bounds the fp32 logits (head.c) */
            const int twin = m->bf16 && (!m->ops || m->ops->xent_fused_bf16);
            m->logits_rows = twin && m->cfg.head_chunk_rows > 0 && m->cfg.head_chunk_rows < m->Nr ? m->cfg.head_chunk_rows
                                                                                              : m->Nr;
            S->logits = carve_f(c, A, (size_t)m->logits_rows * (size_t)m->V);
            if (twin) S->dlogits_bf16 = carve(c, A, Nr * (size_t)m->V * 2);
            S->losses = carve_f(c, A, Nr);
            S->xlse = carve_f(c, A, Nr);
        }
        if (m->first || m->last) mtp_carve(m, c, S);   /* the MTP modules' (mtp_depth > 0; mtp.c) */
        for (int l = m->l0; l < m->l1; l++) {
            struct mt_layer dummy;
            struct mt_layer *ly = S->layers ? &S->layers[l] : &dummy;
            memset(&dummy, 0, sizeof dummy);
            int kind = mt_blocks_layer_kind(&m->cfg, l);
            ly->x_in = carve_f(c, A, Nr * D);
            if (m->recompute) share_block(ly, &blk[kind]);
            else model_carve_block(m, c, ly, kind);
        }
    }

    /* Scratch plan (WORKSPACE), shared by all layers of every kind: the
     * residual gradient dx, d(normed input) dh, the TP row buffers, each
     * piece's own scratch (carve_scratch) and the SwiGLU hidden scratch
     * sized for the widest piece (ffn_scratch). A piece uses only what it
     * declares here or what it owns in struct mt_layer. */
    size_t ff = 0;
    struct mt_piece_ctx pc;
    model_piece_ctx(m, NULL, &pc);
    const struct mt_piece *pcs[MT_MAX_PIECES];
    int n = model_all_pieces(m, pcs);
    for (int i = 0; i < n; i++) {
        pc.own = model_own(m, pcs[i]);
        if (pcs[i]->ffn_scratch && pcs[i]->ffn_scratch(&pc) > ff) ff = pcs[i]->ffn_scratch(&pc);
    }
    m->dx = carve_f(c, W, (m->first ? 1 : model_io_blocks(m)) * Nr * D);   /* the stage's d input (+ MTP's rows) */
    m->dh = carve_f(c, W, N * D);
    if (m->tp > 1) {
        m->s_full = carve_f(c, W, N * D);
        m->s_red = carve_f(c, W, N * D);
    }
    carve_piece_scratch(m, c, 0);   /* mixers */
    m->s_act = carve_f(c, W, ff);
    m->s_dact = carve_f(c, W, ff);
    m->s_dg = carve_f(c, W, ff);
    m->s_du = carve_f(c, W, ff);
    /* the projection scratch: the most rows one projection sees, the widest
     * dense projection output (D; each piece's proj_scratch raises them) */
    size_t rows = N, w = (size_t)D;
    for (int i = 0; i < n; i++) {
        pc.own = model_own(m, pcs[i]);
        if (pcs[i]->proj_scratch) pcs[i]->proj_scratch(&pc, &rows, &w);
    }
    if (m->cfg.lora_rank > 0) {
        /* LoRA: x A^T and its gradient (rows, r) */
        m->s_lora = carve_f(c, W, rows * (size_t)m->cfg.lora_rank);
        m->s_dlora = carve_f(c, W, rows * (size_t)m->cfg.lora_rank);
    }
    if (m->bf16) {
        /* the widest dense projection output a proj_bwd_b sees */
        m->s_dyb.cap = N * w;
        m->s_dyb.p = carve(c, W, m->s_dyb.cap * sizeof(mt_bf16));
    }
    carve_piece_scratch(m, c, 1);   /* ffns */
    m->h_losses = carve_f(c, O, Nr);
    if ((m->first || m->last) && m->mtp_depth > 0) m->mtp_host = carve_i(c, O, 2 * Nr);
    if (m->last && m->mtp_depth > 0) {
        m->mtp_dsave = carve_f(c, W, Nr * D);
        m->mtp_carry = carve_f(c, W, Nr * D);
        m->mtp_tmp = carve_f(c, W, Nr * D);
    }
    model_redo_carve(m, c);         /* ReDo's score accumulators (redo_every > 0 only) */
    wrap_loss_carve(m, c);          /* the wrappers' loss sums (MoD's mod_aux) */
}

struct plan_visit { struct mt_carver *c; };

static void plan_shadow(void *user, const struct mt_param *p)
{
    struct plan_visit *pv = user;
    if (bf16_shadowed(p)) carve(pv->c, MT_BUCKET_PARAMS, p->numel * 2);
}

static void plan_param(void *user, const struct mt_param *p)
{
    struct plan_visit *pv = user;
    carve_f(pv->c, MT_BUCKET_PARAMS, p->numel);
    carve_f(pv->c, MT_BUCKET_GRADS, p->numel);
}

void mt_model_plan_bytes(const struct mt_config *cfg, int B, size_t bytes[MT_BUCKET_COUNT])
{
    mt_model_plan_bytes_ex(cfg, B, 0, bytes);
}

void mt_model_plan_bytes_ex(const struct mt_config *cfg, int B, int flags, size_t bytes[MT_BUCKET_COUNT])
{
    mt_model_plan_bytes_par(NULL, cfg, B, flags, NULL, bytes);
}

void mt_model_plan_bytes_par(struct mt_ctx *ctx, const struct mt_config *cfg, int B, int flags,
                             const struct mt_model_par *par, size_t bytes[MT_BUCKET_COUNT])
{
    struct mt_model m;
    struct mt_carver c;
    memset(&m, 0, sizeof m);
    memset(&c, 0, sizeof c);
    model_dims_par(&m, cfg, B, par);
    if (ctx) model_pieces_setup(ctx, &m);   /* the knobs, as create sets the pieces up */
    struct plan_visit pv = { &c };
    if (!(flags & MT_MODEL_EXTERNAL_PARAMS))
        build_params(&m, plan_param, &pv);   /* same carves as the params loop of model_layout */
    if (m.bf16) build_params(&m, plan_shadow, &pv);   /* the bf16 shadows: device bytes in PARAMS */
    model_layout(&m, &c);                /* params == NULL: the registry branch carves nothing */
    for (int b = 0; b < MT_BUCKET_COUNT; b++) bytes[b] = c.off[b];
    /* host bookkeeping arrays allocated by create next to the OTHER arena */
    bytes[MT_BUCKET_OTHER] += (size_t)model_n_params(&m) * sizeof(struct mt_param)
                              + (size_t)m.n_slots * (size_t)m.L * sizeof(struct mt_layer) + sizeof(struct mt_model);
    if ((m.first || m.last) && m.mtp_depth > 0)   /* the MTP modules' slot arrays (create) */
        bytes[MT_BUCKET_OTHER] += (size_t)m.n_slots * (size_t)m.mtp_depth * sizeof(struct mt_mtp_slot);
}

/* ------------------------------------------------------------------ */
/* create / destroy                                                    */
/* ------------------------------------------------------------------ */

/* Every rule create enforces beyond the shapes (check_dims): degrees the
 * model supports and divisibility. Communicators are required only when
 * the model will run (not for a MT_MODEL_NO_ALLOC plan). */
static void wrap_loss_register(struct mt_model *m);

static enum mt_status check_par(struct mt_ctx *ctx, struct mt_model *m)
{
    /* without an E block the expert axis is extra data parallelism (SPEC.md
     * section 2): nothing of the model is split over it */
    if (m->any_moe && m->ep > MT_MAX_EP)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: ep=%d above the supported %d", m->ep, MT_MAX_EP);
    if (m->any_moe && m->ep > 1 && ((!m->ep_comm && !m->no_alloc) || m->cfg.n_experts % m->ep != 0))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: ep=%d needs the expert group and n_experts %% ep == 0 "
                            "(n_experts=%d)", m->ep, m->cfg.n_experts);
    if (m->tp > 1 && ((!m->tp_comm && !m->no_alloc) || (m->N % m->tp) != 0))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: tp=%d needs the model group and B*T %% tp == 0 (B*T=%d)",
                            m->tp, m->N);
    if (m->n_slots > MT_MAX_SLOTS)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: %d activation slots above the supported %d", m->n_slots,
                            MT_MAX_SLOTS);
    /* the wrappers' own rules (MoD: the backend's entries, whole sequences on a rank) */
    for (int b = 0; b < mt_blocks_count(); b++) {
        const struct mt_block_wrap *w = mt_blocks_kind(b)->wrap;
        if (!(m->kinds_used >> b & 1u) || !w->check) continue;
        struct mt_piece_ctx pc;
        model_piece_ctx(m, NULL, &pc);
        MT_CHECK(w->check(ctx, &pc));
    }
    return check_dims(ctx, m);
}

enum mt_status mt_model_check_par(struct mt_ctx *ctx, const struct mt_config *cfg, int B, const struct mt_model_par *par)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims_par(&m, cfg, B, par);
    m.no_alloc = 1;
    return check_par(ctx, &m);
}

static void rope_tables(struct mt_ctx *ctx, const struct mt_ops_i *ops, float *cos_dev, float *sin_dev,
                        int tmax, int hd, double theta, float *host /* (2, tmax, hd/2) */)
{
    int h2 = hd / 2;
    (void)ctx;
    for (int p = 0; p < tmax; p++) {
        for (int i = 0; i < h2; i++) {
            double inv_freq = pow(theta, -2.0 * i / (double)hd);
            double a = (double)p * inv_freq;
            host[(size_t)p * h2 + i] = (float)cos(a);
            host[(size_t)tmax * h2 + (size_t)p * h2 + i] = (float)sin(a);
        }
    }
    ops->copy_from_host(ops->be, cos_dev, host, (size_t)tmax * h2 * sizeof(float));
    ops->copy_from_host(ops->be, sin_dev, host + (size_t)tmax * h2, (size_t)tmax * h2 * sizeof(float));
}

enum mt_status model_rope_build(struct mt_ctx *ctx, const struct mt_model *m, float *cos_dev, float *sin_dev, int tmax)
{
    float *host = mt_alloc(ctx, (size_t)2 * tmax * (model_head_dim(&m->cfg) / 2) * sizeof(float), MT_BUCKET_WORKSPACE);
    if (!host) return MT_ERR_OOM;
    double theta = m->cfg.rope_theta > 0 ? (double)m->cfg.rope_theta : 10000.0;
    rope_tables(ctx, m->ops, cos_dev, sin_dev, tmax, model_head_dim(&m->cfg), theta, host);
    mt_free(ctx, host);
    return MT_OK;
}

void mt_model_destroy(struct mt_ctx *ctx, struct mt_model *m)
{
    if (!m) return;
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        if (!m->arena[b]) continue;
        if (b == MT_BUCKET_OTHER) mt_free(ctx, m->arena[b]);
        else m->ops->buf_free(m->ops->be, ctx, m->arena[b]);
    }
    mt_free(ctx, m->params);
    for (int k = 0; k < m->n_slots && k < MT_MAX_SLOTS; k++) {
        mt_free(ctx, m->slots[k].layers);
        mt_free(ctx, m->slots[k].mtp);
    }
    mt_free(ctx, m);
}

/* LoRA: point each targeted base matrix at its adapters (registry entries
 * "<W>.lora_B.weight" follow their piece's own parameters, each after its A:
 * "<W>.lora_A.weight", or one A shared by a stack of blocks, blocks.c; so
 * the base is found by name searching back, the A as the nearest before). */
static void bind_lora(struct mt_model *m)
{
    if (m->cfg.lora_rank <= 0) return;
    const float scale = m->cfg.lora_alpha / (float)m->cfg.lora_rank;
    struct mt_param *a = NULL;
    for (int i = 0; i < m->n_params; i++) {
        struct mt_param *b = &m->params[i];
        if (strstr(b->name, ".lora_A.weight")) a = b;
        const char *tag = strstr(b->name, ".lora_B.weight");
        if (!tag || !a) continue;
        char base[128];
        snprintf(base, sizeof base, "%.*s.weight", (int)(tag - b->name), b->name);
        for (int j = i - 1; j >= 0; j--)
            if (!strcmp(m->params[j].name, base)) {
                m->params[j].lora_a = a;
                m->params[j].lora_b = b;
                m->params[j].lora_scale = scale;
                break;
            }
    }
}

/* Point each layer's weight fields at its registry entries: the same walk
 * as build_params, with a visitor that binds instead of building. */
static void bind_layer_params(struct mt_model *m, struct mt_slot *S)
{
    struct mt_layer *layers = S->layers;
    struct mt_param *p = m->params;
    struct mt_block_shape shape;
    model_shape(m, &shape);
    struct spec_walk w = { m, NULL, NULL, 0, 0, NULL, 0, p, NULL };
    m->wte = m->first ? &p[w.n++] : NULL;
    for (int l = m->l0; l < m->l1; l++) {
        layers[l].kind = mt_blocks_layer_kind(&m->cfg, l);
        layers[l].moe = mt_blocks_kind(layers[l].kind)->routed;
        layers[l].index = l;
        w.ly = &layers[l];
        w.step = -1;
        mt_blocks_layer_wrap_params(&m->cfg, &shape, l, spec_bind, &w);
        for (w.step = 0; w.step < mt_blocks_kind(layers[l].kind)->n_steps; w.step++)
            mt_blocks_layer_step_params(&m->cfg, &shape, l, w.step, spec_bind, &w);
    }
    m->norm_f = m->last ? &p[w.n++] : NULL;
    m->lm_head = m->last ? &p[w.n++] : NULL;
    /* MTP (last stage): each module's gains and eh_proj, then its block (mtp_walk's order) */
    for (int k = 0; m->last && k < m->mtp_depth; k++) {
        struct mt_mtp_params *mp = &m->mtp_p[k];
        mp->enorm = &p[w.n++];
        mp->hnorm = &p[w.n++];
        mp->norm = &p[w.n++];
        mp->eh = &p[w.n++];
        struct mt_layer *ly = &S->mtp[k].ly;
        ly->kind = m->mtp_kind;
        ly->moe = 0;
        ly->index = -1;
        w.ly = ly;
        for (w.step = 0; w.step < mt_blocks_kind(m->mtp_kind)->n_steps; w.step++)
            mt_blocks_kind_step_params(&m->cfg, &shape, m->mtp_kind, w.step, spec_bind, &w);
    }
    MT_ASSERT(w.n == m->n_params);
}

enum mt_status mt_model_create(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                               const struct mt_config *cfg, int B, struct mt_model **out)
{
    return mt_model_create_ex(ctx, ops, cfg, B, 0, out);
}

enum mt_status mt_model_create_ex(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                                  const struct mt_config *cfg, int B, int flags, struct mt_model **out)
{
    return mt_model_create_par(ctx, ops, cfg, B, flags, NULL, out);
}

enum mt_status mt_model_create_par(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                   int B, int flags, const struct mt_model_par *par, struct mt_model **out)
{
    enum mt_status rc = MT_OK;
    *out = NULL;
    if ((!ops && !(flags & MT_MODEL_NO_ALLOC)) || !cfg)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model: NULL ops or config");
    struct mt_model *m = mt_alloc(ctx, sizeof *m, MT_BUCKET_OTHER);
    if (!m) return MT_ERR_OOM;
    model_dims_par(m, cfg, B, par);
    m->ops = ops;
    m->no_alloc = (flags & MT_MODEL_NO_ALLOC) != 0;
    MT_CHECK_GOTO(check_par(ctx, m), rc, fail);
    if (m->bf16 && ops && (!mt_ops_supports(ops, gemm_bf16) || !mt_ops_supports(ops, cast_bf16))) {
        rc = mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "precision=bf16: backend %s has no bf16 GEMM", ops->name);
        goto fail;
    }
    m->external_params = (flags & (MT_MODEL_EXTERNAL_PARAMS | MT_MODEL_NO_ALLOC)) != 0;
    model_pieces_setup(ctx, m);   /* again with the knobs the pieces read (moe: forced routing, grouped GEMMs) */
    /* the loss parts, in the order of mt_model.h: lm, aux, z, extras */
    m->n_loss = 0;
    MT_CHECK_GOTO(mt_head.loss_register(ctx, m, 0), rc, fail);
    moe_loss_register(m);
    MT_CHECK_GOTO(mt_head.loss_register(ctx, m, 1), rc, fail);
    mtp_loss_register(m);
    wrap_loss_register(m);

    struct param_sink s = { NULL, 0, 0 };
    build_params(m, sink_param, &s);
    m->n_params = s.n;
    MT_ASSERT(s.n == model_n_params(m));   /* the count plan_bytes uses without building names */
    m->params = mt_alloc(ctx, (size_t)s.n * sizeof(struct mt_param), MT_BUCKET_OTHER);
    if (!m->params) { rc = MT_ERR_OOM; goto fail; }
    if (m->no_alloc) {
        /* planning: the registry with its boxes, nothing else (no arenas, no layers) */
        s.arr = m->params;
        s.n = 0;
        build_params(m, sink_param, &s);
        bind_lora(m);
        m->wte = m->first ? &m->params[0] : NULL;
        *out = m;
        return MT_OK;
    }
    for (int k = 0; k < m->n_slots; k++) {
        m->slots[k].layers = mt_alloc(ctx, (size_t)m->L * sizeof(struct mt_layer), MT_BUCKET_OTHER);
        if (!m->slots[k].layers) { rc = MT_ERR_OOM; goto fail; }
        memset(m->slots[k].layers, 0, (size_t)m->L * sizeof(struct mt_layer));
        if ((m->first || m->last) && m->mtp_depth > 0) {   /* the MTP modules' (mtp.c) */
            const size_t nb = (size_t)m->mtp_depth * sizeof(struct mt_mtp_slot);
            m->slots[k].mtp = mt_alloc(ctx, nb, MT_BUCKET_OTHER);
            if (!m->slots[k].mtp) { rc = MT_ERR_OOM; goto fail; }
            memset(m->slots[k].mtp, 0, nb);
        }
    }
    s.arr = m->params;
    s.n = 0;
    build_params(m, sink_param, &s);
    bind_lora(m);
    for (int k = 0; k < m->n_slots; k++) bind_layer_params(m, &m->slots[k]);

    /* pass 1: sizes; pass 2: carve from the arenas */
    struct mt_carver c;
    memset(&c, 0, sizeof c);
    model_layout(m, &c);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        if (c.off[b] == 0) continue;
        m->arena_bytes[b] = c.off[b];
        m->arena[b] = b == MT_BUCKET_OTHER ? mt_alloc(ctx, c.off[b], (enum mt_bucket)b)
                                           : ops->buf_alloc(ops->be, ctx, c.off[b], (enum mt_bucket)b);
        if (!m->arena[b]) { rc = MT_ERR_OOM; goto fail; }
    }
    struct mt_carver c2;
    memset(&c2, 0, sizeof c2);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) c2.base[b] = m->arena[b];
    model_layout(m, &c2);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) MT_ASSERT(c2.off[b] == c.off[b]);
    m->cur_slot = -1;
    mt_model_set_slot(m, 0);

    MT_CHECK_GOTO(model_rope_build(ctx, m, m->rope_cos, m->rope_sin, m->T), rc, fail);
    *out = m;
    return MT_OK;
fail:
    mt_model_destroy(ctx, m);
    return rc;
}

struct mt_param *mt_model_params(struct mt_model *m, int *n_params)
{
    if (n_params) *n_params = m->n_params;
    return m->params;
}

const float *mt_model_logits(const struct mt_model *m) { return m->logits; }
void mt_model_keep_logits(struct mt_model *m, int keep) { m->keep_logits = keep != 0; }

void mt_model_tp_stats(const struct mt_model *m, struct mt_tp_stats *out) { *out = m->tp_stats; }

void mt_model_ep_stats(const struct mt_model *m, struct mt_ep_stats *out) { *out = m->ep_stats; }
const double *mt_model_moe_load(const struct mt_model *m)
{
    return m->any_moe ? moe_own_load(m->ops, model_own((struct mt_model *)m, &mt_piece_moe)) : NULL;
}
void mt_model_moe_load_reset(struct mt_model *m)
{
    if (m->any_moe) moe_own_load_reset(m->ops, model_own(m, &mt_piece_moe));
}
int mt_model_moe_gate_up_bf16(const struct mt_model *m)
{
    return m->any_moe ? moe_own_gate_up_bf16(model_own((struct mt_model *)m, &mt_piece_moe)) : 0;
}
int mt_model_moe_device_sizes(const struct mt_model *m, const char **why)
{
    *why = "";
    return m->any_moe ? moe_own_device_sizes(model_own((struct mt_model *)m, &mt_piece_moe), why) : 1;
}

void mt_model_set_hooks(struct mt_model *m, const struct mt_model_hooks *h)
{
    if (h) m->hooks = *h;
    else memset(&m->hooks, 0, sizeof m->hooks);
}

int mt_model_n_units(const struct mt_model *m) { return m->L + 2; }

int mt_model_param_unit(const struct mt_model *m, int i)
{
    const struct mt_param *p = &m->params[i];
    if (p->layer >= 0) return 1 + p->layer;
    return p == m->wte ? 0 : m->L + 1;
}

static inline enum mt_status hook(struct mt_ctx *ctx, struct mt_model *m,
                                  enum mt_status (*fn)(struct mt_ctx *, void *, int), int unit)
{
    return fn ? fn(ctx, m->hooks.user, unit) : MT_OK;
}

const struct mt_config *mt_model_cfg(const struct mt_model *m) { return &m->cfg; }

void mt_model_bf16_invalidate(struct mt_model *m)
{
    for (int i = 0; m->bf16 && i < m->n_params; i++) m->params[i].bf16_ok = 0;
}

/* precision=bf16: write the stale shadows of unit u from their fp32 weights.
 * Called right after the unit's pre_forward hook, where its weights are
 * valid (a ZeRO-3 gather has just run), so each shadow is written once per
 * step (the first microbatch's forward after the update); backward and the
 * later microbatches read it as is. A shadow the update wrote (AdamW on a
 * tensor this rank updates: mt_zero_set_bf16_mark_fresh) is fresh already and
 * skipped. Every pass over the registry is host-only bookkeeping. */
static void bf16_refresh(struct mt_model *m, int u)
{
    /* the unit's stale shadows in one cast_bf16_multi per MT_OPS_LIST_MAX
     * (the same bits as one cast_bf16 each, which a table without it runs) */
    mt_bf16 *dst[MT_OPS_LIST_MAX];
    const float *src[MT_OPS_LIST_MAX];
    size_t n[MT_OPS_LIST_MAX];
    int c = 0;
    for (int i = 0; m->bf16 && i < m->n_params; i++) {
        struct mt_param *p = &m->params[i];
        if (!p->bf16 || p->bf16_ok || mt_model_param_unit(m, i) != u) continue;
        p->bf16_ok = 1;
        if (!m->ops->cast_bf16_multi) {
            m->ops->cast_bf16(m->ops->be, p->bf16, p->data, p->numel);
            continue;
        }
        dst[c] = p->bf16, src[c] = p->data, n[c] = p->numel;
        if (++c == MT_OPS_LIST_MAX) m->ops->cast_bf16_multi(m->ops->be, dst, src, n, c), c = 0;
    }
    if (c) m->ops->cast_bf16_multi(m->ops->be, dst, src, n, c);
}

void mt_model_zero_grad(struct mt_model *m)
{
    if (m->arena[MT_BUCKET_GRADS])
        m->ops->fill(m->ops->be, m->arena[MT_BUCKET_GRADS], 0.0f, m->arena_bytes[MT_BUCKET_GRADS] / sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i].grad_live = 1;   /* zeroed: every write adds */
}

/* ------------------------------------------------------------------ */
/* init                                                                */
/* ------------------------------------------------------------------ */

/* The init value of global element gi: init_std * normal(seed, stream, gi)
 * for matrices, in double, rounded once; the Mamba dt bias and A_log
 * from uniforms; gains 1; the rest 0. */
static inline float init_value(const struct mt_param *p, uint64_t seed, uint64_t stream, uint64_t gi)
{
    switch (p->init) {
    case MT_INIT_NORMAL: return (float)((double)p->init_std * mt_rng_normal(seed, stream, gi));
    case MT_INIT_ONES:   return 1.0f;
    case MT_INIT_DT_BIAS: {
        /* dt = exp(u (log 0.1 - log 0.001) + log 0.001) floored at 1e-4;
         * dt_bias = softplus^-1(dt) = dt + log(-expm1(-dt)) */
        double u = mt_rng_uniform(seed, stream, gi);
        double dt = exp(u * (log(0.1) - log(0.001)) + log(0.001));
        if (dt < 1e-4) dt = 1e-4;
        return (float)(dt + log(-expm1(-dt)));
    }
    case MT_INIT_A_LOG:  return (float)log(1.0 + 15.0 * mt_rng_uniform(seed, stream, gi));
    default:             return 0.0f;
    }
}

/* Elements [b, e) of the owned box, row-major: local (i, j) is global
 * index (off0+i)*shape1 + off1+j. */
static void fill_range(const struct mt_param *p, uint64_t seed, uint64_t stream, size_t b, size_t e, float *out)
{
    const size_t n1 = (size_t)p->len[1];
    size_t i = b / n1, j = b % n1;
    for (size_t li = b; li < e; li++) {
        const uint64_t gi = mt_rng_box_index(p->off[0], p->off[1], p->shape[1], (int64_t)i, (int64_t)j);
        out[li] = init_value(p, seed, stream, gi);
        if (++j == n1) {
            j = 0;
            i++;
        }
    }
}

/* Every element is a pure function of (seed, name, global index), so the
 * box is filled in chunks on all OpenMP threads with the bits of a serial
 * fill (tests/test_init.c compares the two). */
#define FILL_CHUNK ((size_t)1 << 16)
void model_param_fill(const struct mt_param *p, uint64_t seed, float *out_host)
{
    const size_t n = (size_t)p->len[0] * (size_t)p->len[1];
    if (n == 0) return;
    const uint64_t stream = mt_rng_stream(p->name);
    const size_t n_chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (n_chunks > 1)
    for (size_t c = 0; c < n_chunks; c++)
        fill_range(p, seed, stream, c * FILL_CHUNK, c + 1 < n_chunks ? (c + 1) * FILL_CHUNK : n, out_host);
}

/* The serial reference of model_param_fill (tests only). */
void model_param_fill_serial(const struct mt_param *p, uint64_t seed, float *out_host)
{
    const size_t n = (size_t)p->len[0] * (size_t)p->len[1];
    if (n) fill_range(p, seed, mt_rng_stream(p->name), 0, n, out_host);
}

void mt_model_param_values(const struct mt_param *p, uint64_t seed, float *out_host)
{
    model_param_fill(p, seed, out_host);
}

/* whether the backend draws p itself: a normal init, a device table with
 * init_normal, and on_device (knob param_init_device) */
static int param_drawn_on_device(const struct mt_ops_i *ops, const struct mt_param *p, int on_device)
{
    return on_device && p->init == MT_INIT_NORMAL && ops->init_normal && !ops->host_memory;
}

size_t mt_model_param_init_staging(const struct mt_ops_i *ops, const struct mt_param *p, int on_device)
{
    return ops->host_memory || param_drawn_on_device(ops, p, on_device) ? 0 : p->numel;
}

/* One parameter's init into its storage dst: drawn by the backend where it
 * can (on the device, no staging, the same bits: src/ops/cuda/init.cu), else
 * filled on the host, in place (host NULL: dst is host memory) or into host
 * (numel floats) and copied over. */
void mt_model_param_init(const struct mt_ops_i *ops, const struct mt_param *p, uint64_t seed, float *dst,
                         float *host, int on_device)
{
    if (param_drawn_on_device(ops, p, on_device)) {
        ops->init_normal(ops->be, dst, (size_t)p->len[0], (size_t)p->len[1], p->off[0], p->off[1], p->shape[1], seed,
                         mt_rng_stream(p->name), p->init_std);
        return;
    }
    MT_ASSERT(host || ops->host_memory);   /* device memory is filled through host staging */
    model_param_fill(p, seed, host ? host : dst);
    if (host) ops->copy_from_host(ops->be, dst, host, p->numel * sizeof(float));
}

enum mt_status mt_model_init_params(struct mt_ctx *ctx, struct mt_model *m, uint64_t seed)
{
    const int in_place = m->ops->host_memory;   /* host memory: no staging (as mt_zero_init_params) */
    const int on_device = mt_knob_int(ctx, MT_KNOB_PARAM_INIT_DEVICE) != 0;
    size_t maxn = 1;   /* the staging for the parameters the host draws for a device */
    for (int i = 0; i < m->n_params; i++) {
        const size_t s = mt_model_param_init_staging(m->ops, &m->params[i], on_device);
        if (s > maxn) maxn = s;
    }
    float *host = in_place ? NULL : mt_alloc(ctx, maxn * sizeof(float), MT_BUCKET_WORKSPACE);
    if (!in_place && !host) return MT_ERR_OOM;
    for (int i = 0; i < m->n_params; i++) {
        struct mt_param *p = &m->params[i];
        if (!p->data) continue;   /* external storage this rank does not hold */
        mt_model_param_init(m->ops, p, seed, p->data, in_place ? NULL : host, on_device);
    }
    mt_free(ctx, host);
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* counts                                                              */
/* ------------------------------------------------------------------ */

int mt_model_registry(const struct mt_config *cfg, struct mt_param *out, int cap)
{
    return mt_model_registry_tp(cfg, 1, out, cap);
}

int mt_model_registry_tp(const struct mt_config *cfg, int tp, struct mt_param *out, int cap)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    m.registry_tp = tp;
    struct param_sink s = { NULL, 0, 0 };
    build_params(&m, sink_param, &s);
    if (!out || cap < s.n) return s.n;
    s.arr = out;
    s.n = 0;
    build_params(&m, sink_param, &s);
    return s.n;
}

void mt_model_param_counts(const struct mt_config *cfg, size_t *total, size_t *active)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    struct param_sink s = { NULL, 0, 0 };
    build_params(&m, sink_param, &s);
    struct mt_block_shape shape;
    model_shape(&m, &shape);
    size_t inactive = 0;
    for (int l = 0; l < m.L; l++) inactive += (size_t)mt_blocks_layer_inactive(cfg, &shape, l);
    if (total) *total = s.numel;
    if (active) *active = s.numel - inactive;
}

/* Parameters the optimizer updates: all of them, or with LoRA the adapters. */
struct trainable_sink { size_t n; double active; double expert_frac; };
static void sink_trainable(void *user, const struct mt_param *p)
{
    struct trainable_sink *s = user;
    if (p->frozen) return;
    s->n += p->numel;
    /* a routed expert's adapters see top_k / E of the tokens */
    s->active += p->role == MT_ROLE_EXPERT ? (double)p->numel * s->expert_frac : (double)p->numel;
}

size_t mt_model_param_trainable(const struct mt_config *cfg)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    struct trainable_sink s = { 0, 0, 0 };
    build_params(&m, sink_trainable, &s);
    return s.n;
}

/* 6 * (matmul params active per token, wte excluded: it is a lookup)
 * (LoRA: 4 x the base's + 6 x the adapters', below)
 * + each block's non-parameter FLOPs (attention: 12 T H hd, PaLM/nanochat
 * convention). Integer-valued sums: exact in double. */
double mt_model_flops_per_token(const struct mt_config *cfg)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    struct mt_block_shape shape;
    model_shape(&m, &shape);
    double mm = mt_head.mm_per_token(m.V, m.D), extra = mtp_flops_per_token(cfg, &shape);
    for (int l = 0; l < m.L; l++) {
        mm += mt_blocks_layer_mm(cfg, &shape, l);
        extra += mt_blocks_layer_extra(cfg, &shape, l);
    }
    if (cfg->lora_rank <= 0) return 6.0 * mm + extra;
    /* LoRA (docs/lora.md): the frozen base's matmuls run forward (2) and
     * backward for the activations only (2), no weight gradient; the
     * adapters forward and backward in full (6 x their params active per
     * token; the backward's recompute of x A^T is not useful work). */
    struct trainable_sink s = { 0, 0, cfg->n_experts > 0 ? (double)cfg->top_k / (double)cfg->n_experts : 0 };
    build_params(&m, sink_trainable, &s);
    return 4.0 * mm + 6.0 * s.active + extra;
}

/* ------------------------------------------------------------------ */
/* forward / backward                                                  */
/* ------------------------------------------------------------------ */

void ffn_norm_fwd(const struct mt_piece_ctx *pc, float *x_out, int n, int twin_only)
{
    const struct mt_norm_acts *nm = pc->nm;
    const int Nr = pc->tp.sp ? n / pc->tp.tp : n;
    /* the step's input norm and the residual's seed (x_out = x_in) in one pass; x_out
     * NULL: no seed (the piece's output GEMM reads x_in: resid_in_gemm, the twin's path) */
    MT_ASSERT(x_out || nm->hb);
    if (nm->hb)   /* precision=bf16, dense MLP: + the bf16 twin, gate/up's operand (alone: twin_only) */
        pc->ops->rmsnorm_resid_forward_bf16(pc->ops->be, twin_only ? NULL : nm->h_n, nm->hb, nm->rstd, x_out,
                                            pc->x_in, pc->g->data, Nr, pc->D, pc->norm_eps);
    else
        pc->ops->rmsnorm_resid_forward(pc->ops->be, nm->h_n, nm->rstd, x_out, pc->x_in, pc->g->data, Nr, pc->D,
                                       pc->norm_eps);
}

void ffn_norm_bwd(const struct mt_piece_ctx *pc, const float *dhr, const mt_bf16 *dhr_b)
{
    norm_bwd_twin(pc, dhr, dhr_b);   /* + the residual gradient's bf16 twin */
}

/* MT_RESID_ADD around a step (mt_blocks.h): before its forward the block
 * writes h_n = rmsnorm(s_i) * g and s_{i+1} = s_i (the piece then adds its
 * branch); after its backward, which left d h_n in dh, dx += the norm's
 * backward (dx holds d s_{i+1}, the identity path, already). */
static void step_norm_fwd(const struct mt_piece_ctx *pc, const struct mt_piece_fwd *a)
{
    ffn_norm_fwd(pc, a->x_out, a->B * a->T, 0);
}

static void step_norm_bwd(const struct mt_piece_ctx *pc)
{
    ffn_norm_bwd(pc, pc->dh, NULL);
}

/* The wrapper's inner context (struct mt_block_wrap.inner): the steps run
 * on the wrapper's rows, dims and streams, from the block's pc. */
static void wrap_inner(const struct mt_block_kind *k, struct mt_piece_ctx *outer, struct mt_piece_ctx *in)
{
    outer->pw = outer->ly->w_wrap;   /* the hooks read the wrapper's parameters */
    outer->x_in = outer->ly->x_in;   /* and the block's input stream */
    *in = *outer;
    k->wrap->inner(outer, in);
}

/* The steps of ly's block on the context pc (the block's, or a wrapper's
 * inner one, whose input stream is x0; NULL: the block's, ly->x_in). */
static enum mt_status block_steps_forward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly,
                                          struct mt_piece_ctx *pc, const float *x0, struct mt_piece_fwd *a)
{
    const struct mt_block_kind *k = mt_blocks_kind(ly->kind);
    /* decoding: the layer's state is its steps' states in order (model_decode_floats) */
    float *st = a->state, *x_out = a->x_out;
    size_t off = 0;
    enum mt_status rc = MT_OK;
    for (int i = 0; i < k->n_steps && rc == MT_OK; i++) {
        const struct mt_piece *p = k->steps[i].piece;
        piece_bind(m, pc, ly, i);
        if (i == 0 && x0) pc->x_in = x0;
        const size_t n = st && p->decode_floats ? p->decode_floats(pc, a->t_max) : 0;
        a->state = n ? st + off : NULL;
        off += n;
        a->x_out = i + 1 < k->n_steps ? ly->x_step[i] : x_out;
        if (k->steps[i].resid == MT_RESID_ADD) step_norm_fwd(pc, a);
        rc = p->forward(ctx, pc, a);
    }
    a->state = st;
    a->x_out = x_out;
    return rc;
}

enum mt_status model_block_forward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly,
                                   struct mt_piece_fwd *a)
{
    const struct mt_block_kind *k = mt_blocks_kind(ly->kind);
    struct mt_piece_ctx pc;
    model_piece_ctx(m, ly, &pc);
    if (!k->wrap->enter) return block_steps_forward(ctx, m, ly, &pc, NULL, a);
    /* a wrapper: enter gathers its rows into the inner input stream and sets
     * the inner call (B, T, x_out); the steps run on them; leave combines */
    struct mt_piece_ctx in;
    wrap_inner(k, &pc, &in);
    struct mt_piece_fwd ia = *a;
    ia.aux = ia.z = 0.0;
    float *x0 = NULL;
    MT_CHECK(k->wrap->enter(ctx, &pc, a, &ia, &x0));
    if (ia.T > 0) MT_CHECK(block_steps_forward(ctx, m, ly, &in, x0 ? x0 : in.x_in, &ia));
    a->aux += ia.aux;
    a->z += ia.z;
    return k->wrap->leave(ctx, &pc, a, &ia);
}

size_t model_decode_floats(struct mt_model *m, int kind, int t_max)
{
    const struct mt_block_kind *k = mt_blocks_kind(kind);
    struct mt_piece_ctx pc;
    model_piece_ctx(m, NULL, &pc);
    size_t n = k->wrap->decode_floats ? k->wrap->decode_floats(&pc, t_max) : 0;   /* the wrapper's first */
    for (int i = 0; i < k->n_steps; i++) {
        pc.own = model_own(m, k->steps[i].piece);
        if (k->steps[i].piece->decode_floats) n += k->steps[i].piece->decode_floats(&pc, t_max);
    }
    return n;
}

/* Backward of one block: dx holds d x_out; on return d x_in (its steps in
 * reverse, each turning d s_{i+1} into d s_i). */
enum mt_status model_block_backward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly)
{
    const struct mt_block_kind *k = mt_blocks_kind(ly->kind);
    struct mt_piece_ctx pc, in;
    model_piece_ctx(m, ly, &pc);
    const float *x0 = NULL;
    if (k->wrap->enter) {   /* d x_out into the inner d output (in.dx); in.x_in: the inner input stream */
        wrap_inner(k, &pc, &in);
        MT_CHECK(k->wrap->leave_backward(ctx, &pc, &in));
        dyb_twin_drop(&m->s_dyb);   /* the wrapper wrote the streams: no twin stands */
        x0 = in.x_in;
    } else {
        in = pc;
    }
    for (int i = k->n_steps - 1; i >= 0; i--) {
        piece_bind(m, &in, ly, i);
        if (i == 0 && x0) in.x_in = x0;
        MT_CHECK(k->steps[i].piece->backward(ctx, &in));
        if (k->steps[i].resid == MT_RESID_ADD) step_norm_bwd(&in);
    }
    /* the inner d input scattered (+=) into the block's dx */
    if (!k->wrap->enter) return MT_OK;
    enum mt_status rc = k->wrap->enter_backward(ctx, &pc, &in);
    dyb_twin_drop(&m->s_dyb);
    return rc;
}

/* 1 when kind `kind` has the piece p among its steps. */
static int kind_has(int kind, const struct mt_piece *p)
{
    const struct mt_block_kind *k = mt_blocks_kind(kind);
    for (int i = 0; i < k->n_steps; i++)
        if (k->steps[i].piece == p) return 1;
    return 0;
}

/* Add the aux and z sums of this stage's MoE layers' last forward (moe.c
 * leaves them on the backend, in its own struct) to sum[MT_LOSS_AUX] and
 * sum[MT_LOSS_Z], in layer order (the order the layers' sums were added in
 * before they moved to the device: the same bits). One device-to-host copy
 * per forward for all layers; none for a stage without MoE layers. */
static void moe_loss_sums(struct mt_model *m, double *sum)
{
    int l0 = -1, l1 = -1;
    for (int l = m->l0; l < m->l1; l++)
        if (kind_has(m->layers[l].kind, &mt_piece_moe)) {
            if (l0 < 0) l0 = l;
            l1 = l + 1;
        }
    if (l0 < 0) return;
    const double *h = moe_own_losses(m->ops, model_own(m, &mt_piece_moe), l0, l1);
    for (int l = l0; l < l1; l++)
        if (kind_has(m->layers[l].kind, &mt_piece_moe)) {
            sum[MT_LOSS_AUX] += h[2 * (size_t)l];
            sum[MT_LOSS_Z] += h[2 * (size_t)l + 1];
        }
}

/* The loss parts of the wrappers the pattern uses (struct mt_block_wrap.loss_register),
 * one per wrapper, in kind order; m->wrap_part[kind] says where a layer's sum goes. */
static void wrap_loss_register(struct mt_model *m)
{
    for (int b = 0; b < MT_MAX_BLOCK_KINDS; b++) m->wrap_part[b] = -1;
    for (int b = 0; b < mt_blocks_count(); b++) {
        const struct mt_block_wrap *w = mt_blocks_kind(b)->wrap;
        if (!(m->kinds_used >> b & 1u) || !w->loss_register) continue;
        for (int a = 0; a < b; a++)   /* a wrapper's part once, shared by its kinds */
            if (m->wrap_part[a] >= 0 && mt_blocks_kind(a)->wrap == w) m->wrap_part[b] = m->wrap_part[a];
        if (m->wrap_part[b] < 0) m->wrap_part[b] = w->loss_register(m);
    }
}

/* Add this stage's wrapped layers' loss sums of the last forward (left on
 * the backend by their enter) to their parts, in layer order: one copy. */
static void wrap_loss_sums(struct mt_model *m, double *sum)
{
    int l0 = -1, l1 = -1;   /* the stage's wrapped layers (none: no copy, no host wait) */
    for (int l = m->l0; m->wrap_loss && l < m->l1; l++)
        if (m->wrap_part[m->layers[l].kind] >= 0) {
            if (l0 < 0) l0 = l;
            l1 = l + 1;
        }
    if (l0 < 0) return;
    const struct mt_ops_i *ops = m->ops;
    ops->copy_to_host(ops->be, m->wrap_loss_h + l0, m->wrap_loss + l0, (size_t)(l1 - l0) * sizeof(double));
    for (int l = l0; l < l1; l++) {
        const int p = m->wrap_part[m->layers[l].kind];
        if (p >= 0) sum[p] += m->wrap_loss_h[l];
    }
}

/* The global count a part's sums are divided by (mt_model.h). */
double model_loss_count(const struct mt_loss_norm *norm, const struct mt_loss_part *p)
{
    const enum mt_loss_reduce r = p->reduce;
    if (r == MT_LOSS_PER_TARGET_AHEAD) return norm->n_targets - (double)p->ahead * norm->n_sequences;
    return r == MT_LOSS_PER_SEQUENCE ? norm->n_sequences : r == MT_LOSS_PER_TOKEN ? norm->n_tokens : norm->n_targets;
}

const struct mt_loss_part *mt_model_loss_parts(const struct mt_model *m, int *n)
{
    *n = m->n_loss;
    return m->loss;
}

/* Arguments of a training forward over the microbatch's B x T rows. */
struct mt_piece_fwd model_train_fwd(const struct mt_model *m, float *x_out, int want_loss)
{
    struct mt_piece_fwd a;
    memset(&a, 0, sizeof a);
    a.B = m->B;
    a.T = m->T;
    a.cos_tab = m->rope_cos;
    a.sin_tab = m->rope_sin;
    a.x_out = x_out;
    a.want_loss = want_loss;
    return a;
}

/* Save the current slot's fields and load slot k's (pipeline microbatches in flight). */
void mt_model_set_slot(struct mt_model *m, int k)
{
    MT_ASSERT(k >= 0 && k < m->n_slots);
    if (m->cur_slot == k) return;
    if (m->cur_slot >= 0) {
        struct mt_slot *c = &m->slots[m->cur_slot];
        c->norm = m->norm;
        c->have_fwd = m->have_fwd;
        c->have_targets = m->have_targets;
    }
    const struct mt_slot *S = &m->slots[k];
    m->idx = S->idx;
    m->targets = S->targets;
    m->x_final = S->x_final;
    m->h_final = S->h_final;
    m->h_final_bf16 = S->h_final_bf16;
    m->rstd_final = S->rstd_final;
    m->logits = S->logits;
    m->dlogits_bf16 = S->dlogits_bf16;
    m->losses = S->losses;
    m->xlse = S->xlse;
    m->layers = S->layers;
    m->mtp = m->slots[k].mtp;
    m->norm = S->norm;
    m->have_fwd = S->have_fwd;
    m->have_targets = S->have_targets;
    m->cur_slot = k;
}

int mt_model_n_slots(const struct mt_model *m) { return m->n_slots; }
int mt_model_stage_rows(const struct mt_model *m) { return m->Nr * (int)model_io_blocks(m); }
float *mt_model_stage_output(struct mt_model *m) { return m->x_final; }
float *mt_model_stage_dinput(struct mt_model *m) { return m->dx; }

enum mt_status mt_model_forward(struct mt_ctx *ctx, struct mt_model *m,
                                const int32_t *idx, const int32_t *targets,
                                const struct mt_loss_norm *norm, struct mt_loss_parts *out)
{
    return mt_model_forward_stage(ctx, m, idx, targets, NULL, norm, out);
}

enum mt_status mt_model_forward_stage(struct mt_ctx *ctx, struct mt_model *m, const int32_t *idx,
                                      const int32_t *targets, const float *x_in, const struct mt_loss_norm *norm,
                                      struct mt_loss_parts *out)
{
    const struct mt_ops_i *ops = m->ops;
    const int N = m->N;
    m->have_fwd = 0;
    if (out) {
        memset(out, 0, sizeof *out);
        out->n = m->n_loss;
    }
    if (m->first && !idx) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model forward: idx is NULL");
    if (!m->first && !x_in) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model forward: stage input is NULL");
    if (targets && !norm) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model forward: targets given without loss norm");
    for (int i = 0; i < N; i++) {
        if (idx && (idx[i] < 0 || idx[i] >= m->V))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model forward: token %d at position %d not in [0, %d)",
                                (int)idx[i], i, m->V);
        if (targets && (targets[i] < -1 || targets[i] >= m->V))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model forward: target %d at position %d not in [-1, %d)",
                                (int)targets[i], i, m->V);
    }
    if (idx) ops->copy_from_host(ops->be, m->idx, idx, (size_t)N * sizeof(int32_t));
    if (targets) ops->copy_from_host(ops->be, m->targets, targets, (size_t)N * sizeof(int32_t));

    /* under SP the embedding and the head see this rank's Nr rows only */
    const int r0 = m->sp ? m->row0 : 0;
    if (m->first) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, 0));
        bf16_refresh(m, 0);
        ops->embed_forward(ops->be, m->layers[m->l0].x_in, m->idx + r0, m->wte->data, m->Nr, m->D);
        /* MTP: the depths' embedding rows, read while wte is in its unit; on a pipeline
         * into the stage output's tail, for the last stage (mtp.c) */
        if (targets && m->mtp_depth > 0)
            mtp_embed_forward(m, targets, m->last ? NULL : m->x_final + (size_t)m->Nr * m->D);
    } else {
        ops->copy(ops->be, m->layers[m->l0].x_in, x_in, (size_t)m->Nr * m->D * sizeof(float));
        if (targets && m->mtp_depth > 0) mtp_stage_rows_in(m, targets, x_in + (size_t)m->Nr * m->D);
    }
    double sum[MT_LOSS_MAX_PARTS] = {0};   /* each loss part's sum over this microbatch, un-normalised */
    for (int l = m->l0; l < m->l1; l++) {
        struct mt_layer *ly = &m->layers[l];
        float *x_out = l + 1 < m->l1 ? m->layers[l + 1].x_in : m->x_final;
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, 1 + l));
        bf16_refresh(m, 1 + l);
        struct mt_piece_fwd a = model_train_fwd(m, x_out, targets != NULL);
        MT_CHECK(model_block_forward(ctx, m, ly, &a));
        sum[MT_LOSS_AUX] += a.aux;
        sum[MT_LOSS_Z] += a.z;
    }
    if (targets && m->any_moe) moe_loss_sums(m, sum);
    if (targets) wrap_loss_sums(m, sum);
    if (targets) m->norm = *norm;   /* the head's fused cross-entropy needs dscale now */
    if (m->last && m->logits_rows < m->Nr && !head_chunked(m, targets != NULL))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                            "model forward: head_chunk_rows=%d keeps %d rows of logits, and this forward needs all %d "
                            "(no targets, keep_logits, or no bf16 lm head): set head_chunk_rows=0",
                            m->cfg.head_chunk_rows, m->logits_rows, m->Nr);
    if (m->last) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, m->L + 1));
        bf16_refresh(m, m->L + 1);
        mt_head.forward(m, m->Nr, targets != NULL, sum);
        if (targets && m->mtp_depth > 0) MT_CHECK(mtp_forward(ctx, m, sum));
    }
    if (targets) {
        m->norm = *norm;
        if (out)
            for (int k = 0; k < m->n_loss; k++) {
                const double c = model_loss_count(norm, &m->loss[k]);
                out->v[k] = c > 0 ? sum[k] / c : 0.0;
            }
    }
    m->have_fwd = 1;
    m->have_targets = targets != NULL;
    return MT_OK;
}

/* recompute=block: re-run block l's forward from its saved input x_in into
 * the shared internals, so that its backward finds exactly what a forward
 * without recompute would have saved (same kernels, same inputs: the same
 * bits on one rank). The block output goes to dh, free at this point (the
 * real output, layer l+1's input, is not needed any more). The routing
 * histogram is not counted twice: what the recompute added is taken back. */
static enum mt_status block_recompute(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly, int l)
{
    struct mt_piece_fwd a = model_train_fwd(m, m->dh, 1);
    MT_CHECK(model_block_forward(ctx, m, ly, &a));
    const struct mt_block_kind *k = mt_blocks_kind(ly->kind);
    struct mt_piece_ctx pc;
    model_piece_ctx(m, ly, &pc);
    MT_ASSERT(pc.layer == l);
    for (int i = 0; i < k->n_steps; i++) {
        piece_bind(m, &pc, ly, i);
        if (k->steps[i].piece->undo_recompute) k->steps[i].piece->undo_recompute(&pc);
    }
    return MT_OK;
}

enum mt_status mt_model_backward(struct mt_ctx *ctx, struct mt_model *m)
{
    return mt_model_backward_stage(ctx, m, NULL);
}

enum mt_status mt_model_backward_stage(struct mt_ctx *ctx, struct mt_model *m, const float *dy_out)
{
    const struct mt_ops_i *ops = m->ops;
    const int D = m->D;
    if (!m->have_fwd || !m->have_targets)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                            "model backward: needs a preceding forward with targets (and at most one backward per forward)");
    if (!m->last && !dy_out)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model backward: a stage before the last needs d(output)");
    m->have_fwd = 0;   /* logits will hold dlogits: no second backward of this forward */
    dyb_twin_drop(&m->s_dyb);   /* a twin of the last backward stands for nothing now */
    if (m->last) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, m->L + 1));
        mt_head.backward(m);                        /* dx = d x_final */
        if (m->mtp_depth > 0) MT_CHECK(mtp_backward(ctx, m));   /* dx += the modules' d h^0 */
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, m->L + 1));
    } else {
        ops->copy(ops->be, m->dx, dy_out, (size_t)m->Nr * D * sizeof(float));
    }
    /* between the blocks below a twin is handed on: the hooks (ZeRO's gathers and
     * reductions) and a block's recompute forward touch neither dx nor the dy scratch */
    dyb_twin_drop(&m->s_dyb);
    for (int l = m->l1 - 1; l >= m->l0; l--) {
        struct mt_layer *ly = &m->layers[l];
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, 1 + l));
        if (m->recompute) MT_CHECK(block_recompute(ctx, m, ly, l));
        MT_CHECK(model_block_backward(ctx, m, ly));
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, 1 + l));
    }
    if (m->first) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, 0));
        if (!m->wte->frozen)   /* LoRA: the frozen embedding needs no gradient */
            ops->embed_backward(ops->be, m->wte->grad, m->dx, m->idx + (m->sp ? m->row0 : 0), m->Nr, D, m->V);
        if (!m->wte->frozen && m->mtp_depth > 0)   /* dwte += the depths' rows (on a pipeline: the tail) */
            mtp_embed_backward(m, m->last ? NULL : dy_out + (size_t)m->Nr * D);
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, 0));
    } else if (m->mtp_depth > 0) {
        mtp_stage_rows_back(m, dy_out ? dy_out + (size_t)m->Nr * D : NULL);   /* the rows' gradient, backwards */
    }
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* pipeline split                                                      */
/* ------------------------------------------------------------------ */

/* FLOPs per token of one block, as mt_model_flops_per_token counts them
 * (the pipeline cut's cost). */
static double block_flops(const struct mt_model *m, int l)
{
    struct mt_block_shape shape;
    model_shape(m, &shape);
    return mt_blocks_layer_flops(&m->cfg, &shape, l);
}

double mt_model_stage_flops(const struct mt_config *cfg, int layer0, int layer1)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    double f = 0;
    for (int l = layer0; l < layer1; l++) f += block_flops(&m, l);
    if (layer1 == m.L) f += mt_model_head_flops(cfg);
    return f;
}

double mt_model_layer_flops(const struct mt_config *cfg, int l)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    return block_flops(&m, l);
}

double mt_model_head_flops(const struct mt_config *cfg)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    struct mt_block_shape shape;
    model_shape(&m, &shape);
    return 6.0 * mt_head.mm_per_token(m.V, m.D) + mtp_flops_per_token(cfg, &shape);   /* MTP: on the last stage */
}
