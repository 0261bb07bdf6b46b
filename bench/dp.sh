#!/usr/bin/env bash
# Data parallel on one host (issues 4 and 18). One rank with two threads against
# two ranks (mpirun -np 2, one thread each) at ZeRO 0..3, per config, REPS
# times, interleaved so every ratio compares runs under the same machine load:
#     ratio = tokens/s(dp=2, 1 thread per rank) / tokens/s(1 rank, 2 threads)
# With NO_OVERLAP=1 each dp run is repeated with MT_ZERO_OVERLAP=0, so the share
# of communication that overlap hides is measured, not assumed:
#     hidden = 1 - exposed_comm(overlap) / exposed_comm(no overlap)
# BLAS kernels: the caller's OPENBLAS_CORETYPE is dropped so meshtrain picks the
# set for the CPU (SkylakeX on AVX-512), as vs_torch.sh does; MT_BENCH_CORETYPE
# forces one.
# Usage: bench/dp.sh [BUILD_DIR] [STEPS] [REPS] [CONFIGS]   (CONFIGS default "a_dense")
#   -> bench/out/dp/summary.json
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; STEPS=${2:-8}; REPS=${3:-1}; CONFIGS=${4:-a_dense}
OUT=bench/out/dp; mkdir -p "$OUT"
MT="$BUILD/meshtrain"
if [ -n "${MT_BENCH_CORETYPE:-}" ]; then export OPENBLAS_CORETYPE=$MT_BENCH_CORETYPE; else unset OPENBLAS_CORETYPE; fi
[ -f bench/out/data8k.bin ] || python3 tests/make_shard.py bench/out/data8k.bin 400000 8192 random
case "$CONFIGS" in *c_gpt2small*) [ -f bench/out/data50k.bin ] || python3 tests/make_shard.py bench/out/data50k.bin 400000 50304 random;; esac
for rep in $(seq 1 "$REPS"); do
  for c in $CONFIGS; do
    data=bench/out/data8k.bin; [ "$c" = c_gpt2small ] && data=bench/out/data50k.bin
    COMMON="--config bench/configs/$c.json --data $data --steps $STEPS --set warmup_steps=1 --quiet"
    echo "== rep $rep $c"
    OMP_NUM_THREADS=2 "$MT" train $COMMON --out "$OUT/$c.r$rep.single_2t" >/dev/null
    for z in 0 1 2 3; do
      for ov in 1 ${NO_OVERLAP:+0}; do
        OMP_NUM_THREADS=1 MT_ZERO_OVERLAP=$ov mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS \
          -x MT_ZERO_OVERLAP -np 2 --bind-to core "$MT" train $COMMON --zero $z --out "$OUT/$c.r$rep.dp2_z${z}_ov$ov" >/dev/null
      done
    done
  done
done
python3 - "$OUT" "$REPS" "$CONFIGS" <<'PY'
import json, os, sys
out, reps, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def load(n): return json.load(open(f"{out}/{n}/receipt.json"))
summ = {}
for c in configs:
    rows = []
    for r in range(1, reps + 1):
        s = load(f"{c}.r{r}.single_2t")
        row = {"single_rank_2_threads": s["timing"]["tokens_per_s"], "blas_coretype": s["backend"].get("blas_coretype")}
        print(f"{c} run {r} [blas {row['blas_coretype']}]: single rank, 2 threads {row['single_rank_2_threads']:8.0f} tok/s")
        for z in range(4):
            a = load(f"{c}.r{r}.dp2_z{z}_ov1")
            ex_a = a["timing"]["step_time_split_s"]["communication"]
            d = {"tokens_per_s": a["timing"]["tokens_per_s"], "exposed_comm_s": ex_a,
                 "idle_s": a["timing"]["step_time_split_s"]["idle"],
                 "bytes_per_step": {k: v["measured"] for k, v in a["distributed"]["collective_bytes_per_step"].items()
                                    if isinstance(v, dict)},
                 "ratio_to_single": a["timing"]["tokens_per_s"] / row["single_rank_2_threads"]}
            line = f"  dp=2 ZeRO-{z}: {d['tokens_per_s']:8.0f} tok/s, ratio to single {d['ratio_to_single']:.2f}"
            if os.path.exists(f"{out}/{c}.r{r}.dp2_z{z}_ov0"):
                b = load(f"{c}.r{r}.dp2_z{z}_ov0"); ex_b = b["timing"]["step_time_split_s"]["communication"]
                d.update(tokens_per_s_no_overlap=b["timing"]["tokens_per_s"], comm_s_without_overlap=ex_b,
                         hidden_share=1 - ex_a / ex_b if ex_b > 0 else 0.0)
                line += f" (no overlap {d['tokens_per_s_no_overlap']:6.0f}), exposed comm {ex_a:.3f}s of {ex_b:.3f}s" \
                        f" -> hidden {d['hidden_share']:.0%}"
            print(line)
            row[f"dp2_zero{z}"] = d
        rows.append(row)
    summ[c] = rows
    for z in range(4):
        q = sorted(x[f"dp2_zero{z}"]["ratio_to_single"] for x in rows)
        print(f"{c} dp=2 ZeRO-{z} / single over {reps} runs: min {q[0]:.2f}  median {q[len(q)//2]:.2f}  max {q[-1]:.2f}")
json.dump(summ, open(f"{out}/summary.json", "w"), indent=2)
PY
