/*
 * cmd_plan.c — `meshtrain plan`: check a config and a mesh against the
 * startup contract (SPEC.md section 2) and print every parameter's global
 * shape and the memory plan per bucket, without allocating the model.
 *
 *   meshtrain plan --config F [--set k=v]... --world N [--mesh pp=1,dp=..,ep=..,tp=..]
 *
 * Mesh: omitted axes have size 1 (SPEC.md); with no --mesh at all the whole
 * world is data parallel (dp = N). Every contract violation is one line on
 * stderr and exit code 2.
 *
 * Memory plan: the numbers come from the pure size functions
 * mt_model_plan_bytes (for this rank's microbatch, batch_size /
 * (dp*ep*microbatches) sequences) and mt_optim_plan_bytes. They are the plan
 * of ONE rank holding the whole model: TP / EP / PP / ZeRO sharding of the
 * plan is not applied yet, and the output says so when world > 1.
 *
 * The parameter list is rebuilt here from the config in the order and with
 * the names of mt_model.h (there is no public allocation-free listing yet);
 * its total is checked against mt_model_param_counts, so a drift between the
 * two is caught (exit 1) instead of printing a wrong plan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "core/mt_config.h"
#include "core/mt_core.h"
#include "core/mt_param.h"
#include "model/mt_model.h"
#include "train/mt_optim.h"

struct mesh { int pp, dp, ep, tp; };

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain plan --config F [--set KEY=VALUE]... --world N [--mesh pp=1,dp=2,ep=1,tp=2]\n\n"
            "  --config FILE     JSON config (see meshtrain train --help for the keys)\n"
            "  --set KEY=VALUE   override one config key (repeatable)\n"
            "  --world N         number of ranks                              default: 1\n"
            "  --mesh SPEC       axis sizes; omitted axes are 1               default: dp=N\n\n"
            "Checks the startup contract and prints every parameter's global shape and the\n"
            "memory plan per bucket. exit codes: 0 ok, 2 bad input or config, 1 runtime failure\n");
}

/* strict positive int: all digits, no sign, no overflow */
static int parse_pos_int(const char *s, int *out)
{
    char *end = NULL;
    if (!s || *s < '0' || *s > '9') return -1;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 1 || v > 1 << 20) return -1;
    *out = (int)v;
    return 0;
}

/* "pp=1,dp=2,ep=1,tp=2" -> mesh; -1 with a message in err on bad input. */
static int parse_mesh(const char *spec, struct mesh *m, char *err, size_t errlen)
{
    *m = (struct mesh){1, 1, 1, 1};
    int seen[4] = {0};
    const char *names[4] = {"pp", "dp", "ep", "tp"};
    int *slots[4] = {&m->pp, &m->dp, &m->ep, &m->tp};
    char buf[256];
    if (strlen(spec) >= sizeof buf) return snprintf(err, errlen, "--mesh '%s' is too long", spec), -1;
    strcpy(buf, spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return snprintf(err, errlen, "--mesh: '%s' is not axis=size (axes pp, dp, ep, tp)", tok), -1;
        *eq = '\0';
        int a = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(tok, names[i])) a = i;
        if (a < 0) return snprintf(err, errlen, "--mesh: unknown axis '%s' (axes pp, dp, ep, tp)", tok), -1;
        if (seen[a]) return snprintf(err, errlen, "--mesh: axis '%s' given twice", tok), -1;
        if (parse_pos_int(eq + 1, slots[a]))
            return snprintf(err, errlen, "--mesh: %s=%s is not a positive integer", tok, eq + 1), -1;
        seen[a] = 1;
    }
    return 0;
}

/* SPEC.md section 2 startup contract; 0 ok, else one line in err. */
static int check_contract(const struct mt_config *c, int world, const struct mesh *m, char *err, size_t n)
{
    int H = c->n_head, K = c->n_kv_head, F = c->mlp_hidden, tp = m->tp;
    long dpe = (long)m->dp * m->ep;
    if ((long)m->pp * m->dp * m->ep * m->tp != world)
        return snprintf(err, n, "world != pp*dp*ep*tp (world=%d, pp=%d, dp=%d, ep=%d, tp=%d)", world, m->pp, m->dp,
                        m->ep, m->tp), -1;
    if (H % tp) return snprintf(err, n, "n_head %% tp != 0 (n_head=%d, tp=%d)", H, tp), -1;
    if (K % tp) return snprintf(err, n, "n_kv_head %% tp != 0 (n_kv_head=%d, tp=%d)", K, tp), -1;
    if ((H + 2 * K) % tp)
        return snprintf(err, n, "(n_head + 2*n_kv_head) %% tp != 0 (n_head=%d, n_kv_head=%d, tp=%d)", H, K, tp), -1;
    if (F % tp) return snprintf(err, n, "mlp_hidden %% tp != 0 (mlp_hidden=%d, tp=%d)", F, tp), -1;
    if (c->n_experts % m->ep)
        return snprintf(err, n, "n_experts %% ep != 0 (n_experts=%d, ep=%d)", c->n_experts, m->ep), -1;
    if (c->n_layer < m->pp) return snprintf(err, n, "n_layer < pp (n_layer=%d, pp=%d)", c->n_layer, m->pp), -1;
    if (c->batch_size % (dpe * c->microbatches))
        return snprintf(err, n,
                        "batch_size %% (dp*ep*microbatches) != 0 (batch_size=%d, dp=%d, ep=%d, microbatches=%d)",
                        c->batch_size, m->dp, m->ep, c->microbatches), -1;
    if (tp > 1 && c->sequence_parallel && c->seq_len % tp)
        return snprintf(err, n, "seq_len %% tp != 0 with sequence_parallel (seq_len=%d, tp=%d)", c->seq_len, tp), -1;
    return 0;
}

/* ---- the parameter list, mt_model.h order ---- */

struct plist { struct mt_param *v; int n, cap; };

static int add_param(struct plist *pl, const struct mt_config *cfg, const char *name, int ndim, int64_t rows,
                     int64_t cols, enum mt_param_role role)
{
    if (pl->n == pl->cap) {
        int ncap = pl->cap ? pl->cap * 2 : 64;
        struct mt_param *nv = realloc(pl->v, (size_t)ncap * sizeof *nv);
        if (!nv) return -1;
        pl->v = nv, pl->cap = ncap;
    }
    struct mt_param *p = &pl->v[pl->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = p->len[0] = rows;
    p->shape[1] = p->len[1] = ndim == 2 ? cols : 1;
    p->numel = (size_t)p->len[0] * (size_t)p->len[1];
    p->role = role;
    p->decay = ndim == 2;
    /* nanochat split (SPEC.md 1b): Muon for 2-D matrices under model.layers. except the router */
    int muon = ndim == 2 && !strncmp(name, "model.layers.", 13) && role != MT_ROLE_ROUTER;
    p->optim = muon && strcmp(cfg->optimizer, "adamw") ? MT_OPTIM_MUON : MT_OPTIM_ADAMW;
    return 0;
}

static int list_params(const struct mt_config *c, struct plist *pl)
{
    int64_t D = c->d_model, V = c->vocab_size, QD = (int64_t)c->n_head * c->head_dim;
    int64_t KD = (int64_t)c->n_kv_head * c->head_dim, hd = c->head_dim, F = c->mlp_hidden;
    int64_t E = c->n_experts, Fe = c->expert_hidden, Fs = c->shared_expert_hidden;
    char n[128];
    int rc = add_param(pl, c, "model.embed_tokens.weight", 2, V, D, MT_ROLE_EMBED);
    for (int l = 0; l < c->n_layer && !rc; l++) {
#define P_(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        rc |= add_param(pl, c, P_("input_layernorm.weight"), 1, D, 1, MT_ROLE_GAIN);
        rc |= add_param(pl, c, P_("self_attn.q_proj.weight"), 2, QD, D, MT_ROLE_DENSE);
        rc |= add_param(pl, c, P_("self_attn.k_proj.weight"), 2, KD, D, MT_ROLE_DENSE);
        rc |= add_param(pl, c, P_("self_attn.v_proj.weight"), 2, KD, D, MT_ROLE_DENSE);
        rc |= add_param(pl, c, P_("self_attn.o_proj.weight"), 2, D, QD, MT_ROLE_DENSE);
        rc |= add_param(pl, c, P_("self_attn.q_norm.weight"), 1, hd, 1, MT_ROLE_GAIN);
        rc |= add_param(pl, c, P_("self_attn.k_norm.weight"), 1, hd, 1, MT_ROLE_GAIN);
        rc |= add_param(pl, c, P_("post_attention_layernorm.weight"), 1, D, 1, MT_ROLE_GAIN);
        if (!mt_config_is_moe_layer(c, l)) {
            rc |= add_param(pl, c, P_("mlp.gate_proj.weight"), 2, F, D, MT_ROLE_DENSE);
            rc |= add_param(pl, c, P_("mlp.up_proj.weight"), 2, F, D, MT_ROLE_DENSE);
            rc |= add_param(pl, c, P_("mlp.down_proj.weight"), 2, D, F, MT_ROLE_DENSE);
            continue;
        }
        rc |= add_param(pl, c, P_("mlp.gate.weight"), 2, E, D, MT_ROLE_ROUTER);
        for (int e = 0; e < E && !rc; e++) {
            char s[96];
            snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
            rc |= add_param(pl, c, P_(s), 2, Fe, D, MT_ROLE_EXPERT);
            snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
            rc |= add_param(pl, c, P_(s), 2, Fe, D, MT_ROLE_EXPERT);
            snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
            rc |= add_param(pl, c, P_(s), 2, D, Fe, MT_ROLE_EXPERT);
        }
        if (Fs > 0) {
            rc |= add_param(pl, c, P_("mlp.shared_expert.gate_proj.weight"), 2, Fs, D, MT_ROLE_DENSE);
            rc |= add_param(pl, c, P_("mlp.shared_expert.up_proj.weight"), 2, Fs, D, MT_ROLE_DENSE);
            rc |= add_param(pl, c, P_("mlp.shared_expert.down_proj.weight"), 2, D, Fs, MT_ROLE_DENSE);
        }
#undef P_
    }
    if (!rc) rc |= add_param(pl, c, "model.norm.weight", 1, D, 1, MT_ROLE_GAIN);
    if (!rc) rc |= add_param(pl, c, "lm_head.weight", 2, V, D, MT_ROLE_HEAD);
    return rc;
}

static const char *human(size_t b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", v, u[i]);
    return buf;
}

int mt_cmd_plan(int argc, char **argv)
{
    struct mt_ctx ctx;
    mt_ctx_init(&ctx);
    struct mt_config cfg;
    mt_config_defaults(&cfg);
    int world = 1, have_mesh = 0;
    struct mesh mesh = {1, 1, 1, 1};
    char err[512];

    /* --config first, wherever it is, so that --set overrides it */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { plan_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { fprintf(stderr, "meshtrain plan: --config needs a file\n"); return 2; }
            if (mt_config_load_file(&ctx, &cfg, argv[i + 1]) != MT_OK) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(&ctx));
                return 2;
            }
        }
    }
    const char *mesh_spec = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") || !strcmp(a, "--set") || !strcmp(a, "--world") || !strcmp(a, "--mesh")) {
            if (!v) { fprintf(stderr, "meshtrain plan: %s needs a value (see --help)\n", a); return 2; }
            i++;
        } else if (!strcmp(a, "--auto") || !strcmp(a, "--mem-per-rank")) {
            fprintf(stderr, "meshtrain plan: %s is not implemented yet\n", a);
            return 2;
        } else {
            fprintf(stderr, "meshtrain plan: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "--set") && mt_config_set(&ctx, &cfg, v) != MT_OK) {
            fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(&ctx));
            return 2;
        }
        if (!strcmp(a, "--world") && parse_pos_int(v, &world)) {
            fprintf(stderr, "meshtrain plan: --world %s is not a positive integer\n", v);
            return 2;
        }
        if (!strcmp(a, "--mesh")) mesh_spec = v, have_mesh = 1;
    }
    if (have_mesh && parse_mesh(mesh_spec, &mesh, err, sizeof err)) {
        fprintf(stderr, "meshtrain plan: %s\n", err);
        return 2;
    }
    if (!have_mesh) mesh.dp = world;

    if (mt_config_resolve(&ctx, &cfg, 0) != MT_OK) {
        fprintf(stderr, "meshtrain plan: %s\n", mt_ctx_last_error(&ctx));
        return 2;
    }
    if (check_contract(&cfg, world, &mesh, err, sizeof err)) {
        fprintf(stderr, "meshtrain plan: %s\n", err);
        return 2;
    }

    struct plist pl = {0};
    if (list_params(&cfg, &pl)) {
        free(pl.v);
        fprintf(stderr, "meshtrain plan: out of memory\n");
        return 1;
    }
    size_t total = 0, active = 0, listed = 0;
    mt_model_param_counts(&cfg, &total, &active);
    for (int i = 0; i < pl.n; i++) listed += pl.v[i].numel;
    if (listed != total) {
        free(pl.v);
        fprintf(stderr, "meshtrain plan: internal: listed %zu parameters but the model counts %zu\n", listed, total);
        return 1;
    }

    int n_moe = 0;
    for (int l = 0; l < cfg.n_layer; l++) n_moe += mt_config_is_moe_layer(&cfg, l);
    int B = cfg.batch_size / (mesh.dp * mesh.ep * cfg.microbatches);
    printf("model: V=%d L=%d D=%d H=%d K=%d hd=%d F=%d T=%d pattern=%s", cfg.vocab_size, cfg.n_layer, cfg.d_model,
           cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.mlp_hidden, cfg.seq_len, cfg.pattern);
    if (n_moe)
        printf(" experts=%d top_k=%d expert_hidden=%d shared_expert_hidden=%d", cfg.n_experts, cfg.top_k,
               cfg.expert_hidden, cfg.shared_expert_hidden);
    printf("\nmesh: world=%d pp=%d dp=%d ep=%d tp=%d sequence_parallel=%s\n", world, mesh.pp, mesh.dp, mesh.ep,
           mesh.tp, mesh.tp > 1 && cfg.sequence_parallel ? "on" : "off");
    printf("batch: %d sequences per step = dp*ep (%d) x microbatches (%d) x %d per microbatch, T=%d\n",
           cfg.batch_size, mesh.dp * mesh.ep, cfg.microbatches, B, cfg.seq_len);
    printf("parameters: %zu total, %zu active per token, %.3g FLOPs per token (6N + attention)\n", total, active,
           mt_model_flops_per_token(&cfg));

    printf("\n%-56s %-14s %12s  %s\n", "parameter", "global shape", "numel", "optimizer");
    for (int i = 0; i < pl.n; i++) {
        const struct mt_param *p = &pl.v[i];
        char shape[40];
        if (p->ndim == 2) snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)p->shape[0]);
        printf("%-56s %-14s %12zu  %s\n", p->name, shape, p->numel, p->optim == MT_OPTIM_MUON ? "muon" : "adamw");
    }

    size_t mb[MT_BUCKET_COUNT], ob[MT_BUCKET_COUNT], sum = 0;
    mt_model_plan_bytes(&cfg, B, mb);
    mt_optim_plan_bytes(&cfg, pl.v, pl.n, ob);
    printf("\nmemory plan per rank (microbatch of %d sequences)%s:\n", B,
           world > 1 ? " — one rank holding the whole model: TP/EP/PP/ZeRO sharding not applied yet" : "");
    for (int b = 0; b < MT_BUCKET_COUNT; b++) {
        char h[32];
        size_t v = mb[b] + ob[b];
        sum += v;
        printf("  %-10s %14zu  %s\n", mt_bucket_name((enum mt_bucket)b), v, human(v, h, sizeof h));
    }
    char h[32];
    printf("  %-10s %14zu  %s\n", "total", sum, human(sum, h, sizeof h));
    free(pl.v);
    mt_ctx_free(&ctx);
    return 0;
}
