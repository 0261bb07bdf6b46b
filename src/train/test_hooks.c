/*
 * test_hooks.c — test-only fault injection, named as such and kept out of
 * the step: the loop calls these only when the knob test_fault (env alias
 * MT_FAULT) names this rank and step (mt_train_fault_armed).
 *
 * test_fault = "RANK:STEP:KIND", KIND one of
 *   nan      poison a gradient before its reduction
 *   fresh    the gradients left to their first GEMM start the step as NaN
 *            (every engine of this rank; a write that adds to one first shows)
 *   error    the rank returns a runtime error
 *   signal   the rank kills itself with SIGKILL
 *   stop     the rank stops itself with SIGSTOP (the others' watchdog ends the job)
 *   replica  after the update, one ulp on this rank's copy of a replicated gain
 *   oom      (STEP ignored) the rank's first model allocation fails during setup
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "train_impl.h"

void mt_train_fault_parse(struct mt_train_fault *f, const char *spec)
{
    f->rank = f->step = -1;
    f->kind[0] = 0;
    if (spec) sscanf(spec, "%d:%d:%15s", &f->rank, &f->step, f->kind);
}

int mt_train_fault_armed(const struct run_state *rs, int step)
{
    return rs->fault.kind[0] && rs->fault.rank == mt_mesh_rank(rs->mesh) && rs->fault.step == step;
}

/* Kind "oom": the next allocation (the model's first) fails on this rank. */
void mt_train_fault_setup(struct mt_ctx *ctx, const struct run_state *rs)
{
    if (rs->fault.rank == mt_mesh_rank(rs->mesh) && !strcmp(rs->fault.kind, "oom")) ctx->fail_after = 1;
}

enum mt_status mt_train_fault_before_step(struct mt_ctx *ctx, struct run_state *rs, int step)
{
    const char *kind = rs->fault.kind;
    if (!strcmp(kind, "signal")) raise(SIGKILL);
    if (!strcmp(kind, "stop")) raise(SIGSTOP); /* a stalled rank: the others' watchdog ends the job */
    if (!strcmp(kind, "error"))
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "injected failure (MT_FAULT) on rank %d at step %d", ctx->rank,
                            step);
    if (!strcmp(kind, "fresh"))
        for (int k = 0; k < rs->zset.n; k++) mt_zero_inject_fresh_nan(rs->zset.z[k], step);
    if (!strcmp(kind, "nan")) {
        /* the last parameter this rank holds, in its own engine and unit: the
         * model's last unit is absent on pipeline stage 0, and under TP its
         * parameters are not in the dense engine (issue 13); under LoRA the
         * last trainable one (a frozen tensor has no gradient) */
        int n_params;
        const struct mt_param *pr = mt_model_params(rs->model, &n_params);
        int i = n_params - 1;
        while (i > 0 && (rs->eng_of[i] >= rs->zset.n || pr[i].frozen)) i--;
        mt_zero_inject_nan(rs->zset.z[rs->eng_of[i]], step, mt_model_param_unit(rs->model, i));
    }
    return MT_OK;
}

/* Kind "replica": after the step's update, move element 0 of the last
 * RMSNorm gain this rank holds (a tensor replicated over data and model) by
 * one ulp, so that exactly this rank's copy differs from its replicas. The
 * replica check at the end of the run must name it; it runs once, so the
 * copy must survive to the end: the last step, or any step under ZeRO-0
 * (ZeRO-1/2 overwrite a non-owner's copy at the next all-gather). */
enum mt_status mt_train_fault_after_update(struct mt_ctx *ctx, struct run_state *rs, int step)
{
    if (strcmp(rs->fault.kind, "replica")) return MT_OK;
    const struct mt_ops_i *ops = rs->ops;
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    for (int i = n - 1; i >= 0; i--) {
        float *d = (float *)mt_zero_param_data(rs->zset.z[rs->eng_of[i]], i);
        if (params[i].role != MT_ROLE_GAIN || !d) continue;
        float v;
        ops->copy_to_host(ops->be, &v, d, sizeof v);
        v = nextafterf(v, INFINITY);
        ops->copy_from_host(ops->be, d, &v, sizeof v);
        fprintf(stderr, "MT_FAULT: rank %d moved %s[0] by one ulp after step %d\n", ctx->rank, params[i].name, step);
        return MT_OK;
    }
    return mt_ctx_error(ctx, MT_ERR_RUNTIME, "MT_FAULT replica: rank %d holds no gain to perturb", ctx->rank);
}
