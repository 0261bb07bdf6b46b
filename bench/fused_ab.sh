#!/usr/bin/env bash
# Issue 18 item 3: A/B of two builds on configs (a) dense and (b) MoE, 1 and 2
# threads, REPS interleaved rounds (old, new, old, new, ... in one run, so a
# noisy shared machine hits both alike; the order alternates per round);
# prints each pair's tokens/s ratio new/old, the median ratio per (config,
# threads), the median per-op profile (receipt timing.op_profile_s_per_step,
# ms per steady step) of each, and (norm + elementwise) / gemm per run: the
# fused chains change only norm and elementwise, and gemm (unchanged code)
# slows down with the machine's load like they do, so the quotient is the
# load-robust comparison.
# Usage: bench/fused_ab.sh OLD_MESHTRAIN NEW_MESHTRAIN [REPS] [STEPS] -> bench/out/fused_ab/summary.json
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: fused_ab.sh OLD NEW [REPS] [STEPS]}; NEW=${2:?usage: fused_ab.sh OLD NEW [REPS] [STEPS]}
REPS=${3:-3}; STEPS=${4:-5}
OUT=bench/out/fused_ab; mkdir -p "$OUT"
[ -f bench/out/data8k.bin ] || python3 tests/make_shard.py bench/out/data8k.bin 400000 8192 random
for r in $(seq 1 "$REPS"); do
  for c in a_dense b_moe; do
    for th in 1 2; do
      order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"   # alternate who runs first
      for b in $order; do
        bin=$OLD; [ $b = new ] && bin=$NEW
        d="$OUT/$c.t$th.$b.$r"; rm -rf "$d"
        OMP_NUM_THREADS=$th "$bin" train --config bench/configs/$c.json --data bench/out/data8k.bin --out "$d" \
          --steps "$STEPS" --set warmup_steps=1 --peak-flops 1e11 --quiet >/dev/null
        echo "$c t$th $b rep $r: $(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['timing']['tokens_per_s']))" "$d/receipt.json") tok/s"
      done
    done
  done
done
python3 - "$OUT" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rec = lambda c, th, b, r: json.load(open(f"{out}/{c}.t{th}.{b}.{r}/receipt.json"))["timing"]
summary = {}
print("| config | threads | old tok/s (median) | new tok/s (median) | new/old per round | median ratio |")
print("| --- | ---: | ---: | ---: | --- | ---: |")
for c in ("a_dense", "b_moe"):
    for th in (1, 2):
        o = [rec(c, th, "old", r)["tokens_per_s"] for r in range(1, reps + 1)]
        n = [rec(c, th, "new", r)["tokens_per_s"] for r in range(1, reps + 1)]
        ratios = [b / a for a, b in zip(o, n)]
        summary[f"{c}.t{th}"] = {"old": o, "new": n, "ratios": ratios, "median_ratio": statistics.median(ratios)}
        print(f"| {c} | {th} | {statistics.median(o):.0f} | {statistics.median(n):.0f} | "
              + ", ".join(f"{x:.3f}" for x in ratios) + f" | {statistics.median(ratios):.3f} |")
print("\nper-op profile, ms per steady step (median over rounds)")
for c in ("a_dense", "b_moe"):
    for th in (1, 2):
        prof = {b: [rec(c, th, b, r)["op_profile_s_per_step"] for r in range(1, reps + 1)] for b in ("old", "new")}
        keys = list(prof["old"][0])
        print(f"\n{c}, {th} thread(s)\n\n| op kind | old | new |\n| --- | ---: | ---: |")
        for k in keys:
            med = {b: statistics.median(p[k] for p in prof[b]) for b in prof}
            summary[f"{c}.t{th}"].setdefault("profile_ms", {})[k] = {b: 1e3 * med[b] for b in med}
            print(f"| {k} | {1e3 * med['old']:.1f} | {1e3 * med['new']:.1f} |")
print("\n(norm + elementwise) / gemm per run, median over rounds (load-robust)\n")
print("| config | threads | old | new | new/old |\n| --- | ---: | ---: | ---: | ---: |")
for c in ("a_dense", "b_moe"):
    for th in (1, 2):
        q = {b: statistics.median((p["norm"] + p["elementwise"]) / p["gemm"]
                                  for p in (rec(c, th, b, r)["op_profile_s_per_step"] for r in range(1, reps + 1)))
             for b in ("old", "new")}
        summary[f"{c}.t{th}"]["norm_elem_over_gemm"] = q
        print(f"| {c} | {th} | {q['old']:.4f} | {q['new']:.4f} | {q['new'] / q['old']:.3f} |")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
PY
