/*
 * test_plan.c — the planner library (src/plan/plan.c) without MPI:
 *   1. group ranks: mt_plan_group_rank == the position in mt_mesh_group_members;
 *   2. mt_zero_plan_all (all stages, all group ranks, owners) == per-rank
 *      mt_zero_plan_bytes, and ownership == the reference greedy (largest
 *      first, least-loaded rank, linear scans), on several group sizes;
 *   3. the class claim (MT_PLAN_VERIFY) on meshes with pp, ep and tp;
 *      mt_plan_max_total == the brute-force maximum over ranks, for every
 *      ZeRO stage, microbatch count and recompute choice (auto-fit's path);
 *   4. one rank, in process: the model (EXTERNAL_PARAMS), the ZeRO engine on
 *      a self communicator and the optimizer allocate exactly the plan, per
 *      bucket, minus the trainer's own arrays (mt_train_host_bytes);
 *   5. a NO_ALLOC model allocates only its struct and parameter table, and
 *      recompute=block plans fewer activation bytes than none;
 *   6. every allocation of mt_plan_create failing in turn: MT_ERR_OOM, no leak.
 * Exits non-zero on failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_config.h"
#include "parallel/mt_comm.h"
#include "parallel/mt_mesh.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "optim/mt_optim.h"
#include "plan/mt_plan.h"
#include "train/mt_trainer.h"
#include "parallel/mt_zero.h"
#include "mt_test.h"

static void tiny_moe(struct mt_config *cfg)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    mt_config_defaults(cfg);
    const char *sets[] = {"vocab_size=96", "n_layer=4", "d_model=32", "n_head=4", "n_kv_head=4", "seq_len=16",
                          "batch_size=16", "pattern=AEAE", "n_experts=4", "top_k=2", "expert_hidden=24",
                          "shared_expert_hidden=16", "microbatches=2"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) MT_ASSERT(mt_config_set(&ctx, cfg, sets[i]) == MT_OK);
    MT_ASSERT(mt_config_resolve(&ctx, cfg, 10) == MT_OK);
}

static const struct mt_mesh_dims meshes[] = {
    {.pp = 1, .dp = 1, .ep = 1, .tp = 1}, {.pp = 1, .dp = 4, .ep = 1, .tp = 1}, {.pp = 1, .dp = 2, .ep = 2, .tp = 1},
    {.pp = 1, .dp = 2, .ep = 1, .tp = 2}, {.pp = 2, .dp = 2, .ep = 1, .tp = 1}, {.pp = 2, .dp = 1, .ep = 2, .tp = 2},
    {.pp = 1, .dp = 1, .ep = 4, .tp = 2}, {.pp = 2, .dp = 2, .ep = 2, .tp = 1}, {.pp = 4, .dp = 1, .ep = 1, .tp = 2},
    {.pp = 1, .dp = 3, .ep = 2, .tp = 1},
};
#define N_MESHES ((int)(sizeof meshes / sizeof meshes[0]))

/* 1 */
static void test_group_ranks(void)
{
    for (int m = 0; m < N_MESHES; m++) {
        const struct mt_mesh_dims *d = &meshes[m];
        int W = (int)mt_mesh_dims_world(d);
        int members[64];
        for (int r = 0; r < W; r++)
            for (int g = 0; g < MT_MESH_GROUP_COUNT; g++) {
                int n = mt_mesh_group_members(d, r, (enum mt_mesh_group)g, members), at = -1;
                for (int i = 0; i < n; i++)
                    if (members[i] == r) at = i;
                EXPECT(at == mt_plan_group_rank(d, r, (enum mt_mesh_group)g), "mesh %d rank %d group %s: %d vs %d", m,
                       r, mt_mesh_group_name((enum mt_mesh_group)g), at, mt_plan_group_rank(d, r, (enum mt_mesh_group)g));
            }
    }
}

/* the ownership rule of docs/zero.md, written the slow obvious way */
static void ref_owners(const struct mt_param *p, int P, const unsigned char *sel, int size, int *owner)
{
    size_t load[64] = {0};
    int *done = calloc((size_t)P, sizeof(int));
    for (int i = 0; i < P; i++) owner[i] = -1;
    for (;;) {
        int best = -1;
        for (int i = 0; i < P; i++)
            if (!done[i] && (!sel || sel[i]) && (best < 0 || p[i].numel > p[best].numel)) best = i;
        if (best < 0) break;
        done[best] = 1;
        int r = 0;
        for (int k = 1; k < size; k++)
            if (load[k] < load[r]) r = k;
        owner[best] = r;
        load[r] += (p[best].numel + 15) / 16 * 16;
    }
    free(done);
}

/* 2 */
static void test_zero_all(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    tiny_moe(&cfg);
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create_par(&ctx, NULL, &cfg, 1, MT_MODEL_NO_ALLOC, NULL, &m) == MT_OK);
    int P;
    struct mt_param *p = mt_model_params(m, &P);
    unsigned char *sel = malloc((size_t)P);
    int *own = malloc((size_t)P * sizeof(int)), *ref = malloc((size_t)P * sizeof(int));
    size_t *all = malloc((size_t)4 * 7 * MT_BUCKET_COUNT * sizeof(size_t));
    for (int variant = 0; variant < 2; variant++) {
        for (int i = 0; i < P; i++) sel[i] = variant == 0 ? 1 : (p[i].role == MT_ROLE_GAIN || (i % 3) == 0);
        for (int size = 1; size <= 7; size += 2) {
            EXPECT(mt_zero_plan_all(&ctx, m, sel, size, -1, 1, all, own) == MT_OK, "plan_all");
            ref_owners(p, P, sel, size, ref);
            EXPECT(memcmp(own, ref, (size_t)P * sizeof(int)) == 0, "owners differ from the reference (size %d)", size);
            for (int z = 0; z < 4; z++)
                for (int r = 0; r < size; r++) {
                    size_t one[MT_BUCKET_COUNT];
                    mt_zero_plan_bytes(m, sel, size, r, z, 1, one);
                    EXPECT(memcmp(one, all + ((size_t)z * size + r) * MT_BUCKET_COUNT, sizeof one) == 0,
                           "stage %d size %d rank %d", z, size, r);
                }
        }
    }
    free(sel);
    free(own);
    free(ref);
    free(all);
    mt_model_destroy(&ctx, m);
    EXPECT(ctx.bytes_live_total == 0, "leak %zu", ctx.bytes_live_total);
}

/* 3 */
static void test_classes_and_max(void)
{
    struct mt_config cfg;
    tiny_moe(&cfg);
    int planned = 0, checked = 0;
    for (int mi = 0; mi < N_MESHES; mi++) {
        struct mt_ctx ctx;
        mt_ctx_init(&ctx);
        const struct mt_mesh_dims *d = &meshes[mi];
        int W = (int)mt_mesh_dims_world(d);
        if (mt_mesh_check_contract(&ctx, d, &cfg, W, 1) != MT_OK) { mt_ctx_clear_error(&ctx); continue; }
        struct mt_plan_setup su;
        memset(&su, 0, sizeof su);
        su.dims = *d;
        su.steps = 5;
        MT_ASSERT(mt_plan_pipeline_cut(&ctx, &cfg, d->pp, NULL, su.first_layer) == MT_OK);
        struct mt_plan *plan = NULL;
        EXPECT(mt_plan_create(&ctx, &cfg, &su, MT_PLAN_LAYOUT | MT_PLAN_VERIFY, &plan) == MT_OK, "mesh %d: %s", mi,
               mt_ctx_last_error(&ctx));
        if (!plan) continue;
        planned++;
        EXPECT(mt_plan_n_params(plan) == mt_model_registry(&cfg, NULL, 0), "layout rows");
        for (int z = 0; z < 4; z++)
            for (int mb = 1; mb <= 2; mb++)
                for (int rc = 0; rc < 2; rc++) {
                    struct mt_config c = cfg;
                    c.microbatches = mb;
                    if (mt_mesh_check_contract(&ctx, d, &c, W, mb) != MT_OK) { mt_ctx_clear_error(&ctx); continue; }
                    struct mt_plan_choice ch = {z, mb, rc, cfg.seq_len, cfg.batch_size};
                    EXPECT(mt_plan_reselect(&ctx, plan, &ch) == MT_OK, "reselect");
                    size_t best = 0;
                    int arg = -1;
                    for (int r = 0; r < W; r++)
                        if (arg < 0 || mt_plan_rank_total(plan, r) > best) { best = mt_plan_rank_total(plan, r); arg = r; }
                    int fast_arg;
                    size_t fast = mt_plan_max_total(plan, &fast_arg);
                    checked++;
                    EXPECT(fast == best && fast_arg == arg, "mesh %d z%d mb%d rc%d: %zu@%d vs %zu@%d", mi, z, mb, rc, fast,
                           fast_arg, best, arg);
                }
        mt_plan_destroy(&ctx, plan);
        EXPECT(ctx.bytes_live_total == 0, "plan leak %zu", ctx.bytes_live_total);
    }
    EXPECT(planned == N_MESHES - 1 && checked >= 8 * planned, /* {1,3,2,1}: batch 16 % 6 */ "%d meshes planned, %d choices checked", planned, checked);
}

/* 4: one rank, in process, through the real constructors */
static void test_one_rank_exact(const char *recompute, int zero)
{
    struct mt_config cfg;
    tiny_moe(&cfg);
    snprintf(cfg.recompute, sizeof cfg.recompute, "%s", recompute);
    struct mt_ctx pctx, ctx;
    mt_ctx_init(&pctx);
    mt_ctx_init(&ctx);
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = (struct mt_mesh_dims){.pp = 1, .dp = 1, .ep = 1, .tp = 1, .sp = 0};
    su.zero_stage = zero;
    su.steps = 7;
    MT_ASSERT(mt_plan_pipeline_cut(&pctx, &cfg, 1, NULL, su.first_layer) == MT_OK);
    struct mt_plan *plan = NULL;
    MT_ASSERT(mt_plan_create(&pctx, &cfg, &su, 0, &plan) == MT_OK);
    size_t want[MT_BUCKET_COUNT];
    mt_plan_rank_bytes(plan, 0, want);

    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_comm *self = NULL;
    MT_ASSERT(mt_comm_create_self(&pctx, &self) == MT_OK);   /* outside the measured ctx */
    struct mt_model_par par;
    mt_plan_model_par(&cfg, &su.dims, su.first_layer, 0, &par);
    struct mt_model *m = NULL;
    int Bm = mt_plan_micro_batch(&cfg, &su.dims);
    MT_ASSERT(mt_model_create_par(&ctx, ops, &cfg, Bm, MT_MODEL_EXTERNAL_PARAMS, &par, &m) == MT_OK);
    int P;
    mt_model_params(m, &P);
    struct mt_zero *z = NULL;
    MT_ASSERT(mt_zero_create(&ctx, ops, self, zero, cfg.reshard_after_forward, m, NULL, &z) == MT_OK);
    int nv;
    struct mt_param *v = mt_zero_opt_params(z, &nv);
    struct mt_optim *o = NULL;
    MT_ASSERT(mt_optim_create(&ctx, ops, &cfg, v, nv, &o) == MT_OK);
    size_t host = mt_train_host_bytes(&cfg, P, Bm, 7, 1);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        size_t live = ctx.bytes_live[b] + (b == MT_BUCKET_OTHER ? host : 0);
        EXPECT(live == want[b], "recompute=%s zero=%d bucket %s: allocated %zu, plan %zu", recompute, zero,
               mt_bucket_name((enum mt_bucket)b), live, want[b]);
    }
    mt_optim_destroy(&ctx, o);
    mt_zero_destroy(&ctx, z);
    mt_model_destroy(&ctx, m);
    mt_comm_destroy(self);
    mt_plan_destroy(&pctx, plan);
    EXPECT(ctx.bytes_live_total == 0 && pctx.bytes_live_total == 0, "leak %zu %zu", ctx.bytes_live_total,
           pctx.bytes_live_total);
}

/* 5 */
static void test_no_alloc_and_recompute(void)
{
    struct mt_config cfg;
    tiny_moe(&cfg);
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_model *m = NULL;
    MT_ASSERT(mt_model_create_par(&ctx, NULL, &cfg, 2, MT_MODEL_NO_ALLOC, NULL, &m) == MT_OK);
    int P;
    mt_model_params(m, &P);
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        if (b != MT_BUCKET_OTHER) EXPECT(ctx.bytes_live[b] == 0, "NO_ALLOC allocated %zu in %s", ctx.bytes_live[b],
                                         mt_bucket_name((enum mt_bucket)b));
    EXPECT(ctx.bytes_live[MT_BUCKET_OTHER] < 32768 + (size_t)P * sizeof(struct mt_param), "NO_ALLOC other %zu",
           ctx.bytes_live[MT_BUCKET_OTHER]);
    mt_model_destroy(&ctx, m);
    /* a bad shape is refused with the model's message */
    struct mt_config bad = cfg;
    bad.n_kv_head = 3;
    EXPECT(mt_model_create_par(&ctx, NULL, &bad, 2, MT_MODEL_NO_ALLOC, NULL, &m) == MT_ERR_CONFIG && !m, "bad shape");
    size_t a[MT_BUCKET_COUNT], b2[MT_BUCKET_COUNT];
    mt_model_plan_bytes(&cfg, 2, a);
    snprintf(cfg.recompute, sizeof cfg.recompute, "block");
    mt_model_plan_bytes(&cfg, 2, b2);
    EXPECT(b2[MT_BUCKET_ACTS] < a[MT_BUCKET_ACTS] && b2[MT_BUCKET_WORKSPACE] == a[MT_BUCKET_WORKSPACE] &&
           b2[MT_BUCKET_PARAMS] == a[MT_BUCKET_PARAMS], "recompute acts %zu vs %zu", b2[MT_BUCKET_ACTS], a[MT_BUCKET_ACTS]);
    /* and create allocates what the recompute plan says */
    MT_ASSERT(mt_model_create(&ctx, mt_ops_cpu(), &cfg, 2, &m) == MT_OK);
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        EXPECT(ctx.bytes_live[b] == b2[b], "recompute create %s: %zu vs plan %zu", mt_bucket_name((enum mt_bucket)b),
               ctx.bytes_live[b], b2[b]);
    mt_model_destroy(&ctx, m);
    EXPECT(ctx.bytes_live_total == 0, "leak %zu", ctx.bytes_live_total);
}

/* 6: every allocation of mt_plan_create can fail: MT_ERR_OOM, nothing leaked */
static void test_oom(void)
{
    struct mt_config cfg;
    tiny_moe(&cfg);
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = (struct mt_mesh_dims){.pp = 2, .dp = 1, .ep = 2, .tp = 2, .sp = 0};
    su.zero_stage = 2;
    su.steps = 3;
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    MT_ASSERT(mt_plan_pipeline_cut(&ctx, &cfg, 2, NULL, su.first_layer) == MT_OK);
    int ok_at = 0;
    for (long k = 1; k < 100000 && !ok_at; k++) {
        mt_ctx_init(&ctx);
        ctx.fail_after = k;
        struct mt_plan *p = NULL;
        enum mt_status rc = mt_plan_create(&ctx, &cfg, &su, MT_PLAN_LAYOUT | MT_PLAN_VERIFY, &p);
        if (rc == MT_OK) { ok_at = (int)k; mt_plan_destroy(&ctx, p); }
        else EXPECT(rc == MT_ERR_OOM && p == NULL, "fail_after=%ld: rc %d", k, (int)rc);
        EXPECT(ctx.bytes_live_total == 0, "fail_after=%ld: %zu bytes leaked", k, ctx.bytes_live_total);
    }
    EXPECT(ok_at > 10, "plan succeeded after %d allocations", ok_at);
}

int main(void)
{
    test_group_ranks();
    test_zero_all();
    test_classes_and_max();
    for (int z = 0; z < 4; z++) {
        test_one_rank_exact("none", z);
        test_one_rank_exact("block", z);
    }
    test_no_alloc_and_recompute();
    test_oom();
    if (n_fail) {
        fprintf(stderr, "test_plan: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_plan: all checks passed\n");
    return 0;
}
