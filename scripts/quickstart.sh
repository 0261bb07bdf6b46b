#!/usr/bin/env bash
# Quickstart: installs what it needs, builds, trains a BPE tokenizer on the
# C/C++ headers of this machine, prepares shards, trains a small code model
# for a few minutes, plots train/val loss and prints a sample.
# Everything lands in ./quickstart/ (override with QS_OUT). ~10 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
MT=build/meshtrain
QS=${QS_OUT:-quickstart}
STEPS=${QS_STEPS:-600}
mkdir -p "$QS"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[ -f "$QS/tokenizer.bin" ] || $MT tokenizer train --vocab 4096 --out "$QS/tokenizer.bin"
[ -f "$QS/data/meta.json" ] || $MT prepare --tokenizer "$QS/tokenizer.bin" --out "$QS/data"
$MT train --config configs/quickstart.json --data "$QS/data" --out "$QS/run" --steps "$STEPS"
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
$PY scripts/plot_loss.py "$QS/run/receipt.json" "$QS/run/loss.png" || echo "(plot skipped: matplotlib missing)"
echo "--- sample ---"
$MT sample --ckpt "$QS/run" --prompt "#include <stdio.h>
int main(" --tokens 200 --temperature 0.8 --top-k 40 --seed 1
echo
echo "receipt: $QS/run/receipt.json   loss plot: $QS/run/loss.png"
