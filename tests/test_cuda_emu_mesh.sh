#!/usr/bin/env bash
# test_cuda_emu_mesh.sh BUILD_DIR — multi-rank `--backend cuda` runs under the
# CPU emulator, one emulated GPU per MPI process, equal to the cpu runs.
#
#   1. build (incrementally; a hash of the headers and flags is kept next to
#      it) BUILD_DIR/cuda-emu-mesh/meshtrain: an MT_WITH_CUDA +
#      MT_WITH_MPI + MT_WITH_NCCL meshtrain whose src/ops/cuda/*.cu are
#      compiled as C++ against tests/cuda/emu (the objects test_cuda_build.sh's
#      emulation stage links too: tests/cuda/emu_objects.sh, which builds
#      them once for both) and whose NCCL is the emulated one
#      (tests/cuda/emu/nccl_emu.cc: NCCL on MPI, device buffers staged
#      through the emulator's copies, so the device-memory guard holds);
#      src/parallel/comm_nccl.c is compiled unchanged;
#   2. tiny dense and MoE configs, 3 steps, under mpirun --oversubscribe
#      (OMP_NUM_THREADS=1), each mesh once with --backend cpu and once with
#      --backend cuda (same binary): dense dp=2 x ZeRO 0/1/2/3, tp=2 with
#      and without sequence parallelism, pp=2 (2 microbatches), dp=2,tp=2
#      ZeRO-3 (4 ranks); MoE ep=2 with ZeRO 0 and 3 (the all-to-all-v
#      rows, the expert engine; ep is data for the dense parameters); MoE
#      tp=2 (the device routing's per-sequence statistics through the
#      host model-group all-reduce, docs/cuda.md "MoE on the device"). Every
#      run exits 0; the cuda run's receipt says backend cuda and its mesh
#      trace a device communicator "dev=nccl" (so NCCL, not the host comm,
#      carried the device buffers); losses, lm, aux and z losses equal the
#      cpu run's to 1e-5 relative (docs/cuda.md, fp32 mode; an all-zero
#      term stays exactly 0); both runs' own replica hash checks passed:
#      "ok: ..." after exactly the rank pairs tests/replica_pairs.py derives
#      from the mesh, or "not applicable" where it derives none (pp=2,
#      ZeRO-3).
#      Half the meshes run in the emulator's reverse launch order
#      (MT_EMU_ORDER=reverse, the table's fourth column: blocks and threads
#      last to first), half forward: a kernel of the device paths that races
#      (the all-to-all packing, the TP/SP gathers' layouts) reads other
#      values in one of the two orders.
#   MT_EMU_MESH_CASES=dp2z0,ep2 (the names in the table below) runs a subset.
#   The device-memory guard is on in every emulated run: a host (MPI) comm
#   handed a device buffer faults, as it would crash on a GPU.
#
# Runtime: the emulator dominates (every sumsq, i.e. each gradient-norm term
# and each Muon normalisation, is a fixed 1024 x 256-thread launch of
# fibers): ~50 s on 2 cores for the 11 cases (~100 s of CPU), plus the
# first build (~10 s for the C sources and nccl_emu.cc, ~10 s more where
# the shared .cu objects are not built yet; later runs rebuild what changed).
# Skips (exit 77, "SKIPPED (reason)"): no g++/gcc on x86-64, no mpicc/mpirun.
set -u
BUILD=${1:?usage: test_cuda_emu_mesh.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)

if ! command -v g++ >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1 || [ "$(uname -m)" != x86_64 ]; then
    echo "SKIPPED (needs gcc/g++ on x86-64 for the CUDA emulator)"; exit 77
fi
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    echo "SKIPPED (needs mpicc and mpirun: one emulated GPU per MPI process)"; exit 77
fi
t0=$(date +%s)
EM="$BUILD/cuda-emu-mesh"
mkdir -p "$EM/obj"
WERROR=OFF
grep -q '^MT_WERROR:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && WERROR=ON
CBLAS_INC=$(sed -n 's/^CBLAS_INCLUDE:PATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ -n "$CBLAS_INC" ] || CBLAS_INC=/usr/include/x86_64-linux-gnu
MPI_CF=$(mpicc --showme:compile 2>/dev/null || mpicc -compile-info 2>/dev/null | cut -d' ' -f2-)
MPI_LF=$(mpicc --showme:link 2>/dev/null || mpicc -link-info 2>/dev/null | cut -d' ' -f2-)
DEFS="-DMT_WITH_CUDA=1 -DMT_WITH_MPI=1 -DMT_WITH_NCCL=1"
CXXF="-std=c++20 -O2 -DMT_CUDA_EMU $DEFS -I$SRC/tests/cuda/emu -I$SRC/src $MPI_CF -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas"
CF="-std=c11 -O2 -march=x86-64-v3 -fopenmp $DEFS -I$SRC/tests/cuda/emu -I$SRC/src -I$CBLAS_INC $MPI_CF"
[ "$WERROR" = ON ] && CXXF="$CXXF -Werror"

# ---- 1. the emulated NCCL meshtrain (incremental: an object is rebuilt when
#      its source is newer; every object when a header or a flag changed) ----
# src/ops/cuda/*.cu and emu.cc: the shared objects (tests/cuda/emu_objects.sh)
if ! CUOBJ=$(bash "$SRC/tests/cuda/emu_objects.sh" "$BUILD" 2>"$EM/compile_cu.log"); then
    head -40 "$EM/compile_cu.log"; echo "FAIL: emulated build of src/ops/cuda"; exit 1
fi
HEADERS=$(ls "$SRC"/src/*/*.h "$SRC"/src/ops/*/*.h "$SRC"/src/ops/cuda/*.cuh "$SRC"/tools/*.h \
             "$SRC"/tests/cuda/emu/*.h 2>/dev/null)
STAMP=$( (echo "$CXXF $CF $MPI_LF $WERROR"; cat $HEADERS) | sha1sum | cut -d' ' -f1)
if [ "$(cat "$EM/stamp" 2>/dev/null)" != "$STAMP" ]; then
    rm -f "$EM/meshtrain" "$EM/stamp" "$EM"/obj/*.o
fi
export CXXF CF WERROR
compile() {  # one source -> one object, unless the object is newer
    [ -f "$2" ] && [ "$2" -nt "$1" ] && return 0
    rm -f "$2"
    case "$1" in
        *.cc)      g++ $CXXF -x c++ -c "$1" -o "$2" ;;
        # comm_nccl.c with warnings on: compiled here as nowhere else without nvcc
        */comm_nccl.c) gcc $CF -Wall -Wextra $( [ "$WERROR" = ON ] && echo -Werror ) -c "$1" -o "$2" ;;
        *.c)       gcc $CF -w -c "$1" -o "$2" ;;
    esac && echo "built $2"
}
export -f compile
{ for f in "$SRC/tests/cuda/emu/nccl_emu.cc" "$SRC"/src/*/*.c "$SRC"/src/ops/cpu/*.c "$SRC"/tools/*.c; do
      echo "$f $EM/obj/$(echo "${f#$SRC/}" | tr / _).o"
  done; } | xargs -P2 -n2 bash -c 'compile "$0" "$1"' >"$EM/compile.log" 2>&1
if [ $? -ne 0 ]; then grep -v '^built ' "$EM/compile.log" | head -40; echo "FAIL: emulated NCCL build"; exit 1; fi
# objects of sources that no longer exist would link stale code (and the
# .cu objects of before the shared build: they are in $CUOBJ now)
for o in "$EM"/obj/*.o; do
    grep -q "^built $o\$" "$EM/compile.log" && continue
    [ -n "$(ls "$SRC"/src/*/*.c "$SRC"/src/ops/*/*.c "$SRC"/tools/*.c "$SRC"/tests/cuda/emu/nccl_emu.cc |
            sed "s|^$SRC/||; s|/|_|g; s|\$|.o|" | grep -Fx "$(basename "$o")")" ] || rm -f "$o"
done
# relinked when an object (its own or a shared one) is newer than it
if [ ! -x "$EM/meshtrain" ] || [ -n "$(find "$EM/obj" "$CUOBJ" -name '*.o' -newer "$EM/meshtrain")" ]; then
    if ! g++ -fopenmp "$EM"/obj/*.o "$CUOBJ"/*.o -lopenblas -lcjson -lxxhash -lm $MPI_LF $(cat "$CUOBJ/ldflags") \
            -o "$EM/meshtrain" >>"$EM/compile.log" 2>&1; then
        tail -30 "$EM/compile.log"; echo "FAIL: emulated NCCL link"; exit 1
    fi
    echo "$STAMP" >"$EM/stamp"
    echo "PASS build: emulated MT_WITH_NCCL + MT_WITH_MPI meshtrain ($(grep -c '^built ' "$EM/compile.log") objects rebuilt) in $(( $(date +%s) - t0 ))s"
else
    echo "reusing $EM/meshtrain (no source changed)"
fi

# ---- 2. cpu vs emulated cuda on every axis ----
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
unset MT_CUDA_PRECISION MT_EMU_GUARD
python3 "$SRC/tests/make_shard.py" "$W/train.bin" 4000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2"
MOE="$TINY --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16"
COMMON="--peak-flops 1e11 --data $W/train.bin --steps 3"
fails=0; passes=0

# train NAME NP BACKEND ARGS... : 3 steps on NP ranks, output in $W/NAME
train() {
    local name=$1 np=$2 be=$3; shift 3
    timeout 170 mpirun --oversubscribe --allow-run-as-root -np "$np" "$EM/meshtrain" train "$@" $COMMON \
        --backend "$be" --out "$W/$name" >"$W/$name.log" 2>&1 </dev/null
}

# check NAME : NAME_cpu vs NAME_cuda (see the header)
check() {
    python3 - "$W/$1_cpu" "$W/$1_cuda" "$W/$1_cuda.log" "$(python3 "$SRC/tests/replica_pairs.py" "$W/$1_cuda")" <<'PY'
import json, re, sys
a, b = (json.load(open(p + "/receipt.json")) for p in sys.argv[1:3])
log = open(sys.argv[3]).read()
assert a["backend"]["actual"] == "cpu", a["backend"]
assert b["backend"]["actual"] == "cuda", b["backend"]
assert re.search(r"dev=nccl", log), "no NCCL device communicator in the cuda run's mesh trace"
# the receipt names the libraries: the MPI's own line, then the (emulated: 0.0.0) NCCL
libs = b["distributed"]["comm_libraries"]
assert libs.endswith("; NCCL 0.0.0") and not libs.startswith("no MPI"), libs
worst = {}
for key in ("losses", "lm_losses", "aux_losses", "z_losses"):
    la, lb = a[key], b[key]
    assert len(la) == len(lb) == 3, (key, la, lb)
    worst[key] = max(abs(x - y) / abs(x) if x != 0 else (0.0 if y == 0 else float("inf")) for x, y in zip(la, lb))
# the replica check of both runs: "ok" after exactly the comparisons the mesh
# implies (tests/replica_pairs.py), or "not applicable" where it implies none
want = int(sys.argv[4])
for r in (a, b):
    h = r["replica_hash_check"]
    m = re.fullmatch(r"ok: \d+ tensors bit-identical \(xxh64\) on every rank that holds them \((\d+) rank pairs\)", h)
    assert (m and int(m.group(1)) == want > 0) or (want == 0 and h.startswith("not applicable")), (h, want)
print("   cpu %s cuda %s; max rel diff %s; replica check: %s" % (a["losses"], b["losses"],
      ", ".join("%s %.1e" % kv for kv in worst.items()), b["replica_hash_check"]))
assert all(w <= 1e-5 for w in worst.values()), worst
PY
}

# case NAME NP CONFIG-VAR ARGS... : cpu and cuda runs of one mesh (side by side), compared
case_() {
    local name=$1 np=$2 cfgvar=$3; shift 3
    local cfg=${!cfgvar} ok=1 t=$(date +%s)
    train "${name}_cpu" "$np" cpu $cfg "$@" & local pid=$!
    train "${name}_cuda" "$np" cuda $cfg "$@" || ok=0
    wait $pid || ok=0
    if [ $ok -eq 1 ] && check "$name"; then
        passes=$((passes+1))
        echo "PASS $cfgvar $* : backend cuda (emulated NCCL, $MT_EMU_ORDER launch order) = cpu to 1e-5, replicas agree ($(( $(date +%s) - t ))s)"
    else
        fails=$((fails+1)); echo "FAIL $cfgvar $*"
        grep -h -m2 -e '^cuda emu:' -e 'error' -e 'failed' "$W/${name}_cpu.log" "$W/${name}_cuda.log"
        tail -n 2 "$W/${name}_cpu.log" "$W/${name}_cuda.log"
    fi
}

while read -r name np cfg order args; do
    [ -z "$name" ] && continue
    # MT_EMU_MESH_CASES=name,name,... runs only those (planting bugs, debugging)
    [ -n "${MT_EMU_MESH_CASES:-}" ] && [[ ",$MT_EMU_MESH_CASES," != *",$name,"* ]] && continue
    # shellcheck disable=SC2086
    MT_EMU_ORDER=$order case_ "$name" "$np" "$cfg" $args
done <<'CASES'
dp2z0   2 TINY forward --mesh dp=2 --zero 0
dp2z1   2 TINY reverse --mesh dp=2 --zero 1
dp2z2   2 TINY forward --mesh dp=2 --zero 2
dp2z3   2 TINY reverse --mesh dp=2 --zero 3
tp2sp   2 TINY reverse --mesh tp=2 --set sequence_parallel=true
tp2nosp 2 TINY forward --mesh tp=2 --set sequence_parallel=false
pp2     2 TINY reverse --mesh pp=2 --set microbatches=2
dp2tp2  4 TINY forward --mesh dp=2,tp=2 --zero 3
ep2     2 MOE  reverse --mesh ep=2
ep2z3   2 MOE  forward --mesh ep=2 --zero 3
moetp2  2 MOE  reverse --mesh tp=2
CASES

echo "$passes passed, $fails failed; $(( $(date +%s) - t0 ))s"
[ $fails -eq 0 ] && [ $passes -gt 0 ] || { echo "test_cuda_emu_mesh: FAILED"; exit 1; }
echo "test_cuda_emu_mesh: ok"
