/*
 * ops.c — choosing a backend by name, and the backend lookup that does not
 * depend on a backend being built.
 *
 * Invariant: without MT_WITH_CUDA, mt_ops_cuda() always returns NULL and
 * says why; with it, src/ops/cuda/ provides the real mt_ops_cuda(). This
 * file and the backends are the only places that know the backends' names
 * or test MT_WITH_CUDA (scripts/check_layers.py keeps it so): everything
 * else asks the table (mt_ops.h, "backend facts").
 */
#include "mt_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/mt_knobs.h"
#ifdef MT_WITH_CUDA
#include "cuda/mt_ops_cuda.h"
#endif

#ifndef MT_WITH_CUDA
const struct mt_ops_i *mt_ops_cuda(char *why, size_t why_len)
{
    if (why && why_len) snprintf(why, why_len, "built without CUDA");
    return NULL;
}
#endif

int mt_ops_built(const char *name)
{
    if (!strcmp(name, "cpu")) return 1;
#ifdef MT_WITH_CUDA
    if (!strcmp(name, "cuda")) return 1;
#endif
    return 0;
}

int mt_ops_local_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

enum mt_status mt_ops_by_name(struct mt_ctx *ctx, const char *name, const struct mt_ops_i **ops)
{
    *ops = NULL;
    if (!strcmp(name, "cpu")) {
        *ops = mt_ops_cpu();
        return MT_OK;
    }
    if (strcmp(name, "cuda"))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "backend '%s' is unknown (cpu or cuda)", name);
    /* a bad MT_* alias is bad input (exit 2), not a missing device: the
     * backend reads its tunables' aliases at creation */
    MT_CHECK(mt_knobs_check_env(ctx));
    char why[200] = "";
#ifdef MT_WITH_CUDA
    /* one GPU per process: bind the node-local rank's device before the
     * backend initialises on the current one (a no-op on one device) */
    (void)mt_ops_cuda_use_device(mt_ops_local_rank());
#endif
    const struct mt_ops_i *t = mt_ops_cuda(why, sizeof why);
    if (!t)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "backend 'cuda' is not available: %s (use backend=cpu)", why);
#ifdef MT_WITH_CUDA
    /* the backend's tunables (its list) that a run's config or command line set */
    const int *ck;
    const int nk = mt_ops_cuda_knobs(&ck);
    for (int i = 0; i < nk; i++) {
        const enum mt_knob_id id = (enum mt_knob_id)ck[i];
        if (mt_knob_source(ctx, id) < MT_KNOB_CONFIG) continue;
        const char *v = mt_knob_str(ctx, id), *knob = mt_knob_def(id)->name;
        const enum mt_status st = mt_ops_cuda_set_knob_of(t->be, ck[i], v);
        if (st == MT_ERR_UNSUPPORTED && (id == MT_KNOB_ATTN_KERNEL || id == MT_KNOB_GROUPED_GEMM_KERNEL))
            return mt_ctx_error(ctx, st, "%s=%s needs wgmma: this build's sm_90a device code on an sm_90 "
                                         "device (H100/H200)", knob, v);
        if (st != MT_OK) return mt_ctx_error(ctx, st, "knob %s=%s: refused by the cuda backend", knob, v);
    }
#endif
    *ops = t;
    return MT_OK;
}
