#!/usr/bin/env bash
# fuzz.sh - builds the libFuzzer targets (clang-14, ASan + UBSan, CUDA off) in build-fuzz/ and
# runs each for FUZZ_SECONDS (default 45) from the committed seed corpus tests/fuzz/corpus/<t>/
# and crash regressions tests/fuzz/regressions/<t>/. Fails on any crash, leak, timeout or OOM,
# naming the input to commit under regressions/. Prints one line per target: execs/s, coverage.
# BUILD_DIR overrides the folder; FUZZ_TARGETS="spec png" runs a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${BUILD_DIR:-build-fuzz}
secs=${FUZZ_SECONDS:-45}
cc=${FUZZ_CC:-clang-14}
start=$(date +%s)
command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc not found (scripts/install-deps.sh)"; exit 1; }
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
CC=$cc CXX=${cc/clang/clang++} cmake -S . -B "$dir" -DDDPMD_FUZZ=ON -DDDPMD_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null

# name max_len, one per line, from the harness table itself (tests/fuzz/replay.c)
cmake --build "$dir" -j"$(nproc)" --target fuzz_replay >/dev/null
mapfile -t table < <("$dir/fuzz_replay" --list)
want=${FUZZ_TARGETS:-}
targets=()
for line in "${table[@]}"; do
  t=${line%% *}
  if [ -z "$want" ] || [[ " $want " == *" $t "* ]]; then targets+=("$t"); fi
done
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
built=$(date +%s)

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export OMP_NUM_THREADS=1
# one target: its row of the table in $work/row, "1" in $work/failed on a finding
run_one() {
  local t=$1 max_len=$2 work="$dir/fuzz-work/$1" rc=0
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  local seeds regs log="$work/log.txt"
  seeds=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
  regs=$(find "tests/fuzz/regressions/$t" -type f ! -name '.*' 2>/dev/null | wc -l)
  # new inputs go to the first (scratch) folder; the committed ones are only read.
  # -malloc_limit_mb: one allocation above 1 GiB is a finding (the largest legal one, a decoded
  # PNG of IMAGE_MAX_DECODED_BYTES, is 256 MiB); -timeout: an input taking 10 s is a hang.
  "$dir/fuzz_$t" -max_total_time="$secs" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=3072 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" "tests/fuzz/corpus/$t" \
    "tests/fuzz/regressions/$t" >"$log" 2>&1 || rc=$?
  local eps execs cov ft newc crashes status=ok
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  newc=$(find "$work/corpus" -type f | wc -l)
  crashes=$(find "$work/artifacts" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status="FAIL (exit $rc)"
    echo 1 >"$work/failed"
    {
      echo "fuzz.sh: $t failed; the end of its log ($log):"
      tail -40 "$log"
      for a in "$work"/artifacts/*; do
        [ -e "$a" ] || continue
        echo "fuzz.sh: $t input $a: fix the bug, then commit the file as tests/fuzz/regressions/$t/<name>"
        echo "         (reproduce: $dir/fuzz_$t $a, or build/fuzz_replay --run $t $a)"
      done
    } >"$work/report.txt"
  fi
  printf '%-12s %10s %12s %6s %7s %7s %6s %4s %s\n' "$t" "${eps:-?}" "${execs:-?}" \
    "${cov:-?}" "${ft:-?}" "$seeds+$regs" "$newc" "$crashes" "$status" >"$work/row"
}

# FUZZ_JOBS targets at a time (default: one per core; not nproc, which obeys OMP_NUM_THREADS);
# each libFuzzer process is single-threaded
jobs=${FUZZ_JOBS:-$(getconf _NPROCESSORS_ONLN)}
ran=()
for line in "${table[@]}"; do
  t=${line%% *}
  [[ " ${targets[*]} " == *" $t "* ]] || continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$t" "${line##* }" &
  ran+=("$t")
done
wait
fail=0
for t in "${ran[@]}"; do
  if [ -e "$dir/fuzz-work/$t/failed" ]; then
    fail=1
    cat "$dir/fuzz-work/$t/report.txt"
  fi
done
printf '%-12s %10s %12s %6s %7s %7s %6s %4s %s\n' target execs/s execs cov ft seeds new crash result
for t in "${ran[@]}"; do cat "$dir/fuzz-work/$t/row"; done
end=$(date +%s)
echo "fuzz.sh: ${#ran[@]} targets x ${secs} s, $jobs at a time; build $((built - start)) s, total $((end - start)) s"
exit $fail
