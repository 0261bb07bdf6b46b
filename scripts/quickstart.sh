#!/usr/bin/env bash
# Quickstart: installs what it needs, builds, trains a BPE tokenizer on the
# C/C++ headers of this machine, prepares shards, trains a small code model
# for a few minutes, plots train/val loss and prints a sample.
# Everything lands in ./quickstart/ (override with QS_OUT). ~12 min on 2 cores (the val loss
# scores the whole val split every 50 steps: the plot and log say how many tokens).
# Run again, it reuses the tokenizer, the data and the run (a finished run is
# not retrained, a shorter one is resumed): it only replots and samples.
# For tests (tests/test_quickstart.sh): QS_BUILD=DIR uses that build (no deps,
# no build), QS_CONFIG a config, QS_CORPUS the text (default: /usr/include).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${QS_BUILD:-}" ]; then
    bash scripts/install-deps.sh
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)"
fi
MT=${QS_BUILD:-build}/meshtrain
CONFIG=${QS_CONFIG:-configs/quickstart.json}
CORPUS=(); [ -n "${QS_CORPUS:-}" ] && CORPUS=(--input "$QS_CORPUS")
QS=${QS_OUT:-quickstart}
STEPS=${QS_STEPS:-600}
mkdir -p "$QS"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[ -f "$QS/tokenizer.bin" ] || $MT tokenizer train "${CORPUS[@]}" --vocab 4096 --out "$QS/tokenizer.bin"
[ -f "$QS/data/meta.json" ] || $MT prepare "${CORPUS[@]}" --tokenizer "$QS/tokenizer.bin" --out "$QS/data"
# Never retrain over a run silently: a finished run is kept, a shorter one resumed
# (rm -rf "$QS/run" to start over; QS_STEPS=N to go further).
RUN="$QS/run"
done_step=$(sed -n '1s/^step_0*\([0-9]\)/\1/p' "$RUN/ckpt/latest" 2>/dev/null || true)
if [ -n "$done_step" ] && [ "$done_step" -ge "$STEPS" ]; then
    echo "quickstart: $RUN already reached step $done_step (asked: $STEPS): not retraining" \
         "(rm -rf $RUN to start over, QS_STEPS=N to go further)"
elif [ -n "$done_step" ]; then
    echo "quickstart: resuming $RUN from step $done_step to step $STEPS"
    $MT train --config "$CONFIG" --data "$QS/data" --out "$RUN" --steps "$STEPS" --resume "$RUN"
else
    $MT train --config "$CONFIG" --data "$QS/data" --out "$RUN" --steps "$STEPS"
fi
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
[ -f "$RUN/receipt.json" ] && $PY scripts/plot_loss.py "$RUN/receipt.json" "$RUN/loss.png" 2>/dev/null || echo "(plot skipped: matplotlib missing)"
echo "--- sample ---"
$MT sample --ckpt "$QS/run" --prompt "#include <stdio.h>
int main(" --tokens 200 --temperature 0.8 --top-k 40 --seed 1
echo
echo "receipt: $QS/run/receipt.json   loss plot: $QS/run/loss.png"
