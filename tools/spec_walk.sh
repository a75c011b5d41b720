#!/bin/bash
# spec_walk.sh - how often one POST /train parses and prints its spec, from the request to the
# job's end (issue 24): uprobes on the named functions of the ddpmd binary (perf probe; root),
# counted in the server and the job's child while a 2-step fmnist-tiny job runs.
# Usage: tools/spec_walk.sh BUILD/ddpmd [FUNCTION...]   (default: spec_parse spec_load_file
#        spec_to_json); prints "FUNCTION CALLS" lines.
set -euo pipefail
exe=$(realpath "$1")
shift
funcs=("$@")
[ ${#funcs[@]} -gt 0 ] || funcs=(spec_parse spec_load_file spec_to_json)
command -v perf >/dev/null || { echo "spec_walk: needs perf (linux-perf)"; exit 77; }
tmp=$(mktemp -d)
cleanup() {
    [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    perf probe -q -d 'probe_ddpmd:*' 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
perf probe -q -d 'probe_ddpmd:*' 2>/dev/null || true
events=()
for f in "${funcs[@]}"; do
    perf probe -q -x "$exe" "$f" && events+=(-e "probe_ddpmd:$f")
done
perf record -q -o "$tmp/perf.data" "${events[@]}" -a -- sleep 600 &
rec=$!
sleep 1
"$exe" serve --listen 127.0.0.1:0 --data "$tmp/data" >"$tmp/out" 2>"$tmp/log" &
srv=$!
for _ in $(seq 600); do grep -q port "$tmp/out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' "$tmp/out")
spec='{"model":{"preset":"ddpm","in_channels":1,"image_size":32,"block_out_channels":[32,64,64],
 "layers_per_block":1,"attention_resolutions":[8],"norm_num_groups":8},
 "data":{"dataset":"fashion-mnist"},"train":{"batch":2,"steps":2,"threads":1},
 "output":{"checkpoint_every":0,"sample_every":0,"samples":1}}'
id=$(curl -s -X POST -H 'Content-Type: application/json' -d "$spec" \
         "http://127.0.0.1:$port/train" | sed -n 's/^{"id":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || { echo "spec_walk: POST /train refused"; exit 1; }
for _ in $(seq 1200); do
    curl -s "http://127.0.0.1:$port/jobs/$id" | grep -q '"state":"\(succeeded\|failed\)"' && break
    sleep 0.1
done
kill "$srv"; wait "$srv" 2>/dev/null || true
srv=
kill -INT "$rec"; wait "$rec" 2>/dev/null || true
perf script -i "$tmp/perf.data" -F comm,pid,event 2>/dev/null |
    awk '{n[$NF]++} END {for (e in n) print e, n[e]}' | sed 's/probe_ddpmd://; s/://' | sort
