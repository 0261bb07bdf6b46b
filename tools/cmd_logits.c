/*
 * cmd_logits.c — `meshtrain logits`: one forward over given token ids, the
 * model's logits (softcap applied: what the model predicts) and its loss
 * terms written as safetensors. The reference point for comparing meshtrain
 * with any other implementation of the model (tests/hf/), and of the cuda
 * backend with the cpu one (--backend: the same checkpoint, the same
 * forward; tests/test_cuda_build.sh, bench/gpu.sh stage hf).
 *
 * Output tensors (F32): "logits" (n, V); "lm_loss", "aux_loss", "z_loss" (1),
 * then "<part>_loss" of the model's extra loss parts (MTP: "mtp_1_loss", ...):
 * the forward's terms for the one sequence with targets ids[t+1] (the last
 * position has none), i.e. lm = mean CE over n-1 targets, aux and z summed
 * over MoE layers (per-sequence aux, z averaged over the n tokens).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "io/mt_ckpt.h"
#include "io/mt_export.h"
#include "train/mt_trainer.h"

int mt_cmd_parse_ids(const char *s, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    int cap = 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 65535 || (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t')) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return -1;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            int32_t *g = realloc(*ids, (size_t)cap * sizeof **ids);
            if (!g) { free(*ids); *ids = NULL; *n = 0; return -1; }
            *ids = g;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return *n > 0 ? 0 : -1;
}

static void logits_usage(FILE *f)
{
    fprintf(f, "usage: meshtrain logits --ckpt DIR --ids \"ID,ID,...\" --out FILE.safetensors [--backend cpu|cuda]\n\n"
               "  --ckpt DIR     checkpoint dir or a training --out dir (latest step)   (required)\n"
               "  --ids LIST     token ids, comma or space separated, at least 2       (required)\n"
               "  --out FILE     safetensors with logits (n, V) after softcap, lm_loss, aux_loss, z_loss\n"
               "  --backend B    cpu or cuda (as train's: cuda needs a CUDA build and a GPU, GEMM precision\n"
               "                 from MT_CUDA_PRECISION=fp32|bf16)                       default: cpu\n"
               "exit codes: 0 ok, 2 bad input, 1 runtime failure\n");
}

int mt_cmd_logits(int argc, char **argv)
{
    const char *ckpt = NULL, *ids_arg = NULL, *out = NULL, *backend = "cpu";
    static const char *const valued[] = {"--ckpt", "--ids", "--out", "--backend", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { logits_usage(stdout); return 0; }
        if (mt_cmd_option("logits", NULL, valued, argc, argv, i) < 0) return 2;
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--ids")) ids_arg = v;
        else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "meshtrain logits: --backend expects cpu or cuda (got '%s')\n", v);
                return 2;
            }
            backend = v;
        } else out = v;
        i++;
    }
    if (!ckpt || !ids_arg || !out) { fprintf(stderr, "meshtrain logits: --ckpt, --ids and --out are required\n"); return 2; }
    int32_t *ids = NULL;
    int n = 0;
    if (mt_cmd_parse_ids(ids_arg, &ids, &n) || n < 2) {
        fprintf(stderr, "meshtrain logits: --ids needs at least 2 ids in [0, 65535], comma or space separated\n");
        free(ids);
        return 2;
    }

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    enum mt_status rc = MT_OK;
    struct mt_model *m = NULL;
    float *logits = NULL;
    int32_t *targets = NULL;
    const struct mt_ops_i *ops = NULL;
    char dir[4096];
    struct mt_config cfg;
    struct mt_ckpt_meta meta;
    mt_config_defaults(&cfg);
    /* the backend first: a build or machine without it refuses before any work (as train does) */
    MT_CHECK_GOTO(mt_ops_by_name(&ctx, backend, &ops), rc, done);
    MT_CHECK_GOTO(mt_ckpt_find(&ctx, ckpt, dir, sizeof dir), rc, done);
    MT_CHECK_GOTO(mt_ckpt_read_meta(&ctx, dir, &cfg, &meta), rc, done);
    MT_CHECK_GOTO(mt_ckpt_check_tensors(&ctx, dir, &cfg), rc, done);
    for (int i = 0; i < n; i++)
        if (ids[i] >= cfg.vocab_size) {
            rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "--ids: id %d at position %d is >= vocab_size %d", ids[i], i,
                              cfg.vocab_size);
            goto done;
        }
    /* one sequence of exactly n tokens: positions 0..n-1, as in any forward */
    cfg.seq_len = n;
    cfg.head_chunk_rows = 0;   /* every row's logits are read (a speed key: bits unchanged) */
    MT_CHECK_GOTO(mt_config_resolve(&ctx, &cfg, 1), rc, done);
    MT_CHECK_GOTO(mt_model_create(&ctx, ops, &cfg, 1, &m), rc, done);
    mt_model_keep_logits(m, 1);   /* the logits are read after a forward with targets */
    int n_params;
    struct mt_param *params = mt_model_params(m, &n_params);
    MT_CHECK_GOTO(mt_import_ckpt_load(&ctx, ops, dir, params, n_params), rc, done);   /* an HF LoRA base too */
    const size_t V = (size_t)cfg.vocab_size;
    targets = mt_alloc(&ctx, (size_t)n * sizeof *targets, MT_BUCKET_OTHER);
    logits = mt_alloc(&ctx, (size_t)n * V * sizeof *logits, MT_BUCKET_OTHER);
    if (!targets || !logits) { rc = MT_ERR_OOM; goto done; }
    for (int i = 0; i < n; i++) targets[i] = i + 1 < n ? ids[i + 1] : -1;
    struct mt_loss_norm norm = {.n_targets = n - 1, .n_sequences = 1, .n_tokens = n};
    struct mt_loss_parts parts;
    MT_CHECK_GOTO(mt_model_forward(&ctx, m, ids, targets, &norm, &parts), rc, done);
    ops->copy_to_host(ops->be, logits, mt_model_logits(m), (size_t)n * V * sizeof *logits);
    MT_CHECK_GOTO(mt_train_backend_status(&ctx, ops), rc, done);   /* a failed kernel or copy: no output */
    if (cfg.logit_softcap > 0) {
        const float c = cfg.logit_softcap;
        for (size_t k = 0; k < (size_t)n * V; k++) logits[k] = c * tanhf(logits[k] / c);
    }
    /* "<part>_loss" per loss part after the logits: lm, aux, z, then the
     * model's extras (an MTP model's mtp_1_loss, ...) */
    int n_part;
    const struct mt_loss_part *lp = mt_model_loss_parts(m, &n_part);
    float pv[MT_LOSS_MAX_PARTS];
    struct mt_st_tensor t[1 + MT_LOSS_MAX_PARTS];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "logits");
    t[0].dtype = MT_ST_F32;
    t[0].data = logits;
    t[0].ndim = 2;
    t[0].shape[0] = n;
    t[0].shape[1] = (int64_t)V;
    for (int k = 0; k < n_part; k++) {
        pv[k] = (float)parts.v[k];
        snprintf(t[1 + k].name, sizeof t[1 + k].name, "%s_loss", lp[k].name);
        t[1 + k].dtype = MT_ST_F32;
        t[1 + k].data = &pv[k];
        t[1 + k].ndim = 1;
        t[1 + k].shape[0] = 1;
    }
    const float lm = pv[MT_LOSS_LM], aux = pv[MT_LOSS_AUX], z = pv[MT_LOSS_Z];
    MT_CHECK_GOTO(mt_safetensors_write(&ctx, out, t, 1 + n_part), rc, done);
    printf("logits (%d, %zu) of %s -> %s: lm_loss %.7g aux_loss %.7g z_loss %.7g\n", n, V, dir, out, (double)lm,
           (double)aux, (double)z);

done:
    if (rc != MT_OK) fprintf(stderr, "meshtrain logits: %s\n", mt_ctx_last_error(&ctx));
    mt_free(&ctx, logits);
    mt_free(&ctx, targets);
    mt_model_destroy(&ctx, m);
    free(ids);
    return mt_status_exit_code(rc);
}
