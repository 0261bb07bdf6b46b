/*
 * train_ckpt.c — the trainer's checkpoint save: the global entry list, who
 * writes what, keep_last.
 *
 * Collective over the world: the owner of each parameter (and of its
 * optimizer state) writes it, whole; rank 0 writes the manifest last. The
 * global tensor list (every parameter, then every optimizer state in
 * parameter order) is the same on every rank; a rank passes data only for
 * what it owns.
 */
#include <stdio.h>
#include <string.h>

#include "../core/mt_fileio.h"
#include "../optim/mt_optim.h"
#include "train_impl.h"

/* The data of the held optimizer state called `name`, or NULL. */
static const float *state_data(const struct mt_optim_state *st, int n_states, const char *name)
{
    for (int k = 0; k < n_states; k++)
        if (!strcmp(st[k].name, name)) return st[k].data;
    return NULL;
}

/* Adapter-only checkpoints (a LoRA run from a meshtrain base) leave the
 * frozen base out: it is the base checkpoint's, unchanged (docs/lora.md).
 * Frozen tensors have no optimizer state, so the states need no filter. */
static int skip_frozen(const struct run_state *rs, const struct mt_param *p)
{
    return rs->base_hash[0] && p->frozen;
}

/* keep_last: delete this command's oldest checkpoints beyond N (rank 0,
 * after the commit; never one it did not write, never the newest). A
 * failed deletion costs disk, not correctness: a warning, not an error. */
static enum mt_status keep_last(struct mt_ctx *ctx, const struct mt_train_opts *opts, struct run_state *rs, int step)
{
    const struct mt_config *cfg = rs->cfg;
    /* at most keep_last + 1 entries, and never more than one per step */
    size_t cap = (size_t)(cfg->keep_last < opts->steps + 1 ? cfg->keep_last : opts->steps + 1) + 1;
    if (!rs->saved) rs->saved = mt_alloc(ctx, cap * sizeof(int), MT_BUCKET_OTHER);
    if (!rs->saved) return MT_ERR_OOM;
    if (rs->n_saved == 0 || rs->saved[rs->n_saved - 1] != step) rs->saved[rs->n_saved++] = step;
    while (rs->n_saved > cfg->keep_last) {
        char old[4200];
        snprintf(old, sizeof old, "%s/ckpt/step_%06d", opts->out_dir, rs->saved[0]);
        struct mt_ctx tmp;
        mt_ctx_init(&tmp);
        if (mt_ckpt_remove(&tmp, old, rs->run_id) != MT_OK)
            fprintf(stderr, "meshtrain train: warning: keep_last: %s\n", mt_ctx_last_error(&tmp));
        mt_ctx_free(&tmp);
        memmove(rs->saved, rs->saved + 1, (size_t)--rs->n_saved * sizeof(int));
    }
    return MT_OK;
}

/* The metadata of the checkpoint of `step`. The tokenizer travels with the
 * checkpoint so `sample` can decode: copied in (checked) before the commit
 * and listed with its checksum. */
static void fill_meta(const struct mt_train_opts *opts, const struct run_state *rs, int step, char *tok_src,
                      size_t tok_n, struct mt_ckpt_meta *meta)
{
    char data_dir[2048];
    memset(meta, 0, sizeof *meta);
    meta->step = step;
    snprintf(meta->run_id, sizeof meta->run_id, "%s", rs->run_id);
    mt_file_dir_of(opts->data_path, data_dir, sizeof data_dir);
    snprintf(tok_src, tok_n, "%s/tokenizer.bin", data_dir);
    if (mt_file_is_regular(tok_src)) meta->tokenizer = tok_src;
    meta->data_pos = (int64_t)step * rs->cfg->batch_size;
    meta->seed = rs->cfg->seed;
    meta->optim_t = mt_optim_get_t(rs->zset.opt[0]);
    snprintf(meta->base_hash, sizeof meta->base_hash, "%s", rs->base_hash);
    snprintf(meta->base_path, sizeof meta->base_path, "%s", rs->base_path);
    mt_mesh_dims_str(mt_mesh_get_dims(rs->mesh), meta->mesh, sizeof meta->mesh);
}

enum mt_status mt_train_save_checkpoint(struct mt_ctx *ctx, const struct mt_train_opts *opts, struct run_state *rs,
                                        int step)
{
    const struct mt_config *cfg = rs->cfg;
    char dir[4200], tok_src[2100];
    snprintf(dir, sizeof dir, "%s/ckpt/step_%06d", opts->out_dir, step);
    struct mt_ckpt_meta meta;
    fill_meta(opts, rs, step, tok_src, sizeof tok_src, &meta);
    int n;
    struct mt_param *params = mt_model_params(rs->model, &n);
    const int n_states = mt_zero_set_states(&rs->zset, NULL);
    /* the entry list is GLOBAL (every rank passes the same names and shapes):
     * under EP a rank holds only its experts, so the list comes from the registry */
    int ng = mt_model_registry(cfg, NULL, 0);
    struct mt_param *glob = mt_alloc(ctx, (size_t)ng * sizeof *glob, MT_BUCKET_OTHER);
    int *local = mt_alloc(ctx, (size_t)ng * sizeof(int), MT_BUCKET_OTHER);
    int n_ent = 0;
    if (glob) {
        mt_model_registry(cfg, glob, ng);
        for (int g = 0; g < ng; g++) n_ent += !skip_frozen(rs, &glob[g]) + mt_optim_param_n_states(&glob[g]);
    }
    struct mt_ckpt_entry *ent = mt_alloc(ctx, (size_t)(n_ent + 1) * sizeof *ent, MT_BUCKET_OTHER);
    char (*names)[160] = mt_alloc(ctx, (size_t)(n_ent + 1) * 160, MT_BUCKET_OTHER);
    struct mt_optim_state *st = mt_alloc(ctx, (size_t)(n_states + 1) * sizeof *st, MT_BUCKET_OTHER);
    enum mt_status rc = MT_ERR_OOM;
    if (!glob || !local || !ent || !names || !st) goto out;
    /* both lists are in model order: match by name with one forward scan */
    for (int g = 0, i = 0; g < ng; g++) {
        local[g] = -1;
        if (i < n && !strcmp(glob[g].name, params[i].name)) local[g] = i++;
    }
    mt_zero_set_states(&rs->zset, st);
    /* the writer of a tensor: its owner in its engine's group, and for a
     * parameter replicated over the model axis but reduced over data only,
     * model rank 0 alone (count). Each rank writes its box (TP: its slice).
     * Parameters first, then their optimizer states in parameter order. */
    int e = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int g = 0; g < ng; g++) {
            int i = local[g];
            struct mt_zero *z = i >= 0 ? rs->zset.z[rs->eng_of[i]] : NULL;
            int mine = i >= 0 && rs->count[i] && mt_zero_owner(z, i) == mt_zero_group_rank(z);
            const struct mt_param *shape = i >= 0 ? &params[i] : &glob[g];
            if (pass == 0) {
                if (skip_frozen(rs, &glob[g])) continue;
                ent[e++] = (struct mt_ckpt_entry){glob[g].name, 0, shape, mine ? mt_zero_param_data(z, i) : NULL};
                continue;
            }
            for (int j = 0; j < mt_optim_param_n_states(&glob[g]); j++) {
                mt_optim_param_state_name(&glob[g], j, names[e], 160);
                ent[e] = (struct mt_ckpt_entry){names[e], 1, shape, mine ? state_data(st, n_states, names[e]) : NULL};
                e++;
            }
        }
    rc = mt_ckpt_save_group(ctx, rs->ops, mt_mesh_world_comm(rs->mesh), dir, cfg, &meta, ent, n_ent);
out:
    mt_free(ctx, ent);
    mt_free(ctx, names);
    mt_free(ctx, st);
    mt_free(ctx, glob);
    mt_free(ctx, local);
    MT_CHECK(rc);
    if (cfg->keep_last > 0 && mt_mesh_rank(rs->mesh) == 0) MT_CHECK(keep_last(ctx, opts, rs, step));
    return MT_OK;
}
