#!/usr/bin/env bash
# test_startup_timing.sh BUILD_DIR — time to first step (issue 28 item 1):
# every receipt has timing.startup_s {setup, param_init, roof, first_step,
# total_to_first_step}; each is >= 0, the phases sum to at most
# total_to_first_step, which is at most the process's wall time measured
# here; first_step is step_times_s[0]; --steps 0 has no first step (null);
# a resume times its checkpoint load as param_init; the progress output has
# a "startup:" line before step 1 and a "first step" line after it (none
# with --quiet).
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
cat > "$W/tiny.json" <<'J'
{"vocab_size": 64, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "seq_len": 16, "batch_size": 4,
 "pattern": "AE", "n_experts": 4, "top_k": 2, "expert_hidden": 16}
J
# run NAME STEPS ARGS...: the train; its start and end (epoch s) in $W/NAME.wall
run() {
    local name=$1 steps=$2; shift 2
    local t0; t0=$(date +%s.%N)
    $MT train --config "$W/tiny.json" --peak-flops 1e11 --data "$W/train.bin" --out "$W/$name" --steps "$steps" "$@" \
        >"$W/$name.out" 2>"$W/$name.err"
    local rc=$?
    echo "$t0 $(date +%s.%N)" >"$W/$name.wall"
    return $rc
}
# check NAME WANT_FIRST(1|0): the receipt's startup object against the rules
check() {
    python3 - "$W/$1/receipt.json" "$(cat "$W/$1.wall")" "$2" <<'PY'
import json, sys
t0, t1 = map(float, sys.argv[2].split())
r = json.load(open(sys.argv[1])); wall = t1 - t0; want_first = sys.argv[3] == "1"
s = r["timing"]["startup_s"]
keys = ["setup", "param_init", "roof", "first_step", "total_to_first_step"]
assert list(s)[:5] == keys, list(s)
for k in keys[:3]:
    assert isinstance(s[k], (int, float)) and s[k] >= 0, (k, s[k])
if want_first:
    assert s["first_step"] >= 0 and s["total_to_first_step"] > 0, s
    assert s["first_step"] == r["timing"]["step_times_s"][0], (s["first_step"], r["timing"]["step_times_s"])
    parts = s["setup"] + s["param_init"] + s["roof"] + s["first_step"]
    assert parts <= s["total_to_first_step"] + 1e-6, ("phases sum above the total", parts, s)
    assert s["total_to_first_step"] <= wall, ("total_to_first_step above the process wall time", s, wall)
else:
    assert s["first_step"] is None and s["total_to_first_step"] is None, s
    assert s["setup"] + s["param_init"] + s["roof"] <= wall, (s, wall)
print("setup %.4f param_init %.4f roof %.4f first_step %s total_to_first_step %s wall %.3f" %
      (s["setup"], s["param_init"], s["roof"], s["first_step"], s["total_to_first_step"], wall))
PY
}

# 1. a fresh run of 3 steps: fields, sums, the two progress lines around step 1
if run fresh 3 && msg=$(check fresh 1) &&
   awk '/^startup: setup .* param init .* roof .* step 1 starts at/{s=NR} /^step 1\/3/{t=NR} /^first step .* to first step$/{f=NR}
        END{exit !(s && t && f && s < t && t < f)}' "$W/fresh.out"; then
    ok "fresh run: timing.startup_s consistent ($msg), startup line before step 1, first-step line after"
else bad "fresh run: $(cat "$W/fresh.err") $msg $(cat "$W/fresh.out")"; fi

# 2. --steps 0: no first step (null), the setup phases still there
if run init0 0 && msg=$(check init0 0); then ok "--steps 0: first_step null ($msg)"
else bad "--steps 0: $(cat "$W/init0.err") $msg"; fi

# 3. a resume: param_init is the checkpoint load; consistent as a fresh run
if run resumed 4 --resume "$W/fresh" && msg=$(check resumed 1); then ok "resume: consistent ($msg)"
else bad "resume: $(cat "$W/resumed.err") $msg"; fi

# 4. --quiet: neither progress line
if run quiet 1 --quiet && ! grep -q -e '^startup:' -e '^first step' "$W/quiet.out"; then ok "--quiet: no startup lines"
else bad "--quiet printed the startup lines: $(cat "$W/quiet.out")"; fi
finish
