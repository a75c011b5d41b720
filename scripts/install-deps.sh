#!/usr/bin/env bash
# install-deps.sh - installs ddpmd's dependencies from Debian when missing, in two sets: what
# building and running ddpmd needs (runtime), and what its tests add (test). Used by README,
# scripts/main.sh (runtime), scripts/test.sh and .ci/run (both), and docker/. Needs root (or
# sudo) on Debian 12 / bookworm.
#   install-deps.sh             both sets: what building and testing need
#   install-deps.sh --runtime   only what building and running ddpmd needs: compilers and
#                               libraries, the data a job reads, and curl + jq for main.sh
#   install-deps.sh --build     only what compiling `ddpmd` needs
#   install-deps.sh --image     --build and the data a served job reads (docker/Dockerfile's build
#                               stage; the runtime stage copies what it needs from there)
set -euo pipefail

# compilers and the -dev packages of every library ddpmd links (a new library goes here)
build=(build-essential cmake pkg-config
       libdnnl-dev libcjson-dev libpng-dev zlib1g-dev libsqlite3-dev libmicrohttpd-dev
       libarchive-dev libcurl4-openssl-dev libssl-dev libcairo2-dev)
# read where ddpmd runs, beside the libraries: the built-in dataset, a font for loss.png's text
# (server/plot.c, cairo), the CA certificates for https webhooks
data=(dataset-fashion-mnist fonts-dejavu-core ca-certificates)
# curl and jq for scripts/main.sh (it drives the server over HTTP)
main=(curl jq)
# the tests, fuzzers and tools around them; nginx for tests/integration/test_nginx.py; docker.io,
# docker-compose and debootstrap for tests/docker/test_container.sh; chromium, chromium-driver and
# python3-selenium for the dashboard's browser test (tests/integration/test_dashboard.py);
# python3-venv for the venv tests/integration/test_diffusers_pipeline.py installs diffusers in;
# wrk for bench/serve.sh
test=(clang-14 libclang-rt-14-dev libomp-14-dev wrk
      prometheus nginx docker.io docker-compose debootstrap
      chromium chromium-driver python3-selenium
      python3-torch python3-numpy python3-yaml python3-jsonschema python3-venv)

runtime=("${build[@]}" "${data[@]}" "${main[@]}")
pkgs=("${runtime[@]}" "${test[@]}")
case "${1:-}" in
  --runtime) pkgs=("${runtime[@]}") ;;
  --build) pkgs=("${build[@]}") ;;
  --image) pkgs=("${build[@]}" "${data[@]}") ;;
  "") ;;
  *) echo "usage: install-deps.sh [--runtime | --build | --image]" >&2; exit 2 ;;
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
