#!/usr/bin/env bash
# install-deps.sh - installs ddpmd's build and test dependencies from Debian when missing.
# Used by README, .ci/run and docker/. Needs root (or sudo) on Debian 12 / bookworm.
set -euo pipefail

pkgs=(build-essential cmake pkg-config clang-14 libclang-rt-14-dev libomp-14-dev
      libopenblas-openmp-dev libdnnl-dev libcjson-dev libpng-dev zlib1g-dev libsqlite3-dev libmicrohttpd-dev
      prometheus
      python3-torch python3-numpy python3-yaml python3-jsonschema dataset-fashion-mnist)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
