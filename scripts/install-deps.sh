#!/usr/bin/env bash
# Installs what meshtrain needs on a fresh Debian 12 machine (idempotent).
# Skips apt when everything is already there, so repeated runs are fast.
set -euo pipefail
pkgs="build-essential cmake libopenblas-dev libopenblas0-openmp openmpi-bin libopenmpi-dev libcjson-dev libxxhash-dev python3 python3-numpy python3-matplotlib"
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
