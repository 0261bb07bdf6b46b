#!/usr/bin/env bash
# test_grad_first.sh BUILD_DIR — gradient zeroing by first write
# (docs/zero.md, "Gradient zeroing"): on ZeRO-0/1 the engines leave the
# gradients of grad_gemm parameters (attention q/k/v/o, the SwiGLU's and the
# shared expert's gate/up/down, the routed experts, Mamba-3's out_proj and
# in_proj blocks, the lm head) unzeroed, and their first GEMM of the step
# writes them with beta 0.
#  1. every first write really is one: with MT_FAULT RANK:1:fresh those
#     gradients start step 1 as NaN, and the run must be bit-identical to
#     the plain run (losses, parts, grad norms, final params and optimizer
#     state). A write that adds to one before its GEMM (a site that does not
#     ask grad_beta) makes the step non-finite; one that is never written
#     stops the run (post_backward's check). Dense with 2 microbatches (fp32,
#     precision=bf16, recompute=block); MoE with a shared expert (host-sized
#     groups; with every token forced to experts 0-1, so that 2-3 take no
#     GEMM and are zeroed; precision=bf16 with the device-sized grouped
#     GEMMs, one call for every expert, forced too); the hybrid in fp32
#     (out_proj and in_proj zeroed before the fp32 mixer's adding GEMMs), bf16
#     (in_proj's seven blocks by one GEMM) and tp=2 with replicated B/C
#     (in_proj zeroed before its row segments' adding GEMMs); MoD +
#     MTP; LoRA; dp=2 ZeRO-1, ZeRO-2 (nothing left to a first write there),
#     tp=2 with SP, pp=2 (the head's stage poisoned), ep=2 (forced too: a
#     rank's experts get no rows).
#  2. the receipt's distributed.grad_zeroing: on ZeRO-0/1 the engines zero
#     exactly the other gradients (plus alignment padding), ZeRO-2 zeroes
#     every unit's scratch.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_grad_first.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=4 --set microbatches=2"
MOE="$DENSE --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16"
HYB="$DENSE --set pattern=MA --set mamba_chunk=8"
EXTRA="$DENSE --set pattern=aA --set mtp_depth=1"
LORA="$DENSE --set lora_rank=4 --set lora_alpha=8 --set lora_targets=q,k,v,o,gate,up,down"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin --steps 4"

# name np fault-rank args...
CASES=(
  "dense 1 0 $DENSE"
  "dense_bf16 1 0 $DENSE --set precision=bf16"
  "dense_recompute 1 0 $DENSE --set recompute=block"
  "moe 1 0 $MOE"
  "moe_forced 1 0 $MOE --knob test_force_routing=1"
  "moe_bf16_dev 1 0 $MOE --set precision=bf16 --knob moe_sizes=device"
  "moe_bf16_dev_forced 1 0 $MOE --set precision=bf16 --knob moe_sizes=device --knob test_force_routing=1"
  "hybrid 1 0 $HYB"
  "hybrid_bf16 1 0 $HYB --set precision=bf16"
  "hybrid_rep_tp2 2 1 $HYB --set mamba_headdim=16 --set mamba_d_state=8 --set mamba_ngroups=1 --mesh tp=2"
  "mod_mtp 1 0 $EXTRA"
  "lora 1 0 $LORA"
  "dp2z1 2 1 $DENSE --zero 1"
  "dp2z2 2 1 $DENSE --zero 2"
  "tp2 2 1 $DENSE --mesh tp=2"
  "pp2 2 1 $DENSE --mesh pp=2"
  "ep2 2 1 $MOE --mesh ep=2"
  "ep2_forced 2 1 $MOE --mesh ep=2 --knob test_force_routing=1"
)

for c in "${CASES[@]}"; do
    set -- $c
    name=$1 np=$2 fr=$3; shift 3
    if ! run "$np" "$W/$name" "$@"; then bad "$name: plain run"; tail -3 "$W/$name.log"; continue; fi
    if ! run "$np" "$W/$name.fresh" "$@" --knob test_fault="$fr:1:fresh"; then
        bad "$name: first-write gradients poisoned at step 1 (the run failed)"; tail -3 "$W/$name.fresh.log"; continue
    fi
    if close "$W/$name" "$W/$name.fresh" 0; then ok "$name: first-write gradients poisoned at step 1, bit-identical"
    else bad "$name: first-write gradients poisoned at step 1, bit-identical"; fi
done

# ---- 2: the receipt ----
# zeroing REF MODE : MODE first (ZeRO-0/1: zeroed = the rest, within padding) or all (ZeRO-2)
zeroing() {
    python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1] + "/receipt.json"))
g = r["distributed"]["grad_zeroing"]
z, grad, first = g["zeroed_bytes_per_step"], g["gradient_bytes"], g["first_write_bytes"]
print("   zeroed %d of %d gradient bytes a step (first write %d)" % (z, grad, first))
if sys.argv[2] == "first":
    assert 0.5 * grad < first < grad, g
    # the others and their padding: at most 16 floats a parameter more (< 100 parameters here)
    assert grad - first <= z <= grad - first + 100 * 16 * 4, g
else:   # ZeRO-2: every unit's scratch each microbatch, nothing left to a first write
    assert z >= grad and first == 0, g
PY
}
for c in "dense first" "moe first" "dp2z1 first" "dp2z2 all"; do
    set -- $c
    if zeroing "$W/$1" "$2"; then ok "$1: grad_zeroing in the receipt ($2)"
    else bad "$1: grad_zeroing in the receipt ($2)"; fi
done
finish
