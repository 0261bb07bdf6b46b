/*
 * model.c — the model object: parameter registry, memory plan and carving,
 * counter-based init, and the forward/backward orchestration over blocks.
 *
 * Invariant: every buffer the model touches is carved by model_layout() out of
 * one arena per bucket, allocated once in mt_model_create; mt_model_plan_bytes
 * runs the very same carving with NULL bases, so the plan equals what create
 * allocates, byte for byte. Nothing is allocated in forward/backward.
 *
 * Block (SPEC.md section 1), for the residual stream x (N, D):
 *     x_mid = x + attn(rmsnorm(x) * g_attn)                 attention.c
 *     x_out = x_mid + ffn(rmsnorm(x_mid) * g_mlp)           mlp.c (A) / moe.c (E)
 * Backward walks the blocks in reverse with one residual gradient buffer dx:
 * each branch's backward ACCUMULATES into dx (residual rule), parameter grads
 * ACCUMULATE (+=), other activation gradients OVERWRITE (=).
 */
#include "model_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mt_rng.h"

/* ------------------------------------------------------------------ */
/* shapes                                                              */
/* ------------------------------------------------------------------ */

static int layer_is_moe(const struct mt_config *cfg, int l)
{
    return l < (int)strlen(cfg->pattern) && cfg->pattern[l] == 'E';
}

/* Fill the dimension fields of m from cfg (no allocation). par NULL = one rank. */
static void model_dims_par(struct mt_model *m, const struct mt_config *cfg, int B, const struct mt_model_par *par);

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
    m->H = cfg->n_head;
    m->K = cfg->n_kv_head;
    m->hd = cfg->head_dim > 0 ? cfg->head_dim : (cfg->n_head > 0 ? cfg->d_model / cfg->n_head : 0);
    m->F = cfg->mlp_hidden;
    m->E = cfg->n_experts;
    m->top_k = cfg->top_k;
    m->Fe = cfg->expert_hidden;
    m->Fs = cfg->shared_expert_hidden;
    m->QD = m->H * m->hd;
    m->KD = m->K * m->hd;
    m->any_moe = 0;
    m->any_dense = 0;
    for (int l = 0; l < m->L && l < MT_MAX_LAYERS; l++) {
        if (layer_is_moe(cfg, l)) m->any_moe = 1;
        else m->any_dense = 1;
    }
    /* the model axis: local head / hidden counts, row shares */
    m->tp = par && par->tp > 1 ? par->tp : 1;
    m->tp_rank = m->tp > 1 ? par->tp_rank : 0;
    m->sp = m->tp > 1 && par->sp;
    m->tp_comm = m->tp > 1 ? par->tp_comm : NULL;
    m->Hg = m->H;
    m->Kg = m->K;
    m->Fg = m->F;
    if (m->tp > 1) {
        m->H /= m->tp;
        m->K /= m->tp;
        m->F /= m->tp;
        m->QD = m->H * m->hd;
        m->KD = m->K * m->hd;
    }
    m->ep = par && par->ep > 1 && m->any_moe ? par->ep : 1;   /* no MoE block: the expert axis is data */
    m->ep_rank = m->ep > 1 ? par->ep_rank : 0;
    m->ep_comm = m->ep > 1 ? par->ep_comm : NULL;
    m->Ee = m->E / m->ep;
    m->e0 = m->ep_rank * m->Ee;
    m->l0 = par && par->layer1 > par->layer0 ? par->layer0 : 0;
    m->l1 = par && par->layer1 > par->layer0 ? par->layer1 : m->L;
    m->first = m->l0 == 0;
    m->last = m->l1 == m->L;
    m->n_slots = par && par->n_slots > 1 ? par->n_slots : 1;
    m->Nr = m->sp ? m->N / m->tp : m->N;
    m->Nm = m->tp > 1 ? m->N / m->tp : m->N;
    m->row0 = m->tp_rank * (m->N / m->tp);
    m->M = m->any_moe ? m->Nm * m->top_k : 0;
    m->recompute = strcmp(cfg->recompute, "block") == 0;
}

static enum mt_status check_dims(struct mt_ctx *ctx, const struct mt_model *m)
{
    if (m->B < 1) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model: B=%d must be >= 1", m->B);
    if (m->N < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: a microbatch of B*T=%lld tokens is above 2^31-1 (B=%d, T=%d)",
                            (long long)m->B * m->cfg.seq_len, m->B, m->cfg.seq_len);
    if (m->V < 2 || m->V > 65536)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: vocab_size=%d not in [2, 65536]", m->V);
    if (m->L < 1 || m->L > MT_MAX_LAYERS)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: n_layer=%d not in [1, %d]", m->L, MT_MAX_LAYERS);
    if (m->D < 1 || m->H < 1 || m->K < 1 || m->T < 1 || m->hd < 2)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: need D, H, K, T >= 1 and head_dim >= 2 (D=%d H=%d K=%d T=%d hd=%d)",
                            m->D, m->H, m->K, m->T, m->hd);
    if (m->H % m->K != 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: n_head %% n_kv_head != 0 (H=%d K=%d)", m->H, m->K);
    if (m->hd % 2 != 0)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: head_dim=%d must be even (RoPE)", m->hd);
    if (m->any_dense && m->F < 1)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: mlp_hidden=%d must be >= 1 (config not resolved?)", m->F);
    if (m->any_moe) {
        if (m->E < 1 || m->top_k < 1 || m->top_k > m->E)
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: need 1 <= top_k <= n_experts (top_k=%d E=%d)", m->top_k, m->E);
        if (m->Fe < 1)
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: expert_hidden=%d must be >= 1", m->Fe);
        if (m->Fs < 0)
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: shared_expert_hidden=%d < 0", m->Fs);
    }
    for (int l = 0; l < m->L; l++) {
        char c = l < (int)strlen(m->cfg.pattern) ? m->cfg.pattern[l] : 'A';
        if (c != 'A' && c != 'E')
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: pattern letter %d is '%c', want A or E", l, c);
    }
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* parameter registry                                                  */
/* ------------------------------------------------------------------ */

typedef void (*param_visit_fn)(void *user, const struct mt_param *p);

static void visit_param(param_visit_fn fn, void *user, const struct mt_model *m, const char *name,
                        int ndim, int64_t rows, int64_t cols, enum mt_init_kind init, float std,
                        enum mt_param_role role, enum mt_split split, int layer, int expert)
{
    const struct mt_config *cfg = &m->cfg;
    struct mt_param p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", name);
    p.ndim = ndim;
    p.shape[0] = rows;
    p.shape[1] = ndim == 2 ? cols : 1;
    p.len[0] = p.shape[0];
    p.len[1] = p.shape[1];
    if (m->tp > 1 && split != MT_SPLIT_NONE) {
        /* TP: whole heads / hidden units per rank (the contract guarantees divisibility) */
        int d = split == MT_SPLIT_ROWS ? 0 : 1;
        p.len[d] = p.shape[d] / m->tp;
        p.off[d] = (int64_t)m->tp_rank * p.len[d];
    }
    /* partial over the model group: QK-norm gains (heads split), everything of
     * an MoE block (SP region), and with SP the norms, embedding and head */
    if (m->tp > 1) {
        int qk = strstr(name, "q_norm") || strstr(name, "k_norm");
        int moe_block = role == MT_ROLE_ROUTER || role == MT_ROLE_EXPERT || strstr(name, "shared_expert");
        int sp_rows = m->sp && (role == MT_ROLE_GAIN || role == MT_ROLE_EMBED || role == MT_ROLE_HEAD);
        p.reduce_model = qk || moe_block || sp_rows;
    }
    p.numel = (size_t)p.len[0] * (size_t)p.len[1];
    p.init = init;
    p.init_std = std;
    p.role = role;
    p.split = split;
    p.layer = layer;
    p.expert = expert;
    p.decay = ndim == 2;
    /* nanochat split: Muon for every 2-D matrix inside the blocks except the router */
    int muon = ndim == 2 && strncmp(name, "model.layers.", 13) == 0 && role != MT_ROLE_ROUTER;
    p.optim = (muon && strcmp(cfg->optimizer, "adamw") != 0) ? MT_OPTIM_MUON : MT_OPTIM_ADAMW;
    fn(user, &p);
}

/* "model.layers.<l>.<suffix>" into buf; returns buf. */
static const char *lname(char *buf, size_t len, int l, const char *suffix)
{
    snprintf(buf, len, "model.layers.%d.%s", l, suffix);
    return buf;
}

/* Every parameter in the order mt_model.h states. */
static void build_params(const struct mt_model *m, param_visit_fn fn, void *user)
{
    const struct mt_config *cfg = &m->cfg;
    const float std = 0.02f;
    const int64_t QD = (int64_t)m->Hg * m->hd, KD = (int64_t)m->Kg * m->hd, F = m->Fg;  /* global shapes */
    const float std_out = (float)(0.02 / sqrt(2.0 * m->L));
    char n[128];
    if (m->first)
        visit_param(fn, user, m, "model.embed_tokens.weight", 2, m->V, m->D, MT_INIT_NORMAL, std,
                    MT_ROLE_EMBED, MT_SPLIT_NONE, -1, -1);
    for (int l = m->l0; l < m->l1; l++) {
        visit_param(fn, user, m, lname(n, sizeof n, l, "input_layernorm.weight"), 1, m->D, 1, MT_INIT_ONES, 0, MT_ROLE_GAIN, MT_SPLIT_NONE, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.q_proj.weight"), 2, QD, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_ROWS, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.k_proj.weight"), 2, KD, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_ROWS, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.v_proj.weight"), 2, KD, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_ROWS, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.o_proj.weight"), 2, m->D, QD, MT_INIT_NORMAL, std_out, MT_ROLE_DENSE, MT_SPLIT_COLS, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.q_norm.weight"), 1, m->hd, 1, MT_INIT_ONES, 0, MT_ROLE_GAIN, MT_SPLIT_NONE, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "self_attn.k_norm.weight"), 1, m->hd, 1, MT_INIT_ONES, 0, MT_ROLE_GAIN, MT_SPLIT_NONE, l, -1);
        visit_param(fn, user, m, lname(n, sizeof n, l, "post_attention_layernorm.weight"), 1, m->D, 1, MT_INIT_ONES, 0, MT_ROLE_GAIN, MT_SPLIT_NONE, l, -1);
        if (!layer_is_moe(cfg, l)) {
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.gate_proj.weight"), 2, F, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_ROWS, l, -1);
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.up_proj.weight"), 2, F, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_ROWS, l, -1);
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.down_proj.weight"), 2, m->D, F, MT_INIT_NORMAL, std_out, MT_ROLE_DENSE, MT_SPLIT_COLS, l, -1);
            continue;
        }
        visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.gate.weight"), 2, m->E, m->D, MT_INIT_NORMAL, std, MT_ROLE_ROUTER, MT_SPLIT_NONE, l, -1);
        for (int e = m->e0; e < m->e0 + m->Ee; e++) {   /* EP: this rank's experts only */
            char s[96];
            snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
            visit_param(fn, user, m, lname(n, sizeof n, l, s), 2, m->Fe, m->D, MT_INIT_NORMAL, std, MT_ROLE_EXPERT, MT_SPLIT_NONE, l, e);
            snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
            visit_param(fn, user, m, lname(n, sizeof n, l, s), 2, m->Fe, m->D, MT_INIT_NORMAL, std, MT_ROLE_EXPERT, MT_SPLIT_NONE, l, e);
            snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
            visit_param(fn, user, m, lname(n, sizeof n, l, s), 2, m->D, m->Fe, MT_INIT_NORMAL, std_out, MT_ROLE_EXPERT, MT_SPLIT_NONE, l, e);
        }
        if (m->Fs > 0) {
            /* experts (shared included) are not split by TP: SPEC.md section 2 */
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.shared_expert.gate_proj.weight"), 2, m->Fs, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_NONE, l, -1);
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.shared_expert.up_proj.weight"), 2, m->Fs, m->D, MT_INIT_NORMAL, std, MT_ROLE_DENSE, MT_SPLIT_NONE, l, -1);
            visit_param(fn, user, m, lname(n, sizeof n, l, "mlp.shared_expert.down_proj.weight"), 2, m->D, m->Fs, MT_INIT_NORMAL, std_out, MT_ROLE_DENSE, MT_SPLIT_NONE, l, -1);
        }
    }
    if (!m->last) return;
    visit_param(fn, user, m, "model.norm.weight", 1, m->D, 1, MT_INIT_ONES, 0, MT_ROLE_GAIN, MT_SPLIT_NONE, -1, -1);
    visit_param(fn, user, m, "lm_head.weight", 2, m->V, m->D, MT_INIT_NORMAL, std, MT_ROLE_HEAD, MT_SPLIT_NONE, -1, -1);
}

struct param_sink { struct mt_param *arr; int n; size_t numel; };

static void sink_param(void *user, const struct mt_param *p)
{
    struct param_sink *s = user;
    if (s->arr) s->arr[s->n] = *p;
    s->n++;
    s->numel += p->numel;
}

/* Parameters build_params visits, counted without building them (names
 * are the slow part): wte on the first stage; per layer 8 attention-side
 * parameters, then 3 (A) or router + 3 per local expert + 3 shared (E);
 * final norm and head on the last stage. create asserts it equals the
 * registry's count. */
static int model_n_params(const struct mt_model *m)
{
    int n = m->first ? 1 : 0;
    for (int l = m->l0; l < m->l1; l++)
        n += 8 + (layer_is_moe(&m->cfg, l) ? 1 + 3 * m->Ee + (m->Fs > 0 ? 3 : 0) : 3);
    return n + (m->last ? 2 : 0);
}

/* ------------------------------------------------------------------ */
/* memory plan and carving                                             */
/* ------------------------------------------------------------------ */

struct carver { char *base[MT_BUCKET_COUNT]; size_t off[MT_BUCKET_COUNT]; };

static void *carve(struct carver *c, enum mt_bucket b, size_t bytes)
{
    size_t o = (c->off[b] + 63) & ~(size_t)63;
    c->off[b] = o + bytes;
    return c->base[b] ? c->base[b] + o : NULL;
}
static float *carve_f(struct carver *c, enum mt_bucket b, size_t n) { return carve(c, b, n * sizeof(float)); }
static int32_t *carve_i(struct carver *c, enum mt_bucket b, size_t n) { return carve(c, b, n * sizeof(int32_t)); }

/* Carve one block's saved internals (everything its backward reads except
 * x_in) into ly. moe: the block is an `E` block. */
static void carve_block(struct mt_model *m, struct carver *c, struct mt_layer *ly, int moe)
{
    const size_t N = (size_t)m->N, D = (size_t)m->D, QD = (size_t)m->QD, KD = (size_t)m->KD;
    const size_t Nr = (size_t)m->Nr, Nm = (size_t)m->Nm;
    const size_t E = (size_t)m->E, k = (size_t)m->top_k, M = (size_t)m->M;
    const enum mt_bucket A = MT_BUCKET_ACTS, O = MT_BUCKET_OTHER;
    const int tp = m->tp > 1;
    ly->h_attn_n = carve_f(c, A, Nr * D);
    ly->h_attn = m->sp ? carve_f(c, A, N * D) : ly->h_attn_n;   /* SP: the gathered copy is saved */
    ly->rstd_attn = carve_f(c, A, Nr);
    ly->q_raw = carve_f(c, A, N * QD);
    ly->k_raw = carve_f(c, A, N * KD);
    ly->rstd_q = carve_f(c, A, N * (size_t)m->H);
    ly->rstd_k = carve_f(c, A, N * (size_t)m->K);
    ly->q = carve_f(c, A, N * QD);
    ly->k = carve_f(c, A, N * KD);
    ly->v = carve_f(c, A, N * KD);
    ly->att = carve_f(c, A, N * QD);
    ly->lse = carve_f(c, A, N * (size_t)m->H);
    ly->x_mid = carve_f(c, A, Nr * D);
    ly->h_mlp_n = carve_f(c, A, Nr * D);
    ly->rstd_mlp = carve_f(c, A, Nr);
    if (!moe) {
        ly->h_mlp = m->sp ? carve_f(c, A, N * D) : ly->h_mlp_n;
        ly->mg = carve_f(c, A, N * (size_t)m->F);
        ly->mu = carve_f(c, A, N * (size_t)m->F);
        return;
    }
    /* the experts see Nm rows: SP or one rank: all of h_mlp_n; TP without SP: our slice of it */
    ly->h_mlp = (tp && !m->sp && ly->h_mlp_n) ? ly->h_mlp_n + (size_t)m->row0 * D : ly->h_mlp_n;
    ly->probs = carve_f(c, A, Nm * E);
    ly->rlse = carve_f(c, A, Nm);
    ly->topk = carve_i(c, A, Nm * k);
    ly->gates = carve_f(c, A, Nm * k);
    ly->pos = carve_i(c, A, Nm * k);
    ly->src_row = carve_i(c, A, M);
    if (m->ep == 1) {
        ly->eg = carve_f(c, A, M * (size_t)m->Fe);
        ly->eu = carve_f(c, A, M * (size_t)m->Fe);
    }
    ly->ey = carve_f(c, A, M * D);
    if (m->Fs > 0) {
        ly->sgp = carve_f(c, A, Nm * (size_t)m->Fs);
        ly->sup = carve_f(c, A, Nm * (size_t)m->Fs);
    }
    ly->e_off = carve(c, O, (E + 1) * sizeof(int));
    ly->f_share = carve_f(c, O, (size_t)m->B * E);
    if (m->ep > 1) {
        /* dropless: every rank of the expert group may send all its M slots here */
        size_t cap = (size_t)m->ep * M;
        ly->r_cnt = carve(c, O, (size_t)m->ep * (size_t)m->Ee * sizeof(int));
        ly->rx = carve_f(c, A, cap * D);
        ly->eg = carve_f(c, A, cap * (size_t)m->Fe);   /* expert activations live on the receiving side */
        ly->eu = carve_f(c, A, cap * (size_t)m->Fe);
    }
}

/* Recompute: layer ly uses the shared internals of blk, keeping its own
 * identity (kind, parameters) and its saved input x_in. */
static void share_block(struct mt_layer *ly, const struct mt_layer *blk)
{
    struct mt_layer keep = *ly;
    *ly = *blk;
    ly->moe = keep.moe;
    ly->x_in = keep.x_in;
    ly->ln1 = keep.ln1; ly->wq = keep.wq; ly->wk = keep.wk; ly->wv = keep.wv; ly->wo = keep.wo;
    ly->qn = keep.qn; ly->kn = keep.kn; ly->ln2 = keep.ln2;
    ly->wg = keep.wg; ly->wu = keep.wu; ly->wd = keep.wd;
    ly->router = keep.router; ly->experts = keep.experts;
    ly->sg = keep.sg; ly->su = keep.su; ly->sd = keep.sd;
    ly->r_rows = 0;
}

/* Carve every buffer. With NULL bases only the offsets (sizes) advance;
 * m->params / m->layers may be NULL then (param sizes come from the registry).
 *
 * Activations per microbatch slot: idx, targets, x_final (the stage output)
 * and, on the last stage, the head's h_final, rstd_final, logits, losses,
 * xlse; per layer x_in and the block internals. With recompute=block a slot
 * keeps only x_in per layer: every layer of every slot points its internals
 * at ONE shared set (one dense-block set if the stage has A blocks, one MoE
 * set if it has E blocks), which forward overwrites layer by layer and
 * backward refills by re-running the block's forward (mt_model_backward_stage). */
static void model_layout(struct mt_model *m, struct carver *c)
{
    /* m->slots[k].layers NULL (plan): carve into dummies, only the offsets matter */
    const size_t N = (size_t)m->N, D = (size_t)m->D, QD = (size_t)m->QD, KD = (size_t)m->KD;
    const size_t Nr = (size_t)m->Nr, Nm = (size_t)m->Nm;
    const size_t E = (size_t)m->E, k = (size_t)m->top_k, M = (size_t)m->M;
    const enum mt_bucket A = MT_BUCKET_ACTS, W = MT_BUCKET_WORKSPACE, O = MT_BUCKET_OTHER;
    const int tp = m->tp > 1;

    /* parameters, then grads, in registry order (plan_bytes carves them
     * itself from the registry, before calling this with params == NULL) */
    if (m->params && !m->external_params) {
        for (int i = 0; i < m->n_params; i++) {
            m->params[i].data = carve_f(c, MT_BUCKET_PARAMS, m->params[i].numel);
            m->params[i].grad = carve_f(c, MT_BUCKET_GRADS, m->params[i].numel);
        }
    }

    m->rope_cos = carve_f(c, W, (size_t)m->T * (size_t)(m->hd / 2));
    m->rope_sin = carve_f(c, W, (size_t)m->T * (size_t)(m->hd / 2));

    /* recompute: the shared internals, carved once */
    struct mt_layer blk[2];   /* [0] dense block, [1] MoE block */
    memset(blk, 0, sizeof blk);
    if (m->recompute) {
        int has[2] = {0, 0};
        for (int l = m->l0; l < m->l1; l++) has[layer_is_moe(&m->cfg, l)] = 1;
        for (int b = 0; b < 2; b++)
            if (has[b]) carve_block(m, c, &blk[b], b);
    }

    for (int sl = 0; sl < m->n_slots; sl++) {
    struct mt_slot dslot;
    memset(&dslot, 0, sizeof dslot);
    struct mt_slot *S = m->slots[sl].layers ? &m->slots[sl] : &dslot;
    S->idx = carve_i(c, A, N);
    S->targets = carve_i(c, A, N);
    S->x_final = carve_f(c, A, Nr * D);
    if (m->last) {
        S->h_final = carve_f(c, A, Nr * D);
        S->rstd_final = carve_f(c, A, Nr);
        S->logits = carve_f(c, A, Nr * (size_t)m->V);
        S->losses = carve_f(c, A, Nr);
        S->xlse = carve_f(c, A, Nr);
    }

    for (int l = m->l0; l < m->l1; l++) {
        struct mt_layer dummy;
        struct mt_layer *ly = S->layers ? &S->layers[l] : &dummy;
        memset(&dummy, 0, sizeof dummy);
        int moe = layer_is_moe(&m->cfg, l);
        ly->x_in = carve_f(c, A, Nr * D);
        if (m->recompute) share_block(ly, &blk[moe]);
        else carve_block(m, c, ly, moe);
    }
    }

    /* activation-gradient scratch, shared by all layers */
    size_t ff = 0;
    if (m->any_dense && N * (size_t)m->F > ff) ff = N * (size_t)m->F;
    if (m->any_moe && (size_t)m->ep * M * (size_t)m->Fe > ff) ff = (size_t)m->ep * M * (size_t)m->Fe;
    if (m->any_moe && Nm * (size_t)m->Fs > ff) ff = Nm * (size_t)m->Fs;
    m->dx = carve_f(c, W, Nr * D);
    m->dh = carve_f(c, W, N * D);
    if (tp) {
        m->s_full = carve_f(c, W, N * D);
        m->s_red = carve_f(c, W, N * D);
    }
    m->datt = carve_f(c, W, N * QD);
    m->dq = carve_f(c, W, N * QD);
    m->dk = carve_f(c, W, N * KD);
    m->dk2 = carve_f(c, W, N * KD);
    m->dv = carve_f(c, W, N * KD);
    m->s_act = carve_f(c, W, ff);
    m->s_dact = carve_f(c, W, ff);
    m->s_dg = carve_f(c, W, ff);
    m->s_du = carve_f(c, W, ff);
    if (m->any_moe) {
        m->s_xp = carve_f(c, W, M * D);
        m->s_dxp = carve_f(c, W, M * D);
        m->s_dy = carve_f(c, W, M * D);
        if (m->ep > 1) {
            m->s_ry = carve_f(c, W, (size_t)m->ep * M * D);
            m->s_rdy = carve_f(c, W, (size_t)m->ep * M * D);
            m->s_rdx = carve_f(c, W, (size_t)m->ep * M * D);
        }
        m->moe_load = (double *)carve(c, O, (size_t)m->L * E * sizeof(double));
        m->h_a2a = carve(c, O, 4 * (size_t)m->ep * sizeof(size_t));
        m->h_ecnt = carve(c, O, 2 * E * sizeof(int64_t));
        m->s_drl = carve_f(c, W, Nm * E);
        m->s_dprobs = carve_f(c, W, Nm * E);
        m->s_dgates = carve_f(c, W, Nm * k);
        m->s_dlse = carve_f(c, W, Nm);
        m->h_probs = carve_f(c, O, Nm * E);
        m->h_dprobs = carve_f(c, O, Nm * E);
        m->h_rlse = carve_f(c, O, Nm);
        m->h_dlse = carve_f(c, O, Nm);
        m->h_topk = carve_i(c, O, Nm * k);
        m->h_pos = carve_i(c, O, Nm * k);
        m->h_src = carve_i(c, O, M);
        m->h_cnt = carve(c, O, E * sizeof(int));
        m->h_seq = carve(c, O, (size_t)m->B * E * 2 * sizeof(double));
    }
    m->h_losses = carve_f(c, O, Nr);
}

struct plan_visit { struct carver *c; };

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
    mt_model_plan_bytes_par(cfg, B, flags, NULL, bytes);
}

void mt_model_plan_bytes_par(const struct mt_config *cfg, int B, int flags, const struct mt_model_par *par,
                             size_t bytes[MT_BUCKET_COUNT])
{
    struct mt_model m;
    struct carver c;
    memset(&m, 0, sizeof m);
    memset(&c, 0, sizeof c);
    model_dims_par(&m, cfg, B, par);
    struct plan_visit pv = { &c };
    if (!(flags & MT_MODEL_EXTERNAL_PARAMS))
        build_params(&m, plan_param, &pv);   /* same carves as the params loop of model_layout */
    model_layout(&m, &c);                /* params == NULL: the registry branch carves nothing */
    for (int b = 0; b < MT_BUCKET_COUNT; b++) bytes[b] = c.off[b];
    /* host bookkeeping arrays allocated by create next to the OTHER arena */
    bytes[MT_BUCKET_OTHER] += (size_t)model_n_params(&m) * sizeof(struct mt_param)
                              + (size_t)m.n_slots * (size_t)m.L * sizeof(struct mt_layer) + sizeof(struct mt_model);
}

/* ------------------------------------------------------------------ */
/* create / destroy                                                    */
/* ------------------------------------------------------------------ */

/* Every rule create enforces beyond the shapes (check_dims): degrees the
 * model supports and divisibility. Communicators are required only when
 * the model will run (not for a MT_MODEL_NO_ALLOC plan). */
static enum mt_status check_par(struct mt_ctx *ctx, const struct mt_model *m)
{
    /* without an E block the expert axis is extra data parallelism (SPEC.md
     * section 2): nothing of the model is split over it */
    if (m->any_moe && m->ep > MT_MAX_EP)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: ep=%d above the supported %d", m->ep, MT_MAX_EP);
    if (m->any_moe && m->ep > 1 && ((!m->ep_comm && !m->no_alloc) || m->E % m->ep != 0))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: ep=%d needs the expert group and n_experts %% ep == 0 "
                            "(n_experts=%d)", m->ep, m->E);
    if (m->tp > 1 && ((!m->tp_comm && !m->no_alloc) || (m->N % m->tp) != 0))
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: tp=%d needs the model group and B*T %% tp == 0 (B*T=%d)",
                            m->tp, m->N);
    if (m->n_slots > MT_MAX_SLOTS)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "model: %d activation slots above the supported %d", m->n_slots,
                            MT_MAX_SLOTS);
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
    ops->copy_from_host(cos_dev, host, (size_t)tmax * h2 * sizeof(float));
    ops->copy_from_host(sin_dev, host + (size_t)tmax * h2, (size_t)tmax * h2 * sizeof(float));
}

enum mt_status model_rope_build(struct mt_ctx *ctx, const struct mt_model *m, float *cos_dev, float *sin_dev, int tmax)
{
    float *host = mt_alloc(ctx, (size_t)2 * tmax * (m->hd / 2) * sizeof(float), MT_BUCKET_WORKSPACE);
    if (!host) return MT_ERR_OOM;
    double theta = m->cfg.rope_theta > 0 ? (double)m->cfg.rope_theta : 10000.0;
    rope_tables(ctx, m->ops, cos_dev, sin_dev, tmax, m->hd, theta, host);
    mt_free(ctx, host);
    return MT_OK;
}

void mt_model_destroy(struct mt_ctx *ctx, struct mt_model *m)
{
    if (!m) return;
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        if (!m->arena[b]) continue;
        if (b == MT_BUCKET_OTHER) mt_free(ctx, m->arena[b]);
        else m->ops->buf_free(ctx, m->arena[b]);
    }
    mt_free(ctx, m->params);
    for (int k = 0; k < m->n_slots && k < MT_MAX_SLOTS; k++) mt_free(ctx, m->slots[k].layers);
    mt_free(ctx, m);
}

static void bind_layer_params(struct mt_model *m, struct mt_layer *layers)
{
    struct mt_param *p = m->params;
    int i = 0;
    m->wte = m->first ? &p[i++] : NULL;
    for (int l = m->l0; l < m->l1; l++) {
        struct mt_layer *ly = &layers[l];
        ly->moe = layer_is_moe(&m->cfg, l);
        ly->ln1 = &p[i++];
        ly->wq = &p[i++];
        ly->wk = &p[i++];
        ly->wv = &p[i++];
        ly->wo = &p[i++];
        ly->qn = &p[i++];
        ly->kn = &p[i++];
        ly->ln2 = &p[i++];
        if (!ly->moe) {
            ly->wg = &p[i++];
            ly->wu = &p[i++];
            ly->wd = &p[i++];
            continue;
        }
        ly->router = &p[i++];
        ly->experts = &p[i];
        i += 3 * m->Ee;
        if (m->Fs > 0) {
            ly->sg = &p[i++];
            ly->su = &p[i++];
            ly->sd = &p[i++];
        }
    }
    m->norm_f = m->last ? &p[i++] : NULL;
    m->lm_head = m->last ? &p[i++] : NULL;
    MT_ASSERT(i == m->n_params);
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
    m->external_params = (flags & (MT_MODEL_EXTERNAL_PARAMS | MT_MODEL_NO_ALLOC)) != 0;
    /* test-only: MT_TEST_FORCE_ROUTING=1 sends every token to experts 0..top_k-1
     * (so that some expert ranks receive no token at all) */
    const char *fr = getenv("MT_TEST_FORCE_ROUTING");
    m->force_route = fr && atoi(fr) == 1;

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
        m->wte = m->first ? &m->params[0] : NULL;
        *out = m;
        return MT_OK;
    }
    for (int k = 0; k < m->n_slots; k++) {
        m->slots[k].layers = mt_alloc(ctx, (size_t)m->L * sizeof(struct mt_layer), MT_BUCKET_OTHER);
        if (!m->slots[k].layers) { rc = MT_ERR_OOM; goto fail; }
        memset(m->slots[k].layers, 0, (size_t)m->L * sizeof(struct mt_layer));
    }
    s.arr = m->params;
    s.n = 0;
    build_params(m, sink_param, &s);
    for (int k = 0; k < m->n_slots; k++) bind_layer_params(m, m->slots[k].layers);

    /* pass 1: sizes; pass 2: carve from the arenas */
    struct carver c;
    memset(&c, 0, sizeof c);
    model_layout(m, &c);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        if (c.off[b] == 0) continue;
        m->arena_bytes[b] = c.off[b];
        m->arena[b] = b == MT_BUCKET_OTHER ? mt_alloc(ctx, c.off[b], (enum mt_bucket)b)
                                           : ops->buf_alloc(ctx, c.off[b], (enum mt_bucket)b);
        if (!m->arena[b]) { rc = MT_ERR_OOM; goto fail; }
    }
    struct carver c2;
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

void mt_model_ep_stats(const struct mt_model *m, struct mt_ep_stats *out) { *out = m->ep_stats; }
const double *mt_model_moe_load(const struct mt_model *m) { return m->moe_load; }
void mt_model_moe_load_reset(struct mt_model *m)
{
    if (m->moe_load) memset(m->moe_load, 0, (size_t)m->L * (size_t)m->E * sizeof(double));
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

void mt_model_zero_grad(struct mt_model *m)
{
    if (m->arena[MT_BUCKET_GRADS])
        m->ops->fill(m->arena[MT_BUCKET_GRADS], 0.0f, m->arena_bytes[MT_BUCKET_GRADS] / sizeof(float));
}

/* ------------------------------------------------------------------ */
/* init                                                                */
/* ------------------------------------------------------------------ */

/* element (i, j) of the owned box has global index (off0+i)*shape1 + off1+j;
 * value = init_std * normal(seed, xxh64(name), index), in double, rounded once. */
void model_param_fill(const struct mt_param *p, uint64_t seed, float *out_host)
{
    uint64_t stream = mt_rng_stream(p->name);
    for (int64_t i = 0; i < p->len[0]; i++) {
        for (int64_t j = 0; j < p->len[1]; j++) {
            size_t li = (size_t)i * (size_t)p->len[1] + (size_t)j;
            uint64_t gi = (uint64_t)(p->off[0] + i) * (uint64_t)p->shape[1] + (uint64_t)(p->off[1] + j);
            switch (p->init) {
            case MT_INIT_NORMAL: out_host[li] = (float)((double)p->init_std * mt_rng_normal(seed, stream, gi)); break;
            case MT_INIT_ONES:   out_host[li] = 1.0f; break;
            default:             out_host[li] = 0.0f; break;
            }
        }
    }
}

void mt_model_param_values(const struct mt_param *p, uint64_t seed, float *out_host)
{
    model_param_fill(p, seed, out_host);
}

enum mt_status mt_model_init_params(struct mt_ctx *ctx, struct mt_model *m, uint64_t seed)
{
    size_t maxn = 1;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].numel > maxn) maxn = m->params[i].numel;
    float *host = mt_alloc(ctx, maxn * sizeof(float), MT_BUCKET_WORKSPACE);
    if (!host) return MT_ERR_OOM;
    for (int i = 0; i < m->n_params; i++) {
        struct mt_param *p = &m->params[i];
        if (!p->data) continue;   /* external storage this rank does not hold */
        model_param_fill(p, seed, host);
        m->ops->copy_from_host(p->data, host, p->numel * sizeof(float));
    }
    mt_free(ctx, host);
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* counts                                                              */
/* ------------------------------------------------------------------ */

int mt_model_registry(const struct mt_config *cfg, struct mt_param *out, int cap)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
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
    size_t inactive = 0;
    for (int l = 0; l < m.L; l++)
        if (layer_is_moe(cfg, l))
            inactive += (size_t)(m.E - m.top_k) * 3 * (size_t)m.D * (size_t)m.Fe;
    if (total) *total = s.numel;
    if (active) *active = s.numel - inactive;
}

/* 6 * (matmul params active per token, wte excluded: it is a lookup)
 * + 12 * L * T * H * hd (attention scores and values, PaLM/nanochat convention). */
double mt_model_flops_per_token(const struct mt_config *cfg)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    double D = m.D, mm = (double)m.V * D; /* lm_head */
    for (int l = 0; l < m.L; l++) {
        mm += D * (2.0 * m.QD + 2.0 * m.KD);
        if (layer_is_moe(cfg, l))
            mm += (double)m.E * D + (double)m.top_k * 3.0 * D * m.Fe + 3.0 * D * m.Fs;
        else
            mm += 3.0 * D * m.F;
    }
    return 6.0 * mm + 12.0 * m.L * (double)m.T * m.H * m.hd;
}

/* ------------------------------------------------------------------ */
/* forward / backward                                                  */
/* ------------------------------------------------------------------ */

enum mt_status model_ffn_forward(struct mt_ctx *ctx, struct mt_model *m, struct mt_layer *ly, float *x_out,
                                 int B, int T, int want_loss, double *aux, double *z)
{
    const struct mt_ops_i *ops = m->ops;
    const int n = B * T, D = m->D;
    const int Nr = m->sp ? n / m->tp : n;
    ops->rmsnorm_forward(ly->h_mlp_n, ly->rstd_mlp, ly->x_mid, ly->ln2->data, Nr, D, m->cfg.norm_eps);
    ops->copy(x_out, ly->x_mid, (size_t)Nr * D * sizeof(float));
    if (ly->moe) {
        double a = 0, zz = 0;
        if (m->tp > 1 && !m->sp) {
            /* MoE in the SP region without SP: our Nm rows, then gather every rank's output */
            ops->fill(m->s_red, 0.0f, (size_t)m->Nm * D);
            MT_CHECK(moe_forward(ctx, m, ly, m->s_red, m->Nm, want_loss, &a, &zz));
            MT_CHECK(tp_gather_rows(ctx, m, m->s_full, m->s_red, m->Nm, D));
            ops->axpby(x_out, m->s_full, 1.0f, 1.0f, (size_t)n * D);
        } else {
            MT_CHECK(moe_forward(ctx, m, ly, x_out, m->tp > 1 ? m->Nm : n, want_loss, &a, &zz));
        }
        *aux += a;
        *z += zz;
    } else if (m->tp == 1) {
        mlp_forward(ops, x_out, 1, ly->mg, ly->mu, m->s_act, ly->h_mlp,
                    ly->wg->data, ly->wu->data, ly->wd->data, n, D, m->F);
    } else {
        /* TP region: this rank's F/tp hidden units over all N rows */
        if (m->sp) MT_CHECK(tp_gather_rows(ctx, m, ly->h_mlp, ly->h_mlp_n, Nr, D));
        mlp_forward(ops, m->s_red, 0, ly->mg, ly->mu, m->s_act, ly->h_mlp,
                    ly->wg->data, ly->wu->data, ly->wd->data, n, D, m->F);
        MT_CHECK(tp_exit_add(ctx, m, x_out, m->s_red, m->s_full));
    }
    return MT_OK;
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
    m->rstd_final = S->rstd_final;
    m->logits = S->logits;
    m->losses = S->losses;
    m->xlse = S->xlse;
    m->layers = S->layers;
    m->norm = S->norm;
    m->have_fwd = S->have_fwd;
    m->have_targets = S->have_targets;
    m->cur_slot = k;
}

int mt_model_n_slots(const struct mt_model *m) { return m->n_slots; }
int mt_model_stage_rows(const struct mt_model *m) { return m->Nr; }
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
    if (out) memset(out, 0, sizeof *out);
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
    if (idx) ops->copy_from_host(m->idx, idx, (size_t)N * sizeof(int32_t));
    if (targets) ops->copy_from_host(m->targets, targets, (size_t)N * sizeof(int32_t));

    /* under SP the embedding and the head see this rank's Nr rows only */
    const int r0 = m->sp ? m->row0 : 0;
    if (m->first) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, 0));
        ops->embed_forward(m->layers[m->l0].x_in, m->idx + r0, m->wte->data, m->Nr, m->D);
    } else {
        ops->copy(m->layers[m->l0].x_in, x_in, (size_t)m->Nr * m->D * sizeof(float));
    }
    double aux = 0, z = 0;
    for (int l = m->l0; l < m->l1; l++) {
        struct mt_layer *ly = &m->layers[l];
        float *x_out = l + 1 < m->l1 ? m->layers[l + 1].x_in : m->x_final;
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, 1 + l));
        MT_CHECK(attention_forward(ctx, m, ly, m->B, m->T, 0, m->rope_cos, m->rope_sin, NULL, NULL));
        MT_CHECK(model_ffn_forward(ctx, m, ly, x_out, m->B, m->T, targets != NULL, &aux, &z));
    }
    double lm = 0;
    if (targets) m->norm = *norm;   /* the head's fused cross-entropy needs dscale now */
    if (m->last) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_forward, m->L + 1));
        lm = head_forward(m, m->Nr, targets != NULL);
        /* TP without SP: every model rank computed the same whole-batch loss; count it once */
        if (m->tp > 1 && !m->sp && m->tp_rank != 0) lm = 0.0;
    }
    if (targets) {
        m->norm = *norm;
        if (out) {
            out->lm = norm->n_targets > 0 ? lm / norm->n_targets : 0.0;
            out->aux = norm->n_sequences > 0 ? aux / norm->n_sequences : 0.0;
            out->z = norm->n_tokens > 0 ? z / norm->n_tokens : 0.0;
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
    double aux = 0, z = 0;
    MT_CHECK(attention_forward(ctx, m, ly, m->B, m->T, 0, m->rope_cos, m->rope_sin, NULL, NULL));
    MT_CHECK(model_ffn_forward(ctx, m, ly, m->dh, m->B, m->T, 1, &aux, &z));
    if (ly->moe && m->moe_load) {
        double *load = m->moe_load + (size_t)l * (size_t)m->E;
        for (int e = 0; e < m->E; e++) load[e] -= ly->e_off[e + 1] - ly->e_off[e];
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
    const int N = m->N, D = m->D;
    if (!m->have_fwd || !m->have_targets)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                            "model backward: needs a preceding forward with targets (and at most one backward per forward)");
    if (!m->last && !dy_out)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "model backward: a stage before the last needs d(output)");
    m->have_fwd = 0;   /* logits will hold dlogits: no second backward of this forward */
    if (m->last) {
        float dscale = m->norm.n_targets > 0 ? (float)(1.0 / m->norm.n_targets) : 0.0f;
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, m->L + 1));
        head_backward(m, dscale);                   /* dx = d x_final */
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, m->L + 1));
    } else {
        ops->copy(m->dx, dy_out, (size_t)m->Nr * D * sizeof(float));
    }
    for (int l = m->l1 - 1; l >= m->l0; l--) {
        struct mt_layer *ly = &m->layers[l];
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, 1 + l));
        if (m->recompute) MT_CHECK(block_recompute(ctx, m, ly, l));
        /* ffn branch: dx is d x_out = d x_mid (identity) + d branch */
        const float *dhr = m->dh;                   /* d h_mlp_n (Nr, D) */
        if (ly->moe) {
            int tp_nosp = m->tp > 1 && !m->sp;      /* our Nm rows of a whole dx */
            MT_CHECK(moe_backward(ctx, m, ly, m->dh, m->dx + (tp_nosp ? (size_t)m->row0 * D : 0), &m->norm));
            if (tp_nosp) {
                MT_CHECK(tp_gather_rows(ctx, m, m->s_full, m->dh, m->Nm, D));
                dhr = m->s_full;
            }
        } else if (m->tp == 1) {
            mlp_backward(ops, m->dh, 0, ly->wg->grad, ly->wu->grad, ly->wd->grad,
                         m->s_act, m->s_dact, m->s_dg, m->s_du, m->dx, ly->h_mlp, ly->mg, ly->mu,
                         ly->wg->data, ly->wu->data, ly->wd->data, N, D, m->F);
        } else {
            /* TP region: conjugate of the exit (SP: gather d rows), then of the entry */
            const float *dy = m->dx;
            if (m->sp) {
                MT_CHECK(tp_gather_rows(ctx, m, m->s_full, m->dx, m->Nr, D));
                dy = m->s_full;
            }
            mlp_backward(ops, m->dh, 0, ly->wg->grad, ly->wu->grad, ly->wd->grad,
                         m->s_act, m->s_dact, m->s_dg, m->s_du, dy, ly->h_mlp, ly->mg, ly->mu,
                         ly->wg->data, ly->wu->data, ly->wd->data, N, D, m->F);
            if (m->sp) {
                MT_CHECK(tp_reduce_scatter_rows(ctx, m, m->s_red, m->dh, m->Nr, D));
                dhr = m->s_red;
            } else {
                MT_CHECK(tp_allreduce(ctx, m, m->dh, (size_t)N * D));
            }
        }
        ops->rmsnorm_backward(m->dx, ly->ln2->grad, dhr, ly->x_mid, ly->ln2->data, ly->rstd_mlp, m->Nr, D, 1);
        MT_CHECK(attention_backward(ctx, m, ly));   /* dx: d x_mid -> d x_in */
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, 1 + l));
    }
    if (m->first) {
        MT_CHECK(hook(ctx, m, m->hooks.pre_backward, 0));
        ops->embed_backward(m->wte->grad, m->dx, m->idx + (m->sp ? m->row0 : 0), m->Nr, D, m->V);
        MT_CHECK(hook(ctx, m, m->hooks.post_backward, 0));
    }
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* pipeline split                                                      */
/* ------------------------------------------------------------------ */

/* FLOPs per token of one block (6 x matmul params active + attention), as
 * mt_model_flops_per_token counts them. */
static double block_flops(const struct mt_model *m, int l)
{
    double D = m->D, mm = D * (2.0 * m->QD + 2.0 * m->KD);
    if (layer_is_moe(&m->cfg, l)) mm += (double)m->E * D + (double)m->top_k * 3.0 * D * m->Fe + 3.0 * D * m->Fs;
    else mm += 3.0 * D * m->F;
    return 6.0 * mm + 12.0 * (double)m->T * m->H * m->hd;
}

double mt_model_stage_flops(const struct mt_config *cfg, int layer0, int layer1)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    double f = 0;
    for (int l = layer0; l < layer1; l++) f += block_flops(&m, l);
    if (layer1 == m.L) f += 6.0 * (double)m.V * m.D;   /* head */
    return f;
}

/*
 * Contiguous split minimising the largest stage cost: dynamic programming
 * over (layers done, stages used), O(pp L^2), exact. Among equal splits the
 * earliest cut wins (fewer layers on earlier stages, which keep more
 * microbatches in flight under 1F1B).
 */
enum mt_status mt_model_pipeline_split(struct mt_ctx *ctx, const struct mt_config *cfg, int pp, int *first)
{
    struct mt_model m;
    memset(&m, 0, sizeof m);
    model_dims(&m, cfg, 1);
    const int L = m.L;
    if (pp < 1 || L < pp) return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh contract: n_layer >= pp (n_layer=%d, pp=%d)", L, pp);
    const size_t W = (size_t)L + 1;
    double *pre = mt_alloc(ctx, W * sizeof(double), MT_BUCKET_OTHER);
    double *best = mt_alloc(ctx, (size_t)(pp + 1) * W * sizeof(double), MT_BUCKET_OTHER);
    int *cut = mt_alloc(ctx, (size_t)(pp + 1) * W * sizeof(int), MT_BUCKET_OTHER);
    if (!pre || !best || !cut) {
        mt_free(ctx, pre);
        mt_free(ctx, best);
        mt_free(ctx, cut);
        return MT_ERR_OOM;
    }
    pre[0] = 0;
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + block_flops(&m, l);
    const double head = 6.0 * (double)m.V * m.D, INF = 1e300;
    /* best[s][j]: the least max cost placing layers [0, j) on stages [0, s) */
    for (size_t i = 0; i < (size_t)(pp + 1) * W; i++) { best[i] = INF; cut[i] = -1; }
    best[0] = 0;
    for (int s = 1; s <= pp; s++)
        for (int j = s; j <= L - (pp - s); j++)
            for (int i = s - 1; i < j; i++) {
                double prev = best[(size_t)(s - 1) * W + i];
                if (prev >= INF) continue;
                double c = pre[j] - pre[i] + (s == pp ? head : 0.0);
                double v = prev > c ? prev : c;
                if (v < best[(size_t)s * W + j] * (1 - 1e-12)) { best[(size_t)s * W + j] = v; cut[(size_t)s * W + j] = i; }
            }
    first[pp] = L;
    for (int s = pp, j = L; s >= 1; s--) {
        first[s - 1] = cut[(size_t)s * W + j];
        j = first[s - 1];
    }
    mt_free(ctx, pre);
    mt_free(ctx, best);
    mt_free(ctx, cut);
    return MT_OK;
}
