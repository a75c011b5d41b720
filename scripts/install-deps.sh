#!/usr/bin/env bash
# install-deps.sh - installs ddpmd's build and test dependencies from Debian when missing.
# Used by README, .ci/run and docker/. Needs root (or sudo) on Debian 12 / bookworm.
#   install-deps.sh           what building and testing need (build + test below)
#   install-deps.sh --build   only what compiling `ddpmd` needs
#   install-deps.sh --image   --build and the data a served job reads (docker/Dockerfile's build
#                             stage; the runtime stage copies what it needs from there)
set -euo pipefail

# compilers and the -dev packages of every library ddpmd links (a new library goes here)
build=(build-essential cmake pkg-config
       libdnnl-dev libcjson-dev libpng-dev zlib1g-dev libsqlite3-dev libmicrohttpd-dev
       libarchive-dev libcurl4-openssl-dev libssl-dev libcairo2-dev)
# read where ddpmd runs, beside the libraries: the built-in dataset, a font for loss.png's text
# (server/plot.c, cairo), the CA certificates for https webhooks
data=(dataset-fashion-mnist fonts-dejavu-core ca-certificates)
# the tests, fuzzers and tools around them; nginx for tests/integration/test_nginx.py; docker.io,
# docker-compose and debootstrap for tests/docker/test_container.sh; chromium, chromium-driver and
# python3-selenium for the dashboard's browser test (tests/integration/test_dashboard.py); curl
# and jq for scripts/main.sh (it drives the server over HTTP), wrk for bench/serve.sh
test=(clang-14 libclang-rt-14-dev libomp-14-dev curl jq wrk
      prometheus nginx docker.io docker-compose debootstrap
      chromium chromium-driver python3-selenium
      python3-torch python3-numpy python3-yaml python3-jsonschema)

pkgs=("${build[@]}" "${data[@]}" "${test[@]}")
case "${1:-}" in
  --build) pkgs=("${build[@]}") ;;
  --image) pkgs=("${build[@]}" "${data[@]}") ;;
  "") ;;
  *) echo "usage: install-deps.sh [--build | --image]" >&2; exit 2 ;;
esac

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
