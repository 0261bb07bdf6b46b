/*
 * knobs.c — the tunables table (mt_knobs.h).
 */
#include "mt_knobs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct mt_knob_def knob_table[MT_KNOB_COUNT] = {
    [MT_KNOB_ZERO_OVERLAP] = {
        /* .name      = */ "zero_overlap", MT_KNOB_BOOL, "1", "MT_ZERO_OVERLAP", "src/parallel/zero.c", NULL, 0,
        /* .help      = */ "1: ZeRO reductions and gathers overlap compute; 0: each completes at once (measures "
                           "what overlap hides)"},
    [MT_KNOB_CUDA_PRECISION] = {
        "cuda_precision", MT_KNOB_STRING, "fp32", "MT_CUDA_PRECISION", "src/ops/cuda/ops_cuda.cu", "fp32|bf16", 0,
        "GEMM precision of the cuda backend (bf16 inputs, fp32 accumulate); no effect on cpu"},
    [MT_KNOB_NCCL_TIMEOUT] = {
        "nccl_timeout_s", MT_KNOB_SECONDS, "600", "MT_NCCL_TIMEOUT_S", "src/parallel/comm_nccl.c", NULL, 0,
        "seconds one NCCL collective may wait before its communicator is aborted (nccl builds only)"},
    [MT_KNOB_MOE_GROUPED] = {
        "moe_grouped", MT_KNOB_BOOL, "1", "MT_MOE_GROUPED", "src/model/model.c", NULL, 0,
        "1: the MoE experts run as one grouped GEMM per projection; 0: one GEMM per expert (same bits on cpu)"},
    [MT_KNOB_CUDA_GRAPHS] = {
        "cuda_graphs", MT_KNOB_BOOL, "1", "MT_CUDA_GRAPHS", "src/train/step.c", NULL, 0,
        "1: on a one-GPU cuda mesh with static shapes the step's segments between host waits are captured as CUDA "
        "graphs and replayed (same bits; the receipt's gpu.cuda_graphs says whether they ran); 0: eager launches"},
    [MT_KNOB_TEST_FAULT] = {
        "test_fault", MT_KNOB_STRING, "", "MT_FAULT", "src/train/test_hooks.c", NULL, 1,
        "test hook RANK:STEP:KIND, KIND nan|fresh|error|signal|stop|replica|oom: inject a fault"},
    [MT_KNOB_TEST_LOSS_PART] = {
        "test_loss_part", MT_KNOB_STRING, "", "MT_TEST_LOSS_PART", "src/model/head.c", NULL, 1,
        "test hook: W adds the toy loss part hidden_l2 = W mean |x_final|^2 (weight W >= 0; 0: reported, no "
        "gradient)"},
    [MT_KNOB_TEST_FORCE_ROUTING] = {
        "test_force_routing", MT_KNOB_BOOL, "0", "MT_TEST_FORCE_ROUTING", "src/model/model.c", NULL, 1,
        "test hook: 1 sends every token to experts 0..top_k-1"},
    [MT_KNOB_PEAK_CACHE] = {
        "peak_cache", MT_KNOB_STRING, "use", "MT_PEAK_CACHE", "src/train/trainer.c", "use|refresh|off", 0,
        "the cpu MFU peak: use = read the one measured on this machine before (else measure and keep it), "
        "refresh = measure again and keep it, off = measure every run, keep nothing"},
    [MT_KNOB_ATTN_KERNEL] = {
        "attn_kernel", MT_KNOB_STRING, "v3", "MT_CUDA_ATTN_KERNEL", "src/ops/cuda/ops_cuda.cu", "v1|v2|v3|v4|v5",
        0,
        "bf16 attention kernels of the cuda backend (precision=bf16): v2 = FlashAttention-2-class (mma.sync, one-pass "
        "forward; head dims 64 and 128, others run v1), v3 = v2 with 128 query rows a block (32 a warp) in the "
        "forward and dQ kernels, the same bits, v1 = wmma two-pass, v4 = forward, dK/dV and dQ on Hopper's wgmma "
        "(sm_90a build on an H100/H200; refused elsewhere), v5 = v4 reading V, Q, dO and K MN-major (no transposes "
        "in shared memory); the receipt's gpu.attn_kernel says which; no effect on cpu"},
    [MT_KNOB_SCAN_BF16] = {
        "scan_bf16", MT_KNOB_BOOL, "1", "MT_SCAN_BF16", "src/model/mamba.c", NULL, 0,
        "precision=bf16: the Mamba-3 scan through the backend's bf16 entries (cuda: the chunked scan's products on "
        "tensor cores, ssd_tc.cu); 0 = the fp32 scan (an A/B of the same run); the receipt's gpu.ssm_scan_tc_calls "
        "says what ran; no effect on cpu (no bf16 scan) or in fp32"},
    [MT_KNOB_MOE_SIZES] = {
        "moe_sizes", MT_KNOB_STRING, "auto", "MT_MOE_SIZES", "src/model/moe.c", "auto|host|device", 0,
        "where an MoE layer's per-expert row counts live: device = they stay on the backend and the experts run as "
        "grouped bf16 GEMMs that read them there (ep 1, precision=bf16, no null experts, LoRA or ReDo; no host read, "
        "so CUDA graphs can hold the step), host = one read of the expert offsets a layer, auto = device on a GPU "
        "where it applies, host on cpu; the receipt's moe_sizes says which ran and why"},
    [MT_KNOB_HEAD_BF16_LOGITS] = {
        "head_bf16_logits", MT_KNOB_BOOL, "1", "MT_HEAD_BF16_LOGITS", "src/model/head.c", NULL, 0,
        "precision=bf16 training: the lm head's logits stored bf16 (its GEMM's output rounded once, the "
        "cross-entropy writing the bf16 dlogits over them; 6 bytes an element of traffic, not 10); 0 = fp32 logits, "
        "then the bf16 dlogits twin (chunked by head_chunk_rows), the A/B; no effect in fp32"},
    [MT_KNOB_ATTN_DS_MB] = {
        "attn_ds_mb", MT_KNOB_INT, "2048", "MT_CUDA_ATTN_DS_MB", "src/ops/cuda/attention_tc.cu", NULL, 0,
        "bf16 attention backward (cuda): its dS tiles (B x H x T^2 bf16) are stored for the dQ kernel when they fit "
        "this many MiB, else (and at 0) dQ recomputes them; the same bits; no effect on cpu", 0, 1 << 20},
    [MT_KNOB_ATTN_GROUP_KIB] = {
        "attn_group_kib", MT_KNOB_INT, "0", "MT_CUDA_ATTN_GROUP_KIB", "src/ops/cuda/attn_sched.cuh", NULL, 0,
        "causal bf16 attention (cuda): the block order's budget in KiB for the (batch, head) pairs one group of "
        "blocks shares through the L2; 0 = a third of the device's L2; the receipt's gpu.attn_group_bytes says "
        "which; the same bits; no effect on cpu", 0, 1 << 30},
    [MT_KNOB_GROUPED_GEMM_BN] = {
        "grouped_gemm_bn", MT_KNOB_STRING, "256", "MT_CUDA_GG_BN", "src/ops/cuda/gemm_grouped.cu", "128|256", 0,
        "the MoE experts' grouped bf16 GEMMs (cuda): block tile columns; the same k order and bits; no effect on "
        "cpu"},
    [MT_KNOB_GROUPED_GEMM_KERNEL] = {
        "grouped_gemm_kernel", MT_KNOB_STRING, "mma", "MT_CUDA_GG_KERNEL", "src/ops/cuda/gemm_grouped_wg.cu",
        "mma|wgmma", 0,
        "the MoE experts' grouped bf16 GEMMs (cuda): wgmma = their three products (x W_g^T, dy W_g, dy_g^T x_g) on "
        "Hopper's warpgroup MMA, 128 x 256 tiles (sm_90a build on an H100/H200; refused elsewhere); mma = mma.sync "
        "(the default until a GPU run times both); within the fp32 bound, not the same bits; no effect on cpu"},
    [MT_KNOB_BF16_SCRATCH_MB] = {
        "bf16_scratch_mb", MT_KNOB_INT, "256", "MT_CUDA_BF16_SCRATCH_MB", "src/ops/cuda/gemm.cu", NULL, 0,
        "cuda bf16 GEMMs on fp32 operands: the cap in MiB on one call's bf16 operand copies (larger operands are "
        "converted and multiplied in row tiles); the same bits; no effect on cpu", 1, 1 << 20},
    [MT_KNOB_MUON_NS_BF16] = {
        "muon_ns_bf16", MT_KNOB_BOOL, "1", "MT_MUON_NS_BF16", "src/optim/muon.c", NULL, 0,
        "precision=bf16: Muon's Newton-Schulz GEMMs on bf16 operands with fp32 accumulation (the backend's gemm_bf16, "
        "tensor cores on cuda; Muon's reference runs it in bf16); 0 = in fp32 as SPEC states it (cuda: fp32 GEMMs "
        "on CUDA cores, ~10x slower), the A/B; no effect in fp32"},
    [MT_KNOB_PARAM_INIT_DEVICE] = {
        "param_init_device", MT_KNOB_BOOL, "1", "MT_PARAM_INIT_DEVICE", "src/model/model.c", NULL, 0,
        "1: a device backend draws the normal-init parameters itself (cuda: init.cu, the host's bits, no staging "
        "copy); 0: the host draws every parameter and copies it over (the A/B, and the fallback); no effect on cpu"},
};

const struct mt_knob_def *mt_knob_def(enum mt_knob_id id)
{
    return (unsigned)id < MT_KNOB_COUNT ? &knob_table[id] : NULL;
}

const char *mt_knob_source_name(enum mt_knob_source s)
{
    return s == MT_KNOB_CLI ? "command line" : s == MT_KNOB_CONFIG ? "config" : s == MT_KNOB_ENV ? "env" : "default";
}

/* the alias if set and non-empty, else NULL */
static const char *env_value(enum mt_knob_id id)
{
    const char *e = getenv(knob_table[id].env);
    return e && *e ? e : NULL;
}

void mt_knobs_init(struct mt_knobs *k)
{
    for (int i = 0; i < MT_KNOB_COUNT; i++) {
        const char *e = env_value((enum mt_knob_id)i);
        snprintf(k->value[i], sizeof k->value[i], "%s", e ? e : knob_table[i].def);
        k->source[i] = e ? MT_KNOB_ENV : MT_KNOB_DEFAULT;
    }
}

/* v is one of d's '|'-separated choices */
static int in_choices(const struct mt_knob_def *d, const char *v)
{
    size_t vl = strlen(v);
    for (const char *c = d->choices; *c;) {
        size_t cl = strcspn(c, "|");
        if (cl == vl && !strncmp(c, v, vl)) return 1;
        c += cl + (c[cl] == '|');
    }
    return 0;
}

/* How an error names where the value came from: "--knob zero_overlap",
 * "config knobs.zero_overlap". */
static const char *origin(enum mt_knob_source source) { return source == MT_KNOB_CONFIG ? "config knobs." : "--knob "; }

int mt_knob_value_ok(enum mt_knob_id id, const char *v, char *why, size_t why_len)
{
    const struct mt_knob_def *d = mt_knob_def(id);
    char tmp[128];
    if (!why || !why_len) why = tmp, why_len = sizeof tmp;
    why[0] = 0;
    if (!d || !v) return snprintf(why, why_len, "no such knob"), 0;
    if (d->type == MT_KNOB_BOOL && strcmp(v, "0") && strcmp(v, "1"))
        return snprintf(why, why_len, "expected 0 or 1"), 0;
    if (d->type == MT_KNOB_SECONDS) {
        char *end = NULL;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || !(x > 0))
            return snprintf(why, why_len, "expected a positive number of seconds"), 0;
    }
    if (d->type == MT_KNOB_INT) {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno || x < d->min || x > d->max)
            return snprintf(why, why_len, "expected a whole number in [%lld, %lld]", d->min, d->max), 0;
    }
    if (d->choices && !in_choices(d, v)) return snprintf(why, why_len, "expected %s", d->choices), 0;
    if (strlen(v) >= MT_KNOB_VALUE_LEN)
        return snprintf(why, why_len, "value longer than %d characters", MT_KNOB_VALUE_LEN - 1), 0;
    return 1;
}

enum mt_status mt_knobs_set_from(struct mt_ctx *ctx, struct mt_knobs *k, const char *name, size_t nl,
                                 const char *v, enum mt_knob_source source)
{
    const char *o = origin(source);
    for (int i = 0; i < MT_KNOB_COUNT; i++) {
        const struct mt_knob_def *d = &knob_table[i];
        if (strlen(d->name) != nl || strncmp(d->name, name, nl)) continue;
        char why[96];
        if (!mt_knob_value_ok((enum mt_knob_id)i, v, why, sizeof why))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s%s: %s (got '%.*s')", o, d->name, why,
                                MT_KNOB_VALUE_LEN, v);
        if (k->source[i] > source) return MT_OK;   /* a higher source set it: precedence, not order */
        snprintf(k->value[i], sizeof k->value[i], "%s", v);
        k->source[i] = source;
        return MT_OK;
    }
    char names[512] = "";
    for (int i = 0; i < MT_KNOB_COUNT; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", knob_table[i].name);
    return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "%s'%.*s': unknown knob (known: %s)",
                        source == MT_KNOB_CONFIG ? "config knobs: " : "--knob ", (int)nl, name, names);
}

enum mt_status mt_knobs_check_env(struct mt_ctx *ctx)
{
    for (int i = 0; i < MT_KNOB_COUNT; i++) {
        const char *e = env_value((enum mt_knob_id)i);
        char why[96];
        if (e && !mt_knob_value_ok((enum mt_knob_id)i, e, why, sizeof why))
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "env %s=%.*s (knob %s): %s", knob_table[i].env,
                                MT_KNOB_VALUE_LEN, e, knob_table[i].name, why);
    }
    return MT_OK;
}

enum mt_status mt_knobs_set(struct mt_ctx *ctx, struct mt_knobs *k, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq) {
        /* a known name without a value is a syntax error, an unknown one is unknown */
        for (int i = 0; i < MT_KNOB_COUNT; i++)
            if (!strcmp(knob_table[i].name, arg))
                return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--knob %s: expected NAME=VALUE", arg);
    }
    size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
    return mt_knobs_set_from(ctx, k, arg, nl, eq ? eq + 1 : "", MT_KNOB_CLI);
}

const char *mt_knob_str(const struct mt_ctx *ctx, enum mt_knob_id id)
{
    if (ctx && ctx->knobs) return ctx->knobs->value[id];
    const char *e = env_value(id);
    return e ? e : knob_table[id].def;
}

long mt_knob_int(const struct mt_ctx *ctx, enum mt_knob_id id)
{
    const char *v = mt_knob_str(ctx, id);
    return atol(*v ? v : knob_table[id].def);
}

enum mt_knob_source mt_knob_source(const struct mt_ctx *ctx, enum mt_knob_id id)
{
    if (ctx && ctx->knobs) return ctx->knobs->source[id];
    return env_value(id) ? MT_KNOB_ENV : MT_KNOB_DEFAULT;
}

/* what a knob accepts, for --help: "0|1", "seconds", "0..1048576", its choices or "text" */
static const char *knob_kind(const struct mt_knob_def *d, char *buf, size_t n)
{
    if (d->type == MT_KNOB_BOOL) return "0|1";
    if (d->type == MT_KNOB_SECONDS) return "seconds";
    if (d->type == MT_KNOB_INT) return snprintf(buf, n, "%lld..%lld", d->min, d->max), buf;
    return d->choices ? d->choices : "text";
}

void mt_knobs_help(char *buf, size_t n)
{
    char kind[48];
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < MT_KNOB_COUNT && at < n; i++) {
        const struct mt_knob_def *d = &knob_table[i];
        at += (size_t)snprintf(buf + at, n - at, "  %-20s %s (default '%s'; env %s%s): %s\n", d->name,
                               knob_kind(d, kind, sizeof kind), d->def, d->env,
                               d->test_only ? "; TEST HOOK" : "", d->help);
    }
}
