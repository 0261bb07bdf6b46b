/*
 * mt_receipt.h — receipt.json: what actually ran (SPEC.md section 4).
 *
 * A number with no receipt does not count. The trainer fills this struct as
 * the run goes; mt_receipt_write serialises it (tmp + rename).
 */
#ifndef MT_RECEIPT_H
#define MT_RECEIPT_H

#include <stddef.h>
#include "../core/mt_core.h"
#include "../core/mt_config.h"
#include "../ops/mt_ops.h"   /* MT_OPS_PROFILE_ENTRIES */

#define MT_RECEIPT_MAX_LOSS_PARTS 8   /* >= MT_LOSS_MAX_PARTS (mt_model.h; checked in report.c) */

struct mt_receipt {
    const char *command_line;
    /* backend */
    char backend_requested[16], backend_actual[16];
    char runtime_mode[16];          /* "fp32"; cuda: the GEMM precision in force ("bf16") */
    char muon_newton_schulz[8];     /* "bf16" | "fp32" | "none" (report.c muon_mode)     */
    char fallback_reason[256];      /* "" = null */
    char blas[64], coretype[32], coretype_source[96];
    int  threads;
    /* mesh */
    int  pp, dp, ep, tp, world, zero_stage;
    const struct mt_config *cfg;
    /* geometry */
    int  micro_batch_seqs;
    /* parameters */
    size_t params_total, params_active;
    size_t params_trainable;     /* total minus the frozen base (LoRA); == total otherwise */
    double flops_per_token;
    /* memory: plan vs measured per bucket, and RSS */
    size_t plan_bytes[MT_BUCKET_COUNT];
    size_t measured_peak_bytes[MT_BUCKET_COUNT];
    size_t peak_rss_bytes;              /* VmHWM of the whole run (this rank)                    */
    size_t peak_rss_step_loop_bytes;    /* VmHWM of the step loop (restarted at its start)       */
    size_t plan_total_bytes;            /* the plan's buckets + its runtime bucket (0: no plan)  */
    /* timing */
    int    steps_run, warmup_excluded;
    double compute_s, comm_s, idle_s, total_s;
    /* time to first step (timing.startup_s): from mt_train_run's entry;
     * first_step_s / to_first_step_s < 0 when no step ran */
    struct mt_receipt_startup {
        double setup_s, param_init_s, roof_s, first_step_s, to_first_step_s;
    } startup;
    double tokens_per_s, model_flops_per_s, mfu;
    double peak_flops;
    char   peak_flops_source[1024];
    double peak_flops_lo, peak_flops_hi;   /* the roof's spread (min..max run, x world); 0 = not measured */
    char   kernels_isa[16];                /* "avx512" / "avx2": what the cpu kernels dispatched to */
    /* per-op profile of the steady steps (this rank), seconds per step by kind;
     * names[k] NULL-terminated list owned by the ops layer; n_op_kinds 0 = none */
    int         n_op_kinds;
    const char *op_kind_names[12];
    double      op_step_s[12];
    const char *op_profile_source;  /* how the kinds were timed (NULL: not said)            */
    /* the same by table entry (mt_ops_profile_entries; up to
     * MT_OPS_PROFILE_ENTRIES), seconds per steady step and calls per step */
    int         n_op_entries;
    const char *op_entry_names[MT_OPS_PROFILE_ENTRIES];
    double      op_entry_s[MT_OPS_PROFILE_ENTRIES];
    double      op_entry_calls[MT_OPS_PROFILE_ENTRIES];
    int         timing_emulated;    /* 1: the cuda backend ran under the CPU emulator: every
                                       time above is the emulator's, meaningless for a GPU */
    /* losses, one per step run (arrays owned by the trainer) */
    int     n_steps;
    const int    *step_index;
    const double *losses, *grad_norms, *lrs, *step_times;
    /* the loss parts (mt_model_loss_parts order): series "<name>_losses" after
     * "losses", part k of step i at loss_parts[i * loss_parts_stride + k];
     * and the list "loss_parts" (name, owner, weight, divided by, backward) */
    int           n_loss_parts, loss_parts_stride;
    const char   *loss_part_names[MT_RECEIPT_MAX_LOSS_PARTS];
    const char   *loss_part_owners[MT_RECEIPT_MAX_LOSS_PARTS];
    const char   *loss_part_reduce[MT_RECEIPT_MAX_LOSS_PARTS];
    double        loss_part_weights[MT_RECEIPT_MAX_LOSS_PARTS];
    int           loss_part_backward[MT_RECEIPT_MAX_LOSS_PARTS];
    const double *loss_parts;
    int     n_evals;
    const int    *eval_steps;
    const double *eval_losses;
    /* checks */
    char replica_hash_check[256];
    int  start_step;
    char resumed_from[4096];
    char run_id[24];          /* the run's id (its checkpoints carry it); "" = none */
    char data_path[4096];
    size_t data_tokens;
    /* distributed section (JSON object text built by the trainer: mesh trace,
     * per-rank memory, collectives bytes); NULL = none */
    const char *distributed_json;
    /* every knob of the table (mt_knobs.h): value, source, alias (JSON object
     * text); NULL = none */
    const char *knobs_json;
    /* cuda backend: the "gpu" object (JSON object text, report.c); NULL = none */
    const char *gpu_json;
    /* ReDo (redo_every > 0): the "redo" object (JSON object text, redo.c); NULL = none */
    const char *redo_json;
    const char *replica_checks_json; /* the periodic replica checks (replica_check_every), or NULL */
};

enum mt_status mt_receipt_write(struct mt_ctx *ctx, const char *path, const struct mt_receipt *r);

#endif /* MT_RECEIPT_H */
