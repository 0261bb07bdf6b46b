#!/usr/bin/env bash
# test_redo.sh BUILD_DIR — ReDo, recycling dormant SwiGLU units (SPEC 1e; docs/model.md "ReDo").
# Config: A + E blocks (a dense MLP, 4 experts, a shared expert), redo_every=3, a tau that
# recycles some units of every kind of set (tests/redo_check.py checks each claim):
#  1. the event, exactly: a run with ReDo and one without, both saved at the event's step 3:
#     every element of params.bin and optim.bin is bit-identical except the listed units' rows
#     of Wg and Wu (= the init generator's values for "<name>@redo3", std 0.02), their Wd
#     columns (= 0) and those rows / columns of every optimizer state (= 0); Muon (momentum)
#     and optimizer=adamw (exp_avg, exp_avg_sq); the receipt says muon_newton_schulz fp32 / none;
#  2. every mesh recycles the same units: 9 steps (events at 3, 6, 9) on dp=2 ZeRO-0/1/3,
#     tp=2, ep=2, pp=2, the 4-rank tp=2 x dp=2 ZeRO-3 and pp=2 x ep=2, and the 8-rank
#     pp=2 x dp=2 x tp=2 ZeRO-1 and dp=2 x ep=2 x tp=2 ZeRO-3: the unit lists of
#     every event equal the single rank's, and the losses, norms and final params are equal
#     at the suites' tolerance (tests/equiv.py 1e-6);
#     recompute=block bit-identical with the same units; precision=bf16 on one rank and dp=2
#     (the first event's units equal; later ones may split on a unit within bf16 noise of tau:
#     the sums are exact for the activations each mesh has, and bf16 trajectories drift apart);
#  3. checkpoint / resume across an event: 2 + resume + 7 and 3 (saved right after the
#     event) + resume + 6 equal 9 straight, bit for bit, units included;
#  4. the receipt's redo object (per-layer counts per event); no "redo" with redo_every=0;
#     redo_every with LoRA: one line, exit 2.
# Plant (docs/testing.md): scores summed on one rank only (the world all-reduce of redo.c
# skipped) -> the dp/ep/tp unit lists differ from the single rank's: 2 fails.
set -u
BUILD=${1:?usage: test_redo.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
BASE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=20 --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set mlp_hidden=64 --set microbatches=2"
REDO="$BASE --set redo_every=3 --set redo_tau=0.5"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"
CHECK="python3 $HERE/redo_check.py"

# ---- 1: the event, element by element ----
for opt in muon adamw; do
    if run 1 "$W/ev_on_$opt" $REDO --set optimizer=$opt --steps 3 && run 1 "$W/ev_off_$opt" $BASE --set optimizer=$opt --steps 3 \
        && $CHECK event "$W/ev_on_$opt" "$W/ev_off_$opt" 3 &&
        python3 -c "import json, sys; b = json.load(open(sys.argv[1] + '/receipt.json'))['backend']; \
assert b['muon_newton_schulz'] == sys.argv[2], b" "$W/ev_on_$opt" "$([ $opt = adamw ] && echo none || echo fp32)"; then
        ok "optimizer=$opt: the event rewrites exactly the listed rows / columns (generator values, zeros," \
           "zero state); the receipt's muon_newton_schulz $([ $opt = adamw ] && echo none || echo fp32)"
    else bad "optimizer=$opt: the event's rows / columns"; tail -3 "$W/ev_on_$opt.log"; fi
done

# ---- 2: every mesh recycles the same units ----
if run 1 "$W/ref" $REDO --steps 9 && $CHECK receipt "$W/ref" 2; then ok "one rank: receipt redo object (events at 3, 6, 9)"
else bad "one rank reference"; cat "$W/ref.log"; fi
runs=()
while read -r np mesh zero; do
    o="$W/m_${mesh//[=,]/_}_z$zero"
    if run "$np" "$o" $REDO --steps 9 --mesh "$mesh" --zero "$zero" && close "$W/ref" "$o" 1e-6 \
        && $CHECK units "$W/ref" "$o"; then
        ok "--mesh $mesh zero=$zero: the same units at every event, losses equal to one rank"
        runs+=("$o")
    else bad "--mesh $mesh zero=$zero: units / losses"; tail -3 "$o.log"; fi
done <<'LIST'
2 dp=2 0
2 dp=2 1
2 dp=2 3
2 tp=2 0
2 ep=2 0
2 pp=2 0
4 tp=2,dp=2 3
4 pp=2,ep=2 1
8 pp=2,dp=2,tp=2 1
8 dp=2,ep=2,tp=2 3
LIST

# ---- 2b: recompute=block (the re-forward adds no score) and precision=bf16 ----
o="$W/recompute"
if run 1 "$o" $REDO --steps 9 --set recompute=block && close "$W/ref" "$o" 0 && $CHECK units "$W/ref" "$o"; then
    ok "recompute=block: bit-identical to the reference, the same units (the re-forward scores nothing)"
else bad "recompute=block"; tail -3 "$o.log"; fi
o="$W/bf16"
if run 1 "$o" $REDO --steps 6 --set precision=bf16 && run 2 "$o.dp2" $REDO --steps 6 --set precision=bf16 --mesh dp=2 \
    && $CHECK receipt "$o" 2 && $CHECK receipt "$o.dp2" 2 && python3 -c "import json,sys; \
a,b=(json.load(open(f+'/receipt.json'))['redo']['events'] for f in sys.argv[1:]); assert a[0]==b[0], (a[0], b[0])" "$o" "$o.dp2"; then
    ok "precision=bf16: events on one rank and dp=2, the same units at the first event"
else bad "precision=bf16"; tail -3 "$o.log"; fi

# ---- 3: checkpoint / resume across an event ----
for cut in 2 3; do
    o="$W/cut$cut"
    if run 1 "$o" $REDO --steps $cut && run 1 "$o" $REDO --steps 9 --resume "$o" && close "$W/ref" "$o" 0 $cut \
        && python3 -c "import json,sys; a,b=(json.load(open(f+'/receipt.json'))['redo']['events'] for f in sys.argv[1:]); \
assert b == [e for e in a if e['step'] > $cut], 'events after the resume differ'" "$W/ref" "$o"; then
        ok "$cut + resume + $((9 - cut)) steps == 9 steps, bit for bit, the same units after the resume"
    else bad "resume at step $cut across an event"; tail -3 "$o.log"; fi
done

# ---- 4: off and refusals ----
if run 1 "$W/off" $BASE --steps 1 && python3 -c "import json,sys; assert 'redo' not in json.load(open(sys.argv[1]+'/receipt.json'))" "$W/off"; then
    ok "redo_every=0: no redo object in the receipt"
else bad "redo_every=0 receipt"; fi
"$MT" train $REDO --set lora_rank=2 $COMMON --steps 1 --out "$W/lora" >/dev/null 2>"$W/lora.err"
if [ $? -eq 2 ] && grep -q "redo_every=3 needs full training" "$W/lora.err" && [ ! -e "$W/lora" ]; then
    ok "redo_every with LoRA: one line, exit 2"
else bad "redo_every with LoRA"; cat "$W/lora.err"; fi

finish
