#!/usr/bin/env bash
# bench/gpu.sh — the lent-GPU recipe of issue 20, as one script (docs/cuda.md,
# "Verifying on a GPU machine").
#
#   bash bench/gpu.sh prepare     # HERE, on the CPU machine, before the device call:
#                                 # builds the CUDA binaries (no MPI: the device image
#                                 # has none) into build-gpu/, stages them with the
#                                 # Debian libraries the image lacks (OpenBLAS, cJSON,
#                                 # xxhash, ...) and llm.c's snapshot into gpu_carry/
#                                 # (ignored; bin/ and lib/ packed as .tar.xz: ~10 MB,
#                                 # under the device tool's 64 MiB)
#   bash bench/gpu.sh quick       # ON THE DEVICE, one `run` call with carry ["gpu_carry"],
#                                 # timeout_s 600: env ops equiv speed llmc torch (+ summary),
#                                 # GPU_SH_BUDGET 565 s: fits one 10-minute call (the start is not counted)
#   bash bench/gpu.sh rest        # a second call: calib attnv4 san ncu hf muon (+ summary), budget 300 s
#                                 # (GPU_SH_BUDGET: the device's budget_left_s - 20, at most 300,
#                                 #  on the machine quick left warm; a cold start counts too)
#   (on the device, the results so far are packed into $OUT after every stage, and on
#    TERM/INT: a call cut short still brings back what finished; docs/cuda.md)
#   bash bench/gpu.sh [STAGE...]  # any stages (default: every stage, in order, budget 570 s)
#   python3 bench/gpu_decide.py QUICK_DIR REST_DIR
#                                 # here, after both archives are unpacked: the issues'
#                                 # targets met or not, and each default the pair decides
#
# Stages (each independent and time-boxed: a failing or hanging stage is
# recorded and the next one runs; without a GPU the GPU stages print
# "SKIPPED (...)" and the CPU parts still run):
#   env     nvidia-smi, driver/toolkit/torch versions, missing libraries
#   ops     the op harness on the GPU vs the cpu table (fp32 to 1e-5, bf16 to
#           the derived bound, tiled bf16), test_ops -b cuda, device comms
#           (self_dev; NCCL on a one-rank world when the NCCL build is carried);
#           then bench/gpu_fallbacks.py: a bf16 kernel family that failed here
#           (attention v3, the tensor-core scan, the grouped experts) is swapped for
#           its predecessor in every speed run (speed_fallbacks.txt, --knob ...)
#   san     compute-sanitizer memcheck and racecheck on the op harness, op by
#           op (what the emulator cannot see: races, OOB into page slack)
#   equiv   20-step trainings of the tiny dense, MoE (and hybrid `M`, and the
#           extras: MoD around MoE with null experts and MTP, when the build
#           knows them) configs: cpu vs cuda fp32 (<= 1e-4 relative),
#           cuda bf16 per call (<= 1e-2, docs/cuda.md), cuda precision=bf16 vs the
#           cpu run of that mode (<= 1e-2), and --zero 1/2/3 on one GPU
#   speed   meshtrain precision=bf16 (--set precision=bf16, the plain GEMMs left also
#           bf16 per call), --no-save: gpu_d2048_dense.json (10 steps),
#           gpu_c_gpt2.json (GPT-2 124M's widths with SwiGLU hidden 3072: 1.26x
#           its FLOPs a token; seq 1024; batch 16, else 8, else 4) and
#           gpu_c_gpt2_124m.json (SwiGLU hidden 2048: GPT-2 124M's matmul
#           parameters and FLOPs a token, the like-for-like row against llm.c),
#           gpu_moe8.json (and moe8_hostsizes: --knob moe_sizes=host, the expert
#           sizes A/B) and the d2048 hybrid (pattern MAMA..., 3 steps each),
#           with CUDA graphs on (the one-GPU default; each RESULT line says
#           whether they ran), then GPT-2, d2048 and the hybrid again with
#           --knob cuda_graphs=0 (*_nographs: the graphs A/B, and the per-op
#           profile, which a replayed graph cannot split); d2048 once more
#           with --knob attn_kernel=v2 (d2048_dense_attnv2: the bf16
#           attention A/B, v2's 64-row query tiles vs the default v3's 128;
#           v1 vs v2 was 1.30x on the H100, 2026-11-27); the hybrid with
#           mamba_chunk 32 and 128 (hyb2048_chunk32/128: the scan's chunk A/B)
#           and with --knob scan_bf16=0 (hyb2048_scanfp32: the scan on tensor
#           cores A/B):
#           tokens/s, MFU, the per-op profile when the receipt has one; a run
#           that runs out of its box still gives a line (tokens/s from its
#           progress lines, or "no step within the box" with the time of its
#           last line: every log line is stamped with seconds since start)
#   llmc    llm.c's train_gpt2cu (built in the background from the start of
#           the run) on the GPT-2 shape, 20 steps
#   torch   the same models in PyTorch (bench/torch_gpu.py: SDPA, bf16
#           autocast, fused AdamW), eager, then torch.compile (~33 s of
#           compiling per model on the H200)
#   hf      (in `rest`; in a run of every stage: when the budget leaves room, else
#           SKIPPED (out of budget))
#           the tiny dense and MoE configs trained on the GPU (--backend cuda,
#           fp32, 20 steps), exported, loaded by the image's transformers
#           (float32, no TF32, eager attention): its logits vs `meshtrain
#           logits --backend cuda` and `--backend cpu` (bench/hf_logits_gpu.py:
#           HF <= 1e-4, cuda vs cpu <= 1e-5 relative to the largest logit)
#   calib   (in `rest`; before speed when a call runs both, so the speed runs'
#           plan predictions use this card's profile):
#           bench/cuda_calib.c (GEMM fp32/bf16, attention, one-rank all-reduce or
#           device copy) and bench/profiles/gpu_profile.py -> $RES/h100-measured.json (h200-),
#           the planner's profile calibrated on this GPU (docs/cuda.md); the wgmma
#           probe's check against cuBLAS and its rate ("RESULT calib wgmma"), and
#           attn_kernel=v4 and v5 against v3, forward and backward apart ("RESULT calib
#           attention v4", "... v5"); the causal attention's block order against the one
#           before it ("RESULT calib attention order": same bits, both timed)
#   attnv4  (in `rest`, after calib) d2048 and GPT-2 124M with --knob
#           attn_kernel=v4 or v5 (d2048_dense_attnv4 or _attnv5, c_gpt2_124m_...:
#           the wgmma attention end to end), each only when this call's calib rows
#           say the kernel's forward and backward are right at its head dim (128,
#           64; else SKIPPED with the reason), the faster in calib of the two if
#           both are: the rows that decide the default; and moe8 with
#           --knob grouped_gemm_kernel=wgmma (moe8_ggwgmma: the experts' products
#           on wgmma, the A/B against moe8) when calib's three wgmma grouped rows
#           matched the mma.sync kernels' results
#   muon    (in `rest`, last) d2048 and GPT-2 124M with Muon, the default optimizer
#           (d2048_muon, c_gpt2_124m_muon: its Newton-Schulz in bf16, batched over
#           same-shape matrices, against the plan's prediction)
#   summary summary.md + summary.json: pass/fail per check, tokens/s, MFU, the
#           plan's prediction, ratios to PyTorch and llm.c, each meshtrain run's
#           per-op profile (always runs)
# Results: a folder <date>-gpu-<set> (set: quick, rest, all, or custom): on the
# device (where $OUT is set) it is built under /tmp and travels as ONE archive,
# $OUT/gpu-<set>.tgz, plus $OUT/summary.md (the device tool brings back at most
# 8 files, two folders deep); unpack it into bench/results/<date>-<card>/.
# Elsewhere: $GPU_SH_RESULTS, else bench/results/<date>-gpu-<set>.
# Budget: GPU_SH_BUDGET seconds (default: quick 565, rest 300, else 570) for
# everything; each stage gets min(its box, what is left).
# CPU check of the script itself: GPU_SH_EMU=path/to/emulated/meshtrain runs
# the equiv and hf stages' cuda runs under the CPU emulator (tests/test_cuda_build.sh
# builds one at BUILD/cuda-build/emu/meshtrain); its results say "emulated".
# hf needs torch 2.x + transformers on the CPU (docs/cuda.md), else SKIPPED.
# GPU_SH_BIN=dir (binaries, default gpu_carry/bin or its bin.tar.xz unpacked, else build-gpu),
# GPU_SH_EQUIV_STEPS=n (default 20; 3 keeps an emulated check short) and
# GPU_SH_BOX_<stage>=seconds (a stage's box; the budget still caps it),
# GPU_SH_SPEED_BOX=seconds (every speed run's box; tests/test_gpu_sh.sh).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
CARRY=$ROOT/gpu_carry

# ---------------------------------------------------------------- prepare
if [ "${1:-}" = prepare ]; then
    set -e
    NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
    [ -x "$NVCC" ] || { echo "prepare: no nvcc at $NVCC" >&2; exit 2; }
    BG=${GPU_SH_BUILD:-build-gpu}   # e.g. BUILD/cuda-build of tests/test_cuda_build.sh (same options)
    cmake -S . -B "$BG" -DMT_WITH_CUDA=ON -DMT_WITH_MPI=OFF -DMT_WERROR=ON -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
    nice cmake --build "$BG" -j2 --target meshtrain cuda_ops_vs_cpu cuda_mesh_device test_ops cuda_calib \
        test_attn_bf16 test_ssm
    rm -rf "${CARRY:?}/bin" "${CARRY:?}/lib"
    mkdir -p "$CARRY/bin" "$CARRY/lib"
    cp "$BG/meshtrain" "$BG/cuda_ops_vs_cpu" "$BG/cuda_mesh_device" "$BG/test_ops" "$BG/cuda_calib" \
       "$BG/test_attn_bf16" "$BG/test_ssm" "$CARRY/bin/"
    if [ "${GPU_SH_NCCL:-1}" = 1 ] && { [ -f /usr/include/nccl.h ] || [ -f /usr/local/cuda/include/nccl.h ]; }; then
        cmake -S . -B build-gpu-nccl -DMT_WITH_CUDA=ON -DMT_WITH_NCCL=ON -DMT_WITH_MPI=OFF -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
        nice cmake --build build-gpu-nccl -j2 --target cuda_mesh_device cuda_calib
        cp build-gpu-nccl/cuda_mesh_device "$CARRY/bin/cuda_mesh_device_nccl"
        cp build-gpu-nccl/cuda_calib "$CARRY/bin/cuda_calib_nccl"   # the calib stage's one-rank NCCL all-reduce
    fi
    for l in $(ldd "$BG/meshtrain" | awk '/=>/ {print $3}' | grep -E 'openblas|gfortran|quadmath|cjson|xxhash|gomp'); do
        cp -L "$l" "$CARRY/lib/"
    done
    cp /work/shared/peers/llm.c.tar.gz /work/shared/peers/gen_llmc_inputs.c "$CARRY/" 2>/dev/null ||
        echo "prepare: llm.c snapshot not found (/work/shared/peers): the llmc stage will be SKIPPED"
    strip "$CARRY"/bin/* "$CARRY"/lib/* 2>/dev/null || true   # symbols only; the device code stays
    # the libraries and the binaries travel packed and are unpacked on the device
    # before the first stage: OpenBLAS alone is ~36 MB, and each binary carries
    # the whole sm_90 device code (~8 MB each, ~9 binaries: 70 MB, over the carry
    # limit, 2026-11-28); xz shares it across them (~3.5 MB for bin/)
    tar -C "$CARRY" -cJf "$CARRY/lib.tar.xz" lib && rm -rf "${CARRY:?}/lib"
    tar -C "$CARRY" -cf - bin | xz -9 -T2 > "$CARRY/bin.tar.xz" && rm -rf "${CARRY:?}/bin"
    # the 64 MiB limit counts the whole working tree (tracked and untracked
    # files) plus the carry, so the carry gets what the tree leaves
    tree_mb=$(( ( $(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) + 1048575 ) / 1048576 ))
    room=$(( 63 - tree_mb ))
    git check-ignore -q gpu_carry || { echo "prepare: gpu_carry/ is not ignored (.gitignore)" >&2; exit 1; }
    du -sh "$CARRY"
    mb=$(du -sm "$CARRY" | cut -f1)
    [ "$mb" -lt "$room" ] || { echo "prepare: gpu_carry is ${mb} MiB + the tree ${tree_mb} MiB, over the device tool's 64 MiB carry limit" >&2; exit 1; }
    echo "prepare: done. Device calls: run(command='bash bench/gpu.sh quick', carry=['gpu_carry'], timeout_s=600),"
    echo "         then run(command='bash bench/gpu.sh rest', carry=['gpu_carry'], timeout_s=360) (docs/cuda.md)"
    exit 0
fi

# ---------------------------------------------------------------- run
T_START=$(date +%s)
# stage sets: quick = one 10-minute device call with the machine's start (the
# issue's speed table and correctness); rest = a second call
SET=custom BUDGET0=570
case "${1:-}" in
    quick) SET=quick BUDGET0=565; set -- env ops equiv speed llmc torch ;;
    rest)  SET=rest BUDGET0=300; set -- calib attnv4 san ncu hf muon ;;
    "")    SET=all ;;
esac
BUDGET=${GPU_SH_BUDGET:-$BUDGET0}
DATE=$(date -u +%F)
RES_TMP=""   # where $OUT is set: the results are built here, then packed into $OUT
if [ -n "${GPU_SH_RESULTS:-}" ]; then RES=$GPU_SH_RESULTS
elif [ -n "${OUT:-}" ]; then RES_TMP=${TMPDIR:-/tmp}/meshtrain-gpu-res.$$; RES=$RES_TMP/$DATE-gpu-$SET
else RES=$ROOT/bench/results/$DATE-gpu-$SET; fi
mkdir -p "$RES/receipts" "$RES/logs" "$RES/speed"
SUMMARY=$RES/stages.txt
: > "$SUMMARY"
WORK=${TMPDIR:-/tmp}/meshtrain-gpu.$$
mkdir -p "$WORK"

# prepare packs the binaries (bin.tar.xz): unpacked once per run, into $WORK
if [ -z "${GPU_SH_BIN:-}" ] && [ ! -d "$CARRY/bin" ] && [ -f "$CARRY/bin.tar.xz" ]; then
    tar -C "$WORK" -xJf "$CARRY/bin.tar.xz" && GPU_SH_BIN=$WORK/bin
fi
BIN=${GPU_SH_BIN:-$CARRY/bin}
[ -x "$BIN/meshtrain" ] || BIN=$ROOT/build-gpu
MT=$BIN/meshtrain
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)
# prepare packs the libraries (the carry limit); unpack them once per run
CARRY_LIB=$CARRY/lib
if [ ! -d "$CARRY_LIB" ] && [ -f "$CARRY/lib.tar.xz" ]; then
    CARRY_LIB=$WORK/lib; tar -C "$WORK" -xJf "$CARRY/lib.tar.xz"
fi
export LD_LIBRARY_PATH=$CARRY_LIB:/usr/local/cuda/lib64${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
HAVE_GPU=0
nvidia-smi -L >/dev/null 2>&1 && HAVE_GPU=1
EMU=${GPU_SH_EMU:-}
EQ_STEPS=${GPU_SH_EQUIV_STEPS:-20}
export ROOT RES WORK BIN MT HAVE_GPU EMU EQ_STEPS SET

STAGES="env ops san equiv speed llmc torch hf calib attnv4 muon"
[ $# -gt 0 ] && STAGES="$*"

# llm.c builds on the CPU while the GPU stages run (it takes a minute of nvcc)
LLMC_DIR=$WORK/llmc
if [ $HAVE_GPU = 1 ] && echo " $STAGES " | grep -q ' llmc ' && [ -f "$CARRY/llm.c.tar.gz" ]; then
    (
        mkdir -p "$LLMC_DIR" && tar xzf "$CARRY/llm.c.tar.gz" -C "$LLMC_DIR" && cd "$LLMC_DIR/llm.c" || exit 1
        export PATH=/usr/local/cuda/bin:$PATH   # nvcc for the version test and the Makefile's `which nvcc`
        # CUDA 13: cudaMemAdvise takes a cudaMemLocation (peers/README.md)
        if nvcc --version 2>/dev/null | grep -qE 'release 1[3-9]'; then
            sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' llmc/cuda_utils.cuh
        fi
        # the Makefile links -lnvidia-ml; a driver install may ship only libnvidia-ml.so.1 (no
        # unversioned .so): give the linker one through LIBRARY_PATH (harmless when it exists)
        mkdir -p nvml
        so1=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / {print $NF; exit}')
        [ -n "$so1" ] && ln -sf "$so1" nvml/libnvidia-ml.so
        gcc -O2 -o gen "$CARRY/gen_llmc_inputs.c" -lm && ./gen . >/dev/null &&
            LIBRARY_PATH=$PWD/nvml${LIBRARY_PATH:+:$LIBRARY_PATH} \
            nice make train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=90
    ) > "$RES/logs/llmc_build.log" 2>&1 &
    LLMC_BUILD_PID=$!
else
    LLMC_BUILD_PID=
fi

# stage NAME BOX GPU: run stage_NAME under timeout; one line in stages.txt. GPU: 0 runs
# anywhere, 1 needs a GPU, emu needs a GPU or the CPU emulator (GPU_SH_EMU: its cuda runs)
stage() {
    local name=$1 box=$2 gpu=$3
    echo " $STAGES " | grep -q " $name " || return 0
    if [ "$gpu" != 0 ] && [ $HAVE_GPU = 0 ] && { [ "$gpu" != emu ] || [ -z "$EMU" ]; }; then
        echo "SKIPPED ($name: no GPU: nvidia-smi -L failed)" | tee -a "$SUMMARY"
        return 0
    fi
    local ov="GPU_SH_BOX_$name"
    [ -n "${!ov:-}" ] && box=${!ov}
    local left=$(( BUDGET - ($(date +%s) - T_START) - 15 ))
    [ $left -lt $box ] && box=$left
    if [ $box -lt 10 ]; then
        echo "SKIPPED ($name: out of budget, ${BUDGET}s)" | tee -a "$SUMMARY"
        return 0
    fi
    local t0 rc
    t0=$(date +%s)
    echo "== $name (box ${box}s)"
    # in the background and waited for: a TERM to the script then runs its trap at once
    # (bash defers a trap until a foreground command ends), which ends this stage too
    CUR_STAGE=$name CUR_T0=$t0
    timeout -k 10 "$box" bash -c "stage_$name" > "$RES/logs/$name.log" 2>&1 &
    CUR_PID=$!
    wait "$CUR_PID"
    rc=$?
    CUR_PID=
    local dt=$(( $(date +%s) - t0 )) verdict
    case $rc in
        0) verdict=PASS ;;
        77) verdict=SKIPPED ;;
        124|137) verdict="TIMEOUT (box ${box}s)" ;;
        *) verdict="FAIL (exit $rc)" ;;
    esac
    echo "$verdict $name (${dt}s): $(grep -E '^(RESULT|SKIPPED)' "$RES/logs/$name.log" | tr '\n' ';' | cut -c1-1500)" | tee -a "$SUMMARY"
    [ "$name" = summary ] || checkpoint
}

# checkpoint: on the device, the results so far packed into $OUT after every stage (the
# archive and a summary.md saying it is partial; the summary stage's replace them), so a
# call that ends early — its device time spent, a kill — still brings back every stage
# that finished (before, the archive was packed once, at the end: a cut call lost all)
checkpoint() {
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
    tar czf "$OUT/gpu-$SET.tgz.part" -C "$(dirname "$RES")" "$(basename "$RES")" 2>/dev/null &&
        mv -f "$OUT/gpu-$SET.tgz.part" "$OUT/gpu-$SET.tgz"
    rm -f "$OUT/gpu-$SET.tgz.part"
    { echo "# bench/gpu.sh $SET: PARTIAL (packed after each stage; the call ended before its summary)"
      echo; echo '```'; cat "$SUMMARY"; echo '```'; } > "$OUT/summary.md"
}

# TERM/INT (the call's time ran out, or a kill): the running stage is ended and
# recorded as KILLED, the llm.c build stopped, the results so far packed
on_term() {
    trap - TERM INT
    [ "${FINAL_PACK:-0}" = 1 ] && exit 143   # the final archive is being written: leave it be
    # every live process under this script (the llm.c build's too), listed before any dies (an
    # orphan loses its parent link): the speed runs' timeout boxes are process groups of their own
    local kids alive p i
    kids=$(for p in $(descendants $$); do kill -0 "$p" 2>/dev/null && echo "$p"; done)
    kill -TERM $kids 2>/dev/null
    for i in 1 2 3 4 5 6 7 8 9 10; do   # up to 5 s for them to write their last lines
        alive=$(for p in $kids; do kill -0 "$p" 2>/dev/null && echo "$p"; done)
        [ -z "$alive" ] && break
        sleep 0.5
    done
    [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
    [ -n "${CUR_PID:-}" ] &&
        echo "KILLED $CUR_STAGE ($(( $(date +%s) - CUR_T0 ))s): the script got a signal" | tee -a "$SUMMARY"
    checkpoint
    if [ -n "${OUT:-}" ]; then echo "results so far: $OUT/gpu-$SET.tgz (partial)"; else echo "results so far: $RES"; fi
    exit 143
}
# descendants PID: the pids below PID (ps; none listed without it)
descendants() {
    ps -eo pid=,ppid= 2>/dev/null | awk -v root="$1" '{ kid[$2] = kid[$2] " " $1 }
        END { n = split(kid[root], q, " "); for (i = 1; i <= n; i++) { print q[i]; m = split(kid[q[i]], c, " ");
              for (j = 1; j <= m; j++) q[++n] = c[j] } }'
}
CUR_PID= CUR_STAGE= CUR_T0=0 FINAL_PACK=0
trap on_term TERM INT

stage_env() {
    nvidia-smi || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    nvcc --version 2>/dev/null | tail -2 || echo "nvcc: not on PATH"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' || true
    python3 -c 'import transformers; print("transformers", transformers.__version__)' || true
    compute-sanitizer --version 2>/dev/null | head -2 || echo "compute-sanitizer: not on PATH"
    echo "binaries: $BIN"
    local miss
    miss=$(ldd "$MT" 2>&1 | grep 'not found')
    [ -z "$miss" ] || { echo "$miss"; echo "RESULT env: missing libraries for meshtrain"; return 1; }
    echo "RESULT env: ok"
}
export -f stage_env

stage_ops() {
    local bad=0
    "$BIN/cuda_ops_vs_cpu" > "$RES/logs/ops_harness.txt" 2>&1 || bad=1
    echo "RESULT harness: $(tail -1 "$RES/logs/ops_harness.txt")"
    MT_CUDA_PRECISION=bf16 MT_CUDA_BF16_SCRATCH_MB=1 "$BIN/cuda_ops_vs_cpu" -o gemm > "$RES/logs/ops_bf16_tiled.txt" 2>&1 || bad=1
    echo "RESULT bf16 tiled: $(tail -1 "$RES/logs/ops_bf16_tiled.txt")"
    "$BIN/test_ops" -b cuda > "$RES/logs/test_ops_cuda.txt" 2>&1 || bad=1
    echo "RESULT test_ops -b cuda: $(grep -E 'failed' "$RES/logs/test_ops_cuda.txt" | tail -1)"
    "$BIN/cuda_mesh_device" > "$RES/logs/mesh_device.txt" 2>&1 || bad=1
    echo "RESULT mesh_device (self_dev): $(tail -1 "$RES/logs/mesh_device.txt")"
    # precision=bf16's tensor-core attention (wmma) against its fp64 bound, both
    # dQ paths; the chunked Mamba-3 scan against the fp64 recurrence
    local t
    for t in "test_attn_bf16" "test_attn_bf16 ds0" "test_ssm"; do
        set -- $t
        [ -x "$BIN/$1" ] || { echo "SKIPPED ($1: not carried: bash bench/gpu.sh prepare)"; continue; }
        if [ "${2:-}" = ds0 ]; then MT_CUDA_ATTN_DS_MB=0 "$BIN/$1" -b cuda > "$RES/logs/$1_ds0.txt" 2>&1 || bad=1
            echo "RESULT $1 -b cuda (MT_CUDA_ATTN_DS_MB=0): $(tail -1 "$RES/logs/$1_ds0.txt")"
        else "$BIN/$1" -b cuda > "$RES/logs/$1.txt" 2>&1 || bad=1
            echo "RESULT $1 -b cuda: $(tail -1 "$RES/logs/$1.txt")"; fi
    done
    # the speed stage's fallbacks from this verdict (bench/gpu_fallbacks.py): a new bf16
    # kernel family that fails here is replaced by its predecessor in every speed row
    # (attn_kernel=v2, scan_bf16=0, moe_sizes=host), so one broken family cannot cost the
    # whole speed table; test_ssm's tensor-core checks alone when the whole test failed
    if [ -x "$BIN/test_ssm" ] && ! grep -q '^test_ssm: all checks passed' "$RES/logs/test_ssm.txt" 2>/dev/null; then
        "$BIN/test_ssm" -b cuda -bf16 > "$RES/logs/test_ssm_bf16.txt" 2>&1
        echo "RESULT test_ssm -b cuda -bf16: $(tail -1 "$RES/logs/test_ssm_bf16.txt")"
    fi
    python3 "$ROOT/bench/gpu_fallbacks.py" "$RES/logs" > "$RES/speed_fallbacks.txt" || rm -f "$RES/speed_fallbacks.txt"
    [ -s "$RES/speed_fallbacks.txt" ] &&
        sed 's/^\([^\t]*\)\t/RESULT speed fallback: --knob \1 (/; s/$/)/' "$RES/speed_fallbacks.txt"
    if [ -x "$BIN/cuda_mesh_device_nccl" ]; then
        "$BIN/cuda_mesh_device_nccl" --nccl > "$RES/logs/mesh_device_nccl.txt" 2>&1 || bad=1
        echo "RESULT mesh_device --nccl: $(tail -1 "$RES/logs/mesh_device_nccl.txt")"
    else
        echo "SKIPPED (NCCL one-rank check: no cuda_mesh_device_nccl carried)"
    fi
    return $bad
}
export -f stage_ops

# each sanitizer run is boxed on its own: racecheck is 10-100x slower
stage_san() {
    command -v compute-sanitizer >/dev/null || { echo "SKIPPED (san: no compute-sanitizer)"; return 77; }
    local bad=0 tool op log
    for tool_op in memcheck:attention racecheck:attention memcheck:gemm memcheck:embed racecheck:embed \
                   memcheck:xent racecheck:xent memcheck:rmsnorm racecheck:rmsnorm memcheck:sumsq racecheck:sumsq \
                   memcheck:moe racecheck:moe memcheck:router memcheck:rope memcheck:swiglu \
                   memcheck:transpose racecheck:transpose memcheck:adamw memcheck:muon memcheck:init_normal; do
        tool=${tool_op%%:*} op=${tool_op#*:} log=$RES/logs/san_${tool}_$op.txt
        timeout -k 5 25 compute-sanitizer --tool "$tool" --error-exitcode 99 "$BIN/cuda_ops_vs_cpu" -o "$op" > "$log" 2>&1
        local rc=$?
        case $rc in
            0) echo "RESULT $tool $op: clean ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log"))" ;;
            124|137) echo "RESULT $tool $op: TIMEOUT 25s (not a verdict)" ;;
            *) echo "RESULT $tool $op: FAIL exit $rc: $(grep -m2 -E 'Invalid|Race|hazard|ERROR' "$log" | tr '\n' ' ')"; bad=1 ;;
        esac
    done
    # the tensor-core attention's and scan's warp barriers (their own harness binaries;
    # test_ssm -bf16: the precision=bf16 scan's cases alone, ssd_tc.cu)
    local h name
    for h in "test_attn_bf16:attention_bf16" "test_ssm -bf16:scan_bf16"; do
        name=${h#*:}
        set -- ${h%%:*}
        [ -x "$BIN/$1" ] || continue
        for tool in racecheck memcheck; do
            log=$RES/logs/san_${tool}_$name.txt
            timeout -k 5 60 compute-sanitizer --tool "$tool" --error-exitcode 99 "$BIN/$1" -b cuda ${2:-} > "$log" 2>&1
            case $? in
                0) echo "RESULT $tool $name: clean ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log"))" ;;
                124|137) echo "RESULT $tool $name: TIMEOUT 60s (not a verdict)" ;;
                *) echo "RESULT $tool $name: FAIL: $(grep -m2 -E 'Invalid|Race|hazard|ERROR|FAIL' "$log" | tr '\n' ' ')"; bad=1 ;;
            esac
        done
    done
    return $bad
}
export -f stage_san

# train NAME BINARY FLAGS...: 20 steps of a tiny config; receipt kept
train_tiny() {
    local name=$1 bin=$2; shift 2
    "$bin" train "$@" --peak-flops 1e11 --quiet --data "$WORK/tiny.bin" --out "$WORK/eq_$name" --steps "$EQ_STEPS" \
        > "$RES/logs/eq_$name.log" 2>&1 || { echo "RESULT $name: exit $? ($(tail -1 "$RES/logs/eq_$name.log"))"; return 1; }
    cp "$WORK/eq_$name/receipt.json" "$RES/receipts/eq_$name.json"
}
export -f train_tiny

stage_equiv() {
    python3 "$ROOT/tests/make_shard.py" "$WORK/tiny.bin" 20000 64 pattern >/dev/null || return 1
    local TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set lr=0.01 --set warmup_steps=2"
    local MOE="--set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=16 --set shared_expert_hidden=16 --set logit_softcap=15 --set microbatches=2"
    local HYB="--set pattern=MA"
    # the extras together (issue 31): Mixture-of-Depths routing around a MoE block with null experts, an MTP module
    local EXT="--set pattern=Ae --set n_experts=4 --set top_k=2 --set expert_hidden=16 --set n_null_experts=2 --set mod_capacity=0.25 --set mtp_depth=1 --set microbatches=2"
    local CB=$MT
    [ $HAVE_GPU = 0 ] && [ -n "$EMU" ] && CB=$EMU && echo "NOTE: cuda runs under the CPU emulator ($EMU)"
    local cfgs="dense moe"
    if "$MT" train $TINY $HYB --backend cpu --steps 1 --quiet --peak-flops 1e11 --data "$WORK/tiny.bin" \
            --out "$WORK/probe_hyb" > "$RES/logs/eq_probe_hybrid.log" 2>&1; then cfgs="$cfgs hybrid"
    else echo "SKIPPED (hybrid: this build refuses pattern=MA: $(tail -1 "$RES/logs/eq_probe_hybrid.log"))"; fi
    if "$MT" train $TINY $EXT --backend cpu --steps 1 --quiet --peak-flops 1e11 --data "$WORK/tiny.bin" \
            --out "$WORK/probe_ext" > "$RES/logs/eq_probe_extras.log" 2>&1; then cfgs="$cfgs extras"
    else echo "SKIPPED (extras: this build refuses them: $(tail -1 "$RES/logs/eq_probe_extras.log"))"; fi
    local bad=0 X
    for cfg in $cfgs; do
        case $cfg in dense) X="" ;; moe) X=$MOE ;; hybrid) X=$HYB ;; extras) X=$EXT ;; esac
        train_tiny ${cfg}_cpu "$MT" $TINY $X --backend cpu || bad=1
        MT_CUDA_PRECISION=fp32 train_tiny ${cfg}_cuda "$CB" $TINY $X --backend cuda || bad=1
        MT_CUDA_PRECISION=bf16 train_tiny ${cfg}_cuda_bf16 "$CB" $TINY $X --backend cuda || bad=1
        # precision=bf16 (the storage mode: bf16 shadows and twins): cuda vs the cpu twin of the mode
        train_tiny ${cfg}_cpu_bf16s "$MT" $TINY $X --set precision=bf16 --backend cpu || bad=1
        MT_CUDA_PRECISION=fp32 train_tiny ${cfg}_cuda_bf16s "$CB" $TINY $X --set precision=bf16 --backend cuda || bad=1
    done
    for z in 1 2 3; do MT_CUDA_PRECISION=fp32 train_tiny dense_cuda_z$z "$CB" $TINY --backend cuda --zero $z || bad=1; done
    MT_CUDA_PRECISION=fp32 train_tiny moe_cuda_z3 "$CB" $TINY $MOE --backend cuda --zero 3 || bad=1
    python3 - "$RES/receipts" "$cfgs" "$EQ_STEPS" 2>&1 > "$RES/equiv.json" <<'PY' || bad=1
import json, math, os, sys
d, cfgs, n_steps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def L(n):
    p = os.path.join(d, "eq_%s.json" % n)
    return json.load(open(p)) if os.path.exists(p) else None
# docs/cuda.md: fp32 <= 1e-4 relative over 20 steps; bf16: the proposed 1e-2 bar, per-call
# mode (MT_CUDA_PRECISION=bf16) vs cpu fp32, precision=bf16 vs the cpu run of the same mode
checks = [(c + "_cpu", c + "_cuda", 1e-4) for c in cfgs] + [(c + "_cpu", c + "_cuda_bf16", 1e-2) for c in cfgs]
checks += [(c + "_cpu_bf16s", c + "_cuda_bf16s", 1e-2) for c in cfgs]
checks += [("dense_cpu", "dense_cuda_z%d" % z, 1e-4) for z in (1, 2, 3)] + [("moe_cpu", "moe_cuda_z3", 1e-4)]
# The routing statistics (aux: the load-balance fractions, z: the router's logsumexp over
# the routed tokens) of a bf16 row are counts over few top-k assignments: one assignment
# that flips between bf16 and fp32 rounding moves them by ~1/assignments (the extras row
# routes 8 tokens per microbatch through MoD at capacity 0.25: 16 top-2 assignments;
# H100 2026-11-27: aux 4.1e-2 while its total loss agreed to 2.2e-3). So a bf16 row
# (tol >= 1e-2) judges aux and z against max(tol, 2 / assignments): two flips, still far
# below a wrong factor. fp32 rows keep one bar for every series.
def assignments(r):   # top-k assignments per microbatch of the least-routed MoE layer (E: every row, e: MoD's C)
    c = r.get("config") or {}
    pat = c.get("pattern") or ""
    if "E" not in pat and "e" not in pat:
        return None
    T, seqs = int(c.get("seq_len", 0)), int(c.get("batch_size", 0)) // max(1, int(c.get("microbatches", 1)))
    rows = T if "e" not in pat else max(1, math.ceil(float(c.get("mod_capacity", 1.0)) * T - 1e-6))   # C = ceil(c T), as mod.c
    return max(1, seqs * rows * int(c.get("top_k", 1)))
out, ok = [], True
for ref, run, tol in checks:
    a, b = L(ref), L(run)
    if a is None or b is None:
        out.append({"run": run, "ok": False, "why": "missing receipt"}); ok = False; continue
    n_as = assignments(a)
    tol_route = max(tol, 2.0 / n_as) if tol >= 1e-2 and n_as else tol
    worst, rel, good = 0.0, {}, True
    for key in ("losses", "lm_losses", "aux_losses", "z_losses"):
        w = 0.0
        for x, y in zip(a[key], b[key]):
            w = max(w, abs(x - y) / abs(x) if x != 0 else (0.0 if y == 0 else float("inf")))
        rel[key] = w
        worst = max(worst, w)
        good = good and w <= (tol_route if key in ("aux_losses", "z_losses") else tol)
    good = good and len(a["losses"]) == len(b["losses"]) == n_steps
    out.append({"run": run, "ref": ref, "max_rel": worst, "max_rel_by_series": rel, "tol": tol,
                "tol_routing": tol_route, "routed_assignments": n_as, "ok": good,
                "emulated": bool((b.get("gpu") or {}).get("emulated")),
                "fallback_reason": b["backend"].get("fallback_reason")})
    print("RESULT %s vs %s: max rel %.2e (tol %g%s) %s" % (
        run, ref, worst, tol, "" if tol_route == tol else "; loss %.1e, aux/z %.1e of %.3g (%d routed assignments)" % (
            max(rel["losses"], rel["lm_losses"]), max(rel["aux_losses"], rel["z_losses"]), tol_route, n_as),
        "ok" if good else "FAIL"), file=sys.stderr)
    ok = ok and good
print(json.dumps(out, indent=1))
sys.exit(0 if ok else 1)
PY
    return $bad
}
export -f stage_equiv

# stamp: every line prefixed with the seconds since the pipe opened ("  12s step 3/10 ..."),
# so a run killed by its box still says when setup ended and when each step came
stamp() {
    local t0=$SECONDS l
    while IFS= read -r l; do printf '%4ds %s\n' $((SECONDS - t0)) "$l"; done
}
export -f stamp

# speed_line NAME RC BATCH CONFIG: one RESULT line and $RES/speed/NAME.json, from the
# receipt when the run wrote one, else from its progress lines (a slow run), else
# "no step within the box" with the time of the log's last line
speed_line() {
    python3 - "$RES" "$1" "$2" "$3" "$4" <<'PY'
import json, os, re, statistics, sys
res, name, rc, batch, cfgp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cfg = json.load(open(cfgp))
B = batch or cfg.get("batch_size", 0)
tok_step = B * cfg.get("seq_len", 0)
log = open(os.path.join(res, "logs", "speed_%s.log" % name), errors="replace").read().splitlines()
rp = os.path.join(res, "receipts", "speed_%s.json" % name)
out = {"name": name, "exit": rc, "batch": B, "tokens_per_step": tok_step, "config": os.path.basename(cfgp)}
if rc == 0 and os.path.exists(rp):
    r = json.load(open(rp)); t = r["timing"]; g = r.get("gpu") or {}
    out.update(source="receipt", tokens_per_s=t["tokens_per_s"], mfu=t["mfu"],
               s_per_step=tok_step / t["tokens_per_s"] if t["tokens_per_s"] else None,
               steps_done=t.get("steps_run"), peak_flops_source=t.get("peak_flops_source"),
               runtime_mode=r["backend"].get("runtime_mode"), fallback_reason=r["backend"].get("fallback_reason"),
               device_used_peak_bytes=(g.get("memory") or {}).get("device_used_peak_bytes"),
               allocator_peak_bytes=(g.get("memory") or {}).get("allocator_peak_bytes"),
               op_profile_s_per_step=t.get("op_profile_s_per_step"),   # cuda receipts: once the backend times its ops
               op_profile_by_entry=t.get("op_profile_by_entry"),       # the same by table entry (largest first)
               cuda_graphs=g.get("cuda_graphs"))   # whether the step ran as CUDA graphs, and how much of it
    cg = out["cuda_graphs"] or {}
    print("RESULT %s: batch %s tok/s %.0f mfu %.3f %.3f s/step (%s) device-mem %.1f GiB fallback %s graphs %s" % (
        name, B, out["tokens_per_s"], out["mfu"], out["s_per_step"] or 0, out["runtime_mode"],
        (out["device_used_peak_bytes"] or 0) / 2**30, out["fallback_reason"],
        ("on (%s of %s segments, %s ops replayed per step)" % (cg.get("replayed_segments_per_step"),
         cg.get("segments_per_step"), cg.get("replayed_ops_per_step"))) if cg.get("ran") else
        ("off (%s)" % cg.get("why_not") if cg else "-")))
    op = out["op_profile_s_per_step"]
    if op and cg.get("ran"):
        # a replayed graph is timed as a whole: every op of it lands in "other"
        out["op_profile_s_per_step"] = out["op_profile_by_entry"] = None
        print("RESULT %s op profile: not split (CUDA graphs replayed the step; see %s_nographs)" % (name, name))
    elif op:
        print("RESULT %s op profile (s/step): %s" % (name, ", ".join("%s %.4f" % kv for kv in op.items())))
        ent = [e for e in out["op_profile_by_entry"] or [] if not e["name"].startswith("kernel:")]
        ker = [e for e in out["op_profile_by_entry"] or [] if e["name"].startswith("kernel:")]
        if ent:
            print("RESULT %s largest entries (s/step, calls/step): %s" % (name, ", ".join(
                "%s %.4f x%g" % (e["name"], e["s_per_step"], e["calls_per_step"]) for e in ent[:10])))
        if ker:   # MT_CUDA_KERNEL_PROFILE=1: every launch timed too
            print("RESULT %s largest kernels (s/step, launches/step): %s" % (name, ", ".join(
                "%s %.4f x%g" % (e["name"][7:], e["s_per_step"], e["calls_per_step"]) for e in ker[:16])))
    else:
        print("RESULT %s op profile: none in the receipt (timing.op_profile_s_per_step)" % name)
else:
    steps = []   # (stamp s, step, tok/s, mfu)
    for l in log:
        m = re.match(r"\s*(\d+)s step (\d+)/\d+ loss \S+ gnorm \S+ tok/s ([0-9.]+) mfu ([0-9.]+)(%?)", l)
        # mfu: a percentage since issue 32 ("mfu 44.71%"), a fraction in older logs
        if m: steps.append((int(m.group(1)), int(m.group(2)), float(m.group(3)),
                            float(m.group(4)) / (100.0 if m.group(5) else 1.0)))
    last = re.match(r"\s*(\d+)s", log[-1]) if log else None
    why = "box ran out" if rc in (124, 137) else "exit %d" % rc
    if steps:
        use = steps[1:] or steps   # the first step warms up
        tps = statistics.median(s[2] for s in use)
        out.update(source="progress", tokens_per_s=tps, mfu=statistics.median(s[3] for s in use),
                   s_per_step=tok_step / tps if tps else None, steps_done=len(steps), first_step_at_s=steps[0][0])
        print("RESULT %s: batch %s tok/s %.0f mfu %.3f %.2f s/step = %.3f steps/s (progress lines: %d steps, "
              "first at %ds; %s, no receipt)" % (name, B, tps, out["mfu"], out["s_per_step"] or 0,
              1 / out["s_per_step"] if out["s_per_step"] else 0, len(steps), steps[0][0], why))
    else:
        t_last = int(last.group(1)) if last else 0
        out.update(source="none", tokens_per_s=None, steps_done=0, last_line_at_s=t_last,
                   last_line=re.sub(r"^\s*\d+s ", "", log[-1])[:200] if log else "")
        print("RESULT %s: batch %s %s (%s; last line at %ds: %s)" % (
            name, B, "no step within the box" if rc in (124, 137) else "failed", why, t_last,
            out["last_line"][:80] if log else "no output"))
pp = os.path.join(res, "speed", name + ".plan.json")   # the planner's prediction of the same run
if os.path.exists(pp):
    try:
        c = json.load(open(pp))["cost"]
        out["plan"] = {k: c[k] for k in ("profile", "peak_basis", "efficiency", "step_s", "tokens_per_s", "mfu")}
        # two predictions: the GEMM ceiling (cost.step_s: every FLOP at the measured GEMM rate) and
        # the sum over op kinds (cost.by_kind: attention and the scan at their measured kernel
        # rates, the memory-bound ops at the measured bandwidth) when the profile has those rates
        bk = c.get("by_kind") or {}
        out["plan"]["by_kind_step_s"] = bk.get("step_s")
        out["plan"]["by_kind_seconds"] = bk.get("seconds")
        # where each rate came from (measured, a named proxy, or assumed: the GEMM rate)
        out["plan"]["bases"] = {k: bk.get(k) for k in ("attention_basis", "scan_basis", "gemm_grouped_basis")}
        ratio = lambda p: "%.1fx" % (out["s_per_step"] / p) if out.get("s_per_step") and p else "-"
        print("RESULT %s plan (profile %s, %s): %.3f s/step, %.0f tok/s at the GEMM ceiling; %s s/step by op kind; "
              "measured/plan %s the time (by op kind %s)" % (
            name, c["profile"], c["peak_basis"], c["step_s"], c["tokens_per_s"],
            "%.3f" % bk["step_s"] if bk.get("step_s") else "-", ratio(c["step_s"]), ratio(bk.get("step_s"))))
    except (ValueError, KeyError):
        pass
json.dump(out, open(os.path.join(res, "speed", name + ".json"), "w"), indent=1)
PY
}
export -f speed_line

# the card's measured planner profile: this call's calib stage, else
# bench/profiles/<card>-measured.json (h200-measured: the run of 2026-11-26)
plan_profile() {
    local card p
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
           awk '{ n = tolower($0); sub(/,.*/, "", n); sub(/^nvidia +/, "", n); split(n, w, " "); print w[1] }')
    for p in "$RES/$card-measured.json" "$ROOT/bench/profiles/$card-measured.json"; do
        [ -n "$card" ] && [ -f "$p" ] && { echo "$p"; return 0; }
    done
    return 1
}
export -f plan_profile

# speed_one NAME CONFIG "BATCH..." [FLAGS...]: precision=bf16, --no-save (no multi-GB final
# checkpoint inside the box), SPEED_STEPS steps (2 excluded from the receipt's tokens/s) in
# SPEED_BOX seconds; the next batch is tried only after a failure (OOM: exit 1, quickly), not
# after a run that ran out of its box (slow: its progress lines are the result)
SPEED_PREC="--set precision=bf16 --knob cuda_precision=bf16"
SPEED_THREADS=${GPU_SH_SPEED_THREADS:-$(nproc 2>/dev/null || echo 8)}
export SPEED_PREC SPEED_THREADS
speed_one() {
    local name=$1 cfg=$2 batches=$3 b rc setb a prev=""
    shift 3
    # every speed row's tokens (GPT-2's vocabulary), made once a call
    [ -f "$WORK/data50k.bin" ] || python3 "$ROOT/tests/make_shard.py" "$WORK/data50k.bin" 600000 50304 random >/dev/null
    # an A/B row whose knob a fallback already sets for every row would time its base row again
    for a in "$@"; do
        if [ "$prev" = --knob ] && [[ " ${SPEED_KNOBS:-} " == *" --knob ${a%%=*}="* ]]; then
            echo "RESULT $name: not run (its --knob $a is overridden by the fallback ${SPEED_KNOBS}: its base row's run)"
            return 0
        fi
        prev=$a
    done
    for b in $batches; do
        setb=""
        [ "$b" != 0 ] && setb="--set batch_size=$b"
        rm -rf "$WORK/sp_$name" "$RES/receipts/speed_$name.json"
        # every core for the host's part (the parameter init: a pure function per element,
        # filled on all OpenMP threads; the run's OMP_NUM_THREADS=8 left half the H100 box's
        # 16 idle: 7.2 s of d2048's 7.7 s to its first step, 12.6 s of moe8's 13.3, 2026-11-27)
        OMP_NUM_THREADS=$SPEED_THREADS timeout -k 5 "${SPEED_BOX:-60}" "$MT" train --config "$cfg" "$@" $setb \
            $SPEED_PREC ${SPEED_KNOBS:-} \
            --backend cuda --no-save \
            --data "$WORK/data50k.bin" --out "$WORK/sp_$name" --steps "${SPEED_STEPS:-10}" 2>&1 | stamp > "$RES/logs/speed_$name.log"
        rc=${PIPESTATUS[0]}
        [ $rc = 0 ] && cp "$WORK/sp_$name/receipt.json" "$RES/receipts/speed_$name.json"
        local prof
        rm -f "$RES/speed/$name.plan.json"
        # plan takes the run's --set and --knob flags (scan_bf16, head_bf16_logits, moe_sizes: the cost
        # model's kernels; the rest are the runtime's and change nothing in the plan)
        prof=$(plan_profile) &&
            "$MT" plan --config "$cfg" "$@" $setb --set precision=bf16 ${SPEED_KNOBS:-} --profile "$prof" --json \
            > "$RES/speed/$name.plan.json" 2> "$RES/logs/plan_$name.err" || rm -f "$RES/speed/$name.plan.json"
        speed_line "$name" "$rc" "$b" "$cfg" || echo "RESULT $name: batch $b exit $rc (speed_line failed)"
        [ $rc = 0 ] && return 0
        # out of its box: a measurement when steps came (slow, not failed), no smaller batch
        case $rc in 124|137) grep -qE '^ *[0-9]+s step [0-9]+/' "$RES/logs/speed_$name.log"; return $? ;; esac
    done
    return 1
}
export -f speed_one

stage_speed() {
    local bad=0 C=$ROOT/bench/configs
    # the ops stage's fallbacks (bench/gpu_fallbacks.py; GPU_SH_FALLBACKS=FILE: a given list):
    # after every row's own flags (an A/B row of the same knob is not run: speed_one)
    local fb=${GPU_SH_FALLBACKS:-$RES/speed_fallbacks.txt}
    SPEED_KNOBS=""
    if [ -s "$fb" ]; then
        SPEED_KNOBS=$(cut -f1 "$fb" | sed 's/^/--knob /' | tr '\n' ' ')
        echo "RESULT speed fallbacks (from the ops stage, every row below): $SPEED_KNOBS"
        [ "$fb" = "$RES/speed_fallbacks.txt" ] || cp "$fb" "$RES/speed_fallbacks.txt"
    fi
    export SPEED_KNOBS
    # boxes from the H200 run of 2026-11-26 (setup + 10 steps: d2048 0.71 s/step, GPT-2 0.26 s/step);
    # MoE and the hybrid did not finish one step in 65 s there: 3 steps, and a line whatever happens
    # (GPU_SH_SPEED_BOX=s: every run's box, for a check of the script)
    local o=${GPU_SH_SPEED_BOX:-}
    SPEED_BOX=${o:-60} speed_one d2048_dense "$C/gpu_d2048_dense.json" "0 2" || bad=1
    # bf16 attention A/B (issue 27 item 2): d2048 again with the v2 kernels (64 query rows a
    # block; v3 has 128, the same bits); every other run has the default attn_kernel=v3
    # (receipt gpu.attn_kernel); cuda_calib's attention rows have v1, v2 and v3 per shape
    SPEED_BOX=${o:-35} speed_one d2048_dense_attnv2 "$C/gpu_d2048_dense.json" "0 2" --knob attn_kernel=v2 || bad=1
    SPEED_BOX=${o:-40} speed_one c_gpt2 "$C/gpu_c_gpt2.json" "16 8 4" || bad=1
    # llm.c's own model size: c_gpt2's SwiGLU hidden 3072 makes 1.025 GFLOP a token, 1.26x
    # GPT-2 124M's (llm.c: GELU, 4d); SwiGLU at 8/3 d = 2048 has GPT-2's matmul parameters
    # (123.6M without the embedding) and 0.855 GFLOP a token: the like-for-like row for
    # the llm.c ratio (c_gpt2 stays, for the PyTorch peers and the earlier runs)
    SPEED_BOX=${o:-30} speed_one c_gpt2_124m "$C/gpu_c_gpt2_124m.json" "16 8 4" || bad=1
    SPEED_BOX=${o:-55} SPEED_STEPS=3 speed_one moe8 "$C/gpu_moe8.json" "0" || bad=1
    # the expert sizes A/B (issue 28 item 2, knob moe_sizes): moe8 above keeps the per-expert
    # counts on the device (gemm_grouped.cu's grouped GEMMs, no host read, so CUDA graphs);
    # here the host read and one cuBLASLt matmul per expert (eager: its per-op profile)
    SPEED_BOX=${o:-45} SPEED_STEPS=3 speed_one moe8_hostsizes "$C/gpu_moe8.json" "0" --knob moe_sizes=host || bad=1
    SPEED_BOX=${o:-55} SPEED_STEPS=3 speed_one hyb2048 "$C/gpu_d2048_dense.json" "0" --set pattern=MAMAMAMAMAMAMAMA || bad=1
    # CUDA graphs A/B (issue 27 item 4): every run above has them on (the default on one GPU;
    # the RESULT line says whether they ran); each graphed model again with them off: the A/B,
    # and the per-op profile (a replayed graph is timed as a whole: its ops all land in "other")
    SPEED_BOX=${o:-40} speed_one c_gpt2_nographs "$C/gpu_c_gpt2.json" "16 8 4" --knob cuda_graphs=0 || bad=1
    SPEED_BOX=${o:-40} speed_one d2048_dense_nographs "$C/gpu_d2048_dense.json" "0 2" --knob cuda_graphs=0 || bad=1
    # ... and the hybrid's eager run times every kernel too (MT_CUDA_KERNEL_PROFILE=1: kernel:NAME
    # entries, ~2-4 us a launch, so its graphs A/B reads ~1-2% low): which scan / prep kernel is slow
    SPEED_BOX=${o:-40} SPEED_STEPS=3 MT_CUDA_KERNEL_PROFILE=1 speed_one hyb2048_nographs "$C/gpu_d2048_dense.json" "0" \
        --set pattern=MAMAMAMAMAMAMAMA --knob cuda_graphs=0 || bad=1
    # the scan's chunk A/B (issue 28 item 3): the chunked form's intra-chunk products grow
    # with the chunk Q, its passes between chunks with T/Q; the H100 run of 2026-11-27
    # measured only the default 64 (scan 0.196 s of the hybrid's 0.382 s step)
    SPEED_BOX=${o:-30} SPEED_STEPS=3 speed_one hyb2048_chunk32 "$C/gpu_d2048_dense.json" "0" \
        --set pattern=MAMAMAMAMAMAMAMA --set mamba_chunk=32 || bad=1
    SPEED_BOX=${o:-30} SPEED_STEPS=3 speed_one hyb2048_chunk128 "$C/gpu_d2048_dense.json" "0" \
        --set pattern=MAMAMAMAMAMAMAMA --set mamba_chunk=128 || bad=1
    # the scan on tensor cores A/B (ssd_tc.cu, knob scan_bf16; every hybrid row above runs
    # it): the same hybrid with the fp32 scan kernels, as the H100 run of 2026-11-27 ran it
    SPEED_BOX=${o:-30} SPEED_STEPS=3 speed_one hyb2048_scanfp32 "$C/gpu_d2048_dense.json" "0" \
        --set pattern=MAMAMAMAMAMAMAMA --knob scan_bf16=0 || bad=1
    return $bad
}
export -f stage_speed

# The wgmma attention (attn_kernel=v4, or v5: v4 reading its operands MN-major) end to end, each
# row once this call's calib says the kernel is right, forward and backward, at the row's head
# dim: d2048 (hd 128, against the default v3's d2048_dense: the A/B that decides the default) and
# GPT-2 124M (hd 64, against c_gpt2_124m: the llm.c row, where the pipelined forward's 1 block an
# SM may lose to v3's 2). Of v4 and v5, the one calib timed faster forward + backward among those
# right there (v4 on a tie; the row is d2048_dense_attnv4 or _attnv5, the budget has one row a
# head dim); neither right: SKIPPED with the reasons
attnwg_pick() {   # attnwg_pick HD: "v4" or "v5" (the kernel to run), else "SKIP reason"
    python3 - "$RES/calib.json" "$1" <<'PY'
import json, sys
c, hd = json.load(open(sys.argv[1])), int(sys.argv[2])
best, why = None, []
for kv in ("v4", "v5"):
    rows = [x for x in c.get("attention_" + kv) or [] if x.get("hd") == hd]
    if not rows:
        why.append("no attention_%s row at hd %d" % (kv, hd))
    elif not all(x.get("ok") and x.get("bwd_ok") for x in rows):
        why.append("%s not right at hd %d (%s)" % (kv, hd, "; ".join(
            "fwd %s bwd %s, status %s" % (x.get("ok"), x.get("bwd_ok"), x.get("status")) for x in rows)))
    else:
        t = sum(x[kv + "_fwd_median_s"] + x[kv + "_bwd_median_s"] for x in rows)
        if best is None or t < best[1]: best = (kv, t)
print(best[0] if best else "SKIP " + "; ".join(why))
PY
}
export -f attnwg_pick
stage_attnv4() {
    if [ ! -f "$RES/calib.json" ]; then
        echo "SKIPPED (attnv4: no calib.json from this call: the calib stage did not run)"; return 77
    fi
    local k128 k64 bad=0
    k128=$(attnwg_pick 128)
    k64=$(attnwg_pick 64)
    case "$k128" in v4|v5) ;; SKIP*) echo "SKIPPED (attn wgmma d2048: ${k128#SKIP })" ;;
        *) echo "SKIPPED (attn wgmma d2048: no pick from calib.json: '$k128')"; k128="SKIP" ;; esac
    case "$k64" in v4|v5) ;; SKIP*) echo "SKIPPED (attn wgmma GPT-2: ${k64#SKIP })" ;;
        *) echo "SKIPPED (attn wgmma GPT-2: no pick from calib.json: '$k64')"; k64="SKIP" ;; esac
    # the MoE experts' products on wgmma (knob grouped_gemm_kernel=wgmma, gemm_grouped_wg.cu), the A/B
    # against moe8 (mma.sync), when this call's calib checked and timed its three wgmma rows (wgmma runs
    # on this card) and each matched the mma.sync result (a wrong kernel's speed is no number)
    local gw=1
    python3 -c "import json, sys; w = json.load(open(sys.argv[1])).get('grouped_wgmma') or []
sys.exit(not (len(w) == 3 and all(r.get('ok') is True for r in w)))" "$RES/calib.json" || gw=0
    [ $gw -eq 1 ] || echo "SKIPPED (moe8_ggwgmma: calib has no three wgmma grouped rows that match mma.sync's result)"
    # no row: skipped (the lines say why)
    case "$k128" in SKIP*) case "$k64" in SKIP*) [ $gw -eq 0 ] && return 77 ;; esac ;; esac
    case "$k128" in v4|v5)
        SPEED_KNOBS="" SPEED_BOX=${GPU_SH_SPEED_BOX:-50} speed_one "d2048_dense_attn$k128" \
            "$ROOT/bench/configs/gpu_d2048_dense.json" "0 2" --knob "attn_kernel=$k128" || bad=1 ;;
    esac
    case "$k64" in v4|v5)
        SPEED_KNOBS="" SPEED_BOX=${GPU_SH_SPEED_BOX:-35} speed_one "c_gpt2_124m_attn$k64" \
            "$ROOT/bench/configs/gpu_c_gpt2_124m.json" "16 8 4" --knob "attn_kernel=$k64" || bad=1 ;;
    esac
    if [ $gw -eq 1 ]; then
        SPEED_KNOBS="" SPEED_BOX=${GPU_SH_SPEED_BOX:-45} SPEED_STEPS=3 speed_one moe8_ggwgmma \
            "$ROOT/bench/configs/gpu_moe8.json" "0" --knob grouped_gemm_kernel=wgmma || bad=1
    fi
    return $bad
}
export -f stage_attnv4

# Muon, the default optimizer (the speed configs are AdamW): its Newton-Schulz in bf16, batched
# over same-shape matrices (muon.c; until the twenty-third session fp32 CUDA cores, ~1.0 s a d2048
# step), timed against the plan: d2048 0.195 s a step on the H100 profile, optimizer 0.084 s (its
# matrices 4 or 1 a batch: GEMM-bound); GPT-2 124M 0.040 s, optimizer 0.005 s (84 matrices of 768
# rows, 28 or 10 a batch: there the launches the plan does not price would show). The receipt's
# per-op profile files the whole update under optimizer. Last, so a short budget loses it first.
stage_muon() {
    local bad=0
    SPEED_KNOBS="" SPEED_BOX=${GPU_SH_SPEED_BOX:-45} SPEED_STEPS=4 speed_one d2048_muon \
        "$ROOT/bench/configs/gpu_d2048_dense.json" "0 2" --set optimizer=muon || bad=1
    SPEED_KNOBS="" SPEED_BOX=${GPU_SH_SPEED_BOX:-30} SPEED_STEPS=6 speed_one c_gpt2_124m_muon \
        "$ROOT/bench/configs/gpu_c_gpt2_124m.json" "16 8" --set optimizer=muon || bad=1
    return $bad
}
export -f stage_muon

stage_torch() {
    python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || { echo "SKIPPED (torch: no CUDA torch)"; return 77; }
    : > "$RES/torch.jsonl"
    local c mode line bad=0
    # every eager run first (~15 s each with the import), then the compiled ones (~33 s of
    # compiling per model on the H200, 2026-11-26, ~50 s each in all): a box that runs out
    # loses compiled runs, not the eager baselines; d2048 first in each mode, the issue's MFU shape
    # the hybrid (speed's hyb2048: gpu_d2048_dense.json with pattern=MAMA...; torch_gpu.py's
    # HybridModel, the scan in chunked SSD form) as its own config file, named so that the
    # summary pairs it with the speed run hyb2048
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["pattern"]="MAMAMAMAMAMAMAMA"; json.dump(c,open(sys.argv[2],"w"))' \
        "$ROOT/bench/configs/gpu_d2048_dense.json" "$WORK/gpu_hyb2048.json"
    # the hybrid's peer model is checked before it is timed: the chunked scan vs the
    # recurrence and the mixer vs tests/mamba3_ref.py (CPU, float64, a few seconds)
    if python3 "$ROOT/bench/torch_gpu.py" --check > "$RES/logs/torch_hybrid_check.log" 2>&1; then
        echo "RESULT torch hybrid check: $(grep -c '^PASS' "$RES/logs/torch_hybrid_check.log") checks passed"
    else
        echo "RESULT torch hybrid check: FAILED ($(grep -m1 '^FAIL' "$RES/logs/torch_hybrid_check.log"))"
        bad=1
    fi
    for mode in eager compiled; do
        for c in gpu_d2048_dense gpu_c_gpt2 gpu_moe8 gpu_hyb2048; do
            local flag=""; [ $mode = compiled ] && flag=--compile
            # the batch meshtrain ran with (its receipt), so tokens/s compare like for like
            local cfg=$ROOT/bench/configs/$c.json
            [ $c = gpu_hyb2048 ] && cfg=$WORK/gpu_hyb2048.json
            local rcpt=$RES/receipts/speed_${c#gpu_}.json
            if [ -f "$rcpt" ]; then
                python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); r=json.load(open(sys.argv[2]))
c["batch_size"]=r.get("config",{}).get("batch_size",c["batch_size"]); json.dump(c,open(sys.argv[3],"w"))' \
                    "$cfg" "$rcpt" "$WORK/$c.b.json" 2>/dev/null && mv "$WORK/$c.b.json" "$WORK/$c.json" && cfg=$WORK/$c.json
            fi
            local box=45
            [ $mode = compiled ] && box=100 && { [ $c = gpu_moe8 ] || [ $c = gpu_hyb2048 ]; } && box=120
            line=$(timeout -k 5 $box python3 "$ROOT/bench/torch_gpu.py" "$cfg" $flag --steps 10 2>"$RES/logs/torch_${c}_$mode.err" | tail -1)
            [ -n "$line" ] || line="{\"config\": \"$c.json\", \"mode\": \"$mode\", \"error\": \"timeout or crash (see logs/torch_${c}_$mode.err)\"}"
            echo "$line" >> "$RES/torch.jsonl"
            echo "RESULT torch $c $mode: $(echo "$line" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r.get("error") or "%.0f tok/s" % r["tokens_per_s"])' 2>/dev/null)"
            echo "$line" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); sys.exit(0 if r.get("tokens_per_s") and not r.get("error") else 1)' \
                2>/dev/null || bad=1
        done
    done
    # a run without a number (error, timeout) or a failed peer check fails the stage: the
    # H100 run of 2026-11-26 reported "PASS torch" with every row an error
    return $bad
}
export -f stage_torch

stage_llmc() {
    [ -n "${LLMC_BUILD_PID:-}" ] || { echo "SKIPPED (llmc: no snapshot in gpu_carry/ or no GPU)"; return 77; }
    while kill -0 "$LLMC_BUILD_PID" 2>/dev/null; do sleep 2; done
    local exe=$WORK/llmc/llm.c/train_gpt2cu
    [ -x "$exe" ] || { tail -5 "$RES/logs/llmc_build.log"; echo "RESULT llmc: build failed"; return 1; }
    cd "$WORK/llmc/llm.c" || return 1
    local b
    # -v/-s (val and sample intervals) above the step count: 0 divides by zero in
    # train_gpt2.cu (step % val_loss_every: SIGFPE on the H200, 2026-11-26)
    for b in 16 8; do
        if timeout -k 5 45 "$exe" -e d12 -b $b -t 1024 -x 20 -v 1000 -s 1000 -h 0 \
                -i dev/data/tinyshakespeare/tiny_shakespeare_train.bin -j dev/data/tinyshakespeare/tiny_shakespeare_val.bin \
                > "$RES/logs/llmc_run.log" 2>&1; then
            echo "RESULT llmc b=$b: $(grep -E 'step +20/' "$RES/logs/llmc_run.log" | tail -1)"
            return 0
        fi
    done
    tail -3 "$RES/logs/llmc_run.log"; return 1
}
export LLMC_BUILD_PID
export -f stage_llmc

# hf: issue 20 item 5. The exporter's HF-runnable configs only: dense (Qwen3) and
# the plain MoE (Qwen3-MoE; a shared expert or softcap export only with
# --allow-lossy, which transformers cannot run; the hybrid's MeshtrainHybrid is
# not a transformers class). Same tiny configs and ids as tests/test_hf_roundtrip.sh.
stage_hf() {
    [ -f "$WORK/tiny.bin" ] ||
        python3 "$ROOT/tests/make_shard.py" "$WORK/tiny.bin" 20000 64 pattern >/dev/null || return 1
    local TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16"
    TINY="$TINY --set batch_size=4 --set lr=0.01 --set warmup_steps=2 --set rope_theta=500"
    local MOE="--set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=16"
    MOE="$MOE --set aux_loss_coef=0.02 --set z_loss_coef=0.003"
    local IDS="3,17,42,5,63,0,8,8,21,34,55,1,2,9,30,12,7,44,61,18"
    local CB=$MT
    [ $HAVE_GPU = 0 ] && [ -n "$EMU" ] && CB=$EMU && echo "NOTE: cuda runs under the CPU emulator ($EMU)"
    local bad=0 skip=0 cfg X d log rc
    for cfg in dense moe; do
        case $cfg in dense) X="" ;; moe) X=$MOE ;; esac
        d=$WORK/hf_$cfg log=$RES/logs/hf_$cfg.log
        if ! MT_CUDA_PRECISION=fp32 "$CB" train $TINY $X --backend cuda --peak-flops 1e11 --quiet \
                --data "$WORK/tiny.bin" --out "$d" --steps "$EQ_STEPS" > "$log" 2>&1 ||
           ! "$MT" export --ckpt "$d" --out "$d.hf" >> "$log" 2>&1 ||
           ! MT_CUDA_PRECISION=fp32 "$CB" logits --backend cuda --ckpt "$d" --ids "$IDS" --out "$d.cuda.st" \
                >> "$log" 2>&1 ||
           ! "$MT" logits --backend cpu --ckpt "$d" --ids "$IDS" --out "$d.cpu.st" >> "$log" 2>&1; then
            echo "RESULT hf $cfg: meshtrain train/export/logits failed ($(tail -1 "$log"))"; bad=1; continue
        fi
        cp "$d/receipt.json" "$RES/receipts/hf_$cfg.json"
        python3 "$ROOT/bench/hf_logits_gpu.py" --name "$cfg" --ids "$IDS" --hf "$d.hf" --cuda "$d.cuda.st" \
            --cpu "$d.cpu.st" --json "$RES/hf_$cfg.json"
        rc=$?
        case $rc in 0) ;; 77) skip=1 ;; *) bad=1 ;; esac
    done
    [ $bad = 1 ] && return 1
    [ $skip = 1 ] && return 77
    return 0
}
export -f stage_hf

# ncu: Nsight Compute on one launch of each kernel the step spends most in (the bf16
# attention: v2/v3's and v4's wgmma kernels, the chunked scan, the optimizer, the gradient
# marks, the MoE experts' grouped GEMMs gg_rows_k / gg_sum_k), from cuda_calib's attention, scan and grouped rows:
# achieved vs theoretical occupancy, SM and memory throughput per kernel, so the next
# kernel work starts from the bottleneck, not a guess (the H100 run of
# 2026-11-27: attention bf16 135 TF/s, the scan 2.1 TF/s, and no counter to say why);
# and the counters the emulator models (docs/cuda.md "The CPU emulator"): shared-memory
# wavefronts and bank conflicts (ld, st), global sectors and requests (ld, st), to set
# beside MT_EMU_BANKS / MT_EMU_COALESCE's counts of the same kernels (a disagreement is
# an emulator bug to chase).
# SKIPPED without ncu in the image or without permission for the GPU's counters.
stage_ncu() {
    local cal=$BIN/cuda_calib NCU
    NCU=$(command -v ncu 2>/dev/null || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$NCU" ] && [ -x "$NCU" ] || { echo "SKIPPED (ncu: not in this image)"; return 77; }
    [ -x "$cal" ] || { echo "SKIPPED (ncu: no cuda_calib carried)"; return 77; }
    local kernels="attn_v2|attn_wg|ssd_|adamw_multi|nonfinite_mark|ang_scan|gg_rows|gg_sum"
    local NCU_METRICS=l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum m
    for m in l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \
             l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
             l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum \
             l1tex__t_requests_pipe_lsu_mem_global_op_st.sum; do
        NCU_METRICS=$NCU_METRICS,$m
    done
    timeout -k 5 100 "$NCU" --kernel-name "regex:$kernels" --launch-count 64 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --metrics "$NCU_METRICS" \
        "$cal" --reps 1 --warmup 0 --gemm 256x256x256 --attn 4x2048x16x128 --scan 4x2048x64x64x64x64 \
        --allreduce-mib 1 > "$RES/logs/ncu.txt" 2>&1
    local rc=$?
    if grep -q "ERR_NVGPUCTRPERM" "$RES/logs/ncu.txt"; then
        echo "SKIPPED (ncu: no permission for the GPU's performance counters)"; return 77
    fi
    python3 - "$RES/logs/ncu.txt" <<'PY'
import re, sys
# ncu's text report: a kernel's header line "  name(args) (gx, gy, gz)x(bx, by, bz), Context .."
# then "    Metric Name   Unit   Value" rows; one RESULT line per kernel launch
want = {"Duration": "dur", "Compute (SM) Throughput": "sm%", "Memory Throughput": "mem%",
        "Achieved Occupancy": "occ%", "Theoretical Occupancy": "theo%", "Registers Per Thread": "regs",
        "Dynamic Shared Memory Per Block": "dsmem",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "sh_ld_wf",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "sh_st_wf",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "sh_ld_conf",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "sh_st_conf",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "gld_sec",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "gld_req",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "gst_sec",
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "gst_req"}
cur, rows = None, []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^  (\S[^(]*?)(?:<[^>]*>)?\(.*\) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", line)
    if m:
        cur = {"kernel": re.sub(r"^void ", "", m.group(1).strip()),
               "grid": "%sx%sx%s" % m.group(2, 3, 4), "block": "%sx%sx%s" % m.group(5, 6, 7)}
        rows.append(cur)
        continue
    if cur is None:
        continue
    for k, short in want.items():
        m = re.match(r"^\s+%s\s+(?:(\S+)\s+)?([\d.,]+)\s*$" % re.escape(k), line)
        if m and short not in cur:
            u = m.group(1) or ""
            cur[short] = m.group(2).replace(",", "") + ("" if u in ("", "%", "register/thread", "byte/block") else " " + u)
for r in rows:
    print("RESULT ncu %s: %s" % (r["kernel"], ", ".join("%s %s" % (k, r[k]) for k in
          ("dur", "sm%", "mem%", "occ%", "theo%", "regs", "dsmem", "block", "grid", "sh_ld_wf", "sh_ld_conf",
           "sh_st_wf", "sh_st_conf", "gld_sec", "gld_req", "gst_sec", "gst_req") if k in r)))
if not rows:
    print("RESULT ncu: no kernel in the report (see logs/ncu.txt)")
    sys.exit(1)
PY
    local prc=$?
    [ $rc -eq 0 ] && [ $prc -eq 0 ]
}
export -f stage_ncu

stage_calib() {
    local cal=$BIN/cuda_calib
    [ -x "$BIN/cuda_calib_nccl" ] && cal=$BIN/cuda_calib_nccl   # one-rank NCCL all-reduce; else self_dev (none)
    [ -x "$cal" ] || { echo "SKIPPED (calib: no cuda_calib carried: bash bench/gpu.sh prepare)"; return 77; }
    echo "calib binary: $cal"
    "$cal" --out "$RES/calib.json" > "$RES/logs/calib_stdout.json" 2> "$RES/logs/calib.err"
    local rc=$?
    [ $rc -eq 0 ] || { tail -5 "$RES/logs/calib.err"; echo "RESULT calib: cuda_calib exit $rc"; return 1; }
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits | head -1 > "$RES/logs/calib_smi.csv"
    # named after the card that ran: "NVIDIA H200 ..." -> h200-measured (an H100 or an H200 is lent)
    local pname
    pname=$(awk -F, 'NR == 1 { n = tolower($1); sub(/^nvidia +/, "", n); split(n, w, " ");
                               print (w[1] ~ /^[a-z0-9]+$/ ? w[1] : "gpu") "-measured" }' "$RES/logs/calib_smi.csv")
    python3 "$ROOT/bench/profiles/gpu_profile.py" "$RES/calib.json" --smi "$RES/logs/calib_smi.csv" \
        --name "$pname" --out "$RES/$pname.json" ||
        { echo "RESULT calib: gpu_profile.py failed"; return 1; }
    # the profile loads in the planner (bench/configs/gpu_d2048_dense.json on 8 ranks)
    "$MT" plan --config "$ROOT/bench/configs/gpu_d2048_dense.json" --set batch_size=32 --world 8 --mesh dp=8 \
        --profile "$RES/$pname.json" > "$RES/logs/calib_plan.txt" 2>&1 ||
        { tail -3 "$RES/logs/calib_plan.txt"; echo "RESULT calib: meshtrain plan refused the profile"; return 1; }
    python3 - "$RES/calib.json" "$RES/$pname.json" <<'PY'
import json, sys
c, p = (json.load(open(x)) for x in sys.argv[1:3])
g, ar = c["gemm_best_flop_per_s"], c["allreduce"]
arw = "%.1f GB/s (one rank, %s)" % (ar["best_algbw_bytes_per_s"] / 1e9, ar["comm"]) if ar.get("available") \
    else "n/a (%s: no NCCL in this build)" % ar.get("comm")
print("RESULT calib: gemm bf16 %.1f TF/s, fp32 %.1f TF/s, attention fp32 %.1f TF/s, bf16 (tensor cores) %.1f TF/s, "
      "allreduce %s; profile efficiency %.3f"
      % (g["bf16"] / 1e12, g["fp32"] / 1e12, c["attention_best_fwd_bwd_flop_per_s"] / 1e12,
         (c.get("attention_bf16_best_fwd_bwd_flop_per_s") or 0) / 1e12, arw, p["efficiency"]))
# the Mamba-3 scan (FLOPs as the recurrence) and an M layer's core vs an A layer's at the same B, T
for s in c.get("scan") or []:
    print("RESULT calib scan %dx%dx%dx%dx%d chunk %d %s: fwd %.4f s, bwd %.4f s, %.2f TF/s (recurrence FLOPs)"
          % (s["b"], s["t"], s["h"], s["p"], s["n"], s["chunk"], s.get("precision", "fp32"), s["fwd_median_s"],
             s["bwd_median_s"], s["fwd_bwd_flop_per_s"] / 1e12))
# the MoE experts' products: the device-sized grouped entries vs a gemm_bf16 per group (moe_sizes)
for x in c.get("grouped") or []:
    print("RESULT calib grouped %s %s bn %d %dx%d rows, d %d f %d: grouped %.1f TF/s (%.3f ms), "
          "loop %.1f TF/s (%.3f ms)"
          % (x["kind"], x.get("kernel", "mma"), x.get("bn", 128), x["groups"], x["rows_per_group"], x["d"], x["f"],
             x["grouped_flop_per_s"] / 1e12, 1e3 * x["grouped_median_s"], x["loop_flop_per_s"] / 1e12,
             1e3 * x["loop_median_s"]))
for x in c.get("grouped_wgmma") or []:   # checked against mma.sync's result first, timed only when right
    print("RESULT calib grouped %s wgmma bn 256 %dx%d rows, d %d f %d: %s (max rel vs mma %.2e), %.1f TF/s (%.3f ms)"
          % (x["kind"], x["groups"], x["rows_per_group"], x["d"], x["f"],
             "ok" if x["ok"] else "WRONG (%s)" % x["status"], x["max_rel_vs_mma"],
             x["grouped_flop_per_s"] / 1e12, 1e3 * x["grouped_median_s"]))
# the wgmma probe (wgmma_probe.cu): checked against cuBLAS first; its rate beside cuBLAS's
for x in c.get("wgmma") or []:
    print("RESULT calib wgmma %dx%dx%d A %s %s-major, B %s-major: %s, max rel vs cuBLAS %.2e, wgmma %.1f TF/s, "
          "cuBLAS %.1f TF/s"
          % (x["m"], x["n"], x["k"], x.get("a", "shared"), x.get("a_major", "k").upper(),
             x.get("b_major", "k").upper(), "ok" if x["ok"] else "WRONG (%s)" % x["status"],
             x["max_rel_vs_cublas"],
             x["wgmma_flop_per_s"] / 1e12, x["cublas_flop_per_s"] / 1e12))
# forward and backward apart: a wrong dK/dV cannot hide a right forward; v5 = v4 with MN-major operands
for kv in ("v4", "v5"):
    for x in c.get("attention_" + kv) or []:
        print("RESULT calib attention %s (wgmma) B %d T %d H %d hd %d: fwd %s, max rel vs v3 %.2e, %s %.1f TF/s, "
              "v3 %.1f TF/s; bwd %s, max rel vs v3 %.2e, %s %.1f TF/s, v3 %.1f TF/s"
              % (kv, x["b"], x["t"], x["h"], x["hd"], "ok" if x["ok"] else "WRONG (%s)" % x["status"],
                 x["max_rel_vs_v3"], kv, x[kv + "_fwd_flop_per_s"] / 1e12, x["v3_fwd_flop_per_s"] / 1e12,
                 "ok" if x.get("bwd_ok") else "WRONG (%s)" % x["status"], x.get("bwd_max_rel_vs_v3", -1), kv,
                 x.get(kv + "_bwd_flop_per_s", 0) / 1e12, x.get("v3_bwd_flop_per_s", 0) / 1e12))
for x in c.get("attention_order") or []:   # attn_sched.cuh's block order against the one before it
    print("RESULT calib attention order (v3) B %d T %d H %d hd %d: %s, fwd %.3f ms (one-pair groups %.3f), "
          "bwd %.3f ms (%.3f): %.3fx the old order's fwd+bwd time"
          % (x["b"], x["t"], x["h"], x["hd"], "same bits" if x["same_bits"] else "BITS DIFFER (%s)" % x["status"],
             1e3 * x["fwd_median_s"], 1e3 * x["fwd_median_s_one_pair_groups"], 1e3 * x["bwd_median_s"],
             1e3 * x["bwd_median_s_one_pair_groups"],
             (x["fwd_median_s"] + x["bwd_median_s"]) / max(x["fwd_median_s_one_pair_groups"] +
                                                           x["bwd_median_s_one_pair_groups"], 1e-30)))
for x in c.get("layer_core") or []:
    print("RESULT calib layer core B %d T %d: scan %s fp32 %.4f s, bf16 %.4f s vs attention %s fp32 %.4f s, bf16 %.4f s "
          "(scan/attention, bf16 both: %.2f)"
          % (x["b"], x["t"], x["scan"], x["scan_fwd_bwd_s"], x.get("scan_bf16_fwd_bwd_s", x["scan_fwd_bwd_s"]),
             x["attention"], x["attention_fp32_fwd_bwd_s"], x["attention_bf16_fwd_bwd_s"], x["scan_over_attention_bf16"]))
PY
}
export -f stage_calib

stage_summary() {
    python3 - "$RES" <<'PY'
import json, os, re, sys
res = sys.argv[1]
S = {"stages": open(os.path.join(res, "stages.txt")).read().splitlines()}
sp = {}
# one file per speed run (stage_speed's speed_line): from its receipt, else its progress lines
# (in stage_speed's order; a run missing from this list still comes, after them)
order = ["d2048_dense", "d2048_dense_attnv2", "d2048_dense_attnv4", "d2048_dense_attnv5",
         "c_gpt2", "c_gpt2_124m", "c_gpt2_124m_attnv4", "c_gpt2_124m_attnv5",
         "moe8", "moe8_hostsizes", "moe8_ggwgmma", "hyb2048",
         "c_gpt2_nographs", "d2048_dense_nographs", "hyb2048_nographs", "hyb2048_chunk32", "hyb2048_chunk128",
         "hyb2048_scanfp32", "d2048_muon", "c_gpt2_124m_muon"]
sd = os.path.join(res, "speed")
found = sorted(f[:-5] for f in os.listdir(sd) if f.endswith(".json")) if os.path.isdir(sd) else []
for n in [n for n in order if n in found] + [n for n in found if n not in order]:
    sp[n] = json.load(open(os.path.join(sd, n + ".json")))
tp = os.path.join(res, "torch.jsonl")
for line in (open(tp).read().splitlines() if os.path.exists(tp) else []):
    try: r = json.loads(line)
    except ValueError: continue
    n = r.get("config", "").replace("gpu_", "").replace(".json", "")
    if n in sp and r.get("tokens_per_s") and sp[n].get("tokens_per_s"):
        sp[n]["torch_%s_tokens_per_s" % r["mode"]] = r["tokens_per_s"]
        sp[n]["ratio_vs_torch_%s" % r["mode"]] = sp[n]["tokens_per_s"] / r["tokens_per_s"]
lp = os.path.join(res, "logs", "llmc_run.log")
if os.path.exists(lp):
    text = open(lp).read()
    toks = [float(m) for m in re.findall(r"\| *([0-9.]+) tok/s", text)]
    mfus = [float(m) / 100 for m in re.findall(r"\| *([0-9.]+)% bf16 MFU", text)]
    med = lambda v: sorted(v[2:] or v)[len(v[2:] or v) // 2]
    if toks:
        S["llmc_tokens_per_s"] = med(toks)
    if mfus:
        S["llmc_mfu"] = med(mfus)
    # tokens/s against llm.c's, and MFU against its MFU (its own FLOP count): c_gpt2 runs
    # 1.26x the FLOPs a token of llm.c's GPT-2, c_gpt2_124m about the same
    for n in ("c_gpt2", "c_gpt2_124m"):
        if sp.get(n, {}).get("tokens_per_s") and "llmc_tokens_per_s" in S:
            sp[n]["ratio_vs_llmc"] = sp[n]["tokens_per_s"] / S["llmc_tokens_per_s"]
        if sp.get(n, {}).get("mfu") and S.get("llmc_mfu"):
            sp[n]["mfu_ratio_vs_llmc"] = sp[n]["mfu"] / S["llmc_mfu"]
S["speed"] = sp
# the device that ran, from the first receipt of this call (every meshtrain run keeps one)
rdir = os.path.join(res, "receipts")
for name in sorted(os.listdir(rdir)) if os.path.isdir(rdir) else []:
    try: r = json.load(open(os.path.join(rdir, name)))
    except ValueError: continue
    g = r.get("gpu") or {}
    if g:
        S["device"] = {k: g.get(k) for k in ("device", "uuid", "pci_bus_id", "compute_capability", "sm_count",
                                              "driver_version", "runtime_version", "cublas_version", "ecc_enabled",
                                              "sm_clock_peak_khz", "mem_bandwidth_peak_bytes_per_s", "emulated")}
        S["device"]["comm_libraries"] = (r.get("distributed") or {}).get("comm_libraries")
        S["device"]["meshtrain_build"] = (r.get("build") or {}).get("git")
        S["device"]["from_receipt"] = name
        break
fbp = os.path.join(res, "speed_fallbacks.txt")   # the ops stage's fallbacks (bench/gpu_fallbacks.py)
fbl = [l.split("\t") for l in (open(fbp).read().splitlines() if os.path.exists(fbp) else []) if l.strip()]
if fbl:
    S["speed_fallbacks"] = [k[0] for k in fbl]
json.dump(S, open(os.path.join(res, "summary.json"), "w"), indent=1)
with open(os.path.join(res, "summary.md"), "w") as f:
    f.write("# bench/gpu.sh results\n\n")
    if "device" in S:
        f.write("Device: %s\n\n" % ", ".join("%s %s" % kv for kv in S["device"].items()))
    f.write("## Stages\n\n")
    for s in S["stages"]: f.write("- %s\n" % s)
    f.write("\n## Speed (meshtrain precision=bf16, torch bf16 autocast)\n\n")
    if fbl:
        f.write("**Every meshtrain row below ran with fallbacks** (a kernel family failed the ops stage): %s\n\n"
                % "; ".join("`--knob %s` (%s)" % (k[0], k[1] if len(k) > 1 else "") for k in fbl))
    f.write("| config | batch | meshtrain tok/s | MFU | s/step | from | plan s/step (GEMM ceiling / by op kind) | torch eager | torch compiled "
            "| llm.c | vs eager | vs compiled | vs llm.c | MFU vs llm.c's |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for n, v in sp.items():
        fm = lambda k, f="%.2f": f % v[k] if v.get(k) is not None else "-"
        fr = {"receipt": "receipt", "progress": "progress (%s steps, box ran out)" % v.get("steps_done"),
              "none": "no step in the box"}.get(v.get("source"), "?")
        llmc = "%.0f" % S["llmc_tokens_per_s"] if n in ("c_gpt2", "c_gpt2_124m") and "llmc_tokens_per_s" in S else "-"
        pl = "%.3f / %s (%s)" % (v["plan"]["step_s"], "%.3f" % v["plan"]["by_kind_step_s"]
                                 if v["plan"].get("by_kind_step_s") else "-", v["plan"]["profile"]) if v.get("plan") else "-"
        f.write("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
            n, v.get("batch"), fm("tokens_per_s", "%.0f"), fm("mfu", "%.3f"), fm("s_per_step", "%.3f"), fr, pl,
            fm("torch_eager_tokens_per_s", "%.0f"), fm("torch_compiled_tokens_per_s", "%.0f"), llmc,
            fm("ratio_vs_torch_eager"), fm("ratio_vs_torch_compiled"), fm("ratio_vs_llmc"), fm("mfu_ratio_vs_llmc")))
    ents = {n: v["op_profile_by_entry"] for n, v in sp.items() if v.get("op_profile_by_entry")}
    if ents:
        f.write("\n## Largest table entries of each profiled run (s/step x calls/step, receipt timing.op_profile_by_entry)\n\n")
        for n, ent in ents.items():
            tab = [e for e in ent if not e["name"].startswith("kernel:")]
            ker = [e for e in ent if e["name"].startswith("kernel:")]   # MT_CUDA_KERNEL_PROFILE=1 runs
            f.write("- %s: %s\n" % (n, ", ".join("%s %.4f x%g" % (e["name"], e["s_per_step"], e["calls_per_step"])
                                                for e in tab[:12])))
            if ker:
                f.write("  - %s kernels: %s\n" % (n, ", ".join("%s %.4f x%g" % (e["name"][7:], e["s_per_step"],
                                                                             e["calls_per_step"]) for e in ker[:20])))
    ops = {n: v["op_profile_s_per_step"] for n, v in sp.items() if v.get("op_profile_s_per_step")}
    f.write("\n## Per-op profile of each meshtrain run (s per steady step, receipt timing.op_profile_s_per_step)\n\n")
    if ops:
        kinds = []
        for o in ops.values():
            kinds += [k for k in o if k not in kinds]
        f.write("| config | %s |\n|---|%s\n" % (" | ".join(kinds), "---|" * len(kinds)))
        for n, o in ops.items():
            f.write("| %s | %s |\n" % (n, " | ".join("%.4f" % o[k] if k in o else "-" for k in kinds)))
    else:
        f.write("none: the receipts have no op profile\n")
print(open(os.path.join(res, "summary.md")).read())
PY
}
export -f stage_summary

# boxes from the H200 run of 2026-11-26 (env 7 s, ops 4 s, san 26 s before the scan_bf16 runs, equiv 8 s, hf 23 s,
# calib 6 s; speed and torch as their stages say); llmc before torch, whose compiled
# runs are the first thing a short budget loses
stage env 15 0
stage ops 50 1
stage equiv 60 emu
# calib before speed: a call that runs both has this card's profile for the speed
# runs' `plan --profile` predictions (the H100 run of 2026-11-26 had none)
stage calib 120 1
stage attnv4 140 1
# san after calib and attnv4: in `rest` (300 s) a call cut short keeps the rows that decide
# the defaults (v4/v5, grouped wgmma) before the sanitizer's
stage san 200 1
stage ncu 110 1
stage speed 300 1
stage llmc 60 1
# torch: 4 eager runs (~25 s each) and 4 compiled ones (~80 s each, the hybrid's ~100 s):
# the H100 run of 2026-11-27 lost the compiled hybrid at 360 s
stage torch 450 1
stage hf 90 emu
stage muon 50 1
# the llm.c build, all of it (its make and nvcc listed before the subshell dies: orphans
# would go on writing logs/llmc_build.log while tar reads it, and GNU tar then fails)
[ -n "$LLMC_BUILD_PID" ] && kill $(descendants "$LLMC_BUILD_PID") "$LLMC_BUILD_PID" 2>/dev/null
STAGES="$STAGES summary" stage summary 30 0
rm -rf "$WORK"
echo "results: $RES ($(( $(date +%s) - T_START ))s)"
rc=0
grep -q '^FAIL\|^TIMEOUT' "$SUMMARY" && rc=1
# on the device: ONE archive + summary.md in $OUT (the tool brings back at most 8 files)
# (through a .part file, as checkpoint: a kill in the middle leaves the last stage's archive whole)
FINAL_PACK=1
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    if tar czf "$OUT/gpu-$SET.tgz.part" -C "$(dirname "$RES")" "$(basename "$RES")" &&
       mv -f "$OUT/gpu-$SET.tgz.part" "$OUT/gpu-$SET.tgz"; then
        cp "$RES/summary.md" "$OUT/summary.md" 2>/dev/null
        echo "packed: $OUT/gpu-$SET.tgz ($(du -k "$OUT/gpu-$SET.tgz" | cut -f1) KiB; unpack into bench/results/<date>-<card>/) + summary.md"
        [ -n "$RES_TMP" ] && rm -rf "$RES_TMP"
    else
        rm -f "$OUT/gpu-$SET.tgz.part"   # (the last stage's archive stays)
        echo "packing into $OUT failed: results left in $RES"
    fi
fi
exit $rc
