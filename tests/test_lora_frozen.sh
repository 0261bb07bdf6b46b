#!/usr/bin/env bash
# test_lora_frozen.sh BUILD_DIR — freezing is real (issue 16, docs/lora.md "Memory").
# Under LoRA the frozen base has no gradient buffer and no optimizer state in
# its ZeRO engine; under ZeRO-3 it is still sharded and gathered, but never
# reduced. On a dense LoRA config, one rank (ZeRO-0) and dp=2 x ZeRO-3:
#  1. every rank's grads and optim buckets, planned (`meshtrain plan --json`
#     and the receipt's memory_plan) and measured (the receipt), are the
#     adapter-only figure computed here from the plan's layout table: grads =
#     4 x the 16-float-padded sizes of the trainable tensors the rank holds
#     (ZeRO-0) or owns (ZeRO-3), optim = 8 x their elements (AdamW's m and v),
#     far below full training's grads; params/acts/workspace/other plan ==
#     measured too;
#  2. the gradient collectives carry the adapters only: the all-reduce
#     (one rank) and the reduce-scatter (ZeRO-3) move exactly 4 x the padded
#     adapter elements per step (no byte of a frozen tensor), in one call per
#     unit with adapters (none for the embedding and head units), while the ZeRO-3
#     all-gather still moves the whole model (frozen tensors included);
#  3. the base does not move: after N steps from the seeded init, every base
#     tensor of the final params.bin (dp=2 x ZeRO-3 and ZeRO-1) is
#     byte-identical to a 0-learning-rate run's, and every adapter moved;
#     from --init-from (adapter-only checkpoints) the replica check passes,
#     so ZeRO-1's first sync gathered the loaded base units;
#  4. only dead work was removed: LoRA dp=2 x ZeRO-3 equals LoRA dp=2 x ZeRO-0
#     bit for bit (params; fp64 norm sums re-associated), and, when
#     MT_BASE_MESHTRAIN names a build from before this change, LoRA dp=2 x
#     ZeRO-3 and tp=2 give bit-identical loss and grad-norm series with it;
#  5. an M-block (Mamba-3) LoRA model trains with its frozen mixer (the SSM
#     kernels' frozen-vector gradients go to a workspace sink), plan ==
#     measured in every bucket but comm.
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_lora_frozen.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20"
HYB="$DENSE --set n_layer=4 --set pattern=MEAM --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8"
LORA="--set lora_rank=4 --set lora_alpha=8 --set lora_targets=q,k,v,o,gate,up,down"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"
STEPS=4

# check_mem NAME RUN_DIR PLAN_JSON FULL_RUN_DIR ZERO: items 1 and 2 for one run
check_mem() {
    python3 - "$2/receipt.json" "$3" "$4/receipt.json" "$5" <<'PY'
import json, sys
r, p, f = (json.load(open(x)) for x in sys.argv[1:4]); zero = int(sys.argv[4])
pad = lambda n: (n + 15) // 16 * 16
lay = p["layout"]
n_frozen = sum(1 for e in lay if e["optimizer"] == "frozen")
train = [e for e in lay if e["optimizer"] != "frozen"]
assert n_frozen > 0 and all(".lora_" in e["name"] for e in train) and len(train) == 28, (n_frozen, len(train))
numel = lambda e: eval("*".join(str(x) for x in e["local_shape"]))
world = p["mesh"]["world"]
mp = {e["rank"]: e for e in r["distributed"]["memory_plan"]["per_rank"]}
cli = {e["rank"]: e["bytes"] for e in p["memory"]["per_rank"]}
full = f["memory"]["measured_peak_bytes"]["grads"]
for k in range(world):
    mine = [e for e in train if zero == 0 or e["zero"]["owner_group_rank"] == k]
    g, o = 4 * sum(pad(numel(e)) for e in mine), 8 * sum(numel(e) for e in mine)
    pl, me = mp[k]["plan"], mp[k]["measured_step_loop"]
    print("   rank %d: grads plan %d measured %d cli %d (adapters %d; full training %d), optim %d/%d/%d (adapters %d)"
          % (k, pl["grads"], me["grads"], cli[k]["grads"], g, full, pl["optim"], me["optim"], cli[k]["optim"], o))
    assert pl["grads"] == me["grads"] == cli[k]["grads"] == g and 0 < g < full / 4, k
    assert pl["optim"] == me["optim"] == cli[k]["optim"] == o, k
    for b in ("params", "acts", "workspace", "other"):
        assert pl[b] == me[b] == cli[k][b], (k, b, pl[b], me[b], cli[k][b])
# item 2: the gradient collectives of rank 0 (one step = one microbatch here)
c = r["distributed"]["collective_bytes_per_step"]
ad = 4 * sum(pad(numel(e)) for e in train)
allp = 4 * sum(pad(numel(e)) for e in lay)
kind = "allreduce" if zero <= 1 else "reduce_scatter"
print("   %s %d bytes/step (adapters %d, whole model %d); allgather %d" % (kind, c[kind]["measured"], ad, allp,
      c["allgather"]["measured"]))
units = {e["name"].split(".")[2] for e in train}   # model.layers.N.: one unit per layer with adapters
print("   %s calls/step %g (units with adapters %d; embedding and head have none)" % (kind, c[kind]["calls_per_step"],
      len(units)))
assert c[kind]["measured"] == ad, (kind, c[kind]["measured"], ad)
assert c[kind]["calls_per_step"] == len(units), (kind, c[kind]["calls_per_step"], len(units))
if zero == 3:
    assert c["allgather"]["measured"] >= allp, c["allgather"]   # the frozen base is still gathered
PY
}

# ---- references: full training, and a base checkpoint to start LoRA from ----
run 1 "$W/full1" $DENSE --steps $STEPS || { bad "full-training run (1 rank)"; tail -5 "$W/full1.log"; }
run 2 "$W/full3" $DENSE --steps $STEPS --mesh dp=2 --zero 3 || { bad "full-training run (dp=2 x ZeRO-3)"; tail -5 "$W/full3.log"; }

# ---- 1, 2: memory and collectives, one rank and dp=2 x ZeRO-3 ----
for spec in "1 dp=1 0 full1" "2 dp=2 3 full3"; do
    set -- $spec; np=$1; mesh=$2; zero=$3; ref=$4; o="$W/l_$zero"
    if ! run "$np" "$o" $DENSE $LORA --steps $STEPS --mesh "$mesh" --zero "$zero"; then
        bad "LoRA --mesh $mesh --zero $zero: train failed"; tail -5 "$o.log"; continue
    fi
    "$MT" plan $DENSE $LORA --world "$np" --mesh "$mesh" --zero "$zero" --steps $STEPS --data "$W/train.bin" --json \
        --profile none > "$o.plan" 2> "$o.plan.err" || { bad "plan --mesh $mesh --zero $zero: $(cat "$o.plan.err")"; continue; }
    if check_mem x "$o" "$o.plan" "$W/$ref" "$zero"; then
        ok "LoRA --mesh $mesh --zero $zero: grads/optim = the adapters' bytes (plan == measured), gradient collectives carry adapters only"
    else bad "LoRA --mesh $mesh --zero $zero: frozen base memory / collectives"; fi
done

# ---- 3: the base does not move ----
# A LoRA run from the seeded init writes full checkpoints (docs/checkpoint.md):
# its base tensors must equal those of a 0-learning-rate run (dp=2 x ZeRO-3 and
# ZeRO-1). From --init-from a base checkpoint the run writes adapter-only
# checkpoints naming the base, and the end-of-run replica check (which fails the
# run) proves every non-owner received the loaded base units at the first sync.
run 1 "$W/lr0" $DENSE $LORA --steps $STEPS --set lr=0 || bad "lr=0 run"
for zero in 3 1; do
if run 2 "$W/lb$zero" $DENSE $LORA --steps $STEPS --mesh dp=2 --zero $zero \
    && python3 - "$W/lb$zero" "$W/lr0" "$HERE" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
from equiv import last_ckpt, tensors
_, a = tensors(last_ckpt(sys.argv[1]))
_, b = tensors(last_ckpt(sys.argv[2]))
base = [n for n in a if ".lora_" not in n]
ad = [n for n in a if ".lora_B" in n]
same = [n for n in base if n in b and a[n][1].tobytes() == b[n][1].tobytes()]
moved = [n for n in ad if any(x != 0 for x in a[n][1])]
print("   %d/%d base tensors byte-identical to the lr=0 run's, %d/%d lora_B moved off 0"
      % (len(same), len(base), len(moved), len(ad)))
assert len(base) > 0 and len(same) == len(base) and len(ad) == 14 and len(moved) == len(ad)
PY
then ok "dp=2 x ZeRO-$zero: the frozen base is byte-identical after $STEPS steps, the adapters moved"
else bad "dp=2 x ZeRO-$zero: base moved or adapters did not"; tail -2 "$W/lb$zero.log"; fi
if run 2 "$W/li$zero" $DENSE $LORA --steps $STEPS --mesh dp=2 --zero $zero --init-from "$W/full1" \
    && grep -q '"base"' "$(ls -d "$W/li$zero"/*/step_* 2>/dev/null | tail -1)/manifest.json" 2>/dev/null; then
    ok "dp=2 x ZeRO-$zero from --init-from: replicas agree (the loaded base reached every rank), adapter-only checkpoint"
else bad "dp=2 x ZeRO-$zero from --init-from"; tail -2 "$W/li$zero.log"; fi
done

# ---- 4: only dead work was removed ----
if run 2 "$W/l_z0" $DENSE $LORA --steps $STEPS --mesh dp=2 --zero 0 && close "$W/l_z0" "$W/l_3" bit64; then
    ok "LoRA dp=2 x ZeRO-3 == dp=2 x ZeRO-0 bit for bit"
else bad "LoRA dp=2 x ZeRO-3 vs ZeRO-0"; fi
if [ -n "${MT_BASE_MESHTRAIN:-}" ] && [ -x "${MT_BASE_MESHTRAIN:-}" ]; then
    for spec in "dp=2 3" "tp=2 0"; do
        set -- $spec; a="$W/nb_${1%%=*}"; b="$W/ob_${1%%=*}"
        if run 2 "$a" $DENSE $LORA --steps $STEPS --mesh "$1" --zero "$2" && MT="$MT_BASE_MESHTRAIN" run 2 "$b" $DENSE $LORA \
            --steps $STEPS --mesh "$1" --zero "$2" && python3 - "$a" "$b" <<'PY'
import json, sys
a, b = (json.load(open(d + "/receipt.json")) for d in sys.argv[1:])
print("   losses %s, grad norms %s" % (a["losses"] == b["losses"], a["grad_norms"] == b["grad_norms"]))
assert a["losses"] == b["losses"] and a["grad_norms"] == b["grad_norms"] and len(a["losses"]) > 0
PY
        then ok "LoRA --mesh $1 --zero $2: loss and grad-norm series bit-identical to $MT_BASE_MESHTRAIN"
        else bad "LoRA --mesh $1 --zero $2 vs $MT_BASE_MESHTRAIN"; fi
    done
else
    echo "note: MT_BASE_MESHTRAIN not set: the comparison with a build from before the change is not run"
fi

# ---- 5: M blocks (frozen mixer) ----
o="$W/hyb"
if run 1 "$o" $HYB $LORA --steps 2 && python3 - "$o/receipt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
e = r["distributed"]["memory_plan"]["per_rank"][0]
pl, me = e["plan"], e["measured_step_loop"]
ad = r["parameters"]["trainable"]
print("   grads %d optim %d (adapters %d elements), workspace plan %d measured %d" % (me["grads"], me["optim"], ad,
      pl["workspace"], me["workspace"]))
for b in ("params", "grads", "optim", "acts", "workspace", "other"):
    assert pl[b] == me[b], (b, pl[b], me[b])
assert me["grads"] == 4 * ad and me["optim"] == 8 * ad
assert all(x == x for x in r["losses"]) and r["losses"][-1] != r["losses"][0]
PY
then ok "M-block LoRA: frozen mixer without gradient buffers, plan == measured"
else bad "M-block LoRA"; tail -3 "$o.log"; fi

finish
