/*
 * moe_experts.h — the expert MLPs of an MoE block as grouped GEMMs
 * (moe_experts.c). Groups are row ranges of the sorted buffer, back to back
 * from row 0: group g has cnt[g] rows (offsets = 0) or cnt[g+1] - cnt[g]
 * rows (offsets = 1: e.g. ly->e_off), and the weights of local expert g % ee.
 * y/dx, dy and x are (rows, D); eg, eu (the saved gate/up) and the
 * (ep*M, Fe) scratch are used at each group's own rows.
 */
#ifndef MT_MOE_EXPERTS_H
#define MT_MOE_EXPERTS_H

struct mt_model;
struct mt_layer;

/* 1: moe.c runs the experts through moe_experts_forward/backward; 0: its
 * per-expert mlp loop, which goes through proj_fwd/proj_bwd. 0 under LoRA
 * (frozen expert weights, possibly with adapters): the grouped path
 * computes plain base GEMMs and writes every dW. */
int moe_experts_grouped(const struct mt_model *m);

void moe_experts_forward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                         float *y, const float *x);
void moe_experts_backward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                          float *dx, const float *dy, const float *x);

#endif /* MT_MOE_EXPERTS_H */
