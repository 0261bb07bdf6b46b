#!/usr/bin/env bash
# test_reshard.sh BUILD_DIR — checkpoints move between meshes on every axis (issue 13).
# A tiny MoE model (pattern AE, so EP applies; 2 layers, so pp=2 is one layer
# a stage) trains 12 steps on one rank, saving every 3 (the reference). For
# each mesh X of tp=2, ep=2, pp=2, pp=2 x tp=2, dp=2 x ZeRO-3:
#  1. 1 -> X: the one-rank checkpoint of step 6 resumed on X for 6 steps
#     continues like the uninterrupted run: losses, lm/aux/z losses, grad
#     norms (tests/equiv.py bounds: losses 1e-6 relative) and every final
#     parameter (the reshard loads TP slices, EP expert subsets, PP stage
#     subsets, ZeRO-3 shards);
#  2. X -> X: X's own checkpoint of step 9 resumed on X is BIT-exact: the
#     step-12 params.bin and optim.bin (same mesh, same layout: cmp of the
#     files) and every logged series;
#  3. X -> 1: X's checkpoint of step 9 resumed on one rank continues like the
#     uninterrupted run (equiv.py bounds, final params too).
# Every run has the same config (save_every=3), so only the mesh changes.
set -u
BUILD=${1:?usage: test_reshard.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
MOE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=12 --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set microbatches=2 --set save_every=3"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

run 1 "$W/ref" $MOE --steps 12 || { bad "one-rank reference"; cat "$W/ref.log"; finish; exit 1; }
floor "$W/ref" 4 $MOE --steps 12
[ -f "$W/ref/ckpt/step_000006/params.bin" ] && [ -f "$W/ref/ckpt/step_000012/optim.bin" ] \
    && ok "reference saves every 3 steps" || bad "reference checkpoints"

while read -r np mesh zero; do
    x="$W/x_${mesh//[=,]/_}"
    # 1: one rank -> X (X saves at 9 and 12)
    run "$np" "$x" $MOE --steps 12 --mesh "$mesh" --zero "$zero" --resume "$W/ref/ckpt/step_000006" \
        || { bad "1 rank -> $mesh ZeRO-$zero: run"; tail -3 "$x.log"; continue; }
    if close "$W/ref" "$x" 1e-6 6; then
        ok "1 rank -> $mesh ZeRO-$zero at step 6 continues like the uninterrupted run"
    else bad "1 rank -> $mesh ZeRO-$zero at step 6"; fi
    # 2: X -> X from step 9, bit-exact against X's own steps 9..12
    if run "$np" "$x.same" $MOE --steps 12 --mesh "$mesh" --zero "$zero" --resume "$x/ckpt/step_000009" \
       && close "$x" "$x.same" 0 3 \
       && cmp "$x/ckpt/step_000012/params.bin" "$x.same/ckpt/step_000012/params.bin" \
       && cmp "$x/ckpt/step_000012/optim.bin" "$x.same/ckpt/step_000012/optim.bin"; then
        ok "$mesh ZeRO-$zero -> same mesh at step 9: params.bin, optim.bin and every series bit-exact"
    else bad "$mesh ZeRO-$zero -> same mesh at step 9 bit-exact"; tail -3 "$x.same.log"; fi
    # 3: X -> one rank from step 9
    if run 1 "$x.back" $MOE --steps 12 --resume "$x/ckpt/step_000009" && close "$W/ref" "$x.back" 1e-6 9; then
        ok "$mesh ZeRO-$zero -> 1 rank at step 9 continues like the uninterrupted run"
    else bad "$mesh ZeRO-$zero -> 1 rank at step 9"; tail -3 "$x.back.log"; fi
done <<'LIST'
2 tp=2 0
2 ep=2 0
2 pp=2 0
4 pp=2,tp=2 1
2 dp=2 3
LIST

# hybrid (issue 15): M blocks' tensors (in_proj blocks cut by heads / groups)
# reshard 1 rank -> ep=2 x tp=2 -> 1 rank; grad_clip=0 as in test_dist_train.sh 1c
HYB="${MOE/pattern=AE/pattern=MEAM} --set n_layer=4 --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8 --set grad_clip=0"
HYB=${HYB/--set n_layer=2 /}
if run 1 "$W/href" $HYB --steps 12 && run 4 "$W/hx" $HYB --steps 12 --mesh ep=2,tp=2 --zero 1 --resume "$W/href/ckpt/step_000006" \
   && close "$W/href" "$W/hx" 1e-6 6 && run 4 "$W/hx.same" $HYB --steps 12 --mesh ep=2,tp=2 --zero 1 --resume "$W/hx/ckpt/step_000009" \
   && close "$W/hx" "$W/hx.same" 0 3 && cmp "$W/hx/ckpt/step_000012/params.bin" "$W/hx.same/ckpt/step_000012/params.bin" \
   && run 1 "$W/hx.back" $HYB --steps 12 --resume "$W/hx/ckpt/step_000009" && close "$W/href" "$W/hx.back" 1e-6 9; then
    ok "HYB (MEAM): 1 rank -> ep=2,tp=2 at 6 -> same mesh at 9 bit-exact, -> 1 rank at 9 like the uninterrupted run"
else bad "HYB (MEAM) reshard 1 -> ep=2,tp=2 -> 1"; tail -3 "$W/hx.log" "$W/hx.same.log" "$W/hx.back.log" 2>/dev/null; fi

# the manifest says which mesh saved it (a reshard really happened)
python3 - "$W" <<'PY' && ok "manifests record the saving meshes" || bad "manifests record the saving meshes"
import json, sys
w = sys.argv[1]
for d, mesh in (("x_tp_2", "pp=1,dp=1,ep=1,tp=2"), ("x_ep_2", "pp=1,dp=1,ep=2,tp=1"), ("x_pp_2", "pp=2,dp=1,ep=1,tp=1"),
                ("x_pp_2_tp_2", "pp=2,dp=1,ep=1,tp=2"), ("x_dp_2", "pp=1,dp=2,ep=1,tp=1")):
    m = json.load(open("%s/%s/ckpt/step_000009/manifest.json" % (w, d)))["meta"]["mesh"]
    assert m == mesh, (d, m)
PY

finish
