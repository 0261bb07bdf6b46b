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
unset MT_ERROR_WHERE   # messages are matched exactly: no " [file:line]" suffix (src/core/core.c)
export MT_TEST_FORCE_ROUTING=${MT_TEST_FORCE_ROUTING:-0}
MPIRUN=(timeout "${MPIRUN_TIMEOUT:-120}" mpirun --oversubscribe --allow-run-as-root -x MT_TEST_FORCE_ROUTING)
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "PASS $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; }
finish() { echo "$passes passed, $fails failed"; [ $fails -eq 0 ]; }
fatal() { bad "$1"; finish; exit 1; }   # a failed step the rest depends on

# run NP OUT ARGS... : train on NP ranks (1: no mpirun), output in OUT.log
run() {
    local np=$1 out=$2; shift 2
    if [ "$np" = 1 ]; then "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1
    else "${MPIRUN[@]}" -np "$np" "$MT" train "$@" $COMMON --out "$out" >"$out.log" 2>&1 </dev/null; fi
}

# close REF RUN TOL [SKIP] : RUN equals REF (REF's series from step SKIP on):
# losses, lm/aux/z losses and grad norms per step, and every tensor of the final
# checkpoint, with the bounds of tests/equiv.py (docs/testing.md derives them);
# TOL is the loss bound (1e-6: fp32 re-association noise), TOL 0 demands bit
# equality of everything (the same summation order), TOL bit64 bit-identical
# params with the fp64 loss/norm sums re-associated across ranks (pipeline)
close() {
    if [ "$3" = 0 ]; then python3 "$HERE/equiv.py" "$1" "$2" --skip "${4:-0}" --bit
    elif [ "$3" = bit64 ]; then python3 "$HERE/equiv.py" "$1" "$2" --skip "${4:-0}" --bit --fp64-sums
    else python3 "$HERE/equiv.py" "$1" "$2" --skip "${4:-0}" --tol "$3"; fi
}

# floor REF MB ARGS... : the noise floor of REF's config — the same one-rank
# run (ARGS = REF's) with MB microbatches, where only the association of the
# gradient sums changes and no distributed code runs — must sit within half of
# every equiv.py bound, or the bounds could not tell a bug from this config's
# noise (docs/testing.md, "Tolerances"). The bounds are those of close with
# TOL=${TOL:-1e-6}: a caller whose rows use a wider TOL says so (TOL=2e-6 floor ...)
floor() {
    local ref=$1 mb=$2 half; shift 2
    half=$(awk -v t="${TOL:-1e-6}" 'BEGIN { printf "%g", t / 2 }')
    if run 1 "$ref.floor" "$@" --set microbatches="$mb" && close "$ref" "$ref.floor" "$half"; then
        ok "noise floor of ${ref##*/} (microbatches=$mb, one rank) within half the bounds"
    else bad "noise floor of ${ref##*/} (microbatches=$mb, one rank) within half the bounds"; fi
}

# differs A B : the two runs' losses differ over their common steps (a variant
# under test is active: an equivalence of a no-op proves nothing)
differs() {
    python3 -c "import json,sys; a,b=(json.load(open(f+'/receipt.json'))['losses'] for f in sys.argv[1:]); n=min(len(a),len(b)); \
same=n==0 or a[:n]==b[:n]; print('   SAME losses: the variant did nothing' if same else '   %s differs from %s' % tuple(sys.argv[1:])); sys.exit(same)" "$1" "$2"
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

# hash_ok RUN : RUN's replica check says ok after exactly the number of
# (tensor, rank pair) comparisons its mesh implies (tests/replica_pairs.py), > 0
hash_ok() {
    python3 - "$1" "$(python3 "$HERE/replica_pairs.py" "$1")" <<'PY'
import json, re, sys
h = json.load(open(sys.argv[1] + "/receipt.json"))["replica_hash_check"]; want = int(sys.argv[2])
m = re.fullmatch(r"ok: \d+ tensors bit-identical \(xxh64\) on every rank that holds them \((\d+) rank pairs\)", h)
print("   %s (expected %d pairs)" % (h, want))
assert m and want > 0 and int(m.group(1)) == want
PY
}

# mesh_row NAME CFG SAME NP MESH ZERO [EXTRA...] : CFG trained 20 steps on the mesh equals
# $W/NAME_ref (close at 1e-6, then SAME REF RUN: the suite's own series check), and its replica
# check says ok with the derived pair count — except where the mesh keeps one copy of every
# parameter (ZeRO-3 with SP; pp=2 alone). The suites of the extras share it (test_mtp, test_mod).
mesh_row() {
    local name=$1 cfg=$2 same=$3 np=$4 mesh=$5 zero=$6; shift 6
    local extra="$*" o="$W/${name}_${mesh//[=,]/_}_z$zero"
    o="$o${extra//[^a-z0-9]/_}"
    if run "$np" "$o" $cfg --steps 20 --mesh "$mesh" --zero "$zero" $extra && close "$W/${name}_ref" "$o" 1e-6 &&
       $same "$W/${name}_ref" "$o" &&
       { { [ "$zero" = 3 ] && [[ "$extra" != *sequence_parallel=false* ]]; } || [ "$mesh" = pp=2 ] || hash_ok "$o"; }; then
        ok "$name --mesh $mesh zero=$zero $extra equals the single-rank losses"
    else bad "$name --mesh $mesh zero=$zero $extra"; tail -5 "$o.log"; fi
}

# hash_fault NP MESH ZERO ARGS... : rank 1 moves one element of a replicated
# gain by one ulp after the last of 3 steps (MT_FAULT=1:2:replica): the run
# exits 1 naming that tensor and rank 1 against the slice's first holder, with
# the mesh's count of comparisons, (holders - 1) of them differing
hash_fault() {
    local np=$1 mesh=$2 zero=$3; shift 3
    local o="$W/hfault_${mesh//[=,]/_}"
    rm -rf "$o"
    MT_FAULT=1:2:replica "${MPIRUN[@]}" -x MT_FAULT -np "$np" "$MT" train "$@" $COMMON --out "$o" --steps 3 \
        --mesh "$mesh" --zero "$zero" >"$o.log" 2>&1 </dev/null
    local rc=$?
    if [ $rc -eq 1 ] && python3 - "$o" "$(python3 "$HERE/replica_pairs.py" "$o")" <<'PY'
import json, re, sys
o, want = sys.argv[1], int(sys.argv[2])
log = open(o + ".log").read()
moved = re.search(r"MT_FAULT: rank 1 moved (\S+)\[0\] by one ulp after step 2", log).group(1)
r = json.load(open(o + "/receipt.json")); m = r["mesh"]
holders = m["world"] // m["pp"]          # a gain: every rank of its stage
msg = "MISMATCH: %s differs: ranks 1 vs rank 0 (%d of %d rank pairs compared differ)" % (moved, holders - 1, want)
print("   " + msg)
assert want > 0 and r["replica_hash_check"] == msg, r["replica_hash_check"]
assert re.search(r"meshtrain train: replica hash check failed: " + re.escape(msg), log)
PY
    then ok "replica fault on rank 1 ($mesh, ZeRO-$zero): exit 1 naming the tensor, the ranks and the count"
    else bad "replica fault on rank 1 ($mesh, ZeRO-$zero) rc=$rc"; tail -5 "$o.log"; fi
}

# make_rank_wrapper: writes $W/wrap.sh RANK FROM TO CMD... : on world rank
# RANK every argument FROM becomes TO, then exec CMD (one rank given other
# flags than the rest: test_dist_hangs.sh, test_dist_agree.sh)
make_rank_wrapper() {
    cat >"$W/wrap.sh" <<'SH'
#!/usr/bin/env bash
r=$1 from=$2 to=$3; shift 3
if [ "${OMPI_COMM_WORLD_RANK:-0}" = "$r" ]; then
    args=(); for a in "$@"; do [ "$a" = "$from" ] && a=$to; args+=("$a"); done
    set -- "${args[@]}"
fi
exec "$@"
SH
    chmod +x "$W/wrap.sh"
}
