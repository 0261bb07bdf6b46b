#!/usr/bin/env bash
# test_plan_golden.sh BUILD_DIR — layout regression (issue 8, item 6).
# tests/golden/*.json each hold the arguments of one `meshtrain plan` and the
# `--json` answer it must give: the mesh, the batch geometry, every
# parameter's layout (global shape, spec, local shape, stage, holders,
# reduction group, ZeRO owner, optimizer ranks) and every rank's memory in
# the tensor buckets. Any difference fails with a diff. The config echo
# (other keys come and go) and the host-bookkeeping bucket `other` (struct
# sizes) are left out. An intended change: regenerate with
#     UPDATE_GOLDEN=1 bash tests/test_plan_golden.sh build
# and say in the commit message why the layout moved.
set -u
BUILD=${1:?usage: test_plan_golden.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
GOLD="$HERE/golden"

MOE='--set vocab_size=96 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set pattern=AEAE --set n_experts=4 --set top_k=2 --set expert_hidden=24 --set shared_expert_hidden=16'
DENSE='--set vocab_size=96 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8'
# name | args (world, mesh, zero, config)
CASES=$(cat <<LIST
one_rank|--world 1 --zero 0 $MOE
dp2_ep2_zero1|--world 4 --mesh dp=2,ep=2 --zero 1 $MOE
dp2_tp2_zero3_sp|--world 4 --mesh dp=2,tp=2 --zero 3 $DENSE
ep2_tp2_nosp_zero0|--world 4 --mesh ep=2,tp=2 --zero 0 $MOE --set sequence_parallel=false
pp2_tp2_zero2_recompute|--world 4 --mesh pp=2,tp=2 --zero 2 $MOE --set microbatches=2 --set recompute=block
LIST
)

strip() { # plan JSON on stdin -> the golden part on stdout
    python3 -c '
import json, sys
j = json.load(sys.stdin)
j.pop("config", None); j.pop("cost", None)
for e in j["memory"]["per_rank"]:
    e["bytes"].pop("other", None); e["bytes"].pop("total", None)
j["memory"].pop("max_total", None); j["memory"].pop("max_rank", None)
print(json.dumps(j, indent=1, sort_keys=False))'
}

while IFS='|' read -r name args; do
    [ -n "$name" ] || continue
    if ! "$MT" plan $args --threads 1 --json --profile none --steps 10 > "$W/$name.raw" 2> "$W/$name.err"; then
        bad "$name: plan failed: $(cat "$W/$name.err")"; continue
    fi
    strip < "$W/$name.raw" > "$W/$name.json"
    if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then
        python3 - "$W/$name.json" "$GOLD/$name.json" "$args" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
json.dump({"args": sys.argv[3].split(), "plan": plan}, open(sys.argv[2], "w"), indent=1)
open(sys.argv[2], "a").write("\n")
PY
        ok "$name: golden written"; continue
    fi
    if [ ! -f "$GOLD/$name.json" ]; then bad "$name: no golden file $GOLD/$name.json"; continue; fi
    python3 - "$GOLD/$name.json" "$W/$name.json" "$args" > "$W/$name.diff" <<'PY'
import difflib, json, sys
g = json.load(open(sys.argv[1])); now = json.load(open(sys.argv[2]))
if g["args"] != sys.argv[3].split():
    print("the golden file was made with other arguments:", g["args"]); sys.exit(1)
a = json.dumps(g["plan"], indent=1).splitlines(); b = json.dumps(now, indent=1).splitlines()
if a != b:
    print("\n".join(list(difflib.unified_diff(a, b, "golden", "now", lineterm=""))[:60])); sys.exit(1)
PY
    if [ $? -eq 0 ]; then ok "$name: layout and per-rank memory unchanged"
    else bad "$name: the plan changed (UPDATE_GOLDEN=1 to accept, and explain why):"; cat "$W/$name.diff"; fi
done <<< "$CASES"

finish
