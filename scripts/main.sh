#!/usr/bin/env bash
# main.sh - the main job, through the service: install the runtime dependencies only
# (install-deps.sh --runtime: no test toolchain), build the ddpmd binary alone, start `ddpmd serve` on
# loopback with its own data directory (out/serve/data), POST /train examples/fmnist-tiny.json with
# curl, follow its progress on the job's event stream, download the final checkpoint, request a
# sample grid and download its PNG, stop the server (SIGTERM) and print where the files are.
# Run it again and it continues: the POSTs carry Idempotency-Keys, so the second run gets the same
# job (resumed from its last checkpoint if the first run was interrupted, or already done).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --runtime
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target ddpmd
out=out/serve
mkdir -p "$out"
spec=${DDPMD_MAIN_SPEC:-examples/fmnist-tiny.json} # another spec: DDPMD_MAIN_SPEC=FILE
key="main-$(sha256sum "$spec" | cut -c1-16)"

# the server: port 0 picks a free port, printed as one JSON line on stdout
./build/ddpmd serve --listen 127.0.0.1:0 --data "$out/data" >"$out/listen.json" 2>"$out/server.log" &
pid=$!
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || true
  fi
}
trap stop EXIT
for _ in $(seq 600); do
  [ -s "$out/listen.json" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$out/server.log" >&2; echo "main.sh: the server did not start" >&2; exit 1; }
  sleep 0.1
done
base=$(jq -r .listening "$out/listen.json")
echo "main.sh: ddpmd serve is listening on $base (log: $out/server.log)"

api() { # api METHOD PATH [curl args...]: the body on stdout, fails on a 4xx/5xx with the problem
  local m=$1 p=$2
  shift 2
  curl -sS --fail-with-body -X "$m" "$base$p" "$@"
}

job=$(api POST /train -H 'Content-Type: application/json' -H "Idempotency-Key: $key-train" \
      --data @"$spec")
id=$(jq -r .id <<<"$job")
echo "main.sh: training job $id (planned: $(jq -r '.plan.reserved_bytes' <<<"$job") bytes on $(jq -r .plan.device <<<"$job"), $(jq -r '.plan.strategy | "\(.precision), micro-batch \(.micro_batch), recompute \(.recompute), offload \(.offload)"' <<<"$job"))"

# progress: the job's Server-Sent Events until it ends (the stream closes at its final state)
curl -sS -N "$base/jobs/$id/events" | while IFS= read -r line; do
  case "$line" in
    data:*) ;;
    *) continue ;;
  esac
  d=${line#data: }
  ev=$(jq -r '.event // .state // empty' <<<"$d" 2>/dev/null || true)
  case "$ev" in
    step) jq -r '"  step \(.step)/\(.steps)  loss \(.loss)  \(.img_per_s) img/s"' <<<"$d" ;;
    checkpoint) jq -r '"  checkpoint at step \(.step)"' <<<"$d" ;;
    queued | running | succeeded | failed | canceled) echo "  state: $ev" ;;
  esac
done
state=$(api GET "/jobs/$id" | jq -r .state)
if [ "$state" != succeeded ]; then
  api GET "/jobs/$id" | jq -r '.error // empty' >&2
  echo "main.sh: the training job ended $state (log: $out/server.log)" >&2
  exit 1
fi

ckpt=$(api GET "/jobs/$id/checkpoints" | jq -r '.checkpoints | max_by(.step) | .id')
api GET "/checkpoints/$ckpt" -o "$out/model.safetensors"
api GET "/jobs/$id/loss.png" -o "$out/loss.png"

sample=$(api POST /samples -H 'Content-Type: application/json' -H "Idempotency-Key: $key-samples" \
         --data "{\"checkpoint\":\"$ckpt\",\"n\":64,\"steps\":50,\"seed\":1}")
sid=$(jq -r .id <<<"$sample")
echo "main.sh: sampling job $sid (64 images, DDIM 50 steps, from checkpoint $ckpt)"
for _ in $(seq 3600); do
  s=$(api GET "/samples/$sid" | jq -r .state)
  case "$s" in
    succeeded) break ;;
    failed | canceled) echo "main.sh: the sampling job ended $s" >&2; exit 1 ;;
  esac
  sleep 1
done
[ "$s" = succeeded ] || { echo "main.sh: the sampling job did not end within an hour" >&2; exit 1; }
api GET "/samples/$sid.png" -o "$out/grid.png"

stop
trap - EXIT
echo "main.sh: server stopped; the job's files stay in $out/data (a next start resumes it)"
echo "your model:   $out/model.safetensors  (checkpoint $ckpt of job $id)"
echo "its samples:  $out/grid.png"
echo "loss curve:   $out/loss.png"
