/*
 * moe_experts.h — the expert MLPs of an MoE block as grouped GEMMs
 * (moe_experts.c). Groups are row ranges of the sorted buffer, back to back
 * from row 0: group g has cnt[g] rows (offsets = 0) or cnt[g+1] - cnt[g]
 * rows (offsets = 1: e.g. the layer's e_off), and the weights of local expert g % ee.
 * y/dx, dy and x are (rows, D); eg, eu (the saved gate/up), the (ep*M, Fe)
 * SwiGLU scratch and the (ep*M, r) LoRA scratch are used at each group's own
 * rows. moe.c runs them when pc->moe.grouped (knob moe_grouped), else its
 * per-expert mlp_forward / mlp_backward loop: the same bits on the cpu table,
 * with or without LoRA.
 */
#ifndef MT_MOE_EXPERTS_H
#define MT_MOE_EXPERTS_H

struct mt_piece_ctx;

void moe_experts_forward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee, float *eg,
                         float *eu, float *y, const float *x);
void moe_experts_backward(const struct mt_piece_ctx *pc, int n_groups, const int *cnt, int offsets, int ee,
                          const float *eg, const float *eu, float *dx, const float *dy, const float *x);

#endif /* MT_MOE_EXPERTS_H */
