/*
 * test_ckpt.c — checkpoint save/load: bit-exact round trip with optimizer
 * state and adam t, checksum and shape errors, stale DIR.tmp, find, box
 * (row / column / 2-D) reads and writes, load of a checkpoint without
 * optimizer state. Parameters are built by hand (no model). The collective
 * save (mt_ckpt_save_group) on a self group: same bytes as the wrapper,
 * entries without data are zeros but listed, subset load (a rank loading
 * only what it owns), bad input / failed write / failed allocation lose
 * nothing and leave no DIR.tmp; NaN/Inf in a parameter or optimizer state
 * is refused (NUMERIC, naming tensor, rank, step), a file size limit is a
 * runtime failure. The manifest: every field edit behind a VALID manifest
 * checksum is refused naming the field (offsets +4/+64, step 2.7/-1, adam_t
 * 0/1e30, data_pos, seed, sizes, unknown files, shapes, version 1), optim.bin
 * dropped does not silently start a fresh optimizer, an edit without the
 * checksum is caught by it, manifest.json as a directory; the tokenizer
 * listed and verified. Resolve: latest over another run's higher step,
 * same-run fallback with a note, never another run's, several runs without
 * latest refused; remove only a run's own; the output lock. Exits non-zero
 * on failure.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "core/mt_config.h"
#include "core/mt_param.h"
#include "parallel/mt_comm.h"
#include "ops/mt_ops.h"
#include "io/mt_ckpt.h"
#include "optim/mt_optim.h"
#include "mt_test.h"


#define NP 3

static void mkparam(struct mt_ctx *ctx, struct mt_param *p, const char *name, int ndim, int r, int c,
                    enum mt_optim_kind k)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = p->len[0] = r;
    p->shape[1] = p->len[1] = ndim == 2 ? c : 1;
    p->numel = (size_t)p->len[0] * (size_t)p->len[1];
    p->data = mt_alloc(ctx, p->numel * sizeof(float), MT_BUCKET_PARAMS);
    p->grad = mt_alloc(ctx, p->numel * sizeof(float), MT_BUCKET_GRADS);
    p->optim = k;
    p->decay = ndim == 2;
}

/* the test model: one Muon matrix, one gain, one AdamW matrix */
static void mkset(struct mt_ctx *ctx, struct mt_param *ps)
{
    mkparam(ctx, &ps[0], "model.layers.0.self_attn.q_proj.weight", 2, 6, 5, MT_OPTIM_MUON);
    mkparam(ctx, &ps[1], "model.layers.0.input_layernorm.weight", 1, 5, 1, MT_OPTIM_ADAMW);
    mkparam(ctx, &ps[2], "lm_head.weight", 2, 4, 5, MT_OPTIM_ADAMW);
}

static void freeset(struct mt_ctx *ctx, struct mt_param *ps, int n)
{
    for (int i = 0; i < n; i++) { mt_free(ctx, ps[i].data); mt_free(ctx, ps[i].grad); }
}

static float rnd(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    unsigned char c;
    if (fd < 0 || pread(fd, &c, 1, off) != 1) { n_fail++; fprintf(stderr, "cannot open %s\n", path); return; }
    c ^= 0x10;
    if (pwrite(fd, &c, 1, off) != 1) n_fail++;
    close(fd);
}

/* Whole file into a fresh buffer (caller frees); NULL if unreadable. */
static char *slurp(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)*n + 1);
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) { free(b); b = NULL; }
    if (b) b[*n] = 0;
    fclose(f);
    return b;
}

/* dir1/name and dir2/name exist and hold the same bytes. */
static int same_file(const char *dir1, const char *dir2, const char *name)
{
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/%s", dir1, name);
    snprintf(p2, sizeof p2, "%s/%s", dir2, name);
    long n1 = -1, n2 = -2;
    char *b1 = slurp(p1, &n1), *b2 = slurp(p2, &n2);
    int same = b1 && b2 && n1 == n2 && memcmp(b1, b2, (size_t)n1) == 0;
    free(b1);
    free(b2);
    return same;
}

static int exists(const char *dir, const char *suffix)
{
    char p[700];
    snprintf(p, sizeof p, "%s%s", dir, suffix);
    return access(p, F_OK) == 0;
}

/*
 * The collective save on a self group. `a`/`oa` hold the trained state
 * (3 params, 5 states), `b` spare params of the same set.
 */
static void test_group(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *root, const struct mt_config *cfg,
                       struct mt_param *a, struct mt_optim *oa)
{
    char dg[520], dw[520];
    snprintf(dg, sizeof dg, "%s/group/step_000004", root);
    snprintf(dw, sizeof dw, "%s/wrapper", root);
    struct mt_ckpt_meta meta = {.step = 4, .data_pos = 77, .seed = cfg->seed, .optim_t = mt_optim_get_t(oa)};
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=2,ep=1,tp=1");
    struct mt_comm *self = NULL;
    EXPECT(mt_comm_create_self(ctx, &self) == MT_OK);

    /* the global list: params to params.bin, then states to optim.bin */
    enum { NS = 5, NE = NP + NS };
    struct mt_optim_state st[NS];
    struct mt_ckpt_entry e[NE];
    EXPECT(mt_optim_state_count(oa) == NS);
    for (int i = 0; i < NP; i++) e[i] = (struct mt_ckpt_entry){a[i].name, 0, &a[i], a[i].data};
    for (int i = 0; i < NS; i++) {
        mt_optim_state_get(oa, i, &st[i]);
        e[NP + i] = (struct mt_ckpt_entry){st[i].name, 1, st[i].param, st[i].data};
    }

    /* ---- full list == the wrapper, byte for byte (manifest included) ---- */
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, dw, cfg, &meta, a, NP, oa), MT_OK, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_OK, NULL);
    EXPECT(same_file(dg, dw, "manifest.json") && same_file(dg, dw, "params.bin") && same_file(dg, dw, "optim.bin"));

    /* ---- this "rank" owns params 0 and 2 (and their states) only: the
     *      gain and its states are written by nobody -> zeros, still listed ---- */
    for (int i = 0; i < NE; i++)
        if (e[i].p == &a[1]) e[i].data = NULL;
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_OK, NULL);
    EXPECT(!exists(dg, ".tmp"));
    struct mt_ckpt_tensor *t = NULL;
    int nt = 0;
    EXPECT_ERR_AT(ctx, mt_ckpt_read_tensors(ctx, dg, NULL, &t, &nt), MT_OK, NULL);
    EXPECT(nt == NE);
    int64_t at[2] = {0, 0};   /* the layout, recomputed: list order per file, 64-byte aligned */
    for (int i = 0; i < nt && i < NE; i++) {
        int64_t off = (at[e[i].file] + 63) / 64 * 64;
        at[e[i].file] = off + e[i].p->shape[0] * e[i].p->shape[1] * 4;
        EXPECT(!strcmp(t[i].name, e[i].name));
        EXPECT(!strcmp(t[i].file, e[i].file ? "optim.bin" : "params.bin"));
        EXPECT(t[i].offset == off && t[i].ndim == e[i].p->ndim);
        EXPECT(t[i].shape[0] == e[i].p->shape[0] && t[i].shape[1] == e[i].p->shape[1]);
    }
    mt_free(ctx, t);
    {
        struct mt_param g;   /* the unwritten gain reads back as zeros */
        mkparam(ctx, &g, a[1].name, 1, 5, 1, MT_OPTIM_ADAMW);
        for (size_t k = 0; k < g.numel; k++) g.data[k] = 7.0f;
        struct mt_optim *og = NULL;
        EXPECT(mt_optim_create(ctx, ops, cfg, &g, 1, &og) == MT_OK);
        EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, dg, &g, 1, og), MT_OK, NULL);
        int zero = 1;
        for (size_t k = 0; k < g.numel; k++) zero &= g.data[k] == 0.0f;
        for (int i = 0; i < mt_optim_state_count(og); i++) {
            struct mt_optim_state s;
            mt_optim_state_get(og, i, &s);
            for (size_t k = 0; k < s.param->numel; k++) zero &= s.data[k] == 0.0f;
        }
        EXPECT(zero && mt_optim_state_count(og) == 2);
        mt_optim_destroy(ctx, og);
        freeset(ctx, &g, 1);
    }

    /* ---- subset load: params 0 and 2, an optimizer holding only their states ---- */
    struct mt_param c[2];
    mkparam(ctx, &c[0], a[0].name, 2, 6, 5, MT_OPTIM_MUON);
    mkparam(ctx, &c[1], a[2].name, 2, 4, 5, MT_OPTIM_ADAMW);
    struct mt_optim *oc = NULL;
    EXPECT(mt_optim_create(ctx, ops, cfg, c, 2, &oc) == MT_OK);
    EXPECT(mt_optim_state_count(oc) == 3);   /* momentum_buffer, exp_avg, exp_avg_sq */
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, dg, c, 2, oc), MT_OK, NULL);
    EXPECT(same_bits(c[0].data, a[0].data, a[0].numel) && same_bits(c[1].data, a[2].data, a[2].numel));
    EXPECT(mt_optim_get_t(oc) == meta.optim_t);
    int matched = 0;
    for (int i = 0; i < mt_optim_state_count(oc); i++) {
        struct mt_optim_state s;
        mt_optim_state_get(oc, i, &s);
        for (int j = 0; j < NS; j++)
            if (!strcmp(s.name, st[j].name)) matched += same_bits(s.data, st[j].data, s.param->numel);
    }
    EXPECT(matched == 3);

    /* ---- bad input loses nothing: refused before any disk work ---- */
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dg);
    long n0 = 0, n1 = 0;
    char *before = slurp(mpath, &n0);
    struct mt_param outside = a[2];
    outside.off[0] = 1;   /* rows 1..4 of a 4-row tensor */
    struct mt_ckpt_entry keep;
    keep = e[1]; e[1].name = e[0].name;                        /* duplicate name */
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_ERR_INVALID_ARG, "listed twice");
    e[1] = keep; e[1].file = 2;                                 /* no such file */
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_ERR_INVALID_ARG, "file 2");
    e[1] = keep; keep = e[2]; e[2].p = &outside;                /* box outside the shape */
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_ERR_INVALID_ARG, "box outside");
    e[2] = keep;
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, NULL, dg, cfg, &meta, e, NE), MT_ERR_INVALID_ARG, "communicator");
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, -1), MT_ERR_INVALID_ARG, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, NULL, e, NE), MT_ERR_INVALID_ARG, NULL);
    /* meta out of range (what load would refuse is never written) */
    {
        struct mt_ckpt_meta bad = meta;
        bad.step = -1;
        EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &bad, e, NE), MT_ERR_INVALID_ARG, "out of range");
        bad = meta; bad.optim_t = 0;   /* step > 0 with optimizer state but t = 0 */
        EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &bad, e, NE), MT_ERR_INVALID_ARG, "out of range");
        bad = meta; snprintf(bad.run_id, sizeof bad.run_id, "XYZ");
        EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &bad, e, NE), MT_ERR_INVALID_ARG, "run id");
    }
    /* a non-finite value in a parameter or an optimizer state fails after
     * DIR.tmp exists: NUMERIC naming tensor, rank and step; DIR.tmp removed,
     * DIR untouched. (Each "rank" checks only the boxes it writes.) */
    {
        float *poison = malloc(a[2].numel * sizeof(float));
        memcpy(poison, a[2].data, a[2].numel * sizeof(float));
        poison[a[2].numel - 1] = NAN;
        keep = e[2]; e[2].data = poison;
        EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, NULL, self, dg, cfg, &meta, e, NE), MT_ERR_NUMERIC,
                      "tensor lm_head.weight holds a non-finite value (nan at element 19");
        EXPECT(strstr(mt_ctx_last_error(ctx), "rank 0") && strstr(mt_ctx_last_error(ctx), "step 4"));
        e[2] = keep;
        EXPECT(!exists(dg, ".tmp"));
        poison[0] = INFINITY;
        int last = NE - 1;
        keep = e[last]; e[last].data = poison;   /* an optimizer state (same shape as lm_head) */
        EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_ERR_NUMERIC, e[last].name);
        e[last] = keep;
        free(poison);
    }
    /* the disk refuses (file size limit: EFBIG, like a full disk): a runtime
     * failure (exit 1), not bad input */
    {
        struct rlimit lim0, lim;
        signal(SIGXFSZ, SIG_IGN);
        if (getrlimit(RLIMIT_FSIZE, &lim0) == 0) {
            lim = lim0;
            lim.rlim_cur = 256;
            EXPECT(setrlimit(RLIMIT_FSIZE, &lim) == 0);
            EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_ERR_RUNTIME, "File too large");
            EXPECT(setrlimit(RLIMIT_FSIZE, &lim0) == 0);
        }
    }
    EXPECT(!exists(dg, ".tmp"));
    char *after = slurp(mpath, &n1);
    EXPECT(before && after && n0 == n1 && !memcmp(before, after, (size_t)n0));
    free(before);
    free(after);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, dg, c, 2, oc), MT_OK, NULL);
    EXPECT(same_bits(c[0].data, a[0].data, a[0].numel) && same_bits(c[1].data, a[2].data, a[2].numel));

    /* ---- no entry targets optim.bin: no optim.bin; no entries at all: empty params.bin ---- */
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NP), MT_OK, NULL);
    EXPECT(exists(dg, "/params.bin") && !exists(dg, "/optim.bin"));
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, NULL, 0), MT_OK, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_read_tensors(ctx, dg, NULL, &t, &nt), MT_OK, NULL);
    EXPECT(nt == 0);
    mt_free(ctx, t);

    /* ---- injected allocation failures: OK or OOM, nothing leaks, DIR stays loadable ---- */
    EXPECT_ERR_AT(ctx, mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE), MT_OK, NULL);
    size_t live = ctx->bytes_live_total;
    for (long k = 1; k <= 8; k++) {
        ctx->fail_after = k;
        enum mt_status rc = mt_ckpt_save_group(ctx, ops, self, dg, cfg, &meta, e, NE);
        ctx->fail_after = 0;
        EXPECT(rc == MT_OK || rc == MT_ERR_OOM);
        EXPECT(ctx->bytes_live_total == live);
        EXPECT(!exists(dg, ".tmp"));
        EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, dg, c, 2, oc), MT_OK, NULL);
        ctx->fail_after = k;
        rc = mt_ckpt_save(ctx, ops, dw, cfg, &meta, a, NP, oa);
        ctx->fail_after = 0;
        EXPECT(rc == MT_OK || rc == MT_ERR_OOM);
        EXPECT(ctx->bytes_live_total == live);
    }
    EXPECT(same_bits(c[0].data, a[0].data, a[0].numel) && same_bits(c[1].data, a[2].data, a[2].numel));

    mt_optim_destroy(ctx, oc);
    freeset(ctx, c, 2);
    mt_comm_destroy(self);
}

/* ------------------------------------------------------------------ */
/* manifest validation, resolve (latest + fallback), remove, lock      */
/* ------------------------------------------------------------------ */

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0) n_fail++;
    if (f) fclose(f);
}

/* The manifest's own checksum, recomputed the documented way (xxh64 of the
 * unformatted manifest without its manifest_xxh64 key): lets a test make a
 * field edit that ONLY the field checks can catch. */
static void restamp(cJSON *m)
{
    cJSON_DeleteItemFromObjectCaseSensitive(m, "manifest_xxh64");
    char *t = cJSON_PrintUnformatted(m), hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(t, strlen(t), 0));
    free(t);
    cJSON_AddStringToObject(m, "manifest_xxh64", hex);
}

enum edit {
    ED_OFF0_64, ED_OFF1_4, ED_OFF1_64, ED_STEP_FRAC, ED_STEP_NEG, ED_ADAM_T0, ED_ADAM_T_HUGE, ED_DATA_POS_NEG,
    ED_SEED, ED_SIZE, ED_UNKNOWN_FILE, ED_SHAPE_FRAC, ED_TENSOR_FILE, ED_VERSION1, ED_DROP_OPTIM, ED_N
};

/* Apply one edit to DIR/manifest.json (restamped unless `raw`). */
static void edit_manifest(const char *dir, enum edit ed, int raw)
{
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    long n = 0;
    char *text = slurp(path, &n);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!m) { n_fail++; return; }
    cJSON *meta = cJSON_GetObjectItem(m, "meta"), *ts = cJSON_GetObjectItem(m, "tensors");
    cJSON *files = cJSON_GetObjectItem(m, "files");
    cJSON *t0 = cJSON_GetArrayItem(ts, 0), *t1 = cJSON_GetArrayItem(ts, 1);
#define SETNUM(o, k, v) cJSON_SetNumberHelper(cJSON_GetObjectItem((o), (k)), (v))
    switch (ed) {
    case ED_OFF0_64:      SETNUM(t0, "offset", cJSON_GetObjectItem(t0, "offset")->valuedouble + 64); break;
    case ED_OFF1_4:       SETNUM(t1, "offset", cJSON_GetObjectItem(t1, "offset")->valuedouble + 4); break;
    case ED_OFF1_64:      SETNUM(t1, "offset", cJSON_GetObjectItem(t1, "offset")->valuedouble + 64); break;
    case ED_STEP_FRAC:    SETNUM(meta, "step", 2.7); break;
    case ED_STEP_NEG:     SETNUM(meta, "step", -1); break;
    case ED_ADAM_T0:      SETNUM(meta, "adam_t", 0); break;
    case ED_ADAM_T_HUGE:  SETNUM(meta, "adam_t", 1e30); break;
    case ED_DATA_POS_NEG: SETNUM(meta, "data_pos", -5); break;
    case ED_SEED:         cJSON_ReplaceItemInObject(meta, "seed", cJSON_CreateString("12x")); break;
    case ED_SIZE: {
        cJSON *pb = cJSON_GetObjectItem(files, "params.bin");
        SETNUM(pb, "size", cJSON_GetObjectItem(pb, "size")->valuedouble + 64);
        break;
    }
    case ED_UNKNOWN_FILE:
        cJSON_AddItemToObject(files, "evil.bin", cJSON_Duplicate(cJSON_GetObjectItem(files, "params.bin"), 1));
        break;
    case ED_SHAPE_FRAC:   cJSON_SetNumberHelper(cJSON_GetArrayItem(cJSON_GetObjectItem(t0, "shape"), 0), 6.5); break;
    case ED_TENSOR_FILE:  cJSON_ReplaceItemInObject(t0, "file", cJSON_CreateString("tokenizer.bin")); break;
    case ED_VERSION1:     SETNUM(m, "version", 1); break;
    case ED_DROP_OPTIM:   /* what "removing optim.bin from the manifest" means */
        cJSON_DeleteItemFromObject(files, "optim.bin");
        for (int i = cJSON_GetArraySize(ts) - 1; i >= 0; i--)
            if (!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(ts, i), "file")->valuestring, "optim.bin"))
                cJSON_DeleteItemFromArray(ts, i);
        break;
    case ED_N: break;
    }
#undef SETNUM
    if (!raw) restamp(m);
    char *out = cJSON_Print(m);
    spit(path, out);
    free(out);
    cJSON_Delete(m);
}

static void test_manifest(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *root, const struct mt_config *cfg,
                          struct mt_param *a, struct mt_optim *oa)
{
    char d[600], path[700];
    snprintf(d, sizeof d, "%s/mf/step_000003", root);
    struct mt_ckpt_meta meta = {.step = 3, .data_pos = 12, .seed = 5, .optim_t = 3};
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, d, cfg, &meta, a, NP, oa), MT_OK, NULL);
    snprintf(path, sizeof path, "%s/manifest.json", d);
    long n0 = 0;
    char *orig = slurp(path, &n0);
    if (!orig) { n_fail++; return; }
    struct mt_config c2;
    struct mt_ckpt_meta m2;
    struct mt_param b[NP];
    mkset(ctx, b);
    struct mt_optim *ob = NULL;
    EXPECT(mt_optim_create(ctx, ops, cfg, b, NP, &ob) == MT_OK);

    /* every field edit, with a VALID manifest checksum, is refused naming the field */
    static const char *const want[ED_N] = {
        [ED_OFF0_64] = "layout puts it at 0", [ED_OFF1_4] = "offset", [ED_OFF1_64] = "offset",
        [ED_STEP_FRAC] = "meta.step", [ED_STEP_NEG] = "meta.step", [ED_ADAM_T0] = "adam_t",
        [ED_ADAM_T_HUGE] = "adam_t", [ED_DATA_POS_NEG] = "data_pos", [ED_SEED] = "seed",
        [ED_SIZE] = "params.bin", [ED_UNKNOWN_FILE] = "evil.bin", [ED_SHAPE_FRAC] = "bad shape",
        [ED_TENSOR_FILE] = "params.bin or optim.bin", [ED_VERSION1] = "version 1",
    };
    for (int ed = 0; ed < ED_N; ed++) {
        if (ed == ED_DROP_OPTIM) continue;
        edit_manifest(d, (enum edit)ed, 0);
        EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, d, &c2, &m2), MT_ERR_FORMAT, want[ed]);
        EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, d, b, NP, ob), MT_ERR_FORMAT, want[ed]);
        spit(path, orig);
    }
    /* optim.bin dropped from the manifest (consistently): a valid manifest,
     * but a step-3 checkpoint without optimizer state does not resume */
    edit_manifest(d, ED_DROP_OPTIM, 0);
    EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, d, &c2, &m2), MT_OK, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, d, b, NP, ob), MT_ERR_FORMAT, "no optimizer state");
    spit(path, orig);
    /* any edit without the checksum updated: the checksum catches it */
    edit_manifest(d, ED_STEP_NEG, 1);
    EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, d, &c2, &m2), MT_ERR_FORMAT, "manifest checksum");
    spit(path, orig);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, d, b, NP, ob), MT_OK, NULL);   /* restored: fine again */
    /* manifest.json a directory: a clear message, not a huge allocation */
    EXPECT(unlink(path) == 0 && mkdir(path, 0755) == 0);
    EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, d, &c2, &m2), MT_ERR_FORMAT, "not a regular file");
    rmdir(path);
    spit(path, orig);
    free(orig);

    /* ---- the tokenizer: listed with its checksum, verified ---- */
    char tok[600];
    snprintf(tok, sizeof tok, "%s/tok.bin", root);
    spit(tok, "a tokenizer of sorts");
    meta.tokenizer = tok;
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, d, cfg, &meta, a, NP, oa), MT_OK, NULL);
    struct mt_ckpt_tensor *t = NULL;
    int nt = 0;
    EXPECT_ERR_AT(ctx, mt_ckpt_read_tensors(ctx, d, NULL, &t, &nt), MT_OK, NULL);
    mt_free(ctx, t);
    snprintf(path, sizeof path, "%s/tokenizer.bin", d);
    long nk = 0;
    char *copied = slurp(path, &nk);
    EXPECT(copied && nk == 20 && !memcmp(copied, "a tokenizer of sorts", 20));
    free(copied);
    spit(path, "");   /* the 0-byte tokenizer of the bug report */
    EXPECT_ERR_AT(ctx, mt_ckpt_read_tensors(ctx, d, NULL, &t, &nt), MT_ERR_FORMAT, "tokenizer.bin");
    mt_free(ctx, t);
    snprintf(tok, sizeof tok, "%s/no-such-tokenizer", root);
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, d, cfg, &meta, a, NP, oa), MT_ERR_INVALID_ARG, "tokenizer");

    mt_optim_destroy(ctx, ob);
    freeset(ctx, b, NP);
}

static void save_step(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *out, const struct mt_config *cfg,
                      struct mt_param *a, struct mt_optim *oa, int step, const char *run)
{
    char d[700];
    snprintf(d, sizeof d, "%s/ckpt/step_%06d", out, step);
    struct mt_ckpt_meta meta = {.step = step, .data_pos = step, .seed = 1, .optim_t = step};
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    snprintf(meta.run_id, sizeof meta.run_id, "%s", run);
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, d, cfg, &meta, a, NP, oa), MT_OK, NULL);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static void test_resolve(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *root, const struct mt_config *cfg,
                         struct mt_param *a, struct mt_optim *oa)
{
    char out[600], got[800], note[1024], path[800];
    snprintf(out, sizeof out, "%s/res", root);
    char A[MT_CKPT_RUN_ID_LEN], B[MT_CKPT_RUN_ID_LEN];
    mt_ckpt_run_id_new(A);
    mt_ckpt_run_id_new(B);
    EXPECT(strlen(A) == 16 && strspn(A, "0123456789abcdef") == 16 && strcmp(A, B));
    /* an older run A reached step 8; a newer run B wrote 3 and 6 into the same OUT */
    save_step(ctx, ops, out, cfg, a, oa, 2, A);
    save_step(ctx, ops, out, cfg, a, oa, 4, A);
    save_step(ctx, ops, out, cfg, a, oa, 8, A);
    save_step(ctx, ops, out, cfg, a, oa, 3, B);
    save_step(ctx, ops, out, cfg, a, oa, 6, B);
    snprintf(path, sizeof path, "%s/ckpt/latest", out);
    long n = 0;
    char *lat = slurp(path, &n);
    char want[64];
    snprintf(want, sizeof want, "step_000006\n%s\n", B);
    EXPECT(lat && !strcmp(lat, want));
    free(lat);
    snprintf(path, sizeof path, "%s/ckpt/latest.tmp", out);
    EXPECT(access(path, F_OK) != 0);

    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_OK, NULL);
    EXPECT(ends_with(got, "/ckpt/step_000006") && !note[0]);   /* not A's step 8 */
    /* the newest of B damaged: B's step 3, said in the note; never A's 8 or 4 */
    snprintf(path, sizeof path, "%s/ckpt/step_000006/optim.bin", out);
    flip_byte(path, 9);
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_OK, NULL);
    EXPECT(ends_with(got, "/ckpt/step_000003") && strstr(note, "falling back") && strstr(note, "step_000006") &&
           strstr(note, "optim.bin"));
    EXPECT_ERR_AT(ctx, mt_ckpt_find(ctx, out, got, sizeof got), MT_ERR_FORMAT, "pass that checkpoint directory");
    snprintf(path, sizeof path, "%s/ckpt/step_000003/params.bin", out);
    flip_byte(path, 9);
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_ERR_FORMAT, "no intact earlier");
    flip_byte(path, 9);
    /* no latest (an older build's output): the newest intact step, unless the
     * intact ones belong to several runs */
    snprintf(path, sizeof path, "%s/ckpt/latest", out);
    unlink(path);
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_ERR_INVALID_ARG, "several runs");
    snprintf(path, sizeof path, "%s/ckpt/step_000003/params.bin", out);
    flip_byte(path, 9);   /* B's remaining one damaged too: only A's are intact */
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_OK, NULL);
    EXPECT(ends_with(got, "/ckpt/step_000008") && !note[0]);
    /* the checkpoint dir itself */
    snprintf(path, sizeof path, "%s/ckpt/step_000004", out);
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, path, got, sizeof got, note, sizeof note), MT_OK, NULL);
    EXPECT(!strcmp(got, path));
    /* find == resolve */
    EXPECT_ERR_AT(ctx, mt_ckpt_find(ctx, out, got, sizeof got), MT_OK, NULL);
    EXPECT(ends_with(got, "/ckpt/step_000008"));
    /* a malformed latest is refused, not ignored */
    snprintf(path, sizeof path, "%s/ckpt/latest", out);
    spit(path, "../../etc\nzz\n");
    EXPECT_ERR_AT(ctx, mt_ckpt_resolve(ctx, out, got, sizeof got, note, sizeof note), MT_ERR_FORMAT, "malformed");
    unlink(path);

    /* remove: only a checkpoint of the given run */
    snprintf(path, sizeof path, "%s/ckpt/step_000002", out);
    EXPECT_ERR_AT(ctx, mt_ckpt_remove(ctx, path, B), MT_ERR_INVALID_ARG, "belongs to run");
    EXPECT(access(path, F_OK) == 0);
    EXPECT_ERR_AT(ctx, mt_ckpt_remove(ctx, path, ""), MT_ERR_INVALID_ARG, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_remove(ctx, path, A), MT_OK, NULL);
    EXPECT(access(path, F_OK) != 0);

    /* the output lock: a second holder is refused until the first lets go */
    int f1 = -1, f2 = -1;
    EXPECT_ERR_AT(ctx, mt_ckpt_lock(ctx, out, &f1), MT_OK, NULL);
    EXPECT(f1 >= 0);
    EXPECT_ERR_AT(ctx, mt_ckpt_lock(ctx, out, &f2), MT_ERR_INVALID_ARG, "in use");
    EXPECT(f2 == -1);
    mt_ckpt_unlock(f1);
    EXPECT_ERR_AT(ctx, mt_ckpt_lock(ctx, out, &f2), MT_OK, NULL);
    mt_ckpt_unlock(f2);
    snprintf(path, sizeof path, "%s/ckpt/step_000004/params.bin/out", out);   /* under a file: bad input */
    EXPECT_ERR_AT(ctx, mt_ckpt_lock(ctx, path, &f1), MT_ERR_IO, "cannot create output directory");
}

/* ------------------------------------------------------------------ */
/* adapter-only checkpoints (LoRA): the base by manifest hash          */
/* ------------------------------------------------------------------ */

enum base_edit { BE_DROP, BE_VERSION2, BE_HASH, BE_PATH_EMPTY, BE_N };

/* One edit of DIR/manifest.json's base reference, restamped: only the
 * field checks can catch it. */
static void edit_base(const char *dir, enum base_edit ed)
{
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    long n = 0;
    char *text = slurp(path, &n);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!m) { n_fail++; return; }
    cJSON *b = cJSON_GetObjectItem(m, "base");
    switch (ed) {
    case BE_DROP:       cJSON_DeleteItemFromObject(m, "base"); break;
    case BE_VERSION2:   cJSON_SetNumberHelper(cJSON_GetObjectItem(m, "version"), 2); break;
    case BE_HASH:       cJSON_ReplaceItemInObject(b, "manifest_hash", cJSON_CreateString("0123456789abcdeg")); break;
    case BE_PATH_EMPTY: cJSON_ReplaceItemInObject(b, "path", cJSON_CreateString("")); break;
    case BE_N: break;
    }
    restamp(m);
    char *out = cJSON_Print(m);
    spit(path, out);
    free(out);
    cJSON_Delete(m);
}

/* The frozen base (f[0], f[1]) is saved once; the adapter-only checkpoint
 * holds f[2] and its AdamW state and names the base. Loading the adapter
 * checkpoint fills every parameter (the base's from the base) and the
 * optimizer bit for bit; a base with another hash, a missing one, a chain,
 * and malformed references are refused. */
static void test_adapter(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *root, const struct mt_config *cfg,
                         const struct mt_param *a)
{
    char base[600], other[600], ad[600], chain[600], gone[600], path[700];
    snprintf(base, sizeof base, "%s/ad/base", root);
    snprintf(other, sizeof other, "%s/ad/other", root);
    snprintf(ad, sizeof ad, "%s/ad/adapter", root);
    snprintf(chain, sizeof chain, "%s/ad/chain", root);
    snprintf(gone, sizeof gone, "%s/ad/base.moved", root);
    struct mt_param f[NP], g[NP];
    mkset(ctx, f);
    mkset(ctx, g);
    for (int i = 0; i < NP; i++) memcpy(f[i].data, a[i].data, a[i].numel * sizeof(float));
    f[0].frozen = f[1].frozen = g[0].frozen = g[1].frozen = 1;
    struct mt_ckpt_meta m0 = {.seed = 1};
    snprintf(m0.mesh, sizeof m0.mesh, "pp=1,dp=1,ep=1,tp=1");
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, base, cfg, &m0, f, NP, NULL), MT_OK, NULL);
    m0.seed = 2;   /* another manifest, the same tensors */
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, other, cfg, &m0, f, NP, NULL), MT_OK, NULL);
    char h[MT_CKPT_RUN_ID_LEN], ho[MT_CKPT_RUN_ID_LEN];
    EXPECT_ERR_AT(ctx, mt_ckpt_manifest_hash(ctx, base, h), MT_OK, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_manifest_hash(ctx, other, ho), MT_OK, NULL);
    EXPECT(strlen(h) == 16 && strcmp(h, ho) != 0);

    /* train the adapter (f[2]) 2 steps; the frozen ones get no state */
    struct mt_optim *of = NULL, *og = NULL;
    EXPECT(mt_optim_create(ctx, ops, cfg, f, NP, &of) == MT_OK && mt_optim_state_count(of) == 2);
    unsigned s = 5;
    for (int step = 0; step < 2; step++) {
        for (size_t k = 0; k < f[2].numel; k++) f[2].grad[k] = rnd(&s);
        EXPECT(mt_optim_step(ctx, of, step, 1.0) == MT_OK);
    }
    struct mt_ckpt_meta ma = {.step = 2, .data_pos = 2, .seed = 1, .optim_t = 2};
    snprintf(ma.mesh, sizeof ma.mesh, "pp=1,dp=1,ep=1,tp=1");
    /* a malformed reference is never written */
    snprintf(ma.base_hash, sizeof ma.base_hash, "not-hex-digits!!");
    snprintf(ma.base_path, sizeof ma.base_path, "%s", base);
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, ad, cfg, &ma, &f[2], 1, of), MT_ERR_INVALID_ARG, "base reference");
    EXPECT(!exists(ad, ""));
    snprintf(ma.base_hash, sizeof ma.base_hash, "%s", h);
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, ad, cfg, &ma, &f[2], 1, of), MT_OK, NULL);
    struct mt_ckpt_meta mr;
    EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, ad, NULL, &mr), MT_OK, NULL);
    EXPECT(!strcmp(mr.base_hash, h) && !strcmp(mr.base_path, base));
    struct mt_ckpt_tensor *t = NULL;
    int nt = 0;
    EXPECT_ERR_AT(ctx, mt_ckpt_read_tensors(ctx, ad, "params.bin", &t, &nt), MT_OK, NULL);
    EXPECT(nt == 1 && t && !strcmp(t[0].name, "lm_head.weight"));
    mt_free(ctx, t);

    /* load: the base's tensors from the base, the adapter and its state from ad */
    EXPECT(mt_optim_create(ctx, ops, cfg, g, NP, &og) == MT_OK);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, ad, g, NP, og), MT_OK, NULL);
    for (int i = 0; i < NP; i++) EXPECT(same_bits(f[i].data, g[i].data, f[i].numel));
    EXPECT(mt_optim_get_t(og) == 2);
    for (int i = 0; i < mt_optim_state_count(og); i++) {
        struct mt_optim_state x, y;
        mt_optim_state_get(of, i, &x);
        mt_optim_state_get(og, i, &y);
        EXPECT(!strcmp(x.name, y.name) && same_bits(x.data, y.data, x.param->numel));
    }
    /* refusals: another base, a full checkpoint given a base, a missing base
     * (then found where it moved), a chain */
    EXPECT_ERR_AT(ctx, mt_ckpt_load_base(ctx, ops, ad, other, g, NP, og), MT_ERR_INVALID_ARG, "not the same base");
    EXPECT_ERR_AT(ctx, mt_ckpt_load_base(ctx, ops, base, other, g, NP, NULL), MT_ERR_INVALID_ARG, "full checkpoint");
    EXPECT(rename(base, gone) == 0);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, ad, g, NP, og), MT_ERR_INVALID_ARG, "is missing");
    memset(g[0].data, 0, g[0].numel * sizeof(float));
    EXPECT_ERR_AT(ctx, mt_ckpt_load_base(ctx, ops, ad, gone, g, NP, og), MT_OK, NULL);
    EXPECT(same_bits(f[0].data, g[0].data, f[0].numel));
    EXPECT(rename(gone, base) == 0);
    char ha[MT_CKPT_RUN_ID_LEN];
    EXPECT_ERR_AT(ctx, mt_ckpt_manifest_hash(ctx, ad, ha), MT_OK, NULL);
    snprintf(ma.base_hash, sizeof ma.base_hash, "%s", ha);
    snprintf(ma.base_path, sizeof ma.base_path, "%s", ad);
    EXPECT_ERR_AT(ctx, mt_ckpt_save(ctx, ops, chain, cfg, &ma, &f[2], 1, of), MT_OK, NULL);
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, chain, g, NP, og), MT_ERR_INVALID_ARG, "itself adapter-only");

    /* the reference is validated like every field (version 3 <=> a base) */
    snprintf(path, sizeof path, "%s/manifest.json", ad);
    long n0 = 0;
    char *orig = slurp(path, &n0);
    static const char *const want[BE_N] = {"present iff version is 3", "present iff version is 3", "16 hex digits",
                                           "16 hex digits"};
    for (int ed = 0; orig && ed < BE_N; ed++) {
        edit_base(ad, (enum base_edit)ed);
        EXPECT_ERR_AT(ctx, mt_ckpt_read_meta(ctx, ad, NULL, &mr), MT_ERR_FORMAT, want[ed]);
        spit(path, orig);
    }
    EXPECT_ERR_AT(ctx, mt_ckpt_load(ctx, ops, ad, g, NP, og), MT_OK, NULL);   /* restored: fine again */
    free(orig);
    mt_optim_destroy(ctx, of);
    mt_optim_destroy(ctx, og);
    freeset(ctx, f, NP);
    freeset(ctx, g, NP);
}

int main(void)
{
    const struct mt_ops_i *ops = mt_ops_cpu();
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    char root[] = "/tmp/mt_test_ckpt_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    char dir[512], path[600], found[600];
    snprintf(dir, sizeof dir, "%s/ckpt/step_000002", root);

    struct mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.grad_clip = 0.0f;
    cfg.seed = 0xfedcba9876543210ull;   /* exercises the u64 path */
    cfg.warmup_steps = 0;

    /* ---- train 2 steps, save ---- */
    struct mt_param a[NP], b[NP];
    mkset(&ctx, a);
    unsigned s = 11;
    for (int i = 0; i < NP; i++)
        for (size_t k = 0; k < a[i].numel; k++) a[i].data[k] = rnd(&s);
    struct mt_optim *oa = NULL, *ob = NULL;
    EXPECT(mt_optim_create(&ctx, ops, &cfg, a, NP, &oa) == MT_OK);
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < NP; i++)
            for (size_t k = 0; k < a[i].numel; k++) a[i].grad[k] = rnd(&s);
        EXPECT(mt_optim_step(&ctx, oa, step, 1.0) == MT_OK);
    }
    struct mt_ckpt_meta meta = {.step = 2, .data_pos = 1234567, .seed = cfg.seed, .optim_t = mt_optim_get_t(oa)};
    snprintf(meta.mesh, sizeof meta.mesh, "pp=1,dp=1,ep=1,tp=1");
    EXPECT(meta.optim_t == 2);
    EXPECT_ERR(mt_ckpt_save(&ctx, ops, dir, &cfg, &meta, a, NP, oa), MT_OK, NULL);

    /* ---- meta + config round trip ---- */
    struct mt_config c2;
    struct mt_ckpt_meta m2;
    EXPECT_ERR(mt_ckpt_read_meta(&ctx, dir, &c2, &m2), MT_OK, NULL);
    EXPECT(m2.step == 2 && m2.data_pos == 1234567 && m2.optim_t == 2 && m2.seed == 0xfedcba9876543210ull);
    EXPECT(!strcmp(m2.mesh, "pp=1,dp=1,ep=1,tp=1"));
    EXPECT(c2.seed == cfg.seed && c2.d_model == cfg.d_model && c2.grad_clip == cfg.grad_clip);

    /* ---- bit-exact load into fresh params + optimizer ---- */
    mkset(&ctx, b);
    EXPECT(mt_optim_create(&ctx, ops, &cfg, b, NP, &ob) == MT_OK);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, ob), MT_OK, NULL);
    for (int i = 0; i < NP; i++) EXPECT(same_bits(a[i].data, b[i].data, a[i].numel));
    EXPECT(mt_optim_get_t(ob) == 2);
    EXPECT(mt_optim_state_count(ob) == mt_optim_state_count(oa) && mt_optim_state_count(oa) == 5);
    for (int i = 0; i < mt_optim_state_count(oa); i++) {
        struct mt_optim_state sa, sb;
        mt_optim_state_get(oa, i, &sa);
        mt_optim_state_get(ob, i, &sb);
        EXPECT(!strcmp(sa.name, sb.name));
        EXPECT(same_bits(sa.data, sb.data, sa.param->numel));
    }
    /* continuing from the load equals continuing the original */
    for (int i = 0; i < NP; i++)
        for (size_t k = 0; k < a[i].numel; k++) b[i].grad[k] = a[i].grad[k] = rnd(&s);
    EXPECT(mt_optim_step(&ctx, oa, 2, 1.0) == MT_OK);
    EXPECT(mt_optim_step(&ctx, ob, 2, 1.0) == MT_OK);
    for (int i = 0; i < NP; i++) EXPECT(same_bits(a[i].data, b[i].data, a[i].numel));

    /* ---- find: the dir itself, or the latest step under OUT/ckpt; stale .tmp ignored ---- */
    EXPECT_ERR(mt_ckpt_find(&ctx, dir, found, sizeof found), MT_OK, NULL);
    EXPECT(!strcmp(found, dir));
    snprintf(path, sizeof path, "%s/ckpt/step_000009.tmp", root);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/ckpt/step_000009.tmp/params.bin", root);
    FILE *f = fopen(path, "w");
    if (f) { fputs("junk", f); fclose(f); }
    snprintf(path, sizeof path, "%s/ckpt/step_000002.tmp", root);   /* stale tmp of the dir we save again */
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/ckpt/step_000002.tmp/manifest.json", root);
    f = fopen(path, "w");
    if (f) { fputs("{ not json", f); fclose(f); }
    EXPECT_ERR(mt_ckpt_find(&ctx, root, found, sizeof found), MT_OK, NULL);
    EXPECT(!strcmp(found, dir));
    EXPECT_ERR(mt_ckpt_find(&ctx, "/nonexistent/out", found, sizeof found), MT_ERR_IO, NULL);
    /* saving over an existing checkpoint with a stale DIR.tmp present */
    meta.optim_t = mt_optim_get_t(oa);
    meta.step = 3;
    EXPECT_ERR(mt_ckpt_save(&ctx, ops, dir, &cfg, &meta, a, NP, oa), MT_OK, NULL);
    snprintf(path, sizeof path, "%s/ckpt/step_000002.tmp", root);
    EXPECT(access(path, F_OK) != 0);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, ob), MT_OK, NULL);
    EXPECT(mt_optim_get_t(ob) == 3);
    for (int i = 0; i < NP; i++) EXPECT(same_bits(a[i].data, b[i].data, a[i].numel));

    /* ---- flipped byte in params.bin -> FORMAT naming the file ---- */
    snprintf(path, sizeof path, "%s/params.bin", dir);
    flip_byte(path, 70);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, NULL), MT_ERR_FORMAT, "params.bin");
    flip_byte(path, 70);
    snprintf(path, sizeof path, "%s/optim.bin", dir);
    flip_byte(path, 3);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, ob), MT_ERR_FORMAT, "optim.bin");
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, NULL), MT_OK, NULL);   /* params only: fine */
    flip_byte(path, 3);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, b, NP, ob), MT_OK, NULL);

    /* ---- shape mismatch / missing tensor -> FORMAT naming the tensor ---- */
    struct mt_param bad;
    mkparam(&ctx, &bad, "lm_head.weight", 2, 5, 4, MT_OPTIM_ADAMW);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, &bad, 1, NULL), MT_ERR_FORMAT, "lm_head.weight");
    snprintf(bad.name, sizeof bad.name, "model.norm.weight");
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, &bad, 1, NULL), MT_ERR_FORMAT, "model.norm.weight");
    freeset(&ctx, &bad, 1);
    EXPECT_ERR(mt_ckpt_load(&ctx, ops, "/nonexistent/ck", b, NP, NULL), MT_ERR_IO, NULL);

    /* ---- boxes: rows, columns, both, of the saved 6x5 q_proj ---- */
    const struct mt_param *full = &a[0];
    struct { int64_t off0, len0, off1, len1; } boxes[] = {{2, 3, 0, 5}, {0, 6, 1, 3}, {1, 4, 2, 2}, {5, 1, 4, 1}};
    for (size_t bi = 0; bi < sizeof boxes / sizeof boxes[0]; bi++) {
        struct mt_param p = *full;
        p.off[0] = boxes[bi].off0; p.len[0] = boxes[bi].len0;
        p.off[1] = boxes[bi].off1; p.len[1] = boxes[bi].len1;
        p.numel = (size_t)(p.len[0] * p.len[1]);
        p.data = mt_alloc(&ctx, p.numel * sizeof(float), MT_BUCKET_PARAMS);
        EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir, &p, 1, NULL), MT_OK, NULL);
        int ok = 1;
        for (int64_t i = 0; i < p.len[0]; i++)
            for (int64_t j = 0; j < p.len[1]; j++)
                ok &= p.data[i * p.len[1] + j] == full->data[(p.off[0] + i) * full->shape[1] + p.off[1] + j];
        EXPECT(ok);
        mt_free(&ctx, p.data);
    }
    /* box write: a column box saved alone lands at its global place, zeros elsewhere */
    {
        char dir2[520];
        snprintf(dir2, sizeof dir2, "%s/boxsave", root);
        struct mt_param p = *full;
        p.off[1] = 2; p.len[1] = 2;
        p.numel = 12;
        p.data = mt_alloc(&ctx, p.numel * sizeof(float), MT_BUCKET_PARAMS);
        for (size_t k = 0; k < 12; k++) p.data[k] = (float)(k + 1);
        EXPECT_ERR(mt_ckpt_save(&ctx, ops, dir2, &cfg, &meta, &p, 1, NULL), MT_OK, NULL);
        struct mt_param q = *full;
        q.data = mt_alloc(&ctx, q.numel * sizeof(float), MT_BUCKET_PARAMS);
        EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir2, &q, 1, NULL), MT_OK, NULL);
        int ok = 1;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 5; j++)
                ok &= q.data[i * 5 + j] == ((j == 2 || j == 3) ? (float)(i * 2 + (j - 2) + 1) : 0.0f);
        EXPECT(ok);
        mt_free(&ctx, p.data);
        mt_free(&ctx, q.data);
    }

    /* ---- checkpoint without optimizer state: at step > 0 refused (a resume
     * would silently restart the optimizer); at step 0 (an import) params load,
     * state zeroed, t = 0 ---- */
    {
        char dir3[520];
        snprintf(dir3, sizeof dir3, "%s/noopt", root);
        meta.optim_t = 0;
        EXPECT_ERR(mt_ckpt_save(&ctx, NULL, dir3, &cfg, &meta, a, NP, NULL), MT_OK, NULL);   /* ops NULL: host */
        snprintf(path, sizeof path, "%s/optim.bin", dir3);
        EXPECT(access(path, F_OK) != 0);
        EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir3, b, NP, ob), MT_ERR_FORMAT, "no optimizer state");
        EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir3, b, NP, NULL), MT_OK, NULL);   /* params only: fine */
        meta.step = 0;
        EXPECT_ERR(mt_ckpt_save(&ctx, NULL, dir3, &cfg, &meta, a, NP, NULL), MT_OK, NULL);
        EXPECT_ERR(mt_ckpt_load(&ctx, ops, dir3, b, NP, ob), MT_OK, NULL);
        EXPECT(mt_optim_get_t(ob) == 0);
        for (int i = 0; i < mt_optim_state_count(ob); i++) {
            struct mt_optim_state st;
            mt_optim_state_get(ob, i, &st);
            int zero = 1;
            for (size_t k = 0; k < st.param->numel; k++) zero &= st.data[k] == 0.0f;
            EXPECT(zero);
        }
        for (int i = 0; i < NP; i++) EXPECT(same_bits(a[i].data, b[i].data, a[i].numel));
        struct mt_ckpt_tensor *t = NULL;
        int nt = 0;
        EXPECT_ERR(mt_ckpt_read_tensors(&ctx, dir3, "params.bin", &t, &nt), MT_OK, NULL);
        EXPECT(nt == NP && t && t[0].offset == 0 && t[1].offset % 64 == 0 && t[1].ndim == 1 && t[1].shape[0] == 5);
        mt_free(&ctx, t);
    }

    /* ---- the collective save on a self group ---- */
    test_group(&ctx, ops, root, &cfg, a, oa);
    /* ---- manifest validation, tokenizer; resolve, remove, lock ---- */
    test_manifest(&ctx, ops, root, &cfg, a, oa);
    test_resolve(&ctx, ops, root, &cfg, a, oa);
    /* ---- adapter-only checkpoints: the base by manifest hash ---- */
    test_adapter(&ctx, ops, root, &cfg, a);

    /* ---- injected allocation failures: an error, nothing leaks ---- */
    {
        size_t live = ctx.bytes_live_total;
        for (long k = 1; k <= 6; k++) {
            ctx.fail_after = k;
            enum mt_status st = mt_ckpt_load(&ctx, ops, dir, b, NP, ob);
            ctx.fail_after = 0;
            EXPECT(st == MT_OK || st == MT_ERR_OOM);
            EXPECT(ctx.bytes_live_total == live);
        }
    }

    mt_optim_destroy(&ctx, oa);
    mt_optim_destroy(&ctx, ob);
    freeset(&ctx, a, NP);
    freeset(&ctx, b, NP);
    EXPECT(ctx.bytes_live_total == 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    if (n_fail) {
        fprintf(stderr, "test_ckpt: %d check(s) failed\n", n_fail);
        return 1;
    }
    printf("test_ckpt: ok\n");
    return 0;
}
