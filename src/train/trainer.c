/*
 * trainer.c — the training run of one rank: setup, the step loop, the
 * final checkpoint, the report. The pieces live in their own files
 * (train_impl.h lists them); this file is the order they run in.
 *
 * Invariant: nothing is written under --out until every input has been
 * checked (config, data, resume checkpoint) and every buffer allocated, so
 * bad input loses nothing.
 */
#define _GNU_SOURCE
#include "mt_trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/mt_fileio.h"
#include "../core/mt_knobs.h"
#include "../plan/mt_gpu_info.h"
#include "../optim/mt_optim.h"
#include "train_impl.h"

/* The GEMM roof MFU is measured against: --peak-flops, or measured now by
 * every rank at once (the run's real contention) and taken x world. */
static double peak_flops(struct mt_ctx *ctx, const struct mt_train_opts *opts, const struct run_state *rs, int threads, int world,
                         struct mt_ops_roof *roof, char *src, size_t n)
{
    if (opts->peak_flops > 0) {
        snprintf(src, n, "given by --peak-flops");
        return opts->peak_flops;
    }
    /* a known GPU: MFU against its datasheet peak for the GEMM precision */
    struct mt_ops_device_info ci;
    if (rs->ops->device_info && rs->ops->device_info(rs->ops->be, &ci) == MT_OK) {
        double dp = mt_gpu_datasheet_peak(ci.device, strcmp(rs->cfg->precision, "bf16") ? ci.precision : "bf16", src, n);
        if (dp > 0) return dp * world;
    }
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    /* one rank: the peak measured on this machine before (peak_cache.c); with
     * several ranks every rank measures at once, as their steps will run */
    const char *mode = mt_knob_str(ctx, MT_KNOB_PEAK_CACHE);
    char path[4096], key[640], when[64], note[640] = "";
    const int cache = world == 1 && strcmp(mode, "off") && mt_train_peak_cache_path(path, sizeof path);
    if (cache) mt_train_peak_cache_key(rs->ops->name, threads, key, sizeof key);
    if (cache && !strcmp(mode, "use") && mt_train_peak_cache_get(path, key, roof, when, sizeof when)) {
        snprintf(src, n,
                 "measured %s on this machine and cached in %.480s: median of %d sgemm %d^3 (best of sizes 768, 1536) "
                 "through the %s ops table, %d threads, coretype %s (--knob peak_cache=refresh measures again)",
                 when, path, roof->runs, roof->size, rs->ops->name, threads, info.coretype);
        return roof->flops;
    }
    double mine = mt_train_measure_gemm_roof(rs->ops, roof);
    if (cache) {
        struct mt_ctx quiet;   /* a cache that cannot be written costs a line of text, never the run */
        mt_ctx_init(&quiet);
        if (mt_train_peak_cache_put(&quiet, path, key, roof) == MT_OK) snprintf(note, sizeof note, ", kept in %.480s", path);
        else snprintf(note, sizeof note, ", not kept (%.100s)", mt_ctx_last_error(&quiet));
    }
    snprintf(src, n,
             "measured at startup: median of %d sgemm %d^3 (best of sizes 768, 1536) through the %s ops table, "
             "%d threads, coretype %s%s%.600s", roof->runs, roof->size, rs->ops->name, threads, info.coretype,
             world > 1 ? ", all ranks at once, x world" : "", note);
    return mine * world;
}

/* Ranks on this node x threads per rank above its cores: each rank's
 * OpenMP team then fights the others' for the cores (slower than fewer
 * threads). Said once, by rank 0; one thread per rank is the user's choice;
 * a device backend's kernels do not run on the cores (host_memory 0). */
static void oversubscribed_warning(const struct mt_ops_i *ops, int threads, int world, int wrank)
{
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!ls || atoi(ls) < 1) ls = getenv("MPI_LOCALNRANKS");
    const int local = ls && atoi(ls) > 0 ? atoi(ls) : world;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (wrank != 0 || threads < 2 || cores < 1 || (long)local * threads <= cores || !ops->host_memory) return;
    fprintf(stderr, "meshtrain train: warning: %d rank%s on this node x %d threads = %ld > %ld cores: set "
            "OMP_NUM_THREADS=%ld (or --set threads=N) so that ranks x threads <= cores\n", local, local > 1 ? "s" : "",
            threads, (long)local * threads, cores, cores / local > 0 ? cores / local : 1);
}

/* Stage 5: from here on we write outputs. One trainer per --out: rank 0
 * holds OUT/.lock for the run; every rank learns the outcome (nothing was
 * written before this point), agreed, so the job ends in order instead of
 * aborting. */
static enum mt_status take_output(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                  int *out_lock, struct mt_train_result *res)
{
    const int is_root = mt_mesh_rank(rs->mesh) == 0;
    if (!rs->run_id[0]) mt_ckpt_run_id_new(rs->run_id);   /* a fresh run (or one resumed from an import) */
    enum mt_status lk = is_root ? mt_ckpt_lock(ctx, opts->out_dir, out_lock) : MT_OK;
    enum mt_status rc = mt_comm_agree(ctx, rs->sumc, lk, "taking the output directory");
    if (rc != MT_OK) {
        if (rc != MT_ERR_COMM) res->collective_started = 0;
        return rc;
    }
    if (mt_file_mkdir_p(opts->out_dir) != 0)
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot create output directory %s", opts->out_dir);
    return MT_OK;
}

/* After step `done_steps`: the replica check, the evaluation and the periodic checkpoint when due.
 * The checkpoint writer's staging is not the step loop's memory: the peaks
 * are folded around it. */
static enum mt_status after_step(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                 int done_steps, int tty, struct mt_train_peaks *run_pk,
                                 struct mt_train_peaks *train_pk)
{
    const struct mt_config *cfg = rs->cfg;
    /* every copy of every parameter still equal (the last step's check is the receipt's own, report.c) */
    if (done_steps != opts->steps) MT_CHECK(mt_train_replica_check_step(ctx, rs, opts, done_steps));
    if (rs->val && cfg->eval_every > 0 && (done_steps % cfg->eval_every == 0 || done_steps == opts->steps)) {
        double vl;
        MT_CHECK(mt_train_evaluate(ctx, rs, &vl));
        rs->eval_steps[rs->n_evals] = done_steps;
        rs->eval_losses[rs->n_evals++] = vl;
        if (!opts->quiet && mt_mesh_rank(rs->mesh) == 0) {
            fprintf(stdout, "%sval step %d loss %.6f (%d batches, %.0f tokens scored)\n", tty ? "\n" : "", done_steps,
                    vl, cfg->eval_batches, (double)cfg->eval_batches * cfg->batch_size * cfg->seq_len);
            fflush(stdout);
        }
    }
    if (cfg->save_every > 0 && done_steps % cfg->save_every == 0 && done_steps != opts->steps) {
        mt_train_peak_fold(ctx, train_pk);
        MT_CHECK(mt_train_save_checkpoint(ctx, opts, rs, done_steps));
        mt_train_peak_fold(ctx, run_pk);
        mt_train_peak_restart(ctx, rs);
    }
    return MT_OK;
}

/* The step loop: per step the test hooks (when armed), the step, its
 * series entry and progress line, then evaluation and checkpoint when due. */
static enum mt_status step_loop(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                struct mt_train_run_info *ri, struct mt_train_peaks *run_pk,
                                struct mt_train_peaks *train_pk)
{
    const struct mt_config *cfg = rs->cfg;
    const double tokens = (double)cfg->batch_size * cfg->seq_len;
    const int tty = isatty(fileno(stdout));
    const int n_steps = opts->steps - ri->start_step;
    const int prof_warm = n_steps >= 4 ? 2 : (n_steps >= 2 ? 1 : 0); /* = the receipt's warmup_excluded */
    for (int step = ri->start_step; step < opts->steps; step++) {
        double t0 = mt_time_sec();
        if (ri->steps_run == prof_warm) mt_ops_profile_reset(); /* the op profile covers the steady steps */
        mt_ops_profile_enable(1);
        if (rs->ops->profile_step) rs->ops->profile_step(rs->ops->be, 0);
        const double comm0 = mt_train_exposed_comm_s(rs);
        mt_comm_watchdog_set_step(step);
        if (mt_train_fault_armed(rs, step)) MT_CHECK(mt_train_fault_before_step(ctx, rs, step));
        struct mt_train_step_out so;
        int n_part;
        MT_CHECK(mt_train_step(ctx, rs, step, &so));
        if (mt_train_fault_armed(rs, step)) MT_CHECK(mt_train_fault_after_update(ctx, rs, step));
        rs->ops->sync(rs->ops->be);
        double dt = mt_time_sec() - t0;
        if (rs->ops->profile_step) rs->ops->profile_step(rs->ops->be, 1); /* after dt: resolving is not the step's */
        ri->comm_total += mt_train_exposed_comm_s(rs) - comm0;
        ri->idle_total += so.idle_s;
        mt_ops_profile_add(MT_OPK_COMM, mt_train_exposed_comm_s(rs) - comm0 + so.idle_s);
        mt_ops_profile_enable(0);
        int k = ri->steps_run++;
        if (rs->imbalance) rs->imbalance[k] = so.imbalance;
        rs->step_index[k] = step;
        rs->losses[k] = so.loss;
        memcpy(rs->loss_parts + (size_t)k * MT_LOSS_MAX_PARTS, so.part, sizeof so.part);
        rs->gnorm[k] = so.grad_norm;
        rs->lrs[k] = mt_optim_lr_factor(cfg, step);
        rs->times[k] = dt;
        double tok_s = tokens / dt;
        if (k == 0) ri->to_first_step_s = mt_time_sec() - ri->t_entry;
        if (ri->wrank == 0)
            mt_train_progress(opts, tty, step + 1, opts->steps, so.loss, tok_s,
                              ri->peak > 0 ? tok_s * ri->flops_per_token / ri->peak : 0,
                              dt * (opts->steps - step - 1), so.grad_norm, mt_model_loss_parts(rs->model, &n_part),
                              so.part, so.n_part);
        if (k == 0 && ri->wrank == 0) mt_train_progress_startup(opts, tty && step + 1 < opts->steps, ri, dt);
        MT_CHECK(after_step(ctx, rs, opts, step + 1, tty, run_pk, train_pk));
    }
    return MT_OK;
}

enum mt_status mt_train_run(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                            struct mt_train_result *res)
{
    enum mt_status rc = MT_OK;
    struct run_state rs;
    memset(&rs, 0, sizeof rs);
    memset(res, 0, sizeof *res);
    rs.cfg = cfg;
    rs.rss_phased = 1;
    mt_train_fault_parse(&rs.fault, mt_knob_str(ctx, MT_KNOB_TEST_FAULT));
    char resume_dir[4096] = "", trace[4096] = "", peak_src[1024] = "";
    struct mt_ckpt_meta resume_meta;
    memset(&resume_meta, 0, sizeof resume_meta);
    int out_lock = -1;   /* OUT/.lock, held by rank 0 from stage 5 to the end */
    struct mt_mesh_dims dims;
    struct mt_train_run_info ri = {.opts = opts, .dims = &dims, .trace = trace, .peak_src = peak_src,
                                   .resume_dir = resume_dir};
    mt_comm_world_info(&ri.world, &ri.wrank);
    ctx->rank = ri.wrank;
    ri.t_entry = mt_time_sec();
    ri.to_first_step_s = -1;

    /* ---- 1-3. flags, config, resume metadata, backend, data (local, then agreed) ---- */
    rc = mt_train_setup_local(ctx, cfg, opts, ri.world, &dims, resume_dir, sizeof resume_dir, &resume_meta, &rs);
    MT_CHECK_GOTO(mt_comm_agree(ctx, NULL, rc, "setup (flags, config, resume, data)"), rc, done);
    /* every rank was given the same config, mesh, data, --out and build
     * (issue 33): before anything is allocated or exchanged by that config */
    if (ri.world > 1) MT_CHECK_GOTO(mt_train_setup_agree(ctx, cfg, opts, &dims, resume_dir, &resume_meta, &rs), rc, done);
    /* eval_batches 0: every distinct window of the val split (the last batch
     * that does not wrap: window o = ((b*G+i)*T) mod (N-T-1), docs/architecture.md) */
    if (cfg->eval_batches == 0 && rs.val) {
        const size_t n = mt_data_ntokens(rs.val), per = (size_t)cfg->batch_size * (size_t)cfg->seq_len;
        const size_t nb = n > (size_t)cfg->seq_len + 1 ? (n - (size_t)cfg->seq_len - 1) / per : 0;
        cfg->eval_batches = nb < 1 ? 1 : nb > 100000 ? 100000 : (int)nb;
    }
    ri.threads = mt_train_pick_threads(cfg);
    mt_ops_cpu_set_threads(ri.threads);
    oversubscribed_warning(rs.ops, ri.threads, ri.world, ri.wrank);
    rs.Gl = cfg->batch_size / (dims.dp * dims.ep);
    rs.Bm = rs.Gl / cfg->microbatches;
    ri.start_step = resume_dir[0] ? resume_meta.step : 0;
    ri.n_steps = opts->steps - ri.start_step;

    /* ---- 4. mesh (collective), model, ZeRO engines, optimizers, parameters ---- */
    res->collective_started = ri.world > 1; /* mt_mesh_create is collective: a failure inside it aborts */
    MT_CHECK_GOTO(mt_train_setup_mesh(ctx, &rs, opts, &dims), rc, done);
    mt_mesh_trace_line(rs.mesh, trace, sizeof trace);   /* the receipt keeps the whole line */
    char brief[1024];
    mt_mesh_trace_line_brief(rs.mesh, brief, sizeof brief);
    printf("%s\n", brief);   /* the step-0 trace: one line per rank, whatever --quiet says */
    fflush(stdout);
    rc = mt_train_setup_model(ctx, &rs, opts, &dims, ri.n_steps, resume_dir, &resume_meta);
    /* allocation and the checkpoint load are local too: agree before the
     * parameters are first exchanged; a failure ends every rank in order */
    if ((rc = mt_comm_agree(ctx, rs.sumc, rc, "setup (allocation, checkpoint load)")) != MT_OK) {
        if (rc != MT_ERR_COMM) res->collective_started = 0; /* agreed: no abort (a broken comm still aborts) */
        goto done;
    }
    double t_sync = mt_time_sec();
    if (resume_dir[0] || opts->init_from) MT_CHECK_GOTO(mt_zero_set_sync(ctx, &rs.zset), rc, done);
    ri.setup_s = t_sync - ri.t_entry - rs.param_init_s;
    ri.param_init_s = rs.param_init_s + (mt_time_sec() - t_sync);
    const double t_roof = mt_time_sec();

    /* ---- 5. outputs, the roof, the step loop ---- */
    MT_CHECK_GOTO(take_output(ctx, &rs, opts, &out_lock, res), rc, done);
    ri.peak = peak_flops(ctx, opts, &rs, ri.threads, ri.world, &ri.roof, peak_src, sizeof peak_src);
    ri.flops_per_token = mt_model_flops_per_token(cfg);
    ri.roof_s = mt_time_sec() - t_roof;
    if (ri.wrank == 0) mt_train_progress_startup(opts, 0, &ri, -1);
    double t_run0 = mt_time_sec();
    mt_zero_set_reset_stats(&rs.zset);
    /* memory phases: setup until here, then the step loop (see report.c) */
    struct mt_train_peaks run_pk, train_pk;
    memset(&run_pk, 0, sizeof run_pk);
    memset(&train_pk, 0, sizeof train_pk);
    mt_train_peak_fold(ctx, &run_pk);
    mt_train_peak_restart(ctx, &rs);
    MT_CHECK_GOTO(step_loop(ctx, &rs, opts, &ri, &run_pk, &train_pk), rc, done);
    /* a device fault the steps' checks did not see (after the last norm: its update, the
     * shadows' refresh, an evaluation) ends the run here, named and agreed, before the save */
    MT_CHECK_GOTO(mt_comm_agree(ctx, rs.sumc, mt_train_backend_status(ctx, rs.ops), "the run's last kernels"), rc,
                  done);
    ri.total_s = mt_time_sec() - t_run0;
    mt_train_peak_fold(ctx, &train_pk);
    mt_train_peak_restart(ctx, &rs);
    /* save_final=false (--no-save): the receipt alone, no checkpoint at the end */
    if (cfg->save_final) MT_CHECK_GOTO(mt_train_save_checkpoint(ctx, opts, &rs, opts->steps), rc, done);

    /* ---- 6. checks and receipt ---- */
    ri.run_pk = &run_pk;
    ri.train_pk = &train_pk;
    MT_CHECK_GOTO(mt_train_report(ctx, &rs, &ri, res), rc, done);

done:
    mt_ckpt_unlock(out_lock);
    mt_train_free(ctx, &rs);
    return rc;
}
