#!/usr/bin/env bash
# test.sh - the whole test suite: installs dependencies, builds, runs every ctest test; then the
# same suite under ASan + UBSan (scripts/sanitize.sh, build-asan/) and each libFuzzer target for
# FUZZ_SECONDS (scripts/fuzz.sh, build-fuzz/); and the CPU image in Docker behind nginx
# (tests/docker/test_container.sh, 7 to 9 minutes here; it skips without root or Docker, and
# DDPMD_SKIP_CONTAINER=1 leaves it out). Any failure fails the run.
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
container="left out"
if [ "${DDPMD_SKIP_CONTAINER:-0}" != 1 ]; then
  rc=0
  bash tests/docker/test_container.sh || rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || exit $rc
  container="$(($(date +%s) - t3)) s"
  [ $rc -ne 77 ] || container="$container, skipped"
fi
echo "test.sh: build + ctest $((t1 - t0)) s, sanitize.sh $((t2 - t1)) s, fuzz.sh $((t3 - t2)) s," \
  "test_container.sh $container"
