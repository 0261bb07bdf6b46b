#!/bin/bash
# test_mamba3_ref.sh BUILD — the C Mamba-3 mixer (src/model/mamba3.c) against
# the independent numpy reference tests/mamba3_ref.py on random weights
# (test_mamba3 --dump writes them). Skips (77) without python3 + numpy.
set -u
BUILD=${1:?usage: test_mamba3_ref.sh BUILD}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "SKIPPED (python3 with numpy not found)"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OMP_NUM_THREADS=1 "$BUILD/test_mamba3" --dump "$TMP" || { echo "FAIL: test_mamba3 --dump"; exit 1; }
OMP_NUM_THREADS=1 "$PY" "$SRC/tests/mamba3_ref.py" "$TMP"
