/*
 * test_plan_fit.c — the layout module (src/parallel/layout.c) and the auto-fit
 * search (src/plan/plan_fit.c), without MPI:
 *   1. meshes: mt_plan_fit_meshes lists every (pp, dp, ep, tp) with product
 *      world exactly once (brute force over all quadruples);
 *   2. auto-fit on a tiny MoE model: every fitting layout fits the budget, is
 *      sorted by step time (then memory), and each is re-planned here to the
 *      same maximum; every rejection has a reason; the count of candidates is
 *      the number of (mesh, microbatch count) pairs; a dense model skips the
 *      ep > 1 meshes; --zero restricts the stages; a budget of 1 KiB fits
 *      nothing and reports the smallest need;
 *   3. find-max on one layout: the value fits, the next multiple does not;
 *   4. layout rules: the pipeline cut is the brute-force optimum of the max
 *      stage cost, covers every layer once, and a bad spec is refused; the
 *      sequence ownership covers the global batch exactly once; the
 *      reduction group, the count rule and the replica rule per layout class
 *      on five meshes (with and without SP, EP, PP); the host bytes are
 *      the sum of the listed arrays (= mt_train_host_bytes).
 * Exits non-zero on failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_config.h"
#include "parallel/mt_layout.h"
#include "plan/mt_plan_fit.h"
#include "train/mt_trainer.h"
#include "mt_test.h"

static void tiny(struct mt_config *cfg, int moe)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    mt_config_defaults(cfg);
    const char *sets[] = {"vocab_size=96", "n_layer=4", "d_model=32", "n_head=4", "n_kv_head=4", "seq_len=16",
                          "batch_size=16", "n_experts=4", "top_k=2", "expert_hidden=24", "shared_expert_hidden=16",
                          "microbatches=2", moe ? "pattern=AEAE" : "pattern=AAAA"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (mt_config_set(&ctx, cfg, sets[i]) != MT_OK) { fprintf(stderr, "%s\n", mt_ctx_last_error(&ctx)); exit(1); }
    if (mt_config_resolve(&ctx, cfg, 10) != MT_OK) { fprintf(stderr, "%s\n", mt_ctx_last_error(&ctx)); exit(1); }
}

static void profile(struct mt_plan_profile *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "test");
    p->peak_flops = p->node_peak_flops = 1e11;
    p->efficiency = 0.5;
    p->overlap = 0.5;
    p->ranks_per_node = 8;
    p->cores_per_node = 8;
    p->intra = p->inter = (struct mt_plan_link){1e10, 1e-6, 0, 0, 0};
}

static void test_meshes(void)
{
    for (int W = 1; W <= 12; W++) {
        int n = mt_plan_fit_meshes(W, NULL, 0), want = 0;
        struct mt_mesh_dims got[256];
        EXPECT(n <= 256 && mt_plan_fit_meshes(W, got, 256) == n, "world %d", W);
        for (int pp = 1; pp <= W; pp++)
            for (int dp = 1; dp <= W; dp++)
                for (int ep = 1; ep <= W; ep++)
                    for (int tp = 1; tp <= W; tp++) {
                        if (pp * dp * ep * tp != W) continue;
                        want++;
                        int seen = 0;
                        for (int i = 0; i < n; i++)
                            seen += got[i].pp == pp && got[i].dp == dp && got[i].ep == ep && got[i].tp == tp;
                        EXPECT(seen == 1, "world %d mesh %d,%d,%d,%d listed %d times", W, pp, dp, ep, tp, seen);
                    }
        EXPECT(n == want, "world %d: %d meshes, want %d", W, n, want);
    }
}

/* the (mesh, microbatch count) pairs the search tries */
static int pairs_of(const struct mt_config *cfg, int W, int moe)
{
    struct mt_mesh_dims ms[256];
    int n = mt_plan_fit_meshes(W, ms, 256), pairs = 0;
    for (int i = 0; i < n; i++) {
        if (!moe && ms[i].ep > 1) continue;
        long g = (long)ms[i].dp * ms[i].ep, per = cfg->batch_size % g == 0 ? cfg->batch_size / g : 0;
        if (per == 0) { pairs++; continue; }
        for (long m = 1; m <= per; m++) pairs += per % m == 0;
    }
    return pairs;
}

static void test_auto(void)
{
    struct mt_config cfg;
    struct mt_plan_profile prof;
    profile(&prof);
    for (int moe = 0; moe < 2; moe++) {
        tiny(&cfg, moe);
        struct mt_ctx ctx;
        mt_ctx_init(&ctx);
        const int W = 4;
        struct mt_plan_fit_opts o = {.world = W, .mem = 64.0 * (1 << 20), .zero = -1, .find_max = -1, .steps = 5,
                                     .prof = &prof};
        struct mt_plan_fit fit;
        EXPECT(mt_plan_fit_search(&ctx, &cfg, &o, &fit) == MT_OK, "search: %s", mt_ctx_last_error(&ctx));
        EXPECT(fit.n_ok > 0, "moe %d: nothing fits 64 MiB", moe);
        EXPECT(fit.n_cand == pairs_of(&cfg, W, moe), "moe %d: %d candidates, want %d", moe, fit.n_cand,
               pairs_of(&cfg, W, moe));
        int n_ep = 0;
        struct mt_mesh_dims ms[64];
        int nm = mt_plan_fit_meshes(W, ms, 64);
        for (int i = 0; i < nm; i++) n_ep += ms[i].ep > 1;
        EXPECT(fit.skipped_ep == (moe ? 0 : n_ep), "moe %d: skipped %d", moe, fit.skipped_ep);
        for (int i = 0; i < fit.n_ok; i++) {
            const struct mt_plan_fit_cand *c = &fit.ok[i];
            EXPECT((double)c->mem <= o.mem && c->step_s > 0, "ok %d: mem %zu step %g", i, c->mem, c->step_s);
            if (i) EXPECT(fit.ok[i - 1].step_s < c->step_s ||
                          (fit.ok[i - 1].step_s == c->step_s && fit.ok[i - 1].mem <= c->mem), "order at %d", i);
            if (!moe && c->d.ep > 1) EXPECT(0, "dense model listed an ep>1 mesh");
        }
        for (int i = 0; i < fit.n_rej; i++) EXPECT(fit.rej[i].reason[0], "rejection %d without a reason", i);
        /* the best layout re-planned here gives the same maximum */
        const struct mt_plan_fit_cand *b = &fit.ok[0];
        struct mt_plan *plan = NULL;
        EXPECT(mt_plan_fit_plan(&ctx, &cfg, b, &o, &plan) == MT_OK, "replan: %s", mt_ctx_last_error(&ctx));
        if (plan) EXPECT(mt_plan_max_total(plan, NULL) == b->mem, "replanned %zu vs %zu", mt_plan_max_total(plan, NULL),
                         b->mem);
        mt_plan_destroy(&ctx, plan);
        mt_plan_fit_free(&ctx, &fit);

        /* one ZeRO stage only */
        o.zero = 2;
        EXPECT(mt_plan_fit_search(&ctx, &cfg, &o, &fit) == MT_OK, "search zero=2");
        for (int i = 0; i < fit.n_ok; i++) EXPECT(fit.ok[i].zero == 2, "zero %d listed", fit.ok[i].zero);
        EXPECT(fit.n_ok > 0, "zero=2 fits nothing");
        mt_plan_fit_free(&ctx, &fit);

        /* nothing fits 1 KiB: the smallest need is reported */
        o.zero = -1;
        o.mem = 1024;
        EXPECT(mt_plan_fit_search(&ctx, &cfg, &o, &fit) == MT_OK, "search 1KiB");
        EXPECT(fit.n_ok == 0 && fit.smallest > 1024 && fit.n_rej > 0, "1 KiB: ok %d smallest %zu", fit.n_ok,
               fit.smallest);
        int mem_rej = 0;
        for (int i = 0; i < fit.n_rej; i++) mem_rej += !strncmp(fit.rej[i].reason, "memory:", 7);
        EXPECT(mem_rej > 0, "no memory rejection");
        mt_plan_fit_free(&ctx, &fit);
        EXPECT(ctx.bytes_live_total == 0, "leak %zu", ctx.bytes_live_total);
        mt_ctx_free(&ctx);
    }
}

static void test_find_max(void)
{
    struct mt_config cfg;
    tiny(&cfg, 1);
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_mesh_dims d = {.pp = 1, .dp = 2, .ep = 1, .tp = 1, .sp = 0};
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = d;
    su.steps = 5;
    struct mt_plan *plan = NULL;
    if (mt_layout_pipeline_cut(&ctx, &cfg, 1, NULL, su.first_layer) != MT_OK ||
        mt_plan_create(&ctx, &cfg, &su, 0, &plan) != MT_OK) {
        EXPECT(0, "plan: %s", mt_ctx_last_error(&ctx));
        return;
    }
    const double mem = 64.0 * (1 << 20);
    long unit;
    size_t need;
    long v = mt_plan_fit_find_max(&ctx, plan, &cfg, &d, 2, 0, mem, &unit, &need);
    EXPECT(v > 0 && v % unit == 0, "seq_len %ld unit %ld", v, unit);
    struct mt_plan_choice ch;
    mt_plan_get_choice(plan, &ch);
    ch.seq_len = (int)v;
    EXPECT(mt_plan_reselect(&ctx, plan, &ch) == MT_OK && (double)mt_plan_max_total(plan, NULL) <= mem, "v fits");
    ch.seq_len = (int)(v + unit);
    EXPECT(mt_plan_reselect(&ctx, plan, &ch) != MT_OK || (double)mt_plan_max_total(plan, NULL) > mem,
           "v + unit = %ld fits too", v + unit);
    /* a budget nothing meets: 0, and the smallest need */
    v = mt_plan_fit_find_max(&ctx, plan, &cfg, &d, 2, 0, 1024, &unit, &need);
    EXPECT(v == 0 && need > 1024, "1 KiB: %ld need %zu", v, need);
    mt_plan_destroy(&ctx, plan);
    mt_ctx_free(&ctx);
}

static double stage_cost(const struct mt_config *cfg, int a, int b)
{
    double c = 0;
    for (int l = a; l < b; l++) c += mt_model_layer_flops(cfg, l);
    return c + (b == cfg->n_layer ? mt_model_head_flops(cfg) : 0);
}

static void test_layout(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    tiny(&cfg, 1);
    /* 1. the cut: the brute-force optimum for every pp (L = 4) */
    for (int pp = 1; pp <= 4; pp++) {
        int first[MT_MAX_LAYERS + 1];
        EXPECT(mt_layout_pipeline_cut(&ctx, &cfg, pp, NULL, first) == MT_OK, "cut pp=%d", pp);
        double got = 0;
        for (int s = 0; s < pp; s++) {
            EXPECT(first[s] < first[s + 1], "pp=%d stage %d empty", pp, s);
            double c = stage_cost(&cfg, first[s], first[s + 1]);
            if (c > got) got = c;
        }
        EXPECT(first[0] == 0 && first[pp] == cfg.n_layer, "pp=%d covers [%d, %d)", pp, first[0], first[pp]);
        /* brute force over all cuts: bitmask of the L-1 boundaries with pp-1 set */
        double best = 1e300;
        for (int mask = 0; mask < 1 << (cfg.n_layer - 1); mask++) {
            if (__builtin_popcount((unsigned)mask) != pp - 1) continue;
            double mx = 0;
            int a = 0;
            for (int l = 1; l <= cfg.n_layer; l++)
                if (l == cfg.n_layer || (mask >> (l - 1) & 1)) {
                    double c = stage_cost(&cfg, a, l);
                    if (c > mx) mx = c;
                    a = l;
                }
            if (mx < best) best = mx;
        }
        EXPECT(got <= best * (1 + 1e-9), "pp=%d: cut max %g, optimum %g", pp, got, best);
    }
    int first[MT_MAX_LAYERS + 1];
    EXPECT(mt_layout_pipeline_cut(&ctx, &cfg, 2, "1,3", first) == MT_OK && first[1] == 1 && first[2] == 4, "spec");
    EXPECT(mt_layout_pipeline_cut(&ctx, &cfg, 2, "2,3", first) == MT_ERR_INVALID_ARG, "spec covering 5 layers");
    EXPECT(mt_layout_pipeline_cut(&ctx, &cfg, 5, NULL, first) == MT_ERR_CONFIG, "pp > n_layer");

    /* 2. sequence ownership: dp x ep ranks x microbatches cover the global batch once */
    const int G = 24, DPE = 3, M = 2, Gl = G / DPE, Bm = Gl / M;
    int hit[24] = {0};
    for (int r = 0; r < DPE; r++)
        for (int mb = 0; mb < M; mb++)
            for (int i = 0; i < Bm; i++) {
                int64_t s = mt_layout_sequence(r, Gl, mb, Bm, i);
                if (s >= 0 && s < G) hit[s]++;
            }
    for (int s = 0; s < G; s++) EXPECT(hit[s] == 1, "sequence %d owned %d times", s, hit[s]);

    /* 3. the rules per layout class, on several meshes. The parameter
     * carries only its class (p.layout): split and reduce_model stay 0, so
     * a rule reading them instead of the class fails here. */
    enum { DE = MT_MESH_GROUP_DATA_EXPERT, ST = MT_MESH_GROUP_STAGE, DA = MT_MESH_GROUP_DATA,
           DM = MT_MESH_GROUP_DATA_MODEL };
    static const struct {
        struct mt_mesh_dims d;
        int group[MT_LAYOUT_COUNT];   /* reduction group per class: RESIDUAL TP_ROWS TP_COLS MODEL_PARTIAL EXPERT */
    } meshes[] = {
        {{.pp = 1, .dp = 2, .ep = 1, .tp = 1, .sp = 0}, {DE, DE, DE, DE, DE}},   /* data only                      */
        {{.pp = 1, .dp = 2, .ep = 1, .tp = 2, .sp = 0}, {DE, DE, DE, ST, ST}},   /* tp 2 without SP                */
        {{.pp = 1, .dp = 2, .ep = 1, .tp = 2, .sp = 1}, {ST, DE, DE, ST, ST}},   /* tp 2 with SP: residual partial */
        {{.pp = 1, .dp = 1, .ep = 2, .tp = 1, .sp = 0}, {DE, DE, DE, DE, DA}},   /* ep 2                           */
        {{.pp = 2, .dp = 1, .ep = 2, .tp = 2, .sp = 1}, {ST, DE, DE, ST, DM}},   /* pp 2 x ep 2 x tp 2, SP         */
    };
    for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++) {
        const struct mt_mesh_dims *md = &meshes[m].d;
        for (int l = 0; l < MT_LAYOUT_COUNT; l++) {
            struct mt_param p;
            memset(&p, 0, sizeof p);
            p.layout = l;
            enum mt_layout_engine e = mt_layout_param_engine(&p, md);
            EXPECT((int)e < mt_layout_n_engines(md), "mesh %zu %s: engine %d of %d", m, mt_layout_name(l), (int)e,
                   mt_layout_n_engines(md));
            EXPECT((int)mt_layout_engine_group(md, e) == meshes[m].group[l], "mesh %zu %s: group %s, want %s", m,
                   mt_layout_name(l), mt_mesh_group_name(mt_layout_engine_group(md, e)),
                   mt_mesh_group_name((enum mt_mesh_group)meshes[m].group[l]));
            /* counted: every model rank, except a whole tensor reduced without
             * the model group (model rank 0 alone) */
            const int whole_dense = md->tp > 1 && meshes[m].group[l] == DE && l != MT_LAYOUT_TP_ROWS &&
                                    l != MT_LAYOUT_TP_COLS;
            for (int tr = 0; tr < md->tp; tr++)
                EXPECT(mt_layout_param_counted(&p, md, tr) == (tr == 0 || !whole_dense), "mesh %zu %s: counted on "
                       "model rank %d", m, mt_layout_name(l), tr);
            /* replicas: ranks 0 and 1 differ in the model coordinate when tp > 1 */
            const int sliced = md->tp > 1 && (l == MT_LAYOUT_TP_ROWS || l == MT_LAYOUT_TP_COLS);
            EXPECT(mt_layout_replicas_agree(md, &p, 0, 1) == !sliced, "mesh %zu %s: ranks 0, 1 agree", m,
                   mt_layout_name(l));
        }
    }
    /* same model rank, different data rank: a slice agrees (pp1 dp2 tp2: rank = data*2 + model) */
    struct mt_param p;
    memset(&p, 0, sizeof p);
    p.layout = MT_LAYOUT_TP_ROWS;
    EXPECT(mt_layout_replicas_agree(&meshes[1].d, &p, 1, 3), "split: same model rank agrees");

    /* 4. host bytes */
    size_t b[MT_HOST_N], sum = 0;
    mt_layout_host_sizes(&cfg, 100, 4, 7, 8, b);
    for (int k = 0; k < MT_HOST_N; k++) sum += b[k];
    EXPECT(sum == mt_layout_host_bytes(&cfg, 100, 4, 7, 8) && sum == mt_train_host_bytes(&cfg, 100, 4, 7, 8),
           "host bytes %zu", sum);
    EXPECT(b[MT_HOST_IMBALANCE] == 7 * sizeof(double) && b[MT_HOST_IDX] == 4 * 16 * sizeof(int32_t), "moe/idx sizes");
    mt_ctx_free(&ctx);
}

int main(void)
{
    test_meshes();
    test_auto();
    test_find_max();
    test_layout();
    if (n_fail) fprintf(stderr, "test_plan_fit: %d failure(s)\n", n_fail);
    else printf("test_plan_fit: ok\n");
    return n_fail ? 1 : 0;
}
