#!/usr/bin/env bash
# check.sh - the CUDA backend on a machine with an NVIDIA GPU and the CUDA toolkit (nvcc, cuBLAS,
# cuDNN 9 under /usr/local/cuda): builds in a fresh build directory for sm_90 only (Release), runs
# tests/gpu (every op against the CPU backend; one training step of each preset against the CPU,
# the device memory against the plan), then times one training step per preset, GPU against this
# build's CPU, and prints a short table. Meant to finish within 5 minutes.
#   tests/gpu/check.sh [BUILD_DIR]        (default build-gpu; removed and made afresh)
# Build dependencies: the build subset of scripts/install-deps.sh, installed with apt-get when
# missing; a machine without network can take them as .deb files in $DDPMD_DEBS (dpkg -i).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath -m "${1:-build-gpu}")
t0=$(date +%s)
say() { printf '== %s (%ds)\n' "$*" $(( $(date +%s) - t0 )); }
fail=0

say "device"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv,noheader; then
    echo "check.sh: no NVIDIA GPU visible (nvidia-smi)"; exit 2
fi
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$nvcc" ] || { echo "check.sh: no nvcc at $nvcc"; exit 2; }
"$nvcc" --version | tail -1

say "build dependencies"
have_deps() {
    command -v cmake >/dev/null && command -v cc >/dev/null && command -v c++ >/dev/null || return 1
    local h
    for h in cblas.h cjson/cJSON.h png.h zlib.h; do
        printf '#include <%s>\nint main(void){return 0;}\n' "$h" |
            cc -x c - -o /dev/null -I/usr/include/openblas -I/usr/include/x86_64-linux-gnu/openblas-openmp \
               >/dev/null 2>&1 || { echo "missing: $h"; return 1; }
    done
}
if ! have_deps; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    if [ -n "${DDPMD_DEBS:-}" ] && ls "$DDPMD_DEBS"/*.deb >/dev/null 2>&1; then
        $SUDO dpkg -i "$DDPMD_DEBS"/*.deb >/dev/null || true
    else
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            --no-install-recommends build-essential cmake pkg-config libopenblas-openmp-dev \
            libcjson-dev libpng-dev zlib1g-dev >/dev/null || true
    fi
    have_deps || { echo "check.sh: build dependencies missing (see above)"; exit 2; }
fi

say "configure and build ($build, sm_90, Release)"
rm -rf "$build"
# the whole tree builds clean at -O3 with -Werror (no warning is waived here)
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDPMD_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 >"$build.configure.log" 2>&1; then
    tail -30 "$build.configure.log"; echo "check.sh: configure failed"; exit 1
fi
if ! cmake --build "$build" -j"$(nproc)" --target ddpmd_cuda test_gpu_ops test_gpu_step step_time \
        >"$build.build.log" 2>&1; then
    grep -E "error|Error" "$build.build.log" | head -40; echo "check.sh: build failed"; exit 1
fi
ls -l "$build/libddpmd_cuda.so"

run_test() {
    local name=$1 limit=$2 rc
    say "$name"
    DDPMD_CUDA_MODULE="$build/libddpmd_cuda.so" DDPMD_CUDA_VERBOSE=1 OMP_NUM_THREADS=8 \
        timeout "$limit" "$build/$name" >"$build/$name.log" 2>&1
    rc=$?
    grep -E "^(FAIL|device|philox|ddpm|seed|  step|  after|over budget|SKIPPED|ddpmd cuda)" \
        "$build/$name.log" | head -60
    tail -1 "$build/$name.log" | grep -v SKIPPED
    case $rc in
        0) echo "$name: PASSED" ;;
        77) echo "$name: SKIPPED (no device?)"; fail=1 ;;
        124) echo "$name: TIMED OUT after ${limit}s"; fail=1 ;;
        *) echo "$name: FAILED (exit $rc)"; fail=1 ;;
    esac
}
run_test test_gpu_ops 120
run_test test_gpu_step 150

say "one training step per preset, GPU vs CPU"
DDPMD_CUDA_MODULE="$build/libddpmd_cuda.so" timeout 150 "$build/step_time" \
    --threads "$(nproc)" 2>&1 | tee "$build/step_time.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "step_time: FAILED"; fail=1; }

say "done: $([ $fail -eq 0 ] && echo all passed || echo FAILURES)"
exit $fail
