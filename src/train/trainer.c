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
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>
#include <xxhash.h>

#include "../dist/mt_comm.h"
#include "../dist/mt_mesh.h"
#include "../model/mt_model.h"
#include "../ops/mt_ops.h"
#include "mt_ckpt.h"
#include "mt_data.h"
#include "mt_optim.h"
#include "mt_plan.h"
#include "mt_receipt.h"
#include "mt_zero.h"

#define MEM_SLOTS (MT_BUCKET_COUNT + 2)   /* memory peaks: buckets, total, peak RSS (struct peaks) */
static int rss_phased = 1;               /* the step loop's RSS peak is its own (peak_restart) */

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

/* Peak FLOP/s that MFU is measured against: the median of several square
 * sgemms of a few sizes through the same ops table the model uses (so it
 * measures the kernels the run really had), with its spread (src/ops/cpu/roof.c). */
static double measure_gemm_roof(const struct mt_ops_i *ops, struct mt_ops_roof *roof)
{
    return mt_ops_measure_roof(ops, (const int[]){768, 1536}, 2, 5, roof);
}

static int pick_threads(const struct mt_config *cfg)
{
    if (cfg->threads > 0) return cfg->threads;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e && atoi(e) > 0) return atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

struct run_state {
    struct mt_mesh  *mesh;
    struct mt_comm  *dpc;       /* data x expert: the dense reduction group (owned by mesh) */
    struct mt_comm  *lossc;     /* data x expert x model: the group of parameters partial over model */
    struct mt_comm  *sumc;      /* the world: where loss shares and norm^2 shares meet         */
    /* pipeline: this rank's stage, the layer cut, activation exchange buffers */
    int              pp, stage, first_layer[MT_MAX_LAYERS + 1];
    struct mt_comm  *pipec;
    float           *act_in, *grad_in;   /* (Nr, D) from the previous / next stage          */
    int              in_flight_max;      /* measured: microbatches with saved activations   */
    double           pipe_busy_s, pipe_wall_s;
    double           bubble_mean, *stage_bubble, *stage_in_flight, *stage_acts; /* (pp) for the receipt */
    int              dp_rank, dp_size, tp, tp_rank;
    /* one ZeRO engine + optimizer per reduction group: [0] data x expert,
     * [1] data x expert x model (parameters partial over the model axis, tp > 1),
     * [2] data (x model under TP): the experts of this rank (ep > 1) */
    struct mt_zero    *eng[3];
    struct mt_optim   *opt[3];
    int                n_eng;
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
    double  *losses, *lm, *aux, *z, *gnorm, *lrs, *times, *eval_losses;
    int      n_evals;
    /* checkpoints: the run id they carry (kept by a resume), and the steps this
     * command committed, oldest first (rank 0; keep_last prunes from these only) */
    char     run_id[MT_CKPT_RUN_ID_LEN];
    int     *saved;             /* (keep_last + 1) */
    int      n_saved;
};

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
 * batched operation (mt_comm_sendrecv_batch: every Isend/Irecv posted, one
 * wait-all), e.g. "send my output of F(i), receive the gradient for B(j)".
 */
enum { TAG_ACT = 1, TAG_GRAD = 2 };

/* one tick's P2P: any of send/recv activations/gradients (NULL = none) */
static enum mt_status pipe_tick(struct mt_ctx *ctx, struct run_state *rs, const float *send_act, float *recv_act,
                                const float *send_grad, float *recv_grad)
{
    struct mt_p2p_op ops[4];
    int n = 0;
    size_t cnt = (size_t)mt_model_stage_rows(rs->model) * (size_t)rs->cfg->d_model;
    if (send_act) ops[n++] = (struct mt_p2p_op){MT_P2P_SEND, rs->stage + 1, (void *)send_act, cnt, MT_DTYPE_F32, TAG_ACT};
    if (recv_act) ops[n++] = (struct mt_p2p_op){MT_P2P_RECV, rs->stage - 1, recv_act, cnt, MT_DTYPE_F32, TAG_ACT};
    if (send_grad) ops[n++] = (struct mt_p2p_op){MT_P2P_SEND, rs->stage - 1, (void *)send_grad, cnt, MT_DTYPE_F32, TAG_GRAD};
    if (recv_grad) ops[n++] = (struct mt_p2p_op){MT_P2P_RECV, rs->stage + 1, recv_grad, cnt, MT_DTYPE_F32, TAG_GRAD};
    if (n == 0) return MT_OK;
    return mt_comm_sendrecv_batch(ctx, rs->pipec, n, ops);
}

/* forward of the microbatch whose tokens are in rs->idx / rs->tgt (one rank or a stage) */
static enum mt_status stage_forward(struct mt_ctx *ctx, struct run_state *rs, const struct mt_loss_norm *norm,
                                    struct mt_loss_parts *parts, int eval)
{
    if (rs->pp == 1) return mt_model_forward(ctx, rs->model, rs->idx, rs->tgt, norm, parts);
    const int first = rs->stage == 0, last = rs->stage == rs->pp - 1;
    if (eval) {
        /* forward only, microbatch by microbatch: receive, run, send */
        mt_model_set_slot(rs->model, 0);
        if (!first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
        MT_CHECK(mt_model_forward_stage(ctx, rs->model, rs->idx, rs->tgt, first ? NULL : rs->act_in, norm, parts));
        if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), NULL, NULL, NULL));
        return MT_OK;
    }
    return mt_model_forward_stage(ctx, rs->model, rs->idx, rs->tgt, first ? NULL : rs->act_in, norm, parts);
}

static void load_microbatch(struct run_state *rs, const struct mt_config *cfg, int step, int mb, int Gl, int Bm)
{
    const int T = cfg->seq_len, G = cfg->batch_size;
    for (int i = 0; i < Bm; i++)
        mt_data_sequence(rs->train, step, G, (int64_t)rs->dp_rank * Gl + (int64_t)mb * Bm + i, T,
                         rs->idx + (size_t)i * T, rs->tgt + (size_t)i * T);
}

/* All microbatches of one step, forward and backward; part[3] += loss shares. */
static enum mt_status run_microbatches(struct mt_ctx *ctx, struct run_state *rs, const struct mt_config *cfg, int step,
                                       int Gl, int Bm, const struct mt_loss_norm *norm, double part[3])
{
    const int M = cfg->microbatches;
    struct mt_loss_parts parts;
    if (rs->pp == 1) {
        for (int mb = 0; mb < M; mb++) {
            load_microbatch(rs, cfg, step, mb, Gl, Bm);
            for (int k = 0; k < rs->n_eng; k++) mt_zero_set_last_microbatch(rs->eng[k], mb == M - 1);
            MT_CHECK(mt_model_forward(ctx, rs->model, rs->idx, rs->tgt, norm, &parts));
            MT_CHECK(mt_model_backward(ctx, rs->model));
            part[0] += parts.lm;
            part[1] += parts.aux;
            part[2] += parts.z;
        }
        rs->in_flight_max = 1;
        return MT_OK;
    }
    const int pp = rs->pp, s = rs->stage, first = s == 0, last = s == pp - 1;
    const int ns = mt_model_n_slots(rs->model);
    const int warm = pp - s - 1 < M ? pp - s - 1 : M, rem = M - warm;
    int in_flight = 0, fwd_next = 0, bwd_next = 0;
    double t_wall = mt_time_sec(), busy = 0;
#define FWD()                                                                          \
    do {                                                                               \
        int mb_ = fwd_next++;                                                          \
        mt_model_set_slot(rs->model, mb_ % ns);                                        \
        load_microbatch(rs, cfg, step, mb_, Gl, Bm);                                   \
        double t_ = mt_time_sec();                                                     \
        MT_CHECK(stage_forward(ctx, rs, norm, &parts, 0));                             \
        busy += mt_time_sec() - t_;                                                    \
        part[0] += parts.lm; part[1] += parts.aux; part[2] += parts.z;                 \
        if (++in_flight > rs->in_flight_max) rs->in_flight_max = in_flight;            \
    } while (0)
#define BWD()                                                                          \
    do {                                                                               \
        int mb_ = bwd_next++;                                                          \
        mt_model_set_slot(rs->model, mb_ % ns);                                        \
        for (int k_ = 0; k_ < rs->n_eng; k_++) mt_zero_set_last_microbatch(rs->eng[k_], mb_ == M - 1); \
        double t_ = mt_time_sec();                                                     \
        MT_CHECK(mt_model_backward_stage(ctx, rs->model, last ? NULL : rs->grad_in));  \
        busy += mt_time_sec() - t_;                                                    \
        in_flight--;                                                                   \
    } while (0)
    float *nul = NULL;
    for (int i = 0; i < warm; i++) {
        if (!first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
        FWD();
        if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), NULL, NULL, NULL));
    }
    if (rem > 0 && !first) MT_CHECK(pipe_tick(ctx, rs, NULL, rs->act_in, NULL, NULL));
    for (int i = 0; i < rem; i++) {
        FWD();
        /* send F's output and receive the gradient for the oldest microbatch: one batch */
        if (!last) MT_CHECK(pipe_tick(ctx, rs, mt_model_stage_output(rs->model), nul, nul, rs->grad_in));
        BWD();
        if (!first)
            MT_CHECK(pipe_tick(ctx, rs, nul, i == rem - 1 ? nul : rs->act_in, mt_model_stage_dinput(rs->model), nul));
    }
    for (int i = 0; i < warm; i++) {
        if (!last) MT_CHECK(pipe_tick(ctx, rs, nul, nul, nul, rs->grad_in));
        BWD();
        if (!first) MT_CHECK(pipe_tick(ctx, rs, nul, nul, mt_model_stage_dinput(rs->model), nul));
    }
#undef FWD
#undef BWD
    rs->pipe_busy_s += busy;
    rs->pipe_wall_s += mt_time_sec() - t_wall;
    return MT_OK;
}

/* Validation loss: eval_batches global batches of the val stream (fixed: the
 * same sequences every evaluation), forward only. Each data rank evaluates
 * its share of every batch; the sums meet in one all-reduce. */
static enum mt_status evaluate(struct mt_ctx *ctx, const struct mt_config *cfg, struct run_state *rs,
                               int Bm, double *out)
{
    int G = cfg->batch_size, T = cfg->seq_len, Gl = G / rs->dp_size;
    struct mt_loss_norm norm = {.n_targets = (double)G * T, .n_sequences = G, .n_tokens = (double)G * T};
    double sum = 0;
    for (int b = 0; b < cfg->eval_batches; b++) {
        for (int mb = 0; mb < Gl / Bm; mb++) {
            for (int i = 0; i < Bm; i++)
                mt_data_sequence(rs->val, b, G, (int64_t)rs->dp_rank * Gl + (int64_t)mb * Bm + i, T,
                                 rs->idx + (size_t)i * T, rs->tgt + (size_t)i * T);
            struct mt_loss_parts parts;
            MT_CHECK(stage_forward(ctx, rs, &norm, &parts, 1));
            sum += parts.lm;
        }
    }
    MT_CHECK(mt_comm_allreduce(ctx, rs->sumc, &sum, 1, MT_DTYPE_F64, MT_REDOP_SUM));
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


/*
 * Checkpoint save, collective over the world: the owner of each parameter
 * (and of its optimizer state) writes it, whole; rank 0 writes the manifest
 * last. The global tensor list (every parameter, then every optimizer state
 * in parameter order) is the same on every rank; a rank passes data only for
 * what it owns.
 */
static enum mt_status save_checkpoint(struct mt_ctx *ctx, const struct mt_ops_i *ops,
                                      const struct mt_config *cfg, const struct mt_train_opts *opts,
                                      struct run_state *rs, int step)
{
    char dir[4200], tok_src[2100], data_dir[2048];
    snprintf(dir, sizeof dir, "%s/ckpt/step_%06d", opts->out_dir, step);
    struct mt_ckpt_meta meta = {0};
    meta.step = step;
    snprintf(meta.run_id, sizeof meta.run_id, "%s", rs->run_id);
    /* the tokenizer travels with the checkpoint so `sample` can decode: copied
     * in (checked) before the commit and listed with its checksum */
    data_dir_of(opts->data_path, data_dir, sizeof data_dir);
    snprintf(tok_src, sizeof tok_src, "%s/tokenizer.bin", data_dir);
    if (file_exists(tok_src)) meta.tokenizer = tok_src;
    meta.data_pos = (int64_t)step * cfg->batch_size;
    meta.seed = cfg->seed;
    meta.adam_t = mt_optim_get_t(rs->opt[0]);
    mt_mesh_dims_str(mt_mesh_get_dims(rs->mesh), meta.mesh, sizeof meta.mesh);
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    int n_states = 0;
    for (int k = 0; k < rs->n_eng; k++) n_states += mt_optim_state_count(rs->opt[k]);
    /* the entry list is GLOBAL (every rank passes the same names and shapes):
     * under EP a rank holds only its experts, so the list comes from the registry */
    int ng = mt_model_registry(cfg, NULL, 0);
    struct mt_param *glob = mt_alloc(ctx, (size_t)ng * sizeof *glob, MT_BUCKET_OTHER);
    int *local = mt_alloc(ctx, (size_t)ng * sizeof(int), MT_BUCKET_OTHER);
    int n_ent = 0;
    if (glob) {
        mt_model_registry(cfg, glob, ng);
        for (int g = 0; g < ng; g++) n_ent += 1 + (glob[g].optim == MT_OPTIM_ADAMW ? 2 : 1);
    }
    struct mt_ckpt_entry *ent = mt_alloc(ctx, (size_t)(n_ent + 1) * sizeof *ent, MT_BUCKET_OTHER);
    char (*names)[160] = mt_alloc(ctx, (size_t)(n_ent + 1) * 160, MT_BUCKET_OTHER);
    struct mt_optim_state *st = mt_alloc(ctx, (size_t)(n_states + 1) * sizeof *st, MT_BUCKET_OTHER);
    if (!glob || !local || !ent || !names || !st) {
        mt_free(ctx, glob);
        mt_free(ctx, local);
        mt_free(ctx, ent);
        mt_free(ctx, names);
        mt_free(ctx, st);
        return MT_ERR_OOM;
    }
    /* both lists are in model order: match by name with one forward scan */
    for (int g = 0, i = 0; g < ng; g++) {
        local[g] = -1;
        if (i < n && !strcmp(glob[g].name, params[i].name)) local[g] = i++;
    }
    int ns_all = 0;
    for (int k = 0; k < rs->n_eng; k++)
        for (int j = 0; j < mt_optim_state_count(rs->opt[k]); j++) mt_optim_state_get(rs->opt[k], j, &st[ns_all++]);
    /* the writer of a tensor: its owner in its engine's group, and for a
     * parameter replicated over the model axis but reduced over data only,
     * model rank 0 alone. Each rank writes its box (TP: its slice). */
    int e = 0;
    for (int g = 0; g < ng; g++) {
        int i = local[g];
        struct mt_zero *z = i >= 0 ? rs->eng[rs->eng_of[i]] : NULL;
        int mine = i >= 0 && rs->count[i] && mt_zero_owner(z, i) == mt_zero_group_rank(z);
        ent[e++] = (struct mt_ckpt_entry){glob[g].name, 0, i >= 0 ? &params[i] : &glob[g],
                                          mine ? mt_zero_param_data(z, i) : NULL};
    }
    for (int g = 0; g < ng; g++) {
        int i = local[g];
        struct mt_zero *z = i >= 0 ? rs->eng[rs->eng_of[i]] : NULL;
        int mine = i >= 0 && rs->count[i] && mt_zero_owner(z, i) == mt_zero_group_rank(z);
        const char *sfx[2] = {"exp_avg", "exp_avg_sq"};
        int ns = glob[g].optim == MT_OPTIM_ADAMW ? 2 : 1;
        for (int j = 0; j < ns; j++) {
            if (ns == 2) snprintf(names[e], 160, "%s.%s", glob[g].name, sfx[j]);
            else snprintf(names[e], 160, "%s.momentum_buffer", glob[g].name);
            const float *data = NULL;
            if (mine)
                for (int k = 0; k < n_states; k++)
                    if (!strcmp(st[k].name, names[e])) { data = st[k].data; break; }
            ent[e] = (struct mt_ckpt_entry){names[e], 1, i >= 0 ? &params[i] : &glob[g], data};
            e++;
        }
    }
    enum mt_status rc = mt_ckpt_save_group(ctx, ops, mt_mesh_world_comm(rs->mesh), dir, cfg, &meta, ent, n_ent);
    mt_free(ctx, ent);
    mt_free(ctx, names);
    mt_free(ctx, st);
    mt_free(ctx, glob);
    mt_free(ctx, local);
    MT_CHECK(rc);
    /* keep_last: delete this command's oldest checkpoints beyond N (rank 0,
     * after the commit; never one it did not write, never the newest). A
     * failed deletion costs disk, not correctness: a warning, not an error. */
    if (cfg->keep_last > 0 && mt_mesh_rank(rs->mesh) == 0) {
        /* at most keep_last + 1 entries, and never more than one per step */
        size_t cap = (size_t)(cfg->keep_last < opts->steps + 1 ? cfg->keep_last : opts->steps + 1) + 1;
        if (!rs->saved) rs->saved = mt_alloc(ctx, cap * sizeof(int), MT_BUCKET_OTHER);
        if (!rs->saved) return MT_ERR_OOM;
        if (rs->n_saved == 0 || rs->saved[rs->n_saved - 1] != step) rs->saved[rs->n_saved++] = step;
        while (rs->n_saved > cfg->keep_last) {
            char old[4200];
            snprintf(old, sizeof old, "%s/ckpt/step_%06d", opts->out_dir, rs->saved[0]);
            struct mt_ctx tmp;
            mt_ctx_init(&tmp);
            if (mt_ckpt_remove(&tmp, old, rs->run_id) != MT_OK)
                fprintf(stderr, "meshtrain train: warning: keep_last: %s\n", mt_ctx_last_error(&tmp));
            mt_ctx_free(&tmp);
            memmove(rs->saved, rs->saved + 1, (size_t)--rs->n_saved * sizeof(int));
        }
    }
    return MT_OK;
}

/* Replica check: every rank hashes (xxh64) each parameter it holds in full
 * (its TP slice for a split one); the hashes meet over the world and every
 * pair of ranks that hold the same slice must agree bit for bit: a split
 * parameter across its data group, a replicated one across data and model.
 * ZeRO-3 holds one copy of each parameter: nothing to compare. */
static enum mt_status replica_hash_check(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct run_state *rs,
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
    if (zero_stage == 3) {
        snprintf(out, n_out, "not applicable: ZeRO-3 keeps one copy of every parameter");
        return MT_OK;
    }
    /* hashes indexed by the GLOBAL registry: under PP / EP ranks hold different
     * parameter lists; 0 marks "not held here" */
    int ng = mt_model_registry(rs->cfg, NULL, 0);
    size_t maxn = 1;
    for (int i = 0; i < n; i++) if (params[i].numel > maxn) maxn = params[i].numel;
    float *host = mt_alloc(ctx, maxn * sizeof(float), MT_BUCKET_WORKSPACE);
    int64_t *h = mt_alloc(ctx, (size_t)ng * (size_t)(W + 1) * sizeof(int64_t), MT_BUCKET_OTHER);
    struct mt_param *glob = mt_alloc(ctx, (size_t)ng * sizeof *glob, MT_BUCKET_OTHER);
    if (!host || !h || !glob) { mt_free(ctx, host); mt_free(ctx, h); mt_free(ctx, glob); return MT_ERR_OOM; }
    mt_model_registry(rs->cfg, glob, ng);
    int64_t *all = h + ng;
    for (int g = 0, i = 0; g < ng; g++) {
        h[g] = 0;
        if (i < n && !strcmp(glob[g].name, params[i].name)) {
            ops->copy_to_host(host, mt_zero_param_data(rs->eng[rs->eng_of[i]], i), params[i].numel * sizeof(float));
            h[g] = (int64_t)(XXH64(host, params[i].numel * sizeof(float), 0) | 1);   /* never 0 */
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
            /* a TP-split parameter: a slice per model rank, compared along data only */
            int split = glob[g].split != MT_SPLIT_NONE && d->tp > 1;
            for (int a = 0; a < W; a++)
                for (int b = a + 1; b < W; b++) {
                    if (!all[(size_t)a * ng + g] || !all[(size_t)b * ng + g]) continue;
                    struct mt_mesh_coord ca, cb;
                    mt_mesh_coord_of(d, a, &ca);
                    mt_mesh_coord_of(d, b, &cb);
                    if (split && ca.model != cb.model) continue;
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
            int split = glob[bad].split != MT_SPLIT_NONE && d->tp > 1;
            for (int a = 0; a < W && first < 0; a++) {
                if (!all[(size_t)a * ng + bad]) continue;
                struct mt_mesh_coord ca;
                mt_mesh_coord_of(d, a, &ca);
                for (int b = a + 1; b < W; b++) {
                    struct mt_mesh_coord cb;
                    mt_mesh_coord_of(d, b, &cb);
                    if (!all[(size_t)b * ng + bad] || (split && ca.model != cb.model)) continue;
                    if (all[(size_t)b * ng + bad] == all[(size_t)a * ng + bad]) continue;
                    if (first < 0) first = a;
                    if (at < sizeof who) at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", at ? "," : "", b);
                }
            }
            snprintf(out, n_out, "MISMATCH: %s differs: ranks %s vs rank %d (%d of %d rank pairs compared differ)",
                     glob[bad].name, who, first, n_bad, pairs);
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

/* Test-only fault injection: MT_FAULT="RANK:STEP:KIND", KIND one of
 * nan (poison a gradient before its reduction), error (the rank returns a
 * runtime error), signal (the rank kills itself with SIGKILL), stop (the rank
 * stops itself with SIGSTOP), oom (STEP ignored: the rank's first model
 * allocation fails during setup). */
struct fault { int rank, step; char kind[16]; };

static void fault_parse(struct fault *f)
{
    f->rank = f->step = -1;
    f->kind[0] = 0;
    const char *e = getenv("MT_FAULT");
    if (e) sscanf(e, "%d:%d:%15s", &f->rank, &f->step, f->kind);
}

/* MT_FAULT kind "replica": after the step's update, move element 0 of the
 * last RMSNorm gain this rank holds (a tensor replicated over data and model)
 * by one ulp, so that exactly this rank's copy differs from its replicas.
 * The replica check at the end of the run must name it; it runs once, so the
 * copy must survive to the end: the last step, or any step under ZeRO-0
 * (ZeRO-1/2 overwrite a non-owner's copy at the next all-gather). */
static enum mt_status fault_perturb_replica(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct run_state *rs,
                                            int step)
{
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    for (int i = n - 1; i >= 0; i--) {
        float *d = (float *)mt_zero_param_data(rs->eng[rs->eng_of[i]], i);
        if (params[i].role != MT_ROLE_GAIN || !d) continue;
        float v;
        ops->copy_to_host(&v, d, sizeof v);
        v = nextafterf(v, INFINITY);
        ops->copy_from_host(d, &v, sizeof v);
        fprintf(stderr, "MT_FAULT: rank %d moved %s[0] by one ulp after step %d\n", ctx->rank, params[i].name, step);
        return MT_OK;
    }
    return mt_ctx_error(ctx, MT_ERR_RUNTIME, "MT_FAULT replica: rank %d holds no gain to perturb", ctx->rank);
}

/* A JSON text of the distributed section of the receipt (malloc'ed). */
static char *dist_json(const struct run_state *rs, const char *trace, const double *mem_all, int world,
                       const struct mt_zero_stats *zs, int steps, int microbatches, double param_bytes, int stage,
                       int reshard, const struct mt_plan *plan, const char *plan_err)
{
    const int NB = MEM_SLOTS;   /* buckets + total + RSS, twice per rank: whole run, step loop */
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "trace_rank0", trace);
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
    /* the planner's prediction of every rank next to what the rank measured */
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
    cJSON_AddBoolToObject(mp, "rss_phased", rss_phased);
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
    /* bytes per step (rank 0), measured next to the analytic figure */
    static const char *kinds[MT_ZERO_COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather"};
    double an[MT_ZERO_COLL_COUNT] = {0, 0, 0};
    int single = rs->dp_size == 1;
    if (!single) {
        if (stage <= 1) an[MT_ZERO_ALLREDUCE] = param_bytes;
        if (stage >= 1 && stage <= 2) an[MT_ZERO_ALLGATHER] = param_bytes;
        if (stage >= 2) an[MT_ZERO_REDUCE_SCATTER] = param_bytes * microbatches;
    }
    if (stage == 3 && !single)   /* forward + backward per microbatch (an upper bound), or once per step */
        an[MT_ZERO_ALLGATHER] = reshard ? param_bytes * (2.0 * microbatches) : param_bytes;
    cJSON *c = cJSON_AddObjectToObject(d, "collective_bytes_per_step");
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
    cJSON_AddNumberToObject(d, "parameter_bytes", param_bytes);
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
    cJSON_AddNumberToObject(tpj, "comm_s_total", tps.time_s);
    cJSON_AddStringToObject(tpj, "note", "model-axis collectives inside the layers (rank 0), blocking: all exposed; "
                                         "counted in timing.step_time_split_s.communication; steps = steps run "
                                         "(evaluation passes included)");
    if (rs->imbalance) {
        const struct mt_config *cfg = rs->cfg;
        cJSON *mo = cJSON_AddObjectToObject(d, "moe");
        cJSON *hist = cJSON_AddArrayToObject(mo, "tokens_per_expert_total");
        for (int l = 0; l < cfg->n_layer; l++) {
            if (cfg->pattern[l] != 'E') continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", l);
            cJSON *arr = cJSON_AddArrayToObject(o, "slots");
            for (int e = 0; e < cfg->n_experts; e++)
                cJSON_AddItemToArray(arr, cJSON_CreateNumber(rs->load_total[(size_t)l * cfg->n_experts + e]));
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
    if (rs->pp > 1) {
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
    cJSON *tun = cJSON_AddObjectToObject(d, "tunables");
    cJSON_AddNumberToObject(tun, "MT_ZERO_OVERLAP", mt_zero_overlap(rs->eng[0]));
    cJSON_AddNumberToObject(d, "exposed_comm_s_total", zs->wait_s);
    char *txt = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    return txt;
}

/*
 * The trainer's own host arrays (bucket OTHER) live through the whole run.
 * They are listed in ONE table, which both allocates them (alloc_host_arrays)
 * and sizes them for the planner (mt_train_host_bytes), so the two agree.
 */
struct host_array { void **ptr; size_t bytes; };

static int host_arrays(struct run_state *rs, const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world,
                       struct host_array *a)
{
    const size_t nh = (size_t)(n_steps > 0 ? n_steps : 1), P = (size_t)n_params, T = (size_t)cfg->seq_len;
    const size_t LE = (size_t)cfg->n_layer * (size_t)(cfg->n_experts > 0 ? cfg->n_experts : 1);
    int n = 0;
    a[n++] = (struct host_array){(void **)&rs->eng_of, P * sizeof(int)};
    for (int k = 0; k < 3; k++) a[n++] = (struct host_array){(void **)&rs->sel[k], P};
    a[n++] = (struct host_array){(void **)&rs->count, P};
    a[n++] = (struct host_array){(void **)&rs->idx, (size_t)Bm * T * sizeof(int32_t)};
    a[n++] = (struct host_array){(void **)&rs->tgt, (size_t)Bm * T * sizeof(int32_t)};
    a[n++] = (struct host_array){(void **)&rs->step_index, nh * sizeof(int)};
    a[n++] = (struct host_array){(void **)&rs->eval_steps, (nh + 1) * sizeof(int)};
    double **per_step[] = {&rs->losses, &rs->lm, &rs->aux, &rs->z, &rs->gnorm, &rs->lrs, &rs->times};
    for (size_t k = 0; k < sizeof per_step / sizeof per_step[0]; k++)
        a[n++] = (struct host_array){(void **)per_step[k], nh * sizeof(double)};
    a[n++] = (struct host_array){(void **)&rs->eval_losses, (nh + 1) * sizeof(double)};
    a[n++] = (struct host_array){(void **)&rs->mem_all, (size_t)world * 2 * MEM_SLOTS * sizeof(double)};
    if (strchr(cfg->pattern, 'E')) {
        a[n++] = (struct host_array){(void **)&rs->imbalance, nh * sizeof(double)};
        a[n++] = (struct host_array){(void **)&rs->load_total, LE * sizeof(double)};
        a[n++] = (struct host_array){(void **)&rs->load_step, LE * sizeof(double)};
    }
    return n;
}
#define MAX_HOST_ARRAYS 32

static enum mt_status alloc_host_arrays(struct mt_ctx *ctx, struct run_state *rs, const struct mt_config *cfg,
                                        int n_params, int Bm, int n_steps, int world)
{
    struct host_array a[MAX_HOST_ARRAYS];
    memset(a, 0, sizeof a);
    int n = host_arrays(rs, cfg, n_params, Bm, n_steps, world, a);
    for (int i = 0; i < n; i++)
        if (!(*a[i].ptr = mt_alloc(ctx, a[i].bytes, MT_BUCKET_OTHER))) return MT_ERR_OOM;
    return MT_OK;
}

size_t mt_train_host_bytes(const struct mt_config *cfg, int n_params, int Bm, int n_steps, int world)
{
    struct run_state dummy;
    struct host_array a[MAX_HOST_ARRAYS];
    memset(a, 0, sizeof a);
    int n = host_arrays(&dummy, cfg, n_params, Bm, n_steps, world, a);
    size_t b = 0;
    for (int i = 0; i < n; i++) b += a[i].bytes;
    return b;
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
struct peaks { double b[MEM_SLOTS]; };

static void peak_fold(const struct mt_ctx *ctx, struct peaks *acc)
{
    for (int b = 0; b < MT_BUCKET_COUNT; b++)
        if ((double)ctx->bytes_peak[b] > acc->b[b]) acc->b[b] = (double)ctx->bytes_peak[b];
    if ((double)ctx->bytes_peak_total > acc->b[MT_BUCKET_COUNT]) acc->b[MT_BUCKET_COUNT] = (double)ctx->bytes_peak_total;
    double rss = (double)mt_peak_rss_bytes();
    if (rss > acc->b[MT_BUCKET_COUNT + 1]) acc->b[MT_BUCKET_COUNT + 1] = rss;
}

static void peak_restart(struct mt_ctx *ctx)
{
    for (int b = 0; b < MT_BUCKET_COUNT; b++) ctx->bytes_peak[b] = ctx->bytes_live[b];
    ctx->bytes_peak_total = ctx->bytes_live_total;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    FILE *f = fopen("/proc/self/clear_refs", "w");
    int ok = f && fputs("5", f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) rss_phased = 0;
}

/* Seconds spent blocked in communication so far (cumulative): ZeRO waits and
 * blocking collectives, the model axis's collectives, the expert all-to-alls.
 * The step's exposed communication is the difference across the step. */
static double exposed_comm_s(const struct run_state *rs)
{
    double s = 0;
    for (int k = 0; k < rs->n_eng; k++) {
        struct mt_zero_stats zs;
        mt_zero_get_stats(rs->eng[k], &zs);
        s += zs.wait_s;
    }
    struct mt_tp_stats tps;
    mt_model_tp_stats(rs->model, &tps);
    struct mt_ep_stats eps;
    mt_model_ep_stats(rs->model, &eps);
    return s + tps.time_s + eps.a2a_s;
}

/* Setup steps 1-3 of one rank, with no collective: flags, mesh shape,
 * config (and the resume checkpoint's metadata), startup contract, pipeline
 * cut, backend, data. Its status goes to mt_comm_agree: a rank that fails here
 * alone must not leave the others waiting in the first collective. Opened
 * streams are in rs (closed by the caller). */
static enum mt_status setup_local(struct mt_ctx *ctx, struct mt_config *cfg, const struct mt_train_opts *opts,
                                  int world, struct mt_mesh_dims *dims, char *resume_dir, size_t resume_n,
                                  struct mt_ckpt_meta *resume_meta, struct run_state *rs,
                                  const struct mt_ops_i **ops)
{
    if (!opts->data_path) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--data is required");
    if (!opts->out_dir) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--out is required");
    if (opts->steps < 0) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--steps must be >= 0 (got %d)", opts->steps);
    if (opts->zero_stage < 0 || opts->zero_stage > 3)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--zero must be 0, 1, 2 or 3 (got %d)", opts->zero_stage);
    /* the mesh: parsed against the world size without any collective */
    MT_CHECK(mt_mesh_parse(ctx, opts->mesh, world, dims));

    /* ---- 1. config (vocab may come from the data dir) ---- */
    MT_CHECK(resolve_vocab(ctx, cfg, opts->data_path));
    if (opts->resume && opts->init_from)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--resume and --init-from exclude each other");
    if (opts->resume) {
        /* latest of the run, or its previous intact checkpoint (said on stderr) */
        char note[2048];
        MT_CHECK(mt_ckpt_resolve(ctx, opts->resume, resume_dir, resume_n, note, sizeof note));
        if (note[0] && ctx->rank == 0) fprintf(stderr, "meshtrain train: warning: %s\n", note);
        struct mt_config saved;
        mt_config_defaults(&saved);
        MT_CHECK(mt_ckpt_read_meta(ctx, resume_dir, &saved, resume_meta));
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
    } else {
        MT_CHECK(mt_config_resolve(ctx, cfg, opts->steps));
    }
    /* the startup contract, before any allocation; identical on every rank */
    MT_CHECK(mt_mesh_check_contract(ctx, dims, cfg, world, cfg->microbatches));
    /* the pipeline cut, by hand (--pp-layers) or balanced by cost; before any allocation */
    MT_CHECK(mt_plan_pipeline_cut(ctx, cfg, dims->pp, opts->pp_layers, rs->first_layer));

    /* ---- 2. backend ---- */
    if (!strcmp(cfg->backend, "cuda")) {
        char why[200] = "";
        *ops = mt_ops_cuda(why, sizeof why);
        if (!*ops)
            return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend 'cuda' is not available: %s (use backend=cpu)", why);
    } else {
        *ops = mt_ops_cpu();
    }

    /* ---- 3. data (every rank opens the stream; it reads only its sequences) ---- */
    const int T = cfg->seq_len;
    MT_CHECK(mt_data_open(ctx, opts->data_path, is_dir(opts->data_path) ? "train" : NULL, cfg->vocab_size, T,
                          &rs->train));
    mt_data_set_order(rs->train, !strcmp(cfg->data_order, "shuffled"), cfg->seed ^ 0x5eedda7aull);
    if (opts->val_path) {
        MT_CHECK(mt_data_open(ctx, opts->val_path, NULL, cfg->vocab_size, T, &rs->val));
    } else if (is_dir(opts->data_path)) {
        if (mt_data_open(ctx, opts->data_path, "val", cfg->vocab_size, T, &rs->val) != MT_OK) {
            if (ctx->last_status == MT_ERR_IO) mt_ctx_clear_error(ctx); /* no val split: fine */
            else return ctx->last_status;
            rs->val = NULL;
        }
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
    char resume_dir[4096] = "";
    struct mt_ckpt_meta resume_meta;
    memset(&resume_meta, 0, sizeof resume_meta);
    char *djson = NULL;
    int out_lock = -1;   /* OUT/.lock, held by rank 0 from stage 5 to the end */
    struct fault fault;
    fault_parse(&fault);

    /* the mesh: parsed against the world size without any collective */
    int world, wrank;
    mt_comm_world_info(&world, &wrank);
    ctx->rank = wrank;
    struct mt_mesh_dims dims;
    const struct mt_ops_i *ops = NULL;
    rc = setup_local(ctx, cfg, opts, world, &dims, resume_dir, sizeof resume_dir, &resume_meta, &rs, &ops);
    MT_CHECK_GOTO(mt_comm_agree(ctx, NULL, rc, "setup (flags, config, resume, data)"), rc, done);
    char fallback[256] = "";
    int threads = pick_threads(cfg);
    mt_ops_cpu_set_threads(threads);
    const int T = cfg->seq_len, G = cfg->batch_size;
    const int n_dp = dims.dp * dims.ep, Gl = G / n_dp, Bm = Gl / cfg->microbatches;

    /* ---- 4. mesh (collective), model, ZeRO engine, optimizer, state ---- */
    res->collective_started = world > 1; /* mt_mesh_create is collective: a failure inside it aborts */
    MT_CHECK_GOTO(mt_mesh_create(ctx, &dims, cfg, opts->zero_stage, &rs.mesh), rc, done);
    rs.dpc = mt_mesh_data_expert_comm(rs.mesh);
    rs.lossc = mt_mesh_stage_comm(rs.mesh);
    rs.sumc = mt_mesh_world_comm(rs.mesh);
    rs.pp = dims.pp;
    rs.stage = mt_mesh_get_coord(rs.mesh)->pipe;
    rs.pipec = mt_mesh_pipe_comm(rs.mesh);
    rs.dp_rank = mt_comm_rank(rs.dpc);
    rs.dp_size = mt_comm_size(rs.dpc);
    rs.tp = dims.tp;
    rs.tp_rank = mt_mesh_get_coord(rs.mesh)->model;
    char trace[4096];
    mt_mesh_trace_line(rs.mesh, trace, sizeof trace);
    printf("%s\n", trace);   /* the step-0 trace: one line per rank, whatever --quiet says */
    fflush(stdout);

    struct mt_model_par par;
    mt_plan_model_par(cfg, &dims, rs.first_layer, wrank, &par);
    par.tp_comm = dims.tp > 1 ? mt_mesh_model_comm(rs.mesh) : NULL;
    par.ep_comm = dims.ep > 1 ? mt_mesh_expert_comm(rs.mesh) : NULL;
    MT_ASSERT(par.sp == mt_mesh_get_preds(rs.mesh)->sp_on && par.tp_rank == rs.tp_rank);
    rs.ep = dims.ep;
    rs.cfg = cfg;
    int start_step = resume_dir[0] ? resume_meta.step : 0;
    int n_steps = opts->steps - start_step;
    if (fault.rank == wrank && !strcmp(fault.kind, "oom")) ctx->fail_after = 1; /* test: the model's first allocation */
    MT_CHECK_GOTO(mt_model_create_par(ctx, ops, cfg, Bm, MT_MODEL_EXTERNAL_PARAMS, &par, &rs.model), rc, agree2);
    int n_params;
    struct mt_param *params = mt_model_params(rs.model, &n_params);
    if (dims.pp > 1) {
        size_t nb = mt_plan_stage_io_bytes(rs.model, cfg, dims.pp);
        rs.act_in = ops->buf_alloc(ctx, nb, MT_BUCKET_COMM);
        rs.grad_in = ops->buf_alloc(ctx, nb, MT_BUCKET_COMM);
        if (!rs.act_in || !rs.grad_in) { rc = MT_ERR_OOM; goto agree2; }
    }
    MT_CHECK_GOTO(alloc_host_arrays(ctx, &rs, cfg, n_params, Bm, n_steps, world), rc, agree2);
    for (int i = 0; i < n_params; i++) {
        rs.eng_of[i] = (int)mt_plan_param_engine(&params[i], &dims);
        rs.sel[0][i] = rs.eng_of[i] == MT_PLAN_ENGINE_DENSE;
        rs.sel[1][i] = rs.eng_of[i] == MT_PLAN_ENGINE_PARTIAL;
        rs.sel[2][i] = rs.eng_of[i] == MT_PLAN_ENGINE_EXPERT;
        /* replicated over the model axis yet reduced over data only: identical on
         * every model rank, so counted (norm) and written (checkpoint) by model rank 0 */
        rs.count[i] = !(dims.tp > 1 && rs.eng_of[i] == MT_PLAN_ENGINE_DENSE && params[i].split == MT_SPLIT_NONE &&
                        rs.tp_rank != 0);
    }
    rs.n_eng = mt_plan_n_engines(&dims);
    /* dense: data x expert; partial over the model axis: data x expert x model;
     * experts (ep > 1): data, and model too under TP (SP region) */
    struct mt_comm *groups[3];
    for (int k = 0; k < 3; k++) groups[k] = mt_mesh_comm(rs.mesh, mt_plan_engine_group(&dims, (enum mt_plan_engine)k));
    for (int k = 0; k < rs.n_eng; k++) {
        MT_CHECK_GOTO(mt_zero_create(ctx, ops, groups[k], opts->zero_stage, cfg->reshard_after_forward, rs.model,
                                     rs.sel[k], &rs.eng[k]), rc, agree2);
        MT_ASSERT(mt_comm_rank(groups[k]) == mt_plan_group_rank(&dims, wrank, mt_plan_engine_group(&dims, (enum mt_plan_engine)k)));
        rs.zset.z[rs.zset.n++] = rs.eng[k];
        int nv;
        struct mt_param *v = mt_zero_opt_params(rs.eng[k], &nv);
        MT_CHECK_GOTO(mt_optim_create(ctx, ops, cfg, v, nv, &rs.opt[k]), rc, agree2);
        if (dims.tp > 1) mt_optim_set_tp_comm(rs.opt[k], mt_mesh_model_comm(rs.mesh));
    }
    mt_zero_install_hooks(rs.model, &rs.zset);
    if (resume_dir[0]) {
        /* every rank reads exactly the tensors it owns: resharding on load */
        for (int k = 0; k < rs.n_eng; k++) {
            int nv;
            struct mt_param *v = mt_zero_opt_params(rs.eng[k], &nv);
            MT_CHECK_GOTO(mt_ckpt_load(ctx, ops, resume_dir, v, nv, rs.opt[k]), rc, agree2);
            mt_optim_set_t(rs.opt[k], resume_meta.adam_t);
        }
    } else if (opts->init_from) {
        /* weights only: each rank reads the parameters it owns; optimizer fresh */
        for (int k = 0; k < rs.n_eng; k++) {
            int nv;
            struct mt_param *v = mt_zero_opt_params(rs.eng[k], &nv);
            MT_CHECK_GOTO(mt_ckpt_load(ctx, ops, opts->init_from, v, nv, NULL), rc, agree2);
        }
    } else {
        for (int k = 0; k < rs.n_eng; k++) MT_CHECK_GOTO(mt_zero_init_params(ctx, rs.eng[k], cfg->seed), rc, agree2);
    }
agree2:
    /* allocation and the checkpoint load are local too: agree before the
     * parameters are first exchanged; a failure ends every rank in order */
    if ((rc = mt_comm_agree(ctx, rs.sumc, rc, "setup (allocation, checkpoint load)")) != MT_OK) {
        if (rc != MT_ERR_COMM) res->collective_started = 0; /* agreed: no abort (a broken comm still aborts) */
        goto done;
    }
    if (resume_dir[0] || opts->init_from)
        for (int k = 0; k < rs.n_eng; k++) MT_CHECK_GOTO(mt_zero_sync_params(ctx, rs.eng[k]), rc, done);
    const int any_moe = strchr(cfg->pattern, 'E') != NULL, LE = cfg->n_layer * (cfg->n_experts > 0 ? cfg->n_experts : 1);

    /* ---- 5. from here on we write outputs ---- */
    const int is_root = wrank == 0;
    if (!rs.run_id[0]) mt_ckpt_run_id_new(rs.run_id);   /* a fresh run (or one resumed from an import) */
    {
        /* one trainer per --out: rank 0 holds OUT/.lock for the run; every rank
         * learns the outcome (nothing was written before this point), agreed,
         * so the job ends in order instead of aborting */
        enum mt_status lk = is_root ? mt_ckpt_lock(ctx, opts->out_dir, &out_lock) : MT_OK;
        if ((rc = mt_comm_agree(ctx, rs.sumc, lk, "taking the output directory")) != MT_OK) {
            if (rc != MT_ERR_COMM) res->collective_started = 0;
            goto done;
        }
    }
    if (mkdir_p(opts->out_dir) != 0) {
        rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot create output directory %s", opts->out_dir);
        goto done;
    }
    struct mt_ops_cpu_info info;
    mt_ops_cpu_info(&info);
    double peak = opts->peak_flops;
    char peak_src[200];
    struct mt_ops_roof roof = {0, 0, 0, 0, 0};
    if (peak > 0) {
        snprintf(peak_src, sizeof peak_src, "given by --peak-flops");
    } else {
        /* every rank measures at once (the run's real contention); the peak is world x rank 0's */
        double mine = measure_gemm_roof(ops, &roof);
        peak = mine * world;
        snprintf(peak_src, sizeof peak_src,
                 "measured at startup: median of %d sgemm %d^3 (best of sizes 768, 1536) through the %s ops table, "
                 "%d threads, coretype %s%s", roof.runs, roof.size, ops->name, threads, info.coretype,
                 world > 1 ? ", all ranks at once, x world" : "");
    }

    const double flops_per_token = mt_model_flops_per_token(cfg);
    const int tty = isatty(fileno(stdout));
    const int mb_n = cfg->microbatches;
    double t_run0 = mt_time_sec(), comm_total = 0, idle_total = 0;
    int steps_run = 0;
    for (int k = 0; k < rs.n_eng; k++) mt_zero_reset_stats(rs.eng[k]);
    /* memory phases: setup until here, then the step loop (see struct peaks) */
    struct peaks run_pk, train_pk;
    memset(&run_pk, 0, sizeof run_pk);
    memset(&train_pk, 0, sizeof train_pk);
    peak_fold(ctx, &run_pk);
    peak_restart(ctx);
    const int prof_warm = n_steps >= 4 ? 2 : (n_steps >= 2 ? 1 : 0); /* = the receipt's warmup_excluded */
    for (int step = start_step; step < opts->steps; step++) {
        double t0 = mt_time_sec();
        if (steps_run == prof_warm) mt_ops_profile_reset(); /* the op profile covers the steady steps */
        mt_ops_profile_enable(1);
        const double comm0 = exposed_comm_s(&rs);
        mt_comm_watchdog_set_step(step);
        if (fault.rank == wrank && fault.step == step) {
            if (!strcmp(fault.kind, "signal")) raise(SIGKILL);
            if (!strcmp(fault.kind, "stop")) raise(SIGSTOP); /* a stalled rank: the others' watchdog ends the job */
            if (!strcmp(fault.kind, "error")) {
                rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "injected failure (MT_FAULT) on rank %d at step %d", wrank, step);
                goto done;
            }
            if (!strcmp(fault.kind, "nan")) {
                /* the last parameter this rank holds, in its own engine and unit: the
                 * model's last unit is absent on pipeline stage 0, and under TP its
                 * parameters are not in the dense engine (issue 13) */
                int i = n_params - 1;
                while (i > 0 && rs.eng_of[i] >= rs.n_eng) i--;
                mt_zero_inject_nan(rs.eng[rs.eng_of[i]], step, mt_model_param_unit(rs.model, i));
            }
        }
        for (int k = 0; k < rs.n_eng; k++) mt_zero_begin_step(rs.eng[k], step);
        mt_model_moe_load_reset(rs.model);
        /* targets are never -1 in the default order; the count stays general */
        struct mt_loss_norm norm = {.n_targets = (double)G * T, .n_sequences = G, .n_tokens = (double)G * T};
        double part[3] = {0, 0, 0};
        MT_CHECK_GOTO(run_microbatches(ctx, &rs, cfg, step, Gl, Bm, &norm, part), rc, done);
        for (int k = 0; k < rs.n_eng; k++) MT_CHECK_GOTO(mt_zero_finish_grads(ctx, rs.eng[k]), rc, done);
        if (any_moe) {
            /* routed slots per expert, this step, over the whole world (load histogram) */
            memcpy(rs.load_step, mt_model_moe_load(rs.model), (size_t)LE * sizeof(double));
            MT_CHECK_GOTO(mt_comm_allreduce(ctx, mt_mesh_world_comm(rs.mesh), rs.load_step, (size_t)LE, MT_DTYPE_F64,
                                            MT_REDOP_SUM), rc, done);
            double imb = 0;
            int nl = 0;
            for (int l = 0; l < cfg->n_layer; l++) {
                if (cfg->pattern[l] != 'E') continue;
                double mx = 0, sum = 0;
                for (int e = 0; e < cfg->n_experts; e++) {
                    double v = rs.load_step[(size_t)l * cfg->n_experts + e];
                    rs.load_total[(size_t)l * cfg->n_experts + e] += v;
                    sum += v;
                    if (v > mx) mx = v;
                }
                if (sum > 0) { imb += mx / (sum / cfg->n_experts); nl++; }
            }
            rs.imbalance[steps_run] = nl ? imb / nl : 0;
        }
        /* the loss sums meet here: the first point where every rank waits for the slowest (idle) */
        double ti = mt_time_sec();
        MT_CHECK_GOTO(mt_comm_allreduce(ctx, rs.sumc, part, 3, MT_DTYPE_F64, MT_REDOP_SUM), rc, done);
        double idle = mt_time_sec() - ti;
        double lm = part[0], aux = part[1], z = part[2];
        double loss = lm + aux + z, ss = 0;
        for (int k = 0; k < rs.n_eng; k++) ss += mt_zero_grad_sumsq_local(rs.eng[k], rs.count);
        MT_CHECK_GOTO(mt_comm_allreduce(ctx, rs.sumc, &ss, 1, MT_DTYPE_F64, MT_REDOP_SUM), rc, done);
        double gn = sqrt(ss);
        if (!isfinite(loss) || !isfinite(gn)) {
            rc = mt_ctx_error(ctx, MT_ERR_NUMERIC, "non-finite %s at step %d on rank %d", isfinite(loss) ? "gradient norm" : "loss",
                              step, ctx->rank);
            goto done;
        }
        for (int k = 0; k < rs.n_eng; k++) {
            MT_CHECK_GOTO(mt_optim_step(ctx, rs.opt[k], step, gn), rc, done);
            MT_CHECK_GOTO(mt_zero_sync_params(ctx, rs.eng[k]), rc, done);
        }
        if (fault.step == step && fault.rank == wrank && !strcmp(fault.kind, "replica"))
            MT_CHECK_GOTO(fault_perturb_replica(ctx, ops, &rs, step), rc, done);
        ops->sync();
        double dt = mt_time_sec() - t0;
        comm_total += exposed_comm_s(&rs) - comm0;
        idle_total += idle;
        mt_ops_profile_add(MT_OPK_COMM, exposed_comm_s(&rs) - comm0 + idle);
        mt_ops_profile_enable(0);
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
        if (is_root)
            progress(opts, tty, step + 1, opts->steps, loss, tok_s, peak > 0 ? tok_s * flops_per_token / peak : 0,
                     eta, gn);
        int done_steps = step + 1;
        if (rs.val && cfg->eval_every > 0 && (done_steps % cfg->eval_every == 0 || done_steps == opts->steps)) {
            double vl;
            MT_CHECK_GOTO(evaluate(ctx, cfg, &rs, Bm, &vl), rc, done);
            rs.eval_steps[rs.n_evals] = done_steps;
            rs.eval_losses[rs.n_evals++] = vl;
            if (!opts->quiet && is_root) {
                fprintf(stdout, "%sval step %d loss %.6f\n", tty ? "\n" : "", done_steps, vl);
                fflush(stdout);
            }
        }
        if (cfg->save_every > 0 && done_steps % cfg->save_every == 0 && done_steps != opts->steps)
        {
            peak_fold(ctx, &train_pk);   /* the checkpoint writer's staging is not the step's */
            MT_CHECK_GOTO(save_checkpoint(ctx, ops, cfg, opts, &rs, done_steps), rc, done);
            peak_fold(ctx, &run_pk);
            peak_restart(ctx);
        }
    }
    double total_s = mt_time_sec() - t_run0;
    peak_fold(ctx, &train_pk);
    peak_restart(ctx);
    MT_CHECK_GOTO(save_checkpoint(ctx, ops, cfg, opts, &rs, opts->steps), rc, done);

    /* ---- 6. checks and receipt ---- */
    {
        char hash_msg[256];
        int mismatch = 0;
        MT_CHECK_GOTO(replica_hash_check(ctx, ops, &rs, opts->zero_stage, hash_msg, sizeof hash_msg, &mismatch), rc,
                      done);
        /* per rank: the whole run's peaks, then the step loop's (+ total each) */
        peak_fold(ctx, &run_pk);
        double mine[2 * MEM_SLOTS];
        for (int b = 0; b < MEM_SLOTS; b++) {
            mine[b] = run_pk.b[b] > train_pk.b[b] ? run_pk.b[b] : train_pk.b[b];
            mine[MEM_SLOTS + b] = train_pk.b[b];
        }
        MT_CHECK_GOTO(mt_comm_allgather(ctx, mt_mesh_world_comm(rs.mesh), rs.mem_all, mine, 2 * MEM_SLOTS,
                                        MT_DTYPE_F64), rc, done);
        if (rs.pp > 1) {
            /* per stage: bubble, max in flight, activation peak (max over the stage's ranks) */
            double *v = mt_alloc(ctx, (size_t)4 * world * sizeof(double), MT_BUCKET_OTHER);
            rs.stage_bubble = mt_alloc(ctx, (size_t)3 * rs.pp * sizeof(double), MT_BUCKET_OTHER);
            if (!v || !rs.stage_bubble) { mt_free(ctx, v); rc = MT_ERR_OOM; goto done; }
            rs.stage_in_flight = rs.stage_bubble + rs.pp;
            rs.stage_acts = rs.stage_bubble + 2 * rs.pp;
            double mine4[4] = {(double)rs.stage, rs.pipe_wall_s > 0 ? 1.0 - rs.pipe_busy_s / rs.pipe_wall_s : 0,
                               (double)rs.in_flight_max, train_pk.b[MT_BUCKET_ACTS]};
            enum mt_status r2 = mt_comm_allgather(ctx, mt_mesh_world_comm(rs.mesh), v, mine4, 4, MT_DTYPE_F64);
            if (r2 != MT_OK) { mt_free(ctx, v); rc = r2; goto done; }
            for (int k = 0; k < 3 * rs.pp; k++) rs.stage_bubble[k] = 0;
            rs.bubble_mean = 0;
            for (int r = 0; r < world; r++) {
                int st = (int)v[4 * r];
                if (v[4 * r + 1] > rs.stage_bubble[st]) rs.stage_bubble[st] = v[4 * r + 1];
                if (v[4 * r + 2] > rs.stage_in_flight[st]) rs.stage_in_flight[st] = v[4 * r + 2];
                if (v[4 * r + 3] > rs.stage_acts[st]) rs.stage_acts[st] = v[4 * r + 3];
            }
            for (int k = 0; k < rs.pp; k++) rs.bubble_mean += rs.stage_bubble[k] / rs.pp;
            mt_free(ctx, v);
        }
        struct mt_zero_stats zs;
        memset(&zs, 0, sizeof zs);
        for (int k = 0; k < rs.n_eng; k++) {
            struct mt_zero_stats z1;
            mt_zero_get_stats(rs.eng[k], &z1);
            for (int c = 0; c < MT_ZERO_COLL_COUNT; c++) {
                zs.bytes[c] += z1.bytes[c];
                zs.calls[c] += z1.calls[c];
            }
            zs.wait_s += z1.wait_s;
        }
        size_t total_params = 0;
        mt_model_param_counts(cfg, &total_params, NULL);
        /* the plan of every rank, by the planner (`meshtrain plan`), on a private
         * ctx so that it stays out of the accounting */
        struct mt_ctx pctx;
        mt_ctx_init(&pctx);
        struct mt_plan *plan = NULL;
        char plan_err[512] = "";
        if (is_root) {
            struct mt_plan_setup su;
            memset(&su, 0, sizeof su);
            su.dims = dims;
            su.zero_stage = opts->zero_stage;
            su.steps = n_steps;
            memcpy(su.first_layer, rs.first_layer, sizeof su.first_layer);
            su.threads = threads;   /* the runtime bucket: this run's threads and token shards */
            su.data_bytes = 2.0 * ((double)mt_data_ntokens(rs.train) + (rs.val ? (double)mt_data_ntokens(rs.val) : 0));
            if (mt_plan_create(&pctx, cfg, &su, 0, &plan) != MT_OK)
                snprintf(plan_err, sizeof plan_err, "%s", mt_ctx_last_error(&pctx));
        }
        djson = dist_json(&rs, trace, rs.mem_all, world, &zs, steps_run, mb_n, (double)total_params * sizeof(float),
                          opts->zero_stage, cfg->reshard_after_forward, plan, plan_err);

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
        r.pp = dims.pp;
        r.dp = dims.dp;
        r.ep = dims.ep;
        r.tp = dims.tp;
        r.world = world;
        r.zero_stage = opts->zero_stage;
        r.cfg = cfg;
        r.micro_batch_seqs = Bm;
        mt_model_param_counts(cfg, &r.params_total, &r.params_active);
        r.flops_per_token = flops_per_token;
        if (plan) mt_plan_rank_bytes(plan, wrank, r.plan_bytes);
        if (plan) r.plan_total_bytes = mt_plan_rank_total(plan, wrank);
        mt_plan_destroy(&pctx, plan);
        for (int b = 0; b < MT_BUCKET_COUNT; b++) r.measured_peak_bytes[b] = (size_t)mine[b];
        r.peak_rss_bytes = (size_t)mine[MT_BUCKET_COUNT + 1];
        r.peak_rss_step_loop_bytes = (size_t)mine[MEM_SLOTS + MT_BUCKET_COUNT + 1];
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
        r.peak_flops_lo = roof.lo * world;
        r.peak_flops_hi = roof.hi * world;
        snprintf(r.kernels_isa, sizeof r.kernels_isa, "%s", !strcmp(ops->name, "cpu") ? mt_ops_cpu_isa() : "");
        r.n_op_kinds = !strcmp(ops->name, "cpu") && n_steady > 0 ? MT_OPK_COUNT : 0;
        mt_ops_profile_get(r.op_step_s, NULL);
        for (int k = 0; k < r.n_op_kinds; k++) {
            r.op_kind_names[k] = mt_ops_profile_kind_name((enum mt_op_kind)k);
            r.op_step_s[k] /= n_steady;
        }
        double step_sum = 0;
        for (int i = 0; i < steps_run; i++) step_sum += rs.times[i];
        r.comm_s = comm_total;
        r.idle_s = idle_total;
        r.compute_s = step_sum - comm_total - idle_total;
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
        snprintf(r.replica_hash_check, sizeof r.replica_hash_check, "%s", hash_msg);
        r.start_step = start_step;
        snprintf(r.resumed_from, sizeof r.resumed_from, "%s", resume_dir);
        snprintf(r.run_id, sizeof r.run_id, "%s", rs.run_id);
        snprintf(r.data_path, sizeof r.data_path, "%s", opts->data_path);
        r.data_tokens = mt_data_ntokens(rs.train);
        r.distributed_json = djson;
        if (is_root) {
            char path[4200];
            snprintf(path, sizeof path, "%s/receipt.json", opts->out_dir);
            MT_CHECK_GOTO(mt_receipt_write(ctx, path, &r), rc, done);
        }
        res->steps_run = steps_run;
        res->final_loss = steps_run ? rs.losses[steps_run - 1] : 0;
        res->tokens_per_s = r.tokens_per_s;
        res->mfu = r.mfu;
        if (mismatch) {
            /* every rank sees the same verdict; wait for rank 0's receipt before
             * any rank returns the error (the tool aborts the job on it) */
            MT_CHECK_GOTO(mt_comm_barrier(ctx, mt_mesh_world_comm(rs.mesh)), rc, done);
            rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "replica hash check failed: %s", hash_msg);
            goto done;
        }
    }

done:
    mt_ckpt_unlock(out_lock);
    mt_free(ctx, rs.saved);
    free(djson);
    mt_free(ctx, rs.mem_all);
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
    for (int k = 0; k < 3; k++) {
        mt_optim_destroy(ctx, rs.opt[k]);
        mt_zero_destroy(ctx, rs.eng[k]);
    }
    if (rs.act_in) ops->buf_free(ctx, rs.act_in);
    if (rs.grad_in) ops->buf_free(ctx, rs.grad_in);
    mt_free(ctx, rs.eng_of);
    mt_free(ctx, rs.sel[0]);
    mt_free(ctx, rs.sel[1]);
    mt_free(ctx, rs.sel[2]);
    mt_free(ctx, rs.imbalance);
    mt_free(ctx, rs.stage_bubble);
    mt_free(ctx, rs.load_total);
    mt_free(ctx, rs.load_step);
    mt_free(ctx, rs.count);
    mt_model_destroy(ctx, rs.model);
    mt_mesh_destroy(rs.mesh);
    mt_data_close(rs.train);
    mt_data_close(rs.val);
    return rc;
}
