/*
 * block_traits.c — what the pattern letters mean without the model's code:
 * letter, routed, Hugging Face equivalent, its steps' pieces by their rules
 * (struct mt_piece_rules: name, config and mesh checks; mt_block_kinds.def).
 *
 * Kept apart from blocks.c (which binds the pieces) so that src/core
 * (config checks) and src/parallel (the mesh contract) can ask "is layer l
 * routed" and link without pulling the layers, the ops and their libraries
 * into a program that only needs a mesh.
 */
#include "mt_blocks.h"
#include "../core/mt_core.h"

#include <string.h>

/* steps: the pieces' rules (mt_piece_rules_<name>, named as the pieces
 * mt_piece_<name>), so that code without the pieces can ask "does the
 * pattern use the mamba piece" and run the pieces' config and mesh rules;
 * unused entries NULL. */
struct block_traits {
    char                         letter;
    const char                  *name;
    int                          routed, hf;
    const char                  *wrap;   /* the wrapper's name ("none": unwrapped) */
    const struct mt_piece_rules *steps[MT_BLOCK_MAX_PIECES];
};

/* each piece's rules, declared from the table itself (a declaration list:
 * `extern const struct mt_piece_rules mt_piece_rules_attention,
 * mt_piece_rules_mlp;`), so that a piece's rules need no header line */
#define MT_STEP(piece, resid) mt_piece_rules_##piece
#define MT_BLOCK_KIND(letter, name, routed, hf, wrap, ...) extern const struct mt_piece_rules __VA_ARGS__;
#include "mt_block_kinds.def"
#undef MT_BLOCK_KIND
#undef MT_STEP

#define MT_STEP(piece, resid) &mt_piece_rules_##piece
static const struct block_traits traits[] = {
#define MT_BLOCK_KIND(letter, name, routed, hf, wrap, ...) {letter, name, routed, hf, #wrap, {__VA_ARGS__}},
#include "mt_block_kinds.def"
#undef MT_BLOCK_KIND
};
#undef MT_STEP
#define N_KINDS ((int)(sizeof traits / sizeof traits[0]))
_Static_assert(N_KINDS <= MT_MAX_BLOCK_KINDS, "raise MT_MAX_BLOCK_KINDS");

int mt_blocks_count(void) { return N_KINDS; }

char mt_blocks_letter(int index) { return index >= 0 && index < N_KINDS ? traits[index].letter : '\0'; }

void mt_blocks_default_pattern(char *pattern, int n_layer)
{
    memset(pattern, traits[0].letter, (size_t)n_layer);
    pattern[n_layer] = '\0';
}

int mt_blocks_find(char letter)
{
    for (int i = 0; i < N_KINDS; i++)
        if (traits[i].letter == letter) return i;
    return -1;
}

const char *mt_blocks_letters(char *buf, size_t len)
{
    size_t o = 0;
    for (int i = 0; i < N_KINDS && o + 4 <= len; i++) {
        buf[o++] = traits[i].letter;
        if (i + 1 < N_KINDS) { buf[o++] = ','; buf[o++] = ' '; }
    }
    if (len > 0) buf[o < len ? o : len - 1] = '\0';
    return buf;
}

int mt_blocks_layer_kind(const struct mt_config *cfg, int l)
{
    if (l < 0 || l >= (int)strnlen(cfg->pattern, sizeof cfg->pattern)) return 0;   /* the default kind */
    int k = mt_blocks_find(cfg->pattern[l]);
    return k >= 0 ? k : 0;   /* unknown letters are rejected by config and model checks */
}

int mt_blocks_layer_routed(const struct mt_config *cfg, int l) { return traits[mt_blocks_layer_kind(cfg, l)].routed; }

int mt_blocks_any_routed(const struct mt_config *cfg)
{
    for (int l = 0; l < cfg->n_layer && l < MT_MAX_LAYERS; l++)
        if (mt_blocks_layer_routed(cfg, l)) return 1;
    return 0;
}

int mt_blocks_kind_hf(int index) { return index >= 0 && index < N_KINDS && traits[index].hf; }

int mt_blocks_kind_wrapped(int index)
{
    return index >= 0 && index < N_KINDS && strcmp(traits[index].wrap, "none") != 0;
}
int mt_blocks_kind_routed(int index) { return index >= 0 && index < N_KINDS && traits[index].routed; }

int mt_blocks_layer_uses(const struct mt_config *cfg, int l, const char *piece)
{
    const struct block_traits *t = &traits[mt_blocks_layer_kind(cfg, l)];
    for (int i = 0; i < MT_BLOCK_MAX_PIECES && t->steps[i]; i++)
        if (!strcmp(t->steps[i]->name, piece)) return 1;
    return 0;
}

int mt_blocks_pattern_uses(const struct mt_config *cfg, const char *piece)
{
    for (int l = 0; l < cfg->n_layer && l < MT_MAX_LAYERS; l++)
        if (mt_blocks_layer_uses(cfg, l, piece)) return 1;
    return 0;
}

int mt_blocks_pattern_check(const char *pattern, size_t n)
{
    for (size_t l = 0; l < n; l++)
        if (mt_blocks_find(pattern[l]) < 0) return (int)l;
    return -1;
}

/* The distinct pieces' rules of the table into out (N_KINDS *
 * MT_BLOCK_MAX_PIECES entries), in line order, steps in order, each once. */
static int distinct_rules(const struct mt_piece_rules **out)
{
    int n = 0;
    for (int k = 0; k < N_KINDS; k++)
        for (int i = 0; i < MT_BLOCK_MAX_PIECES && traits[k].steps[i]; i++) {
            int seen = 0;
            for (int j = 0; j < n && !seen; j++) seen = out[j] == traits[k].steps[i];
            if (!seen) out[n++] = traits[k].steps[i];
        }
    return n;
}

enum mt_status mt_blocks_check_config(struct mt_ctx *ctx, const struct mt_config *cfg)
{
    const struct mt_piece_rules *r[N_KINDS * MT_BLOCK_MAX_PIECES];
    const int n = distinct_rules(r);
    for (int i = 0; i < n; i++)
        if (r[i]->check_config && mt_blocks_pattern_uses(cfg, r[i]->name)) MT_CHECK(r[i]->check_config(ctx, cfg));
    return MT_OK;
}

enum mt_status mt_blocks_check_axis(struct mt_ctx *ctx, const struct mt_config *cfg, int axis, int degree)
{
    const struct mt_piece_rules *r[N_KINDS * MT_BLOCK_MAX_PIECES];
    const int n = distinct_rules(r);
    for (int i = 0; i < n; i++)
        if (r[i]->check_axis && mt_blocks_pattern_uses(cfg, r[i]->name))
            MT_CHECK(r[i]->check_axis(ctx, cfg, axis, degree));
    return MT_OK;
}
