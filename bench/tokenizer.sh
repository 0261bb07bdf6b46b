#!/usr/bin/env bash
# Issue-3 benchmark: train an 8192-token BPE vocabulary on 50 MB of text
# (the C/C++ headers of this machine, concatenated and repeated up to 50 MB)
# and time it. Target: under 2 minutes on 2 cores. -> bench/out/tokenizer.json
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; MB=${2:-50}
OUT=bench/out; mkdir -p "$OUT"
TXT="$OUT/corpus_${MB}mb.txt"
if [ ! -f "$TXT" ]; then
  : > "$TXT"
  while [ "$(stat -c %s "$TXT")" -lt $((MB * 1000000)) ]; do
    find /usr/include -type f \( -name '*.h' -o -name '*.hpp' \) -size -512k -print0 | sort -z | xargs -0 cat >> "$TXT" 2>/dev/null || true
  done
  truncate -s $((MB * 1000000)) "$TXT"
fi
t0=$(date +%s.%N)
"$BUILD/meshtrain" tokenizer train --input "$TXT" --vocab 8192 --out "$OUT/tok8k.bin" >/dev/null
t1=$(date +%s.%N)
python3 - "$t0" "$t1" "$MB" "$OUT" <<'PY'
import json, sys, os
t0, t1, mb, out = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = {"input_mb": mb, "vocab": 8192, "seconds": t1 - t0, "target_seconds": 120, "cores": os.cpu_count(),
     "tokenizer_bytes": os.path.getsize(f"{out}/tok8k.bin")}
json.dump(r, open(f"{out}/tokenizer.json", "w"), indent=2)
print(f"tokenizer: {mb} MB -> vocab 8192 in {t1 - t0:.1f} s (target 120 s)")
PY
