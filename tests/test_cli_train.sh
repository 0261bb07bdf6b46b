#!/usr/bin/env bash
# End-to-end `meshtrain train` on one rank: loss falls, receipt, --steps 0,
# bit-exact resume, MoE runs, and every bad input of issue 2 gets exit 2, one
# line on stderr, and leaves the output directory untouched.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2"
P="--peak-flops 1e11 --quiet"

# 1. loss falls on a repetitive shard, receipt has one loss per step
if $MT train $TINY $P --data "$W/train.bin" --out "$W/run1" --steps 40 2>"$W/err"; then
  python3 - "$W/run1/receipt.json" <<'PY' && ok "loss falls and receipt complete" || bad "loss falls and receipt complete"
import json, sys
r = json.load(open(sys.argv[1]))
L = r["losses"]
assert len(L) == 40, len(L)
assert L[-1] < 0.5 * L[0], (L[0], L[-1])
for k in ("backend", "mesh", "config", "batch", "parameters", "memory", "timing", "replica_hash_check"):
    assert k in r, k
assert r["backend"]["actual"] == "cpu" and r["backend"]["fallback_reason"] is None
assert r["timing"]["peak_flops_source"]
assert r["memory"]["plan_bytes"]["total"] > 0
PY
else bad "train tiny ($(cat "$W/err"))"; fi

# 1b. the receipt says which binary ran where: build.git is this checkout's commit (the
#     binary was built from it; "-dirty" allowed), the build type and options, and
#     machine.cpu_model / logical_cpus are /proc/cpuinfo's and getconf's (nproc obeys OMP_NUM_THREADS)
if [ -f "$W/run1/receipt.json" ]; then
  SRC=$(cd "$HERE/.." && pwd)
  head=$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || echo "")
  python3 - "$W/run1/receipt.json" "$head" "$(getconf _NPROCESSORS_ONLN)" <<'PY' && ok "receipt build + machine identity" || bad "receipt build + machine identity"
import json, re, sys
r = json.load(open(sys.argv[1])); head = sys.argv[2]
b, m = r["build"], r["machine"]
print("   build", b, "\n   machine", m)
if head:   # a git checkout: the commit the binary was built from
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", b["git"]) and b["git"][:12] == head, (b["git"], head)
else:
    assert b["git"].startswith("unknown"), b["git"]
assert b["build_type"] and b["compiler"].startswith(("gcc ", "clang ")) and b["cuda"] in (True, False), b
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
assert m["cpu_model"] == model and m["logical_cpus"] == int(sys.argv[3]) and m["hostname"] and m["os"].startswith("Linux"), m
PY
fi

# 2. --steps 0 writes the initial checkpoint only
if $MT train $TINY $P --data "$W/train.bin" --out "$W/run0" --steps 0 2>"$W/err" && [ -f "$W/run0/ckpt/step_000000/manifest.json" ]; then
  ok "steps 0 writes initial checkpoint"; else bad "steps 0 writes initial checkpoint ($(cat "$W/err"))"; fi

# 3. resume is bit-exact: 6 steps == 3 steps + resume to 6
$MT train $TINY $P --data "$W/train.bin" --out "$W/full" --steps 6 2>/dev/null
$MT train $TINY $P --data "$W/train.bin" --out "$W/half" --steps 3 2>/dev/null
$MT train $TINY $P --data "$W/train.bin" --out "$W/rest" --steps 6 --resume "$W/half" 2>"$W/err"
if cmp -s "$W/full/ckpt/step_000006/params.bin" "$W/rest/ckpt/step_000006/params.bin" &&
   cmp -s "$W/full/ckpt/step_000006/optim.bin" "$W/rest/ckpt/step_000006/optim.bin" &&
   python3 -c "
import json,sys
a=json.load(open('$W/full/receipt.json'))['losses'][3:]
b=json.load(open('$W/rest/receipt.json'))['losses']
assert a==b,(a,b)"; then ok "resume bit-exact"; else bad "resume bit-exact ($(cat "$W/err"))"; fi

# 3b. no checkpoint on request (bench/gpu.sh: a multi-GB final save must not eat a time box):
#     --no-save writes the receipt (same losses as the saving run) and no ckpt/, even with a
#     config's save_every; save_final=false alone keeps the periodic ones and drops the final;
#     the default saves at the end (run "full" above)
$MT train $TINY $P --set save_every=2 --data "$W/train.bin" --out "$W/nosave" --steps 6 --no-save 2>"$W/err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$W/nosave/receipt.json" ] && [ ! -e "$W/nosave/ckpt" ] &&
   [ -f "$W/full/ckpt/step_000006/manifest.json" ] && python3 -c "
import json
a=json.load(open('$W/full/receipt.json')); b=json.load(open('$W/nosave/receipt.json'))
assert a['losses']==b['losses'],(a['losses'],b['losses'])
assert b['config']['save_final'] is False and a['config']['save_final'] is True"; then
  ok "--no-save: receipt, no ckpt/; default saves"; else bad "--no-save: receipt, no ckpt/ (rc $rc: $(cat "$W/err"))"; fi
$MT train $TINY $P --set save_every=2 --set save_final=false --data "$W/train.bin" --out "$W/nofinal" --steps 5 2>"$W/err"
if [ -f "$W/nofinal/receipt.json" ] && [ -f "$W/nofinal/ckpt/step_000004/manifest.json" ] &&
   [ ! -e "$W/nofinal/ckpt/step_000005" ]; then
  ok "save_final=false: periodic checkpoints only"; else bad "save_final=false: periodic checkpoints only ($(cat "$W/err"))"; fi

# 4. MoE with shared expert, softcap, microbatches
if $MT train $TINY $P --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=16 \
     --set shared_expert_hidden=16 --set logit_softcap=15 --set microbatches=2 \
     --data "$W/train.bin" --out "$W/moe" --steps 5 2>"$W/err"; then ok "moe trains"; else bad "moe trains ($(cat "$W/err"))"; fi

# 5. bad input: exit 2, exactly one line on stderr, nothing under --out touched
mkdir -p "$W/keep"; echo sentinel > "$W/keep/receipt.json"
expect_bad() {  # name, then args
  local name=$1; shift
  "$MT" train "$@" --out "$W/keep" $P >/dev/null 2>"$W/err"; local rc=$?
  local lines; lines=$(wc -l < "$W/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && [ "$(cat "$W/keep/receipt.json")" = sentinel ] && [ ! -d "$W/keep/ckpt" ]; then
    ok "bad input: $name -> $(cat "$W/err")"
  else bad "bad input: $name (rc=$rc lines=$lines: $(cat "$W/err"))"; fi
}
python3 "$HERE/make_shard.py" "$W/magic.bin" 1000 64 pattern 12345
python3 "$HERE/make_shard.py" "$W/version.bin" 1000 64 pattern 20240520 7
python3 "$HERE/make_shard.py" "$W/count.bin" 1000 64 pattern 20240520 1 5
python3 "$HERE/make_shard.py" "$W/bigtok.bin" 1000 200 random
echo '{"n_layers": 2}' > "$W/unknown.json"
expect_bad "unknown config key"       --config "$W/unknown.json" --data "$W/train.bin"
expect_bad "unknown --set key"        $TINY --set d_modle=32 --data "$W/train.bin"
expect_bad "value out of range"       $TINY --set lr=-1 --data "$W/train.bin"
expect_bad "n_head % n_kv_head"       $TINY --set n_kv_head=3 --data "$W/train.bin"
expect_bad "odd head_dim"             $TINY --set n_head=2 --set n_kv_head=2 --set head_dim=5 --data "$W/train.bin"
expect_bad "missing data"             $TINY --data "$W/nope.bin"
expect_bad "wrong magic"              $TINY --data "$W/magic.bin"
expect_bad "wrong version"            $TINY --data "$W/version.bin"
expect_bad "count vs size"            $TINY --data "$W/count.bin"
expect_bad "token >= vocab_size"      $TINY --data "$W/bigtok.bin"
expect_bad "unknown option"           $TINY --data "$W/train.bin" --stpes 3
expect_bad "bad mesh"                 $TINY --data "$W/train.bin" --mesh tp=2
cp -r "$W/half" "$W/corrupt"
python3 - "$W/corrupt/ckpt/step_000003/params.bin" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[100] ^= 0xFF; open(p, "wb").write(bytes(b))
PY
expect_bad "checkpoint checksum"      $TINY --data "$W/train.bin" --steps 6 --resume "$W/corrupt"
expect_bad "resume incompatible cfg"  $TINY --set d_model=64 --data "$W/train.bin" --steps 6 --resume "$W/half"
expect_bad "resume missing manifest"  $TINY --data "$W/train.bin" --steps 6 --resume "$W/nonexistent"

finish
