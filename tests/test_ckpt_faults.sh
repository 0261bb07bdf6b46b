#!/usr/bin/env bash
# Checkpoint/resume reliability at the CLI (issue 13, item 8), one rank:
#   non-finite weights are never committed (exit 1, the previous checkpoint
#   and `latest` stay), resume follows OUT/ckpt/latest (not the highest step
#   of another run) and falls back past a damaged newest checkpoint of the
#   same run, keep_last prunes only what this command wrote, a damaged
#   manifest is bad input (exit 2, one line, nothing created under --out),
#   a batch_size change on resume is refused, a full disk is a runtime
#   failure (exit 1) that leaves no DIR.tmp, the tokenizer is committed with
#   the checkpoint and listed with its checksum, receipt.json.tmp is never
#   left behind, and a second trainer on the same --out is refused.
# The manifest field checks (offsets, step, adam_t, ...) behind a valid
# manifest checksum are in test_ckpt.c.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
MNT=""
BG=""
cleanup() {
  [ -n "$BG" ] && kill "$BG" 2>/dev/null
  [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/data"
python3 "$HERE/make_shard.py" "$W/data/train.bin" 20000 64 pattern
head -c 3000 /dev/urandom > "$W/data/tokenizer.bin"   # travels with the checkpoint (content opaque here)
D="$W/data/train.bin"
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2"
P="--peak-flops 1e11 --quiet"
train() { "$MT" train $TINY $P --data "$D" "$@" >/dev/null; }
resumed_from() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['resumed_from'] or '', r['timing']['start_step'])" "$1"; }

# 1. non-finite weights: a step with muon_lr=3.4e38 poisons the weights; the
#    save after it must be refused (exit 1, tensor/rank/step named), the
#    previous checkpoint and latest untouched, no step_000003(.tmp)
train --out "$W/nan" --steps 2 2>"$W/err" || bad "nan: setup ($(cat "$W/err"))"
sum0=$(md5sum < "$W/nan/ckpt/step_000002/params.bin")
latest0=$(cat "$W/nan/ckpt/latest" 2>/dev/null)
train --set muon_lr=3.4e38 --set save_every=1 --out "$W/nan" --steps 4 --resume "$W/nan" 2>"$W/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "non-finite" "$W/err" && grep -q "step 3" "$W/err" && grep -q "rank 0" "$W/err" &&
   grep -q "weight" "$W/err" && [ ! -e "$W/nan/ckpt/step_000003" ] && [ ! -e "$W/nan/ckpt/step_000003.tmp" ] &&
   [ "$(md5sum < "$W/nan/ckpt/step_000002/params.bin")" = "$sum0" ] && [ -n "$latest0" ] &&
   [ "$(cat "$W/nan/ckpt/latest")" = "$latest0" ]; then
  ok "non-finite weights refused: $(tail -1 "$W/err")"
else bad "non-finite weights refused (rc=$rc: $(cat "$W/err"))"; fi

# 2. resume follows latest: an older run (seed 1) reached step 6 in OUT, a new
#    run (seed 2) reached step 3; --resume OUT continues the new run
train --set seed=1 --out "$W/two" --steps 6 2>/dev/null
train --set seed=2 --out "$W/two" --steps 3 --overwrite 2>/dev/null
if train --set seed=2 --out "$W/two2" --steps 5 --resume "$W/two" 2>"$W/err" &&
   [ "$(resumed_from "$W/two2/receipt.json")" = "$W/two/ckpt/step_000003 3" ]; then
  ok "resume follows latest, not another run's higher step"
else bad "resume follows latest ($(cat "$W/err"))"; fi
# the run id is in the manifest, latest and the receipt, and a resume keeps it
python3 - "$W/two" "$W/two2" <<'PY' && ok "run id in manifest, latest, receipt; kept on resume" || bad "run id in manifest, latest, receipt"
import json, sys
a, b = sys.argv[1], sys.argv[2]
m6 = json.load(open(a + "/ckpt/step_000006/manifest.json"))["meta"]["run_id"]
m3 = json.load(open(a + "/ckpt/step_000003/manifest.json"))["meta"]["run_id"]
lat = open(a + "/ckpt/latest").read().split()
assert m3 and m6 and m3 != m6, (m3, m6)
assert lat == ["step_000003", m3], lat
assert json.load(open(a + "/receipt.json"))["run_id"] == m3
assert json.load(open(b + "/ckpt/step_000005/manifest.json"))["meta"]["run_id"] == m3
assert json.load(open(b + "/receipt.json"))["run_id"] == m3
PY

# 3. a damaged newest checkpoint: fall back to the previous intact one of the
#    same run, saying so on stderr
train --set save_every=2 --out "$W/fb" --steps 6 2>/dev/null
printf '\x55' | dd of="$W/fb/ckpt/step_000006/params.bin" bs=1 seek=100 conv=notrunc status=none
if train --set save_every=2 --out "$W/fb2" --steps 8 --resume "$W/fb" 2>"$W/err" &&
   grep -q "falling back" "$W/err" && grep -q "step_000004" "$W/err" &&
   [ "$(resumed_from "$W/fb2/receipt.json")" = "$W/fb/ckpt/step_000004 4" ]; then
  ok "fallback past a damaged newest checkpoint: $(grep -m1 'falling back' "$W/err")"
else bad "fallback past a damaged newest checkpoint ($(cat "$W/err"))"; fi
# ... but never onto another run's checkpoint: fb holds only this run's, so
# damage step 4 and 2 as well -> bad input
printf '\x55' | dd of="$W/fb/ckpt/step_000004/params.bin" bs=1 seek=100 conv=notrunc status=none
printf '\x55' | dd of="$W/fb/ckpt/step_000002/params.bin" bs=1 seek=100 conv=notrunc status=none
train --out "$W/fb3" --steps 8 --resume "$W/fb" >/dev/null 2>"$W/err"; rc=$?
if [ $rc -eq 2 ] && [ ! -e "$W/fb3" ]; then ok "no intact checkpoint left: exit 2"; else bad "no intact checkpoint left (rc=$rc: $(cat "$W/err"))"; fi

# 4. keep_last=2 prunes this command's older checkpoints only: another run's
#    step_000008 and a user file stay
train --set seed=5 --out "$W/keep" --steps 8 2>/dev/null
echo notes > "$W/keep/ckpt/notes.txt"
if train --set keep_last=2 --set save_every=1 --out "$W/keep" --steps 5 --overwrite 2>"$W/err" &&
   [ "$(cd "$W/keep/ckpt" && echo step_*)" = "step_000004 step_000005 step_000008" ] && [ -f "$W/keep/ckpt/notes.txt" ]; then
  ok "keep_last=2 keeps the newest two of this run, and what it did not write"
else bad "keep_last ($(cd "$W/keep/ckpt" && echo *): $(cat "$W/err"))"; fi

# 5. damaged manifests are bad input: exit 2, one line, nothing under --out
expect_bad() {  # name, ckpt dir to resume, grep pattern
  local name=$1 ck=$2 pat=$3
  rm -rf "$W/new"
  train --out "$W/new" --steps 8 --resume "$ck" >/dev/null 2>"$W/err"; local rc=$?
  local lines; lines=$(wc -l < "$W/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$pat" "$W/err" && [ ! -e "$W/new" ]; then
    ok "bad input: $name -> $(cat "$W/err")"
  else bad "bad input: $name (rc=$rc lines=$lines: $(cat "$W/err"))"; fi
}
train --out "$W/good" --steps 3 2>/dev/null
G="$W/good/ckpt/step_000003"
edit() {  # src dir, dst dir, python expression on the manifest dict m (the checksum is NOT restamped)
  rm -rf "$2"; cp -r "$1" "$2"
  python3 - "$2/manifest.json" "$3" <<'PY'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); exec(sys.argv[2]); json.dump(m, open(p, "w"), indent=1)
PY
}
edit "$G" "$W/m_step" 'm["meta"]["step"] = -3'
expect_bad "negative step (no SIGABRT)" "$W/m_step" "checksum"
edit "$G" "$W/m_off" 'm["tensors"][1]["offset"] += 64'
expect_bad "offset shifted by 64" "$W/m_off" "checksum"
edit "$G" "$W/m_nosum" 'del m["manifest_xxh64"]'
expect_bad "manifest checksum removed" "$W/m_nosum" "checksum"
rm -rf "$W/m_dir"; cp -r "$G" "$W/m_dir"; rm "$W/m_dir/manifest.json"; mkdir "$W/m_dir/manifest.json"
expect_bad "manifest.json is a directory" "$W/m_dir" "not a regular file"

# 6. data_pos: a batch_size change on resume is refused
train --set batch_size=8 --out "$W/new" --steps 6 --resume "$W/good" >/dev/null 2>"$W/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "batch_size" "$W/err" && [ "$(wc -l < "$W/err")" -eq 1 ] && [ ! -e "$W/new" ]; then
  ok "batch_size change on resume refused: $(cat "$W/err")"
else bad "batch_size change on resume (rc=$rc: $(cat "$W/err"))"; fi

# 7. full disk: exit 1 (runtime), no DIR.tmp, no receipt.json.tmp
full_disk_check() {  # label, out dir, rc
  local label=$1 out=$2 rc=$3
  if [ "$rc" -eq 1 ] && ! ls -d "$out"/ckpt/*.tmp >/dev/null 2>&1 && [ ! -e "$out/receipt.json.tmp" ] &&
     [ ! -e "$out/ckpt/step_000002" ]; then ok "$label: exit 1 -> $(tail -1 "$W/err")"
  else bad "$label (rc=$rc: $(cat "$W/err"))"; fi
}
mkdir -p "$W/mnt"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=200k tmpfs "$W/mnt" 2>/dev/null; then
  MNT="$W/mnt"
  train --out "$W/mnt/out" --steps 2 >/dev/null 2>"$W/err"; rc=$?
  full_disk_check "full disk (tmpfs ENOSPC)" "$W/mnt/out" $rc
  umount "$W/mnt"; MNT=""
else echo "note: no tmpfs (not root or no mount): the ENOSPC case runs as EFBIG below only"; fi
# file size limit: writes fail with EFBIG (SIGXFSZ ignored, inherited)
( trap '' XFSZ; ulimit -f 100; exec "$MT" train $TINY $P --data "$D" --out "$W/fsz" --steps 2 ) >/dev/null 2>"$W/err"; rc=$?
full_disk_check "file size limit (EFBIG)" "$W/fsz" $rc

# 8. tokenizer: copied before the commit, listed with its checksum
python3 - "$W/good/ckpt/step_000003" "$W/data/tokenizer.bin" <<'PY' && ok "tokenizer.bin committed and listed" || bad "tokenizer.bin committed and listed"
import json, sys
d, src = sys.argv[1], sys.argv[2]
m = json.load(open(d + "/manifest.json"))
f = m["files"]["tokenizer.bin"]
data = open(d + "/tokenizer.bin", "rb").read()
assert data == open(src, "rb").read() and len(data) == f["size"] == 3000, f
assert len(f["xxh64"]) == 16
PY
# a damaged tokenizer copy makes the checkpoint damaged (resume falls back / refuses)
rm -rf "$W/tokbad"; cp -r "$W/good" "$W/tokbad"; : > "$W/tokbad/ckpt/step_000003/tokenizer.bin"
train --out "$W/new" --steps 6 --resume "$W/tokbad" >/dev/null 2>"$W/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "tokenizer.bin" "$W/err"; then ok "emptied tokenizer.bin detected"; else bad "emptied tokenizer.bin (rc=$rc: $(cat "$W/err"))"; fi

# 9. receipt.json cannot be written (a directory in the way): exit 1, no .tmp left
mkdir -p "$W/rcpt/receipt.json"
train --out "$W/rcpt" --steps 1 --overwrite >/dev/null 2>"$W/err"; rc=$?
if [ $rc -eq 1 ] && [ ! -e "$W/rcpt/receipt.json.tmp" ]; then ok "receipt write failure: exit 1, no receipt.json.tmp"
else bad "receipt write failure (rc=$rc, $(ls "$W/rcpt"): $(cat "$W/err"))"; fi

# 10. two trainers on one --out: the second is refused (exit 2, one line) and
#     writes nothing
( exec "$MT" train $TINY $P --data "$D" --out "$W/lock" --steps 100000 >/dev/null 2>&1 ) &
BG=$!   # the trainer itself (exec), so that kill reaches it
for _ in $(seq 100); do [ -e "$W/lock/.lock" ] && break; sleep 0.1; done
sleep 0.3
train --out "$W/lock" --steps 3 >/dev/null 2>"$W/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -q "in use" "$W/err" && [ ! -e "$W/lock/receipt.json" ] &&
   [ ! -e "$W/lock/ckpt" ]; then ok "second trainer refused: $(cat "$W/err")"
else bad "second trainer on the same --out (rc=$rc: $(cat "$W/err"))"; fi
kill "$BG" 2>/dev/null; wait "$BG" 2>/dev/null; BG=""
# ... and once the first is gone the lock is free again
if train --out "$W/lock" --steps 1 2>"$W/err"; then ok "lock released with the process"; else bad "lock released ($(cat "$W/err"))"; fi

finish
