#!/usr/bin/env bash
# test_cuda_gpu.sh BUILD_DIR — the cuda backend on a real GPU: the op harness
# (cuda_ops_vs_cpu: every kernel against the cpu table) and the one-GPU
# device mesh (cuda_mesh_device). Its own ctest so that a machine without a
# GPU shows it as Skipped: test_cuda_build.sh checks the same code under the
# CPU emulator and passes there, and used to run these too, where a missing
# GPU made one of its stages skip while ctest said Passed (issue 32 item 10).
# Without nvcc or without a GPU: "SKIPPED (...)", exit 77. With both: builds
# the two programs in BUILD/cuda-build (test_cuda_build.sh's folder, same
# options) when they are not there, runs them, exit 1 on any failure.
set -u
BUILD=${1:?usage: test_cuda_gpu.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc 2>/dev/null || true)
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then echo "SKIPPED (no nvcc: the cuda programs cannot be built here)"; exit 77; fi
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } && [ ! -e /dev/nvidia0 ]; then
    echo "SKIPPED (no GPU: nvidia-smi lists none and /dev/nvidia0 is absent; test_cuda_build.sh runs the kernels under the emulator)"
    exit 77
fi
CB="$BUILD/cuda-build"
mkdir -p "$CB"
WERROR=OFF
grep -q '^MT_WERROR:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && WERROR=ON
if ! cmake -S "$SRC" -B "$CB" -DMT_WITH_CUDA=ON -DMT_WITH_MPI=OFF -DMT_WERROR=$WERROR \
        -DCMAKE_CUDA_COMPILER="$NVCC" >"$CB/configure.log" 2>&1 ||
   ! cmake --build "$CB" -j2 --target cuda_ops_vs_cpu cuda_mesh_device >"$CB/build.log" 2>&1; then
    grep -E 'error|Error' "$CB/configure.log" "$CB/build.log" | head -40; echo "FAIL: build with MT_WITH_CUDA=ON"; exit 1
fi
fail=0; ran=0
for prog in cuda_ops_vs_cpu cuda_mesh_device; do
    "$CB/$prog" >"$CB/$prog.log" 2>&1
    rc=$?
    if [ $rc -eq 77 ]; then
        echo "SKIPPED ($prog: $(head -1 "$CB/$prog.log"))"
    elif [ $rc -eq 0 ] && grep -q ', 0 failed$' "$CB/$prog.log"; then
        echo "PASS $prog on the GPU: $(tail -1 "$CB/$prog.log")"; ran=$((ran+1))
    else
        grep FAIL "$CB/$prog.log" | head -40; tail -1 "$CB/$prog.log"; echo "FAIL: $prog exited $rc"; fail=1
    fi
done
[ $fail -eq 0 ] || exit 1
[ $ran -gt 0 ] || exit 77
echo "test_cuda_gpu: $ran passed, 0 failed"
