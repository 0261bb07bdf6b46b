#!/usr/bin/env bash
# test_gpu_decide.sh BUILD_DIR — bench/gpu_decide.py (what a GPU call pair says about the
# issues' targets and the cuda defaults) on the H100 run's archives
# (bench/results/2026-11-27-h100: its numbers, as that README gives them), then on copies
# with the rows a next run would add: an opt-in kernel right and faster switches its
# default, and each gate (a FAIL line in the ops stage, a calib row not right, a row not
# faster by the margin, no row) keeps it.
set -u
BUILD=${1:?usage: test_gpu_decide.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT="$(cd "$HERE/.." && pwd)"
command -v python3 >/dev/null || { echo "SKIPPED (no python3)"; exit 77; }
D="$ROOT/bench/gpu_decide.py"
A="$ROOT/bench/results/2026-11-27-h100"
mkdir -p "$W/h"
tar xzf "$A/gpu-quick.tgz" -C "$W/h" && tar xzf "$A/gpu-rest.tgz" -C "$W/h" || fatal "unpack the H100 archives"
Q="$W/h/2026-11-27-gpu-quick" R="$W/h/2026-11-27-gpu-rest"

has() {   # has WHAT FILE PATTERN...: every pattern (grep -E) in FILE
    local what=$1 f=$2; shift 2
    for p in "$@"; do grep -qE -- "$p" "$f" || { bad "$what: no line '$p' in: $(head -c 1500 "$f")"; return; }; done
    ok "$what"
}

python3 "$D" "$Q" "$R" > "$W/h100.md" || bad "gpu_decide on the H100 archives exited $?"
has "H100 run: the README's numbers, met or not" "$W/h100.md" \
    '^\| d2048 dense MFU \| >= 0.45 \| d2048_dense \| 0.339 \| not met \|$' \
    '^\| moe8 vs torch eager \| >= 1 \| moe8 \| 1.182 \| met \|$' \
    '^\| hybrid vs dense d2048 \(tokens/s\) \| >= 0.8 \| hyb2048 \| 0.394 \| not met \|$' \
    'vs llm.c \| >= 1 \| c_gpt2 \| 0.790 \| not met \|$' \
    '^\| A layer core / M layer core .* \| 0.073 \| not met \|$' \
    '^- attn_kernel=v4: keep v3 — no calib attention_v4 row at hd 64' \
    '^- cuda_graphs=0: keep the default \(c_gpt2_nographs 0.0691 s vs c_gpt2 0.0665 s' \
    '^- grouped_gemm_kernel=wgmma: keep mma'

# a next run's rows: v5 right and 20% faster at d2048, as fast at hd 64; v4 right, not faster;
# grouped wgmma right and faster; moe8_hostsizes slower; mamba_chunk=128 faster
python3 - "$Q" "$R" <<'PY'
import json, sys
q, r = sys.argv[1], sys.argv[2]
s = json.load(open(q + "/summary.json"))
s["speed"]["c_gpt2_124m"] = {"tokens_per_s": 400000.0, "s_per_step": 0.04096, "mfu": 0.3}
s["speed"]["moe8_hostsizes"] = {"tokens_per_s": 27000.0, "s_per_step": 0.30}
json.dump(s, open(q + "/summary.json", "w"))
t = json.load(open(r + "/summary.json"))
d = 0.15329992124999947
t["speed"] = {"d2048_dense_attnv5": {"s_per_step": 0.8 * d, "mfu": 0.42, "tokens_per_s": 66000.0},
              "c_gpt2_124m_attnv5": {"s_per_step": 0.04096}, "d2048_dense_attnv4": {"s_per_step": 0.99 * d},
              "c_gpt2_124m_attnv4": {"s_per_step": 0.04}, "moe8_ggwgmma": {"s_per_step": 0.25},
              "hyb2048_chunk128": {"s_per_step": 0.35}}
json.dump(t, open(r + "/summary.json", "w"))
c = json.load(open(r + "/calib.json"))
for kv in ("v4", "v5"):
    c["attention_" + kv] = [{"hd": hd, "ok": True, "bwd_ok": True} for hd in (64, 128)]
c["grouped_wgmma"] = [{"kind": k, "ok": True} for k in ("rows_xWT", "rows_dyW", "sum_dW")]
json.dump(c, open(r + "/calib.json", "w"))
PY
python3 "$D" "$Q" "$R" > "$W/next.md" || bad "gpu_decide on the next-run rows exited $?"
has "next run: v5 right and faster switches, v4 not faster keeps; grouped wgmma and mamba_chunk=128 switch" \
    "$W/next.md" \
    '^- attn_kernel=v5: \*\*switch\*\* \(right on the device; d2048_dense_attnv5 0.1226 s vs d2048_dense 0.1533 s' \
    '^  - attention default: \*\*v5\*\*$' \
    '^- attn_kernel=v4: keep v3 — d2048: .*not faster by 2%$' \
    '^- grouped_gemm_kernel=wgmma: \*\*switch\*\*' \
    '^- moe_sizes=host: keep the default' \
    '^- mamba_chunk=128: \*\*switch\*\*' \
    '^\| GPT-2 124M vs llm.c \(tokens/s\) \| >= 1 \| c_gpt2_124m \| 1.284 \| met \|$' \
    '^\| d2048 dense MFU \| >= 0.45 \| d2048_dense_attnv5 \| 0.420 \| not met \|$'

# each gate: v5's set failing test_attn_bf16 on the device; a grouped wgmma FAIL line in the harness
echo "FAIL  cuda[v5] B2 T100 H4 K4 hd64: within the bf16 bound" >> "$Q/logs/test_attn_bf16.txt"
echo "FAIL  gemm_grouped_rows  NN wgmma E=3 (err/bound)" >> "$Q/logs/ops_harness.txt"
python3 "$D" "$Q" "$R" > "$W/gates.md" || bad "gpu_decide with the gates exited $?"
has "gates: a v5 FAIL line on the device, a wgmma FAIL line in the harness keep the defaults" "$W/gates.md" \
    '^- attn_kernel=v5: keep v3 — test_attn_bf16 FAIL lines for cuda\[v5\], or it never finished$' \
    '^- grouped_gemm_kernel=wgmma: keep mma — the ops harness has wgmma FAIL lines'
grep -q 'attention default' "$W/gates.md" && bad "gates: an attention default named with no kernel switched" ||
    ok "gates: no attention default named"

# a crash inside the v4 set (no summary line: gpu_fallbacks.attention_fails, the one reader of
# those logs): v5 never ran on the device, so it is not switched either
printf '# attn_kernel v3\nok    cuda[v3] B2: x\n# attn_kernel v4\nok    cuda[v4] B2: x\n' > "$Q/logs/test_attn_bf16.txt"
python3 "$D" "$Q" "$R" > "$W/crash.md" || bad "gpu_decide with a crashed attention log exited $?"
has "a crash inside v4's set keeps v3 for v4 and v5 (v5 never ran)" "$W/crash.md" \
    '^- attn_kernel=v5: keep v3 — test_attn_bf16 FAIL lines for cuda\[v5\], or it never finished$'

# bad input: a folder with no summary.json
python3 "$D" "$W/none" "$R" > /dev/null 2> "$W/err.txt"; rc=$?
[ $rc -eq 2 ] && grep -q "has no readable summary.json" "$W/err.txt" && ok "no summary.json: exit 2, said" ||
    bad "no summary.json: rc $rc, $(cat "$W/err.txt")"
finish
