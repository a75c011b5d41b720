#!/usr/bin/env bash
# test_durable_diskfull.sh - a full disk (a small tmpfs) during a checkpoint, a loss.csv and a PNG
# write: each fails with the reason (strerror), leaves the previous files byte-identical, nothing
# partial under a final name and no temporary; once there is room, --resume takes the newest good
# checkpoint and completes the run. Needs root for mount (exit 77 = skipped otherwise).
# Usage: test_durable_diskfull.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
[ "$(id -u)" -eq 0 ] || { echo "test_durable_diskfull: skipped (needs root to mount a tmpfs)"; exit 77; }
dir=$(mktemp -d /tmp/ddpmd-test-diskfull-XXXXXX)
mnt="$dir/mnt"
mkdir "$mnt"
if ! mount -t tmpfs -o size=4m tmpfs "$mnt" 2>/dev/null; then
  rm -rf "$dir"
  echo "test_durable_diskfull: skipped (cannot mount a tmpfs here)"
  exit 77
fi
trap 'umount "$mnt"; rm -rf "$dir"' EXIT
spec() { # spec STEPS
  cat <<JSON
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 32, "block_out_channels": [16, 16],
             "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist" },
  "train": { "batch": 2, "steps": $1, "warmup": 0 },
  "output": { "log_every": 1, "checkpoint_every": 1, "sample_every": 0, "samples": 1,
              "keep_last": 10 } }
JSON
}
spec 2 > "$dir/spec2.json"
spec 3 > "$dir/spec3.json"
out="$mnt/out"
ck="$out/checkpoints"
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }
no_temps() { [ -z "$(find "$mnt" -name "*.tmp.*")" ]; }
# fill FILE [PAGES]: the rest of the tmpfs, or all but PAGES pages of it
fill() {
  rm -f "$mnt/fill"
  local avail keep=${1:-0}
  avail=$(stat -f -c %a "$mnt")
  [ "$avail" -gt "$keep" ] && dd if=/dev/zero of="$mnt/fill" bs=4096 count=$((avail - keep)) status=none 2>/dev/null
  return 0
}

"$ddpmd" train "$dir/spec2.json" --out "$out" > /dev/null 2> "$dir/err1"
rc=$?
check '[ "$rc" -eq 0 ] && [ -f "$ck/step-00000002.safetensors" ]' "first run: exit $rc, $(tail -n 1 "$dir/err1")"
cp "$ck/step-00000002.safetensors" "$dir/ckpt2"
cp "$out/loss.csv" "$dir/loss2"
size=$(stat -c %s "$ck/step-00000002.safetensors")

# 1. no room at all: the checkpoint of step 3 fails
fill
"$ddpmd" train "$dir/spec3.json" --out "$out" --resume > /dev/null 2> "$dir/err2"
rc=$?
check '[ "$rc" -eq 1 ]' "a checkpoint write on a full disk: exit $rc"
check 'grep -q "No space left on device" "$dir/err2"' "no reason for the failed checkpoint: $(tail -n 1 "$dir/err2")"
check '[ ! -e "$ck/step-00000003.safetensors" ]' "a partial checkpoint under its final name"
check 'cmp -s "$ck/step-00000002.safetensors" "$dir/ckpt2"' "the previous checkpoint changed"
check 'cmp -s "$out/loss.csv" "$dir/loss2"' "loss.csv changed"
check 'no_temps' "temporaries left: $(find "$mnt" -name "*.tmp.*")"

# 2. room for exactly the checkpoint: loss.csv (written next) fails, with its reason
fill $(( (size + 4095) / 4096 ))
"$ddpmd" train "$dir/spec3.json" --out "$out" --resume > /dev/null 2> "$dir/err3"
rc=$?
check '[ "$rc" -eq 1 ]' "a loss.csv write on a full disk: exit $rc"
check 'grep -q "loss.csv.*No space left on device" "$dir/err3"' "no reason for the failed loss.csv: $(tail -n 1 "$dir/err3")"
check '[ "$(stat -c %s "$ck/step-00000003.safetensors" 2>/dev/null)" = "$size" ]' "no whole checkpoint of step 3"
check 'cmp -s "$out/loss.csv" "$dir/loss2"' "loss.csv changed by a failed write"
check 'no_temps' "temporaries left: $(find "$mnt" -name "*.tmp.*")"

# 3. a PNG on a full disk (16 noisy images: more than stdio buffers): the reason, not
#    libpng's bare "Write Error"
fill
"$ddpmd" sample "$ck/step-00000002.safetensors" --n 16 --steps 1 --out "$mnt/grid.png" > /dev/null 2> "$dir/err4"
rc=$?
check '[ "$rc" -eq 1 ] && grep -q "grid.png.*No space left on device" "$dir/err4"' \
      "a PNG write on a full disk: exit $rc, $(tail -n 1 "$dir/err4")"
check '[ ! -e "$mnt/grid.png" ] && no_temps' "a partial PNG or a temporary left"

# 3b. the exported unet/config.json: room for the weights file only, so config.json (written
#     next) fails with its reason
rm -f "$mnt/fill"
"$ddpmd" export --diffusers "$mnt/exp" "$ck/step-00000002.safetensors" > /dev/null 2> "$dir/err6"
wsize=$(stat -c %s "$mnt/exp/unet/diffusion_pytorch_model.safetensors" 2>/dev/null || echo 0)
rm -rf "$mnt/exp"
mkdir "$mnt/exp"
fill $(( (wsize + 4095) / 4096 ))
"$ddpmd" export --diffusers "$mnt/exp" "$ck/step-00000002.safetensors" > /dev/null 2> "$dir/err6"
rc=$?
check '[ "$wsize" -gt 0 ] && [ "$rc" -eq 1 ] && grep -q "config.json.*No space left on device" "$dir/err6"' \
      "a config.json write on a full disk: exit $rc, $(head -n 1 "$dir/err6")"
check '[ ! -e "$mnt/exp/unet/config.json" ] && no_temps' "a partial config.json or a temporary left"
rm -rf "$mnt/exp"

# 4. room again: the resume takes the newest good checkpoint (3) and completes the run
rm -f "$mnt/fill"
"$ddpmd" train "$dir/spec3.json" --out "$out" --resume > "$dir/log5" 2> "$dir/err5"
rc=$?
check '[ "$rc" -eq 0 ]' "the resume after the disk was freed: exit $rc, $(tail -n 1 "$dir/err5")"
check 'grep -q "resuming from .*step-00000003.safetensors" "$dir/err5"' "did not resume from step 3"
check '[ -f "$out/samples/step-00000003.png" ] && [ -f "$out/loss.png" ]' "no final sample or loss curve"
check 'head -n 1 "$out/loss.csv" | grep -q "^step,loss,val_loss$" && grep -q "^2," "$out/loss.csv"' "loss.csv lost its rows"
check 'no_temps' "temporaries left"

echo "test_durable_diskfull: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
