#!/usr/bin/env bash
# demo.sh - the main job for now: builds ddpmd, prints the memory plan of the user's model
# (seed preset, 64x64 RGB, batch 8) and trains a small model for a few steps on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/ddpmd plan --preset seed --image 64 --batch 8
./build/ddpmd demo --preset ddpm --image 16 --channels 1 --ch 32 --mult 1,2 --layers 1 \
  --attn 8 --groups 8 --batch 8 --steps "${DEMO_STEPS:-40}"
