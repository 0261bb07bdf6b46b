#!/usr/bin/env bash
# Side-by-side CPU benchmark (issues 18, 32): meshtrain (this build and, optionally,
# a base build) against the same model in PyTorch (bench/torch_ref.py, written for
# speed: SDPA, fused AdamW, batched Muon, torch.compile), same config, batch,
# optimizer and thread count, interleaved in ONE run (meshtrain, torch eager,
# torch compiled, then the next rep) so that every side sees the same machine
# load. Repeats REPS times and prints each ratio's min/median/max, then the
# per-op profile (timing.op_profile_s_per_step) of the last run of each config.
# Usage: bench/vs_torch.sh OUTDIR [NEW_BUILD] [BASE_MESHTRAIN|-] [REPS] [STEPS] [CONFIGS]
#   CONFIGS default "a_dense b_moe"; add c_gpt2small for (c) (slow).
#   MODES (env) default "eager compiled": the torch_ref.py modes to time.
#   CHECK=1 (default) first runs `torch_ref.py --check` once per config and mode:
#   3 steps from meshtrain's initial checkpoint on the same batches, loss within
#   2e-5; a peer that disagrees stops the benchmark (a fast-but-wrong peer is no peer).
# Writes OUTDIR/<cfg>.<who>.<rep>.receipt.json, OUTDIR/torch_<mode>.<cfg>.<rep>.json,
# OUTDIR/check.<cfg>.<mode>.json, OUTDIR/load.txt (load average around each run), OUTDIR/summary.json.
#
# PyTorch: TORCHPY=/path/to/python if set; else python3 if its torch is >= 2.5
# (scaled_dot_product_attention(enable_gqa), F.rms_norm, fused CPU AdamW); else a
# venv in ${MT_TORCH_VENV:-~/.cache/meshtrain/torch-venv} made once with
# `pip install torch` from PyPI (TORCH_PIP_ARGS adds pip options, e.g.
# "--index-url https://download.pytorch.org/whl/cpu" for the smaller CPU-only wheel).
# torch.compile needs a C++ compiler (g++) on the machine.
#
# BLAS: meshtrain runs WITHOUT any OPENBLAS_CORETYPE from the caller's
# environment (it picks the kernel set for the CPU itself, as a user gets it; the
# receipt's backend.blas_coretype). PyTorch's pip wheels use MKL (torch_ref's JSON
# says "blas"); a torch linked to OpenBLAS gets the core type meshtrain's receipt
# reports, so both sides run the same sgemm. MT_BENCH_CORETYPE=NAME forces NAME on both.
# PyTorch runs TORCH_STEPS (default max(STEPS, 10)) steps; its first two (and in
# compiled mode its compiling ones) are excluded like meshtrain's warm-up steps.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?outdir}; NEW=${2:-build}/meshtrain; BASE=${3:--}; REPS=${4:-3}; STEPS=${5:-6}
CONFIGS=${6:-a_dense b_moe}; MODES=${MODES:-eager compiled}; CHECK=${CHECK:-1}
THREADS=${OMP_NUM_THREADS:-2}; export OMP_NUM_THREADS=$THREADS
TORCH_STEPS=${TORCH_STEPS:-$(( STEPS > 10 ? STEPS : 10 ))}
torch_ok() { "$1" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 5))' 2>/dev/null; }
if [ -z "${TORCHPY:-}" ]; then
  if torch_ok python3; then TORCHPY=python3
  else
    VENV=${MT_TORCH_VENV:-$HOME/.cache/meshtrain/torch-venv}
    if ! torch_ok "$VENV/bin/python"; then
      echo "installing torch into $VENV (once)"
      python3 -m venv "$VENV"
      # shellcheck disable=SC2086
      "$VENV/bin/pip" install -q ${TORCH_PIP_ARGS:-} "torch>=2.5" numpy
    fi
    TORCHPY=$VENV/bin/python
  fi
fi
torch_ok "$TORCHPY" || { echo "vs_torch.sh: $TORCHPY has no torch >= 2.5" >&2; exit 2; }
echo "torch: $("$TORCHPY" -c 'import torch; print(torch.__version__)') ($TORCHPY); modes: $MODES"
ENV_CORETYPE=${OPENBLAS_CORETYPE:-}
if [ -n "${MT_BENCH_CORETYPE:-}" ]; then export OPENBLAS_CORETYPE=$MT_BENCH_CORETYPE; else unset OPENBLAS_CORETYPE; fi
echo "caller's OPENBLAS_CORETYPE: '${ENV_CORETYPE}'; meshtrain runs with: '${OPENBLAS_CORETYPE:-<its own choice>}'"
mkdir -p "$OUT" bench/out
[ -f bench/out/data8k.bin ]  || python3 tests/make_shard.py bench/out/data8k.bin  400000 8192 random
case "$CONFIGS" in *c_gpt2small*) [ -f bench/out/data50k.bin ] || python3 tests/make_shard.py bench/out/data50k.bin 400000 50304 random;; esac
data_of() { if [ "$1" = c_gpt2small ]; then echo bench/out/data50k.bin; else echo bench/out/data8k.bin; fi; }
load() { echo "$(date -u +%H:%M:%S) $1 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"; }
run_mt() { # who binary cfg rep
  local d; d=$(mktemp -d)
  load "start mt $1 $3 $4"
  "$2" train --config bench/configs/$3.json --data "$(data_of "$3")" --out "$d" --steps "$STEPS" --set warmup_steps=1 --no-save --quiet >/dev/null
  cp "$d/receipt.json" "$OUT/$3.$1.$4.receipt.json"; rm -rf "$d"
}
if [ "$CHECK" = 1 ]; then
  for c in $CONFIGS; do for m in $MODES; do
    echo "== check $c $m"
    "$TORCHPY" bench/torch_ref.py bench/configs/$c.json --check "$NEW" --mode "$m" --data "$(data_of "$c")" > "$OUT/check.$c.$m.json" \
      || { echo "vs_torch.sh: torch_ref.py --mode $m disagrees with meshtrain on $c: $OUT/check.$c.$m.json" >&2; exit 1; }
  done; done
fi
for rep in $(seq 1 "$REPS"); do
  for c in $CONFIGS; do
    echo "== rep $rep $c"
    [ "$BASE" != - ] && run_mt base "$BASE" "$c" "$rep"
    run_mt new "$NEW" "$c" "$rep"
    core=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend"].get("blas_coretype",""))' "$OUT/$c.new.$rep.receipt.json")
    for m in $MODES; do
      load "start torch_$m $c $rep"
      OPENBLAS_CORETYPE=$core "$TORCHPY" bench/torch_ref.py bench/configs/$c.json "$TORCH_STEPS" "$THREADS" --mode "$m" > "$OUT/torch_$m.$c.$rep.json"
    done
    load "end rep $c $rep"
  done
done
python3 - "$OUT" "$REPS" "$CONFIGS" "$MODES" <<'PY'
import json, os, sys
out, reps, configs, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
peers = ["torch_" + m for m in modes]
summ = {}
med = lambda v: v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
for c in configs:
    rows = []
    for r in range(1, reps + 1):
        row, toks = {}, None
        for who in ("base", "new"):
            p = f"{out}/{c}.{who}.{r}.receipt.json"
            if os.path.exists(p):
                rc = json.load(open(p)); tm = rc["timing"]
                toks = rc["batch"]["tokens_per_step"]
                row[who] = tm["tokens_per_s"]; row[who + "_mfu"] = tm["mfu"]
                row[who + "_blas_coretype"] = rc["backend"].get("blas_coretype")
                # the best steady step: least disturbed by the other work on a shared machine
                row[who + "_best"] = toks / min(tm["step_times_s"][tm["warmup_steps_excluded"]:])
        for pe in peers:
            tj = json.load(open(f"{out}/{pe}.{c}.{r}.json"))
            row[pe] = tj["tokens_per_s"]
            row[pe + "_best"] = toks / min(tj["step_times_s"][tj.get("warmup_steps_excluded", 2):])
            row[pe + "_compile_s"] = tj.get("compile_s", 0.0)
            row[pe + "_blas"] = tj.get("blas")
        rows.append(row)
    summ[c] = {"runs": rows}
    print(f"\n{c}: tokens/s per run (ratios within the same run)")
    for i, r in enumerate(rows, 1):
        s = f"  run {i}: new {r['new']:8.0f} (mfu {r['new_mfu']}, blas {r['new_blas_coretype']})"
        for pe in peers:
            s += f"  {pe} {r[pe]:8.0f} (new/{pe} {r['new']/r[pe]:.2f}x)"
        if "base" in r:
            s += f"  base {r['base']:8.0f}  new/base {r['new']/r['base']:.2f}"
        print(s)
    for key, what in (("", "mean of steady steps"), ("_best", "best steady step")):
        for who in ("new", "base"):
            if who + key not in rows[0]:
                continue
            for pe in peers:
                ratios = sorted(r[who + key] / r[pe + key] for r in rows)
                summ[c][f"{who}/{pe}{key}"] = {"min": ratios[0], "median": med(ratios), "max": ratios[-1]}
                print(f"  {who}/{pe} ({what}): min {ratios[0]:.2f}  median {med(ratios):.2f}  max {ratios[-1]:.2f}")
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
json.dump(summ, open(f"{out}/summary.json", "w"), indent=1)
PY
