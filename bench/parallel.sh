#!/usr/bin/env bash
# Issues 5 and 6: the model and expert axes on this 2-core machine, against
# one rank with two threads (the same cores, the same global batch):
#   tp=2 (two ranks, one thread each) on configs (a) and (c), SP on;
#   ep=2 (two ranks, one thread each) on config (b).
# Reports tokens/s of both, the share of step time in TP communication, the
# all-to-all share and the expert imbalance. Receipts under bench/out/par/.
# Usage: bench/parallel.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; STEPS=${2:-6}
OUT=bench/out/par; mkdir -p "$OUT"
MT="$BUILD/meshtrain"
[ -f bench/out/data8k.bin ]  || python3 tests/make_shard.py bench/out/data8k.bin  400000 8192 random
[ -f bench/out/data50k.bin ] || python3 tests/make_shard.py bench/out/data50k.bin 400000 50304 random
MPI=(mpirun --oversubscribe --allow-run-as-root --bind-to core -x OMP_NUM_THREADS -np 2)
one()  { OMP_NUM_THREADS=2 "$MT" train --config "bench/configs/$1.json" --data "$2" --steps "$STEPS" --set warmup_steps=1 --quiet --out "$OUT/$3" "${@:4}" >/dev/null; }
two()  { OMP_NUM_THREADS=1 "${MPI[@]}" "$MT" train --config "bench/configs/$1.json" --data "$2" --steps "$STEPS" --set warmup_steps=1 --quiet --out "$OUT/$3" "${@:4}" >/dev/null; }
one a_dense     bench/out/data8k.bin  a_single
two a_dense     bench/out/data8k.bin  a_tp2 --mesh tp=2
one c_gpt2small bench/out/data50k.bin c_single
two c_gpt2small bench/out/data50k.bin c_tp2 --mesh tp=2
one b_moe       bench/out/data8k.bin  b_single
two b_moe       bench/out/data8k.bin  b_ep2 --mesh ep=2
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def r(n): return json.load(open(f"{out}/{n}/receipt.json"))
rows = {}
for c in ("a", "c"):
    s, t = r(f"{c}_single"), r(f"{c}_tp2")
    tp = t["distributed"]["tensor_parallel"]; st = sum(t["timing"]["step_times_s"])
    rows[f"{c}_tp2"] = {"tokens_per_s_single_2threads": s["timing"]["tokens_per_s"],
                        "tokens_per_s_tp2": t["timing"]["tokens_per_s"],
                        "ratio": t["timing"]["tokens_per_s"] / s["timing"]["tokens_per_s"],
                        "tp_comm_share_of_step": tp["comm_s_total"] / st if st else 0,
                        "tp_bytes_per_step": tp["bytes_per_step"], "mfu_tp2": t["timing"]["mfu"], "mfu_single": s["timing"]["mfu"]}
s, e = r("b_single"), r("b_ep2")
mo = e["distributed"]["moe"]; st = sum(e["timing"]["step_times_s"])
rows["b_ep2"] = {"tokens_per_s_single_2threads": s["timing"]["tokens_per_s"], "tokens_per_s_ep2": e["timing"]["tokens_per_s"],
                 "ratio": e["timing"]["tokens_per_s"] / s["timing"]["tokens_per_s"],
                 "all_to_all_share_of_step": mo["expert_parallel"]["all_to_all_s_total"] / st if st else 0,
                 "dispatch_bytes_per_step": mo["expert_parallel"]["dispatch_bytes_per_step"],
                 "imbalance_mean": mo["imbalance_mean"]}
json.dump(rows, open(f"{out}/summary.json", "w"), indent=2)
for k, v in rows.items():
    print(k, json.dumps({a: (round(b, 4) if isinstance(b, float) else b) for a, b in v.items()}))
PY
