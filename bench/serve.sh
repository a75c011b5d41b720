#!/usr/bin/env bash
# serve.sh - the service's benchmark, in one run on this machine (not a test: it asserts nothing).
# 1. wrk (Debian's `wrk`) on GET /jobs/{id} of an ended job while nothing trains: requests/s and
#    the p99 latency, against the goals (>= 20000 requests/s, p99 < 5 ms on loopback).
# 2. The training throughput (steps/s, from the job's step count over a window) of one running
#    job, alternating windows without clients and with SSE_CLIENTS event streams open plus one
#    client polling GET /jobs/{id} every POLL_S seconds; printed as the ratio loaded / quiet of
#    the medians over ROUNDS alternations (goal: > 0.97, i.e. less than 3% slower).
#   bash bench/serve.sh
#   WRK_SECONDS=5 WINDOW_S=10 ROUNDS=2 bash bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WRK_SECONDS=${WRK_SECONDS:-10}
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNECTIONS=${WRK_CONNECTIONS:-32}
WINDOW_S=${WINDOW_S:-20}
ROUNDS=${ROUNDS:-3}
SSE_CLIENTS=${SSE_CLIENTS:-50}
POLL_S=${POLL_S:-0.1}
bash scripts/build.sh >/dev/null
for t in wrk curl jq; do command -v $t >/dev/null || { echo "serve.sh: needs $t (scripts/install-deps.sh)" >&2; exit 1; }; done

dir=$(mktemp -d /tmp/ddpmd-bench-serve-XXXXXX)
./build/ddpmd serve --listen 127.0.0.1:0 --data "$dir/data" >"$dir/listen.json" 2>"$dir/server.log" &
pid=$!
clients=()
cleanup() {
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
  kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 600); do [ -s "$dir/listen.json" ] && break; sleep 0.1; done
base=$(jq -r .listening "$dir/listen.json")
spec() { # spec STEPS
  jq -c --argjson n "$1" '.train.steps = $n | .train.batch = 8 | .train.threads = 1 |
    .output.checkpoint_every = 0 | .output.log_every = 1 | .output.samples = 1' examples/fmnist-tiny.json
}
post() { curl -sS --fail-with-body -X POST -H 'Content-Type: application/json' --data "$1" "$base/train" | jq -r .id; }
state() { curl -sS "$base/jobs/$1" | jq -r "$2"; }

echo "## ddpmd serve on $(nproc) cores ($(date -u +%FT%TZ); shared machine: figures are noisy)"
ended=$(post "$(spec 1)")
while [ "$(state "$ended" .state)" != succeeded ]; do sleep 0.2; done
wrk -t"$WRK_THREADS" -c"$WRK_CONNECTIONS" -d"${WRK_SECONDS}s" --latency "$base/jobs/$ended" >"$dir/wrk.txt"
rps=$(awk '/^Requests\/sec:/ {print $2}' "$dir/wrk.txt")
p99=$(awk '$1 == "99%" {print $2}' "$dir/wrk.txt")
echo "GET /jobs/{id}, nothing training: $rps requests/s (goal >= 20000), p99 $p99 (goal < 5ms)" \
     "[wrk -t$WRK_THREADS -c$WRK_CONNECTIONS -d${WRK_SECONDS}s]"

job=$(post "$(spec 1000000)")
while [ "$(state "$job" .step)" -lt 3 ]; do sleep 0.2; done
rate() { # steps/s over WINDOW_S seconds
  local s0 s1 t0 t1
  s0=$(state "$job" .step); t0=$(date +%s.%N)
  sleep "$WINDOW_S"
  s1=$(state "$job" .step); t1=$(date +%s.%N)
  awk -v a="$s0" -v b="$s1" -v t="$t0" -v u="$t1" 'BEGIN {print (b - a) / (u - t)}'
}
load_on() {
  clients=()
  for _ in $(seq "$SSE_CLIENTS"); do
    curl -sS -N "$base/jobs/$job/events" >/dev/null 2>&1 &
    clients+=($!)
  done
  (while :; do curl -sS "$base/jobs/$job" >/dev/null; sleep "$POLL_S"; done) &
  clients+=($!)
  sleep 1 # the streams are open and have replayed the log
}
load_off() {
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
  wait "${clients[@]}" 2>/dev/null || true
  clients=()
}
quiet=() loaded=()
for r in $(seq "$ROUNDS"); do
  q=$(rate); quiet+=("$q")
  load_on; l=$(rate); load_off; loaded+=("$l")
  printf 'round %d: quiet %.3f steps/s, with %d SSE clients + polling every %ss %.3f steps/s\n' \
         "$r" "$q" "$SSE_CLIENTS" "$POLL_S" "$l"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mq=$(median "${quiet[@]}"); ml=$(median "${loaded[@]}")
printf 'training throughput loaded / quiet: %.3f (medians %.3f / %.3f steps/s; goal > 0.97)\n' \
       "$(awk -v l="$ml" -v q="$mq" 'BEGIN {print l / q}')" "$ml" "$mq"
curl -sS -X POST "$base/jobs/$job/cancel" >/dev/null
