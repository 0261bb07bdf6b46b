#!/usr/bin/env bash
# Loss parts (issue 30 item 2): the loss is a list of parts, and an extra part
# travels through the step, the pipeline, the world all-reduce, the receipt
# and the progress line with no code of its own there. The extra part is the
# test hook's toy hidden_l2 = W * mean |x_final|^2 (--knob test_loss_part=W,
# src/model/head.c), on a dense and an MoE model:
#   1. W = 0: the receipt gains "hidden_l2_losses" (zeros) right after
#      z_losses (and a 4th entry in the receipt's "loss_parts" list: weight
#      0, no backward), and every other bit of training is unchanged: losses, the
#      lm/aux/z series, grad norms, lrs, params.bin and optim.bin equal the
#      run without the hook; the progress line names no part (dense) or only
#      the parts that enter the gradient (MoE: lm aux z, not hidden_l2);
#   2. W = 0.5: hidden_l2 > 0 at every step, each step's loss is the sum
#      lm + aux + z + hidden_l2 (to the receipt's printing, 1 ulp), step 0's lm/aux/z are the run without the
#      hook's (the part does not change the forward), the later losses differ
#      (its gradient entered), the progress line names hidden_l2;
#   3. the same W = 0.5 run on a mesh equals the one-rank run (tests/equiv.py
#      bounds, and hidden_l2 within 1e-6): pp=2 (the head's parts come from
#      the last stage, the router's from both), tp=2 without SP (every model
#      rank computes the whole batch's part: counted once), tp=2 with SP
#      (each rank its rows), dp=2.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/dist_lib.sh"
unset MT_TEST_LOSS_PART
python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
DENSE="--set vocab_size=64 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=12 --set microbatches=2"
MOE="$DENSE --set pattern=AEAE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16"
COMMON="--peak-flops 1e11 --data $W/train.bin --steps 4"

# same BASE RUN : everything but hidden_l2 bit-identical; hidden_l2 all 0, after z_losses
same() {
    python3 - "$1" "$2" <<'PY'
import json, sys, glob, filecmp
a, b = sys.argv[1], sys.argv[2]
ra, rb = json.load(open(a + "/receipt.json")), json.load(open(b + "/receipt.json"))
keys = list(rb)
assert keys.index("hidden_l2_losses") == keys.index("z_losses") + 1, keys
assert "hidden_l2_losses" not in ra and len(rb["hidden_l2_losses"]) == 4, rb.get("hidden_l2_losses")
assert all(v == 0 for v in rb["hidden_l2_losses"]), rb["hidden_l2_losses"]
lp = rb["loss_parts"]
assert [p["name"] for p in lp] == ["lm", "aux", "z", "hidden_l2"], lp
assert lp[3] == {"name": "hidden_l2", "owner": "head", "weight": 0, "divided_by": "tokens", "backward": False}, lp[3]
assert [p["name"] for p in ra["loss_parts"]] == ["lm", "aux", "z"], ra["loss_parts"]
for k in ("losses", "lm_losses", "aux_losses", "z_losses", "grad_norms", "lr_factors"):
    assert ra[k] == rb[k], (k, ra[k], rb[k])
ca, cb = sorted(glob.glob(a + "/ckpt/step_*[0-9]"))[-1], sorted(glob.glob(b + "/ckpt/step_*[0-9]"))[-1]
for f in ("params.bin", "optim.bin"):
    assert filecmp.cmp(ca + "/" + f, cb + "/" + f, shallow=False), f
print("   series, params.bin, optim.bin bit-identical; hidden_l2_losses", rb["hidden_l2_losses"])
PY
}

# summed BASE RUN : hidden_l2 > 0, loss = lm + aux + z + hidden_l2 exactly, step 0's parts = BASE's
summed() {
    python3 - "$1" "$2" <<'PY'
import json, sys
ra, rb = (json.load(open(f + "/receipt.json")) for f in sys.argv[1:])
h = rb["hidden_l2_losses"]
assert rb["loss_parts"][3]["weight"] == 0.5 and rb["loss_parts"][3]["backward"] is True, rb["loss_parts"]
assert len(h) == 4 and all(v > 0 for v in h), h
for i in range(4):
    s = rb["lm_losses"][i] + rb["aux_losses"][i] + rb["z_losses"][i] + h[i]
    # exact in the trainer; the receipt's numbers are cJSON's 15 digits when those read back within 1 ulp
    assert abs(rb["losses"][i] - s) <= 4e-16 * abs(s), (i, rb["losses"][i], s)
for k in ("lm_losses", "aux_losses", "z_losses"):
    assert ra[k][0] == rb[k][0], (k, ra[k][0], rb[k][0])
print("   hidden_l2", h, "; losses = the parts' sum at every step")
PY
}

# l2close REF RUN : hidden_l2 series within 1e-6 relative
l2close() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(f + "/receipt.json"))["hidden_l2_losses"] for f in sys.argv[1:])
w = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("   hidden_l2 worst rel %.2e" % w)
assert len(a) == len(b) == 4 and w <= 1e-6, (a, b)
PY
}

# progress OUT REGEX NOT : OUT.log's step lines match REGEX and never NOT
progress() {
    grep -E '^step [0-9]+/4 loss' "$1.log" | grep -qE "$2" && ! grep -E '^step [0-9]+/4 loss' "$1.log" | grep -qE "$3"
}

for model in DENSE MOE; do
    cfg=${!model}
    run 1 "$W/$model.base" $cfg || { bad "$model base run"; tail -3 "$W/$model.base.log"; continue; }
    if run 1 "$W/$model.w0" $cfg --knob test_loss_part=0 && same "$W/$model.base" "$W/$model.w0"; then
        ok "$model: a zero-weight extra part is reported (zeros) and changes no bit of training"
    else bad "$model: a zero-weight extra part is reported (zeros) and changes no bit of training"; fi
    if [ $model = DENSE ]; then want='eta_s [0-9]+$'; else want='eta_s [0-9]+ lm [0-9.]+ aux [0-9.]+ z [0-9.]+$'; fi
    progress "$W/$model.w0" "$want" 'hidden_l2' && ok "$model W=0: progress line parts" \
        || { bad "$model W=0: progress line parts"; grep -m2 '^step' "$W/$model.w0.log"; }
    if run 1 "$W/$model.w" $cfg --knob test_loss_part=0.5 && summed "$W/$model.base" "$W/$model.w" \
        && differs "$W/$model.base" "$W/$model.w"; then
        ok "$model: W=0.5: the loss is the parts' sum, and the part's gradient enters training"
    else bad "$model: W=0.5: the loss is the parts' sum, and the part's gradient enters training"; fi
    progress "$W/$model.w" 'eta_s [0-9]+ lm [0-9.]+( aux [0-9.]+ z [0-9.]+)? hidden_l2 [0-9.]+$' 'XXX' \
        && ok "$model W=0.5: progress line names hidden_l2" \
        || { bad "$model W=0.5: progress line names hidden_l2"; grep -m2 '^step' "$W/$model.w.log"; }
done

# name np model mesh-args
ROWS=("pp2 2 MOE --mesh pp=2" "tp2nosp 2 MOE --mesh tp=2 --set sequence_parallel=0" "tp2sp 2 DENSE --mesh tp=2"
      "dp2 2 DENSE --zero 1")
for r in "${ROWS[@]}"; do
    set -- $r; name=$1; np=$2; model=$3; shift 3
    cfg=${!model}
    if run "$np" "$W/$model.$name" $cfg "$@" --knob test_loss_part=0.5 --quiet \
        && close "$W/$model.w" "$W/$model.$name" 1e-6 && l2close "$W/$model.w" "$W/$model.$name"; then
        ok "$model $name: the extra part on a mesh equals one rank"
    else bad "$model $name: the extra part on a mesh equals one rank"; tail -3 "$W/$model.$name.log"; fi
done
finish
