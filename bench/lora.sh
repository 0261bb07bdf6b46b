#!/usr/bin/env bash
# bench/lora.sh BUILD_DIR [STEPS] — config (a) (bench/configs/a_dense.json):
# LoRA r16 alpha 32 on q,v,gate,up,down next to full fine-tuning, alternating
# in the same run (full, lora, full, lora), one thread each; prints steady
# tokens/s, MFU (each with its own FLOPs convention, docs/lora.md) and the
# measured memory per bucket.
set -eu
BUILD=${1:?usage: bench/lora.sh BUILD_DIR [STEPS]}; STEPS=${2:-8}
HERE=$(cd "$(dirname "$0")" && pwd); W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
python3 "$HERE/../tests/make_shard.py" "$W/train.bin" 200000 8192 pattern
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for rep in 1 2; do
    for mode in full lora; do
        L=""; [ $mode = lora ] && L="--lora 16:32:q,v,gate,up,down"
        "$BUILD/meshtrain" train --config "$HERE/configs/a_dense.json" $L --steps "$STEPS" --quiet \
            --data "$W/train.bin" --out "$W/$mode$rep" >/dev/null 2>&1
    done
done
python3 - "$W" <<'PY'
import json, sys
for d in ["full1", "lora1", "full2", "lora2"]:
    r = json.load(open("%s/%s/receipt.json" % (sys.argv[1], d))); t = r["timing"]; m = r["memory"]["measured_peak_bytes"]
    print("%-6s tokens/s %6.0f  mfu %.3f  trainable %8d of %8d  MiB: params %.2f grads %.2f optim %.2f acts %.2f total %.2f"
          % ((d, t["tokens_per_s"], t["mfu"], r["parameters"]["trainable"], r["parameters"]["total"])
             + tuple(m[k] / 2**20 for k in ["params", "grads", "optim", "acts", "total"])))
PY
