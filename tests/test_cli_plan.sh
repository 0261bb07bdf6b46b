#!/usr/bin/env bash
# `meshtrain plan` (issue 8): a good config prints every parameter (global
# shape, spec, local shape, holders, reduce group, owner) and every rank's
# memory; --json is stable and its per-rank totals agree with the text; the
# 70B plan on 1024 ranks takes seconds; auto-fit and --find-max answer; and
# every bad input (contract violation, unknown key, unparsable or too small
# --mem-per-rank, ...) gives exit 2 and exactly one line on stderr naming the
# rule. No MPI needed.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"

if [ ! -x "$MT" ]; then echo "FAIL: $MT not built"; exit 1; fi
printf '{"vocab_size": 512, "n_layer": 4, "pattern": "AEAE", "shared_expert_hidden": 64}\n' > "$W/c.json"

# 1. good plan: parameters listed sum to the total; spec, local shape, holders per mesh
if $MT plan --config "$W/c.json" --world 4 --mesh dp=2,ep=2 --zero 1 > "$W/out" 2> "$W/err"; then
  python3 - "$W/out" <<'PY' && ok "plan lists parameters and buckets" || bad "plan lists parameters and buckets"
import re, sys
t = open(sys.argv[1]).read()
total = int(re.search(r"parameters: (\d+) total", t).group(1))
rows = re.findall(r"^(model\.\S+|lm_head\.weight)\s+\[([\d, ]+)\]\s+(\[[^\]]*\](?: @expert)?)\s+\[([\d, ]+)\]\s+(\d+)\s+(\S+)\s+(\w+)\((\d+)\)\s+(-?\d+)\s+(\S+)\s+(muon|adamw)$", t, re.M)
import math
numel = lambda s: math.prod(int(x) for x in s.split(","))
assert sum(numel(r[1]) for r in rows) == total, (len(rows), total)
# 4 layers, 2 MoE with 8 experts: 1 + 4*8 + 2*(1+24+3) + 2*3 + 2
assert len(rows) == 1 + 32 + 2 * 28 + 6 + 2, len(rows)
by = {r[0]: r for r in rows}
e7 = by["model.layers.1.mlp.experts.7.down_proj.weight"]
assert e7[2] == "[-, -] @expert" and e7[6] == "data" and e7[5] == "1,3", e7     # expert rank 1 of ep=2
assert by["model.embed_tokens.weight"][6] == "data_expert" and by["model.embed_tokens.weight"][7] == "4"
assert re.search(r"^  ranks\s+params\s+grads\s+optim\s+acts\s+comm\s+workspace\s+other\s+runtime\s+total$", t, re.M)
assert re.search(r"^runtime \(rank 0; outside mt_alloc, from .*\): base [\d.]+ MiB, \d+ thread\(s\) ", t, re.M)
assert re.search(r"^largest: rank \d+, ", t, re.M)
PY
else bad "plan exit status ($(cat "$W/err"))"; fi

# 2. TP layout: rows split [model, -], columns [-, model], local shapes halved; ZeRO-3 holders = owners
if $MT plan --config "$W/c.json" --world 4 --mesh dp=2,tp=2 --zero 3 > "$W/out" 2> "$W/err"; then
  python3 - "$W/out" <<'PY' && ok "tp layout specs and local shapes" || bad "tp layout specs and local shapes"
import re, sys
t = open(sys.argv[1]).read()
q = re.search(r"^model\.layers\.0\.self_attn\.q_proj\.weight\s+\[256, 256\]\s+\[model, -\]\s+\[128, 256\]\s+0\s+(\S+)\s+data_expert\(2\)", t, re.M)
o = re.search(r"^model\.layers\.0\.self_attn\.o_proj\.weight\s+\[256, 256\]\s+\[-, model\]\s+\[256, 128\]", t, re.M)
g = re.search(r"^model\.layers\.0\.input_layernorm\.weight\s+\[256\]\s+\[-\]\s+\[256\]\s+0\s+(\S+)\s+stage\(4\)", t, re.M)
assert q and o and g, (q, o, g)
assert q.group(1) in ("0-1", "2-3"), q.group(1)        # ZeRO-3: one data rank holds it (both model slices)
assert re.fullmatch(r"\d", g.group(1)), g.group(1)     # a gain partial over model: one owner in the stage group
PY
else bad "tp plan exit status ($(cat "$W/err"))"; fi

# 3. --json: stable (two runs identical), schema, per-rank totals equal the text's
if $MT plan --config "$W/c.json" --world 4 --mesh pp=2,tp=2 --zero 2 --json > "$W/j1" 2> "$W/err" && \
   $MT plan --config "$W/c.json" --world 4 --mesh pp=2,tp=2 --zero 2 --json > "$W/j2" && cmp -s "$W/j1" "$W/j2" && \
   $MT plan --config "$W/c.json" --world 4 --mesh pp=2,tp=2 --zero 2 > "$W/t1"; then
  python3 - "$W/j1" "$W/t1" <<'PY' && ok "--json stable and consistent with the text" || bad "--json consistency"
import json, re, sys
j = json.load(open(sys.argv[1])); t = open(sys.argv[2]).read()
assert j["schema"] == "meshtrain.plan/1" and j["mesh"]["pp"] == 2 and j["mesh"]["tp"] == 2
assert len(j["memory"]["per_rank"]) == 4 and len(j["layout"]) > 0
assert [s["activation_slots"] for s in j["mesh"]["pipeline_stages"]] == [1, 1]
tot = {e["rank"]: e["bytes"]["total"] for e in j["memory"]["per_rank"]}
for m in re.finditer(r"^  ([\d,-]+)\s+(?:\d+\s+){8}(\d+)$", t, re.M):   # 7 buckets, runtime, total
    for part in m.group(1).split(","):
        a, _, b = part.partition("-")
        for r in range(int(a), int(b or a) + 1): assert tot[r] == int(m.group(2)), (r, tot[r], m.group(2))
assert j["memory"]["max_total"] == max(tot.values())
assert j["cost"]["step_s"] > 0
PY
else bad "--json runs ($(cat "$W/err"))"; fi

# 4. recompute=block: the plan's activation bucket shrinks, nothing else grows
if $MT plan --config "$W/c.json" --world 1 --json > "$W/r0" && $MT plan --config "$W/c.json" --world 1 --json --set recompute=block > "$W/r1"; then
  python3 - "$W/r0" "$W/r1" <<'PY' && ok "recompute=block shrinks the activation plan" || bad "recompute plan"
import json, sys
a = json.load(open(sys.argv[1]))["memory"]["per_rank"][0]["bytes"]; b = json.load(open(sys.argv[2]))["memory"]["per_rank"][0]["bytes"]
print("   acts %d -> %d" % (a["acts"], b["acts"]))
assert b["acts"] < 0.6 * a["acts"] and all(b[k] == a[k] for k in ("params", "grads", "optim", "workspace"))
PY
else bad "recompute plan runs"; fi

# 5. scale: 70B dense on 1024 ranks in seconds; the parameter count is Llama-2-70B's
printf '{"vocab_size":32000,"n_layer":80,"d_model":8192,"n_head":64,"n_kv_head":8,"mlp_hidden":28672,"seq_len":4096,"batch_size":1024,"microbatches":16}\n' > "$W/70b.json"
t0=$(date +%s.%N)
if $MT plan --config "$W/70b.json" --world 1024 --mesh pp=8,dp=16,tp=8 --zero 1 --set recompute=block --json > "$W/70b.out" 2> "$W/err"; then
  t1=$(date +%s.%N)
  python3 - "$W/70b.out" "$t0" "$t1" <<'PY' && ok "70B on 1024 ranks planned in seconds" || bad "70B plan"
import json, sys
j = json.load(open(sys.argv[1])); dt = float(sys.argv[3]) - float(sys.argv[2])
n = j["parameters"]["total"]; print("   %d parameters, %d ranks, %.2f s" % (n, len(j["memory"]["per_rank"]), dt))
assert 68.9e9 < n < 69.1e9 and len(j["memory"]["per_rank"]) == 1024 and dt < 20
PY
else bad "70B plan ($(cat "$W/err"))"; fi

# 5b. grad_reduce_dtype=bf16: the cost model's gradient reductions move half the bytes (the
#     per-call latencies stay): data-axis time strictly between half and all of the fp32 one for
#     ZeRO-0 (all-reduce) and ZeRO-3 (reduce-scatter; its parameter gathers stay fp32)
for z in 0 3; do
  if $MT plan --config "$W/70b.json" --world 1024 --mesh pp=8,dp=16,tp=8 --zero $z --set recompute=block --json \
        --profile h100-8x-nvlink-ib > "$W/g32.$z" 2> "$W/err" &&
     $MT plan --config "$W/70b.json" --world 1024 --mesh pp=8,dp=16,tp=8 --zero $z --set recompute=block --json \
        --profile h100-8x-nvlink-ib --set grad_reduce_dtype=bf16 > "$W/g16.$z" 2>> "$W/err"; then
    python3 - "$W/g32.$z" "$W/g16.$z" "$z" <<'PY' && ok "ZeRO-$z: grad_reduce_dtype=bf16 halves the reduction bytes in the cost" || bad "ZeRO-$z bf16 reduce cost"
import json, sys
a, b = (json.load(open(p))["cost"] for p in sys.argv[1:3])
print("   ZeRO-%s data-axis comm %.4g s -> %.4g s" % (sys.argv[3], a["dp_comm_s"], b["dp_comm_s"]))
assert 0.5 * a["dp_comm_s"] < b["dp_comm_s"] < 0.9 * a["dp_comm_s"], (a["dp_comm_s"], b["dp_comm_s"])
assert b["compute_s"] == a["compute_s"] and b["tp_comm_s"] == a["tp_comm_s"]
PY
  else bad "bf16 reduce plans ($(cat "$W/err"))"; fi
done

# 6. auto-fit and find-max (cpu-local profile)
if $MT plan --config "$W/c.json" --world 4 --auto --mem-per-rank 1GiB > "$W/auto" 2> "$W/err"; then
  grep -q "^best by predicted step time:" "$W/auto" && grep -qE "^  1 +pp=" "$W/auto" && \
    grep -q "mesh contract: n_kv_head % tp != 0" "$W/auto" && ok "auto-fit ranks layouts and names rejection rules" \
    || { bad "auto-fit output"; head -30 "$W/auto"; }
else bad "auto-fit ($(cat "$W/err"))"; fi
if $MT plan --config "$W/c.json" --world 4 --auto --mem-per-rank 60MiB > "$W/auto2" 2>&1; then
  grep -qE "memory: over --mem-per-rank, largest bucket (acts|workspace)" "$W/auto2" && ok "auto-fit names the bucket that rejects" \
    || { bad "auto-fit bucket rejection"; head -30 "$W/auto2"; }
else bad "auto-fit 60MiB ($(cat "$W/auto2"))"; fi
if $MT plan --config "$W/c.json" --world 2 --mesh dp=2 --find-max seq_len --mem-per-rank 200MiB > "$W/fm" 2> "$W/err"; then
  v=$(sed -n 's/^largest seq_len that fits .*: \([0-9]*\)$/\1/p' "$W/fm")
  # v fits, v+1 does not (the explicit plan says so)
  if [ -n "$v" ] && $MT plan --config "$W/c.json" --world 2 --mesh dp=2 --set seq_len=$v --mem-per-rank 200MiB > /dev/null 2>&1 && \
     ! $MT plan --config "$W/c.json" --world 2 --mesh dp=2 --set seq_len=$((v+1)) --mem-per-rank 200MiB > /dev/null 2>&1
  then ok "--find-max seq_len = $v is the largest that fits"; else bad "--find-max seq_len ($v)"; fi
else bad "--find-max ($(cat "$W/err"))"; fi
if $MT plan --config "$W/c.json" --world 4 --auto --find-max batch_size --mem-per-rank 200MiB > "$W/fmb" 2> "$W/err"; then
  grep -qE "^largest batch_size that fits .* on 4 ranks: [0-9]+ \(pp=" "$W/fmb" && ok "--auto --find-max batch_size" \
    || bad "--auto --find-max batch_size: $(cat "$W/fmb")"
else bad "--auto --find-max ($(cat "$W/err"))"; fi

# 7. bad inputs: exit 2, one line on stderr containing the rule
expect2() { # name needle args...
  local name=$1 needle=$2; shift 2
  "$MT" plan "$@" > /dev/null 2> "$W/err"; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$W/err")" -eq 1 ] && grep -qF -- "$needle" "$W/err"; then ok "$name"
  else bad "$name (rc=$rc, stderr: $(cat "$W/err"))"; fi
}
expect2 "world mismatch"    "pp*dp*ep*tp=3 != world=4"  --config "$W/c.json" --world 4 --mesh dp=3
expect2 "heads % tp"        "mesh contract: n_head % tp != 0"    --config "$W/c.json" --world 3 --mesh tp=3
expect2 "experts % ep"      "mesh contract: n_experts % ep != 0" --config "$W/c.json" --world 3 --mesh ep=3 --set batch_size=9
expect2 "layers < pp"       "mesh contract: n_layer < pp"        --config "$W/c.json" --world 8 --mesh pp=8
expect2 "batch split"       "batch_size % (dp*ep*microbatches)" --config "$W/c.json" --world 3 --mesh dp=3
expect2 "seq_len % tp (SP)" "seq_len % tp != 0 with sequence parallel" --config "$W/c.json" --world 2 --mesh tp=2 --set seq_len=255
expect2 "resolve rule"      "n_head % n_kv_head != 0"   --config "$W/c.json" --set n_kv_head=3
expect2 "unknown key"       "did you mean 'n_layer'"    --config "$W/c.json" --set n_layers=2
printf '{"vocab_size":512,"frobs":1}' >"$W/frobs.json"   # a file: a pipe (<(...)) is no regular file (issue 33)
expect2 "unknown key (file)" "unknown config key 'frobs'" --config "$W/frobs.json"
expect2 "no vocab"          "vocab_size is not set"     --world 1
expect2 "bad axis"          "unknown axis 'xp'"         --config "$W/c.json" --world 2 --mesh xp=2
expect2 "bad world"         "--world"                   --config "$W/c.json" --world two
expect2 "missing config"    "nope.json"                 --config "$W/nope.json"
expect2 "unknown flag"      "--frob"                    --config "$W/c.json" --frob
expect2 "bad zero"          "--zero must be 0, 1, 2 or 3" --config "$W/c.json" --zero 7
expect2 "bad pp-layers"     "--pp-layers '3,3' covers 6 layers" --config "$W/c.json" --world 2 --mesh pp=2 --pp-layers 3,3
expect2 "mem unparsable"    "--mem-per-rank '12XB'"     --config "$W/c.json" --world 4 --auto --mem-per-rank 12XB
expect2 "mem negative"      "--mem-per-rank '-5'"       --config "$W/c.json" --world 4 --auto --mem-per-rank -5
expect2 "mem too small"     "is too small for any layout: the smallest need is" --config "$W/c.json" --world 4 --auto --mem-per-rank 1MiB
expect2 "mem too small (mesh)" "does not fit: a rank needs" --config "$W/c.json" --world 2 --mem-per-rank 1MiB
expect2 "find-max too small" "too small for this layout at any seq_len: the smallest need is" --config "$W/c.json" --world 1 --find-max seq_len --mem-per-rank 1KiB
expect2 "find-max what"     "--find-max 'heads'"        --config "$W/c.json" --find-max heads --mem-per-rank 1GiB
expect2 "auto needs mem"    "--auto needs --mem-per-rank" --config "$W/c.json" --world 2 --auto --profile none
expect2 "auto and mesh"     "--auto chooses the mesh itself" --config "$W/c.json" --world 2 --auto --mesh dp=2 --mem-per-rank 1GiB
expect2 "missing profile"   "--profile 'nosuch'"        --config "$W/c.json" --profile nosuch
expect2 "no mesh fits"      "no mesh of world=5 satisfies the startup contract" --config "$W/c.json" --world 5 --auto --mem-per-rank 1GiB
# SP off lifts the seq_len rule
if $MT plan --config "$W/c.json" --world 2 --mesh tp=2 --set seq_len=255 --set sequence_parallel=false > /dev/null 2>&1
then ok "sp off"; else bad "sp off"; fi

finish
