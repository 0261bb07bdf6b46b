#!/usr/bin/env bash
# test_eval_mesh.sh BUILD_DIR — the validation loss does not depend on the
# mesh (issue 13, item 6; tests/test_eval_loss.c checks the one-rank value
# against a direct forward).
# A data dir with train.bin (a pattern) and val_000.bin (the pattern and
# random tokens in alternating blocks: files with "val" in the name are the
# validation split); a tiny MoE model (an A
# and an E block, shared expert) trains 4 steps with eval_every=2 and
# eval_batches=3 on one rank and on dp=2 (ZeRO-1), tp=2 (SP), ep=2, pp=2 (2
# microbatches) and dp=2 x ZeRO-3. Each data rank evaluates its share of
# every val batch and the shares meet in one all-reduce; a pipeline
# evaluates stage by stage. The receipt's val_losses must be at steps 2 and
# 4 on every mesh, equal to the one-rank values to 1e-6 relative (the
# training losses of these meshes agree to ~1e-7, see the equivalence
# suites; observed here: below 1e-7). A missing receipt fails.
# Skips (exit 77, "SKIPPED (reason)") without mpirun or in a build without MPI.
set -u
BUILD=${1:?usage: test_eval_mesh.sh BUILD_DIR}
. "$(dirname "$0")/dist_lib.sh"

mkdir -p "$W/data"
python3 "$HERE/make_shard.py" "$W/data/train.bin" 20000 64 pattern >/dev/null
# val: the train phrase and random tokens in alternating blocks of 40, so
# that sequences differ in loss (evaluating the wrong share shows)
python3 "$HERE/make_shard.py" "$W/data/p.tmp" 5000 64 pattern >/dev/null
python3 "$HERE/make_shard.py" "$W/data/r.tmp" 5000 64 random >/dev/null
python3 - "$W/data/p.tmp" "$W/data/r.tmp" "$W/data/val_000.bin" <<'PY'
import sys
p, r = (open(f, "rb").read() for f in sys.argv[1:3])
h, n = 1024, (len(p) - 1024) // 2
tok = [(p if (i // 40) % 2 == 0 else r)[h + 2 * i:h + 2 * i + 2] for i in range(n)]
open(sys.argv[3], "wb").write(p[:h] + b"".join(tok))
PY
rm -f "$W/data/p.tmp" "$W/data/r.tmp"
CFG="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2 --set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set shared_expert_hidden=16 --set eval_every=2 --set eval_batches=3"
COMMON="$CFG --peak-flops 1e11 --quiet --data $W/data --steps 4"

if ! run 1 "$W/ref"; then
    tail -5 "$W/ref.log"; echo "FAIL reference run"; exit 1
fi
while read -r np mesh zero extra; do
    o="$W/run_${mesh//[=,]/_}_z$zero"
    label="--mesh $mesh --zero $zero $extra"
    if ! run "$np" "$o" --mesh "$mesh" --zero "$zero" $extra; then
        tail -5 "$o.log"; echo "FAIL $label: run exited non-zero"; fails=$((fails+1)); continue
    fi
    if python3 - "$W/ref/receipt.json" "$o/receipt.json" <<'PY'; then
import json, sys
a, b = (json.load(open(p))["val_losses"] for p in sys.argv[1:3])
assert [e["step"] for e in a] == [2, 4], a
assert [e["step"] for e in b] == [2, 4], b
w = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print("   val losses %s vs one rank %s: max rel diff %.2e (tol 1e-6)" % ([e["loss"] for e in b], [e["loss"] for e in a], w))
assert w <= 1e-6, w
PY
        echo "PASS $label: val_losses equal the one-rank run's"; passes=$((passes+1))
    else
        echo "FAIL $label: val_losses"; fails=$((fails+1))
    fi
done <<'LIST'
2 dp=2 1
2 tp=2 0
2 ep=2 0
2 pp=2 0 --set microbatches=2
4 dp=2,tp=2 3
LIST

echo "test_eval_mesh: $passes passed, $fails failed"
[ $fails -eq 0 ] && [ $passes -eq 5 ]
