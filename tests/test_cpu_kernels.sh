#!/usr/bin/env bash
# test_cpu_kernels.sh — issue 18's cpu-kernel contract, end to end:
#  1. the AVX2 kernels (MT_NO_AVX512=1) pass the op harness too (test_ops);
#  2. the AVX-512 and AVX2 kernel paths give bit-identical training (every
#     receipt series and every tensor of the checkpoint, equiv.py --bit) on a
#     dense and a MoE config with hd=64 and T=128 (full 4x64 attention tiles,
#     causal diagonal tiles, GQA);
#  3. the receipt's op profile: the kinds (gemm ... communication, other) sum
#     to the steady step time, gemm and attention are > 0, kernels_isa names
#     the path taken, and the roof's spread brackets its median.
# Skips (77) when the CPU has no AVX-512 (part 2 has nothing to compare).
set -u
BUILD=${1:-build}
grep -q avx512f /proc/cpuinfo || { echo "SKIPPED (no AVX-512 on this CPU: one kernel path only)"; exit 77; }
. "$(dirname "$0")/cli_lib.sh"
export OMP_NUM_THREADS=2
python3 "$HERE/make_shard.py" "$W/d.bin" 20000 512 pattern >/dev/null
CFG="--set vocab_size=512 --set n_layer=2 --set d_model=128 --set n_head=2 --set n_kv_head=1 --set seq_len=128 --set batch_size=2 --set warmup_steps=1 --set total_steps=4 --set logit_softcap=15"
MOE="$CFG --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=64"

if MT_NO_AVX512=1 "$BUILD/test_ops" >"$W/ops.log" 2>&1; then ok "test_ops on the AVX2 kernels"
else bad "test_ops on the AVX2 kernels"; tail -5 "$W/ops.log"; fi

for c in dense moe; do
    args=$CFG; [ $c = moe ] && args=$MOE
    "$MT" train $args --data "$W/d.bin" --steps 4 --quiet --out "$W/$c.512" >"$W/$c.512.log" 2>&1 || { bad "$c avx512 run"; cat "$W/$c.512.log"; continue; }
    MT_NO_AVX512=1 "$MT" train $args --data "$W/d.bin" --steps 4 --quiet --out "$W/$c.avx2" >"$W/$c.avx2.log" 2>&1 || { bad "$c avx2 run"; continue; }
    if python3 "$HERE/equiv.py" "$W/$c.512" "$W/$c.avx2" --bit >"$W/$c.eq" 2>&1; then ok "$c: AVX-512 and AVX2 kernels bit-identical"
    else bad "$c: AVX-512 and AVX2 kernels bit-identical"; tail -3 "$W/$c.eq"; fi
done

python3 - "$W/dense.512/receipt.json" "$W/dense.avx2/receipt.json" <<'PY' && ok "op profile, kernels_isa, roof spread in the receipt" || bad "op profile, kernels_isa, roof spread in the receipt"
import json, sys
err = []
for path, isa in zip(sys.argv[1:], ("avx512", "avx2")):
    r = json.load(open(path)); t = r["timing"]
    p = t["op_profile_s_per_step"]
    kinds = ["gemm", "attention", "xent", "norm", "elementwise", "optimizer", "communication", "scan", "attention_bwd",
             "other"]
    if list(p) != kinds + ["step"]: err.append(f"kinds {list(p)}")
    steady = t["step_times_s"][t["warmup_steps_excluded"]:]
    step = sum(steady) / len(steady)
    s = sum(p[k] for k in kinds)
    if abs(s - step) > 1e-6 * max(1, step) or abs(p["step"] - step) > 1e-6: err.append(f"sum {s} step {p['step']} vs {step}")
    if not (p["gemm"] > 0 and p["attention"] > 0 and p["attention_bwd"] > 0 and p["xent"] > 0 and p["optimizer"] > 0): err.append(f"zero kind {p}")
    if p["other"] < -1e-9 or p["other"] > 0.5 * step: err.append(f"other {p['other']} of {step}")
    if r["backend"].get("kernels_isa") != isa: err.append(f"isa {r['backend'].get('kernels_isa')} != {isa}")
    sp = t["peak_flops_spread"]
    if not (0 < sp["min"] <= t["peak_flops"] <= sp["max"]): err.append(f"spread {sp} peak {t['peak_flops']}")
for e in err: print("  ", e)
sys.exit(1 if err else 0)
PY
finish
