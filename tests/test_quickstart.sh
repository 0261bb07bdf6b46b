#!/usr/bin/env bash
# test_quickstart.sh BUILD_DIR — issue 32: scripts/quickstart.sh run again
# does not retrain over its run. On a tiny config and the repo's own sources
# (QS_BUILD, QS_CONFIG, QS_CORPUS; no deps, no build): the first run trains
# QS_STEPS=4; the second finds the run finished, says so and leaves every file
# of the run as it was; QS_STEPS=6 resumes it to step 6. The val lines and
# the receipt say how many tokens each evaluation scored (eval_batches 0 =
# the whole val split).
set -u
BUILD=${1:?usage: test_quickstart.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
echo '{"n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "seq_len": 32, "batch_size": 4, "lr": 0.01,
 "warmup_steps": 2, "eval_every": 2, "eval_batches": 0}' >"$W/tiny.json"
qs() { QS_BUILD="$BUILD" QS_CONFIG="$W/tiny.json" QS_CORPUS="$ROOT/src" QS_OUT="$W/qs" QS_STEPS=$1 \
       bash "$ROOT/scripts/quickstart.sh" >"$W/qs.out" 2>"$W/qs.err"; }
tree_sum() { (cd "$1" && find ckpt receipt.json -type f | sort | xargs -d "\n" sha256sum) | sha256sum; }   # not loss.png (replotted)
R="$W/qs/run"
if qs 4 && grep -q '^step_000004$' "$R/ckpt/latest"; then ok "quickstart trains (4 steps)"
else bad "quickstart trains"; tail -5 "$W/qs.err"; fi
if grep -Eq '^val step 4 loss [0-9.]+ \([0-9]+ batches, [0-9]+ tokens scored\)' "$W/qs.out" && python3 - "$R/receipt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
v = r["val_losses"][-1]
assert v["tokens"] == r["config"]["eval_batches"] * 4 * 32 and r["config"]["eval_batches"] > 1, (v, r["config"]["eval_batches"])
PY
then ok "val: the whole split, the tokens scored in the log and the receipt"; else bad "val tokens"; grep val "$W/qs.out"; fi
before=$(tree_sum "$R")
if qs 4 && grep -q "already reached step 4 (asked: 4): not retraining" "$W/qs.out" && [ "$before" = "$(tree_sum "$R")" ]; then
    ok "run again: the finished run is kept (every file unchanged)"
else bad "run again retrained or changed the run"; tail -5 "$W/qs.out"; fi
if qs 6 && grep -q "resuming .* from step 4 to step 6" "$W/qs.out" && grep -q '^step_000006$' "$R/ckpt/latest" \
   && [ -d "$R/ckpt/step_000004" ]; then ok "QS_STEPS=6: resumed to step 6"
else bad "QS_STEPS=6 resume"; tail -5 "$W/qs.err"; fi
finish
