/*
 * test_blocks.c — the block-kind table (src/model/mt_blocks.h):
 *   1. letters: unique, found, unknown ones refused; the letters string.
 *   2. layout rules: mt_layout_split / mt_layout_reduce_model against a
 *      hand-written matrix for every (class, tp, sp).
 *   3. the registry under tp 2 (SP on and off): every parameter's box,
 *      split and reduce_model follow its layout class, and the parameters
 *      partial over the model group are exactly the ones SPEC.md names
 *      (qk-norm gains, router, experts, shared expert; plus gains,
 *      embedding and head under SP).
 *   4. FLOPs per token, active parameters and the planner's TP region
 *      counts equal the hand formulas for a mixed pattern.
 * Exit 1 on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_config.h"
#include "core/mt_core.h"
#include "model/mt_blocks.h"
#include "model/mt_model.h"

static int g_fail = 0;
#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            g_fail = 1;                                                     \
        }                                                                   \
    } while (0)

static void config(struct mt_ctx *ctx, struct mt_config *cfg, const char *pattern)
{
    mt_config_defaults(cfg);
    cfg->vocab_size = 50;
    cfg->n_layer = (int)strlen(pattern);
    cfg->d_model = 32;
    cfg->n_head = 4;
    cfg->n_kv_head = 2;
    cfg->mlp_hidden = 64;
    cfg->seq_len = 8;
    cfg->n_experts = 4;
    cfg->top_k = 2;
    cfg->expert_hidden = 16;
    cfg->shared_expert_hidden = 8;
    cfg->batch_size = 2;
    cfg->microbatches = 1;
    snprintf(cfg->pattern, sizeof cfg->pattern, "%s", pattern);
    if (mt_config_resolve(ctx, cfg, 1) != MT_OK) {
        fprintf(stderr, "config: %s\n", mt_ctx_last_error(ctx));
        exit(1);
    }
}

/* 1 */
static void test_letters(void)
{
    int n = mt_blocks_count();
    EXPECT(n >= 2 && n <= MT_MAX_BLOCK_KINDS, "kinds %d", n);
    for (int i = 0; i < n; i++) {
        EXPECT(mt_blocks_find(mt_blocks_kind(i)->letter) == i, "kind %d letter not unique", i);
        EXPECT(mt_blocks_kind(i)->mixer && mt_blocks_kind(i)->ffn, "kind %d has no pieces", i);
    }
    EXPECT(mt_blocks_find('A') >= 0 && mt_blocks_find('E') >= 0, "A and E in the table");
    EXPECT(mt_blocks_find('Z') < 0 && mt_blocks_find('\0') < 0, "unknown letters refused");
    EXPECT(strcmp(mt_blocks_letters(), "A, E") == 0, "letters '%s'", mt_blocks_letters());
    EXPECT(!mt_blocks_kind(mt_blocks_find('A'))->routed && mt_blocks_kind(mt_blocks_find('E'))->routed, "routed flags");
}

/* 2 */
static void test_layout_rules(void)
{
    /* reduce_model for tp 1, tp 2 without SP, tp 2 with SP */
    static const int want[MT_LAYOUT_COUNT][3] = {
        [MT_LAYOUT_RESIDUAL] = {0, 0, 1},
        [MT_LAYOUT_TP_ROWS] = {0, 0, 0},
        [MT_LAYOUT_TP_COLS] = {0, 0, 0},
        [MT_LAYOUT_MODEL_PARTIAL] = {0, 1, 1},
        [MT_LAYOUT_EXPERT] = {0, 1, 1},
    };
    for (int l = 0; l < MT_LAYOUT_COUNT; l++) {
        EXPECT(mt_layout_reduce_model((enum mt_layout)l, 1, 0) == want[l][0], "%s tp1", mt_layout_name(l));
        EXPECT(mt_layout_reduce_model((enum mt_layout)l, 2, 0) == want[l][1], "%s tp2", mt_layout_name(l));
        EXPECT(mt_layout_reduce_model((enum mt_layout)l, 2, 1) == want[l][2], "%s tp2 sp", mt_layout_name(l));
    }
    EXPECT(mt_layout_split(MT_LAYOUT_TP_ROWS) == MT_SPLIT_ROWS && mt_layout_split(MT_LAYOUT_TP_COLS) == MT_SPLIT_COLS &&
           mt_layout_split(MT_LAYOUT_EXPERT) == MT_SPLIT_NONE && mt_layout_split(MT_LAYOUT_RESIDUAL) == MT_SPLIT_NONE,
           "split of the layout classes");
}

/* the parameters SPEC.md section 2 makes partial over the model group */
static int want_partial(const char *name, int sp)
{
    int always = strstr(name, "q_norm") || strstr(name, "k_norm") || strstr(name, "mlp.gate.") ||
                 strstr(name, "experts.") || strstr(name, "shared_expert");
    int rows = strstr(name, "layernorm") || strstr(name, "model.norm") || strstr(name, "embed") ||
               strstr(name, "lm_head");
    return always || (sp && rows);
}

/* 3 */
static void test_registry_tp(int sp)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    config(&ctx, &cfg, "AEEA");
    struct mt_model_par par;
    memset(&par, 0, sizeof par);
    par.tp = 2;
    par.tp_rank = 1;
    par.sp = sp;
    struct mt_model *m = NULL;
    if (mt_model_create_par(&ctx, NULL, &cfg, cfg.batch_size, MT_MODEL_NO_ALLOC, &par, &m) != MT_OK) {
        fprintf(stderr, "create: %s\n", mt_ctx_last_error(&ctx));
        exit(1);
    }
    int n;
    struct mt_param *ps = mt_model_params(m, &n);
    int n_split = 0;
    for (int i = 0; i < n; i++) {
        const struct mt_param *p = &ps[i];
        enum mt_layout l = (enum mt_layout)p->layout;
        EXPECT(p->split == mt_layout_split(l), "%s: split %d, layout %s", p->name, (int)p->split, mt_layout_name(l));
        EXPECT(p->reduce_model == want_partial(p->name, sp), "%s (sp %d): reduce_model %d", p->name, sp,
               p->reduce_model);
        int d = p->split == MT_SPLIT_ROWS ? 0 : p->split == MT_SPLIT_COLS ? 1 : -1;
        for (int k = 0; k < 2; k++) {
            int64_t len = k == d ? p->shape[k] / 2 : p->shape[k], off = k == d ? len : 0;   /* tp_rank 1 */
            EXPECT(p->len[k] == len && p->off[k] == off, "%s: box dim %d", p->name, k);
        }
        n_split += d >= 0;
        EXPECT((p->role == MT_ROLE_EXPERT) == (l == MT_LAYOUT_EXPERT), "%s: expert role vs layout", p->name);
    }
    /* per A block q k v o gate up down, per E block q k v o */
    EXPECT(n_split == 2 * 7 + 2 * 4, "split parameters %d", n_split);
    mt_model_destroy(&ctx, m);
}

/* 4 */
static void test_counts(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    config(&ctx, &cfg, "AEEA");
    const double V = 50, D = 32, L = 4, T = 8, H = 4, K = 2, hd = 8, F = 64, E = 4, k = 2, Fe = 16, Fs = 8;
    double attn = D * (2 * H * hd + 2 * K * hd), dense = 3 * D * F, moe = E * D + k * 3 * D * Fe + 3 * D * Fs;
    double want = 6 * (V * D + 4 * attn + 2 * dense + 2 * moe) + L * 12 * T * H * hd;
    double got = mt_model_flops_per_token(&cfg);
    EXPECT(got == want, "flops/token %.17g, want %.17g", got, want);
    struct mt_block_shape s;
    mt_blocks_shape(&cfg, &s);
    EXPECT(mt_blocks_layer_flops(&cfg, &s, 1) == 6 * (attn + moe) + 12 * T * H * hd, "E block flops");
    EXPECT(mt_model_stage_flops(&cfg, 0, 1) == 6 * (attn + dense) + 12 * T * H * hd, "A stage flops");

    size_t total = 0, active = 0;
    mt_model_param_counts(&cfg, &total, &active);
    EXPECT(total - active == (size_t)(2 * (E - k) * 3 * D * Fe), "inactive %zu", total - active);
    int n = mt_model_registry(&cfg, NULL, 0);
    struct mt_param *ps = calloc((size_t)n, sizeof *ps);
    mt_model_registry(&cfg, ps, n);
    size_t sum = 0;
    for (int i = 0; i < n; i++) sum += ps[i].numel;
    EXPECT(sum == total, "total %zu, registry %zu", total, sum);
    free(ps);

    struct mt_blocks_comm c;
    mt_blocks_comm_counts(&cfg, 0, 4, &c);
    EXPECT(c.mixer_regions == 4 && c.ffn_regions == 2 && c.sp_gathers == 2 && c.routed == 2,
           "comm counts %d %d %d %d", c.mixer_regions, c.ffn_regions, c.sp_gathers, c.routed);
    mt_blocks_comm_counts(&cfg, 1, 2, &c);
    EXPECT(c.mixer_regions == 1 && c.ffn_regions == 0 && c.sp_gathers == 1 && c.routed == 1, "E layer comm counts");
    EXPECT(mt_blocks_any_routed(&cfg) && mt_blocks_layer_routed(&cfg, 2) && !mt_blocks_layer_routed(&cfg, 3),
           "routed layers");
}

int main(void)
{
    test_letters();
    test_layout_rules();
    test_registry_tp(0);
    test_registry_tp(1);
    test_counts();
    if (g_fail) return 1;
    printf("test_blocks: ok\n");
    return 0;
}
