/*
 * cmd_export.c — `meshtrain export` (checkpoint -> HF) and `meshtrain import`
 * (HF -> checkpoint). Thin: parse flags, call mt_export_hf / mt_import_hf,
 * print warnings and a one-line error, map the status to the exit code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "core/mt_core.h"
#include "io/mt_ckpt.h"
#include "io/mt_export.h"

static void export_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain export --ckpt DIR --out DIR [--tokenizer FILE] [--bos-id N] [--allow-lossy] [--force]\n"
            "  --ckpt DIR        checkpoint directory, or a run's OUT dir (its latest checkpoint)\n"
            "  --out DIR         output: config.json, model.safetensors (Qwen3 / Qwen3-MoE, F32),\n"
            "                    generation_config.json, tokenizer.json + tokenizer_config.json\n"
            "  --tokenizer FILE  tokenizer.bin to export   default: DIR/tokenizer.bin if present\n"
            "  --bos-id N        bos/eos_token_id          default: the tokenizer's <|bos|> (omitted without one)\n"
            "  --allow-lossy     export a model HF cannot represent exactly (logit softcap, shared\n"
            "                    expert), printing what the HF model drops; refused (exit 2) without it\n"
            "  --merge           a LoRA checkpoint: merged full weights W + (alpha/r) B A (docs/lora.md)\n"
            "  --adapter         a LoRA checkpoint: adapter_model.safetensors + adapter_config.json (PEFT)\n"
            "  --hf-layout 4|5   --adapter: the transformers major it is for   default: one file for both where\n"
            "                    one loads exactly on both, else the installed transformers' (said in the output;\n"
            "                    python: $MT_HF_PYTHON, else python3); a target that cannot hold it: exit 2\n"
            "  --base-name NAME  --adapter: base_model_name_or_path   default: the run's Hugging Face base folder\n"
            "  --force           write into a non-empty --out that is not a previous export (only the\n"
            "                    export's own files are replaced; nothing else there is touched)\n"
            "--out may not overlap --ckpt. exit codes: 0 ok, 2 bad input or refused, 1 runtime failure\n");
}

static void import_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain import --hf DIR --out DIR [--seq-len N] [--force]\n"
            "  --hf DIR      Hugging Face dir with config.json + model.safetensors (F32, BF16 or F16)\n"
            "  --out DIR     checkpoint directory to write (step 0, no optimizer state)\n"
            "  --seq-len N   model seq_len (default: max_position_embeddings)\n"
            "  --force       replace --out even if it is not a checkpoint\n");
}

static int parse_int(const char *s, int *v)
{
    char *end;
    long x = strtol(s, &end, 10);
    if (!*s || *end || x < -1 || x > 1000000000L) return -1;
    *v = (int)x;
    return 0;
}

/* The major version of the transformers installed for $MT_HF_PYTHON (else
 * python3), 0 when there is none: --adapter's default layout. Reads the
 * package metadata only (no import: milliseconds). */
static int installed_transformers_major(void)
{
    const char *py = getenv("MT_HF_PYTHON");
    char cmd[1200], line[64] = "";
    snprintf(cmd, sizeof cmd, "'%s' -c 'import importlib.metadata as m; print(m.version(\"transformers\"))' 2>/dev/null",
             py && *py && !strchr(py, '\'') ? py : "python3");
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    pclose(f);
    return atoi(line) > 0 ? atoi(line) : 0;
}

static void print_warnings(const char *cmd, const char *warn)
{
    const char *p = warn;
    while (*p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (len > 0) fprintf(stderr, "meshtrain %s: warning: %.*s\n", cmd, len, p);
        p += len + (nl ? 1 : 0);
    }
}

int mt_cmd_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL;
    int adapter = 0;
    struct mt_export_opts eo = {.bos_token_id = -1};
    struct mt_adapter_opts ao = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { export_usage(stdout); return 0; }
        else if (!strcmp(a, "--force")) eo.force = 1;
        else if (!strcmp(a, "--allow-lossy")) eo.allow_lossy = 1;
        else if (!strcmp(a, "--merge")) eo.merge = 1;
        else if (!strcmp(a, "--adapter")) adapter = 1;
        else if (!strcmp(a, "--tokenizer") && i + 1 < argc) eo.tokenizer = argv[++i];
        else if (!strcmp(a, "--ckpt") && i + 1 < argc) ckpt = argv[++i];
        else if (!strcmp(a, "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--base-name") && i + 1 < argc) ao.base_name = argv[++i];
        else if (!strcmp(a, "--hf-layout") && i + 1 < argc) {
            i++;
            if (strcmp(argv[i], "4") && strcmp(argv[i], "5")) {
                fprintf(stderr, "meshtrain export: --hf-layout expects 4 or 5 (the transformers major), got '%s'\n", argv[i]);
                return 2;
            }
            ao.hf_layout = atoi(argv[i]);
        }
        else if (!strcmp(a, "--bos-id") && i + 1 < argc) {
            if (parse_int(argv[++i], &eo.bos_token_id)) { fprintf(stderr, "meshtrain export: bad --bos-id %s\n", argv[i]); return 2; }
        } else {
            fprintf(stderr, "meshtrain export: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!ckpt || !out) {
        fprintf(stderr, "meshtrain export: --ckpt and --out are required (see --help)\n");
        return 2;
    }
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char dir[4096], warn[2048] = "", note[1024] = "";
    enum mt_status rc = mt_ckpt_find(&ctx, ckpt, dir, sizeof dir);
    if (rc == MT_OK && !adapter && (ao.hf_layout || ao.base_name))
        rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "--hf-layout and --base-name go with --adapter");
    else if (rc == MT_OK && adapter && eo.merge)
        rc = mt_ctx_error(&ctx, MT_ERR_INVALID_ARG, "--merge and --adapter exclude each other");
    else if (rc == MT_OK && adapter) {
        ao.force = eo.force;
        if (!ao.hf_layout) ao.installed = installed_transformers_major();
        rc = mt_export_lora_adapter(&ctx, dir, out, &ao, note, sizeof note);
        char *nl = strchr(note, '\n');
        if (nl) *nl++ = 0;
        if (rc == MT_OK) printf("%s\n", note);
        if (rc == MT_OK && nl) print_warnings("export", nl);
    }
    else if (rc == MT_OK) rc = mt_export_hf(&ctx, dir, out, &eo, warn, sizeof warn);
    if (rc != MT_OK) {
        fprintf(stderr, "meshtrain export: %s\n", mt_ctx_last_error(&ctx));
    } else {
        print_warnings("export", warn);
        printf("exported %s -> %s\n", dir, out);
    }
    mt_ctx_free(&ctx);
    return mt_status_exit_code(rc);
}

int mt_cmd_import(int argc, char **argv)
{
    const char *hf = NULL, *out = NULL;
    int seq_len = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { import_usage(stdout); return 0; }
        else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--hf") && i + 1 < argc) hf = argv[++i];
        else if (!strcmp(a, "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--seq-len") && i + 1 < argc) {
            if (parse_int(argv[++i], &seq_len) || seq_len < 1) {
                fprintf(stderr, "meshtrain import: bad --seq-len %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "meshtrain import: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!hf || !out) {
        fprintf(stderr, "meshtrain import: --hf and --out are required (see --help)\n");
        return 2;
    }
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char warn[2048] = "";
    enum mt_status rc = mt_import_hf(&ctx, hf, out, seq_len, force, warn, sizeof warn);
    print_warnings("import", warn);
    if (rc != MT_OK) fprintf(stderr, "meshtrain import: %s\n", mt_ctx_last_error(&ctx));
    else printf("imported %s -> checkpoint %s (step 0)\n", hf, out);
    mt_ctx_free(&ctx);
    return mt_status_exit_code(rc);
}
