#!/usr/bin/env bash
# Issue-2 benchmark: configs (a) dense, (b) MoE, (c) GPT-2-small shape, each
# with a receipt, plus the OpenBLAS sgemm roof measured in the same run; issue
# 15: (d) hybrid MAMA at seq 1024, next to (a) at seq 1024, batch 4 (a_t1024).
# Usage: bench/run.sh [BUILD_DIR] [STEPS]   -> bench/out/summary.json
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; STEPS=${2:-6}
OUT=bench/out; mkdir -p "$OUT"
MT="$BUILD/meshtrain"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
[ -f "$OUT/data8k.bin" ]  || python3 tests/make_shard.py "$OUT/data8k.bin"  400000 8192 random
[ -f "$OUT/data50k.bin" ] || python3 tests/make_shard.py "$OUT/data50k.bin" 400000 50304 random
# the roof: the same ops table and thread count the trainer uses (measured by the trainer at startup)
for c in a_dense b_moe c_gpt2small d_hybrid a_t1024; do
  data="$OUT/data8k.bin"; [ $c = c_gpt2small ] && data="$OUT/data50k.bin"
  cfg=$c; extra=""; [ $c = a_t1024 ] && { cfg=a_dense; extra="--set seq_len=1024 --set batch_size=4"; }
  echo "== $c"
  "$MT" train --config bench/configs/$cfg.json --data "$data" --out "$OUT/$c" --steps "$STEPS" --set warmup_steps=1 $extra
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]; rows = {}
for c in ("a_dense", "b_moe", "c_gpt2small", "d_hybrid", "a_t1024"):
    r = json.load(open(f"{out}/{c}/receipt.json"))
    t = r["timing"]
    rows[c] = {"tokens_per_s": t["tokens_per_s"], "model_flops_per_s": t["model_flops_per_s"],
               "peak_flops": t["peak_flops"], "mfu": t["mfu"], "peak_source": t["peak_flops_source"],
               "coretype": r["backend"]["blas_coretype"], "loss_first": r["losses"][0], "loss_last": r["losses"][-1],
               "peak_rss_bytes": r["memory"]["peak_rss_bytes"], "plan_total_bytes": r["memory"]["plan_bytes"]["total"]}
json.dump(rows, open(f"{out}/summary.json", "w"), indent=2)
for c, v in rows.items():
    print(f"{c:12s} {v['tokens_per_s']:9.0f} tok/s  {v['model_flops_per_s']/1e9:7.1f} GFLOP/s  "
          f"roof {v['peak_flops']/1e9:6.1f}  ratio {v['mfu']:.3f}  ({v['coretype']})")
# the per-op profile of each config (receipt timing.op_profile_s_per_step), ms per steady step
profs = {c: json.load(open(f"{out}/{c}/receipt.json"))["timing"].get("op_profile_s_per_step") for c in rows}
if all(profs.values()):
    print("\n| op kind | " + " | ".join(profs) + " |\n| --- |" + " ---: |" * len(profs))
    for k in next(iter(profs.values())):
        print(f"| {k} | " + " | ".join(f"{1e3*p[k]:.1f} ms ({100*p[k]/p['step']:.0f}%)" for p in profs.values()) + " |")
PY
