#!/usr/bin/env bash
# test_train_init.sh BUILD_DIR — `train --resume` and `--init-from` start from
# the checkpoint's own config (issue 17 item 3): resume without repeating
# --config is bit-exact, every changed key is printed, shape changes are
# refused (exit 2); --init-from loads weights only (step 0, fresh optimizer),
# from a checkpoint or from a Hugging Face folder, with the same result.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
P="--peak-flops 1e11 --quiet"
python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
cat > "$W/tiny.json" <<'J'
{"vocab_size": 64, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "seq_len": 16, "batch_size": 4,
 "lr": 0.01, "warmup_steps": 2, "pattern": "AE", "n_experts": 4, "top_k": 2, "expert_hidden": 16}
J
TRAINKEYS="--set lr=0.01 --set warmup_steps=2 --set batch_size=4"

# 1. resume without --config: the checkpoint's config, bit-exact with the uninterrupted run
$MT train --config "$W/tiny.json" $P --data "$W/train.bin" --out "$W/full" --steps 6 >/dev/null 2>&1
$MT train --config "$W/tiny.json" $P --data "$W/train.bin" --out "$W/half" --steps 3 >/dev/null 2>&1
$MT train $P --data "$W/train.bin" --out "$W/rest" --steps 6 --resume "$W/half" >"$W/out" 2>"$W/err"; rc=$?
if [ $rc = 0 ] && cmp -s "$W/full/ckpt/step_000006/params.bin" "$W/rest/ckpt/step_000006/params.bin" &&
   cmp -s "$W/full/ckpt/step_000006/optim.bin" "$W/rest/ckpt/step_000006/optim.bin" &&
   grep -q "^config: total_steps 3 -> 6" "$W/out" && [ "$(grep -c '^config:' "$W/out")" = 1 ]; then
    ok "resume without --config: bit-exact, the one changed key (total_steps) printed"
else bad "resume without --config (rc $rc: $(cat "$W/err") $(cat "$W/out"))"; fi

# 2. a training key on top is printed; a model key is refused with exit 2, one line
$MT train $P --data "$W/train.bin" --out "$W/rest2" --steps 6 --resume "$W/half" --set muon_lr=0.01 >"$W/out" 2>"$W/err"; rc=$?
[ $rc = 0 ] && grep -q "^config: muon_lr 0.02 -> 0.01" "$W/out" && ok "resume --set muon_lr: printed" ||
    bad "resume --set muon_lr (rc $rc: $(cat "$W/out") $(cat "$W/err"))"
$MT train $P --data "$W/train.bin" --out "$W/rest3" --steps 6 --resume "$W/half" --set n_layer=3 >"$W/out" 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q n_layer "$W/err" && [ ! -e "$W/rest3/ckpt" ] &&
    ok "resume with another n_layer: exit 2 ($(cat "$W/err"))" || bad "resume n_layer change (rc $rc: $(cat "$W/err"))"

# 3. --init-from a step-0 checkpoint with another seed == the original run:
#    weights loaded, optimizer fresh, step 0, schedule = this run's --steps
$MT train --config "$W/tiny.json" $P --data "$W/train.bin" --out "$W/init0" --steps 0 >/dev/null 2>&1
$MT train $P --data "$W/train.bin" --out "$W/ft" --steps 6 --init-from "$W/init0" --set seed=77 >"$W/out" 2>"$W/err"; rc=$?
$MT train --config "$W/tiny.json" $P --data "$W/train.bin" --out "$W/seed77" --steps 2 --set seed=77 >/dev/null 2>&1
if [ $rc = 0 ] && cmp -s "$W/full/ckpt/step_000006/params.bin" "$W/ft/ckpt/step_000006/params.bin" &&
   grep -q "^config: seed [0-9]* -> 77 " "$W/out" &&
   python3 -c "
import json,sys
a=json.load(open('$W/ft/receipt.json'))['losses']; b=json.load(open('$W/full/receipt.json'))['losses']
c=json.load(open('$W/seed77/receipt.json'))['losses']
assert len(a)==6 and a==b and c[0]!=a[0],(a,b,c)"; then
    ok "--init-from a checkpoint: weights only, step 0, fresh optimizer (== the original run, bit for bit)"
else bad "--init-from checkpoint (rc $rc: $(cat "$W/err"))"; fi

# 4. --init-from a Hugging Face folder == --init-from the checkpoint it was exported from
if $MT export --ckpt "$W/full" --out "$W/full.hf" >/dev/null 2>"$W/err" &&
   $MT train $P --data "$W/train.bin" --out "$W/ft_ck" --steps 3 --init-from "$W/full" >/dev/null 2>>"$W/err" &&
   $MT train $P $TRAINKEYS --data "$W/train.bin" --out "$W/ft_hf" --steps 3 --init-from "$W/full.hf" >"$W/out" 2>>"$W/err" &&
   cmp -s "$W/ft_ck/ckpt/step_000003/params.bin" "$W/ft_hf/ckpt/step_000003/params.bin" &&
   grep -q "^config: lr 0.003 -> 0.01 (checkpoint $W/full.hf)" "$W/out" && ! ls /tmp/meshtrain_init_* >/dev/null 2>&1; then
    ok "--init-from a Hugging Face folder == --init-from its checkpoint (temporary import removed)"
else bad "--init-from HF folder ($(cat "$W/err"))"; fi

# 4b. the same on two ranks (dp=2 ZeRO-3: each rank imports the folder and
#     reads only the shards it owns); the config diff is printed once
if command -v mpirun >/dev/null 2>&1 && [ -d "$W/full.hf" ]; then
    timeout 120 mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$MT" train $P $TRAINKEYS \
        --data "$W/train.bin" --out "$W/ft_hf2" --steps 3 --init-from "$W/full.hf" --mesh dp=2 --zero 3 \
        >"$W/out" 2>"$W/err" </dev/null; rc=$?
    if [ $rc = 0 ] && [ "$(grep -c '^config: lr ' "$W/out")" = 1 ] && python3 -c "
import json
a=json.load(open('$W/ft_hf/receipt.json'))['losses']; b=json.load(open('$W/ft_hf2/receipt.json'))['losses']
assert len(a)==len(b)==3 and all(abs(x-y)<=1e-6*abs(x) for x,y in zip(a,b)),(a,b)"; then
        ok "--init-from a Hugging Face folder on dp=2 ZeRO-3 == one rank"
    else bad "--init-from HF on 2 ranks (rc $rc: $(cat "$W/err"))"; fi
else echo "SKIP: 2-rank --init-from (no mpirun)"; fi

# 5. bad input: shape change, both flags, missing dir — exit 2, one line, nothing written
for args in "--init-from $W/full --set d_model=64" "--init-from $W/full --resume $W/half" "--init-from $W/nope"; do
    $MT train $P --data "$W/train.bin" --out "$W/badrun" --steps 2 $args >/dev/null 2>"$W/err"; rc=$?
    [ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && [ ! -e "$W/badrun" ] && ok "bad: $args -> $(cat "$W/err")" ||
        bad "bad: $args (rc $rc: $(cat "$W/err"))"
done

finish
