#!/usr/bin/env bash
# test_signal.sh - a real Ctrl-C: `ddpmd train` gets SIGINT mid-run, writes a checkpoint at the
# step it stopped, exits 130; `--resume` then finishes the run. Usage: test_signal.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
dir=$(mktemp -d /tmp/ddpmd-test-signal-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/spec.json" <<'JSON'
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 32, "block_out_channels": [16, 16],
             "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist" },
  "train": { "batch": 2, "steps": 150, "warmup": 0 },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": 1 } }
JSON
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

"$ddpmd" train "$dir/spec.json" --out "$dir/out" > "$dir/log" 2> "$dir/err" &
pid=$!
for _ in $(seq 600); do grep -q '"step":3,' "$dir/log" 2>/dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
rc=$?
check '[ "$rc" -eq 130 ]' "exit status after SIGINT is $rc, not 130"
last=$(grep -o '"step":[0-9]*' "$dir/log" | tail -n 1 | cut -d: -f2)
ckpt=$(ls "$dir"/out/checkpoints/step-*.safetensors 2>/dev/null | tail -n 1)
check '[ -n "$ckpt" ]' "no checkpoint after SIGINT"
check '[ "$ckpt" = "$(printf "%s/out/checkpoints/step-%08d.safetensors" "$dir" "$last")" ]' \
      "checkpoint $ckpt is not at the last step $last"
check 'grep -q "resume with --resume" "$dir/err"' "no hint to resume"
check '[ "$last" -lt 150 ]' "the run was not interrupted (last step $last)"

"$ddpmd" train "$dir/spec.json" --out "$dir/out" --resume > "$dir/log2" 2> "$dir/err2"
rc=$?
check '[ "$rc" -eq 0 ]' "resumed run exit status $rc"
check 'grep -q "resuming from" "$dir/err2"' "resumed run does not say where it resumes"
first=$(grep -o '"step":[0-9]*' "$dir/log2" | head -n 1 | cut -d: -f2)
check '[ "$first" -eq $((last + 1)) ]' "resumed run starts at step $first, not $((last + 1))"
check '[ -f "$dir/out/checkpoints/step-00000150.safetensors" ]' "no final checkpoint"

echo "test_signal: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
