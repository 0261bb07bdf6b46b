/*
 * mt_trainer.h — the training loop: data -> model -> optimizer -> checkpoint
 * -> receipt, for one rank today, shaped for the mesh (every reduction of a
 * loss, count or norm goes through one place, reduce_over_batch()).
 *
 * Order of work, so that bad input loses nothing: resolve config, open data,
 * read and verify the resume checkpoint, create model + optimizer (all before
 * any output is written); only then create OUT and train.
 */
#ifndef MT_TRAINER_H
#define MT_TRAINER_H

#include "../core/mt_core.h"
#include "../core/mt_config.h"

struct mt_ops_i;

struct mt_train_opts {
    const char *data_path;     /* --data: shard file, dir or glob (required)          */
    const char *val_path;      /* --val-data: default: the "val" split of a data dir   */
    const char *out_dir;       /* --out (required)                                    */
    const char *resume;        /* --resume: checkpoint dir or a previous OUT           */
    const char *init_from;     /* --init-from: checkpoint dir whose parameters start the run
                                * (step 0, fresh optimizer, data from the start); NULL = init.
                                * With --resume: the base of an adapter-only checkpoint */
    const char *init_from_hf;  /* init_from is a temporary import of this Hugging Face folder:
                                * the base an adapter-only LoRA checkpoint names; NULL = none */
    const char *lora_from;     /* --lora-from: a checkpoint holding the adapters that start a LoRA
                                * run from init_from (mt_peft_import of a PEFT adapter); NULL = init */
    int         steps;         /* --steps: the step to reach (0: initial ckpt only)    */
    const char *mesh;          /* --mesh, NULL = one rank                             */
    const char *pp_layers;     /* --pp-layers "n0,n1,...": layers per stage (NULL: balanced) */
    int         zero_stage;    /* --zero                                              */
    double      peak_flops;    /* --peak-flops, 0 = measure the GEMM roof at startup  */
    const char *command_line;  /* for the receipt                                     */
    int         quiet;
};

struct mt_train_result {
    int    steps_run;
    double final_loss;
    double tokens_per_s;
    double mfu;
    int    collective_started; /* 1 once ranks have met in a collective: a failure
                                * after that must bring the whole job down (mt_dist_abort) */
};

/* cfg: loaded (defaults + file + --set) but not yet resolved; resolved here
 * (vocab_size may come from DATA_DIR/meta.json). Returns MT_OK or an error
 * with a one-line message on ctx. */
enum mt_status mt_train_run(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                            struct mt_train_result *res);

/* After a backend's work: sync it and report its first recorded failure
 * (the table's status entry: the cuda entries return void and keep a sticky
 * error) as MT_ERR_RUNTIME "<name> backend: ..."; MT_OK on a table without
 * a status entry (cpu). The table itself comes from mt_ops_by_name (mt_ops.h). */
enum mt_status mt_train_backend_status(struct mt_ctx *ctx, const struct mt_ops_i *ops);

/* Bytes (bucket OTHER) of the trainer's own host arrays on a rank holding
 * n_params parameters, with microbatches of Bm sequences, running n_steps
 * steps in a world of `world` ranks: the same table mt_train_run allocates
 * from (for the planner, src/plan/plan.c). */
size_t mt_train_host_bytes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world);

#endif /* MT_TRAINER_H */
