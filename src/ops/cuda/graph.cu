/*
 * graph.cu — CUDA graphs of the training step (issue 27 item 4; docs/cuda.md
 * "CUDA graphs"): on a one-GPU mesh the step's device work between host
 * waits is captured once and replayed as one graph launch per segment.
 *
 * HOW IT WORKS. A *segment* is the run of device operations (kernel
 * launches, memsets, device copies, cuBLAS calls) between two operations a
 * stream capture refuses: a host wait, a copy to or from (pageable) host
 * memory, an allocation or free (cuda_impl.cuh calls mt_cuda_graph_boundary
 * before each). Segments are numbered by position within the step, between
 * the trainer's step marks (profile_step). The host still walks every op of
 * the step (the model code runs unchanged); what graphs save is the device
 * launches. Each op reports a *signature*: what it is and every value it
 * passes by value (kernel, grid, block, shared memory, the arguments as the
 * kernel's parameter types; cuBLAS's pointers, sizes, alpha and beta and the
 * host arrays it reads). The trainer turns graphs on (graph_mode) inside its
 * first step, so that step runs eagerly (its allocations and the
 * workspace's growth move boundaries and pointers). Then, per graph step:
 *
 *     step 0   eager, each segment's op signatures recorded
 *     step 1   each segment captured (cudaStreamBeginCapture ... End,
 *              instantiate, launch: this step's values) while its
 *              signatures are compared with step 0's: all equal -> STATIC,
 *              the graph is kept; any op differs -> DYNAMIC (a value that
 *              changes per step: the optimizer's learning rate and bias
 *              corrections, its clip scale), eager from then on
 *     step 2.. STATIC segments replay: each op's signature is checked
 *              against the capture's and the op is NOT issued; at the
 *              segment's end one cudaGraphLaunch runs the whole segment.
 *              DYNAMIC segments run eagerly.
 *
 * An allocation or free with graphs kept drops them all (the workspace may
 * have moved): recorded and captured again over the next two steps.
 * A replayed op whose signature differs from its capture (a value the
 * graph would replay stale, a changed shape) cannot be recovered (the ops
 * before it in the segment were not issued): it is a sticky error naming
 * the op, and graphs stay off for the rest of the instance's life. So a
 * by-value scalar that changes per step is never replayed stale: it makes
 * its segment DYNAMIC at graph step 1, or fails loudly.
 */
#include "cuda_impl.cuh"

#include <stdio.h>
#include <string.h>

enum { MODE_PLAIN = 0, MODE_RECORD, MODE_CAPTURE, MODE_REPLAY };

#define GR (&mt_cuda_be->graph)

static struct mt_cuda_graph_seg *cur_seg(void) { return GR->seg < MT_CUDA_GRAPH_SEGS ? &GR->segs[GR->seg] : NULL; }

static int sig_store(struct mt_cuda_graph_seg *s, int i, const char *name, uint64_t sig)
{
    if (i >= s->sig_cap) {
        int cap = s->sig_cap ? 2 * s->sig_cap : 64;
        while (cap <= i) cap *= 2;
        uint64_t *ns = (uint64_t *)realloc(s->sig, (size_t)cap * sizeof *ns);
        if (!ns) return 0;
        s->sig = ns;
        const char **nn = (const char **)realloc(s->name, (size_t)cap * sizeof *nn);
        if (!nn) return 0;
        s->name = nn;
        s->sig_cap = cap;
    }
    s->sig[i] = sig;
    s->name[i] = name;
    return 1;
}

static void graph_fail(const char *what)
{
    GR->failed = 1;
    mt_cuda_record(MT_ERR_RUNTIME, "cuda graphs", what, __FILE__, __LINE__);
}

static void graph_launch(struct mt_cuda_graph_seg *s, long ops)
{
    mt_cuda_be->ctr.graph_launches++;
    mt_cuda_be->ctr.graph_ops += ops;
    if (mt_cuda_be->launch_log)
        fprintf(mt_cuda_be->launch_log, "graph segment %d ops %ld nodes %ld\n", GR->seg, ops, s->nodes);
    MT_CUDA_CHECK(cudaGraphLaunch(s->exec, mt_cuda_be->stream));
}

static void seg_begin(void)
{
    struct mt_cuda_graph_seg *s = cur_seg();
    GR->open = 1;
    GR->cur_n = 0;
    GR->mode = MODE_PLAIN;
    if (!s || GR->failed || s->state == MT_CUDA_SEG_DYNAMIC) return;
    if (s->state == MT_CUDA_SEG_STATIC) {
        GR->mode = MODE_REPLAY;
        return;
    }
    if (GR->step == 0 || s->n_ops == 0) {   /* nothing recorded to compare with yet */
        GR->mode = MODE_RECORD;
        return;
    }
    GR->prev_n = s->n_ops;
    GR->match = 1;
    if (MT_CUDA_OK(cudaStreamBeginCapture(mt_cuda_be->stream, cudaStreamCaptureModeGlobal))) GR->mode = MODE_CAPTURE;
    else GR->failed = 1;   /* recorded; eager from here */
}

static void seg_end(void)
{
    struct mt_cuda_graph_seg *s = cur_seg();
    const int mode = GR->mode, n = GR->cur_n;
    GR->open = 0;
    GR->mode = MODE_PLAIN;
    if (mode == MODE_RECORD) {
        s->n_ops = n;
    } else if (mode == MODE_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ex = NULL;
        size_t nodes = 0;
        int ok = MT_CUDA_OK(cudaStreamEndCapture(mt_cuda_be->stream, &g)) &&
                 MT_CUDA_OK(cudaGraphInstantiate(&ex, g, 0)) && MT_CUDA_OK(cudaGraphGetNodes(g, NULL, &nodes));
        if (g) cudaGraphDestroy(g);
        if (!ok) {   /* the captured ops never ran: this step is lost (sticky error) */
            if (ex) cudaGraphExecDestroy(ex);
            graph_fail("a segment's capture failed (an operation the capture refuses inside it?): its ops did not run");
        } else {
            s->exec = ex;
            s->nodes = (long)nodes;
            graph_launch(s, n);   /* this step's ops, with this step's values */
            if (GR->match && n == GR->prev_n) {
                s->state = MT_CUDA_SEG_STATIC;
                if (GR->captured_step < 0) GR->captured_step = GR->step;
            } else {
                /* a value changed since the recorded step: eager from now on.
                 * An exec destroyed in flight is freed when it completes (CUDA
                 * runtime API, cudaGraphExecDestroy): no wait */
                s->state = MT_CUDA_SEG_DYNAMIC;
                cudaGraphExecDestroy(ex);
                s->exec = NULL;
            }
        }
        s->n_ops = n;
    } else if (mode == MODE_REPLAY) {
        if (n != s->n_ops) {
            char why[200];
            snprintf(why, sizeof why, "segment %d had %d ops at its capture and %d at graph step %d: not replayed",
                     GR->seg, s->n_ops, n, GR->step);
            graph_fail(why);
        } else {
            graph_launch(s, n);
        }
    }
    GR->seg++;
}

int mt_cuda_graph_op_slow(const char *name, uint64_t sig)
{
    if (!GR->open) seg_begin();
    const int i = GR->cur_n++;
    struct mt_cuda_graph_seg *s = cur_seg();
    switch (GR->mode) {
    case MODE_RECORD:
        if (!sig_store(s, i, name, sig)) GR->mode = MODE_PLAIN, s->state = MT_CUDA_SEG_DYNAMIC;
        return 1;
    case MODE_CAPTURE:
        if (i >= GR->prev_n || s->sig[i] != sig) {
            if (GR->match && !GR->why_dynamic[0])
                snprintf(GR->why_dynamic, sizeof GR->why_dynamic, "segment %d op %d (%s) changed between steps",
                         GR->seg, i, name);
            GR->match = 0;
        }
        if (!sig_store(s, i, name, sig)) GR->match = 0, GR->prev_n = -1;
        return 1;
    case MODE_REPLAY:
        if (i < s->n_ops && s->sig[i] == sig) return 0;   /* the graph runs it */
        {
            char why[300];
            snprintf(why, sizeof why,
                     "graph step %d, segment %d, op %d (%s) differs from its capture (%s): a value passed by value "
                     "changed per step, or a shape; the replay would be stale (run with --knob cuda_graphs=0)",
                     GR->step, GR->seg, i, name, i < s->n_ops ? s->name[i] : "past its end");
            graph_fail(why);
            GR->mode = MODE_PLAIN;
        }
        return 1;
    }
    return 1;
}

void mt_cuda_graph_boundary_slow(void)
{
    if (GR->open) seg_end();
}

/* The trainer's step marks (profile_step): graphs are active between them. */
void mt_cuda_graph_step_mark(int end)
{
    if (!end) {
        GR->active = GR->want && !GR->failed;
        GR->seg = 0;
        GR->open = 0;
        return;
    }
    if (!GR->active) return;
    if (GR->open) seg_end();
    GR->n_segs = GR->seg;
    GR->active = 0;
    GR->step++;
}

/* Free every segment's graph and signatures (instance teardown, mode off). */
void mt_cuda_graph_release(void)
{
    for (int i = 0; i < MT_CUDA_GRAPH_SEGS; i++) {
        struct mt_cuda_graph_seg *s = &GR->segs[i];
        if (s->exec) cudaGraphExecDestroy(s->exec);
        free(s->sig);
        free(s->name);
        memset(s, 0, sizeof *s);
    }
    GR->step = 0;
    GR->n_segs = 0;
    GR->captured_step = -1;
    GR->why_dynamic[0] = 0;
}

/* An allocation or a free (mt_cuda_malloc / mt_cuda_free) may have moved a
 * buffer the kept graphs point to (the grow-only workspace is freed and
 * allocated again when it grows): drop every graph and signature; the next
 * graph step records again (0), the one after captures. Without this a
 * replay would hit the signature check (a changed pointer) and fail. Called
 * with graphs wanted, inside a step or between steps (evaluation). */
void mt_cuda_graph_invalidate(void)
{
    const int in_step = GR->active, seg = GR->seg;
    if (GR->open) seg_end();   /* the current segment ends at the allocation anyway */
    mt_cuda_graph_release();
    if (in_step) {   /* the rest of this step runs eagerly; the next one records */
        GR->active = 0;
        GR->seg = seg;
    }
}

/* mt_ops.h graph_mode: on = 1 where the trainer's step allows graphs; the
 * reason when it does not (kept for the receipt). A change resets them. */
extern "C" void mt_cuda_graph_mode(void *be, int on, const char *why_not)
{
    MT_CUDA_BIND(be);
    snprintf(GR->why_not, sizeof GR->why_not, "%s", on ? "" : (why_not && why_not[0] ? why_not : "off"));
    if (!!on == GR->want) return;
    if (GR->want) mt_cuda_graph_release();
    GR->want = !!on;
    if (on) GR->captured_step = -1;
}

extern "C" void mt_ops_cuda_graph_info_of(void *be, struct mt_ops_cuda_graph_info *out)
{
    memset(out, 0, sizeof *out);
    struct mt_cuda_backend *B = (struct mt_cuda_backend *)be;
    if (!B || !B->ready) return;
    const struct mt_cuda_graphs *g = &B->graph;
    out->want = g->want;
    out->failed = g->failed;
    out->steps = g->step;
    out->captured_step = g->captured_step;
    out->segments = g->n_segs;
    for (int i = 0; i < g->n_segs && i < MT_CUDA_GRAPH_SEGS; i++) {
        if (g->segs[i].state == MT_CUDA_SEG_STATIC) {
            out->static_segments++;
            out->graph_ops += g->segs[i].n_ops;
            out->graph_nodes += g->segs[i].nodes;
        } else if (g->segs[i].state == MT_CUDA_SEG_DYNAMIC) {
            out->dynamic_segments++;
        }
    }
    out->ran = g->want && !g->failed && out->static_segments > 0;
    snprintf(out->why_not, sizeof out->why_not, "%s", g->why_not);
    snprintf(out->why_dynamic, sizeof out->why_dynamic, "%s", g->why_dynamic);
}
