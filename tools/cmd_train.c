/*
 * cmd_train.c — `meshtrain train`: parse flags, build the config
 * (defaults <- --config FILE <- --set key=value), run, map status to exit code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "dist/mt_comm.h"
#include "train/mt_trainer.h"

static void train_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain train --data PATH --out DIR [options]\n\n"
            "options:\n"
            "  --config FILE        JSON config (keys below)                      default: none\n"
            "  --set KEY=VALUE      override one config key (repeatable)\n"
            "  --data PATH          token shards: a file, a directory or a glob   (required)\n"
            "  --val-data PATH      validation shards      default: the *val* files of a --data dir\n"
            "  --out DIR            receipt.json and ckpt/ go here               (required)\n"
            "  --steps N            the step to reach (0: write the initial checkpoint only)  default: 10\n"
            "  --resume DIR         continue from a checkpoint dir, or a previous --out: its ckpt/latest,\n"
            "                       else that run's previous intact checkpoint (docs/checkpoint.md)\n"
            "  --mesh SPEC          pp=..,dp=..,ep=..,tp=.. (omitted axes 1, dp derived from the world)  default: all 1\n"
            "  --zero Z             ZeRO stage 0..3                               default: 0\n"
            "  --pp-layers N0,N1,.. layers per pipeline stage   default: balanced by cost (E blocks cost more)\n"
            "  --backend cpu|cuda   compute backend (= --set backend=...; cuda needs a CUDA build and a GPU,\n"
            "                       GEMM precision from MT_CUDA_PRECISION=fp32|bf16)  default: cpu\n"
            "  --peak-flops F       peak FLOP/s for MFU    default: measure the sgemm roof at startup\n"
            "  --quiet              no progress output\n\n"
            "config keys (--config / --set):\n");
    mt_config_print_help(f);
    fprintf(f, "\nexit codes: 0 ok, 2 bad input or config, 1 runtime failure\n");
}

static int train_main(int argc, char **argv, int world);

/* This rank refused its arguments (message printed). Under mpirun the other
 * ranks may have accepted theirs (a --config file missing on this node
 * only): this call is the same collective as mt_train_run's first setup
 * agreement on the world (mt_comm_agree), so they hear of it there, name this
 * rank and exit 2 too, instead of waiting for it in their first collective. */
static int refuse_args(int world)
{
    if (world > 1) {
        struct mt_ctx scratch;
        mt_ctx_init(&scratch);
        mt_comm_agree(&scratch, NULL, MT_ERR_INVALID_ARG, "setup (flags, config, resume, data)");
    }
    return 2;
}

/* The collective watchdog fired (it printed why): this rank's main thread is
 * stuck inside MPI, so no unwinding; exit 1 and mpirun ends the other ranks. */
static void watchdog_expired(void)
{
    _exit(1);
}

/* The options that take a value: an unknown option is reported as unknown,
 * not as "needs a value", even when it is the last argument. */
static int train_option_takes_value(const char *a)
{
    static const char *const opts[] = {"--config", "--set",  "--backend", "--data",  "--val-data",  "--out",
                                        "--resume", "--mesh", "--pp-layers", "--steps", "--zero", "--peak-flops"};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        if (!strcmp(a, opts[k])) return 1;
    return 0;
}

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
    int code = train_main(argc, argv, world);
    mt_dist_finalize();
    return code;
}

static int train_main(int argc, char **argv, int world)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
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

    /* --config first, whatever its position, so --set always overrides it */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { fprintf(stderr, "meshtrain train: --config needs a file\n"); return refuse_args(world); }
            if (mt_config_load_file(&ctx, &cfg, argv[i + 1]) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
                return refuse_args(world);
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { train_usage(stdout); return 0; }
        if (!strcmp(a, "--quiet")) { opts.quiet = 1; continue; }
        if (!train_option_takes_value(a)) { fprintf(stderr, "meshtrain train: unknown option '%s' (see --help)\n", a); return refuse_args(world); }
        if (!v) { fprintf(stderr, "meshtrain train: %s needs a value (see --help)\n", a); return refuse_args(world); }
        char *end = NULL;
        if (!strcmp(a, "--config")) { /* done above */ }
        else if (!strcmp(a, "--set")) {
            if (mt_config_set(&ctx, &cfg, v) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
                return refuse_args(world);
            }
        }
        else if (!strcmp(a, "--backend")) {
            /* the config key, set in command-line order like --set backend=... */
            char kv[64];
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "meshtrain train: --backend expects cpu or cuda (got '%s')\n", v);
                return refuse_args(world);
            }
            snprintf(kv, sizeof kv, "backend=%s", v);
            if (mt_config_set(&ctx, &cfg, kv) != MT_OK) {
                fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
                return refuse_args(world);
            }
        }
        else if (!strcmp(a, "--data")) opts.data_path = v;
        else if (!strcmp(a, "--val-data")) opts.val_path = v;
        else if (!strcmp(a, "--out")) opts.out_dir = v;
        else if (!strcmp(a, "--resume")) opts.resume = v;
        else if (!strcmp(a, "--mesh")) opts.mesh = v;
        else if (!strcmp(a, "--pp-layers")) opts.pp_layers = v;
        else if (!strcmp(a, "--steps") || !strcmp(a, "--zero")) {
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 0 || n > 100000000) {
                fprintf(stderr, "meshtrain train: %s expects a non-negative integer (got '%s')\n", a, v);
                return refuse_args(world);
            }
            if (!strcmp(a, "--steps")) opts.steps = (int)n;
            else opts.zero_stage = (int)n;
        }
        else if (!strcmp(a, "--peak-flops")) {
            opts.peak_flops = strtod(v, &end);
            if (!*v || *end || opts.peak_flops <= 0) {
                fprintf(stderr, "meshtrain train: --peak-flops expects a positive number (got '%s')\n", v);
                return refuse_args(world);
            }
        }
        else { fprintf(stderr, "meshtrain train: unknown option '%s' (see --help)\n", a); return refuse_args(world); }
        i++;
    }

    struct mt_train_result res;
    /* from here on ranks meet in collectives: a stalled one ends the job */
    if (world > 1 && mt_comm_watchdog_start(&ctx, cfg.comm_timeout_s, watchdog_expired) != MT_OK) {
        fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
        return 1;
    }
    enum mt_status rc = mt_train_run(&ctx, &cfg, &opts, &res);
    mt_comm_watchdog_stop();
    if (rc != MT_OK) {
        fprintf(stderr, "meshtrain train: %s\n", mt_ctx_last_error(&ctx));
        fflush(stderr);
        if (world > 1 && res.collective_started) mt_dist_abort(mt_status_exit_code(rc));
        return mt_status_exit_code(rc);
    }
    if (!opts.quiet && ctx.rank == 0)
        printf("done: %d steps, final loss %.6f, %.0f tok/s, MFU %.1f%%, receipt %s/receipt.json\n", res.steps_run,
               res.final_loss, res.tokens_per_s, 100.0 * res.mfu, opts.out_dir);
    mt_ctx_free(&ctx);
    return 0;
}
