/*
 * trainer.c — the training loop of one rank.
 *
 * Invariant: nothing is written under --out until every input has been
 * checked (config, data, resume checkpoint) and every buffer allocated, so
 * bad input loses nothing. The step is
 *     zero grads; for each microbatch: forward (+loss parts), backward (grads +=);
 *     global grad norm (fp64); stop on non-finite; optimizer step (clip inside);
 * and the global batch at step s is the same set of sequences whatever the
 * mesh (mt_data_sequence), with the loss normalised by global counts.
 */
#define _GNU_SOURCE
#include "mt_trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/mt_model.h"
#include "../ops/mt_ops.h"
#include "mt_ckpt.h"
#include "mt_data.h"
#include "mt_optim.h"
#include "mt_receipt.h"

/* Directory holding the data: the path itself if it is a directory, else its parent. */
static void data_dir_of(const char *path, char *dir, size_t n)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, n, "%s", path);
        return;
    }
    snprintf(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, n, ".");
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* vocab_size 0 = take it from DATA_DIR/meta.json (written by `meshtrain prepare`). */
static enum mt_status resolve_vocab(struct mt_ctx *ctx, struct mt_config *cfg, const char *data_path)
{
    if (cfg->vocab_size != 0) return MT_OK;
    char dir[2048], meta[2100];
    data_dir_of(data_path, dir, sizeof dir);
    snprintf(meta, sizeof meta, "%s/meta.json", dir);
    FILE *f = fopen(meta, "rb");
    if (!f) return MT_OK; /* resolve() reports "vocab_size is not set" */
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "vocab_size") : NULL;
    if (!cJSON_IsNumber(v)) {
        cJSON_Delete(j);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s has no numeric vocab_size", meta);
    }
    cfg->vocab_size = v->valueint;
    cJSON_Delete(j);
    return MT_OK;
}

static int mkdir_p(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

static void copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in) return;
    FILE *out = fopen(dst, "wb");
    if (out) {
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        fclose(out);
    }
    fclose(in);
}

/* Peak FLOP/s that MFU is measured against: the best of a few square sgemms
 * through the same ops table the model uses (so it measures the kernels the
 * run really had). Uses a private ctx so its buffers stay out of the memory
 * accounting. */
static double measure_gemm_roof(const struct mt_ops_i *ops, int n)
{
    struct mt_ctx tmp;
    mt_ctx_init(&tmp);
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = ops->buf_alloc(&tmp, bytes, MT_BUCKET_OTHER);
    float *b = ops->buf_alloc(&tmp, bytes, MT_BUCKET_OTHER);
    float *c = ops->buf_alloc(&tmp, bytes, MT_BUCKET_OTHER);
    double best = 0;
    if (a && b && c) {
        ops->fill(a, 0.5f, (size_t)n * n);
        ops->fill(b, 0.25f, (size_t)n * n);
        for (int rep = 0; rep < 4; rep++) {
            double t0 = mt_time_sec();
            ops->gemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            ops->sync();
            double dt = mt_time_sec() - t0;
            double f = 2.0 * n * (double)n * n / dt;
            if (rep > 0 && f > best) best = f; /* rep 0 warms up */
        }
    }
    ops->buf_free(&tmp, a);
    ops->buf_free(&tmp, b);
    ops->buf_free(&tmp, c);
    return best;
}

static int pick_threads(const struct mt_config *cfg)
{
    if (cfg->threads > 0) return cfg->threads;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e && atoi(e) > 0) return atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Name of the first parameter whose gradient is not finite (for the error). */
static const char *first_nonfinite_grad(const struct mt_ops_i *ops, struct mt_param *params, int n)
{
    for (int i = 0; i < n; i++)
        if (!ops->all_finite(params[i].grad, params[i].numel)) return params[i].name;
    return "(unknown)";
}

struct run_state {
    struct mt_data  *train, *val;
    struct mt_model *model;
    struct mt_optim *optim;
    int32_t *idx, *tgt;         /* (Bm, T) host */
    int     *step_index, *eval_steps;
    double  *losses, *lm, *aux, *z, *gnorm, *lrs, *times, *eval_losses;
    int      n_evals;
};

/* Validation loss: eval_batches global batches of the val stream (fixed: the
 * same sequences every evaluation), forward only. */
static enum mt_status evaluate(struct mt_ctx *ctx, const struct mt_config *cfg, struct run_state *rs,
                               int Bm, double *out)
{
    int G = cfg->batch_size, T = cfg->seq_len;
    struct mt_loss_norm norm = {.n_targets = (double)G * T, .n_sequences = G, .n_tokens = (double)G * T};
    double sum = 0;
    for (int b = 0; b < cfg->eval_batches; b++) {
        for (int mb = 0; mb < G / Bm; mb++) {
            for (int i = 0; i < Bm; i++)
                mt_data_sequence(rs->val, b, G, (int64_t)mb * Bm + i, T, rs->idx + (size_t)i * T,
                                 rs->tgt + (size_t)i * T);
            struct mt_loss_parts parts;
            MT_CHECK(mt_model_forward(ctx, rs->model, rs->idx, rs->tgt, &norm, &parts));
            sum += parts.lm;
        }
    }
    *out = sum / cfg->eval_batches;
    return MT_OK;
}

static void progress(const struct mt_train_opts *opts, int tty, int step, int steps, double loss, double tok_s,
                     double mfu, double eta_s, double gnorm)
{
    if (opts->quiet) return;
    if (tty) {
        fprintf(stdout, "\rstep %5d/%d | loss %.4f | gnorm %.3f | %8.0f tok/s | MFU %5.1f%% | ETA %5.0fs   ",
                step, steps, loss, gnorm, tok_s, 100.0 * mfu, eta_s);
        if (step == steps) fputc('\n', stdout);
    } else {
        fprintf(stdout, "step %d/%d loss %.6f gnorm %.4f tok/s %.0f mfu %.4f eta_s %.0f\n", step, steps, loss,
                gnorm, tok_s, mfu, eta_s);
    }
    fflush(stdout);
}

static enum mt_status save_checkpoint(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                                      const struct mt_config *cfg, const struct mt_train_opts *opts,
                                      struct run_state *rs, int step)
{
    char dir[4200], tok_src[2100], tok_dst[4300], data_dir[2048];
    snprintf(dir, sizeof dir, "%s/ckpt/step_%06d", opts->out_dir, step);
    char parent[4200];
    snprintf(parent, sizeof parent, "%s/ckpt", opts->out_dir);
    if (mkdir_p(parent) != 0) return mt_ctx_error(ctx, MT_ERR_IO, "cannot create %s", parent);
    struct mt_ckpt_meta meta = {0};
    meta.step = step;
    meta.data_pos = (int64_t)step * cfg->batch_size;
    meta.seed = cfg->seed;
    meta.adam_t = mt_optim_get_t(rs->optim);
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    MT_CHECK(mt_ckpt_save(ctx, ops, dir, cfg, &meta, params, n, rs->optim));
    /* the tokenizer travels with the checkpoint so `sample` can decode */
    data_dir_of(opts->data_path, data_dir, sizeof data_dir);
    snprintf(tok_src, sizeof tok_src, "%s/tokenizer.bin", data_dir);
    snprintf(tok_dst, sizeof tok_dst, "%s/tokenizer.bin", dir);
    if (file_exists(tok_src)) copy_file(tok_src, tok_dst);
    return MT_OK;
}

enum mt_status mt_train_run(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                            struct mt_train_result *res)
{
    enum mt_status rc = MT_OK;
    struct run_state rs;
    memset(&rs, 0, sizeof rs);
    memset(res, 0, sizeof *res);
    char resume_dir[4096] = "";
    struct mt_ckpt_meta resume_meta;
    memset(&resume_meta, 0, sizeof resume_meta);

    if (!opts->data_path) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--data is required");
    if (!opts->out_dir) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--out is required");
    if (opts->steps < 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--steps must be >= 0 (got %d)", opts->steps);
    if (opts->mesh && strcmp(opts->mesh, "") != 0) {
        /* Only the all-ones mesh runs in a single-rank build of the trainer. */
        int pp = 1, dp = 1, ep = 1, tp = 1;
        const char *s = opts->mesh;
        while (*s) {
            char axis[8];
            int v, used;
            if (sscanf(s, "%7[a-z]=%d%n", axis, &v, &used) != 2)
                return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "bad --mesh '%s' (expected e.g. pp=1,dp=2,ep=1,tp=2)", opts->mesh);
            if (v <= 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: degree of %s must be >= 1 (got %d)", axis, v);
            if (!strcmp(axis, "pp")) pp = v;
            else if (!strcmp(axis, "dp")) dp = v;
            else if (!strcmp(axis, "ep")) ep = v;
            else if (!strcmp(axis, "tp")) tp = v;
            else return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: unknown axis '%s' (axes: pp, dp, ep, tp)", axis);
            s += used;
            if (*s == ',') s++;
            else if (*s) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "bad --mesh '%s'", opts->mesh);
        }
        if (pp * dp * ep * tp != 1)
            return mt_ctx_error(ctx, MT_ERR_CONFIG,
                                "mesh contract: world == pp*dp*ep*tp (world=1, pp*dp*ep*tp=%d)", pp * dp * ep * tp);
    }
    if (opts->zero_stage < 0 || opts->zero_stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--zero must be 0, 1, 2 or 3 (got %d)", opts->zero_stage);

    /* ---- 1. config (vocab may come from the data dir) ---- */
    MT_CHECK(resolve_vocab(ctx, cfg, opts->data_path));
    if (opts->resume) {
        MT_CHECK(mt_ckpt_find(ctx, opts->resume, resume_dir, sizeof resume_dir));
        struct mt_config saved;
        mt_config_defaults(&saved);
        MT_CHECK(mt_ckpt_read_meta(ctx, resume_dir, &saved, &resume_meta));
        if (cfg->vocab_size == 0) cfg->vocab_size = saved.vocab_size;
        if (opts->steps < resume_meta.step)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--steps %d is below the checkpoint's step %d (%s)",
                                opts->steps, resume_meta.step, resume_dir);
        MT_CHECK(mt_config_resolve(ctx, cfg, opts->steps));
        char why[256];
        if (!mt_config_same_model(cfg, &saved, why, sizeof why))
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "cannot resume from %s: incompatible config: %s", resume_dir, why);
    } else {
        MT_CHECK(mt_config_resolve(ctx, cfg, opts->steps));
    }

    /* ---- 2. backend ---- */
    const struct mt_ops_i *ops = NULL;
    char fallback[256] = "";
    if (!strcmp(cfg->backend, "cuda")) {
        char why[200] = "";
        ops = mt_ops_cuda(why, sizeof why);
        if (!ops)
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend 'cuda' is not available: %s (use backend=cpu)", why);
    } else {
        ops = mt_ops_cpu();
    }
    int threads = pick_threads(cfg);
    mt_ops_cpu_set_threads(threads);

    /* ---- 3. data ---- */
    const int T = cfg->seq_len, G = cfg->batch_size, Bm = G / cfg->microbatches;
    MT_CHECK_GOTO(mt_data_open(ctx, opts->data_path, is_dir(opts->data_path) ? "train" : NULL, cfg->vocab_size, T,
                               &rs.train), rc, done);
    if (opts->val_path) {
        MT_CHECK_GOTO(mt_data_open(ctx, opts->val_path, NULL, cfg->vocab_size, T, &rs.val), rc, done);
    } else if (is_dir(opts->data_path)) {
        if (mt_data_open(ctx, opts->data_path, "val", cfg->vocab_size, T, &rs.val) != MT_OK) {
            if (ctx->last_status == MT_ERR_IO) mt_ctx_clear_error(ctx); /* no val split: fine */
            else { rc = ctx->last_status; goto done; }
            rs.val = NULL;
        }
    }

    /* ---- 4. model, optimizer, state ---- */
    MT_CHECK_GOTO(mt_model_create(ctx, ops, cfg, Bm, &rs.model), rc, done);
    int n_params;
    struct mt_param *params = mt_model_params(rs.model, &n_params);
    MT_CHECK_GOTO(mt_optim_create(ctx, ops, cfg, params, n_params, &rs.optim), rc, done);
    int start_step = 0;
    if (resume_dir[0]) {
        MT_CHECK_GOTO(mt_ckpt_load(ctx, ops, resume_dir, params, n_params, rs.optim), rc, done);
        mt_optim_set_t(rs.optim, resume_meta.adam_t);
        start_step = resume_meta.step;
    } else {
        MT_CHECK_GOTO(mt_model_init_params(ctx, rs.model, cfg->seed), rc, done);
    }
    int n_steps = opts->steps - start_step;
    size_t nh = (size_t)(n_steps > 0 ? n_steps : 1);
    rs.idx = mt_alloc(ctx, (size_t)Bm * T * sizeof(int32_t), MT_BUCKET_OTHER);
    rs.tgt = mt_alloc(ctx, (size_t)Bm * T * sizeof(int32_t), MT_BUCKET_OTHER);
    rs.step_index = mt_alloc(ctx, nh * sizeof(int), MT_BUCKET_OTHER);
    rs.eval_steps = mt_alloc(ctx, (nh + 1) * sizeof(int), MT_BUCKET_OTHER);
    rs.losses = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.lm = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.aux = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.z = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.gnorm = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.lrs = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.times = mt_alloc(ctx, nh * sizeof(double), MT_BUCKET_OTHER);
    rs.eval_losses = mt_alloc(ctx, (nh + 1) * sizeof(double), MT_BUCKET_OTHER);
    if (!rs.idx || !rs.tgt || !rs.step_index || !rs.eval_steps || !rs.losses || !rs.lm || !rs.aux || !rs.z ||
        !rs.gnorm || !rs.lrs || !rs.times || !rs.eval_losses) {
        rc = MT_ERR_OOM;
        goto done;
    }

    /* ---- 5. from here on we write outputs ---- */
    if (mkdir_p(opts->out_dir) != 0) {
        rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot create output directory %s", opts->out_dir);
        goto done;
    }
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    double peak = opts->peak_flops;
    char peak_src[160];
    if (peak > 0) {
        snprintf(peak_src, sizeof peak_src, "given by --peak-flops");
    } else {
        peak = measure_gemm_roof(ops, 2048);
        snprintf(peak_src, sizeof peak_src,
                 "measured at startup: best of 3 sgemm 2048^3 through the %s ops table, %d threads, coretype %s",
                 ops->name, threads, info.coretype);
    }

    const double flops_per_token = mt_model_flops_per_token(cfg);
    const int tty = isatty(fileno(stdout));
    double t_run0 = mt_time_sec();
    int steps_run = 0;
    for (int step = start_step; step < opts->steps; step++) {
        double t0 = mt_time_sec();
        mt_model_zero_grad(rs.model);
        /* targets are never -1 in the default order; the count stays general */
        struct mt_loss_norm norm = {.n_targets = (double)G * T, .n_sequences = G, .n_tokens = (double)G * T};
        double lm = 0, aux = 0, z = 0;
        for (int mb = 0; mb < cfg->microbatches; mb++) {
            for (int i = 0; i < Bm; i++)
                mt_data_sequence(rs.train, step, G, (int64_t)mb * Bm + i, T, rs.idx + (size_t)i * T,
                                 rs.tgt + (size_t)i * T);
            struct mt_loss_parts parts;
            MT_CHECK_GOTO(mt_model_forward(ctx, rs.model, rs.idx, rs.tgt, &norm, &parts), rc, done);
            MT_CHECK_GOTO(mt_model_backward(ctx, rs.model), rc, done);
            lm += parts.lm;
            aux += parts.aux;
            z += parts.z;
        }
        double loss = lm + aux + z;
        double gn = sqrt(mt_optim_grad_sumsq(rs.optim));
        if (!isfinite(loss) || !isfinite(gn)) {
            rc = mt_ctx_error(ctx, MT_ERR_NUMERIC, "non-finite %s at step %d on rank %d (parameter %s)",
                              isfinite(loss) ? "gradient" : "loss", step, ctx->rank,
                              first_nonfinite_grad(ops, params, n_params));
            goto done;
        }
        MT_CHECK_GOTO(mt_optim_step(ctx, rs.optim, step, gn), rc, done);
        ops->sync();
        double dt = mt_time_sec() - t0;
        int k = steps_run++;
        rs.step_index[k] = step;
        rs.losses[k] = loss;
        rs.lm[k] = lm;
        rs.aux[k] = aux;
        rs.z[k] = z;
        rs.gnorm[k] = gn;
        rs.lrs[k] = mt_optim_lr_factor(cfg, step);
        rs.times[k] = dt;
        double tok_s = (double)G * T / dt;
        double eta = dt * (opts->steps - step - 1);
        progress(opts, tty, step + 1, opts->steps, loss, tok_s, peak > 0 ? tok_s * flops_per_token / peak : 0, eta,
                 gn);
        int done_steps = step + 1;
        if (rs.val && cfg->eval_every > 0 && (done_steps % cfg->eval_every == 0 || done_steps == opts->steps)) {
            double vl;
            MT_CHECK_GOTO(evaluate(ctx, cfg, &rs, Bm, &vl), rc, done);
            rs.eval_steps[rs.n_evals] = done_steps;
            rs.eval_losses[rs.n_evals++] = vl;
            if (!opts->quiet) {
                fprintf(stdout, "%sval step %d loss %.6f\n", tty ? "\n" : "", done_steps, vl);
                fflush(stdout);
            }
        }
        if (cfg->save_every > 0 && done_steps % cfg->save_every == 0 && done_steps != opts->steps)
            MT_CHECK_GOTO(save_checkpoint(ctx, ops, cfg, opts, &rs, done_steps), rc, done);
    }
    double total_s = mt_time_sec() - t_run0;
    MT_CHECK_GOTO(save_checkpoint(ctx, ops, cfg, opts, &rs, opts->steps), rc, done);

    /* ---- 6. receipt ---- */
    {
        struct mt_receipt r;
        memset(&r, 0, sizeof r);
        r.command_line = opts->command_line;
        snprintf(r.backend_requested, sizeof r.backend_requested, "%s", cfg->backend);
        snprintf(r.backend_actual, sizeof r.backend_actual, "%s", ops->name);
        snprintf(r.runtime_mode, sizeof r.runtime_mode, "fp32");
        snprintf(r.fallback_reason, sizeof r.fallback_reason, "%s", fallback);
        snprintf(r.blas, sizeof r.blas, "%s", info.blas);
        snprintf(r.coretype, sizeof r.coretype, "%s", info.coretype);
        snprintf(r.coretype_source, sizeof r.coretype_source, "%s", info.coretype_source);
        r.threads = threads;
        r.pp = r.dp = r.ep = r.tp = r.world = 1;
        r.zero_stage = opts->zero_stage;
        r.cfg = cfg;
        r.micro_batch_seqs = Bm;
        mt_model_param_counts(cfg, &r.params_total, &r.params_active);
        r.flops_per_token = flops_per_token;
        mt_model_plan_bytes(cfg, Bm, r.plan_bytes);
        size_t ob[MT_BUCKET_COUNT] = {0};
        mt_optim_plan_bytes(cfg, params, n_params, ob);
        for (int b = 0; b < MT_BUCKET_COUNT; b++) r.plan_bytes[b] += ob[b];
        for (int b = 0; b < MT_BUCKET_COUNT; b++) r.measured_peak_bytes[b] = ctx->bytes_peak[b];
        r.peak_rss_bytes = mt_peak_rss_bytes();
        r.steps_run = steps_run;
        r.warmup_excluded = steps_run >= 4 ? 2 : (steps_run >= 2 ? 1 : 0);
        double steady = 0;
        for (int i = r.warmup_excluded; i < steps_run; i++) steady += rs.times[i];
        int n_steady = steps_run - r.warmup_excluded;
        r.tokens_per_s = (n_steady > 0 && steady > 0) ? (double)G * T * n_steady / steady : 0;
        r.model_flops_per_s = r.tokens_per_s * flops_per_token;
        r.peak_flops = peak;
        r.mfu = peak > 0 ? r.model_flops_per_s / peak : 0;
        snprintf(r.peak_flops_source, sizeof r.peak_flops_source, "%s", peak_src);
        for (int i = 0; i < steps_run; i++) r.compute_s += rs.times[i];
        r.comm_s = 0;
        r.idle_s = 0;
        r.total_s = total_s;
        r.n_steps = steps_run;
        r.step_index = rs.step_index;
        r.losses = rs.losses;
        r.lm_losses = rs.lm;
        r.aux_losses = rs.aux;
        r.z_losses = rs.z;
        r.grad_norms = rs.gnorm;
        r.lrs = rs.lrs;
        r.step_times = rs.times;
        r.n_evals = rs.n_evals;
        r.eval_steps = rs.eval_steps;
        r.eval_losses = rs.eval_losses;
        snprintf(r.replica_hash_check, sizeof r.replica_hash_check,
                 "not applicable: world=1, every tensor has one copy");
        r.start_step = start_step;
        snprintf(r.resumed_from, sizeof r.resumed_from, "%s", resume_dir);
        snprintf(r.data_path, sizeof r.data_path, "%s", opts->data_path);
        r.data_tokens = mt_data_ntokens(rs.train);
        char path[4200];
        snprintf(path, sizeof path, "%s/receipt.json", opts->out_dir);
        MT_CHECK_GOTO(mt_receipt_write(ctx, path, &r), rc, done);
        res->steps_run = steps_run;
        res->final_loss = steps_run ? rs.losses[steps_run - 1] : 0;
        res->tokens_per_s = r.tokens_per_s;
        res->mfu = r.mfu;
    }

done:
    mt_free(ctx, rs.idx);
    mt_free(ctx, rs.tgt);
    mt_free(ctx, rs.step_index);
    mt_free(ctx, rs.eval_steps);
    mt_free(ctx, rs.losses);
    mt_free(ctx, rs.lm);
    mt_free(ctx, rs.aux);
    mt_free(ctx, rs.z);
    mt_free(ctx, rs.gnorm);
    mt_free(ctx, rs.lrs);
    mt_free(ctx, rs.times);
    mt_free(ctx, rs.eval_losses);
    mt_optim_destroy(ctx, rs.optim);
    mt_model_destroy(ctx, rs.model);
    mt_data_close(rs.train);
    mt_data_close(rs.val);
    return rc;
}
