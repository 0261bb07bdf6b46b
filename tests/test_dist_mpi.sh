#!/usr/bin/env bash
# test_dist_mpi.sh BUILD_DIR — the MPI collectives and mesh groups on 4 ranks.
# Builds tests/mpi/mpi_collectives.c with mpicc straight from the dist and
# core sources (independent of the rest of the library), then runs it under
# mpirun -np 4. Skips (exit 77, a "SKIPPED (reason)" line) without mpirun/mpicc or when the
# build was configured without MPI.
set -u
BUILD=${1:?usage: test_dist_mpi.sh BUILD_DIR}
MPIRUN_TIMEOUT=60
. "$(dirname "$0")/dist_lib.sh"
command -v mpicc >/dev/null 2>&1 || { echo "SKIPPED (mpicc not found)"; exit 77; }
SRC=$(cd "$HERE/.." && pwd)
MPIRUN+=(-np 4)

EXE="$BUILD/mpi_collectives"
if ! mpicc -std=c11 -O1 -g -Wall -Wextra -Wno-unused-parameter -DMT_WITH_MPI=1 -I"$SRC/src" \
    "$SRC/tests/mpi/mpi_collectives.c" "$SRC"/src/parallel/comm*.c "$SRC"/src/parallel/mesh.c "$SRC"/src/parallel/watchdog.c "$SRC/src/core/core.c" "$SRC/src/model/block_traits.c" "$SRC/src/model/piece_rules.c" -o "$EXE"; then
    bad "build mpi_collectives"; finish; exit 1
fi
LOG="$BUILD/test_dist_mpi.log"

"${MPIRUN[@]}" "$EXE" all >"$LOG" 2>&1
rc=$?
cat "$LOG"
if [ $rc -eq 0 ] && [ "$(grep -c '^rank [0-3]: OK all' "$LOG")" -eq 4 ] && ! grep -q 'FAIL' "$LOG"; then
    ok "all: every rank reports OK"
else bad "all: mpirun exited $rc, or a rank did not report OK"; fi
# every rank printed a trace line for every mesh, with groups, reuse and predicates
for spec in dp=2,tp=2 ep=2,tp=2 pp=2,tp=2 tp=4 dp=4; do
    n=$(grep -c "^rank [0-3]: $spec: mesh rank=[0-3] coord(" "$LOG")
    [ "$n" -eq 4 ] && ok "$spec: a trace line per rank" || bad "$spec: $n trace lines (want 4)"
done
grep -q '^rank 3: dp=2,tp=2: mesh rank=3 coord(pipe=0,data=1,expert=0,model=1) .* model{size=2 members=\[2,3\] impl=mpi reused=no} .* data_expert{size=2 members=\[1,3\] impl=mpi reused=data} .* sp_on=1 .*zero_stage=1' "$LOG" \
    && ok "rank 3 trace for dp=2,tp=2" || bad "rank 3 trace for dp=2,tp=2 not as expected"

# a mesh that does not fit the world: every rank gets the error, nobody hangs
"${MPIRUN[@]}" "$EXE" badmesh >"$LOG.bad" 2>&1
rc=$?
cat "$LOG.bad"
[ $rc -ne 124 ] && ok "badmesh ends" || bad "badmesh hung"
[ "$(grep -c 'badmesh parse -> config error: mesh: world=4 is not divisible by pp\*ep\*tp=3' "$LOG.bad")" -eq 4 ] \
    && ok "every rank rejects --mesh tp=3" || bad "not every rank rejected --mesh tp=3"
[ "$(grep -c 'badmesh create -> config error: mesh: pp\*dp\*ep\*tp=3 != world=4' "$LOG.bad")" -eq 4 ] \
    && ok "every rank rejects dims tp=3 in mesh_create" || bad "not every rank rejected dims tp=3 in mesh_create"
[ "$(grep -c '^rank [0-3]: OK badmesh' "$LOG.bad")" -eq 4 ] && ok "badmesh: every rank OK" || bad "badmesh: a rank not OK"
finish
