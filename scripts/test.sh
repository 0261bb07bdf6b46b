#!/usr/bin/env bash
# The test command of the README: install deps, build (warnings as errors), run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMT_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)"
cd build
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} ctest --output-on-failure -j1 "$@"
