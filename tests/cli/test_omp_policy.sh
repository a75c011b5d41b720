#!/usr/bin/env bash
# test_omp_policy.sh - ddpmd starts its OpenMP runtime under its own wait policy
# (kernels/cpu/cpu.h, cpu_omp_wait_policy): with nothing in the environment, libgomp itself
# reports PASSIVE and GOMP_SPINCOUNT 3000 (so the re-exec came before libgomp read them); a
# policy the user names is left as it is, ACTIVE or PASSIVE, and so is a GOMP_SPINCOUNT.
# Usage: test_omp_policy.sh DDPMD
set -u
ddpmd=${1:?path to ddpmd}
failed=0
# the values libgomp reports for the process that runs the command (its last report: the
# process that starts itself again reports twice)
report() {
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$@" timeout 10 "$ddpmd" help 2>&1 >/dev/null |
        awk -F"'" '/OMP_WAIT_POLICY =/ {w = $2} /GOMP_SPINCOUNT =/ {s = $2} END {print w, s}'
}
want() {
    local got
    got=$(report "${@:2}")
    if [ "$got" != "$1" ]; then
        echo "FAIL: env ${*:2}: libgomp reports '$got', want '$1'"
        failed=$((failed + 1))
    fi
}
want "PASSIVE 3000"
want "ACTIVE 30000000000" OMP_WAIT_POLICY=ACTIVE
want "PASSIVE 0" OMP_WAIT_POLICY=passive
want "PASSIVE 50" GOMP_SPINCOUNT=50
[ "$failed" -eq 0 ] && echo "test_omp_policy: 4 cases passed"
exit $((failed > 0))
