/*
 * test_moe_copies.c — host <-> backend copies of an MoE layer (issue 28
 * item 2: routing on the device). The cpu ops table with copy_to_host and
 * copy_from_host wrapped by counters drives one training forward (with
 * targets) and one backward of three models that differ only in their
 * pattern, AAA, AAE and AEE (one rank, ep = 1):
 *   per MoE layer      = AEE - AAE        (forward and backward separately)
 *   once per forward   = AAE - AAA - per layer (the layers' aux/z sums)
 * and demands: per MoE layer forward exactly one device-to-host copy, of
 * the E+1 expert offsets, and no host-to-device copy; per MoE layer
 * backward none either way; per forward one device-to-host copy of the
 * MoE layers' aux/z sums (2 doubles a layer). A copy planted in moe.c's
 * forward or backward changes a count and fails here.
 * With the expert sizes on the backend (knob moe_sizes=device, precision
 * bf16: the grouped GEMMs read the offsets there) the same three models
 * must show no copy at all in an MoE layer, forward or backward. On either
 * path the load histogram is counted on the backend: one copy when the
 * trainer reads it (once a step).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mt_core.h"
#include "core/mt_config.h"
#include "core/mt_knobs.h"
#include "core/mt_rng.h"
#include "model/mt_model.h"
#include "ops/mt_ops.h"
#include "mt_test.h"

enum { T = 8, B = 2, E = 4 };

static const struct mt_ops_i *g_cpu;
static long g_d2h, g_h2d, g_d2h_bytes, g_h2d_bytes;

static void count_to_host(void *be, void *dst, const void *src, size_t bytes)
{
    g_d2h++;
    g_d2h_bytes += (long)bytes;
    g_cpu->copy_to_host(be, dst, src, bytes);
}

static void count_from_host(void *be, void *dst, const void *src, size_t bytes)
{
    g_h2d++;
    g_h2d_bytes += (long)bytes;
    g_cpu->copy_from_host(be, dst, src, bytes);
}

struct counts { long fd2h, fh2d, fd2h_bytes, bd2h, bh2d; };

static void reset(void) { g_d2h = g_h2d = g_d2h_bytes = g_h2d_bytes = 0; }

/* one forward with targets and one backward of a 3-layer model of `pattern`
 * (dev: precision=bf16 with moe_sizes=device; *load_copies: the copies of one
 * read of the load histogram) */
static struct counts run(const struct mt_ops_i *ops, const char *pattern, int dev, long *load_copies)
{
    struct counts c = {0};
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_knobs knobs;
    mt_knobs_init(&knobs);
    if (dev) {
        EXPECT(mt_knobs_set(&ctx, &knobs, "moe_sizes=device") == MT_OK, "%s", mt_ctx_last_error(&ctx));
        ctx.knobs = &knobs;
    }
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.vocab_size = 29;
    cfg.n_layer = 3;
    cfg.d_model = 16;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.mlp_hidden = 32;
    cfg.seq_len = T;
    cfg.batch_size = B;
    cfg.microbatches = 1;
    snprintf(cfg.pattern, sizeof cfg.pattern, "%s", pattern);
    if (dev) snprintf(cfg.precision, sizeof cfg.precision, "bf16");
    cfg.n_experts = E;
    cfg.top_k = 2;
    cfg.expert_hidden = 8;
    cfg.shared_expert_hidden = 8;
    if (mt_config_resolve(&ctx, &cfg, 1) != MT_OK) {
        fprintf(stderr, "config: %s\n", mt_ctx_last_error(&ctx));
        exit(1);
    }
    struct mt_model *m = NULL;
    if (mt_model_create(&ctx, ops, &cfg, B, &m) != MT_OK || mt_model_init_params(&ctx, m, 3) != MT_OK) {
        fprintf(stderr, "model: %s\n", mt_ctx_last_error(&ctx));
        exit(1);
    }
    int32_t idx[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        idx[i] = (int32_t)(mt_rng_splitmix64(2 * (uint64_t)i) % 29);
        tgt[i] = (int32_t)(mt_rng_splitmix64(2 * (uint64_t)i + 1) % 29);
    }
    struct mt_loss_norm norm = {B * T, B, B * T};
    struct mt_loss_parts parts;
    reset();
    EXPECT(mt_model_forward(&ctx, m, idx, tgt, &norm, &parts) == MT_OK, "%s", mt_ctx_last_error(&ctx));
    c.fd2h = g_d2h;
    c.fh2d = g_h2d;
    c.fd2h_bytes = g_d2h_bytes;
    reset();
    EXPECT(mt_model_backward(&ctx, m) == MT_OK, "%s", mt_ctx_last_error(&ctx));
    c.bd2h = g_d2h;
    c.bh2d = g_h2d;
    if (strchr(pattern, 'E'))
        EXPECT(parts.v[MT_LOSS_AUX] > 0 && parts.v[MT_LOSS_Z] > 0, "%s: aux %g z %g", pattern, parts.v[MT_LOSS_AUX],
               parts.v[MT_LOSS_Z]);
    const char *why = "";
    if (strchr(pattern, 'E'))
        EXPECT(mt_model_moe_device_sizes(m, &why) == dev, "%s: device sizes %d, want %d (%s)", pattern,
               mt_model_moe_device_sizes(m, &why), dev, why);
    reset();
    (void)mt_model_moe_load(m);
    *load_copies = g_d2h + g_h2d;
    mt_model_destroy(&ctx, m);
    return c;
}

int main(void)
{
    g_cpu = mt_ops_cpu();
    struct mt_ops_i ops = *g_cpu;
    ops.copy_to_host = count_to_host;
    ops.copy_from_host = count_from_host;
    long lc = 0;
    struct counts a = run(&ops, "AAA", 0, &lc), e1 = run(&ops, "AAE", 0, &lc), e2 = run(&ops, "AEE", 0, &lc);
    EXPECT(lc == 1, "host sizes: reading the load histogram (counted on the backend) is one copy (%ld)", lc);
    long lf_d2h = e2.fd2h - e1.fd2h, lf_h2d = e2.fh2d - e1.fh2d, lf_bytes = e2.fd2h_bytes - e1.fd2h_bytes;
    long lb_d2h = e2.bd2h - e1.bd2h, lb_h2d = e2.bh2d - e1.bh2d;
    long once_d2h = e1.fd2h - a.fd2h - lf_d2h, once_h2d = e1.fh2d - a.fh2d - lf_h2d;
    printf("per MoE layer, forward:  %ld device-to-host (%ld bytes with its aux/z share), %ld host-to-device\n",
           lf_d2h, lf_bytes, lf_h2d);
    printf("per MoE layer, backward: %ld device-to-host, %ld host-to-device\n", lb_d2h, lb_h2d);
    printf("per forward (all MoE layers): %ld device-to-host, %ld host-to-device\n", once_d2h, once_h2d);
    printf("per backward (all MoE layers): %ld device-to-host, %ld host-to-device\n", e1.bd2h - a.bd2h - lb_d2h,
           e1.bh2d - a.bh2d - lb_h2d);
    /* bytes: the E+1 offsets, and the layer's 2 doubles of the one per-forward copy of the sums */
    EXPECT(lf_d2h == 1 && lf_bytes == (long)((E + 1) * sizeof(int32_t) + 2 * sizeof(double)),
           "an MoE layer's forward copies only the E+1 offsets to the host (%ld copies, %ld bytes)", lf_d2h, lf_bytes);
    EXPECT(lf_h2d == 0, "an MoE layer's forward copies nothing to the backend (%ld)", lf_h2d);
    EXPECT(lb_d2h == 0 && lb_h2d == 0, "an MoE layer's backward copies nothing (%ld to host, %ld to backend)", lb_d2h,
           lb_h2d);
    EXPECT(once_d2h == 1 && once_h2d == 0, "the aux/z sums: one copy per forward (%ld, %ld)", once_d2h, once_h2d);
    EXPECT(e1.bd2h - a.bd2h - lb_d2h == 0 && e1.bh2d - a.bh2d - lb_h2d == 0, "no per-backward MoE copies");
    /* device sizes: nothing crosses in an MoE layer; the histogram once when read */
    struct counts da = run(&ops, "AAA", 1, &lc), d1 = run(&ops, "AAE", 1, &lc), d2 = run(&ops, "AEE", 1, &lc);
    printf("device sizes: per MoE layer forward %ld / backward %ld device-to-host, %ld / %ld host-to-device; "
           "one read of the load histogram: %ld copies\n",
           d2.fd2h - d1.fd2h, d2.bd2h - d1.bd2h, d2.fh2d - d1.fh2d, d2.bh2d - d1.bh2d, lc);
    EXPECT(d2.fd2h - d1.fd2h == 0 && d2.fh2d - d1.fh2d == 0 && d2.bd2h - d1.bd2h == 0 && d2.bh2d - d1.bh2d == 0,
           "device sizes: an MoE layer copies nothing, forward or backward");
    EXPECT(d1.fd2h - da.fd2h == 1 && d1.bd2h == da.bd2h, "device sizes: the aux/z sums stay one copy per forward");
    EXPECT(lc == 1, "device sizes: reading the load histogram is one copy (%ld)", lc);
    printf("test_moe_copies: %s\n", n_fail ? "FAILED" : "ok");
    fflush(stdout);
    return n_fail ? 1 : 0;
}
