#!/usr/bin/env bash
# test.sh - the whole test suite: installs dependencies, builds, runs every ctest test; then the
# same suite under ASan + UBSan (scripts/sanitize.sh, build-asan/) and each libFuzzer target for
# FUZZ_SECONDS (scripts/fuzz.sh, build-fuzz/). Any failure fails the run.
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
echo "test.sh: build + ctest $((t1 - t0)) s, sanitize.sh $((t2 - t1)) s, fuzz.sh $((t3 - t2)) s"
