#!/usr/bin/env bash
# Side-by-side CPU benchmark (issue 18): meshtrain (this build and, optionally, a
# base build) against the SPEC.md model in plain PyTorch (bench/torch_ref.py),
# same config, batch, optimizer and thread count, interleaved in ONE run so that
# the ratios see the same machine load. Repeats REPS times and prints each
# ratio's spread, then the per-op profile (timing.op_profile_s_per_step) of the
# last run of each config.
# Usage: bench/vs_torch.sh OUTDIR [NEW_BUILD] [BASE_MESHTRAIN|-] [REPS] [STEPS] [CONFIGS]
#   CONFIGS default "a_dense b_moe"; add c_gpt2small for (c) (slow).
# Writes OUTDIR/<cfg>.<who>.<rep>.receipt.json, OUTDIR/torch.<cfg>.<rep>.json, OUTDIR/summary.json.
#
# BLAS kernels, fair to both sides: meshtrain runs WITHOUT any OPENBLAS_CORETYPE
# from the caller's environment (it picks the kernel set for the CPU itself, as a
# user gets it: SkylakeX on AVX-512 CPUs; the receipt's backend.blas_coretype),
# and PyTorch (same libopenblas) then runs with OPENBLAS_CORETYPE set to the core
# type meshtrain's receipt reports, so both sides get the same sgemm. Set
# MT_BENCH_CORETYPE=NAME to force NAME on both sides instead.
# PyTorch warms up slower than meshtrain (its allocator returns big blocks to
# the OS for the first steps), so it runs TORCH_STEPS (default max(STEPS, 10))
# steps and its first two are excluded like meshtrain's. With TORCH_TUNED=1 each
# rep also runs PyTorch with glibc told to keep freed memory (MALLOC_MMAP_/
# TRIM_THRESHOLD_, what meshtrain does for itself with mallopt), reported as
# "torch_tuned": PyTorch at its best on this machine, not as a user gets it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?outdir}; NEW=${2:-build}/meshtrain; BASE=${3:--}; REPS=${4:-3}; STEPS=${5:-6}
CONFIGS=${6:-a_dense b_moe}
THREADS=${OMP_NUM_THREADS:-2}; export OMP_NUM_THREADS=$THREADS
TORCHPY=${TORCHPY:-/usr/bin/python3}
TORCH_STEPS=${TORCH_STEPS:-$(( STEPS > 10 ? STEPS : 10 ))}
ENV_CORETYPE=${OPENBLAS_CORETYPE:-}
if [ -n "${MT_BENCH_CORETYPE:-}" ]; then export OPENBLAS_CORETYPE=$MT_BENCH_CORETYPE; else unset OPENBLAS_CORETYPE; fi
echo "caller's OPENBLAS_CORETYPE: '${ENV_CORETYPE}'; meshtrain runs with: '${OPENBLAS_CORETYPE:-<its own choice>}'"
mkdir -p "$OUT" bench/out
[ -f bench/out/data8k.bin ]  || python3 tests/make_shard.py bench/out/data8k.bin  400000 8192 random
case "$CONFIGS" in *c_gpt2small*) [ -f bench/out/data50k.bin ] || python3 tests/make_shard.py bench/out/data50k.bin 400000 50304 random;; esac
run_mt() { # who binary cfg rep
  local data=bench/out/data8k.bin; [ "$3" = c_gpt2small ] && data=bench/out/data50k.bin
  local d; d=$(mktemp -d)
  "$2" train --config bench/configs/$3.json --data "$data" --out "$d" --steps "$STEPS" --set warmup_steps=1 --quiet >/dev/null
  cp "$d/receipt.json" "$OUT/$3.$1.$4.receipt.json"; rm -rf "$d"
}
for rep in $(seq 1 "$REPS"); do
  for c in $CONFIGS; do
    echo "== rep $rep $c"
    [ "$BASE" != - ] && run_mt base "$BASE" "$c" "$rep"
    run_mt new "$NEW" "$c" "$rep"
    core=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend"].get("blas_coretype",""))' "$OUT/$c.new.$rep.receipt.json")
    OPENBLAS_CORETYPE=$core "$TORCHPY" bench/torch_ref.py bench/configs/$c.json "$TORCH_STEPS" "$THREADS" > "$OUT/torch.$c.$rep.json"
    if [ "${TORCH_TUNED:-0}" = 1 ]; then
      OPENBLAS_CORETYPE=$core MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=1073741824 \
        "$TORCHPY" bench/torch_ref.py bench/configs/$c.json "$TORCH_STEPS" "$THREADS" > "$OUT/torch_tuned.$c.$rep.json"
    fi
  done
done
python3 - "$OUT" "$REPS" "$CONFIGS" <<'PY'
import json, os, sys
out, reps, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
summ = {}
for c in configs:
    rows = []
    for r in range(1, reps + 1):
        tj = json.load(open(f"{out}/torch.{c}.{r}.json"))
        toks = None
        row = {"torch": tj["tokens_per_s"], "torch_openblas_coretype": tj.get("openblas_coretype")}
        for who in ("base", "new"):
            p = f"{out}/{c}.{who}.{r}.receipt.json"
            if os.path.exists(p):
                rc = json.load(open(p)); tm = rc["timing"]
                toks = rc["batch"]["tokens_per_step"]
                row[who] = tm["tokens_per_s"]; row[who + "_mfu"] = tm["mfu"]
                row[who + "_roof"] = tm["peak_flops"]
                row[who + "_blas_coretype"] = rc["backend"].get("blas_coretype")
                # the best steady step: least disturbed by the other work on a shared machine
                row[who + "_best"] = toks / min(tm["step_times_s"][tm["warmup_steps_excluded"]:])
        row["torch_best"] = toks / min(tj["step_times_s"][2:])
        if os.path.exists(f"{out}/torch_tuned.{c}.{r}.json"):
            tt = json.load(open(f"{out}/torch_tuned.{c}.{r}.json"))
            row["torch_tuned"] = tt["tokens_per_s"]; row["torch_tuned_best"] = toks / min(tt["step_times_s"][2:])
        rows.append(row)
    summ[c] = rows
    print(f"\n{c}: tokens/s per run (ratios within the same run)")
    for i, r in enumerate(rows, 1):
        s = f"  run {i} [blas {r['new_blas_coretype']} / torch {r['torch_openblas_coretype']}]: torch {r['torch']:8.0f}  new {r['new']:8.0f} ({r['new']/r['torch']:.2f}x torch, mfu {r['new_mfu']:.2f})"
        if "base" in r:
            s += f"  base {r['base']:8.0f} ({r['base']/r['torch']:.2f}x torch)  new/base {r['new']/r['base']:.2f}"
        if "torch_tuned" in r:
            s += f"  torch_tuned {r['torch_tuned']:8.0f} ({r['new']/r['torch_tuned']:.2f}x)"
        print(s)
    for key, what in (("", "mean of steady steps"), ("_best", "best steady step")):
        for who in ("new", "base"):
            if who + key not in rows[0]:
                continue
            for peer in ("torch", "torch_tuned"):
                if peer + key not in rows[0]:
                    continue
                ratios = sorted(r[who + key] / r[peer + key] for r in rows)
                print(f"  {who}/{peer} ({what}): min {ratios[0]:.2f}  median {ratios[len(ratios)//2]:.2f}  max {ratios[-1]:.2f}")
        if "base" + key in rows[0]:
            ratios = sorted(r["new" + key] / r["base" + key] for r in rows)
            print(f"  new/base ({what}): min {ratios[0]:.2f}  median {ratios[len(ratios)//2]:.2f}  max {ratios[-1]:.2f}")
    rc = json.load(open(f"{out}/{c}.new.{reps}.receipt.json"))
    prof = rc["timing"].get("op_profile_s_per_step")
    if prof:
        step = prof["step"]
        print(f"  op profile (run {reps}, s per steady step; kernels_isa {rc['backend'].get('kernels_isa')}):")
        print("  | op kind | ms/step | share |\n  | --- | ---: | ---: |")
        for k, v in prof.items():
            if k != "step":
                print(f"  | {k} | {1e3*v:.1f} | {100*v/step:.1f}% |")
        print(f"  | step | {1e3*step:.1f} | 100% |")
    sp = rc["timing"].get("peak_flops_spread")
    if sp:
        print(f"  roof {rc['timing']['peak_flops']/1e9:.1f} GFLOP/s (spread {sp['min']/1e9:.1f}..{sp['max']/1e9:.1f})")
json.dump(summ, open(f"{out}/summary.json", "w"), indent=1)
PY
