#!/usr/bin/env bash
# test_cli_errors.sh - the real ddpmd binary on bad numbers and bad spec files: each is refused
# with exit status 2 (1 for a checkpoint that cannot be opened) and a message naming the flag or
# field and the reason; nothing crashes (no status >= 128) and nothing hangs (a FIFO as spec).
# Also the defaults a new user meets: train.threads from the cores.
# Usage: test_cli_errors.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
dir=$(mktemp -d /tmp/ddpmd-test-cli-errors-XXXXXX)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
check() { if eval "$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

# expect STATUS FRAGMENT ARGS...: ddpmd ARGS exits STATUS within 10 s and its stderr holds FRAGMENT
expect() {
    local want=$1 frag=$2
    shift 2
    timeout 10 "$ddpmd" "$@" > "$dir/out" 2> "$dir/err" < /dev/null
    local rc=$?
    check '[ "$rc" -eq "$want" ]' "ddpmd $* exited $rc, not $want: $(head -c 300 "$dir/err")"
    check 'grep -qF -- "$frag" "$dir/err"' "ddpmd $*: no '$frag' in: $(head -c 300 "$dir/err")"
    check '[ "$(wc -c < "$dir/err")" -lt 2000 ]' "ddpmd $*: $(wc -c < "$dir/err") bytes of errors"
}

# model and training options go through the spec's validation (flag and field path named)
expect 2 "--threads: train.threads: must be in [0, 256], got 100000" plan --threads 100000
expect 2 "--threads: train.threads" demo --threads 100000 --steps 1
expect 2 "--groups: model.norm_num_groups: must be in [1, 1024], got 0" plan --groups 0
expect 2 "--ch" plan --ch 2000000000
expect 2 "model.block_out_channels[1]" plan --ch 600000 --mult 1,2
expect 2 "--layers: model.layers_per_block: must be in [1, 8], got 40" plan --layers 40 --mult 1,2
expect 2 "--image: model.image_size" plan --image 0
expect 2 "--channels: model.in_channels" plan --channels 9
expect 2 "--base: model.base" plan --preset seed --base 100000
expect 2 "--steps: train.steps" demo --steps 0
expect 2 "--seed: train.seed" demo --seed 9007199254740993
expect 2 "--batch: '8x' is not an integer" plan --batch 8x
expect 2 "--batch: '' is not an integer" plan --batch ""
expect 2 "--layers: '99999999999' is not an integer" plan --layers 99999999999
expect 2 "--seed: '-1' is not a non-negative integer" demo --seed -1
expect 2 "--mult" plan --mult 1,2,x
expect 2 "--mult" plan --mult 1,,2
expect 2 "--mult: at most 8" plan --mult 1,1,1,1,1,1,1,1,1
expect 2 "--attn" plan --attn 16,abc
expect 2 "--groups" plan --groups
expect 2 "ddpmd plan: unknown option '--x\\xff'" plan $'--x\xff'
check '! LC_ALL=C grep -q $'"'"'\xff'"'"' "$dir/err"' "a raw byte of an unknown option is echoed"
expect 2 "ddpmd sample: --sampler: 'dd\\x01im' is not a value it takes" sample "$dir/none.safetensors" --sampler $'dd\x01im'
# an unknown option is reported one way by every command, with the nearest known one
expect 2 "ddpmd train: unknown option '--thread'; did you mean --threads? (ddpmd train --help lists them)" train x.json --thread 2
expect 2 "ddpmd plan: unknown option '--jsn'; did you mean --json?" plan x.json --jsn
expect 2 "ddpmd plan: unknown option '--treads'; did you mean --threads?" plan --treads 2
expect 2 "ddpmd sample: unknown option '--setps'; did you mean --steps?" sample c.safetensors --setps 3
expect 2 "ddpmd export: unknown option '--diffuser'; did you mean --diffusers?" export --diffuser d c
expect 2 "ddpmd serve: unknown option '--max-con'; did you mean --max-conns?" serve --max-con 4
expect 2 "ddpmd: unknown command 'trian'; did you mean train?" trian
expect 2 "ddpmd train: --out needs a value" train x.json --out
expect 2 "ddpmd plan: unknown option '--zzzzzz' (ddpmd plan --help lists them)" plan --zzzzzz
check '! grep -q "did you mean" "$dir/err"' "a suggestion for an option nothing is near"
expect 2 "ddpmd train: unexpected argument 'b'" train a.json b
# --version: the build's version and, from a git checkout, its revision
timeout 10 "$ddpmd" --version > "$dir/out" 2> "$dir/err"
check 'grep -qE "^ddpmd [0-9]+\.[0-9]+\.[0-9]+( \([A-Za-z0-9._+-]+\))?$" "$dir/out"' "--version: $(cat "$dir/out" "$dir/err")"
timeout 10 "$ddpmd" train --help > "$dir/out" 2>&1
check 'grep -q "^usage: ddpmd COMMAND" "$dir/out"' "ddpmd train --help: $(head -c 200 "$dir/out")"

# sample's own numbers, checked before the checkpoint is opened
expect 2 "--steps: must be in [1, 100000], got 0" sample "$dir/none.safetensors" --steps 0
expect 2 "--eta: must be a number in [0, 1], got 'nan'" sample "$dir/none.safetensors" --eta nan
expect 2 "--eta" sample "$dir/none.safetensors" --eta 2
expect 2 "--eta: must be a number in [0, 1], got '0.5x'" sample "$dir/none.safetensors" --eta 0.5x
expect 2 "--n: must be in" sample "$dir/none.safetensors" --n 0
expect 2 "--n: '4k' is not an integer" sample "$dir/none.safetensors" --n 4k
expect 2 "--batch: must be in [1, 65535]" sample "$dir/none.safetensors" --batch 0
expect 2 "--batch: '8x' is not an integer" sample "$dir/none.safetensors" --batch 8x
expect 2 "--threads: must be in [1, 256], got 100000" sample "$dir/none.safetensors" --threads 100000
expect 2 "--seed: '12abc' is not a non-negative integer" sample "$dir/none.safetensors" --seed 12abc
expect 1 "No such file or directory" sample "$dir/none.safetensors"

# spec files: the reason, never a hang
mkfifo "$dir/fifo.json"
expect 2 "is not a regular file" train "$dir/fifo.json" --out "$dir/o"
expect 2 "is a directory" train "$dir" --out "$dir/o"
: > "$dir/empty.json"
expect 2 "empty file" train "$dir/empty.json" --out "$dir/o"
expect 2 "No such file or directory" train "$dir/missing.json" --out "$dir/o"
expect 2 "cannot open" sample "$dir/none.safetensors" --spec "$dir/fifo.json"

base='"model": {"preset": "ddpm", "in_channels": 1, "image_size": 32, "block_out_channels": [16, 16],
  "layers_per_block": 1, "attention_resolutions": [], "norm_num_groups": 4},
  "data": {"dataset": "fashion-mnist"}'
printf '{%s, "train": {"batch": 1%0300d}}' "$base" 0 > "$dir/long.json"
expect 2 "train.batch: must be in [1, 65535], got 1e+300" train "$dir/long.json" --out "$dir/o"
check '! grep -q 0000000000 "$dir/err"' "a 300-digit number is echoed whole"
printf '{%s, "train": {"b\xffx": 1}}' "$base" > "$dir/utf8.json"
expect 2 'train.b\xffx: the field name is not valid UTF-8' train "$dir/utf8.json" --out "$dir/o"
check '! LC_ALL=C grep -q $'"'"'\xff'"'"' "$dir/err"' "a raw non-UTF-8 byte is echoed"
printf '{%s, "train": {"beta2": 0.99999999}}' "$base" > "$dir/beta2.json"
expect 2 "train.beta2: must be in [0, 0.9999999]" train "$dir/beta2.json" --out "$dir/o"
printf '{%s, "train": {"lr": 1e-50}}' "$base" > "$dir/lr.json"
expect 2 "train.lr: must be in (0, 1], got 1e-50, which is 0 as a 32-bit float" train "$dir/lr.json" --out "$dir/o"
printf '{%s, "train": {"seed": 9007199254740993}}' "$base" > "$dir/seed.json"
expect 2 "train.seed: must be in [0, 9007199254740991]" train "$dir/seed.json" --out "$dir/o"
printf '{%s, "train": {"batch": 2, "batch": 0}}' "$base" > "$dir/dup.json"
expect 2 "train.batch: duplicate key" train "$dir/dup.json" --out "$dir/o"
printf '{%s} trailing' "$base" > "$dir/trail.json"
expect 2 "trailing bytes" train "$dir/trail.json" --out "$dir/o"
# work out of bounds by the spec's numbers alone, refused before planning (train and plan)
heavy='"model": {"preset": "ddpm", "in_channels": 1, "image_size": 1024, "block_out_channels":
  [64, 64, 128, 128, 256, 256, 512, 512], "layers_per_block": 2, "attention_resolutions": [16],
  "norm_num_groups": 32}, "data": {"dataset": "fashion-mnist", "fmnist_resize": "resize"}'
printf '{%s, "train": {"batch": 65535}}' "$heavy" > "$dir/heavy.json"
expect 2 "train.batch: a batch of 65535 images of 1x1024x1024 holds 1649242275840 bytes" train "$dir/heavy.json" --out "$dir/o"
expect 2 "train.batch: a batch of 65535 images" plan "$dir/heavy.json"
printf '{%s}' "${base/\"attention_resolutions\": \[\]/\"attention_resolutions\": [1000000]}" > "$dir/noattn.json"
expect 2 "model.attention_resolutions[0]: 1000000 matches no level: the levels are at 32, 16 pixels" train "$dir/noattn.json" --out "$dir/o"
expect 2 "model.attention_resolutions[0]: 1000000 matches no level" plan "$dir/noattn.json"
printf '{%s, "train": {"batch": 1}}' "${heavy/\[64, 64, 128, 128, 256, 256, 512, 512\]/[4096, 64, 64, 64, 64, 64, 64, 64]}" > "$dir/wide.json"
expect 2 "model.block_out_channels[0]: one image's activation at level 0 (4096 channels of 1024x1024) is 17179869184 bytes (16.0 GiB), more than the limit" plan "$dir/wide.json"
# the data's host bytes: Fashion-MNIST is held as its 28x28 bytes whatever the size, but 2,000
# images of 1024 px in the loader's two batches and the step's four buffers are ~47 GiB (unless
# the host has more)
need=$((60000 * (28 * 28 + 1 + 4) + 6 * 2000 * 1024 * 1024 * 4))
host=$(($(getconf _PHYS_PAGES) * $(getconf PAGE_SIZE)))
if [ "$host" -lt "$need" ]; then
  printf '{%s, "train": {"batch": 2000}}' "${heavy/\[64, 64, 128, 128, 256, 256, 512, 512\]/[32, 32, 64, 64, 64, 64, 64, 64]}" > "$dir/data.json"
  expect 2 "(60000 images of 1x1024x1024 held as 28x28 bytes, and batches of 2000), more than this host's" train "$dir/data.json" --out "$dir/o"
  expect 2 "data.dataset: the dataset and batch buffers need" plan "$dir/data.json"
fi
printf '{%s, "train": {"batch": 4}}' "$base" > "$dir/b4.json"
# the options a server's job gets its plan through: checked as the spec checks its fields
expect 2 "--precision: 'f64' is not one of auto, f32, bf16, f16" train "$dir/b4.json" --out "$dir/o" --precision f64
expect 2 "--recompute: 'all' is not one of auto, none, attention, resblock, level" train "$dir/b4.json" --out "$dir/o" --recompute all
expect 2 "--offload: 'yes' is not one of auto, off, on" train "$dir/b4.json" --out "$dir/o" --offload yes
expect 2 "--micro-batch: must be in [1, 65535], got 0" train "$dir/b4.json" --out "$dir/o" --micro-batch 0
expect 2 "memory.micro_batch" train "$dir/b4.json" --out "$dir/o" --micro-batch 5
expect 2 "--threads: must be in [1, 256], got 0" train "$dir/b4.json" --out "$dir/o" --threads 0
# sizes take their unit in any case, as the help lists them ("1gb" is 1GB)
timeout 60 "$ddpmd" plan "$dir/b4.json" --vram-budget 1gb > "$dir/out" 2> "$dir/err"
check 'grep -q "device budget 0.93 GiB" "$dir/out"' "plan --vram-budget 1gb: $(head -c 300 "$dir/out" "$dir/err")"
expect 2 "--vram-budget: '1xb' is not a size" plan "$dir/b4.json" --vram-budget 1xb
check '[ ! -e "$dir/o" ]' "a refused spec created its output folder"

# a real checkpoint (one step of a tiny model): --steps beyond its timesteps is refused by name
printf '{%s, "diffusion": {"timesteps": 50}, "train": {"batch": 1, "steps": 1, "warmup": 0},
  "output": {"checkpoint_every": 0, "sample_every": 0, "samples": 1}}' "$base" > "$dir/tiny.json"
timeout 120 "$ddpmd" train "$dir/tiny.json" --out "$dir/tiny" > /dev/null 2> "$dir/err"
rc=$?
check '[ "$rc" -eq 0 ]' "tiny training run exited $rc: $(tail -c 300 "$dir/err")"
ckpt="$dir/tiny/checkpoints/step-00000001.safetensors"
# a spec without train.threads trains on the cores this process may use, and a resume keeps the
# count its checkpoint was trained with (here under taskset: one core)
check 'grep -qF "train.threads not given: $(nproc) thread" "$dir/err"' "threads: $(grep threads "$dir/err")"
sed 's/"steps": 1,/"steps": 2,/' "$dir/tiny.json" > "$dir/tiny2.json"
timeout 120 taskset -c 0 "$ddpmd" train "$dir/tiny2.json" --out "$dir/tiny" --resume > /dev/null 2> "$dir/err"
check 'grep -qF "train.threads not given: $(nproc) thread" "$dir/err" &&
       grep -qF "(the count its checkpoint was trained with)" "$dir/err"' "resume threads: $(grep threads "$dir/err")"
expect 2 "--steps: must be at most the model's diffusion.timesteps (50), got 51" sample "$ckpt" --steps 51
expect 0 "wrote" sample "$ckpt" --steps 2 --n 1 --batch 1 --out "$dir/grid.png"
check '[ -s "$dir/grid.png" ]' "no grid written"

echo "test_cli_errors: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
