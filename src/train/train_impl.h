/*
 * train_impl.h — the trainer's internals, shared by its files (not public).
 *
 * The training run of one rank is split by concern (docs/architecture.md,
 * "The step"):
 *   trainer.c    mt_train_run: setup, the step loop, the final checkpoint, the report
 *   setup.c      flags, config, resume metadata, data, backend (local); mesh,
 *                model, engines, parameters (collective)
 *   step.c       one training step (forward, backward, reduce, clip, update,
 *                sync) and the evaluation pass
 *   pipeline.c   the microbatches of one step: plain loop (pp = 1) or the 1F1B
 *                schedule (pp > 1)
 *   train_ckpt.c the checkpoint's entry list from the engines' and
 *                optimizers' state, keep_last
 *   report.c     the GEMM roof, the replica check, memory phases, the
 *                receipt and its distributed section
 *   test_hooks.c test-only fault injection (knob test_fault / MT_FAULT)
 */
#ifndef MT_TRAIN_IMPL_H
#define MT_TRAIN_IMPL_H

#include <stdint.h>

#include "../core/mt_config.h"
#include "../core/mt_core.h"
#include "../parallel/mt_comm.h"
#include "../parallel/mt_mesh.h"
#include "../model/mt_model.h"
#include "../ops/mt_ops.h"
#include "../io/mt_ckpt.h"
#include "../io/mt_data.h"
#include "mt_trainer.h"
#include "../parallel/mt_zero.h"

#define MEM_SLOTS (MT_BUCKET_COUNT + 2)   /* memory peaks: buckets, total, peak RSS (struct mt_train_peaks) */

/* Test-only fault injection (test_hooks.c): "RANK:STEP:KIND" from the knob
 * test_fault (env alias MT_FAULT); kind "" = none. */
struct mt_train_fault { int rank, step; char kind[16]; };

struct run_state {
    struct mt_mesh  *mesh;
    struct mt_comm  *dpc;       /* data x expert: the dense reduction group (owned by mesh) */
    struct mt_comm  *lossc;     /* data x expert x model: the group of parameters partial over model */
    struct mt_comm  *sumc;      /* the world: where loss shares and norm^2 shares meet         */
    const struct mt_ops_i *ops;
    /* pipeline: this rank's stage, the layer cut, activation exchange buffers */
    int              pp, stage, first_layer[MT_MAX_LAYERS + 1];
    struct mt_comm  *pipec;
    float           *act_in, *grad_in;   /* (Nr, D) from the previous / next stage          */
    int              in_flight_max;      /* measured: microbatches with saved activations   */
    double           pipe_busy_s, pipe_wall_s;
    double           bubble_mean, *stage_bubble, *stage_in_flight, *stage_acts; /* (pp) for the receipt */
    int              dp_rank, dp_size, tp, tp_rank;
    int              Gl, Bm;    /* sequences per data rank and step; per microbatch     */
    /* one ZeRO engine + optimizer per reduction group: [0] data x expert,
     * [1] data x expert x model (parameters partial over the model axis, tp > 1),
     * [2] data (x model under TP): the experts of this rank (ep > 1) */
    struct mt_zero_set zset;
    int               *eng_of;  /* (P) engine of parameter i                          */
    unsigned char     *sel[3];  /* (P) selection masks                                */
    int                ep;
    const struct mt_config *cfg;
    double            *imbalance; /* (steps) max/mean routed slots per expert, mean over MoE layers */
    double            *load_total; /* (L*E) routed slots per expert over the run (world) */
    double            *load_step;  /* (L*E) scratch                                      */
    unsigned char     *count;   /* (P) 0: a model-axis copy this rank does not count/write */
    double            *mem_all; /* (world * MT_BUCKET_COUNT) gathered peaks (receipt)  */
    struct mt_data  *train, *val;
    struct mt_model *model;
    int32_t *idx, *tgt;         /* (Bm, T) host */
    int     *step_index, *eval_steps;
    double  *losses, *gnorm, *lrs, *times, *eval_losses;
    double  *loss_parts;        /* (steps, MT_LOSS_MAX_PARTS) each step's loss parts (mt_model_loss_parts order) */
    int      n_evals;
    int      rss_phased;        /* the step loop's RSS peak is its own (mt_train_peak_restart) */
    double   param_init_s;      /* setup: the parameters' init or load (timing.startup_s) */
    struct mt_train_fault fault;
    /* checkpoints: the run id they carry (kept by a resume), and the steps this
     * command committed, oldest first (rank 0; keep_last prunes from these only) */
    char     run_id[MT_CKPT_RUN_ID_LEN];
    /* LoRA from a base (docs/checkpoint.md): checkpoints are adapter-only
     * and name this base (its manifest hash, absolute path: a checkpoint or
     * a Hugging Face folder); base_load is the checkpoint the base is read
     * from (the folder's import); "" = full checkpoints */
    char     base_hash[MT_CKPT_RUN_ID_LEN];
    char     base_path[4096];
    char     base_load[4096];
    int     *saved;             /* (keep_last + 1) */
    int      n_saved;
    struct mt_train_redo *redo; /* ReDo's sets and event log (redo.c); NULL until the first event */
    struct mt_train_replica_log *replica_log; /* the periodic replica checks (report.c); NULL until the first */
};

/* The periodic replica checks' results (replica_check_every), in step order. */
struct mt_train_replica_log {
    int   n, cap;
    int  *step;                 /* (cap) the step after which check i ran */
    char (*msg)[256];           /* (cap) its result, as the receipt's replica_hash_check */
};

/* What one step measured (step.c). */
struct mt_train_step_out {
    double loss;                /* world sum of the loss: the parts' sum         */
    double part[MT_LOSS_MAX_PARTS]; /* world sums of each loss part (n_part of them) */
    int    n_part;
    double grad_norm;
    double idle_s;              /* waiting for the slowest rank at the loss all-reduce */
    double imbalance;           /* MoE: busiest expert / mean, mean over MoE layers (0 dense) */
};

/* ---- setup.c ---- */
enum mt_status mt_train_setup_local(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                                    int world, struct mt_mesh_dims *dims, char *resume_dir, size_t resume_n,
                                    struct mt_ckpt_meta *resume_meta, struct run_state *rs);
int mt_train_pick_threads(const struct mt_config *cfg);
/* Every rank was given the same resolved config, mesh, data, --out, resume
 * and build (issue 33), compared with one all-gather on a world group
 * before the mesh is made; collective. MT_ERR_CONFIG naming the first
 * differing key and two ranks that differ. */
enum mt_status mt_train_setup_agree(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_train_opts *opts,
                                    const struct mt_mesh_dims *dims, const char *resume_dir,
                                    const struct mt_ckpt_meta *resume_meta, const struct run_state *rs);
enum mt_status mt_train_setup_mesh(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                   const struct mt_mesh_dims *dims);
enum mt_status mt_train_setup_model(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                    const struct mt_mesh_dims *dims, int n_steps, const char *resume_dir,
                                    const struct mt_ckpt_meta *resume_meta);
void mt_train_free(struct mt_ctx *ctx, struct run_state *rs);

/* ---- pipeline.c ---- */
enum mt_status mt_train_microbatches(struct mt_ctx *ctx, struct run_state *rs, int step,
                                     const struct mt_loss_norm *norm, double *part);
enum mt_status mt_train_stage_forward_eval(struct mt_ctx *ctx, struct run_state *rs, const struct mt_loss_norm *norm,
                                           struct mt_loss_parts *parts);

/* ---- step.c ---- */
enum mt_status mt_train_step(struct mt_ctx *ctx, struct run_state *rs, int step, struct mt_train_step_out *out);
enum mt_status mt_train_evaluate(struct mt_ctx *ctx, struct run_state *rs, double *out);
double mt_train_exposed_comm_s(const struct run_state *rs);

/* ---- train_ckpt.c ---- */
enum mt_status mt_train_save_checkpoint(struct mt_ctx *ctx, const struct mt_train_opts *opts, struct run_state *rs,
                                        int step);

/* ---- redo.c (SPEC 1e ReDo) ---- */
/* The event after the update of step `step` (from 1): scores reduced over
 * the world, units chosen, parameters and optimizer state rewritten (before
 * the ZeRO sync); logged for the receipt. */
enum mt_status mt_train_redo_event(struct mt_ctx *ctx, struct run_state *rs, int step);
char *mt_train_redo_json(const struct run_state *rs);
/* ---- report.c: the replica hash check (at the end, and every replica_check_every steps) ---- */
enum mt_status mt_train_replica_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct run_state *rs,
                                      int zero_stage, char *out, size_t n_out, int *mismatch);
enum mt_status mt_train_replica_check_step(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_opts *opts,
                                           int done);
void mt_train_replica_log_free(struct mt_ctx *ctx, struct run_state *rs);   /* receipt "redo" (malloc'ed; NULL: off) */
void mt_train_redo_free(struct mt_ctx *ctx, struct run_state *rs);

/* ---- test_hooks.c ---- */
void mt_train_fault_parse(struct mt_train_fault *f, const char *spec);
int  mt_train_fault_armed(const struct run_state *rs, int step);
void mt_train_fault_setup(struct mt_ctx *ctx, const struct run_state *rs);
enum mt_status mt_train_fault_before_step(struct mt_ctx *ctx, struct run_state *rs, int step);
enum mt_status mt_train_fault_after_update(struct mt_ctx *ctx, struct run_state *rs, int step);

/* ---- report.c ---- */
/* Memory peaks by phase (see report.c). */
struct mt_train_peaks { double b[MEM_SLOTS]; };
void mt_train_peak_fold(const struct mt_ctx *ctx, struct mt_train_peaks *acc);
void mt_train_peak_restart(struct mt_ctx *ctx, struct run_state *rs);
double mt_train_measure_gemm_roof(const struct mt_ops_i *ops, struct mt_ops_roof *roof);
/* peak_cache.c: the measured peak kept per machine (knob peak_cache). path:
 * $XDG_CACHE_HOME or $HOME/.cache + /meshtrain/peak_flops.json (0: neither
 * set). key: what the peak depends on. get: 1 and the entry's roof and
 * measurement time when a usable entry exists. put: writes it (atomically). */
int  mt_train_peak_cache_path(char *path, size_t n);
void mt_train_peak_cache_key(const char *ops_name, int threads, char *key, size_t n);
int  mt_train_peak_cache_get(const char *path, const char *key, struct mt_ops_roof *roof, char *when, size_t n);
enum mt_status mt_train_peak_cache_put(struct mt_ctx *ctx, const char *path, const char *key,
                                       const struct mt_ops_roof *roof);
void mt_train_progress(const struct mt_train_opts *opts, int tty, int step, int steps, double loss, double tok_s,
                       double mfu, double eta_s, double gnorm, const struct mt_loss_part *parts, const double *part,
                       int n_part);
struct mt_train_run_info;
/* The time-to-first-step lines: before step 1 (first_step_s < 0) the setup
 * phases, after it the step and the total from the trainer's entry (tty:
 * a newline first, ending the step's \r line). */
void mt_train_progress_startup(const struct mt_train_opts *opts, int tty, const struct mt_train_run_info *ri,
                               double first_step_s);

/* Everything the receipt needs that mt_train_run measured. */
struct mt_train_run_info {
    const struct mt_train_opts *opts;
    const struct mt_mesh_dims  *dims;
    int         world, wrank, threads, start_step, n_steps, steps_run;
    double      flops_per_token, peak, total_s, comm_total, idle_total;
    /* time to first step (timing.startup_s): t_entry = mt_train_run's entry;
     * to_first_step_s < 0 until step 1 ends */
    double      t_entry, setup_s, param_init_s, roof_s, to_first_step_s;
    struct mt_ops_roof roof;                /* the measured roof and its spread (zeros when given) */
    const char *peak_src, *trace, *resume_dir;
    struct mt_train_peaks *run_pk;          /* folded once more by the report */
    const struct mt_train_peaks *train_pk;
};
enum mt_status mt_train_report(struct mt_ctx *ctx, struct run_state *rs, const struct mt_train_run_info *ri,
                               struct mt_train_result *res);

#endif /* MT_TRAIN_IMPL_H */
