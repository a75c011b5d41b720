#!/usr/bin/env bash
# sanitize.sh - the whole ctest suite under AddressSanitizer + UndefinedBehaviorSanitizer (gcc,
# CUDA off, the CUDA-emulator tests included) in build-asan/; any report fails the run.
# BUILD_DIR overrides the folder; extra arguments go to ctest (e.g. -R test_spec).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${BUILD_DIR:-build-asan}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
start=$(date +%s)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -DDDPMD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  "-DCMAKE_C_FLAGS=$san" "-DCMAKE_CXX_FLAGS=$san" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
  "-DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=address,undefined" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
cmake --build "$dir" -j"$(nproc)"
# detect_leaks: every test frees what it made. The suppressions are third-party allocations
# only (each says why). halt_on_error / abort_on_error: the first report fails that test.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:strict_string_checks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$dir"
rc=0
# Left to the normal build (SANITIZE_EXCLUDE, a ctest -E regex, overrides the list):
# test_gpu_step_emu: a whole training step in the instrumented SIMT emulator takes over 15
# minutes (ctest's timeout); test_gpu_ops_emu runs every kernel under ASan instead.
# cli_cuda_emu, cli_cuda16_emu: training steps and sampling in the instrumented emulator, the
# same reason; test_gpu_ops_emu_sm75: test_gpu_ops_emu's kernels with bf16 refused (no more code);
# test_gpu_rt_emu likewise (offload's executor path runs under ASan in test_offload, the
# emulator's stream-order ranges in test_gpu_ops_emu's self-check).
# integration_test_devices: a server whose cuda:0 is the instrumented emulator (its probe child
# alone takes minutes); the pool's code runs under ASan in the other integration tests.
# test_seed64: 3 steps of the 23M-parameter seed model at 64x64 under each of four budgets
# (minutes in the normal build, past ctest's 900 s under ASan); test_budget_matrix and
# test_accum/test_recompute/test_offload run the same planner and executor paths on small models.
# test_prec_train: 600 fmnist-tiny training steps (45 CPU-seconds in the normal build, 145 under
# ASan); test_prec, test_ops_half and test_prec_resume run its 16-bit paths under ASan.
# integration_test_diffusers_pipeline: 2 x 160 denoising steps against real diffusers in a venv
# of its own; the export's C code runs under ASan in integration_test_diffusers_tar.
# cli_examples: loads all of Fashion-MNIST for each example to show the examples' data is there;
# test_dataset runs the same loaders under ASan on small data.
# integration_test_host_peak: compares jobs' resident bytes with their reservations, and under
# ASan those are ASan's (shadow memory, redzones, the quarantine of freed blocks); its five jobs
# also pass the integration tests' 240 s there. test_host_plan runs the host plan under ASan.
exclude=${SANITIZE_EXCLUDE-^(test_gpu_step_emu|test_gpu_rt_emu|cli_cuda_emu|cli_cuda16_emu|test_gpu_ops_emu_sm75|integration_test_devices|test_seed64|test_prec_train|integration_test_diffusers_pipeline|cli_examples|integration_test_host_peak)\$}
ctest --output-on-failure --timeout 900 ${exclude:+-E "$exclude"} "$@" || rc=$?
echo "sanitize.sh: ctest under ASan+UBSan exit $rc in $(( $(date +%s) - start )) s (build included)"
exit $rc
