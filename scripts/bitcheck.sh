#!/usr/bin/env bash
# bitcheck.sh OLD_MESHTRAIN NEW_MESHTRAIN — a refactor changed nothing.
#
# Runs the same set of reference trainings (dense and MoE; one rank, dp x
# ZeRO 0-3, tp with and without SP, ep, pp, pp x tp, dp x tp ZeRO-3, a
# resume) with two builds and demands bit equality of every per-step series
# in the receipts (losses, lm/aux/z parts, grad norms, lrs) and of the final
# checkpoint's params.bin and optim.bin. This is the "behaviour unchanged"
# gate of a restructuring (issue 14): the equivalence suites prove every mesh
# equals one rank; this proves the new build equals the old one.
#
# Needs mpirun (exits 77 without it). About 1-2 minutes on 2 cores.
set -u
OLD=${1:?usage: bitcheck.sh OLD_MESHTRAIN NEW_MESHTRAIN}
NEW=${2:?usage: bitcheck.sh OLD_MESHTRAIN NEW_MESHTRAIN}
HERE=$(cd "$(dirname "$0")/.." && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "SKIPPED (no mpirun)"; exit 77; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
python3 "$HERE/tests/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null

DENSE="--set vocab_size=64 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set total_steps=12 --set microbatches=2"
MOE="$DENSE --set pattern=AEAE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin --steps 12"

# name np extra-args
CASES=(
  "np1 1"
  "dp2z0 2 --zero 0"
  "dp2z1 2 --zero 1"
  "dp2z2 2 --zero 2"
  "dp2z3 2 --zero 3"
  "tp2 2 --mesh tp=2"
  "tp2nosp 2 --mesh tp=2 --set sequence_parallel=0"
  "pp2 2 --mesh pp=2"
  "pp2tp2 4 --mesh pp=2,tp=2"
  "dp2tp2z3 4 --mesh dp=2,tp=2 --zero 3"
)
MOE_CASES=("ep2 2 --mesh ep=2" "ep2tp2 4 --mesh ep=2,tp=2 --zero 1")

run() { # bin out np args...
    local bin=$1 out=$2 np=$3; shift 3
    if [ "$np" = 1 ]; then "$bin" train "$@" --out "$out" >"$out.log" 2>&1
    else timeout 300 mpirun --oversubscribe --allow-run-as-root -np "$np" "$bin" train "$@" --out "$out" >"$out.log" 2>&1 </dev/null; fi
}

fails=0; n=0
compare() { # tag
    local a="$W/old_$1" b="$W/new_$1"
    if python3 - "$a" "$b" <<'PY'
import json, sys, glob, os, filecmp
a, b = sys.argv[1], sys.argv[2]
ra, rb = json.load(open(a + "/receipt.json")), json.load(open(b + "/receipt.json"))
keys = ["losses", "lm_losses", "aux_losses", "z_losses", "grad_norms", "lrs"]
bad = [k for k in keys if k in ra and ra.get(k) != rb.get(k)]
assert len(ra["losses"]) > 0
ca = sorted(glob.glob(a + "/ckpt/step_*[0-9]")); cb = sorted(glob.glob(b + "/ckpt/step_*[0-9]"))
assert ca and [os.path.basename(x) for x in ca] == [os.path.basename(x) for x in cb], (ca, cb)
for f in ("params.bin", "optim.bin"):
    if os.path.exists(ca[-1] + "/" + f) and not filecmp.cmp(ca[-1] + "/" + f, cb[-1] + "/" + f, shallow=False):
        bad.append(f)
if bad: print("   differs:", ", ".join(bad)); sys.exit(1)
PY
    then echo "PASS $1 bit-identical"; else echo "FAIL $1"; fails=$((fails+1)); fi
    n=$((n+1))
}

for model in DENSE MOE; do
    cfg=${!model}
    list=("${CASES[@]}"); [ $model = MOE ] && list+=("${MOE_CASES[@]}")
    for c in "${list[@]}"; do
        set -- $c; name=$1; np=$2; shift 2
        tag="${model}_$name"
        for side in old new; do
            bin=$OLD; [ $side = new ] && bin=$NEW
            run "$bin" "$W/${side}_$tag" "$np" $cfg $COMMON "$@" || { echo "FAIL $tag ($side run failed)"; tail -3 "$W/${side}_$tag.log"; fails=$((fails+1)); continue 2; }
        done
        compare "$tag"
    done
    # resume: 6 steps, save, resume to 12 on dp=2 ZeRO-3
    for side in old new; do
        bin=$OLD; [ $side = new ] && bin=$NEW
        o="$W/${side}_${model}_resume"
        run "$bin" "$o" 2 $cfg --peak-flops 1e11 --quiet --data "$W/train.bin" --steps 6 --zero 3 &&
        run "$bin" "$o" 2 $cfg --peak-flops 1e11 --quiet --data "$W/train.bin" --steps 12 --zero 3 --resume "$o" ||
            { echo "FAIL ${model}_resume ($side)"; fails=$((fails+1)); }
    done
    compare "${model}_resume"
done
echo "$((n - fails)) of $n cases bit-identical"
[ $fails -eq 0 ]
