#!/usr/bin/env bash
# extras_1000.sh BUILD_DIR [OUT_DIR] — the zero-divergence receipts of the
# seed's conditional extras (issue 31 item 4; docs/model.md "Conditional extras").
#
# One model with every extra this build has switched on together — null
# experts and ReDo always, MTP (mtp_depth) and Mixture-of-Depths (lowercase
# pattern letters) when `train --help` lists them — trained with the default
# optimizer (Muon for block matrices + AdamW for the rest) for STEPS (1000)
# steps on 4-rank meshes:
#   tp2_dp2_z3   tp=2 x dp=2, ZeRO-3, sequence parallelism off (ZeRO-3 keeps
#                one copy per reduction group: without SP the residual
#                stream's tensors have one owner per model rank, and the
#                replica check compares those; with SP nothing to compare)
#   tp2_dp2_z1   tp=2 x dp=2, ZeRO-1 (SP on, the default)
#   ep2_dp2      ep=2 x dp=2, ZeRO-1 (MoE + null experts)
#   pp2_tp2      pp=2 x tp=2, ZeRO-1
# Demanded of every mesh, and written to OUT_DIR/summary.md:
#   - the replica hash check after every CHECK_EVERY (50) steps and at the end
#     (config replica_check_every): every check "ok" (or "not applicable" where
#     the mesh holds one copy), none a mismatch (a mismatch ends the run);
#   - every loss and loss part finite, all STEPS steps run;
#   - its first 20 steps equal one rank at the suites' tolerance rule
#     (tests/equiv.py at TOL (4e-6): losses TOL relative, parts and grad
#     norms 10 TOL, every parameter after step 20; TOL at least twice the
#     config's one-rank noise floor, checked first): a 20-step run of the mesh with the same
#     schedule (total_steps = STEPS) against one rank, and the long run's
#     first 20 losses bit-identical to that 20-step run;
#   - the extras active: null slots routed, ReDo events with recycled units,
#     MTP losses per depth, MoD selected share (those the build has).
# The receipts (receipt.json of every run, trimmed of nothing) are copied to
# OUT_DIR/<mesh>/receipt.json. Needs mpirun (exit 77 without it).
# About 5-10 minutes on 2 cores at the default size (tiny model).
set -u
BUILD=${1:?usage: extras_1000.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-bench/out/extras_1000}
STEPS=${STEPS:-1000}
CHECK_EVERY=${CHECK_EVERY:-50}
TOL=${TOL:-4e-6}
HERE=$(cd "$(dirname "$0")/.." && pwd)
MT=$(cd "$BUILD" && pwd)/meshtrain
command -v mpirun >/dev/null 2>&1 || { echo "SKIPPED (no mpirun)"; exit 77; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(timeout 1800 mpirun --oversubscribe --allow-run-as-root)
# data: the bytes of this repository's docs as tokens (vocab 256): learnable
# but not memorised within 1000 steps, so the losses keep moving
python3 - "$W/train.bin" "$HERE"/docs/*.md <<'PY'
import struct, sys
toks = b"".join(open(f, "rb").read() for f in sorted(sys.argv[2:]))
header = [0] * 256
header[0], header[1], header[2] = 20240520, 1, len(toks)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % len(toks), *toks))
PY

HELP=$("$MT" train --help 2>&1)
has() { grep -qE "^ +$1 " <<<"$HELP"; }
PATTERN=AEAE
EXTRAS="null_experts redo"
SET="--set n_null_experts=2 --set top_k=2 --set redo_every=10 --set redo_tau=${REDO_TAU:-0.025}"
if has mtp_depth; then SET="$SET --set mtp_depth=2"; EXTRAS="$EXTRAS mtp"; fi   # modules of kind A
# MoD: its keys may exist before the routed kinds do; on only where a lowercase letter is accepted
if has mod_capacity && "$MT" plan --set vocab_size=64 --set n_layer=1 --set d_model=32 --set n_head=4 \
        --set n_kv_head=2 --set seq_len=16 --set batch_size=1 --set pattern=a >/dev/null 2>&1; then
    # capacity 0.25 (8 of 32 tokens): at 0.5 a selection near-tie at step ~17 flips with the
    # microbatch split alone (the one-rank noise floor fails); at 0.25 the floor is 7e-9
    PATTERN=AeaE; SET="$SET --set mod_capacity=0.25"; EXTRAS="$EXTRAS mod"
fi
# SP_SET: extra settings of the tp meshes (the ZeRO-3 row runs SP off either way)
SP_SET=${SP_SET:-}
MODEL="--set vocab_size=256 --set n_layer=4 --set d_model=64 --set n_head=4 --set n_kv_head=2 --set seq_len=32
 --set batch_size=8 --set microbatches=2 --set lr=0.01 --set warmup_steps=20 --set total_steps=$STEPS
 --set pattern=$PATTERN --set n_experts=4 --set expert_hidden=64 --set shared_expert_hidden=32 $SET"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"
echo "extras: $EXTRAS; pattern $PATTERN; $STEPS steps, replica check every $CHECK_EVERY"

# name  mesh  zero
MESHES=("tp2_dp2_z3 tp=2,dp=2 3 --set sequence_parallel=false" "tp2_dp2_z1 tp=2,dp=2 1" "ep2_dp2 ep=2,dp=2 1"
        "pp2_tp2 pp=2,tp=2 1")

run() {   # np out args...
    local np=$1 out=$2; shift 2
    if [ "$np" = 1 ]; then "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1
    else "${MPIRUN[@]}" -np "$np" "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1 </dev/null; fi
}

fails=0
: >"$W/rows"
run 1 "$W/ref20" $MODEL --steps 20 || { echo "FAIL one-rank reference"; tail -5 "$W/ref20.log"; exit 1; }
# the one-rank run of all STEPS: the long runs' mean loss is set next to it
# (meshes are equal at the tolerance early on; later a routing near-tie may
# send two meshes down different but equally good trajectories)
run 1 "$W/ref" $MODEL --steps "$STEPS" || { echo "FAIL one-rank long run"; tail -5 "$W/ref.log"; exit 1; }
mkdir -p "$OUT/one_rank" && cp "$W/ref/receipt.json" "$OUT/one_rank/receipt.json"
# the noise floor (docs/testing.md, "Tolerances"): the same one-rank run with
# 1 and 4 microbatches, where only the association of the gradient sums
# changes, must sit within half the bounds of TOL, or TOL could not tell a bug
# from this config's noise (this model's floor is ~1.7e-6: ReDo events and
# routing amplify re-association, hence TOL 4e-6 rather than the 1e-6 of the
# smaller suite configs)
half=$(awk -v t="$TOL" 'BEGIN { printf "%g", t / 2 }')
floor_ok=1
for mb in 1 4; do
    run 1 "$W/floor$mb" $MODEL --steps 20 --set microbatches=$mb &&
        python3 "$HERE/tests/equiv.py" "$W/ref20" "$W/floor$mb" --tol "$half" >"$OUT/floor_mb$mb.txt" 2>&1 || floor_ok=0
done
[ $floor_ok = 1 ] && echo "PASS noise floor within half of TOL=$TOL" || { echo "FAIL noise floor above half of TOL=$TOL"; cat "$OUT"/floor_mb*.txt; exit 1; }
for row in "${MESHES[@]}"; do
    set -- $row
    name=$1 mesh=$2 zero=$3
    shift 3
    sp="$*"
    case $mesh in *tp=*) sp="$sp $SP_SET" ;; esac
    t0=$(date +%s.%N)
    run 4 "$W/$name" $MODEL $sp --mesh "$mesh" --zero "$zero" --steps "$STEPS" \
        --set replica_check_every="$CHECK_EVERY"
    rc=$?
    t1=$(date +%s.%N)
    run 4 "$W/${name}_20" $MODEL $sp --mesh "$mesh" --zero "$zero" --steps 20
    rc20=$?
    mkdir -p "$OUT/$name"
    cp "$W/$name.log" "$OUT/$name/train.log" 2>/dev/null
    cp "$W/$name/receipt.json" "$OUT/$name/receipt.json" 2>/dev/null
    eq=$(python3 "$HERE/tests/equiv.py" "$W/ref20" "$W/${name}_20" --tol "$TOL" 2>&1); eqrc=$?
    printf '%s\n' "$eq" >"$OUT/$name/equiv_first20.txt"
    if python3 - "$W/$name" "$W/${name}_20" "$W/ref20" "$rc" "$rc20" "$eqrc" "$STEPS" "$CHECK_EVERY" "$zero" \
        "$mesh" "$name" "$W/ref" "$sp" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" "$EXTRAS" >>"$W/rows" <<'PY'
import json, math, sys
run, run20, ref, rc, rc20, eqrc, steps, every, zero, mesh, name, ref_long, sp_args, secs, extras = sys.argv[1:]
steps, every, zero = int(steps), int(every), int(zero)
errs = []
if rc != "0": errs.append("the %d-step run exited %s" % (steps, rc))
if rc20 != "0": errs.append("the 20-step run exited %s" % rc20)
if eqrc != "0": errs.append("first 20 steps differ from one rank (equiv_first20.txt)")
try:
    r = json.load(open(run + "/receipt.json"))
except Exception as e:
    r = None; errs.append("no receipt: %s" % e)
n_ok = n_na = 0; parts = []; finite = False; share = ""
if r:
    if len(r["losses"]) != steps: errs.append("%d steps run" % len(r["losses"]))
    series = {k: v for k, v in r.items() if k == "losses" or (k.endswith("_losses") and isinstance(v, list))}
    parts = sorted(k for k in series if k not in ("losses", "val_losses"))
    bad = [k for k, v in series.items() if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)]
    finite = not bad
    if bad: errs.append("non-finite values in " + ",".join(bad))
    checks = r.get("replica_checks", {}).get("checks", []) + [{"step": steps, "result": r["replica_hash_check"]}]
    want = list(range(every, steps, every)) + [steps]
    if [c["step"] for c in checks] != want: errs.append("replica checks after %s" % [c["step"] for c in checks])
    for c in checks:
        if c["result"].startswith("ok: "): n_ok += 1
        elif c["result"].startswith("not applicable"): n_na += 1; errs.append("replica check after step %d compared nothing" % c["step"])
        else: errs.append("replica check after step %d: %s" % (c["step"], c["result"]))
    # the long run's first 20 steps are the 20-step run's, bit for bit
    r20 = json.load(open(run20 + "/receipt.json"))
    if r["losses"][:20] != r20["losses"]: errs.append("the first 20 losses differ from the 20-step run's")
    # the extras were active, and the ReDo unit lists of the first 20 steps are one rank's
    ex = extras.split()
    def find(o, key):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == key: yield v
                yield from find(v, key)
        elif isinstance(o, list):
            for v in o: yield from find(v, key)
    ev = (r.get("redo") or {}).get("events", [])
    recycled = sum(e.get("recycled", 0) for e in ev)
    if "redo" in ex:
        if not ev or recycled == 0: errs.append("no ReDo unit recycled")
        lists = [[(e["step"], e["units_xxh64"]) for e in (json.load(open(f + "/receipt.json")).get("redo") or {}).get("events", [])]
                 for f in (run20, ref)]
        if not lists[1] or lists[0] != lists[1]: errs.append("ReDo unit lists of steps 1-20 differ from one rank's: %s" % lists)
    nulls = list(find(r, "null_share"))
    if "null_experts" in ex and not (nulls and min(nulls) > 0): errs.append("no slot routed to a null expert")
    if "mtp" in ex and not any(p.startswith("mtp") for p in parts): errs.append("no MTP loss series")
    if "mod" in ex and not any(p.startswith("mod") for p in parts): errs.append("no MoD aux series")
    share = "ReDo %d events, %d units; null share %s; parts %s" % (
        len(ev), recycled, "/".join("%.3f" % x for x in nulls), ",".join(p[:-7] for p in parts))
verdict = "PASS" if not errs else "FAIL"
L = r["lm_losses"] if r else []   # lm: the main model's loss
print("| %s | `%s` ZeRO-%d%s | %s | %s | %d ok%s | %s | %s | %s | %s | %s |" % (
    name, mesh, zero, " SP off" if "sequence_parallel=false" in sp_args else "", len(L), "yes" if finite else "NO", n_ok,
    (", %d not applicable" % n_na) if n_na else "", "equal" if eqrc == "0" else "DIFFERS",
    (" / ".join("%.4f" % L[i] for i in (0, 99, -1)) + " (mean of the last 100: %.4f, one rank %.4f)" % (
        sum(L[-100:]) / 100, sum(json.load(open(ref_long + "/receipt.json"))["lm_losses"][-100:]) / 100)) if len(L) >= 100 else "-",
    share, secs, verdict + ("" if not errs else ": " + "; ".join(errs))))
sys.exit(1 if errs else 0)
PY
    then echo "PASS $name"; else echo "FAIL $name"; fails=$((fails + 1)); tail -3 "$W/$name.log"; fi
done

{
    echo "# The seed's extras together: $STEPS steps on 4-rank meshes"
    echo
    echo "Made by \`bench/extras_1000.sh\` on $(date -u +%Y-%m-%d), build $("$MT" --version 2>/dev/null | head -1)."
    echo "Extras on: $EXTRAS (pattern \`$PATTERN\`); optimizer Muon + AdamW (the default);"
    echo "replica hash check every $CHECK_EVERY steps and at the end; first 20 steps vs one rank at TOL=$TOL"
    echo "(the one-rank noise floor, microbatches 1 and 4 vs 2, within TOL/2: floor_mb1.txt, floor_mb4.txt)."
    echo "Model: \`$(echo $MODEL | tr -s ' ')\`${SP_SET:+ (tp meshes: $SP_SET)}."
    echo
    echo "| mesh | layout | steps | losses finite | replica checks | first 20 steps vs one rank | lm loss step 1 / 100 / last | extras seen | seconds | verdict |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    cat "$W/rows"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
[ $fails -eq 0 ] || { echo "$fails mesh(es) failed"; exit 1; }
