#!/usr/bin/env python3
"""mutations.py NAME : plant mutation NAME (docs/testing.md, "Mutations") in the
source tree of this checkout, to watch the suites that must catch it fail.
Remove it with `git checkout -- src/`. Not run by ctest: the suites are run by
hand on a planted tree (rebuild first). NAME: one of the keys below, or
`list`."""
import os
import sys
R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "")
P = {
 "qk_tp": [("src/train/trainer.c",
  "        for (int k = 0; k < rs.n_eng; k++) MT_CHECK_GOTO(mt_zero_finish_grads(ctx, rs.eng[k]), rc, done);\n",
  "        for (int k = 0; k < rs.n_eng; k++) MT_CHECK_GOTO(mt_zero_finish_grads(ctx, rs.eng[k]), rc, done);\n"
  "        { const struct mt_mesh_dims *md_ = mt_mesh_get_dims(rs.mesh); int np_; struct mt_param *pr_ = mt_model_params(rs.model, &np_);\n"
  "          if (md_->tp > 1 && !cfg->sequence_parallel && opts->zero_stage <= 1) for (int i = 0; i < np_; i++)\n"
  "            if (strstr(pr_[i].name, \"q_norm\") || strstr(pr_[i].name, \"k_norm\")) for (size_t j = 0; j < pr_[i].numel; j++) pr_[i].grad[j] *= (float)md_->tp; }\n")],
 "z_coef": [("src/model/moe.c", "    *z_sum = (double)pc->moe.z_coef * z;",
             "    *z_sum = (double)pc->moe.z_coef * (pc->tp.tp > 1 ? 1.015 : 1.0) * z;"),
            ("src/model/moe.c", "        s->h_dlse[i] = (float)(2.0 * (double)md->z_coef * (double)s->h_rlse[i] / nt);",
             "        s->h_dlse[i] = (float)(2.0 * (double)md->z_coef * (pc->tp.tp > 1 ? 1.015 : 1.0) * (double)s->h_rlse[i] / nt);")],
 "aux_noreduce": [("src/model/moe.c", "    if (tp->tp > 1) MT_CHECK(tpa_allreduce_f64(ctx, tp, s->h_seq, (size_t)2 * B * E));\n", "")],
 "gain_noreduce": [("src/parallel/zero.c",
  "    struct pending *pd = &z->ar[z->n_ar++];\n",
  "    for (int i = 0; i < z->lay.n_params; i++)\n"
  "        if (z->lay.unit[i] == u && z->lay.owner[i] >= 0 && !strcmp(z->params[i].name, \"model.norm.weight\")) {\n"
  "            memcpy(plant_save, z->params[i].grad, z->params[i].numel * sizeof(float)); plant_i = i; }\n"
  "    struct pending *pd = &z->ar[z->n_ar++];\n"),
  ("src/parallel/zero.c", "/* Complete the reduce-scatter pending on slot s and add it into owned grads. */",
   "static float plant_save[4096]; static int plant_i = -1;\n/* Complete the reduce-scatter pending on slot s and add it into owned grads. */"),
  ("src/parallel/zero.c", "    z->n_ar = 0;\n    for (int s = 0; s < 2; s++)\n",
   "    z->n_ar = 0;\n    if (plant_i >= 0) { memcpy(z->params[plant_i].grad, plant_save, z->params[plant_i].numel * sizeof(float)); plant_i = -1; }\n    for (int s = 0; s < 2; s++)\n")],
 "z3_gather": [("src/parallel/zero.c", "    MT_CHECK(timed_wait(ctx, z, &z->greq[b]));\n    z->gcur = b;\n",
                "    MT_CHECK(timed_wait(ctx, z, &z->greq[b]));\n    if (u == z->lay.n_units - 1) z->gbuf[b][0] = z->gbuf[b][1];\n    z->gcur = b;\n"),
               ("src/parallel/zero.c", "            z->gathered[u] = 1;\n",
                "            z->gathered[u] = 1;\n            if (u == z->lay.n_units - 1) z->full[z->lay.unit_base[u]] = z->full[z->lay.unit_base[u] + 1];\n")],
 "resume_no_t": [("src/train/trainer.c", "            mt_optim_set_t(rs.opt[k], resume_meta.adam_t);", "            mt_optim_set_t(rs.opt[k], 0);")],
 "hash_nothing": [("src/train/trainer.c", "                    if (split && ca.model != cb.model) continue;\n                    pairs++;",
                   "                    if (split || !split) continue;\n                    pairs++;")],
 "ckpt_cols": [("src/io/ckpt.c",
  "        off_t at = (off_t)(base + (int64_t)((((size_t)(off[0] + i)) * cols + (size_t)off[1]) * sizeof(float)));",
  "        off_t at = (off_t)(base + (int64_t)((((size_t)(off[0] + i)) * cols + (size_t)(write ? off[1] : 0)) * sizeof(float)));")],
 "shuffle_rank": [("src/train/trainer.c", "cfg->seed ^ 0x5eedda7aull);", "cfg->seed ^ 0x5eedda7aull ^ (uint64_t)wrank);")],
 # issue 31: replicated Mamba-3 B/C, the gated norm's sums of squares on the local channels only
 "mamba_gate_local": [("src/model/mamba.c",
  "    ops->ssm_gate_norm_sums(ops->be, s, Gg, a->ys, a->proj, W, w->g_out, NULL, NULL, n, E, c0, cg);\n"
  "    MT_CHECK(tpa_allreduce(ctx, &pc->tp, mown(pc)->gsum, (size_t)n * Gg));\n",
  "    ops->ssm_gate_norm_sums(ops->be, s, Gg, a->ys, a->proj, W, w->g_out, NULL, NULL, n, E, c0, cg);\n")],
}
if len(sys.argv) != 2 or sys.argv[1] not in list(P) + ["list"]:
    raise SystemExit(__doc__)
if sys.argv[1] == "list":
    print("\n".join(P))
    sys.exit(0)
for f, old, new in P[sys.argv[1]]:
    s = open(R + f).read()
    assert s.count(old) == 1, (sys.argv[1], f, old[:60], s.count(old))
    open(R + f, "w").write(s.replace(old, new))
print("planted", sys.argv[1])
