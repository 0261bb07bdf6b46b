#!/usr/bin/env bash
# test_moe_grouped.sh BUILD_DIR — the MoE experts' grouped GEMMs (knob
# moe_grouped, src/model/moe_experts.c) give the same bits as the per-expert
# loop (moe_grouped=0), with and without LoRA (docs/lora.md, docs/cuda.md):
#  1. LoRA on every target (expert adapters, frozen experts), one rank and
#     ep=2: every per-step series of the receipts (losses, lm/aux/z parts,
#     grad norms, lrs) and every tensor of the final checkpoint bit-identical;
#  2. LoRA without the expert target (frozen experts, no adapters), one rank;
#  3. full training (no LoRA), one rank;
#  4. precision=bf16 (the routed experts on their bf16 shadows, one
#     gemm_bf16 per group), one rank and ep=2, and with LoRA on every
#     target (the frozen experts' shadows, fp32 adapters) on one rank, and
#     with LoRA on q, v only (frozen experts, their gate/up stored bf16);
#  5. null experts (n_null_experts=2, top-3): fp32 one rank, bf16 on ep=2;
#  and each loop run's receipt says moe_grouped=0 from the command line (the
#  switch was applied), the grouped one the default 1.
# Frozen experts getting weight gradients is caught by test_model_grad (its
# MoE LoRA check runs the grouped path: the default) and test_moe_experts.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_moe_grouped.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
MOE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20 --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2"
LORA="--set lora_rank=4 --set lora_alpha=8 --set lora_targets=q,k,v,o,gate,up,down,expert"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin --steps 6"

# knob OUT VALUE SOURCE : the receipt echoes moe_grouped=VALUE from SOURCE
knob() {
    python3 - "$1/receipt.json" "$2" "$3" <<'PY'
import json, sys
k = json.load(open(sys.argv[1]))["knobs"]["moe_grouped"]
assert k["value"] == sys.argv[2] and k["source"] == sys.argv[3], k
PY
}

# same TAG NP ARGS... : grouped (default) vs --knob moe_grouped=0, bit for bit
same() {
    local tag=$1 np=$2; shift 2
    if ! run "$np" "$W/${tag}_g" "$@" || ! run "$np" "$W/${tag}_l" "$@" --knob moe_grouped=0; then
        bad "$tag: runs"; tail -3 "$W/${tag}_g.log" "$W/${tag}_l.log"; return
    fi
    if knob "$W/${tag}_g" 1 default && knob "$W/${tag}_l" 0 "command line"; then ok "$tag: knob in the receipts"
    else bad "$tag: knob in the receipts"; fi
    if close "$W/${tag}_g" "$W/${tag}_l" 0; then ok "$tag: grouped == per-expert loop, bit for bit"
    else bad "$tag: grouped == per-expert loop, bit for bit"; fi
}

same "lora np1" 1 $MOE $LORA
same "lora ep2" 2 $MOE $LORA --mesh ep=2
same "lora q,v (frozen experts, no adapters) np1" 1 $MOE --set lora_rank=4 --set lora_targets=q,v
same "full np1" 1 $MOE
# precision=bf16: the experts on bf16 shadows, one gemm_bf16 per group (wlinear's calls)
same "bf16 np1" 1 $MOE --set precision=bf16
same "bf16 ep2" 2 $MOE --set precision=bf16 --mesh ep=2
same "lora bf16 np1" 1 $MOE $LORA --set precision=bf16
# bf16 with frozen experts and no expert adapter: gate/up stored bf16 (moe.c moe_gu_bf16), no weight gradient
same "lora q,v bf16 (frozen experts, gate and up bf16) np1" 1 $MOE --set lora_rank=4 --set lora_targets=q,v \
    --set precision=bf16
# null experts (SPEC 1e): the groups cover only the real rows [0, e_off[E]); fp32 one rank, bf16 on ep=2
same "null experts np1" 1 $MOE --set n_null_experts=2 --set top_k=3
same "null experts bf16 ep2" 2 $MOE --set n_null_experts=2 --set top_k=3 --set precision=bf16 --mesh ep=2
# the LoRA runs trained their adapters: the loss moved (a frozen no-op would pass the above too)
python3 - "$W/lora np1_g/receipt.json" <<'PY' && ok "lora np1: the loss moved" || bad "lora np1: the loss moved"
import json, sys
l = json.load(open(sys.argv[1]))["losses"]
print("   losses %.6f .. %.6f" % (l[0], l[-1]))
assert l[-1] < l[0] - 1e-3, l
PY
finish
