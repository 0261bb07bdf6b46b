/*
 * report.c — what the run tells: the GEMM roof that MFU is measured
 * against, the progress line, the replica check, the memory phases, and the
 * receipt with its distributed section (receipt.c writes the file).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../core/mt_knobs.h"
#include "../model/mt_blocks.h"
#include "../optim/mt_optim.h"
#include "../plan/mt_gpu_info.h"
#include "../parallel/mt_layout.h"
#include "../plan/mt_plan.h"
#include "mt_receipt.h"
#include "train_impl.h"

/* Peak FLOP/s that MFU is measured against: the median of several square
 * sgemms of a few sizes through the same ops table the model uses (so it
 * measures the kernels the run really had), with its spread
 * (src/ops/cpu/roof.c). */
double mt_train_measure_gemm_roof(const struct mt_ops_i *ops, struct mt_ops_roof *roof)
{
    return mt_ops_measure_roof(ops, (const int[]){768, 1536}, 2, 5, roof);
}

void mt_train_progress(const struct mt_train_opts *opts, int tty, int step, int steps, double loss, double tok_s,
                       double mfu, double eta_s, double gnorm, const struct mt_loss_part *parts, const double *part,
                       int n_part)
{
    if (opts->quiet) return;
    /* the loss's parts, when more than one enters the gradient (MoE: lm aux z;
     * a dense model's line shows the loss alone), after the fixed fields */
    char pl[256] = "";
    int n_active = 0;
    for (int k = 0; k < n_part; k++) n_active += parts[k].backward != 0;
    for (int k = 0, o = 0; n_active > 1 && k < n_part && o < (int)sizeof pl; k++)
        if (parts[k].backward)
            o += snprintf(pl + o, sizeof pl - (size_t)o, tty ? " | %s %.4f" : " %s %.6f", parts[k].name, part[k]);
    if (tty) {
        fprintf(stdout, "\rstep %5d/%d | loss %.4f | gnorm %.3f | %8.0f tok/s | MFU %5.1f%% | ETA %5.0fs%s   ",
                step, steps, loss, gnorm, tok_s, 100.0 * mfu, eta_s, pl);
        if (step == steps) fputc('\n', stdout);
    } else {
        /* MFU as a percentage everywhere (this line, the terminal's, the done line) */
        fprintf(stdout, "step %d/%d loss %.6f gnorm %.4f tok/s %.0f mfu %.2f%% eta_s %.0f%s\n", step, steps, loss,
                gnorm, tok_s, 100.0 * mfu, eta_s, pl);
    }
    fflush(stdout);
}

void mt_train_progress_startup(const struct mt_train_opts *opts, int tty, const struct mt_train_run_info *ri,
                               double first_step_s)
{
    if (opts->quiet) return;
    if (first_step_s < 0) {
        fprintf(stdout, "startup: setup %.2f s | param init %.2f s | roof %.2f s | step 1 starts at %.2f s\n",
                ri->setup_s, ri->param_init_s, ri->roof_s, mt_time_sec() - ri->t_entry);
        /* one line on what the progress numbers mean, and the peak behind MFU */
        fprintf(stdout, "progress: tok/s = global batch tokens / that step's time (the done line: the mean over "
                "the steps after warm-up); MFU = model FLOP/s as a %% of a peak of %.1f GFLOP/s, %s%s\n",
                ri->peak / 1e9, ri->peak_src,
                strncmp(ri->peak_src, "measured at startup", 19) ? ""
                                                                   : " (it moves with the machine's load: --peak-flops F fixes it)");
    }
    else
        fprintf(stdout, "%sfirst step %.2f s | %.2f s to first step\n", tty ? "\n" : "", first_step_s,
                ri->to_first_step_s);
    fflush(stdout);
}

/* Replica check: every rank hashes (xxh64) each parameter it holds in full
 * (its TP slice for a split one); the hashes meet over the world and every
 * pair of ranks that hold the same slice must agree bit for bit: a split
 * parameter across its data group, a replicated one across data and model.
 * ZeRO-3 holds one copy of each parameter per reduction group, on its owner:
 * only the owners' copies are hashed, so what is compared is a tensor whose
 * group does not span the model axis (a whole tensor reduced over data only,
 * tp > 1 without SP: one owner per model rank); with no such tensor the
 * check says so. */
enum mt_status mt_train_replica_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct run_state *rs,
                                      int zero_stage, char *out, size_t n_out, int *mismatch)
{
    *mismatch = 0;
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    struct mt_comm *wc = mt_mesh_world_comm(rs->mesh);
    int W = mt_comm_size(wc);
    if (W == 1) {
        snprintf(out, n_out, "not applicable: world=1, every tensor has one copy");
        return MT_OK;
    }
    /* hashes indexed by the GLOBAL registry: under PP / EP ranks hold different
     * parameter lists; 0 marks "not held here" */
    const int tp_ = mt_mesh_get_dims(rs->mesh)->tp;   /* the layout classes of this model axis */
    int ng = mt_model_registry_tp(rs->cfg, tp_, NULL, 0);
    size_t maxn = 1;
    for (int i = 0; i < n; i++) if (params[i].numel > maxn) maxn = params[i].numel;
    float *host = mt_alloc(ctx, maxn * sizeof(float), MT_BUCKET_WORKSPACE);
    int64_t *h = mt_alloc(ctx, (size_t)ng * (size_t)(W + 1) * sizeof(int64_t), MT_BUCKET_OTHER);
    struct mt_param *glob = mt_alloc(ctx, (size_t)ng * sizeof *glob, MT_BUCKET_OTHER);
    if (!host || !h || !glob) { mt_free(ctx, host); mt_free(ctx, h); mt_free(ctx, glob); return MT_ERR_OOM; }
    mt_model_registry_tp(rs->cfg, tp_, glob, ng);
    int64_t *all = h + ng;
    for (int g = 0, i = 0; g < ng; g++) {
        h[g] = 0;
        if (i < n && !strcmp(glob[g].name, params[i].name)) {
            const float *d = mt_zero_param_data(rs->zset.z[rs->eng_of[i]], i);   /* ZeRO-3: NULL unless owned */
            if (d) {
                ops->copy_to_host(ops->be, host, d, params[i].numel * sizeof(float));
                h[g] = (int64_t)(XXH64(host, params[i].numel * sizeof(float), 0) | 1);   /* never 0 */
            }
            i++;
        }
    }
    enum mt_status rc = mt_comm_allgather(ctx, wc, all, h, (size_t)ng, MT_DTYPE_I64);
    if (rc == MT_OK) {
        const struct mt_mesh_dims *d = mt_mesh_get_dims(rs->mesh);
        /* every pair is compared (the count is asserted by the tests: a check
         * comparing nothing must not read "ok"); the first differing tensor is
         * named with the ranks whose copy differs from its first holder's */
        int bad = -1, n_bad = 0, pairs = 0;
        for (int g = 0; g < ng; g++) {
            /* the layout's replica rule: a TP-split parameter has a slice per
             * model rank, compared along data only */
            for (int a = 0; a < W; a++)
                for (int b = a + 1; b < W; b++) {
                    if (!all[(size_t)a * ng + g] || !all[(size_t)b * ng + g]) continue;
                    if (!mt_layout_replicas_agree(d, &glob[g], a, b)) continue;
                    pairs++;
                    if (all[(size_t)a * ng + g] != all[(size_t)b * ng + g]) {
                        n_bad++;
                        if (bad < 0) bad = g;
                    }
                }
        }
        if (bad >= 0) {
            *mismatch = 1;
            /* the first holder of each slice, and the ranks of that slice that differ from it */
            char who[160] = "";
            size_t at = 0;
            int first = -1;
            for (int a = 0; a < W && first < 0; a++) {
                if (!all[(size_t)a * ng + bad]) continue;
                for (int b = a + 1; b < W; b++) {
                    if (!all[(size_t)b * ng + bad] || !mt_layout_replicas_agree(d, &glob[bad], a, b)) continue;
                    if (all[(size_t)b * ng + bad] == all[(size_t)a * ng + bad]) continue;
                    if (first < 0) first = a;
                    if (at < sizeof who) at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? "," : "", b);
                }
            }
            snprintf(out, n_out, "MISMATCH: %s differs: ranks %s vs rank %d (%d of %d rank pairs compared differ)",
                     glob[bad].name, who, first, n_bad, pairs);
        } else if (pairs == 0 && zero_stage == 3) {
            snprintf(out, n_out, "not applicable: ZeRO-3 keeps one copy of every parameter on this mesh (0 rank pairs)");
        } else if (pairs == 0) {
            snprintf(out, n_out, "not applicable: no tensor is held by two ranks (0 rank pairs)");
        } else {
            snprintf(out, n_out, "ok: %d tensors bit-identical (xxh64) on every rank that holds them (%d rank pairs)",
                     ng, pairs);
        }
    }
    mt_free(ctx, glob);
    mt_free(ctx, host);
    mt_free(ctx, h);
    return rc;
}

/* The periodic replica check (config replica_check_every = N): after step
 * `done` when done % N == 0, collective over the world. Each result is kept
 * for the receipt's "replica_checks"; a mismatch ends the run here, on every
 * rank (the same verdict everywhere), naming the step. */
enum mt_status mt_train_replica_check_step(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                           int done)
{
    const int every = rs->cfg->replica_check_every;
    if (every <= 0 || done % every != 0) return MT_OK;
    struct mt_train_replica_log *lg = rs->replica_log;
    if (!lg) {
        lg = rs->replica_log = mt_alloc(ctx, sizeof *lg, MT_BUCKET_OTHER);
        if (!lg) return MT_ERR_OOM;
        lg->n = 0;
        lg->cap = opts->steps / every + 1;
        lg->step = mt_alloc(ctx, (size_t)lg->cap * sizeof *lg->step, MT_BUCKET_OTHER);
        lg->msg = mt_alloc(ctx, (size_t)lg->cap * sizeof *lg->msg, MT_BUCKET_OTHER);
        if (!lg->step || !lg->msg) return MT_ERR_OOM;
    }
    if (lg->n == lg->cap) return MT_OK;   /* a resume counts from its own start: never more than steps / N */
    int mismatch = 0;
    char *msg = lg->msg[lg->n];
    MT_CHECK(mt_train_replica_check(ctx, rs->ops, rs, opts->zero_stage, msg, sizeof lg->msg[0], &mismatch));
    lg->step[lg->n++] = done;
    if (mismatch) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "replica hash check after step %d failed: %s", done, msg);
    return MT_OK;
}

void mt_train_replica_log_free(struct mt_ctx *ctx, struct run_state *rs)
{
    if (!rs->replica_log) return;
    mt_free(ctx, rs->replica_log->step);
    mt_free(ctx, rs->replica_log->msg);
    mt_free(ctx, rs->replica_log);
    rs->replica_log = NULL;
}

/* The receipt's "replica_checks" (JSON text, malloc'ed; NULL when off):
 * {"every": N, "checks": [{"step": s, "result": "ok: ..."}, ...]} */
static char *replica_checks_json(const struct run_state *rs)
{
    if (rs->cfg->replica_check_every <= 0) return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "every", rs->cfg->replica_check_every);
    cJSON *a = cJSON_AddArrayToObject(o, "checks");
    const struct mt_train_replica_log *lg = rs->replica_log;
    for (int i = 0; lg && i < lg->n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", lg->step[i]);
        cJSON_AddStringToObject(e, "result", lg->msg[i]);
        cJSON_AddItemToArray(a, e);
    }
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}

/* memory_plan: the planner's prediction of every rank next to what the rank measured */
static void dist_memory_plan(cJSON *d, const struct run_state *rs, const double *mem_all, int world,
                             const struct mt_plan *plan, const char *plan_err)
{
    const int NB = MEM_SLOTS;   /* buckets + total + RSS, twice per rank: whole run, step loop */
    cJSON *mp = cJSON_AddObjectToObject(d, "memory_plan");
    cJSON_AddStringToObject(mp, "convention",
                            "plan: mt_plan_rank_bytes (the planner of `meshtrain plan`, same size functions as the "
                            "allocations) for the step loop; measured_step_loop: per-bucket peaks of live mt_alloc "
                            "bytes from the first step to the last (evaluation included, checkpoint writes excluded), "
                            "total = peak of the sum; measured_whole_run adds setup (parameter init staging) and the "
                            "checkpoint writer's staging; not planned: the mesh's communicator objects (comm) and "
                            "collective request handles, a few hundred bytes each; measured_over_plan: the step loop's "
                            "mt_alloc total over the plan's buckets (runtime excluded); rss: the process's peak "
                            "resident set (VmHWM) in the step loop and in the whole run, over the plan's total "
                            "(buckets + runtime: libraries, threads, MPI, data; docs/plan.md)");
    cJSON_AddBoolToObject(mp, "rss_phased", rs->rss_phased);
    if (!plan) cJSON_AddStringToObject(mp, "error", plan_err && plan_err[0] ? plan_err : "not computed");
    cJSON *mpr = cJSON_AddArrayToObject(mp, "per_rank");
    double worst = 0, rss_worst = 0;
    for (int r = 0; plan && r < world; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        size_t pb[MT_BUCKET_COUNT];
        mt_plan_rank_bytes(plan, r, pb);
        const double *whole = mem_all + (size_t)r * 2 * NB, *loop = whole + NB;
        cJSON *jp = cJSON_AddObjectToObject(o, "plan"), *jl = cJSON_AddObjectToObject(o, "measured_step_loop");
        cJSON *jw = cJSON_AddObjectToObject(o, "measured_whole_run");
        for (int b = 0; b < MT_BUCKET_COUNT; b++) {
            const char *nm = mt_bucket_name((enum mt_bucket)b);
            cJSON_AddNumberToObject(jp, nm, (double)pb[b]);
            cJSON_AddNumberToObject(jl, nm, loop[b]);
            cJSON_AddNumberToObject(jw, nm, whole[b]);
        }
        struct mt_plan_runtime_terms rt;
        mt_plan_rank_runtime(plan, r, &rt);
        double alloc = (double)mt_plan_rank_alloc_total(plan, r), tot = alloc + rt.total;
        cJSON_AddNumberToObject(jp, "runtime", rt.total);
        cJSON_AddNumberToObject(jp, "total", tot);
        cJSON_AddNumberToObject(jl, "total", loop[MT_BUCKET_COUNT]);
        cJSON_AddNumberToObject(jw, "total", whole[MT_BUCKET_COUNT]);
        double ratio = alloc > 0 ? loop[MT_BUCKET_COUNT] / alloc : 0;
        cJSON_AddNumberToObject(o, "measured_over_plan", ratio);
        if (fabs(ratio - 1) > worst) worst = fabs(ratio - 1);
        cJSON *js = cJSON_AddObjectToObject(o, "rss");
        cJSON_AddNumberToObject(js, "step_loop_peak", loop[MT_BUCKET_COUNT + 1]);
        cJSON_AddNumberToObject(js, "whole_run_peak", whole[MT_BUCKET_COUNT + 1]);
        double rss_ratio = tot > 0 ? loop[MT_BUCKET_COUNT + 1] / tot : 0;
        cJSON_AddNumberToObject(js, "step_loop_over_plan", rss_ratio);
        cJSON_AddNumberToObject(js, "whole_run_over_plan", tot > 0 ? whole[MT_BUCKET_COUNT + 1] / tot : 0);
        if (fabs(rss_ratio - 1) > rss_worst) rss_worst = fabs(rss_ratio - 1);
        cJSON_AddItemToArray(mpr, o);
    }
    if (plan) {
        cJSON_AddNumberToObject(mp, "worst_relative_deviation", worst);
        cJSON_AddNumberToObject(mp, "rss_worst_relative_deviation", rss_worst);
        const struct mt_plan_runtime *rc = mt_plan_get_runtime(plan);
        const struct mt_plan_setup *su = mt_plan_get_setup(plan);
        cJSON *rm = cJSON_AddObjectToObject(mp, "runtime_model");
        cJSON_AddNumberToObject(rm, "threads_per_rank", su->threads);
        cJSON_AddNumberToObject(rm, "data_bytes", su->data_bytes);
        cJSON_AddStringToObject(rm, "source", rc->source);
    }
}

/* collective_bytes_per_step: bytes per step (rank 0), measured next to the analytic figure */
static void dist_collectives(cJSON *d, const struct run_state *rs, const struct mt_zero_stats *zs, int steps,
                             int microbatches, double param_bytes, int stage, int reshard)
{
    static const char *kinds[MT_ZERO_COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather"};
    double an[MT_ZERO_COLL_COUNT] = {0, 0, 0};
    int single = rs->dp_size == 1;
    /* grad_reduce_dtype=bf16: the gradient reductions move 2 bytes per element */
    int red16 = !strcmp(rs->cfg->grad_reduce_dtype, "bf16") && !single;
    double rf = red16 ? 0.5 : 1.0;
    if (!single) {
        if (stage <= 1) an[MT_ZERO_ALLREDUCE] = param_bytes * rf;
        if (stage >= 1 && stage <= 2) an[MT_ZERO_ALLGATHER] = param_bytes;
        if (stage >= 2) an[MT_ZERO_REDUCE_SCATTER] = param_bytes * microbatches * rf;
    }
    if (stage == 3 && !single)   /* forward + backward per microbatch (an upper bound), or once per step */
        an[MT_ZERO_ALLGATHER] = reshard ? param_bytes * (2.0 * microbatches) : param_bytes;
    cJSON *c = cJSON_AddObjectToObject(d, "collective_bytes_per_step");
    cJSON_AddStringToObject(c, "grad_reduce_dtype", red16 ? "bf16" : "fp32");
    for (int k = 0; k < MT_ZERO_COLL_COUNT; k++) {
        cJSON *o = cJSON_AddObjectToObject(c, kinds[k]);
        cJSON_AddNumberToObject(o, "measured", steps > 0 ? zs->bytes[k] / steps : 0);
        cJSON_AddNumberToObject(o, "calls_per_step", steps > 0 ? (double)zs->calls[k] / steps : 0);
        cJSON_AddNumberToObject(o, "analytic", an[k]);
    }
    cJSON_AddStringToObject(c, "convention",
                            "payload bytes: the size of the full buffer each collective covers (fp32, with 64-byte "
                            "alignment padding); analytic: parameter bytes x (ZeRO-0/1 all-reduce 1, ZeRO-1/2 "
                            "all-gather 1, ZeRO-2/3 reduce-scatter 1 per microbatch, ZeRO-3 all-gather up to 2 per "
                            "microbatch: units still held in a gather buffer are not gathered again)");
}

/* grad_zeroing: the gradient bytes the ZeRO engines zeroed per step (rank 0),
 * next to the trainable gradient bytes: the rest were written first by their
 * GEMMs with beta 0 (mt_param.h grad_gemm; docs/zero.md "Gradient zeroing"),
 * on ZeRO-0/1 only: stages 2/3 zero every unit's scratch, first_write 0 */
static void grad_zeroing(cJSON *d, const struct run_state *rs, const struct mt_zero_stats *zs, int steps, int stage)
{
    int n;
    const struct mt_param *p = mt_model_params(rs->model, &n);
    double grad = 0, first = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].frozen) continue;   /* this rank's trainable tensors (its boxes, stage, experts) */
        grad += 4.0 * (double)p[i].numel;
        if (p[i].grad_gemm && stage <= 1) first += 4.0 * (double)p[i].numel;
    }
    cJSON *o = cJSON_AddObjectToObject(d, "grad_zeroing");
    cJSON_AddNumberToObject(o, "zeroed_bytes_per_step", steps > 0 ? 4.0 * zs->zeroed_floats / steps : 0);
    cJSON_AddNumberToObject(o, "gradient_bytes", grad);
    cJSON_AddNumberToObject(o, "first_write_bytes", first);
    cJSON_AddStringToObject(o, "convention",
                            "zeroed: fills by the ZeRO engines (alignment padding included); first_write: "
                            "gradients of grad_gemm parameters, left to their first GEMM (beta 0): ZeRO-0/1 "
                            "only (0 on ZeRO-2/3)");
}

/* tensor_parallel: the model axis's collectives inside the layers (rank 0) */
static void dist_tp(cJSON *d, const struct run_state *rs, int steps)
{
    struct mt_tp_stats tps;
    mt_model_tp_stats(rs->model, &tps);
    cJSON *tpj = cJSON_AddObjectToObject(d, "tensor_parallel");
    cJSON_AddNumberToObject(tpj, "tp", rs->tp);
    static const char *tkinds[MT_TP_COLL_COUNT] = {"allgather", "reduce_scatter", "allreduce"};
    cJSON *tb = cJSON_AddObjectToObject(tpj, "bytes_per_step");
    cJSON *tc = cJSON_AddObjectToObject(tpj, "calls_per_step");
    for (int k = 0; k < MT_TP_COLL_COUNT; k++) {
        cJSON_AddNumberToObject(tb, tkinds[k], steps > 0 ? tps.bytes[k] / steps : 0);
        cJSON_AddNumberToObject(tc, tkinds[k], steps > 0 ? (double)tps.calls[k] / steps : 0);
    }
    const char *mm = mt_mamba_tp_mode(rs->cfg, rs->tp);
    if (mm) {   /* which B/C path the M blocks ran (SPEC 1c, docs/mamba3.md §10) */
        cJSON_AddStringToObject(tpj, "mamba_tp_mode", mm);
        cJSON_AddStringToObject(tpj, "mamba_tp_mode_note",
                                "Mamba-3 B/C: split = by group (mamba_ngroups % tp == 0); replicated = whole on "
                                "every model rank, gradient summed over the model group, gated-norm group sums "
                                "all-reduced");
    }
    cJSON_AddNumberToObject(tpj, "comm_s_total", tps.time_s);
    cJSON_AddStringToObject(tpj, "note", "model-axis collectives inside the layers (rank 0), blocking: all exposed; "
                                         "counted in timing.step_time_split_s.communication; steps = steps run "
                                         "(evaluation passes included)");
}

/* moe: the load histogram, the imbalance series, the expert all-to-alls */
static void dist_moe(cJSON *d, const struct run_state *rs, int steps)
{
    const struct mt_config *cfg = rs->cfg;
    cJSON *mo = cJSON_AddObjectToObject(d, "moe");
    /* knob moe_sizes: whether the per-expert counts stayed on the backend */
    const char *why = "";
    const int dev = mt_model_moe_device_sizes(rs->model, &why);
    cJSON_AddStringToObject(mo, "expert_sizes", dev ? "device" : "host");
    cJSON_AddStringToObject(mo, "expert_sizes_note",
                            dev ? "the expert counts stayed on the backend: grouped bf16 GEMMs read the offsets "
                                  "there (no device-to-host copy in an MoE layer)"
                                : why);
    /* the routed experts' gate and up activations (and d act) as stored: bf16 GEMM outputs or fp32 */
    cJSON_AddStringToObject(mo, "expert_gate_up", mt_model_moe_gate_up_bf16(rs->model) ? "bf16" : "fp32");
    cJSON *hist = cJSON_AddArrayToObject(mo, "tokens_per_expert_total");
    for (int l = 0; l < cfg->n_layer; l++) {
        if (!mt_blocks_layer_routed(cfg, l)) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l);
        cJSON *arr = cJSON_AddArrayToObject(o, "slots");
        const int EZ = cfg->n_experts + cfg->n_null_experts;   /* columns: real experts, then null ones */
        const double *row = rs->load_total + (size_t)l * EZ;
        for (int e = 0; e < cfg->n_experts; e++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(row[e]));
        if (cfg->n_null_experts > 0) {   /* SPEC 1e: the share of the layer's slots routed to a null expert */
            double nul = 0, all = 0;
            for (int e = 0; e < EZ; e++) {
                all += row[e];
                if (e >= cfg->n_experts) nul += row[e];
            }
            cJSON_AddNumberToObject(o, "null_slots", nul);
            cJSON_AddNumberToObject(o, "null_share", all > 0 ? nul / all : 0);
        }
        cJSON_AddItemToArray(hist, o);
    }
    cJSON *im = cJSON_AddArrayToObject(mo, "imbalance_max_over_mean_per_step");
    double mean = 0;
    for (int i = 0; i < steps; i++) {
        cJSON_AddItemToArray(im, cJSON_CreateNumber(rs->imbalance[i]));
        mean += rs->imbalance[i];
    }
    cJSON_AddNumberToObject(mo, "imbalance_mean", steps ? mean / steps : 0);
    cJSON_AddStringToObject(mo, "imbalance_convention",
                            "per step: routed slots of the busiest expert / mean over experts, whole world, "
                            "averaged over MoE layers (1 = perfect balance)");
    struct mt_ep_stats eps;
    mt_model_ep_stats(rs->model, &eps);
    cJSON *epj = cJSON_AddObjectToObject(mo, "expert_parallel");
    cJSON_AddNumberToObject(epj, "ep", rs->ep);
    cJSON_AddNumberToObject(epj, "dispatch_bytes_per_step", steps ? eps.dispatch_bytes / steps : 0);
    cJSON_AddNumberToObject(epj, "all_to_all_s_total", eps.a2a_s);
    cJSON_AddNumberToObject(epj, "all_to_all_calls_per_step", steps ? (double)eps.a2a_calls / steps : 0);
    cJSON_AddStringToObject(epj, "note", "rank 0; rows sent to and received from other expert ranks, forward and "
                                         "backward; blocking, so all of it is exposed");
}

/* pipeline: the cut, the bubble, the microbatches in flight per stage */
static void dist_pipeline(cJSON *d, const struct run_state *rs)
{
    cJSON *pj = cJSON_AddObjectToObject(d, "pipeline");
    cJSON_AddNumberToObject(pj, "pp", rs->pp);
    cJSON *st = cJSON_AddArrayToObject(pj, "stage_layers");
    for (int k = 0; k < rs->pp; k++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "stage", k);
        cJSON_AddNumberToObject(o, "first_layer", rs->first_layer[k]);
        cJSON_AddNumberToObject(o, "end_layer", rs->first_layer[k + 1]);
        cJSON_AddNumberToObject(o, "flops_per_token", mt_model_stage_flops(rs->cfg, rs->first_layer[k], rs->first_layer[k + 1]));
        cJSON_AddItemToArray(st, o);
    }
    const int M = rs->cfg->microbatches;
    cJSON_AddNumberToObject(pj, "microbatches", M);
    cJSON_AddNumberToObject(pj, "bubble_analytic", (double)(rs->pp - 1) / (double)(M + rs->pp - 1));
    cJSON_AddNumberToObject(pj, "bubble_measured_mean_over_stages", rs->bubble_mean);
    cJSON *bs = cJSON_AddArrayToObject(pj, "bubble_measured_per_stage");
    cJSON *inf = cJSON_AddArrayToObject(pj, "max_microbatches_in_flight_per_stage");
    cJSON *act = cJSON_AddArrayToObject(pj, "activation_peak_bytes_per_stage");
    for (int k = 0; k < rs->pp; k++) {
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(rs->stage_bubble[k]));
        cJSON_AddItemToArray(inf, cJSON_CreateNumber(rs->stage_in_flight[k]));
        cJSON_AddItemToArray(act, cJSON_CreateNumber(rs->stage_acts[k]));
    }
    cJSON_AddStringToObject(pj, "bubble_convention",
                            "1 - (time in this stage's forwards and backwards) / (wall time of the 1F1B "
                            "schedule), per stage; analytic (pp-1)/(M+pp-1)");
}

/* A JSON text of the distributed section of the receipt (malloc'ed). */
static char *dist_json(const struct run_state *rs, const char *trace, const double *mem_all, int world,
                       const struct mt_zero_stats *zs, int steps, int microbatches, double param_bytes, int stage,
                       int reshard, const struct mt_plan *plan, const char *plan_err)
{
    const int NB = MEM_SLOTS;   /* buckets + total + RSS, twice per rank: whole run, step loop */
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "trace_rank0", trace);
    char libs[512];
    mt_dist_libraries(libs, sizeof libs);
    cJSON_AddStringToObject(d, "comm_libraries", libs);
    cJSON *g = cJSON_AddObjectToObject(d, "group_sizes");
    for (int k = 0; k < MT_MESH_GROUP_COUNT; k++)
        cJSON_AddNumberToObject(g, mt_mesh_group_name((enum mt_mesh_group)k),
                                mt_mesh_group_size(mt_mesh_get_dims(rs->mesh), (enum mt_mesh_group)k));
    cJSON *pr = cJSON_AddArrayToObject(d, "memory_peak_bytes_per_rank");
    for (int r = 0; r < world; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        for (int b = 0; b < MT_BUCKET_COUNT; b++)
            cJSON_AddNumberToObject(o, mt_bucket_name((enum mt_bucket)b), mem_all[(size_t)r * 2 * NB + b]);
        cJSON_AddItemToArray(pr, o);
    }
    dist_memory_plan(d, rs, mem_all, world, plan, plan_err);
    dist_collectives(d, rs, zs, steps, microbatches, param_bytes, stage, reshard);
    cJSON_AddNumberToObject(d, "parameter_bytes", param_bytes);
    grad_zeroing(d, rs, zs, steps, stage);
    dist_tp(d, rs, steps);
    if (rs->imbalance) dist_moe(d, rs, steps);
    if (rs->pp > 1) dist_pipeline(d, rs);
    cJSON *tun = cJSON_AddObjectToObject(d, "tunables");   /* kept for readers of issue 10's receipts */
    cJSON_AddNumberToObject(tun, "MT_ZERO_OVERLAP", mt_zero_overlap(rs->zset.z[0]));
    cJSON_AddNumberToObject(d, "exposed_comm_s_total", zs->wait_s);
    char *txt = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    return txt;
}

/* Memory peaks by phase. ctx->bytes_peak only grows; the trainer folds it
 * into an accumulator at phase boundaries and restarts it from the live
 * bytes, so "train" holds the peak of the step loop alone (what the plan
 * predicts) and "run" the peak of everything else (setup staging, the
 * checkpoint writer, the receipt). The process's real peak (VmHWM) is
 * phased the same way: at a boundary the heap that the phase freed is given
 * back (malloc_trim: the malloc thresholds of mt_dist_init keep freed memory
 * otherwise) and the kernel's high-water mark restarts from the current RSS
 * (/proc/self/clear_refs "5"); where that write fails, the loop's RSS peak is
 * the whole run's (rss_phased false in the receipt). */

void mt_train_peak_fold(const struct mt_ctx *ctx, struct mt_train_peaks *acc)
{
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        if ((double)ctx->bytes_peak[b] > acc->b[b]) acc->b[b] = (double)ctx->bytes_peak[b];
    if ((double)ctx->bytes_peak_total > acc->b[MT_BUCKET_COUNT]) acc->b[MT_BUCKET_COUNT] = (double)ctx->bytes_peak_total;
    double rss = (double)mt_peak_rss_bytes();
    if (rss > acc->b[MT_BUCKET_COUNT + 1]) acc->b[MT_BUCKET_COUNT + 1] = rss;
}

void mt_train_peak_restart(struct mt_ctx *ctx, struct run_state *rs)
{
    for (int b = 0; b < MT_BUCKET_COUNT; b++) ctx->bytes_peak[b] = ctx->bytes_live[b];
    ctx->bytes_peak_total = ctx->bytes_live_total;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    FILE *f = fopen("/proc/self/clear_refs", "w");
    int ok = f && fputs("5", f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) rs->rss_phased = 0;
}

/* Per stage of a pipeline: bubble, max in flight, activation peak (max over
 * the stage's ranks), gathered over the world into rs->stage_* (receipt). */
static enum mt_status gather_stage_stats(struct mt_ctx *ctx, struct run_state *rs, int world,
                                         const struct mt_train_peaks *train_pk)
{
    double *v = mt_alloc(ctx, (size_t)4 * world * sizeof(double), MT_BUCKET_OTHER);
    rs->stage_bubble = mt_alloc(ctx, (size_t)3 * rs->pp * sizeof(double), MT_BUCKET_OTHER);
    if (!v || !rs->stage_bubble) { mt_free(ctx, v); return MT_ERR_OOM; }
    rs->stage_in_flight = rs->stage_bubble + rs->pp;
    rs->stage_acts = rs->stage_bubble + 2 * rs->pp;
    double mine4[4] = {(double)rs->stage, rs->pipe_wall_s > 0 ? 1.0 - rs->pipe_busy_s / rs->pipe_wall_s : 0,
                       (double)rs->in_flight_max, train_pk->b[MT_BUCKET_ACTS]};
    enum mt_status r2 = mt_comm_allgather(ctx, mt_mesh_world_comm(rs->mesh), v, mine4, 4, MT_DTYPE_F64);
    if (r2 != MT_OK) { mt_free(ctx, v); return r2; }
    for (int k = 0; k < 3 * rs->pp; k++) rs->stage_bubble[k] = 0;
    rs->bubble_mean = 0;
    for (int r = 0; r < world; r++) {
        int st = (int)v[4 * r];
        if (v[4 * r + 1] > rs->stage_bubble[st]) rs->stage_bubble[st] = v[4 * r + 1];
        if (v[4 * r + 2] > rs->stage_in_flight[st]) rs->stage_in_flight[st] = v[4 * r + 2];
        if (v[4 * r + 3] > rs->stage_acts[st]) rs->stage_acts[st] = v[4 * r + 3];
    }
    for (int k = 0; k < rs->pp; k++) rs->bubble_mean += rs->stage_bubble[k] / rs->pp;
    mt_free(ctx, v);
    return MT_OK;
}

/* The plan of every rank, by the planner (`meshtrain plan`), on a private
 * ctx so that it stays out of the accounting (rank 0 only; NULL elsewhere or
 * on failure, with the reason in err). */
static struct mt_plan *plan_of_run(struct mt_ctx *pctx, const struct run_state *rs, const struct mt_train_run_info *ri,
                                   char *err, size_t err_n)
{
    struct mt_plan *plan = NULL;
    if (ri->wrank != 0) return NULL;
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = *ri->dims;
    su.zero_stage = ri->opts->zero_stage;
    su.steps = ri->n_steps;
    memcpy(su.first_layer, rs->first_layer, sizeof su.first_layer);
    su.threads = ri->threads;   /* the runtime bucket: this run's threads and token shards */
    su.data_bytes = 2.0 * ((double)mt_data_ntokens(rs->train) + (rs->val ? (double)mt_data_ntokens(rs->val) : 0));
    if (mt_plan_create(pctx, rs->cfg, &su, 0, &plan) != MT_OK) snprintf(err, err_n, "%s", mt_ctx_last_error(pctx));
    return plan;
}

/* Every knob of the table with its value and where it came from (a JSON
 * text, malloc'ed): the receipt's top-level "knobs". */
static char *knobs_json(const struct mt_ctx *ctx)
{
    cJSON *k = cJSON_CreateObject();
    for (int i = 0; i < MT_KNOB_COUNT; i++) {
        const struct mt_knob_def *d = mt_knob_def((enum mt_knob_id)i);
        cJSON *o = cJSON_AddObjectToObject(k, d->name);
        cJSON_AddStringToObject(o, "value", mt_knob_str(ctx, (enum mt_knob_id)i));
        cJSON_AddStringToObject(o, "source", mt_knob_source_name(mt_knob_source(ctx, (enum mt_knob_id)i)));
        cJSON_AddStringToObject(o, "env_alias", d->env);
        cJSON_AddStringToObject(o, "read_in", d->where);
        cJSON_AddBoolToObject(o, "test_hook", d->test_only);
    }
    char *txt = cJSON_PrintUnformatted(k);
    cJSON_Delete(k);
    return txt;
}

/* What the arithmetic of the run really was: "bf16" for precision=bf16 (the
 * model's GEMMs on bf16 shadows and operands, fp32 accumulation, master
 * weights and optimizer state; either backend), else the plain GEMM
 * precision the table has in force (its gemm_precision; cpu: always fp32;
 * "bf16-percall": cuda with MT_CUDA_PRECISION=bf16, every GEMM converting
 * its fp32 operands per call). */
static void runtime_mode(const struct run_state *rs, char *out, size_t n)
{
    snprintf(out, n, "fp32");
    if (!strcmp(rs->cfg->precision, "bf16")) {
        snprintf(out, n, "bf16");
        return;
    }
    const struct mt_ops_i *ops = rs->ops;
    if (ops->gemm_precision && ops->gemm_precision(ops->be) == MT_ELEM_BF16) snprintf(out, n, "bf16-percall");
}

/* How Muon's Newton–Schulz ran (muon.c): "bf16" (precision=bf16 with knob
 * muon_ns_bf16: bf16 storage, batched), "fp32", or "none" (no Muon matrix on
 * this rank). Config and knob decide it; the receipt says it in one word. */
static void muon_mode(const struct mt_ctx *ctx, const struct run_state *rs, char *out, size_t n)
{
    int np = 0, any = 0;
    const struct mt_param *ps = mt_model_params(rs->model, &np);
    for (int i = 0; i < np; i++) any |= !ps[i].frozen && ps[i].optim == MT_OPTIM_MUON;
    snprintf(out, n, "%s", !any ? "none" : mt_optim_muon_ns_bf16(ctx, rs->cfg) ? "bf16" : "fp32");
}

/* What did not run as asked on a device backend ("" = everything did). */
static void device_fallback_reason(const struct mt_ops_device_info *in, char *out, size_t n)
{
    out[0] = 0;
    size_t len = 0;
    if (in->gemm_bf16_fallbacks > 0)
        len = (size_t)snprintf(out, n, "bf16 gemm: cuBLASLt had no algorithm for %ld of %ld tiles; those ran in fp32 "
                                       "(cublasSgemm)", in->gemm_bf16_fallbacks,
                               in->gemm_bf16_calls + in->gemm_bf16_fallbacks);
    if (in->gemm_grouped_loops > 0 && len < n)
        len += (size_t)snprintf(out + len, n - len, "%sgrouped expert GEMMs: %ld of %ld calls ran as a loop (%s)",
                                len ? "; " : "", in->gemm_grouped_loops, in->gemm_grouped_calls,
                                in->gemm_grouped_fallback);
    /* (attn_kernel=v2 calls of a head dim v2 lacks run v1: the same bf16
     * tensor-core contract and bound, so not named here but in the gpu
     * object: attention_v2_fallbacks and attention_v2_fallback_hd) */
    if (in->attention_fp32_fallbacks > 0 && len < n)
        len += (size_t)snprintf(out + len, n - len, "%sbf16 attention: %ld calls ran the fp32 kernels (head dim > 128)",
                                len ? "; " : "", in->attention_fp32_fallbacks);
    if (in->ssm_scan_tc_fallbacks > 0 && len < n)
        snprintf(out + len, n - len, "%sbf16 Mamba-3 scan: %ld of %ld calls ran the fp32 kernels (mamba_chunk 0, or "
                 "chunk, headdim or d_state above 128)", len ? "; " : "", in->ssm_scan_tc_fallbacks,
                 in->ssm_scan_tc_calls + in->ssm_scan_tc_fallbacks);
}


/* gpu.step_counters: what each step of the loop asked of the device
 * (the table's step_counters, between the trainer's step marks), one array
 * entry per step; allocations and host waits inside a step are what the
 * GPU speed work drives to zero (issue 27 item 1). Exact under the
 * emulator too: counted where the backend calls the runtime. */
static void step_counters_json(cJSON *g, const struct mt_ops_i *ops, int emulated)
{
    int n = 0;
    const struct mt_ops_device_counters *c = ops->step_counters ? ops->step_counters(ops->be, &n) : NULL;
    if (!c) return;
    const int m = n < MT_OPS_STEP_LOG ? n : MT_OPS_STEP_LOG;
    cJSON *sc = cJSON_AddObjectToObject(g, "step_counters");
    cJSON_AddNumberToObject(sc, "steps", n);
    cJSON_AddNumberToObject(sc, "steps_listed", m);
    cJSON_AddStringToObject(sc, "how", emulated ? "counted by the cuda backend where it calls the runtime (exact); "
                                                  "under the CPU emulator: the same calls, the same counts"
                                                : "counted by the cuda backend where it calls the runtime (exact)");
    static const char *const names[] = {"kernel_launches", "blas_calls", "memsets", "h2d_copies", "h2d_bytes",
                                        "d2h_copies", "d2h_bytes", "d2d_copies", "d2d_bytes", "host_syncs",
                                        "device_allocs", "device_frees", "workspace_grows", "graph_launches",
                                        "graph_ops", "gemm_plan_builds"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        cJSON *a = cJSON_AddArrayToObject(sc, names[k]);
        for (int i = 0; i < m; i++) {
            const struct mt_ops_device_counters *s = &c[i];
            const double v[] = {(double)s->launches, (double)s->blas_calls, (double)s->memsets, (double)s->h2d,
                                (double)s->h2d_bytes, (double)s->d2h, (double)s->d2h_bytes, (double)s->d2d,
                                (double)s->d2d_bytes, (double)s->syncs, (double)s->allocs, (double)s->frees,
                                (double)s->ws_grows, (double)s->graph_launches, (double)s->graph_ops,
                                (double)s->plan_builds};
            cJSON_AddItemToArray(a, cJSON_CreateNumber(v[k]));
        }
    }
}

/* The receipt's "gpu" object (mt_gpu_info.h); NULL on a backend without a
 * device (the table's device_info absent: cpu). */
static char *gpu_json(const struct run_state *rs, const struct mt_receipt *r)
{
    struct mt_ops_device_info in;
    if (!rs->ops->device_info || rs->ops->device_info(rs->ops->be, &in) != MT_OK) return NULL;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddBoolToObject(g, "emulated", in.emulated);
    if (in.emulated)
        cJSON_AddStringToObject(g, "note", "CPU emulator of CUDA (tests/cuda/emu): device, versions and memory are "
                                           "the emulator's, timings are not a GPU's");
    cJSON_AddStringToObject(g, "device", in.device);
    cJSON_AddNumberToObject(g, "device_count", in.device_count);
    cJSON_AddNumberToObject(g, "ordinal", in.ordinal);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", in.cc_major, in.cc_minor);
    cJSON_AddStringToObject(g, "compute_capability", cc);
    cJSON_AddNumberToObject(g, "sm_count", in.sm_count);
    /* which physical GPU: the UUID and PCI address nvidia-smi shows */
    cJSON_AddStringToObject(g, "uuid", in.uuid);
    cJSON_AddStringToObject(g, "pci_bus_id", in.pci_bus_id);
    cJSON_AddNumberToObject(g, "ecc_enabled", in.ecc_enabled);
    cJSON_AddNumberToObject(g, "sm_clock_peak_khz", in.sm_clock_khz);
    cJSON_AddNumberToObject(g, "mem_clock_peak_khz", in.mem_clock_khz);
    cJSON_AddNumberToObject(g, "mem_bus_width_bits", in.mem_bus_width_bits);
    /* double data rate: two transfers per memory clock */
    if (in.mem_clock_khz > 0 && in.mem_bus_width_bits > 0)
        cJSON_AddNumberToObject(g, "mem_bandwidth_peak_bytes_per_s",
                                2.0 * in.mem_clock_khz * 1e3 * in.mem_bus_width_bits / 8.0);
    else cJSON_AddNullToObject(g, "mem_bandwidth_peak_bytes_per_s");
    cJSON_AddNumberToObject(g, "driver_version", in.driver_version);
    cJSON_AddNumberToObject(g, "runtime_version", in.runtime_version);
    cJSON_AddNumberToObject(g, "cublas_version", in.cublas_version);
    cJSON_AddNumberToObject(g, "cublaslt_version", (double)in.cublaslt_version);
    cJSON_AddStringToObject(g, "precision", in.precision);
    cJSON_AddStringToObject(g, "precision_source", in.precision_source);
    cJSON_AddNumberToObject(g, "gemm_bf16_calls", (double)in.gemm_bf16_calls);
    cJSON_AddNumberToObject(g, "gemm_bf16_fallbacks", (double)in.gemm_bf16_fallbacks);
    /* precision=bf16: matmuls on operands as stored (the shadows), and the
     * fp32 operand elements still rounded inside GEMM calls (activations) */
    cJSON_AddNumberToObject(g, "gemm_bf16_direct", (double)in.gemm_bf16_direct);
    cJSON_AddNumberToObject(g, "gemm_bf16_cast_elems", (double)in.gemm_bf16_cast_elems);
    /* plans built with a heuristic query vs reused from a shape of the same class
     * (MoE expert GEMMs change shape every step) */
    cJSON_AddNumberToObject(g, "gemm_plan_heuristics", (double)in.gemm_plan_heuristics);
    cJSON_AddNumberToObject(g, "gemm_plan_algo_reuses", (double)in.gemm_plan_algo_reuses);
    cJSON_AddNumberToObject(g, "gemm_grouped_calls", (double)in.gemm_grouped_calls);
    cJSON_AddNumberToObject(g, "gemm_grouped_loops", (double)in.gemm_grouped_loops);
    /* precision=bf16: attention calls on tensor cores / on the fp32 kernels */
    cJSON_AddNumberToObject(g, "attention_tc_calls", (double)in.attention_tc_calls);
    cJSON_AddNumberToObject(g, "attention_fp32_fallbacks", (double)in.attention_fp32_fallbacks);
    cJSON_AddNumberToObject(g, "attention_dq_recompute", (double)in.attention_dq_recompute);
    /* which bf16 attention kernels (knob attn_kernel): calls on v2, v2 chosen but run by v1 */
    cJSON_AddStringToObject(g, "attn_kernel", in.attn_kernel);
    cJSON_AddNumberToObject(g, "attention_v2_calls", (double)in.attention_v2_calls);
    /* the causal attention's block order: its groups' budget (docs/cuda.md "The block order") */
    cJSON_AddNumberToObject(g, "attn_group_bytes", (double)in.attn_group_bytes);
    /* the cap on one bf16 GEMM's operand copies (knob bf16_scratch_mb; larger ones go in row tiles) */
    cJSON_AddNumberToObject(g, "bf16_scratch_bytes", (double)in.bf16_scratch_cap);
    cJSON_AddNumberToObject(g, "ssm_scan_tc_calls", (double)in.ssm_scan_tc_calls);
    cJSON_AddNumberToObject(g, "ssm_scan_tc_fallbacks", (double)in.ssm_scan_tc_fallbacks);
    /* the parameters' init drawn on the device (knob param_init_device, init.cu): elements, host fixes */
    cJSON_AddNumberToObject(g, "param_init_device_elements", (double)in.init_normal_elems);
    cJSON_AddNumberToObject(g, "param_init_host_fixes", (double)in.init_normal_host_fixes);
    cJSON_AddNumberToObject(g, "attention_v2_fallbacks", (double)in.attention_v2_fallbacks);
    if (in.attention_v2_fallbacks > 0)   /* the head dim v2 lacked (the last such call's) */
        cJSON_AddNumberToObject(g, "attention_v2_fallback_hd", (double)in.attention_v2_fallback_hd);
    /* memory: the allocator's peaks (device buffers, by bucket; the plan
     * predicts these) next to the device's own view */
    cJSON *m = cJSON_AddObjectToObject(g, "memory");
    size_t alloc_peak = 0;
    for (int b = 0; b < MT_BUCKET_COUNT; b++) alloc_peak += r->measured_peak_bytes[b];
    cJSON_AddNumberToObject(m, "allocator_peak_bytes", (double)alloc_peak);
    cJSON_AddNumberToObject(m, "plan_bytes", (double)r->plan_total_bytes);
    cJSON_AddNumberToObject(m, "backend_workspace_bytes", (double)in.workspace_bytes);
    cJSON_AddNumberToObject(m, "device_total_bytes", (double)in.mem_total);
    cJSON_AddNumberToObject(m, "device_used_peak_bytes", (double)in.mem_used_peak);
    cJSON_AddNumberToObject(m, "device_free_at_end_bytes", (double)in.mem_free_now);
    cJSON_AddStringToObject(m, "device_used_source", "cudaMemGetInfo (total - free) after every device allocation and at the end; "
                                                     "includes the CUDA context and cuBLAS");
    cJSON_AddBoolToObject(g, "op_profile_events", in.op_profile);   /* MT_CUDA_OP_PROFILE */
    cJSON_AddBoolToObject(g, "kernel_profile", in.kernel_profile);  /* MT_CUDA_KERNEL_PROFILE: kernel:NAME entries */
    if (in.launch_log[0]) cJSON_AddStringToObject(g, "launch_log", in.launch_log);   /* MT_CUDA_LAUNCH_LOG */
    else cJSON_AddNullToObject(g, "launch_log");
    step_counters_json(g, rs->ops, in.emulated);
    /* CUDA graphs (knob cuda_graphs; docs/cuda.md "CUDA graphs") */
    struct mt_ops_graph_info gi;
    memset(&gi, 0, sizeof gi);
    if (rs->ops->graph_info) rs->ops->graph_info(rs->ops->be, &gi);
    else snprintf(gi.why_not, sizeof gi.why_not, "off: the backend has no graphs");
    cJSON *cg = cJSON_AddObjectToObject(g, "cuda_graphs");
    cJSON_AddBoolToObject(cg, "ran", gi.ran);
    cJSON_AddStringToObject(cg, "why_not", gi.ran ? "" : gi.why_not[0] ? gi.why_not
                                                   : gi.failed ? "a capture or replay failed (the run's cuda error)"
                                                               : "no segment was replayed (too few steps: graph step 0 "
                                                                 "records, 1 captures, 2.. replay)");
    cJSON_AddNumberToObject(cg, "graph_steps", (double)gi.steps);
    cJSON_AddNumberToObject(cg, "captured_graph_step", (double)gi.captured_step);
    cJSON_AddNumberToObject(cg, "segments_per_step", gi.segments);
    cJSON_AddNumberToObject(cg, "replayed_segments_per_step", gi.static_segments);
    cJSON_AddNumberToObject(cg, "eager_segments_per_step", gi.dynamic_segments);
    cJSON_AddNumberToObject(cg, "replayed_ops_per_step", (double)gi.graph_ops);
    cJSON_AddNumberToObject(cg, "graph_nodes_per_step", (double)gi.graph_nodes);
    cJSON_AddStringToObject(cg, "why_eager", gi.why_dynamic);
    char src[200];
    /* precision=bf16: the model's GEMMs are bf16 whatever the plain entry's mode */
    double peak = mt_gpu_datasheet_peak(in.device, strcmp(rs->cfg->precision, "bf16") ? in.precision : "bf16", src,
                                        sizeof src);
    cJSON_AddNumberToObject(g, "device_peak_flops", peak * r->world);
    cJSON_AddStringToObject(g, "device_peak_source", peak > 0 ? src : "device not in the table (mt_gpu_info.h)");
    if (peak > 0) cJSON_AddNumberToObject(g, "mfu_device", r->model_flops_per_s / (peak * r->world));
    else cJSON_AddNullToObject(g, "mfu_device");
    char *txt = cJSON_PrintUnformatted(g);
    cJSON_Delete(g);
    return txt;
}

/* The receipt's fields from the run (the distributed JSON and the replica
 * verdict are the caller's). */
static void fill_receipt(struct mt_receipt *r, const struct run_state *rs, const struct mt_train_run_info *ri,
                         const struct mt_plan *plan, const double *mine)
{
    const struct mt_config *cfg = rs->cfg;
    const struct mt_train_opts *opts = ri->opts;
    const int G = cfg->batch_size, T = cfg->seq_len, steps_run = ri->steps_run;
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    memset(r, 0, sizeof *r);
    r->command_line = opts->command_line;
    snprintf(r->backend_requested, sizeof r->backend_requested, "%s", cfg->backend);
    snprintf(r->backend_actual, sizeof r->backend_actual, "%s", rs->ops->name);
    runtime_mode(rs, r->runtime_mode, sizeof r->runtime_mode);
    snprintf(r->fallback_reason, sizeof r->fallback_reason, "%s", "");
    const struct mt_ops_i *ops = rs->ops;
    struct mt_ops_device_info dev;
    const int has_dev = ops->device_info && ops->device_info(ops->be, &dev) == MT_OK;
    if (has_dev) device_fallback_reason(&dev, r->fallback_reason, sizeof r->fallback_reason);
    snprintf(r->blas, sizeof r->blas, "%s", info.blas);
    snprintf(r->coretype, sizeof r->coretype, "%s", info.coretype);
    snprintf(r->coretype_source, sizeof r->coretype_source, "%s", info.coretype_source);
    r->threads = ri->threads;
    r->pp = ri->dims->pp;
    r->dp = ri->dims->dp;
    r->ep = ri->dims->ep;
    r->tp = ri->dims->tp;
    r->world = ri->world;
    r->zero_stage = opts->zero_stage;
    r->cfg = cfg;
    r->micro_batch_seqs = rs->Bm;
    mt_model_param_counts(cfg, &r->params_total, &r->params_active);
    r->params_trainable = mt_model_param_trainable(cfg);
    r->flops_per_token = ri->flops_per_token;
    if (plan) mt_plan_rank_bytes(plan, ri->wrank, r->plan_bytes);
    if (plan) r->plan_total_bytes = mt_plan_rank_total(plan, ri->wrank);
    for (int b = 0; b < MT_BUCKET_COUNT; b++) r->measured_peak_bytes[b] = (size_t)mine[b];
    r->peak_rss_bytes = (size_t)mine[MT_BUCKET_COUNT + 1];
    r->peak_rss_step_loop_bytes = (size_t)mine[MEM_SLOTS + MT_BUCKET_COUNT + 1];
    r->steps_run = steps_run;
    r->warmup_excluded = steps_run >= 4 ? 2 : (steps_run >= 2 ? 1 : 0);
    double steady = 0;
    for (int i = r->warmup_excluded; i < steps_run; i++) steady += rs->times[i];
    int n_steady = steps_run - r->warmup_excluded;
    r->tokens_per_s = (n_steady > 0 && steady > 0) ? (double)G * T * n_steady / steady : 0;
    r->model_flops_per_s = r->tokens_per_s * ri->flops_per_token;
    r->peak_flops = ri->peak;
    r->mfu = ri->peak > 0 ? r->model_flops_per_s / ri->peak : 0;
    snprintf(r->peak_flops_source, sizeof r->peak_flops_source, "%s", ri->peak_src);
    r->peak_flops_lo = ri->roof.lo * ri->world;
    r->peak_flops_hi = ri->roof.hi * ri->world;
    snprintf(r->kernels_isa, sizeof r->kernels_isa, "%s", ops->kernels_isa ? ops->kernels_isa(ops->be) : "");
    /* how the table times its entries (cpu: host wall time per call; cuda:
     * cudaEvent pairs per call, none with MT_CUDA_OP_PROFILE=0) */
    const char *how = NULL;
    const int timed = ops->op_profile && ops->op_profile(ops->be, &how);
    r->n_op_kinds = timed && n_steady > 0 ? MT_OPK_COUNT : 0;
    r->op_profile_source = how;
    if (has_dev) r->timing_emulated = dev.emulated;
    mt_ops_profile_get(r->op_step_s, NULL);
    for (int k = 0; k < r->n_op_kinds; k++) {
        r->op_kind_names[k] = mt_ops_profile_kind_name((enum mt_op_kind)k);
        r->op_step_s[k] /= n_steady;
    }
    if (r->n_op_kinds > 0) {
        long calls[MT_OPS_PROFILE_ENTRIES];
        r->n_op_entries = mt_ops_profile_entries(r->op_entry_names, r->op_entry_s, calls, MT_OPS_PROFILE_ENTRIES);
        for (int e = 0; e < r->n_op_entries; e++) {
            r->op_entry_s[e] /= n_steady;
            r->op_entry_calls[e] = (double)calls[e] / n_steady;
        }
    }
    double step_sum = 0;
    for (int i = 0; i < steps_run; i++) step_sum += rs->times[i];
    r->comm_s = ri->comm_total;
    r->idle_s = ri->idle_total;
    r->compute_s = step_sum - ri->comm_total - ri->idle_total;
    r->total_s = ri->total_s;
    r->startup = (struct mt_receipt_startup){ri->setup_s, ri->param_init_s, ri->roof_s,
                                              steps_run > 0 ? rs->times[0] : -1, ri->to_first_step_s};
    r->n_steps = steps_run;
    r->step_index = rs->step_index;
    r->losses = rs->losses;
    _Static_assert(MT_LOSS_MAX_PARTS <= MT_RECEIPT_MAX_LOSS_PARTS, "receipt: room for every loss part");
    const struct mt_loss_part *lp = mt_model_loss_parts(rs->model, &r->n_loss_parts);
    for (int k = 0; k < r->n_loss_parts; k++) {
        r->loss_part_names[k] = lp[k].name;
        r->loss_part_owners[k] = lp[k].owner;
        r->loss_part_reduce[k] = mt_loss_reduce_name(lp[k].reduce);
        r->loss_part_weights[k] = lp[k].weight;
        r->loss_part_backward[k] = lp[k].backward;
    }
    r->loss_parts_stride = MT_LOSS_MAX_PARTS;
    r->loss_parts = rs->loss_parts;
    r->grad_norms = rs->gnorm;
    r->lrs = rs->lrs;
    r->step_times = rs->times;
    r->n_evals = rs->n_evals;
    r->eval_steps = rs->eval_steps;
    r->eval_losses = rs->eval_losses;
    r->start_step = ri->start_step;
    snprintf(r->resumed_from, sizeof r->resumed_from, "%s", ri->resume_dir);
    snprintf(r->run_id, sizeof r->run_id, "%s", rs->run_id);
    snprintf(r->data_path, sizeof r->data_path, "%s", opts->data_path);
    r->data_tokens = mt_data_ntokens(rs->train);
}

/* The end of the run, collective over the world: the replica check, the
 * memory peaks of every rank, the pipeline's stage figures, then rank 0
 * writes OUT/receipt.json. A replica mismatch is an error on every rank,
 * returned after the receipt is written. */
enum mt_status mt_train_report(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_run_info *ri,
                               struct mt_train_result *res)
{
    const struct mt_train_opts *opts = ri->opts;
    char hash_msg[256];
    int mismatch = 0;
    MT_CHECK(mt_train_replica_check(ctx, rs->ops, rs, opts->zero_stage, hash_msg, sizeof hash_msg, &mismatch));
    /* per rank: the whole run's peaks, then the step loop's (+ total each) */
    mt_train_peak_fold(ctx, ri->run_pk);
    double mine[2 * MEM_SLOTS];
    for (int b = 0; b < MEM_SLOTS; b++) {
        mine[b] = ri->run_pk->b[b] > ri->train_pk->b[b] ? ri->run_pk->b[b] : ri->train_pk->b[b];
        mine[MEM_SLOTS + b] = ri->train_pk->b[b];
    }
    MT_CHECK(mt_comm_allgather(ctx, mt_mesh_world_comm(rs->mesh), rs->mem_all, mine, 2 * MEM_SLOTS, MT_DTYPE_F64));
    if (rs->pp > 1) MT_CHECK(gather_stage_stats(ctx, rs, ri->world, ri->train_pk));
    struct mt_zero_stats zs;
    mt_zero_set_get_stats(&rs->zset, &zs);
    size_t total_params = 0;
    mt_model_param_counts(rs->cfg, &total_params, NULL);
    struct mt_ctx pctx;
    mt_ctx_init(&pctx);
    pctx.knobs = ctx->knobs;   /* the run's knobs: the pieces carve by some (mt_model_plan_bytes_par) */
    char plan_err[512] = "";
    struct mt_plan *plan = plan_of_run(&pctx, rs, ri, plan_err, sizeof plan_err);
    char *djson = dist_json(rs, ri->trace, rs->mem_all, ri->world, &zs, ri->steps_run, rs->cfg->microbatches,
                            (double)total_params * sizeof(float), opts->zero_stage, rs->cfg->reshard_after_forward,
                            plan, plan_err);
    struct mt_receipt r;
    fill_receipt(&r, rs, ri, plan, mine);
    muon_mode(ctx, rs, r.muon_newton_schulz, sizeof r.muon_newton_schulz);
    mt_plan_destroy(&pctx, plan);
    snprintf(r.replica_hash_check, sizeof r.replica_hash_check, "%s", hash_msg);
    r.distributed_json = djson;
    char *kjson = knobs_json(ctx);
    r.knobs_json = kjson;
    char *gjson = gpu_json(rs, &r);
    r.gpu_json = gjson;
    char *rjson = mt_train_redo_json(rs);
    r.redo_json = rjson;
    char *cjson = replica_checks_json(rs);
    r.replica_checks_json = cjson;
    enum mt_status rc = MT_OK;
    if (ri->wrank == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/receipt.json", opts->out_dir);
        rc = mt_receipt_write(ctx, path, &r);
    }
    free(djson);
    free(kjson);
    free(gjson);
    free(rjson);
    free(cjson);
    MT_CHECK(rc);
    res->steps_run = ri->steps_run;
    res->final_loss = ri->steps_run ? rs->losses[ri->steps_run - 1] : 0;
    res->tokens_per_s = r.tokens_per_s;
    res->mfu = r.mfu;
    if (mismatch) {
        /* every rank sees the same verdict; wait for rank 0's receipt before
         * any rank returns the error (the tool aborts the job on it) */
        MT_CHECK(mt_comm_barrier(ctx, mt_mesh_world_comm(rs->mesh)));
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "replica hash check failed: %s", hash_msg);
    }
    return MT_OK;
}
