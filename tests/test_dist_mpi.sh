#!/usr/bin/env bash
# test_dist_mpi.sh BUILD_DIR — the MPI collectives and mesh groups on 4 ranks.
# Builds tests/mpi/mpi_collectives.c with mpicc straight from the dist and
# core sources (independent of the rest of the library), then runs it under
# mpirun -np 4. Skips (exit 77, a "SKIPPED (reason)" line) without mpirun/mpicc or when the
# build was configured without MPI.
set -u
BUILD=${1:?usage: test_dist_mpi.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    echo "SKIPPED (mpirun/mpicc not found)"; exit 77
fi
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q '^MT_WITH_MPI:BOOL=ON' "$BUILD/CMakeCache.txt"; then
    echo "SKIPPED ($BUILD was configured with MT_WITH_MPI=OFF)"; exit 77
fi

EXE="$BUILD/mpi_collectives"
mpicc -std=c11 -O1 -g -Wall -Wextra -Wno-unused-parameter -DMT_WITH_MPI=1 -I"$SRC/src" \
    "$SRC/tests/mpi/mpi_collectives.c" "$SRC"/src/parallel/comm*.c "$SRC"/src/parallel/mesh.c "$SRC"/src/parallel/watchdog.c "$SRC/src/core/core.c" "$SRC/src/model/block_traits.c" -o "$EXE" || {
    echo "FAIL: could not build mpi_collectives"; exit 1; }

export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(timeout 60 mpirun --oversubscribe --allow-run-as-root -np 4)
fail=0
LOG="$BUILD/test_dist_mpi.log"

"${MPIRUN[@]}" "$EXE" all >"$LOG" 2>&1
rc=$?
cat "$LOG"
[ $rc -eq 0 ] || { echo "FAIL: mpirun all exited $rc"; fail=1; }
[ "$(grep -c '^rank [0-3]: OK all' "$LOG")" -eq 4 ] || { echo "FAIL: not every rank reported OK"; fail=1; }
grep -q 'FAIL' "$LOG" && fail=1
# every rank printed a trace line for every mesh, with groups, reuse and predicates
for spec in dp=2,tp=2 ep=2,tp=2 pp=2,tp=2 tp=4 dp=4; do
    n=$(grep -c "^rank [0-3]: $spec: mesh rank=[0-3] coord(" "$LOG")
    [ "$n" -eq 4 ] || { echo "FAIL: $n trace lines for $spec (want 4)"; fail=1; }
done
grep -q '^rank 3: dp=2,tp=2: mesh rank=3 coord(pipe=0,data=1,expert=0,model=1) .* model{size=2 members=\[2,3\] impl=mpi reused=no} .* data_expert{size=2 members=\[1,3\] impl=mpi reused=data} .* sp_on=1 .*zero_stage=1' "$LOG" \
    || { echo "FAIL: rank 3 trace for dp=2,tp=2 not as expected"; fail=1; }

# a mesh that does not fit the world: every rank gets the error, nobody hangs
"${MPIRUN[@]}" "$EXE" badmesh >"$LOG.bad" 2>&1
rc=$?
cat "$LOG.bad"
[ $rc -ne 124 ] || { echo "FAIL: badmesh hung"; fail=1; }
[ "$(grep -c 'badmesh parse -> config error: mesh: world=4 is not divisible by pp\*ep\*tp=3' "$LOG.bad")" -eq 4 ] \
    || { echo "FAIL: not every rank rejected --mesh tp=3"; fail=1; }
[ "$(grep -c 'badmesh create -> config error: mesh: pp\*dp\*ep\*tp=3 != world=4' "$LOG.bad")" -eq 4 ] \
    || { echo "FAIL: not every rank rejected dims tp=3 in mesh_create"; fail=1; }
[ "$(grep -c '^rank [0-3]: OK badmesh' "$LOG.bad")" -eq 4 ] || fail=1

if [ $fail -ne 0 ]; then echo "test_dist_mpi: FAILED"; exit 1; fi
echo "test_dist_mpi: ok"
