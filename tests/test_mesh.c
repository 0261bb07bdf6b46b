/*
 * test_mesh.c — the named mesh as pure functions (no MPI): parsing good and
 * bad mesh strings, rank <-> coordinates, group members and the reuse plan
 * computed exactly for worlds of 8, every startup-contract rule, derived
 * predicates; plus the one-rank mesh object (trace line, OOM cleanup).
 */
#include "parallel/mt_mesh.h"

#include <stdio.h>
#include <string.h>
#include "mt_test.h"


static int dims_eq(const struct mt_mesh_dims *d, int pp, int dp, int ep, int tp)
{
    return d->pp == pp && d->dp == dp && d->ep == ep && d->tp == tp;
}

static void expect_parse_ok(struct mt_ctx *ctx, const char *s, int world, int pp, int dp, int ep, int tp)
{
    struct mt_mesh_dims d = {.pp = 0, .dp = 0, .ep = 0, .tp = 0, .sp = 0};
    enum mt_status st = mt_mesh_parse(ctx, s, world, &d);
    if (st != MT_OK || !dims_eq(&d, pp, dp, ep, tp)) {
        fprintf(stderr, "parse '%s' world=%d: st=%d (%s) got %d,%d,%d,%d\n", s ? s : "(null)", world, st,
                mt_ctx_last_error(ctx), d.pp, d.dp, d.ep, d.tp);
        n_fail++;
    }
}

/* bad string: the status and a fragment the message must contain */
static void expect_parse_bad(struct mt_ctx *ctx, const char *s, int world, enum mt_status want, const char *frag)
{
    struct mt_mesh_dims d = {.pp = 9, .dp = 9, .ep = 9, .tp = 9, .sp = 0};
    enum mt_status st = mt_mesh_parse(ctx, s, world, &d);
    if (st != want || !strstr(mt_ctx_last_error(ctx), frag) || !dims_eq(&d, 9, 9, 9, 9) || strchr(mt_ctx_last_error(ctx), '\n')) {
        fprintf(stderr, "parse '%s' world=%d: st=%d want %d, msg '%s' want '%s'\n", s, world, st, want,
                mt_ctx_last_error(ctx), frag);
        n_fail++;
    }
}

static void expect_members(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g, const int *want, int n_want,
                           enum mt_mesh_group want_source)
{
    int got[64];
    int n = mt_mesh_group_members(d, rank, g, got);
    int ok = n == n_want && n == mt_mesh_group_size(d, g) && memcmp(got, want, (size_t)n * sizeof(int)) == 0;
    enum mt_mesh_group src = mt_mesh_group_source(d, rank, g);
    if (!ok || src != want_source) {
        fprintf(stderr, "rank %d group %s: n=%d (want %d), source %s (want %s)\n", rank, mt_mesh_group_name(g), n, n_want,
                mt_mesh_group_name(src), mt_mesh_group_name(want_source));
        n_fail++;
    }
}

/* A valid base config without depending on config.c. */
static void base_config(struct mt_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layer = 4;
    cfg->d_model = 256;
    cfg->n_head = 4;
    cfg->n_kv_head = 2;
    cfg->mlp_hidden = 0; /* derived: ceil(8*256/3)=683 -> 704 */
    cfg->seq_len = 256;
    cfg->n_experts = 8;
    cfg->top_k = 2;
    cfg->batch_size = 8;
    cfg->microbatches = 1;
    cfg->sequence_parallel = 1;
}

static void expect_contract(struct mt_ctx *ctx, const struct mt_config *cfg, struct mt_mesh_dims d, int world, int mb,
                            const char *want_msg)
{
    enum mt_status st = mt_mesh_check_contract(ctx, &d, cfg, world, mb);
    if (!want_msg) {
        if (st != MT_OK) {
            fprintf(stderr, "contract: unexpected failure: %s\n", mt_ctx_last_error(ctx));
            n_fail++;
        }
        return;
    }
    if (st != MT_ERR_CONFIG || strcmp(mt_ctx_last_error(ctx), want_msg) != 0) {
        fprintf(stderr, "contract: st=%d msg '%s'\n               want '%s'\n", st, mt_ctx_last_error(ctx), want_msg);
        n_fail++;
    }
}

int main(void)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);

    /* ---- parsing ---- */
    expect_parse_ok(&ctx, "pp=2,dp=2,ep=1,tp=2", 8, 2, 2, 1, 2);
    expect_parse_ok(&ctx, "pp=2,dp=2,ep=1,tp=2", 0, 2, 2, 1, 2);
    expect_parse_ok(&ctx, "tp=2", 8, 1, 4, 1, 2);                /* dp derived */
    expect_parse_ok(&ctx, "tp=2", 0, 1, 1, 1, 2);                /* no world: dp 1 */
    expect_parse_ok(&ctx, "", 4, 1, 4, 1, 1);
    expect_parse_ok(&ctx, NULL, 0, 1, 1, 1, 1);
    expect_parse_ok(&ctx, " pipe=2 , model = 2 ", 4, 2, 1, 1, 2); /* long names, spaces */
    expect_parse_ok(&ctx, "ep=2,tp=2,dp=2", 8, 1, 2, 2, 2);       /* any order */
    expect_parse_bad(&ctx, "xp=2", 0, MT_ERR_INVALID_ARG, "unknown axis 'xp'");
    expect_parse_bad(&ctx, "tp=0", 0, MT_ERR_INVALID_ARG, "got 0");
    expect_parse_bad(&ctx, "tp=-2", 0, MT_ERR_INVALID_ARG, "got -2");
    expect_parse_bad(&ctx, "tp=1.5", 0, MT_ERR_INVALID_ARG, "positive integer, got '1.5'");
    expect_parse_bad(&ctx, "tp=abc", 0, MT_ERR_INVALID_ARG, "positive integer");
    expect_parse_bad(&ctx, "tp=", 0, MT_ERR_INVALID_ARG, "positive integer");
    expect_parse_bad(&ctx, "tp=99999999999", 0, MT_ERR_INVALID_ARG, "must be in [1, 65536]");
    expect_parse_bad(&ctx, "tp=2,tp=2", 0, MT_ERR_INVALID_ARG, "axis tp given twice");
    expect_parse_bad(&ctx, "tp=2,model=4", 0, MT_ERR_INVALID_ARG, "given twice");
    expect_parse_bad(&ctx, "tp=2,", 0, MT_ERR_INVALID_ARG, "trailing ','");
    expect_parse_bad(&ctx, "tp=2,,dp=1", 0, MT_ERR_INVALID_ARG, "expected axis=degree");
    expect_parse_bad(&ctx, "tp", 0, MT_ERR_INVALID_ARG, "expected axis=degree");
    expect_parse_bad(&ctx, "dp=3,tp=2", 8, MT_ERR_CONFIG, "pp*dp*ep*tp=6 != world=8");
    expect_parse_bad(&ctx, "tp=3", 4, MT_ERR_CONFIG, "world=4 is not divisible by pp*ep*tp=3");

    struct mt_mesh_dims d8 = {.pp = 2, .dp = 2, .ep = 1, .tp = 2, .sp = 0};
    char s[64];
    mt_mesh_dims_str(&d8, s, sizeof s);
    EXPECT(strcmp(s, "pp=2,dp=2,ep=1,tp=2") == 0);
    EXPECT(mt_mesh_dims_world(&d8) == 8);

    /* ---- rank <-> coordinates: model fastest ---- */
    struct mt_mesh_dims d16 = {.pp = 2, .dp = 2, .ep = 2, .tp = 2, .sp = 0};
    for (int r = 0; r < 16; r++) {
        struct mt_mesh_coord c;
        mt_mesh_coord_of(&d16, r, &c);
        EXPECT(mt_mesh_rank_of(&d16, &c) == r);
        EXPECT(r == ((c.pipe * 2 + c.data) * 2 + c.expert) * 2 + c.model);
    }
    struct mt_mesh_coord c5;
    mt_mesh_coord_of(&d8, 5, &c5);
    EXPECT(c5.pipe == 1 && c5.data == 0 && c5.expert == 0 && c5.model == 1);
    struct mt_mesh_dims d3 = {.pp = 1, .dp = 3, .ep = 1, .tp = 4, .sp = 0};
    struct mt_mesh_coord c7 = {.pipe = 0, .data = 1, .expert = 0, .model = 3};
    EXPECT(mt_mesh_rank_of(&d3, &c7) == 7);

    /* ---- groups on pp=2,dp=2,ep=1,tp=2 (world 8), rank 5 = (1,0,0,1) ---- */
    {
        const int w[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const int model[2] = {4, 5}, self[1] = {5}, data[2] = {5, 7}, dm[4] = {4, 5, 6, 7}, pipe[2] = {1, 5};
        expect_members(&d8, 5, MT_MESH_GROUP_WORLD, w, 8, MT_MESH_GROUP_WORLD);
        expect_members(&d8, 5, MT_MESH_GROUP_MODEL, model, 2, MT_MESH_GROUP_MODEL);
        expect_members(&d8, 5, MT_MESH_GROUP_EXPERT, self, 1, MT_MESH_GROUP_EXPERT);      /* the self comm */
        expect_members(&d8, 5, MT_MESH_GROUP_DATA, data, 2, MT_MESH_GROUP_DATA);
        expect_members(&d8, 5, MT_MESH_GROUP_DATA_EXPERT, data, 2, MT_MESH_GROUP_DATA);   /* ep=1: reused */
        expect_members(&d8, 5, MT_MESH_GROUP_DATA_MODEL, dm, 4, MT_MESH_GROUP_DATA_MODEL);
        expect_members(&d8, 5, MT_MESH_GROUP_STAGE, dm, 4, MT_MESH_GROUP_DATA_MODEL);     /* reused */
        expect_members(&d8, 5, MT_MESH_GROUP_PIPE, pipe, 2, MT_MESH_GROUP_PIPE);
        /* every rank: the model group is the contiguous pair, data pairs differ by 2, pipe by 4 */
        for (int r = 0; r < 8; r++) {
            int m[8];
            EXPECT(mt_mesh_group_members(&d8, r, MT_MESH_GROUP_MODEL, m) == 2 && m[0] == (r & ~1) && m[1] == (r | 1));
            EXPECT(mt_mesh_group_members(&d8, r, MT_MESH_GROUP_DATA, m) == 2 && m[1] - m[0] == 2);
            EXPECT(mt_mesh_group_members(&d8, r, MT_MESH_GROUP_PIPE, m) == 2 && m[1] - m[0] == 4 && m[0] == r % 4);
            EXPECT(mt_mesh_group_members(&d8, r, MT_MESH_GROUP_DATA_EXPERT, NULL) == 2);
        }
    }
    /* dp=2,ep=2,tp=2 (world 8), rank 3 = (0,0,1,1) */
    {
        struct mt_mesh_dims d = {.pp = 1, .dp = 2, .ep = 2, .tp = 2, .sp = 0};
        const int expert[2] = {1, 3}, data[2] = {3, 7}, de[4] = {1, 3, 5, 7}, dm[4] = {2, 3, 6, 7}, model[2] = {2, 3};
        const int w[8] = {0, 1, 2, 3, 4, 5, 6, 7}, self[1] = {3};
        expect_members(&d, 3, MT_MESH_GROUP_MODEL, model, 2, MT_MESH_GROUP_MODEL);
        expect_members(&d, 3, MT_MESH_GROUP_EXPERT, expert, 2, MT_MESH_GROUP_EXPERT);
        expect_members(&d, 3, MT_MESH_GROUP_DATA, data, 2, MT_MESH_GROUP_DATA);
        expect_members(&d, 3, MT_MESH_GROUP_DATA_EXPERT, de, 4, MT_MESH_GROUP_DATA_EXPERT);
        expect_members(&d, 3, MT_MESH_GROUP_DATA_MODEL, dm, 4, MT_MESH_GROUP_DATA_MODEL);
        expect_members(&d, 3, MT_MESH_GROUP_STAGE, w, 8, MT_MESH_GROUP_WORLD);           /* pp=1: stage == world */
        expect_members(&d, 3, MT_MESH_GROUP_PIPE, self, 1, MT_MESH_GROUP_PIPE);          /* first single-rank group */
    }
    /* tp only (world 4): model == world; every single-rank group shares one self comm */
    {
        struct mt_mesh_dims d = {.pp = 1, .dp = 1, .ep = 1, .tp = 4, .sp = 0};
        const int w[4] = {0, 1, 2, 3}, self[1] = {2};
        expect_members(&d, 2, MT_MESH_GROUP_MODEL, w, 4, MT_MESH_GROUP_WORLD);
        expect_members(&d, 2, MT_MESH_GROUP_EXPERT, self, 1, MT_MESH_GROUP_EXPERT);
        expect_members(&d, 2, MT_MESH_GROUP_DATA, self, 1, MT_MESH_GROUP_EXPERT);
        expect_members(&d, 2, MT_MESH_GROUP_DATA_EXPERT, self, 1, MT_MESH_GROUP_EXPERT);
        expect_members(&d, 2, MT_MESH_GROUP_DATA_MODEL, w, 4, MT_MESH_GROUP_WORLD);
        expect_members(&d, 2, MT_MESH_GROUP_PIPE, self, 1, MT_MESH_GROUP_EXPERT);
    }
    /* all ones: everything is the world */
    {
        struct mt_mesh_dims d = {.pp = 1, .dp = 1, .ep = 1, .tp = 1, .sp = 0};
        for (int g = 0; g < MT_MESH_GROUP_COUNT; g++)
            EXPECT(mt_mesh_group_source(&d, 0, (enum mt_mesh_group)g) == MT_MESH_GROUP_WORLD);
    }

    /* ---- the startup contract: each rule, with its numbers ---- */
    struct mt_config cfg;
    base_config(&cfg);
    struct mt_mesh_dims dtp2 = {.pp = 1, .dp = 2, .ep = 1, .tp = 2, .sp = 0};
    expect_contract(&ctx, &cfg, dtp2, 4, 0, NULL);
    expect_contract(&ctx, &cfg, dtp2, 5, 0,
                    "mesh contract: world != pp*dp*ep*tp (world=5, pp=1, dp=2, ep=1, tp=2, product=4)");
    expect_contract(&ctx, &cfg, (struct mt_mesh_dims){.pp = 1, .dp = 1, .ep = 1, .tp = 3, .sp = 0}, 3, 0,
                    "mesh contract: n_head % tp != 0 (n_head=4, tp=3)");
    cfg.n_kv_head = 1;
    expect_contract(&ctx, &cfg, (struct mt_mesh_dims){.pp = 1, .dp = 1, .ep = 1, .tp = 4, .sp = 0}, 4, 0,
                    "mesh contract: (n_head + 2*n_kv_head) % tp != 0 (n_head=4, n_kv_head=1, tp=4)");
    expect_contract(&ctx, &cfg, (struct mt_mesh_dims){.pp = 1, .dp = 1, .ep = 1, .tp = 2, .sp = 0}, 2, 0,
                    "mesh contract: n_kv_head % tp != 0 (n_kv_head=1, tp=2)");
    base_config(&cfg);
    cfg.mlp_hidden = 99;
    expect_contract(&ctx, &cfg, dtp2, 4, 0, "mesh contract: mlp_hidden % tp != 0 (mlp_hidden=99, tp=2)");
    base_config(&cfg);
    cfg.d_model = 3 * 64 + 2; /* F derived: ceil(8*194/3) = 518 -> 576, % 2 ok, % 4 ok */
    expect_contract(&ctx, &cfg, dtp2, 4, 0, NULL);
    base_config(&cfg);
    strcpy(cfg.pattern, "AEAE");
    cfg.n_experts = 6;
    struct mt_mesh_dims dep4 = {.pp = 1, .dp = 1, .ep = 4, .tp = 1, .sp = 0};
    expect_contract(&ctx, &cfg, dep4, 4, 0, "mesh contract: n_experts % ep != 0 (n_experts=6, ep=4)");
    strcpy(cfg.pattern, "AAAA"); /* no MoE block: the expert axis is extra data parallelism */
    expect_contract(&ctx, &cfg, dep4, 4, 0, NULL);
    strcpy(cfg.pattern, "AEAE");
    cfg.n_experts = 4;
    cfg.top_k = 5;
    expect_contract(&ctx, &cfg, dep4, 4, 0, "mesh contract: top_k > n_experts (top_k=5, n_experts=4)");
    base_config(&cfg);
    cfg.n_layer = 2;
    expect_contract(&ctx, &cfg, (struct mt_mesh_dims){.pp = 4, .dp = 1, .ep = 1, .tp = 1, .sp = 0}, 4, 0, "mesh contract: n_layer < pp (n_layer=2, pp=4)");
    base_config(&cfg);
    cfg.batch_size = 6;
    expect_contract(&ctx, &cfg, dtp2, 4, 2,
                    "mesh contract: batch_size % (dp*ep*microbatches) != 0 (batch_size=6, dp=2, ep=1, microbatches=2)");
    cfg.microbatches = 3; /* mb argument 0 -> cfg->microbatches */
    cfg.batch_size = 8;
    expect_contract(&ctx, &cfg, (struct mt_mesh_dims){.pp = 1, .dp = 1, .ep = 2, .tp = 1, .sp = 0}, 2, 0,
                    "mesh contract: batch_size % (dp*ep*microbatches) != 0 (batch_size=8, dp=1, ep=2, microbatches=3)");
    base_config(&cfg);
    cfg.seq_len = 255;
    expect_contract(&ctx, &cfg, dtp2, 4, 0, "mesh contract: seq_len % tp != 0 with sequence parallel (seq_len=255, tp=2)");
    cfg.sequence_parallel = 0;
    expect_contract(&ctx, &cfg, dtp2, 4, 0, NULL);
    EXPECT(mt_mesh_check_contract(&ctx, &dtp2, NULL, 4, 1) == MT_ERR_INVALID_ARG);

    /* ---- predicates from degrees ---- */
    struct mt_mesh_preds p;
    struct mt_mesh_coord c;
    mt_mesh_coord_of(&d16, 13, &c); /* (1,1,0,1) */
    base_config(&cfg);
    mt_mesh_derive_preds(&d16, &c, &cfg, 2, &p);
    EXPECT(p.ep_active == 1 && p.tp_active == 1 && p.sp_on == 1 && p.dp_active == 1 && p.pp_active == 1);
    EXPECT(p.pp_stage == 1 && p.grad_dp == 4 && p.zero_stage == 2);
    cfg.sequence_parallel = 0;
    mt_mesh_derive_preds(&d16, &c, &cfg, 0, &p);
    EXPECT(p.sp_on == 0 && p.tp_active == 1 && p.zero_stage == 0);
    struct mt_mesh_dims dd = {.pp = 1, .dp = 4, .ep = 1, .tp = 1, .sp = 0};
    mt_mesh_coord_of(&dd, 3, &c);
    mt_mesh_derive_preds(&dd, &c, NULL, 1, &p);
    EXPECT(p.ep_active == 0 && p.tp_active == 0 && p.sp_on == 0 && p.dp_active == 1 && p.pp_active == 0);
    EXPECT(p.pp_stage == 0 && p.grad_dp == 4);

    /* ---- the live mesh on one rank (no MPI initialised) ---- */
    struct mt_mesh_dims ones = {.pp = 1, .dp = 1, .ep = 1, .tp = 1, .sp = 0};
    struct mt_mesh *mesh = NULL;
    EXPECT(mt_mesh_create(&ctx, &ones, &cfg, 2, &mesh) == MT_OK && mesh);
    if (mesh) {
        EXPECT(mt_mesh_world(mesh) == 1 && mt_mesh_rank(mesh) == 0);
        struct mt_comm *w = mt_mesh_world_comm(mesh);
        EXPECT(w && mt_comm_size(w) == 1);
        for (int g = 1; g < MT_MESH_GROUP_COUNT; g++) {
            enum mt_mesh_group src;
            EXPECT(mt_mesh_comm(mesh, (enum mt_mesh_group)g) == w);
            EXPECT(mt_mesh_group_reused(mesh, (enum mt_mesh_group)g, &src) && src == MT_MESH_GROUP_WORLD);
        }
        EXPECT(!mt_mesh_group_reused(mesh, MT_MESH_GROUP_WORLD, NULL));
        EXPECT(mt_mesh_get_preds(mesh)->zero_stage == 2 && mt_mesh_get_dims(mesh)->tp == 1);
        float v = 3;
        EXPECT(mt_comm_allreduce(&ctx, mt_mesh_data_expert_comm(mesh), &v, 1, MT_DTYPE_F32, MT_REDOP_SUM) == MT_OK && v == 3);
        char line[1024];
        size_t want = mt_mesh_trace_line(mesh, line, sizeof line);
        EXPECT(want == strlen(line) && !strchr(line, '\n'));
        EXPECT(strstr(line, "mesh rank=0 coord(pipe=0,data=0,expert=0,model=0) world{size=1 members=[0] impl=self reused=no}"));
        EXPECT(strstr(line, " model{size=1 members=[0] impl=self reused=world}"));
        EXPECT(strstr(line, " data_expert{size=1 members=[0] impl=self reused=world}"));
        EXPECT(strstr(line, "ep_active=0 tp_active=0 sp_on=0 dp_active=0 pp_active=0 pp_stage=0 grad_dp=1 zero_stage=2"));
        char small[20];
        EXPECT(mt_mesh_trace_line(mesh, small, sizeof small) == want && strlen(small) == sizeof small - 1);
        /* the trainer's line for one rank: the same facts, the seven world-reusing groups named once */
        char brief[1024];
        size_t nb = mt_mesh_trace_line_brief(mesh, brief, sizeof brief);
        EXPECT(nb == strlen(brief) && nb < 300 && nb < want / 2);
        EXPECT(strstr(brief, "mesh rank=0 coord(pipe=0,data=0,expert=0,model=0) world{size=1 members=[0] impl=self reused=no} "
                             "model,expert,data,data_expert,data_model,stage,pipe{=world} "));
        EXPECT(strstr(brief, "ep_active=0 tp_active=0 sp_on=0 dp_active=0 pp_active=0 pp_stage=0 grad_dp=1 zero_stage=2"));
    }
    mt_mesh_destroy(mesh);
    mt_mesh_destroy(NULL);
    EXPECT(ctx.bytes_live_total == 0);

    /* a mesh that does not match the world: error before anything is built */
    mesh = (struct mt_mesh *)&ctx;
    EXPECT(mt_mesh_create(&ctx, &dtp2, NULL, 0, &mesh) == MT_ERR_CONFIG && mesh == NULL);
    EXPECT(strstr(mt_ctx_last_error(&ctx), "pp*dp*ep*tp=4 != world=1"));

    /* every allocation failing in turn: an error, nothing leaked */
    for (long k = 1; k <= 6; k++) {
        ctx.fail_after = k;
        mesh = NULL;
        enum mt_status st = mt_mesh_create(&ctx, &ones, NULL, 0, &mesh);
        ctx.fail_after = 0;
        EXPECT(st == MT_OK || st == MT_ERR_OOM);
        if (st == MT_OK) mt_mesh_destroy(mesh);
        else EXPECT(mesh == NULL);
        EXPECT(ctx.bytes_live_total == 0);
    }

    mt_ctx_free(&ctx);
    if (n_fail) {
        fprintf(stderr, "test_mesh: %d failure(s)\n", n_fail);
        return 1;
    }
    printf("test_mesh: ok\n");
    return 0;
}
