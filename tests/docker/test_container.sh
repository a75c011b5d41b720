#!/usr/bin/env bash
# test_container.sh - the CPU image in Docker, end to end: starts its own dockerd (own data-root,
# exec-root and socket under /var/tmp, no bridge, no iptables), makes the Debian 12 base image
# (docker/base-image.sh: debootstrap, cached in $DDPMD_CACHE), builds the ddpmd and nginx images
# (docker/build.sh, host network), starts docker/compose.yaml with the host-network override
# (ddpmd and nginx on distinct 127.0.0.1 ports) and runs tests/docker/container_flow.py through
# nginx: a training job followed over SSE, `docker restart` of the ddpmd container mid-training,
# the job resumed from its checkpoint on the volume, checkpoint download, POST /samples, the PNG.
# Everything it started is removed on exit, failed or not: the compose project, dockerd and its
# containerd, their mounts, and any docker0 link or nft table that was not there before.
# Exit 77 (skipped) without root or without dockerd / docker-compose / debootstrap
# (scripts/install-deps.sh installs them). Usage: tests/docker/test_container.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "dockerd needs root"
for t in dockerd docker-compose debootstrap; do
  command -v "$t" >/dev/null || skip "no $t (Debian packages docker.io, docker-compose, debootstrap)"
done
# the client of Debian's docker.io (as old as its daemon) when there is one
DOCKER=$(command -v /usr/bin/docker || command -v docker) || skip "no docker client"
export DOCKER

t_start=$(date +%s)
W=$(mktemp -d /var/tmp/ddpmd-dk.XXXXXX)
export DOCKER_HOST=unix://$W/docker.sock
project=ddpmdtest$$
compose=(docker-compose -p "$project" -f "$W/compose.yaml")
had_docker0=0
ip link show docker0 >/dev/null 2>&1 && had_docker0=1
nft_before=""
command -v nft >/dev/null && nft_before=$(nft list tables 2>/dev/null || true)

cleanup() {
  local rc=$?
  set +e
  if [ -n "${compose_up:-}" ]; then
    [ $rc -ne 0 ] && "${compose[@]}" logs --no-color --tail 80 >&2 2>&1
    "${compose[@]}" down -v --timeout 60 >/dev/null 2>&1
  fi
  if [ -f "$W/docker.pid" ]; then
    local pid
    pid=$(cat "$W/docker.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
  fi
  [ $rc -ne 0 ] && [ -f "$W/dockerd.log" ] && tail -20 "$W/dockerd.log" >&2
  # what dockerd leaves mounted: overlay layers, the netns bind mounts, shm
  grep -F " $W/" /proc/mounts | awk '{ print $2 }' | sort -r | while read -r m; do umount -l "$m"; done
  if [ $had_docker0 -eq 0 ] && ip link show docker0 >/dev/null 2>&1; then ip link delete docker0; fi
  if command -v nft >/dev/null; then
    nft list tables 2>/dev/null | while read -r _ fam name; do
      grep -qxF "table $fam $name" <<<"$nft_before" || nft delete table "$fam" "$name"
    done
  fi
  rm -rf "$W"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

dockerd --data-root "$W/root" --exec-root "$W/exec" --host "$DOCKER_HOST" --pidfile "$W/docker.pid" \
  --storage-driver overlay2 --bridge none --iptables=false --ip6tables=false \
  >"$W/dockerd.log" 2>&1 &
for _ in $(seq 1 120); do "$DOCKER" version >/dev/null 2>&1 && break; sleep 0.5; done
"$DOCKER" version >/dev/null || { echo "FAIL: dockerd did not start" >&2; exit 1; }

t0=$(date +%s)
bash docker/base-image.sh
t1=$(date +%s)
bash docker/build.sh ddpmd:cpu docker/Dockerfile --network host -q >/dev/null
bash docker/build.sh ddpmd-nginx docker/nginx.Dockerfile --network host -q >/dev/null
t2=$(date +%s)
echo "test_container: base image $((t1 - t0)) s, image builds $((t2 - t1)) s"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export DDPMD_PORT NGINX_PORT DDPMD_TOKENS=$W/tokens
DDPMD_PORT=$(free_port)
NGINX_PORT=$(free_port)
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "tester $token" >"$DDPMD_TOKENS"
chmod 0644 "$DDPMD_TOKENS" # the secret is bind-mounted: the container's user 10001 reads it
# compose.yaml with the host-network override, merged; Compose v1 cannot drop a list in an
# override, and a host-network container must not publish ports, so nginx's ports go here
docker-compose -p "$project" -f docker/compose.yaml -f docker/compose.host.yaml config |
  python3 -c 'import sys, yaml
c = yaml.safe_load(sys.stdin)
for s in c["services"].values():
    if s.get("network_mode") == "host":
        s.pop("ports", None)
yaml.safe_dump(c, sys.stdout)' >"$W/compose.yaml"
compose_up=1
"${compose[@]}" up -d >"$W/compose-up.log" 2>&1 || { cat "$W/compose-up.log" >&2; exit 1; }
container=$("${compose[@]}" ps -q ddpmd)
[ -n "$container" ] || { echo "FAIL: the ddpmd container did not start" >&2; exit 1; }
python3 tests/docker/container_flow.py "$NGINX_PORT" "$token" "$container" "$DOCKER"
t3=$(date +%s)
echo "test_container: ok (compose flow $((t3 - t2)) s, $((t3 - t_start)) s in all)"
