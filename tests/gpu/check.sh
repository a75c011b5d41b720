#!/usr/bin/env bash
# check.sh - the CUDA backend on a GPU machine in ONE call of at most 8 minutes, in two steps:
#   pack (here, on the Debian 12 development machine): builds Release for sm_90 (-O3, -Werror) in a
#     fresh build directory and packs the binaries - ddpmd, libddpmd_cuda.so, test_gpu_ops,
#     test_gpu_step, test_gpu_rt, gpu_bench, and libddpmd_cuda_emu.so for the dry run - with the
#     Debian shared libraries they load (ldd; not glibc's, libstdc++, libgcc_s, CUDA's or cuDNN's,
#     which the GPU machine has) into .gpu-pack/ddpmd-gpu.tar.xz (git-ignored; 27 MB, 59 libraries);
#   run (there: Ubuntu 24.04, CUDA 13.0 in /usr/local/cuda-13.0, cuDNN 9 in /usr/lib/x86_64-linux-gnu,
#     PyTorch in python3; no network, no apt, no oneDNN): unpacks it into a temporary directory,
#     LD_LIBRARY_PATH = the pack's lib/, /usr/local/cuda-13.0/lib64, /usr/lib/x86_64-linux-gnu,
#     and runs tests/gpu against the CPU backend (every op; a training step of each preset; the
#     budget, offload on the copy stream, the memory promise), `ddpmd train` and `ddpmd sample` on
#     cuda:0 against the CPU, the process overhead of ddpmd and PyTorch (what each holds on the
#     device beside its memory), then the benchmark (bench/gpu.sh) with the time left. Writes
#     check.md (the stages' table), gpu_bench.md and logs.tar.xz (every log) to $OUT (or
#     .gpu-pack/out).
#   tests/gpu/check.sh pack [BUILD_DIR]    (default build-gpu; CHECK_REUSE=1 keeps an existing one)
#   tests/gpu/check.sh run [PACK]          (default .gpu-pack/ddpmd-gpu.tar.xz)
# The machine with the GPU gets one call of the device tool, after `tests/gpu/check.sh pack` here:
#   run(command="bash tests/gpu/check.sh run", carry=[".gpu-pack"], timeout_s=560)
# (the checkout travels with it; the pack is the one ignored path carried, well under 64 MiB; its
# files come back under $OUT: check.md, gpu_bench.md, logs.tar.xz). Stage limits: the tests
# 90 s each, the CLI runs 120 s each, the benchmark the rest up to CHECK_BUDGET_S (450) from the
# start (runs that would start later are listed as skipped); STEPS and WARMUP (10, 3) are the
# benchmark's steps per run.
# CHECK_EMU=1 ... run: the same stages where there is no GPU, to prove the pack and the script (a
# dry run): the device is the CUDA emulator (the pack's libddpmd_cuda_emu.so), the CLI and
# benchmark runs tiny, torch on the CPU, the limits longer (28 minutes on the 2-core development
# machine at load 20-28; it proves the pack and the script, not the GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
mode=${1:-}
packdir=$repo/.gpu-pack
pack=$packdir/ddpmd-gpu.tar.xz
emu=${CHECK_EMU:-0}
# the libraries the GPU machine has and whose own copies the binaries must use there: glibc's, the
# C++ runtime's, CUDA's, cuDNN's, the driver's (ldd names; every other one travels in the pack)
system_libs='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn|libnvrtc|libnvJitLink)\.'

# ---- pack: here ----
if [ "$mode" = pack ]; then
    build=$(realpath -m "${2:-build-gpu}")
    nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
    [ -x "$nvcc" ] || { echo "check.sh pack: no nvcc at $nvcc"; exit 2; }
    t0=$(date +%s)
    [ "${CHECK_REUSE:-0}" = 1 ] || rm -rf "$build"
    mkdir -p "$build" "$packdir"
    echo "== configure and build ($build, sm_90, Release)"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDPMD_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 >"$build/configure.log" 2>&1 ||
        { tail -30 "$build/configure.log"; echo "check.sh pack: configure failed"; exit 1; }
    bins="ddpmd test_gpu_ops test_gpu_step test_gpu_rt gpu_bench"
    mods="libddpmd_cuda.so libddpmd_cuda_emu.so"
    # shellcheck disable=SC2086
    cmake --build "$build" -j"$(nproc)" --target $bins ddpmd_cuda ddpmd_cuda_emu \
        >"$build/build.log" 2>&1 ||
        { grep -E "error|Error" "$build/build.log" | head -40; echo "check.sh pack: build failed"; exit 1; }
    stage=$(mktemp -d /tmp/ddpmd-gpu-pack-XXXXXX)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/bin" "$stage/lib"
    for f in $bins $mods; do cp "$build/$f" "$stage/bin/"; done
    # the Debian libraries they load, but not the GPU machine's own (system_libs)
    for f in "$stage"/bin/*; do
        ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
    done | sort -u | while read -r name path; do
        grep -qE "$system_libs" <<<"$name" && continue
        cp -L "$path" "$stage/lib/$name"
    done
    missing=$(for f in "$stage"/bin/*; do ldd "$f" | grep "not found"; done | sort -u)
    [ -z "$missing" ] || { echo "check.sh pack: unresolved here:"; echo "$missing"; exit 1; }
    {
        echo "ddpmd GPU pack: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo +changes), built $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "nvcc: $("$nvcc" --version | tail -1)"
        echo "sm_90, Release; bin: $bins $mods"
        echo "lib: $(cd "$stage/lib" && ls | tr '\n' ' ')"
    } > "$stage/PACK"
    tar -C "$stage" -cf - PACK bin lib | xz -T0 -3 > "$pack.tmp" && mv "$pack.tmp" "$pack" ||
        { echo "check.sh pack: packing failed"; exit 1; }
    echo "== packed $(du -h "$pack" | cut -f1) into $pack in $(( $(date +%s) - t0 )) s"
    cat "$stage/PACK"
    exit 0
fi

[ "$mode" = run ] || { echo "usage: tests/gpu/check.sh pack [BUILD_DIR] | run [PACK]"; exit 2; }

# ---- run: there (or here with CHECK_EMU=1) ----
pack=$(realpath -m "${2:-$pack}")
t0=$(date +%s)
deadline=$(( t0 + ${CHECK_BUDGET_S:-$([ "$emu" = 1 ] && echo 3600 || echo 450)} ))
out=${OUT:-$packdir/out}
mkdir -p "$out"
work=$(mktemp -d /tmp/ddpmd-gpu-run-XXXXXX)
trap 'rm -rf "$work"' EXIT
logs=$work/logs
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
    cp "$logs/check.md" "$out/check.md"
    [ -f "$logs/gpu_bench.md" ] && cp "$logs/gpu_bench.md" "$out/gpu_bench.md"
    tar -C "$work" -cf - logs | xz -T0 > "$out/logs.tar.xz"
    exit $fail
}

say "unpack $pack"
[ -f "$pack" ] || { echo "check.sh run: no pack at $pack (run tests/gpu/check.sh pack first)"; fail=1
                    stage unpack FAILED "$t0" "no pack"; finish; }
if ! xz -dc "$pack" | tar -C "$work" -xf -; then
    fail=1; stage unpack FAILED "$t0" "xz/tar"; finish
fi
cat "$work/PACK" | tee "$logs/pack.txt"
build=$work/bin
export LD_LIBRARY_PATH="$work/lib:/usr/local/cuda-13.0/lib64:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# every library of every binary resolves (the pack's, the CUDA toolkit's, the system's)
unresolved=$(for f in "$build"/*; do ldd "$f" 2>&1 | grep "not found" | sed "s|^|$(basename "$f"): |"; done)
if [ -n "$unresolved" ] && [ "$emu" != 1 ]; then
    echo "$unresolved" | tee "$logs/ldd.txt"
    fail=1; stage unpack FAILED "$t0" "libraries not found: $(echo "$unresolved" | head -3 | tr '\n' ' ')"; finish
fi
# (under the emulator the real module's CUDA libraries may be missing: it is not loaded)
# and every one but the machine's own (system_libs) comes from the pack
outside=$(for f in "$build"/*; do
    ldd "$f" 2>/dev/null | re=$system_libs awk -v b="$(basename "$f")" -v w="$work/lib/" \
        '$2 == "=>" && $3 ~ /^\// && $1 !~ ENVIRON["re"] && index($3, w) != 1 { print b ": " $1 " from " $3 }'
done)
if [ -n "$outside" ]; then
    echo "$outside" | tee "$logs/ldd.txt"
    fail=1; stage unpack FAILED "$t0" "not in the pack: $(echo "$outside" | head -2 | tr '\n' ' ')"; finish
fi
stage unpack passed "$t0" "$(du -sh "$work" | cut -f1) unpacked, $(ls "$work/lib" | wc -l) libraries, each binary's own from the pack"

say "device"
if [ "$emu" = 1 ]; then
    echo "the CUDA emulator ($build/libddpmd_cuda_emu.so): the script's run, not the GPU's"
    export DDPMD_CUDA_MODULE="$build/libddpmd_cuda_emu.so" EMU_DEVICE_MB=2048
    export TORCH_DEVICE=cpu STEPS=1 WARMUP=1 CONFIGS="$work/cli/spec.json:2"
    size=16 chans="[8, 16]" attn="[8]" groups=4 batch=2 steps=2 threads=2 limit=600
else
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,memory.total,driver_version \
            --format=csv,noheader | tee "$logs/device.txt"; then
        echo "check.sh: no NVIDIA GPU visible (nvidia-smi)"; fail=1
        stage device FAILED "$t0" "nvidia-smi"; finish
    fi
    export DDPMD_CUDA_MODULE="$build/libddpmd_cuda.so"
    size=32 chans="[32, 64]" attn="[16]" groups=8 batch=8 steps=5 threads=8 limit=120
fi

run_test() {
    local name=$1 limit=$2 rc ts
    ts=$(date +%s)
    say "$name"
    DDPMD_CUDA_VERBOSE=1 OMP_NUM_THREADS=8 timeout "$limit" "$build/$name" >"$logs/$name.log" 2>&1
    rc=$?
    grep -E "^(FAIL|device|philox|ddpm|seed|  step|  after|  exec_init|over budget|budget|plain|offload|SKIPPED|ddpmd cuda: device [0-9]+)" \
        "$logs/$name.log" | head -40
    tail -1 "$logs/$name.log"
    case $rc in
        0) stage "$name" passed "$ts" "$(tail -1 "$logs/$name.log")" ;;
        77) stage "$name" SKIPPED "$ts" "no device?"; fail=1 ;;
        124) stage "$name" "TIMED OUT" "$ts" "after ${limit}s"; fail=1 ;;
        *) stage "$name" FAILED "$ts" "exit $rc: $(grep -m1 ^FAIL "$logs/$name.log" | cut -c1-80)"; fail=1 ;;
    esac
}
run_test test_gpu_ops $(( emu ? 900 : 90 ))
run_test test_gpu_step $(( emu ? 900 : 90 ))
run_test test_gpu_rt $(( emu ? 900 : 90 ))

say "ddpmd train / sample on cuda:0 against the CPU"
ts=$(date +%s)
cli=$work/cli
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
ddpmd train "$cli/spec.json" --out "$cli/gpu" --device cuda:0 --deterministic > "$logs/train_gpu.log" 2> "$logs/train_gpu.err"
r2=$?
ddpmd train "$cli/offload.json" --out "$cli/off" --device cuda:0 --deterministic > "$logs/train_off.log" 2> "$logs/train_off.err"
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
cp "$cli"/*.png "$logs/" 2>/dev/null
echo "$note"
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ] && [ $r4 -eq 0 ] && [ $r5 -eq 0 ] && [ $r6 -eq 0 ] &&
        [ -s "$cli/gpu.png" ] && [ -s "$cli/cpu.png" ]; then
    stage "cli train/sample" passed "$ts" "$note"
else
    stage "cli train/sample" FAILED "$ts" "exit $r1 $r2 $r3 $r4 $r5 $r6: $(echo "$note" | tail -1 | cut -c1-80)"
    fail=1
fi

# what each process holds on the device beside its own memory, after a few steps of the user's case
# (seed-64, batch 8, bf16): ddpmd's context, handles and loaded kernels (bk_device_mem.process)
# against PyTorch's beside its caching allocator (torch_gpu_step.py's process_bytes)
say "process overhead: ddpmd against PyTorch"
ts=$(date +%s)
pspec=examples/seed-64.json pbatch=8
[ "$emu" = 1 ] && pspec=$cli/spec.json pbatch=2
timeout 120 "$build/gpu_bench" "$pspec" --device cuda:0 --batch "$pbatch" --precision bf16 \
    --steps 2 --warmup 1 --threads 8 > "$logs/process_ddpmd.txt" 2>> "$logs/process_ddpmd.err"
pyth=python3
tdev=${TORCH_DEVICE:-cuda}
timeout 180 "$pyth" bench/torch_gpu_step.py --spec "$pspec" --batch "$pbatch" --mode amp-bf16 \
    --device "$tdev" --steps 2 --warmup 1 > "$logs/process_torch.txt" 2> "$logs/process_torch.err"
kv() { awk -v k="$2" '$1 == k { print $2; exit }' "$1" 2>/dev/null; }
mib() { [ -n "$1" ] && awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
dp0=$(kv "$logs/process_ddpmd.txt" process_bytes_start)
dp=$(kv "$logs/process_ddpmd.txt" process_bytes)
tp=$(kv "$logs/process_torch.txt" process_bytes)
fmt() { if [ -n "$1" ]; then echo "$(mib "$1") MiB"; else echo "${2:-?}"; fi; }
pnote="ddpmd $(fmt "$dp") (after the warm-up $(fmt "$dp0")), torch $(fmt "$tp" "? (on $tdev)")"
echo "$pnote"
if [ -z "$dp" ]; then
    stage "process overhead" FAILED "$ts" "gpu_bench: $(tail -1 "$logs/process_ddpmd.err" | cut -c1-80)"; fail=1
elif [ -n "$tp" ] && [ "$dp" -gt "$tp" ]; then
    stage "process overhead" "over torch's" "$ts" "$pnote (goal: at most torch's)"
else
    stage "process overhead" measured "$ts" "$pnote"
fi

say "benchmark: ddpmd against PyTorch (until $(( deadline - t0 )) s)"
ts=$(date +%s)
DEADLINE=$deadline RUN_LIMIT=${RUN_LIMIT:-150} OUT="$logs" bash bench/gpu.sh "$build" | tee "$logs/bench.log"
met=$(grep -c ': met$' "$logs/gpu_bench.md" 2>/dev/null)
missed=$(grep -c ': missed$' "$logs/gpu_bench.md" 2>/dev/null)
stage benchmark done "$ts" "table in gpu_bench.md; ${met:-0} goals met, ${missed:-0} missed"
finish
