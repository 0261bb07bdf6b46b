#!/usr/bin/env bash
# test_mamba3_ref.sh BUILD — the C Mamba-3 mixer (src/model/mamba3.c) against
# the independent numpy reference tests/mamba3_ref.py on random weights
# (test_mamba3 --dump writes them). Skips (77) without python3 + numpy.
set -u
BUILD=${1:?usage: test_mamba3_ref.sh BUILD}
. "$(dirname "$0")/cli_lib.sh"
PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "SKIPPED (python3 with numpy not found)"; exit 77; }
if "$BUILD/test_mamba3" --dump "$W" >"$W/dump.log" 2>&1; then ok "test_mamba3 --dump"
else bad "test_mamba3 --dump"; cat "$W/dump.log"; finish; exit 1; fi
"$PY" "$HERE/mamba3_ref.py" "$W" && ok "the C mixer equals the numpy reference" ||
    bad "the C mixer equals the numpy reference"
finish
