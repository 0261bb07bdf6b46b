/*
 * test_eval_loss.c — the validation loss of the receipt is a plain forward
 * over the validation split (issue 13, item 6).
 *
 * A data directory holds train.bin and val_000.bin (files with "val" in the
 * name form the validation split) with different token streams. mt_train_run
 * trains a tiny MoE model (an A and an E block, so that the aux and z terms
 * exist and must stay out of the validation loss; logit softcap on) for 4
 * steps with eval_every=2, eval_batches=3 and save_every=2. Then, for each
 * entry of the receipt's `val_losses`, the checkpoint of that step is loaded
 * into a fresh model and the loss is recomputed directly:
 *
 *     val(s) = 1/eval_batches * sum_b  1/(G*T) * sum_{i<G, t<T}
 *              [ logsumexp_v c*tanh(z_v/c) - c*tanh(z_target/c) ]
 *
 * over global sequence i of batch b of the val stream (mt_data_sequence, the
 * default order: the same sequences every evaluation), with z the raw
 * logits of a forward without targets, and the log-softmax in double. The
 * receipt's value must agree to 1e-6 relative (the same fp32 logits; only
 * the log-softmax and the sums differ: observed ~5e-9). Also: the
 * evaluations are at steps 2 and 4 (every eval_every steps, and at the
 * end), and the two values differ.
 * Exits non-zero on failure.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/mt_config.h"
#include "core/mt_fileio.h"
#include "model/mt_model.h"
#include "io/mt_ckpt.h"
#include "io/mt_data.h"
#include "train/mt_trainer.h"

#include "mt_test.h"

#define V  64
#define T  16
#define G  4
#define EVAL_BATCHES 3
#define SOFTCAP 15.0

/* The direct validation loss of the checkpoint in ckpt_dir (see the header). */
static double direct_val_loss(struct mt_ctx *ctx, const char *ckpt_dir, const char *data_dir)
{
    struct mt_config cfg;
    struct mt_ckpt_meta meta;
    struct mt_model *m = NULL;
    struct mt_data *val = NULL;
    double loss = NAN;
    mt_config_defaults(&cfg);
    if (mt_ckpt_read_meta(ctx, ckpt_dir, &cfg, &meta) != MT_OK || mt_config_resolve(ctx, &cfg, 1) != MT_OK ||
        mt_model_create(ctx, mt_ops_cpu(), &cfg, 1, &m) != MT_OK) {
        fprintf(stderr, "model from %s: %s\n", ckpt_dir, mt_ctx_last_error(ctx));
        goto done;
    }
    int n_params = 0;
    struct mt_param *params = mt_model_params(m, &n_params);
    if (mt_ckpt_load(ctx, mt_ops_cpu(), ckpt_dir, params, n_params, NULL) != MT_OK ||
        mt_data_open(ctx, data_dir, "val", V, T, &val) != MT_OK) {
        fprintf(stderr, "load %s: %s\n", ckpt_dir, mt_ctx_last_error(ctx));
        goto done;
    }
    double c = cfg.logit_softcap, sum = 0;
    EXPECT(c == SOFTCAP, "softcap %g in the checkpoint's config", c);
    for (int b = 0; b < EVAL_BATCHES; b++) {
        double batch = 0;
        for (int i = 0; i < G; i++) {
            int32_t idx[T], tgt[T];
            mt_data_sequence(val, b, G, i, T, idx, tgt);
            if (mt_model_forward(ctx, m, idx, NULL, NULL, NULL) != MT_OK) {
                fprintf(stderr, "forward: %s\n", mt_ctx_last_error(ctx));
                goto done;
            }
            const float *z = mt_model_logits(m);  /* (1, T, V), raw: cpu backend memory is host memory */
            for (int t = 0; t < T; t++) {
                double s[V], mx = -INFINITY, se = 0;
                for (int v = 0; v < V; v++) {
                    s[v] = c > 0 ? c * tanh((double)z[t * V + v] / c) : (double)z[t * V + v];
                    if (s[v] > mx) mx = s[v];
                }
                for (int v = 0; v < V; v++) se += exp(s[v] - mx);
                batch += mx + log(se) - s[tgt[t]];
            }
        }
        sum += batch / ((double)G * T);
    }
    loss = sum / EVAL_BATCHES;
done:
    mt_data_close(val);
    mt_model_destroy(ctx, m);
    return loss;
}

int main(void)
{
    char root[] = "/tmp/mt_test_eval_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    char data_dir[256], out_dir[256], path[512];
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    snprintf(out_dir, sizeof out_dir, "%s/out", root);
    if (mkdir(data_dir, 0755) != 0) { perror(data_dir); return 1; }

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    /* train: a learnable pattern; val: another stream (an evaluation that read
     * the train split, or the wrong sequences, gives another number) */
    enum { N = 6000 };
    static uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)((i * 7 + (i / 13) % 5) % V);
    snprintf(path, sizeof path, "%s/train.bin", data_dir);
    EXPECT(mt_data_write_shard(&ctx, path, tok, N) == MT_OK, "%s", mt_ctx_last_error(&ctx));
    uint32_t r = 12345;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        tok[i] = (uint16_t)((i % 3 == 0) ? (int)((r >> 10) % V) : (tok[i > 0 ? i - 1 : 0] + 3) % V);
    }
    snprintf(path, sizeof path, "%s/val_000.bin", data_dir);
    EXPECT(mt_data_write_shard(&ctx, path, tok, N) == MT_OK, "%s", mt_ctx_last_error(&ctx));

    struct mt_config cfg;
    mt_config_defaults(&cfg);
    const char *sets[] = {"vocab_size=64", "n_layer=2", "d_model=32", "n_head=4", "n_kv_head=2", "seq_len=16",
                          "batch_size=4", "lr=0.01", "warmup_steps=2", "pattern=AE", "n_experts=4", "top_k=2",
                          "expert_hidden=32", "shared_expert_hidden=16", "logit_softcap=15", "eval_every=2",
                          "eval_batches=3", "save_every=2", "threads=1"};
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++)
        EXPECT(mt_config_set(&ctx, &cfg, sets[k]) == MT_OK, "%s: %s", sets[k], mt_ctx_last_error(&ctx));

    struct mt_train_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.data_path = data_dir;
    opts.out_dir = out_dir;
    opts.steps = 4;
    opts.peak_flops = 1e11;
    opts.command_line = "test_eval_loss";
    opts.quiet = 1;
    struct mt_train_result res;
    memset(&res, 0, sizeof res);
    enum mt_status st = mt_train_run(&ctx, &cfg, &opts, &res);
    EXPECT(st == MT_OK, "mt_train_run: %s", mt_ctx_last_error(&ctx));

    snprintf(path, sizeof path, "%s/receipt.json", out_dir);
    char *text = NULL;
    mt_file_read_text(&ctx, path, (size_t)1 << 24, &text);
    cJSON *rc = text ? cJSON_Parse(text) : NULL;
    EXPECT(rc != NULL, "no receipt at %s", path);
    cJSON *vl = rc ? cJSON_GetObjectItem(rc, "val_losses") : NULL;
    EXPECT(cJSON_IsArray(vl) && cJSON_GetArraySize(vl) == 2, "val_losses: two evaluations (steps 2 and 4)");
    double got[2] = {NAN, NAN};
    for (int k = 0; cJSON_IsArray(vl) && k < cJSON_GetArraySize(vl) && k < 2; k++) {
        cJSON *e = cJSON_GetArrayItem(vl, k);
        cJSON *js = cJSON_GetObjectItem(e, "step"), *jl = cJSON_GetObjectItem(e, "loss");
        int step = cJSON_IsNumber(js) ? js->valueint : -1;
        got[k] = cJSON_IsNumber(jl) ? jl->valuedouble : NAN;
        EXPECT(step == 2 * (k + 1), "evaluation %d at step %d (want %d)", k, step, 2 * (k + 1));
        char ck[600];
        snprintf(ck, sizeof ck, "%s/ckpt/step_%06d", out_dir, step);
        double want = direct_val_loss(&ctx, ck, data_dir);
        double rel = fabs(got[k] - want) / fabs(want);
        printf("step %d: receipt val loss %.9f, direct forward %.9f, rel diff %.2e (tol 1e-6)\n", step, got[k],
               want, rel);
        EXPECT(rel <= 1e-6, "step %d: val loss %.9g vs direct %.9g", step, got[k], want);
    }
    EXPECT(got[0] != got[1], "the two evaluations gave the same value %g (not re-evaluated?)", got[0]);
    cJSON_Delete(rc);
    mt_free(&ctx, text);
    mt_ctx_free(&ctx);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    printf("test_eval_loss: %s\n", n_fail ? "FAILED" : "ok");
    return n_fail ? 1 : 0;
}
