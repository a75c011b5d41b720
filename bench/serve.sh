#!/usr/bin/env bash
# serve.sh - the service's benchmark, in one run on this machine (not a test: it asserts nothing).
# 1. wrk (Debian's `wrk`) on GET /jobs/{id} of an ended job while nothing trains, WRK_ROUNDS
#    times: requests/s and the p99 latency against the goals (>= 20000 requests/s, p99 < 5 ms on
#    loopback), and the requests per CPU-second of the server process (its utime + stime over
#    the round: what load from other processes does not change). With REF=PATH/TO/ddpmd (an
#    older build) the same rounds run against it too, alternating, and the ratios are printed.
# 2. The training throughput (steps/s, from the job's step count over a window) of one running
#    job, alternating windows without clients and with SSE_CLIENTS event streams open plus one
#    client polling GET /jobs/{id} every POLL_S seconds; printed as the ratio loaded / quiet of
#    the medians over ROUNDS alternations (goal: > 0.97, i.e. less than 3% slower), beside the
#    ratio of the job process's CPU-seconds per step (quiet / loaded).
# The machine's load average is printed before and after: on a shared machine wall-clock figures
# are noisy, the CPU-second columns and same-run ratios much less so.
#   bash bench/serve.sh
#   WRK_SECONDS=5 WRK_ROUNDS=3 WINDOW_S=10 ROUNDS=2 REF=/tmp/ddpmd.main bash bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WRK_SECONDS=${WRK_SECONDS:-10}
WRK_ROUNDS=${WRK_ROUNDS:-3}
WRK_THREADS=${WRK_THREADS:-2}
WRK_CONNECTIONS=${WRK_CONNECTIONS:-32}
WINDOW_S=${WINDOW_S:-20}
ROUNDS=${ROUNDS:-3}
SSE_CLIENTS=${SSE_CLIENTS:-50}
POLL_S=${POLL_S:-0.1}
REF=${REF:-}
bash scripts/build.sh >/dev/null
for t in wrk curl jq; do command -v $t >/dev/null || { echo "serve.sh: needs $t (scripts/install-deps.sh)" >&2; exit 1; }; done

dir=$(mktemp -d /tmp/ddpmd-bench-serve-XXXXXX)
pids=() clients=()
cleanup() {
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
start() { # start NAME EXE: a server in $dir/NAME; sets $base and $pid
  mkdir -p "$dir/$1"
  "$2" serve --listen 127.0.0.1:0 --data "$dir/$1/data" >"$dir/$1/listen.json" 2>"$dir/$1/server.log" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 600); do [ -s "$dir/$1/listen.json" ] && break; sleep 0.1; done
  base=$(jq -r .listening "$dir/$1/listen.json")
}
spec() { # spec STEPS
  jq -c --argjson n "$1" '.train.steps = $n | .train.batch = 8 | .train.threads = 1 |
    .output.checkpoint_every = 0 | .output.log_every = 1 | .output.samples = 1' examples/fmnist-tiny.json
}
post() { curl -sS --fail-with-body -X POST -H 'Content-Type: application/json' --data "$1" "$2/train" | jq -r .id; }
state() { curl -sS "$1/jobs/$2" | jq -r "$3"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }
least() { printf '%s\n' "$@" | sort -g | head -1; }
hz=$(getconf CLK_TCK)

echo "## ddpmd serve on $(nproc) cores ($(date -u +%FT%TZ); load average at the start: $(cut -d' ' -f1-3 /proc/loadavg))"
# an ended job on each server under test
names=(new) exes=(./build/ddpmd)
[ -n "$REF" ] && names+=(ref) exes+=("$REF")
declare -A url spid
for i in "${!names[@]}"; do
  start "${names[$i]}" "${exes[$i]}"
  id=$(post "$(spec 1)" "$base")
  while [ "$(state "$base" "$id" .state)" != succeeded ]; do sleep 0.2; done
  url[${names[$i]}]="$base/jobs/$id"
  spid[${names[$i]}]=$pid
done
declare -A rps p99 eff
for r in $(seq "$WRK_ROUNDS"); do
  for n in "${names[@]}"; do
    c0=$(cpu_ticks "${spid[$n]}")
    wrk -t"$WRK_THREADS" -c"$WRK_CONNECTIONS" -d"${WRK_SECONDS}s" --latency "${url[$n]}" >"$dir/wrk.txt"
    c1=$(cpu_ticks "${spid[$n]}")
    q=$(awk '/^Requests\/sec:/ {print $2}' "$dir/wrk.txt")
    # the p99 in ms whatever unit wrk chose
    l=$(awk '$1 == "99%" {v=$2; u=v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
             print (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : v}' "$dir/wrk.txt")
    k=$(awk '/requests in/ {print $1}' "$dir/wrk.txt")
    e=$(awk -v k="$k" -v c=$((c1 - c0)) -v hz="$hz" 'BEGIN {print (c > 0) ? k / (c / hz) : 0}')
    rps[$n]+="$q " p99[$n]+="$l " eff[$n]+="$e "
    printf 'round %d %-4s GET /jobs/{id}: %8.0f requests/s, p99 %7.2f ms, %7.0f requests per server CPU-second\n' \
           "$r" "$n" "$q" "$l" "$e"
  done
done
for n in "${names[@]}"; do
  # shellcheck disable=SC2086
  printf '%-4s best of %d rounds: %.0f requests/s (goal >= 20000), p99 %.2f ms (goal < 5), %.0f requests per server CPU-second (median) [wrk -t%s -c%s -d%ss]\n' \
         "$n" "$WRK_ROUNDS" "$(best ${rps[$n]})" "$(least ${p99[$n]})" "$(median ${eff[$n]})" \
         "$WRK_THREADS" "$WRK_CONNECTIONS" "$WRK_SECONDS"
done
if [ -n "$REF" ]; then
  # shellcheck disable=SC2086
  printf 'new / ref: requests/s %.2fx (medians), requests per server CPU-second %.2fx (medians)\n' \
         "$(awk -v a="$(median ${rps[new]})" -v b="$(median ${rps[ref]})" 'BEGIN {print a / b}')" \
         "$(awk -v a="$(median ${eff[new]})" -v b="$(median ${eff[ref]})" 'BEGIN {print a / b}')"
  kill -TERM "${spid[ref]}" 2>/dev/null && wait "${spid[ref]}" 2>/dev/null || true
fi

base=${url[new]%/jobs/*}
job=$(post "$(spec 1000000)" "$base")
while [ "$(state "$base" "$job" .step)" -lt 3 ]; do sleep 0.2; done
kid=$(pgrep -f "jobs/$job/spec.json" | head -1)
rate() { # "steps/s cpu-seconds-per-step" over WINDOW_S seconds
  local s0 s1 t0 t1 c0 c1
  s0=$(state "$base" "$job" .step); t0=$(date +%s.%N); c0=$(cpu_ticks "$kid")
  sleep "$WINDOW_S"
  s1=$(state "$base" "$job" .step); t1=$(date +%s.%N); c1=$(cpu_ticks "$kid")
  awk -v a="$s0" -v b="$s1" -v t="$t0" -v u="$t1" -v c=$((c1 - c0)) -v hz="$hz" \
      'BEGIN {print (b - a) / (u - t), (b > a) ? c / hz / (b - a) : 0}'
}
load_on() {
  clients=()
  for _ in $(seq "$SSE_CLIENTS"); do
    curl -sS -N "$base/jobs/$job/events" >/dev/null 2>&1 &
    clients+=($!)
  done
  # one client on one keep-alive connection (a curl process per poll would cost more CPU than
  # the server spends answering it)
  python3 -c 'import http.client, sys, time
c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]))
while True:
    c.request("GET", sys.argv[3]); c.getresponse().read(); time.sleep(float(sys.argv[4]))' \
    "$(jq -r .host "$dir/new/listen.json")" "$(jq -r .port "$dir/new/listen.json")" \
    "/jobs/$job" "$POLL_S" &
  clients+=($!)
  sleep 1 # the streams are open and have replayed the log
}
load_off() {
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null || true; done
  wait "${clients[@]}" 2>/dev/null || true
  clients=()
}
quiet=() loaded=() qcpu=() lcpu=()
for r in $(seq "$ROUNDS"); do
  read -r q qc <<<"$(rate)"; quiet+=("$q"); qcpu+=("$qc")
  load_on; read -r l lc <<<"$(rate)"; load_off; loaded+=("$l"); lcpu+=("$lc")
  printf 'round %d: quiet %.3f steps/s (%.3f CPU-s/step), with %d SSE clients + polling every %ss %.3f steps/s (%.3f CPU-s/step)\n' \
         "$r" "$q" "$qc" "$SSE_CLIENTS" "$POLL_S" "$l" "$lc"
done
mq=$(median "${quiet[@]}"); ml=$(median "${loaded[@]}")
printf 'training throughput loaded / quiet: %.3f (medians %.3f / %.3f steps/s; goal > 0.97); the job'"'"'s CPU-seconds per step quiet / loaded: %.3f\n' \
       "$(awk -v l="$ml" -v q="$mq" 'BEGIN {print l / q}')" "$ml" "$mq" \
       "$(awk -v l="$(median "${lcpu[@]}")" -v q="$(median "${qcpu[@]}")" 'BEGIN {print (l > 0) ? q / l : 0}')"
curl -sS -X POST "$base/jobs/$job/cancel" >/dev/null
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
