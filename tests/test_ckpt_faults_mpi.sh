#!/usr/bin/env bash
# Checkpoint/resume reliability on 2 ranks (issue 13, item 8; the one-rank
# cases are in test_ckpt_faults.sh): the non-finite check runs on every rank
# for what it owns and the ranks agree (ZeRO-3: each rank writes different
# tensors), the same-run fallback is resolved alike on every rank and said
# once, and the output lock held by another trainer stops every rank with
# exit 2. Exits 77 (SKIPPED) without mpirun or an MPI build.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/dist_lib.sh"
BG=""
trap '[ -n "$BG" ] && kill "$BG" 2>/dev/null; rm -rf "$W"' EXIT
MPIRUN+=(-np 2)

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2 --peak-flops 1e11 --quiet --data $W/train.bin"

# 1. poisoned weights on 2 ranks, ZeRO-3 (rank 0 and rank 1 own different
#    tensors): refused, exit 1, the previous checkpoint and latest untouched
"$MT" train $TINY --out "$W/nan" --steps 2 >/dev/null 2>&1
latest0=$(cat "$W/nan/ckpt/latest" 2>/dev/null)
sum0=$(md5sum < "$W/nan/ckpt/step_000002/params.bin")
"${MPIRUN[@]}" "$MT" train $TINY --out "$W/nan" --zero 3 --steps 4 --resume "$W/nan" --set save_every=1 \
  --set muon_lr=3.4e38 >/dev/null 2>"$W/err" </dev/null; rc=$?
if [ $rc -eq 1 ] && grep -q "non-finite value" "$W/err" && grep -q "at step 3" "$W/err" &&
   [ ! -e "$W/nan/ckpt/step_000003" ] && [ ! -e "$W/nan/ckpt/step_000003.tmp" ] && [ -n "$latest0" ] &&
   [ "$(cat "$W/nan/ckpt/latest")" = "$latest0" ] && [ "$(md5sum < "$W/nan/ckpt/step_000002/params.bin")" = "$sum0" ]; then
  ok "2 ranks, ZeRO-3: non-finite checkpoint refused: $(grep -m1 'non-finite' "$W/err" | cut -c1-200)"
else bad "2 ranks non-finite (rc=$rc: $(grep meshtrain "$W/err"))"; fi

# 2. a damaged latest: both ranks fall back to the same previous checkpoint
#    of the run; the warning is printed once
"$MT" train $TINY --out "$W/fb" --steps 4 --set save_every=2 >/dev/null 2>&1
printf '\x55' | dd of="$W/fb/ckpt/step_000004/params.bin" bs=1 seek=100 conv=notrunc status=none
"${MPIRUN[@]}" "$MT" train $TINY --out "$W/fb2" --zero 1 --steps 6 --resume "$W/fb" >/dev/null 2>"$W/err" </dev/null; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'falling back' "$W/err")" -eq 1 ] &&
   python3 -c "
import json,sys
r=json.load(open('$W/fb2/receipt.json'))
assert r['resumed_from'].endswith('/fb/ckpt/step_000002') and r['timing']['start_step'] == 2, r['resumed_from']
assert r['run_id'] == open('$W/fb/ckpt/latest').read().split()[1]"; then
  ok "2 ranks: same-run fallback, said once"
else bad "2 ranks fallback (rc=$rc: $(cat "$W/err"))"; fi

# 3. --out locked by a running trainer: every rank stops, exit 2, nothing written
( exec "$MT" train $TINY --out "$W/lock" --steps 100000 >/dev/null 2>&1 ) &
BG=$!
for _ in $(seq 100); do [ -e "$W/lock/.lock" ] && break; sleep 0.1; done
sleep 0.3
"${MPIRUN[@]}" "$MT" train $TINY --out "$W/lock" --steps 3 >/dev/null 2>"$W/err" </dev/null; rc=$?
kill "$BG" 2>/dev/null; wait "$BG" 2>/dev/null; BG=""
if [ $rc -eq 2 ] && grep -q "in use by another trainer" "$W/err" && [ ! -e "$W/lock/ckpt" ] && [ ! -e "$W/lock/receipt.json" ]; then
  ok "2 ranks: locked --out refused (exit 2)"
else bad "2 ranks locked --out (rc=$rc: $(grep meshtrain "$W/err"))"; fi

finish
