/*
 * cmd_sample.c — `meshtrain sample`: generate text from a checkpoint with the
 * KV cache (the prefix is never recomputed), streaming each token's bytes as
 * it is produced. Deterministic for a given --seed (splitmix64 counter sampler).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "tok/mt_tok.h"
#include "io/mt_ckpt.h"
#include "io/mt_export.h"

static void sample_usage(FILE *f)
{
    fprintf(f, "usage: meshtrain sample --ckpt DIR (--prompt TEXT | --prompt-ids LIST) [options]\n\n"
               "  --ckpt DIR          checkpoint dir or a training --out dir (latest step)   (required)\n"
               "  --prompt TEXT       text to continue (BOS + its tokens; needs a tokenizer)\n"
               "  --prompt-ids LIST   token ids to continue, as given (no BOS added; no tokenizer needed);\n"
               "                      prints one line: the prompt ids, then the generated ids\n"
               "  --tokens N          tokens to generate                        default: 64\n"
               "  --temperature T     0 = greedy                                default: 0.8\n"
               "  --top-k K           sample among the K most likely, 0 = all   default: 40\n"
               "  --seed S            sampler seed                              default: 1\n"
               "  --tokenizer FILE    default: DIR/tokenizer.bin of the checkpoint\n"
               "exit codes: 0 ok, 2 bad input, 1 runtime failure\n");
}

/* Pick a token from logits (V): greedy at temperature 0, else softmax(logits/T)
 * restricted to the top k, drawn with the counter-based uniform u(seed, step). */
static int pick_token(float *logits, int V, float temperature, int top_k, uint64_t seed, uint64_t step)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.f) return best;
    float cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        /* k-th largest by repeated selection over a copy of the threshold: O(V k), k small */
        float prev = INFINITY;
        for (int r = 0; r < top_k; r++) {
            float m = -INFINITY;
            for (int i = 0; i < V; i++)
                if (logits[i] < prev && logits[i] > m) m = logits[i];
            prev = m;
        }
        cutoff = prev;
    }
    double sum = 0;
    for (int i = 0; i < V; i++) sum += logits[i] >= cutoff ? exp((logits[i] - logits[best]) / temperature) : 0.0;
    double u = mt_rng_uniform(seed, 0x53414d504c45ull, step) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cutoff) continue;
        acc += exp((logits[i] - logits[best]) / temperature);
        if (acc >= u) return i;
    }
    return best;
}

/* The command line; sample_args returns the process's exit code, or -1
 * when the command continues. */
struct sample_opts {
    const char *ckpt, *prompt, *tok_path, *prompt_ids;
    int         n_tokens, top_k;
    float       temperature;
    uint64_t    seed;
};
static int sample_args(struct sample_opts *so, int argc, char **argv)
{
    static const char *const valued[] = {"--ckpt", "--prompt", "--prompt-ids", "--tokenizer", "--tokens",
                                         "--top-k", "--temperature", "--seed", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { sample_usage(stdout); return 0; }
        if (mt_cmd_option("sample", NULL, valued, argc, argv, i) < 0) return 2;
        char *end = NULL;
        if (!strcmp(a, "--ckpt")) so->ckpt = v;
        else if (!strcmp(a, "--prompt")) so->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) so->prompt_ids = v;
        else if (!strcmp(a, "--tokenizer")) so->tok_path = v;
        else if (!strcmp(a, "--tokens")) { so->n_tokens = (int)strtol(v, &end, 10); if (*end || so->n_tokens < 0) goto bad; }
        else if (!strcmp(a, "--top-k")) { so->top_k = (int)strtol(v, &end, 10); if (*end || so->top_k < 0) goto bad; }
        else if (!strcmp(a, "--temperature")) { so->temperature = strtof(v, &end); if (*end || !(so->temperature >= 0)) goto bad; }
        else if (!strcmp(a, "--seed")) { so->seed = strtoull(v, &end, 10); if (*end) goto bad; }
        i++;
        continue;
    bad:
        fprintf(stderr, "meshtrain sample: bad value '%s' for %s\n", v, a);
        return 2;
    }
    if (!so->ckpt || !so->prompt == !so->prompt_ids) {
        fprintf(stderr, "meshtrain sample: --ckpt and one of --prompt / --prompt-ids are required\n");
        return 2;
    }
    return -1;
}

int mt_cmd_sample(int argc, char **argv)
{
    struct sample_opts so = {.n_tokens = 64, .top_k = 40, .temperature = 0.8f, .seed = 1};
    int code = sample_args(&so, argc, argv);
    if (code >= 0) return code;
    const char *ckpt = so.ckpt, *prompt = so.prompt, *tok_path = so.tok_path, *prompt_ids = so.prompt_ids;
    const int n_tokens = so.n_tokens, top_k = so.top_k;
    const float temperature = so.temperature;
    const uint64_t seed = so.seed;
    int32_t *pids = NULL;
    int n_pids = 0;
    if (prompt_ids && mt_cmd_parse_ids(prompt_ids, &pids, &n_pids)) {
        fprintf(stderr, "meshtrain sample: bad --prompt-ids '%s' (ids in [0, 65535], comma or space separated)\n", prompt_ids);
        return 2;
    }

    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    enum mt_status rc = MT_OK;
    struct mt_tok *tok = NULL;
    struct mt_model *m = NULL;
    struct mt_kv_cache *kv = NULL;
    struct mt_tok_ids ids = {0};
    float *logits = NULL;
    const struct mt_ops_i *ops = mt_ops_cpu();
    char dir[4096], tpath[4200];
    struct mt_config cfg;
    struct mt_ckpt_meta meta;
    mt_config_defaults(&cfg);
    MT_CHECK_GOTO(mt_ckpt_find(&ctx, ckpt, dir, sizeof dir), rc, done);
    MT_CHECK_GOTO(mt_ckpt_read_meta(&ctx, dir, &cfg, &meta), rc, done);
    snprintf(tpath, sizeof tpath, "%s/tokenizer.bin", dir);
    if (prompt) {
        if (!tok_path && access(tpath, F_OK) != 0) {
            rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "checkpoint %s has no tokenizer.bin: give --tokenizer FILE, "
                              "or token ids with --prompt-ids", dir);
            goto done;
        }
        MT_CHECK_GOTO(mt_tok_load(&ctx, tok_path ? tok_path : tpath, &tok), rc, done);
        if (mt_tok_vocab_size(tok) != cfg.vocab_size) {
            rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "tokenizer %s has vocab %d but the checkpoint's model has %d",
                              tok_path ? tok_path : tpath, mt_tok_vocab_size(tok), cfg.vocab_size);
            goto done;
        }
    }
    MT_CHECK_GOTO(mt_config_resolve(&ctx, &cfg, 1), rc, done);
    int t_max = cfg.seq_len;
    if (pids) {
        if (n_pids > t_max - 1) {
            rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "--prompt-ids has %d ids; the model's seq_len %d allows %d",
                              n_pids, t_max, t_max - 1);
            goto done;
        }
        for (int i = 0; i < n_pids; i++)
            if (pids[i] >= cfg.vocab_size) {
                rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "--prompt-ids: id %d is >= vocab_size %d", pids[i], cfg.vocab_size);
                goto done;
            }
    }
    MT_CHECK_GOTO(mt_model_create(&ctx, ops, &cfg, 1, &m), rc, done);
    int n_params;
    struct mt_param *params = mt_model_params(m, &n_params);
    MT_CHECK_GOTO(mt_import_ckpt_load(&ctx, ops, dir, params, n_params), rc, done);   /* an HF LoRA base too */

    /* prompt ids: as given, or BOS + encoded text keeping the tail if it is too long */
    uint32_t bos = tok ? (uint32_t)mt_tok_bos_id(tok) : 0;
    int32_t *prefix;
    int n_prefix;
    logits = mt_alloc(&ctx, (size_t)cfg.vocab_size * sizeof(float), MT_BUCKET_OTHER);
    if (!logits) { rc = MT_ERR_OOM; goto done; }
    if (pids) {
        prefix = pids;
        n_prefix = n_pids;
    } else {
        MT_CHECK_GOTO(mt_tok_encode(&ctx, tok, (const uint8_t *)prompt, strlen(prompt), &ids), rc, done);
        int keep = (int)ids.n < t_max - 1 ? (int)ids.n : t_max - 1;
        prefix = mt_alloc(&ctx, (size_t)(keep + 1) * sizeof(int32_t), MT_BUCKET_OTHER);
        if (!prefix) { rc = MT_ERR_OOM; goto done; }
        prefix[0] = (int32_t)bos;
        for (int i = 0; i < keep; i++) prefix[i + 1] = (int32_t)ids.ids[ids.n - (size_t)keep + (size_t)i];
        n_prefix = keep + 1;
    }
    MT_CHECK_GOTO(mt_model_kv_create(&ctx, m, t_max, &kv), rc, done);
    rc = mt_model_kv_step(&ctx, m, kv, prefix, n_prefix, logits);
    if (!pids) mt_free(&ctx, prefix);
    if (rc != MT_OK) goto done;
    if (pids)
        for (int i = 0; i < n_pids; i++) printf(i ? " %d" : "%d", pids[i]);
    else
        fputs(prompt, stdout);
    for (int s = 0; s < n_tokens && mt_model_kv_len(kv) < t_max; s++) {
        int next = pick_token(logits, cfg.vocab_size, temperature, top_k, seed, (uint64_t)s);
        if (pids) {
            printf(" %d", next);
        } else {
            size_t len = 0;
            const uint8_t *bytes = mt_tok_token_bytes(tok, (uint32_t)next, &len);
            if ((uint32_t)next != bos && bytes) fwrite(bytes, 1, len, stdout);
        }
        fflush(stdout);
        int32_t t32 = next;
        if (mt_model_kv_len(kv) + 1 >= t_max) break;
        MT_CHECK_GOTO(mt_model_kv_step(&ctx, m, kv, &t32, 1, logits), rc, done);
    }
    fputc('\n', stdout);

done:
    if (rc != MT_OK) fprintf(stderr, "meshtrain sample: %s\n", mt_ctx_last_error(&ctx));
    mt_free(&ctx, logits);
    mt_tok_ids_free(&ctx, &ids);
    if (kv) mt_model_kv_destroy(&ctx, m, kv);
    mt_model_destroy(&ctx, m);
    mt_tok_destroy(&ctx, tok);
    free(pids);
    return mt_status_exit_code(rc);
}
