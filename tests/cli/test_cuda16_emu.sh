#!/usr/bin/env bash
# test_cuda16_emu.sh - `ddpmd train --device cuda:0` in bf16 and f16 under the CPU emulator of
# CUDA (libddpmd_cuda_emu.so through DDPMD_CUDA_MODULE) against the same 16-bit runs on the CPU:
# a tiny model with attention, three steps each; the losses and gradient norms of every step
# within the type's unit roundoff u (2^-8 bf16, 2^-11 f16; measured at most 0.08 u and 0.25 u),
# f16's loss scale the CPU's at every step, and the checkpoint naming the precision. Then bf16 on
# an emulated sm_75, whose libraries have no bf16 tensor cores (half_kernels leaves convolutions
# and linears to fp32 scratch there): the same steps.
# Usage: test_cuda16_emu.sh DDPMD LIBDDPMD_CUDA_EMU
set -u
ddpmd=${1:?path to ddpmd}
emu=${2:?path to libddpmd_cuda_emu.so}
dir=$(mktemp -d /tmp/ddpmd-test-cuda16-emu-XXXXXX)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
export EMU_DEVICE_MB=512

for prec in bf16 f16 bf16-sm75; do
  p=${prec%-sm75}
  cat > "$dir/$prec.json" <<JSON
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 16, "block_out_channels": [8, 16],
             "layers_per_block": 1, "attention_resolutions": [8], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist", "fmnist_resize": "resize" },
  "train": { "batch": 2, "steps": 3, "warmup": 0, "threads": 1 },
  "memory": { "precision": "$p" },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": 1 } }
JSON
  cc=90
  [ "$prec" = bf16-sm75 ] && cc=75
  if [ ! -f "$dir/cpu-$p.log" ]; then
    "$ddpmd" train "$dir/$prec.json" --out "$dir/cpu-$p" > "$dir/cpu-$p.log" 2> "$dir/cpu-$p.err"
    rc=$?
    check '[ $rc -eq 0 ]' "$p on the CPU: exit $rc, $(tail -n 2 "$dir/cpu-$p.err")"
  fi
  EMU_CC=$cc DDPMD_CUDA_MODULE="$emu" "$ddpmd" train "$dir/$prec.json" --out "$dir/gpu-$prec" \
      --device cuda:0 > "$dir/gpu-$prec.log" 2> "$dir/gpu-$prec.err"
  rc=$?
  check '[ $rc -eq 0 ]' "$prec on cuda:0: exit $rc, $(tail -n 2 "$dir/gpu-$prec.err")"
  ck=$(printf "%s/gpu-%s/checkpoints/step-%08d.safetensors" "$dir" "$prec" 3)
  /usr/bin/python3 - "$p" "$prec" "$dir/cpu-$p.log" "$dir/gpu-$prec.log" "$ck" <<'PY' || failed=$((failed + 1))
import json, struct, sys
p, name = sys.argv[1], sys.argv[2]
u = 2.0 ** -8 if p == "bf16" else 2.0 ** -11
def steps(path):
    ev = [json.loads(l) for l in open(path) if l.startswith("{")]
    return [e for e in ev if e["event"] == "step"]
c, g = steps(sys.argv[3]), steps(sys.argv[4])
assert len(c) == 3 and [e["step"] for e in c] == [e["step"] for e in g], (c, g)
worst = [0.0, 0.0]
for ec, eg in zip(c, g):
    dl = abs(ec["loss"] - eg["loss"]) / abs(ec["loss"])
    dn = abs(ec["grad_norm"] - eg["grad_norm"]) / abs(ec["grad_norm"])
    worst = [max(worst[0], dl), max(worst[1], dn)]
    assert dl <= u, (name, "loss", ec["step"], ec["loss"], eg["loss"])
    assert dn <= u, (name, "grad norm", ec["step"], ec["grad_norm"], eg["grad_norm"])
    if p == "f16":
        assert ec["loss_scale"] == eg["loss_scale"], (name, ec, eg)
        assert ec["skipped_steps"] == eg["skipped_steps"], (name, ec, eg)
b = open(sys.argv[5], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
meta = json.loads(b[8:8 + n])["__metadata__"]
assert meta["precision"] == p, (name, meta["precision"])
print("%s: losses cpu %s, cuda:0 %s; worst loss %.2g u, grad norm %.2g u" %
      (name, [e["loss"] for e in c], [e["loss"] for e in g], worst[0] / u, worst[1] / u))
PY
done

echo "test_cuda16_emu: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
