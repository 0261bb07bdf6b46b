#!/usr/bin/env bash
# `meshtrain plan`: a good config prints every parameter and a plan whose
# listed parameter count matches the header; every contract violation and bad
# flag gives exit 2 and exactly one line on stderr naming the rule.
set -u
BUILD=${1:?build dir}
MT="$BUILD/meshtrain"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0; passes=0
ok()   { passes=$((passes+1)); echo "PASS $1"; }
bad()  { fails=$((fails+1)); echo "FAIL $1"; }

if [ ! -x "$MT" ]; then echo "FAIL: $MT not built"; exit 1; fi
printf '{"vocab_size": 512, "n_layer": 4, "pattern": "AEAE", "shared_expert_hidden": 64}\n' > "$W/c.json"

# 1. good plan: parameters listed sum to the total, every bucket printed
if $MT plan --config "$W/c.json" --world 4 --mesh dp=2,ep=2 > "$W/out" 2> "$W/err"; then
  python3 - "$W/out" <<'PY' && ok "plan lists parameters and buckets" || bad "plan lists parameters and buckets"
import re, sys
t = open(sys.argv[1]).read()
total = int(re.search(r"parameters: (\d+) total", t).group(1))
rows = re.findall(r"^(model\.\S+|lm_head\.weight)\s+\[[\d, ]+\]\s+(\d+)\s+(muon|adamw)$", t, re.M)
assert sum(int(r[1]) for r in rows) == total, (len(rows), total)
# 4 layers, 2 MoE with 8 experts: 1 + 4*8 + 2*(1+24+3) + 2*3 + 2
assert len(rows) == 1 + 32 + 2 * 28 + 6 + 2, len(rows)
assert "model.layers.1.mlp.experts.7.down_proj.weight" in t and "model.layers.1.mlp.gate.weight" in t
for b in ("params", "grads", "optim", "acts", "workspace", "total"):
    assert re.search(r"^\s+%s\s+\d+" % b, t, re.M), b
PY
else bad "plan exit status ($(cat "$W/err"))"; fi

# 2. bad inputs: exit 2, one line on stderr containing the rule
expect2() { # name needle args...
  local name=$1 needle=$2; shift 2
  "$MT" plan "$@" > /dev/null 2> "$W/err"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -qF -- "$needle" "$W/err"; then ok "$name"
  else bad "$name (rc=$rc, stderr: $(cat "$W/err"))"; fi
}
expect2 "world mismatch"    "world != pp*dp*ep*tp"      --config "$W/c.json" --world 4 --mesh dp=3
expect2 "heads % tp"        "n_head % tp != 0"          --config "$W/c.json" --world 3 --mesh tp=3
expect2 "experts % ep"      "n_experts % ep != 0"       --config "$W/c.json" --world 3 --mesh ep=3 --set batch_size=9
expect2 "layers < pp"       "n_layer < pp"              --config "$W/c.json" --world 8 --mesh pp=8
expect2 "batch split"       "batch_size % (dp*ep*microbatches)" --config "$W/c.json" --world 3 --mesh dp=3
expect2 "seq_len % tp (SP)" "seq_len % tp"              --config "$W/c.json" --world 2 --mesh tp=2 --set seq_len=255
expect2 "resolve rule"      "n_head % n_kv_head != 0"   --config "$W/c.json" --set n_kv_head=3
expect2 "unknown key"       "did you mean 'n_layer'"    --config "$W/c.json" --set n_layers=2
expect2 "no vocab"          "vocab_size is not set"     --world 1
expect2 "bad axis"          "unknown axis 'xp'"         --config "$W/c.json" --world 2 --mesh xp=2
expect2 "bad world"         "--world"                   --config "$W/c.json" --world two
expect2 "missing config"    "nope.json"                 --config "$W/nope.json"
expect2 "unknown flag"      "--frob"                    --config "$W/c.json" --frob
# SP off lifts the seq_len rule
if $MT plan --config "$W/c.json" --world 2 --mesh tp=2 --set seq_len=255 --set sequence_parallel=false > /dev/null 2>&1
then ok "sp off"; else bad "sp off"; fi

echo "test_cli_plan: $passes passed, $fails failed"
[ $fails -eq 0 ]
