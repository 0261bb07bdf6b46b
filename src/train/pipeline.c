/*
 * pipeline.c — the microbatches of one step, forward and backward: a plain
 * loop on one stage (pp = 1), the 1F1B schedule across stages (pp > 1).
 * Plain functions: a failure returns from the function that met it.
 */
#include <stddef.h>

#include "../parallel/mt_axis.h"
#include "../parallel/mt_layout.h"
#include "train_impl.h"

/*
 * HOW IT WORKS — the pipeline (pp > 1). Stage s holds layers
 * [first_layer[s], first_layer[s+1]); the embedding lives on stage 0, the
 * final norm and head on stage pp-1. Each stage reads the microbatch's tokens
 * itself (the data order is a pure function of the step), so only
 * activations (forward) and their gradients (backward) cross stages: Nr x D
 * floats per microbatch and model rank, to the same model rank of the
 * neighbour stage. 1F1B (Megatron's non-interleaved schedule) with M
 * microbatches on stage s:
 *
 *     warm-up   w = min(pp-s-1, M) forwards
 *     steady    M-w times: forward, then backward of the oldest in flight
 *     cool-down the w remaining backwards
 *
 * so at most min(M, pp-s) microbatches have saved activations (one model
 * slot each; measured). The sends and receives of one tick go out as ONE
 * batched operation (ppa_tick: every Isend/Irecv posted, one wait-all),
 * e.g. "send my output of F(i), receive the gradient for B(j)".
 */
/* one tick's P2P: any of send/recv activations/gradients (NULL = none; ppa_tick, src/parallel/pipe_axis.c) */
static enum mt_status pipe_tick(struct mt_ctx *ctx, struct run_state *rs, const float *send_act, float *recv_act,
                                const float *send_grad, float *recv_grad)
{
    size_t cnt = (size_t)mt_model_stage_rows(rs->model) * (size_t)rs->cfg->d_model;
    return ppa_tick(ctx, rs->pipec, rs->stage, cnt, send_act, recv_act, send_grad, recv_grad);
}

/* The tokens of microbatch mb of `step` into rs->idx / rs->tgt: this data
 * rank's sequences dp_rank*Gl + mb*Bm + i of the global batch (the same
 * global batch whatever the mesh: mt_data_sequence). */
static void load_microbatch(struct run_state *rs, int step, int mb)
{
    const int T = rs->cfg->seq_len, G = rs->cfg->batch_size;
    for (int i = 0; i < rs->Bm; i++)
        mt_data_sequence(rs->train, step, G, mt_layout_sequence(rs->dp_rank, rs->Gl, mb, rs->Bm, i), T,
                         rs->idx + (size_t)i * T, rs->tgt + (size_t)i * T);
}

/* Forward only of the microbatch already in rs->idx / rs->tgt (evaluation):
 * on a pipeline, receive the input, run, send the output. */
enum mt_status mt_train_stage_forward_eval(struct mt_ctx *ctx, struct run_state *rs, const struct mt_loss_norm *norm,
                                           struct mt_loss_parts *parts)
{
    if (rs->pp == 1) return mt_model_forward(ctx, rs->model, rs->idx, rs->tgt, norm, parts);
    const int first = rs->stage == 0, last = rs->stage == rs->pp - 1;
    mt_model_set_slot(rs->model, 0);
    if (!first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
    MT_CHECK(mt_model_forward_stage(ctx, rs->model, rs->idx, rs->tgt, first ? NULL : rs->act_in, norm, parts));
    if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), NULL, NULL, NULL));
    return MT_OK;
}

/* The schedule's position on this stage: the next microbatch to run forward
 * and backward, how many hold saved activations, the time spent computing. */
struct sched {
    int    step, M, n_slots, fwd_next, bwd_next, in_flight;
    double busy_s;
    const struct mt_loss_norm *norm;
    double *part;               /* (n parts) += loss shares (mt_model_loss_parts order) */
};

/* The next microbatch's forward on this stage (its input already received). */
static enum mt_status sched_forward(struct mt_ctx *ctx, struct run_state *rs, struct sched *s)
{
    const int mb = s->fwd_next++;
    struct mt_loss_parts parts;
    mt_model_set_slot(rs->model, mb % s->n_slots);
    load_microbatch(rs, s->step, mb);
    double t = mt_time_sec();
    MT_CHECK(mt_model_forward_stage(ctx, rs->model, rs->idx, rs->tgt, rs->stage == 0 ? NULL : rs->act_in, s->norm,
                                    &parts));
    s->busy_s += mt_time_sec() - t;
    for (int k = 0; k < parts.n; k++) s->part[k] += parts.v[k];
    if (++s->in_flight > rs->in_flight_max) rs->in_flight_max = s->in_flight;
    return MT_OK;
}

/* The oldest in-flight microbatch's backward (its output gradient received). */
static enum mt_status sched_backward(struct mt_ctx *ctx, struct run_state *rs, struct sched *s)
{
    const int mb = s->bwd_next++;
    mt_model_set_slot(rs->model, mb % s->n_slots);
    mt_zero_set_mark_last(&rs->zset, mb == s->M - 1);
    double t = mt_time_sec();
    MT_CHECK(mt_model_backward_stage(ctx, rs->model, rs->stage == rs->pp - 1 ? NULL : rs->grad_in));
    s->busy_s += mt_time_sec() - t;
    s->in_flight--;
    return MT_OK;
}

/* 1F1B on stage s (see HOW IT WORKS): warm-up forwards, the steady
 * forward-backward pairs, cool-down backwards. */
static enum mt_status one_f_one_b(struct mt_ctx *ctx, struct run_state *rs, struct sched *s)
{
    const int pp = rs->pp, st = rs->stage, first = st == 0, last = st == pp - 1, M = s->M;
    const int warm = pp - st - 1 < M ? pp - st - 1 : M, rem = M - warm;
    for (int i = 0; i < warm; i++) {
        if (!first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
        MT_CHECK(sched_forward(ctx, rs, s));
        if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), NULL, NULL, NULL));
    }
    if (rem > 0 && !first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
    for (int i = 0; i < rem; i++) {
        MT_CHECK(sched_forward(ctx, rs, s));
        /* send F's output and receive the gradient for the oldest microbatch: one batch */
        if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), NULL, NULL, rs->grad_in));
        MT_CHECK(sched_backward(ctx, rs, s));
        if (!first)
            MT_CHECK(pipe_tick(ctx, rs, NULL, i == rem - 1 ? NULL : rs->act_in, mt_model_stage_dinput(rs->model), NULL));
    }
    for (int i = 0; i < warm; i++) {
        if (!last) MT_CHECK(pipe_tick(ctx, rs, NULL, NULL, NULL, rs->grad_in));
        MT_CHECK(sched_backward(ctx, rs, s));
        if (!first) MT_CHECK(pipe_tick(ctx, rs, NULL, NULL, mt_model_stage_dinput(rs->model), NULL));
    }
    return MT_OK;
}

/* All microbatches of one step, forward and backward; part[k] += loss part k's
 * shares (each microbatch's, already normalised by the global counts; the
 * world all-reduce in step.c adds the other ranks' and stages'). Only the
 * last stage computes the head's parts, only stages with MoE layers the
 * router's: a stage adds 0 for the rest.
 * Gradients accumulate (+=) over the microbatches; the engines reduce after
 * the last one (stages 0/1) or after each (stages 2/3). */
enum mt_status mt_train_microbatches(struct mt_ctx *ctx, struct run_state *rs, int step,
                                     const struct mt_loss_norm *norm, double *part)
{
    const int M = rs->cfg->microbatches;
    if (rs->pp == 1) {
        struct mt_loss_parts parts;
        for (int mb = 0; mb < M; mb++) {
            load_microbatch(rs, step, mb);
            mt_zero_set_mark_last(&rs->zset, mb == M - 1);
            MT_CHECK(mt_model_forward(ctx, rs->model, rs->idx, rs->tgt, norm, &parts));
            MT_CHECK(mt_model_backward(ctx, rs->model));
            for (int k = 0; k < parts.n; k++) part[k] += parts.v[k];
        }
        rs->in_flight_max = 1;
        return MT_OK;
    }
    struct sched s = {.step = step, .M = M, .n_slots = mt_model_n_slots(rs->model), .norm = norm, .part = part};
    double t_wall = mt_time_sec();
    MT_CHECK(one_f_one_b(ctx, rs, &s));
    rs->pipe_busy_s += s.busy_s;
    rs->pipe_wall_s += mt_time_sec() - t_wall;
    return MT_OK;
}
