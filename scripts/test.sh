#!/usr/bin/env bash
# test.sh - the whole test suite: installs dependencies, builds, runs every ctest test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900
