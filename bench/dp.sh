#!/usr/bin/env bash
# Issue-4 benchmark: data parallel on config (a). One rank with two threads
# against two ranks (mpirun -np 2, one thread each) at ZeRO 0..3, each run
# once with overlap (default) and once with MT_ZERO_OVERLAP=0, so the share of
# communication that overlap hides is measured, not assumed:
#     hidden = 1 - exposed_comm(overlap) / exposed_comm(no overlap)
# Usage: bench/dp.sh [BUILD_DIR] [STEPS]  -> bench/out/dp/summary.json
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; STEPS=${2:-8}
OUT=bench/out/dp; mkdir -p "$OUT"
MT="$BUILD/meshtrain"
[ -f bench/out/data8k.bin ] || python3 tests/make_shard.py bench/out/data8k.bin 400000 8192 random
COMMON="--config bench/configs/a_dense.json --data bench/out/data8k.bin --steps $STEPS --set warmup_steps=1 --quiet"
OMP_NUM_THREADS=2 "$MT" train $COMMON --out "$OUT/single_2t" >/dev/null
for z in 0 1 2 3; do
  for ov in 1 0; do
    OMP_NUM_THREADS=1 MT_ZERO_OVERLAP=$ov mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS -x MT_ZERO_OVERLAP \
      -np 2 --bind-to core "$MT" train $COMMON --zero $z --out "$OUT/dp2_z${z}_ov$ov" >/dev/null
  done
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def load(n): return json.load(open(f"{out}/{n}/receipt.json"))
s = load("single_2t"); rows = {"single_rank_2_threads": {"tokens_per_s": s["timing"]["tokens_per_s"]}}
print(f"single rank, 2 threads: {s['timing']['tokens_per_s']:8.0f} tok/s")
for z in range(4):
    a, b = load(f"dp2_z{z}_ov1"), load(f"dp2_z{z}_ov0")
    ex_a = a["timing"]["step_time_split_s"]["communication"]; ex_b = b["timing"]["step_time_split_s"]["communication"]
    hidden = 1 - ex_a / ex_b if ex_b > 0 else 0.0
    st = sum(a["timing"]["step_times_s"])
    rows[f"dp2_zero{z}"] = {"tokens_per_s": a["timing"]["tokens_per_s"], "tokens_per_s_no_overlap": b["timing"]["tokens_per_s"],
                            "exposed_comm_s": ex_a, "comm_s_without_overlap": ex_b, "hidden_share": hidden,
                            "exposed_share_of_step": ex_a / st if st else 0, "idle_s": a["timing"]["step_time_split_s"]["idle"],
                            "bytes_per_step": {k: v["measured"] for k, v in a["distributed"]["collective_bytes_per_step"].items() if isinstance(v, dict)},
                            "ratio_to_single": a["timing"]["tokens_per_s"] / s["timing"]["tokens_per_s"]}
    r = rows[f"dp2_zero{z}"]
    print(f"dp=2 ZeRO-{z}: {r['tokens_per_s']:8.0f} tok/s (no overlap {r['tokens_per_s_no_overlap']:6.0f}), "
          f"ratio to single {r['ratio_to_single']:.2f}, exposed comm {ex_a:.3f}s of {ex_b:.3f}s -> hidden {hidden:.0%}")
json.dump(rows, open(f"{out}/summary.json", "w"), indent=2)
PY
