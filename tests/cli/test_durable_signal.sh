#!/usr/bin/env bash
# test_durable_signal.sh - a real SIGTERM during the end-of-run sample grid: `ddpmd train` stops
# between two denoising steps (not minutes later), exits 130 with the final checkpoint on disk and
# no partial PNG; `--resume` then trains nothing and writes the missing grid. Also: --resume
# without a checkpoint is an error; a FIFO as checkpoint does not hang.
# Usage: test_durable_signal.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
dir=$(mktemp -d /tmp/ddpmd-test-durable-signal-XXXXXX)
trap '[ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
spec() { # spec SAMPLES
  cat <<JSON
{ "model": { "preset": "ddpm", "in_channels": 1, "image_size": 32, "block_out_channels": [16, 16],
             "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4 },
  "data": { "dataset": "fashion-mnist" },
  "train": { "batch": 2, "steps": 2, "warmup": 0 },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": $1 } }
JSON
}
spec 256 > "$dir/spec.json"
spec 4 > "$dir/spec4.json"
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

"$ddpmd" train "$dir/spec.json" --out "$dir/none" --resume > /dev/null 2> "$dir/err0"
rc=$?
check '[ "$rc" -eq 1 ] && grep -q "nothing to resume" "$dir/err0"' \
      "--resume without a checkpoint: rc $rc, $(tail -n 1 "$dir/err0")"

# a FIFO as checkpoint: refused at once (the timeout only bounds a hang)
mkfifo "$dir/fifo.safetensors"
timeout 20 "$ddpmd" sample "$dir/fifo.safetensors" --out "$dir/x.png" > /dev/null 2> "$dir/errf"
rc=$?
check '[ "$rc" -eq 1 ] && grep -q "not a regular file" "$dir/errf"' "sample of a FIFO: rc $rc, $(tail -n 1 "$dir/errf")"
timeout 20 "$ddpmd" export --diffusers "$dir/exp" "$dir/fifo.safetensors" > /dev/null 2> "$dir/errf"
rc=$?
check '[ "$rc" -eq 1 ] && grep -q "not a regular file" "$dir/errf"' "export of a FIFO: rc $rc, $(tail -n 1 "$dir/errf")"

# 256 samples: 16 chunks of 50 DDIM steps, far longer than the wait for the signal
"$ddpmd" train "$dir/spec.json" --out "$dir/out" > "$dir/log" 2> "$dir/err" &
pid=$!
for _ in $(seq 1200); do grep -q '"event":"sampling"' "$dir/log" 2>/dev/null && break; sleep 0.1; done
check 'grep -q "\"event\":\"sampling\",\"step\":2,\"done\":1,\"total\":800}" "$dir/log"' \
      "no sampling progress line before the signal"
kill -TERM "$pid"
# a bound on a hang, not a timing assertion: a stop between denoising steps takes a forward pass
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  check 'false' "SIGTERM during the final sampling did not end the run within 60 s"
  kill -9 "$pid"
fi
wait "$pid"
rc=$?
pid=
check '[ "$rc" -eq 130 ]' "exit status after SIGTERM during sampling is $rc, not 130"
done_n=$(grep -o '"event":"sampling","step":2,"done":[0-9]*' "$dir/log" | tail -n 1 | grep -o '[0-9]*$')
check '[ -n "$done_n" ] && [ "$done_n" -lt 800 ]' "sampling was not interrupted (reached ${done_n:-?}/800)"
check 'grep -q "\"event\":\"stopped\",\"step\":2}" "$dir/log"' "no stopped event"
check '[ -f "$dir/out/checkpoints/step-00000002.safetensors" ]' "no final checkpoint after the stop"
check '[ ! -e "$dir/out/samples/step-00000002.png" ]' "a sample grid exists after an interrupted sampling"
check '[ -z "$(find "$dir/out" -name "*.tmp.*")" ]' "temporaries left: $(find "$dir/out" -name "*.tmp.*")"

# the resume owes only the grid (a smaller one: output.samples may change on a resume)
"$ddpmd" train "$dir/spec4.json" --out "$dir/out" --resume > "$dir/log2" 2> "$dir/err2"
rc=$?
check '[ "$rc" -eq 0 ]' "resumed run exit status $rc: $(tail -n 2 "$dir/err2")"
check 'grep -q "resuming from .*step-00000002.safetensors" "$dir/err2"' "does not say where it resumes"
check 'grep -q "output.samples 4" "$dir/err2"' "the changed output.samples is not stated"
check '! grep -q "\"event\":\"step\"" "$dir/log2"' "the resumed run trained again"
check '[ -f "$dir/out/samples/step-00000002.png" ]' "--resume did not write the missing final sample"
check 'grep -q "\"event\":\"done\"" "$dir/log2"' "no done event"

echo "test_durable_signal: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
