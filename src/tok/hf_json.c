/*
 * hf_json.c — the tokenizer as a Hugging Face `tokenizers` tokenizer.json.
 *
 * meshtrain's tokenizer is byte-level BPE over the chunks of the GPT-4
 * (cl100k) split pattern, merges applied lowest rank first: exactly what the
 * `tokenizers` library runs for
 *
 *   pre_tokenizer: Sequence[ Split(cl100k regex, behavior "isolated"),
 *                            ByteLevel(add_prefix_space false, use_regex false) ]
 *   model:         BPE(vocab, merges in rank order)
 *   decoder:       ByteLevel
 *
 * Token strings use GPT-2's bytes_to_unicode map (printable Latin-1 bytes map
 * to themselves, the other 68 bytes to U+0100..U+0143), so every token of
 * meshtrain's vocabulary has a distinct string unless two merges spell the
 * same bytes — refused (HF's vocabulary is a map from string to id).
 *
 * Where the two can differ (docs/export.md): pretokenize.c classifies
 * non-ASCII codepoints by ranges, the regex by the Unicode tables, so rare
 * letters/digits/marks outside those ranges split differently; invalid UTF-8
 * cannot be given to HF at all; and HF matches the special token's text
 * "<|bos|>" in the input (meshtrain encodes it as plain bytes).
 */
#include "mt_tok.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* the pattern pretokenize.c implements by hand, for Oniguruma */
static const char SPLIT_REGEX[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*"
    "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

/* GPT-2 bytes_to_unicode: byte -> codepoint */
static void byte_map(uint32_t cp[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* bytes -> UTF-8 of their mapped codepoints (each < 0x800: at most 2 bytes) */
static char *map_bytes(struct mt_ctx *ctx, const uint32_t cp[256], const uint8_t *b, size_t n)
{
    char *s = mt_alloc(ctx, 2 * n + 1, MT_BUCKET_OTHER), *p = s;
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[b[i]];
        if (c < 0x80) *p++ = (char)c;
        else { *p++ = (char)(0xc0 | (c >> 6)); *p++ = (char)(0x80 | (c & 0x3f)); }
    }
    *p = 0;
    return s;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

enum mt_status mt_tok_hf_json(struct mt_ctx *ctx, const struct mt_tok *tok, char **out)
{
    *out = NULL;
    uint32_t cp[256];
    byte_map(cp);
    const int V = mt_tok_vocab_size(tok), M = mt_tok_n_merges(tok), bos = mt_tok_bos_id(tok);
    enum mt_status rc = MT_OK;
    char **str = mt_alloc(ctx, (size_t)V * sizeof *str, MT_BUCKET_OTHER);
    char **sorted = mt_alloc(ctx, (size_t)V * sizeof *sorted, MT_BUCKET_OTHER);
    cJSON *root = NULL;
    if (!str || !sorted) { rc = MT_ERR_OOM; goto done; }
    memset(str, 0, (size_t)V * sizeof *str);
    for (int id = 0; id < V; id++) {
        size_t len = 0;
        const uint8_t *b = mt_tok_token_bytes(tok, (uint32_t)id, &len);
        if (id == bos) {   /* added token: its content is the raw name */
            str[id] = mt_alloc(ctx, len + 1, MT_BUCKET_OTHER);
            if (str[id]) { memcpy(str[id], b, len); str[id][len] = 0; }
        } else {
            str[id] = map_bytes(ctx, cp, b, len);
        }
        if (!str[id]) { rc = MT_ERR_OOM; goto done; }
        sorted[id] = str[id];
    }
    qsort(sorted, (size_t)V, sizeof *sorted, cmp_str);
    for (int i = 1; i < V; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "tokenizer: two tokens spell '%s': a Hugging Face vocabulary "
                              "cannot hold both", sorted[i]);
            goto done;
        }

    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", bos);
    cJSON_AddStringToObject(a, "content", str[bos]);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", 1);
    cJSON_AddItemToArray(added, a);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *pts = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", SPLIT_REGEX);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(pts, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 1);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(pts, bl);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", 0);
    cJSON_AddBoolToObject(dec, "trim_offsets", 1);
    cJSON_AddBoolToObject(dec, "use_regex", 0);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int id = 0; id < V; id++) cJSON_AddNumberToObject(vocab, str[id], id);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < M; i++) {
        uint32_t l, r;
        mt_tok_merge(tok, i, &l, &r);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(str[l]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(str[r]));
        cJSON_AddItemToArray(merges, pair);
    }
    *out = cJSON_PrintUnformatted(root);
    if (!*out) rc = mt_ctx_error(ctx, MT_ERR_OOM, "tokenizer.json: out of memory");
done:
    cJSON_Delete(root);
    if (str)
        for (int id = 0; id < V; id++) mt_free(ctx, str[id]);
    mt_free(ctx, str);
    mt_free(ctx, sorted);
    return rc;
}
