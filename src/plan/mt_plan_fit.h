/*
 * mt_plan_fit.h — auto-fit: every layout of a world that fits a memory
 * budget, ranked by predicted step time; and find-max: the largest seq_len
 * or batch_size that fits. The search behind `meshtrain plan --auto` and
 * `--find-max`, as a library (the tool only prints).
 *
 * The search enumerates every mesh (pp, dp, ep, tp) with product = world
 * (meshes with ep > 1 skipped when the model has no E block: the expert axis
 * would be plain data parallelism), every microbatch count that divides the
 * per-data-rank batch, every ZeRO stage (or the one given) and recompute
 * none/block. A candidate is rejected by the startup contract (once per mesh
 * x microbatch count), by the model (a shape it refuses) or by memory (the
 * planner's largest rank total over the budget); the others are costed
 * (mt_plan_cost) and sorted by step time, then memory.
 *
 * Example:
 *     struct mt_plan_fit_opts o = {.world = 8, .mem = 80.0 * (1 << 30), .zero = -1, .find_max = -1,
 *                                  .steps = 10, .prof = &prof};
 *     struct mt_plan_fit fit;
 *     MT_CHECK(mt_plan_fit_search(ctx, &cfg, &o, &fit));
 *     if (fit.n_ok) ... fit.ok[0] is the best ...
 *     mt_plan_fit_free(ctx, &fit);
 */
#ifndef MT_PLAN_FIT_H
#define MT_PLAN_FIT_H

#include "mt_plan.h"

struct mt_plan_fit_opts {
    int    world;
    double mem;                 /* bytes per rank */
    int    zero;                /* -1: every stage 0..3; else only this one */
    int    find_max;            /* -1: auto-fit; 0: largest seq_len; 1: largest batch_size */
    int    steps;               /* for the plan (host arrays) */
    int    threads;             /* the runtime bucket's inputs (mt_plan_setup) */
    double data_bytes;
    const struct mt_plan_runtime *runtime;
    const struct mt_plan_profile *prof;   /* the cost model's machine */
};

struct mt_plan_fit_cand {
    struct mt_mesh_dims d;
    int    zero, mb, rc;        /* zero / rc -1: any (a contract rule rejected the mesh) */
    size_t mem;                 /* the largest rank's total */
    int    mem_rank;
    double step_s, tps, mfu;
    char   reason[320];         /* rejected: why (the rule, then the numbers in parentheses) */
    struct mt_plan_cost cost;
};

struct mt_plan_fit {
    struct mt_plan_fit_cand *ok, *rej;   /* ok sorted by step time, then memory */
    int    n_ok, n_rej, cap_ok, cap_rej;
    int    n_cand;              /* mesh x microbatch count pairs tried */
    int    skipped_ep;          /* meshes with ep > 1 skipped (no E block) */
    size_t smallest;            /* the smallest need of any plannable layout (0: none) */
    struct mt_plan_fit_cand smallest_c;
    long   best_val;            /* find-max: the value (0: none fits) */
    struct mt_plan_fit_cand best_fm;     /* ... and its layout */
};

/* Run the search (opts->find_max selects which). MT_ERR_OOM only: every
 * other failure is a rejected candidate with its reason. Free with
 * mt_plan_fit_free (also after a failure). */
enum mt_status mt_plan_fit_search(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_fit_opts *o,
                                  struct mt_plan_fit *out);
void mt_plan_fit_free(struct mt_ctx *ctx, struct mt_plan_fit *fit);
/* The full plan of one candidate (cfg with its microbatches and recompute,
 * the balanced pipeline cut, o's steps and runtime inputs). Free with
 * mt_plan_destroy. */
enum mt_status mt_plan_fit_plan(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_plan_fit_cand *c,
                                const struct mt_plan_fit_opts *o, struct mt_plan **out);

/* find-max on ONE planned layout (plan made for cfg on mesh d): the largest
 * seq_len (what 0) or batch_size (what 1), a multiple of *unit (the step of
 * the searched value on d), whose plan fits mem per rank; 0 if none, with
 * *need the memory the smallest value needs. Monotone in the value assumed
 * (binary search). The plan is re-selected on the way. */
long mt_plan_fit_find_max(struct mt_ctx *ctx, struct mt_plan *plan, const struct mt_config *cfg,
                          const struct mt_mesh_dims *d, int world, int what, double mem, long *unit, size_t *need);
/* The largest bucket of a rank's bytes. */
int mt_plan_fit_largest_bucket(const size_t *b);

/* The meshes of a world in search order (pp, then tp, then ep; dp derived):
 * how many; the first cap into out (out may be NULL). */
int mt_plan_fit_meshes(int world, struct mt_mesh_dims *out, int cap);
/* "pp=1,dp=8,ep=1,tp=1" */
void mt_plan_fit_mesh_str(const struct mt_mesh_dims *d, char *buf, size_t n);
/* bytes in binary units: "1.50 GiB", "512 B" */
const char *mt_plan_fit_human(double bytes, char *buf, size_t n);

#endif /* MT_PLAN_FIT_H */
