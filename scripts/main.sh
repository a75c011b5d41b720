#!/usr/bin/env bash
# main.sh - the main job: install dependencies, build, train examples/fmnist-tiny.json on the CPU
# (a few minutes), sample a grid from it, and sample the pretrained models/fmnist-tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
out=out/fmnist-tiny
# --resume-or-start: a second run of main.sh continues (or finds the run finished) instead of
# refusing a folder that already holds checkpoints
./build/ddpmd train examples/fmnist-tiny.json --out "$out" --resume-or-start
ckpt=$(ls "$out"/checkpoints/step-*.safetensors | tail -n 1)
./build/ddpmd sample "$ckpt" --n 64 --steps 50 --out "$out/grid.png"
echo "your model: $ckpt"
echo "its samples: $out/grid.png (loss curve: $out/loss.png, numbers: $out/loss.csv)"
if [ -f models/fmnist-tiny.safetensors ]; then
  ./build/ddpmd sample models/fmnist-tiny.safetensors --n 64 --steps 50 --out out/pretrained.png
  echo "samples of the pretrained model (models/fmnist-tiny.safetensors): out/pretrained.png"
fi
