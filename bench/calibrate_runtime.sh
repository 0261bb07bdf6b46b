#!/usr/bin/env bash
# calibrate_runtime.sh [BUILD_DIR] [PROFILE_JSON] — measure the constants of the
# planner's runtime bucket (src/plan/mt_plan.h, docs/plan.md section 2) on
# this machine and write them into PROFILE_JSON's "runtime_memory" section
# (default bench/profiles/cpu-local.json). It also prints the #define lines of
# the built-in default (src/plan/plan.c, MT_PLAN_RT_*) to paste when this is
# the machine the defaults describe.
#
# Every measurement is a real `meshtrain train` of 2 steps, so the runtime is
# whatever the trainer really links, touches and maps. From each receipt:
#     resid = peak RSS of the step loop - the step loop's mt_alloc peak - token shard bytes
# (distributed.memory_plan.per_rank[].rss / measured_step_loop; the shards
# are mapped and scanned whole, so they are resident). Then:
#   base          the do-nothing run: a 2-layer d=32 model on one rank, one
#                 thread, no MPI (its GEMM operands, ~30 KB, are taken off)
#   per_thread, per_thread_per_column
#                 GEMM warm-ups: a d=512 model with V=4096 and with V=16384
#                 (GEMMs larger than OpenBLAS's blocks) on T threads (T = the
#                 cores, what train uses by default): (resid - base) / T =
#                 per_thread + per_thread_per_column x V, two points; and the
#                 same two on 1 thread (OpenBLAS's serial driver): single_thread*
#   mpi, mpi_per_peer
#                 the do-nothing run under mpirun -np 2 and -np 4 (empty MPI
#                 init + its transports): resid - base = mpi + (np-1) x per_peer
#   collective_scratch_ratio
#                 the GEMM model on dp=2 ZeRO-0 (1 thread per rank): its
#                 non-blocking all-reduces of a step are all in flight at once;
#                 (resid(np=2) - resid(1 rank, 1 thread) - mpi(2)) / their bytes
#   reduce_scatter_scratch_ratio
#                 the same on ZeRO-2: the reduce-scatter's temporaries sit on
#                 the group's rank 0; (resid(rank 0) - resid(rank 1)) / bytes
# Takes about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; PROFILE=${2:-bench/profiles/cpu-local.json}
MT="$BUILD/meshtrain"
[ -x "$MT" ] || { echo "calibrate_runtime.sh: no $MT (build first)" >&2; exit 2; }
[ -f "$PROFILE" ] || { echo "calibrate_runtime.sh: no profile $PROFILE" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "calibrate_runtime.sh: needs mpirun (the MPI terms)" >&2; exit 2; }
T=${CAL_THREADS:-$(nproc)}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)

python3 tests/make_shard.py "$W/tiny.bin" 20000 64 pattern >/dev/null
python3 tests/make_shard.py "$W/gemm.bin" 40000 4096 random >/dev/null
python3 tests/make_shard.py "$W/wide.bin" 40000 16384 random >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=4 --set seq_len=16 --set batch_size=8 --data $W/tiny.bin"
GEMM="--set vocab_size=4096 --set n_layer=1 --set d_model=512 --set n_head=8 --set n_kv_head=8 --set seq_len=128 --set batch_size=8 --data $W/gemm.bin"
WIDE="--set vocab_size=16384 --set n_layer=1 --set d_model=512 --set n_head=8 --set n_kv_head=8 --set seq_len=128 --set batch_size=8 --data $W/wide.bin"
COMMON="--steps 2 --quiet --peak-flops 1e11"

echo "calibrate_runtime: base (do-nothing run)"
OMP_NUM_THREADS=1 "$MT" train $TINY $COMMON --out "$W/base" >/dev/null
echo "calibrate_runtime: GEMM warm-up on $T thread(s), and on 1"
OMP_NUM_THREADS=$T "$MT" train $GEMM $COMMON --out "$W/gemmT" >/dev/null
OMP_NUM_THREADS=$T "$MT" train $WIDE $COMMON --out "$W/wideT" >/dev/null
OMP_NUM_THREADS=1 "$MT" train $GEMM $COMMON --out "$W/gemm1" >/dev/null
OMP_NUM_THREADS=1 "$MT" train $WIDE $COMMON --out "$W/wide1" >/dev/null
for np in 2 4; do
    echo "calibrate_runtime: MPI init, np=$np"
    OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np $np "$MT" train $TINY $COMMON --out "$W/mpi$np" >/dev/null </dev/null
done
echo "calibrate_runtime: collective temporaries, dp=2 ZeRO-0"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$MT" train $GEMM $COMMON --zero 0 --out "$W/dp2" >/dev/null </dev/null
OMP_NUM_THREADS=1 "$MT" plan $GEMM --world 2 --mesh dp=2 --zero 0 --steps 2 --json --profile none > "$W/dp2.plan"
echo "calibrate_runtime: reduce-scatter temporaries, dp=2 ZeRO-2"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$MT" train $GEMM $COMMON --zero 2 --out "$W/z2" >/dev/null </dev/null
OMP_NUM_THREADS=1 "$MT" plan $GEMM --world 2 --mesh dp=2 --zero 2 --steps 2 --json --profile none > "$W/z2.plan"

python3 - "$W" "$PROFILE" "$T" <<'PY'
import json, sys, datetime
w, prof_path, T = sys.argv[1], sys.argv[2], int(sys.argv[3])

def resid(name, rank=None):
    """step-loop peak RSS - step-loop mt_alloc peak - shard bytes: of one rank, or the mean over ranks"""
    r = json.load(open(f"{w}/{name}/receipt.json"))
    mp = r["distributed"]["memory_plan"]
    assert mp["rss_phased"], "the step loop's RSS could not be phased (/proc/self/clear_refs)"
    data = mp["runtime_model"]["data_bytes"]
    v = [e["rss"]["step_loop_peak"] - e["measured_step_loop"]["total"] - data for e in mp["per_rank"]
         if rank is None or e["rank"] == rank]
    return sum(v) / len(v), r["config"]

def operands(cfg, tokens):   # the plan's small-GEMM term: 4 x D x (N + max(V, F))
    return 4.0 * cfg["d_model"] * (tokens + max(cfg["vocab_size"], cfg["mlp_hidden"]))

rb, tiny = resid("base")
base = rb - operands(tiny, tiny["batch_size"] * tiny["seq_len"])
rT, g = resid("gemmT")
rW, wd = resid("wideT")
wide = lambda c: max(c["vocab_size"], c["mlp_hidden"])
per_col = max(0.0, ((rW - base) / T - (rT - base) / T) / (wide(wd) - wide(g)))
per_thread = max(0.0, (rT - base) / T - per_col * wide(g))
r1, _ = resid("gemm1")
rW1, _ = resid("wide1")
single_col = max(0.0, (rW1 - r1) / (wide(wd) - wide(g)))
single = max(0.0, r1 - base - single_col * wide(g))
m2 = resid("mpi2")[0] - rb
m4 = resid("mpi4")[0] - rb
per_peer = max(0.0, (m4 - m2) / 2)
mpi = m2 - per_peer
plan = json.load(open(f"{w}/dp2.plan"))
msg = plan["memory"]["per_rank"][0]["runtime_terms"]["collective_bytes"]
scratch = max(0.0, resid("dp2")[0] - r1 - m2)
ratio = scratch / msg if msg > 0 else 0.0
z2 = json.load(open(f"{w}/z2.plan"))["memory"]["per_rank"][0]["runtime_terms"]["collective_bytes"]
rs_ratio = max(0.0, resid("z2", 0)[0] - resid("z2", 1)[0]) / z2 if z2 > 0 else 0.0
rt = {"base_bytes": round(base), "per_thread_bytes": round(per_thread),
      "per_thread_per_column_bytes": round(per_col, 1), "single_thread_bytes": round(single),
      "single_thread_per_column_bytes": round(single_col, 1), "mpi_bytes": round(mpi),
      "mpi_per_peer_bytes": round(per_peer), "collective_scratch_ratio": round(ratio, 3),
      "reduce_scatter_scratch_ratio": round(rs_ratio, 3),
      "calibrated": datetime.date.today().isoformat(),
      "how": "bench/calibrate_runtime.sh: resid = step-loop peak RSS - step-loop mt_alloc peak - shard bytes; "
             "base: d=32 model, 1 thread, no MPI; per_thread + per_thread_per_column x V: d=512 models with V=4096 "
             "and 16384 on %d threads, (resid - base) / %d; single_thread*: the same on 1 thread; "
             "mpi + (np-1) x per_peer: the d=32 run under mpirun -np 2 and 4, minus its one-rank resid; "
             "collective_scratch_ratio: d=512 model dp=2 ZeRO-0 minus its one-rank 1-thread resid and mpi(2), over "
             "the bytes in flight (the engine's buffer, %d bytes); reduce_scatter_scratch_ratio: the same model on "
             "ZeRO-2, group rank 0 minus rank 1 (the leaf), over the engine's buffer" % (T, T, msg)}
for k in ("base_bytes", "per_thread_bytes", "mpi_bytes", "mpi_per_peer_bytes"):
    assert rt[k] >= 0, (k, rt[k])
prof = json.load(open(prof_path))
prof["runtime_memory"] = rt
open(prof_path, "w").write(json.dumps(prof, indent=2) + "\n")
print(f"wrote {prof_path} runtime_memory:")
for k, v in rt.items():
    if k not in ("how",): print(f"  {k:26s} {v}")
print("built-in default (src/plan/plan.c):")
print("#define MT_PLAN_RT_BASE          %.4ge6" % (rt["base_bytes"] / 1e6))
print("#define MT_PLAN_RT_PER_THREAD    %.4ge6" % (rt["per_thread_bytes"] / 1e6))
print("#define MT_PLAN_RT_PER_COLUMN    %.4g" % rt["per_thread_per_column_bytes"])
print("#define MT_PLAN_RT_SINGLE        %.4ge6" % (rt["single_thread_bytes"] / 1e6))
print("#define MT_PLAN_RT_SINGLE_COLUMN %.4g" % rt["single_thread_per_column_bytes"])
print("#define MT_PLAN_RT_MPI           %.4ge6" % (rt["mpi_bytes"] / 1e6))
print("#define MT_PLAN_RT_MPI_PER_PEER  %.4ge6" % (rt["mpi_per_peer_bytes"] / 1e6))
print("#define MT_PLAN_RT_COLL_SCRATCH  %.4g" % rt["collective_scratch_ratio"])
print("#define MT_PLAN_RT_RS_SCRATCH    %.4g" % rt["reduce_scatter_scratch_ratio"])
PY
