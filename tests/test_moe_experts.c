/*
 * test_moe_experts.c — the grouped expert GEMMs (src/model/moe_experts.c)
 * against the per-expert loop moe.c runs otherwise (mlp_forward /
 * mlp_backward per group, scratch at row 0), bit for bit, on groups laid out
 * as under expert parallelism: 3 source ranks x 2 local experts, counts
 * {3, 0, 2, 4, 1, 2} (an empty group; each local expert gets rows from
 * several sources), with offsets = 0 as moe.c passes the layer's r_cnt.
 *
 *  1. full training: y, the saved gate/up, dx and every weight gradient equal;
 *  2. LoRA, experts frozen with adapters (rank 2, scale 1.5) on all three
 *     projections: the same, every adapter gradient equal, and no frozen
 *     weight gradient written (grads keep their poison value);
 *  3. LoRA, frozen experts without adapters: dx equal, no weight gradient.
 * In every case each gemm_grouped call gets distinct C matrices (the
 * contract in mt_ops.h: a GPU runs the groups concurrently): the ops table is
 * the cpu one with gemm_grouped wrapped by a checker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "model/model_impl.h"
#include "model/moe_experts.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

enum { D = 8, FE = 6, EE = 2, EP = 3, NG = EP * EE, R = 2 };
static const int CNT[NG] = {3, 0, 2, 4, 1, 2};

static const struct mt_ops_i *g_cpu;
static int g_overlaps, g_calls;

/* gemm_grouped of the cpu table, after checking that no two C[g] overlap */
static void checked_grouped(void *backend, int ta, int tb, int n, const int *M, const int *N, const int *K, float alpha,
                            const float *const *A, int lda, const float *const *B, int ldb, float beta,
                            float *const *C, int ldc)
{
    g_calls++;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            const float *ai = C[i], *ae = C[i] + (size_t)(M[i] - 1) * ldc + N[i];
            const float *bi = C[j], *be = C[j] + (size_t)(M[j] - 1) * ldc + N[j];
            if (ai < be && bi < ae) g_overlaps++;
        }
    g_cpu->gemm_grouped(backend, ta, tb, n, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) - 0.5);
}

static float *vec(size_t n, uint64_t *seed)
{
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand(seed);
    return v;
}

/* A parameter (rows, cols) with random data; its grad set to POISON when
 * frozen (must stay untouched: a finite value, so that an accumulation into
 * it shows), else random (grads accumulate). */
#define POISON 7.0f
static void param(struct mt_param *p, int rows, int cols, int frozen, uint64_t *seed)
{
    memset(p, 0, sizeof *p);
    p->ndim = 2;
    p->len[0] = rows;
    p->len[1] = cols;
    p->numel = (size_t)rows * cols;
    p->data = vec(p->numel, seed);
    p->grad = vec(p->numel, seed);
    if (frozen)
        for (size_t i = 0; i < p->numel; i++) p->grad[i] = POISON;
    p->frozen = frozen;
}

struct world {
    struct mt_param w[3 * EE], ad[3 * EE][2];   /* experts; adapters A, B of each */
    struct mt_layer ly;
    struct moe_w mw;                            /* the piece's parameters: experts only */
    float *eg, *eu;                             /* the saved gate / up pre-activations */
    float *x, *dy, *y, *dx;
    float *act, *dact, *dg, *du, *t, *dt;
};

static void world_make(struct world *wd, int lora, int adapters, int rows)
{
    uint64_t seed = 12345;
    memset(wd, 0, sizeof *wd);
    for (int j = 0; j < EE; j++)
        for (int p = 0; p < 3; p++) {
            struct mt_param *w = &wd->w[3 * j + p];
            int out = p == 2 ? D : FE, in = p == 2 ? FE : D;
            param(w, out, in, lora, &seed);
            if (!adapters) continue;
            param(&wd->ad[3 * j + p][0], R, in, 0, &seed);
            param(&wd->ad[3 * j + p][1], out, R, 0, &seed);
            w->lora_a = &wd->ad[3 * j + p][0];
            w->lora_b = &wd->ad[3 * j + p][1];
            w->lora_scale = 1.5f;
        }
    wd->mw.experts = wd->w;
    wd->eg = calloc((size_t)rows * FE, sizeof(float));
    wd->eu = calloc((size_t)rows * FE, sizeof(float));
    wd->x = vec((size_t)rows * D, &seed);
    wd->dy = vec((size_t)rows * D, &seed);
    wd->y = calloc((size_t)rows * D, sizeof(float));
    wd->dx = calloc((size_t)rows * D, sizeof(float));
    wd->act = calloc((size_t)rows * FE, sizeof(float));
    wd->dact = calloc((size_t)rows * FE, sizeof(float));
    wd->dg = calloc((size_t)rows * FE, sizeof(float));
    wd->du = calloc((size_t)rows * FE, sizeof(float));
    wd->t = calloc((size_t)rows * R, sizeof(float));
    wd->dt = calloc((size_t)rows * R, sizeof(float));
}

static void world_free(struct world *wd)
{
    for (int i = 0; i < 3 * EE; i++) {
        free(wd->w[i].data);
        free(wd->w[i].grad);
        for (int k = 0; k < 2; k++) {
            free(wd->ad[i][k].data);
            free(wd->ad[i][k].grad);
        }
    }
    float *b[] = {wd->eg, wd->eu, wd->x, wd->dy, wd->y, wd->dx, wd->act, wd->dact, wd->dg, wd->du, wd->t, wd->dt};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void one_case(const char *label, int lora, int adapters, const struct mt_ops_i *ops)
{
    int rows = 0;
    for (int g = 0; g < NG; g++) rows += CNT[g];
    struct world a, b;   /* a: grouped, b: the per-expert loop */
    world_make(&a, lora, adapters, rows);
    world_make(&b, lora, adapters, rows);

    struct mt_piece_ctx pc;
    memset(&pc, 0, sizeof pc);
    struct moe_own own;   /* the piece's own struct: only the expert hidden is read */
    memset(&own, 0, sizeof own);
    own.d.Fe = FE;
    pc.ops = ops;
    pc.ly = &a.ly;
    pc.D = D;
    pc.own = &own;
    pc.pw = &a.mw;
    pc.s_act = a.act, pc.s_dact = a.dact, pc.s_dg = a.dg, pc.s_du = a.du, pc.s_lora = a.t, pc.s_dlora = a.dt;
    g_calls = g_overlaps = 0;
    moe_experts_forward(&pc, NG, CNT, 0, EE, a.eg, a.eu, a.y, a.x);
    moe_experts_backward(&pc, NG, CNT, 0, EE, a.eg, a.eu, a.dx, a.dy, a.x);
    EXPECT(g_calls > 0, "%s: gemm_grouped never called", label);
    EXPECT(g_overlaps == 0, "%s: %d overlapping C pairs in gemm_grouped calls", label, g_overlaps);

    size_t o = 0;
    for (int g = 0; g < NG; g++) {
        int c = CNT[g];
        struct mt_param *w = &b.w[3 * (g % EE)];
        if (c > 0) {
            mlp_forward(ops, b.t, b.y + o * D, 0, b.eg + o * FE, b.eu + o * FE, b.act, b.x + o * D, &w[0],
                        &w[1], &w[2], c, D, FE);
            mlp_backward(ops, b.t, b.dt, b.dx + o * D, 0, b.act, b.dact, b.dg, b.du, b.dy + o * D, b.x + o * D,
                         b.eg + o * FE, b.eu + o * FE, &w[0], &w[1], &w[2], c, D, FE);
        }
        o += (size_t)c;
    }
    EXPECT(same(a.y, b.y, (size_t)rows * D), "%s: y differs", label);
    EXPECT(same(a.eg, b.eg, (size_t)rows * FE) && same(a.eu, b.eu, (size_t)rows * FE),
           "%s: saved gate/up differ", label);
    EXPECT(same(a.dx, b.dx, (size_t)rows * D), "%s: dx differs", label);
    int grads = 0, untouched = 0;
    for (int i = 0; i < 3 * EE; i++) {
        const struct mt_param *p = &a.w[i];
        if (lora) {
            int kept = 1;
            for (size_t e = 0; e < p->numel; e++) kept &= p->grad[e] == POISON;
            EXPECT(kept, "%s: frozen expert weight %d got a gradient", label, i);
            untouched += kept;
        } else {
            EXPECT(same(p->grad, b.w[i].grad, p->numel), "%s: weight %d grad differs", label, i);
            grads++;
        }
        if (!adapters) continue;
        for (int k = 0; k < 2; k++) {
            EXPECT(same(a.ad[i][k].grad, b.ad[i][k].grad, a.ad[i][k].numel), "%s: adapter %d %c grad differs", label,
                   i, k ? 'B' : 'A');
            grads++;
        }
    }
    printf("%s: %d rows in %d groups, %d grouped calls, %d gradients bit-identical, %d frozen untouched\n", label,
           rows, NG, g_calls, grads, untouched);
    world_free(&a);
    world_free(&b);
}

int main(void)
{
    g_cpu = mt_ops_cpu();
    struct mt_ops_i ops = *g_cpu;
    ops.gemm_grouped = checked_grouped;
    one_case("full", 0, 0, &ops);
    one_case("lora, expert adapters", 1, 1, &ops);
    one_case("lora, frozen experts", 1, 0, &ops);
    if (n_fail) {
        printf("test_moe_experts: FAILED\n");
        return 1;
    }
    printf("test_moe_experts: ok\n");
    return 0;
}
