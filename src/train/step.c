/*
 * step.c — one training step of one rank, and the evaluation pass.
 *
 * The step, as in llm.c's train loop:
 *
 *     zero grads          mt_zero_set_zero_grad      (every engine)
 *     forward, backward   mt_train_microbatches      (pipeline.c: grads +=)
 *     reduce              mt_zero_set_reduce         (each engine over its group)
 *     loss                one all-reduce of the loss shares (world)
 *     clip norm           mt_zero_set_clip_norm      (fp64, world)
 *     update              mt_zero_set_step           (the optimizers clip inside)
 *     sync                mt_zero_set_sync           (ZeRO-1/2 all-gather)
 *
 * The global batch at step s is the same set of sequences whatever the mesh
 * (mt_data_sequence), and the loss is normalised by global counts, so every
 * mesh computes the loss of one rank (SPEC.md, equivalence).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../parallel/mt_layout.h"
#include "../core/mt_knobs.h"
#include "../model/mt_blocks.h"
#include "../optim/mt_optim.h"
#include "train_impl.h"

/* Routed slots per expert this step over the whole world: the load
 * histogram (run totals) and the step's imbalance (busiest expert / mean,
 * averaged over the MoE layers). */
static enum mt_status moe_load_step(struct mt_ctx *ctx, struct run_state *rs, double *imbalance)
{
    const struct mt_config *cfg = rs->cfg;
    const int EZ = cfg->n_experts + cfg->n_null_experts;   /* histogram columns: real experts, then null ones */
    const size_t LE = (size_t)cfg->n_layer * (size_t)(EZ > 0 ? EZ : 1);
    memcpy(rs->load_step, mt_model_moe_load(rs->model), LE * sizeof(double));
    MT_CHECK(mt_comm_allreduce(ctx, mt_mesh_world_comm(rs->mesh), rs->load_step, LE, MT_DTYPE_F64, MT_REDOP_SUM));
    double imb = 0;
    int nl = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (!mt_blocks_layer_routed(cfg, l)) continue;
        double mx = 0, sum = 0;
        for (int e = 0; e < EZ; e++) {
            double v = rs->load_step[(size_t)l * EZ + e];
            rs->load_total[(size_t)l * EZ + e] += v;
            if (e >= cfg->n_experts) continue;   /* the imbalance is over the real experts */
            sum += v;
            if (v > mx) mx = v;
        }
        if (sum > 0) { imb += mx / (sum / cfg->n_experts); nl++; }
    }
    *imbalance = nl ? imb / nl : 0;
    return MT_OK;
}

/* CUDA graphs (knob cuda_graphs; docs/cuda.md "CUDA graphs"): on for a
 * one-GPU mesh whose step has static shapes. Off, with the reason the
 * receipt gives, on several ranks (collectives and their host waits split
 * the step, and a multi-rank graph needs NCCL captured on every rank) and
 * with MoE layers whose grouped expert GEMMs take their sizes on the host
 * from a per-step device-to-host read of the expert offsets (the shapes
 * change every step; knob moe_sizes: with the sizes on the device the
 * step's shapes are static and graphs run). With ReDo, off for the step
 * that scores its units (its backward adds the scoring ops and clears the
 * accumulators) and the one after its event (the rewritten tensors' shadows are refreshed): those
 * steps' ops differ from the captured ones, and a replayed op that differs
 * is a sticky error (graph.cu). The next step turns them on again: recorded,
 * captured and replayed anew (two steps), once every redo_every steps. */
static void graphs_mode(struct mt_ctx *ctx, const struct run_state *rs, int step)
{
    if (!rs->ops->graph_mode) return;   /* cpu: no graphs */
    const struct mt_config *cfg = rs->cfg;
    const int world = mt_comm_size(rs->sumc);
    const char *host_why = "";
    const int moe_host = !mt_model_moe_device_sizes(rs->model, &host_why);
    char why[200] = "";
    if (!mt_knob_int(ctx, MT_KNOB_CUDA_GRAPHS))
        snprintf(why, sizeof why, "off: cuda_graphs=0");
    else if (world > 1)
        snprintf(why, sizeof why, "off: %d ranks (graphs are for a one-GPU mesh)", world);
    else if (moe_host)
        snprintf(why, sizeof why, "off: MoE layers size the expert GEMMs on the host from a per-step read of the "
                                  "expert offsets (moe_sizes host: %s)", host_why);
    else if (cfg->redo_every > 0 && ((step + 1) % cfg->redo_every == 0 || (step > 0 && step % cfg->redo_every == 0)))
        snprintf(why, sizeof why, "off this step: ReDo scores its units or has just rewritten some (the step's "
                                  "operations differ; on again the next step)");
    rs->ops->graph_mode(rs->ops->be, why[0] == 0, why);
}

enum mt_status mt_train_step(struct mt_ctx *ctx, struct run_state *rs, int step, struct mt_train_step_out *out)
{
    const struct mt_config *cfg = rs->cfg;
    const double G = cfg->batch_size, T = cfg->seq_len;
    /* targets are never -1 in the default order; the count stays general */
    const struct mt_loss_norm norm = {.n_targets = G * T, .n_sequences = G, .n_tokens = G * T};
    int n_part;   /* loss shares: lm, aux, z, extras (mt_model_loss_parts) */
    mt_model_loss_parts(rs->model, &n_part);
    double *part = out->part;
    memset(out->part, 0, sizeof out->part);
    out->n_part = n_part;

    graphs_mode(ctx, rs, step);
    /* ReDo (redo.c): the step whose update is followed by an event scores its units in its backward passes */
    const int redo = cfg->redo_every > 0 && (step + 1) % cfg->redo_every == 0;
    if (redo && !rs->ops->redo_score_acc)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "redo_every: the %s backend has no redo_score_acc", rs->ops->name);
    mt_model_redo_arm(rs->model, redo);
    mt_zero_set_zero_grad(&rs->zset, step);
    mt_model_moe_load_reset(rs->model);
    MT_CHECK(mt_train_microbatches(ctx, rs, step, &norm, part));      /* forward + backward */
    if (redo) mt_model_redo_arm(rs->model, 0);
    MT_CHECK(mt_zero_set_reduce(ctx, &rs->zset));
    out->imbalance = 0;
    if (rs->imbalance) MT_CHECK(moe_load_step(ctx, rs, &out->imbalance));

    /* the loss sums meet here: the first point where every rank waits for the slowest (idle) */
    double ti = mt_time_sec();
    MT_CHECK(mt_comm_allreduce(ctx, rs->sumc, part, (size_t)n_part, MT_DTYPE_F64, MT_REDOP_SUM));
    out->idle_s = mt_time_sec() - ti;
    out->loss = mt_loss_parts_total(part, n_part);

    MT_CHECK(mt_zero_set_clip_norm(ctx, &rs->zset, rs->count, rs->sumc, &out->grad_norm));
    /* a failed kernel or copy poisons the sums (cuda: sumsq -> NaN): every rank asks its
     * backend first, and a failure anywhere is the error, agreed (the culprit search below
     * is collective), rather than the numbers it left */
    if (!isfinite(out->loss) || !isfinite(out->grad_norm))
        MT_CHECK(mt_comm_agree(ctx, rs->sumc, mt_train_backend_status(ctx, rs->ops), "the step's kernels"));
    /* the norm carries the pre-reduction finiteness marks: name the culprit here */
    if (!isfinite(out->grad_norm)) MT_CHECK(mt_zero_set_nonfinite_culprit(ctx, &rs->zset, rs->sumc, step));
    if (!isfinite(out->loss) || !isfinite(out->grad_norm))
        return mt_ctx_error(ctx, MT_ERR_NUMERIC, "non-finite %s at step %d on rank %d",
                            isfinite(out->loss) ? "gradient norm" : "loss", step, ctx->rank);
    MT_CHECK(mt_zero_set_step(ctx, &rs->zset, step, out->grad_norm));   /* update (clipped) */
    if (redo) MT_CHECK(mt_train_redo_event(ctx, rs, step + 1));      /* before the sync spreads it */
    MT_CHECK(mt_zero_set_sync(ctx, &rs->zset));
    /* precision=bf16: every shadow is stale but those the update wrote itself (AdamW on the
     * tensors this rank updates whole: mt_zero_bf16_mark_fresh); the rest are rewritten at the next forward */
    mt_model_bf16_invalidate(rs->model);
    mt_zero_set_bf16_mark_fresh(&rs->zset);
    return MT_OK;
}

/* Validation loss: eval_batches global batches of the val stream (fixed: the
 * same sequences every evaluation), forward only. Each data rank evaluates
 * its share of every batch; the sums meet in one all-reduce. */
enum mt_status mt_train_evaluate(struct mt_ctx *ctx, struct run_state *rs, double *out)
{
    const struct mt_config *cfg = rs->cfg;
    int G = cfg->batch_size, T = cfg->seq_len, Gl = G / rs->dp_size, Bm = rs->Bm;
    struct mt_loss_norm norm = {.n_targets = (double)G * T, .n_sequences = G, .n_tokens = (double)G * T};
    double sum = 0;
    for (int b = 0; b < cfg->eval_batches; b++) {
        for (int mb = 0; mb < Gl / Bm; mb++) {
            for (int i = 0; i < Bm; i++)
                mt_data_sequence(rs->val, b, G, mt_layout_sequence(rs->dp_rank, Gl, mb, Bm, i), T,
                                 rs->idx + (size_t)i * T, rs->tgt + (size_t)i * T);
            struct mt_loss_parts parts;
            MT_CHECK(mt_train_stage_forward_eval(ctx, rs, &norm, &parts));
            sum += parts.v[MT_LOSS_LM];
        }
    }
    MT_CHECK(mt_comm_allreduce(ctx, rs->sumc, &sum, 1, MT_DTYPE_F64, MT_REDOP_SUM));
    *out = sum / cfg->eval_batches;
    return MT_OK;
}

/* Seconds spent blocked in communication so far (cumulative): ZeRO waits and
 * blocking collectives, the model axis's collectives, the expert all-to-alls.
 * The step's exposed communication is the difference across the step. */
double mt_train_exposed_comm_s(const struct run_state *rs)
{
    struct mt_zero_stats zs;
    mt_zero_set_get_stats(&rs->zset, &zs);
    struct mt_tp_stats tps;
    mt_model_tp_stats(rs->model, &tps);
    struct mt_ep_stats eps;
    mt_model_ep_stats(rs->model, &eps);
    return zs.wait_s + tps.time_s + eps.a2a_s;
}
