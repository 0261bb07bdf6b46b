/*
 * receipt.c — serialise struct mt_receipt to receipt.json with cJSON.
 * Written to PATH.tmp then renamed, so a reader never sees half a receipt.
 */
#define _GNU_SOURCE
#include "mt_receipt.h"
#include "../model/mt_blocks.h"   /* pattern letters: the flops convention of M layers */
#include "../model/mt_model.h"    /* mt_model_mod_rows: the routed layers */
#include "../core/mt_fileio.h"
#include "../core/mt_build.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

static cJSON *num_array(const double *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v ? v[i] : 0.0));
    return a;
}

static cJSON *bucket_object(const size_t bytes[MT_BUCKET_COUNT])
{
    cJSON *o = cJSON_CreateObject();
    size_t total = 0;
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        cJSON_AddNumberToObject(o, mt_bucket_name((enum mt_bucket)b), (double)bytes[b]);
        total += bytes[b];
    }
    cJSON_AddNumberToObject(o, "total", (double)total);
    return o;
}

/* mt_receipt_write's sections, each appended to root in the order of the
 * receipt schema (SPEC.md section 5), field by field; no logic. */

/* "build", "machine": which binary ran where (the same on every rank of one
 * launch except hostname; rank 0's) */
static void receipt_build_machine(cJSON *root)
{
    struct mt_build_info b;
    struct mt_machine_info m;
    mt_build_info(&b);
    mt_machine_info(&m);
    cJSON *bo = cJSON_AddObjectToObject(root, "build");
    cJSON_AddStringToObject(bo, "git", b.git);
    cJSON_AddStringToObject(bo, "build_type", b.build_type);
    cJSON_AddStringToObject(bo, "compiler", b.compiler);
    cJSON_AddBoolToObject(bo, "mpi", b.mpi);
    cJSON_AddBoolToObject(bo, "cuda", b.cuda);
    cJSON_AddBoolToObject(bo, "nccl", b.nccl);
    cJSON *mo = cJSON_AddObjectToObject(root, "machine");
    cJSON_AddStringToObject(mo, "hostname", m.hostname);
    cJSON_AddStringToObject(mo, "cpu_model", m.cpu_model);
    cJSON_AddNumberToObject(mo, "logical_cpus", m.logical_cpus);
    cJSON_AddStringToObject(mo, "os", m.os);
}

/* "backend", "mesh", "zero_stage" */
static void receipt_backend_mesh(cJSON *root, const struct mt_receipt *r)
{
    cJSON *be = cJSON_AddObjectToObject(root, "backend");
    cJSON_AddStringToObject(be, "requested", r->backend_requested);
    cJSON_AddStringToObject(be, "actual", r->backend_actual);
    cJSON_AddStringToObject(be, "runtime_mode", r->runtime_mode);
    cJSON_AddStringToObject(be, "muon_newton_schulz", r->muon_newton_schulz[0] ? r->muon_newton_schulz : "none");
    if (r->fallback_reason[0]) cJSON_AddStringToObject(be, "fallback_reason", r->fallback_reason);
    else cJSON_AddNullToObject(be, "fallback_reason");
    cJSON_AddStringToObject(be, "blas", r->blas);
    cJSON_AddStringToObject(be, "blas_coretype", r->coretype);
    cJSON_AddStringToObject(be, "blas_coretype_source", r->coretype_source);
    if (r->kernels_isa[0]) cJSON_AddStringToObject(be, "kernels_isa", r->kernels_isa);
    cJSON_AddNumberToObject(be, "threads_per_rank", r->threads);

    cJSON *mesh = cJSON_AddObjectToObject(root, "mesh");
    cJSON_AddNumberToObject(mesh, "world", r->world);
    cJSON_AddNumberToObject(mesh, "pp", r->pp);
    cJSON_AddNumberToObject(mesh, "dp", r->dp);
    cJSON_AddNumberToObject(mesh, "ep", r->ep);
    cJSON_AddNumberToObject(mesh, "tp", r->tp);
    cJSON *groups = cJSON_AddObjectToObject(mesh, "group_sizes");
    cJSON_AddNumberToObject(groups, "model", r->tp);
    cJSON_AddNumberToObject(groups, "expert", r->ep);
    cJSON_AddNumberToObject(groups, "data", r->dp);
    cJSON_AddNumberToObject(groups, "data_x_expert", r->dp * r->ep);
    cJSON_AddNumberToObject(groups, "pipe", r->pp);
    cJSON_AddNumberToObject(root, "zero_stage", r->zero_stage);
}

/* "config", "batch", "data", "parameters", "memory" */
static void receipt_run(cJSON *root, const struct mt_receipt *r)
{
    if (r->cfg) {
        char *cj = mt_config_to_json(r->cfg);
        cJSON *c = cj ? cJSON_Parse(cj) : NULL;
        free(cj);
        cJSON_AddItemToObject(root, "config", c ? c : cJSON_CreateNull());
        cJSON *g = cJSON_AddObjectToObject(root, "batch");
        cJSON_AddNumberToObject(g, "seq_len", r->cfg->seq_len);
        cJSON_AddNumberToObject(g, "global_batch_seqs", r->cfg->batch_size);
        cJSON_AddNumberToObject(g, "microbatches", r->cfg->microbatches);
        cJSON_AddNumberToObject(g, "micro_batch_seqs_per_rank", r->micro_batch_seqs);
        cJSON_AddNumberToObject(g, "tokens_per_step", (double)r->cfg->batch_size * r->cfg->seq_len);
    }
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(data, "path", r->data_path);
    cJSON_AddNumberToObject(data, "tokens", (double)r->data_tokens);

    cJSON *pc = cJSON_AddObjectToObject(root, "parameters");
    cJSON_AddNumberToObject(pc, "total", (double)r->params_total);
    cJSON_AddNumberToObject(pc, "active_per_token", (double)r->params_active);
    cJSON_AddNumberToObject(pc, "trainable", (double)r->params_trainable);
    cJSON_AddNumberToObject(pc, "frozen", (double)(r->params_total - r->params_trainable));

    cJSON *mem = cJSON_AddObjectToObject(root, "memory");
    cJSON_AddItemToObject(mem, "plan_bytes", bucket_object(r->plan_bytes));
    cJSON_AddItemToObject(mem, "measured_peak_bytes", bucket_object(r->measured_peak_bytes));
    cJSON_AddNumberToObject(mem, "peak_rss_bytes", (double)r->peak_rss_bytes);
    cJSON_AddNumberToObject(mem, "peak_rss_step_loop_bytes", (double)r->peak_rss_step_loop_bytes);
    cJSON_AddNumberToObject(mem, "plan_total_bytes", (double)r->plan_total_bytes);
    cJSON_AddNumberToObject(mem, "rss_step_loop_over_plan",
                            r->plan_total_bytes ? (double)r->peak_rss_step_loop_bytes / (double)r->plan_total_bytes : 0);
    cJSON_AddStringToObject(mem, "measured_how",
                            "per-bucket peak of live bytes allocated through mt_alloc; RSS from /proc VmHWM (whole "
                            "run, and the step loop alone); plan_total_bytes: the buckets + the runtime bucket");
}

/* timing.op_profile_by_entry: the kinds' time by the table entry that ran,
 * largest first ({"name": entry, "s_per_step", "calls_per_step"}; the
 * backends' prefixes mt_cuda_ / p_ dropped): which kernel a kind's time is */
static void receipt_op_entries(cJSON *t, const struct mt_receipt *r)
{
    int order[MT_OPS_PROFILE_ENTRIES], n = r->n_op_entries < MT_OPS_PROFILE_ENTRIES ? r->n_op_entries : MT_OPS_PROFILE_ENTRIES;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)   /* insertion sort by seconds, descending (n <= MT_OPS_PROFILE_ENTRIES) */
        for (int j = i; j > 0 && r->op_entry_s[order[j]] > r->op_entry_s[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    cJSON *arr = cJSON_AddArrayToObject(t, "op_profile_by_entry");
    for (int i = 0; i < n; i++) {
        const char *name = r->op_entry_names[order[i]];
        if (!strncmp(name, "mt_cuda_", 8)) name += 8;
        else if (!strncmp(name, "p_", 2)) name += 2;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", name);
        cJSON_AddNumberToObject(e, "s_per_step", r->op_entry_s[order[i]]);
        cJSON_AddNumberToObject(e, "calls_per_step", r->op_entry_calls[order[i]]);
        cJSON_AddItemToArray(arr, e);
    }
}

/* "timing": step time split, FLOPs, MFU and its roof, the op profile */
static void receipt_timing(cJSON *root, const struct mt_receipt *r)
{
    cJSON *t = cJSON_AddObjectToObject(root, "timing");
    cJSON_AddNumberToObject(t, "start_step", r->start_step);
    cJSON_AddNumberToObject(t, "steps_run", r->steps_run);
    cJSON_AddNumberToObject(t, "warmup_steps_excluded", r->warmup_excluded);
    cJSON_AddNumberToObject(t, "total_s", r->total_s);
    cJSON *split = cJSON_AddObjectToObject(t, "step_time_split_s");
    cJSON_AddNumberToObject(split, "compute", r->compute_s);
    cJSON_AddNumberToObject(split, "communication", r->comm_s);
    cJSON_AddNumberToObject(split, "idle", r->idle_s);
    cJSON_AddNumberToObject(t, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(t, "flops_per_token", r->flops_per_token);
    /* M (Mamba-3) layers add their scan, counted as its recurrence (mamba.c);
     * LoRA counts the frozen base's backward for activations only (docs/lora.md) */
    {
        const int lora = r->cfg && r->cfg->lora_rank > 0, hybrid = r->cfg && mt_blocks_pattern_uses(r->cfg, "mamba");
        char conv[512];
        snprintf(conv, sizeof conv, "%s + 12 x T x H x head_dim per attention layer%s",
                 lora ? "LoRA: 4 x the frozen base's matmul parameters active per token (forward + backward for "
                        "activations; incl. lm_head, excl. embedding lookup) + 6 x the adapters' active per token"
                      : "6 x matmul parameters active per token (incl. lm_head, excl. embedding lookup)",
                 hybrid ? " + 24 x nheads x headdim x d_state per M layer" : "");
        cJSON_AddStringToObject(t, "flops_convention", conv);
    }
    cJSON_AddNumberToObject(t, "model_flops_per_s", r->model_flops_per_s);
    cJSON_AddNumberToObject(t, "mfu", r->mfu);
    cJSON_AddNumberToObject(t, "peak_flops", r->peak_flops);
    cJSON_AddStringToObject(t, "peak_flops_source", r->peak_flops_source);
    if (r->peak_flops_hi > 0) {
        cJSON *sp = cJSON_AddObjectToObject(t, "peak_flops_spread");
        cJSON_AddNumberToObject(sp, "min", r->peak_flops_lo);
        cJSON_AddNumberToObject(sp, "max", r->peak_flops_hi);
    }
    if (r->n_op_kinds > 0) {
        /* seconds per steady step by op kind; "other" = the step's time not in any op
         * (host code, framework, waits), so the kinds sum to the step time */
        cJSON *op = cJSON_AddObjectToObject(t, "op_profile_s_per_step");
        double sum = 0, step = r->tokens_per_s > 0 && r->cfg
                                   ? (double)r->cfg->batch_size * r->cfg->seq_len / r->tokens_per_s : 0;
        for (int k = 0; k < r->n_op_kinds && k < 12; k++) {
            cJSON_AddNumberToObject(op, r->op_kind_names[k], r->op_step_s[k]);
            sum += r->op_step_s[k];
        }
        cJSON_AddNumberToObject(op, "other", step - sum);
        cJSON_AddNumberToObject(op, "step", step);
        if (r->op_profile_source) cJSON_AddStringToObject(t, "op_profile_source", r->op_profile_source);
        receipt_op_entries(t, r);
    }
    if (r->timing_emulated) cJSON_AddBoolToObject(t, "timing_emulated", 1);
    cJSON_AddItemToObject(t, "step_times_s", num_array(r->step_times, r->n_steps));
}

/* "mod": the Mixture-of-Depths routed layers (none: no object). The
 * selection is exact: each routed layer runs C of every T tokens, the
 * selected share C/T by construction. */
static void receipt_mod(cJSON *root, const struct mt_config *cfg)
{
    if (!cfg) return;
    cJSON *layers = NULL;
    int C = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const int c = mt_model_mod_rows(cfg, l);
        if (!c) continue;
        if (!layers) layers = cJSON_CreateArray();
        cJSON_AddItemToArray(layers, cJSON_CreateNumber(l));
        C = c;
    }
    if (!layers) return;
    cJSON *m = cJSON_AddObjectToObject(root, "mod");
    cJSON_AddNumberToObject(m, "capacity", cfg->mod_capacity);
    cJSON_AddNumberToObject(m, "rows_per_sequence", C);
    cJSON_AddNumberToObject(m, "seq_len", cfg->seq_len);
    cJSON_AddNumberToObject(m, "selected_share", (double)C / cfg->seq_len);
    cJSON_AddItemToObject(m, "routed_layers", layers);
    cJSON_AddStringToObject(m, "note", "per sequence the C = ceil(capacity seq_len) tokens with the largest router "
                                       "score run each routed layer (ties to the lower position); their router "
                                       "BCE is the loss part mod_aux");
}

/* per-step series, evaluations, replica check, resume and run id */
static void receipt_series(cJSON *root, const struct mt_receipt *r)
{
    cJSON *steps = cJSON_CreateArray();
    for (int i = 0; i < r->n_steps; i++) cJSON_AddItemToArray(steps, cJSON_CreateNumber(r->step_index[i]));
    cJSON_AddItemToObject(root, "steps", steps);
    cJSON_AddItemToObject(root, "losses", num_array(r->losses, r->n_steps));
    for (int k = 0; k < r->n_loss_parts; k++) {   /* "lm_losses", "aux_losses", "z_losses", ... */
        char key[64];
        snprintf(key, sizeof key, "%s_losses", r->loss_part_names[k]);
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < r->n_steps; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(r->loss_parts[(size_t)i * r->loss_parts_stride + k]));
        cJSON_AddItemToObject(root, key, a);
    }
    cJSON_AddItemToObject(root, "grad_norms", num_array(r->grad_norms, r->n_steps));
    cJSON_AddItemToObject(root, "lr_factors", num_array(r->lrs, r->n_steps));
    cJSON *ev = cJSON_AddArrayToObject(root, "val_losses");
    for (int i = 0; i < r->n_evals; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "step", r->eval_steps[i]);
        cJSON_AddNumberToObject(e, "loss", r->eval_losses[i]);
        if (r->cfg)   /* how many val tokens the loss is the mean over */
            cJSON_AddNumberToObject(e, "tokens", (double)r->cfg->eval_batches * r->cfg->batch_size * r->cfg->seq_len);
        cJSON_AddItemToArray(ev, e);
    }
    cJSON_AddStringToObject(root, "replica_hash_check", r->replica_hash_check);
    if (r->resumed_from[0]) cJSON_AddStringToObject(root, "resumed_from", r->resumed_from);
    else cJSON_AddNullToObject(root, "resumed_from");
    if (r->run_id[0]) cJSON_AddStringToObject(root, "run_id", r->run_id);
    else cJSON_AddNullToObject(root, "run_id");
    /* what each "<name>_losses" series is: the loss is their sum (mt_model.h) */
    cJSON *lp = cJSON_AddArrayToObject(root, "loss_parts");
    for (int k = 0; k < r->n_loss_parts; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", r->loss_part_names[k]);
        cJSON_AddStringToObject(e, "owner", r->loss_part_owners[k]);
        cJSON_AddNumberToObject(e, "weight", r->loss_part_weights[k]);
        cJSON_AddStringToObject(e, "divided_by", r->loss_part_reduce[k]);
        cJSON_AddBoolToObject(e, "backward", r->loss_part_backward[k]);
        cJSON_AddItemToArray(lp, e);
    }
    receipt_mod(root, r->cfg);
}

/* "knobs", "gpu", "distributed": JSON texts made elsewhere */
static void receipt_attached(cJSON *root, const struct mt_receipt *r)
{
    if (r->knobs_json) {
        cJSON *k = cJSON_Parse(r->knobs_json);
        cJSON_AddItemToObject(root, "knobs", k ? k : cJSON_CreateNull());
    }
    if (r->gpu_json) {
        cJSON *g = cJSON_Parse(r->gpu_json);
        cJSON_AddItemToObject(root, "gpu", g ? g : cJSON_CreateNull());
    }
    if (r->replica_checks_json) {
        cJSON *x = cJSON_Parse(r->replica_checks_json);
        cJSON_AddItemToObject(root, "replica_checks", x ? x : cJSON_CreateNull());
    }
    if (r->redo_json) {
        cJSON *x = cJSON_Parse(r->redo_json);
        cJSON_AddItemToObject(root, "redo", x ? x : cJSON_CreateNull());
    }
    if (r->distributed_json) {
        cJSON *d = cJSON_Parse(r->distributed_json);
        cJSON_AddItemToObject(root, "distributed", d ? d : cJSON_CreateNull());
    }
}

static void add_or_null(cJSON *o, const char *key, double v)
{
    if (v >= 0) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

/* "timing.startup_s": time to first step, by phase (docs/architecture.md) */
static void receipt_startup(cJSON *root, const struct mt_receipt *r)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "timing");
    cJSON *s = t ? cJSON_AddObjectToObject(t, "startup_s") : NULL;
    if (!s) return;
    cJSON_AddNumberToObject(s, "setup", r->startup.setup_s);
    cJSON_AddNumberToObject(s, "param_init", r->startup.param_init_s);
    cJSON_AddNumberToObject(s, "roof", r->startup.roof_s);
    add_or_null(s, "first_step", r->startup.first_step_s);
    add_or_null(s, "total_to_first_step", r->startup.to_first_step_s);
    cJSON_AddStringToObject(s, "measured_how",
                            "wall clock from the trainer's entry (after command-line parsing): setup = flags, config, "
                            "data, mesh, model and engine allocation; param_init = counter-based init or checkpoint "
                            "load + parameter sync; roof = output directory + startup GEMM roof; first_step = step 1 "
                            "with its device sync; total_to_first_step = entry to the end of step 1 (>= the sum)");
}

enum mt_status mt_receipt_write(struct mt_ctx *ctx, const char *path, const struct mt_receipt *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "meshtrain_receipt_version", "1");
    cJSON_AddStringToObject(root, "command", r->command_line ? r->command_line : "");
    receipt_build_machine(root);
    receipt_backend_mesh(root, r);
    receipt_run(root, r);
    receipt_timing(root, r);
    receipt_startup(root, r);
    receipt_series(root, r);
    receipt_attached(root, r);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory serialising the receipt");
    /* a failure here is the disk's (full, quota, a directory in the way), at
     * the end of a run: a runtime failure (exit 1), and no .tmp is left */
    struct mt_file_atomic a;
    enum mt_status rc = mt_file_atomic_open(ctx, &a, path, 0, MT_ERR_RUNTIME);
    if (rc == MT_OK) rc = mt_file_atomic_commit(ctx, &a, fputs(text, a.f) >= 0 && fputc('\n', a.f) != EOF);
    free(text);
    return rc;
}
