#!/usr/bin/env bash
# test_examples.sh - every shipped example runs out of the box: each examples/*.json names data
# that exists here (the built-in fashion-mnist, or a folder in the repository) and plans; the
# data each one reads is loaded and trained for a step exactly as the example asks (its data
# section, image size and channels: Fashion-MNIST as RGB at 32 px padded, at 64 px resized) on a
# small model, so the test takes seconds, not the examples' minutes per step; and a run that
# fails (a data folder that does not exist) leaves no empty output folders behind.
# Usage: test_examples.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d /tmp/ddpmd-test-examples-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[ -d /usr/share/datasets/fashion-mnist ] || { echo "SKIP: dataset-fashion-mnist is not installed"; exit 77; }
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

# derive SPEC OUT: the example's data, size and channels on a small ddpm model, one step
derive() {
  python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
m = s["model"]
s["model"] = {"preset": "ddpm", "in_channels": m["in_channels"], "image_size": m["image_size"],
              "block_out_channels": [8, 8], "layers_per_block": 1, "attention_resolutions": [],
              "norm_num_groups": 4}
s["data"]["validation"] = min(s["data"].get("validation", 0), 4)
s["train"] = {"batch": 1, "steps": 1, "warmup": 0, "threads": 2}
s["output"] = {"checkpoint_every": 1, "sample_every": 0, "samples": 1, "log_every": 1}
s.pop("memory", None)
json.dump(s, open(sys.argv[2], "w"))
PY
}

n=0
for ex in "$root"/examples/*.json; do
  name=$(basename "$ex" .json)
  n=$((n + 1))
  data=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data"]["dataset"])' "$ex")
  check '[ "$data" = fashion-mnist ] || [ -d "$root/$data" ]' "$name names data that is not here: $data"
  (cd "$dir" && timeout 120 "$ddpmd" plan "$ex" > "$dir/plan.out" 2> "$dir/plan.err")
  rc=$?
  check '[ "$rc" -eq 0 ]' "ddpmd plan $name exited $rc: $(tail -c 300 "$dir/plan.err")"
  derive "$ex" "$dir/$name.json"
  (cd "$dir" && timeout 300 "$ddpmd" train "$dir/$name.json" --out "$dir/out-$name" \
     > /dev/null 2> "$dir/train.err")
  rc=$?
  check '[ "$rc" -eq 0 ] && [ -s "$dir/out-$name/checkpoints/step-00000001.safetensors" ]' \
        "$name's data (a step of a small model on it): exit $rc: $(tail -c 300 "$dir/train.err")"
  rm -rf "$dir/out-$name"
done
check '[ "$n" -ge 3 ]' "only $n examples"

# a failed run (its data folder does not exist) leaves no empty folders: the default out/NAME
# and out/, and a given --out
python3 - "$root/examples/fmnist-tiny.json" "$dir/missing.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["data"] = {"dataset": "data/no-such-images"}
json.dump(s, open(sys.argv[2], "w"))
PY
mkdir "$dir/cwd"
(cd "$dir/cwd" && timeout 60 "$ddpmd" train "$dir/missing.json" > /dev/null 2> "$dir/err")
rc=$?
check '[ "$rc" -eq 1 ] && grep -q "no-such-images" "$dir/err"' "the missing folder: exit $rc: $(tail -c 300 "$dir/err")"
check '[ -z "$(ls -A "$dir/cwd")" ]' "a failed run left $(cd "$dir/cwd" && find . -mindepth 1 | head -5)"
timeout 60 "$ddpmd" train "$dir/missing.json" --out "$dir/given/out" > /dev/null 2> "$dir/err"
rc=$?
check '[ "$rc" -eq 1 ] && [ ! -e "$dir/given/out" ]' "a failed run left its --out folder (exit $rc)"

echo "test_examples: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
