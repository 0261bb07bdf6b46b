/*
 * setup.c — the run's setup, in two halves.
 *
 * Local (mt_train_setup_local, no collective): flags, mesh shape, config
 * (and the resume checkpoint's metadata), startup contract, pipeline cut,
 * backend, data. Collective (mt_train_setup_mesh, mt_train_setup_model):
 * the mesh's communicators, the model, one ZeRO engine and optimizer per
 * reduction group, the parameters (init, resume or --init-from). Every half
 * ends in mt_comm_agree (in mt_train_run): a rank that fails alone must not
 * leave the others waiting in the next collective. Nothing is written under
 * --out during setup, so bad input loses nothing.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/mt_build.h"
#include "../core/mt_fileio.h"
#include "../core/mt_knobs.h"
#include "../optim/mt_optim.h"
#include "../parallel/mt_layout.h"
#include "../plan/mt_plan.h"
#include "train_impl.h"

enum mt_status mt_train_backend_status(struct mt_ctx *ctx, const struct mt_ops_i *ops)
{
    if (!ops || !ops->status) return MT_OK;   /* entries that cannot fail (cpu) */
    ops->sync(ops->be);
    char msg[384];
    if (ops->status(ops->be, msg, sizeof msg) != MT_OK)
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "%s backend: %s", ops->name, msg);
    return MT_OK;
}

/* vocab_size 0 = take it from DATA_DIR/meta.json (written by `meshtrain prepare`). */
static enum mt_status resolve_vocab(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts)
{
    return mt_data_resolve_vocab(ctx, opts->data_path, &cfg->vocab_size, opts->resume || opts->init_from);
}

int mt_train_pick_threads(const struct mt_config *cfg)
{
    if (cfg->threads > 0) return cfg->threads;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e && atoi(e) > 0) return atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The trainer's own host arrays (bucket OTHER), live through the whole run,
 * sized by the layout module's list (mt_layout_host_sizes: the planner sizes
 * them from the same list, so the two agree); a 0 size is not allocated. */
static enum mt_status alloc_host_arrays(struct mt_ctx *ctx, struct run_state *rs, int n_params, int n_steps,
                                        int world)
{
    void **ptr[MT_HOST_N] = {
        [MT_HOST_ENG_OF] = (void **)&rs->eng_of,         [MT_HOST_SEL0] = (void **)&rs->sel[0],
        [MT_HOST_SEL1] = (void **)&rs->sel[1],           [MT_HOST_SEL2] = (void **)&rs->sel[2],
        [MT_HOST_COUNT_MASK] = (void **)&rs->count,      [MT_HOST_IDX] = (void **)&rs->idx,
        [MT_HOST_TGT] = (void **)&rs->tgt,               [MT_HOST_STEP_INDEX] = (void **)&rs->step_index,
        [MT_HOST_EVAL_STEPS] = (void **)&rs->eval_steps, [MT_HOST_LOSSES] = (void **)&rs->losses,
        [MT_HOST_LOSS_PARTS] = (void **)&rs->loss_parts, [MT_HOST_GNORM] = (void **)&rs->gnorm,
        [MT_HOST_LRS] = (void **)&rs->lrs,               [MT_HOST_TIMES] = (void **)&rs->times,
        [MT_HOST_EVAL_LOSSES] = (void **)&rs->eval_losses, [MT_HOST_MEM_ALL] = (void **)&rs->mem_all,
        [MT_HOST_IMBALANCE] = (void **)&rs->imbalance,   [MT_HOST_LOAD_TOTAL] = (void **)&rs->load_total,
        [MT_HOST_LOAD_STEP] = (void **)&rs->load_step,
    };
    size_t bytes[MT_HOST_N];
    mt_layout_host_sizes(rs->cfg, n_params, rs->Bm, n_steps, world, bytes);
    for (int k = 0; k < MT_HOST_N; k++)
        if (bytes[k] && !(*ptr[k] = mt_alloc(ctx, bytes[k], MT_BUCKET_OTHER))) return MT_ERR_OOM;
    return MT_OK;
}

size_t mt_train_host_bytes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world)
{
    return mt_layout_host_bytes(cfg, n_params, Bm, n_steps, world);
}

/* rs->base_load: base checkpoint `dir`; rs->base_path: the absolute path of
 * the base the checkpoints name (`dir`, or the Hugging Face folder it was
 * imported from). A base inside OUT/ckpt is refused: the run's own step_N
 * (or a pruned sibling) could replace it, and every adapter checkpoint
 * would lose its base. */
static enum mt_status set_base_path(struct mt_ctx *ctx, const char *dir, const struct mt_train_opts *opts,
                                    struct run_state *rs)
{
    char full[PATH_MAX], out[PATH_MAX];
    const char *named = opts->init_from_hf ? opts->init_from_hf : dir;
    snprintf(rs->base_load, sizeof rs->base_load, "%s", dir);
    if (!realpath(named, full) || strlen(full) >= sizeof rs->base_path)
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot resolve the base checkpoint path %s", named);
    if (realpath(opts->out_dir, out)) {
        size_t n = strlen(out);
        if (!strncmp(full, out, n) && !strncmp(full + n, "/ckpt/", 6))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--out %s holds the LoRA base checkpoint %s: this run's "
                                "adapter-only checkpoints could replace it (use another --out)", opts->out_dir, full);
    }
    snprintf(rs->base_path, sizeof rs->base_path, "%s", full);
    return MT_OK;
}

/* LoRA from a meshtrain checkpoint (docs/lora.md): the run's checkpoints
 * will be adapter-only and name the base by its manifest hash. An
 * adapter-only --init-from hands on its own (checked) base: new adapters on
 * the same frozen weights. */
static enum mt_status lora_base(struct mt_ctx *ctx, const struct mt_train_opts *opts, struct run_state *rs)
{
    struct mt_ckpt_meta m;
    MT_CHECK(mt_ckpt_read_meta(ctx, opts->init_from, NULL, &m));
    const char *b = opts->init_from;
    if (m.base_hash[0]) {
        MT_CHECK(mt_ckpt_base_check(ctx, opts->init_from, &m, NULL));
        b = m.base_path;
    }
    MT_CHECK(mt_ckpt_manifest_hash(ctx, b, rs->base_hash));
    return set_base_path(ctx, b, opts, rs);
}

/* A resume keeps the LoRA settings (rank, alpha, targets) it was saved with:
 * other adapters would not fit the saved ones, another alpha would silently
 * rescale them. An adapter-only checkpoint also needs its base: --init-from
 * (the only use of --init-from with --resume), else the recorded path, with
 * the recorded manifest hash (mt_ckpt_base_check). */
static enum mt_status resume_base(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_config *saved,
                                  const struct mt_train_opts *opts, const char *resume_dir,
                                  const struct mt_ckpt_meta *meta, struct run_state *rs)
{
    if (saved->lora_rank > 0 || cfg->lora_rank > 0) {
        unsigned ms = 0, mc = 0;
        char bad[64];
        mt_config_lora_mask(saved->lora_targets, &ms, bad, sizeof bad);
        mt_config_lora_mask(cfg->lora_targets, &mc, bad, sizeof bad);
        if (saved->lora_rank != cfg->lora_rank ||
            (cfg->lora_rank > 0 && (saved->lora_alpha != cfg->lora_alpha || ms != mc)))
            return mt_ctx_error(ctx, MT_ERR_CONFIG,
                                "cannot resume from %s: it was trained with LoRA rank %d alpha %g targets %s, this run "
                                "asks rank %d alpha %g targets %s (keep --lora as saved)", resume_dir,
                                saved->lora_rank, (double)saved->lora_alpha,
                                saved->lora_rank ? saved->lora_targets : "-", cfg->lora_rank, (double)cfg->lora_alpha,
                                cfg->lora_rank ? cfg->lora_targets : "-");
    }
    if (!meta->base_hash[0]) {
        if (opts->init_from)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--resume and --init-from exclude each other (--init-from "
                                "with --resume names the base of an adapter-only checkpoint; %s is a full checkpoint)",
                                resume_dir);
        return MT_OK;
    }
    if (opts->init_from_hf) {
        /* a Hugging Face base: name the folder, not its temporary import */
        char h[MT_CKPT_RUN_ID_LEN];
        MT_CHECK(mt_ckpt_manifest_hash(ctx, opts->init_from, h));
        if (strcmp(h, meta->base_hash))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "adapter-only checkpoint %s was trained on the base with "
                                "manifest hash %s; the Hugging Face folder %s imports with manifest hash %s: not the "
                                "same base", resume_dir, meta->base_hash, opts->init_from_hf, h);
    }
    MT_CHECK(mt_ckpt_base_check(ctx, resume_dir, meta, opts->init_from));
    snprintf(rs->base_hash, sizeof rs->base_hash, "%s", meta->base_hash);
    return set_base_path(ctx, opts->init_from ? opts->init_from : meta->base_path, opts, rs);
}

/* Bytes the host can still give this process: (MemAvailable + SwapFree) of
 * /proc/meminfo shared by the launcher's ranks on this node; 0 = unknown. */
static double host_available_bytes(int *local_ranks)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    *local_ranks = 1;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) { *local_ranks = atoi(v); break; }
    }
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double avail = -1, swap = 0;
    while (fgets(line, sizeof line, f)) {
        double kb;
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) avail = kb * 1024.0;
        else if (sscanf(line, "SwapFree: %lf kB", &kb) == 1) swap = kb * 1024.0;
    }
    fclose(f);
    return avail < 0 ? 0 : (avail + swap) / *local_ranks;
}

static void bucket_line(const size_t *b, int first, int last, char *buf, size_t n)
{
    static const char *const names[MT_BUCKET_COUNT] = {"params", "grads", "optim", "acts", "comm", "workspace", "other"};
    size_t o = 0;
    buf[0] = 0;
    for (int k = first; k <= last && o < n; k++)
        if (b[k]) o += (size_t)snprintf(buf + o, n - o, "%s%s %.2f GiB", o ? ", " : "", names[k], (double)b[k] / 1073741824.0);
}

/* The plan's bytes for this rank (the planner's size functions, the same
 * the runtime allocates with) against the memory there is, before any large
 * allocation (issue 33 item 6): `--set d_model=1048576` used to zero-fill a
 * 15.9 GB activation buffer before noticing that 24 TB of parameters cannot
 * fit. cpu: every bucket is host memory; cuda: all but "other" live on the
 * device, checked against its free memory. MT_ERR_CONFIG (exit 2) with the
 * numbers. The plan runs on a scratch ctx (outside this run's accounting). */
static enum mt_status check_memory(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_train_opts *opts,
                                   const struct mt_mesh_dims *dims, int n_steps, const struct run_state *rs)
{
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = *dims;
    su.zero_stage = opts->zero_stage;
    su.steps = n_steps;
    memcpy(su.first_layer, rs->first_layer, sizeof su.first_layer);
    su.threads = mt_train_pick_threads(cfg);
    su.data_bytes = 2.0 * ((double)mt_data_ntokens(rs->train) + (rs->val ? (double)mt_data_ntokens(rs->val) : 0));
    struct mt_ctx pctx;
    mt_ctx_init(&pctx);
    pctx.knobs = ctx->knobs;   /* the run's knobs: the pieces carve by some (mt_model_plan_bytes_par) */
    struct mt_plan *plan = NULL;
    if (mt_plan_create(&pctx, cfg, &su, 0, &plan) != MT_OK) {
        if (pctx.last_status == MT_ERR_OOM)
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "cannot plan the memory of this model (%s): it is too large for "
                                "this host", mt_ctx_last_error(&pctx));
        return mt_ctx_error(ctx, pctx.last_status, "%s", mt_ctx_last_error(&pctx));
    }
    int rank = ctx->rank >= 0 && ctx->rank < mt_plan_world(plan) ? ctx->rank : 0;
    size_t b[MT_BUCKET_COUNT];
    mt_plan_rank_bytes(plan, rank, b);
    mt_plan_destroy(&pctx, plan);
    const int on_device = rs->ops && !rs->ops->host_memory;
    double host_need = 0, dev_need = 0;
    for (int k = 0; k < MT_BUCKET_COUNT; k++) {
        if (on_device && k != MT_BUCKET_OTHER) dev_need += (double)b[k];
        else host_need += (double)b[k];
    }
    char parts[512];
    int local = 1;
    double host = host_available_bytes(&local);
    if (host > 0 && host_need > host) {
        bucket_line(b, on_device ? MT_BUCKET_OTHER : 0, MT_BUCKET_OTHER, parts, sizeof parts);
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "the plan needs %.2f GiB of host memory on rank %d (%s) but %.2f GiB "
                            "are available to it (MemAvailable + SwapFree%s): shrink the model or the batch, or add "
                            "ranks (meshtrain plan shows where the bytes go)", host_need / 1073741824.0, rank, parts,
                            host / 1073741824.0, local > 1 ? ", shared by the ranks of this node" : "");
    }
    struct mt_ops_device_info ci;
    if (on_device && rs->ops->device_info && rs->ops->device_info(rs->ops->be, &ci) == MT_OK) {
        double dev = (double)(ci.mem_free_now ? ci.mem_free_now : ci.mem_total);
        if (dev > 0 && dev_need > dev) {
            bucket_line(b, 0, MT_BUCKET_WORKSPACE, parts, sizeof parts);
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "the plan needs %.2f GiB of device memory on rank %d (%s) but "
                                "the GPU (%s) has %.2f GiB free: shrink the model or the batch, or add ranks "
                                "(meshtrain plan shows where the bytes go)", dev_need / 1073741824.0, rank, parts,
                                ci.device, dev / 1073741824.0);
        }
    }
    return MT_OK;
}

/* Setup steps 1-3 of one rank, with no collective: flags, mesh shape,
 * config (and the resume checkpoint's metadata), startup contract, pipeline
 * cut, backend, data. Its status goes to mt_comm_agree: a rank that fails here
 * alone must not leave the others waiting in the first collective. Opened
 * streams are in rs (closed by the caller). */
enum mt_status mt_train_setup_local(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                                    int world, struct mt_mesh_dims *dims, char *resume_dir, size_t resume_n,
                                    struct mt_ckpt_meta *resume_meta, struct run_state *rs)
{
    if (!opts->data_path) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--data is required");
    if (!opts->out_dir) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--out is required");
    if (opts->steps < 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--steps must be >= 0 (got %d)", opts->steps);
    if (opts->zero_stage < 0 || opts->zero_stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--zero must be 0, 1, 2 or 3 (got %d)", opts->zero_stage);
    /* the mesh: parsed against the world size without any collective */
    MT_CHECK(mt_mesh_parse(ctx, opts->mesh, world, dims));

    /* ---- 1. config (vocab may come from the data dir) ---- */
    MT_CHECK(resolve_vocab(ctx, cfg, opts));
    if (opts->resume) {
        /* latest of the run, or its previous intact checkpoint (said on stderr) */
        char note[2048];
        MT_CHECK(mt_ckpt_resolve(ctx, opts->resume, resume_dir, resume_n, note, sizeof note));
        if (note[0] && ctx->rank == 0) fprintf(stderr, "meshtrain train: warning: %s\n", note);
        struct mt_config saved;
        mt_config_defaults(&saved);
        MT_CHECK(mt_ckpt_read_meta(ctx, resume_dir, &saved, resume_meta));
        MT_CHECK(mt_ckpt_check_tensors(ctx, resume_dir, &saved));   /* every tensor accounted for (issue 33) */
        if (cfg->vocab_size == 0) cfg->vocab_size = saved.vocab_size;
        if (opts->steps < resume_meta->step)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--steps %d is below the checkpoint's step %d (%s)",
                                opts->steps, resume_meta->step, resume_dir);
        MT_CHECK(mt_config_resolve(ctx, cfg, opts->steps));
        char why[256];
        if (!mt_config_same_model(cfg, &saved, why, sizeof why))
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "cannot resume from %s: incompatible config: %s", resume_dir, why);
        /* the data order is a pure function of (step, batch_size, data_order,
         * seed if shuffled): the saved data_pos is only where the resumed run
         * continues if these are unchanged (see docs/checkpoint.md) */
        int shuffled = !strcmp(cfg->data_order, "shuffled");
        if (cfg->batch_size != saved.batch_size || strcmp(cfg->data_order, saved.data_order) ||
            (shuffled && cfg->seed != saved.seed))
            return mt_ctx_error(ctx, MT_ERR_CONFIG,
                                "cannot resume from %s: the data position would move (batch_size %d -> %d, data_order "
                                "%s -> %s%s): keep batch_size, data_order (and seed when shuffled) as saved",
                                resume_dir, saved.batch_size, cfg->batch_size, saved.data_order, cfg->data_order,
                                shuffled && cfg->seed != saved.seed ? ", seed changed" : "");
        if (resume_meta->data_pos != (int64_t)resume_meta->step * saved.batch_size)
            return mt_ctx_error(ctx, MT_ERR_FORMAT, "cannot resume from %s: data_pos %lld is not step %d x batch_size %d",
                                resume_dir, (long long)resume_meta->data_pos, resume_meta->step, saved.batch_size);
        snprintf(rs->run_id, sizeof rs->run_id, "%s", resume_meta->run_id);   /* the run continues */
        MT_CHECK(resume_base(ctx, cfg, &saved, opts, resume_dir, resume_meta, rs));
    } else {
        MT_CHECK(mt_config_resolve(ctx, cfg, opts->steps));
        if (opts->init_from && cfg->lora_rank > 0) MT_CHECK(lora_base(ctx, opts, rs));
    }
    /* the startup contract, before any allocation; identical on every rank */
    MT_CHECK(mt_mesh_check_contract(ctx, dims, cfg, world, cfg->microbatches));
    mt_mesh_dims_set_sp(dims, cfg);   /* the layout rules read it */
    /* the pipeline cut, by hand (--pp-layers) or balanced by cost; before any allocation */
    MT_CHECK(mt_layout_pipeline_cut(ctx, cfg, dims->pp, opts->pp_layers, rs->first_layer));

    /* ---- 2. backend ---- */
    MT_CHECK(mt_ops_by_name(ctx, cfg->backend, &rs->ops));

    /* ---- 3. data (every rank opens the stream; it reads only its sequences) ---- */
    const int T = cfg->seq_len;
    MT_CHECK(mt_data_open(ctx, opts->data_path, mt_file_is_dir(opts->data_path) ? "train" : NULL, cfg->vocab_size, T,
                          &rs->train));
    mt_data_set_order(rs->train, !strcmp(cfg->data_order, "shuffled"), cfg->seed ^ 0x5eedda7aull);
    if (opts->val_path) {
        MT_CHECK(mt_data_open(ctx, opts->val_path, NULL, cfg->vocab_size, T, &rs->val));
    } else if (mt_file_is_dir(opts->data_path)) {
        if (mt_data_open(ctx, opts->data_path, "val", cfg->vocab_size, T, &rs->val) != MT_OK) {
            if (ctx->last_status == MT_ERR_IO) mt_ctx_clear_error(ctx); /* no val split: fine */
            else return ctx->last_status;
            rs->val = NULL;
        }
    }
    /* ---- 4. the plan's bytes against the memory there is, before any large allocation ---- */
    return check_memory(ctx, cfg, opts, dims, opts->resume ? opts->steps - resume_meta->step : opts->steps, rs);
}

/* The keys every rank must agree on, in one fixed order: the resolved
 * config's keys (except threads, which may differ per node), then the
 * command line's run shape, the data's identity and the build. */
#define AGREE_MAX_KEYS 256
struct agree_list {
    int         n;
    const char *names[AGREE_MAX_KEYS];
    char       *values[AGREE_MAX_KEYS];
    uint64_t    hashes[AGREE_MAX_KEYS];
};

static void agree_add(struct agree_list *l, const char *name, const char *value)
{
    if (l->n >= AGREE_MAX_KEYS) return;
    l->names[l->n] = name;
    l->values[l->n] = strdup(value ? value : "(none)");
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s=", name);
    l->hashes[l->n] = mt_comm_hash_str(tmp) ^ (mt_comm_hash_str(value ? value : "(none)") * 31u);
    l->n++;
}

/* A stream's identity: its size, files, largest token, and an xxh64-like
 * hash (FNV over the ids) of the first sequences of the first and last step
 * the run reads: the same files in another order, or another shard with the
 * same size, differ there (cheap: at most 2 x 8 sequences). */
static void agree_data(struct agree_list *l, const char *name, const struct mt_data *d, const struct mt_config *cfg,
                       int steps)
{
    char buf[192] = "(none)";
    if (d) {
        const int T = cfg->seq_len, G = cfg->batch_size;
        int32_t *inp = malloc((size_t)T * sizeof *inp), *tgt = malloc((size_t)T * sizeof *tgt);
        uint64_t h = 1469598103934665603ull;
        for (int k = 0; k < 2 && inp && tgt; k++)
            for (int64_t i = 0; i < (G < 8 ? G : 8); i++) {
                mt_data_sequence(d, k == 0 ? 0 : (steps > 0 ? steps - 1 : 0), G, i, T, inp, tgt);
                for (int t = 0; t < T; t++) h = (h ^ (uint64_t)(uint32_t)inp[t]) * 1099511628211ull;
                h = (h ^ (uint64_t)(uint32_t)tgt[T - 1]) * 1099511628211ull;
            }
        free(inp);
        free(tgt);
        snprintf(buf, sizeof buf, "%zu tokens in %d files, max token %d, first sequences %016llx", mt_data_ntokens(d),
                 mt_data_nfiles(d), mt_data_max_token(d), (unsigned long long)h);
    }
    agree_add(l, name, buf);
}

enum mt_status mt_train_setup_agree(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_train_opts *opts,
                                    const struct mt_mesh_dims *dims, const char *resume_dir,
                                    const struct mt_ckpt_meta *resume_meta, const struct run_state *rs)
{
    struct agree_list l;
    memset(&l, 0, sizeof l);
    char *js = mt_config_to_json(cfg);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (!root) return mt_ctx_error(ctx, MT_ERR_OOM, "cannot serialise the config for the ranks' agreement");
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!it->string || !strcmp(it->string, "threads")) continue;
        char *v = cJSON_PrintUnformatted(it);
        agree_add(&l, it->string, v);
        cJSON_free(v);
    }
    /* the knobs that change what a rank computes or exchanges (the test hooks may differ per rank) */
    char kname[MT_KNOB_COUNT][80];
    for (int i = 0; i < MT_KNOB_COUNT; i++) {
        const struct mt_knob_def *d = mt_knob_def((enum mt_knob_id)i);
        if (!d || d->test_only) continue;
        snprintf(kname[i], sizeof kname[i], "knob %s", d->name);
        agree_add(&l, kname[i], mt_knob_str(ctx, (enum mt_knob_id)i));
    }
    char buf[256];
    snprintf(buf, sizeof buf, "pp=%d dp=%d ep=%d tp=%d sp=%d", dims->pp, dims->dp, dims->ep, dims->tp, dims->sp);
    agree_add(&l, "--mesh", buf);
    snprintf(buf, sizeof buf, "%d", opts->zero_stage);
    agree_add(&l, "--zero", buf);
    snprintf(buf, sizeof buf, "%d", opts->steps);
    agree_add(&l, "--steps", buf);
    agree_add(&l, "--pp-layers", opts->pp_layers);
    agree_add(&l, "--out", opts->out_dir);
    agree_add(&l, "--data", opts->data_path);
    agree_add(&l, "--val-data", opts->val_path);
    agree_data(&l, "the training data", rs->train, cfg, opts->steps);
    agree_data(&l, "the validation data", rs->val, cfg, 1);
    /* a Hugging Face --init-from is imported per rank into its own temporary folder: the folder is what agrees */
    agree_add(&l, "--init-from", opts->init_from_hf ? opts->init_from_hf : opts->init_from);
    agree_add(&l, "--resume (resolved checkpoint)", resume_dir[0] ? resume_dir : NULL);
    if (resume_dir[0]) {
        snprintf(buf, sizeof buf, "step %d of run %s", resume_meta->step, resume_meta->run_id);
        agree_add(&l, "the resumed checkpoint", buf);
    }
    struct mt_build_info b;
    mt_build_info(&b);
    char bb[1024];
    snprintf(bb, sizeof bb, "%s %s %s mpi=%d cuda=%d nccl=%d", b.git, b.build_type, b.compiler, b.mpi, b.cuda, b.nccl);
    agree_add(&l, "the build", bb);
    enum mt_status rc = mt_comm_agree_keys(ctx, NULL, l.n, l.names, (const char *const *)l.values, l.hashes);
    for (int i = 0; i < l.n; i++) free(l.values[i]);
    cJSON_Delete(root);   /* owns the config's key names */
    return rc;
}

/* The mesh's communicators (collective) and this rank's place in them. On
 * the cuda backend every group also gets a device communicator (NCCL between
 * ranks, a copy through the backend within one: docs/cuda.md) for the
 * collectives on backend buffers — the ZeRO engines, TP/SP, the EP rows, the
 * pipeline; losses, norms, counts and hashes stay on the host comms. */
enum mt_status mt_train_setup_mesh(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                   const struct mt_mesh_dims *dims)
{
    const struct mt_ops_i *ops = rs->ops;
    if (!ops->host_memory) {
        /* device memory: the device the backend bound (local rank mod the
         * visible devices), not the raw local rank: with one visible device
         * per process (CUDA_VISIBLE_DEVICES, the emulator) the local rank is
         * no ordinal */
        struct mt_ops_device_info ci;
        int device = ops->device_info && ops->device_info(ops->be, &ci) == MT_OK ? ci.ordinal : mt_ops_local_rank();
        struct mt_mesh_nccl_opts no = {device, ops->queue ? ops->queue(ops->be) : NULL, ops->copy, ops->be};
        MT_CHECK(mt_mesh_create_nccl(ctx, dims, rs->cfg, opts->zero_stage, &no, &rs->mesh));
    } else
        MT_CHECK(mt_mesh_create(ctx, dims, rs->cfg, opts->zero_stage, &rs->mesh));
    rs->dpc = mt_mesh_data_expert_comm(rs->mesh);
    rs->lossc = mt_mesh_stage_comm(rs->mesh);
    rs->sumc = mt_mesh_world_comm(rs->mesh);
    rs->pp = dims->pp;
    rs->stage = mt_mesh_get_coord(rs->mesh)->pipe;
    rs->pipec = mt_mesh_device_comm(rs->mesh, MT_MESH_GROUP_PIPE);
    rs->dp_rank = mt_comm_rank(rs->dpc);
    rs->dp_size = mt_comm_size(rs->dpc);
    rs->tp = dims->tp;
    rs->tp_rank = mt_mesh_get_coord(rs->mesh)->model;
    rs->ep = dims->ep;
    return MT_OK;
}

/* Which engine each parameter joins and whether this rank counts (norm) and
 * writes (checkpoint) it: the layout module's rules. */
static void assign_engines(struct run_state *rs, const struct mt_mesh_dims *dims, const struct mt_param *params,
                           int n_params)
{
    for (int i = 0; i < n_params; i++) {
        rs->eng_of[i] = (int)mt_layout_param_engine(&params[i], dims);
        for (int k = 0; k < 3; k++) rs->sel[k][i] = rs->eng_of[i] == k;
        rs->count[i] = (unsigned char)mt_layout_param_counted(&params[i], dims, rs->tp_rank);
    }
}

/* One ZeRO engine and optimizer per reduction group. Dense: data x expert;
 * partial over the model axis: data x expert x model; experts (ep > 1):
 * data, and model too under TP (SP region). */
static enum mt_status create_engines(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                     const struct mt_mesh_dims *dims)
{
    const int wrank = mt_mesh_rank(rs->mesh), n_eng = mt_layout_n_engines(dims);
    for (int k = 0; k < n_eng; k++) {
        enum mt_mesh_group grp = mt_layout_engine_group(dims, (enum mt_layout_engine)k);
        struct mt_comm *comm = mt_mesh_device_comm(rs->mesh, grp); /* backend buffers */
        MT_CHECK(mt_zero_create(ctx, rs->ops, comm, opts->zero_stage, rs->cfg->reshard_after_forward, rs->model,
                                rs->sel[k], &rs->zset.z[k]));
        MT_ASSERT(mt_comm_rank(comm) == mt_layout_group_rank(dims, wrank, grp));
        rs->zset.n++;
        int nv;
        struct mt_param *v = mt_zero_opt_params(rs->zset.z[k], &nv);
        MT_CHECK(mt_optim_create(ctx, rs->ops, rs->cfg, v, nv, &rs->zset.opt[k]));
        if (dims->tp > 1) mt_optim_set_tp_comm(rs->zset.opt[k], mt_mesh_device_comm(rs->mesh, MT_MESH_GROUP_MODEL));
    }
    mt_zero_install_hooks(rs->model, &rs->zset);
    return MT_OK;
}

/* The parameters: every rank reads exactly the tensors it owns (resharding
 * on load) from the resume checkpoint (with the optimizer state) or from
 * --init-from (weights only, optimizer fresh); else the counter-based init. */
static enum mt_status load_params(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                  const char *resume_dir, const struct mt_ckpt_meta *resume_meta)
{
    if (!resume_dir[0] && !opts->init_from) return mt_zero_set_init_params(ctx, &rs->zset, rs->cfg->seed);
    /* LoRA from a base (docs/lora.md): the adapters take their init (B = 0),
     * the frozen base its weights from --init-from */
    const int lora_base = !resume_dir[0] && rs->cfg->lora_rank > 0;
    if (lora_base) MT_CHECK(mt_zero_set_init_params(ctx, &rs->zset, rs->cfg->seed));
    for (int k = 0; k < rs->zset.n; k++) {
        int nv;
        struct mt_param *v = mt_zero_opt_params(rs->zset.z[k], &nv);
        if (resume_dir[0]) {
            /* adapter-only: the frozen base from its checked base checkpoint */
            MT_CHECK(mt_ckpt_load_base(ctx, rs->ops, resume_dir, rs->base_hash[0] ? rs->base_load : NULL, v, nv,
                                       rs->zset.opt[k]));
            mt_optim_set_t(rs->zset.opt[k], resume_meta->optim_t);
        } else if (lora_base) {
            /* views are copies pointing at the engine's buffers: load the base ones */
            struct mt_param *b = mt_alloc(ctx, (size_t)(nv > 0 ? nv : 1) * sizeof *b, MT_BUCKET_OTHER);
            if (!b) return MT_ERR_OOM;
            int nb = 0;
            for (int i = 0; i < nv; i++)
                if (v[i].frozen) b[nb++] = v[i];
            const char *from = rs->base_load[0] ? rs->base_load : opts->init_from;   /* adapter-only: its base */
            enum mt_status st = mt_ckpt_load(ctx, rs->ops, from, b, nb, NULL);
            /* --lora-from: the adapters start from a PEFT adapter's (docs/lora.md, "Import") */
            if (st == MT_OK && opts->lora_from) {
                nb = 0;
                for (int i = 0; i < nv; i++)
                    if (!v[i].frozen) b[nb++] = v[i];
                st = mt_ckpt_load(ctx, rs->ops, opts->lora_from, b, nb, NULL);
            }
            mt_free(ctx, b);
            MT_CHECK(st);
        } else {
            MT_CHECK(mt_ckpt_load(ctx, rs->ops, opts->init_from, v, nv, NULL));
        }
    }
    return MT_OK;
}

/* The model, the pipeline's exchange buffers, the host arrays, the engines
 * and the parameters of this rank. Local failures (allocation, the
 * checkpoint load) are returned for mt_comm_agree. */
enum mt_status mt_train_setup_model(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                    const struct mt_mesh_dims *dims, int n_steps, const char *resume_dir,
                                    const struct mt_ckpt_meta *resume_meta)
{
    const struct mt_config *cfg = rs->cfg;
    const int wrank = mt_mesh_rank(rs->mesh), world = mt_comm_size(rs->sumc);
    struct mt_model_par par;
    mt_layout_model_par(cfg, dims, rs->first_layer, wrank, &par);
    par.tp_comm = dims->tp > 1 ? mt_mesh_device_comm(rs->mesh, MT_MESH_GROUP_MODEL) : NULL;
    par.ep_comm = dims->ep > 1 ? mt_mesh_device_comm(rs->mesh, MT_MESH_GROUP_EXPERT) : NULL;
    par.tp_comm_host = dims->tp > 1 ? mt_mesh_model_comm(rs->mesh) : NULL;   /* host statistics */
    par.ep_comm_host = dims->ep > 1 ? mt_mesh_expert_comm(rs->mesh) : NULL;  /* host counts */
    MT_ASSERT(par.sp == mt_mesh_get_preds(rs->mesh)->sp_on && par.tp_rank == rs->tp_rank);
    mt_train_fault_setup(ctx, rs);   /* test hook: fail the model's first allocation */
    MT_CHECK(mt_model_create_par(ctx, rs->ops, cfg, rs->Bm, MT_MODEL_EXTERNAL_PARAMS, &par, &rs->model));
    int n_params;
    struct mt_param *params = mt_model_params(rs->model, &n_params);
    if (dims->pp > 1) {
        size_t nb = mt_layout_stage_io_bytes(rs->model, cfg, dims->pp);
        rs->act_in = rs->ops->buf_alloc(rs->ops->be, ctx, nb, MT_BUCKET_COMM);
        rs->grad_in = rs->ops->buf_alloc(rs->ops->be, ctx, nb, MT_BUCKET_COMM);
        if (!rs->act_in || !rs->grad_in) return MT_ERR_OOM;
    }
    MT_CHECK(alloc_host_arrays(ctx, rs, n_params, n_steps, world));
    assign_engines(rs, dims, params, n_params);
    MT_CHECK(create_engines(ctx, rs, opts, dims));
    double t0 = mt_time_sec();
    enum mt_status rc = load_params(ctx, rs, opts, resume_dir, resume_meta);
    /* a backend that queues the init (cuda: drawn on the device) names its failure here,
     * not as the first step's non-finite numbers; the sync also ends the init's clock */
    if (rc == MT_OK) rc = mt_train_backend_status(ctx, rs->ops);
    rs->param_init_s = mt_time_sec() - t0;
    return rc;
}

/* Everything setup made, in reverse; safe on a partly set-up run. */
void mt_train_free(struct mt_ctx *ctx, struct run_state *rs)
{
    mt_train_redo_free(ctx, rs);
    mt_train_replica_log_free(ctx, rs);
    mt_free(ctx, rs->saved);
    mt_free(ctx, rs->mem_all);
    mt_free(ctx, rs->idx);
    mt_free(ctx, rs->tgt);
    mt_free(ctx, rs->step_index);
    mt_free(ctx, rs->eval_steps);
    mt_free(ctx, rs->losses);
    mt_free(ctx, rs->loss_parts);
    mt_free(ctx, rs->gnorm);
    mt_free(ctx, rs->lrs);
    mt_free(ctx, rs->times);
    mt_free(ctx, rs->eval_losses);
    mt_zero_set_destroy(ctx, &rs->zset);
    if (rs->act_in) rs->ops->buf_free(rs->ops->be, ctx, rs->act_in);
    if (rs->grad_in) rs->ops->buf_free(rs->ops->be, ctx, rs->grad_in);
    mt_free(ctx, rs->eng_of);
    mt_free(ctx, rs->sel[0]);
    mt_free(ctx, rs->sel[1]);
    mt_free(ctx, rs->sel[2]);
    mt_free(ctx, rs->imbalance);
    mt_free(ctx, rs->stage_bubble);
    mt_free(ctx, rs->load_total);
    mt_free(ctx, rs->load_step);
    mt_free(ctx, rs->count);
    mt_model_destroy(ctx, rs->model);
    mt_mesh_destroy(rs->mesh);
    mt_data_close(rs->train);
    mt_data_close(rs->val);
}
