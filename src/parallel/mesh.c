/*
 * mesh.c — the named mesh `pipe x data x expert x model`: parsing, rank <->
 * coordinates, group membership, the startup contract, predicates, and the
 * construction of each rank's communicators with reuse.
 *
 * Invariant: a mesh's registry holds each distinct member set exactly once,
 * with the one communicator that serves it; every group kind points at a
 * registry entry, and destroy frees each entry (so each comm) once.
 *
 * HOW IT WORKS — group construction and reuse
 *
 *   A group kind is a set of axes (model = {model}, data_expert = {data,
 *   expert}, ...). The group of kind G that rank r joins is every rank whose
 *   coordinates equal r's on the axes NOT in G; listing world ranks in
 *   ascending order gives it already sorted, and that order is the comm
 *   rank order (MPI_Comm_split with key = world rank).
 *
 *   mt_mesh_create walks the kinds in the fixed order of enum
 *   mt_mesh_group. For each kind, every rank computes its member list and
 *   looks it up in its registry (keyed by the sorted list):
 *     found        -> reuse that entry's communicator;
 *     one member   -> a self communicator (created once, then found);
 *     otherwise    -> a new communicator from MPI_Comm_split(world,
 *                     colour = linear index of the coordinates not in G,
 *                     key = world rank), registered.
 *   MPI_Comm_split is collective over world, so EVERY rank calls it once
 *   per kind, in the same order, even when it reuses: then it passes
 *   MPI_UNDEFINED and gets MPI_COMM_NULL back, which costs one
 *   synchronisation and creates nothing. Whether a kind is reused is the
 *   same on every rank — two member sets of one rank are equal exactly when
 *   the two kinds agree on every axis of degree > 1 — so no rank can be
 *   left waiting in a split its peers skipped. mt_mesh_group_source states
 *   that degree rule as a pure function; create asserts the registry agrees.
 *
 *   Examples: tp=1 -> every model group is {r}: the self comm. pp=dp=ep=1
 *   -> model == world: reused. ep=1 -> data_expert == data: reused.
 *
 * HOW IT WORKS — device communicators (mt_mesh_create_nccl)
 *
 *   The host communicators above are built exactly as for a cpu run (they
 *   carry host values: losses, norms, counts, hashes). Next to each
 *   registry entry a GPU mesh keeps a device communicator for backend
 *   buffers, built in the same walk and so reused in the same way:
 *     world                 -> NCCL world (ncclCommInitRank; the unique id
 *                              goes out over the host world, i.e. MPI), or,
 *                              on a world of one, a self_dev comm;
 *     kind with one member  -> the self_dev comm (created once): copies go
 *                              through the backend's copy (cudaMemcpyAsync on
 *                              its stream), never a host memmove;
 *     reused kind           -> the entry's device comm;
 *     otherwise             -> mt_comm_split(device world, same colour, key)
 *                              = ncclCommSplit.
 *   The device split is collective over the NCCL world, so, like the host
 *   split, every rank calls it once per kind in the same order (passing
 *   MT_COMM_UNDEFINED when reusing or alone). Every NCCL communicator fences
 *   on the backend's stream (mt_comm_nccl_set_input_stream, inherited by
 *   the splits), so a collective reads what the backend's kernels wrote.
 */
#include "mt_mesh.h"
#include "comm_impl.h"
#include "comm_nccl.h"
#include "../model/mt_blocks.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* axes and groups                                                     */
/* ------------------------------------------------------------------ */

/* The axis table (enum mt_axis order). `derived`: the degree a mesh string may
 * leave out, world / (product of the others). A group is a bit set of axes. */
static const struct {
    const char *name, *long_name;
    int         derived;
} axis_info[MT_AXIS_COUNT] = {
    [MT_AXIS_PP] = {"pp", "pipe",   0},
    [MT_AXIS_DP] = {"dp", "data",   1},
    [MT_AXIS_EP] = {"ep", "expert", 0},
    [MT_AXIS_TP] = {"tp", "model",  0},
};
#define AXBIT(a) (1 << (a))
enum { AX_PIPE = AXBIT(MT_AXIS_PP), AX_DATA = AXBIT(MT_AXIS_DP), AX_EXPERT = AXBIT(MT_AXIS_EP),
       AX_MODEL = AXBIT(MT_AXIS_TP), AX_ALL = AXBIT(MT_AXIS_COUNT) - 1 };

const char *mt_axis_name(enum mt_axis a) { return (a >= 0 && a < MT_AXIS_COUNT) ? axis_info[a].name : "?"; }
const char *mt_axis_long_name(enum mt_axis a) { return (a >= 0 && a < MT_AXIS_COUNT) ? axis_info[a].long_name : "?"; }

static const struct {
    const char *name;
    int         axes;
} group_info[MT_MESH_GROUP_COUNT] = {
    [MT_MESH_GROUP_WORLD]       = {"world",       AX_ALL},
    [MT_MESH_GROUP_MODEL]       = {"model",       AX_MODEL},
    [MT_MESH_GROUP_EXPERT]      = {"expert",      AX_EXPERT},
    [MT_MESH_GROUP_DATA]        = {"data",        AX_DATA},
    [MT_MESH_GROUP_DATA_EXPERT] = {"data_expert", AX_DATA | AX_EXPERT},
    [MT_MESH_GROUP_DATA_MODEL]  = {"data_model",  AX_DATA | AX_MODEL},
    [MT_MESH_GROUP_STAGE]       = {"stage",       AX_DATA | AX_EXPERT | AX_MODEL},
    [MT_MESH_GROUP_PIPE]        = {"pipe",        AX_PIPE},
};

const char *mt_mesh_group_name(enum mt_mesh_group g)
{
    return (g >= 0 && g < MT_MESH_GROUP_COUNT) ? group_info[g].name : "?";
}

void mt_mesh_dims_set_sp(struct mt_mesh_dims *d, const struct mt_config *cfg)
{
    d->sp = d->tp > 1 && (cfg ? cfg->sequence_parallel != 0 : 1);
}

long long mt_mesh_dims_world(const struct mt_mesh_dims *d)
{
    long long w = 1;
    for (int a = 0; a < MT_AXIS_COUNT; a++) w *= d->deg[a];
    return w;
}

/* "pp=1,dp=2,ep=1,tp=2": every axis in table order */
void mt_mesh_dims_str(const struct mt_mesh_dims *d, char *buf, size_t n)
{
    size_t at = 0;
    if (n) buf[0] = 0;
    for (int a = 0; a < MT_AXIS_COUNT && at < n; a++) {
        int w = snprintf(buf + at, n - at, "%s%s=%d", a ? "," : "", axis_info[a].name, d->deg[a]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* Mixed radix, the first axis outermost: rank = ((pipe*dp + data)*ep + expert)*tp + model */
int mt_mesh_rank_of(const struct mt_mesh_dims *d, const struct mt_mesh_coord *c)
{
    int r = 0;
    for (int a = 0; a < MT_AXIS_COUNT; a++) r = r * d->deg[a] + c->at[a];
    return r;
}

void mt_mesh_coord_of(const struct mt_mesh_dims *d, int rank, struct mt_mesh_coord *c)
{
    for (int a = MT_AXIS_COUNT - 1; a > 0; a--) {
        c->at[a] = rank % d->deg[a];
        rank /= d->deg[a];
    }
    c->at[0] = rank;
}

/* Axes of degree > 1 among `axes`: two groups of one rank have the same
 * members iff these agree. */
static int active_axes(const struct mt_mesh_dims *d, int axes)
{
    int on = 0;
    for (int a = 0; a < MT_AXIS_COUNT; a++)
        if ((axes & AXBIT(a)) && d->deg[a] > 1) on |= AXBIT(a);
    return on;
}

int mt_mesh_group_size(const struct mt_mesh_dims *d, enum mt_mesh_group g)
{
    int axes = group_info[g].axes, n = 1;
    for (int a = 0; a < MT_AXIS_COUNT; a++)
        if (axes & AXBIT(a)) n *= d->deg[a];
    return n;
}

/* Same coordinates on every axis outside `axes`? */
static int same_outside(const struct mt_mesh_coord *a, const struct mt_mesh_coord *b, int axes)
{
    for (int x = 0; x < MT_AXIS_COUNT; x++)
        if (!(axes & AXBIT(x)) && a->at[x] != b->at[x]) return 0;
    return 1;
}

int mt_mesh_group_members(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g, int *members)
{
    int world = (int)mt_mesh_dims_world(d), axes = group_info[g].axes, n = 0;
    struct mt_mesh_coord me, other;
    mt_mesh_coord_of(d, rank, &me);
    for (int r = 0; r < world; r++) {
        mt_mesh_coord_of(d, r, &other);
        if (!same_outside(&me, &other, axes)) continue;
        if (members) members[n] = r;
        n++;
    }
    return n;
}

enum mt_mesh_group mt_mesh_group_source(const struct mt_mesh_dims *d, int rank, enum mt_mesh_group g)
{
    int a = active_axes(d, group_info[g].axes);
    for (int h = 0; h < (int)g; h++)
        if (active_axes(d, group_info[h].axes) == a) return (enum mt_mesh_group)h;
    return g;
}

/* Colour of rank's group of kind `axes`: the rank with the in-group
 * coordinates zeroed (unique per group, >= 0). */
static int group_colour(const struct mt_mesh_dims *d, const struct mt_mesh_coord *c, int axes)
{
    struct mt_mesh_coord z = *c;
    for (int a = 0; a < MT_AXIS_COUNT; a++)
        if (axes & AXBIT(a)) z.at[a] = 0;
    return mt_mesh_rank_of(d, &z);
}

/* ------------------------------------------------------------------ */
/* parsing                                                             */
/* ------------------------------------------------------------------ */

/* Axis of a short or long name ("tp", "model"), or -1. */
static int axis_index(const char *s, size_t len)
{
    for (int a = 0; a < MT_AXIS_COUNT; a++) {
        const char *names[2] = {axis_info[a].name, axis_info[a].long_name};
        for (int k = 0; k < 2; k++)
            if (strlen(names[k]) == len && strncmp(s, names[k], len) == 0) return a;
    }
    return -1;
}

/* "pp*dp*ep*tp" (skip < 0: every axis) or "pp, dp, ep, tp" of the axes in
 * table order, for the messages; "(pp=1, dp=2, ...)" likewise. */
static void axis_list(char *buf, size_t n, const char *sep, int skip)
{
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < MT_AXIS_COUNT && at < n; a++) {
        if (a == skip) continue;
        int w = snprintf(buf + at, n - at, "%s%s", at ? sep : "", axis_info[a].name);
        if (w < 0) break;
        at += (size_t)w;
    }
}
static void axis_degrees(char *buf, size_t n, const int *deg, int skip)
{
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < MT_AXIS_COUNT && at < n; a++) {
        if (a == skip) continue;
        int w = snprintf(buf + at, n - at, "%s%s=%d", at ? ", " : "", axis_info[a].name, deg[a]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

static const char *trim(const char *s, const char *e, const char **end)
{
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *end = e;
    return s;
}

enum mt_status mt_mesh_parse(struct mt_ctx *ctx, const char *spec, int world, struct mt_mesh_dims *out)
{
    int deg[MT_AXIS_COUNT], given[MT_AXIS_COUNT];
    char names[64];
    for (int a = 0; a < MT_AXIS_COUNT; a++) deg[a] = 1, given[a] = 0;
    const char *p = spec ? spec : "";
    const char *end_all;
    p = trim(p, p + strlen(p), &end_all);
    while (p < end_all) {
        const char *comma = memchr(p, ',', (size_t)(end_all - p));
        const char *tok_end = comma ? comma : end_all, *te;
        const char *tok = trim(p, tok_end, &te);
        int tl = (int)(te - tok);
        const char *eq = memchr(tok, '=', (size_t)(te - tok));
        if (tl == 0 || !eq)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: expected axis=degree, got '%.*s' in '%s'", tl, tok, spec);
        const char *ne, *ve;
        const char *name = trim(tok, eq, &ne);
        const char *val = trim(eq + 1, te, &ve);
        int a = axis_index(name, (size_t)(ne - name));
        if (a < 0) {
            axis_list(names, sizeof names, ", ", -1);
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: unknown axis '%.*s' (axes: %s)", (int)(ne - name),
                                name, names);
        }
        if (given[a])
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: axis %s given twice in '%s'", axis_info[a].name, spec);
        /* a degree is [0-9]+ with value in [1, MT_MESH_MAX_DEGREE] */
        long v = 0;
        int ok = val < ve, neg = 0;
        const char *q = val;
        if (q < ve && *q == '-') { neg = 1; q++; ok = q < ve; }
        for (; q < ve && ok; q++) {
            if (*q < '0' || *q > '9') ok = 0;
            else if (v <= MT_MESH_MAX_DEGREE) v = v * 10 + (*q - '0');
        }
        if (!ok)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: degree of %s must be a positive integer, got '%.*s'",
                                axis_info[a].name, (int)(ve - val), val);
        if (neg || v < 1 || v > MT_MESH_MAX_DEGREE)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: degree of %s must be in [1, %d], got %s%ld",
                                axis_info[a].name, MT_MESH_MAX_DEGREE, neg ? "-" : "", v);
        deg[a] = (int)v;
        given[a] = 1;
        p = comma ? comma + 1 : end_all;
        if (comma && p == end_all)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "--mesh: trailing ',' in '%s'", spec);
    }
    if (world > 0) {
        int dv = -1;                               /* the derived axis (dp) */
        long long rest = 1;
        for (int a = 0; a < MT_AXIS_COUNT; a++) {
            if (axis_info[a].derived) dv = a;
            else rest *= deg[a];
        }
        char prod[64], degs[160];
        if (!given[dv]) {
            if (world % rest != 0) {
                axis_list(prod, sizeof prod, "*", dv);
                axis_degrees(degs, sizeof degs, deg, dv);
                return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh: world=%d is not divisible by %s=%lld (%s): cannot derive %s",
                                    world, prod, rest, degs, axis_info[dv].name);
            }
            deg[dv] = (int)(world / rest);
        } else if (rest * deg[dv] != world) {
            axis_list(prod, sizeof prod, "*", -1);
            axis_degrees(degs, sizeof degs, deg, -1);
            return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh: %s=%lld != world=%d (%s)", prod, rest * deg[dv], world, degs);
        }
    }
    for (int a = 0; a < MT_AXIS_COUNT; a++) out->deg[a] = deg[a];
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* the startup contract and predicates                                 */
/* ------------------------------------------------------------------ */

#define CONTRACT_FAIL(ctx, ...) mt_ctx_error((ctx), MT_ERR_CONFIG, "mesh contract: " __VA_ARGS__)

enum mt_status mt_mesh_check_contract(struct mt_ctx *ctx, const struct mt_mesh_dims *d,
                                      const struct mt_config *cfg, int world, int microbatches)
{
    if (!d || !cfg) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mesh contract: NULL dims or config");
    if (d->pp < 1 || d->dp < 1 || d->ep < 1 || d->tp < 1)
        return CONTRACT_FAIL(ctx, "every degree must be >= 1 (pp=%d, dp=%d, ep=%d, tp=%d)", d->pp, d->dp, d->ep, d->tp);
    long long prod = mt_mesh_dims_world(d);
    if (prod != world)
        return CONTRACT_FAIL(ctx, "world != pp*dp*ep*tp (world=%d, pp=%d, dp=%d, ep=%d, tp=%d, product=%lld)", world,
                             d->pp, d->dp, d->ep, d->tp, prod);
    int tp = d->tp, H = cfg->n_head, K = cfg->n_kv_head;
    if (H % tp) return CONTRACT_FAIL(ctx, "n_head %% tp != 0 (n_head=%d, tp=%d)", H, tp);
    /* fused QKV rows [H + 2K] (in head units) split by tp; given H % tp == 0
     * this is violated exactly when 2K % tp != 0 */
    if ((H + 2 * K) % tp)
        return CONTRACT_FAIL(ctx, "(n_head + 2*n_kv_head) %% tp != 0 (n_head=%d, n_kv_head=%d, tp=%d)", H, K, tp);
    if (K % tp) return CONTRACT_FAIL(ctx, "n_kv_head %% tp != 0 (n_kv_head=%d, tp=%d)", K, tp);
    long long F = cfg->mlp_hidden;
    if (F == 0) F = ((8LL * cfg->d_model + 2) / 3 + 63) / 64 * 64; /* ceil(8D/3) rounded up to 64 */
    if (F % tp) return CONTRACT_FAIL(ctx, "mlp_hidden %% tp != 0 (mlp_hidden=%lld, tp=%d)", F, tp);
    /* the pieces' own rules (piece_rules.c), the model axis before the
     * expert axis: Mamba-3's heads % tp, MoE's n_experts % ep */
    MT_CHECK(mt_blocks_check_axis(ctx, cfg, MT_AXIS_TP, tp));
    MT_CHECK(mt_blocks_check_axis(ctx, cfg, MT_AXIS_EP, d->ep));
    if (cfg->n_layer < d->pp) return CONTRACT_FAIL(ctx, "n_layer < pp (n_layer=%d, pp=%d)", cfg->n_layer, d->pp);
    int mb = microbatches > 0 ? microbatches : (cfg->microbatches > 0 ? cfg->microbatches : 1);
    long long div = (long long)d->dp * d->ep * mb;
    if (cfg->batch_size < 1 || cfg->batch_size % div)
        return CONTRACT_FAIL(ctx, "batch_size %% (dp*ep*microbatches) != 0 (batch_size=%d, dp=%d, ep=%d, microbatches=%d)",
                             cfg->batch_size, d->dp, d->ep, mb);
    if (tp > 1 && cfg->sequence_parallel && cfg->seq_len % tp)
        return CONTRACT_FAIL(ctx, "seq_len %% tp != 0 with sequence parallel (seq_len=%d, tp=%d)", cfg->seq_len, tp);
    return MT_OK;
}

void mt_mesh_derive_preds(const struct mt_mesh_dims *d, const struct mt_mesh_coord *c,
                          const struct mt_config *cfg, int zero_stage, struct mt_mesh_preds *out)
{
    int sp = cfg ? cfg->sequence_parallel != 0 : 1;
    out->ep_active = d->ep > 1;
    out->tp_active = d->tp > 1;
    out->sp_on = d->tp > 1 && sp;
    out->dp_active = d->dp > 1;
    out->pp_active = d->pp > 1;
    out->pp_stage = c->pipe;
    out->grad_dp = d->dp * d->ep;
    out->zero_stage = zero_stage;
}

/* ------------------------------------------------------------------ */
/* the live mesh                                                       */
/* ------------------------------------------------------------------ */

struct registry_entry {
    int             n;        /* members                          */
    int            *members;  /* world ranks, ascending           */
    struct mt_comm *comm;     /* owned by the entry (host memory) */
    struct mt_comm *dcomm;    /* owned; device mesh only, else NULL */
    int             first;    /* the group kind that created it   */
};

struct mt_mesh {
    struct mt_ctx        *ctx;
    int                   has_dev;  /* built by mt_mesh_create_nccl */
    struct mt_mesh_dims   dims;
    struct mt_mesh_coord  coord;
    struct mt_mesh_preds  preds;
    int                   rank, world;
    int                   n_entries;
    struct registry_entry reg[MT_MESH_GROUP_COUNT];
    int                   entry_of[MT_MESH_GROUP_COUNT]; /* index into reg */
};

static int registry_find(const struct mt_mesh *m, const int *members, int n)
{
    for (int i = 0; i < m->n_entries; i++)
        if (m->reg[i].n == n && memcmp(m->reg[i].members, members, (size_t)n * sizeof(int)) == 0) return i;
    return -1;
}

void mt_mesh_destroy(struct mt_mesh *mesh)
{
    if (!mesh) return;
    struct mt_ctx *ctx = mesh->ctx;
    /* device communicators first (NCCL's teardown may still use the
     * network), then the host ones; reverse creation order: sub-groups
     * before the world */
    for (int i = mesh->n_entries - 1; i >= 0; i--) mt_comm_destroy(mesh->reg[i].dcomm);
    for (int i = mesh->n_entries - 1; i >= 0; i--) {
        mt_comm_destroy(mesh->reg[i].comm);
        mt_free(ctx, mesh->reg[i].members);
    }
    mt_free(ctx, mesh);
}

/* The device world: NCCL over the host world, or self_dev on one rank. */
static enum mt_status device_world(struct mt_ctx *ctx, struct mt_comm *wc, const struct mt_mesh_nccl_opts *o,
                                   struct mt_comm **out)
{
    *out = NULL;
    if (mt_comm_size(wc) == 1) return mt_comm_create_self_dev(ctx, o->copy, o->copy_be, out);
#ifdef MT_WITH_NCCL
    MT_CHECK(mt_comm_nccl_create_world(ctx, wc, o->device, out));
    enum mt_status st = mt_comm_nccl_set_input_stream(ctx, *out, o->stream);
    if (st != MT_OK) {
        mt_comm_destroy(*out);
        *out = NULL;
    }
    return st;
#else
    MT_ASSERT(0); /* refused before any collective in mesh_build */
    return MT_ERR_UNSUPPORTED;
#endif
}

static enum mt_status mesh_build(struct mt_ctx *ctx, const struct mt_mesh_dims *d, const struct mt_config *cfg,
                                 int zero_stage, const struct mt_mesh_nccl_opts *dev, struct mt_mesh **out)
{
    if (!out || !d) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mesh_create: NULL argument");
    *out = NULL;
    int world = 1, rank = 0;
    mt_comm_world_info(&world, &rank);
    /* identical on every rank, and before any collective: no hang */
    if (d->pp < 1 || d->dp < 1 || d->ep < 1 || d->tp < 1 || d->pp > MT_MESH_MAX_DEGREE || d->dp > MT_MESH_MAX_DEGREE ||
        d->ep > MT_MESH_MAX_DEGREE || d->tp > MT_MESH_MAX_DEGREE)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh: every degree must be in [1, %d] (pp=%d, dp=%d, ep=%d, tp=%d)",
                            MT_MESH_MAX_DEGREE, d->pp, d->dp, d->ep, d->tp);
    if (mt_mesh_dims_world(d) != world)
        return mt_ctx_error(ctx, MT_ERR_CONFIG, "mesh: pp*dp*ep*tp=%lld != world=%d (pp=%d, dp=%d, ep=%d, tp=%d)",
                            mt_mesh_dims_world(d), world, d->pp, d->dp, d->ep, d->tp);
    if (dev && !dev->copy)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mesh_create_nccl: NULL backend copy (pass the ops table's copy)");
#ifndef MT_WITH_NCCL
    if (dev && world > 1)
        return mt_ctx_error(ctx, MT_ERR_UNSUPPORTED, "mesh_create_nccl: %d ranks need NCCL, and this build has none "
                            "(configure with -DMT_WITH_NCCL=ON)", world);
#endif

    struct mt_mesh *m = mt_alloc(ctx, sizeof *m, MT_BUCKET_COMM);
    if (!m) return MT_ERR_OOM;
    m->ctx = ctx;
    m->has_dev = dev != NULL;
    m->dims = *d;
    mt_mesh_dims_set_sp(&m->dims, cfg);
    m->rank = rank;
    m->world = world;
    mt_mesh_coord_of(d, rank, &m->coord);
    mt_mesh_derive_preds(d, &m->coord, cfg, zero_stage, &m->preds);

    enum mt_status rc = MT_OK;
    int *members = NULL;
    struct mt_comm *wc = NULL, *nc = NULL, *dw = NULL, *dc = NULL;
    MT_CHECK_GOTO(mt_comm_create_world(ctx, &wc), rc, fail);
    members = mt_alloc(ctx, (size_t)world * sizeof(int), MT_BUCKET_COMM);
    if (!members) { mt_comm_destroy(wc); rc = MT_ERR_OOM; goto fail; }
    for (int r = 0; r < world; r++) members[r] = r;
    m->reg[0] = (struct registry_entry){world, members, wc, NULL, MT_MESH_GROUP_WORLD};
    m->n_entries = 1;
    m->entry_of[MT_MESH_GROUP_WORLD] = 0;
    members = NULL;
    if (dev) {
        MT_CHECK_GOTO(device_world(ctx, wc, dev, &dw), rc, fail);
        m->reg[0].dcomm = dw;
    }

    for (int g = MT_MESH_GROUP_WORLD + 1; g < MT_MESH_GROUP_COUNT; g++) {
        int n = mt_mesh_group_size(d, (enum mt_mesh_group)g);
        members = mt_alloc(ctx, (size_t)n * sizeof(int), MT_BUCKET_COMM);
        if (!members) { rc = MT_ERR_OOM; goto fail; }
        int got = mt_mesh_group_members(d, rank, (enum mt_mesh_group)g, members);
        MT_ASSERT(got == n);
        int found = registry_find(m, members, n);
        /* the registry must agree with the degree rule (same on every rank) */
        MT_ASSERT((found >= 0) == ((int)mt_mesh_group_source(d, rank, (enum mt_mesh_group)g) != g));
        int colour = found >= 0 || n == 1 ? MT_COMM_UNDEFINED
                                          : group_colour(d, &m->coord, group_info[g].axes);
        /* collective over world on every rank, reused or not */
        MT_CHECK_GOTO(mt_comm_split(ctx, wc, colour, rank, &nc), rc, fail);
        /* the device world too (NCCL: ncclCommSplit), in the same order */
        if (dw) MT_CHECK_GOTO(mt_comm_split(ctx, dw, colour, rank, &dc), rc, fail);
        if (found >= 0) {
            MT_ASSERT(nc == NULL && dc == NULL);
            m->entry_of[g] = found;
            mt_free(ctx, members);
            members = NULL;
            continue;
        }
        if (n == 1) MT_CHECK_GOTO(mt_comm_create_self(ctx, &nc), rc, fail);
        if (n == 1 && dw) MT_CHECK_GOTO(mt_comm_create_self_dev(ctx, dev->copy, dev->copy_be, &dc), rc, fail);
        if (!nc || mt_comm_size(nc) != n || members[mt_comm_rank(nc)] != rank ||
            (dw && (!dc || mt_comm_size(dc) != n || mt_comm_rank(dc) != mt_comm_rank(nc)))) {
            rc = mt_ctx_error(ctx, MT_ERR_COMM, "mesh: %s group came out with %d ranks (rank %d; device %d, rank %d), "
                              "expected %d", group_info[g].name, mt_comm_size(nc), mt_comm_rank(nc), mt_comm_size(dc),
                              mt_comm_rank(dc), n);
            goto fail;
        }
        m->reg[m->n_entries] = (struct registry_entry){n, members, nc, dc, g};
        m->entry_of[g] = m->n_entries++;
        members = NULL;
        nc = NULL;
        dc = NULL;
    }
    *out = m;
    return MT_OK;

fail:
    mt_comm_destroy(dc);
    mt_comm_destroy(nc);
    mt_free(ctx, members);
    mt_mesh_destroy(m);
    return rc;
}

enum mt_status mt_mesh_create(struct mt_ctx *ctx, const struct mt_mesh_dims *d, const struct mt_config *cfg,
                              int zero_stage, struct mt_mesh **out)
{
    return mesh_build(ctx, d, cfg, zero_stage, NULL, out);
}

enum mt_status mt_mesh_create_nccl(struct mt_ctx *ctx, const struct mt_mesh_dims *d, const struct mt_config *cfg,
                                   int zero_stage, const struct mt_mesh_nccl_opts *opts, struct mt_mesh **out)
{
    if (out) *out = NULL;
    if (!opts) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mesh_create_nccl: NULL options");
    return mesh_build(ctx, d, cfg, zero_stage, opts, out);
}

struct mt_comm *mt_mesh_device_comm(const struct mt_mesh *mesh, enum mt_mesh_group g)
{
    if (!mesh || g < 0 || g >= MT_MESH_GROUP_COUNT) return NULL;
    const struct registry_entry *e = &mesh->reg[mesh->entry_of[g]];
    return e->dcomm ? e->dcomm : e->comm;
}

int mt_mesh_has_device_comms(const struct mt_mesh *mesh)
{
    return mesh && mesh->has_dev;
}

struct mt_comm *mt_mesh_comm(const struct mt_mesh *mesh, enum mt_mesh_group g)
{
    if (!mesh || g < 0 || g >= MT_MESH_GROUP_COUNT) return NULL;
    return mesh->reg[mesh->entry_of[g]].comm;
}

int mt_mesh_rank(const struct mt_mesh *mesh) { return mesh->rank; }
int mt_mesh_world(const struct mt_mesh *mesh) { return mesh->world; }
const struct mt_mesh_dims *mt_mesh_get_dims(const struct mt_mesh *mesh) { return &mesh->dims; }
const struct mt_mesh_coord *mt_mesh_get_coord(const struct mt_mesh *mesh) { return &mesh->coord; }
const struct mt_mesh_preds *mt_mesh_get_preds(const struct mt_mesh *mesh) { return &mesh->preds; }

int mt_mesh_group_reused(const struct mt_mesh *mesh, enum mt_mesh_group g, enum mt_mesh_group *source)
{
    const struct registry_entry *e = &mesh->reg[mesh->entry_of[g]];
    if (source) *source = (enum mt_mesh_group)e->first;
    return e->first != (int)g;
}

/* ------------------------------------------------------------------ */
/* trace                                                               */
/* ------------------------------------------------------------------ */

struct sbuf {
    char  *buf;
    size_t n, len; /* len: what was wanted so far (may exceed n) */
};

static void sb_printf(struct sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t off = s->len < s->n ? s->len : s->n;
    int k = vsnprintf(s->buf ? s->buf + off : NULL, s->buf ? s->n - off : 0, fmt, ap);
    va_end(ap);
    if (k > 0) s->len += (size_t)k;
}

size_t mt_mesh_trace_line(const struct mt_mesh *mesh, char *buf, size_t n)
{
    struct sbuf s = {n ? buf : NULL, n, 0};
    if (s.buf) s.buf[0] = 0;
    const struct mt_mesh_coord *c = &mesh->coord;
    sb_printf(&s, "mesh rank=%d coord(pipe=%d,data=%d,expert=%d,model=%d)", mesh->rank, c->pipe, c->data, c->expert,
              c->model);
    for (int g = 0; g < MT_MESH_GROUP_COUNT; g++) {
        const struct registry_entry *e = &mesh->reg[mesh->entry_of[g]];
        sb_printf(&s, " %s{size=%d members=[", group_info[g].name, e->n);
        for (int i = 0; i < e->n; i++) {
            if (e->n > 16 && i == 3) {
                sb_printf(&s, ",...");
                i = e->n - 2;
                continue;
            }
            sb_printf(&s, "%s%d", i ? "," : "", e->members[i]);
        }
        sb_printf(&s, "] impl=%s reused=%s", e->comm->iface->name, e->first == g ? "no" : group_info[e->first].name);
        if (mesh->has_dev) sb_printf(&s, " dev=%s", e->dcomm->iface->name);
        sb_printf(&s, "}");
    }
    const struct mt_mesh_preds *p = &mesh->preds;
    sb_printf(&s, " ep_active=%d tp_active=%d sp_on=%d dp_active=%d pp_active=%d pp_stage=%d grad_dp=%d zero_stage=%d",
              p->ep_active, p->tp_active, p->sp_on, p->dp_active, p->pp_active, p->pp_stage, p->grad_dp, p->zero_stage);
    return s.len;
}

/* One rank: every group is the world's one-member communicator, so the full
 * line repeats `{size=1 members=[0] impl=self reused=world}` seven times
 * (~700 characters on every single-rank run). Said once, same facts. */
size_t mt_mesh_trace_line_brief(const struct mt_mesh *mesh, char *buf, size_t n)
{
    if (mesh->world != 1) return mt_mesh_trace_line(mesh, buf, n);
    struct sbuf s = {n ? buf : NULL, n, 0};
    if (s.buf) s.buf[0] = 0;
    const struct registry_entry *w = &mesh->reg[mesh->entry_of[MT_MESH_GROUP_WORLD]];
    sb_printf(&s, "mesh rank=0 coord(pipe=0,data=0,expert=0,model=0) world{size=1 members=[0] impl=%s reused=no",
              w->comm->iface->name);
    if (mesh->has_dev) sb_printf(&s, " dev=%s", w->dcomm->iface->name);
    sb_printf(&s, "} ");
    for (int g = 1; g < MT_MESH_GROUP_COUNT; g++) sb_printf(&s, "%s%s", g > 1 ? "," : "", group_info[g].name);
    const struct mt_mesh_preds *p = &mesh->preds;
    sb_printf(&s, "{=world} ep_active=%d tp_active=%d sp_on=%d dp_active=%d pp_active=%d pp_stage=%d grad_dp=%d "
              "zero_stage=%d", p->ep_active, p->tp_active, p->sp_on, p->dp_active, p->pp_active, p->pp_stage,
              p->grad_dp, p->zero_stage);
    return s.len;
}
