#!/usr/bin/env bash
# test.sh - the whole test suite: installs dependencies, builds, runs every ctest test; then the
# same suite under ASan + UBSan (scripts/sanitize.sh, build-asan/) and each libFuzzer target for
# FUZZ_SECONDS (scripts/fuzz.sh, build-fuzz/); the CPU image in Docker behind nginx
# (tests/docker/test_container.sh, 4 to 9 minutes here; DDPMD_SKIP_CONTAINER=1 leaves it out)
# and the GPU image built and checked without a GPU (tests/docker/test_gpu_image.sh, 6.5 to 9
# minutes here; DDPMD_SKIP_GPU_IMAGE=1 leaves it out); each skips without root or Docker, the
# second also without the CUDA toolkit. Any failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/build.sh
(cd build && ctest --output-on-failure --timeout 900)
t1=$(date +%s)
bash scripts/sanitize.sh
t2=$(date +%s)
bash scripts/fuzz.sh
t3=$(date +%s)
# a Docker stage (SCRIPT, left out when the variable SKIP is 1): its time, or why not, in $took;
# a skip (exit 77: no root or no Docker) passes, any other failure fails the run
docker_stage() {
  local skip=$1 script=$2 t rc=0
  took="left out"
  [ "${!skip:-0}" != 1 ] || return 0
  t=$(date +%s)
  bash "$script" || rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || exit $rc
  took="$(($(date +%s) - t)) s"
  [ $rc -ne 77 ] || took="$took, skipped"
}
docker_stage DDPMD_SKIP_CONTAINER tests/docker/test_container.sh
container=$took
docker_stage DDPMD_SKIP_GPU_IMAGE tests/docker/test_gpu_image.sh
echo "test.sh: build + ctest $((t1 - t0)) s, sanitize.sh $((t2 - t1)) s, fuzz.sh $((t3 - t2)) s," \
  "test_container.sh $container, test_gpu_image.sh $took"
