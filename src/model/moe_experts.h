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

void moe_experts_forward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                         float *y, const float *x);
void moe_experts_backward(struct mt_model *m, struct mt_layer *ly, int n_groups, const int *cnt, int offsets, int ee,
                          float *dx, const float *dy, const float *x);

#endif /* MT_MOE_EXPERTS_H */
