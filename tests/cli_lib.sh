# cli_lib.sh — shared by the one-rank CLI test scripts (sourced, not run): the
# binary, a scratch dir removed on exit, one OpenMP thread, PASS/FAIL counters.
# Callers set BUILD before sourcing and end with `finish` (or stop early with
# `fatal` where nothing after a failed step can run). (The MPI scripts
# source dist_lib.sh, which sets up the same and the mpirun helpers.)
MT="$BUILD/meshtrain"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
unset MT_ERROR_WHERE   # messages are matched exactly: no " [file:line]" suffix (src/core/core.c)
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "PASS $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; }
finish() { echo "$passes passed, $fails failed"; [ $fails -eq 0 ]; }
fatal() { bad "$1"; finish; exit 1; }   # a failed step the rest depends on
# have_mpi: mpirun is on PATH and BUILD was configured with MPI (a one-rank
# script with an MPI part runs that part only then, else says SKIPPED)
have_mpi() {
    command -v mpirun >/dev/null 2>&1 || return 1
    ! { [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q '^MT_WITH_MPI:BOOL=ON' "$BUILD/CMakeCache.txt"; }
}
