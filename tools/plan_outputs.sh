#!/usr/bin/env bash
# plan_outputs.sh - `ddpmd plan` over every examples/*.json and a few presets, budgets and
# strategies (--all plans each candidate exactly), written one file a case with the timings
# masked, so two builds' plans can be diffed: a refactor of the planner must leave them equal.
#   bash tools/plan_outputs.sh BINARY OUTDIR; then diff -r OUTDIR_BEFORE OUTDIR_AFTER
set -euo pipefail
bin=${1:?usage: plan_outputs.sh BINARY OUTDIR}
out=${2:?usage: plan_outputs.sh BINARY OUTDIR}
mkdir -p "$out"
mask() { sed -E 's/(planned|searched) in [0-9.]+ ms/\1 in _ ms/; s/("[a-z_]*(_ms|_time|elapsed)[a-z_]*":[[:space:]]*)[0-9.e+-]+/\1_/'; }
run() { # name, then the plan command's arguments
    local name=$1
    shift
    local rc=0
    "$bin" plan "$@" >"$out/$name.out" 2>"$out/$name.err" || rc=$?
    { mask <"$out/$name.out"; echo "-- stderr"; mask <"$out/$name.err"; echo "-- exit $rc"; } \
        >"$out/$name.txt"
    rm -f "$out/$name.out" "$out/$name.err"
}
for f in examples/*.json; do
    b=$(basename "$f" .json)
    run "$b" "$f"
    run "$b.json" "$f" --json
    for budget in 64MiB 256MiB 1GiB 4GiB; do
        run "$b.$budget" "$f" --vram-budget "$budget"
        run "$b.$budget.all" "$f" --vram-budget "$budget" --all
        run "$b.$budget.all.json" "$f" --vram-budget "$budget" --all --json
    done
done
run seed32 --preset seed --image 32 --batch 4
run seed64 --preset seed --image 64 --batch 8
run seed64.plain --preset seed --image 64 --batch 2 --plain-attention
run seed64.tiled --preset seed --image 64 --batch 2 --tiled-attention
run ddpm --preset ddpm
run tiny --image 16 --ch 32 --mult 1,2 --layers 1 --batch 3 --groups 8
