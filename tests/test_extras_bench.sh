#!/usr/bin/env bash
# test_extras_bench.sh BUILD_DIR — bench/extras_1000.sh (issue 31 item 4, the
# zero-divergence receipts) kept runnable: the same script at 100 steps (redo_tau 0.1, so units recycle early) with a
# replica check every 25 (~25 s on 2 cores). Every mesh row must PASS: the
# one-rank noise floor within half the tolerance, all steps finite, the
# periodic replica checks "ok" (ZeRO-3: "not applicable"), the first 20 steps
# equal to one rank, the extras active (null slots, ReDo units, MTP and MoD
# series where the build has them). The 1000-step receipts themselves are in
# bench/results/ (docs/model.md, "Conditional extras").
# Skips (exit 77, SKIPPED) without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_extras_bench.sh BUILD_DIR}
source "$(dirname "$0")/dist_lib.sh"
STEPS=100 CHECK_EVERY=25 REDO_TAU=0.1 bash "$HERE/../bench/extras_1000.sh" "$BUILD" "$W/out" >"$W/bench.log" 2>&1
rc=$?
n=$(grep -c '| PASS |$' "$W/out/summary.md" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$n" = 4 ] && grep -q "^PASS noise floor" "$W/bench.log"; then
    ok "extras_1000.sh at 100 steps: 4 meshes PASS (replica checks every 25, first 20 steps = one rank)"
else bad "extras_1000.sh at 100 steps (rc=$rc, $n rows PASS)"; grep -E "PASS|FAIL" "$W/bench.log" | head -12; fi
finish
