#!/usr/bin/env bash
# gpu.sh - the GPU training-step benchmark: ddpmd (bench/gpu_bench.c) against PyTorch
# (bench/torch_gpu_step.py: eager fp32, autocast bf16 + channels_last + SDPA, torch.compile of
# that) on the same machine, per config (a spec file and a batch): images/s, peak device memory
# (ddpmd: the plan and what cudaMemGetInfo saw the run take, plus the process's own; torch:
# max_memory_allocated, plus the process's own beside its allocator's), the process overhead of
# each (ddpmd's at most torch's), and the goals: ddpmd >= 1.3x torch amp-bf16's images/s and >= torch
# compiled's, at <= 0.5x their peak memory. Prints a markdown table; with $OUT set also writes it
# to $OUT/gpu_bench.md (and the raw key-value outputs under $OUT/gpu_bench/). Not a test.
#   bench/gpu.sh [BUILD_DIR]                      (default build)
# Environment (defaults in brackets):
#   CONFIGS   "SPEC:BATCH ..." ["examples/ddpm-cifar10.json:128 examples/seed-64.json:8
#             examples/seed-64.json:64"]
#   STEPS, WARMUP   timed and untimed steps per run [10, 3]; torch.compile's warm-up compiles
#   DEVICE    ddpmd's device [cuda:0];  TORCH_DEVICE  torch's [cuda]
#   PRECISIONS  ddpmd's [f32 bf16 f32/eager f32/parity]: a precision, in fast mode with CUDA
#             graphs unless /parity (--deterministic) or /eager (--eager) follows it
#             TORCH_MODES [eager-fp32 amp-bf16 compile-bf16]
#   PYTHON    the interpreter with torch [the first of python3, /usr/bin/python3,
#             /usr/local/bin/python3, /opt/conda/bin/python that imports torch (with CUDA when
#             TORCH_DEVICE is cuda)]
#   DEADLINE  epoch seconds after which no run starts (its row says "skipped: time") [none];
#   RUN_LIMIT seconds one run may take [300]
# Runs here without a GPU: DEVICE=cuda:0 DDPMD_CUDA_MODULE=build/libddpmd_cuda_emu.so
# TORCH_DEVICE=cpu CONFIGS=tiny.json:2 STEPS=1 WARMUP=1 (the emulator proves the script, not speed).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
configs=${CONFIGS:-"examples/ddpm-cifar10.json:128 examples/seed-64.json:8 examples/seed-64.json:64"}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
device=${DEVICE:-cuda:0}
tdevice=${TORCH_DEVICE:-cuda}
precisions=${PRECISIONS:-"f32 bf16 f32/eager f32/parity"}
tmodes=${TORCH_MODES:-"eager-fp32 amp-bf16 compile-bf16"}
limit=${RUN_LIMIT:-300}
raw=$(mktemp -d /tmp/ddpmd-gpu-bench-XXXXXX)
trap 'rm -rf "$raw"' EXIT

python=${PYTHON:-}
if [ -z "$python" ]; then
    want='import torch'
    [ "$tdevice" = cuda ] && want='import torch; assert torch.cuda.is_available()'
    for p in python3 /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python; do
        if command -v "$p" >/dev/null && "$p" -c "$want" 2>/dev/null; then python=$p; break; fi
    done
fi
if [ -n "$python" ]; then
    tver=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
else
    tver="absent"
fi
[ -x "$build/gpu_bench" ] || { echo "gpu.sh: $build/gpu_bench missing (cmake --build $build --target gpu_bench)"; exit 2; }

# one run: its key-value output in $raw/NAME; the value of a key: val NAME KEY
run() {
    local name=$1; shift
    local left=$limit
    if [ -n "${DEADLINE:-}" ]; then
        left=$(( DEADLINE - $(date +%s) ))
        [ "$left" -gt "$limit" ] && left=$limit
        if [ "$left" -lt 10 ]; then echo "skipped: time" > "$raw/$name"; return; fi
    fi
    timeout "$left" "$@" > "$raw/$name" 2> "$raw/$name.err"
    local rc=$?
    [ $rc -eq 124 ] && echo "unavailable: timed out after ${left}s" >> "$raw/$name"
    [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 124 ] &&
        echo "unavailable: exit $rc: $(tail -n 1 "$raw/$name.err")" >> "$raw/$name"
}
val() { awk -v k="$2" '$1 == k { print $2; exit }' "$raw/$1" 2>/dev/null; }
why() { grep -m1 -E "^(unavailable|skipped)" "$raw/$1" 2>/dev/null | cut -c1-90; }
mib() { [ -n "$1" ] && awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'; }

table=$raw/table.md
{
    echo "GPU benchmark: $(date -u +%Y-%m-%dT%H:%MZ), ddpmd $(git rev-parse --short HEAD 2>/dev/null) on $device," \
         "torch $tver on $tdevice ($python), $warmup warm-up + $steps timed steps per run"
    echo
    echo "| config | batch | run | images/s | peak MiB | note |"
    echo "|---|---|---|---|---|---|"
} > "$table"
goals=$raw/goals.md
: > "$goals"
fp32_only=0
ddpmd_proc="" torch_proc=""   # the largest process overhead each showed (bytes beside its memory)
for cb in $configs; do
    spec=${cb%:*}
    batch=${cb##*:}
    cname=$(basename "$spec" .json)
    best_ips="" best_run="" best_mem=""
    for p in $precisions; do
        n="ddpmd-$cname-$batch-${p//\//-}" pp=${p%%/*} flags=""
        case "$p/" in */parity/*) flags="$flags --deterministic" ;; esac
        case "$p/" in */eager/*) flags="$flags --eager" ;; esac
        run "$n" "$build/gpu_bench" "$spec" --device "$device" --batch "$batch" --precision "$pp" \
            --steps "$steps" --warmup "$warmup" --threads "$(nproc)" $flags
        ips=$(val "$n" images_per_s)
        plan=$(val "$n" plan_bytes)
        used=$(val "$n" device_used_bytes)
        proc=$(val "$n" process_bytes)
        [ -n "$proc" ] && { [ -z "$ddpmd_proc" ] || [ "$proc" -gt "$ddpmd_proc" ]; } && ddpmd_proc=$proc
        if [ -z "$ips" ]; then
            [ "$pp" != f32 ] && fp32_only=1
            echo "| $cname | $batch | ddpmd $p | - | - | $(why "$n") |" >> "$table"
            continue
        fi
        # ddpmd's peak: the reservation as the device saw it (cudaMemGetInfo), else the plan
        peak=${used:-$plan}
        note="plan $(mib "$plan") MiB"
        if [ "$pp" != f32 ] && [ "$(val "$n" half_kernels)" = 0 ]; then
            fp32_only=1
            note="16-bit storage, fp32 kernels; $note"
        fi
        [ -n "$used" ] && note="$note, cudaMemGetInfo $(mib "$used") MiB"
        [ -n "$proc" ] && note="$note, + process $(mib "$proc") MiB"
        echo "| $cname | $batch | ddpmd $p | $ips | $(mib "$peak") | $note |" >> "$table"
        if [ -z "$best_ips" ] || awk -v a="$ips" -v b="$best_ips" 'BEGIN { exit !(a > b) }'; then
            best_ips=$ips best_run="ddpmd $p" best_mem=$peak
        fi
    done
    for m in $tmodes; do
        n="torch-$cname-$batch-$m"
        if [ -z "$python" ]; then
            echo "unavailable: no python with torch" > "$raw/$n"
        else
            run "$n" "$python" bench/torch_gpu_step.py --spec "$spec" --batch "$batch" --mode "$m" \
                --device "$tdevice" --steps "$steps" --warmup "$warmup"
        fi
        ips=$(val "$n" images_per_s)
        peak=$(val "$n" peak_bytes)
        if [ -z "$ips" ]; then
            echo "| $cname | $batch | torch $m | - | - | $(why "$n") |" >> "$table"
            continue
        fi
        tproc=$(val "$n" process_bytes)
        [ -n "$tproc" ] && { [ -z "$torch_proc" ] || [ "$tproc" -gt "$torch_proc" ]; } && torch_proc=$tproc
        echo "| $cname | $batch | torch $m | $ips | $(mib "$peak") | warm-up $(val "$n" warmup_s) s, sdpa $(val "$n" sdpa)${tproc:+, + process $(mib "$tproc") MiB} |" >> "$table"
        [ -z "$best_ips" ] && continue
        case $m in
            amp-bf16) want=1.3 ;;
            compile-bf16) want=1.0 ;;
            *) continue ;;
        esac
        r=$(ratio "$best_ips" "$ips")
        mr=$(ratio "$best_mem" "$peak")
        ok=$(awk -v r="$r" -v w="$want" -v m="$mr" 'BEGIN { print (r >= w && m <= 0.5) ? "met" : "missed" }')
        echo "- $cname b$batch: $best_run / torch $m: images/s ${r}x (goal >= ${want}x), peak memory ${mr}x (goal <= 0.5x): $ok" >> "$goals"
    done
done
{
    echo
    [ -s "$goals" ] && cat "$goals"
    [ $fp32_only -eq 1 ] && echo "- ddpmd: fp32 only (no 16-bit kernels ran on $device: see the rows)"
    if [ -n "$ddpmd_proc" ] && [ -n "$torch_proc" ]; then
        ok=$(awk -v a="$ddpmd_proc" -v b="$torch_proc" 'BEGIN { print (a <= b) ? "met" : "missed" }')
        echo "- process overhead (the most any run held beside its memory): ddpmd $(mib "$ddpmd_proc") MiB, torch $(mib "$torch_proc") MiB (goal: ddpmd <= torch): $ok"
    elif [ -n "$ddpmd_proc" ]; then
        echo "- process overhead: ddpmd $(mib "$ddpmd_proc") MiB (torch's not measured on $tdevice)"
    fi
} >> "$table"
cat "$table"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/gpu_bench"
    cp "$table" "$OUT/gpu_bench.md"
    cp "$raw"/ddpmd-* "$raw"/torch-* "$OUT/gpu_bench/" 2>/dev/null
fi
exit 0
