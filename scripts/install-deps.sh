#!/usr/bin/env bash
# Installs what meshtrain needs on a fresh Debian 12 machine (idempotent).
# Skips apt when everything is already there, so repeated runs are fast.
set -euo pipefail
# Everything the test suite needs so that no test skips in CI (docs/testing.md,
# "Skips and gates"): openmpi-bin/libopenmpi-dev (mpirun, mpicc: every
# distributed suite), gcc/g++ (build-essential; named too: the CUDA emulator
# stage of tests/test_cuda_build.sh compiles src/ops/cuda/*.cu as C++),
# python3 (receipt checks), procps (ps, pkill: bench/gpu.sh's trap and
# tests/test_gpu_sh.sh). nvcc, a GPU and NCCL are not installable here:
# the tests that need them report those stages as SKIPPED.
pkgs="build-essential gcc g++ cmake procps libopenblas-dev libopenblas0-openmp openmpi-bin libopenmpi-dev libcjson-dev libxxhash-dev python3 python3-numpy python3-matplotlib"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
