/*
 * ops_cpu.c — the cpu backend's kernel table (OpenBLAS + OpenMP), its BLAS
 * information for the receipt, thread control, and the OpenBLAS core-type pin.
 *
 * Invariant: the table is a constant; the only process state touched here is
 * the environment (before OpenBLAS loads, via re-exec) and the OpenMP/OpenBLAS
 * thread counts.
 */
#define _GNU_SOURCE
#include "../mt_ops.h"
#include "cpu_impl.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *cpu_buf_alloc(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket)
{
    return mt_alloc(ctx, bytes, bucket);
}

static void cpu_buf_free(struct mt_ctx *ctx, void *p)
{
    mt_free(ctx, p);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memcpy(dst, src, bytes);
}

static void cpu_sync(void)
{
}

static const struct mt_ops_i cpu_ops = {
    /* .name                 = */ .name                 = "cpu",
    /* .buf_alloc            = */ .buf_alloc            = cpu_buf_alloc,
    /* .buf_free             = */ .buf_free             = cpu_buf_free,
    /* .copy_to_host         = */ .copy_to_host         = cpu_copy,
    /* .copy_from_host       = */ .copy_from_host       = cpu_copy,
    /* .copy                 = */ .copy                 = cpu_copy,
    /* .sync                 = */ .sync                 = cpu_sync,
    /* .fill                 = */ .fill                 = mt_cpu_fill,
    /* .axpby                = */ .axpby                = mt_cpu_axpby,
    /* .sumsq                = */ .sumsq                = mt_cpu_sumsq,
    /* .all_finite           = */ .all_finite           = mt_cpu_all_finite,
    /* .gemm                 = */ .gemm                 = mt_cpu_gemm,
    /* .embed_forward        = */ .embed_forward        = mt_cpu_embed_forward,
    /* .embed_backward       = */ .embed_backward       = mt_cpu_embed_backward,
    /* .rmsnorm_forward      = */ .rmsnorm_forward      = mt_cpu_rmsnorm_forward,
    /* .rmsnorm_backward     = */ .rmsnorm_backward     = mt_cpu_rmsnorm_backward,
    /* .rope_forward         = */ .rope_forward         = mt_cpu_rope_forward,
    /* .rope_backward        = */ .rope_backward        = mt_cpu_rope_backward,
    /* .attention_forward    = */ .attention_forward    = mt_cpu_attention_forward,
    /* .attention_backward   = */ .attention_backward   = mt_cpu_attention_backward,
    /* .swiglu_forward       = */ .swiglu_forward       = mt_cpu_swiglu_forward,
    /* .swiglu_backward      = */ .swiglu_backward      = mt_cpu_swiglu_backward,
    /* .xent_forward         = */ .xent_forward         = mt_cpu_xent_forward,
    /* .xent_backward        = */ .xent_backward        = mt_cpu_xent_backward,
    /* .router_forward       = */ .router_forward       = mt_cpu_router_forward,
    /* .router_backward      = */ .router_backward      = mt_cpu_router_backward,
    /* .moe_permute          = */ .moe_permute          = mt_cpu_moe_permute,
    /* .moe_permute_backward = */ .moe_permute_backward = mt_cpu_moe_permute_backward,
    /* .moe_combine          = */ .moe_combine          = mt_cpu_moe_combine,
    /* .moe_combine_backward = */ .moe_combine_backward = mt_cpu_moe_combine_backward,
    /* .adamw_update         = */ .adamw_update         = mt_cpu_adamw_update,
    /* .muon_momentum        = */ .muon_momentum        = mt_cpu_muon_momentum,
    /* .transpose            = */ .transpose            = mt_cpu_transpose,
    /* .ssm_scan_forward     = */ .ssm_scan_forward     = mt_cpu_ssm_scan_forward,
    /* .ssm_scan_backward    = */ .ssm_scan_backward    = mt_cpu_ssm_scan_backward,
    /* .ssm_prep_forward     = */ .ssm_prep_forward     = mt_cpu_ssm_prep_forward,
    /* .ssm_prep_backward    = */ .ssm_prep_backward    = mt_cpu_ssm_prep_backward,
    /* .ssm_gate_norm_fwd    = */ .ssm_gate_norm_forward  = mt_cpu_ssm_gate_norm_forward,
    /* .ssm_gate_norm_bwd    = */ .ssm_gate_norm_backward = mt_cpu_ssm_gate_norm_backward,
    /* .ssm_scan_step        = */ .ssm_scan_step        = mt_cpu_ssm_scan_step,
};

const struct mt_ops_i *mt_ops_cpu(void)
{
    return &cpu_ops;
}

/* blas = "OpenBLAS <version> (<openmp|pthread>)" from openblas_get_config(),
 * whose text is "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... USE_OPENMP ...". */
void mt_ops_cpu_info(struct mt_ops_cpu_info *info)
{
    memset(info, 0, sizeof(*info));
    const char *cfg = openblas_get_config();
    char ver[32] = "?";
    if (cfg && sscanf(cfg, "OpenBLAS %31s", ver) != 1) snprintf(ver, sizeof(ver), "?");
    snprintf(info->blas, sizeof(info->blas), "OpenBLAS %s (%s)", ver,
             cfg && strstr(cfg, "USE_OPENMP") ? "openmp" : "pthread");
    const char *core = openblas_get_corename();
    snprintf(info->coretype, sizeof(info->coretype), "%s", core ? core : "?");
    const char *src = getenv("MT_CORETYPE_SOURCE");
    if (src)
        snprintf(info->coretype_source, sizeof(info->coretype_source), "%s", src);
    else if (getenv("OPENBLAS_CORETYPE"))
        snprintf(info->coretype_source, sizeof(info->coretype_source), "user env OPENBLAS_CORETYPE");
    else
        snprintf(info->coretype_source, sizeof(info->coretype_source), "openblas auto-detect");
    info->threads = omp_get_max_threads();
}

void mt_ops_cpu_set_threads(int n)
{
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

/*
 * Core-type choice. Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) ships these
 * AVX-512 kernel sets: SKYLAKEX and COOPERLAKE (no SAPPHIRERAPIDS: asking for
 * it loads Cooperlake). On this project's Sapphire Rapids-class machine its
 * auto-detection picks SkylakeX; on other recent cores it may pick Haswell
 * (AVX2, measured 2/3 of the speed). bench/sgemm_roof, 2 threads, square
 * 2048-4096, best of 5 (GFLOP/s, two runs each):
 *     HASWELL 219.8 / 214.2   SKYLAKEX 331.1 / 337.3   COOPERLAKE 338.8 / 342.9
 * COOPERLAKE is the fastest (its sgemm kernel is SkylakeX's; it adds BF16),
 * so it is chosen when the CPU has avx512_bf16, SKYLAKEX otherwise.
 */
void mt_ops_cpu_pin_coretype(int argc, char **argv)
{
    (void)argc;
    if (getenv("OPENBLAS_CORETYPE") || getenv("MT_NO_REEXEC")) return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return;
    const char *core = __builtin_cpu_supports("avx512bf16") ? "COOPERLAKE" : "SKYLAKEX";
    char why[96];
    snprintf(why, sizeof(why), "OPENBLAS_CORETYPE=%s set by meshtrain (avx512 cpu)", core);
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0 || setenv("MT_CORETYPE_SOURCE", why, 1) != 0) {
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("MT_CORETYPE_SOURCE");
        return;
    }
    execv("/proc/self/exe", argv);
    /* re-exec failed: OpenBLAS keeps what it detected; do not claim a pin */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("MT_CORETYPE_SOURCE");
}
