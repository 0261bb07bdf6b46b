/*
 * test_init.c — counter-based init: any owned box equals the slice of the
 * full tensor bit for bit; determinism per (seed, name, index); statistics
 * (std 0.02, output projections 0.02/sqrt(2L), gains 1); the parameter
 * registry (order, names, optimizer kinds, decay); plan == allocation.
 * The block-kind table (src/model/mt_blocks.h): letters unique and unknown
 * ones refused; the layout rules (split, partial over the model group)
 * against a hand-written matrix; the registry under tp 2, SP on and off
 * (boxes, and exactly the SPEC.md parameters partial over the model group);
 * FLOPs per token, active parameters and the planner's TP region counts
 * against the hand formulas for a mixed pattern. The parallel fill
 * (OpenMP chunks) equals the serial one bit for bit and the values pinned
 * from the serial fill before it was parallel (every init kind).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <xxhash.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "model/mt_blocks.h"
#include "model/mt_model.h"
#include "model/model_impl.h"
#include "ops/mt_ops.h"
#include "parallel/mt_layout.h"
#include "mt_test.h"

static void config(struct mt_config *cfg, struct mt_ctx *ctx, const char *pattern, const char *optimizer)
{
    mt_config_defaults(cfg);
    cfg->vocab_size = 50;
    cfg->n_layer = (int)strlen(pattern);
    cfg->d_model = 64;
    cfg->n_head = 4;
    cfg->n_kv_head = 2;
    cfg->mlp_hidden = 96;
    cfg->seq_len = 4;
    cfg->n_experts = 3;
    cfg->top_k = 2;
    cfg->expert_hidden = 16;
    cfg->shared_expert_hidden = 8;
    cfg->batch_size = 1;
    cfg->microbatches = 1;
    snprintf(cfg->pattern, sizeof cfg->pattern, "%s", pattern);
    snprintf(cfg->optimizer, sizeof cfg->optimizer, "%s", optimizer);
    if (mt_config_resolve(ctx, cfg, 1) != MT_OK) {
        fprintf(stderr, "config: %s\n", mt_ctx_last_error(ctx));
        exit(1);
    }
}

static struct mt_param *find(struct mt_model *m, const char *name)
{
    int n;
    struct mt_param *ps = mt_model_params(m, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(ps[i].name, name) == 0) return &ps[i];
    fprintf(stderr, "no param %s\n", name);
    exit(1);
}

/* Materialising boxes of a tensor == slicing the full tensor, bit for bit. */
static void test_slices(void)
{
    struct mt_param full;
    memset(&full, 0, sizeof full);
    snprintf(full.name, sizeof full.name, "model.layers.3.mlp.down_proj.weight");
    full.ndim = 2;
    full.shape[0] = full.len[0] = 37;
    full.shape[1] = full.len[1] = 23;
    full.numel = 37 * 23;
    full.init = MT_INIT_NORMAL;
    full.init_std = 0.02f;
    float *ref = malloc(full.numel * sizeof(float));
    model_param_fill(&full, 42, ref);
    const int64_t boxes[][4] = { { 0, 0, 37, 23 }, { 5, 0, 10, 23 }, { 0, 7, 37, 9 }, { 11, 3, 1, 20 }, { 36, 22, 1, 1 } };
    for (size_t b = 0; b < sizeof boxes / sizeof boxes[0]; b++) {
        struct mt_param p = full;
        p.off[0] = boxes[b][0];
        p.off[1] = boxes[b][1];
        p.len[0] = boxes[b][2];
        p.len[1] = boxes[b][3];
        p.numel = (size_t)(p.len[0] * p.len[1]);
        float *s = malloc(p.numel * sizeof(float));
        model_param_fill(&p, 42, s);
        int same = 1;
        for (int64_t i = 0; i < p.len[0]; i++)
            for (int64_t j = 0; j < p.len[1]; j++)
                same &= memcmp(&s[i * p.len[1] + j], &ref[(p.off[0] + i) * full.shape[1] + p.off[1] + j], 4) == 0;
        EXPECT(same, "box %zu differs from the slice of the full tensor", b);
        free(s);
    }
    free(ref);
}

/* Through the model: shrink a parameter's box, init, compare with the full init. */
static void test_model_box(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    config(&cfg, &ctx, "AE", "muon");
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 1, &m) == MT_OK);
    MT_ASSERT(mt_model_init_params(&ctx, m, 1234) == MT_OK);
    struct mt_param *p = find(m, "model.layers.0.self_attn.o_proj.weight");
    size_t n = p->numel;
    float *full = malloc(n * sizeof(float)), *part = malloc(n * sizeof(float));
    ops->copy_to_host(ops->be, full, p->data, n * sizeof(float));
    struct mt_param saved = *p;
    p->off[1] = 16; p->len[1] = 32;        /* TP-style column split, second of 2 ranks */
    p->off[0] = 8;  p->len[0] = 40;
    p->numel = (size_t)(p->len[0] * p->len[1]);
    MT_ASSERT(mt_model_init_params(&ctx, m, 1234) == MT_OK);
    ops->copy_to_host(ops->be, part, p->data, p->numel * sizeof(float));
    int same = 1;
    for (int64_t i = 0; i < p->len[0]; i++)
        for (int64_t j = 0; j < p->len[1]; j++)
            same &= memcmp(&part[i * p->len[1] + j], &full[(p->off[0] + i) * p->shape[1] + p->off[1] + j], 4) == 0;
    EXPECT(same, "model init of a box differs from the slice of the full init");
    *p = saved;
    free(full);
    free(part);
    mt_model_destroy(&ctx, m);
    mt_ctx_free(&ctx);
}

static void stats(struct mt_model *m, const char *name, double want_std)
{
    struct mt_param *p = find(m, name);
    float *h = malloc(p->numel * sizeof(float));
    m->ops->copy_to_host(m->ops->be, h, p->data, p->numel * sizeof(float));
    double s = 0, s2 = 0;
    for (size_t i = 0; i < p->numel; i++) { s += h[i]; s2 += (double)h[i] * h[i]; }
    double mean = s / p->numel, sd = sqrt(s2 / p->numel - mean * mean);
    /* std of the sample std is ~ sd/sqrt(2n): 5% is > 4 sigma for n >= 4096 */
    EXPECT(fabs(sd / want_std - 1) < 0.05, "%s: std %.5f, want %.5f", name, sd, want_std);
    EXPECT(fabs(mean) < 5 * want_std / sqrt((double)p->numel), "%s: mean %.2e too far from 0", name, mean);
    free(h);
}

static void test_determinism_and_stats(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    config(&cfg, &ctx, "AE", "muon");
    struct mt_model *a = NULL, *b = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 1, &a) == MT_OK);
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 1, &b) == MT_OK);
    MT_ASSERT(mt_model_init_params(&ctx, a, 5) == MT_OK);
    MT_ASSERT(mt_model_init_params(&ctx, b, 5) == MT_OK);
    int n;
    struct mt_param *pa = mt_model_params(a, &n), *pb = mt_model_params(b, &n);
    int same = 1;
    for (int i = 0; i < n; i++) same &= memcmp(pa[i].data, pb[i].data, pa[i].numel * sizeof(float)) == 0;
    EXPECT(same, "same seed gave different parameters");
    MT_ASSERT(mt_model_init_params(&ctx, b, 6) == MT_OK);
    EXPECT(memcmp(pa[1 + 1].data, pb[1 + 1].data, pa[2].numel * sizeof(float)) != 0, "different seeds gave equal q_proj");
    /* different names, same shape and seed: different values */
    struct mt_param *q0 = find(a, "model.layers.0.self_attn.q_proj.weight");
    struct mt_param *q1 = find(a, "model.layers.1.self_attn.q_proj.weight");
    EXPECT(memcmp(q0->data, q1->data, q0->numel * sizeof(float)) != 0, "layers 0 and 1 q_proj are equal");
    struct mt_param *e0 = find(a, "model.layers.1.mlp.experts.0.gate_proj.weight");
    struct mt_param *e1 = find(a, "model.layers.1.mlp.experts.1.gate_proj.weight");
    EXPECT(memcmp(e0->data, e1->data, e0->numel * sizeof(float)) != 0, "experts 0 and 1 are equal");

    double out_std = 0.02 / sqrt(2.0 * cfg.n_layer);
    stats(a, "model.embed_tokens.weight", 0.02);
    stats(a, "model.layers.0.self_attn.q_proj.weight", 0.02);
    stats(a, "model.layers.0.mlp.gate_proj.weight", 0.02);
    stats(a, "model.layers.0.self_attn.o_proj.weight", out_std);
    stats(a, "model.layers.1.self_attn.o_proj.weight", out_std);
    stats(a, "model.layers.0.mlp.down_proj.weight", out_std);
    /* gains are exactly 1 */
    for (int i = 0; i < n; i++) {
        if (pa[i].ndim != 1) continue;
        float *h = malloc(pa[i].numel * sizeof(float));
        ops->copy_to_host(ops->be, h, pa[i].data, pa[i].numel * sizeof(float));
        int ones = 1;
        for (size_t e = 0; e < pa[i].numel; e++) ones &= h[e] == 1.0f;
        EXPECT(ones, "gain %s is not all ones", pa[i].name);
        free(h);
    }
    /* output projections of experts are scaled too (std over all experts' down_proj) */
    EXPECT(find(a, "model.layers.1.mlp.experts.2.down_proj.weight")->init_std == (float)out_std, "expert down_proj std");
    EXPECT(find(a, "model.layers.1.mlp.shared_expert.down_proj.weight")->init_std == (float)out_std, "shared down_proj std");
    mt_model_destroy(&ctx, a);
    mt_model_destroy(&ctx, b);
    mt_ctx_free(&ctx);
}

/* Order, names, optimizer kinds, decay; plan == what create allocates. */
static void test_registry(const char *optimizer)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_config cfg;
    config(&cfg, &ctx, "AE", optimizer);
    size_t plan[MT_BUCKET_COUNT];
    mt_model_plan_bytes(&cfg, 2, plan);
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create(&ctx, ops, &cfg, 2, &m) == MT_OK);
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        EXPECT(ctx.bytes_live[b] == plan[b], "bucket %s: allocated %zu, plan %zu", mt_bucket_name((enum mt_bucket)b),
               ctx.bytes_live[b], plan[b]);
    int n;
    struct mt_param *ps = mt_model_params(m, &n);
    int E = cfg.n_experts;
    int want = 1 + (8 + 3) + (8 + 1 + 3 * E + 3) + 2;
    EXPECT(n == want, "%d params, want %d", n, want);
    const char *order[] = { "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                            "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                            "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                            "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
                            "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
                            "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                            "model.layers.1.input_layernorm.weight" };
    for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
        EXPECT(strcmp(ps[i].name, order[i]) == 0, "param %d is %s, want %s", i, ps[i].name, order[i]);
    EXPECT(strcmp(ps[20].name, "model.layers.1.mlp.gate.weight") == 0, "router at 20: %s", ps[20].name);
    EXPECT(strcmp(ps[21].name, "model.layers.1.mlp.experts.0.gate_proj.weight") == 0, "%s", ps[21].name);
    EXPECT(strcmp(ps[21 + 3 * E].name, "model.layers.1.mlp.shared_expert.gate_proj.weight") == 0, "%s",
           ps[21 + 3 * E].name);
    EXPECT(strcmp(ps[n - 2].name, "model.norm.weight") == 0 && strcmp(ps[n - 1].name, "lm_head.weight") == 0,
           "tail %s %s", ps[n - 2].name, ps[n - 1].name);
    EXPECT(ps[6].shape[0] == cfg.head_dim && ps[6].ndim == 1, "q_norm shape");
    int adamw_only = strcmp(optimizer, "adamw") == 0;
    for (int i = 0; i < n; i++) {
        const struct mt_param *p = &ps[i];
        int muon = !adamw_only && p->ndim == 2 && strncmp(p->name, "model.layers.", 13) == 0 &&
                   p->role != MT_ROLE_ROUTER;
        EXPECT(p->optim == (muon ? MT_OPTIM_MUON : MT_OPTIM_ADAMW), "%s: optim %d", p->name, (int)p->optim);
        EXPECT(p->decay == (p->ndim == 2), "%s: decay %d", p->name, p->decay);
        EXPECT((p->role == MT_ROLE_GAIN) == (p->ndim == 1), "%s: role %d", p->name, (int)p->role);
    }
    EXPECT(ps[20].role == MT_ROLE_ROUTER && ps[20].optim == MT_OPTIM_ADAMW, "router role/optim");
    mt_model_destroy(&ctx, m);
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        EXPECT(ctx.bytes_live[b] == 0, "bucket %s leaks %zu bytes", mt_bucket_name((enum mt_bucket)b), ctx.bytes_live[b]);
    /* every allocation failure is reported and leaks nothing */
    for (long k = 1; k < 12; k++) {
        ctx.fail_after = k;
        struct mt_model *f = NULL;
        enum mt_status st = mt_model_create(&ctx, ops, &cfg, 2, &f);
        ctx.fail_after = 0;
        if (st == MT_OK) { mt_model_destroy(&ctx, f); break; }
        EXPECT(st == MT_ERR_OOM && f == NULL, "fail_after=%ld: status %d", k, (int)st);
        EXPECT(ctx.bytes_live_total == 0, "fail_after=%ld leaks %zu bytes", k, ctx.bytes_live_total);
    }
    mt_ctx_free(&ctx);
}

static void test_letters(void)
{
    int n = mt_blocks_count();
    EXPECT(n >= 2 && n <= MT_MAX_BLOCK_KINDS, "kinds %d", n);
    for (int i = 0; i < n; i++) {
        EXPECT(mt_blocks_find(mt_blocks_kind(i)->letter) == i, "kind %d letter not unique", i);
        const struct mt_block_kind *k = mt_blocks_kind(i);
        EXPECT(k->n_steps >= 1 && k->n_steps <= MT_BLOCK_MAX_PIECES && k->wrap, "kind %d: %d steps", i, k->n_steps);
        for (int s = 0; s < k->n_steps && s < MT_BLOCK_MAX_PIECES; s++)
            EXPECT(k->steps[s].piece, "kind %d step %d has no piece", i, s);
    }
    EXPECT(mt_blocks_find('A') >= 0 && mt_blocks_find('E') >= 0, "A and E in the table");
    EXPECT(mt_blocks_find('Z') < 0 && mt_blocks_find('\0') < 0, "unknown letters refused");
    char buf[4 * MT_MAX_BLOCK_KINDS];
    EXPECT(strcmp(mt_blocks_letters(buf, sizeof buf), "A, E, M, a, e") == 0, "letters '%s'", buf);
    /* the routed twins (Mixture-of-Depths): A's and E's steps inside the mod wrapper */
    EXPECT(!mt_blocks_kind(mt_blocks_find('a'))->routed && mt_blocks_kind(mt_blocks_find('e'))->routed &&
           mt_blocks_kind(mt_blocks_find('a'))->wrap->enter && mt_blocks_kind(mt_blocks_find('e'))->wrap->enter &&
           !mt_blocks_kind(mt_blocks_find('A'))->wrap->enter, "the routed kinds' wrapper");
    EXPECT(!mt_blocks_kind(mt_blocks_find('A'))->routed && mt_blocks_kind(mt_blocks_find('E'))->routed, "routed flags");
}

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

static void test_registry_tp(int sp)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    config(&cfg, &ctx, "AEEA", "muon");
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
        /* the layout module reads the class: ep x tp = 2 x 2 */
        const struct mt_mesh_dims dims = {.pp = 1, .dp = 1, .ep = 2, .tp = 2, .sp = sp};
        enum mt_layout_engine e = mt_layout_param_engine(p, &dims);
        EXPECT(e == (l == MT_LAYOUT_EXPERT ? MT_LAYOUT_ENGINE_EXPERT
                     : p->reduce_model   ? MT_LAYOUT_ENGINE_PARTIAL : MT_LAYOUT_ENGINE_DENSE),
               "%s: engine %d, layout %s", p->name, (int)e, mt_layout_name(l));
    }
    /* per A block q k v o gate up down, per E block q k v o */
    EXPECT(n_split == 2 * 7 + 2 * 4, "split parameters %d", n_split);
    mt_model_destroy(&ctx, m);
}

static void test_counts(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    config(&cfg, &ctx, "AEEA", "muon");
    const double V = 50, D = 64, L = 4, T = 4, H = 4, K = 2, hd = 16, F = 96, E = 3, k = 2, Fe = 16, Fs = 8;
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
           "comm counts %g %g %g %d", c.mixer_regions, c.ffn_regions, c.sp_gathers, c.routed);
    mt_blocks_comm_counts(&cfg, 1, 2, &c);
    EXPECT(c.mixer_regions == 1 && c.ffn_regions == 0 && c.sp_gathers == 1 && c.routed == 1, "E layer comm counts");
    /* the MTP modules' blocks count on the last stage (l1 = n_layer) only */
    struct mt_config cm = cfg;
    cm.mtp_depth = 2;
    snprintf(cm.mtp_block, sizeof cm.mtp_block, "E");
    mt_blocks_comm_counts(&cm, 2, 4, &c);
    EXPECT(c.mixer_regions == 4 && c.ffn_regions == 1 && c.sp_gathers == 3 && c.routed == 3,
           "last stage + 2 MTP E blocks comm counts %g %g %g %d", c.mixer_regions, c.ffn_regions, c.sp_gathers,
           c.routed);
    mt_blocks_comm_counts(&cm, 0, 2, &c);
    EXPECT(c.mixer_regions == 2 && c.routed == 1, "a first stage has no MTP block");
    /* a routed (MoD) block's regions carry B C of the B T rows: they count C/T (seq_len 16, c 0.25: 4/16) */
    struct mt_config cr = cfg;
    cr.seq_len = 16;
    cr.mod_capacity = 0.25f;
    cr.pattern[0] = 'a';
    mt_blocks_comm_counts(&cr, 0, 1, &c);
    EXPECT(c.mixer_regions == 0.25 && c.ffn_regions == 0.25 && c.routed == 0, "a routed layer's comm counts %g %g",
           c.mixer_regions, c.ffn_regions);
    EXPECT(mt_blocks_any_routed(&cfg) && mt_blocks_layer_routed(&cfg, 2) && !mt_blocks_layer_routed(&cfg, 3),
           "routed layers");
}

/* M (Mamba-3) tensors: SPEC 1c init drawn by the counter-based generator
 * (a box materialises alone), optimizer classes, names. */
static void test_mamba_init(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    config(&cfg, &ctx, "AM", "muon");
    cfg.mamba_ngroups = 2;   /* E 128 = 2 heads of 64: ngroups 2 divides them */
    int n = mt_model_registry(&cfg, NULL, 0);
    struct mt_param *ps = calloc((size_t)n, sizeof *ps);
    mt_model_registry(&cfg, ps, n);
    int seen = 0;
    const double lo = 1e-3 + log(-expm1(-1e-3)), hi = 0.1 + log(-expm1(-0.1));
    for (int i = 0; i < n; i++) {
        struct mt_param *p = &ps[i];
        if (!strstr(p->name, "layers.1.mixer.")) continue;
        seen++;
        float *v = malloc(p->numel * sizeof(float));
        mt_model_param_values(p, 1337, v);
        int is_mat = strstr(p->name, "_proj") != NULL;
        EXPECT(is_mat ? (p->optim == MT_OPTIM_MUON && p->decay) : (p->optim == MT_OPTIM_ADAMW && !p->decay),
               "%s: optimizer class", p->name);
        for (size_t e = 0; e < p->numel; e++) {
            if (strstr(p->name, "dt_bias")) EXPECT(v[e] >= lo - 1e-6 && v[e] <= hi + 1e-6, "%s[%zu] = %g", p->name, e, v[e]);
            else if (strstr(p->name, "A_log")) EXPECT(v[e] >= 0 && v[e] <= log(16.0) + 1e-6, "%s[%zu] = %g", p->name, e, v[e]);
            else if (!is_mat) EXPECT(v[e] == 1.0f, "%s[%zu] = %g, want 1", p->name, e, v[e]);
        }
        if (p->numel >= 2 && !is_mat) {
            /* the second half of the tensor, materialised alone, equals its slice */
            struct mt_param q = *p;
            q.off[0] = p->shape[0] / 2;
            q.len[0] = p->shape[0] - q.off[0];
            q.numel = (size_t)q.len[0] * (size_t)q.len[1];
            float *w = malloc(q.numel * sizeof(float));
            mt_model_param_values(&q, 1337, w);
            EXPECT(memcmp(w, v + (size_t)q.off[0] * (size_t)q.len[1], q.numel * sizeof(float)) == 0, "%s: box", p->name);
            free(w);
        }
        if (strstr(p->name, "dt_bias")) EXPECT(v[0] != v[1], "dt_bias elements differ");
        free(v);
    }
    EXPECT(seen == 16, "M layer has %d mixer tensors, want 16", seen);
    free(ps);
    mt_ctx_free(&ctx);
}

/* The parallel fill == the serial fill, bit for bit, on 1-4 threads, for a
 * box with offsets spanning several chunks; and both == the xxh64 of the
 * values the serial fill of build 3cadae5 gave (so the bits are today's). */
static void test_parallel_fill(void)
{
    static const enum mt_init_kind kinds[] = {MT_INIT_NORMAL, MT_INIT_ONES, MT_INIT_DT_BIAS, MT_INIT_A_LOG,
                                              MT_INIT_ZEROS};
    static const unsigned long long pinned[] = {0x24d402fede404ce7ull, 0xd04bed4debb7a33cull, 0x0dad8d8748db74b7ull,
                                                0x4aaf6902850b8518ull, 0xaa806605c5c41938ull};
    const int threads0 = omp_get_max_threads();
    for (int k = 0; k < 5; k++) {
        struct mt_param p;
        memset(&p, 0, sizeof p);
        snprintf(p.name, sizeof p.name, "model.layers.1.mixer.test.%d", k);
        p.ndim = 2;
        p.shape[0] = 613, p.shape[1] = 331, p.off[0] = 7, p.off[1] = 5, p.len[0] = 600, p.len[1] = 317;
        p.numel = 600 * 317;   /* 2.9 chunks of 65536 */
        p.init = kinds[k];
        p.init_std = 0.02f;
        float *ser = malloc(p.numel * sizeof(float)), *par = malloc(p.numel * sizeof(float));
        model_param_fill_serial(&p, 1337, ser);
        EXPECT(XXH64(ser, p.numel * sizeof(float), 0) == pinned[k], "init kind %d: serial fill changed its bits", k);
        for (int t = 1; t <= 4; t++) {
            omp_set_num_threads(t);
            memset(par, 0xff, p.numel * sizeof(float));
            model_param_fill(&p, 1337, par);
            EXPECT(!memcmp(ser, par, p.numel * sizeof(float)), "init kind %d: parallel fill on %d threads differs", k, t);
        }
        free(ser);
        free(par);
    }
    omp_set_num_threads(threads0);
}

int main(void)
{
    test_slices();
    test_model_box();
    test_determinism_and_stats();
    test_registry("muon");
    test_registry("adamw");
    test_letters();
    test_layout_rules();
    test_registry_tp(0);
    test_registry_tp(1);
    test_counts();
    test_mamba_init();
    test_parallel_fill();
    if (n_fail) {
        fprintf(stderr, "test_init: FAILED\n");
        return 1;
    }
    printf("test_init: ok\n");
    return 0;
}
