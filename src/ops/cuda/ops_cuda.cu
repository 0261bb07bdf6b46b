/*
 * ops_cuda.cu — the cuda backend's kernel table, its one-time initialisation
 * (device check, stream, cuBLAS and cuBLASLt handles, the GEMM precision,
 * reduction scratch), the sticky error and the workspace.
 *
 * Invariant: mt_ops_cuda() / mt_ops_cuda_create() return a table only when
 * its instance is fully initialised (`ready`); every entry of that table
 * binds the instance (MT_CUDA_BIND) and queues work on its stream in call
 * order, so one stream orders all kernels, copies and GEMMs of one instance.
 */
#include "cuda_impl.cuh"

extern "C" {
#include "../../core/mt_knobs.h"   /* the tunables' aliases, defaults and rules */
}

#include <stdio.h>
#include <string.h>
#include <type_traits>

/* The instance the current call acts on: every entry sets it from its `be`
 * on entry (MT_CUDA_BIND), so it carries no choice from one call to the
 * next; thread-local so that two host threads may drive two instances. */
thread_local struct mt_cuda_backend *mt_cuda_be;
/* The default instance (mt_ops_cuda()), NULL before it and after shutdown:
 * what the instance-less queries (mt_ops_cuda_status(), ...) report on. The
 * one process-wide pointer left; it holds no state of its own. */
static struct mt_cuda_backend *cuda_default;

int mt_cuda_record(enum mt_status st, const char *call, const char *reason, const char *file, int line)
{
    mt_cuda_be->n_errors++;
    if (mt_cuda_be->err == MT_OK) {
        const char *base = strrchr(file, '/');
        mt_cuda_be->err = st;
        snprintf(mt_cuda_be->errmsg, sizeof mt_cuda_be->errmsg, "%s:%d: %s: %s", base ? base + 1 : file, line,
                 call, reason ? reason : "?");
    }
    return 0;
}

void *mt_cuda_workspace(size_t bytes)
{
    if (bytes <= mt_cuda_be->ws_bytes) return mt_cuda_be->ws;
    size_t want = bytes + bytes / 4;  /* grow by 25% more than asked: fewer regrowths */
    want = (want + 255) & ~(size_t)255;
    if (mt_cuda_be->ws) {
        /* cudaFree waits for the device: no queued kernel still reads the old buffer */
        MT_CUDA_CHECK(mt_cuda_free(mt_cuda_be->ws));
        mt_cuda_be->ws = NULL;
        mt_cuda_be->ws_bytes = 0;
        mt_cuda_be->info.workspace_bytes = MT_CUDA_LT_WS_BYTES;
    }
    void *p = NULL;
    mt_cuda_be->ctr.ws_grows++;
    cudaError_t e = mt_cuda_malloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  /* an OOM from cudaMalloc is not sticky in CUDA: clear it */
        char why[96];
        snprintf(why, sizeof why, "workspace of %zu bytes: %s", want, cudaGetErrorString(e));
        mt_cuda_record(MT_ERR_OOM, "cudaMalloc", why, __FILE__, __LINE__);
        return NULL;
    }
    mt_cuda_be->ws = p;
    mt_cuda_be->ws_bytes = want;
    mt_cuda_be->info.workspace_bytes = MT_CUDA_LT_WS_BYTES + want;
    mt_cuda_note_mem();
    return p;
}

/* a kernel's name as one word: MT_LAUNCH's text without the parentheses and
 * spaces of "(attn_v2_fwd_k<HD, MW>)", as the launch log and the profile's
 * labels both give it (so tests/cuda/prof_check.py can match them) */
static void kernel_word(char *dst, size_t cap, const char *name)
{
    size_t n = 0;
    for (const char *c = name; *c && n + 1 < cap; c++)
        if (*c != ' ' && *c != '(' && *c != ')') dst[n++] = *c;
    dst[n] = 0;
}

/* ---- counters and the launch log (cuda_impl.cuh, docs/cuda.md) ---- */
/* the launch log's "op KIND ENTRY": the table entry running and its profile kind, or "- -" */
static const char *log_kind(const struct mt_cuda_backend *B)
{
    return B->cur_entry ? mt_ops_profile_kind_name((enum mt_op_kind)B->cur_kind) : "-";
}
static const char *log_entry(const struct mt_cuda_backend *B) { return B->cur_entry ? B->cur_entry : "-"; }

void mt_cuda_note_launch(const char *name, dim3 grid, dim3 block, size_t smem)
{
    mt_cuda_be->ctr.launches++;
    if (!mt_cuda_be->launch_log) return;
    const unsigned long long threads =
        (unsigned long long)grid.x * grid.y * grid.z * (unsigned long long)block.x * block.y * block.z;
    char word[128];
    kernel_word(word, sizeof word, name);
    const struct mt_cuda_backend *B = mt_cuda_be;
    fprintf(B->launch_log, "launch %s grid %u %u %u block %u %u %u threads %llu smem %zu op %s %s\n", word, grid.x,
            grid.y, grid.z, block.x, block.y, block.z, threads, smem, log_kind(B), log_entry(B));
}

/* a copy, memset, sync or allocation: "WHAT BYTES op KIND ENTRY" (the entry it ran in, or "- -") */
void mt_cuda_log_op(const char *what, size_t bytes)
{
    fprintf(mt_cuda_be->launch_log, "%s %zu op %s %s\n", what, bytes, log_kind(mt_cuda_be), log_entry(mt_cuda_be));
}

/* ---- the per-op profile: event pairs (HOW IT WORKS) ----
 * While mt_ops_profile_enabled() (the trainer's step loop), each table
 * call of the wrapped entries records event 2i on the stream, runs the
 * entry, records event 2i+1, and remembers the op kind; nothing waits.
 * At the step's end mark (profile_step(be, 1), after the trainer's sync,
 * so every event has completed) the pairs' elapsed times are added to the
 * kinds with mt_ops_profile_add — once per step, no wait per op. Time
 * between pairs (host work, launch gaps, waits for the host) is not in any
 * pair: the receipt's "other". The pool grows (doubling) at the first
 * steps and is reused after; events are not device allocations. Off (the
 * profile disabled) a wrapper is one call and one branch. */
static int prof_grow(struct mt_cuda_backend *B)
{
    int cap = B->prof_cap ? 2 * B->prof_cap : 256;
    if (cap > (1 << 20)) return 0;
    cudaEvent_t *ev = (cudaEvent_t *)realloc(B->prof_ev, 2 * (size_t)cap * sizeof *ev);
    if (!ev) return 0;
    B->prof_ev = ev;
    unsigned char *kind = (unsigned char *)realloc(B->prof_kind, (size_t)cap);
    if (!kind) return 0;
    B->prof_kind = kind;
    const char **name = (const char **)realloc(B->prof_name, (size_t)cap * sizeof *name);
    if (!name) return 0;
    B->prof_name = name;
    for (int i = 2 * B->prof_cap; i < 2 * cap; i++)
        if (!MT_CUDA_OK(cudaEventCreate(&B->prof_ev[i]))) {
            for (int j = 2 * B->prof_cap; j < i; j++) cudaEventDestroy(B->prof_ev[j]);
            return 0;
        }
    B->prof_cap = cap;
    return 1;
}

/* kind of a per-launch pair: its time goes to the by-entry list only (the
 * table entry around it already counts it in its kind) */
#define PROF_KERNEL 0xff

/* record the start of a pair; -1: not recorded (counted as dropped) */
static int prof_begin(struct mt_cuda_backend *B, enum mt_op_kind kind, const char *name)
{
    if (B->prof_n == B->prof_cap && !prof_grow(B)) {
        B->prof_dropped++;
        return -1;
    }
    int i = B->prof_n++;
    B->prof_kind[i] = (unsigned char)(kind == (enum mt_op_kind)PROF_KERNEL ? kind : mt_ops_profile_kind(kind));
    B->prof_name[i] = name;
    MT_CUDA_CHECK(cudaEventRecord(B->prof_ev[2 * i], B->stream));
    return i;
}

static void prof_end(struct mt_cuda_backend *B, int i)
{
    if (i >= 0) MT_CUDA_CHECK(cudaEventRecord(B->prof_ev[2 * i + 1], B->stream));
}



/* the label "kernel:NAME" of a kernel, made once; NULL-safe fallback */
static const char *kprof_label(struct mt_cuda_backend *B, const char *kern)
{
    for (int i = 0; i < B->kprof_n; i++)
        if (B->kprof_label[i].kern == kern) return B->kprof_label[i].label;
    if (B->kprof_n == MT_CUDA_KPROF_NAMES) return "kernel:(more)";
    size_t n = strlen(kern) + 8;
    char *l = (char *)malloc(n);
    if (!l) return "kernel:(more)";
    memcpy(l, "kernel:", 7);
    kernel_word(l + 7, n - 7, kern);
    B->kprof_label[B->kprof_n].kern = kern;
    B->kprof_label[B->kprof_n].label = l;
    B->kprof_n++;
    return l;
}

int mt_cuda_kprof_begin(const char *kern)
{
    struct mt_cuda_backend *B = mt_cuda_be;
    if (!mt_ops_profile_enabled() || !B->info.op_profile || B->graph.active) return -1;
    return prof_begin(B, (enum mt_op_kind)PROF_KERNEL, kprof_label(B, kern));
}

void mt_cuda_kprof_end(int i) { prof_end(mt_cuda_be, i); }

/* Add the recorded pairs to the profile and forget them. */
static void prof_resolve(struct mt_cuda_backend *B)
{
    if (B->prof_n == 0) return;
    /* after the step's sync every event has completed: this returns at once */
    MT_CUDA_CHECK(cudaEventSynchronize(B->prof_ev[2 * B->prof_n - 1]));
    for (int i = 0; i < B->prof_n; i++) {
        float ms = 0;
        if (MT_CUDA_OK(cudaEventElapsedTime(&ms, B->prof_ev[2 * i], B->prof_ev[2 * i + 1])))
        {
            if (B->prof_kind[i] != PROF_KERNEL) mt_ops_profile_add((enum mt_op_kind)B->prof_kind[i], 1e-3 * (double)ms);
            mt_ops_profile_add_entry(B->prof_name[i], 1e-3 * (double)ms);
        }
    }
    B->prof_n = 0;
}

/* The table entry running, for the launch log (cur_entry, cur_kind): set
 * while a wrapped entry runs, the outer one's restored after (an entry that
 * calls another through the table logs the inner one's launches as its). */
struct entry_scope {
    struct mt_cuda_backend *B;
    const char *entry;
    int kind;
    entry_scope(void *be, enum mt_op_kind k, const char *name) : B((struct mt_cuda_backend *)be)
    {
        if (!B) return;
        entry = B->cur_entry, kind = B->cur_kind;
        B->cur_entry = name, B->cur_kind = (int)mt_ops_profile_kind(k);   /* the optimizer's scope too */
    }
    ~entry_scope()
    {
        if (B) B->cur_entry = entry, B->cur_kind = kind;
    }
};

/* One entry wrapped: prof<KIND, fn>::call has fn's signature. */
template <enum mt_op_kind K, auto F> struct prof;
template <enum mt_op_kind K, typename R, typename... A, R (*F)(void *, A...)>
struct prof<K, F> {
    static inline const char *name = "?";   /* the entry's function, set by prof_named */
    static R call(void *be, A... a)
    {
        struct mt_cuda_backend *B = (struct mt_cuda_backend *)be;
        const entry_scope in_entry(be ? be : (void *)mt_cuda_be, K, name);
        /* graphs active: no event pairs (a capture would take them in; a replayed op runs in its graph) */
        if (!mt_ops_profile_enabled() || !B->info.op_profile || B->graph.active) return F(be, a...);
        MT_CUDA_BIND(be);   /* prof_begin may record a sticky error on this instance */
        const int i = prof_begin(B, K, name);
        if constexpr (std::is_void_v<R>) {
            F(be, a...);
            prof_end(B, i);
        } else {
            R r = F(be, a...);
            prof_end(B, i);
            return r;
        }
    }
};
/* the wrapper of fn, named fn for the per-entry profile (the table's
 * initialiser runs this once at startup) */
template <enum mt_op_kind K, auto F> static auto prof_named(const char *name)
{
    prof<K, F>::name = name;
    return &prof<K, F>::call;
}
#define PROF(kind, fn) (prof_named<kind, fn>(#fn))

/* The trainer's step marks (mt_ops.h profile_step): counters since the
 * begin mark are the step's; the end mark resolves the step's events. */
static void cuda_profile_step(void *be, int end)
{
    struct mt_cuda_backend *B = (struct mt_cuda_backend *)be;
    MT_CUDA_BIND(be);
    if (!end) {
        B->ctr_at_begin = B->ctr;
        if (B->launch_log) fprintf(B->launch_log, "step %d begin\n", B->n_steps);
        mt_cuda_graph_step_mark(0);
        return;
    }
    mt_cuda_graph_step_mark(1);
    prof_resolve(B);
    if (B->n_steps < MT_CUDA_STEP_LOG) {
        struct mt_ops_cuda_counters *d = &B->step_ctr[B->n_steps];
        const struct mt_ops_cuda_counters *a = &B->ctr_at_begin, *b = &B->ctr;
        d->launches = b->launches - a->launches;
        d->blas_calls = b->blas_calls - a->blas_calls;
        d->memsets = b->memsets - a->memsets;
        d->h2d = b->h2d - a->h2d;
        d->d2h = b->d2h - a->d2h;
        d->d2d = b->d2d - a->d2d;
        d->h2d_bytes = b->h2d_bytes - a->h2d_bytes;
        d->d2h_bytes = b->d2h_bytes - a->d2h_bytes;
        d->d2d_bytes = b->d2d_bytes - a->d2d_bytes;
        d->syncs = b->syncs - a->syncs;
        d->allocs = b->allocs - a->allocs;
        d->frees = b->frees - a->frees;
        d->ws_grows = b->ws_grows - a->ws_grows;
        d->graph_launches = b->graph_launches - a->graph_launches;
        d->graph_ops = b->graph_ops - a->graph_ops;
        d->plan_builds = b->plan_builds - a->plan_builds;
    }
    if (B->launch_log) {
        fprintf(B->launch_log, "step %d end\n", B->n_steps);
        fflush(B->launch_log);
    }
    B->n_steps++;
}

/* backend facts (mt_ops.h): the GEMM precision as an element type, and
 * whether the event pairs time the entries (MT_CUDA_OP_PROFILE; read from
 * the instance's info, which also notes the device memory as every info
 * query does) */
static enum mt_elem cuda_gemm_precision(void *be)
{
    return mt_ops_cuda_get_precision_of(be) == MT_CUDA_PRECISION_BF16 ? MT_ELEM_BF16 : MT_ELEM_F32;
}

static int cuda_op_profile(void *be, const char **how)
{
    *how = "cudaEvent pair around each ops-table call on the backend stream, resolved once per step; other = the "
           "step's wall time outside every op (host work, launch gaps, waits)";
    struct mt_ops_cuda_info in;
    return mt_ops_cuda_get_info_of(be, &in) == MT_OK && in.op_profile;
}

static struct mt_ops_i cuda_ops = {
    /* .name                 = */ .name                 = "cuda",
    /* .be                   = */ .be                   = NULL,   /* set by mt_ops_cuda() */
    /* .buf_alloc            = */ .buf_alloc            = mt_cuda_buf_alloc,
    /* .buf_free             = */ .buf_free             = mt_cuda_buf_free,
    /* .copy_to_host         = */ .copy_to_host         = mt_cuda_copy_to_host,
    /* .copy_from_host       = */ .copy_from_host       = mt_cuda_copy_from_host,
    /* .copy                 = */ .copy                 = PROF(MT_OPK_ELEMENTWISE, mt_cuda_copy),
    /* .sync                 = */ .sync                 = mt_cuda_sync,
    /* .fill                 = */ .fill                 = PROF(MT_OPK_ELEMENTWISE, mt_cuda_fill),
    /* .axpby                = */ .axpby                = PROF(MT_OPK_ELEMENTWISE, mt_cuda_axpby),
    /* .sumsq                = */ .sumsq                = PROF(MT_OPK_ELEMENTWISE, mt_cuda_sumsq),
    /* .all_finite           = */ .all_finite           = PROF(MT_OPK_ELEMENTWISE, mt_cuda_all_finite),
    /* .gemm                 = */ .gemm                 = PROF(MT_OPK_GEMM, mt_cuda_gemm),
    /* .gemm_grouped         = */ .gemm_grouped         = PROF(MT_OPK_GEMM, mt_cuda_gemm_grouped),
    /* .gemm_bf16            = */ .gemm_bf16            = PROF(MT_OPK_GEMM, mt_cuda_gemm_bf16),
    /* .gemm_bf16_out        = */ .gemm_bf16_out        = PROF(MT_OPK_GEMM, mt_cuda_gemm_bf16_out),
    /* .gemm_bf16_resid      = */ .gemm_bf16_resid      = PROF(MT_OPK_GEMM, mt_cuda_gemm_bf16_resid),
    /* .gemm_grouped_rows    = */ .gemm_grouped_rows    = PROF(MT_OPK_GEMM, mt_cuda_gemm_grouped_rows),
    /* .gemm_grouped_sum     = */ .gemm_grouped_sum     = PROF(MT_OPK_GEMM, mt_cuda_gemm_grouped_sum),
    /* .cast_bf16            = */ .cast_bf16            = PROF(MT_OPK_ELEMENTWISE, mt_cuda_cast_bf16),
    /* .gemm_bf16_batched    = */ .gemm_bf16_batched    = PROF(MT_OPK_GEMM, mt_cuda_gemm_bf16_batched),
    /* .embed_forward        = */ .embed_forward        = PROF(MT_OPK_ELEMENTWISE, mt_cuda_embed_forward),
    /* .embed_backward       = */ .embed_backward       = PROF(MT_OPK_ELEMENTWISE, mt_cuda_embed_backward),
    /* .rmsnorm_forward      = */ .rmsnorm_forward      = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_forward),
    /* .rmsnorm_backward     = */ .rmsnorm_backward     = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_backward),
    /* .rmsnorm_forward_bf16 = */ .rmsnorm_forward_bf16 = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_forward_bf16),
    /* .rope_forward         = */ .rope_forward         = PROF(MT_OPK_ELEMENTWISE, mt_cuda_rope_forward),
    /* .rope_backward        = */ .rope_backward        = PROF(MT_OPK_ELEMENTWISE, mt_cuda_rope_backward),
    /* .attention_forward    = */ .attention_forward    = PROF(MT_OPK_ATTENTION, mt_cuda_attention_forward),
    /* .attention_backward   = */ .attention_backward   = PROF(MT_OPK_ATTENTION_BWD, mt_cuda_attention_backward),
    /* .swiglu_forward       = */ .swiglu_forward       = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_forward),
    /* .swiglu_backward      = */ .swiglu_backward      = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_backward),
    /* .xent_forward         = */ .xent_forward         = PROF(MT_OPK_XENT, mt_cuda_xent_forward),
    /* .xent_backward        = */ .xent_backward        = PROF(MT_OPK_XENT, mt_cuda_xent_backward),
    /* .router_forward       = */ .router_forward       = PROF(MT_OPK_ELEMENTWISE, mt_cuda_router_forward),
    /* .router_backward      = */ .router_backward      = PROF(MT_OPK_ELEMENTWISE, mt_cuda_router_backward),
    /* .moe_permute          = */ .moe_permute          = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_permute),
    /* .moe_permute_backward = */ .moe_permute_backward = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_permute_backward),
    /* .moe_combine          = */ .moe_combine          = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_combine),
    /* .moe_combine_backward = */ .moe_combine_backward = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_combine_backward),
    /* .moe_permute_bf16     = */ .moe_permute_bf16     = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_permute_bf16),
    /* .moe_combine_backward_bf16 = */ .moe_combine_backward_bf16 = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_combine_backward_bf16),
    /* .adamw_update         = */ .adamw_update         = PROF(MT_OPK_OPTIMIZER, mt_cuda_adamw_update),
    /* .muon_momentum        = */ .muon_momentum        = PROF(MT_OPK_OPTIMIZER, mt_cuda_muon_momentum),
    /* .transpose            = */ .transpose            = PROF(MT_OPK_GEMM, mt_cuda_transpose),
    /* .ssm_scan_forward     = */ .ssm_scan_forward     = PROF(MT_OPK_SCAN, mt_cuda_ssm_scan_forward),
    /* .ssm_scan_backward    = */ .ssm_scan_backward    = PROF(MT_OPK_SCAN, mt_cuda_ssm_scan_backward),
    /* .ssm_prep_forward     = */ .ssm_prep_forward     = PROF(MT_OPK_ELEMENTWISE, mt_cuda_ssm_prep_forward),
    /* .ssm_prep_backward    = */ .ssm_prep_backward    = PROF(MT_OPK_ELEMENTWISE, mt_cuda_ssm_prep_backward),
    /* .ssm_gate_norm_fwd    = */ .ssm_gate_norm_forward  = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_forward),
    /* .ssm_gate_norm_bwd    = */ .ssm_gate_norm_backward = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_backward),
    /* .ssm_scan_step        = */ .ssm_scan_step        = PROF(MT_OPK_SCAN, mt_cuda_ssm_scan_step),
    /* .xent_fused           = */ .xent_fused           = PROF(MT_OPK_XENT, mt_cuda_xent_fused),
    /* .rmsnorm_resid_forward = */ .rmsnorm_resid_forward = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_resid_forward),
    /* .qk_norm_rope_forward  = */ .qk_norm_rope_forward  = PROF(MT_OPK_NORM, mt_cuda_qk_norm_rope_forward),
    /* .qk_norm_rope_backward = */ .qk_norm_rope_backward = PROF(MT_OPK_NORM, mt_cuda_qk_norm_rope_backward),
    /* .rmsnorm_resid_forward_bf16 = */ .rmsnorm_resid_forward_bf16 = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_resid_forward_bf16),
    /* .swiglu_forward_bf16        = */ .swiglu_forward_bf16        = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_forward_bf16),
    /* .qk_norm_rope_forward_bf16 = */ .qk_norm_rope_forward_bf16 = PROF(MT_OPK_NORM, mt_cuda_qk_norm_rope_forward_bf16),
    /* .qk_norm_rope_backward_bf16 = */ .qk_norm_rope_backward_bf16 = PROF(MT_OPK_NORM, mt_cuda_qk_norm_rope_backward_bf16),
    /* .rmsnorm_backward_bf16 = */ .rmsnorm_backward_bf16 = PROF(MT_OPK_NORM, mt_cuda_rmsnorm_backward_bf16),
    /* .swiglu_backward_bf16       = */ .swiglu_backward_bf16       = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_backward_bf16),
    /* .swiglu_backward_act_bf16   = */ .swiglu_backward_act_bf16   = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_backward_act_bf16),
    /* .swiglu_forward_bf16_gu     = */ .swiglu_forward_bf16_gu     = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_forward_bf16_gu),
    /* .swiglu_backward_act_bf16_gu= */ .swiglu_backward_act_bf16_gu = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_backward_act_bf16_gu),
    /* .swiglu_backward_act_bf16_gud= */ .swiglu_backward_act_bf16_gud = PROF(MT_OPK_ELEMENTWISE, mt_cuda_swiglu_backward_act_bf16_gud),
    /* .widen_bf16                 = */ .widen_bf16                 = PROF(MT_OPK_ELEMENTWISE, mt_cuda_widen_bf16),
    /* .attention_forward_bf16     = */ .attention_forward_bf16     = PROF(MT_OPK_ATTENTION, mt_cuda_attention_forward_bf16),
    /* .attention_backward_bf16    = */ .attention_backward_bf16    = PROF(MT_OPK_ATTENTION_BWD, mt_cuda_attention_backward_bf16),
    /* .ssm_scan_forward_bf16      = */ .ssm_scan_forward_bf16      = PROF(MT_OPK_SCAN, mt_cuda_ssm_scan_forward_bf16),
    /* .ssm_scan_backward_bf16     = */ .ssm_scan_backward_bf16     = PROF(MT_OPK_SCAN, mt_cuda_ssm_scan_backward_bf16),
    /* MoE device routing */
    /* .moe_count_acc              = */ .moe_count_acc              = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_count_acc),
    /* .moe_route                  = */ .moe_route                  = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_route),
    /* .moe_seq_stats              = */ .moe_seq_stats              = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_seq_stats),
    /* .moe_aux_loss               = */ .moe_aux_loss               = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_aux_loss),
    /* .moe_aux_backward           = */ .moe_aux_backward           = PROF(MT_OPK_ELEMENTWISE, mt_cuda_moe_aux_backward),
    /* .profile_step               = */ .profile_step               = cuda_profile_step,
    /* lm head: the bf16 twin of dlogits */
    /* .xent_fused_bf16            = */ .xent_fused_bf16            = PROF(MT_OPK_XENT, mt_cuda_xent_fused_bf16),
    /* .xent_fused_bf16_logits     = */ .xent_fused_bf16_logits     = PROF(MT_OPK_XENT, mt_cuda_xent_fused_bf16_logits),
    /* step synchronisation (issue 27 item 3) */
    /* .sumsq_multi                = */ .sumsq_multi                = PROF(MT_OPK_OPTIMIZER, mt_cuda_sumsq_multi),
    /* .normalize_fro              = */ .normalize_fro              = PROF(MT_OPK_ELEMENTWISE, mt_cuda_normalize_fro),
    /* .normalize_fro_bf16         = */ .normalize_fro_bf16         =
        PROF(MT_OPK_ELEMENTWISE, mt_cuda_normalize_fro_bf16),
    /* .axpby_from_bf16            = */ .axpby_from_bf16            = PROF(MT_OPK_ELEMENTWISE, mt_cuda_axpby_from_bf16),
    /* .muon_prep_bf16_multi       = */ .muon_prep_bf16_multi       =
        PROF(MT_OPK_OPTIMIZER, mt_cuda_muon_prep_bf16_multi),
    /* .axpby_from_bf16_multi      = */ .axpby_from_bf16_multi      =
        PROF(MT_OPK_OPTIMIZER, mt_cuda_axpby_from_bf16_multi),
    /* .adamw_multi                = */ .adamw_multi                = PROF(MT_OPK_OPTIMIZER, mt_cuda_adamw_multi),
    /* .nonfinite_mark             = */ .nonfinite_mark             = PROF(MT_OPK_ELEMENTWISE, mt_cuda_nonfinite_mark),
    /* .cast_bf16_multi            = */ .cast_bf16_multi            = PROF(MT_OPK_OPTIMIZER, mt_cuda_cast_bf16_multi),
    /* .init_normal                = */ .init_normal                = mt_cuda_init_normal,   /* setup: not timed */
    /* backend facts (issue 30 item 6): device memory, the instance's queries */
    /* .host_memory                = */ .host_memory                = 0,
    /* .status                     = */ .status                     = mt_ops_cuda_status_of,
    /* .device_info                = */ .device_info                = mt_ops_cuda_get_info_of,
    /* .step_counters              = */ .step_counters              = mt_ops_cuda_step_counters_of,
    /* .queue                      = */ .queue                      = mt_ops_cuda_stream_of,
    /* .gemm_precision             = */ .gemm_precision             = cuda_gemm_precision,
    /* .kernels_isa                = */ .kernels_isa                = NULL,
    /* .op_profile                 = */ .op_profile                 = cuda_op_profile,
    /* CUDA graphs of the step (issue 27 item 4) */
    /* .graph_mode                 = */ .graph_mode                 = mt_cuda_graph_mode,
    /* .graph_info                 = */ .graph_info                 = mt_ops_cuda_graph_info_of,
    /* ReDo scores (SPEC 1e) */
    /* .redo_score_acc             = */ .redo_score_acc             = PROF(MT_OPK_ELEMENTWISE, mt_cuda_redo_score_acc),
    /* Mixture-of-Depths routing (SPEC 1e) */
    /* .mod_route                  = */ .mod_route                  = PROF(MT_OPK_ELEMENTWISE, mt_cuda_mod_route),
    /* .mod_backward               = */ .mod_backward               = PROF(MT_OPK_ELEMENTWISE, mt_cuda_mod_backward),
    /* the gated norm over groups that span ranks (replicated Mamba-3 B/C under TP) */
    /* .ssm_gate_norm_sums         = */ .ssm_gate_norm_sums         = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_sums),
    /* .ssm_gate_norm_forward_ext  = */ .ssm_gate_norm_forward_ext  = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_forward_ext),
    /* .ssm_gate_norm_backward_ext = */ .ssm_gate_norm_backward_ext = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_backward_ext),
    /* .ssm_gate_norm_forward_bf16 = */ .ssm_gate_norm_forward_bf16 = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_forward_bf16),
    /* .ssm_gate_norm_backward_bf16 = */ .ssm_gate_norm_backward_bf16 = PROF(MT_OPK_NORM, mt_cuda_ssm_gate_norm_backward_bf16),
    /* .ssm_prep_backward_bf16     = */ .ssm_prep_backward_bf16     = PROF(MT_OPK_ELEMENTWISE, mt_cuda_ssm_prep_backward_bf16),
};

/* Undo a (partial) init: release what the bound instance holds and free it. */
static void release_state(void)
{
    if (!mt_cuda_be) return;
    mt_cuda_graph_release();
    mt_cuda_lt_plans_release();
    if (mt_cuda_be->lt) cublasLtDestroy(mt_cuda_be->lt);
    if (mt_cuda_be->lt_ws) cudaFree(mt_cuda_be->lt_ws);
    if (mt_cuda_be->blas) cublasDestroy(mt_cuda_be->blas);
    if (mt_cuda_be->red_partial) cudaFree(mt_cuda_be->red_partial);
    if (mt_cuda_be->red_flag) cudaFree(mt_cuda_be->red_flag);
    if (mt_cuda_be->ws) cudaFree(mt_cuda_be->ws);
    for (int i = 0; i < 2 * mt_cuda_be->prof_cap; i++) cudaEventDestroy(mt_cuda_be->prof_ev[i]);
    free(mt_cuda_be->prof_ev);
    free(mt_cuda_be->prof_kind);
    free(mt_cuda_be->prof_name);
    for (int i = 0; i < mt_cuda_be->kprof_n; i++) free(mt_cuda_be->kprof_label[i].label);
    mt_cuda_be->kprof_n = 0;
    if (mt_cuda_be->launch_log) fclose(mt_cuda_be->launch_log);
    if (mt_cuda_be->stream) cudaStreamDestroy(mt_cuda_be->stream);
    (void)cudaGetLastError();
    free(mt_cuda_be);
    mt_cuda_be = NULL;
}

static int init_fail(char *why, size_t why_len, const char *step, const char *reason)
{
    if (why && why_len) snprintf(why, why_len, "%s: %s", step, reason);
    release_state();
    return 0;
}

extern "C" const char *mt_ops_cuda_precision_name(enum mt_cuda_precision p)
{
    switch (p) {
    case MT_CUDA_PRECISION_FP32: return "fp32";
    case MT_CUDA_PRECISION_BF16: return "bf16";
    }
    return "?";
}

extern "C" enum mt_status mt_ops_cuda_precision_parse(const char *s, enum mt_cuda_precision *out)
{
    if (s && !strcmp(s, "fp32")) *out = MT_CUDA_PRECISION_FP32;
    else if (s && !strcmp(s, "bf16")) *out = MT_CUDA_PRECISION_BF16;
    else return MT_ERR_INVALID_ARG;
    return MT_OK;
}

static void set_precision(enum mt_cuda_precision p, const char *source)
{
    mt_cuda_be->precision = p;
    snprintf(mt_cuda_be->info.precision, sizeof mt_cuda_be->info.precision, "%s", mt_ops_cuda_precision_name(p));
    snprintf(mt_cuda_be->info.precision_source, sizeof mt_cuda_be->info.precision_source, "%s", source);
}

/* A tunable in whole MiB: `name` unset or empty -> dflt; else a number in
 * [lo, hi] (0 on a bad value, with the reason in why). */
/* "v1" .. "v5" -> 0 .. 4; -1 for anything else */
static int attn_kernel_parse(const char *s)
{
    return !strcmp(s, "v1") ? 0 : !strcmp(s, "v2") ? 1 : !strcmp(s, "v3") ? 2 : !strcmp(s, "v4") ? 3
         : !strcmp(s, "v5") ? 4 : -1;
}

static void set_attn_kernel(int v2)
{
    mt_cuda_be->attn_v2 = v2;
    static const char *const name[5] = {"v1", "v2", "v3", "v4", "v5"};
    snprintf(mt_cuda_be->info.attn_kernel, sizeof mt_cuda_be->info.attn_kernel, "%s", name[v2]);
}

/* One runtime tunable as the knob table has it (src/core/knobs.c): its MT_*
 * alias, else the default, checked by the table's own rule; NULL and
 * "ALIAS=value: what it accepts" in why when bad. */
static const char *tunable(enum mt_knob_id id, char *why, size_t why_len)
{
    const char *v = mt_knob_str(NULL, id);
    char r[96];
    if (mt_knob_value_ok(id, v, r, sizeof r)) return v;
    if (why && why_len) snprintf(why, why_len, "%s=%s: %s", mt_knob_def(id)->env, v, r);
    return NULL;
}

/* The runtime tunables, read once at creation from the knob table's aliases
 * (a run's --knob or config values are set afterwards, src/ops/ops.c):
 * cuda_precision (MT_CUDA_PRECISION), attn_kernel (MT_CUDA_ATTN_KERNEL),
 * attn_group_kib (MT_CUDA_ATTN_GROUP_KIB: the causal attention's block groups,
 * attn_sched.cuh; 0 = a third of the L2), grouped_gemm_bn (MT_CUDA_GG_BN),
 * bf16_scratch_mb (MT_CUDA_BF16_SCRATCH_MB) and attn_ds_mb (MT_CUDA_ATTN_DS_MB:
 * the bf16 attention backward's dS tiles; 0 = dQ always recomputes them). A
 * bad value refuses the table with the reason; src/ops/ops.c checks the
 * aliases first, so a run says "bad input" (exit 2), not "no device". */
/* the knobs the backend reads (enum mt_knob_id), in read_tunables' order: the one list (ops.c
 * applies a run's values of these, mt_ops_cuda_knobs; mt_ops_cuda_set_knob_of sets each) */
static const int cuda_knobs[] = {MT_KNOB_ATTN_GROUP_KIB, MT_KNOB_GROUPED_GEMM_BN, MT_KNOB_ATTN_KERNEL,
                                 MT_KNOB_CUDA_PRECISION, MT_KNOB_BF16_SCRATCH_MB, MT_KNOB_ATTN_DS_MB,
                                 MT_KNOB_GROUPED_GEMM_KERNEL};
#define N_CUDA_KNOBS ((int)(sizeof cuda_knobs / sizeof cuda_knobs[0]))

extern "C" int mt_ops_cuda_knobs(const int **knobs)
{
    *knobs = cuda_knobs;
    return N_CUDA_KNOBS;
}

static int read_tunables(char *why, size_t why_len, enum mt_cuda_precision *prec, const char **src, size_t *cap,
                         size_t *ds_cap, int *attn_v2, int *gg_bn, int *gg_wgmma, long long *group_kib)
{
    const char *v[N_CUDA_KNOBS];
    for (int i = 0; i < N_CUDA_KNOBS; i++)
        if (!(v[i] = tunable((enum mt_knob_id)cuda_knobs[i], why, why_len))) return 0;
    *group_kib = atoll(v[0]);
    *gg_bn = atoi(v[1]);
    *attn_v2 = attn_kernel_parse(v[2]);
    *src = mt_knob_source(NULL, MT_KNOB_CUDA_PRECISION) == MT_KNOB_ENV ? MT_CUDA_PRECISION_ENV : "default";
    *cap = (size_t)atoll(v[4]) << 20;
    *ds_cap = (size_t)atoll(v[5]) << 20;
    *gg_wgmma = !strcmp(v[6], "wgmma");
    return mt_ops_cuda_precision_parse(v[3], prec) == MT_OK && *attn_v2 >= 0;   /* the table's choices: always */
}

/* The receipt's device identity (struct mt_ops_cuda_info): UUID and PCI
 * address name the physical GPU, clocks and bus width its peak bandwidth
 * (2 x memory clock x bus width / 8: the memory is double data rate). A
 * query that fails leaves "" or -1 and is not an init failure. */
static void device_identity(struct mt_ops_cuda_info *in, const cudaDeviceProp *prop, int dev)
{
    const unsigned char *u = (const unsigned char *)prop->uuid.bytes;
    snprintf(in->uuid, sizeof in->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    if (cudaDeviceGetPCIBusId(in->pci_bus_id, (int)sizeof in->pci_bus_id, dev) != cudaSuccess) in->pci_bus_id[0] = 0;
    const struct { enum cudaDeviceAttr attr; int *out; } q[] = {
        {cudaDevAttrEccEnabled, &in->ecc_enabled},
        {cudaDevAttrClockRate, &in->sm_clock_khz},
        {cudaDevAttrMemoryClockRate, &in->mem_clock_khz},
        {cudaDevAttrGlobalMemoryBusWidth, &in->mem_bus_width_bits},
    };
    for (size_t k = 0; k < sizeof q / sizeof q[0]; k++)
        if (cudaDeviceGetAttribute(q[k].out, q[k].attr, dev) != cudaSuccess) *q[k].out = -1;
    (void)cudaGetLastError();   /* a failed query is not a sticky error of the backend */
}

static int init_state(char *why, size_t why_len)
{
    enum mt_cuda_precision prec;
    const char *prec_src;
    size_t cap, ds_cap;
    int attn_v2, gg_bn, gg_wgmma;
    long long group_kib;
    mt_cuda_be = NULL;   /* a failure below must release only the new instance */
    if (!read_tunables(why, why_len, &prec, &prec_src, &cap, &ds_cap, &attn_v2, &gg_bn, &gg_wgmma, &group_kib))
        return 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return init_fail(why, why_len, "no usable CUDA device (cudaGetDeviceCount)", cudaGetErrorString(e));
    }
    if (n < 1) return init_fail(why, why_len, "no CUDA device", "cudaGetDeviceCount returned 0");
    mt_cuda_be = (struct mt_cuda_backend *)calloc(1, sizeof *mt_cuda_be);
    if (!mt_cuda_be) return init_fail(why, why_len, "backend object", "out of host memory");
    mt_cuda_be->graph.captured_step = -1;
    int dev = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return init_fail(why, why_len, "cudaGetDevice", cudaGetErrorString(e));
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return init_fail(why, why_len, "cudaGetDeviceProperties", cudaGetErrorString(e));
    if (prop.major < 7)
        return init_fail(why, why_len, "device too old", "compute capability >= 7.0 required");
    mt_cuda_be->device = dev;
    struct mt_ops_cuda_info *in = &mt_cuda_be->info;
    snprintf(in->device, sizeof in->device, "%s", prop.name);
    in->ordinal = dev;
    in->cc_major = prop.major;
    in->cc_minor = prop.minor;
    in->sm_count = prop.multiProcessorCount;
    in->mem_total = prop.totalGlobalMem;
    cudaRuntimeGetVersion(&in->runtime_version);
    cudaDriverGetVersion(&in->driver_version);
    in->device_count = n;
    device_identity(in, &prop, dev);
    /* the largest dynamic shared memory a block may opt in to (xent.cu's ROW
     * kernel sizes itself by it; 48 KiB, the default limit, if unknown) */
    if (cudaDeviceGetAttribute(&mt_cuda_be->smem_optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        mt_cuda_be->smem_optin_bytes < 48 * 1024)
        mt_cuda_be->smem_optin_bytes = 48 * 1024;
    /* the causal attention's block groups: their re-read operands at most a third
     * of the L2 (attn_sched.cuh; 16 MiB where the size is unknown) */
    int l2 = 0;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0) l2 = 48 << 20;
    mt_cuda_be->attn_group_bytes = group_kib > 0 ? group_kib << 10 : (long long)l2 / 3;
    mt_cuda_be->attn_group_default = mt_cuda_be->attn_group_bytes;
    in->attn_group_bytes = mt_cuda_be->attn_group_bytes;
    (void)cudaGetLastError();
#ifdef MT_CUDA_EMU
    in->emulated = 1;
#endif

    if ((e = cudaStreamCreateWithFlags(&mt_cuda_be->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return init_fail(why, why_len, "cudaStreamCreate", cudaGetErrorString(e));
    cublasStatus_t bs = cublasCreate(&mt_cuda_be->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        mt_cuda_be->blas = NULL;
        return init_fail(why, why_len, "cublasCreate", cublasGetStatusString(bs));
    }
    /* fp32 mode: plain IEEE fp32 GEMMs (no TF32), the same numbers the cpu
     * backend is checked against; deterministic on one GPU model. */
    if ((bs = cublasSetStream(mt_cuda_be->blas, mt_cuda_be->stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetMathMode(mt_cuda_be->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasGetVersion(mt_cuda_be->blas, &in->cublas_version)) != CUBLAS_STATUS_SUCCESS)
        return init_fail(why, why_len, "cublas setup", cublasGetStatusString(bs));
    if ((e = cudaMalloc((void **)&mt_cuda_be->red_partial, (MT_CUDA_RED_BLOCKS + 1) * sizeof(double))) != cudaSuccess ||
        (e = cudaMalloc((void **)&mt_cuda_be->red_flag, sizeof(int))) != cudaSuccess)
        return init_fail(why, why_len, "cudaMalloc (reduction scratch)", cudaGetErrorString(e));
    /* bf16 mode: cuBLASLt and its workspace exist whatever the precision, so
     * that mt_ops_cuda_set_precision() can switch at any time */
    if ((bs = cublasLtCreate(&mt_cuda_be->lt)) != CUBLAS_STATUS_SUCCESS) {
        mt_cuda_be->lt = NULL;
        return init_fail(why, why_len, "cublasLtCreate", cublasGetStatusString(bs));
    }
    if ((e = cudaMalloc(&mt_cuda_be->lt_ws, MT_CUDA_LT_WS_BYTES)) != cudaSuccess)
        return init_fail(why, why_len, "cudaMalloc (cuBLASLt workspace)", cudaGetErrorString(e));
    /* cuBLAS gets the same workspace (its calls and Lt's are ordered on the
     * one stream): without one it may allocate inside a call, which a
     * stream capture (CUDA graphs) refuses */
    if ((bs = cublasSetWorkspace(mt_cuda_be->blas, mt_cuda_be->lt_ws, MT_CUDA_LT_WS_BYTES)) != CUBLAS_STATUS_SUCCESS)
        return init_fail(why, why_len, "cublasSetWorkspace", cublasGetStatusString(bs));
    in->cublaslt_version = cublasLtGetVersion();
    in->workspace_bytes = MT_CUDA_LT_WS_BYTES;
    mt_cuda_be->bf16_cap = cap;
    mt_cuda_be->attn_ds_cap = ds_cap;
    if ((attn_v2 >= 3 || gg_wgmma) && !mt_cuda_wgmma_available())
        return init_fail(why, why_len, attn_v2 == 3 ? "MT_CUDA_ATTN_KERNEL=v4" : attn_v2 == 4 ? "MT_CUDA_ATTN_KERNEL=v5"
                                                                                : "MT_CUDA_GG_KERNEL=wgmma",
                         "needs wgmma: this build's sm_90a device code on an sm_90 device (H100/H200)");
    set_attn_kernel(attn_v2);
    mt_cuda_be->gg_bn = gg_bn;
    mt_cuda_be->gg_wgmma = gg_wgmma;
    in->bf16_scratch_cap = cap;
    set_precision(prec, prec_src);
    /* MT_CUDA_OP_PROFILE=0: no event pairs (the receipt then has no op
     * profile); anything else or unset: on */
    const char *op = getenv(MT_CUDA_OP_PROFILE_ENV);
    in->op_profile = !(op && !strcmp(op, "0"));
    /* the launch log (a test tunable): a file that cannot be opened is not an
     * init failure, the log is simply off (said once on stderr) */
    const char *log = getenv(MT_CUDA_LAUNCH_LOG_ENV);
    if (log && log[0] && !(mt_cuda_be->launch_log = fopen(log, "a")))
        fprintf(stderr, "meshtrain cuda backend: %s=%s: cannot open; no launch log\n", MT_CUDA_LAUNCH_LOG_ENV, log);
    /* line-buffered: each line one append-mode write, whole, so that two instances
     * logging to one file (cuda_ops_vs_cpu's test_instances) interleave lines, never
     * cut one (a full 4 KiB buffer flushed mid-line did: resources.py read "smem alloc") */
    if (mt_cuda_be->launch_log) setvbuf(mt_cuda_be->launch_log, NULL, _IOLBF, 0);
    if (mt_cuda_be->launch_log) snprintf(in->launch_log, sizeof in->launch_log, "%s", log);
    const char *kp = getenv(MT_CUDA_KERNEL_PROFILE_ENV);
    in->kernel_profile = in->op_profile && kp && !strcmp(kp, "1");
    mt_cuda_be->table = cuda_ops;
    mt_cuda_be->table.be = mt_cuda_be;   /* the instance every entry of its table receives */
    mt_cuda_be->ready = 1;
    return 1;
}

extern "C" const struct mt_ops_i *mt_ops_cuda(char *why, size_t why_len)
{
    if (!(cuda_default && cuda_default->ready)) {
        if (!init_state(why, why_len)) return NULL;
        cuda_default = mt_cuda_be;
    }
    if (why && why_len) why[0] = 0;
    cuda_ops.be = cuda_default;   /* the static table hands out the default instance */
    return &cuda_ops;
}

/* The instance `be` (NULL: the default one), bound; NULL if it is not live. */
static struct mt_cuda_backend *bind_instance(void *be)
{
    struct mt_cuda_backend *B = be ? (struct mt_cuda_backend *)be : cuda_default;
    if (!(B && B->ready)) return NULL;
    MT_CUDA_BIND(B);
    return B;
}

extern "C" const struct mt_ops_i *mt_ops_cuda_create(enum mt_cuda_precision p, char *why, size_t why_len)
{
    if (p != MT_CUDA_PRECISION_FP32 && p != MT_CUDA_PRECISION_BF16) {
        if (why && why_len) snprintf(why, why_len, "precision %d: expected fp32 or bf16", (int)p);
        return NULL;
    }
    if (!init_state(why, why_len)) return NULL;
    set_precision(p, "set by caller");
    if (why && why_len) why[0] = 0;
    return &mt_cuda_be->table;
}

extern "C" void mt_ops_cuda_destroy(const struct mt_ops_i *ops)
{
    if (!ops || !ops->be) return;
    struct mt_cuda_backend *B = (struct mt_cuda_backend *)ops->be;
    if (B == cuda_default) {   /* the default instance goes through shutdown */
        mt_ops_cuda_shutdown();
        return;
    }
    if (!B->ready) return;
    MT_CUDA_BIND(B);
    cudaStreamSynchronize(B->stream);
    release_state();   /* frees B and with it the table `ops` points into */
}

extern "C" enum mt_status mt_ops_cuda_status_of(void *be, char *msg, size_t msg_len)
{
    struct mt_cuda_backend *B = bind_instance(be);
    if (!B) {   /* no instance: nothing failed */
        if (msg && msg_len) msg[0] = 0;
        return MT_OK;
    }
    if (msg && msg_len) {
        if (B->err == MT_OK) msg[0] = 0;
        else if (B->n_errors > 1)
            snprintf(msg, msg_len, "%s (+%ld more)", B->errmsg, B->n_errors - 1);
        else
            snprintf(msg, msg_len, "%s", B->errmsg);
    }
    return B->err;
}

extern "C" enum mt_status mt_ops_cuda_status(char *msg, size_t msg_len)
{
    return mt_ops_cuda_status_of(NULL, msg, msg_len);
}

extern "C" enum mt_status mt_ops_cuda_get_info_of(void *be, struct mt_ops_cuda_info *info)
{
    struct mt_cuda_backend *B = bind_instance(be);
    if (!B) return MT_ERR_UNSUPPORTED;
    mt_cuda_note_mem();
    *info = B->info;
    return MT_OK;
}

extern "C" enum mt_status mt_ops_cuda_get_info(struct mt_ops_cuda_info *info)
{
    return mt_ops_cuda_get_info_of(NULL, info);
}

extern "C" enum mt_status mt_ops_cuda_use_device(int local_rank)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return MT_ERR_UNSUPPORTED;
    }
    int want = (local_rank < 0 ? 0 : local_rank) % n;
    if (cuda_default && cuda_default->ready) return cuda_default->device == want ? MT_OK : MT_ERR_UNSUPPORTED;
    return cudaSetDevice(want) == cudaSuccess ? MT_OK : MT_ERR_UNSUPPORTED;
}

extern "C" enum mt_status mt_ops_cuda_set_precision_of(void *be, enum mt_cuda_precision p)
{
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    if (p != MT_CUDA_PRECISION_FP32 && p != MT_CUDA_PRECISION_BF16) return MT_ERR_INVALID_ARG;
    set_precision(p, "set by caller");
    return MT_OK;
}

extern "C" enum mt_status mt_ops_cuda_set_precision(enum mt_cuda_precision p)
{
    return mt_ops_cuda_set_precision_of(NULL, p);
}

extern "C" enum mt_status mt_ops_cuda_set_attn_kernel_of(void *be, const char *name)
{
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    const int v2 = name ? attn_kernel_parse(name) : -1;
    if (v2 < 0) return MT_ERR_INVALID_ARG;
    if (v2 >= 3 && !mt_cuda_wgmma_available()) return MT_ERR_UNSUPPORTED;   /* v4, v5: wgmma */
    set_attn_kernel(v2);
    return MT_OK;
}

extern "C" enum mt_status mt_ops_cuda_set_attn_kernel(const char *name)
{
    return mt_ops_cuda_set_attn_kernel_of(NULL, name);
}

extern "C" enum mt_status mt_ops_cuda_set_attn_group_kib_of(void *be, long long kib)
{
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    if (kib < 0 || kib > (1ll << 30)) return MT_ERR_INVALID_ARG;   /* MT_CUDA_ATTN_GROUP_KIB's range */
    mt_cuda_be->attn_group_bytes = kib ? kib << 10 : mt_cuda_be->attn_group_default;
    mt_cuda_be->info.attn_group_bytes = mt_cuda_be->attn_group_bytes;
    return MT_OK;
}

extern "C" enum mt_status mt_ops_cuda_set_gg_bn_of(void *be, int bn)
{
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    if (bn != 128 && bn != 256) return MT_ERR_INVALID_ARG;
    mt_cuda_be->gg_bn = bn;
    return MT_OK;
}

extern "C" enum mt_status mt_ops_cuda_set_knob_of(void *be, int knob, const char *value)
{
    const enum mt_knob_id id = (enum mt_knob_id)knob;
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    if (!mt_knob_value_ok(id, value, NULL, 0)) return MT_ERR_INVALID_ARG;
    const long long n = atoll(value);   /* the INT knobs, in the table's range */
    enum mt_cuda_precision p;
    switch (id) {
    case MT_KNOB_CUDA_PRECISION:
        if (mt_ops_cuda_precision_parse(value, &p) != MT_OK) return MT_ERR_INVALID_ARG;
        set_precision(p, "set by caller");
        return MT_OK;
    case MT_KNOB_ATTN_KERNEL:      return mt_ops_cuda_set_attn_kernel_of(be, value);
    case MT_KNOB_ATTN_GROUP_KIB:   return mt_ops_cuda_set_attn_group_kib_of(be, n);
    case MT_KNOB_GROUPED_GEMM_BN:  return mt_ops_cuda_set_gg_bn_of(be, (int)n);
    case MT_KNOB_GROUPED_GEMM_KERNEL:
        if (!strcmp(value, "wgmma") && !mt_cuda_wgmma_available()) return MT_ERR_UNSUPPORTED;
        mt_cuda_be->gg_wgmma = !strcmp(value, "wgmma");
        return MT_OK;
    case MT_KNOB_ATTN_DS_MB:
        mt_cuda_be->attn_ds_cap = (size_t)n << 20;
        return MT_OK;
    case MT_KNOB_BF16_SCRATCH_MB:
        mt_cuda_be->bf16_cap = mt_cuda_be->info.bf16_scratch_cap = (size_t)n << 20;
        return MT_OK;
    default:
        return MT_ERR_INVALID_ARG;
    }
}

extern "C" enum mt_status mt_ops_cuda_wgmma_probe_of(void *be, float *C, const void *A, const void *B, int M, int N,
                                                     int K, int form)
{
    if (!bind_instance(be)) return MT_ERR_UNSUPPORTED;
    return mt_cuda_wgmma_probe(C, A, B, M, N, K, form);
}

extern "C" enum mt_cuda_precision mt_ops_cuda_get_precision_of(void *be)
{
    struct mt_cuda_backend *B = bind_instance(be);
    return B ? B->precision : MT_CUDA_PRECISION_FP32;
}

extern "C" enum mt_cuda_precision mt_ops_cuda_get_precision(void)
{
    return mt_ops_cuda_get_precision_of(NULL);
}

extern "C" void *mt_ops_cuda_stream_of(void *be)
{
    struct mt_cuda_backend *B = bind_instance(be);
    return B ? (void *)B->stream : NULL;
}

extern "C" void *mt_ops_cuda_stream(void)
{
    return mt_ops_cuda_stream_of(NULL);
}

extern "C" void mt_ops_cuda_counters_of(void *be, struct mt_ops_cuda_counters *out)
{
    struct mt_cuda_backend *B = bind_instance(be);
    if (B) *out = B->ctr;
    else memset(out, 0, sizeof *out);
}

extern "C" const struct mt_ops_cuda_counters *mt_ops_cuda_step_counters_of(void *be, int *n_steps)
{
    struct mt_cuda_backend *B = bind_instance(be);
    *n_steps = B ? B->n_steps : 0;
    return B ? B->step_ctr : NULL;
}

extern "C" void mt_ops_cuda_shutdown(void)
{
    if (!(cuda_default && cuda_default->ready)) return;
    MT_CUDA_BIND(cuda_default);
    cudaStreamSynchronize(cuda_default->stream);
    release_state();
    cuda_default = NULL;
    cuda_ops.be = NULL;
}
