# dist_lib.sh — shared by the distributed test scripts (sourced, not run):
# skips without MPI, a scratch dir, mpirun with a timeout, PASS/FAIL counters,
# and the helpers every suite uses. Callers set BUILD (and optionally
# MPIRUN_TIMEOUT) before sourcing; they define COMMON before calling run().
MT="$BUILD/meshtrain"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! command -v mpirun >/dev/null 2>&1; then echo "SKIPPED (no mpirun)"; exit 77; fi
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q '^MT_WITH_MPI:BOOL=ON' "$BUILD/CMakeCache.txt"; then
    echo "SKIPPED (built without MPI)"; exit 77
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export MT_TEST_FORCE_ROUTING=${MT_TEST_FORCE_ROUTING:-0}
MPIRUN=(timeout "${MPIRUN_TIMEOUT:-120}" mpirun --oversubscribe --allow-run-as-root -x MT_TEST_FORCE_ROUTING)
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "PASS $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; }
finish() { echo "$passes passed, $fails failed"; [ $fails -eq 0 ]; }

# run NP OUT ARGS... : train on NP ranks (1: no mpirun), output in OUT.log
run() {
    local np=$1 out=$2; shift 2
    if [ "$np" = 1 ]; then "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1
    else "${MPIRUN[@]}" -np "$np" "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1 </dev/null; fi
}

# close REF RUN TOL [SKIP] : RUN's losses equal REF's (from step SKIP on) to TOL
# relative; TOL 0 demands bit equality
close() {
    python3 - "$1/receipt.json" "$2/receipt.json" "$3" "${4:-0}" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["losses"][int(sys.argv[4]):]; b = json.load(open(sys.argv[2]))["losses"]
tol = float(sys.argv[3])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
if tol == 0:
    print("   bit-identical" if a == b else "   NOT bit-identical"); sys.exit(0 if a == b else 1)
w = max(abs(x - y) / abs(x) for x, y in zip(a, b)); print("   max rel diff %.3g over %d steps" % (w, len(a)))
sys.exit(0 if w <= tol else 1)
PY
}

# viol NP MESH REGEX ARGS... : bad input -> exit 2, REGEX on every rank's stderr, nothing written
viol() {
    local np=$1 mesh=$2 expect=$3; shift 3
    rm -rf "$W/bad"
    "${MPIRUN[@]}" -np "$np" "$MT" train "$@" $COMMON --out "$W/bad" --steps 2 --mesh "$mesh" >/dev/null 2>"$W/bad.err" </dev/null
    local rc=$? nl
    nl=$(grep -cE -e "$expect" "$W/bad.err")
    if [ $rc -eq 2 ] && [ "$nl" -eq "$np" ] && [ ! -e "$W/bad" ]; then ok "bad input: $expect (every rank, exit 2)"
    else bad "bad input: $expect (rc=$rc, $nl lines)"; cat "$W/bad.err"; fi
}
