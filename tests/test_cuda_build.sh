#!/usr/bin/env bash
# test_cuda_build.sh BUILD_DIR — the CUDA backend builds, links and passes its
# op harness; where there is no GPU its kernels run under the CPU emulator.
#
#   1. configure BUILD_DIR/cuda-build with -DMT_WITH_CUDA=ON -DMT_WITH_MPI=OFF
#      (MT_WERROR as in BUILD_DIR) and build `meshtrain` and `cuda_ops_vs_cpu`
#      and the tests cuda_ops_vs_cpu and cuda_mesh_device (nvcc, sm_90 only);
#   2. run cuda_ops_vs_cpu (every cuda op against the cpu table to 1e-5, gemm
#      in bf16 to the derived bound) and cuda_mesh_device; each prints
#      "SKIP: no GPU" and exits 0 where no device is present;
#   3. emulation (needs g++ on x86-64): compile src/ops/cuda/*.cu as C++
#      against tests/cuda/emu (fibers for threads, exact __syncthreads and
#      warp shuffles, naive cuBLAS sgemm and cuBLASLt bf16 matmul) and run,
#      on the CPU,
#        a. cuda_ops_vs_cpu (fp32 ops to 1e-5, then gemm in bf16 mode to the
#           derived bound), and again for gemm only with
#           MT_CUDA_PRECISION=bf16 (precision chosen at creation) and
#           MT_CUDA_BF16_SCRATCH_MB=1 (operand copies tiled), with the
#           emulator's cuBLASLt finding no algorithm (MT_EMU_LT_NO_ALGO=1:
#           the counted sgemm fallback), and with a bad MT_CUDA_PRECISION
#           (refused with the reason, exit 1);
#        b. tests/test_ops.c -b cuda (the project harness: fp64 references,
#           = vs +=, in-place, determinism, accounting; fp32 mode),
#        c. 3 steps of `meshtrain train` on a tiny dense config with
#           backend=cpu and backend=cuda: losses equal to 1e-5 relative in
#           fp32 mode, to 1e-3 relative with MT_CUDA_PRECISION=bf16 (an
#           empirical bound, docs/cuda.md), `--backend cuda` = `--set
#           backend=cuda`;
#        d. tests/cuda/mesh_device.c: a one-rank mesh with device
#           communicators (mt_mesh_create_nccl: every group one self_dev
#           comm copying through the backend's copy) runs every collective
#           on emulated device memory; the host mesh is unchanged; and the
#           HOST self comm used on device buffers is caught by the
#           emulator's device-memory guard (a crash on a GPU).
#      Every emulated run has the device-memory guard on: device buffers
#      are inaccessible to host code outside kernels, copies and cuBLAS
#      calls (tests/cuda/emu/emu.cc), so a host dereference of a device
#      pointer fails here as it would on a GPU.
# Prints SKIP and exits 0 when nvcc is absent. Exit 1 on any failure.
set -u
BUILD=${1:?usage: test_cuda_build.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)

NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc 2>/dev/null || true)
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then echo "SKIP: nvcc not found"; exit 0; fi

CB="$BUILD/cuda-build"
mkdir -p "$CB"
WERROR=OFF
grep -q '^MT_WERROR:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && WERROR=ON
fail=0
t0=$(date +%s)

# ---- 1. build with CUDA ----
if ! cmake -S "$SRC" -B "$CB" -DMT_WITH_CUDA=ON -DMT_WITH_MPI=OFF -DMT_WERROR=$WERROR \
        -DCMAKE_CUDA_COMPILER="$NVCC" >"$CB/configure.log" 2>&1; then
    tail -30 "$CB/configure.log"; echo "FAIL: configure with MT_WITH_CUDA=ON"; exit 1
fi
if ! cmake --build "$CB" -j2 --target meshtrain cuda_ops_vs_cpu cuda_mesh_device >"$CB/build.log" 2>&1; then
    grep -E 'error|Error' "$CB/build.log" | head -40; echo "FAIL: build with MT_WITH_CUDA=ON"; exit 1
fi
echo "PASS build: meshtrain, cuda_ops_vs_cpu and cuda_mesh_device with MT_WITH_CUDA=ON (MT_WERROR=$WERROR) in $(( $(date +%s) - t0 ))s"

# ---- 2. the harness on the real backend ----
"$CB/cuda_ops_vs_cpu" >"$CB/cuda_ops_vs_cpu.log" 2>&1
rc=$?
if grep -q '^SKIP' "$CB/cuda_ops_vs_cpu.log"; then
    [ $rc -eq 0 ] && echo "PASS cuda_ops_vs_cpu: $(head -1 "$CB/cuda_ops_vs_cpu.log")" ||
        { echo "FAIL: cuda_ops_vs_cpu skipped with exit $rc"; fail=1; }
elif [ $rc -eq 0 ]; then
    echo "PASS cuda_ops_vs_cpu on the GPU: $(tail -1 "$CB/cuda_ops_vs_cpu.log")"
else
    grep FAIL "$CB/cuda_ops_vs_cpu.log" | head -40; tail -1 "$CB/cuda_ops_vs_cpu.log"
    echo "FAIL: cuda_ops_vs_cpu exited $rc"; fail=1
fi

"$CB/cuda_mesh_device" >"$CB/cuda_mesh_device.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    echo "PASS cuda_mesh_device: $(tail -1 "$CB/cuda_mesh_device.log")"
else
    grep FAIL "$CB/cuda_mesh_device.log" | head -20; echo "FAIL: cuda_mesh_device exited $rc"; fail=1
fi

# ---- 3. emulation ----
if ! command -v g++ >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
    echo "SKIP emulation: needs gcc/g++ on x86-64"
    exit $fail
fi
EMU="$CB/emu"
rm -rf "$EMU"; mkdir -p "$EMU/cu" "$EMU/ref" "$EMU/lib"
CBLAS_INC=$(sed -n 's/^CBLAS_INCLUDE:PATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ -n "$CBLAS_INC" ] || CBLAS_INC=/usr/include/x86_64-linux-gnu
CXXF="-std=c++20 -O2 -DMT_CUDA_EMU -DMT_WITH_CUDA=1 -I$SRC/tests/cuda/emu -I$SRC/src -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas"
CF="-std=c11 -O2 -march=x86-64-v3 -fopenmp -DMT_WITH_CUDA=1 -I$SRC/src -I$CBLAS_INC"
[ "$WERROR" = ON ] && CXXF="$CXXF -Werror"
export CXXF CF SRC EMU
compile() {  # one source -> one object, named after its path
    local f=$1 out=$2
    case "$f" in
        *.cu|*.cc) g++ $CXXF -x c++ -c "$f" -o "$out" ;;
        *)         gcc $CF -w -c "$f" -o "$out" ;;
    esac
}
export -f compile
t1=$(date +%s)
{
    for f in "$SRC"/src/ops/cuda/*.cu "$SRC/tests/cuda/emu/emu.cc"; do echo "$f $EMU/cu/$(basename "$f").o"; done
    for f in "$SRC"/src/ops/cpu/*.c "$SRC/src/core/core.c"; do echo "$f $EMU/ref/$(basename "$f").o"; done
    echo "$SRC/tests/cuda/cuda_ops_vs_cpu.c $EMU/cuda_ops_vs_cpu.o"
    echo "$SRC/tests/test_ops.c $EMU/test_ops.o"
} | xargs -P2 -n2 bash -c 'compile "$0" "$1"' >"$EMU/compile.log" 2>&1
if [ $? -ne 0 ]; then
    head -40 "$EMU/compile.log"; echo "FAIL: emulated build of src/ops/cuda"; exit 1
fi
LIBS="-lopenblas -lm"
if ! g++ -fopenmp "$EMU"/cu/*.o "$EMU"/ref/*.o "$EMU/cuda_ops_vs_cpu.o" $LIBS -o "$EMU/cuda_ops_vs_cpu" ||
   ! g++ -fopenmp "$EMU"/cu/*.o "$EMU"/ref/*.o "$EMU/test_ops.o" $LIBS -o "$EMU/test_ops"; then
    echo "FAIL: emulated link"; exit 1
fi
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1

unset MT_CUDA_PRECISION MT_CUDA_BF16_SCRATCH_MB

# a. the cuda-vs-cpu harness (fp32, then gemm in bf16); bf16 from the
#    environment with tiled operand copies; a bad precision value
"$EMU/cuda_ops_vs_cpu" >"$EMU/cuda_ops_vs_cpu.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q ', 0 failed$' "$EMU/cuda_ops_vs_cpu.log"; then
    echo "PASS emulated cuda_ops_vs_cpu: $(tail -1 "$EMU/cuda_ops_vs_cpu.log")"
else
    grep -E 'FAIL|emu' "$EMU/cuda_ops_vs_cpu.log" | head -40; tail -2 "$EMU/cuda_ops_vs_cpu.log"
    echo "FAIL: emulated cuda_ops_vs_cpu exited $rc"; fail=1
fi
MT_CUDA_PRECISION=bf16 MT_CUDA_BF16_SCRATCH_MB=1 "$EMU/cuda_ops_vs_cpu" -o gemm >"$EMU/cuda_ops_vs_cpu_bf16.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q ', 0 failed$' "$EMU/cuda_ops_vs_cpu_bf16.log" &&
   grep -q '^cuda precision at creation: bf16 (MT_CUDA_PRECISION), bf16 operand scratch cap 1 MiB' "$EMU/cuda_ops_vs_cpu_bf16.log"; then
    echo "PASS emulated cuda_ops_vs_cpu -o gemm, MT_CUDA_PRECISION=bf16 MT_CUDA_BF16_SCRATCH_MB=1 (tiled): $(tail -1 "$EMU/cuda_ops_vs_cpu_bf16.log")"
else
    grep -E 'FAIL|emu|precision' "$EMU/cuda_ops_vs_cpu_bf16.log" | head -40; tail -2 "$EMU/cuda_ops_vs_cpu_bf16.log"
    echo "FAIL: emulated cuda_ops_vs_cpu with MT_CUDA_PRECISION=bf16 exited $rc"; fail=1
fi
# no cuBLASLt algorithm (emulator hook): every tile falls back to sgemm, counted;
# the only failing checks are then the "bf16 ran" ones
MT_EMU_LT_NO_ALGO=1 "$EMU/cuda_ops_vs_cpu" -o gemm >"$EMU/cuda_ops_vs_cpu_noalgo.log" 2>&1
if ! grep FAIL "$EMU/cuda_ops_vs_cpu_noalgo.log" | grep -qv '(bf16 ran)' &&
   grep -q '^cuda bf16: 0 cuBLASLt matmuls, [1-9][0-9]* sgemm fallbacks' "$EMU/cuda_ops_vs_cpu_noalgo.log"; then
    echo "PASS no cuBLASLt algorithm: $(grep '^cuda bf16:' "$EMU/cuda_ops_vs_cpu_noalgo.log") (fp32 results, within the bound)"
else
    grep -E 'FAIL|^cuda bf16' "$EMU/cuda_ops_vs_cpu_noalgo.log" | head; echo "FAIL: cuBLASLt fallback"; fail=1
fi
out=$(MT_CUDA_PRECISION=half "$EMU/cuda_ops_vs_cpu" -o gemm 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$out" = "FAIL: MT_CUDA_PRECISION=half: expected fp32 or bf16" ]; then
    echo "PASS MT_CUDA_PRECISION=half refused: $out"
else
    echo "$out" | tail -3; echo "FAIL: MT_CUDA_PRECISION=half: exit $rc"; fail=1
fi

# b. the project's op harness on the cuda backend
"$EMU/test_ops" -b cuda >"$EMU/test_ops.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q '^cuda ' "$EMU/test_ops.log"; then
    echo "PASS emulated test_ops -b cuda: $(tail -1 "$EMU/test_ops.log")"
else
    grep -E 'FAIL|emu|not available' "$EMU/test_ops.log" | head -40; tail -2 "$EMU/test_ops.log"
    echo "FAIL: emulated test_ops -b cuda exited $rc"; fail=1
fi

# c. tiny training run, cpu vs emulated cuda
ls "$SRC"/src/*/*.c "$SRC"/src/ops/cpu/*.c "$SRC"/tools/*.c | grep -v -e '/comm_nccl\.c$' |
    while read -r f; do echo "$f $EMU/lib/$(echo "${f#$SRC/}" | tr / _).o"; done |
    xargs -P2 -n2 bash -c 'compile "$0" "$1"' >"$EMU/compile_lib.log" 2>&1
if [ $? -ne 0 ] || ! g++ -fopenmp "$EMU"/lib/*.o "$EMU"/cu/*.o -lopenblas -lcjson -lxxhash -lm \
        -o "$EMU/meshtrain" >>"$EMU/compile_lib.log" 2>&1; then
    head -30 "$EMU/compile_lib.log"; echo "FAIL: emulated meshtrain build"; fail=1
else
    python3 "$SRC/tests/make_shard.py" "$EMU/train.bin" 4000 64 pattern >/dev/null
    TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2"
    ok=1
    # run NAME PRECISION BACKEND-FLAGS...
    run() {
        local name=$1 prec=$2; shift 2
        if ! env MT_CUDA_PRECISION=$prec OMP_NUM_THREADS=1 "$EMU/meshtrain" train $TINY "$@" --peak-flops 1e11 --quiet \
                --data "$EMU/train.bin" --out "$EMU/run_$name" --steps 3 >"$EMU/train_$name.log" 2>&1; then
            tail -5 "$EMU/train_$name.log"; ok=0
        fi
    }
    # the two emulated runs side by side (one thread each: 2 cores)
    run cpu fp32 --set backend=cpu
    run cuda fp32 --set backend=cuda & pid_fp32=$!
    run cuda_bf16 bf16 --backend cuda
    wait $pid_fp32
    [ -f "$EMU/run_cuda/receipt.json" ] || ok=0
    cmp_losses() {  # cmp_losses REF RUN TOL
        python3 - "$EMU/run_$1/receipt.json" "$EMU/run_$2/receipt.json" "$3" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
tol = float(sys.argv[3])
assert b["backend"]["actual"] == "cuda", b["backend"]
la, lb = a["losses"], b["losses"]
assert len(la) == len(lb) == 3, (la, lb)
err = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
print("losses cpu %s cuda %s max rel diff %.2e (tol %g)" % (la, lb, err, tol))
assert err <= tol, err
PY
    }
    if [ $ok -eq 1 ] && cmp_losses cpu cuda 1e-5; then echo "PASS emulated train: 3 steps, backend=cuda losses equal backend=cpu to 1e-5"
    else echo "FAIL: emulated train cpu vs cuda"; fail=1; fi
    if [ $ok -eq 1 ] && cmp_losses cpu cuda_bf16 1e-3 && ! cmp_losses cpu cuda_bf16 1e-6 >/dev/null 2>&1; then
        echo "PASS emulated train: 3 steps, --backend cuda with MT_CUDA_PRECISION=bf16 within 1e-3 of cpu (and not fp32-equal)"
    else echo "FAIL: emulated train cpu vs cuda bf16"; fail=1; fi
fi

# d. device communicators of a one-rank mesh, on emulated device memory
if [ -f "$EMU/lib/src_dist_mesh.c.o" ] && compile "$SRC/tests/cuda/mesh_device.c" "$EMU/mesh_device.o" >"$EMU/mesh_device.log" 2>&1 &&
   g++ -fopenmp "$EMU/mesh_device.o" "$EMU"/lib/src_*.o "$EMU"/cu/*.o -lopenblas -lcjson -lxxhash -lm \
       -o "$EMU/mesh_device" >>"$EMU/mesh_device.log" 2>&1; then
    if "$EMU/mesh_device" >>"$EMU/mesh_device.log" 2>&1 && grep -q ', 0 failed$' "$EMU/mesh_device.log"; then
        echo "PASS emulated mesh_device: $(tail -1 "$EMU/mesh_device.log")"
    else
        grep -E 'FAIL|emu' "$EMU/mesh_device.log" | head -20; echo "FAIL: emulated mesh_device"; fail=1
    fi
    out=$("$EMU/mesh_device" --host-comm 2>&1); rc=$?
    if [ $rc -ne 0 ] && echo "$out" | grep -q '^cuda emu: host access to DEVICE memory'; then
        echo "PASS device-memory guard: the host self comm on device buffers faults (exit $rc)"
    else
        echo "$out" | tail -3; echo "FAIL: the device-memory guard did not catch a host memmove on device memory"; fail=1
    fi
else
    tail -20 "$EMU/mesh_device.log"; echo "FAIL: emulated mesh_device build"; fail=1
fi
echo "emulation stage: $(( $(date +%s) - t1 ))s; total $(( $(date +%s) - t0 ))s"
exit $fail
