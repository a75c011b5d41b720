# dockerd.sh - sourced by the scripts of tests/docker: a dockerd of the test's own (data-root,
# exec-root and socket in a fresh folder under /var/tmp, no default bridge, no iptables rules on
# the host; user-defined bridge networks, as compose makes, still work) and the removal of
# everything it started, failed or not: what on_cleanup named (a compose project), dockerd and
# its containerd, their mounts, the links of its bridge networks, and any docker0 link or nft
# table that was not there before.
#   dk_skip_unless_usable   exit 77 without root, dockerd, debootstrap or a docker client
#   dk_start                W, DOCKER_HOST, DOCKER set; dockerd started; the EXIT trap set.
#                           DDPMD_DOCKER_HOST=unix://... borrows a running daemon instead (its
#                           image cache makes a rerun quick); nothing of it is stopped or removed
#   dk_stop, dk_restart     dockerd stopped (its containers stopped as on a shutdown), restarted
#   on_cleanup "CMD"        CMD runs first at cleanup (its output on stderr when the test failed)

dk_skip_unless_usable() {
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: dockerd needs root"; exit 77; }
  local t
  for t in dockerd debootstrap "$@"; do
    command -v "$t" >/dev/null ||
      { echo "SKIP: no $t (Debian packages docker.io, docker-compose, debootstrap)"; exit 77; }
  done
  # the client of Debian's docker.io (as old as its daemon) when there is one
  DOCKER=$(command -v /usr/bin/docker || command -v docker) || { echo "SKIP: no docker client"; exit 77; }
  export DOCKER
}

dk_cleanup_cmds=()
on_cleanup() { dk_cleanup_cmds+=("$1"); }

dk_cleanup() {
  local rc=$? c net
  set +e
  for c in "${dk_cleanup_cmds[@]}"; do
    if [ $rc -ne 0 ]; then eval "$c" >&2 2>&1; else eval "$c" >/dev/null 2>&1; fi
  done
  if [ "$dk_own" -eq 0 ]; then rm -rf "$W"; exit $rc; fi
  dk_stop
  [ $rc -ne 0 ] && [ -f "$W/dockerd.log" ] && tail -20 "$W/dockerd.log" >&2
  # what dockerd leaves mounted: overlay layers, the netns bind mounts, shm
  grep -F " $W/" /proc/mounts | awk '{ print $2 }' | sort -r | while read -r m; do umount -l "$m"; done
  for net in $dk_bridges; do ip link show "$net" >/dev/null 2>&1 && ip link delete "$net"; done
  if [ "$dk_had_docker0" -eq 0 ] && ip link show docker0 >/dev/null 2>&1; then ip link delete docker0; fi
  if command -v nft >/dev/null; then
    nft list tables 2>/dev/null | while read -r _ fam name; do
      grep -qxF "table $fam $name" <<<"$dk_nft_before" || nft delete table "$fam" "$name"
    done
  fi
  rm -rf "$W"
  exit $rc
}

dk_run_daemon() {
  dockerd --data-root "$W/root" --exec-root "$W/exec" --host "$DOCKER_HOST" --pidfile "$W/docker.pid" \
    --storage-driver overlay2 --bridge none --iptables=false --ip6tables=false \
    >>"$W/dockerd.log" 2>&1 &
  local _
  for _ in $(seq 1 120); do "$DOCKER" version >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "FAIL: dockerd did not start" >&2
  exit 1
}

dk_start() {
  W=$(mktemp -d /var/tmp/ddpmd-dk.XXXXXX)
  trap dk_cleanup EXIT
  trap 'exit 130' INT TERM
  dk_own=0
  if [ -n "${DDPMD_DOCKER_HOST:-}" ]; then
    export DOCKER_HOST=$DDPMD_DOCKER_HOST
    "$DOCKER" version >/dev/null || { echo "FAIL: no daemon at $DOCKER_HOST" >&2; exit 1; }
    return 0
  fi
  dk_own=1
  export DOCKER_HOST=unix://$W/docker.sock
  dk_had_docker0=0
  ip link show docker0 >/dev/null 2>&1 && dk_had_docker0=1
  dk_nft_before=""
  command -v nft >/dev/null && dk_nft_before=$(nft list tables 2>/dev/null || true)
  dk_bridges=""
  dk_run_daemon
}

# dockerd stopped: SIGTERM (it stops its containers, each within its stop timeout, up to its own
# shutdown timeout of 15 s), SIGKILL after 60 s
dk_stop() {
  [ -f "$W/docker.pid" ] || return 0
  local pid _ net
  # the bridges of the networks this daemon made, removed at cleanup: compose down removes them
  # when it runs, but a bridge outlives its daemon (a failure after dk_restart's stop left one)
  for net in $("$DOCKER" network ls -q --filter driver=bridge 2>/dev/null || true); do
    dk_bridges+=" br-${net:0:12}"
  done
  pid=$(cat "$W/docker.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  # gone already, as it should be: the kill fails, which must not end a set -e caller
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$W/docker.pid"
}

dk_restart() {
  [ "$dk_own" -eq 1 ] || { echo "FAIL: restarting dockerd needs the test's own (no DDPMD_DOCKER_HOST)" >&2; exit 1; }
  dk_stop
  dk_run_daemon
}
