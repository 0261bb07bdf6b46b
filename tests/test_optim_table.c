/*
 * test_optim_table.c — the cost of a new optimizer: a toy class declared
 * here, through the table only (struct mt_optim_i), trains a tiny model.
 *
 * The toy is SGD with momentum, one state "momentum" per parameter, taking
 * the dense block matrices (roles DENSE, 2-D); every other parameter keeps
 * the built-in class the model gave it (AdamW for gains, embeddings, the
 * head; Muon is not used: the toy takes its matrices). Per element, at
 * lr = cfg->lr x schedule, mu = cfg->muon_momentum:
 *     m = mu m + g;   p = (1 - lr wd) p - lr m
 * Checks: the toy's parameters follow that formula (fp64 reference from the
 * gradients the library computed) for 2 steps of forward + backward + step,
 * the AdamW ones moved; the optimizer's state list names the toy's states
 * "<param>.momentum" in parameter order; a checkpoint round trip (mt_ckpt_save / mt_ckpt_load into
 * a fresh model and optimizer with the same table) restores every parameter,
 * state and t bit for bit, and a third step from the load equals a third
 * step of the original. Exits non-zero on failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mt_config.h"
#include "core/mt_param.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "io/mt_ckpt.h"
#include "optim/mt_optim.h"
#include "mt_test.h"

/* ---- the toy: its whole definition (what a new optimizer file holds) ---- */

static enum mt_status sgdm_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                                 const struct mt_param *p)
{
    (void)cfg, (void)p;
    if (!ops->axpby) return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend %s lacks axpby", ops->name);
    return MT_OK;
}

static enum mt_status sgdm_step(struct mt_ctx *ctx, const struct mt_optim_run *run, struct mt_optim_slot *const *slots,
                                int n)
{
    (void)ctx;
    const struct mt_ops_i *ops = run->ops;
    const float lr = (float)(run->cfg->lr * run->lr_factor), mu = run->cfg->muon_momentum;
    for (int i = 0; i < n; i++) {
        struct mt_param *p = slots[i]->p;
        const float wd = p->decay ? run->cfg->weight_decay : 0.0f;
        ops->axpby(ops->be, slots[i]->s[0], p->grad, 1.0f, mu, p->numel);          /* m = g + mu m           */
        ops->axpby(ops->be, p->data, slots[i]->s[0], -lr, 1.0f - lr * wd, p->numel); /* p = (1-lr wd) p - lr m */
    }
    return MT_OK;
}

static const struct mt_optim_i sgdm = {
    .name = "sgdm",
    .n_states = 1,
    .state_names = {"momentum"},
    .roles = 1u << MT_ROLE_DENSE,
    .matrices_only = 1,
    .pass_bytes = 24.0,   /* reads g, m, then m, p; writes m, p: 6 floats */
    .shadow_bytes = 6.0,  /* no shadow written by its pass: the refresh's */
    .check = sgdm_check,
    .step = sgdm_step,
};

/* its index in the test's table: past the built-in kinds (an optimizer
 * kind is a table index; the enum names only the built-ins) */
#define K_SGDM ((enum mt_optim_kind)2)

/* the built-in entries first (param->optim keeps its meaning), then the toy */
static const struct mt_optim_i *table[3];

static void build_table(void)
{
    table[MT_OPTIM_ADAMW] = mt_optim_class(MT_OPTIM_ADAMW);
    table[MT_OPTIM_MUON] = mt_optim_class(MT_OPTIM_MUON);
    table[K_SGDM] = &sgdm;
}

/* ---- the run ---- */

enum { B = 2, T = 8, V = 32, STEPS = 2 };

static void tiny_cfg(struct mt_ctx *ctx, struct mt_config *cfg)
{
    mt_config_defaults(cfg);
    const char *sets[] = {"vocab_size=32", "n_layer=2", "d_model=16", "n_head=2", "n_kv_head=1", "seq_len=8",
                          "batch_size=2", "lr=0.05", "weight_decay=0.1", "grad_clip=0", "warmup_steps=0",
                          "lr_schedule=constant", "muon_momentum=0.9"};
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++)
        EXPECT(mt_config_set(ctx, cfg, sets[k]) == MT_OK, "%s", sets[k]);
    EXPECT(mt_config_resolve(ctx, cfg, STEPS + 1) == MT_OK, "%s", mt_ctx_last_error(ctx));
}

/* The model and its optimizer with the toy on the parameters it accepts. */
static struct mt_model *make(struct mt_ctx *ctx, const struct mt_ops_i *ops, const struct mt_config *cfg,
                             struct mt_optim **o, int *n_toy)
{
    struct mt_model *m = NULL;
    *o = NULL;
    EXPECT(mt_model_create(ctx, ops, cfg, B, &m) == MT_OK, "%s", mt_ctx_last_error(ctx));
    if (!m) return NULL;
    EXPECT(mt_model_init_params(ctx, m, cfg->seed) == MT_OK, "init");
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    *n_toy = 0;
    for (int i = 0; i < np; i++)
        if ((sgdm.roles >> ps[i].role & 1u) && ps[i].ndim == 2) { ps[i].optim = K_SGDM; ++*n_toy; }
    EXPECT(mt_optim_create_with(ctx, ops, cfg, table, 3, ps, np, o) == MT_OK, "%s", mt_ctx_last_error(ctx));
    return m;
}

static void batch(int32_t *idx, int32_t *tgt)
{
    unsigned s = 5;
    for (int i = 0; i < B * T; i++) {
        s = s * 1664525u + 1013904223u;
        idx[i] = (int32_t)((s >> 8) % V);
        s = s * 1664525u + 1013904223u;
        tgt[i] = (int32_t)((s >> 8) % V);
    }
}

static void fwd_bwd(struct mt_ctx *ctx, struct mt_model *m)
{
    int32_t idx[B * T], tgt[B * T];
    batch(idx, tgt);
    struct mt_loss_norm norm = {B * T, B, B * T};
    struct mt_loss_parts parts;
    mt_model_zero_grad(m);
    EXPECT(mt_model_forward(ctx, m, idx, tgt, &norm, &parts) == MT_OK, "forward");
    EXPECT(mt_model_backward(ctx, m) == MT_OK, "backward");
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

int main(void)
{
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    build_table();
    struct mt_config cfg;
    tiny_cfg(&ctx, &cfg);
    struct mt_optim *o = NULL;
    int n_toy = 0;
    struct mt_model *m = make(&ctx, ops, &cfg, &o, &n_toy);
    if (!m || !o) return 1;
    int np;
    struct mt_param *ps = mt_model_params(m, &np);
    EXPECT(n_toy > 0 && n_toy < np, "%d toy params of %d", n_toy, np);

    /* the state list: the toy's one "momentum" per parameter, AdamW's two */
    int want = 0;
    for (int i = 0; i < np; i++) want += ps[i].optim == K_SGDM ? 1 : 2;
    EXPECT(mt_optim_state_count(o) == want, "%d states, want %d", mt_optim_state_count(o), want);
    for (int i = 0, j = 0; i < np; j += ps[i].optim == K_SGDM ? 1 : 2, i++) {
        struct mt_optim_state st;
        char name[160];
        mt_optim_state_get(o, j, &st);
        snprintf(name, sizeof name, "%s.%s", ps[i].name, ps[i].optim == K_SGDM ? "momentum" : "exp_avg");
        EXPECT(st.param == &ps[i] && !strcmp(st.name, name), "state %d: %s, want %s", j, st.name, name);
    }

    /* two steps against the fp64 reference of the toy's formula */
    size_t total = 0;
    for (int i = 0; i < np; i++) total += ps[i].numel;
    double *rp = calloc(total, sizeof *rp), *rm = calloc(total, sizeof *rm);
    float *p0 = calloc(total, sizeof *p0);
    for (int i = 0, off = 0; i < np; off += (int)ps[i].numel, i++)
        for (size_t k = 0; k < ps[i].numel; k++) p0[off + k] = ps[i].data[k], rp[off + k] = ps[i].data[k];
    double worst = 0;
    int adam_moved = 0;
    for (int s = 0; s < STEPS; s++) {
        fwd_bwd(&ctx, m);
        for (int i = 0, off = 0; i < np; off += (int)ps[i].numel, i++) {
            if (ps[i].optim != K_SGDM) continue;
            const double lr = cfg.lr, wd = ps[i].decay ? cfg.weight_decay : 0.0, mu = cfg.muon_momentum;
            for (size_t k = 0; k < ps[i].numel; k++) {
                rm[off + k] = mu * rm[off + k] + ps[i].grad[k];
                rp[off + k] = (1 - lr * wd) * rp[off + k] - lr * rm[off + k];
            }
        }
        EXPECT(mt_optim_step(&ctx, o, s, sqrt(mt_optim_grad_sumsq(o))) == MT_OK, "step %d", s);
        for (int i = 0, off = 0; i < np; off += (int)ps[i].numel, i++) {
            if (ps[i].optim != K_SGDM) {
                adam_moved += !same_bits(ps[i].data, p0 + off, ps[i].numel);
                continue;
            }
            double e = 0, sc = 0;
            for (size_t k = 0; k < ps[i].numel; k++) {
                e = fmax(e, fabs(ps[i].data[k] - rp[off + k]));
                sc = fmax(sc, fabs(rp[off + k]));
            }
            worst = fmax(worst, sc > 0 ? e / sc : e);
        }
    }
    printf("toy sgdm: %d of %d params, %d steps: worst rel err %.2e\n", n_toy, np, STEPS, worst);
    EXPECT(worst <= 1e-5, "sgdm params off the reference by %.2e", worst);
    EXPECT(adam_moved > 0, "the AdamW parameters did not move");
    EXPECT(mt_optim_get_t(o) == STEPS, "t %ld", mt_optim_get_t(o));

    /* checkpoint round trip: the toy's states are optimizer entries like any other */
    char root[] = "/tmp/mt_optim_table_XXXXXX", dir[600];
    EXPECT(mkdtemp(root) != NULL, "mkdtemp");
    snprintf(dir, sizeof dir, "%s/step_000002", root);
    struct mt_ckpt_meta meta = {.step = STEPS, .data_pos = STEPS * B, .seed = cfg.seed, .optim_t = mt_optim_get_t(o)};
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    EXPECT(mt_ckpt_save(&ctx, ops, dir, &cfg, &meta, ps, np, o) == MT_OK, "save: %s", mt_ctx_last_error(&ctx));
    struct mt_optim *o2 = NULL;
    int n_toy2 = 0;
    struct mt_model *m2 = make(&ctx, ops, &cfg, &o2, &n_toy2);
    if (!m2 || !o2) return 1;
    int np2;
    struct mt_param *ps2 = mt_model_params(m2, &np2);
    EXPECT(mt_ckpt_load(&ctx, ops, dir, ps2, np2, o2) == MT_OK, "load: %s", mt_ctx_last_error(&ctx));
    EXPECT(mt_optim_get_t(o2) == STEPS, "loaded t %ld", mt_optim_get_t(o2));
    for (int i = 0; i < np; i++) EXPECT(same_bits(ps[i].data, ps2[i].data, ps[i].numel), "%s", ps[i].name);
    for (int j = 0; j < mt_optim_state_count(o); j++) {
        struct mt_optim_state a, b;
        mt_optim_state_get(o, j, &a);
        mt_optim_state_get(o2, j, &b);
        EXPECT(!strcmp(a.name, b.name) && same_bits(a.data, b.data, a.param->numel), "state %s", a.name);
    }
    /* a third step from the load equals a third step of the original */
    fwd_bwd(&ctx, m);
    fwd_bwd(&ctx, m2);
    EXPECT(mt_optim_step(&ctx, o, STEPS, sqrt(mt_optim_grad_sumsq(o))) == MT_OK, "step 3");
    EXPECT(mt_optim_step(&ctx, o2, STEPS, sqrt(mt_optim_grad_sumsq(o2))) == MT_OK, "step 3 (loaded)");
    for (int i = 0; i < np; i++) EXPECT(same_bits(ps[i].data, ps2[i].data, ps[i].numel), "step 3: %s", ps[i].name);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    free(rp);
    free(rm);
    free(p0);
    mt_optim_destroy(&ctx, o);
    mt_optim_destroy(&ctx, o2);
    mt_model_destroy(&ctx, m);
    mt_model_destroy(&ctx, m2);
    EXPECT(ctx.bytes_live_total == 0, "%zu bytes leaked", (size_t)ctx.bytes_live_total);
    mt_ctx_free(&ctx);
    if (n_fail) {
        fprintf(stderr, "test_optim_table: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_optim_table: ok\n");
    return 0;
}
