#!/usr/bin/env bash
# check.sh - the CUDA backend on a machine with an NVIDIA GPU and the CUDA toolkit (nvcc, cuBLAS,
# cuDNN 9 under /usr/local/cuda), in ONE call of at most 8 minutes: builds in a fresh build
# directory for sm_90 (Release, -O3, -Werror), runs tests/gpu against the CPU backend (every op;
# a training step of each preset; the budget, offload on the copy stream, the memory promise),
# `ddpmd train` and `ddpmd sample` on cuda:0 against the CPU, then the GPU benchmark (bench/gpu.sh:
# ddpmd against PyTorch, images/s and peak memory against the goals) with what time is left.
# Prints a short table of the stages; with $OUT set writes it, the benchmark's table and every
# log there.
#   tests/gpu/check.sh [BUILD_DIR]        (default build-gpu; removed and made afresh)
# Time: the build ~2 min on 16 cores, the tests and CLI runs ~1 min, the benchmark the rest up to
# 7.5 min from the start (runs that would start later are listed as skipped). STEPS and WARMUP
# (10, 3) are the benchmark's steps per run; CHECK_BUDGET_S (450) moves the deadline.
# Build dependencies: the build subset of scripts/install-deps.sh, installed with apt-get when
# missing; a machine without network can take them as .deb files in $DDPMD_DEBS (dpkg -i).
# CHECK_EMU=1 runs the same stages where there is no GPU, to know the script works: BUILD_DIR is
# an existing build (not rebuilt), the device the CUDA emulator (libddpmd_cuda_emu.so), the CLI
# and benchmark runs tiny, torch on the CPU (minutes; it proves the script, not the GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
emu=${CHECK_EMU:-0}
build=$(realpath -m "${1:-build-gpu}")
t0=$(date +%s)
deadline=$(( t0 + ${CHECK_BUDGET_S:-450} ))
logs=${OUT:-$build.logs}
mkdir -p "$logs"
say() { printf '== %s (%ds)\n' "$*" $(( $(date +%s) - t0 )); }
summary=()
stage() { summary+=("| $1 | $2 | $(( $(date +%s) - ${3:-$t0} )) s | ${4:-} |"); }
fail=0
finish() {
    {
        echo "| stage | result | seconds | note |"
        echo "|---|---|---|---|"
        printf '%s\n' "${summary[@]}"
        echo
        echo "check.sh: $([ $fail -eq 0 ] && echo all passed || echo FAILURES) in $(( $(date +%s) - t0 )) s"
    } > "$logs/check.md"
    say "summary"
    cat "$logs/check.md"
    exit $fail
}

say "device"
if [ "$emu" = 1 ]; then
    echo "the CUDA emulator ($build/libddpmd_cuda_emu.so): the script's run, not the GPU's"
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv,noheader | tee "$logs/device.txt"; then
    echo "check.sh: no NVIDIA GPU visible (nvidia-smi)"; exit 2
fi
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ "$emu" = 1 ] || [ -x "$nvcc" ] || { echo "check.sh: no nvcc at $nvcc"; exit 2; }
[ "$emu" = 1 ] || "$nvcc" --version | tail -1

say "build dependencies"
have_deps() {
    command -v cmake >/dev/null && command -v cc >/dev/null && command -v c++ >/dev/null || return 1
    local h
    for h in oneapi/dnnl/dnnl.h cjson/cJSON.h png.h zlib.h; do
        printf '#include <%s>\nint main(void){return 0;}\n' "$h" |
            cc -x c - -o /dev/null >/dev/null 2>&1 || { echo "missing: $h"; return 1; }
    done
}
if ! have_deps; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    if [ -n "${DDPMD_DEBS:-}" ] && ls "$DDPMD_DEBS"/*.deb >/dev/null 2>&1; then
        $SUDO dpkg -i "$DDPMD_DEBS"/*.deb >/dev/null || true
    else
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            --no-install-recommends build-essential cmake pkg-config libdnnl-dev \
            libcjson-dev libpng-dev zlib1g-dev >/dev/null || true
    fi
    have_deps || { echo "check.sh: build dependencies missing (see above)"; exit 2; }
fi

tb=$(date +%s)
if [ "$emu" = 1 ]; then
    stage build "not built (CHECK_EMU)" "$tb" "$build"
    export DDPMD_CUDA_MODULE="$build/libddpmd_cuda_emu.so" EMU_DEVICE_MB=2048
    export TORCH_DEVICE=cpu STEPS=1 WARMUP=1 CONFIGS="$build/cli/spec.json:2"
    size=16 chans="[8, 16]" attn="[8]" groups=4 batch=2 steps=2 threads=2 limit=600
else
say "configure and build ($build, sm_90, Release)"
size=32 chans="[32, 64]" attn="[16]" groups=8 batch=8 steps=5 threads=8 limit=120
rm -rf "$build"
# the whole tree builds clean at -O3 with -Werror (no warning is waived here)
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDPMD_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 >"$logs/configure.log" 2>&1; then
    tail -30 "$logs/configure.log"; echo "check.sh: configure failed"; fail=1
    stage build FAILED "$tb" "configure: see configure.log"; finish
fi
if ! cmake --build "$build" -j"$(nproc)" --target ddpmd ddpmd_cuda test_gpu_ops test_gpu_step \
        test_gpu_rt gpu_bench >"$logs/build.log" 2>&1; then
    grep -E "error|Error" "$logs/build.log" | head -40; echo "check.sh: build failed"; fail=1
    stage build FAILED "$tb" "see build.log"; finish
fi
stage build passed "$tb" "sm_90, $(du -h "$build/libddpmd_cuda.so" | cut -f1) module"
export DDPMD_CUDA_MODULE="$build/libddpmd_cuda.so"
fi

run_test() {
    local name=$1 limit=$2 rc ts
    ts=$(date +%s)
    say "$name"
    DDPMD_CUDA_VERBOSE=1 OMP_NUM_THREADS=8 timeout "$limit" "$build/$name" >"$logs/$name.log" 2>&1
    rc=$?
    grep -E "^(FAIL|device|philox|ddpm|seed|  step|  after|over budget|budget|plain|offload|SKIPPED|ddpmd cuda: device [0-9]+ \()" \
        "$logs/$name.log" | head -40
    tail -1 "$logs/$name.log"
    case $rc in
        0) stage "$name" passed "$ts" "$(tail -1 "$logs/$name.log")" ;;
        77) stage "$name" SKIPPED "$ts" "no device?"; fail=1 ;;
        124) stage "$name" "TIMED OUT" "$ts" "after ${limit}s"; fail=1 ;;
        *) stage "$name" FAILED "$ts" "exit $rc: $(grep -m1 ^FAIL "$logs/$name.log" | cut -c1-80)"; fail=1 ;;
    esac
}
run_test test_gpu_ops $(( emu ? 300 : 90 ))
run_test test_gpu_step $(( emu ? 300 : 90 ))
run_test test_gpu_rt $(( emu ? 300 : 90 ))

say "ddpmd train / sample on cuda:0 against the CPU"
ts=$(date +%s)
cli=$build/cli
rm -rf "$cli"
mkdir -p "$cli/data"
# 16 small PNGs (no dataset package needed): smooth random colour fields
python3 - "$cli/data" "$size" <<'PY'
import random, struct, sys, zlib
def png(path, w, h, rows):
    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    raw = b"".join(b"\x00" + bytes(r) for r in rows)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
random.seed(1)
n = int(sys.argv[2])
for i in range(16):
    a, b = [random.randrange(256) for _ in range(3)], [random.randrange(256) for _ in range(3)]
    rows = [[int(a[c] + (b[c] - a[c]) * (x + y) / (2 * n - 2)) for x in range(n) for c in range(3)]
            for y in range(n)]
    png("%s/img%02d.png" % (sys.argv[1], i), n, n, rows)
PY
cat > "$cli/spec.json" <<JSON
{ "model": { "preset": "ddpm", "in_channels": 3, "image_size": $size, "block_out_channels": $chans,
             "layers_per_block": 1, "attention_resolutions": $attn, "norm_num_groups": $groups },
  "data": { "dataset": "$cli/data", "validation": 0 },
  "train": { "batch": $batch, "steps": $steps, "warmup": 0, "threads": $threads },
  "output": { "log_every": 1, "checkpoint_every": 0, "sample_every": 0, "samples": 1 } }
JSON
sed 's/"output"/"memory": { "precision": "f32", "offload": "on" },\n  "output"/' "$cli/spec.json" \
    > "$cli/offload.json"
ddpmd() { timeout "$limit" "$build/ddpmd" "$@"; }
ddpmd train "$cli/spec.json" --out "$cli/cpu" > "$logs/train_cpu.log" 2> "$logs/train_cpu.err"
r1=$?
ddpmd train "$cli/spec.json" --out "$cli/gpu" --device cuda:0 > "$logs/train_gpu.log" 2> "$logs/train_gpu.err"
r2=$?
ddpmd train "$cli/offload.json" --out "$cli/off" --device cuda:0 > "$logs/train_off.log" 2> "$logs/train_off.err"
r3=$?
ck=$(printf "%s/gpu/checkpoints/step-%08d.safetensors" "$cli" "$steps")
ddpmd sample "$ck" --n 4 --steps "$steps" --out "$cli/gpu.png" --device cuda:0 > /dev/null 2> "$logs/sample_gpu.err"
r4=$?
ddpmd sample "$ck" --n 4 --steps "$steps" --out "$cli/cpu.png" > /dev/null 2> "$logs/sample_cpu.err"
r5=$?
note=$(python3 - "$logs" "$steps" <<'PY' 2>&1
import json, os, sys
logs, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    ev = [json.loads(l) for l in open(os.path.join(logs, name)) if l.startswith("{")]
    return [(e["loss"], e["grad_norm"], e.get("img_per_s", 0)) for e in ev if e["event"] == "step"]
c, g, o = losses("train_cpu.log"), losses("train_gpu.log"), losses("train_off.log")
assert len(c) == len(g) == len(o) == steps, (len(c), len(g), len(o))
# fp32 on both (parity mode: no TF32): the same losses within float rounding grown over the steps
worst = max(abs(a[0] - b[0]) / max(abs(a[0]), 1e-3) for a, b in zip(c, g))
worst_off = max(abs(a[0] - b[0]) / max(abs(a[0]), 1e-3) for a, b in zip(g, o))
assert worst < 2e-3 and worst_off < 2e-3, (worst, worst_off)
print("%d steps: losses within %.1e of the CPU's (offload %.1e of cuda:0's); %.1f img/s cuda:0, "
      "%.1f offload, %.1f cpu" % (steps, worst, worst_off, g[-1][2], o[-1][2], c[-1][2]))
PY
)
r6=$?
echo "$note"
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ] && [ $r4 -eq 0 ] && [ $r5 -eq 0 ] && [ $r6 -eq 0 ] &&
        [ -s "$cli/gpu.png" ] && [ -s "$cli/cpu.png" ]; then
    stage "cli train/sample" passed "$ts" "$note"
else
    stage "cli train/sample" FAILED "$ts" "exit $r1 $r2 $r3 $r4 $r5 $r6: $(echo "$note" | tail -1 | cut -c1-80)"
    fail=1
fi

say "benchmark: ddpmd against PyTorch (until $(( deadline - t0 )) s)"
ts=$(date +%s)
DEADLINE=$deadline RUN_LIMIT=${RUN_LIMIT:-150} OUT="$logs" bash bench/gpu.sh "$build" | tee "$logs/bench.log"
met=$(grep -c ': met$' "$logs/gpu_bench.md" 2>/dev/null)
missed=$(grep -c ': missed$' "$logs/gpu_bench.md" 2>/dev/null)
stage benchmark done "$ts" "table in gpu_bench.md; ${met:-0} goals met, ${missed:-0} missed"
finish
