/*
 * infer.c — incremental decoding with a KV cache (sampling).
 *
 * The cache holds, per layer, the post-QK-norm, post-RoPE keys and the values
 * of every position fed so far: k, v (t_max, K, hd) for one sequence (B = 1).
 * A step feeds n new tokens at positions len..len+n-1: each block runs the
 * training forward code on those rows, with RoPE offset pos0 = len, appends
 * the new k, v rows to the cache and attends with Tq = n, Tk = len + n,
 * q_pos0 = len (causal inside the new chunk too). Long prefills are cut into
 * chunks of at most the model's N = B*T rows (the activation buffers).
 *
 * What a layer keeps is its pieces' (decode_floats, model_decode_floats):
 * attention its k, v rows; a Mamba-3 mixer its recurrent state instead
 * (mt_mamba3_decode: scan state, previous x and B, carried rotary angles),
 * O(1) per token.
 *
 * Invariant: after a step, rows [0, len) of every layer's cache equal the k, v
 * the full forward computes for those positions. A step clobbers the model's
 * saved activations (a later backward needs a fresh forward).
 */
#include "model_impl.h"

#include <math.h>

struct mt_kv_cache {
    int    t_max, len;
    float *cos_tab, *sin_tab;  /* (t_max, hd/2) */
    float **state;             /* L pointers to each layer's decode state (attention: k then v, (t_max, K, hd) each) */
    void  *arena;              /* backend arena holding all of the above buffers */
    size_t arena_bytes;
};

enum mt_status mt_model_kv_create(struct mt_ctx *ctx, struct mt_model *m, int t_max,
                                  struct mt_kv_cache **out)
{
    *out = NULL;
    if (t_max < 1) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "kv cache: t_max=%d must be >= 1", t_max);
    struct mt_kv_cache *c = mt_alloc(ctx, sizeof *c, MT_BUCKET_OTHER);
    if (!c) return MT_ERR_OOM;
    c->t_max = t_max;
    c->state = mt_alloc(ctx, (size_t)m->L * sizeof(float *), MT_BUCKET_OTHER);
    size_t tab = (size_t)t_max * (size_t)(model_head_dim(&m->cfg) / 2);
    size_t per_layers = 0;
    for (int l = 0; l < m->L; l++) per_layers += model_decode_floats(m, m->layers[l].kind, t_max);
    c->arena_bytes = (2 * tab + per_layers) * sizeof(float);
    c->arena = c->state ? m->ops->buf_alloc(m->ops->be, ctx, c->arena_bytes, MT_BUCKET_ACTS) : NULL;
    if (!c->arena) {
        mt_model_kv_destroy(ctx, m, c);
        return MT_ERR_OOM;
    }
    /* zero: a routed layer's decode state starts with its fill count (mod.c) */
    m->ops->fill(m->ops->be, c->arena, 0.0f, c->arena_bytes / sizeof(float));
    float *p = c->arena;
    c->cos_tab = p; p += tab;
    c->sin_tab = p; p += tab;
    for (int l = 0; l < m->L; l++) {
        c->state[l] = p;
        p += model_decode_floats(m, m->layers[l].kind, t_max);
    }
    enum mt_status rc = model_rope_build(ctx, m, c->cos_tab, c->sin_tab, t_max);
    if (rc != MT_OK) {
        mt_model_kv_destroy(ctx, m, c);
        return rc;
    }
    *out = c;
    return MT_OK;
}

void mt_model_kv_destroy(struct mt_ctx *ctx, struct mt_model *m, struct mt_kv_cache *c)
{
    if (!c) return;
    if (c->arena) m->ops->buf_free(m->ops->be, ctx, c->arena);
    mt_free(ctx, c->state);
    mt_free(ctx, c);
}

int mt_model_kv_len(const struct mt_kv_cache *c) { return c ? c->len : 0; }

enum mt_status mt_model_kv_step(struct mt_ctx *ctx, struct mt_model *m, struct mt_kv_cache *c,
                                const int32_t *tokens, int n, float *logits_host)
{
    const struct mt_ops_i *ops = m->ops;
    const int D = m->D, V = m->V;
    if (n < 1) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "kv step: n=%d must be >= 1", n);
    if (c->len + n > c->t_max)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "kv step: cache overflow (%d + %d > t_max %d)",
                            c->len, n, c->t_max);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "kv step: token %d at position %d not in [0, %d)",
                                (int)tokens[i], i, V);
    m->have_fwd = 0;
    int last = 0;
    for (int done = 0; done < n;) {
        int cn = n - done < m->N ? n - done : m->N;
        ops->copy_from_host(ops->be, m->idx, tokens + done, (size_t)cn * sizeof(int32_t));
        ops->embed_forward(ops->be, m->layers[0].x_in, m->idx, m->wte->data, cn, D);
        for (int l = 0; l < m->L; l++) {
            struct mt_layer *ly = &m->layers[l];
            float *x_out = l + 1 < m->L ? m->layers[l + 1].x_in : m->x_final;
            struct mt_piece_fwd a = {.B = 1, .T = cn, .pos0 = c->len, .cos_tab = c->cos_tab, .sin_tab = c->sin_tab,
                                     .state = c->state[l], .t_max = c->t_max, .x_out = x_out};
            MT_CHECK(model_block_forward(ctx, m, ly, &a));
        }
        c->len += cn;
        done += cn;
        last = cn - 1;
    }
    /* head on the last row only */
    ops->rmsnorm_forward(ops->be, m->h_final, m->rstd_final, m->x_final + (size_t)last * D, m->norm_f->data, 1, D,
                         m->cfg.norm_eps);
    linear_forward(ops, m->logits, m->h_final, m->lm_head->data, 1, D, V, 0.0f);
    ops->copy_to_host(ops->be, logits_host, m->logits, (size_t)V * sizeof(float));
    float cap = m->cfg.logit_softcap;
    if (cap > 0)
        for (int i = 0; i < V; i++) logits_host[i] = (float)(cap * tanh((double)logits_host[i] / cap));
    return MT_OK;
}
