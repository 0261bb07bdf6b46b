#!/usr/bin/env bash
# test_gpu_profile.sh BUILD_DIR — bench/profiles/gpu_profile.py turns
# bench/cuda_calib's JSON into a device profile `meshtrain plan --profile`
# loads (docs/cuda.md, "Calibrating the planner's GPU profile"), on the CPU
# build, from a fixed calibration (an H100 run's shape, made-up numbers):
#   - bf16: peak_flops = the datasheet bf16 dense peak (989.4e12, the table
#     of src/plan/gpu_info.c), efficiency = sum FLOPs / sum median times of
#     the bf16 layer rows only (not the square ones) / that peak,
#     memory_bytes from the nvidia-smi line, links kept from the base
#     profile, and "sources" has an entry for every number it wrote;
#   - fp32: the fp32 peak and the fp32 rows;
#   - the plan loads it (its cost header names the profile, with the rate)
#     and times a config by its own precision (by_precision: fp32 and bf16);
#   - refused (exit 1, no file): a calibration whose gemm check failed, a
#     device not in the datasheet table without --datasheet.
# The emulated end-to-end run (cuda_calib --quick -> this script -> plan)
# is tests/test_cuda_build.sh step e.
set -u
BUILD=${1:?usage: test_gpu_profile.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT="$(cd "$HERE/.." && pwd)"
GP="$ROOT/bench/profiles/gpu_profile.py"
command -v python3 >/dev/null || { echo "SKIPPED (no python3)"; exit 77; }

# two layer rows and one square row per precision: the square bf16 row is
# fast, so using it would raise the efficiency (caught below)
cat > "$W/calib.json" <<'EOF'
{"tool": "cuda_calib", "version": 1, "quick": false, "reps": 20, "warmup": 3,
 "device": {"name": "NVIDIA H100 80GB HBM3", "emulated": false, "cc": "9.0", "sm_count": 132,
            "mem_total_bytes": 85017624576, "runtime_version": 13000, "driver_version": 13000,
            "cublas_version": 130000},
 "build": {"nccl": false},
 "check": {"ok": true, "fp32_max_rel": 1e-7, "bf16_fp32_operands_max_rel": 2e-7, "bf16_max_rel": 2e-7},
 "gemm": [
  {"m": 4096, "n": 4096, "k": 4096, "set": "square", "precision": "bf16", "flops": 1.0e12, "median_s": 1.25e-3},
  {"m": 4096, "n": 4096, "k": 4096, "set": "square", "precision": "fp32", "flops": 1.0e12, "median_s": 2.0e-2},
  {"m": 8192, "n": 6144, "k": 2048, "set": "layer_d2048", "precision": "bf16", "flops": 3.0e11, "median_s": 6.0e-4},
  {"m": 8192, "n": 6144, "k": 2048, "set": "layer_d2048", "precision": "fp32", "flops": 3.0e11, "median_s": 6.0e-3},
  {"m": 8192, "n": 2048, "k": 2048, "set": "layer_d2048", "precision": "bf16", "flops": 1.0e11, "median_s": 2.0e-4},
  {"m": 8192, "n": 2048, "k": 2048, "set": "layer_d2048", "precision": "fp32", "flops": 1.0e11, "median_s": 4.0e-3},
  {"m": 8192, "n": 2048, "k": 2048, "set": "layer_d2048", "precision": "bf16_fp32_operands", "flops": 1.0e11,
   "median_s": 4.0e-4}],
 "gemm_best_flop_per_s": {"fp32": 5.0e13, "bf16_fp32_operands": 2.5e14, "bf16": 8.0e14},
 "attention": [{"b": 4, "t": 2048, "h": 16, "hd": 128, "fwd_bwd_flop_per_s": 6e12}],
 "attention_best_fwd_bwd_flop_per_s": 6e12, "attention_precision": "fp32",
 "allreduce": {"available": false, "comm": "self_dev", "why": "no NCCL: the identity"},
 "device_copy": {"best_bytes_per_s": 1.3e12}}
EOF
echo "NVIDIA H100 80GB HBM3, 81559" > "$W/smi.csv"

# bf16: layer rows 4e11 FLOPs / 8e-4 s = 5e14 -> 5e14 / 989.4e12
if python3 "$GP" "$W/calib.json" --smi "$W/smi.csv" --name t-bf16 --out "$W/bf16.json" > "$W/bf16.log" 2>&1 &&
   python3 - "$W/bf16.json" "$ROOT/bench/profiles/h100-8x-nvlink-ib.json" <<'PY'
import json, math, sys
p, base = (json.load(open(x)) for x in sys.argv[1:3])
assert p["name"] == "t-bf16" and p["peak_flops"] == 989.4e12, p["peak_flops"]
assert math.isclose(p["efficiency"], 5e14 / 989.4e12, rel_tol=1e-5), p["efficiency"]
assert p["memory_bytes"] == 81559 * 1048576, p["memory_bytes"]
assert p["links"] == base["links"] and p["ranks_per_node"] == base["ranks_per_node"], p["links"]
assert p["node_peak_flops"] == p["peak_flops"] * p["ranks_per_node"]
for k in ("peak_flops", "node_peak_flops", "efficiency", "memory_bytes", "intra_node", "inter_node", "overlap"):
    assert p["sources"].get(k), k
assert "no link was measured" in p["sources"]["intra_node"], p["sources"]["intra_node"]
assert "nvidia-smi" in p["sources"]["memory_bytes"]
assert p["measured"]["allreduce_one_rank"]["available"] is False
PY
then ok "bf16 profile: datasheet bf16 peak, efficiency from the bf16 layer rows, smi memory, links kept, sources"
else cat "$W/bf16.log"; bad "bf16 profile"; fi

# fp32: layer rows 4e11 / 1e-2 s = 4e13 -> / 66.9e12
if python3 "$GP" "$W/calib.json" --precision fp32 --name t-fp32 --out "$W/fp32.json" > "$W/fp32.log" 2>&1 &&
   python3 -c 'import json, math, sys; p = json.load(open(sys.argv[1]))
assert p["peak_flops"] == 66.9e12 and math.isclose(p["efficiency"], 4e13 / 66.9e12, rel_tol=1e-5), p
assert p["memory_bytes"] == 85017624576, p["memory_bytes"]' "$W/fp32.json"; then
    ok "fp32 profile: fp32 peak, fp32 layer rows, memory from the device properties without --smi"
else cat "$W/fp32.log"; bad "fp32 profile"; fi

# the planner loads both and times a config by its own precision: both
# profiles carry by_precision (fp32 rows 4e13 / 66.9e12, bf16 rows 5e14 /
# 989.4e12), so an fp32 config gets the fp32 peak and efficiency from either
# profile and a precision=bf16 config the bf16 ones (JSON cost section)
for t in bf16 fp32; do
    for prec in fp32 bf16; do
        if "$MT" plan --config "$ROOT/bench/configs/gpu_d2048_dense.json" --set batch_size=32 --set precision=$prec \
                --world 8 --mesh dp=8 --profile "$W/$t.json" > "$W/plan_${t}_$prec.log" 2>&1 &&
           grep -q "^cost model (profile t-$t: .*peak for $prec)" "$W/plan_${t}_$prec.log" &&
           "$MT" plan --config "$ROOT/bench/configs/gpu_d2048_dense.json" --set batch_size=32 --set precision=$prec \
                --world 8 --mesh dp=8 --profile "$W/$t.json" --json > "$W/plan_${t}_$prec.json" 2>&1 &&
           python3 - "$W/plan_${t}_$prec.json" "$prec" <<'PY'
import json, math, sys
c = json.load(open(sys.argv[1]))["cost"]
peak, eff = {"fp32": (66.9e12, 4e13 / 66.9e12), "bf16": (989.4e12, 5e14 / 989.4e12)}[sys.argv[2]]
assert c["peak_basis"] == sys.argv[2] and c["peak_flops_per_rank"] == peak, c
assert math.isclose(c["efficiency"], eff, rel_tol=1e-5), c
PY
        then ok "plan --profile $t, precision=$prec config: $(grep '^cost model' "$W/plan_${t}_$prec.log")"
        else tail -3 "$W/plan_${t}_$prec.log"; bad "plan --profile $t precision=$prec"; fi
    done
done
# a by_precision entry without a peak is refused, naming the key
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); p["by_precision"]["bf16"]={"efficiency": 0.5}
json.dump(p, open(sys.argv[2], "w"))' "$W/bf16.json" "$W/badbyp.json"
out=$("$MT" plan --config "$ROOT/bench/configs/gpu_d2048_dense.json" --set batch_size=32 --world 8 --mesh dp=8 \
      --profile "$W/badbyp.json" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "by_precision must be an object"; then ok "a bad by_precision is refused: $out"
else echo "$out"; bad "bad by_precision not refused (exit $rc)"; fi

# refusals
sed 's/"check": {"ok": true/"check": {"ok": false/' "$W/calib.json" > "$W/badcheck.json"
out=$(python3 "$GP" "$W/badcheck.json" --out "$W/x.json" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ ! -e "$W/x.json" ] && echo "$out" | grep -q "gemm check failed"; then
    ok "a failed gemm check is refused: $out"
else echo "$out"; bad "failed check not refused (exit $rc)"; fi
sed 's/NVIDIA H100 80GB HBM3/Some GPU/' "$W/calib.json" > "$W/unknown.json"
out=$(python3 "$GP" "$W/unknown.json" --out "$W/y.json" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ ! -e "$W/y.json" ] && echo "$out" | grep -q "give --datasheet" &&
   python3 "$GP" "$W/unknown.json" --datasheet H100 --out "$W/y.json" >/dev/null 2>&1 && [ -s "$W/y.json" ]; then
    ok "an unknown device is refused without --datasheet, accepted with it"
else echo "$out"; bad "unknown device (exit $rc)"; fi

finish
