/*
 * blocks.c — the block-kind table bound to its pieces, and the walks every
 * consumer shares (registry, FLOPs, communication counts).
 *
 * The rows come from mt_block_kinds.def; block_traits.c answers the
 * questions that need no piece (which kind is layer l, is it routed), so
 * that no other file spells a letter. Invariant: the order of kinds is the
 * value struct mt_layer.kind holds; letters are unique.
 */
#include "model_impl.h"

#include <stdio.h>
#include <string.h>

const struct mt_block_wrap mt_block_wrap_none = { .name = "none" };

/* each line's wrapper, declared from the table (mod.c's, a test's) */
#define MT_STEP(piece, resid)
#define MT_BLOCK_KIND(letter, name, routed, hf, wrap, ...) extern const struct mt_block_wrap mt_block_wrap_##wrap;
#include "mt_block_kinds.def"
#undef MT_BLOCK_KIND
#undef MT_STEP

/* A line's steps: MT_STEP(piece, resid) in the order given; n_steps is the
 * count of them (the initializer list's length, counted by a sizeof). */
#define MT_STEP(piece, resid) {&mt_piece_##piece, MT_RESID_##resid}
#define MT_N_STEPS(...) ((int)(sizeof((struct mt_block_step[]){__VA_ARGS__}) / sizeof(struct mt_block_step)))
static const struct mt_block_kind kinds[] = {
#define MT_BLOCK_KIND(letter, name, routed, hf, wrap, ...) \
    {letter, name, routed, hf, &mt_block_wrap_##wrap, MT_N_STEPS(__VA_ARGS__), {__VA_ARGS__}},
#include "mt_block_kinds.def"
#undef MT_BLOCK_KIND
};
#undef MT_STEP

const struct mt_block_kind *mt_blocks_kind(int index) { return &kinds[index]; }

int mt_blocks_piece_index(const struct mt_piece *p)
{
    const struct mt_piece *seen[MT_MAX_PIECES];
    int n = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int h = 0; h < kinds[k].n_steps; h++) {
            const struct mt_piece *q = kinds[k].steps[h].piece;
            int i = 0;
            while (i < n && seen[i] != q) i++;
            if (i == n) {
                MT_ASSERT(n < MT_MAX_PIECES);
                seen[n++] = q;
            }
            if (q == p) return i;
        }
    return -1;
}

const char *mt_layout_name(enum mt_layout l)
{
    static const char *const names[MT_LAYOUT_COUNT] = {"residual", "tp_rows", "tp_cols", "model_partial", "expert"};
    return (unsigned)l < MT_LAYOUT_COUNT ? names[l] : "?";
}

void mt_blocks_shape(const struct mt_config *cfg, struct mt_block_shape *s)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->D = cfg->d_model;
    s->T = cfg->seq_len;
    s->L = cfg->n_layer;
    s->ep = 1;
    s->scan_bf16 = 1;
    s->moe_dev_sizes = 1;
}

/*
 * LoRA adapters as registry entries (docs/lora.md). After a piece's own
 * parameters, a second walk of its declarations emits, for every targeted
 * base matrix W (out, in), A (r, in) and B (out, r), named like W with
 * ".weight" -> ".lora_A.weight" / ".lora_B.weight". Their layout classes
 * carry the TP rule (the layer math needs none):
 *   W tp_rows (column-parallel, rows split): A whole, its grad a partial sum
 *     over the model group (model_partial); B rows split like W (tp_rows);
 *   W tp_cols (row-parallel, columns split): A columns split (tp_cols);
 *     B whole, grad partial over the model group (model_partial);
 *   W expert: both expert (whole, with their expert's rank).
 * The router and the shared expert are never targets. A target with a
 * shared A (the Mamba-3 in-projection's seven row blocks: one adapter on the
 * stacked Win) emits its A once, named after the stack ("mixer.in_proj"),
 * before the first block's B; each block has its own B (its rows of the
 * stacked B). The model binds each B to the nearest A before it.
 */
struct lora_walk {
    mt_pspec_fn fn;
    void       *user;
    unsigned    mask;
    int         r;
    const char *shared;   /* the shared A already emitted in this walk, or NULL */
};

struct lora_target {
    const char *suffix;   /* the base matrix' suffix, or its prefix when prefix != 0 */
    unsigned    bit;
    int         prefix;
    const char *shared;   /* the shared A's name (without ".lora_A.weight"), or NULL */
};

static const struct lora_target *lora_target_of(const struct mt_pspec *b)
{
    static const struct lora_target t[] = {
        {"self_attn.q_proj.weight", MT_LORA_Q, 0, NULL},   {"self_attn.k_proj.weight", MT_LORA_K, 0, NULL},
        {"self_attn.v_proj.weight", MT_LORA_V, 0, NULL},   {"self_attn.o_proj.weight", MT_LORA_O, 0, NULL},
        {"mlp.gate_proj.weight", MT_LORA_GATE, 0, NULL},   {"mlp.up_proj.weight", MT_LORA_UP, 0, NULL},
        {"mlp.down_proj.weight", MT_LORA_DOWN, 0, NULL},
        {"mixer.in_proj_", MT_LORA_IN_PROJ, 1, "mixer.in_proj"},
        {"mixer.out_proj.weight", MT_LORA_OUT_PROJ, 0, NULL},
    };
    static const struct lora_target expert = {"", MT_LORA_EXPERT, 1, NULL};
    if (b->ndim != 2) return NULL;
    if (b->role == MT_ROLE_EXPERT) return &expert;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].prefix ? !strncmp(b->suffix, t[i].suffix, strlen(t[i].suffix)) : !strcmp(b->suffix, t[i].suffix))
            return &t[i];
    return NULL;
}

/* The layout classes of A and B for a base of layout l; -1: no rule (the
 * model refuses such a target at startup, mt_blocks_lora_rule). */
static int lora_layouts(enum mt_layout l, enum mt_layout *la, enum mt_layout *lb)
{
    switch (l) {
    case MT_LAYOUT_TP_ROWS: *la = MT_LAYOUT_MODEL_PARTIAL; *lb = MT_LAYOUT_TP_ROWS; return 0;
    case MT_LAYOUT_TP_COLS: *la = MT_LAYOUT_TP_COLS; *lb = MT_LAYOUT_MODEL_PARTIAL; return 0;
    case MT_LAYOUT_EXPERT:  *la = *lb = l; return 0;
    default:                *la = *lb = l; return -1;
    }
}

static void lora_emit(void *user, const struct mt_pspec *b)
{
    struct lora_walk *w = user;
    const struct lora_target *tg = lora_target_of(b);
    if (!tg || !(tg->bit & w->mask)) return;
    enum mt_layout la, lb;
    (void)lora_layouts(b->layout, &la, &lb);
    char sa[96], sb[96];
    size_t n = strlen(b->suffix) - strlen(".weight");
    snprintf(sb, sizeof sb, "%.*s.lora_B.weight", (int)n, b->suffix);
    if (tg->shared) snprintf(sa, sizeof sa, "%s.lora_A.weight", tg->shared);
    else snprintf(sa, sizeof sa, "%.*s.lora_A.weight", (int)n, b->suffix);
    const struct mt_pspec a = {sa, b->expert, 2, w->r, b->cols, MT_SCALE_LORA_A, b->role, la, -1};
    const struct mt_pspec bb = {sb, b->expert, 2, b->rows, w->r, MT_SCALE_ZEROS, b->role, lb, -1};
    if (!tg->shared || w->shared != tg->shared) w->fn(w->user, &a);
    w->shared = tg->shared;
    w->fn(w->user, &bb);
}

/* mt_blocks_lora_rule: the first targeted base tensor whose layout class has
 * no adapter rule (e.g. a replicated matrix whose gradient is a partial sum
 * over the model group: neither A nor B could be split or left whole
 * consistently), for the startup check. */
struct lora_rule_walk {
    unsigned    mask;
    const char *bad;
};

static void lora_rule_visit(void *user, const struct mt_pspec *b)
{
    struct lora_rule_walk *w = user;
    const struct lora_target *tg = lora_target_of(b);
    enum mt_layout la, lb;
    if (!w->bad && tg && (tg->bit & w->mask) && lora_layouts(b->layout, &la, &lb) != 0) w->bad = b->suffix;
}

static void piece_params(const struct mt_config *cfg, const struct mt_piece *pc, const struct mt_block_shape *s,
                         mt_pspec_fn fn, void *user)
{
    pc->params(s, fn, user);
    if (cfg->lora_rank <= 0) return;
    struct lora_walk w = { fn, user, 0, cfg->lora_rank, NULL };
    char bad[64];
    if (mt_config_lora_mask(cfg->lora_targets, &w.mask, bad, sizeof bad) != 0) return;   /* resolve refused it */
    pc->params(s, lora_emit, &w);
}

void mt_blocks_layer_step_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, int step,
                                 mt_pspec_fn fn, void *user)
{
    mt_blocks_kind_step_params(cfg, s, mt_blocks_layer_kind(cfg, l), step, fn, user);
}

void mt_blocks_kind_step_params(const struct mt_config *cfg, const struct mt_block_shape *s, int kind, int step,
                                mt_pspec_fn fn, void *user)
{
    piece_params(cfg, kinds[kind].steps[step].piece, s, fn, user);
}

void mt_blocks_layer_wrap_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, mt_pspec_fn fn,
                                 void *user)
{
    const struct mt_block_wrap *w = kinds[mt_blocks_layer_kind(cfg, l)].wrap;
    if (w->params) w->params(s, fn, user);
}

void mt_blocks_layer_params(const struct mt_config *cfg, const struct mt_block_shape *s, int l, mt_pspec_fn fn,
                            void *user)
{
    const int n = kinds[mt_blocks_layer_kind(cfg, l)].n_steps;
    mt_blocks_layer_wrap_params(cfg, s, l, fn, user);   /* the wrapper's (MoD's router) before the steps' */
    for (int i = 0; i < n; i++) mt_blocks_layer_step_params(cfg, s, l, i, fn, user);
}

const char *mt_blocks_lora_rule(const struct mt_config *cfg, unsigned mask)
{
    struct mt_block_shape s;
    mt_blocks_shape(cfg, &s);
    struct lora_rule_walk w = { mask, NULL };
    for (int l = 0; l < cfg->n_layer && !w.bad; l++) {
        const struct mt_block_kind *k = &kinds[mt_blocks_layer_kind(cfg, l)];
        for (int i = 0; i < k->n_steps; i++) k->steps[i].piece->params(&s, lora_rule_visit, &w);
    }
    return w.bad;
}

/* Rows of every T a kind's steps see: a wrapper's (struct mt_block_wrap.rows;
 * MoD: C of T) or T. The FLOPs, work and communication counts of a wrapped
 * kind are its steps' at sequence length rows, times rows / T per token. */
static int kind_rows(const struct mt_config *cfg, const struct mt_block_kind *k, int T)
{
    return k->wrap->rows ? k->wrap->rows(cfg, T) : T;
}

static void kind_comm(const struct mt_config *cfg, const struct mt_block_kind *k, struct mt_blocks_comm *out)
{
    /* a wrapped kind's steps move rows / T of the block's rows (MoD: B C of B T) */
    const double share = (double)kind_rows(cfg, k, cfg->seq_len) / (double)cfg->seq_len;
    for (int i = 0; i < k->n_steps; i++) {
        *(i == 0 ? &out->mixer_regions : &out->ffn_regions) += share * k->steps[i].piece->tp_regions;
        out->sp_gathers += share * k->steps[i].piece->sp_gathers;
    }
    out->routed += k->routed;
}

void mt_blocks_comm_counts(const struct mt_config *cfg, int l0, int l1, struct mt_blocks_comm *out)
{
    memset(out, 0, sizeof *out);
    for (int l = l0; l < l1; l++) kind_comm(cfg, &kinds[mt_blocks_layer_kind(cfg, l)], out);
    /* the MTP modules' blocks (mtp.c) run on the last stage, each a block of its kind */
    const int mk = cfg->mtp_depth > 0 ? mt_blocks_find(cfg->mtp_block[0]) : -1;
    for (int d = 0; l1 == cfg->n_layer && mk >= 0 && d < cfg->mtp_depth; d++) kind_comm(cfg, &kinds[mk], out);
}

void mt_blocks_layer_work(const struct mt_config *cfg, const struct mt_block_shape *s, int l, int rc,
                          struct mt_work *w)
{
    const struct mt_block_kind *k = &kinds[mt_blocks_layer_kind(cfg, l)];
    struct mt_block_shape in = *s;
    in.T = kind_rows(cfg, k, (int)s->T);
    if (in.T == s->T) {   /* every row: the pieces add into w directly (the plan's bits unchanged) */
        for (int i = 0; i < k->n_steps; i++)
            if (k->steps[i].piece->work_per_token) k->steps[i].piece->work_per_token(s, rc, w);
        return;
    }
    /* a wrapped kind: its steps' work at sequence length rows, times rows / T per token */
    struct mt_work wi;
    memset(&wi, 0, sizeof wi);
    for (int i = 0; i < k->n_steps; i++)
        if (k->steps[i].piece->work_per_token) k->steps[i].piece->work_per_token(&in, rc, &wi);
    const double share = (double)in.T / (double)s->T;
    for (int j = 0; j < MT_WORK_COUNT; j++) {
        w->f[j] += share * wi.f[j];
        w->e[j] += share * wi.e[j];
    }
    w->f_grouped += share * wi.f_grouped;
}

/* The sum over block l's steps of one of their per-token counts (a NULL
 * entry counts 0). */
enum step_count { STEP_MM, STEP_EXTRA, STEP_INACTIVE };

static double kind_sum(const struct mt_block_shape *s, int kind, enum step_count what)
{
    const struct mt_block_kind *k = &kinds[kind];
    double sum = 0.0;
    for (int i = 0; i < k->n_steps; i++) {
        const struct mt_piece *p = k->steps[i].piece;
        double (*f)(const struct mt_block_shape *) = what == STEP_MM      ? p->mm_per_token
                                                     : what == STEP_EXTRA ? p->extra_flops_per_token
                                                                          : p->inactive_params;
        sum += f ? f(s) : 0.0;
    }
    return sum;
}

/* Layer l's per-token sum: its kind's at sequence length kind_rows, times
 * rows / T (1 and exact for an unwrapped kind). */
static double layer_sum(const struct mt_config *cfg, const struct mt_block_shape *s, int l, enum step_count what)
{
    const int kind = mt_blocks_layer_kind(cfg, l);
    struct mt_block_shape in = *s;
    in.T = kind_rows(cfg, &kinds[kind], (int)s->T);
    return (double)in.T / (double)s->T * kind_sum(&in, kind, what);
}

double mt_blocks_layer_mm(const struct mt_config *cfg, const struct mt_block_shape *s, int l)
{
    const struct mt_block_wrap *w = kinds[mt_blocks_layer_kind(cfg, l)].wrap;
    return layer_sum(cfg, s, l, STEP_MM) + (w->mm_per_token ? w->mm_per_token(s) : 0.0);
}

double mt_blocks_layer_extra(const struct mt_config *cfg, const struct mt_block_shape *s, int l)
{
    return layer_sum(cfg, s, l, STEP_EXTRA);
}

double mt_blocks_layer_inactive(const struct mt_config *cfg, const struct mt_block_shape *s, int l)
{
    return kind_sum(s, mt_blocks_layer_kind(cfg, l), STEP_INACTIVE);
}

double mt_blocks_kind_flops(const struct mt_block_shape *s, int kind)
{
    return 6.0 * kind_sum(s, kind, STEP_MM) + kind_sum(s, kind, STEP_EXTRA);
}

/* FLOP counts are integers below 2^53 (a routed layer's rows/T share
 * aside): every sum here is exact, so the grouping (per piece, per layer)
 * cannot change a bit of the result. */
double mt_blocks_layer_flops(const struct mt_config *cfg, const struct mt_block_shape *s, int l)
{
    return 6.0 * mt_blocks_layer_mm(cfg, s, l) + mt_blocks_layer_extra(cfg, s, l);
}
