#!/usr/bin/env bash
# test_plan_kinds.sh BUILD_DIR — the planner's step by op kind (issue 27
# item 5, docs/plan.md section 5 "By op kind"): with a measured GPU profile
# (tests/data/h200-measured-2026-11-26am.json: the profile of the first H200
# run, fp32 attention rate, no bf16 attention or scan rate; a fixture, so the
# numbers below do not move when bench/profiles/ is recalibrated) `plan --json` has cost.by_kind whose
# seconds (gemm, attention_fwd, attention_bwd, norm, elementwise, xent,
# optimizer, scan, comm, bubble) sum to its step_s, the attention rows at the
# profile's measured attention rate, and the text output prints one line per
# kind whose sum is the printed step; a hybrid has a scan row; a pipeline a
# bubble and TP a comm row; a profile without an attention rate runs
# attention at the GEMM rate; memory_bandwidth_bytes_per_s overrides the
# calibrated copy rate; a profile without a memory bandwidth (cpu-local) has
# no breakdown; the MoE experts' grouped kernels at their own rate, and only
# where a run takes the device-sized path (7, 8); Muon's batched Newton-Schulz at
# its measured rate (9).
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"
CFG="$HERE/../bench/configs/gpu_d2048_dense.json"
PROF="$HERE/data/h200-measured-2026-11-26am.json"
plan() { "$MT" plan --config "$CFG" --set precision=bf16 --profile "$PROF" "$@"; }

# check FILE EXPECT...: python asserts on the plan JSON in FILE
check() {
    python3 - "$@" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); want = sys.argv[2:]
k = j["cost"]["by_kind"]; s = k["seconds"]
kinds = ["gemm", "attention_fwd", "attention_bwd", "norm", "elementwise", "xent", "optimizer", "scan", "comm", "bubble"]
assert list(s) == kinds, list(s)
assert all(v >= 0 for v in s.values()), s
assert abs(sum(s.values()) - k["step_s"]) <= 1e-12 * k["step_s"], (sum(s.values()), k["step_s"])
assert s["gemm"] > 0 and s["attention_fwd"] > 0 and s["attention_bwd"] > 0, s
for a in ("fwd", "bwd"):   # attention is compute at its rate (no bytes)
    r = k["attention_%s_flop_per_s" % a]; f = k["flops"]["attention_" + a]
    assert abs(s["attention_" + a] - f / r) <= 1e-9 * s["attention_" + a], (a, s, f, r)
assert abs(k["flops"]["attention_bwd"] - 2.5 * k["flops"]["attention_fwd"]) <= 1e-6 * k["flops"]["attention_bwd"]
for w in want:
    key, op, val = w.split(":", 2)
    got = k.get(key, s.get(key))
    ok = {"eq": lambda: float(got) == float(val) if isinstance(got, (int, float)) else got == val, "gt": lambda: got > float(val), "zero": lambda: got == 0}[op]()
    assert ok, (key, op, val, got)
print("step %.4g s: %s" % (k["step_s"], ", ".join("%s %.3g" % (n, v) for n, v in s.items() if v > 0)))
PY
}

# 1. dense d2048, one GPU: the sum, the measured attention rate, no scan / comm / bubble
if plan --world 1 --json >"$W/d.json" 2>"$W/err" &&
   msg=$(check "$W/d.json" attention_basis:eq:measured scan:zero: comm:zero: bubble:zero: \
         memory_bandwidth_basis:eq:"2 x measured.device_copy_bytes_per_s" attention_fwd_flop_per_s:eq:6874423000000.0); then
    ok "d2048 bf16 on h200-measured: by_kind sums to step_s ($msg)"
else bad "d2048 by_kind: $(cat "$W/err") $msg"; fi

# 2. the text: one line per kind, the attention rows present, their sum = the printed step (4 digits)
if plan --world 1 >"$W/d.txt" 2>"$W/err" && python3 - "$W/d.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
rows = dict(re.findall(r"^    (\w+) +([0-9.e+-]+) s", t, re.M))
kinds = ["gemm", "attention_fwd", "attention_bwd", "norm", "elementwise", "xent", "optimizer", "scan", "comm", "bubble"]
assert [k for k in rows if k != "step"] == kinds, rows
total = sum(float(rows[k]) for k in kinds)
assert abs(total - float(rows["step"])) <= 1e-3 * float(rows["step"]), (total, rows["step"])
assert float(rows["attention_fwd"]) > 0 and "measured" in t
PY
then ok "text: a line per kind incl. attention_fwd/bwd, summing to the printed step"
else bad "text by kind: $(cat "$W/err") $(sed -n '/by op kind/,$p' "$W/d.txt")"; fi

# 3. hybrid: a scan row (at the GEMM rate: the profile has no scan rate); pipeline + TP: bubble and comm
if plan --world 1 --json --set pattern=MAMAMAMAMAMAMAMA >"$W/h.json" 2>"$W/err" &&
   msg=$(check "$W/h.json" scan:gt:0 scan_basis:eq:"gemm rate"); then ok "hybrid: scan row ($msg)"
else bad "hybrid: $(cat "$W/err") $msg"; fi
if plan --world 8 --mesh pp=2,dp=2,tp=2 --set microbatches=2 --json >"$W/p.json" 2>"$W/err" &&
   msg=$(check "$W/p.json" bubble:gt:0 comm:gt:0); then ok "pp=2,dp=2,tp=2: bubble and comm rows ($msg)"
else bad "pp/tp: $(cat "$W/err") $msg"; fi

# 4. a profile without an attention rate: attention at the GEMM rate; memory_bandwidth_bytes_per_s wins
python3 - "$PROF" "$W/noatt.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); del p["measured"]["attention_fwd_bwd_flop_per_s"]
p["memory_bandwidth_bytes_per_s"] = 4.8e12
json.dump(p, open(sys.argv[2], "w"))
PY
if "$MT" plan --config "$CFG" --set precision=bf16 --profile "$W/noatt.json" --world 1 --json >"$W/n.json" 2>"$W/err" &&
   msg=$(check "$W/n.json" attention_basis:eq:"gemm rate" memory_bandwidth_bytes_per_s:eq:4800000000000.0 \
         memory_bandwidth_basis:eq:memory_bandwidth_bytes_per_s); then ok "no attention rate: GEMM rate ($msg)"
else bad "no attention rate: $(cat "$W/err") $msg"; fi

# 4b. a profile with the bf16 (tensor-core) attention rate: precision=bf16 uses it,
#     precision=fp32 keeps the fp32 kernels' rate
python3 - "$PROF" "$W/tc.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); p["measured"]["attention_bf16_fwd_bwd_flop_per_s"] = 1.5e14
json.dump(p, open(sys.argv[2], "w"))
PY
if "$MT" plan --config "$CFG" --set precision=bf16 --profile "$W/tc.json" --world 1 --json >"$W/t16.json" 2>"$W/err" &&
   msg=$(check "$W/t16.json" attention_basis:eq:"measured (bf16 tensor-core kernels)" attention_fwd_flop_per_s:eq:150000000000000.0) &&
   "$MT" plan --config "$CFG" --profile "$W/tc.json" --world 1 --json >"$W/t32.json" 2>"$W/err" &&
   msg2=$(check "$W/t32.json" attention_basis:eq:measured attention_fwd_flop_per_s:eq:6874423000000.0); then
    ok "bf16 attention rate: used by precision=bf16 ($msg), not by fp32 ($msg2)"
else bad "bf16 attention rate: $(cat "$W/err") $msg ${msg2:-}"; fi

# 4c. the Mamba-3 scan likewise: a bf16 scan rate (ssm_scan_*_bf16, tensor cores) for
#     precision=bf16, the fp32 rows' rate for fp32 (the hybrid: pattern=MAMA...)
python3 - "$PROF" "$W/sc.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["measured"]["scan_fwd_bwd_flop_per_s"] = 2e12; p["measured"]["scan_bf16_fwd_bwd_flop_per_s"] = 1e14
json.dump(p, open(sys.argv[2], "w"))
PY
HYB="--set pattern=MAMAMAMAMAMAMAMA"
if "$MT" plan --config "$CFG" $HYB --set precision=bf16 --profile "$W/sc.json" --world 1 --json >"$W/s16.json" 2>"$W/err" &&
   msg=$(check "$W/s16.json" scan_basis:eq:"measured (bf16 tensor-core scan)" scan_flop_per_s:eq:1e14 scan:gt:0) &&
   "$MT" plan --config "$CFG" $HYB --profile "$W/sc.json" --world 1 --json >"$W/s32.json" 2>"$W/err" &&
   msg2=$(check "$W/s32.json" scan_basis:eq:measured scan_flop_per_s:eq:2e12 scan:gt:0); then
    ok "bf16 scan rate: used by precision=bf16 ($msg), not by fp32 ($msg2)"
else bad "bf16 scan rate: $(cat "$W/err") ${msg:-} ${msg2:-}"; fi

# 4d. no bf16 scan rate, but a bf16 attention one: precision=bf16 prices the scan
#     at the attention's rate (a named proxy, not the fp32 CUDA-core rate), and
#     counts the tensor-core scan's bytes kernel by kernel (docs/plan.md, "The
#     bytes of precision=bf16": per token and M layer 1.5 E + 1.5 HN + 3 S + 8 H
#     forward, 4.5 E + 4 HN + 5 S + 4 H Q + 14 H backward (S_in, dS_out stored
#     bf16 by the passes, each chunk's own state and dS_out's local part fp32;
#     M, dG and dC in one kernel), dx stored bf16 into
#     dproj's operand, x read as stored bf16, Bh and Ch read as their bf16 twins
#     alone, dy stored bf16 only (its twin), dBh and dCh written bf16 only;
#     S = H P N / Q (nc - 1) / nc: the states of the chunks before the last, those
#     the kernels write, pass and read); a
#     chunk the tensor cores do not take (256) keeps the operands-only count
#     (5 E + 6 HN + 6 H). d2048 hybrid: E = HN = H Q = 4096, S = 4096 31 / 32
#     (T 2048: 32 chunks of 64), H = 64, 8 M layers, 8192 rows
if "$MT" plan --config "$CFG" $HYB --set precision=bf16 --profile "$W/tc.json" --world 1 --json >"$W/x16.json" 2>"$W/err" &&
   msg=$(check "$W/x16.json" scan_basis:eq:"proxy: the bf16 attention's measured rate (no measured bf16 scan)" \
               scan_flop_per_s:eq:150000000000000.0 scan:gt:0) &&
   "$MT" plan --config "$CFG" $HYB --set precision=bf16 --set mamba_chunk=256 --profile "$W/tc.json" --world 1 --json \
       >"$W/x256.json" 2>"$W/err" &&
   msg2=$(python3 - "$W/x16.json" "$W/x256.json" <<'PY'
import json, sys
b64, b256 = (json.load(open(f))["cost"]["by_kind"]["bytes"]["scan"] for f in sys.argv[1:3])
E = HN = HQ = 4096; S = 4096 * 31 / 32; H = 64; rows = 8 * 8192 * 4
tc = (1.5 * E + 1.5 * HN + 3 * S + 8 * H + 4.5 * E + 4 * HN + 5 * S + 4 * HQ + 14 * H) * rows
ops = (5 * E + 6 * HN + 6 * H) * rows
assert abs(b64 - tc) <= 1e-9 * tc, (b64, tc)
assert abs(b256 - ops) <= 1e-9 * ops, (b256, ops)
print("scan bytes %.4g (tensor cores), %.4g (chunk 256: operands)" % (b64, b256))
PY
); then
    ok "bf16 scan without its rate: the attention's as a named proxy ($msg); $msg2"
else bad "bf16 scan proxy: $(cat "$W/err") ${msg:-} ${msg2:-}"; fi

# 4e. the run's knob scan_bf16=0 keeps the fp32 scan: precision=bf16 prices it at the
#     profile's fp32 scan rate (not the bf16 one) and by the operands-only bytes, and the
#     JSON says which knobs it priced (the default run: scan_bf16 1)
if "$MT" plan --config "$CFG" $HYB --set precision=bf16 --knob scan_bf16=0 --profile "$W/sc.json" --world 1 --json \
       >"$W/k0.json" 2>"$W/err" &&
   msg=$(check "$W/k0.json" scan_basis:eq:"measured (fp32 scan: knob scan_bf16=0)" scan_flop_per_s:eq:2e12) &&
   msg2=$(python3 - "$W/k0.json" "$W/s16.json" <<'PY'
import json, sys
k0, k1 = (json.load(open(f))["cost"]["by_kind"] for f in sys.argv[1:3])
assert k0["knobs"] == {"scan_bf16": 0, "head_bf16_logits": 1, "moe_dev_sizes": 1, "optim_gemm_bf16": 1,
                     "grouped_gemm_kernel": "mma"}, k0["knobs"]
assert k1["knobs"] == {"scan_bf16": 1, "head_bf16_logits": 1, "moe_dev_sizes": 1, "optim_gemm_bf16": 1,
                     "grouped_gemm_kernel": "mma"}, k1["knobs"]
E = HN = 4096; H = 64; rows = 8 * 8192 * 4
ops = (5 * E + 6 * HN + 6 * H) * rows
assert abs(k0["bytes"]["scan"] - ops) <= 1e-9 * ops, (k0["bytes"]["scan"], ops)
assert k0["seconds"]["scan"] > 10 * k1["seconds"]["scan"], (k0["seconds"]["scan"], k1["seconds"]["scan"])
print("scan %.4g s (fp32) vs %.4g s (tensor cores)" % (k0["seconds"]["scan"], k1["seconds"]["scan"]))
PY
); then
    ok "knob scan_bf16=0 priced as the fp32 scan ($msg); $msg2"
else bad "knob scan_bf16=0: $(cat "$W/err") ${msg:-} ${msg2:-}"; fi

# 5. cpu-local has no memory bandwidth: no by_kind, a line saying why
if "$MT" plan --config "$CFG" --world 1 --profile cpu-local --json >"$W/c.json" 2>"$W/err" &&
   python3 -c 'import json,sys; assert "by_kind" not in json.load(open(sys.argv[1]))["cost"]' "$W/c.json" &&
   "$MT" plan --config "$CFG" --world 1 --profile cpu-local | grep -q "by op kind: the profile has no memory bandwidth"; then
    ok "cpu-local: no breakdown, said"
else bad "cpu-local: $(cat "$W/err")"; fi
# 6. precision=bf16 counts the bytes the bf16 cuda path moves (docs/plan.md, "By op
#    kind", the precision=bf16 table): for d2048 its elementwise bytes are below fp32's
#    (bf16 gate/up and twins, fused passes) and the cross-entropy reads a bf16 logit
#    once and writes the bf16 dlogits over it (1 V elements against fp32's 3 V: a third)
if "$MT" plan --config "$CFG" --world 1 --profile "$PROF" --json >"$W/e32.json" 2>"$W/err" &&
   plan --world 1 --json >"$W/e16.json" 2>>"$W/err" &&
   msg=$(python3 - "$W/e32.json" "$W/e16.json" <<'PY'
import json, sys
b32, b16 = (json.load(open(f))["cost"]["by_kind"]["bytes"] for f in sys.argv[1:3])
assert b16["elementwise"] < b32["elementwise"], (b16["elementwise"], b32["elementwise"])
assert abs(3 * b16["xent"] - b32["xent"]) <= 1e-9 * b32["xent"], (b16["xent"], b32["xent"])
print("elementwise %.3g < %.3g B, xent %.3g = %.3g / 3" % (b16["elementwise"], b32["elementwise"], b16["xent"], b32["xent"]))
PY
); then
    ok "bf16 bytes by kind: $msg"
else bad "bf16 bytes by kind: $(cat "$W/err") ${msg:-}"; fi
# 6b. knob head_bf16_logits=0: the cross-entropy on fp32 logits (xent_fused_bf16) reads
#     each 4-byte logit once and writes the bf16 dlogits: 1.5 V elements, not 1 V
if plan --world 1 --knob head_bf16_logits=0 --json >"$W/e16f.json" 2>"$W/err" &&
   msg=$(python3 - "$W/e16.json" "$W/e16f.json" <<'PY'
import json, sys
k1, k0 = (json.load(open(f))["cost"]["by_kind"] for f in sys.argv[1:3])
assert k0["knobs"]["head_bf16_logits"] == 0, k0["knobs"]
x1, x0 = k1["bytes"]["xent"], k0["bytes"]["xent"]
assert abs(x0 - 1.5 * x1) <= 1e-9 * x0, (x0, x1)
print("xent %.3g B = 1.5 x %.3g B" % (x0, x1))
PY
); then
    ok "knob head_bf16_logits=0: $msg"
else bad "head_bf16_logits=0: $(cat "$W/err") ${msg:-}"; fi
# 7. the MoE experts' grouped kernels (gemm_grouped.cu: mma.sync, not cuBLAS) at their own
#    rate: gpu_moe8 (8 MoE layers, top-2, D 2048, Fe 2752, 8192 tokens) in precision=bf16
#    runs 6 k 3 D Fe FLOPs a token and MoE layer on them. Without a measured grouped rate
#    they go at the GEMM rate, the basis says "assumed"; with one (here half the GEMM
#    rate) the gemm row grows by exactly their FLOPs at the GEMM rate; knob moe_sizes=host
#    (cuBLAS a group) or precision=fp32: none on the grouped kernels; knob
#    grouped_gemm_kernel=wgmma: the wgmma rows' rate (here twice the mma.sync one), and
#    without one the GEMM rate, "assumed" (never the mma.sync kernels' rate)
MOE8="$HERE/../bench/configs/gpu_moe8.json"
msg=""
python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p["measured"]["gemm_grouped_bf16_flop_per_s"] = 2.5e14
json.dump(p, open(sys.argv[2], "w")); p["measured"]["gemm_grouped_wgmma_bf16_flop_per_s"] = 5e14
json.dump(p, open(sys.argv[3], "w"))' "$PROF" "$W/gg.json" "$W/ggw.json"
if "$MT" plan --config "$MOE8" --set precision=bf16 --knob grouped_gemm_kernel=wgmma --profile "$W/ggw.json" \
       --world 1 --json >"$W/mw.json" 2>"$W/err" &&
   "$MT" plan --config "$MOE8" --set precision=bf16 --knob grouped_gemm_kernel=wgmma --profile "$W/gg.json" \
       --world 1 --json >"$W/mw0.json" 2>>"$W/err" &&
   "$MT" plan --config "$MOE8" --set precision=bf16 --profile "$PROF" --world 1 --json >"$W/m0.json" 2>>"$W/err" &&
   "$MT" plan --config "$MOE8" --set precision=bf16 --profile "$W/gg.json" --world 1 --json >"$W/m1.json" 2>>"$W/err" &&
   "$MT" plan --config "$MOE8" --set precision=bf16 --knob moe_sizes=host --profile "$W/gg.json" --world 1 --json \
       >"$W/mh.json" 2>>"$W/err" &&
   "$MT" plan --config "$MOE8" --profile "$W/gg.json" --world 1 --json >"$W/m32.json" 2>>"$W/err" &&
   "$MT" plan --config "$MOE8" --set precision=bf16 --profile "$W/gg.json" --world 1 | grep -q "of which 1.33e+13 FLOP the MoE experts' grouped kernels, at 2.5e+14 FLOP/s, measured" &&
   msg=$(python3 - "$W/m0.json" "$W/m1.json" "$W/mh.json" "$W/m32.json" "$W/mw.json" "$W/mw0.json" <<'PY'
import json, sys
k0, k1, kh, k32, kw, kw0 = (json.load(open(f))["cost"]["by_kind"] for f in sys.argv[1:7])
fg = 6 * 2 * 3 * 2048 * 2752 * 8 * 8192
assert k0["gemm_grouped_flops"] == k1["gemm_grouped_flops"] == fg, (k0["gemm_grouped_flops"], fg)
assert k0["gemm_grouped_basis"] == "assumed: the GEMM rate (no measured grouped rate)", k0["gemm_grouped_basis"]
r = k0["gemm_flop_per_s"]
assert k0["gemm_grouped_flop_per_s"] == r and abs(k0["seconds"]["gemm"] - k0["flops"]["gemm"] / r) <= 1e-12, k0
assert k1["gemm_grouped_basis"] == "measured (grouped bf16 expert kernels)" and k1["gemm_grouped_flop_per_s"] == 2.5e14
want = (k1["flops"]["gemm"] - fg) / r + fg / 2.5e14
assert abs(k1["seconds"]["gemm"] - want) <= 1e-9 * want, (k1["seconds"]["gemm"], want)
assert kh["gemm_grouped_flops"] == 0 and kh["knobs"]["moe_dev_sizes"] == 0, kh
assert abs(kh["seconds"]["gemm"] - kh["flops"]["gemm"] / r) <= 1e-12, kh["seconds"]
assert k32["gemm_grouped_flops"] == 0 and k32["gemm_grouped_basis"].startswith("assumed"), k32
assert kw["gemm_grouped_basis"] == "measured (grouped bf16 expert kernels on wgmma)" and \
    kw["gemm_grouped_flop_per_s"] == 5e14 and kw["knobs"]["grouped_gemm_kernel"] == "wgmma", kw
want = (kw["flops"]["gemm"] - fg) / r + fg / 5e14
assert abs(kw["seconds"]["gemm"] - want) <= 1e-9 * want, (kw["seconds"]["gemm"], want)
assert kw0["gemm_grouped_basis"] == "assumed: the GEMM rate (no measured wgmma grouped rate)" and \
    kw0["gemm_grouped_flop_per_s"] == r, kw0
assert k1["knobs"]["grouped_gemm_kernel"] == "mma", k1["knobs"]
print("grouped %.4g FLOP; gemm %.4g s (assumed the GEMM rate) -> %.4g s (measured 2.5e14), %.4g s (wgmma 5e14); "
      "host sizes: 0" % (fg, k0["seconds"]["gemm"], k1["seconds"]["gemm"], kw["seconds"]["gemm"]))
PY
); then
    ok "MoE experts' grouped kernels at their own rate: $msg"
else bad "grouped expert rate: $(cat "$W/err") ${msg:-}"; fi
# 8. the plan prices the path the run takes: for each row, a one-step cpu run (knob
#    moe_sizes=device: the device-sized path where it applies) and its plan agree on
#    whether the experts' sizes stay on the backend (the receipt's
#    distributed.moe.expert_sizes "device") and whether the plan puts FLOPs on the
#    grouped kernels (gemm_grouped_flops > 0); one rule, moe.c dev_sizes_refusal
python3 "$HERE/make_shard.py" "$W/tiny.bin" 20000 64 pattern >/dev/null
TM="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16
    --set batch_size=4 --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=16"
msg="" n8=0
for row in "device|--set precision=bf16" "host|" "host|--set precision=bf16 --set n_null_experts=2" \
           "host|--set precision=bf16 --set expert_hidden=12" "host|--set precision=bf16 --set redo_every=2" \
           "host|--set precision=bf16 --knob moe_grouped=0" "host|--set precision=bf16 --knob moe_sizes=host"; do
    want=${row%%|*} x=${row#*|}
    # shellcheck disable=SC2086
    "$MT" train $TM --knob moe_sizes=device $x --backend cpu --steps 1 --quiet --no-save --data "$W/tiny.bin" \
        --out "$W/r8_$n8" >"$W/r8.log" 2>&1 &&
    # shellcheck disable=SC2086
    "$MT" plan $TM --knob moe_sizes=device $x --profile "$PROF" --json >"$W/p8.json" 2>"$W/err" &&
    got=$(python3 - "$W/r8_$n8/receipt.json" "$W/p8.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["distributed"]["moe"]["expert_sizes"]
plan = "device" if json.load(open(sys.argv[2]))["cost"]["by_kind"]["gemm_grouped_flops"] > 0 else "host"
print(run if run == plan else "run %s, plan %s" % (run, plan))
PY
) || got="no run or plan ($(tail -1 "$W/r8.log"; cat "$W/err"))"
    [ "$got" = "$want" ] || msg="$msg [${x:-precision=fp32}: want $want, got $got]"
    n8=$((n8 + 1))
done
if [ -z "$msg" ]; then ok "plan and run agree on the device-sized experts ($n8 configs)"
else bad "plan vs run, device-sized experts:$msg"; fi
# 9. Muon's batched bf16 Newton-Schulz at its measured rate (cuda_calib's muon_ns rows,
#    measured.muon_ns_bf16_flop_per_s): d2048 with Muon in precision=bf16 prices its
#    optimizer FLOPs at it (basis "measured ..."), and the bytes part is unchanged; with knob
#    muon_ns_bf16=0 (the fp32 iteration) the rate does not apply
msg=""
python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p["measured"]["muon_ns_bf16_flop_per_s"] = 3.0e14
json.dump(p, open(sys.argv[2], "w"))' "$PROF" "$W/ns.json"
if plan --set optimizer=muon --world 1 --json >"$W/n0.json" 2>"$W/err" &&
   "$MT" plan --config "$CFG" --set precision=bf16 --set optimizer=muon --profile "$W/ns.json" --world 1 --json \
       >"$W/n1.json" 2>>"$W/err" &&
   "$MT" plan --config "$CFG" --set precision=bf16 --set optimizer=muon --knob muon_ns_bf16=0 --profile "$W/ns.json" \
       --world 1 --json >"$W/n2.json" 2>>"$W/err" &&
   msg=$(python3 - "$W/n0.json" "$W/n1.json" "$W/n2.json" <<'PY'
import json, sys
k0, k1, k2 = (json.load(open(f))["cost"]["by_kind"] for f in sys.argv[1:4])
assert k0["optimizer_basis"] == "bf16" and k1["optimizer_basis"] == "measured (batched bf16 Newton-Schulz)", (k0, k1)
assert k1["optimizer_flop_per_s"] == 3.0e14 and k2["optimizer_basis"] == "fp32", (k1, k2)
f, b = k1["flops"]["optimizer"], k1["bytes"]["optimizer"]
assert f > 4e13 and b == k0["bytes"]["optimizer"], (f, b, k0["bytes"]["optimizer"])
want = f / 3.0e14 + b / k1["memory_bandwidth_bytes_per_s"]
assert abs(k1["seconds"]["optimizer"] - want) <= 1e-9 * want, (k1["seconds"]["optimizer"], want)
print("optimizer %.4g s at the bf16 GEMM rate -> %.4g s at the measured 3e14" % (k0["seconds"]["optimizer"],
                                                                               k1["seconds"]["optimizer"]))
PY
); then
    ok "Muon's batched Newton-Schulz at its measured rate: $msg"
else bad "Muon's measured Newton-Schulz rate: $(cat "$W/err") ${msg:-}"; fi

finish
