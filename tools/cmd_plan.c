/*
 * cmd_plan.c — `meshtrain plan`: the layout of every tensor, the exact
 * memory of every rank and the predicted step time, before anything runs;
 * auto-fit over every mesh, ZeRO stage, microbatch count and recompute
 * choice; the largest seq_len / batch_size that fits; and a verifying run.
 *
 *   meshtrain plan --config F [--set k=v]... --world N [--mesh pp=..,dp=..,ep=..,tp=..]
 *                  [--zero Z] [--pp-layers N0,N1,..] [--steps S] [--json] [--profile P]
 *   meshtrain plan --config F --world N --auto --mem-per-rank BYTES [--top K] [--verbose]
 *   meshtrain plan ... --find-max seq_len|batch_size --mem-per-rank BYTES [--auto]
 *   meshtrain plan ... --verify [--data PATH] [--verify-steps S]
 *
 * The contract check is train's (mt_mesh_parse + mt_mesh_check_contract:
 * same messages); the numbers come from src/plan/plan.c, which uses the
 * runtime's own size functions. Bad input is one line on stderr and exit 2.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "core/mt_fileio.h"
#include "core/mt_knobs.h"
#include "parallel/mt_mesh.h"
#include "model/mt_model.h"
#include "io/mt_data.h"
#include "plan/mt_plan.h"
#include "plan/mt_plan_fit.h"
#include "optim/mt_optim.h"

extern char **environ;

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain plan --config F [--set KEY=VALUE]... --world N [options]\n\n"
            "  --config FILE        JSON config (meshtrain train --help lists the keys)\n"
            "  --set KEY=VALUE      override one config key (repeatable); microbatches and recompute too\n"
            "  --knob NAME=VALUE    a runtime tunable, as train's (repeatable): those the model carves by\n"
            "                       (scan_bf16, head_bf16_logits) change the acts bucket; --verify passes them\n"
            "  --world N            number of ranks                                   default: 1\n"
            "  --mesh SPEC          pp=..,dp=..,ep=..,tp=.. (omitted axes 1, dp derived)  default: dp=N\n"
            "  --zero Z             ZeRO stage 0..3                                   default: 0\n"
            "  --pp-layers N0,..    layers per pipeline stage          default: balanced by cost\n"
            "  --steps S            steps of the run (the trainer keeps a few numbers per step)  default: 10\n"
            "  --json               machine-readable output (stable: schema meshtrain.plan/1)\n"
            "  --profile P          device profile: a JSON file or a name in bench/profiles/ (cpu-local,\n"
            "                       h100-8x-nvlink-ib, h200-measured: + the step by op kind); 'none' = no\n"
            "                       cost section                                   default: cpu-local\n"
            "  --auto               enumerate every mesh, ZeRO stage, microbatch count and recompute\n"
            "                       choice that satisfies the contract; best by predicted step time\n"
            "  --mem-per-rank SIZE  memory per rank: bytes, or with a unit: 80GiB (binary), 80GB (decimal)\n"
            "  --top K              auto: how many of the best to print                default: 5\n"
            "  --verbose            auto: list every rejected candidate with its reason\n"
            "  --find-max WHAT      seq_len | batch_size: the largest value that fits --mem-per-rank\n"
            "  --verify             run the chosen setup for a few steps and compare plan and measured\n"
            "  --threads N          threads per rank (runtime bucket)  default: train's (config threads,\n"
            "                       OMP_NUM_THREADS, the cores)\n"
            "  --data PATH          token shards: their mapped bytes join the runtime bucket; --verify trains\n"
            "                       on them (default: a synthetic shard in a temp dir)\n"
            "  --verify-steps S     --verify: steps to run                              default: 3\n\n"
            "Without --auto: checks the startup contract (the same rules and messages as train), then prints\n"
            "the mesh, every parameter (global shape, layout spec, local shape, holders, reduction group,\n"
            "ZeRO owner), the memory of every rank by bucket, and the cost model's step time (by op kind when\n"
            "the profile has a memory bandwidth: docs/plan.md section 5).\n"
            "exit codes: 0 ok, 2 bad input or config (or nothing fits), 1 runtime failure\n");
}

/* ------------------------------------------------------------------ */
/* small helpers                                                       */
/* ------------------------------------------------------------------ */

#define human mt_plan_fit_human

/* strict positive int */
static int parse_pos_int(const char *s, int *out)
{
    char *end = NULL;
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || errno || v < 1 || v > 1 << 30) return -1;
    *out = (int)v;
    return 0;
}

/* directory of this executable ("" if unknown) */
static void exe_dir(char *buf, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) { buf[0] = 0; return; }
    buf[k] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
}

/* --profile NAME|PATH -> a readable file path; 0 ok, -1 not found. */
static int find_profile(const char *name, char *path, size_t n)
{
    if (strchr(name, '/') || strstr(name, ".json")) {
        snprintf(path, n, "%s", name);
        return mt_file_is_regular(path) ? 0 : -1;
    }
    char dir[2048];
    exe_dir(dir, sizeof dir);
    const char *tries[] = {"%s/../bench/profiles/%s.json", "%s/bench/profiles/%s.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, n, tries[i], i == 0 ? dir : ".", name);
        if (mt_file_is_regular(path)) return 0;
    }
    return -1;
}

#define mesh_str mt_plan_fit_mesh_str

/* ------------------------------------------------------------------ */
/* options                                                             */
/* ------------------------------------------------------------------ */

struct opts {
    int         world, zero, zero_given, steps, json, autofit, top, verbose, verify, verify_steps;
    const char *mesh, *pp_layers, *profile, *find_max, *data, *config;
    double      mem;               /* 0: not given */
    int         threads;           /* the runtime bucket: threads per rank (train's rule by default) */
    double      data_bytes;        /* ... the token shards (--data), 0 without                     */
    const struct mt_plan_runtime *runtime;   /* the profile's runtime_memory, NULL: built in     */
    char      **sets;              /* the --set arguments, for --verify */
    int         n_sets;
    char      **knob_args;         /* the --knob arguments, for --verify */
    int         n_knobs;
};

/* The runtime bucket's inputs of a setup: threads, token shards, constants. */
static void setup_runtime(struct mt_plan_setup *su, const struct opts *o)
{
    su->threads = o->threads;
    su->data_bytes = o->data_bytes;
    su->runtime = o->runtime;
}

/* ------------------------------------------------------------------ */
/* explicit plan                                                       */
/* ------------------------------------------------------------------ */

/* how the optimizer's GEMMs (Muon's Newton–Schulz) are priced, for its line */
static const char *optimizer_basis(const struct mt_plan_kinds *k)
{
    if (!strcmp(k->optimizer_basis, "fp32")) return "Muon's Newton-Schulz in fp32";
    if (!strcmp(k->optimizer_basis, "bf16"))
        return "Muon's Newton-Schulz in bf16 (precision=bf16 with knob muon_ns_bf16, or cuda_precision=bf16)";
    if (!strncmp(k->optimizer_basis, "measured", 8))
        return "Muon's batched bf16 Newton-Schulz, measured (cuda_calib muon_ns)";
    return "Newton-Schulz at the profile's one GEMM rate";
}

/* The step by op kind (mt_plan_cost_kinds): one line per kind, then their
 * sum; nothing when the profile has no memory bandwidth. */
static void print_kinds(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost)
{
    struct mt_plan_kinds k;
    mt_plan_cost_kinds(p, prof, cost, &k);
    if (!k.valid) {
        printf("  by op kind: the profile has no memory bandwidth (memory_bandwidth_bytes_per_s or "
               "measured.device_copy_bytes_per_s)\n");
        return;
    }
    printf("  by op kind (one rank, stage %d; max(FLOPs / rate, bytes / %.4g B/s), docs/plan.md section 5):\n",
           k.stage, k.mem_bandwidth);
    for (int i = 0; i < MT_PLAN_KIND_COUNT; i++) {
        const double r = i == MT_PLAN_KIND_GEMM ? k.gemm_rate : i == MT_PLAN_KIND_OPTIMIZER ? k.optimizer_rate
                         : i == MT_PLAN_KIND_ATTENTION_FWD ? k.attn_fwd_rate
                         : i == MT_PLAN_KIND_ATTENTION_BWD ? k.attn_bwd_rate : i == MT_PLAN_KIND_SCAN ? k.scan_rate : 0;
        const char *basis = i == MT_PLAN_KIND_ATTENTION_FWD || i == MT_PLAN_KIND_ATTENTION_BWD ? k.attn_basis
                            : i == MT_PLAN_KIND_SCAN ? k.scan_basis
                            : i == MT_PLAN_KIND_OPTIMIZER ? optimizer_basis(&k) : "";
        printf("    %-14s %10.4g s  %10.4g FLOP  %10.4g B", mt_plan_kind_name((enum mt_plan_kind)i), k.s[i], k.flops[i],
               k.bytes[i]);
        if (k.flops[i] > 0) printf("  at %.4g FLOP/s%s%s", r, basis[0] ? ", " : "", basis);
        printf("\n");
        if (i == MT_PLAN_KIND_GEMM && k.grouped_flops > 0)
            printf("      (of which %.4g FLOP the MoE experts' grouped kernels, at %.4g FLOP/s, %s)\n", k.grouped_flops,
                   k.grouped_rate, k.grouped_basis);
    }
    printf("    %-14s %10.4g s  (%.4g tokens/s; the cost model's step above counts every FLOP at the GEMM rate)\n",
           "step", k.step_s, k.step_s > 0 ? cost->tokens_per_s * cost->step_s / k.step_s : 0);
}

static void print_text(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                       const struct opts *o)
{
    const struct mt_config *cfg = mt_plan_config(p);
    const struct mt_plan_setup *su = mt_plan_get_setup(p);
    const struct mt_mesh_dims *d = &su->dims;
    const int W = mt_plan_world(p);
    char h[32], h2[32], gsb[32];
    int n_moe = 0;
    for (int l = 0; l < cfg->n_layer; l++) n_moe += mt_config_is_moe_layer(cfg, l);
    printf("model: V=%d L=%d D=%d H=%d K=%d hd=%d F=%d T=%d pattern=%s", cfg->vocab_size, cfg->n_layer, cfg->d_model,
           cfg->n_head, cfg->n_kv_head, cfg->head_dim, cfg->mlp_hidden, cfg->seq_len, cfg->pattern);
    if (n_moe)
        printf(" experts=%d top_k=%d expert_hidden=%d shared_expert_hidden=%d", cfg->n_experts, cfg->top_k,
               cfg->expert_hidden, cfg->shared_expert_hidden);
    printf("\nmesh: world=%d pp=%d dp=%d ep=%d tp=%d sequence_parallel=%s zero=%d reshard_after_forward=%s\n", W, d->pp,
           d->dp, d->ep, d->tp, d->tp > 1 && cfg->sequence_parallel ? "on" : "off", su->zero_stage,
           cfg->reshard_after_forward ? "true" : "false");
    printf("groups:");
    for (int g = 0; g < MT_MESH_GROUP_COUNT; g++)
        printf(" %s=%d", mt_mesh_group_name((enum mt_mesh_group)g), mt_mesh_group_size(d, (enum mt_mesh_group)g));
    printf("\npipeline:");
    for (int s = 0; s < d->pp; s++)
        printf(" stage %d layers [%d,%d) slots %d;", s, su->first_layer[s], su->first_layer[s + 1],
               mt_layout_n_slots(cfg, d, s));
    printf("\nbatch: %d sequences per step = dp*ep (%d) x microbatches (%d) x %d per microbatch, T=%d, recompute=%s\n",
           cfg->batch_size, d->dp * d->ep, cfg->microbatches, mt_plan_micro(p), cfg->seq_len, cfg->recompute);
    size_t total = 0, active = 0;
    mt_model_param_counts(cfg, &total, &active);
    printf("parameters: %zu total, %zu active per token, %.4g FLOPs per token (6N + attention)\n", total, active,
           mt_model_flops_per_token(cfg));
    if (cfg->lora_rank > 0) {
        size_t tr = mt_model_param_trainable(cfg);
        printf("LoRA r=%d alpha=%g on %s: %zu trainable (adapters), %zu frozen (the base: no optimizer state)\n",
               cfg->lora_rank, (double)cfg->lora_alpha, cfg->lora_targets, tr, total - tr);
    }

    printf("\n%-52s %-14s %-16s %-14s %-5s %-14s %-20s %-6s %-14s %s\n", "parameter", "global shape", "spec",
           "local shape", "stage", "holders", "reduce group", "owner", "optimizer on", "optim");
    int *ranks = malloc((size_t)W * sizeof(int));
    char rs[160], rs2[160];
    for (int i = 0; ranks && i < mt_plan_n_params(p); i++) {
        const struct mt_plan_param *pp = mt_plan_param(p, i);
        char gs[40], ls[40], spec[48], grp[40];
        if (pp->g.ndim == 2) {
            snprintf(gs, sizeof gs, "[%lld, %lld]", (long long)pp->g.shape[0], (long long)pp->g.shape[1]);
            snprintf(ls, sizeof ls, "[%lld, %lld]", (long long)pp->local[0], (long long)pp->local[1]);
        } else {
            snprintf(gs, sizeof gs, "[%lld]", (long long)pp->g.shape[0]);
            snprintf(ls, sizeof ls, "[%lld]", (long long)pp->local[0]);
        }
        mt_plan_param_spec(p, i, spec, sizeof spec);
        snprintf(grp, sizeof grp, "%s(%d)", mt_mesh_group_name((enum mt_mesh_group)pp->group), pp->group_size);
        int n = mt_plan_param_ranks(p, i, MT_PLAN_HOLDERS, ranks);
        mt_plan_ranks_str(ranks, n, rs, sizeof rs);
        n = mt_plan_param_ranks(p, i, MT_PLAN_OPTIMIZERS, ranks);
        mt_plan_ranks_str(ranks, n, rs2, sizeof rs2);
        printf("%-52s %-14s %-16s %-14s %-5d %-14s %-20s %-6d %-14s %s\n", pp->g.name, gs, spec, ls, pp->stage, rs, grp,
               pp->owner, rs2, pp->g.frozen ? "frozen" : mt_optim_class(pp->g.optim)->name);
    }
    printf("(spec: which mesh axis splits each dimension; @expert: held by one expert rank; holders: ranks\n"
           " storing it between steps; owner: its rank in the reduce group (ZeRO: %s); optimizer on:\n"
           " the ranks that update it)\n",
           su->zero_stage == 0 ? "nothing sharded" : su->zero_stage == 1 ? "optimizer state sharded" :
           su->zero_stage == 2 ? "optimizer state and gradients sharded" : "optimizer state, gradients and parameters sharded");

    printf("\nmemory plan per rank (bytes; ranks with the same plan grouped):\n  %-14s", "ranks");
    for (int b = 0; b < MT_BUCKET_COUNT; b++) printf(" %12s", mt_bucket_name((enum mt_bucket)b));
    printf(" %12s %12s\n", "runtime", "total");
    char *done = calloc((size_t)W, 1);
    for (int r = 0; ranks && done && r < W; r++) {
        if (done[r]) continue;
        size_t a[MT_BUCKET_COUNT], b[MT_BUCKET_COUNT];
        mt_plan_rank_bytes(p, r, a);
        int n = 0;
        for (int q = r; q < W; q++) {
            if (done[q]) continue;
            mt_plan_rank_bytes(p, q, b);
            if (memcmp(a, b, sizeof a) || mt_plan_rank_total(p, q) != mt_plan_rank_total(p, r)) continue;
            done[q] = 1;
            ranks[n++] = q;
        }
        mt_plan_ranks_str(ranks, n, rs, sizeof rs);
        printf("  %-14s", rs);
        for (int k = 0; k < MT_BUCKET_COUNT; k++) printf(" %12zu", a[k]);
        size_t t = mt_plan_rank_total(p, r);
        printf(" %12zu %12zu\n", t - mt_plan_rank_alloc_total(p, r), t);
    }
    free(done);
    {
        struct mt_plan_runtime_terms rt;
        mt_plan_rank_runtime(p, 0, &rt);
        const struct mt_plan_runtime *rc = mt_plan_get_runtime(p);
        printf("runtime (rank 0; outside mt_alloc, from %s): base %s, %d thread(s) %s, MPI %s, collective scratch "
               "%s, token shards %s\n", rc->source, human(rt.base, h, sizeof h), su->threads > 0 ? su->threads : 1,
               human(rt.threads, h2, sizeof h2), human(rt.mpi, rs, sizeof rs), human(rt.coll_scratch, rs2, sizeof rs2),
               human(rt.data, gsb, sizeof gsb));
    }
    free(ranks);
    int mr;
    size_t mt = mt_plan_max_total(p, &mr);
    size_t mb[MT_BUCKET_COUNT];
    mt_plan_rank_bytes(p, mr, mb);
    int lb = mt_plan_fit_largest_bucket(mb);
    printf("largest: rank %d, %s (largest bucket: %s, %s)\n", mr, human((double)mt, h, sizeof h),
           mt_bucket_name((enum mt_bucket)lb), human((double)mb[lb], h2, sizeof h2));
    if (o->mem > 0)
        printf("fits --mem-per-rank %s: %s\n", human(o->mem, h, sizeof h), (double)mt <= o->mem ? "yes" : "no");
    if (cost) {
        const int by_prec = strcmp(cost->peak_basis, "profile") != 0;   /* a by_precision entry applied */
        printf("\ncost model (profile %s: %.4g FLOP/s per rank x efficiency %.2f%s%s):\n", prof->name,
               cost->peak_per_rank, cost->efficiency, by_prec ? ", peak for " : "", by_prec ? cost->peak_basis : "");
        printf("  compute %.4g s, model-axis comm %.4g s, expert-axis comm %.4g s, pipe comm %.4g s,\n",
               cost->compute_s, cost->tp_s, cost->ep_s, cost->pp_s);
        printf("  data-axis comm %.4g s (exposed %.4g s), pipeline bubble %.4g s\n", cost->dp_s, cost->dp_exposed_s,
               cost->bubble_s);
        printf("  step %.4g s, %.4g tokens/s, MFU %.1f%%\n", cost->step_s, cost->tokens_per_s, 100 * cost->mfu);
        print_kinds(p, prof, cost);
    }
}

/* ------------------------------------------------------------------ */
/* verify: run train on the chosen setup                               */
/* ------------------------------------------------------------------ */

/* a synthetic token shard (llm.c format, uniform tokens) of n tokens < vocab */
static int write_shard(const char *path, int vocab, long n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t hdr[256] = {0};
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = (int32_t)n;
    fwrite(hdr, sizeof hdr, 1, f);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (long i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint16_t t = (uint16_t)(x % (uint64_t)vocab);
        fwrite(&t, sizeof t, 1, f);
    }
    return fclose(f);
}

static int find_in_path(const char *prog, char *out, size_t n)
{
    if (strchr(prog, '/')) { snprintf(out, n, "%s", prog); return access(out, X_OK) == 0 ? 0 : -1; }
    const char *path = getenv("PATH");
    if (!path) return -1;
    char buf[8192];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/%s", d, prog);
        if (access(out, X_OK) == 0) return 0;
    }
    return -1;
}

/* The training run --verify makes, as an argv: [mpirun -np N ...] exe train
 * --config F --set ... --mesh M --zero Z --steps S --data D --out O; the
 * strings it points to live in the struct (or are the caller's). */
struct verify_cmd {
    char       *argv[256];
    int         argc;
    const char *mp;            /* the mpirun asked for (MT_MPIRUN or "mpirun") */
    int         have_mpirun;   /* found on PATH, as mpirun[]                   */
    char        mpirun[2048], np[16], mesh[96], zero[8], steps[16], mb[64], rc[64], omp[64], peak[64];
};
static void verify_argv(struct verify_cmd *c, const struct mt_plan *p, const struct mt_plan_profile *prof,
                        const struct mt_plan_cost *cost, const struct opts *o, char *exe, char *data, char *out)
{
    const struct mt_config *cfg = mt_plan_config(p);
    const struct mt_plan_setup *su = mt_plan_get_setup(p);
    const int W = mt_plan_world(p);
    char **argv = c->argv;
    int a = 0;
    c->mp = getenv("MT_MPIRUN") ? getenv("MT_MPIRUN") : "mpirun";
    c->have_mpirun = find_in_path(c->mp, c->mpirun, sizeof c->mpirun) == 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > W ? (int)(cores / W) : 1;
    if (W > 1) {
        argv[a++] = c->have_mpirun ? c->mpirun : (char *)c->mp;
        argv[a++] = "-np";
        snprintf(c->np, sizeof c->np, "%d", W);
        argv[a++] = c->np;
        if (cores < W) argv[a++] = "--oversubscribe";
        if (geteuid() == 0) argv[a++] = "--allow-run-as-root";
        snprintf(c->omp, sizeof c->omp, "OMP_NUM_THREADS=%d", threads);
        argv[a++] = "-x";
        argv[a++] = c->omp;
    }
    argv[a++] = exe;
    argv[a++] = "train";
    if (o->config) { argv[a++] = "--config"; argv[a++] = (char *)o->config; }
    for (int i = 0; i < o->n_sets && a < 200; i++) { argv[a++] = "--set"; argv[a++] = o->sets[i]; }
    for (int i = 0; i < o->n_knobs && a < 220; i++) { argv[a++] = "--knob"; argv[a++] = o->knob_args[i]; }
    snprintf(c->mb, sizeof c->mb, "microbatches=%d", cfg->microbatches);
    snprintf(c->rc, sizeof c->rc, "recompute=%s", cfg->recompute);
    argv[a++] = "--set"; argv[a++] = c->mb;
    argv[a++] = "--set"; argv[a++] = c->rc;
    mesh_str(&su->dims, c->mesh, sizeof c->mesh);
    argv[a++] = "--mesh"; argv[a++] = c->mesh;
    snprintf(c->zero, sizeof c->zero, "%d", su->zero_stage);
    argv[a++] = "--zero"; argv[a++] = c->zero;
    if (o->pp_layers) { argv[a++] = "--pp-layers"; argv[a++] = (char *)o->pp_layers; }
    snprintf(c->steps, sizeof c->steps, "%d", o->verify_steps);
    argv[a++] = "--steps"; argv[a++] = c->steps;
    argv[a++] = "--data"; argv[a++] = data;
    argv[a++] = "--out"; argv[a++] = out;
    argv[a++] = "--quiet";
    if (prof) {   /* MFU against the profile's peak: no startup roof measurement */
        snprintf(c->peak, sizeof c->peak, "%.6g", cost->peak_per_rank * W);
        argv[a++] = "--peak-flops"; argv[a++] = c->peak;
    }
    argv[a] = NULL;
    c->argc = a;
}

/* The run's receipt (OUT/receipt.json) against the plan: memory per rank
 * (mt_alloc and peak RSS) and, with a profile, the step time. */
static int verify_compare(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                          const char *out)
{
    const struct mt_config *cfg = mt_plan_config(p);
    char rpath[2300];
    snprintf(rpath, sizeof rpath, "%s/receipt.json", out);
    FILE *f = fopen(rpath, "rb");
    if (!f) { fprintf(stderr, "meshtrain plan: --verify: no receipt at %s\n", rpath); return 1; }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = malloc((size_t)len + 1);
    size_t got = txt ? fread(txt, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!txt) return 1;
    txt[got] = 0;
    cJSON *r = cJSON_Parse(txt);
    free(txt);
    const cJSON *mp2 = r ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "distributed"),
                                                             "memory_plan") : NULL;
    const cJSON *per = mp2 ? cJSON_GetObjectItemCaseSensitive(mp2, "per_rank") : NULL;
    if (!cJSON_IsArray(per)) {
        fprintf(stderr, "meshtrain plan: --verify: %s has no distributed.memory_plan\n", rpath);
        cJSON_Delete(r);
        return 1;
    }
    printf("verify: memory per rank, plan (this planner) vs measured (the run's step loop):\n");
    printf("  %-6s %14s %14s %9s   %14s %14s %9s\n", "rank", "plan", "measured", "meas/plan", "plan+runtime",
           "peak RSS", "RSS/plan");
    double worst = 0, rworst = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, per) {
        int rk = cJSON_GetObjectItemCaseSensitive(e, "rank")->valueint;
        double pl = (double)mt_plan_rank_alloc_total(p, rk);
        double ms = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "measured_step_loop"),
                                                     "total")->valuedouble;
        double rr = pl > 0 ? ms / pl : 0;
        if (fabs(rr - 1) > worst) worst = fabs(rr - 1);
        /* RSS against the run's own plan: its threads and shards are the run's, not this process's */
        const cJSON *pj = cJSON_GetObjectItemCaseSensitive(e, "plan"), *sj = cJSON_GetObjectItemCaseSensitive(e, "rss");
        const cJSON *pt = pj ? cJSON_GetObjectItemCaseSensitive(pj, "total") : NULL;
        const cJSON *sl = sj ? cJSON_GetObjectItemCaseSensitive(sj, "step_loop_peak") : NULL;
        double rpl = cJSON_IsNumber(pt) ? pt->valuedouble : 0, rss = cJSON_IsNumber(sl) ? sl->valuedouble : 0;
        double q = rpl > 0 ? rss / rpl : 0;
        if (fabs(q - 1) > rworst) rworst = fabs(q - 1);
        printf("  %-6d %14.0f %14.0f %9.4f   %14.0f %14.0f %9.4f\n", rk, pl, ms, rr, rpl, rss, q);
    }
    printf("  worst deviation %.2f%% (mt_alloc), %.2f%% (peak RSS against plan + runtime)\n", 100 * worst,
           100 * rworst);
    const cJSON *tps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "timing"), "tokens_per_s");
    if (cost && cJSON_IsNumber(tps) && tps->valuedouble > 0) {
        double meas = (double)cfg->batch_size * cfg->seq_len / tps->valuedouble;
        printf("verify: step time predicted %.4g s (profile %s), measured %.4g s (steady state), ratio %.2f\n",
               cost->step_s, prof->name, meas, meas / cost->step_s);
    }
    printf("verify: receipt %s\n", rpath);
    cJSON_Delete(r);
    return 0;
}


static int verify_run(const struct mt_plan *p, const struct mt_plan_profile *prof, const struct mt_plan_cost *cost,
                      const struct opts *o)
{
    const struct mt_config *cfg = mt_plan_config(p);
    const int W = mt_plan_world(p);
    char exe[2048], tmpl[] = "/tmp/meshtrain-verify-XXXXXX";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) { fprintf(stderr, "meshtrain plan: --verify: cannot find the meshtrain binary\n"); return 1; }
    exe[k] = 0;
    char *dir = mkdtemp(tmpl);
    if (!dir) { fprintf(stderr, "meshtrain plan: --verify: cannot create a temp dir\n"); return 1; }
    char data[2200], out[2200];
    if (o->data) snprintf(data, sizeof data, "%s", o->data);
    else {
        snprintf(data, sizeof data, "%s/train.bin", dir);
        long n = (long)(o->verify_steps + 1) * cfg->batch_size * (cfg->seq_len + 1) + cfg->seq_len + 2;
        if (n > 1L << 27) n = 1L << 27;
        if (write_shard(data, cfg->vocab_size, n)) {
            fprintf(stderr, "meshtrain plan: --verify: cannot write %s\n", data);
            return 1;
        }
    }
    snprintf(out, sizeof out, "%s/run", dir);
    struct verify_cmd c;
    verify_argv(&c, p, prof, cost, o, exe, data, out);
    char cmd[8192] = "";
    for (int i = 0; i < c.argc; i++) {
        size_t l = strlen(cmd);
        snprintf(cmd + l, sizeof cmd - l, "%s%s", i ? " " : "", c.argv[i]);
    }
    if (W > 1 && !c.have_mpirun) {
        printf("\nverify: %s not found, so the run was not made. Run it yourself:\n  %s\n", c.mp, cmd);
        printf("then compare %s/receipt.json: distributed.memory_plan.per_rank (plan vs measured_step_loop)\n", out);
        return 0;
    }
    printf("\nverify: %s\n", cmd);
    fflush(stdout);
    pid_t pid;
    int st = posix_spawn(&pid, c.argv[0], NULL, NULL, c.argv, environ);
    if (st != 0) { fprintf(stderr, "meshtrain plan: --verify: cannot start %s: %s\n", c.argv[0], strerror(st)); return 1; }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "meshtrain plan: --verify: the training run failed (exit %d)\n",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 1;
    }
    return verify_compare(p, prof, cost, out);
}

/* ------------------------------------------------------------------ */
/* auto-fit and find-max                                               */
/* ------------------------------------------------------------------ */

#define cand mt_plan_fit_cand

static void cand_label(const struct cand *c, char *buf, size_t n)
{
    char m[96];
    mesh_str(&c->d, m, sizeof m);
    if (c->zero < 0) snprintf(buf, n, "%s microbatches=%d", m, c->mb);
    else snprintf(buf, n, "%s zero=%d microbatches=%d recompute=%s", m, c->zero, c->mb, c->rc ? "block" : "none");
}

/* rule of a rejection: the text before its last " (" (the numbers), with
 * a number right after '=' written N (ep=16 -> ep=N), so one rule is one group */
static void reason_rule(const char *r, char *buf, size_t n)
{
    const char *p = NULL;
    for (const char *q = strstr(r, " ("); q; q = strstr(q + 1, " (")) p = q;
    size_t l = p ? (size_t)(p - r) : strlen(r), o = 0;
    for (size_t i = 0; i < l && o + 1 < n; i++) {
        if (r[i] >= '0' && r[i] <= '9' && i > 0 && (r[i - 1] == '=' || (o > 0 && buf[o - 1] == 'N'))) {
            if (buf[o - 1] != 'N') buf[o++] = 'N';
        } else {
            buf[o++] = r[i];
        }
    }
    buf[o] = 0;
}

/* find-max's answer (exit code) */
static int print_find_max(const struct opts *o, const struct mt_plan_fit *fit)
{
    char h1[32], lab[256];
    if (fit->best_val == 0) {
        fprintf(stderr, "meshtrain plan: no layout of world=%d fits --mem-per-rank %s at any %s\n", o->world,
                human(o->mem, h1, sizeof h1), o->find_max);
        return 2;
    }
    cand_label(&fit->best_fm, lab, sizeof lab);
    if (o->json) printf("{\"find_max\": \"%s\", \"value\": %ld, \"layout\": \"%s\"}\n", o->find_max, fit->best_val, lab);
    else printf("largest %s that fits %s per rank on %d ranks: %ld (%s)\n", o->find_max, human(o->mem, h1, sizeof h1),
                o->world, fit->best_val, lab);
    return 0;
}

static void print_auto_json(const struct opts *o, const struct mt_plan_profile *prof, const struct mt_plan_fit *fit)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "meshtrain.plan.auto/1");
    cJSON_AddNumberToObject(root, "world", o->world);
    cJSON_AddNumberToObject(root, "mem_per_rank", o->mem);
    cJSON_AddStringToObject(root, "profile", prof->name);
    cJSON_AddNumberToObject(root, "candidates", fit->n_cand);
    cJSON *fj = cJSON_AddArrayToObject(root, "fitting");
    for (int i = 0; i < fit->n_ok; i++) {
        const struct cand *c = &fit->ok[i];
        cJSON *x = cJSON_CreateObject();
        char m[96];
        mesh_str(&c->d, m, sizeof m);
        cJSON_AddStringToObject(x, "mesh", m);
        cJSON_AddNumberToObject(x, "zero", c->zero);
        cJSON_AddNumberToObject(x, "microbatches", c->mb);
        cJSON_AddStringToObject(x, "recompute", c->rc ? "block" : "none");
        cJSON_AddNumberToObject(x, "max_bytes_per_rank", (double)c->mem);
        cJSON_AddNumberToObject(x, "step_s", c->step_s);
        cJSON_AddNumberToObject(x, "tokens_per_s", c->tps);
        cJSON_AddNumberToObject(x, "mfu", c->mfu);
        cJSON_AddItemToArray(fj, x);
    }
    cJSON *rj = cJSON_AddArrayToObject(root, "rejected");
    for (int i = 0; i < fit->n_rej; i++) {
        const struct cand *c = &fit->rej[i];
        cJSON *x = cJSON_CreateObject();
        char m[96];
        mesh_str(&c->d, m, sizeof m);
        cJSON_AddStringToObject(x, "mesh", m);
        if (c->zero >= 0) cJSON_AddNumberToObject(x, "zero", c->zero);
        else cJSON_AddNullToObject(x, "zero");
        cJSON_AddNumberToObject(x, "microbatches", c->mb);
        if (c->rc >= 0) cJSON_AddStringToObject(x, "recompute", c->rc ? "block" : "none");
        else cJSON_AddNullToObject(x, "recompute");
        cJSON_AddStringToObject(x, "reason", c->reason);
        cJSON_AddItemToArray(rj, x);
    }
    char *t = cJSON_Print(root);
    if (t) printf("%s\n", t);
    free(t);
    cJSON_Delete(root);
}

static void print_auto_text(const struct opts *o, const struct mt_plan_profile *prof, const struct mt_plan_fit *fit)
{
    char h1[32], lab[256];
    printf("auto-fit: world=%d, mem-per-rank %s, profile %s: %d meshes x microbatch counts; %d layouts (x ZeRO "
           "stage x recompute) fit, %d rejected (a contract rule rejects a mesh x microbatch count once)\n", o->world,
           human(o->mem, h1, sizeof h1), prof->name, fit->n_cand, fit->n_ok, fit->n_rej);
    if (fit->skipped_ep)
        printf("(%d meshes with ep > 1 not listed: the model has no E block, so the expert axis would be data "
               "parallelism, the same layout as dp*ep)\n", fit->skipped_ep);
    printf("\nbest by predicted step time:\n  %-3s %-26s %-4s %-4s %-9s %12s %10s %12s %6s  %s\n", "#", "mesh", "zero",
           "mb", "recompute", "max/rank", "step s", "tokens/s", "MFU", "compute/tp/ep/pp/dp-exposed/bubble s");
    for (int i = 0; i < fit->n_ok && i < o->top; i++) {
        const struct cand *c = &fit->ok[i];
        char m[96];
        mesh_str(&c->d, m, sizeof m);
        printf("  %-3d %-26s %-4d %-4d %-9s %12s %10.4g %12.4g %5.1f%%  %.3g/%.3g/%.3g/%.3g/%.3g/%.3g\n", i + 1, m,
               c->zero, c->mb, c->rc ? "block" : "none", human((double)c->mem, h1, sizeof h1), c->step_s, c->tps,
               100 * c->mfu, c->cost.compute_s, c->cost.tp_s, c->cost.ep_s, c->cost.pp_s, c->cost.dp_exposed_s,
               c->cost.bubble_s);
    }
    if (!fit->n_rej) return;
    printf("\nrejected, by rule or bucket (count, rule, one example):\n");
    char *seen = calloc((size_t)fit->n_rej, 1);
    for (int i = 0; seen && i < fit->n_rej; i++) {
        if (seen[i]) continue;
        char ri[320], rj2[320];
        reason_rule(fit->rej[i].reason, ri, sizeof ri);
        int cnt = 0;
        for (int j = i; j < fit->n_rej; j++) {
            reason_rule(fit->rej[j].reason, rj2, sizeof rj2);
            if (!strcmp(ri, rj2)) { seen[j] = 1; cnt++; }
        }
        cand_label(&fit->rej[i], lab, sizeof lab);
        printf("  %5d  %s\n         e.g. %s: %s\n", cnt, ri, lab, fit->rej[i].reason);
    }
    free(seen);
    if (o->verbose) {
        printf("\nevery rejected candidate:\n");
        for (int i = 0; i < fit->n_rej; i++) {
            cand_label(&fit->rej[i], lab, sizeof lab);
            printf("  %s: %s\n", lab, fit->rej[i].reason);
        }
    }
}

/* auto-fit / find-max: the search is the library's (mt_plan_fit_search);
 * this prints it and, for --verify, plans the best layout in full. */
static int run_auto(struct mt_ctx *ctx, struct mt_config *cfg, const struct opts *o, const struct mt_plan_profile *prof,
                    struct mt_plan **chosen_out)
{
    struct mt_plan_fit_opts fo = {.world = o->world, .mem = o->mem, .zero = o->zero_given ? o->zero : -1,
                                  .find_max = o->find_max ? (strcmp(o->find_max, "seq_len") == 0 ? 0 : 1) : -1,
                                  .steps = o->steps, .threads = o->threads, .data_bytes = o->data_bytes,
                                  .runtime = o->runtime, .prof = prof};
    struct mt_plan_fit fit;
    if (mt_plan_fit_search(ctx, cfg, &fo, &fit) != MT_OK) {
        fprintf(stderr, "meshtrain plan: out of memory\n");
        mt_plan_fit_free(ctx, &fit);
        return 1;
    }
    int rcode = 0;
    char h1[32], h2[32], lab[256];
    if (fo.find_max >= 0) {
        rcode = print_find_max(o, &fit);
    } else if (fit.n_ok == 0) {
        if (fit.smallest) {
            cand_label(&fit.smallest_c, lab, sizeof lab);
            fprintf(stderr, "meshtrain plan: --mem-per-rank %s is too small for any layout: the smallest need is %s per "
                            "rank (%s)\n", human(o->mem, h1, sizeof h1), human((double)fit.smallest, h2, sizeof h2), lab);
        } else {
            fprintf(stderr, "meshtrain plan: no mesh of world=%d satisfies the startup contract (e.g. %s)\n", o->world,
                    fit.n_rej ? fit.rej[0].reason : "none");
        }
        rcode = 2;
    } else {
        if (o->json) print_auto_json(o, prof, &fit);
        else print_auto_text(o, prof, &fit);
        if (chosen_out) {
            /* the best one, planned in full (for --verify) */
            if (mt_plan_fit_plan(ctx, cfg, &fit.ok[0], &fo, chosen_out) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
                rcode = 1;
            }
        }
    }
    mt_plan_fit_free(ctx, &fit);
    return rcode;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* The steps of mt_cmd_plan return the process's exit code, or GO_ON when
 * the command continues with the next step. */
#define GO_ON (-1)

/* The command line into cfg and o: --config first, wherever it is, so that
 * --set overrides it; then every option through the shared checker. */
static int plan_args(struct mt_ctx *ctx, struct mt_knobs *knobs, struct mt_config *cfg, struct opts *o, int argc,
                     char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { plan_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { fprintf(stderr, "meshtrain plan: --config needs a file\n"); return 2; }
            o->config = argv[i + 1];
            if (mt_config_load_file_knobs(ctx, cfg, knobs, argv[i + 1]) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
        }
    }
    static const char *const flags0[] = {"--json", "--auto", "--verbose", "--verify", NULL};
    static const char *const flags1[] = {"--config", "--set", "--knob", "--world", "--mesh", "--zero", "--pp-layers",
                                         "--steps",
                                         "--profile", "--mem-per-rank", "--top", "--find-max", "--data",
                                         "--verify-steps", "--threads", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const int kind = mt_cmd_option("plan", flags0, flags1, argc, argv, i);
        if (kind < 0) return 2;
        if (kind == 0) {
            if (!strcmp(a, "--json")) o->json = 1;
            if (!strcmp(a, "--auto")) o->autofit = 1;
            if (!strcmp(a, "--verbose")) o->verbose = 1;
            if (!strcmp(a, "--verify")) o->verify = 1;
            continue;
        }
        i++;
        if (!strcmp(a, "--set")) {
            if (mt_config_set(ctx, cfg, v) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
            if (o->n_sets < 120) o->sets[o->n_sets++] = (char *)v;
        } else if (!strcmp(a, "--knob")) {
            if (mt_knobs_set(ctx, knobs, v) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
            if (o->n_knobs < 40) o->knob_args[o->n_knobs++] = (char *)v;
        } else if (!strcmp(a, "--world") || !strcmp(a, "--steps") || !strcmp(a, "--top") ||
                   !strcmp(a, "--verify-steps") || !strcmp(a, "--threads")) {
            int n;
            if (parse_pos_int(v, &n)) {
                fprintf(stderr, "meshtrain plan: %s %s is not a positive integer\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--world")) o->world = n;
            else if (!strcmp(a, "--steps")) o->steps = n;
            else if (!strcmp(a, "--top")) o->top = n;
            else if (!strcmp(a, "--threads")) o->threads = n;
            else o->verify_steps = n;
        } else if (!strcmp(a, "--zero")) {
            if (strlen(v) != 1 || v[0] < '0' || v[0] > '3') {
                fprintf(stderr, "meshtrain plan: --zero must be 0, 1, 2 or 3 (got '%s')\n", v);
                return 2;
            }
            o->zero = v[0] - '0';
            o->zero_given = 1;
        } else if (!strcmp(a, "--mem-per-rank")) {
            char why[200];
            if (mt_size_parse(v, &o->mem, why, sizeof why) || o->mem < 1) {
                fprintf(stderr, "meshtrain plan: --mem-per-rank '%s': %s\n", v,
                        why[0] ? why : "expected a size of at least 1 byte");
                return 2;
            }
        } else if (!strcmp(a, "--find-max")) {
            if (strcmp(v, "seq_len") && strcmp(v, "batch_size")) {
                fprintf(stderr, "meshtrain plan: --find-max '%s': expected seq_len or batch_size\n", v);
                return 2;
            }
            o->find_max = v;
        }
        else if (!strcmp(a, "--mesh")) o->mesh = v;
        else if (!strcmp(a, "--pp-layers")) o->pp_layers = v;
        else if (!strcmp(a, "--profile")) o->profile = v;
        else if (!strcmp(a, "--data")) o->data = v;
    }
    if (o->world > MT_PLAN_MAX_WORLD) {
        fprintf(stderr, "meshtrain plan: --world %d is above the planner's %d ranks\n", o->world, MT_PLAN_MAX_WORLD);
        return 2;
    }
    if (o->autofit && (o->mesh || o->pp_layers)) {
        fprintf(stderr, "meshtrain plan: --auto chooses the mesh itself: drop --mesh / --pp-layers\n");
        return 2;
    }
    if (mt_knobs_check_env(ctx) != MT_OK) {   /* a bad MT_* alias: refused, as a bad --knob is */
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    return GO_ON;
}

/* What the options leave open, resolved as train resolves it: the
 * vocabulary of a prepared data dir, the config's derived values, the
 * runtime bucket's threads (config, OMP_NUM_THREADS, the cores) and the
 * bytes of the shards it maps. */
static int plan_inputs(struct mt_ctx *ctx, struct mt_config *cfg, struct opts *o)
{
    /* a prepared data dir gives the vocabulary, as for train */
    if (o->data && mt_data_resolve_vocab(ctx, o->data, &cfg->vocab_size, 0) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    if (mt_config_resolve(ctx, cfg, o->steps) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    /* the runtime bucket: train's thread rule (config, OMP_NUM_THREADS, the cores), the shards it maps */
    if (o->threads <= 0) {
        const char *e = getenv("OMP_NUM_THREADS");
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = cfg->threads > 0 ? cfg->threads : (e && atoi(e) > 0) ? atoi(e) : nc > 0 ? (int)nc : 1;
    }
    if (o->data) {
        struct mt_data *dd = NULL;
        if (mt_data_open(ctx, o->data, NULL, cfg->vocab_size, cfg->seq_len, &dd) != MT_OK) {
            fprintf(stderr, "meshtrain plan: --data: %s\n", mt_ctx_last_error(ctx));
            return 2;
        }
        o->data_bytes = 2.0 * (double)mt_data_ntokens(dd);
        mt_data_close(dd);
    }
    return GO_ON;
}

/* The device profile (the cost model; its runtime_memory section, if any,
 * for the runtime bucket: o->runtime points into *rt), and what --auto and
 * --find-max need of it. *have is 0 without one (--profile none, or the
 * default cpu-local not found). */
static int plan_profile(struct mt_ctx *ctx, struct opts *o, struct mt_plan_profile *prof, struct mt_plan_runtime *rt,
                        int *have)
{
    *have = 0;
    const char *pname = o->profile ? o->profile : "cpu-local";
    if (strcmp(pname, "none") != 0) {
        char path[4096];
        if (find_profile(pname, path, sizeof path) == 0) {
            int found = 0;
            if (mt_plan_profile_load(ctx, path, prof) != MT_OK ||
                mt_plan_runtime_load(ctx, path, rt, &found) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
                return 2;
            }
            if (found) o->runtime = rt;
            *have = 1;
        } else if (o->profile) {
            fprintf(stderr, "meshtrain plan: --profile '%s': no such file (names are looked up in bench/profiles/)\n",
                    o->profile);
            return 2;
        }
    }
    if ((o->autofit || o->find_max) && o->mem <= 0) {
        if (*have && prof->memory_bytes > 0) o->mem = prof->memory_bytes;
        else {
            fprintf(stderr, "meshtrain plan: %s needs --mem-per-rank BYTES (or a profile with memory_bytes)\n",
                    o->autofit ? "--auto" : "--find-max");
            return 2;
        }
    }
    if (o->autofit && !*have) {
        fprintf(stderr, "meshtrain plan: --auto ranks layouts by predicted step time and needs a device profile "
                        "(--profile)\n");
        return 2;
    }
    return GO_ON;
}

/* --find-max on an explicit layout: the largest seq_len or batch_size whose
 * plan fits --mem-per-rank. */
static int plan_find_max(struct mt_ctx *ctx, struct mt_plan *plan, struct mt_config *cfg,
                         const struct mt_mesh_dims *dims, const struct opts *o)
{
    char h1[32], h2[32];
    int what = strcmp(o->find_max, "seq_len") == 0 ? 0 : 1;
    long unit;
    size_t need;
    long v = mt_plan_fit_find_max(ctx, plan, cfg, dims, o->world, what, o->mem, &unit, &need);
    if (v == 0) {
        fprintf(stderr, "meshtrain plan: --mem-per-rank %s is too small for this layout at any %s: the smallest "
                        "need is %s per rank (%s=%ld)\n", human(o->mem, h1, sizeof h1), o->find_max,
                human((double)need, h2, sizeof h2), o->find_max, unit);
        return 2;
    }
    char m[96];
    mesh_str(dims, m, sizeof m);
    if (o->json) printf("{\"find_max\": \"%s\", \"value\": %ld, \"layout\": \"%s zero=%d microbatches=%d recompute=%s\"}\n",
                        o->find_max, v, m, o->zero, cfg->microbatches, cfg->recompute);
    else printf("largest %s that fits %s per rank on %s zero=%d microbatches=%d recompute=%s: %ld\n", o->find_max,
                human(o->mem, h1, sizeof h1), m, o->zero, cfg->microbatches, cfg->recompute, v);
    return 0;
}

/* An explicit mesh (--mesh, --zero, --pp-layers): train's parse and
 * contract, same messages; then the plan printed (text or --json), checked
 * against --mem-per-rank, or --find-max, or --verify. prof: NULL without a
 * profile. */
static int plan_explicit(struct mt_ctx *ctx, struct mt_config *cfg, const struct opts *o,
                         const struct mt_plan_profile *prof)
{
    struct mt_mesh_dims dims;
    if (mt_mesh_parse(ctx, o->mesh, o->world, &dims) != MT_OK ||
        mt_mesh_check_contract(ctx, &dims, cfg, o->world, cfg->microbatches) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    struct mt_plan_setup su;
    memset(&su, 0, sizeof su);
    su.dims = dims;
    su.zero_stage = o->zero;
    su.steps = o->steps;
    setup_runtime(&su, o);
    if (mt_layout_pipeline_cut(ctx, cfg, dims.pp, o->pp_layers, su.first_layer) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return 2;
    }
    struct mt_plan *plan = NULL;
    if (mt_plan_create(ctx, cfg, &su, o->find_max ? 0 : MT_PLAN_LAYOUT | MT_PLAN_VERIFY, &plan) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(ctx));
        return mt_status_exit_code(ctx->last_status);
    }
    int code = 0;
    if (o->find_max) {
        code = plan_find_max(ctx, plan, cfg, &dims, o);
        mt_plan_destroy(ctx, plan);
        return code;
    }
    char h1[32], h2[32];
    struct mt_plan_cost cost;
    if (prof) mt_plan_cost(plan, prof, &cost);
    if (o->json) {
        char *t = mt_plan_json(plan, prof, prof ? &cost : NULL);
        if (!t) { fprintf(stderr, "meshtrain plan: out of memory\n"); mt_plan_destroy(ctx, plan); return 1; }
        printf("%s\n", t);
        free(t);
    } else {
        print_text(plan, prof, prof ? &cost : NULL, o);
    }
    size_t mx = mt_plan_max_total(plan, NULL);
    if (o->mem > 0 && (double)mx > o->mem && !o->verify) {
        fprintf(stderr, "meshtrain plan: does not fit: a rank needs %s, --mem-per-rank is %s\n",
                human((double)mx, h1, sizeof h1), human(o->mem, h2, sizeof h2));
        code = 2;
    }
    if (o->verify) code = verify_run(plan, prof, prof ? &cost : NULL, o);
    mt_plan_destroy(ctx, plan);
    return code;
}

int mt_cmd_plan(int argc, char **argv)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    struct opts o;
    memset(&o, 0, sizeof o);
    o.world = 1;
    o.steps = 10;
    o.top = 5;
    o.verify_steps = 3;
    o.profile = NULL;
    char *sets[256], *knob_args[64];
    o.sets = sets;
    o.knob_args = knob_args;
    struct mt_knobs knobs;   /* the runtime tunables the model carves by (scan_bf16, ...), as train reads them */
    mt_knobs_init(&knobs);
    ctx.knobs = &knobs;

    struct mt_plan_profile prof;
    struct mt_plan_runtime prof_rt;
    int have_prof = 0, code;
    if ((code = plan_args(&ctx, &knobs, &cfg, &o, argc, argv)) != GO_ON) return code;
    if ((code = plan_inputs(&ctx, &cfg, &o)) != GO_ON) return code;
    if ((code = plan_profile(&ctx, &o, &prof, &prof_rt, &have_prof)) != GO_ON) return code;

    if (o.autofit) {
        struct mt_plan *plan = NULL;
        code = run_auto(&ctx, &cfg, &o, &prof, o.verify ? &plan : NULL);
        if (code || !o.verify) { mt_plan_destroy(&ctx, plan); return code; }
        struct mt_plan_cost cost;
        mt_plan_cost(plan, &prof, &cost);
        code = verify_run(plan, &prof, &cost, &o);
        mt_plan_destroy(&ctx, plan);
        return code;
    }
    code = plan_explicit(&ctx, &cfg, &o, have_prof ? &prof : NULL);
    mt_ctx_free(&ctx);
    return code;
}
