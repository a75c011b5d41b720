#!/usr/bin/env bash
# train_classifier.sh - builds tools/fmnist_classifier and trains the Fashion-MNIST quality
# classifier into models/fmnist-classifier.safetensors (the committed weights come from this).
# Needs the Debian package dataset-fashion-mnist. Extra arguments go to `fmnist_classifier train`.
# BUILD_DIR (default build), THREADS (default 2), OUT (default models/fmnist-classifier.safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
OUT=${OUT:-models/fmnist-classifier.safetensors}
# a shared machine: OpenMP threads that spin in barriers while another job holds the cores make
# the many small per-image parallel regions many times slower; sleeping costs little here
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" --target fmnist_classifier -j"$(nproc)"
mkdir -p "$(dirname "$OUT")"
"$BUILD_DIR"/fmnist_classifier train "$OUT" --epochs 4 --batch 128 --lr 0.002 --weight-decay 0.01 \
    --warmup 100 --seed 1 --threads "$THREADS" "$@"
"$BUILD_DIR"/fmnist_classifier eval "$OUT" --threads "$THREADS"
