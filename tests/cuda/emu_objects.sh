#!/usr/bin/env bash
# emu_objects.sh BUILD_DIR — the emulated CUDA backend's objects, compiled
# once for both tests that run it on the CPU (test_cuda_build.sh's emulation
# stage and test_cuda_emu_mesh.sh): src/ops/cuda/*.cu and tests/cuda/emu/emu.cc
# as C++ against tests/cuda/emu, into BUILD_DIR/cuda-emu-obj/NAME.o (NAME the
# source's file name: ops_cuda.cu.o, emu.cc.o). Run by each of the two tests
# before its own build; under an exclusive lock, so that two tests run side
# by side (ctest -j2) do not compile into the same folder at once.
#
# Incremental: an object is rebuilt when its source is newer; every object
# when a header, the flags or the compiler changed (a hash of them is kept in
# cuda-emu-obj/stamp). The flags are those of the two tests' former own
# builds, less MT_WITH_MPI / MT_WITH_NCCL and MPI's include path, which the
# emulated NCCL build added: nothing under src/ops/cuda or tests/cuda/emu
# (but the emulated NCCL, nccl_emu.cc, which test_cuda_emu_mesh.sh compiles
# itself) reads them, and this script fails if that changes.
#
# Prints the folder on success; exit 1 (compiler errors on stderr) on failure.
# The caller has checked for g++ on x86-64. MT_WERROR as in BUILD_DIR.
set -u
BUILD=${1:?usage: emu_objects.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
OBJ="$BUILD/cuda-emu-obj"
mkdir -p "$OBJ"
WERROR=OFF
grep -q '^MT_WERROR:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && WERROR=ON
# The kernels run with UBSan's alignment and array-bounds checks (every
# emulated run, no second build): a typed access through a misaligned pointer
# (a float4 or a 4-byte bf16 pair store at an odd offset) is a "misaligned
# address" fault on a GPU, but x86 takes most of them silently. Whoever links
# these objects adds the same flag: the file ldflags next to them holds it.
EMU_SAN="-fsanitize=alignment,bounds -fno-sanitize-recover=all"
CXXF="-std=c++20 -O2 -DMT_CUDA_EMU -DMT_WITH_CUDA=1 -I$SRC/tests/cuda/emu -I$SRC/src -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas $EMU_SAN"
[ "$WERROR" = ON ] && CXXF="$CXXF -Werror"
# The kernels' sources also carry GCC's memory-access instrumentation (the
# ThreadSanitizer's calls, not its runtime: emu.cc defines them), so that the
# emulator sees every plain shared-memory load and store for its bank-conflict
# count (MT_EMU_BANKS); emu.cc itself is not instrumented (it defines the hooks)
EMU_ACCESS="-fsanitize=thread --param tsan-instrument-func-entry-exit=0 -fno-tree-sra -fno-tree-vectorize -g1"
SOURCES=$(ls "$SRC"/src/ops/cuda/*.cu "$SRC/tests/cuda/emu/emu.cc")

exec 9>"$OBJ/lock"
command -v flock >/dev/null && flock 9   # util-linux; without it, no lock (ctest -j1 runs one test at a time)

HEADERS=$(ls "$SRC"/src/*/*.h "$SRC"/src/ops/*/*.h "$SRC"/src/ops/cuda/*.cuh "$SRC"/tools/*.h \
             "$SRC"/tests/cuda/emu/*.h 2>/dev/null)
STAMP=$( (echo "$CXXF $EMU_ACCESS"; g++ --version | head -1; cat $HEADERS) | sha1sum | cut -d' ' -f1)
if [ "$(cat "$OBJ/stamp" 2>/dev/null)" != "$STAMP" ]; then
    rm -f "$OBJ/stamp" "$OBJ"/*.o "$OBJ"/*.o.d
fi
# objects of sources that no longer exist
for o in "$OBJ"/*.o; do
    [ -e "$o" ] || continue
    echo "$SOURCES" | grep -q "/$(basename "$o" .o)\$" || rm -f "$o" "$o.d"
done
export CXXF EMU_ACCESS
compile() {  # one source -> one object, unless the object is newer
    [ -f "$2" ] && [ "$2" -nt "$1" ] && return 0
    rm -f "$2"
    local access=$EMU_ACCESS
    case "$1" in *.cc) access= ;; esac
    g++ $CXXF $access -MMD -MF "$2.d" -x c++ -c "$1" -o "$2.tmp" && mv "$2.tmp" "$2" && echo "built $2"
}
export -f compile
for f in $SOURCES; do echo "$f $OBJ/$(basename "$f").o"; done |
    xargs -P2 -n2 bash -c 'compile "$0" "$1"' >"$OBJ/compile.log" 2>&1
if [ $? -ne 0 ]; then
    grep -v '^built ' "$OBJ/compile.log" | head -40 >&2
    echo "emu_objects.sh: emulated build of src/ops/cuda failed" >&2
    exit 1
fi
# one build serves the single-rank and the MPI + NCCL meshtrain: sound only
# while no file these objects were compiled from (the compiler's dependency
# lists, NAME.o.d) reads MT_WITH_MPI or MT_WITH_NCCL
used=$(cat "$OBJ"/*.o.d | sed 's/\\$//' | tr ' ' '\n' | grep -v -e ':$' -e '^$' | sort -u)
if grep -l -E '\bMT_WITH_(MPI|NCCL)\b' $used >&2; then
    echo "emu_objects.sh: the files above read MT_WITH_MPI or MT_WITH_NCCL: the emulated objects can no longer be" \
         "shared by the single-rank and the NCCL builds (compile them per build)" >&2
    exit 1
fi
# a function-local static of a template with external linkage lands in a section of
# its own (.bss._ZZ...), not in the one __shared__ names (cuda_runtime.h): a
# __shared__ array of a non-static template kernel would escape the emulator's NaN
# fill at each launch and its bank count, silently. The kernels here are static.
for o in "$OBJ"/*.cu.o; do
    if readelf -SW "$o" 2>/dev/null | grep -qE '\.(bss|data)\._ZZ'; then
        echo "emu_objects.sh: $(basename "$o"): a function-local static of a non-static template (.bss._ZZ...):" \
             "a __shared__ array there is outside the emulator's shared section; make the kernel static" >&2
        exit 1
    fi
done
echo "$EMU_SAN" >"$OBJ/ldflags"
echo "$EMU_ACCESS" >"$OBJ/accessflags"   # for a test's own kernels (test_cuda_build.sh's emulator self-tests)
echo "$STAMP" >"$OBJ/stamp"
echo "$OBJ"
