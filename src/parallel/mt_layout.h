/*
 * mt_layout.h — the mesh rules, in one place: which group reduces which
 * tensor, who owns which sequence, who writes which checkpoint slice, which
 * replicas must agree, what the trainer's host arrays weigh, and where the
 * pipeline is cut. The planner (plan.c, `meshtrain plan`) and the trainer
 * (setup.c, pipeline.c, report.c, train_ckpt.c) both read these and nothing
 * else, so a prediction and a run cannot disagree on a rule, and neither
 * module calls the other (issue 14: the plan <-> trainer cycle is gone).
 *
 * Every function is pure (no allocation, no communication) except
 * mt_layout_pipeline_cut, which allocates its DP tables on ctx.
 *
 * Example (the engines of a rank, as the trainer builds them):
 *     for (int i = 0; i < n_params; i++) {
 *         enum mt_layout_engine e = mt_layout_param_engine(&params[i], &dims);
 *         struct mt_comm *c = mt_mesh_comm(mesh, mt_layout_engine_group(&dims, e));
 *         ...
 *     }
 */
#ifndef MT_LAYOUT_H
#define MT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "../core/mt_config.h"
#include "../core/mt_core.h"
#include "../core/mt_param.h"
#include "mt_mesh.h"
#include "../model/mt_blocks.h"
#include "../model/mt_model.h"

/* ---- reduction group per tensor ------------------------------------------ */

/* ZeRO engines: one per reduction group (SPEC.md section 2). */
enum mt_layout_engine {
    MT_LAYOUT_ENGINE_DENSE = 0,   /* data x expert: dense parameters                              */
    MT_LAYOUT_ENGINE_PARTIAL,     /* data x expert x model (tp > 1): partial sums over the model axis */
    MT_LAYOUT_ENGINE_EXPERT,      /* data (x model under TP) (ep > 1): this rank's experts         */
    MT_LAYOUT_ENGINE_COUNT
};
/* Engine of a layout class on this mesh (d->sp set: mt_mesh_dims_set_sp):
 *   EXPERT   ep > 1 and class EXPERT;
 *   PARTIAL  tp > 1 and the class's grad is partial over the model group
 *            (MODEL_PARTIAL, EXPERT without EP, RESIDUAL under SP);
 *   DENSE    everything else (TP_ROWS / TP_COLS: complete grads). */
enum mt_layout_engine mt_layout_class_engine(enum mt_layout l, const struct mt_mesh_dims *d);
/* Engine of a parameter (its class, p->layout, as the model registered it). */
enum mt_layout_engine mt_layout_param_engine(const struct mt_param *p, const struct mt_mesh_dims *d);
/* Engines the trainer creates: one past the highest mt_layout_class_engine
 * of any class on this mesh, i.e. 1, 2 (tp > 1) or 3 (ep > 1). */
int mt_layout_n_engines(const struct mt_mesh_dims *d);
/* The mesh group an engine reduces over. */
enum mt_mesh_group mt_layout_engine_group(const struct mt_mesh_dims *d, enum mt_layout_engine e);
/* A rank's index in its group of kind g (= its comm rank: groups are in world-rank order). */
int mt_layout_group_rank(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g);

/* ---- writer and replica rules -------------------------------------------- */

/* Does model rank tp_rank count a parameter (its gradient norm share) and
 * write it (checkpoint)? A parameter replicated over the model axis yet
 * reduced over data only is identical on every model rank: model rank 0
 * alone counts and writes it. Within the engine's group the owner writes
 * (mt_zero_owner). */
int mt_layout_param_counted(const struct mt_param *p, const struct mt_mesh_dims *d, int tp_rank);
/* Must ranks a and b hold bit-identical copies of a parameter both hold?
 * Yes unless its class is TP-split (TP_ROWS / TP_COLS, tp > 1) and they
 * are different model ranks (different slices). */
int mt_layout_replicas_agree(const struct mt_mesh_dims *d, const struct mt_param *p, int rank_a, int rank_b);

/* ---- sequences ------------------------------------------------------------ */

/* Sequences per microbatch: batch_size / (dp * ep * microbatches). */
int mt_layout_micro_batch(const struct mt_config *cfg, const struct mt_mesh_dims *d);
/* The global index (in the step's batch of G sequences) of sequence i of
 * microbatch mb on data rank dp_rank: data rank r owns [r*Gl, (r+1)*Gl),
 * Gl = G / (dp * ep), in microbatches of Bm. */
static inline int64_t mt_layout_sequence(int dp_rank, int Gl, int mb, int Bm, int i)
{
    return (int64_t)dp_rank * Gl + (int64_t)mb * Bm + i;
}

/* ---- pipeline ------------------------------------------------------------- */

/* Activation slots of a pipeline stage: min(microbatches, pp - stage) (1 without PP). */
int mt_layout_n_slots(const struct mt_config *cfg, const struct mt_mesh_dims *d, int stage);
/* The model's mt_model_par of a rank (communicators NULL). */
void mt_layout_model_par(const struct mt_config *cfg, const struct mt_mesh_dims *d, const int *first_layer, int rank,
                         struct mt_model_par *par);
/* Bytes of ONE pipeline exchange buffer (the trainer's act_in and grad_in,
 * bucket COMM): the stage's rows x d_model floats; 0 without PP. */
size_t mt_layout_stage_io_bytes(const struct mt_model *m, const struct mt_config *cfg, int pp);
/* The pipeline cut: spec "n0,n1,..." (layers per stage) or NULL/"": balanced
 * by cost (the model's per-layer FLOPs, mt_model_layer_flops, plus the head
 * on the last stage). first has pp+1 slots. MT_ERR_INVALID_ARG naming the
 * problem for a bad spec; MT_ERR_CONFIG when n_layer < pp. */
enum mt_status mt_layout_pipeline_cut(struct mt_ctx *ctx, const struct mt_config *cfg, int pp, const char *spec,
                                      int *first);

/* ---- host arrays ---------------------------------------------------------- */

/* The trainer's own host arrays (bucket OTHER), live through the whole run.
 * ONE list sizes them for the planner and the trainer's allocation. */
enum mt_layout_host {
    MT_HOST_ENG_OF = 0, MT_HOST_SEL0, MT_HOST_SEL1, MT_HOST_SEL2, MT_HOST_COUNT_MASK, MT_HOST_IDX, MT_HOST_TGT,
    MT_HOST_STEP_INDEX, MT_HOST_EVAL_STEPS, MT_HOST_LOSSES, MT_HOST_LOSS_PARTS, MT_HOST_GNORM,
    MT_HOST_LRS, MT_HOST_TIMES, MT_HOST_EVAL_LOSSES, MT_HOST_MEM_ALL,
    MT_HOST_IMBALANCE, MT_HOST_LOAD_TOTAL, MT_HOST_LOAD_STEP,   /* MoE configs only (0 bytes otherwise) */
    MT_HOST_N
};
#define MT_LAYOUT_MEM_SLOTS (MT_BUCKET_COUNT + 2)   /* per rank, twice: buckets, total, peak RSS */
/* Bytes of each array (0: not allocated) for a rank with n_params
 * parameters, microbatch Bm, n_steps steps, world ranks. */
void mt_layout_host_sizes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world,
                          size_t bytes[MT_HOST_N]);
/* Their sum. */
size_t mt_layout_host_bytes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world);

#endif /* MT_LAYOUT_H */
