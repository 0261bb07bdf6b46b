#!/usr/bin/env bash
# test_fuzz_loaders.sh BUILD_DIR — the short CI run of tests/fuzz_loaders.py
# (issue 33): 40 seeded mutations per loader (config, manifest, safetensors
# header, tokenizer.bin, token shard); every case must exit 0 or 2 within
# 20 s, never crash, hang or exit 1. The long run, on demand:
#   python3 tests/fuzz_loaders.py build --cases 2000 [--seed S]
set -u
BUILD=${1:?usage: test_fuzz_loaders.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
# fuzz_loaders.py prints a line per loader (": FAIL" where a case crashed,
# hung or exited other than 0 or 2) and exits 1 if any did: that is the check
if python3 "$HERE/fuzz_loaders.py" "$BUILD" --cases "${FUZZ_CASES:-40}" --seed "${FUZZ_SEED:-33}"; then
    ok "fuzz_loaders.py: every case of every loader exited 0 or 2 within the timeout"
else bad "fuzz_loaders.py: a case crashed, hung or got a wrong exit code (the lines above)"; fi
finish
