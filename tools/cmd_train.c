/*
 * cmd_train.c — `meshtrain train`: parse flags, build the config
 * (base <- --config FILE <- --set key=value), run, map status to exit code.
 * The base is the defaults, or with --resume / --init-from the config in the
 * checkpoint's manifest (every key that then differs from it is printed).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "core/mt_fileio.h"
#include "core/mt_knobs.h"
#include "parallel/mt_comm.h"
#include "io/mt_ckpt.h"
#include "io/mt_export.h"
#include "train/mt_trainer.h"

static void train_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain train --data PATH --out DIR [options]\n\n"
            "options:\n"
            "  --config FILE        JSON config (keys below; a \"knobs\" object sets knobs)  default: none\n"
            "  --set KEY=VALUE      override one config key (repeatable)\n"
            "  --data PATH          token shards: a file, a directory or a glob   (required)\n"
            "  --val-data PATH      validation shards      default: the *val* files of a --data dir\n"
            "  --out DIR            receipt.json and ckpt/ go here; created with its parents  (required).\n"
            "                       A DIR that holds another run (receipt.json or ckpt/) is refused\n"
            "                       (exit 2, nothing touched) unless --resume continues that run\n"
            "  --overwrite          start a new run in an --out that holds another run: receipt.json and\n"
            "                       ckpt/latest become the new run's; the old run's ckpt/step_N stay until\n"
            "                       a new one of the same step replaces them (--force: the same, export's word)\n"
            "  --no-save            write no checkpoint (= --set save_final=false --set save_every=0): the\n"
            "                       receipt only, e.g. for benchmarks of large models\n"
            "  --steps N            the step to reach (0: write the initial checkpoint only)  default: 10\n"
            "  --resume DIR         continue from a checkpoint dir, or a previous --out: its ckpt/latest,\n"
            "                       else that run's previous intact checkpoint (docs/checkpoint.md); its\n"
            "                       config is the base, --config/--set go on top (model keys may not change)\n"
            "  --init-from DIR      weights only (step 0, fresh optimizer) from a checkpoint dir, a previous\n"
            "                       --out, or a Hugging Face folder (config.json + model.safetensors);\n"
            "                       its config is the base (tensor shapes may not change); with --resume:\n"
            "                       the base of an adapter-only LoRA checkpoint that moved (docs/checkpoint.md)\n"
            "  --lora R[:ALPHA[:T]]  LoRA fine-tuning: lora_rank=R, lora_alpha=ALPHA, lora_targets=T (comma\n"
            "                       list of q,k,v,o,gate,up,down,expert,in_proj,out_proj); the base is frozen\n"
            "                       (docs/lora.md)\n"
            "  --lora-from DIR      with --init-from BASE: continue a PEFT LoRA adapter (adapter_config.json +\n"
            "                       adapter_model.safetensors): rank, alpha, targets from its config; options\n"
            "                       meshtrain cannot honour (dropout, bias, DoRA, ...) and another base shape\n"
            "                       are refused (exit 2; docs/lora.md)\n"
            "  --mesh SPEC          pp=..,dp=..,ep=..,tp=.. (omitted axes 1, dp derived from the world)  default: all 1\n"
            "  --zero Z             ZeRO stage 0..3                               default: 0\n"
            "  --pp-layers N0,N1,.. layers per pipeline stage   default: balanced by cost (E blocks cost more)\n"
            "  --backend cpu|cuda   compute backend (= --set backend=...; cuda needs a CUDA build and a GPU,\n"
            "                       GEMM precision from MT_CUDA_PRECISION=fp32|bf16)  default: cpu\n"
            "  --peak-flops F       peak FLOP/s that MFU (a percentage) is of  default: the sgemm roof measured\n"
            "                       at startup (under the machine's load then; the receipt's\n"
            "                       timing.peak_flops_source says which)\n"
            "  --knob NAME=VALUE    set a runtime tunable (repeatable; echoed in the receipt's \"knobs\")\n"
            "  --quiet              no progress output (the step-0 mesh trace line stays: every rank's\n"
            "                       coordinates and groups, docs/mesh.md; the distributed tests read it)\n\n"
            "knobs (precedence: --knob, then the config's \"knobs\": {\"NAME\": VALUE}, then the environment\n"
            "alias, then the default; TEST HOOKs are for the test suite):\n");
    char kh[8192];   /* the knob table's help (2048 cut the last knobs off silently once) */
    mt_knobs_help(kh, sizeof kh);
    fputs(kh, f);
    fputc('\n', f);
    mt_config_print_help(f);   /* its own heading; docs/config.md is generated from it */
    fprintf(f, "\nexit codes: 0 ok, 2 bad input or config, 1 runtime failure\n");
}

static int train_main(int argc, char **argv, int world, int rank);
static int train_args(struct mt_ctx *ctx, struct mt_knobs *knobs, struct mt_config *cfg, struct mt_train_opts *opts,
                      int argc, char **argv);
static int train_run(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_train_opts *opts, int world);

/* This rank refused its arguments with status st (message printed). Under
 * mpirun the other ranks may have accepted theirs (a --config file missing on
 * this node only): this call is the same collective as mt_train_run's first
 * setup agreement on the world (mt_comm_agree), so they hear of it there,
 * name this rank and exit too, instead of waiting for it in their first
 * collective. Returns the exit code. */
static int refuse_args(int world, enum mt_status st)
{
    if (world > 1) {
        struct mt_ctx scratch;
        mt_ctx_init(&scratch);
        mt_comm_agree(&scratch, NULL, st, "setup (flags, config, resume, data)");
    }
    return mt_status_exit_code(st);
}

/* The collective watchdog fired (it printed why): this rank's main thread is
 * stuck inside MPI, so no unwinding; exit 1 and mpirun ends the other ranks. */
static void watchdog_expired(void)
{
    _exit(1);
}

/* The options that take a value (mt_cmd_option). */
static const char *const train_valued[] = {"--config", "--set",   "--backend",   "--data",  "--val-data",
                                           "--out",    "--resume", "--init-from", "--mesh",  "--pp-layers",
                                           "--steps",  "--zero",   "--peak-flops", "--knob", "--lora", "--lora-from",
                                           NULL};
static const char *const train_flags[] = {"--quiet", "--no-save", "--overwrite", "--force", NULL};

/* Under mpirun: MPI up first (every rank parses the same flags and fails the
 * same way on bad input: one line, exit 2, no collective entered). A failure
 * after the ranks have met in a collective brings the whole job down. */
int mt_cmd_train(int argc, char **argv)
{
    int world = 1, rank = 0;
    if (mt_dist_init(&argc, &argv, &world, &rank) != MT_OK) {
        fprintf(stderr, "meshtrain train: cannot start the distributed runtime (built without MPI but launched on %s ranks?)\n",
                getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : "several");
        return 2;
    }
    int code = train_main(argc, argv, world, rank);
    mt_dist_finalize();
    return code;
}


/* The checkpoint directory `--resume DIR` / `--init-from DIR` names (DIR
 * itself or the latest checkpoint of a run's OUT). One call, so that the
 * resolution rule (a `latest` pointer, fallbacks) lives in mt_ckpt. */
static enum mt_status train_ckpt_dir(struct mt_ctx *ctx, const char *arg, char *dir, size_t len)
{
    char note[2048];
    enum mt_status st = mt_ckpt_resolve(ctx, arg, dir, len, note, sizeof note);
    if (st == MT_OK && note[0] && ctx->rank == 0) fprintf(stderr, "meshtrain train: warning: %s\n", note);
    return st;
}

/* --resume of an adapter-only LoRA checkpoint (meta m): the base to load,
 * --init-from or else the recorded path (docs/checkpoint.md). A Hugging Face
 * folder is imported into the private temporary dir tmp and *hf names it; a
 * checkpoint given with --init-from is resolved like --init-from alone.
 * dir stays "" when setup takes the recorded path itself (and checks it). */
static enum mt_status resume_base_dir(struct mt_ctx *ctx, const char *init_arg, const struct mt_ckpt_meta *m,
                                      char *dir, size_t n, char *tmp, size_t tmp_n, const char **hf)
{
    dir[0] = 0;
    *hf = NULL;
    const char *b = init_arg ? init_arg : m->base_hash[0] ? m->base_path : NULL;
    if (b && m->base_hash[0] && mt_import_hf_is_folder(b)) {
        char warn[2048] = "";
        *hf = b;
        return mt_import_hf_temp(ctx, b, tmp, tmp_n, dir, n, warn, sizeof warn);
    }
    return init_arg ? train_ckpt_dir(ctx, init_arg, dir, n) : MT_OK;
}

/* Keys that set a tensor's shape: init-from may change any other key. */
static const char *const shape_keys[] = {"vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "head_dim",
                                         "mlp_hidden", "pattern", "n_experts", "expert_hidden",
                                         "shared_expert_hidden", NULL};

static int is_shape_key(const char *k)
{
    for (int i = 0; shape_keys[i]; i++)
        if (!strcmp(shape_keys[i], k)) return 1;
    return 0;
}

/* Print every key whose value differs between the checkpoint's config and
 * the run's; with shapes_only, a changed shape key is an error (returns its
 * name). Values are compared as their JSON text. */
static const char *config_diff(const struct mt_config *from, const struct mt_config *to, const char *src, int print,
                               int shapes_only)
{
    char *a = mt_config_to_json(from), *b = mt_config_to_json(to);
    cJSON *ja = a ? cJSON_Parse(a) : NULL, *jb = b ? cJSON_Parse(b) : NULL, *it;
    const char *bad = NULL;
    int n = 0;
    cJSON_ArrayForEach(it, jb) {
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(ja, it->string);
        char *vo = old ? cJSON_PrintUnformatted(old) : NULL, *vn = cJSON_PrintUnformatted(it);
        if (!vo || !vn || strcmp(vo, vn)) {
            if (shapes_only && is_shape_key(it->string) && !bad) {
                for (int i = 0; shape_keys[i]; i++)
                    if (!strcmp(shape_keys[i], it->string)) bad = shape_keys[i];
            }
            if (print) printf("config: %s %s -> %s (checkpoint %s)\n", it->string, vo ? vo : "?", vn ? vn : "?", src);
            n++;
        }
        free(vo);
        free(vn);
    }
    if (print && n == 0) printf("config: the checkpoint's (%s), unchanged\n", src);
    fflush(stdout);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(a);
    free(b);
    return bad;
}

/* The run id OUT/ckpt/latest names ("step_N\nRUN_ID\n"), "" if none. */
static void out_latest_run(const char *out, char *run, size_t n)
{
    char p[4200], line[256];
    run[0] = 0;
    snprintf(p, sizeof p, "%s/ckpt/latest", out);
    FILE *f = fopen(p, "r");
    if (!f) return;
    if (fgets(line, sizeof line, f) && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        snprintf(run, n, "%s", line);
    }
    fclose(f);
}

/* Is path (resolved) inside dir (resolved)? */
static int path_inside(const char *path, const char *dir)
{
    char a[4096], b[4096];
    if (!realpath(path, a) || !realpath(dir, b)) return 0;
    size_t n = strlen(b);
    return !strncmp(a, b, n) && (a[n] == '/' || a[n] == 0);
}

/* --out must not silently replace another run (issue 32): a DIR holding
 * receipt.json or ckpt/ is refused (exit 2, nothing touched) unless this run
 * continues it (--resume of a checkpoint inside DIR, or of the run that
 * DIR/ckpt/latest names) or --overwrite says to start a new run there (the
 * old run's checkpoints stay: run ids keep the two apart, docs/checkpoint.md).
 * Returns 0 to go on, else 2 (message printed). */
static int check_out_dir(const char *out, int overwrite, const char *resume_dir, const char *resume_run)
{
    if (!out || overwrite) return 0;
    const int has_receipt = mt_file_exists_in(out, "receipt.json"), has_ckpt = mt_file_exists_in(out, "ckpt");
    if (!has_receipt && !has_ckpt) return 0;
    if (resume_dir) {
        char run[256];
        out_latest_run(out, run, sizeof run);
        if (path_inside(resume_dir, out) || (run[0] && resume_run && !strcmp(run, resume_run)) || !has_ckpt) return 0;
    }
    fprintf(stderr, "meshtrain train: --out %s already holds a run (%s): use --resume %s to continue it, "
            "--overwrite to start a new run there, or another --out\n", out, has_ckpt ? "ckpt/" : "receipt.json", out);
    return 2;
}

/* --lora-from: the adapter's config sets rank, alpha and targets on the
 * --init-from base, so the flags that would set them too are refused (NULL: fine). */
static const char *lora_from_refusal(int argc, char **argv, const char *resume_arg, const char *init_arg)
{
    if (resume_arg) return "--resume continues a meshtrain run; --lora-from starts one from --init-from BASE";
    if (!init_arg) return "--lora-from needs --init-from BASE (the base the adapter was made for)";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--lora") || (!strcmp(argv[i], "--set") && i + 1 < argc && !strncmp(argv[i + 1], "lora_", 5)))
            return "--lora-from takes lora_rank, lora_alpha and lora_targets from the adapter's config (drop --lora / "
                   "--set lora_*)";
    return NULL;
}

/* The adapter's tensors, checked against the run's registry, staged as a
 * checkpoint that setup loads (this rank, a private temporary dir, like a
 * Hugging Face base): -1 to go on (opts->lora_from set), else the exit code. */
static int lora_from_stage(struct mt_ctx *ctx, const char *adapter, struct mt_config *cfg, struct mt_train_opts *opts,
                           char *tmp, size_t tmp_n, char *ck, size_t ck_n)
{
    const char *td = getenv("TMPDIR");
    snprintf(tmp, tmp_n, "%s/meshtrain_peft_XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "meshtrain train: cannot create a temporary directory in %s\n", td && *td ? td : "/tmp");
        tmp[0] = 0;
        return 1;
    }
    snprintf(ck, ck_n, "%s/ckpt", tmp);
    if (mt_peft_import(ctx, adapter, cfg, ck) != MT_OK) {
        fprintf(stderr, "meshtrain train: --lora-from %s: %s\n", adapter, mt_ctx_last_error(ctx));
        return 2;
    }
    opts->lora_from = ck;
    return -1;
}

static int train_main(int argc, char **argv, int world, int rank)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    ctx.rank = rank;
    struct mt_knobs knobs;   /* the tunables: defaults, env aliases, then --config's "knobs", then --knob */
    mt_knobs_init(&knobs);
    ctx.knobs = &knobs;
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    struct mt_train_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.steps = 10;

    char cmdline[4096] = "meshtrain";
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(cmdline);
        snprintf(cmdline + len, sizeof cmdline - len, " %s", argv[i]);
    }
    opts.command_line = cmdline;

    /* --resume / --init-from: the checkpoint's config is the base, so they
     * are read here, before train_args applies --config and --set on top
     * (the one place they are read; train_args only steps over them) */
    const char *resume_arg = NULL, *init_arg = NULL, *lora_from_arg = NULL;
    int overwrite = 0;   /* --overwrite / --force: a new run into an --out holding another (check_out_dir) */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--overwrite") || !strcmp(argv[i], "--force")) overwrite = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--resume")) resume_arg = argv[i + 1];
        if (!strcmp(argv[i], "--init-from")) init_arg = argv[i + 1];
        if (!strcmp(argv[i], "--lora-from")) lora_from_arg = argv[i + 1];
    }
    const char *why = lora_from_arg ? lora_from_refusal(argc, argv, resume_arg, init_arg) : NULL;
    if (why) {
        fprintf(stderr, "meshtrain train: %s\n", why);
        return refuse_args(world, MT_ERR_INVALID_ARG);
    }
    /* both: --init-from names the base of an adapter-only checkpoint (setup checks it is one) */
    static char base_dir[4200], hf_tmp[4096], lora_base_dir[4200];
    static struct mt_ckpt_meta rmeta;   /* the resume checkpoint's: its base reference */
    const char *base_hf = NULL;
    struct mt_config saved;
    hf_tmp[0] = 0;
    if (resume_arg || init_arg) {
        const char *arg = resume_arg ? resume_arg : init_arg;
        enum mt_status st;
        if (init_arg && !resume_arg && !mt_file_exists_in(arg, "manifest.json") &&
            mt_file_exists_in(arg, "config.json") && mt_file_exists_in(arg, "model.safetensors")) {
            /* a Hugging Face folder: import it (this rank, a private temporary dir) */
            const char *td = getenv("TMPDIR");
            snprintf(hf_tmp, sizeof hf_tmp, "%s/meshtrain_init_XXXXXX", td && *td ? td : "/tmp");
            if (!mkdtemp(hf_tmp)) {
                fprintf(stderr, "meshtrain train: cannot create a temporary directory in %s\n", td && *td ? td : "/tmp");
                return refuse_args(world, MT_ERR_IO);
            }
            snprintf(base_dir, sizeof base_dir, "%s/ckpt", hf_tmp);
            char warn[2048] = "";
            st = mt_import_hf(&ctx, arg, base_dir, 0, 0, warn, sizeof warn);
            if (st == MT_OK && rank == 0 && warn[0]) fprintf(stderr, "meshtrain train: --init-from %s: %s", arg, warn);
        } else {
            st = train_ckpt_dir(&ctx, arg, base_dir, sizeof base_dir);
        }
        if (st == MT_OK) st = mt_ckpt_read_meta(&ctx, base_dir, &cfg, &rmeta);
        if (st == MT_OK && resume_arg)
            st = resume_base_dir(&ctx, init_arg, &rmeta, lora_base_dir, sizeof lora_base_dir, hf_tmp, sizeof hf_tmp,
                                 &base_hf);
        if (st != MT_OK) {
            fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
            if (hf_tmp[0]) mt_file_rm_rf(hf_tmp);
            return refuse_args(world, st);
        }
        saved = cfg;
    }
    int code = train_args(&ctx, &knobs, &cfg, &opts, argc, argv);
    if (code < 0 && lora_from_arg && mt_peft_config(&ctx, lora_from_arg, &cfg) != MT_OK) {
        fprintf(stderr, "meshtrain train: --lora-from %s: %s\n", lora_from_arg, mt_ctx_last_error(&ctx));
        code = 2;
    }
    if (code < 0 && (resume_arg || init_arg)) {
        const char *src = hf_tmp[0] && !resume_arg ? init_arg : base_dir;
        /* the schedule: a fine-tune from --init-from is a new run (total_steps =
         * its --steps); a resume keeps the checkpoint's schedule unless the run
         * goes past it. Either way only when --config/--set left it alone. */
        if (cfg.total_steps == saved.total_steps && (!resume_arg || opts.steps > saved.total_steps))
            cfg.total_steps = 0;
        if (resume_arg) opts.resume = base_dir;
        else opts.init_from = base_dir;
        if (resume_arg && lora_base_dir[0]) opts.init_from = lora_base_dir;
        opts.init_from_hf = !hf_tmp[0] ? NULL : resume_arg ? base_hf : init_arg;
        struct mt_config shown = cfg;
        if (shown.total_steps == 0) shown.total_steps = opts.steps;
        const char *bad = config_diff(&saved, &shown, src, rank == 0, resume_arg == NULL);
        if (bad) {
            fprintf(stderr, "meshtrain train: --init-from %s: %s may not change (it sets a tensor shape; the "
                    "weights could not load)\n", init_arg, bad);
            code = 2;
        }
    }
    /* a LoRA run from a base inside --out: setup's refusal says why (its step_N could replace the base) */
    const int lora_base_in_out = cfg.lora_rank > 0 && init_arg && opts.out_dir && path_inside(init_arg, opts.out_dir);
    if (code < 0 && !lora_base_in_out)
        code = check_out_dir(opts.out_dir, overwrite, resume_arg ? base_dir : NULL, resume_arg ? rmeta.run_id : NULL) ? 2 : -1;
    /* --lora-from: the adapter staged as a checkpoint for setup (lora_from_stage) */
    static char peft_tmp[4096], peft_ck[4200];
    peft_tmp[0] = 0;
    if (code < 0 && lora_from_arg) code = lora_from_stage(&ctx, lora_from_arg, &cfg, &opts, peft_tmp, sizeof peft_tmp,
                                                          peft_ck, sizeof peft_ck);
    if (code < 0) code = train_run(&ctx, &cfg, &opts, world);
    else if (code > 0) code = refuse_args(world, code == 2 ? MT_ERR_INVALID_ARG : MT_ERR_RUNTIME);
    if (hf_tmp[0]) mt_file_rm_rf(hf_tmp);
    if (peft_tmp[0]) mt_file_rm_rf(peft_tmp);
    return code;
}

/* Parse --config and the flags into cfg / opts: -1 to go on, else the exit code. */
static int train_args(struct mt_ctx *ctx, struct mt_knobs *knobs, struct mt_config *cfg, struct mt_train_opts *opts,
                      int argc, char **argv)
{
    /* --config first, whatever its position, so --set always overrides it */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { fprintf(stderr, "meshtrain train: --config needs a file\n"); return 2; }
            if (mt_config_load_file_knobs(ctx, cfg, knobs, argv[i + 1]) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { train_usage(stdout); return 0; }
        const int kind = mt_cmd_option("train", train_flags, train_valued, argc, argv, i);
        if (kind < 0) return 2;
        if (kind == 0 && !strcmp(a, "--quiet")) { opts->quiet = 1; continue; }
        if (kind == 0 && (!strcmp(a, "--overwrite") || !strcmp(a, "--force"))) continue;   /* train_main's scan */
        if (kind == 0) {   /* --no-save: no checkpoint at all, periodic or final (the receipt is written) */
            if (mt_config_set(ctx, cfg, "save_final=false") != MT_OK || mt_config_set(ctx, cfg, "save_every=0") != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
            continue;
        }
        char *end = NULL;
        if (!strcmp(a, "--config")) { /* done above */ }
        else if (!strcmp(a, "--set")) {
            if (mt_config_set(ctx, cfg, v) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
        }
        else if (!strcmp(a, "--lora")) {
            /* r[:alpha[:targets]] = --set lora_rank=r [lora_alpha=alpha] [lora_targets=...] */
            char buf[160], kv[200];
            snprintf(buf, sizeof buf, "%s", v);
            char *alpha = strchr(buf, ':'), *targets = NULL;
            if (alpha) { *alpha++ = 0; targets = strchr(alpha, ':'); if (targets) *targets++ = 0; }
            char *rend;
            long r = strtol(buf, &rend, 10);
            if (!buf[0] || *rend || r < 1) {
                fprintf(stderr, "meshtrain train: --lora %s: the rank must be an integer >= 1\n", v);
                return 2;
            }
            const char *set[3][2] = {{"lora_rank", buf}, {"lora_alpha", alpha}, {"lora_targets", targets}};
            for (int k = 0; k < 3; k++) {
                if (!set[k][1] || (k > 0 && !set[k][1][0])) continue;
                snprintf(kv, sizeof kv, "%s=%s", set[k][0], set[k][1]);
                if (mt_config_set(ctx, cfg, kv) != MT_OK) {
                    fprintf(stderr, "meshtrain train: --lora %s: %s\n", v, mt_ctx_last_error(ctx));
                    return 2;
                }
            }
        }
        else if (!strcmp(a, "--backend")) {
            /* the config key, set in command-line order like --set backend=... */
            char kv[64];
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "meshtrain train: --backend expects cpu or cuda (got '%s')\n", v);
                return 2;
            }
            snprintf(kv, sizeof kv, "backend=%s", v);
            if (mt_config_set(ctx, cfg, kv) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
        }
        else if (!strcmp(a, "--knob")) {
            if (mt_knobs_set(ctx, knobs, v) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
        }
        else if (!strcmp(a, "--data")) opts->data_path = v;
        else if (!strcmp(a, "--val-data")) opts->val_path = v;
        else if (!strcmp(a, "--out")) opts->out_dir = v;
        else if (!strcmp(a, "--resume") || !strcmp(a, "--init-from") || !strcmp(a, "--lora-from")) {
            /* train_main's base scan */
        }
        else if (!strcmp(a, "--mesh")) opts->mesh = v;
        else if (!strcmp(a, "--pp-layers")) opts->pp_layers = v;
        else if (!strcmp(a, "--steps") || !strcmp(a, "--zero")) {
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 0 || n > 100000000) {
                fprintf(stderr, "meshtrain train: %s expects a non-negative integer (got '%s')\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--steps")) opts->steps = (int)n;
            else opts->zero_stage = (int)n;
        }
        else if (!strcmp(a, "--peak-flops")) {
            opts->peak_flops = strtod(v, &end);
            if (!*v || *end || opts->peak_flops <= 0) {
                fprintf(stderr, "meshtrain train: --peak-flops expects a positive number (got '%s')\n", v);
                return 2;
            }
        }
        i++;
    }
    if (mt_knobs_check_env(ctx) != MT_OK) {   /* a bad MT_* alias: refused, as a bad --knob is */
        fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    return -1;
}

static int train_run(struct mt_ctx *ctx, struct mt_config *cfg, struct mt_train_opts *opts, int world)
{
    struct mt_train_result res;
    /* from here on ranks meet in collectives: a stalled one ends the job */
    if (world > 1 && mt_comm_watchdog_start(ctx, cfg->comm_timeout_s, watchdog_expired) != MT_OK) {
        fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
        return 1;
    }
    enum mt_status rc = mt_train_run(ctx, cfg, opts, &res);
    mt_comm_watchdog_stop();
    if (rc != MT_OK) {
        fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(ctx));
        fflush(stderr);
        if (world > 1 && res.collective_started) mt_dist_abort(mt_status_exit_code(rc));
        return mt_status_exit_code(rc);
    }
    if (!opts->quiet && ctx->rank == 0)
        printf("done: %d steps, final loss %.6f, %.0f tok/s (steady-state mean), MFU %.1f%% (of the peak above), "
               "receipt %s/receipt.json\n", res.steps_run, res.final_loss, res.tokens_per_s, 100.0 * res.mfu,
               opts->out_dir);
    /* above 100% the peak is wrong, not the run: a peak cached while the
     * machine was loaded (the 2026-11-26 idle re-measurement of issue 32
     * read 514% against a cache taken at load 20), or a --peak-flops too low */
    if (!opts->quiet && ctx->rank == 0 && res.mfu > 1.0)
        printf("note: MFU above 100%%: this run did more FLOP/s than the peak it is measured against (a peak "
               "cached while the machine was busy, or --peak-flops too low); measure it again with "
               "--knob peak_cache=refresh\n");
    mt_ctx_free(ctx);
    return 0;
}
